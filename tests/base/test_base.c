/* Base layer: status strings, error messages, arenas, pre-faulting,
 * Philox, hashing. */
#include "dtrain/base.h"
#include "test.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

/* Under AddressSanitizer every access also touches lazily mapped shadow
 * memory, whose faults are counted too: the fault counts are checked in
 * plain builds only. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define COUNTS_FAULTS 0
#else
#define COUNTS_FAULTS 1
#endif

static long minor_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* Pages of [p, p + len) resident (mincore). */
static size_t resident_pages(void *p, size_t len)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg, r = 0;
    unsigned char *v = malloc(n);
    if (!v || mincore(p, len, v) != 0) {
        free(v);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        r += v[i] & 1;
    free(v);
    return r;
}

/* dt_prefault commits a fresh mapping's pages and keeps what they hold; the
 * writes after it take no page fault. */
TEST(prefault_commits_pages)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = 256 * pg;
    unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT(m != MAP_FAILED);
#ifdef MADV_NOHUGEPAGE
    madvise(m, len, MADV_NOHUGEPAGE); /* count 4 KiB pages */
#endif
    m[5 * pg + 7] = 42;
    ASSERT(resident_pages(m, len) <= 2);
    ASSERT_EQ_INT((long long)dt_prefault(m, len), (long long)len);
    ASSERT_EQ_INT((long long)resident_pages(m, len), 256);
    ASSERT_EQ_INT(m[5 * pg + 7], 42);
    ASSERT_EQ_INT(m[9 * pg], 0);
    long f0 = minor_faults();
    memset(m, 1, len);
    if (COUNTS_FAULTS)
        ASSERT_EQ_INT(minor_faults() - f0, 0);
    /* only whole pages inside the range; empty ranges */
    ASSERT_EQ_INT((long long)dt_prefault(m + 1, pg), 0);
    ASSERT_EQ_INT((long long)dt_prefault(m + 1, 2 * pg), (long long)pg);
    ASSERT_EQ_INT((long long)dt_prefault(NULL, pg), 0);
    ASSERT_EQ_INT((long long)dt_prefault(m, 0), 0);
    munmap(m, len);
}

/* dt_decommit zeroes a range: its whole pages given back (not resident,
 * reading zero), the partial pages at its ends written with zeros, the
 * bytes around it untouched; also on dt_alloc memory. */
TEST(decommit_zeroes_and_gives_back)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = 64 * pg;
    unsigned char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT(m != MAP_FAILED);
#ifdef MADV_NOHUGEPAGE
    madvise(m, len, MADV_NOHUGEPAGE);
#endif
    memset(m, 7, len);
    ASSERT_EQ_INT((long long)resident_pages(m, len), 64);
    /* from the middle of page 3 to the middle of page 40: pages 4..39 go back */
    ASSERT_EQ_INT((long long)dt_decommit(m + 3 * pg + 100, 37 * pg), (long long)(36 * pg));
    ASSERT_EQ_INT((long long)resident_pages(m + 4 * pg, 36 * pg), 0);
    ASSERT_EQ_INT((long long)resident_pages(m, len), 64 - 36);
    for (size_t i = 3 * pg + 100; i < 40 * pg + 100; i += 61)
        ASSERT_EQ_INT(m[i], 0);
    ASSERT_EQ_INT(m[40 * pg + 99], 0);
    ASSERT_EQ_INT(m[3 * pg + 99], 7);
    ASSERT_EQ_INT(m[40 * pg + 100], 7);
    /* less than a page: written, nothing given back; empty and NULL */
    ASSERT_EQ_INT((long long)dt_decommit(m + 50 * pg + 10, 100), 0);
    ASSERT_EQ_INT(m[50 * pg + 10], 0);
    ASSERT_EQ_INT(m[50 * pg + 109], 0);
    ASSERT_EQ_INT(m[50 * pg + 110], 7);
    ASSERT_EQ_INT((long long)dt_decommit(NULL, pg), 0);
    ASSERT_EQ_INT((long long)dt_decommit(m, 0), 0);
    munmap(m, len);
    unsigned char *h = dt_alloc(16 * pg);
    ASSERT(h);
    memset(h, 9, 16 * pg);
    dt_decommit(h, 16 * pg);
    for (size_t i = 0; i < 16 * pg; i += 97)
        ASSERT_EQ_INT(h[i], 0);
    dt_free(h);
}

/* A "step" that spills over several blocks: after the reset that coalesces
 * them, the next step (the same allocations, every byte written) takes no
 * page fault. */
TEST(arena_second_step_takes_no_fault)
{
    dt_arena *a = dt_arena_init(1 << 20);
    ASSERT(a);
    for (int step = 0; step < 3; step++) {
        long f0 = minor_faults();
        for (int i = 0; i < 12; i++) {
            unsigned char *p = dt_arena_alloc(a, (size_t)3 << 20);
            ASSERT(p);
            memset(p, step + 1, (size_t)3 << 20);
        }
        long faults = minor_faults() - f0;
        if (step > 0 && COUNTS_FAULTS)
            ASSERT_EQ_INT(faults, 0);
        dt_arena_reset(a);
    }
    ASSERT(dt_arena_peak(a) >= (size_t)36 << 20);
    dt_arena_free(a);
}

TEST(status_strings)
{
    ASSERT_STR_EQ(dt_status_name(DT_ERR_TIMEOUT), "DT_ERR_TIMEOUT");
    ASSERT_STR_EQ(dt_status_str(DT_OK), "ok");
    ASSERT_STR_EQ(dt_status_name((dt_status)12345), "DT_UNKNOWN_STATUS");
}

TEST(error_messages)
{
    dt_error_clear();
    ASSERT_STR_EQ(dt_last_error(), "");
    ASSERT_EQ_INT(dt_error(DT_ERR_SHAPE, "tensor '%s': bad", "fc.weight"), DT_ERR_SHAPE);
    ASSERT_STR_EQ(dt_last_error(), "tensor 'fc.weight': bad");
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    dt_error_wrap(DT_ERR_SHAPE, "loading %s", "ckpt");
    ASSERT_STR_EQ(dt_last_error(), "loading ckpt: tensor 'fc.weight': bad");
}

TEST(arena_alignment_and_reuse)
{
    dt_arena *a = dt_arena_init(1024);
    ASSERT(a);
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < 10; i++) {
            unsigned char *p = dt_arena_alloc(a, 300 + (size_t)i);
            ASSERT(p);
            ASSERT_EQ_INT((uintptr_t)p % DT_ALIGN, 0);
            memset(p, 0xab, 300 + (size_t)i);
        }
        ASSERT(dt_arena_used(a) >= 3000);
        dt_arena_reset(a);
        ASSERT_EQ_INT(dt_arena_used(a), 0);
    }
    ASSERT(dt_arena_peak(a) >= 3000);
    dt_arena_free(a);
    dt_arena_free(NULL);
}

TEST(philox_known_answer)
{
    /* Known-answer vectors from the Random123 distribution (kat_vectors,
     * philox4x32_10): zero key/counter and all-ones key/counter. */
    uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0}, o[4];
    dt_philox4x32(c0, k0, o);
    ASSERT_EQ_U64(o[0], 0x6627e8d5u);
    ASSERT_EQ_U64(o[1], 0xe169c58du);
    ASSERT_EQ_U64(o[2], 0xbc57ac4cu);
    ASSERT_EQ_U64(o[3], 0x9b00dbd8u);
    uint32_t c1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    uint32_t k1[2] = {0xffffffffu, 0xffffffffu};
    dt_philox4x32(c1, k1, o);
    ASSERT_EQ_U64(o[0], 0x408f276du);
    ASSERT_EQ_U64(o[1], 0x41c83b0eu);
    ASSERT_EQ_U64(o[2], 0xa20bc7c6u);
    ASSERT_EQ_U64(o[3], 0x6d5451fdu);
}

TEST(rng_streams_are_pure)
{
    dt_rng_key k = dt_rng_key_make(42, DT_RNG_DROPOUT, 1, 7);
    float a[37], b[37];
    dt_rng_fill_uniform(k, 0, a, 37, 0.f, 1.f);
    /* Any sub-range gives the same elements. */
    dt_rng_fill_uniform(k, 5, b, 32, 0.f, 1.f);
    ASSERT(memcmp(a + 5, b, 32 * sizeof(float)) == 0);
    for (int i = 0; i < 37; i++) {
        ASSERT(a[i] >= 0.f && a[i] < 1.f);
        float u = dt_rng_uniform(k, (uint64_t)i);
        ASSERT(memcmp(&a[i], &u, sizeof u) == 0);
    }
    dt_rng_key k2 = dt_rng_key_make(42, DT_RNG_DROPOUT, 1, 8);
    ASSERT(dt_rng_uniform(k2, 0) != a[0] || dt_rng_uniform(k2, 1) != a[1]);
}

TEST(rng_normal_moments)
{
    enum { N = 200000 };
    static float x[N];
    dt_rng_fill_normal(dt_rng_key_make(1, DT_RNG_INIT, 0, 0), 0, x, N, 2.0f, 3.0f);
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) s += x[i];
    double m = s / N;
    for (int i = 0; i < N; i++) s2 += (x[i] - m) * (x[i] - m);
    ASSERT_NEAR(m, 2.0, 0.03, 0);
    ASSERT_NEAR(sqrt(s2 / N), 3.0, 0.03, 0);
}

TEST(permutation)
{
    int64_t p[1000];
    int seen[1000] = {0};
    ASSERT_OK(dt_rng_permutation(dt_rng_key_make(3, DT_RNG_SHUFFLE, 0, 0), p, 1000));
    int moved = 0;
    for (int i = 0; i < 1000; i++) {
        ASSERT(p[i] >= 0 && p[i] < 1000);
        seen[p[i]]++;
        moved += p[i] != i;
    }
    for (int i = 0; i < 1000; i++)
        ASSERT_EQ_INT(seen[i], 1);
    ASSERT(moved > 900);
    ASSERT_STATUS(dt_rng_permutation(dt_rng_key_make(0, 0, 0, 0), NULL, 5), DT_ERR_INVALID_ARG);
}

TEST(hash)
{
    ASSERT_EQ_U64(dt_hash64("", 0, 0), 0xcbf29ce484222325ull);
    ASSERT_EQ_U64(dt_hash64("a", 1, 0), 0xaf63dc4c8601ec8cull);
}

int main(void)
{
    RUN(status_strings);
    RUN(error_messages);
    RUN(arena_alignment_and_reuse);
    RUN(prefault_commits_pages);
    RUN(decommit_zeroes_and_gives_back);
    RUN(arena_second_step_takes_no_fault);
    RUN(philox_known_answer);
    RUN(rng_streams_are_pure);
    RUN(rng_normal_moments);
    RUN(permutation);
    RUN(hash);
    return TEST_REPORT();
}
