"""Export a trained lambda_det model (e.g. a LambdaResNet Mask R-CNN) to TorchScript, ONNX or
torch.export.

    python tools/export_model.py --config-file configs/Demo/lambda_r26_shapes.yaml \\
        --format torchscript --output export/model.ts \\
        MODEL.WEIGHTS output/demo_lambda_r26_shapes/model_final.pth MODEL.DEVICE cpu
    python tools/export_model.py --config-file lambda_r26_shapes --format onnx \\
        --sample-image datasets/lambda_det_shapes_v1/val/00001.png \\
        MODEL.WEIGHTS output/demo_lambda_r26_shapes/model_final.pth
    python tools/export_model.py --config-file lambda_r26_shapes --format torch_export \\
        --output export/model.pt2 MODEL.WEIGHTS output/demo_lambda_r26_shapes/model_final.pth

The model is traced (detectron2's TracingAdapter) on one sample image: ``--sample-image``, or a
synthetic image (``--sample-size``, default the config's test size), resized by the config's
test-time transform; ``--format torch_export`` runs ``torch.export`` on it with a symbolic height
and width instead, and saves the ExportedProgram with ``torch.export.save`` (``.pt2``; load it
with ``torch.export.load`` or ``ExportedModel``). The exported model takes one (3, H, W) uint8
image of any size (ONNX: input axes "height" and "width"; torch.export: H and W of at least the
largest feature stride + 1, 65 for a Mask R-CNN FPN, and so a sample at least that large),
resized as the test loader resizes, in ``INPUT.FORMAT`` channel order, and returns
``pred_boxes``, ``pred_classes``, ``pred_masks`` (M x M probabilities in each box), ``scores``
and ``image_size``. (A model whose lambda layers use ``impl`` "tiled",
``MODEL.LAMBDA_RESNET.IMPL tiled``, exports for the sample's size only; the tool says so.)
``<output>.json`` beside the file holds the input format, the test-time resize and the classes:
``pred_classes`` index -> the test dataset's category id and name. ``lambda_det.export
.ExportedModel`` runs an exported file and reads that metadata (``.classes``), and
``lambda_det.export.outputs_to_instances`` turns its outputs into final detectron2 predictions.
``torch_export`` swaps a few detectron2 functions for export-friendly equivalents while it
exports (lambda_det/compat/torch_export.py says which and why).

Mask R-CNN, Faster R-CNN and RetinaNet configs export (the last two without ``pred_masks``). ONNX
uses torch's TorchScript-based exporter (``dynamo=False``; lambda_det/export/__init__.py says why)
and opset 17 (``--opset``, 16 at least); it needs the onnx package, and onnxruntime to run.
Trailing ``KEY VALUE`` pairs override the config, as in train_net.py; MODEL.WEIGHTS must name the
trained checkpoint, and every weight of the model must be in it. The trace runs on MODEL.DEVICE:
add ``MODEL.DEVICE cpu`` for a TorchScript file that runs on the CPU. After saving, the exported
model is run on the sample and, when its size is dynamic, on a synthetic image of another shape
(3/4 of the sample's height, or torch.export's smallest), and compared with the eager model
(skipped for ONNX without onnxruntime): the number of detections must agree, and each output
within ``--tolerance`` on its own scale (boxes as a fraction of the image side, scores and masks
as probabilities, classes exactly), else it exits with status 1; an image where neither model
finds anything passes only when the eager model's best score there is below its test score
threshold (it says so), and a check that compared no detection at all warns. An
existing ``--output`` or ``<output>.json`` is replaced only with ``--overwrite``, and never when it
is a file the export reads (MODEL.WEIGHTS, the config, the sample image).
"""

import argparse
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
from lambda_det.cli.output_dir import run_owner
from lambda_det.config import resolve_config_file
from lambda_det.data import register_datasets
from lambda_det.data.checks import check_prediction_classes
from lambda_det.export import (
    EXPORT_FORMATS,
    FILE_SUFFIXES,
    ONNX_OPSET,
    SCALES,
    ExportedModel,
    best_score_below_threshold,
    check_export_output,
    detection_count,
    eager_outputs,
    export_model,
    max_differences,
    metadata_path,
    sample_image,
)
from lambda_det.inference import build_trained_model
from lambda_det.run_config import load_config
from lambda_det.utils.atomic import check_writable_folder


def argument_parser() -> argparse.ArgumentParser:
    parser = tool_argument_parser(__doc__)
    parser.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    parser.add_argument(
        "--output",
        default=None,
        help="the file to write (default: OUTPUT_DIR/model.ts, model.onnx or model.pt2)",
    )
    parser.add_argument(
        "--sample-image",
        default=None,
        metavar="FILE",
        help="the image to trace and verify with (default: a synthetic image); the "
        "export runs at any size unless it is fixed to this one",
    )
    parser.add_argument(
        "--sample-size",
        type=int,
        nargs=2,
        default=None,
        metavar=("HEIGHT", "WIDTH"),
        help="size of the synthetic sample before the test-time resize",
    )
    parser.add_argument("--opset", type=int, default=ONNX_OPSET, help="ONNX opset (>= 16)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-3,
        help="largest difference from the eager model accepted, on each output's scale: "
        "boxes as a fraction of the image side, scores and masks as probabilities",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output (never a file it reads: MODEL.WEIGHTS, "
        "the config, the sample image)",
    )
    return add_debug_and_overrides(parser)


def main(argv=None) -> int:
    parser = argument_parser()
    args = parse_command_line(parser, argv)
    if args.sample_image is not None and args.sample_size is not None:
        parser.error("give --sample-image or --sample-size, not both")
    with reporting_user_errors(args.debug):
        cfg = load_config(args.config_file, args.opts)
        register_datasets(cfg)
        check_prediction_classes(cfg)
        output = Path(args.output or Path(cfg.OUTPUT_DIR) / f"model{FILE_SUFFIXES[args.format]}")
        check_export_output(
            output,
            {
                "MODEL.WEIGHTS": cfg.MODEL.WEIGHTS,
                "--config": resolve_config_file(args.config_file),
                "--sample-image": args.sample_image,
            },
            args.overwrite,
            owner=run_owner,
        )
        check_device(cfg)
        check_writable_folder(output.parent, "--output" if args.output else "OUTPUT_DIR")
        image = sample_image(cfg, args.sample_image, args.sample_size)
        model = build_trained_model(cfg)

    with reporting_user_errors(args.debug):  # opset too old, unreadable dataset, full disk
        try:
            traced = export_model(model, image, output, args.format, opset=args.opset, cfg=cfg)
        except ImportError as error:  # onnx missing
            parser.error(" ".join(str(error).split()))
    size = (
        "any size"
        if traced.dynamic_size
        else f"only {tuple(image.shape)}: {traced.fixed_size_reason}"
    )
    if traced.dynamic_size and traced.min_size is not None:
        size = f"any size from {traced.min_size[0]} x {traced.min_size[1]}"
    print(
        f"wrote {output} ({args.format}) and {metadata_path(output)}: input 'image', uint8 "
        f"(3, H, W) in {cfg.INPUT.FORMAT} order, {size}; outputs "
        f"{', '.join(traced.output_names)}"
    )

    try:
        with reporting_user_errors(args.debug):  # the written file refused on reading it back
            exported = ExportedModel(output)
    except ImportError as error:
        print(f"not verified: {error}")
        return 0
    checks = {"the sample": image}
    if traced.dynamic_size:
        height = image.shape[1] * 3 // 4
        if traced.min_size is not None:
            height = max(height, traced.min_size[0])
        other = sample_image(cfg, size=(height, image.shape[2]), seed=1)
        checks[f"a {other.shape[1]} x {other.shape[2]} image"] = other
    compared = 0
    for name, check_image in checks.items():
        expected, actual = eager_outputs(model, check_image), exported(check_image)
        found = detection_count(expected), detection_count(actual)
        if found[0] != found[1]:
            return check_failed(
                f"the exported model finds {found[1]} detections on {name}, the eager model "
                f"{found[0]}"
            )
        if found[0] == 0:
            below = best_score_below_threshold(model, check_image)
            if below is None:
                return check_failed(
                    f"neither model finds anything on {name}, even at score threshold 0: "
                    f"nothing to compare; pass --sample-image with objects the model finds"
                )
            print(
                f"no detection to compare on {name}: the eager model's best score there, "
                f"{below[0]:.6g}, is below its test score threshold {below[1]:g}"
            )
            continue
        differences = max_differences(expected, actual)
        print(
            f"{found[0]} detections compared on {name}, largest differences from the eager "
            "model: "
            + ", ".join(
                f"{field} {value:.3g} ({SCALES.get(field, 'absolute')})"
                for field, value in differences.items()
            )
        )
        if not all(value <= args.tolerance for value in differences.values()):  # nan fails too
            return check_failed(
                f"the exported model differs from the eager model on {name} by more than "
                f"--tolerance {args.tolerance}"
            )
        compared += found[0]
    if not compared:
        print(
            "warning: no detection was compared, only the outputs' shapes: pass "
            "--sample-image with objects the model finds"
        )
    return 0


def check_failed(message: str) -> int:
    """The export check's failure: one ``error:`` line, exit status 1."""
    print(f"error: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":  # python -m, from an installed package (no tools/)
    sys.exit(main())
