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
* ``"tiled"``: :mod:`lambda_det.layers.lambda_conv`. The queries meet R first
  (y_pos[n] = sum_delta (q[n] . R[delta]) V[n + delta]), tile by tile as two GEMMs against each
  tile's halo of context: time O(b n h (k + v) C) with C = u (t + 2 rho)^2 halo entries per tile
  (t = 4 on 2-D maps: C = 676 = 1.28 r^2 at r = 23), no (b, n, k, v) lambdas, and only its
  inputs kept for backward. Works for local and global context, 1-D and 2-D.
  At stride 2 the tiles also do the average pool: the 9 stride-1 queries a pooled output
  averages act as one query of depth 9 k, so the large output GEMM runs once per pooled output
  (:func:`~lambda_det.layers.lambda_conv.tiled_position_output`).
* ``"auto"``: ``"einsum"`` while n <= min(EINSUM_MAX_POSITIONS = 852, C / 3), ``"tiled"`` above
  (the timings behind this rule: docs/benchmarks.md, "Choosing the implementation").
  n <= C / 3 is where the einsum's n x n work stops being cheaper than the tiles' n x C (2-D
  local: up to 15x15). With global context C grows like 4n, so only the cap binds (up to 29x29;
  both cost O(n^2) there, and E needs k n^2 memory beyond). "conv" is never the fastest on the
  CPU. On a GPU every form is bound by kernel launches at these sizes, where cuDNN's single conv
  has the fewest: "conv" for sequences and up to ``CONV_MAX_POSITIONS_CUDA`` = 400 positions,
  the rule above beyond. (cuDNN convolutions run in TF32 unless
  ``torch.backends.cudnn.allow_tf32`` is off.) Under ``torch.jit.trace`` (export), "conv":
  its trace, like an "einsum" one, runs at any input size; a "tiled" trace holds for the
  example's size only.

Under ``torch.compile`` the choice is made in Python from the traced sizes (one graph, fixed for
those sizes); ``torch.fx`` records the layer as one call; TorchScript runs every impl as "conv"
(it cannot compile "tiled"), without ``context_mask``.

Numerics: the projections follow the surrounding autocast policy, but the key softmax, the lambdas
and the outputs are computed in float32 (large sums over m and r^2 overflow fp16 and lose bf16
precision); the result is returned in the input's dtype.

TorchScript: a scripted ``torch.autocast(..., enabled=False)`` block leaves the caller's autocast
on, so a scripted layer computes its lambdas and outputs under the caller's autocast policy
rather than in float32 (within bfloat16 rounding of eager's outputs under CPU bfloat16
autocast): run scripted layers without autocast for eager's numerics.
"""

import math
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from lambda_det.compat import torch_features
from lambda_det.layers._checks import (
    check_choice,
    check_int,
    check_layer_input,
    check_odd,
    shape_text,
)
from lambda_det.layers._common import (
    BATCH_NORM,
    CONV,
    autocast_device_type,
    compute_dtype,
    strided_pool,
)
from lambda_det.layers._tracing import fx_leaf_call
from lambda_det.layers.lambda_conv import (
    TiledTuning,
    pooled_size,
    tiled_halo_entries,
    tiled_position_output,
)
from lambda_det.layers.position_embedding import RelativePositionEmbedding

__all__ = ["LambdaLayer", "IMPLEMENTATIONS", "EINSUM_MAX_POSITIONS", "CONV_MAX_POSITIONS_CUDA"]

IMPLEMENTATIONS = ("einsum", "conv", "tiled")
EINSUM_MAX_POSITIONS = 852
CONV_MAX_POSITIONS_CUDA = 400


def _norm_or_identity(norm_layer: Callable[[int], Optional[nn.Module]], channels: int) -> nn.Module:
    norm = norm_layer(channels)
    return nn.Identity() if norm is None else norm


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
        impl: "auto", "einsum", "conv" or "tiled" (see the module docstring). "tiled" (so
            "auto" on most inputs) is differentiable once: no double backward.
        position_embedding: a :class:`RelativePositionEmbedding` to share with other layers
            (paper Table 4). Its dim_k, dim_u, spatial_dims and, for a local scope, its radius
            (scope // 2) must match this layer. Default: a new one of its own.
        max_size: global context only: the largest H (or W, or L) the embeddings cover.
        spatial_dims: 2 for (B, C, H, W) maps, 1 for (B, C, L) sequences.
        norm_layer: builds the norm on queries and values from a channel count (default
            BatchNorm), e.g. detectron2's ``lambda c: get_norm("SyncBN", c)``; one that returns
            None means no norm (detectron2's ``get_norm("", c)``).
        tuning: how impl "tiled" cuts its work (tiles, chunks; default: by device), see
            :class:`~lambda_det.layers.lambda_conv.TiledTuning`. The stride-1 tile also sets the
            halo size C of the "auto" rule.

    Init (paper F.2), normal with standard deviations: W_Q (k * d_in)^-1/2, W_K and W_V d_in^-1/2
    (fan-in), R 1.
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
        tuning: TiledTuning = TiledTuning(),
    ):
        super().__init__()
        out_channels = in_channels if out_channels is None else out_channels
        for name, value in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("heads", heads),
            ("dim_k", dim_k),
            ("dim_u", dim_u),
            ("max_size", max_size),
        ):
            check_int(name, value, 1)
        if out_channels % heads:
            raise ValueError(
                f"out_channels={out_channels} is not divisible by heads={heads}: each head "
                f"outputs out_channels / heads value channels"
            )
        if scope is not None:
            check_odd("scope", scope, " (or None for global context)")
        check_choice("stride", stride, (1, 2))
        if impl != "auto" and impl not in IMPLEMENTATIONS:
            raise ValueError(f"impl must be 'auto' or one of {IMPLEMENTATIONS}, got {impl!r}")
        check_choice("spatial_dims", spatial_dims, (1, 2))

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
        self.max_size = max_size
        self.tuning = tuning

        conv = CONV[spatial_dims]
        norm_layer = norm_layer or BATCH_NORM[spatial_dims]
        self.to_queries = conv(in_channels, dim_k * heads, 1, bias=False)
        self.query_norm = _norm_or_identity(norm_layer, dim_k * heads)
        self.to_keys = conv(in_channels, dim_k * dim_u, 1, bias=False)
        self.to_values = conv(in_channels, self.dim_v * dim_u, 1, bias=False)
        self.value_norm = _norm_or_identity(norm_layer, self.dim_v * dim_u)

        radius = max_size - 1 if scope is None else scope // 2
        if position_embedding is None:
            position_embedding = RelativePositionEmbedding(dim_k, dim_u, radius, spatial_dims)
        else:
            self._check_shared_embedding(position_embedding)
        self.position_embedding = position_embedding
        self.pool = strided_pool(spatial_dims, stride)
        self.reset_parameters()

    def _check_shared_embedding(self, embedding: RelativePositionEmbedding) -> None:
        if not isinstance(embedding, RelativePositionEmbedding):
            raise TypeError(
                f"position_embedding must be a RelativePositionEmbedding, "
                f"got {type(embedding).__name__}"
            )
        expected = {"dim_k": self.dim_k, "dim_u": self.dim_u, "spatial_dims": self.spatial_dims}
        if self.scope is not None:
            expected["radius"] = self.scope // 2
        for name, value in expected.items():
            if getattr(embedding, name) != value:
                raise ValueError(
                    f"shared position_embedding has {name}={getattr(embedding, name)}, but this "
                    f"layer needs {name}={value} (dim_k={self.dim_k}, dim_u={self.dim_u}, "
                    f"scope={self.scope})"
                )
        if self.scope is None and embedding.radius < self.max_size - 1:
            raise ValueError(
                f"shared position_embedding has radius={embedding.radius}, but this global layer "
                f"with max_size={self.max_size} needs offsets up to {self.max_size - 1}: pass "
                f"max_size <= {embedding.radius + 1}, or share a larger table"
            )

    def reset_parameters(self) -> None:
        """The paper's init (F.2); BN starts as identity (gamma 1, beta 0)."""
        nn.init.normal_(self.to_queries.weight, std=(self.dim_k * self.in_channels) ** -0.5)
        nn.init.normal_(self.to_keys.weight, std=self.in_channels**-0.5)
        nn.init.normal_(self.to_values.weight, std=self.in_channels**-0.5)
        self.position_embedding.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, dim_k={self.dim_k}, "
            f"dim_u={self.dim_u}, scope={self.scope}, stride={self.stride}, impl={self.impl!r}"
        )

    def resolve_impl(self, spatial: Sequence[int], device_type: str = "cpu") -> str:
        """The implementation that ``impl`` stands for on inputs of this spatial size.

        Args:
            spatial: (H, W), or (L,) for sequences.
            device_type: where it runs ("cpu", "cuda", ...).
        """
        if self.impl != "auto":
            return self.impl
        if torch.jit.is_tracing() or torch_features.is_exporting():
            # Shape-generic (see forward): a trace, or a torch.export with symbolic sizes, runs
            # at any input size.
            return "conv"
        spatial = tuple(spatial)
        if device_type == "cuda" and (
            self.spatial_dims == 1 or math.prod(spatial) <= CONV_MAX_POSITIONS_CUDA
        ):
            return "conv"
        halo = tiled_halo_entries(
            spatial, self._context_radii(spatial), self.dim_u, self.tuning.tile
        )
        return "einsum" if math.prod(spatial) <= min(EINSUM_MAX_POSITIONS, halo / 3) else "tiled"

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
        if torch.jit.is_scripting():
            return self._forward_scripted(x, context_mask)
        if isinstance(x, torch.fx.Proxy):
            # Its windows, tiles and implementation follow from the input's sizes, which a
            # symbolic trace does not know.
            return fx_leaf_call(self, x, context_mask)
        return self._forward(x, context_mask)

    def _forward(self, x: torch.Tensor, context_mask: Optional[torch.Tensor]) -> torch.Tensor:
        spatial = tuple(self._check_input(x))
        impl = self.resolve_impl(spatial, x.device.type)
        if torch.jit.is_tracing() and impl != "tiled":
            # Sizes as graph values (0-d tensors) rather than constants: with the full-radius
            # windows of _context_radii, an "einsum" or "conv" trace holds for any input size.
            spatial = tuple(x.shape[2:])
        batch = x.shape[0]
        project = self._project_traced if torch.jit.is_tracing() else self._project
        queries, keys, values = project(x)
        with torch.autocast(device_type=autocast_device_type(x.device), enabled=False):
            dtype = compute_dtype(x.dtype)
            # flatten, then unflatten: the same views as reshape to (b, ., ., n), without the
            # divisibility guards that reshape puts on symbolic sizes under torch.export.
            queries = queries.to(dtype).flatten(2).unflatten(1, (self.heads, self.dim_k))  # b h k n
            keys = keys.to(dtype).flatten(2).unflatten(1, (self.dim_k, self.dim_u))  # b k u m
            values = values.to(dtype).flatten(2).unflatten(1, (self.dim_v, self.dim_u))  # b v u m
            if context_mask is not None:
                output = self._masked_output(queries, keys, values, spatial, context_mask)
            elif impl == "tiled" and self.stride == 2:
                output = self._pooled_output_tiled(queries, keys, values, spatial)
                pooled = [pooled_size(size) for size in spatial]
                return output.reshape(batch, self.out_channels, *pooled).to(x.dtype)
            else:
                position_output = {
                    "einsum": self._position_output_einsum,
                    "conv": self._position_output_conv,
                    "tiled": self._position_output_tiled,
                }[impl]
                output = self._add_content_output(
                    position_output(queries, values, spatial), queries, keys, values
                )
        output = output.reshape(batch, self.out_channels, *spatial).to(x.dtype)  # b (h v) ...
        if torch_features.is_exporting():
            # The einsums leave a layout that depends on the sizes (channels last at batch 1);
            # the next ops' layout checks on it are guards that named Dim ranges reject.
            output = output.clone(memory_format=torch.contiguous_format)
        return self.pool(output)

    def _forward_scripted(
        self, x: torch.Tensor, context_mask: Optional[torch.Tensor]
    ) -> torch.Tensor:
        """:meth:`forward` as TorchScript compiles it: every ``impl`` runs the "conv" form, and
        there is no ``context_mask``.

        Decision: TorchScript cannot compile the "tiled" form (an autograd Function whose tiles
        are cut in Python); "conv" computes the same function (up to rounding) in the least
        memory of the other two. No autocast switch: TorchScript runs none (module docstring).
        """
        if context_mask is not None:
            raise ValueError(
                "LambdaLayer takes a context_mask in eager mode only, not in TorchScript"
            )
        spatial = self._check_input(x)
        batch, num_positions = x.shape[0], 1
        for size in spatial:
            num_positions *= size
        queries, keys, values = self._project(x)
        dtype = compute_dtype(x.dtype)
        queries = queries.to(dtype).reshape(batch, self.heads, self.dim_k, num_positions)
        keys = keys.to(dtype).reshape(batch, self.dim_k, self.dim_u, num_positions)
        values = values.to(dtype).reshape(batch, self.dim_v, self.dim_u, num_positions)
        output = self._add_content_output(
            self._position_output_conv(queries, values, spatial), queries, keys, values
        )
        return self.pool(output.reshape([batch, self.out_channels] + spatial).to(x.dtype))

    def _project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """BN(X W_Q), X W_K, BN(X W_V) as one 1x1 convolution.

        One GEMM, and in backward one input gradient instead of three summed; the weights stay
        three modules, so state_dict keys and init are per projection.
        """
        weight = torch.cat([self.to_queries.weight, self.to_keys.weight, self.to_values.weight])
        projected = self._conv(x, weight, [0] * self.spatial_dims)
        sizes = [
            self.to_queries.out_channels,
            self.to_keys.out_channels,
            self.to_values.out_channels,
        ]
        queries, keys, values = projected.split(sizes, dim=1)
        # torch's CPU batch norm backward errs at batch 1 on the strided gradient the einsums
        # hand it (torch_features.contiguous_gradient_at_batch_1)
        values = torch_features.contiguous_gradient_at_batch_1(self.value_norm(values))
        return self.query_norm(queries), keys, values

    def _project_traced(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_project` under torch.jit.trace: each projection runs as its own module, so
        that what reads a trace (fvcore's FLOP count, which credits ops to the modules that run
        them) sees each one run. The same numbers: a 1x1 conv's output channels do not depend
        on the others."""
        return (
            self.query_norm(self.to_queries(x)),
            self.to_keys(x),
            self.value_norm(self.to_values(x)),
        )

    def _check_input(self, x: torch.Tensor) -> List[int]:
        """The spatial sizes of a valid input (TorchScript compiles it)."""
        spatial = check_layer_input("LambdaLayer", x, self.spatial_dims, self.in_channels)
        if self.scope is None and max(spatial) - 1 > self.position_embedding.radius:
            raise ValueError(
                f"global LambdaLayer: input size {shape_text(spatial)} exceeds the "
                f"{self.position_embedding.radius + 1} positions per axis its relative "
                f"embeddings cover; build it with a larger max_size, or use a local scope"
            )
        return spatial

    def _conv(self, x: torch.Tensor, weight: torch.Tensor, padding: List[int]) -> torch.Tensor:
        """conv1d or conv2d by spatial_dims, without bias."""
        if self.spatial_dims == 1:
            return F.conv1d(x, weight, padding=padding)
        return F.conv2d(x, weight, padding=padding)

    def _context_radii(self, spatial: List[int]) -> List[int]:
        """Per axis, the largest offset that has an embedding and can occur in this input."""
        limit = self.position_embedding.radius if self.scope is None else self.scope // 2
        if not torch.jit.is_scripting():  # TorchScript compiles none of this block
            if torch_features.is_exporting() or any(
                isinstance(size, torch.Tensor) for size in spatial
            ):
                # Sizes traced as graph values (forward, under torch.jit.trace) or symbolic
                # (under torch.export): the same outputs (offsets beyond an axis's size only
                # meet zero padding or no position at all), without freezing the example's
                # sizes into the trace or guarding on them.
                return [limit] * len(spatial)
        return [min(limit, size - 1) for size in spatial]

    def relative_embeddings(self, spatial: Tuple[int, ...], device: torch.device) -> torch.Tensor:
        """E as a dense (k, u, n, m) tensor: R[pos(m) - pos(n)], zero beyond the context radii."""
        grids = torch.meshgrid(
            *[torch.arange(size, device=device) for size in spatial], indexing="ij"
        )
        positions = torch.stack([grid.reshape(-1) for grid in grids], dim=-1)  # n D
        offsets = positions[None, :, :] - positions[:, None, :]  # n m D, context minus query
        in_context = torch.ones(offsets.shape[:2], dtype=torch.bool, device=device)  # n m
        for axis, radius in enumerate(self._context_radii(spatial)):
            # Not in place: torch's ONNX exporter has no symbolic for an in-place and (&=).
            in_context = in_context & (offsets[..., axis].abs() <= radius)
        table = self.position_embedding.weight
        index = (offsets + self.position_embedding.radius).clamp(0, table.shape[-1] - 1)
        embeddings = table[(slice(None), slice(None)) + tuple(index.unbind(-1))]  # k u n m
        return embeddings * in_context.to(embeddings.dtype)

    @staticmethod
    def _add_content_output(
        position_output: torch.Tensor,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        """position_output + lambda_c^T q for every query (keys softmax-normalised over all m).

        Added in place into the position output, a fresh tensor, by one batched GEMM: at the
        detection sizes a separate (b, h, v, n) result and sum cost a few percent of the layer.
        (TorchScript adds out of place: see the comment below.)

        Args:
            position_output: (b, h, v, n); queries: (b, h, k, n); keys: (b, k, u, m);
                values: (b, v, u, m).
        """
        batch, heads, dim_k, num_positions = queries.shape
        dim_v = values.shape[1]
        content_lambda = torch.einsum("bkum,bvum->bvk", keys.softmax(dim=-1), values)
        per_head = content_lambda[:, None].expand(batch, heads, dim_v, dim_k)  # b h v k
        per_head = per_head.reshape(-1, dim_v, dim_k)
        queries = queries.reshape(-1, dim_k, num_positions)
        output = position_output.reshape(-1, dim_v, num_positions)
        if torch.jit.is_scripting():
            # TorchScript keeps the caller's autocast on (module docstring): there the einsums
            # give bfloat16 next to float32 queries, which the in-place form rejects and the
            # out-of-place one (an autocast op) casts alike. Without autocast, the same bits.
            output = torch.baddbmm(output, per_head, queries)
        else:
            output = output.baddbmm_(per_head, queries)
        return output.view(position_output.shape)  # b h v n

    def _position_output_einsum(self, queries, values, spatial):
        embeddings = self.relative_embeddings(spatial, values.device).to(values.dtype)  # k u n m
        position_lambdas = torch.einsum("kunm,bvum->bnkv", embeddings, values)
        return torch.einsum("bhkn,bnkv->bhvn", queries, position_lambdas)

    def _position_output_conv(
        self, queries: torch.Tensor, values: torch.Tensor, spatial: List[int]
    ) -> torch.Tensor:
        batch, num_positions = values.shape[0], values.shape[-1]
        radii = self._context_radii(spatial)
        kernel = self.position_embedding.window(radii).to(values.dtype)  # k u (2r+1)...
        # Every (b, v) slice of V is an image with u channels; R maps it to k channels.
        values_as_images = values.reshape([batch * self.dim_v, self.dim_u] + list(spatial))
        position_lambdas = self._conv(values_as_images, kernel, radii)  # (b v) k ...
        position_lambdas = position_lambdas.reshape(batch, self.dim_v, self.dim_k, num_positions)
        return torch.einsum("bhkn,bvkn->bhvn", queries, position_lambdas)

    def _position_output_tiled(self, queries, values, spatial, stride=1):
        radii = self._context_radii(spatial)
        window = self.position_embedding.window(radii).to(values.dtype)  # k u (2r+1)...
        return tiled_position_output(
            queries, values, window, spatial, stride, self.tuning
        )  # b h v n (n pooled at stride 2)

    def _pooled_output_tiled(self, queries, keys, values, spatial):
        """The whole output of a strided layer, average pool included, for impl "tiled".

        The tiles pool as they go (see :func:`tiled_position_output`); the content term is
        linear in the queries, so pooling the queries is the same pool. (b, h, v, n_pooled).
        """
        batch, pooled = queries.shape[0], math.prod([pooled_size(size) for size in spatial])
        pooled_queries = self.pool(queries.reshape(batch, self.heads * self.dim_k, *spatial))
        return self._add_content_output(
            self._position_output_tiled(queries, values, spatial, stride=2),
            pooled_queries.reshape(batch, self.heads, self.dim_k, pooled),
            keys,
            values,
        )

    def _masked_output(self, queries, keys, values, spatial, context_mask):
        num_positions = values.shape[-1]
        if tuple(context_mask.shape) != (num_positions, num_positions):
            raise ValueError(
                f"context_mask must have shape ({num_positions}, {num_positions}) "
                f"for {spatial} positions, got {tuple(context_mask.shape)}"
            )
        mask = context_mask.to(device=values.device, dtype=torch.bool)
        if not bool(mask.any(dim=1).all()):
            empty = int((~mask.any(dim=1)).nonzero()[0])
            raise ValueError(
                f"context_mask row {empty} is empty: every query needs at least one "
                f"context position"
            )
        # Softmax over each query's own context: b n k u m.
        logits = keys[:, None].masked_fill(~mask[None, :, None, None, :], float("-inf"))
        content_lambdas = torch.einsum("bnkum,bvum->bnkv", logits.softmax(dim=-1), values)
        embeddings = self.relative_embeddings(spatial, values.device).to(values.dtype) * mask
        position_lambdas = torch.einsum("kunm,bvum->bnkv", embeddings, values)
        return torch.einsum("bhkn,bnkv->bhvn", queries, content_lambdas + position_lambdas)
