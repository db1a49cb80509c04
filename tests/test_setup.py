"""setup.py: lambda_det installs without detectron2 (the layers, the LambdaResNet and the timm
models need none); its ``detectron2`` extra names the detectron2 that is installed, never
another."""

import importlib.metadata
import runpy

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
