"""Build and install detectron2 0.6 from its PyPI source package, patched for today's stack.

Run as a script with the interpreter of the target environment (torch must already be installed)::

    .venv/bin/python tools/build_detectron2.py

Detectron2 is not on PyPI as a wheel. The only installable form is the source package
``pb1-detectron2==0.6`` (the v0.6 tag's Python files). Out of the box it does not install or
import on current torch / numpy / Pillow / setuptools, so this script downloads it, applies the
small, exact source patches below, and installs the result as ``pb1-detectron2 0.6+lambdadet``:

* ``setup.py``: no C++ extension (the package ships without ``layers/csrc``), no ``black==21.4b2``
  pin (black only pretty-prints lazy configs, and that old release breaks with click 8), and no
  ``panopticapi @ <url>`` extra (current pip refuses a PyPI package that declares one).
* ``detectron2/_C.py``: a pure-Python stand-in for the compiled extension. ``collect_env`` works; an
  op that needs C++ (rotated boxes, deformable conv) raises an error that says why.
* ``np.int``/``np.float``/``np.bool``/``np.str`` (removed in numpy 1.24) become the builtins they
  aliased; ``np.percentile(..., interpolation=)`` (gone in numpy 2.x) becomes ``method=``;
  ``Image.LINEAR`` (removed in Pillow 10) becomes ``Image.BILINEAR`` (the same filter).
* ``model_zoo``: no ``pkg_resources`` (removed from setuptools 82), and its configs installed:
  the sdist carries them in ``detectron2/model_zoo/configs``, but its ``setup.py`` lists them from
  a top-level ``configs/`` that the sdist lacks, so none was installed and
  ``model_zoo.get_config_file`` failed offline.
* ``COCOEvaluator``: the C++ "fast" COCOeval is unavailable, so pycocotools' own COCOeval is used.
* ``export``: the caffe2 exporter is skipped (caffe2 left torch); tracing and scripting remain.

A detectron2 that is already importable (a user's own build, 0.6 or newer, with its C++ ops) is left
untouched: the script says so and exits. One that this script built from an older recipe (its
``_C.py`` records the recipe's fingerprint) is rebuilt. Only the standard library is used here,
so this file runs before lambda_det is installed.
"""

import argparse
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Dict, List, Tuple

SDIST_NAME = "pb1-detectron2-0.6.tar.gz"
SDIST_SHA256 = "5d2e9e51e523ec72f6a31cca04b0a515492e9514b773a3d134cedc0677170b29"
LOCAL_VERSION_SUFFIX = "+lambdadet"
STUB_SOURCE = Path(__file__).with_name("detectron2_C_stub.py")

# (file, exact old text, new text). Every patch must apply exactly once, or the build stops:
# silently half-patching an unexpected source tree would be worse than failing.
SOURCE_PATCHES: List[Tuple[str, str, str]] = [
    ("setup.py", "    ext_modules=get_extensions(),\n", "    ext_modules=[],\n"),
    ("setup.py", '        "black==21.4b2",\n', ""),
    # A direct-URL dependency in an extra: current pip refuses the whole package for it.
    (
        "setup.py",
        '            "panopticapi @ '
        'https://github.com/cocodataset/panopticapi/archive/master.zip",\n',
        "",
    ),
    (
        "detectron2/data/transforms/transform.py",
        "interp=Image.LINEAR,",
        "interp=Image.BILINEAR,",
    ),
    (
        "setup.py",
        '    package_data={"detectron2.model_zoo": get_model_zoo_configs()},\n',
        '    package_data={"detectron2.model_zoo": ["configs/**/*.yaml", "configs/**/*.py"]},\n',
    ),
    ("detectron2/model_zoo/model_zoo.py", "import pkg_resources\n", ""),
    (
        "detectron2/model_zoo/model_zoo.py",
        'cfg_file = pkg_resources.resource_filename(\n        "detectron2.model_zoo", '
        'os.path.join("configs", config_path)\n    )',
        'cfg_file = os.path.join(os.path.dirname(__file__), "configs", config_path)',
    ),
    # The compiled op is reached through torch.ops, where the stub cannot answer; go through _C.
    (
        "detectron2/layers/nms.py",
        "    return torch.ops.detectron2.nms_rotated(boxes, scores, iou_threshold)\n",
        "    from detectron2 import _C\n\n"
        "    return _C.nms_rotated(boxes, scores, iou_threshold)\n",
    ),
    (
        "detectron2/export/__init__.py",
        "from .api import *\n",
        "try:  # lambda_det build: the caffe2 exporter needs caffe2, which torch 2 no longer has.\n"
        "    from .api import *\n"
        "except ImportError:\n"
        "    pass\n",
    ),
    # torch warns on every training run that meshgrid will need `indexing`; "ij" is what
    # detectron2 always got.
    (
        "detectron2/modeling/anchor_generator.py",
        "    shift_y, shift_x = torch.meshgrid(shifts_y, shifts_x)\n",
        '    shift_y, shift_x = torch.meshgrid(shifts_y, shifts_x, indexing="ij")\n',
    ),
    # numpy 2.x has only `method` (since 1.22) for what `interpolation` named.
    (
        "detectron2/data/benchmark.py",
        'np.percentile(all_times, k, interpolation="nearest")',
        'np.percentile(all_times, k, method="nearest")',
    ),
    (
        "detectron2/evaluation/coco_evaluation.py",
        "        self._use_fast_impl = use_fast_impl\n",
        "        # lambda_det build: no compiled detectron2._C, so always pycocotools' COCOeval.\n"
        "        self._use_fast_impl = False\n",
    ),
]

# numpy aliases removed in 1.24, replaced by the builtins they always were.
NUMPY_ALIAS = re.compile(r"\bnp\.(int|float|bool|str|object)\b(?![\w.])")


def detectron2_location() -> str:
    """Where an importable detectron2 lives, or "" when there is none."""
    spec = importlib.util.find_spec("detectron2")
    if spec is None or spec.origin is None:
        return ""
    return os.path.dirname(spec.origin)


def build_id() -> str:
    """Fingerprint of this build recipe; a detectron2 built from an older recipe is rebuilt."""
    recipe = repr((SOURCE_PATCHES, NUMPY_ALIAS.pattern, STUB_SOURCE.read_text(), SDIST_SHA256))
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def installed_build_id(location: str) -> str:
    """The recipe fingerprint of a detectron2 this script built, or "" for any other detectron2."""
    stub = Path(location) / "_C.py"
    if not stub.is_file():
        return ""
    found = re.search(r'^LAMBDA_DET_BUILD = "(\w+)"', stub.read_text(), re.MULTILINE)
    return found.group(1) if found else ""


def run(cmd: List[str], cwd: str = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def download_source(workdir: Path) -> Path:
    """Download the pb1-detectron2 sdist from the package index, check its hash, unpack it.

    ``pip download`` cannot be used: it prepares the sdist's metadata, and current pip rejects the
    package's direct-URL extra (``panopticapi @ https://...``) before anything can be patched.
    """
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    listing = urllib.request.urlopen(f"{index}/pb1-detectron2/", timeout=120).read().decode()
    links = re.findall(r'href="([^"]*%s[^"]*)"' % re.escape(SDIST_NAME), listing)
    if not links:
        raise SystemExit(f"{SDIST_NAME} is not listed at {index}/pb1-detectron2/")
    url = urllib.parse.urljoin(f"{index}/pb1-detectron2/", links[0].split("#")[0])
    print(f"downloading {url}", flush=True)
    data = urllib.request.urlopen(url, timeout=300).read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{url}: sha256 {digest} is not the expected {SDIST_SHA256}")
    archive_path = workdir / SDIST_NAME
    archive_path.write_bytes(data)
    with tarfile.open(archive_path) as archive:
        archive.extractall(workdir, filter="data")
    return workdir / SDIST_NAME[: -len(".tar.gz")]


def patch_source(root: Path) -> Dict[str, int]:
    """Apply SOURCE_PATCHES, the numpy-alias rewrite and the _C stub; returns edits per file."""
    edits: Dict[str, int] = {}
    for relative, old, new in SOURCE_PATCHES:
        path = root / relative
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(
                f"{path}: expected exactly one occurrence of {old!r}; is this detectron2 0.6?"
            )
        path.write_text(text.replace(old, new))
        edits[relative] = edits.get(relative, 0) + 1
    for path in sorted((root / "detectron2").rglob("*.py")):
        text = path.read_text()
        patched, count = NUMPY_ALIAS.subn(r"\1", text)
        if count:
            path.write_text(patched)
            relative = str(path.relative_to(root))
            edits[relative] = edits.get(relative, 0) + count
    (root / "detectron2" / "_C.py").write_text(
        STUB_SOURCE.read_text() + f'\nLAMBDA_DET_BUILD = "{build_id()}"\n'
    )
    edits["detectron2/_C.py"] = 1
    return edits


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", help="where to download and patch (default: a temp dir)")
    parser.add_argument(
        "--force", action="store_true", help="build even if a detectron2 is already importable"
    )
    args = parser.parse_args(argv)

    existing = detectron2_location()
    if existing and not args.force:
        installed = installed_build_id(existing)
        if not installed:
            print(f"detectron2 is already importable from {existing}; leaving it untouched.")
            return 0
        if installed == build_id():
            print(f"detectron2 at {existing} is this recipe's build ({installed}); nothing to do.")
            return 0
        print(f"detectron2 at {existing} is an older lambda_det build ({installed}); rebuilding.")
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("torch must be installed before detectron2 (its setup.py imports torch)")

    with tempfile.TemporaryDirectory(prefix="detectron2-build-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        root = download_source(workdir)
        for relative, count in patch_source(root).items():
            print(f"patched {relative} ({count} edit{'s' * (count > 1)})")
        os.environ["D2_VERSION_SUFFIX"] = LOCAL_VERSION_SUFFIX
        run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", str(root)])
    print(f"installed detectron2 0.6{LOCAL_VERSION_SUFFIX} (pure Python) into {sys.prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
