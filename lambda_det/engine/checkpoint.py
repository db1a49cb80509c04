"""Checkpoints that are never half-written, and clear errors for broken ones."""
import os
import pickle
import zipfile

import torch

from detectron2.checkpoint import DetectionCheckpointer
from lambda_det.engine.atomic import atomic_path

__all__ = ["AtomicCheckpointer", "CorruptCheckpointError", "UnsafeCheckpointError",
           "StrictCheckpointer", "check_weights", "load_trained_weights"]


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file that cannot be read back (truncated, corrupt, or not a checkpoint)."""


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A readable checkpoint that holds more than tensors and plain data, which torch's default
    ``weights_only=True`` refuses to unpickle (it could run code)."""


class AtomicCheckpointer(DetectionCheckpointer):
    """``DetectionCheckpointer`` whose files appear only once complete.

    ``save`` writes a temporary file and renames it, then updates ``last_checkpoint`` the same
    way (:func:`~lambda_det.engine.atomic.atomic_path`), so a run killed mid-write leaves
    ``last_checkpoint`` on the previous, complete file.
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
        with atomic_path(path) as temporary, open(temporary, "wb") as f:
            torch.save(data, f)
        self.tag_last_checkpoint(os.path.basename(path))

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        with atomic_path(os.path.join(self.save_dir, "last_checkpoint")) as temporary, \
                open(temporary, "w") as f:
            f.write(last_filename_basename)

    def _load_file(self, filename: str):
        try:
            return super()._load_file(filename)
        except (EOFError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
            if "weights only load failed" in str(error).lower():
                # Decision: no switch loads it here (DESIGN: full unpickling only when the user
                # asks); converting it once, by hand, is that explicit request.
                raise UnsafeCheckpointError(
                    f"checkpoint {filename} holds objects that torch.load(weights_only=True) "
                    f"refuses to unpickle. If you trust its source, keep only its 'model' weights "
                    f"once: python -c \"import torch; c = torch.load({filename!r}, "
                    f"weights_only=False); torch.save({{'model': c['model']}}, 'weights.pth')\" "
                    f"and load weights.pth. torch said: {error}") from error
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


def check_weights(weights: str) -> None:
    """``weights`` names a checkpoint (a path or a URL), or an error says what is missing.

    Raises:
        ValueError: ``weights`` is empty.
        FileNotFoundError: ``weights`` names a local file that does not exist.
    """
    if not weights:
        raise ValueError("MODEL.WEIGHTS is empty: pass the trained checkpoint, e.g. "
                         "MODEL.WEIGHTS output/model_final.pth")
    if "://" not in weights and not os.path.isfile(weights):
        raise FileNotFoundError(f"MODEL.WEIGHTS file {weights!r} does not exist")


def load_trained_weights(model, weights: str) -> None:
    """Load every weight of ``model`` from the checkpoint ``weights`` (a path or a URL).

    Raises:
        ValueError: ``weights`` is empty, or the checkpoint does not fit the model.
        FileNotFoundError: ``weights`` names a local file that does not exist.
    """
    check_weights(weights)
    StrictCheckpointer(model).load(weights, checkpointables=[])
