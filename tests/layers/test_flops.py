"""fvcore counts every layer, in every implementation, as its analytic cost: no op skipped, no
module left uncalled, the total equal to the formula of the form the trace runs."""

import importlib
import logging
import math

import pytest
import torch
from fvcore.nn import FlopCountAnalysis

from lambda_det.layers import (
    AFTConv,
    AFTFull,
    AFTLocal,
    AFTSimple,
    LambdaLayer,
    eager_impls,
    flop_handles,
)
from lambda_det.layers.lambda_conv import DEFAULT_TILE, POOLED_TILE

fvcore_flop_count = importlib.import_module("fvcore.nn.flop_count")


def lambda_layer_flops(layer: LambdaLayer, shape, impl: str, masked: bool = False) -> int:
    """Multiply-adds of a LambdaLayer (paper Sec. 3, 4 and Table 2) on a ``shape`` input in eval
    mode, in the form ``impl`` computes them. n = m positions, d_in input channels.

    All forms: the projections b n d_in (h k + k u + v u) and the norms on Q and V (fvcore: a
    scale and a shift per entry). Then:
    * einsum: content lambda b m k u v, position lambdas b n m k u v (Theta(bnmkv)), outputs
      b n h k v twice (position, content);
    * conv: the position lambdas as a conv over V with the r x r kernel, b n k u v r^2
      (Theta(bnkv|r|)), otherwise as einsum; a trace keeps the whole kernel (with global
      context the whole table) to run at any size;
    * tiled: queries meet R first, per tile of T queries over its C-entry halo: b h P (k + v) C
      (P: positions padded to whole tiles); at stride 2 the 3^D neighbours of a pooled output are
      one query of depth 3^D k, and the pool of Q feeds the content output;
    * masked: a content lambda per query, b n m k u v, position lambdas, one output b n h k v;
    * stride 2 (but tiled): the 3^D average pool, one add per window entry of the output.
    """
    batch, d_in, *spatial = shape
    heads, dim_k, dim_u, dim_v = layer.heads, layer.dim_k, layer.dim_u, layer.dim_v
    n, dims = math.prod(spatial), len(spatial)
    limit = layer.position_embedding.radius if layer.scope is None else layer.scope // 2
    radii = [min(limit, size - 1) for size in spatial]
    pooled = [(size + 1) // 2 for size in spatial] if layer.stride == 2 else spatial
    window = 3**dims
    flops = batch * n * d_in * (heads * dim_k + dim_k * dim_u + dim_v * dim_u)
    flops += 2 * batch * n * (heads * dim_k + dim_v * dim_u)
    if masked:
        flops += 2 * batch * n * n * dim_k * dim_u * dim_v + batch * n * heads * dim_k * dim_v
    else:
        flops += batch * n * dim_k * dim_u * dim_v  # content lambda
        content_output = (
            batch * heads * dim_v * dim_k * math.prod(pooled if impl == "tiled" else spatial)
        )
        flops += content_output
    if impl == "einsum" and not masked:
        flops += batch * n * n * dim_k * dim_u * dim_v + batch * n * heads * dim_k * dim_v
    elif impl == "conv" and not masked:
        kernel = (2 * limit + 1) ** dims
        flops += batch * n * dim_k * dim_u * dim_v * kernel + batch * n * heads * dim_k * dim_v
    elif impl == "tiled":
        stride = layer.stride
        tile_default = DEFAULT_TILE[dims] if stride == 1 else POOLED_TILE[dims]
        tile = [min(t, size) for t, size in zip(tile_default, pooled)]
        padded = math.prod(-(-size // t) * t for size, t in zip(pooled, tile))
        halo = math.prod(stride * t + stride - 1 + 2 * radius for t, radius in zip(tile, radii))
        depth = dim_k * (1 if stride == 1 else window)
        flops += batch * heads * padded * dim_u * halo * (depth + dim_v)
        if stride == 2:
            flops += batch * heads * dim_k * math.prod(pooled) * window  # pool of Q
    if layer.stride == 2 and impl != "tiled":
        flops += batch * heads * dim_v * math.prod(pooled) * window
    return flops


def aft_flops(layer, shape) -> int:
    """Multiply-adds of an AFT mixer (Zhai et al. 2021): projections b T d_in (2 d + keys) and
    b T d d_out; AFT-full / -local the bias w = U V^T, T^2 d', and numerator and denominator
    2 b d T^2; AFT-conv both through the cropped s x s kernel per head, b (d + h) T s^2; AFT-simple
    only sums (no multiply-adds); stride 2 the pool."""
    batch, d_in, *spatial = shape
    positions, hidden = math.prod(spatial), layer.hidden_dim
    keys = layer.heads if isinstance(layer, AFTConv) else hidden
    flops = batch * positions * (d_in * (2 * hidden + keys) + hidden * layer.out_channels)
    if isinstance(layer, (AFTFull, AFTLocal)):
        flops += positions**2 * layer.position_dim + 2 * batch * hidden * positions**2
    if isinstance(layer, AFTConv):
        kernel = math.prod(2 * min(layer.window_size // 2, size - 1) + 1 for size in spatial)
        flops += batch * (hidden + layer.heads) * positions * kernel
    if layer.stride == 2:
        pooled = [(size + 1) // 2 for size in spatial]
        flops += batch * layer.out_channels * math.prod(pooled) * 3 ** len(spatial)
    return flops


def counted(module, *inputs, caplog):
    """fvcore's total with lambda_det's handles, asserting it warned of nothing (no op skipped,
    no module that has a forward left uncalled)."""
    analysis = FlopCountAnalysis(module.eval(), inputs).set_op_handle(**flop_handles())
    with caplog.at_level(logging.WARNING, logger="fvcore.nn.jit_analysis"):
        total = analysis.total()
    assert [record.getMessage() for record in caplog.records] == []
    return total


SHAPES = {2: (2, 16, 7, 9), 1: (2, 16, 19)}


@pytest.mark.parametrize("dims", [2, 1])
@pytest.mark.parametrize("scope", [5, None])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("impl", ["einsum", "conv", "tiled"])
def test_lambda_layer_count_is_its_analytic_cost(
    one_torch_thread, caplog, impl, stride, scope, dims
):
    torch.manual_seed(0)
    layer = LambdaLayer(
        16,
        32,
        heads=4,
        dim_k=4,
        dim_u=2,
        scope=scope,
        stride=stride,
        impl=impl,
        max_size=20,
        spatial_dims=dims,
    )
    shape = SHAPES[dims]
    total = counted(layer, torch.randn(shape), caplog=caplog)
    assert total == pytest.approx(lambda_layer_flops(layer, shape, impl), rel=0.01)


@pytest.mark.parametrize("stride", [1, 2])
def test_masked_lambda_layer_count_is_its_analytic_cost(one_torch_thread, caplog, stride):
    torch.manual_seed(0)
    layer = LambdaLayer(16, 32, heads=4, dim_k=4, scope=None, max_size=8, stride=stride)
    shape = (2, 16, 4, 5)
    mask = torch.rand(20, 20) < 0.5
    mask.fill_diagonal_(True)
    total = counted(layer, torch.randn(shape), mask, caplog=caplog)
    assert total == pytest.approx(lambda_layer_flops(layer, shape, "einsum", masked=True), rel=0.01)


def test_a_trace_counts_auto_as_conv_and_eager_impls_as_eager_runs_it(one_torch_thread, caplog):
    """A trace runs "auto" as "conv" (shape-generic); eager_impls counts the eager form."""
    layer = LambdaLayer(16, 32, heads=4, dim_k=4, scope=5).eval()
    shape = (1, 16, 20, 20)  # auto -> tiled in eager mode (n = 400 > C / 3)
    x = torch.randn(shape)
    assert layer.resolve_impl((20, 20)) == "tiled"
    assert counted(layer, x, caplog=caplog) == lambda_layer_flops(layer, shape, "conv")
    with eager_impls(layer, x):
        assert layer.impl == "tiled"
        assert counted(layer, x, caplog=caplog) == lambda_layer_flops(layer, shape, "tiled")
    assert layer.impl == "auto"


AFT_LAYERS = {
    "full": lambda dims, stride: AFTFull(
        16, 24, hidden_dim=8, max_size=20, position_dim=6, stride=stride, spatial_dims=dims
    ),
    "local": lambda dims, stride: AFTLocal(
        16,
        24,
        hidden_dim=8,
        max_size=20,
        position_dim=6,
        window_size=3,
        stride=stride,
        spatial_dims=dims,
    ),
    "simple": lambda dims, stride: AFTSimple(
        16, 24, hidden_dim=8, stride=stride, spatial_dims=dims
    ),
    "conv": lambda dims, stride: AFTConv(
        16, 24, hidden_dim=8, heads=2, window_size=5, stride=stride, spatial_dims=dims
    ),
}


@pytest.mark.parametrize("dims", [2, 1])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("name", sorted(AFT_LAYERS))
def test_aft_count_is_its_analytic_cost(one_torch_thread, caplog, name, stride, dims):
    torch.manual_seed(0)
    layer = AFT_LAYERS[name](dims, stride)
    shape = SHAPES[dims]
    assert counted(layer, torch.randn(shape), caplog=caplog) == pytest.approx(
        aft_flops(layer, shape), rel=0.01
    )


@pytest.mark.parametrize("cls", [AFTFull, AFTLocal, AFTSimple])
def test_causal_aft_count_is_its_analytic_cost(one_torch_thread, caplog, cls):
    layer = cls(
        16,
        24,
        hidden_dim=8,
        causal=True,
        spatial_dims=1,
        **({} if cls is AFTSimple else {"max_size": 20, "position_dim": 6}),
    )
    shape = SHAPES[1]
    assert counted(layer, torch.randn(shape), caplog=caplog) == pytest.approx(
        aft_flops(layer, shape), rel=0.01
    )


def test_registered_handles_become_fvcores_defaults(monkeypatch, caplog):
    """As ``import lambda_det.modeling`` adds them (fvcore's private table itself:
    tests/compat/test_internals.py)."""
    from lambda_det.compat.internals import add_default_flop_handles

    defaults = {
        name: handle
        for name, handle in fvcore_flop_count._DEFAULT_SUPPORTED_OPS.items()
        if name not in flop_handles()
    }
    monkeypatch.setattr(fvcore_flop_count, "_DEFAULT_SUPPORTED_OPS", defaults)
    layer = LambdaLayer(16, 32, heads=4, dim_k=4, scope=5, stride=2, impl="conv").eval()
    x = torch.randn(2, 16, 7, 9)
    with caplog.at_level(logging.WARNING, logger="fvcore.nn.jit_analysis"):
        FlopCountAnalysis(layer, x).total()
    assert "aten::baddbmm_" in caplog.text  # without the handles: skipped
    add_default_flop_handles(flop_handles())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fvcore.nn.jit_analysis"):
        total = FlopCountAnalysis(layer, x).total()
    assert caplog.text == ""
    assert total == pytest.approx(lambda_layer_flops(layer, (2, 16, 7, 9), "conv"), rel=0.01)
