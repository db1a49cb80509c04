"""Pure-Python stand-in for detectron2's compiled extension ``detectron2._C``.

Installed as ``detectron2/_C.py`` by lambda_det's detectron2 build (``build_detectron2.py``),
because the PyPI source package ``pb1-detectron2`` ships without the C++ sources. Everything
lambda_det and the standard Mask R-CNN / Faster R-CNN / RetinaNet pipelines use is pure PyTorch
(ROIAlign and NMS come from torchvision). What needs this extension: rotated boxes (``nms_rotated``,
``box_iou_rotated``, ``ROIAlignRotated``), deformable convolution and the C++ "fast" COCOeval.
Calling one of those raises a ``RuntimeError`` that says so, instead of an import error at startup.
"""

HAS_COMPILED_OPS = False

_WHY = (
    "detectron2._C.{name} is a compiled op, and this detectron2 is the pure-Python build that "
    "lambda_det installs from the pb1-detectron2 source package (no C++ sources). Rotated boxes, "
    "deformable convolution and the fast COCOeval need a detectron2 built from source with its C++ "
    "extension: see https://detectron2.readthedocs.io/en/latest/tutorials/install.html . "
    "COCO evaluation falls back to pycocotools by itself."
)


def get_compiler_version() -> str:
    return "none (pure-Python detectron2 build, no C++ extension)"


def get_cuda_version() -> str:
    return "none (pure-Python detectron2 build, no C++ extension)"


def has_cuda() -> bool:
    return False


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing_compiled_op(*args, **kwargs):
        raise RuntimeError(_WHY.format(name=name))

    missing_compiled_op.__name__ = name
    return missing_compiled_op
