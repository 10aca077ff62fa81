/* dtrain ckpt — inspect, verify and convert checkpoints (a checkpoint
 * directory or a single safetensors file). Parsing and printing only: the
 * formats and the resharding are ckpt.h's. */
#include "cmd.h"
#include "train.h"
#include "dtrain/ckpt.h"
#include "dtrain/models.h"
#include "dtrain/train.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain ckpt info SRC\n"
            "       dtrain ckpt verify SRC\n"
            "       dtrain ckpt convert SRC -o DST (--full [--with-optimizer] | --ranks N)\n"
            "       dtrain ckpt convert --hf OUT SRC [--hf-shard-size BYTES] [--hf-dtype f32|bf16|f16]\n"
            "                           [--model NAME] [--tokenizer FILE]\n"
            "  SRC is a checkpoint directory (index.json + rank-*.safetensors), a dtrain train --save\n"
            "  directory (its newest checkpoint) or one .safetensors file (written by dtrain, PyTorch or\n"
            "  Hugging Face).\n"
            "  info      the metadata, and each tensor's name, dtype, shape and saved pieces\n"
            "  verify    check every file's size and checksum (CRC-32C) and that every tensor is complete\n"
            "  convert   --full: one safetensors file with the model's state_dict, every tensor whole:\n"
            "            model.load_state_dict(safetensors.torch.load_file(DST), strict=True) takes it\n"
            "            (a tied head under both its names, lm_head.weight and transformer.wte.weight);\n"
            "            --with-optimizer also keeps the run state (optim.*, master.*).\n"
            "            --ranks N: a checkpoint directory as N ranks would save it, each holding\n"
            "            an equal range of all tensors laid end to end (as ZeRO shards a flat buffer). Any checkpoint loads at any world size\n"
            "            as it is; convert changes only the files. DST is written atomically and\n"
            "            must not exist (an existing DST, or one in a directory that does not\n"
            "            exist, is refused, exit 2).\n"
            "            --hf OUT: a Hugging Face model directory (config.json, generation_config.json,\n"
            "            model.safetensors, or shards of --hf-shard-size bytes (default 5000000000) with\n"
            "            model.safetensors.index.json) that transformers' AutoModelForCausalLM.from_pretrained\n"
            "            loads: the model (GPT-2, Llama, hf:DIR) is the one the checkpoint was trained with\n"
            "            (--model NAME for a file without dtrain's options); a LoRA run's adapters are\n"
            "            merged into their layers (PEFT's merge_and_unload); OUT must not exist (or be\n"
            "            empty) and appears complete or not at all. --tokenizer FILE (a tokenizer.json;\n"
            "            for an hf:DIR model DIR's tokenizer.json when there is one) adds tokenizer.json,\n"
            "            tokenizer_config.json and special_tokens_map.json (AutoTokenizer loads them).\n"
            "  exit 2: a missing, unreadable or damaged SRC, an existing DST or a missing directory for\n"
            "  it, bad usage; exit 1: out of memory or a failed write.\n"
            "  e.g. dtrain ckpt info run/step-00000100\n"
            "       dtrain ckpt convert run/step-00000100 -o model.safetensors --full\n"
            "       dtrain ckpt convert --hf llama-hf runs/llama\n");
}

/* The source cannot be read or is damaged, or the destination exists: bad
 * input (exit 2). Out of memory, an internal error and a write that failed
 * (I/O on the destination: fail_write) are runtime failures (exit 1). */
static int fail(const char *what)
{
    dt__cli_err("dtrain ckpt %s: %s\n", what, dt_last_error());
    const dt_status st = dt_last_status();
    return st == DT_ERR_NO_MEMORY || st == DT_ERR_INTERNAL ? 1 : 2;
}

/* A write into the destination failed (convert): exit 1 for I/O (a full
 * disk), 2 for everything about the input. */
static int fail_write(const char *what)
{
    const dt_status st = dt_last_status();
    const int rc = fail(what);
    return st == DT_ERR_IO ? 1 : rc;
}

/* convert never replaces anything: DST must not exist (nor be a symlink),
 * and goes into an existing directory (a missing one is bad input, refused
 * before anything is read, not a failed write at the end). */
static int check_dst(const char *dst, bool file)
{
    struct stat sb;
    char esc[512];
    if (file && dst[0] && dst[strlen(dst) - 1] == '/') { /* --full writes one file */
        dt__cli_err("dtrain ckpt convert: -o %s: --full writes a file, not a directory (name the file)\n",
                    dt_escape(dst, esc, sizeof esc));
        return 2;
    }
    errno = 0;
    const int r = lstat(dst, &sb), e = errno;
    if (r == 0 || e != ENOENT) {
        dt__cli_err("dtrain ckpt convert: -o %s: %s%s\n", dt_escape(dst, esc, sizeof esc),
                    r == 0 ? "already exists" : strerror(e),
                    r == 0 || e == EEXIST ? " (remove it first, or choose another name)" : "");
        return 2;
    }
    char dir[4096];
    if (dt_path_trim_slashes(dst, dir, sizeof dir) < 0) {
        dt__cli_err("dtrain ckpt convert: -o: %s\n", dt_last_error());
        return 2;
    }
    size_t n = strlen(dir);
    while (n > 0 && dir[n - 1] != '/')
        n--;
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (n)
        dir[n] = 0; /* its directory */
    else
        snprintf(dir, sizeof dir, ".");
    errno = 0;
    const int dr = stat(dir, &sb), de = errno;
    if (dr != 0 || !S_ISDIR(sb.st_mode)) {
        dt__cli_err("dtrain ckpt convert: -o %s: its directory %s: %s\n", dt_escape(dst, esc, sizeof esc),
                    dt_escape(dir, esc + 256, 256), dr != 0 ? strerror(de) : "not a directory");
        return 2;
    }
    return 0;
}

static void print_shape(const int64_t *s, int nd)
{
    printf("[");
    for (int d = 0; d < nd; d++)
        printf(d ? ",%lld" : "%lld", (long long)s[d]);
    printf("]");
}

static int info(dt_ckpt *ck, const char *src)
{
    char esc[512];
    size_t nt = dt_ckpt_num_tensors(ck);
    uint64_t bytes = 0;
    for (size_t i = 0; i < nt; i++) {
        dt_ckpt_tensor t;
        dt_ckpt_tensor_at(ck, i, &t);
        bytes += t.numel * dt_st_dtype_size(t.dtype);
    }
    printf("checkpoint %s: %zu tensors, %llu bytes of data, %d file%s\n", dt_escape(src, esc, sizeof esc), nt,
           (unsigned long long)bytes, dt_ckpt_world(ck), dt_ckpt_world(ck) == 1 ? "" : "s");
    for (size_t i = 0; i < dt_ckpt_meta_count(ck); i++) {
        const char *k, *v;
        char ek[256];
        dt_ckpt_meta_at(ck, i, &k, &v);
        printf("  meta %s = %s\n", dt_escape(k, ek, sizeof ek), dt_escape(v, esc, sizeof esc));
    }
    for (size_t i = 0; i < nt; i++) {
        dt_ckpt_tensor t;
        dt_ckpt_tensor_at(ck, i, &t);
        printf("  %-40s %-5s ", dt_escape(t.name, esc, sizeof esc), dt_st_dtype_name(t.dtype));
        print_shape(t.shape, t.ndim);
        printf(" %zu piece%s\n", t.nchunks, t.nchunks == 1 ? "" : "s");
    }
    return 0;
}

/* Run state beside the weights in a dtrain checkpoint: the optimizer's
 * moments, the fp32 masters of low-precision parameters, PowerSGD's state. */
static bool run_state_tensor(const char *name)
{
    return !strncmp(name, "optim.", 6) || !strncmp(name, "master.", 7) || !strncmp(name, "powersgd.", 9);
}

/* The names a tied tensor has in model.state_dict() but a dtrain checkpoint
 * stores once (GPT-2's head shares the token embedding). */
static const struct {
    const char *stored, *alias;
} k_tied[] = {{"transformer.wte.weight", "lm_head.weight"}};

/* One safetensors file with every tensor whole, one tensor in memory at a
 * time: the model's state_dict (parameters under every name they have in
 * PyTorch, tied ones included, and buffers), or with all also the run state
 * (optimizer moments, masters). */
static int convert_full(dt_ckpt *ck, const char *dst, bool all)
{
    size_t nt = dt_ckpt_num_tensors(ck), cap = nt + sizeof k_tied / sizeof k_tied[0];
    dt_st_desc *d = calloc(cap ? cap : 1, sizeof *d);
    size_t *src = calloc(cap ? cap : 1, sizeof *src), no = 0, skipped = 0;
    size_t nm = dt_ckpt_meta_count(ck);
    dt_st_kv *meta = calloc(nm + 1, sizeof *meta);
    dt_st_writer *w = NULL;
    int rc = 1;
    bool wr = false; /* the failure is the destination's */
    if (!d || !meta || !src) {
        dt_error(DT_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    bool has_format = false;
    for (size_t i = 0; i < nm; i++) {
        dt_ckpt_meta_at(ck, i, &meta[i].key, &meta[i].value);
        has_format |= !strcmp(meta[i].key, "format");
    }
    if (!has_format) /* what safetensors.torch.save_file/save_model write; transformers checks it */
        meta[nm++] = (dt_st_kv){.key = "format", .value = "pt"};
    for (size_t i = 0; i < nt; i++) {
        dt_ckpt_tensor t;
        dt_ckpt_tensor_at(ck, i, &t);
        if (!all && run_state_tensor(t.name)) {
            skipped++;
            continue;
        }
        src[no] = i;
        d[no] = (dt_st_desc){.name = t.name, .dtype = t.dtype, .ndim = t.ndim};
        memcpy(d[no++].shape, t.shape, sizeof d[0].shape);
    }
    for (size_t k = 0; k < sizeof k_tied / sizeof k_tied[0]; k++) {
        int64_t i = dt_ckpt_find(ck, k_tied[k].stored);
        if (i < 0 || dt_ckpt_find(ck, k_tied[k].alias) >= 0)
            continue;
        dt_ckpt_tensor t;
        dt_ckpt_tensor_at(ck, (size_t)i, &t);
        src[no] = (size_t)i;
        d[no] = (dt_st_desc){.name = k_tied[k].alias, .dtype = t.dtype, .ndim = t.ndim};
        memcpy(d[no++].shape, t.shape, sizeof d[0].shape);
    }
    if (dt_st_writer_open(dst, d, no, meta, nm, &w) < 0) {
        wr = true;
        goto out;
    }
    for (size_t o = 0; o < no; o++) {
        dt_ckpt_tensor t;
        dt_ckpt_tensor_at(ck, src[o], &t);
        size_t nb = (size_t)(t.numel * dt_st_dtype_size(t.dtype));
        void *buf = malloc(nb ? nb : 1);
        if (!buf) {
            dt_error(DT_ERR_NO_MEMORY, "tensor '%s': out of memory for %zu bytes", t.name, nb);
            goto out;
        }
        dt_status st = dt_ckpt_read(ck, src[o], 0, t.numel, buf, true);
        if (st == DT_OK) {
            st = dt_st_writer_write(w, o, buf, nb);
            wr = st < 0;
        }
        free(buf);
        if (st < 0)
            goto out;
    }
    if (dt_st_writer_commit(w, NULL) < 0) {
        wr = true;
        goto out;
    }
    char esc[512];
    printf("wrote %s: %zu tensors", dt_escape(dst, esc, sizeof esc), no);
    if (skipped)
        printf(" (the model's state_dict; %zu tensors of run state left out: --with-optimizer keeps them)", skipped);
    printf("\n");
    rc = 0;
out:
    dt_st_writer_close(w);
    free(d);
    free(src);
    free(meta);
    return rc ? (wr ? fail_write("convert") : fail("convert")) : 0;
}

/* A checkpoint directory as `world` ranks with equal ranges of all tensors end to end. */
static int convert_ranks(dt_ckpt *ck, const char *dst, int world)
{
    size_t nt = dt_ckpt_num_tensors(ck);
    dt_ckpt_entry **ranks = calloc((size_t)world, sizeof *ranks);
    size_t nm = dt_ckpt_meta_count(ck);
    dt_st_kv *meta = calloc(nm ? nm : 1, sizeof *meta);
    int rc = 1;
    bool wr = false; /* the failure is the destination's */
    if (!ranks || !meta) {
        dt_error(DT_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nm; i++)
        dt_ckpt_meta_at(ck, i, &meta[i].key, &meta[i].value);
    uint64_t total = 0;
    for (size_t i = 0; i < nt; i++) {
        dt_ckpt_tensor t;
        dt_ckpt_tensor_at(ck, i, &t);
        total += t.numel;
    }
    uint64_t per = (total + (uint64_t)world - 1) / (uint64_t)world;
    for (int r = 0; r < world; r++) {
        if (!(ranks[r] = calloc(nt ? nt : 1, sizeof **ranks))) {
            dt_error(DT_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
        uint64_t flo = per * (uint64_t)r, fhi = flo + per < total ? flo + per : total, off = 0;
        for (size_t i = 0; i < nt; i++) {
            dt_ckpt_tensor t;
            dt_ckpt_tensor_at(ck, i, &t);
            dt_ckpt_entry *e = &ranks[r][i];
            e->name = t.name;
            if (dt_st_dtype_to(t.dtype, &e->dtype) < 0) {
                dt_error_wrap(dt_last_status(), "tensor '%s'", t.name);
                goto out;
            }
            e->ndim = t.ndim;
            memcpy(e->shape, t.shape, sizeof e->shape);
            uint64_t a = flo > off ? flo : off, b = fhi < off + t.numel ? fhi : off + t.numel;
            if (a < b) {
                e->lo = a - off;
                e->hi = b - off;
                if (!(e->data = malloc((size_t)(b - a) * dt_dtype_size(e->dtype)))) {
                    dt_error(DT_ERR_NO_MEMORY, "out of memory");
                    goto out;
                }
                if (dt_ckpt_read(ck, i, e->lo, e->hi, e->data, true) < 0)
                    goto out;
            }
            off += t.numel;
        }
    }
    dt_ckpt_save_params p = dt_ckpt_save_params_default();
    p.meta = meta;
    p.nmeta = nm;
    if (dt_ckpt_save_ranks(dst, (const dt_ckpt_entry *const *)ranks, world, nt, &p) < 0) {
        wr = true;
        goto out;
    }
    char esc[512];
    printf("wrote %s: %zu tensors, %d ranks\n", dt_escape(dst, esc, sizeof esc), nt, world);
    rc = 0;
out:
    for (int r = 0; ranks && r < world; r++) {
        for (size_t i = 0; ranks[r] && i < nt; i++)
            free(ranks[r][i].data);
        free(ranks[r]);
    }
    free(ranks);
    free(meta);
    return rc ? (wr ? fail_write("convert") : fail("convert")) : 0;
}

/* --hf OUT: the model the checkpoint was trained with (its saved options,
 * or --model) as a Hugging Face model directory. */
static int convert_hf(const char *src, const char *out, const char *model, uint64_t shard, dt_dtype dtype,
                      const char *tokenizer)
{
    dt_model_config cfg = dt_model_config_default();
    char *js = NULL, name[1100] = "";
    if (model)
        snprintf(name, sizeof name, "%s", model);
    if (dt_trainer_ckpt_user(src, &js) >= 0) {
        cJSON *u = cJSON_Parse(js);
        dt_trainer_run_state_free(js);
        const cJSON *mv = cJSON_GetObjectItemCaseSensitive(u, "model");
        if (!name[0] && cJSON_IsString(mv))
            snprintf(name, sizeof name, "%s", mv->valuestring);
        const char *keys[] = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"};
        int64_t *dstv[] = {&cfg.n_layer, &cfg.n_head, &cfg.n_embd, &cfg.block_size, &cfg.vocab_size};
        for (int i = 0; i < 5; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(u, keys[i]);
            if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1e9)
                *dstv[i] = (int64_t)v->valuedouble;
        }
        const cJSON *dr = cJSON_GetObjectItemCaseSensitive(u, "dropout"); /* the run's: config.json keeps it */
        if (cJSON_IsNumber(dr) && dr->valuedouble > 0 && dr->valuedouble < 1)
            cfg.dropout = (float)dr->valuedouble;
        cJSON_Delete(u);
    }
    if (!name[0]) {
        dt__cli_err("dtrain ckpt convert: --hf: %s keeps no model name (not saved by dtrain train): give --model "
                    "NAME\n", src);
        return 2;
    }
    dt_hf_config h;
    dt_hf_save_params p = dt_hf_save_params_default();
    if (shard)
        p.max_shard_bytes = shard;
    p.dtype = dtype;
    dt__tuning tu; /* a LoRA run's adapters are merged into their layers (PEFT's merge_and_unload) */
    dt_lora_params lp;
    memset(&tu, 0, sizeof tu);
    if (dt__tuning_read(src, &tu) >= 0 && tu.lora_targets && dt__tuning_lora(&tu, &lp) >= 0) /* tu holds lp's */
        p.lora_scaling = dt_lora_scaling(&lp), p.lora = &lp;
    dt_error_clear();
    char tokp[4200];
    p.tokenizer = tokenizer ? tokenizer : dt_hf_dir_tokenizer(name, tokp, sizeof tokp) ? tokp : NULL;
    p.generation_from = !strncmp(name, "hf:", 3) ? name + 3 : NULL; /* the directory's sampling settings */
    if (dt_model_hf_config(name, &cfg, &h) < 0 || dt_hf_save(src, &h, out, &p) < 0) {
        dt__tuning_free(&tu);
        return dt_last_status() == DT_ERR_IO ? fail_write("convert --hf") : fail("convert --hf");
    }
    dt__tuning_free(&tu);
    char esc[512];
    printf("wrote %s: a Hugging Face %s directory\n", dt_escape(out, esc, sizeof esc), h.architecture);
    return 0;
}

/* A directory without index.json (a checkpoint has one). */
static bool is_save_dir(const char *path)
{
    struct stat sb;
    char idx[4200];
    snprintf(idx, sizeof idx, "%s/index.json", path);
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && lstat(idx, &sb) != 0;
}

int dt_cmd_ckpt(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *verb = argv[1], *src = NULL, *dst = NULL, *hf = NULL, *model = NULL, *tokenizer = NULL;
    bool full = false, with_optim = false;
    int64_t nranks = 0;
    uint64_t shard = 0;
    dt_dtype hf_dtype = DT_F32;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc)
            dst = argv[++i];
        else if (!strcmp(argv[i], "--hf") && i + 1 < argc)
            hf = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = dt__cli_hf_model(argv[++i]);
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            tokenizer = argv[++i];
        else if (!strcmp(argv[i], "--hf-shard-size") && i + 1 < argc) {
            if (dt_parse_uint("--hf-shard-size", argv[++i], 1, UINT64_MAX, &shard) < 0) {
                dt__cli_err("dtrain ckpt: %s\n", dt_last_error());
                return 2;
            }
        } else if (!strcmp(argv[i], "--hf-dtype") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "f32") || !strcmp(v, "bf16") || !strcmp(v, "f16"))
                hf_dtype = !strcmp(v, "bf16") ? DT_BF16 : !strcmp(v, "f16") ? DT_F16 : DT_F32;
            else {
                dt__cli_err("dtrain ckpt: --hf-dtype %s: expected f32, bf16 or f16\n", v);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--full"))
            full = true;
        else if (!strcmp(argv[i], "--with-optimizer"))
            with_optim = true;
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) {
            if (dt_parse_int("--ranks", argv[++i], 1, 4096, &nranks) < 0) {
                dt__cli_err("dtrain ckpt: %s\n", dt_last_error());
                return 2;
            }
        } else if (argv[i][0] == '-' || src) {
            dt__cli_err("dtrain ckpt: unexpected argument '%s' (dtrain ckpt --help)\n", argv[i]);
            return 2;
        } else
            src = argv[i];
    }
    bool conv = !strcmp(verb, "convert");
    int rc;
    if (strcmp(verb, "info") && strcmp(verb, "verify") && !conv) {
        dt__cli_err("dtrain ckpt: unknown command '%s' (info, verify or convert)\n", verb);
        return 2;
    }
    if (!src) {
        dt__cli_err("dtrain ckpt %s: no checkpoint given (dtrain ckpt --help)\n", verb);
        return 2;
    }
    if (hf && (!conv || dst || full || nranks || with_optim)) {
        dt__cli_err("dtrain ckpt %s: --hf OUT goes with convert alone (not -o, --full, --ranks)\n", verb);
        return 2;
    }
    if ((model || shard || tokenizer) && !hf) {
        dt__cli_err("dtrain ckpt %s: --model, --tokenizer and --hf-shard-size go with --hf OUT\n", verb);
        return 2;
    }
    if (hf && dt_hf_save_check_out(hf) < 0) /* before reading anything */
        return fail("convert --hf");
    if (!hf && (conv ? (!dst || full == (nranks > 0) || (with_optim && !full)) : (dst || full || nranks || with_optim))) {
        dt__cli_err("dtrain ckpt %s: %s\n", verb,
                    conv ? "needs -o DST and one of --full [--with-optimizer] or --ranks N" : "takes only SRC");
        return 2;
    }
    if (conv && !hf && (rc = check_dst(dst, full)))
        return rc; /* before reading anything */
    /* a `dtrain train --save` directory: its newest checkpoint, as eval and --resume take it */
    char newest[4096];
    if (is_save_dir(src) && dt_trainer_ckpt_latest(src, newest, sizeof newest) >= 0 && newest[0]) {
        char esc[512];
        fprintf(stderr, "dtrain ckpt %s: %s is a save directory: its newest checkpoint, %s\n", verb,
                dt_escape(src, esc, sizeof esc), dt_escape(newest, esc + 256, 256));
        src = newest;
    }
    if (hf)
        return convert_hf(src, hf, model, shard, hf_dtype, tokenizer);
    dt_ckpt *ck;
    if (dt_ckpt_open(src, &ck) < 0)
        return fail(verb);
    if (!strcmp(verb, "info"))
        rc = info(ck, src);
    else if (!strcmp(verb, "verify")) {
        if (dt_ckpt_verify(ck) < 0)
            rc = fail("verify");
        else {
            char esc[512];
            printf("ok: %s: %zu tensors in %d file%s, checksums and coverage verified\n",
                   dt_escape(src, esc, sizeof esc), dt_ckpt_num_tensors(ck), dt_ckpt_world(ck),
                   dt_ckpt_world(ck) == 1 ? "" : "s");
            rc = 0;
        }
    } else
        rc = full ? convert_full(ck, dst, with_optim) : convert_ranks(ck, dst, (int)nranks);
    dt_ckpt_close(ck);
    return rc;
}
