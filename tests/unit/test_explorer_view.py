"""The explorer's pure pages: amounts, paging, the chart, escaping."""

from __future__ import annotations

from node.audit import Rec
from pool.explorer import render
from pool.explorer.view import PoolView, node_page, pool_page, pools_page


def test_amounts_are_written_for_people() -> None:
    t = render.TOKEN
    assert render.tokens(0) == "0"
    assert render.tokens(12 * t + t // 2) == "12.5"
    assert render.tokens(1234567 * t) == "1,234,567"
    assert render.tokens(t // 10_000) == "0.0001"
    assert render.tokens(5) == "<0.0001"
    assert render.tokens(-3 * t) == "-3"


def test_pages_are_clamped_and_linked() -> None:
    start, end, nav = render.pages(250, 2, "/p?")
    assert (start, end) == (100, 200) and 'href="/p?page=3"' in nav and "<b>2</b>" in nav
    assert render.pages(250, 99, "/p?")[:2] == (200, 250)  # past the end: the last page
    assert render.pages(250, 0, "/p?")[:2] == (0, 100)
    assert render.pages(10, 1, "/p?") == (0, 10, "")


def test_the_chart_draws_every_finite_point_and_says_when_empty() -> None:
    svg = render.line_chart([0.1, float("nan"), 0.3, 0.2], label="x")
    assert svg.count("<circle") == 3 and "0.300" in svg and "0.100" in svg
    assert "no policy steps yet" in render.line_chart([])
    assert render.line_chart([0.5]).count("<circle") == 1  # one point, a flat range


EVIL = '<script>alert("x")</script>'


def _view(records: list[Rec]) -> PoolView:
    return PoolView(
        pool_id=1, block=10, timestamp=1000, consistent=False, mismatches=[EVIL],
        params={"owner": EVIL, "status": "active", "coordinator": "0xc", "reward_rate": 10**15,
                "validation_window": 3600, "slash_amount": 5 * 10**18, "min_stake": 10**18,
                "spec_uri": EVIL, "spec_hash": "0x11", "bootstrap": EVIL, "created_at": 1},
        account={"budget": 10**21}, totals={"recorded_units": 30}, nodes={}, providers={},
        members={EVIL: EVIL}, left={}, validators=[EVIL], records=records,
    )  # fmt: skip


def test_every_string_is_escaped() -> None:
    recs = [Rec(EVIL, EVIL, EVIL, 10, 0, "0x", 2000, EVIL, evidence=EVIL)]
    live = [{"url": EVIL, "role": EVIL, "phase": EVIL, "gossip_rejected": {EVIL: 3}}]
    for html in (
        pool_page(_view(recs), live=live),
        node_page(_view(recs), EVIL),
        pools_page([{"pool_id": 1, "status": EVIL, "owner": EVIL, "spec_uri": EVIL}]),
    ):
        assert "<script>" not in html and "&lt;script&gt;" in html


def test_records_are_shown_newest_first_a_page_at_a_time() -> None:
    recs = [Rec(f"0xk{i:04d}", "0xn", "0xp", 1, 0, "0x", 2000, "0xt") for i in range(250)][::-1]
    p3 = pool_page(_view(recs), page_no=3)
    assert "0xk0049" in p3 and "0xk0050" not in p3 and "0xk0000" in p3


def test_a_page_that_cannot_be_drawn_is_a_500_not_a_dead_server() -> None:
    from types import SimpleNamespace

    import h11

    from pool.explorer.server import Explorer

    ex = Explorer(SimpleNamespace(deployment=SimpleNamespace(block=0)))  # type: ignore[arg-type]
    broken = _view([])
    broken.params = {}  # e.g. a pool record of a contract version this explorer does not know
    ex.views[1] = broken
    ex.ready.set()

    def status(target: bytes) -> int:
        return next(ev.status_code for ev in ex.route(b"GET", target) if isinstance(ev, h11.Response))

    assert status(b"/pool/1") == 500
    assert status(b"/pool/1/node/0xn") == 200  # the node page needs no parameters
    assert status(b"/pool/2") == 404 and status(b"/\xff") == 400
    assert next(ev.status_code for ev in ex.route(b"POST", b"/") if isinstance(ev, h11.Response)) == 405


def test_versions_announced_with_other_weights_are_shown_from_any_status_page() -> None:
    from pool.explorer.live import conflicts_table

    h1, h2 = "11" * 32, "22" * 32
    pages = [
        {"url": "http://v1/status", "address": "0x" + "aa" * 20, "policy_conflicts": {"3": [h1, h2]}},
        {"url": "http://v2/status", "policy_conflicts": {"<script>": ["<b>", 7, None]}},  # hostile shapes
        {"url": "http://v3/status", "policy_conflicts": "nonsense"},
        {"url": "http://v4/status"},
    ]
    html = "".join(conflicts_table(pages))
    assert "announced with other weights" in html and "http://v1/status" in html
    assert h1[:10] in html and h2[-8:] in html
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert conflicts_table([{"url": "x"}, {"policy_conflicts": {}}]) == []
