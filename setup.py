"""lambda_det: LambdaNetworks backbones (lambda layers, lambda convolutions, AFT) for Detectron2.

Install with the Makefile (``make test`` bootstraps ``.venv/``), or by hand into an environment that
already has torch and detectron2::

    pip install --no-build-isolation -e '.[detectron2,dev]'

Detectron2 has no wheels on PyPI. If no detectron2 is importable, run
``python tools/build_detectron2.py`` first (it builds the patched pure-Python 0.6 from
the ``pb1-detectron2`` source package). A detectron2 you built yourself is used as it is.

The layers, the LambdaResNet and its timm models need no detectron2: ``pip install -e .`` (and
timm) installs them alone; the detectron2 parts then say how to get detectron2 when first used.
"""

import importlib.metadata
import re
from pathlib import Path
from typing import List

from setuptools import find_namespace_packages, find_packages, setup

PACKAGE_INIT = Path(__file__).with_name("lambda_det") / "__init__.py"  # holds __version__
CONFIG_PACKAGE = "lambda_det.model_zoo.configs"
CONFIG_PACKAGES = [CONFIG_PACKAGE] + [
    f"{CONFIG_PACKAGE}.{folder}"
    for folder in find_namespace_packages(where=str(Path(__file__).with_name("configs")))
]


def detectron2_requirements() -> List[str]:
    """The ``detectron2`` extra: whichever detectron2 distribution is installed, so pip records it
    and never replaces a user's own; nothing when this build sees none.

    It never asks for one that is not installed: pb1-detectron2's sdist cannot build in pip's
    isolated build (it imports torch) and would shadow a user's own build. So detectron2 comes
    first (``python tools/build_detectron2.py``, or your own), then ``pip install
    --no-build-isolation -e '.[detectron2]'`` (an isolated build sees no detectron2)."""
    for distribution, minimum in (
        ("detectron2", "detectron2>=0.6"),
        ("pb1-detectron2", "pb1-detectron2>=0.6"),
    ):
        try:
            importlib.metadata.version(distribution)
            return [minimum]
        except importlib.metadata.PackageNotFoundError:
            pass
    return []


setup(
    name="lambda_det",
    version=re.search(r'__version__ = "(.+)"', PACKAGE_INIT.read_text())[1],
    description="LambdaNetworks (lambda layers, LambdaResNets) and AFT backbones for Detectron2",
    long_description=Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # The shipped configs travel inside the package (lambda_det.model_zoo finds them there): each
    # folder of configs/ is a data package of its own, as setuptools expects of folders it installs.
    packages=find_packages(include=["lambda_det", "lambda_det.*"]) + CONFIG_PACKAGES,
    package_dir={CONFIG_PACKAGE: "configs"},
    package_data={package: ["*.yaml", "*.py"] for package in CONFIG_PACKAGES},
    include_package_data=True,
    install_requires=[
        # torch.onnx.export(dynamo=...) needs 2.5; tested with 2.14 (CPU) and 2.11 (CUDA).
        "torch>=2.5",
        "torchvision>=0.20",
        "fvcore>=0.1.5",
        "iopath>=0.1.7",
        "pycocotools>=2.0.2",
        "opencv-python-headless>=4.5",
        "numpy",
        "Pillow>=7.1",
        "matplotlib",
        "yacs>=0.1.8",
        "tabulate",
        "shapely",  # detectron2 clips polygons with it when LSJ crops
    ],
    extras_require={
        # The detector backbones, configs, training and tools (see detectron2_requirements).
        "detectron2": detectron2_requirements(),
        # timm: the suite covers tools/convert_timm_checkpoint.py among every tool's checks.
        "dev": [
            "pytest>=7",
            "pytest-timeout",
            "pytest-xdist>=3",
            "hypothesis>=6",
            "onnx>=1.14",
            "onnxruntime>=1.16",
            "psutil",
            "import-linter>=2",
            "timm>=0.9",
            "ruff==0.17.6",  # tests/test_style.py (ruff.toml); its verdicts change between versions
        ],
        # What detectron2's tools/benchmark.py imports (python -m lambda_det.d2tool benchmark.py).
        "d2tools": ["psutil"],
        # Only to benchmark against the public implementations side by side (tools/benchmark_*.py
        # over benchmarks/, which lives in the checkout: packages= above ships lambda_det alone).
        "bench": ["timm>=0.9", "lambda-networks>=0.4"],
    },
)
