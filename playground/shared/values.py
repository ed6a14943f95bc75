"""One control's value, parsed as strictly as any public input: text, numbers, whole numbers, flags.

Why: every handler is reachable over HTTP with any JSON value, so a value is refused with one clear
`Refused` naming the control (never a TypeError) unless it is exactly what the control can produce.
The engine panel, the sampling controls and the Compare and Benchmark knobs all parse through here.
"""

from __future__ import annotations

import math
import re

from playground.shared.errors import Refused

MAX_NAME_CHARS = 300
_INTEGER = re.compile(r"[+-]?[0-9]{1,400}")  # longer digit strings are refused, never converted


def shown(value) -> str:
    """A value as an error message quotes it (at most 40 characters)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_text(name: str, value, allow_empty: bool = True) -> str:
    """Stripped text of at most MAX_NAME_CHARS characters (None is empty text when that is allowed)."""
    if value is None and allow_empty:
        return ""
    if not isinstance(value, str):
        raise Refused(f"{name} must be text, got {shown(value)}", name)
    value = value.strip()
    if len(value) > MAX_NAME_CHARS:
        raise Refused(f"{name} is longer than {MAX_NAME_CHARS} characters", name)
    if not value and not allow_empty:
        raise Refused(f"{name} must not be empty", name)
    return value


def parse_number(name: str, value) -> float:
    """A finite number from a control (ints, floats, numeric strings)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise Refused(f"{name} must be a number, got {shown(value)}", name)
    try:
        number = float(value)
    except ValueError:
        raise Refused(f"{name} must be a number, got {shown(value)}", name) from None
    except OverflowError:  # an integer beyond any float
        raise Refused(f"{name} must be a finite number, got {shown(value)}", name) from None
    if not math.isfinite(number):
        raise Refused(f"{name} must be a finite number, got {shown(value)}", name)
    return number


def parse_real(name: str, value, low: float, high: float, low_open: bool = False) -> float:
    """A number (int or float, not text) inside [low, high] (or (low, high] with `low_open`)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Refused(f"{name} must be a number, got {shown(value)}", name)
    inside = (low < value if low_open else low <= value) and value <= high  # exact, even for huge integers
    if not inside:  # NaN too
        raise Refused(f"{name} must be in {'(' if low_open else '['}{low:g}, {high:g}], got {shown(value)}", name)
    return float(value)


def parse_int(name: str, value, minimum: int, maximum: int | None = None) -> int:
    """An integer from a control (ints, integral floats, digit strings), inside [minimum, maximum], taken exactly:
    an int or a string of digits is never rounded through a float."""
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        number = int(value.strip())
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        real = parse_number(name, value)
        if real != int(real):
            raise Refused(f"{name} must be a whole number, got {shown(value)}", name)
        number = int(real)
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise Refused(f"{name} must be {bound}, got {shown(number)}", name)
    return number


def parse_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise Refused(f"{name} must be true or false, got {shown(value)}", name)
    return value
