"""A run's OUTPUT_DIR: one run at a time (an OS lock), never trained over by mistake, and never
written over by an evaluation."""

import datetime
import errno
import fnmatch
import os
import socket
import stat
import time
from typing import List, Optional, Sequence

from lambda_det.checkpoint import last_checkpoint
from lambda_det.utils.atomic import OutputWriteError, refuse_symlink, reporting_write_errors
from lambda_det.utils.errors import ExistingFileError, UserError

__all__ = [
    "OutputDirLock",
    "OutputDirBusyError",
    "prepare_output_dir",
    "holds_run_files",
    "run_files_in",
    "evaluation_output_dir",
    "RUN_FILES",
    "PREVIOUS_RUN_PREFIX",
    "EVALUATION_PREFIX",
    "LOCK_FILE",
]

PREVIOUS_RUN_PREFIX = "previous_"
EVALUATION_PREFIX = "eval_"
LOCK_FILE = "run.lock"
# What a training run writes into OUTPUT_DIR (detectron2's trainer, checkpointer, evaluators and
# writers): what --restart moves aside. Other files there are left alone.
RUN_FILES = (
    "last_checkpoint",
    "model_*.pth",
    "*.pth.*.tmp",
    "metrics.json",
    "eval_results.json",
    "config.yaml",
    "log.txt*",
    "events.out.tfevents.*",
    "inference",
)

# The run's files that detectron2 writes in place (appends to, or rewrites) on --resume, rather
# than through a temporary file: a link there would be written through.
WRITTEN_IN_PLACE = ("config.yaml", "log.txt*", "metrics.json", "events.out.tfevents.*")


class OutputDirBusyError(UserError, RuntimeError):
    """Another process holds the OUTPUT_DIR's lock."""


class OutputDirLock:
    """An exclusive ``flock`` on ``OUTPUT_DIR/run.lock``, held by a run for its whole life.

    The kernel drops the lock when the process ends, however it ends, so a killed run leaves no
    stale lock behind. The file keeps the holder's pid, host and start time for the error that
    a second run gets. Use as a context manager, or ``acquire()`` / ``release()``. ``key``
    names the folder in errors as the config does (``train.output_dir`` in a LazyConfig recipe).
    """

    def __init__(self, output_dir: str, key: str = "OUTPUT_DIR"):
        self.output_dir = output_dir
        self.key = key
        self.path = os.path.join(output_dir, LOCK_FILE)
        self._fd: Optional[int] = None
        self._created_folder = False

    def acquire(self) -> "OutputDirLock":
        """Raises :class:`OutputDirBusyError` naming the holder when another process has it, and
        :class:`~lambda_det.utils.atomic.OutputWriteError` when the folder cannot be written
        (read-only, full: the lock file is the run's first write) or ``run.lock`` is a link or
        another file than a lock."""
        with reporting_write_errors(self.output_dir, self.key):
            try:
                return self._acquire()
            except OSError:
                self.release()  # the lock file could not be written: let go of it
                raise

    def _acquire(self) -> "OutputDirLock":
        import fcntl  # POSIX; detectron2 runs on Linux

        self._created_folder = not os.path.isdir(self.output_dir)
        os.makedirs(self.output_dir, exist_ok=True)
        # The lock is written in place (its inode is what is locked): never through a link
        # (O_NOFOLLOW), and an existing file only when it is a lock file.
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            created = True
        except FileExistsError:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
            except OSError as error:
                if error.errno == errno.ELOOP:
                    refuse_symlink(self.path, f"remove the link, or pass another {self.key}")
                raise
            created = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 1024).decode(errors="replace").strip() or "unknown process"
            os.close(fd)
            raise OutputDirBusyError(
                f"{self.key} {self.output_dir!r} is in use by another run ({holder}): wait for "
                f"it to end, or pass another {self.key}"
            ) from None
        if not created:
            self._check_lock_file(fd)
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        self._fd = fd
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)  # after _check_lock_file's read
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode())
        return self

    def _check_lock_file(self, fd: int) -> None:
        """An existing ``run.lock`` (opened as ``fd``) is rewritten only when it is an earlier
        run's lock: a plain file with no other name (hard link), empty or holding a holder line.

        Raises:
            OutputWriteError: naming the file and the fix (the file is left as it was).
        """
        status = os.fstat(fd)
        text = os.read(fd, 1024)
        reason = (
            "not a plain file"
            if not stat.S_ISREG(status.st_mode)
            else f"it has {status.st_nlink} names (hard links)"
            if status.st_nlink != 1
            else "it holds other data"
            if text and not text.startswith(b"pid ")
            else None
        )
        if reason is not None:
            os.close(fd)
            raise OutputWriteError(
                f"{self.path!r} is not a run's lock file ({reason}): move it "
                f"away, or pass another {self.key}"
            )

    def release(self) -> None:
        """Release the lock; a folder the lock created and nothing else wrote into (a run that
        stopped at its checks) is removed again."""
        if self._fd is None:
            return
        if self._created_folder and os.listdir(self.output_dir) == [LOCK_FILE]:
            os.remove(self.path)
            os.rmdir(self.output_dir)
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = None

    def __enter__(self) -> "OutputDirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def prepare_output_dir(
    output_dir: str,
    resume: bool,
    restart: bool,
    machine_rank: int = 0,
    run_files: Sequence[str] = RUN_FILES,
    key: str = "OUTPUT_DIR",
) -> Optional[str]:
    """Refuse to train over the run that ``output_dir`` holds, unless told how.

    A folder holds a run when it has any of a run's files (``run_files``, by default
    :data:`RUN_FILES`), a checkpoint or not: detectron2 would start again at iteration 0,
    replace the run's checkpoints one by one and append to its metrics.json and log.txt.
    ``resume`` continues from the last checkpoint; a run that stopped before its first one has
    nothing to continue, which is an error rather than a silent start at iteration 0.
    ``restart`` first moves the run's files into ``output_dir/previous_<date-time>/``: nothing
    is deleted and nothing mixes. Only machine 0 moves files (detectron2 writes them from the
    main process only). ``key`` names the folder in errors as the config does.

    Returns:
        the folder the previous run's files were moved to, or None.

    Raises:
        FileExistsError: ``output_dir`` holds a run and neither ``resume`` (with a checkpoint to
            continue) nor ``restart`` is set.
        OutputWriteError: ``resume``, and a file the run writes in place
            (:data:`WRITTEN_IN_PLACE`) is a symbolic link.
    """
    latest = last_checkpoint(output_dir)
    names = run_files_in(output_dir, run_files)
    if not names:
        return None
    if resume and latest is not None:
        for name in run_files_in(output_dir, WRITTEN_IN_PLACE):  # detectron2 appends to these
            refuse_symlink(
                os.path.join(output_dir, name),
                f"a run writes its own {name}: "
                f"replace the link with a copy of its file, or pass --restart",
            )
        return None
    if not restart:
        moved = f"the previous run's files are moved to {PREVIOUS_RUN_PREFIX}<date-time>/"
        if latest is not None:
            raise ExistingFileError(
                f"{key} {output_dir!r} already holds a run (last checkpoint {latest}): pass "
                f"--resume to continue it, another {key} to keep it, or --restart to start over "
                f"in it ({moved})"
            )
        held = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        nothing = "it has no checkpoint to resume from, " if resume else ""
        raise ExistingFileError(
            f"{key} {output_dir!r} holds a run that stopped before its first checkpoint "
            f"({held}): {nothing}pass --restart to start over in it ({moved}), or another "
            f"{key}"
        )
    if machine_rank != 0:
        return None
    previous = _new_dated_folder(output_dir, PREVIOUS_RUN_PREFIX)
    for name in names:
        os.replace(os.path.join(output_dir, name), os.path.join(previous, name))
    return previous


def holds_run_files(output_dir: str) -> bool:
    """Whether ``output_dir`` holds any of a run's files (:data:`RUN_FILES`): a training run's,
    or an earlier evaluation's."""
    return bool(run_files_in(output_dir, RUN_FILES))


def evaluation_output_dir(output_dir: str) -> str:
    """The folder an evaluation (``--eval-only``) writes into: ``output_dir`` itself when it
    holds none of a run's files, else a new ``output_dir/eval_<date-time>/``.

    An evaluation writes config.yaml, log.txt, eval_results.json and inference/, the names a
    training run uses: in a run's folder it would replace the run's config and results. Call it
    once, in the process that holds ``output_dir``'s lock, before any evaluation process starts.
    """
    if not holds_run_files(output_dir):
        return output_dir
    return _new_dated_folder(output_dir, EVALUATION_PREFIX)


def run_files_in(output_dir: str, run_files: Sequence[str] = RUN_FILES) -> List[str]:
    """The names in ``output_dir`` that match one of ``run_files``, sorted."""
    if not os.path.isdir(output_dir):
        return []
    return [
        name
        for name in sorted(os.listdir(output_dir))
        if any(fnmatch.fnmatch(name, pattern) for pattern in run_files)
    ]


def _new_dated_folder(parent: str, prefix: str) -> str:
    """A new, empty ``parent/<prefix><date-time>/`` (``-2``, ``-3``... within one second)."""
    stamp = prefix + time.strftime("%Y%m%d-%H%M%S")
    folder, count = os.path.join(parent, stamp), 1
    while os.path.exists(folder):
        count += 1
        folder = os.path.join(parent, f"{stamp}-{count}")
    os.makedirs(folder)
    return folder
