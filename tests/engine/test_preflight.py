"""Checks before launch (lambda_det.engine.preflight): every bad setting, launch argument and
device of both training tools is one ``error:`` line with exit status 2 before OUTPUT_DIR is
touched; the memory lower bound refuses what cannot fit and accepts the shipped configs; a run
that left files but no checkpoint is a run: training over it takes --restart, which moves it
aside, and --resume says there is nothing to resume from."""

import hashlib
import time
from pathlib import Path

import pytest
import torch
from conftest import DEMO_CONFIG as CONFIG
from conftest import LAZY_TINY_OVERRIDES
from conftest import TINY_OVERRIDES as TINY
from detectron2.modeling import build_model

import lambda_det.data
from lambda_det.cli import check_dataset, lazyconfig_train_net
from lambda_det.cli import train_net as cli
from lambda_det.cli.checks import check_model
from lambda_det.cli.output_dir import RECORD_FILE, prepare_output_dir, record_run
from lambda_det.config.lazy import load_lazy_config
from lambda_det.engine import preflight
from lambda_det.engine.preflight import GIB, Setting, check_device, training_memory_lower_bound
from lambda_det.engine.run_settings import lazy_training_settings, yaml_training_settings
from lambda_det.layers import LambdaLayer
from lambda_det.run_config import load_config
from lambda_det.utils.errors import UserError

lambda_det.data.register_datasets()  # the bundled datasets, by name: importing registers none
LAZY_TINY = [*LAZY_TINY_OVERRIDES, "train.max_iter=2"]
MACHINE_MEMORY = 16 * GIB  # what the memory tests pretend the machine has available


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` (the lock file included) with a hash of its content."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def earlier_run(tmp_path) -> Path:
    """An OUTPUT_DIR holding a run: its checkpoint pointer, a checkpoint, logs and metrics."""
    folder = tmp_path / "run"
    folder.mkdir()
    for name in (
        "last_checkpoint",
        "model_0000009.pth",
        "metrics.json",
        "log.txt",
        "config.yaml",
        "events.out.tfevents.1.host",
    ):
        (folder / name).write_text(f"the earlier run's {name}\n")
    (folder / "last_checkpoint").write_text("model_0000009.pth")
    return folder


@pytest.fixture
def machine_memory(monkeypatch):
    """The machine has :data:`MACHINE_MEMORY` available, whatever this one has."""
    monkeypatch.setattr(preflight, "_memory_available_on_this_machine", lambda: MACHINE_MEMORY)


def one_error_line(capsys) -> str:
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    return errors[0]


def exit_status(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as error:
        return error.code


# The evaluation: the demo (full width) at a test size of 16000 (the bound: ~17 GiB).
FULL_WIDTH_AT_16000 = [
    "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER",
    "1.0",
    "INPUT.MIN_SIZE_TEST",
    "16000",
    "INPUT.MAX_SIZE_TEST",
    "16000",
    "DATASETS.TEST",
    "('lambda_det_shapes_val',)",
]
EVALUATION_TOO_LARGE = [
    "evaluation needs at least ~",
    "per process for one image of 16000x16000",
    "the machine has 16.0 GiB available: lower INPUT.MAX_SIZE_TEST",
]

# (tool flags, overrides, fragments of the error line)
BAD_YAML_INPUTS = {
    "num-gpus -1": (["--num-gpus", "-1"], [], ["--num-gpus", "got -1"]),
    "num-gpus 0, eval-only": (["--num-gpus", "0", "--eval-only"], [], ["--num-gpus", "got 0"]),
    "num-gpus 0": (["--num-gpus", "0"], [], ["--num-gpus", "got 0"]),
    "machine rank": (["--machine-rank", "1"], [], ["--machine-rank", "got 1"]),
    "negative LR": ([], ["SOLVER.BASE_LR", "-0.1"], ["SOLVER.BASE_LR", "got -0.1"]),
    "zero LR": ([], ["SOLVER.BASE_LR", "0.0"], ["SOLVER.BASE_LR", "got 0.0"]),
    "AMP dtype": (
        [],
        ["SOLVER.AMP.ENABLED", "True", "SOLVER.AMP.DTYPE", "int8"],
        ["SOLVER.AMP.DTYPE", "'int8'", "float16 or bfloat16"],
    ),
    "deterministic without seed": (
        [],
        ["DATALOADER.DETERMINISTIC", "True", "SEED", "-1"],
        ["DATALOADER.DETERMINISTIC", "SEED >= 0", "SEED=-1"],
    ),
    "MAX_ITER": ([], ["SOLVER.MAX_ITER", "-5"], ["SOLVER.MAX_ITER", "got -5"]),
    "step at MAX_ITER": ([], ["SOLVER.STEPS", "(2,)"], ["SOLVER.STEPS [2]", "SOLVER.MAX_ITER"]),
    "steps out of order": (
        [],
        ["SOLVER.MAX_ITER", "9", "SOLVER.STEPS", "(5, 3)"],
        ["SOLVER.STEPS [5, 3]", "increasing"],
    ),
    "LSJ scales": (
        [],
        ["INPUT.LSJ.MIN_SCALE", "2.0", "INPUT.LSJ.MAX_SCALE", "0.5"],
        ["INPUT.LSJ.MIN_SCALE", "INPUT.LSJ.MAX_SCALE", "got 2.0 and 0.5"],
    ),
    "LSJ image size 0": ([], ["INPUT.LSJ.IMAGE_SIZE", "0"], ["INPUT.LSJ.IMAGE_SIZE", "got 0"]),
    "checkpoint period": (
        [],
        ["SOLVER.CHECKPOINT_PERIOD", "0"],
        ["SOLVER.CHECKPOINT_PERIOD", "got 0"],
    ),
    "log period": ([], ["SOLVER.LOG_PERIOD", "0"], ["SOLVER.LOG_PERIOD", "got 0"]),
    "weight decay": ([], ["SOLVER.WEIGHT_DECAY", "-1.0"], ["SOLVER.WEIGHT_DECAY", "got -1.0"]),
    "workers": ([], ["DATALOADER.NUM_WORKERS", "-2"], ["DATALOADER.NUM_WORKERS", "got -2"]),
    "dist-url auto on 2 machines": (
        ["--num-machines", "2", "--dist-url", "auto"],
        [],
        ["--dist-url auto picks a port on one machine, not on 2"],
    ),
    "infinite LR": ([], ["SOLVER.BASE_LR", "1e999"], ["SOLVER.BASE_LR must be a finite", "inf"]),
    "infinite momentum": (
        [],
        ["SOLVER.MOMENTUM", "1e999"],
        ["SOLVER.MOMENTUM must be a finite number >= 0, got inf"],
    ),
    "infinite gamma": ([], ["SOLVER.GAMMA", "1e999"], ["SOLVER.GAMMA must be a finite number"]),
    "seed of 400,000 bits": (
        [],
        ["SEED", "0x" + "f" * 100_000],
        ["SEED an integer of 120412 digits exceeds numpy's largest seed"],
    ),
    "seed of 400,000 bits, eval-only": (
        ["--eval-only"],
        ["SEED", "-0x" + "f" * 100_000],
        ["SEED a negative integer of 120412 digits is below -(2**32 - 1)"],
    ),
    "device of 1 MB": (
        ["--eval-only"],
        ["MODEL.DEVICE", "x" * 10**6],
        ["MODEL.DEVICE 'xxxx", "... (1000000 characters) is not a torch device"],
    ),
    "device index": ([], ["MODEL.DEVICE", "cuda:99"], ["MODEL.DEVICE 'cuda:99'"]),
    "device kind": ([], ["MODEL.DEVICE", "mps"], ["MODEL.DEVICE 'mps'", "cuda or cpu"]),
    "image size too large": (
        [],
        ["INPUT.LSJ.IMAGE_SIZE", "16384"],
        ["16384x16384", "GiB", "INPUT.LSJ.IMAGE_SIZE"],
    ),
    "batch too large": (
        [],
        ["SOLVER.IMS_PER_BATCH", "10000"],
        ["10000 images", "GiB", "SOLVER.IMS_PER_BATCH"],
    ),
    "absurd image size": (
        [],
        ["INPUT.LSJ.IMAGE_SIZE", "100000000"],
        ["100000000x100000000", "INPUT.LSJ.IMAGE_SIZE"],
    ),
    "test size too large, eval-only": (["--eval-only"], FULL_WIDTH_AT_16000, EVALUATION_TOO_LARGE),
    "test size too large for the final evaluation": ([], FULL_WIDTH_AT_16000, EVALUATION_TOO_LARGE),
}


@pytest.mark.parametrize("case", BAD_YAML_INPUTS)
def test_a_bad_setting_stops_train_net_before_output_dir_is_touched(
    case, earlier_run, machine_memory, capsys
):
    flags, overrides, fragments = BAD_YAML_INPUTS[case]
    before = snapshot(earlier_run)
    status = exit_status(
        cli.main,
        [
            "--config-file",
            CONFIG,
            "--resume",
            *flags,
            *TINY,
            *overrides,
            "OUTPUT_DIR",
            str(earlier_run),
        ],
    )
    assert status == 2
    error = one_error_line(capsys)
    for fragment in fragments:
        assert fragment in error, (fragment, error)
    assert snapshot(earlier_run) == before  # no run.lock, log, config dump or metrics either


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_cuda_without_a_gpu_is_one_line(tmp_path, capsys):
    output = tmp_path / "fresh"
    for tool, argv in (
        (
            cli.main,
            ["--config-file", CONFIG, *TINY, "MODEL.DEVICE", "cuda", "OUTPUT_DIR", str(output)],
        ),
        (
            lazyconfig_train_net.main,
            [
                "--config",
                "lambda_r26_shapes",
                *LAZY_TINY,
                "train.device=cuda",
                f"train.output_dir={output}",
            ],
        ),
    ):
        assert exit_status(tool, argv) == 2
        assert "needs a CUDA GPU, and torch finds none" in one_error_line(capsys)
        assert not output.exists()


BAD_LAZY_INPUTS = {
    "num-gpus 0, eval-only": (["--num-gpus", "0", "--eval-only"], ["--num-gpus", "got 0"]),
    "negative LR": (["optimizer.lr=-0.1"], ["optimizer.lr", "got -0.1"]),
    "LR nan": (["optimizer.lr=nan"], ["optimizer.lr", "got nan"]),
    "momentum inf": (["optimizer.momentum=inf"], ["optimizer.momentum must be a finite number"]),
    "gamma nan": (["lr_multiplier.gamma=nan"], ["lr_multiplier.gamma must be a finite number"]),
    "AMP dtype": (
        ["train.amp.enabled=True", "train.amp.dtype=int8"],
        ["train.amp.dtype", "'int8'"],
    ),
    "max_iter": (["train.max_iter=-5"], ["train.max_iter", "got -5"]),
    "steps out of order": (
        ["train.max_iter=9", "lr_multiplier.steps=[5,3]"],
        ["lr_multiplier.steps [5, 3]"],
    ),
    "LSJ scales": (
        ["dataloader.train.mapper.augmentations.min_scale=2.0"],
        ["augmentations.min_scale", "got 2.0 and 1.5"],
    ),
    "LSJ image size 0": (
        ["dataloader.train.mapper.augmentations.image_size=0"],
        ["augmentations.image_size", "got 0"],
    ),
    "checkpoint period": (["train.checkpointer.period=0"], ["train.checkpointer.period"]),
    "image size too large": (
        ["dataloader.train.mapper.augmentations.image_size=16384"],
        ["16384x16384", "augmentations.image_size"],
    ),
    "batch too large": (
        ["dataloader.train.total_batch_size=10000"],
        ["10000 images", "dataloader.train.total_batch_size"],
    ),
    "test size too large, eval-only": (
        [
            "--eval-only",
            "model.backbone.bottom_up.width_multiplier=1.0",
            "dataloader.test.mapper.augmentations.0.short_edge_length=16000",
            "dataloader.test.mapper.augmentations.0.max_size=16000",
        ],
        [
            "evaluation needs at least ~",
            "one image of 16000x16000",
            "lower dataloader.test.mapper.augmentations.0.max_size",
        ],
    ),
}


@pytest.mark.parametrize("case", BAD_LAZY_INPUTS)
def test_a_bad_setting_stops_lazyconfig_train_net_before_output_dir_is_touched(
    case, tmp_path, machine_memory, capsys
):
    arguments, fragments = BAD_LAZY_INPUTS[case]
    flags = [item for item in arguments if item.startswith("--") or item.isdigit()]
    overrides = [item for item in arguments if item not in flags]
    output = tmp_path / "fresh"
    status = exit_status(
        lazyconfig_train_net.main,
        [
            "--config",
            "lambda_r26_shapes",
            *flags,
            *LAZY_TINY,
            *overrides,
            f"train.output_dir={output}",
        ],
    )
    assert status == 2
    error = one_error_line(capsys)
    for fragment in fragments:
        assert fragment in error, (fragment, error)
    assert not output.exists()


def test_the_shipped_settings_pass():
    """The negative control of the settings checks: the demo and the paper recipe pass."""
    for name in ("lambda_r26_shapes", "lambda_r152_mask_rcnn"):
        preflight.check_training_settings(yaml_training_settings(load_config(name)))
    recipe = load_lazy_config("lambda_r152_mask_rcnn")
    preflight.check_training_settings(lazy_training_settings(recipe))


def test_check_device_counts_the_gpus(monkeypatch):
    check_device(Setting("MODEL.DEVICE", "cpu"), num_gpus=4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device(Setting("MODEL.DEVICE", "cuda"), num_gpus=2)
    check_device(Setting("MODEL.DEVICE", "cuda:1"), num_gpus=1)
    with pytest.raises(
        ValueError,
        match=r"--num-gpus 3 needs 3 CUDA GPUs and this machine has "
        r"2: pass --num-gpus 2 or fewer",
    ):
        check_device(Setting("MODEL.DEVICE", "cuda"), num_gpus=3)
    with pytest.raises(ValueError, match=r"MODEL.DEVICE 'cuda:2': this machine has 2 CUDA"):
        check_device(Setting("MODEL.DEVICE", "cuda:2"), num_gpus=1)


# ---- the memory estimate ----


def tiny_cfg(*overrides):
    return load_config(CONFIG, [*TINY, *overrides])


def test_the_estimate_is_a_lower_bound_of_what_the_backbone_keeps():
    """On the meta device, the count matches what a real forward pass on the CPU keeps for
    backward (not more: a lower bound; not far less: it is counting the activations)."""
    cfg = tiny_cfg("MODEL.LAMBDA_RESNET.IMPL", "auto")
    estimate = training_memory_lower_bound(check_model(cfg), images=2, size=96)
    model = build_model(cfg)
    kept = {}

    def count(tensor):
        kept.setdefault(tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
        model.backbone(torch.zeros(2, 3, 96, 96))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    activations = sum(nbytes for key, nbytes in kept.items() if key not in parameters)
    assert 0.5 * activations < estimate - weights <= activations
    # Lambda layers are counted in their least-keeping form, and left as they were.
    assert all(layer.impl == "auto" for layer in model.modules() if isinstance(layer, LambdaLayer))


def test_the_estimate_refuses_what_cannot_fit_quickly(machine_memory):
    for overrides, fragments in (
        (["INPUT.LSJ.IMAGE_SIZE", "16384"], ["2 images of 16384x16384", "INPUT.LSJ.IMAGE_SIZE"]),
        (["SOLVER.IMS_PER_BATCH", "10000"], ["10000 images of 256x256", "SOLVER.IMS_PER_BATCH"]),
    ):
        cfg = tiny_cfg(*overrides)
        start = time.perf_counter()
        with pytest.raises(ValueError) as error:
            preflight.check_training_memory(
                check_model(cfg), yaml_training_settings(cfg), "cpu", num_gpus=1, world_size=1
            )
        assert time.perf_counter() - start < 20  # the runs allocated for minutes
        message = str(error.value)
        assert message.startswith("training needs at least ~")
        assert "the machine has 16.0 GiB available" in message
        for fragment in fragments:
            assert fragment in message
    # Two CPU processes share the machine's memory.
    cfg = tiny_cfg("SOLVER.IMS_PER_BATCH", "1000")
    with pytest.raises(ValueError, match="8.0 GiB for each of 2 processes"):
        preflight.check_training_memory(
            check_model(cfg), yaml_training_settings(cfg), "cpu", num_gpus=2, world_size=2
        )


def test_the_estimate_accepts_the_demo(machine_memory):
    """The negative control: the demo config (batch 8 of 256x256, evaluated at 256) fits."""
    cfg = load_config("lambda_r26_shapes")
    settings = yaml_training_settings(cfg)
    preflight.check_training_memory(check_model(cfg), settings, "cpu", num_gpus=1, world_size=1)
    assert (
        preflight.check_evaluation_memory(check_model(cfg), settings.test_size, "cpu", num_gpus=1)
        < 0.1 * GIB
    )


def test_an_absurd_size_is_refused_at_once_without_a_forward_pass(machine_memory, monkeypatch):
    """A side of 10^8 is refused by arithmetic: the forward pass on the meta device loops over
    a lambda layer's tiles (the issue's run printed nothing for 300 s)."""

    def no_forward_pass(*args, **kwargs):
        raise AssertionError("the forward pass ran")

    monkeypatch.setattr(preflight, "training_memory_lower_bound", no_forward_pass)
    monkeypatch.setattr(preflight, "evaluation_memory_lower_bound", no_forward_pass)
    cfg = tiny_cfg(
        "INPUT.LSJ.IMAGE_SIZE",
        "100000000",
        "INPUT.MAX_SIZE_TEST",
        "100000000",
        "INPUT.MIN_SIZE_TEST",
        "100000000",
    )
    model, settings = check_model(cfg), yaml_training_settings(cfg)
    start = time.perf_counter()
    with pytest.raises(
        ValueError,
        match=r"^training needs at least ~\d+\.\d GiB per process for "
        r"2 images of 100000000x100000000 .*: lower "
        r"SOLVER.IMS_PER_BATCH or INPUT.LSJ.IMAGE_SIZE$",
    ):
        preflight.check_training_memory(model, settings, "cpu", num_gpus=1, world_size=1)
    with pytest.raises(
        ValueError,
        match=r"^evaluation needs at least ~\d+\.\d GiB per process "
        r"for one image of 100000000x100000000 .*: lower "
        r"INPUT.MAX_SIZE_TEST \(the longest side",
    ):
        preflight.check_evaluation_memory(model, settings.test_size, "cpu", num_gpus=1)
    assert time.perf_counter() - start < 1


def test_the_evaluation_estimate_is_a_lower_bound_of_a_forward_pass():
    """On the meta device, the count lies between what a real forward pass on the CPU (no
    gradients) holds at its end, its input and outputs, and all it ever allocates."""
    cfg = tiny_cfg("MODEL.LAMBDA_RESNET.IMPL", "auto")
    estimate = preflight.evaluation_memory_lower_bound(check_model(cfg), size=96)
    model = build_model(cfg).eval()
    outputs = []
    handles = [
        module.register_forward_hook(lambda module, args, output: outputs.append(output))
        for module in model.backbone.modules()
    ]
    image = torch.zeros(1, 3, 96, 96)
    with torch.no_grad():
        features = model.backbone(image)
    for handle in handles:
        handle.remove()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())

    def nbytes(tensors):
        return sum(tensor.untyped_storage().nbytes() for tensor in tensors)

    at_the_end = nbytes([image, *features.values()])
    allocated = nbytes([image]) + nbytes(preflight._tensors(outputs))
    assert at_the_end <= estimate - weights <= allocated


def test_the_test_size_of_both_config_systems():
    """A square image's side at evaluation, named by the key that bounds every image."""
    assert yaml_training_settings(load_config(CONFIG)).test_size == Setting(
        "INPUT.MAX_SIZE_TEST", 256
    )
    assert (
        yaml_training_settings(
            load_config(CONFIG, ["INPUT.MIN_SIZE_TEST", "800", "INPUT.MAX_SIZE_TEST", "1333"])
        ).test_size.value
        == 800
    )
    assert (
        yaml_training_settings(load_config(CONFIG, ["INPUT.MIN_SIZE_TEST", "0"])).test_size is None
    )  # no resize: the images' own sizes
    assert lazy_training_settings(load_lazy_config("lambda_r26_shapes")).test_size == Setting(
        "dataloader.test.mapper.augmentations.0.max_size", 256
    )


@pytest.mark.slow
def test_the_paper_recipe_fits_an_80_gb_gpu(monkeypatch):
    """LambdaResNet-152 Mask R-CNN, 4 images of 1024x1024 per GPU: well under 80 GB."""
    cfg = load_config("lambda_r152_mask_rcnn")  # REFERENCE_WORLD_SIZE 64: 4 images per GPU
    properties = type("Properties", (), {"total_memory": 80 * 10**9})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
    scaled = yaml_training_settings(cli.scale_yaml_to_world_size(cfg, 8))
    assert (scaled.batch.value, scaled.input_size.value) == (32, 1024)
    estimate = preflight.check_training_memory(
        check_model(cfg), scaled, "cuda", num_gpus=8, world_size=8
    )
    assert 4 * GIB < estimate < 40 * GIB


# ---- a run that left files and no checkpoint ----

RUN_WITHOUT_CHECKPOINT = {
    "metrics.json": '{"iteration": 19}\n',
    "log.txt": "the first run\n",
    "config.yaml": "SEED: 1\n",
    "events.out.tfevents.1.host": "events",
}


@pytest.fixture
def killed_run(tmp_path) -> Path:
    """An OUTPUT_DIR whose run was killed before its first checkpoint (with the record of its
    files that a run writes first)."""
    folder = tmp_path / "run"
    folder.mkdir()
    record_run(folder)
    for name, text in RUN_WITHOUT_CHECKPOINT.items():
        (folder / name).write_text(text)
    (folder / "notes.md").write_text("not the run's")
    return folder


def assert_moved_aside(folder: Path, previous) -> None:
    previous = Path(previous)
    assert previous.parent == folder and previous.name.startswith("previous_")
    assert {
        name: (previous / name).read_text() for name in RUN_WITHOUT_CHECKPOINT
    } == RUN_WITHOUT_CHECKPOINT
    assert (previous / RECORD_FILE).is_file()  # the run's record went with its files
    new_run = ("run.lock", RECORD_FILE)  # what a new run there has written
    left = sorted(path.name for path in folder.iterdir() if path.name not in new_run)
    assert left == ["notes.md", previous.name]


@pytest.mark.parametrize("resume", [False, True])
def test_a_run_without_checkpoint_is_refused_without_restart(killed_run, resume):
    before = snapshot(killed_run)
    nothing = "it has no checkpoint to resume from, " if resume else ""
    with pytest.raises(
        FileExistsError,
        match=rf"stopped before its first checkpoint "
        rf"\(config.yaml, events.*\): {nothing}pass "
        rf"--restart",
    ):
        prepare_output_dir(str(killed_run), resume=resume, restart=False)
    assert snapshot(killed_run) == before


def test_restart_moves_a_run_without_checkpoint_aside(killed_run):
    assert_moved_aside(killed_run, prepare_output_dir(str(killed_run), resume=False, restart=True))
    # Nothing of a run's left: nothing to move, and nothing refused.
    assert prepare_output_dir(str(killed_run), resume=False, restart=False) is None
    assert prepare_output_dir(str(killed_run), resume=True, restart=False) is None


def test_another_machine_leaves_the_moving_to_machine_0(killed_run):
    assert prepare_output_dir(str(killed_run), resume=False, restart=True, machine_rank=1) is None
    assert (killed_run / "metrics.json").exists()


def _run_tool(tool, flags, folder):
    if tool == "train_net":
        return cli.main(["--config-file", CONFIG, *flags, *TINY, "OUTPUT_DIR", str(folder)])
    return lazyconfig_train_net.main(
        ["--config", "lambda_r26_shapes", *flags, *LAZY_TINY, f"train.output_dir={folder}"]
    )


@pytest.fixture
def launches(monkeypatch) -> list:
    """The tools' own flow up to the launch (the datasets' checks and the training stubbed)."""
    launched = []
    monkeypatch.setattr(cli, "launch", lambda *args, **kwargs: launched.append(args))
    monkeypatch.setattr(cli, "check_run_datasets", lambda data, training=True: None)
    return launched


@pytest.mark.parametrize("tool", ["train_net", "lazyconfig_train_net"])
def test_both_tools_restart_a_run_without_checkpoint(tool, killed_run, launches, capsys, shapes):
    assert _run_tool(tool, ["--restart"], killed_run) == 0 and len(launches) == 1
    (previous,) = [path for path in killed_run.iterdir() if path.name.startswith("previous_")]
    assert_moved_aside(killed_run, previous)
    printed = capsys.readouterr().out
    assert f"moved the previous run's files in {killed_run} to {previous}" in printed


@pytest.mark.parametrize("tool", ["train_net", "lazyconfig_train_net"])
@pytest.mark.parametrize("flags", [[], ["--resume"]])
def test_both_tools_refuse_a_run_without_checkpoint(tool, flags, killed_run, launches, capsys):
    before = snapshot(killed_run)
    with pytest.raises(SystemExit) as stopped:
        _run_tool(tool, flags, killed_run)
    assert stopped.value.code == 2 and not launches
    (line,) = capsys.readouterr().err.splitlines()
    key = "OUTPUT_DIR" if tool == "train_net" else "train.output_dir"  # as each config names it
    assert line.startswith(
        f"error: {key} {str(killed_run)!r} holds a run that stopped before its first checkpoint"
    )
    assert ("no checkpoint to resume from" in line) == bool(flags)
    after = snapshot(killed_run)
    after.pop("run.lock")  # the lock is taken before the folder is read
    assert after == before


@pytest.mark.parametrize("value", ["0", 0.5, True, None])
def test_a_seed_that_is_not_an_integer_is_refused(value):
    """Overrides are type-checked against the recipe's seed; a recipe may still set any value."""
    with pytest.raises(UserError, match=f"train.seed must be an integer, got {value!r}: set "):
        preflight.check_seed(Setting("train.seed", value))


def test_an_integer_seed_is_the_runs():
    assert [preflight.check_seed(Setting("SEED", value)) for value in (-1, 0, 7)] == [-1, 0, 7]
    assert preflight.check_seed(Setting("SEED", -(2**32 - 1))) == -(2**32 - 1)


HUGE = int("f" * 100_000, 16)  # the SEED: 400,000 bits


@pytest.mark.parametrize("value", [HUGE, -HUGE, -(2**32)], ids=["huge", "-huge", "-2**32"])
def test_a_seed_outside_its_range_is_one_short_line_at_once(value):
    start = time.perf_counter()
    with pytest.raises(UserError) as error:
        preflight.check_seed(Setting("SEED", value))
    assert time.perf_counter() - start < 1.0
    message = str(error.value)
    assert message.startswith("SEED ") and len(message) < 200, message
    assert "exceeds numpy's largest seed" in message or "below -(2**32 - 1)" in message


def test_a_huge_seed_cannot_be_printed():
    """The negative control: the seed in a message, as Python prints it, is a ValueError."""
    with pytest.raises(ValueError, match="Exceeds the limit"):
        f"{HUGE}"


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "key, value",
    [
        ("SOLVER.BASE_LR", NAN),
        ("SOLVER.BASE_LR", INF),
        ("SOLVER.MOMENTUM", INF),
        ("SOLVER.WEIGHT_DECAY", INF),
        ("SOLVER.GAMMA", NAN),
        ("SOLVER.WARMUP_FACTOR", INF),
        ("SOLVER.BIAS_LR_FACTOR", NAN),
        ("SOLVER.WEIGHT_DECAY_NORM", INF),
        ("SOLVER.CLIP_GRADIENTS.CLIP_VALUE", NAN),
    ],
)
def test_a_nan_or_infinite_solver_value_is_refused(key, value):
    cfg = load_config(CONFIG, freeze=False)
    *parents, leaf = key.split(".")
    node = cfg
    for part in parents:
        node = node[part]
    node[leaf] = value
    with pytest.raises(UserError, match=rf"^{key} must be a finite number.*, got {value}: set"):
        preflight.check_training_settings(yaml_training_settings(cfg))


def test_an_infinite_clip_norm_type_is_the_max_norm():
    """detectron2's CLIP_GRADIENTS.NORM_TYPE inf means the max norm: not refused."""
    cfg = load_config(CONFIG, ["SOLVER.CLIP_GRADIENTS.NORM_TYPE", "1e999"])
    preflight.check_training_settings(yaml_training_settings(cfg))


def test_torch_trains_to_nan_with_a_nan_learning_rate_or_momentum():
    """The negative control: torch's optimizer takes both, and its first step makes NaN."""
    for options in ({"lr": NAN}, {"lr": 0.1, "momentum": INF}):
        weight = torch.nn.Parameter(torch.ones(2))
        optimizer = torch.optim.SGD([weight], **options)
        for _ in range(2):
            weight.sum().backward()
            optimizer.step()
        assert not torch.isfinite(weight).any(), options


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("x" * 10**6, "MODEL.DEVICE 'xxxx"),
        ("cuda:" + "0" * 10**6, "... (1000005 characters) is not a torch device"),
        ("cuda:0" + " " * 20, "is not a torch device"),
        (0, "MODEL.DEVICE 0 is not a torch device"),
        ("mps", "MODEL.DEVICE 'mps': lambda_det trains and evaluates on cuda or cpu"),
    ],
    ids=["1 MB", "cuda:000...", "trailing spaces", "an integer", "mps"],
)
def test_a_device_that_is_no_device_name_is_one_short_line(value, fragment):
    with pytest.raises(UserError) as error:
        preflight.check_device_name(Setting("MODEL.DEVICE", value))
    assert fragment in str(error.value) and len(str(error.value)) < 300, str(error.value)


def test_a_device_name_is_checked_whatever_this_machine_has():
    assert preflight.check_device_name(Setting("MODEL.DEVICE", "cuda:1")).index == 1
    assert preflight.check_device_name(Setting("train.device", "cpu")).type == "cpu"


def test_torch_quotes_a_1_mb_device_string_whole():
    """The negative control: torch's own refusal is a line of a megabyte."""
    with pytest.raises(RuntimeError) as error:
        torch.device("x" * 10**6)
    assert len(str(error.value)) > 10**6


@pytest.mark.parametrize(
    "lines, fragment",
    [
        ("SOLVER:\n  BASE_LR: .nan\n", "SOLVER.BASE_LR must be a finite number > 0, got nan"),
        ("MODEL:\n  DEVICE: " + "x" * 10**6 + "\n", "(1000000 characters) is not a torch device"),
        ("SEED: -5000000000\n", "SEED -5000000000 is below -(2**32 - 1)"),
    ],
    ids=["LR nan", "device of 1 MB", "seed below its range"],
)
def test_check_dataset_refuses_the_values_train_net_refuses(tmp_path, capsys, lines, fragment):
    """tools/check_dataset.py --config: the config's values pass train_net's pre-flight first."""
    config = tmp_path / "config.yaml"
    config.write_text(f"_BASE_: {CONFIG}\n{lines}")
    assert exit_status(check_dataset.main, ["--config", str(config)]) == 2
    assert fragment in one_error_line(capsys)


@pytest.mark.parametrize(
    "seed, world_size, refused",
    [(2**32 - 1, 1, False), (2**32, 1, True), (2**32 - 2, 2, False), (2**32 - 1, 2, True)],
)
def test_a_seed_numpy_cannot_take_is_refused(seed, world_size, refused):
    """Each process seeds numpy with seed + rank, below 2**32."""
    if not refused:
        assert preflight.check_seed(Setting("SEED", seed), world_size) == seed
        return
    with pytest.raises(UserError, match=f"SEED {seed}.* exceeds numpy's largest seed, 2\\*\\*32"):
        preflight.check_seed(Setting("SEED", seed), world_size)


def test_an_evaluation_on_several_machines_needs_a_folder_of_its_own(earlier_run, tmp_path):
    """Each machine plans its evaluation: a new eval_<date-time>/ folder would differ."""
    with pytest.raises(UserError, match=r"--eval-only on 2 machines: OUTPUT_DIR .* holds a run"):
        cli.plan_evaluation(str(earlier_run), "w.pth", num_machines=2)
    fresh = tmp_path / "fresh"
    assert cli.plan_evaluation(str(fresh), "w.pth", num_machines=2) == (str(fresh), "w.pth")
    assert not fresh.exists()
    # One machine: a folder of its own inside the run's.
    planned = cli.plan_evaluation(str(earlier_run), "w.pth")
    assert planned.output_dir.startswith(str(earlier_run / "eval_"))
