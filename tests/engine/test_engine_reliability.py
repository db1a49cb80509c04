"""Long-job reliability of the training loop: exact resume, the deterministic loader over
processes, a NaN loss, random valid configurations, two processes against one.

(Split by concern: checkpoint/test_checkpoint_files.py, data/test_coco_annotations.py,
config/test_bad_configs.py, tools/test_training_over_a_run.py.)"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_RUN as TINY
from conftest import run_tool, tiny_cfg
from detectron2.engine import HookBase
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lambda_det.cli import train_net
from lambda_det.engine import Trainer
from lambda_det.modeling import lambda_resnet


class Killed(Exception):
    pass


class RecordLosses(HookBase):
    """Records each iteration's total loss; can kill the job after a given iteration."""

    def __init__(self, kill_after=None):
        self.losses = []
        self.kill_after = kill_after

    def after_step(self):  # runs after the checkpoint hook of the same step
        self.losses.append(self.trainer.storage.history("total_loss").latest())
        if self.trainer.iter + 1 == self.kill_after:
            raise Killed


def train(cfg, *, resume=False, stop_after=None):
    trainer = Trainer(cfg)
    recorder = RecordLosses(kill_after=stop_after)
    trainer.register_hooks([recorder])
    trainer.resume_or_load(resume=resume)
    try:
        trainer.train()
    except Killed:
        pass
    return trainer, recorder.losses


@pytest.mark.slow
def test_resume_is_bit_exact(tmp_path, shapes):
    straight, straight_losses = train(tiny_cfg(tmp_path / "straight"))
    interrupted_dir = tmp_path / "interrupted"
    _, first_losses = train(tiny_cfg(interrupted_dir), stop_after=3)
    assert (interrupted_dir / "last_checkpoint").read_text() == "model_0000002.pth"
    resumed, resumed_losses = train(tiny_cfg(interrupted_dir), resume=True)
    assert resumed.start_iter == 3
    assert first_losses + resumed_losses == straight_losses
    for (name, a), b in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().values()
    ):
        assert torch.equal(a, b), name
    # Without the deterministic loader a resumed run drifts from the straight one: the equality
    # above is the loader's doing, not automatic.
    plain = {"DATALOADER.DETERMINISTIC": False}
    _, plain_straight = train(tiny_cfg(tmp_path / "plain_straight", **plain))
    train(tiny_cfg(tmp_path / "plain", **plain), stop_after=3)
    _, plain_resumed = train(tiny_cfg(tmp_path / "plain", **plain), resume=True)
    assert len(plain_resumed) == 3 and plain_resumed != plain_straight[3:]


def test_deterministic_loader_splits_global_batches_across_processes(shapes):
    cfg = tiny_cfg(Path("unused"), **{"SOLVER.IMS_PER_BATCH": 4})
    single = Trainer.build_train_loader(cfg)
    from lambda_det.engine import DeterministicTrainLoader

    halves = [
        DeterministicTrainLoader(single.dataset, single.mapper, 4, cfg.SEED, rank, 2)
        for rank in (0, 1)
    ]
    whole = single.batches(5, 1)[0]
    split = halves[0].batches(5, 1)[0] + halves[1].batches(5, 1)[0]
    for a, b in zip(whole, split):
        assert a["file_name"] == b["file_name"] and torch.equal(a["image"], b["image"])


def test_nan_loss_stops_training_naming_iteration_and_losses(tmp_path, shapes):
    cfg = tiny_cfg(tmp_path / "nan")
    trainer = Trainer(cfg)
    model = trainer.model
    original = model.forward

    def poisoned(batched_inputs):
        losses = original(batched_inputs)
        if trainer.iter == 2:
            losses["loss_mask"] = losses["loss_mask"] * float("nan")
        return losses

    model.forward = poisoned
    with pytest.raises(FloatingPointError, match=r"(?s)iteration=2.*loss_mask"):
        trainer.train()


def test_bad_log_period_is_named(tmp_path, shapes):
    with pytest.raises(ValueError, match="SOLVER.LOG_PERIOD must be an integer >= 1 .*got 0"):
        Trainer(tiny_cfg(tmp_path, **{"SOLVER.LOG_PERIOD": 0}))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    depth=st.sampled_from([26, 50]),
    placement=st.text(alphabet="CL", min_size=4, max_size=4),
    scope=st.sampled_from([1, 3, 5, 7]),
    heads=st.sampled_from([1, 2, 4]),
    dim_k=st.integers(1, 8),
    dim_u=st.integers(1, 3),
    impl=st.sampled_from(["auto", "einsum", "conv"]),
    height=st.integers(17, 72),
    width=st.integers(17, 72),
)
def test_random_valid_configurations_train(
    depth, placement, scope, heads, dim_k, dim_u, impl, height, width
):
    model = lambda_resnet(
        depth,
        placement=placement,
        width_multiplier=0.125,
        scope=scope,
        heads=heads,
        dim_k=dim_k,
        dim_u=dim_u,
        impl=impl,
    )
    outputs = model(torch.randn(2, 3, height, width))
    loss = sum(output.float().mean() for output in outputs.values())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def run_train_net(*args: str, datasets_root: Path, timeout: int = 900):
    return run_tool("train_net.py", *args, datasets_root=datasets_root, timeout=timeout)


def logged_losses(output: Path):
    lines = [json.loads(line) for line in (output / "metrics.json").read_text().splitlines()]
    return [line["total_loss"] for line in lines if "total_loss" in line]


@pytest.mark.slow
@pytest.mark.e2e
def test_two_cpu_processes_follow_the_one_process_trajectory(
    tmp_path, datasets_root, shapes, recwarn
):
    overrides = []
    for key, value in {
        **TINY,
        "SOLVER.IMS_PER_BATCH": 4,
        "SOLVER.LOG_PERIOD": 1,
        "MODEL.LAMBDA_RESNET.NORM": "naiveSyncBN",
        "MODEL.FPN.NORM": "naiveSyncBN",
        "MODEL.ROI_BOX_HEAD.NORM": "naiveSyncBN_N",
        "MODEL.ROI_MASK_HEAD.NORM": "naiveSyncBN_N",
    }.items():
        overrides += [key, str(value)]
    runs = {}
    for processes in (1, 2):
        output = tmp_path / f"p{processes}"
        # "auto": a free port, so that a test running beside it (pytest-xdist) cannot collide.
        argv = ["--config", "lambda_r26_shapes", "--num-gpus", str(processes), "--dist-url"]
        argv += ["auto", *overrides, "OUTPUT_DIR", str(output)]
        if processes == 1:  # train_net's main() in this process
            assert train_net.main(argv) == 0
            # The warnings a child process would print (Python's default filters hide these
            # kinds): no FutureWarning, none that says deprecated.
            hidden = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)
            printed = [
                f"{w.category.__name__}: {w.message}"
                for w in recwarn
                if not issubclass(w.category, hidden)
            ]
            assert not [w for w in printed if "FutureWarning" in w or "deprecated" in w], printed
        else:  # the script, whose launcher starts the gloo workers
            result = run_train_net(*argv, datasets_root=datasets_root)
            assert result.returncode == 0, result.stderr[-3000:]
            # No deprecation warnings a user can do nothing about (DDP broadcast_buffers, ...).
            assert "FutureWarning" not in result.stderr and "deprecated" not in result.stderr
        runs[processes] = np.array(logged_losses(output))
    assert len(runs[1]) == len(runs[2]) == TINY["SOLVER.MAX_ITER"]
    # Same images and augmentations per iteration; the processes differ in ROI sampling and in
    # per-process loss normalisation, so the trajectories agree closely but not bit for bit.
    np.testing.assert_allclose(runs[2], runs[1], rtol=0.05)
