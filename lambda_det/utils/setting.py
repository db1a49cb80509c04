"""A config value with the key that sets it, so that a check of the value names the key.

tools/train_net.py reads yaml configs (keys such as ``SOLVER.BASE_LR``) and
tools/lazyconfig_train_net.py LazyConfig recipes (keys such as ``optimizer.lr``); the checks of
both take :class:`Setting` values and say the fix in the syntax of the key's command line
(:func:`override`)."""

import math
from typing import Any, NamedTuple

__all__ = ["Setting", "override", "is_integer", "shown"]

_SHOWN = 80  # characters of a value quoted in a message


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


def shown(value: Any) -> str:
    """``repr(value)`` as a one-line message can quote it: a long string or value cut, an
    integer past 2**64 by its digits (``repr`` takes quadratic time, and fails past 4,300)."""
    if isinstance(value, str):
        cut = f"... ({len(value)} characters)" if len(value) > _SHOWN else ""
        return repr(value[:_SHOWN]) + cut
    if is_integer(value) and value.bit_length() > 64:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'a negative' if value < 0 else 'an'} integer of {digits} digits"
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
