"""The tree keeps its style: ruff's linter (pycodestyle, pyflakes, import order) and formatter at
100 columns, as configured in ruff.toml."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

RUFF = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff_finds_nothing(command):
    if not Path(RUFF).is_file():
        pytest.fail("ruff is not installed: pip install -e '.[dev]' installs it")
    result = subprocess.run([RUFF, *command, "."], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
