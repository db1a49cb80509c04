"""The log of a training or evaluation run: detectron2's loggers ("detectron2", "fvcore") and
lambda_det's, set up by detectron2's ``setup_logger`` (the console on the main process,
OUTPUT_DIR/log.txt on every process).

log.txt keeps everything. The console shows the run: a long printout (the environment, the
config file, the full config, the model) appears there as its first line and the path of
log.txt, which holds it in full.
"""
import logging
import os
import sys

from detectron2.engine import defaults as engine_defaults
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger

__all__ = ["setup_run_logging", "PRINTOUTS"]

# The first words of the long printouts: detectron2's default_setup logs the first three,
# DefaultTrainer (and lambda_det's LazyConfig trainer) the model.
PRINTOUTS = ("Environment info:", "Contents of args.config_file=", "Running with full config:",
             "Model:")


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
            record = logging.makeLogRecord({**record.__dict__, "args": None,
                                            "msg": f"{first} {lines} lines in {self.log_file}"})
        return self.console.format(record)


def setup_run_logging(cfg) -> None:
    """Set up the loggers of a run of ``cfg`` (a yaml CfgNode or a LazyConfig) before
    detectron2's ``default_setup`` logs into them."""
    output_dir = engine_defaults._try_get_key(cfg, "OUTPUT_DIR", "output_dir", "train.output_dir")
    rank = comm.get_rank()
    # The very calls of default_setup: setup_logger caches its loggers by these arguments, so
    # default_setup gets the loggers set up here rather than adding handlers of its own.
    setup_logger(output_dir, distributed_rank=rank, name="fvcore")
    loggers = [setup_logger(output_dir, distributed_rank=rank),
               setup_logger(output_dir, distributed_rank=rank, name="lambda_det")]
    if not output_dir:  # no log.txt to point at: the console keeps the printouts
        return
    log_file = os.path.join(output_dir, "log.txt")
    for logger in loggers:
        for handler in logger.handlers:
            console = isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout
            if console and not isinstance(handler.formatter, _PrintoutsInLogFile):
                handler.setFormatter(_PrintoutsInLogFile(handler.formatter, log_file))
