"""Run one of detectron2's own scripts (its ``tools/``: analyze_model.py, visualize_data.py,
benchmark.py, ...) unmodified on lambda_det's configs::

    python -m lambda_det.d2tool analyze_model.py --tasks parameter \\
        --config-file configs/Demo/lambda_r26_shapes.yaml

The script runs in this process as ``__main__``, with the rest of the command line as its own,
after lambda_det has become part of detectron2:

* the backbones and the bundled shapes datasets are registered;
* ``detectron2.config.get_cfg()`` gives detectron2's defaults plus lambda_det's keys, and
  freezing that config does what :func:`lambda_det.run_config.load_config` does after merging
  (on the CPU, SyncBN becomes naiveSyncBN) and registers its ``DATASETS.COCO_INSTANCES``;
* a data loader built from a config without a mapper gets lambda_det's
  (:func:`lambda_det.data.build_mapper`): the large-scale-jitter crops that training uses when
  ``INPUT.LSJ.ENABLED``, and detectron2's test resize for evaluation;
* no file the script is given runs code: detectron2's checkpointers read weights with
  :func:`lambda_det.checkpoint.load_checkpoint_file` (a restricted unpickler for ``.pkl``,
  ``weights_only`` for torch files; what loads, loads as detectron2 loads it), and
  ``LazyConfig.load`` reads a ``.yaml`` with yaml's safe loader (a ``.py`` recipe is Python: it
  runs, as in detectron2). A refused file, a missing one or a yaml tag is one ``error:`` line
  with exit status 2 (``--debug`` before SCRIPT: its traceback).

SCRIPT is a path, or the name of a script of the installed detectron2 distribution (the
pb1-detectron2 that tools/build_detectron2.py builds installs detectron2's tools/ as the package
``tools``). A detectron2 installed from its git checkout installs none: pass the path of the
script in that checkout's tools/. One process: detectron2's ``launch`` starts its worker
processes without these registrations, so leave ``--num-gpus`` at 1.
"""

import contextlib
import importlib.metadata
import json
import os
import runpy
import sys
import urllib.parse
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

from lambda_det.compat import import_detectron2

import_detectron2()  # quietly, and with a helpful error when it is missing

from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import CfgNode
from detectron2.data import DatasetMapper as Detectron2DatasetMapper

from lambda_det.checkpoint import load_checkpoint_file
from lambda_det.compat.internals import detectron2_tool_patches
from lambda_det.config import CfgNode as SafeCfgNode
from lambda_det.config.lazy import load_lazy_config_file

# Imported before detectron2's get_cfg is patched: it takes detectron2's own.
from lambda_det.run_config import get_cfg as lambda_det_get_cfg
from lambda_det.utils.errors import MissingFileError

__all__ = ["main", "detectron2_tool_path", "lambda_det_in_detectron2"]

USAGE = "usage: python -m lambda_det.d2tool [--debug] SCRIPT [SCRIPT'S ARGUMENTS ...]"
# Distributions whose files may include detectron2's tools/ (pb1-detectron2 installs them).
DETECTRON2_DISTRIBUTIONS = ("pb1-detectron2", "detectron2")


def _editable_checkout(distribution: str) -> Optional[Path]:
    """The source folder of ``distribution`` when it is an editable install of a local folder
    (``pip install -e`` of a detectron2 clone, PEP 610's direct_url.json), else None."""
    try:
        direct_url = json.loads(
            importlib.metadata.distribution(distribution).read_text("direct_url.json") or "{}"
        )
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    url = direct_url.get("url", "")
    if direct_url.get("dir_info", {}).get("editable") and url.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
    return None


def _installed_tools() -> dict:
    """File name -> path of each script of detectron2's tools/ that its distribution installed,
    or that the clone of an editable install holds (checked with upstream main 02b5c4e)."""
    tools = {}
    for distribution in DETECTRON2_DISTRIBUTIONS:
        try:
            files = importlib.metadata.files(distribution) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for file in files:
            if (
                len(file.parts) == 2
                and file.parts[0] == "tools"
                and file.suffix == ".py"
                and file.name != "__init__.py"
            ):
                tools.setdefault(file.name, str(file.locate()))
        checkout = _editable_checkout(distribution)
        if checkout is not None:
            for file in sorted((checkout / "tools").glob("*.py")):
                if file.name != "__init__.py":
                    tools.setdefault(file.name, str(file))
    return tools


def detectron2_tool_path(script: str) -> str:
    """``script`` itself when it is a file, else the installed detectron2 script of that name
    (``analyze_model`` or ``analyze_model.py``).

    Raises:
        FileNotFoundError: naming the scripts there are, and where to find the others.
    """
    if os.path.isfile(script):
        return script
    name = script if script.endswith(".py") else f"{script}.py"
    tools = _installed_tools()
    if name in tools:
        return tools[name]
    there = (
        f"the installed detectron2 has {', '.join(sorted(tools))}"
        if tools
        else "the installed detectron2 has no tools/ scripts"
    )
    raise MissingFileError(
        f"detectron2 script {script!r} is neither a file nor installed ({there}): pass the path "
        f"of tools/{name} in a clone of https://github.com/facebookresearch/detectron2"
    )


class _LambdaDetConfig(SafeCfgNode):
    """A detectron2 config with lambda_det's keys, whose ``merge_from_file`` runs no code from
    the file (:class:`lambda_det.config.CfgNode`); freezing it prepares it for the run, as
    :func:`lambda_det.run_config.load_config` does, and registers its datasets."""

    def freeze(self):
        if "MODEL" in self:  # the root (nodes below it are of this class too)
            from lambda_det.config import prepare_merged_config
            from lambda_det.data import register_datasets

            register_datasets(self)
            prepare_merged_config(self)
        super().freeze()


def _get_cfg() -> CfgNode:
    return _LambdaDetConfig(lambda_det_get_cfg())


def _mapper(*args, **kwargs):
    """What detectron2's loaders build as ``DatasetMapper(cfg, is_train)`` when given no mapper:
    lambda_det's mapper; any other construction is detectron2's."""
    if len(args) == 2 and not kwargs and isinstance(args[0], CfgNode):
        from lambda_det.data import build_mapper

        return build_mapper(args[0], is_train=args[1])
    return Detectron2DatasetMapper(*args, **kwargs)


def _load_checkpoint_file(self, filename: str):
    """A checkpointer's ``_load_file``: safely (:func:`load_checkpoint_file`)."""
    return load_checkpoint_file(filename)


_detectron2_checkpointer_load = DetectionCheckpointer.load


def _load_checkpoint(self, path: str, *args, **kwargs):
    """``DetectionCheckpointer.load``, with a missing local file named (fvcore asserts)."""
    if path and "://" not in path and not os.path.isfile(path):
        raise MissingFileError(
            f"checkpoint {path!r} does not exist: pass the path or URL of a "
            f"weights file (MODEL.WEIGHTS, or a LazyConfig's "
            f"train.init_checkpoint), or '' for none"
        )
    return _detectron2_checkpointer_load(self, path, *args, **kwargs)


@contextlib.contextmanager
def lambda_det_in_detectron2() -> Iterator[None]:
    """Within: detectron2's ``get_cfg`` has lambda_det's keys and its loaders lambda_det's mapper,
    its checkpointers and ``LazyConfig.load`` run no code from a file (see the module docstring);
    the backbones and datasets are registered."""
    import lambda_det.modeling  # noqa: F401  (registers the backbones)
    from lambda_det.data import register_datasets

    register_datasets()

    with detectron2_tool_patches(
        get_cfg=_get_cfg,
        dataset_mapper=_mapper,
        load_file=_load_checkpoint_file,
        checkpointer_load=_load_checkpoint,
        lazy_config_load=load_lazy_config_file,
    ):
        yield


def run_script(path: str, args: Sequence[str], debug: bool = False) -> None:
    """Run the script at ``path`` as ``__main__`` with command line ``args``; an error of its
    input (a :class:`lambda_det.utils.errors.UserError` of lambda_det's loaders) is one line (with
    ``debug``, its traceback)."""
    from lambda_det.cli.arguments import reporting_user_errors

    argv = sys.argv
    sys.argv = [path, *args]
    try:
        with reporting_user_errors(debug), lambda_det_in_detectron2():
            runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = argv


def main(argv: Optional[List[str]] = None) -> int:
    from lambda_det.cli.arguments import reporting_user_errors

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = argv[:1] == ["--debug"]
    argv = argv[debug:]
    if not argv or argv[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__}")
        return 0 if argv else 2
    with reporting_user_errors(debug):
        path = detectron2_tool_path(argv[0])
    run_script(path, argv[1:], debug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
