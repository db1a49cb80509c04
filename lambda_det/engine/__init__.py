"""Training entry points (tools/train_net.py is a thin script over these)."""
from lambda_det.engine.checkpoint import (
    AtomicCheckpointer, CorruptCheckpointError, StrictCheckpointer, UnsafeCheckpointError,
    load_trained_weights)
from lambda_det.engine.deterministic import DeterministicTrainLoader, SeedEachIteration
from lambda_det.engine.launch import launch
from lambda_det.engine.trainer import (
    Trainer, adapt_norms_to_device, argument_parser, build_cfg, evaluation_weights, load_cfg,
    load_weights_for_evaluation, prepare_output_dir, resolve_config_file, setup_cfg)

__all__ = ["Trainer", "argument_parser", "build_cfg", "load_cfg", "resolve_config_file",
           "setup_cfg", "adapt_norms_to_device", "launch", "prepare_output_dir",
           "evaluation_weights", "load_weights_for_evaluation", "AtomicCheckpointer",
           "StrictCheckpointer", "CorruptCheckpointError", "UnsafeCheckpointError",
           "load_trained_weights", "DeterministicTrainLoader", "SeedEachIteration"]
