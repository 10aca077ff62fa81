/* tools/cmd.h — the subcommands of the `dtrain` program.
 * Each returns the process exit code: 0 success, 1 runtime failure,
 * 2 bad usage or bad input. */
#ifndef DT_TOOLS_CMD_H
#define DT_TOOLS_CMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain/plan.h"
#include "dtrain/tokenizer.h"

int dt_cmd_info(int argc, char **argv);
int dt_cmd_train(int argc, char **argv);
int dt_cmd_run(int argc, char **argv);
int dt_cmd_bench(int argc, char **argv);
int dt_cmd_plot(int argc, char **argv);
int dt_cmd_generate(int argc, char **argv);
int dt_cmd_eval(int argc, char **argv);
int dt_cmd_tokenize(int argc, char **argv);
int dt_cmd_ckpt(int argc, char **argv);
int dt_cmd_pipeline(int argc, char **argv);
int dt_cmd_trace(int argc, char **argv);
int dt_cmd_plan(int argc, char **argv);
/* The OpenMP waiting policy this process runs with (tools/dtrain.c), as the
 * start record of dtrain train and dtrain bench step --json show it:
 * "GOMP_SPINCOUNT=N", the OMP_WAIT_POLICY value ("passive") or "runtime
 * default"; characters other than letters, digits and "=_.,-" become '?'.
 * Returns buf. */
const char *dt__omp_wait_desc(char *buf, size_t n);
/* dtrain trace plot (tools/trace_plot.c). */
int dt__trace_plot(int argc, char **argv);

/* gnuplot for the plots (tools/gnuplot.c): the program ($DT_GNUPLOT, else
 * on PATH; malloc'd, NULL when absent), and running dir/plot.gp, which
 * writes dir/out.png, then moving the image to out (no symlink followed;
 * complete or absent). Returns 0, or 1 after one line naming `who`. */
char *dt__gnuplot_find(void);
int dt__gnuplot_run(const char *who, const char *dir, const char *out);

/* The planner's CLI pieces (tools/cmd_plan.c), shared by dtrain plan and
 * dtrain train --plan auto: "4G"-style bytes (0 when malformed); the
 * calibration for (model, seq, dtype) from the cache file (file, else the
 * cache directory), measured and cached when absent or fresh (progress on
 * stderr unless quiet; returns 0, or the exit code after one line naming
 * who); one row of the ranking as JSON or a table line, and the table's
 * header. */
double dt__plan_parse_bytes(const char *s);
int dt__plan_calib_get(const char *who, const char *model, int64_t seq, dt_dtype dt, const char *file, bool fresh,
                       bool quiet, dt_plan_calib *c);
int dt__plan_comm_curve(dt_plan_calib *c, char *why, size_t nwhy);
void dt__plan_calib_path(const char *model, int64_t seq, dt_dtype dt, char *buf, size_t n);
void dt__plan_row_json(FILE *f, const dt_plan_prediction *r, int rank);
void dt__plan_row_text(FILE *f, const dt_plan_prediction *r, int rank);
void dt__plan_table_head(FILE *f);

/* The tokenizer.json a checkpoint keeps (a run trained with dtrain train
 * --tokenizer and --save keeps it with its options), loaded into *out;
 * *out NULL when the checkpoint keeps none. dtrain generate --ckpt and
 * dtrain eval --ckpt encode text with it (tools/ckpt_tokenizer.c). DT_OK,
 * or the error of reading the checkpoint or the tokenizer. */
dt_status dt__ckpt_tokenizer(const char *ckpt, dt_tokenizer **out);

/* Benchmark suites under `dtrain bench`, one file each (tools/bench_*.c). */
int dt_bench_step(int argc, char **argv);
int dt_bench_coll(int argc, char **argv);
int dt_bench_matmul(int argc, char **argv);
int dt_bench_ddp(int argc, char **argv);
int dt_bench_zero(int argc, char **argv);
/* The median of v[0..n) (sorts v in place); 0 for n <= 0. */
double dt__bench_median(double *v, int n);
/* CPU seconds this process used so far, every thread (user + system). */
double dt__bench_cpu_s(void);
/* A bench suite's numeric option, read strictly (dt_parse_int/dt_parse_double:
 * the whole value a number in [lo, hi]): 0, or 2 after one line "who: ..."
 * naming the flag (atoi took "abc" as 0, a default, and "12x" as 12). */
int dt__bench_int(const char *who, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out);
int dt__bench_double(const char *who, const char *flag, const char *v, double lo, double hi, double *out);
int dt_bench_data(int argc, char **argv);

/* Print one error line of the CLI's own to stderr, printf-style, with
 * control characters in it escaped (dt_escape): every message that can
 * echo a user-supplied string goes through here (tools/cli_msg.c). */
void dt__cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The train command's code also runs `dtrain eval` (dt__train_eval_ckpt):
 * with cmd set ("dtrain eval"), a line dt__cli_err prints that starts with
 * "dtrain train:" starts with "cmd:" instead. NULL: as written. */
void dt__cli_err_command(const char *cmd);
/* While buf is set (n bytes), dt__cli_err writes its line into buf (escaped,
 * without the newline; the last line wins) instead of printing it: for a
 * check run only to learn whether, and why, it refuses. NULL: print again. */
void dt__cli_err_capture(char *buf, size_t n);

/* An output file a flag names, checked before any work (bad input, exit 2,
 * rather than an I/O failure at the end): a name given, not a symbolic
 * link (dtrain does not write through them), not a directory or other
 * non-regular file, in a directory that exists. 0, or 2 after one line
 * "who: flag PATH: why" (tools/cli_msg.c). */
int dt__cli_out_file(const char *who, const char *flag, const char *path);
/* Whether a and b name one file: the same string, or both exist and are the
 * same inode (an output that would replace an input: refuse it). */
bool dt__cli_same_file(const char *a, const char *b);
/* --model hf:X: v itself when X exists (a directory) or v is no hf: model; else X as a Hugging Face Hub id
 * ("org/name", as from_pretrained takes it) whose snapshot the hub cache holds: "hf:SNAPSHOT" (dt_hf_hub_snapshot,
 * models.h; kept for the process's life). Not in the cache: v, whose directory the model's loader then refuses,
 * saying where it looked. */
const char *dt__cli_hf_model(const char *v);
/* Where execvp would find prog as an executable file (a name with a '/' as
 * it is, else along PATH; a directory or a file without execute permission
 * does not count): 0 and its path in out (outn bytes; out may be NULL), or
 * -1 with the reason in why (whyn bytes; may be NULL). `dtrain run` refuses
 * a PROGRAM it cannot find before any rank starts; plot finds gnuplot. */
int dt__cli_which(const char *prog, char *out, size_t outn, char *why, size_t whyn);
/* The default picture of an input file: its name with the extension (if
 * any) replaced by .png, into buf (n bytes); returns buf. */
const char *dt__cli_png_beside(const char *in, char *buf, size_t n);

/* The name among names[0..n) (without dashes) closest to given, an
 * unknown option's name without its dashes, for a "did you mean" hint:
 * within a small edit distance ('_' and '-' equal) or one that starts with
 * given; NULL when none is close. */
const char *dt__cli_suggest(const char *given, const char *const *names, size_t n);

#endif
