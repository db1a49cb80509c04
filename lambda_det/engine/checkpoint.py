"""Checkpoints that are never half-written, and clear errors for broken ones."""
import os
import pickle
import zipfile

import torch

from detectron2.checkpoint import DetectionCheckpointer

__all__ = ["AtomicCheckpointer", "CorruptCheckpointError", "StrictCheckpointer",
           "load_trained_weights"]


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file that cannot be read back (truncated, corrupt, or not a checkpoint)."""


class AtomicCheckpointer(DetectionCheckpointer):
    """``DetectionCheckpointer`` whose files appear only once complete.

    ``save`` writes ``<name>.pth.tmp`` and renames it, then updates ``last_checkpoint`` the same
    way, so a run killed mid-write leaves ``last_checkpoint`` on the previous, complete file.
    Loading a truncated or corrupt file raises :class:`CorruptCheckpointError` naming it.
    Files load with torch's default ``weights_only=True``.
    """

    def save(self, name: str, **kwargs) -> None:
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        for key, obj in self.checkpointables.items():
            data[key] = obj.state_dict()
        data.update(kwargs)
        path = os.path.join(self.save_dir, f"{name}.pth")
        self.logger.info("Saving checkpoint to %s", path)
        with self.path_manager.open(path + ".tmp", "wb") as f:
            torch.save(data, f)
        os.replace(path + ".tmp", path)
        self.tag_last_checkpoint(os.path.basename(path))

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        path = os.path.join(self.save_dir, "last_checkpoint")
        with self.path_manager.open(path + ".tmp", "w") as f:
            f.write(last_filename_basename)
        os.replace(path + ".tmp", path)

    def _load_file(self, filename: str):
        try:
            return super()._load_file(filename)
        except (EOFError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
            if isinstance(error, RuntimeError) and "weights_only" in str(error):
                raise  # readable but unsafe to unpickle: torch's own message says what to do
            raise CorruptCheckpointError(
                f"checkpoint {filename} is truncated or corrupt and cannot be loaded "
                f"({type(error).__name__}: {error})") from error


class StrictCheckpointer(AtomicCheckpointer):
    """Refuses a checkpoint that leaves weights of the model missing or skips mismatched shapes.

    Detectron2 only logs both and goes on with a half-random model, which is what training from
    a backbone checkpoint wants, but evaluating or exporting such a model is useless.
    """

    def _load_model(self, checkpoint):
        incompatible = super()._load_model(checkpoint)
        missing = [key for key in incompatible.missing_keys
                   if not key.endswith("num_batches_tracked")]
        mismatched = [f"{key} {tuple(saved)} vs {tuple(model)}"
                      for key, saved, model in incompatible.incorrect_shapes]
        if missing or mismatched:
            raise ValueError(
                f"checkpoint {self._weights!r} does not fit the model built from the config "
                f"(is it the config it was trained with, overrides included?): "
                f"{len(missing)} missing keys {missing[:5]}, {len(mismatched)} shape mismatches "
                f"(checkpoint vs model) {mismatched[:5]}")
        return incompatible

    def load(self, path: str, *args, **kwargs):
        self._weights = path
        return super().load(path, *args, **kwargs)


def load_trained_weights(model, weights: str) -> None:
    """Load every weight of ``model`` from the checkpoint ``weights`` (a path or a URL).

    Raises:
        ValueError: ``weights`` is empty, or the checkpoint does not fit the model.
        FileNotFoundError: ``weights`` names a local file that does not exist.
    """
    if not weights:
        raise ValueError("MODEL.WEIGHTS is empty: pass the trained checkpoint, e.g. "
                         "MODEL.WEIGHTS output/model_final.pth")
    if "://" not in weights and not os.path.isfile(weights):
        raise FileNotFoundError(f"MODEL.WEIGHTS file {weights!r} does not exist")
    StrictCheckpointer(model).load(weights, checkpointables=[])
