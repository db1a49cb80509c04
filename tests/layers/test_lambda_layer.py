"""The lambda layer against a direct transcription of the paper's equations, and its properties."""

import itertools
import math

import pytest
import torch

from lambda_det.compat import torch_features
from lambda_det.layers import IMPLEMENTATIONS, LambdaLayer, RelativePositionEmbedding


def reference_lambda_layer(layer: LambdaLayer, x: torch.Tensor, context_mask=None) -> torch.Tensor:
    """The paper's equations with loops: every query's lambda is built explicitly.

    lambda_n = sum_{m in C_n} softmax_{C_n}(K)[m] V[m]^T + sum_{m in C_n} R[pos(m) - pos(n)] V[m]^T,
    y[n, h] = lambda_n^T q[n, h]; R[offset] counts only within the scope (every offset if global).
    """
    batch, spatial = x.shape[0], tuple(x.shape[2:])
    n = math.prod(spatial)
    h, k, u, v = layer.heads, layer.dim_k, layer.dim_u, layer.dim_v
    queries = layer.query_norm(layer.to_queries(x)).reshape(batch, h, k, n)
    keys = layer.to_keys(x).reshape(batch, k, u, n)
    values = layer.value_norm(layer.to_values(x)).reshape(batch, v, u, n)
    table, radius = layer.position_embedding.weight, layer.position_embedding.radius
    reach = radius if layer.scope is None else layer.scope // 2
    positions = list(itertools.product(*[range(size) for size in spatial]))
    outputs = []
    for b in range(batch):
        per_query = []
        for query, query_position in enumerate(positions):
            context = [m for m in range(n) if context_mask is None or context_mask[query, m]]
            normalized_keys = torch.softmax(keys[b][:, :, context], dim=-1)  # k u |C|
            lambda_n = torch.zeros(k, v, dtype=x.dtype)
            for j, m in enumerate(context):
                lambda_n = lambda_n + normalized_keys[:, :, j] @ values[b][:, :, m].T
                offset = [pm - pq for pm, pq in zip(positions[m], query_position)]
                if all(abs(o) <= reach for o in offset):
                    embedding = table[
                        (slice(None), slice(None)) + tuple(o + radius for o in offset)
                    ]
                    lambda_n = lambda_n + embedding @ values[b][:, :, m].T  # (k u) @ (u v)
            per_query.append(
                torch.stack([lambda_n.T @ queries[b, head, :, query] for head in range(h)])
            )  # h v
        outputs.append(torch.stack(per_query, dim=-1))  # h v n
    output = torch.stack(outputs).reshape(batch, h * v, *spatial)
    return layer.pool(output)


def gradients(output: torch.Tensor, inputs) -> list:
    generator = torch.Generator().manual_seed(123)
    # Not randn_like: it follows the output's strides, which differ between implementations.
    weights = torch.randn(output.shape, dtype=output.dtype, generator=generator)
    return torch.autograd.grad((output * weights).sum(), inputs)


CASES = {
    # name: (layer kwargs, input shape)
    "local_HneW": (dict(heads=2, dim_k=3, scope=3), (2, 4, 5, 7)),
    "local_u2_smaller_than_scope": (dict(heads=2, dim_k=2, dim_u=2, scope=5), (2, 4, 3, 4)),
    "local_u3_stride2_odd": (dict(heads=2, dim_k=2, dim_u=3, scope=3, stride=2), (2, 4, 5, 3)),
    "local_1x1": (dict(heads=2, dim_k=2, dim_u=2, scope=7), (2, 4, 1, 1)),
    "global_u2": (dict(heads=2, dim_k=2, dim_u=2, scope=None, max_size=7), (2, 4, 4, 6)),
    "global_stride2": (dict(heads=1, dim_k=3, scope=None, max_size=5, stride=2), (2, 3, 5, 4)),
    "sequence_local": (dict(heads=2, dim_k=2, dim_u=2, scope=5, spatial_dims=1), (2, 4, 9)),
    "sequence_global": (dict(heads=2, dim_k=3, scope=None, max_size=9, spatial_dims=1), (2, 4, 7)),
}


def make_layer(impl: str, dtype=torch.float64, **kwargs) -> LambdaLayer:
    torch.manual_seed(0)
    layer = LambdaLayer(
        kwargs.pop("in_channels", 4), kwargs.pop("out_channels", None), impl=impl, **kwargs
    ).to(dtype)
    # Non-trivial BN affine parameters, so a mix-up of queries and values would show.
    with torch.no_grad():
        for norm in (layer.query_norm, layer.value_norm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return layer


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_paper_reference_forward_and_gradients(impl, case):
    kwargs, shape = CASES[case]
    layer = make_layer(impl, in_channels=shape[1], **kwargs)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    inputs = [x] + list(layer.parameters())
    expected = reference_lambda_layer(layer, x)
    actual = layer(x)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)
    for got, want in zip(gradients(actual, inputs), gradients(expected, inputs)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("spatial_dims,shape", [(1, (2, 4, 7)), (2, (2, 4, 3, 3))])
def test_masked_layer_matches_reference(spatial_dims, shape):
    layer = make_layer("einsum", heads=2, dim_k=2, dim_u=2, scope=3, spatial_dims=spatial_dims)
    n = math.prod(shape[2:])
    generator = torch.Generator().manual_seed(5)
    mask = torch.rand(n, n, generator=generator) < 0.5
    mask |= torch.eye(n, dtype=torch.bool)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    inputs = [x] + list(layer.parameters())
    expected = reference_lambda_layer(layer, x, mask)
    actual = layer(x, context_mask=mask)
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)
    for got, want in zip(gradients(actual, inputs), gradients(expected, inputs)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_all_true_mask_equals_unmasked_global_layer():
    layer = make_layer("einsum", heads=2, dim_k=2, scope=None, max_size=6)
    x = torch.randn(2, 4, 4, 6, dtype=torch.float64)
    full = torch.ones(24, 24, dtype=torch.bool)
    torch.testing.assert_close(layer(x, context_mask=full), layer(x), rtol=1e-12, atol=1e-12)


def test_causal_mask_hides_the_future():
    layer = make_layer("auto", heads=2, dim_k=4, dim_u=2, scope=5, spatial_dims=1).eval()
    length, cut = 10, 6
    causal = torch.ones(length, length).tril().bool()  # query n sees m <= n
    x = torch.randn(1, 4, length, dtype=torch.float64)
    changed = x.clone()
    changed[..., cut:] += torch.randn_like(changed[..., cut:]) * 3
    before, after = layer(x, context_mask=causal), layer(changed, context_mask=causal)
    assert torch.equal(before[..., :cut], after[..., :cut])
    assert not torch.allclose(before[..., cut:], after[..., cut:])
    # Without the mask the future leaks into the past, so the check above can fail.
    assert not torch.allclose(layer(x)[..., :cut], layer(changed)[..., :cut])


@pytest.mark.parametrize("shape", [(2, 4, 6, 7), (2, 4, 2, 9)])
def test_lambda_convolution_equals_global_form_with_zeroed_embeddings(shape):
    local = make_layer("conv", heads=2, dim_k=2, dim_u=2, scope=3)
    size = max(shape[2:])
    global_layer = make_layer("einsum", heads=2, dim_k=2, dim_u=2, scope=None, max_size=size)
    state = {
        key: value
        for key, value in local.state_dict().items()
        if not key.startswith("position_embedding")
    }
    global_layer.load_state_dict(state, strict=False)
    radius = size - 1
    with torch.no_grad():
        global_layer.position_embedding.weight.zero_()
        global_layer.position_embedding.weight[
            :, :, radius - 1 : radius + 2, radius - 1 : radius + 2
        ] = local.position_embedding.weight
    x = torch.randn(shape, dtype=torch.float64)
    torch.testing.assert_close(local(x), global_layer(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_position_term_is_translation_equivariant(impl):
    layer = make_layer(impl, heads=2, dim_k=3, scope=5).eval()
    with torch.no_grad():
        layer.to_keys.weight.zero_()  # uniform keys: the content term is the plain mean of V
        layer.value_norm.bias.zero_()  # V = 0 wherever the input is 0, like the zero padding
    pattern = torch.randn(1, 4, 3, 3, dtype=torch.float64)
    first = torch.zeros(1, 4, 16, 16, dtype=torch.float64)
    second = torch.zeros_like(first)
    first[..., 3:6, 4:7] = pattern
    second[..., 8:11, 9:12] = pattern  # the same pattern moved by (5, 5)
    # Same content lambda for both inputs, so any difference would come from the position term.
    out_first, out_second = layer(first), layer(second)
    torch.testing.assert_close(
        out_first[..., 1:8, 2:9], out_second[..., 6:13, 7:14], rtol=1e-12, atol=1e-12
    )
    assert not torch.allclose(out_first[..., 1:8, 2:9], out_second[..., 1:8, 2:9])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_content_term_alone(impl):
    layer = make_layer(impl, heads=2, dim_k=3, dim_u=2, scope=3)
    with torch.no_grad():
        layer.position_embedding.weight.zero_()
    x = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    b, n = 2, 15
    q = layer.query_norm(layer.to_queries(x)).reshape(b, 2, 3, n)
    k = layer.to_keys(x).reshape(b, 3, 2, n).softmax(dim=-1)
    v = layer.value_norm(layer.to_values(x)).reshape(b, layer.dim_v, 2, n)
    content_lambda = sum(k[:, :, i] @ v[:, :, i].transpose(1, 2) for i in range(2))  # b k v
    expected = torch.einsum("bkv,bhkn->bhvn", content_lambda, q).reshape(b, 4, 3, 5)
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    # Permuting the context permutes the queries with it but leaves the lambda unchanged.
    permutation = torch.randperm(n)
    shuffled = x.flatten(2)[..., permutation].reshape(x.shape)
    torch.testing.assert_close(
        layer(shuffled).flatten(2), layer(x).flatten(2)[..., permutation], rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_bf16_autocast_close_to_fp32(impl):
    layer = make_layer(impl, dtype=torch.float32, in_channels=32, heads=4, scope=5).eval()
    x = torch.randn(2, 32, 12, 10)
    expected = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        actual = layer(x)
    assert actual.dtype == torch.float32
    # Stated tolerance: bf16 projections (8-bit mantissa) -> a few percent relative error.
    relative = (actual - expected).norm() / expected.norm()
    assert relative < 3e-2, relative


def test_fp16_autocast_large_inputs_stay_finite_and_close():
    # The lambdas are summed in float32: in float16 this output (|y| up to ~1e5) would overflow.
    layer = make_layer("auto", dtype=torch.float32, in_channels=16, heads=4, scope=5).eval()
    x = torch.randn(1, 16, 9, 9) * 100
    expected = layer(x)
    assert expected.abs().max() > torch.finfo(torch.float16).max
    with torch.autocast("cpu", dtype=torch.float16):
        out = layer(x)
    assert torch.isfinite(out).all()
    relative = (out - expected).norm() / expected.norm()
    assert relative < 1e-2, relative  # fp16 projections: 11-bit mantissa


def test_auto_picks_einsum_for_small_inputs_and_tiled_above():
    local = LambdaLayer(8, heads=2, dim_k=4)  # scope 23: 4 x 4 tiles see 26 x 26 halos
    assert local.resolve_impl((14, 14)) == "einsum"  # 196 <= 676 / 3
    assert local.resolve_impl((16, 16)) == "tiled"
    assert local.resolve_impl((7, 7)) == "einsum"  # radius cropped to 6: 16 x 16 halos
    assert local.resolve_impl((64, 64)) == "tiled"
    assert LambdaLayer(8, heads=2, spatial_dims=1).resolve_impl((64,)) == "tiled"
    global_layer = LambdaLayer(8, heads=2, scope=None, max_size=64)
    assert global_layer.resolve_impl((29, 29)) == "einsum"  # 841 <= 852 < C / 3
    assert global_layer.resolve_impl((30, 30)) == "tiled"
    assert LambdaLayer(8, heads=2, impl="conv").resolve_impl((4, 4)) == "conv"
    # On a GPU, small inputs are launch bound, and cuDNN's one conv launches least.
    assert local.resolve_impl((20, 20), "cuda") == "conv"
    assert local.resolve_impl((21, 21), "cuda") == "tiled"
    assert LambdaLayer(8, heads=2, spatial_dims=1).resolve_impl((4096,), "cuda") == "conv"


def test_state_dict_moves_between_implementations():
    einsum = make_layer("einsum", heads=2, dim_k=2, dim_u=2, scope=3)
    conv = LambdaLayer(4, heads=2, dim_k=2, dim_u=2, scope=3, impl="conv").double()
    assert list(einsum.state_dict()) == list(conv.state_dict())
    conv.load_state_dict(einsum.state_dict())
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    einsum.eval(), conv.eval()
    torch.testing.assert_close(conv(x), einsum(x), rtol=1e-12, atol=1e-12)


def test_shared_embedding_is_one_parameter():
    shared = RelativePositionEmbedding(dim_k=4, dim_u=1, radius=2)
    model = torch.nn.Sequential(
        LambdaLayer(8, heads=2, dim_k=4, scope=5, position_embedding=shared),
        LambdaLayer(8, heads=2, dim_k=4, scope=5, position_embedding=shared),
    )
    assert model[0].position_embedding.weight is model[1].position_embedding.weight
    unshared = torch.nn.Sequential(
        LambdaLayer(8, heads=2, dim_k=4, scope=5), LambdaLayer(8, heads=2, dim_k=4, scope=5)
    )
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(p.numel() for p in unshared.parameters()) - shared.weight.numel()
    model(torch.randn(2, 8, 6, 6)).sum().backward()
    assert shared.weight.grad is not None and shared.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(scope=4), "scope must be an odd integer >= 1.*got 4"),
        (dict(scope=0), "got 0"),
        (dict(out_channels=10, heads=4), "out_channels=10 is not divisible by heads=4"),
        (dict(dim_k=0), "dim_k must be an integer >= 1, got 0"),
        (dict(dim_u=0), "dim_u must be an integer >= 1, got 0"),
        (dict(stride=3), "stride must be 1 or 2, got 3"),
        (dict(impl="fast"), "impl must be .* got 'fast'"),
        (dict(position_embedding=RelativePositionEmbedding(8, 1, 11)), "dim_k=8, but .* dim_k=16"),
        (dict(position_embedding=RelativePositionEmbedding(16, 2, 11)), "dim_u=2, but .* dim_u=1"),
        (
            dict(position_embedding=RelativePositionEmbedding(16, 1, 3)),
            "radius=3, but .* radius=11",
        ),
        (
            dict(scope=None, max_size=64, position_embedding=RelativePositionEmbedding(16, 1, 3)),
            "radius=3, but this global layer with max_size=64 needs offsets up to 63",
        ),
        (dict(scope=True), "scope must be an odd integer >= 1.*got True"),
        (dict(stride=True), "stride must be 1 or 2, got True"),
        (dict(heads=True), "heads must be an integer >= 1, got True"),
    ],
)
def test_bad_arguments_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LambdaLayer(8, **kwargs)


def test_bad_inputs_name_the_value():
    layer = LambdaLayer(8, heads=2, dim_k=4)
    with pytest.raises(ValueError, match=r"expects a \(B, C, H, W\) tensor, got shape \(8, 5, 5\)"):
        layer(torch.randn(8, 5, 5))
    with pytest.raises(ValueError, match="expects 8 input channels, got 6"):
        layer(torch.randn(1, 6, 5, 5))
    small_global = LambdaLayer(8, heads=2, dim_k=4, scope=None, max_size=4)
    with pytest.raises(ValueError, match=r"input size \(5, 3\) exceeds the 4 positions"):
        small_global(torch.randn(1, 8, 5, 3))
    with pytest.raises(ValueError, match=r"context_mask must have shape \(25, 25\)"):
        layer(torch.randn(1, 8, 5, 5), context_mask=torch.ones(5, 5, dtype=torch.bool))
    empty_row = torch.eye(4, dtype=torch.bool)
    empty_row[2, 2] = False
    with pytest.raises(ValueError, match="context_mask row 2 is empty"):
        layer(torch.randn(1, 8, 2, 2), context_mask=empty_row)


def test_init_follows_the_paper():
    layer = LambdaLayer(256, 128, heads=4, dim_k=16, dim_u=2, scope=23)  # fan-in 256, not 128
    d = 256
    assert layer.to_queries.weight.std().item() == pytest.approx((16 * d) ** -0.5, rel=0.05)
    assert layer.to_keys.weight.std().item() == pytest.approx(d**-0.5, rel=0.05)
    assert layer.to_values.weight.std().item() == pytest.approx(d**-0.5, rel=0.05)
    assert layer.position_embedding.weight.std().item() == pytest.approx(1.0, rel=0.05)
    assert layer.position_embedding.weight.mean().abs().item() < 0.05
    assert not any(
        conv.bias is not None for conv in (layer.to_queries, layer.to_keys, layer.to_values)
    )


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_empty_batch_gives_an_empty_output(impl, stride):
    layer = make_layer(
        impl, dtype=torch.float32, in_channels=8, heads=2, dim_k=4, scope=5, stride=stride
    )
    x = torch.randn(0, 8, 6, 5, requires_grad=True)
    out = layer(x)
    assert out.shape == ((0, 8, 6, 5) if stride == 1 else (0, 8, 3, 3))
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_trace_checks_the_example_input():
    # A trace skips nothing: an oversized example must not export a truncated global layer.
    small_global = LambdaLayer(8, heads=2, dim_k=4, scope=None, max_size=4).eval()
    with pytest.raises(ValueError, match=r"input size \(6, 6\) exceeds the 4 positions"):
        torch.jit.trace(small_global, torch.randn(1, 8, 6, 6), check_trace=False)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_jit_trace_matches_eager(impl):
    layer = make_layer(impl, dtype=torch.float32, in_channels=8, heads=2, dim_k=4, scope=3).eval()
    x = torch.randn(1, 8, 6, 5)
    traced = torch.jit.trace(layer, (x,))
    torch.testing.assert_close(traced(x), layer(x))


@pytest.mark.parametrize("impl", ["auto", "einsum", "conv"])
@pytest.mark.parametrize("scope", [7, None])
@pytest.mark.parametrize("stride", [1, 2])
def test_jit_trace_runs_at_other_sizes(impl, scope, stride):
    """Export traces once: the trace must hold at sizes it was not traced at, including axes
    shorter than the scope's radius in the example but not in the input, and the other way."""
    layer = LambdaLayer(
        8, heads=2, dim_k=4, scope=scope, stride=stride, impl=impl, max_size=16
    ).eval()
    traced = torch.jit.trace(layer, torch.randn(1, 8, 3, 6), check_trace=False)
    for shape in [(2, 8, 9, 7), (1, 8, 16, 4), (1, 8, 2, 2)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(traced(x), layer(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "options",
    [
        dict(scope=3),
        dict(scope=None, stride=2, max_size=8),
        dict(scope=3, spatial_dims=1),
        dict(scope=5, stride=2, position_embedding=RelativePositionEmbedding(4, 2, 2)),
    ],
    ids=["local", "global_stride2", "sequence", "shared_embedding_stride2"],
)
@pytest.mark.parametrize("impl", ("auto",) + IMPLEMENTATIONS)
def test_torchscript_under_bf16_autocast_is_eager_to_bf16_rounding(impl, options):
    """TorchScript cannot turn autocast off (module docstring): a scripted layer under CPU
    bfloat16 autocast runs its "conv" form with its lambdas in bfloat16. Stated tolerance: output
    and input gradient within 2 bfloat16 epsilons (2^-6) of the largest magnitude of eager's, the
    same layer under the same autocast."""
    layer = LambdaLayer(16, heads=2, dim_k=4, dim_u=2, impl=impl, **options).eval()
    scripted = torch.jit.script(layer)
    x = torch.randn(2, 16, *([8] * layer.spatial_dims), requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layer(x)
        expected_gradient = gradients(expected, [x])[0]
        for _ in range(2):  # the first call profiles the graph, the second runs it optimised
            actual = scripted(x)
            assert actual.dtype == torch.float32
            for got, want in ((actual, expected), (gradients(actual, [x])[0], expected_gradient)):
                tolerance = 2 * torch.finfo(torch.bfloat16).eps * want.abs().max().item()
                torch.testing.assert_close(got, want, rtol=0, atol=tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["einsum", "conv"])
def test_gradients_at_batch_1_are_right_eager_and_compiled(impl, monkeypatch):
    """At batch 1, torch's CPU batch norm backward errs on the strided gradient the einsums hand
    the normalised values (torch_features.contiguous_gradient_at_batch_1 makes it contiguous):
    with the workaround eager passes gradcheck in float64 and torch.compile's decomposed graph
    gives eager's gradients; without it, eager fails gradcheck (the negative control)."""
    layer = make_layer(impl, in_channels=8, heads=2, dim_k=4, scope=3)
    x = torch.randn(1, 8, 6, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))
    inputs = [x, *layer.parameters()]
    expected = gradients(layer(x), inputs)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager_decomp_partition")
    for got, want in zip(gradients(compiled(x), inputs), expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    torch._dynamo.reset()
    monkeypatch.setattr(torch_features, "contiguous_gradient_at_batch_1", lambda tensor: tensor)
    assert not torch.autograd.gradcheck(layer, (x,), raise_exception=False)


@pytest.mark.slow
def test_torch_compile_matches_eager():
    """Inductor's kernels, forward and backward, of the "einsum" and "conv" forms ("tiled": tests/
    layers/test_lambda_conv.py), in float64, where only the code's differences show. (The
    compiled backbone's graphs: tests/modeling/test_mixed_precision_and_compile.py.)"""
    model = torch.nn.Sequential(
        make_layer("conv", in_channels=8, heads=2, dim_k=4, scope=3),
        make_layer("einsum", in_channels=8, heads=2, dim_k=4, scope=3),
    )
    x = torch.randn(2, 8, 6, 5, dtype=torch.float64, requires_grad=True)
    inputs = [x, *model.parameters()]
    expected = model(x)
    expected_grads = gradients(expected, inputs)
    actual = torch.compile(model)(x)
    torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-10)
    for got, want in zip(gradients(actual, inputs), expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)
