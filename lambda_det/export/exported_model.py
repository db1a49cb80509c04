"""Running an exported file (:class:`ExportedModel`) and comparing its outputs with eager mode's."""

import json
import os
import warnings
from typing import Dict, Mapping, Optional

import numpy as np
import torch
from detectron2.modeling.postprocessing import detector_postprocess
from detectron2.structures import Boxes, Instances

from lambda_det.export._archive import EXPORT_AGAIN, LOAD_ERRORS, load_program, zip_kind
from lambda_det.export.files import FILE_SUFFIXES, METADATA_NAME, PathLike, metadata_path
from lambda_det.utils.errors import MissingFileError, UserError
from lambda_det.utils.text import read_text

_ONNX_TYPES = {"tensor(uint8)": torch.uint8, "tensor(float)": torch.float32}


class ExportedModel:
    """An exported file loaded for inference: TorchScript on the device it was traced on (the
    trace holds that device as a constant), ONNX on the CPU through onnxruntime, a torch.export
    ``.pt2`` on the device it was exported on, once :mod:`lambda_det.export._archive` has checked
    that loading it runs no code from it. A TorchScript or torch.export file is known by its
    contents, an ONNX file by its suffix ``.onnx``.

    Calling it with a (3, H, W) image of its dtype (and of the exported size, for an export
    fixed to one) returns the outputs by name, on the CPU.

    Attributes:
        input_shape: (3, H, W), None for a dynamic size.
        min_size: the smallest (H, W) a torch.export file takes; None for the other formats.
        metadata: the contents of :func:`metadata_path`, or None where that file is missing.
        classes: ``metadata["classes"]`` (or None): ``classes[i]["id"]`` and
            ``classes[i]["name"]`` are the dataset's category id and name of
            ``pred_classes == i``.
    """

    def __init__(self, path: PathLike):
        path = str(path)
        if not os.path.isfile(path):
            raise MissingFileError(f"exported model {path!r} does not exist")
        if path.endswith(FILE_SUFFIXES["onnx"]):
            self._load_onnx(path)
        elif zip_kind(path) == "torch_export":
            program, extra_files = load_program(path)
            self._read_metadata(path, extra_files.get(METADATA_NAME, ""), "a torch.export")
            try:
                self._module = program.module()
            except LOAD_ERRORS as error:
                raise UserError(
                    f"{path!r}: torch cannot make its program a module "
                    f"({type(error).__name__}: {' '.join(str(error).split())[:200]}); "
                    f"{EXPORT_AGAIN}"
                ) from None
        else:
            extra_files = {METADATA_NAME: ""}
            with warnings.catch_warnings():
                warnings.filterwarnings(
                    "ignore", message=r".*torch\.jit\.load.* is deprecated", category=FutureWarning
                )
                try:
                    self._module = torch.jit.load(path, _extra_files=extra_files)
                except (RuntimeError, ValueError) as error:  # what torch's reader refuses
                    raise UserError(
                        f"{path!r} cannot be loaded as TorchScript "
                        f"({' '.join(str(error).split())[:200]}): pass the .ts file "
                        f"tools/export_model.py wrote"
                    ) from None
            self._read_metadata(path, extra_files[METADATA_NAME], "a TorchScript")
        self.path = path
        self.metadata = _sidecar_metadata(path)
        self.classes = self.metadata.get("classes") if self.metadata else None

    def _load_onnx(self, path: str) -> None:
        try:
            import onnxruntime
        except ImportError as error:
            raise ImportError(
                f"running {path!r} needs onnxruntime (pip install onnxruntime)"
            ) from error
        try:
            self._session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        except _onnxruntime_errors() as error:
            raise UserError(
                f"{path!r} is not an ONNX model onnxruntime can load "
                f"({' '.join(str(error).split())[:200]}): pass the .onnx file "
                f"tools/export_model.py wrote"
            ) from None
        inputs = self._session.get_inputs()
        if len(inputs) != 1:
            raise UserError(
                f"{path!r} is not an ONNX model lambda_det.export wrote: it takes "
                f"{len(inputs)} inputs, not one image"
            )
        (model_input,) = inputs
        self._input_name = model_input.name
        self.input_shape = tuple(
            size if isinstance(size, int) else None for size in model_input.shape
        )  # "height", "width": any
        self.input_dtype = _ONNX_TYPES.get(model_input.type)
        self.output_names = tuple(output.name for output in self._session.get_outputs())
        self._module = None
        self.min_size = None

    def _read_metadata(self, path: str, text: str, kind: str) -> None:
        """The input and outputs, from the metadata stored in the file itself."""
        metadata = _stored_metadata(text)
        if metadata is None:
            problem = "is not JSON of its input and outputs" if text else "is missing"
            raise UserError(
                f"{path!r} is not {kind} file written by lambda_det.export (its "
                f"{METADATA_NAME} {problem}); export the model again with "
                f"tools/export_model.py"
            )
        self.input_shape = tuple(metadata["input_shape"])
        self.input_dtype = getattr(torch, metadata["input_dtype"])
        self.output_names = tuple(metadata["output_names"])
        self.min_size = tuple(metadata["min_size"]) if metadata.get("min_size") else None

    def __call__(self, image: torch.Tensor) -> Dict[str, torch.Tensor]:
        if image.dim() != len(self.input_shape) or any(
            expected not in (None, size) for expected, size in zip(self.input_shape, image.shape)
        ):
            raise UserError(
                f"{self.path!r} was traced for images of shape {self.input_shape}, got "
                f"{tuple(image.shape)}: resize or pad the image, or export again with a sample "
                f"of this size"
            )
        if self.min_size is not None and any(
            size < smallest for size, smallest in zip(image.shape[1:], self.min_size)
        ):
            raise UserError(
                f"{self.path!r} takes images of at least {self.min_size[0]} x "
                f"{self.min_size[1]} pixels, got {tuple(image.shape[1:])} "
                f"(TorchScript and ONNX exports take any size)"
            )
        if self.input_dtype is not None and image.dtype != self.input_dtype:
            raise UserError(f"{self.path!r} takes {self.input_dtype} images, got {image.dtype}")
        if self._module is not None:
            with torch.no_grad():
                outputs = [output.cpu() for output in self._module(image)]
        else:
            feed = {self._input_name: np.ascontiguousarray(image.cpu().numpy())}
            outputs = [torch.from_numpy(value) for value in self._session.run(None, feed)]
        return dict(zip(self.output_names, outputs))


def _size(value) -> bool:
    return type(value) is int and value > 0


def _stored_metadata(text: str) -> Optional[dict]:
    """What lambda_det.export stores in a TorchScript or torch.export file (input shape and
    dtype, output names, smallest size), or None where ``text`` is not that."""
    try:
        metadata = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(metadata, dict):
        return None
    shape, dtype, names = (
        metadata.get(key) for key in ("input_shape", "input_dtype", "output_names")
    )
    smallest = metadata.get("min_size")
    valid = (
        isinstance(shape, list)
        and len(shape) == 3
        and all(size is None or _size(size) for size in shape)
        and isinstance(dtype, str)
        and isinstance(getattr(torch, dtype, None), torch.dtype)
        and isinstance(names, list)
        and all(isinstance(name, str) for name in names)
        and (smallest is None or isinstance(smallest, list) and len(smallest) == 2)
        and all(map(_size, smallest or []))
    )
    return metadata if valid else None


def _sidecar_metadata(path: str) -> Optional[dict]:
    """The contents of ``path``'s :func:`metadata_path` (None where it is missing): a JSON
    object, or one line naming the file."""
    sidecar = metadata_path(path)
    if not sidecar.is_file():
        return None
    fix = "export the model again with tools/export_model.py, or remove it"
    text = read_text(sidecar, fix)
    try:
        metadata = json.loads(text)
    except (ValueError, RecursionError):
        metadata = None
    if not isinstance(metadata, dict):
        raise UserError(f"{str(sidecar)!r}, the metadata of {path!r}, is not a JSON object: {fix}")
    return metadata


def _onnxruntime_errors() -> tuple:
    """onnxruntime's errors for a file it cannot load (its own classes, not Python's)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "InvalidProtobuf", "InvalidGraph", "NoModel", "NoSuchFile")
    names += ("NotImplemented", "RuntimeException", "EngineError", "ModelLoaded", "EPFail")
    return tuple(getattr(state, name) for name in names if hasattr(state, name))


def outputs_to_instances(outputs: Mapping[str, torch.Tensor], height: int, width: int) -> Instances:
    """Final predictions for an image of ``height`` x ``width`` from exported outputs.

    The same as the eager ``model([{"image": image, "height": height, "width": width}])``:
    boxes rescaled from the input's size, masks pasted into the image as booleans.
    """
    image_size = tuple(int(size) for size in outputs["image_size"])
    fields = {
        name: torch.as_tensor(value) for name, value in outputs.items() if name != "image_size"
    }
    if "pred_boxes" in fields:
        fields["pred_boxes"] = Boxes(fields["pred_boxes"])
    return detector_postprocess(Instances(image_size, **fields), height, width)


# How each output's difference is measured: boxes as a fraction of the image's longer side
# (1e-3 is 1 pixel of 1024), scores and masks as the probabilities they are, classes and the
# image size as equal (0) or not (inf).
SCALES = {
    "pred_boxes": "of the image side",
    "scores": "probability",
    "pred_masks": "probability",
    "pred_classes": "equal or not",
    "image_size": "equal or not",
}


def max_differences(
    expected: Mapping[str, torch.Tensor], actual: Mapping[str, torch.Tensor]
) -> Dict[str, float]:
    """Per output name, the largest difference on the output's own scale (:data:`SCALES`;
    outputs of other names absolute): inf where the shapes or names differ, nan where either
    side has a NaN."""
    differences = {}
    side = max(int(v) for v in torch.as_tensor(expected.get("image_size", [1])).flatten())
    for name in sorted(set(expected) | set(actual)):
        if name not in expected or name not in actual:
            differences[name] = float("inf")
            continue
        reference, value = (torch.as_tensor(outputs[name]).cpu() for outputs in (expected, actual))
        if reference.shape != value.shape:
            differences[name] = float("inf")
        elif reference.numel() == 0:
            differences[name] = 0.0
        elif SCALES.get(name) == "equal or not":
            differences[name] = 0.0 if torch.equal(reference, value) else float("inf")
        else:
            difference = float((reference.double() - value.double()).abs().max())
            differences[name] = difference / max(side, 1) if name == "pred_boxes" else difference
    return differences


def detection_count(outputs: Mapping[str, torch.Tensor]) -> int:
    """The number of detections in a model's outputs (the length of its scores)."""
    return len(outputs["scores"]) if "scores" in outputs else 0
