"""Launching training processes: detectron2's ``launch`` on GPUs, gloo processes on the CPU.

Detectron2 0.6's ``launch`` asserts CUDA and uses NCCL as soon as there is more than one process.
The GPU path stays detectron2's own; this module adds the CPU path (same arguments, gloo backend,
detectron2's per-machine process group set up the same way), used for tests and small runs.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from detectron2.engine import launch as detectron2_launch
from detectron2.utils import comm

from lambda_det.compat.internals import set_local_process_group
from lambda_det.engine.interrupt import watching_launcher_signals
from lambda_det.utils.errors import UserError

__all__ = ["launch"]

DEFAULT_TIMEOUT = timedelta(minutes=30)


def launch(
    main_func,
    num_processes: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: str = None,
    args=(),
    cpu: bool = False,
    timeout=DEFAULT_TIMEOUT,
):
    """Run ``main_func(*args)`` in ``num_processes`` processes per machine.

    Args:
        cpu: use gloo CPU processes instead of detectron2's NCCL GPU launch.
        Others: as detectron2's ``launch`` (``dist_url`` "auto" picks a free local port).

    With several processes, a SIGINT or SIGTERM that this process gets reaches the workers
    (:func:`~lambda_det.engine.interrupt.watching_launcher_signals`).
    """
    world_size = num_processes * num_machines
    if world_size == 1:
        return main_func(*args)
    if cpu and dist_url in (None, "auto"):
        if num_machines != 1:
            raise UserError("dist_url='auto' only works on one machine; pass tcp://HOST:PORT")
        dist_url = f"tcp://127.0.0.1:{_free_port()}"
    with watching_launcher_signals(main_func) as main_func:
        if not cpu:
            return detectron2_launch(
                main_func,
                num_processes,
                num_machines=num_machines,
                machine_rank=machine_rank,
                dist_url=dist_url,
                args=args,
                timeout=timeout,
            )
        mp.spawn(
            _cpu_worker,
            nprocs=num_processes,
            daemon=False,
            args=(
                main_func,
                world_size,
                num_processes,
                num_machines,
                machine_rank,
                dist_url,
                args,
                timeout,
            ),
        )


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cpu_worker(
    local_rank,
    main_func,
    world_size,
    num_processes,
    num_machines,
    machine_rank,
    dist_url,
    args,
    timeout,
):
    # Processes share the machine's cores; more threads than cores only thrashes.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, (cores or 1) // num_processes))
    global_rank = machine_rank * num_processes + local_rank
    dist.init_process_group(
        backend="gloo",
        init_method=dist_url,
        world_size=world_size,
        rank=global_rank,
        timeout=timeout,
    )
    set_local_process_group(num_processes)  # detectron2's comm.get_local_rank() needs it
    comm.synchronize()
    try:
        main_func(*args)
    finally:
        dist.destroy_process_group()
