/* dtrain — the command-line entry point: dispatches to a subcommand. */
#include "cmd.h"
#include "dtrain/base.h"

#include <stdio.h>
#include <string.h>

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
    {"plot", dt_cmd_plot, "plot a metrics file: dtrain plot FILE.jsonl -o out.png"},
    {"generate", dt_cmd_generate, "continue a prompt with a GPT model (dtrain generate --help)"},
    {"tokenize", dt_cmd_tokenize, "byte-level BPE: train a vocab, text -> token file (dtrain tokenize --help)"},
    {"ckpt", dt_cmd_ckpt, "checkpoints: dtrain ckpt {info,verify,convert} SRC (dtrain ckpt --help)"},
    {"pipeline", dt_cmd_pipeline, "print a pipeline schedule's action table: dtrain pipeline show --schedule 1f1b -p 4 -m 8"},
    {"info", dt_cmd_info, "version, build options, compute library, CPU features"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv)
{
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
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    dt__cli_err("dtrain: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
