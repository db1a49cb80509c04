"""Shared test helpers. Everything runs on the CPU with small shapes."""

import fcntl
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

import pytest

from lambda_det.compat import torch_features

# Under pytest-xdist (`make test` runs `-n 2`) every worker, and every tool it starts in a
# subprocess, uses one torch thread: a thread per core in each worker oversubscribes the cores.
# Set before torch is imported, which reads it once.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "configs"


def overrides(settings: dict) -> list:
    """A command line's KEY VALUE overrides: ``{KEY: value}`` flattened, each value as str."""
    return [str(item) for key, value in settings.items() for item in (key, value)]


# The demo's model at a quarter width on the CPU, with BN in the backbone, the FPN and the heads.
TINY_BN_MODEL = {
    "MODEL.DEVICE": "cpu",
    "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": 0.25,
    "MODEL.LAMBDA_RESNET.SCOPE": 3,
    "MODEL.LAMBDA_RESNET.NORM": "BN",
    "MODEL.FPN.NORM": "BN",
    "MODEL.ROI_BOX_HEAD.NORM": "BN",
    "MODEL.ROI_MASK_HEAD.NORM": "BN",
}
# A tiny training on the shapes dataset (checkpoint, data, config and engine tests).
TINY_RUN = {
    **TINY_BN_MODEL,
    "SOLVER.IMS_PER_BATCH": 2,
    "SOLVER.WARMUP_ITERS": 2,
    "SOLVER.STEPS": (3, 5),
    "SOLVER.MAX_ITER": 6,
    "SOLVER.CHECKPOINT_PERIOD": 3,
    "DATALOADER.NUM_WORKERS": 0,
    "DATALOADER.DETERMINISTIC": True,
    "SEED": 7,
    "DATASETS.TEST": (),
}


def tiny_cfg(output_dir: Path, **changes):
    """The demo config (LambdaResNet-26 Mask R-CNN on the shapes dataset) at a quarter width, BN,
    6 iterations of 2 images, deterministic loader, no test set; KEY=value overrides win."""
    import lambda_det

    cfg = lambda_det.get_cfg()
    cfg.merge_from_file(str(CONFIGS / "Demo/lambda_r26_shapes.yaml"))
    cfg.merge_from_list(overrides({**TINY_RUN, **changes, "OUTPUT_DIR": output_dir}))
    return cfg


# No test writes the shapes dataset into the checkout (./datasets, the default
# DETECTRON2_DATASETS): tests read the copy of :func:`datasets_root` (or a tmp folder). The run
# fails when ./datasets appeared during it.
CHECKOUT_DATASETS = REPO_ROOT / "datasets"
_DATASETS_BEFORE = pytest.StashKey[bool]()


def pytest_sessionstart(session):
    session.config.stash[_DATASETS_BEFORE] = CHECKOUT_DATASETS.exists()


def pytest_sessionfinish(session, exitstatus):
    if XDIST_WORKER or session.config.stash.get(_DATASETS_BEFORE, True):
        return  # pytest-xdist's controller checks once for all workers
    if CHECKOUT_DATASETS.exists():
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"error: a test wrote {CHECKOUT_DATASETS} into the checkout: give "
                "it the datasets_root or shapes fixture",
                red=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _all_loggers() -> list:
    return [
        logging.getLogger(),
        *(
            logger
            for logger in logging.Logger.manager.loggerDict.values()
            if isinstance(logger, logging.Logger)
        ),
    ]


@pytest.fixture(autouse=True)
def _logging_handlers_of_the_test_only():
    """A tool run in-process sets up detectron2's loggers, whose console handlers write to the
    test's captured stream: drop them afterwards, or a later test's log lines go to a closed
    stream ("--- Logging error ---" in that test's stderr)."""
    before = {logger.name: list(logger.handlers) for logger in _all_loggers()}
    yield
    for logger in _all_loggers():
        for handler in logger.handlers[:]:
            if handler not in before.get(logger.name, []):
                logger.removeHandler(handler)
                handler.close()
    try:
        from detectron2.utils.logger import setup_logger
    except ImportError:
        return
    setup_logger.cache_clear()  # memoized: the next run sets its handlers up again


def tiny_detection_batch(sizes=((64, 96), (96, 64)), with_sem_seg: bool = False) -> list:
    """Detectron2 training inputs: two boxes with masks in each image (and a semantic map)."""
    from detectron2.structures import BitMasks, Boxes, Instances

    batch = []
    for height, width in sizes:
        instances = Instances((height, width))
        instances.gt_boxes = Boxes(torch.tensor([[4.0, 6.0, 40.0, 50.0], [20.0, 10.0, 60.0, 30.0]]))
        instances.gt_classes = torch.tensor([0, 2])
        masks = torch.zeros(2, height, width, dtype=torch.bool)
        masks[0, 6:50, 4:40] = True
        masks[1, 10:30, 20:60] = True
        instances.gt_masks = BitMasks(masks)
        record = {
            "image": torch.randint(0, 256, (3, height, width), dtype=torch.uint8),
            "instances": instances,
            "height": height,
            "width": width,
        }
        if with_sem_seg:
            record["sem_seg"] = torch.randint(0, 4, (height, width))
        batch.append(record)
    return batch


def load_tool(name: str) -> ModuleType:
    """A stdlib-only script of tools/ (build_detectron2, detectron2_C_stub: they run before
    lambda_det is installed), imported by path to call its functions; the other tools are the
    modules lambda_det.cli.<name>."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The tools whose commands are in benchmarks/ of the checkout (not installed), by script name.
BENCHMARK_COMMANDS = {
    "benchmark_lambda": "benchmarks.lambda_layer",
    "benchmark_detector": "benchmarks.detector_step",
    "count_kernels": "benchmarks.count_kernels",
    "gpu_report": "benchmarks.gpu_report",
}


def tool_module(name: str) -> ModuleType:
    """The module whose ``main(argv)`` tools/<name>.py runs: lambda_det.cli.<name>, or a
    benchmark's command in benchmarks/ (pytest.ini puts the checkout on sys.path)."""
    return importlib.import_module(BENCHMARK_COMMANDS.get(name, f"lambda_det.cli.{name}"))


def exit_status(main, argv, capsys):
    """(exit status, stderr) of a tool's ``main(argv)`` run in this process."""
    try:
        status = main([str(arg) for arg in argv])
    except SystemExit as exit:
        status = exit.code
    return status, capsys.readouterr().err


def assert_one_line_error(status, stderr, *fragments):
    """A user's mistake: exit status 2, one ``error:`` line holding each fragment, no traceback."""
    assert status == 2, (status, stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


def subprocess_env(**variables: str) -> dict:
    """The environment for a child interpreter: this one's, minus warning filters set by pytest,
    with ``variables`` set."""
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    env.update(variables)
    return env


def run_python(*args, env=None, cwd=REPO_ROOT, timeout=300) -> subprocess.CompletedProcess:
    """A child interpreter run with ``args`` in ``cwd``, its output captured as text; ``env``
    is :func:`subprocess_env` unless given."""
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        env=subprocess_env() if env is None else env,
        cwd=cwd,
        timeout=timeout,
    )


def run_tool(script: str, *args, datasets_root: Path, timeout: int = 600, **variables: str):
    """tools/<script> run with ``args`` as a user runs it, a child process that reads the
    datasets of ``datasets_root`` (and has ``variables`` set)."""
    env = subprocess_env(DETECTRON2_DATASETS=str(datasets_root), **variables)
    return run_python(REPO_ROOT / "tools" / script, *args, env=env, timeout=timeout)


def run_folder(tmp_path_factory) -> Path:
    """This run's temporary folder that pytest-xdist's workers share: the one that holds their
    own temporary folders (or the run's own without pytest-xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if XDIST_WORKER else base


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` of :func:`run_folder`, filled by ``build(folder)`` once per run: the
    first worker that asks builds it while the other waits on the lock (a module-scoped fixture
    is built once per worker that runs one of its tests). A build that raised is done again by
    the next test that asks, from an empty folder."""
    shared = run_folder(tmp_path_factory)
    folder, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def datasets_root(tmp_path_factory) -> Path:
    """A DETECTRON2_DATASETS folder with the bundled shapes dataset (tests only read it).

    Generated once, then kept beside pytest's numbered run folders (pytest-of-<user>/) under a
    key of what the images are drawn from: the generator's source (lambda_det/data/shapes.py,
    with the dataset's VERSION) and the numpy and OpenCV that draw them. A later run, or a
    pytest-xdist worker, with the same key reads the same folder; the first one generates it
    while the others wait on the lock."""
    import cv2
    import numpy

    from lambda_det.data import shapes

    key = hashlib.sha256(Path(shapes.__file__).read_bytes())
    key.update(f"numpy {numpy.__version__} opencv {cv2.__version__}".encode())
    cache = run_folder(tmp_path_factory).parent / "lambda_det-cache"
    root = cache / f"datasets-{key.hexdigest()[:16]}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(f"{root.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shapes.ensure_shapes_dataset(root / f"lambda_det_shapes_{shapes.VERSION}")
    return root


@pytest.fixture(scope="session")
def small_datasets_root(tmp_path_factory, datasets_root) -> Path:
    """A DETECTRON2_DATASETS folder with the bundled shapes dataset cut to 8 validation images,
    in val.json and in val/ (an evaluation or a prediction of the split in seconds); tests only
    read it."""
    from lambda_det.data.shapes import VERSION

    def cut(root: Path):
        data = root / f"lambda_det_shapes_{VERSION}"
        shutil.copytree(datasets_root / data.name, data)
        val = json.loads((data / "val.json").read_text())
        val["images"] = val["images"][:8]
        kept = {image["id"] for image in val["images"]}
        val["annotations"] = [a for a in val["annotations"] if a["image_id"] in kept]
        (data / "val.json").write_text(json.dumps(val))
        names = {image["file_name"] for image in val["images"]}
        for image in (data / "val").iterdir():
            if image.name not in names:
                image.unlink()

    return built_once(tmp_path_factory, "small_datasets", cut)


# The demo config at a quarter width, 4 iterations of 2 images, fewer proposals and detections
# than the demo's at test time: a run that trains and evaluates in seconds.
TINY_EVALUATED_RUN = overrides(
    {
        "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": "0.25",
        "MODEL.LAMBDA_RESNET.SCOPE": "3",
        "SOLVER.IMS_PER_BATCH": "2",
        "SOLVER.MAX_ITER": "4",
        "SOLVER.STEPS": "(2, 3)",
        "SOLVER.WARMUP_ITERS": "1",
        "DATALOADER.NUM_WORKERS": "0",
        "MODEL.RPN.POST_NMS_TOPK_TEST": "50",
        "TEST.DETECTIONS_PER_IMAGE": "20",
    }
)


@pytest.fixture(scope="session")
def evaluated_run(tmp_path_factory, small_datasets_root) -> Path:
    """A folder holding ``run/``, the OUTPUT_DIR of ``tools/train_net.py --config
    lambda_r26_shapes TINY_EVALUATED_RUN`` run as a user runs it (a child process, on
    :func:`small_datasets_root`): trained, checkpointed and evaluated on its validation split;
    beside it the child's ``stdout.txt`` and ``stderr.txt``. Built once per run, shared by the
    tests that read it (tests/engine/test_training_pipeline.py, tests/tools/test_predict.py):
    copy it before changing it."""

    def train(folder: Path):
        argv = ["--config", "lambda_r26_shapes", *TINY_EVALUATED_RUN, "OUTPUT_DIR", folder / "run"]
        result = run_tool("train_net.py", *argv, datasets_root=small_datasets_root, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        (folder / "stdout.txt").write_text(result.stdout)
        (folder / "stderr.txt").write_text(result.stderr)

    return built_once(tmp_path_factory, "evaluated_run", train)


def _shapes_registered_from(root: Path, monkeypatch):
    import lambda_det.data

    monkeypatch.setenv("DETECTRON2_DATASETS", str(root))
    lambda_det.data.register_shapes_datasets()  # the folder is fixed when registered
    yield
    monkeypatch.undo()
    lambda_det.data.register_shapes_datasets()


@pytest.fixture
def shapes(monkeypatch, datasets_root):
    """The bundled shapes datasets registered from :func:`datasets_root` (for tools that load
    them by name), and registered again from the default folder afterwards."""
    yield from _shapes_registered_from(datasets_root, monkeypatch)


@pytest.fixture
def small_shapes(monkeypatch, small_datasets_root):
    """:func:`shapes` from :func:`small_datasets_root` (8 validation images)."""
    yield from _shapes_registered_from(small_datasets_root, monkeypatch)


@pytest.fixture(scope="module")
def one_torch_thread():
    """For modules of tiny models (their module fixtures included): a second thread only fights
    other processes for the cores (measured 3x slower on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---- the demo config at tool size, and weights files whose loading would run code ----

DEMO_CONFIG = str(CONFIGS / "Demo/lambda_r26_shapes.yaml")
# The demo config at a quarter width, 2 iterations of 2 images, no test set (tool command lines).
TINY_OVERRIDES = overrides(
    {
        "MODEL.DEVICE": "cpu",
        "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER": "0.25",
        "MODEL.LAMBDA_RESNET.SCOPE": "3",
        "SOLVER.IMS_PER_BATCH": "2",
        "SOLVER.MAX_ITER": "2",
        "SOLVER.STEPS": "(1,)",
        "SOLVER.WARMUP_ITERS": "1",
        "DATALOADER.NUM_WORKERS": "0",
        "DATASETS.TEST": "()",
    }
)
# The demo's LazyConfig recipe at a quarter width, 2 images a batch, on the CPU (key=value
# overrides; each test sets its iterations).
LAZY_TINY_OVERRIDES = [
    "model.backbone.bottom_up.width_multiplier=0.25",
    "model.backbone.bottom_up.scope=3",
    "dataloader.train.total_batch_size=2",
    "dataloader.train.num_workers=0",
    "train.device=cpu",
]


def comparison_options(output, config: str = "lambda_r26_shapes") -> list:
    """tools/compare_backbones.py's options for ``config``'s conv twin and lambda backbone, seed 0,
    into ``output``."""
    variants = ["--variant", "conv", "lambda", "--seeds", "0"]
    return ["--config", config, *variants, "--output", str(output)]


class Payload:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def tiny_model():
    """The Mask R-CNN of DEMO_CONFIG with TINY_OVERRIDES, seeded."""
    from detectron2.modeling import build_model

    from lambda_det.run_config import load_config

    torch.manual_seed(0)
    return build_model(load_config(DEMO_CONFIG, TINY_OVERRIDES))


def write_payload(path: Path, kind: str, marker: Path) -> Path:
    """A weights file of ``kind`` ("pkl", "pth" zip, "pth-legacy") whose loading would run code."""
    weights = {key: value.numpy() for key, value in tiny_model().state_dict().items()}
    if kind == "pkl":
        data = {"model": weights, "__author__": "someone", "evil": Payload(marker)}
        path.write_bytes(pickle.dumps(data, protocol=2))
    else:
        data = {
            "model": {key: torch.from_numpy(value) for key, value in weights.items()},
            "evil": Payload(marker),
        }
        torch.save(data, path, _use_new_zipfile_serialization=(kind == "pth"))
    return path


# ---- the README's commands (and those of the docs/ pages it links) ----

README = REPO_ROOT / "README.md"
VENV_PYTHON = ".venv/bin/python "  # the README's other way to run a tool: as "python " here
ACTIVATE = "source .venv/bin/activate"


def linked_docs() -> list:
    """The docs/ pages the README links, in order of first link."""
    names = re.findall(r"\]\((docs/[\w-]+\.md)[)#]", README.read_text())
    return [REPO_ROOT / name for name in dict.fromkeys(names)]


def bash_commands(path) -> list:
    return bash_commands_of(path.read_text())


def bash_commands_of(text: str) -> list:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()  # a trailing comment
            if line.startswith(VENV_PYTHON):
                line = "python " + line[len(VENV_PYTHON) :]
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def readme_commands():
    """The commands of the README's bash blocks and of the docs/ pages it links."""
    return [command for path in [README, *linked_docs()] for command in bash_commands(path)]


COMMANDS = readme_commands()


# A test that needs torch.export of lambda layers skips, naming the feature, on a torch without it.
NEEDS_IS_EXPORTING = pytest.mark.skipif(
    not torch_features.HAS_IS_EXPORTING,
    reason="needs torch.compiler.is_exporting (torch>=2.6)",
)
# A test of the whole-detector export's fake torchvision::nms needs fake kernels that stack.
NEEDS_FAKE_KERNELS_STACK = pytest.mark.skipif(
    not torch_features.fake_kernels_stack(),
    reason="needs torch.library.register_fake to replace a fake kernel (torchvision::nms's)",
)
