"""Turn a LambdaResNet classifier trained with timm into MODEL.WEIGHTS for a detector.

    python tools/convert_timm_checkpoint.py --config lambda_r101_mask_rcnn \\
        output/train/lambda_r101_in1k/model_best.pth.tar lambda_r101_in1k.pth
    python tools/train_net.py --config lambda_r101_mask_rcnn MODEL.WEIGHTS lambda_r101_in1k.pth

The classifier (``timm.create_model("lambda_resnet101_det")``, registered by
``lambda_det.modeling.timm_models``) must be the config's backbone: same depth, placement,
width, SE and mixer (trailing ``KEY VALUE`` overrides apply, as in train_net.py). Its
classifier is dropped; every backbone weight must be there. ``--ema`` takes timm's EMA weights.
The checkpoint is read without running code from it. The output's folder is created if missing;
an existing output file is replaced only with ``--overwrite``, and never when it is the classifier
or the config being read.
"""

import os
import sys

import torch

import lambda_det.modeling  # noqa: F401  (registers the backbones)
from lambda_det.checkpoint import counted_weights, load_checkpoint_file
from lambda_det.checkpoint.timm_classifier import convert_classifier_checkpoint
from lambda_det.cli.arguments import (
    add_debug_and_overrides,
    parse_command_line,
    reporting_user_errors,
    tool_argument_parser,
)
from lambda_det.cli.checks import check_model
from lambda_det.cli.output_dir import run_owner
from lambda_det.config import resolve_config_file
from lambda_det.run_config import load_config
from lambda_det.utils.atomic import atomic_path, check_output_file, check_writable_folder


def main(argv=None) -> int:
    parser = tool_argument_parser(__doc__)
    parser.add_argument("classifier", help="timm checkpoint (train.py's .pth.tar, or a state dict)")
    parser.add_argument("output", help="the detector weights to write (.pth)")
    parser.add_argument("--ema", action="store_true", help="use the checkpoint's EMA weights")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output file (never the classifier or config)",
    )
    args = parse_command_line(add_debug_and_overrides(parser), argv)
    folder = os.path.dirname(os.path.abspath(args.output))
    with reporting_user_errors(args.debug):
        check_output_file(
            args.output,
            args.overwrite,
            {
                "the classifier checkpoint": args.classifier,
                "--config": resolve_config_file(args.config_file),
            },
            "output file",
            owner=run_owner(args.output),
        )
        check_writable_folder(folder, "the output file")
        model = check_model(load_config(args.config_file, args.opts))
        weights = convert_classifier_checkpoint(
            load_checkpoint_file(args.classifier), model, use_ema=args.ema
        )
        os.makedirs(folder, exist_ok=True)
        with (
            atomic_path(args.output, option="the output file") as temporary,
            open(temporary, "wb") as f,
        ):
            torch.save({"model": weights, "__author__": f"timm classifier {args.classifier}"}, f)
    # Counted as training's "loaded N of M backbone weights" line counts them.
    print(
        f"wrote {args.output}: {len(counted_weights(weights))} backbone weights for "
        f"{args.config_file}"
    )
    return 0


if __name__ == "__main__":  # python -m, from an installed package (no tools/)
    sys.exit(main())
