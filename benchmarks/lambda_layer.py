"""Lambda layer speed and memory, side by side in one process: every lambda_det implementation,
timm's and lucidrains' lambda layers, the 3x3 conv a lambda layer replaces, global multi-head
self-attention on the same feature map, and the Attention Free Transformer's mixers (AFT-conv,
-simple, -local, -full from lambda_det.layers).

    python tools/benchmark_lambda.py                                  # CPU, fp32, all shapes
    python tools/benchmark_lambda.py --device cuda --dtype bf16       # a GPU, under bf16 autocast
    python tools/benchmark_lambda.py --backbone                       # LambdaResNet-101 vs baseline
    python tools/benchmark_lambda.py --blocks                         # its lambda blocks vs conv

The method (what is timed, how memory and useful FLOPs are counted) is described in
benchmarks/__init__.py; measurements are in docs/benchmarks.md.

Outputs, under --out: results.md (the tables), results.json (everything, with the machine
description), results.png (time and memory per shape, layer mode); an earlier run's are replaced
only with --overwrite.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks import report
from benchmarks.candidates import SHAPES
from benchmarks.modes import (
    BackboneSettings,
    LayerSettings,
    benchmark_backbone,
    benchmark_blocks,
    benchmark_layers,
)
from lambda_det.cli.arguments import add_debug_argument, reporting_user_errors
from lambda_det.cli.output_dir import run_owner
from lambda_det.compat import CHECKOUT
from lambda_det.utils.atomic import (
    OutputWriteError,
    atomic_write,
    check_output_file,
    check_writable_folder,
    reporting_write_errors,
)
from lambda_det.utils.errors import ExistingFileError, IsAFolderError

# What an output folder that cannot be written or holds earlier results raises.
OUTPUT_ERRORS = (OutputWriteError, ExistingFileError, IsAFolderError)


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="bf16 runs every forward under torch.autocast(bfloat16)",
    )
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="WORD",
        help="time only the candidates whose name contains one of these words",
    )
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument(
        "--repetitions",
        type=int,
        help="timed rounds (median); default 7 for layers, 5 for backbones",
    )
    parser.add_argument(
        "--warmup", type=int, help="untimed rounds first; default 2 for layers, 1 for backbones"
    )
    parser.add_argument(
        "--memory-cap-gib",
        type=float,
        default=4.0,
        help="skip candidates whose n x n tensors would need more than this",
    )
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--tile",
        type=int,
        nargs=2,
        metavar=("TH", "TW"),
        help="query tile of the 'tiled' impl (default: its DEFAULT_TILE)",
    )
    parser.add_argument(
        "--compile",
        metavar="MODE",
        nargs="?",
        const="default",
        help="wrap every module in torch.compile(mode=MODE) (e.g. reduce-overhead "
        "for CUDA graphs); warm-up rounds then include the compilation",
    )
    parser.add_argument(
        "--backbone",
        action="store_true",
        help="LambdaResNet vs its ResNet-RS baseline instead of single layers",
    )
    parser.add_argument(
        "--blocks",
        action="store_true",
        help="each kind of lambda block of the backbone against its conv block",
    )
    parser.add_argument("--depth", type=int, default=101)
    parser.add_argument("--image", type=int, default=1024)
    parser.add_argument("--impl", default="auto", help="lambda layer impl in backbone mode")
    parser.add_argument(
        "--grad-checkpointing",
        action="store_true",
        help="backbone mode: also the LambdaResNet with activation checkpointing",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="output folder (default: a new "
        "output/benchmark_lambda/<mode>_<device>_<dtype>_<date-time>)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results files an earlier run left in --out",
    )
    add_debug_argument(parser, errors="an output folder that cannot be written")
    args = parser.parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no GPU")
    return args


def run(args: argparse.Namespace):
    """(results, their markdown tables) of the mode the arguments ask for."""
    device = torch.device(args.device)
    if args.backbone or args.blocks:
        settings = BackboneSettings(
            device,
            args.dtype,
            args.depth,
            args.image,
            args.impl,
            repetitions=5 if args.repetitions is None else args.repetitions,
            warmup=1 if args.warmup is None else args.warmup,
            grad_checkpointing=args.grad_checkpointing,
        )
        if args.backbone:
            results = benchmark_backbone(settings)
            return results, report.format_backbone(results)
        results = benchmark_blocks(settings)
        return results, report.format_blocks(results)
    settings = LayerSettings(
        device,
        args.dtype,
        tuple(args.shapes),
        args.only,
        args.batch,
        repetitions=7 if args.repetitions is None else args.repetitions,
        warmup=2 if args.warmup is None else args.warmup,
        memory_cap_gib=args.memory_cap_gib,
        tile=tuple(args.tile or ()),
        compile=args.compile,
    )
    results = benchmark_layers(settings)
    return results, report.format_layers(results)


def main(argv=None) -> int:
    args = parse_arguments(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    mode = "backbone" if args.backbone else "blocks" if args.blocks else "layer"
    stamp = time.strftime("%Y%m%d-%H%M%S")  # a rerun never overwrites an earlier run's results
    out = args.out or (
        CHECKOUT
        / "output"
        / "benchmark_lambda"
        / f"{mode}_{torch.device(args.device).type}_{args.dtype}_{stamp}"
    )
    names = ["results.md", "results.json"] + (["results.png"] if mode == "layer" else [])
    with reporting_user_errors(args.debug, errors=OUTPUT_ERRORS):
        for name in names:  # before minutes of measurements
            path = out / name
            check_output_file(path, args.overwrite, option="--out", owner=run_owner(path))
        check_writable_folder(out, "--out")
    results, tables = run(args)
    results["command"] = "python tools/benchmark_lambda.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    markdown = report.format_report(results, tables)
    with (
        reporting_user_errors(args.debug, errors=OUTPUT_ERRORS),
        reporting_write_errors(out, "--out"),
    ):
        out.mkdir(parents=True, exist_ok=True)
        if mode == "layer":
            report.plot_layers(results, out / "results.png")
        atomic_write(out / "results.md", markdown, "--out")
        atomic_write(out / "results.json", json.dumps(results, indent=1), "--out")
    print(markdown)
    print(f"wrote {out}/results.md, results.json" + ("" if mode != "layer" else ", results.png"))
    return 0
