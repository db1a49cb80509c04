"""tools/gpu_report.py: its CPU dry run runs every section that does not compile, results are on
disk the moment they are measured (a cut-off run keeps them), targets are met or missed, bad
input is one line."""

import json

import pytest
from conftest import assert_one_line_error, exit_status

from benchmarks import gpu_report
from benchmarks.gpu_report import dry_run_plan, main, run_report, target_line


def records(folder):
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


@pytest.mark.slow  # 11 s: it builds and runs every section at tiny sizes
def test_the_dry_run_measures_every_section_beside_its_prediction(tmp_path, capsys):
    status, stderr = exit_status(
        main, ["--device", "cpu", "--dry-run", "--output", tmp_path], capsys
    )
    assert status == 0, stderr[-3000:]
    written = records(tmp_path)
    header = written[0]
    assert header["kind"] == "header" and header["dry_run"] and header["torch"]
    assert header["commit"] is None or len(header["commit"].split("+")[0]) == 40
    predicted = {r["candidate"]: r for r in written if r["kind"] == "prediction"}
    for candidate in (
        *dry_run_plan().pair_152,
        "lambda_det tiled c5_224",
        "timm LambdaLayer c5_224",
    ):
        assert candidate in predicted
    detector = predicted["lambda_r26_shapes"]
    assert detector["peak_bytes"] > detector["gradient_bytes"] > 0
    assert detector["backbone_step_flops"] > 0
    measured = [r for r in written if r["kind"] == "measurement"]
    assert {r["section"] for r in measured} == {"a", "c eager", "d"}
    assert all(r.get("seconds_per_image") or r.get("ms") for r in measured)
    targets = [r for r in written if r["kind"] == "target"]
    assert [t["target"] for t in targets] == [
        "a time x twin",
        "a peak memory x twin",
        "c eager c5_224 x timm speed",
    ]
    assert all(t["verdict"] in ("met", "missed") for t in targets)
    assert {r["section"] for r in written if r["kind"] == "skipped"} == {"b", "c compiled"}
    assert written[-1]["kind"] == "done"
    summary = (tmp_path / "summary.md").read_text()
    assert "(CPU predicted" in summary and "- target a time x twin:" in summary
    assert "lambda layers' share of the step" in (tmp_path / "profile.txt").read_text()


def test_verdicts():
    assert target_line("t", 1.1, 1.15, at_most=True)["verdict"] == "met"
    assert target_line("t", 1.2, 1.15, at_most=True)["verdict"] == "missed"
    assert target_line("t", 2.5, 2.0, at_most=False)["verdict"] == "met"
    assert target_line("t", None, 2.0, at_most=False)["verdict"] == "not measured"


def _fast_sections(monkeypatch):
    """Stubs for the measurements: what the report does with results, in milliseconds."""

    def pair(plan, pair, precision, mode, max_batch=0):
        return [
            {
                "name": f"{spec} {mode}",
                "config": spec,
                "seconds_per_image": s,
                "ratio": s / 0.1,
                "peak_bytes": 2**20 * m,
                "error": None,
            }
            for spec, s, m in zip(pair, (0.1, 0.2), (100, 105))
        ]

    prediction = {"kind": "prediction", "peak_bytes": 1, "saved_bytes_per_image": 1}
    prediction["backbone_step_flops"] = None
    monkeypatch.setattr(gpu_report, "predict_detector", lambda *a: prediction)
    monkeypatch.setattr(gpu_report, "predict_layers", lambda *a: [])
    monkeypatch.setattr(gpu_report, "measure_pair", pair)


def test_a_run_cut_off_keeps_what_it_measured(tmp_path, monkeypatch):
    _fast_sections(monkeypatch)

    def cut_off(plan, compiled):
        raise KeyboardInterrupt  # the device's time is up in section c

    monkeypatch.setattr(gpu_report, "measure_layers", cut_off)
    with pytest.raises(KeyboardInterrupt):
        run_report(dry_run_plan(), tmp_path, budget_s=60, dry_run=True)
    written = records(tmp_path)
    verdicts = {r["target"]: r["verdict"] for r in written if r["kind"] == "target"}
    assert verdicts == {"a time x twin": "missed", "a peak memory x twin": "met"}
    assert (
        "- target a time x twin: 2.000 (<= 1.15): missed" in (tmp_path / "summary.md").read_text()
    )


def test_sections_beyond_the_budget_are_recorded_as_skipped(tmp_path, monkeypatch):
    _fast_sections(monkeypatch)
    plan = dry_run_plan()
    plan.budgets = {"predictions": 0, "a": 0, "b": 0, "c": 1e6, "d": 1e6}
    run_report(plan, tmp_path, budget_s=60, dry_run=True)
    skipped = [r["section"] for r in records(tmp_path) if r["kind"] == "skipped"]
    assert skipped == ["b", "c", "d"]  # b: no compiling on the CPU; c, d: over the budget


def test_bad_input_is_one_line(tmp_path, capsys):
    status, stderr = exit_status(main, ["--device", "cpu", "--output", tmp_path], capsys)
    assert_one_line_error(status, stderr, "--device cpu", "pass --dry-run")
    status, stderr = exit_status(
        main, ["--dry-run", "--device", "cpu", "--budget-s", "0", "--output", tmp_path], capsys
    )
    assert_one_line_error(status, stderr, "--budget-s must be > 0")
    (tmp_path / "summary.md").write_text("a user's notes\n")
    status, stderr = exit_status(
        main, ["--dry-run", "--device", "cpu", "--output", tmp_path], capsys
    )
    assert_one_line_error(status, stderr, "summary.md")
    assert (tmp_path / "summary.md").read_text() == "a user's notes\n"
    assert not (tmp_path / "results.jsonl").exists()
