/* Apache Parquet files as rows of JSON objects (internal: the text data's
 * parquet: spec, text_dataset.c, and fuzz/fuzz_parquet.c).
 *
 * A file is opened (its footer read and checked), told which top-level
 * columns the rows need (dt__pq_select), and then yields its rows one at a
 * time as cJSON objects, one key per selected column present in the file,
 * in the file's column order: the same objects a JSON-lines line of the
 * same data parses to, so the jsonl: code takes them as they are.
 *
 *     dt__pq_file *f;
 *     if (dt__pq_open(path, &f) < 0) ...;
 *     const char *want[] = {"text", "messages"};
 *     dt_status st = dt__pq_select(f, want, 2);
 *     cJSON *row;
 *     while (st == DT_OK && (st = dt__pq_next(f, &row)) == DT_OK && row) {
 *         ... dt__pq_where(f) names the row: "parquet FILE: row group G, row R" ...
 *         cJSON_Delete(row);
 *     }
 *     dt__pq_close(f);
 *
 * What is read (what pyarrow >= 10, Hugging Face datasets, pandas and
 * polars write):
 *   - the footer: "PAR1" at both ends, a little-endian footer length, the
 *     FileMetaData in Thrift's compact protocol (unknown fields of every
 *     type skipped, nesting at most 64 deep);
 *   - types: BYTE_ARRAY as a string (annotated STRING/UTF8/ENUM/JSON, or
 *     not annotated at all), valid UTF-8 without NUL or refused naming the
 *     row; INT32 and INT64 (signed or unsigned, INT(n) annotated) as
 *     numbers, refused when a value is past 2^53 (a JSON number is a
 *     double here); BOOLEAN as true/false; FLOAT and DOUBLE as numbers;
 *   - nesting: required, optional (null) and repeated fields; LIST groups
 *     in the standard three-level layout and the legacy two-level ones (a
 *     repeated primitive, a repeated group of several fields, or one named
 *     "array" or "NAME_tuple"), a bare repeated field, STRUCT groups (a
 *     null field is JSON null, as datasets gives None): so
 *     list<struct<role: string, content: string>> is a JSON array of
 *     objects; records are assembled from the repetition and definition
 *     levels (Dremel);
 *   - pages: DATA_PAGE (v1), DATA_PAGE_V2 (levels uncompressed,
 *     is_compressed), DICTIONARY_PAGE, INDEX_PAGE (skipped); any number of
 *     row groups and pages, a dictionary chunk falling back to plain;
 *   - encodings: PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY, the RLE /
 *     bit-packed hybrid (levels, dictionary indices, RLE booleans),
 *     DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY;
 *   - codecs: UNCOMPRESSED, SNAPPY (raw snappy, decoded here), GZIP (zlib),
 *     ZSTD (libzstd, when the build has it: DT_HAVE_ZSTD).
 * Refused by name (DT_ERR_UNSUPPORTED), only when a selected column needs
 * them, so that a column the rows do not read never fails the file:
 * FIXED_LEN_BYTE_ARRAY, INT96, DECIMAL/DATE/TIME/TIMESTAMP/INTERVAL/UUID/
 * FLOAT16 and other non-text logical types, MAP groups, the BIT_PACKED
 * level encoding, BYTE_STREAM_SPLIT, and the LZ4, LZ4_RAW, BROTLI and LZO
 * codecs (and ZSTD in a build without libzstd). Encrypted files and column
 * data kept in other files are refused at open.
 *
 * Every length, count and offset read from the file is checked against the
 * file's size and the limits below before it is used; a decompressor must
 * produce exactly the size the page header says. A corrupt or hostile file
 * gives DT_ERR_FORMAT with a message naming the file and where in it (the
 * footer; a row group, column and page; a row), never a crash, an
 * overflow or a huge allocation. */
#ifndef DT_DATA_PARQUET_H
#define DT_DATA_PARQUET_H

#include "dtrain/base.h"

#include <cjson/cJSON.h>
#include <stddef.h>

typedef struct dt__pq_file dt__pq_file;

/* Open a Parquet file (a regular file, opened as the text data's files
 * are: a FIFO or a directory is refused) and read its footer. Errors name
 * the path: DT_ERR_IO (cannot open or read), DT_ERR_FORMAT (not Parquet,
 * or a corrupt footer: the message says what), DT_ERR_UNSUPPORTED
 * (encrypted). Close with dt__pq_close. */
dt_status dt__pq_open(const char *path, dt__pq_file **out);
/* The same from size bytes at data (borrowed: it must outlive the file);
 * name is used in messages. */
dt_status dt__pq_open_mem(const void *data, size_t size, const char *name, dt__pq_file **out);
/* Close (NULL: no-op). */
void dt__pq_close(dt__pq_file *f);

/* Rows in the file (the footer's count) and row groups. */
int64_t dt__pq_num_rows(const dt__pq_file *f);
int64_t dt__pq_num_row_groups(const dt__pq_file *f);
/* Whether the file has a top-level column named name. */
bool dt__pq_has_column(const dt__pq_file *f, const char *name);

/* The rows hold only the top-level columns named in names[0, n) (names the
 * file lacks are left out of the rows, as a key missing from a JSON line);
 * before the first dt__pq_next. Without it the rows hold every column.
 * DT_ERR_UNSUPPORTED naming the column when a selected column has a type
 * or layout that is not read (above); DT_ERR_FORMAT for a malformed LIST
 * group or two columns of one name. */
dt_status dt__pq_select(dt__pq_file *f, const char *const *names, size_t n);

/* The next row as a new cJSON object (the caller deletes it), or *out NULL
 * after the last row. Errors (DT_ERR_FORMAT, DT_ERR_UNSUPPORTED,
 * DT_ERR_IO, DT_ERR_NO_MEMORY) name the row group, the column and the page
 * or the row; the file is then done (every later call fails). */
dt_status dt__pq_next(dt__pq_file *f, cJSON **out);
/* Where the last row returned is: "parquet FILE: row group G, row R" (G
 * from 0, R the row's index in the file from 0, as pyarrow and pandas
 * count). Valid until the next call on f. */
const char *dt__pq_where(const dt__pq_file *f);

#endif
