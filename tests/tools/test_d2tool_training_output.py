"""``python -m lambda_det.d2tool`` with detectron2's training scripts (train_net.py,
plain_train_net.py, lazyconfig_train_net.py): lambda_det's one output rule holds in their output
folder. A user's log.txt or metrics.json there is refused in one line before the script starts
(detectron2's script alone appends to it); a run's own folder is trained on again only with
--resume (or d2tool's --restart) and evaluated in with --eval-only."""

import contextlib
import os

import detectron2.engine
import pytest
from conftest import DEMO_CONFIG, REPO_ROOT, assert_one_line_error, exit_status

import lambda_det.cli.d2tool as d2tool
from lambda_det.cli.d2tool import detectron2_tool_path, main
from lambda_det.cli.output_dir import PREVIOUS_RUN_PREFIX, record_run

LAZY_DEMO = str(REPO_ROOT / "configs/LazyConfigs/Demo/lambda_r26_shapes.py")
SCRIPTS = ["train_net.py", "plain_train_net.py", "lazyconfig_train_net.py"]
USERS_LOG = "my own notes\n"


class Stopped(Exception):
    """Raised right after the script's default_setup: the script started and wrote its log."""


@pytest.fixture
def stop_after_setup(monkeypatch):
    """detectron2's default_setup (which writes log.txt and config.yaml into the output folder,
    as every training script's first step), then a stop: no model is built or trained."""
    setup = detectron2.engine.default_setup

    def setup_then_stop(cfg, args):
        setup(cfg, args)
        raise Stopped

    monkeypatch.setattr(detectron2.engine, "default_setup", setup_then_stop)


def script_argv(script: str, output, *options: str) -> list:
    if script == "lazyconfig_train_net.py":
        return [script, *options, "--config-file", LAZY_DEMO, f"train.output_dir={output}"]
    return [script, *options, "--config-file", DEMO_CONFIG, "OUTPUT_DIR", str(output)]


def a_users_folder(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    (output / "log.txt").write_text(USERS_LOG)
    return output


def a_runs_folder(tmp_path):
    """A folder that a run made: its record, its log, a checkpoint."""
    output = tmp_path / "run"
    output.mkdir()
    record_run(output)
    (output / "log.txt").write_text("the run's log\n")
    (output / "model_0000009.pth").write_bytes(b"weights")
    (output / "last_checkpoint").write_text("model_0000009.pth")
    return output


@pytest.fixture(params=SCRIPTS)
def script(request):
    try:
        detectron2_tool_path(request.param)
    except FileNotFoundError as error:
        pytest.skip(f"this detectron2 installs no tools/ scripts ({error})")
    return request.param


@pytest.mark.parametrize("eval_only", [False, True])
def test_a_users_file_in_the_output_folder_is_refused_in_one_line(
    script, eval_only, tmp_path, capsys, monkeypatch, stop_after_setup
):
    output = a_users_folder(tmp_path)
    options = ["--eval-only"] if eval_only else []
    key = "train.output_dir" if script == "lazyconfig_train_net.py" else "OUTPUT_DIR"
    status, stderr = exit_status(main, script_argv(script, output, *options), capsys)
    assert_one_line_error(
        status,
        stderr,
        f"{key} '{output}' holds log.txt, which no run wrote there",
        f"python -m lambda_det.d2tool --overwrite {script} ...",
    )
    assert (output / "log.txt").read_text() == USERS_LOG
    assert sorted(os.listdir(output)) == ["log.txt", "run.lock"]  # no record, no config
    # Negative control: detectron2's script alone appends its log to the user's file.
    monkeypatch.setattr(d2tool, "training_output_dir", lambda *args: contextlib.nullcontext())
    with pytest.raises(Stopped):
        main(script_argv(script, output, *options))
    assert (output / "log.txt").read_text().startswith(USERS_LOG)
    assert (output / "log.txt").read_text() != USERS_LOG


def test_overwrite_lets_the_script_write_over_a_users_file(script, tmp_path, stop_after_setup):
    output = a_users_folder(tmp_path)
    with pytest.raises(Stopped):
        main(["--overwrite", *script_argv(script, output)])
    assert (output / "log.txt").read_text() != USERS_LOG


def test_a_runs_folder_is_trained_on_only_with_resume_or_restart(
    script, tmp_path, capsys, stop_after_setup
):
    output = a_runs_folder(tmp_path)
    status, stderr = exit_status(main, script_argv(script, output), capsys)
    assert_one_line_error(
        status,
        stderr,
        f"'{output}' already holds a run (last checkpoint model_0000009.pth): pass --resume",
        f"python -m lambda_det.d2tool --restart {script} ...",
    )
    assert (output / "log.txt").read_text() == "the run's log\n"
    for options in (["--resume"], ["--eval-only"]):  # the run's own folder, reused
        with pytest.raises(Stopped):
            main(script_argv(script, output, *options))
        assert (output / "model_0000009.pth").read_bytes() == b"weights"
        assert (output / "log.txt").read_text().startswith("the run's log\n")
    with pytest.raises(Stopped):
        main(["--restart", *script_argv(script, output)])
    (previous,) = [name for name in os.listdir(output) if name.startswith(PREVIOUS_RUN_PREFIX)]
    assert (output / previous / "model_0000009.pth").read_bytes() == b"weights"
    assert not (output / "last_checkpoint").exists()
