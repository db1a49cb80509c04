"""Fast position lambdas: the lambda convolution (or global position term) as tiled GEMMs.

The position term of a lambda layer (paper Sec. 3.2, 4) is, for every query position n,

    y_pos[n, h] = sum_{delta in window} (q[n, h] . R[delta]) V[n + delta]          (v,)

with the (k, u) embedding ``R[delta]`` contracted with the query first (the paper's position
lambdas ``lambda_p_n = sum_m E[n, m] V[m]``, Sec. 3.2, are linear in E, so the order of
contraction is free). That costs h (k + v) r^2 multiply-adds per position instead of k v r^2 for
the paper's order (conv of V with R, then the queries): a third at h=4, k=16, v=64. It never
materialises the (b, n, k, v) position lambdas.

Translation equivariance makes it two GEMMs. Cut the queries into tiles of t_1 x t_2 positions;
a tile's queries see a halo of (t_1 + 2 rho_1) x (t_2 + 2 rho_2) context positions, and every tile
sees its halo through the same block of relative embeddings

    E_tile[k, q, c] = R[k, pos(c) - pos(q)]   (zero where the offset is out of scope)

so, with T = t_1 t_2 query slots and C = u (t_1 + 2 rho_1)(t_2 + 2 rho_2) halo entries,

    logits[h, q, tile, c] = sum_k Q[h, q, tile, k] E_tile[k, q, c]   bmm over (h, q), K = k
    y_pos[tile, (h, q), :] = sum_c logits[(h, q), c] V_halo[tile, c, :]  bmm over tiles, K = C

(the second GEMM reads the logits through a strided view, all heads sharing one halo). The dense
halo makes a tile do C / (u r^2) times the useful work: 1.28 for the default 4 x 4 tiles at
r = 23 (8 x 8: 1.70); smaller tiles waste less but copy more halo. Border tiles are zero padded,
which is exactly the convolution's zero padding. The same code serves global context (rho =
size - 1) and 1-D sequences.

A strided lambda layer (stride 2: the layer at stride 1, then a 3-wide average pool with stride
2) pools inside the tiles: a tile of pooled outputs takes the 3^dims stride-1 queries that each
output averages as one query of depth 3^dims k, against a halo of 2 t + 1 + 2 rho per axis read
with step 2 t (``stride=2`` of :func:`tiled_position_output`).

Memory: backward keeps only the inputs (queries, the padded values, E_tile and its index); the
logits and halos are rebuilt chunk by chunk in backward (one GEMM of K = k, a quarter of the
work), so the extra memory is one chunk's logits and halos whatever the input size, and the
saved activations are about the size of the layer's q and V. Chunks write into buffers reused
across chunks: on the CPU, fresh multi-MiB tensors per GEMM cost more than the GEMMs.

Numerics: plain fp32 (or fp64) GEMMs, no TF32 unless ``torch.backends.cuda.matmul.allow_tf32``
is set; the caller (:class:`~lambda_det.layers.LambdaLayer`) runs it outside autocast.
"""

import functools
import itertools
import math
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from lambda_det.layers._checks import check_choice, check_int
from lambda_det.layers._tracing import static_sizes

__all__ = [
    "tiled_position_output",
    "TiledTuning",
    "tiled_halo_entries",
    "tile_shape",
    "DEFAULT_TILE",
    "POOLED_TILE",
    "CPU_CHUNK_ELEMENTS",
    "GPU_CHUNK_ELEMENTS",
    "pooled_size",
]

# Query tiles per number of spatial axes (docs/benchmarks.md: the fastest at the detection
# shapes, on the CPU and on a GPU alike).
DEFAULT_TILE = {1: (16,), 2: (4, 4)}
# Output tiles when the tiles also average-pool (stride 2); each reads a (2 t + 1 + 2 rho) halo.
POOLED_TILE = {1: (8,), 2: (2, 2)}
# The largest logits block (floats) computed at once. Small CPU chunks stay in cache and bound the
# extra memory; a GPU (any device but the CPU) takes large ones: fewer kernel launches.
CPU_CHUNK_ELEMENTS = 1 << 20
GPU_CHUNK_ELEMENTS = 1 << 28


@dataclass(frozen=True)
class TiledTuning:
    """How the tiled form cuts its work. Any tuning computes the same function (up to rounding).

    Attributes:
        tile: query tile per axis at stride 1; () for :data:`DEFAULT_TILE`.
        pooled_tile: output tile per axis at stride 2 (the tiles pool); () for
            :data:`POOLED_TILE`.
        chunk_elements: the most logits floats computed at once; 0 for the device's default
            (:data:`CPU_CHUNK_ELEMENTS` on the CPU, else :data:`GPU_CHUNK_ELEMENTS`).
        fold_in_groups: how backward adds the halo gradients onto the grid: in groups of
            disjoint halos (True; on the CPU several times faster than the alternative) or with
            unfold_backward (False; fewer kernel launches on a GPU). None: True on the CPU only.
            Never in groups under torch.compile (see :func:`_add_halos`).
    """

    tile: Tuple[int, ...] = ()
    pooled_tile: Tuple[int, ...] = ()
    chunk_elements: int = 0
    fold_in_groups: Optional[bool] = None

    @classmethod
    def for_device(cls, device_type: str) -> "TiledTuning":
        """The defaults for ``device_type`` ("cpu", "cuda", ...) whatever device the tensors are
        on: e.g. ``for_device("cuda")`` runs the GPU's chunks and halo folding on the CPU."""
        on_cpu = device_type == "cpu"
        return cls(
            chunk_elements=CPU_CHUNK_ELEMENTS if on_cpu else GPU_CHUNK_ELEMENTS,
            fold_in_groups=on_cpu,
        )

    def output_tile(self, dims: int, stride: int) -> Tuple[int, ...]:
        """The tile to cut the outputs into at this stride (before clipping to the input)."""
        if stride == 1:
            return self.tile or DEFAULT_TILE[dims]
        return self.pooled_tile or POOLED_TILE[dims]

    def chunk_elements_on(self, device: torch.device) -> int:
        if self.chunk_elements:
            return self.chunk_elements
        return CPU_CHUNK_ELEMENTS if device.type == "cpu" else GPU_CHUNK_ELEMENTS

    def fold_in_groups_on(self, device: torch.device) -> bool:
        return device.type == "cpu" if self.fold_in_groups is None else self.fold_in_groups


def tile_shape(spatial: Sequence[int], tile: Sequence[int]) -> Tuple[int, ...]:
    """The tile actually used: ``tile`` clipped to the input size on each axis."""
    return tuple(min(t, size) for t, size in zip(tile, spatial))


def tiled_halo_entries(
    spatial: Sequence[int], radii: Sequence[int], dim_u: int, tile: Sequence[int] = ()
) -> int:
    """C: the halo entries per tile that the tiled form works with on such an input at stride 1
    (``tile``: the query tile, () for :data:`DEFAULT_TILE`)."""
    tile = tile_shape(spatial, tile or DEFAULT_TILE[len(spatial)])
    return dim_u * math.prod([t + 2 * radius for t, radius in zip(tile, radii)])


def _embedding_index(
    tile: Tuple[int, ...], widths: Tuple[int, ...], dim_u: int, stride: int, device: torch.device
) -> torch.Tensor:
    """Where each (query slot, halo entry, pooled neighbour) reads its embedding in the flat table.

    The table is the window with one zero entry appended per u (see :func:`_embedding_block`);
    out-of-scope triples read that zero. With stride 1 a slot is one query (J = 1 neighbour); with
    stride 2 a slot is one pooled output and its J = 3^dims neighbours are the stride-1 queries
    it averages (see :func:`tiled_position_output`).

    Returns:
        (T, C, J) int64, C = u * prod(halo) (u outermost, halo positions row-major), neighbours
        row-major.
    """
    reach = 2 * stride - 1  # neighbours per axis that a slot averages: 1, or 3 at stride 2
    halos = [stride * (t - 1) + reach - 1 + w for t, w in zip(tile, widths)]
    slot_grid = torch.meshgrid(*[torch.arange(t, device=device) for t in tile], indexing="ij")
    halo_grid = torch.meshgrid(*[torch.arange(c, device=device) for c in halos], indexing="ij")
    neighbour_grid = torch.meshgrid(
        *[torch.arange(reach, device=device) for _ in tile], indexing="ij"
    )
    # Offset of halo entry c from the query (slot q, neighbour j), shifted to index the window.
    flat_index = torch.zeros(1, 1, 1, dtype=torch.long, device=device)  # T C' J
    in_scope = torch.ones(1, 1, 1, dtype=torch.bool, device=device)  # T C' J
    for axis, width in enumerate(widths):
        query = stride * slot_grid[axis].reshape(-1, 1, 1) + neighbour_grid[axis].reshape(
            1, 1, -1
        )  # T 1 J, in halo coordinates - rho
        shift = halo_grid[axis].reshape(1, -1, 1) - query  # T C' J
        in_scope = in_scope & (shift >= 0) & (shift < width)
        flat_index = flat_index * width + shift
    positions = math.prod(widths)
    flat_index = torch.where(in_scope, flat_index, torch.full_like(flat_index, positions))
    per_u = torch.arange(dim_u, device=device).reshape(dim_u, 1, 1, 1) * (positions + 1)
    slots, neighbours = flat_index.shape[0], flat_index.shape[2]
    return (per_u + flat_index).permute(1, 0, 2, 3).reshape(slots, -1, neighbours)  # T C J


@functools.lru_cache(maxsize=32)
def _cached_embedding_index(
    tile: Tuple[int, ...], widths: Tuple[int, ...], dim_u: int, stride: int, device: torch.device
) -> torch.Tensor:
    """:func:`_embedding_index`, built once per geometry (a normal tensor even when first
    asked for under inference_mode, so that a later training step can save it)."""
    with torch.inference_mode(False):
        return _embedding_index(tile, widths, dim_u, stride, device)


def _embedding_block(window: torch.Tensor, index: torch.Tensor, heads: int) -> torch.Tensor:
    """E_tile: every (query slot, halo entry) pair's embeddings, zero beyond the scope.

    Args:
        window: (k, u, 2 rho_1 + 1, ...) the embeddings of the offsets in scope.
        index: (T, C, J) from :func:`_embedding_index`.
        heads: h; the block is repeated for each head, so that one GEMM serves all heads.

    Returns:
        (h T, k J, C), T = query slots, C = halo entries, J = pooled neighbours (1 at stride 1);
        a view of a contiguous (h T, C, k J) tensor.
    """
    dim_k, dim_u = window.shape[:2]
    # One zero entry per u after the window entries: out-of-scope pairs read it.
    table = F.pad(window.reshape(dim_k, dim_u, -1), (0, 1))  # k u (positions + 1)
    block = table.reshape(dim_k, -1).t()[index.repeat(heads, 1, 1)]  # (h T) C J k
    return block.transpose(2, 3).flatten(2).transpose(1, 2)  # (h T) (k J) C


def _embedding_block_backward(
    grad_block: torch.Tensor, index: torch.Tensor, window_shape: Sequence[int]
) -> torch.Tensor:
    """Adjoint of :func:`_embedding_block` (index_add, many times faster than index_put).

    Args:
        grad_block: (h T, k J, C).

    Returns:
        (k, u, 2 rho_1 + 1, ...).
    """
    dim_k, dim_u = window_shape[:2]
    slots, entries, neighbours = index.shape
    per_slot = grad_block.view(-1, slots, dim_k, neighbours, entries).sum(0)  # T k J C
    grad_table = grad_block.new_zeros(dim_k, dim_u * (math.prod(window_shape[2:]) + 1))
    grad_table.index_add_(
        1, index.reshape(-1), per_slot.permute(1, 0, 3, 2).reshape(dim_k, -1)
    )  # k (T C J)
    return grad_table.view(dim_k, dim_u, -1)[:, :, :-1].reshape(window_shape)  # k u ..


class _Chunk(NamedTuple):
    """Some tiles: whole images (all tile rows), or a run of tile rows of one image."""

    images: slice
    rows: slice  # tile rows along the first spatial axis


class _Geometry(NamedTuple):
    """Sizes of one call, as Python ints (a trace or a compiled graph sees constants)."""

    batch: int
    heads: int
    dim_u: int
    tile: Tuple[int, ...]  # t per axis
    halo: Tuple[int, ...]  # t + 2 rho per axis (stride 2: 2 t + 1 + 2 rho)
    step: Tuple[int, ...]  # from one tile's halo to the next: t (stride 2: 2 t)
    counts: Tuple[int, ...]  # tiles per axis
    chunk_elements: int  # the largest logits block computed at once (floats)
    fold_in_groups: bool  # how backward adds halo gradients (TiledTuning.fold_in_groups)

    @property
    def slots(self) -> int:
        """T: queries per tile."""
        return math.prod(self.tile)

    @property
    def halo_entries(self) -> int:
        """C: u times the halo positions."""
        return self.dim_u * math.prod(self.halo)

    @property
    def tiles_per_row(self) -> int:
        return math.prod(self.counts[1:])

    def chunks(self) -> List[_Chunk]:
        """Chunks of tiles whose logits block (h x T x tiles x C) stays within chunk_elements."""
        row_elements = self.heads * self.slots * self.tiles_per_row * self.halo_entries
        rows = max(1, self.chunk_elements // row_elements)
        if rows >= self.counts[0]:
            images = rows // self.counts[0]
            return [
                _Chunk(slice(first, min(first + images, self.batch)), slice(0, self.counts[0]))
                for first in range(0, self.batch, images)
            ]
        return [
            _Chunk(slice(image, image + 1), slice(first, min(first + rows, self.counts[0])))
            for image in range(self.batch)
            for first in range(0, self.counts[0], rows)
        ]

    def tiles(self, chunk: _Chunk) -> slice:
        """The chunk's tiles within each of its images (row-major tile index)."""
        return slice(chunk.rows.start * self.tiles_per_row, chunk.rows.stop * self.tiles_per_row)

    def size(self, chunk: _Chunk) -> int:
        """How many tiles the chunk holds, over all its images."""
        images, rows = chunk
        return (images.stop - images.start) * (rows.stop - rows.start) * self.tiles_per_row

    def chunk_counts(self, chunk: _Chunk) -> List[int]:
        """Tiles per axis within each of the chunk's images."""
        return [chunk.rows.stop - chunk.rows.start] + list(self.counts[1:])

    def largest_chunk(self) -> int:
        return max(self.size(chunk) for chunk in self.chunks())

    def padded_rows(self, rows: slice) -> slice:
        """The rows of the padded grid that the halos of these tile rows cover."""
        first = self.step[0] * rows.start
        return slice(first, first + self.step[0] * (rows.stop - rows.start - 1) + self.halo[0])


def _halos(
    padded_values: torch.Tensor,
    geometry: _Geometry,
    chunk: _Chunk,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The halos of a chunk's tiles, as GEMM operands.

    Args:
        padded_values: (b, u, P_1 + 2 rho_1, ..., v), zero padded.
        out: a (tiles, C, v) buffer to fill instead of a new tensor.

    Returns:
        (tiles, C, v): tiles image-major then row-major, C = (u, halo positions row-major).
    """
    dims = len(geometry.tile)
    values = padded_values[chunk.images, :, geometry.padded_rows(chunk.rows)]  # i u rows .. v
    if torch.jit.is_tracing():
        return _halos_by_gather(values, geometry, chunk)  # tiles C v
    for axis, (step, c) in enumerate(zip(geometry.step, geometry.halo)):
        values = values.unfold(2 + axis, c, step)  # a view: i u n_1 .. v c_1 ..
    order = (
        (0,) + tuple(range(2, 2 + dims)) + (1,) + tuple(range(3 + dims, 3 + 2 * dims)) + (2 + dims,)
    )
    values = values.permute(order)  # i n_1 .. u c_1 .. v
    if out is None:
        return values.reshape(-1, geometry.halo_entries, values.shape[-1])  # tiles C v
    out.view(values.shape).copy_(values)
    return out


def _halos_by_gather(values: torch.Tensor, geometry: _Geometry, chunk: _Chunk) -> torch.Tensor:
    """:func:`_halos` as one gather, for traces: ONNX cannot export unfold on traced sizes.

    Args:
        values: (i, u, rows, P_2 + 2 rho_2, .., v), the padded rows the chunk's halos cover.

    Returns:
        (tiles, C, v).
    """
    step, halo = geometry.step, geometry.halo
    counts = geometry.chunk_counts(chunk)
    extents = [(n - 1) * s + c for n, s, c in zip(counts, step, halo)]  # rows, P_2 + 2 rho_2 ..
    images, dim_v = chunk.images.stop - chunk.images.start, static_sizes(values)[-1]
    # Flat position in the padded rows of halo entry c of tile n, row-major over both.
    position = torch.zeros(1, 1, dtype=torch.long, device=values.device)  # N C'
    for n, s, c, extent in zip(counts, step, halo, extents):
        along = torch.arange(n, device=values.device).reshape(-1, 1) * s + torch.arange(
            c, device=values.device
        ).reshape(1, -1)  # n c
        position = (
            (position.unsqueeze(1).unsqueeze(3) * extent + along.unsqueeze(0).unsqueeze(2))
            .flatten(2, 3)
            .flatten(0, 1)
        )  # N C'
    flat = values.reshape(images, geometry.dim_u, math.prod(extents), dim_v)  # i u P v
    gathered = flat[:, :, position]  # i u N C' v
    return gathered.permute(0, 2, 1, 3, 4).reshape(-1, geometry.halo_entries, dim_v)  # tiles C v


def _add_halos(
    grad_halos: torch.Tensor, grad_values: torch.Tensor, geometry: _Geometry, chunk: _Chunk
) -> None:
    """Adjoint of :func:`_halos`: adds each tile's halo gradient onto the padded grid, in place.

    In groups of disjoint halos if ``geometry.fold_in_groups``, except under torch.compile: its
    functionalization writes an in-place add into an unfold view back as if the windows covered
    the whole grid (zeros elsewhere), which loses the gradient between windows (torch 2.14;
    tests/layers/test_lambda_conv.py compiles a backward). Otherwise with unfold_backward.

    Args:
        grad_halos: (tiles, C, v), as :func:`_halos` returns for this chunk.
        grad_values: (b, u, P_1 + 2 rho_1, ..., v), accumulated into.
    """
    dims, step, halo = len(geometry.tile), geometry.step, geometry.halo
    region = grad_values[chunk.images, :, geometry.padded_rows(chunk.rows)]  # i u rows .. v
    images, extents = region.shape[0], list(region.shape[2:-1])
    counts = geometry.chunk_counts(chunk)
    grad = grad_halos.view(images, *counts, geometry.dim_u, *halo, grad_halos.shape[-1])
    order = (
        (0, 1 + dims)
        + tuple(range(1, 1 + dims))
        + (2 + 2 * dims,)
        + tuple(range(2 + dims, 2 + 2 * dims))
    )
    grad = grad.permute(order)  # i u n.. v c..
    if geometry.fold_in_groups and not torch.compiler.is_compiling():
        # Tiles `spacing` apart on every axis have disjoint halos, so a strided window view of
        # the grid takes all of them in one add: at most spacing^dims adds (7 x 7 at r = 23).
        spacing = [-(-c // s) for c, s in zip(halo, step)]
        for offsets in itertools.product(*[range(min(g, n)) for g, n in zip(spacing, counts)]):
            target = region
            for axis, (o, g, s, c) in enumerate(zip(offsets, spacing, step, halo)):
                target = target.narrow(2 + axis, o * s, extents[axis] - o * s)
                target = target.unfold(2 + axis, c, g * s)  # disjoint windows: i u m.. v c..
            sources = (slice(None), slice(None)) + tuple(
                slice(o, None, g) for o, g in zip(offsets, spacing)
            )
            target += grad[sources]
        return
    for axis in reversed(range(dims)):
        # The shape before this axis was unfolded: earlier axes unfolded, later ones not yet.
        sizes = (
            [images, geometry.dim_u]
            + counts[:axis]
            + extents[axis:]
            + [grad_halos.shape[-1]]
            + list(halo[:axis])
        )
        grad = torch.ops.aten.unfold_backward(grad, sizes, 2 + axis, halo[axis], step[axis])
    region += grad  # i u rows .. v


def _chunk_queries(queries: torch.Tensor, geometry: _Geometry, chunk: _Chunk) -> torch.Tensor:
    """(h T, tiles, k): a chunk's queries, all heads (a view)."""
    count = geometry.size(chunk)
    return queries[:, :, chunk.images, geometry.tiles(chunk)].reshape(-1, count, queries.shape[-1])


def _tiled_forward(
    queries: torch.Tensor, block: torch.Tensor, padded_values: torch.Tensor, geometry: _Geometry
) -> torch.Tensor:
    """y_pos chunk by chunk, with plain differentiable ops (autograd keeps every logits block).

    Args:
        queries: (h, T, b, N, k): head, query slot, batch, tile, depth (k J when the tiles
            pool, J neighbours per slot; k stands for it everywhere below).
        block: (h T, k, C) from :func:`_embedding_block`.
        padded_values: (b, u, P_1 + 2 rho_1, ..., v), P = tiles x tile size along each axis.

    Returns:
        (b, N, h, T, v).
    """
    heads, slots, batch, num_tiles = queries.shape[:4]
    outputs = []
    for chunk in geometry.chunks():
        halos = _halos(padded_values, geometry, chunk)  # n C v
        logits = torch.bmm(_chunk_queries(queries, geometry, chunk), block)  # (h T) n C
        logits = logits.transpose(0, 1)  # n (h T) C
        outputs.append(torch.bmm(logits, halos))  # n (h T) v
    return torch.cat(outputs).reshape(batch, num_tiles, heads, slots, -1)  # b N h T v


def _tiled_forward_in_place(
    queries: torch.Tensor, block: torch.Tensor, padded_values: torch.Tensor, geometry: _Geometry
) -> torch.Tensor:
    """:func:`_tiled_forward` writing into buffers that every chunk reuses (not differentiable).

    A fresh multi-MiB tensor per GEMM costs more than the GEMM itself on the CPU (large blocks
    go back to the OS when freed, and touching new pages is slow), hence the reuse.
    """
    heads, slots, batch, num_tiles = queries.shape[:4]
    dim_v, entries, most = padded_values.shape[-1], geometry.halo_entries, geometry.largest_chunk()
    output = queries.new_empty(batch, num_tiles, heads, slots, dim_v)  # b N h T v
    halo_buffer = queries.new_empty(most * entries * dim_v)
    logits_buffer = queries.new_empty(heads * slots * most * entries)
    for chunk in geometry.chunks():
        count = geometry.size(chunk)
        halos = _halos(
            padded_values,
            geometry,
            chunk,
            out=halo_buffer[: count * entries * dim_v].view(count, entries, dim_v),
        )
        logits = logits_buffer[: heads * slots * count * entries].view(
            heads * slots, count, entries
        )  # (h T) n C
        torch.bmm(_chunk_queries(queries, geometry, chunk), block, out=logits)
        # All heads share the halo: one GEMM per tile with h T rows (a strided view, no copy).
        torch.bmm(
            logits.transpose(0, 1),
            halos,
            out=output[chunk.images, geometry.tiles(chunk)].view(count, heads * slots, dim_v),
        )  # n (h T) v
    return output


def _tiled_backward(
    grad_output: torch.Tensor,
    queries: torch.Tensor,
    block: torch.Tensor,
    padded_values: torch.Tensor,
    geometry: _Geometry,
    needs_grad: Sequence[bool],
) -> Tuple[Optional[torch.Tensor], ...]:
    """Gradients of :func:`_tiled_forward`, rebuilding each chunk's logits and halos.

    Args:
        grad_output: (b, N, h, T, v).
        needs_grad: whether queries, block and padded_values need a gradient.

    Returns:
        Gradients of queries (h, T, b, N, k), block (h T, k, C), padded_values (b, u, P.., v),
        None where not needed.
    """
    heads, slots, _, _, dim_k = queries.shape
    dim_v, entries, most = padded_values.shape[-1], geometry.halo_entries, geometry.largest_chunk()
    rows = heads * slots
    grad_queries = torch.empty_like(queries) if needs_grad[0] else None  # h T b N k
    grad_block = (
        torch.zeros(block.shape, dtype=block.dtype, device=block.device) if needs_grad[1] else None
    )  # (h T) k C
    grad_values = torch.zeros_like(padded_values) if needs_grad[2] else None  # b u P.. v
    buffers = {
        name: queries.new_empty(most * size)
        for name, size in (
            ("halos", entries * dim_v),
            ("grad_halos", entries * dim_v),
            ("logits", rows * entries),
            ("grad_logits", rows * entries),
            ("grad_queries", rows * dim_k),
        )
    }

    def buffer(name: str, *shape: int) -> torch.Tensor:
        return buffers[name][: math.prod(shape)].view(shape)

    for chunk in geometry.chunks():
        count, tiles = geometry.size(chunk), geometry.tiles(chunk)
        halos = _halos(
            padded_values, geometry, chunk, out=buffer("halos", count, entries, dim_v)
        )  # n C v
        chunk_queries = _chunk_queries(queries, geometry, chunk)  # (h T) n k
        grad_y = grad_output[chunk.images, tiles].view(count, rows, dim_v)  # n (h T) v
        grad_logits = buffer("grad_logits", count, rows, entries)  # n (h T) C
        torch.bmm(grad_y, halos.transpose(1, 2), out=grad_logits)
        if grad_values is not None:
            logits = buffer("logits", rows, count, entries)  # (h T) n C
            torch.bmm(chunk_queries, block, out=logits)
            grad_halos = buffer("grad_halos", count, entries, dim_v)  # n C v
            torch.bmm(logits.permute(1, 2, 0), grad_y, out=grad_halos)
            _add_halos(grad_halos, grad_values, geometry, chunk)
        if grad_queries is not None:
            grad_chunk = buffer("grad_queries", rows, count, dim_k)  # (h T) n k
            torch.bmm(grad_logits.transpose(0, 1), block.transpose(1, 2), out=grad_chunk)
            grad_queries[:, :, chunk.images, tiles] = grad_chunk.view(
                heads, slots, chunk.images.stop - chunk.images.start, -1, dim_k
            )
        if grad_block is not None:
            grad_block.baddbmm_(chunk_queries.transpose(1, 2), grad_logits.transpose(0, 1))
    return grad_queries, grad_block, grad_values


class _TiledPositionOutput(torch.autograd.Function):
    """Keeps only its inputs (and E_tile) for backward; logits and halos are rebuilt by chunks."""

    @staticmethod
    def forward(ctx, queries, window, padded_values, index, geometry):
        block = _embedding_block(window, index, geometry.heads)  # (h T) k C
        ctx.save_for_backward(queries, block, padded_values, index)
        ctx.geometry, ctx.window_shape = geometry, window.shape
        return _tiled_forward_in_place(queries, block, padded_values, geometry)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        queries, block, padded_values, index = ctx.saved_tensors
        # The forward ran in float32 outside autocast; so does its backward, whatever the caller.
        with torch.autocast(device_type=grad_output.device.type, enabled=False):
            grad_queries, grad_block, grad_values = _tiled_backward(
                grad_output.contiguous(),
                queries,
                block,
                padded_values,
                ctx.geometry,
                ctx.needs_input_grad[:3],
            )
            grad_window = (
                None
                if grad_block is None
                else _embedding_block_backward(grad_block, index, ctx.window_shape)
            )
        return grad_queries, grad_window, grad_values, None, None


def pooled_size(size: int) -> int:
    """Output size of the 3-wide average pool with stride 2 and padding 1 along one axis."""
    return (size + 1) // 2


def _pooling_neighbours(queries: torch.Tensor, spatial: Sequence[int]) -> torch.Tensor:
    """The stride-1 queries that each pooled output averages, as one query per output.

    Args:
        queries: (b, h, k, *spatial).

    Returns:
        (b, h, k J, *pooled spatial), J = 3^dims neighbours (row-major, inner); zero beyond the
        borders, which is the pool's zero padding. One im2col (col2im in backward): it exports
        to ONNX, and a GPU runs it as one kernel.
    """
    dims, (batch, heads, dim_k) = len(spatial), queries.shape[:3]
    flat = (1,) * (2 - dims)  # a sequence is a 1-row image
    images = queries.reshape(batch * heads, dim_k, *flat, *spatial)
    columns = F.unfold(
        images,
        flat + (3,) * dims,
        padding=(0,) * (2 - dims) + (1,) * dims,
        stride=flat + (2,) * dims,
    )  # (b h) (k J) n_pooled
    return columns.reshape(batch, heads, dim_k * 3**dims, *[pooled_size(n) for n in spatial])


def _check_arguments(queries, values, window, spatial, stride, tuning) -> None:
    """The shapes and options of :func:`tiled_position_output`, or a ValueError naming them."""
    check_choice("stride", stride, (1, 2))
    dims, positions = len(spatial), math.prod(spatial)
    queries_shape, values_shape = static_sizes(queries), static_sizes(values)
    window_shape = static_sizes(window)
    if dims not in (1, 2) or any(not isinstance(size, int) or size < 1 for size in spatial):
        raise ValueError(f"spatial must be (H, W) or (L,) positive sizes, got {tuple(spatial)}")
    if len(queries_shape) != 4 or queries_shape[3] != positions:
        raise ValueError(
            f"queries must be (b, h, k, n) with n = {positions} positions for "
            f"spatial={tuple(spatial)}, got {queries_shape}"
        )
    if (
        len(values_shape) != 4
        or values_shape[3] != positions
        or values_shape[0] != queries_shape[0]
    ):
        raise ValueError(
            f"values must be (b, v, u, n) with b = {queries_shape[0]} and n = "
            f"{positions}, got {values_shape}"
        )
    if (
        len(window_shape) != 2 + dims
        or window_shape[:2] != (queries_shape[2], values_shape[2])
        or any(size % 2 == 0 for size in window_shape[2:])
    ):
        raise ValueError(
            f"window must be (k={queries_shape[2]}, u={values_shape[2]}) followed by "
            f"{dims} odd sizes, got {window_shape}"
        )
    name, tile = ("tile", tuning.tile) if stride == 1 else ("pooled_tile", tuning.pooled_tile)
    if tile and (len(tile) != dims or any(not isinstance(t, int) or t < 1 for t in tile)):
        raise ValueError(f"{name} must be {dims} integers >= 1, got {tuple(tile)}")
    check_int("chunk_elements", tuning.chunk_elements, 0)


def tiled_position_output(
    queries: torch.Tensor,
    values: torch.Tensor,
    window: torch.Tensor,
    spatial: Sequence[int],
    stride: int = 1,
    tuning: TiledTuning = TiledTuning(),
) -> torch.Tensor:
    """The position term of a lambda layer with the queries contracted first, as tiled GEMMs.

    Equal to ``einsum("bhkn,bvkn->bhvn", queries, conv(values, window))`` (the "conv" form, zero
    padding at the borders); see the module docstring. With ``stride=2``, equal to that followed
    by the strided lambda layer's average pool (3 wide, stride 2, padding 1, zeros counted).

    Decision (stride 2): the pool is folded into the GEMMs instead of run after them. The pool is
    linear, so pooled_y[p] = sum_c (sum_{n near p} q[n] / 9 . R[c - n]) V[c]: a tile of t x t
    outputs takes its 9 neighbours' queries as one query of depth 9 k (the logits GEMM's K) and
    reads a (2 t + 1 + 2 rho)^2 halo with step 2 t. The output GEMM, which holds most of the
    work, then runs once per output instead of once per stride-1 query: at a LambdaResNet's
    strided c5 block (64 x 64 -> 32 x 32, d = 512) about half the FLOPs of pooling afterwards.

    Args:
        queries: (b, h, k, n), n = prod(spatial) positions in row-major order.
        values: (b, v, u, n).
        window: (k, u, 2 rho_1 + 1, ...) embeddings of the offsets in scope (odd sizes).
        spatial: (H, W) or (L,).
        stride: 1, or 2 to average-pool the result as a strided lambda layer does.
        tuning: tiles, chunks and halo folding (default: by device); tiles are clipped to the
            output size.

    Returns:
        (b, h, v, n_out), n_out = n at stride 1, else the pooled positions ((H + 1) // 2 per axis).
    """
    _check_arguments(queries, values, window, spatial, stride, tuning)
    dims = len(spatial)
    batch, heads, dim_k = static_sizes(queries)[:3]
    dim_v, dim_u = static_sizes(values)[1:3]
    radii = [(width - 1) // 2 for width in static_sizes(window)[2:]]
    outputs = list(spatial) if stride == 1 else [pooled_size(size) for size in spatial]
    if batch == 0:
        return queries.new_zeros(0, heads, dim_v, math.prod(outputs))
    tile = tile_shape(outputs, tuning.output_tile(dims, stride))
    counts = tuple(-(-size // t) for size, t in zip(outputs, tile))
    padded = [count * t for count, t in zip(counts, tile)]
    # The queries a tile's halo must cover reach rho + (stride - 1) past its outer queries.
    reach = [radius + stride - 1 for radius in radii]
    step = tuple(stride * t for t in tile)
    halo = tuple(s - stride + 1 + 2 * r for s, r in zip(step, reach))
    geometry = _Geometry(
        batch,
        heads,
        dim_u,
        tile,
        halo,
        step,
        counts,
        tuning.chunk_elements_on(queries.device),
        tuning.fold_in_groups_on(queries.device),
    )

    queries = queries.reshape(batch, heads, dim_k, *spatial)  # b h k ..
    if stride == 2:
        queries = _pooling_neighbours(queries, spatial)  # b h (k J) ..
        window = window / 3**dims  # the pool's mean
    dim_k = static_sizes(queries)[2]
    to_padded = [
        pad for size, p in zip(reversed(outputs), reversed(padded)) for pad in (0, p - size)
    ]
    if any(to_padded):
        queries = F.pad(queries, to_padded)  # b h k P..
    split = [n for count, t in zip(counts, tile) for n in (count, t)]
    queries = queries.reshape(batch, heads, dim_k, *split)  # b h k n_1 t_1 ..
    order = [1] + [4 + 2 * a for a in range(dims)] + [0] + [3 + 2 * a for a in range(dims)] + [2]
    queries = queries.permute(order).reshape(heads, geometry.slots, batch, -1, dim_k)  # h T b N k

    widths = tuple(2 * radius + 1 for radius in radii)
    build_index = (
        _embedding_index
        if torch.jit.is_tracing() or torch.compiler.is_compiling()
        else _cached_embedding_index
    )
    index = build_index(tuple(tile), widths, dim_u, stride, queries.device)  # T C J
    values = values.reshape(batch, dim_v, dim_u, *spatial)  # b v u ..
    values = values.permute([0, 2] + list(range(3, 3 + dims)) + [1])  # b u .. v
    # Zero padding: `reach` before each axis, and after it up to the last halo's end.
    to_halo = [
        pad
        for size, count, s, c, r in zip(
            *[reversed(a) for a in (spatial, counts, step, halo, reach)]
        )
        for pad in (r, (count - 1) * s + c - r - size)
    ]
    values = F.pad(values, [0, 0] + to_halo).contiguous()  # b u (P + 2 rho).. v

    if torch.jit.is_tracing():
        # A trace cannot hold a Python autograd.Function; the plain ops trace (and differentiate).
        block = _embedding_block(window, index, heads)  # (h T) k C
        output = _tiled_forward(queries, block, values, geometry)  # b N h T v
    else:
        output = _TiledPositionOutput.apply(queries, window, values, index, geometry)  # b N h T v
    output = output.reshape(batch, *counts, heads, *tile, dim_v)  # b n_1 .. h t_1 .. v
    order = [0, 1 + dims, 2 + 2 * dims] + [i for a in range(dims) for i in (1 + a, 2 + dims + a)]
    output = output.permute(order).reshape(batch, heads, dim_v, *padded)  # b h v P..
    crop = (slice(None),) * 3 + tuple(slice(0, size) for size in outputs)
    return output[crop].reshape(batch, heads, dim_v, -1)  # b h v n
