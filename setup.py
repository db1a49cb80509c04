"""lambda_det: LambdaNetworks backbones (lambda layers, lambda convolutions, AFT) for Detectron2.

Install with the Makefile (``make test`` bootstraps ``.venv/``), or by hand into an environment that
already has torch and detectron2::

    pip install --no-build-isolation -e '.[dev]'

Detectron2 has no wheels on PyPI. If no detectron2 is importable, run
``python tools/build_detectron2.py`` first (it builds the patched pure-Python 0.6 from
the ``pb1-detectron2`` source package). A detectron2 you built yourself is used as it is.
"""
import importlib.metadata
import re
from pathlib import Path

from setuptools import find_packages, setup


PACKAGE_INIT = Path(__file__).with_name("lambda_det") / "__init__.py"  # holds __version__


NO_DETECTRON2 = (
    "lambda_det: no detectron2 is visible to this build. With pip's default build isolation the "
    "build cannot see the detectron2 of your environment: install with `pip install "
    "--no-build-isolation -e .`; with no detectron2 installed, run `python "
    "tools/build_detectron2.py` first (or `make venv`, which does both)")


def detectron2_requirement() -> str:
    """Require whichever detectron2 distribution is installed, so pip never replaces a user's own.

    With none visible, stop: pip's isolated build would otherwise ask for pb1-detectron2, whose
    sdist cannot build there (it imports torch) and which would shadow a user's own build."""
    for distribution, minimum in (("detectron2", "detectron2>=0.6"),
                                  ("pb1-detectron2", "pb1-detectron2>=0.6")):
        try:
            importlib.metadata.version(distribution)
            return minimum
        except importlib.metadata.PackageNotFoundError:
            pass
    raise SystemExit(NO_DETECTRON2)


setup(
    name="lambda_det",
    version=re.search(r'__version__ = "(.+)"', PACKAGE_INIT.read_text())[1],
    description="LambdaNetworks (lambda layers, LambdaResNets) and AFT backbones for Detectron2",
    long_description=Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    # The shipped configs travel inside the package (lambda_det.model_zoo finds them there).
    packages=find_packages(include=["lambda_det", "lambda_det.*"]) + ["lambda_det.model_zoo.configs"],
    package_dir={"lambda_det.model_zoo.configs": "configs"},
    package_data={"lambda_det.model_zoo.configs": ["*.yaml", "*/*.yaml",
                                                   "LazyConfigs/*/*.py"]},
    include_package_data=True,
    install_requires=[
        # torch.onnx.export(dynamo=...) needs 2.5; tested with 2.14 (CPU) and 2.11 (CUDA).
        "torch>=2.5",
        "torchvision>=0.20",
        detectron2_requirement(),
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
        # timm: the suite covers tools/convert_timm_checkpoint.py among every tool's checks.
        "dev": ["pytest>=7", "pytest-timeout", "pytest-xdist>=3", "hypothesis>=6", "onnx>=1.14",
                "onnxruntime>=1.16", "psutil", "import-linter>=2", "timm>=0.9"],
        # What detectron2's tools/benchmark.py imports (python -m lambda_det.d2tool benchmark.py).
        "d2tools": ["psutil"],
        # Only to benchmark against the public implementations side by side.
        "bench": ["timm>=0.9", "lambda-networks>=0.4"],
    },
)
