"""lambda_det.compat.torch_export's stand-ins for detectron2 functions, each against the installed
detectron2: checked with detectron2 0.6 (the .venv/ build) and main at 02b5c4e. The whole
detector's export: tests/export/test_export.py."""

import inspect

import pytest
import torch
from conftest import NEEDS_FAKE_KERNELS_STACK

from lambda_det.compat import import_detectron2

import_detectron2()  # quietly, before the detectron2 imports below

from detectron2.modeling.proposal_generator import proposal_utils
from detectron2.modeling.roi_heads import fast_rcnn
from detectron2.structures import Boxes, Instances

from lambda_det.compat import torch_export
from lambda_det.compat.torch_export import export_friendly_detectron2

CHECKED = "(checked with detectron2 0.6 and main 02b5c4e)"


def _boxes(count: int, seed: int = 0) -> torch.Tensor:
    """(count, 4) boxes (x1, y1, x2, y2), some reaching out of a 20 x 30 image."""
    generator = torch.Generator().manual_seed(seed)
    corner = torch.rand(count, 2, generator=generator) * 40 - 5
    return torch.cat([corner, corner + torch.rand(count, 2, generator=generator) * 10], dim=1)


@pytest.mark.parametrize(
    "function, question",
    [
        (Boxes.__init__, "if tensor.numel() == 0:"),
        (Boxes.clip, "assert torch.isfinite(self.tensor).all()"),
        (Instances.set, "data_len = len(value)"),
        (proposal_utils.find_top_rpn_proposals, "if not valid_mask.all():"),
        (proposal_utils.find_top_rpn_proposals, "min(Hi_Wi_A, pre_nms_topk)"),
        (fast_rcnn.fast_rcnn_inference_single_image, "if not valid_mask.all():"),
    ],
)
def test_detectron2_asks_what_export_cannot_answer_0_6_and_main(function, question):
    """Why each stand-in is there: a question about values (or a len() of a symbolic size)
    that non-strict torch.export cannot answer. A detectron2 without it needs no stand-in."""
    assert question in inspect.getsource(function), f"{function.__qualname__} {CHECKED}"


@NEEDS_FAKE_KERNELS_STACK
def test_boxes_and_instances_are_detectron2s_for_sizes_export_knows_0_6_and_main():
    """Eagerly (every size a Python int), Boxes and Instances.set are detectron2's own: an
    empty input becomes (0, 4), a field of another length is refused."""
    with export_friendly_detectron2():
        assert Boxes([[1, 2, 3, 4]]).tensor.dtype == torch.float32
        assert Boxes(torch.zeros(0)).tensor.shape == (0, 4)
        with pytest.raises(AssertionError):
            Boxes(torch.zeros(3, 5))
        instances = Instances((20, 30), scores=torch.zeros(2))
        with pytest.raises(AssertionError, match="Adding a field of length 3"):
            instances.set("labels", torch.zeros(3))


@NEEDS_FAKE_KERNELS_STACK
def test_clip_clamps_as_detectron2s_0_6_and_main():
    boxes = _boxes(50)
    expected = Boxes(boxes.clone())
    expected.clip((20, 30))
    with export_friendly_detectron2():
        clipped = Boxes(boxes.clone())
        clipped.clip((20, 30))
    assert torch.equal(clipped.tensor, expected.tensor) and clipped.tensor.is_contiguous()
    assert not torch.equal(expected.tensor, boxes)  # some boxes were clipped


class _KeepScored(torch.nn.Module):
    """Boxes of the scores above 0 (a data-dependent count), clipped, as Instances."""

    def forward(self, boxes: torch.Tensor, scores: torch.Tensor):
        keep = scores > 0
        result = Instances((20, 30))
        result.pred_boxes = Boxes(boxes[keep])
        result.pred_boxes.clip((20, 30))
        result.scores = scores[keep]
        return result.pred_boxes.tensor, result.scores


@pytest.mark.slow
def test_export_takes_boxes_of_a_data_dependent_count():
    boxes, scores = _boxes(6), torch.tensor([1.0, -1.0, 2.0, -3.0, 0.5, -0.5])
    with pytest.raises(Exception, match="data-dependent"):  # negative control: detectron2's
        torch.export.export(_KeepScored(), (boxes, scores), strict=False)
    with export_friendly_detectron2():
        program = torch.export.export(_KeepScored(), (boxes, scores), strict=False).module()
    for scores in (scores, -scores, -scores.abs()):  # 3 boxes, 3 others, none
        expected = _KeepScored()(boxes, scores)
        actual = program(boxes, scores)
        assert all(torch.equal(a, e) for a, e in zip(actual, expected)), scores
    assert actual[0].shape == (0, 4)


def _with_non_finite(tensor: torch.Tensor, rows) -> torch.Tensor:
    tensor = tensor.clone()
    tensor[rows[0], 0] = float("nan")
    tensor[rows[1], -1] = float("inf")
    return tensor


def test_the_rpn_stand_in_finds_detectron2s_proposals_0_6_and_main():
    """On boxes and scores with non-finite values (which detectron2's drops after asking) and
    boxes below the minimum size, two images, two levels."""
    proposals = [_boxes(24, seed).reshape(2, 12, 4) for seed in (1, 2)]
    proposals[0] = _with_non_finite(proposals[0].reshape(24, 4), (3, 17)).reshape(2, 12, 4)
    generator = torch.Generator().manual_seed(3)
    logits = [torch.randn(2, 12, generator=generator) for _ in range(2)]
    logits[1][1, 5] = float("nan")
    arguments = (proposals, logits, [(20, 30), (30, 20)], 0.5, 8, 10, 2.0, False)
    expected = proposal_utils.find_top_rpn_proposals(*arguments)
    actual = torch_export._find_top_rpn_proposals(*arguments)
    for image_expected, image_actual in zip(expected, actual):
        for field in ("proposal_boxes", "objectness_logits"):
            expected_field, actual_field = image_expected.get(field), image_actual.get(field)
            if isinstance(expected_field, Boxes):
                expected_field, actual_field = expected_field.tensor, actual_field.tensor
            assert torch.equal(actual_field, expected_field), f"{field} {CHECKED}"
    assert 0 < len(expected[0]) < 10


@pytest.mark.parametrize("box_classes", [1, 3])
def test_the_box_head_stand_in_finds_detectron2s_detections_0_6_and_main(box_classes):
    """On boxes and scores with non-finite values; class-agnostic and per-class boxes."""
    generator = torch.Generator().manual_seed(box_classes)
    boxes = torch.cat([_boxes(20, seed) for seed in range(box_classes)], dim=1)
    boxes = _with_non_finite(boxes, (2, 7))
    scores = _with_non_finite(torch.rand(20, 4, generator=generator).softmax(dim=1), (11, 13))
    arguments = (boxes, scores, (20, 30), 0.2, 0.5, 100)
    expected, expected_rows = fast_rcnn.fast_rcnn_inference_single_image(*arguments)
    actual, actual_rows = torch_export._fast_rcnn_inference_single_image(*arguments)
    assert torch.equal(actual.pred_boxes.tensor, expected.pred_boxes.tensor), CHECKED
    assert torch.equal(actual.scores, expected.scores), CHECKED
    assert torch.equal(actual.pred_classes, expected.pred_classes), CHECKED
    assert torch.equal(actual_rows, expected_rows) and len(expected) > 0, CHECKED


@NEEDS_FAKE_KERNELS_STACK
def test_every_replacement_is_restored_after_an_exception_too():
    """Each attribute export_friendly_detectron2 replaces is the replacement within the block
    and the original after it, also when the block raises."""
    replaced = torch_export._REPLACEMENTS
    before = [owner.__dict__[name] for owner, name, _ in replaced]
    with pytest.raises(RuntimeError, match="in the block"):
        with export_friendly_detectron2():
            within = [owner.__dict__[name] for owner, name, _ in replaced]
            assert within == [replacement for _, _, replacement in replaced]
            raise RuntimeError("in the block")
    assert [owner.__dict__[name] for owner, name, _ in replaced] == before
