"""Memory of one training step: its peak, and what autograd saves for backward."""

from typing import Callable, Dict, Iterable

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from benchmarks.harness import Step, free_memory, synchronize


def saved_storage_bytes(forward: Callable[[], object], excluded: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages autograd keeps for backward while ``forward()`` runs, but for the
    storages of ``excluded`` (parameters, inputs)."""
    skipped = {tensor.untyped_storage().data_ptr() for tensor in excluded}
    storages: Dict[int, int] = {}

    def pack(tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skipped:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = forward()
    del output
    return sum(storages.values())


def saved_bytes(step: Step) -> int:
    """Bytes of the storages autograd keeps for backward (parameters and the input excluded)."""
    step.x.grad = None
    return saved_storage_bytes(step.forward, [*step.module.parameters(), step.x])


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
