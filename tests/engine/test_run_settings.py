"""What a run reads, from a yaml config and from its LazyConfig twin: the same values, each named
by the key its own config system sets it with (lambda_det/engine/run_settings.py), and the fix
said in that system's command-line syntax (lambda_det/utils/setting.py)."""

import pytest

from lambda_det.config.lazy import load_lazy_config
from lambda_det.engine.preflight import check_training_settings
from lambda_det.engine.run_settings import lazy_run_settings, yaml_run_settings
from lambda_det.run_config import load_config
from lambda_det.utils.setting import Setting, override


def test_override_speaks_each_command_line():
    assert override("MODEL.WEIGHTS", "") == 'MODEL.WEIGHTS ""'
    assert override("MODEL.BACKBONE.FREEZE_AT", 0) == "MODEL.BACKBONE.FREEZE_AT 0"
    assert override("train.init_checkpoint", "") == "train.init_checkpoint=''"
    assert override("model.roi_heads.num_classes", 3) == "model.roi_heads.num_classes=3"


def _values(settings):
    """Every value of a settings tuple, nested tuples flattened, keys dropped."""
    if isinstance(settings, Setting):
        return _values(settings.value) if isinstance(settings.value, tuple) else settings.value
    if isinstance(settings, tuple):
        return tuple(_values(item) for item in settings)
    return settings


def _keys(settings):
    if isinstance(settings, Setting):
        return [settings.key]
    if isinstance(settings, tuple):
        return [key for item in settings for key in _keys(item)]
    return []


@pytest.mark.parametrize("name", ["lambda_r26_shapes", "lambda_r152_mask_rcnn"])
def test_yaml_and_lazy_twins_read_the_same_run(name):
    yaml_run = yaml_run_settings(load_config(name))
    lazy_run = lazy_run_settings(load_lazy_config(name))
    assert _values(yaml_run.device) == _values(lazy_run.device)
    assert _values(yaml_run.data) == _values(lazy_run.data)
    # The training values agree, the periods and the >= 0 settings as sets (each system lists
    # its own optional ones).
    for field in (
        "learning_rate",
        "max_iter",
        "lr_steps",
        "amp_dtype",
        "lsj",
        "batch",
        "input_size",
        "weights",
    ):
        assert _values(getattr(yaml_run.training, field)) == _values(
            getattr(lazy_run.training, field)
        ), field
    backbones = [
        (run.training.backbone.norm, run.training.backbone.freeze_at)
        for run in (yaml_run, lazy_run)
    ]
    assert _values(backbones[0]) == _values(backbones[1])
    # Each is named by its own system's keys.
    assert all(key[0].isupper() for key in _keys(yaml_run))
    assert all(key[0].islower() for key in _keys(lazy_run))


@pytest.mark.parametrize(
    "reader, loader, key, fix",
    [
        (yaml_run_settings, load_config, "MODEL.BACKBONE.FREEZE_AT", "MODEL.BACKBONE.FREEZE_AT 0"),
        (
            lazy_run_settings,
            load_lazy_config,
            "model.backbone.bottom_up.freeze_at",
            "model.backbone.bottom_up.freeze_at=0",
        ),
    ],
)
def test_one_check_names_each_systems_key_and_fix(reader, loader, key, fix):
    cfg = (
        loader("lambda_r26_shapes", freeze=False)
        if loader is load_config
        else loader("lambda_r26_shapes")
    )
    if reader is yaml_run_settings:
        cfg.MODEL.BACKBONE.FREEZE_AT = 2
    else:
        cfg.model.backbone.bottom_up.freeze_at = 2
    with pytest.raises(
        ValueError,
        match=rf"^{key} 2 freezes randomly initialised stages .*: set "
        rf"{fix}$",
    ):
        check_training_settings(reader(cfg).training)


@pytest.mark.parametrize("as_name", [False, True])
def test_a_bottom_up_that_is_no_backbone_names_lambda_resnet_backbone(as_name):
    from detectron2.config import instantiate

    from lambda_det.modeling import LambdaResNet

    cfg = load_lazy_config("lambda_r26_shapes")
    lazy_run_settings(cfg)  # negative control: the shipped recipe's LambdaResNetBackbone passes
    cfg.model.backbone.bottom_up._target_ = (
        "lambda_det.modeling.LambdaResNet" if as_name else LambdaResNet
    )
    cfg.model.backbone.bottom_up.norm = "FrozenBN"  # a norm that LambdaResNet takes too
    with pytest.raises(AssertionError):  # what detectron2's FPN says of it: nothing
        instantiate(cfg.model.backbone)
    with pytest.raises(ValueError) as raised:
        lazy_run_settings(cfg)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("model.backbone.bottom_up calls lambda_det.modeling.")
    assert "L(lambda_det.LambdaResNetBackbone)(...)" in message
