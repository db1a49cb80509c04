"""The tiled lambda convolution against the conv form, beyond the layer's paper-reference tests.

tests/layers/test_lambda_layer.py runs every implementation through the paper's equations on small
layers; these tests cover what only the tiled kernel has: chunking, tile shapes, the two ways of
folding halo gradients, what it keeps for backward, and torch.compile with a backward pass.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import lambda_det.layers.lambda_conv as lambda_conv
from lambda_det.layers import LambdaLayer
from lambda_det.layers.lambda_conv import TiledTuning, tiled_position_output


def conv_form(queries, values, window, spatial):
    """The paper's order: position lambdas as a convolution of V with R, then the queries."""
    batch, heads, dim_k, n = queries.shape
    dim_v, dim_u = values.shape[1:3]
    radii = [(width - 1) // 2 for width in window.shape[2:]]
    conv = F.conv2d if len(spatial) == 2 else F.conv1d
    lambdas = conv(values.reshape(batch * dim_v, dim_u, *spatial), window, padding=radii)
    return torch.einsum("bhkn,bvkn->bhvn", queries, lambdas.reshape(batch, dim_v, dim_k, n))


def random_inputs(spatial, radii, heads=3, dim_k=4, dim_v=5, dim_u=1, batch=2, dtype=torch.float64):
    generator = torch.Generator().manual_seed(1)
    n = math.prod(spatial)

    def normal(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).requires_grad_()

    return (
        normal(batch, heads, dim_k, n),
        normal(batch, dim_v, dim_u, n),
        normal(dim_k, dim_u, *[2 * radius + 1 for radius in radii]),
    )


def pooled_conv_form(queries, values, window, spatial):
    """conv_form, then the strided lambda layer's average pool (3 wide, stride 2, padding 1)."""
    batch, heads, dim_v = queries.shape[0], queries.shape[1], values.shape[1]
    pool = F.avg_pool2d if len(spatial) == 2 else F.avg_pool1d
    output = conv_form(queries, values, window, spatial).reshape(batch, heads * dim_v, *spatial)
    return pool(output, 3, 2, 1).reshape(batch, heads, dim_v, -1)


def assert_matches_conv_form(
    spatial, radii, dim_u=1, tile=(), chunk_elements=0, stride=1, fold_in_groups=None, **tolerance
):
    queries, values, window = random_inputs(spatial, radii, dim_u=dim_u)
    expected = (conv_form if stride == 1 else pooled_conv_form)(queries, values, window, spatial)
    tuning = TiledTuning(
        tile=tile if stride == 1 else (),
        pooled_tile=tile if stride == 2 else (),
        chunk_elements=chunk_elements,
        fold_in_groups=fold_in_groups,
    )
    actual = tiled_position_output(queries, values, window, spatial, stride, tuning)
    torch.testing.assert_close(actual, expected, **tolerance)
    weights = torch.randn(
        expected.shape, generator=torch.Generator().manual_seed(2), dtype=expected.dtype
    )
    inputs = (queries, values, window)
    for got, want in zip(
        torch.autograd.grad((actual * weights).sum(), inputs),
        torch.autograd.grad((expected * weights).sum(), inputs),
    ):
        torch.testing.assert_close(got, want, **tolerance)


GEOMETRIES = {
    # name: (spatial, radii, dim_u, tile, chunk_elements); chunk_elements=1 forces one tile row
    # per chunk, 0 the default (here: every image in one chunk).
    "tile_does_not_divide": ((7, 5), (2, 1), 1, (3, 2), 0),
    "row_chunks_u2": ((9, 11), (3, 3), 2, (4, 4), 1),
    "map_smaller_than_tile": ((3, 2), (2, 1), 1, (4, 4), 0),
    "rectangular_tile_row_chunks": ((12, 10), (3, 2), 1, (4, 3), 1),
    "two_rows_per_chunk": ((8, 8), (2, 2), 1, (2, 2), 2 * 3 * 4 * 4 * 36),
    "sequence_row_chunks_u2": ((13,), (4,), 2, (5,), 1),
    "sequence_default_tile": ((40,), (11,), 1, (), 0),
}

# Stride 2 (the pool folded into the tiles): tile and chunk are in pooled outputs.
POOLED_GEOMETRIES = {
    "odd_sizes_tile_does_not_divide": ((9, 7), (2, 1), 1, (2, 3), 0),
    "even_sizes_row_chunks_u2": ((10, 12), (3, 3), 2, (2, 2), 1),
    "map_smaller_than_scope": ((3, 4), (2, 3), 1, (), 0),
    "one_row": ((1, 6), (0, 2), 1, (2, 2), 0),
    "sequence_row_chunks_u2": ((15,), (4,), 2, (3,), 1),
    "sequence_default_tile": ((41,), (11,), 1, (), 0),
}


@pytest.mark.parametrize("fold_in_groups", [True, False], ids=["grouped_fold", "unfold_backward"])
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_tiled_equals_conv_form(name, fold_in_groups):
    # The GPU folds halo gradients with unfold_backward; the CPU adds groups of tiles. Both here.
    spatial, radii, dim_u, tile, chunk_elements = GEOMETRIES[name]
    assert_matches_conv_form(
        spatial,
        radii,
        dim_u,
        tile,
        chunk_elements,
        fold_in_groups=fold_in_groups,
        rtol=1e-10,
        atol=1e-10,
    )


@pytest.mark.parametrize("fold_in_groups", [True, False], ids=["grouped_fold", "unfold_backward"])
@pytest.mark.parametrize("name", sorted(POOLED_GEOMETRIES))
def test_pooled_tiles_equal_conv_form_then_average_pool(name, fold_in_groups):
    spatial, radii, dim_u, tile, chunk_elements = POOLED_GEOMETRIES[name]
    assert_matches_conv_form(
        spatial,
        radii,
        dim_u,
        tile,
        chunk_elements,
        stride=2,
        fold_in_groups=fold_in_groups,
        rtol=1e-10,
        atol=1e-10,
    )


def test_float32_stays_within_1e4_of_float64_at_detection_depths():
    # k=16, h=4, a full 23 x 23 scope: the sums are as long as in a LambdaResNet's c4 stage.
    spatial, radii = (26, 30), (11, 11)
    queries, values, window = random_inputs(spatial, radii, heads=4, dim_k=16, dim_v=16)
    expected = tiled_position_output(queries, values, window, spatial)
    inputs32 = [t.detach().float().requires_grad_() for t in (queries, values, window)]
    actual = tiled_position_output(*inputs32, spatial)
    assert ((actual.double() - expected).norm() / expected.norm()) < 1e-4
    weights = torch.randn(expected.shape, dtype=torch.float64)
    for got, want in zip(
        torch.autograd.grad((actual * weights.float()).sum(), inputs32),
        torch.autograd.grad((expected * weights).sum(), (queries, values, window)),
    ):
        assert ((got.double() - want).norm() / want.norm()) < 1e-4


def test_backward_keeps_inputs_not_logits():
    """Only the queries, values and embeddings are saved; the logits are rebuilt in backward."""
    spatial, radii, heads, dim_k, dim_v = (64, 64), (11, 11), 4, 16, 16
    queries, values, window = random_inputs(spatial, radii, heads, dim_k, dim_v)
    saved = {}

    def pack(tensor):
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        tiled_position_output(queries, values, window, spatial)
    inputs = sum(t.numel() * t.element_size() for t in (queries, values, window))
    tile = lambda_conv.DEFAULT_TILE[2]
    halo_entries = math.prod(t + 2 * r for t, r in zip(tile, radii))
    block = heads * math.prod(tile) * dim_k * halo_entries * 8
    logits = 2 * heads * math.prod(spatial) * halo_entries * 8
    # The inputs re-laid out and zero padded, the (h T, k, C) embedding block and its index.
    assert sum(saved.values()) < 2 * inputs + 1.1 * block
    assert sum(saved.values()) < logits / 10


@pytest.mark.parametrize(
    "kwargs,shape",
    [
        (dict(scope=5), (2, 8, 9, 7)),
        (dict(scope=5, stride=2), (2, 8, 9, 6)),
        (dict(scope=7, dim_u=2, spatial_dims=1), (2, 8, 19)),
    ],
)
def test_jit_trace_is_differentiable(kwargs, shape):
    # Traces build the halos with a gather instead of unfold (ONNX export needs that).
    layer = LambdaLayer(8, heads=2, dim_k=4, impl="tiled", **kwargs).double().eval()
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    traced = torch.jit.trace(layer, (x,))
    expected = torch.autograd.grad(layer(x).square().sum(), x)[0]
    torch.testing.assert_close(torch.autograd.grad(traced(x).square().sum(), x)[0], expected)


@pytest.fixture
def fresh_dynamo():
    """Compiled-code caches are per process: keep other tests' compilations out of this one's."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow
def test_torch_compile_forward_and_backward_match_eager(fresh_dynamo):
    """Inductor's kernels of the tiled form at stride 2: the tiles' code with J = 3^dims pooled
    neighbours, of which stride 1 is the case J = 1 (each case costs seconds of compiling)."""
    torch.manual_seed(0)
    layer = LambdaLayer(8, heads=2, dim_k=4, dim_u=2, scope=5, stride=2, impl="tiled")
    x = torch.randn(2, 8, 9, 7, requires_grad=True)
    parameters = [x] + list(layer.parameters())
    expected = layer(x)
    expected_grads = torch.autograd.grad(expected.square().sum(), parameters)
    actual = torch.compile(layer)(x)
    actual_grads = torch.autograd.grad(actual.square().sum(), parameters)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    for got, want in zip(actual_grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_index_cached_under_inference_mode_still_trains():
    """The embedding index is cached; one first built in inference_mode must not poison training."""
    lambda_conv._cached_embedding_index.cache_clear()
    layer = LambdaLayer(8, heads=2, dim_k=4, scope=7, impl="tiled")
    with torch.inference_mode():
        layer.eval()(torch.randn(1, 8, 11, 9))
    x = torch.randn(2, 8, 11, 9, requires_grad=True)
    layer.train()(x).sum().backward()
    assert x.grad is not None and layer.position_embedding.weight.grad is not None


def _bad_tiled_arguments():
    queries, values, window = random_inputs((5, 4), (1, 1), heads=2, dim_k=3, dim_u=2)
    return {
        "even window": (
            dict(window=torch.randn(3, 2, 4, 3)),
            r"window must be \(k=3, u=2\) "
            r"followed by 2 odd sizes, got \(3, 2, 4, 3\)",
        ),
        "window's u": (dict(window=torch.randn(3, 1, 3, 3)), r"got \(3, 1, 3, 3\)"),
        "spatial vs n": (dict(spatial=(5, 5)), r"queries must be \(b, h, k, n\) with n = 25"),
        "values' batch": (dict(values=values[:1]), r"values must be \(b, v, u, n\) with b = 2"),
        "zero tile": (
            dict(tuning=TiledTuning(tile=(0, 2))),
            r"tile must be 2 integers >= 1, got \(0, 2\)",
        ),
        "pooled tile's axes": (
            dict(stride=2, tuning=TiledTuning(pooled_tile=(2,))),
            r"pooled_tile must be 2 integers >= 1, got \(2,\)",
        ),
        "negative chunk": (
            dict(tuning=TiledTuning(chunk_elements=-5)),
            "chunk_elements must be an integer >= 0, got -5",
        ),
        "stride": (dict(stride=3), "stride must be 1 or 2, got 3"),
    }, dict(queries=queries, values=values, window=window, spatial=(5, 4))


@pytest.mark.parametrize("case", sorted(_bad_tiled_arguments()[0]))
def test_bad_arguments_name_the_value(case):
    cases, arguments = _bad_tiled_arguments()
    change, message = cases[case]
    with pytest.raises(ValueError, match=message):
        tiled_position_output(**{**arguments, **change})


def test_the_layer_runs_its_tuning():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 9, 7, dtype=torch.float64)
    default = LambdaLayer(8, heads=2, dim_k=4, scope=5, impl="tiled").double()
    expected = default(x)
    # The GPU's chunks and halo folding, on the CPU: the same function.
    gpu = LambdaLayer(
        8, heads=2, dim_k=4, scope=5, impl="tiled", tuning=TiledTuning.for_device("cuda")
    ).double()
    gpu.load_state_dict(default.state_dict())
    torch.testing.assert_close(gpu(x), expected, rtol=1e-12, atol=1e-12)
    broken = LambdaLayer(
        8, heads=2, dim_k=4, scope=5, impl="tiled", tuning=TiledTuning(tile=(0, 2))
    ).double()
    with pytest.raises(ValueError, match=r"tile must be 2 integers >= 1, got \(0, 2\)"):
        broken(x)
    # The "auto" rule's halo size C follows the tile: 15 x 15 = 225 positions <= C / 3 with 4 x 4
    # tiles (C = 26^2 at r = 23) choose "einsum", not with 1 x 1 tiles (C = 23^2).
    assert LambdaLayer(8, heads=2).resolve_impl((15, 15)) == "einsum"
    assert (
        LambdaLayer(8, heads=2, tuning=TiledTuning(tile=(1, 1))).resolve_impl((15, 15)) == "tiled"
    )
