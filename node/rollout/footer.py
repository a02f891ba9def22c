"""The parquet footer of a rollout file, read in pure Python before pyarrow sees it.

pyarrow's per-row-group and per-column metadata accessors (`RowGroupMetaData.column`, ...) are declared
without C++ exception translation: a footer with, say, an inconsistent size-statistics histogram makes the
C++ side throw through Cython and abort the whole process (a worker's upload would kill the coordinator
or the validator). So the footer is decoded here from its Thrift compact encoding, with every length
bounded by the bytes that are really there, and only the figures the reader needs come out: rows, and per
column chunk the declared value count and sizes. A footer that holds anything our writer never writes
(size statistics, page indexes, bloom filters, encryption, file paths) is refused too, so pyarrow's reader
only ever meets the shapes the round-trip tests cover.

Pure functions, no I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from node.errors import IntellectError

MAGIC = b"PAR1"
MAX_DEPTH = 12
# A rollout's footer is a few KB (one row group of nine columns and the header); a bigger one is refused
# before it is decoded (Python objects for a footer of millions of list entries would cost gigabytes).
MAX_FOOTER_BYTES = 256 * 1024

# Thrift compact protocol type codes.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT, _UUID = range(1, 14)

# Field ids a rollout footer may hold (parquet.thrift), as pyarrow writes them with statistics off and no
# page index. FileMetaData {1 version, 2 schema, 3 num_rows, 4 row_groups, 5 key_value_metadata,
# 6 created_by, 7 column_orders}; RowGroup {1 columns, 2 total_byte_size, 3 num_rows, 5 file_offset,
# 6 total_compressed_size, 7 ordinal}; ColumnChunk {2 file_offset, 3 meta_data}; ColumnMetaData {1 type,
# 2 encodings, 3 path_in_schema, 4 codec, 5 num_values, 6 total_uncompressed_size, 7 total_compressed_size,
# 9 data_page_offset, 11 dictionary_page_offset, 13 encoding_stats, 16 size_statistics}; SizeStatistics
# {1 unencoded_byte_array_data_bytes, 2 repetition_level_histogram, 3 definition_level_histogram}.
FILE_FIELDS = frozenset({1, 2, 3, 4, 5, 6, 7})
ROW_GROUP_FIELDS = frozenset({1, 2, 3, 5, 6, 7})
CHUNK_FIELDS = frozenset({2, 3})
COLUMN_META_FIELDS = frozenset({1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 16})
SIZE_STATS_FIELDS = frozenset({1, 2, 3})


# The thrift types of the fields that matter (parquet.thrift): a type code, ("list", element) or
# ("struct", name); a struct not named here is read untyped (its contents are compared with the writer's
# or ignored by pyarrow). A bool is _TRUE.
Spec = int | tuple[str, object]
SPECS: dict[str, dict[int, Spec]] = {
    "FileMetaData": {1: _I32, 2: ("list", ("struct", "SchemaElement")), 3: _I64, 4: ("list", ("struct", "RowGroup")),
                     5: ("list", ("struct", "KeyValue")), 6: _BINARY, 7: ("list", ("struct", None))},
    "SchemaElement": {1: _I32, 2: _I32, 3: _I32, 4: _BINARY, 5: _I32, 6: _I32, 7: _I32, 8: _I32, 9: _I32,
                      10: ("struct", None)},
    "KeyValue": {1: _BINARY, 2: _BINARY},
    "RowGroup": {1: ("list", ("struct", "ColumnChunk")), 2: _I64, 3: _I64, 4: ("list", ("struct", None)), 5: _I64,
                 6: _I64, 7: _I16},
    "ColumnChunk": {1: _BINARY, 2: _I64, 3: ("struct", "ColumnMetaData"), 4: _I64, 5: _I32, 6: _I64, 7: _I32},
    "ColumnMetaData": {1: _I32, 2: ("list", _I32), 3: ("list", _BINARY), 4: _I32, 5: _I64, 6: _I64, 7: _I64,
                       8: ("list", ("struct", "KeyValue")), 9: _I64, 10: _I64, 11: _I64, 12: ("struct", None),
                       13: ("list", ("struct", "PageEncodingStats")), 14: _I64, 15: _I32,
                       16: ("struct", "SizeStatistics")},
    "PageEncodingStats": {1: _I32, 2: _I32, 3: _I32},
    "SizeStatistics": {1: _I64, 2: ("list", _I64), 3: ("list", _I64)},
    "PageHeader": {1: _I32, 2: _I32, 3: _I32, 4: _I32, 5: ("struct", "DataPageHeader"), 6: ("struct", None),
                   7: ("struct", "DictionaryPageHeader"), 8: ("struct", "DataPageHeaderV2")},
    "DataPageHeader": {1: _I32, 2: _I32, 3: _I32, 4: _I32, 5: ("struct", None)},
    "DictionaryPageHeader": {1: _I32, 2: _I32, 3: _TRUE},
    "DataPageHeaderV2": {1: _I32, 2: _I32, 3: _I32, 4: _I32, 5: _I32, 6: _I32, 7: _TRUE, 8: ("struct", None)},
}  # fmt: skip


def _code(spec: Spec) -> int:
    if isinstance(spec, int):
        return spec
    return _LIST if spec[0] == "list" else _STRUCT


class FooterError(IntellectError, ValueError):
    """The footer is not one a rollout file may have."""


@dataclass(frozen=True)
class ColumnChunkInfo:
    num_values: int
    uncompressed_bytes: int
    compressed_bytes: int
    start: int  # file offset of its first page (the dictionary page's, if it has one)


@dataclass(frozen=True)
class RowGroupInfo:
    num_rows: int
    total_byte_size: int
    columns: tuple[ColumnChunkInfo, ...]


@dataclass(frozen=True)
class Footer:
    num_rows: int
    row_groups: tuple[RowGroupInfo, ...]
    offset: int  # where the footer starts: the pages lie before it

    @property
    def num_values(self) -> int:
        return sum(c.num_values for g in self.row_groups for c in g.columns)

    @property
    def uncompressed_bytes(self) -> int:
        return max(
            sum(g.total_byte_size for g in self.row_groups),
            sum(c.uncompressed_bytes for g in self.row_groups for c in g.columns),
        )


class _Reader:
    """Reads `buf[pos:end]`; nothing past `end`."""

    def __init__(self, buf: bytes, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise FooterError("footer ends inside a value")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        return self.take(1)[0]

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise FooterError("footer varint longer than 64 bits")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def count(self) -> int:
        """A container's element count: never more than the bytes left (every element takes one)."""
        n = self.varint()
        if n > self.end - self.pos:
            raise FooterError(f"footer container of {n} elements in {self.end - self.pos} bytes")
        return n

    def value(self, kind: int, depth: int, spec: Spec | None = None) -> object:
        """A value of thrift type `kind`; with `spec` (the type parquet.thrift gives the field), any other
        type is refused: pyarrow's generated reader would skip such a field, or misread it, and see another
        footer than the one checked here."""
        if depth > MAX_DEPTH:
            raise FooterError("footer nested too deep")
        if spec is not None and _code(spec) != (_TRUE if kind == _FALSE else kind):
            raise FooterError(f"footer field of thrift type {kind} where the format has {_code(spec)}")
        if kind in (_TRUE, _FALSE):  # inside a container a bool is one byte of its own
            return self.byte() == 1
        if kind == _BYTE:
            return self.byte()
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _DOUBLE:
            return struct.unpack("<d", self.take(8))[0]
        if kind == _UUID:
            return self.take(16)
        if kind == _BINARY:
            return self.take(self.count())
        if kind in (_LIST, _SET):
            head = self.byte()
            n = head >> 4
            if n == 15:
                n = self.count()
            elif n > self.end - self.pos:
                raise FooterError("footer list longer than the bytes left")
            elem = spec[1] if isinstance(spec, tuple) and spec[0] == "list" else None
            return [self.value(head & 0x0F, depth + 1, elem) for _ in range(n)]
        if kind == _MAP:
            n = self.count()
            if not n:
                return {}
            types = self.byte()
            return [(self.value(types >> 4, depth + 1), self.value(types & 0x0F, depth + 1)) for _ in range(n)]
        if kind == _STRUCT:
            name = spec[1] if isinstance(spec, tuple) and spec[0] == "struct" else None
            return self.struct(depth + 1, name)
        raise FooterError(f"footer holds unknown thrift type {kind}")

    def struct(self, depth: int, name: str | None = None) -> dict[int, object]:
        """A struct's fields by id; with `name`, typed as parquet.thrift's struct of that name."""
        if depth > MAX_DEPTH:
            raise FooterError("footer nested too deep")
        types = SPECS.get(name, {}) if name else {}
        fields: dict[int, object] = {}
        last = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == 0:
                return fields
            delta = head >> 4
            fid = last + delta if delta else self.zigzag()
            if fid in fields:
                raise FooterError(f"footer repeats field {fid}")
            spec = types.get(fid)
            if kind in (_TRUE, _FALSE):  # a struct's bool lives in its field header
                if spec is not None and spec != _TRUE:
                    raise FooterError(f"footer field {fid} of {name} is a bool where the format has {_code(spec)}")
                fields[fid] = kind == _TRUE
            else:
                fields[fid] = self.value(kind, depth, spec)
            last = fid


def _int(fields: dict[int, object], fid: int, what: str) -> int:
    v = fields.get(fid)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise FooterError(f"footer {what} is missing or negative")
    return v


def _structs(v: object, what: str) -> list[dict[int, object]]:
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise FooterError(f"footer {what} is not a list of structs")
    return v  # type: ignore[return-value]


def _only(fields: dict[int, object], allowed: frozenset[int], what: str) -> None:
    if set(fields) - allowed:
        raise FooterError(f"{what} holds fields {sorted(set(fields) - allowed)} a rollout file never has")


def _decode(data: bytes) -> dict[int, object]:
    if len(data) < 12 or data[:4] != MAGIC or data[-4:] != MAGIC:
        raise FooterError("not a plain parquet file (magic bytes missing, or the footer is encrypted)")
    (size,) = struct.unpack("<I", data[-8:-4])
    if size > len(data) - 12:
        raise FooterError(f"a footer of {size} bytes in a file of {len(data)}")
    if size > MAX_FOOTER_BYTES:
        raise FooterError(f"a footer of {size} bytes, the limit is {MAX_FOOTER_BYTES}")
    start = len(data) - 8 - size
    r = _Reader(data, start, len(data) - 8)
    meta = r.struct(0, "FileMetaData")
    if r.pos != r.end:
        raise FooterError(f"{r.end - r.pos} bytes after the footer's end")
    return meta


@dataclass(frozen=True)
class _Column:
    """What one column chunk's metadata must say, learnt from a file our writer wrote."""

    kind: object  # physical type
    path: object  # path in the schema
    codec: object
    stats: frozenset[int]  # size-statistics fields present
    levels: tuple[int, int]  # histogram lengths: repetition, definition


@dataclass(frozen=True)
class Template:
    schema: object  # the schema elements, exactly
    columns: tuple[_Column, ...]


def template(reference: bytes) -> Template:
    """The footer shape of `reference`, a file the rollout writer wrote: a footer read later must have
    the same schema elements and, column by column, the same types, paths, codec and histogram lengths
    (pyarrow's metadata code throws, uncaught, on a histogram whose length does not fit the schema)."""
    meta = _decode(reference)
    (group,) = _structs(meta.get(4), "row groups")
    columns = []
    for c in _structs(group.get(1), "column chunks"):
        m = c[3]
        assert isinstance(m, dict)
        st = m.get(16, {})
        assert isinstance(st, dict)
        rep, dfn = st.get(2, []), st.get(3, [])
        assert isinstance(rep, list) and isinstance(dfn, list)
        columns.append(_Column(m.get(1), m.get(3), m.get(4), frozenset(st), (len(rep), len(dfn))))
    return Template(meta.get(2), tuple(columns))


def _check_size_stats(st: object, col: _Column) -> None:
    if not isinstance(st, dict):
        raise FooterError("column size statistics are not a struct")
    _only(st, SIZE_STATS_FIELDS, "column size statistics")
    if 1 in st and (1 not in col.stats or not isinstance(st[1], int) or st[1] < 0):
        raise FooterError("column size statistics give a byte-array size where the column has none")
    for fid, want in ((2, col.levels[0]), (3, col.levels[1])):
        hist = st.get(fid, [])
        if not isinstance(hist, list) or len(hist) not in (0, want):
            raise FooterError(f"a level histogram does not fit the column (want {want} entries)")
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in hist):
            raise FooterError("a level histogram holds a negative count")


def read_footer(data: bytes, shape: Template) -> Footer:
    """The footer of `data` (a whole parquet file) if it has the shape of `shape`'s; FooterError
    otherwise."""
    meta = _decode(data)
    _only(meta, FILE_FIELDS, "the footer")
    if meta.get(2) != shape.schema:
        raise FooterError("the footer's schema is not the rollout format's")
    rows = _int(meta, 3, "row count")
    groups = []
    for g in _structs(meta.get(4, []), "row groups"):
        _only(g, ROW_GROUP_FIELDS, "a row group")
        chunks = _structs(g.get(1), "column chunks")
        if len(chunks) != len(shape.columns):
            raise FooterError(f"a row group holds {len(chunks)} column chunks, the format has {len(shape.columns)}")
        infos = []
        for c, col in zip(chunks, shape.columns, strict=True):
            _only(c, CHUNK_FIELDS, "a column chunk")
            m = c.get(3)
            if not isinstance(m, dict):
                raise FooterError("a column chunk has no metadata")
            _only(m, COLUMN_META_FIELDS, "column metadata")
            if (m.get(1), m.get(3), m.get(4)) != (col.kind, col.path, col.codec):
                raise FooterError("a column chunk's type, path or codec is not the format's")
            if 16 in m:
                _check_size_stats(m[16], col)
            start = _int(m, 11, "dictionary page offset") if 11 in m else _int(m, 9, "data page offset")
            infos.append(ColumnChunkInfo(_int(m, 5, "value count"), _int(m, 6, "size"), _int(m, 7, "size"), start))
        groups.append(RowGroupInfo(_int(g, 3, "row group rows"), _int(g, 2, "row group size"), tuple(infos)))
    if sum(g.num_rows for g in groups) != rows:
        raise FooterError("the row groups do not add up to the file's row count")
    return Footer(rows, tuple(groups), len(data) - 8 - struct.unpack("<I", data[-8:-4])[0])


MAX_PAGES = 4096  # pages in one rollout file (an honest one has a few per column)
PAGE_FIELDS = frozenset({1, 2, 3, 4, 5, 7, 8})  # type, sizes, crc, data / dictionary / data v2 header
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 1, 2, 3


@dataclass(frozen=True)
class PageTotals:
    pages: int
    values: int  # values the pages declare, dictionary entries included
    uncompressed_bytes: int  # what their decompressed bodies declare


def read_pages(data: bytes, footer: Footer) -> PageTotals:
    """Walk the page headers of every column chunk. The footer's value counts and sizes are only what the
    writer claims: pyarrow decodes by the page headers, so a file whose footer says one value and whose
    pages say millions would decode them all. Each chunk's pages must fill its byte range exactly and
    declare exactly the footer's value count; the totals are what a decode may cost."""
    pages = values = decompressed = 0
    for group in footer.row_groups:
        for chunk in group.columns:
            pos, end = chunk.start, chunk.start + chunk.compressed_bytes
            if pos < len(MAGIC) or end > footer.offset:
                raise FooterError(f"a column chunk at {pos}..{end} lies outside the file's pages")
            declared = 0
            while pos < end:
                pages += 1
                if pages > MAX_PAGES:
                    raise FooterError(f"more than {MAX_PAGES} pages")
                r = _Reader(data, pos, end)
                header = r.struct(0, "PageHeader")
                _only(header, PAGE_FIELDS, "a page header")
                kind = header.get(1)
                size, body = _int(header, 2, "page size"), _int(header, 3, "page size")
                sub = (
                    {_DATA_PAGE: 5, _DICTIONARY_PAGE: 7, _DATA_PAGE_V2: 8}.get(kind) if isinstance(kind, int) else None
                )
                detail = header.get(sub) if sub is not None else None
                if not isinstance(detail, dict):
                    raise FooterError(f"a page of type {kind!r} without its header (index pages are never written)")
                n = _int(detail, 1, "page value count")
                if kind == _DICTIONARY_PAGE:
                    values += n
                else:
                    declared += n
                decompressed += size
                pos = r.pos + body
            if pos != end:
                raise FooterError("a column chunk's pages run past its end")
            if declared != chunk.num_values:
                raise FooterError(f"a column chunk's pages declare {declared} values, its metadata {chunk.num_values}")
            values += declared
    return PageTotals(pages, values, decompressed)
