"""A small line chart as PNG with Pillow (no plotting library in the lock file): the devnet's reward curve."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw

WIDTH, HEIGHT = 640, 360
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 60, 20, 36, 40


def line_chart(
    ys: Sequence[float], path: Path, *, title: str, xlabel: str = "policy step", ylabel: str = "mean reward"
) -> Path:
    """Plot `ys` against 0..n-1 with axes, ticks at the min and max, and a title; returns `path`."""
    if not ys:
        raise ValueError("nothing to plot")
    img = Image.new("RGB", (WIDTH, HEIGHT), "white")
    d = ImageDraw.Draw(img)
    lo, hi = min(ys), max(ys)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    pad = 0.05 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    x0, y0, x1, y1 = MARGIN_L, HEIGHT - MARGIN_B, WIDTH - MARGIN_R, MARGIN_T
    d.line([(x0, y0), (x1, y0)], fill="black")
    d.line([(x0, y0), (x0, y1)], fill="black")

    def px(i: int, v: float) -> tuple[float, float]:
        x = x0 + (x1 - x0) * (i / max(1, len(ys) - 1))
        y = y0 - (y0 - y1) * ((v - lo) / (hi - lo))
        return x, y

    points = [px(i, v) for i, v in enumerate(ys)]
    if len(points) > 1:
        d.line(points, fill=(31, 119, 180), width=2)
    for x, y in points:
        d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=(31, 119, 180))
    d.text((x0 + 120, 10), title, fill="black")
    for v in (min(ys), max(ys)):
        _, y = px(0, v)
        d.line([(x0 - 4, y), (x0, y)], fill="black")
        d.text((4, y - 6), f"{v:.3f}", fill="black")
    d.text((x0, y0 + 8), "0", fill="black")
    d.text((x1 - 20, y0 + 8), str(len(ys) - 1), fill="black")
    d.text(((x0 + x1) // 2 - 30, y0 + 20), xlabel, fill="black")
    d.text((4, y1 - 24), ylabel, fill="black")
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="PNG")
    return path
