#!/usr/bin/env python
"""Lambda layer speed and memory, side by side in one process: every lambda_det implementation,
timm's and lucidrains' lambda layers, the 3x3 conv a lambda layer replaces, global multi-head
self-attention on the same feature map, and the Attention Free Transformer's mixers (AFT-conv,
-simple, -local, -full from lambda_det.layers).

    python tools/benchmark_lambda.py                                  # CPU, fp32, all shapes
    python tools/benchmark_lambda.py --device cuda --dtype bf16       # a GPU, under bf16 autocast
    python tools/benchmark_lambda.py --backbone                       # LambdaResNet-101 vs baseline
    python tools/benchmark_lambda.py --blocks                         # its lambda blocks vs conv

Layer mode times forward + backward of one layer in train mode (batch statistics in BN, the
gradient of the input and of every parameter), batch 2, h=4, k=16, u=1, scope 23 (r=23 for timm
and lucidrains), on these feature maps:

    c4_1024  64 x 64 x 256   stage c4 (stride 16) of a 1024 x 1024 detection input
    c5_1024  32 x 32 x 512   stage c5 (stride 32) of a 1024 x 1024 detection input
    c4_224   14 x 14 x 256   stage c4 of a 224 x 224 ImageNet input
    c5_224    7 x  7 x 512   stage c5 of a 224 x 224 ImageNet input

Every repetition runs each candidate once, round robin with the starting candidate rotated, so all
of them see the same machine load; the tables quote medians, and ratios of medians from the same
run. A square fp32 GEMM ("sgemm") is timed in the same round robin as the machine's yardstick.

Memory, measured once per candidate after the timing (not timed):

* peak: the most tensor memory allocated at once during forward + backward, above what was
  allocated before it (inputs and parameters excluded, parameter gradients included). On a GPU:
  ``torch.cuda.max_memory_allocated``. On the CPU: the running sum of every allocation and free
  that torch's profiler records (``profile_memory=True``), i.e. the CPU allocator's high-water
  mark; allocations that libraries make outside torch's allocator (MKL, oneDNN scratch) are not
  seen.
* saved: the bytes of the storages that autograd keeps from forward to backward (through
  ``torch.autograd.graph.saved_tensors_hooks``, parameters and the input excluded). In a deep
  network this is what adds up layer after layer.

Useful FLOPs of a lambda convolution are the r x r window MACs of the paper's form, 2 b n k v u r^2
per forward (the window cropped to the map, r_eff = min(r, 2 size - 1) per axis), times 3 for
forward + backward. Every lambda implementation is credited with the same useful FLOPs, so useful
GFLOP/s is a speed, comparable across implementations and with the sgemm rate; an implementation
that contracts in a cheaper order (lambda_det's "tiled") executes fewer FLOPs than it is credited.

Global self-attention: 4 heads of C / 4 channels, q/k/v/output 1x1 projections, no position
encoding. "explicit" materialises the b x heads x n x n attention matrix (skipped, and reported as
such, when that matrix and its gradient would exceed --memory-cap-gib); "sdpa" is PyTorch's
fused scaled_dot_product_attention. lambda_det's "einsum" impl materialises k x u x n x n
relative embeddings and is skipped by the same cap.

Backbone mode (--backbone): LambdaResNet-101 (the paper's placement) against placement="none"
(its ResNet-RS-101 baseline) at 1024 x 1024, batch 1, train mode: forward + backward time of the
sum of res2..res5, peak and saved memory as above, parameters, and forward FLOPs counted by
fvcore (one fused multiply-add = one FLOP, fvcore's convention) as the model runs.

Blocks mode (--blocks): the three kinds of lambda block in that backbone (c4, the strided first
block of c5, the other c5 blocks; whole bottlenecks, batch 1, train mode) each against the conv
block it replaces, round robin, with the median per-round ratio and what the difference adds up
to over the backbone's blocks of that kind.

Outputs, under --out: results.md (the tables), results.json (everything, with the machine
description), results.png (time and memory per shape).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout as a script


def import_layers():
    """lambda_det.layers; it needs torch only, so a bare machine without detectron2 can run it."""
    try:
        import lambda_det.layers as layers
    except ImportError as error:
        if "detectron2" not in str(error):
            raise
        # lambda_det/__init__ imports detectron2; the layers do not need it. Load them alone.
        for name in [name for name in sys.modules if name.split(".")[0] == "lambda_det"]:
            del sys.modules[name]
        package = types.ModuleType("lambda_det")
        package.__path__ = [str(ROOT / "lambda_det")]
        sys.modules["lambda_det"] = package
        import lambda_det.layers as layers
    return layers


SHAPES = {  # name: (H, W, channels)
    "c4_1024": (64, 64, 256),
    "c5_1024": (32, 32, 512),
    "c4_224": (14, 14, 256),
    "c5_224": (7, 7, 512),
}
HEADS, DIM_K, DIM_U, SCOPE = 4, 16, 1, 23
TIMM, LUCIDRAINS = "timm LambdaLayer", "lucidrains LambdaLayer"
AFT_HEADS, AFT_WINDOW = 8, 7  # MODEL.LAMBDA_RESNET.AFT_HEADS / AFT_WINDOW_SIZE defaults


class GlobalSelfAttention(nn.Module):
    """Multi-head self-attention over all H x W positions (no position encoding)."""

    def __init__(self, channels: int, heads: int = HEADS, fused: bool = False):
        super().__init__()
        self.heads, self.fused = heads, fused
        self.qkv = nn.Conv2d(channels, 3 * channels, 1, bias=False)
        self.proj = nn.Conv2d(channels, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        qkv = self.qkv(x).reshape(batch, 3, self.heads, channels // self.heads, height * width)
        q, k, v = qkv.transpose(-1, -2).unbind(1)  # b heads n d
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v)  # b heads n d
        else:
            attention = (q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5).softmax(-1)  # b heads n n
            out = attention @ v  # b heads n d
        return self.proj(out.transpose(-1, -2).reshape(batch, channels, height, width))


class Candidate:
    """One thing to time: a module and its input, or the sgemm yardstick."""

    def __init__(self, name: str, build: Callable[[], nn.Module], skip: Optional[str] = None,
                 lambda_impl: bool = False):
        self.name, self.build, self.skip, self.lambda_impl = name, build, skip, lambda_impl
        self.module: Optional[nn.Module] = None
        self.times: List[float] = []
        self.error: Optional[str] = None
        self.memory: Dict[str, Optional[int]] = {}


def layer_candidates(layers, height: int, width: int, channels: int, batch: int,
                     cap_bytes: float, only: Optional[List[str]]) -> List[Candidate]:
    n = height * width
    dim_v = channels // HEADS
    candidates = []
    for impl in layers.IMPLEMENTATIONS:
        skip = None
        if impl == "einsum":
            # E (k u n m) and its gradient, plus the (b n k v) position lambdas.
            need = 4 * (2 * DIM_K * DIM_U * n * n + 2 * batch * n * DIM_K * dim_v)
            if need > cap_bytes:
                skip = f"too large: ~{need / 2**30:.1f} GiB for E > cap"
        candidates.append(Candidate(
            f"lambda_det {impl}",
            lambda impl=impl: layers.LambdaLayer(channels, heads=HEADS, dim_k=DIM_K, dim_u=DIM_U,
                                                 scope=SCOPE, impl=impl),
            skip, lambda_impl=True))

    def timm_layer():
        from timm.layers.lambda_layer import LambdaLayer
        return LambdaLayer(channels, num_heads=HEADS, dim_head=DIM_K, r=SCOPE)

    def lucidrains_layer():
        from lambda_networks import LambdaLayer
        return LambdaLayer(channels, dim_k=DIM_K, r=SCOPE, heads=HEADS, dim_u=DIM_U)

    candidates.append(Candidate(TIMM, timm_layer, lambda_impl=True))
    candidates.append(Candidate(LUCIDRAINS, lucidrains_layer, lambda_impl=True))
    candidates.append(Candidate("conv 3x3", lambda: nn.Conv2d(channels, channels, 3, padding=1,
                                                              bias=False)))
    # The Attention Free Transformer's mixers (lambda_det.layers.aft): AFT-conv as the backbone
    # uses it (MODEL.LAMBDA_RESNET.AFT_HEADS / AFT_WINDOW_SIZE) and with the lambda layer's
    # scope; AFT-local with that window and AFT-full mix through one n x n matrix.
    size = max(height, width)
    candidates += [
        Candidate(f"AFT-conv h={AFT_HEADS} s={AFT_WINDOW}",
                  lambda: layers.AFTConv(channels, heads=AFT_HEADS, window_size=AFT_WINDOW)),
        Candidate(f"AFT-conv h={AFT_HEADS} s={SCOPE}",
                  lambda: layers.AFTConv(channels, heads=AFT_HEADS, window_size=SCOPE)),
        Candidate("AFT-simple", lambda: layers.AFTSimple(channels)),
        Candidate(f"AFT-local s={SCOPE}",
                  lambda: layers.AFTLocal(channels, window_size=SCOPE, max_size=size)),
        Candidate("AFT-full", lambda: layers.AFTFull(channels, max_size=size)),
    ]
    attention_bytes = 3 * 4 * batch * HEADS * n * n  # logits, probabilities, their gradient
    candidates.append(Candidate(
        "self-attention explicit", lambda: GlobalSelfAttention(channels),
        f"too large: ~{attention_bytes / 2**30:.1f} GiB for the n x n matrix > cap"
        if attention_bytes > cap_bytes else None))
    candidates.append(Candidate("self-attention sdpa", lambda: GlobalSelfAttention(channels,
                                                                                  fused=True)))
    if only:
        names = [c.name for c in candidates]
        candidates = [c for c in candidates if any(word in c.name for word in only)]
        if not candidates:
            raise ValueError(f"--only {only} matches none of the candidates {names}")
    return candidates


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Step:
    """Forward + backward of a module on a fixed input and output gradient."""

    def __init__(self, module: nn.Module, x: torch.Tensor, autocast: Optional[torch.dtype]):
        self.module, self.x, self.autocast = module, x, autocast
        self.grad: Optional[torch.Tensor] = None

    def __call__(self) -> None:
        self.x.grad = None
        for parameter in self.module.parameters():
            parameter.grad = None
        with torch.autocast(self.x.device.type, dtype=self.autocast or torch.float32,
                            enabled=self.autocast is not None):
            output = self.module(self.x)
        if isinstance(output, dict):
            output = torch.stack([value.float().sum() for value in output.values()]).sum()
        if self.grad is None or self.grad.shape != output.shape:
            generator = torch.Generator(device=output.device).manual_seed(0)
            self.grad = torch.randn(output.shape, generator=generator, device=output.device,
                                    dtype=output.dtype)
        output.backward(self.grad)


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, MemoryError) or "out of memory" in str(error).lower() or \
        "can't allocate memory" in str(error).lower() or "not enough memory" in str(error).lower()


def saved_bytes(step: Step) -> int:
    """Bytes of the storages autograd keeps for backward (parameters and the input excluded)."""
    excluded = {p.untyped_storage().data_ptr() for p in step.module.parameters()}
    excluded.add(step.x.untyped_storage().data_ptr())
    storages: Dict[int, int] = {}

    def pack(tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    step.x.grad = None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast(step.x.device.type, dtype=step.autocast or torch.float32,
                            enabled=step.autocast is not None):
            output = step.module(step.x)
    del output
    return sum(storages.values())


def peak_bytes(step: Step) -> Optional[int]:
    """Most tensor memory allocated at once during one step, above what was allocated before."""
    device = step.x.device
    if device.type == "cuda":
        synchronize(device)
        free_memory(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    try:
        from torch._C._profiler import _EventType
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    allocations = []
    pending = list(profiler.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        pending.extend(event.children)
        if event.tag == _EventType.Allocation:
            allocations.append((event.start_time_ns, event.extra_fields.alloc_size))
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return peak


def gemm_candidate(device: torch.device, dtype: torch.dtype) -> Candidate:
    size = 2048 if device.type == "cpu" else 8192
    candidate = Candidate("sgemm" if dtype == torch.float32 else "bf16 gemm", lambda: None)
    candidate.flops = 2 * size ** 3
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    candidate.run = lambda: torch.mm(a, b)
    return candidate


def run_round_robin(candidates: List[Candidate], steps: Dict[str, Callable[[], None]],
                    device: torch.device, warmup: int, repetitions: int) -> None:
    live = [c for c in candidates if c.name in steps]
    for repetition in range(warmup + repetitions):
        start = repetition % max(1, len(live))
        for candidate in live[start:] + live[:start]:
            if candidate.error:
                continue
            try:
                synchronize(device)
                began = time.perf_counter()
                steps[candidate.name]()
                synchronize(device)
                elapsed = time.perf_counter() - began
            except (RuntimeError, MemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                candidate.error = "OOM"
                free_memory(device)
                continue
            if repetition >= warmup:
                candidate.times.append(elapsed)


def paired_ratio(times: List[float], baseline_times: List[float]) -> Optional[float]:
    """Median over rounds of time / baseline time in the same round.

    The machine's speed drifts between rounds; a ratio within a round cancels most of it.
    """
    ratios = [mine / theirs for mine, theirs in zip(times, baseline_times)]
    return median(ratios) if ratios else None


def median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def machine_description(device: torch.device) -> Dict[str, object]:
    info: Dict[str, object] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in lscpu.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU family", "Model", "CPU(s)", "Thread(s) per core",
                               "Core(s) per socket", "L3 cache"):
                info[f"lscpu {key.strip()}"] = value.strip()
            elif key.strip() == "Flags":
                # The same "AMD EPYC" name covers hosts with and without AVX-512, on which
                # oneDNN's convolutions and MKL's GEMMs speed up by different amounts.
                info["avx512f"] = "avx512f" in value.split()
    except (OSError, subprocess.CalledProcessError):
        pass
    info["torch cpu capability"] = torch.backends.cpu.get_cpu_capability()
    for package in ("timm", "lambda_networks", "fvcore"):
        try:
            info[package] = __import__(package).__version__
        except (ImportError, AttributeError):
            pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["cudnn.allow_tf32"] = torch.backends.cudnn.allow_tf32
        info["matmul.allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
    return info


def useful_flops(height: int, width: int, channels: int, batch: int) -> float:
    """Forward + backward r x r window FLOPs of the paper's lambda convolution (3x forward)."""
    window = min(SCOPE, 2 * height - 1) * min(SCOPE, 2 * width - 1)
    return 3 * 2 * batch * height * width * DIM_K * (channels // HEADS) * DIM_U * window


def benchmark_layers(args, device: torch.device) -> Dict[str, object]:
    layers = import_layers()
    tiles = layers.lambda_conv.DEFAULT_TILE[layers.lambda_conv.tuning_key(device.type)]
    if args.tile:
        tiles[2] = tuple(args.tile)
    autocast = torch.bfloat16 if args.dtype == "bf16" else None
    results: Dict[str, object] = {"mode": "layer", "device": str(device), "dtype": args.dtype,
                                  "compile": args.compile,
                                  "batch": args.batch, "repetitions": args.repetitions,
                                  "tiled_tile": tiles[2],
                                  "machine": machine_description(device), "shapes": {}}
    for shape_name in args.shapes:
        height, width, channels = SHAPES[shape_name]
        print(f"== {shape_name}: {height}x{width}x{channels}, batch {args.batch}", flush=True)
        torch.manual_seed(0)
        x = torch.randn(args.batch, channels, height, width, device=device, requires_grad=True)
        candidates = layer_candidates(layers, height, width, channels, args.batch,
                                      args.memory_cap_gib * 2**30, args.only)
        steps: Dict[str, Callable[[], None]] = {}
        for candidate in candidates:
            if candidate.skip:
                continue
            candidate.module = candidate.build().to(device).train()
            module = candidate.module
            if args.compile:
                module = torch.compile(module, mode=None if args.compile == "default"
                                       else args.compile)
            steps[candidate.name] = Step(module, x, autocast)
        yardsticks = [gemm_candidate(device, torch.float32)]
        if autocast is not None and device.type == "cuda":
            yardsticks.append(gemm_candidate(device, torch.bfloat16))
        for yardstick in yardsticks:
            steps[yardstick.name] = yardstick.run
        run_round_robin(candidates + yardsticks, steps, device, args.warmup, args.repetitions)
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
        results["shapes"][shape_name] = summarize_shape(
            layers, candidates, yardsticks, height, width, channels, args.batch, device.type)
        print(format_shape_table(shape_name, results["shapes"][shape_name]), flush=True)
    return results


def summarize_shape(layers, candidates, yardsticks, height, width, channels, batch,
                    device_type):
    flops = useful_flops(height, width, channels, batch)
    gemm = {y.name: y.flops / median(y.times) / 1e9 for y in yardsticks if y.times}
    sgemm = gemm.get("sgemm")
    medians = {c.name: median(c.times) for c in candidates}
    resolved = layers.LambdaLayer(channels, heads=HEADS, dim_k=DIM_K, scope=SCOPE)
    rows = []
    for candidate in candidates:
        seconds = medians[candidate.name]
        row = {"name": candidate.name, "median_s": seconds,
               "min_s": min(candidate.times) if candidate.times else None,
               "times_s": candidate.times, "note": candidate.skip or candidate.error or "",
               "peak_bytes": candidate.memory.get("peak"),
               "saved_bytes": candidate.memory.get("saved")}
        if seconds is not None:
            for reference, key in ((TIMM, "speedup_vs_timm"),
                                   (LUCIDRAINS, "speedup_vs_lucidrains")):
                if medians.get(reference):
                    row[key] = medians[reference] / seconds
            if candidate.lambda_impl:
                row["useful_gflops"] = flops / seconds / 1e9
                if sgemm:
                    row["percent_of_sgemm"] = 100 * row["useful_gflops"] / sgemm
        rows.append(row)
    return {"height": height, "width": width, "channels": channels,
            "useful_flops_fwd_bwd": flops, "gemm_gflops": gemm,
            "auto_impl": resolved.resolve_impl((height, width), device_type), "rows": rows}


def _cell(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _markdown_table(title: str, header: List[str], rows: List[List[str]],
                    left: int = 1) -> str:
    """A titled markdown table: the first ``left`` columns and a last "note" left-aligned."""
    align = ["---" if i < left or name == "note" else "---:" for i, name in enumerate(header)]
    lines = [title, "", *("| " + " | ".join(cells) + " |" for cells in [header] + [align] + rows)]
    return "\n".join(lines)


def format_shape_table(name: str, shape: Dict[str, object]) -> str:
    gemm = ", ".join(f"{key} {value:.0f} GFLOP/s" for key, value in shape["gemm_gflops"].items())
    rows = []
    for row in shape["rows"]:
        mib = [None if row[key] is None else row[key] / 2**20
               for key in ("peak_bytes", "saved_bytes")]
        rows.append([row["name"], _cell(row["median_s"] and 1000 * row["median_s"], ".1f"),
                     _cell(row.get("speedup_vs_timm"), ".2f"),
                     _cell(row.get("speedup_vs_lucidrains"), ".2f"),
                     _cell(row.get("useful_gflops"), ".1f"),
                     _cell(row.get("percent_of_sgemm"), ".0f"),
                     _cell(mib[0], ".1f"), _cell(mib[1], ".1f"), row["note"]])
    return _markdown_table(
        f"### {name}: {shape['height']}x{shape['width']}x{shape['channels']} "
        f"(auto -> {shape['auto_impl']}; {gemm} in the same run)",
        ["implementation", "median ms", "x faster than timm", "x faster than lucidrains",
         "useful GFLOP/s", "% of sgemm", "peak MiB", "saved MiB", "note"], rows)


def format_machine(results: Dict[str, object]) -> str:
    machine = results["machine"]
    return "\n".join(f"- {key}: {value}" for key, value in machine.items())


def plot_layers(results: Dict[str, object], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shapes = list(results["shapes"])
    names = [row["name"] for row in results["shapes"][shapes[0]]["rows"]]
    figure, axes = plt.subplots(1, 2, figsize=(15, 5.5))
    bar = 0.8 / len(names)
    for index, name in enumerate(names):
        for axis, key, scale in ((axes[0], "median_s", 1000), (axes[1], "peak_bytes", 2**-20)):
            values = []
            for shape in shapes:
                row = next(r for r in results["shapes"][shape]["rows"] if r["name"] == name)
                values.append(row[key] * scale if row.get(key) else float("nan"))
            axis.bar([i + index * bar for i in range(len(shapes))], values, bar, label=name)
    for axis, label in ((axes[0], "forward + backward, median ms"), (axes[1], "peak MiB")):
        axis.set_yscale("log")
        axis.set_ylabel(label)
        axis.set_xticks([i + 0.4 - bar / 2 for i in range(len(shapes))])
        axis.set_xticklabels(shapes)
        axis.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(f"lambda layers, {results['device']} {results['dtype']}, batch "
                    f"{results['batch']} (missing bar: skipped or OOM, see results.md)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def benchmark_backbone(args, device: torch.device) -> Dict[str, object]:
    from lambda_det.modeling import lambda_resnet  # imports detectron2
    autocast = torch.bfloat16 if args.dtype == "bf16" else None
    torch.manual_seed(0)
    x = torch.randn(1, 3, args.image, args.image, device=device, requires_grad=False)
    models = {
        f"LambdaResNet-{args.depth} (paper placement, impl={args.impl})":
            lambda_resnet(args.depth, placement="paper", impl=args.impl),
        f"ResNet-RS-{args.depth} (placement=none)": lambda_resnet(args.depth, placement="none"),
    }
    candidates, steps = [], {}
    for name, model in models.items():
        candidate = Candidate(name, lambda: None)
        candidate.module = model.to(device).train()
        candidate.parameters = sum(p.numel() for p in model.parameters())
        steps[name] = Step(candidate.module, x, autocast)
        candidates.append(candidate)
    yardstick = gemm_candidate(device, torch.float32)
    steps[yardstick.name] = yardstick.run
    run_round_robin(candidates + [yardstick], steps, device, args.warmup, args.repetitions)
    rows = []
    for candidate in candidates:
        step = steps[candidate.name]
        memory = {} if candidate.error else {"peak": peak_bytes(step), "saved": saved_bytes(step)}
        flops = None
        try:
            from fvcore.nn import FlopCountAnalysis
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                analysis = FlopCountAnalysis(candidate.module.eval(), x)
                analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
                flops = analysis.total()
            candidate.module.train()
        except ImportError:
            pass
        rows.append({"name": candidate.name, "median_s": median(candidate.times),
                     "ratio_to_baseline": paired_ratio(candidate.times, candidates[-1].times),
                     "times_s": candidate.times, "note": candidate.error or "",
                     "parameters": candidate.parameters, "fvcore_flops": flops,
                     "peak_bytes": memory.get("peak"), "saved_bytes": memory.get("saved")})
    return {"mode": "backbone", "device": str(device), "dtype": args.dtype, "image": args.image,
            "batch": 1, "depth": args.depth, "repetitions": args.repetitions,
            "machine": machine_description(device),
            "gemm_gflops": {yardstick.name: yardstick.flops / median(yardstick.times) / 1e9},
            "rows": rows}


def block_kinds(depth: int, image: int) -> List[Dict[str, object]]:
    """The kinds of lambda block in LambdaResNet-<depth> (paper placement) at image x image, and
    how many of each it has: lambda blocks of c4, the strided first block of c5, the rest of c5."""
    from lambda_det.modeling.lambda_resnet import BLOCKS_PER_STAGE, PAPER_LAMBDA_BLOCKS_C4
    c4, c5 = image // 16, image // 32
    return [
        {"name": "c4 block", "count": len(PAPER_LAMBDA_BLOCKS_C4[depth]),
         "block": dict(in_channels=1024, out_channels=1024, width=256, stride=1),
         "input": (1, 1024, c4, c4)},
        {"name": "c5 first block (stride 2)", "count": 1,
         "block": dict(in_channels=1024, out_channels=2048, width=512, stride=2),
         "input": (1, 1024, c4, c4)},
        {"name": "c5 block", "count": BLOCKS_PER_STAGE[depth][3] - 1,
         "block": dict(in_channels=2048, out_channels=2048, width=512, stride=1),
         "input": (1, 2048, c5, c5)},
    ]


def benchmark_blocks(args, device: torch.device) -> Dict[str, object]:
    """Each kind of lambda block against the conv block it replaces, as in the backbone."""
    from lambda_det.modeling.blocks import Bottleneck  # imports detectron2
    from lambda_det.modeling.mixers import build_mixer_factory
    autocast = torch.bfloat16 if args.dtype == "bf16" else None
    rows = []
    for kind in block_kinds(args.depth, args.image):
        torch.manual_seed(0)
        x = torch.randn(kind["input"], device=device, requires_grad=True)
        candidates, steps = [], {}
        for mixer in ("lambda", "conv"):
            candidate = Candidate(f"{kind['name']}, {mixer}", lambda: None)
            options = {"impl": args.impl} if mixer == "lambda" else {}
            candidate.module = Bottleneck(**kind["block"],
                                          mixer=build_mixer_factory(mixer, **options))
            candidate.module.to(device).train()
            steps[candidate.name] = Step(candidate.module, x, autocast)
            candidates.append(candidate)
        run_round_robin(candidates, steps, device, args.warmup, args.repetitions)
        lambda_s, conv_s = (median(candidate.times) for candidate in candidates)
        rows.append({"name": kind["name"], "count": kind["count"],
                     "input": list(kind["input"]), "lambda_s": lambda_s, "conv_s": conv_s,
                     "ratio": paired_ratio(candidates[0].times, candidates[1].times),
                     "lambda_times_s": candidates[0].times, "conv_times_s": candidates[1].times})
    return {"mode": "blocks", "device": str(device), "dtype": args.dtype, "image": args.image,
            "depth": args.depth, "repetitions": args.repetitions,
            "machine": machine_description(device), "rows": rows}


def format_blocks(results: Dict[str, object]) -> str:
    rows = [[row["name"], "x".join(map(str, row["input"][1:])), str(row["count"]),
             f"{row['lambda_s'] * 1000:.1f}", f"{row['conv_s'] * 1000:.1f}", f"{row['ratio']:.3f}",
             f"{row['count'] * (row['lambda_s'] - row['conv_s']) * 1000:+.0f}"]
            for row in results["rows"]]
    return _markdown_table(
        f"### LambdaResNet-{results['depth']} lambda blocks vs conv blocks at "
        f"{results['image']}x{results['image']}, batch 1, forward + backward",
        ["block", "input", "in backbone", "lambda ms", "conv ms",
         "x conv time (per-round median)", "lambda - conv, all such blocks (ms)"], rows, left=2)


def format_backbone(results: Dict[str, object]) -> str:
    rows = [[row["name"], _cell(row["median_s"], ".2f"), _cell(row["ratio_to_baseline"], ".3f"),
             f"{row['parameters'] / 1e6:.1f}",
             _cell(row["fvcore_flops"] and row["fvcore_flops"] / 1e9, ".1f"),
             _cell(row["peak_bytes"] and row["peak_bytes"] / 2**20, ".0f"),
             _cell(row["saved_bytes"] and row["saved_bytes"] / 2**20, ".0f"), row["note"]]
            for row in results["rows"]]
    return _markdown_table(
        f"### Backbones at {results['image']}x{results['image']}, batch 1, forward + backward "
        f"(sgemm {results['gemm_gflops']['sgemm']:.0f} GFLOP/s in the same run)",
        ["backbone", "median s", "x baseline time (median of per-round ratios)", "params (M)",
         "fvcore GFLOPs (fwd)", "peak MiB", "saved MiB", "note"], rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="bf16 runs every forward under torch.autocast(bfloat16)")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--only", nargs="+", metavar="WORD",
                        help="time only the candidates whose name contains one of these words")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repetitions", type=int,
                        help="timed rounds (median); default 7 for layers, 5 for backbones")
    parser.add_argument("--warmup", type=int,
                        help="untimed rounds first; default 2 for layers, 1 for backbones")
    parser.add_argument("--memory-cap-gib", type=float, default=4.0,
                        help="skip candidates whose n x n tensors would need more than this")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--tile", type=int, nargs=2, metavar=("TH", "TW"),
                        help="query tile of the 'tiled' impl (default: its DEFAULT_TILE)")
    parser.add_argument("--compile", metavar="MODE", nargs="?", const="default",
                        help="wrap every module in torch.compile(mode=MODE) (e.g. reduce-overhead "
                             "for CUDA graphs); warm-up rounds then include the compilation")
    parser.add_argument("--backbone", action="store_true",
                        help="LambdaResNet vs its ResNet-RS baseline instead of single layers")
    parser.add_argument("--blocks", action="store_true",
                        help="each kind of lambda block of the backbone against its conv block")
    parser.add_argument("--depth", type=int, default=101)
    parser.add_argument("--image", type=int, default=1024)
    parser.add_argument("--impl", default="auto", help="lambda layer impl in backbone mode")
    parser.add_argument("--out", type=Path, help="output folder (default: a new "
                        "output/benchmark_lambda/<mode>_<device>_<dtype>_<date-time>)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no GPU")
    mode = "backbone" if args.backbone else "blocks" if args.blocks else "layer"
    stamp = time.strftime("%Y%m%d-%H%M%S")  # a rerun never overwrites an earlier run's results
    out = args.out or (ROOT / "output" / "benchmark_lambda"
                       / f"{mode}_{device.type}_{args.dtype}_{stamp}")
    out.mkdir(parents=True, exist_ok=True)

    if args.repetitions is None:
        args.repetitions = 5 if args.backbone else 7
    if args.warmup is None:
        args.warmup = 1 if args.backbone else 2
    if args.backbone:
        results = benchmark_backbone(args, device)
        tables = format_backbone(results)
    elif args.blocks:
        results = benchmark_blocks(args, device)
        tables = format_blocks(results)
    else:
        results = benchmark_layers(args, device)
        tables = "\n\n".join(format_shape_table(name, shape)
                             for name, shape in results["shapes"].items())
        plot_layers(results, out / "results.png")
    command = "python tools/benchmark_lambda.py " + " ".join(sys.argv[1:] if argv is None else argv)
    results["command"] = command
    markdown = (f"## {mode} benchmark, {device.type} {args.dtype}\n\n`{command}`\n\n"
                f"{format_machine(results)}\n\n{tables}\n")
    (out / "results.md").write_text(markdown)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(markdown)
    print(f"wrote {out}/results.md, results.json" + ("" if mode != "layer" else ", results.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
