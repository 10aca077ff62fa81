#!/usr/bin/env python3
"""Writes the Parquet fixtures of tests/data/test_parquet.c and their expected rows.

    $PYTHON tests/data/gen_parquet_fixtures.py     (a python with pyarrow >= 10; pandas, polars for their files)

For each NAME.parquet under tests/data/parquet/ it writes NAME.jsonl: the rows as pyarrow itself reads them back
(pq.read_table(...).to_pylist()), one JSON object a line, restricted to the columns the test asks the C reader for
(all of a file's columns, except in extra_types.parquet, whose unsupported columns are there to be skipped). The
C test compares the reader's rows with these. Most files are written by pyarrow with the options that make real
files differ (codecs, page versions, dictionary / plain / fallback, delta encodings, small row groups and pages);
the few layouts pyarrow does not write (the legacy two-level lists) and the deliberately broken files come from the
small writer below, built from the format specification (parquet.thrift, Thrift's compact protocol).

Without pandas installed, pandas.parquet (a DataFrame.to_parquet file with its index column) is left as it is, and
without polars polars.parquet (DataFrame.write_parquet, polars' own writer)."""
import json
import os
import struct
import sys

import pyarrow as pa
import pyarrow.parquet as pq

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parquet")


def expect(name, columns=None):
    """NAME.jsonl: pyarrow's reading of NAME.parquet, only `columns` (None: all)."""
    t = pq.read_table(os.path.join(OUT, name + ".parquet"), columns=columns)
    with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8") as f:
        for row in t.to_pylist():
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n")


def write(name, table, columns=None, **kw):
    pq.write_table(table, os.path.join(OUT, name + ".parquet"), **kw)
    expect(name, columns)


# ---- the rows -----------------------------------------------------------------------------------------------------

WORDS = ["In the beginning", "God created", "the heaven and the earth", "", "caf\u00e9 \u03b1\u03b2\u03b3",
         "\u65e5\u672c\u8a9e\u306e\u6587", "emoji \U0001F600 e\u0301", "line\nbreak \"quoted\" \\ tab\t"]


def mixed_rows(n):
    rows = []
    for i in range(n):
        text = None if i % 7 == 3 else ("" if i % 5 == 2 else WORDS[i % len(WORDS)] + " " + str(i % 11))
        msgs = None if i % 9 == 4 else [
            {"role": "user", "content": WORDS[(i + k) % len(WORDS)], "name": None if k % 2 == 0 else "bob"}
            for k in range(i % 4)]
        rows.append({
            "text": text,
            "id": (i * 7919 - 200) * (1 << 30) if i % 13 else -(1 << 52),
            "i32": None if i % 6 == 1 else i * 1000003 % 2147483647 - 1000000000,
            "score": i / 8.0 - 3.25,
            "f32": float(i) * 0.5,
            "flag": None if i % 10 == 9 else i % 3 == 0,
            "messages": msgs,
            "tags": None if i % 8 == 5 else [None if (i + k) % 4 == 0 else "t%d" % (i + k) for k in range(i % 3)],
            "meta": None if i % 11 == 6 else {"a": i, "b": None if i % 2 else "b%d" % i},
            "nested": [[i + j + k for k in range(j)] for j in range(i % 3)],
        })
    return rows


MIXED_SCHEMA = pa.schema([
    ("text", pa.string()), ("id", pa.int64()), ("i32", pa.int32()), ("score", pa.float64()), ("f32", pa.float32()),
    ("flag", pa.bool_()),
    ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string())]))),
    ("tags", pa.list_(pa.string())), ("meta", pa.struct([("a", pa.int32()), ("b", pa.string())])),
    ("nested", pa.list_(pa.list_(pa.int32()))),
])


def mixed():
    t = pa.Table.from_pylist(mixed_rows(60), schema=MIXED_SCHEMA)
    small = dict(row_group_size=25, data_page_size=128, write_batch_size=4)
    for codec in ["none", "snappy", "gzip", "zstd"]:
        for v in ["1.0", "2.0"]:
            write("mixed_%s_v%s" % (codec, v[0]), t, compression=codec, data_page_version=v, **small)
    write("mixed_plain", t, use_dictionary=False, compression="snappy", **small)
    write("mixed_one_page", t, compression="none")  # one row group, one page a column
    # a dictionary that outgrows its limit: the rest of the chunk is written PLAIN
    long = pa.Table.from_pylist([{"text": "%d %s" % (i, WORDS[i % len(WORDS)] * 3)} for i in range(80)])
    for v in ["1.0", "2.0"]:
        write("dict_fallback_v%s" % v[0], long, dictionary_pagesize_limit=256, data_page_size=256,
              write_batch_size=8, data_page_version=v, compression="snappy")
    delta = {"text": "DELTA_BYTE_ARRAY", "id": "DELTA_BINARY_PACKED", "i32": "DELTA_BINARY_PACKED",
             "tags.list.element": "DELTA_LENGTH_BYTE_ARRAY"}
    # delta with many values a page too (several blocks and miniblocks, the last one partly filled)
    big = pa.Table.from_pylist([{"text": "%05d %s" % (i // 3, WORDS[i % 4]), "id": (i * i * 37) - 5000 * i,
                                 "i32": None if i % 17 == 0 else (i * 7) ^ (i << 9), "tags": ["x" * (i % 9)]}
                                for i in range(700)],
                               schema=pa.schema([("text", pa.string()), ("id", pa.int64()), ("i32", pa.int32()),
                                                 ("tags", pa.list_(pa.string()))]))
    for v in ["1.0", "2.0"]:
        write("delta_v%s" % v[0], t.select(["text", "id", "i32", "tags"]), use_dictionary=False, column_encoding=delta,
              data_page_version=v, **small)
        write("delta_big_v%s" % v[0], big, use_dictionary=False, column_encoding=delta, data_page_version=v,
              compression="zstd")
    # an empty first value: nothing before it to share a prefix with, no bytes of its own
    empty = pa.table({"text": ["", "a", "", "ab", "abc", ""], "other": ["", "", "x", "", "yz", ""]})
    write("delta_empty", empty, use_dictionary=False, compression="none",
          column_encoding={"text": "DELTA_BYTE_ARRAY", "other": "DELTA_LENGTH_BYTE_ARRAY"})
    bools = pa.Table.from_pylist([{"flag": None if i % 7 == 0 else i % 3 != 1} for i in range(300)])
    write("bool_rle", bools, use_dictionary=False, column_encoding={"flag": "RLE"}, data_page_version="2.0")


def text_sets():
    pc = [{"prompt": "Question %d: who made %s?" % (i, WORDS[i % 3]), "completion": " " + WORDS[(i + 1) % 8],
           "id": i} for i in range(12)]
    pc[3]["completion"] = ""
    write("prompt_completion", pa.Table.from_pylist(pc), compression="snappy", row_group_size=5)
    conv = [{"prompt": [{"role": "user", "content": "Who made the earth? %d" % i}],
             "completion": [{"role": "assistant", "content": "God. %d" % i}]} for i in range(6)]
    write("prompt_completion_conv", pa.Table.from_pylist(conv), compression="zstd")
    chats = [{"messages": [{"role": "system", "content": "You are kind."},
                           {"role": "user", "content": "Hi there %d \u03b1" % i},
                           {"role": "assistant", "content": "Hello! %s" % WORDS[i % 8]}]
              + ([{"role": "user", "content": "More?", "tool_call_id": "c%d" % i}] if i % 2 else []),
              "source": "gen%d" % i} for i in range(10)]
    write("chat", pa.Table.from_pylist(chats), compression="gzip", row_group_size=4, data_page_version="2.0")
    docs = pa.Table.from_pylist([{"text": WORDS[i % 8] * (1 + i % 3) + " %d." % i, "n": i} for i in range(40)])
    write("docs", docs, compression="snappy", row_group_size=16)


def extra_types():
    import datetime
    import decimal
    n = 20
    t = pa.table({
        "text": pa.array(["row %d %s" % (i, WORDS[i % 8]) for i in range(n)]),
        "when": pa.array([datetime.datetime(2024, 1, 1 + i) for i in range(n)], pa.timestamp("ns")),
        "attrs": pa.array([[("k%d" % i, i)] for i in range(n)], pa.map_(pa.string(), pa.int32())),
        "fixed": pa.array([b"%04d" % i for i in range(n)], pa.binary(4)),
        "price": pa.array([decimal.Decimal("%d.25" % i) for i in range(n)], pa.decimal128(9, 2)),
        "split": pa.array([i * 0.25 for i in range(n)], pa.float32()),
        "blob": pa.array([bytes([255, i + 1]) for i in range(n)], pa.binary()),
    })
    write("extra_types", t, columns=["text"], use_deprecated_int96_timestamps=True, use_dictionary=False,
          column_encoding={"split": "BYTE_STREAM_SPLIT"}, compression="snappy")


def pandas_file():
    try:
        import pandas as pd
    except ImportError:
        print("gen_parquet_fixtures: no pandas here: pandas.parquet kept as it is")
        return
    df = pd.DataFrame({"text": ["alpha %d" % i for i in range(9)], "label": list(range(9))},
                      index=[10 * i + 3 for i in range(9)])
    df.to_parquet(os.path.join(OUT, "pandas.parquet"))
    expect("pandas")


def polars_file():
    """polars' own writer (not pyarrow's): its page layout, its string and list columns, a struct list with nulls."""
    try:
        import polars as pl
    except ImportError:
        print("gen_parquet_fixtures: no polars here: polars.parquet kept as it is")
        return
    df = pl.DataFrame({
        "text": ["polars %d %s" % (i, WORDS[i % len(WORDS)]) if i % 6 != 5 else None for i in range(300)],
        "n": list(range(300)),
        "messages": [[{"role": "user", "content": "q%d" % i}, {"role": "assistant", "content": None}]
                     if i % 4 else [] for i in range(300)],
    })
    df.write_parquet(os.path.join(OUT, "polars.parquet"), compression="zstd", row_group_size=128,
                     data_page_size=512)
    expect("polars")


# ---- a small writer for what pyarrow does not write --------------------------------------------------------------

def uvarint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def zigzag(v):
    return uvarint((v << 1) ^ (v >> 63))


class T:
    """A Thrift compact struct: fields (id, type, value) in id order; types i32 i64 bin bool struct list:ELEM."""
    TYPES = {"bool": 1, "i32": 5, "i64": 6, "bin": 8, "list": 9, "struct": 12}

    def __init__(self, *fields):
        self.fields = [f for f in fields if f[2] is not None]

    def enc(self):
        out, last = bytearray(), 0
        for fid, typ, val in self.fields:
            base = typ.split(":")[0]
            code = self.TYPES[base]
            if base == "bool":
                code = 1 if val else 2
            delta = fid - last
            out += bytes([(delta << 4) | code]) if 0 < delta <= 15 else bytes([code]) + zigzag(fid)
            last = fid
            if base != "bool":
                out += self.value(typ, val)
        out.append(0)
        return bytes(out)

    @classmethod
    def value(cls, typ, val):
        if typ in ("i32", "i64"):
            return zigzag(val)
        if typ == "bin":
            val = val.encode() if isinstance(val, str) else val
            return uvarint(len(val)) + val
        if typ == "struct":
            return val.enc()
        elem = typ.split(":")[1]
        head = bytes([(len(val) << 4) | cls.TYPES[elem]]) if len(val) < 15 else \
            bytes([0xF0 | cls.TYPES[elem]]) + uvarint(len(val))
        return head + b"".join(cls.value(elem, v) for v in val)


def schema_el(name, typ=None, rep=None, children=None, converted=None, logical_string=False):
    return T((1, "i32", typ), (3, "i32", rep), (4, "bin", name), (5, "i32", children), (6, "i32", converted),
             (10, "struct", T((1, "struct", T())) if logical_string else None))


def rle_levels(levels, bw, prefix=True):
    """RLE runs only (each level value its own run of repeats)."""
    out = bytearray()
    i = 0
    while i < len(levels):
        j = i
        while j < len(levels) and levels[j] == levels[i]:
            j += 1
        out += uvarint((j - i) << 1) + levels[i].to_bytes((bw + 7) // 8, "little")
        i = j
    return (struct.pack("<I", len(out)) + bytes(out)) if prefix else bytes(out)


def plain_strings(vals):
    return b"".join(struct.pack("<I", len(v)) + v for v in (x.encode() for x in vals))


def snappy_literal(data):
    """Raw snappy with literals only (a valid stream)."""
    out = bytearray(uvarint(len(data)))
    for i in range(0, len(data), 60):
        chunk = data[i:i + 60]
        out.append((len(chunk) - 1) << 2)
        out += chunk
    return bytes(out)


def page_v1(body, num_values, encoding=0, uncompressed=None, ptype=0, dict_values=None):
    hdr = T((1, "i32", ptype), (2, "i32", len(body) if uncompressed is None else uncompressed),
            (3, "i32", len(body)),
            (5, "struct", T((1, "i32", num_values), (2, "i32", encoding), (3, "i32", 3), (4, "i32", 3))
             if ptype == 0 else None),
            (7, "struct", T((1, "i32", dict_values), (2, "i32", 0)) if ptype == 2 else None))
    return hdr.enc() + body


def tiny_file(name, schema, columns, num_rows, codec=0):
    """schema: SchemaElements (root first); columns: [(type, path, pages bytes, values)] in leaf order (values: the
    chunk's level entries, default num_rows); one row group."""
    data = bytearray(b"PAR1")
    chunks = []
    for col in columns:
        typ, path, pages = col[:3]
        nvals = col[3] if len(col) > 3 else num_rows
        off = len(data)
        data += pages
        md = T((1, "i32", typ), (2, "list:i32", [0, 3]), (3, "list:bin", path), (4, "i32", codec),
               (5, "i64", nvals), (6, "i64", len(pages)), (7, "i64", len(pages)), (9, "i64", off))
        chunks.append(T((2, "i64", off), (3, "struct", md)))
    rg = T((1, "list:struct", chunks), (2, "i64", len(data) - 4), (3, "i64", num_rows))
    meta = T((1, "i32", 1), (2, "list:struct", schema), (3, "i64", num_rows), (4, "list:struct", [rg]),
             (6, "bin", "gen_parquet_fixtures.py")).enc()
    data += meta + struct.pack("<I", len(meta)) + b"PAR1"
    with open(os.path.join(OUT, name + ".parquet"), "wb") as f:
        f.write(data)


def legacy_lists():
    """Two-level lists (Spark's and old parquet-mr's): a LIST group whose repeated child is the element itself, a
    primitive (`repeated binary element`) or a group of fields (`repeated group array { role; content }`); and a
    bare repeated field outside any LIST group. pyarrow reads all three as lists."""
    rows = [["a", "bc"], [], ["\u00e9"]]
    sizes = [len(r) for r in rows]
    rep, dfn, vals = [], [], []
    for r in rows:  # optional group words (LIST) { repeated binary element (UTF8) }: def 0 null, 1 empty, 2 value
        if not r:
            rep.append(0), dfn.append(1)
        for k, v in enumerate(r):
            rep.append(0 if k == 0 else 1), dfn.append(2), vals.append(v)
    body = rle_levels(rep, 1) + rle_levels(dfn, 2) + plain_strings(vals)
    words, nwords = page_v1(body, len(rep)), len(rep)
    # required group turns (LIST) { repeated group array { required binary role; optional binary content } }
    turns = [[("user", "hi"), ("assistant", None)], [("user", "x")], []]
    cols, counts = [], []
    for leaf in range(2):
        rep, dfn, vals = [], [], []
        for r in turns:
            if not r:
                rep.append(0), dfn.append(0)
            for k, m in enumerate(r):
                v = m[leaf]
                rep.append(0 if k == 0 else 1)
                dfn.append(1 if leaf == 0 else (2 if v is not None else 1))
                if v is not None:
                    vals.append(v)
        cols.append(page_v1(rle_levels(rep, 1) + rle_levels(dfn, 2) + plain_strings(vals), len(rep)))
        counts.append(len(rep))
    # repeated int32 nums (no LIST group): def 0 empty, 1 value
    nums = [[1, 2, 3], [], [7]]
    rep, dfn, vals = [], [], []
    for r in nums:
        if not r:
            rep.append(0), dfn.append(0)
        for k, v in enumerate(r):
            rep.append(0 if k == 0 else 1), dfn.append(1), vals.append(v)
    numpage = page_v1(rle_levels(rep, 1) + rle_levels(dfn, 1) + b"".join(struct.pack("<i", v) for v in vals),
                      len(rep))
    schema = [schema_el("schema", children=3),
              schema_el("words", rep=1, children=1, converted=3),
              schema_el("element", typ=6, rep=2, converted=0),
              schema_el("turns", rep=0, children=1, converted=3),
              schema_el("array", rep=2, children=2),
              schema_el("role", typ=6, rep=0, converted=0),
              schema_el("content", typ=6, rep=1, logical_string=True),
              schema_el("nums", typ=1, rep=2)]
    tiny_file("legacy_lists", schema, [(6, ["words", "element"], words, nwords),
                                       (6, ["turns", "array", "role"], cols[0], counts[0]),
                                       (6, ["turns", "array", "content"], cols[1], counts[1]),
                                       (1, ["nums"], numpage, len(rep))], 3)
    expect("legacy_lists")


def broken():
    """Files that must be refused, each for one reason (the test checks the code and the message)."""
    text = [schema_el("schema", children=1), schema_el("text", typ=6, rep=1, converted=0)]
    vals = ["one", "two", "three"]
    good = rle_levels([1, 1, 1], 1) + plain_strings(vals)
    # a dictionary index past the dictionary's end (2 entries, index 5)
    dict_page = page_v1(plain_strings(["a", "b"]), 0, ptype=2, dict_values=2)
    idx = rle_levels([1, 1, 1], 1) + bytes([3]) + rle_levels([0, 1, 5], 3, prefix=False)
    tiny_file("bad_dict_index", text, [(6, ["text"], dict_page + page_v1(idx, 3, encoding=8))], 3)
    # a definition level above the column's maximum (1): 2
    tiny_file("bad_levels", text, [(6, ["text"], page_v1(rle_levels([1, 2, 1], 2) + plain_strings(vals), 3))], 3)
    # snappy whose preamble says 40 bytes and the page header says so too, but it holds fewer
    short = snappy_literal(good)
    lie = uvarint(len(good) + 20) + short[len(uvarint(len(good))):]
    tiny_file("bad_snappy_size", text, [(6, ["text"], page_v1(lie, 3, uncompressed=len(good) + 20))], 3, codec=1)
    # snappy with a copy reaching before the start of the output
    bad = uvarint(len(good)) + bytes([(3 << 2) | 2]) + struct.pack("<H", 60) + b"x" * 8
    tiny_file("bad_snappy", text, [(6, ["text"], page_v1(bad, 3, uncompressed=len(good)))], 3, codec=1)
    # a valid snappy page whose header's uncompressed size lies (one byte more than the stream holds)
    tiny_file("bad_page_size", text, [(6, ["text"], page_v1(snappy_literal(good), 3, uncompressed=len(good) + 1))],
              3, codec=1)
    # LZ4_RAW: refused by name
    tiny_file("bad_codec", text, [(6, ["text"], page_v1(good, 3))], 3, codec=7)
    # the good file these are variations of
    tiny_file("tiny", text, [(6, ["text"], page_v1(good, 3))], 3)
    expect("tiny")
    # an INDEX_PAGE before the data pages (skipped), and two data pages with the rows split between them
    index = T((1, "i32", 1), (2, "i32", 5), (3, "i32", 5), (6, "struct", T())).enc() + b"xxxxx"
    two = page_v1(rle_levels([1, 1], 1) + plain_strings(vals[:2]), 2) + page_v1(rle_levels([1], 1) +
                                                                           plain_strings(vals[2:]), 1)
    tiny_file("index_page", text, [(6, ["text"], index + two)], 3)
    expect("index_page")


def main():
    os.makedirs(OUT, exist_ok=True)
    mixed()
    text_sets()
    extra_types()
    pandas_file()
    polars_file()
    legacy_lists()
    broken()
    print("gen_parquet_fixtures: wrote %s (pyarrow %s)" % (OUT, pa.__version__))


if __name__ == "__main__":
    sys.exit(main())
