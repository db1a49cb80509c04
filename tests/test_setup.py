"""setup.py: lambda_det installs without detectron2 (the layers, the LambdaResNet and the timm
models need none); its ``detectron2`` extra names the detectron2 that is installed, never
another."""

import importlib.metadata
import runpy
import shutil
import subprocess
import sys

import pytest
import setuptools
from conftest import REPO_ROOT


def setup_arguments(monkeypatch, installed: set) -> dict:
    """The arguments setup.py passes to setuptools.setup when these distributions are installed."""

    def version(distribution):
        if distribution not in installed:
            raise importlib.metadata.PackageNotFoundError(distribution)
        return "0.6"

    captured = {}
    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(setuptools, "setup", lambda **arguments: captured.update(arguments))
    monkeypatch.chdir(REPO_ROOT)
    runpy.run_path(str(REPO_ROOT / "setup.py"), run_name="__main__")
    return captured


@pytest.mark.parametrize(
    "installed,extra",
    [
        (set(), []),
        ({"pb1-detectron2"}, ["pb1-detectron2>=0.6"]),
        ({"detectron2"}, ["detectron2>=0.6"]),  # a user's own build: never pb1-detectron2
        ({"detectron2", "pb1-detectron2"}, ["detectron2>=0.6"]),
    ],
)
def test_detectron2_is_an_extra_naming_the_installed_one(monkeypatch, installed, extra):
    arguments = setup_arguments(monkeypatch, installed)
    assert arguments["extras_require"]["detectron2"] == extra
    assert not [
        requirement for requirement in arguments["install_requires"] if "detectron2" in requirement
    ]
    assert arguments["install_requires"][:2] == ["torch>=2.5", "torchvision>=0.20"]


def test_the_build_installs_every_shipped_config_without_a_setuptools_warning(tmp_path):
    """Each folder of configs/ is a package of setup.py's (setuptools warns, a screenful each,
    about a folder it installs as data that Python could import), and every file under configs/
    lands in the built package."""
    for name in ("setup.py", "README.md"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("lambda_det", "configs"):
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder, ignore=ignore)
    built = tmp_path / "built"
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(built)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    shipped = {p.relative_to(tmp_path / "configs") for p in (tmp_path / "configs").rglob("*.*")}
    zoo = built / "lambda_det/model_zoo/configs"
    assert shipped and {p.relative_to(zoo) for p in zoo.rglob("*.*")} == shipped
