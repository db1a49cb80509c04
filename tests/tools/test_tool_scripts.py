"""tools/*.py: each script runs the main(argv) of its module lambda_det.cli.<name> and exits with
its status; the tools' logic lives in those modules (the tests import them), but for the two
stdlib-only scripts that run before lambda_det is installed and the conftest.py to copy into
detectron2's tests."""

import ast
import importlib
import runpy

import pytest
from conftest import REPO_ROOT

NOT_COMMANDS = {"build_detectron2", "detectron2_C_stub", "detectron2_tests_conftest"}
SCRIPTS = sorted(
    path.stem for path in (REPO_ROOT / "tools").glob("*.py") if path.stem not in NOT_COMMANDS
)


def test_the_tools_are_there():
    assert {
        "train_net",
        "lazyconfig_train_net",
        "predict",
        "export_model",
        "demo",
        "benchmark_lambda",
        "param_counts",
    } <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_runs_its_modules_main_and_exits_with_its_status(name, monkeypatch):
    module = importlib.import_module(f"lambda_det.cli.{name}")
    calls = []
    monkeypatch.setattr(module, "main", lambda argv=None: calls.append(argv) or 7)
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO_ROOT / "tools" / f"{name}.py"), run_name="__main__")
    assert exit_info.value.code == 7 and calls == [None]  # main reads sys.argv


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_holds_no_logic(name):
    """A docstring, imports and the call of main: no function, class or other statement."""
    tree = ast.parse((REPO_ROOT / "tools" / f"{name}.py").read_text())
    kinds = {type(node).__name__ for node in tree.body[1:]}
    assert kinds <= {"Import", "ImportFrom", "If"}, kinds
    assert ast.get_docstring(tree)
