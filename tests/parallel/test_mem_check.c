/* Model-state memory (offload.h): the ZeRO formula per stage (the paper's
 * 7.5e9-parameter, 64-rank table exactly; dtrain's f32 terms), the up-front
 * check against RLIMIT_AS and MemAvailable, and `dtrain train` failing at
 * start, exit 1, with the bytes it needs when the model state cannot fit
 * (a 134M-parameter AdamW MLP under a 2 GiB RLIMIT_AS; it would need 2 GiB
 * for its model state alone), instead of dying later. */
// dt-test-timeout: 60
#include "dtrain/dtrain.h"
#include "test.h"

#include <stdint.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static dt_mem_estimate est(size_t psi, int world, int stage, dt_optim_kind k, int b, bool master)
{
    dt_mem_policy p = {.numel = psi, .world = world, .zero_stage = stage, .optimizer = k, .param_bytes = b,
                       .master_weights = master};
    dt_mem_estimate e;
    memset(&e, 0, sizeof e);
    if (dt_mem_model_states(&p, &e) < 0)
        e.total = -1;
    return e;
}

TEST(zero_formula)
{
    /* SEMANTICS 1.7: psi = 7.5e9, N = 64, mixed-precision Adam (2 + 2 + 12) */
    const size_t psi = 7500000000u;
    const double per = 7500000000.0 / 64; /* 117187500, exact */
    ASSERT_NEAR(est(psi, 64, 0, DT_OPTIM_ADAM, 2, true).total, 16.0 * 7.5e9, 0, 0);          /* 120 GB */
    ASSERT_NEAR(est(psi, 64, 1, DT_OPTIM_ADAM, 2, true).total, 4 * 7.5e9 + 12 * per, 0, 0);  /* 31.4 GB */
    ASSERT_NEAR(est(psi, 64, 2, DT_OPTIM_ADAM, 2, true).total, 2 * 7.5e9 + 14 * per, 0, 0);  /* 16.6 GB */
    ASSERT_NEAR(est(psi, 64, 3, DT_OPTIM_ADAM, 2, true).total, 16 * per, 0, 0);              /* 1.9 GB */
    /* dtrain today: f32 parameters and gradients, AdamW: 4 + 4 + 8 */
    dt_mem_estimate e = est(1000000000u, 2, 0, DT_OPTIM_ADAMW, 4, false);
    ASSERT_NEAR(e.params, 4e9, 0, 0);
    ASSERT_NEAR(e.grads, 4e9, 0, 0);
    ASSERT_NEAR(e.optim, 8e9, 0, 0);
    ASSERT_NEAR(e.master, 0, 0, 0);
    ASSERT_NEAR(e.total, 16e9, 0, 0);
    /* uneven shards round up: 10 elements over 3 ranks -> 4 each */
    ASSERT_NEAR(est(10, 3, 3, DT_OPTIM_ADAMW, 4, false).total, 16 * 4, 0, 0);
    ASSERT_NEAR(est(10, 3, 1, DT_OPTIM_SGD, 4, false).total, 80, 0, 0); /* plain SGD: no state */
    dt_mem_policy p = {.numel = 10, .world = 3, .zero_stage = 1, .optimizer = DT_OPTIM_SGD, .sgd_momentum = true,
                       .param_bytes = 4};
    ASSERT_OK(dt_mem_model_states(&p, &e));
    ASSERT_NEAR(e.total, 80 + 16, 0, 0);
    /* NVMe offload: only the driver's buffers stay */
    p = (dt_mem_policy){.numel = 1000000, .world = 1, .optimizer = DT_OPTIM_ADAMW, .param_bytes = 4,
                        .offload = DT_OFFLOAD_NVME, .offload_buffer_bytes = 4096};
    ASSERT_OK(dt_mem_model_states(&p, &e));
    ASSERT_NEAR(e.optim, 4096, 0, 0);
    ASSERT_NEAR(e.total, 8e6 + 4096, 0, 0);
    p.zero_stage = 4;
    ASSERT_STATUS(dt_mem_model_states(&p, &e), DT_ERR_INVALID_ARG);
    p.zero_stage = 0;
    p.world = 0;
    ASSERT_STATUS(dt_mem_model_states(&p, &e), DT_ERR_INVALID_ARG);
}

TEST(check_against_mem_available)
{
    size_t ma, al;
    ASSERT_OK(dt_mem_available(&ma, &al));
    ASSERT(ma > 0 && ma != SIZE_MAX); /* Linux has MemAvailable */
    ASSERT_OK(dt_mem_check("small", 1e6, 2));
    ASSERT_STATUS(dt_mem_check("DDP on 2 ranks: huge", (double)ma, 2), DT_ERR_NO_MEMORY);
    ASSERT_STR_CONTAINS(dt_last_error(), "DDP on 2 ranks: huge");
    ASSERT_STR_CONTAINS(dt_last_error(), "MemAvailable");
    ASSERT_STR_CONTAINS(dt_last_error(), "2 ranks on this machine");
    char need[64];
    snprintf(need, sizeof need, "needs %.0f bytes", (double)ma);
    ASSERT_STR_CONTAINS(dt_last_error(), need);
}

/* In a child: RLIMIT_AS = what is mapped now + 256 MiB. */
static int rlimit_child(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (!f || fscanf(f, "%llu", &pages) != 1)
        return 10;
    fclose(f);
    rlim_t lim = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)256 << 20);
    struct rlimit rl = {lim, lim};
    if (setrlimit(RLIMIT_AS, &rl) < 0)
        return 11;
    size_t ma, al;
    dt_mem_available(&ma, &al);
    if (al > ((size_t)256 << 20) || al < ((size_t)200 << 20)) {
        fprintf(stderr, "address space left %zu, expected about 256 MiB\n", al);
        return 12;
    }
    if (dt_mem_check("small", 64e6, 1) < 0)
        return 13;
    if (dt_mem_check("big", 1e9, 1) != DT_ERR_NO_MEMORY || !strstr(dt_last_error(), "needs 1000000000 bytes") ||
        !strstr(dt_last_error(), "RLIMIT_AS") || !strstr(dt_last_error(), "big")) {
        fprintf(stderr, "got: %s\n", dt_last_error());
        return 14;
    }
    return 0;
}

TEST(check_against_rlimit_as)
{
    fflush(NULL);
    pid_t pid = dt_test_fork();
    ASSERT(pid >= 0);
    if (pid == 0)
        _exit(rlimit_child());
    int status;
    ASSERT(dt_test_waitpid(pid, &status, 0) == pid);
    ASSERT(WIFEXITED(status));
    ASSERT_EQ_INT(WEXITSTATUS(status), 0);
}

TEST(cli_fails_at_start_naming_the_bytes)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    DT_TEST_SKIP("RLIMIT_AS cannot be combined with a sanitizer's shadow memory");
#endif
    const char *cli = getenv("DT_CLI");
    if (!cli || access(cli, X_OK) != 0)
        DT_TEST_SKIP("DT_CLI (the dtrain program) not set");
    int pe[2];
    ASSERT(pipe(pe) == 0);
    double t0 = dt_time_s();
    fflush(NULL);
    pid_t pid = dt_test_fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {(rlim_t)2 << 30, (rlim_t)2 << 30};
        setrlimit(RLIMIT_AS, &rl);
        dup2(pe[1], 2);
        close(pe[0]);
        execl(cli, cli, "train", "--model", "mlp", "--mlp-dim", "4096", "--mlp-hidden", "16384", "--optimizer",
              "adamw", "--progress", "none", (char *)NULL);
        _exit(127);
    }
    close(pe[1]);
    char err[4096];
    size_t got = 0;
    ssize_t k;
    while (got < sizeof err - 1 && (k = read(pe[0], err + got, sizeof err - 1 - got)) > 0)
        got += (size_t)k;
    err[got] = '\0';
    close(pe[0]);
    int status;
    ASSERT(dt_test_waitpid(pid, &status, 0) == pid);
    double dt = dt_time_s() - t0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 1)
        fprintf(stderr, "  status %d, stderr: %s", status, err);
    ASSERT(WIFEXITED(status));
    ASSERT_EQ_INT(WEXITSTATUS(status), 1);
    /* 2 * 4096 * 16384 parameters * (4 + 4 + 8) bytes */
    ASSERT_STR_CONTAINS(err, "needs 2147483648 bytes");
    ASSERT_STR_CONTAINS(err, "RLIMIT_AS");
    ASSERT_STR_CONTAINS(err, "adamw");
    ASSERT_STR_CONTAINS(err, "--offload nvme");
    ASSERT(dt < 20); /* at start, not after allocating */
}

int main(void)
{
    RUN(zero_formula);
    RUN(check_against_rlimit_as);
    RUN(check_against_mem_available);
    RUN(cli_fails_at_start_naming_the_bytes);
    return TEST_REPORT();
}
