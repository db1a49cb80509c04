"""Ctrl-C and SIGTERM in the tools: one line on stderr and exit status 130 / 143 (128 + the
signal's number, as a shell reports a process it ended), never a KeyboardInterrupt traceback.
Training saves the iteration in flight first (:mod:`lambda_det.engine.interrupt`); the tools
that train through a train_net child (the demo, the comparison: :data:`TRAIN_NET`) wait for it
(:func:`run_child`)."""

import codecs
import collections
import contextlib
import os
import shlex
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator, List, Optional, Sequence, Union

from detectron2.utils import comm

from lambda_det.engine.interrupt import Interrupted, stopping_on_signals

__all__ = [
    "Interrupted",
    "reporting_interrupts",
    "rerun_command",
    "invoked_as",
    "TRAIN_NET",
    "run_child",
    "STDERR_DELAY_S",
    "INTERRUPT_GRACE_S",
]

# The command of a training child: the installed module, which needs no checkout (its
# tools/train_net.py runs the same main()).
TRAIN_NET = (sys.executable, "-m", "lambda_det.cli.train_net")
# How late a child's stderr is shown: what it writes after a Ctrl-C (its own line about the
# interrupt) arrives after the parent has seen the interrupt (within a poll of 0.05 s), and
# is dropped: the parent says it for the command the user typed.
STDERR_DELAY_S = 0.5
# How long a child has to end after the signal (it got it too: Ctrl-C and a scheduler signal
# the process group) before it is killed: time for the step in flight and a large checkpoint.
INTERRUPT_GRACE_S = 300.0


@contextlib.contextmanager
def reporting_interrupts(line: Callable[[Interrupted], Optional[str]]) -> Iterator[None]:
    """Run the block under :func:`~lambda_det.engine.interrupt.stopping_on_signals`; on
    SIGINT or SIGTERM print ``line(interrupt)`` (unless None) and exit 128 + the signal."""
    try:
        with stopping_on_signals():
            yield
    except Interrupted as interrupt:
        message = line(interrupt)
        if message:
            print(message, file=sys.stderr, flush=True)
        if interrupt.iteration is not None:
            # Every process of a launch stopped after this iteration: none exits before the
            # main one has said so (the launcher ends the others when one exits).
            comm.synchronize()
        raise SystemExit(interrupt.status) from None


def rerun_command(
    tool: Union[str, Sequence[str]],
    argv: Sequence[str],
    add: Sequence[str] = (),
    drop: Sequence[str] = (),
) -> str:
    """``python TOOL ARGV`` for the user to type, with the options ``add`` (when missing) and
    without ``drop`` (e.g. ``--resume`` instead of ``--restart``); ``tool``: a script, or the
    words that start it (:func:`invoked_as`)."""
    words = [word for word in argv if word not in drop]
    words = [option for option in add if option not in words] + words
    start = [tool] if isinstance(tool, str) else list(tool)
    return shlex.join(["python", *start, *words])


def invoked_as(script: str) -> List[str]:
    """How this process's tool was started, for :func:`rerun_command`: ``-m MODULE`` when Python
    ran a lambda_det module (as the demo and the comparison start training: :data:`TRAIN_NET`),
    the path the user gave when they ran ``script`` from another folder, else ``script``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("lambda_det."):
        return ["-m", spec.name]
    return [sys.argv[0] if os.path.basename(sys.argv[0]) == os.path.basename(script) else script]


class _DelayedStderr:
    """A child's stderr copied to ours :data:`STDERR_DELAY_S` late, from a reading thread, so
    that what it writes after a Ctrl-C can be dropped."""

    def __init__(self, pipe):
        self._pipe = pipe
        self._chunks = collections.deque()  # (arrival time, bytes); appended by the thread
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._reader = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._reader.start()

    def _read(self, pipe) -> None:
        for chunk in iter(lambda: pipe.read1(1 << 16), b""):
            self._chunks.append((time.monotonic(), chunk))

    def write(self, delay: float = 0.0) -> None:
        """Write the chunks that arrived at least ``delay`` seconds ago."""
        while self._chunks and self._chunks[0][0] <= time.monotonic() - delay:
            sys.stderr.write(self._decoder.decode(self._chunks.popleft()[1]))
        sys.stderr.flush()

    def finish(self, keep: bool) -> None:
        """Wait for the rest (a descendant that outlives the child may keep the pipe open),
        then write it or drop it."""
        self._reader.join(timeout=5)
        if keep:
            self.write()
        self._chunks.clear()
        if not self._reader.is_alive():
            self._pipe.close()


def run_child(command: Sequence[str]) -> int:
    """Run ``command`` to its end and return its exit status; its stdout goes straight to
    ours, its stderr :data:`STDERR_DELAY_S` late. On Ctrl-C (KeyboardInterrupt, or
    :class:`Interrupted` under :func:`reporting_interrupts`), wait for the child to end (it got
    the signal too; killed after :data:`INTERRUPT_GRACE_S` or at a second signal), drop what
    it wrote to stderr since, and raise the interrupt again."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE)
    stderr = _DelayedStderr(process.stderr)
    try:
        while process.poll() is None:
            stderr.write(delay=STDERR_DELAY_S)
            time.sleep(0.05)
    except KeyboardInterrupt:
        stderr.write(delay=STDERR_DELAY_S / 2)  # written well before the interrupt
        try:
            process.wait(timeout=INTERRUPT_GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            process.kill()
            process.wait()
        stderr.finish(keep=False)
        raise
    stderr.finish(keep=True)
    return process.returncode
