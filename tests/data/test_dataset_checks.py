"""Datasets: the pre-flight's catalogue of bad input, and COCO-format datasets named in the config
or on tools/train_net.py's command line (the README's "Your own dataset" example included)."""

import hashlib
import json
import math
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import (
    CONFIGS,
    LAZY_TINY_OVERRIDES,
    REPO_ROOT,
    TINY_BN_MODEL,
    assert_one_line_error,
    exit_status,
    overrides,
    subprocess_env,
)
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.detection_utils import read_image
from PIL import Image

import lambda_det
import lambda_det.data
from lambda_det.cli import check_dataset, lazyconfig_train_net, train_net
from lambda_det.data import build_mapper, register_coco_datasets
from lambda_det.data import checks as data_checks
from lambda_det.data.checks import (
    check_image_file,
    check_image_mode,
    check_images,
    check_num_classes,
    check_run_datasets,
    load_checked_dataset_dicts,
    load_dataset,
    read_checked_image,
    segmentation_problem,
    yaml_data_settings,
    yaml_num_classes,
)
from lambda_det.engine import Trainer
from lambda_det.run_config import load_config
from lambda_det.utils.errors import UserError

lambda_det.data.register_datasets()  # the bundled datasets, by name: importing registers none

TINY = {
    **TINY_BN_MODEL,
    "SOLVER.IMS_PER_BATCH": 2,
    "SOLVER.WARMUP_ITERS": 1,
    "SOLVER.STEPS": (1,),
    "SOLVER.MAX_ITER": 2,
    "DATALOADER.NUM_WORKERS": 0,
    "MODEL.RPN.POST_NMS_TOPK_TEST": 50,
    "TEST.DETECTIONS_PER_IMAGE": 20,
}
TINY_ARGS = overrides(TINY)
CATEGORIES = [{"id": 1, "name": "box"}, {"id": 2, "name": "disc"}]


def write_dataset(folder: Path, count: int = 3, suffix: str = ".png", annotate=None) -> Path:
    """``folder/images/*`` and ``folder/instances.json``: ``count`` 48 x 64 images with one
    24 x 16 box each (category 1); ``annotate(annotation)`` may change each annotation."""
    images_dir = folder / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    images, annotations = [], []
    for image_id in range(1, count + 1):
        name = f"{image_id:03d}{suffix}"
        cv2.imwrite(str(images_dir / name), rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
        images.append({"id": image_id, "file_name": name, "height": 48, "width": 64})
        annotation = {
            "id": image_id,
            "image_id": image_id,
            "category_id": 1,
            "iscrowd": 0,
            "bbox": [8.0, 8.0, 24.0, 16.0],
            "area": 384.0,
            "segmentation": [[8, 8, 32, 8, 32, 24, 8, 24]],
        }
        if annotate is not None:
            annotate(annotation)
        annotations.append(annotation)
    path = folder / "instances.json"
    path.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": CATEGORIES})
    )
    return path


@pytest.fixture
def register(request):
    """Registers [name, json, images] triples through DATASETS.COCO_INSTANCES under names unique
    to the test; removes them afterwards. Returns the config that names them."""
    registered = []

    def register_triples(*triples, **changes):
        cfg = lambda_det.get_cfg()
        cfg.merge_from_file(str(CONFIGS / "Demo/lambda_r26_shapes.yaml"))
        cfg.merge_from_list(overrides({**TINY, **changes}))
        cfg.DATASETS.COCO_INSTANCES = [
            [name, str(json_file), str(images)] for name, json_file, images in triples
        ]
        registered.extend(name for name, _, _ in triples if name not in DatasetCatalog.list())
        names = register_coco_datasets(cfg)
        cfg.DATASETS.TRAIN = (names[0],)
        cfg.DATASETS.TEST = ()
        return cfg

    yield register_triples
    for name in registered:
        if name in DatasetCatalog.list():
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)


def one_dataset(register, folder: Path, **changes):
    return register(
        ("lambda_det_test_own", folder / "instances.json", folder / "images"), **changes
    )


# ---- the annotation file ----


def test_annotation_file_that_is_not_json_names_file_and_position(tmp_path, register):
    path = write_dataset(tmp_path)
    path.write_text('{"images": [],\n  , "annotations": []}')  # a stray comma on line 2
    cfg = one_dataset(register, tmp_path)
    with pytest.raises(
        ValueError,
        match=rf"annotation file {re.escape(str(path))} \(dataset "
        r"'lambda_det_test_own'\) is not valid JSON \(Expecting "
        r".*: line 2 column 3 \(char 17\)\): fix the file",
    ):
        check_run_datasets(yaml_data_settings(cfg))
    path.write_bytes(b"\x89PNG\r\n\x1a\n")  # an image given in place of the JSON
    with pytest.raises(
        ValueError,
        match=rf"{re.escape(str(path))} .* is not valid JSON \(byte 0 "
        r"is not UTF-8 text\)",
    ):
        check_run_datasets(yaml_data_settings(cfg))


def test_unknown_category_id_names_file_and_id(tmp_path, register):
    write_dataset(tmp_path, annotate=lambda annotation: annotation.update(category_id=7))
    cfg = one_dataset(register, tmp_path)
    with pytest.raises(
        ValueError,
        match=r"instances.json\): an annotation has category_id=7, "
        r"which is not among the ids of the file's categories "
        r"\[1, 2\]",
    ):
        check_run_datasets(yaml_data_settings(cfg))


@pytest.mark.parametrize("raised", [KeyError("a new wording"), AssertionError("new"), ValueError()])
def test_a_loader_error_is_explained_by_the_data_not_its_wording(
    tmp_path, register, monkeypatch, raised
):
    write_dataset(tmp_path, annotate=lambda annotation: annotation.update(category_id=7))
    name = one_dataset(register, tmp_path).DATASETS.TRAIN[0]

    def load(_name):
        raise raised

    monkeypatch.setattr(DatasetCatalog, "get", load)  # detectron2 worded its error otherwise
    with pytest.raises(ValueError, match=r"an annotation has category_id=7, which is not among"):
        load_dataset(name)


def test_annotation_file_without_categories_or_images_says_so(tmp_path, register):
    path = write_dataset(tmp_path)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "categories": []}))
    cfg = one_dataset(register, tmp_path)
    with pytest.raises(
        ValueError,
        match=r"instances.json\) has no categories: list them under "
        r"\"categories\"",
    ):
        check_run_datasets(yaml_data_settings(cfg))
    path.write_text(json.dumps({**data, "images": [], "annotations": []}))
    cfg = register(("lambda_det_test_no_images", path, tmp_path / "images"))  # fresh metadata
    with pytest.raises(ValueError, match=r"instances.json\) has no images"):
        check_run_datasets(yaml_data_settings(cfg))


@pytest.mark.parametrize(
    "problem,reason",
    [
        ("empty", r"of 3 images, 3 without annotations"),
        ("crowd", r"of 3 images, 3 with only crowd annotations"),
    ],
)
def test_dataset_with_nothing_to_train_on_says_why(tmp_path, register, problem, reason):
    path = write_dataset(tmp_path, annotate=lambda annotation: annotation.update(iscrowd=1))
    if problem == "empty":
        data = json.loads(path.read_text())
        data["annotations"] = []
        path.write_text(json.dumps(data))
    cfg = one_dataset(register, tmp_path)
    for filter_empty in (True, False):
        with pytest.raises(
            ValueError, match=rf"no image has an annotation to train on \({reason}\)"
        ):
            load_checked_dataset_dicts(cfg.DATASETS.TRAIN, filter_empty=filter_empty)


def test_one_usable_annotation_is_enough(tmp_path, register):
    path = write_dataset(tmp_path, annotate=lambda annotation: annotation.update(iscrowd=1))
    data = json.loads(path.read_text())
    data["annotations"][1]["iscrowd"] = 0
    path.write_text(json.dumps(data))
    cfg = one_dataset(register, tmp_path)
    dicts = load_checked_dataset_dicts(cfg.DATASETS.TRAIN)
    assert [Path(record["file_name"]).name for record in dicts] == ["002.png"]  # as detectron2


def test_class_count_mismatch_names_both_numbers_and_the_override(tmp_path, register):
    write_dataset(tmp_path / "a")
    cfg = one_dataset(register, tmp_path / "a", **{"MODEL.ROI_HEADS.NUM_CLASSES": 3})
    with pytest.raises(
        ValueError,
        match=r"MODEL.ROI_HEADS.NUM_CLASSES is 3, but dataset "
        r"'lambda_det_test_own' .* has 2 categories: add "
        r"'MODEL.ROI_HEADS.NUM_CLASSES 2' to the command line",
    ):
        check_run_datasets(yaml_data_settings(cfg))
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = 2
    check_run_datasets(yaml_data_settings(cfg))
    cfg.MODEL.META_ARCHITECTURE = "RetinaNet"  # RetinaNet counts its classes elsewhere
    cfg.MODEL.RETINANET.NUM_CLASSES = 80
    with pytest.raises(
        ValueError,
        match=r"MODEL.RETINANET.NUM_CLASSES is 80, but .* has 2 "
        r"categories",
    ):
        check_num_classes(yaml_num_classes(cfg), cfg.DATASETS.TRAIN)


def test_a_name_registered_twice_with_other_files_is_refused(tmp_path, register):
    write_dataset(tmp_path / "a")
    write_dataset(tmp_path / "b")
    entry = ("lambda_det_test_twice", tmp_path / "a/instances.json", tmp_path / "a/images")
    register(entry)
    register(entry)  # the same files again: nothing to do
    with pytest.raises(
        ValueError,
        match=r"dataset name 'lambda_det_test_twice' .* is already "
        r"registered with annotation file .*a/instances.json .* "
        r"not .*b/instances.json .* give this dataset another",
    ):
        register(("lambda_det_test_twice", tmp_path / "b/instances.json", tmp_path / "b/images"))
    with pytest.raises(
        ValueError,
        match=r"dataset name 'coco_2017_train' .* is already "
        r"registered",
    ):  # one of detectron2's builtin names
        register(("coco_2017_train", tmp_path / "a/instances.json", tmp_path / "a/images"))
    cfg = lambda_det.get_cfg()
    cfg.DATASETS.COCO_INSTANCES = [["only_a_name", "x.json"]]
    with pytest.raises(ValueError, match=r"\[name, json_file, image_root\] .* got \['only_a_"):
        register_coco_datasets(cfg)


def test_a_config_names_the_coco_datasets_the_tools_register(tmp_path, register):
    write_dataset(tmp_path)
    config = tmp_path / "own.yaml"
    config.write_text(
        f"_BASE_: {CONFIGS / 'Demo/lambda_r26_shapes.yaml'}\n"
        f"DATASETS:\n  COCO_INSTANCES: [['lambda_det_test_from_config', "
        f"'{tmp_path / 'instances.json'}', '{tmp_path / 'images'}']]\n"
        f"  TRAIN: ('lambda_det_test_from_config',)\n"
    )
    cfg = load_config(str(config), ["MODEL.ROI_HEADS.NUM_CLASSES", "2", "DATASETS.TEST", "()"])
    assert cfg.DATASETS.COCO_INSTANCES == [
        ["lambda_det_test_from_config", str(tmp_path / "instances.json"), str(tmp_path / "images")]
    ]
    assert "lambda_det_test_from_config" not in DatasetCatalog.list()  # loading registers none
    register(*cfg.DATASETS.COCO_INSTANCES)  # as the tools do; removed after the test
    assert MetadataCatalog.get("lambda_det_test_from_config").json_file == str(
        tmp_path / "instances.json"
    )
    check_run_datasets(yaml_data_settings(cfg))
    assert len(DatasetCatalog.get("lambda_det_test_from_config")) == 3


def edit_json(path: Path, edit) -> Path:
    """``edit(data)`` applied to the annotation file at ``path``."""
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def test_an_image_id_given_twice_is_named_with_both_files(tmp_path, register):
    def same_id(data):  # 002.png takes 001.png's id, its annotation too
        data["images"][1]["id"] = data["annotations"][1]["image_id"] = 1

    path = edit_json(write_dataset(tmp_path), same_id)
    cfg = one_dataset(register, tmp_path, **{"MODEL.ROI_HEADS.NUM_CLASSES": 2})
    dicts = DatasetCatalog.get("lambda_det_test_own")  # detectron2 reads it without a word:
    assert [Path(record["file_name"]).name for record in dicts] == ["002.png", "003.png"]
    assert len(dicts[0]["annotations"]) == 2  # 001.png's box on 002.png
    with pytest.raises(
        ValueError,
        match=rf"annotation file {re.escape(str(path))}\): image id 1 "
        r"is used twice, by images '001.png' and '002.png': "
        r"give each image its own id",
    ):
        check_run_datasets(yaml_data_settings(cfg))
    cfg.DATASETS.TRAIN, cfg.DATASETS.TEST = (), ("lambda_det_test_own",)
    with pytest.raises(ValueError, match=r"image id 1 is used twice"):  # a test set as well
        check_run_datasets(yaml_data_settings(cfg), training=False)


@pytest.mark.parametrize("file_name", ["instances.json", "minival.json"])
def test_an_annotation_or_category_id_given_twice_is_named(tmp_path, register, file_name):
    """detectron2 refuses repeated annotation ids without naming one, and accepts them in a
    file whose path holds "minival"; pycocotools keeps one of two categories of one id."""
    path = write_dataset(tmp_path)
    path = path.rename(tmp_path / file_name)
    edit_json(path, lambda data: data["annotations"][2].update(id=2))
    cfg = register(
        ("lambda_det_test_ids", path, tmp_path / "images"), **{"MODEL.ROI_HEADS.NUM_CLASSES": 2}
    )
    with pytest.raises(
        ValueError,
        match=rf"{file_name}\): annotation id 2 is used twice, by "
        r"annotations of image ids 2 and 3: give each "
        r"annotation its own id",
    ):
        check_run_datasets(yaml_data_settings(cfg))
    edit_json(path, lambda data: data["annotations"][2].update(id=3))
    check_run_datasets(yaml_data_settings(cfg))
    edit_json(path, lambda data: data["categories"][1].update(id=1))
    cfg = register(
        ("lambda_det_test_category_ids", path, tmp_path / "images"),  # new metadata
        **{"MODEL.ROI_HEADS.NUM_CLASSES": 2},
    )
    with pytest.raises(
        ValueError,
        match=r"category id 1 is used twice, by categories 'box' and "
        r"'disc'",
    ):
        check_run_datasets(yaml_data_settings(cfg))


def check_dataset_errors(register, folder: Path, capsys, name: str):
    """tools/check_dataset.py on the dataset of ``folder`` registered as ``name`` (removed after
    the test), which it refuses with exit status 2: the dataset's triple and the stderr lines."""
    triple = [name, str(folder / "instances.json"), str(folder / "images")]
    register(triple)
    with pytest.raises(SystemExit) as caught:
        check_dataset.main(["--coco-dataset", *triple, triple[0]])
    assert caught.value.code == 2
    return triple, capsys.readouterr().err.splitlines()


def test_check_dataset_tool_names_a_repeated_image_id(tmp_path, register, capsys):
    edit_json(write_dataset(tmp_path), lambda data: data["images"][2].update(id=2))
    triple, errors = check_dataset_errors(register, tmp_path, capsys, "lambda_det_test_tool_ids")
    assert errors == [
        f"error: dataset 'lambda_det_test_tool_ids' (annotation file {triple[1]}): image id 2 "
        f"is used twice, by images '002.png' and '003.png': give each image its own id "
        f"(pycocotools keeps only one of them)"
    ]


BAD_BOXES = {
    "NaN": (
        [float("nan"), 8.0, 24.0, 16.0],
        r"bbox=\[nan, 8.0, 24.0, 16.0\], not 4 finite "
        r"numbers",
    ),
    "inf": ([8.0, 8.0, float("inf"), 16.0], r"bbox=\[8.0, 8.0, inf, 16.0\], not 4 finite numbers"),
    "negative width": (
        [8.0, 8.0, -24.0, 16.0],
        r"a box of negative size, bbox=\[8.0, 8.0, -24.0, 16.0\] \(XYWH_ABS\)",
    ),
}


@pytest.mark.parametrize("problem", BAD_BOXES)
def test_a_bad_box_is_named_with_dataset_image_and_annotation_in_test_sets_too(
    tmp_path, register, problem
):
    box, message = BAD_BOXES[problem]
    edit_json(write_dataset(tmp_path), lambda data: data["annotations"][1].update(bbox=box))
    cfg = one_dataset(register, tmp_path, **{"MODEL.ROI_HEADS.NUM_CLASSES": 2})
    named = (
        rf"dataset 'lambda_det_test_own', image id 2 \(.*images/002.png\), annotation 1 of "
        rf"1 has {message}: fix or remove the annotation"
    )
    with pytest.raises(ValueError, match=named):
        check_run_datasets(yaml_data_settings(cfg))
    cfg.DATASETS.TRAIN, cfg.DATASETS.TEST = (), ("lambda_det_test_own",)
    assert len(load_dataset("lambda_det_test_own")) == 3  # what evaluation reads, unchecked
    with pytest.raises(ValueError, match=named):
        check_run_datasets(yaml_data_settings(cfg), training=False)


def eval_only_command(triple) -> list:
    """The demo config's evaluation of the registered 2-class dataset ``triple``."""
    options = ["--config", "lambda_r26_shapes", "--eval-only", "--coco-dataset", *triple]
    return options + overrides(
        {"MODEL.ROI_HEADS.NUM_CLASSES": 2, "DATASETS.TEST": f"('{triple[0]}',)"}
    )


def eval_only_errors(tmp_path, triple, capsys) -> list:
    """The ``error:`` lines of tools/train_net.py --eval-only on the registered dataset
    ``triple``, which it refuses before it starts: exit status 2, no OUTPUT_DIR made."""
    output_dir = tmp_path / "eval"
    with pytest.raises(SystemExit) as caught:
        train_net.main(
            [
                *eval_only_command(triple),
                *TINY_ARGS,
                "MODEL.WEIGHTS",
                str(tmp_path / "model.pth"),
                "OUTPUT_DIR",
                str(output_dir),
            ]
        )
    assert caught.value.code == 2
    assert not output_dir.exists()
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_eval_only_refuses_a_nan_box_in_its_test_set_before_it_starts(tmp_path, register, capsys):
    edit_json(
        write_dataset(tmp_path),
        lambda data: data["annotations"][2].update(bbox=[8, 8, float("nan"), 16]),
    )
    triple = ["lambda_det_test_eval", str(tmp_path / "instances.json"), str(tmp_path / "images")]
    register(triple)  # removed after the test
    assert eval_only_errors(tmp_path, triple, capsys) == [
        f"error: dataset 'lambda_det_test_eval', image id 3 ({tmp_path}/images/"
        f"003.png), annotation 1 of 1 has bbox=[8, 8, nan, 16], not 4 finite "
        f"numbers: fix or remove the annotation"
    ]


def test_a_test_set_named_twice_or_a_list_in_place_of_a_name_is_refused(tmp_path, register):
    write_dataset(tmp_path)
    cfg = one_dataset(register, tmp_path)
    for test, message in (
        (("lambda_det_test_own",) * 2, "names 'lambda_det_test_own' more than once"),
        ((("lambda_det_test_own",),), "holds ('lambda_det_test_own',), not a dataset name"),
    ):
        cfg.DATASETS.TEST = test
        with pytest.raises(UserError, match=rf"^DATASETS.TEST {re.escape(message)}"):
            check_run_datasets(yaml_data_settings(cfg), training=False)
    cfg.DATASETS.TEST, cfg.DATASETS.TRAIN = (), (("lambda_det_test_own",),)
    with pytest.raises(UserError, match=r"^DATASETS.TRAIN holds \('lambda_det_test_own',\)"):
        check_run_datasets(yaml_data_settings(cfg))


def test_a_test_set_named_twice_is_evaluated_twice_without_the_check(
    tmp_path, register, monkeypatch
):
    """The negative control: the rest of the pre-flight reads it twice, as evaluation would."""
    write_dataset(tmp_path)
    cfg = one_dataset(register, tmp_path, **{"MODEL.ROI_HEADS.NUM_CLASSES": 2})
    cfg.DATASETS.TEST = ("lambda_det_test_own",) * 2
    monkeypatch.setattr(data_checks, "_check_dataset_names", lambda names, once=False: None)
    checked = check_run_datasets(yaml_data_settings(cfg), training=False)
    assert [checked_set.images for checked_set in checked] == [3, 3]


def test_eval_only_refuses_a_test_set_named_twice_before_it_starts(tmp_path, register, capsys):
    write_dataset(tmp_path)
    triple = ["lambda_det_test_twice", str(tmp_path / "instances.json"), str(tmp_path / "images")]
    register(triple)
    output_dir = tmp_path / "eval"
    twice = ["DATASETS.TEST", f"('{triple[0]}', '{triple[0]}')"]
    for tool in (train_net, check_dataset):
        argv = [*eval_only_command(triple), *TINY_ARGS, *twice, "OUTPUT_DIR", str(output_dir)]
        with pytest.raises(SystemExit) as caught:
            tool.main(argv)
        assert caught.value.code == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line]
        assert errors == [
            f"error: DATASETS.TEST names '{triple[0]}' more than once: name each test set once"
        ]
        assert not output_dir.exists()
    with pytest.raises(SystemExit) as caught:
        lazyconfig_train_net.main(
            [
                "--config",
                "lambda_r26_shapes",
                "--eval-only",
                *LAZY_TINY_OVERRIDES,
                "dataloader.test.dataset.names=[a,a]",
                f"train.output_dir={output_dir}",
            ]
        )
    assert caught.value.code == 2
    assert "dataloader.test.dataset.names names 'a' more than once" in capsys.readouterr().err
    assert not output_dir.exists()


def test_lazyconfig_tool_checks_its_test_set_boxes(tmp_path, register, capsys):
    write_dataset(tmp_path / "train")
    edit_json(
        write_dataset(tmp_path / "test"),
        lambda data: data["annotations"][0].update(bbox=[8, 8, 24, float("inf")]),
    )
    triples = [
        [
            "lambda_det_test_lazy_train",
            str(tmp_path / "train/instances.json"),
            str(tmp_path / "train/images"),
        ],
        [
            "lambda_det_test_lazy_test",
            str(tmp_path / "test/instances.json"),
            str(tmp_path / "test/images"),
        ],
    ]
    register(*triples)
    with pytest.raises(SystemExit) as caught:
        lazyconfig_train_net.main(
            [
                "--config",
                "lambda_r26_shapes",
                *[item for triple in triples for item in ("--coco-dataset", *triple)],
                "dataloader.train.dataset.names=[lambda_det_test_lazy_train]",
                "dataloader.test.dataset.names=lambda_det_test_lazy_test",
                "model.roi_heads.num_classes=2",
                f"train.output_dir={tmp_path / 'run'}",
            ]
        )
    assert caught.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.match(
        r"error: dataset 'lambda_det_test_lazy_test', image id 1 "
        r".* has bbox=\[8, 8, 24, inf\]",
        errors[0],
    ), errors


# ---- segmentations, image ids and annotations as the COCO file writes them ----


def set_polygon_value(index, value):
    def edit(data):
        data["annotations"][1]["segmentation"][0][index] = value

    return edit


# How each annotation file is damaged (annotation id 2 of image id 2, or every image id), and
# what the check says after the dataset is named.
BAD_COCO_FILES = {
    "NaN polygon coordinate": (
        set_polygon_value(2, float("nan")),
        r"annotation id 2 of image id 2 \(002.png\) has a polygon with the "
        r"value nan, not a finite number: fix or remove the annotation",
    ),
    "inf polygon coordinate": (
        set_polygon_value(5, float("inf")),
        r"annotation id 2 of image id 2 \(002.png\) has a polygon with the "
        r"value inf, not a finite number",
    ),
    "polygon of 4 values": (
        lambda data: data["annotations"][1].update(segmentation=[[8, 8, 32, 8]]),
        r"annotation id 2 of image id 2 \(002.png\) has a polygon of 4 "
        r"values, not 3 or more x, y pairs \(an even number, 6 or more\): fix "
        r"or remove the annotation",
    ),
    "polygon of 7 values": (
        lambda data: data["annotations"][1].update(
            segmentation=[[8, 8, 32, 8, 32, 24], [8, 8, 32, 8, 32, 24, 8]]
        ),
        r"annotation id 2 of image id 2 \(002.png\) has a polygon of 7 "
        r"values",
    ),
    "RLE of another size": (
        lambda data: data["annotations"][1].update(
            segmentation={"size": [10, 10], "counts": [0, 100]}
        ),
        r"annotation id 2 of image id 2 \(002.png\) has an RLE mask of size "
        r"\[10, 10\] \(height, width\), not its image's \[48, 64\]: fix or "
        r"remove the annotation",
    ),
    "annotation of an unknown image": (
        lambda data: data["annotations"][1].update(image_id=99),
        r"annotation id 2 has image_id 99, which no image of the "
        r"file has \(detectron2 drops such annotations\): set it "
        r"to the id of its image, or remove the annotation",
    ),
    "string image ids": (
        lambda data: (
            [entry.update(id=str(entry["id"])) for entry in data["images"]]
            + [entry.update(image_id=str(entry["image_id"])) for entry in data["annotations"]]
        ),
        r"image '001.png' has id '1', not an integer: give each image an integer "
        r"id \(COCO's format\), and its annotations that image_id",
    ),
}


@pytest.mark.parametrize("problem", BAD_COCO_FILES)
def test_a_coco_file_that_detectron2_reads_wrongly_is_named_in_training_and_test_sets(
    tmp_path, register, problem
):
    edit, message = BAD_COCO_FILES[problem]
    path = edit_json(write_dataset(tmp_path), edit)
    cfg = one_dataset(register, tmp_path, **{"MODEL.ROI_HEADS.NUM_CLASSES": 2})
    load_dataset("lambda_det_test_own")  # detectron2 reads it without a word
    named = rf"^dataset 'lambda_det_test_own' \(annotation file {re.escape(str(path))}\): {message}"
    with pytest.raises(ValueError, match=named):
        check_run_datasets(yaml_data_settings(cfg))
    cfg.DATASETS.TRAIN, cfg.DATASETS.TEST = (), ("lambda_det_test_own",)
    with pytest.raises(ValueError, match=named):
        check_run_datasets(yaml_data_settings(cfg), training=False)


@pytest.mark.parametrize("problem", ["NaN polygon coordinate", "RLE of another size"])
def test_the_trainer_refuses_what_detectron2_keeps_of_a_bad_segmentation(
    tmp_path, register, problem
):
    """What detectron2's loader keeps (a NaN polygon, an RLE of another size) is named by the
    records' own check, the one the trainer runs without the pre-flight."""
    edit, _ = BAD_COCO_FILES[problem]
    edit_json(write_dataset(tmp_path), edit)
    cfg = one_dataset(register, tmp_path, **{"MODEL.ROI_HEADS.NUM_CLASSES": 2})
    problem_text = BAD_COCO_FILES[problem][1].split(" has ", 1)[1]  # the same words
    with pytest.raises(
        ValueError,
        match=rf"dataset 'lambda_det_test_own', image id 2 \(.*/images/"
        rf"002.png\), annotation 1 of 1 has {problem_text}",
    ):
        Trainer.build_train_loader(cfg)


def test_segmentation_problems_of_records_from_any_loader():
    assert segmentation_problem([[8, 8, 32, 8, 32, 24]], 48, 64) is None
    assert segmentation_problem({"size": [48, 64], "counts": "xyz"}, 48, 64) is None
    assert segmentation_problem([[1e308, 1e308, 1e308, 0, 0, 0]]) is None  # an infinite sum
    assert segmentation_problem([[8, 8, "x", 8, 32, 24]]) == (
        "a polygon with the value 'x', not a finite number"
    )
    assert segmentation_problem([8, 8, 32, 8, 32, 24]) == (
        "a polygon 8 that is not a list of x, y values"
    )
    assert segmentation_problem("8 8 32 8") == (
        "a segmentation of type str, neither a list of polygons nor an RLE mask"
    )


EVALUATION_FIX = (
    r"so COCO evaluation would report AP nan: add non-crowd annotations \(iscrowd "
    r"0\), or leave the dataset out of DATASETS.TEST \(tools/predict.py predicts "
    r"on its images\)"
)


def evaluated_box_ap(name: str) -> float:
    """The box AP of detectron2's COCOEvaluator for one detection on image 1 of ``name``."""
    from detectron2.evaluation import COCOEvaluator
    from detectron2.structures import Boxes, Instances

    evaluator = COCOEvaluator(name, tasks=("bbox",), distributed=False)
    evaluator.reset()
    detection = Instances(
        (48, 64),
        pred_boxes=Boxes(torch.tensor([[8.0, 8.0, 32.0, 24.0]])),
        scores=torch.tensor([0.9]),
        pred_classes=torch.tensor([0]),
    )
    evaluator.process([{"image_id": 1}], [{"instances": detection}])
    return evaluator.evaluate()["bbox"]["AP"]


@pytest.mark.parametrize(
    "annotations,reason",
    [("none", "3 without annotations"), ("only crowd", "3 with only crowd annotations")],
)
def test_a_test_set_without_annotations_to_evaluate_against_is_refused(
    tmp_path, register, annotations, reason
):
    def edit(data):
        if annotations == "none":
            data["annotations"] = []
        else:
            for annotation in data["annotations"]:
                annotation["iscrowd"] = 1

    edit_json(write_dataset(tmp_path), edit)
    cfg = one_dataset(register, tmp_path, **{"MODEL.ROI_HEADS.NUM_CLASSES": 2})
    assert math.isnan(evaluated_box_ap("lambda_det_test_own"))  # what evaluation would report
    cfg.DATASETS.TRAIN, cfg.DATASETS.TEST = (), ("lambda_det_test_own",)
    with pytest.raises(
        ValueError,
        match=rf"\(annotation file .*\): no image has an annotation to "
        rf"evaluate against \(of 3 images, {reason}\), "
        rf"{EVALUATION_FIX}",
    ):
        check_run_datasets(yaml_data_settings(cfg), training=False)


def test_a_test_set_whose_file_lists_no_annotations_is_predicted_on(tmp_path, register):
    """COCO test-dev's files list no annotations: detectron2 writes the predictions only."""
    edit_json(write_dataset(tmp_path), lambda data: data.pop("annotations"))
    cfg = one_dataset(register, tmp_path, **{"MODEL.ROI_HEADS.NUM_CLASSES": 2})
    cfg.DATASETS.TRAIN, cfg.DATASETS.TEST = (), ("lambda_det_test_own",)
    checked = check_run_datasets(yaml_data_settings(cfg), training=False)
    assert [(checked_set.images, checked_set.annotations) for checked_set in checked] == [(3, 0)]


@pytest.mark.slow
def test_eval_only_refuses_a_test_set_without_annotations_before_it_starts(
    tmp_path, register, capsys
):
    edit_json(write_dataset(tmp_path), lambda data: data.update(annotations=[]))
    triple = [
        "lambda_det_test_eval_empty",
        str(tmp_path / "instances.json"),
        str(tmp_path / "images"),
    ]
    register(triple)  # removed after the test
    errors = eval_only_errors(tmp_path, triple, capsys)
    assert len(errors) == 1 and re.fullmatch(
        rf"error: dataset '{triple[0]}' \(annotation file {re.escape(triple[1])}\): no image has "
        rf"an annotation to evaluate against \(of 3 images, 3 without annotations\), "
        rf"{EVALUATION_FIX}",
        errors[0],
    ), errors


@pytest.mark.e2e
@pytest.mark.parametrize("problem", BAD_COCO_FILES)
def test_check_dataset_tool_names_each_bad_coco_file_in_one_line(
    tmp_path, register, capsys, problem
):
    edit, message = BAD_COCO_FILES[problem]
    edit_json(write_dataset(tmp_path), edit)
    triple, errors = check_dataset_errors(register, tmp_path, capsys, "lambda_det_test_tool_file")
    assert len(errors) == 1 and re.fullmatch(
        rf"error: dataset '{triple[0]}' \(annotation file {re.escape(triple[1])}\): {message}.*",
        errors[0],
    ), errors


# ---- what training requires: one decision for the trainer and tools/check_dataset.py ----


@pytest.mark.e2e
def test_check_dataset_reports_each_set_with_what_training_drops(tmp_path, register, capsys):
    """One dataset as both training and test set, one image without annotations and one with
    only a crowd annotation: training drops both (and says why), the test set has all four."""

    def unusable(data):
        data["annotations"] = [a for a in data["annotations"] if a["image_id"] != 1]
        data["annotations"][0]["iscrowd"] = 1  # image 2's only annotation

    edit_json(write_dataset(tmp_path, count=4), unusable)
    triple = ["lambda_det_test_sets", str(tmp_path / "instances.json"), str(tmp_path / "images")]
    register(triple, **{"MODEL.ROI_HEADS.NUM_CLASSES": 2})
    run = ["--config", "lambda_r26_shapes", "--coco-dataset", *triple, *TINY_ARGS]
    run += ["MODEL.ROI_HEADS.NUM_CLASSES", "2", "MODEL.MASK_ON", "False"]
    run += ["DATASETS.TRAIN", f"('{triple[0]}',)", "DATASETS.TEST", f"('{triple[0]}',)"]
    assert check_dataset.main(run) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "  training set lambda_det_test_sets: 2 images, 2 annotations; 2 images dropped "
        "(1 without annotations, 1 with only crowd annotations)",
        "  test set lambda_det_test_sets: 4 images, 3 annotations",
    ]


@pytest.mark.e2e
def test_check_dataset_with_a_config_requires_what_training_requires(tmp_path, register, capsys):
    write_dataset(tmp_path, annotate=lambda annotation: annotation.pop("segmentation"))
    triple = ["lambda_det_test_masks", str(tmp_path / "instances.json"), str(tmp_path / "images")]
    cfg = register(triple, **{"MODEL.ROI_HEADS.NUM_CLASSES": 2})
    run = [
        "--config",
        "lambda_r26_shapes",
        "--coco-dataset",
        *triple,
        *TINY_ARGS,
        "MODEL.ROI_HEADS.NUM_CLASSES",
        "2",
        "DATASETS.TRAIN",
        f"('{triple[0]}',)",
        "DATASETS.TEST",
        "()",
    ]
    missing = (
        f"dataset '{triple[0]}', image id 1 ({tmp_path}/images/001.png), annotation 1 of "
        f"1 has no 'segmentation': add it, or train without masks (MODEL.MASK_ON False)"
    )
    tool = check_dataset
    with pytest.raises(SystemExit) as caught:
        tool.main(run)  # the demo trains masks
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {missing}"]
    assert cfg.MODEL.MASK_ON
    with pytest.raises(ValueError) as refused:  # and so does training, in the same words
        Trainer.build_train_loader(cfg)
    assert str(refused.value) == missing
    assert tool.main([*run, "MODEL.MASK_ON", "False"]) == 0  # boxes only: nothing missing
    out = capsys.readouterr().out.splitlines()
    assert re.match(
        r"lambda_r26_shapes: checked as tools/train_net.py checks them before training in .* s "
        r"\(images: header\)",
        out[-2],
    )
    assert out[-1] == "  training set lambda_det_test_masks: 3 images, 3 annotations"
    assert tool.main([triple[0]]) == 0  # a name alone: the default config, boxes only
    with pytest.raises(SystemExit) as caught:
        tool.main(eval_only_command(triple))
    assert caught.value.code == 2  # masks are evaluated too
    assert capsys.readouterr().err.splitlines() == [f"error: {missing}"]


# ---- the images ----


def write_image(path: Path, width: int = 64, height: int = 48, **save) -> Path:
    Image.fromarray(
        np.random.default_rng(1).integers(0, 256, (height, width, 3), dtype=np.uint8)
    ).save(path, **save)
    return path


def test_readable_images_pass_even_with_bytes_after_their_end_marker(tmp_path):
    for name in ("a.jpg", "a.png", "a.bmp"):
        check_image_file(str(write_image(tmp_path / name)), 64, 48)
    padded = tmp_path / "padded.jpg"
    padded.write_bytes((tmp_path / "a.jpg").read_bytes() + b"\0" * 5000)  # e.g. a camera's trailer
    check_image_file(str(padded), 64, 48)
    # EXIF orientation 6 (rotated 90 degrees): detectron2 reads it as 48 x 64.
    exif = Image.Exif()
    exif[274] = 6
    rotated = write_image(tmp_path / "rotated.jpg", exif=exif)
    assert read_image(str(rotated), "BGR").shape[:2] == (64, 48)
    check_image_file(str(rotated), 48, 64)
    with pytest.raises(
        ValueError,
        match=r"rotated.jpg is 48x64 \(width x height\) but its "
        r"annotation says 64x48",
    ):
        check_image_file(str(rotated), 64, 48)


@pytest.mark.parametrize(
    "problem,message",
    [
        (
            "not an image",
            r"bad.jpg is not a readable image \(UnidentifiedImageError: cannot identify",
        ),
        (
            "truncated jpeg",
            r"bad.jpg is truncated \(no JPEG end-of-image marker FFD9 at its end, and "
            r"decoding fails: image file is truncated",
        ),
        (
            "truncated png",
            r"bad.png is truncated \(no PNG IEND chunk at its end, and decoding fails",
        ),
        (
            "size",
            r"bad.png is 64x48 \(width x height\) but its annotation says 64x40: fix "
            r"width/height",
        ),
        ("missing", r"image file .*bad.png does not exist"),
    ],
)
@pytest.mark.parametrize("mode", ["header", "full"])
def test_bad_images_are_named(tmp_path, problem, message, mode):
    suffix = ".jpg" if "jpeg" in problem or problem == "not an image" else ".png"
    path = write_image(tmp_path / f"bad{suffix}")
    height = 48
    if problem == "not an image":
        path.write_text("<html>404 not found</html>")
    elif problem.startswith("truncated"):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        if mode == "full":  # a full decode reports the decoder's error
            message = r"bad.(jpg|png) is not a readable image \(OSError: image file is truncated"
    elif problem == "size":
        height = 40
    elif problem == "missing":
        path.unlink()
    error = FileNotFoundError if problem == "missing" else ValueError
    with pytest.raises(error, match=message):
        check_image_file(str(path), 64, height, mode)


RGB = np.random.default_rng(2).integers(0, 256, (48, 64, 3), dtype=np.uint8)
GRAY = RGB[..., 0]


def palette_with_transparency() -> Image.Image:
    image = Image.fromarray(RGB).quantize(16)
    image.info["transparency"] = 0
    return image


# How each kind of image is written, and the RGB values it shows (alpha aside).
READABLE_IMAGES = {
    "RGB png": (lambda path: Image.fromarray(RGB).save(path), ".png", RGB),
    "gray png": (lambda path: Image.fromarray(GRAY).save(path), ".png", GRAY),
    "RGBA png": (lambda path: Image.fromarray(np.dstack([RGB, GRAY])).save(path), ".png", RGB),
    "gray+alpha png": (
        lambda path: Image.fromarray(np.dstack([GRAY, GRAY]), "LA").save(path),
        ".png",
        GRAY,
    ),
    "palette with transparency png": (
        lambda path: palette_with_transparency().save(path),
        ".png",
        np.asarray(palette_with_transparency().convert("RGB")),
    ),
    "1-bit png": (
        lambda path: Image.fromarray(GRAY > 127).save(path),
        ".png",
        (GRAY > 127).astype(np.uint8) * 255,
    ),
    "16-bit RGB png": (
        lambda path: cv2.imwrite(str(path), RGB[..., ::-1].astype(np.uint16) * 257),
        ".png",
        RGB,
    ),
    "CMYK jpeg": (
        lambda path: Image.fromarray(RGB).convert("CMYK").save(path, quality=100),
        ".jpg",
        RGB,
    ),
}


@pytest.mark.parametrize("kind", READABLE_IMAGES)
def test_8_bit_and_other_readable_images_pass_and_read_as_they_show(tmp_path, kind):
    write, suffix, shows = READABLE_IMAGES[kind]
    path = tmp_path / f"image{suffix}"
    write(path)
    for mode in ("header", "full"):
        check_image_file(str(path), 64, 48, mode)
    expected = shows if shows.ndim == 3 else np.repeat(shows[..., None], 3, axis=-1)
    difference = np.abs(read_image(str(path), "RGB").astype(int) - expected).max()
    assert difference <= (1 if kind == "CMYK jpeg" else 0)  # the JPEG's rounding
    # tools/predict.py's reader reads it as training does.
    assert np.array_equal(read_checked_image(str(path), "RGB"), read_image(str(path), "RGB"))


# Images that detectron2's read_image clips to 0-255: the largest value it reads of them (all
# 255: solid white), and their mode.
BRIGHT = GRAY.clip(1, None)  # no black pixel, which would stay black
UNREADABLE_IMAGES = {
    "16-bit gray png": (
        BRIGHT.astype(np.uint16) * 257,
        ".png",
        255,
        r"16-bit grayscale \(PIL mode 'I;16'\)",
    ),
    "16-bit gray tiff": (
        BRIGHT.astype(np.uint16) * 257,
        ".tif",
        255,
        r"16-bit grayscale \(PIL mode 'I;16'\)",
    ),
    "32-bit gray tiff": (
        BRIGHT.astype(np.int32) * 65793,
        ".tif",
        255,
        r"32-bit integer grayscale \(PIL mode 'I'\)",
    ),
    "float gray tiff": (
        BRIGHT.astype(np.float32) / 255,
        ".tif",
        1,
        r"32-bit float grayscale \(PIL mode 'F'\)",
    ),
}


@pytest.mark.parametrize("kind", UNREADABLE_IMAGES)
def test_high_bit_depth_grayscale_is_refused_with_its_mode_and_the_fix(tmp_path, kind):
    array, suffix, largest_read, described = UNREADABLE_IMAGES[kind]
    path = tmp_path / f"image{suffix}"
    Image.fromarray(array).save(path)
    read = read_image(str(path), "BGR")
    assert read.max() == largest_read and np.unique(read).size <= 2  # the picture is lost
    refused = (
        rf"image file {re.escape(str(path))} is {described}, which detectron2's "
        rf"read_image clips to 0-255 .*: convert it to 8-bit, scaling its values to 0-255"
    )
    for mode in ("header", "full"):
        with pytest.raises(ValueError, match=refused):
            check_image_file(str(path), 64, 48, mode)
    check_image_file(str(path), 64, 48, "none")
    with pytest.raises(ValueError, match=refused):  # tools/predict.py's reader: the same words
        read_checked_image(str(path))


def test_an_image_mode_that_does_not_read_as_it_shows_is_refused():
    check_image_mode("a.png", "RGB")
    with pytest.raises(
        ValueError,
        match=r"image file a.tif has PIL mode 'LAB', which "
        r"detectron2's read_image does not read as it shows: "
        r"convert it to 8-bit RGB",
    ):
        check_image_mode("a.tif", "LAB")


def test_every_bad_image_is_counted_in_one_line(tmp_path):
    good = [
        {"file_name": str(write_image(tmp_path / f"{i}.png")), "width": 64, "height": 48}
        for i in range(20)
    ]
    bad = []
    for i in range(3):
        path = tmp_path / f"bad{i}.png"
        path.write_bytes(b"not a png")
        bad.append({"file_name": str(path), "width": 64, "height": 48})
    assert check_images(good) == 20
    assert check_images(good, mode="none") == 0
    with pytest.raises(ValueError) as caught:
        check_images(good[:5] + bad + good[5:])
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"image file {bad[0]['file_name']} is not a readable image")
    assert message.endswith(f"(2 more image files fail this check, e.g. {bad[1]['file_name']})")
    with pytest.raises(ValueError, match="DATALOADER.CHECK_IMAGES must be one of"):
        check_images(good, mode="quick")


def test_a_run_checks_its_images_by_config(tmp_path, register):
    write_dataset(tmp_path)
    image = tmp_path / "images/002.png"
    image.write_bytes(image.read_bytes()[:200])
    cfg = one_dataset(register, tmp_path, **{"MODEL.ROI_HEADS.NUM_CLASSES": 2})
    with pytest.raises(ValueError, match=rf"image file {re.escape(str(image))} is truncated"):
        check_run_datasets(yaml_data_settings(cfg))
    cfg.DATALOADER.CHECK_IMAGES = "none"
    check_run_datasets(yaml_data_settings(cfg))
    cfg.DATALOADER.CHECK_IMAGES = "full"
    with pytest.raises(ValueError, match=rf"{re.escape(str(image))} is not a readable image"):
        check_run_datasets(yaml_data_settings(cfg))


def test_an_image_that_fails_to_decode_during_training_is_named(tmp_path, register):
    write_dataset(tmp_path, count=2)
    cfg = one_dataset(
        register,
        tmp_path,
        **{
            "MODEL.ROI_HEADS.NUM_CLASSES": 2,
            "DATALOADER.DETERMINISTIC": True,
            "SEED": 3,
            "OUTPUT_DIR": str(tmp_path / "out"),
        },
    )
    check_run_datasets(yaml_data_settings(cfg))
    trainer = Trainer(cfg)
    for image in (tmp_path / "images").iterdir():  # damaged after the pre-flight
        image.write_bytes(image.read_bytes()[:300])
    with pytest.raises(
        ValueError,
        match=r"image file .*images/00[12].png cannot be decoded "
        r"\(OSError: image file is truncated\): replace it",
    ):
        trainer.train()
    # The mapper's other errors are left as they are.
    mapper = build_mapper(cfg, is_train=True)
    with pytest.raises(KeyError, match="file_name"):
        mapper({"image_id": 1})


@pytest.mark.e2e
def test_check_dataset_tool_reports_the_rate_or_one_error(tmp_path, register, capsys):
    write_dataset(tmp_path, count=4, suffix=".jpg")
    tool = check_dataset
    triple = ["lambda_det_test_tool", str(tmp_path / "instances.json"), str(tmp_path / "images")]
    assert tool.main(["--coco-dataset", *triple, "lambda_det_test_tool"]) == 0
    register(triple)  # removed after the test
    assert re.search(
        r"4 images of lambda_det_test_tool: .* 4 image files checked \(header\) in "
        r".* images/s",
        capsys.readouterr().out,
    )
    (tmp_path / "images/004.jpg").write_bytes(b"\xff\xd8\xff")
    with pytest.raises(SystemExit) as caught:
        tool.main(["lambda_det_test_tool", "--images", "full"])
    assert caught.value.code == 2
    assert re.match(r"error: image file .*004.jpg is not a readable image", capsys.readouterr().err)


def test_shapes_pre_flight_is_cheap(datasets_root, monkeypatch):
    """The demo's data (256 + 48 images) checked in well under 2% of its ~14 minutes."""
    monkeypatch.setenv("DETECTRON2_DATASETS", str(datasets_root))
    lambda_det.data.register_shapes_datasets()
    try:
        cfg = load_config("lambda_r26_shapes")
        start = time.perf_counter()
        check_run_datasets(yaml_data_settings(cfg))
        assert time.perf_counter() - start < 0.02 * 14 * 60 / 2
    finally:
        monkeypatch.undo()
        lambda_det.data.register_shapes_datasets()


# ---- tools/train_net.py ----


def snapshot(folder: Path) -> dict:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != "run.lock"
    }


def damage(problem: str, folder: Path) -> tuple:
    """Breaks the dataset in ``folder``; returns the flags and overrides that go with it."""
    if problem == "invalid json":
        (folder / "instances.json").write_text('{"images": [}')
    elif problem == "truncated image":
        image = folder / "images/003.png"
        image.write_bytes(image.read_bytes()[:100])
    elif problem == "unknown category":
        data = json.loads((folder / "instances.json").read_text())
        data["annotations"][2]["category_id"] = 9
        (folder / "instances.json").write_text(json.dumps(data))
    elif problem == "16-bit image":
        Image.fromarray(np.full((48, 64), 40000, np.uint16)).save(folder / "images/002.png")
    elif problem == "image id twice":
        edit_json(folder / "instances.json", lambda data: data["images"][2].update(id=1))
    elif problem == "class count":
        return [], ["MODEL.ROI_HEADS.NUM_CLASSES", "5"]
    elif problem == "name taken":
        return ["--coco-dataset", "own", folder / "instances.json", folder], []
    return [], []


CLI_CASES = {
    "invalid json": [
        "instances.json (dataset 'own') is not valid JSON (Expecting value: line 1 "
        "column 13 (char 12))"
    ],
    "truncated image": ["images/003.png is truncated (no PNG IEND chunk"],
    "unknown category": ["category_id=9", "instances.json"],
    "16-bit image": ["images/002.png is 16-bit grayscale (PIL mode 'I;16')", "convert it to 8-bit"],
    "image id twice": [
        "instances.json): image id 1 is used twice, by images '001.png' and '003.png'"
    ],
    "class count": [
        "MODEL.ROI_HEADS.NUM_CLASSES is 5",
        "has 2 categories",
        "'MODEL.ROI_HEADS.NUM_CLASSES 2'",
    ],
    "name taken": ["dataset name 'own'", "give this dataset another name"],
}


@pytest.fixture
def catalog_restored():
    """Removes the datasets that a tool's --coco-dataset registered in this process."""
    before = set(DatasetCatalog.list())
    yield
    for name in set(DatasetCatalog.list()) - before:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


@pytest.mark.parametrize("problem", CLI_CASES)
@pytest.mark.e2e
def test_train_net_refuses_a_bad_dataset_in_one_line_and_changes_nothing(
    tmp_path, problem, catalog_restored, capsys
):
    """train_net's main() in this process (the README example below runs the script)."""
    data = tmp_path / "data"
    write_dataset(data)
    flags, overrides = damage(problem, data)
    earlier = tmp_path / "run"  # an interrupted earlier run, continued with --resume
    earlier.mkdir()
    for name, text in {
        "last_checkpoint": "model_0000001.pth",
        "model_0000001.pth": "weights",
        "metrics.json": "{}\n",
        "log.txt": "log\n",
        "config.yaml": "cfg\n",
    }.items():
        (earlier / name).write_text(text)
    before = snapshot(earlier)
    status, err = exit_status(
        train_net.main,
        [
            "--config",
            "lambda_r26_shapes",
            "--resume",
            "--coco-dataset",
            "own",
            data / "instances.json",
            data / "images",
            *flags,
            *TINY_ARGS,
            "MODEL.ROI_HEADS.NUM_CLASSES",
            "2",
            "DATASETS.TRAIN",
            "('own',)",
            "DATASETS.TEST",
            "('own',)",
            "OUTPUT_DIR",
            earlier,
            *overrides,
        ],
        capsys,
    )
    assert_one_line_error(status, err, *CLI_CASES[problem])
    assert snapshot(earlier) == before


def readme_commands() -> list:
    """The shell commands of the README's "Your own dataset" example (first bash block)."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("\n## Your own dataset\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = block.replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if shlex.split(line, comments=True)]


def test_readme_example_uses_only_the_command_line():
    commands = readme_commands()
    scripts = [command[1] for command in commands if command[0] == "python"]
    assert scripts == ["-c", "tools/train_net.py", "tools/ap_table.py"]
    train = next(command for command in commands if command[1] == "tools/train_net.py")
    assert train.count("--coco-dataset") == 2
    assert "lambda_det_shapes_train" not in " ".join(train)  # nothing registered in Python


@pytest.mark.slow
@pytest.mark.e2e
def test_readme_own_dataset_example_trains_evaluates_and_prints_the_table(
    tmp_path, small_datasets_root
):
    # The example's files, generated once: its validation split cut to 8 images.
    (tmp_path / "datasets").symlink_to(small_datasets_root)
    env = subprocess_env()
    env.pop("DETECTRON2_DATASETS", None)  # the example uses the default, ./datasets
    outputs = []
    for command in readme_commands():
        assert command[0] == "python"
        command = [sys.executable, *command[1:]]
        if command[1].startswith("tools/"):
            command[1] = str(REPO_ROOT / command[1])
        if command[1].endswith("train_net.py"):
            command += TINY_ARGS
        result = subprocess.run(
            command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
        )
        assert result.returncode == 0, (command, result.stderr[-3000:])
        outputs.append(result.stdout)
    runs = [path.parent for path in tmp_path.glob("output/*/eval_results.json")]
    assert len(runs) == 1
    results = json.loads((runs[0] / "eval_results.json").read_text())["results"]
    assert {"bbox", "segm"} <= set(results)
    config = (runs[0] / "config.yaml").read_text()
    assert "COCO_INSTANCES" in config and "train.json" in config  # a rerun knows its datasets
    assert outputs[-1].startswith("| Backbone | AP bb | APs/m/l bb | AP mask | APs/m/l mask |")
    assert f"| {runs[0].name} |" in outputs[-1]
