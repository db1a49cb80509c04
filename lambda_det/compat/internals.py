"""Every use lambda_det makes of detectron2's and fvcore's private or module-global names.

These names are no public API: detectron2 or fvcore may rename, move or drop any of them in a
release. Each is used here only, by a small function that says why lambda_det needs it, and
tests/compat/test_internals.py checks each name and the behaviour relied on, so that a
detectron2 that changes one fails there rather than somewhere in a run.

Checked against detectron2 0.6 (the pb1-detectron2 build that tools/build_detectron2.py installs
into .venv/) and detectron2's main branch at commit 02b5c4e, with fvcore 0.1.5.post20221221. They
differ here in one place that needs two ways: main creates the per-machine process group with
``comm.create_local_process_group``, 0.6 only inside its own ``launch``
(:func:`set_local_process_group`). Elsewhere one way serves both (:func:`next_training_batch`,
:func:`write_step_metrics`).

detectron2 and fvcore are imported inside the functions: lambda_det.modeling imports this module
without detectron2 (:func:`add_default_flop_handles`).

Outside this module, lambda_det's ``AtomicCheckpointer`` overrides fvcore's ``Checkpointer``
methods ``_load_file`` (which fvcore documents as the one to override for other file formats) and
``_load_model`` (as detectron2's ``DetectionCheckpointer`` does), and its ``FinalEvalHook`` relies
on ``EvalHook.after_train``'s use of ``_do_eval`` and ``_func``; the test lists these too. And
:mod:`lambda_det.compat.torch_export` stands in for a few detectron2 functions, private ones
included, while a model is exported (tests/compat/test_torch_export.py and tests/export/ check
them).
"""

import contextlib
import importlib.util
from typing import Any, Callable, Dict, Iterator, Optional, Tuple
from unittest import mock

__all__ = [
    "plain_config_printouts",
    "eval_hook_arguments",
    "release_eval_function",
    "periodic_writer_writers",
    "registered_hooks",
    "inner_trainer",
    "set_inner_trainer",
    "next_training_batch",
    "write_step_metrics",
    "reopened_json_writer",
    "replace_registered",
    "set_local_process_group",
    "add_default_flop_handles",
    "detectron2_tool_patches",
    "detectron2_script_file_patches",
]


@contextlib.contextmanager
def plain_config_printouts() -> Iterator[None]:
    """Within: detectron2's ``default_setup`` logs config files as plain text. It colours them
    with pygments through its private ``engine.defaults._highlight``, whose escape codes would
    land in log.txt and piped output; detectron2 has no switch for it."""
    from detectron2.engine import defaults

    with mock.patch.object(defaults, "_highlight", lambda code, filename: code):
        yield


def eval_hook_arguments(hook) -> Tuple[int, Callable]:
    """The (eval_period, eval_function) that detectron2's ``EvalHook`` was built with
    (``_period``, ``_func``): ``DefaultTrainer.build_hooks`` builds it with a closure of its
    own, which lambda_det's final-evaluation hook takes over."""
    return hook._period, hook._func


def release_eval_function(hook) -> None:
    """Drop an ``EvalHook``'s evaluation function (``_func``), as its ``after_train`` does: the
    closure holds the trainer. For a subclass whose ``after_train`` does not evaluate."""
    del hook._func


def periodic_writer_writers(hook) -> list:
    """The event writers of detectron2's ``PeriodicWriter`` (``_writers``; the hook has no
    public accessor): a resumed run cuts its metrics.json back."""
    return hook._writers


def registered_hooks(trainer) -> list:
    """The hooks registered on a detectron2 trainer (``TrainerBase._hooks``; there is no public
    accessor): to find a run's checkpointer and writers after ``register_hooks``."""
    return trainer._hooks


def inner_trainer(trainer):
    """The ``SimpleTrainer`` (or ``AMPTrainer``) that detectron2's ``DefaultTrainer`` runs each
    step with (``_trainer``; there is no public accessor): its state, the optimizer's, goes into
    lambda_det's checkpoints."""
    return trainer._trainer


def set_inner_trainer(trainer, step_trainer) -> None:
    """Make ``step_trainer`` the one a ``DefaultTrainer`` subclass runs each step with, for a
    subclass that builds its parts itself (``DefaultTrainer.__init__`` sets ``_trainer`` with
    detectron2's own parts and has no parameter for others)."""
    trainer._trainer = step_trainer


def next_training_batch(trainer) -> Any:
    """The next batch of a detectron2 ``SimpleTrainer``'s data loader, from the iterator that
    its ``run_step`` reads (``_data_loader_iter``: an attribute in 0.6, a property that makes the
    iterator on first use in main), for a subclass with a ``run_step`` of its own; a second
    iterator of the loader would start the data over."""
    return next(trainer._data_loader_iter)


def write_step_metrics(trainer, loss_dict: Dict[str, Any], data_time: float) -> None:
    """Put a step's losses and data time into the event storage as ``SimpleTrainer.run_step``
    does, through its ``_write_metrics`` (main's writes every ``gather_metric_period`` iterations,
    0.6's every one), for a subclass with a ``run_step`` of its own."""
    trainer._write_metrics(loss_dict, data_time)


@contextlib.contextmanager
def reopened_json_writer(writer, json_file: str) -> Iterator[None]:
    """Within: detectron2's ``JSONWriter`` ``writer`` has its file closed, to be rewritten;
    after, it appends to ``json_file`` again. It opens its file only when it is made, so the new
    file object is set as its ``_file_handle``."""
    writer.close()
    yield
    writer._file_handle = open(json_file, "a")


def replace_registered(registry, name: str, obj: Any) -> None:
    """Put ``obj`` under ``name`` in a detectron2 (fvcore) ``Registry`` that holds another one
    under it: ``register`` refuses a name twice, and the registry has no public way to replace
    one (its ``_obj_map``)."""
    registry._obj_map[name] = obj


def set_local_process_group(num_processes: int) -> None:
    """Create detectron2's per-machine process group (``comm.get_local_rank`` needs it) in a
    process that detectron2's ``launch`` did not start (lambda_det's CPU workers), with
    ``num_processes`` processes on each machine. All processes must call it together.

    detectron2 after 0.6 has ``comm.create_local_process_group`` for this; 0.6 creates the group
    inside ``launch`` only, so here it is set as the private ``comm._LOCAL_PROCESS_GROUP``."""
    import torch.distributed as dist
    from detectron2.utils import comm

    if hasattr(comm, "create_local_process_group"):
        comm.create_local_process_group(num_processes)
        return
    machine_rank = comm.get_rank() // num_processes
    for machine in range(comm.get_world_size() // num_processes):
        group = dist.new_group(list(range(machine * num_processes, (machine + 1) * num_processes)))
        if machine == machine_rank:
            comm._LOCAL_PROCESS_GROUP = group


def add_default_flop_handles(handles: Dict[str, Optional[Callable]]) -> None:
    """Add ``handles`` (op name -> fvcore handle, None to ignore the op) to fvcore's default
    handles (``flop_count._DEFAULT_SUPPORTED_OPS``), which every ``FlopCountAnalysis``
    (detectron2's and its tools/analyze_model.py too) starts from and which fvcore offers no
    function to extend; an op fvcore has a handle for keeps it. Nothing without fvcore."""
    import importlib

    try:
        # The module (fvcore.nn's attribute of that name is its function flop_count).
        flop_count = importlib.import_module("fvcore.nn.flop_count")
    except ImportError:
        return
    for name, handle in handles.items():
        flop_count._DEFAULT_SUPPORTED_OPS.setdefault(name, handle)


@contextlib.contextmanager
def detectron2_tool_patches(
    get_cfg: Callable,
    dataset_mapper: Callable,
    load_file: Callable,
    checkpointer_load: Callable,
    lazy_config_load: Callable,
) -> Iterator[None]:
    """Within: detectron2's own scripts (its tools/, run by :mod:`lambda_det.cli.d2tool`) build
    lambda_det's parts, since they take none as an argument:

    * ``get_cfg``: ``detectron2.config.get_cfg``, which the scripts import when they start;
    * ``dataset_mapper``: what ``detectron2.data.build`` calls as ``DatasetMapper(cfg, is_train)``
      (a module global there) for a loader given no mapper;
    * ``load_file(checkpointer, filename)``: the private ``_load_file`` of fvcore's
      ``Checkpointer`` and of detectron2's ``DetectionCheckpointer``, which read a weights file;
    * ``checkpointer_load``: ``DetectionCheckpointer.load``;
    * ``lazy_config_load``: ``LazyConfig.load`` (a static method).
    """
    from detectron2.checkpoint import DetectionCheckpointer
    from detectron2.config import LazyConfig
    from fvcore.common.checkpoint import Checkpointer

    with (
        mock.patch("detectron2.config.get_cfg", get_cfg),
        mock.patch("detectron2.data.build.DatasetMapper", dataset_mapper),
        mock.patch.object(Checkpointer, "_load_file", load_file),
        mock.patch.object(DetectionCheckpointer, "_load_file", load_file),
        mock.patch.object(DetectionCheckpointer, "load", checkpointer_load),
        mock.patch.object(LazyConfig, "load", staticmethod(lazy_config_load)),
    ):
        yield


@contextlib.contextmanager
def detectron2_script_file_patches(
    torch_load: Callable,
    write_file: Callable[[str, Callable[[str], Any]], Any],
    read_file: Callable[[str], None],
) -> Iterator[None]:
    """Within: the files that detectron2's own scripts read and write themselves, rather than
    through a checkpointer or a config, go through lambda_det:

    * ``torch_load`` replaces ``torch.load`` (convert-torchvision-to-d2.py reads its input
      with it; no script of detectron2 0.6 or main 02b5c4e calls ``pickle.load``);
    * ``write_file(path, write)`` is called instead of each image a script writes, with
      ``write(other_path)`` doing the write: detectron2's ``VisImage.save``
      (visualize_data.py) and OpenCV's ``cv2.imwrite`` (visualize_json_results.py);
    * ``read_file(path)`` is told of each image read with detectron2's
      ``detection_utils.read_image`` (visualize_data.py, the data loaders) or ``cv2.imread``
      (visualize_json_results.py) before it is read.

    Each is replaced only where it exists (OpenCV is optional to detectron2), and restored on
    leaving, also on an exception.
    """
    import torch
    from detectron2.data import detection_utils
    from detectron2.utils.visualizer import VisImage

    targets = [(torch, "load", lambda load: torch_load)]
    if hasattr(VisImage, "save"):
        targets.append((VisImage, "save", lambda save: _saving(save, write_file)))
    if hasattr(detection_utils, "read_image"):
        targets.append((detection_utils, "read_image", lambda read: _reading(read, read_file)))
    if importlib.util.find_spec("cv2") is not None:
        import cv2

        targets.append((cv2, "imwrite", lambda imwrite: _writing_image(imwrite, write_file)))
        targets.append((cv2, "imread", lambda imread: _reading(imread, read_file)))
    with contextlib.ExitStack() as stack:
        for owner, name, replacement in targets:
            stack.enter_context(mock.patch.object(owner, name, replacement(getattr(owner, name))))
        yield


def _saving(save: Callable, write_file: Callable) -> Callable:
    def saving(image, filepath):  # VisImage.save(self, filepath)
        return write_file(filepath, lambda path: save(image, path))

    return saving


def _writing_image(imwrite: Callable, write_file: Callable) -> Callable:
    def writing(filename, image, *args, **kwargs):  # cv2.imwrite(filename, img, params)
        return write_file(filename, lambda path: imwrite(path, image, *args, **kwargs))

    return writing


def _reading(read: Callable, read_file: Callable) -> Callable:
    def reading(file_name, *args, **kwargs):
        read_file(file_name)
        return read(file_name, *args, **kwargs)

    return reading
