/* The Parquet reader's pieces (parquet.h), shared by its three files:
 * parquet_meta.c (Thrift compact protocol, the footer, page headers, the
 * schema tree), parquet_page.c (codecs, levels, encodings: a column's
 * values one at a time) and parquet.c (the file, the selection, records
 * assembled into JSON). Internal to the data layer. */
#ifndef DT_DATA_PARQUET_IMPL_H
#define DT_DATA_PARQUET_IMPL_H

#include "parquet.h"

#include <stdint.h>

/* Limits on what a file may declare (beyond "fits in the file"). */
#define PQ_MAX_DEPTH 64                  /* Thrift nesting, and schema depth */
#define PQ_MAX_PAGE ((int64_t)1 << 30)   /* bytes of one decompressed page */
#define PQ_MAX_SCHEMA 100000             /* schema elements */

/* parquet.thrift's enums (the values the reader names). */
enum { PQ_BOOLEAN, PQ_INT32, PQ_INT64, PQ_INT96, PQ_FLOAT, PQ_DOUBLE, PQ_BYTE_ARRAY, PQ_FIXED };
enum { PQ_REQUIRED, PQ_OPTIONAL, PQ_REPEATED };
enum { PQ_PLAIN = 0, PQ_PLAIN_DICT = 2, PQ_RLE = 3, PQ_BIT_PACKED = 4, PQ_DELTA_BP = 5, PQ_DELTA_LBA = 6,
       PQ_DELTA_BA = 7, PQ_RLE_DICT = 8, PQ_BSS = 9 };
enum { PQ_DATA_PAGE, PQ_INDEX_PAGE, PQ_DICT_PAGE, PQ_DATA_PAGE_V2 };
enum { PQ_UNCOMPRESSED, PQ_SNAPPY, PQ_GZIP, PQ_LZO, PQ_BROTLI, PQ_LZ4, PQ_ZSTD, PQ_LZ4_RAW };

/* One SchemaElement. */
typedef struct pq_el {
    char *name;
    int32_t type;        /* PQ_BOOLEAN.. (-1: a group) */
    int32_t type_length; /* FIXED_LEN_BYTE_ARRAY's width */
    int32_t rep;         /* PQ_REQUIRED.. (-1: absent, the root) */
    int32_t nchild;      /* children (-1: absent: a leaf) */
    int32_t converted;   /* ConvertedType (-1: absent) */
    int32_t logical;     /* the LogicalType union's field id (-1: absent) */
    int32_t int_bits;    /* LogicalType INTEGER's bitWidth (0: none) */
    bool int_unsigned;   /* and isSigned false */
    int32_t first_child; /* index of the first child element (children follow in order, each with its subtree) */
    int32_t parent;      /* -1 for the root */
    int32_t leaf;        /* leaf (column chunk) index, -1 for a group */
} pq_el;

/* One ColumnChunk's metadata. */
typedef struct pq_chunk {
    int32_t type, codec;
    int64_t num_values, total_compressed, data_off, dict_off; /* dict_off -1: absent */
} pq_chunk;

typedef struct pq_group {
    int64_t num_rows;
    pq_chunk *cols; /* one per leaf */
} pq_group;

/* The footer. */
typedef struct pq_meta {
    pq_el *el;
    int32_t nel;
    int32_t nleaf;
    int32_t *leaf_el; /* leaf index -> its element */
    int64_t num_rows;
    pq_group *groups;
    int32_t ngroups;
} pq_meta;

/* Parse the FileMetaData in buf[0, n) into m (free with dt__pq_meta_free)
 * and check the schema tree and the chunks against file_size (the bytes
 * before the footer: data_end). Errors DT_ERR_FORMAT / DT_ERR_UNSUPPORTED
 * prefixed with "parquet NAME: footer". */
dt_status dt__pq_meta_parse(const uint8_t *buf, size_t n, uint64_t data_end, const char *name, pq_meta *m);
void dt__pq_meta_free(pq_meta *m);

/* One PageHeader. */
typedef struct pq_page_hdr {
    int32_t type, usize, csize;
    int32_t num_values, encoding, def_enc, rep_enc; /* data pages (v1 and v2) and dictionary pages */
    int32_t def_len, rep_len;                       /* v2 */
    bool compressed;                                /* v2's is_compressed (default true) */
} pq_page_hdr;

/* Parse a PageHeader at buf[0, n): its size in *used. false with *why on a
 * malformed header. */
bool dt__pq_page_hdr(const uint8_t *buf, size_t n, pq_page_hdr *h, size_t *used, const char **why);

/* A decoded value of a leaf (the string points into a page or a scratch buffer until the next value). */
typedef struct pq_val {
    bool b;
    int64_t i;
    double d;
    const uint8_t *s;
    size_t n;
} pq_val;

/* One selected leaf's column in the current row group: its chunk's pages decoded one at a time and its
 * (repetition, definition, value) triples taken in order. parquet_page.c. */
typedef struct pq_col pq_col;

/* A cursor for leaf `leaf` (type, max levels), messages naming "parquet NAME: row group G, column PATH". */
pq_col *dt__pq_col_new(int32_t type, int max_rep, int max_def, const char *name, const char *path);
void dt__pq_col_free(pq_col *c);
/* Start row group g on chunk bytes chunk[0, n) (borrowed until the next start or free), its metadata cm. */
void dt__pq_col_start(pq_col *c, int64_t g, const pq_chunk *cm, const uint8_t *chunk, size_t n);
/* The next triple's levels without taking it: *end true when the chunk has no more values. */
dt_status dt__pq_col_peek(pq_col *c, int *rep, int *def, bool *end);
/* Take the next triple (after a peek that was not the end): its value in *v when def is the maximum. */
dt_status dt__pq_col_take(pq_col *c, pq_val *v);
/* Values taken from this chunk so far. */
int64_t dt__pq_col_taken(const pq_col *c);

#endif
