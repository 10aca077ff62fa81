/* Checkpoints: the resharding matrix (saved by 1, 2, 3, 4 simulated ranks
 * holding tensors whole (DDP) or as equal ranges of one flat buffer (ZeRO),
 * loaded by every other layout; parameters and optimizer state checked
 * element for element), deduplication of replicas, the full state dict,
 * the index and checksum checks, and every refusal. */
#include "dtrain/ckpt.h"
#include "dtrain/models.h"
#include "dtrain/optim.h"
#include "test.h"
#include "ckpt/ckpt_util.h"

#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_dir, name);
}

static dt_status save_sim(const char *dir, int w, layout L)
{
    dt_ckpt_entry e[4][NT];
    const dt_ckpt_entry *ranks[4];
    for (int r = 0; r < w; r++) {
        make_entries(e[r], r, w, L, true);
        ranks[r] = e[r];
    }
    dt_st_kv meta[1] = {{"step", "100"}};
    dt_ckpt_save_params p = dt_ckpt_save_params_default();
    p.meta = meta;
    p.nmeta = 1;
    dt_status st = dt_ckpt_save_ranks(dir, ranks, w, NT, &p);
    for (int r = 0; r < w; r++)
        free_entries(e[r]);
    return st;
}

TEST(resharding_matrix)
{
    int fails = 0;
    for (int w = 1; w <= 4; w++)
        for (int L = 0; L < 2; L++) {
            char dir[256], nm[64];
            snprintf(nm, sizeof nm, "m-%d-%d", w, L);
            path_in(dir, sizeof dir, nm);
            ASSERT_OK(save_sim(dir, w, (layout)L));
            dt_ckpt *ck;
            ASSERT_OK(dt_ckpt_open(dir, &ck));
            ASSERT_EQ_INT(dt_ckpt_world(ck), w);
            ASSERT_EQ_U64(dt_ckpt_num_tensors(ck), NT);
            ASSERT_STR_EQ(dt_ckpt_meta(ck, "step"), "100");
            ASSERT_OK(dt_ckpt_verify(ck));
            dt_ckpt_close(ck);
            for (int w2 = 1; w2 <= 4; w2++)
                for (int L2 = 0; L2 < 2; L2++)
                    for (int r = 0; r < w2; r++) {
                        dt_ckpt_entry e[NT];
                        make_entries(e, r, w2, (layout)L2, false);
                        dt_status st = dt_ckpt_load(dir, e, NT, NULL, NULL);
                        if (st < 0 || check_entries(e)) {
                            fprintf(stderr, "saved w=%d %s, loaded w=%d %s rank %d: %s\n", w, L ? "range" : "whole",
                                    w2, L2 ? "range" : "whole", r, st < 0 ? dt_last_error() : "wrong values");
                            fails++;
                        }
                        free_entries(e);
                    }
        }
    ASSERT_EQ_INT(fails, 0);
}

static uint64_t dir_bytes(const char *dir, int *nfiles)
{
    uint64_t sum = 0;
    *nfiles = 0;
    for (int r = 0; r < 8; r++) {
        char p[512];
        snprintf(p, sizeof p, "%s/rank-%05d.safetensors", dir, r);
        dt_st_file *f;
        if (dt_st_open(p, &f) < 0)
            continue;
        (*nfiles)++;
        for (size_t i = 0; i < dt_st_count(f); i++)
            sum += dt_st_tensor_at(f, i)->nbytes;
        dt_st_close(f);
    }
    return sum;
}

/* Replicas are written once, and the writing is shared between them. */
TEST(replicas_written_once_and_shared)
{
    uint64_t want = 0;
    for (int k = 0; k < NT; k++)
        want += numel_of(k) * dt_dtype_size(T[k].dtype);
    char dir[256];
    path_in(dir, sizeof dir, "dedup");
    ASSERT_OK(save_sim(dir, 3, WHOLE));
    int nf;
    ASSERT_EQ_U64(dir_bytes(dir, &nf), want);
    ASSERT_EQ_INT(nf, 3);
    /* every rank wrote something: with 3 whole replicas the tensors are dealt out */
    for (int r = 0; r < 3; r++) {
        char p[512];
        snprintf(p, sizeof p, "%s/rank-%05d.safetensors", dir, r);
        dt_st_file *f;
        ASSERT_OK(dt_st_open(p, &f));
        ASSERT(dt_st_count(f) >= 1);
        dt_st_close(f);
    }
}

TEST(full_state_dict)
{
    char path[256];
    path_in(path, sizeof path, "full.safetensors");
    dt_ckpt_entry e[NT];
    make_entries(e, 0, 1, WHOLE, true);
    dt_st_kv meta[1] = {{"format", "pt"}};
    dt_ckpt_save_params p = dt_ckpt_save_params_default();
    p.meta = meta;
    p.nmeta = 1;
    ASSERT_OK(dt_ckpt_save_full(path, e, NT, &p, NULL));
    free_entries(e);
    dt_st_file *f;
    ASSERT_OK(dt_st_open(path, &f));
    ASSERT_EQ_U64(dt_st_count(f), NT);
    ASSERT_STR_EQ(dt_st_meta(f, "format"), "pt");
    const dt_st_tensor *t = dt_st_find(f, "layer1.0.weight");
    ASSERT(t && t->ndim == 3 && t->shape[0] == 5 && t->shape[1] == 1 && t->shape[2] == 7 && t->dtype == DT_ST_F32);
    float w[35];
    ASSERT_OK(dt_st_read(f, t, 0, sizeof w, w));
    for (int i = 0; i < 35; i++)
        ASSERT_EQ_INT(w[i] == (float)value(0, (uint64_t)i), 1);
    t = dt_st_find(f, "layer1.1.num_batches_tracked");
    ASSERT(t && t->ndim == 0 && t->dtype == DT_ST_I64);
    t = dt_st_find(f, "fc.weight");
    ASSERT(t && t->dtype == DT_ST_BF16);
    dt_st_close(f);
    /* a single file loads like a checkpoint, into any layout */
    for (int r = 0; r < 3; r++) {
        make_entries(e, r, 3, RANGE, false);
        ASSERT_OK(dt_ckpt_load(path, e, NT, NULL, NULL));
        ASSERT_EQ_INT(check_entries(e), 0);
        free_entries(e);
    }
}

static int count_tmp(void)
{
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL)
        if (strstr(de->d_name, ".tmp-") || strstr(de->d_name, ".old-"))
            n++;
    if (d)
        closedir(d);
    return n;
}

TEST(save_refusals)
{
    char dir[256];
    path_in(dir, sizeof dir, "refuse");
    dt_ckpt_entry e[2][NT];
    make_entries(e[0], 0, 2, RANGE, true);
    make_entries(e[1], 1, 2, RANGE, true);
    const dt_ckpt_entry *ranks[2] = {e[0], e[1]};
    /* elements nobody holds */
    uint64_t keep = e[1][5].lo; /* optim.layer1.0.weight.exp_avg is all rank 1's */
    e[1][5].lo = e[1][5].hi;
    ASSERT_STATUS(dt_ckpt_save_ranks(dir, ranks, 2, NT, NULL), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "tensor 'optim.layer1.0.weight.exp_avg': elements [0, 35)");
    ASSERT_STR_CONTAINS(dt_last_error(), "held by no rank");
    e[1][5].lo = keep;
    /* ranks disagree on a shape */
    e[1][3].shape[1] = 4;
    ASSERT_STATUS(dt_ckpt_save_ranks(dir, ranks, 2, NT, NULL), DT_ERR_MISMATCH);
    e[1][3].shape[1] = 3;
    /* a range outside the tensor, a duplicate name, no data */
    e[0][1].hi = 99;
    ASSERT_STATUS(dt_ckpt_save_ranks(dir, ranks, 2, NT, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "'layer1.0.bias'");
    e[0][1].hi = 5;
    ASSERT_EQ_INT(access(dir, F_OK), -1);
    ASSERT_OK(dt_ckpt_save_ranks(dir, ranks, 2, NT, NULL));
    /* exists: refused, then replaced with overwrite */
    ASSERT_STATUS(dt_ckpt_save_ranks(dir, ranks, 2, NT, NULL), DT_ERR_STATE);
    ASSERT_STR_CONTAINS(dt_last_error(), "already exists");
    dt_ckpt_save_params p = dt_ckpt_save_params_default();
    p.overwrite = true;
    ASSERT_STATUS(dt_ckpt_save_ranks(dir, ranks, 1, NT, &p), DT_ERR_RANGE); /* rank 0's range alone */
    ASSERT_EQ_INT(access(dir, F_OK), 0); /* the old one is untouched */
    dt_ckpt_entry whole[NT];
    make_entries(whole, 0, 1, WHOLE, true);
    const dt_ckpt_entry *one[1] = {whole};
    ASSERT_OK(dt_ckpt_save_ranks(dir, one, 1, NT, &p));
    free_entries(whole);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open(dir, &ck));
    ASSERT_EQ_INT(dt_ckpt_world(ck), 1);
    dt_ckpt_close(ck);
    /* no temporary or old directory is left behind by any of the above */
    ASSERT_EQ_INT(count_tmp(), 0);
    free_entries(e[0]);
    free_entries(e[1]);
    /* through the collective entry point without a group (rank 0 of 1) */
    char d2[256];
    path_in(d2, sizeof d2, "single");
    make_entries(whole, 0, 1, WHOLE, true);
    ASSERT_OK(dt_ckpt_save(d2, whole, NT, NULL, NULL));
    /* an empty dir was written in full, then "cannot rename .tmp-XXXXXX to : No such file or directory" */
    ASSERT_STATUS(dt_ckpt_save("", whole, NT, NULL, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "empty dir");
    ASSERT_STATUS(dt_ckpt_save_ranks("", one, 1, NT, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_ckpt_save_ranks(d2, one, 0, NT, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "world < 1");
    /* a directory named with a trailing slash ("out/", as a shell completes it): its temporary went
       inside it, out/.tmp-XXXXXX, and failed (out does not exist yet) */
    char d3[256], d4[256];
    path_in(d3, sizeof d3, "slash//");
    path_in(d4, sizeof d4, "slash2/");
    ASSERT_OK(dt_ckpt_save_ranks(d3, one, 1, NT, NULL));
    ASSERT_OK(dt_ckpt_save(d4, whole, NT, NULL, NULL));
    ASSERT_EQ_INT(count_tmp(), 0);
    free_entries(whole);
    make_entries(whole, 0, 1, WHOLE, false);
    ASSERT_OK(dt_ckpt_load(d2, whole, NT, NULL, NULL));
    ASSERT_EQ_INT(check_entries(whole), 0);
    ASSERT_OK(dt_ckpt_load(d3, whole, NT, NULL, NULL));
    ASSERT_EQ_INT(check_entries(whole), 0);
    ASSERT_OK(dt_ckpt_load(d4, whole, NT, NULL, NULL));
    ASSERT_EQ_INT(check_entries(whole), 0);
    free_entries(whole);
}

/* A job killed while its save replaces a checkpoint of the same step (a
 * re-save after a resume): the directory must hold a complete checkpoint,
 * the old or the new one, at every instant. It was moved aside first and
 * the new one renamed in after: killed between the two, DIR was gone (a
 * resume then took an older checkpoint, or none). */
TEST(replace_killed_midway)
{
    char dir[256];
    path_in(dir, sizeof dir, "replace");
    ASSERT_OK(save_sim(dir, 2, RANGE));
    pid_t pid = dt_test_fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        setenv("DT_FAULT_CKPT_KILL_COMMIT", "1", 1);
        dt_ckpt_entry whole[NT];
        make_entries(whole, 0, 1, WHOLE, true);
        const dt_ckpt_entry *one[1] = {whole};
        dt_ckpt_save_params p = dt_ckpt_save_params_default();
        p.overwrite = true;
        dt_ckpt_save_ranks(dir, one, 1, NT, &p);
        _exit(3); /* not reached: killed in the commit */
    }
    int status = 0;
    ASSERT_EQ_INT(dt_test_waitpid(pid, &status, 0), pid);
    ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open(dir, &ck));
    ASSERT_OK(dt_ckpt_verify(ck));
    dt_ckpt_close(ck);
    dt_ckpt_entry e[NT];
    make_entries(e, 0, 1, WHOLE, false);
    ASSERT_OK(dt_ckpt_load(dir, e, NT, NULL, NULL));
    ASSERT_EQ_INT(check_entries(e), 0);
    free_entries(e);
}

static void write_text(const char *path, const char *txt)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(txt, f);
        fclose(f);
    }
}

TEST(load_refusals)
{
    char dir[256], p[512];
    path_in(dir, sizeof dir, "lr");
    ASSERT_OK(save_sim(dir, 2, RANGE));
    dt_ckpt_entry e[NT];
    make_entries(e, 0, 1, WHOLE, false);
    /* shape and dtype mismatches name the tensor and both sides */
    e[0].shape[2] = 8;
    ASSERT_STATUS(dt_ckpt_load(dir, e, NT, NULL, NULL), DT_ERR_SHAPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "tensor 'layer1.0.weight': shape [5,1,7] in checkpoint, [5,1,8] here");
    e[0].shape[2] = 7;
    e[3].dtype = DT_F16;
    ASSERT_STATUS(dt_ckpt_load(dir, e, NT, NULL, NULL), DT_ERR_DTYPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "tensor 'fc.weight': dtype BF16 in checkpoint, F16 here");
    e[3].dtype = DT_BF16;
    /* a tensor the checkpoint lacks */
    dt_ckpt_entry extra[NT + 1];
    memcpy(extra, e, sizeof e);
    extra[NT] = (dt_ckpt_entry){.name = "new.bias", .dtype = DT_F32, .ndim = 1, .shape = {2}};
    ASSERT_STATUS(dt_ckpt_load(dir, extra, NT + 1, NULL, NULL), DT_ERR_NOT_FOUND);
    ASSERT_STR_CONTAINS(dt_last_error(), "tensor 'new.bias' is not in the checkpoint");
    dt_ckpt_load_params lp = dt_ckpt_load_params_default();
    lp.allow_missing = true;
    size_t missing = 0;
    ASSERT_OK(dt_ckpt_load(dir, extra, NT + 1, &lp, &missing));
    ASSERT_EQ_U64(missing, 1);
    ASSERT_EQ_INT(check_entries(e), 0);
    /* a damaged file: its CRC, naming it */
    snprintf(p, sizeof p, "%s/rank-00001.safetensors", dir);
    FILE *f = fopen(p, "r+b");
    ASSERT(f != NULL);
    fseek(f, -3, SEEK_END);
    int c = fgetc(f);
    fseek(f, -3, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
    ASSERT_STATUS(dt_ckpt_load(dir, e, NT, NULL, NULL), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "rank-00001.safetensors: CRC-32");
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open(dir, &ck));
    ASSERT_STATUS(dt_ckpt_verify(ck), DT_ERR_FORMAT);
    dt_ckpt_close(ck);
    lp.verify = false; /* unchecked, the read goes through */
    ASSERT_OK(dt_ckpt_load(dir, e, NT, &lp, NULL));
    /* truncated */
    ASSERT_EQ_INT(truncate(p, 20), 0);
    ASSERT_STATUS(dt_ckpt_load(dir, e, NT, NULL, NULL), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "rank-00001.safetensors");
    /* no index: incomplete */
    snprintf(p, sizeof p, "%s/index.json", dir);
    ASSERT_EQ_INT(unlink(p), 0);
    ASSERT_STATUS(dt_ckpt_load(dir, e, NT, NULL, NULL), DT_ERR_NOT_FOUND);
    ASSERT_STR_CONTAINS(dt_last_error(), "no index.json");
    ASSERT_STATUS(dt_ckpt_load("/nonexistent-dtrain-ckpt", e, NT, NULL, NULL), DT_ERR_NOT_FOUND);
    /* bad indexes */
    static const struct {
        const char *json;
        const char *msg;
    } bad[] = {
        {"[]", "not a JSON object"},
        {"{\"format\":\"x\"}", "not a dtrain checkpoint index"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":2}", "version 2"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"../x\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{}}",
         "must be a file name inside"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"chunks\":[{\"file\":0,\"lo\":0,\"hi\":2,\"key\":\"w\"}]}}}",
         "tensor 'w': elements [2, 4) are in no chunk"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"chunks\":[{\"file\":0,\"lo\":0,\"hi\":3,\"key\":\"w@0\"},"
         "{\"file\":0,\"lo\":2,\"hi\":4,\"key\":\"w@2\"}]}}}",
         "tensor 'w': elements [2, 3) are in two chunks"},
        /* keys of another tensor or range (swapped between files by an edit) would read the wrong bytes */
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"chunks\":[{\"file\":0,\"lo\":0,\"hi\":4,\"key\":\"v\"}]}}}",
         "tensor 'w': chunk [0, 4) in file 0 has the key 'v'"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"chunks\":[{\"file\":0,\"lo\":0,\"hi\":2,\"key\":\"w@2\"},"
         "{\"file\":0,\"lo\":2,\"hi\":4,\"key\":\"w@0\"}]}}}",
         "tensor 'w': chunk [0, 2) in file 0 has the key 'w@2'"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"chunks\":[{\"file\":0,\"lo\":0,\"hi\":2,\"key\":\"w\"},"
         "{\"file\":0,\"lo\":2,\"hi\":4,\"key\":\"w@2\"}]}}}",
         "tensor 'w': chunk [0, 2) in file 0 has the key 'w'"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"chunks\":[{\"file\":0,\"lo\":0,\"hi\":4,\"key\":\"wx\"}]}}}",
         "has the key 'wx'"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"chunks\":[{\"file\":1,\"lo\":0,\"hi\":4,\"key\":\"w\"}]}}}",
         "tensor 'w': chunk 0 (file 1"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"chunks\":[{\"file\":0,\"lo\":0,\"hi\":4,\"key\":\"w\","
         "\"dim\":1}]}}}",
         "and nothing else"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{\"w\":{\"dtype\":\"X9\",\"shape\":[4],\"chunks\":[]}}}",
         "tensor 'w': unknown dtype"},
        /* an edited index: trailing garbage, a key twice, a world that is not its files */
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],"
         "\"tensors\":{}} garbage",
         "text after the end of the JSON value"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"metadata\":{\"k\":\"1\",\"k\":\"2\"},"
         "\"files\":[{\"name\":\"a\",\"bytes\":1,\"crc32\":1}],\"tensors\":{}}",
         "the key \"metadata\".\"k\" appears twice"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"version\":1,\"files\":[{\"name\":\"a\",\"bytes\":1,"
         "\"crc32\":1}],\"tensors\":{}}",
         "the key \"version\" appears twice"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"world\":0,\"files\":[{\"name\":\"a\",\"bytes\":1,"
         "\"crc32\":1}],\"tensors\":{}}",
         "\"world\" must be the number of files (1)"},
        {"{\"format\":\"dtrain-checkpoint\",\"version\":1,\"world\":-3,\"files\":[{\"name\":\"a\",\"bytes\":1,"
         "\"crc32\":1}],\"tensors\":{}}",
         "\"world\" must be the number of files (1)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(p, bad[i].json);
        dt_status st = dt_ckpt_open(dir, &ck);
        if (st >= 0 || !strstr(dt_last_error(), bad[i].msg) || !strstr(dt_last_error(), "index.json")) {
            fprintf(stderr, "index %s: %s \"%s\", want \"%s\"\n", bad[i].json, dt_status_name(st), dt_last_error(),
                    bad[i].msg);
            ASSERT(0);
        }
    }
    free_entries(e);
}

/* A real model and optimizer: entries from the flats, saved and restored
 * into a fresh model and optimizer. */
TEST(model_and_optimizer_entries)
{
    dt_model *m, *m2;
    ASSERT_OK(dt_model_create("convnet", 1, NULL, &m, NULL));
    ASSERT_OK(dt_model_create("convnet", 2, NULL, &m2, NULL));
    const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32), *G = dt_model_flat(m, DT_FLAT_GRADS, DT_F32);
    const dt_flat *P2 = dt_model_flat(m2, DT_FLAT_PARAMS, DT_F32), *G2 = dt_model_flat(m2, DT_FLAT_GRADS, DT_F32);
    dt_sgd_params sp = dt_sgd_params_default();
    sp.momentum = 0.9;
    dt_optim_range r1 = {.params = P, .grads = G, .lo = 0, .hi = P->total};
    dt_optim_range r2 = {.params = P2, .grads = G2, .lo = 0, .hi = P2->total};
    dt_optim *o1, *o2;
    ASSERT_OK(dt_optim_sgd_init(&sp, &r1, 1, &o1));
    ASSERT_OK(dt_optim_sgd_init(&sp, &r2, 1, &o2));
    float *g = G->base;
    for (size_t i = 0; i < G->total; i++)
        g[i] = (float)((i % 13) * 0.01);
    ASSERT_OK(dt_optim_step(o1));
    float *mom;
    size_t nm;
    const char *sname;
    ASSERT_OK(dt_optim_state(o1, 0, 0, &sname, &mom, &nm));
    ASSERT_EQ_U64(nm, P->total);

    dt_ckpt_list *l;
    ASSERT_OK(dt_ckpt_list_init(&l));
    ASSERT_OK(dt_ckpt_list_add_model(l, m));
    char suffix[64];
    snprintf(suffix, sizeof suffix, ".%s", sname);
    ASSERT_OK(dt_ckpt_list_add_flat(l, m, DT_FLAT_PARAMS, DT_F32, 0, nm, mom, "optim.", suffix));
    char dir[256];
    path_in(dir, sizeof dir, "convnet");
    ASSERT_OK(dt_ckpt_save(dir, dt_ckpt_list_entries(l), dt_ckpt_list_count(l), NULL, NULL));
    char full[256];
    path_in(full, sizeof full, "convnet.safetensors");
    ASSERT_OK(dt_ckpt_save_full(full, dt_ckpt_list_entries(l), dt_ckpt_list_count(l), NULL, NULL));
    dt_ckpt_list_free(l);
    /* PyTorch's state_dict names */
    dt_st_file *f;
    ASSERT_OK(dt_st_open(full, &f));
    const char *want[] = {"layer1.0.weight", "layer1.0.bias", "layer1.1.weight", "layer1.1.running_mean",
                          "layer1.1.num_batches_tracked", "layer2.0.weight", "fc.weight", "fc.bias",
                          "optim.fc.weight.momentum_buffer"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!dt_st_find(f, want[i])) {
            fprintf(stderr, "missing %s\n", want[i]);
            ASSERT(0);
        }
    const dt_st_tensor *fw = dt_st_find(f, "fc.weight");
    ASSERT(fw->ndim == 2 && fw->shape[0] == 10 && fw->shape[1] == 1568);
    dt_st_close(f);

    /* restore into m2 / o2 */
    float *mom2;
    ASSERT_OK(dt_optim_state(o2, 0, 0, NULL, &mom2, &nm));
    ASSERT_OK(dt_ckpt_list_init(&l));
    ASSERT_OK(dt_ckpt_list_add_model(l, m2));
    ASSERT_OK(dt_ckpt_list_add_flat(l, m2, DT_FLAT_PARAMS, DT_F32, 0, nm, mom2, "optim.", suffix));
    ASSERT_OK(dt_ckpt_load(dir, dt_ckpt_list_entries(l), dt_ckpt_list_count(l), NULL, NULL));
    dt_ckpt_list_free(l);
    /* every tensor's elements (the alignment padding between them is not state) */
    for (size_t k = 0; k < dt_model_num_entries(m); k++) {
        dt_param_info pi;
        ASSERT_OK(dt_model_entry(m, k, &pi));
        if (pi.is_buffer || pi.dtype != DT_F32)
            continue;
        const float *a = (const float *)P->base + pi.offset, *b = (const float *)P2->base + pi.offset;
        ASSERT(memcmp(a, b, pi.numel * sizeof(float)) == 0);
        ASSERT(memcmp(mom + pi.offset, mom2 + pi.offset, pi.numel * sizeof(float)) == 0);
        ASSERT(a[0] != 0 || a[1] != 0 || pi.numel < 2);
    }
    const dt_flat *B = dt_model_flat(m, DT_FLAT_BUFFERS, DT_F32), *B2 = dt_model_flat(m2, DT_FLAT_BUFFERS, DT_F32);
    ASSERT(B && B2 && memcmp(B->base, B2->base, B->used * sizeof(float)) == 0);
    dt_optim_free(o1);
    dt_optim_free(o2);
    dt_model_free(m);
    dt_model_free(m2);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dt-test-ckpt-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(resharding_matrix);
    RUN(replicas_written_once_and_shared);
    RUN(full_state_dict);
    RUN(save_refusals);
    RUN(replace_killed_midway);
    RUN(load_refusals);
    RUN(model_and_optimizer_entries);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_REPORT();
}
