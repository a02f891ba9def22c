"""RelayBook: which relay URLs a coordinator lists, from members' heartbeats and probe outcomes."""

from __future__ import annotations

from node.policy import RelayBook, announcement_sources, relay_url

A, B = "0x" + "a" * 40, "0x" + "b" * 40


def test_a_claimed_relay_is_listed_only_after_a_successful_probe() -> None:
    book = RelayBook(max_age=60, recheck=60, retry=15)
    book.heard(A, "http://10.0.0.1:7000", now=100.0)
    assert book.due(100.0) == ["http://10.0.0.1:7000"]
    assert book.live(100.0) == {} and book.hosts(100.0) == set()
    book.record("http://10.0.0.1:7000", ok=True, now=101.0)
    assert book.live(101.0) == {"http://10.0.0.1:7000": 100.0}
    assert book.hosts(101.0) == {"10.0.0.1"}
    assert announcement_sources("http://origin:1", book.live(101.0)) == [
        "http://origin:1",
        "http://10.0.0.1:7000",
    ]
    book.heard(A, "http://10.0.0.1:7000", now=150.0)
    assert book.due(101.0 + 59) == [] and book.due(101.0 + 60) == ["http://10.0.0.1:7000"]  # recheck
    assert book.due(150.0 + 61) == [] and book.live(150.0 + 61) == {}  # not heard for max_age: dropped


def test_a_failed_probe_unlists_and_is_retried_sooner() -> None:
    book = RelayBook(max_age=60, recheck=60, retry=15)
    url = "http://10.0.0.1:7000"
    book.heard(A, url, 0.0)
    book.record(url, ok=True, now=1.0)
    book.heard(A, url, 30.0)
    book.record(url, ok=False, now=61.0, detail="HTTP 404")
    assert book.live(61.0) == {} and book.hosts(61.0) == set()
    assert book.refused(61.0) == {url: "HTTP 404"}
    assert book.due(61.0 + 14) == [] and book.due(61.0 + 15) == [url]


def test_one_url_per_member_and_silent_members_are_forgotten() -> None:
    book = RelayBook(max_age=60)
    for i in range(1000):  # a member cycling through URLs holds one claim, not a thousand
        book.heard(A, f"http://10.0.0.1:{7000 + i}", now=float(i) / 100)
    assert len(book.claims) == 1 and book.due(10.0) == ["http://10.0.0.1:7999"]
    book.record("http://10.0.0.1:7000", ok=True, now=10.0)  # an outcome for a URL nobody claims any more
    assert book.checks == {} and book.live(10.0) == {}
    book.record("http://10.0.0.1:7999", ok=True, now=10.0)
    book.heard(B, "http://10.0.0.2:7000", now=50.0)
    book.record("http://10.0.0.2:7000", ok=True, now=50.0)
    assert set(book.live(50.0)) == {"http://10.0.0.1:7999", "http://10.0.0.2:7000"}
    # A went silent: past max_age its relay is no longer listed, and the probe loop's next look forgets it
    assert set(book.live(75.0)) == {"http://10.0.0.2:7000"}
    assert book.due(75.0) == []
    assert set(book.claims) == {B} and set(book.checks) == {"http://10.0.0.2:7000"}


def test_two_members_naming_the_same_url_share_one_probe() -> None:
    book = RelayBook(max_age=60)
    book.heard(A, "http://10.0.0.9:7000", 0.0)
    book.heard(B, "http://10.0.0.9:7000", 5.0)
    assert book.due(5.0) == ["http://10.0.0.9:7000"]
    book.record("http://10.0.0.9:7000", ok=True, now=6.0)
    assert book.live(6.0) == {"http://10.0.0.9:7000": 5.0}


def test_relay_urls_from_heartbeats_are_checked_before_use() -> None:
    assert relay_url("http://127.0.0.1:7000") == "http://127.0.0.1:7000"
    assert relay_url("http://relay.example:80/") == "http://relay.example:80"
    assert relay_url("http://[::1]:7000") == "http://[::1]:7000"
    bad = [
        None, 7, b"http://127.0.0.1:7000", "https://127.0.0.1:7000", "ftp://h:1", "http://", "http://host",
        "http://[::1", "http://h:99999", "http://h:0", "http://h:x", "http://u:p@h:1", "http://h:1/?q=1",
        "http://h:1/#f", "http://h:1/a b", "http://h\x00:1", "http://h\u00e9:1", "http://" + "a" * 200 + ":1",
    ]  # fmt: skip
    for value in bad:
        assert relay_url(value) is None, value
