"""LambdaResNets (LambdaNetworks, Bello 2021, F.2 and Table 19), with torch alone.

:class:`LambdaResNet` needs no detectron2. ``lambda_det.modeling.backbone.LambdaResNetBackbone``
makes it a detectron2 ``Backbone`` (detectron2's norms and frozen norms, ``output_shape``) with
the same parameters and state dict keys.
"""

from typing import Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lambda_det.modeling.blocks import (
    DEFAULT_NORM,
    Bottleneck,
    Norm,
    ResNetRSStem,
    freeze_batch_norms,
    norm_factory,
)
from lambda_det.modeling.mixers import build_mixer_factory, check_mixer_options, mixer_options
from lambda_det.utils.errors import UserError

__all__ = [
    "LambdaResNet",
    "lambda_resnet",
    "DEPTHS",
    "BLOCKS_PER_STAGE",
    "PAPER_LAMBDA_BLOCKS_C4",
    "PAPER_PARAMETERS",
    "resolve_placement",
]

STAGES = ("res2", "res3", "res4", "res5")

# Blocks in c2..c5 (paper Table 19). 26 is not in the paper: a small depth for quick experiments.
BLOCKS_PER_STAGE: Dict[int, Sequence[int]] = {
    26: (2, 2, 2, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
    200: (3, 24, 36, 3),
    270: (4, 29, 53, 4),
    350: (4, 36, 72, 4),
    420: (4, 44, 87, 4),
}
# The depths a LambdaResNet has: the one list of them (configs, timm names and docs follow it).
DEPTHS = tuple(BLOCKS_PER_STAGE)

# 1-based c4 blocks that are lambda blocks in the paper's hybrids (Table 19); all of c5 is lambda.
# With another mixer (MIXER "aft_conv", ...), the same blocks get it.
# Depth 26 (ours) puts its last c4 block there, like LambdaResNet-50 does with its middle one.
PAPER_LAMBDA_BLOCKS_C4: Dict[int, Sequence[int]] = {
    26: (2,),
    50: (3,),
    101: (6, 12, 18),
    152: (5, 10, 15, 20, 25, 30),
    200: (5, 10, 15, 20, 25, 30),
    270: (8, 16, 24, 32, 40, 48),
    350: (10, 20, 30, 40, 50, 60),
    420: (10, 20, 30, 40, 50, 60, 70, 80),
}

# Parameters (millions) of the paper's classifiers (1000 classes; k=16, h=4, u=1, scope 23), by
# (depth, placement, se): Table 12 (ResNet-50, lambda layers in the stages marked L) and Table 13.
PAPER_PARAMETERS: Dict[Tuple[int, str, bool], float] = {
    **{
        (50, placement, False): count
        for placement, count in (
            ("CCCC", 25.6),
            ("LCCC", 25.5),
            ("LLCC", 25.0),
            ("LLLC", 21.7),
            ("LLLL", 15.0),
            ("CLLL", 15.1),
            ("CCLL", 15.4),
            ("CCCL", 18.8),
        )
    },
    (101, "none", False): 44.6,
    (101, "none", True): 63.6,
    (101, "paper", False): 36.9,
    (101, "c4", False): 26.0,
    (152, "none", False): 60.2,
    (152, "none", True): 86.6,
    (152, "paper", False): 51.4,
    (152, "c4", False): 35.1,
}

Placement = Union[str, Mapping[str, Union[str, Sequence[int]]]]


def resolve_placement(depth: int, placement: Placement) -> Dict[str, FrozenSet[int]]:
    """The 1-based blocks of each stage that get the mixer (in the paper: the lambda blocks).

    Args:
        depth: one of ``DEPTHS``.
        placement: "paper" (Table 19 hybrids: the listed c4 blocks and all of c5), "c4" (every
            block of c4 and c5: the paper's "-C4" models), "none" (the ResNet-RS baseline), four
            letters over {C, L} for c2..c5 (Table 12, e.g. "CCLL"), or a mapping from stage name
            ("res2".."res5") to 1-based block indices or "all".
    """
    if depth not in DEPTHS:
        raise UserError(f"depth must be one of {list(DEPTHS)}, got {depth!r}")
    blocks = dict(zip(STAGES, BLOCKS_PER_STAGE[depth]))
    every = {stage: range(1, count + 1) for stage, count in blocks.items()}
    if isinstance(placement, str):  # case-insensitive, like the letters
        letters = placement.upper()
        if letters == "PAPER":
            chosen = {"res4": PAPER_LAMBDA_BLOCKS_C4[depth], "res5": every["res5"]}
        elif letters == "C4":
            chosen = {"res4": every["res4"], "res5": every["res5"]}
        elif letters == "NONE":
            chosen = {}
        elif len(letters) == 4 and set(letters) <= {"C", "L"}:
            chosen = {
                stage: every[stage] for stage, letter in zip(STAGES, letters) if letter == "L"
            }
        else:
            raise UserError(
                f"placement must be 'paper', 'c4', 'none', four letters over C/L for c2..c5 "
                f"(e.g. 'CCLL'), or a mapping of stage to block indices; got {placement!r}"
            )
    elif isinstance(placement, Mapping):
        chosen = {}
        for stage, indices in placement.items():
            if stage not in blocks:
                raise UserError(f"placement stage must be one of {STAGES}, got {stage!r}")
            chosen[stage] = every[stage] if indices == "all" else indices
    else:
        raise UserError(f"placement must be a string or a mapping, got {placement!r}")

    resolved = {stage: frozenset() for stage in STAGES}
    for stage, indices in chosen.items():
        for index in indices:
            if not isinstance(index, int) or not 1 <= index <= blocks[stage]:
                raise UserError(
                    f"placement block {index!r} is past the end of {stage}, which has "
                    f"{blocks[stage]} blocks at depth {depth} (indices are 1-based)"
                )
        resolved[stage] = frozenset(indices)
    return resolved


class LambdaResNet(nn.Module):
    """LambdaResNet / ResNet-RS backbone: stem, four bottleneck stages, optional classifier.

    Outputs ``res2``..``res5`` with strides 4, 8, 16, 32 and 256, 512, 1024, 2048 channels (times
    ``width_multiplier``), ``stem`` (stride 4), and ``linear`` (logits) when ``num_classes`` is set.

    Args:
        depth: one of ``DEPTHS`` (blocks per stage: ``BLOCKS_PER_STAGE``).
        placement: which blocks get the mixer; see :func:`resolve_placement`. The others have
            the 3x3 conv.
        se: squeeze-and-excitation (ratio 0.25) in the conv blocks: the "+SE" baselines.
        num_classes: adds global average pooling and a linear classifier.
        out_features: names of the outputs to return (default: res2..res5, or ["linear"]).
            Without a classifier, the stages after the last one named are not built (a C4
            backbone, ["res4"], has no res5), as in detectron2's ResNet.
        norm: the norm of the whole backbone: "BN", "SyncBN", "FrozenBN" (torchvision's),
            "GN" (gcd(32, channels) groups), "" for none, or a callable (channels -> module or
            None); :class:`~lambda_det.modeling.backbone.LambdaResNetBackbone` reads a name as
            detectron2's ``get_norm`` does.
        freeze_at: detectron2's convention: 0 trains everything, 1 freezes the stem, 2 also
            res2, and so on (no gradients, BatchNorms frozen).
        width_multiplier: scales every width (stem included).
        in_channels: image channels.
        drop_path_rate: stochastic depth with the linear rule of Huang et al. (2016): block i
            of the N blocks (1-based, in order) drops its residual branch with probability
            drop_path_rate * i / N in training. The paper's ImageNet recipe (Table 20) uses 0.1
            for LambdaResNet-152 at 224 to 288 pixels and LambdaResNet-270, 0.2 for 350 and
            420; 0 (default) adds nothing.
        mixer: the name of a registered mixer (:mod:`lambda_det.modeling.mixers`): "lambda"
            (LambdaLayer), "aft_conv" (AFTConv, the Attention Free Transformer's conv form, for
            head-to-head comparisons), ...
        stem: builds the stem from (in_channels, out_channels, norm factory): a module that
            takes the image and returns out_channels at stride 4. Default: ResNet-RS's
            (:class:`~lambda_det.modeling.blocks.ResNetRSStem`), the paper's.
        grad_checkpointing: activation checkpointing in training: each block's activations
            are recomputed in backward instead of kept (torch.utils.checkpoint); the same
            outputs and gradients, BatchNorm statistics updated on the recomputation too.
        **options: the mixer's options, defaults its layer's (see its builder in
            :mod:`lambda_det.modeling.mixers`). "lambda": heads, dim_k, dim_u, scope (None for
            global context), impl, max_size (global context only), share_position_embeddings
            (one relative position embedding for every lambda layer, paper Table 4).
            "aft_conv": heads, window_size.
    """

    # How ``norm`` becomes a factory, and how a frozen stem or block freezes its BatchNorms:
    # with torch alone here; LambdaResNetBackbone puts detectron2's in their place.
    norm_factory = staticmethod(norm_factory)
    freeze_norms = staticmethod(freeze_batch_norms)

    def __init__(
        self,
        depth: int = 50,
        *,
        placement: Placement = "paper",
        se: bool = False,
        num_classes: Optional[int] = None,
        out_features: Optional[List[str]] = None,
        norm: Norm = DEFAULT_NORM,
        freeze_at: int = 0,
        width_multiplier: float = 1.0,
        in_channels: int = 3,
        drop_path_rate: float = 0.0,
        mixer: str = "lambda",
        stem: Callable[[int, int, Norm], nn.Module] = ResNetRSStem,
        grad_checkpointing: bool = False,
        **options,
    ):
        super().__init__()
        check_mixer_options(mixer, options)
        if not width_multiplier > 0:
            raise UserError(f"width_multiplier must be > 0, got {width_multiplier!r}")
        if not 0.0 <= drop_path_rate < 1.0:
            raise UserError(f"drop_path_rate must be in [0, 1), got {drop_path_rate!r}")
        mixer_blocks = resolve_placement(depth, placement)
        self.depth = depth
        self.num_classes = num_classes
        self.grad_checkpointing = grad_checkpointing
        norm = self.norm_factory(norm)
        if "norm" in mixer_options(mixer):
            options = {**options, "norm": norm}  # the mixer's norms are the backbone's

        stem_width = int(64 * width_multiplier)
        self.stem = stem(in_channels, stem_width, norm)
        self._out_feature_channels = {"stem": stem_width}
        self._out_feature_strides = {"stem": 4}
        default_features = ["linear"] if num_classes is not None else list(STAGES)
        self._out_features = list(out_features or default_features)
        # The stages up to the last output, as detectron2's ResNet builds them: a C4 backbone
        # (res4) has no res5, whose parameters would get no gradient (DDP stops on them). The
        # classifier reads res5.
        last_stage = (
            len(STAGES)
            if num_classes is not None
            else max(
                (STAGES.index(name) + 1 for name in self._out_features if name in STAGES), default=0
            )
        )
        self.stage_names = STAGES[:last_stage]

        # Built here, after the stem, and only when a block uses it: a factory may create modules
        # its mixers share (the lambda layers' position embedding), and random init follows
        # construction order.
        placed_mixer = (
            build_mixer_factory(mixer, **options)
            if any(mixer_blocks[name] for name in self.stage_names)
            else None
        )
        conv_mixer = build_mixer_factory("conv")

        channels = stem_width
        total_blocks = sum(BLOCKS_PER_STAGE[depth])
        block_number = 0  # over all stages, for the stochastic depth rule
        for stage_index, (name, count) in enumerate(zip(self.stage_names, BLOCKS_PER_STAGE[depth])):
            width = int(64 * width_multiplier * 2**stage_index)
            blocks = []
            for block_index in range(1, count + 1):
                stride = 2 if block_index == 1 and stage_index > 0 else 1
                is_placed = block_index in mixer_blocks[name]
                block_number += 1
                try:
                    blocks.append(
                        Bottleneck(
                            channels,
                            4 * width,
                            width=width,
                            stride=stride,
                            mixer=placed_mixer if is_placed else conv_mixer,
                            norm=norm,
                            se=se and not is_placed,
                            drop_path=drop_path_rate * block_number / total_blocks,
                        )
                    )
                except ValueError as error:  # e.g. a width the mixer's heads do not divide
                    raise UserError(
                        f"{name} block {block_index} ({mixer!r} mixer, width {width}, "
                        f"width_multiplier={width_multiplier}): {error}"
                    ) from error
                channels = 4 * width
            self.add_module(name, nn.Sequential(*blocks))
            self._out_feature_channels[name] = channels
            self._out_feature_strides[name] = 4 * 2**stage_index

        if num_classes is not None:
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.linear = nn.Linear(channels, num_classes)
        known = list(self._out_feature_channels) + (["linear"] if num_classes is not None else [])
        for feature in self._out_features:
            if feature not in known:
                raise UserError(f"out_features entry {feature!r} is not one of {known}")
        self._init_weights()
        self.freeze(freeze_at)

    def _init_weights(self) -> None:
        """He init for every conv, then each block's own init over it (Bottleneck.init_weights:
        zero gamma on its last norm, its mixer's init), then the classifier's."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                # He init with fan-out, detectron2's (fvcore's c2_msra_fill): the same draws.
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.constant_(module.bias, 0)
        for name in self.stage_names:
            for block in getattr(self, name):
                block.init_weights()
        if self.num_classes is not None:
            nn.init.normal_(self.linear.weight, std=0.01)
            nn.init.zeros_(self.linear.bias)

    def freeze(self, freeze_at: int = 0) -> "LambdaResNet":
        """Freeze the stem (freeze_at >= 1) and the first freeze_at - 1 stages, as detectron2 does.

        Decision: a parameter shared across stages (the lambda layers' shared position embedding)
        is frozen only when every stage that uses it is.
        """
        if not isinstance(freeze_at, int) or not 0 <= freeze_at <= 5:
            raise UserError(f"freeze_at must be an integer in [0, 5], got {freeze_at!r}")
        if freeze_at >= 1:
            self._freeze_block(self.stem)
        for stage_index, name in enumerate(self.stage_names, start=2):
            if freeze_at >= stage_index:
                for block in getattr(self, name):
                    self._freeze_block(block)
        parts = [self.stem] + [getattr(self, name) for name in self.stage_names]
        frozen = {id(parameter) for part in parts[:freeze_at] for parameter in part.parameters()}
        for part in parts[freeze_at:]:
            for parameter in part.parameters():
                if id(parameter) in frozen:  # shared with a frozen part: trains with this one
                    parameter.requires_grad_(True)
        return self

    def _freeze_block(self, block: nn.Module) -> None:
        """No gradients for the block's parameters, its BatchNorms frozen (``freeze_norms``)."""
        for parameter in block.parameters():
            parameter.requires_grad = False
        self.freeze_norms(block)

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        x = checked_images(x)
        outputs: Dict[str, torch.Tensor] = {}
        x = self.stem(x)
        if "stem" in self._out_features:
            outputs["stem"] = x
        # Stage by stage, spelled out: TorchScript can neither getattr a name it computes nor
        # iterate a plain list of modules, and a ModuleList would rename the parameters. A
        # stage that is not built is skipped (hasattr is decided when TorchScript compiles).
        if hasattr(self, "res2"):
            x = self._checkpointed("res2", x) if self._checkpointing() else self.res2(x)
            if "res2" in self._out_features:
                outputs["res2"] = x
        if hasattr(self, "res3"):
            x = self._checkpointed("res3", x) if self._checkpointing() else self.res3(x)
            if "res3" in self._out_features:
                outputs["res3"] = x
        if hasattr(self, "res4"):
            x = self._checkpointed("res4", x) if self._checkpointing() else self.res4(x)
            if "res4" in self._out_features:
                outputs["res4"] = x
        if hasattr(self, "res5"):
            x = self._checkpointed("res5", x) if self._checkpointing() else self.res5(x)
            if "res5" in self._out_features:
                outputs["res5"] = x
        if self.num_classes is not None and "linear" in self._out_features:
            outputs["linear"] = self.linear(torch.flatten(self.avgpool(x), 1))
        return outputs

    def _checkpointing(self) -> bool:
        return self.grad_checkpointing and not torch.jit.is_scripting() and torch.is_grad_enabled()

    @torch.jit.unused
    def _checkpointed(self, stage: str, x: torch.Tensor) -> torch.Tensor:
        """The stage's blocks under activation checkpointing, one block at a time (the RNG
        state is replayed, so stochastic depth drops the same blocks)."""
        for block in getattr(self, stage):
            x = checkpoint(block, x, use_reentrant=False)
        return x


def checked_images(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a ValueError unless it is a (N, C, H, W) batch. torch.fx records the call (see
    ``torch.fx.wrap`` below) rather than the Python check, so a traced model checks too."""
    if x.dim() != 4:
        # The sizes joined by hand: TorchScript cannot format a tuple of a tensor's sizes.
        shape = ", ".join([str(size) for size in x.shape])
        raise ValueError(f"LambdaResNet takes (N, C, H, W) images, got shape ({shape})")
    return x


torch.fx.wrap("checked_images")


def lambda_resnet(depth: int, **kwargs) -> LambdaResNet:
    """Build a LambdaResNet (or, with ``placement="none"``, its ResNet-RS baseline), with torch
    alone; :class:`~lambda_det.modeling.backbone.LambdaResNetBackbone` takes the same arguments
    for detectron2.

    Examples::

        lambda_resnet(152)                                   # LambdaResNet-152 (Table 19 hybrid)
        lambda_resnet(101, placement="none", se=True)        # ResNet-101 + SE baseline
        lambda_resnet(50, placement="CCLL", num_classes=1000)  # Table 12 row

    See :class:`LambdaResNet` for the arguments (keywords only after the depth).
    """
    return LambdaResNet(depth, **kwargs)
