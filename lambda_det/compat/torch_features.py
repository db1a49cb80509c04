"""The torch features that differ between the torch releases lambda_det supports (setup.py's floor
to the newest), each found by feature detection (an attribute or an import that exists or not),
never by comparing version strings.

This module imports torch alone (no detectron2, nothing else of lambda_det), so that
:mod:`lambda_det.layers` may use it. A feature missing here is either replaced by an equivalent
(``has_free_unbacked_symbols``) or reported by its flag (``HAS_*``), which the code that needs it
checks and the tests that need it skip on, naming the feature.
"""

import functools
import importlib.util
from typing import Any, Optional

import torch

__all__ = [
    "HAS_IS_EXPORTING",
    "HAS_PT2_ARCHIVE",
    "is_exporting",
    "has_free_unbacked_symbols",
    "pt2_package",
    "check_torch_floor",
    "fake_kernels_stack",
    "contiguous_gradient_at_batch_1",
]

# torch.compiler.is_exporting (torch >= 2.6): True while torch.export traces. The layers ask it
# to stay shape-generic under torch.export. Without it no export can be told apart, so the layers
# take their eager path and torch.export of a lambda layer is unsupported (HAS_IS_EXPORTING).
HAS_IS_EXPORTING = hasattr(torch.compiler, "is_exporting")


def _never_exporting() -> bool:
    """Stands in for torch.compiler.is_exporting where torch has none (scriptable)."""
    return False


# The callers call it as a module attribute: TorchScript and dynamo then see torch's own
# function where it exists.
is_exporting = torch.compiler.is_exporting if HAS_IS_EXPORTING else _never_exporting


class _ContiguousGradient(torch.autograd.Function):
    """The identity, whose backward hands its gradient on contiguous."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, gradient: torch.Tensor) -> torch.Tensor:
        return gradient.contiguous()


@torch.jit.unused
def _contiguous_gradient_at_batch_1(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.shape[0] == 1 and not torch.jit.is_tracing() and not is_exporting():
        return _ContiguousGradient.apply(tensor)
    return tensor


def contiguous_gradient_at_batch_1(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (batch first), whose gradient is made contiguous before it reaches the op
    that made it when the batch is 1. Works around torch's CPU batch norm backward
    (``native_batch_norm_backward``, torch 2.5 to 2.14.1): at batch 1 it gives wrong gradients
    (``torch.autograd.gradcheck`` fails, over 100% off in float64) when the gradient it
    receives is strided as a matmul's or an einsum's backward leaves it, as a lambda layer's
    normalised values receive it; a contiguous one it takes right, and so does its
    decomposition under torch.compile. Other batches, TorchScript, a trace and torch.export
    run as without it (the same bits)."""
    if torch.jit.is_scripting():
        return tensor
    return _contiguous_gradient_at_batch_1(tensor)


# has_free_unbacked_symbols (torch >= 2.6); older releases have free_unbacked_symbols (a set).
try:
    from torch.fx.experimental.symbolic_shapes import has_free_unbacked_symbols
except ImportError:  # pragma: no cover - depends on the torch release
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    def has_free_unbacked_symbols(value: Any) -> bool:
        """Whether ``value`` (a size, a shape) holds a size that depends on tensor values."""
        return bool(free_unbacked_symbols(value))


# torch.export.pt2_archive (torch >= 2.8 in this form): the reader of torch.export.save's .pt2
# archives that lambda_det.export._archive checks before loading. Private module (its reader
# classes have no public counterpart); None where torch has no such module, and then lambda_det
# neither writes nor reads .pt2 files (HAS_PT2_ARCHIVE).
pt2_package: Optional[Any]
try:
    from torch.export.pt2_archive import _package as pt2_package
except ImportError:  # pragma: no cover - depends on the torch release
    pt2_package = None
HAS_PT2_ARCHIVE = pt2_package is not None


@functools.lru_cache(maxsize=None)
def fake_kernels_stack() -> bool:
    """Whether a second fake kernel of an operator takes over from the first (torch's newer
    releases) rather than being refused (torch 2.5-2.8 raise RuntimeError). The whole-detector
    export registers its fake ``torchvision::nms`` over torchvision's own, so it needs this.
    Probed once on a scratch operator; Library._destroy (private) unregisters the probe, as
    torch's own tests do, since a Library has no public way to be removed."""
    first = torch.library.Library("lambda_det_probe", "FRAGMENT")
    second = None
    try:
        first.define("probe(Tensor x) -> Tensor")
        torch.library.register_fake("lambda_det_probe::probe", torch.empty_like, lib=first)
        second = torch.library.Library("lambda_det_probe", "FRAGMENT")
        try:
            torch.library.register_fake("lambda_det_probe::probe", torch.empty_like, lib=second)
        except RuntimeError:
            return False
        return True
    finally:
        if second is not None:
            second._destroy()
        first._destroy()


# torch.nn.attention.flex_attention is new in torch 2.5, setup.py's floor: a torch without it is
# older than any lambda_det is tested on.
FLOOR_MODULE = "torch.nn.attention.flex_attention"


def check_torch_floor() -> None:
    """Raises ImportError (one line) on a torch older than setup.py's floor (torch>=2.5)."""
    if importlib.util.find_spec(FLOOR_MODULE) is None:
        raise ImportError(
            f"lambda_det needs torch>=2.5 (setup.py); torch {torch.__version__} has no "
            f"{FLOOR_MODULE}: pip install 'torch>=2.5'"
        )
