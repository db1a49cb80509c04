"""docs/config.md documents every key lambda_det adds to Detectron2's config, with its default."""
import ast
import re

from conftest import REPO_ROOT
from detectron2.config import get_cfg as get_detectron2_cfg
from lambda_det.config import get_cfg


def flatten(node, prefix=""):
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {key: value for name, child in node.items()
            for key, value in flatten(child, f"{prefix}{name}.").items()}


def test_every_added_key_is_documented_with_its_default():
    ours, theirs = flatten(get_cfg()), flatten(get_detectron2_cfg())
    added = {key: value for key, value in ours.items() if key not in theirs}
    assert "MODEL.LAMBDA_RESNET.DEPTH" in added and "SOLVER.LOG_PERIOD" in added
    rows = re.findall(r"^\| `([A-Z_.]+)` \| `(.+?)` \|", (REPO_ROOT / "docs/config.md").read_text(),
                      flags=re.M)
    documented = {key: ast.literal_eval(default) for key, default in rows}
    assert sorted(added) == sorted(documented)
    for key, value in added.items():
        expected = list(value) if isinstance(value, tuple) else value
        assert documented[key] == expected, key
