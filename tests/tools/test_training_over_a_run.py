"""Training into a folder that holds a run takes --resume (continue) or --restart (the run
moved aside, nothing lost). (From tests/test_reliability.py.)"""

from pathlib import Path

import pytest

from lambda_det.cli.output_dir import prepare_output_dir


def test_training_over_a_run_needs_resume_or_restart(tmp_path):
    run = {
        "last_checkpoint": "model_0000009.pth",
        "model_0000009.pth": "weights",
        "metrics.json": "{}",
        "eval_results.json": "{}",
        "log.txt": "log",
    }
    for name, text in run.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "notes.md").write_text("not the run's")  # e.g. OUTPUT_DIR "." in a checkout
    with pytest.raises(
        FileExistsError,
        match=r"already holds a run \(last checkpoint "
        r"model_0000009.pth\): pass --resume .* --restart",
    ):
        prepare_output_dir(str(tmp_path), resume=False, restart=False)
    assert prepare_output_dir(str(tmp_path), resume=True, restart=False) is None  # continues
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*run, "notes.md"])
    # Another machine of a multi-machine job leaves the moving to machine 0.
    assert prepare_output_dir(str(tmp_path), resume=False, restart=True, machine_rank=1) is None
    previous = Path(prepare_output_dir(str(tmp_path), resume=False, restart=True))
    assert previous.parent == tmp_path and previous.name.startswith("previous_")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md", previous.name]
    assert {name: (previous / name).read_text() for name in run} == run  # nothing lost
    assert prepare_output_dir(str(tmp_path), resume=False, restart=False) is None
