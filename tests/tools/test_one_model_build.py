"""A training run in one process loads its config once and builds its model once, before
launch (the checks read a meta-device copy), and trains exactly as a run that builds its own
model after detectron2's default_setup: the same weights, bit for bit, for both tools."""

import re

import pytest
import torch
import yaml
from conftest import LAZY_TINY_OVERRIDES, TINY_OVERRIDES
from detectron2.modeling import GeneralizedRCNN

from lambda_det.cli import lazyconfig_train_net
from lambda_det.cli import train_net as cli
from lambda_det.engine.prebuilt import RandomState

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SHAPES = "configs/Demo/lambda_r26_shapes.yaml"


def yaml_argv(folder, seed) -> list:
    return ["--config", SHAPES, *TINY_OVERRIDES, "OUTPUT_DIR", str(folder), "SEED", str(seed)]


def lazy_argv(folder, seed) -> list:
    return [
        "--config",
        "lambda_r26_shapes",
        *LAZY_TINY_OVERRIDES,
        "train.max_iter=2",
        f"train.output_dir={folder}",
        f"train.seed={seed}",
    ]


TOOLS = {
    "train_net": (cli.main, yaml_argv, cli.YAML_CONFIGS, "SEED"),
    "lazyconfig_train_net": (lazyconfig_train_net.main, lazy_argv, cli.LAZY_CONFIGS, "seed"),
}


def counting(function, calls: list):
    def counted(*args, **kwargs):
        calls.append(function.__name__)
        return function(*args, **kwargs)

    return counted


def weights(folder) -> dict:
    return torch.load(folder / "model_final.pth", map_location="cpu", weights_only=True)["model"]


def assert_same_weights(first: dict, second: dict) -> None:
    assert first.keys() == second.keys()
    for name, tensor in first.items():
        assert torch.equal(tensor, second[name]), name


def run_building_its_own_model(system: cli.ConfigSystem, argv: list) -> None:
    """What each process of a run over several processes runs: it loads the config and builds
    the model after default_setup."""
    system.run(cli.training_command_line(argv, system), None, None, None)


@pytest.mark.parametrize("tool", TOOLS)
def test_a_run_in_one_process_loads_and_builds_once_and_trains_as_one_that_builds_its_own(
    tool, tmp_path, monkeypatch, shapes, capsys
):
    """With SEED -1 (a seed drawn before launch, recorded in config.yaml), against a run of
    that seed whose process builds its own model (as every process of a multi-process run)."""
    from lambda_det.cli import checks

    main, argv, system, seed_key = TOOLS[tool]
    loads, builds = [], []
    with monkeypatch.context() as counted:
        counted.setattr(checks, "load_config", counting(checks.load_config, loads))
        counted.setattr(cli, "load_lazy_config", counting(cli.load_lazy_config, loads))
        counted.setattr(GeneralizedRCNN, "__init__", counting(GeneralizedRCNN.__init__, builds))
        assert main(argv(tmp_path / "drawn", -1)) == 0
    assert (len(loads), len(builds)) == (1, 1)  # meta-device builds included
    seed = int(re.search(r"this run's seed is (\d+)", capsys.readouterr().out).group(1))
    recorded = yaml.safe_load((tmp_path / "drawn" / "config.yaml").read_text())
    assert (recorded[seed_key] if tool == "train_net" else recorded["train"][seed_key]) == seed

    run_building_its_own_model(system, argv(tmp_path / "own", seed))
    assert_same_weights(weights(tmp_path / "drawn"), weights(tmp_path / "own"))

    # The negative control: the run goes on from the seeded state, not from the build's.
    monkeypatch.setattr(RandomState, "restore", lambda self: None)
    assert main(argv(tmp_path / "unrestored", seed)) == 0
    with pytest.raises(AssertionError):
        assert_same_weights(weights(tmp_path / "unrestored"), weights(tmp_path / "own"))
