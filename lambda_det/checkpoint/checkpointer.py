"""Checkpoints: read without running code from them, written so they are never half there.

Every weights or checkpoint file lambda_det reads (training's MODEL.WEIGHTS, ``--resume``,
``--eval-only``, export, the demo's pictures) goes through :func:`load_checkpoint_file`:

* ``.pkl`` (detectron2 and Caffe2 model zoo files) with :class:`RestrictedUnpickler`, which
  admits only dicts, lists, numbers, strings and numpy arrays of the number types torch takes,
  and no more array bytes than the file holds;
* ``.safetensors`` with its header checked first (its length and every tensor's byte range
  within the file), then ``torch.load``, which hands it to the safetensors package;
* every other suffix with ``torch.load(..., weights_only=True)``.

Anything else in a file is refused with :class:`UnsafeCheckpointError` before it can run, and a
file that is no checkpoint, or claims more than it holds, with :class:`CorruptCheckpointError`.
"""

import argparse
import codecs
import collections
import contextvars
import errno
import glob
import json
import logging
import math
import os
import pickle
import re
import reprlib
import zipfile
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.utils.file_io import PathManager

from lambda_det.checkpoint.timm_weights import timm_state_dict_to_model
from lambda_det.utils.atomic import OutputWriteError, atomic_path
from lambda_det.utils.errors import IsAFolderError, MissingFileError, UserError
from lambda_det.utils.setting import Setting, override
from lambda_det.utils.text import read_text

__all__ = [
    "AtomicCheckpointer",
    "CorruptCheckpointError",
    "UnsafeCheckpointError",
    "RestrictedUnpickler",
    "load_checkpoint_file",
    "check_weights",
    "load_weights",
    "WeightsMismatchError",
    "last_checkpoint",
    "checkpoint_to_resume",
    "evaluation_weights",
    "counted_weights",
]


class CorruptCheckpointError(UserError, RuntimeError):
    """A checkpoint file that cannot be read back (truncated, corrupt, or not a checkpoint)."""


class UnsafeCheckpointError(UserError, pickle.UnpicklingError):
    """A checkpoint that holds more than tensors, arrays and plain data: loading it could run
    code, so it is refused."""


class WeightsMismatchError(UserError):
    """A checkpoint whose weights do not fit the model they are loaded into."""


# What detectron2 / Caffe2 model-zoo pickles hold besides dicts, lists, numbers and strings:
# numpy arrays, scalars and dtypes, OrderedDicts, and _codecs.encode (and bytes() for b""), which
# protocols 0-2 use to store bytes. A numpy array is pickled as _reconstruct(ndarray, (0,), b"b")
# and then its state (shape, dtype, bytes), under protocol 5 as _frombuffer(bytes, dtype, shape).
#
# Each global a pickle may name is a stand-in (_Global) that takes only what those files pass and
# counts what it allocates: a pickle can use one value many times (its memo), so a 100-byte file
# could otherwise ask for an 8 GB array, or for a thousand copies of one megabyte. Arrays, byte
# strings, scalars and OrderedDict items may each take in all no more than the file's size (each
# array's bytes are in the file, once), checked before anything is allocated.
_NUMPY_RECONSTRUCT = np.zeros(1).__reduce__()[0]
_NUMPY_FROMBUFFER = np.zeros(1).__reduce_ex__(5)[0]
_NUMPY_SCALAR = np.float32(0).__reduce__()[0]
# The dtypes torch.from_numpy converts (detectron2 makes every weight a tensor so): an array of
# another dtype (Python objects, strings, records) is not a weight, and is refused unallocated.
_WEIGHT_DTYPES = frozenset(
    np.dtype(name)
    for name in (
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
)
_MAX_DIMS = 64  # numpy's
_RESAVE = "save the weights again where they were made, as numeric numpy arrays"


class _Budget:
    """What the stand-ins have allocated while one file is unpickled, by kind."""

    def __init__(self, filename: str, size: int):
        self.filename = filename
        self.size = size
        self.used = collections.Counter()

    def charge(self, kind: str, nbytes: int, what: str) -> None:
        used = self.used[kind]
        if used + nbytes > self.size:
            before = f" (with the {used:,} bytes of {kind} before it)" if used else ""
            raise CorruptCheckpointError(
                f"checkpoint {self.filename}: {what} claims {nbytes:,} bytes{before}, more "
                f"than the file's {self.size:,} bytes could hold: the file is corrupt or "
                f"crafted, refused before allocating; {_RESAVE}"
            )
        self.used[kind] = used + nbytes


_BUDGET: contextvars.ContextVar = contextvars.ContextVar("lambda_det_pickle_budget")


def _corrupt(what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"checkpoint {_BUDGET.get().filename}: {what}, which pickled numpy weights never are; "
        f"{_RESAVE}"
    )


def _weight_dtype(dtype, shape: tuple) -> np.dtype:
    """``dtype`` (a dtype or a short type code) if it is one that torch takes, else a refusal."""
    if isinstance(dtype, (str, bytes)) and len(dtype) <= 16:
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise _corrupt(f"a numpy array has the type code {dtype!r}") from None
    if not isinstance(dtype, np.dtype):
        raise _corrupt(f"a numpy array's dtype is a {type(dtype).__name__}")
    if dtype not in _WEIGHT_DTYPES or dtype.names is not None or dtype.subdtype is not None:
        held = "Python objects (dtype object)" if dtype.hasobject else f"dtype {dtype}"
        raise CorruptCheckpointError(
            f"checkpoint {_BUDGET.get().filename}: a numpy array of shape {shape} holds {held}, "
            f"not numbers a weight can hold (detectron2 cannot load it either); refused before "
            f"allocating: save it as a numeric array, e.g. array.astype(np.float32)"
        )
    return dtype


def _charge_array(shape, dtype) -> None:
    """Count the bytes of an array of ``shape`` and ``dtype``, or refuse it."""
    dims = (shape,) if type(shape) is int else shape
    if not (
        isinstance(dims, (tuple, list))
        and len(dims) <= _MAX_DIMS
        and all(type(size) is int and size >= 0 for size in dims)
    ):
        raise _corrupt(f"a numpy array's shape is {reprlib.repr(shape)}")
    dims = tuple(dims)
    dtype = _weight_dtype(dtype, dims)
    what = f"a numpy array of shape {dims} and dtype {dtype}"
    _BUDGET.get().charge("arrays", math.prod(dims) * dtype.itemsize, what)


class _UnpickledArray(np.ndarray):
    """A numpy array as :func:`_reconstruct` makes it: its state (shape, dtype, bytes) checked
    before numpy allocates it. Weights leave the loader as plain arrays (``np.asarray``), and
    it pickles as one."""

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) in (4, 5)):
            raise _corrupt("a numpy array's state is not (shape, dtype, order, bytes)")
        _charge_array(state[-4], state[-3])
        super().__setstate__(state)

    def __reduce_ex__(self, protocol):
        return np.asarray(self).__reduce_ex__(protocol)


class _OrderedDict(collections.OrderedDict):
    """An OrderedDict as a pickle builds it; the attributes a pickle sets on one (a state dict's
    ``_metadata``, which detectron2 does not use) are dropped, so that setting them costs
    nothing however often. It pickles as an OrderedDict."""

    def __setstate__(self, state):
        pass

    def __reduce__(self):
        return collections.OrderedDict, (), None, None, iter(self.items())


class _Global:
    """A global that a weights pickle may call. Unlike a Python function, it has no attributes
    that the pickle could set (pickle's BUILD)."""

    __slots__ = ("function", "name")

    def __init__(self, function, name: str):
        self.function = function
        self.name = name

    def __call__(self, *args):
        return self.function(*args)

    def __setstate__(self, state):
        raise _corrupt(f"it sets attributes of {self.name}")


def _reconstruct(subtype, shape, dtype):
    if subtype is not _NDARRAY:
        raise _corrupt(f"it rebuilds a numpy array as a {type(subtype).__name__}")
    _charge_array(shape, dtype)
    return _NUMPY_RECONSTRUCT(_UnpickledArray, shape, dtype)


def _frombuffer(buffer, dtype, shape, order):
    _charge_array(shape, dtype)
    return _NUMPY_FROMBUFFER(buffer, dtype, shape, order)


def _scalar(dtype, *data):
    if not isinstance(dtype, np.dtype):
        raise _corrupt(f"a numpy scalar's dtype is a {type(dtype).__name__}")
    _weight_dtype(dtype, ())
    _BUDGET.get().charge("scalars", dtype.itemsize, f"a numpy scalar of dtype {dtype}")
    return _NUMPY_SCALAR(dtype, *data)


def _dtype(code, align=False, copy=False):
    if not (isinstance(code, (str, bytes)) and len(code) <= 16):
        raise _corrupt(f"it makes a numpy dtype of {reprlib.repr(code)}")
    return np.dtype(code, bool(align), bool(copy))


def _ordered_dict(*items):
    if items:  # Python 2's OrderedDict pickles its items as a list
        if len(items) > 1 or not isinstance(items[0], (list, tuple)):
            raise _corrupt("it makes an OrderedDict of other than a list of items")
        _BUDGET.get().charge("OrderedDict items", len(items[0]), "an OrderedDict")
    return _OrderedDict(*items)


def _encode(text, encoding):
    if not (isinstance(text, str) and encoding == "latin1"):
        raise _corrupt(f"it encodes a {type(text).__name__} as {reprlib.repr(encoding)}")
    _BUDGET.get().charge("byte strings", len(text), "a byte string")
    return codecs.encode(text, "latin1")


def _empty_bytes(*args):  # how protocols 0-2 store b"" (a zero-size array's bytes)
    if args:
        raise _corrupt("it calls bytes() with arguments")
    return b""


_NDARRAY = _Global(None, "numpy.ndarray")  # only ever _reconstruct's first argument
_STAND_INS = {
    ("multiarray", "_reconstruct"): _reconstruct,
    ("multiarray", "scalar"): _scalar,
    ("numeric", "_frombuffer"): _frombuffer,
}
_SAFE_GLOBALS = {
    **{
        (f"numpy.{core}.{module}", name): _Global(function, f"numpy.{name}")
        for (module, name), function in _STAND_INS.items()
        for core in ("core", "_core")  # numpy 1's module, numpy 2's
    },
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _Global(_dtype, "numpy.dtype"),
    ("collections", "OrderedDict"): _Global(_ordered_dict, "collections.OrderedDict"),
    ("_codecs", "encode"): _Global(_encode, "_codecs.encode"),
    ("__builtin__", "bytes"): _Global(_empty_bytes, "bytes"),
    ("builtins", "bytes"): _Global(_empty_bytes, "bytes"),
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals of plain weight files (numpy arrays of the
    number types torch takes, dtypes, scalars, OrderedDict); any other global raises
    :class:`UnsafeCheckpointError` naming it, and data that claims more memory than the file's
    ``size`` bytes could hold (default: the size of ``file``) raises
    :class:`CorruptCheckpointError` before it is allocated."""

    def __init__(self, file, filename: str, size: Optional[int] = None):
        super().__init__(file, encoding="latin1")  # Caffe2 files are Python 2 pickles
        self.filename = filename
        self.size = os.fstat(file.fileno()).st_size if size is None else size

    def find_class(self, module: str, name: str):
        try:
            return _SAFE_GLOBALS[(module, name)]
        except KeyError:
            raise UnsafeCheckpointError(
                f"checkpoint {self.filename} refers to {module}.{name}, which a weights file "
                f"does not need and which could run code; refused (only dicts, lists, numbers, "
                f"strings and numpy arrays load from .pkl files)"
            ) from None

    def load(self):
        token = _BUDGET.set(_Budget(self.filename, self.size))
        try:
            return super().load()
        finally:
            _BUDGET.reset(token)


# Modules whose functions run code or commands: a global from one of them (or a bare builtin
# such as exec) is never part of a weights file, so no way to load it is suggested.
_CODE_MODULES = {
    "builtins",
    "__builtin__",
    "os",
    "posix",
    "nt",
    "subprocess",
    "sys",
    "runpy",
    "importlib",
    "pty",
    "shutil",
    "socket",
    "code",
    "codeop",
    "pickle",
    "marshal",
    "types",
    "ctypes",
    "webbrowser",
    "functools",
    "operator",
}


def _check_storages_fit(data, filename: str) -> None:
    """Refuse a tensor whose storage claims more bytes than the file holds: torch.save stores
    storages uncompressed, and some torch releases (2.5) take a zip member's claimed size without
    checking it against the member, leaving a storage that reaches past its data."""
    size = os.path.getsize(filename)
    pending, seen = [data], 0
    while pending and seen < 1_000_000:  # bounded: a checkpoint's containers, not a graph
        value = pending.pop()
        seen += 1
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        elif isinstance(value, torch.Tensor) and value.untyped_storage().nbytes() > size:
            raise CorruptCheckpointError(
                f"checkpoint {filename} is truncated or corrupt and cannot be loaded (a tensor's "
                f"storage claims {value.untyped_storage().nbytes():,} bytes, more than the "
                f"file's {size:,})"
            )


def _unsafe_torch_file(filename: str, error: Exception) -> UnsafeCheckpointError:
    refused = re.search(r"GLOBAL ([\w.]+)", str(error))
    if refused is None:
        return UnsafeCheckpointError(
            f"checkpoint {filename} holds objects that torch.load(weights_only=True) refuses to "
            f"unpickle (they could run code): if you trust its source, save its weights alone "
            f"where it was made (torch.save(model.state_dict(), 'weights.pth')) and load those"
        )
    name = refused[1]
    module = name.split(".")[0] if "." in name else "builtins"
    if module in ("builtins", "__builtin__"):  # some torch releases name builtins.exec, some exec
        name = name.rpartition(".")[2]
    if module in _CODE_MODULES:
        return UnsafeCheckpointError(
            f"checkpoint {filename} refers to {name}, which runs code and has no place in a "
            f"weights file: do not load it; ask its source for the weights alone, saved with "
            f"torch.save(model.state_dict(), 'weights.pth')"
        )
    return UnsafeCheckpointError(
        f"checkpoint {filename} refers to {name}, which torch.load(weights_only=True) refuses "
        f"to unpickle (it could run code). If you trust the file's source: save its weights "
        f"alone where it was made (torch.save(model.state_dict(), 'weights.pth')); or, if "
        f"{name} is a class you trust, read the file in Python under "
        f"torch.serialization.safe_globals([{name}]) with torch.load(..., weights_only=True), "
        f"torch.save its 'model' weights alone to weights.pth and load that"
    )


# The layouts of a .pkl that detectron2 loads (its DetectionCheckpointer._load_file).
_PICKLE_LAYOUTS = (
    "a .pkl of weights is detectron2's {'model': {name: numpy array}, "
    "'__author__': source} or Caffe2's {name: numpy array} (or under 'blobs')"
)


def _numeric_weights(
    weights: Dict[str, Any], filename: str, author_missing: bool = False
) -> Dict[str, Any]:
    """``weights`` as plain numpy arrays (the unpickler admits arrays of numbers only); a value
    that is no array (which detectron2 cannot load either) is refused by name.
    ``author_missing``: the file has a "model" but no "__author__", so it is read as Caffe2's
    layout (as detectron2 reads it)."""
    converted = {}
    for key, value in weights.items():
        if not isinstance(value, np.ndarray):
            read_as = (
                " (without '__author__' the file is read as Caffe2's layout: add "
                "'__author__' if its weights are under 'model')"
                if author_missing
                else ""
            )
            raise CorruptCheckpointError(
                f"checkpoint {filename}: {key!r} is of type {type(value).__name__}, not a numpy "
                f"array{read_as}; {_PICKLE_LAYOUTS}"
            )
        converted[key] = np.asarray(value)  # a plain array, not the unpickler's subclass
    return converted


def _from_pickle(data: Dict[str, Any]) -> Dict[str, Any]:
    """Detectron2's reading of a .pkl: a detectron2 model-zoo file as it is, a Caffe2 one (its
    "blobs", without momentum buffers) with name matching."""
    if "model" in data and "__author__" in data:
        return data
    if "blobs" in data:
        data = data["blobs"]
    weights = {key: value for key, value in data.items() if not key.endswith("_momentum")}
    return {"model": weights, "__author__": "Caffe2", "matching_heuristics": True}


# A .safetensors file: the length of its header (8 bytes, little-endian), the header (JSON: each
# tensor's dtype, shape and [begin, end) byte range in the data after it), then the data.
_SAFETENSORS = "a .safetensors file begins with the length of its JSON header"


def _check_safetensors(filename: str) -> None:
    """Refuse (one line naming ``filename`` and what is wrong) a ``.safetensors`` file whose
    header is not there, not JSON, or names bytes outside the file."""
    size = os.path.getsize(filename)
    with open(filename, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if size < 8 or length > size - 8:
            problem = (
                f"it has {size} bytes, fewer than the 8 of that length"
                if size < 8
                else f"its first 8 bytes give a header of {length:,} bytes, and the file has "
                f"{size - 8:,} after them"
            )
            raise CorruptCheckpointError(
                f"checkpoint {filename} is not a safetensors file ({_SAFETENSORS}): {problem}; "
                f"pass a safetensors file, or give a torch.save checkpoint its own suffix (.pth)"
            )
        text = f.read(length)
    try:
        header = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise CorruptCheckpointError(
            f"checkpoint {filename} is not a safetensors file ({_SAFETENSORS}): its "
            f"{length:,}-byte header is not a JSON object"
        )
    data_size = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(shape, list)
            and all(type(dim) is int and dim >= 0 for dim in shape)
            and isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(offset) is int for offset in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise CorruptCheckpointError(
                f"checkpoint {filename}: the safetensors header's tensor {name[:80]!r} is "
                f"{reprlib.repr(entry)}, not a shape and a byte range within the file's "
                f"{data_size:,} bytes of data; the file is corrupt"
            )


def _safetensors_errors() -> tuple:
    """The safetensors package's error (a file it cannot read), where it is installed."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return ()
    return (SafetensorError,)


def _read_safetensors(filename: str) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors file (a format that holds tensors and nothing else, read by
    the safetensors package on any torch), after :func:`_check_safetensors`."""
    _check_safetensors(filename)
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise UserError(f"reading {filename} needs safetensors: pip install safetensors") from None
    try:
        return load_file(filename, device="cpu")
    except _safetensors_errors() as error:  # a truncated or corrupt body
        raise CorruptCheckpointError(
            f"checkpoint {filename} is truncated or corrupt and cannot be loaded "
            f"({type(error).__name__}: {error})"
        ) from None


def load_checkpoint_file(path: str) -> Dict[str, Any]:
    """A checkpoint as detectron2's checkpointer expects it (``{"model": weights, ...}``), read
    without running code from the file, whatever its suffix.

    ``path`` may be a URL (downloaded by detectron2's PathManager). ``.pkl`` files are read as
    detectron2 reads them (model-zoo and Caffe2 layouts), ``.pyth`` as pycls checkpoints.

    Raises:
        UnsafeCheckpointError: the file holds objects other than weights and plain data.
        CorruptCheckpointError: the file is truncated, corrupt, or not a checkpoint.
    """
    filename = PathManager.get_local_path(path)
    if filename.endswith(".safetensors"):
        return {"model": _read_safetensors(filename)}
    try:
        if filename.endswith(".pkl"):
            with open(filename, "rb") as f:
                data = RestrictedUnpickler(f, filename).load()
            if not isinstance(data, dict):
                raise CorruptCheckpointError(
                    f"checkpoint {filename} holds a {type(data).__name__}, not a dict of weights"
                )
            author_missing = "model" in data and "__author__" not in data
            data = _from_pickle(data)
            if not isinstance(data["model"], dict):
                raise CorruptCheckpointError(
                    f"checkpoint {filename}: its 'model' is a {type(data['model']).__name__}, "
                    f"not a dict of weights; {_PICKLE_LAYOUTS}"
                )
            data["model"] = _numeric_weights(data["model"], filename, author_missing)
            return data
        # timm's train.py stores its arguments (an argparse.Namespace of plain values) in its
        # checkpoints; allowed for this load only.
        with torch.serialization.safe_globals([argparse.Namespace]):
            data = torch.load(filename, map_location="cpu", weights_only=True)
    except (UnsafeCheckpointError, CorruptCheckpointError):
        raise
    except MemoryError:  # a length in the file that no allocation can take
        raise CorruptCheckpointError(
            f"checkpoint {filename} asks for more memory than there is while it is read: a "
            f"length in it is larger than the file's {os.path.getsize(filename):,} bytes could "
            f"hold (a corrupt or crafted file)"
        ) from None
    except (
        EOFError,
        RuntimeError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        *_safetensors_errors(),
    ) as error:
        if "weights only load failed" in str(error).lower():
            raise _unsafe_torch_file(filename, error) from None
        raise CorruptCheckpointError(
            f"checkpoint {filename} is truncated or corrupt and cannot be loaded "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
        ) from error
    if not isinstance(data, dict):
        raise CorruptCheckpointError(
            f"checkpoint {filename} holds a {type(data).__name__}, not a dict of weights"
        )
    _check_storages_fit(data, filename)
    if filename.endswith(".pyth"):  # pycls, as detectron2 reads it
        if "model_state" not in data:
            raise CorruptCheckpointError(f"pycls checkpoint {filename} has no 'model_state'")
        weights = {
            key: value
            for key, value in data["model_state"].items()
            if not key.endswith("num_batches_tracked")
        }
        return {"model": weights, "__author__": "pycls", "matching_heuristics": True}
    return data if "model" in data else {"model": data}


class AtomicCheckpointer(DetectionCheckpointer):
    """``DetectionCheckpointer`` that reads files with :func:`load_checkpoint_file` and writes
    them so that they appear only once complete.

    ``save`` writes a temporary file and renames it, then updates ``last_checkpoint`` the same
    way (:func:`~lambda_det.utils.atomic.atomic_path`), so a run killed mid-write leaves
    ``last_checkpoint`` on the previous, complete file.

    Args:
        require: which of the model's weights a loaded checkpoint must hold, with the shapes of
            the model: None (detectron2's behaviour: log what is missing and go on), "backbone"
            (every weight of the image network: ``backbone.bottom_up.*`` under an FPN, else
            ``backbone.*``; FPN and heads may be new, e.g. another number of classes) or "all".
            A checkpoint that falls short raises :class:`WeightsMismatchError`.
    """

    def __init__(
        self, model, save_dir: str = "", *, require: Optional[str] = None, **checkpointables
    ):
        if require not in (None, "backbone", "all"):
            raise ValueError(f"require must be None, 'backbone' or 'all', got {require!r}")
        super().__init__(model, save_dir, **checkpointables)
        self.require = require

    def save(self, name: str, **kwargs) -> None:
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        for key, obj in self.checkpointables.items():
            data[key] = obj.state_dict()
        data.update(kwargs)
        path = os.path.join(self.save_dir, f"{name}.pth")
        self.logger.info("Saving checkpoint to %s", path)
        try:
            with atomic_path(path) as temporary, open(temporary, "wb") as f:
                torch.save(data, f)
            self.tag_last_checkpoint(os.path.basename(path))
        except OutputWriteError as error:  # atomic_path's, for an OSError
            raise self._save_failed(path, error.__cause__) from error.__cause__

    def _save_failed(self, path: str, error: OSError) -> OutputWriteError:
        """The save error, with where the run stands: its last complete checkpoint (which
        ``--resume`` continues from) or none."""
        previous = last_checkpoint(self.save_dir)
        saved = (
            f"its last complete checkpoint is {previous} (last_checkpoint)"
            if previous
            else "it has saved no checkpoint"
        )
        reason = error.strerror or str(error)
        full = error.errno in (errno.ENOSPC, errno.EDQUOT)
        fix = "free space on that disk" if full else f"make {self.save_dir} writable"
        return OutputWriteError(
            f"saving checkpoint {path} failed ({reason}): the run stopped and {saved}; "
            f"{fix}, then continue it with --resume"
        )

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        with (
            atomic_path(os.path.join(self.save_dir, "last_checkpoint")) as temporary,
            open(temporary, "w") as f,
        ):
            f.write(last_filename_basename)

    def load(self, path: str, *args, **kwargs):
        self._path = path
        return super().load(path, *args, **kwargs)

    def _load_file(self, filename: str):
        return load_checkpoint_file(filename)

    def _load_model(self, checkpoint):
        checkpoint = timm_state_dict_to_model(self.model, checkpoint)
        incompatible = super()._load_model(checkpoint)
        self.logger.info(_loaded_counts(self.model, incompatible.missing_keys, self._path))
        if self.require is None:
            return incompatible
        prefix = _backbone_prefix(self.model) if self.require == "backbone" else ""
        missing = [
            key
            for key in incompatible.missing_keys
            if key.startswith(prefix) and not key.endswith("num_batches_tracked")
        ]
        mismatched = [
            f"{key} {tuple(saved)} vs {tuple(wanted)}"
            for key, saved, wanted in incompatible.incorrect_shapes
            if key.startswith(prefix)
        ]
        classes = _class_counts(
            self.model,
            [shapes for shapes in incompatible.incorrect_shapes if shapes[0].startswith(prefix)],
        )
        if classes is not None:
            trained, built, shapes = classes
            raise WeightsMismatchError(
                f"checkpoint {self._path!r} was trained for {trained} classes, but the model "
                f"built from the config has {built} ({shapes}): pass the config the run was "
                f"trained with, the config.yaml it saved in its output folder (it holds the "
                f"run's classes and datasets)"
            )
        if missing or mismatched:
            what = f"the backbone ({prefix[:-1]})" if prefix else "the model"
            raise WeightsMismatchError(
                f"checkpoint {self._path!r} does not fit {what} built from the config (is it "
                f"the config it was trained with, overrides included?): {len(missing)} missing "
                f"weights {missing[:5]}, {len(mismatched)} of another shape (checkpoint vs "
                f"model) {mismatched[:5]}"
            )
        return incompatible


def _class_counts(model, incorrect_shapes) -> Optional[Tuple[int, int, str]]:
    """(classes of the checkpoint, classes of the model, the class head's shapes) when the
    checkpoint's class head (a ``cls_score`` weight) has another shape than the model's, else
    None. An R-CNN head scores K + 1 classes (background last), RetinaNet's A x K (A anchors)."""
    model = getattr(model, "module", model)  # DDP
    built = getattr(model, "num_classes", None)  # RetinaNet
    if built is None:
        built = getattr(getattr(model, "roi_heads", None), "num_classes", None)
    if not isinstance(built, int) or built < 1:
        return None
    for key, saved, wanted in incorrect_shapes:
        if not key.endswith("cls_score.weight"):
            continue
        if wanted[0] == built + 1:
            trained = saved[0] - 1
        elif wanted[0] % built == 0 and saved[0] % (wanted[0] // built) == 0:
            trained = saved[0] // (wanted[0] // built)
        else:
            continue
        return trained, built, f"{key} {tuple(saved)} vs {tuple(wanted)}"
    return None


def _backbone_prefix(model) -> str:
    """Where the image network of a detectron2 model sits: "backbone.bottom_up." under an FPN,
    "backbone." otherwise, "" for a model without a backbone (all of it)."""
    model = getattr(model, "module", model)  # DDP
    backbone = getattr(model, "backbone", None)
    if backbone is None:
        return ""
    return "backbone.bottom_up." if hasattr(backbone, "bottom_up") else "backbone."


def counted_weights(keys) -> list:
    """The keys of ``keys`` that the weight counts count: parameters and buffers, BatchNorm's
    ``num_batches_tracked`` counters aside (they hold no weight)."""
    return [key for key in keys if not key.endswith("num_batches_tracked")]


def _loaded_counts(model, missing_keys, path: str) -> str:
    """ "loaded 231 of 231 backbone weights and 40 of 120 other weights from PATH": the
    model's weights (parameters and buffers, without BatchNorm's counters) that ``path``
    filled, in the image network and in the rest."""
    prefix = _backbone_prefix(model)
    missing = set(missing_keys)
    counts = {True: [0, 0], False: [0, 0]}  # in the backbone: [loaded, all]
    for key in counted_weights(model.state_dict()):
        count = counts[key.startswith(prefix)]
        count[0] += key not in missing
        count[1] += 1
    if not prefix:  # a model without a backbone: all of it
        return f"loaded {counts[True][0]} of {counts[True][1]} weights from {path}"
    return (
        f"loaded {counts[True][0]} of {counts[True][1]} backbone weights and "
        f"{counts[False][0]} of {counts[False][1]} other weights from {path}"
    )


def check_weights(weights: str, key: str = "MODEL.WEIGHTS") -> None:
    """``weights`` names a checkpoint (a path or a URL), or an error says what is missing;
    ``key``: the config key that set it (a LazyConfig recipe's ``train.init_checkpoint``).

    A URL is downloaded here, once, into iopath's cache (where detectron2's checkpointer then
    finds it), so that a machine without network access hears it before anything starts.

    Raises:
        ValueError: ``weights`` is empty.
        FileNotFoundError: ``weights`` names a local file that does not exist, or a URL that
            cannot be downloaded.
    """
    if not weights:
        raise UserError(
            f"{key} is empty: pass the trained checkpoint, e.g. "
            f"{override(key, 'output/model_final.pth')}"
        )
    if "://" in weights:
        download_logger = logging.getLogger("iopath.common.download")  # its own error line
        level = download_logger.level
        download_logger.setLevel(logging.CRITICAL)
        try:
            PathManager.get_local_path(weights)
        except UserError:  # a handler of lambda_det's (timm://) said what is wrong
            raise
        except OSError as error:  # urllib's URLError and HTTPError are OSErrors
            reason = getattr(error, "reason", None) or error
            raise MissingFileError(
                f"{key} {weights!r} cannot be downloaded ({reason}): download it where there "
                f"is network access and pass the local file, "
                f"{override(key, 'path/to/' + os.path.basename(weights))}"
            ) from None
        finally:
            download_logger.setLevel(level)
    elif not os.path.isfile(weights):
        raise MissingFileError(
            f"{key} file {weights!r} does not exist: pass the path of a "
            f"checkpoint, or {override(key, '')} to start from scratch"
        )


def evaluation_weights(output_dir: Setting, weights: Setting, resume: bool) -> str:
    """The checkpoint ``--eval-only`` evaluates: ``output_dir``'s last checkpoint with
    ``resume`` (when there is one), else ``weights`` (each with the key that set it).

    Raises:
        ValueError: no weights at all (that would evaluate a randomly initialised model).
        FileNotFoundError: a local checkpoint file that does not exist.
        ValueError, FileNotFoundError, IsADirectoryError: ``output_dir``'s last_checkpoint is
            empty or names no file (:func:`checkpoint_to_resume`).
    """
    latest = checkpoint_to_resume(output_dir.value) if resume else None
    if latest is not None:
        return latest
    if not weights.value:
        where = (
            f" and {output_dir.key} {output_dir.value!r} has no last_checkpoint" if resume else ""
        )
        raise UserError(
            f"--eval-only needs trained weights: {weights.key} is empty{where}; "
            f"pass {override(weights.key, 'PATH')}"
        )
    check_weights(weights.value, weights.key)
    return weights.value


def load_weights(model, weights: str, require: str = "all") -> None:
    """Load the checkpoint ``weights`` (a path or a URL) into ``model``, safely
    (:func:`load_checkpoint_file`) and checked (``require``: see :class:`AtomicCheckpointer`).

    Raises:
        ValueError: ``weights`` is empty.
        FileNotFoundError: ``weights`` names a local file that does not exist.
        WeightsMismatchError: the checkpoint does not fit the model.
        UnsafeCheckpointError, CorruptCheckpointError: the file cannot be loaded safely.
    """
    check_weights(weights)
    AtomicCheckpointer(model, require=require).load(weights, checkpointables=[])


def last_checkpoint(output_dir: str) -> Optional[str]:
    """The file name ``output_dir/last_checkpoint`` points at, or None without one.

    Raises:
        NotTextError: last_checkpoint is not text.
    """
    path = os.path.join(output_dir, "last_checkpoint")
    if not os.path.isfile(path):
        return None
    return read_text(
        path,
        "write the name of one of the run's checkpoints (model_*.pth) into "
        "it, or pass another OUTPUT_DIR",
    ).strip()


def checkpoint_to_resume(output_dir: str) -> Optional[str]:
    """The checkpoint that ``--resume`` continues from: the path of the file that
    ``output_dir/last_checkpoint`` names, or None without last_checkpoint.

    Raises:
        ValueError: last_checkpoint is empty.
        FileNotFoundError: it names a file that does not exist.
        IsADirectoryError: it names a folder.
    """
    name = last_checkpoint(output_dir)
    if name is None:
        return None
    path = os.path.join(output_dir, name)
    if name and os.path.isfile(path):
        return path
    pointer = os.path.join(output_dir, "last_checkpoint")
    found = sorted(
        os.path.basename(file)
        for file in glob.glob(os.path.join(glob.escape(output_dir), "model_*.pth"))
    )
    fix = (
        f"write the name of one of the run's checkpoints ({', '.join(found[-3:])}) into "
        f"it, or, to train from scratch instead, pass --restart without --resume"
        if found
        else "the folder holds no checkpoint (model_*.pth): to train from scratch, pass "
        "--restart without --resume"
    )
    if not name:
        raise UserError(f"{pointer} is empty: {fix}")
    if os.path.isdir(path):
        raise IsAFolderError(f"{pointer} names {name!r}, a folder, not a checkpoint: {fix}")
    raise MissingFileError(f"{pointer} names {name!r}, which does not exist: {fix}")
