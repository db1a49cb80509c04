"""The log of a training or evaluation run: detectron2's loggers ("detectron2", "fvcore") and
lambda_det's, set up by detectron2's ``setup_logger`` (the console on the main process,
OUTPUT_DIR/log.txt on every process).

log.txt keeps everything. The console shows the run: a long printout (the environment, the
config file, the full config, the model) appears there as its first line and the path of
log.txt, which holds it in full.
"""

import datetime
import json
import logging
import os
import sys
import time
from typing import Callable, List, Optional

from detectron2.config import CfgNode
from detectron2.engine import HookBase
from detectron2.engine import defaults as engine_defaults
from detectron2.engine.hooks import PeriodicWriter
from detectron2.utils import comm
from detectron2.utils.events import CommonMetricPrinter, EventWriter, JSONWriter, get_event_storage
from detectron2.utils.logger import setup_logger
from omegaconf import OmegaConf

from lambda_det.compat.internals import (
    periodic_writer_writers,
    registered_hooks,
    reopened_json_writer,
)
from lambda_det.utils.atomic import atomic_path

__all__ = [
    "setup_run_logging",
    "PRINTOUTS",
    "MetricsWriter",
    "ProgressPrinter",
    "ExpectedTime",
    "run_writers",
    "resume_metrics",
]

logger = logging.getLogger(__name__)

# The first words of the long printouts: detectron2's default_setup logs the first three,
# DefaultTrainer (and lambda_det's LazyConfig trainer) the model.
PRINTOUTS = (
    "Environment info:",
    "Contents of args.config_file=",
    "Running with full config:",
    "Model:",
)


class _PrintoutsInLogFile(logging.Formatter):
    """The console's formatter, with a long printout cut to its first line and a pointer to
    the log file. The record itself is left as it is: the log file's handler formats it too."""

    def __init__(self, console: logging.Formatter, log_file: str):
        super().__init__()
        self.console, self.log_file = console, log_file

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        first, newline, rest = message.partition("\n")
        if newline and message.startswith(PRINTOUTS):
            lines = rest.count("\n") + 1
            record = logging.makeLogRecord(
                {
                    **record.__dict__,
                    "args": None,
                    "msg": f"{first} {lines} lines in {self.log_file}",
                }
            )
        return self.console.format(record)


_MISSING = object()  # for OmegaConf.select: a key set to None is found


def run_output_dir(cfg) -> Optional[str]:
    """The output folder of a run of ``cfg``, where detectron2's ``default_setup`` reads it: a
    yaml CfgNode's OUTPUT_DIR, a LazyConfig's ``output_dir`` or else ``train.output_dir``."""
    if isinstance(cfg, CfgNode):
        return cfg.get("OUTPUT_DIR")
    for key in ("output_dir", "train.output_dir"):
        value = OmegaConf.select(cfg, key, default=_MISSING)
        if value is not _MISSING:
            return value
    return None


def setup_run_logging(cfg) -> None:
    """Set up the loggers of a run of ``cfg`` (a yaml CfgNode or a LazyConfig) before
    detectron2's ``default_setup`` logs into them."""
    output_dir = run_output_dir(cfg)
    rank = comm.get_rank()
    # The very calls of default_setup: setup_logger caches its loggers by these arguments, so
    # default_setup gets the loggers set up here rather than adding handlers of its own.
    setup_logger(output_dir, distributed_rank=rank, name="fvcore")
    loggers = [
        setup_logger(output_dir, distributed_rank=rank),
        setup_logger(output_dir, distributed_rank=rank, name="lambda_det"),
    ]
    if not output_dir:  # no log.txt to point at: the console keeps the printouts
        return
    log_file = os.path.join(output_dir, "log.txt")
    for logger in loggers:
        for handler in logger.handlers:
            console = isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout
            if console and not isinstance(handler.formatter, _PrintoutsInLogFile):
                handler.setFormatter(_PrintoutsInLogFile(handler.formatter, log_file))


class MetricsWriter(JSONWriter):
    """Detectron2's ``JSONWriter`` (OUTPUT_DIR/metrics.json, one record per line), which a
    resumed run can cut back to the checkpoint it continues from (:meth:`drop_after`)."""

    def __init__(self, json_file: str, window_size: int = 20):
        super().__init__(json_file, window_size)
        self.json_file = json_file

    def drop_after(self, iteration: int) -> None:
        """Rewrite the file (atomically) without the records of iterations after
        ``iteration`` and lines that are not records (one cut short by a killed run): the
        resumed run trains those iterations again and writes their records anew. Logs how
        many lines went."""
        with reopened_json_writer(self, self.json_file):
            with open(self.json_file) as f:
                lines = f.read().splitlines()
            kept = [line for line in lines if -1 < _iteration(line) <= iteration]
            if len(kept) < len(lines):
                with atomic_path(self.json_file) as temporary, open(temporary, "w") as f:
                    f.writelines(line + "\n" for line in kept)
                logger.info(
                    "Resuming after iteration %d: dropped the %d last lines of %s (records "
                    "of the iterations this run trains again)",
                    iteration,
                    len(lines) - len(kept),
                    self.json_file,
                )


def _iteration(line: str):
    """The iteration of a metrics.json record, -1 for a line that is not one."""
    try:
        record = json.loads(line)
    except ValueError:
        return -1
    value = record.get("iteration") if isinstance(record, dict) else None
    return value if isinstance(value, int) else -1


class ProgressPrinter(CommonMetricPrinter):
    """Detectron2's console line of training progress, printed once per iteration: a run
    stopped after an iteration that was printed (Ctrl-C, a failed save) writes again in
    ``after_train``, where detectron2's printer would divide by zero in its ETA."""

    _printed = None

    def write(self):
        iteration = get_event_storage().iter
        if iteration != self._printed:
            self._printed = iteration
            super().write()


class ExpectedTime(HookBase):
    """One console line with the run's expected training time, from its own speed: the time of
    ``measured`` iterations after the first ``skipped`` of this process (which build caches and
    start the data loader workers), times the iterations left. Reads the clock only.

    With ``sizes`` (the training and test sizes and their keys, given on the CPU, where a
    stock config's 800 to 1333 px take minutes an iteration), a first line after the first
    iteration says how long it took at those sizes and which keys lower them."""

    def __init__(
        self,
        skipped: int = 10,
        measured: int = 20,
        clock: Callable[[], float] = time.perf_counter,
        sizes: Optional[str] = None,
    ):
        self.skipped, self.measured, self.clock, self.sizes = skipped, measured, clock, sizes
        self._start = self._first = None

    def before_step(self):
        if self.sizes and self.trainer.iter == self.trainer.start_iter:
            self._first = self.clock()

    def after_step(self):
        done = self.trainer.iter + 1 - self.trainer.start_iter  # iterations of this process
        if done == 1 and self._first is not None:
            logger.info(
                f"on the CPU at {self.sizes}: the first iteration took "
                f"{self.clock() - self._first:.1f} s, so expect about that per iteration "
                f"(lower those keys for a faster run)"
            )
        if done == self.skipped:
            self._start = self.clock()
        elif done == self.skipped + self.measured and self._start is not None:
            logger.info(self.line(self.clock() - self._start))

    def line(self, seconds: float) -> str:
        per_iteration = seconds / self.measured
        left = self.trainer.max_iter - self.trainer.iter - 1
        first = self.trainer.start_iter + self.skipped  # as detectron2's "iter:" counts
        return (
            f"expected training time: {_clock(per_iteration * left)} more for the {left} "
            f"iterations left ({per_iteration:.2f} s each over iterations {first}-"
            f"{first + self.measured - 1}), then the evaluation"
        )


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


def run_writers(output_dir: str, max_iter: int) -> List[EventWriter]:
    """Detectron2's ``default_writers``, its ``JSONWriter`` a :class:`MetricsWriter` and its
    ``CommonMetricPrinter`` a :class:`ProgressPrinter`."""
    writers = engine_defaults.default_writers(output_dir, max_iter)
    for index, writer in enumerate(writers):
        if type(writer) is JSONWriter:
            writer.close()
            writers[index] = MetricsWriter(os.path.join(output_dir, "metrics.json"))
        elif type(writer) is CommonMetricPrinter:
            writers[index] = ProgressPrinter(max_iter)
    return writers


def resume_metrics(trainer, iteration: int) -> None:
    """On a run resumed after ``iteration``: its metrics.json (of ``trainer``'s writers) without
    later records (:meth:`MetricsWriter.drop_after`)."""
    for hook in registered_hooks(trainer):
        if isinstance(hook, PeriodicWriter):
            for writer in periodic_writer_writers(hook):
                if isinstance(writer, MetricsWriter):
                    writer.drop_after(iteration)
