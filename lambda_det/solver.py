"""The learning-rate schedule of the yaml recipes (``SOLVER.*``), as a LazyConfig callable."""

import logging
from typing import Sequence

from fvcore.common.param_scheduler import MultiStepParamScheduler, ParamScheduler

from lambda_det.compat import import_detectron2
from lambda_det.utils.errors import UserError

import_detectron2()  # quietly, and with a helpful error when it is missing

from detectron2.solver import WarmupParamScheduler

__all__ = ["warmup_multistep"]

logger = logging.getLogger(__name__)


def warmup_multistep(
    max_iter: int,
    steps: Sequence[int],
    gamma: float = 0.1,
    warmup_iters: int = 1000,
    warmup_factor: float = 0.001,
    warmup_method: str = "linear",
) -> ParamScheduler:
    """The LR multiplier detectron2 builds from ``SOLVER.LR_SCHEDULER_NAME "WarmupMultiStepLR"``,
    from the same values in iterations: ``max_iter`` (MAX_ITER), ``steps`` (STEPS), ``gamma``,
    ``warmup_iters``, ``warmup_factor``, ``warmup_method``.

    Steps in iterations (not fractions of training) keep a shortened run (``train.max_iter=10``)
    valid: steps at or past ``max_iter`` never take effect and are dropped, with a warning.
    """
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise UserError(f"train.max_iter must be a positive integer, got {max_iter!r}")
    kept = [step for step in steps if step < max_iter]
    if len(kept) != len(steps):
        logger.warning("LR steps %s at or past max_iter %d are dropped", list(steps), max_iter)
    schedule = MultiStepParamScheduler(
        values=[gamma**k for k in range(len(kept) + 1)], milestones=kept, num_updates=max_iter
    )
    return WarmupParamScheduler(
        schedule, warmup_factor, min(warmup_iters / max_iter, 1.0), warmup_method
    )
