"""The reward-curve PNG: a real image of the chart's size, and a clear error for an empty series."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from pool.plot import HEIGHT, WIDTH, line_chart


def test_line_chart_writes_a_png(tmp_path: Path) -> None:
    out = line_chart([0.1, 0.2, 0.15, 0.4], tmp_path / "sub" / "curve.png", title="reward")
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size == (WIDTH, HEIGHT)
        # the curve is drawn in its colour somewhere inside the plot area
        assert (31, 119, 180) in {img.getpixel((x, y)) for x in range(0, WIDTH, 2) for y in range(0, HEIGHT, 2)}


def test_flat_and_single_point_series(tmp_path: Path) -> None:
    line_chart([0.5], tmp_path / "one.png", title="one")
    line_chart([0.5, 0.5, 0.5], tmp_path / "flat.png", title="flat")
    with pytest.raises(ValueError, match="nothing to plot"):
        line_chart([], tmp_path / "none.png", title="none")
