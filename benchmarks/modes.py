"""The three benchmark modes: single layers, the backbone, its lambda blocks."""

import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks import candidates as layer_zoo
from benchmarks.harness import (
    Candidate,
    Step,
    free_memory,
    gemm_yardstick,
    is_out_of_memory,
    machine_description,
    median,
    paired_ratio,
    run_round_robin,
)
from benchmarks.memory import peak_bytes, saved_bytes
from benchmarks.report import format_shape_table
from lambda_det.layers import LambdaLayer
from lambda_det.layers.lambda_conv import DEFAULT_TILE, TiledTuning


@dataclass(frozen=True)
class LayerSettings:
    """What the layer mode runs."""

    device: torch.device
    dtype: str = "fp32"  # "fp32", or "bf16": every forward under torch.autocast(bfloat16)
    shapes: Sequence[str] = tuple(layer_zoo.SHAPES)
    only: Optional[Sequence[str]] = None  # candidates whose name contains one of these words
    batch: int = 2
    repetitions: int = 7
    warmup: int = 2
    memory_cap_gib: float = 4.0  # skip candidates whose n x n tensors would need more
    tile: Tuple[int, ...] = ()  # query tile of lambda_det's "tiled" impl; () for its default
    compile: Optional[str] = None  # torch.compile mode for every module ("default": no mode)


@dataclass(frozen=True)
class BackboneSettings:
    """What the backbone and blocks modes run."""

    device: torch.device
    dtype: str = "fp32"
    depth: int = 101
    image: int = 1024
    impl: str = "auto"  # the lambda layers' impl
    repetitions: int = 5
    warmup: int = 1
    grad_checkpointing: bool = False  # backbone mode: one more LambdaResNet, checkpointed


def _autocast(dtype: str) -> Optional[torch.dtype]:
    return torch.bfloat16 if dtype == "bf16" else None


def benchmark_layers(settings: LayerSettings) -> Dict[str, object]:
    device, autocast = settings.device, _autocast(settings.dtype)
    results: Dict[str, object] = {
        "mode": "layer",
        "device": str(device),
        "dtype": settings.dtype,
        "compile": settings.compile,
        "batch": settings.batch,
        "repetitions": settings.repetitions,
        "tiled_tile": tuple(settings.tile) or DEFAULT_TILE[2],
        "machine": machine_description(device),
        "shapes": {},
    }
    for shape_name in settings.shapes:
        height, width, channels = layer_zoo.SHAPES[shape_name]
        print(f"== {shape_name}: {height}x{width}x{channels}, batch {settings.batch}", flush=True)
        torch.manual_seed(0)
        x = torch.randn(settings.batch, channels, height, width, device=device, requires_grad=True)
        candidates = layer_zoo.layer_candidates(
            height,
            width,
            channels,
            settings.batch,
            settings.memory_cap_gib * 2**30,
            settings.only,
            settings.tile,
        )
        steps: Dict[str, Callable[[], None]] = {}
        for candidate in candidates:
            if candidate.skip:
                continue
            candidate.module = candidate.build().to(device).train()
            module = candidate.module
            if settings.compile:
                module = torch.compile(
                    module, mode=None if settings.compile == "default" else settings.compile
                )
            steps[candidate.name] = Step(module, x, autocast)
        yardsticks = [gemm_yardstick(device, torch.float32)]
        if autocast is not None and device.type == "cuda":
            yardsticks.append(gemm_yardstick(device, torch.bfloat16))
        for yardstick in yardsticks:
            steps[yardstick.name] = yardstick.run
        run_round_robin(
            candidates + yardsticks, steps, device, settings.warmup, settings.repetitions
        )
        for candidate in candidates:
            if candidate.name in steps and not candidate.error:
                step = steps[candidate.name]
                try:
                    candidate.memory = {"peak": peak_bytes(step), "saved": saved_bytes(step)}
                except (RuntimeError, MemoryError) as error:
                    if not is_out_of_memory(error):
                        raise
                    candidate.memory = {"peak": None, "saved": None}
                    candidate.error = "OOM while measuring memory"
            candidate.module = None
            free_memory(device)
        auto = LambdaLayer(channels, tuning=TiledTuning(tile=tuple(settings.tile)))
        results["shapes"][shape_name] = _summarize_shape(
            candidates,
            yardsticks,
            height,
            width,
            channels,
            settings.batch,
            auto.resolve_impl((height, width), device.type),
        )
        print(format_shape_table(shape_name, results["shapes"][shape_name]), flush=True)
    return results


def _summarize_shape(
    candidates: List[Candidate],
    yardsticks,
    height: int,
    width: int,
    channels: int,
    batch: int,
    auto_impl: str,
) -> Dict[str, object]:
    flops = layer_zoo.useful_flops(height, width, channels, batch)
    gemm = {y.name: y.flops / median(y.times) / 1e9 for y in yardsticks if y.times}
    sgemm = gemm.get("sgemm")
    medians = {c.name: median(c.times) for c in candidates}
    rows = []
    for candidate in candidates:
        seconds = medians[candidate.name]
        row = {
            "name": candidate.name,
            "median_s": seconds,
            "min_s": min(candidate.times) if candidate.times else None,
            "times_s": candidate.times,
            "note": candidate.skip or candidate.error or "",
            "peak_bytes": candidate.memory.get("peak"),
            "saved_bytes": candidate.memory.get("saved"),
        }
        if seconds is not None:
            for reference, key in (
                (layer_zoo.TIMM, "speedup_vs_timm"),
                (layer_zoo.LUCIDRAINS, "speedup_vs_lucidrains"),
            ):
                if medians.get(reference):
                    row[key] = medians[reference] / seconds
            if candidate.lambda_impl:
                row["useful_gflops"] = flops / seconds / 1e9
                if sgemm:
                    row["percent_of_sgemm"] = 100 * row["useful_gflops"] / sgemm
        rows.append(row)
    return {
        "height": height,
        "width": width,
        "channels": channels,
        "useful_flops_fwd_bwd": flops,
        "gemm_gflops": gemm,
        "auto_impl": auto_impl,
        "rows": rows,
    }


def _fvcore_flops(model: torch.nn.Module, x: torch.Tensor) -> Optional[float]:
    """Forward FLOPs as fvcore counts them, with lambda_det's handles, of the forms the lambda
    layers run in eager mode (None without fvcore); leaves the model in train."""
    try:
        from fvcore.nn import FlopCountAnalysis
    except ImportError:
        return None
    from lambda_det.layers import eager_impls, flop_handles

    with warnings.catch_warnings(), torch.no_grad(), eager_impls(model, x):
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        analysis = FlopCountAnalysis(model.eval(), x).set_op_handle(**flop_handles())
        flops = analysis.total()
    model.train()
    return flops


def benchmark_backbone(settings: BackboneSettings) -> Dict[str, object]:
    """LambdaResNet (the paper's placement) against its ResNet-RS baseline (placement="none")."""
    from lambda_det.modeling import lambda_resnet

    device, depth = settings.device, settings.depth
    torch.manual_seed(0)
    x = torch.randn(1, 3, settings.image, settings.image, device=device, requires_grad=False)
    models = {
        f"LambdaResNet-{depth} (paper placement, impl={settings.impl})": lambda_resnet(
            depth, placement="paper", impl=settings.impl
        ),
    }
    if settings.grad_checkpointing:
        models[f"LambdaResNet-{depth} (paper placement, grad checkpointing)"] = lambda_resnet(
            depth, placement="paper", impl=settings.impl, grad_checkpointing=True
        )
    models[f"ResNet-RS-{depth} (placement=none)"] = lambda_resnet(depth, placement="none")
    candidates, steps = [], {}
    for name, model in models.items():
        candidate = Candidate(name, lambda: None, module=model.to(device).train())
        steps[name] = Step(candidate.module, x, _autocast(settings.dtype))
        candidates.append(candidate)
    yardstick = gemm_yardstick(device, torch.float32)
    steps[yardstick.name] = yardstick.run
    run_round_robin(candidates + [yardstick], steps, device, settings.warmup, settings.repetitions)
    rows = []
    for candidate in candidates:
        step = steps[candidate.name]
        memory = {} if candidate.error else {"peak": peak_bytes(step), "saved": saved_bytes(step)}
        rows.append(
            {
                "name": candidate.name,
                "median_s": median(candidate.times),
                "ratio_to_baseline": paired_ratio(candidate.times, candidates[-1].times),
                "times_s": candidate.times,
                "note": candidate.error or "",
                "parameters": sum(p.numel() for p in candidate.module.parameters()),
                "fvcore_flops": _fvcore_flops(candidate.module, x),
                "peak_bytes": memory.get("peak"),
                "saved_bytes": memory.get("saved"),
            }
        )
    return {
        "mode": "backbone",
        "device": str(device),
        "dtype": settings.dtype,
        "image": settings.image,
        "batch": 1,
        "depth": depth,
        "repetitions": settings.repetitions,
        "machine": machine_description(device),
        "gemm_gflops": {yardstick.name: yardstick.flops / median(yardstick.times) / 1e9},
        "rows": rows,
    }


def block_kinds(depth: int, image: int) -> List[Dict[str, object]]:
    """The kinds of lambda block in LambdaResNet-<depth> (paper placement) at image x image, and
    how many of each it has: lambda blocks of c4, the strided first block of c5, the rest of c5."""
    from lambda_det.modeling.lambda_resnet import BLOCKS_PER_STAGE, PAPER_LAMBDA_BLOCKS_C4

    c4, c5 = image // 16, image // 32
    return [
        {
            "name": "c4 block",
            "count": len(PAPER_LAMBDA_BLOCKS_C4[depth]),
            "block": dict(in_channels=1024, out_channels=1024, width=256, stride=1),
            "input": (1, 1024, c4, c4),
        },
        {
            "name": "c5 first block (stride 2)",
            "count": 1,
            "block": dict(in_channels=1024, out_channels=2048, width=512, stride=2),
            "input": (1, 1024, c4, c4),
        },
        {
            "name": "c5 block",
            "count": BLOCKS_PER_STAGE[depth][3] - 1,
            "block": dict(in_channels=2048, out_channels=2048, width=512, stride=1),
            "input": (1, 2048, c5, c5),
        },
    ]


def benchmark_blocks(settings: BackboneSettings) -> Dict[str, object]:
    """Each kind of lambda block against the conv block it replaces, as in the backbone."""
    from lambda_det.modeling.blocks import Bottleneck
    from lambda_det.modeling.mixers import build_mixer_factory

    device = settings.device
    rows = []
    for kind in block_kinds(settings.depth, settings.image):
        torch.manual_seed(0)
        x = torch.randn(kind["input"], device=device, requires_grad=True)
        candidates, steps = [], {}
        for mixer in ("lambda", "conv"):
            options = {"impl": settings.impl} if mixer == "lambda" else {}
            module = Bottleneck(**kind["block"], mixer=build_mixer_factory(mixer, **options))
            module.to(device).train()
            candidate = Candidate(f"{kind['name']}, {mixer}", lambda: None, module=module)
            steps[candidate.name] = Step(module, x, _autocast(settings.dtype))
            candidates.append(candidate)
        run_round_robin(candidates, steps, device, settings.warmup, settings.repetitions)
        lambda_s, conv_s = (median(candidate.times) for candidate in candidates)
        rows.append(
            {
                "name": kind["name"],
                "count": kind["count"],
                "input": list(kind["input"]),
                "lambda_s": lambda_s,
                "conv_s": conv_s,
                "ratio": paired_ratio(candidates[0].times, candidates[1].times),
                "lambda_times_s": candidates[0].times,
                "conv_times_s": candidates[1].times,
            }
        )
    return {
        "mode": "blocks",
        "device": str(device),
        "dtype": settings.dtype,
        "image": settings.image,
        "depth": settings.depth,
        "repetitions": settings.repetitions,
        "machine": machine_description(device),
        "rows": rows,
    }
