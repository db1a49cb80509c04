"""The tools' command lines: options after the KEY VALUE overrides, "did you mean" for a
misspelt config key (yaml configs and LazyConfig recipes alike), the LazyConfig tool naming
its own keys, and a user's mistake in one line where a bug keeps its traceback."""

import pickle

import cv2
import numpy as np
import pytest

from lambda_det.checkpoint import CorruptCheckpointError, UnsafeCheckpointError
from lambda_det.cli import lazyconfig_train_net, predict
from lambda_det.cli import train_net as cli
from lambda_det.cli.arguments import reporting_user_errors
from lambda_det.cli.output_dir import OutputDirBusyError, OutputDirLock, prepare_output_dir
from lambda_det.config import did_you_mean
from lambda_det.run_config import load_config
from lambda_det.utils.atomic import OutputWriteError
from lambda_det.utils.errors import (
    ExistingFileError,
    IsAFolderError,
    MissingFileError,
    NotAFolderError,
    UserError,
    UserKeyError,
)

SHAPES = "configs/Demo/lambda_r26_shapes.yaml"


def test_options_after_the_overrides_are_parsed_as_options():
    argv = [
        "--config",
        "X",
        "SOLVER.MAX_ITER",
        "5",
        "--coco-dataset",
        "a",
        "b",
        "c",
        "SEED",
        "3",
        "--debug",
    ]
    assert "--coco-dataset" in cli.argument_parser().parse_args(argv).opts  # argparse alone
    args = cli.parse_command_line(cli.argument_parser(), argv)
    assert args.coco_dataset == [["a", "b", "c"]] and args.debug
    assert args.opts == ["SOLVER.MAX_ITER", "5", "SEED", "3"]
    plain = cli.parse_command_line(cli.argument_parser(), ["--config", "X", "SEED", "3"])
    assert plain.opts == ["SEED", "3"] and plain.coco_dataset == [] and not plain.debug


@pytest.mark.parametrize(
    "words,meaning",
    [(["x", "a.json", "OUTPUT_DIR"], "IMAGE_DIR"), (["x", "SOLVER.MAX_ITER", "images"], "JSON")],
)
def test_a_coco_dataset_short_of_a_word_does_not_take_an_override(words, meaning, capsys):
    """``--coco-dataset x a.json OUTPUT_DIR out``: the image folder left out, argparse would
    take the override's key for it and leave the overrides a word short."""
    with pytest.raises(SystemExit) as stop:
        cli.parse_command_line(
            cli.argument_parser(), ["--config", "X", "--coco-dataset", *words, "out"]
        )
    assert stop.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    key = words[2] if meaning == "IMAGE_DIR" else words[1]
    assert f"--coco-dataset {' '.join(words)}: {meaning} '{key}' is a config key" in error, error
    assert "is a config key: give --coco-dataset NAME JSON IMAGE_DIR" in error, error


def test_train_net_takes_debug_after_a_misspelt_override(tmp_path):
    """--debug after the overrides is --debug (the traceback), not a config key; the key gets
    its closest spelling."""
    with pytest.raises(
        ValueError,
        match=r"config key SOLVER.MAX_ITR \(in the command-line "
        r"overrides\) does not exist: did you mean "
        r"SOLVER.MAX_ITER\?",
    ):
        cli.main(
            [
                "--config",
                "lambda_r26_shapes",
                "OUTPUT_DIR",
                str(tmp_path),
                "SOLVER.MAX_ITR",
                "5",
                "--debug",
            ]
        )


def test_the_lazy_tool_takes_debug_after_a_misspelt_override():
    with pytest.raises(ValueError, match=r"did you mean train.max_iter\?"):
        lazyconfig_train_net.main(["--config", "lambda_r26_shapes", "train.max_itr=5", "--debug"])


def test_predict_takes_its_required_options_after_the_overrides(tmp_path):
    image = tmp_path / "photo.png"
    cv2.imwrite(str(image), np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match=r"did you mean MODEL.WEIGHTS\?"):
        predict.main(
            [
                "--config",
                SHAPES,
                "MODEL.WEIGTHS",
                "x.pth",
                "--input",
                str(image),
                "--output",
                str(tmp_path / "out"),
                "--debug",
            ]
        )


def broken(error: Exception):
    def raising(*args, **kwargs):
        raise error

    return raising


# (tool, the function of its guarded block that the case makes raise, its command line)
GUARDED = [
    (predict, "collect_inputs", ["--config", SHAPES, "--input", "a.png", "--output", "out"]),
    (cli, "check_launch_arguments", ["--config", SHAPES, "MODEL.DEVICE", "cpu"]),
]


@pytest.mark.parametrize(
    "error",
    [
        ValueError("an internal value"),
        KeyError("an internal key"),
        KeyError("No object named 'an internal name' found in 'BACKBONE' registry!"),
        FileNotFoundError("an internal file"),
        FileExistsError("an internal file"),
        NotADirectoryError("an internal folder"),
        IsADirectoryError("an internal folder"),
        pickle.UnpicklingError("an internal pickle"),
        RuntimeError("an internal state"),
    ],
    ids=repr,
)
@pytest.mark.parametrize("tool, function, argv", GUARDED)
def test_a_bug_in_a_guarded_block_keeps_its_traceback(
    tool, function, argv, error, monkeypatch, tmp_path, capsys
):
    """An exception that is no UserError is a bug, a builtin one of a file, a name or a pickle
    included: it leaves main() as it is (the traceback), not as an ``error:`` line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tool, function, broken(error))
    with pytest.raises(type(error), match="an internal"):
        tool.main(argv)
    assert "error:" not in capsys.readouterr().err


@pytest.mark.parametrize("tool, function, argv", GUARDED)
def test_a_user_error_in_the_same_block_is_one_line(
    tool, function, argv, monkeypatch, tmp_path, capsys
):
    """The control of the case above: the block does report a UserError in one line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tool, function, broken(UserError("a mistake: the fix")))
    with pytest.raises(SystemExit) as exit_info:
        tool.main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "error: a mistake: the fix"


# The project's exception of each mistake the tools report, and the builtin one it also is.
USER_ERROR_TYPES = [
    (MissingFileError, FileNotFoundError),
    (ExistingFileError, FileExistsError),
    (NotAFolderError, NotADirectoryError),
    (IsAFolderError, IsADirectoryError),
    (UserKeyError, KeyError),
    (UnsafeCheckpointError, pickle.UnpicklingError),
    (CorruptCheckpointError, RuntimeError),
    (OutputDirBusyError, RuntimeError),
    (OutputWriteError, RuntimeError),
]


@pytest.mark.parametrize("user_error, builtin", USER_ERROR_TYPES)
def test_a_user_error_is_also_the_builtin_it_replaces(user_error, builtin):
    """Code that catches the builtin (an API caller's ``except FileNotFoundError``) still
    catches the mistake, whose message is the one it was raised with."""
    with pytest.raises(builtin) as caught:
        raise user_error("a mistake: the fix")
    assert isinstance(caught.value, UserError)
    assert str(caught.value.args[0]) == "a mistake: the fix"


@pytest.mark.parametrize("user_error, builtin", USER_ERROR_TYPES)
def test_each_user_error_is_one_line(user_error, builtin, capsys):
    with pytest.raises(SystemExit) as exit_info, reporting_user_errors():
        raise user_error("a mistake:\n the fix")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: a mistake: the fix\n"


def test_a_name_that_detectron2s_registries_lack_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(
            [
                "--config",
                SHAPES,
                "MODEL.DEVICE",
                "cpu",
                "MODEL.BACKBONE.NAME",
                "build_lambda_resnet_fpn_backbon",
                "OUTPUT_DIR",
                str(tmp_path / "run"),
            ]
        )
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: No object named 'build_lambda_resnet_fpn_backbon' found in 'BACKBONE' registry!"
    )
    assert not (tmp_path / "run").exists()


def test_a_missing_required_option_is_still_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_command_line(
            predict.argument_parser(), ["--config", SHAPES, "--input", "a.png", "SEED", "3"]
        )
    assert exit_info.value.code == 2 and "--output" in capsys.readouterr().err


def test_a_misspelt_key_in_a_config_file_gets_the_closest_key(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("MODEL:\n  LAMBDA_RESNET:\n    WIDTH_MULTIPLER: 0.5\n")
    with pytest.raises(
        ValueError,
        match=rf"config key MODEL.LAMBDA_RESNET.WIDTH_MULTIPLER \(in "
        rf"config file {config}\) does not exist: did you mean "
        rf"MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER\? check",
    ):
        load_config(str(config))


def test_a_key_unlike_any_gets_no_guess():
    with pytest.raises(ValueError) as error:
        load_config(SHAPES, ["NOTHING.LIKE_IT", "1"])
    assert "does not exist: check its spelling" in str(error.value)
    assert did_you_mean("NOTHING.LIKE_IT", ["SOLVER.MAX_ITER"]) == ""


def test_the_lazy_tools_help_names_its_own_keys(capsys):
    with pytest.raises(SystemExit):
        lazyconfig_train_net.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "train.output_dir" in help_text and "dataloader.train.dataset.names" in help_text
    assert "OUTPUT_DIR" not in help_text and "DATASETS." not in help_text
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "OUTPUT_DIR" in help_text and "DATASETS.TRAIN" in help_text


def test_output_folder_errors_name_the_configs_key(tmp_path):
    (tmp_path / "model_0000001.pth").write_bytes(b"")
    (tmp_path / "last_checkpoint").write_text("model_0000001.pth")
    with pytest.raises(FileExistsError, match="^train.output_dir .* another train.output_dir"):
        prepare_output_dir(str(tmp_path), resume=False, restart=False, key="train.output_dir")
    with pytest.raises(FileExistsError, match="^OUTPUT_DIR "):
        prepare_output_dir(str(tmp_path), resume=False, restart=False)
    with OutputDirLock(str(tmp_path), key="train.output_dir"):
        with pytest.raises(Exception, match="^train.output_dir .* in use by another run"):
            OutputDirLock(str(tmp_path), key="train.output_dir").acquire()


def test_the_lazy_tool_names_its_output_folder_key(tmp_path, capsys):
    (tmp_path / "model_0000001.pth").write_bytes(b"")
    (tmp_path / "last_checkpoint").write_text("model_0000001.pth")
    with OutputDirLock(str(tmp_path)), pytest.raises(SystemExit) as exit_info:
        lazyconfig_train_net.main(["--config", "lambda_r26_shapes", f"train.output_dir={tmp_path}"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: train.output_dir '{tmp_path}' is in use")
