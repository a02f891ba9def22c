"""Exceptions raised where nobody can catch them (finalisers) reach the daemon's log with their source."""

from __future__ import annotations

import gc
import logging
import sys

import pytest

from node.runtime import log_unraisable


class _Finaliser:
    def __del__(self) -> None:
        raise RuntimeError("unknown async library, or not in async context")


def test_unraisable_exception_is_logged_with_its_object(caplog: pytest.LogCaptureFixture) -> None:
    old = sys.unraisablehook
    sys.unraisablehook = log_unraisable
    try:
        with caplog.at_level(logging.ERROR, logger="intellect.unraisable"):
            _Finaliser()
            gc.collect()
    finally:
        sys.unraisablehook = old
    [rec] = [r for r in caplog.records if r.name == "intellect.unraisable"]
    text = rec.getMessage()
    assert "_Finaliser.__del__" in text and "MainThread" in text
    assert "RuntimeError: unknown async library" in text and "Traceback" in text
