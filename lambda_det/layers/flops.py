"""FLOP counting of the layers with fvcore (and detectron2's ``FlopCountAnalysis`` and
``tools/analyze_model.py``, which are fvcore's): handles for the ops the layers run.

fvcore counts a model from its ``torch.jit`` trace, op by op, one fused multiply-add as one FLOP,
and skips an op it has no handle for with a warning. :func:`flop_handles` has one for each op
that lambda_det's layers and backbones run and fvcore does not know:

* ``baddbmm`` (a lambda layer adds its content term onto its position term): the batched
  matrix product, as fvcore counts ``addmm``;
* ``avg_pool1d`` / ``avg_pool2d`` (strided layers, the ResNet-D shortcut): one add per window
  entry of each output;
* the rest (indexing, padding, copies, comparisons, element-wise arithmetic) do no multiply-adds
  and are ignored (None), as fvcore and detectron2 leave such ops out.

With them, a layer's count is its analytic cost in the form that the trace runs (tests/layers/
test_flops.py compares each form with its formula): under a trace a LambdaLayer with impl "auto"
runs "conv" (see :meth:`LambdaLayer.resolve_impl`); :func:`eager_impls` makes it count the
form that eager mode runs instead.

``import lambda_det.modeling`` adds the handles to fvcore's defaults
(:func:`lambda_det.compat.internals.add_default_flop_handles`), so every ``FlopCountAnalysis``
counts these layers; with lambda_det.layers alone, pass them:
``analysis.set_op_handle(**flop_handles())``.
"""

import contextlib
import math
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

__all__ = ["flop_handles", "eager_impls"]

Handle = Callable[[List[Any], List[Any]], float]

# Ops of the layers and backbones that do no multiply-adds (fvcore ignores its own list of such
# ops; these are the ones that list lacks): data movement, comparisons, element-wise arithmetic.
_NO_MULTIPLY_ADDS = (
    "aten::pad",
    "aten::repeat",
    "aten::repeat_interleave",
    "aten::im2col",
    "aten::meshgrid",
    "aten::unflatten",
    "aten::numpy_T",
    "aten::where",
    "aten::triu",
    "aten::any",
    "aten::all",
    "aten::lt",
    "aten::le",
    "aten::ne",
    "aten::abs",
    "aten::neg",
    "aten::add",
    "aten::add_",
    "aten::sub",
    "aten::rsub",
    "aten::mul",
    "aten::mul_",
    "aten::div",
    "aten::div_",
    "aten::exp",
    "aten::sqrt",
    "aten::sigmoid",
    "aten::softmax",
    "aten::amax",
    "aten::sum",
    "aten::cumsum",
    "aten::mean",
    "aten::var",
    "aten::clamp_min",
)


def _shape(value) -> List[int]:
    """The sizes of a traced tensor value."""
    return list(value.type().sizes())


def _baddbmm_flops(inputs: List[Any], outputs: List[Any]) -> float:
    """input + batch1 @ batch2: (b, n, m) @ (b, m, p) is b n m p multiply-adds."""
    return math.prod(_shape(inputs[1])) * _shape(inputs[2])[-1]


def _avg_pool_flops(inputs: List[Any], outputs: List[Any]) -> float:
    """One add per window entry of each output (zero padding included)."""
    kernel = inputs[1].toIValue()
    if kernel is None:  # a prim::ListConstruct of constants
        kernel = [size.toIValue() for size in inputs[1].node().inputs()]
    return math.prod(_shape(outputs[0])) * math.prod(kernel)


def flop_handles() -> Dict[str, Optional[Handle]]:
    """fvcore op handles (None: the op is ignored) for the ops of lambda_det's layers that
    fvcore lacks; see the module docstring."""
    handles: Dict[str, Optional[Handle]] = {name: None for name in _NO_MULTIPLY_ADDS}
    handles.update(
        {
            "aten::baddbmm": _baddbmm_flops,
            "aten::baddbmm_": _baddbmm_flops,
            "aten::avg_pool1d": _avg_pool_flops,
            "aten::avg_pool2d": _avg_pool_flops,
        }
    )
    return handles


@contextlib.contextmanager
def eager_impls(model: torch.nn.Module, *inputs) -> Iterator[None]:
    """Within it, each LambdaLayer of ``model`` runs, also under a trace, the implementation
    that its ``impl`` resolves to in eager mode on ``inputs`` (one forward pass, without
    gradients, finds them); e.g. ``with eager_impls(model, x): FlopCountAnalysis(model, x)``
    counts the "tiled" form that "auto" runs eagerly at detection sizes, not the "conv" form of
    a trace."""
    from lambda_det.layers.lambda_layer import LambdaLayer

    resolved, hooks = {}, []

    def record(layer, args):
        resolved[layer] = layer.resolve_impl(tuple(args[0].shape[2:]), args[0].device.type)

    for module in model.modules():
        if isinstance(module, LambdaLayer):
            hooks.append(module.register_forward_pre_hook(record))
    training = model.training
    try:
        with torch.no_grad():
            model.eval()(*inputs)  # eval: no norm statistics updated
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    chosen = {layer: layer.impl for layer in resolved}
    try:
        for layer, impl in resolved.items():
            layer.impl = impl
        yield
    finally:
        for layer, impl in chosen.items():
            layer.impl = impl
