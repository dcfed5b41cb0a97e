"""Number options that click's own types let slip: NaN and infinity."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloatRange(click.FloatRange):
    """A finite float within the bounds: ``click.FloatRange`` also refusing NaN (which
    compares false with every bound, so ``FloatRange`` lets it through) and infinities.

    Every float option of the CLI uses it (durations have their own type,
    :class:`allocator.commands.options.Duration`), so a nonsense number is a usage error
    (exit 64) before any work starts, never a NaN that a sleep or a timer meets later.
    """

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
