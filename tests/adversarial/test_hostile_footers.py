"""Hostile rollout footers, as an attacker would upload them: one that made pyarrow abort the process (the
coordinator or validator that read it died), one that says one thing to our footer check and another to
pyarrow's reader, and one whose footer understates what its pages hold (a 3 KB file decoded to 418 MB).
Each is refused before pyarrow reads it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from node.rollout.file import RolloutFile, RolloutFormatError, _footer_shape
from node.rollout.footer import FooterError, read_footer
from tests.unit.test_rollout_footer import _file, _footer, _with_footer


def test_a_histogram_that_aborts_pyarrow_is_refused():
    """The footer a fuzzer found: the size statistics of `prompt_tokens` give a repetition-level histogram
    of 6 entries where the schema allows 2. pyarrow throws from a metadata accessor with no exception
    translation, and the process aborts; the rollout reader refuses the file first."""
    data = _file().to_bytes()
    old = _footer(data)
    # SizeStatistics {2: [2, 4], 3: [0, 0, 0, 6]} of the prompt_tokens column, in Thrift compact bytes
    pattern = b"\x29\x26\x04\x08\x19\x46\x00\x00\x00\x0c\x00"
    assert old.count(pattern) == 1, "pyarrow now writes this footer differently: update the pattern"
    bad = _with_footer(data, old.replace(pattern, b"\x29\x66" + b"\x04" * 6 + pattern[4:]))

    probe = (
        "import io, sys, pyarrow.parquet as pq\n"
        "md = pq.ParquetFile(io.BytesIO(sys.stdin.buffer.read())).metadata\n"
        "md.row_group(0).column(3).total_uncompressed_size\n"
    )
    crashed = subprocess.run([sys.executable, "-c", probe], input=bad, capture_output=True, timeout=60)
    assert crashed.returncode < 0 and b"histogram" in crashed.stderr, "the attack no longer aborts pyarrow"

    with pytest.raises(RolloutFormatError, match="histogram"):
        RolloutFile.from_bytes(bad)


def test_a_field_of_another_thrift_type_is_refused():
    """pyarrow's generated reader skips (or misreads) a field whose thrift type is not parquet.thrift's, so a
    footer could say one thing to this check and another to pyarrow (a size-statistics struct hidden in a
    string of `encodings` aborted pyarrow this way). A field of the wrong type is refused."""
    data = _file().to_bytes()
    old = _footer(data)
    head = b"\x1c\x15\x02\x19"  # column metadata: its type (INT32), then the encodings list's header
    at = old.index(head) + len(head)
    assert old[at] & 0x0F == 5, "the encodings list no longer holds i32"
    bad = old[:at] + bytes([(old[at] & 0xF0) | 8]) + old[at + 1 :]  # the same list, declared as strings
    with pytest.raises(FooterError, match="thrift type 8 where the format has 5"):
        read_footer(_with_footer(data, bad), _footer_shape())


def test_page_headers_must_agree_with_the_footer():
    """pyarrow decodes by the page headers, not the footer's counts: a footer that says one value per
    chunk over pages that declare millions was decoded in full (418 MB for a 3 KB file). The pages are
    walked first; their counts must be the footer's, their byte ranges the chunk's."""
    import dataclasses

    from node.rollout.footer import read_pages

    data = _file(64, 300).to_bytes()
    footer = read_footer(data, _footer_shape())
    totals = read_pages(data, footer)
    assert totals.values >= footer.num_values and totals.pages >= 9
    chunk = footer.row_groups[0].columns[4]  # completion_tokens

    def with_chunk(**changes: int) -> Any:
        columns = list(footer.row_groups[0].columns)
        columns[4] = dataclasses.replace(chunk, **changes)
        group = dataclasses.replace(footer.row_groups[0], columns=tuple(columns))
        return dataclasses.replace(footer, row_groups=(group,))

    with pytest.raises(FooterError, match=f"declare {chunk.num_values} values, its metadata 1"):
        read_pages(data, with_chunk(num_values=1))  # the lie the bomb told
    with pytest.raises(FooterError, match="outside"):
        read_pages(data, with_chunk(compressed_bytes=len(data)))
    with pytest.raises(FooterError):
        read_pages(data, with_chunk(start=chunk.start + 1))  # not at a page header
