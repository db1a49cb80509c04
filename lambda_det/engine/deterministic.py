"""Training whose every iteration is a function of (seed, iteration): exact resume, and the same
batches whatever the number of processes.

Detectron2's train loader restarts its sampler and its workers' random state on resume, and ROI
sampling draws from the global torch RNG, so a resumed run drifts from an uninterrupted one. With
``DATALOADER.DETERMINISTIC`` (and ``SEED >= 0``):

* image j of the global batch of iteration i is stream position ``p = i * B + j`` of a shuffled
  stream (one permutation per epoch, from the seed), mapped with numpy/random seeded from (seed, p);
  process r of w takes positions ``r * B / w ... (r + 1) * B / w - 1``;
* before each step, torch's, numpy's and Python's RNGs are seeded from (seed, i, rank).

A checkpoint holds the model, optimizer, scheduler and iteration, so resuming at i reproduces
iteration i bit for bit on the CPU. The loader maps in the training process (no workers).

It replaces detectron2's sampler, so ``DATALOADER.SAMPLER_TRAIN`` (e.g. repeat-factor sampling)
and ``ASPECT_RATIO_GROUPING`` do not apply: every image is drawn uniformly. "The same batches"
holds for a fixed ``SOLVER.IMS_PER_BATCH``; with ``REFERENCE_WORLD_SIZE`` set, detectron2
rescales the batch with the number of processes, and so the batches.
"""

import copy
import random
from typing import Callable, List, Sequence

import numpy as np
import torch
from detectron2.engine import HookBase
from detectron2.utils import comm

from lambda_det.utils.errors import UserError

__all__ = ["DeterministicTrainLoader", "SeedEachIteration", "stream_seed"]


def stream_seed(*parts: int) -> int:
    """A 32-bit seed mixed from integers (numpy's SeedSequence hashing)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


class DeterministicTrainLoader:
    """Infinite iterable of this process's share of each global batch, from ``start_iteration``.

    Set ``start_iteration`` before the first ``next()`` (the trainer does it on resume): the
    generator reads it when it starts.
    """

    def __init__(
        self,
        dataset: Sequence[dict],
        mapper: Callable[[dict], dict],
        total_batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ):
        if total_batch_size % world_size:
            raise UserError(
                f"SOLVER.IMS_PER_BATCH={total_batch_size} is not divisible by the "
                f"{world_size} processes"
            )
        if len(dataset) == 0:
            raise UserError("the training dataset is empty")
        self.dataset = dataset
        self.mapper = mapper
        self.total_batch_size = total_batch_size
        self.local_batch_size = total_batch_size // world_size
        self.seed = seed
        self.rank = rank
        self.start_iteration = 0
        self._epoch_order = (-1, None)

    def _index(self, position: int) -> int:
        epoch, offset = divmod(position, len(self.dataset))
        if self._epoch_order[0] != epoch:
            generator = torch.Generator().manual_seed(stream_seed(self.seed, epoch))
            self._epoch_order = (epoch, torch.randperm(len(self.dataset), generator=generator))
        return int(self._epoch_order[1][offset])

    def load(self, position: int) -> dict:
        """Stream position ``position``, mapped with augmentation randomness fixed by it."""
        seed = stream_seed(self.seed, position, 1)
        np.random.seed(seed)
        random.seed(seed)
        return self.mapper(copy.deepcopy(self.dataset[self._index(position)]))

    def __iter__(self):
        iteration = self.start_iteration
        while True:
            first = iteration * self.total_batch_size + self.rank * self.local_batch_size
            yield [self.load(p) for p in range(first, first + self.local_batch_size)]
            iteration += 1

    def batches(self, start: int, count: int) -> List[List[dict]]:
        """Batches ``start .. start + count - 1`` (for tests and inspection)."""
        self.start_iteration = start
        iterator = iter(self)
        return [next(iterator) for _ in range(count)]


class SeedEachIteration(HookBase):
    """Seeds torch, numpy and random from (seed, iteration, rank) before every step."""

    def __init__(self, seed: int):
        self.seed = seed

    def before_step(self):
        seed = stream_seed(self.seed, self.trainer.iter, comm.get_rank(), 2)
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
