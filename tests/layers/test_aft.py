"""The AFT mixers against a loop transcription of the paper's formula, and their properties."""

import copy
import io
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from lambda_det.layers import AFTConv, AFTFull, AFTLocal, AFTSimple, aft_conv_mix, aft_mix
from lambda_det.layers._common import smallest_normal


def reference_position_bias(layer, spatial):
    """w[t][t'] for every pair (a scalar, or one value per hidden channel for AFT-conv), by loops.

    AFT-full: u[p(t)] . v[p(t')], p(i, j) = i * max_size + j; AFT-local: the same where every
    |offset| < window_size, else 0; AFT-simple: 0; AFT-conv: the reparameterised kernel of the
    channel's head at offset t' - t where every |offset| <= window_size // 2, else 0.
    """
    positions = list(itertools.product(*[range(size) for size in spatial]))
    zero = torch.zeros((), dtype=torch.float64)
    if isinstance(layer, AFTSimple):
        return [[zero for _ in positions] for _ in positions]
    if isinstance(layer, AFTConv):
        kernels = []
        for head in range(layer.heads):
            raw = layer.position_weight[head]
            mean = raw.mean()
            std = torch.sqrt(((raw - mean) ** 2).mean() + 1e-5)
            normalized = (raw - mean) / std
            kernels.append(layer.position_gain[head] * normalized + layer.position_shift[head])
        per_head = layer.hidden_dim // layer.heads
        radius = layer.window_size // 2
        bias = []
        for query in positions:
            row = []
            for context in positions:
                offset = [c - q for c, q in zip(context, query)]
                if all(abs(o) <= radius for o in offset):
                    index = tuple(o + radius for o in offset)
                    row.append(
                        torch.stack(
                            [kernels[c // per_head][index] for c in range(layer.hidden_dim)]
                        )
                    )
                else:
                    row.append(zero)
            bias.append(row)
        return bias

    def row_of(position):
        index = 0
        for coordinate in position:
            index = index * layer.max_size + coordinate
        return index

    bias = []
    for query in positions:
        row = []
        for context in positions:
            inside = not isinstance(layer, AFTLocal) or all(
                abs(c - q) < layer.window_size for c, q in zip(context, query)
            )
            row.append(
                layer.position_u[row_of(query)] @ layer.position_v[row_of(context)]
                if inside
                else zero
            )
        bias.append(row)
    return bias


def reference_aft(layer, x):
    """Y_t = sigmoid(Q_t) sum_t' exp(K_t' + w[t, t']) V_t' / sum_t' exp(K_t' + w[t, t']), by loops.

    No stabilisation (float64, moderate values); t' <= t when causal; then the output projection
    and the layer's pooling.
    """
    batch, spatial = x.shape[0], tuple(x.shape[2:])
    num_positions = math.prod(spatial)
    queries = layer.to_queries(x).reshape(batch, layer.hidden_dim, num_positions)
    keys = layer.to_keys(x).reshape(batch, -1, num_positions)
    if isinstance(layer, AFTConv):  # one key per head, shared by the head's channels
        keys = keys.repeat_interleave(layer.hidden_dim // layer.heads, dim=1)
    values = layer.to_values(x).reshape(batch, layer.hidden_dim, num_positions)
    bias = reference_position_bias(layer, spatial)
    outputs = []
    for b in range(batch):
        per_position = []
        for t in range(num_positions):
            numerator = torch.zeros(layer.hidden_dim, dtype=x.dtype)
            denominator = torch.zeros(layer.hidden_dim, dtype=x.dtype)
            for context in range(num_positions):
                if layer.causal and context > t:
                    continue
                weight = torch.exp(keys[b, :, context] + bias[t][context])
                numerator = numerator + weight * values[b, :, context]
                denominator = denominator + weight
            per_position.append(torch.sigmoid(queries[b, :, t]) * numerator / denominator)
        outputs.append(torch.stack(per_position, dim=-1))
    mixed = torch.stack(outputs).reshape(batch, layer.hidden_dim, *spatial)
    return layer.pool(layer.to_output(mixed))


def gradients(output: torch.Tensor, inputs) -> list:
    generator = torch.Generator().manual_seed(123)
    weights = torch.randn(output.shape, dtype=output.dtype, generator=generator)
    return torch.autograd.grad((output * weights).sum(), inputs, allow_unused=True)


def randomize(layer, bias_scale: float = 0.7):
    """Non-trivial biases and position parameters, so every term of the formula shows."""
    with torch.no_grad():
        for projection in (layer.to_queries, layer.to_values, layer.to_output):
            if projection.bias is not None:
                projection.bias.uniform_(-0.5, 0.5)
        if isinstance(layer, (AFTFull, AFTLocal)):
            layer.position_u.normal_(std=bias_scale)
            layer.position_v.normal_(std=bias_scale)
        if isinstance(layer, AFTConv):
            layer.position_gain.uniform_(0.5, 1.5)
            layer.position_shift.uniform_(-0.5, 0.5)
    return layer


def make(cls, dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    return randomize(cls(kwargs.pop("in_channels", 4), **kwargs).to(dtype))


CASES = {
    # name: (class, kwargs, input shape)
    "full_sequence": (
        AFTFull,
        dict(out_channels=6, hidden_dim=5, max_size=9, position_dim=3, spatial_dims=1),
        (2, 4, 7),
    ),
    "full_sequence_causal": (
        AFTFull,
        dict(max_size=8, position_dim=2, causal=True, spatial_dims=1),
        (2, 4, 6),
    ),
    "full_map_HneW": (AFTFull, dict(max_size=6, position_dim=3), (2, 4, 3, 5)),
    "full_map_stride2": (AFTFull, dict(max_size=5, position_dim=2, stride=2), (1, 4, 5, 4)),
    "local_sequence": (
        AFTLocal,
        dict(window_size=2, max_size=8, position_dim=3, spatial_dims=1),
        (2, 4, 7),
    ),
    "local_sequence_causal": (
        AFTLocal,
        dict(window_size=3, max_size=8, position_dim=3, causal=True, spatial_dims=1),
        (2, 4, 8),
    ),
    "local_map_HneW": (AFTLocal, dict(window_size=2, max_size=5, position_dim=3), (2, 4, 5, 3)),
    "simple_sequence": (AFTSimple, dict(hidden_dim=3, spatial_dims=1), (2, 4, 6)),
    "simple_sequence_causal": (AFTSimple, dict(causal=True, spatial_dims=1), (2, 4, 6)),
    "simple_map": (AFTSimple, dict(out_channels=5), (2, 4, 3, 4)),
    "conv_map_HneW": (AFTConv, dict(heads=2, window_size=3), (2, 4, 5, 7)),
    "conv_map_window_larger_than_input": (
        AFTConv,
        dict(heads=2, window_size=7, hidden_dim=6),
        (2, 4, 3, 5),
    ),
    "conv_map_1x1_stride2": (AFTConv, dict(heads=4, window_size=5, stride=2), (2, 4, 1, 1)),
    "conv_map_stride2": (AFTConv, dict(heads=1, window_size=3, stride=2), (1, 4, 5, 3)),
    "conv_sequence": (AFTConv, dict(heads=2, window_size=5, spatial_dims=1), (2, 4, 9)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_loop_reference_forward_and_gradients(case):
    cls, kwargs, shape = CASES[case]
    layer = make(cls, in_channels=shape[1], **kwargs)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    inputs = [x] + list(layer.parameters())
    expected = reference_aft(layer, x)
    actual = layer(x)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)
    for got, want in zip(gradients(actual, inputs), gradients(expected, inputs)):
        if want is None:  # e.g. the output bias of a layer without one
            assert got is None or not got.any()
        else:
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def dense_bias_from_kernel(kernel: torch.Tensor, spatial) -> torch.Tensor:
    """(heads, T, T): w[t, t'] = kernel[t' - t] inside the window, 0 outside, by loops."""
    heads, window = kernel.shape[0], kernel.shape[1:]
    positions = list(itertools.product(*[range(size) for size in spatial]))
    dense = torch.zeros(heads, len(positions), len(positions), dtype=kernel.dtype)
    for t, query in enumerate(positions):
        for s, context in enumerate(positions):
            offset = [c - q for c, q in zip(context, query)]
            if all(abs(o) <= size // 2 for o, size in zip(offset, window)):
                dense[:, t, s] = kernel[
                    (slice(None),) + tuple(o + size // 2 for o, size in zip(offset, window))
                ]
    return dense


@pytest.mark.parametrize(
    "window,spatial,offset",
    [
        ((3, 3), (5, 7), 0.0),
        ((5, 5), (5, 7), 0.0),
        ((7, 3), (3, 5), 0.0),  # wider than the input along H: the kernel is cropped there
        ((11, 11), (3, 5), 0.0),  # every window covers the whole input
        ((5, 5), (5, 7), 100.0),  # e^w overflows fp32 unless the kernel is rescaled exactly
        ((11, 11), (3, 5), -30.0),  # conv + sum would cancel to ~eps: the covering form avoids it
        ((5,), (9,), 0.0),
    ],
)
def test_conv_equals_full_with_translation_invariant_bias(window, spatial, offset):
    heads, channels, batch = 3, 2, 2
    generator = torch.Generator().manual_seed(7)
    options = dict(dtype=torch.float64, generator=generator)
    queries = torch.randn(batch, heads, channels, *spatial, **options)
    keys = torch.randn(batch, heads, *spatial, **options) * 3
    values = torch.randn(batch, heads, channels, *spatial, **options)
    kernel = torch.randn(heads, *window, **options) * 2 + offset
    actual = aft_conv_mix(queries, keys, values, kernel)
    dense = dense_bias_from_kernel(kernel, spatial)
    num_positions = math.prod(spatial)
    for head in range(heads):
        expected = aft_mix(
            queries[:, head].reshape(batch, channels, num_positions),
            keys[:, head].reshape(batch, 1, num_positions).expand(-1, channels, -1),
            values[:, head].reshape(batch, channels, num_positions),
            dense[head],
        )
        torch.testing.assert_close(
            actual[:, head].reshape(batch, channels, num_positions), expected, rtol=1e-9, atol=1e-11
        )
    # The same computed in float32: finite and close, also where e^w alone over- or underflows.
    single = aft_conv_mix(queries.float(), keys.float(), values.float(), kernel.float())
    assert torch.isfinite(single).all()
    torch.testing.assert_close(single.double(), actual, rtol=1e-4, atol=1e-5)


def test_zero_bias_is_simple_and_wide_local_window_is_full():
    x = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    full = make(AFTFull, max_size=5, position_dim=3)
    simple = AFTSimple(4).double()
    simple.load_state_dict(
        {key: value for key, value in full.state_dict().items() if not key.startswith("position")}
    )
    assert not torch.allclose(full(x), simple(x))  # the bias matters, so the checks below can fail
    # AFT-local with s >= T (per axis) covers every pair: it is AFT-full.
    wide = AFTLocal(4, window_size=5, max_size=5, position_dim=3).double()
    wide.load_state_dict(full.state_dict())
    torch.testing.assert_close(wide(x), full(x), rtol=1e-12, atol=1e-12)
    narrower = AFTLocal(4, window_size=4, max_size=5, position_dim=3).double()
    narrower.load_state_dict(full.state_dict())
    assert not torch.allclose(narrower(x), full(x))
    # s = 0 (paper Sec. 3.2) and u = 0 are AFT-simple.
    empty = AFTLocal(4, window_size=0, max_size=5, position_dim=3).double()
    empty.load_state_dict(full.state_dict())
    torch.testing.assert_close(empty(x), simple(x), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        full.position_u.zero_()
    torch.testing.assert_close(full(x), simple(x), rtol=1e-12, atol=1e-12)


def test_conv_starts_as_simple():
    conv = AFTConv(4, heads=2, window_size=3).double()  # gain = shift = 0 at init: w = 0
    simple = AFTSimple(4).double()
    state = dict(conv.state_dict())
    for key in [key for key in state if key.startswith("position")]:
        del state[key]
    state["to_keys.weight"] = state["to_keys.weight"].repeat_interleave(2, dim=0)  # key per head
    simple.load_state_dict(state)
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    torch.testing.assert_close(conv(x), simple(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_invariant_to_per_channel_key_and_per_row_bias_constants(causal):
    generator = torch.Generator().manual_seed(3)
    batch, channels, length = 2, 3, 6
    queries, keys, values = (
        torch.randn(batch, channels, length, dtype=torch.float64, generator=generator)
        for _ in range(3)
    )
    bias = torch.randn(length, length, dtype=torch.float64, generator=generator)
    expected = aft_mix(queries, keys, values, bias, causal=causal)
    # exp(+-800) over- or underflows even float64: only exact shifts can pass these.
    key_constants = torch.tensor([[800.0], [-800.0], [5.0]], dtype=torch.float64)  # c 1
    row_constants = torch.linspace(-800, 800, length, dtype=torch.float64)[:, None]  # t 1
    torch.testing.assert_close(
        aft_mix(queries, keys + key_constants, values, bias, causal=causal),
        expected,
        rtol=1e-9,
        atol=1e-12,
    )
    torch.testing.assert_close(
        aft_mix(queries, keys, values, bias + row_constants, causal=causal),
        expected,
        rtol=1e-9,
        atol=1e-12,
    )
    torch.testing.assert_close(
        aft_mix(queries, keys + key_constants, values, None, causal=causal),
        aft_mix(queries, keys, values, None, causal=causal),
        rtol=1e-9,
        atol=1e-12,
    )
    # The same in float32 with constants beyond its exp range (e^89 = inf).
    single = aft_mix(
        queries.float(),
        (keys + key_constants / 8).float(),
        values.float(),
        (bias + row_constants / 8).float(),
        causal=causal,
    )
    torch.testing.assert_close(single.double(), expected, rtol=1e-4, atol=1e-5)
    # AFT-conv: a per-(batch, head) constant on K.
    conv_keys = torch.randn(batch, 2, 4, 5, dtype=torch.float64, generator=generator)
    conv_values = torch.randn(batch, 2, 3, 4, 5, dtype=torch.float64, generator=generator)
    conv_queries = torch.randn(batch, 2, 3, 4, 5, dtype=torch.float64, generator=generator)
    kernel = torch.randn(2, 3, 3, dtype=torch.float64, generator=generator)
    shifted = (
        conv_keys
        + torch.tensor([[800.0, -800.0], [-3.0, 900.0]], dtype=torch.float64)[:, :, None, None]
    )
    torch.testing.assert_close(
        aft_conv_mix(conv_queries, shifted, conv_values, kernel),
        aft_conv_mix(conv_queries, conv_keys, conv_values, kernel),
        rtol=1e-9,
        atol=1e-12,
    )


def scale_keys(layer, target: float = 30.0):
    """Scale the key projection so that |K| reaches about ``target`` on a standard normal input."""
    with torch.no_grad():
        keys = layer.to_keys(torch.randn(4, layer.in_channels, *([8] * layer.spatial_dims)))
        layer.to_keys.weight.mul_(target / keys.abs().max())
    return layer


AUTOCAST_CASES = {
    "full": (AFTFull, dict(max_size=12, position_dim=8), (2, 16, 12, 10)),
    "local_causal": (
        AFTLocal,
        dict(window_size=4, max_size=40, position_dim=8, causal=True, spatial_dims=1),
        (2, 16, 40),
    ),
    "simple": (AFTSimple, dict(), (2, 16, 12, 10)),
    "conv": (AFTConv, dict(heads=4, window_size=5), (2, 16, 12, 10)),
}


@pytest.mark.parametrize("case", sorted(AUTOCAST_CASES))
def test_bf16_and_fp16_autocast_with_large_keys_match_fp64_and_stay_finite(case):
    cls, kwargs, shape = AUTOCAST_CASES[case]
    layer = scale_keys(make(cls, dtype=torch.float32, in_channels=shape[1], **kwargs).eval())
    reference_layer = copy.deepcopy(layer).double()
    x = torch.randn(shape)
    expected = reference_layer(x.double())
    keys = reference_layer.to_keys(x.double())
    assert 20 < keys.abs().max() < 40  # |K| ~ 30: e^K alone would overflow fp16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        actual = layer(x)
    assert actual.dtype == torch.float32 and torch.isfinite(actual).all()
    # Stated tolerances. The projections run in reduced precision (bf16: 8-bit mantissa, fp16:
    # 11-bit), so K = 30 carries an absolute error of up to 30 * 2^-9 = 0.06 (bf16) or 0.015
    # (fp16), i.e. weights e^K off by up to 6% / 1.5%; the mixing itself (float32) adds ~1e-7.
    # Measured: about 1% (bf16) and 0.1% (fp16) relative error; allowed: 3% and 0.5%.
    assert relative_error(actual, expected) < 3e-2
    with torch.autocast("cpu", dtype=torch.float16):
        half = layer(x)
        huge = layer(x * 8)  # |K| ~ 240: e^K overflows float32 too unless K is shifted
    assert half.dtype == torch.float32 and relative_error(half, expected) < 5e-3
    assert torch.isfinite(huge).all()
    # No autocast: float32 mixing against float64.
    assert relative_error(layer(x), expected) < 1e-5


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (AFTFull, dict(max_size=10, position_dim=3)),
        (AFTLocal, dict(window_size=2, max_size=10, position_dim=3)),
        (AFTSimple, dict()),
    ],
)
def test_causal_hides_the_future(cls, kwargs):
    layer = make(cls, causal=True, spatial_dims=1, **kwargs)
    length, cut = 10, 6
    x = torch.randn(1, 4, length, dtype=torch.float64)
    changed = x.clone()
    changed[..., cut:] += torch.randn_like(changed[..., cut:]) * 3
    before, after = layer(x), layer(changed)
    torch.testing.assert_close(before[..., :cut], after[..., :cut], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(before[..., cut:], after[..., cut:])
    # Without causal the future leaks into the past, so the check above can fail.
    open_layer = cls(4, causal=False, spatial_dims=1, **kwargs).double()
    open_layer.load_state_dict(layer.state_dict())
    assert not torch.allclose(open_layer(x)[..., :cut], open_layer(changed)[..., :cut])


def test_factorized_bias_gets_gradients_and_the_optimizer_step_is_used():
    layer = make(AFTFull, max_size=6, position_dim=3)
    x = torch.randn(2, 4, 4, 6, dtype=torch.float64)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    assert any(p is layer.position_u for group in optimizer.param_groups for p in group["params"])
    before, u_before = layer(x), layer.position_u.detach().clone()
    (before * torch.randn_like(before)).sum().backward()
    assert layer.position_u.grad.abs().sum() > 0 and layer.position_v.grad.abs().sum() > 0
    optimizer.step()
    assert not torch.equal(layer.position_u, u_before)
    u = layer.position_u.detach()
    rows = (torch.arange(4)[:, None] * 6 + torch.arange(6)).flatten()
    torch.testing.assert_close(
        layer.position_bias((4, 6)).detach(), u[rows] @ layer.position_v.detach()[rows].T
    )
    assert not torch.allclose(layer(x), before)


def test_conv_bias_gets_gradients_and_the_optimizer_step_is_used():
    layer = AFTConv(4, heads=2, window_size=3).double()
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    weights = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    (layer(x) * weights).sum().backward()
    # gain = 0 at init: the raw kernel has no effect yet, gain and shift do.
    assert layer.position_gain.grad.abs().sum() > 0 and layer.position_shift.grad.abs().sum() > 0
    assert not layer.position_weight.grad.any()
    kernel_before = layer.position_kernel().detach()
    optimizer.step()
    assert not torch.equal(layer.position_kernel().detach(), kernel_before)
    optimizer.zero_grad()
    (layer(x) * weights).sum().backward()
    assert layer.position_weight.grad.abs().sum() > 0
    raw_before = layer.position_weight.detach().clone()
    output_before = layer(x).detach()
    optimizer.step()
    assert not torch.equal(layer.position_weight, raw_before)
    assert not torch.allclose(layer(x), output_before)


def test_stride_2_is_the_mixer_then_average_pooling():
    layer = make(AFTConv, heads=2, window_size=3, stride=2)
    unstrided = AFTConv(4, heads=2, window_size=3).double()
    unstrided.load_state_dict(layer.state_dict())
    x = torch.randn(2, 4, 7, 6, dtype=torch.float64)
    out = layer(x)
    assert out.shape == (2, 4, 4, 3)
    torch.testing.assert_close(out, F.avg_pool2d(unstrided(x), 3, 2, 1), rtol=1e-12, atol=1e-12)


def test_reset_parameters_undoes_an_init_loop():
    layers = [AFTFull(64, max_size=16, position_dim=64), AFTConv(64, heads=8, window_size=7)]
    for layer in layers:
        for parameter in layer.parameters():
            torch.nn.init.constant_(parameter, 0.3)
        layer.reset_parameters()
        for projection in (layer.to_queries, layer.to_keys, layer.to_values, layer.to_output):
            assert projection.weight.std().item() == pytest.approx(64**-0.5, rel=0.1)
            assert projection.bias is None or not projection.bias.any()
        assert layer.to_keys.bias is None  # a constant on K cancels out
    full, conv = layers
    assert full.position_u.std().item() == pytest.approx(0.1, rel=0.1)
    assert conv.position_weight.std().item() == pytest.approx(1.0, rel=0.1)
    assert not conv.position_gain.any() and not conv.position_shift.any()


@pytest.mark.parametrize(
    "factory,message",
    [
        (lambda: AFTConv(8, window_size=4), "window_size must be an odd integer >= 1, got 4"),
        (lambda: AFTConv(8, window_size=0), "window_size must be an odd integer >= 1, got 0"),
        (lambda: AFTConv(8, heads=3), "hidden_dim=8 is not divisible by heads=3"),
        (
            lambda: AFTConv(8, 12, heads=8, hidden_dim=20),
            "hidden_dim=20 is not divisible by heads=8",
        ),
        (lambda: AFTConv(8, heads=0), "heads must be an integer >= 1, got 0"),
        (lambda: AFTConv(8, stride=3), "stride must be 1 or 2, got 3"),
        (lambda: AFTFull(8, max_size=0), "max_size must be an integer >= 1, got 0"),
        (lambda: AFTFull(8, position_dim=0), "position_dim must be an integer >= 1, got 0"),
        (lambda: AFTFull(0), "in_channels must be an integer >= 1, got 0"),
        (lambda: AFTFull(8, hidden_dim=2.5), "hidden_dim must be an integer >= 1, got 2.5"),
        (lambda: AFTLocal(8, window_size=-1), "window_size must be an integer >= 0, got -1"),
        (lambda: AFTSimple(8, spatial_dims=3), "spatial_dims must be 1 or 2, got 3"),
        (
            lambda: AFTSimple(8, causal=True),
            r"causal=True needs sequences \(spatial_dims=1\), got "
            r"spatial_dims=2",
        ),
        (
            lambda: AFTFull(8, causal=True, spatial_dims=1, stride=2),
            "causal=True needs stride=1, got stride=2",
        ),
        (
            lambda: AFTConv(8, heads=2, causal=True, spatial_dims=1),
            r"AFTConv has no causal form \(its window looks both ways\): use AFTLocal, AFTFull or "
            r"AFTSimple",
        ),
    ],
)
def test_bad_arguments_name_the_value(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_bad_inputs_name_the_value():
    with pytest.raises(ValueError, match=r"input size \(5, 3\) exceeds max_size=4"):
        AFTFull(8, max_size=4)(torch.randn(1, 8, 5, 3))
    with pytest.raises(ValueError, match=r"input size \(9,\) exceeds max_size=8"):
        AFTLocal(8, window_size=2, max_size=8, spatial_dims=1)(torch.randn(1, 8, 9))
    with pytest.raises(
        ValueError,
        match=r"AFTConv\(spatial_dims=2\) expects a \(B, C, H, W\) "
        r"tensor, got shape \(8, 5, 5\)",
    ):
        AFTConv(8, heads=2)(torch.randn(8, 5, 5))
    with pytest.raises(ValueError, match="AFTSimple expects 8 input channels, got 6"):
        AFTSimple(8)(torch.randn(1, 6, 5, 5))
    with pytest.raises(ValueError, match=r"position_bias must have shape \(4, 4\) .* got \(4, 5\)"):
        aft_mix(*torch.randn(3, 1, 2, 4), torch.zeros(4, 5))
    with pytest.raises(
        ValueError,
        match=r"kernel must have shape \(heads=2, s, ...\) with 2 odd "
        r"window sizes, got \(2, 4, 3\)",
    ):
        aft_conv_mix(
            torch.randn(1, 2, 3, 5, 5),
            torch.randn(1, 2, 5, 5),
            torch.randn(1, 2, 3, 5, 5),
            torch.zeros(2, 4, 3),
        )
    with pytest.raises(
        ValueError,
        match=r"keys must have the values' shape \(B, C, T\) = "
        r"\(1, 2, 4\), got \(1, 2, 5\)",
    ):
        aft_mix(torch.randn(1, 2, 4), torch.randn(1, 2, 5), torch.randn(1, 2, 4))
    with pytest.raises(
        ValueError,
        match=r"keys must have shape \(B, heads, ...\) = \(1, 2, 5, 5\) "
        r"\(one channel per head\), got \(1, 3, 5, 5\)",
    ):
        aft_conv_mix(
            torch.randn(1, 2, 3, 5, 5),
            torch.randn(1, 3, 5, 5),
            torch.randn(1, 2, 3, 5, 5),
            torch.zeros(2, 3, 3),
        )
    with pytest.raises(ValueError, match=r"queries must have the values' shape"):
        aft_conv_mix(
            torch.randn(1, 2, 4, 5, 5),
            torch.randn(1, 2, 5, 5),
            torch.randn(1, 2, 3, 5, 5),
            torch.zeros(2, 3, 3),
        )


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (AFTConv, dict(heads=2, window_size=3)),
        (AFTFull, dict(max_size=8, position_dim=4)),
    ],
)
def test_jit_trace_matches_eager(cls, kwargs):
    layer = randomize(cls(8, **kwargs)).eval()
    x = torch.randn(1, 8, 6, 5)
    traced = torch.jit.trace(layer, (x,))
    torch.testing.assert_close(traced(x), layer(x))


def scripted_and_reloaded(layer: torch.nn.Module) -> torch.jit.ScriptModule:
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(layer), buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


@pytest.mark.parametrize("case", sorted(CASES))
def test_torchscript_equals_eager_forward_and_gradients(case):
    """torch.jit.script compiles every variant into a saveable module with the eager parameter
    names and eager's outputs bit for bit. Gradients to rounding: from its second call on,
    TorchScript's executor differentiates parts of the optimised graph with its own autodiff
    formulas (not eager autograd's), which round differently."""
    cls, kwargs, shape = CASES[case]
    layer = make(cls, in_channels=shape[1], **kwargs)
    scripted = scripted_and_reloaded(layer)
    assert [name for name, _ in scripted.named_parameters()] == [
        name for name, _ in layer.named_parameters()
    ]
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    expected = layer(x)
    expected_gradients = gradients(expected, [x, *layer.parameters()])
    for _ in range(2):  # the first call profiles the graph, the second runs it optimised
        actual = scripted(x)
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)
        for got, want in zip(gradients(actual, [x, *scripted.parameters()]), expected_gradients):
            if want is None:
                assert got is None
            else:
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "factory,shape,message",
    [
        (lambda: AFTFull(8, max_size=4), (1, 8, 5, 3), r"input size \(5, 3\) exceeds max_size=4"),
        (
            lambda: AFTLocal(8, window_size=2, max_size=8, spatial_dims=1),
            (1, 8, 9),
            r"AFTLocal: input size \(9,\) exceeds max_size=8",
        ),
        (
            lambda: AFTConv(8, heads=2),
            (8, 5, 5),
            r"AFTConv\(spatial_dims=2\) expects a \(B, C, H, W\) tensor, got shape \(8, 5, 5\)",
        ),
        (lambda: AFTSimple(8), (1, 6, 5, 5), "AFTSimple expects 8 input channels, got 6"),
    ],
)
def test_torchscript_checks_its_input(factory, shape, message):
    """A scripted layer gives the eager error (as TorchScript's exception type)."""
    layer, x = factory(), torch.randn(shape)
    with pytest.raises(ValueError, match=message):
        layer(x)
    with pytest.raises(torch.jit.Error, match=message):
        torch.jit.script(layer)(x)


def test_smallest_normal_is_finfo_tiny():
    for dtype in (torch.float32, torch.float64):
        assert smallest_normal(dtype) == torch.finfo(dtype).tiny


def test_each_variant_shows_its_options():
    assert [
        layer.extra_repr()
        for layer in (
            AFTFull(8),
            AFTLocal(8, 4, window_size=3),
            AFTSimple(8, causal=True, spatial_dims=1),
            AFTConv(8, heads=2, stride=2),
        )
    ] == [
        "8, 8, hidden_dim=8, max_size=64, position_dim=128, causal=False, stride=1, spatial_dims=2",
        "8, 4, hidden_dim=4, window_size=3, max_size=64, position_dim=128, causal=False, "
        "stride=1, spatial_dims=2",
        "8, 8, hidden_dim=8, causal=True, stride=1, spatial_dims=1",
        "8, 8, hidden_dim=8, heads=2, window_size=7, stride=2, spatial_dims=2",
    ]
