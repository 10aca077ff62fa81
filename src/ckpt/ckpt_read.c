/* Reading checkpoints (ckpt.h): the index of a checkpoint directory, or one
 * safetensors file seen as a checkpoint whose tensors are one chunk each.
 *
 * The index is validated completely at open: its format and version, file
 * names that are plain names inside the directory (never a path: a crafted
 * index cannot make us read elsewhere), and for every tensor chunks that
 * tile [0, numel) exactly. Files are opened on first use and checked once
 * against the size and checksum the index gives (CRC-32C, or zlib's CRC-32
 * in checkpoints written before it); each chunk's key must be a 1-D tensor
 * of the right dtype and length in its file. A load then reads exactly the
 * intersection of each requested range with each chunk.
 *
 * Two ways to verify. dt_ckpt_read with verify checksums a file whole
 * before its first read (a pass over the file, then the reads: the data
 * crosses the page cache twice). dt_ckpt_read_batch (and dt_ckpt_load, which
 * uses it) sorts its reads into file order and checksums the bytes as they
 * land in the destinations, in 4 MiB reads each checksummed right after it
 * (still in the CPU cache) while the kernel reads the next 4 MiB ahead
 * (POSIX_FADV_WILLNEED: the disk and the checksum overlap); the bytes between two requested ranges (and after the last)
 * are read for the checksum only. One pass; the file's sum is compared when
 * its last byte has been seen, so on a mismatch the destinations already
 * hold the damaged bytes (the call fails: the caller discards them). */
#include "base/json_strict.h"
#include "ckpt/ckpt_view.h"
#include "ckpt/st_impl.h"
#include "dtrain/ckpt.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define INDEX_NAME "index.json"
#define INDEX_FORMAT "dtrain-checkpoint"
#define INDEX_VERSION 1
#define MAX_INDEX_BYTES (1u << 30)

bool dt_ckpt_is_hf_dir(const char *dir)
{
    char p[4200];
    struct stat sb;
    if (!dir)
        return false;
    snprintf(p, sizeof p, "%s/%s", dir, INDEX_NAME);
    if (stat(p, &sb) == 0) /* a dtrain checkpoint */
        return false;
    snprintf(p, sizeof p, "%s/%s", dir, DT_HF_INDEX_NAME);
    if (stat(p, &sb) == 0)
        return true;
    snprintf(p, sizeof p, "%s/%s", dir, DT_HF_WEIGHTS_NAME);
    return stat(p, &sb) == 0;
}

dt_ckpt_load_params dt_ckpt_load_params_default(void)
{
    dt_ckpt_load_params p;
    memset(&p, 0, sizeof p);
    p.verify = true;
    return p;
}

typedef struct chunk {
    size_t file;
    uint64_t lo, hi;
    char *key;
} chunk;

typedef struct ctensor {
    char *name;
    dt_st_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    uint64_t numel;
    chunk *c;        /* sorted by lo, tiling [0, numel) */
    size_t nc;
} ctensor;

typedef struct cfile {
    char *path;
    bool has_crc;
    dt_ckpt_sum kind;    /* of crc */
    uint64_t bytes;
    uint32_t crc;
    dt_st_file *f;   /* opened on first use */
    bool verified;
} cfile;

struct dt_ckpt {
    char *src;
    cfile *files;
    size_t nfiles;
    ctensor *t;
    size_t nt;
    char **meta;     /* key, value, ... */
    size_t nmeta;
};

void dt_ckpt_close(dt_ckpt *ck)
{
    if (!ck)
        return;
    for (size_t i = 0; i < ck->nfiles; i++) {
        dt_st_close(ck->files[i].f);
        free(ck->files[i].path);
    }
    for (size_t i = 0; i < ck->nt; i++) {
        for (size_t j = 0; j < ck->t[i].nc; j++)
            free(ck->t[i].c[j].key);
        free(ck->t[i].c);
        free(ck->t[i].name);
    }
    for (size_t i = 0; i < 2 * ck->nmeta; i++)
        free(ck->meta[i]);
    free(ck->meta);
    free(ck->files);
    free(ck->t);
    free(ck->src);
    free(ck);
}

static bool json_u64(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double v = j->valuedouble;
    if (!(v >= 0 && v <= 9007199254740992.0) || v != (double)(uint64_t)v)
        return false;
    *out = (uint64_t)v;
    return true;
}

static int chunk_cmp(const void *a, const void *b)
{
    const chunk *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Append the safetensors file at path (opened and validated now) and its
 * tensors, each one chunk, to ck; its __metadata__ becomes ck's when ck has
 * none yet. */
static dt_status add_st_file(dt_ckpt *ck, const char *path)
{
    cfile *nf = realloc(ck->files, (ck->nfiles + 1) * sizeof *nf);
    if (!nf)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
    ck->files = nf;
    cfile *cf = &ck->files[ck->nfiles];
    memset(cf, 0, sizeof *cf);
    if (!(cf->path = strdup(path)))
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
    size_t fi = ck->nfiles++;
    dt_status st = dt_st_open(path, &cf->f);
    if (st < 0)
        return st;
    cf->verified = true; /* a plain file has no checksum to compare with */
    const dt_st_file *f = cf->f;
    size_t n = dt_st_count(f);
    ctensor *nt = realloc(ck->t, (ck->nt + n + 1) * sizeof *nt);
    if (!nt)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
    ck->t = nt;
    if (!ck->nmeta) {
        size_t nm = dt_st_meta_count(f);
        free(ck->meta);
        ck->meta = calloc(2 * nm + 1, sizeof *ck->meta);
        if (!ck->meta)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
        for (size_t i = 0; i < nm; i++) {
            const char *k, *v;
            dt_st_meta_at(f, i, &k, &v);
            ck->meta[2 * i] = strdup(k);
            ck->meta[2 * i + 1] = strdup(v);
            ck->nmeta++;
            if (!ck->meta[2 * i] || !ck->meta[2 * i + 1])
                return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
        }
    }
    for (size_t i = 0; i < n; i++) {
        const dt_st_tensor *s = dt_st_tensor_at(f, i);
        for (size_t k = 0; fi > 0 && k < ck->nt; k++)
            if (!strcmp(ck->t[k].name, s->name))
                return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is also in %s", path, s->name,
                                ck->files[ck->t[k].c[0].file].path);
        ctensor *t = &ck->t[ck->nt++];
        memset(t, 0, sizeof *t);
        t->name = strdup(s->name);
        t->dtype = s->dtype;
        t->ndim = s->ndim;
        memcpy(t->shape, s->shape, sizeof t->shape);
        t->numel = s->numel;
        t->c = calloc(1, sizeof *t->c);
        if (!t->name || !t->c)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
        t->c[0].file = fi; /* an empty tensor has no chunk, but remembers its file */
        if (s->numel) {
            if (!(t->c[0].key = strdup(s->name)))
                return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
            t->nc = 1;
            t->c[0].lo = 0;
            t->c[0].hi = s->numel;
        }
    }
    return DT_OK;
}

static dt_status open_single(dt_ckpt *ck)
{
    return add_st_file(ck, ck->src);
}

/* A Hugging Face model directory: model.safetensors, or (without one) the
 * shards that model.safetensors.index.json's weight_map names (each a plain
 * file name inside the directory; every tensor it names must be in that
 * file). */
static dt_status open_hf(dt_ckpt *ck, const char *ipath)
{
    char p[4200];
    if (!ipath) {
        snprintf(p, sizeof p, "%s/%s", ck->src, DT_HF_WEIGHTS_NAME);
        return add_st_file(ck, p);
    }
    char *txt = NULL;
    size_t len = 0;
    dt_status st = dt_file_read_all(ipath, MAX_INDEX_BYTES, &txt, &len);
    if (st < 0)
        return st;
    cJSON *root = NULL;
    st = dt__json_parse_strict(txt, len, ipath, &root);
    free(txt);
    if (st < 0)
        return st;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        cJSON_Delete(root);
        return dt_error(DT_ERR_FORMAT, "%s: key \"weight_map\" must be a non-empty object {tensor: file}", ipath);
    }
    for (const cJSON *x = wm->child; x && st >= 0; x = x->next) {
        const char *fn = cJSON_IsString(x) ? x->valuestring : NULL;
        if (!fn || !fn[0] || strchr(fn, '/') || !strcmp(fn, ".") || !strcmp(fn, "..")) {
            st = dt_error(DT_ERR_FORMAT, "%s: key \"weight_map\".\"%s\": the value must be a file name inside the "
                          "directory", ipath, x->string);
            break;
        }
        snprintf(p, sizeof p, "%s/%s", ck->src, fn);
        bool have = false;
        for (size_t f = 0; f < ck->nfiles && !have; f++)
            have = !strcmp(ck->files[f].path, p);
        struct stat sb;
        if (!have && stat(p, &sb) != 0)
            st = dt_error(DT_ERR_NOT_FOUND, "%s: key \"weight_map\".\"%s\" names %s, which does not exist", ipath,
                          x->string, fn);
        else if (!have)
            st = add_st_file(ck, p);
    }
    for (const cJSON *x = wm->child; x && st >= 0; x = x->next) {
        int64_t i = dt_ckpt_find(ck, x->string);
        snprintf(p, sizeof p, "%s/%s", ck->src, x->valuestring);
        if (i < 0 || strcmp(ck->files[ck->t[i].c[0].file].path, p))
            st = dt_error(DT_ERR_FORMAT, "%s: key \"weight_map\".\"%s\" says %s holds it; %s", ipath, x->string,
                          x->valuestring, i < 0 ? "no shard does" : "another shard does");
    }
    cJSON_Delete(root);
    return st;
}

/* The names of Gemma 3's image-text model and its text model (ckpt_view.h):
 * the language model's (to: the text model's prefix) and the vision
 * tower's and projector's (to NULL). */
static const struct {
    const char *from, *to;
} mm_names[] = {
    {"language_model.model.", "model."},     /* transformers' files, transformers 4's modules */
    {"model.language_model.", "model."},     /* transformers 5's modules (PEFT's keys) */
    {"language_model.lm_head.", "lm_head."}, /* transformers 4's head */
    {"lm_head.", "lm_head."},
    {"vision_tower.", NULL},
    {"model.vision_tower.", NULL},
    {"multi_modal_projector.", NULL},
    {"model.multi_modal_projector.", NULL},
};

dt__mm_part dt__mm_name(const char *name, const char **to, size_t *skip)
{
    for (size_t i = 0; i < sizeof mm_names / sizeof mm_names[0]; i++) {
        const size_t l = strlen(mm_names[i].from);
        if (!strncmp(name, mm_names[i].from, l)) {
            *to = mm_names[i].to;
            *skip = l;
            return mm_names[i].to ? DT__MM_LANGUAGE : DT__MM_VISION;
        }
    }
    return DT__MM_NONE;
}

dt_status dt__ckpt_rename(dt_ckpt *ck, dt__ckpt_rename_fn fn, void *ud, const char *what)
{
    /* every new name first, so that an error leaves ck as it was */
    char **nn = calloc(ck->nt + 1, sizeof *nn);
    dt_status st = nn ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", ck->src);
    for (size_t i = 0; st >= 0 && i < ck->nt; i++)
        st = fn(ck->t[i].name, ud, &nn[i]);
    for (size_t i = 0; st >= 0 && i < ck->nt; i++) /* pairwise, as dt_ckpt_find is linear */
        for (size_t j = 0; nn[i] && st >= 0 && j < i; j++)
            if (nn[j] && !strcmp(nn[i], nn[j]))
                st = dt_error(DT_ERR_FORMAT, "%s: %s '%s' is there twice (as '%s' and as '%s')", ck->src, what,
                              nn[i], ck->t[j].name, ck->t[i].name);
    if (st < 0) {
        for (size_t i = 0; nn && i < ck->nt; i++)
            free(nn[i]);
        free(nn);
        return st;
    }
    size_t kept = 0;
    for (size_t i = 0; i < ck->nt; i++) {
        ctensor *t = &ck->t[i];
        if (!nn[i]) { /* out of the view */
            for (size_t j = 0; j < t->nc; j++)
                free(t->c[j].key);
            free(t->c);
            free(t->name);
            continue;
        }
        free(t->name);
        t->name = nn[i];
        ck->t[kept++] = *t;
    }
    ck->nt = kept;
    free(nn);
    return DT_OK;
}

/* The text model's name of an image-text model's language-model tensor;
 * anything else (the vision tower, the projector) out of the view. */
static dt_status text_name(const char *name, void *ud, char **out)
{
    (void)ud;
    const char *to;
    size_t skip;
    *out = NULL;
    if (dt__mm_name(name, &to, &skip) != DT__MM_LANGUAGE)
        return DT_OK;
    if (!(*out = malloc(strlen(to) + strlen(name + skip) + 1)))
        return dt_error(DT_ERR_NO_MEMORY, "out of memory renaming '%s'", name);
    sprintf(*out, "%s%s", to, name + skip);
    return DT_OK;
}

/* An image-text model's directory (Gemma 3's Gemma3ForConditionalGeneration)
 * seen as its language model: the tensors of its language model under the
 * text model's names (dt__mm_name: transformers' files' language_model.model.,
 * its modules' model.language_model., the head language_model.lm_head. or
 * lm_head.), and the rest (the vision tower, the projector) left out of the
 * view. Only for a directory without a model.embed_tokens.weight of its own
 * and with one under an image-text name; the chunks keep the files' keys,
 * so reads are unchanged. Two tensors of one name in the view (a head under
 * both names) are refused. */
static dt_status language_model_view(dt_ckpt *ck)
{
    bool image_text = false;
    if (dt_ckpt_find(ck, "model.embed_tokens.weight") >= 0)
        return DT_OK;
    for (size_t i = 0; i < ck->nt && !image_text; i++) {
        const char *to;
        size_t skip;
        image_text = dt__mm_name(ck->t[i].name, &to, &skip) == DT__MM_LANGUAGE && !strcmp(to, "model.") &&
                     !strcmp(ck->t[i].name + skip, "embed_tokens.weight");
    }
    return image_text ? dt__ckpt_rename(ck, text_name, NULL, "the language model's tensor") : DT_OK;
}

static dt_status parse_index(dt_ckpt *ck, const char *ipath, const cJSON *root)
{
    const char *src = ck->src;
    if (!cJSON_IsObject(root))
        return dt_error(DT_ERR_FORMAT, "%s: not a JSON object", ipath);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, INDEX_FORMAT) != 0)
        return dt_error(DT_ERR_FORMAT, "%s: \"format\" is not \"%s\" (not a dtrain checkpoint index)", ipath,
                        INDEX_FORMAT);
    uint64_t v;
    if (!json_u64(ver, &v))
        return dt_error(DT_ERR_FORMAT, "%s: \"version\" is missing or not an integer", ipath);
    if (v != INDEX_VERSION)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: version %llu; this dtrain reads version %d", ipath,
                        (unsigned long long)v, INDEX_VERSION);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    if (meta) {
        if (!cJSON_IsObject(meta))
            return dt_error(DT_ERR_FORMAT, "%s: \"metadata\" is not an object", ipath);
        size_t nm = (size_t)cJSON_GetArraySize(meta);
        ck->meta = calloc(2 * nm + 1, sizeof *ck->meta);
        if (!ck->meta)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", ipath);
        for (const cJSON *x = meta->child; x; x = x->next) {
            if (!cJSON_IsString(x))
                return dt_error(DT_ERR_FORMAT, "%s: metadata \"%s\" is not a string", ipath, x->string);
            ck->meta[2 * ck->nmeta] = strdup(x->string);
            ck->meta[2 * ck->nmeta + 1] = strdup(x->valuestring);
            ck->nmeta++;
            if (!ck->meta[2 * ck->nmeta - 2] || !ck->meta[2 * ck->nmeta - 1])
                return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", ipath);
        }
    }
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) < 1)
        return dt_error(DT_ERR_FORMAT, "%s: \"files\" must be a non-empty array", ipath);
    size_t nf = (size_t)cJSON_GetArraySize(files);
    ck->files = calloc(nf, sizeof *ck->files);
    if (!ck->files)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", ipath);
    for (const cJSON *x = files->child; x; x = x->next) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(x, "name");
        const cJSON *by = cJSON_GetObjectItemCaseSensitive(x, "bytes");
        const cJSON *c32 = cJSON_GetObjectItemCaseSensitive(x, "crc32");
        const cJSON *c32c = cJSON_GetObjectItemCaseSensitive(x, "crc32c");
        const cJSON *cr = c32c ? c32c : c32;
        cfile *f = &ck->files[ck->nfiles];
        uint64_t c;
        if (!cJSON_IsString(nm) || !nm->valuestring[0] || strchr(nm->valuestring, '/') ||
            strcmp(nm->valuestring, ".") == 0 || strcmp(nm->valuestring, "..") == 0)
            return dt_error(DT_ERR_FORMAT, "%s: files[%zu]: \"name\" must be a file name inside the checkpoint", ipath,
                            ck->nfiles);
        if (c32 && c32c)
            return dt_error(DT_ERR_FORMAT, "%s: files[%zu] (%s): both \"crc32\" and \"crc32c\" (one checksum a file)",
                            ipath, ck->nfiles, nm->valuestring);
        if (!json_u64(by, &f->bytes) || !json_u64(cr, &c) || c > UINT32_MAX)
            return dt_error(DT_ERR_FORMAT,
                            "%s: files[%zu] (%s): \"bytes\" and \"crc32c\" (or \"crc32\") must be integers", ipath,
                            ck->nfiles, nm->valuestring);
        f->kind = c32c ? DT_SUM_CRC32C : DT_SUM_CRC32;
        f->crc = (uint32_t)c;
        f->has_crc = true;
        size_t pl = strlen(src) + strlen(nm->valuestring) + 2;
        if (!(f->path = malloc(pl)))
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", ipath);
        snprintf(f->path, pl, "%s/%s", src, nm->valuestring);
        ck->nfiles++;
    }
    /* "world": the ranks that wrote it, one file each (an old index may lack it) */
    const cJSON *wd = cJSON_GetObjectItemCaseSensitive(root, "world");
    uint64_t w = 0;
    if (wd && (!json_u64(wd, &w) || w != ck->nfiles))
        return dt_error(DT_ERR_FORMAT, "%s: \"world\" must be the number of files (%zu), an integer >= 1", ipath,
                        ck->nfiles);
    const cJSON *tens = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    if (!cJSON_IsObject(tens))
        return dt_error(DT_ERR_FORMAT, "%s: \"tensors\" must be an object", ipath);
    size_t nt = (size_t)cJSON_GetArraySize(tens);
    ck->t = calloc(nt ? nt : 1, sizeof *ck->t);
    if (!ck->t)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", ipath);
    for (const cJSON *x = tens->child; x; x = x->next) {
        const char *name = x->string;
        for (size_t i = 0; i < ck->nt; i++)
            if (strcmp(ck->t[i].name, name) == 0)
                return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' appears twice", ipath, name);
        ctensor *t = &ck->t[ck->nt];
        if (!(t->name = strdup(name)))
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", ipath);
        ck->nt++;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(x, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(x, "shape");
        const cJSON *ch = cJSON_GetObjectItemCaseSensitive(x, "chunks");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(ch))
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': needs \"dtype\", \"shape\" and \"chunks\"", ipath, name);
        dt_status st = dt_st_dtype_parse(dt->valuestring, &t->dtype);
        if (st < 0)
            return dt_error_wrap(st, "%s: tensor '%s'", ipath, name);
        int nd = cJSON_GetArraySize(sh);
        if (nd > DT_MAX_DIMS)
            return dt_error(DT_ERR_UNSUPPORTED, "%s: tensor '%s' has %d dimensions (at most %d)", ipath, name, nd,
                            DT_MAX_DIMS);
        t->ndim = nd;
        t->numel = 1;
        int d = 0;
        for (const cJSON *y = sh->child; y; y = y->next, d++) {
            uint64_t s;
            if (!json_u64(y, &s) || (s && t->numel > (1ull << 53) / s))
                return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a valid size", ipath, name, d);
            t->shape[d] = (int64_t)s;
            t->numel *= s;
        }
        size_t nc = (size_t)cJSON_GetArraySize(ch);
        t->c = calloc(nc ? nc : 1, sizeof *t->c);
        if (!t->c)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", ipath);
        for (const cJSON *y = ch->child; y; y = y->next) {
            chunk *c = &t->c[t->nc];
            uint64_t fi;
            const cJSON *key = cJSON_GetObjectItemCaseSensitive(y, "key");
            if (!cJSON_IsObject(y) || cJSON_GetArraySize(y) != 4 ||
                !json_u64(cJSON_GetObjectItemCaseSensitive(y, "file"), &fi) ||
                !json_u64(cJSON_GetObjectItemCaseSensitive(y, "lo"), &c->lo) ||
                !json_u64(cJSON_GetObjectItemCaseSensitive(y, "hi"), &c->hi) || !cJSON_IsString(key))
                return dt_error(DT_ERR_FORMAT,
                                "%s: tensor '%s': chunk %zu must be {\"file\", \"lo\", \"hi\", \"key\"} and nothing else",
                                ipath, name, t->nc);
            if (fi >= ck->nfiles || c->lo >= c->hi || c->hi > t->numel)
                return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': chunk %zu (file %llu, [%llu, %llu)) is out of range",
                                ipath, name, t->nc, (unsigned long long)fi, (unsigned long long)c->lo,
                                (unsigned long long)c->hi);
            c->file = (size_t)fi;
            if (!(c->key = strdup(key->valuestring)))
                return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", ipath);
            t->nc++;
        }
        qsort(t->c, t->nc, sizeof *t->c, chunk_cmp);
        /* the keys are those the writer gives (ckpt.c piece_key): the name where a file holds one piece of the
         * tensor, name@lo where it holds several; a key of another tensor or range (an edited index) would read
         * its bytes in place of these */
        const size_t nlen = strlen(name);
        for (size_t j = 0; j < t->nc; j++) {
            const char *k = t->c[j].key;
            bool ok = !strncmp(k, name, nlen);
            if (ok && k[nlen] == '@') {
                char want[32];
                snprintf(want, sizeof want, "%llu", (unsigned long long)t->c[j].lo);
                ok = !strcmp(k + nlen + 1, want);
            } else if (ok) {
                ok = !k[nlen];
                for (size_t i = 0; ok && i < t->nc; i++)
                    ok = i == j || t->c[i].file != t->c[j].file;
            }
            if (!ok)
                return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': chunk [%llu, %llu) in file %zu has the key '%.64s' "
                                "(dtrain writes '%s' where a file holds one piece of the tensor, '%s@LO' where it "
                                "holds several: an edited index?)", ipath, name, (unsigned long long)t->c[j].lo,
                                (unsigned long long)t->c[j].hi, t->c[j].file, k, name, name);
        }
        uint64_t pos = 0;
        for (size_t j = 0; j < t->nc; j++) {
            if (t->c[j].lo != pos)
                return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': elements [%llu, %llu) are %s", ipath, name,
                                (unsigned long long)(t->c[j].lo < pos ? t->c[j].lo : pos),
                                (unsigned long long)(t->c[j].lo < pos ? pos : t->c[j].lo),
                                t->c[j].lo < pos ? "in two chunks" : "in no chunk");
            pos = t->c[j].hi;
        }
        if (pos != t->numel)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': elements [%llu, %llu) are in no chunk", ipath, name,
                            (unsigned long long)pos, (unsigned long long)t->numel);
    }
    return DT_OK;
}

dt_status dt_ckpt_open(const char *src, dt_ckpt **out)
{
    if (out)
        *out = NULL;
    if (!src || !out)
        return dt_error(DT_ERR_NULL, "dt_ckpt_open: NULL argument");
    dt_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->src = strdup(src))) {
        free(ck);
        return dt_error(DT_ERR_NO_MEMORY, "dt_ckpt_open: out of memory");
    }
    struct stat sb;
    dt_status st;
    if (stat(src, &sb) != 0) {
        st = dt_error(DT_ERR_NOT_FOUND, "checkpoint %s does not exist", src);
    } else if (!S_ISDIR(sb.st_mode)) {
        st = open_single(ck);
    } else if (dt_ckpt_is_hf_dir(src)) {
        /* model.safetensors first, as transformers' from_pretrained: an index beside it is not read */
        char ip[4200], wp[4200];
        snprintf(ip, sizeof ip, "%s/%s", src, DT_HF_INDEX_NAME);
        snprintf(wp, sizeof wp, "%s/%s", src, DT_HF_WEIGHTS_NAME);
        struct stat ib;
        st = open_hf(ck, stat(wp, &ib) != 0 && stat(ip, &ib) == 0 ? ip : NULL);
        if (st >= 0)
            st = language_model_view(ck);
    } else {
        char ipath[4096];
        snprintf(ipath, sizeof ipath, "%s/%s", src, INDEX_NAME);
        char *txt = NULL;
        size_t len = 0;
        /* a regular file only, opened without blocking: a FIFO there is refused, never waited on */
        st = dt_file_read_all(ipath, MAX_INDEX_BYTES, &txt, &len);
        if (st == DT_ERR_NOT_FOUND)
            st = dt_error(DT_ERR_NOT_FOUND, "%s: no %s (an incomplete checkpoint, or not one)", src, INDEX_NAME);
        if (st >= 0) {
            cJSON *root = NULL;
            st = dt__json_parse_strict(txt, len, ipath, &root);
            if (st >= 0)
                st = parse_index(ck, ipath, root);
            cJSON_Delete(root);
        }
        free(txt);
    }
    if (st < 0) {
        dt_ckpt_close(ck);
        return st;
    }
    *out = ck;
    return DT_OK;
}

size_t dt_ckpt_num_tensors(const dt_ckpt *ck)
{
    return ck ? ck->nt : 0;
}

dt_status dt_ckpt_tensor_at(const dt_ckpt *ck, size_t i, dt_ckpt_tensor *out)
{
    if (!ck || !out)
        return dt_error(DT_ERR_NULL, "dt_ckpt_tensor_at: NULL argument");
    if (i >= ck->nt)
        return dt_error(DT_ERR_RANGE, "%s: tensor %zu of %zu", ck->src, i, ck->nt);
    const ctensor *t = &ck->t[i];
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->numel = t->numel;
    out->nchunks = t->nc;
    return DT_OK;
}

int64_t dt_ckpt_find(const dt_ckpt *ck, const char *name)
{
    if (!ck || !name)
        return -1;
    for (size_t i = 0; i < ck->nt; i++)
        if (strcmp(ck->t[i].name, name) == 0)
            return (int64_t)i;
    return -1;
}

int dt_ckpt_world(const dt_ckpt *ck)
{
    return ck ? (int)ck->nfiles : 0;
}

const char *dt_ckpt_meta(const dt_ckpt *ck, const char *key)
{
    if (!ck || !key)
        return NULL;
    for (size_t i = 0; i < ck->nmeta; i++)
        if (strcmp(ck->meta[2 * i], key) == 0)
            return ck->meta[2 * i + 1];
    return NULL;
}

size_t dt_ckpt_meta_count(const dt_ckpt *ck)
{
    return ck ? ck->nmeta : 0;
}

dt_status dt_ckpt_meta_at(const dt_ckpt *ck, size_t i, const char **key, const char **value)
{
    if (!ck)
        return dt_error(DT_ERR_NULL, "dt_ckpt_meta_at: NULL checkpoint");
    if (i >= ck->nmeta)
        return dt_error(DT_ERR_RANGE, "%s: metadata %zu of %zu", ck->src, i, ck->nmeta);
    if (key)
        *key = ck->meta[2 * i];
    if (value)
        *value = ck->meta[2 * i + 1];
    return DT_OK;
}

static dt_status sum_check(const cfile *f, uint32_t crc)
{
    if (crc != f->crc)
        return dt_error(DT_ERR_FORMAT, "%s: %s %08x, the index says %08x (the file is damaged)", f->path,
                        f->kind == DT_SUM_CRC32C ? "CRC-32C" : "CRC-32", crc, f->crc);
    return DT_OK;
}

/* File fi, opened (and with verify, checked against the index) on first use. */
static dt_status file_get(dt_ckpt *ck, size_t fi, bool verify, const dt_st_file **out)
{
    cfile *f = &ck->files[fi];
    dt_status st;
    if (!f->f && (st = dt_st_open(f->path, &f->f)) < 0)
        return st;
    if (verify && !f->verified) {
        if (f->has_crc && dt_st_file_size(f->f) != f->bytes)
            return dt_error(DT_ERR_FORMAT, "%s: %llu bytes, the index says %llu (truncated or replaced)", f->path,
                            (unsigned long long)dt_st_file_size(f->f), (unsigned long long)f->bytes);
        uint32_t crc;
        if (f->has_crc) {
            if ((st = dt_st_checksum(f->f, f->kind, &crc)) < 0)
                return st;
            if ((st = sum_check(f, crc)) < 0)
                return st;
        }
        f->verified = true;
    }
    *out = f->f;
    return DT_OK;
}

dt_status dt_ckpt_read(dt_ckpt *ck, size_t i, uint64_t lo, uint64_t hi, void *dst, bool verify)
{
    if (!ck || (hi > lo && !dst))
        return dt_error(DT_ERR_NULL, "dt_ckpt_read: NULL argument");
    if (i >= ck->nt)
        return dt_error(DT_ERR_RANGE, "%s: tensor %zu of %zu", ck->src, i, ck->nt);
    const ctensor *t = &ck->t[i];
    if (lo > hi || hi > t->numel)
        return dt_error(DT_ERR_RANGE, "%s: tensor '%s': range [%llu, %llu) outside its %llu elements", ck->src, t->name,
                        (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)t->numel);
    size_t es = dt_st_dtype_size(t->dtype);
    for (size_t j = 0; j < t->nc; j++) {
        const chunk *c = &t->c[j];
        uint64_t a = lo > c->lo ? lo : c->lo, b = hi < c->hi ? hi : c->hi;
        if (a >= b)
            continue;
        const dt_st_file *f;
        dt_status st = file_get(ck, c->file, verify, &f);
        if (st < 0)
            return st;
        const dt_st_tensor *s = dt_st_find(f, c->key);
        if (!s || s->dtype != t->dtype || s->numel != c->hi - c->lo)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': the piece '%s' for elements [%llu, %llu) is %s", dt_st_path(f),
                            t->name, c->key, (unsigned long long)c->lo, (unsigned long long)c->hi,
                            s ? "of another dtype or length than the index says" : "missing");
        if ((st = dt_st_read(f, s, (a - c->lo) * es, (b - a) * es, (char *)dst + (a - lo) * es)) < 0)
            return st;
    }
    return DT_OK;
}

/* One contiguous run of file bytes a batch reads: file bytes [off, off + n)
 * into dst. */
typedef struct seg {
    size_t file;
    uint64_t off, n;
    char *dst;
} seg;

static int seg_cmp(const void *a, const void *b)
{
    const seg *x = a, *y = b;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* The segments of file fi (s[0..n), sorted by offset), reading each byte of
 * the file once and checksumming it on the way (see the overview). */
static dt_status read_verified(dt_ckpt *ck, size_t fi, const seg *s, size_t n)
{
    cfile *f = &ck->files[fi];
    const dt_st_file *sf = f->f;
    const uint64_t size = dt_st_file_size(sf);
    if (size != f->bytes)
        return dt_error(DT_ERR_FORMAT, "%s: %llu bytes, the index says %llu (truncated or replaced)", f->path,
                        (unsigned long long)size, (unsigned long long)f->bytes);
    const uint64_t step = (uint64_t)4 << 20; /* dd's bs=4M: large requests to the disk */
    uint32_t crc = 0;
    uint64_t pos = 0; /* bytes [0, pos) are in crc */
    dt_status st;
    for (size_t i = 0; i < n; i++) {
        uint64_t a = s[i].off, b = s[i].off + s[i].n;
        if (a > pos) { /* a gap: for the checksum only */
            if ((st = dt__st_sum_range(sf, f->kind, pos, a, &crc)) < 0)
                return st;
            pos = a;
        }
        if (a < pos) { /* overlaps bytes already summed: a plain read */
            uint64_t e = b < pos ? b : pos;
            if ((st = dt__st_pread(sf, a, s[i].dst, e - a)) < 0)
                return st;
        }
        for (uint64_t x = pos > a ? pos : a; x < b;) {
            uint64_t k = b - x < step ? b - x : step;
            char *d = s[i].dst + (x - a);
            if ((st = dt__st_pread(sf, x, d, k)) < 0)
                return st;
            /* the next piece (of this segment, else of the next one) is read
             * ahead while this one is summed */
            if (x + k < b)
                dt__st_prefetch(sf, x + k, b - x - k < step ? b - x - k : step);
            else if (i + 1 < n)
                dt__st_prefetch(sf, s[i + 1].off, s[i + 1].n < step ? s[i + 1].n : step);
            crc = dt_ckpt_sum_update(f->kind, crc, d, (size_t)k);
            x += k;
            pos = x;
        }
    }
    if ((st = dt__st_sum_range(sf, f->kind, pos, size, &crc)) < 0)
        return st;
    if ((st = sum_check(f, crc)) < 0)
        return st;
    f->verified = true;
    return DT_OK;
}

dt_status dt_ckpt_read_batch(dt_ckpt *ck, const dt_ckpt_req *r, size_t n, bool verify)
{
    if (!ck || (n && !r))
        return dt_error(DT_ERR_NULL, "dt_ckpt_read_batch: NULL argument");
    size_t ns = 0, cap = 0;
    seg *s = NULL;
    dt_status st = DT_OK;
    for (size_t q = 0; q < n && st == DT_OK; q++) {
        const dt_ckpt_req *x = &r[q];
        if (x->tensor >= ck->nt) {
            st = dt_error(DT_ERR_RANGE, "%s: tensor %zu of %zu", ck->src, x->tensor, ck->nt);
            break;
        }
        const ctensor *t = &ck->t[x->tensor];
        if (x->lo > x->hi || x->hi > t->numel || (x->hi > x->lo && !x->dst)) {
            st = dt_error(x->hi > x->lo && !x->dst ? DT_ERR_NULL : DT_ERR_RANGE,
                          "%s: tensor '%s': range [%llu, %llu) outside its %llu elements, or no destination", ck->src,
                          t->name, (unsigned long long)x->lo, (unsigned long long)x->hi, (unsigned long long)t->numel);
            break;
        }
        size_t es = dt_st_dtype_size(t->dtype);
        for (size_t j = 0; j < t->nc; j++) {
            const chunk *c = &t->c[j];
            uint64_t a = x->lo > c->lo ? x->lo : c->lo, b = x->hi < c->hi ? x->hi : c->hi;
            if (a >= b)
                continue;
            const dt_st_file *f;
            if ((st = file_get(ck, c->file, false, &f)) < 0)
                break;
            const dt_st_tensor *so = dt_st_find(f, c->key);
            if (!so || so->dtype != t->dtype || so->numel != c->hi - c->lo) {
                st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s': the piece '%s' for elements [%llu, %llu) is %s",
                              dt_st_path(f), t->name, c->key, (unsigned long long)c->lo, (unsigned long long)c->hi,
                              so ? "of another dtype or length than the index says" : "missing");
                break;
            }
            if (ns == cap) {
                size_t nc = cap ? 2 * cap : 64;
                seg *g = realloc(s, nc * sizeof *g);
                if (!g) {
                    st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", ck->src);
                    break;
                }
                s = g;
                cap = nc;
            }
            s[ns++] = (seg){.file = c->file, .off = so->offset + (a - c->lo) * es, .n = (b - a) * es,
                            .dst = (char *)x->dst + (a - x->lo) * es};
        }
    }
    if (st == DT_OK && ns)
        qsort(s, ns, sizeof *s, seg_cmp);
    for (size_t i = 0; st == DT_OK && i < ns;) {
        size_t j = i;
        while (j < ns && s[j].file == s[i].file)
            j++;
        cfile *f = &ck->files[s[i].file];
        if (verify && !f->verified && f->has_crc) {
            st = read_verified(ck, s[i].file, s + i, j - i);
        } else {
            for (size_t k = i; st == DT_OK && k < j; k++)
                st = dt__st_pread(f->f, s[k].off, s[k].dst, s[k].n);
        }
        i = j;
    }
    free(s);
    return st;
}

dt_status dt_ckpt_verify(dt_ckpt *ck)
{
    if (!ck)
        return dt_error(DT_ERR_NULL, "dt_ckpt_verify: NULL checkpoint");
    for (size_t fi = 0; fi < ck->nfiles; fi++) {
        const dt_st_file *f;
        dt_status st = file_get(ck, fi, true, &f);
        if (st < 0)
            return st;
    }
    for (size_t i = 0; i < ck->nt; i++)
        for (size_t j = 0; j < ck->t[i].nc; j++) {
            const chunk *c = &ck->t[i].c[j];
            const dt_st_tensor *s = dt_st_find(ck->files[c->file].f, c->key);
            if (!s || s->dtype != ck->t[i].dtype || s->numel != c->hi - c->lo)
                return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': the piece '%s' is %s", ck->files[c->file].path,
                                ck->t[i].name, c->key, s ? "of another dtype or length than the index says" : "missing");
        }
    return DT_OK;
}

dt_status dt_ckpt_load(const char *src, dt_ckpt_entry *e, size_t n, const dt_ckpt_load_params *p, size_t *missing)
{
    if (missing)
        *missing = 0;
    if (!src || (n && !e))
        return dt_error(DT_ERR_NULL, "dt_ckpt_load: NULL argument");
    dt_ckpt_load_params def = dt_ckpt_load_params_default();
    if (!p)
        p = &def;
    dt_ckpt *ck;
    dt_status st = dt_ckpt_open(src, &ck);
    if (st < 0)
        return st;
    dt_ckpt_req *rq = calloc(n ? n : 1, sizeof *rq);
    size_t nr = 0;
    if (!rq)
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", src);
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        const dt_ckpt_entry *x = &e[i];
        if (!x->name || (unsigned)x->dtype >= DT_DTYPE_COUNT || x->ndim < 0 || x->ndim > DT_MAX_DIMS) {
            st = dt_error(DT_ERR_INVALID_ARG, "dt_ckpt_load: entry %zu: bad name, dtype or ndim", i);
            break;
        }
        int64_t k = dt_ckpt_find(ck, x->name);
        if (k < 0) {
            if (p->allow_missing) {
                if (missing)
                    (*missing)++;
                continue;
            }
            st = dt_error(DT_ERR_NOT_FOUND, "%s: tensor '%s' is not in the checkpoint", src, x->name);
            break;
        }
        const ctensor *t = &ck->t[k];
        bool same = t->ndim == x->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = t->shape[d] == x->shape[d];
        if (!same) {
            char a[160], b[160];
            dt_shape_str(t->ndim, t->shape, a, sizeof a);
            dt_shape_str(x->ndim, x->shape, b, sizeof b);
            st = dt_error(DT_ERR_SHAPE, "%s: tensor '%s': shape %s in checkpoint, %s here", src, x->name, a, b);
            break;
        }
        if (t->dtype != dt_st_dtype_from(x->dtype)) {
            st = dt_error(DT_ERR_DTYPE, "%s: tensor '%s': dtype %s in checkpoint, %s here", src, x->name,
                          dt_st_dtype_name(t->dtype), dt_st_dtype_name(dt_st_dtype_from(x->dtype)));
            break;
        }
        if (x->lo > x->hi || x->hi > t->numel) {
            st = dt_error(DT_ERR_INVALID_ARG, "%s: tensor '%s': range [%llu, %llu) outside its %llu elements", src,
                          x->name, (unsigned long long)x->lo, (unsigned long long)x->hi, (unsigned long long)t->numel);
            break;
        }
        rq[nr++] = (dt_ckpt_req){.tensor = (size_t)k, .lo = x->lo, .hi = x->hi, .dst = x->data};
    }
    if (st == DT_OK)
        st = dt_ckpt_read_batch(ck, rq, nr, p->verify);
    free(rq);
    dt_ckpt_close(ck);
    return st;
}
