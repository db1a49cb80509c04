"""Each private or module-global name of detectron2 and fvcore that lambda_det relies on
(:mod:`lambda_det.compat.internals`, and the protected members its subclasses use) is still there
and behaves as relied on. Checked against detectron2 0.6 (pb1-detectron2, the .venv/ build) and
detectron2 main at 02b5c4e; ``detectron2.__version__`` appears in the messages as information
only: each test checks the name itself, so it fails on a detectron2 that changed it."""

import importlib
import weakref

import pytest
import torch

from lambda_det.compat import import_detectron2, internals

import_detectron2()  # quietly, before the detectron2 imports below

from conftest import tiny_cfg
from detectron2 import __version__ as DETECTRON2_VERSION
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.engine import DefaultTrainer, SimpleTrainer, TrainerBase, defaults
from detectron2.engine.hooks import EvalHook, PeriodicWriter
from detectron2.utils import comm
from detectron2.utils.events import EventStorage, JSONWriter
from detectron2.utils.registry import Registry
from fvcore.common.checkpoint import Checkpointer
from fvcore.nn import FlopCountAnalysis
from iopath.common.file_io import PathManager

from lambda_det.checkpoint.checkpointer import AtomicCheckpointer
from lambda_det.engine import Trainer
from lambda_det.engine.amp import MixedPrecisionTrainer

CHECKED = f"(checked with detectron2 0.6 and main 02b5c4e; installed: {DETECTRON2_VERSION})"


def uses(function, name: str) -> bool:
    """Whether ``function``'s code names ``name`` (a global or an attribute)."""
    return name in function.__code__.co_names


def test_highlight_is_what_default_setup_colours_config_files_with_0_6_and_main():
    assert uses(defaults.default_setup, "_highlight"), CHECKED
    pytest.importorskip("pygments")
    yaml = "MODEL:\n  DEVICE: cpu\n"
    assert "\x1b[" in defaults._highlight(yaml, "config.yaml"), CHECKED  # coloured without
    with internals.plain_config_printouts():
        assert defaults._highlight(yaml, "config.yaml") == yaml
    assert "\x1b[" in defaults._highlight(yaml, "config.yaml")  # and again after


def test_eval_hook_keeps_its_period_and_function_0_6_and_main():
    def evaluate():
        return {}

    hook = EvalHook(5, evaluate)
    assert internals.eval_hook_arguments(hook) == (5, evaluate), CHECKED


def test_eval_hook_drops_its_function_after_training_0_6_and_main():
    """What :func:`release_eval_function` does when the final hook does not evaluate."""

    class FinishedTrainer:
        iter, max_iter = 4, 4

    hook = EvalHook(0, dict)
    hook.trainer = FinishedTrainer()
    hook.after_train()
    assert not hasattr(hook, "_func"), CHECKED
    hook = EvalHook(0, dict)
    internals.release_eval_function(hook)
    assert not hasattr(hook, "_func")


def test_periodic_writer_holds_its_writers_0_6_and_main(tmp_path):
    writers = [JSONWriter(str(tmp_path / "metrics.json"))]
    assert internals.periodic_writer_writers(PeriodicWriter(writers)) == writers, CHECKED
    writers[0].close()


def test_trainer_base_lists_its_registered_hooks_0_6_and_main():
    trainer, hook = TrainerBase(), EvalHook(0, dict)
    trainer.register_hooks([hook])
    assert internals.registered_hooks(trainer) == [hook], CHECKED
    assert hook.trainer == weakref.proxy(trainer)


def test_default_trainer_runs_its_steps_with_the_inner_trainer_set_0_6_and_main():
    """DefaultTrainer's run_step (the same in 0.6 and main) uses the step trainer that
    set_inner_trainer sets, as DefaultTrainer.__init__ sets it."""
    for method in (DefaultTrainer.__init__, DefaultTrainer.run_step):
        assert uses(method, "_trainer"), f"{method.__qualname__} {CHECKED}"
    trainer = DefaultTrainer.__new__(DefaultTrainer)
    step_trainer = SimpleTrainer.__new__(SimpleTrainer)
    internals.set_inner_trainer(trainer, step_trainer)
    assert internals.inner_trainer(trainer) is step_trainer


def test_the_trainer_gets_lambda_dets_step_trainer_and_checkpointer(tmp_path, shapes):
    """detectron2's DefaultTrainer.__init__ would make an AMPTrainer and a DetectionCheckpointer
    here (neither is lambda_det's); detectron2's module is left as it is."""
    cfg = tiny_cfg(tmp_path, **{"SOLVER.AMP.ENABLED": True, "SOLVER.AMP.DTYPE": "bfloat16"})
    trainer = Trainer(cfg)
    step_trainer = internals.inner_trainer(trainer)
    assert type(step_trainer) is MixedPrecisionTrainer
    assert step_trainer.dtype == torch.bfloat16 and step_trainer.device_type == "cpu"
    assert type(trainer.checkpointer) is AtomicCheckpointer
    assert trainer.checkpointer.model is trainer.model  # one process: no DDP wrapper
    assert trainer.data_loader is step_trainer.data_loader
    assert defaults.DetectionCheckpointer is DetectionCheckpointer  # restored


def test_default_trainer_steps_with_its_inner_trainer_0_6_and_main():
    """DefaultTrainer.run_step runs the ``_trainer`` its __init__ builds (whose state
    Trainer.state_dict saves; its build: the test above)."""
    assert uses(DefaultTrainer.__init__, "_trainer"), CHECKED
    assert uses(DefaultTrainer.run_step, "_trainer"), CHECKED

    class Holder:
        _trainer = "inner"

    assert internals.inner_trainer(Holder()) == "inner"


def _simple_trainer(data_loader) -> SimpleTrainer:
    model = torch.nn.Linear(1, 1)
    return SimpleTrainer(model, data_loader, torch.optim.SGD(model.parameters(), lr=0.1))


def test_simple_trainer_steps_through_one_iterator_of_its_loader_0_6_and_main():
    """``_data_loader_iter``: made by __init__ in 0.6, on first use in main; run_step reads it.
    Batches follow each other: a new iterator would give the first again."""
    assert uses(SimpleTrainer.run_step, "_data_loader_iter"), CHECKED
    trainer = _simple_trainer([{"batch": 0}, {"batch": 1}])
    assert internals.next_training_batch(trainer) == {"batch": 0}, CHECKED
    assert internals.next_training_batch(trainer) == {"batch": 1}, CHECKED


def test_simple_trainer_writes_a_steps_losses_and_data_time_0_6_and_main():
    """What run_step writes after the backward pass (``_write_metrics``), as MixedPrecisionTrainer
    writes it: the losses, their total and the data time, in the event storage."""
    assert uses(SimpleTrainer.run_step, "_write_metrics"), CHECKED
    trainer = _simple_trainer([])
    with EventStorage(0) as storage:
        losses = {"loss_cls": torch.tensor(1.5), "loss_box_reg": torch.tensor(0.25)}
        internals.write_step_metrics(trainer, losses, 0.125)
        latest = {name: value for name, (value, _) in storage.latest().items()}
    written = {"loss_cls": 1.5, "loss_box_reg": 0.25, "total_loss": 1.75, "data_time": 0.125}
    assert latest.items() >= written.items(), CHECKED  # main: rank_data_time too


def test_json_writer_appends_to_its_file_after_a_rewrite_0_6_and_main(tmp_path):
    """MetricsWriter.drop_after rewrites metrics.json in between: the writer appends to the
    new file."""
    path = tmp_path / "metrics.json"
    writer = JSONWriter(str(path))
    with internals.reopened_json_writer(writer, str(path)):
        path.unlink()  # closed by now: another file takes the name
        path.write_text('{"iteration": 0}\n')
    with EventStorage(1) as storage:
        storage.put_scalar("total_loss", 0.5)
        writer.write()
    writer.close()
    assert path.read_text().splitlines() == [
        '{"iteration": 0}',
        '{"iteration": 1, "total_loss": 0.5}',
    ], CHECKED


def test_a_registry_takes_a_replacement_under_a_registered_name_0_6_and_main():
    """``register`` refuses a name twice (why tools/detectron2_tests_conftest.py replaces
    detectron2's ResNet builders through :func:`replace_registered`); ``get`` then finds the
    replacement."""
    registry = Registry("TEST")
    registry.register(len)
    with pytest.raises(AssertionError, match="already registered"):
        registry.register(len)
    internals.replace_registered(registry, "len", min)
    assert registry.get("len") is min, CHECKED
    assert dict(registry) == {"len": min}


def test_the_local_process_group_is_set_for_get_local_rank(tmp_path, monkeypatch):
    """detectron2 0.6 sets the private ``comm._LOCAL_PROCESS_GROUP`` in its launch only; main
    has ``comm.create_local_process_group``. One gloo process: local rank 0 of 1."""
    import torch.distributed as dist

    monkeypatch.setattr(comm, "_LOCAL_PROCESS_GROUP", None)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", world_size=1, rank=0
    )
    try:
        internals.set_local_process_group(1)
        assert comm._LOCAL_PROCESS_GROUP is not None, CHECKED
        assert (comm.get_local_rank(), comm.get_local_size()) == (0, 1)
    finally:
        dist.destroy_process_group()


def test_detectron2s_own_local_process_group_is_used_where_it_has_one(monkeypatch):
    """detectron2 main's ``comm.create_local_process_group(num_workers_per_machine)``."""
    calls = []
    monkeypatch.setattr(comm, "create_local_process_group", calls.append, raising=False)
    internals.set_local_process_group(3)
    assert calls == [3]


def test_fvcore_counts_from_its_default_handles(monkeypatch):
    """fvcore 0.1.5's private ``flop_count._DEFAULT_SUPPORTED_OPS`` is where every
    FlopCountAnalysis starts; an op fvcore has a handle for keeps it."""
    flop_count = importlib.import_module("fvcore.nn.flop_count")

    def own(inputs, outputs):
        return 5

    def added(inputs, outputs):
        return 7

    defaults_table = {"aten::avg_pool2d": own}
    monkeypatch.setattr(flop_count, "_DEFAULT_SUPPORTED_OPS", defaults_table)
    internals.add_default_flop_handles({"aten::avg_pool2d": added, "aten::baddbmm": added})
    assert defaults_table == {"aten::avg_pool2d": own, "aten::baddbmm": added}
    analysis = FlopCountAnalysis(torch.nn.AvgPool2d(2), torch.randn(1, 1, 4, 4))
    assert analysis.unsupported_ops_warnings(False).total() == 5


def test_the_names_detectron2s_tools_are_given_lambda_dets_parts_through_0_6_and_main():
    """The loaders build ``DatasetMapper`` as a global of detectron2.data.build; the
    checkpointers read files with their ``_load_file``."""
    build = importlib.import_module("detectron2.data.build")
    assert uses(build._train_loader_from_config, "DatasetMapper"), CHECKED
    assert uses(build._test_loader_from_config, "DatasetMapper"), CHECKED
    assert uses(Checkpointer.load, "_load_file"), CHECKED
    assert "_load_file" in vars(DetectionCheckpointer), CHECKED
    originals = (build.DatasetMapper, Checkpointer._load_file, DetectionCheckpointer._load_file)

    def load_file(checkpointer, filename):
        return {"model": {}}

    with internals.detectron2_tool_patches(
        get_cfg=dict,
        dataset_mapper=list,
        load_file=load_file,
        checkpointer_load=len,
        lazy_config_load=str,
    ):
        from detectron2.config import LazyConfig, get_cfg

        assert (get_cfg, build.DatasetMapper, LazyConfig.load) == (dict, list, str)
        assert DetectionCheckpointer(torch.nn.Linear(1, 1))._load_file("x") == {"model": {}}
    assert (
        build.DatasetMapper,
        Checkpointer._load_file,
        DetectionCheckpointer._load_file,
    ) == originals


def test_the_files_detectron2s_scripts_read_and_write_themselves_go_through_lambda_det(
    tmp_path,
):
    """convert-torchvision-to-d2.py calls torch.load; visualize_data.py writes with
    ``VisImage.save`` and reads with ``detection_utils.read_image``, visualize_json_results.py
    writes with ``cv2.imwrite`` and reads with ``cv2.imread``: each is replaced within, and
    restored after, also after an exception."""
    cv2 = pytest.importorskip("cv2")
    import numpy as np
    from detectron2.data import detection_utils
    from detectron2.utils.visualizer import VisImage

    def originals():
        return (torch.load, VisImage.save, cv2.imwrite, cv2.imread, detection_utils.read_image)

    before = originals()
    image = np.zeros((4, 4, 3), np.uint8)
    cv2.imwrite(str(tmp_path / "read.png"), image)
    calls = []

    def write_file(path, write):
        calls.append(("write", path))
        return write(str(tmp_path / f"other{len(calls)}.png"))

    with (
        pytest.raises(RuntimeError),
        internals.detectron2_script_file_patches(
            torch_load=len,
            write_file=write_file,
            read_file=lambda path: calls.append(("read", path)),
        ),
    ):
        assert torch.load is len
        VisImage(image).save("vis.png")
        assert cv2.imwrite("cv2.png", image) is True
        cv2.imread(str(tmp_path / "read.png"))
        detection_utils.read_image(str(tmp_path / "read.png"), "RGB")
        raise RuntimeError("a script's error")
    assert calls == [
        ("write", "vis.png"),
        ("write", "cv2.png"),
        ("read", str(tmp_path / "read.png")),
        ("read", str(tmp_path / "read.png")),
    ]
    assert (tmp_path / "other1.png").is_file() and (tmp_path / "other2.png").is_file()
    assert originals() == before


@pytest.mark.parametrize(
    "method, members, use",
    [
        (Checkpointer.load, ["_load_file", "_load_model"], "AtomicCheckpointer overrides them"),
        (EvalHook.after_train, ["_do_eval", "_func"], "FinalEvalHook.after_train calls it"),
        (PathManager.get_local_path, ["_get_local_path"], "TimmHubHandler overrides it"),
        (PathManager.register_handler, ["_get_supported_prefixes"], "TimmHubHandler's"),
    ],
)
def test_protected_members_lambda_dets_subclasses_rely_on_0_6_and_main(method, members, use):
    """The protected members of detectron2/fvcore classes that lambda_det's subclasses use
    outside lambda_det.compat.internals, as their bases intend: ``Checkpointer.load`` reads the
    file with ``_load_file`` (fvcore's docstring: "Can be overwritten by subclasses to support
    different formats") and loads the weights with ``_load_model`` (which detectron2's
    ``DetectionCheckpointer`` overrides too); ``EvalHook.after_train`` evaluates with
    ``_do_eval`` and drops ``_func``; iopath's ``PathManager`` resolves a prefix with its handler's
    ``_get_supported_prefixes`` and ``_get_local_path`` (timm://). Found in the method's own code,
    so a rename shows here."""
    for member in members:
        assert uses(method, member), f"{method.__qualname__}: {member} ({use}) {CHECKED}"
    assert {"_load_file", "_load_model"} <= set(vars(DetectionCheckpointer)), CHECKED
