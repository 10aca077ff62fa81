/* The launcher's cleanup calls go through the backends' job_cleanup and
 * orphan_cleanup slots (dt_backend_ops): a registered backend's slots are
 * called with the arguments, their counts add up, an error stops the walk,
 * and the shm backend's slot removes a job's leftover segment. */
// dt-test-timeout: 60
#include "dtrain/comm.h"
#include "test.h"

#include "comm/shm/shm.h" /* white box: the segment name of a job */

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

static char g_job[64];
static int g_job_calls, g_orphan_calls;
static dt_status g_fail;

static dt_status sweep_init(const dt_backend_info *info, void **ctx)
{
    (void)info;
    *ctx = NULL;
    return dt_error(DT_ERR_UNSUPPORTED, "sweep: not a real backend");
}
static void sweep_free(void *ctx) { (void)ctx; }
static dt_status sweep_run(void *ctx, const dt_coll *c)
{
    (void)ctx, (void)c;
    return DT_OK;
}
static dt_status sweep_job(const char *job_id, int *removed)
{
    g_job_calls++;
    snprintf(g_job, sizeof g_job, "%s", job_id);
    if (g_fail < 0)
        return dt_error(g_fail, "sweep: cannot clean job %s", job_id);
    *removed = 2;
    return DT_OK;
}
static dt_status sweep_orphan(int *removed)
{
    g_orphan_calls++;
    if (g_fail < 0)
        return dt_error(g_fail, "sweep: cannot clean orphans");
    *removed = 3;
    return DT_OK;
}
static const dt_backend_ops k_sweep = {
    .version = DT_BACKEND_VERSION, .name = "sweep", .init = sweep_init, .free = sweep_free, .run = sweep_run,
    .job_cleanup = sweep_job, .orphan_cleanup = sweep_orphan,
};

TEST(slots_are_called)
{
    ASSERT_OK(dt_backend_register(&k_sweep));
    int removed = -1;
    g_fail = DT_OK;
    ASSERT_OK(dt_pg_job_cleanup("cleanup-test-no-such-job", &removed));
    ASSERT_EQ_INT(g_job_calls, 1);
    ASSERT_STR_EQ(g_job, "cleanup-test-no-such-job");
    ASSERT_EQ_INT(removed, 2); /* shm: no such segment, 0 */
    removed = -1;
    ASSERT_OK(dt_pg_orphan_cleanup(&removed));
    ASSERT_EQ_INT(g_orphan_calls, 1);
    ASSERT(removed >= 3); /* shm may find real orphans of crashed jobs */
    /* an error stops the walk and comes back */
    g_fail = DT_ERR_IO;
    ASSERT_STATUS(dt_pg_job_cleanup("cleanup-test-other", &removed), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "cleanup-test-other");
    ASSERT_STATUS(dt_pg_orphan_cleanup(&removed), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "sweep: cannot clean orphans");
    g_fail = DT_OK;
    /* the arguments are checked before any backend is asked */
    int calls = g_job_calls;
    ASSERT_STATUS(dt_pg_job_cleanup(NULL, &removed), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_pg_job_cleanup("x", NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_pg_orphan_cleanup(NULL), DT_ERR_INVALID_ARG);
    ASSERT_EQ_INT(g_job_calls, calls);
}

TEST(shm_slot_removes_the_segment)
{
    char job[64], seg[64];
    snprintf(job, sizeof job, "cleanup-test-%ld", (long)getpid());
    dt__shm_segment_name(job, seg, sizeof seg);
    int fd = shm_open(seg, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        DT_TEST_SKIP("shm_open %s: %s", seg, strerror(errno));
    close(fd);
    g_fail = DT_OK;
    dt_backend_register(&k_sweep);
    int removed = -1;
    ASSERT_OK(dt_pg_job_cleanup(job, &removed));
    ASSERT_EQ_INT(removed, 1 + 2); /* shm's segment and the sweep backend's 2 */
    fd = shm_open(seg, O_RDONLY, 0);
    if (fd >= 0) {
        close(fd);
        shm_unlink(seg);
    }
    ASSERT(fd < 0);
}

int main(void)
{
    RUN(slots_are_called);
    RUN(shm_slot_removes_the_segment);
    return TEST_REPORT();
}
