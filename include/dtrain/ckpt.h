/* dtrain/ckpt.h — safetensors files, full and sharded checkpoints.
 *
 * Overview
 * --------
 * safetensors (Hugging Face's format, the one PyTorch users exchange weights
 * in) is an 8-byte little-endian header size N, N bytes of JSON, then the
 * tensors' bytes back to back:
 *
 *     {"__metadata__":{"format":"pt"},
 *      "fc.weight":{"dtype":"F32","shape":[10,1568],"data_offsets":[0,62720]}, ...}
 *
 * Offsets are relative to the start of the data (file offset 8 + N), end
 * exclusive; data is little-endian, row-major, contiguous.
 *
 * Writing (dt_st_writer) streams: the header with every offset is written
 * first, then each tensor's bytes as the caller produces them (in any tensor
 * order, each tensor's bytes in order, in as many pieces as convenient), so a
 * writer never holds more than the piece it is given. Tensors are laid out as
 * the `safetensors` package lays them out (dtype size descending, then name),
 * the header is compact JSON padded with spaces to a multiple of 8 bytes:
 * for the same tensors the file is byte-identical to safetensors.torch's
 * save_file. The file goes through dt_file (base.h): created without following
 * symlinks, fsynced and renamed, so it is complete or absent. The writer
 * computes the CRC-32C (Castagnoli; dt_crc32c) of the whole file as it goes;
 * checkpoints keep it in their index and verify it on load. Checkpoints
 * written before CRC-32C recorded zlib's CRC-32 ("crc32" in the index); both
 * are verified (dt_ckpt_sum).
 *
 * Reading (dt_st_file) validates the whole header before anything is
 * returned: header size against the file size, UTF-8 and JSON, known dtypes,
 * shapes whose byte size matches the offsets, offsets that tile the data
 * exactly (no gap, no overlap, nothing after the last tensor), no duplicate
 * names, string-valued __metadata__. Every error names the file and, where
 * there is one, the tensor. Data is read with pread into caller memory (any
 * byte range of a tensor), so a checkpoint loader reads only the part of a
 * tensor it needs.
 *
 * Usage
 * -----
 *     dt_st_desc d[2] = {{.name = "fc.weight", .dtype = DT_ST_F32, .ndim = 2, .shape = {10, 1568}},
 *                        {.name = "fc.bias", .dtype = DT_ST_F32, .ndim = 1, .shape = {10}}};
 *     dt_st_writer *w;
 *     if (dt_st_writer_open("model.safetensors", d, 2, NULL, 0, &w) < 0) { report dt_last_error(); }
 *     st = dt_st_writer_write(w, 0, weight, 10 * 1568 * 4);        // tensor 0, all bytes
 *     if (st == DT_OK) st = dt_st_writer_write(w, 1, bias, 40);
 *     if (st == DT_OK) st = dt_st_writer_commit(w, NULL);           // the file appears now
 *     dt_st_writer_close(w);
 *
 *     dt_st_file *f;
 *     if (dt_st_open("model.safetensors", &f) < 0) { report dt_last_error(); }
 *     const dt_st_tensor *t = dt_st_find(f, "fc.bias");          // NULL if absent
 *     float b[10];
 *     if (t && t->dtype == DT_ST_F32) st = dt_st_read(f, t, 0, t->nbytes, b);
 *     dt_st_close(f);
 */
#ifndef DTRAIN_CKPT_H
#define DTRAIN_CKPT_H

#include "dtrain/base.h"
#include "dtrain/tensor.h"
#include "dtrain/comm.h"
#include "dtrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- safetensors dtypes ------------------------------------------------------ */
/* The byte-sized dtypes of the format, in the format's own order (the order
 * its writer sorts by, largest last). The sub-byte ones (F4, F6_E2M3,
 * F6_E3M2) are refused on read with DT_ERR_UNSUPPORTED. */
typedef enum dt_st_dtype {
    DT_ST_BOOL = 0,      /* 1 byte, 0 or 1 */
    DT_ST_U8,
    DT_ST_I8,
    DT_ST_F8_E5M2,
    DT_ST_F8_E4M3,
    DT_ST_F8_E8M0,
    DT_ST_F8_E4M3FNUZ,
    DT_ST_F8_E5M2FNUZ,
    DT_ST_I16,
    DT_ST_U16,
    DT_ST_F16,
    DT_ST_BF16,
    DT_ST_I32,
    DT_ST_U32,
    DT_ST_F32,
    DT_ST_C64,           /* complex64: two f32 */
    DT_ST_F64,
    DT_ST_I64,
    DT_ST_U64,
    DT_ST_DTYPE_COUNT
} dt_st_dtype;

/* "F32", "BF16", ... ("?" for an invalid value). */
DT_API const char *dt_st_dtype_name(dt_st_dtype t);
/* Bytes per element (0 for an invalid value). */
DT_API size_t dt_st_dtype_size(dt_st_dtype t);
/* The format's name ("F32") -> dtype; DT_ERR_UNSUPPORTED for a known
 * sub-byte dtype, DT_ERR_FORMAT for an unknown name. */
DT_API dt_status dt_st_dtype_parse(const char *s, dt_st_dtype *out);
/* dtrain's dtype <-> the format's (every dt_dtype has one; the reverse
 * returns DT_ERR_UNSUPPORTED for BOOL, I8, I16, the unsigned and fp8 types). */
DT_API dt_st_dtype dt_st_dtype_from(dt_dtype t);
DT_API dt_status dt_st_dtype_to(dt_st_dtype t, dt_dtype *out);

/* Largest header accepted (the format's own limit): 100,000,000 bytes. */
#define DT_ST_MAX_HEADER 100000000u

/* ---- writing ------------------------------------------------------------------ */

/* One tensor to write. */
typedef struct dt_st_desc {
    const char *name;               /* state-dict key ("layer1.0.weight"); copied; unique, non-empty */
    dt_st_dtype dtype;
    int ndim;                       /* 0 (a scalar) .. DT_MAX_DIMS */
    int64_t shape[DT_MAX_DIMS];     /* each >= 0 (0: an empty tensor) */
} dt_st_desc;

/* One __metadata__ entry (both strings copied). */
typedef struct dt_st_kv {
    const char *key;
    const char *value;
} dt_st_kv;

typedef struct dt_st_writer dt_st_writer;

/* Start writing path: lays out tensors desc[0..n) and writes the header
 * (with meta[0..nmeta) as __metadata__, omitted when nmeta is 0) to a
 * temporary beside path (dt_file). *out owned by the caller; release with
 * dt_st_writer_close. Errors: DT_ERR_NULL, DT_ERR_INVALID_ARG (a duplicate or
 * empty name, a name "__metadata__", ndim or a dimension out of range, a
 * byte size beyond 2^53, a bad dtype), DT_ERR_IO. */
DT_API dt_status dt_st_writer_open(const char *path, const dt_st_desc *desc, size_t n, const dt_st_kv *meta,
                                   size_t nmeta, dt_st_writer **out);
/* Append nbytes of tensor i (index into the desc array given to open) after
 * the bytes already written for it. Tensors may be written in any order.
 * DT_ERR_RANGE when the tensor would get more bytes than its size. */
DT_API dt_status dt_st_writer_write(dt_st_writer *w, size_t i, const void *data, size_t nbytes);
/* Check every tensor got all its bytes (DT_ERR_STATE naming the first that
 * did not), fsync and rename the file into place. *crc32c (may be NULL)
 * receives the CRC-32C of the whole file (computed as the bytes were
 * written: no second pass). */
DT_API dt_status dt_st_writer_commit(dt_st_writer *w, uint32_t *crc32c);
/* The final file size in bytes (known from open on). */
DT_API uint64_t dt_st_writer_size(const dt_st_writer *w);
/* Free the writer; an uncommitted file's temporary is removed. NULL is a no-op. */
DT_API void dt_st_writer_close(dt_st_writer *w);

/* ---- reading ------------------------------------------------------------------ */

/* One tensor of an open file. */
typedef struct dt_st_tensor {
    const char *name;               /* borrowed; lives with the file */
    dt_st_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    uint64_t numel;                 /* product of shape (1 for a scalar) */
    uint64_t offset;                /* of its first byte in the file (8 + N + begin) */
    uint64_t nbytes;                /* numel * dt_st_dtype_size(dtype) */
} dt_st_tensor;

typedef struct dt_st_file dt_st_file;

/* Open and validate path (see the overview). *out owned by the caller;
 * release with dt_st_close. Errors: DT_ERR_IO (cannot open or read),
 * DT_ERR_FORMAT (malformed), DT_ERR_UNSUPPORTED (a sub-byte dtype, more than
 * DT_MAX_DIMS dimensions); each message names the file and the tensor. */
DT_API dt_status dt_st_open(const char *path, dt_st_file **out);
/* The same over size bytes at data (borrowed; must outlive the file);
 * `name` is used in messages. */
DT_API dt_status dt_st_open_mem(const void *data, size_t size, const char *name, dt_st_file **out);
/* NULL is a no-op. */
DT_API void dt_st_close(dt_st_file *f);

/* Tensors, in file (offset) order. */
DT_API size_t dt_st_count(const dt_st_file *f);
/* Tensor i (0 <= i < count) in file order; NULL out of range. Borrowed. */
DT_API const dt_st_tensor *dt_st_tensor_at(const dt_st_file *f, size_t i);
/* The tensor named `name`, NULL if none. Borrowed. */
DT_API const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name);
/* Copy bytes [off, off + nbytes) of tensor t (of this file) into dst.
 * DT_ERR_RANGE beyond the tensor, DT_ERR_IO on a read error or a file that
 * shrank since it was opened. */
DT_API dt_status dt_st_read(const dt_st_file *f, const dt_st_tensor *t, uint64_t off, uint64_t nbytes,
                            void *dst);
/* __metadata__: the value of key (NULL if absent), and entry i of count. */
DT_API const char *dt_st_meta(const dt_st_file *f, const char *key);
DT_API size_t dt_st_meta_count(const dt_st_file *f);
DT_API dt_status dt_st_meta_at(const dt_st_file *f, size_t i, const char **key, const char **value);
/* The path (or name) the file was opened with. Borrowed. */
DT_API const char *dt_st_path(const dt_st_file *f);
/* File size in bytes. */
DT_API uint64_t dt_st_file_size(const dt_st_file *f);
/* ---- checksums ------------------------------------------------------------------ */
/* The checksums a checkpoint index records per file: CRC-32C (written since
 * the checksum became hardware-assisted; index key "crc32c") and zlib's
 * CRC-32 (index key "crc32", checkpoints written before; still verified). */
typedef enum dt_ckpt_sum { DT_SUM_CRC32 = 0, DT_SUM_CRC32C = 1 } dt_ckpt_sum;
/* "crc32" or "crc32c" (the index key); "?" for anything else. */
DT_API const char *dt_ckpt_sum_name(dt_ckpt_sum kind);
/* Continue checksum `crc` of kind over data[0..n) (start with 0). */
DT_API uint32_t dt_ckpt_sum_update(dt_ckpt_sum kind, uint32_t crc, const void *data, size_t n);
/* CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected, init and final XOR
 * ~0: the iSCSI/ext4 one; dt_crc32c(0, "123456789", 9) == 0xE3069283),
 * continued from crc (0 to start): the SSE4.2 crc32 instruction in three
 * interleaved streams where the CPU has it (and DT_MAX_CPU_ISA does not cap
 * it to scalar), else a table version; both give the same value. */
DT_API uint32_t dt_crc32c(uint32_t crc, const void *data, size_t n);
/* The table version alone (for tests and comparisons). */
DT_API uint32_t dt_crc32c_portable(uint32_t crc, const void *data, size_t n);
/* "sse4.2" or "table": what dt_crc32c uses on this machine. */
DT_API const char *dt_crc32c_impl(void);
/* The CRC-32C of A || B from crc_a = CRC-32C(A), crc_b = CRC-32C(B) and len_b
 * = |B| bytes (O(log len_b)): pieces checksummed apart, joined in order. */
DT_API uint32_t dt_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* Read the whole file and compute its checksum of kind into *crc (for
 * DT_SUM_CRC32C the value dt_st_writer_commit reports). */
DT_API dt_status dt_st_checksum(const dt_st_file *f, dt_ckpt_sum kind, uint32_t *crc);

/* ---- checkpoints: full and sharded state dicts ---------------------------------- */
/* A checkpoint is a directory:
 *
 *     DIR/index.json                  tensors -> (file, element range) chunks, file checksums, metadata
 *     DIR/rank-00000.safetensors      the pieces rank 0 wrote (1-D tensors)
 *     DIR/rank-00001.safetensors ...
 *
 * Every rank describes what it holds as a list of entries: the tensor's
 * state-dict name, dtype and GLOBAL shape, and the range [lo, hi) of its
 * global row-major elements this rank holds at `data`. DDP holds every
 * tensor whole (lo 0, hi numel); ZeRO holds its equal range of the flat
 * buffer, which cuts tensors anywhere; a rank may hold nothing of a tensor
 * (lo == hi). Saving writes every element once: where several ranks hold
 * the same elements (replicas) the pieces are dealt to the holder with the
 * fewest bytes so far, so DDP's ranks share the writing. Loading intersects
 * the ranges a rank asks for with the saved chunks and reads only those
 * bytes, so any world size and any strategy loads any checkpoint, and so
 * does a single process (parameters and optimizer state alike: an optimizer
 * state is just another entry, named "optim.<param>.exp_avg" and so on).
 *
 * Names follow PyTorch's state_dict ("layer1.0.weight"); a full state dict
 * (dt_ckpt_save_full) is one plain safetensors file that
 * safetensors.torch.load_file and model.load_state_dict read as is, and
 * dt_ckpt_load reads a safetensors file written by PyTorch the same way as a
 * checkpoint directory.
 *
 * Atomic: ranks write into DIR.tmp-XXXXXX (each file through dt_file),
 * rank 0 writes index.json last, fsyncs and renames the directory to DIR:
 * DIR is complete or absent. The index holds each file's size and CRC-32C
 * ("crc32c"; zlib's CRC-32, "crc32", in checkpoints written before), checked
 * as the file is read for a load (dt_ckpt_load_params.verify).
 * All ranks must see the same filesystem path (one machine, or a shared
 * filesystem). The disk work runs on a helper thread while the ranks poll
 * each other with short all-reduces, so a write slower than the group's
 * timeout (DT_COMM_TIMEOUT) on any rank does not fail the save; the save
 * takes as long as the slowest rank's disk.
 *
 *     dt_ckpt_entry e[2] = {
 *         {.name = "fc.weight", .dtype = DT_F32, .ndim = 2, .shape = {10, 1568},
 *          .lo = my_lo, .hi = my_hi, .data = my_part},            // this rank's elements
 *         {.name = "optim.fc.weight.exp_avg", ...same shape and range..., .data = m1}};
 *     st = dt_ckpt_save("run/step-00000100", e, 2, NULL, pg);   // collective
 *     ...
 *     st = dt_ckpt_load("run/step-00000100", e, 2, NULL, NULL); // any ranges, any world size
 */

/* One tensor (or the part of it this rank holds). */
typedef struct dt_ckpt_entry {
    const char *name;               /* state-dict key; borrowed */
    dt_dtype dtype;
    int ndim;                       /* 0 .. DT_MAX_DIMS */
    int64_t shape[DT_MAX_DIMS];     /* the GLOBAL shape */
    uint64_t lo, hi;                /* this rank's global row-major elements [lo, hi), hi <= numel */
    void *data;                     /* hi - lo elements; read by save, written by load; borrowed */
} dt_ckpt_entry;

/* Options of a save. */
typedef struct dt_ckpt_save_params {
    const dt_st_kv *meta;           /* key/value strings kept in the index ("metadata") and in a full
                                       file's __metadata__ (e.g. the trainer's run state); borrowed;
                                       default none. Only rank 0's are used */
    size_t nmeta;                   /* default 0 */
    bool overwrite;                 /* an existing DIR is replaced once the new one is complete, in
                                       one exchange of the two (Linux renameat2 RENAME_EXCHANGE):
                                       DIR holds the old or the new checkpoint at every instant;
                                       default false: DT_ERR_STATE */
} dt_ckpt_save_params;
DT_API dt_ckpt_save_params dt_ckpt_save_params_default(void);

/* Save a sharded checkpoint into directory dir (its parent must exist).
 * Collective over pg (NULL: this process alone, rank 0 of 1): every rank
 * passes the same names, dtypes and shapes in the same order and its own
 * ranges and data. p NULL: defaults. Every rank returns the same status.
 * Errors: DT_ERR_INVALID_ARG (a bad entry, naming it), DT_ERR_MISMATCH (ranks
 * pass different tensors), DT_ERR_RANGE (elements no rank holds, naming the
 * tensor and the range), DT_ERR_STATE (dir exists), DT_ERR_IO. */
DT_API dt_status dt_ckpt_save(const char *dir, const dt_ckpt_entry *e, size_t n, const dt_ckpt_save_params *p,
                              dt_pg *pg);
/* The same from one process for `world` simulated ranks: ranks[r] holds
 * rank r's n entries. Used by `dtrain ckpt convert` and by tests. */
DT_API dt_status dt_ckpt_save_ranks(const char *dir, const dt_ckpt_entry *const *ranks, int world, size_t n,
                                    const dt_ckpt_save_params *p);
/* A save directory's lock. A directory of checkpoints belongs to one job:
 * its owner removes the temporaries of killed saves and prunes old
 * checkpoints, which would delete another job's files. The owner holds an
 * exclusive flock on DIR/.dtrain-lock (opened with O_NOFOLLOW; it holds
 * "pid P host H") until dt_ckpt_dir_lock_close or its exit, kill -9
 * included. dt_ckpt_dir_lock_open creates dir when missing (its parent
 * must exist; a symlink or a non-directory is refused) and checks that it
 * is writable. Errors: DT_ERR_STATE when another job (or another lock of
 * this process) holds it, naming the directory and the holder, with nothing
 * in the directory changed; DT_ERR_IO for a directory that cannot be used
 * (missing parent, a file, read-only), naming it. */
typedef struct dt_ckpt_dir_lock dt_ckpt_dir_lock;
DT_API dt_status dt_ckpt_dir_lock_open(const char *dir, dt_ckpt_dir_lock **out);
/* The directory a lock holds, as given to open. Borrowed; NULL for NULL. */
DT_API const char *dt_ckpt_dir_lock_dir(const dt_ckpt_dir_lock *l);
/* Release the lock (the lock file stays). NULL: no-op. */
DT_API void dt_ckpt_dir_lock_close(dt_ckpt_dir_lock *l);
/* Release the lock and undo what dt_ckpt_dir_lock_open made, for a job that
 * fails before it saved: the lock file when open created it, then the
 * directory when open created it and it is empty (anything saved in it
 * stays). A directory that existed is left as it was found. NULL: no-op. */
DT_API void dt_ckpt_dir_lock_abandon(dt_ckpt_dir_lock *l);

/* Full state dict (FSDP FULL_STATE_DICT, rank0_only): rank 0 writes ONE
 * safetensors file at path with every tensor whole, gathering one piece at
 * a time from the rank that holds it (point to point), so its extra memory
 * is one tensor. Collective over pg (NULL: alone); the same rules and errors
 * as dt_ckpt_save. */
DT_API dt_status dt_ckpt_save_full(const char *path, const dt_ckpt_entry *e, size_t n,
                                   const dt_ckpt_save_params *p, dt_pg *pg);

/* Options of a load. */
typedef struct dt_ckpt_load_params {
    bool verify;          /* check each file read from against the index: its size, and its
                             checksum (CRC-32C, or CRC-32 in older checkpoints) computed as the
                             bytes are read (dt_ckpt_read_batch: one pass over the file; on a
                             mismatch the entries' data hold unverified bytes and the load
                             fails); default true */
    bool allow_missing;   /* entries absent from the checkpoint are left as they are (their
                             count in dt_ckpt_load's *missing); default false: DT_ERR_NOT_FOUND */
} dt_ckpt_load_params;
DT_API dt_ckpt_load_params dt_ckpt_load_params_default(void);

/* An open checkpoint: a directory with index.json, one safetensors file
 * (each tensor one chunk), or a Hugging Face model directory
 * (dt_ckpt_is_hf_dir: model.safetensors, or without one (as transformers
 * chooses) the shards that model.safetensors.index.json's "weight_map"
 * names; each tensor one chunk
 * of its shard, the shards validated as they are opened; a shard the map
 * names that is missing, a tensor in two shards or not where the map says
 * are errors naming the file and the key). An image-text model's directory
 * (Gemma 3's Gemma3ForConditionalGeneration: no model.embed_tokens.weight,
 * its language model under language_model.model. or model.language_model.)
 * reads as its language model: those tensors named as a text model's
 * (model.*, lm_head.*), the vision tower's and the projector's left out. */
typedef struct dt_ckpt dt_ckpt;
/* File names of a Hugging Face model directory's weights. */
#define DT_HF_WEIGHTS_NAME "model.safetensors"
#define DT_HF_INDEX_NAME "model.safetensors.index.json"
/* Is dir a Hugging Face model directory (no dtrain index.json; a
 * model.safetensors.index.json or a model.safetensors)? */
DT_API bool dt_ckpt_is_hf_dir(const char *dir);
DT_API dt_status dt_ckpt_open(const char *src, dt_ckpt **out);
DT_API void dt_ckpt_close(dt_ckpt *ck);

/* One saved tensor. */
typedef struct dt_ckpt_tensor {
    const char *name;               /* borrowed; lives with ck */
    dt_st_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    uint64_t numel;
    size_t nchunks;                 /* saved pieces (element ranges) */
} dt_ckpt_tensor;
DT_API size_t dt_ckpt_num_tensors(const dt_ckpt *ck);
DT_API dt_status dt_ckpt_tensor_at(const dt_ckpt *ck, size_t i, dt_ckpt_tensor *out);
/* Index of tensor `name`, -1 if absent. */
DT_API int64_t dt_ckpt_find(const dt_ckpt *ck, const char *name);
/* Ranks (files) that saved it: 1 for a single file. */
DT_API int dt_ckpt_world(const dt_ckpt *ck);
/* Metadata value (NULL if absent); entries i of count. Borrowed. */
DT_API const char *dt_ckpt_meta(const dt_ckpt *ck, const char *key);
DT_API size_t dt_ckpt_meta_count(const dt_ckpt *ck);
DT_API dt_status dt_ckpt_meta_at(const dt_ckpt *ck, size_t i, const char **key, const char **value);
/* Elements [lo, hi) of tensor i (global row-major) into dst, in the saved
 * dtype, from whichever chunks hold them. verify: each file read from is
 * checked whole (size and checksum) before its first read (a file not yet
 * verified is read twice: dt_ckpt_read_batch reads it once). */
DT_API dt_status dt_ckpt_read(dt_ckpt *ck, size_t i, uint64_t lo, uint64_t hi, void *dst, bool verify);
/* One read of dt_ckpt_read_batch: elements [lo, hi) of tensor `tensor`
 * (global row-major) into dst, in the saved dtype. */
typedef struct dt_ckpt_req {
    size_t tensor;
    uint64_t lo, hi;
    void *dst;
} dt_ckpt_req;
/* The reads r[0..n), in file order whatever their order here. With verify,
 * each file they touch that is not verified yet is checked in the same pass:
 * its size first, then its bytes are checksummed as they arrive in the
 * destinations (4 MiB at a time, each right after its read), the bytes no
 * request wants are read for the checksum only, and the sum is compared
 * after the file's last byte: each file crosses the disk and the page cache
 * once (dt_ckpt_read's verify reads it twice). DT_ERR_FORMAT naming the file
 * on a mismatch; the destinations then hold unverified bytes. Files already
 * verified (by dt_ckpt_verify or an earlier read) are read plainly. */
DT_API dt_status dt_ckpt_read_batch(dt_ckpt *ck, const dt_ckpt_req *r, size_t n, bool verify);
/* Check every file: size, checksum, and that the chunks of every tensor tile
 * it exactly. DT_ERR_FORMAT / DT_ERR_IO naming the file or tensor. */
DT_API dt_status dt_ckpt_verify(dt_ckpt *ck);

/* Fill entries e[0..n) (their ranges and data) from src: for each, its
 * elements [lo, hi) of the saved tensor of that name. Not collective.
 * Errors: DT_ERR_NOT_FOUND (a tensor absent, unless allow_missing),
 * DT_ERR_SHAPE / DT_ERR_DTYPE ("tensor 'fc.weight': shape [10,1568] in
 * checkpoint, [10,1600] here"), DT_ERR_FORMAT / DT_ERR_IO (a damaged file,
 * naming it). *missing (may be NULL) receives the number skipped. */
DT_API dt_status dt_ckpt_load(const char *src, dt_ckpt_entry *e, size_t n, const dt_ckpt_load_params *p,
                              size_t *missing);

/* ---- entries of a model ------------------------------------------------------ */
/* A growing list of entries that owns their names: the entries a model's
 * flats (or a shard of them) and an optimizer's state make. */
typedef struct dt_ckpt_list dt_ckpt_list;
DT_API dt_status dt_ckpt_list_init(dt_ckpt_list **out);
DT_API void dt_ckpt_list_free(dt_ckpt_list *l);
/* Append e (its name copied). */
DT_API dt_status dt_ckpt_list_add(dt_ckpt_list *l, const dt_ckpt_entry *e);
/* Append one entry per tensor of model m in its flat of (role, dtype), named
 * prefix + tensor name + suffix ("optim." "fc.weight" ".exp_avg"), for the
 * global flat elements [lo, hi) held at data (each tensor's part of it; a
 * tensor outside the range gets lo == hi). role DT_FLAT_PARAMS gives the
 * parameters, DT_FLAT_BUFFERS the buffers; tied entries are skipped (their
 * source is saved). data is borrowed; dtype of the flat (optimizer state: the
 * f32 flat's layout with f32 data). */
DT_API dt_status dt_ckpt_list_add_flat(dt_ckpt_list *l, const dt_model *m, dt_flat_role role, dt_dtype dtype,
                                       uint64_t lo, uint64_t hi, void *data, const char *prefix,
                                       const char *suffix);
/* Parameters and buffers of a non-meta model with its whole flats (DDP,
 * one process): add_flat over every flat of every dtype. */
DT_API dt_status dt_ckpt_list_add_model(dt_ckpt_list *l, const dt_model *m);
DT_API size_t dt_ckpt_list_count(const dt_ckpt_list *l);
/* The entries (borrowed; valid until the next add or free). */
DT_API dt_ckpt_entry *dt_ckpt_list_entries(dt_ckpt_list *l);

/* ---- LoRA adapters as PEFT saves them ---------------------------------------- */
/* Write the LoRA adapters of m (built with dt_model_build_params.lora = p)
 * into directory dir (made if missing) as Hugging Face PEFT's
 * save_pretrained does: adapter_model.safetensors holding every
 * "NAME.lora_A.weight" / "NAME.lora_B.weight" under the key
 * "base_model.model.NAME.lora_A.weight" and, with DoRA, every
 * "NAME.lora_magnitude_vector.weight" under
 * "base_model.model.NAME.lora_magnitude_vector", and the parameters of the
 * modules to save (dt_lora_params.modules_to_save) under
 * "base_model.model." + their names, a tied one under each of its names
 * (metadata format = pt, the parameters' dtype), and adapter_config.json
 * (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
 * target_modules (for "all-linear"
 * the layers it chose, as PEFT saves them), use_rslora, use_dora,
 * modules_to_save, ensure_weight_tying (true when a tied weight is saved),
 * layers_to_transform, layers_pattern, bias (and the biases it trains, an
 * adapted layer's under "base_model.model.L.base_layer.bias"),
 * fan_in_fan_out true for Conv1D targets (and tensor-parallel layers
 * whose weight is [in, out]: dt_lora_hook.weight_in_out), base_model_name_or_path =
 * base_model or null, rank_pattern, alpha_pattern and exclude_modules as
 * p's dt_lora_pattern holds them (dt_lora_pattern_use; a layer_rank or
 * exclude callback of another kind is DT_ERR_UNSUPPORTED), the other
 * LoraConfig fields at PEFT's defaults; keys sorted). Both files atomic. The adapters must be in this process's
 * memory (not a ZeRO-3 shard, a tensor-parallel slice or another pipeline
 * stage's): DT_ERR_STATE.
 * DT_ERR_NOT_FOUND when m has no adapters, DT_ERR_IO naming the path. */
DT_API dt_status dt_lora_save_peft(const dt_model *m, const dt_lora_params *p, const char *base_model,
                                   const char *dir);
/* dt_lora_save_peft with the adapters' values read from checkpoint src
 * (anything dt_ckpt_open reads: a checkpoint of any strategy holds each
 * tensor whole, however the ranks held it), in their saved dtype; m gives
 * the names and layer kinds only (a sharded, meta, tensor-parallel or
 * pipeline-stage model will do: the shapes written are the full layer's).
 * So a ZeRO-3, --tp or --pp run writes its adapters after a checkpoint
 * save, the same files a one-process run writes.
 * DT_ERR_NOT_FOUND naming an adapter src lacks. */
DT_API dt_status dt_lora_save_peft_from(const dt_model *m, const char *src, const dt_lora_params *p,
                                        const char *base_model, const char *dir);

/* Whether dt_lora_save_peft could write its two files in dir: each absent
 * or a regular file (dt_file_check_target; a FIFO, a device, a directory or
 * a symlink there is DT_ERR_IO naming it). For a caller that saves at the
 * end of a run, to refuse such a dir at the start. */
DT_API dt_status dt_lora_save_peft_check(const char *dir);

/* PEFT's per-layer LoRA settings (LoraConfig's rank_pattern, alpha_pattern
 * and exclude_modules), which a dt_lora_params carries as its layer_rank
 * and exclude callbacks (dt_lora_pattern_use). A key K of rank_pattern or
 * alpha_pattern (a regular expression in dtrain's tokenizer.json regex
 * dialect) names layer N when N is K whole or a dotted prefix then K
 * (PEFT's re.match(rf"(.*\.)?({K})$", N)); the first key in the object's
 * order that names a layer gives its rank (an integer in 1..65536) or its
 * alpha (a number > 0); other layers keep r and alpha. exclude_modules: a
 * string is a regular expression a module's whole name matches
 * (re.fullmatch), a list names modules by their name or its end after a
 * "." (as target_modules does); an excluded module is never adapted.
 *
 *     dt_lora_pattern *pt;
 *     dt_lora_pattern_init("{\"q_proj\": 4}", "{\"o_proj\": 32}", "[\"lm_head\"]", &pt);
 *     dt_lora_pattern_use(pt, &lora);    // before dt_model_build; pt outlives the build
 *     ...build...
 *     dt_lora_pattern_warn(pt, &lora);   // keys that named no layer
 *     dt_lora_pattern_free(pt);
 */
typedef struct dt_lora_pattern dt_lora_pattern;
/* The patterns from their JSON texts, each NULL for none: rank_pattern and
 * alpha_pattern JSON objects (or null), exclude_modules a string, a list
 * of module names or null. DT_ERR_FORMAT naming the setting and the key
 * for bad JSON, a duplicate key, a value out of range or a malformed
 * regular expression (DT_ERR_UNSUPPORTED for a construct the engine does
 * not have, such as a backreference). Free with dt_lora_pattern_free. */
DT_API dt_status dt_lora_pattern_init(const char *rank_pattern, const char *alpha_pattern,
                                      const char *exclude_modules, dt_lora_pattern **out);
/* NULL: a no-op. */
DT_API void dt_lora_pattern_free(dt_lora_pattern *pt);
/* Set p's layer_rank, exclude and layer_ud to pt's (NULL, or empty
 * patterns: cleared). pt must outlive every use of p's callbacks (the
 * build, dt_lora_layer_scaling, dt_lora_save_peft); the callbacks count
 * the layers each key named, for dt_lora_pattern_warn (not thread-safe). */
DT_API void dt_lora_pattern_use(dt_lora_pattern *pt, dt_lora_params *p);
/* The JSON (compact, keys in the given order) of pt's "rank_pattern",
 * "alpha_pattern" or "exclude_modules" (key), NULL when pt has none of it
 * (an empty object, null). Borrowed from pt. */
DT_API const char *dt_lora_pattern_json(const dt_lora_pattern *pt, const char *key);
/* The dt_lora_pattern whose callbacks p carries (dt_lora_pattern_use),
 * else NULL. */
DT_API dt_lora_pattern *dt_lora_pattern_of(const dt_lora_params *p);
/* After a build with p (dt_lora_pattern_use(pt, p)): a warning (dt_log,
 * DT_LOG_WARN) for each rank_pattern or alpha_pattern key that named no
 * adapted layer, and for exclude_modules that excluded no module (unless
 * p has modules to save, which PEFT counts as excluded), as PEFT warns;
 * the number of warnings. */
DT_API size_t dt_lora_pattern_warn(const dt_lora_pattern *pt, const dt_lora_params *p);

/* PEFT's adapter_config.json, read by dt_lora_peft_config_read. */
typedef struct dt_lora_peft_config {
    dt_lora_params params;  /* r, lora_alpha, lora_dropout, use_rslora, use_dora; targets = target_names */
    char **target_names;    /* target_modules, NULL-terminated (owned: dt_lora_peft_config_free) */
    char **save_names;      /* modules_to_save, NULL-terminated, or NULL (owned; params.modules_to_save) */
    int64_t *layers;        /* layers_to_transform (owned; params.layers, params.nlayers), or NULL */
    char **layer_patterns;  /* layers_pattern, NULL-terminated, or NULL (owned; params.layers_pattern) */
    char base_model[1024];  /* base_model_name_or_path, "" when null */
    size_t left_out;        /* adapter tensors of an image-text model's vision tower or projector in the file,
                               which dt_trainer_load_peft leaves out (0 for a text model's adapters) */
    dt_lora_pattern *pattern; /* rank_pattern, alpha_pattern, exclude_modules (owned; set on params:
                                 dt_lora_pattern_use), NULL when the file has none */
} dt_lora_peft_config;
/* Read dir/adapter_config.json (PEFT's save_pretrained) into *out: the
 * settings to build the model with (dt_model_build_params.lora =
 * &out->params) before dt_trainer_load_peft (train.h) loads the weights.
 * target_modules: a list of layer names (PEFT's list matching), the string
 * "all-linear" (read as {"all-linear"}), or another string: PEFT's regular
 * expression that a layer's whole name matches (re.fullmatch), for which
 * target_names are the layers the file holds adapters of (full names: the
 * layers the pattern chose when PEFT built its model), each adapter's layer
 * checked against the pattern (DT_ERR_MISMATCH naming it otherwise; the
 * pattern in dtrain's tokenizer.json regex dialect: a construct it lacks,
 * such as a backreference or a lookbehind, is DT_ERR_UNSUPPORTED naming the
 * position).
 * Errors name the file and the key: DT_ERR_NOT_FOUND without the file,
 * DT_ERR_FORMAT for a malformed value, DT_ERR_UNSUPPORTED for what dtrain's
 * adapters do not express (peft_type other than LORA, lora_bias,
 * trainable_token_indices, ...): refused, never dropped. rank_pattern,
 * alpha_pattern and exclude_modules read as out->pattern (dt_lora_pattern),
 * set on params. layers_to_transform
 * and layers_pattern read as params.layers / nlayers / layers_pattern
 * (out->layers, out->layer_patterns), bias as params.bias. use_dora true reads
 * as params.dora (DoRA), modules_to_save as params.modules_to_save
 * (out->save_names); dt_trainer_load_peft then loads those modules' weights
 * too.
 * dir/adapter_model.safetensors's header is read too: an adapter whose rank
 * is not its layer's (r, or rank_pattern's: lora_A [r, in], lora_B
 * [out, r]) is DT_ERR_MISMATCH naming it and both ranks,
 * before any model is built at that rank; DoRA magnitudes
 * ("...lora_magnitude_vector") in a file whose config has no use_dora are
 * DT_ERR_FORMAT naming the key; DT_ERR_NOT_FOUND without the file.
 * Adapters trained on Gemma 3's image-text model
 * (Gemma3ForConditionalGeneration) are its language model's, read as the
 * text model's (Gemma3ForCausalLM, as dt_ckpt_open reads the image-text
 * model's directory): the keys "base_model.model.model.language_model.X"
 * (transformers 5) and "base_model.model.language_model.model.X"
 * (transformers 4) are "base_model.model.model.X", target_modules written
 * as such paths likewise; the adapters of its vision tower and projector
 * ("base_model.model.model.vision_tower.*", which target_modules such as
 * q_proj or "all-linear" also hit) are left out and counted in
 * out->left_out. A file whose every adapter is the vision tower's or the
 * projector's is DT_ERR_UNSUPPORTED naming one; an adapter under both
 * names DT_ERR_FORMAT naming both keys. */
DT_API dt_status dt_lora_peft_config_read(const char *dir, dt_lora_peft_config *out);
DT_API void dt_lora_peft_config_free(dt_lora_peft_config *c);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_CKPT_H */
