"""The explorer's HTML building blocks, pure: amounts, addresses and durations written for people, every
string escaped (it comes from someone else), an inline SVG line chart, the page skeleton (inline CSS, no
script or external asset, a self-refresh), tables and page links."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

TOKEN = 10**18
PAGE_ROWS = 100
CHART_POINTS = 400  # at most this many points drawn; a longer curve is sampled evenly (its ends kept)


# ---------------------------------------------------------------------- formatting


def tokens(base_units: int) -> str:
    """An amount of 18-decimal tokens, at most 4 decimals, exact zeros dropped: 12.5, 0.0001, 3."""
    whole, frac = divmod(abs(int(base_units)), TOKEN)
    digits = f"{frac:018d}"[:4].rstrip("0")
    if whole == 0 and frac and not digits:
        return "<0.0001" if base_units > 0 else ">-0.0001"
    return ("-" if base_units < 0 else "") + f"{whole:,}" + ("." + digits if digits else "")


def short(addr: str, n: int = 6) -> str:
    a = str(addr)
    return a if len(a) <= 2 * n + 2 else f"{a[: n + 2]}...{a[-n:]}"


def duration(seconds: int) -> str:
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size and s % size == 0:
            return f"{s // size} {unit}"
    return f"{s} s"


def e(v: Any) -> str:
    return html.escape(str(v), quote=True)


def code(v: Any, title: bool = True) -> str:
    full = e(v)
    return f'<code title="{full}">{e(short(str(v)))}</code>' if title else f"<code>{full}</code>"


# ---------------------------------------------------------------------- the chart


def line_chart(values: Sequence[float], *, width: int = 640, height: int = 220, label: str = "") -> str:
    """An inline SVG line chart of `values` against their index (policy versions 1..n), with its
    axis ranges written out; an empty chart says so. Values that are not finite numbers are skipped;
    at most `CHART_POINTS` are drawn (evenly sampled), so the chart's size is bounded."""
    pad_l, pad_r, pad_t, pad_b = 48, 12, 12, 28
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    pts = [f for f in (_finite(v) for v in values) if f is not None]
    parts = [
        f'<svg class="chart" role="img" aria-label="{e(label)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="#f7f9fc" stroke="#c9d3e0"/>',
    ]
    if not pts:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no policy steps yet</text></svg>')
        return "".join(parts)
    lo, hi = min(pts), max(pts)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    n = len(pts)
    shown = (
        range(n)
        if n <= CHART_POINTS
        else sorted({round(k * (n - 1) / (CHART_POINTS - 1)) for k in range(CHART_POINTS)})
    )

    def xy(i: int, v: float) -> tuple[float, float]:
        x = pad_l + (w * i / (n - 1) if n > 1 else w / 2)
        return round(x, 1), round(pad_t + h - (v - lo) / (hi - lo) * h, 1)

    coords = [xy(i, pts[i]) for i in shown]
    parts.append(
        '<polyline fill="none" stroke="#2463eb" stroke-width="2.5" points="'
        + " ".join(f"{x},{y}" for x, y in coords)
        + '"/>'
    )
    parts += [f'<circle cx="{x}" cy="{y}" r="3" fill="#2463eb"/>' for x, y in coords]
    parts += [
        f'<text x="{pad_l - 6}" y="{pad_t + 10}" text-anchor="end" font-size="11">{hi:.3f}</text>',
        f'<text x="{pad_l - 6}" y="{pad_t + h}" text-anchor="end" font-size="11">{lo:.3f}</text>',
        f'<text x="{pad_l}" y="{height - 8}" font-size="11">v1</text>',
        f'<text x="{pad_l + w}" y="{height - 8}" text-anchor="end" font-size="11">v{n}</text>',
        "</svg>",
    ]
    return "".join(parts)


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer beyond any float
        return None
    return f if math.isfinite(f) else None


# ---------------------------------------------------------------------- pages

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#1b2430;background:#fff}
header{background:#13233f;color:#fff;padding:10px 24px}header a{color:#fff;text-decoration:none;font-weight:600}
main{padding:16px 24px;max-width:1200px}h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{border-bottom:1px solid #e3e8ef;
padding:4px 10px;text-align:left;vertical-align:top}th{background:#f2f5f9}td.n{text-align:right;
font-variant-numeric:tabular-nums}code{font-size:12px}.ok{color:#137333;font-weight:600}
.bad{color:#b3261e;font-weight:600}.muted{color:#667}.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #d7dee8;border-radius:6px;padding:8px 14px;min-width:140px}
.card b{display:block;font-size:18px}nav.pages a{margin-right:8px}
"""


def page(title: str, body: str, *, refresh: int = 10, updated: str = "") -> str:
    """A whole HTML page: reloads itself every `refresh` seconds (0: never)."""
    meta = f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh > 0 else ""
    foot = f'<p class="muted">{e(updated)}</p>' if updated else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"{meta}<title>{e(title)}</title><style>{_CSS}</style></head><body>"
        '<header><a href="/">intellect-node explorer</a></header>'
        f"<main>{body}{foot}</main></body></html>"
    )


def table(head: Iterable[str], rows: Iterable[Iterable[str]], *, cls: str = "") -> str:
    out = [f'<table class="{e(cls)}"><thead><tr>' + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>" + "".join(r) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def td(v: Any, num: bool = False) -> str:
    return f'<td class="n">{e(v)}</td>' if num else f"<td>{e(v)}</td>"


def raw(markup: str) -> str:
    return f"<td>{markup}</td>"


def pages(total: int, current: int, base: str, rows: int = PAGE_ROWS) -> tuple[int, int, str]:
    """The rows [start, end) of page `current` (1-based, clamped) and the page links (`{base}page=N`;
    the previous and next pages marked `rel="prev"` / `rel="next"`)."""
    n = max(1, math.ceil(total / rows))
    cur = min(max(1, current), n)
    start = (cur - 1) * rows
    if n == 1:
        return start, min(total, start + rows), ""
    links = []
    for p in sorted({1, cur - 1, cur, cur + 1, n} & set(range(1, n + 1))):
        rel = ' rel="next"' if p == cur + 1 else ' rel="prev"' if p == cur - 1 else ""
        links.append(f"<b>{p}</b>" if p == cur else f'<a href="{e(base)}page={p}"{rel}>{p}</a>')
    return start, min(total, start + rows), f'<nav class="pages">page {" ".join(links)} of {n:,}</nav>'


def page_count(total: int, rows: int = PAGE_ROWS) -> int:
    return max(1, math.ceil(total / rows))
