"""Trained models for inference, loaded only through :func:`~lambda_det.engine.load_weights`."""
from typing import Optional

from torch import nn

from detectron2.config import CfgNode
from detectron2.data import MetadataCatalog
from detectron2.data import transforms as T
from detectron2.engine import DefaultPredictor
from detectron2.modeling import build_model
from lambda_det.engine.checkpoint import load_weights

__all__ = ["build_trained_model", "Predictor"]


def build_trained_model(cfg: CfgNode, weights: Optional[str] = None) -> nn.Module:
    """The model of ``cfg`` in eval mode with every weight loaded from ``weights`` (default
    ``cfg.MODEL.WEIGHTS``).

    Raises:
        ValueError: no weights given, or the checkpoint does not fit the model.
        FileNotFoundError: the weights file does not exist.
        UnsafeCheckpointError, CorruptCheckpointError: the file cannot be loaded safely.
    """
    model = build_model(cfg)
    load_weights(model, cfg.MODEL.WEIGHTS if weights is None else weights)
    return model.eval()


class Predictor(DefaultPredictor):
    """detectron2's ``DefaultPredictor`` (one BGR or RGB image in, its predictions out), whose
    weights load safely and completely (:func:`build_trained_model`); detectron2's own loads
    ``.pkl`` files with ``pickle.load`` and a half-fitting checkpoint with a warning."""

    def __init__(self, cfg: CfgNode):  # DefaultPredictor.__init__, but for the loading
        self.cfg = cfg.clone()
        self.model = build_trained_model(self.cfg)
        if len(cfg.DATASETS.TEST):
            self.metadata = MetadataCatalog.get(cfg.DATASETS.TEST[0])
        self.aug = T.ResizeShortestEdge([cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MIN_SIZE_TEST],
                                        cfg.INPUT.MAX_SIZE_TEST)
        self.input_format = cfg.INPUT.FORMAT
        if self.input_format not in ("RGB", "BGR"):
            raise ValueError(f"INPUT.FORMAT must be 'RGB' or 'BGR', got {self.input_format!r}")
