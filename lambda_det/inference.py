"""Predictions on your own images and videos (tools/predict.py): batched inference with a trained
model, pictures drawn with detectron2's ``Visualizer``, and COCO-format results JSON.

Images are read and resized exactly as detectron2's evaluation reads them (``read_image`` with
EXIF orientation, the config's test-time resize), and results are written with detectron2's own
``instances_to_coco_json`` and the dataset's category ids, so an image of DATASETS.TEST gets the
same predictions as ``--eval-only`` writes to ``coco_instances_results.json``. A batch pads its
images to the largest one (as detectron2 does); images of one size give the same predictions in
any batch size.
"""

import contextlib
import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
from detectron2.config import CfgNode
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data import transforms as T
from detectron2.evaluation.coco_evaluation import instances_to_coco_json
from detectron2.utils.visualizer import ColorMode, Visualizer
from torch import nn
from tqdm import tqdm

from lambda_det.checkpoint import load_weights
from lambda_det.data.checks import read_checked_image
from lambda_det.data.mapper import build_mapper
from lambda_det.modeling.build import build_detectron2_model
from lambda_det.utils.atomic import OutputWriteError, atomic_path, file_identity
from lambda_det.utils.errors import ExistingFileError, MissingFileError, NotAFolderError, UserError

__all__ = [
    "IMAGE_SUFFIXES",
    "VIDEO_SUFFIXES",
    "unreadable_inputs",
    "Frame",
    "collect_inputs",
    "drawing_names",
    "check_output_folder",
    "read_frames",
    "build_trained_model",
    "Predictor",
    "draw",
    "coco_results",
    "dataset_image_ids",
    "metadata_of",
    "predict_files",
    "write_image",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm")


@dataclass
class Frame:
    """One image to predict on: from an image file, or frame ``index`` of a video."""

    source: str
    image: np.ndarray  # H W C in the config's INPUT.FORMAT
    index: Optional[int] = None  # the frame of a video; None for an image file

    @property
    def name(self) -> str:
        stem = Path(self.source).stem
        return stem if self.index is None else f"{stem}_{self.index:06d}"


def collect_inputs(inputs: Sequence[str]) -> List[str]:
    """Image and video files from paths, folders (their images and videos, sorted) and globs;
    a file named twice (``photos/ photos/a.jpg``) is kept once, where it first appears.

    Raises:
        FileNotFoundError: an input matches no file.
        ValueError: a file is neither an image nor a video by its suffix.
    """
    files = []
    for entry in inputs:
        if os.path.isdir(entry):
            found = sorted(
                str(path)
                for path in Path(entry).iterdir()
                if path.suffix.lower() in IMAGE_SUFFIXES + VIDEO_SUFFIXES
            )
            if not found:
                raise MissingFileError(
                    f"input folder {entry!r} holds no image or video "
                    f"({', '.join(IMAGE_SUFFIXES + VIDEO_SUFFIXES)})"
                )
        elif os.path.isfile(entry):
            found = [entry]
        else:
            found = sorted(glob.glob(entry, recursive=True))
            if not found:
                raise MissingFileError(
                    f"input {entry!r} is not a file, a folder or a glob that matches files"
                )
        for path in found:
            if Path(path).suffix.lower() not in IMAGE_SUFFIXES + VIDEO_SUFFIXES:
                raise UserError(
                    f"input {path!r} is neither an image nor a video by its suffix "
                    f"({', '.join(IMAGE_SUFFIXES + VIDEO_SUFFIXES)})"
                )
        files += found
    unique = {}
    for path in files:
        unique.setdefault(os.path.realpath(path), path)
    return list(unique.values())


def _own_drawing_name(path: str) -> str:
    """An image's own file name; a video's stem with .mp4 (videos are drawn as mp4)."""
    name = Path(path)
    return name.name if name.suffix.lower() not in VIDEO_SUFFIXES else name.stem + ".mp4"


def drawing_names(files: Sequence[str]) -> List[str]:
    """The file name each input is drawn under in the output folder, one distinct name each.

    An image keeps its own name and a video becomes ``<stem>.mp4``. An input whose name an
    earlier input already has (``a/x.png``, ``b/x.png``) becomes ``<stem>_2<suffix>``
    (``_3``... the first name no input has): the same inputs in the same order always get the
    same names. Names are compared regardless of case, so they stay distinct on
    case-insensitive disks.
    """
    own = [_own_drawing_name(path) for path in files]
    taken = {name.lower() for name in own}
    given, names = set(), []
    for name in own:
        if name.lower() in given:
            stem, suffix = os.path.splitext(name)
            count = 2
            while f"{stem}_{count}{suffix}".lower() in taken:
                count += 1
            name = f"{stem}_{count}{suffix}"
            taken.add(name.lower())
        given.add(name.lower())
        names.append(name)
    return names


def check_output_folder(
    files: Sequence[str],
    output: Path,
    overwrite: bool,
    also_writes: Sequence[str] = (),
    reads: Optional[Mapping[str, str]] = None,
    owner: Callable[[Path], Optional[str]] = lambda path: None,
) -> None:
    """Refuse an output folder where predicting on ``files`` would lose a file.

    Never (even with ``overwrite``) a folder where a drawing (:func:`drawing_names`) or one of
    ``also_writes`` (names in ``output``) would replace an input or another file the command
    reads (``reads``: what the user calls it, e.g. "MODEL.WEIGHTS" -> its path), or a file a
    run owns (``owner``: the run that owns a path, as an error names it, or None:
    :func:`lambda_det.cli.output_dir.run_owner`). Without ``overwrite``, also a folder that
    holds an input, or any file the run writes.

    Raises:
        NotADirectoryError: ``output`` is a file.
        FileExistsError: a file would be written over; the message names it and the fix.
    """
    if output.exists() and not output.is_dir():
        raise NotAFolderError(f"--output {str(output)!r} is a file: pass a folder")
    if not output.is_dir():
        return  # a new folder: nothing to lose
    written = [output / name for name in (*also_writes, *drawing_names(files))]
    read = {file_identity(path): f"{role} {str(path)!r}" for role, path in (reads or {}).items()}
    read.update({file_identity(path): f"the input {path!r}" for path in files})
    for path in written:
        source = read.get(file_identity(path)) if path.exists() else None
        if source is not None:
            raise ExistingFileError(
                f"--output {str(output)!r} holds {source}, which would be "
                f"written over by {path.name}: pass another --output"
            )
        run = owner(path) if os.path.lexists(path) else None
        if run is not None:
            raise ExistingFileError(
                f"--output {str(output)!r}: {path.name} belongs to {run}: a run's files are "
                f"never written over, not even with --overwrite: pass another --output"
            )
    if overwrite:
        return
    held = [
        path for path in files if os.path.samefile(os.path.dirname(os.path.abspath(path)), output)
    ]
    if held:
        raise ExistingFileError(
            f"--output {str(output)!r} holds the input {held[0]!r}: pass "
            f"another --output, or --overwrite to write beside the inputs "
            f"(an input is never written over)"
        )
    existing = [path.name for path in written if os.path.lexists(path)]  # a link too
    if existing:
        more = f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        raise ExistingFileError(
            f"--output {str(output)!r} already holds "
            f"{', '.join(existing[:3])}{more}, which this run writes: pass "
            f"another --output, or --overwrite to replace them"
        )


def read_frames(path: str, image_format: str) -> Iterator[Frame]:
    """The image of an image file, or every frame of a video, in ``image_format`` ("BGR"/"RGB").
    Images are read as the dataset checks accept them
    (:func:`lambda_det.data.checks.read_checked_image`): a 16-bit, 32-bit or float grayscale
    image is refused, as in a dataset.

    Raises:
        ValueError: the file cannot be read as an image or a video, or is such an image.
    """
    if Path(path).suffix.lower() not in VIDEO_SUFFIXES:
        yield Frame(path, read_checked_image(path, image_format))
        return
    video = cv2.VideoCapture(path)
    if not video.isOpened():
        raise UserError(f"input {path!r} is not a readable video")
    index = 0
    try:
        while True:
            ok, frame = video.read()  # BGR
            if not ok:
                break
            yield Frame(path, frame if image_format == "BGR" else frame[:, :, ::-1], index)
            index += 1
    finally:
        video.release()
    if index == 0:
        raise UserError(f"input {path!r} is not a readable video (no frame decoded)")


def unreadable_inputs(files: Sequence[str], image_format: str) -> Dict[str, str]:
    """The inputs of ``files`` that :func:`read_frames` would refuse, each with why: every image
    read and checked in full, every video opened and its first frame decoded. Done before the
    model is loaded, so that a bad file is named before any work, not after."""
    problems = {}
    for path in files:
        try:
            frames = read_frames(path, image_format)
            next(frames, None)  # an image's only frame, or a video's first
            frames.close()
        except UserError as error:
            problems[path] = str(error)
    return problems


def build_trained_model(cfg: CfgNode, weights: Optional[str] = None) -> nn.Module:
    """The model of ``cfg`` in eval mode with every weight loaded from ``weights`` (default
    ``cfg.MODEL.WEIGHTS``) by :func:`lambda_det.checkpoint.load_weights`: safely, whatever the
    file's suffix, and completely (detectron2's ``DefaultPredictor`` loads ``.pkl`` files with
    ``pickle.load`` and a half-fitting checkpoint with a warning).

    Raises:
        ValueError: no weights given, or the checkpoint does not fit the model.
        FileNotFoundError: the weights file does not exist.
        UnsafeCheckpointError, CorruptCheckpointError: the file cannot be loaded safely.
    """
    model = build_detectron2_model(cfg)
    load_weights(model, cfg.MODEL.WEIGHTS if weights is None else weights)
    return model.eval()


class Predictor:
    """A trained model run as detectron2's evaluation runs it: the config's test-time resize,
    images of a batch padded to the largest. ``predictor(image)`` takes one H x W x C uint8 image
    in ``cfg.INPUT.FORMAT`` (BGR by default, as ``cv2.imread`` reads) and returns its outputs,
    as detectron2's ``DefaultPredictor`` does; :meth:`predict_batch` takes several. Outputs are
    on the CPU. ``model`` defaults to :func:`build_trained_model` of ``cfg``."""

    def __init__(self, cfg: CfgNode, model: Optional[nn.Module] = None):
        self.model = (build_trained_model(cfg) if model is None else model).eval()
        self.augmentations = build_mapper(cfg, is_train=False).augmentations
        # The score a detection needs to be returned (RetinaNet's key, or the R-CNN heads').
        self.score_threshold = (
            cfg.MODEL.RETINANET.SCORE_THRESH_TEST
            if cfg.MODEL.META_ARCHITECTURE == "RetinaNet"
            else cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST
        )

    def __call__(self, image: np.ndarray) -> Dict:
        return self.predict_batch([image])[0]

    @torch.no_grad()
    def predict_batch(self, images: Sequence[np.ndarray]) -> List[Dict]:
        inputs = []
        for image in images:
            augmented = T.AugInput(image)
            self.augmentations(augmented)
            tensor = torch.as_tensor(np.ascontiguousarray(augmented.image.transpose(2, 0, 1)))
            inputs.append({"image": tensor, "height": image.shape[0], "width": image.shape[1]})
        return [
            {key: value.to("cpu") for key, value in output.items()} for output in self.model(inputs)
        ]


def draw(
    image: np.ndarray,
    output: Dict,
    metadata,
    image_format: str,
    scale: float = 1.0,
    score_threshold: Optional[float] = None,
) -> np.ndarray:
    """``image`` (in ``image_format``) with its predicted boxes, masks, class names and scores,
    as a BGR image ``scale`` times its size. With ``score_threshold`` (the predictor's), a
    caption in the top left corner says it, and says so when nothing reached it."""
    rgb = image if image_format == "RGB" else image[:, :, ::-1]
    visualizer = Visualizer(rgb, metadata, scale=scale, instance_mode=ColorMode.IMAGE)
    if score_threshold is not None and "instances" in output:
        caption = f"score >= {score_threshold:g}"
        if len(output["instances"]) == 0:
            caption += ": no detection"
        visualizer.draw_text(caption, (4, 4), color="w", horizontal_alignment="left")
    if "instances" in output:
        drawing = visualizer.draw_instance_predictions(output["instances"])
    elif "sem_seg" in output:
        drawing = visualizer.draw_sem_seg(output["sem_seg"].argmax(dim=0))
    else:
        drawing = visualizer.output
    return drawing.get_image()[:, :, ::-1]


def write_image(path: Path, picture: np.ndarray, option: str = "--output") -> None:
    """``cv2.imwrite`` through :func:`~lambda_det.utils.atomic.atomic_path` (a link at ``path`` is
    replaced, not written through); OpenCV returns False instead of raising when the file cannot
    be written.

    Raises:
        OutputWriteError: naming ``path`` and ``option`` (where the user chose the folder).
    """
    with atomic_path(path, suffix=Path(path).suffix, option=option) as temporary:
        if not cv2.imwrite(temporary, picture):
            raise OutputWriteError(
                f"cannot write {str(path)!r}: OpenCV could not write the "
                f"image (a full or read-only disk?): free space there, or "
                f"pass {option} in a folder you can write to"
            )


def dataset_image_ids(dataset: str) -> Dict[str, int]:
    """The image ids of a registered dataset's files, by absolute path ({} for a name that is
    not registered)."""
    if dataset not in DatasetCatalog.list():
        return {}
    return {
        os.path.abspath(record["file_name"]): record["image_id"]
        for record in DatasetCatalog.get(dataset)
    }


def coco_results(output: Dict, image_id: int, metadata) -> List[Dict]:
    """A frame's instances as COCO results (what ``COCOEvaluator`` writes), with the dataset's
    own category ids when ``metadata`` has them."""
    if "instances" not in output:
        return []
    results = instances_to_coco_json(output["instances"], image_id)
    to_dataset = {
        contiguous: dataset
        for dataset, contiguous in getattr(
            metadata, "thing_dataset_id_to_contiguous_id", {}
        ).items()
    }
    for result in results:
        result["category_id"] = to_dataset.get(result["category_id"], result["category_id"])
    return results


def metadata_of(cfg: CfgNode):
    """The metadata of DATASETS.TEST[0] (class names, category ids), or an empty one."""
    return MetadataCatalog.get(cfg.DATASETS.TEST[0] if len(cfg.DATASETS.TEST) else "__unused")


def predict_files(
    predictor: "Predictor",
    files: Sequence[str],
    output: Path,
    metadata,
    image_format: str,
    known_ids: Dict[str, int],
    batch_size: int = 1,
    overwrite: bool = False,
    results: Optional[List[Dict]] = None,
) -> Tuple[List[Dict], List[Path]]:
    """Predict on every image and video frame of ``files`` in batches; draw each image and
    each video (as mp4) into ``output`` under its name from :func:`drawing_names`.

    Args:
        known_ids: image ids by absolute path (:func:`dataset_image_ids`); other images and
            every video frame are numbered after the largest of them.
        overwrite: write over earlier drawings in ``output`` (:func:`check_output_folder`;
            never over an input).
        results: the list the COCO results go into as each batch is done (a new one by
            default): the caller keeps those of the inputs done before an error.

    Returns:
        the COCO results of every frame (with ``file_name``, the input's path, and ``frame`` for
        videos), and the files drawn.

    Raises:
        FileExistsError: the drawings would write over a file (see :func:`check_output_folder`).
    """
    check_output_folder(files, output, overwrite)
    output.mkdir(parents=True, exist_ok=True)
    drawing = {path: output / name for path, name in zip(files, drawing_names(files))}
    next_id = max(known_ids.values(), default=0) + 1
    results = [] if results is None else results
    drawn, videos = [], {}
    # Each video goes to a temporary file, renamed into place once all its frames are in.
    temporaries = contextlib.ExitStack()

    def run(batch: List[Frame]) -> None:
        nonlocal next_id
        predictions = predictor.predict_batch([frame.image for frame in batch])
        for frame, prediction in zip(batch, predictions):
            picture = draw(
                frame.image,
                prediction,
                metadata,
                image_format,
                score_threshold=predictor.score_threshold,
            )
            image_id = None
            if frame.index is None:
                write_image(drawing[frame.source], picture)
                drawn.append(drawing[frame.source])
                image_id = known_ids.get(os.path.abspath(frame.source))
            else:
                if frame.source not in videos:
                    drawn.append(drawing[frame.source])
                    temporary = temporaries.enter_context(atomic_path(drawn[-1], suffix=".mp4"))
                    videos[frame.source] = _video_writer(
                        frame.source, temporary, drawn[-1], picture.shape
                    )
                videos[frame.source].write(picture)
            if image_id is None:
                image_id, next_id = next_id, next_id + 1
            for result in coco_results(prediction, image_id, metadata):
                result["file_name"] = frame.source
                if frame.index is not None:
                    result["frame"] = frame.index
                results.append(result)

    batch: List[Frame] = []
    with temporaries:  # after the writers are released: rename (or, on an error, remove)
        try:
            for path in tqdm(files, unit="file", desc="predict"):
                for frame in read_frames(path, image_format):
                    batch.append(frame)
                    if len(batch) == batch_size:
                        run(batch)
                        batch = []
            if batch:
                run(batch)
        finally:
            for writer in videos.values():
                writer.release()
    return results, drawn


def _video_writer(source: str, temporary: str, path: Path, shape) -> cv2.VideoWriter:
    """An mp4 writer at the source video's frame rate, into ``temporary`` (renamed to ``path``
    once complete)."""
    capture = cv2.VideoCapture(source)
    fps = capture.get(cv2.CAP_PROP_FPS) or 25.0
    capture.release()
    writer = cv2.VideoWriter(temporary, cv2.VideoWriter_fourcc(*"mp4v"), fps, (shape[1], shape[0]))
    if not writer.isOpened():  # OpenCV does not raise
        raise OutputWriteError(
            f"cannot write {str(path)!r}: OpenCV could not open it for "
            f"writing: pass --output in a folder you can write to"
        )
    return writer
