"""tools/train_net.py end to end on the bundled dataset: trains, evaluates and reports AP by object
size (the AP tables: reports/test_ap_tables.py)."""

import math
import shutil

import pytest
from conftest import TINY_EVALUATED_RUN, exit_status

from lambda_det.cli import ap_table, train_net
from lambda_det.reports import load_results


@pytest.mark.slow
@pytest.mark.e2e
def test_train_net_trains_evaluates_and_reports_ap_by_size(
    evaluated_run, tmp_path, small_shapes, capsys
):
    """The training is conftest's evaluated_run (a child process); the tools that read it run
    their main() here."""
    stdout, stderr = ((evaluated_run / name).read_text() for name in ("stdout.txt", "stderr.txt"))
    output = shutil.copytree(evaluated_run / "run", tmp_path / "run")  # the refusals below
    assert (output / "model_final.pth").is_file()
    # Piped output and the log file carry no terminal colour codes.
    assert "\x1b[" not in stdout + stderr
    assert "\x1b[" not in (output / "log.txt").read_text()
    results = load_results(str(output))
    for task in ("bbox", "segm"):
        assert {"AP", "AP50", "AP75", "APs", "APm", "APl"} <= set(results[task])
        assert all(not math.isnan(results[task][m]) for m in ("APs", "APm", "APl"))
    assert ap_table.main([f"tiny={output}", "--plot", str(tmp_path / "ap.png")]) == 0
    report = capsys.readouterr().out
    assert report.startswith("| Backbone | AP bb | APs/m/l bb | AP mask | APs/m/l mask |")
    assert "| tiny |" in report and (tmp_path / "ap.png").is_file()
    # --eval-only on the trained weights reproduces the same numbers.
    tool = ["--config", "lambda_r26_shapes", *TINY_EVALUATED_RUN]
    weights = ["MODEL.WEIGHTS", str(output / "model_final.pth")]
    again = ["--eval-only", *weights, "OUTPUT_DIR", str(tmp_path / "eval")]
    assert train_net.main([*tool, *again]) == 0
    assert load_results(str(tmp_path / "eval")) == results
    # Neither a second training nor an evaluation without weights replaces the finished run.
    status, err = exit_status(train_net.main, [*tool, "OUTPUT_DIR", output], capsys)
    assert status != 0 and "already holds a run" in err
    unweighted = [*tool, "--eval-only", "OUTPUT_DIR", output]
    status, err = exit_status(train_net.main, unweighted, capsys)
    assert status != 0 and "MODEL.WEIGHTS is empty" in err
    assert load_results(str(output)) == results
