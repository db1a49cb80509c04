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
* no file the script is given runs code, whatever ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says:
  detectron2's checkpointers, and ``torch.load`` where a script calls it itself
  (convert-torchvision-to-d2.py), read weights with
  :func:`lambda_det.checkpoint.load_checkpoint_file` (a restricted unpickler for ``.pkl``,
  ``weights_only`` for torch files; what loads, loads as detectron2 loads it), and
  ``LazyConfig.load`` reads a ``.yaml`` as data
  (:func:`lambda_det.config.lazy.load_lazy_config_file`: yaml's safe loader, and each
  ``_target_`` on the allow-list). A ``.py`` recipe is Python: it runs, as in detectron2; so
  does a LazyConfig yaml given as ``--trust-config FILE``. A refused file, a missing one or a
  yaml tag is one ``error:`` line with exit status 2 (``--debug`` before SCRIPT: its
  traceback);
* the files a script writes itself follow lambda_det's output rule
  (:func:`lambda_det.utils.atomic.check_output_file`): convert-torchvision-to-d2.py's OUTPUT,
  the images of visualize_data.py and visualize_json_results.py are never a file the command
  reads (its input, a file its command line names, an image it read), an existing file is
  replaced only with ``--overwrite`` before SCRIPT, and each is written whole or not at all
  (:class:`ScriptFiles`);
* detectron2's training scripts (train_net.py, plain_train_net.py, lazyconfig_train_net.py)
  follow the one output rule of lambda_det's own (:func:`training_output_dir`): their output
  folder (OUTPUT_DIR, or a LazyConfig's ``train.output_dir``, with the command line's overrides)
  is locked for the run and prepared by :func:`lambda_det.cli.output_dir.prepare_output_dir`
  before the script starts: a user's log.txt, metrics.json, model_final.pth, ... there is
  never written over (only with ``--overwrite``), a folder that holds a run is trained on only
  with the script's ``--resume`` or d2tool's ``--restart`` (which first moves the run's own
  files to ``previous_<date-time>/``), and ``--eval-only`` writes into a run's own folder as
  detectron2 does;
* a LazyConfig yaml given where a script reads a yacs config (benchmark.py, train_net.py,
  ``--config-file x.yaml``) is one line saying so.

SCRIPT is a path, or the name of a script of the installed detectron2 distribution (the
pb1-detectron2 that tools/build_detectron2.py builds installs detectron2's tools/ as the package
``tools``). A detectron2 installed from its git checkout installs none: pass the path of the
script in that checkout's tools/. One process: detectron2's ``launch`` starts its worker
processes without these registrations, so leave ``--num-gpus`` at 1.
"""

import contextlib
import dataclasses
import importlib.metadata
import io
import json
import os
import runpy
import shutil
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from lambda_det.compat import import_detectron2

import_detectron2()  # quietly, and with a helpful error when it is missing

from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import CfgNode
from detectron2.data import DatasetMapper as Detectron2DatasetMapper
from detectron2.utils.file_io import PathManager

from lambda_det.checkpoint import load_checkpoint_file
from lambda_det.cli.output_dir import (
    OutputDirLock,
    check_run_writes,
    prepare_output_dir,
    record_run,
)
from lambda_det.compat.internals import detectron2_script_file_patches, detectron2_tool_patches
from lambda_det.config import CfgNode as SafeCfgNode
from lambda_det.config import ConfigFileError
from lambda_det.config.lazy import load_lazy_config_file

# Imported before detectron2's get_cfg is patched: it takes detectron2's own.
from lambda_det.run_config import get_cfg as lambda_det_get_cfg
from lambda_det.utils.atomic import (
    atomic_path,
    check_output_file,
    file_identity,
    reporting_write_errors,
)
from lambda_det.utils.errors import ExistingFileError, MissingFileError, UserError

__all__ = [
    "main",
    "detectron2_tool_path",
    "lambda_det_in_detectron2",
    "ScriptFiles",
    "script_output_dir",
    "training_output_dir",
    "TRAINING_SCRIPTS",
]

USAGE = (
    "usage: python -m lambda_det.d2tool [--debug] [--overwrite] [--restart] "
    "[--trust-config FILE ...] SCRIPT [SCRIPT'S ARGUMENTS ...]"
)
OPTIONS = """d2tool's options (before SCRIPT; the script's own go after it):
  --debug              an error of a file is its traceback, not one line
  --overwrite          the script may replace an existing file it writes (never one the
                       command reads)
  --restart            a training script starts over in an output folder that holds a run:
                       the run's own files are first moved to previous_<date-time>/
  --trust-config FILE  load the LazyConfig yaml FILE as detectron2 does: its _target_s and
                       python tags run, whatever they name (repeat for more files)"""
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


# A LazyConfig's sections (lowercase: a yacs config's keys are MODEL, SOLVER, ...).
LAZY_CONFIG_SECTIONS = ("model", "dataloader", "optimizer", "lr_multiplier", "train")


class _LambdaDetConfig(SafeCfgNode):
    """A detectron2 config with lambda_det's keys, whose ``merge_from_file`` runs no code from
    the file (:class:`lambda_det.config.CfgNode`) and names a LazyConfig given in its place;
    freezing it prepares it for the run, as :func:`lambda_det.run_config.load_config` does,
    and registers its datasets."""

    @classmethod
    def load_yaml_with_base(cls, filename: str, allow_unsafe: bool = False) -> dict:
        data = super().load_yaml_with_base(filename, allow_unsafe)
        _refuse_lazy_config(data, filename)
        return data

    def freeze(self):
        if "MODEL" in self:  # the root (nodes below it are of this class too)
            from lambda_det.config import prepare_merged_config
            from lambda_det.data import register_datasets

            register_datasets(self)
            prepare_merged_config(self)
        super().freeze()


def _refuse_lazy_config(data: dict, filename: str) -> None:
    """A yaml file read as a yacs config whose keys are a LazyConfig's sections (a saved
    LazyConfig) is one line saying what to pass (detectron2 would say "Non-existent config
    key: train")."""
    sections = [key for key in LAZY_CONFIG_SECTIONS if key in data]
    if not sections:
        return
    script = os.path.basename(sys.argv[0])
    instead = (
        "pass its .py recipe (benchmark.py reads a --config-file that does not end in .yaml "
        "with LazyConfig.load)"
        if script == "benchmark.py"
        else "pass a yacs config (a LazyConfig runs with lazyconfig_train_net.py)"
    )
    raise ConfigFileError(
        f"config file {filename} is a LazyConfig (its keys {', '.join(sections)} are a "
        f"LazyConfig's sections), not a yacs config (keys MODEL, SOLVER, ...): {script} reads "
        f"a .yaml --config-file as a yacs config; {instead}"
    )


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


_torch_load = torch.load  # torch's own, for the torch.load of the scripts below


def _torch_load_of_scripts(f, map_location=None, *args, **kwargs):
    """``torch.load`` as detectron2's scripts call it themselves: a file path is first read by
    :func:`load_checkpoint_file` (a file it refuses is one line, whatever ``weights_only`` or
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD say), then given as ``torch.load(weights_only=True)``
    reads it (a ``.pkl``: as the loader reads it). An open file, or a call that asks for
    ``weights_only=True`` itself, is torch's load with ``weights_only=True``."""
    if kwargs.get("weights_only") is True or not isinstance(f, (str, os.PathLike)):
        kwargs["weights_only"] = True
        return _torch_load(f, map_location, *args, **kwargs)
    path = os.fspath(f)
    if "://" not in path and not os.path.isfile(path):
        raise MissingFileError(f"weights file {path!r} does not exist: pass a weights file")
    checkpoint = load_checkpoint_file(path)
    if path.endswith(".pkl"):
        return checkpoint
    return _torch_load(PathManager.get_local_path(path), map_location, weights_only=True)


# The option of each detectron2 script that names where it writes, for the output rule's
# errors, and (index) the scripts that write the file a positional argument names.
_OUTPUT_OPTIONS = {
    "visualize_data.py": "--output-dir",
    "visualize_json_results.py": "--output",
    "convert-torchvision-to-d2.py": "OUTPUT",
}
_OUTPUT_ARGUMENTS = {"convert-torchvision-to-d2.py": 1}


class ScriptFiles:
    """lambda_det's output rule for the files a detectron2 script writes itself
    (:func:`lambda_det.utils.atomic.check_output_file`): never a file the command reads (a file
    its command line names, an image it has read), an existing file that this command did not
    write only with ``overwrite``; each written through a temporary file
    (:func:`lambda_det.utils.atomic.atomic_path`).

    Args:
        script: the script's path (its name picks the option that errors name).
        args: its command line.
    """

    def __init__(self, script: str = "", args: Sequence[str] = (), overwrite: bool = False):
        self.script = os.path.basename(script) or "the script"
        self.option = _OUTPUT_OPTIONS.get(self.script, "its output path")
        self.overwrite = overwrite
        self.reads = _files_named(args, skip=_OUTPUT_ARGUMENTS.get(self.script))
        self._images_read: Dict[Tuple[int, int], str] = {}
        self._written = set()

    def read(self, path) -> None:
        """Note a file the command reads (an image; any other is passed over)."""
        identity = file_identity(path) if isinstance(path, (str, os.PathLike)) else None
        if identity is not None:
            self._images_read.setdefault(identity, os.fspath(path))

    def check(self, path) -> None:
        """Raise the output rule's error for writing ``path`` now, if any."""
        path = os.fspath(path)
        if os.path.abspath(path) in self._written:  # the command's own file
            return
        what = f"{self.script}'s output {path!r}"
        if file_identity(path) in self._images_read:
            raise ExistingFileError(
                f"{what} is an image this command reads: pass another {self.option}"
            )
        check_output_file(path, True, self.reads, self.option, what)  # a file it reads: never
        try:
            check_output_file(path, self.overwrite, None, self.option, what)
        except ExistingFileError as error:
            raise ExistingFileError(
                f"{error} (python -m lambda_det.d2tool --overwrite {self.script} ...: "
                f"d2tool's options go before SCRIPT)"
            ) from None

    def write(self, path, write: Callable[[str], Any]) -> Any:
        """``write(temporary)`` for ``path``, under the rule; renamed over ``path`` once done."""
        path = os.fspath(path)
        self.check(path)
        suffix = os.path.splitext(path)[1]  # writers choose the format by it
        with atomic_path(path, suffix=suffix, option=self.option) as temporary:
            result = write(temporary)
        self._written.add(os.path.abspath(path))
        return result

    @contextlib.contextmanager
    def output_argument(self, args: List[str]) -> Iterator[List[str]]:
        """``args`` with the output file a positional argument names (convert-torchvision-to-
        d2.py's OUTPUT) checked and replaced by a temporary file, renamed over it when the
        script succeeds; other scripts' ``args`` as they are."""
        index = _OUTPUT_ARGUMENTS.get(self.script)
        if index is None:
            yield args
            return
        if len(args) != index + 1:
            raise UserError(
                f"{self.script} takes INPUT and OUTPUT (e.g. r50.pth r50.pkl), got "
                f"{len(args)} arguments (d2tool's options go before SCRIPT)"
            )
        output = args[index]
        self.check(output)
        # The script writes into a new folder beside OUTPUT (its errors stay its own); the file
        # it wrote then replaces OUTPUT as a whole.
        with reporting_write_errors(output, self.option):
            folder = tempfile.mkdtemp(
                prefix=".d2tool-", dir=os.path.dirname(os.path.abspath(output))
            )
        try:
            written = os.path.join(folder, os.path.basename(output))
            yield [*args[:index], written, *args[index + 1 :]]
            with atomic_path(output, option=self.option) as temporary:
                os.replace(written, temporary)
            self._written.add(os.path.abspath(output))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _files_named(args: Sequence[str], skip: Optional[int] = None) -> Dict[str, str]:
    """The existing files that a command line names (``--input x.json``, ``--opt=x``, a
    positional argument but the one at ``skip``), as :func:`check_output_file`'s reads."""
    reads = {}
    for position, arg in enumerate(args):
        path = arg.partition("=")[2] if arg.startswith("-") else arg
        if position == skip or not path or not os.path.isfile(path):
            continue
        before = args[position - 1] if position else ""
        role = f"its {before}" if before.startswith("-") and path == arg else "its input"
        reads[f"{role} {path!r}"] = path
    return reads


@contextlib.contextmanager
def lambda_det_in_detectron2(
    trusted_configs: Sequence[str] = (), files: Optional[ScriptFiles] = None
) -> Iterator[None]:
    """Within: detectron2's ``get_cfg`` has lambda_det's keys and its loaders lambda_det's mapper,
    its checkpointers, ``torch.load`` and ``LazyConfig.load`` run no code from a file (see the
    module docstring); the backbones and datasets are registered. A LazyConfig yaml of
    ``trusted_configs`` (compared as files) loads as detectron2 loads it. ``files``: the output
    rule of the images scripts write (default: no file read yet, no ``--overwrite``)."""
    import lambda_det.modeling  # noqa: F401  (registers the backbones)
    from lambda_det.data import register_datasets

    register_datasets()
    trusted = {file_identity(path) for path in trusted_configs} - {None}
    files = files or ScriptFiles()

    def lazy_config_load(filename: str, keys=None):
        is_trusted = "://" not in filename and file_identity(filename) in trusted
        return load_lazy_config_file(filename, keys, trusted=is_trusted)

    with (
        detectron2_tool_patches(
            get_cfg=_get_cfg,
            dataset_mapper=_mapper,
            load_file=_load_checkpoint_file,
            checkpointer_load=_load_checkpoint,
            lazy_config_load=lazy_config_load,
        ),
        detectron2_script_file_patches(
            torch_load=_torch_load_of_scripts, write_file=files.write, read_file=files.read
        ),
    ):
        yield


@dataclasses.dataclass
class Options:
    """d2tool's own options (before SCRIPT)."""

    debug: bool = False
    overwrite: bool = False
    restart: bool = False
    trusted_configs: List[str] = dataclasses.field(default_factory=list)


def parse_options(argv: Sequence[str]) -> Tuple[Options, List[str]]:
    """d2tool's options at the start of ``argv``, and the rest (SCRIPT and its arguments).

    Raises:
        UserError: an unknown option, or ``--trust-config`` without a file.
    """
    options, rest = Options(), list(argv)
    while rest and rest[0].startswith("--") and rest[0] != "--help":
        option = rest.pop(0)
        name, has_value, value = option.partition("=")
        if option == "--debug":
            options.debug = True
        elif option == "--overwrite":
            options.overwrite = True
        elif option == "--restart":
            options.restart = True
        elif name == "--trust-config":
            value = value if has_value else (rest.pop(0) if rest else "")
            if not os.path.isfile(value):
                raise MissingFileError(
                    f"--trust-config {value!r} is no file: give the LazyConfig file you trust, "
                    f"--trust-config FILE SCRIPT ..."
                )
            options.trusted_configs.append(value)
        else:
            raise UserError(
                f"{option} is no option of d2tool (--debug, --overwrite, --restart, "
                f"--trust-config FILE, "
                f"before SCRIPT): a script's own options go after SCRIPT"
            )
    return options, rest


def run_script(
    path: str,
    args: Sequence[str],
    debug: bool = False,
    overwrite: bool = False,
    trusted_configs: Sequence[str] = (),
    restart: bool = False,
) -> None:
    """Run the script at ``path`` as ``__main__`` with command line ``args``; an error of its
    input (a :class:`lambda_det.utils.errors.UserError` of lambda_det's loaders) is one line (with
    ``debug``, its traceback). ``overwrite``, ``trusted_configs`` and ``restart``: d2tool's
    options."""
    from lambda_det.cli.arguments import reporting_user_errors

    argv = sys.argv
    files = ScriptFiles(path, args, overwrite)
    try:
        with (
            reporting_user_errors(debug),
            lambda_det_in_detectron2(trusted_configs, files),
            files.output_argument(list(args)) as script_args,
        ):
            sys.argv = [path, *script_args]
            with training_output_dir(path, script_args, overwrite, restart):
                finished = _run_to_the_end(path)
    finally:
        sys.argv = argv
    if finished is not None:
        raise finished


# detectron2's scripts that train (or evaluate) into an output folder, and how each reads it.
TRAINING_SCRIPTS = {
    "train_net.py": "OUTPUT_DIR",
    "plain_train_net.py": "OUTPUT_DIR",
    "lazyconfig_train_net.py": "train.output_dir",
}


def script_output_dir(path: str, args: Sequence[str]) -> Optional[Tuple[str, str, Any]]:
    """The output folder of a training script of detectron2 (:data:`TRAINING_SCRIPTS`) with
    command line ``args``, resolved as the script resolves it (within
    :func:`lambda_det_in_detectron2`): (the folder, its key, the parsed command line); None for
    another script, a command line the script itself refuses, or no folder.

    Raises:
        UserError: the config cannot be read (the error the script would give).
    """
    from detectron2.config import LazyConfig
    from detectron2.engine import default_argument_parser
    from omegaconf import OmegaConf

    key = TRAINING_SCRIPTS.get(os.path.basename(path))
    if key is None:
        return None
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the script says it in its own words
            parsed = default_argument_parser().parse_args(list(args))
    except SystemExit:
        return None
    if key == "OUTPUT_DIR":
        cfg = _get_cfg()
        cfg.merge_from_file(parsed.config_file)
        cfg.merge_from_list(parsed.opts)
        folder = cfg.OUTPUT_DIR
    else:
        cfg = LazyConfig.apply_overrides(LazyConfig.load(parsed.config_file), parsed.opts)
        folder = OmegaConf.select(cfg, "train.output_dir")
    if not isinstance(folder, str) or not folder:
        return None
    return folder, key, parsed


@contextlib.contextmanager
def training_output_dir(
    path: str, args: Sequence[str], overwrite: bool = False, restart: bool = False
) -> Iterator[None]:
    """Within: the output folder of a training script (:func:`script_output_dir`) is locked
    (:class:`~lambda_det.cli.output_dir.OutputDirLock`) and prepared as lambda_det's own
    training prepares it (:func:`~lambda_det.cli.output_dir.prepare_output_dir`, the script's
    ``--resume``, d2tool's ``--overwrite`` and ``--restart``; for ``--eval-only``, only a user's
    file in the way is refused: the evaluation writes into a run's own folder, as detectron2's),
    and the run's files there are recorded (:func:`~lambda_det.cli.output_dir.record_run`).
    Another script runs as it is.

    Raises:
        ExistingFileError: a user's file in the way, or a run the script would train over.
    """
    resolved = script_output_dir(path, args)
    if resolved is None:
        yield
        return
    folder, key, parsed = resolved
    script = os.path.basename(path)
    with OutputDirLock(folder, key=key):
        if not overwrite:
            with _hinting(f"or python -m lambda_det.d2tool --overwrite {script} ... to replace it"):
                check_run_writes(folder, key)
        if not parsed.eval_only:
            with _hinting(f"--restart: python -m lambda_det.d2tool --restart {script} ..."):
                prepare_output_dir(folder, parsed.resume, restart, parsed.machine_rank, key, True)
        if parsed.machine_rank == 0:
            record_run(folder, key)
        yield


@contextlib.contextmanager
def _hinting(hint: str) -> Iterator[None]:
    """An :class:`ExistingFileError` within, with ``hint`` on how d2tool takes the fix (its
    options go before SCRIPT)."""
    try:
        yield
    except ExistingFileError as error:
        raise ExistingFileError(f"{error} ({hint}: d2tool's options go before SCRIPT)") from None


def _run_to_the_end(path: str) -> Optional[SystemExit]:
    """Run the script; its ``sys.exit(0)`` (a success, whose output is kept) is returned rather
    than raised."""
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as finished:
        if finished.code not in (None, 0):
            raise
        return finished
    return None


def main(argv: Optional[List[str]] = None) -> int:
    from lambda_det.cli.arguments import reporting_user_errors

    argv = list(sys.argv[1:] if argv is None else argv)
    with reporting_user_errors("--debug" in argv[:1]):
        options, argv = parse_options(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{OPTIONS}\n\n{__doc__}")
        return 0 if argv else 2
    with reporting_user_errors(options.debug):
        path = detectron2_tool_path(argv[0])
    run_script(
        path,
        argv[1:],
        options.debug,
        options.overwrite,
        options.trusted_configs,
        options.restart,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
