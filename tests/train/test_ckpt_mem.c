/* The memory a trainer checkpoint costs rank 0 (issue 14: "rank 0's peak
 * extra memory"): a synchronous dt_trainer_save writes from the trainer's
 * own memory, so its peak extra resident memory stays far below the state
 * it saves; an asynchronous one stages a copy of the state (the training
 * goes on changing the original), so its extra is about the state. The
 * peak is reset with /proc/self/clear_refs ("5", Linux >= 4.0) before each
 * save and read from VmHWM after; skipped where that is not possible. Both
 * checkpoints load back to the saved weights and moments. */
#include "test.h"
#include "tmp_util.h"

#include "dtrain/ckpt.h"
#include "dtrain/models.h"
#include "dtrain/train.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define T_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_ASAN 1
#endif
#endif

static double status_bytes(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl)) {
            kb = strtod(line + kl, NULL);
            break;
        }
    if (f)
        fclose(f);
    return kb * 1024;
}

static int reset_peak(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    int ok = fd >= 0 && write(fd, "5", 1) == 1;
    if (fd >= 0)
        close(fd);
    return ok && status_bytes("VmHWM:") > 0 ? 0 : -1;
}

/* Peak extra resident bytes of one save of tr into dir (async or not). */
static double save_extra(dt_trainer *tr, const char *dir, bool async)
{
    dt_trainer_save_params sp = dt_trainer_save_params_default();
    sp.async = async;
    double before = status_bytes("VmRSS:");
    if (reset_peak() < 0)
        return -1;
    if (dt_trainer_save(tr, dir, &sp) < 0 || dt_trainer_save_wait(tr) < 0)
        return -2;
    return status_bytes("VmHWM:") - before;
}

TEST(sync_save_needs_no_copy_of_the_state)
{
#ifdef T_ASAN
    DT_TEST_SKIP("resident memory under AddressSanitizer is not the program's");
#endif
    dt_model_config cfg = dt_model_config_default();
    cfg.mlp_dim = 256;
    cfg.mlp_hidden = 4096; /* 2M parameters: 24 MiB of state with AdamW */
    cfg.mlp_seq = 2;
    dt_model *m;
    dt_model_desc d;
    ASSERT_OK(dt_model_create("mlp", 3, &cfg, &m, &d));
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW;
    tp.loss_fn = dt_model_desc_loss_fn;
    tp.loss_ud = &d;
    dt_trainer *tr;
    ASSERT_OK(dt_trainer_init(m, s, &tp, &tr));
    float x[2 * 256];
    for (int i = 0; i < 2 * 256; i++)
        x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    dt_trainer_batch b = dt_trainer_batch_make(x, DT_F32, 3, (int64_t[]){1, 2, 256}, NULL, DT_F32, 0, NULL);
    dt_trainer_metrics mt;
    ASSERT_OK(dt_trainer_step(tr, &b, 1, &mt));
    const double state = 12.0 * (double)dt_model_param_count(m);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/sync", t_tmpdir("ckpt_mem"));
    double sync = save_extra(tr, dir, false);
    if (sync == -1) {
        dt_trainer_free(tr);
        dt_model_free(m);
        DT_TEST_SKIP("cannot reset the peak RSS (/proc/self/clear_refs)");
    }
    ASSERT(sync >= 0);
    snprintf(dir, sizeof dir, "%s/async", t_tmpdir("ckpt_mem"));
    double async = save_extra(tr, dir, true);
    ASSERT(async >= 0);
    fprintf(stderr, "state %.1f MiB: extra during a synchronous save %.1f MiB, an asynchronous one %.1f MiB\n",
            state / 1048576, sync / 1048576, async / 1048576);
    /* the writer's buffers only (a few MiB), not a copy of 24 MiB */
    ASSERT(sync < 0.25 * state);
    /* the staging copy is really there: the measurement can see a copy */
    ASSERT(async > 0.9 * state);
    /* both hold the weights and the moments of this step */
    const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32);
    float *w = malloc(P->numel * sizeof(float)), *w2 = malloc(P->numel * sizeof(float));
    ASSERT(w && w2);
    memcpy(w, P->base, P->numel * sizeof(float));
    for (int a = 0; a < 2; a++) {
        dt_trainer_metrics mt2;
        ASSERT_OK(dt_trainer_step(tr, &b, 1, &mt2)); /* moves the weights away */
        snprintf(dir, sizeof dir, "%s/%s", t_tmpdir("ckpt_mem"), a ? "async" : "sync");
        ASSERT_OK(dt_trainer_load(tr, dir, NULL));
        memcpy(w2, P->base, P->numel * sizeof(float));
        ASSERT(memcmp(w, w2, P->numel * sizeof(float)) == 0);
    }
    free(w);
    free(w2);
    dt_trainer_free(tr);
    dt_model_free(m);
}

int main(void)
{
    RUN(sync_save_needs_no_copy_of_the_state);
    t_rm_rf(t_tmpdir("ckpt_mem"));
    return TEST_REPORT();
}
