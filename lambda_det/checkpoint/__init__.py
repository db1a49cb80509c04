"""Checkpoints and weights: loaded without executing code whatever their suffix (a restricted
unpickler for .pkl, ``weights_only`` for torch files), written atomically, and the
``last_checkpoint`` pointer that ``--resume`` follows."""

from lambda_det.checkpoint.checkpointer import (
    AtomicCheckpointer,
    CorruptCheckpointError,
    RestrictedUnpickler,
    UnsafeCheckpointError,
    WeightsMismatchError,
    check_weights,
    checkpoint_to_resume,
    counted_weights,
    evaluation_weights,
    last_checkpoint,
    load_checkpoint_file,
    load_weights,
)

__all__ = [
    "AtomicCheckpointer",
    "CorruptCheckpointError",
    "UnsafeCheckpointError",
    "RestrictedUnpickler",
    "WeightsMismatchError",
    "load_checkpoint_file",
    "check_weights",
    "load_weights",
    "last_checkpoint",
    "checkpoint_to_resume",
    "evaluation_weights",
    "counted_weights",
]
