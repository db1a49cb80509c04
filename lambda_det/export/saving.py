"""Export a model to a file of one of the formats, and its metadata beside it."""

import importlib.util
import json
import warnings
from pathlib import Path
from typing import Optional

import torch
from detectron2.config import CfgNode
from torch import nn

from lambda_det.export.files import (
    EXPORT_FORMATS,
    METADATA_NAME,
    ONNX_OPSET,
    SIZE_NAMES,
    PathLike,
    metadata_path,
)
from lambda_det.export.metadata import export_metadata
from lambda_det.export.program import export_program
from lambda_det.export.tracing import TracedModel, trace_model
from lambda_det.utils.atomic import atomic_path
from lambda_det.utils.errors import UserError


def _save_onnx(traced: TracedModel, path: Path, opset: int) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r".*legacy TorchScript-based ONNX export", category=DeprecationWarning
        )
        warnings.filterwarnings(
            "ignore", message=r"The feature will be removed", category=DeprecationWarning
        )  # raised inside that exporter
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # Harmless here: a traced module has no Python signature to read, and every index
        # (position-table offsets, mask classes) is >= 0.
        warnings.filterwarnings("ignore", message=r"no signature found for")
        warnings.filterwarnings("ignore", message=r"Exporting aten::index operator of advanced")
        # Strided slices stay in the graph instead of being folded into constants: slower to
        # load, same results.
        warnings.filterwarnings("ignore", message=r"Constant folding - Only steps=1")
        dynamic_axes = (
            {"image": {1: SIZE_NAMES[0], 2: SIZE_NAMES[1]}} if traced.dynamic_size else None
        )
        torch.onnx.export(
            traced.module,
            (traced.sample,),
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=["image"],
            output_names=list(traced.output_names),
            dynamic_axes=dynamic_axes,
        )


def export_model(
    model: nn.Module,
    image: torch.Tensor,
    output: PathLike,
    format: str,
    opset: int = ONNX_OPSET,
    cfg: Optional[CfgNode] = None,
) -> TracedModel:
    """Trace ``model`` on ``image`` and save it to ``output`` as ``format``, and its metadata to
    :func:`metadata_path` (``<output>.json``).

    Args:
        model: a detectron2 model in eval mode that returns ``[{"instances": Instances}]``:
            GeneralizedRCNN (Faster / Mask R-CNN) or RetinaNet. The trace runs on its device; a
            TorchScript model traced on a GPU runs only there.
        image: the (3, H, W) sample (:func:`sample_image`); the export takes images of any size
            unless :func:`fixed_size_reason` names a reason, then only this one.
        format: one of :data:`EXPORT_FORMATS`.
        opset: ONNX opset (>= 16).
        cfg: the model's config: the metadata then also has the classes, input format and
            test-time resize (:func:`export_metadata`).

    Returns:
        the :class:`TracedModel` that was saved.
    """
    if format not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {format!r}; expected one of {EXPORT_FORMATS}")
    if format == "onnx":
        if opset < 16:
            raise UserError(f"ONNX opset must be >= 16 (RoIAlign with aligned=True), got {opset}")
        if importlib.util.find_spec("onnx") is None:
            raise ImportError("ONNX export needs the onnx package (pip install onnx)")
    traced = export_program(model, image) if format == "torch_export" else trace_model(model, image)
    metadata = (
        export_metadata(cfg, traced, format)
        if cfg is not None
        else {"format": format, **traced.metadata()}
    )
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(output) as temporary:  # never a half-written model
        if format == "torchscript":
            extra_files = {METADATA_NAME: json.dumps(traced.metadata())}
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message=r".*torch\.jit\.save.* is deprecated", category=FutureWarning
                )
                # Through a Python file, whose write errors (a full disk) are OSErrors.
                with open(temporary, "wb") as f:
                    torch.jit.save(traced.module, f, _extra_files=extra_files)
        elif format == "torch_export":
            # Not the sample in the file: it may be a user's image, and it is the archive's one
            # pickle (lambda_det.export._archive checks that what loading unpickles is tensors).
            traced.module.example_inputs = None
            with open(temporary, "wb") as f:
                torch.export.save(
                    traced.module, f, extra_files={METADATA_NAME: json.dumps(traced.metadata())}
                )
        else:
            _save_onnx(traced, Path(temporary), opset)
    with atomic_path(metadata_path(output)) as temporary:
        Path(temporary).write_text(json.dumps(metadata, indent=2) + "\n")
    return traced
