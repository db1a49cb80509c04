"""Export-only replacements that let ``torch.export`` take a whole detectron2 detector with a
symbolic (dynamic) image height and width.

:func:`export_friendly_detectron2` swaps a few detectron2 functions for equivalents while a model
is exported, and puts the originals back afterwards; nothing changes outside that ``with`` block,
so training and eager inference run detectron2's own code. Each replacement computes the same
numbers as the function it stands in for; it differs only where the original asks a Python
question of a tensor's *values* (``if mask.all()``, ``.item()``), which ``torch.export`` cannot
answer for every input (``GuardOnDataDependentSymNode``):

* ``ImageList.from_tensors`` (one image): the padded size as symbolic integers rather than a
  tensor of sizes that the padding then reads back as numbers (``.item()``). The same padding,
  ``padding_constraints`` (detectron2 after 0.6: square size, divisibility) included.
* ``detectron2.layers.Conv2d.forward``: asks ``self.training`` before ``x.numel() == 0`` (an
  assertion for SyncBatchNorm in training), so eval mode never asks the size of the RoI heads'
  data-dependent number of boxes.
* ``torch.nn.functional.batch_norm`` (the heads' BatchNorm layers), in eval mode: calls the
  operator that export records for it anyway, ``_native_batch_norm_legit_no_training``, and so
  skips ``torch.batch_norm``'s check for an empty input, which a data-dependent box count cannot
  answer. Training mode calls the original.
* ``_create_grid_offsets`` (anchor generators): the anchors' shifts as ``arange(n) * stride``
  plus the offset, whose length is visibly n, rather than ``arange(offset * stride, n * stride,
  stride)`` (a float ceil); the same values, exactly.
* ``Boxes.__init__``: detectron2's, but for an (N, 4) tensor whose N depends on values (boxes
  after a mask or NMS): detectron2's asks whether it is empty, to reshape an empty one to (0, 4),
  which leaves an (N, 4) one as it is; such a tensor is kept as it keeps one (as float32).
* ``Boxes.clip``: torchvision's ``clip_boxes_to_image``, the same clamp of each coordinate,
  without detectron2's assertion that every coordinate is finite (its first statement, so no
  call of detectron2's skips it). Both callers in inference (below) drop non-finite boxes first,
  so it never fires there.
* ``Instances.set``: detectron2's for lengths that are Python ints; a symbolic length (``len()``
  must return an int) is compared with the others' by ``torch._check``.
* ``find_top_rpn_proposals`` (RPN) and ``fast_rcnn_inference_single_image`` (box head): the
  boxes with a non-finite coordinate or score, and the RPN's too-small boxes, are always dropped
  by a mask, rather than only after asking whether any are (which changes nothing when none
  are); the RPN's per-level ``min(H_i * W_i * A, pre_nms_topk)`` is ``torch.sym_min``. These two
  take detectron2's steps, with its Boxes, Instances and NMS, rather than call its functions:
  each asks ``if not valid_mask.all()`` inside its body (the RPN's after its top-k selection),
  which no argument or module global of detectron2 turns off and no caller can answer for it
  (tests/compat/test_torch_export.py checks that detectron2 still asks it).
* ``convert_boxes_to_pooler_format`` (ROIPooler): each box's image index from the symbolic
  number of boxes of each image, not from a tensor of those numbers (``repeat_interleave``).
* ``batched_nms`` (both of the above, and RetinaNet's): torchvision's batched NMS picks per-class
  NMS calls or one call on class-offset boxes by the (data-dependent) number of boxes; this always
  takes the one call, as torchvision does up to 4000 box coordinates on the CPU (100000 on a GPU;
  the tests' sizes) and always under a TorchScript/ONNX trace. Above that eager may order boxes of
  equal score differently, or, rarely, keep another box where an IoU sits within float rounding of
  the threshold.
* the fake kernel of ``torchvision::nms`` (what export runs to learn output shapes): says the
  number of boxes kept is 0 or more; torchvision's says 2 or more (``create_unbacked_symint``),
  which the exported program would assert, failing on images with fewer than 2 detections.
"""

import contextlib
from typing import Dict, Iterator, List, Optional, Tuple

import detectron2.layers.wrappers as d2_wrappers
import detectron2.modeling.anchor_generator as anchor_generator
import detectron2.modeling.meta_arch.retinanet as retinanet
import detectron2.modeling.poolers as poolers
import detectron2.modeling.proposal_generator.proposal_utils as proposal_utils
import detectron2.modeling.proposal_generator.rpn as rpn
import detectron2.modeling.roi_heads.fast_rcnn as fast_rcnn
import torch
import torch.nn.functional as F
import torchvision  # noqa: F401  (registers torch.ops.torchvision.nms)
from detectron2.layers import cat
from detectron2.structures import Boxes, ImageList, Instances
from torchvision.ops import clip_boxes_to_image

from lambda_det.compat.torch_features import has_free_unbacked_symbols

__all__ = ["export_friendly_detectron2"]


# The replacements take the parameters of the functions they stand in for, as detectron2 0.6 (the
# release installed) and its main branch (at commit 02b5c4e) define them; a test compares
# them with the installed detectron2's signatures.


def _from_tensors(
    tensors: List[torch.Tensor],
    size_divisibility: int = 0,
    pad_value: float = 0.0,
    padding_constraints: Optional[Dict[str, int]] = None,
) -> ImageList:
    """ImageList.from_tensors for one image with symbolic sizes (several: the original).
    ``padding_constraints`` is detectron2 main's: {"square_size": pad to this square,
    "size_divisibility": replaces the argument}; detectron2 0.6's callers never pass it."""
    if len(tensors) != 1:
        extra = {} if padding_constraints is None else {"padding_constraints": padding_constraints}
        return _ORIGINALS["from_tensors"](tensors, size_divisibility, pad_value, **extra)
    (image,) = tensors
    height, width = image.shape[-2], image.shape[-1]
    padded_height, padded_width = height, width
    if padding_constraints is not None:
        square_size = padding_constraints.get("square_size", 0)
        if square_size > 0:
            padded_height = padded_width = square_size
        size_divisibility = padding_constraints.get("size_divisibility", size_divisibility)
    if size_divisibility > 1:
        stride = size_divisibility
        padded_height = (padded_height + stride - 1) // stride * stride
        padded_width = (padded_width + stride - 1) // stride * stride
    batched = F.pad(
        image, [0, padded_width - width, 0, padded_height - height], value=pad_value
    ).unsqueeze_(0)
    return ImageList(batched.contiguous(), [(height, width)])


def _batch_norm(
    input: torch.Tensor,
    running_mean,
    running_var,
    weight=None,
    bias=None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
):
    """F.batch_norm: in eval mode, the operator that torch.export records for it anyway
    (``_native_batch_norm_legit_no_training``), without torch.batch_norm's question whether the
    input is empty, which the RoI heads' data-dependent box count cannot answer."""
    if training or running_mean is None or running_var is None:
        return _ORIGINALS["batch_norm"](
            input, running_mean, running_var, weight, bias, training, momentum, eps
        )
    return torch.ops.aten._native_batch_norm_legit_no_training(
        input, weight, bias, running_mean, running_var, momentum, eps
    )[0]


def _create_grid_offsets(
    size: List[int],
    stride: int,
    offset: float,
    device=None,
    target_device_tensor: Optional[torch.Tensor] = None,
):
    """anchor_generator._create_grid_offsets: the anchors' x and y shifts on a feature map, as
    ``arange(n) * stride + offset * stride`` rather than ``arange(offset * stride, n * stride,
    stride)``, whose length symbolic shapes cannot see to be n (a float ceil). The same values
    (exact in float32 for grids under 2^24 / stride cells). The fourth parameter: detectron2 0.6's
    ``device``, its main branch's (02b5c4e) ``target_device_tensor``, a tensor on that device;
    either is accepted by position or by name."""
    if target_device_tensor is not None:
        device = target_device_tensor
    if isinstance(device, torch.Tensor):
        device = device.device
    grid_height, grid_width = size
    shifts_x = (
        torch.arange(grid_width, dtype=torch.float32, device=device) * stride + offset * stride
    )
    shifts_y = (
        torch.arange(grid_height, dtype=torch.float32, device=device) * stride + offset * stride
    )
    shift_y, shift_x = torch.meshgrid(shifts_y, shifts_x, indexing="ij")
    return shift_x.reshape(-1), shift_y.reshape(-1)


_DETECTRON2_CONV2D_FORWARD = d2_wrappers.Conv2d.forward


def _conv2d_forward(self, x: torch.Tensor) -> torch.Tensor:
    """detectron2.layers.Conv2d.forward; in eval mode without its training-only check, which
    asks the size of x before it asks whether the layer trains: torch's convolution (detectron2's
    calls the same ``F.conv2d``), then the layer's norm and activation, as detectron2's."""
    if self.training:
        return _DETECTRON2_CONV2D_FORWARD(self, x)
    x = torch.nn.Conv2d.forward(self, x)
    if self.norm is not None:
        x = self.norm(x)
    if self.activation is not None:
        x = self.activation(x)
    return x


def _boxes_init(self: Boxes, tensor: torch.Tensor) -> None:
    """Boxes.__init__ (detectron2's), but for an (N, 4) tensor of an N that depends on values,
    whose emptiness detectron2's asks (see the module docstring)."""
    if (
        isinstance(tensor, torch.Tensor)
        and tensor.dim() == 2
        and tensor.shape[1] == 4
        and has_free_unbacked_symbols(tensor.shape[0])
    ):
        self.tensor = tensor.to(torch.float32)  # as detectron2's keeps an (N, 4) tensor
    else:
        _ORIGINALS["boxes_init"](self, tensor)


def _instances_set(self: Instances, name: str, value) -> None:
    """Instances.set (detectron2's), but for symbolic lengths, which it would ask ``len()``."""
    length = value.__len__()
    if isinstance(length, int) and (not self._fields or isinstance(self.__len__(), int)):
        _ORIGINALS["instances_set"](self, name, value)
        return
    if self._fields:
        torch._check(
            self.__len__() == length,
            lambda: f"Adding a field of length {length} to a Instances of length {self.__len__()}",
        )
    self._fields[name] = value  # where detectron2's set keeps a field


def _clip(self: Boxes, box_size: Tuple[int, int]) -> None:
    """Boxes.clip as torchvision clips: without detectron2's assertion on the values (see the
    module docstring)."""
    self.tensor = clip_boxes_to_image(self.tensor, box_size)


def _convert_boxes_to_pooler_format(box_lists: List[Boxes]) -> torch.Tensor:
    """poolers.convert_boxes_to_pooler_format: (M, 5) rows (image index, box), the image
    indices from each list's symbolic length rather than a tensor of lengths."""
    boxes = torch.cat([box_list.tensor for box_list in box_lists], dim=0)
    indices = torch.cat(
        [
            torch.full((box_list.tensor.shape[0], 1), index, dtype=boxes.dtype, device=boxes.device)
            for index, box_list in enumerate(box_lists)
        ],
        dim=0,
    )
    return cat([indices, boxes], dim=1)


def _batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    """NMS within each class: one NMS on boxes moved apart by class, as torchvision's
    ``batched_nms`` does for up to 4000 coordinates on the CPU. Its callers here clip the boxes
    first, so the largest coordinate is that of the boxes or 0 (none)."""
    boxes = boxes.float()
    largest = torch.cat([boxes.reshape(-1), boxes.new_zeros(1)]).max()
    offsets = idxs.to(boxes) * (largest + torch.tensor(1).to(boxes))  # idxs: the classes
    keep = torch.ops.torchvision.nms(boxes + offsets[:, None], scores, iou_threshold)
    # What NMS returns is at most as long as its input: bounds later slices and indexing.
    torch._check(keep.shape[0] <= boxes.shape[0])
    return keep


def _nms_fake(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """torchvision::nms on fake tensors: a (K,) index tensor with K unknown, 0 or more.
    (torchvision's own says K >= 2, which the exported program then asserts on every image.)"""
    torch._check(
        boxes.dim() == 2 and boxes.size(1) == 4,
        lambda: f"boxes should be an (N, 4) tensor, got {tuple(boxes.shape)}",
    )
    torch._check(
        scores.dim() == 1 and scores.size(0) == boxes.size(0),
        lambda: f"scores should be an ({boxes.size(0)},) tensor, got {tuple(scores.shape)}",
    )
    count = torch.library.get_ctx().new_dynamic_size()
    return boxes.new_empty(count, dtype=torch.long)


def _find_top_rpn_proposals(
    proposals: List[torch.Tensor],
    pred_objectness_logits: List[torch.Tensor],
    image_sizes: List[Tuple[int, int]],
    nms_thresh: float,
    pre_nms_topk: int,
    post_nms_topk: int,
    min_box_size: float,
    training: bool,
) -> List[Instances]:
    """proposal_utils.find_top_rpn_proposals with masks instead of questions about values
    (why it does not call detectron2's: the module docstring)."""
    if training:
        raise RuntimeError("torch.export of the RPN is for inference (eval mode) only")
    device = proposals[0].device
    batch = torch.arange(len(image_sizes), device=device)
    scores, boxes, levels = [], [], []
    for level, (proposals_i, logits_i) in enumerate(zip(proposals, pred_objectness_logits)):
        count = torch.sym_min(logits_i.shape[1], pre_nms_topk)
        logits_i, order = logits_i.sort(descending=True, dim=1)
        scores.append(logits_i.narrow(1, 0, count))
        boxes.append(proposals_i[batch[:, None], order.narrow(1, 0, count)])  # N x count x 4
        levels.append(torch.full((count,), level, dtype=torch.int64, device=device))
    scores, boxes, levels = cat(scores, dim=1), cat(boxes, dim=1), cat(levels, dim=0)

    results = []
    for index, image_size in enumerate(image_sizes):
        image_boxes, image_scores = Boxes(boxes[index]), scores[index]
        valid = torch.isfinite(image_boxes.tensor).all(dim=1) & torch.isfinite(image_scores)
        image_boxes, image_scores, image_levels = (
            image_boxes[valid],
            image_scores[valid],
            levels[valid],
        )
        image_boxes.clip(image_size)
        keep = image_boxes.nonempty(threshold=min_box_size)
        image_boxes, image_scores, image_levels = (
            image_boxes[keep],
            image_scores[keep],
            image_levels[keep],
        )
        keep = proposal_utils.batched_nms(
            image_boxes.tensor, image_scores, image_levels, nms_thresh
        )[:post_nms_topk]  # sorted by score
        result = Instances(image_size)
        result.proposal_boxes = image_boxes[keep]
        result.objectness_logits = image_scores[keep]
        results.append(result)
    return results


def _fast_rcnn_inference_single_image(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    image_shape: Tuple[int, int],
    score_thresh: float,
    nms_thresh: float,
    topk_per_image: int,
):
    """fast_rcnn.fast_rcnn_inference_single_image with a mask instead of a question about
    values (why it does not call detectron2's: the module docstring)."""
    valid = torch.isfinite(boxes).all(dim=1) & torch.isfinite(scores).all(dim=1)
    boxes, scores = boxes[valid], scores[valid]
    scores = scores[:, :-1]  # without the background class
    num_box_classes = boxes.shape[1] // 4
    clipped = Boxes(boxes.reshape(-1, 4))
    clipped.clip(image_shape)
    boxes = clipped.tensor.view(-1, num_box_classes, 4)  # R x C x 4

    above = scores > score_thresh  # R x K
    above_indices = above.nonzero()  # R' x 2: (prediction, class)
    boxes = boxes[above_indices[:, 0], 0] if num_box_classes == 1 else boxes[above]
    scores = scores[above]
    keep = fast_rcnn.batched_nms(boxes, scores, above_indices[:, 1], nms_thresh)
    if topk_per_image >= 0:
        keep = keep[:topk_per_image]
    boxes, scores, above_indices = boxes[keep], scores[keep], above_indices[keep]

    result = Instances(image_shape)
    result.pred_boxes = Boxes(boxes)
    result.scores = scores
    result.pred_classes = above_indices[:, 1]
    return result, above_indices[:, 0]


# (owner, attribute, replacement); the originals are kept in _ORIGINALS while exporting.
_REPLACEMENTS = (
    (ImageList, "from_tensors", staticmethod(_from_tensors)),
    (d2_wrappers.Conv2d, "forward", _conv2d_forward),
    (F, "batch_norm", _batch_norm),
    (anchor_generator, "_create_grid_offsets", _create_grid_offsets),
    (Boxes, "__init__", _boxes_init),
    (Boxes, "clip", _clip),
    (Instances, "set", _instances_set),
    (proposal_utils, "batched_nms", _batched_nms),
    (fast_rcnn, "batched_nms", _batched_nms),
    (retinanet, "batched_nms", _batched_nms),
    (proposal_utils, "find_top_rpn_proposals", _find_top_rpn_proposals),
    (rpn, "find_top_rpn_proposals", _find_top_rpn_proposals),
    (poolers, "convert_boxes_to_pooler_format", _convert_boxes_to_pooler_format),
    (fast_rcnn, "fast_rcnn_inference_single_image", _fast_rcnn_inference_single_image),
)
_ORIGINALS = {}


@contextlib.contextmanager
def export_friendly_detectron2() -> Iterator[None]:
    """Within the block, detectron2 runs the export-friendly equivalents above and
    torchvision::nms has the fake kernel :func:`_nms_fake` (not thread-safe: for the duration of
    an export only)."""
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in _REPLACEMENTS]
    _ORIGINALS["from_tensors"] = ImageList.from_tensors
    _ORIGINALS["batch_norm"] = F.batch_norm
    _ORIGINALS["boxes_init"] = Boxes.__init__
    _ORIGINALS["instances_set"] = Instances.set
    library = torch.library.Library("torchvision", "FRAGMENT")
    try:
        # The newest fake kernel of an operator runs; destroying the library removes this one.
        torch.library.register_fake("torchvision::nms", _nms_fake, lib=library)
        for owner, name, replacement in _REPLACEMENTS:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
        _ORIGINALS.clear()
        library._destroy()
