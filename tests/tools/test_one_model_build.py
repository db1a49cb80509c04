"""A training run in one process loads its config once (the checks before launch build the
model on the meta device) and trains exactly as a run whose process loads its own config and
builds its model after detectron2's default_setup: the same weights, bit for bit, for both
tools. The command line is parsed once: every step and every process reads it as it was
parsed."""

import copy
import re

import pytest
import torch
import yaml
from conftest import LAZY_TINY_OVERRIDES, TINY_OVERRIDES
from detectron2.data import DatasetCatalog
from detectron2.modeling import GeneralizedRCNN

from lambda_det.cli import lazyconfig_train_net
from lambda_det.cli import train_net as cli
from lambda_det.config import resolve_config_file
from lambda_det.engine.launch import launch

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
    system.run(cli.training_command_line(argv, system), None, None)


@pytest.mark.parametrize("tool", TOOLS)
def test_a_run_in_one_process_loads_once_and_trains_as_one_that_loads_its_own(
    tool, tmp_path, monkeypatch, shapes, capsys
):
    """With SEED -1 (a seed drawn before launch, recorded in config.yaml), against a run of
    that seed whose process loads its own config (as every process of a multi-process run).
    The checks before launch build the model on the meta device; the run builds its own."""
    from lambda_det.cli import checks

    main, argv, system, seed_key = TOOLS[tool]
    loads, builds = [], []
    with monkeypatch.context() as counted:
        counted.setattr(checks, "load_config", counting(checks.load_config, loads))
        counted.setattr(cli, "load_lazy_config", counting(cli.load_lazy_config, loads))
        counted.setattr(GeneralizedRCNN, "__init__", counting(GeneralizedRCNN.__init__, builds))
        assert main(argv(tmp_path / "drawn", -1)) == 0
    assert (len(loads), len(builds)) == (1, 2)  # the checks' meta-device build, the run's
    seed = int(re.search(r"this run's seed is (\d+)", capsys.readouterr().out).group(1))
    recorded = yaml.safe_load((tmp_path / "drawn" / "config.yaml").read_text())
    assert (recorded[seed_key] if tool == "train_net" else recorded["train"][seed_key]) == seed

    run_building_its_own_model(system, argv(tmp_path / "own", seed))
    assert_same_weights(weights(tmp_path / "drawn"), weights(tmp_path / "own"))
    # The negative control: one weight off by a rounding step is told apart.
    changed = weights(tmp_path / "own")
    name = next(name for name, tensor in changed.items() if tensor.is_floating_point())
    changed[name] = torch.nextafter(changed[name], changed[name] + 1)
    with pytest.raises(AssertionError):
        assert_same_weights(weights(tmp_path / "drawn"), changed)


# ---- the command line: read by every step and every process as it was parsed ----


def coco_run_argv(datasets_root, name: str, folder) -> list:
    """A tiny run of a config NAME on the shapes training split named by ``--coco-dataset``."""
    data = datasets_root / "lambda_det_shapes_v1"
    return [
        "--config",
        "lambda_r26_shapes",
        "--coco-dataset",
        name,
        str(data / "train.json"),
        str(data / "train"),
        *TINY_OVERRIDES,
        "DATASETS.TRAIN",
        f"('{name}',)",
        "OUTPUT_DIR",
        str(folder),
    ]


def assert_trained_on(folder, triple: list) -> None:
    assert (folder / "model_final.pth").is_file()
    recorded = yaml.safe_load((folder / "config.yaml").read_text())["DATASETS"]
    assert recorded["COCO_INSTANCES"] == [triple] and recorded["TRAIN"] == [triple[0]]


def test_main_leaves_the_command_line_as_parsed(tmp_path, monkeypatch, datasets_root):
    """From the checks before launch to the end of the run (default_setup included), ``args``
    holds what was typed, the config's NAME resolved to its path: no step adds to it (the
    --coco-dataset triples) or rewrites it."""
    argv = coco_run_argv(datasets_root, "own_shapes_main", tmp_path / "run")
    seen = {}

    def loading(args):
        seen["loaded"], seen["args"] = copy.deepcopy(vars(args)), args
        return cli.load_run_config(args)

    def launching(run, *positional, args, **options):
        seen["launched"] = args[0]
        return launch(run, *positional, args=args, **options)

    monkeypatch.setattr(cli, "launch", launching)
    assert cli.main(argv, system=cli.YAML_CONFIGS._replace(load=loading)) == 0
    assert seen["launched"] is seen["args"] and vars(seen["args"]) == seen["loaded"]
    assert seen["loaded"]["config_file"] == resolve_config_file("lambda_r26_shapes")
    assert seen["loaded"]["opts"] == argv[6:]
    assert_trained_on(tmp_path / "run", argv[3:6])


def test_a_started_process_loads_the_coco_datasets_of_the_command_line(tmp_path, datasets_root):
    """What each process of a run over several processes runs (``run`` without a config):
    it registers the --coco-dataset triples and trains on them."""
    argv = coco_run_argv(datasets_root, "own_shapes_worker", tmp_path / "run")
    args = cli.training_command_line(argv)
    parsed = copy.deepcopy(vars(args))
    cli.run(args, None, None)
    assert vars(args) == parsed
    assert "own_shapes_worker" in DatasetCatalog.list()
    assert_trained_on(tmp_path / "run", argv[3:6])
