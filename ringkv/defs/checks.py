"""Parameter checks shared by every core and definition: one rule, one wording.

The rule: a value of the wrong *type* raises ``TypeError``; a value of the right type that is
out of range raises ``ValueError``. A ``bool`` is not an integer here (``True`` is a mistake
for ``1``, never meant). Messages name the parameter and end with ``not {value!r}``, the way
Amaranth's own ``lib/fifo.py`` words them, so that a user sees which argument to change:

>>> check_int("layers", 0, low=1, high=256)
Traceback (most recent call last):
ValueError: layers must be between 1 and 256, not 0

Each check returns the value, so ``self._n = check_int("n", n, low=1)`` reads as one step.
"""

__all__ = ["is_int", "is_pow2", "log2_exact", "check_type", "check_int", "check_pow2"]


def is_int(value) -> bool:
    """``value`` is an ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_pow2(value) -> bool:
    """``value`` is an integer power of two (1, 2, 4, ...)."""
    return is_int(value) and value > 0 and value & (value - 1) == 0


def log2_exact(value: int) -> int:
    """``log2(value)`` of a power of two (``ValueError`` otherwise)."""
    if not is_pow2(value):
        raise ValueError(f"{value!r} is not a power of two")
    return value.bit_length() - 1


def check_type(name: str, value, cls):
    """``value`` unless it is not an instance of ``cls``: ``TypeError``."""
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, not {value!r}")
    return value


def _range(low, high, unit) -> str:
    if low is not None and high is not None:
        return f"between {low} and {high}{unit}"
    if high is not None:
        return f"at most {high}{unit}"
    if low == 1 and not unit:
        return "a positive integer"
    if low == 0 and not unit:
        return "a non-negative integer"
    return f"at least {low}{unit}"


def check_int(name: str, value, *, low: int | None = None, high: int | None = None,
              unit: str = "") -> int:
    """An integer in ``low..high`` (either bound optional; ``unit``, e.g. ``" bits"``, follows
    the bounds in the message)."""
    if not is_int(value):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {_range(low, high, unit)}, not {value!r}")
    return value


def check_pow2(name: str, value, *, low: int = 1, high: int | None = None) -> int:
    """A power of two in ``low..high`` (``high`` optional)."""
    if not is_int(value):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if not is_pow2(value) or value < low or (high is not None and value > high):
        if high is not None:
            what = f"a power of two between {low} and {high}"
        elif low > 1:
            what = f"a power of two of at least {low}"
        else:
            what = "a positive power of two"
        raise ValueError(f"{name} must be {what}, not {value!r}")
    return value
