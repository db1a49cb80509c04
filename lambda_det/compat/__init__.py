"""What makes detectron2 work on today's torch / numpy / Pillow.

The source-level fixes for detectron2 0.6 live in the build script ``tools/build_detectron2.py``
(applied when the Makefile builds detectron2 into ``.venv/``), so a script that imports detectron2
without lambda_det works too.
This module only imports detectron2 for lambda_det: with a clear error when it is missing, and
without the deprecation warning that torch >= 2.10 prints when fvcore and detectron2 call
``torch.jit.script`` at import time (they must stay scriptable, so the call itself is kept).
Every use of detectron2's and fvcore's private names is in :mod:`lambda_det.compat.internals`;
the replacements of detectron2 functions that let ``torch.export`` take a whole detector (swapped
in only while a model is exported) are in :mod:`lambda_det.compat.torch_export`.
"""

import contextlib
import importlib
import importlib.util
import logging
import sys
import warnings
from pathlib import Path

__all__ = [
    "import_detectron2",
    "detectron2_installed",
    "without_jit_script_deprecation",
    "ddp_without_buffer_sync",
    "quiet_detectron2_warnings",
    "without_cuda_home_warning",
]

_DETECTRON2_MODULES = (
    "detectron2.modeling",
    "detectron2.data",
    "detectron2.evaluation",
    "detectron2.engine",
    "detectron2.checkpoint",
)

# The lambda_det checkout this package runs from (an editable install's source tree).
CHECKOUT = Path(__file__).resolve().parents[2]


def missing_detectron2_message(checkout: Path = CHECKOUT) -> str:
    """What to run when detectron2 is missing: the checkout's .venv/ when one is set up (the usual
    cause is a Python other than .venv/'s), else how to build one."""
    venv_python = checkout / ".venv" / "bin" / "python"
    message = f"lambda_det needs detectron2, and this Python ({sys.executable}) has none. "
    if venv_python.is_file():
        return message + (
            f"The lambda_det checkout's .venv/ has it: run the tools as `{venv_python} tools/...`, "
            f"or `source {checkout / '.venv' / 'bin' / 'activate'}` first and then "
            f"`python tools/...`."
        )
    return message + (
        "`make venv` in the lambda_det checkout builds one into .venv/ (then run "
        "`.venv/bin/python tools/...`, or `source .venv/bin/activate` first); in another "
        "environment that has torch, run `python tools/build_detectron2.py` from the lambda_det "
        "checkout (pure-Python detectron2 0.6 from PyPI's pb1-detectron2 source package), or "
        "install your own detectron2 build."
    )


@contextlib.contextmanager
def without_jit_script_deprecation():
    """Within: no FutureWarning for ``torch.jit.script``, which fvcore and detectron2 call when
    they are imported."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r".*torch\.jit\.script.* is deprecated", category=FutureWarning
        )
        yield


def import_detectron2() -> None:
    """Import the detectron2 modules lambda_det builds on, quietly and with a helpful error."""
    with without_jit_script_deprecation():
        try:
            for name in _DETECTRON2_MODULES:
                importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and error.name.split(".")[0] == "detectron2":
                raise ImportError(missing_detectron2_message()) from error
            raise


def detectron2_installed() -> bool:
    """Whether detectron2 can be imported here, without importing it."""
    try:
        return importlib.util.find_spec("detectron2") is not None
    except (ImportError, ValueError):  # a broken or blocked detectron2: as if absent
        return False


def ddp_without_buffer_sync() -> dict:
    """DistributedDataParallel's keyword for "do not broadcast buffers at each forward":
    ``forward_sync_buffers=False`` where torch has it (its ``broadcast_buffers`` is deprecated
    there), else ``broadcast_buffers=False``. Buffers are equal on every rank at the start
    (BN statistics start at 0 and 1), so syncing them once at init changes nothing."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def quiet_detectron2_warnings() -> None:
    """In a training process: hide the deprecation warning torch prints when detectron2's
    ``comm.all_gather`` serialises through ``TypedStorage`` (nothing a user can change)."""
    warnings.filterwarnings(
        "ignore",
        message=r"TypedStorage is deprecated",
        category=UserWarning,
        module=r"detectron2\.",
    )


@contextlib.contextmanager
def without_cuda_home_warning():
    """Within: torch's "No CUDA runtime is found, using CUDA_HOME=..." is not logged. torch logs
    it when ``torch.utils.cpp_extension`` is first imported on a machine with a CUDA toolkit but
    no GPU; detectron2's ``collect_env_info`` (run by ``default_setup``) imports it to report the
    compiler, and no lambda_det run compiles an extension."""
    cpp_extension_logger = logging.getLogger("torch.utils.cpp_extension")
    level = cpp_extension_logger.level
    cpp_extension_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        cpp_extension_logger.setLevel(level)
