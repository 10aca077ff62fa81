/* dtrain/data.h — datasets, samplers and the prefetching loader.
 *
 * Overview
 * --------
 * Four pieces, each replaceable on its own:
 *
 *   dt_dataset   a vtable: length, get one item, get a batch of items into
 *                caller buffers. Built in: IDX image files (MNIST, Fashion-
 *                MNIST), llm.c token files (windows of T + 1 tokens), NumPy
 *                .npy arrays and CSV files, a subset view, a held-out
 *                split, and synthetic random data.
 *   dt_bpe       a byte-level BPE tokenizer: trained on a corpus, saved to and
 *                read from a vocab file, encode and decode (exact for any
 *                bytes); its ids go to token files (dt_tokens_write).
 *   dt_sampler   the order of dataset indices for one epoch: sequential,
 *                random (a seeded, epoch-dependent permutation), or
 *                distributed (PyTorch's DistributedSampler). Also a vtable,
 *                so an application can bring its own.
 *   dt_batch_sampler  cuts a sampler's epoch into batches (drop_last).
 *   dt_loader    a background thread that fills the next batches into a
 *                bounded ring while the caller trains on the current one.
 *                Batches come out in the sampler's order whatever the
 *                timing, so a run is reproducible.
 *
 * Lifecycles: every object is created by an _init/_open function that
 * returns a dt_status and the object through an out-parameter, and freed by
 * the matching _free (NULL is a no-op). A loader borrows its dataset and
 * sampler: free the loader first. A batch returned by dt_loader_next() is
 * borrowed and valid until the next dt_loader_next(), dt_loader_start_epoch()
 * or dt_loader_free() on that loader.
 *
 * Errors: parsers never crash on bad input; they return DT_ERR_IO (cannot
 * read), DT_ERR_FORMAT (malformed: wrong magic, truncated, corrupt gzip,
 * absurd dimensions) or DT_ERR_MISMATCH (images and labels disagree), with a
 * message that names the file and the problem. An error raised on the
 * loader's thread comes back, with its message, from dt_loader_next().
 *
 * Randomness: the random and distributed samplers draw their permutation
 * from Philox (base.h) with key (seed + epoch, DT_RNG_SHUFFLE, 0, 0) through
 * dt_rng_permutation: the order depends only on (seed + epoch, N), and the
 * distributed sampler at world size 1 gives the random sampler's order. Same
 * contract as PyTorch (seed + epoch), not the same numbers as torch.randperm.
 * With DT_SHUFFLE_TORCH they draw torch.randperm(N) from a generator seeded
 * with seed + epoch (dt_torch_randperm): the same numbers as PyTorch's
 * DistributedSampler(seed=seed) after set_epoch(epoch).
 *
 * Usage
 * -----
 *     dt_dataset *train;
 *     if (dt_dataset_mnist_open("/usr/share/datasets/fashion-mnist",
 *                               DT_SPLIT_TRAIN, &train) < 0) { ... dt_last_error() ... }
 *     dt_sampler *s;
 *     dt_sampler_random_init(dt_dataset_length(train), seed, &s);
 *     dt_loader_params lp = dt_loader_params_default();
 *     lp.batch_size = 100;
 *     dt_loader *ld;
 *     dt_loader_init(train, s, &lp, &ld);
 *     for (int64_t epoch = 0; epoch < epochs; epoch++) {
 *         dt_loader_start_epoch(ld, epoch);
 *         const dt_batch *b;
 *         while (dt_loader_next(ld, &b) == DT_OK && b) {
 *             // b->x: (b->size, 1, 28, 28) f32 in [0,1]; b->y: (b->size) i64
 *         }
 *     }
 *     dt_loader_free(ld); dt_sampler_free(s); dt_dataset_free(train);
 */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include "dtrain/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IDX files --------------------------------------------------------- */
/* The IDX format (LeCun's MNIST files): magic 0x00 0x00 TYPE NDIM, then NDIM
 * big-endian u32 dimensions, then the data, big-endian, row-major. gzip-
 * compressed files are recognised by their content (1f 8b), not their name. */

/* IDX element types (the third magic byte). */
typedef enum {
    DT_IDX_U8 = 0x08,
    DT_IDX_I8 = 0x09,
    DT_IDX_I16 = 0x0B,
    DT_IDX_I32 = 0x0C,
    DT_IDX_F32 = 0x0D,
    DT_IDX_F64 = 0x0E
} dt_idx_type;

#define DT_IDX_MAX_DIMS 4              /* more dimensions are rejected */
#define DT_IDX_MAX_BYTES (1ull << 32)  /* larger payloads are rejected (4 GiB) */

/* A parsed IDX file. Transparent; data is owned by the struct. */
typedef struct dt_idx {
    dt_idx_type type;                  /* element type */
    int ndim;                          /* 1..DT_IDX_MAX_DIMS */
    int64_t dims[DT_IDX_MAX_DIMS];     /* dims[0] is the item count */
    size_t elem_size;                  /* bytes per element */
    size_t nbytes;                     /* payload bytes = prod(dims) * elem_size */
    void *data;                        /* payload in host byte order (64-byte aligned) */
} dt_idx;

/* Parse an IDX file held in memory, plain or gzip. name is used only in
 * error messages (may be NULL: "<memory>"). The payload is copied; buf may be
 * freed afterwards. Errors: DT_ERR_FORMAT (naming the problem), DT_ERR_NO_MEMORY. */
DT_API dt_status dt_idx_read_mem(const void *buf, size_t n, const char *name, dt_idx **out);
/* Read and parse an IDX file, plain or gzip. Errors name the path:
 * DT_ERR_IO (missing, unreadable), DT_ERR_FORMAT. */
DT_API dt_status dt_idx_read_file(const char *path, dt_idx **out);
DT_API void dt_idx_free(dt_idx *idx);
/* "u8", "i32", ... for an IDX type ("?" if unknown). */
DT_API const char *dt_idx_type_name(dt_idx_type t);

/* ---- datasets ----------------------------------------------------------- */
#define DT_DATA_MAX_DIMS 4

/* What one item looks like. x and y are each a fixed-shape array. */
typedef struct dt_dataset_info {
    dt_dtype x_dtype;                      /* input element type (DT_F32 for images) */
    int x_ndim;                            /* dims of one input, 0..DT_DATA_MAX_DIMS */
    int64_t x_shape[DT_DATA_MAX_DIMS];     /* e.g. (1, 28, 28) */
    dt_dtype y_dtype;                      /* target element type (DT_I64 for class labels) */
    int y_ndim;                            /* dims of one target (0 = a scalar label) */
    int64_t y_shape[DT_DATA_MAX_DIMS];
    int64_t num_classes;                   /* classes for classification sets, else 0 */
} dt_dataset_info;

/* A dataset implementation. Version DT_DATASET_VTABLE_VERSION. */
#define DT_DATASET_VTABLE_VERSION 1
typedef struct dt_dataset_vtable {
    int version;                       /* DT_DATASET_VTABLE_VERSION */
    const char *name;                  /* "idx", "random", ... (for messages) */
    /* Required: number of items. */
    int64_t (*length)(void *self);
    /* Required: write item i's input to x and target to y (each sized by the
     * info's shapes and dtypes). i is in range (the wrapper checks). */
    dt_status (*get_item)(void *self, int64_t i, void *x, void *y);
    /* Optional: write n items idx[0..n) contiguously into x and y. Default:
     * get_item in a loop. Must be safe to call from the loader's thread
     * while no other call runs on this dataset. */
    dt_status (*get_batch)(void *self, const int64_t *idx, int64_t n, void *x, void *y);
    /* Optional: release self. Default: nothing. */
    void (*free)(void *self);
} dt_dataset_vtable;

typedef struct dt_dataset dt_dataset;

/* Wrap an implementation. vt is borrowed (usually static); self is owned by
 * the dataset and released with vt->free. On error vt->free(self) is not
 * called. */
DT_API dt_status dt_dataset_init(const dt_dataset_vtable *vt, void *self,
                                 const dt_dataset_info *info, dt_dataset **out);
DT_API void dt_dataset_free(dt_dataset *ds);
/* Number of items (0 for NULL). */
DT_API int64_t dt_dataset_length(const dt_dataset *ds);
/* The item description; borrowed, valid while ds lives. */
DT_API const dt_dataset_info *dt_dataset_get_info(const dt_dataset *ds);
/* What the dataset reads, for messages: the image file of an IDX set, else
 * the implementation's name ("random"). A subset has its base's. Borrowed. */
DT_API const char *dt_dataset_source(const dt_dataset *ds);
/* Set it (copied; implementations call this after dt_dataset_init). */
DT_API void dt_dataset_set_source(dt_dataset *ds, const char *source);
/* Check that one item's input is exactly (dtype, shape[0..ndim)) as a
 * consumer (a model: models.h dt_model_desc_check_dataset) takes it, before
 * batches of it are viewed as that shape: DT_ERR_SHAPE naming the source,
 * both shapes and `consumer` ("model 'convnet'") otherwise. Check every
 * split: a test set with other image dimensions than the training set would
 * otherwise be read out of bounds. */
DT_API dt_status dt_dataset_check_input(const dt_dataset *ds, dt_dtype dtype, int ndim, const int64_t *shape,
                                        const char *consumer);
/* Elements / bytes of one input and one target. */
DT_API int64_t dt_dataset_x_numel(const dt_dataset *ds);
DT_API int64_t dt_dataset_y_numel(const dt_dataset *ds);
DT_API size_t dt_dataset_x_bytes(const dt_dataset *ds);
DT_API size_t dt_dataset_y_bytes(const dt_dataset *ds);
/* One item into x and y. DT_ERR_RANGE if i is out of [0, length). */
DT_API dt_status dt_dataset_get_item(dt_dataset *ds, int64_t i, void *x, void *y);
/* n items into x (n * x_bytes) and y (n * y_bytes). Indices are checked. */
DT_API dt_status dt_dataset_get_batch(dt_dataset *ds, const int64_t *idx, int64_t n, void *x, void *y);

/* Image classification from an IDX image file (N, H, W) u8 and an IDX label
 * file (N) u8. Items: x = (1, H, W) f32 scaled to [0, 1] by /255 exactly as
 * torchvision's ToTensor; y = scalar i64. num_classes = max label + 1.
 * Errors name the file: missing, malformed, count mismatch (DT_ERR_MISMATCH). */
DT_API dt_status dt_dataset_idx_open(const char *images_path, const char *labels_path, dt_dataset **out);
/* Same from two parsed IDX files; takes ownership of both (also on error).
 * The names are used in messages (may be NULL). */
DT_API dt_status dt_dataset_idx_from(dt_idx *images, dt_idx *labels, const char *images_name,
                                     const char *labels_name, dt_dataset **out);

typedef enum { DT_SPLIT_TRAIN = 0, DT_SPLIT_TEST = 1 } dt_split;
/* A directory in the MNIST layout: {train,t10k}-{images-idx3,labels-idx1}-ubyte
 * with or without .gz (also the "train-images.idx3-ubyte" spelling).
 * Errors: DT_ERR_IO naming the directory or the missing file. */
DT_API dt_status dt_dataset_mnist_open(const char *dir, dt_split split, dt_dataset **out);
/* Where `--data fashion-mnist` looks: $DT_FASHION_MNIST_DIR if set, else
 * Debian's /usr/share/datasets/fashion-mnist. */
DT_API const char *dt_data_fashion_mnist_dir(void);

/* Resolve a data spec as the CLI takes it: "fashion-mnist", "mnist:DIR",
 * "idx:DIR" (both read the MNIST layout in DIR),
 * "npy:X.npy[,Y.npy][,test=F][,shape=AxBxC]" (dt_dataset_npy_open) and
 * "csv:FILE[,label=COL][,test=F][,shape=AxBxC]" (dt_dataset_csv_open): for
 * these two, the test split is a held-out fraction F (default 0.1,
 * 0 <= F < 1; dt_dataset_holdout_init, seed 0) and the training split the
 * rest; shape= views each input as that shape (dt_dataset_reshape_init). DT_ERR_INVALID_ARG for an unknown spec
 * or option, else as the opener. */
DT_API dt_status dt_dataset_open_spec(const char *spec, dt_split split, dt_dataset **out);

/* A view of items [start, start + n) of base. Borrows base (free the
 * subset first). */
DT_API dt_status dt_dataset_subset_init(dt_dataset *base, int64_t start, int64_t n, dt_dataset **out);

/* Parameters of the synthetic classification set. */
typedef struct dt_random_dataset_params {
    int64_t length;        /* items (default 6000) */
    int x_ndim;            /* dims of one input, 1..DT_DATA_MAX_DIMS (default 1) */
    int64_t x_shape[DT_DATA_MAX_DIMS]; /* x ~ N(0,1) f32 of this shape (default (784)) */
    int64_t num_classes;   /* y = argmax of a fixed random linear map of the
                              flattened x, so the set is learnable (default 10) */
    uint64_t seed;         /* data and labels depend only on seed (default 0) */
} dt_random_dataset_params;
DT_API dt_random_dataset_params dt_random_dataset_params_default(void);
/* Items are computed on demand from Philox: item i is the same for any
 * access order and thread count. */
DT_API dt_status dt_dataset_random_init(const dt_random_dataset_params *p, dt_dataset **out);

/* ---- users' own arrays: NumPy .npy and CSV ------------------------------- */
/* Two readers for data a user already has, each giving a dataset whose items
 * are rows: x = row i of the features converted to f32 (shape: the array's
 * dims after the first), y = row i of the targets: integer (or bool)
 * targets are class labels (i64, every one >= 0; num_classes = max + 1),
 * floating-point targets stay values (f32, num_classes = 0). */

#define DT_NPY_MAX_DIMS 5    /* rows + at most DT_DATA_MAX_DIMS item dims */

/* A parsed .npy header (format versions 1.0, 2.0 and 3.0). */
typedef struct dt_npy_header {
    int major, minor;                  /* format version */
    char kind;                         /* 'f' float, 'i' signed, 'u' unsigned, 'b' bool */
    int itemsize;                      /* bytes: f 2/4/8, i and u 1/2/4/8, b 1 */
    bool big_endian;                   /* '>' in descr (converted on reading) */
    int ndim;                          /* 0..DT_NPY_MAX_DIMS */
    int64_t shape[DT_NPY_MAX_DIMS];
    size_t data_offset;                /* where the data start */
    size_t data_bytes;                 /* prod(shape) * itemsize */
} dt_npy_header;
/* Parse and check the header of a .npy file held in memory (buf holds the
 * whole file, n bytes): the magic, a version 1-3, the dict ({'descr':
 * '<f4', 'fortran_order': False, 'shape': (N, ...)}, every key once), a
 * numeric descr, C order, and a file size of exactly data_offset +
 * data_bytes. DT_ERR_FORMAT naming name and the problem ("fortran_order is
 * True: save with np.ascontiguousarray", "dtype '|O' is not numeric").
 * name NULL: "<memory>". */
DT_API dt_status dt_npy_parse_header(const void *buf, size_t n, const char *name, dt_npy_header *out);

/* The rows of x_path (N, ...) with targets y_path (N, ...) or (N); y_path
 * may be NULL (then every y is label 0). Both files are memory-mapped.
 * Errors name the file: DT_ERR_IO, DT_ERR_FORMAT (as dt_npy_parse_header;
 * x with no dims or more than DT_NPY_MAX_DIMS; a negative label),
 * DT_ERR_MISMATCH (x and y have different row counts). */
DT_API dt_status dt_dataset_npy_open(const char *x_path, const char *y_path, dt_dataset **out);

/* A CSV file of numbers: cells separated by ',', one row a line ("\r\n"
 * too), blank lines skipped, spaces around a cell ignored, a cell may be
 * quoted ("1.5"). The first line is a header when any of its cells is not
 * a number. One column is the label (an integer >= 0), the others are the
 * features (x: (F) f32). */
typedef struct dt_csv_params {
    const char *label;     /* the label column: a header name, or a 0-based
                              index; NULL = the last column (default NULL) */
} dt_csv_params;
DT_API dt_csv_params dt_csv_params_default(void);
/* Parse a CSV text held in memory (name for messages). Errors:
 * DT_ERR_FORMAT naming name:line (and the column) of the first problem: a
 * row with another number of cells than the first, a cell that is not a
 * number (nan and inf are refused), a label that is not an integer >= 0,
 * no data rows, one column only; DT_ERR_INVALID_ARG for a label column that
 * does not exist. */
DT_API dt_status dt_dataset_csv_from_mem(const void *buf, size_t n, const char *name, const dt_csv_params *p,
                                         dt_dataset **out);
/* Read path (at most 1 GiB) and parse it as above; DT_ERR_IO naming path. */
DT_API dt_status dt_dataset_csv_open(const char *path, const dt_csv_params *p, dt_dataset **out);

/* base with each item's input viewed as shape (ndim dims, the same number
 * of elements: 784 CSV columns as (1, 28, 28) for the ConvNet). Takes
 * ownership of base (also on error). DT_ERR_SHAPE if the counts differ. */
DT_API dt_status dt_dataset_reshape_init(dt_dataset *base, int ndim, const int64_t *shape, dt_dataset **out);

/* A held-out split of a dataset: a fixed pseudo-random choice of
 * round(test_fraction * N) items (Philox, key (seed, DT_RNG_DATA, 7)) is the
 * test split, the other items in their order the training split. Takes
 * ownership of base (freed with the split, also on error). */
DT_API dt_status dt_dataset_holdout_init(dt_dataset *base, double test_fraction, uint64_t seed, dt_split split,
                                         dt_dataset **out);

/* ---- token files (llm.c's format) ----------------------------------------- */
/* A token file as llm.c writes and reads it (dev/data/data_common.py): a
 * header of 256 little-endian int32 (h[0] = magic, h[1] = version, h[2] =
 * the token count, the rest 0), then the tokens, little-endian. Two kinds:
 *   magic 20240520, version 1: uint16 tokens (llm.c's GPT-2 file; ids up
 *     to 65,535);
 *   magic 20240801, version 7: uint32 tokens (llm.c's Llama-3 file, for
 *     vocabularies above 65,536 ids such as Llama-3's 128,256).
 * The file must be exactly 1024 + width * count bytes (width 2 or 4) and
 * hold at least one token. Readers take either kind; memory-mapped, nothing
 * is copied until a batch is read. */
#define DT_TOKENS_MAGIC 20240520
#define DT_TOKENS_VERSION 1
#define DT_TOKENS32_MAGIC 20240801
#define DT_TOKENS32_VERSION 7
#define DT_TOKENS_HEADER_BYTES 1024

/* Check a token file held in memory: header, size and (vocab_size > 0)
 * that every token is < vocab_size. name is used in messages (NULL:
 * "<memory>"). *count (may be NULL) gets the token count. Errors:
 * DT_ERR_FORMAT naming the problem: "bad magic 123 (want 20240520)", "bad
 * version", "truncated: header says N tokens, the file holds M", "M bytes
 * after the N tokens", "token 70000 at position 12 >= vocab size 50257". */
DT_API dt_status dt_tokens_check_mem(const void *buf, size_t n, const char *name, int64_t vocab_size,
                                     int64_t *count);

/* An open (memory-mapped) token file. */
typedef struct dt_tokens dt_tokens;
/* Map and check path as dt_tokens_check_mem (vocab_size 0: any id).
 * Errors name the file: DT_ERR_IO (missing, unreadable), DT_ERR_FORMAT. */
DT_API dt_status dt_tokens_open(const char *path, int64_t vocab_size, dt_tokens **out);
/* Unmap. NULL is a no-op. */
DT_API void dt_tokens_close(dt_tokens *t);
/* Tokens in the file (0 for NULL). */
DT_API int64_t dt_tokens_count(const dt_tokens *t);
/* The tokens of a uint16 file; borrowed, valid until dt_tokens_close. NULL
 * for a uint32 file (dt_tokens_data_u32) or NULL t. */
DT_API const uint16_t *dt_tokens_data(const dt_tokens *t);
/* The tokens of a uint32 file (NULL for a uint16 file or NULL t). */
DT_API const uint32_t *dt_tokens_data_u32(const dt_tokens *t);
/* Bytes per token: 2 or 4 (0 for NULL). */
DT_API int dt_tokens_width(const dt_tokens *t);
/* Token i of either kind (0 when i is out of range or t is NULL). */
DT_API uint32_t dt_tokens_at(const dt_tokens *t, int64_t i);
/* The largest token + 1 (a lower bound on the vocabulary the file needs). */
DT_API int64_t dt_tokens_max_plus_one(const dt_tokens *t);
/* Write n >= 1 tokens to path in llm.c's format, atomically and without
 * following symlinks (dt_file). Errors: DT_ERR_INVALID_ARG (n < 1 or more
 * than 2^31 - 1 tokens, the header's limit), DT_ERR_IO naming path. */
DT_API dt_status dt_tokens_write(const char *path, const uint16_t *tokens, int64_t n);
/* The same as a uint32 file (magic 20240801, version 7): for ids above
 * 65,535. */
DT_API dt_status dt_tokens_write_u32(const char *path, const uint32_t *tokens, int64_t n);

/* The unigram baseline of a language model: the cross-entropy, in nats
 * per token, of eval's tokens under the token frequencies of train, add-one
 * smoothed over vocab_size ids (0: the largest token of either + 1). A
 * model's validation loss well below it means it uses context. eval may be
 * train itself (then: the unigram entropy, smoothed). DT_ERR_INVALID_ARG
 * for NULL files or a vocab_size below a token. */
DT_API dt_status dt_tokens_unigram_xent(const dt_tokens *train, const dt_tokens *eval, int64_t vocab_size,
                                        double *nats);

/* Windows of a token file as a dataset for language modelling. */
typedef struct dt_tokens_params {
    int64_t seq_len;       /* T: tokens per input row (required, >= 1) */
    int64_t stride;        /* tokens between the starts of items i and i+1;
                              0 = seq_len: disjoint windows, llm.c's layout
                              (default 0). 1 makes every offset an item, so a
                              random sampler draws nanoGPT's random windows */
    int64_t vocab_size;    /* every token must be < this (checked at open);
                              0 = no check (default 0) */
    bool completion_only_loss; /* prompt/completion data (dt_dataset_text_open's
                              jsonl:/parquet:...,prompt=KEY,completion=KEY): the targets
                              that are prompt tokens become DT_K_IGNORE_INDEX
                              (-100), so the loss counts only the completions
                              and their end-of-document tokens (TRL's
                              completion_only_loss, Axolotl's train_on_inputs:
                              false). Token files have no prompts: refused
                              there (DT_ERR_INVALID_ARG). Default false */
    bool assistant_only_loss; /* conversations (dt_dataset_text_open's jsonl/parquet
                              lines of messages): only the targets that the
                              chat template's {% generation %} blocks wrote
                              (the assistant's turns) are counted, the others
                              DT_K_IGNORE_INDEX (TRL's assistant_only_loss,
                              transformers' assistant mask). Refused for text
                              lines, token files, a template without such
                              blocks and a conversation with no assistant
                              token (DT_ERR_INVALID_ARG). Default false */
    bool per_record;       /* dt_dataset_text_open: no packing (TRL's
                              packing=False): item i is record i (a jsonl line,
                              a parquet row, a text: file; with its
                              end-of-document token where it has one), its
                              first seq_len tokens (TRL's max_length) as x,
                              the rest of x padded; y the next tokens, the
                              last position's target and the padding's
                              DT_K_IGNORE_INDEX. Under causal attention
                              the padding after a record changes none of its
                              outputs, so the loss is TRL's on right-padded
                              batches. stride must be 0; token files have no
                              records (refused). Default false: the records
                              packed into windows */
} dt_tokens_params;
DT_API dt_tokens_params dt_tokens_params_default(void);
/* Item i is the window of T + 1 tokens starting at i * stride: x = its
 * first T tokens, y = its last T (the next-token targets), both (T) i64.
 * Length: (count - T - 1) / stride + 1 windows (0 if count < T + 1).
 * num_classes = vocab_size. With the sequential sampler and stride = T, a
 * batch of B items is llm.c's (B, T) batch: B * T + 1 consecutive tokens.
 * Random windows: a random sampler (or the distributed one) over the items.
 * Errors as dt_tokens_open, naming the file. */
DT_API dt_status dt_dataset_tokens_open(const char *path, const dt_tokens_params *p, dt_dataset **out);

/* ---- byte-level BPE tokenizer -------------------------------------------- */
/* A byte-level BPE tokenizer (GPT-2's scheme):
 * ids 0..255 are the bytes themselves (minbpe's convention, not GPT-2's
 * permuted byte order), merge k makes id 256 + k from two earlier ids. It
 * works on bytes, so any input (not only UTF-8) encodes, and decoding the
 * ids gives back exactly the input bytes.
 *
 * Text is first cut into chunks as GPT-2's regex does, with byte classes
 * in place of Unicode ones: letters are A-Z, a-z and every byte >= 0x80
 * (so a UTF-8 word stays one chunk), digits 0-9, spaces ' ' \t \n \v \f \r,
 * the rest "other". A chunk is one of, tried in this order: 's 't 're 've
 * 'm 'll 'd; an optional space then a run of letters, of digits or of
 * others; a run of spaces not followed by a non-space (so "a   b" cuts as
 * "a", "  ", " b"); a run of spaces. Merges never cross chunks.
 *
 * Training (dt_bpe_train) counts each distinct chunk once with its
 * frequency and repeatedly merges the most frequent adjacent pair
 * (overlaps count: "aaa" holds (a, a) twice); ties go to the smallest
 * (left id, right id), as Hugging Face's BpeTrainer does, so training is
 * deterministic. It stops at vocab_size or when no pair is left. Pair
 * counts live in a max-heap updated incrementally: a merge touches only
 * the chunks that contain its pair.
 *
 * Encoding a chunk applies merges by rank: the lowest-ranked adjacent pair
 * first, leftmost first among equals ("aaa" -> [aa, a]).
 *
 * The vocab file is text: a line "dtrain-bpe 1", a line "merges N", then N
 * lines "LEFT RIGHT", merge k on line k + 3, optionally followed by
 * "  # " and the token's bytes (escaped, for people; ignored on reading).
 * Reading checks every line (ids < 256 + k, no pair twice, nothing else in
 * the file) and names the file and line of the first problem.
 *
 *     dt_bpe *bpe;
 *     dt_bpe_train_params tp = dt_bpe_train_params_default();
 *     tp.vocab_size = 4096;
 *     dt_bpe_train(text, text_len, &tp, &bpe);
 *     dt_bpe_save(bpe, "vocab.bpe");
 *     uint16_t *ids; int64_t n;
 *     dt_bpe_encode(bpe, text, text_len, &ids, &n);   // free(ids) after
 *     dt_tokens_write("tokens.bin", ids, n);
 *     dt_bpe_free(bpe);
 */
typedef struct dt_bpe dt_bpe;
#define DT_BPE_MAX_VOCAB 65536     /* ids fit the token files' uint16 */

typedef struct dt_bpe_train_params {
    int64_t vocab_size;    /* ids wanted, 256..DT_BPE_MAX_VOCAB (default 4096) */
    int64_t min_count;     /* stop when the best pair occurs fewer times
                              (default 2: a merge seen once is not learned) */
} dt_bpe_train_params;
DT_API dt_bpe_train_params dt_bpe_train_params_default(void);
/* Learn merges from text[0..n) (any bytes). The result may have fewer ids
 * than asked when the text runs out of pairs (see dt_bpe_vocab_size).
 * Errors: DT_ERR_INVALID_ARG, DT_ERR_NO_MEMORY. */
DT_API dt_status dt_bpe_train(const void *text, size_t n, const dt_bpe_train_params *p, dt_bpe **out);
DT_API void dt_bpe_free(dt_bpe *bpe);
/* 256 + the number of merges. */
DT_API int64_t dt_bpe_vocab_size(const dt_bpe *bpe);
/* Merge k's two ids (k < vocab size - 256). DT_ERR_RANGE otherwise. */
DT_API dt_status dt_bpe_merge(const dt_bpe *bpe, int64_t k, uint32_t *left, uint32_t *right);
/* The bytes of token id: *bytes borrowed, valid while bpe lives.
 * DT_ERR_RANGE for an id outside the vocabulary. */
DT_API dt_status dt_bpe_token_bytes(const dt_bpe *bpe, int64_t id, const unsigned char **bytes, size_t *len);
/* Write the vocab file atomically (dt_file: no symlink followed, complete
 * or absent). DT_ERR_IO naming path. */
DT_API dt_status dt_bpe_save(const dt_bpe *bpe, const char *path);
/* Parse a vocab file held in memory (name used in messages, NULL:
 * "<memory>"). DT_ERR_FORMAT naming name:line and the problem. */
DT_API dt_status dt_bpe_load_mem(const void *buf, size_t n, const char *name, dt_bpe **out);
/* Read and parse a vocab file: DT_ERR_IO (missing, unreadable, over 16
 * MiB), DT_ERR_FORMAT; both name the path. */
DT_API dt_status dt_bpe_load(const char *path, dt_bpe **out);
/* Encode text[0..n) (any bytes): *ids (malloc'd, the caller frees it with
 * free(); NULL when *n_ids is 0) and their number. */
DT_API dt_status dt_bpe_encode(const dt_bpe *bpe, const void *text, size_t n, uint16_t **ids, int64_t *n_ids);
/* Decode ids[0..n) to their bytes: *text malloc'd (NUL-terminated for
 * convenience; *len excludes the NUL), the caller frees it. DT_ERR_RANGE
 * naming the position of an id outside the vocabulary. */
DT_API dt_status dt_bpe_decode(const dt_bpe *bpe, const uint16_t *ids, int64_t n, char **text, size_t *len);
/* dt_bpe_decode of ids held as int64 (a model's output, whose vocabulary
 * may be larger than bpe's): an id outside [0, dt_bpe_vocab_size(bpe)),
 * negative or 65536 and above included, is DT_ERR_RANGE naming its value
 * and position; no id is narrowed to 16 bits (65536 + 97 is an error, never
 * the token 97). */
DT_API dt_status dt_bpe_decode_ids(const dt_bpe *bpe, const int64_t *ids, int64_t n, char **text, size_t *len);

/* ---- samplers ------------------------------------------------------------ */
/* A sampler yields the dataset indices of one epoch, for this process. */
#define DT_SAMPLER_VTABLE_VERSION 1
typedef struct dt_sampler_vtable {
    int version;                       /* DT_SAMPLER_VTABLE_VERSION */
    const char *name;                  /* "sequential", "random", "distributed", ... */
    /* Required: number of indices per epoch. Must not depend on the epoch. */
    int64_t (*length)(void *self);
    /* Required: write the epoch's indices (length of them) to out. */
    dt_status (*indices)(void *self, int64_t epoch, int64_t *out);
    /* Optional: release self. */
    void (*free)(void *self);
} dt_sampler_vtable;

typedef struct dt_sampler dt_sampler;

/* Wrap an implementation (vt borrowed; self owned, released by vt->free). */
DT_API dt_status dt_sampler_init(const dt_sampler_vtable *vt, void *self, dt_sampler **out);
DT_API void dt_sampler_free(dt_sampler *s);
/* 0, 1, ..., n-1 every epoch. */
DT_API dt_status dt_sampler_sequential_init(int64_t n, dt_sampler **out);
/* Where the shuffling permutation comes from. */
typedef enum {
    DT_SHUFFLE_PHILOX = 0, /* dt_rng_permutation, key (seed + epoch, DT_RNG_SHUFFLE) */
    DT_SHUFFLE_TORCH = 1,  /* torch.randperm with manual_seed(seed + epoch) */
} dt_shuffle_rng;
/* A permutation of 0..n-1 drawn from Philox keyed by seed + epoch. */
DT_API dt_status dt_sampler_random_init(int64_t n, uint64_t seed, dt_sampler **out);
/* The same with the permutation drawn by rng. */
DT_API dt_status dt_sampler_random_init_rng(int64_t n, uint64_t seed, dt_shuffle_rng rng, dt_sampler **out);

/* PyTorch's DistributedSampler (torch.utils.data.DistributedSampler). */
typedef struct dt_distributed_sampler_params {
    int64_t length;        /* dataset length N (required, >= 0) */
    int world_size;        /* replicas W (default 1) */
    int rank;              /* this replica, 0..W-1 (default 0) */
    bool shuffle;          /* permute by (seed + epoch) (default true) */
    uint64_t seed;         /* (default 0) */
    bool drop_last;        /* drop the tail so every rank gets floor(N/W);
                              else pad by wrapping to ceil(N/W) (default false) */
    dt_shuffle_rng rng;    /* permutation source (default DT_SHUFFLE_PHILOX) */
} dt_distributed_sampler_params;
DT_API dt_distributed_sampler_params dt_distributed_sampler_params_default(void);
/* Every rank gets the same number of indices, num_samples = ceil(N/W) (or
 * floor(N/W) with drop_last); the padded list is the permutation followed by
 * its own head, repeated as needed; rank r takes positions r, r+W, r+2W...
 * The permutation for epoch e is keyed by seed + e, so (seed 1, epoch 0) and
 * (seed 0, epoch 1) agree, as in PyTorch. */
DT_API dt_status dt_sampler_distributed_init(const dt_distributed_sampler_params *p, dt_sampler **out);

/* Indices per epoch. */
DT_API int64_t dt_sampler_length(const dt_sampler *s);
/* The epoch used by dt_sampler_indices_current (default 0). */
DT_API void dt_sampler_set_epoch(dt_sampler *s, int64_t epoch);
DT_API int64_t dt_sampler_get_epoch(const dt_sampler *s);
/* The indices for an explicit epoch / for the epoch last set. out holds
 * dt_sampler_length(s) entries. */
DT_API dt_status dt_sampler_indices(dt_sampler *s, int64_t epoch, int64_t *out);
DT_API dt_status dt_sampler_indices_current(dt_sampler *s, int64_t *out);

/* ---- batch sampler --------------------------------------------------------- */
typedef struct dt_batch_sampler dt_batch_sampler;
/* Cuts the sampler's epoch into batches of batch_size; the last one is
 * shorter unless drop_last, which drops it. Borrows s. */
DT_API dt_status dt_batch_sampler_init(dt_sampler *s, int64_t batch_size, bool drop_last,
                                       dt_batch_sampler **out);
DT_API void dt_batch_sampler_free(dt_batch_sampler *bs);
/* Batches per epoch. */
DT_API int64_t dt_batch_sampler_length(const dt_batch_sampler *bs);
/* Compute the indices of an epoch (calls the sampler). */
DT_API dt_status dt_batch_sampler_set_epoch(dt_batch_sampler *bs, int64_t epoch);
/* Batch b of the epoch last set: *idx borrowed (valid until the next
 * set_epoch), *n its size. DT_ERR_RANGE past the end. */
DT_API dt_status dt_batch_sampler_get(const dt_batch_sampler *bs, int64_t b, const int64_t **idx,
                                      int64_t *n);

/* ---- loader ------------------------------------------------------------------ */
typedef struct dt_loader_params {
    int64_t batch_size;    /* samples per batch (default 64) */
    bool drop_last;        /* drop a short last batch (default false) */
    int prefetch;          /* batches prepared ahead, 1..64 (default 2) */
    bool background;       /* prepare batches on a thread (default true);
                              false loads each batch inside dt_loader_next */
} dt_loader_params;
DT_API dt_loader_params dt_loader_params_default(void);

/* One batch. Borrowed from the loader (see the overview). */
typedef struct dt_batch {
    int64_t epoch;         /* epoch this batch belongs to */
    int64_t index;         /* batch number within the epoch, from 0 */
    int64_t size;          /* samples in the batch (<= batch_size) */
    void *x;               /* (size, *info.x_shape), info.x_dtype, 64-byte aligned */
    void *y;               /* (size, *info.y_shape), info.y_dtype */
    const int64_t *indices;/* the dataset indices, size of them */
} dt_batch;

typedef struct dt_loader dt_loader;
/* Borrows ds and s. No thread runs until dt_loader_start_epoch. */
DT_API dt_status dt_loader_init(dt_dataset *ds, dt_sampler *s, const dt_loader_params *p,
                                dt_loader **out);
/* Stops the thread (mid-epoch too) and releases everything. */
DT_API void dt_loader_free(dt_loader *ld);
/* Batches per epoch. */
DT_API int64_t dt_loader_num_batches(const dt_loader *ld);
/* Begin an epoch: sets the sampler's epoch and starts preparing batches.
 * An epoch still running is abandoned first. */
DT_API dt_status dt_loader_start_epoch(dt_loader *ld, int64_t epoch);
/* The same, starting at batch first_batch (0..batches per epoch) of the
 * epoch: the batches that follow are exactly those an epoch started at 0
 * yields after its first first_batch (resuming mid-epoch from a
 * checkpoint); batches before it are never loaded. DT_ERR_RANGE outside. */
DT_API dt_status dt_loader_start_epoch_at(dt_loader *ld, int64_t epoch, int64_t first_batch);
/* The next batch of the epoch in order, waiting for it if needed. At the
 * end of the epoch returns DT_OK with *out = NULL (again on every further
 * call). A failure while loading (bad item, out of memory) returns its
 * status and message here, after every batch before the failing one, and
 * ends the epoch: further calls return DT_ERR_STATE until the next
 * dt_loader_start_epoch. */
DT_API dt_status dt_loader_next(dt_loader *ld, const dt_batch **out);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_DATA_H */
