"""Users' config files: a yaml config (or a base it names, or a saved run's config) runs no code
in any tool, and a malformed one (a _BASE_ loop, an empty file, a list) is one error line that
names the file."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, comparison_options, tool_module
from detectron2.config import get_cfg as get_detectron2_cfg

import lambda_det.data
from lambda_det.cli import train_net
from lambda_det.config import ConfigFileError
from lambda_det.model_zoo import get_config
from lambda_det.run_config import config_differences, get_cfg, load_config

CONFIG = str(CONFIGS / "Demo/lambda_r26_shapes.yaml")
OS_SYSTEM = "!!python/object/apply:os.system"
EXEC = "!!python/object/apply:builtins.exec"


def payload_yaml(marker: Path, tag: str = OS_SYSTEM) -> str:
    """A config whose SEED, loaded with yaml.unsafe_load, creates ``marker``."""
    code = f"touch {marker}" if tag == OS_SYSTEM else f"open({str(marker)!r}, 'w').close()"
    return f"SEED: {tag} [{json.dumps(code)}]\n"


def write_payload_configs(folder: Path, marker: Path, tag: str = OS_SYSTEM) -> dict:
    """The payload config itself ("direct"), and a plain config naming it as its _BASE_."""
    direct = folder / "payload.yaml"
    direct.write_text(payload_yaml(marker, tag))
    through_base = folder / "innocent.yaml"
    through_base.write_text("_BASE_: payload.yaml\nSOLVER:\n  MAX_ITER: 2\n")
    return {"direct": direct, "through _BASE_": through_base}


def assert_one_error_line(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def run_tool(name: str, argv, capsys, *fragments: str) -> str:
    """The tool ``name``'s main(argv) in this process: exit status 2 and one error line."""
    with pytest.raises(SystemExit) as exit_info:
        tool_module(name).main([str(arg) for arg in argv])
    assert exit_info.value.code == 2
    return assert_one_error_line(capsys, *fragments)


def tool_commands(config: Path, tmp_path: Path) -> dict:
    """Each tool that reads a yaml config, reading ``config`` (its argv); predict's input is
    tmp_path/image.jpg."""
    image = tmp_path / "image.jpg"
    return {
        "train": ("train_net", ["--config-file", config, "OUTPUT_DIR", tmp_path / "run"]),
        "eval-only": (
            "train_net",
            ["--config-file", config, "--eval-only", "OUTPUT_DIR", tmp_path / "eval"],
        ),
        "predict": (
            "predict",
            ["--config-file", config, "--input", image, "--output", tmp_path / "predictions"],
        ),
        "export": (
            "export_model",
            ["--config-file", config, "--format", "torchscript", "--output", tmp_path / "model.ts"],
        ),
        "demo": ("demo", ["--config", config]),
        "timm converter": (
            "convert_timm_checkpoint",
            ["--config-file", config, tmp_path / "classifier.pth", tmp_path / "detector.pth"],
        ),
        "comparison": ("compare_backbones", ["--config", config, "--output", tmp_path / "cmp"]),
        "detector benchmark": (
            "benchmark_detector",
            ["--configs", config, "--device", "cpu", "--output", tmp_path / "bench"],
        ),
    }


TOOLS = list(tool_commands(Path("config.yaml"), Path("folder")))


@pytest.fixture
def no_shapes_dataset(monkeypatch, tmp_path):
    """The demo's dataset step, skipped (these tests end before anything reads it)."""
    monkeypatch.setattr(lambda_det.data, "ensure_shapes_dataset", lambda root=None: tmp_path)


# ---- python tags run nothing ----


@pytest.mark.parametrize("tag", [OS_SYSTEM, EXEC])
def test_the_payload_runs_under_unsafe_loading(tmp_path, tag):
    """The negative control: yaml.unsafe_load, and detectron2's own merge_from_file (which falls
    back to it), do run the payload, directly and through _BASE_."""
    marker = tmp_path / "marker"
    configs = write_payload_configs(tmp_path, marker, tag)
    yaml.unsafe_load(configs["direct"].read_text())
    assert marker.exists()
    for config in configs.values():
        marker.unlink()
        get_detectron2_cfg().merge_from_file(str(config))
        assert marker.exists()


@pytest.mark.parametrize("tag", [OS_SYSTEM, EXEC])
@pytest.mark.parametrize("how", ["direct", "through _BASE_"])
def test_payload_configs_are_refused_by_every_loader(tmp_path, tag, how):
    marker = tmp_path / "marker"
    config = str(write_payload_configs(tmp_path, marker, tag)[how])
    payload = str(tmp_path / "payload.yaml")
    loaders = {
        "load_config": lambda: load_config(config),
        "model_zoo.get_config": lambda: get_config(config),
        "get_cfg().merge_from_file": lambda: get_cfg().merge_from_file(config),
    }
    for name, load in loaders.items():
        with pytest.raises(ConfigFileError) as error:
            load()
        message = str(error.value)
        assert message.startswith(f"config file {payload}"), (name, message)
        assert f"line 1: the yaml tag {tag} is refused" in message, (name, message)
        if how == "through _BASE_":
            assert f"a _BASE_ of {config}" in message
    assert not marker.exists()


@pytest.mark.parametrize("how", ["direct", "through _BASE_"])
@pytest.mark.parametrize("tool", TOOLS)
def test_payload_configs_are_one_line_at_every_tool(tool, how, tmp_path, capsys, no_shapes_dataset):
    marker = tmp_path / "marker"
    config = write_payload_configs(tmp_path, marker)[how]
    (tmp_path / "image.jpg").touch()
    name, argv = tool_commands(config, tmp_path)[tool]
    run_tool(name, argv, capsys, str(tmp_path / "payload.yaml"), OS_SYSTEM)
    assert not marker.exists()
    assert not (tmp_path / "run").exists() and not (tmp_path / "eval").exists()


def test_the_lazyconfig_tool_refuses_a_yaml_config(tmp_path, capsys):
    marker = tmp_path / "marker"
    config = write_payload_configs(tmp_path, marker)["direct"]
    run_tool(
        "lazyconfig_train_net", ["--config-file", config], capsys, str(config), "is a yaml config"
    )
    assert not marker.exists()


def test_a_saved_comparison_recipe_runs_nothing(tmp_path, capsys):
    """compare_recipe.yaml of an earlier run: read as plain yaml too."""
    marker = tmp_path / "marker"
    recorded = tmp_path / "cmp/conv/seed0/compare_recipe.yaml"
    recorded.parent.mkdir(parents=True)
    recorded.write_text(payload_yaml(marker))
    run_tool(
        "compare_backbones",
        [*comparison_options(tmp_path / "cmp", CONFIG), "MODEL.DEVICE", "cpu"],
        capsys,
        str(recorded),
        OS_SYSTEM,
    )
    assert not marker.exists()


def test_a_saved_demo_record_runs_nothing(tmp_path, capsys, no_shapes_dataset):
    """The demo's eval_results.json holds its run's config: read as plain yaml too."""
    marker = tmp_path / "marker"
    (tmp_path / "model_final.pth").touch()
    record = tmp_path / "eval_results.json"
    record.write_text(json.dumps({"config": payload_yaml(marker)}))
    run_tool("demo", ["--config", CONFIG, "OUTPUT_DIR", tmp_path], capsys, str(record), OS_SYSTEM)
    assert not marker.exists()


def test_saved_dumps_that_are_not_configs_are_named():
    with pytest.raises(ConfigFileError, match="saved.yaml is not a config"):
        config_differences("- a list\n", "SEED: 1\n", saved_in="saved.yaml")
    with pytest.raises(ConfigFileError, match=r"saved.yaml, line 2: the yaml tag !custom"):
        config_differences("SEED: 1\nVERSION: !custom 2\n", "SEED: 1\n", saved_in="saved.yaml")
    assert config_differences("SEED: 1\n", "SEED: 2\n") == ["SEED: 1 -> 2"]


# ---- malformed files and _BASE_ chains: one line naming the file ----

BAD_FILES = {
    # name: {file: text}, the file passed, what the one line says
    "loop": (
        {"a.yaml": "_BASE_: b.yaml\n", "b.yaml": "_BASE_: a.yaml\nSEED: 1\n"},
        "a.yaml",
        ["{a.yaml}: its _BASE_ chain {a.yaml} -> {b.yaml} -> {a.yaml} is a loop"],
    ),
    "self-reference": (
        {"self.yaml": "_BASE_: self.yaml\n"},
        "self.yaml",
        ["{self.yaml}: its _BASE_ chain {self.yaml} -> {self.yaml} is a loop"],
    ),
    "loop in a list": (
        {
            "a.yaml": "_BASE_: [ok.yaml, b.yaml]\n",
            "ok.yaml": "SEED: 1\n",
            "b.yaml": "_BASE_: [a.yaml]\n",
        },
        "a.yaml",
        ["{a.yaml} -> {b.yaml} -> {a.yaml} is a loop"],
    ),
    "empty": ({"empty.yaml": ""}, "empty.yaml", ["config file {empty.yaml} is empty"]),
    "comments only": (
        {"empty.yaml": "# nothing yet\n"},
        "empty.yaml",
        ["config file {empty.yaml} is empty"],
    ),
    "empty base": (
        {"top.yaml": "_BASE_: empty.yaml\n", "empty.yaml": ""},
        "top.yaml",
        ["config file {empty.yaml} (a _BASE_ of {top.yaml}) is empty"],
    ),
    "list": (
        {"list.yaml": "- SEED\n- 1\n"},
        "list.yaml",
        ["config file {list.yaml} holds a list, not a yaml mapping"],
    ),
    "scalar": (
        {"scalar.yaml": "SEED\n"},
        "scalar.yaml",
        ["config file {scalar.yaml} holds a single str value, not a yaml mapping"],
    ),
    "missing base": (
        {"top.yaml": "_BASE_: Base-Missing.yaml\n"},
        "top.yaml",
        ["config file {Base-Missing.yaml} (a _BASE_ of {top.yaml}) does not exist"],
    ),
    "base not a path": (
        {"top.yaml": "_BASE_: 3\n"},
        "top.yaml",
        ["config file {top.yaml}: _BASE_ is 3"],
    ),
    "yaml syntax": ({"top.yaml": "SEED: [1\n"}, "top.yaml", ["config file {top.yaml}: "]),
}


def write_files(folder: Path, files: dict) -> dict:
    paths = {}
    for name, text in files.items():
        paths[name] = folder / name
        paths[name].write_text(text)
    return paths


def expected(fragments, folder: Path) -> list:
    """The fragments with each {name.yaml} replaced by that file's path in ``folder``."""
    names = (
        "a.yaml",
        "b.yaml",
        "self.yaml",
        "empty.yaml",
        "top.yaml",
        "list.yaml",
        "scalar.yaml",
        "Base-Missing.yaml",
    )
    result = []
    for fragment in fragments:
        for name in names:
            fragment = fragment.replace("{" + name + "}", str(folder / name))
        result.append(fragment)
    return result


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_malformed_config_is_one_line_naming_the_file(case, tmp_path, capsys):
    files, passed, fragments = BAD_FILES[case]
    write_files(tmp_path, files)
    fragments = expected(fragments, tmp_path)
    with pytest.raises((ConfigFileError, FileNotFoundError)) as error:
        load_config(str(tmp_path / passed))
    for fragment in fragments:
        assert fragment in str(error.value)
    run_tool(
        "train_net",
        ["--config-file", tmp_path / passed, "OUTPUT_DIR", tmp_path / "run"],
        capsys,
        *fragments,
    )
    assert not (tmp_path / "run").exists()


def test_debug_keeps_the_traceback(tmp_path):
    (tmp_path / "self.yaml").write_text("_BASE_: self.yaml\n")
    with pytest.raises(ConfigFileError, match="is a loop"):
        train_net.main(["--config-file", str(tmp_path / "self.yaml"), "--debug"])


def test_shared_bases_and_a_base_named_twice_are_no_loop(tmp_path):
    """A diamond (two bases that share one) and a shipped _BASE_ chain load."""
    write_files(
        tmp_path,
        {
            "common.yaml": "SEED: 3\n",
            "left.yaml": "_BASE_: common.yaml\n",
            "right.yaml": "_BASE_: common.yaml\nSOLVER:\n  MAX_ITER: 7\n",
            "top.yaml": "_BASE_: [left.yaml, right.yaml]\n",
        },
    )
    cfg = load_config(str(tmp_path / "top.yaml"))
    assert (cfg.SEED, cfg.SOLVER.MAX_ITER) == (3, 7)
    assert load_config(CONFIG).MODEL.LAMBDA_RESNET.DEPTH == 26


def test_a_binary_config_is_one_line_naming_the_file(tmp_path, capsys):
    config = tmp_path / "weights.yaml"
    config.write_bytes(b"PK\x03\x04\xff\x00 a zip, passed as the config")
    with pytest.raises(
        ConfigFileError, match=f"config file {config} is not utf-8 text \\(byte 4 is 0xff"
    ):
        load_config(str(config))
    run_tool(
        "train_net",
        ["--config-file", config, "OUTPUT_DIR", tmp_path / "run"],
        capsys,
        f"config file {config} is not utf-8 text",
        "pass a yaml config",
    )
    assert not (tmp_path / "run").exists()
