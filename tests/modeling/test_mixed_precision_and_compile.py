"""Mixed precision (float16 with a scaler, bfloat16 without) and the compiled backbone, on the
CPU."""

import pytest
import torch
from conftest import TINY_BN_MODEL, overrides

import lambda_det.data
from lambda_det.compat.internals import inner_trainer
from lambda_det.engine import Trainer
from lambda_det.engine.amp import MixedPrecisionTrainer
from lambda_det.run_config import load_config

lambda_det.data.register_datasets()  # the bundled datasets, by name: importing registers none

TINY = overrides(
    {
        **TINY_BN_MODEL,
        "SOLVER.IMS_PER_BATCH": 2,
        "SOLVER.MAX_ITER": 2,
        "SOLVER.WARMUP_ITERS": 1,
        "SOLVER.STEPS": (1,),
        "DATALOADER.NUM_WORKERS": 0,
        "DATASETS.TEST": (),
        "DATALOADER.DETERMINISTIC": True,
        "SEED": 3,
    }
)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_trains_on_the_cpu(tmp_path, dtype, shapes):
    cfg = load_config(
        "lambda_r26_shapes",
        TINY
        + ["SOLVER.AMP.ENABLED", "True", "SOLVER.AMP.DTYPE", dtype, "OUTPUT_DIR", str(tmp_path)],
    )
    trainer = Trainer(cfg)
    assert isinstance(inner_trainer(trainer), MixedPrecisionTrainer)
    assert (inner_trainer(trainer).grad_scaler is None) == (dtype == "bfloat16")
    trainer.train()
    losses = trainer.storage.history("total_loss").values()
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(v)) for v, _ in losses)
    assert ("grad_scaler" in inner_trainer(trainer).state_dict()) == (dtype == "float16")


def test_unknown_amp_dtype_is_named(tmp_path, shapes):
    cfg = load_config(
        "lambda_r26_shapes",
        TINY
        + ["SOLVER.AMP.ENABLED", "True", "SOLVER.AMP.DTYPE", "float8", "OUTPUT_DIR", str(tmp_path)],
    )
    with pytest.raises(ValueError, match="SOLVER.AMP.DTYPE must be one of .* got 'float8'"):
        Trainer(cfg)


@pytest.mark.slow
def test_compiled_backbone_matches_eager(monkeypatch):
    """MODEL.LAMBDA_RESNET.COMPILE's backbone, forward and backward, equals eager's: dynamo's
    graph, and AOTAutograd's forward and backward graphs with inductor's decompositions and
    partitioner (where the lambda layers take their compile-only paths), run op by op by the
    backend "aot_eager_decomp_partition". Inductor's kernels for the lambda layers' forms are
    tested in tests/layers/: for the whole backbone they take 2 minutes to build on 2 cores."""
    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(
        torch.nn.Module,
        "compile",
        lambda module, **options: compile_module(
            module, backend="aot_eager_decomp_partition", **options
        ),
    )
    # In float64: the gradients of the first layers and of the FPN's top-down path sum many
    # cancelling terms (train-mode BN removes each channel's mean), so another float32 order of
    # summation (inductor's kernels) moves them by a few percent; float64 leaves only the code's
    # differences.
    images = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    results = []
    for compiled in (False, True):
        cfg = load_config(
            "lambda_r26_shapes", TINY + ["MODEL.LAMBDA_RESNET.COMPILE", str(compiled)]
        )
        torch.manual_seed(0)
        backbone = Trainer.build_model(cfg).backbone.double()
        outputs = backbone(images)
        sum(output.square().mean() for output in outputs.values()).backward()
        results.append((outputs, {name: p.grad for name, p in backbone.named_parameters()}))
    (eager, eager_grads), (compiled, compiled_grads) = results
    assert eager.keys() == compiled.keys() and eager_grads.keys() == compiled_grads.keys()
    for name in eager:
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-9, atol=1e-10)
    for name, expected in eager_grads.items():
        scale = max(1.0, expected.abs().max().item())
        torch.testing.assert_close(compiled_grads[name], expected, rtol=1e-7, atol=1e-9 * scale)
