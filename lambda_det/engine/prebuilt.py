"""The model of a one-process run, built once, before launch: the checks before launch read it
(as a copy on the meta device, :meth:`PrebuiltModel.meta_copy`) and the run trains or
evaluates it (:meth:`PrebuiltModel.take`).

A run builds its model after detectron2's ``default_setup`` has seeded the random generators;
a model built before launch must draw the same numbers and leave the run the same random state.
:func:`build_before_launch` seeds as ``default_setup`` will seed rank 0 (the only rank of a
one-process run), builds, and keeps the state of the generators after the build;
:meth:`PrebuiltModel.take` restores that state where the run would have built the model, so the
run's weights, data order and losses are those of a run that builds its own model. What the
build logs is kept and logged there too, into the run's log, which does not exist before launch
(its log.txt would be written before the checks)."""

import contextlib
import copy
import itertools
import logging
import os
import random
from typing import Callable, List, NamedTuple, Optional, Sequence

import numpy as np
import torch
from detectron2.utils.env import seed_all_rng
from torch import nn

__all__ = ["RandomState", "PrebuiltModel", "build_before_launch"]

logger = logging.getLogger(__name__)


class RandomState(NamedTuple):
    """The state of every generator that detectron2's ``seed_all_rng`` seeds."""

    torch_cpu: torch.Tensor
    torch_cuda: Optional[List[torch.Tensor]]  # None while CUDA is not initialised
    numpy: tuple
    python: tuple
    hash_seed: Optional[str]  # PYTHONHASHSEED, for the processes a run starts

    @classmethod
    def capture(cls) -> "RandomState":
        return cls(
            torch.get_rng_state(),
            torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
            np.random.get_state(),
            random.getstate(),
            os.environ.get("PYTHONHASHSEED"),
        )

    def restore(self) -> None:
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)
        np.random.set_state(self.numpy)
        random.setstate(self.python)
        if self.hash_seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = self.hash_seed


class _KeptRecords(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _keeping_logs(kept: _KeptRecords):
    """Every record logged inside goes to ``kept`` instead of the loggers' handlers (their
    levels, which decide what the run's log shows, are applied when the records are logged
    again: :func:`_log_again`). What the code inside sets up (a handler, a logger that stops
    propagating) stays; when it raises, its records are logged at once."""
    root = logging.getLogger()
    named = root.manager.loggerDict.values()  # with placeholders for unnamed parents
    loggers = [root, *(logger for logger in named if isinstance(logger, logging.Logger))]
    saved = [(logger, logger.handlers, logger.propagate) for logger in loggers]
    level = root.level
    for logger in loggers:
        logger.handlers, logger.propagate = [], True
    root.handlers = [kept]
    root.setLevel(logging.DEBUG)
    failed = True
    try:
        yield
        failed = False
    finally:
        for logger, handlers, propagate in saved:
            added = [handler for handler in logger.handlers if handler is not kept]
            logger.handlers = handlers + added
            if logger.propagate:  # as set above; False: set inside
                logger.propagate = propagate
        if root.level == logging.DEBUG:
            root.setLevel(level)
        if failed:
            _log_again(kept.records)
            kept.records = []


def _log_again(records: List[logging.LogRecord]) -> None:
    for record in records:
        origin = logging.getLogger(record.name)
        if origin.isEnabledFor(record.levelno):
            origin.handle(record)


class PrebuiltModel:
    """A model built before launch (:func:`build_before_launch`), the seed it was built with,
    the random state its build left and the records it logged."""

    def __init__(
        self,
        model: nn.Module,
        seed: int,
        random_state: RandomState,
        records: Sequence[logging.LogRecord] = (),
    ):
        self.model = model
        self.seed = seed  # the run's seed
        self.random_state = random_state
        self.records = list(records)

    def meta_copy(self) -> Optional[nn.Module]:
        """The model with its parameters and buffers on the meta device, made without building
        it again or copying a weight: the checks' memory estimates run its forward pass there.
        None for a model that cannot be copied so: one that refuses ``deepcopy`` (a tensor
        computed from parameters, as ``weight_norm`` keeps) or keeps a tensor outside its
        parameters and buffers (it would stay where it is)."""
        memo = {}
        for tensor in itertools.chain(self.model.parameters(), self.model.buffers()):
            meta = torch.empty_like(tensor, device="meta")
            if isinstance(tensor, nn.Parameter):
                meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = meta
        try:
            meta_model = copy.deepcopy(self.model, memo)
        except RuntimeError:  # "Only Tensors created explicitly by the user ... deepcopy"
            return None
        for module in meta_model.modules():
            if any(
                isinstance(value, torch.Tensor) and value.device.type != "meta"
                for value in vars(module).values()
            ):
                return None
        return meta_model

    def nbytes(self) -> int:
        """The bytes of the model's parameters and buffers."""
        tensors = itertools.chain(self.model.parameters(), self.model.buffers())
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)

    def take(self) -> nn.Module:
        """The model, for the run, at the point where the run would have built it: the random
        generators are set to the state the build left, and what the build logged is logged."""
        self.random_state.restore()
        _log_again(self.records)
        self.records = []
        return self.model


def build_before_launch(
    build: Callable[[], nn.Module], seed: int, seed_key: str = "SEED"
) -> PrebuiltModel:
    """``build()`` after seeding every generator with ``seed`` (the config's ``seed_key``, SEED
    or train.seed), as detectron2's ``default_setup`` seeds rank 0. A negative seed ("a new one
    each run") is drawn here (:attr:`PrebuiltModel.seed`), and said in the run's log: the run
    must seed with it too."""
    kept = _KeptRecords()
    with _keeping_logs(kept):
        if seed < 0:
            drawn = int.from_bytes(os.urandom(4), "big") >> 1  # < 2**31, for numpy's seed
            logger.info(
                "%s %d: this run's seed is %d (config.yaml records it)", seed_key, seed, drawn
            )
            seed = drawn
        seed_all_rng(seed)
        model = build()
    return PrebuiltModel(model, seed, RandomState.capture(), kept.records)
