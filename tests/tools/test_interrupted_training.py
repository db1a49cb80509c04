"""SIGINT and SIGTERM (Ctrl-C, a preempted job) stop a training after the step in flight: a
checkpoint of that iteration, one line naming it and the command that resumes, exit status 130
/ 143, no traceback; ``--resume`` finishes the run as if it had not stopped; a second signal
ends the run at once. The demo, the comparison and predict stop in one line too.

The trainings run as children whose loop a hook holds after a given iteration until the child
has the signal (a file tells the test when to send it): the iteration the signal lands in is
fixed, with no sleep to tune."""

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    DEMO_CONFIG,
    LAZY_TINY_OVERRIDES,
    REPO_ROOT,
    TINY_OVERRIDES,
    comparison_options,
    subprocess_env,
)

from lambda_det.checkpoint import load_checkpoint_file
from lambda_det.cli import compare_backbones, demo, predict, train_net
from lambda_det.engine import interrupt

LAZY_CONFIG = str(REPO_ROOT / "configs/LazyConfigs/Demo/lambda_r26_shapes.py")
# 4 deterministic iterations, each logged, no periodic checkpoint before the last.
TRAINING = [
    "--config-file",
    DEMO_CONFIG,
    *TINY_OVERRIDES,
    "SOLVER.MAX_ITER",
    "4",
    "SOLVER.STEPS",
    "(2,)",
    "SOLVER.LOG_PERIOD",
    "1",
    "SOLVER.CHECKPOINT_PERIOD",
    "100",
    "DATALOADER.DETERMINISTIC",
    "True",
    "SEED",
    "7",
]

# Imported by every child interpreter (sitecustomize; the launcher's workers too):
# InterruptCheckpoint held after iteration STOP_AT until a signal came (to this process or,
# for a launched worker, to its launcher); with GOT set, it says so and waits for the next one.
HOLDING_HOOK = """
import os, time
from lambda_det.engine import interrupt

def wait_for(condition):
    deadline = time.monotonic() + 300
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)

def signalled():
    state = interrupt._STATE
    return state.signum or (state.launcher is not None and state.launcher.value)

original = interrupt.InterruptCheckpoint.after_step

def after_step(self):
    if self.trainer.iter == int(os.environ["STOP_AT"]):
        open(os.environ["READY"], "w").close()
        wait_for(signalled)
        if os.environ.get("GOT"):
            open(os.environ["GOT"], "w").close()
            wait_for(lambda: False)
    original(self)

interrupt.InterruptCheckpoint.after_step = after_step
"""


def wait_for_file(path: Path, process: subprocess.Popen, err: Path) -> None:
    deadline = time.monotonic() + 600
    while not path.exists():
        assert process.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < deadline, "the child never reached the iteration"
        time.sleep(0.05)


def interrupted_run(
    tool: str,
    argv,
    tmp_path: Path,
    datasets_root: Path,
    stop_at: int,
    signals=(signal.SIGINT,),
    launcher_only: bool = False,
):
    """(exit status, stderr) of ``tools/TOOL argv`` sent ``signals`` after iteration
    ``stop_at``, each once the child has the one before."""
    ready, got, err = tmp_path / "ready", tmp_path / "got", tmp_path / "stderr.txt"
    hook = tmp_path / "holding_hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLDING_HOOK)
    env = subprocess_env()
    path = [str(hook), *filter(None, [env.get("PYTHONPATH")])]
    env.update(
        PYTHONPATH=os.pathsep.join(path),
        DETECTRON2_DATASETS=str(datasets_root),
        STOP_AT=str(stop_at),
        READY=str(ready),
        OMP_NUM_THREADS="1",
    )
    if len(signals) > 1:
        env["GOT"] = str(got)
    with open(tmp_path / "stdout.txt", "w") as out, open(err, "w") as error:
        process = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "tools" / tool), *map(str, argv)],
            stdout=out,
            stderr=error,
            env=env,
            cwd=REPO_ROOT,
        )
    try:
        for index, signum in enumerate(signals):
            wait_for_file(got if index else ready, process, err)
            os.kill(process.pid, signum)
        status = process.wait(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    return status, err.read_text()


def interrupt_lines(stderr: str):
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("interrupted")]


def metrics_iterations(output: Path):
    return [
        json.loads(line)["iteration"] for line in (output / "metrics.json").read_text().splitlines()
    ]


@pytest.mark.slow
@pytest.mark.e2e
def test_sigint_saves_the_iteration_in_flight_and_resume_finishes_the_run(
    tmp_path, datasets_root, shapes, one_torch_thread, capsys
):
    output = tmp_path / "run"
    tool = str(REPO_ROOT / "tools/train_net.py")
    status, stderr = interrupted_run(
        "train_net.py", [*TRAINING, "OUTPUT_DIR", output], tmp_path, datasets_root, stop_at=1
    )
    assert status == 130, stderr[-3000:]
    [line] = interrupt_lines(stderr)
    command = shlex.join(["python", tool, "--resume", *TRAINING, "OUTPUT_DIR", str(output)])
    assert line == (
        f"interrupted by SIGINT after iteration 1: saved "
        f"{output / 'model_0000001.pth'}; continue with: {command}"
    )
    assert (output / "last_checkpoint").read_text() == "model_0000001.pth"
    assert load_checkpoint_file(str(output / "model_0000001.pth"))["iteration"] == 1
    assert not list(output.glob("*.tmp"))
    assert metrics_iterations(output) == [0, 1]  # the last record is the checkpoint's
    # What a run killed outright leaves besides: a record past its checkpoint, a cut line.
    with open(output / "metrics.json", "a") as f:
        f.write(json.dumps({"iteration": 2, "lr": 0.0}) + "\n" + '{"iteration": 3, "lo')

    # The command the line names, by the script's main() in this process.
    assert shlex.split(command)[:2] == ["python", tool]
    assert train_net.main(shlex.split(command)[2:]) == 0
    assert "Resuming after iteration 1: dropped the 2 last lines of" in capsys.readouterr().out
    assert metrics_iterations(output) == [0, 1, 2, 3]
    assert (output / "last_checkpoint").read_text() == "model_final.pth"

    straight = tmp_path / "straight"
    assert train_net.main([*TRAINING, "OUTPUT_DIR", str(straight)]) == 0
    resumed_weights = load_checkpoint_file(str(output / "model_final.pth"))["model"]
    for name, weight in load_checkpoint_file(str(straight / "model_final.pth"))["model"].items():
        assert torch.equal(weight, resumed_weights[name]), name
    assert metrics_iterations(straight) == metrics_iterations(output)


@pytest.mark.slow
@pytest.mark.e2e
def test_sigterm_stops_lazy_training_with_143(tmp_path, datasets_root):
    output = tmp_path / "run"
    # The periodic checkpoint saves iteration 0 too: it is not saved twice.
    argv = [
        "--config-file",
        LAZY_CONFIG,
        "train.max_iter=3",
        "train.checkpointer.period=1",
        *LAZY_TINY_OVERRIDES,
        f"train.output_dir={output}",
    ]
    status, stderr = interrupted_run(
        "lazyconfig_train_net.py",
        argv,
        tmp_path,
        datasets_root,
        stop_at=0,
        signals=(signal.SIGTERM,),
    )
    assert status == 143, stderr[-3000:]
    [line] = interrupt_lines(stderr)
    assert line.startswith(
        f"interrupted by SIGTERM after iteration 0: saved "
        f"{output / 'model_0000000.pth'}; continue with: python "
        f"{REPO_ROOT / 'tools/lazyconfig_train_net.py'} --resume "
        f"--config-file {LAZY_CONFIG}"
    )
    assert (output / "last_checkpoint").read_text() == "model_0000000.pth"
    assert load_checkpoint_file(str(output / "model_0000000.pth"))["iteration"] == 0
    assert (output / "log.txt").read_text().count("Saving checkpoint to") == 1


@pytest.mark.slow
@pytest.mark.e2e
def test_a_second_signal_ends_the_run_at_once(tmp_path, datasets_root):
    output = tmp_path / "run"
    status, stderr = interrupted_run(
        "train_net.py",
        [*TRAINING, "OUTPUT_DIR", output],
        tmp_path,
        datasets_root,
        stop_at=1,
        signals=(signal.SIGINT, signal.SIGINT),
    )
    assert status == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1] == (
        "SIGINT again: stopped at once, without saving the iteration in flight (--resume "
        "continues from the last complete checkpoint)"
    )
    assert not (output / "last_checkpoint").exists() and not list(output.glob("model_*"))


@pytest.mark.slow
@pytest.mark.e2e
def test_a_signal_to_the_launcher_alone_stops_every_process(tmp_path, datasets_root):
    """Two gloo processes; SIGTERM to the launching process only (as a container's first
    process gets it): both workers stop after the same iteration, the main one saves it."""
    output = tmp_path / "run"
    status, stderr = interrupted_run(
        "train_net.py",
        [*TRAINING, "--num-gpus", "2", "--dist-url", "auto", "OUTPUT_DIR", output],
        tmp_path,
        datasets_root,
        stop_at=1,
        signals=(signal.SIGTERM,),
    )
    assert status == 143, stderr[-3000:]
    [line] = interrupt_lines(stderr)
    assert line.startswith(
        f"interrupted by SIGTERM after iteration 1: saved "
        f"{output / 'model_0000001.pth'}; continue with: "
    )
    assert load_checkpoint_file(str(output / "model_0000001.pth"))["iteration"] == 1


@pytest.mark.parametrize(
    "saved, argv, line",
    [
        (
            None,
            ["--config-file", "c.yaml", "--resume"],
            "interrupted by SIGTERM before the run started: run it again with: python "
            "tools/train_net.py --config-file c.yaml --resume",
        ),
        (
            "",
            ["--config-file", "c.yaml", "--resume"],
            "interrupted by SIGTERM before the run's first checkpoint: start again with: python "
            "tools/train_net.py --restart --config-file c.yaml",
        ),
        (
            "model_0000199.pth",
            ["--config-file", "c.yaml", "--restart"],
            "interrupted by SIGTERM: the run's last checkpoint is {output}/model_0000199.pth; "
            "continue with: python tools/train_net.py --resume --config-file c.yaml",
        ),
    ],
)
def test_a_signal_outside_the_loop_names_the_last_checkpoint(tmp_path, saved, argv, line):
    from lambda_det.cli.train_net import interrupted_line

    if saved:
        (tmp_path / "last_checkpoint").write_text(saved)
    args = argparse.Namespace(eval_only=False, command=("tools/train_net.py", argv))
    folder = [] if saved is None else [str(tmp_path)]  # [] while the run has no folder
    assert interrupted_line(interrupt.Interrupted(signal.SIGTERM), args, folder) == line.format(
        output=tmp_path
    )


# ---- the tools around training: the handler is there, and an interrupt is one line ----


def send_to_self(signum):
    """A stand-in for a tool's work that gets ``signum`` (only under the tool's handler: the
    default one would end this test process)."""

    def work(*args, **kwargs):
        assert signal.getsignal(signum) is interrupt._handle
        os.kill(os.getpid(), signum)
        raise AssertionError("the handler did not interrupt the work")

    return work


def test_a_signal_before_the_run_has_its_folder_says_run_it_again(
    tmp_path, capsys, monkeypatch, shapes
):
    """Interrupted while the checks before launch build the model: the folder, which holds
    another run, is not this run's to continue or restart."""
    from lambda_det.cli import train_net

    output = tmp_path / "run"
    output.mkdir()
    (output / "last_checkpoint").write_text("model_0000199.pth")
    monkeypatch.setattr(train_net, "check_training_memory", send_to_self(signal.SIGINT))
    argv = ["--config-file", DEMO_CONFIG, *TINY_OVERRIDES, "OUTPUT_DIR", str(output)]
    with pytest.raises(SystemExit) as exit_info:
        train_net.main(argv)
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"interrupted by SIGINT before the run started: run it again with: "
        f"{shlex.join(['python', 'tools/train_net.py', *argv])}"
    )
    assert sorted(path.name for path in output.iterdir()) == ["last_checkpoint"]


def test_the_demo_waits_for_its_training_and_says_how_to_continue(
    tmp_path, capsys, monkeypatch, shapes
):
    output = tmp_path / "demo"

    def training(command):
        output.mkdir(exist_ok=True)
        (output / "last_checkpoint").write_text("model_0000001.pth")
        send_to_self(signal.SIGTERM)()

    monkeypatch.setattr(demo, "run_child", training)
    argv = ["--config", DEMO_CONFIG, "--force", *TINY_OVERRIDES, "OUTPUT_DIR", str(output)]
    assert demo.main(argv) == 143
    err = capsys.readouterr().err
    assert "Traceback" not in err
    continues = shlex.join(
        ["python", "tools/demo.py", *[word for word in argv if word != "--force"]]
    )
    assert err.splitlines()[-1] == (
        f"interrupted by SIGTERM: the training stopped and its last checkpoint is "
        f"{output / 'model_0000001.pth'}; {continues} continues it"
    )
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored


def test_the_comparison_stops_in_one_line_with_the_signals_status(tmp_path, capsys, monkeypatch):
    from lambda_det.cli import comparison

    monkeypatch.setattr(comparison, "run_child", send_to_self(signal.SIGTERM))
    status = compare_backbones.main([*comparison_options(tmp_path / "cmp"), *TINY_OVERRIDES[:2]])
    assert status == 143
    assert capsys.readouterr().err.splitlines() == [
        f"interrupted conv seed 0 in {tmp_path / 'cmp/conv/seed0'}: the same command "
        f"continues the comparison (it starts over: it had written no checkpoint; finished "
        f"runs are reused)"
    ]


def test_predict_stops_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(predict, "collect_inputs", send_to_self(signal.SIGINT))
    with pytest.raises(SystemExit) as exit_info:
        predict.main(
            [
                "--config-file",
                DEMO_CONFIG,
                "--input",
                str(tmp_path / "a.png"),
                "--output",
                str(tmp_path / "out"),
            ]
        )
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines() == [
        "interrupted by SIGINT before predicting: nothing was written"
    ]
    assert not (tmp_path / "out").exists()
