"""The pure-Python parquet footer reader that stands before pyarrow (node.rollout.footer): honest files
read the same as pyarrow reads them; footers pyarrow would abort the process on, and footers of shapes a
rollout never has, are refused with a clear error."""

from __future__ import annotations

import contextlib
import io
import struct
import subprocess
import sys
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.rollout.file import RolloutFile, RolloutFormatError, RolloutHeader, RolloutSample, _footer_shape
from node.rollout.footer import FooterError, read_footer


def _file(rows: int = 2, tokens: int = 40) -> RolloutFile:
    header = RolloutHeader(1, "0x" + "11" * 20, 0, "math", 7, {"temperature": 1.0}, "tiny")
    samples = [
        RolloutSample(0, i, "t0", [1, 2, 3], [5 + i] * tokens, [-0.5] * tokens, 1.0, "length",
                      [b"\x01" * 258] * ((tokens + 31) // 32))
        for i in range(rows)
    ]  # fmt: skip
    return RolloutFile(header, samples)


def _with_footer(data: bytes, footer: bytes) -> bytes:
    (size,) = struct.unpack("<I", data[-8:-4])
    return data[: len(data) - 8 - size] + footer + struct.pack("<I", len(footer)) + b"PAR1"


def _footer(data: bytes) -> bytes:
    (size,) = struct.unpack("<I", data[-8:-4])
    return data[len(data) - 8 - size : len(data) - 8]


@pytest.mark.parametrize(("rows", "tokens"), [(1, 1), (2, 40), (64, 300), (300, 7)])
def test_honest_footers_read_as_pyarrow_reads_them(rows, tokens):
    data = _file(rows, tokens).to_bytes()
    footer = read_footer(data, _footer_shape())
    md = pq.ParquetFile(io.BytesIO(data)).metadata
    assert footer.num_rows == md.num_rows == rows
    assert len(footer.row_groups) == md.num_row_groups
    for g, info in zip([md.row_group(i) for i in range(md.num_row_groups)], footer.row_groups, strict=True):
        assert info.total_byte_size == g.total_byte_size
        assert [c.num_values for c in info.columns] == [g.column(j).num_values for j in range(g.num_columns)]
        assert [c.uncompressed_bytes for c in info.columns] == [
            g.column(j).total_uncompressed_size for j in range(g.num_columns)
        ]
    assert RolloutFile.from_bytes(data) == _file(rows, tokens)


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


@pytest.mark.parametrize(
    ("footer", "needle"),
    [
        (b"\xf9\xfc\xff\xff\xff\x0f\x00", "container"),  # field 15: a list of 2**32 - 1 structs in 7 bytes
        (b"\xfc" + b"\x1c" * 40 + b"\x00" * 41, "nested too deep"),  # struct in struct in struct ...
        (b"\x15\x02", "ends inside"),  # a field whose value is cut off
        (b"\xfe\x00", "unknown thrift type"),
        (b"\x15\x02\x05\x02\x02\x00", "repeats field"),  # field 1, then field 1 again by its long id
        (b"\x16\x02\x00", "thrift type 6 where the format has 5"),  # the version as an i64, not an i32
    ],
)
def test_malformed_footers_are_clear_errors(footer, needle):
    data = _file().to_bytes()
    with pytest.raises(FooterError, match=needle):
        read_footer(_with_footer(data, footer), _footer_shape())


def test_shapes_a_rollout_never_has_are_refused():
    data = _file().to_bytes()
    old = _footer(data)
    assert read_footer(data, _footer_shape()).num_rows == 2
    # the schema's first element renamed: pyarrow would read another table; we refuse before it
    root = b"\x18\x06schema\x15\x12"  # the root schema element's name, then its 9 children
    assert old.count(root) == 1
    with pytest.raises(FooterError, match="schema"):
        read_footer(_with_footer(data, old.replace(root, root.replace(b"schema", b"schemb"))), _footer_shape())
    # bytes left over after the footer struct
    with pytest.raises(FooterError, match="after the footer"):
        read_footer(_with_footer(data, old + b"\x00"), _footer_shape())
    with pytest.raises(FooterError, match="magic"):
        read_footer(data[:-4] + b"PARE", _footer_shape())
    # a footer of a million list entries: refused by its size, before a Python object is made
    huge = b"\x19\xf5\xc0\x84\x3d" + b"\x02" * 1_000_000 + b"\x00"
    with pytest.raises(FooterError, match="limit"):
        read_footer(_with_footer(data, huge), _footer_shape())


_HONEST = _file().to_bytes()
_TAIL = len(_footer(_HONEST)) + 8


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, _TAIL - 1), st.integers(0, 255)), min_size=1, max_size=6))
def test_footer_mutations_never_crash(edits):
    """Byte edits inside the footer (where the abort was found): every result is a file or a clear error."""
    data = bytearray(_HONEST)
    for pos, value in edits:
        data[len(data) - _TAIL + pos] = value
    with contextlib.suppress(RolloutFormatError):
        RolloutFile.from_bytes(bytes(data))


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
