"""What the layers share about torch.jit.trace."""
import warnings
from typing import Tuple

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
