"""Argument and input checks the layers share: errors that name the bad value."""

from typing import List, Tuple

import torch

from lambda_det.layers._tracing import size_list


def check_int(name: str, value, minimum: int) -> None:
    """``value`` is an int (not a bool) >= minimum, or a ValueError naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_choice(name: str, value, choices: Tuple[int, ...]) -> None:
    """``value`` is one of the int ``choices`` (not a bool), or a ValueError naming it."""
    if isinstance(value, bool) or value not in choices:
        raise ValueError(f"{name} must be {' or '.join(map(str, choices))}, got {value!r}")


def shape_text(sizes: List[int]) -> str:
    """``sizes`` as Python prints a tuple, "(2, 3)" or "(9,)", also in TorchScript (which
    prints a list of sizes as "[2, 3]")."""
    text = ", ".join([str(size) for size in sizes])
    return f"({text},)" if len(sizes) == 1 else f"({text})"


def check_layer_input(
    layer: str, x: torch.Tensor, spatial_dims: int, in_channels: int
) -> List[int]:
    """The spatial sizes of a (B, C, H, W) or (B, C, L) input, as ints (TorchScript compiles it).

    Also while tracing: a trace is specialised to its example, so a wrong example must fail
    here rather than export a model that silently computes something else.
    """
    shape = size_list(x)
    if len(shape) != 2 + spatial_dims:
        layout = "(B, C, H, W)" if spatial_dims == 2 else "(B, C, L)"
        raise ValueError(
            f"{layer}(spatial_dims={spatial_dims}) expects a {layout} tensor, "
            f"got shape {shape_text(shape)}"
        )
    if shape[1] != in_channels:
        raise ValueError(
            f"{layer} expects {in_channels} input channels, got {shape[1]} "
            f"(input shape {shape_text(shape)})"
        )
    return shape[2:]


def check_odd(name: str, value, alternative: str = "") -> None:
    """``value`` is an odd int >= 1 (not a bool), or a ValueError naming it (and ``alternative``,
    e.g. " (or None for global context)")."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value % 2 == 0:
        raise ValueError(f"{name} must be an odd integer >= 1{alternative}, got {value!r}")
