"""``python -m lambda_det.d2tool``: detectron2's own tools/ scripts, unmodified, on lambda_det's
configs (lambda_det's keys, backbones, datasets and training mapper); the README's commands run."""

import json
import os
import shlex
import subprocess
import sys
import time

import cv2
import detectron2.config
import detectron2.data.build
import pytest
from conftest import COMMANDS, REPO_ROOT, load_tool, subprocess_env
from detectron2.data import transforms as T

from lambda_det.cli.d2tool import detectron2_tool_path, lambda_det_in_detectron2, main

build_detectron2 = load_tool("build_detectron2")

D2TOOL = "python -m lambda_det.d2tool "
README_COMMANDS = {
    shlex.split(command)[3]: command for command in COMMANDS if command.startswith(D2TOOL)
}
# Appended to each README command: a narrow backbone, small crops, one image per batch.
TINY = [
    "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER",
    "0.25",
    "MODEL.LAMBDA_RESNET.SCOPE",
    "3",
    "INPUT.LSJ.IMAGE_SIZE",
    "128",
    "SOLVER.IMS_PER_BATCH",
    "1",
    "DATALOADER.NUM_WORKERS",
    "0",
]


def installed_tool_or_skip(name: str) -> str:
    try:
        return detectron2_tool_path(name)
    except FileNotFoundError as error:
        pytest.skip(f"this detectron2 installs no tools/ scripts ({error})")


def test_a_script_is_found_by_name_or_path_and_a_missing_one_is_named(tmp_path, capsys):
    path = installed_tool_or_skip("analyze_model")
    assert path.endswith(os.path.join("tools", "analyze_model.py")) and os.path.isfile(path)
    assert detectron2_tool_path("analyze_model.py") == path
    script = tmp_path / "mine.py"
    script.write_text("")
    assert detectron2_tool_path(str(script)) == str(script)
    with pytest.raises(SystemExit) as exit_status:
        main(["analyse_model.py", "--tasks", "parameter"])
    assert exit_status.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: detectron2 script 'analyse_model.py' is neither")
    assert "analyze_model.py" in error and "\n" not in error


def test_a_script_of_an_editable_clone_is_found_by_name(tmp_path, monkeypatch):
    """``pip install -e`` of a detectron2 clone installs no tools/: the clone's own are used."""
    clone = tmp_path / "my detectron2"
    (clone / "tools").mkdir(parents=True)
    (clone / "tools" / "my_tool.py").write_text("")
    with pytest.raises(FileNotFoundError, match="my_tool"):
        detectron2_tool_path("my_tool")
    info = tmp_path / "site" / "detectron2-0.6.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: detectron2\nVersion: 0.6\n")
    (info / "direct_url.json").write_text(
        json.dumps({"url": clone.as_uri(), "dir_info": {"editable": True}})
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert detectron2_tool_path("my_tool") == str(clone / "tools" / "my_tool.py")


def test_detectron2s_get_cfg_has_lambda_det_keys_and_freezing_prepares_it(tmp_path):
    with lambda_det_in_detectron2():
        cfg = detectron2.config.get_cfg()
        cfg.merge_from_list(
            [
                "MODEL.DEVICE",
                "cpu",
                "MODEL.LAMBDA_RESNET.NORM",
                "SyncBN",
                "DATASETS.COCO_INSTANCES",
                f"[['d2tool_test', '{tmp_path}/a.json', '{tmp_path}']]",
            ]
        )
        cfg.freeze()
    assert cfg.MODEL.LAMBDA_RESNET.NORM == "naiveSyncBN"  # as load_config does on the CPU
    assert "d2tool_test" in detectron2.data.DatasetCatalog.list()
    detectron2.data.DatasetCatalog.remove("d2tool_test")
    detectron2.data.MetadataCatalog.remove("d2tool_test")
    assert "LAMBDA_RESNET" not in detectron2.config.get_cfg().MODEL  # only within


def test_detectron2s_loaders_get_lambda_det_mapper():
    with lambda_det_in_detectron2():
        cfg = detectron2.config.get_cfg()
        cfg.merge_from_list(["INPUT.LSJ.ENABLED", "True"])
        training = detectron2.data.build.DatasetMapper(cfg, True)
        evaluation = detectron2.data.build.DatasetMapper(cfg, False)
        explicit = detectron2.data.build.DatasetMapper(
            is_train=True, augmentations=[], image_format="BGR"
        )
    kinds = [type(augmentation) for augmentation in training.augmentations.augs]
    assert kinds == [T.ResizeScale, T.FixedSizeCrop, T.RandomFlip]
    assert [type(augmentation) for augmentation in evaluation.augmentations.augs] == [
        T.ResizeShortestEdge
    ]
    assert explicit.augmentations.augs == []
    assert detectron2.data.build.DatasetMapper is detectron2.data.DatasetMapper  # only within


def test_the_readme_runs_the_three_tools():
    assert set(README_COMMANDS) == {"analyze_model.py", "visualize_data.py", "benchmark.py"}


def run_readme_command(script: str, datasets_root, *extra: str, **options):
    words = shlex.split(README_COMMANDS[script])
    env = subprocess_env()
    env["DETECTRON2_DATASETS"] = str(datasets_root)
    return subprocess.Popen(
        [sys.executable, *words[1:], *extra, *TINY], env=env, cwd=REPO_ROOT, text=True, **options
    )


@pytest.mark.slow
@pytest.mark.e2e
def test_analyze_model_counts_parameters_and_flops(shapes, capsys, monkeypatch, one_torch_thread):
    """In this process (the other two README commands run as child processes); one input for
    the flops, which the README's 2 count one after the other."""
    installed_tool_or_skip("analyze_model")
    monkeypatch.chdir(REPO_ROOT)  # the README command's config path
    words = shlex.split(README_COMMANDS["analyze_model.py"])
    assert words[:3] == shlex.split(D2TOOL) and "--num-inputs" in words
    assert main([*words[3:], "--num-inputs", "1", *TINY]) == 0
    output = capsys.readouterr().out
    assert "backbone.bottom_up.res5" in output and "Total GFlops:" in output


@pytest.mark.slow
@pytest.mark.e2e
def test_visualize_data_shows_the_lsj_crops(tmp_path, datasets_root):
    """Detectron2's own mapper would resize the 256 x 256 images to 640..800 pixels."""
    installed_tool_or_skip("visualize_data")
    words = shlex.split(README_COMMANDS["visualize_data.py"])
    assert words[words.index("--output-dir") + 1] == "output/lsj_crops"
    with open(tmp_path / "log.txt", "w") as log:
        # Given last, --output-dir replaces the README's; the script draws until stopped.
        process = run_readme_command(
            "visualize_data.py",
            datasets_root,
            "--output-dir",
            str(tmp_path / "crops"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 600
            while (
                len(list(tmp_path.glob("crops/*.jpg"))) < 3
                and process.poll() is None
                and time.monotonic() < deadline
            ):
                time.sleep(1)
        finally:
            process.kill()
            process.wait()
    images = sorted(tmp_path.glob("crops/*.jpg"), key=lambda image: image.stat().st_mtime)
    assert len(images) >= 3, (tmp_path / "log.txt").read_text()[-3000:]
    # (the newest may be half-written)
    assert {cv2.imread(str(image)).shape for image in images[:-1]} == {(128, 128, 3)}


@pytest.mark.slow
@pytest.mark.e2e
def test_benchmark_times_the_training_loader(datasets_root):
    installed_tool_or_skip("benchmark")
    if (
        build_detectron2.installed_build_id(build_detectron2.detectron2_location())
        != build_detectron2.build_id()
    ):  # the np.percentile patch, for numpy 2.x
        pytest.skip("not lambda_det's current build of detectron2")
    pytest.importorskip(
        "psutil", reason="detectron2's benchmark.py imports psutil: pip install -e '.[d2tools]'"
    )
    process = run_readme_command(
        "benchmark.py", datasets_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    output, _ = process.communicate(timeout=1200)
    assert process.returncode == 0, output[-3000:]
    assert "DataLoader (1 GPUs x 0 workers, total bs=1): avg=" in output
    assert "Iteration 9 RAM Usage" in output
