"""Files that appear whole or not at all: checkpoints, last_checkpoint, results, exported models."""
import contextlib
import os
from typing import Iterator, Union

__all__ = ["atomic_path"]


@contextlib.contextmanager
def atomic_path(path: Union[str, os.PathLike]) -> Iterator[str]:
    """A temporary path beside ``path`` for the block to write; renamed over ``path`` if the block
    succeeds, removed if it raises.

    Readers see the previous file or the complete new one, never a partial one. The data is
    synced to disk before the rename, and the rename itself after it, so an OS crash cannot
    leave a renamed but empty file either. A process killed by SIGKILL mid-write leaves only
    ``<path>.tmp``, which the next write of ``path`` replaces.
    """
    path = os.fspath(path)
    temporary = f"{path}.tmp"
    try:
        yield temporary
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise
    folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
