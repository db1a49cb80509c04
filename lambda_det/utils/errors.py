"""The exception of a user's mistake: a config key or value, a dataset, a file or an option that
the user passed and the message names, with the fix. The tools print it as one ``error: ...``
line (:func:`lambda_det.cli.arguments.reporting_user_errors`); any other exception, a builtin
FileNotFoundError or KeyError included, is a bug and keeps its traceback. A mistake about a file
or a name is also the builtin exception that code catching one expects."""

__all__ = [
    "UserError",
    "UserKeyError",
    "MissingFileError",
    "ExistingFileError",
    "NotAFolderError",
    "IsAFolderError",
]


class UserError(ValueError):
    """A mistake in what the user passed; the message names the bad value and the fix. A
    ValueError, so that code catching ValueError (as before there was this type) catches it."""


class UserKeyError(UserError, KeyError):
    """A :class:`UserError` for a name that is not there (a dataset, a config node), also a
    KeyError for code that catches one."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named that does not exist."""


class ExistingFileError(UserError, FileExistsError):
    """A file or folder the user named as an output that exists, and is not to be written
    over."""


class NotAFolderError(UserError, NotADirectoryError):
    """A path the user named as a folder that is a file."""


class IsAFolderError(UserError, IsADirectoryError):
    """A path the user named as a file that is a folder."""
