"""Export a trained detectron2 model (e.g. a LambdaResNet Mask R-CNN) to TorchScript, ONNX or
torch.export.

The model is traced with detectron2's :class:`~detectron2.export.TracingAdapter`, which flattens
its ``[{"image": ...}] -> [{"instances": Instances}]`` interface into tensors in and tensors out:

* input ``image``: one (3, H, W) uint8 image in ``cfg.INPUT.FORMAT`` (BGR by default), already
  resized as the config's test-time transform does (:func:`sample_image` does both);
* outputs (for Mask R-CNN): ``pred_boxes`` (N, 4) XYXY in input pixels, ``pred_classes`` (N,),
  ``pred_masks`` (N, 1, M, M) mask probabilities inside each box, ``scores`` (N,), and
  ``image_size`` (2,) = (H, W). N varies with the image. :func:`outputs_to_instances` pastes the
  masks and rescales to the original image, as ``model([{"image", "height", "width"}])`` does.

Image sizes are dynamic: the trace records the image's height and width as graph values
(detectron2 traces its padding, anchors and RoI heads so; the lambda layers do too, where "auto"
is the "conv" form under a trace), so the exported model takes any H x W, and ONNX files declare
the input as (3, "height", "width"). The exception is a model whose lambda layers use
``impl="tiled"`` (``MODEL.LAMBDA_RESNET.IMPL``): its tiles are laid out for the sample's size,
so such an export is fixed to that size and :class:`ExportedModel` refuses others with an error.

Next to the exported file, ``<output>.json`` (:func:`metadata_path`) says how to feed it and read
it: the input's channel order and the config's test-time resize, whether sizes are dynamic, the
output names, and ``classes``: for each ``pred_classes`` index the dataset's category ``id`` (the
COCO ``category_id``) and ``name`` (:func:`class_table`). :class:`ExportedModel` reads it.

``torch_export`` (:func:`export_program`) runs ``torch.export.export(strict=False)`` on the same
TracingAdapter with the image's height and width as ``torch.export.Dim``s, and saves the
ExportedProgram with ``torch.export.save`` (``.pt2``). As is, detectron2 0.6 cannot be exported
so: its ``ImageList`` turns the padded size into Python numbers (``.item()``),
``detectron2.layers.Conv2d`` asks ``if x.numel() == 0`` of that data-dependent size
(``GuardOnDataDependentSymNode``), and after NMS the box count is unknown. While exporting, and
only then, :func:`~lambda_det.compat.torch_export.export_friendly_detectron2` swaps those few
functions for equivalents that compute the same numbers without asking questions of tensor
values (that module lists each and why it is equal). The program takes any H, W from
:func:`torch_export_min_size` (65 for an FPN with P6: torch.export specialises feature maps of
size 1), and any number of detections, 0 included. The lambda layers take their "conv" form
under ``torch.compiler.is_exporting()``; impl "tiled" is refused. The ``.pt2`` files written here
hold no pickle (torch.export.save's sample inputs are left out), and :class:`ExportedModel`
loads a ``.pt2`` only in the layout torch 2.14.1 writes, where every member that loading
unpickles loads with ``weights_only=True`` and every string it evaluates is an expression of
sizes (:mod:`lambda_det.export._archive`; ``torch.export.load`` would unpickle in full and
evaluate any string).

ONNX goes through torch's TorchScript-based exporter (``dynamo=False``); the ONNX exporter built
on torch.export (``dynamo=True``) is not wired to the replacements above. Opset 16 or newer is
needed for ``RoIAlign`` with ``aligned=True``. Every lambda layer implementation ("einsum", "conv",
"tiled", so "auto" too) exports to both formats; under a trace the tiled form gathers its halos
with one index op instead of ``unfold``, which the ONNX exporter cannot convert on traced sizes.

The modules (what they hold that is public is importable from ``lambda_det.export``):

* :mod:`~lambda_det.export.files`: the formats (:data:`EXPORT_FORMATS`) and their suffixes, the
  metadata file's path (:func:`metadata_path`), and which output paths an export may write
  (:func:`check_export_output`);
* :mod:`~lambda_det.export.tracing`: :func:`sample_image`, :func:`eager_outputs` (the eager
  outputs by the exported names), :func:`best_score_below_threshold`, :class:`TracedModel` and
  :func:`trace_model` (``torch.jit.trace``: TorchScript, and ONNX from it);
* :mod:`~lambda_det.export.program`: :func:`export_program` (``torch.export``) and
  :func:`torch_export_min_size`;
* :mod:`~lambda_det.export.metadata`: :func:`export_metadata` and :func:`class_table`;
* :mod:`~lambda_det.export.saving`: :func:`export_model`, which traces or exports a model and
  writes the file and its metadata;
* :mod:`~lambda_det.export.exported_model`: :class:`ExportedModel`, which runs an exported file,
  and :func:`outputs_to_instances`, :func:`max_differences` (on each output's scale) and
  :func:`detection_count` for its outputs;
* :mod:`~lambda_det.export._archive`: the checks that loading a ``.pt2`` runs no code from it.

The export-only replacements of detectron2 functions are in :mod:`lambda_det.compat.torch_export`.
"""

from lambda_det.export.exported_model import (
    SCALES,
    ExportedModel,
    detection_count,
    max_differences,
    outputs_to_instances,
)
from lambda_det.export.files import (  # noqa: F401  (outside __all__, importable from here too)
    EXPORT_FORMATS,
    FILE_SUFFIXES,
    METADATA_NAME,
    ONNX_OPSET,
    SIZE_NAMES,
    PathLike,
    check_export_output,
    metadata_path,
)
from lambda_det.export.metadata import class_table, export_metadata
from lambda_det.export.program import export_program, torch_export_min_size
from lambda_det.export.saving import export_model
from lambda_det.export.tracing import (
    TracedModel,
    best_score_below_threshold,
    eager_outputs,
    fixed_size_reason,
    sample_image,
    trace_model,
)

__all__ = [
    "EXPORT_FORMATS",
    "FILE_SUFFIXES",
    "ONNX_OPSET",
    "TracedModel",
    "ExportedModel",
    "sample_image",
    "eager_outputs",
    "best_score_below_threshold",
    "check_export_output",
    "metadata_path",
    "class_table",
    "export_metadata",
    "fixed_size_reason",
    "trace_model",
    "export_program",
    "torch_export_min_size",
    "export_model",
    "outputs_to_instances",
    "max_differences",
    "detection_count",
    "SCALES",
]
