/* dtrain — the command-line entry point: dispatches to a subcommand. */
#include "cmd.h"
#include "run.h"
#include "dtrain/base.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} dt_command;

static const dt_command commands[] = {
    {"train", dt_cmd_train, "train a model (dtrain train --help)"},
    {"eval", dt_cmd_eval, "evaluate a checkpoint: dtrain eval --ckpt DIR (dtrain eval --help)"},
    {"run", dt_cmd_run, "launch N local ranks: dtrain run -n N -- PROGRAM ARGS..."},
    {"bench", dt_cmd_bench, "benchmarks: dtrain bench {step,coll,ddp,zero,matmul,data} ... (dtrain bench --help)"},
    {"plot", dt_cmd_plot, "plot metrics files: dtrain plot FILE.jsonl [FILE2.jsonl ...] -o out.png"},
    {"generate", dt_cmd_generate, "continue a prompt with a GPT-2 or Llama model (dtrain generate --help)"},
    {"tokenize", dt_cmd_tokenize, "byte-level BPE: train a vocab, text -> token file (dtrain tokenize --help)"},
    {"ckpt", dt_cmd_ckpt, "checkpoints: dtrain ckpt {info,verify,convert} SRC (dtrain ckpt --help)"},
    {"trace", dt_cmd_trace, "read a timeline of dtrain train --trace: dtrain trace {summary,plot} FILE"},
    {"plan", dt_cmd_plan, "rank the layouts of a model on N ranks by predicted time within memory (dtrain plan --help)"},
    {"pipeline", dt_cmd_pipeline, "print a pipeline schedule's action table: dtrain pipeline show --schedule 1f1b -p 4 -m 8"},
    {"info", dt_cmd_info, "version, build options, compute library, CPU features"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
}

/* OpenMP's waiting policy on shared CPUs (dtrain/base.h, "OpenMP's waiting
 * policy"): libgomp's default spin collapses a run while another process
 * holds a core (20-30x slower on the 2-core machine of docs/BENCHMARKS.md,
 * "Shared CPUs"); passive waiting never collapses but costs an idle machine
 * 11-22% of the ConvNet's speed. So the default follows the machine at
 * start: when the cores other processes leave free are enough for this
 * process's compute threads (dt_omp_wait_choose: min(1-minute load, tasks
 * runnable now, the median of up to 9 readings over ~40 ms when the load
 * alone does not decide) <= cores - threads + 0.5) -> a short spin,
 * GOMP_SPINCOUNT=10000; busier -> OMP_WAIT_POLICY=passive. The spin's
 * length: on the AMD EPYC machine of docs/BENCHMARKS.md 3000 kept the idle
 * speed within 3-5% of the full spin, but on the Xeon VM with AMX a thread
 * that stopped spinning costs far more to wake, and 3000 lost 21% of the
 * ConvNet step (9.7 against 7.7 ms, 3 rounds interleaved; 30000: 7.6) and
 * 7% of GPT-2's bf16 step at B=4 T=64 (354.5 against 330.4 ms; B=8 T=256:
 * 5%) to 10000. The cost if work arrives later (one busy process started
 * beside a run that chose to spin): the ConvNet step 20 ms at 3000, 28 at
 * 10000, 44 at 30000; libgomp's own spin collapses many times over.
 * DT_LOADAVG stands in for the load (tests). libgomp reads both
 * variables once, when it is loaded, before main: so when the user set
 * neither, the command sets one (and DT_OMP_WAIT, saying it was dtrain's
 * choice and from what, and stopping a second round) and executes itself
 * again; the ranks of dtrain run inherit the launcher's choice (they share
 * the cores, so their threads together are about the cores, as one process
 * of dt_get_num_threads() threads). A failed exec runs on with the
 * runtime's own policy. */
#define DT_IDLE_SPINCOUNT "10000"

static void omp_wait_default(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("DT_OMP_WAIT"))
        return;
    const int cores = dt_cpu_cores(), threads = dt_get_num_threads();
    dt_omp_wait_reading r;
    const bool passive = dt_omp_wait_choose(cores, threads, NULL, NULL, &r);
    char why[160];
    if (r.load1 >= 0)
        snprintf(why, sizeof why, "default, load %.2f, %d running, %d thread%s on %d core%s, %d reading%s", r.load1,
                 r.running, threads, threads == 1 ? "" : "s", cores, cores == 1 ? "" : "s", r.readings,
                 r.readings == 1 ? "" : "s");
    else
        snprintf(why, sizeof why, "default, load unknown");
    if ((passive ? setenv("OMP_WAIT_POLICY", "passive", 1) : setenv("GOMP_SPINCOUNT", DT_IDLE_SPINCOUNT, 1)) == 0 &&
        setenv("DT_OMP_WAIT", why, 1) == 0)
        execv("/proc/self/exe", argv);
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("GOMP_SPINCOUNT");
    setenv("DT_OMP_WAIT", "exec failed", 1);
}

const char *dt__omp_wait_desc(char *buf, size_t n)
{
    const char *sc = getenv("GOMP_SPINCOUNT"), *wp = getenv("OMP_WAIT_POLICY");
    snprintf(buf, n, "%s%s", sc ? "GOMP_SPINCOUNT=" : "", sc ? sc : wp ? wp : "runtime default");
    for (char *p = buf; *p; p++) /* the user's text: safe in JSON and on a terminal */
        if (!isalnum((unsigned char)*p) && !strchr("=_.,-", *p))
            *p = '?';
    return buf;
}

int main(int argc, char **argv)
{
    omp_wait_default(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("dtrain %s\n", DT_VERSION_STRING);
        return 0;
    }
    /* read DT_LOG_LEVEL now: a value that is not a level is said at start by every command, not only by
       one that happens to log (a quiet `dtrain train` never read it, so DT_LOG_LEVEL=bogus went unnoticed) */
    (void)dt_log_get_level();
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    dt__cli_err("dtrain: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
