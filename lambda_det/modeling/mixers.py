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

then ``lambda_resnet(50, mixer="my_mixer", kernel_size=3)``, or in a yaml config
``MODEL.LAMBDA_RESNET.MIXER "my_mixer"`` with its options under ``MODEL.LAMBDA_RESNET.MY_MIXER``
(``KERNEL_SIZE: 5``; :func:`lambda_det.modeling.add_lambda_resnet_config` adds the node of every
registered mixer with options), or in a LazyConfig recipe
``use_mixer(model.backbone.bottom_up, "my_mixer")``. Every option has a default that a config can
hold (a number, a string, a bool, a list, None). A builder may declare, as a class attribute,
``CONFIG_NODE``, where its config keys live: a node under ``MODEL.LAMBDA_RESNET`` (default:
the mixer's name in capitals). The built-in mixers' keys are written out in
:mod:`lambda_det.modeling.config` instead.

A builder with a ``norm`` option gets the backbone's norm, a factory (channels -> module or None;
see ``blocks.norm_factory``); it has no config key.
The backbone He-initialises every ``nn.Conv2d`` after building; a mixer module that is not itself a
conv and has ``reset_parameters`` gets it called after that (see ``Bottleneck.init_weights``).
"""

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from torch import nn

from lambda_det.layers import AFTConv, LambdaLayer, RelativePositionEmbedding, constructor_defaults
from lambda_det.modeling.blocks import DEFAULT_NORM, MixerFactory, Norm, make_norm
from lambda_det.utils.errors import UserError

__all__ = [
    "MixerFactory",
    "MIXERS",
    "register_mixer",
    "unregister_mixer",
    "mixer_options",
    "check_mixer_options",
    "build_mixer_factory",
    "mixer_option_defaults",
    "mixer_config_node",
    "mixer_config_defaults",
    "mixer_options_from_config",
    "BACKBONE_OPTIONS",
    "ConvMixer",
    "LambdaMixer",
    "AFTConvMixer",
]

MixerBuilder = Callable[..., MixerFactory]  # (**options) -> factory

# Name -> builder. A plain dict: detectron2's Registry keys objects by their __name__ ("lambda"
# cannot be one) and has no way to remove an entry.
MIXERS: Dict[str, MixerBuilder] = {}
# Options the backbone sets itself: no config key, no LazyConfig argument.
BACKBONE_OPTIONS = ("norm",)
# What a config key can hold (yacs' value types).
_CONFIG_VALUE_TYPES = (bool, int, float, str, list, tuple, type(None))


def register_mixer(name: str) -> Callable[[MixerBuilder], MixerBuilder]:
    """Decorator: register a mixer builder under ``name`` (see the module docstring).

    Raises:
        ValueError: the name is taken, or an option has no default a config can hold.
    """

    def register(builder: MixerBuilder) -> MixerBuilder:
        if name in MIXERS:
            raise ValueError(f"a mixer named {name!r} is already registered: {MIXERS[name]!r}")
        _check_option_defaults(name, builder)
        MIXERS[name] = builder
        return builder

    return register


def _check_option_defaults(name: str, builder: MixerBuilder) -> None:
    """Each option's default is its config key's default: it needs one that a config holds."""
    for option, default in _option_defaults(builder).items():
        if default is inspect.Parameter.empty:
            raise ValueError(
                f"option {option!r} of mixer {name!r} has no default: give it one "
                f"(it is the default of its config key)"
            )
        if not isinstance(default, _CONFIG_VALUE_TYPES):
            raise ValueError(
                f"option {option!r} of mixer {name!r} defaults to {default!r}, "
                f"which a config cannot hold: use a number, string, bool, list or "
                f"None"
            )


def unregister_mixer(name: str) -> None:
    """Remove the mixer registered under ``name``."""
    _builder(name)
    del MIXERS[name]


def _builder(name: str) -> MixerBuilder:
    if name not in MIXERS:
        raise UserError(
            f"unknown mixer {name!r}; the registered mixers are "
            f"{', '.join(repr(known) for known in sorted(MIXERS))}"
        )
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


def _option_defaults(builder: MixerBuilder) -> Dict[str, Any]:
    """The defaults of the options a caller sets (``inspect.Parameter.empty``: none)."""
    return {
        option: parameter.default
        for option, parameter in inspect.signature(builder).parameters.items()
        if option not in BACKBONE_OPTIONS
    }


def mixer_option_defaults(name: str) -> Dict[str, Any]:
    """The options a caller sets of the mixer registered under ``name``, with their defaults:
    its LazyConfig arguments (the backbone sets ``norm``)."""
    return _option_defaults(_builder(name))


def mixer_config_node(name: str) -> str:
    """Where the mixer's config keys live: a node under ``MODEL.LAMBDA_RESNET``, its builder's
    ``CONFIG_NODE`` or its name in capitals; "" for ``MODEL.LAMBDA_RESNET`` itself."""
    return getattr(_builder(name), "CONFIG_NODE", name.upper())


def mixer_config_defaults(name: str) -> Dict[str, Any]:
    """The config keys of a mixer registered with ``register_mixer`` (its options in capitals)
    with their defaults; {} for a mixer without options."""
    return {option.upper(): default for option, default in mixer_option_defaults(name).items()}


def mixer_options_from_config(name: str, node: Mapping[str, Any]) -> Dict[str, Any]:
    """The mixer's options from ``node``, a config's ``MODEL.LAMBDA_RESNET`` (see
    :func:`mixer_config_node`).

    Raises:
        ValueError: ``node`` has no keys for the mixer (it was made before the mixer was
            registered).
    """
    builder, where = _builder(name), mixer_config_node(name)
    section = node.get(where) if where else node
    options = {}
    for option in _option_defaults(builder):
        key = option.upper()
        if section is None or key not in section:
            full_key = ".".join(part for part in ("MODEL.LAMBDA_RESNET", where, key) if part)
            raise UserError(
                f"the config has no {full_key} for mixer {name!r}: register the "
                f"mixer before making the config (lambda_det.run_config.get_cfg)"
            )
        options[option] = section[key]
    return options


@register_mixer("conv")
@dataclass(frozen=True)
class ConvMixer:
    """The 3x3 conv of a ResNet bottleneck, strided itself (ResNet v1.5); no options."""

    def __call__(self, in_channels: int, out_channels: int, stride: int) -> nn.Module:
        return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


_LAMBDA_DEFAULTS = constructor_defaults(LambdaLayer)


@register_mixer("lambda")
@dataclass(frozen=True)
class LambdaMixer:
    """:class:`~lambda_det.layers.LambdaLayer`; strided, it runs at stride 1 and then average-pools
    3x3 with stride 2 (paper F.2).

    Options (defaults: the LambdaLayer's): heads, dim_k, dim_u, scope (None: global context),
    impl, max_size (global context only); norm, the norm of its queries and values (the
    backbone's); share_position_embeddings: one relative position embedding for all the layers
    this factory makes (paper Table 4), created with the factory.

    Config keys: ``MODEL.LAMBDA_RESNET.HEADS``, ``DIM_K``, ... (the backbone's paper
    hyper-parameters, :mod:`lambda_det.modeling.config`); ``SCOPE 0`` is global context.
    """

    heads: int = _LAMBDA_DEFAULTS["heads"]
    dim_k: int = _LAMBDA_DEFAULTS["dim_k"]
    dim_u: int = _LAMBDA_DEFAULTS["dim_u"]
    scope: Optional[int] = _LAMBDA_DEFAULTS["scope"]
    impl: str = _LAMBDA_DEFAULTS["impl"]
    max_size: int = _LAMBDA_DEFAULTS["max_size"]
    norm: Norm = DEFAULT_NORM
    share_position_embeddings: bool = False
    shared_position_embedding: Optional[RelativePositionEmbedding] = dataclasses.field(
        init=False, default=None, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.share_position_embeddings:
            # The radius a LambdaLayer gives its own table (and checks a shared one against).
            radius = self.max_size - 1 if self.scope is None else self.scope // 2
            embedding = RelativePositionEmbedding(self.dim_k, self.dim_u, radius)
            object.__setattr__(self, "shared_position_embedding", embedding)  # frozen fields

    def __call__(self, in_channels: int, out_channels: int, stride: int) -> nn.Module:
        return LambdaLayer(
            in_channels,
            out_channels,
            heads=self.heads,
            dim_k=self.dim_k,
            dim_u=self.dim_u,
            scope=self.scope,
            stride=stride,
            impl=self.impl,
            position_embedding=self.shared_position_embedding,
            max_size=self.max_size,
            norm_layer=functools.partial(make_norm, self.norm),
        )


_AFT_CONV_DEFAULTS = constructor_defaults(AFTConv)


@register_mixer("aft_conv")
@dataclass(frozen=True)
class AFTConvMixer:
    """:class:`~lambda_det.layers.AFTConv` (Attention Free Transformer, conv form); strided, it
    runs at stride 1 and then average-pools 3x3 with stride 2.

    Options (defaults: the AFTConv's): heads, window_size (odd). Config keys:
    ``MODEL.LAMBDA_RESNET.AFT_CONV.HEADS``, ``MODEL.LAMBDA_RESNET.AFT_CONV.WINDOW_SIZE``.
    """

    heads: int = _AFT_CONV_DEFAULTS["heads"]
    window_size: int = _AFT_CONV_DEFAULTS["window_size"]

    def __call__(self, in_channels: int, out_channels: int, stride: int) -> nn.Module:
        return AFTConv(
            in_channels, out_channels, heads=self.heads, window_size=self.window_size, stride=stride
        )
