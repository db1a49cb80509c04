"""A config value with the key that sets it, so that a check of the value names the key.

tools/train_net.py reads yaml configs (keys such as ``SOLVER.BASE_LR``) and
tools/lazyconfig_train_net.py LazyConfig recipes (keys such as ``optimizer.lr``); the checks of
both take :class:`Setting` values and say the fix in the syntax of the key's command line
(:func:`override`)."""

from typing import Any, NamedTuple

__all__ = ["Setting", "override", "is_integer"]


class Setting(NamedTuple):
    """A config value and the key that the user sets it with (named in the errors)."""

    key: str
    value: Any


def override(key: str, value: Any) -> str:
    """How a command line sets ``key`` to ``value``: ``KEY VALUE`` for a yaml config's keys
    (upper case, as detectron2's), ``key=value`` for a LazyConfig recipe's (hydra syntax)."""
    yaml = key[:1].isupper()
    text = ('""' if yaml else "''") if value == "" else str(value)
    return f"{key} {text}" if yaml else f"{key}={text}"


def is_integer(value) -> bool:
    """An int that is not a bool (a config's ``True`` is no iteration count)."""
    return isinstance(value, int) and not isinstance(value, bool)
