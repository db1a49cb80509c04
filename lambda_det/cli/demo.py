"""The main job (``make demo``): train a LambdaResNet Mask R-CNN on the bundled shapes dataset on
the CPU, evaluate it with COCO AP by object size, print the table and draw its predictions.

    python tools/demo.py                 # reuses a finished run in the output folder
    python tools/demo.py --force         # trains again
    python tools/demo.py --quick         # a short run (QUICK=1 with make): a few minutes
    python tools/demo.py --config configs/Demo/aft_conv_r26_shapes.yaml
    python -m lambda_det.cli.demo        # the same, from an installed package

Writes to the config's OUTPUT_DIR: model_final.pth, eval_results.json, metrics.json,
ap_table.md, ap_by_size.png and predictions.png. An interrupted run is continued (Ctrl-C or
SIGTERM saves the iteration in flight: docs/training.md, "Running long jobs"). A finished
run made with another config (other overrides) is not reused: --force trains again (the
finished run is moved to OUTPUT_DIR/previous_<date-time>/), or set another OUTPUT_DIR. The
demo replaces only its own earlier ap_table.md and pictures (OUTPUT_DIR/run_files.json records
them): a file of those names that it did not write stops it before anything starts.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.detection_utils import read_image

import lambda_det.data
import lambda_det.modeling
from lambda_det.checkpoint import last_checkpoint
from lambda_det.cli.arguments import add_debug_argument, parse_command_line, reporting_user_errors
from lambda_det.cli.checks import check_device
from lambda_det.cli.interrupts import (
    TRAIN_NET,
    Interrupted,
    invoked_as,
    reporting_interrupts,
    rerun_command,
    run_child,
)
from lambda_det.cli.output_dir import (
    OutputDirLock,
    check_tool_outputs,
    prepare_output_dir,
    record_outputs,
)
from lambda_det.config import resolve_config_file
from lambda_det.data.checks import check_prediction_classes
from lambda_det.inference import Predictor, draw, write_image
from lambda_det.reports import format_ap_table, load_results, plot_ap_by_size
from lambda_det.run_config import config_differences, load_config
from lambda_det.utils.atomic import atomic_write, check_writable_folder, reporting_write_errors
from lambda_det.utils.errors import UserError
from lambda_det.utils.text import read_text

DEFAULT_CONFIG = "Demo/lambda_r26_shapes.yaml"  # shipped: a checkout's and a package's
# What the demo adds to a training run's files (recorded in the run's run_files.json: --force
# moves them aside with the run).
DEMO_FILES = ("ap_table.md", "ap_by_size.png", "predictions.png")
# --quick: the same recipe cut to a quarter of its iterations (LR drops at the same fractions),
# in a folder of its own so that the full demo's run and numbers stay as they are. Given before
# the user's overrides, which win.
QUICK_OVERRIDES = (
    "SOLVER.MAX_ITER",
    "150",
    "SOLVER.STEPS",
    "(135, 142, 146)",
    "SOLVER.CHECKPOINT_PERIOD",
    "50",
    "OUTPUT_DIR",
    "./output/demo_lambda_r26_shapes_quick",
)


def draw_predictions(cfg, weights: str, dataset: str, path: Path, count: int = 4) -> Path:
    """A 2 x (count / 2) grid of validation images with predicted masks, boxes and scores.
    Its classes are checked as tools/predict.py checks them (``check_prediction_classes``)."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.MODEL.WEIGHTS = weights
    check_prediction_classes(cfg)
    cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST = 0.5
    predictor = Predictor(cfg)
    metadata = MetadataCatalog.get(dataset)
    tiles = []
    for record in DatasetCatalog.get(dataset)[:count]:
        image = read_image(record["file_name"], format=cfg.INPUT.FORMAT)
        tiles.append(
            draw(
                image,
                predictor(image),
                metadata,
                cfg.INPUT.FORMAT,
                scale=2.0,
                score_threshold=predictor.score_threshold,
            )
        )
    rows = [np.concatenate(tiles[i : i + 2], axis=1) for i in range(0, len(tiles), 2)]
    write_image(path, np.concatenate(rows, axis=0), option="OUTPUT_DIR")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="a Demo config (path or name)")
    parser.add_argument("--force", action="store_true", help="train even if a finished run exists")
    parser.add_argument("--name", default=None, help="row name in the AP table")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run (150 of the 600 iterations, in its own OUTPUT_DIR): a few minutes",
    )
    add_debug_argument(parser)
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides, KEY VALUE ...")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_command_line(parser, argv)
    if args.quick:
        args.opts = [*QUICK_OVERRIDES, *args.opts]
    # --force again would move the interrupted run aside and start over.
    args.command = rerun_command(invoked_as("tools/demo.py"), argv, drop=["--force"])
    with (
        reporting_interrupts(
            lambda interrupt: f"interrupted by {interrupt.name}: run {args.command} to continue"
        ),
        reporting_user_errors(args.debug),
    ):
        return demo(args)


def demo(args: argparse.Namespace) -> int:
    start = time.time()
    config_file = resolve_config_file(args.config)
    cfg = load_config(config_file, args.opts)  # as train_net.py loads it, so the dumps compare
    lambda_det.data.register_datasets(cfg)
    check_device(cfg)
    output = Path(cfg.OUTPUT_DIR)
    check_writable_folder(output, "OUTPUT_DIR")
    check_tool_outputs(output, DEMO_FILES, "the demo", "OUTPUT_DIR")  # before any work

    root = lambda_det.data.shapes_root()
    with reporting_write_errors(root, "DETECTRON2_DATASETS"):
        lambda_det.data.ensure_shapes_dataset(root)
    print(f"dataset: {root} (lambda_det_shapes_train / lambda_det_shapes_val)", flush=True)

    weights, record = output / "model_final.pth", output / "eval_results.json"
    if not args.force and weights.is_file() and record.is_file():
        text = read_text(
            record, "pass --force (FORCE=1 with make) to train again, or set another OUTPUT_DIR"
        )
        differences = config_differences(
            json.loads(text)["config"], cfg.dump(), saved_in=str(record)
        )
        if differences:
            raise UserError(
                f"the finished run in {output} was made with another config ("
                + "; ".join(differences[:5])
                + "): pass --force (FORCE=1 with make) to train "
                "over it, or set another OUTPUT_DIR"
            )
        print(f"reusing the finished run in {output} (--force, or FORCE=1 with make, trains again)")
    else:
        # --force starts over (the finished run and the demo's files move to
        # previous_<date-time>/); otherwise an interrupted run (a last_checkpoint, no results)
        # is continued, and one stopped before its first checkpoint starts over.
        if args.force:
            with OutputDirLock(str(output)):
                previous = prepare_output_dir(str(output), resume=False, restart=True)
            if previous:
                print(f"--force: moved the previous run to {previous}", flush=True)
        command = [
            *TRAIN_NET,
            "--config-file",
            config_file,
            "--resume" if last_checkpoint(str(output)) else "--restart",
            *args.opts,
        ]
        print("+", " ".join(command), flush=True)
        try:
            status = run_child(command)
        except Interrupted as interrupt:  # train_net.py saved the iteration in flight
            latest = last_checkpoint(str(output))
            saved = (
                f"its last checkpoint is {output / latest}"
                if latest
                else "it had saved no checkpoint"
            )
            print(
                f"interrupted by {interrupt.name}: the training stopped and {saved}; "
                f"{args.command} continues it",
                file=sys.stderr,
                flush=True,
            )
            return interrupt.status
        if status:  # train_net.py said why
            return status

    results = load_results(str(output))
    name = args.name or f"{Path(config_file).stem} ({'quick ' if args.quick else ''}demo)"
    table = format_ap_table({name: results})
    try:
        # The pictures first: they load the weights, which a reused run may hold refused ones of.
        picture = draw_predictions(
            cfg, str(weights), cfg.DATASETS.TEST[0], output / "predictions.png"
        )
        with reporting_write_errors(output, "OUTPUT_DIR"):
            atomic_write(output / "ap_table.md", table + "\n", "OUTPUT_DIR")
            plot_ap_by_size({name: results}, str(output / "ap_by_size.png"), title="shapes val")
    finally:  # those there now are the demo's (checked before the training): new or earlier
        record_outputs(output, DEMO_FILES)
    print(
        "\nCOCO AP by object size on lambda_det_shapes_val (small < 32^2 < medium < 96^2 < large):"
    )
    print(table)
    print(
        f"\nwrote {output / 'eval_results.json'}, {output / 'ap_table.md'}, "
        f"{output / 'ap_by_size.png'}, {picture}"
    )
    print(f"demo finished in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":  # python -m lambda_det.cli.demo: the demo of an installed package
    sys.exit(main())
