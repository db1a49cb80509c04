"""The training loop: detectron2's ``DefaultTrainer`` with safe checkpoints, mixed precision,
deterministic data order, CPU process launch, and the checks made before any process starts
(:mod:`.preflight`). The command lines over it live in :mod:`lambda_det.cli`."""

import lambda_det.modeling  # noqa: F401  (registers the backbones the trainer builds)
from lambda_det.engine.deterministic import DeterministicTrainLoader, SeedEachIteration
from lambda_det.engine.launch import launch
from lambda_det.engine.trainer import Trainer, setup_cfg

__all__ = ["Trainer", "setup_cfg", "launch", "DeterministicTrainLoader", "SeedEachIteration"]
