"""Text files a user passes or a run left (configs, last_checkpoint, eval_results.json): one that
is not utf-8 text is an error naming the file, not Python's codec message."""

import os
from pathlib import Path
from typing import Union

from lambda_det.utils.errors import UserError

__all__ = ["NotTextError", "not_text", "read_text"]


class NotTextError(UserError):
    """A file that should be utf-8 text is not; the message names it and the fix."""


def not_text(where: str, error: UnicodeDecodeError, fix: str) -> NotTextError:
    """The error for ``where`` (e.g. "config file x.yaml"), which failed to decode."""
    return NotTextError(
        f"{where} is not utf-8 text (byte {error.start} is 0x"
        f"{error.object[error.start]:02x}; a binary file?): {fix}"
    )


def read_text(path: Union[str, os.PathLike], fix: str, where: str = "") -> str:
    """The text of ``path``, decoded as utf-8.

    Raises:
        NotTextError: naming ``where`` (default: the path) and ``fix``.
    """
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise not_text(where or f"{os.fspath(path)!r}", error, fix) from None
