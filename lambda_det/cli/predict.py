"""Run a trained model on your own images and videos, in the shape of detectron2's demo/demo.py.

    python tools/predict.py --config output/demo_lambda_r26_shapes/config.yaml \\
        --input photos/ street.mp4 'more/*.jpg' --output predictions/ \\
        MODEL.WEIGHTS output/demo_lambda_r26_shapes/model_final.pth

Writes into ``--output``: each image drawn with its predicted boxes, masks, class names and
scores (same name as the input), each video drawn frame by frame (``<name>.mp4``), and
``predictions.json``: every detection in COCO results format (image_id, category_id, bbox,
score, segmentation as RLE; plus file_name, the input's path, and, for videos, frame), which
pycocotools' ``loadRes`` reads. An image of the config's DATASETS.TEST keeps that dataset's image
id (so the file scores against its annotations); other images are numbered after them. Class
names come from DATASETS.TEST's metadata. Inputs of one name from different folders (a/x.png,
b/x.png) are drawn as x.png, x_2.png, in input order.

It refuses, before loading the model, an ``--output`` that holds an input or a file it would
write (a drawing's name, predictions.json); ``--overwrite`` replaces such files, but a file it
reads (an input, the config, MODEL.WEIGHTS) is never written over. Each file is written to a
temporary file beside it and renamed into place, so a link in ``--output`` is replaced, never
written through.

Pass the config the run saved (OUTPUT_DIR/config.yaml): it holds the run's classes and
datasets. Trailing ``KEY VALUE`` pairs override it; MODEL.WEIGHTS must fit the model, and the
model's classes DATASETS.TEST[0]'s categories (the names drawn), or it stops with one ``error:``
line. Images are read as the dataset checks accept them (a 16-bit, 32-bit or float grayscale
image is refused with the fix, as in a dataset) and resized as the config's evaluation resizes
them; ``--batch-size`` images run together. Every input is read and checked before the model
loads: unreadable ones stop it in one line that names them all, or are skipped (and listed)
with ``--skip-unreadable``. ``predictions.json`` is written even when a later input fails (or
Ctrl-C stops it), with the detections of the inputs done. ``--confidence-threshold`` is a score in
[0, 1].
"""

import argparse
import json
import sys
from pathlib import Path

import lambda_det.modeling  # noqa: F401  (registers the backbones)
from lambda_det.cli.arguments import (
    add_debug_and_overrides,
    parse_command_line,
    reporting_user_errors,
    tool_argument_parser,
)
from lambda_det.cli.checks import check_device
from lambda_det.cli.interrupts import reporting_interrupts
from lambda_det.cli.output_dir import run_owner
from lambda_det.config import resolve_config_file
from lambda_det.data import register_datasets
from lambda_det.data.checks import check_prediction_classes
from lambda_det.inference import (
    Predictor,
    build_trained_model,
    check_output_folder,
    collect_inputs,
    dataset_image_ids,
    drawing_names,
    metadata_of,
    predict_files,
    unreadable_inputs,
)
from lambda_det.run_config import load_config
from lambda_det.utils.atomic import atomic_write, check_writable_folder
from lambda_det.utils.errors import UserError

RESULTS_FILE = "predictions.json"


def argument_parser() -> argparse.ArgumentParser:
    parser = tool_argument_parser(__doc__)
    parser.add_argument(
        "--input", nargs="+", required=True, help="image or video files, folders of them, or globs"
    )
    parser.add_argument("--output", required=True, help="the folder to write into")
    parser.add_argument(
        "--confidence-threshold",
        type=float,
        default=0.5,
        help="lowest score kept, in [0, 1] (default 0.5; evaluation keeps 0.05)",
    )
    parser.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: the config's MODEL.DEVICE)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="images per forward pass")
    parser.add_argument(
        "--skip-unreadable",
        action="store_true",
        help="predict on the readable inputs, listing the others (default: stop, naming them)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace drawings and predictions.json in --output (never an input)",
    )
    return add_debug_and_overrides(parser)


def config_overrides(args) -> list:
    """The command line's overrides, then the threshold for every head that has one."""
    threshold = str(args.confidence_threshold)
    overrides = list(args.opts) + [
        "MODEL.ROI_HEADS.SCORE_THRESH_TEST",
        threshold,
        "MODEL.RETINANET.SCORE_THRESH_TEST",
        threshold,
        "MODEL.PANOPTIC_FPN.COMBINE.INSTANCES_CONFIDENCE_THRESH",
        threshold,
    ]
    if args.device:
        overrides += ["MODEL.DEVICE", args.device]
    return overrides


def readable_inputs(files: list, image_format: str, skip: bool) -> list:
    """``files`` without the unreadable ones (:func:`unreadable_inputs`), which stop the command
    in one line naming them unless ``skip`` (--skip-unreadable) is given."""
    problems = unreadable_inputs(files, image_format)
    if not problems:
        return files
    listed = "; ".join(problems.values())
    readable = [path for path in files if path not in problems]
    if not skip or not readable:
        fix = (
            f"convert or remove them, or pass --skip-unreadable to predict on the other "
            f"{len(readable)}"
            if readable
            else "pass readable images or videos"
        )
        raise UserError(f"{len(problems)} of {len(files)} inputs cannot be read: {listed}: {fix}")
    print(f"--skip-unreadable: skipping {len(problems)} of {len(files)} inputs: {listed}")
    return readable


def main(argv=None) -> int:
    args = parse_command_line(argument_parser(), argv)
    output = Path(args.output)
    written = []  # RESULTS_FILE once predict has written it
    with reporting_interrupts(
        lambda interrupt: (
            f"interrupted by {interrupt.name}: {output} holds the drawings finished so far "
            f"and their detections in {RESULTS_FILE}; run the command again with "
            f"--overwrite to redo them"
            if written
            else f"interrupted by {interrupt.name} before predicting: nothing was written"
        )
    ):
        return predict(args, output, written)


def predict(args, output: Path, written: list) -> int:
    with reporting_user_errors(args.debug):
        if args.batch_size < 1:
            raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
        if not 0 <= args.confidence_threshold <= 1:  # a score: above 1 keeps nothing
            raise UserError(
                f"--confidence-threshold must be a score in [0, 1], got "
                f"{args.confidence_threshold}: pass e.g. 0.5 (0.05 keeps what "
                f"evaluation keeps)"
            )
        files = collect_inputs(args.input)
        cfg = load_config(args.config_file, config_overrides(args))
        check_output_folder(
            files,
            output,
            args.overwrite,
            also_writes=[RESULTS_FILE],
            reads={
                "--config": resolve_config_file(args.config_file),
                "MODEL.WEIGHTS": cfg.MODEL.WEIGHTS,
            },
            owner=run_owner,
        )
        check_device(cfg, key="--device" if args.device else "MODEL.DEVICE")
        check_writable_folder(output, "--output")
        files = readable_inputs(files, cfg.INPUT.FORMAT, args.skip_unreadable)  # before the model
        register_datasets(cfg)
        check_prediction_classes(cfg)
        metadata = metadata_of(cfg)
        known_ids = dataset_image_ids(cfg.DATASETS.TEST[0]) if len(cfg.DATASETS.TEST) else {}
        predictor = Predictor(cfg, build_trained_model(cfg))
    for path, name in zip(files, drawing_names(files)):
        if Path(name).stem != Path(path).stem:
            print(f"{path} is drawn as {output / name} (an earlier input has its name)")
    results = []  # filled batch by batch: what was predicted is written even after an error
    with reporting_user_errors(args.debug):
        try:
            _, drawn = predict_files(
                predictor,
                files,
                output,
                metadata,
                cfg.INPUT.FORMAT,
                known_ids,
                args.batch_size,
                overwrite=args.overwrite,
                results=results,
            )
        finally:  # checked by check_output_folder above: a file this command may write
            output.mkdir(parents=True, exist_ok=True)
            atomic_write(output / RESULTS_FILE, json.dumps(results), "--output")
            written.append(RESULTS_FILE)
    print(
        f"wrote {len(results)} detections of {len(files)} inputs to {output / RESULTS_FILE}, "
        f"and {len(drawn)} drawn files to {output}"
    )
    return 0


if __name__ == "__main__":  # python -m, from an installed package (no tools/)
    sys.exit(main())
