"""Compare backbones under one recipe: train and evaluate every (variant, seed) with
tools/train_net.py, then report AP over seeds, paired differences to a baseline, parameters
and time per iteration (OUTPUT/comparison.md, .json, .png).

    python tools/compare_backbones.py --config lambda_r101_mask_rcnn --num-gpus 8 --seeds 0 1 2
    python tools/compare_backbones.py --config lambda_r26_shapes --variant conv lambda aft_conv \
        --seeds 0 1 2 --output output/compare_shapes

Variants (default: conv se lambda; the first is the baseline unless --baseline names another):
``conv`` (MODEL.LAMBDA_RESNET.PLACEMENT none, the ResNet-RS twin), ``se`` (PLACEMENT none, SE
True), the name of a registered mixer (``lambda``: MIXER lambda in the config's placement;
``aft_conv``), or ``NAME:KEY=VALUE,KEY=VALUE`` with MODEL.LAMBDA_RESNET keys (e.g.
``k8:DIM_K=8``, ``h4:MIXER=aft_conv,AFT_CONV.HEADS=4``). Trailing
``KEY VALUE`` pairs override the config for every run (e.g. the datasets). Runs go to
OUTPUT/<variant>/seed<SEED>/; run again, the command reuses finished runs and continues
interrupted ones, and replaces its own earlier report (OUTPUT/run_files.json records it): a
comparison.md, .json or .png in OUTPUT that it did not write stops it before anything starts.
"""

import argparse
import re
import sys
from pathlib import Path

from lambda_det.cli.arguments import (
    add_coco_dataset_argument,
    add_debug_argument,
    reporting_user_errors,
)
from lambda_det.cli.comparison import (
    DEFAULT_VARIANTS,
    RunFailedError,
    RunInterrupted,
    parse_variant,
    plan_comparison,
    run_comparison,
)
from lambda_det.cli.interrupts import TRAIN_NET
from lambda_det.cli.output_dir import check_tool_outputs, record_outputs
from lambda_det.engine.interrupt import stopping_on_signals
from lambda_det.reports.compare_report import REPORT_FILES, summarize, write_report
from lambda_det.utils.atomic import OutputWriteError, check_writable_folder
from lambda_det.utils.errors import UserError

# The shared overrides are the KEY VALUE pairs whose KEY is a config key (upper case, e.g.
# MODEL.DEVICE) and not an option's value: they may follow --seeds 0 1 2 or precede --output.
CONFIG_KEY = re.compile(r"[A-Z][A-Z0-9_]*(\.[A-Z][A-Z0-9_]*)*$")
# Options with a fixed number of values (a value may look like a config key: a dataset NAME).
OPTION_VALUES = {
    "--config": 1,
    "--config-file": 1,
    "--baseline": 1,
    "--output": 1,
    "--num-gpus": 1,
    "--dataset": 1,
    "--coco-dataset": 3,
}


def split_overrides(argv):
    """(options, KEY VALUE overrides)."""
    options, overrides, index = [], [], 0
    while index < len(argv):
        token = argv[index]
        if token in OPTION_VALUES:
            end = index + 1 + OPTION_VALUES[token]
            options += argv[index:end]
            index = end
        elif CONFIG_KEY.match(token):
            overrides += argv[index : index + 2]
            index += 2
        else:
            options.append(token)
            index += 1
    return options, overrides


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s --config NAME [options] [KEY VALUE ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument(
        "--config",
        "--config-file",
        dest="config",
        required=True,
        metavar="NAME",
        help="config file, or the name of a shipped config",
    )
    parser.add_argument(
        "--variant",
        dest="variants",
        nargs="+",
        action="extend",
        metavar="SPEC",
        help=f"variants (default: {' '.join(DEFAULT_VARIANTS)})",
    )
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[0, 1, 2],
        metavar="SEED",
        help="SEED of each run of a variant (default: 0 1 2)",
    )
    parser.add_argument(
        "--baseline", help="the variant the others are paired with (default: the first)"
    )
    parser.add_argument(
        "--output",
        help="root of the run folders and the report (default: ./output/compare_<config name>)",
    )
    parser.add_argument(
        "--num-gpus",
        type=int,
        default=1,
        help="processes per run, passed to train_net.py (GPUs, or gloo CPU "
        "processes with MODEL.DEVICE cpu)",
    )
    add_coco_dataset_argument(parser, "DATASETS.TRAIN / DATASETS.TEST of every run")
    parser.add_argument(
        "--dataset", help="the test dataset to report, when DATASETS.TEST has several"
    )
    add_debug_argument(parser)
    return parser


def log(message: str) -> None:
    print(message, flush=True)  # before a train_net.py child writes to the same terminal


def main(argv=None) -> int:
    options, opts = split_overrides(list(sys.argv[1:] if argv is None else argv))
    args = argument_parser().parse_args(options)
    with reporting_user_errors(args.debug):
        if args.num_gpus < 1:
            raise UserError(f"--num-gpus {args.num_gpus}: pass 1 or more")
        variants = [parse_variant(spec) for spec in args.variants or DEFAULT_VARIANTS]
        baseline = args.baseline or variants[0].name
        if baseline not in [v.name for v in variants]:
            raise UserError(
                f"--baseline {baseline!r} is not one of the variants {[v.name for v in variants]}"
            )
        output = args.output or f"output/compare_{Path(args.config).stem}"
        check_writable_folder(output, "--output")
        check_tool_outputs(output, REPORT_FILES, "the comparison", "--output")
        comparison = plan_comparison(
            args.config,
            opts,
            variants,
            args.seeds,
            output,
            dataset=args.dataset,
            coco_datasets=args.coco_dataset,
        )
    log(f"{len(variants)} variants x {len(args.seeds)} seeds under {comparison.output}")
    try:
        with stopping_on_signals(), reporting_user_errors(args.debug, errors=(OutputWriteError,)):
            run_comparison(comparison, TRAIN_NET, args.num_gpus, log=log)
    except RunFailedError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    except RunInterrupted as error:
        print(f"interrupted {error}", file=sys.stderr, flush=True)
        return error.status
    except KeyboardInterrupt as interrupt:  # between runs (SIGINT or SIGTERM)
        print(
            "interrupted: the same command continues the comparison (finished runs are kept; "
            "an unfinished one resumes from its last checkpoint, or starts over without one)",
            file=sys.stderr,
        )
        return getattr(interrupt, "status", 130)
    with reporting_user_errors(args.debug):
        runs = {
            variant.name: {
                run.seed: str(run.folder) for run in comparison.runs if run.variant == variant
            }
            for variant in variants
        }
        summary = summarize(
            runs,
            baseline,
            comparison.parameters,
            overrides={variant.name: variant.overrides for variant in variants},
            recipe={"config": comparison.config_file, "overrides": list(comparison.opts)},
            dataset=args.dataset,
        )
        try:
            paths = write_report(summary, str(comparison.output))
        finally:  # those there now are the comparison's (checked before the runs): new or earlier
            record_outputs(comparison.output, REPORT_FILES, "--output")
    print()
    print(Path(paths[0]).read_text(), end="")
    log("wrote " + ", ".join(paths))
    return 0


if __name__ == "__main__":  # python -m, from an installed package (no tools/)
    sys.exit(main())
