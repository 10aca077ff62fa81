/* dtrain/monitor.h — scalar logs of a run for TensorBoard and as CSV files:
 * what DeepSpeed's "tensorboard" and "csv_monitor" config blocks write.
 *
 * A monitor takes (tag, value, step) triples and hands each to its
 * backends:
 *   - TensorBoard: an event file DIR/events.out.tfevents.TIME.HOST.PID.0
 *     (TensorFlow's record format: each record its length, the length's
 *     masked CRC-32C, the serialized Event, the data's masked CRC-32C; the
 *     first Event names the file version "brain.Event:2", each later one
 *     holds one Summary value: the tag and the value as a float
 *     `simple_value`, with the step and the wall time), what PyTorch's
 *     SummaryWriter.add_scalar writes; `tensorboard --logdir DIR` plots it.
 *   - CSV: one file per tag, DIR/TAG.csv with '/' and ' ' in the tag as
 *     '_' (DeepSpeed's csvMonitor: "Train/Samples/lr" ->
 *     Train_Samples_lr.csv), the header "step,NAME" (NAME: the tag's last
 *     '/' part) when the file is new, then a line "STEP,VALUE" per write
 *     (the value as Python prints a float: the shortest text that reads
 *     back to it; lines end in "\r\n", as Python's csv module writes
 *     them). A file that exists is appended to (a resumed run continues
 *     its history; DeepSpeed's monitor repeats the header there, this one
 *     does not).
 * DIR and its missing parents are created (not through a symlink); no file
 * is opened through a symlink. Each record goes to its file with one
 * write(2) as it comes (the files are logs that grow: what a stopped run
 * leaves is whole up to its last record).
 *
 * A training program opens one on its rank 0 (from a DeepSpeed config:
 * dt_monitor_open_config) and hands it to the trainer (train.h:
 * dt_trainer_params.monitor), which writes DeepSpeed's tags after every
 * optimizer step, at the number of
 * samples trained so far over all replicas (DeepSpeed's global_samples,
 * kept in checkpoints): "Train/Samples/train_loss" (the step's loss, mean
 * over its micro-batches and the replicas), "Train/Samples/lr" (the rate
 * of the next step, as DeepSpeed reads it after its scheduler stepped),
 * "Train/Samples/loss_scale" (fp16), and "Train/Samples/eval_loss" after
 * each dt_trainer_evaluate. A program writes its own tags the same way:
 *
 *     dt_monitor_params mp = dt_monitor_params_default();
 *     mp.tensorboard_dir = "runs/exp1";
 *     mp.csv_dir = "runs/exp1_csv";
 *     dt_monitor *mon;
 *     if (dt_monitor_open(&mp, &mon) < 0) return ...;   // DT_ERR_IO naming the path
 *     for each step s: dt_monitor_write(mon, "Train/loss", loss, s);
 *     dt_monitor_close(mon); */
#ifndef DTRAIN_MONITOR_H
#define DTRAIN_MONITOR_H

#include "dtrain/base.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_monitor dt_monitor;
typedef struct dt_config dt_config; /* config.h */

typedef struct dt_monitor_params {
    const char *tensorboard_dir; /* TensorBoard event file in this directory; NULL: none */
    const char *csv_dir;         /* one CSV file per tag in this directory; NULL: none */
} dt_monitor_params;

/* Both NULL (a monitor with no backend writes nothing). */
DT_API dt_monitor_params dt_monitor_params_default(void);
/* Create the directories and open the backends: dt_dir_make's errors
 * (DT_ERR_INVALID_ARG for a symlink or a file where a directory goes),
 * DT_ERR_IO naming the file when one cannot be opened; DT_ERR_NULL for NULL
 * p or out. */
DT_API dt_status dt_monitor_open(const dt_monitor_params *p, dt_monitor **out);
/* One scalar: tag (non-empty; a CSV file name is made from it, so no NUL,
 * and at most 200 bytes), value, step (>= 0). DT_ERR_INVALID_ARG for a bad
 * tag or step, DT_ERR_IO naming the file on a write error. */
DT_API dt_status dt_monitor_write(dt_monitor *m, const char *tag, double value, int64_t step);
/* Close the files; NULL is a no-op. Returns the first error. */
DT_API dt_status dt_monitor_close(dt_monitor *m);

/* The monitors of "tensorboard" and "csv_monitor" ({"enabled": true,
 * "output_path": P, "job_name": J}, DeepSpeed's keys and defaults: the
 * files go in P/J, P "" and J "DeepSpeedJobName" when absent) opened into
 * *out (monitor.h); *out NULL when neither is enabled. Call it on the one
 * rank that writes them (DeepSpeed: global rank 0) and hand the monitor to
 * the trainer (dt_trainer_params.monitor). Errors: dt_monitor_open's. */
DT_API dt_status dt_monitor_open_config(const dt_config *c, dt_monitor **out);

/* The text Python's repr gives a float: the shortest "%.Ng" that reads
 * back to v, with ".0" added when that is an integer ("100.0"), "nan",
 * "inf", "-inf". Into buf (n >= 32); returns buf. */
DT_API char *dt_float_repr(double v, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
