"""Training and evaluation of LazyConfig recipes (tools/lazyconfig_train_net.py), in the shape of
detectron2's tools/lazyconfig_train_net.py, with what tools/train_net.py adds for yaml configs:
one run per ``train.output_dir`` (--resume / --restart), checkpoints read safely and written
atomically, the inputs checked before any process starts (one ``error: ...`` line, exit 2),
gloo processes on the CPU, and train.output_dir/eval_results.json.
"""
import argparse
import logging
import os
from typing import Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from detectron2.config import instantiate
from detectron2.data import MetadataCatalog
from detectron2.engine import SimpleTrainer, create_ddp_model, default_writers, hooks
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from lambda_det.checkpoint import checkpoint_to_resume
from lambda_det.checkpoint.checkpointer import AtomicCheckpointer
from lambda_det.cli.arguments import parse_command_line, reporting_user_errors
from lambda_det.cli.train_net import (
    argument_parser, check_weights_fit, launch_checked, plan_evaluation, prepare_training_output_dir)
from lambda_det.compat import ddp_without_buffer_sync, quiet_detectron2_warnings
from lambda_det.config.lazy import load_lazy_config, resolve_lazy_config_file, scale_to_world_size
from lambda_det.data.checks import check_images, check_unique_ids, load_checked_test_dicts
from lambda_det.data.coco import register_coco_triples
from lambda_det.engine.amp import MixedPrecisionTrainer
from lambda_det.engine.deterministic import DeterministicTrainLoader, SeedEachIteration
from lambda_det.engine.preflight import (
    Setting, check_batch_size, check_device, check_launch_arguments, check_training_memory,
    check_training_settings, lazy_training_settings)
from lambda_det.engine.trainer import (
    FinalEvalHook, _plain, plain_default_setup, write_json_atomically)
from lambda_det.modeling import LambdaResNet
from lambda_det.modeling.build import STOCK_IMAGENET_WEIGHTS
from lambda_det.utils.atomic import DISK_ERRNOS, OutputWriteError, reporting_write_errors

__all__ = ["main", "run", "train", "evaluate", "evaluation_weights", "build_meta_model",
           "check_datasets", "check_training_recipe", "check_config_before_launch"]

logger = logging.getLogger(__name__)

# What the messages and help call the output folder and the datasets: a recipe's own keys.
OUTPUT_DIR_KEY = "train.output_dir"
DATASET_KEYS = "dataloader.train.dataset.names / dataloader.test.dataset.names"


def _on_cpu(cfg: DictConfig) -> bool:
    return cfg.train.device == "cpu"


def build_meta_model(cfg: DictConfig) -> torch.nn.Module:
    """``cfg.model`` on the meta device: its arguments checked in a fraction of a second, with
    no memory and no random numbers drawn."""
    with torch.device("meta"):
        return instantiate(cfg.model)


def evaluation_weights(cfg: DictConfig, resume: bool) -> str:
    """What --eval-only evaluates: the last checkpoint of train.output_dir with ``resume`` (when
    there is one), else train.init_checkpoint.

    Raises:
        ValueError: no weights at all (that would evaluate a randomly initialised model).
        FileNotFoundError: a local checkpoint file that does not exist.
        ValueError, FileNotFoundError, IsADirectoryError: train.output_dir's last_checkpoint
            is empty or names no file (:func:`~lambda_det.checkpoint.checkpoint_to_resume`).
    """
    output_dir, weights = cfg.train.output_dir, cfg.train.init_checkpoint
    latest = checkpoint_to_resume(output_dir) if resume else None
    if latest is not None:
        return latest
    if not weights:
        where = f" and train.output_dir {output_dir!r} has no last_checkpoint" if resume else ""
        raise ValueError(f"--eval-only needs trained weights: train.init_checkpoint is "
                         f"empty{where}; pass train.init_checkpoint=PATH")
    _check_file(weights)
    return weights


def _check_file(weights: str) -> None:
    if "://" not in weights and not os.path.isfile(weights):
        raise FileNotFoundError(f"train.init_checkpoint file {weights!r} does not exist: pass "
                                f"the path of a checkpoint, or train.init_checkpoint='' to "
                                f"start from scratch")


def _dataset_names(node) -> Sequence[str]:
    names = node.names
    return [names] if isinstance(names, str) else list(names)


def _check_num_classes(cfg: DictConfig, names: Sequence[str]) -> None:
    num_classes = OmegaConf.select(cfg, "model.roi_heads.num_classes", default=None)
    for name in names:
        classes = MetadataCatalog.get(name).get("thing_classes")
        if num_classes is not None and classes is not None and len(classes) != num_classes:
            raise ValueError(f"model.roi_heads.num_classes is {num_classes}, but dataset "
                             f"{name!r} has {len(classes)} categories: add "
                             f"model.roi_heads.num_classes={len(classes)} to the command line")


def check_datasets(cfg: DictConfig, training: bool = True) -> None:
    """The pre-flight of tools/train_net.py (``check_run_datasets``) for a recipe: the
    training set (when ``training``) loads through ``dataloader.train.dataset`` with its
    checks, each test set as evaluation reads it (``load_checked_test_dicts``: segmentations
    when the model predicts masks); their COCO ids are unique, each has as many categories as
    the model has classes, and their images pass ``dataloader.check_images`` ("header", "full"
    or "none")."""
    mode = cfg.dataloader.get("check_images", "header")
    image_format = cfg.dataloader.train.mapper.get("image_format", "BGR")
    if training:
        dicts = instantiate(cfg.dataloader.train.dataset)
        names = _dataset_names(cfg.dataloader.train.dataset)
        check_unique_ids(names)
        _check_num_classes(cfg, names)
        check_images(dicts, mode, image_format, key="dataloader.check_images")
    # detectron2's StandardROIHeads predicts masks when it has mask_in_features.
    masks = OmegaConf.select(cfg, "model.roi_heads.mask_in_features", default=None) is not None
    for name in _dataset_names(cfg.dataloader.test.dataset):
        dicts = load_checked_test_dicts(name, require_masks=masks)
        _check_num_classes(cfg, [name])
        check_images(dicts, mode, image_format, key="dataloader.check_images")


def check_training_recipe(cfg: DictConfig) -> None:
    """What tools/train_net.py refuses for a LambdaResNet (``check_training_recipe``): a
    detectron2 ImageNet ResNet as init_checkpoint, or from scratch a frozen norm or frozen
    stages (random weights that never train)."""
    bottom_up = OmegaConf.select(cfg, "model.backbone.bottom_up", default=None)
    if bottom_up is None or bottom_up.get("_target_") not in (
            LambdaResNet, f"{LambdaResNet.__module__}.LambdaResNet"):
        return
    weights = cfg.train.init_checkpoint
    if STOCK_IMAGENET_WEIGHTS in weights:
        raise ValueError(f"train.init_checkpoint {weights!r} is a detectron2 ImageNet ResNet, "
                         f"which does not fit a LambdaResNet: train from scratch "
                         f"(train.init_checkpoint=''), or convert a classifier you pretrained "
                         f"with tools/convert_timm_checkpoint.py")
    if weights:
        return
    if bottom_up.get("norm") == "FrozenBN":
        raise ValueError("model.backbone.bottom_up.norm 'FrozenBN' freezes randomly initialised "
                         "statistics when training from scratch (train.init_checkpoint is "
                         "empty): set it to SyncBN (several GPUs), BN or GN")
    if bottom_up.get("freeze_at", 0) > 0:
        raise ValueError(f"model.backbone.bottom_up.freeze_at {bottom_up.freeze_at} freezes "
                         f"randomly initialised stages when training from scratch "
                         f"(train.init_checkpoint is empty): set it to 0")


def check_config_before_launch(args: argparse.Namespace, cfg: DictConfig) -> torch.nn.Module:
    """What the recipe alone decides, checked before train.output_dir is touched: the device,
    the model (built on the meta device, returned for the weights' checks) and, for training,
    every setting that would fail after launch and the memory a process needs at least
    (:mod:`lambda_det.engine.preflight`, as tools/train_net.py)."""
    check_device(Setting("train.device", cfg.train.device), args.num_gpus)
    model = build_meta_model(cfg)
    if args.eval_only:
        return model
    settings = lazy_training_settings(cfg)  # scaled to the processes in main
    check_training_settings(settings)
    world_size = args.num_gpus * args.num_machines
    check_batch_size(settings.batch.value, world_size, key=settings.batch.key)
    check_training_recipe(cfg)
    check_training_memory(model, settings, cfg.train.device, args.num_gpus, world_size)
    return model


def _check_before_launch(args: argparse.Namespace, cfg: DictConfig,
                         model: torch.nn.Module) -> None:
    """What the run reads, checked once before any process starts and before the output folder
    is written (the lock is already held)."""
    if args.eval_only:
        weights = evaluation_weights(cfg, args.resume)
        check_weights_fit(model, weights, require="all")
        check_datasets(cfg, training=False)
        plan_evaluation(args, cfg.train.output_dir, weights)
        return
    output_dir = cfg.train.output_dir
    latest = checkpoint_to_resume(output_dir) if args.resume else None
    if latest is not None:
        check_weights_fit(model, latest, require="all")
    elif cfg.train.init_checkpoint:
        _check_file(cfg.train.init_checkpoint)
        check_weights_fit(model, cfg.train.init_checkpoint, require="backbone")
    check_datasets(cfg)
    prepare_training_output_dir(args, output_dir, key=OUTPUT_DIR_KEY)


def evaluate(cfg: DictConfig, model: torch.nn.Module):
    """COCO evaluation of ``model`` on ``dataloader.test`` with ``dataloader.evaluator``;
    the main process prints the results and writes train.output_dir/eval_results.json."""
    results = inference_on_dataset(model, instantiate(cfg.dataloader.test),
                                   instantiate(cfg.dataloader.evaluator))
    if comm.is_main_process() and results:
        print_csv_format(results)
        os.makedirs(cfg.train.output_dir, exist_ok=True)
        config = _printable(OmegaConf.to_container(cfg, resolve=True))
        write_json_atomically(os.path.join(cfg.train.output_dir, "eval_results.json"),
                              {"config": OmegaConf.to_yaml(config), "results": _plain(results)})
    return results


def _printable(node):
    """A config as plain data for the record in eval_results.json: callables by name, other
    objects (the model the trainer put into optimizer.params) by type."""
    if isinstance(node, dict):
        return {key: _printable(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_printable(value) for value in node]
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    if hasattr(node, "__qualname__"):
        return f"{node.__module__}.{node.__qualname__}"
    return f"<{type(node).__name__}>"


def _deterministic_seed(cfg: DictConfig) -> Optional[int]:
    """train.seed when train.deterministic is set (DATALOADER.DETERMINISTIC of the yaml
    configs: every iteration a function of (seed, iteration)), else None; checked by
    :func:`~lambda_det.engine.preflight.check_training_settings`."""
    return cfg.train.seed if cfg.train.get("deterministic", False) else None


def _deterministic_train_loader(cfg: DictConfig, seed: int) -> DeterministicTrainLoader:
    """dataloader.train's dataset and mapper, drawn by (seed, iteration) instead of detectron2's
    sampler (see :mod:`lambda_det.engine.deterministic`)."""
    loader = cfg.dataloader.train
    return DeterministicTrainLoader(instantiate(loader.dataset), instantiate(loader.mapper),
                                    loader.total_batch_size, seed, comm.get_rank(),
                                    comm.get_world_size())


def train(cfg: DictConfig, resume: bool) -> None:
    """Train ``cfg.model`` for train.max_iter iterations, checkpointing and evaluating as
    ``cfg.train`` says; with ``resume``, continue from train.output_dir's last checkpoint.
    With train.deterministic, every iteration is a function of (train.seed, iteration), so that
    a resumed run continues exactly."""
    check_training_settings(lazy_training_settings(cfg))  # as before launch, for API callers
    check_training_recipe(cfg)
    seed = _deterministic_seed(cfg)
    if seed is not None:
        seed_all_rng(seed)  # the same initial weights on every rank and every run
    model = instantiate(cfg.model).to(cfg.train.device)
    logger.info("Model:\n%s", model)
    if cfg.train.get("compile_backbone", False):
        model.backbone.compile()  # in place: parameter names and checkpoints stay the same
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    train_loader = (instantiate(cfg.dataloader.train) if seed is None
                    else _deterministic_train_loader(cfg, seed))
    ddp_options = {"device_ids": None} if _on_cpu(cfg) else {}  # detectron2 assumes GPU ids
    ddp = dict(cfg.train.ddp)
    if ddp.get("broadcast_buffers") is False:  # detectron2's spelling, deprecated in torch
        del ddp["broadcast_buffers"]
        ddp.update(ddp_without_buffer_sync())
    model = create_ddp_model(model, **ddp, **ddp_options)
    if cfg.train.amp.enabled:
        trainer = MixedPrecisionTrainer(model, train_loader, optimizer,
                                        dtype=cfg.train.amp.get("dtype", "float16"),
                                        device_type=torch.device(cfg.train.device).type)
    else:
        trainer = SimpleTrainer(model, train_loader, optimizer)
    checkpointer = AtomicCheckpointer(model, cfg.train.output_dir, trainer=trainer)
    main = comm.is_main_process()
    trainer.register_hooks([
        SeedEachIteration(seed) if seed is not None else None,
        hooks.IterationTimer(),
        hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
        hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer) if main else None,
        FinalEvalHook(cfg.train.eval_period, lambda: evaluate(cfg, model)),
        hooks.PeriodicWriter(default_writers(cfg.train.output_dir, cfg.train.max_iter),
                             period=cfg.train.log_period) if main else None,
    ])
    resuming = resume and checkpointer.has_checkpoint()
    # A resumed checkpoint must fit the whole model; initial weights, the image network.
    checkpointer.require = "all" if resuming else "backbone"
    checkpointer.resume_or_load(cfg.train.init_checkpoint, resume=resume)
    start = trainer.iter + 1 if resuming else 0
    if seed is not None:
        train_loader.start_iteration = start
    with reporting_write_errors(cfg.train.output_dir, "train.output_dir", errnos=DISK_ERRNOS):
        trainer.train(start, cfg.train.max_iter)


def run(args: argparse.Namespace):
    """What every training or evaluation process runs."""
    quiet_detectron2_warnings()
    with reporting_user_errors(args.debug):
        register_coco_triples(args.coco_dataset, source="--coco-dataset")
        cfg = load_lazy_config(args.config_file, args.opts)
        evaluation = getattr(args, "evaluation", None)  # set before launch: plan_evaluation
        if evaluation is not None:
            cfg.train.output_dir, cfg.train.init_checkpoint = evaluation
        scale_to_world_size(cfg, comm.get_world_size())
        plain_default_setup(cfg, args)
        if args.eval_only:
            model = instantiate(cfg.model).to(cfg.train.device)
            AtomicCheckpointer(model, require="all").load(evaluation_weights(cfg, args.resume),
                                                          checkpointables=[])
            return evaluate(cfg, model)
    with reporting_user_errors(args.debug, errors=(OutputWriteError,)):
        return train(cfg, args.resume)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """tools/lazyconfig_train_net.py: returns the exit status."""
    parser = argument_parser(output_dir=OUTPUT_DIR_KEY, datasets=DATASET_KEYS)
    parser.description = "Train or evaluate a LazyConfig recipe (configs/LazyConfigs/)."
    args = parse_command_line(parser, argv)
    print("Command Line Args:", args)
    with reporting_user_errors(args.debug):
        check_launch_arguments(args)
        if not args.config_file:
            raise ValueError("pass a recipe: --config-file PATH.py, or --config NAME (e.g. "
                             "lambda_r152_mask_rcnn)")
        args.config_file = resolve_lazy_config_file(args.config_file)  # what default_setup logs
        # In this process for the checks; run() registers them in every training process.
        register_coco_triples(args.coco_dataset, source="--coco-dataset")
        cfg = load_lazy_config(args.config_file, args.opts)
        scale_to_world_size(cfg, args.num_gpus * args.num_machines)
        model = check_config_before_launch(args, cfg)
    return launch_checked(run, args, cfg.train.output_dir,
                          lambda: _check_before_launch(args, cfg, model), cpu=_on_cpu(cfg),
                          output_dir_key=OUTPUT_DIR_KEY)
