"""tools/test_matrix.py's entries hold setup.py's floors: the oldest torch and the oldest Python
that setup.py promises are entries the matrix runs, so neither drifts from what is tested."""

import importlib.util
import re

from conftest import REPO_ROOT


def matrix_entries() -> dict:
    spec = importlib.util.spec_from_file_location("test_matrix", REPO_ROOT / "tools/test_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ENTRIES


def test_the_matrix_runs_setup_pys_floors():
    setup = (REPO_ROOT / "setup.py").read_text()
    python_floor = re.search(r'python_requires=">=(\d+\.\d+)"', setup).group(1)
    torch_floor = re.search(r'"torch>=(\d+\.\d+)"', setup).group(1)
    entries = matrix_entries().values()
    assert python_floor in {python for python, _ in entries}, python_floor
    torch_versions = {re.search(r"torch==(\d+\.\d+)", pair).group(1) for _, pair in entries}
    assert torch_floor in torch_versions, torch_floor
