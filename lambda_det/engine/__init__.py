"""Training, evaluation and checkpoints (tools/train_net.py is a thin script over these)."""
import lambda_det.modeling  # noqa: F401  (registers the backbones the trainer builds)
from lambda_det.engine.checkpoint import (
    AtomicCheckpointer, CorruptCheckpointError, UnsafeCheckpointError, WeightsMismatchError,
    check_weights, load_checkpoint_file, load_weights)
from lambda_det.engine.deterministic import DeterministicTrainLoader, SeedEachIteration
from lambda_det.engine.launch import launch
from lambda_det.engine.output_dir import (
    OutputDirBusyError, OutputDirLock, prepare_output_dir)
from lambda_det.engine.predictor import Predictor, build_trained_model
from lambda_det.engine.trainer import Trainer, evaluation_weights, setup_cfg

__all__ = ["Trainer", "setup_cfg", "launch", "prepare_output_dir", "OutputDirLock",
           "OutputDirBusyError", "evaluation_weights", "AtomicCheckpointer",
           "CorruptCheckpointError", "UnsafeCheckpointError", "WeightsMismatchError",
           "check_weights", "load_checkpoint_file", "load_weights", "DeterministicTrainLoader",
           "SeedEachIteration", "Predictor", "build_trained_model"]
