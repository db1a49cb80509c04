"""From a detectron2 model to a :class:`TracedModel` with ``torch.jit.trace`` (TorchScript, and
ONNX from it): the sample image, the eager outputs under the exported names, and the trace."""

import os
import warnings
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

import numpy as np
import torch
from detectron2.config import CfgNode
from detectron2.data import detection_utils
from detectron2.data import transforms as T
from detectron2.export import TracingAdapter
from detectron2.modeling import GeneralizedRCNN
from detectron2.structures import Boxes
from torch import nn

import lambda_det.modeling  # noqa: F401  (registers the backbones that build_model finds)
from lambda_det.data.mapper import build_mapper
from lambda_det.export.files import PathLike
from lambda_det.layers import LambdaLayer
from lambda_det.utils.errors import MissingFileError, UserError


def sample_image(
    cfg: CfgNode,
    path: Optional[PathLike] = None,
    size: Optional[Tuple[int, int]] = None,
    seed: int = 0,
) -> torch.Tensor:
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
            raise MissingFileError(f"sample image {str(path)!r} does not exist")
        image = detection_utils.read_image(str(path), format=cfg.INPUT.FORMAT)  # H W C
    else:
        if size is None:
            size = (cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MIN_SIZE_TEST)
        height, width = (int(s) for s in size)
        if height < 1 or width < 1:
            raise UserError(f"sample size must be positive, got {tuple(size)}")
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
        raise TypeError(
            f"only models that return [{{'instances': Instances}}] for one image can "
            f"be exported; this one returns {schema}"
        ) from None
    if len(image_schema.keys) != 1 or set(instances_schema.sizes) != {1}:
        raise TypeError(
            f"cannot name the traced outputs {schema}: expected only 'instances', "
            f"with one tensor for each field"
        )
    return fields + ("image_size",)


def eager_outputs(model: nn.Module, image: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The eager model's outputs for ``image``, under the names the exported model uses."""
    with torch.no_grad():
        instances = _inference(model, [{"image": image}])[0]["instances"]
    outputs = {
        name: value.tensor if isinstance(value, Boxes) else value
        for name, value in instances.get_fields().items()
    }
    outputs["image_size"] = torch.tensor(instances.image_size)
    return dict(sorted(outputs.items()))


def best_score_below_threshold(
    model: nn.Module, image: torch.Tensor
) -> Optional[Tuple[float, float]]:
    """The eager model's highest detection score on ``image`` with its test score thresholds
    (detectron2's ``test_score_thresh`` of the box predictors, or of RetinaNet) at 0, and the
    threshold: why it detected nothing. None when it has no such threshold or detects nothing
    at 0 either. The thresholds are restored."""
    holders = [module for module in model.modules() if hasattr(module, "test_score_thresh")]
    if not holders:
        return None
    saved = [holder.test_score_thresh for holder in holders]
    try:
        for holder in holders:
            holder.test_score_thresh = 0.0
        scores = eager_outputs(model, image).get("scores")
    finally:
        for holder, threshold in zip(holders, saved):
            holder.test_score_thresh = threshold
    if scores is None or not len(scores):
        return None
    return float(scores.max()), float(saved[0])


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
        metadata = {
            "input_name": "image",
            "input_shape": list(self.input_shape),
            "input_dtype": str(self.sample.dtype).replace("torch.", ""),
            "dynamic_size": self.dynamic_size,
            "output_names": list(self.output_names),
        }
        if self.min_size is not None:
            metadata["min_size"] = list(self.min_size)
        return metadata


def fixed_size_reason(model: nn.Module) -> Optional[str]:
    """Why a trace of ``model`` holds for the sample's size only, or None when it runs at any."""
    tiled = [
        name
        for name, module in model.named_modules()
        if isinstance(module, LambdaLayer) and module.impl == "tiled"
    ]
    if tiled:
        return (
            f"its lambda layers use impl 'tiled' ({tiled[0]}, ...), laid out for one input "
            f"size; MODEL.LAMBDA_RESNET.IMPL auto, conv or einsum export for any size"
        )
    return None


def _check_sample(model: nn.Module, image: torch.Tensor, verb: str) -> None:
    """A (3, H, W) image tensor and a model in eval mode, or a ValueError that says so."""
    if not isinstance(image, torch.Tensor) or image.dim() != 3 or image.shape[0] != 3:
        shape = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
        raise ValueError(f"the sample must be a (3, H, W) image tensor, got {shape}")
    if model.training:
        raise ValueError(
            f"{verb} the model in eval mode (model.eval()): training mode needs "
            f"ground truth and returns losses"
        )


def trace_model(model: nn.Module, image: torch.Tensor) -> TracedModel:
    """Trace ``model`` (eval mode) on one (3, H, W) image; the trace runs at any H x W unless
    :func:`fixed_size_reason` says otherwise."""
    _check_sample(model, image, "trace")
    adapter = TracingAdapter(model, [{"image": image}], _inference)
    with warnings.catch_warnings():
        # Python-side sizes becoming constants is exactly the specialisation the package documents.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # torch.jit.trace, and torch.jit.script for torchvision's batched_nms while tracing.
        warnings.filterwarnings(
            "ignore",
            message=r".*torch\.jit\.(trace|script).* is deprecated",
            category=FutureWarning,
        )
        # Equality is checked on outputs (tools/export_model.py, tests), not on re-traced graphs.
        module = torch.jit.trace(adapter, adapter.flattened_inputs, check_trace=False)
    return TracedModel(module, image, _output_names(adapter), fixed_size_reason(model))
