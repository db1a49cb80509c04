"""Files that appear whole or not at all (checkpoints, last_checkpoint, results, exported
models), and write failures (a read-only, full or missing disk) reported as one error that names
the path and the fix."""
import contextlib
import errno
import os
import tempfile
import uuid
from typing import Container, Iterator, Optional, Union

__all__ = ["atomic_path", "OutputWriteError", "write_error", "reporting_write_errors",
           "check_writable_folder", "DISK_ERRNOS"]

# What a full or read-only disk raises, whatever file is being written.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class OutputWriteError(RuntimeError):
    """A file or folder that a tool writes cannot be written (read-only, full, a system folder
    such as /sys, or a file in the way); the message names the path and the fix."""


def write_error(path: Union[str, os.PathLike], error: OSError,
                option: str = "the output folder") -> OutputWriteError:
    """An :class:`OutputWriteError` for ``error``, raised while writing ``path`` (``option``
    names where the user chose it, e.g. "--output" or "OUTPUT_DIR")."""
    reason = error.strerror or str(error) or type(error).__name__
    if error.errno == errno.EEXIST:  # os.makedirs over a file
        reason = "a file of that name is in the way (not a folder)"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free space on that disk, or pass {option} on another one"
    else:
        fix = f"pass {option} in a folder you can write to"
    return OutputWriteError(f"cannot write {os.fspath(path)!r}: {reason}: {fix}")


@contextlib.contextmanager
def reporting_write_errors(path: Union[str, os.PathLike], option: str = "the output folder",
                           errnos: Optional[Container[int]] = None) -> Iterator[None]:
    """Raise an ``OSError`` of the block (of ``errnos`` only, if given) as an
    :class:`OutputWriteError` naming ``path`` and ``option``; also one that a writer wrapped
    in a RuntimeError (:func:`_wrapped_os_error`). Other RuntimeErrors pass unchanged."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        cause = error if isinstance(error, OSError) else _wrapped_os_error(error)
        if cause is None or (errnos is not None and cause.errno not in errnos):
            raise
        raise write_error(path, cause, option) from cause


def _wrapped_os_error(error: RuntimeError) -> Optional[OSError]:
    """The OSError that ``error`` was raised while handling: torch.save into a file object
    raises RuntimeError ("unexpected pos", "PytorchStreamWriter failed writing file") when the
    file's write raised, e.g. ENOSPC on a full disk."""
    context = error.__context__
    return context if isinstance(context, OSError) and not error.__suppress_context__ else None


def check_writable_folder(folder: Union[str, os.PathLike],
                          option: str = "the output folder") -> None:
    """``folder`` can be created (if missing) and written: a probe file is written, synced and
    removed, and folders created for it are removed again, so a run that stops at a later check
    leaves nothing behind. Cheap; call it before the work whose results go there.

    Raises:
        OutputWriteError: naming ``folder`` and ``option``.
    """
    folder = os.path.abspath(os.fspath(folder))
    missing = []  # folders the probe creates, deepest first
    level = folder
    while not os.path.lexists(level) and level != os.path.dirname(level):
        missing.append(level)
        level = os.path.dirname(level)
    try:
        with reporting_write_errors(folder, option):
            os.makedirs(folder, exist_ok=True)  # FileExistsError over a file
            handle, probe = tempfile.mkstemp(dir=folder, prefix=".write_check_")
            try:
                os.write(handle, b"\0")
                os.fsync(handle)
            finally:
                os.close(handle)
                os.remove(probe)
    finally:
        for created in missing:
            with contextlib.suppress(OSError):
                os.rmdir(created)


@contextlib.contextmanager
def atomic_path(path: Union[str, os.PathLike]) -> Iterator[str]:
    """A new temporary path beside ``path`` for the block to write; renamed over ``path`` if the
    block succeeds, removed if it raises.

    Readers see the previous file or the complete new one, never a partial one. The data is
    synced to disk before the rename, and the rename itself after it, so an OS crash cannot
    leave a renamed but empty file either. Each call has its own ``<path>.<random>.tmp``, so two
    writers of one path cannot rename each other's half-written file into place; a process
    killed by SIGKILL mid-write leaves its temporary file behind. An ``OSError`` (a full or
    read-only disk) is raised as an :class:`OutputWriteError` naming ``path``.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    # A fresh name (not mkstemp: the block creates the file, with the umask's permissions).
    temporary = f"{path}.{uuid.uuid4().hex[:12]}.tmp"
    with reporting_write_errors(path):
        try:
            yield temporary
            with open(temporary, "rb") as written:
                os.fsync(written.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(temporary)
            raise
        folder_handle = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(folder_handle)
        finally:
            os.close(folder_handle)
