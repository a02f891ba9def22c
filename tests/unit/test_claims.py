"""Why a named record cannot be claimed (the CLI explains it before sending anything)."""

from __future__ import annotations

from node.ops import why_not_claimable

ME = "0x" + "a1" * 20
OTHER = "0x" + "b2" * 20
KEY = "0x" + "11" * 32


def rec(status: int, provider: str = ME, deadline: int = 100) -> dict[str, object]:
    return {"status": status, "provider": provider, "deadline": deadline, "units": 5}


def test_a_final_pending_record_of_the_caller_is_claimable() -> None:
    assert why_not_claimable(KEY, rec(1), ME, now=100) is None
    assert why_not_claimable(KEY, rec(1), ME.upper().replace("0X", "0x"), now=500) is None


def test_each_reason_is_named() -> None:
    assert "no work" in str(why_not_claimable(KEY, rec(0), ME, now=500))
    assert "already invalidated" in str(why_not_claimable(KEY, rec(2), ME, now=500))
    assert "already claimed" in str(why_not_claimable(KEY, rec(3), ME, now=500))
    assert "belongs to provider" in str(why_not_claimable(KEY, rec(1, provider=OTHER), ME, now=500))
    assert "still in its validation window" in str(why_not_claimable(KEY, rec(1), ME, now=99))
