"""Memory of one training step: its peak, and what autograd saves for backward."""

from typing import Dict

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from benchmarks.harness import Step, free_memory, synchronize


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
        output = step.forward()
    del output
    return sum(storages.values())


def peak_bytes(step: Step) -> int:
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
