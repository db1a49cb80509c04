"""The shipped configs, found by name from a checkout and from an installed wheel."""

import shutil
import subprocess
import sys

import pytest
from conftest import CONFIGS, REPO_ROOT, subprocess_env

from lambda_det import model_zoo
from lambda_det.config import shipped


def test_names_paths_and_mistakes():
    assert model_zoo.config_root() == CONFIGS
    full = "COCO-InstanceSegmentation/lambda_r152_mask_rcnn.yaml"
    assert model_zoo.get_config_file(full) == str(CONFIGS / full)
    assert model_zoo.get_config_file("lambda_r152_mask_rcnn") == str(CONFIGS / full)
    assert "Demo/lambda_r26_shapes.yaml" in model_zoo.list_configs()
    with pytest.raises(
        FileNotFoundError,
        match="'lambda_r999' is neither a file nor a shipped "
        "config; shipped: .*lambda_r152_mask_rcnn.yaml",
    ):
        model_zoo.get_config_file("lambda_r999")
    cfg = model_zoo.get_config("lambda_r101_mask_rcnn", ["MODEL.LAMBDA_RESNET.SCOPE", "7"])
    assert (cfg.MODEL.LAMBDA_RESNET.DEPTH, cfg.MODEL.LAMBDA_RESNET.SCOPE) == (101, 7)
    assert not cfg.is_frozen()


def test_ambiguous_names_are_refused(tmp_path, monkeypatch):
    for folder in ("A", "B"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same.yaml").write_text("SEED: 1\n")
    monkeypatch.setattr(shipped, "config_root", lambda: tmp_path)
    with pytest.raises(
        FileNotFoundError,
        match=r"'same' is ambiguous: give one of "
        r"\['A/same.yaml', 'B/same.yaml'\]",
    ):
        model_zoo.get_config_file("same")


@pytest.mark.slow
def test_configs_resolve_from_an_installed_wheel_in_another_folder(tmp_path):
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in tracked:  # a copy, so that the build leaves nothing in the checkout
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(source),
            "-w",
            str(wheels),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("lambda_det-*.whl")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    env = subprocess_env()
    env["PYTHONPATH"] = str(site)  # before the checkout's editable install
    script = (
        "import lambda_det, lambda_det.model_zoo as zoo; print(lambda_det.__file__); "
        "print(zoo.get_config_file('lambda_r152_mask_rcnn')); "
        "print(zoo.get_config('lambda_r152_mask_rcnn').MODEL.LAMBDA_RESNET.DEPTH); "
        "print(zoo.get_config('lambda_r152_mask_rcnn.py').model.backbone.bottom_up.depth)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=elsewhere
    )
    assert result.returncode == 0, result.stderr[-2000:]
    package, config, depth, lazy_depth = result.stdout.split()
    assert package == str(site / "lambda_det" / "__init__.py")
    assert config == str(
        site / "lambda_det/model_zoo/configs/COCO-InstanceSegmentation/lambda_r152_mask_rcnn.yaml"
    )
    assert depth == lazy_depth == "152"  # the LazyConfig recipe and its common/ pieces ship too


def _schedule(name: str) -> tuple:
    """(max_iter, checkpoint period) of a shipped yaml config or LazyConfig recipe."""
    if name.endswith(".py"):
        from lambda_det.config.lazy import load_lazy_config

        cfg = load_lazy_config(model_zoo.get_config_file(name), [])
        return cfg.train.max_iter, cfg.train.checkpointer.period
    cfg = model_zoo.get_config(name)
    return cfg.SOLVER.MAX_ITER, cfg.SOLVER.CHECKPOINT_PERIOD


@pytest.mark.parametrize(
    "name",
    [
        name
        for name in model_zoo.list_configs()
        if not name.rsplit("/", 1)[-1].startswith(("Base-", "common")) and "/common/" not in name
    ],
)
def test_every_shipped_config_checkpoints_before_its_end(name):
    """An interruption loses one checkpoint period, not the run: at least two checkpoints come
    before the final one."""
    max_iter, period = _schedule(name)
    assert 1 <= period <= max_iter // 3, (name, max_iter, period)
