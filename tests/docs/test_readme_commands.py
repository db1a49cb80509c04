"""Every command in the README's bash blocks names a tool that exists, with flags it takes, and a
config name, keys and values that load; the short ones run."""

import argparse
import os
import shlex

import pytest
import torch
from conftest import (
    ACTIVATE,
    COMMANDS,
    README,
    REPO_ROOT,
    bash_commands,
    bash_commands_of,
    linked_docs,
    run_python,
    subprocess_env,
    tool_module,
)

from lambda_det.run_config import load_config

TOOL_COMMANDS = [command for command in COMMANDS if command.startswith("python tools/")]


# A run's saved config that a README command reads: the shipped config and the overrides of the
# README command whose run writes it.
RUN_CONFIGS = {
    "output/demo_lambda_r26_shapes/config.yaml": ("lambda_r26_shapes", []),
    "output/smoke/config.yaml": ("lambda_r26_shapes", ["OUTPUT_DIR", "output/smoke"]),
}


def run_config(config: str, folder) -> str:
    """``config``, or for a run's saved config.yaml (RUN_CONFIGS) the dump that run writes (in
    ``folder``): the run's OUTPUT_DIR is where the command looks for it."""
    if config not in RUN_CONFIGS:
        return config
    cfg = load_config(*RUN_CONFIGS[config])
    assert os.path.normpath(cfg.OUTPUT_DIR) == os.path.dirname(config)
    path = folder / "config.yaml"
    path.write_text(cfg.dump())  # as detectron2's default_setup saves it
    return str(path)


class Parsed(Exception):
    """Raised with the namespace once a tool has parsed its command line."""


@pytest.fixture
def parse_only(monkeypatch):
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)


def test_the_commands_of_the_linked_docs_pages_are_read():
    pages = {path.name for path in linked_docs()}
    assert {
        "training.md",
        "safety.md",
        "timm.md",
        "lazyconfig.md",
        "export.md",
        "comparing.md",
        "detectron2.md",
    } <= pages
    assert all((REPO_ROOT / "docs" / name).is_file() for name in pages)
    readme_only = bash_commands(README)
    assert len(COMMANDS) > len(readme_only)
    assert any("tools/export_model.py" in command for command in COMMANDS[len(readme_only) :])


def test_the_readme_has_its_commands():
    assert {"make test", "make demo", ACTIVATE} <= set(COMMANDS)
    tools = {shlex.split(command)[1] for command in TOOL_COMMANDS}
    assert {
        "tools/train_net.py",
        "tools/predict.py",
        "tools/export_model.py",
        "tools/convert_timm_checkpoint.py",
        "tools/lazyconfig_train_net.py",
        "tools/compare_backbones.py",
        "tools/ap_table.py",
    } <= tools
    for command in COMMANDS:
        assert command.startswith(
            ("make ", "python tools/", "python -c ", "python -m lambda_det.d2tool ", ACTIVATE)
        ), command


@pytest.mark.parametrize("command", TOOL_COMMANDS)
def test_each_tool_command_parses_and_its_config_loads(command, parse_only, tmp_path):
    words = shlex.split(command)
    script = REPO_ROOT / words[1]
    assert script.is_file(), words[1]
    module = tool_module(script.stem)
    argv = words[2:]
    with pytest.raises(Parsed) as parsed:
        module.main(argv)
    args = parsed.value.args[0]
    config = getattr(args, "config_file", None) or getattr(args, "config", None)
    if config is None:
        return
    config = run_config(config, tmp_path)
    if script.stem == "lazyconfig_train_net":
        from lambda_det.config.lazy import load_lazy_config

        load_lazy_config(config, args.opts)
    elif script.stem == "compare_backbones":
        load_config(config, module.split_overrides(argv)[1])
    else:
        opts = [item for item in args.opts if item != "--"]
        load_config(config, opts)


def test_the_timm_recipe_names_a_registered_model():
    timm = pytest.importorskip("timm")
    import lambda_det.modeling.timm_models  # noqa: F401

    recipe = next(command for command in COMMANDS if "train.py" in command)
    model = shlex.split(recipe)[shlex.split(recipe).index("--model") + 1]
    assert model in timm.list_models("*_det")


def test_each_timm_recipe_converts_into_its_config():
    """Each README timm train.py command (its --model-kwargs parsed with timm's ParseKwargs, as
    train.py parses them) builds the backbone of the config whose conversion reads its
    --experiment folder."""
    timm = pytest.importorskip("timm")
    from timm.utils import ParseKwargs

    import lambda_det.modeling.timm_models  # noqa: F401
    from lambda_det.checkpoint.timm_classifier import convert_classifier_checkpoint
    from lambda_det.cli.checks import check_model

    timm_parser = argparse.ArgumentParser()  # the options of timm's train.py read here
    timm_parser.add_argument("--model")
    timm_parser.add_argument("--model-kwargs", nargs="*", default={}, action=ParseKwargs)
    timm_parser.add_argument("--experiment")
    conversions = {
        shlex.split(c)[-2]: shlex.split(c)[2:]
        for c in TOOL_COMMANDS
        if c.startswith("python tools/convert_timm_checkpoint.py")
    }
    recipes = [command for command in COMMANDS if "train.py" in command and "runpy" in command]
    assert len(recipes) >= 2
    for recipe in recipes:
        args, _ = timm_parser.parse_known_args(shlex.split(recipe)[3:])
        classifier = f"output/train/{args.experiment}/model_best.pth.tar"
        assert classifier in conversions, (recipe, sorted(conversions))
        convert = conversions[classifier]
        config = convert[convert.index("--config") + 1]
        with torch.device("meta"):
            model = timm.create_model(args.model, num_classes=1000, **args.model_kwargs)
        detector = check_model(load_config(config))
        weights = convert_classifier_checkpoint({"state_dict": model.state_dict()}, detector)
        assert len(weights) == len(model.state_dict()) - 2  # all but linear.weight, .bias


@pytest.mark.slow
@pytest.mark.e2e
def test_the_dataset_command_runs(tmp_path):
    command = next(c for c in COMMANDS if c.startswith("python -c") and "ensure_shapes" in c)
    env = subprocess_env(DETECTRON2_DATASETS=str(tmp_path))
    result = run_python(*shlex.split(command)[1:], env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "lambda_det_shapes_v1/val.json").is_file()


@pytest.mark.slow
@pytest.mark.e2e
def test_the_quick_start_smoke_run_trains_predicts_and_prints_its_table(
    tmp_path, small_datasets_root, monkeypatch, capsys
):
    """The README's CPU smoke run, as written (20 iterations), then its predict and AP table: the
    training and the prediction as child processes, the table's tool's main() here."""
    section = README.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    commands = [
        command
        for command in bash_commands_of(section)
        if command.startswith("python tools/") and "demo_lambda_r26_shapes" not in command
    ]
    assert [shlex.split(c)[1] for c in commands] == [
        "tools/train_net.py",
        "tools/predict.py",
        "tools/ap_table.py",
    ]
    # The commands' files: the shapes dataset, its validation split cut to 8 images.
    (tmp_path / "datasets").symlink_to(small_datasets_root)
    env = subprocess_env()
    env.pop("DETECTRON2_DATASETS", None)  # the commands use the default, ./datasets
    for command in commands[:2]:
        words = shlex.split(command)
        result = run_python(REPO_ROOT / words[1], *words[2:], env=env, cwd=tmp_path, timeout=600)
        assert result.returncode == 0, (command, result.stderr[-3000:])
    assert (tmp_path / "output/smoke/model_final.pth").is_file()
    assert (tmp_path / "output/smoke_predictions/predictions.json").is_file()
    monkeypatch.chdir(tmp_path)
    assert tool_module("ap_table").main(shlex.split(commands[2])[2:]) == 0
    assert "| smoke |" in capsys.readouterr().out


@pytest.mark.slow
def test_the_swap_in_example_builds_a_lambda_resnet_from_the_model_zoo(capsys):
    """README's "In your own Detectron2 pipeline" snippet, as written: a stock config of the
    installed detectron2's model zoo, offline, with only the backbone's name changed."""
    from lambda_det.modeling import LambdaResNet

    section = README.read_text().split("\n## In your own Detectron2 pipeline\n", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "model_zoo.get_config_file(" in snippet
    names = {}
    exec(snippet, names)  # the README's own lines, as a user runs them
    backbone = names["model"].backbone.bottom_up
    assert isinstance(backbone, LambdaResNet) and backbone.depth == 101
    # The build's swap-rule line reaches the console the snippet set up (detectron2's
    # setup_logger writes to sys.stdout, captured here).
    assert "MODEL.LAMBDA_RESNET follows MODEL.RESNETS for DEPTH 101" in capsys.readouterr().out
