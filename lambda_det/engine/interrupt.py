"""Stopping a run on SIGINT or SIGTERM (Ctrl-C, a preempted cluster job) without losing work.

:func:`stopping_on_signals` installs a handler for both signals. During the training loop
(between :class:`InterruptCheckpoint`'s ``before_train`` and the end of the last iteration) the
first signal only sets a flag: the hook then saves the iteration in flight through the run's
periodic checkpointer (atomic, on the main process) once the step and the other hooks are done,
and raises :class:`Interrupted` on every process. Outside the loop (setting up, the final
evaluation, a tool that is not training) a signal raises :class:`Interrupted` where the program
is, as Ctrl-C raises ``KeyboardInterrupt``. A second signal while the first waits for its step
(or its save) ends the process at once, without a traceback; a save it cuts short leaves its
``.tmp`` file and ``last_checkpoint`` on the previous checkpoint.

Several processes: every rank's hook gathers the flags of all ranks each iteration, so that all
stop after the same iteration whichever of them got the signal. The launching process of
:func:`~lambda_det.engine.launch.launch` passes a signal it gets to its workers through shared
memory (:func:`watching_launcher_signals`), not as a second signal: Ctrl-C and a scheduler's
signal reach every process, and a worker counts only its own. Data loader workers forked while
the handler is installed ignore the signals (the training process decides).
"""

import contextlib
import functools
import multiprocessing
import os
import signal
import threading
from typing import Callable, Iterator, Optional

from detectron2.engine import HookBase
from detectron2.engine.hooks import PeriodicCheckpointer
from detectron2.utils import comm

from lambda_det.checkpoint import last_checkpoint
from lambda_det.compat.internals import registered_hooks

__all__ = [
    "Interrupted",
    "SIGNALS",
    "stopping_on_signals",
    "InterruptCheckpoint",
    "watching_launcher_signals",
    "with_launcher_signals",
]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the run. ``checkpoint``: the file saved for ``iteration``, the
    iteration in flight (None when nothing was saved: outside the training loop, or on a process
    other than the main one). A KeyboardInterrupt, so that ``except Exception`` (detectron2's
    training loop logs those with their traceback) lets it through."""

    def __init__(
        self, signum: int, checkpoint: Optional[str] = None, iteration: Optional[int] = None
    ):
        super().__init__(signum, checkpoint, iteration)
        self.signum, self.checkpoint, self.iteration = signum, checkpoint, iteration

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def status(self) -> int:
        """The exit status: 128 + the signal's number, as a shell reports it (130, 143)."""
        return 128 + self.signum


class _State:
    pid = 0  # the process that installed the handler (0: not installed)
    signum = 0  # the first signal received
    deferring = False  # in the training loop: the first signal waits for the step's end
    launcher = None  # the launching process's signal, in shared memory (a worker's only)


_STATE = _State()


def _handle(signum: int, frame) -> None:
    if os.getpid() != _STATE.pid:
        return  # a data loader worker forked from the training process, which decides
    if _STATE.signum and _STATE.deferring:
        name = signal.Signals(signum).name
        os.write(
            2,
            f"{name} again: stopped at once, without saving the iteration in flight "
            f"(--resume continues from the last complete checkpoint)\n".encode(),
        )
        os._exit(128 + signum)
    _STATE.signum = _STATE.signum or signum
    if not _STATE.deferring:
        raise Interrupted(signum)


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM handled as the module says for the block (in the main thread only:
    elsewhere the block runs with the handlers it has)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    state = _STATE.pid, _STATE.signum, _STATE.deferring  # an enclosing block's
    _STATE.pid, _STATE.signum, _STATE.deferring = os.getpid(), 0, False
    for signum in SIGNALS:
        signal.signal(signum, _handle)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _STATE.pid, _STATE.signum, _STATE.deferring = state


def _requested_signal() -> int:
    """The signal this process or its launcher got (0: none), the same on every rank."""
    signum = _STATE.signum or (_STATE.launcher.value if _STATE.launcher is not None else 0)
    if comm.get_world_size() > 1:
        signum = max(comm.all_gather(signum))
    return signum


class InterruptCheckpoint(HookBase):
    """The training loop's side of :func:`stopping_on_signals`: after each step (register it
    last, after the periodic checkpointer and the writers), when a signal came, save the
    iteration as the run's :class:`PeriodicCheckpointer` names its checkpoints (unless it has
    just saved it) and raise :class:`Interrupted`. Inert without the handler."""

    def before_train(self):
        _STATE.deferring = _STATE.pid == os.getpid()

    def after_step(self):
        if not _STATE.deferring:
            return
        iteration = self.trainer.iter
        signum = _requested_signal()
        if not signum:
            # The final evaluation is not a step: a signal there stops it at once.
            _STATE.deferring = iteration < self.trainer.max_iter - 1
            return
        _STATE.signum = signum
        checkpoint = self._save(iteration) if comm.is_main_process() else None
        comm.synchronize()
        _STATE.deferring = False
        raise Interrupted(signum, checkpoint, iteration)

    def _save(self, iteration: int) -> Optional[str]:
        hooks = registered_hooks(self.trainer)
        periodic = next((hook for hook in hooks if isinstance(hook, PeriodicCheckpointer)), None)
        if periodic is None:
            return None
        checkpointer, prefix = periodic.checkpointer, periodic.file_prefix
        name = f"{prefix}_{iteration:07d}"
        saved = [f"{name}.pth"] + (
            [f"{prefix}_final.pth"] if iteration >= self.trainer.max_iter - 1 else []
        )
        if last_checkpoint(checkpointer.save_dir) not in saved:
            checkpointer.save(name, iteration=iteration)  # as the periodic checkpointer does
        return os.path.join(checkpointer.save_dir, last_checkpoint(checkpointer.save_dir))

    def after_train(self):
        _STATE.deferring = False


def with_launcher_signals(launcher, main_func: Callable, *args):
    """A worker's ``main_func(*args)``, told the signal its launching process gets through
    ``launcher`` (a shared ``RawValue``)."""
    _STATE.launcher = launcher
    return main_func(*args)


@contextlib.contextmanager
def watching_launcher_signals(main_func: Callable) -> Iterator[Callable]:
    """For the block that starts and waits for worker processes: ``main_func`` wrapped to see
    the launcher's signals (:func:`with_launcher_signals`). The first SIGINT or SIGTERM the
    launcher gets is passed to the workers (they stop after the step in flight); a second one
    kills them and ends the launcher at once."""
    launcher = multiprocessing.get_context("spawn").RawValue("i", 0)

    def handle(signum, frame):
        if not launcher.value:
            launcher.value = signum
            return
        for child in multiprocessing.active_children():
            child.kill()
        os.write(
            2,
            f"{signal.Signals(signum).name} again: stopped the training processes at "
            f"once\n".encode(),
        )
        os._exit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield main_func
        return
    previous = {signum: signal.signal(signum, handle) for signum in SIGNALS}
    try:
        yield functools.partial(with_launcher_signals, launcher, main_func)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
