"""The log of a run: lambda_det's lines on the console and in log.txt, long printouts (config,
model) in log.txt only, the count of loaded weights, and the warning for autocast on a CPU
without kernels for its dtype."""

import argparse
import collections
import json
import logging
import re
import types

import pytest
import torch
from conftest import TINY_OVERRIDES
from detectron2.modeling import build_model

import lambda_det.data
from lambda_det.cli import train_net
from lambda_det.config.lazy import load_lazy_config
from lambda_det.engine import amp
from lambda_det.engine.run_logging import ExpectedTime
from lambda_det.engine.trainer import plain_default_setup
from lambda_det.run_config import load_config

lambda_det.data.register_datasets()  # the bundled datasets, by name: importing registers none

TINY = TINY_OVERRIDES  # the demo config at tool size (conftest)
LOGGERS = ("detectron2", "fvcore", "lambda_det")


@pytest.fixture(autouse=True)
def restored_loggers():
    """The loggers a run sets up, as they were before: a run's handlers write to this test's
    captured stdout, and without propagation other tests' caplog would see nothing."""
    loggers = [logging.getLogger(name) for name in LOGGERS]
    saved = [(logger.handlers[:], logger.level, logger.propagate) for logger in loggers]
    yield
    for logger, (handlers, level, propagate) in zip(loggers, saved):
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def backbone_only_weights(path, cfg):
    """A checkpoint with the image network's weights only; returns (backbone, other) counts of
    the model's weights."""
    model = build_model(cfg)
    weights = {
        key: value
        for key, value in model.state_dict().items()
        if not key.endswith("num_batches_tracked")
    }
    backbone = {
        key: value for key, value in weights.items() if key.startswith("backbone.bottom_up.")
    }
    torch.save({"model": backbone}, path)
    return len(backbone), len(weights) - len(backbone)


@pytest.mark.slow  # an in-process training: 11 s
@pytest.mark.e2e
def test_the_console_shows_the_run_and_log_txt_keeps_everything(
    tmp_path, shapes, capsys, monkeypatch
):
    import detectron2.utils.logger

    # detectron2's log_first_n logs a message once per process: as in a process of its own
    monkeypatch.setattr(detectron2.utils.logger, "_LOG_COUNTER", collections.Counter())
    output = tmp_path / "run"
    weights = tmp_path / "backbone.pth"
    backbone, other = backbone_only_weights(weights, load_config("lambda_r26_shapes", TINY))
    assert backbone > 100 and other > 50
    assert (
        train_net.main(
            [
                "--config",
                "lambda_r26_shapes",
                *TINY,
                "OUTPUT_DIR",
                str(output),
                "MODEL.WEIGHTS",
                str(weights),
            ]
        )
        == 0
    )
    console = capsys.readouterr().out
    log = (output / "log.txt").read_text()
    loaded = (
        f"loaded {backbone} of {backbone} backbone weights and 0 of {other} other weights "
        f"from {weights}"
    )
    # lambda_det's own lines and the weights count reach both.
    swap = "MODEL.LAMBDA_RESNET follows MODEL.RESNETS for OUT_FEATURES"
    for text in (console, log):
        assert swap in text and loaded in text
    # The console: the printouts as one line each, pointing at log.txt; each line once.
    for printout in ("Environment info:", "Running with full config:", "Model:"):
        line = next(line for line in console.splitlines() if printout in line)
        assert line.endswith(f" lines in {output / 'log.txt'}"), line
    assert "GeneralizedRCNN(" not in console and "ANCHOR_GENERATOR:" not in console
    assert console.count("Starting training from iteration 0") == 1
    records = [line for line in console.splitlines() if re.match(r"(WARNING )?\[\d\d/", line)]
    assert len(records) < 30, records
    # ~760 lines with the printouts; ~40 are detectron2's list of the weights left new
    assert len(console.splitlines()) < 100, console
    # log.txt: everything, the printouts in full.
    assert "GeneralizedRCNN(" in log and "ANCHOR_GENERATOR:" in log
    assert len(list(output.glob("events.out.tfevents.*"))) == 1  # one TensorBoard writer
    assert "Distribution of instances among all 3 categories" in log
    assert len(log.splitlines()) > 700


def setup_args(tmp_path, **kwargs):
    return argparse.Namespace(config_file="", eval_only=False, **kwargs)


@pytest.mark.parametrize("kind", ["yaml", "lazy"])
def test_float16_on_the_cpu_warns_once_with_the_fix(kind, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(amp, "_has_fast_cpu_kernels", lambda dtype: dtype == "bfloat16")
    if kind == "yaml":
        cfg = load_config(
            "lambda_r26_shapes",
            [
                "MODEL.DEVICE",
                "cpu",
                "SOLVER.AMP.ENABLED",
                "True",
                "SOLVER.AMP.DTYPE",
                "float16",
                "OUTPUT_DIR",
                str(tmp_path),
            ],
        )
        fix = "SOLVER.AMP.DTYPE bfloat16"
    else:
        cfg = load_lazy_config(
            "lambda_r26_shapes",
            [
                "train.device=cpu",
                "train.amp.enabled=True",
                "train.amp.dtype=float16",
                f"train.output_dir={tmp_path}",
            ],
        )
        fix = "train.amp.dtype=bfloat16"
    plain_default_setup(cfg, setup_args(tmp_path))
    warnings = [line for line in capsys.readouterr().out.splitlines() if "autocast" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("WARNING") and "lambda_det.engine.amp" in warnings[0]
    assert "14x to 17x measured" in warnings[0]
    assert warnings[0].endswith(f"bfloat16 is the CPU's choice: set {fix}")
    assert warnings[0].split("]: ", 1)[1] in (tmp_path / "log.txt").read_text()


def amp_cfg(dtype="float16", device="cpu", enabled=True):
    return load_config(
        "lambda_r26_shapes",
        ["MODEL.DEVICE", device, "SOLVER.AMP.ENABLED", str(enabled), "SOLVER.AMP.DTYPE", dtype],
    )


def test_the_amp_warning_follows_the_cpus_kernels(monkeypatch):
    monkeypatch.setattr(amp, "_has_fast_cpu_kernels", lambda dtype: False)  # an AVX2 CPU
    assert amp.cpu_amp_warning(amp_cfg()).endswith(
        "this CPU lacks AVX-512, which oneDNN's bfloat16 kernels need, so train in float32 with "
        "SOLVER.AMP.ENABLED False"
    )
    assert amp.cpu_amp_warning(amp_cfg("bfloat16")).startswith(
        "bfloat16 autocast on this CPU trains several times slower than float32"
    )
    assert amp.cpu_amp_warning(amp_cfg(enabled=False)) is None
    assert amp.cpu_amp_warning(amp_cfg(device="cuda")) is None
    monkeypatch.setattr(amp, "_has_fast_cpu_kernels", lambda dtype: True)  # AVX-512 FP16 / AMX
    assert amp.cpu_amp_warning(amp_cfg()) is None
    assert amp.cpu_amp_warning(amp_cfg("bfloat16")) is None


# ---- metrics.json of a resumed run ----


def test_a_resumed_run_drops_the_records_after_its_checkpoint(tmp_path, caplog):
    from detectron2.utils.events import EventStorage

    from lambda_det.engine.run_logging import MetricsWriter

    metrics = tmp_path / "metrics.json"
    records = [json.dumps({"iteration": i, "total_loss": 1.0 / (i + 1)}) for i in range(4)]
    # A run killed after its checkpoint of iteration 1: two later records and a cut line.
    metrics.write_text("\n".join(records) + "\n" + '{"iteration": 4, "to')
    writer = MetricsWriter(str(metrics))
    with caplog.at_level(logging.INFO, logger="lambda_det"):
        writer.drop_after(1)
    assert metrics.read_text().splitlines() == records[:2]
    assert f"Resuming after iteration 1: dropped the 3 last lines of {metrics}" in caplog.text
    with EventStorage(2) as storage:  # the resumed run appends its own records
        storage.put_scalar("total_loss", 0.5)
        writer.write()
    writer.close()
    assert [json.loads(line)["iteration"] for line in metrics.read_text().splitlines()] == [0, 1, 2]
    # Nothing past the checkpoint: the file is left as it is.
    before = metrics.stat().st_ino
    writer = MetricsWriter(str(metrics))
    writer.drop_after(2)
    writer.close()
    assert metrics.stat().st_ino == before


def test_the_expected_time_is_one_line_from_the_measured_iterations(caplog):
    """ExpectedTime logs once, after its skipped and measured iterations: the measured time per
    iteration times the iterations left (a clock that advances 2 s per iteration)."""
    now = [0.0]
    hook = ExpectedTime(skipped=2, measured=4, clock=lambda: now[0])
    hook.trainer = types.SimpleNamespace(start_iter=100, max_iter=200, iter=0)
    with caplog.at_level(logging.INFO, logger="lambda_det"):
        for iteration in range(100, 120):
            hook.trainer.iter = iteration
            now[0] += 2.0
            hook.after_step()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("expected")]
    assert lines == [
        "expected training time: 0:03:08 more for the 94 iterations left (2.00 s each over "
        "iterations 102-105), then the evaluation"
    ]


def test_on_the_cpu_the_first_iteration_is_one_line_with_the_sizes(caplog):
    """With sizes (given on the CPU), the first iteration's time is logged with them at once,
    before the expected-time line; without, nothing at the first iteration."""
    for sizes, expected in [
        ("800 px for training (INPUT.MIN_SIZE_TRAIN)", 1),
        (None, 0),
    ]:
        caplog.clear()
        now = [0.0]
        hook = ExpectedTime(skipped=2, measured=4, clock=lambda: now[0], sizes=sizes)
        hook.trainer = types.SimpleNamespace(start_iter=0, max_iter=10, iter=0)
        with caplog.at_level(logging.INFO, logger="lambda_det"):
            for iteration in range(3):
                hook.trainer.iter = iteration
                hook.before_step()
                now[0] += 84.0
                hook.after_step()
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("on the")]
        assert (
            lines
            == [
                "on the CPU at 800 px for training (INPUT.MIN_SIZE_TRAIN): the first iteration "
                "took 84.0 s, so expect about that per iteration (lower those keys for a "
                "faster run)"
            ][:expected]
        )


def test_the_sizes_named_on_the_cpu_are_the_configs():
    """A stock detectron2 config on the CPU trains at up to 800 px and evaluates at 800; the
    demo at 256 for both (LSJ); on a GPU no line."""
    from detectron2 import model_zoo

    from lambda_det.engine.trainer import cpu_training_sizes

    stock = load_config(
        model_zoo.get_config_file("COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x.yaml"),
        ["MODEL.DEVICE", "cpu"],
    )
    assert cpu_training_sizes(stock) == (
        "800 px for training (INPUT.MIN_SIZE_TRAIN), 800 px for evaluation (INPUT.MAX_SIZE_TEST)"
    )
    demo = load_config("lambda_r26_shapes", [])
    assert cpu_training_sizes(demo) == (
        "256 px for training (INPUT.LSJ.IMAGE_SIZE), 256 px for evaluation (INPUT.MAX_SIZE_TEST)"
    )
    assert cpu_training_sizes(load_config("lambda_r26_shapes", ["MODEL.DEVICE", "cuda"])) is None
