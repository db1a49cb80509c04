"""What the layer mode times, on which feature maps, and the useful FLOPs it credits.

Sizes come from the layers' own constructor defaults (:class:`~lambda_det.layers.LambdaLayer`,
:class:`~lambda_det.layers.AFTConv`), so the benchmark times the layers a LambdaResNet builds.
timm and lambda-networks are imported only when their candidates are built.
"""

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.harness import Candidate
from lambda_det.layers import (
    IMPLEMENTATIONS,
    AFTConv,
    AFTFull,
    AFTLocal,
    AFTSimple,
    LambdaLayer,
    constructor_defaults,
)
from lambda_det.layers.lambda_conv import TiledTuning
from lambda_det.utils.errors import UserError

SHAPES = {  # name: (H, W, channels)
    "c4_1024": (64, 64, 256),  # stage c4 (stride 16) of a 1024 x 1024 detection input
    "c5_1024": (32, 32, 512),  # stage c5 (stride 32) of a 1024 x 1024 detection input
    "c4_224": (14, 14, 256),  # stage c4 of a 224 x 224 ImageNet input
    "c5_224": (7, 7, 512),  # stage c5 of a 224 x 224 ImageNet input
}
TIMM, LUCIDRAINS = "timm LambdaLayer", "lucidrains LambdaLayer"


_LAMBDA = constructor_defaults(LambdaLayer)
HEADS, DIM_K, DIM_U, SCOPE = (_LAMBDA[name] for name in ("heads", "dim_k", "dim_u", "scope"))
_AFT_CONV = constructor_defaults(AFTConv)
AFT_HEADS, AFT_WINDOW = _AFT_CONV["heads"], _AFT_CONV["window_size"]


class GlobalSelfAttention(nn.Module):
    """Multi-head self-attention over all H x W positions (no position encoding)."""

    def __init__(self, channels: int, heads: int = HEADS, fused: bool = False):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.qkv = nn.Conv2d(channels, 3 * channels, 1, bias=False)
        self.proj = nn.Conv2d(channels, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        qkv = self.qkv(x).reshape(batch, 3, self.heads, channels // self.heads, height * width)
        q, k, v = qkv.transpose(-1, -2).unbind(1)  # b heads n d
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v)  # b heads n d
        else:
            attention = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).softmax(-1)  # b heads n n
            out = attention @ v  # b heads n d
        return self.proj(out.transpose(-1, -2).reshape(batch, channels, height, width))


def _timm_layer(channels: int) -> nn.Module:
    from timm.layers.lambda_layer import LambdaLayer as TimmLambdaLayer

    return TimmLambdaLayer(channels, num_heads=HEADS, dim_head=DIM_K, r=SCOPE)


def _lucidrains_layer(channels: int) -> nn.Module:
    from lambda_networks import LambdaLayer as LucidrainsLambdaLayer

    return LucidrainsLambdaLayer(channels, dim_k=DIM_K, r=SCOPE, heads=HEADS, dim_u=DIM_U)


def layer_candidates(
    height: int,
    width: int,
    channels: int,
    batch: int,
    cap_bytes: float,
    only: Optional[Sequence[str]] = None,
    tile: Tuple[int, ...] = (),
) -> List[Candidate]:
    """Every candidate for a (batch, channels, height, width) input, in table order.

    Args:
        cap_bytes: candidates whose n x n tensors would need more are skipped (with the reason).
        only: keep the candidates whose name contains one of these words (None: all).
        tile: query tile of lambda_det's "tiled" impl (() for its default).
    """
    n = height * width
    dim_v = channels // HEADS
    tuning = TiledTuning(tile=tuple(tile))
    candidates = []
    for impl in IMPLEMENTATIONS:
        skip = None
        if impl == "einsum":
            # E (k u n m) and its gradient, plus the (b n k v) position lambdas.
            need = 4 * (2 * DIM_K * DIM_U * n * n + 2 * batch * n * DIM_K * dim_v)
            if need > cap_bytes:
                skip = f"too large: ~{need / 2**30:.1f} GiB for E > cap"
        candidates.append(
            Candidate(
                f"lambda_det {impl}",
                lambda impl=impl: LambdaLayer(channels, impl=impl, tuning=tuning),
                skip,
                lambda_impl=True,
            )
        )
    candidates.append(Candidate(TIMM, lambda: _timm_layer(channels), lambda_impl=True))
    candidates.append(Candidate(LUCIDRAINS, lambda: _lucidrains_layer(channels), lambda_impl=True))
    candidates.append(
        Candidate("conv 3x3", lambda: nn.Conv2d(channels, channels, 3, padding=1, bias=False))
    )
    # The Attention Free Transformer's mixers: AFT-conv as the backbone builds it and with the
    # lambda layer's scope; AFT-local with that window and AFT-full mix through one n x n matrix.
    size = max(height, width)
    candidates += [
        Candidate(f"AFT-conv h={AFT_HEADS} s={AFT_WINDOW}", lambda: AFTConv(channels)),
        Candidate(
            f"AFT-conv h={AFT_HEADS} s={SCOPE}", lambda: AFTConv(channels, window_size=SCOPE)
        ),
        Candidate("AFT-simple", lambda: AFTSimple(channels)),
        Candidate(
            f"AFT-local s={SCOPE}", lambda: AFTLocal(channels, window_size=SCOPE, max_size=size)
        ),
        Candidate("AFT-full", lambda: AFTFull(channels, max_size=size)),
    ]
    attention_bytes = 3 * 4 * batch * HEADS * n * n  # logits, probabilities, their gradient
    candidates.append(
        Candidate(
            "self-attention explicit",
            lambda: GlobalSelfAttention(channels),
            f"too large: ~{attention_bytes / 2**30:.1f} GiB for the n x n matrix > cap"
            if attention_bytes > cap_bytes
            else None,
        )
    )
    candidates.append(
        Candidate("self-attention sdpa", lambda: GlobalSelfAttention(channels, fused=True))
    )
    if only:
        names = [c.name for c in candidates]
        candidates = [c for c in candidates if any(word in c.name for word in only)]
        if not candidates:
            raise UserError(f"--only {list(only)} matches none of the candidates {names}")
    return candidates


def useful_flops(height: int, width: int, channels: int, batch: int) -> float:
    """Forward + backward r x r window FLOPs of the paper's lambda convolution (3x forward)."""
    window = min(SCOPE, 2 * height - 1) * min(SCOPE, 2 * width - 1)
    return 3 * 2 * batch * height * width * DIM_K * (channels // HEADS) * DIM_U * window
