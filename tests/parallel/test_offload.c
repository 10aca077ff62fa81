/* NVMe offload (offload.h): the store's round trip on every I/O engine,
 * the optimizer over the store equal bit for bit to the in-memory one (SGD
 * with momentum, AdamW; several ranges, no-decay segments, several steps),
 * the pipelined order (buffer_count 4) equal to the synchronous one
 * (buffer_count 1), and clear errors for a bad path, a file-size limit
 * (RLIMIT_FSIZE, as a full disk) and a truncated file. */
// dt-test-timeout: 60
// dt-test-labels: threads
#include "dtrain/dtrain.h"
#include "test.h"
#include "tmp_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_root[256];

#if defined(__SANITIZE_THREAD__)
/* glibc's POSIX AIO starts more helper threads from inside its own helper
 * thread, where TSan's allocator has no thread state: TSan crashes there
 * (SIGSEGV in its calloc, under handle_fildes_io), whatever the caller does.
 * The TSan build checks the threads of the other two engines; the release
 * and ASan builds test all three. */
static const dt_offload_io engines[] = {DT_OFFLOAD_IO_URING, DT_OFFLOAD_IO_THREAD};
#else
static const dt_offload_io engines[] = {DT_OFFLOAD_IO_URING, DT_OFFLOAD_IO_AIO, DT_OFFLOAD_IO_THREAD};
#endif

static dt_offload_params nvme_params(dt_offload_io io)
{
    dt_offload_params p = dt_offload_params_default();
    p.device = DT_OFFLOAD_NVME;
    p.nvme_path = g_root;
    p.io = io;
    return p;
}

/* Open a store on engine io; false (and a note) when the engine is not
 * available here, which must then be a clear DT_ERR_UNSUPPORTED. */
static bool open_engine(dt_offload_io io, dt_nvme_store **s)
{
    dt_offload_params p = nvme_params(io);
    dt_status st = dt_nvme_store_open(&p, s);
    if (st == DT_ERR_UNSUPPORTED && io == DT_OFFLOAD_IO_URING) {
        fprintf(stderr, "note: io_uring not available here (%s); the other engines are tested\n", dt_last_error());
        return false;
    }
    if (st < 0)
        fprintf(stderr, "store open (%s): %s\n", dt_offload_io_name(io), dt_last_error());
    return st == DT_OK;
}

TEST(parse_and_names)
{
    dt_offload_params p = dt_offload_params_default();
    ASSERT_EQ_INT(p.device, DT_OFFLOAD_NONE);
    ASSERT_EQ_INT(p.buffer_count, 4);
    ASSERT_EQ_U64(p.sub_group_size, 1000000000u);
    ASSERT_OK(dt_offload_parse("cpu", &p));
    ASSERT_EQ_INT(p.device, DT_OFFLOAD_CPU);
    ASSERT_OK(dt_offload_parse("nvme:/x/y", &p));
    ASSERT_EQ_INT(p.device, DT_OFFLOAD_NVME);
    ASSERT_STR_EQ(p.nvme_path, "/x/y");
    ASSERT_STATUS(dt_offload_parse("nvme:", &p), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_offload_parse("gpu", &p), DT_ERR_INVALID_ARG);
    dt_offload_io io;
    ASSERT_OK(dt_offload_io_parse("thread", &io));
    ASSERT_EQ_INT(io, DT_OFFLOAD_IO_THREAD);
    ASSERT_STATUS(dt_offload_io_parse("sync", &io), DT_ERR_INVALID_ARG);
    /* AUTO picks a real engine and says which */
    dt_nvme_store *s;
    dt_offload_params np = nvme_params(DT_OFFLOAD_IO_AUTO);
    ASSERT_OK(dt_nvme_store_open(&np, &s));
    ASSERT(dt_nvme_store_io(s) != DT_OFFLOAD_IO_AUTO);
    fprintf(stderr, "auto engine here: %s\n", dt_offload_io_name(dt_nvme_store_io(s)));
    dt_nvme_store_close(s);
}

TEST(store_round_trip_every_engine)
{
    for (size_t e = 0; e < sizeof engines / sizeof engines[0]; e++) {
        dt_nvme_store *s;
        if (!open_engine(engines[e], &s)) {
            ASSERT(engines[e] == DT_OFFLOAD_IO_URING);
            continue;
        }
        ASSERT_EQ_INT(dt_nvme_store_io(s), engines[e]);
        char dir[512];
        snprintf(dir, sizeof dir, "%s", dt_nvme_store_dir(s));
        ASSERT(strncmp(dir, g_root, strlen(g_root)) == 0);
        const size_t sizes[3] = {(size_t)3 << 20 | 13, 0, 4097};
        int id[3];
        ASSERT_OK(dt_nvme_store_add(s, "a", sizes[0], &id[0]));
        ASSERT_OK(dt_nvme_store_add(s, "empty", sizes[1], &id[1]));
        ASSERT_OK(dt_nvme_store_add(s, "b.state-1_x", sizes[2], &id[2]));
        ASSERT_STATUS(dt_nvme_store_add(s, "a", 10, &id[1]), DT_ERR_IO);    /* O_EXCL: exists */
        ASSERT_STATUS(dt_nvme_store_add(s, "../x", 10, &id[1]), DT_ERR_INVALID_ARG);
        /* the file exists with mode 0600, sized, zero */
        char path[700];
        snprintf(path, sizeof path, "%s/a", dir);
        struct stat sb;
        ASSERT(lstat(path, &sb) == 0 && S_ISREG(sb.st_mode));
        ASSERT_EQ_INT(sb.st_mode & 0777, 0600);
        ASSERT_EQ_U64((size_t)sb.st_size, sizes[0]);
        unsigned char *w = malloc(sizes[0]), *r = malloc(sizes[0]);
        ASSERT(w && r);
        for (size_t i = 0; i < sizes[0]; i++)
            w[i] = (unsigned char)(i * 131u + 7u + e);
        /* many requests in flight at once: 8 pieces written, then read back out of order */
        uint64_t t[8];
        size_t piece = sizes[0] / 8;
        for (int k = 0; k < 8; k++) {
            size_t off = (size_t)k * piece, n = k == 7 ? sizes[0] - off : piece;
            ASSERT_OK(dt_nvme_store_write(s, id[0], off, w + off, n, &t[k]));
        }
        for (int k = 7; k >= 0; k--)
            ASSERT_OK(dt_nvme_store_wait(s, t[k]));
        ASSERT_STATUS(dt_nvme_store_wait(s, t[3]), DT_ERR_INVALID_ARG); /* retired */
        memset(r, 0xEE, sizes[0]);
        for (int k = 0; k < 8; k++) {
            size_t off = (size_t)k * piece, n = k == 7 ? sizes[0] - off : piece;
            ASSERT_OK(dt_nvme_store_read(s, id[0], off, r + off, n, &t[k]));
        }
        ASSERT_OK(dt_nvme_store_wait_all(s));
        ASSERT(memcmp(w, r, sizes[0]) == 0);
        /* an unwritten region reads as zeros; an odd-sized tail */
        unsigned char z[4097];
        memset(z, 0x55, sizeof z);
        uint64_t tz;
        ASSERT_OK(dt_nvme_store_read(s, id[2], 0, z, sizes[2], &tz));
        ASSERT_OK(dt_nvme_store_wait(s, tz));
        for (size_t i = 0; i < sizes[2]; i++)
            ASSERT_EQ_INT(z[i], 0);
        ASSERT_OK(dt_nvme_store_write(s, id[2], 4000, w, 97, &tz));
        ASSERT_OK(dt_nvme_store_wait(s, tz));
        ASSERT_OK(dt_nvme_store_read(s, id[2], 3990, z, 107, &tz));
        ASSERT_OK(dt_nvme_store_wait(s, tz));
        for (size_t i = 0; i < 10; i++)
            ASSERT_EQ_INT(z[i], 0);
        ASSERT(memcmp(z + 10, w, 97) == 0);
        /* out of range, and the empty region */
        ASSERT_STATUS(dt_nvme_store_read(s, id[2], 4000, z, 98, &tz), DT_ERR_RANGE);
        ASSERT_STR_CONTAINS(dt_last_error(), "b.state-1_x");
        ASSERT_STATUS(dt_nvme_store_read(s, 9, 0, z, 1, &tz), DT_ERR_RANGE);
        ASSERT_OK(dt_nvme_store_read(s, id[1], 0, z, 0, &tz));
        ASSERT_OK(dt_nvme_store_wait(s, tz));
        dt_nvme_stats stt;
        dt_nvme_store_stats(s, &stt);
        ASSERT_EQ_U64(stt.bytes_written, sizes[0] + 97);
        ASSERT_EQ_U64(stt.bytes_read, sizes[0] + sizes[2] + 107);
        free(w);
        free(r);
        dt_nvme_store_close(s);
        /* the run directory and its files are gone */
        ASSERT(lstat(dir, &sb) < 0 && errno == ENOENT);
        ASSERT_EQ_INT(t_count_entries(g_root, false), 0);
    }
}

/* ---- the optimizer over the store -------------------------------------------------- */

#define N 10007 /* not a multiple of anything the sub-groups use */

typedef struct fixture {
    dt_flat P, G;
    float *p, *g;
    dt_optim_segment segs[4];
    dt_optim_range r[2];
} fixture;

static void fixture_init(fixture *f, uint64_t seed)
{
    f->p = dt_alloc(N * sizeof(float));
    f->g = dt_alloc(N * sizeof(float));
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        f->p[i] = (float)((double)(x >> 40) / (double)(1ull << 24) - 0.5);
    }
    dt_flat_wrap(&f->P, DT_F32, f->p, N);
    dt_flat_wrap(&f->G, DT_F32, f->g, N);
    /* tensors: [0,3000) decays, [3000,3001) a bias (no decay), [3001,9000), [9000,10007) no decay */
    f->segs[0] = (dt_optim_segment){0, 3000, false};
    f->segs[1] = (dt_optim_segment){3000, 1, true};
    f->segs[2] = (dt_optim_segment){3001, 5999, false};
    f->segs[3] = (dt_optim_segment){9000, 1007, true};
    /* two ranges: [0, 4500) and [4500, N) of one flat, segments shared */
    f->r[0] = (dt_optim_range){.params = &f->P, .grads = &f->G, .lo = 0, .hi = 4500, .segs = f->segs, .nseg = 3};
    f->r[1] = (dt_optim_range){.params = &f->P, .grads = &f->G, .lo = 4500, .hi = N, .segs = f->segs + 2, .nseg = 2};
}

static void fixture_grads(fixture *f, int step)
{
    for (size_t i = 0; i < N; i++)
        f->g[i] = sinf((float)(i * 7 + (size_t)step * 13)) * 0.25f + (float)step * 1e-3f;
}

static void fixture_free(fixture *f)
{
    dt_free(f->p);
    dt_free(f->g);
}

static dt_status make_opt(dt_optim_kind kind, const dt_optim_range *r, size_t nr, dt_optim **o)
{
    if (kind == DT_OPTIM_SGD) {
        dt_sgd_params sp = dt_sgd_params_default();
        sp.lr = 0.05;
        sp.momentum = 0.9;
        sp.weight_decay = 1e-2;
        sp.nesterov = true;
        return dt_optim_sgd_init(&sp, r, nr, o);
    }
    if (kind == DT_OPTIM_LION) {
        dt_lion_params lp = dt_lion_params_default();
        lp.lr = 3e-3;
        lp.weight_decay = 0.1;
        return dt_optim_lion_init(&lp, r, nr, o);
    }
    dt_adam_params ap = dt_adamw_params_default();
    ap.lr = 3e-3;
    ap.weight_decay = 0.1;
    return kind == DT_OPTIM_ADAMW ? dt_optim_adamw_init(&ap, r, nr, o) : dt_optim_adam_init(&ap, r, nr, o);
}

/* Steps of the in-memory optimizer and of the driver (engine io, sub-groups
 * of sg elements, nbuf buffers), compared bit for bit: parameters after
 * every step and the state at the end. */
static int compare_with_memory(dt_optim_kind kind, dt_offload_io io, size_t sg, int nbuf, int steps)
{
    fixture a, b;
    fixture_init(&a, 1);
    fixture_init(&b, 1);
    int bad = -1;
    dt_optim *om = NULL, *od = NULL;
    dt_offload_optim *d = NULL;
    if (make_opt(kind, a.r, 2, &om) < 0 || make_opt(kind, NULL, 0, &od) < 0) {
        fprintf(stderr, "optimizer: %s\n", dt_last_error());
        goto done;
    }
    dt_optim_set_zero_grad(om, true);
    dt_optim_set_zero_grad(od, true);
    dt_offload_params p = nvme_params(io);
    p.sub_group_size = sg;
    p.buffer_count = nbuf;
    if (dt_offload_optim_init(&p, od, b.r, 2, &d) < 0) {
        fprintf(stderr, "driver: %s\n", dt_last_error());
        goto done;
    }
    for (int s = 0; s < steps; s++) {
        fixture_grads(&a, s);
        fixture_grads(&b, s);
        double lr = (kind == DT_OPTIM_SGD ? 0.05 : 3e-3) * (1.0 - 0.1 * s); /* a schedule */
        dt_optim_set_lr(om, lr);
        dt_optim_set_lr(od, lr);
        if (dt_optim_step(om) < 0 || dt_offload_optim_step(d) < 0) {
            fprintf(stderr, "step %d: %s\n", s, dt_last_error());
            goto done;
        }
        if (memcmp(a.p, b.p, N * sizeof(float)) != 0) {
            for (size_t i = 0; i < N; i++)
                if (memcmp(&a.p[i], &b.p[i], sizeof(float))) {
                    fprintf(stderr, "step %d: param %zu: %.9g in memory, %.9g offloaded\n", s, i, a.p[i], b.p[i]);
                    break;
                }
            goto done;
        }
        for (size_t i = 0; i < N; i++) /* both zeroed the gradients */
            if (b.g[i] != 0.0f) {
                fprintf(stderr, "grad %zu not zeroed\n", i);
                goto done;
            }
    }
    if (dt_optim_get_step(od) != steps) {
        fprintf(stderr, "driver's optimizer counted %lld steps\n", (long long)dt_optim_get_step(od));
        goto done;
    }
    for (size_t r = 0; r < 2; r++)
        for (int i = 0; i < dt_optim_num_states(om); i++) {
            float *ms;
            size_t n;
            dt_optim_state(om, r, i, NULL, &ms, &n);
            float *ds = malloc(n * sizeof(float));
            if (dt_offload_optim_read_state(d, r, i, a.r[r].lo, n, ds) < 0 || memcmp(ms, ds, n * sizeof(float))) {
                fprintf(stderr, "state %d of range %zu differs (%s)\n", i, r, dt_last_error());
                free(ds);
                goto done;
            }
            free(ds);
        }
    bad = 0;
done:
    dt_offload_optim_free(d);
    dt_optim_free(om);
    dt_optim_free(od);
    fixture_free(&a);
    fixture_free(&b);
    return bad;
}

TEST(optimizer_over_store_equals_in_memory)
{
    const dt_optim_kind kinds[] = {DT_OPTIM_SGD, DT_OPTIM_ADAMW, DT_OPTIM_ADAM, DT_OPTIM_LION};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        /* one sub-group per range (the default size), and many small ones */
        if (compare_with_memory(kinds[k], DT_OFFLOAD_IO_AUTO, 1000000000, 4, 4))
            TEST_FAIL_("%s, default sub-groups", dt_optim_kind_name(kinds[k]));
        if (compare_with_memory(kinds[k], DT_OFFLOAD_IO_AUTO, 777, 4, 4))
            TEST_FAIL_("%s, sub-groups of 777", dt_optim_kind_name(kinds[k]));
    }
}

TEST(pipelined_equals_synchronous_every_engine)
{
    /* buffer_count 1 is read-step-write one sub-group at a time; 2, 3 and 7
     * overlap; each equals the in-memory optimizer, hence each other */
    for (size_t e = 0; e < sizeof engines / sizeof engines[0]; e++) {
        dt_nvme_store *s;
        if (!open_engine(engines[e], &s))
            continue;
        dt_nvme_store_close(s);
        const int nbufs[] = {1, 2, 3, 7};
        for (size_t b = 0; b < 4; b++)
            if (compare_with_memory(DT_OPTIM_ADAMW, engines[e], 500, nbufs[b], 3))
                TEST_FAIL_("adamw, engine %s, %d buffers", dt_offload_io_name(engines[e]), nbufs[b]);
    }
    ASSERT_EQ_INT(t_count_entries(g_root, false), 0);
}

TEST(driver_memory_and_errors)
{
    fixture f;
    fixture_init(&f, 3);
    dt_optim *o;
    ASSERT_OK(make_opt(DT_OPTIM_ADAMW, NULL, 0, &o));
    dt_offload_params p = nvme_params(DT_OFFLOAD_IO_AUTO);
    p.sub_group_size = 1000;
    p.buffer_count = 3;
    dt_offload_optim *d;
    ASSERT_OK(dt_offload_optim_init(&p, o, f.r, 2, &d));
    ASSERT_EQ_U64(dt_offload_optim_num_subgroups(d), 5 + 6);
    ASSERT_EQ_U64(dt_offload_optim_buffer_bytes(d), 3 * 2 * 1000 * sizeof(float)); /* not the whole state */
    ASSERT_STATUS(dt_offload_optim_read_state(d, 1, 0, 4000, 10, f.p), DT_ERR_RANGE);
    ASSERT_STATUS(dt_offload_optim_read_state(d, 0, 2, 0, 10, f.p), DT_ERR_RANGE);
    dt_offload_optim_free(d);
    /* an optimizer with its own ranges (state in memory) is refused, LAMB too */
    dt_optim *own;
    ASSERT_OK(make_opt(DT_OPTIM_ADAMW, f.r, 1, &own));
    ASSERT_STATUS(dt_offload_optim_init(&p, own, f.r, 2, &d), DT_ERR_INVALID_ARG);
    dt_optim_free(own);
    dt_lamb_params lp = dt_lamb_params_default();
    dt_optim *lamb;
    ASSERT_OK(dt_optim_lamb_init(&lp, NULL, 0, &lamb));
    ASSERT_STATUS(dt_offload_optim_init(&p, lamb, f.r, 2, &d), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "lamb");
    float *st[2] = {f.g, f.g};
    ASSERT_STATUS(dt_optim_step_part(lamb, &f.r[0], st), DT_ERR_UNSUPPORTED);
    dt_optim_free(lamb);
    p.buffer_count = 0;
    ASSERT_STATUS(dt_offload_optim_init(&p, o, f.r, 2, &d), DT_ERR_INVALID_ARG);
    dt_optim_free(o);
    fixture_free(&f);
    ASSERT_EQ_INT(t_count_entries(g_root, false), 0);
}

TEST(bad_paths_are_clear_errors)
{
    dt_nvme_store *s;
    dt_offload_params p = nvme_params(DT_OFFLOAD_IO_AUTO);
    char path[512];
    snprintf(path, sizeof path, "%s/does-not-exist", g_root);
    p.nvme_path = path;
    ASSERT_STATUS(dt_nvme_store_open(&p, &s), DT_ERR_INVALID_ARG); /* bad input: dtrain train exits 2 */
    ASSERT_STR_CONTAINS(dt_last_error(), path);
    /* a file, not a directory */
    snprintf(path, sizeof path, "%s/plainfile", g_root);
    int fd = open(path, O_CREAT | O_WRONLY | O_EXCL, 0600);
    ASSERT(fd >= 0);
    close(fd);
    ASSERT_STATUS(dt_nvme_store_open(&p, &s), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "not a directory");
    unlink(path);
    /* a directory nobody may create in: /proc (root ignores mode bits, so
     * a chmod-ed directory would not do for every user) */
    p.nvme_path = "/proc";
    ASSERT_STATUS(dt_nvme_store_open(&p, &s), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "/proc");
    ASSERT_STR_CONTAINS(dt_last_error(), "writable");
    /* no path at all, or not the nvme device */
    p.nvme_path = NULL;
    ASSERT_STATUS(dt_nvme_store_open(&p, &s), DT_ERR_INVALID_ARG);
    p = nvme_params(DT_OFFLOAD_IO_AUTO);
    p.device = DT_OFFLOAD_CPU;
    ASSERT_STATUS(dt_nvme_store_open(&p, &s), DT_ERR_INVALID_ARG);
    ASSERT_EQ_INT(t_count_entries(g_root, false), 0);
}

/* In a child (the limit must not outlive it): under RLIMIT_FSIZE of 1 MiB,
 * reserving 4 MiB fails at add, naming the file, and a write past the
 * limit into a region made before the limit fails at its wait. */
static int fsize_child(dt_offload_io io)
{
    signal(SIGXFSZ, SIG_IGN); /* EFBIG instead of death by signal */
    dt_nvme_store *s;
    dt_offload_params p = nvme_params(io);
    if (dt_nvme_store_open(&p, &s) < 0)
        return 10;
    int id;
    if (dt_nvme_store_add(s, "early", 2u << 20, &id) < 0)
        return 11;
    struct rlimit rl = {1u << 20, 1u << 20};
    if (setrlimit(RLIMIT_FSIZE, &rl) < 0)
        return 12;
    int id2;
    if (dt_nvme_store_add(s, "big", 4u << 20, &id2) != DT_ERR_IO || !strstr(dt_last_error(), "/big") ||
        !strstr(dt_last_error(), "4194304")) {
        fprintf(stderr, "add under the limit: %s\n", dt_last_error());
        return 13;
    }
    static char buf[65536];
    uint64_t t;
    memset(buf, 1, sizeof buf);
    if (dt_nvme_store_write(s, id, (3u << 19), buf, sizeof buf, &t) < 0)
        return 14;
    dt_status st = dt_nvme_store_wait(s, t);
    if (st != DT_ERR_IO || !strstr(dt_last_error(), "/early") || !strstr(dt_last_error(), "write")) {
        fprintf(stderr, "write past the limit: %s: %s\n", dt_status_name(st), dt_last_error());
        return 15;
    }
    fprintf(stderr, "(%s) %s\n", dt_offload_io_name(io), dt_last_error());
    /* below the limit writes still work */
    if (dt_nvme_store_write(s, id, 0, buf, sizeof buf, &t) < 0 || dt_nvme_store_wait(s, t) < 0)
        return 16;
    dt_nvme_store_close(s);
    return 0;
}

TEST(file_size_limit_is_a_clear_error)
{
    for (size_t e = 0; e < sizeof engines / sizeof engines[0]; e++) {
        dt_nvme_store *s;
        if (!open_engine(engines[e], &s))
            continue;
        dt_nvme_store_close(s);
        fflush(NULL);
        /* a fresh process (exec): glibc's AIO threads do not survive a fork */
        pid_t pid = dt_test_fork();
        ASSERT(pid >= 0);
        if (pid == 0) {
            execl("/proc/self/exe", "test_offload", "--fsize-child", dt_offload_io_name(engines[e]), g_root,
                  (char *)NULL);
            _exit(127);
        }
        int status;
        ASSERT(dt_test_waitpid(pid, &status, 0) == pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            TEST_FAIL_("engine %s: child status %d (exit %d, signal %d)", dt_offload_io_name(engines[e]), status,
                       WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    }
    ASSERT_EQ_INT(t_count_entries(g_root, false), 0);
}

TEST(truncated_file_is_a_clear_error)
{
    dt_nvme_store *s;
    dt_offload_params p = nvme_params(DT_OFFLOAD_IO_AUTO);
    ASSERT_OK(dt_nvme_store_open(&p, &s));
    int id;
    ASSERT_OK(dt_nvme_store_add(s, "t", 65536, &id));
    char path[700];
    snprintf(path, sizeof path, "%s/t", dt_nvme_store_dir(s));
    ASSERT(truncate(path, 1000) == 0); /* someone else shortened it */
    static char buf[65536];
    uint64_t t;
    ASSERT_OK(dt_nvme_store_read(s, id, 0, buf, sizeof buf, &t));
    ASSERT_STATUS(dt_nvme_store_wait(s, t), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "/t");
    ASSERT_STR_CONTAINS(dt_last_error(), "end of file");
    dt_nvme_store_close(s);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--fsize-child")) {
        dt_offload_io io;
        snprintf(g_root, sizeof g_root, "%s", argv[3]);
        return dt_offload_io_parse(argv[2], &io) < 0 ? 9 : fsize_child(io);
    }
    if (!t_mkdtemp("offload", g_root, sizeof g_root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(parse_and_names);
    RUN(store_round_trip_every_engine);
    RUN(optimizer_over_store_equals_in_memory);
    RUN(pipelined_equals_synchronous_every_engine);
    RUN(driver_memory_and_errors);
    RUN(bad_paths_are_clear_errors);
    RUN(file_size_limit_is_a_clear_error);
    RUN(truncated_file_is_a_clear_error);
    rmdir(g_root);
    return TEST_REPORT();
}
