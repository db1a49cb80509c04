"""tools/compare_backbones.py: variants, the aggregation over seeds, the report files (its own
replaced, a user's never), reuse of finished runs and continuation of interrupted ones."""

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    REPO_ROOT,
    TINY_EVALUATED_RUN,
    assert_one_line_error,
    comparison_options,
    exit_status,
    overrides,
    subprocess_env,
)

from lambda_det.cli import compare_backbones
from lambda_det.cli.comparison import (
    RECIPE_FILE,
    RunFailedError,
    RunInterrupted,
    Variant,
    parse_variant,
    plan_comparison,
    run_comparison,
    train_command,
    variant_presets,
)
from lambda_det.cli.interrupts import TRAIN_NET
from lambda_det.cli.output_dir import read_record, record_outputs
from lambda_det.reports.compare_report import (
    REPORT_FILES,
    format_comparison,
    mean_std,
    median_iteration_time,
    read_difference,
    summarize,
    write_report,
)
from lambda_det.run_config import load_config

METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_run(folder: Path, bbox: dict, segm: dict, times=()) -> str:
    """A run folder as train_net.py leaves it: eval_results.json and metrics.json."""
    folder.mkdir(parents=True, exist_ok=True)
    record = {"config": "", "results": {"bbox": bbox, "segm": segm}}
    (folder / "eval_results.json").write_text(json.dumps(record))
    lines = [
        json.dumps({"iteration": i, "time": t, "total_loss": 1.0}) for i, t in enumerate(times)
    ]
    (folder / "metrics.json").write_text("\n".join(lines + [json.dumps(bbox)[:20]]) + "\n")
    return str(folder)


def metrics(ap: float) -> dict:
    """AP as given, the other metrics at fixed offsets from it."""
    return {metric: ap + offset for offset, metric in enumerate(METRICS)}


def fabricated_comparison(tmp_path):
    runs = {
        "conv": {
            0: fake_run(tmp_path / "conv/seed0", metrics(40.0), metrics(30.0), [1.0, 3.0, 2.0]),
            1: fake_run(tmp_path / "conv/seed1", metrics(42.0), metrics(34.0), [4.0, 6.0]),
        },
        "lambda": {
            0: fake_run(tmp_path / "lambda/seed0", metrics(43.0), metrics(31.0), [2.0]),
            1: fake_run(tmp_path / "lambda/seed1", metrics(44.0), metrics(33.0), [2.0]),
        },
    }
    parameters = {
        "conv": {"parameters": 2_000_000, "backbone_parameters": 1_500_000},
        "lambda": {"parameters": 1_800_000, "backbone_parameters": 1_300_000},
    }
    presets = variant_presets()
    overrides = {"conv": presets["conv"], "lambda": presets["lambda"]}
    return summarize(
        runs,
        "conv",
        parameters,
        overrides,
        recipe={"config": "lambda_r26_shapes.yaml", "overrides": []},
    )


def test_parse_variant_presets_and_definitions():
    assert parse_variant("conv") == Variant("conv", ("MODEL.LAMBDA_RESNET.PLACEMENT", "none"))
    assert parse_variant("se").overrides == (
        "MODEL.LAMBDA_RESNET.PLACEMENT",
        "none",
        "MODEL.LAMBDA_RESNET.SE",
        "True",
    )
    assert parse_variant("aft_conv").overrides == ("MODEL.LAMBDA_RESNET.MIXER", "aft_conv")
    # Short and full keys; a list value keeps its commas.
    assert parse_variant("k8:DIM_K=8,MODEL.LAMBDA_RESNET.OUT_FEATURES=['res4', 'res5']") == Variant(
        "k8",
        ("MODEL.LAMBDA_RESNET.DIM_K", "8", "MODEL.LAMBDA_RESNET.OUT_FEATURES", "['res4', 'res5']"),
    )
    assert parse_variant("base:") == Variant("base", ())
    # A key of a mixer's node is short too.
    assert parse_variant("h4:MIXER=aft_conv,AFT_CONV.HEADS=4").overrides == (
        "MODEL.LAMBDA_RESNET.MIXER",
        "aft_conv",
        "MODEL.LAMBDA_RESNET.AFT_CONV.HEADS",
        "4",
    )


def test_every_registered_mixer_is_a_variant_and_the_conv_baselines_come_first():
    from lambda_det.modeling import register_mixer, unregister_mixer
    from lambda_det.modeling.mixers import ConvMixer

    assert list(variant_presets()) == ["conv", "se", "lambda", "aft_conv"]
    register_mixer("conv2")(ConvMixer)
    try:
        assert parse_variant("conv2") == Variant("conv2", ("MODEL.LAMBDA_RESNET.MIXER", "conv2"))
    finally:
        unregister_mixer("conv2")
    with pytest.raises(
        ValueError,
        match="unknown variant 'conv2': name one of conv, se, lambda, aft_conv, or define it",
    ):
        parse_variant("conv2")


@pytest.mark.parametrize(
    "spec, words",
    [
        ("nope", "unknown variant 'nope'"),
        ("lr:SOLVER.BASE_LR=0.1", "only MODEL.LAMBDA_RESNET.* keys"),
        ("k8:DIM_K", "is not KEY=VALUE"),
        ("a/b:DIM_K=8", "names a folder"),
    ],
)
def test_parse_variant_rejects_bad_specs(spec, words):
    with pytest.raises(ValueError, match=words.replace("*", r"\*").replace("(", r"\(")):
        parse_variant(spec)


def test_aggregation_matches_hand_computed_means_spreads_and_differences(tmp_path):
    summary = fabricated_comparison(tmp_path)
    conv, lam = summary["variants"]["conv"], summary["variants"]["lambda"]
    assert summary["seeds"] == [0, 1] and summary["tasks"] == ["bbox", "segm"]
    # box AP: conv 40, 42 -> 41 ± sqrt(2); lambda 43, 44 -> 43.5 ± sqrt(0.5).
    assert conv["results"]["bbox"]["AP"]["mean"] == pytest.approx(41.0)
    assert conv["results"]["bbox"]["AP"]["std"] == pytest.approx(math.sqrt(2))
    assert lam["results"]["bbox"]["AP"]["mean"] == pytest.approx(43.5)
    assert lam["results"]["bbox"]["AP"]["std"] == pytest.approx(math.sqrt(0.5))
    assert lam["results"]["bbox"]["APl"]["mean"] == pytest.approx(48.5)  # offset 5
    # Paired per seed: box AP differences 3, 2 -> 2.5 ± sqrt(0.5), beyond the spread.
    box = lam["difference"]["bbox"]["AP"]
    assert box["per_seed"] == {"0": 3.0, "1": 2.0}
    assert box["mean"] == pytest.approx(2.5) and box["std"] == pytest.approx(math.sqrt(0.5))
    assert box["reading"] == "above the baseline, beyond the spread"
    # mask AP differences +1, -1 -> 0 ± sqrt(2): within the spread, whatever the means say.
    mask = lam["difference"]["segm"]["AP"]
    assert mask["mean"] == pytest.approx(0.0) and mask["std"] == pytest.approx(math.sqrt(2))
    assert mask["reading"] == "within the seed-to-seed spread"
    assert conv["difference"] == {}
    # Time: per run the median of metrics.json's "time" (2.0 and 5.0), then over seeds.
    assert conv["seconds_per_iteration"]["per_seed"] == {"0": 2.0, "1": 5.0}
    assert conv["seconds_per_iteration"]["mean"] == pytest.approx(3.5)
    assert conv["seconds_per_iteration"]["std"] == pytest.approx(math.sqrt(4.5))
    assert conv["parameters"] == 2_000_000
    markdown = format_comparison(summary)
    assert "| conv | PLACEMENT=none | 2.00 | 1.50 | 3.50 ± 2.12 |" in markdown
    assert "| conv | 41.0 ± 1.4 | 42.0 ± 1.4 |" in markdown
    assert "| lambda | box | +2.5 ± 0.7 |" in markdown
    assert "| lambda | mask | +0.0 ± 1.4 |" in markdown
    # The words: which differences exceed the spread, and that the others do not rank.
    assert "Beyond the spread (|mean| > std): box AP +2.5 ± 0.7" in markdown
    assert "differences are within the seed-to-seed spread" in markdown


def test_one_seed_is_not_a_ranking(tmp_path):
    runs = {
        "conv": {3: fake_run(tmp_path / "c", metrics(40.0), metrics(30.0))},
        "lambda": {3: fake_run(tmp_path / "l", metrics(45.0), metrics(35.0))},
    }
    summary = summarize(runs, "conv", {}, {}, recipe={"config": "x"})
    difference = summary["variants"]["lambda"]["difference"]["bbox"]["AP"]
    assert difference["std"] is None
    assert difference["reading"] == "one seed: no spread, not a ranking"
    markdown = format_comparison(summary)
    assert "one seed: no spread, not a ranking" in markdown
    assert "| lambda | 45.0 | 46.0 |" in markdown  # no ± without a spread
    assert "beyond the spread" not in markdown


def test_every_difference_within_the_spread_says_so(tmp_path):
    runs = {
        "conv": {
            0: fake_run(tmp_path / "c0", metrics(40.0), metrics(30.0)),
            1: fake_run(tmp_path / "c1", metrics(42.0), metrics(32.0)),
        },
        "se": {
            0: fake_run(tmp_path / "s0", metrics(41.0), metrics(31.0)),
            1: fake_run(tmp_path / "s1", metrics(41.0), metrics(31.0)),
        },
    }
    markdown = format_comparison(summarize(runs, "conv", {}, {}, recipe={"config": "x"}))
    assert "Every difference is within the seed-to-seed spread" in markdown
    assert "do not rank se and conv" in markdown


NO_PREDICTIONS = {metric: math.nan for metric in METRICS}  # detectron2's box results, no "segm"


def test_a_run_without_predictions_is_named_and_left_out_of_the_means(tmp_path):
    runs = {
        "conv": {
            s: fake_run(tmp_path / f"c{s}", metrics(40.0 + s), metrics(30.0 + s)) for s in (0, 1, 2)
        },
        "lambda": {
            0: fake_run(tmp_path / "l0", metrics(43.0), metrics(31.0)),
            2: fake_run(tmp_path / "l2", metrics(47.0), metrics(35.0)),
        },
    }
    folder = tmp_path / "l1"
    folder.mkdir()
    (folder / "eval_results.json").write_text(
        json.dumps({"config": "", "results": {"bbox": NO_PREDICTIONS}})
    )
    runs["lambda"][1] = str(folder)
    summary = summarize(runs, "conv", {}, {}, recipe={"config": "x"})
    assert summary["tasks"] == ["bbox", "segm"]  # the run without masks keeps every section
    assert summary["left_out"] == [
        {"variant": "lambda", "seed": 1, "task": "bbox", "run": str(folder)},
        {"variant": "lambda", "seed": 1, "task": "segm", "run": str(folder)},
    ]
    lam = summary["variants"]["lambda"]
    box = lam["results"]["bbox"]["AP"]  # 43 and 47: the NaN run does not turn it into NaN
    assert (box["mean"], box["n"], box["of"]) == (45.0, 2, 3)
    assert box["std"] == pytest.approx(math.sqrt(8))
    assert lam["results"]["segm"]["AP"]["mean"] == 33.0
    assert summary["variants"]["conv"]["results"]["segm"]["AP"]["n"] == 3
    # Paired differences only where both runs have AP: seeds 0 (+3) and 2 (+5).
    difference = lam["difference"]["bbox"]["AP"]
    assert (difference["mean"], difference["n"]) == (4.0, 2)
    assert math.isnan(difference["per_seed"]["1"])
    markdown = format_comparison(summary)
    assert "## Mask AP" in markdown
    assert "| lambda | 45.0 ± 2.8 (n=2 of 3) | 46.0 ± 2.8 (n=2 of 3) |" in markdown
    assert "| conv | 41.0 ± 1.0 | 42.0 ± 1.0 |" in markdown
    assert f"- lambda seed 1: no box or mask AP (`{folder}`)" in markdown
    assert "box AP +4.0 ± 1.4 (n=2 of 3)" in markdown
    _, data, _ = write_report(summary, str(tmp_path / "report"))
    loaded = json.loads(Path(data).read_text(), parse_constant=pytest.fail)
    assert loaded["variants"]["lambda"]["results"]["bbox"]["AP"]["per_seed"]["1"] is None


def readings(tmp_path, conv: dict, other: dict) -> str:
    """The reading sentence of ``other`` vs ``conv``: seed -> (box results, mask results)."""
    runs = {
        name: {
            seed: fake_run(tmp_path / f"{name}{seed}", *results)
            for seed, results in by_seed.items()
        }
        for name, by_seed in (("conv", conv), ("other", other))
    }
    markdown = format_comparison(summarize(runs, "conv", {}, {}, recipe={"config": "x"}))
    return markdown.split("## Reading\n\n")[1].splitlines()[0]


def test_the_reading_says_within_the_spread_only_when_each_difference_is(tmp_path):
    conv = {0: (metrics(40.0), metrics(30.0)), 1: (metrics(42.0), metrics(32.0))}
    other = {0: (metrics(41.0), metrics(31.0)), 1: (metrics(41.0), metrics(31.0))}
    assert "Every difference is within the seed-to-seed spread" in readings(
        tmp_path / "a", conv, other
    )
    # The same numbers with APs NaN everywhere (no small objects): 10 within, 2 no value.
    conv_nan = {s: ({**b, "APs": math.nan}, {**m, "APs": math.nan}) for s, (b, m) in conv.items()}
    other_nan = {s: ({**b, "APs": math.nan}, {**m, "APs": math.nan}) for s, (b, m) in other.items()}
    sentence = readings(tmp_path / "b", conv_nan, other_nan)
    assert "Every difference" not in sentence
    assert (
        "No difference is beyond the spread: 10 are within the seed-to-seed spread; 2 have "
        "no value, no seed having both runs' AP: box APs, mask APs; these runs do not rank "
        "other and conv."
    ) in sentence
    # Three seeds, two of them without predictions: one pair left, no spread.
    conv3 = {**conv, 2: (metrics(41.0), metrics(31.0))}
    other3 = {0: (metrics(45.0), metrics(35.0)), 1: (NO_PREDICTIONS, {}), 2: (NO_PREDICTIONS, {})}
    sentence = readings(tmp_path / "c", conv3, other3)
    assert "Every difference" not in sentence
    assert "box AP +5.0 (n=1 of 3), mask AP +5.0 (n=1 of 3)" in sentence
    assert (
        "No difference is beyond the spread: all 12 rest on one seed pair (no spread); "
        "these runs do not rank other and conv." in sentence
    )


def test_mean_std_leaves_out_values_that_are_not_numbers():
    assert mean_std([1.0, math.nan, 3.0, None]) == {"mean": 2.0, "std": math.sqrt(2), "n": 2}
    assert mean_std([5.0, math.nan]) == {"mean": 5.0, "std": None, "n": 1}
    empty = mean_std([math.nan])
    assert math.isnan(empty["mean"]) and (empty["std"], empty["n"]) == (None, 0)
    assert read_difference(math.nan, None) == "no value: no seed has it for both variants"
    assert read_difference(2.0, None) == "one seed: no spread, not a ranking"


def test_median_iteration_time_skips_a_truncated_line_and_missing_times(tmp_path):
    fake_run(tmp_path / "a", metrics(1.0), metrics(1.0), [5.0, 1.0, 3.0, 2.0])
    assert median_iteration_time(str(tmp_path / "a")) == 2.5
    fake_run(tmp_path / "b", metrics(1.0), metrics(1.0))
    assert median_iteration_time(str(tmp_path / "b")) is None


def test_report_files(tmp_path):
    summary = fabricated_comparison(tmp_path / "runs")
    markdown, data, chart = map(Path, write_report(summary, str(tmp_path / "report")))
    assert markdown.read_text() == format_comparison(summary)
    assert json.loads(data.read_text())["variants"]["lambda"]["difference"]["bbox"]["AP"][
        "mean"
    ] == pytest.approx(2.5)
    assert chart.read_bytes().startswith(PNG_MAGIC) and chart.stat().st_size > 10_000
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == [
        "comparison.json",
        "comparison.md",
        "comparison.png",
    ]  # no temporary files left


def test_nan_is_null_in_the_json_file(tmp_path):
    nan_small = {**metrics(40.0), "APs": math.nan}
    runs = {
        "conv": {0: fake_run(tmp_path / "c", nan_small, nan_small)},
        "lambda": {0: fake_run(tmp_path / "l", nan_small, nan_small)},
    }
    summary = summarize(runs, "conv", {}, {}, recipe={"config": "x"})
    _, data, _ = write_report(summary, str(tmp_path / "report"))
    loaded = json.loads(Path(data).read_text(), parse_constant=pytest.fail)
    assert loaded["variants"]["lambda"]["difference"]["bbox"]["APs"]["mean"] is None
    assert "| conv | 40.0 | 41.0 | 42.0 | nan |" in format_comparison(summary)


def test_summary_needs_the_same_seeds_for_every_variant(tmp_path):
    runs = {
        "conv": {0: fake_run(tmp_path / "c", metrics(1.0), metrics(1.0))},
        "lambda": {1: fake_run(tmp_path / "l", metrics(1.0), metrics(1.0))},
    }
    with pytest.raises(ValueError, match="every variant needs the same seeds"):
        summarize(runs, "conv", {}, {}, recipe={})


# Planning: everything checked before a run starts.


def plan(tmp_path, variants=("conv", "lambda"), seeds=(0, 1), opts=(), config="lambda_r26_shapes"):
    return plan_comparison(
        config, list(opts), [parse_variant(v) for v in variants], list(seeds), str(tmp_path / "cmp")
    )


def test_plan_lays_out_one_folder_per_pair_and_counts_parameters(tmp_path):
    comparison = plan(tmp_path, variants=("conv", "se", "lambda"))
    assert [
        (r.variant.name, r.seed, r.folder.relative_to(tmp_path / "cmp").as_posix())
        for r in comparison.runs
    ] == [
        ("conv", 0, "conv/seed0"),
        ("conv", 1, "conv/seed1"),
        ("se", 0, "se/seed0"),
        ("se", 1, "se/seed1"),
        ("lambda", 0, "lambda/seed0"),
        ("lambda", 1, "lambda/seed1"),
    ]
    assert comparison.runs[1].opts[-4:] == (
        "SEED",
        "1",
        "OUTPUT_DIR",
        str(tmp_path / "cmp/conv/seed1"),
    )
    counts = comparison.parameters
    # SE adds parameters to the conv twin; the lambda backbone has fewer than the conv twin.
    assert counts["se"]["backbone_parameters"] > counts["conv"]["backbone_parameters"]
    assert counts["lambda"]["backbone_parameters"] < counts["conv"]["backbone_parameters"]
    for count in counts.values():
        assert 0 < count["backbone_parameters"] < count["parameters"]


def test_the_plan_loads_the_config_once_per_variant(tmp_path, monkeypatch):
    """Each seed's run is the variant's config with its SEED and OUTPUT_DIR: the recipe each
    folder records is the config its child loads from the run's overrides."""
    from lambda_det.cli import comparison

    loads = []

    def counted(*args, **kwargs):
        loads.append(args)
        return load_config(*args, **kwargs)

    with monkeypatch.context() as counting:
        counting.setattr(comparison, "load_config", counted)
        comparison = plan(tmp_path, variants=("conv", "se", "lambda"), seeds=(0, 1, 2))
    assert len(loads) == 3
    for run in comparison.runs:
        cfg = load_config(comparison.config_file, run.opts, freeze=False)
        assert (cfg.SEED, cfg.OUTPUT_DIR) == (run.seed, str(run.folder))
        cfg.OUTPUT_DIR = ""
        assert run.recipe == cfg.dump()


def test_coco_datasets_named_on_the_command_line_reach_every_run(tmp_path, datasets_root):
    shapes = datasets_root / "lambda_det_shapes_v1"
    triple = ["OWN_SHAPES", str(shapes / "train.json"), str(shapes / "train")]
    options = ["--config", "lambda_r26_shapes", "--coco-dataset", *triple, "--seeds", "0", "1"]
    own = ["DATASETS.TRAIN", "('OWN_SHAPES',)", "DATASETS.TEST", "('OWN_SHAPES',)"]
    split, opts = compare_backbones.split_overrides([*options, *own])
    assert split == options  # the upper-case NAME is not a config key
    comparison = plan_comparison(
        "lambda_r26_shapes",
        opts,
        [parse_variant("conv"), parse_variant("lambda")],
        [0, 1],
        str(tmp_path / "cmp"),
        coco_datasets=[triple],
    )
    for run in comparison.runs:
        cfg = load_config("lambda_r26_shapes", run.opts)
        assert [list(entry) for entry in cfg.DATASETS.COCO_INSTANCES] == [triple]
        assert tuple(cfg.DATASETS.TEST) == ("OWN_SHAPES",)
        command = train_command(TRAIN_NET, comparison, run)
        assert "DATASETS.COCO_INSTANCES" in command and str(shapes / "train.json") in " ".join(
            command
        )


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(config="r101_mask_rcnn"), "variants 'conv' and 'lambda' train the same model"),
        (dict(opts=["SEED", "3"]), "SEED is set per run"),
        (dict(seeds=(1, 1)), "seeds repeat"),
        (dict(seeds=(-1,)), "seed -1 is not an integer >= 0"),
        (dict(opts=["DATASETS.TEST", "()"]), "DATASETS.TEST is empty"),
        (dict(opts=["MODEL.LAMBDA_RESNET.DEPTH", "27"]), "depth must be one of"),
        (
            dict(opts=["MODEL.LAMBDA_RESNET.DEPHT", "26"]),
            "MODEL.LAMBDA_RESNET.DEPHT .* did you mean MODEL.LAMBDA_RESNET.DEPTH?",
        ),
    ],
)
def test_plan_rejects_bad_input(tmp_path, kwargs, words):
    with pytest.raises(ValueError, match=words):
        plan(tmp_path, **kwargs)


def test_plan_refuses_a_folder_of_another_recipe_or_not_made_by_it(tmp_path):
    comparison = plan(tmp_path)
    run = comparison.runs[0]
    run.folder.mkdir(parents=True)
    (run.folder / RECIPE_FILE).write_text(run.recipe)
    (run.folder / "model_final.pth").write_text("the user's weights")
    plan(tmp_path)  # the same recipe: fine
    with pytest.raises(
        ValueError,
        match=r"holds a conv run of another config \(SOLVER.BASE_LR: "
        r"0.04 -> 0.02\)",
    ):
        plan(tmp_path, opts=["SOLVER.BASE_LR", "0.02"])
    (run.folder / RECIPE_FILE).unlink()
    with pytest.raises(FileExistsError, match="not a run of this comparison"):
        plan(tmp_path)
    assert (run.folder / "model_final.pth").read_text() == "the user's weights"


FAKE_TRAIN_NET = textwrap.dedent("""
    # Stands in for tools/train_net.py: records its arguments, writes eval_results.json.
    import json, os, sys
    args = sys.argv[1:]
    output = args[args.index("OUTPUT_DIR") + 1]
    with open(os.environ["CALLS"], "a") as f:
        f.write(json.dumps(args) + "\\n")
    ap = float(args[args.index("SEED") + 1])
    metrics = {m: ap for m in ("AP", "AP50", "AP75", "APs", "APm", "APl")}
    with open(os.path.join(output, "eval_results.json"), "w") as f:
        json.dump({"config": "", "results": {"bbox": metrics, "segm": metrics}}, f)
""")


@pytest.mark.slow
def test_run_trains_new_pairs_continues_interrupted_ones_and_reuses_finished_ones(
    tmp_path, monkeypatch
):
    calls, train_net = tmp_path / "calls.jsonl", tmp_path / "train_net.py"
    train_net.write_text(FAKE_TRAIN_NET)
    monkeypatch.setenv("CALLS", str(calls))
    comparison = plan(tmp_path)
    finished, interrupted = comparison.runs[0], comparison.runs[1]
    for run in (finished, interrupted):
        run.folder.mkdir(parents=True)
        (run.folder / RECIPE_FILE).write_text(run.recipe)
    fake_run(finished.folder, metrics(1.0), metrics(1.0))
    (interrupted.folder / "last_checkpoint").write_text("model_0000099.pth")
    (interrupted.folder / "model_0000099.pth").write_bytes(b"")  # what it points at
    lines = []
    run_comparison(plan(tmp_path), [sys.executable, str(train_net)], num_gpus=2, log=lines.append)
    assert lines[0] == f"[1/4] conv seed 0: finished, reusing {finished.folder}"
    assert lines[1].startswith(
        f"[2/4] conv seed 1: continuing from its last checkpoint in {interrupted.folder}"
    )
    assert lines[2].startswith("[3/4] lambda seed 0: training in")
    called = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [c[c.index("OUTPUT_DIR") + 1] for c in called] == [
        str(r.folder) for r in comparison.runs[1:]
    ]
    for args, start in zip(called, ["--resume", "--restart", "--restart"]):
        # --resume continues the interrupted run; new ones start with --restart, which also
        # moves aside what a run killed before its first checkpoint left.
        assert args[:2] == ["--config-file", str(REPO_ROOT / "configs/Demo/lambda_r26_shapes.yaml")]
        assert args[2:5] == ["--num-gpus", "2", start]
    assert "MODEL.LAMBDA_RESNET.PLACEMENT" in called[0] and "MODEL.LAMBDA_RESNET.MIXER" in called[1]
    for run in comparison.runs:
        assert (run.folder / RECIPE_FILE).read_text() == run.recipe
    # A second invocation trains nothing.
    lines.clear()
    run_comparison(plan(tmp_path), [sys.executable, str(train_net)], log=lines.append)
    assert len(calls.read_text().splitlines()) == 3
    assert all("finished, reusing" in line for line in lines) and len(lines) == 4


def finished_comparison(tmp_path) -> list:
    """compare_backbones' options for a comparison of two variants whose runs are finished
    (reused: nothing trains), into tmp_path/cmp."""
    for run in plan(tmp_path, seeds=(0,)).runs:
        run.folder.mkdir(parents=True)
        (run.folder / RECIPE_FILE).write_text(run.recipe)
        fake_run(run.folder, metrics(40.0), metrics(30.0), [1.0])
    return comparison_options(tmp_path / "cmp")


def hashes(folder: Path) -> dict:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_the_comparison_replaces_its_own_report_and_only_that(tmp_path, capsys, monkeypatch):
    options = finished_comparison(tmp_path)
    output = tmp_path / "cmp"
    assert compare_backbones.main(options) == 0
    assert set(read_record(output)["files"]) == set(REPORT_FILES)
    (output / "comparison.md").write_text("stale")  # as if an earlier, other report
    record_outputs(output, ["comparison.md"])
    assert compare_backbones.main(options) == 0  # run again: its own report is replaced
    assert (output / "comparison.md").read_text() != "stale"
    # A user's file of a report's name stops it before anything is planned.
    (output / "comparison.json").write_text('{"the user\'s": 1}')
    before = hashes(tmp_path)
    with monkeypatch.context() as planning:
        planning.setattr(compare_backbones, "plan_comparison", pytest.fail)
        status, stderr = exit_status(compare_backbones.main, options, capsys)
    assert_one_line_error(
        status,
        stderr,
        f"--output '{output}' holds comparison.json, which the comparison did not write",
        "move it away, or pass another --output",
    )
    assert hashes(tmp_path) == before
    # The negative control: without the check, the report replaces the user's file.
    monkeypatch.setattr(compare_backbones, "check_tool_outputs", lambda *args: None)
    assert compare_backbones.main(options) == 0
    assert (output / "comparison.json").read_text() != '{"the user\'s": 1}'


def test_a_failed_run_stops_the_comparison_with_one_line(tmp_path, capsys):
    train_net = tmp_path / "train_net.py"
    train_net.write_text("import sys; print('error: bad dataset', file=sys.stderr); sys.exit(2)")
    compare = compare_backbones
    comparison = plan(tmp_path)
    with pytest.raises(RunFailedError, match=r"conv seed 0 failed \(exit status 2\)"):
        run_comparison(comparison, [sys.executable, str(train_net)], log=lambda line: None)
    assert capsys.readouterr().err == "error: bad dataset\n"  # the child's own line, shown
    # The CLI: a mistake in the input is one line and status 2, before anything trains.
    with pytest.raises(SystemExit) as exit_info:
        compare.main(
            [
                "--config",
                "lambda_r26_shapes",
                "--variant",
                "conv",
                "lamda",
                "--output",
                str(tmp_path / "cli"),
            ]
        )
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: unknown variant 'lamda': name one of conv, se, lambda, aft_conv, or define it as "
        "NAME:KEY=VALUE,KEY=VALUE (e.g. k8:DIM_K=8)"
    ]
    assert not (tmp_path / "cli").exists()


FAKE_INTERRUPTED_RUN = textwrap.dedent("""
    # Stands in for a train_net.py run that Ctrl-C stops: a warning, a checkpoint, training.
    import os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground
    output = sys.argv[sys.argv.index("OUTPUT_DIR") + 1]
    print("a warning before the interrupt", file=sys.stderr, flush=True)
    with open(os.path.join(output, "last_checkpoint"), "w") as f:
        f.write("model_0000001.pth")
    with open(os.path.join(output, "pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(output, "pid.tmp"), os.path.join(output, "pid"))
    time.sleep(120)
""")


@pytest.mark.slow
def test_ctrl_c_names_the_run_without_the_childs_traceback(tmp_path, capfd):
    # A shell's background job ignores SIGINT, and pytest would inherit that: Ctrl-C as a
    # terminal delivers it needs Python's own handler.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_names_the_run(tmp_path, capfd)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_names_the_run(tmp_path, capfd):
    train_net = tmp_path / "train_net.py"
    train_net.write_text(FAKE_INTERRUPTED_RUN)
    comparison = plan(tmp_path)
    pid_file = comparison.runs[0].folder / "pid"

    def press_ctrl_c():
        """As a terminal does: the child and this process get SIGINT (the child first)."""
        deadline = time.monotonic() + 60
        while not pid_file.is_file():
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        time.sleep(1.0)  # the warning reaches stderr
        os.kill(int(pid_file.read_text()), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c)
    presser.start()
    with pytest.raises(RunInterrupted) as info:
        run_comparison(comparison, [sys.executable, str(train_net)], log=lambda line: None)
    presser.join()
    assert str(info.value) == (
        f"conv seed 0 in {comparison.runs[0].folder}: the same command continues the "
        f"comparison (it resumes from model_0000001.pth; finished runs are reused)"
    )
    with pytest.raises(ProcessLookupError):  # the child has ended
        os.kill(int(pid_file.read_text()), 0)
    err = capfd.readouterr().err
    assert "a warning before the interrupt" in err  # the child's stderr passes through
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_the_tool_reports_an_interrupted_run_in_one_line(tmp_path, monkeypatch, capsys):
    compare = compare_backbones

    def interrupted(comparison, *args, **kwargs):
        raise RunInterrupted("conv seed 0 in OUT: the same command continues the comparison")

    monkeypatch.setattr(compare, "run_comparison", interrupted)
    assert compare.main(comparison_options(tmp_path / "cmp")) == 130
    assert capsys.readouterr().err.splitlines() == [
        "interrupted conv seed 0 in OUT: the same command continues the comparison"
    ]


def test_overrides_may_follow_list_options():
    compare = compare_backbones
    assert compare.split_overrides(
        [
            "--config",
            "x",
            "--seeds",
            "0",
            "1",
            "MODEL.DEVICE",
            "cpu",
            "--output",
            "OUT",
            "SOLVER.MAX_ITER",
            "4",
            "--variant",
            "conv",
            "k8:DIM_K=8",
        ]
    ) == (
        [
            "--config",
            "x",
            "--seeds",
            "0",
            "1",
            "--output",
            "OUT",
            "--variant",
            "conv",
            "k8:DIM_K=8",
        ],
        ["MODEL.DEVICE", "cpu", "SOLVER.MAX_ITER", "4"],
    )


# End to end, with real trainings: conftest's evaluated run (4 iterations), checkpointed and logged
# at each, its 8 validation images at 128 px.
TINY = [
    *TINY_EVALUATED_RUN,
    *overrides(
        {
            "SOLVER.CHECKPOINT_PERIOD": "1",
            "SOLVER.LOG_PERIOD": "1",
            "INPUT.LSJ.IMAGE_SIZE": "128",
            "INPUT.MIN_SIZE_TEST": "128",
            "INPUT.MAX_SIZE_TEST": "128",
        }
    ),
]


def compare_command(output: Path, datasets_root: Path):
    """The comparison of the small shapes data, named on the command line as a user's own
    COCO-format dataset."""
    data = datasets_root / "lambda_det_shapes_v1"
    return [
        sys.executable,
        str(REPO_ROOT / "tools/compare_backbones.py"),
        "--config",
        "lambda_r26_shapes",
        "--variant",
        "conv",
        "lambda",
        "--seeds",
        "0",
        "1",
        *TINY,
        "--coco-dataset",
        "own_train",
        str(data / "train.json"),
        str(data / "train"),
        "--coco-dataset",
        "own_val",
        str(data / "val.json"),
        str(data / "val"),
        "DATASETS.TRAIN",
        "('own_train',)",
        "DATASETS.TEST",
        "('own_val',)",
        "--output",
        str(output),
    ]


@pytest.mark.slow
@pytest.mark.timeout(1500)  # five tiny trainings and evaluations: 6 minutes on 2 busy cores
@pytest.mark.e2e
def test_compare_backbones_end_to_end_with_an_interruption(
    tmp_path, small_datasets_root, monkeypatch, capsys
):
    """tools/compare_backbones.py as a child process, killed; then its main() in this process
    continues the comparison and reuses it (the trainings are child processes either way)."""
    env = subprocess_env()
    env["DETECTRON2_DATASETS"] = str(small_datasets_root)
    monkeypatch.setenv("DETECTRON2_DATASETS", str(small_datasets_root))  # for the trainings
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    output = tmp_path / "cmp"
    command = compare_command(output, small_datasets_root)
    first = output / "conv/seed0"
    # Interrupt the first pair after its first checkpoint (iteration 1 of 4).
    process = subprocess.Popen(
        command,
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not (first / "last_checkpoint").is_file() and process.poll() is None:
        assert time.monotonic() < deadline, "the first run wrote no checkpoint"
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (first / "eval_results.json").exists(), "the run ended before the kill"
    assert not (output / "lambda").exists()

    assert compare_backbones.main(command[2:]) == 0
    stdout = capsys.readouterr().out
    assert "[1/4] conv seed 0: continuing from its last checkpoint" in stdout
    starts = [
        line.rsplit(" ", 1)[1]
        for line in (first / "log.txt").read_text().splitlines()
        if "Starting training from iteration" in line
    ]
    assert starts[0] == "0" and len(starts) == 2 and int(starts[1]) > 0, starts

    # The report agrees with the runs' own eval_results.json.
    summary = json.loads((output / "comparison.json").read_text())
    assert summary["seeds"] == [0, 1] and list(summary["variants"]) == ["conv", "lambda"]
    per_run = {
        (v, s): json.loads((output / v / f"seed{s}/eval_results.json").read_text())["results"]
        for v in ("conv", "lambda")
        for s in (0, 1)
    }
    for task in ("bbox", "segm"):
        for metric in METRICS:
            values = {v: [per_run[v, s][task][metric] for s in (0, 1)] for v in ("conv", "lambda")}
            conv = summary["variants"]["conv"]["results"][task][metric]
            assert conv["mean"] == pytest.approx(sum(values["conv"]) / 2)
            assert conv["std"] == pytest.approx(
                abs(values["conv"][0] - values["conv"][1]) / math.sqrt(2)
            )
            difference = summary["variants"]["lambda"]["difference"][task][metric]
            diffs = [a - b for a, b in zip(values["lambda"], values["conv"])]
            assert difference["mean"] == pytest.approx(sum(diffs) / 2)
            assert difference["std"] == pytest.approx(abs(diffs[0] - diffs[1]) / math.sqrt(2))
    for variant in ("conv", "lambda"):
        entry = summary["variants"][variant]
        assert entry["seconds_per_iteration"]["mean"] > 0 and entry["parameters"] > 0
    markdown = (output / "comparison.md").read_text()
    assert markdown in stdout and "## Paired difference to conv" in markdown
    assert "## Reading" in markdown and "- **lambda** vs conv:" in markdown
    assert (output / "comparison.png").read_bytes().startswith(PNG_MAGIC)

    # A second invocation reuses every finished pair: no training, the same report.
    stamps = {p: p.stat().st_mtime_ns for p in output.glob("*/seed*/*") if p.is_file()}
    assert compare_backbones.main(command[2:]) == 0
    again = capsys.readouterr().out
    assert again.count("finished, reusing") == 4 and TRAIN_NET[-1] not in again
    assert stamps == {p: p.stat().st_mtime_ns for p in output.glob("*/seed*/*") if p.is_file()}
    assert json.loads((output / "comparison.json").read_text()) == summary
