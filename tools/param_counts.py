#!/usr/bin/env python
"""Parameter counts of LambdaResNets with a 1000-class head, side by side with the paper's
Tables 12 and 13 (k=16, h=4, u=1, scope 23x23). Prints a markdown table.

    python tools/param_counts.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout as a script
from lambda_det.modeling import lambda_resnet  # noqa: E402

# (label, depth, placement, se, the paper's count in millions, source)
ROWS = [(f"ResNet-50 {p}", 50, p, False, n, "Table 12") for p, n in
        [("CCCC", 25.6), ("LCCC", 25.5), ("LLCC", 25.0), ("LLLC", 21.7), ("LLLL", 15.0),
         ("CLLL", 15.1), ("CCLL", 15.4), ("CCCL", 18.8)]] + [
    ("ResNet-101", 101, "none", False, 44.6, "Table 13"),
    ("ResNet-101 + SE", 101, "none", True, 63.6, "Table 13"),
    ("LambdaResNet-101", 101, "paper", False, 36.9, "Table 13"),
    ("LambdaResNet-101-C4", 101, "c4", False, 26.0, "Table 13"),
    ("ResNet-152", 152, "none", False, 60.2, "Table 13"),
    ("ResNet-152 + SE", 152, "none", True, 86.6, "Table 13"),
    ("LambdaResNet-152", 152, "paper", False, 51.4, "Table 13"),
    ("LambdaResNet-152-C4", 152, "c4", False, 35.1, "Table 13"),
]


def main() -> int:
    print("| model | ours (M) | paper (M) | difference | source |")
    print("|:--|--:|--:|--:|:--|")
    for label, depth, placement, se, paper, source in ROWS:
        model = lambda_resnet(depth, placement=placement, se=se, num_classes=1000)
        ours = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"| {label} | {ours:.2f} | {paper:.1f} | {100 * (ours / paper - 1):+.1f}% | {source} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
