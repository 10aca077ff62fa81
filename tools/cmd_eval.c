/* dtrain eval --ckpt DIR [train options] — evaluate a checkpoint on the
 * test split.
 *
 * A checkpoint written by dtrain train --save keeps the options that chose
 * its model and data (its "dtrain.user" metadata: model, data, seed, rng,
 * random_items, limit_train, limit_test, the MLP's widths); they become the defaults of a
 * train command line, any option given here overrides them (e.g. --data
 * idx:DIR to evaluate on other files, --limit-test N), and the train
 * command's own setup builds the model and the data, loads the checkpoint's
 * weights (CRC-checked) and evaluates. Text data (--data text:/jsonl:/parquet:) is
 * encoded with --tokenizer FILE when given, else with the tokenizer.json a
 * run trained with --tokenizer keeps (dt__ckpt_tokenizer, as dtrain
 * generate --ckpt); the command says which. Parsing and printing only. */
#include "cmd.h"
#include "train.h"

#include "dtrain/train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain eval --ckpt DIR [options]\n"
               "       dtrain eval --weights FILE --model NAME --data SPEC [options]\n"
               "       dtrain eval --model hf:DIR --data tokens:FILE [--batch B] [--seq T] [--json]\n"
               "\n"
               "Evaluate the weights of a checkpoint on the test split and print the test loss (and\n"
               "accuracy). DIR is a `dtrain train --save` directory (its newest complete checkpoint)\n"
               "or one step-N checkpoint. The model and data are those the checkpoint was trained\n"
               "with, evaluated in its batches, so the loss is the run's validation loss (a LoRA run's\n"
               "model with its adapters and --freeze, a --loss-mask run's loss on the completions, an\n"
               "--assistant-only-loss run's on the assistant's turns, a --packing off run's records\n"
               "one a sample; text data through the tokenizer.json a --tokenizer run keeps, unless\n"
               "--tokenizer FILE is given: the command says which); any `dtrain train` option\n"
               "given here overrides them (--data SPEC, --limit-test N, --batch N, --threads N,\n"
               "--metrics FILE; --lora-* options other than the checkpoint's are refused, and so are\n"
               "--init-from, --resume, --save, --save-hf, --save-lora, --plan and --no-eval).\n"
               "--lora-from DIR: PEFT adapters on the weights evaluated.\n"
               "--weights FILE: the weights of a safetensors file with PyTorch's names (a `dtrain ckpt\n"
               "convert --full` export, or one written by PyTorch or Hugging Face: every spelling of a\n"
               "tied head is taken); the model and data are then given as dtrain train's options.\n"
               "--model hf:DIR: a Hugging Face model directory (config.json + safetensors), its weights\n"
               "evaluated; with --data tokens:FILE the loss is the mean next-token loss over FILE's\n"
               "(T+1)-token windows (T = --seq).\n"
               "--json: print one JSON object {\"loss\": L, \"items\": N, ...} instead of the text lines.\n"
               "  e.g. dtrain eval --ckpt runs/a --limit-test 1000\n"
               "       dtrain eval --model hf:llama-dir --data tokens:val.bin --batch 8 --seq 256 --json\n"
               "       dtrain eval --weights model.safetensors --model convnet --data fashion-mnist\n");
}

/* text:/jsonl:/parquet: data (encoded with a tokenizer) */
static bool text_spec(const char *d)
{
    return d && (!strncmp(d, "text:", 5) || !strncmp(d, "jsonl:", 6) || !strncmp(d, "parquet:", 8));
}

/* The effective --data (key "data") or --val-data (key "val_data"): the
 * one given here, else the checkpoint's. */
static const char *spec_of(const char *given, const cJSON *user, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(user, key);
    return given ? given : cJSON_IsString(v) && v->valuestring[0] ? v->valuestring : NULL;
}

/* Append "--flag value" from user[key] when it is a string or a positive number. */
static int add_opt(char **argv, int n, char bufs[][64], int *nb, const cJSON *user, const char *key, const char *flag)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(user, key);
    if (cJSON_IsString(v) && v->valuestring[0]) {
        argv[n++] = (char *)flag;
        argv[n++] = v->valuestring;
    } else if (cJSON_IsNumber(v) && v->valuedouble > 0) {
        snprintf(bufs[*nb], 64, "%.0f", v->valuedouble);
        argv[n++] = (char *)flag;
        argv[n++] = bufs[(*nb)++];
    }
    return n;
}

int dt_cmd_eval(int argc, char **argv)
{
    const char *ckpt = NULL, *weights = NULL, *hf = NULL, *data_arg = NULL, *val_arg = NULL, *tok_arg = NULL;
    bool vocab_given = false;
    bool json = false, val_given = false, mask_given = false, amask_given = false, packing_given = false;
    int nrest = 0;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) {
        dt__cli_err("dtrain eval: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            free(rest);
            return 0;
        }
        if (!strcmp(argv[i], "--ckpt") || !strncmp(argv[i], "--ckpt=", 7)) {
            ckpt = argv[i][6] == '=' ? argv[i] + 7 : i + 1 < argc ? argv[++i] : NULL;
            if (!ckpt || !*ckpt) {
                dt__cli_err("dtrain eval: --ckpt needs a directory\n");
                free(rest);
                return 2;
            }
            continue;
        }
        if (!strcmp(argv[i], "--weights") || !strncmp(argv[i], "--weights=", 10)) {
            weights = argv[i][9] == '=' ? argv[i] + 10 : i + 1 < argc ? argv[++i] : NULL;
            if (!weights || !*weights) {
                dt__cli_err("dtrain eval: --weights needs a safetensors file\n");
                free(rest);
                return 2;
            }
            continue;
        }
        if (!strcmp(argv[i], "--json")) {
            json = true;
            continue;
        }
        /* --model hf:DIR names its weights too; --data tokens:FILE is the evaluation's data */
        if (!strcmp(argv[i], "--model") && i + 1 < argc && !strncmp(argv[i + 1], "hf:", 3))
            hf = dt__cli_hf_model(argv[i + 1]) + 3;
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            data_arg = argv[i + 1];
        if (!strcmp(argv[i], "--val-data") && i + 1 < argc)
            val_arg = argv[i + 1];
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            tok_arg = argv[i + 1];
        else if (!strncmp(argv[i], "--tokenizer=", 12))
            tok_arg = argv[i] + 12;
        val_given |= !strcmp(argv[i], "--val-data");
        vocab_given |= !strcmp(argv[i], "--vocab") || !strncmp(argv[i], "--vocab=", 8);
        mask_given |= !strcmp(argv[i], "--loss-mask");
        amask_given |= !strcmp(argv[i], "--assistant-only-loss");
        packing_given |= !strcmp(argv[i], "--packing");
        rest[nrest++] = argv[i];
    }
    if (!ckpt && !weights && hf && *hf)
        weights = hf;
    if (!ckpt == !weights) {
        dt__cli_err("dtrain eval: %s (see dtrain eval --help)\n",
                    ckpt ? "give --ckpt DIR or --weights FILE, not both" : "missing --ckpt DIR or --weights FILE");
        free(rest);
        return 2;
    }
    struct stat wsb; /* a missing file was "--ckpt: checkpoint F: No such file or directory", exit 1 */
    if (weights && weights != hf && stat(weights, &wsb) != 0) {
        dt__cli_err("dtrain eval: --weights %s: %s\n", weights, strerror(errno));
        free(rest);
        return 2;
    }
    if (weights) { /* no saved options: the command line names the model and the data */
        char **targv = calloc((size_t)nrest + 6, sizeof *targv);
        if (!targv) {
            free(rest);
            dt__cli_err("dtrain eval: out of memory\n");
            return 1;
        }
        int n = 0;
        targv[n++] = "train";
        targv[n++] = "--progress";
        targv[n++] = "none";
        for (int i = 0; i < nrest; i++)
            targv[n++] = rest[i];
        if (data_arg && !strncmp(data_arg, "tokens:", 7) && !val_given) { /* evaluate on the token file itself */
            targv[n++] = "--val-data";
            targv[n++] = (char *)data_arg;
        }
        targv[n] = NULL;
        dt__train_eval_flag(weights == hf ? "--model" : "--weights");
        int rc = dt__train_eval_ckpt(n, targv, weights, json, NULL);
        free(targv);
        free(rest);
        return rc;
    }
    char *js = NULL;
    if (dt_trainer_ckpt_user(ckpt, &js) < 0) {
        dt__cli_err("dtrain eval: --ckpt: %s\n", dt_last_error());
        free(rest);
        return 2;
    }
    cJSON *user = cJSON_Parse(js);
    dt_trainer_run_state_free(js);
    char **targv = calloc((size_t)nrest + 48, sizeof *targv);
    char bufs[16][64];
    int n = 0, nb = 0;
    if (!user || !targv) {
        dt__cli_err("dtrain eval: --ckpt %s: cannot read its options\n", ckpt);
        cJSON_Delete(user);
        free(targv);
        free(rest);
        return 2;
    }
    /* text data: the tokenizer given, else the one the checkpoint keeps */
    const char *dspec = spec_of(data_arg, user, "data"), *vspec = spec_of(val_arg, user, "val_data");
    dt_tokenizer *kept = NULL;
    if ((text_spec(dspec) || text_spec(vspec)) && !tok_arg && !vocab_given && dt__ckpt_tokenizer(ckpt, &kept) < 0) {
        dt__cli_err("dtrain eval: --ckpt: %s\n", dt_last_error());
        cJSON_Delete(user);
        free(targv);
        free(rest);
        return 2;
    }
    if (tok_arg && (text_spec(dspec) || text_spec(vspec)))
        fprintf(json ? stderr : stdout, "tokenizer: --tokenizer %s\n", tok_arg);
    else if (kept)
        fprintf(json ? stderr : stdout, "tokenizer: the tokenizer.json --ckpt %s keeps (its run's --tokenizer)\n",
                ckpt);
    targv[n++] = "train";
    if (kept) { /* it stands for the tokenizer it keeps (dt__train_eval_ckpt takes kept) */
        targv[n++] = "--tokenizer";
        targv[n++] = (char *)ckpt;
    }
    n = add_opt(targv, n, bufs, &nb, user, "model", "--model");
    n = add_opt(targv, n, bufs, &nb, user, "data", "--data");
    /* the run's batch: with a loss over some targets only (--loss-mask, --assistant-only-loss) the mean is over the
       batches' means (as HF Trainer's evaluation), so the batches are the run's */
    n = add_opt(targv, n, bufs, &nb, user, "batch", "--batch");
    n = add_opt(targv, n, bufs, &nb, user, "seed", "--seed");
    n = add_opt(targv, n, bufs, &nb, user, "rng", "--rng");
    /* Runs before dtrain train refused --random-items with other data
     * recorded its default 6000 for every data set: pass it for random only. */
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(user, "data");
    if (cJSON_IsString(data) && !strcmp(data->valuestring, "random"))
        n = add_opt(targv, n, bufs, &nb, user, "random_items", "--random-items");
    n = add_opt(targv, n, bufs, &nb, user, "limit_train", "--limit-train");
    n = add_opt(targv, n, bufs, &nb, user, "limit_test", "--limit-test");
    /* the MLP's widths */
    n = add_opt(targv, n, bufs, &nb, user, "mlp_dim", "--mlp-dim");
    n = add_opt(targv, n, bufs, &nb, user, "mlp_hidden", "--mlp-hidden");
    /* GPT models: their configuration and validation tokens */
    n = add_opt(targv, n, bufs, &nb, user, "val_data", "--val-data");
    n = add_opt(targv, n, bufs, &nb, user, "seq", "--seq");
    const cJSON *mj = cJSON_GetObjectItemCaseSensitive(user, "model");
    if (!(cJSON_IsString(mj) && !strncmp(mj->valuestring, "hf:", 3))) { /* an hf:DIR's shape is its config.json's
                                                                            (an older run recorded the vocab size
                                                                            of its --tokenizer) */
        n = add_opt(targv, n, bufs, &nb, user, "n_layer", "--n-layer");
        n = add_opt(targv, n, bufs, &nb, user, "n_head", "--n-head");
        n = add_opt(targv, n, bufs, &nb, user, "n_embd", "--n-embd");
        n = add_opt(targv, n, bufs, &nb, user, "block_size", "--block-size");
        n = add_opt(targv, n, bufs, &nb, user, "vocab_size", "--vocab-size");
    }
    /* a --loss-mask run: its prompt/completion data evaluated on the completions (unless other data is given) */
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(user, "loss_mask")) && !data_arg && !val_given && !mask_given)
        targv[n++] = "--loss-mask";
    /* an --assistant-only-loss run: its conversations evaluated on the assistant's turns */
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(user, "assistant_only_loss")) && !data_arg && !val_given &&
        !amask_given)
        targv[n++] = "--assistant-only-loss";
    /* a --packing off run: its records evaluated one a sample */
    const cJSON *pk = cJSON_GetObjectItemCaseSensitive(user, "packing");
    if (cJSON_IsString(pk) && !strcmp(pk->valuestring, "off") && !data_arg && !val_given && !packing_given) {
        targv[n++] = "--packing";
        targv[n++] = "off";
    }
    targv[n++] = "--progress";
    targv[n++] = "none";
    for (int i = 0; i < nrest; i++)
        targv[n++] = rest[i];
    targv[n] = NULL;
    int rc = dt__train_eval_ckpt(n, targv, ckpt, json, kept);
    cJSON_Delete(user);
    free(targv);
    free(rest);
    return rc;
}
