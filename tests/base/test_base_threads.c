/* Process-wide settings of the base layer read and written from several
 * threads at once. A progress thread, a loader thread or a user's thread
 * may log or ask for the compute-thread count while the main thread changes
 * them. Every value read must be one that was written; under
 * ThreadSanitizer (make test-tsan) the accesses must not race. */
// dt-test-labels: threads
#include "dtrain/base.h"
#include "test.h"

#include <pthread.h>
#include <stdatomic.h>

#define ROUNDS 20000

static atomic_int g_stop, g_bad;

/* Run reader on two threads while writer(r) runs ROUNDS times here. */
static int race(void *(*reader)(void *), void (*writer)(int r))
{
    pthread_t th[2];
    atomic_store(&g_stop, 0);
    atomic_store(&g_bad, 0);
    for (int i = 0; i < 2; i++)
        if (pthread_create(&th[i], NULL, reader, NULL) != 0)
            return -1;
    for (int r = 0; r < ROUNDS; r++)
        writer(r);
    atomic_store(&g_stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    return atomic_load(&g_bad);
}

static void *read_log_level(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stop)) {
        dt_log_level l = dt_log_get_level();
        if (l != DT_LOG_ERROR && l != DT_LOG_WARN)
            atomic_store(&g_bad, 1);
        dt_log(DT_LOG_DEBUG, "not printed at level %d", (int)l);
    }
    return NULL;
}

static void write_log_level(int r) { dt_log_set_level(r & 1 ? DT_LOG_ERROR : DT_LOG_WARN); }

/* log.c's level was a plain int: TSan reported dt_log_set_level racing
 * with dt_log_get_level on another thread. */
TEST(log_level_across_threads)
{
    dt_log_set_level(DT_LOG_WARN);
    ASSERT_EQ_INT(race(read_log_level, write_log_level), 0);
    dt_log_set_level(DT_LOG_WARN);
}

static void *read_num_threads(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stop)) {
        int n = dt_get_num_threads();
        if (n != 2 && n != 3)
            atomic_store(&g_bad, 1);
    }
    return NULL;
}

static void write_num_threads(int r) { dt_set_num_threads(r & 1 ? 3 : 2); }

/* threads.c's count was a plain int: TSan reported dt_set_num_threads
 * racing with dt_get_num_threads on another thread. */
TEST(num_threads_across_threads)
{
    dt_set_num_threads(2);
    ASSERT_EQ_INT(race(read_num_threads, write_num_threads), 0);
    dt_set_num_threads(0);
}

int main(void)
{
    RUN(log_level_across_threads);
    RUN(num_threads_across_threads);
    return TEST_REPORT();
}
