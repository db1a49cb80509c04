"""Timing: candidates, one training step of a module, the round robin, the machine's description."""

import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
from torch import nn


@dataclass
class Candidate:
    """One module to time, and what the run found out about it."""

    name: str
    build: Callable[[], nn.Module]
    skip: Optional[str] = None  # why it is not run (e.g. too large for the memory cap)
    lambda_impl: bool = False  # a lambda layer: credited with the useful FLOPs
    module: Optional[nn.Module] = None  # built, while it is being measured
    times: List[float] = field(default_factory=list)  # seconds per timed round
    error: Optional[str] = None  # e.g. "OOM": no more rounds
    memory: Dict[str, Optional[int]] = field(default_factory=dict)  # "peak", "saved" bytes


@dataclass
class Yardstick:
    """A square GEMM timed in the same round robin: how fast the machine ran during the run."""

    name: str
    flops: int
    run: Callable[[], object]
    times: List[float] = field(default_factory=list)
    error: Optional[str] = None


Timed = Union[Candidate, Yardstick]


@dataclass
class Step:
    """Forward + backward of a module on a fixed input and output gradient."""

    module: nn.Module
    x: torch.Tensor
    autocast: Optional[torch.dtype]  # forward under torch.autocast(this dtype), or None
    grad: Optional[torch.Tensor] = None  # the output gradient, drawn on the first call

    def forward(self) -> torch.Tensor:
        with torch.autocast(
            self.x.device.type,
            dtype=self.autocast or torch.float32,
            enabled=self.autocast is not None,
        ):
            return self.module(self.x)

    def __call__(self) -> None:
        self.x.grad = None
        for parameter in self.module.parameters():
            parameter.grad = None
        output = self.forward()
        if isinstance(output, dict):
            output = torch.stack([value.float().sum() for value in output.values()]).sum()
        if self.grad is None or self.grad.shape != output.shape:
            generator = torch.Generator(device=output.device).manual_seed(0)
            self.grad = torch.randn(
                output.shape, generator=generator, device=output.device, dtype=output.dtype
            )
        output.backward(self.grad)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def is_out_of_memory(error: BaseException) -> bool:
    return (
        isinstance(error, MemoryError)
        or "out of memory" in str(error).lower()
        or "can't allocate memory" in str(error).lower()
        or "not enough memory" in str(error).lower()
    )


def gemm_yardstick(device: torch.device, dtype: torch.dtype) -> Yardstick:
    size = 2048 if device.type == "cpu" else 8192
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    return Yardstick(
        "sgemm" if dtype == torch.float32 else "bf16 gemm", 2 * size**3, lambda: torch.mm(a, b)
    )


def run_round_robin(
    timed: Sequence[Timed],
    steps: Dict[str, Callable[[], None]],
    device: torch.device,
    warmup: int,
    repetitions: int,
) -> None:
    """Runs ``steps[name]`` of each of ``timed`` once per round, the first one rotating, and
    appends the timed rounds' seconds to its ``times``. An out-of-memory error ends a
    candidate's rounds (its ``error`` says so); other errors propagate."""
    live = [item for item in timed if item.name in steps]
    for repetition in range(warmup + repetitions):
        start = repetition % max(1, len(live))
        for item in live[start:] + live[:start]:
            if item.error:
                continue
            try:
                synchronize(device)
                began = time.perf_counter()
                steps[item.name]()
                synchronize(device)
                elapsed = time.perf_counter() - began
            except (RuntimeError, MemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                item.error = "OOM"
                free_memory(device)
                continue
            if repetition >= warmup:
                item.times.append(elapsed)


def median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def paired_ratio(times: List[float], baseline_times: List[float]) -> Optional[float]:
    """Median over rounds of time / baseline time in the same round.

    The machine's speed drifts between rounds; a ratio within a round cancels most of it.
    """
    ratios = [mine / theirs for mine, theirs in zip(times, baseline_times)]
    return median(ratios) if ratios else None


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
            if key.strip() in (
                "Model name",
                "CPU family",
                "Model",
                "CPU(s)",
                "Thread(s) per core",
                "Core(s) per socket",
                "L3 cache",
            ):
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
