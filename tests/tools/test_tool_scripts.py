"""tools/*.py: each script runs the main(argv) of its module lambda_det.cli.<name> (for the
benchmarks, a module of benchmarks/ beside the package: conftest.BENCHMARK_COMMANDS) and exits
with its status; the tools' logic lives in those modules (the tests import them), but for the two
stdlib-only scripts that run before lambda_det is installed and the conftest.py to copy into
detectron2's tests."""

import ast
import importlib
import runpy
import sys
from pathlib import Path

import pytest
from conftest import BENCHMARK_COMMANDS, REPO_ROOT, tool_module

# Scripts that run with any Python, before (or without) lambda_det is installed: the standard
# library only (test_matrix makes the virtualenvs lambda_det is then installed in).
NOT_COMMANDS = {"build_detectron2", "detectron2_C_stub", "detectron2_tests_conftest", "test_matrix"}
SCRIPTS = sorted(
    path.stem for path in (REPO_ROOT / "tools").glob("*.py") if path.stem not in NOT_COMMANDS
)
# The one statement a benchmark's script adds: benchmarks/ is not installed.
CHECKOUT_ON_PATH = "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))"


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
    assert set(BENCHMARK_COMMANDS) <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_runs_its_modules_main_and_exits_with_its_status(name, monkeypatch):
    module = tool_module(name)
    calls = []
    monkeypatch.setattr(module, "main", lambda argv=None: calls.append(argv) or 7)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a benchmark's script adds the checkout
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO_ROOT / "tools" / f"{name}.py"), run_name="__main__")
    assert exit_info.value.code == 7 and calls == [None]  # main reads sys.argv


@pytest.mark.parametrize("name", sorted(set(SCRIPTS) - set(BENCHMARK_COMMANDS)))
def test_a_command_runs_as_its_module_too(name):
    """``python -m lambda_det.cli.<name>``: what an installed package, which has no tools/,
    runs. The module ends by exiting with its main's status."""
    tree = ast.parse(Path(tool_module(name).__file__).read_text())
    guard = tree.body[-1]
    assert ast.unparse(guard.test) == "__name__ == '__main__'"
    assert [ast.unparse(node) for node in guard.body] == ["sys.exit(main())"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_holds_no_logic(name):
    """A docstring, imports and the call of main: no function, class or other statement; a
    benchmark's script also puts the checkout on sys.path."""
    tree = ast.parse((REPO_ROOT / "tools" / f"{name}.py").read_text())
    statements = tree.body[1:]
    if name in BENCHMARK_COMMANDS:
        added = [node for node in statements if isinstance(node, ast.Expr)]
        assert [ast.unparse(node) for node in added] == [CHECKOUT_ON_PATH]
        statements = [node for node in statements if node not in added]
    kinds = {type(node).__name__ for node in statements}
    assert kinds <= {"Import", "ImportFrom", "If"}, kinds
    assert ast.get_docstring(tree)


@pytest.mark.parametrize("name", sorted(BENCHMARK_COMMANDS))
def test_a_benchmark_script_finds_benchmarks_from_any_folder(name, tmp_path, monkeypatch):
    """Run from another folder, with nothing of the checkout on sys.path (tests/benchmarks/
    would be a namespace package), the script imports its command from the checkout it is in."""
    monkeypatch.chdir(tmp_path)
    path = [
        entry for entry in sys.path if not Path(entry or ".").resolve().is_relative_to(REPO_ROOT)
    ]
    monkeypatch.setattr(sys, "path", path)
    for module in [module for module in sys.modules if module.split(".")[0] == "benchmarks"]:
        monkeypatch.delitem(sys.modules, module)
    with pytest.raises(ModuleNotFoundError):  # the negative control: not installed
        importlib.import_module("benchmarks")
    script = runpy.run_path(str(REPO_ROOT / "tools" / f"{name}.py"), run_name="imported")
    assert script["main"].__module__ == BENCHMARK_COMMANDS[name]
    assert Path(sys.modules[BENCHMARK_COMMANDS[name]].__file__).is_relative_to(REPO_ROOT)
