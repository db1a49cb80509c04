"""A run's OUTPUT_DIR: one run at a time (an OS lock), never trained over by mistake, and never
written over by an evaluation; and which files in a folder a run or a tool of lambda_det wrote
(``run_files.json``, :data:`RECORD_FILE`), so that nothing moves or replaces a user's file of
the same name."""

import datetime
import errno
import fnmatch
import hashlib
import json
import os
import socket
import stat
import time
from typing import List, NamedTuple, Optional, Sequence

from lambda_det.checkpoint import last_checkpoint
from lambda_det.utils.atomic import (
    OutputWriteError,
    PathLike,
    atomic_write,
    refuse_symlink,
    reporting_write_errors,
)
from lambda_det.utils.errors import ExistingFileError, UserError

__all__ = [
    "OutputDirLock",
    "OutputDirBusyError",
    "prepare_output_dir",
    "check_run_writes",
    "holds_run_files",
    "run_files_in",
    "evaluation_output_dir",
    "FolderFiles",
    "read_record",
    "run_files",
    "written_files",
    "not_the_runs",
    "record_run",
    "check_tool_outputs",
    "record_outputs",
    "run_owner",
    "RUN_FILES",
    "RUN_WRITES",
    "RECORD_FILE",
    "PREVIOUS_RUN_PREFIX",
    "EVALUATION_PREFIX",
    "LOCK_FILE",
]

PREVIOUS_RUN_PREFIX = "previous_"
EVALUATION_PREFIX = "eval_"
LOCK_FILE = "run.lock"
# The record of what runs and tools of lambda_det wrote in a folder (see read_record).
RECORD_FILE = "run_files.json"
RECORD_FORMAT = "lambda_det run files 1"
RECORD_LIMIT = 1 << 20  # bytes; a record names a few dozen files
# What a training run writes into OUTPUT_DIR (detectron2's trainer, checkpointer, evaluators and
# writers) and its record: what --restart moves aside, when the record says they are the run's.
# Other files there are left alone.
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
    RECORD_FILE,
)
# The names of RUN_FILES that a new run writes over or appends to (the others are new names:
# a temporary file, an events file): a user's file at one of them is in the run's way.
RUN_WRITES = (
    "last_checkpoint",
    "model_final.pth",
    "model_[0-9]*.pth",
    "metrics.json",
    "eval_results.json",
    "config.yaml",
    "log.txt",
    "log.txt.rank*",
    "inference",
    RECORD_FILE,
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
        """Release the lock; a folder the lock created and nothing but the lock and the run's
        record wrote into (a run that stopped at its checks) is removed again."""
        if self._fd is None:
            return
        left = os.listdir(self.output_dir) if self._created_folder else None
        if left is not None and set(left) <= {LOCK_FILE, RECORD_FILE}:
            for name in left:
                os.remove(os.path.join(self.output_dir, name))
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
    key: str = "OUTPUT_DIR",
    overwrite: bool = False,
) -> Optional[str]:
    """Refuse to train over the run that ``output_dir`` holds, unless told how, and over a
    user's file at a name the run writes.

    A folder holds a run when it has any of a run's own files (:func:`run_files`), a checkpoint
    or not: detectron2 would start again at iteration 0, replace the run's checkpoints one by one
    and append to its metrics.json and log.txt. ``resume`` continues from the last checkpoint; a
    run that stopped before its first one has nothing to continue, which is an error rather than
    a silent start at iteration 0. ``restart`` first moves the run's own files (and those its
    tools wrote, :func:`written_files`) into ``output_dir/previous_<date-time>/``: nothing is
    deleted, nothing mixes, and a file the run did not write stays where it is
    (:func:`not_the_runs`). Only machine 0 moves files (detectron2 writes them from the main
    process only). ``key`` names the folder in errors as the config does. ``overwrite``: a
    user's file at a name the run writes is no error (the run replaces it, or appends to it).

    Returns:
        the folder the previous run's files were moved to, or None.

    Raises:
        FileExistsError: a file that no run wrote is at a name a run writes (:data:`RUN_WRITES`:
            detectron2 would append to a user's log.txt, replace a user's model_final.pth), or
            ``output_dir`` holds a run and neither ``resume`` (with a checkpoint to continue)
            nor ``restart`` is set.
        OutputWriteError: ``resume``, and a file the run writes in place
            (:data:`WRITTEN_IN_PLACE`) is a symbolic link.
    """
    if not overwrite:
        check_run_writes(output_dir, key)
    files = run_files(output_dir, key)
    names = [name for name in files.own if name != RECORD_FILE]  # a record alone: no run yet
    if not names:
        return None
    latest = last_checkpoint(output_dir)
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
        nothing = "it has no checkpoint to resume from, " if resume else ""
        raise ExistingFileError(
            f"{key} {output_dir!r} holds a run that stopped before its first checkpoint "
            f"({_some(names)}): {nothing}pass --restart to start over in it ({moved}), or "
            f"another {key}"
        )
    if machine_rank != 0:
        return None
    written = written_files(output_dir, key).own
    previous = _new_dated_folder(output_dir, PREVIOUS_RUN_PREFIX)
    for name in [*files.own, *written]:
        os.replace(os.path.join(output_dir, name), os.path.join(previous, name))
    return previous


def check_run_writes(output_dir: str, key: str = "OUTPUT_DIR") -> None:
    """Refuse a run (training or evaluation) in ``output_dir`` when a file that no run wrote is
    at a name a run writes (:data:`RUN_WRITES`).

    Raises:
        ExistingFileError: naming the files and the fix.
    """
    in_the_way = [name for name in run_files(output_dir, key).foreign if _matches(name, RUN_WRITES)]
    if in_the_way:
        raise ExistingFileError(
            f"{key} {output_dir!r} holds {_some(in_the_way)}, which no run wrote there "
            f"({RECORD_FILE} does not record it as a run's) and a run writes: move "
            f"{'it' if len(in_the_way) == 1 else 'them'} away, or pass another {key}"
        )


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
    """The names in ``output_dir`` that match one of ``run_files``, sorted (the run's own or
    not: :func:`run_files` tells)."""
    if not os.path.isdir(output_dir):
        return []
    return [name for name in sorted(os.listdir(output_dir)) if _matches(name, run_files)]


# ---- which files in a folder a run or a tool of lambda_det wrote ----


class FolderFiles(NamedTuple):
    """Names in a folder (sorted): ``own``, written by a run or a tool of lambda_det; ``foreign``,
    of the same kind but not written by them (a user's file)."""

    own: List[str]
    foreign: List[str]


def read_record(folder: PathLike, key: str = "OUTPUT_DIR") -> Optional[dict]:
    """``folder/run_files.json``, the record of what was written there, or None without one.

    The record says two things. ``"run"`` (written by :func:`record_run` before a run, training
    or evaluation, writes anything): the run's files are those of :data:`RUN_FILES` except the
    names in its ``"not the run's"`` list, which were there before it. ``"files"`` (written by
    :func:`record_outputs` after a tool wrote them, e.g. the demo's pictures): name -> bytes and
    sha256 of what the tool wrote, so that a file a user put there since is told apart.

    Raises:
        ExistingFileError: the file is not such a record (a link, too large, not JSON, another
            layout): it names the file and says to move it away (``key``: the folder's option).
    """
    path = os.path.join(os.fspath(folder), RECORD_FILE)
    try:
        status = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    record, reason = None, None
    if not stat.S_ISREG(status.st_mode):
        reason = "not a plain file"
    elif status.st_size > RECORD_LIMIT:
        reason = f"{status.st_size} bytes, over a record's {RECORD_LIMIT}"
    else:
        with open(path, "rb") as f:
            data = f.read(RECORD_LIMIT + 1)
        try:
            record = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            reason = "not JSON"
        reason = reason or _record_problem(record)
    if reason is not None:
        raise ExistingFileError(
            f"{path!r} is not lambda_det's record of the files written in {os.fspath(folder)!r} "
            f"({reason}): move it away, or pass another {key}"
        )
    return record


def _record_problem(record) -> Optional[str]:
    """What is wrong with a parsed record's layout (see :func:`read_record`), or None."""
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        return f'no "format": "{RECORD_FORMAT}"'
    if set(record) - {"format", "run", "files"}:
        return "keys other than format, run and files"
    run = record.get("run", {"not the run's": []})
    if not isinstance(run, dict) or set(run) != {"not the run's"}:
        return '"run" is not {"not the run\'s": [NAME, ...]}'
    if not isinstance(run["not the run's"], list) or not all(
        map(_is_plain_name, run["not the run's"])
    ):
        return '"not the run\'s" is not a list of file names'
    files = record.get("files", {})
    if not isinstance(files, dict) or not all(
        _is_plain_name(name) and _is_file_entry(entry) for name, entry in files.items()
    ):
        return '"files" is not {NAME: {"bytes": N, "sha256": HEX}, ...}'
    return None


def _is_plain_name(name) -> bool:
    """A name of a file in the folder itself (nothing is moved or read by a record's path)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name


def _is_file_entry(entry) -> bool:
    return (
        isinstance(entry, dict)
        and set(entry) == {"bytes", "sha256"}
        and type(entry["bytes"]) is int
        and entry["bytes"] >= 0
        and isinstance(entry["sha256"], str)
        and len(entry["sha256"]) == 64
    )


def run_files(folder: PathLike, key: str = "OUTPUT_DIR") -> FolderFiles:
    """The names of a run's files in ``folder`` (:data:`RUN_FILES`), as the run's own or not.

    With a record (:func:`read_record`) that has a run, they are the run's except the names it
    lists as there before the run; with a record of tools' files only, none is. Without a record,
    they are the run's when the folder has a ``last_checkpoint`` (a run that Detectron2's own
    train_net.py made, or one made without the record), else none is: a log.txt or
    metrics.json alone may be anybody's. The record itself is always own.

    Raises:
        ExistingFileError: ``run_files.json`` is not a record (see :func:`read_record`).
    """
    names = run_files_in(os.fspath(folder))
    record = read_record(folder, key)
    if record is None:
        if os.path.lexists(os.path.join(folder, "last_checkpoint")):
            return FolderFiles(names, [])
        return FolderFiles([], names)
    run = record.get("run")
    others = set(run["not the run's"]) if run is not None else None
    own = [
        name for name in names if name == RECORD_FILE or (others is not None and name not in others)
    ]
    return FolderFiles(own, [name for name in names if name not in own])


def written_files(folder: PathLike, key: str = "OUTPUT_DIR") -> FolderFiles:
    """The files in ``folder`` that the record says a tool wrote (:func:`record_outputs`): own
    when unchanged since (the same bytes), foreign when a file of that name is there with other
    bytes, or is not a plain file (a user's, put there since).

    Raises:
        ExistingFileError: ``run_files.json`` is not a record (see :func:`read_record`).
    """
    record = read_record(folder, key) or {}
    own, foreign = [], []
    for name, entry in sorted(record.get("files", {}).items()):
        path = os.path.join(folder, name)
        if _is_unchanged(path, entry):
            own.append(name)
        elif os.path.lexists(path):
            foreign.append(name)
    return FolderFiles(own, foreign)


def not_the_runs(folder: PathLike, key: str = "OUTPUT_DIR") -> List[str]:
    """The names in ``folder`` of a run's or a tool's files that neither wrote (what --restart
    leaves where it is)."""
    return sorted(run_files(folder, key).foreign + written_files(folder, key).foreign)


def record_run(folder: PathLike, key: str = "OUTPUT_DIR") -> None:
    """Before a run (training or evaluation) writes into ``folder``: record that the run's files
    there (:data:`RUN_FILES`) are its own, except those already there that are not a run's
    (:func:`run_files`; a resumed run's record is kept as it is). Call it once, in the process
    that holds the folder's lock, after :func:`prepare_output_dir`.

    Raises:
        ExistingFileError: ``run_files.json`` is not a record.
        OutputWriteError: it cannot be written.
    """
    record = read_record(folder, key)
    if record is not None and "run" in record:
        return
    others = run_files(folder, key).foreign
    record = {**(record or {"format": RECORD_FORMAT}), "run": {"not the run's": others}}
    _write_record(folder, record, key)


def check_tool_outputs(folder: PathLike, names: Sequence[str], tool: str, key: str) -> None:
    """Before ``tool`` (e.g. "the demo") does its work: every one of ``names`` in ``folder`` is
    missing, or a file that the tool wrote there and nobody changed since (:func:`written_files`):
    only those are replaced. ``key`` names the folder's option in the error.

    Raises:
        ExistingFileError: naming the first other file and the fix.
    """
    own = written_files(folder, key).own
    for name in names:
        path = os.path.join(folder, name)
        if os.path.lexists(path) and name not in own:
            raise ExistingFileError(
                f"{key} {os.fspath(folder)!r} holds {name}, which {tool} did not write "
                f"({RECORD_FILE} has no record of it as it is), and {tool} writes: move it "
                f"away, or pass another {key}"
            )


def record_outputs(folder: PathLike, names: Sequence[str], key: str = "OUTPUT_DIR") -> None:
    """After a tool wrote ``names`` into ``folder`` (those that are plain files there): record
    their bytes and sha256, so that :func:`check_tool_outputs` lets the tool replace them next
    time and :func:`prepare_output_dir` moves them with the run.

    Raises:
        ExistingFileError: ``run_files.json`` is not a record.
        OutputWriteError: it cannot be written.
    """
    paths = {name: os.path.join(folder, name) for name in names}
    written = {name: path for name, path in paths.items() if _is_plain_file(path)}
    if not written:
        return
    record = read_record(folder, key)
    if record is None:
        record = {"format": RECORD_FORMAT}
        if run_files(folder, key).own:  # a run made without a record: still the run's files
            record["run"] = {"not the run's": []}
    files = dict(record.get("files", {}))
    for name, path in written.items():
        files[name] = {"bytes": os.path.getsize(path), "sha256": _sha256(path)}
    _write_record(folder, {**record, "files": files}, key)


def run_owner(path: PathLike) -> Optional[str]:
    """The run that owns ``path``, as an error names it (``"the run in 'FOLDER' (its
    config.yaml)"``), or None: ``path`` is one of a run's own files (:func:`run_files`) or lies
    inside one of the run's folders (``inference/``, ``previous_*/``, ``eval_*/``), of any
    folder above it that holds a run (a record or a ``last_checkpoint``), the nearest first. A
    folder whose record is malformed counts as holding none here (the run's own tools refuse
    it)."""
    path = os.path.abspath(os.fspath(path))
    child = path
    while os.path.dirname(child) != child:
        folder, name = os.path.dirname(child), os.path.basename(child)
        if _holds_a_run(folder) and _is_the_runs(folder, name, inside=child != path):
            where = f"inside its {name}/" if child != path else f"its {name}"
            return f"the run in {folder!r} ({where})"
        child = folder
    return None


def _holds_a_run(folder: str) -> bool:
    return any(
        os.path.lexists(os.path.join(folder, name)) for name in (RECORD_FILE, "last_checkpoint")
    )


def _is_the_runs(folder: str, name: str, inside: bool) -> bool:
    """Whether ``folder/name`` is the run's (``inside``: a folder ``path`` lies in)."""
    if inside and name.startswith((PREVIOUS_RUN_PREFIX, EVALUATION_PREFIX)):
        return True
    try:
        return name in run_files(folder).own
    except UserError:  # a malformed record
        return False


def _write_record(folder: PathLike, record: dict, key: str) -> None:
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    atomic_write(os.path.join(folder, RECORD_FILE), text, key)


def _is_plain_file(path: str) -> bool:
    """A file, not a link or a folder."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _is_unchanged(path: str, entry: dict) -> bool:
    """Whether ``path`` is a plain file of the recorded bytes."""
    return (
        _is_plain_file(path)
        and os.path.getsize(path) == entry["bytes"]
        and _sha256(path) == entry["sha256"]
    )


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def _some(names: Sequence[str]) -> str:
    """The first three of ``names``, for an error line."""
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _new_dated_folder(parent: str, prefix: str) -> str:
    """A new, empty ``parent/<prefix><date-time>/`` (``-2``, ``-3``... within one second)."""
    stamp = prefix + time.strftime("%Y%m%d-%H%M%S")
    folder, count = os.path.join(parent, stamp), 1
    while os.path.exists(folder):
        count += 1
        folder = os.path.join(parent, f"{stamp}-{count}")
    os.makedirs(folder)
    return folder
