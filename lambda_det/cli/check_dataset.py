"""Check datasets as tools/train_net.py does before training, and time the image checks.

    python tools/check_dataset.py --config lambda_r26_shapes       # a run's datasets, as it will
    python tools/check_dataset.py --config my.yaml --eval-only MODEL.MASK_ON True   # its test sets
    python tools/check_dataset.py coco_2017_train                  # a registered dataset
    python tools/check_dataset.py --coco-dataset mine data/train.json data/images mine
    python tools/check_dataset.py coco_2017_val --images full      # decode every image

With ``--config`` (and ``--coco-dataset``, ``--eval-only`` and ``KEY VALUE`` overrides, as
tools/train_net.py takes them), the run's DATASETS.TRAIN and DATASETS.TEST get exactly the checks
that tools/train_net.py runs before it launches (segmentations when MODEL.MASK_ON, the class
count, ...), and so do the config's values (the device's name, the seed and, without
``--eval-only``, the training settings: a NaN SOLVER.BASE_LR, ...). Without it, each NAME is
checked as a training set of the default config (boxes only: MODEL.MASK_ON is off), and the
time of its image checks is printed in images per second (``--images``: as
``DATALOADER.CHECK_IMAGES``). A bad input is one ``error: ...`` line and exit status 2.
"""

import argparse
import sys
import time

from lambda_det.cli.arguments import (
    add_coco_dataset_argument,
    add_debug_argument,
    reporting_user_errors,
)
from lambda_det.cli.checks import load_run_config
from lambda_det.data.checks import (
    IMAGE_CHECKS,
    check_images,
    check_run_datasets,
    load_training_dicts,
    yaml_data_settings,
)
from lambda_det.engine import preflight
from lambda_det.engine.run_settings import yaml_run_settings
from lambda_det.utils.errors import UserError
from lambda_det.utils.run_defaults import CHECK_IMAGES


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config-file",
        "--config",
        metavar="FILE",
        help="check the datasets of this config (a path or a shipped config's "
        "name) as tools/train_net.py does",
    )
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="with --config: only the test sets, as tools/train_net.py --eval-only checks them",
    )
    add_coco_dataset_argument(parser, "the NAME list or the config's DATASETS.TRAIN / TEST")
    parser.add_argument(
        "--images",
        choices=IMAGE_CHECKS,
        help=f"what to read of each image (default: the config's "
        f"DATALOADER.CHECK_IMAGES, {CHECK_IMAGES} unless it sets another)",
    )
    parser.add_argument("--threads", type=int, help="threads for the image checks")
    add_debug_argument(parser)
    parser.add_argument(
        "arguments",
        nargs="*",
        metavar="NAME | KEY VALUE",
        help="registered dataset names; with --config, config overrides",
    )
    return parser


def check_config_values(cfg, training: bool) -> None:
    """What tools/train_net.py checks of the config's values before launch, short of what
    this machine has (a cuda device is a device name here, the GPUs are the run's machine's):
    the device's name, the seed and, for training, the training settings."""
    run = yaml_run_settings(cfg)
    preflight.check_device_name(run.device)
    if training:
        preflight.check_training_settings(run.training)
    preflight.check_seed(run.training.seed)


def check_config_datasets(args: argparse.Namespace) -> str:
    """The run's config values and datasets through tools/train_net.py's own pre-flight;
    returns the summary."""
    opts = list(args.arguments)
    if args.images:
        opts += ["DATALOADER.CHECK_IMAGES", args.images]
    cfg = load_run_config(args, opts)
    check_config_values(cfg, training=not args.eval_only)
    start = time.perf_counter()
    checked = check_run_datasets(
        yaml_data_settings(cfg), training=not args.eval_only, threads=args.threads
    )
    seconds = time.perf_counter() - start
    before = "evaluating" if args.eval_only else "training"
    return "\n".join(
        [
            f"{args.config_file}: checked as tools/train_net.py checks them before {before} "
            f"in {seconds:.1f} s (images: {cfg.DATALOADER.CHECK_IMAGES})",
            *(f"  {checked_set.line()}" for checked_set in checked),
        ]
    )


def check_named_datasets(args: argparse.Namespace) -> str:
    """Each NAME as a training set of the default config, timed; returns the summary."""
    if args.eval_only:
        raise UserError("--eval-only checks a config's test sets: pass --config FILE")
    cfg = load_run_config(args, ["DATASETS.TRAIN", repr(tuple(args.arguments))])
    mode = args.images or cfg.DATALOADER.CHECK_IMAGES
    start = time.perf_counter()
    dicts = load_training_dicts(yaml_data_settings(cfg), check_files=True)
    loaded = time.perf_counter()
    count = check_images(dicts, mode, cfg.INPUT.FORMAT, threads=args.threads)
    checked = time.perf_counter()
    return (
        f"{len(dicts)} images of {', '.join(args.arguments)}: annotations loaded and checked "
        f"in {loaded - start:.1f} s; {count} image files checked ({mode}) in "
        f"{checked - loaded:.1f} s, {count / max(checked - loaded, 1e-9):.0f} images/s"
    )


def main(argv=None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    if not args.config_file and not args.arguments:
        parser.error("name the datasets to check, or pass --config FILE")
    with reporting_user_errors(args.debug):
        summary = check_config_datasets(args) if args.config_file else check_named_datasets(args)
    print(summary)
    return 0


if __name__ == "__main__":  # python -m, from an installed package (no tools/)
    sys.exit(main())
