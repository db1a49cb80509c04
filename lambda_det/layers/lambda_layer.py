"""The lambda layer (LambdaNetworks, Bello, ICLR 2021): global, local (lambda convolution), masked.

Notation (paper Table 1): n query positions, m context positions (here the context is the input
itself, so m = n), k query/key depth, v value depth, u intra-depth, h heads, d = h * v outputs.

For an input X (d_in channels at each of n positions)::

    Q = BN(X W_Q)           (n, h, k)     1x1 projections, no bias; no BN on the keys
    K = X W_K               (m, k, u)
    V = BN(X W_V)           (m, v, u)
    K_bar = softmax of K over the m context positions (for each k and u)
    content lambda     lambda_c   = sum_{m,u} K_bar[m] V[m]^T              (k, v), one for all n
    position lambdas   lambda_p_n = sum_{m,u} E[n,m] V[m]^T                (k, v), one per query
    output             y[n, h]    = (lambda_c + lambda_p_n)^T Q[n, h]       (v,), heads concatenated

``E[n, m] = R[pos(m) - pos(n)]`` holds relative position embeddings (k x u per offset), so the
position term is translation equivariant. There is no 1/sqrt(k) scale and no bias anywhere.

Context:

* ``scope=r`` (odd): local context, the lambda convolution. ``E[n, m] = 0`` beyond r // 2 along an
  axis; the position lambdas are a cross-correlation of V with the r x r kernel R (zero padding,
  no bias). The content lambda still uses the whole input, as in the paper.
* ``scope=None``: global context. R has one embedding per offset up to ``max_size - 1`` per axis,
  so any H, W up to ``max_size`` works; a larger input is an error, not a silent truncation.
* ``context_mask`` (paper Fig. 6): query n only sees the context positions m where
  ``mask[n, m]`` is true. Keys are normalised within each query's context, so each query has its
  own content lambda. The mask is shared by the batch (e.g. causal masking of a sequence).

Implementations (``impl``), with identical parameters and state_dict keys:

* ``"einsum"``: materialises E (k, u, n, m), the paper's einsum form. Time O(b n m k v).
* ``"conv"``: the position lambdas as one ``conv{1,2}d`` over V with R as its kernel, cropped to
  the offsets the input can have. Time O(b n r^2 k v), memory O(b n k v).
* ``"auto"``: ``"einsum"`` up to ``EINSUM_MAX_POSITIONS`` = 852 positions (where the paper switches,
  Sec. 5.1), ``"conv"`` above.

Numerics: the projections follow the surrounding autocast policy, but the key softmax, the lambdas
and the outputs are computed in float32 (large sums over m and r^2 overflow fp16 and lose bf16
precision); the result is returned in the input's dtype.
"""
import math
import warnings
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from lambda_det.layers.position_embedding import RelativePositionEmbedding

__all__ = ["LambdaLayer", "IMPLEMENTATIONS", "EINSUM_MAX_POSITIONS"]

IMPLEMENTATIONS = ("einsum", "conv")
EINSUM_MAX_POSITIONS = 852

_CONV = {1: nn.Conv1d, 2: nn.Conv2d}
_BATCH_NORM = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d}
_AVG_POOL = {1: nn.AvgPool1d, 2: nn.AvgPool2d}
_CONV_FUNCTION = {1: F.conv1d, 2: F.conv2d}


class LambdaLayer(nn.Module):
    """Multi-query lambda layer for (B, C, H, W) maps, or (B, C, L) sequences with spatial_dims=1.

    Args:
        in_channels: input channels d_in.
        out_channels: output channels d = heads * v (default: in_channels).
        heads: number of queries h per position.
        dim_k: query/key depth k.
        dim_u: intra-depth u.
        scope: odd size r of the local context (lambda convolution), or None for global context.
        stride: 1, or 2 for the paper's downsampling (the layer at stride 1, then 3x3 average
            pooling with stride 2 and padding 1).
        impl: "auto", "einsum" or "conv" (see the module docstring).
        position_embedding: a :class:`RelativePositionEmbedding` to share with other layers
            (paper Table 4). Its dim_k, dim_u, spatial_dims and, for a local scope, its radius
            (scope // 2) must match this layer. Default: a new one of its own.
        max_size: global context only: the largest H (or W, or L) the embeddings cover.
        spatial_dims: 2 for (B, C, H, W) maps, 1 for (B, C, L) sequences.
        norm_layer: builds the norm on queries and values from a channel count (default
            BatchNorm), e.g. detectron2's ``lambda c: get_norm("SyncBN", c)``.

    Init (paper F.2): W_Q ~ N(0, (k * d_in)^-1/2), W_K and W_V ~ N(0, d_in^-1/2) (fan-in), R ~ N(0, 1).
    A model that runs its own init over all modules should call :meth:`reset_parameters` after it.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: Optional[int] = None,
        *,
        heads: int = 4,
        dim_k: int = 16,
        dim_u: int = 1,
        scope: Optional[int] = 23,
        stride: int = 1,
        impl: str = "auto",
        position_embedding: Optional[RelativePositionEmbedding] = None,
        max_size: int = 64,
        spatial_dims: int = 2,
        norm_layer: Optional[Callable[[int], nn.Module]] = None,
    ):
        super().__init__()
        out_channels = in_channels if out_channels is None else out_channels
        for name, value in (("in_channels", in_channels), ("out_channels", out_channels),
                            ("heads", heads), ("dim_k", dim_k), ("dim_u", dim_u),
                            ("max_size", max_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if out_channels % heads:
            raise ValueError(
                f"out_channels={out_channels} is not divisible by heads={heads}: each head "
                f"outputs out_channels / heads value channels")
        if scope is not None and (not isinstance(scope, int) or scope < 1 or scope % 2 == 0):
            raise ValueError(f"scope must be an odd integer >= 1 (or None for global context), "
                             f"got {scope!r}")
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride!r}")
        if impl != "auto" and impl not in IMPLEMENTATIONS:
            raise ValueError(f"impl must be 'auto' or one of {IMPLEMENTATIONS}, got {impl!r}")
        if spatial_dims not in (1, 2):
            raise ValueError(f"spatial_dims must be 1 or 2, got {spatial_dims!r}")

        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.dim_k = dim_k
        self.dim_u = dim_u
        self.dim_v = out_channels // heads
        self.scope = scope
        self.stride = stride
        self.impl = impl
        self.spatial_dims = spatial_dims

        conv = _CONV[spatial_dims]
        norm_layer = norm_layer or _BATCH_NORM[spatial_dims]
        self.to_queries = conv(in_channels, dim_k * heads, 1, bias=False)
        self.query_norm = norm_layer(dim_k * heads)
        self.to_keys = conv(in_channels, dim_k * dim_u, 1, bias=False)
        self.to_values = conv(in_channels, self.dim_v * dim_u, 1, bias=False)
        self.value_norm = norm_layer(self.dim_v * dim_u)

        radius = max_size - 1 if scope is None else scope // 2
        if position_embedding is None:
            position_embedding = RelativePositionEmbedding(dim_k, dim_u, radius, spatial_dims)
        else:
            self._check_shared_embedding(position_embedding)
        self.position_embedding = position_embedding
        self.pool = _AVG_POOL[spatial_dims](3, 2, 1) if stride == 2 else nn.Identity()
        self.reset_parameters()

    def _check_shared_embedding(self, embedding: RelativePositionEmbedding) -> None:
        if not isinstance(embedding, RelativePositionEmbedding):
            raise TypeError(f"position_embedding must be a RelativePositionEmbedding, "
                            f"got {type(embedding).__name__}")
        expected = {"dim_k": self.dim_k, "dim_u": self.dim_u, "spatial_dims": self.spatial_dims}
        if self.scope is not None:
            expected["radius"] = self.scope // 2
        for name, value in expected.items():
            if getattr(embedding, name) != value:
                raise ValueError(
                    f"shared position_embedding has {name}={getattr(embedding, name)}, but this "
                    f"layer needs {name}={value} (dim_k={self.dim_k}, dim_u={self.dim_u}, "
                    f"scope={self.scope})")

    def reset_parameters(self) -> None:
        """The paper's init (F.2); BN starts as identity (gamma 1, beta 0)."""
        nn.init.normal_(self.to_queries.weight, std=(self.dim_k * self.in_channels) ** -0.5)
        nn.init.normal_(self.to_keys.weight, std=self.in_channels ** -0.5)
        nn.init.normal_(self.to_values.weight, std=self.in_channels ** -0.5)
        self.position_embedding.reset_parameters()

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, heads={self.heads}, dim_k={self.dim_k}, "
                f"dim_u={self.dim_u}, scope={self.scope}, stride={self.stride}, impl={self.impl!r}")

    def resolve_impl(self, num_positions: int) -> str:
        """The implementation that ``impl`` stands for at this many positions."""
        if self.impl != "auto":
            return self.impl
        return "einsum" if num_positions <= EINSUM_MAX_POSITIONS else "conv"

    def forward(self, x: torch.Tensor, context_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Apply the layer.

        Args:
            x: (B, in_channels, H, W), or (B, in_channels, L) with spatial_dims=1.
            context_mask: optional (n, n) boolean tensor, n = H * W (row-major) or L;
                ``context_mask[n, m]`` says whether query n sees context position m. Computed
                with the masked einsum form whatever ``impl`` is.

        Returns:
            (B, out_channels, H, W) (halved, rounding up, when stride=2), in x's dtype.
        """
        spatial = self._check_input(x)
        batch, num_positions = x.shape[0], math.prod(spatial)
        queries = self.query_norm(self.to_queries(x))
        keys = self.to_keys(x)
        values = self.value_norm(self.to_values(x))
        with torch.autocast(device_type=x.device.type, enabled=False):
            dtype = torch.promote_types(x.dtype, torch.float32)  # fp16/bf16 -> fp32, fp64 stays
            queries = queries.to(dtype).reshape(batch, self.heads, self.dim_k, num_positions)  # b h k n
            keys = keys.to(dtype).reshape(batch, self.dim_k, self.dim_u, num_positions)  # b k u m
            values = values.to(dtype).reshape(batch, self.dim_v, self.dim_u, num_positions)  # b v u m
            if context_mask is not None:
                output = self._masked_output(queries, keys, values, spatial, context_mask)
            else:
                normalized_keys = keys.softmax(dim=-1)  # b k u m
                content_lambda = torch.einsum("bkum,bvum->bkv", normalized_keys, values)
                output = torch.einsum("bhkn,bkv->bhvn", queries, content_lambda)
                if self.resolve_impl(num_positions) == "einsum":
                    output = output + self._position_output_einsum(queries, values, spatial)
                else:
                    output = output + self._position_output_conv(queries, values, spatial)
        output = output.reshape(batch, self.out_channels, *spatial).to(x.dtype)  # b (h v) ...
        return self.pool(output)

    def _check_input(self, x: torch.Tensor) -> Tuple[int, ...]:
        if torch.jit.is_tracing():
            # A trace is specialised to its example's size (the embeddings and radii depend on
            # it), so take the sizes as constants, quietly.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                return tuple(int(size) for size in x.shape[2:])
        if x.dim() != 2 + self.spatial_dims:
            layout = "(B, C, H, W)" if self.spatial_dims == 2 else "(B, C, L)"
            raise ValueError(f"LambdaLayer(spatial_dims={self.spatial_dims}) expects a {layout} "
                             f"tensor, got shape {tuple(x.shape)}")
        if x.shape[1] != self.in_channels:
            raise ValueError(f"LambdaLayer expects {self.in_channels} input channels, got "
                             f"{x.shape[1]} (input shape {tuple(x.shape)})")
        spatial = tuple(int(size) for size in x.shape[2:])
        if self.scope is None and max(spatial) - 1 > self.position_embedding.radius:
            raise ValueError(
                f"global LambdaLayer: input size {spatial} exceeds the "
                f"{self.position_embedding.radius + 1} positions per axis its relative "
                f"embeddings cover; build it with a larger max_size, or use a local scope")
        return spatial

    def _context_radii(self, spatial: Tuple[int, ...]) -> Tuple[int, ...]:
        """Per axis, the largest offset that has an embedding and can occur in this input."""
        limit = self.position_embedding.radius if self.scope is None else self.scope // 2
        return tuple(min(limit, size - 1) for size in spatial)

    def relative_embeddings(self, spatial: Tuple[int, ...], device: torch.device) -> torch.Tensor:
        """E as a dense (k, u, n, m) tensor: R[pos(m) - pos(n)], zero beyond the context radii."""
        grids = torch.meshgrid(*[torch.arange(size, device=device) for size in spatial],
                               indexing="ij")
        positions = torch.stack([grid.reshape(-1) for grid in grids], dim=-1)  # n D
        offsets = positions[None, :, :] - positions[:, None, :]  # n m D, context minus query
        in_context = torch.ones(offsets.shape[:2], dtype=torch.bool, device=device)  # n m
        for axis, radius in enumerate(self._context_radii(spatial)):
            in_context &= offsets[..., axis].abs() <= radius
        table = self.position_embedding.weight
        index = (offsets + self.position_embedding.radius).clamp(0, table.shape[-1] - 1)
        embeddings = table[(slice(None), slice(None)) + tuple(index.unbind(-1))]  # k u n m
        return embeddings * in_context.to(embeddings.dtype)

    def _position_output_einsum(self, queries, values, spatial):
        embeddings = self.relative_embeddings(spatial, values.device).to(values.dtype)  # k u n m
        position_lambdas = torch.einsum("kunm,bvum->bnkv", embeddings, values)
        return torch.einsum("bhkn,bnkv->bhvn", queries, position_lambdas)

    def _position_output_conv(self, queries, values, spatial):
        batch, num_positions = values.shape[0], values.shape[-1]
        radii = self._context_radii(spatial)
        kernel = self.position_embedding.window(radii).to(values.dtype)  # k u (2r+1)...
        # Every (b, v) slice of V is an image with u channels; R maps it to k channels.
        values_as_images = values.reshape(batch * self.dim_v, self.dim_u, *spatial)
        position_lambdas = _CONV_FUNCTION[self.spatial_dims](
            values_as_images, kernel, padding=radii)  # (b v) k ...
        position_lambdas = position_lambdas.reshape(batch, self.dim_v, self.dim_k, num_positions)
        return torch.einsum("bhkn,bvkn->bhvn", queries, position_lambdas)

    def _masked_output(self, queries, keys, values, spatial, context_mask):
        num_positions = values.shape[-1]
        if tuple(context_mask.shape) != (num_positions, num_positions):
            raise ValueError(f"context_mask must have shape ({num_positions}, {num_positions}) "
                             f"for {spatial} positions, got {tuple(context_mask.shape)}")
        mask = context_mask.to(device=values.device, dtype=torch.bool)
        if not bool(mask.any(dim=1).all()):
            empty = int((~mask.any(dim=1)).nonzero()[0])
            raise ValueError(f"context_mask row {empty} is empty: every query needs at least one "
                             f"context position")
        # Softmax over each query's own context: b n k u m.
        logits = keys[:, None].masked_fill(~mask[None, :, None, None, :], float("-inf"))
        content_lambdas = torch.einsum("bnkum,bvum->bnkv", logits.softmax(dim=-1), values)
        embeddings = self.relative_embeddings(spatial, values.device).to(values.dtype) * mask
        position_lambdas = torch.einsum("kunm,bvum->bnkv", embeddings, values)
        return torch.einsum("bhkn,bnkv->bhvn", queries, content_lambdas + position_lambdas)
