"""The tree keeps its style: ruff's linter (pycodestyle, pyflakes, import order) and formatter at
100 columns, as configured in ruff.toml, run by the ruff of this Python's environment (the
version that setup.py's "dev" extra pins)."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

RUFF = Path(sys.executable).with_name("ruff")
LINE_LENGTH = 100


def _ruff(*arguments: str, code: str = None) -> subprocess.CompletedProcess:
    if not RUFF.is_file():
        pytest.fail(f"{RUFF} is not installed: pip install -e '.[dev]' installs it")
    return subprocess.run(
        [str(RUFF), *arguments], input=code, cwd=REPO_ROOT, capture_output=True, text=True
    )


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff_finds_nothing(command):
    result = _ruff(*command, ".")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_ruff_checks_lines_at_100_columns():
    """ruff.toml's line length, and E501 among the rules it applies."""

    def check(code: str) -> subprocess.CompletedProcess:
        return _ruff("check", "--stdin-filename", "lambda_det/example.py", "-", code=code)

    assert check(f"x = {'1' * (LINE_LENGTH - 4)}\n").returncode == 0
    long = check(f"x = {'1' * (LINE_LENGTH - 3)}\n")
    assert long.returncode != 0 and "E501" in long.stdout, long.stdout


def _long_lines(path: Path) -> list:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{path}:{number}" for number, line in enumerate(lines, 1) if len(line) > LINE_LENGTH]


def test_no_line_is_longer_than_100_columns(tmp_path):
    """E501 passes over a line that ends in a pragma comment (``# noqa``, ``# type:``) or a URL,
    however long: every file that ruff checks is held to 100 columns here."""
    listed = _ruff("check", "--show-files", ".")
    files = [REPO_ROOT / line for line in listed.stdout.splitlines() if line.endswith(".py")]
    assert len(files) > 100, listed.stdout[-2000:] + listed.stderr[-2000:]
    assert [line for path in files for line in _long_lines(path)] == []
    # Negative control: a line of 118 columns that ruff's E501 lets pass.
    hidden = f"x = {'1' * (LINE_LENGTH - 4)}  # type: ignore\n"
    lint = _ruff("check", "--stdin-filename", "lambda_det/example.py", "-", code=hidden)
    assert lint.returncode == 0, lint.stdout
    (tmp_path / "example.py").write_text(hidden)
    assert _long_lines(tmp_path / "example.py") == [f"{tmp_path / 'example.py'}:1"]
