"""The LambdaResNet as a detectron2 ``Backbone``: what the builders (build.py) and the LazyConfig
recipes build. A thin adapter: the model is :class:`~lambda_det.modeling.LambdaResNet` (torch
alone), with the same parameters and state dict keys."""

import functools
from typing import Dict

from detectron2.layers import FrozenBatchNorm2d, ShapeSpec, get_norm
from detectron2.modeling import Backbone

from lambda_det.modeling.blocks import Norm, NormFactory, group_norm
from lambda_det.modeling.lambda_resnet import LambdaResNet
from lambda_det.utils.errors import UserError

__all__ = ["LambdaResNetBackbone", "detectron2_norm_factory"]


def _detectron2_norm(norm: str, channels: int):
    """detectron2's ``get_norm``, except that "GN" has gcd(32, channels) groups (``group_norm``)."""
    return group_norm(channels) if norm == "GN" else get_norm(norm, channels)


def detectron2_norm_factory(norm: Norm) -> NormFactory:
    """The factory of a detectron2 norm name ("BN", "SyncBN", "naiveSyncBN", "FrozenBN", "GN",
    ...; "" for none), or a callable as it is.

    Raises:
        ValueError: a name detectron2 does not have.
    """
    if callable(norm):
        return norm
    try:
        get_norm(norm, 32)
    except KeyError:
        raise UserError(
            f'norm must be a detectron2 norm ("BN", "SyncBN", "naiveSyncBN", '
            f'"FrozenBN", "GN", ...; "" for none) or a callable, got {norm!r}'
        ) from None
    return functools.partial(_detectron2_norm, norm)


class LambdaResNetBackbone(LambdaResNet, Backbone):
    """:class:`~lambda_det.modeling.LambdaResNet` as a detectron2 ``Backbone``: the same
    arguments, with ``norm`` any detectron2 norm name, frozen stages in detectron2's
    ``FrozenBatchNorm2d``, and ``output_shape()`` for detectron2's FPN and heads."""

    norm_factory = staticmethod(detectron2_norm_factory)
    freeze_norms = staticmethod(FrozenBatchNorm2d.convert_frozen_batchnorm)

    def output_shape(self) -> Dict[str, ShapeSpec]:
        return {
            name: ShapeSpec(
                channels=self._out_feature_channels[name], stride=self._out_feature_strides[name]
            )
            for name in self._out_features
            if name != "linear"
        }
