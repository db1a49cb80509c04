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
only then, :func:`~lambda_det.export._torch_export.export_friendly_detectron2` swaps those few
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
"""
import importlib.util
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch
import torch.fx.experimental._config  # noqa: F401  (backed_size_oblivious, for export_program)
from torch import nn
import lambda_det.modeling  # noqa: F401  (registers the backbones that build_model finds)
from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, detection_utils
from detectron2.data import transforms as T
from detectron2.export import TracingAdapter
from detectron2.modeling import GeneralizedRCNN
from detectron2.modeling.postprocessing import detector_postprocess
from detectron2.structures import Boxes, Instances
from lambda_det.data.mapper import build_mapper
from lambda_det.inference import metadata_of
from lambda_det.layers import LambdaLayer
from lambda_det.export._archive import load_program, zip_kind
from lambda_det.export._torch_export import export_friendly_detectron2
from lambda_det.utils.atomic import atomic_path, check_output_file

__all__ = ["EXPORT_FORMATS", "FILE_SUFFIXES", "ONNX_OPSET", "TracedModel", "ExportedModel",
           "sample_image", "eager_outputs", "check_export_output", "metadata_path",
           "class_table", "export_metadata", "fixed_size_reason",
           "trace_model", "export_program", "torch_export_min_size", "export_model",
           "outputs_to_instances", "max_differences"]

EXPORT_FORMATS = ("torchscript", "onnx", "torch_export")
FILE_SUFFIXES = {"torchscript": ".ts", "onnx": ".onnx", "torch_export": ".pt2"}
ONNX_OPSET = 17
# Stored in the TorchScript archive (ONNX files carry the same facts in their graph).
METADATA_NAME = "lambda_det_export.json"
# The names of the input's dynamic axes (ONNX) and of its sizes in the metadata.
SIZE_NAMES = ("height", "width")

PathLike = Union[str, os.PathLike]


def sample_image(cfg: CfgNode, path: Optional[PathLike] = None,
                 size: Optional[Tuple[int, int]] = None, seed: int = 0) -> torch.Tensor:
    """A (3, H, W) uint8 image in ``cfg.INPUT.FORMAT``, resized by the config's test transform.

    Args:
        path: an image file; default a synthetic one (uniform noise from ``seed``).
        size: (height, width) of the synthetic image before the resize; default the square the
            test transform keeps as it is (``INPUT.MIN_SIZE_TEST``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    if path is not None:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"sample image {str(path)!r} does not exist")
        image = detection_utils.read_image(str(path), format=cfg.INPUT.FORMAT)  # H W C
    else:
        if size is None:
            size = (cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MIN_SIZE_TEST)
        height, width = (int(s) for s in size)
        if height < 1 or width < 1:
            raise ValueError(f"sample size must be positive, got {tuple(size)}")
        image = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    augmented = T.AugInput(image)
    build_mapper(cfg, is_train=False).augmentations(augmented)  # the test-time resize
    return torch.as_tensor(np.ascontiguousarray(augmented.image.transpose(2, 0, 1)))  # 3 H W


def _inference(model: nn.Module, inputs):
    if isinstance(model, GeneralizedRCNN):
        # No postprocessing: boxes stay in the input's pixels and masks stay M x M probabilities
        # (pasting them is data-dependent Python); outputs_to_instances does both afterwards.
        return [{"instances": model.inference(inputs, do_postprocess=False)[0]}]
    # Other meta-architectures (RetinaNet): without "height"/"width" in the inputs, their
    # postprocessing keeps the input's size, so the outputs mean the same.
    return model(inputs)


def _output_names(adapter: TracingAdapter) -> Tuple[str, ...]:
    """Names of the flattened outputs: the Instances fields (sorted), then image_size."""
    schema = adapter.outputs_schema
    try:
        (image_schema,) = schema.schemas
        instances_schema = image_schema.schemas[image_schema.keys.index("instances")]
        fields = tuple(instances_schema.keys)
    except (AttributeError, ValueError):
        raise TypeError(f"only models that return [{{'instances': Instances}}] for one image can "
                        f"be exported; this one returns {schema}") from None
    if len(image_schema.keys) != 1 or set(instances_schema.sizes) != {1}:
        raise TypeError(f"cannot name the traced outputs {schema}: expected only 'instances', "
                        f"with one tensor for each field")
    return fields + ("image_size",)


def eager_outputs(model: nn.Module, image: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The eager model's outputs for ``image``, under the names the exported model uses."""
    with torch.no_grad():
        instances = _inference(model, [{"image": image}])[0]["instances"]
    outputs = {name: value.tensor if isinstance(value, Boxes) else value
               for name, value in instances.get_fields().items()}
    outputs["image_size"] = torch.tensor(instances.image_size)
    return dict(sorted(outputs.items()))


@dataclass
class TracedModel:
    """A traced model and what it was traced with."""

    # image -> flattened outputs (a tuple of tensors): a torch.jit.ScriptModule, or for
    # "torch_export" a torch.export.ExportedProgram
    module: Union[torch.jit.ScriptModule, torch.export.ExportedProgram]
    sample: torch.Tensor  # the (3, H, W) example: every input must have its dtype
    output_names: Tuple[str, ...]
    fixed_size_reason: Optional[str] = None  # why only the sample's size runs; None: any size
    # The smallest (H, W) that a dynamic-size export takes (torch.export); None: any.
    min_size: Optional[Tuple[int, int]] = None

    @property
    def dynamic_size(self) -> bool:
        return self.fixed_size_reason is None

    @property
    def input_shape(self) -> Tuple[Optional[int], ...]:
        """(3, H, W), with None for the dynamic sizes."""
        channels, height, width = self.sample.shape
        return (channels, None, None) if self.dynamic_size else (channels, height, width)

    def metadata(self) -> dict:
        metadata = {"input_name": "image", "input_shape": list(self.input_shape),
                    "input_dtype": str(self.sample.dtype).replace("torch.", ""),
                    "dynamic_size": self.dynamic_size, "output_names": list(self.output_names)}
        if self.min_size is not None:
            metadata["min_size"] = list(self.min_size)
        return metadata


def fixed_size_reason(model: nn.Module) -> Optional[str]:
    """Why a trace of ``model`` holds for the sample's size only, or None when it runs at any."""
    tiled = [name for name, module in model.named_modules()
             if isinstance(module, LambdaLayer) and module.impl == "tiled"]
    if tiled:
        return (f"its lambda layers use impl 'tiled' ({tiled[0]}, ...), laid out for one input "
                f"size; MODEL.LAMBDA_RESNET.IMPL auto, conv or einsum export for any size")
    return None


def _check_sample(model: nn.Module, image: torch.Tensor, verb: str) -> None:
    """A (3, H, W) image tensor and a model in eval mode, or a ValueError that says so."""
    if not isinstance(image, torch.Tensor) or image.dim() != 3 or image.shape[0] != 3:
        shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise ValueError(f"the sample must be a (3, H, W) image tensor, got {shape}")
    if model.training:
        raise ValueError(f"{verb} the model in eval mode (model.eval()): training mode needs "
                         f"ground truth and returns losses")


def trace_model(model: nn.Module, image: torch.Tensor) -> TracedModel:
    """Trace ``model`` (eval mode) on one (3, H, W) image; the trace runs at any H x W unless
    :func:`fixed_size_reason` says otherwise."""
    _check_sample(model, image, "trace")
    adapter = TracingAdapter(model, [{"image": image}], _inference)
    with warnings.catch_warnings():
        # Python-side sizes becoming constants is exactly the specialisation documented above.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # torch.jit.trace, and torch.jit.script for torchvision's batched_nms while tracing.
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.(trace|script).* is deprecated",
                                category=FutureWarning)
        # Equality is checked on outputs (tools/export_model.py, tests), not on re-traced graphs.
        module = torch.jit.trace(adapter, adapter.flattened_inputs, check_trace=False)
    return TracedModel(module, image, _output_names(adapter), fixed_size_reason(model))


class _ImageToOutputs(nn.Module):
    """TracingAdapter with one named input, ``image``, for torch.export's dynamic shapes."""

    def __init__(self, adapter: TracingAdapter):
        super().__init__()
        self.adapter = adapter

    def forward(self, image: torch.Tensor):
        return self.adapter(image)


def torch_export_min_size(model: nn.Module) -> int:
    """The smallest image height and width a ``torch.export`` of ``model`` takes: one more than
    its largest feature stride (64 for a Mask R-CNN FPN's P6), so that every feature map is at
    least 2 x 2. torch.export specialises a size of 1 (convolution algorithms, views), so an
    export from a larger sample does not cover maps of size 1."""
    backbone = getattr(model, "backbone", None)
    strides = [shape.stride for shape in backbone.output_shape().values()] if backbone else []
    return max(strides, default=1) + 1


def export_program(model: nn.Module, image: torch.Tensor) -> TracedModel:
    """``torch.export`` ``model`` (eval mode) on one (3, H, W) image, with a symbolic height and
    width: the program runs at any H, W >= :func:`torch_export_min_size`.

    Non-strict export, under :func:`~lambda_det.export._torch_export.export_friendly_detectron2`
    (export-only equivalents of the few detectron2 functions that ask questions of tensor values;
    that module says which and why) and ``backed_size_oblivious`` (sizes are not specialised for
    being 0 or 1 in the sample). The lambda layers take their "conv" form (as under a trace).

    Raises:
        ValueError: the model's lambda layers use impl "tiled" (laid out for one size), the
            sample is smaller than :func:`torch_export_min_size`, or a layer holds for some sizes
            only (torch.export's constraint violations: e.g. AFT-conv mixers).
    """
    _check_sample(model, image, "export")
    reason = fixed_size_reason(model)
    if reason is not None:
        raise ValueError(f"torch.export takes the model at a dynamic size only, and {reason}")
    min_size = torch_export_min_size(model)
    if min(image.shape[1:]) < min_size:
        raise ValueError(
            f"the torch.export sample must be at least {min_size} x {min_size} pixels (every "
            f"feature map at least 2 x 2; the export then takes any size from there), got "
            f"{tuple(image.shape[1:])}: pass a larger --sample-image or --sample-size")
    adapter = TracingAdapter(model, [{"image": image}], _inference)
    height = torch.export.Dim(SIZE_NAMES[0], min=min_size)
    width = torch.export.Dim(SIZE_NAMES[1], min=min_size)
    with export_friendly_detectron2(), torch.no_grad(), \
            torch.fx.experimental._config.patch(backed_size_oblivious=True):
        try:
            program = torch.export.export(_ImageToOutputs(adapter), (image,),
                                          dynamic_shapes={"image": {1: height, 2: width}},
                                          strict=False)
        except torch._dynamo.exc.UserError as error:
            # Constraints violated: some layer holds only for some sizes (e.g. AFT-conv's
            # windows, a global lambda layer's max_size).
            violations = [line.strip(" -") for line in str(error).splitlines()
                          if line.strip().startswith("- ")]
            raise ValueError(
                f"torch.export cannot take this model at every size from {min_size}: "
                f"{violations[0] if violations else str(error).splitlines()[0]}; try the "
                f"torchscript or onnx format") from error
    return TracedModel(program, image, _output_names(adapter), min_size=(min_size, min_size))


def _save_onnx(traced: TracedModel, path: Path, opset: int) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*legacy TorchScript-based ONNX export",
                                category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r"The feature will be removed",
                                category=DeprecationWarning)  # raised inside that exporter
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # Harmless here: a traced module has no Python signature to read, and every index
        # (position-table offsets, mask classes) is >= 0.
        warnings.filterwarnings("ignore", message=r"no signature found for")
        warnings.filterwarnings("ignore", message=r"Exporting aten::index operator of advanced")
        # Strided slices stay in the graph instead of being folded into constants: slower to
        # load, same results.
        warnings.filterwarnings("ignore", message=r"Constant folding - Only steps=1")
        dynamic_axes = {"image": {1: SIZE_NAMES[0], 2: SIZE_NAMES[1]}} if traced.dynamic_size \
            else None
        torch.onnx.export(traced.module, (traced.sample,), str(path), dynamo=False,
                          opset_version=opset, input_names=["image"],
                          output_names=list(traced.output_names), dynamic_axes=dynamic_axes)


def metadata_path(output: PathLike) -> Path:
    """The metadata file written next to an exported ``output``: ``<output>.json``."""
    return Path(f"{os.fspath(output)}.json")


def check_export_output(output: PathLike, reads: Mapping[str, Optional[str]],
                        overwrite: bool) -> None:
    """Refuse an export path that would lose a file (the output rule,
    :func:`~lambda_det.utils.atomic.check_output_file`): never a file the export reads
    (``reads``: e.g. "MODEL.WEIGHTS" -> the checkpoint, "--config" -> the config; compared as
    files, through links and spellings), another existing file only with ``overwrite``. The
    same for its :func:`metadata_path`.

    Raises:
        IsADirectoryError: ``output`` (or its metadata path) is a folder.
        FileExistsError: ``output`` (or its metadata path) exists; the message names the fix.
    """
    for path, what in ((output, f"--output {str(output)!r}"),
                       (metadata_path(output), f"the metadata file {str(metadata_path(output))!r} "
                                               f"of --output")):
        if os.path.isdir(path):
            raise IsADirectoryError(f"{what} is a folder: pass another file path, e.g. "
                                    f"{os.path.join(output, 'model.ts')!r}")
        check_output_file(path, overwrite, reads, "--output", what)


def class_table(metadata, num_classes: int) -> List[dict]:
    """For each class index of ``pred_classes``: the dataset's category ``id`` and ``name``.

    ``metadata``: the dataset's detectron2 metadata. Without ``thing_dataset_id_to_contiguous_id``
    the id is the index, and without ``thing_classes`` the name is None (as
    :func:`lambda_det.inference.coco_results` does).
    """
    to_dataset = {index: dataset_id for dataset_id, index in
                  metadata.get("thing_dataset_id_to_contiguous_id", {}).items()}
    names = metadata.get("thing_classes", None) or []
    return [{"index": index, "id": to_dataset.get(index, index),
             "name": names[index] if index < len(names) else None}
            for index in range(num_classes)]


def _num_classes(cfg: CfgNode) -> int:
    if cfg.MODEL.META_ARCHITECTURE == "RetinaNet":
        return cfg.MODEL.RETINANET.NUM_CLASSES
    return cfg.MODEL.ROI_HEADS.NUM_CLASSES


def export_metadata(cfg: CfgNode, traced: TracedModel, format: str) -> dict:
    """What :func:`export_model` writes to :func:`metadata_path`: how to feed the exported
    model (input, test-time resize, dynamic sizes) and read it (outputs, classes of the test
    dataset ``DATASETS.TEST[0]``)."""
    dataset = cfg.DATASETS.TEST[0] if len(cfg.DATASETS.TEST) else None
    metadata = metadata_of(cfg)
    if (dataset in DatasetCatalog.list()
            and "thing_dataset_id_to_contiguous_id" not in metadata.as_dict()):
        DatasetCatalog.get(dataset)  # detectron2's COCO loader sets the category ids
    smallest = "" if traced.min_size is None else \
        f" with H >= {traced.min_size[0]} and W >= {traced.min_size[1]}"
    size_note = (f"any (3, H, W) image{smallest}: sizes are dynamic" if traced.dynamic_size else
                 f"only (3, {traced.sample.shape[1]}, {traced.sample.shape[2]}) images: "
                 f"{traced.fixed_size_reason}")
    return {
        "format": format,
        **traced.metadata(),
        "input_format": cfg.INPUT.FORMAT,
        "input_note": (f"{size_note}; resize each image as the test loader does "
                       f"(test_resize; lambda_det.export.sample_image) and give it in "
                       f"input_format channel order"),
        "test_resize": {"min_size": cfg.INPUT.MIN_SIZE_TEST, "max_size": cfg.INPUT.MAX_SIZE_TEST,
                        "transform": repr(build_mapper(cfg, is_train=False).augmentations)},
        "dataset": dataset,
        "classes": class_table(metadata, _num_classes(cfg)),
    }


def export_model(model: nn.Module, image: torch.Tensor, output: PathLike, format: str,
                 opset: int = ONNX_OPSET, cfg: Optional[CfgNode] = None) -> TracedModel:
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
            raise ValueError(f"ONNX opset must be >= 16 (RoIAlign with aligned=True), got {opset}")
        if importlib.util.find_spec("onnx") is None:
            raise ImportError("ONNX export needs the onnx package (pip install onnx)")
    traced = export_program(model, image) if format == "torch_export" else \
        trace_model(model, image)
    metadata = export_metadata(cfg, traced, format) if cfg is not None else \
        {"format": format, **traced.metadata()}
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(output) as temporary:  # never a half-written model
        if format == "torchscript":
            extra_files = {METADATA_NAME: json.dumps(traced.metadata())}
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r".*torch\.jit\.save.* is deprecated",
                                        category=FutureWarning)
                # Through a Python file, whose write errors (a full disk) are OSErrors.
                with open(temporary, "wb") as f:
                    torch.jit.save(traced.module, f, _extra_files=extra_files)
        elif format == "torch_export":
            # Not the sample in the file: it may be a user's image, and it is the archive's one
            # pickle (lambda_det.export._archive checks that what loading unpickles is tensors).
            traced.module.example_inputs = None
            with open(temporary, "wb") as f:
                torch.export.save(traced.module, f,
                                  extra_files={METADATA_NAME: json.dumps(traced.metadata())})
        else:
            _save_onnx(traced, Path(temporary), opset)
    with atomic_path(metadata_path(output)) as temporary:
        Path(temporary).write_text(json.dumps(metadata, indent=2) + "\n")
    return traced


_ONNX_TYPES = {"tensor(uint8)": torch.uint8, "tensor(float)": torch.float32}


class ExportedModel:
    """An exported file loaded for inference: TorchScript on the device it was traced on (the
    trace holds that device as a constant), ONNX on the CPU through onnxruntime, a torch.export
    ``.pt2`` on the device it was exported on, once :mod:`lambda_det.export._archive` has checked
    that loading it runs no code from it. A TorchScript or torch.export file is known by its
    contents, an ONNX file by its suffix ``.onnx``.

    Calling it with a (3, H, W) image of its dtype (and of the exported size, for an export
    fixed to one) returns the outputs by name, on the CPU.

    Attributes:
        input_shape: (3, H, W), None for a dynamic size.
        min_size: the smallest (H, W) a torch.export file takes; None for the other formats.
        metadata: the contents of :func:`metadata_path`, or None where that file is missing.
        classes: ``metadata["classes"]`` (or None): ``classes[i]["id"]`` and
            ``classes[i]["name"]`` are the dataset's category id and name of
            ``pred_classes == i``.
    """

    def __init__(self, path: PathLike):
        path = str(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"exported model {path!r} does not exist")
        if path.endswith(FILE_SUFFIXES["onnx"]):
            try:
                import onnxruntime
            except ImportError as error:
                raise ImportError(f"running {path!r} needs onnxruntime "
                                  f"(pip install onnxruntime)") from error
            self._session = onnxruntime.InferenceSession(
                path, providers=["CPUExecutionProvider"])
            (model_input,) = self._session.get_inputs()
            self._input_name = model_input.name
            self.input_shape = tuple(size if isinstance(size, int) else None
                                     for size in model_input.shape)  # "height", "width": any
            self.input_dtype = _ONNX_TYPES.get(model_input.type)
            self.output_names = tuple(output.name for output in self._session.get_outputs())
            self._module = None
            self.min_size = None
        elif zip_kind(path) == "torch_export":
            program, extra_files = load_program(path)
            self._read_metadata(path, extra_files.get(METADATA_NAME, ""), "a torch.export")
            self._module = program.module()
        else:
            extra_files = {METADATA_NAME: ""}
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r".*torch\.jit\.load.* is deprecated",
                                        category=FutureWarning)
                self._module = torch.jit.load(path, _extra_files=extra_files)
            self._read_metadata(path, extra_files[METADATA_NAME], "a TorchScript")
        self.path = path
        sidecar = metadata_path(path)
        self.metadata = json.loads(sidecar.read_text()) if sidecar.is_file() else None
        self.classes = self.metadata.get("classes") if self.metadata else None

    def _read_metadata(self, path: str, text: str, kind: str) -> None:
        """The input and outputs, from the metadata stored in the file itself."""
        if not text:
            raise ValueError(f"{path!r} is not {kind} file written by lambda_det.export (it has "
                             f"no {METADATA_NAME})")
        metadata = json.loads(text)
        self.input_shape = tuple(metadata["input_shape"])
        self.input_dtype = getattr(torch, metadata["input_dtype"])
        self.output_names = tuple(metadata["output_names"])
        self.min_size = tuple(metadata["min_size"]) if metadata.get("min_size") else None

    def __call__(self, image: torch.Tensor) -> Dict[str, torch.Tensor]:
        if image.dim() != len(self.input_shape) or any(
                expected not in (None, size) for expected, size in zip(self.input_shape,
                                                                       image.shape)):
            raise ValueError(
                f"{self.path!r} was traced for images of shape {self.input_shape}, got "
                f"{tuple(image.shape)}: resize or pad the image, or export again with a sample "
                f"of this size")
        if self.min_size is not None and any(size < smallest for size, smallest in
                                             zip(image.shape[1:], self.min_size)):
            raise ValueError(f"{self.path!r} takes images of at least {self.min_size[0]} x "
                             f"{self.min_size[1]} pixels, got {tuple(image.shape[1:])} "
                             f"(TorchScript and ONNX exports take any size)")
        if self.input_dtype is not None and image.dtype != self.input_dtype:
            raise ValueError(f"{self.path!r} takes {self.input_dtype} images, got {image.dtype}")
        if self._module is not None:
            with torch.no_grad():
                outputs = [output.cpu() for output in self._module(image)]
        else:
            feed = {self._input_name: np.ascontiguousarray(image.cpu().numpy())}
            outputs = [torch.from_numpy(value) for value in self._session.run(None, feed)]
        return dict(zip(self.output_names, outputs))


def outputs_to_instances(outputs: Mapping[str, torch.Tensor], height: int,
                         width: int) -> Instances:
    """Final predictions for an image of ``height`` x ``width`` from exported outputs.

    The same as the eager ``model([{"image": image, "height": height, "width": width}])``:
    boxes rescaled from the input's size, masks pasted into the image as booleans.
    """
    image_size = tuple(int(size) for size in outputs["image_size"])
    fields = {name: torch.as_tensor(value) for name, value in outputs.items()
              if name != "image_size"}
    if "pred_boxes" in fields:
        fields["pred_boxes"] = Boxes(fields["pred_boxes"])
    return detector_postprocess(Instances(image_size, **fields), height, width)


def max_differences(expected: Mapping[str, torch.Tensor],
                    actual: Mapping[str, torch.Tensor]) -> Dict[str, float]:
    """Per output name, the largest absolute difference (inf where the shapes or names differ,
    nan where either side has a NaN)."""
    differences = {}
    for name in sorted(set(expected) | set(actual)):
        if name not in expected or name not in actual:
            differences[name] = float("inf")
            continue
        reference, value = (torch.as_tensor(outputs[name]).cpu() for outputs in (expected, actual))
        if reference.shape != value.shape:
            differences[name] = float("inf")
        elif reference.numel() == 0:
            differences[name] = 0.0
        else:
            differences[name] = float((reference.double() - value.double()).abs().max())
    return differences
