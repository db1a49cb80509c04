"""LambdaResNet models, their blocks and mixers, and the detectron2 backbone over them.

:class:`LambdaResNet` (``lambda_resnet.py``), its blocks and mixers and the timm models
(``timm_models.py``) need torch alone. The detectron2 parts are :class:`LambdaResNetBackbone`
(``backbone.py``), the backbone builders (``build.py``) and the config keys
(``config.py``: :func:`add_lambda_resnet_config`, ``use_mixer``): where detectron2 is installed,
importing this package imports them, which registers the builders in detectron2's
``BACKBONE_REGISTRY``; without it, their names here raise an ImportError that says how to get
detectron2.
"""

import importlib

from lambda_det.compat import (
    detectron2_installed,
    import_detectron2,
    without_jit_script_deprecation,
)
from lambda_det.compat.internals import add_default_flop_handles
from lambda_det.layers import eager_impls, flop_handles
from lambda_det.modeling.lambda_resnet import (
    BLOCKS_PER_STAGE,
    DEPTHS,
    PAPER_LAMBDA_BLOCKS_C4,
    PAPER_PARAMETERS,
    LambdaResNet,
    lambda_resnet,
    resolve_placement,
)
from lambda_det.modeling.mixers import MIXERS, build_mixer_factory, register_mixer, unregister_mixer

# The names that need detectron2, and their modules.
_DETECTRON2_NAMES = {
    "LambdaResNetBackbone": "lambda_det.modeling.backbone",
    "build_lambda_resnet_backbone": "lambda_det.modeling.build",
    "build_lambda_resnet_fpn_backbone": "lambda_det.modeling.build",
    "build_retinanet_lambda_resnet_fpn_backbone": "lambda_det.modeling.build",
    "add_lambda_resnet_config": "lambda_det.modeling.config",
    "add_timm_backbone_config": "lambda_det.modeling.config",
    "TimmBackbone": "lambda_det.modeling.timm_backbone",
    "build_timm_backbone": "lambda_det.modeling.timm_backbone",
    "build_timm_fpn_backbone": "lambda_det.modeling.timm_backbone",
    "build_retinanet_timm_fpn_backbone": "lambda_det.modeling.timm_backbone",
    "use_mixer": "lambda_det.modeling.config",
}

__all__ = [
    "LambdaResNet",
    "lambda_resnet",
    "resolve_placement",
    "DEPTHS",
    "BLOCKS_PER_STAGE",
    "PAPER_LAMBDA_BLOCKS_C4",
    "PAPER_PARAMETERS",
    "MIXERS",
    "register_mixer",
    "unregister_mixer",
    "build_mixer_factory",
    "flop_handles",
    "eager_impls",
]

# fvcore's FlopCountAnalysis (so detectron2's analyze_model) counts the layers' ops: see
# lambda_det.layers.flops. (Importing fvcore calls torch.jit.script.)
with without_jit_script_deprecation():
    add_default_flop_handles(flop_handles())


def __getattr__(name: str):
    """A detectron2 name, imported here when detectron2 is installed: without it, the ImportError
    of :func:`lambda_det.compat.import_detectron2`, which says how to get it."""
    module_name = _DETECTRON2_NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import_detectron2()
    return getattr(importlib.import_module(module_name), name)


if detectron2_installed():
    __all__ += list(_DETECTRON2_NAMES)
    import_detectron2()  # quietly
    # Re-exported (listed in __all__ above); importing build registers the builders.
    from lambda_det.modeling.backbone import LambdaResNetBackbone  # noqa: F401
    from lambda_det.modeling.build import (  # noqa: F401
        build_lambda_resnet_backbone,
        build_lambda_resnet_fpn_backbone,
        build_retinanet_lambda_resnet_fpn_backbone,
    )
    from lambda_det.modeling.config import (  # noqa: F401
        add_lambda_resnet_config,
        add_timm_backbone_config,
        use_mixer,
    )
    from lambda_det.modeling.timm_backbone import (  # noqa: F401
        TimmBackbone,
        build_retinanet_timm_fpn_backbone,
        build_timm_backbone,
        build_timm_fpn_backbone,
    )
