/* dtrain/base.h — status codes, errors, logging, memory, arenas, clocks, RNG, files.
 *
 * Overview
 * --------
 * Every fallible dtrain call returns a dt_status: DT_OK (0) on success,
 * a positive state (DT_INPROGRESS) for asynchronous work still running, or a
 * negative error. On error the call leaves a human-readable message in a
 * thread-local slot that dt_last_error() returns until the next error on that
 * thread. Calls that return pointers return NULL on error and set the message
 * the same way. The library never calls exit() or abort() on bad input.
 *
 * Memory: dt_alloc() returns 64-byte aligned memory (free with dt_free()).
 * A dt_arena hands out aligned temporaries from large blocks and is reset in
 * O(1) between training steps, so the steady state does no malloc.
 *
 * Files: every file dtrain writes goes through dt_file (below): no symlink is
 * followed, and a file appears complete or not at all.
 *
 * Random numbers: Philox 4x32-10, a counter-based generator. A value depends
 * only on (key, counter), never on thread count or call order, so any element
 * of any stream can be computed independently:
 *
 *     dt_rng_key k = dt_rng_key_make(seed, DT_RNG_DROPOUT, rank, step);
 *     float u = dt_rng_uniform(k, element_index);      // in [0, 1)
 *
 * For runs that must start from exactly PyTorch's numbers, dt_torch_rng is
 * PyTorch's CPU generator (torch.manual_seed / torch.Generator: MT19937) with
 * its uniform_, normal_ and randperm draws; dt_model_init_torch (nn.h) and the
 * samplers' DT_SHUFFLE_TORCH use it.
 *
 * Usage
 * -----
 *     dt_status st = dt_something(...);
 *     if (st < 0) fprintf(stderr, "error: %s: %s\n", dt_status_str(st), dt_last_error());
 */
#ifndef DTRAIN_BASE_H
#define DTRAIN_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(DT_BUILDING) && defined(__GNUC__)
#define DT_API __attribute__((visibility("default")))
#else
#define DT_API
#endif

#if defined(__GNUC__)
#define DT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DT_PRINTF(a, b)
#endif

#define DT_VERSION_MAJOR 0
#define DT_VERSION_MINOR 1
#define DT_VERSION_PATCH 0
#define DT_VERSION_STRING "0.1.0"

/* X-macro: name, value, description. Positive = state, negative = error. */
#define DT_STATUS_MAP(X)                                                    \
    X(OK, 0, "ok")                                                          \
    X(INPROGRESS, 1, "operation in progress")                               \
    X(ERR_INVALID_ARG, -1, "invalid argument")                              \
    X(ERR_NO_MEMORY, -2, "out of memory")                                   \
    X(ERR_IO, -3, "i/o error")                                              \
    X(ERR_FORMAT, -4, "malformed input")                                    \
    X(ERR_UNSUPPORTED, -5, "unsupported operation")                         \
    X(ERR_TIMEOUT, -6, "timed out")                                         \
    X(ERR_PEER_FAILED, -7, "peer failed")                                   \
    X(ERR_MISMATCH, -8, "mismatch between ranks")                           \
    X(ERR_SHAPE, -9, "shape mismatch")                                      \
    X(ERR_DTYPE, -10, "dtype mismatch")                                     \
    X(ERR_NULL, -11, "null input")                                          \
    X(ERR_STATE, -12, "invalid state")                                      \
    X(ERR_NOT_FOUND, -13, "not found")                                      \
    X(ERR_RANGE, -14, "value out of range")                                 \
    X(ERR_INTERNAL, -15, "internal error")                                  \
    X(ERR_CANCELED, -16, "canceled")

typedef enum dt_status {
#define DT__STATUS_ENUM(name, val, desc) DT_##name = (val),
    DT_STATUS_MAP(DT__STATUS_ENUM)
#undef DT__STATUS_ENUM
} dt_status;

/* Short name of a status ("DT_ERR_TIMEOUT"); never NULL. */
DT_API const char *dt_status_name(dt_status st);
/* Description of a status ("timed out"); never NULL. */
DT_API const char *dt_status_str(dt_status st);
/* The message of the last error set on this thread ("" if none). Borrowed;
 * valid until the next dt_* call on this thread that sets an error. */
DT_API const char *dt_last_error(void);
/* Set the thread's error message and return st (so callers can
 * `return dt_error(DT_ERR_SHAPE, "...", ...)`). */
DT_API dt_status dt_error(dt_status st, const char *fmt, ...) DT_PRINTF(2, 3);
/* Prefix the current message with context: "ctx: <old message>". */
DT_API dt_status dt_error_wrap(dt_status st, const char *fmt, ...) DT_PRINTF(2, 3);
/* The status of the last error set on this thread (DT_OK if none). */
DT_API dt_status dt_last_status(void);
/* Clear the thread's error state. */
DT_API void dt_error_clear(void);

/* ---- strict number parsing ------------------------------------------- */
/* The one parser for numbers that come from outside: environment variables
 * (rank, world size, timeouts, tuning knobs) and command-line flags. The
 * whole string must be the number: no leading or trailing spaces, no sign
 * other than a leading '-' (integers) or '+'/'-' (reals), no hex, nothing left
 * over; values that overflow the type or fall outside [lo, hi] are errors.
 * Reals must be finite ("nan", "inf" are rejected). `what` names the value in
 * the message ("WORLD_SIZE", "--seed"); the offending text is echoed with
 * control characters escaped (dt_escape).
 *
 *     int64_t ws;
 *     if (dt_env_int("WORLD_SIZE", 1, 1, 1 << 20, &ws) < 0)   // unset → 1
 *         fprintf(stderr, "%s\n", dt_last_error());
 *
 * Errors: DT_ERR_INVALID_ARG for every bad value (not a number, NULL or
 * empty s, a number beyond the type or outside [lo, hi]); the message says
 * which. *out is written only on success (out may be NULL to only check). */
DT_API dt_status dt_parse_int(const char *what, const char *s, int64_t lo, int64_t hi, int64_t *out);
/* Unsigned: digits only (a '-' is an error, never a wrap to 2^64-1). */
DT_API dt_status dt_parse_uint(const char *what, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
/* A finite real in [lo, hi] (decimal, optional exponent). */
DT_API dt_status dt_parse_double(const char *what, const char *s, double lo, double hi, double *out);
/* The same for an environment variable `name`: unset or empty gives `def`
 * (returned as is, not range-checked); set, it must parse and be in range,
 * and the message names the variable ("environment variable WORLD_SIZE"). */
DT_API dt_status dt_env_int(const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out);
DT_API dt_status dt_env_double(const char *name, double def, double lo, double hi, double *out);
/* Copy s into buf (capacity n > 0, always NUL-terminated, truncated with
 * "..." if too long) with control characters (bytes < 0x20 and 0x7f) written
 * as \n, \t, \r or \xNN, so that a file name or value echoed in a message
 * cannot move the cursor, recolour the terminal or forge lines. Returns buf.
 * dt_error() and dt_error_wrap() apply the same escaping to every message
 * they store, so library messages need no call; programs use it for the
 * paths and values they print themselves. */
DT_API char *dt_escape(const char *s, char *buf, size_t n);
/* A shape as messages write it, "[2,3,4]" ("[]" for ndim 0), into buf
 * (cut short, still NUL-terminated, when n is too small). Returns buf. */
DT_API char *dt_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* ---- dtypes ----------------------------------------------------------- */
/* Element types shared by tensors, kernels and collectives. */
typedef enum dt_dtype {
    DT_F32 = 0,
    DT_F64,
    DT_F16,
    DT_BF16,
    DT_I32,
    DT_I64,
    DT_U8,
    DT_DTYPE_COUNT
} dt_dtype;
/* Bytes per element (0 for an invalid dtype). */
DT_API size_t dt_dtype_size(dt_dtype t);
/* "f32", "bf16", ... ("?" for an invalid dtype). */
DT_API const char *dt_dtype_name(dt_dtype t);
/* Parse "f32"/"float32"/"fp32", "bf16", ...; returns DT_ERR_INVALID_ARG if unknown. */
DT_API dt_status dt_dtype_parse(const char *s, dt_dtype *out);
/* Element i of buf (of dtype t) as a double (NaN for an invalid dtype), and
 * v stored as element i in dtype t (f16/bf16 rounded to nearest even; u8
 * wraps modulo 256 as PyTorch's conversion does; nothing for an invalid
 * dtype). */
DT_API double dt_dtype_load(dt_dtype t, const void *buf, size_t i);
DT_API void dt_dtype_store(dt_dtype t, void *buf, size_t i, double v);

/* Scalar conversions, round-to-nearest-even, exact on NaN (quieted, sign
 * kept), Inf and subnormals. The vectorised forms are in kernels.h. */
DT_API uint16_t dt_f32_to_f16(float x);
DT_API float dt_f16_to_f32(uint16_t h);
DT_API uint16_t dt_f32_to_bf16(float x);
DT_API float dt_bf16_to_f32(uint16_t h);

/* ---- logging ---------------------------------------------------------- */
typedef enum { DT_LOG_ERROR = 0, DT_LOG_WARN, DT_LOG_INFO, DT_LOG_DEBUG } dt_log_level;
/* Level from DT_LOG_LEVEL (error|warn|info|debug), default warn. */
DT_API dt_log_level dt_log_get_level(void);
DT_API void dt_log_set_level(dt_log_level lvl);
DT_API void dt_log(dt_log_level lvl, const char *fmt, ...) DT_PRINTF(2, 3);

/* ---- memory ----------------------------------------------------------- */
#define DT_ALIGN 64
/* 64-byte aligned allocation; size 0 returns a valid unique pointer.
 * Returns NULL and sets the error on failure. From 4 MiB on the block is
 * 2 MiB aligned, a whole number of 2 MiB, and advised as dt_advise_huge. */
DT_API void *dt_alloc(size_t size);
/* Same, zero-filled. */
DT_API void *dt_calloc(size_t size);
DT_API void dt_free(void *p);
/* Commits the pages of [p, p + bytes) now, without changing what they hold,
 * so that the first writes later take no page fault: madvise
 * MADV_POPULATE_WRITE where the kernel has it (Linux 5.14; from 8 MiB on
 * each compute thread commits its own 2 MiB pieces), else one byte per page
 * read and written back, on the compute threads (the pages' first toucher
 * is the thread that will use them under a static split). Only
 * whole pages inside the range are committed. Returns the bytes committed
 * (0 for an empty range or a NULL p). Thread-safe for disjoint ranges. */
DT_API size_t dt_prefault(void *p, size_t bytes);
/* memset(p, 0, bytes), on the compute threads from 8 MiB on (each thread
 * first writes its own 2 MiB pieces, so fresh pages are committed on every
 * core at once; dt_prefault splits the same way). NULL or 0: nothing. */
DT_API void dt_memzero(void *p, size_t bytes);
/* Advises the whole pages of [p, p + bytes) MADV_HUGEPAGE: where the
 * kernel offers transparent huge pages (on "always" or "madvise"), the 2
 * MiB aligned ranges inside are backed by huge pages when first written
 * (fewer page faults, one TLB entry per 2 MiB for the passes that stream
 * them); elsewhere nothing changes. p: private anonymous memory. */
DT_API void dt_advise_huge(void *p, size_t bytes);
/* The opposite: zeroes [p, p + bytes) without holding memory for it. The
 * whole pages inside the range are given back to the system (madvise
 * MADV_DONTNEED, after MADV_NOHUGEPAGE so that no huge page commits them
 * again): they read as zero and take memory only when written; the partial
 * pages at the ends are written with zeros. p must be private anonymous
 * memory (dt_alloc, malloc, an anonymous mapping). Returns the bytes given
 * back (0 for an empty range or a NULL p). For buffers that span regions
 * nobody touches (an interleaved pipeline rank's optimizer state between
 * its stages). */
DT_API size_t dt_decommit(void *p, size_t bytes);

typedef struct dt_arena dt_arena;
/* An arena whose blocks are at least block_size bytes (0 = 4 MiB). */
DT_API dt_arena *dt_arena_init(size_t block_size);
DT_API void dt_arena_free(dt_arena *a);
/* 64-byte aligned memory valid until the next dt_arena_reset(). */
DT_API void *dt_arena_alloc(dt_arena *a, size_t size);
/* Release every allocation at once. After a step that spilled into more
 * than one block the arena coalesces into one block as large as the peak,
 * committed at once (dt_prefault), so the next step takes no page fault.
 * Blocks of 2 MiB and more are mappings advised MADV_HUGEPAGE where the
 * kernel offers transparent huge pages. */
DT_API void dt_arena_reset(dt_arena *a);
/* A position in an arena (dt_arena_mark), to give back everything allocated
 * after it (dt_arena_rewind): a region whose temporaries are dead once it
 * ends (activation checkpointing's recomputation) reuses the memory. */
typedef struct dt_arena_pos {
    void *block;       /* internal */
    size_t block_used; /* internal */
    size_t used;       /* dt_arena_used at the mark */
} dt_arena_pos;
DT_API dt_arena_pos dt_arena_mark(const dt_arena *a);
/* Release every allocation made after mark `p` (taken from a since its last
 * reset); they must no longer be used. */
DT_API void dt_arena_rewind(dt_arena *a, dt_arena_pos p);
/* p, from dt_arena_alloc(a, size) since the last reset, is dead: a later
 * dt_arena_alloc of the same size (rounded to the alignment) returns it
 * instead of new memory, the most recently given back first. A rewind to
 * a mark forgets what was given back of memory allocated after the mark;
 * a reset forgets everything. Backward gives back each intermediate
 * gradient once it has been passed on, so its peak is the live gradients,
 * not all of them. */
DT_API void dt_arena_give_back(dt_arena *a, void *p, size_t size);
/* Bytes handed out since the last reset, and the high-water mark (memory
 * handed out again after dt_arena_give_back counts once). */
DT_API size_t dt_arena_used(const dt_arena *a);
DT_API size_t dt_arena_peak(const dt_arena *a);
/* Bytes the arena holds in blocks now (used or not); changes only when a
 * block is added or the blocks are coalesced at a reset. 0 for NULL. */
DT_API size_t dt_arena_capacity(const dt_arena *a);

/* ---- clocks ----------------------------------------------------------- */
/* Monotonic time in seconds / nanoseconds. */
DT_API double dt_time_s(void);
DT_API uint64_t dt_time_ns(void);

/* ---- hashing ---------------------------------------------------------- */
/* 64-bit FNV-1a over bytes, chained with seed (0 for a fresh hash). */
DT_API uint64_t dt_hash64(const void *data, size_t n, uint64_t seed);

/* ---- counter-based RNG (Philox 4x32-10) -------------------------------- */
/* Purposes keep streams that share a seed apart. */
typedef enum {
    DT_RNG_INIT = 1,     /* parameter initialisation */
    DT_RNG_DROPOUT = 2,  /* dropout masks */
    DT_RNG_SHUFFLE = 3,  /* data order */
    DT_RNG_DATA = 4,     /* synthetic data */
    DT_RNG_USER = 100    /* first value free for applications */
} dt_rng_purpose;

typedef struct { uint32_t k[2]; uint64_t stream; } dt_rng_key;

/* Derive a key from (seed, purpose, a, b); a and b are free coordinates
 * (rank, step, parameter index...). */
DT_API dt_rng_key dt_rng_key_make(uint64_t seed, uint32_t purpose, uint64_t a, uint64_t b);
/* The raw Philox 4x32-10 block for counter ctr[4] under key k[2]. */
DT_API void dt_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Four 32-bit values for block index i of the key's stream. */
DT_API void dt_rng_block(dt_rng_key k, uint64_t i, uint32_t out[4]);
/* Element i of the stream as a uniform float in [0, 1), 24 bits. */
DT_API float dt_rng_uniform(dt_rng_key k, uint64_t i);
/* Fill n uniforms in [lo, hi) with elements first..first+n-1. */
DT_API void dt_rng_fill_uniform(dt_rng_key k, uint64_t first, float *out, size_t n, float lo, float hi);
/* Fill n normals N(mean, std^2) (Box-Muller on element pairs). */
DT_API void dt_rng_fill_normal(dt_rng_key k, uint64_t first, float *out, size_t n, float mean, float std);
/* A uniformly random permutation of 0..n-1 (Fisher-Yates driven by the
 * stream; depends only on key and n). */
DT_API dt_status dt_rng_permutation(dt_rng_key k, int64_t *out, int64_t n);

/* ---- PyTorch's CPU generator (MT19937) --------------------------------- */
/* The generator behind torch.manual_seed(seed) and torch.Generator().
 * manual_seed(seed) on CPU, and the element-by-element draws of torch's CPU
 * kernels (checked against torch 1.13 in tests/base/test_torch_rng.c):
 *   uniform_(from, to) on f32: u = (next() & (2^24 - 1)) * 2^-24 in double,
 *       x = (float)(u * (float)(to - from) + from), one draw per element;
 *   normal_(mean, std) on f32: n >= 16 fills n uniforms in [0, 1) and turns
 *       each group of 16 into 8 Box-Muller pairs (the last, partial group
 *       redrawn as the final 16 elements); n < 16 draws double pairs (two
 *       64-bit draws each) and caches the second value in the generator,
 *       as torch does (to 1 ulp: torch's vectorised log/sin/cos may round
 *       differently);
 *   randperm(n): 0..n-1, then for i in 0..n-2 swap i with i + next() % (n-i)
 *       (next64() when n >= 2^32/20).
 * Sequential, so it is not split across threads; use it where matching a
 * PyTorch run number for number matters (initial weights, data order). */
typedef struct dt_torch_rng {
    uint32_t s[624];
    int i;
    bool has_cached_normal;
    double cached_normal;
} dt_torch_rng;

/* torch.manual_seed(seed) (only the low 32 bits count, as in torch). */
DT_API void dt_torch_rng_seed(dt_torch_rng *g, uint64_t seed);
/* The next 32-bit output (torch's generator->random()). */
DT_API uint32_t dt_torch_rng_next(dt_torch_rng *g);
/* tensor.uniform_(from, to) for n f32 elements. */
DT_API void dt_torch_rng_uniform(dt_torch_rng *g, float *x, size_t n, double from, double to);
/* tensor.normal_(mean, std) for n f32 elements. */
DT_API void dt_torch_rng_normal(dt_torch_rng *g, float *x, size_t n, double mean, double std);
/* The same draws of n elements (the generator advances exactly as the
 * calls above with n), keeping only elements [lo, hi) into out[0, hi - lo):
 * a shard of a tensor's initial value with memory of the shard only. */
DT_API void dt_torch_rng_uniform_part(dt_torch_rng *g, size_t n, size_t lo, size_t hi, float *out, double from,
                                      double to);
DT_API void dt_torch_rng_normal_part(dt_torch_rng *g, size_t n, size_t lo, size_t hi, float *out, double mean,
                                     double std);
/* torch.randperm(n, generator=torch.Generator().manual_seed(seed)). */
DT_API dt_status dt_torch_randperm(uint64_t seed, int64_t *out, int64_t n);

/* ---- files dtrain writes ------------------------------------------------ */
/* Every file the library and the `dtrain` command write follows one rule:
 * it is created without following symlinks, and it appears at its name
 * complete or not at all. A dt_file is a fresh temporary ".NAME.tmp-XXXXXXXX"
 * in NAME's directory (O_CREAT|O_EXCL|O_NOFOLLOW: nothing planted there is
 * ever opened) that dt_file_commit fsyncs and renames to NAME (rename never
 * writes through a link). An existing symlink at NAME is refused with an
 * error naming it, and so is anything else there that is not a regular file
 * (a device such as /dev/null, a FIFO, a socket, a directory), which the
 * rename would replace. Whole files (checkpoints, plots):
 *
 *     dt_file *f;
 *     if (dt_file_open("model.safetensors", 0644, &f) < 0) return ...;
 *     st = dt_file_write(f, buf, n);
 *     if (st == DT_OK) st = dt_file_commit(f);     // NAME now holds all of it
 *     dt_file_close(f);                            // not committed: temp removed
 *
 * Files that must be visible while they grow (logs, metrics records) are
 * committed right after opening and written afterwards through the same fd.
 * Errors are DT_ERR_IO with a message naming the path. */
typedef struct dt_file dt_file;
/* Start writing path: creates the temporary beside it with permission bits
 * mode (before the umask). Fails if path is a symlink or anything else
 * but a regular file. *out owned by the caller; release with dt_file_close. */
DT_API dt_status dt_file_open(const char *path, int mode, dt_file **out);
/* Write all n bytes (retries short writes and EINTR). */
DT_API dt_status dt_file_write(dt_file *f, const void *data, size_t n);
/* fsync, rename the temporary to the final path (refusing a symlink or
 * other non-regular file that appeared there), fsync the directory. The fd
 * stays open for writing; a second commit is a no-op. */
DT_API dt_status dt_file_commit(dt_file *f);
/* Close the fd; an uncommitted file's temporary is removed (the final path
 * is left as it was). NULL is a no-op. Returns a close error of a
 * committed file. */
DT_API dt_status dt_file_close(dt_file *f);
/* The open fd (for fdopen-free writers, fsync, ...); -1 for NULL. Borrowed. */
DT_API int dt_file_fd(const dt_file *f);
/* The final path given to dt_file_open. Borrowed; valid until close. */
DT_API const char *dt_file_path(const dt_file *f);
/* open + write + commit + close: path holds data, or is unchanged. */
DT_API dt_status dt_file_write_atomic(const char *path, const void *data, size_t n, int mode);
/* Create path exclusively (O_CREAT|O_EXCL|O_NOFOLLOW) and return its fd in
 * *fd (-1 on error): for files that must not replace anything. */
DT_API dt_status dt_file_create_excl(const char *path, int mode, int *fd);
/* Whether dt_file_commit could put a file at path: DT_OK when nothing is
 * there or a regular file is; DT_ERR_IO naming it for a symlink, a
 * directory, a device (/dev/null), a FIFO or a socket. For a caller that
 * renames into place long after it starts (a run's metrics file), to refuse
 * such a name at the start rather than at the end. */
DT_API dt_status dt_file_check_target(const char *path);
/* rename(from, to), refusing a symlink at to and anything there but a file
 * of from's kind (a regular file; a directory when from is one), then fsync
 * to's directory. */
DT_API dt_status dt_file_rename(const char *from, const char *to);
/* Whether path is a link the Hugging Face hub cache made: a file of a
 * snapshot, REPO/snapshots/REV/NAME, linked to a regular file in the same
 * repository's REPO/blobs/ (the layout huggingface_hub's snapshot_download
 * and from_pretrained leave). Then the blob's real path is in out[0, n).
 * These are the only symlinks dtrain's readers follow: a model directory
 * in the cache is read where it lies, any other symlink is refused. */
DT_API bool dt_file_hf_cache_link(const char *path, char *out, size_t n);
/* Read the whole regular file at path (not followed through a symlink,
 * except a Hugging Face cache link, dt_file_hf_cache_link) into
 * a fresh NUL-terminated buffer *out (free with free) of *len bytes.
 * DT_ERR_NOT_FOUND when it does not exist, DT_ERR_FORMAT when it is larger
 * than max bytes or not a regular file, DT_ERR_IO on a read error; each
 * message names the path. */
DT_API dt_status dt_file_read_all(const char *path, size_t max, char **out, size_t *len);
/* path without its trailing slashes into buf ("out/" -> "out", "/" stays): the name lstat sees as the entry
 * itself (lstat of "link/" follows the link) and the one a temporary beside it is named from.
 * DT_ERR_INVALID_ARG, naming the path, when it does not fit in cap bytes. */
DT_API dt_status dt_path_trim_slashes(const char *path, char *buf, size_t cap);

/* Make directory path and its missing parents (mode 0755, as mkdir -p).
 * DT_ERR_IO naming the path when one cannot be made (a file in the way of a
 * parent included); DT_ERR_INVALID_ARG when path (its trailing slashes
 * aside) is a symlink (not followed) or not a directory. */
DT_API dt_status dt_dir_make(const char *path);
/* Make the missing parent directories of path (dt_dir_make of all but its
 * last component, its trailing slashes aside; as os.makedirs(dirname)):
 * DT_OK when path has no directory part. */
DT_API dt_status dt_dir_make_parent(const char *path);
/* Hold directory dir for this job: open it (never through a symlink) and
 * take flock(LOCK_EX) on it without waiting; *fd is the descriptor (close
 * it to let go; the kernel lets go when the process ends, kill -9
 * included). DT_ERR_STATE when another open file holds it (another job,
 * or another holder in this process); DT_ERR_INVALID_ARG when dir is a
 * symlink or not a directory, DT_ERR_IO when it cannot be opened. A file
 * system without flock on directories: DT_OK, the directory unlocked. */
DT_API dt_status dt_dir_lock(const char *dir, int *fd);
/* A directory held for one job's output from its start to its end: made
 * when missing (with its missing parents, never through a symlink) and
 * held (dt_dir_lock). dt_dir_hold_close(h, true) lets go and removes what
 * open made when it is still empty: the directory, then each parent open
 * made, but only while the name still leads to the directory held (never
 * one that replaced it, another job's or a rename's). A job that failed
 * before it wrote leaves nothing behind:
 *
 *     dt_dir_hold *h;
 *     if (dt_dir_hold_open("out/adapter", &h) < 0) return 2; // held by another job: DT_ERR_STATE
 *     ... train, then write into dt_dir_hold_path(h) ...
 *     dt_dir_hold_close(h, failed);
 *
 * Errors as dt_dir_make and dt_dir_lock (DT_ERR_STATE names the directory;
 * a directory open made for a holder that lost the race stays: it is the
 * holder's). */
typedef struct dt_dir_hold dt_dir_hold;
DT_API dt_status dt_dir_hold_open(const char *dir, dt_dir_hold **out);
/* The held directory's name, without its trailing slashes. NULL for NULL. */
DT_API const char *dt_dir_hold_path(const dt_dir_hold *h);
/* Whether the name still leads to the directory held (false once renamed
 * over or removed and made again). */
DT_API bool dt_dir_hold_same(const dt_dir_hold *h);
/* Let go; remove_made: also remove what open made, as above. NULL: no-op. */
DT_API void dt_dir_hold_close(dt_dir_hold *h, bool remove_made);

/* ---- threads ---------------------------------------------------------- */
/* Compute threads used by kernels (OpenMP). 0 = library default
 * (OMP_NUM_THREADS, else the number of cores). */
DT_API void dt_set_num_threads(int n);
DT_API int dt_get_num_threads(void);
/* Cores this process may run on (its CPU affinity; the online CPUs when
 * that cannot be read), at least 1. */
DT_API int dt_cpu_cores(void);
/* The compute threads each of `ranks` processes sharing this process's
 * cores gets: max(1, dt_cpu_cores() / ranks), 1 for ranks < 1. `dtrain run`
 * sets OMP_NUM_THREADS to it for its ranks unless already set. */
DT_API int dt_threads_per_rank(int ranks);

/* ---- OpenMP's waiting policy on shared CPUs ---------------------------- */
/* OpenMP threads that spin at a barrier while another process holds a core
 * take the CPU from the thread still computing: with libgomp's default spin
 * a run on a loaded 2-core machine gets 20-30x slower. Passive waiting never
 * collapses, but an idle machine pays a wake-up per parallel region (the
 * ConvNet step 15-25%). The dtrain program picks one at start (a short
 * spin, GOMP_SPINCOUNT=10000, or OMP_WAIT_POLICY=passive; libgomp reads both
 * once, when it is loaded, and offers no call that changes either later, so
 * the choice is made before any OpenMP code runs and the program executes
 * itself again with it):
 *
 *     dt_omp_wait_reading r;
 *     bool passive = dt_omp_wait_choose(cores, dt_get_num_threads(), NULL, NULL, &r);
 *
 * dt_cpu_load_read: one reading of the machine's 1-minute load average
 * (*load1) and of the tasks runnable now besides the caller (*running),
 * /proc/loadavg's first and fourth fields. DT_LOADAVG stands in for both
 * (tests, or to force a choice): "L" (a number >= 0) gives load L and
 * running floor(L); "L,R" gives running R (an integer >= 0). Returns DT_OK;
 * on a malformed DT_LOADAVG DT_ERR_INVALID_ARG, and DT_ERR_IO when
 * /proc/loadavg cannot be read, with both outputs -1 (unknown) and a
 * message naming the source. */
DT_API dt_status dt_cpu_load_read(double *load1, int *running);
/* True when passive waiting is the better bet for a process that runs
 * `threads` compute threads on a machine of `cores` cores: when fewer cores
 * are free than it needs, by the 1-minute average and by the tasks runnable
 * now alike:
 *     min(load1, running) > cores - threads + 0.5
 * (a machine idle now but busy a minute ago, whose average still reads 1 on
 * 2 cores, spins; a machine busy now and for the last minute waits
 * passively). A negative (unknown) load1 gives true (passive never
 * collapses); a negative running leaves load1 alone to decide. For
 * threads == cores the threshold is 0.5; with threads = 1 no team waits and
 * the policy hardly matters. */
DT_API bool dt_omp_wait_passive(double load1, int running, int cores, int threads);
/* One reading for dt_omp_wait_choose: as dt_cpu_load_read (DT_OK, or < 0
 * when unknown). */
typedef dt_status (*dt_load_sample_fn)(void *ud, double *load1, int *running);
/* What dt_omp_wait_choose read. */
typedef struct {
    double load1; /* the first reading's 1-minute load; -1 unknown */
    int running;  /* the runnable count decided on (the median of the readings); -1 unknown */
    int readings; /* readings taken, 1..9 */
} dt_omp_wait_reading;
/* dt_omp_wait_passive over a short window instead of one instant: the
 * first reading's load1 alone decides when it leaves the cores free (spin;
 * one reading, no wait); otherwise readings of the runnable count are taken
 * (5 ms apart with the default sampler) until 5 of them agree, at most 9
 * (~40 ms), and their median decides, so one task runnable at one instant
 * on an idle machine does not make it passive. sample NULL: /proc/loadavg
 * (dt_cpu_load_read; DT_LOADAVG set: that one reading decides); else
 * sample(ud, ...) gives each reading (tests: a sequence). An unknown first
 * reading gives passive. *out (may be NULL): what was read. */
DT_API bool dt_omp_wait_choose(int cores, int threads, dt_load_sample_fn sample, void *ud,
                               dt_omp_wait_reading *out);

/* ---- CPU features ----------------------------------------------------- */
typedef struct {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512_bf16, avx512_fp16;
    bool amx_tile, amx_bf16; /* AMX tiles and tdpbf16ps, with the OS saving the tile state */
} dt_cpu_features;
/* What the CPU and the OS support, less what DT_MAX_CPU_ISA switches off.
 * Every SIMD path dtrain chooses at run time (dtype conversion, optimizer
 * and reduction loops) decides from this, so DT_MAX_CPU_ISA=avx2 runs an
 * AVX-512 machine on the code paths of an AVX2 one. oneDNN has its own
 * switch (ONEDNN_MAX_CPU_ISA, e.g. AVX2); set both to emulate a smaller CPU. */
DT_API dt_cpu_features dt_cpu_detect(void);
/* What the CPU and the OS support, ignoring DT_MAX_CPU_ISA. */
DT_API dt_cpu_features dt_cpu_detect_hw(void);
/* The cap from DT_MAX_CPU_ISA (read once): scalar (no AVX at all), avx2 (no
 * AVX-512), avx512 (AVX-512 but no AMX: dtrain's AMX GEMM off), or all
 * (unset, "amx" or "all": no cap). An unknown value logs a warning and means
 * no cap. */
typedef enum {
    DT_CPU_ISA_SCALAR = 0,
    DT_CPU_ISA_AVX2 = 1,
    DT_CPU_ISA_AVX512 = 2,
    DT_CPU_ISA_ALL = 3
} dt_cpu_isa_cap;
DT_API dt_cpu_isa_cap dt_cpu_max_isa(void);
/* "scalar", "avx2", "avx512", "all". */
DT_API const char *dt_cpu_isa_cap_name(dt_cpu_isa_cap cap);
/* "avx2 fma f16c ..." into buf; returns buf. */
DT_API char *dt_cpu_features_str(dt_cpu_features f, char *buf, size_t n);
/* The CPU as it names itself, with its family, model and stepping and the
 * CPUs this process may run on: "AMD EPYC (family 26, model 2, stepping 1),
 * 2 CPUs" (the cpuid brand string, the numbers as lscpu gives them) into
 * buf; returns buf. "unknown" in place of the name where the CPU gives none. */
DT_API char *dt_cpu_model_str(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_BASE_H */
