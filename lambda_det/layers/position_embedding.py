"""Relative position embeddings for lambda layers (LambdaNetworks, Bello 2021, Sec. 3.2 and 4)."""

from typing import List

import torch
from torch import nn

from lambda_det.layers._checks import check_choice, check_int

__all__ = ["RelativePositionEmbedding"]


class RelativePositionEmbedding(nn.Module):
    """The table R of the paper: one ``dim_k x dim_u`` embedding per relative offset.

    ``weight[:, :, a, b]`` is the embedding of the offset ``(a - radius, b - radius)`` from a query
    position to a context position (``context = query + offset``), so the table is translation
    equivariant by construction and, read as a convolution kernel, it is exactly the lambda
    convolution's kernel. Offsets farther than ``radius`` have no embedding (they contribute zero).

    One instance can be passed to several :class:`~lambda_det.layers.LambdaLayer` s to share their
    position embeddings (paper Table 4: less memory, same accuracy).

    Args:
        dim_k: query/key depth k.
        dim_u: intra-depth u.
        radius: largest offset per spatial axis. A lambda convolution with scope r uses r // 2;
            a global lambda layer needs at least ``max(H, W) - 1``.
        spatial_dims: 2 for feature maps, 1 for sequences.
    """

    def __init__(self, dim_k: int, dim_u: int = 1, radius: int = 11, spatial_dims: int = 2):
        super().__init__()
        for name, value, minimum in (
            ("dim_k", dim_k, 1),
            ("dim_u", dim_u, 1),
            ("radius", radius, 0),
        ):
            check_int(name, value, minimum)
        check_choice("spatial_dims", spatial_dims, (1, 2))
        self.dim_k = dim_k
        self.dim_u = dim_u
        self.radius = radius
        self.spatial_dims = spatial_dims
        window = 2 * radius + 1
        self.weight = nn.Parameter(torch.empty(dim_k, dim_u, *([window] * spatial_dims)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Paper F.2: position embeddings ~ N(0, 1).
        nn.init.normal_(self.weight, mean=0.0, std=1.0)

    def window(self, radii: List[int]) -> torch.Tensor:
        """The central part of the table covering offsets up to ``radii`` (one per axis).

        Returns:
            Tensor of shape (k, u, 2 * radii[0] + 1, ...), a view of ``weight``.
        """
        window = self.weight
        for axis, radius in enumerate(radii):
            window = window.narrow(2 + axis, self.radius - radius, 2 * radius + 1)
        return window

    def extra_repr(self) -> str:
        return (
            f"dim_k={self.dim_k}, dim_u={self.dim_u}, radius={self.radius}, "
            f"spatial_dims={self.spatial_dims}"
        )
