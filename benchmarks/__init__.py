"""lambda_det's benchmarks: a part of the checkout beside the package, not installed with it
(``pip install`` ships ``lambda_det`` alone). The tools put the checkout on ``sys.path`` and run
the commands' ``main(argv)``: :mod:`.lambda_layer` (``tools/benchmark_lambda.py``),
:mod:`.detector_step` (``tools/benchmark_detector.py``) and :mod:`.count_kernels`
(``tools/count_kernels.py``); docs/benchmarks.md holds the measurements.

Lambda layer speed and memory, side by side in one process (``tools/benchmark_lambda.py``):

Three modes (:mod:`benchmarks.modes`):

* layers: forward + backward of one layer in train mode (batch statistics in BN, the gradient of
  the input and of every parameter) on the feature maps of :data:`~.candidates.SHAPES`: every
  lambda_det implementation, timm's and lucidrains' lambda layers, the 3x3 conv a lambda layer
  replaces, global multi-head self-attention, and the Attention Free Transformer's mixers
  (:mod:`~benchmarks.candidates`). Layer sizes are
  :class:`~lambda_det.layers.LambdaLayer`'s defaults (h=4, k=16, u=1, scope 23; r=23 for timm
  and lucidrains).
* backbone: LambdaResNet (the paper's placement) against placement="none" (its ResNet-RS
  baseline), batch 1, train mode: forward + backward time of the sum of res2..res5, memory as
  below, parameters, and forward FLOPs counted by fvcore (one fused multiply-add = one FLOP,
  fvcore's convention) as the model runs.
* blocks: the three kinds of lambda block in that backbone (c4, the strided first block of c5,
  the other c5 blocks; whole bottlenecks, batch 1, train mode) each against the conv block it
  replaces, with the median per-round ratio and what the difference adds up to over the
  backbone's blocks of that kind.

Timing (:mod:`~benchmarks.harness`): every repetition runs each candidate once, round
robin with the starting candidate rotated, so all of them see the same machine load; the tables
quote medians, and ratios of medians from the same run (or medians of per-round ratios). A square
GEMM ("sgemm", fp32) is timed in the same round robin as the machine's yardstick.

Memory (:mod:`~benchmarks.memory`), measured once per candidate after the timing:

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
such, when that matrix and its gradient would exceed the memory cap); "sdpa" is PyTorch's fused
scaled_dot_product_attention. lambda_det's "einsum" impl materialises k x u x n x n relative
embeddings and is skipped by the same cap.

Reports (:mod:`~benchmarks.report`): markdown tables, and a plot of the layer mode.
Only the backbone and blocks modes need detectron2; timm and lambda-networks are imported only
when their candidates are built. :mod:`~benchmarks.detector` (tools/benchmark_detector.py)
times whole detectors' training steps with lambda_det's trainer.
"""
