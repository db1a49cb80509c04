"""tools/benchmark_detector.py on the CPU at small sizes: a lambda detector against its twin."""

import json

import pytest
from conftest import REPO_ROOT, run_python

from benchmarks.detector import (
    DetectorSettings,
    benchmark_detector,
    format_detector,
    parse_config_spec,
)

SMALL = [
    "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER",
    "0.25",
    "MODEL.LAMBDA_RESNET.SCOPE",
    "3",
    "MODEL.LAMBDA_RESNET.PLACEMENT",
    "c4",
]
TWIN = "lambda_r26_shapes:MODEL.LAMBDA_RESNET.PLACEMENT=none"


def test_config_specs():
    assert parse_config_spec("r101_mask_rcnn") == ("r101_mask_rcnn", [])
    assert parse_config_spec("a:X.Y=1,Z=two") == ("a", ["X.Y", "1", "Z", "two"])
    with pytest.raises(ValueError, match="overrides are KEY=VALUE, got 'X'"):
        parse_config_spec("a:X")


@pytest.mark.slow
def test_a_lambda_detector_against_its_twin_on_the_cpu():
    settings = DetectorSettings(
        configs=["lambda_r26_shapes", TWIN],
        opts=SMALL,
        ims_per_device=2,
        precisions=["fp32"],
        modes=["eager"],
        size=96,
        device="cpu",
        warmup=0,
        rounds=2,
    )
    results = benchmark_detector(settings)
    lambda_row, twin_row = results["rows"]
    for row in results["rows"]:
        assert row["seconds_per_image"] > 0 and row["peak_bytes"] > 0 and row["error"] is None
        assert row["largest_batch"] is None  # a search needs a GPU
    assert lambda_row["ratio"] == 1.0 and twin_row["ratio"] > 0
    assert 0 < lambda_row["lambda_share"] < 1 and twin_row["lambda_share"] == 0
    assert lambda_row["parameters"] < twin_row["parameters"]  # lambda blocks are lighter
    table = format_detector(results)
    assert "| lambda_r26_shapes eager fp32 |" in table and f"| {TWIN} eager fp32 |" in table


@pytest.mark.slow
@pytest.mark.e2e
def test_the_command_line_writes_its_files_and_names_bad_input(tmp_path):
    def tool(*args):
        # From another folder than the checkout: the script finds benchmarks/.
        script = REPO_ROOT / "tools/benchmark_detector.py"
        return run_python(script, *args, cwd=tmp_path, timeout=600)

    result = tool(
        "--device",
        "cpu",
        "--size",
        "64",
        "--ims-per-device",
        "1",
        "--rounds",
        "1",
        "--warmup",
        "0",
        "--configs",
        "lambda_r26_shapes",
        "--output",
        tmp_path,
        *SMALL,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["rows"][0]["config"] == "lambda_r26_shapes" and results["machine"]
    assert (tmp_path / "table.md").read_text().startswith("Training step, 1 images per device")
    result = tool(
        "--device",
        "cpu",
        "--configs",
        "lambda_r26_shapes",
        "lambda_r26_shapes",
        "--output",
        tmp_path / "again",
    )
    assert result.returncode == 2 and "error: --configs names a config twice" in result.stderr
