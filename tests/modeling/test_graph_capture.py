"""LambdaResNets (impl "auto") as one torch.compile graph, one torch.fx trace, TorchScript, and
a lambda layer under torch.export."""

import io

import pytest
import torch
import torch._dynamo
from conftest import NEEDS_IS_EXPORTING, TINY_BN_MODEL, overrides

import lambda_det.data
from lambda_det.engine import Trainer
from lambda_det.layers import AFTConv, LambdaLayer
from lambda_det.modeling import lambda_resnet
from lambda_det.run_config import load_config

lambda_det.data.register_datasets()  # the bundled datasets, by name: importing registers none

# The tiny BN model's backbone and FPN settings (the heads' norms play no part here).
DETECTOR = overrides({key: value for key, value in TINY_BN_MODEL.items() if "ROI" not in key})


def tiny_lambda_resnet(scope):
    return lambda_resnet(26, width_multiplier=0.25, scope=scope, max_size=16)


def images():
    return torch.randn(2, 3, 64, 64)


@pytest.fixture
def fresh_dynamo():
    """Compiled-code caches are per process: keep other tests' compilations out of this one's."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "scope, forms",
    [
        (3, {(2, "tiled"), (1, "tiled"), (1, "einsum")}),
        (None, {(2, "einsum"), (1, "einsum")}),
    ],
)
def test_tiny_model_runs_every_form_on_64_pixels(scope, forms):
    """What the graph tests below cover: (stride, implementation) of the lambda layers."""
    model, seen = tiny_lambda_resnet(scope), set()
    for layer in model.modules():
        if isinstance(layer, LambdaLayer):
            layer.register_forward_pre_hook(
                lambda layer, args: seen.add((layer.stride, layer.resolve_impl(args[0].shape[2:])))
            )
    model(images())
    assert seen == forms


@pytest.mark.slow
@pytest.mark.parametrize("scope, training, bfloat16", [(3, False, True), (None, True, True)])
def test_lambda_resnet_is_one_graph(fresh_dynamo, scope, training, bfloat16):
    """No graph break: what torch.compile(fullgraph=True) needs (backward included: dynamo
    traces the tiled form's autograd Function whole). Scope 3 in training in float32: the
    detector's backbone below."""
    model = tiny_lambda_resnet(scope).train(training)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
        explanation = torch._dynamo.explain(model)(images())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.slow
def test_detector_backbone_under_compile_is_one_graph(fresh_dynamo):
    cfg = load_config("lambda_r26_shapes", DETECTOR + ["MODEL.LAMBDA_RESNET.COMPILE", "True"])
    backbone = Trainer.build_model(cfg).backbone  # LambdaResNet + FPN
    assert backbone._compiled_call_impl is not None  # what MODEL.LAMBDA_RESNET.COMPILE does
    explanation = torch._dynamo.explain(backbone.forward)(images())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compile_key_compiles_the_backbone_for_static_shapes(monkeypatch):
    """One graph per input size: automatic dynamic shapes stalled at a second size."""
    calls = []
    monkeypatch.setattr(
        torch.nn.Module,
        "compile",
        lambda module, **options: calls.append((type(module).__name__, options)),
    )
    cfg = load_config("lambda_r26_shapes", DETECTOR + ["MODEL.LAMBDA_RESNET.COMPILE", "True"])
    Trainer.build_model(cfg)
    assert calls == [("FPN", {"dynamic": False})]


@pytest.mark.parametrize("training", [False, True])
def test_fx_symbolic_trace_equals_eager(training):
    model = tiny_lambda_resnet(3).train(training)
    traced = torch.fx.symbolic_trace(model)
    lambda_calls = [
        node.target
        for node in traced.graph.nodes
        if node.op == "call_module" and isinstance(traced.get_submodule(node.target), LambdaLayer)
    ]
    assert lambda_calls == ["res4.1.mixer", "res5.0.mixer", "res5.1.mixer"]  # one call each
    x = images()
    expected, actual = model(x), traced(x)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name
    with pytest.raises(ValueError, match=r"takes \(N, C, H, W\) images, got shape \(3, 64, 64\)"):
        traced(x[0])  # the backbone's input check is in the trace too


def test_fx_names_the_way_to_trace_a_lone_layer():
    with pytest.raises(TypeError, match=r"trace a module that holds it, e.g. torch.nn.Sequential"):
        torch.fx.symbolic_trace(LambdaLayer(8, heads=2, dim_k=4, scope=3))
    model = torch.nn.Sequential(LambdaLayer(8, heads=2, dim_k=4, scope=3))
    x = torch.randn(2, 8, 9, 9)
    assert torch.equal(torch.fx.symbolic_trace(model)(x), model(x))


@pytest.mark.parametrize(
    "options",
    [
        dict(scope=5, stride=1, impl="auto"),
        dict(scope=5, stride=2, impl="tiled"),
        dict(scope=None, stride=2, impl="einsum", max_size=12),
        dict(scope=3, spatial_dims=1),
    ],
)
def test_torchscript_runs_the_conv_form(options):
    layer = LambdaLayer(8, heads=2, dim_k=4, dim_u=2, **options).eval()
    scripted = torch.jit.script(layer)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = torch.randn(2, 8, *([11] * layer.spatial_dims))
    layer.impl = "conv"
    torch.testing.assert_close(loaded(x), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "shape, message",
    [
        (
            (1, 8, 9, 9),
            r"input size \(9, 9\) exceeds the 8 positions per axis its relative embeddings "
            r"cover; build it with a larger max_size",
        ),
        (
            (1, 4, 9, 9),
            r"LambdaLayer expects 8 input channels, got 4 \(input shape \(1, 4, 9, 9\)\)",
        ),
        ((8, 9, 9), r"expects a \(B, C, H, W\) tensor, got shape \(8, 9, 9\)"),
    ],
    ids=["too_large", "channels", "rank"],
)
def test_torchscript_checks_its_input(shape, message):
    """A scripted layer gives the eager error (as TorchScript's exception type)."""
    layer, x = LambdaLayer(8, heads=2, dim_k=4, scope=None, max_size=8), torch.randn(shape)
    with pytest.raises(ValueError, match=message):
        layer(x)
    with pytest.raises(torch.jit.Error, match=message):
        torch.jit.script(layer)(x)


def test_torchscript_takes_no_context_mask():
    scripted = torch.jit.script(LambdaLayer(8, heads=2, dim_k=4, scope=None, max_size=8))
    with pytest.raises(torch.jit.Error, match="context_mask in eager mode only"):
        scripted(torch.randn(1, 8, 3, 3), torch.ones(9, 9, dtype=torch.bool))


@pytest.mark.parametrize("stride", [1, 2])
@NEEDS_IS_EXPORTING
def test_torch_export_takes_the_conv_form_at_any_size(stride, monkeypatch):
    """Under torch.export, impl "auto" is the "conv" form with full-radius windows: one program
    for every height and width (from 3: a pooled size of 1 specialises), equal to eager (which
    picks "einsum" or "tiled" by size)."""
    layer = LambdaLayer(8, heads=2, dim_k=4, dim_u=2, scope=5, stride=stride).eval()
    forms = []
    conv_form = LambdaLayer._position_output_conv
    monkeypatch.setattr(
        LambdaLayer,
        "_position_output_conv",
        lambda self, *args: forms.append("conv") or conv_form(self, *args),
    )
    height, width = torch.export.Dim("height", min=3), torch.export.Dim("width", min=3)
    program = torch.export.export(
        layer, (torch.randn(1, 8, 12, 10),), dynamic_shapes=({2: height, 3: width},), strict=False
    )
    assert forms == ["conv"]
    for size in [(12, 10), (9, 16), (16, 16), (5, 3)]:
        x = torch.randn(1, 8, *size)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x), layer(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_torchscript_backbone_and_fpn_equal_eager():
    """torch.jit.script of the backbone alone and under detectron2's FPN (detectron2.export's
    patches make its FPN scriptable) runs the lambda layers' "conv" form: eager's outputs."""
    import detectron2.export  # noqa: F401
    from detectron2.layers import ShapeSpec
    from detectron2.modeling import build_backbone

    torch.manual_seed(0)
    cfg = load_config("lambda_r26_shapes", ["MODEL.LAMBDA_RESNET.NORM", "BN", "MODEL.FPN.NORM", ""])
    x = torch.randn(1, 3, 64, 96)
    for model in (tiny_lambda_resnet(3).eval(), build_backbone(cfg, ShapeSpec(channels=3)).eval()):
        scripted = torch.jit.script(model)
        expected, actual = model(x), scripted(x)
        assert actual.keys() == expected.keys()
        for name in expected:
            torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match=r"takes \(N, C, H, W\) images, got shape \(3, 64, 64\)"):
        torch.jit.script(tiny_lambda_resnet(3))(torch.randn(3, 64, 64))


@pytest.mark.slow
def test_torchscript_aft_conv_backbone_and_fpn_equal_eager_bit_for_bit():
    """With AFT-conv blocks (MIXER "aft_conv"), torch.jit.script of the backbone alone and under
    detectron2's FPN computes eager's floats."""
    import detectron2.export  # noqa: F401
    from detectron2.layers import ShapeSpec
    from detectron2.modeling import build_backbone

    torch.manual_seed(0)
    cfg = load_config(
        "aft_conv_r26_shapes", ["MODEL.LAMBDA_RESNET.NORM", "BN", "MODEL.FPN.NORM", ""]
    )
    x = torch.randn(1, 3, 64, 96)
    for model in (
        lambda_resnet(26, width_multiplier=0.25, mixer="aft_conv").eval(),
        build_backbone(cfg, ShapeSpec(channels=3)).eval(),
    ):
        assert any(isinstance(module, AFTConv) for module in model.modules())
        scripted = torch.jit.script(model)
        expected, actual = model(x), scripted(x)
        assert actual.keys() == expected.keys()
        for name in expected:
            torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0)


@pytest.mark.slow
def test_torch_export_of_the_backbone_takes_named_dim_ranges():
    """A user's Dim ranges (as detectron2's ResNet exports with): no guard narrows them, and the
    program equals eager at sizes inside them, odd ones included."""
    torch.manual_seed(0)
    model = tiny_lambda_resnet(3).eval()
    height, width = torch.export.Dim("h", min=64, max=2048), torch.export.Dim("w", min=64, max=2048)
    program = torch.export.export(
        model, (torch.randn(1, 3, 96, 128),), dynamic_shapes=({2: height, 3: width},), strict=False
    )
    for size in [(64, 64), (97, 131)]:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            actual, expected = program.module()(x), model(x)
        for name in expected:
            torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("size", [(6, 8), (7, 9), (5, 4)])
def test_shortcut_pool_under_export_is_eagers_pool_bit_for_bit(size, monkeypatch):
    """The padded form torch.export runs gives the same floats as ceil_mode pooling."""
    from lambda_det.modeling.blocks import ShortcutPool

    pool = ShortcutPool()
    x = torch.randn(2, 3, *size, requires_grad=True)
    eager = pool(x)
    from lambda_det.compat import torch_features

    monkeypatch.setattr(torch_features, "is_exporting", lambda: True)
    exported = pool(x)
    assert exported.shape == eager.shape and torch.equal(exported, eager)
    gradient = torch.randn_like(eager)
    assert torch.equal(
        torch.autograd.grad(exported, x, gradient)[0], torch.autograd.grad(eager, x, gradient)[0]
    )
