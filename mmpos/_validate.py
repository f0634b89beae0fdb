"""Argument checks shared by the constructors and builders (never called inside ``forward``).

Each check returns the value it accepted (normalised to a plain ``int`` / ``float`` / ``tuple``)
or raises a ``ValueError`` that names the argument, the expected value and what it got. Nothing
is coerced silently: ``2.0`` is not an int, ``"64"`` is not a number, ``True`` is neither.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__: list[str] = []


def is_int(value: Any) -> bool:
    """``True`` for an integral number that is not a ``bool`` (``int``, numpy ints; not ``2.0``)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """``True`` for a real number that is not a ``bool`` (``int``, ``float``, numpy scalars; NaN included)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(
    value: Any, name: str, low: int = 1, high: int | None = None, even: bool = False, none_ok: bool = False
) -> int | None:
    """An int ``>= low`` (default: positive), ``<= high`` when given, even when ``even``; ``None`` when ``none_ok``."""
    if none_ok and value is None:
        return None
    if not is_int(value) or value < low or (high is not None and value > high) or (even and value % 2):
        parity = " even" if even else ""
        if high is not None:
            want = f"an{parity} int in [{low}, {high}]"
        else:
            want = f"a positive{parity} int" if low == 1 else f"an{parity} int >= {low}"
        raise ValueError(f"{name} must be {'None or ' if none_ok else ''}{want}, got {value!r}")
    return int(value)


def check_finite(value: Any, name: str) -> float:
    """A finite real number (``True``, ``"1"``, NaN and inf are not)."""
    if not is_real(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_float(
    value: Any,
    name: str,
    low: float = 0.0,
    strict: bool = True,
    high: float = math.inf,
    strict_high: bool = False,
    none_ok: bool = False,
) -> float | None:
    """A finite real number ``> low`` (``>= low`` when not ``strict``) and ``<= high`` (``< high`` when
    ``strict_high``); ``None`` when ``none_ok``."""
    if none_ok and value is None:
        return None
    ok = (
        is_real(value)
        and math.isfinite(value)
        and (value > low if strict else value >= low)
        and (value < high if strict_high else value <= high)
    )
    if not ok:
        bound = f"> {low:g}" if strict else f">= {low:g}"
        bound += f" and {'<' if strict_high else '<='} {high:g}" if math.isfinite(high) else ""
        raise ValueError(f"{name} must be {'None or ' if none_ok else ''}a finite number {bound}, got {value!r}")
    return float(value)


def check_ints(
    value: Any,
    name: str,
    low: int = 1,
    length: int | tuple[int, int] | None = None,
    high: int | None = None,
    what: str = "ints",
) -> tuple[int, ...]:
    """A list/tuple of ints ``>= low`` (and ``<= high`` when given); ``length`` an exact count or an inclusive
    ``(min, max)`` (default: at least one). ``what`` names the items in the message (``"block indices"``)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a sequence of {what}, got {value!r}")
    items = tuple(value)
    lo, hi = (length, length) if isinstance(length, int) else (length or (1, math.inf))
    in_range = all(is_int(v) and v >= low and (high is None or v <= high) for v in items)
    if not lo <= len(items) <= hi or not in_range:
        if length is None or (lo == 0 and hi == math.inf):
            count = ""
        else:
            count = f"{lo} " if lo == hi else f"at least {lo} " if hi == math.inf else f"{lo} to {hi} "
        if high is not None:
            kind = f"{what} in [{low}, {high}]"
        else:
            kind = f"positive {what}" if low == 1 else f"{what} >= {low}"
        raise ValueError(f"{name} must hold {count}{kind}, got {value!r}")
    return tuple(int(v) for v in items)


def check_finites(value: Any, name: str) -> tuple[float, ...]:
    """One finite number or a non-empty sequence of them, as a tuple of floats."""
    items = (value,) if is_real(value) else None
    if items is None and not isinstance(value, (str, bytes)) and hasattr(value, "__iter__"):
        items = tuple(value)
    if not items or not all(is_real(v) and math.isfinite(v) for v in items):
        raise ValueError(f"{name} must be a finite number or a non-empty sequence of them, got {value!r}")
    return tuple(float(v) for v in items)


def check_axes(value: Any, name: str = "axes", min_len: int = 1) -> tuple[str, ...]:
    """Distinct non-empty axis names (a list/tuple, not a string), at least ``min_len`` of them."""
    items = tuple(value) if isinstance(value, (list, tuple)) else None
    if (
        items is None
        or len(items) < min_len
        or not all(isinstance(a, str) and a for a in items)
        or len(set(items)) != len(items)
    ):
        count = "one axis" if min_len == 1 else f"{min_len} axes"
        raise ValueError(f"{name} must name at least {count} (distinct non-empty strings, in a tuple), got {value!r}")
    return items


def check_choice(value: Any, name: str, choices: tuple[Any, ...]) -> Any:
    """One of ``choices``."""
    if not isinstance(value, type(choices[0])) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


#: Default bound of one allocation a constructor or builder makes (bytes); ``MMPOS_MAX_BYTES`` overrides it.
MAX_BYTES = 8 * 2**30


def _human(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if nbytes < 1024 or unit == "PiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError  # unreachable


def max_bytes() -> int:
    """The allocation bound: ``MMPOS_MAX_BYTES`` (an int of bytes) when set, else :data:`MAX_BYTES`."""
    import os

    text = os.environ.get("MMPOS_MAX_BYTES")
    if text is None:
        return MAX_BYTES
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"MMPOS_MAX_BYTES must be an int number of bytes, got {text!r}") from None
    return value


def check_bytes(nbytes: float, what: str) -> None:
    """Refuse, before allocating, what would need more than :func:`max_bytes` (the estimate is named).

    ``what`` says what would be allocated and from which arguments (``"iRPE tables of ratio=1e6"``).
    """
    limit = max_bytes()
    if nbytes > limit:
        raise ValueError(
            f"{what} would need about {_human(nbytes)} ({nbytes:,.0f} bytes), more than the {_human(limit)} "
            "mmpos allocates at once; use smaller sizes (or set MMPOS_MAX_BYTES to allow it)"
        )


def check_bool(value: Any, name: str, none_ok: bool = False) -> bool | None:
    """A real ``bool`` (``0`` / ``1`` / ``"yes"`` are not; ``None`` too when ``none_ok``); raises ``TypeError``
    naming ``name``."""
    if none_ok and value is None:
        return None
    if not isinstance(value, bool):
        want = "True, False or None" if none_ok else "a bool (True or False)"
        raise TypeError(f"{name} must be {want}, got {value!r}")
    return value


#: Largest integer below which every integer is exact in float32 (float64: 2**53).
FLOAT32_EXACT = 2**24
_warned: set[object] = set()


def warn_once(key: object, message: str, stacklevel: int = 3) -> None:
    """A ``UserWarning`` with ``message`` the first time ``key`` is seen in this process (never in forward)."""
    if key not in _warned:
        import warnings

        _warned.add(key)
        warnings.warn(message, stacklevel=stacklevel)
