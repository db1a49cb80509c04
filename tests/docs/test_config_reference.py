"""docs/config.md documents every key lambda_det adds to Detectron2's config, with its default;
the mixers' rows follow their declarations, and the docs list the depths a LambdaResNet has."""

import ast
import re

import pytest
from conftest import REPO_ROOT
from detectron2.config import get_cfg as get_detectron2_cfg

from lambda_det.modeling.lambda_resnet import DEPTHS
from lambda_det.modeling.mixers import MIXERS, mixer_config_defaults, mixer_config_node
from lambda_det.run_config import get_cfg


def flatten(node, prefix=""):
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {
        key: value
        for name, child in node.items()
        for key, value in flatten(child, f"{prefix}{name}.").items()
    }


def test_every_added_key_is_documented_with_its_default():
    ours, theirs = flatten(get_cfg()), flatten(get_detectron2_cfg())
    added = {key: value for key, value in ours.items() if key not in theirs}
    assert "MODEL.LAMBDA_RESNET.DEPTH" in added and "SOLVER.LOG_PERIOD" in added
    documented = documented_defaults()
    assert sorted(added) == sorted(documented)
    for key, value in added.items():
        expected = list(value) if isinstance(value, tuple) else value
        assert documented[key] == expected, key


def documented_defaults() -> dict:
    rows = re.findall(
        r"^\| `([A-Z_.]+)` \| `(.+?)` \|", (REPO_ROOT / "docs/config.md").read_text(), flags=re.M
    )
    return {key: ast.literal_eval(default) for key, default in rows}


def test_every_mixer_option_has_a_row_with_its_declared_default():
    documented = documented_defaults()
    assert set(MIXERS) == {"conv", "lambda", "aft_conv"}  # the built-in ones, documented
    for name in MIXERS:
        node = ".".join(filter(None, ("MODEL.LAMBDA_RESNET", mixer_config_node(name))))
        for key, default in mixer_config_defaults(name).items():
            assert documented[f"{node}.{key}"] == default, (name, key)


# Where the docs list the depths, and how to find each list.
DEPTH_LISTS = {
    "README.md": r"LambdaResNet-([\d/]+) backbones",
    "docs/config.md": r"\| `MODEL.LAMBDA_RESNET.DEPTH` \| `None` \| ([\d, or]+) \(",
    "docs/timm.md": r"`lambda_resnet\{([\d,]+)\}_det`",
    "docs/ecosystem.md": r"for d in ([\d,\s]+)\)",
}


@pytest.mark.parametrize("doc", sorted(DEPTH_LISTS))
def test_the_docs_list_the_depths_a_lambda_resnet_has(doc):
    listed = re.search(DEPTH_LISTS[doc], (REPO_ROOT / doc).read_text())
    assert listed, f"{doc} lists no depths where DEPTH_LISTS looks for them"
    assert tuple(int(depth) for depth in re.findall(r"\d+", listed.group(1))) == DEPTHS
