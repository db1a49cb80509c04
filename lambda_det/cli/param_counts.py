"""Parameter counts of LambdaResNets with a 1000-class head, side by side with the paper's
Tables 12 and 13 (k=16, h=4, u=1, scope 23x23). Prints a markdown table.

    python tools/param_counts.py
"""

import argparse
import sys

from lambda_det.modeling import PAPER_PARAMETERS, lambda_resnet


def label(depth: int, placement: str, se: bool) -> str:
    """The paper's name of the model, e.g. "ResNet-50 CCLL", "LambdaResNet-101-C4"."""
    if depth == 50:
        return f"ResNet-50 {placement}"
    name = {"none": "ResNet", "paper": "LambdaResNet", "c4": "LambdaResNet"}[placement]
    return f"{name}-{depth}" + ("-C4" if placement == "c4" else "") + (" + SE" if se else "")


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    print("| model | ours (M) | paper (M) | difference | source |")
    print("|:--|--:|--:|--:|:--|")
    for (depth, placement, se), paper in PAPER_PARAMETERS.items():
        model = lambda_resnet(depth, placement=placement, se=se, num_classes=1000)
        ours = sum(p.numel() for p in model.parameters()) / 1e6
        source = "Table 12" if depth == 50 else "Table 13"
        print(
            f"| {label(depth, placement, se)} | {ours:.2f} | {paper:.1f} | "
            f"{100 * (ours / paper - 1):+.1f}% | {source} |"
        )
    return 0


if __name__ == "__main__":  # python -m, from an installed package (no tools/)
    sys.exit(main())
