"""The shared core: lambda layers, their position embeddings, and AFT mixers.

Everything in lambda_det that models long-range interactions imports it from here. It needs torch
alone (no detectron2), so it works in any PyTorch project.
"""

from lambda_det.layers._common import constructor_defaults
from lambda_det.layers.aft import AFTConv, AFTFull, AFTLocal, AFTSimple, aft_conv_mix, aft_mix
from lambda_det.layers.flops import eager_impls, flop_handles
from lambda_det.layers.lambda_conv import TiledTuning
from lambda_det.layers.lambda_layer import (
    CONV_MAX_POSITIONS_CUDA,
    EINSUM_MAX_POSITIONS,
    IMPLEMENTATIONS,
    LambdaLayer,
)
from lambda_det.layers.position_embedding import RelativePositionEmbedding

__all__ = [
    "LambdaLayer",
    "RelativePositionEmbedding",
    "TiledTuning",
    "IMPLEMENTATIONS",
    "EINSUM_MAX_POSITIONS",
    "CONV_MAX_POSITIONS_CUDA",
]
__all__ += ["constructor_defaults"]
__all__ += ["AFTFull", "AFTLocal", "AFTSimple", "AFTConv", "aft_mix", "aft_conv_mix"]
__all__ += ["flop_handles", "eager_impls"]
