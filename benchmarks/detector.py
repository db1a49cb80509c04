"""A whole detector's training step (tools/benchmark_detector.py): time per image, peak memory,
the largest batch that fits, and the share of the step spent in the lambda layers.

Each candidate is a (config, mode, precision) triple. A step is forward, backward and the
optimizer's update on a synthetic batch already on the device (images of the config's training
size with a few boxes and masks each), as lambda_det's trainer runs it (``torch.autocast`` for
bf16/fp16, a gradient scaler for fp16, ``MODEL.LAMBDA_RESNET.COMPILE`` for "compiled").
Candidates are timed in interleaved rounds, the first one rotating; ratios are medians of
per-round ratios to the first candidate.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch
from detectron2.solver import build_optimizer
from detectron2.structures import BitMasks, Boxes, Instances
from detectron2.utils.events import EventStorage
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.harness import (
    Candidate,
    free_memory,
    is_out_of_memory,
    median,
    paired_ratio,
    run_round_robin,
    synchronize,
)
from benchmarks.memory import peak_bytes
from benchmarks.report import markdown_table
from lambda_det.engine.amp import AMP_DTYPES
from lambda_det.engine.trainer import Trainer
from lambda_det.layers import LambdaLayer
from lambda_det.run_config import load_config
from lambda_det.utils.errors import UserError

__all__ = [
    "DetectorSettings",
    "DetectorStep",
    "benchmark_detector",
    "format_detector",
    "lambda_layer_share",
    "synthetic_batch",
    "parse_config_spec",
    "PRECISIONS",
    "MODES",
]

PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
MODES = ("eager", "compiled")
LAMBDA_RANGE = "lambda_det::LambdaLayer"


@dataclass
class DetectorSettings:
    configs: Sequence[str] = ("lambda_r152_mask_rcnn", "r152_mask_rcnn")
    opts: Sequence[str] = ()
    ims_per_device: int = 4
    precisions: Sequence[str] = ("bf16",)
    modes: Sequence[str] = ("eager",)
    size: Optional[int] = None  # default: the config's training size (INPUT.LSJ.IMAGE_SIZE)
    device: str = "cuda"
    warmup: int = 2
    rounds: int = 5
    max_batch: int = 0  # > 0: search the largest batch up to this (GPUs only)
    objects: int = 4  # boxes (with masks) per image


def synthetic_batch(
    cfg, images: int, size: int, objects: int, device: torch.device, seed: int = 0
) -> List[Dict]:
    """Detectron2 training inputs on ``device``: uint8 images of ``size`` x ``size`` with
    ``objects`` random boxes each, their box masks and random classes."""
    generator = torch.Generator().manual_seed(seed)
    num_classes = cfg.MODEL.ROI_HEADS.NUM_CLASSES
    batch = []
    for _ in range(images):
        corners = torch.rand(objects, 2, 2, generator=generator) * (size - 8)
        low, high = corners.min(dim=1).values, corners.max(dim=1).values + 8
        boxes = torch.cat([low, high], dim=1)
        masks = torch.zeros(objects, size, size, dtype=torch.bool)
        for mask, (x0, y0, x1, y1) in zip(masks, boxes.round().long().tolist()):
            mask[y0:y1, x0:x1] = True
        instances = Instances((size, size))
        instances.gt_boxes = Boxes(boxes)
        instances.gt_classes = torch.randint(0, num_classes, (objects,), generator=generator)
        instances.gt_masks = BitMasks(masks)
        image = torch.randint(0, 256, (3, size, size), generator=generator, dtype=torch.uint8)
        batch.append(
            {
                "image": image.to(device),
                "instances": instances.to(device),
                "height": size,
                "width": size,
            }
        )
    return batch


class DetectorStep:
    """One training step of a detector on a fixed batch: forward under autocast, backward
    (scaled for fp16), the optimizer's update."""

    def __init__(self, cfg, batch: List[Dict], precision: str):
        self.model = Trainer.build_model(cfg).train()
        self.optimizer = build_optimizer(cfg, self.model)
        self.batch = batch
        self.x = batch[0]["image"]  # for the memory probe: the device
        self.dtype = AMP_DTYPES[PRECISIONS[precision]] if PRECISIONS[precision] else None
        self.scaler = (
            torch.amp.GradScaler(self.x.device.type) if self.dtype == torch.float16 else None
        )

    def __call__(self) -> None:
        with (
            EventStorage(),
            torch.autocast(
                self.x.device.type,
                dtype=self.dtype or torch.float32,
                enabled=self.dtype is not None,
            ),
        ):
            losses = sum(self.model(self.batch).values())  # the heads log into the storage
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            losses.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(losses).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()


def lambda_layer_share(step: DetectorStep) -> float:
    """The share of one step's time spent in lambda layers, forward and backward, from the
    profiler: the ops inside each LambdaLayer's forward, and the backward ops autograd links to
    them by sequence number (device time on a GPU, CPU time on the CPU)."""
    ranges = {}

    def enter(module, inputs):
        ranges[id(module)] = record_function(LAMBDA_RANGE)
        ranges[id(module)].__enter__()

    def leave(module, inputs, output):
        ranges.pop(id(module)).__exit__(None, None, None)

    handles = []
    for module in step.model.modules():
        if isinstance(module, LambdaLayer):
            handles += [
                module.register_forward_pre_hook(enter),
                module.register_forward_hook(leave),
            ]
    on_gpu = step.x.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    try:
        with profile(activities=activities) as profiler:
            step()
            synchronize(step.x.device)
    finally:
        for handle in handles:
            handle.remove()
    events = profiler.events()

    def self_time(event) -> float:
        return event.self_device_time_total if on_gpu else event.self_cpu_time_total

    def inside(event, roots) -> bool:
        while event is not None:
            if id(event) in roots:
                return True
            event = event.cpu_parent
        return False

    forward_roots = {id(event) for event in events if event.name == LAMBDA_RANGE}
    sequence = {
        event.sequence_nr
        for event in events
        if event.sequence_nr >= 0 and inside(event, forward_roots)
    }
    backward_roots = {
        id(event)
        for event in events
        if event.name.startswith("autograd::engine::evaluate_function")
        and event.sequence_nr in sequence
    }
    roots = forward_roots | backward_roots
    total = sum(self_time(event) for event in events)
    spent = sum(self_time(event) for event in events if inside(event, roots))
    return spent / total if total else 0.0


def _largest_batch(
    cfg, size: int, settings: DetectorSettings, precision: str, device: torch.device
) -> Optional[int]:
    """The largest images per device (doubling, then bisecting, up to ``max_batch``) whose
    step runs without running out of memory; None on the CPU or when not asked."""
    if device.type != "cuda" or settings.max_batch < 1:
        return None

    def fits(images: int) -> bool:
        try:
            step = DetectorStep(
                cfg, synthetic_batch(cfg, images, size, settings.objects, device), precision
            )
            step()
            synchronize(device)
            return True
        except (RuntimeError, MemoryError) as error:
            if not is_out_of_memory(error):
                raise
            return False
        finally:
            free_memory(device)

    low, high = 0, 1
    while high <= settings.max_batch and fits(high):
        low, high = high, high * 2
    high = min(high, settings.max_batch + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def parse_config_spec(spec: str):
    """``NAME`` or ``NAME:KEY=VALUE,KEY=VALUE`` (overrides of that candidate only) ->
    (name, overrides)."""
    name, _, extra = spec.partition(":")
    overrides = []
    for pair in filter(None, extra.split(",")):
        key, equals, value = pair.partition("=")
        if not equals:
            raise UserError(f"config {spec!r}: overrides are KEY=VALUE, got {pair!r}")
        overrides += [key, value]
    return name, overrides


def benchmark_detector(settings: DetectorSettings) -> Dict[str, object]:
    """Every (config, mode, precision) of ``settings``, timed in one round robin."""
    device = torch.device(settings.device)
    if len(set(settings.configs)) != len(settings.configs):
        raise UserError(f"--configs names a config twice: {list(settings.configs)}")
    unknown = [p for p in settings.precisions if p not in PRECISIONS] + [
        m for m in settings.modes if m not in MODES
    ]
    if unknown:
        raise UserError(
            f"unknown precision or mode {unknown}: precisions are "
            f"{list(PRECISIONS)}, modes {list(MODES)}"
        )
    candidates, steps, rows = [], {}, []
    for config in settings.configs:
        for mode in settings.modes:
            for precision in settings.precisions:
                name, overrides = parse_config_spec(config)
                cfg = load_config(
                    name,
                    [
                        *settings.opts,
                        *overrides,
                        "MODEL.DEVICE",
                        str(device),
                        "MODEL.LAMBDA_RESNET.COMPILE",
                        str(mode == "compiled"),
                    ],
                )
                size = settings.size or (
                    cfg.INPUT.LSJ.IMAGE_SIZE if cfg.INPUT.LSJ.ENABLED else cfg.INPUT.MIN_SIZE_TEST
                )
                torch.manual_seed(0)
                step = DetectorStep(
                    cfg,
                    synthetic_batch(cfg, settings.ims_per_device, size, settings.objects, device),
                    precision,
                )
                name = f"{config} {mode} {precision}"
                candidates.append(Candidate(name, lambda: None, module=step.model))
                steps[name] = step
                rows.append(
                    {
                        "name": name,
                        "config": config,
                        "mode": mode,
                        "precision": precision,
                        "size": size,
                        "cfg": cfg,
                    }
                )
    run_round_robin(candidates, steps, device, settings.warmup, settings.rounds)
    baseline = candidates[0]
    for row, candidate in zip(rows, candidates):
        step = steps[candidate.name]
        row.update(
            {
                "seconds_per_image": (
                    median(candidate.times) / settings.ims_per_device if candidate.times else None
                ),
                "ratio": paired_ratio(candidate.times, baseline.times),
                "error": candidate.error,
                "peak_bytes": None if candidate.error else peak_bytes(step),
                "lambda_share": None if candidate.error else lambda_layer_share(step),
                "parameters": sum(p.numel() for p in step.model.parameters()),
            }
        )
        row["largest_batch"] = _largest_batch(
            row.pop("cfg"), row["size"], settings, row["precision"], device
        )
        del steps[candidate.name]
        free_memory(device)
    return {
        "settings": {
            key: list(value) if isinstance(value, (list, tuple)) else value
            for key, value in vars(settings).items()
        },
        "rows": rows,
    }


def format_detector(results: Dict[str, object]) -> str:
    settings = results["settings"]
    header = [
        "candidate",
        "ms / image",
        "x first",
        "peak MiB",
        "largest batch",
        "lambda layers",
        "params (M)",
    ]
    table = []
    for row in results["rows"]:
        table.append(
            [
                row["name"],
                f"{row['seconds_per_image'] * 1e3:.1f}"
                if row["seconds_per_image"]
                else row["error"],
                f"{row['ratio']:.3f}" if row["ratio"] else "-",
                f"{row['peak_bytes'] / 2**20:.0f}" if row["peak_bytes"] is not None else "-",
                str(row["largest_batch"]) if row["largest_batch"] else "-",
                f"{row['lambda_share']:.0%}" if row["lambda_share"] is not None else "-",
                f"{row['parameters'] / 1e6:.1f}",
            ]
        )
    title = (
        f"Training step, {settings['ims_per_device']} images per device at "
        f"{results['rows'][0]['size']} px, {settings['device']}, median of "
        f"{settings['rounds']} interleaved rounds"
    )
    return markdown_table(title, header, table)
