"""Checkpoint files over a long job: a truncated or pickled checkpoint is named, a job killed
mid-write keeps the last checkpoint valid, evaluation loads every weight or refuses.
(From tests/test_reliability.py.)"""

import pickle

import numpy as np
import pytest
import torch
from conftest import tiny_cfg
from detectron2.modeling import build_model

from lambda_det.checkpoint import (
    AtomicCheckpointer,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    WeightsMismatchError,
    load_checkpoint_file,
    load_weights,
)
from lambda_det.checkpoint import checkpointer as checkpoint_module
from lambda_det.checkpoint import evaluation_weights as _evaluation_weights
from lambda_det.engine.run_settings import yaml_run_settings
from lambda_det.modeling import lambda_resnet


def test_truncated_checkpoint_is_named(tmp_path):
    model = lambda_resnet(26, width_multiplier=0.25, scope=3)
    checkpointer = AtomicCheckpointer(model, save_dir=str(tmp_path))
    checkpointer.save("model_0000009", iteration=9)
    path = tmp_path / "model_0000009.pth"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {path} is truncated or corrupt"):
        AtomicCheckpointer(model, save_dir=str(tmp_path)).resume_or_load("", resume=True)


class NotATensor:
    """A pickled object that torch.load(weights_only=True) refuses."""


def test_checkpoint_with_pickled_objects_is_refused_not_called_corrupt(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    model = lambda_resnet(26, width_multiplier=0.25, scope=3)
    path = tmp_path / "pickled.pth"
    torch.save({"model": model.state_dict(), "extra": NotATensor()}, path)
    with pytest.raises(
        UnsafeCheckpointError,
        match=f"checkpoint {path} refers to "
        r"test_checkpoint_files.NotATensor, which "
        r"torch.load\(weights_only=True\) refuses",
    ):
        AtomicCheckpointer(model).load(str(path))


def test_killed_mid_write_keeps_last_checkpoint_valid(tmp_path, monkeypatch):
    model = lambda_resnet(26, width_multiplier=0.25, scope=3)
    checkpointer = AtomicCheckpointer(model, save_dir=str(tmp_path))
    checkpointer.save("model_0000004", iteration=4)

    def killed(data, f):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # the job dies mid-write

    monkeypatch.setattr(checkpoint_module.torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpointer.save("model_0000009", iteration=9)
    monkeypatch.undo()
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000004.pth"
    assert not (tmp_path / "model_0000009.pth").exists()
    assert not list(tmp_path.glob("*.tmp"))  # no full-size leftovers
    loaded = AtomicCheckpointer(model, save_dir=str(tmp_path)).resume_or_load("", resume=True)
    assert loaded["iteration"] == 4


def evaluation_weights(cfg, resume: bool) -> str:
    settings = yaml_run_settings(cfg)
    return _evaluation_weights(settings.output_dir, settings.training.weights, resume)


def test_evaluation_loads_every_weight_or_refuses(tmp_path):
    cfg = tiny_cfg(tmp_path)
    trained = build_model(cfg)
    with pytest.raises(ValueError, match="MODEL.WEIGHTS is empty"):
        evaluation_weights(cfg, resume=False)
    with pytest.raises(
        ValueError, match="MODEL.WEIGHTS is empty and OUTPUT_DIR .* has no last_checkpoint"
    ):
        evaluation_weights(cfg, resume=True)
    AtomicCheckpointer(trained, save_dir=str(tmp_path)).save("model_0000004")
    evaluated = build_model(cfg)
    weights = evaluation_weights(cfg, resume=True)
    assert weights.endswith("model_0000004.pth")
    load_weights(evaluated, weights)
    for loaded, saved in zip(evaluated.state_dict().values(), trained.state_dict().values()):
        assert torch.equal(loaded, saved)
    # A checkpoint without the backbone would give detectron2 a half-random model to evaluate.
    state = {
        key: value for key, value in trained.state_dict().items() if not key.startswith("backbone.")
    }
    torch.save({"model": state}, tmp_path / "heads_only.pth")
    cfg.MODEL.WEIGHTS = str(tmp_path / "heads_only.pth")
    with pytest.raises(WeightsMismatchError, match="does not fit the model .* missing weights"):
        load_weights(build_model(cfg), evaluation_weights(cfg, resume=False))


@pytest.mark.parametrize(
    "content, message",
    [
        (
            {
                "model": {"conv.weight": np.zeros(2)}
            },  # no "__author__": detectron2 reads it as Caffe2's
            r"'model' is of type dict, not a numpy array \(without '__author__' .* "
            r"add '__author__'",
        ),
        ({"conv.weight": np.zeros(2), "epoch": 3}, r"'epoch' is of type int, not a numpy array; a"),
        ({"model": [np.zeros(2)], "__author__": "me"}, r"its 'model' is a list, not a dict of"),
    ],
)
def test_a_pkl_detectron2_cannot_load_is_named_with_the_layouts_it_can(tmp_path, content, message):
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps(content, protocol=2))
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {path}: {message}"):
        load_checkpoint_file(str(path))
    with pytest.raises(
        CorruptCheckpointError,
        match=r"detectron2's \{'model': \{name: numpy "
        r"array\}, '__author__': source\} or "
        r"Caffe2's \{name: numpy array\}",
    ):
        load_checkpoint_file(str(path))


def test_weights_at_a_url_that_cannot_be_downloaded_are_one_error(monkeypatch, caplog):
    """An offline machine: the download fails before anything starts, naming the URL and the
    fix (the .invalid domain never resolves; the socket is refused too, in case of a resolver
    that answers everything)."""
    import socket

    from lambda_det.checkpoint import check_weights

    def no_network(*args, **kwargs):
        raise OSError("no network here")

    monkeypatch.setattr(socket, "create_connection", no_network)
    url = "https://lambda-det.invalid/model_final.pth"
    with pytest.raises(FileNotFoundError) as error:
        check_weights(url)
    message = str(error.value)
    assert message.startswith(f"MODEL.WEIGHTS {url!r} cannot be downloaded")
    assert "MODEL.WEIGHTS path/to/model_final.pth" in message and "\n" not in message
    assert "Failed to download" not in caplog.text  # iopath's own line is held back
