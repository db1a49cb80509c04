"""Attention Free Transformer mixers (AFT, Zhai et al. 2021): AFT-full, -local, -simple and -conv.

For queries Q, keys K and values V (d channels at each of T positions) and pairwise position
biases w (T x T), AFT computes, elementwise in the channels::

    Y_t = sigmoid(Q_t) * sum_t' exp(K_t' + w[t, t']) * V_t' / sum_t' exp(K_t' + w[t, t'])

so each channel is its own "head" and no T x T attention map per channel is ever built: the
positions mix through one T x T matrix exp(w) shared by all channels (O(T^2 d) time, O(T^2 + T d)
memory), or through a convolution for AFT-conv (O(T s^2 d) time, O(T d) memory).

Variants (``s`` is the window size, ``T`` the number of positions):

* :class:`AFTFull`: w is learned for every pair, factorised as ``w[t, t'] = u[t] . v[t']`` with
  u, v of shape (P, position_dim) (paper Sec. 3.2). P covers ``max_size`` positions per axis; an
  input position (i, j) uses row ``i * max_size + j``, so a position keeps its embedding whatever
  the input size is. A larger input is an error, not a silent truncation.
* :class:`AFTLocal`: the same factorised w inside the window ``|t - t'| < s`` (per axis for maps,
  as in the paper) and 0 -- not -inf -- outside, so every position still sees the whole input.
  ``window_size >= T`` (``>= max(H, W)``) is AFT-full, ``window_size=0`` is AFT-simple.
* :class:`AFTSimple`: ``w = 0``: ``Y_t = sigmoid(Q_t) * sum_t' softmax_t'(K)[t'] * V_t'``.
* :class:`AFTConv`: per head i (K has one channel per head, Q and V ``hidden_dim / heads``),
  ``w[t, t'] = w_i[t' - t]`` inside an s x s window (s odd) and 0 outside, computed as::

      Y^i = sigmoid(Q^i) * (conv(e^K^i * V^i, e^w_i - 1) + sum e^K^i * V^i)
                         / (conv(e^K^i, e^w_i - 1) + sum e^K^i)

  ``conv`` is a cross-correlation with zero padding s // 2 (kernel entry [a, b] is the offset
  (a - s // 2, b - s // 2) from t to t'), ``sum`` runs over all positions. Any H, W works.
  w_i is reparameterised (paper Sec. 3.2) as ``gain_i * (w_i - mean(w_i)) / std(w_i) + shift_i``
  with gain and shift initialised to 0, so the layer starts as AFT-simple.

``causal=True`` (sequences only; AFT-full, -local, -simple) restricts the sums to ``t' <= t``.

Layout: (B, C, H, W) maps with positions in row-major order (t = i * W + j), or (B, C, L) sequences
with ``spatial_dims=1``. Q, K and V are 1x1 projections of the input, followed by a 1x1 output
projection (paper: Y then a linear layer); K has no bias, since a per-channel constant added to K
cancels out of the ratio.

Numerics. The projections follow the surrounding autocast policy; the mixing is computed in
float32 (float64 stays float64) with autocast disabled, and the result is returned in the input's
dtype. exp() is only taken of shifted quantities, and only of shifts constant over t', which
cancel exactly between numerator and denominator (they are detached: the output does not depend
on them, so neither does its gradient):

* keys: ``K - max_t' K`` per batch element and channel (per head for AFT-conv);
* biases: ``w[t, :] - max_t' w[t, :]`` per row (future positions excluded when causal);
* AFT-conv: shifting w inside ``e^w - 1`` would change the formula (``e^(w-m) - 1`` is not
  ``e^-m (e^w - 1)``). Instead, with ``m_i = max(0, max w_i)`` -- the 0 stands for the pairs
  outside the window -- the kernel is ``e^(w_i - m_i) - e^(-m_i)`` and the global sums are
  scaled by ``e^(-m_i)``: numerator and denominator are both exactly ``e^(-m_i)`` times the
  paper's, every weight lies in [-1, 1], and nothing overflows however large gain and shift grow.
  When the window covers the whole input (``s // 2 >= size - 1`` on every axis, e.g. a large
  window on a small feature map) there are no pairs outside it: the kernel is then
  ``e^(w_i - max w_i)`` and the global sums are dropped, which is the same formula without the
  cancellation of ``conv + sum`` (for w << 0 those two terms nearly cancel).

What remains, all far outside the usual range:

* a weight below e^-87 (fp32) underflows. With the shifts above, that needs the spread of K
  plus the spread of w over a row to exceed about 87; for AFT-conv the w shift is per head,
  not per row, so a border row whose visible biases all lie ~87 below the head's largest one is
  affected too (the reparameterisation bounds the spread of w_i by ``|gain_i| sqrt(2 s^D)``).
  The denominator is clamped at the smallest normal number, so such a row yields a finite
  (inaccurate) output, never 0 / 0;
* with causal=True the key shift is the max over the whole sequence, so later inputs reach
  earlier outputs at rounding level (and through the underflow above); mathematically they do not;
* AFT-conv with a window that covers part of the input and e^w_i << 1 inside it loses relative
  precision in ``conv + sum`` (inherent to the paper's form).

TorchScript: ``torch.jit.script`` compiles every variant (eager's outputs bit for bit). A scripted
``torch.autocast(..., enabled=False)`` block leaves the caller's autocast on, so a scripted mixer
mixes under the caller's autocast policy rather than in float32: run scripted mixers without
autocast.
"""

from typing import Final, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from lambda_det.layers._checks import (
    check_choice,
    check_int,
    check_layer_input,
    check_odd,
    shape_text,
)
from lambda_det.layers._common import (
    CONV,
    autocast_device_type,
    compute_dtype,
    smallest_normal,
    strided_pool,
)
from lambda_det.layers._tracing import size_list, static_sizes

__all__ = ["AFTFull", "AFTLocal", "AFTSimple", "AFTConv", "aft_mix", "aft_conv_mix"]


def aft_mix(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    position_bias: Optional[torch.Tensor] = None,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """The AFT operation with a dense position bias (AFT-full / -local), or none (AFT-simple).

    ``Y[b, c, t] = sigmoid(Q[b, c, t]) * sum_t' exp(K[b, c, t'] + w[t, t']) V[b, c, t']
    / sum_t' exp(K[b, c, t'] + w[t, t'])``, with t' <= t when causal. Stabilised by the
    per-channel max of K and the per-row max of w (see the module docstring).

    Args:
        queries: (B, C, T).
        keys: (B, C, T).
        values: (B, C, T).
        position_bias: (T, T), ``w[t, t']`` from output position t to context position t';
            None for w = 0.
        causal: only context positions t' <= t count.

    Returns:
        (B, C, T) in the queries' dtype, computed in float32 (float64 stays float64).
    """
    shape = static_sizes(values)
    for name, tensor in (("queries", queries), ("keys", keys)):
        if static_sizes(tensor) != shape:
            raise ValueError(
                f"{name} must have the values' shape (B, C, T) = {shape}, got "
                f"{static_sizes(tensor)}"
            )
    length = shape[-1]
    if position_bias is not None and static_sizes(position_bias) != (length, length):
        raise ValueError(
            f"position_bias must have shape ({length}, {length}) for {length} "
            f"positions, got {static_sizes(position_bias)}"
        )
    with torch.autocast(device_type=autocast_device_type(values.device), enabled=False):
        return _aft_mix(queries, keys, values, position_bias, causal)


def _aft_mix(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    position_bias: Optional[torch.Tensor],
    causal: bool,
) -> torch.Tensor:
    """:func:`aft_mix` without its checks and autocast switch, as the mixers (and TorchScript)
    run it."""
    dtype = compute_dtype(queries.dtype)
    keys = keys.to(dtype)  # b c t'
    values = values.to(dtype)  # b c t'
    key_weights = torch.exp(keys - keys.detach().amax(dim=-1, keepdim=True))  # b c t', <= 1
    weighted_values = key_weights * values  # b c t'
    if position_bias is None:
        if causal:
            numerator = weighted_values.cumsum(dim=-1)  # b c t
            denominator = key_weights.cumsum(dim=-1)  # b c t
        else:
            numerator = weighted_values.sum(dim=-1, keepdim=True)  # b c 1
            denominator = key_weights.sum(dim=-1, keepdim=True)  # b c 1
    else:
        bias = position_bias.to(dtype)  # t t'
        if causal:
            length = size_list(values)[-1]
            future = torch.ones(length, length, dtype=torch.bool, device=bias.device).triu(
                diagonal=1
            )  # t t'
            bias = bias.masked_fill(future, float("-inf"))  # t t'
        position_weights = torch.exp(
            bias - bias.detach().amax(dim=-1, keepdim=True)
        )  # t t', <= 1, 0 in the future
        numerator = weighted_values @ position_weights.T  # b c t
        denominator = key_weights @ position_weights.T  # b c t
    denominator = denominator.clamp_min(smallest_normal(dtype))
    output = torch.sigmoid(queries.to(dtype)) * numerator / denominator  # b c t
    return output.to(queries.dtype)


def aft_conv_mix(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, kernel: torch.Tensor
) -> torch.Tensor:
    """The AFT-conv operation: per head, the bias ``w_i[t' - t]`` in a window, 0 outside.

    ``Y^i = sigmoid(Q^i) * (conv(e^K^i V^i, e^w_i - 1) + sum e^K^i V^i)
    / (conv(e^K^i, e^w_i - 1) + sum e^K^i)``, computed exactly as the module docstring describes
    (keys shifted by their per-head max, kernel and global sums both scaled by ``e^(-m_i)``,
    ``m_i = max(0, max w_i)``; without the global sums when the window covers the input).

    Args:
        queries: (B, heads, C, *spatial), C channels per head.
        keys: (B, heads, *spatial), one channel per head.
        values: (B, heads, C, *spatial).
        kernel: (heads, s, ...) with one odd size s per spatial axis; entry [i, a, b] is the bias
            of head i from position (y, x) to position (y + a - s // 2, x + b - s // 2).

    Returns:
        (B, heads, C, *spatial) in the queries' dtype, computed in float32 (float64 stays float64).
    """
    batch, heads, channels, *spatial = static_sizes(values)
    if static_sizes(queries) != static_sizes(values):
        raise ValueError(
            f"queries must have the values' shape (B, heads, C, ...) = "
            f"{static_sizes(values)}, got {static_sizes(queries)}"
        )
    if static_sizes(keys) != (batch, heads, *spatial):
        raise ValueError(
            f"keys must have shape (B, heads, ...) = {(batch, heads, *spatial)} "
            f"(one channel per head), got {static_sizes(keys)}"
        )
    spatial_dims = len(spatial)
    heads_in_kernel, *window = static_sizes(kernel)
    if (
        kernel.dim() != 1 + spatial_dims
        or heads_in_kernel != heads
        or any(size % 2 == 0 for size in window)
    ):
        raise ValueError(
            f"kernel must have shape (heads={heads}, s, ...) with {spatial_dims} odd "
            f"window sizes, got {static_sizes(kernel)}"
        )
    with torch.autocast(device_type=autocast_device_type(values.device), enabled=False):
        return _aft_conv_mix(queries, keys, values, kernel)


def _aft_conv_mix(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, kernel: torch.Tensor
) -> torch.Tensor:
    """:func:`aft_conv_mix` without its checks and autocast switch, as AFT-conv (and
    TorchScript) runs it."""
    shape = size_list(values)
    batch, heads, channels, spatial = shape[0], shape[1], shape[2], shape[3:]
    window, spatial_dims = size_list(kernel)[1:], len(spatial)
    # Offsets beyond size - 1 reach no position of this input: crop them (cheaper, same result).
    radii = [min(size // 2, extent - 1) for size, extent in zip(window, spatial)]
    dtype = compute_dtype(queries.dtype)
    kernel = kernel.to(dtype)
    for axis, radius in enumerate(radii):
        kernel = kernel.narrow(1 + axis, window[axis] // 2 - radius, 2 * radius + 1)  # h (2r+1)...
    # Every position in every window: no bias-0 pairs, so no "+ sum" term to cancel against.
    window_covers_input = all([size // 2 >= extent - 1 for size, extent in zip(window, spatial)])
    shift = kernel.detach().flatten(1).amax(dim=1)  # h
    if not window_covers_input:
        shift = shift.clamp_min(0)  # >= the 0 bias of the pairs outside the window too
    shift = shift.reshape([heads] + [1] * spatial_dims)  # h 1...
    if window_covers_input:
        local_kernel = torch.exp(kernel - shift)  # h (2r+1)..., in (0, 1]
    else:
        local_kernel = torch.exp(kernel - shift) - torch.exp(-shift)  # h (2r+1)..., in (-1, 1]

    keys = keys.to(dtype)  # b h ...
    key_max = keys.detach().flatten(2).amax(dim=-1)  # b h
    key_weights = torch.exp(keys - key_max.reshape([batch, heads] + [1] * spatial_dims))
    key_weights = key_weights.unsqueeze(2)  # b h 1 ..., <= 1
    # Numerator and denominator channels go through the same per-head kernel in one conv.
    stacked = torch.cat([key_weights * values.to(dtype), key_weights], dim=2)  # b h (c+1) ...
    as_images = stacked.transpose(1, 2).reshape([batch * (channels + 1), heads] + spatial)
    local_kernel = local_kernel.unsqueeze(1)  # h 1 (2r+1)...
    if spatial_dims == 1:
        local = F.conv1d(as_images, local_kernel, padding=radii, groups=heads)  # (b c+1) h L
    else:
        local = F.conv2d(as_images, local_kernel, padding=radii, groups=heads)  # (b c+1) h H W
    local = local.reshape([batch, channels + 1, heads] + spatial).transpose(1, 2)  # b h (c+1) ...
    if window_covers_input:
        mixed = local  # b h (c+1) ...
    else:
        totals = stacked.flatten(3).sum(dim=-1)  # b h (c+1)
        totals = totals.reshape([batch, heads, channels + 1] + [1] * spatial_dims)
        global_scale = torch.exp(-shift).unsqueeze(1)  # h 1 1..., in (0, 1]
        mixed = local + global_scale * totals  # b h (c+1) ...
    numerator = mixed[:, :, :channels]  # b h c ...
    denominator = mixed[:, :, channels:].clamp_min(smallest_normal(dtype))  # b h 1 ...
    output = torch.sigmoid(queries.to(dtype)) * numerator / denominator  # b h c ...
    return output.to(queries.dtype)


class _AFTMixer(nn.Module):
    """What the AFT variants share: the constructor's arguments (in_channels, out_channels,
    hidden_dim, causal, stride, spatial_dims, bias: see :class:`AFTFull`), projections, input
    checks, output projection, pooling, the mixing by :func:`aft_mix` with the variant's
    :meth:`position_bias` (AFT-conv mixes its own), and the repr of the attributes that
    ``_REPR`` names. ``key_channels`` is the variant's (AFT-conv: one per head), not a user's."""

    _REPR: Tuple[str, ...] = ("hidden_dim", "causal", "stride", "spatial_dims")

    def __init__(
        self,
        in_channels: int,
        out_channels: Optional[int] = None,
        *,
        hidden_dim: Optional[int] = None,
        causal: bool = False,
        stride: int = 1,
        spatial_dims: int = 2,
        bias: bool = True,
        key_channels: Optional[int] = None,
    ):
        super().__init__()
        out_channels = in_channels if out_channels is None else out_channels
        hidden_dim = out_channels if hidden_dim is None else hidden_dim
        for name, value in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("hidden_dim", hidden_dim),
        ):
            check_int(name, value, 1)
        check_choice("stride", stride, (1, 2))
        check_choice("spatial_dims", spatial_dims, (1, 2))
        if causal and spatial_dims != 1:
            raise ValueError(
                f"causal=True needs sequences (spatial_dims=1), got spatial_dims={spatial_dims}"
            )
        if causal and stride != 1:
            # The 3x3 average pool would mix position t + 1 into output t.
            raise ValueError(f"causal=True needs stride=1, got stride={stride}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.hidden_dim = hidden_dim
        self.stride = stride
        self.spatial_dims = spatial_dims
        self.causal = causal
        # The name its input errors give (TorchScript compiles no type(self).__name__).
        self.layer_name = type(self).__name__

        conv = CONV[spatial_dims]
        key_channels = hidden_dim if key_channels is None else key_channels
        self.to_queries = conv(in_channels, hidden_dim, 1, bias=bias)
        self.to_keys = conv(in_channels, key_channels, 1, bias=False)
        self.to_values = conv(in_channels, hidden_dim, 1, bias=bias)
        self.to_output = conv(hidden_dim, out_channels, 1, bias=bias)
        self.pool = strided_pool(spatial_dims, stride)

    def reset_parameters(self) -> None:
        """Fan-in normal projections (std fan_in^-1/2, as the lambda layer's K, V), zero biases."""
        for projection in (self.to_queries, self.to_keys, self.to_values, self.to_output):
            nn.init.normal_(projection.weight, std=projection.in_channels**-0.5)
            if projection.bias is not None:
                nn.init.zeros_(projection.bias)

    def _check_input(self, x: torch.Tensor) -> List[int]:
        spatial = check_layer_input(self.layer_name, x, self.spatial_dims, self.in_channels)
        self._check_spatial(spatial)
        return spatial

    def _check_spatial(self, spatial: List[int]) -> None:
        pass

    def position_bias(self, spatial: Sequence[int]) -> Optional[torch.Tensor]:
        """The dense bias ``w[t, t']``, (T, T), for an input of this size; None for w = 0.

        Computed in the parameters' dtype promoted to at least float32, outside autocast.
        """
        device = self.to_keys.weight.device
        with torch.autocast(device_type=autocast_device_type(device), enabled=False):
            return self._position_bias(list(spatial))

    def _position_bias(self, spatial: List[int]) -> Optional[torch.Tensor]:
        """:meth:`position_bias` inside the mixer's autocast switch."""
        return None

    def extra_repr(self) -> str:
        return ", ".join(
            [
                f"{self.in_channels}, {self.out_channels}",
                *(f"{name}={getattr(self, name)}" for name in self._REPR),
            ]
        )

    def _mix(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        spatial: List[int],
    ) -> torch.Tensor:
        """Y from the projections (B, d, *spatial), in their dtype, outside autocast; (B, d, T)."""
        return _aft_mix(
            queries.flatten(2),
            keys.flatten(2),
            values.flatten(2),
            self._position_bias(spatial),
            self.causal,
        )  # b d t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the mixer.

        Args:
            x: (B, in_channels, H, W), or (B, in_channels, L) with spatial_dims=1.

        Returns:
            (B, out_channels, H, W) (halved, rounding up, when stride=2), in x's dtype.
        """
        spatial = self._check_input(x)
        batch, dtype = x.shape[0], compute_dtype(x.dtype)
        queries = self.to_queries(x).to(dtype)  # b d ...
        keys = self.to_keys(x).to(dtype)  # b d ... (b heads ... for AFT-conv)
        values = self.to_values(x).to(dtype)  # b d ...
        if torch.jit.is_scripting():
            # TorchScript compiles no autocast switch: see the module docstring.
            mixed = self._mix(queries, keys, values, spatial)
        else:
            with torch.autocast(device_type=autocast_device_type(x.device), enabled=False):
                mixed = self._mix(queries, keys, values, spatial)
        mixed = mixed.reshape([batch, self.hidden_dim] + spatial)  # b d ...
        output = self.to_output(mixed.to(x.dtype))  # b out ...
        return self.pool(output).to(x.dtype)


class _FactorizedBiasMixer(_AFTMixer):
    """AFT-full and AFT-local: ``w[t, t'] = u[t] . v[t']`` (masked to a window for AFT-local)."""

    _REPR = ("hidden_dim", "max_size", "position_dim", "causal", "stride", "spatial_dims")

    def __init__(
        self,
        in_channels: int,
        out_channels: Optional[int] = None,
        *,
        max_size: int = 64,
        position_dim: int = 128,
        **common,
    ):
        check_int("max_size", max_size, 1)
        check_int("position_dim", position_dim, 1)
        super().__init__(in_channels, out_channels, **common)
        self.max_size = max_size
        self.position_dim = position_dim
        num_positions = max_size**self.spatial_dims
        self.position_u = nn.Parameter(torch.empty(num_positions, position_dim))
        self.position_v = nn.Parameter(torch.empty(num_positions, position_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Projections as the base class; u, v ~ N(0, std 0.1), i.e. variance 10^-2 (the
        paper's CIFAR-10 setup)."""
        super().reset_parameters()
        nn.init.normal_(self.position_u, std=0.1)
        nn.init.normal_(self.position_v, std=0.1)

    def _check_spatial(self, spatial: List[int]) -> None:
        if max(spatial) > self.max_size:
            raise ValueError(
                f"{self.layer_name}: input size {shape_text(spatial)} exceeds max_size="
                f"{self.max_size} positions per axis that its position biases cover; build it "
                f"with a larger max_size"
            )

    def _positions(self, spatial: List[int], device: torch.device) -> torch.Tensor:
        """(T, spatial_dims) grid coordinates in row-major order."""
        grids = torch.meshgrid(
            [torch.arange(size, device=device) for size in spatial], indexing="ij"
        )
        return torch.stack([grid.reshape(-1) for grid in grids], dim=-1)  # t D

    def _in_window(self, positions: torch.Tensor) -> Optional[torch.Tensor]:
        return None

    def _position_bias(self, spatial: List[int]) -> torch.Tensor:
        """w[t, t'] for an input of this size, shape (T, T), T = prod(spatial)."""
        positions = self._positions(spatial, self.position_u.device)  # t D
        index = positions[:, 0]
        for axis in range(1, positions.shape[1]):
            index = index * self.max_size + positions[:, axis]  # t, row of u and v
        dtype = compute_dtype(self.position_u.dtype)
        bias = self.position_u[index].to(dtype) @ self.position_v[index].to(dtype).T  # t t'
        in_window = self._in_window(positions)
        if in_window is not None:
            bias = bias * in_window.to(dtype)  # t t', 0 (not -inf) outside the window
        return bias


class AFTFull(_FactorizedBiasMixer):
    """AFT-full: a learned bias for every pair of positions, factorised as ``w = U V^T``.

    ``Y_t = sigmoid(Q_t) * sum_t' exp(K_t' + w[t, t']) V_t' / sum_t' exp(K_t' + w[t, t'])``
    with ``w[t, t'] = u[t] . v[t']`` (paper Sec. 3.2), then a 1x1 output projection.

    Args:
        in_channels: input channels.
        out_channels: output channels (default: in_channels).
        hidden_dim: channels d of Q, K and V (default: out_channels).
        max_size: the largest L (sequences) or H and W (maps) the biases cover; position (i, j)
            of a map uses row ``i * max_size + j`` of u and v.
        position_dim: inner dimension d' of the factorisation (paper: 64 to 256).
        causal: sequences only: output t sees positions t' <= t.
        stride: 1, or 2 for the mixer at stride 1 followed by 3x3 average pooling with stride 2
            and padding 1 (as :class:`~lambda_det.layers.LambdaLayer`).
        spatial_dims: 2 for (B, C, H, W) maps, 1 for (B, C, L) sequences.
        bias: whether the query, value and output projections have a bias (K never has one).

    Parameters: ``position_u``, ``position_v`` of shape (max_size ** spatial_dims, position_dim),
    initialised normal with std 0.1 (variance 10^-2). Cost: O(T^2 (d + d')) time, O(T^2 + T d)
    memory.
    """


class AFTLocal(_FactorizedBiasMixer):
    """AFT-local: AFT-full's factorised bias inside a local window, 0 (not -inf) outside.

    ``w[t, t'] = u[t] . v[t']`` where ``|t - t'| < window_size`` along every axis, else 0; the
    positions outside the window keep their ``exp(K_t')`` weight, so connectivity stays global
    (paper Sec. 3.2). Note the paper's convention: the window spans ``2 * window_size - 1``
    positions per axis, unlike :class:`AFTConv`'s ``window_size`` (the kernel width).
    ``window_size >= max(H, W)`` (or L) is AFT-full; ``window_size=0`` is AFT-simple.

    Args:
        in_channels, out_channels: as :class:`AFTFull`.
        window_size: s >= 0, the bias is learned for ``|t - t'| < s`` (paper: 32 for text).
        **common: hidden_dim, max_size, position_dim, causal, stride, spatial_dims, bias, as
            :class:`AFTFull`.
    """

    _REPR = (
        "hidden_dim",
        "window_size",
        "max_size",
        "position_dim",
        "causal",
        "stride",
        "spatial_dims",
    )

    def __init__(
        self,
        in_channels: int,
        out_channels: Optional[int] = None,
        *,
        window_size: int = 32,
        **common,
    ):
        check_int("window_size", window_size, 0)
        super().__init__(in_channels, out_channels, **common)
        self.window_size = window_size

    def _in_window(self, positions: torch.Tensor) -> torch.Tensor:
        offsets = positions[None, :, :] - positions[:, None, :]  # t t' D
        return (offsets.abs() < self.window_size).all(dim=-1)  # t t'


class AFTSimple(_AFTMixer):
    """AFT-simple: no position bias (w = 0), a global softmax-weighted pooling of V per channel.

    ``Y_t = sigmoid(Q_t) * sum_t' softmax_t'(K)[t'] V_t'`` (causal: softmax and sum over
    t' <= t), then a 1x1 output projection. O(T d) time and memory.

    Args:
        in_channels, out_channels: as :class:`AFTFull`.
        **common: hidden_dim, causal, stride, spatial_dims, bias, as :class:`AFTFull`.
    """

    def __init__(self, in_channels: int, out_channels: Optional[int] = None, **common):
        super().__init__(in_channels, out_channels, **common)
        self.reset_parameters()


class AFTConv(_AFTMixer):
    """AFT-conv: per-head relative biases in an s x s window, 0 outside; a drop-in spatial mixer.

    For head i (K^i one channel, Q^i and V^i ``hidden_dim / heads`` channels)::

        Y^i = sigmoid(Q^i) * (conv(e^K^i * V^i, e^w_i - 1) + sum e^K^i * V^i)
                           / (conv(e^K^i, e^w_i - 1) + sum e^K^i)

    which is AFT-full with ``w[t, t'] = w_i[t' - t]`` inside the window and 0 outside, computed
    in O(T s^2 d) time and O(T d) memory for any H, W. The bias is reparameterised (paper
    Sec. 3.2) as ``w_i = gain_i * (raw_i - mean(raw_i)) / sqrt(var(raw_i) + 1e-5) + shift_i``
    (see :meth:`position_kernel`), with gain and shift initialised to 0. Stabilisation: see the
    module docstring (exact rescaling of kernel and global sums by ``e^-max(0, max w_i)``).

    Replaces the 3x3 conv of a ResNet bottleneck: ``AFTConv(width, width, stride=stride)``.

    Args:
        in_channels, out_channels: as :class:`AFTFull`.
        heads: number of heads h (channels of K, and bias kernels).
        window_size: odd kernel width s (per axis); offsets up to s // 2 get a learned bias.
        **common: hidden_dim (channels of Q and V, divisible by heads), stride, spatial_dims,
            bias, as :class:`AFTFull`; no causal form (the window looks both ways).

    Parameters: ``position_weight`` (h, s, s), or (h, s) for sequences, ~ N(0, 1), the raw bias;
    ``position_gain`` (h,) and ``position_shift`` (h,), both 0 at init (so the layer starts as
    AFT-simple).
    """

    _REPR = ("hidden_dim", "heads", "window_size", "stride", "spatial_dims")
    # The reparameterisation's std = sqrt(var + eps), so that a 1x1 window (std 0) works.
    _REPARAM_EPS: Final[float] = 1e-5

    def __init__(
        self,
        in_channels: int,
        out_channels: Optional[int] = None,
        *,
        heads: int = 8,
        window_size: int = 7,
        **common,
    ):
        check_int("heads", heads, 1)
        check_odd("window_size", window_size)
        if common.get("causal"):
            raise ValueError(
                "AFTConv has no causal form (its window looks both ways): use "
                "AFTLocal, AFTFull or AFTSimple"
            )
        super().__init__(in_channels, out_channels, key_channels=heads, **common)
        if self.hidden_dim % heads:
            raise ValueError(
                f"hidden_dim={self.hidden_dim} is not divisible by heads={heads}: "
                f"each head has hidden_dim / heads query and value channels"
            )
        self.heads = heads
        self.window_size = window_size
        window = [window_size] * self.spatial_dims
        self.position_weight = nn.Parameter(torch.empty(heads, *window))
        self.position_gain = nn.Parameter(torch.empty(heads))
        self.position_shift = nn.Parameter(torch.empty(heads))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Projections as the base class; raw bias N(0, 1), gain = shift = 0."""
        super().reset_parameters()
        nn.init.normal_(self.position_weight, std=1.0)
        nn.init.zeros_(self.position_gain)
        nn.init.zeros_(self.position_shift)

    def position_kernel(self) -> torch.Tensor:
        """The reparameterised bias w, shape (heads, s, ...), float32 or wider, outside autocast.

        ``w_i = gain_i * (raw_i - mean(raw_i)) / sqrt(var(raw_i) + 1e-5) + shift_i``, mean and
        (biased) variance over the window of head i.
        """
        device = self.position_weight.device
        with torch.autocast(device_type=autocast_device_type(device), enabled=False):
            return self._position_kernel()

    def _position_kernel(self) -> torch.Tensor:
        """:meth:`position_kernel` inside the mixer's autocast switch."""
        dtype = compute_dtype(self.position_weight.dtype)
        raw = self.position_weight.to(dtype).flatten(1)  # h s^D
        mean = raw.mean(dim=1, keepdim=True)  # h 1
        var = raw.var(dim=1, unbiased=False, keepdim=True)  # h 1
        normalized = (raw - mean) / torch.sqrt(var + self._REPARAM_EPS)  # h s^D
        kernel = (
            self.position_gain.to(dtype)[:, None] * normalized
            + self.position_shift.to(dtype)[:, None]
        )  # h s^D
        return kernel.reshape(self.position_weight.shape)  # h s ...

    def _mix(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        spatial: List[int],
    ) -> torch.Tensor:
        batch, per_head = queries.shape[0], self.hidden_dim // self.heads
        output = _aft_conv_mix(
            queries.reshape([batch, self.heads, per_head] + spatial),
            keys,  # b h ...
            values.reshape([batch, self.heads, per_head] + spatial),
            self._position_kernel(),
        )  # b h c ...
        return output.reshape([batch, self.hidden_dim] + spatial)  # b d ...
