/* tools/train.h — internals of `dtrain train` and `dtrain plot`, shared by
 * tools/cmd_train.c and tools/train_*.c. Not a public interface. */
#ifndef DT_TOOLS_TRAIN_H
#define DT_TOOLS_TRAIN_H

#include "dtrain/base.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* ---- options (train_args.c) ------------------------------------------------- */
typedef struct dt__train_opts {
    const char *model;        /* convnet | mlp */
    const char *data;         /* fashion-mnist | mnist:DIR | idx:DIR | random (default:
                                 fashion-mnist for convnet, random for mlp) */
    int64_t epochs;           /* >= 1, default 1 */
    int64_t batch;            /* per process, default 100 */
    const char *optimizer;    /* sgd | adam | adamw | lamb, default sgd */
    double lr;                /* default 0.01 */
    double momentum;          /* SGD momentum, default 0 */
    double weight_decay;      /* default: the optimizer's own (-1 = unset) */
    const char *lr_schedule;  /* constant | step | cosine, default constant */
    int64_t warmup;           /* linear warm-up steps, default 0 */
    int64_t step_size;        /* step schedule: steps per decay (default: one epoch) */
    double gamma;             /* step schedule factor, default 0.1 */
    double clip_grad_norm;    /* 0 = off */
    int64_t threads;          /* compute threads, 0 = library default */
    int64_t eval_every;       /* evaluate every N steps too (0 = only at epoch ends) */
    const char *metrics;      /* JSON-lines file, NULL = none */
    int64_t log_every;        /* steps between plain lines / step records, default 100 */
    uint64_t seed;            /* default 0 */
    const char *rng;          /* torch | philox: how seed draws init and order (default torch) */
    int64_t limit_train;      /* use only the first N training items (0 = all) */
    int64_t limit_test;       /* use only the first N test items (0 = all) */
    const char *progress;     /* auto | bar | plain | none, default auto */
    int64_t prefetch;         /* batches the loader prepares ahead, default 2 */
    int64_t random_items;     /* items of the random train set, default 6000 */
    bool no_eval;             /* skip the final evaluation */
    /* DDP (tools/train_ddp.c) */
    bool sync_bn;             /* BatchNorm2d -> SyncBatchNorm when distributed */
    double bucket_mb;         /* DDP bucket cap in MiB, 0 = default 25 */
    int64_t grad_accum;       /* micro-batches per optimizer step, default 1 */
} dt__train_opts;

/* Parse argv (argv[0] is "train"). Returns 0 on success, 1 if --help was
 * printed (exit 0), 2 after printing one line naming the bad flag. */
int dt__train_parse(int argc, char **argv, dt__train_opts *o);
void dt__train_usage(FILE *f);

/* ---- progress display (train_progress.c) -------------------------------------- */
typedef enum { DT__PROGRESS_NONE, DT__PROGRESS_PLAIN, DT__PROGRESS_BAR } dt__progress_mode;

typedef struct dt__progress {
    dt__progress_mode mode;
    FILE *out;
    int64_t epoch, epochs, total, log_every;
    double t0, last_draw;
    int width;
    bool drawn;
} dt__progress;

/* mode from "auto" (bar on a terminal, else plain), "bar", "plain", "none". */
void dt__progress_init(dt__progress *p, const char *mode, FILE *out, int64_t epochs,
                       int64_t log_every);
void dt__progress_epoch_begin(dt__progress *p, int64_t epoch, int64_t total_steps);
/* After step `step` (1-based within the epoch) with the running loss. */
void dt__progress_step(dt__progress *p, int64_t step, double loss, double lr, int64_t samples);
/* Clears the bar line (before printing anything else). */
void dt__progress_clear(dt__progress *p);
void dt__progress_epoch_end(dt__progress *p, int64_t steps, double loss, double wall_s,
                            double samples_per_s);
/* "1:05" / "1:02:03" */
char *dt__fmt_duration(double s, char *buf, size_t n);

/* ---- metrics file (train_metrics.c) ---------------------------------------------- */
/* Records go to PATH.partial while the run lasts; dt__metrics_close(ok)
 * renames it to PATH on success and removes it on failure, so PATH exists
 * only for a run that finished. An existing PATH is removed at open. */
typedef struct dt__metrics {
    FILE *f;
    char *path, *partial;
} dt__metrics;

dt_status dt__metrics_open(dt__metrics *m, const char *path);
/* One JSON object on one line: fmt is the body without braces, e.g.
 * "\"event\":\"step\",\"step\":%lld". Flushed at once. */
dt_status dt__metrics_write(dt__metrics *m, const char *fmt, ...) DT_PRINTF(2, 3);
dt_status dt__metrics_close(dt__metrics *m, bool ok);

/* ---- flat JSON objects (train_json.c) --------------------------------------------- */
/* A minimal strict parser for one JSON object per line whose values are
 * numbers, strings, true, false or null (what the metrics file holds). */
#define DT__JSON_MAX_FIELDS 32
typedef struct dt__json_field {
    char key[64];
    enum { DT__JSON_NUM, DT__JSON_STR, DT__JSON_BOOL, DT__JSON_NULL } type;
    double num;
    char str[128];
} dt__json_field;
typedef struct dt__json_obj {
    int n;
    dt__json_field f[DT__JSON_MAX_FIELDS];
} dt__json_obj;
/* Parse line into o. Returns 0, or -1 with a message in err. */
int dt__json_parse_line(const char *line, dt__json_obj *o, char *err, size_t errn);
const dt__json_field *dt__json_get(const dt__json_obj *o, const char *key);

#endif
