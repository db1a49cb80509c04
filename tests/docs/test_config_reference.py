"""docs/config.md documents every key lambda_det adds to Detectron2's config, with its default;
the mixers' rows follow their declarations, and the docs list the depths a LambdaResNet has."""

import ast
import inspect
import re

import pytest
from conftest import REPO_ROOT
from detectron2.config import get_cfg as get_detectron2_cfg

from lambda_det.config import config as run_keys
from lambda_det.modeling import config as modeling_config
from lambda_det.modeling.config import BUILT_IN_MIXERS
from lambda_det.modeling.lambda_resnet import DEPTHS
from lambda_det.modeling.mixers import MIXERS
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


# Where each node's keys are set: the function, and the name its node has there.
KEY_HOMES = {
    "MODEL.LAMBDA_RESNET.": (modeling_config._lambda_resnet_node, "node."),
    "MODEL.TIMM.": (modeling_config.add_timm_backbone_config, "node."),
    "INPUT.LSJ.": (run_keys._lsj_node, "lsj."),
    "": (run_keys.add_lambda_det_config, "cfg."),
}


def test_every_added_key_is_written_out_once_where_its_default_is_set():
    """A grep for a key lands on its one definition (``node.KEY = default``) and its readers."""
    ours, theirs = flatten(get_cfg()), flatten(get_detectron2_cfg())
    for key in (key for key in ours if key not in theirs):
        prefix = next(prefix for prefix in KEY_HOMES if key.startswith(prefix))
        function, name = KEY_HOMES[prefix]
        written = rf"^\s+{re.escape(name + key[len(prefix) :])} = "
        assert len(re.findall(written, inspect.getsource(function), flags=re.M)) == 1, key
    assert set(MIXERS) == set(BUILT_IN_MIXERS)  # no registered mixer adds keys here


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
