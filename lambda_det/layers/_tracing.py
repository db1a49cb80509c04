"""What the layers share about tracing: torch.jit.trace and torch.fx."""

import warnings
from typing import List, Tuple

import torch


def static_sizes(tensor: torch.Tensor) -> Tuple[int, ...]:
    """``tensor.shape`` as Python ints.

    Under ``torch.jit.trace`` these sizes become constants of the trace; where they are used
    (input checks, the tiled form's windows and tiles) that specialisation is intended, so the
    conversion's TracerWarning is silenced rather than shown to every user who exports a model.
    (LambdaLayer's "einsum" and "conv" forms read ``x.shape`` instead, to trace for any size.)
    """
    if not torch.jit.is_tracing():
        return tuple(tensor.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return tuple(int(size) for size in tensor.shape)


def size_list(tensor: torch.Tensor) -> List[int]:
    """:func:`static_sizes` as a list: what TorchScript, whose sizes are ints already, compiles."""
    if torch.jit.is_scripting():
        return tensor.shape
    return list(static_sizes(tensor))


def fx_leaf_call(module: torch.nn.Module, *args) -> torch.fx.Proxy:
    """``module(*args)`` recorded as one call by the torch.fx tracer of the Proxy among ``args``,
    as torch.nn's own modules are, rather than traced into.

    For a module whose computation depends on its input's sizes, which a symbolic trace does
    not know: the traced model calls the module itself (and a scripted one, its scripted form).
    """
    tracer = next(arg for arg in args if isinstance(arg, torch.fx.Proxy)).tracer
    if tracer.root is module:
        raise TypeError(
            f"torch.fx traces a {type(module).__name__} as one call within a model: "
            f"trace a module that holds it, e.g. torch.nn.Sequential(module)"
        )
    return tracer.create_proxy("call_module", tracer.path_of_module(module), args, {})
