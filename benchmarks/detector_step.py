"""Time a whole detector's training step: LambdaResNet Mask R-CNN against its ResNet-RS twin.

    python tools/benchmark_detector.py                                  # on a GPU: the 152 pair
    python tools/benchmark_detector.py --configs lambda_r101_mask_rcnn r101_mask_rcnn \\
        --ims-per-device 4 --precision bf16 --mode eager compiled --max-batch 32
    python tools/benchmark_detector.py --device cpu --size 128 --ims-per-device 2 \\
        --configs lambda_r26_shapes lambda_r26_shapes:MODEL.LAMBDA_RESNET.PLACEMENT=none \\
        MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER 0.25                         # a small CPU run

A step is forward, backward and the optimizer's update on a synthetic batch already on the
device, at the config's training size (INPUT.LSJ.IMAGE_SIZE, 1024 in the paper's configs) unless
``--size``; precision fp32, bf16 or fp16 (autocast), mode eager or compiled
(MODEL.LAMBDA_RESNET.COMPILE). Reports per candidate: ms per image (median of interleaved
rounds), its ratio to the first candidate (median of per-round ratios), peak memory of a step,
the largest images per device that fit (GPU, with ``--max-batch``), and the share of the step's
time spent in the lambda layers (profiler). Writes the table and a JSON under ``--output`` (an
earlier run's only with ``--overwrite``).
Trailing ``KEY VALUE`` pairs override every config.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.detector import (
    MODES,
    PRECISIONS,
    DetectorSettings,
    benchmark_detector,
    format_detector,
    parse_config_spec,
)
from benchmarks.harness import machine_description
from lambda_det.cli.arguments import add_debug_argument, doc_argument_parser, reporting_user_errors
from lambda_det.cli.output_dir import run_owner
from lambda_det.utils.atomic import (
    atomic_write,
    check_output_file,
    check_writable_folder,
    reporting_write_errors,
)
from lambda_det.utils.errors import UserError


def main(argv=None) -> int:
    parser = doc_argument_parser(__doc__)
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["lambda_r152_mask_rcnn", "r152_mask_rcnn"],
        help="shipped config names or files, each optionally with its own "
        "overrides as NAME:KEY=VALUE,KEY=VALUE; the first is the ratios' "
        "baseline",
    )
    parser.add_argument("--ims-per-device", type=int, default=4)
    parser.add_argument("--precision", nargs="+", default=["bf16"], choices=list(PRECISIONS))
    parser.add_argument("--mode", nargs="+", default=["eager"], choices=list(MODES))
    parser.add_argument("--size", type=int, default=None, help="image side (default: config's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--max-batch",
        type=int,
        default=0,
        help="search the largest images per device up to this (GPU)",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="folder for table.md and results.json (default: "
        "output/benchmark_detector/<date-time>)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the table.md and results.json an earlier run left in --output",
    )
    add_debug_argument(parser)
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides, KEY VALUE ...")
    args = parser.parse_args(argv)
    output = Path(args.output or Path("output/benchmark_detector") / time.strftime("%Y%m%d-%H%M%S"))
    with reporting_user_errors(args.debug):
        if args.ims_per_device < 1 or args.rounds < 1 or args.warmup < 0:
            raise UserError(
                f"--ims-per-device and --rounds must be >= 1 and --warmup >= 0, "
                f"got {args.ims_per_device}, {args.rounds}, {args.warmup}"
            )
        configs = {f"--configs {spec!r}": parse_config_spec(spec)[0] for spec in args.configs}
        for name in ("table.md", "results.json"):  # before minutes of measurements
            path = output / name
            check_output_file(path, args.overwrite, configs, owner=run_owner(path))
        check_writable_folder(output, "--output")
        settings = DetectorSettings(
            configs=args.configs,
            opts=args.opts,
            ims_per_device=args.ims_per_device,
            precisions=args.precision,
            modes=args.mode,
            size=args.size,
            device=args.device,
            warmup=args.warmup,
            rounds=args.rounds,
            max_batch=args.max_batch,
        )
        results = benchmark_detector(settings)
    results["machine"] = machine_description(torch.device(args.device))
    results["command"] = " ".join(["python tools/benchmark_detector.py", *sys.argv[1:]])
    table = format_detector(results)
    print(table)
    with reporting_user_errors(args.debug), reporting_write_errors(output, "--output"):
        output.mkdir(parents=True, exist_ok=True)
        for name, text in (
            ("table.md", table + "\n"),
            ("results.json", json.dumps(results, indent=2)),
        ):
            atomic_write(output / name, text, "--output")
    print(f"wrote {output / 'table.md'} and {output / 'results.json'}")
    return 0
