"""The tools that train through a child process (the demo, the comparison) start the installed
module, ``python -m lambda_det.cli.train_net``: it needs no checkout beside the package."""

import json
import shutil
import signal
import sys
import types

import pytest
from conftest import (
    DEMO_CONFIG,
    REPO_ROOT,
    TINY_EVALUATED_RUN,
    TINY_OVERRIDES,
    comparison_options,
    run_python,
    subprocess_env,
)

from lambda_det.cli import compare_backbones, comparison, demo
from lambda_det.cli import train_net as cli
from lambda_det.cli.output_dir import RECORD_FILE
from lambda_det.engine.interrupt import Interrupted
from lambda_det.run_config import load_config

MODULE_COMMAND = [sys.executable, "-m", "lambda_det.cli.train_net"]


def recording(commands: list):
    """A stand-in for run_child: records the command and fails, as a child that stops."""

    def run_child(command):
        commands.append(list(command))
        return 1

    return run_child


def test_the_demo_trains_through_the_installed_module(tmp_path, monkeypatch, shapes):
    commands = []
    monkeypatch.setattr(demo, "run_child", recording(commands))
    argv = ["--config", DEMO_CONFIG, *TINY_OVERRIDES, "OUTPUT_DIR", str(tmp_path / "demo")]
    assert demo.main(argv) == 1
    assert [command[:5] for command in commands] == [
        [*MODULE_COMMAND, "--config-file", DEMO_CONFIG]
    ]


def test_the_quick_demo_is_the_demo_cut_short_in_a_folder_of_its_own(tmp_path, monkeypatch, shapes):
    """--quick (make demo QUICK=1) trains the demo config with fewer iterations, into
    output/demo_lambda_r26_shapes_quick; the full demo's command carries no override."""
    monkeypatch.chdir(tmp_path)
    commands = []
    monkeypatch.setattr(demo, "run_child", recording(commands))
    assert demo.main(["--quick"]) == 1 and demo.main([]) == 1
    quick, full = commands
    assert quick[-len(demo.QUICK_OVERRIDES) :] == list(demo.QUICK_OVERRIDES)
    assert quick[-1] == "./output/demo_lambda_r26_shapes_quick"
    assert full[-1] == "--restart"  # the shipped recipe, nothing added
    assert quick[: -len(demo.QUICK_OVERRIDES)] == full


def test_the_quick_demo_settings_leave_the_recipe_but_its_length(tmp_path):
    full = load_config(demo.DEFAULT_CONFIG)
    quick = load_config(demo.DEFAULT_CONFIG, list(demo.QUICK_OVERRIDES))
    assert (full.SOLVER.MAX_ITER, quick.SOLVER.MAX_ITER) == (600, 150)
    assert full.OUTPUT_DIR == "./output/demo_lambda_r26_shapes"
    assert quick.OUTPUT_DIR == "./output/demo_lambda_r26_shapes_quick"
    # the LR drops at the full recipe's fractions of the run (90, 95, 97.5%)
    assert [step / 150 for step in quick.SOLVER.STEPS] == pytest.approx(
        [step / 600 for step in full.SOLVER.STEPS], abs=0.005
    )
    changed = {"MAX_ITER", "STEPS", "CHECKPOINT_PERIOD"}
    for key in changed:
        quick.SOLVER.pop(key), full.SOLVER.pop(key)
    quick.pop("OUTPUT_DIR"), full.pop("OUTPUT_DIR")
    assert quick == full


def test_the_comparison_trains_through_the_installed_module(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(comparison, "run_child", recording(commands))
    assert compare_backbones.main(comparison_options(tmp_path / "cmp")) == 1
    assert [command[:4] for command in commands] == [[*MODULE_COMMAND, "--config-file"]]


@pytest.mark.parametrize(
    "main_module, argv0, started",
    [
        ("lambda_det.cli.train_net", cli.__file__, "-m lambda_det.cli.train_net"),
        (None, "tools/train_net.py", "tools/train_net.py"),  # the control: the script
    ],
)
def test_a_run_started_as_the_module_is_continued_as_the_module(
    main_module, argv0, started, monkeypatch, tmp_path
):
    spec = main_module and types.SimpleNamespace(name=main_module)
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=spec))
    monkeypatch.setattr(sys, "argv", [argv0])
    args = cli.training_command_line(["--config-file", DEMO_CONFIG, "--resume"])
    assert cli.interrupted_line(Interrupted(signal.SIGTERM), args, [str(tmp_path)]) == (
        "interrupted by SIGTERM before the run's first checkpoint: start again with: "
        f"python {started} --restart --config-file {DEMO_CONFIG}"
    )


def installed_copy(site) -> None:
    """lambda_det as pip installs it into ``site``: the package alone, the shipped configs
    inside it (setup.py's package_dir), no checkout around it."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO_ROOT / "lambda_det", site / "lambda_det", ignore=ignore)
    shutil.copytree(REPO_ROOT / "configs", site / "lambda_det/model_zoo/configs", ignore=ignore)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_the_demo_of_an_installed_package_trains_outside_any_checkout(
    tmp_path, small_datasets_root
):
    """``python -m lambda_det.cli.demo`` of an installed copy, its default config, in a folder
    of its own: its training child and the table (a tiny run of the small shapes data)."""
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    installed_copy(site)
    elsewhere.mkdir()
    env = subprocess_env(PYTHONPATH=str(site), DETECTRON2_DATASETS=str(small_datasets_root))
    imported = run_python(
        "-c", "import lambda_det; print(lambda_det.__file__)", env=env, cwd=elsewhere
    )
    assert imported.stdout.strip() == str(site / "lambda_det/__init__.py"), imported.stderr
    output = elsewhere / "demo"

    def demo_run(timeout: int):
        argv = ["-m", "lambda_det.cli.demo", *TINY_EVALUATED_RUN, "OUTPUT_DIR", output]
        return run_python(*argv, env=env, cwd=elsewhere, timeout=timeout)

    result = demo_run(800)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"+ {' '.join(MODULE_COMMAND)} --config-file {site}" in result.stdout
    assert "COCO AP by object size" in result.stdout
    assert (output / "model_final.pth").is_file() and (output / "ap_table.md").is_file()
    # The training child's record of its files and the demo's of its own share one file; run
    # again (make demo), the demo reuses the run and replaces its own pictures.
    record = json.loads((output / RECORD_FILE).read_text())
    assert record["run"] == {"not the run's": []} and set(record["files"]) == set(demo.DEMO_FILES)
    again = demo_run(300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"reusing the finished run in {output}" in again.stdout
    assert not list(output.glob("previous_*"))
