"""What a model's checkpoint map (models/NAME/checkpoint.py) reads a pretrained checkpoint's
configuration (config.json, params.json, the shape saved beside a run's checkpoint) with: each
value checked, and PretrainedError, one line naming the file, the field and what it holds, for
any that is not what the model takes. pretrained/ raises it for the files themselves."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mmm_orch.errors import PretrainedError, shown

# A model's sizes (layers, heads, widths, a vocabulary, a context) are far below this; a larger
# one is not a model's, and would overflow the arithmetic of its shapes.
MAX_WHOLE = 1 << 31


def whole_number(config: dict[str, Any], name: str, file: Path, default: int | None = None) -> int:
    """config[name], a whole number from 1 to MAX_WHOLE; `default` where it is absent or null
    (None: it must be there)."""
    value = config.get(name)
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_WHOLE:
        raise PretrainedError(
            f"{file}: {name} is {shown(value)}, not a whole number from 1 to {MAX_WHOLE}"
        )
    return value


def positive_number(
    config: dict[str, Any],
    name: str,
    file: Path,
    default: float | None = None,
    limit: float = math.inf,
) -> float:
    """config[name], a finite number above 0 (and at most `limit`); `default` where absent."""
    value = config.get(name)
    if value is None:
        value = default
    try:
        number = float(value) if isinstance(value, (int, float)) and value is not True else math.nan
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    if not (0 < number <= limit and math.isfinite(number)):
        bound = "" if limit == math.inf else f" and at most {limit:g}"
        raise PretrainedError(
            f"{file}: {name} is {shown(value)}, not a finite number above 0{bound}"
        )
    return number


def json_object(config: dict[str, Any], name: str, file: Path) -> dict[str, Any]:
    """config[name], a JSON object; {} where it is absent or null."""
    value = config.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PretrainedError(f"{file}: {name} is {shown(value)}, not a JSON object")
    return value
