"""Run the quick test suite on each entry of lambda_det's torch and Python matrix.

Each entry gets its own virtualenv (``make venv VENV=<dir>/<entry> PYTHON=... TORCH_PACKAGES=...``)
and runs ``pytest tests -m "not slow" -n 2`` there; one Markdown table row per entry (entry,
passed / failed / skipped, date, host, commit, command) is printed and appended to ``--table``;
the suite's output is kept in ``<venv>/matrix-pytest.log``.
The entries are setup.py's floors (torch 2.5, Python 3.10), releases between them, and the newest
(torch 2.14.1, Python 3.13). CI runs the default entry (``make test``) only.

    python tools/test_matrix.py --venvs /work/venvs                 # every entry
    python tools/test_matrix.py --venvs /work/venvs torch-2.5 py3.10  # some
"""

import argparse
import datetime
import glob
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]

# name: (Python version, torch pair).
ENTRIES = {
    "torch-2.5": ("3.11", "torch==2.5.1 torchvision==0.20.1"),
    "torch-2.6": ("3.11", "torch==2.6.0 torchvision==0.21.0"),
    "torch-2.9": ("3.11", "torch==2.9.1 torchvision==0.24.1"),
    "torch-2.14": ("3.11", "torch==2.14.1 torchvision==0.29.1"),
    "py3.10": ("3.10", "torch==2.14.1 torchvision==0.29.1"),
    "py3.13": ("3.13", "torch==2.14.1 torchvision==0.29.1"),
}


def find_python(version: str) -> str:
    """A Python of ``version``: pyenv's, else pythonX.Y on PATH."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python"))
    return found[-1] if found else f"python{version}"


def counts(output: str) -> dict:
    """passed / failed / skipped (errors count as failed) from pytest's summary line."""
    found = {kind: 0 for kind in ("passed", "failed", "skipped")}
    for number, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", output):
        found["failed" if kind.startswith("error") else kind] += int(number)
    return found


def run_entry(name: str, venvs: Path) -> str:
    python_version, torch_packages = ENTRIES[name]
    venv = venvs / name
    make = [
        "make",
        "venv",
        f"VENV={venv}",
        f"PYTHON={find_python(python_version)}",
        f"TORCH_PACKAGES={torch_packages}",
    ]
    built = subprocess.run(make, cwd=CHECKOUT, capture_output=True, text=True)
    test = [str(venv / "bin/python"), "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"]
    test += ["-m", "not slow", "-n", "2"]
    command = " ".join(make[:2] + [f'"{part}"' if " " in part else part for part in make[2:]])
    command += " && OMP_NUM_THREADS=1 " + " ".join(test[:-4]) + ' -m "not slow" -n 2'
    if built.returncode != 0:
        result = {"passed": 0, "failed": 0, "skipped": 0}
        summary = "venv failed: " + (built.stdout + built.stderr).strip().splitlines()[-1]
    else:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        tested = subprocess.run(
            test + ["-rfE"], cwd=CHECKOUT, capture_output=True, text=True, env=env
        )
        (venv / "matrix-pytest.log").write_text(tested.stdout + tested.stderr)  # what failed
        result = counts(tested.stdout.strip().splitlines()[-1] if tested.stdout.strip() else "")
        summary = f"{result['passed']} / {result['failed']} / {result['skipped']}"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=CHECKOUT, capture_output=True, text=True
    ).stdout.strip()
    date = datetime.date.today().isoformat()
    return f"| {name} | {summary} | {date} | {socket.gethostname()} | {commit} | `{command}` |"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entries", nargs="*", help=f"some of {', '.join(ENTRIES)} (default: all)")
    parser.add_argument("--venvs", type=Path, required=True, help="folder for the virtualenvs")
    parser.add_argument("--table", type=Path, help="append the rows to this file")
    args = parser.parse_args(argv)
    unknown = [name for name in args.entries if name not in ENTRIES]
    if unknown:
        parser.error(f"unknown entry {unknown[0]!r}; the entries are {', '.join(ENTRIES)}")
    for name in args.entries or list(ENTRIES):
        row = run_entry(name, args.venvs)
        print(row, flush=True)
        if args.table:
            with open(args.table, "a") as f:
                f.write(row + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
