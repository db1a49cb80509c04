"""The exception of a user's mistake: a config key or value, a dataset, a file or an option that
the user passed and the message names, with the fix. The tools print it as one ``error: ...``
line (:func:`lambda_det.cli.arguments.reporting_user_errors`); any other exception is a bug and
keeps its traceback."""

__all__ = ["UserError", "UserKeyError"]


class UserError(ValueError):
    """A mistake in what the user passed; the message names the bad value and the fix. A
    ValueError, so that code catching ValueError (as before there was this type) catches it."""


class UserKeyError(UserError, KeyError):
    """A :class:`UserError` for a name that is not there (a dataset, a config node), also a
    KeyError for code that catches one."""
