"""tools/train_net.py end to end on the bundled dataset: trains, evaluates and reports AP by object
size (the AP tables: reports/test_ap_tables.py)."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, subprocess_env

from lambda_det.reports import load_results


def run_tool(script: str, *args: str, datasets_root: Path, timeout: int = 900):
    env = subprocess_env()
    env["DETECTRON2_DATASETS"] = str(datasets_root)
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=timeout,
    )


TINY_TRAINING = [
    "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER",
    "0.25",
    "MODEL.LAMBDA_RESNET.SCOPE",
    "3",
    "SOLVER.IMS_PER_BATCH",
    "2",
    "SOLVER.MAX_ITER",
    "4",
    "SOLVER.STEPS",
    "(2, 3)",
    "SOLVER.WARMUP_ITERS",
    "1",
    "DATALOADER.NUM_WORKERS",
    "0",
    "MODEL.RPN.POST_NMS_TOPK_TEST",
    "50",
    "TEST.DETECTIONS_PER_IMAGE",
    "20",
]


@pytest.mark.slow
@pytest.mark.e2e
def test_train_net_trains_evaluates_and_reports_ap_by_size(tmp_path, datasets_root):
    output = tmp_path / "run"
    result = run_tool(
        "train_net.py",
        "--config",
        "lambda_r26_shapes.yaml",
        *TINY_TRAINING,
        "OUTPUT_DIR",
        str(output),
        datasets_root=datasets_root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (output / "model_final.pth").is_file()
    # Piped output and the log file carry no terminal colour codes.
    assert "\x1b[" not in result.stdout + result.stderr
    assert "\x1b[" not in (output / "log.txt").read_text()
    results = load_results(str(output))
    for task in ("bbox", "segm"):
        assert {"AP", "AP50", "AP75", "APs", "APm", "APl"} <= set(results[task])
        assert all(not math.isnan(results[task][m]) for m in ("APs", "APm", "APl"))
    report = run_tool(
        "ap_table.py",
        f"tiny={output}",
        "--plot",
        str(tmp_path / "ap.png"),
        datasets_root=datasets_root,
    )
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith("| Backbone | AP bb | APs/m/l bb | AP mask | APs/m/l mask |")
    assert "| tiny |" in report.stdout and (tmp_path / "ap.png").is_file()
    # --eval-only on the trained weights reproduces the same numbers.
    again = run_tool(
        "train_net.py",
        "--config",
        "lambda_r26_shapes",
        "--eval-only",
        *TINY_TRAINING,
        "MODEL.WEIGHTS",
        str(output / "model_final.pth"),
        "OUTPUT_DIR",
        str(tmp_path / "eval"),
        datasets_root=datasets_root,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert load_results(str(tmp_path / "eval")) == results
    # Neither a second training nor an evaluation without weights replaces the finished run.
    retrain = run_tool(
        "train_net.py",
        "--config",
        "lambda_r26_shapes",
        *TINY_TRAINING,
        "OUTPUT_DIR",
        str(output),
        datasets_root=datasets_root,
    )
    assert retrain.returncode != 0 and "already holds a run" in retrain.stderr
    unweighted = run_tool(
        "train_net.py",
        "--config",
        "lambda_r26_shapes",
        "--eval-only",
        *TINY_TRAINING,
        "OUTPUT_DIR",
        str(output),
        datasets_root=datasets_root,
    )
    assert unweighted.returncode != 0 and "MODEL.WEIGHTS is empty" in unweighted.stderr
    assert load_results(str(output)) == results
