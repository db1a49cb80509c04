"""Training into a folder that holds a run takes --resume (continue) or --restart (the run
moved aside, nothing lost); only the run's own files move, and a user's file at a name a run
writes (log.txt, metrics.json, ...) is never appended to or replaced: the run's record of its
files (OUTPUT_DIR/run_files.json) tells them apart. (From tests/test_reliability.py.)"""

import hashlib
import json
import re
from pathlib import Path

import pytest
from conftest import DEMO_CONFIG, TINY_OVERRIDES, assert_one_line_error, exit_status

from lambda_det.cli import output_dir
from lambda_det.cli import train_net as cli
from lambda_det.cli.output_dir import (
    RECORD_FILE,
    FolderFiles,
    prepare_output_dir,
    read_record,
    record_run,
    run_files,
    run_files_in,
)
from lambda_det.utils.errors import ExistingFileError

# A run's files, written after its record (as a run writes them).
RUN = {
    "last_checkpoint": "model_0000009.pth",
    "model_0000009.pth": "weights",
    "metrics.json": "{}",
    "eval_results.json": "{}",
    "log.txt": "log",
}
# A user's files of a run's kinds that no run writes over (new names), there before the run.
USERS = {
    "log.txt.old": "the user's old log",
    "model_best.pth": "the user's weights",
    "events.out.tfevents.user": "the user's events",
}


def hashes(folder: Path) -> dict:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def write(folder: Path, files: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def all_a_runs(folder, key="OUTPUT_DIR") -> FolderFiles:
    """The guard off: every file of a run's name taken as the run's (no record consulted)."""
    return FolderFiles(run_files_in(str(folder)), [])


def test_training_over_a_run_needs_resume_or_restart(tmp_path):
    write(tmp_path, RUN)
    (tmp_path / "notes.md").write_text("not the run's")  # e.g. OUTPUT_DIR "." in a checkout
    with pytest.raises(
        FileExistsError,
        match=r"already holds a run \(last checkpoint "
        r"model_0000009.pth\): pass --resume .* --restart",
    ):
        prepare_output_dir(str(tmp_path), resume=False, restart=False)
    assert prepare_output_dir(str(tmp_path), resume=True, restart=False) is None  # continues
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*RUN, "notes.md"])
    # Another machine of a multi-machine job leaves the moving to machine 0.
    assert prepare_output_dir(str(tmp_path), resume=False, restart=True, machine_rank=1) is None
    previous = Path(prepare_output_dir(str(tmp_path), resume=False, restart=True))
    assert previous.parent == tmp_path and previous.name.startswith("previous_")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md", previous.name]
    assert {name: (previous / name).read_text() for name in RUN} == RUN  # nothing lost
    assert prepare_output_dir(str(tmp_path), resume=False, restart=False) is None


def test_restart_moves_only_the_runs_own_files(tmp_path, monkeypatch):
    """The user's files were there before the run: its record lists them as not its own."""
    write(tmp_path, USERS)
    record_run(tmp_path)
    write(tmp_path, RUN)
    assert read_record(tmp_path)["run"] == {"not the run's": sorted(USERS)}
    users = {name: value for name, value in hashes(tmp_path).items() if name in USERS}
    previous = Path(prepare_output_dir(str(tmp_path), resume=False, restart=True))
    assert {name: (previous / name).read_text() for name in RUN} == RUN
    assert sorted(p.name for p in previous.iterdir()) == sorted([*RUN, RECORD_FILE])
    assert {name: value for name, value in hashes(tmp_path).items() if name in USERS} == users
    # The negative control: without the record's word, the user's files go with the run's.
    for name in previous.iterdir():
        name.rename(tmp_path / name.name)
    monkeypatch.setattr(output_dir, "run_files", all_a_runs)
    previous = Path(prepare_output_dir(str(tmp_path), resume=False, restart=True))
    assert set(USERS) <= {path.name for path in previous.iterdir()}


@pytest.mark.parametrize("flags", [{}, {"restart": True}, {"resume": True}])
def test_a_users_log_and_metrics_are_never_a_runs(flags, tmp_path, monkeypatch):
    """No record and no checkpoint: a log.txt and a metrics.json are the user's. A fresh run
    would append to them, --restart would move them: both refused, before anything moves."""
    write(tmp_path, {"log.txt": "the user's log", "metrics.json": "the user's metrics"})
    before = hashes(tmp_path)
    arguments = {"resume": False, "restart": False, **flags}
    with pytest.raises(
        ExistingFileError,
        match=rf"^OUTPUT_DIR '{re.escape(str(tmp_path))}' holds log.txt, metrics.json, which no "
        rf"run wrote there \({RECORD_FILE} does not record it as a run's\) and a run writes: "
        rf"move them away, or pass another OUTPUT_DIR$",
    ):
        prepare_output_dir(str(tmp_path), **arguments)
    assert hashes(tmp_path) == before
    # The negative control: taken as a run's, --restart would move the user's files away.
    monkeypatch.setattr(output_dir, "run_files", all_a_runs)
    if flags.get("restart"):
        previous = Path(prepare_output_dir(str(tmp_path), **arguments))
        assert sorted(p.name for p in previous.iterdir()) == ["log.txt", "metrics.json"]
    else:
        with pytest.raises(ExistingFileError, match="holds a run that stopped before"):
            prepare_output_dir(str(tmp_path), **arguments)


def test_a_fresh_run_records_what_is_not_its_own(tmp_path):
    write(tmp_path, {**USERS, "notes.md": "the user's notes"})
    assert prepare_output_dir(str(tmp_path), resume=False, restart=False) is None
    record_run(tmp_path)
    assert run_files(tmp_path) == FolderFiles([RECORD_FILE], sorted(USERS))
    write(tmp_path, RUN)
    assert run_files(tmp_path) == FolderFiles(sorted([*RUN, RECORD_FILE]), sorted(USERS))
    record_run(tmp_path)  # a resumed run keeps its record
    assert read_record(tmp_path)["run"] == {"not the run's": sorted(USERS)}
    # A run made without the record (Detectron2's own train_net.py): its checkpoint says so.
    (tmp_path / RECORD_FILE).unlink()
    assert run_files(tmp_path) == FolderFiles(sorted([*RUN, *USERS]), [])


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"not json", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # nested past the parser's depth
        (b'{"format": "other"}', 'no "format"'),
        (
            json.dumps({"format": "lambda_det run files 1", "run": {"not the run's": ["../x"]}}),
            "not a list of file names",
        ),
        (b"x" * (output_dir.RECORD_LIMIT + 1), "over a record's"),
        ("link", "not a plain file"),
    ],
)
def test_a_file_at_the_records_name_that_is_no_record_is_one_line(content, reason, tmp_path):
    folder = tmp_path / "run"
    write(folder, {"log.txt": "log"})
    record = folder / RECORD_FILE
    if content == "link":
        (tmp_path / "notes.json").write_text("{}")
        record.symlink_to(tmp_path / "notes.json")
    else:
        record.write_bytes(content.encode() if isinstance(content, str) else content)
    before = hashes(tmp_path)
    with pytest.raises(ExistingFileError) as error:
        prepare_output_dir(str(folder), resume=False, restart=True)
    message = str(error.value)
    assert message.startswith(f"'{record}' is not lambda_det's record of the files written in ")
    assert reason in message and message.endswith("move it away, or pass another OUTPUT_DIR")
    assert "\n" not in message and hashes(tmp_path) == before


@pytest.fixture
def launches(monkeypatch) -> list:
    """tools/train_net.py's own flow up to the launch (the datasets' checks and the training
    stubbed)."""
    launched = []
    monkeypatch.setattr(cli, "launch", lambda *args, **kwargs: launched.append(args))
    monkeypatch.setattr(cli, "check_run_datasets", lambda data, training=True: None)
    return launched


def training(folder: Path, *flags: str) -> list:
    return ["--config-file", DEMO_CONFIG, *flags, *TINY_OVERRIDES, "OUTPUT_DIR", str(folder)]


def test_train_net_restart_names_what_it_leaves(tmp_path, launches, capsys):
    write(tmp_path, USERS)
    record_run(tmp_path)
    write(tmp_path, RUN)
    users = {name: value for name, value in hashes(tmp_path).items() if name in USERS}
    assert cli.main(training(tmp_path, "--restart")) == 0 and len(launches) == 1
    (previous,) = tmp_path.glob("previous_*")
    printed = capsys.readouterr().out
    assert (
        f"--restart: moved the previous run's files in {tmp_path} to {previous} (left where "
        f"they are, not the run's: {', '.join(sorted(USERS))}): this run starts at iteration 0"
    ) in printed
    assert {name: value for name, value in hashes(tmp_path).items() if name in USERS} == users
    # The new run's record: the user's files are not its own either.
    assert read_record(tmp_path)["run"] == {"not the run's": sorted(USERS)}


@pytest.mark.parametrize("flags", [[], ["--restart"]])
def test_train_net_into_a_users_log_is_one_line(flags, tmp_path, launches, capsys):
    write(tmp_path, {"log.txt": "the user's log", "notes.md": "the user's notes"})
    before = hashes(tmp_path)
    status, stderr = exit_status(cli.main, training(tmp_path, *flags), capsys)
    assert_one_line_error(
        status,
        stderr,
        f"OUTPUT_DIR '{tmp_path}' holds log.txt, which no run wrote there",
        "move it away, or pass another OUTPUT_DIR",
    )
    assert not launches
    after = hashes(tmp_path)
    after.pop("run.lock")  # the lock is taken before the folder is read
    assert after == before


@pytest.mark.parametrize("iteration", [1, 0])
def test_resume_of_a_finished_run_says_so_and_touches_no_file(
    iteration, tmp_path, launches, capsys, monkeypatch
):
    """SOLVER.MAX_ITER 2 (TINY_OVERRIDES): a checkpoint of iteration 1 (the second) is the
    run's last; one of iteration 0 leaves one to train (the control: the run launches)."""
    import torch

    monkeypatch.setattr(cli, "check_weights_fit", lambda *args, **kwargs: None)  # no weights
    record_run(tmp_path)
    write(tmp_path, {**RUN, "last_checkpoint": "model_final.pth"})
    torch.save({"model": {}, "iteration": iteration}, tmp_path / "model_final.pth")
    before = hashes(tmp_path)
    status, stderr = exit_status(cli.main, training(tmp_path, "--resume"), capsys)
    if iteration == 0:
        assert status == 0 and len(launches) == 1, stderr[-2000:]
        return
    final = tmp_path / "model_final.pth"
    assert_one_line_error(
        status,
        stderr,
        f"OUTPUT_DIR '{tmp_path}' holds a finished run: its last checkpoint model_final.pth is "
        f"of iteration 2, SOLVER.MAX_ITER 2, so --resume has nothing to train (no file was "
        f"touched): evaluate it with --eval-only MODEL.WEIGHTS {final}, or train longer with a "
        f"larger SOLVER.MAX_ITER and --resume",
    )
    assert not launches
    assert hashes(tmp_path) == before
