"""What both training tools check before any process starts and before OUTPUT_DIR is touched:
the launch arguments, the device, every training setting that would otherwise fail after launch
(with a log, a config dump and metrics already written), a recipe that cannot train (ImageNet
ResNet weights for a LambdaResNet, frozen random weights), and a lower bound of the memory a
training or evaluation process needs, so that an image size or a batch that cannot fit is
refused before anything is allocated.

tools/train_net.py (yaml configs) and tools/lazyconfig_train_net.py (LazyConfig recipes) spell
the same settings with different keys: :mod:`lambda_det.engine.run_settings` reads either into
:class:`TrainingSettings`, which the checks here take.
"""

import argparse
import contextlib
import logging
import math
import os
from typing import Callable, NamedTuple, Optional, Tuple

import torch
from torch import nn

from lambda_det.data.mapper import check_lsj_settings
from lambda_det.engine.amp import AMP_DTYPES
from lambda_det.layers import LambdaLayer
from lambda_det.modeling.build import STOCK_IMAGENET_WEIGHTS
from lambda_det.utils.errors import UserError
from lambda_det.utils.setting import Setting, is_integer, override, shown

__all__ = [
    "check_seed",
    "Setting",
    "BackboneSettings",
    "TrainingSettings",
    "check_launch_arguments",
    "check_device",
    "check_device_name",
    "check_training_settings",
    "check_training_recipe",
    "check_batch_size",
    "inputs_lower_bound",
    "training_memory_lower_bound",
    "evaluation_memory_lower_bound",
    "available_memory",
    "check_training_memory",
    "check_evaluation_memory",
]

GIB = 2**30
logger = logging.getLogger(__name__)


class BackboneSettings(NamedTuple):
    """What a LambdaResNet backbone freezes, checked against training from scratch."""

    norm: Setting  # where the norm was set (MODEL.RESNETS.NORM when LAMBDA_RESNET.NORM is None)
    norm_key: str  # the key that sets the LambdaResNet's norm
    freeze_at: Setting


class TrainingSettings(NamedTuple):
    """The settings of a training run that are checked before launch, each with its key."""

    learning_rate: Setting
    max_iter: Setting
    lr_steps: Optional[Setting]  # the steps the schedule keeps (None: no step schedule)
    amp_dtype: Optional[Setting]  # None: mixed precision is off
    deterministic: Setting
    seed: Setting
    lsj: Optional[Tuple[Setting, Setting, Setting]]  # image size, min scale, max scale
    at_least_one: Tuple[Setting, ...]  # integers >= 1: periods
    at_least_zero: Tuple[Setting, ...]  # numbers >= 0: momentum, weight decay, workers, ...
    batch: Setting  # images per iteration over all processes
    input_size: Optional[Setting]  # the side of the largest training input (None: unknown)
    weights: Setting  # the initial weights ("": from scratch)
    backbone: Optional[BackboneSettings]  # None: not a lambda_det backbone
    finite: Tuple[Setting, ...]  # numbers that must be finite: a schedule's factors, ...
    # The side of a square image at evaluation, with the key that bounds every image's size
    # (None: unknown, or not resized).
    test_size: Optional[Setting] = None


def check_launch_arguments(args: argparse.Namespace) -> None:
    """``--num-gpus`` (processes per machine, also with --eval-only), ``--num-machines`` and
    ``--machine-rank``: detectron2's launch starts no process for ``--num-gpus 0`` or less, and
    exits 0 having done nothing."""
    for flag, value in (("--num-gpus", args.num_gpus), ("--num-machines", args.num_machines)):
        if value < 1:
            raise UserError(
                f"{flag} must be >= 1, got {value}: pass {flag} 1 or more (on the "
                f"CPU, --num-gpus N starts N processes)"
            )
    if not 0 <= args.machine_rank < args.num_machines:
        raise UserError(
            f"--machine-rank must be in 0..{args.num_machines - 1} for "
            f"--num-machines {args.num_machines}, got {args.machine_rank}"
        )
    if args.num_machines > 1 and getattr(args, "dist_url", None) == "auto":
        raise UserError(
            f"--dist-url auto picks a port on one machine, not on {args.num_machines}: pass "
            f"--dist-url tcp://HOST:PORT with machine 0's address on every machine"
        )


# The longest device name lambda_det runs on: "cuda:" and an index.
_MAX_DEVICE_NAME = 16


def check_device_name(device: Setting) -> torch.device:
    """``device`` names cpu or a CUDA device (cuda, cuda:N), whatever this machine has: a
    config that names a device means it, whether or not it runs here (tools/check_dataset.py)."""
    value = device.value
    parsed = None
    if isinstance(value, str) and len(value) <= _MAX_DEVICE_NAME:
        try:
            parsed = torch.device(value)
        except (RuntimeError, TypeError):
            pass
    if parsed is None:
        raise UserError(
            f"{device.key} {shown(value)} is not a torch device: set {device.key} to cuda, "
            f"cuda:N or cpu"
        )
    if parsed.type not in ("cpu", "cuda"):
        raise UserError(
            f"{device.key} {shown(value)}: lambda_det trains and evaluates on cuda or cpu; set "
            f"{device.key} to one of them"
        )
    return parsed


def check_device(device: Setting, num_gpus: int) -> None:
    """``device`` names cpu or a CUDA GPU that this machine has (:func:`check_device_name`),
    and with cuda, the machine has a GPU for each of the ``num_gpus`` processes."""
    parsed = check_device_name(device)
    if parsed.type == "cpu":
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise UserError(
            f"{device.key} {device.value!r} needs a CUDA GPU, and torch finds none "
            f"on this machine: set {device.key} to cpu"
        )
    if parsed.index is not None and parsed.index >= count:
        raise UserError(
            f"{device.key} {device.value!r}: this machine has {count} CUDA "
            f"GPU(s), cuda:0 to cuda:{count - 1}"
        )
    if num_gpus > count:
        raise UserError(
            f"--num-gpus {num_gpus} needs {num_gpus} CUDA GPUs and this machine "
            f"has {count}: pass --num-gpus {count} or fewer, or set {device.key} "
            f"to cpu"
        )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite_number(value) -> bool:
    """A number that is not NaN or infinite (an integer is finite however large)."""
    return _is_number(value) and (isinstance(value, int) or math.isfinite(value))


def _check_integer_at_least(setting: Setting, minimum: int, meaning: str) -> None:
    if not is_integer(setting.value) or setting.value < minimum:
        raise UserError(
            f"{setting.key} must be an integer >= {minimum} ({meaning}), got "
            f"{shown(setting.value)}: set {setting.key} to an integer >= {minimum}"
        )


def _check_lr_steps(steps: Setting, max_iter: Setting) -> None:
    """The steps the multi-step schedule keeps increase within (0, max_iter): fvcore's
    ``MultiStepParamScheduler`` refuses anything else when the trainer builds it."""
    values = list(steps.value)
    bounds_ok = all(is_integer(step) and 0 < step < max_iter.value for step in values)
    if not bounds_ok or values != sorted(set(values)):
        raise UserError(
            f"{steps.key} {values} must be increasing iterations between 1 and "
            f"{max_iter.key} - 1 = {max_iter.value - 1} (steps past it are left out): "
            f"set {steps.key} to the iterations at which the LR drops"
        )


def check_batch_size(batch, world_size: int, key: str = "SOLVER.IMS_PER_BATCH") -> None:
    """The images per iteration over all processes (``key``) split evenly over them."""
    if not is_integer(batch) or batch < 1:
        raise UserError(
            f"{key} must be a positive integer (images per iteration over all "
            f"processes), got {batch!r}"
        )
    if batch % world_size:
        raise UserError(
            f"{key} {batch} does not split over {world_size} processes: use a "
            f"multiple of {world_size}"
        )


def check_seed(seed: Setting, world_size: int = 1) -> int:
    """The seed of a run (SEED, train.seed) over ``world_size`` processes: an integer,
    negative to draw a new one each run; detectron2 seeds numpy, torch and random of process
    ``rank`` with seed + rank, and numpy takes seeds below 2**32 (a seed below -(2**32 - 1)
    has no meaning either)."""
    if not is_integer(seed.value):
        raise UserError(
            f"{seed.key} must be an integer, got {shown(seed.value)}: set {seed.key} to a "
            f"number such as 0, or -1 for a new seed each run"
        )
    if seed.value + world_size > 2**32:
        processes = f" plus the rank of each of {world_size} processes" if world_size > 1 else ""
        raise UserError(
            f"{seed.key} {shown(seed.value)}{processes} exceeds numpy's largest seed, "
            f"2**32 - 1: set {seed.key} to a smaller number"
        )
    if seed.value < -(2**32 - 1):
        raise UserError(
            f"{seed.key} {shown(seed.value)} is below -(2**32 - 1): set {seed.key} to -1 for a "
            f"new seed each run, or to a seed from 0 to 2**32 - 1"
        )
    return seed.value


def check_training_settings(settings: TrainingSettings) -> None:
    """Every setting of ``settings`` whose mistake would otherwise surface after launch (or
    never: a negative LR trains to garbage). Whether the batch splits over the processes is
    :func:`check_batch_size`'s, on the batch after any scaling to the number of processes.

    Raises:
        ValueError: naming the key, the value and the fix.
    """
    check_batch_size(settings.batch.value, 1, key=settings.batch.key)
    lr = settings.learning_rate
    if not _is_finite_number(lr.value) or lr.value <= 0:
        raise UserError(
            f"{lr.key} must be a finite number > 0, got {shown(lr.value)}: set {lr.key} "
            f"to a positive learning rate"
        )
    for setting in settings.finite:
        if not _is_finite_number(setting.value):
            raise UserError(
                f"{setting.key} must be a finite number, got {shown(setting.value)}: set "
                f"{setting.key} to a number"
            )
    _check_integer_at_least(settings.max_iter, 1, "iterations to train")
    if settings.lr_steps is not None:
        _check_lr_steps(settings.lr_steps, settings.max_iter)
    dtype = settings.amp_dtype
    if dtype is not None and dtype.value not in AMP_DTYPES:
        raise UserError(
            f"{dtype.key} must be one of {sorted(AMP_DTYPES)}, got {shown(dtype.value)}: "
            f"set {dtype.key} to float16 or bfloat16"
        )
    seed = settings.seed
    if settings.deterministic.value and (not is_integer(seed.value) or seed.value < 0):
        raise UserError(
            f"{settings.deterministic.key} needs a fixed {seed.key} >= 0, got "
            f"{seed.key}={shown(seed.value)}: set {seed.key} to a number such as 0"
        )
    if settings.lsj is not None:
        check_lsj_settings(
            *(setting.value for setting in settings.lsj),
            keys=[setting.key for setting in settings.lsj],
        )
    for setting in settings.at_least_one:
        _check_integer_at_least(setting, 1, "iterations")
    for setting in settings.at_least_zero:
        if not _is_finite_number(setting.value) or not setting.value >= 0:
            raise UserError(
                f"{setting.key} must be a finite number >= 0, got {shown(setting.value)}: set "
                f"{setting.key} to 0 or more"
            )
    check_training_recipe(settings)


def check_training_recipe(settings: TrainingSettings) -> None:
    """Refuse to train a lambda_det backbone in a way that cannot work: detectron2's ImageNet
    ResNet weights (stock configs load them; they fit no LambdaResNet), or, from scratch, a
    frozen norm or frozen stages (random weights that never train).

    Raises:
        ValueError: naming the key and the value that fixes it.
    """
    backbone, weights = settings.backbone, settings.weights
    if backbone is None:
        return
    if STOCK_IMAGENET_WEIGHTS in weights.value:
        raise UserError(
            f"{weights.key} {weights.value!r} is a detectron2 ImageNet ResNet, which does not "
            f"fit a LambdaResNet, and no pretrained LambdaResNet weights exist: train from "
            f"scratch with {override(weights.key, '')} {override(backbone.freeze_at.key, 0)} "
            f"and a trainable norm (e.g. {override(backbone.norm_key, 'SyncBN')}), or convert a "
            f"classifier you pretrained with tools/convert_timm_checkpoint.py"
        )
    if weights.value:
        return
    scratch = f"when training from scratch ({weights.key} is empty)"
    if backbone.norm.value == "FrozenBN":
        raise UserError(
            f"{backbone.norm.key} 'FrozenBN' freezes randomly initialised "
            f"statistics {scratch}: set {backbone.norm_key} to SyncBN (several "
            f"GPUs), BN or GN"
        )
    freeze_at = backbone.freeze_at
    if freeze_at.value > 0:
        raise UserError(
            f"{freeze_at.key} {freeze_at.value} freezes randomly initialised "
            f"stages {scratch}: set {override(freeze_at.key, 0)}"
        )


# ---- memory ----


@contextlib.contextmanager
def _least_saving_lambda_layers(module: nn.Module):
    """Lambda layers with impl "auto" pick their form by device and size; on the meta device,
    run them as "tiled", the form that keeps the least for backward (only its inputs), so that
    the count stays a lower bound wherever the run goes."""
    layers = [
        layer
        for layer in module.modules()
        if isinstance(layer, LambdaLayer) and layer.impl == "auto"
    ]
    for layer in layers:
        layer.impl = "tiled"
    try:
        yield
    finally:
        for layer in layers:
            layer.impl = "auto"


def _padded_size(model: nn.Module, size: int) -> int:
    """``size`` padded to the backbone's size divisibility, as detectron2 pads a batch."""
    divisor = max(1, getattr(model.backbone, "size_divisibility", 1) or 1)
    return math.ceil(size / divisor) * divisor


def _channels(model: nn.Module) -> int:
    return model.pixel_mean.numel() if hasattr(model, "pixel_mean") else 3


def _weight_bytes(model: nn.Module) -> int:
    return sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())


def inputs_lower_bound(model: nn.Module, images: int, size: int) -> int:
    """Bytes of the model's weights and of a float32 batch of ``images`` images of ``size`` x
    ``size`` (padded): both exist in a process that trains or evaluates on them. Arithmetic
    only, so that an absurd size is refused at once (a forward pass on the meta device loops
    over a lambda layer's tiles, for hours at a side of 10^8)."""
    side = _padded_size(model, size)
    return _weight_bytes(model) + images * _channels(model) * side * side * 4


def training_memory_lower_bound(
    model: nn.Module, images: int, size: int, mixed_precision: bool = False
) -> int:
    """Bytes that one training process needs at least: the model's parameters, plus what its
    backbone's forward pass over ``images`` images of ``size`` x ``size`` (padded to the
    backbone's size divisibility) keeps for backward, counted by running ``model`` (built on
    the meta device: nothing is allocated or computed) under a saved-tensors hook. The heads'
    activations, the gradients and the optimizer state come on top.

    With ``mixed_precision``, floating-point activations count 2 bytes an element (they are
    float32 on the meta device; autocast keeps some in float32).
    """
    backbone = model.backbone
    size = _padded_size(model, size)
    parameters = {parameter.untyped_storage()._cdata for parameter in model.parameters()}
    saved = {}  # storage -> bytes; a view keeps its whole storage alive

    def count(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in parameters and storage._cdata not in saved:
            nbytes = storage.nbytes()
            if mixed_precision and tensor.is_floating_point():
                nbytes = nbytes * min(tensor.element_size(), 2) // tensor.element_size()
            saved[storage._cdata] = (nbytes, tensor)  # kept alive: the key stays its own
        return tensor

    channels = _channels(model)
    # In eval mode: a batch norm keeps the same input for backward as in training (only its
    # per-channel statistics differ), and torch's meta kernel of a training-mode batch norm
    # takes twice as long. Stochastic depth's masks are left out (the bound stays a bound).
    training = backbone.training
    backbone.eval()
    try:
        with (
            _least_saving_lambda_layers(backbone),
            torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor),
        ):
            backbone(torch.empty(images, channels, size, size, device="meta"))
    finally:
        backbone.train(training)
    return _weight_bytes(model) + sum(nbytes for nbytes, _ in saved.values())


def _tensors(value) -> list:
    """The tensors in a module's inputs or output (tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


def evaluation_memory_lower_bound(model: nn.Module, size: int) -> int:
    """Bytes that one evaluation process needs at least: the model's parameters, plus the
    largest inputs and output of one module of its backbone (they exist together) in a forward
    pass over one image of ``size`` x ``size`` (padded) that keeps nothing for backward, run
    on the meta device as :func:`training_memory_lower_bound` runs it. The heads come on top."""
    backbone = model.backbone
    size = _padded_size(model, size)
    largest = 0

    def measure(module, inputs, output):
        nonlocal largest
        storages = {
            tensor.untyped_storage()._cdata: tensor.untyped_storage().nbytes()
            for tensor in _tensors((inputs, output))
        }
        largest = max(largest, sum(storages.values()))

    handles = [module.register_forward_hook(measure) for module in backbone.modules()]
    training = backbone.training
    backbone.eval()
    try:
        with _least_saving_lambda_layers(backbone), torch.no_grad():
            backbone(torch.empty(1, _channels(model), size, size, device="meta"))
    finally:
        backbone.train(training)
        for handle in handles:
            handle.remove()
    return _weight_bytes(model) + largest


def _memory_available_on_this_machine() -> Optional[int]:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping), else the free
    physical pages; None when neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def available_memory(device: str, processes: int) -> Optional[Tuple[int, str]]:
    """The bytes each of ``processes`` training processes of this machine can have on
    ``device``, and what they are, in words; None when unknown.

    On a GPU, its total memory (each process has its own GPU; asking for the free memory
    would open a CUDA context in the launching process for the whole run). On the CPU, the
    available memory shared by the processes.
    """
    parsed = torch.device(device)
    if parsed.type == "cuda":
        indices = (
            [parsed.index] if parsed.index is not None and processes == 1 else range(processes)
        )
        total = min(torch.cuda.get_device_properties(index).total_memory for index in indices)
        return total, f"the GPU has {total / GIB:.1f} GiB"
    available = _memory_available_on_this_machine()
    if available is None:
        return None
    where = f"the machine has {available / GIB:.1f} GiB available"
    if processes > 1:
        where += f", {available / processes / GIB:.1f} GiB for each of {processes} processes"
    return available // processes, where


def _lower_bound(
    model: nn.Module, images: int, size: int, available: int, count: Callable[[], int]
) -> Optional[int]:
    """:func:`inputs_lower_bound` when it already exceeds ``available``, else ``count()`` (a
    forward pass on the meta device); None when an operator has no meta kernel (a custom
    backbone's)."""
    needed = inputs_lower_bound(model, images, size)
    if needed > available:
        return needed
    try:
        return count()
    except NotImplementedError as error:
        logger.info("no memory estimate before launch: %s", " ".join(str(error).split())[:200])
        return None


def check_training_memory(
    model: nn.Module,
    settings: TrainingSettings,
    device: str,
    num_gpus: int,
    world_size: int,
) -> Optional[int]:
    """Refuse a training whose lower bound of memory per process (:func:`inputs_lower_bound`
    at once, then :func:`training_memory_lower_bound`) exceeds what the process can have
    (:func:`available_memory`): it would fail, or swap for hours, after
    allocating.

    Returns:
        the lower bound in bytes, or None where the input size or the memory is unknown.

    Raises:
        ValueError: naming the estimate, the limit and the keys to lower.
    """
    if settings.input_size is None or not hasattr(model, "backbone"):
        return None
    limit = available_memory(device, num_gpus)
    if limit is None:
        return None
    images = settings.batch.value // world_size
    size = settings.input_size.value
    available, where = limit
    needed = _lower_bound(
        model,
        images,
        size,
        available,
        lambda: training_memory_lower_bound(model, images, size, settings.amp_dtype is not None),
    )
    if needed is None:
        return None
    if needed > available:
        raise UserError(
            f"training needs at least ~{needed / GIB:.1f} GiB per process for {images} images "
            f"of {size}x{size} (the backbone's activations and the model's weights), {where}: "
            f"lower {settings.batch.key} or {settings.input_size.key}"
        )
    return needed


def check_evaluation_memory(
    model: nn.Module, test_size: Optional[Setting], device: str, num_gpus: int
) -> Optional[int]:
    """Refuse an evaluation (``--eval-only``, or a training run's) whose lower bound of memory
    per process, one image of the test size at a time, exceeds what the process can have
    (:func:`available_memory`): :func:`inputs_lower_bound` at once, then
    :func:`evaluation_memory_lower_bound`.

    Returns:
        the lower bound in bytes, or None where the test size or the memory is unknown.

    Raises:
        ValueError: naming the estimate, the limit and the key to lower.
    """
    if test_size is None or not hasattr(model, "backbone"):
        return None
    limit = available_memory(device, num_gpus)
    if limit is None:
        return None
    available, where = limit
    size = test_size.value
    needed = _lower_bound(
        model, 1, size, available, lambda: evaluation_memory_lower_bound(model, size)
    )
    if needed is None:
        return None
    if needed > available:
        raise UserError(
            f"evaluation needs at least ~{needed / GIB:.1f} GiB per process for one image of "
            f"{size}x{size} (the model's weights and the backbone's largest activations), "
            f"{where}: lower {test_size.key} (the longest side images are resized to for "
            f"evaluation)"
        )
    return needed
