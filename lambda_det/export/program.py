"""``torch.export`` of a detectron2 model: an ExportedProgram with a symbolic image height and
width, under :func:`~lambda_det.compat.torch_export.export_friendly_detectron2`."""

import torch
import torch.fx.experimental._config
from detectron2.export import TracingAdapter
from torch import nn

from lambda_det.compat import torch_features
from lambda_det.compat.torch_export import export_friendly_detectron2
from lambda_det.export.files import SIZE_NAMES
from lambda_det.export.tracing import (
    TracedModel,
    _check_sample,
    _inference,
    _output_names,
    fixed_size_reason,
)
from lambda_det.utils.errors import UserError


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

    Non-strict export, under :func:`~lambda_det.compat.torch_export.export_friendly_detectron2`
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
        raise UserError(f"torch.export takes the model at a dynamic size only, and {reason}")
    min_size = torch_export_min_size(model)
    if min(image.shape[1:]) < min_size:
        raise UserError(
            f"the torch.export sample must be at least {min_size} x {min_size} pixels (every "
            f"feature map at least 2 x 2; the export then takes any size from there), got "
            f"{tuple(image.shape[1:])}: pass a larger --sample-image or --sample-size"
        )
    if not torch_features.HAS_IS_EXPORTING:  # the layers could not tell an export from eager
        raise UserError(
            f"torch.export of a lambda_det model needs torch.compiler.is_exporting (torch>=2.6); "
            f"this torch ({torch.__version__}) has none: pip install 'torch>=2.6'"
        )
    if not torch_features.fake_kernels_stack():  # export_friendly_detectron2's fake nms
        raise UserError(
            f"torch.export of a detector needs a torch whose torch.library.register_fake "
            f"replaces an operator's fake kernel (torchvision::nms's); this torch "
            f"({torch.__version__}) refuses a second one: use a newer torch (2.14.1 is tested)"
        )
    adapter = TracingAdapter(model, [{"image": image}], _inference)
    height = torch.export.Dim(SIZE_NAMES[0], min=min_size)
    width = torch.export.Dim(SIZE_NAMES[1], min=min_size)
    with (
        export_friendly_detectron2(),
        torch.no_grad(),
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
    ):
        try:
            program = torch.export.export(
                _ImageToOutputs(adapter),
                (image,),
                dynamic_shapes={"image": {1: height, 2: width}},
                strict=False,
            )
        except torch._dynamo.exc.UserError as error:
            # Constraints violated: some layer holds only for some sizes (e.g. AFT-conv's
            # windows, a global lambda layer's max_size).
            violations = [
                line.strip(" -")
                for line in str(error).splitlines()
                if line.strip().startswith("- ")
            ]
            raise UserError(
                f"torch.export cannot take this model at every size from {min_size}: "
                f"{violations[0] if violations else str(error).splitlines()[0]}; try the "
                f"torchscript or onnx format"
            ) from error
    return TracedModel(program, image, _output_names(adapter), min_size=(min_size, min_size))
