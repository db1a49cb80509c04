"""Files that appear whole or not at all: checkpoints, last_checkpoint, results, exported models."""
import contextlib
import os
import uuid
from typing import Iterator, Union

__all__ = ["atomic_path"]


@contextlib.contextmanager
def atomic_path(path: Union[str, os.PathLike]) -> Iterator[str]:
    """A new temporary path beside ``path`` for the block to write; renamed over ``path`` if the
    block succeeds, removed if it raises.

    Readers see the previous file or the complete new one, never a partial one. The data is
    synced to disk before the rename, and the rename itself after it, so an OS crash cannot
    leave a renamed but empty file either. Each call has its own ``<path>.<random>.tmp``, so two
    writers of one path cannot rename each other's half-written file into place; a process
    killed by SIGKILL mid-write leaves its temporary file behind.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    # A fresh name (not mkstemp: the block creates the file, with the umask's permissions).
    temporary = f"{path}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        yield temporary
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise
    folder_handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(folder_handle)
    finally:
        os.close(folder_handle)
