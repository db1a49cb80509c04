"""ResNet-RS building blocks; the bottleneck's spatial mixer is a plug-in (see ``mixers.py``).

ResNet-RS (Bello et al. 2021) is the base of LambdaResNets (LambdaNetworks paper, F.2): ResNet-v1
bottlenecks with the ResNet-D shortcut, a stem of 3x3 convs whose max-pool is replaced by a strided
3x3 conv, the last BN gamma of each bottleneck initialised to zero, and squeeze-and-excitation only
in the "+SE" baselines.

They need torch alone: a norm is a name of :data:`NORMS` or a callable (the detectron2 adapter,
:class:`~lambda_det.modeling.backbone.LambdaResNetBackbone`, passes detectron2's).
"""

import math
from typing import Callable, Dict, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import FrozenBatchNorm2d, StochasticDepth

from lambda_det.compat import torch_features
from lambda_det.utils.errors import UserError

__all__ = [
    "ResNetRSStem",
    "Bottleneck",
    "ShortcutPool",
    "SqueezeExcite",
    "ConvNorm",
    "make_norm",
    "group_norm",
    "norm_factory",
    "freeze_batch_norms",
    "NORMS",
    "Norm",
    "NormFactory",
    "MixerFactory",
    "DEFAULT_NORM",
]

# (in_channels, out_channels, stride) -> the spatial mixer of one block; see mixers.py.
MixerFactory = Callable[[int, int, int], nn.Module]
# channels -> the norm of that many channels, or None for none.
NormFactory = Callable[[int], Optional[nn.Module]]
Norm = Union[str, NormFactory, None]
# The norm of a backbone built outside a config (detectron2's name for it); a config's is
# MODEL.LAMBDA_RESNET.NORM, or MODEL.RESNETS.NORM.
DEFAULT_NORM = "BN"


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with gcd(32, channels) groups.

    Decision: detectron2's "GN" fixes 32 groups, but a lambda layer's value channels (width /
    heads * u) and narrow test-size backbones can have fewer channels than that.
    """
    return nn.GroupNorm(math.gcd(32, channels), channels)


# The norms a name gives with torch alone (detectron2's names for them).
NORMS: Dict[str, NormFactory] = {
    "BN": nn.BatchNorm2d,
    "SyncBN": nn.SyncBatchNorm,
    "FrozenBN": FrozenBatchNorm2d,
    "GN": group_norm,
}


def _no_norm(channels: int) -> None:
    return None


def norm_factory(norm: Norm) -> NormFactory:
    """The factory of ``norm``: a callable as it is, a name of :data:`NORMS`, or "" (or None)
    for no norm."""
    if callable(norm):
        return norm
    if norm is None or norm == "":
        return _no_norm
    if norm not in NORMS:
        raise UserError(
            f'norm must be one of {list(NORMS)}, "" for none, or a callable '
            f"(channels -> module); got {norm!r} (LambdaResNetBackbone, the "
            f"detectron2 backbone, takes detectron2's norm names too)"
        )
    return NORMS[norm]


def make_norm(norm: Norm, channels: int) -> Optional[nn.Module]:
    """The norm of ``channels`` channels that ``norm`` (see :func:`norm_factory`) makes."""
    return norm_factory(norm)(channels)


def freeze_batch_norms(module: nn.Module) -> nn.Module:
    """``module`` with each (affine) BatchNorm in it replaced, in place, by torchvision's
    ``FrozenBatchNorm2d`` holding its statistics and affine parameters; for a BatchNorm itself,
    the replacement."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        frozen = FrozenBatchNorm2d(module.num_features, eps=module.eps)
        for name in ("weight", "bias", "running_mean", "running_var"):
            if getattr(module, name) is not None:
                setattr(frozen, name, getattr(module, name).detach().clone())
        return frozen
    for name, child in module.named_children():
        replacement = freeze_batch_norms(child)
        if replacement is not child:
            module.add_module(name, replacement)
    return module


class ConvNorm(nn.Conv2d):
    """A convolution followed by its norm (None: none): detectron2's ``Conv2d`` with a ``norm``,
    with the same parameter names and math.

    Decision: detectron2's ``Conv2d.forward`` branches in Python on ``x.numel()``, which
    torch.fx cannot trace; this one has no branch on the input.
    """

    def __init__(self, *args, norm: Optional[nn.Module] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._conv_forward(x, self.weight, self.bias)
        return x if self.norm is None else self.norm(x)


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation on the bottleneck output; squeeze to ``ratio`` of its channels.

    With ratio 0.25 this is what ResNet-RS's "+SE" baselines use: for ResNet-101 it adds 19M
    parameters, matching the paper's Table 13 (44.6M -> 63.6M).
    """

    def __init__(self, channels: int, ratio: float = 0.25):
        super().__init__()
        squeezed = max(1, int(channels * ratio))
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.mean(dim=(2, 3), keepdim=True)  # b c 1 1
        scale = self.expand(F.relu(self.reduce(scale)))
        return x * torch.sigmoid(scale)


class ShortcutPool(nn.AvgPool2d):
    """ResNet-D's shortcut pool: 2x2 average with stride 2; at an odd border the last window
    averages the positions it has (ceil_mode, count_include_pad=False).

    Decision: under torch.export the same numbers come from zero padding by one and a divisor
    map, because ceil_mode's output size check is a guard (always true) that named ``Dim``
    ranges reject. In float arithmetic it is the same: the window sums add the same values
    (zeros change nothing), and sum / 4 / (count / 4) divides by powers of two only.
    """

    def __init__(self):
        super().__init__(2, stride=2, ceil_mode=True, count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():
            if torch_features.is_exporting():
                pad = [0, 1, 0, 1]
                inside = F.avg_pool2d(F.pad(torch.ones_like(x[:1, :1]), pad), 2)  # count / 4
                return F.avg_pool2d(F.pad(x, pad), 2) / inside
        return F.avg_pool2d(x, 2, 2, 0, ceil_mode=True, count_include_pad=False)


class ResNetRSStem(nn.Module):
    """Three 3x3 convs (stride 2, 1, 1), then a strided 3x3 conv in place of the max-pool: stride 4.

    ``norm``: see :func:`norm_factory`.
    """

    def __init__(self, in_channels: int = 3, out_channels: int = 64, norm: Norm = DEFAULT_NORM):
        half = out_channels // 2
        super().__init__()
        widths = [
            (in_channels, half, 2),
            (half, half, 1),
            (half, out_channels, 1),
            (out_channels, out_channels, 2),
        ]
        self.convs = nn.ModuleList(
            ConvNorm(cin, cout, 3, stride=stride, padding=1, bias=False, norm=make_norm(norm, cout))
            for cin, cout, stride in widths
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.relu(conv(x))
        return x


class Bottleneck(nn.Module):
    """1x1 reduce, spatial mixer, 1x1 expand (+SE), plus the ResNet-D shortcut.

    Args:
        in_channels, out_channels: block input and output channels (output = 4 * width).
        width: bottleneck width, the mixer's channels.
        stride: 1 or 2, applied in the mixer (ResNet v1.5).
        mixer: makes the mixer, ``mixer(width, width, stride)``: a factory from
            :func:`lambda_det.modeling.mixers.build_mixer_factory`, e.g. the 3x3 conv ("conv"), a
            lambda layer ("lambda") or AFT-conv ("aft_conv").
        norm: every norm in the block: a name of :data:`NORMS` or a callable (channels ->
            module or None; see :func:`norm_factory`).
        se: add squeeze-and-excitation (ratio 0.25) after the expanding conv.
        drop_path: stochastic depth (Huang et al. 2016): in training, the residual branch of
            each sample is dropped with this probability and scaled by 1 / (1 - drop_path)
            when kept; the identity in evaluation.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        width: int,
        mixer: MixerFactory,
        stride: int = 1,
        norm: Norm = DEFAULT_NORM,
        se: bool = False,
        drop_path: float = 0.0,
    ):
        super().__init__()
        if in_channels != out_channels or stride != 1:
            # ResNet-D: average-pool first, so the 1x1 projection sees every input position.
            pool = ShortcutPool() if stride != 1 else nn.Identity()
            self.shortcut = nn.Sequential(
                pool,
                ConvNorm(
                    in_channels, out_channels, 1, bias=False, norm=make_norm(norm, out_channels)
                ),
            )
        else:
            self.shortcut = None
        self.conv1 = ConvNorm(in_channels, width, 1, bias=False, norm=make_norm(norm, width))
        self.mixer = mixer(width, width, stride)
        self.mixer_norm = make_norm(norm, width) or nn.Identity()
        self.conv3 = ConvNorm(
            width, out_channels, 1, bias=False, norm=make_norm(norm, out_channels)
        )
        self.se = SqueezeExcite(out_channels) if se else None
        if not 0.0 <= drop_path < 1.0:
            raise ValueError(f"drop_path must be in [0, 1), got {drop_path!r}")
        # None at 0: no module, no random draw, the same block as without stochastic depth.
        self.drop_path = StochasticDepth(drop_path, "row") if drop_path else None

    def init_weights(self) -> None:
        """The block's own init, applied over the backbone's He init of every conv.

        The last norm's gamma starts at zero, so the block starts as its shortcut (ResNet-RS).
        A mixer with an init of its own (``reset_parameters``: the lambda layer's is the paper's,
        F.2) gets it back; a conv mixer keeps the He init.
        """
        gamma = getattr(self.conv3.norm, "weight", None)
        if gamma is not None:
            nn.init.zeros_(gamma)
        reset_mixer = getattr(self.mixer, "reset_parameters", None)
        if reset_mixer is not None and not isinstance(self.mixer, nn.Conv2d):
            reset_mixer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.conv1(x))
        out = F.relu(self.mixer_norm(self.mixer(out)))
        out = self.conv3(out)
        if self.se is not None:
            out = self.se(out)
        if self.drop_path is not None:
            out = self.drop_path(out)
        shortcut = x if self.shortcut is None else self.shortcut(x)
        return F.relu(out + shortcut)
