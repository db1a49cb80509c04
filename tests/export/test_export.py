"""Export (lambda_det.export, tools/export_model.py): TorchScript, ONNX and torch.export outputs
match eager mode.

One small LambdaResNet-26 Mask R-CNN (random weights, every detection kept) is checkpointed, then
exported once per format on a 64 x 96 sample: ONNX by the tool from an image file, TorchScript
through the library; torch.export by the tool on its default 96 x 96 sample (it takes sizes from
65, one more than the FPN's largest stride). All run images of other sizes (DYNAMIC_SIZES). ONNX
tests need onnx and onnxruntime (the "dev" extra) and skip without them. Exporting and loading a
.pt2 each take seconds: the tests share one file and one loaded program (:func:`torch_exported`).
"""

import json
import math
import re
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import NEEDS_FAKE_KERNELS_STACK, built_once
from detectron2.data import Metadata
from detectron2.modeling import build_model

import lambda_det.data
import lambda_det.modeling
from lambda_det.checkpoint import AtomicCheckpointer
from lambda_det.cli import export_model as export_tool
from lambda_det.export import (
    FILE_SUFFIXES,
    ExportedModel,
    best_score_below_threshold,
    class_table,
    eager_outputs,
    export_model,
    max_differences,
    metadata_path,
    outputs_to_instances,
    sample_image,
)
from lambda_det.inference import build_trained_model
from lambda_det.layers import LambdaLayer
from lambda_det.run_config import load_config

lambda_det.data.register_datasets()  # the metadata's classes, by name: importing registers none

CONFIG = "configs/Demo/lambda_r26_shapes.yaml"
OVERRIDES = [
    "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER",
    "0.25",
    "MODEL.LAMBDA_RESNET.SCOPE",
    "3",
    "MODEL.ROI_HEADS.SCORE_THRESH_TEST",
    "0.0",  # keep every detection: outputs are never empty
    "MODEL.RPN.PRE_NMS_TOPK_TEST",
    "100",
    "MODEL.RPN.POST_NMS_TOPK_TEST",
    "50",
    "TEST.DETECTIONS_PER_IMAGE",
    "20",
    "INPUT.MIN_SIZE_TEST",
    "96",
    "INPUT.MAX_SIZE_TEST",
    "96",
    "MODEL.DEVICE",
    "cpu",
]
SIZE = (64, 96)  # kept as it is by the test-time resize (longest side 96)
# Sizes the exports were not traced at: square, landscape, portrait.
DYNAMIC_SIZES = [(128, 128), (96, 128), (160, 120)]
SHAPES_CLASSES = [
    {"index": 0, "id": 1, "name": "circle"},
    {"index": 1, "id": 2, "name": "square"},
    {"index": 2, "id": 3, "name": "triangle"},
]
DETECTIONS = 20
# Largest absolute differences accepted from eager mode: boxes in pixels, the rest in [0, 1].
# TorchScript traces the lambda layers' "conv" form where eager "auto" runs "einsum" at these
# sizes: the same sums in another order (measured: boxes 4.4e-4 px); onnxruntime has its own
# RoIAlign and convolutions too (measured: boxes 3.5e-4 px, scores 1e-5, mask probabilities
# 1.7e-4). torch.export runs the "conv" form too (measured: boxes 1e-4 px, masks 4e-5).
TOLERANCES = {
    "torchscript": {"pred_boxes": 2e-3, "scores": 1e-4, "pred_masks": 1e-3},
    "onnx": {"pred_boxes": 2e-3, "scores": 1e-4, "pred_masks": 1e-3},
    "torch_export": {"pred_boxes": 2e-3, "scores": 1e-4, "pred_masks": 1e-3},
}
TORCH_EXPORT_MIN_SIZE = 65  # the FPN's largest stride (P6: 64) + 1


pytestmark = pytest.mark.usefixtures("one_torch_thread")
# The ONNX and torch.export cases read the file tools/export_model.py writes (a tool run,
# seconds).
ONNX = pytest.param("onnx", marks=[pytest.mark.slow, pytest.mark.e2e])
TORCH_EXPORT = pytest.param("torch_export", marks=[pytest.mark.slow, pytest.mark.e2e])


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    """A checkpoint of the test model, with heads scaled up so scores, boxes and masks vary."""
    torch.manual_seed(0)
    model = build_model(load_config(CONFIG, OVERRIDES))
    heads = model.roi_heads
    with torch.no_grad():  # detectron2 inits these at std 0.001-0.01: near-constant outputs
        for layer, std in (
            (heads.box_predictor.cls_score, 0.1),
            (heads.box_predictor.bbox_pred, 0.05),
            (heads.mask_head.predictor, 0.3),
        ):
            layer.weight.normal_(std=std)
            layer.bias.normal_(std=std)
    folder = tmp_path_factory.mktemp("checkpoint")
    AtomicCheckpointer(model, save_dir=str(folder)).save("model_final")
    return str(folder / "model_final.pth")


@pytest.fixture(scope="module")
def cfg(weights):
    return load_config(CONFIG, OVERRIDES + ["MODEL.WEIGHTS", weights])


@pytest.fixture(scope="module")
def model(cfg):
    return build_trained_model(cfg)


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    """A BGR image file of SIZE: a gradient with a few rectangles."""
    height, width = SIZE
    image = np.zeros((height, width, 3), dtype=np.uint8)
    image[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    image[..., 1] = np.linspace(0, 255, height, dtype=np.uint8)[:, None]
    image[10:40, 20:70] = (0, 0, 255)
    image[40:60, 60:90] = (255, 255, 0)
    path = tmp_path_factory.mktemp("images") / "sample.png"
    cv2.imwrite(str(path), image)
    return path


@pytest.fixture(scope="module")
def images(cfg, image_file):
    """Images of the exported size: the file, and two synthetic ones."""
    return [
        sample_image(cfg, image_file),
        sample_image(cfg, size=SIZE, seed=0),
        sample_image(cfg, size=SIZE, seed=1),
    ]


@pytest.fixture(scope="module")
def other_sizes():
    """Images of DYNAMIC_SIZES (the exported model takes them as they are)."""
    generator = torch.Generator().manual_seed(2)
    return [
        torch.randint(0, 256, (3, *size), dtype=torch.uint8, generator=generator)
        for size in DYNAMIC_SIZES
    ]


@pytest.fixture(scope="module")
def torchscript_file(cfg, model, images, tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "model.ts"
    export_model(model, images[1], path, "torchscript", cfg=cfg)
    return path


@pytest.fixture(scope="module")
def onnx_file(cfg, weights, image_file, tmp_path_factory):
    pytest.importorskip("onnx")
    path = tmp_path_factory.mktemp("export") / "model.onnx"
    status = export_tool.main(
        [
            "--config-file",
            CONFIG,
            "--format",
            "onnx",
            "--output",
            str(path),
            "--sample-image",
            str(image_file),
            *OVERRIDES,
            "MODEL.WEIGHTS",
            weights,
        ]
    )
    assert status == 0
    return path


@pytest.fixture(scope="module")
def torch_export_file(weights, tmp_path_factory):
    """The tool's torch.export of the test model, on its default sample (96 x 96): once per run,
    for pytest-xdist's workers too (their weights are the same)."""

    def export(folder):
        status = export_tool.main(
            [
                "--config-file",
                CONFIG,
                "--format",
                "torch_export",
                "--output",
                str(folder / "model.pt2"),
                *OVERRIDES,
                "MODEL.WEIGHTS",
                weights,
            ]
        )
        assert status == 0

    return built_once(tmp_path_factory, "test_export-torch_export", export) / "model.pt2"


@pytest.fixture(scope="module")
def torch_exported(torch_export_file):
    """torch_export_file loaded (seconds: torch's deserialization), for the tests that run it."""
    return ExportedModel(torch_export_file)


def assert_matches_eager(model, exported: ExportedModel, image, tolerances) -> None:
    expected, actual = eager_outputs(model, image), exported(image)
    assert (
        sorted(actual)
        == sorted(expected)
        == ["image_size", "pred_boxes", "pred_classes", "pred_masks", "scores"]
    )
    assert actual["pred_boxes"].shape == (DETECTIONS, 4)
    assert actual["pred_masks"].shape == (DETECTIONS, 1, 28, 28)
    assert actual["image_size"].tolist() == list(image.shape[1:])
    assert torch.equal(actual["pred_classes"], expected["pred_classes"])
    for name, tolerance in tolerances.items():
        torch.testing.assert_close(
            actual[name],
            expected[name],
            rtol=0,
            atol=tolerance,
            msg=lambda message: f"{name}: {message}",
        )


def test_sample_image_is_resized_like_the_test_loader(cfg, image_file):
    from_file = sample_image(cfg, image_file)
    assert from_file.dtype == torch.uint8 and from_file.shape == (3, *SIZE)
    assert from_file[:, 20, 40].tolist() == [0, 0, 255]  # BGR, as cfg.INPUT.FORMAT
    # Longest side to INPUT.MAX_SIZE_TEST (96): 128 x 192 -> 64 x 96.
    assert sample_image(cfg, size=(128, 192)).shape == (3, *SIZE)
    assert sample_image(cfg).shape == (3, 96, 96)


@pytest.mark.slow
def test_torchscript_matches_eager(model, torchscript_file, images, other_sizes):
    exported = ExportedModel(torchscript_file)
    assert exported.input_shape == (3, None, None)
    for image in images + other_sizes:
        assert_matches_eager(model, exported, image, TOLERANCES["torchscript"])


@pytest.mark.slow
@pytest.mark.e2e
def test_onnx_matches_eager(model, onnx_file, images, other_sizes):
    pytest.importorskip("onnxruntime")
    exported = ExportedModel(onnx_file)
    assert exported.input_shape == (3, None, None)  # axes "height" and "width"
    for image in images + other_sizes:
        assert_matches_eager(model, exported, image, TOLERANCES["onnx"])


@pytest.mark.slow
@pytest.mark.e2e
def test_torch_export_matches_eager(cfg, model, torch_export_file, torch_exported, other_sizes):
    """The ExportedProgram, exported at 96 x 96, equals eager at sizes it was not exported at
    (square, landscape, portrait), and at the smallest it takes."""
    exported = torch_exported
    assert exported.input_shape == (3, None, None)
    assert exported.min_size == (TORCH_EXPORT_MIN_SIZE, TORCH_EXPORT_MIN_SIZE)
    smallest = sample_image(cfg, size=(TORCH_EXPORT_MIN_SIZE, 96), seed=3)
    assert smallest.shape == (3, TORCH_EXPORT_MIN_SIZE, 96)
    for image in other_sizes + [smallest]:
        assert_matches_eager(model, exported, image, TOLERANCES["torch_export"])
    # The file holds no pickle: no weight or constant marked use_pickle, and no sample inputs
    # (torch.export.save's: the sample may be a user's image).
    with zipfile.ZipFile(torch_export_file) as archive:
        for config in ("weights/model_weights_config", "constants/model_constants_config"):
            entries = json.loads(archive.read(f"archive/data/{config}.json"))["config"]
            assert entries and not any(entry["use_pickle"] for entry in entries.values())
        assert archive.read("archive/data/sample_inputs/model.pt") == b""
    # torch.export.load alone runs it too (torchvision imported: its ops are in the program): a
    # tuple in output_names' order.
    program = torch.export.load(str(torch_export_file))
    with torch.no_grad():
        outputs = program.module()(other_sizes[1])
    assert [tuple(output.shape) for output in outputs] == [
        (DETECTIONS, 4),
        (DETECTIONS,),
        (DETECTIONS, 1, 28, 28),
        (DETECTIONS,),
        (2,),
    ]
    with pytest.raises(ValueError, match=r"at least 65 x 65 pixels, got \(64, 96\)"):
        exported(torch.zeros(3, *SIZE, dtype=torch.uint8))


@pytest.mark.slow
@pytest.mark.e2e
def test_torch_export_runs_images_with_no_detection(model, torch_exported):
    """The number of detections is data-dependent, 0 included (torchvision's NMS fake kernel
    would have the program assert 2 or more boxes). The program exported on a sample with 20
    detections, given weights where no class scores above 0 (its threshold, a constant of the
    program; the weights are its inputs): the classes' logits at -inf, the background's kept."""
    name = "roi_heads.box_predictor.cls_score.bias"
    # The program's module holds the model's parameters under the adapter's names.
    biases = [
        model.get_parameter(name),
        torch_exported._module.get_parameter(f"adapter.model.{name}"),
    ]
    saved = biases[0].detach().clone()
    try:
        with torch.no_grad():
            for bias in biases:
                bias[:-1] = -math.inf
        for size in [(96, 96), (80, 120)]:
            image = torch.randint(0, 256, (3, *size), dtype=torch.uint8)
            actual = torch_exported(image)
            assert actual["pred_boxes"].shape == (0, 4)
            assert actual["pred_masks"].shape == (0, 1, 28, 28)
            assert max(max_differences(eager_outputs(model, image), actual).values()) == 0
    finally:
        with torch.no_grad():
            for bias in biases:
                bias.copy_(saved)


def test_torch_export_refuses_small_samples_and_tiled_layers(weights, tmp_path):
    cfg = load_config(CONFIG, OVERRIDES)
    model = build_model(cfg).eval()
    with pytest.raises(ValueError, match=r"at least 65 x 65 pixels.*\(64, 96\)"):
        export_model(
            model, torch.zeros(3, *SIZE, dtype=torch.uint8), tmp_path / "model.pt2", "torch_export"
        )
    tiled = build_model(load_config(CONFIG, OVERRIDES + ["MODEL.LAMBDA_RESNET.IMPL", "tiled"]))
    with pytest.raises(ValueError, match="impl 'tiled'"):
        export_model(
            tiled.eval(),
            torch.zeros(3, 96, 96, dtype=torch.uint8),
            tmp_path / "model.pt2",
            "torch_export",
        )
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_torch_export_names_a_model_that_holds_for_some_sizes_only(tmp_path):
    """AFT-conv windows are cut to the input's size: torch.export's constraint violation comes
    back as one ValueError naming the guard. (The backbone's guard: without the mask head, a
    shorter trace.)"""
    cfg = load_config(
        "aft_conv_r26_shapes",
        [
            "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER",
            "0.25",
            "MODEL.MASK_ON",
            "False",
            "MODEL.DEVICE",
            "cpu",
            "INPUT.MIN_SIZE_TEST",
            "96",
            "INPUT.MAX_SIZE_TEST",
            "96",
        ],
    )
    model = build_model(cfg).eval()
    with pytest.raises(
        ValueError,
        match="cannot take this model at every size from 65: Not all "
        "values of .* torchscript or onnx",
    ):
        export_model(
            model, sample_image(cfg, size=(96, 96)), tmp_path / "model.pt2", "torch_export"
        )
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_export_friendly_detectron2_computes_the_same_numbers(model, images, other_sizes):
    """Run eagerly, the export-only replacements give detectron2's outputs bit for bit, and
    leaving the block puts detectron2's own functions back (after an error too). Checked with
    detectron2 0.6 and main at 02b5c4e (each function's own test: tests/compat/)."""
    from detectron2.modeling.roi_heads import fast_rcnn
    from detectron2.structures import Boxes, ImageList

    from lambda_det.compat.torch_export import export_friendly_detectron2

    originals = (
        ImageList.__dict__["from_tensors"],
        Boxes.clip,
        torch.nn.functional.batch_norm,
        fast_rcnn.fast_rcnn_inference_single_image,
    )
    for image in images[:1] + other_sizes:
        expected = eager_outputs(model, image)
        with export_friendly_detectron2():
            assert Boxes.clip is not originals[1]
            actual = eager_outputs(model, image)
        assert sorted(actual) == sorted(expected)
        for name in expected:
            assert torch.equal(actual[name], expected[name]), name
    with pytest.raises(RuntimeError, match="inside"):
        with export_friendly_detectron2():
            raise RuntimeError("inside")
    assert (
        ImageList.__dict__["from_tensors"],
        Boxes.clip,
        torch.nn.functional.batch_norm,
        fast_rcnn.fast_rcnn_inference_single_image,
    ) == originals


@NEEDS_FAKE_KERNELS_STACK
def test_export_friendly_detectron2_takes_the_parameters_of_the_originals():
    """Each replacement accepts every parameter of the installed detectron2's function (by name
    too), and ImageList.from_tensors's padding_constraints of detectron2's main branch. Checked
    with detectron2 0.6 and main at 02b5c4e."""
    import inspect

    from detectron2.structures import ImageList

    from lambda_det.compat.torch_export import _REPLACEMENTS, export_friendly_detectron2

    for owner, name, replacement in _REPLACEMENTS:
        original = inspect.signature(getattr(owner, name))
        arguments = {
            parameter.name: None
            for parameter in original.parameters.values()
            if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        }
        if isinstance(replacement, staticmethod):
            replacement = replacement.__func__
        inspect.signature(replacement).bind(**arguments)  # TypeError: a parameter is missing
    image = torch.rand(3, 50, 70)
    expected = ImageList.from_tensors([image], 32)
    with export_friendly_detectron2():
        padded = ImageList.from_tensors([image], 0, padding_constraints={"size_divisibility": 32})
        square = ImageList.from_tensors([image], 32, 0.5, padding_constraints={"square_size": 80})
    assert torch.equal(padded.tensor, expected.tensor) and padded.image_sizes == [(50, 70)]
    assert square.tensor.shape == (1, 3, 96, 96) and square.image_sizes == [(50, 70)]
    assert torch.equal(square.tensor[0, :, :50, :70], image)
    assert (square.tensor[0, :, 50:] == 0.5).all() and (square.tensor[0, :, :, 70:] == 0.5).all()


@pytest.mark.parametrize("format", ["torchscript", ONNX, TORCH_EXPORT])
def test_metadata_maps_classes_to_category_ids(format, request):
    """<output>.json: the test dataset's category ids and names, the input and its resize."""
    if format == "onnx":
        pytest.importorskip("onnxruntime")
    path = request.getfixturevalue(f"{format}_file")
    metadata = json.loads(metadata_path(path).read_text())
    assert metadata["classes"] == SHAPES_CLASSES
    assert metadata["dataset"] == "lambda_det_shapes_val"
    assert metadata["dynamic_size"] is True and metadata["input_shape"] == [3, None, None]
    assert metadata["input_format"] == "BGR" and metadata["input_dtype"] == "uint8"
    assert metadata["test_resize"]["min_size"] == metadata["test_resize"]["max_size"] == 96
    if format == "torch_export":
        assert metadata["min_size"] == [TORCH_EXPORT_MIN_SIZE, TORCH_EXPORT_MIN_SIZE]
        assert "H >= 65 and W >= 65" in metadata["input_note"]
    else:
        assert "min_size" not in metadata
    assert metadata["output_names"] == [
        "pred_boxes",
        "pred_classes",
        "pred_masks",
        "scores",
        "image_size",
    ]
    exported = (
        request.getfixturevalue("torch_exported")
        if format == "torch_export"
        else ExportedModel(path)
    )
    assert exported.classes == SHAPES_CLASSES and exported.metadata == metadata


def test_class_table_inverts_the_dataset_ids():
    metadata = Metadata(
        thing_classes=["cat", "dog"], thing_dataset_id_to_contiguous_id={17: 0, 3: 1}
    )
    assert class_table(metadata, 2) == [
        {"index": 0, "id": 17, "name": "cat"},
        {"index": 1, "id": 3, "name": "dog"},
    ]
    # Without ids (a dataset not in COCO format), the id is the index, as in COCO results.
    assert class_table(Metadata(), 1) == [{"index": 0, "id": 0, "name": None}]


@pytest.mark.parametrize("format", ["torchscript", ONNX])
def test_exported_predictions_match_the_eager_model(format, model, images, request):
    """Final predictions at the original size: boxes rescaled and masks pasted, as eager mode."""
    if format == "onnx":
        pytest.importorskip("onnxruntime")
    exported = ExportedModel(request.getfixturevalue(f"{format}_file"))
    height, width = 2 * SIZE[0], 2 * SIZE[1]
    with torch.no_grad():
        expected = model([{"image": images[2], "height": height, "width": width}])[0]["instances"]
    predicted = outputs_to_instances(exported(images[2]), height, width)
    assert predicted.image_size == expected.image_size == (height, width)
    torch.testing.assert_close(
        predicted.pred_boxes.tensor, expected.pred_boxes.tensor, rtol=0, atol=2e-3
    )
    torch.testing.assert_close(predicted.scores, expected.scores, rtol=0, atol=1e-4)
    assert predicted.pred_masks.shape == expected.pred_masks.shape == (DETECTIONS, height, width)
    assert expected.pred_masks.any(dim=(1, 2)).all()  # the masks are not trivially empty
    # A pixel whose probability is within float error of the 0.5 threshold may flip.
    assert (predicted.pred_masks != expected.pred_masks).float().mean() < 1e-4


def test_exported_model_refuses_other_dtypes_and_ranks(torchscript_file):
    exported = ExportedModel(torchscript_file)
    with pytest.raises(ValueError, match="torch.float32"):
        exported(torch.zeros(3, *SIZE))
    with pytest.raises(ValueError, match=r"\(3, None, None\).*\(1, 3, 64, 96\)"):
        exported(torch.zeros(1, 3, *SIZE, dtype=torch.uint8))


@pytest.mark.slow
def test_tiled_lambda_layers_export_for_one_size(weights, tmp_path):
    """impl "tiled" lays its tiles out for the sample's size: the export is fixed to it, says so,
    and refuses other sizes with one clear error."""
    tiled_cfg = load_config(
        CONFIG, OVERRIDES + ["MODEL.WEIGHTS", weights, "MODEL.LAMBDA_RESNET.IMPL", "tiled"]
    )
    model = build_trained_model(tiled_cfg)
    path = tmp_path / "model.ts"
    image = sample_image(tiled_cfg, size=SIZE)
    traced = export_model(model, image, path, "torchscript", cfg=tiled_cfg)
    assert not traced.dynamic_size and "impl 'tiled'" in traced.fixed_size_reason
    metadata = json.loads(metadata_path(path).read_text())
    assert metadata["dynamic_size"] is False and metadata["input_shape"] == [3, *SIZE]
    assert "impl 'tiled'" in metadata["input_note"]
    exported = ExportedModel(path)
    assert exported.input_shape == (3, *SIZE)
    assert_matches_eager(model, exported, image, TOLERANCES["torchscript"])
    with pytest.raises(ValueError, match=r"\(3, 64, 96\).*\(3, 96, 64\)"):
        exported(torch.zeros(3, 96, 64, dtype=torch.uint8))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
@pytest.mark.filterwarnings("ignore:The feature will be removed")
@pytest.mark.filterwarnings("ignore:.*operator of advanced indexing")
@pytest.mark.parametrize("impl", ["einsum", "conv", "tiled"])
@pytest.mark.parametrize("scope", [3, None])
@pytest.mark.parametrize("stride", [1, 2])
def test_lambda_layer_exports_to_onnx(impl, scope, stride, tmp_path):
    pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    layer = LambdaLayer(
        16, 16, heads=4, dim_k=8, scope=scope, stride=stride, impl=impl, max_size=16
    ).eval()
    x = torch.randn(2, 16, 12, 10)
    path = tmp_path / "lambda.onnx"
    torch.onnx.export(layer, (x,), str(path), dynamo=False, opset_version=17)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(output), layer(x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("format", ["torchscript", "onnx", "torch_export"])
def test_retinanet_exports(format, tmp_path):
    if format == "onnx":
        pytest.importorskip("onnx")
        pytest.importorskip("onnxruntime")
    # torch.export takes sizes from 129 (P7's stride 128, + 1): a larger test size.
    size = (160, 160) if format == "torch_export" else SIZE
    cfg = load_config(
        "lambda_r101_retinanet",
        [
            "MODEL.LAMBDA_RESNET.DEPTH",
            "26",
            "MODEL.LAMBDA_RESNET.WIDTH_MULTIPLIER",
            "0.25",
            "MODEL.LAMBDA_RESNET.SCOPE",
            "3",
            "MODEL.FPN.OUT_CHANNELS",
            "32",
            # 2 convs in each subnet, not 4: the same code in a smaller program (loading a .pt2
            # takes time in proportion to its nodes); with 1, fewer than 20 boxes survive NMS.
            "MODEL.RETINANET.NUM_CONVS",
            "2",
            "MODEL.DEVICE",
            "cpu",
            "INPUT.MIN_SIZE_TEST",
            str(min(size)),
            "INPUT.MAX_SIZE_TEST",
            str(max(size)),
            "MODEL.RETINANET.SCORE_THRESH_TEST",
            "0.0",
            "TEST.DETECTIONS_PER_IMAGE",
            str(DETECTIONS),
        ],
    )
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():  # distinct scores: tied ones may come out in either order
        model.head.cls_score.weight.normal_(std=0.1)
        model.head.bbox_pred.weight.normal_(std=0.05)
    path = tmp_path / f"retinanet{FILE_SUFFIXES[format]}"
    traced = export_model(model, sample_image(cfg, size=size), path, format)
    assert traced.output_names == ("pred_boxes", "pred_classes", "scores", "image_size")
    image = sample_image(cfg, size=(size[0] - 20, size[1]), seed=1)  # another size
    assert image.shape[1:] != traced.sample.shape[1:]
    expected, actual = eager_outputs(model, image), ExportedModel(path)(image)
    assert actual["scores"].shape == (DETECTIONS,)
    assert torch.equal(actual["pred_classes"], expected["pred_classes"])
    for name, tolerance in TOLERANCES[format].items():
        if name != "pred_masks":
            torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=tolerance)


def test_bad_format_and_opset_are_named(tmp_path):
    cfg = load_config(CONFIG, OVERRIDES)
    model = build_model(cfg).eval()
    image = torch.zeros(3, *SIZE, dtype=torch.uint8)
    with pytest.raises(ValueError, match="'savedmodel'"):
        export_model(model, image, tmp_path / "model.pb", "savedmodel")
    with pytest.raises(ValueError, match="opset must be >= 16.*got 13"):
        export_model(model, image, tmp_path / "model.onnx", "onnx", opset=13)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "case",
    [
        "format",
        "missing weights",
        "empty weights",
        "wrong weights",
        "truncated weights",
        "missing sample",
        "small torch_export sample",
    ],
)
def test_tool_names_bad_input(case, weights, tmp_path, capsys):
    arguments = {
        "format": ["--format", "savedmodel"],
        "small torch_export sample": ["--format", "torch_export", "--sample-size", "64", "96"],
    }.get(case, ["--format", "torchscript"])
    arguments += ["--output", str(tmp_path / "model.ts")]
    if case == "missing sample":
        arguments += ["--sample-image", str(tmp_path / "no_such_image.png")]
    overrides = list(OVERRIDES)
    path = {"missing weights": str(tmp_path / "no_such_model.pth"), "empty weights": ""}.get(
        case, weights
    )
    if case == "wrong weights":  # the test set's 3 categories would be named first
        overrides += ["MODEL.ROI_HEADS.NUM_CLASSES", "5", "DATASETS.TEST", "()"]
    if case == "truncated weights":
        path = str(tmp_path / "truncated.pth")
        Path(path).write_bytes(Path(weights).read_bytes()[:1000])
    with pytest.raises(SystemExit) as exit_info:
        export_tool.main(["--config-file", CONFIG, *arguments, *overrides, "MODEL.WEIGHTS", path])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    expected = {
        "format": "'savedmodel'",
        "missing weights": "no_such_model.pth",
        "empty weights": "MODEL.WEIGHTS is empty",
        "wrong weights": "trained for 3 classes, but the model built from the config has 5",
        "truncated weights": "truncated.pth is truncated or corrupt",
        "missing sample": "no_such_image.png",
        "small torch_export sample": "must be at least 65 x 65 pixels",
    }[case]
    assert expected in error
    if case == "wrong weights":
        assert weights in error and "roi_heads.box_predictor.cls_score.weight" in error
    assert not (tmp_path / "model.ts").exists()


def test_max_differences_measures_each_output_on_its_scale():
    """Boxes as a fraction of the image's longer side (2 px of 200 is 0.01), scores and masks as
    probabilities, classes equal or not."""
    expected = {
        "pred_boxes": torch.tensor([[10.0, 10.0, 50.0, 60.0]]),
        "scores": torch.tensor([0.9]),
        "pred_classes": torch.tensor([1]),
        "pred_masks": torch.full((1, 1, 28, 28), 0.5),
        "image_size": torch.tensor([100, 200]),
    }
    actual = dict(expected, pred_boxes=expected["pred_boxes"] + 2, scores=torch.tensor([0.8]))
    differences = max_differences(expected, actual)
    assert differences == pytest.approx(
        {"pred_boxes": 0.01, "scores": 0.1, "pred_classes": 0.0, "pred_masks": 0.0,
         "image_size": 0.0}
    )  # fmt: skip
    assert max_differences(expected, dict(expected, pred_classes=torch.tensor([2])))[
        "pred_classes"
    ] == float("inf")


@pytest.mark.parametrize("case", ["compared", "below the threshold", "a detection lost"])
def test_the_export_check_counts_the_detections_it_compares(
    case, weights, tmp_path, capsys, monkeypatch
):
    """tools/export_model.py says how many detections it compared on each image; an image with
    none on either side passes only for the reason it names (every score below the
    threshold), and a lost detection fails."""
    threshold = {"below the threshold": "1.0"}.get(case, "0.0")
    if case == "a detection lost":
        run = ExportedModel.__call__

        def one_lost(self, image):
            return {
                name: value if name == "image_size" else value[1:]
                for name, value in run(self, image).items()
            }

        monkeypatch.setattr(ExportedModel, "__call__", one_lost)
    output = tmp_path / "model.ts"
    status = export_tool.main(
        ["--config-file", CONFIG, "--format", "torchscript", "--output", str(output)]
        + [*OVERRIDES, "MODEL.ROI_HEADS.SCORE_THRESH_TEST", threshold, "MODEL.WEIGHTS", weights]
    )
    out, err = capsys.readouterr()
    checks = [line for line in out.splitlines() if " on the sample" in line or " on a " in line]
    if case == "compared":
        assert status == 0 and len(checks) == 2, out
        assert all(re.match(r"\d+ detections compared on ", line) for line in checks), checks
        assert "pred_boxes" in checks[0] and "(of the image side)" in checks[0]
    elif case == "below the threshold":
        assert status == 0 and len(checks) == 2, out
        assert all(
            re.match(r"no detection to compare on .*: the eager model's best score there, "
                     r"(0\.\d+|1), is below its test score threshold 1$", line)
            for line in checks
        ), checks  # fmt: skip
        assert "warning: no detection was compared" in out
    else:
        assert status == 1
        assert re.fullmatch(
            r"error: the exported model finds (\d+) detections on the sample, the eager "
            r"model (\d+)\n", err
        ), err  # fmt: skip


def test_the_best_score_below_the_threshold_leaves_the_thresholds_as_they_were(model, images):
    predictor = model.roi_heads.box_predictor
    saved = predictor.test_score_thresh
    best, threshold = best_score_below_threshold(model, images[0])
    assert predictor.test_score_thresh == saved == threshold and 0 < best <= 1


def test_max_differences_flags_nan_and_mismatches():
    expected = {"scores": torch.tensor([0.5, 0.25]), "image_size": torch.tensor([4, 6])}
    assert max_differences(expected, dict(expected)) == {"image_size": 0.0, "scores": 0.0}
    differences = max_differences(expected, {"scores": torch.tensor([0.5, float("nan")])})
    assert math.isnan(differences["scores"]) and differences["image_size"] == float("inf")
    assert not all(value <= 1e-3 for value in differences.values())  # what export_model checks
