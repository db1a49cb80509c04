"""detectron2's own yaml configs (the model zoo the installed detectron2 ships) load through
lambda_det's safe loader to exactly the values detectron2's loader gives, their arithmetic tag
included, while any other code in a tag stays refused."""

import glob
import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS
from detectron2 import model_zoo
from detectron2.config import CfgNode as Detectron2CfgNode

from lambda_det.config import ConfigFileError
from lambda_det.config.config import load_yaml_with_base
from lambda_det.config.expressions import ExpressionError, evaluate_expression
from lambda_det.run_config import get_cfg, load_config

MODEL_ZOO = Path(os.path.dirname(model_zoo.__file__)) / "configs"
ZOO_YAMLS = sorted(glob.glob(str(MODEL_ZOO / "**" / "*.yaml"), recursive=True))
EVAL_TAG = "!!python/object/apply:eval"
RETINANET_ANCHORS = "[[x, x * 2**(1.0/3), x * 2**(2.0/3) ] for x in [32, 64, 128, 256, 512 ]]"


def detectron2_values(path: str) -> dict:
    """What detectron2's own loader reads (fvcore's, falling back to yaml.unsafe_load)."""
    return Detectron2CfgNode.load_yaml_with_base(path, allow_unsafe=True)


def test_the_installed_detectron2_ships_its_model_zoo_configs():
    # 92 yaml files in detectron2 0.6's configs/; a newer detectron2 has at least as many.
    assert len(ZOO_YAMLS) >= 92
    path = model_zoo.get_config_file("COCO-Detection/retinanet_R_50_FPN_1x.yaml")
    assert os.path.isfile(path)


def test_every_model_zoo_yaml_loads_to_detectron2s_values():
    tagged = 0
    for path in ZOO_YAMLS:
        ours, theirs = load_yaml_with_base(path), detectron2_values(path)
        # repr: the same floats to the last bit, lists as lists, tuples as strings as written.
        assert repr(ours) == repr(theirs), path
        tagged += EVAL_TAG in Path(path).read_text()
        get_cfg().merge_from_file(path)  # and merges into lambda_det's config
    assert tagged >= 1  # Base-RetinaNet.yaml: the tag is exercised, not only plain files


@pytest.mark.parametrize(
    "name",
    ["COCO-Detection/retinanet_R_50_FPN_1x.yaml", "COCO-Detection/retinanet_R_101_FPN_3x.yaml"],
)
def test_a_stock_retinanet_config_loads_with_detectron2s_anchors(name):
    cfg = load_config(model_zoo.get_config_file(name), ["MODEL.DEVICE", "cpu"])
    assert cfg.MODEL.ANCHOR_GENERATOR.SIZES == eval(RETINANET_ANCHORS)  # the negative control's
    assert cfg.MODEL.ANCHOR_GENERATOR.SIZES[0][1] == 40.31747359663594


def test_the_shipped_retinanet_base_has_detectron2s_anchors_exactly():
    ours = load_yaml_with_base(str(CONFIGS / "Base-RetinaNet.yaml"))
    theirs = detectron2_values(model_zoo.get_config_file("Base-RetinaNet.yaml"))
    assert repr(ours["MODEL"]["ANCHOR_GENERATOR"]) == repr(theirs["MODEL"]["ANCHOR_GENERATOR"])


# ---- the evaluator: Python's values for arithmetic, nothing else ----

ALLOWED = [
    RETINANET_ANCHORS,
    "[int(x * 0.1 * 640) for x in range(5, 16)]",  # Panoptic-DeepLab's crop sizes
    "[x // 3 % 5 for x in range(2, 40, 7) if x > 10 and not x == 30]",
    "(1, -2.5, 3 ** 0.5, 'a' + 'b', [y * z for y in [1, 2] for z in (3, 4)])",
    "max(round(2.675, 2), abs(-3), min([4, 5]), len('abc'), sum([1.5, 2]), float('1e3'))",
    "1 if 2 < 3 <= 3 else 0",
]


@pytest.mark.parametrize("text", ALLOWED)
def test_arithmetic_evaluates_as_python_does(text):
    assert repr(evaluate_expression(text)) == repr(eval(text))


REFUSED = {
    "__import__('os').system('true')": "the call",
    "().__class__.__bases__": "the part",
    "[1, 2][0]": "the part",
    "open('/etc/passwd')": "the call",
    "(lambda: 1)()": "the call",
    "x + 1": "the name",
    "{'a': 1}": "the part",
    "[c for c in ().__class__.__subclasses__()]": "the call",
    "int(x=1)": "the call",
    "[x for x, y in [(1, 2)]]": "the loop target",
    "2 ** 10 ** 10": "too large",
    "'a' * 10 ** 9": "too large",
    "[0] * 10 ** 9": "too large",
    "[x for x in range(10 ** 9)]": "too large",
    "[0 for x in range(90000) for y in range(90000) if 0]": "too large",
    "1 / 0": "cannot be evaluated",
    "1 +": "is not a Python expression",
}


@pytest.mark.parametrize("text", REFUSED)
def test_anything_else_is_refused_naming_the_part(text):
    with pytest.raises(ExpressionError, match=REFUSED[text]):
        evaluate_expression(text)


# ---- through a config file ----


def payload_config(folder: Path, marker: Path) -> Path:
    path = folder / "payload.yaml"
    code = f"__import__('os').system('touch {marker}')"
    path.write_text(f"MODEL:\n  ANCHOR_GENERATOR:\n    SIZES: {EVAL_TAG} [{json.dumps(code)}]\n")
    return path


def test_an_eval_tag_with_code_runs_under_unsafe_loading(tmp_path):
    """The negative control: detectron2's own loader runs the expression."""
    marker = tmp_path / "marker"
    detectron2_values(str(payload_config(tmp_path, marker)))
    assert marker.exists()


def test_an_eval_tag_with_code_is_refused_in_one_line_naming_the_file(tmp_path):
    marker = tmp_path / "marker"
    path = payload_config(tmp_path, marker)
    base = tmp_path / "innocent.yaml"
    base.write_text("_BASE_: payload.yaml\n")
    for config in (path, base):
        with pytest.raises(ConfigFileError) as error:
            get_cfg().merge_from_file(str(config))
        message = str(error.value)
        assert message.startswith(f"config file {path}") and "line 3" in message, message
        assert "the call " in message and "__import__" in message and "\n" not in message
    assert not marker.exists()


@pytest.mark.parametrize(
    "body",
    [
        f'{EVAL_TAG} ["1", "2"]',  # eval(source, globals): a second argument is refused
        f"{EVAL_TAG} {{args: ['1']}}",  # the mapping form of apply
        "!!python/object/apply:builtins.eval ['1']",
        "!!python/object/apply:os.system ['true']",
    ],
)
def test_other_forms_of_the_tag_are_refused(tmp_path, body):
    path = tmp_path / "config.yaml"
    path.write_text(f"SEED: {body}\n")
    with pytest.raises(ConfigFileError, match=r"line 1: the yaml tag !!python/object/apply"):
        get_cfg().merge_from_file(str(path))


def test_detectron2s_merge_of_a_base_keeps_its_rules(tmp_path):
    (tmp_path / "base.yaml").write_text("SOLVER:\n  BASE_LR: 0.1\n  MAX_ITER: 5\nSEED: 3\n")
    (tmp_path / "top.yaml").write_text("_BASE_: base.yaml\nSOLVER:\n  MAX_ITER: 7\n")
    top = str(tmp_path / "top.yaml")
    assert load_yaml_with_base(top) == detectron2_values(top)
    (tmp_path / "bad.yaml").write_text("_BASE_: base.yaml\nSEED:\n  A: 1\n")
    with pytest.raises(ConfigFileError, match="SEED is a mapping, but its _BASE_ gives it 3"):
        load_yaml_with_base(str(tmp_path / "bad.yaml"))


def test_yaml_safe_loading_is_not_changed_globally():
    with pytest.raises(yaml.constructor.ConstructorError):
        yaml.safe_load(f"SIZES: {EVAL_TAG} ['1']")
