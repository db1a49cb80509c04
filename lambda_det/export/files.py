"""The exported files: formats, suffixes, the metadata beside them, and the output paths an
export may write."""

import os
from pathlib import Path
from typing import Callable, Mapping, Optional, Union

from lambda_det.utils.atomic import check_output_file
from lambda_det.utils.errors import IsAFolderError

EXPORT_FORMATS = ("torchscript", "onnx", "torch_export")
FILE_SUFFIXES = {"torchscript": ".ts", "onnx": ".onnx", "torch_export": ".pt2"}
ONNX_OPSET = 17
# Stored in the TorchScript archive (ONNX files carry the same facts in their graph).
METADATA_NAME = "lambda_det_export.json"
# The names of the input's dynamic axes (ONNX) and of its sizes in the metadata.
SIZE_NAMES = ("height", "width")

PathLike = Union[str, os.PathLike]


def metadata_path(output: PathLike) -> Path:
    """The metadata file written next to an exported ``output``: ``<output>.json``."""
    return Path(f"{os.fspath(output)}.json")


def check_export_output(
    output: PathLike,
    reads: Mapping[str, Optional[str]],
    overwrite: bool,
    owner: Callable[[PathLike], Optional[str]] = lambda path: None,
) -> None:
    """Refuse an export path that would lose a file (the output rule,
    :func:`~lambda_det.utils.atomic.check_output_file`): never a file the export reads
    (``reads``: e.g. "MODEL.WEIGHTS" -> the checkpoint, "--config" -> the config; compared as
    files, through links and spellings) or a run owns (``owner``: the run that owns a path,
    :func:`lambda_det.cli.output_dir.run_owner`), another existing file only with
    ``overwrite``. The same for its :func:`metadata_path`.

    Raises:
        IsADirectoryError: ``output`` (or its metadata path) is a folder.
        FileExistsError: ``output`` (or its metadata path) exists; the message names the fix.
    """
    for path, what in (
        (output, f"--output {str(output)!r}"),
        (metadata_path(output), f"the metadata file {str(metadata_path(output))!r} of --output"),
    ):
        if os.path.isdir(path):
            raise IsAFolderError(
                f"{what} is a folder: pass another file path, e.g. "
                f"{os.path.join(output, 'model.ts')!r}"
            )
        check_output_file(path, overwrite, reads, "--output", what, owner(path))
