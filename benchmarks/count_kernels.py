"""Count the kernels one forward + backward of a lambda layer launches, as a GPU would run it.

    python tools/count_kernels.py                 # c4 of a 1024 input: 2 x 256 x 64 x 64
    python tools/count_kernels.py --size 32 --channels 512 --stride 2 --verbose

On a GPU these layers are bound by kernel launches at detection sizes (docs/benchmarks.md), so
the count predicts their eager time floor. It is taken on the CPU: every aten op that the
dispatcher runs is recorded, except views and allocations (no kernel), with lambda_det's GPU
tuning applied (its chunks, and halo gradients folded by unfold_backward). The loss is
not counted and gradients start from None, as in a training step after ``zero_grad()``.
"""

import argparse
import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.candidates import DIM_K, HEADS, SCOPE
from lambda_det.layers import IMPLEMENTATIONS, LambdaLayer, TiledTuning

# lambda_det's GPU tuning of the tiled form (its chunks, and halo gradients folded by
# unfold_backward), run on the CPU.
GPU_TUNING = TiledTuning.for_device("cuda")

# Aten ops that launch no kernel: views, and allocations (the caching allocator, no memset).
NO_KERNEL = {
    "view",
    "_unsafe_view",
    "reshape",
    "_reshape_alias",
    "permute",
    "transpose",
    "t",
    "expand",
    "unfold",
    "slice",
    "select",
    "split",
    "split_with_sizes",
    "narrow",
    "as_strided",
    "unsqueeze",
    "squeeze",
    "alias",
    "detach",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "promote_types",
}


class KernelRecorder(TorchDispatchMode):
    """Records the name of every kernel-launching aten op dispatched while active."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL:
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def count_kernels(layer: torch.nn.Module, x: torch.Tensor):
    """(forward kernels, backward kernels, Counter of op names) of one training step's layer."""
    output = layer(x)  # warm-up: caches (the tiled form's embedding index) are built once
    grad = torch.ones_like(output)
    output.backward(grad)
    layer.zero_grad(set_to_none=True)
    x.grad = None
    with KernelRecorder() as recorder:
        output = layer(x)
        forward = len(recorder.names)
        output.backward(grad)
    return forward, len(recorder.names) - forward, collections.Counter(recorder.names)


def candidates(channels: int, stride: int):
    for impl in IMPLEMENTATIONS:
        if impl != "einsum":  # the einsum form's n x n embeddings: not a detection-size option
            yield (
                f"lambda_det {impl}",
                LambdaLayer(channels, impl=impl, stride=stride, tuning=GPU_TUNING),
            )
    try:
        from timm.layers.lambda_layer import LambdaLayer as TimmLambdaLayer
    except ImportError:
        return
    yield (
        "timm LambdaLayer",
        TimmLambdaLayer(
            channels, channels, stride=stride, num_heads=HEADS, dim_head=DIM_K, r=SCOPE
        ),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=64, help="H = W of the input map")
    parser.add_argument("--channels", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--stride", type=int, choices=(1, 2), default=1)
    parser.add_argument("--verbose", action="store_true", help="also list the ops")
    args = parser.parse_args(argv)
    print(
        f"| layer ({args.batch} x {args.channels} x {args.size} x {args.size}, stride "
        f"{args.stride}) | forward | backward | total |\n|---|---:|---:|---:|"
    )
    for name, layer in candidates(args.channels, args.stride):
        x = torch.randn(args.batch, args.channels, args.size, args.size, requires_grad=True)
        forward, backward, names = count_kernels(layer, x)
        print(f"| {name} | {forward} | {backward} | {forward + backward} |")
        if args.verbose:
            print("|", ", ".join(f"{op} {count}" for op, count in names.most_common()), "| | | |")
    return 0
