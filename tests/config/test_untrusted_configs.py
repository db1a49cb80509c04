"""Users' config files: a yaml config (or a base it names, or a saved run's config) runs no code
in any tool, and a malformed one (a _BASE_ loop, an empty file, a list) is one error line that
names the file."""

import json
import time
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, comparison_options, tool_module
from detectron2.config import get_cfg as get_detectron2_cfg

import lambda_det.data
from lambda_det.cli import train_net
from lambda_det.config import ConfigFileError
from lambda_det.config.config import load_yaml_with_base
from lambda_det.config.lazy import load_lazy_config_file
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


# ---- bounds: alias bombs, deep nesting, deep _BASE_ chains, huge integers ----


def alias_bomb(indent: str = "", levels: int = 9) -> str:
    """A "billion laughs": ``levels`` levels of 10 aliases of a mapping, as yaml keys."""
    lines = [f"{indent}L0: &L0 {{A: 1, B: 2}}"]
    for level in range(1, levels + 1):
        aliases = ", ".join([f"*L{level - 1}"] * 10)
        lines.append(f"{indent}L{level}: &L{level} [{aliases}]")
    return "\n".join(lines) + "\n"


def dataset_bomb(levels: int = 9) -> str:
    """DATASETS.TEST naming lambda_det_shapes_val 9**levels times through aliases."""
    lists = ["&T0 lambda_det_shapes_val"]
    for level in range(1, levels + 1):
        lists.append(f"&T{level} [" + ", ".join([f"*T{level - 1}"] * 9) + "]")
    return "DATASETS:\n  TEST: [" + ", ".join(lists) + "]\n"


def expanded_values(value, known=None) -> int:
    """The values of a document that plain yaml read, a shared object counted each time it
    appears (as yacs and OmegaConf copy it), each object measured once."""
    known = {} if known is None else known
    if id(value) not in known:
        children = [*value, *value.values()] if isinstance(value, dict) else value
        children = children if isinstance(value, (dict, list)) else []
        known[id(value)] = 1 + sum(expanded_values(child, known) for child in children)
    return known[id(value)]


BOMBS = {
    "alias bomb": alias_bomb(),
    "alias bomb under MODEL": "MODEL:\n" + alias_bomb("  "),
    "dataset bomb": dataset_bomb(),
}
LIMIT_LINE = {
    "alias bomb": "line 5: the value here holds 51111 values",
    "alias bomb under MODEL": "line 6: the value here holds 51111 values",
    "dataset bomb": "values, each yaml alias (*name) counted as all the values it names, more "
    "than 50000",
}


def test_plain_yaml_expands_an_alias_bomb_to_billions_of_values():
    """The negative control: yaml's safe loader reads each bomb as shared objects, which the
    config's readers (yacs' CfgNode, OmegaConf, the merge) copy value by value."""
    assert expanded_values(yaml.safe_load(BOMBS["alias bomb"])) > 5 * 10**9
    assert expanded_values(yaml.safe_load(BOMBS["alias bomb under MODEL"])) > 5 * 10**9
    assert expanded_values(yaml.safe_load(BOMBS["dataset bomb"])) > 9**9


@pytest.mark.parametrize("case", BOMBS)
def test_an_alias_bomb_is_one_line_within_a_second(case, tmp_path, capsys):
    config = tmp_path / "bomb.yaml"
    config.write_text(BOMBS[case])
    start = time.perf_counter()
    with pytest.raises(ConfigFileError) as error:
        load_config(str(config))
    assert time.perf_counter() - start < 1.0
    assert str(error.value).startswith(f"config file {config}, line ")
    assert LIMIT_LINE[case] in str(error.value)
    run_tool("train_net", ["--config-file", config, "--eval-only"], capsys, LIMIT_LINE[case])


def test_a_lazyconfig_yaml_alias_bomb_is_one_line(tmp_path):
    config = tmp_path / "recipe.yaml"
    config.write_text("train:\n  seed: 1\n" + alias_bomb())
    start = time.perf_counter()
    with pytest.raises(
        ConfigFileError, match=f"LazyConfig {config}, line 7: the value here holds 51111"
    ):
        load_lazy_config_file(str(config))
    assert time.perf_counter() - start < 1.0


def test_aliases_within_the_bounds_still_load(tmp_path):
    config = tmp_path / "aliases.yaml"
    config.write_text("SOLVER:\n  STEPS: &steps [3, 5]\nTEST:\n  AUG:\n    MIN_SIZES: *steps\n")
    assert load_config(str(config)).TEST.AUG.MIN_SIZES == (3, 5)
    (tmp_path / "small.yaml").write_text(alias_bomb(levels=3))  # 1,000 mappings
    assert len(load_yaml_with_base(str(tmp_path / "small.yaml"))["L3"]) == 10


DEEP = 100_000
NESTINGS = {
    "lists": "SEED: " + "[" * DEEP + "]" * DEEP + "\n",
    "flow mappings": "MODEL: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n",
    "block mappings": "".join(f"{' ' * level}a{level}:\n" for level in range(600)),
    "an alias that holds itself": "SOLVER:\n  STEPS: &steps [1, *steps]\n",
}


@pytest.mark.parametrize("case", NESTINGS)
def test_plain_yaml_cannot_read_deep_nesting(case):
    """The negative control: yaml's recursive composer overflows Python's stack, or reads a
    value that nests without end (which every recursive reader then overflows on)."""
    try:
        value = yaml.safe_load(NESTINGS[case])
    except RecursionError:
        return
    steps = value["SOLVER"]["STEPS"]
    assert steps[1] is steps


@pytest.mark.parametrize("case", NESTINGS)
def test_deep_nesting_is_one_line_within_a_second(case, tmp_path, capsys):
    config = tmp_path / "deep.yaml"
    config.write_text(NESTINGS[case])
    start = time.perf_counter()
    with pytest.raises(ConfigFileError) as error:
        load_config(str(config))
    assert time.perf_counter() - start < 1.0
    message = str(error.value)
    assert message.startswith(f"config file {config}, line "), message
    assert "more than 32 levels deep" in message or "nests without end" in message, message
    run_tool("train_net", ["--config-file", config, "OUTPUT_DIR", tmp_path / "run"], capsys)
    assert not (tmp_path / "run").exists()


def base_chain(folder: Path, depth: int, width: int = 1) -> Path:
    """c0.yaml -> c1.yaml -> ... -> c{depth - 1}.yaml, each naming the next ``width`` times."""
    for index in range(depth):
        bases = ", ".join([f"c{index + 1}.yaml"] * width) if index + 1 < depth else ""
        (folder / f"c{index}.yaml").write_text(f"_BASE_: [{bases}]\n" if bases else "SEED: 1\n")
    return folder / "c0.yaml"


def test_fvcore_overflows_on_a_deep_base_chain(tmp_path):
    """The negative control: fvcore's own _BASE_ reader, which detectron2's CfgNode uses."""
    with pytest.raises(RecursionError):
        get_detectron2_cfg().load_yaml_with_base(str(base_chain(tmp_path, 1500)))


@pytest.mark.parametrize(
    "depth,width,fragment",
    [
        (1500, 1, "its _BASE_ chain is more than 16 files deep"),
        (10, 2, "it and its _BASE_ files are more than 32 files to read"),
    ],
)
def test_a_deep_or_wide_base_chain_is_one_line(tmp_path, capsys, depth, width, fragment):
    top = base_chain(tmp_path, depth, width)
    start = time.perf_counter()
    with pytest.raises(ConfigFileError) as error:
        load_config(str(top))
    assert time.perf_counter() - start < 1.0
    assert str(error.value).startswith(f"config file {top}: {fragment}"), str(error.value)
    run_tool("train_net", ["--config-file", top, "OUTPUT_DIR", tmp_path / "run"], capsys, fragment)


def test_a_chain_within_the_bounds_loads(tmp_path):
    assert load_config(str(base_chain(tmp_path, 15))).SEED == 1  # 15 deep
    (tmp_path / "wide").mkdir()
    assert load_config(str(base_chain(tmp_path / "wide", 4, width=2))).SEED == 1  # 15 files


INTEGERS = {
    "hexadecimal": ("0x" + "f" * 100_000, "(100002 characters)"),
    "decimal": ("1" * 5000, "(5000 characters)"),
    "sexagesimal": (":".join(["59"] * 600), "(1068 digits)"),
    "just past the bound": ("0x" + "f" * 900, "(1084 digits)"),
}


def test_plain_yaml_reads_huge_integers_or_fails_with_a_traceback():
    """The negative control: a 400,000-bit SEED, and Python's ValueError past 4,300 digits."""
    assert yaml.safe_load("SEED: " + INTEGERS["hexadecimal"][0])["SEED"].bit_length() == 400_000
    with pytest.raises(ValueError, match="Exceeds the limit"):
        yaml.safe_load("SEED: " + INTEGERS["decimal"][0])


@pytest.mark.parametrize("case", INTEGERS)
def test_a_huge_integer_is_one_line(case, tmp_path):
    text, size = INTEGERS[case]
    config = tmp_path / "seed.yaml"
    config.write_text(f"SOLVER:\n  MAX_ITER: 5\nSEED: {text}\n")
    with pytest.raises(
        ConfigFileError,
        match=rf"config file {config}, line 3: the integer is too large \({size[1:-1]}\): a "
        "config's integers have at most 1000 digits",
    ):
        load_config(str(config))
