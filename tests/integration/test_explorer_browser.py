"""The explorer in real headless Chromium (Debian's `chromium` and `chromium-driver`, driven by selenium,
pinned in requirements.lock): the pool page of a chain with recorded, slashed work shows the audit's
numbers, the invalidation with its transaction and evidence, and a reward chart that renders (its
screenshot holds the line's colour); a 10,000-record pool's first and last pages load with their rows.

`make test` installs Chromium with apt where it can; elsewhere these tests are skipped, with the reason."""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from node import ops
from node.audit_read import audit
from node.metrics import Metrics, serve_http
from pool.explorer.view import PAGE_ROWS, tokens
from tests.conftest import World
from tests.integration.test_explorer import CURVE, explorer_running, pool_with_work, work_keys

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

pytestmark = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(DRIVER).exists()),
    reason="Debian's chromium and chromium-driver are not installed (make test installs them where apt-get works)",
)


def browser(tmp_path: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1280,2400", f"--user-data-dir={tmp_path / 'chromium'}",
    ):  # fmt: skip
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def cards(driver: Any) -> dict[str, str]:
    from selenium.webdriver.common.by import By

    return {
        c.get_attribute("data-k"): c.find_element(By.TAG_NAME, "b").text
        for c in driver.find_elements(By.CSS_SELECTOR, ".card")
    }


async def test_the_pool_page_in_chromium(chain: World, tmp_path: Path) -> None:
    from PIL import Image
    from selenium.webdriver.common.by import By

    pid, keys = await pool_with_work(chain, tmp_path)
    async with await chain.client(None) as reader:
        report = await audit(reader, pid)
    status = {"role": "coordinator", "reward_curve": CURVE}
    driver = await trio.to_thread.run_sync(browser, tmp_path)
    try:
        async with trio.open_nursery() as nursery:
            sport = await nursery.start(serve_http, Metrics(), "127.0.0.1", 0, lambda: status)
            ex, base = await explorer_running(chain, nursery, [f"http://127.0.0.1:{sport}/status"])
            await trio.to_thread.run_sync(driver.get, base + "/")
            link = await trio.to_thread.run_sync(driver.find_element, By.LINK_TEXT, f"pool {pid}")
            await trio.to_thread.run_sync(link.click)
            assert driver.current_url.endswith(f"/pool/{pid}")
            seen = await trio.to_thread.run_sync(cards, driver)
            t = report.totals
            assert seen["recorded units"] == f"{t['recorded_units']:,}"
            assert seen["invalidated units"] == f"{t['invalidated_units']:,}"
            assert seen["claimed units"] == f"{t['claimed_units']:,}"
            slashed = sum(n["slashed_tokens"] for n in report.nodes.values())
            assert seen["slashed"] == f"{tokens(slashed)} INTL"
            assert driver.find_element(By.ID, "audit").text == "audit consistent"
            dispute = driver.find_element(By.CSS_SELECTOR, "table.disputes tbody tr")
            tx = report.nodes[chain.node.address]["slashes"][0]["tx"]
            cells = [c.get_attribute("innerHTML") for c in dispute.find_elements(By.TAG_NAME, "td")]
            assert keys[0] in cells[0] and "slash" in cells[2] and ("0x" + "ee" * 32) in cells[5] and tx in cells[7]
            chart = driver.find_element(By.CSS_SELECTOR, "svg.chart")
            png = await trio.to_thread.run_sync(lambda: chart.screenshot_as_png)
            img = Image.open(io.BytesIO(png)).convert("RGB")
            line = sum(1 for px in img.getdata() if abs(px[0] - 0x24) < 40 and abs(px[2] - 0xEB) < 40 and px[1] < 0x90)
            assert img.size[0] > 300 and line > 200, (img.size, line)  # the blue line and its points are drawn
            (tmp_path / "explorer.png").write_bytes(await trio.to_thread.run_sync(driver.get_screenshot_as_png))
            nursery.cancel_scope.cancel()
        await ex.chain.aclose()
    finally:
        await trio.to_thread.run_sync(driver.quit)


@pytest.mark.slow
async def test_a_10000_record_pool_pages_its_records(chain: World, tmp_path: Path) -> None:
    """Records are paged (`PAGE_ROWS` a page, newest first): the first and the last page of a pool with
    10,000 records load in Chromium with their rows. (How fast: `bench/explorer.py`.)"""
    from selenium.webdriver.common.by import By

    from tests.integration.test_coordinator import _pool_with_two_members

    pid = await _pool_with_two_members(chain, tmp_path, fund=1000 * 10**18)
    keys = work_keys(10_000, "big")
    async with await chain.client(chain.coordinator) as c:
        await ops.record_work(c, pid, [ops.WorkItem(chain.node.address, k, 10, 0, "0x" + "cd" * 32) for k in keys])
    driver = await trio.to_thread.run_sync(browser, tmp_path)
    try:
        async with trio.open_nursery() as nursery:
            ex, base = await explorer_running(chain, nursery, [])
            with trio.fail_after(120):
                while pid not in ex.views:
                    await trio.sleep(0.2)
            last = 10_000 // PAGE_ROWS
            for page_no, first_key in ((1, keys[-1]), (last, keys[PAGE_ROWS - 1])):
                t0 = time.monotonic()
                await trio.to_thread.run_sync(driver.get, f"{base}/pool/{pid}?page={page_no}")
                took = time.monotonic() - t0
                rows = driver.find_elements(By.CSS_SELECTOR, "table.records tbody tr")
                assert len(rows) == PAGE_ROWS
                assert first_key in rows[0].get_attribute("innerHTML")
                print(f"page {page_no} of a 10,000-record pool loaded in {took:.2f} s")
            nursery.cancel_scope.cancel()
        await ex.chain.aclose()
    finally:
        await trio.to_thread.run_sync(driver.quit)
