/* A small /dev/shm (Docker's default is 64 MB) is an error that names
 * /dev/shm and the sizes, at start or from dt_pg_alloc, never a SIGBUS when
 * a sparse page is first touched. Runs the shm backend in a private mount
 * namespace with a tiny tmpfs on /dev/shm; skipped (exit 77) where mount
 * namespaces are not available (no CAP_SYS_ADMIN). */
// dt-test-timeout: 120
// dt-test-labels: idle
#include "harness.h"
#include "test.h"

#include <errno.h>
#include <sched.h>
#include <sys/mount.h>

/* Staging of 8 MiB per rank does not fit 4 MiB: dt_pg_init fails. */
static int body_init_fails(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg = NULL;
    dt_status st = th_pg(rank, size, NULL, &pg);
    if (rank == 0) { /* rank 0 creates and reserves; the others time out or see it gone */
        TH_CHECK(st == DT_ERR_NO_MEMORY, "got %s: %s", dt_status_name(st), dt_last_error());
        TH_CHECK(strstr(dt_last_error(), "/dev/shm") && strstr(dt_last_error(), "MiB are free") &&
                     strstr(dt_last_error(), "--shm-size"),
                 "message: %s", dt_last_error());
    } else {
        TH_CHECK(st < 0, "rank %d joined a group that could not be created", rank);
    }
    dt_pg_free(pg);
    return 0;
}

/* Small staging fits; a dt_pg_alloc beyond what is free fails with the
 * message, a small one works and is usable. */
static int body_alloc_fails(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    float *big = dt_pg_alloc(pg, 64u << 20);
    TH_CHECK(big == NULL, "a 64 MiB arena buffer in an 8 MiB /dev/shm");
    TH_CHECK(strstr(dt_last_error(), "/dev/shm") && strstr(dt_last_error(), "dt_pg_alloc"),
             "message: %s", dt_last_error());
    float *x = dt_pg_alloc(pg, 4096 * sizeof(float));
    TH_CHECK(x != NULL, "small alloc: %s", dt_last_error());
    for (int i = 0; i < 4096; i++)
        x[i] = (float)(rank + 1);
    TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, x, 4096, DT_F32, DT_REDUCE_SUM));
    TH_CHECK(x[4095] == (float)(size * (size + 1) / 2), "sum %g", (double)x[4095]);
    dt_pg_dealloc(pg, x);
    dt_pg_free(pg);
    return 0;
}

/* In a child: a private mount namespace with a tmpfs of `size` on /dev/shm. */
static int in_small_shm(const char *size, th_fn fn, const char *staging_kb)
{
    pid_t pid = dt_test_fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        /* private propagation, so the tmpfs below stays in this namespace; in
         * a chroot "/" is not a mount point (EINVAL): then the mount the
         * tmpfs goes over is enough */
        if (unshare(CLONE_NEWNS) != 0 || (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 &&
                                          mount(NULL, "/dev/shm", NULL, MS_REC | MS_PRIVATE, NULL) != 0 &&
                                          mount(NULL, "/dev", NULL, MS_REC | MS_PRIVATE, NULL) != 0)) {
            fprintf(stderr, "skip: no private mount namespace here (%s)\n", strerror(errno));
            _exit(DT_TEST_SKIP_CODE);
        }
        char opts[64];
        snprintf(opts, sizeof opts, "size=%s,mode=1777", size);
        if (mount("tmpfs", "/dev/shm", "tmpfs", 0, opts) != 0) {
            fprintf(stderr, "skip: cannot mount a tmpfs on /dev/shm (%s)\n", strerror(errno));
            _exit(DT_TEST_SKIP_CODE);
        }
        setenv("DT_COMM_TIMEOUT", "5", 1);
        if (staging_kb)
            setenv("DT_SHM_STAGING_KB", staging_kb, 1);
        _exit(th_run(2, 30.0, fn, NULL, NULL) == 0 ? 0 : 1);
    }
    int status = 0;
    dt_test_waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(small_dev_shm)
{
    int rc = in_small_shm("4m", body_init_fails, NULL);
    if (rc == DT_TEST_SKIP_CODE)
        DT_TEST_SKIP("mount namespaces unavailable (needs CAP_SYS_ADMIN)");
    ASSERT_EQ_INT(rc, 0);
    ASSERT_EQ_INT(in_small_shm("8m", body_alloc_fails, "64"), 0);
}

int main(void)
{
    RUN(small_dev_shm);
    return TEST_REPORT();
}
