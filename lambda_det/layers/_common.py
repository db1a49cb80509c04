"""What the layers build alike: modules per number of spatial axes, the strided pool, the dtype
they mix in; and where their defaults are read."""

import inspect
from typing import Dict

import torch
from torch import nn

CONV = {1: nn.Conv1d, 2: nn.Conv2d}
BATCH_NORM = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d}
_AVG_POOL = {1: nn.AvgPool1d, 2: nn.AvgPool2d}


def strided_pool(spatial_dims: int, stride: int) -> nn.Module:
    """The paper's downsampling of a layer run at stride 1: at stride 2, a 3-wide average pool
    with stride 2 and padding 1 (zeros counted); at stride 1, nothing."""
    return _AVG_POOL[spatial_dims](3, 2, 1) if stride == 2 else nn.Identity()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the layers mix in: float16 and bfloat16 become float32, float64 stays.

    Long sums (over positions, windows, tiles) overflow float16 and lose bfloat16 precision.
    """
    return torch.promote_types(dtype, torch.float32)


def smallest_normal(dtype: torch.dtype) -> float:
    """``torch.finfo(dtype).tiny`` for the dtypes :func:`compute_dtype` gives, float32 and
    float64: TorchScript has no ``torch.finfo``."""
    return 2.0**-1022 if dtype == torch.float64 else 2.0**-126


def autocast_device_type(device: torch.device) -> str:
    """The ``torch.autocast`` device type for tensors on ``device``: the meta device has no
    autocast of its own (the pre-launch memory estimate runs the model there), and turning the
    CPU's off there changes nothing."""
    return "cpu" if device.type == "meta" else device.type


def constructor_defaults(cls: type) -> Dict[str, object]:
    """The keyword defaults of ``cls(...)``: a layer's signature is the one home of its standard
    sizes (the mixers, the configs and the benchmark read them here)."""
    return {
        name: parameter.default
        for name, parameter in inspect.signature(cls).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
