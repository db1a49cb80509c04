"""AP tables and charts (lambda_det.reports, tools/ap_table.py): the table's layout and deltas,
results read from a run's files, two runs of one name, bars without missing metrics."""

import json
from pathlib import Path

import pytest

from lambda_det.cli import ap_table
from lambda_det.reports import (
    DETECTRON2_LSJ_BASELINES,
    PAPER_TABLE_14,
    format_ap_table,
    load_results,
    plot_ap_by_size,
)


def test_ap_table_layout_and_deltas(tmp_path):
    runs = {
        "ours": {
            "bbox": {"AP": 50.0, "APs": 31.0, "APm": 53.0, "APl": 67.5},
            "segm": {"AP": 44.0, "APs": float("nan"), "APm": 47.0, "APl": 62.0},
        },
        "base": {"bbox": {"AP": 48.9, "APs": 29.9, "APm": 51.8, "APl": 66.0}},
    }
    table = format_ap_table(runs, baseline="base", paper=True).splitlines()
    assert table[0] == "| Backbone | AP bb | APs/m/l bb | AP mask | APs/m/l mask |"
    assert table[2] == (
        "| ours | 50.0 (+1.1) | 31.0 / 53.0 / 67.5 (+1.1 / +1.2 / +1.5) | "
        "44.0 (–) | nan / 47.0 / 62.0 (– / – / –) |"
    )
    assert table[3].startswith("| base | 48.9 | 29.9 / 51.8 / 66.0 | – |")
    paper_end = 4 + len(PAPER_TABLE_14)
    assert "| LambdaResNet-152 (paper) | 50.0 (+1.1) |" in table[paper_end - 1]
    assert len(table) == paper_end + len(DETECTRON2_LSJ_BASELINES)
    assert format_ap_table(runs).count("\n") == 3  # without --paper: neither kind of row
    with pytest.raises(ValueError, match="baseline 'nope' is not one of the rows"):
        format_ap_table(runs, baseline="nope")
    png = plot_ap_by_size(runs, str(tmp_path / "plot.png"))
    assert Path(png).read_bytes()[:4] == b"\x89PNG"


def test_detectron2_lsj_baselines_are_reference_rows_after_the_papers():
    """detectron2's MODEL_ZOO.md (new_baselines, LSJ, from scratch) quotes box and mask AP only."""
    table = format_ap_table({}, baseline="R-101-FPN LSJ 400 ep (detectron2 reference)", paper=True)
    lines = table.splitlines()[2:]
    assert [line.split(" | ")[0] for line in lines[len(PAPER_TABLE_14) :]] == [
        f"| R-{depth}-FPN LSJ {epochs} ep (detectron2 reference)"
        for depth in (50, 101)
        for epochs in (100, 200, 400)
    ]
    assert lines[-1] == (
        "| R-101-FPN LSJ 400 ep (detectron2 reference) | 48.9 | – / – / – | 43.7 | – / – / – |"
    )
    assert lines[len(PAPER_TABLE_14)].startswith(
        "| R-50-FPN LSJ 100 ep (detectron2 reference) | 44.6 (-4.3) | – / – / – (– / – / –) | "
        "40.3 (-3.4) |"
    )
    # the paper's LambdaResNet-101 against detectron2's 400-epoch R-101: +0.5 box, -0.2 mask
    assert "| LambdaResNet-101 (paper) | 49.4 (+0.5) |" in table and "43.5 (-0.2)" in table


def test_results_load_from_metrics_json_and_bad_files_are_named(tmp_path):
    metrics = tmp_path / "metrics.json"
    metrics.write_text(
        '{"iteration": 1, "total_loss": 2.0}\n'
        '{"iteration": 9, "bbox/AP": 1.5, "bbox/APs": 0.5, "segm/APl": 3.0}\n'
    )
    assert load_results(str(tmp_path)) == {"bbox": {"AP": 1.5, "APs": 0.5}, "segm": {"APl": 3.0}}
    broken = tmp_path / "eval_results.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="eval_results.json is not an eval_results.json"):
        load_results(str(broken))
    with pytest.raises(FileNotFoundError, match="no results file at .*missing.json"):
        load_results(str(tmp_path / "missing.json"))
    two = tmp_path / "two" / "eval_results.json"
    two.parent.mkdir()
    two.write_text(
        json.dumps(
            {
                "config": "",
                "results": {"val_a": {"bbox": {"AP": 1.0}}, "val_b": {"bbox": {"AP": 2.0}}},
            }
        )
    )
    with pytest.raises(ValueError, match=r"results for the datasets \['val_a', 'val_b'\]"):
        load_results(str(two))
    assert load_results(str(two), dataset="val_b") == {"bbox": {"AP": 2.0}}


@pytest.mark.e2e
def test_ap_table_refuses_two_runs_with_one_name(tmp_path, capsys):
    for run in ("a", "b"):
        (tmp_path / run / "out").mkdir(parents=True)
        (tmp_path / run / "out" / "metrics.json").write_text('{"bbox/AP": 1.0}\n')
    with pytest.raises(SystemExit):
        ap_table.main([str(tmp_path / "a" / "out"), str(tmp_path / "b" / "out")])
    assert "two runs are named 'out'" in capsys.readouterr().err
    assert ap_table.main([f"a={tmp_path / 'a' / 'out'}", f"b={tmp_path / 'b' / 'out'}"]) == 0


def test_ap_bars_leave_out_missing_metrics_and_cut_errors_at_zero(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from lambda_det.reports.plots import plot_ap_bars

    drawn, draw = [], Axes.bar

    def recording_bar(self, x, height, *args, **kwargs):
        drawn.append((list(x), list(height), kwargs.get("yerr")))
        return draw(self, x, height, *args, **kwargs)

    monkeypatch.setattr(Axes, "bar", recording_bar)
    panels = {"boxes": {"a": [(10.0, 2.0), (float("nan"), None), (1.0, 3.0), (4.0, None)]}}
    png = plot_ap_bars(panels, ("AP", "APs", "APm", "APl"), str(tmp_path / "bars.png"))
    # No bar for the NaN metric (not a bar at 0); the std below 1.0 stops at 0 (AP is never
    # below); a value without a std (one seed) has no error bar; the file is whole.
    assert drawn == [([0.0, 2.0, 3.0], [10.0, 1.0, 4.0], [(2.0, 1.0, 0.0), (2.0, 3.0, 0.0)])]
    assert Path(png).read_bytes()[:4] == b"\x89PNG" and list(tmp_path.iterdir()) == [Path(png)]


@pytest.mark.parametrize("case", ["baseline", "not a number", "not utf-8", "results a string"])
def test_ap_table_mistakes_are_one_line_naming_the_file(case, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    results = run / "eval_results.json"
    record = {"config": "", "results": {"bbox": {"AP": 40.0, "APs": 20.0}}}
    arguments, expected = [str(run)], [f"{results}"]
    if case == "baseline":
        arguments, expected = (
            [str(run), "--baseline", "nope"],
            ["baseline 'nope' is not one of the rows ['run']: pass one of them"],
        )
    elif case == "not a number":
        record["results"]["bbox"]["APs"] = "high"
        expected += ["bbox/APs is 'high', not a number"]
    elif case == "results a string":
        record["results"] = "the run's"
        expected += ["its 'results' is str, not a mapping"]
    results.write_text(json.dumps(record))
    if case == "not utf-8":
        results.write_bytes(b"\xff\xfe\x00 a binary file")
        expected += ["is not utf-8 text (byte 0 is 0xff", "pass a run's folder"]
    with pytest.raises(SystemExit) as exit_info:
        ap_table.main(arguments)
    assert exit_info.value.code == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: "), errors
    for fragment in expected:
        assert fragment in errors[0], errors[0]
