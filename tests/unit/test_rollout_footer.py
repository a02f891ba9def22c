"""The pure-Python parquet footer reader that stands before pyarrow (node.rollout.footer): honest files
read the same as pyarrow reads them; footers pyarrow would abort the process on, and footers of shapes a
rollout never has, are refused with a clear error."""

from __future__ import annotations

import contextlib
import io
import struct

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
