"""Files that appear whole or not at all (checkpoints, last_checkpoint, results, exported
models), the one rule every tool follows before writing a file (:func:`check_output_file`), and
write failures (a read-only, full or missing disk) reported as one error that names the path and
the fix."""

import contextlib
import errno
import os
import tempfile
import uuid
from typing import Container, Iterator, Mapping, Optional, Tuple, Union

from lambda_det.utils.errors import ExistingFileError, IsAFolderError, UserError

__all__ = [
    "atomic_path",
    "atomic_write",
    "check_output_file",
    "file_identity",
    "refuse_symlink",
    "OutputWriteError",
    "write_error",
    "reporting_write_errors",
    "check_writable_folder",
    "DISK_ERRNOS",
]

PathLike = Union[str, os.PathLike]

# What a full or read-only disk raises, whatever file is being written.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class OutputWriteError(UserError, RuntimeError):
    """A file or folder that a tool writes cannot be written (read-only, full, a system folder
    such as /sys, or a file in the way); the message names the path and the fix."""


def write_error(
    path: Union[str, os.PathLike], error: OSError, option: str = "the output folder"
) -> OutputWriteError:
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
def reporting_write_errors(
    path: Union[str, os.PathLike],
    option: str = "the output folder",
    errnos: Optional[Container[int]] = None,
) -> Iterator[None]:
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
    if isinstance(error, OutputWriteError):  # already the one line (e.g. a refused link)
        return None
    context = error.__context__
    return context if isinstance(context, OSError) and not error.__suppress_context__ else None


def check_writable_folder(
    folder: Union[str, os.PathLike], option: str = "the output folder"
) -> None:
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


def file_identity(path: PathLike) -> Optional[Tuple[int, int]]:
    """What ``os.path.samefile`` compares (device, inode), through links; None for a path that
    leads to no file (missing, or a dangling link)."""
    try:
        status = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return status.st_dev, status.st_ino


def check_output_file(
    path: PathLike,
    overwrite: bool,
    reads: Optional[Mapping[str, Optional[PathLike]]] = None,
    option: str = "--output",
    what: Optional[str] = None,
    owner: Optional[str] = None,
) -> None:
    """The output rule of every tool, checked before the work: a file the command reads is
    never written over (``reads``: what the user calls it, e.g. "MODEL.WEIGHTS" -> its path;
    compared as files, through links and spellings; a folder there: any file in it), nor a
    file a run owns (``owner``: how an error names the run, from
    :func:`lambda_det.cli.output_dir.run_owner`); another existing file (or a link) only with
    ``overwrite``. Writers then go through :func:`atomic_path`, which replaces a link itself
    rather than the file it points to.

    Args:
        option: where the user chose ``path`` ("--output"), for the fix.
        what: how errors name ``path`` (default ``<option> '<path>'``).

    Raises:
        IsADirectoryError: ``path`` is a folder.
        FileExistsError: ``path`` is a file the command reads or a run owns, or exists without
            ``overwrite``.
    """
    what = what or f"{option} {os.fspath(path)!r}"
    if os.path.isdir(path):
        raise IsAFolderError(f"{what} is a folder: pass a file path as {option}")
    if not os.path.lexists(path):
        return
    identity = file_identity(path)
    for role, read in (reads or {}).items():
        if read is None:
            continue
        if identity is not None and file_identity(read) == identity:
            raise ExistingFileError(
                f"{what} is {role}, which this command reads: pass another {option}"
            )
        if os.path.isdir(read) and _is_inside(path, read):
            raise ExistingFileError(
                f"{what} is inside {role}, which this command reads: pass another {option}"
            )
    if owner is not None:
        raise ExistingFileError(
            f"{what} belongs to {owner}: a run's files are never written over, not even "
            f"with --overwrite: pass another {option}"
        )
    if not overwrite:
        raise ExistingFileError(
            f"{what} exists: pass another {option}, or --overwrite to replace it"
        )


def _is_inside(path: PathLike, folder: PathLike) -> bool:
    """Whether a folder above ``path`` is ``folder`` (compared as files: through links)."""
    wanted = file_identity(folder)
    level = os.path.abspath(os.fspath(path))
    while os.path.dirname(level) != level:
        level = os.path.dirname(level)
        if file_identity(level) == wanted:
            return True
    return False


def refuse_symlink(path: PathLike, fix: str) -> None:
    """For a file written in place (appended to, locked): refuse a symbolic link at ``path``,
    which the write would follow to a file the command does not own.

    Raises:
        OutputWriteError: naming ``path`` and ``fix``.
    """
    if os.path.islink(path):
        raise OutputWriteError(
            f"{os.fspath(path)!r} is a symbolic link (to "
            f"{os.readlink(path)!r}), and is written in place: {fix}"
        )


@contextlib.contextmanager
def atomic_path(
    path: PathLike, suffix: str = "", option: str = "the output folder"
) -> Iterator[str]:
    """A new temporary path beside ``path`` for the block to write; renamed over ``path`` if the
    block succeeds, removed if it raises. ``suffix`` ends the temporary name, for writers that
    choose the format by it (OpenCV); ``option`` names where the user chose ``path``, for a
    write error.

    A link at ``path`` is replaced by the new file: nothing is written through it.

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
    temporary = f"{path}.{uuid.uuid4().hex[:12]}.tmp{suffix}"
    with reporting_write_errors(path, option):
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


def atomic_write(
    path: PathLike, data: Union[str, bytes], option: str = "the output folder"
) -> None:
    """Write ``data`` (text as utf-8) to ``path`` through :func:`atomic_path`."""
    with atomic_path(path, option=option) as temporary, open(temporary, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
