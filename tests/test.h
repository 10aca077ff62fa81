/* tests/test.h — a tiny test harness: typed asserts that print both sides.
 *
 *     TEST(arena_basics) { ... ASSERT_EQ_INT(a, b); ... }
 *     int main(void) { RUN(arena_basics); return TEST_REPORT(); }
 *
 * A failed assert prints file:line, the expression and both values, marks
 * the current test failed and returns from it. TEST_REPORT() prints
 * "N passed, N failed, N skipped" and returns the exit code.
 *
 * A test that cannot run here (no data set, no MPI, no namespaces) says so
 * and is reported as skipped, never as passed:
 *
 *     TEST(real_data) { if (!have_data()) DT_TEST_SKIP("%s not installed", dir); ... }
 *
 * DT_TEST_SKIP prints "skip: <reason>" and returns from the test. When any
 * test of the program skipped and none failed, TEST_REPORT() returns
 * DT_TEST_SKIP_CODE (77), which CTest counts as "Skipped" (SKIP_RETURN_CODE,
 * set for every test by the root CMakeLists.txt); a failure still wins. A
 * whole program that cannot run returns DT_TEST_SKIP_CODE from main after
 * printing why (DT_TEST_SKIP_ALL).
 *
 * Processes: fork, forkpty, kill and waitpid only through the checked
 * wrappers of tests/proc.h (dt_test_fork, dt_test_kill, ...), which refuse
 * a pid <= 0; a test whose fork failed and that then fails is reported
 * skipped ("could not fork"). */
#ifndef DT_TEST_H
#define DT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"

/* The exit code CTest reads as "skipped" (SKIP_RETURN_CODE). */
#define DT_TEST_SKIP_CODE 77

/* A sanitizer build (make test's ASan+UBSan and ThreadSanitizer passes)
 * runs dtrain 5-40x slower than the release build. A test whose size is
 * there for the numbers (many training steps for a drift to show, every
 * element of a large buffer compared) and not to reach more code runs a
 * smaller size there: dt_test_reduced() is true under AddressSanitizer or
 * ThreadSanitizer unless DT_TEST_FULL=1 is set. The release pass (and the
 * fresh-root check) runs the full size; the sanitizer pass the same code
 * paths, fewer times. A test that reduces says so on stderr. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DT_TEST_SANITIZED 1
#else
#define DT_TEST_SANITIZED 0
#endif
static inline int dt_test_reduced(void)
{
    const char *f = getenv("DT_TEST_FULL");
    return DT_TEST_SANITIZED && !(f && !strcmp(f, "1"));
}

static int dt_test_failed_, dt_test_skipped_;
static int dt_test_npass_, dt_test_nfail_, dt_test_nskip_;

#define TEST(name) static void test_##name(void)

#define RUN(name)                                                           \
    do {                                                                    \
        dt_test_failed_ = 0;                                                \
        dt_test_skipped_ = 0;                                               \
        dt_test_cannot_fork_ = 0;                                           \
        test_##name();                                                      \
        if (dt_test_failed_ && dt_test_cannot_fork_) {                      \
            dt_test_nskip_++;                                               \
            fprintf(stderr, "SKIP %s (could not fork)\n", #name);           \
        } else if (dt_test_failed_) {                                              \
            dt_test_nfail_++;                                               \
            fprintf(stderr, "FAIL %s\n", #name);                            \
        } else if (dt_test_skipped_) {                                      \
            dt_test_nskip_++;                                               \
            fprintf(stderr, "SKIP %s\n", #name);                            \
        } else {                                                            \
            dt_test_npass_++;                                               \
            fprintf(stderr, "ok   %s\n", #name);                            \
        }                                                                   \
    } while (0)

#define TEST_REPORT()                                                       \
    (printf("%d passed, %d failed, %d skipped\n", dt_test_npass_,           \
            dt_test_nfail_, dt_test_nskip_),                                \
     dt_test_nfail_ ? 1 : dt_test_nskip_ ? DT_TEST_SKIP_CODE : 0)

/* Inside a TEST: this test cannot run here; say why and return. */
#define DT_TEST_SKIP(...)                                                   \
    do {                                                                    \
        fprintf(stderr, "skip: ");                                          \
        fprintf(stderr, __VA_ARGS__);                                       \
        fprintf(stderr, "\n");                                              \
        dt_test_skipped_ = 1;                                               \
        return;                                                             \
    } while (0)

/* `make test` installs what its tests need (scripts/deps.sh test) and lists
 * it in DT_TEST_REQUIRE (words: numpy gnuplot mpi fashion-mnist bible
 * iproute2). A test that lacks such a thing fails instead of skipping:
 *
 *     if (!have_numpy()) DT_TEST_SKIP_NEED("numpy", "/usr/bin/python3 has no numpy");
 *
 * Outside `make test` (a bare ctest, a machine without the packages) it is
 * an ordinary skip. */
static inline int dt_test_required(const char *what)
{
    const char *r = getenv("DT_TEST_REQUIRE");
    size_t n = strlen(what);
    for (const char *p = r ? strstr(r, what) : NULL; p; p = strstr(p + 1, what))
        if ((p == r || p[-1] == ' ' || p[-1] == ',') && (p[n] == 0 || p[n] == ' ' || p[n] == ','))
            return 1;
    return 0;
}

#define DT_TEST_SKIP_NEED(what, ...)                                        \
    do {                                                                    \
        if (dt_test_required(what)) {                                       \
            fprintf(stderr, "%s:%d: make test installed %s "                \
                    "(DT_TEST_REQUIRE), yet: ", __FILE__, __LINE__, what);  \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            dt_test_failed_ = 1;                                            \
            return;                                                         \
        }                                                                   \
        DT_TEST_SKIP(__VA_ARGS__);                                          \
    } while (0)

/* The same for a whole program, in main before any RUN. */
#define DT_TEST_SKIP_ALL_NEED(what, ...)                                    \
    do {                                                                    \
        if (dt_test_required(what)) {                                       \
            fprintf(stderr, "make test installed %s (DT_TEST_REQUIRE), "    \
                    "yet: ", what);                                         \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            printf("0 passed, 1 failed\n");                                 \
            return 1;                                                       \
        }                                                                   \
        DT_TEST_SKIP_ALL(__VA_ARGS__);                                      \
    } while (0)

/* In main, before any RUN: the whole program cannot run here. */
#define DT_TEST_SKIP_ALL(...)                                               \
    do {                                                                    \
        fprintf(stderr, "skip: ");                                          \
        fprintf(stderr, __VA_ARGS__);                                       \
        fprintf(stderr, "\n");                                              \
        printf("0 passed, 0 failed, all skipped\n");                        \
        return DT_TEST_SKIP_CODE;                                           \
    } while (0)

#define TEST_FAIL_(...)                                                     \
    do {                                                                    \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                     \
        fprintf(stderr, __VA_ARGS__);                                       \
        fprintf(stderr, "\n");                                              \
        dt_test_failed_ = 1;                                                \
        return;                                                             \
    } while (0)

#define ASSERT(c)                                                           \
    do { if (!(c)) TEST_FAIL_("assertion failed: %s", #c); } while (0)

#define ASSERT_EQ_INT(a, b)                                                 \
    do {                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                 \
        if (a_ != b_)                                                       \
            TEST_FAIL_("%s == %s: %lld != %lld", #a, #b, a_, b_);           \
    } while (0)

#define ASSERT_NE_INT(a, b)                                                 \
    do {                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                 \
        if (a_ == b_)                                                       \
            TEST_FAIL_("%s != %s: both %lld", #a, #b, a_);                  \
    } while (0)

#define ASSERT_EQ_U64(a, b)                                                 \
    do {                                                                    \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b); \
        if (a_ != b_)                                                       \
            TEST_FAIL_("%s == %s: %llu != %llu", #a, #b, a_, b_);           \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define ASSERT_NEAR(a, b, atol, rtol)                                       \
    do {                                                                    \
        double a_ = (double)(a), b_ = (double)(b);                          \
        if (!(fabs(a_ - b_) <= (atol) + (rtol) * fabs(b_)))                 \
            TEST_FAIL_("%s ~= %s: %.9g vs %.9g (diff %.3g)", #a, #b, a_,    \
                       b_, a_ - b_);                                        \
    } while (0)

#define ASSERT_STR_EQ(a, b)                                                 \
    do {                                                                    \
        const char *a_ = (a), *b_ = (b);                                    \
        if (!a_ || !b_ || strcmp(a_, b_))                                   \
            TEST_FAIL_("%s == %s: \"%s\" != \"%s\"", #a, #b,                \
                       a_ ? a_ : "(null)", b_ ? b_ : "(null)");             \
    } while (0)

#define ASSERT_STR_CONTAINS(hay, needle)                                    \
    do {                                                                    \
        const char *h_ = (hay), *n_ = (needle);                             \
        if (!h_ || !strstr(h_, n_))                                         \
            TEST_FAIL_("%s contains \"%s\": got \"%s\"", #hay, n_,          \
                       h_ ? h_ : "(null)");                                 \
    } while (0)

/* Status checks: ASSERT_OK(dt_call(...)) prints the error message. */
#define ASSERT_OK(expr)                                                     \
    do {                                                                    \
        int st_ = (int)(expr);                                              \
        if (st_ < 0)                                                        \
            TEST_FAIL_("%s failed: %s: %s", #expr,                          \
                       dt_status_name((dt_status)st_), dt_last_error());    \
    } while (0)

#define ASSERT_STATUS(expr, want)                                           \
    do {                                                                    \
        int st_ = (int)(expr);                                              \
        if (st_ != (int)(want))                                             \
            TEST_FAIL_("%s: got %s, want %s (%s)", #expr,                   \
                       dt_status_name((dt_status)st_),                      \
                       dt_status_name((dt_status)(want)), dt_last_error()); \
    } while (0)

#endif /* DT_TEST_H */
