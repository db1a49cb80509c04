"""Token mixers: the spatial layer in the middle of a bottleneck, chosen by name.

A mixer is registered under a name as a builder: ``builder(**options)`` returns a factory
``factory(in_channels, out_channels, stride) -> nn.Module`` that makes the mixer of one block
(with stride 2, its output has half the input's height and width). Here each builder is a
dataclass whose fields are the mixer's options and whose instances are the factories.

Adding a mixer: write its builder and register it::

    @register_mixer("my_mixer")
    @dataclass(frozen=True)
    class MyMixer:
        kernel_size: int = 5                                  # options, with their defaults

        def __call__(self, in_channels, out_channels, stride):
            return MyLayer(in_channels, out_channels, self.kernel_size, stride=stride)

then ``lambda_resnet(50, mixer="my_mixer", kernel_size=3)``, or ``MODEL.LAMBDA_RESNET.MIXER:
"my_mixer"`` in a config (its options from config keys: ``MIXER_OPTIONS_FROM_CONFIG`` in
:mod:`lambda_det.modeling.build`). A builder with a ``norm`` option gets the backbone's norm name.
The backbone He-initialises every ``nn.Conv2d`` after building; a mixer module that is not itself a
conv and has ``reset_parameters`` gets it called after that (see ``Bottleneck.init_weights``).
"""
import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from torch import nn

from lambda_det.layers import AFTConv, LambdaLayer, RelativePositionEmbedding
from lambda_det.modeling.blocks import MixerFactory, make_norm

__all__ = ["MixerFactory", "MIXERS", "register_mixer", "unregister_mixer", "mixer_options",
           "check_mixer_options", "build_mixer_factory", "ConvMixer", "LambdaMixer",
           "AFTConvMixer"]

MixerBuilder = Callable[..., MixerFactory]  # (**options) -> factory

# Name -> builder. A plain dict: detectron2's Registry keys objects by their __name__ ("lambda"
# cannot be one) and has no way to remove an entry.
MIXERS: Dict[str, MixerBuilder] = {}


def register_mixer(name: str) -> Callable[[MixerBuilder], MixerBuilder]:
    """Decorator: register a mixer builder under ``name`` (see the module docstring)."""
    def register(builder: MixerBuilder) -> MixerBuilder:
        if name in MIXERS:
            raise ValueError(f"a mixer named {name!r} is already registered: {MIXERS[name]!r}")
        MIXERS[name] = builder
        return builder
    return register


def unregister_mixer(name: str) -> None:
    """Remove the mixer registered under ``name``."""
    _builder(name)
    del MIXERS[name]


def _builder(name: str) -> MixerBuilder:
    if name not in MIXERS:
        raise ValueError(f"unknown mixer {name!r}; the registered mixers are "
                         f"{', '.join(repr(known) for known in sorted(MIXERS))}")
    return MIXERS[name]


def mixer_options(name: str) -> Tuple[str, ...]:
    """The option names the mixer registered under ``name`` takes."""
    return tuple(inspect.signature(_builder(name)).parameters)


def check_mixer_options(name: str, options: Mapping[str, Any]) -> None:
    """A ValueError for an unknown mixer, a TypeError for options it does not take."""
    known = mixer_options(name)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"unknown options {unknown} for mixer {name!r}; its options are {known}")


def build_mixer_factory(name: str, **options) -> MixerFactory:
    """The factory of the mixer registered under ``name``, with these options."""
    check_mixer_options(name, options)
    return MIXERS[name](**options)


def _keyword_defaults(layer: type) -> Dict[str, Any]:
    """The keyword defaults of ``layer``'s constructor, where a layer's defaults are written."""
    return {name: parameter.default
            for name, parameter in inspect.signature(layer).parameters.items()
            if parameter.default is not inspect.Parameter.empty}


@register_mixer("conv")
@dataclass(frozen=True)
class ConvMixer:
    """The 3x3 conv of a ResNet bottleneck, strided itself (ResNet v1.5); no options."""

    def __call__(self, in_channels: int, out_channels: int, stride: int) -> nn.Module:
        return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


_LAMBDA_DEFAULTS = _keyword_defaults(LambdaLayer)


@register_mixer("lambda")
@dataclass(frozen=True)
class LambdaMixer:
    """:class:`~lambda_det.layers.LambdaLayer`; strided, it runs at stride 1 and then average-pools
    3x3 with stride 2 (paper F.2).

    Options (defaults: the LambdaLayer's): heads, dim_k, dim_u, scope (None: global context),
    impl, max_size (global context only); norm, the norm of its queries and values (the
    backbone's); share_position_embeddings: one relative position embedding for all the layers
    this factory makes (paper Table 4), created with the factory.
    """

    heads: int = _LAMBDA_DEFAULTS["heads"]
    dim_k: int = _LAMBDA_DEFAULTS["dim_k"]
    dim_u: int = _LAMBDA_DEFAULTS["dim_u"]
    scope: Optional[int] = _LAMBDA_DEFAULTS["scope"]
    impl: str = _LAMBDA_DEFAULTS["impl"]
    max_size: int = _LAMBDA_DEFAULTS["max_size"]
    norm: str = "BN"
    share_position_embeddings: bool = False
    shared_position_embedding: Optional[RelativePositionEmbedding] = dataclasses.field(
        init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.share_position_embeddings:
            # The radius a LambdaLayer gives its own table (and checks a shared one against).
            radius = self.max_size - 1 if self.scope is None else self.scope // 2
            embedding = RelativePositionEmbedding(self.dim_k, self.dim_u, radius)
            object.__setattr__(self, "shared_position_embedding", embedding)  # frozen fields

    def __call__(self, in_channels: int, out_channels: int, stride: int) -> nn.Module:
        return LambdaLayer(in_channels, out_channels, heads=self.heads, dim_k=self.dim_k,
                           dim_u=self.dim_u, scope=self.scope, stride=stride, impl=self.impl,
                           position_embedding=self.shared_position_embedding,
                           max_size=self.max_size,
                           norm_layer=functools.partial(make_norm, self.norm))


_AFT_CONV_DEFAULTS = _keyword_defaults(AFTConv)


@register_mixer("aft_conv")
@dataclass(frozen=True)
class AFTConvMixer:
    """:class:`~lambda_det.layers.AFTConv` (Attention Free Transformer, conv form); strided, it
    runs at stride 1 and then average-pools 3x3 with stride 2.

    Options (defaults: the AFTConv's): heads, window_size (odd).
    """

    heads: int = _AFT_CONV_DEFAULTS["heads"]
    window_size: int = _AFT_CONV_DEFAULTS["window_size"]

    def __call__(self, in_channels: int, out_channels: int, stride: int) -> nn.Module:
        return AFTConv(in_channels, out_channels, heads=self.heads, window_size=self.window_size,
                       stride=stride)
