"""Number options that click's own types let slip: NaN and infinity.

Rules: :class:`FiniteFloatRange` is ``click.FloatRange`` that also refuses NaN (which
compares false with every bound, so ``FloatRange`` lets it through) and infinities; every
float option of the CLI (a fraction; durations have their own type,
:class:`allocator.commands.options.Duration`) uses it, so a nonsense number is a usage error
(exit 64) before any work starts, never a NaN that a sleep or a timer meets later.
"""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """A finite float within the bounds (see the module rules)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
