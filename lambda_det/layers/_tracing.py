"""What the layers share about torch.jit.trace."""
import warnings
from typing import Tuple

import torch


def static_sizes(tensor: torch.Tensor) -> Tuple[int, ...]:
    """``tensor.shape`` as Python ints.

    Under ``torch.jit.trace`` the trace is specialised to its example's sizes anyway (relative
    position tables, windows and tiles depend on them), so the conversion's TracerWarning is
    silenced rather than shown to every user who exports a model.
    """
    if not torch.jit.is_tracing():
        return tuple(tensor.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return tuple(int(size) for size in tensor.shape)
