/* Trainer checkpoints: loading (the rule in trainer_ckpt.c's overview:
 * every piece this rank steps from the checkpoint's fp32 masters or its
 * widened parameter, the optimizer state unless weights only, then the
 * buffers), and the pieces a rank holds, which saving lists too. */
#include "ckpt/ckpt_view.h"
#include "train/train_impl.h"
#include "train/trainer_ckpt_impl.h"
#include "train/trainer_ckpt_psgd.h"
#include "nn/nn_layer.h"
#include "dtrain/trace.h"

#include "dtrain/ckpt.h"
#include "dtrain/kernels.h"
#include "dtrain/tp.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


/* The pieces, one per trained entry of the model in entry order (lo == hi:
 * none of it here); *sharded: some rank holds less than the whole. */
dt_status dt__ckpt_collect_pieces(dt_trainer *tr, tpiece **out, bool *sharded)
{
    dt_model *m = dt_trainer_model(tr);
    const size_t ne = dt_model_num_entries(m);
    tpiece *pc = calloc(ne ? ne : 1, sizeof *pc);
    if (!pc)
        return dt_error(DT_ERR_NO_MEMORY, "checkpoint: out of memory");
    for (size_t i = 0; i < ne; i++)
        dt_model_entry(m, i, &pc[i].e);
    /* the strategy's map of pieces (ZeRO's shards), else the ranges */
    size_t n = 0;
    dt_zero_piece *zp = NULL;
    dt_status st = dt__strategy_pieces(dt_trainer_strategy(tr), &zp, &n);
    *sharded = zp != NULL;
    if (st < 0 || zp) {
        for (size_t k = 0; st >= 0 && k < n; k++) { /* a rank's shard cuts a tensor once at most */
            tpiece *p = &pc[zp[k].entry];
            p->lo = zp[k].lo;
            p->hi = zp[k].hi;
            p->val = zp[k].param;
            p->lowp = zp[k].lowp;
            p->range = zp[k].range;
            p->roff = zp[k].range_offset;
        }
        free(zp);
        if (st < 0) {
            free(pc);
            return st;
        }
        *out = pc;
        return DT_OK;
    }
    const dt_optim_range *rg;
    size_t nr;
    dt__trainer_ranges(tr, &rg, &nr);
    for (size_t i = 0; i < ne; i++) {
        tpiece *p = &pc[i];
        if (p->e.is_buffer || p->e.tied_to >= 0)
            continue;
        for (size_t k = 0; k < nr; k++) {
            const dt_flat *f = rg[k].mirror ? rg[k].mirror : rg[k].params;
            if (f->dtype != p->e.dtype)
                continue;
            size_t a = p->e.offset, b = a + p->e.numel;
            a = a < rg[k].lo ? rg[k].lo : a;
            b = b > rg[k].hi ? rg[k].hi : b;
            /* a range of segments (the pipe strategy's stages, a ZeRO-1 share
             * of them) holds only the tensors its segments overlap, not what
             * lies between them */
            bool in_seg = !rg[k].segs;
            for (size_t g = 0; !in_seg && g < rg[k].nseg; g++)
                in_seg = rg[k].segs[g].offset < p->e.offset + p->e.numel &&
                         p->e.offset < rg[k].segs[g].offset + rg[k].segs[g].numel;
            if (a < b && in_seg) {
                p->lo = a - p->e.offset;
                p->hi = b - p->e.offset;
                p->val = dt_flat_ptr(rg[k].params, a);
                p->lowp = rg[k].mirror ? dt_flat_ptr(rg[k].mirror, a) : NULL;
                p->range = k;
                p->roff = a - rg[k].lo;
            }
            break;
        }
        *sharded |= p->hi - p->lo != p->e.numel;
    }
    *out = pc;
    return DT_OK;
}


/* The model's tensor-parallel group when it has more than one rank, else NULL. */
dt_pg *dt__ckpt_tp_of(dt_trainer *tr)
{
    dt_pg *tp = dt_tp_model_group(dt_trainer_model(tr));
    return tp && dt_pg_size(tp) > 1 ? tp : NULL;
}

/* Slices whose group is unknown cannot be saved or loaded (symmetric on all ranks). */
dt_status dt__ckpt_tp_known(dt_trainer *tr, const char *op)
{
    const dt_model *m = dt_trainer_model(tr);
    const char *sl = dt_tp_model_slice(m);
    if (sl && !dt_tp_model_group(m))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: '%s' is a tensor-parallel slice of a module with no group "
                        "(dt_tp_module_set_group)", op, sl);
    return DT_OK;
}


/* path: a checkpoint (holds trainer.json) or a save directory (its newest). */
static dt_status resolve(const char *path, char *ck, size_t n)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", path, INDEX_FILE);
    struct stat sb;
    if (lstat(p, &sb) == 0) {
        snprintf(ck, n, "%s", path);
        return DT_OK;
    }
    if (stat(path, &sb) != 0)
        return dt_error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "checkpoint %s: %s", path, strerror(errno));
    if (S_ISREG(sb.st_mode) || dt_ckpt_is_hf_dir(path)) { /* one safetensors file (PyTorch's names), or a
                                                              Hugging Face model directory */
        snprintf(ck, n, "%s", path);
        return DT_OK;
    }
    if (!S_ISDIR(sb.st_mode)) /* a FIFO, a device: neither a safetensors file nor a directory */
        return dt_error(DT_ERR_FORMAT, "checkpoint %s: not a regular file or a directory", path);
    dt_status st = dt_trainer_ckpt_latest(path, ck, n);
    if (st < 0)
        return st;
    if (!ck[0])
        return dt_error(DT_ERR_NOT_FOUND, "%s holds no complete checkpoint (no step-N directory with %s)", path,
                        INDEX_FILE);
    return DT_OK;
}

/* The run-state and user metadata of an open checkpoint. */
static dt_status ckpt_meta(const dt_ckpt *ck, const char *ckname, const char *key, const char **out)
{
    *out = dt_ckpt_meta(ck, key);
    if (!*out)
        return dt_error(DT_ERR_FORMAT, "checkpoint %s: no \"%s\" metadata (not saved by dt_trainer_save: weights "
                        "alone, such as a Hugging Face model's, hold no run to resume; start from them with "
                        "dtrain train --init-from, or --model hf:DIR)", ckname, key);
    return DT_OK;
}

/* The reads of a load that need no conversion, done together at the end
 * (dt_ckpt_read_batch: in file order, each file checksummed in the same
 * pass). */
typedef struct rbatch {
    dt_ckpt_req *r;
    size_t n, cap;
} rbatch;

static dt_status rbatch_add(rbatch *b, size_t i, uint64_t lo, uint64_t hi, void *dst)
{
    if (b->n == b->cap) {
        size_t nc = b->cap ? 2 * b->cap : 64;
        dt_ckpt_req *r = realloc(b->r, nc * sizeof *r);
        if (!r)
            return dt_error(DT_ERR_NO_MEMORY, "loading a checkpoint: out of memory");
        b->r = r;
        b->cap = nc;
    }
    b->r[b->n++] = (dt_ckpt_req){.tensor = i, .lo = lo, .hi = hi, .dst = dst};
    return DT_OK;
}

/* Elements [lo, hi) of the saved tensor `name` as `want` into dst,
 * converted from the saved float dtype; *found false (nothing read) when
 * the checkpoint has no such tensor. The shape must be p's. With a batch b,
 * a read that needs no conversion is queued there (dst is filled when the
 * batch runs), others are read now. */
static dt_status read_as(dt_ckpt *ck, const char *ckname, const char *name, const dt_param_info *p, uint64_t lo,
                         uint64_t hi, dt_dtype want, void *dst, bool *found, rbatch *b)
{
    int64_t i = dt_ckpt_find(ck, name);
    *found = i >= 0;
    if (i < 0)
        return DT_OK;
    dt_ckpt_tensor t;
    dt_status st = dt_ckpt_tensor_at(ck, (size_t)i, &t);
    if (st < 0)
        return st;
    bool same = t.ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++)
        same = t.shape[d] == p->shape[d];
    if (!same) {
        char sa[256], sb[256];
        dt_shape_str(t.ndim, t.shape, sa, sizeof sa);
        dt_shape_str(p->ndim, p->shape, sb, sizeof sb);
        return dt_error(DT_ERR_SHAPE, "tensor '%s': shape %s in checkpoint %s, %s here", name, sa, ckname, sb);
    }
    dt_dtype have;
    if (dt_st_dtype_to(t.dtype, &have) < 0 || (have != DT_F32 && have != DT_BF16 && have != DT_F16))
        return dt_error(DT_ERR_DTYPE, "tensor '%s' is %s in checkpoint %s; parameters and optimizer state load "
                                      "from F32, BF16 or F16", name, dt_st_dtype_name(t.dtype), ckname);
    if (hi <= lo)
        return DT_OK;
    if (have == want)
        return b ? rbatch_add(b, (size_t)i, lo, hi, dst) : dt_ckpt_read(ck, (size_t)i, lo, hi, dst, false);
    void *tmp = dt_alloc((size_t)(hi - lo) * dt_dtype_size(have));
    if (!tmp)
        return dt_error(DT_ERR_NO_MEMORY, "loading '%s' from %s", name, ckname);
    st = dt_ckpt_read(ck, (size_t)i, lo, hi, tmp, false);
    if (st >= 0)
        st = dt_k_convert(tmp, have, dst, want, (int64_t)(hi - lo));
    dt_free(tmp);
    return st;
}

/* read_as for piece q into dst (q's local elements [lo, hi) as `want`); a
 * tensor-parallel slice (tp non-NULL) reads the full tensor and takes the
 * rank's slice of it, and of that the piece's elements (ZeRO-1 shares a
 * slice over the data-parallel ranks; memory: one full tensor and one
 * slice). */
static dt_status read_piece(dt_ckpt *ck, const char *ckname, const char *name, const tpiece *q, dt_pg *tp,
                            dt_dtype want, void *dst, bool *found, rbatch *b)
{
    if (!tp || !q->e.tp_dim)
        return read_as(ck, ckname, name, &q->e, q->lo, q->hi, want, dst, found, b);
    const bool part = q->lo != 0 || q->hi != q->e.numel;
    const int t = dt_pg_size(tp);
    dt_param_info fe = q->e;
    dt_status st = dt_tp_full_shape(&q->e, t, fe.shape);
    if (st < 0)
        return st;
    uint64_t N = 1;
    for (int d = 0; d < fe.ndim; d++)
        N *= (uint64_t)fe.shape[d];
    const size_t es = dt_dtype_size(want);
    void *full = dt_alloc(N * es + 64), *slice = part ? dt_alloc(q->e.numel * es + 64) : dst;
    if (!full || !slice) {
        dt_free(full);
        if (part)
            dt_free(slice);
        return dt_error(DT_ERR_NO_MEMORY, "loading '%s' from %s: out of memory for the full tensor", name, ckname);
    }
    st = read_as(ck, ckname, name, &fe, 0, N, want, full, found, NULL);
    if (st >= 0 && *found)
        st = dt_tp_slice_get(&q->e, t, dt_pg_rank(tp), full, slice, es);
    if (st >= 0 && *found && part)
        memcpy(dst, (char *)slice + q->lo * es, (q->hi - q->lo) * es);
    dt_free(full);
    if (part)
        dt_free(slice);
    return st;
}

/* The k-th other spelling (k = 0, 1, ...) of parameter entry i in a weights
 * file written elsewhere, into out; false when there is none left. The
 * spellings: the name of an entry tied to it (safetensors' save_model keeps
 * "lm_head.weight" and drops the tied "transformer.wte.weight"), and each of
 * these names without the base-model prefix "transformer." (a Hugging Face
 * base-model file: "h.0.attn.c_attn.weight", "wte.weight"). */
static bool alt_name(const dt_model *m, size_t i, int k, char *out, size_t n)
{
    static const char prefix[] = "transformer.";
    const size_t pl = sizeof prefix - 1;
    dt_param_info e;
    for (size_t j = 0, ne = dt_model_num_entries(m); j < ne; j++) {
        if (dt_model_entry(m, j, &e) < 0 || (j != i && e.tied_to != (int64_t)i))
            continue;
        if (j != i && k-- == 0) {
            snprintf(out, n, "%s", e.name);
            return true;
        }
        if (!strncmp(e.name, prefix, pl) && k-- == 0) {
            snprintf(out, n, "%s", e.name + pl);
            return true;
        }
    }
    return false;
}

/* DoRA: magnitude piece q (its elements [lo, hi) of "L.lora_magnitude_vector.weight") set to the row norms of
 * layer L's base weight, ||W[o, :]||, as PEFT starts them (lora_B zeros); then its compute copy. With ck (the
 * file of base weights the magnitudes were not in): a file that holds L's lora_B was trained without DoRA. */
static dt_status dora_start(const dt_ckpt *ck, const char *ckname, const tpiece *q)
{
    const size_t ll = dt_lora_layer_len(q->e.name);
    char b[1100];
    snprintf(b, sizeof b, "master.%.*s.lora_B.weight", (int)ll, q->e.name);
    if (ck && (dt_ckpt_find(ck, b) >= 0 || dt_ckpt_find(ck, b + 7) >= 0))
        return dt_error(DT_ERR_MISMATCH, "%s has LoRA adapters for '%.*s' but no DoRA magnitudes ('%s'): it was "
                        "trained without DoRA (--lora-dora)", ckname, (int)ll, q->e.name, q->e.name);
    if (q->hi <= q->lo)
        return DT_OK;
    dt_status st = dt__lora_dora_norm(dt_module_parent(q->e.module), false, (int64_t)q->lo, (int64_t)q->hi, q->val);
    if (st >= 0 && q->lowp)
        st = dt_k_convert(q->val, DT_F32, q->lowp, q->e.dtype, (int64_t)(q->hi - q->lo));
    return st;
}

dt_status dt__trainer_dora_start(dt_trainer *tr)
{
    dt_model *m = dt_trainer_model(tr);
    bool any = false;
    for (size_t i = 0; i < dt_model_num_entries(m) && !any; i++) {
        dt_param_info e;
        any = dt_model_entry(m, i, &e) >= 0 && dt_lora_is_magnitude(e.name);
    }
    if (!any)
        return DT_OK;
    tpiece *pc = NULL;
    bool sharded;
    dt_status st = dt__ckpt_collect_pieces(tr, &pc, &sharded);
    for (size_t i = 0; st >= 0 && i < dt_model_num_entries(m); i++)
        if (dt_lora_is_magnitude(pc[i].e.name))
            st = dora_start(NULL, NULL, &pc[i]);
    free(pc);
    return st < 0 ? st : dt__strategy_after_load(dt_trainer_strategy(tr));
}

/* Load the pieces (the rule of the overview) and, unless weights_only, their
 * optimizer state; then the buffers. With adapters (a key prefix, PEFT's
 * "base_model.model."): the LoRA adapters only, each under prefix + name,
 * and no buffers. Weights only, a LoRA adapter the file lacks keeps its
 * initial value (a base model's file: the adapters start as LoRA's init). Tensor parallel: each slice from the
 * full tensor saved (read_piece), so any checkpoint of the model loads at
 * any tensor-parallel size. */
static dt_status load_pieces(dt_trainer *tr, dt_ckpt *ck, const char *ckname, bool weights_only,
                             const char *adapters)
{
    dt_model *m = dt_trainer_model(tr);
    dt_optim *o = dt_trainer_optim(tr);
    tpiece *pc = NULL;
    bool sharded;
    dt_status st = dt__ckpt_collect_pieces(tr, &pc, &sharded);
    if (st < 0)
        return st;
    dt_pg *tp = dt__ckpt_tp_of(tr);
    char name[1024];
    rbatch rb = {0};
    /* pieces whose compute copy is made from the loaded f32 values, once the batch has run; DoRA magnitudes the
       file lacks (a base model's weights), set from the loaded base weights at the end */
    bool *conv = calloc(2 * dt_model_num_entries(m) + 1, sizeof *conv), *dora = conv + dt_model_num_entries(m);
    if (!conv)
        st = dt_error(DT_ERR_NO_MEMORY, "loading %s: out of memory", ckname);
    for (size_t i = 0; st >= 0 && i < dt_model_num_entries(m); i++) {
        const tpiece *q = &pc[i];
        if (!dt__ckpt_trained(q) || (tp && q->e.tp_dim && q->hi == q->lo)) /* another stage's slice */
            continue;
        bool found;
        const bool adapter = dt_lora_is_adapter(q->e.name);
        if (adapters) { /* the adapters, and what trains beside them: the modules to save, PEFT's biases */
            const bool mag = dt_lora_is_magnitude(q->e.name);
            dt__lora_peft_name(&q->e, name, sizeof name);
            if ((st = read_piece(ck, ckname, name, q, tp, DT_F32, q->val, &found, &rb)) < 0)
                break;
            if (!found) {
                st = dt_error(DT_ERR_NOT_FOUND, "%s has no tensor '%s' (the model's %s %s: %s)", ckname, name,
                              adapter ? "adapter" : "trained parameter", q->e.name,
                              mag      ? "DoRA's magnitudes; adapters saved without use_dora?"
                              : adapter ? "adapters saved for other target layers?"
                                        : "adapters saved without it in modules_to_save, or another bias setting?");
                break;
            }
            conv[i] = q->lowp && q->hi > q->lo;
            continue;
        }
        snprintf(name, sizeof name, "master.%s", q->e.name);
        if ((st = read_piece(ck, ckname, name, q, tp, DT_F32, q->val, &found, &rb)) < 0)
            break;
        if (!found && (st = read_piece(ck, ckname, q->e.name, q, tp, DT_F32, q->val, &found, &rb)) < 0)
            break;
        if (!found && weights_only && adapter) { /* a base model's weights: the adapter keeps its init */
            dora[i] = dt_lora_is_magnitude(q->e.name);
            continue;
        }
        for (int k = 0; !found && weights_only && alt_name(m, i, k, name, sizeof name); k++)
            if ((st = read_piece(ck, ckname, name, q, tp, DT_F32, q->val, &found, &rb)) < 0)
                break;
        if (st < 0)
            break;
        if (!found) {
            st = dt_error(DT_ERR_NOT_FOUND, "checkpoint %s has no tensor '%s'", ckname, q->e.name);
            break;
        }
        conv[i] = q->lowp && q->hi > q->lo;
        for (int s = 0; !weights_only && s < dt_optim_num_states(o); s++) {
            const char *sname;
            float *data;
            if ((st = dt_optim_state(o, q->range, s, &sname, &data, NULL)) < 0)
                break;
            snprintf(name, sizeof name, "optim.%s.%s", q->e.name, sname);
            if ((st = read_piece(ck, ckname, name, q, tp, DT_F32, data + q->roff, &found, &rb)) < 0)
                break;
            if (!found) {
                st = dt_error(DT_ERR_NOT_FOUND, "checkpoint %s has no tensor '%s' (optimizer state)", ckname, name);
                break;
            }
        }
    }
    /* the queued reads, then every file the batch did not read (a rank
     * that loads part of a resharded checkpoint) is checked too */
    if (st >= 0)
        st = dt_ckpt_read_batch(ck, rb.r, rb.n, true);
    if (st >= 0)
        st = dt_ckpt_verify(ck);
    for (size_t i = 0; st >= 0 && i < dt_model_num_entries(m); i++)
        if (conv[i])
            st = dt_k_convert(pc[i].val, DT_F32, pc[i].lowp, pc[i].e.dtype, (int64_t)(pc[i].hi - pc[i].lo));
    free(rb.r);
    if (st < 0 || adapters) {
        free(conv);
        free(pc);
        return st;
    }
    /* buffers: whole on every rank, in their own dtype */
    dt_ckpt_list *l = NULL;
    if ((st = dt_ckpt_list_init(&l)) < 0) {
        free(conv);
        free(pc);
        return st;
    }
    for (int d = 0; !tp && d < DT_DTYPE_COUNT && st >= 0; d++) {
        const dt_flat *f = dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)d);
        if (f && f->numel)
            st = dt_ckpt_list_add_flat(l, m, DT_FLAT_BUFFERS, (dt_dtype)d, f->offset, f->offset + f->numel, f->base,
                                       "", "");
    }
    /* tensor parallel: buffers one by one, a frozen parameter's slice cut
     * from its full tensor (full[i]) after the load */
    const size_t ne = dt_model_num_entries(m);
    void **full = tp ? calloc(ne + 1, sizeof *full) : NULL;
    if (tp && !full)
        st = dt_error(DT_ERR_NO_MEMORY, "loading %s: out of memory", ckname);
    for (size_t i = 0; tp && i < ne && st >= 0; i++) {
        dt_param_info e;
        dt_model_entry(m, i, &e);
        if (!e.is_buffer || e.tied_to >= 0 || !e.tensor)
            continue;
        dt_ckpt_entry ce = {.name = e.name, .dtype = e.dtype, .ndim = e.ndim, .lo = 0, .hi = e.numel,
                            .data = e.tensor->data};
        memcpy(ce.shape, e.shape, sizeof ce.shape);
        if (e.frozen && e.tp_dim) {
            if ((st = dt_tp_full_shape(&e, dt_pg_size(tp), ce.shape)) < 0)
                break;
            ce.hi = 1;
            for (int d = 0; d < ce.ndim; d++)
                ce.hi *= (uint64_t)ce.shape[d];
            if (!(ce.data = full[i] = malloc(ce.hi * dt_dtype_size(e.dtype) + 1))) {
                st = dt_error(DT_ERR_NO_MEMORY, "loading %s: out of memory for '%s'", ckname, e.name);
                break;
            }
        }
        st = dt_ckpt_list_add(l, &ce);
    }
    dt_ckpt_load_params lp = dt_ckpt_load_params_default();
    lp.verify = false; /* verified by load_pieces' batch and dt_ckpt_verify */
    if (st >= 0 && dt_ckpt_list_count(l) > 0)
        st = dt_ckpt_load(ckname, dt_ckpt_list_entries(l), dt_ckpt_list_count(l), &lp, NULL);
    for (size_t i = 0; full && i < ne; i++) {
        dt_param_info e;
        if (full[i] && st >= 0 && (st = dt_model_entry(m, i, &e)) >= 0)
            st = dt_tp_slice_get(&e, dt_pg_size(tp), dt_pg_rank(tp), full[i], e.tensor->data, dt_dtype_size(e.dtype));
        free(full[i]);
    }
    free(full);
    dt_ckpt_list_free(l);
    for (size_t i = 0; i < ne && st >= 0; i++) /* the base weights are in place: DoRA's magnitudes from them */
        if (dora[i])
            st = dora_start(ck, ckname, &pc[i]);
    free(conv);
    free(pc);
    return st;
}

/* A checkpoint dt_trainer_save wrote holds the model's tensors and the
 * optimizer's ("optim.", "master.", "powersgd."): any other tensor that m
 * lacks means it was saved from a larger model (more layers, LoRA
 * adapters), which loading would cut silently. Other programs' files (a
 * Hugging Face model's mask buffers) may hold tensors a model does not
 * keep: not checked. */
static dt_status check_unexpected(const dt_model *m, const dt_ckpt *ck, const char *ckname)
{
    if (!dt_ckpt_meta(ck, META_RUN))
        return DT_OK;
    size_t extra = 0;
    const char *first = NULL;
    for (size_t i = 0, n = dt_ckpt_num_tensors(ck); i < n; i++) {
        dt_ckpt_tensor x;
        dt_status st = dt_ckpt_tensor_at(ck, i, &x);
        if (st < 0)
            return st;
        if (!strncmp(x.name, "optim.", 6) || !strncmp(x.name, "master.", 7) || !strncmp(x.name, "powersgd.", 9) ||
            dt_model_find_entry(m, x.name) >= 0)
            continue;
        if (!extra++)
            first = x.name;
    }
    if (!extra)
        return DT_OK;
    return dt_error(DT_ERR_MISMATCH, "checkpoint %s: %zu of its tensors %s not in this model ('%s'%s): it was saved "
                    "from another model (more layers, LoRA adapters, ...); build the model it was saved from", ckname,
                    extra, extra == 1 ? "is" : "are", first, extra == 1 ? "" : ", ...");
}

static dt_status load_impl(dt_trainer *tr, const char *path, dt_trainer_resume_info *info, bool weights_only,
                           char *ckname, size_t ckn)
{
    dt_status st = dt__ckpt_tp_known(tr, "loading a checkpoint");
    if (st < 0)
        return st;
    st = resolve(path, ckname, ckn);
    if (st < 0)
        return st;
    dt_ckpt *ck = NULL;
    const char *run = NULL;
    if ((st = dt_ckpt_open(ckname, &ck)) < 0)
        return st;
    if ((st = check_unexpected(dt_trainer_model(tr), ck, ckname)) < 0)
        goto out;
    /* the files are verified as load_pieces reads them (one pass each) */
    if (!weights_only) {
        if ((st = ckpt_meta(ck, ckname, META_RUN, &run)) < 0)
            goto out;
        /* the optimizer kind first: a clearer error than a missing tensor */
        cJSON *rs = cJSON_Parse(run);
        const cJSON *k = rs ? cJSON_GetObjectItemCaseSensitive(rs, "optimizer") : NULL;
        const char *have = dt_optim_kind_name(dt_optim_get_kind(dt_trainer_optim(tr)));
        if (cJSON_IsString(k) && strcmp(k->valuestring, have) != 0)
            st = dt_error(DT_ERR_MISMATCH, "checkpoint %s holds %s optimizer state, this run uses %s", ckname,
                          k->valuestring, have);
        cJSON_Delete(rs);
        if (st < 0)
            goto out;
    }
    if ((st = load_pieces(tr, ck, ckname, weights_only, NULL)) < 0)
        goto out;
    if (!weights_only && (st = dt__psgd_ckpt_load(tr, ck, ckname)) < 0)
        goto out;
    if (!weights_only && (st = dt_trainer_apply_run_state(tr, run, info)) < 0)
        dt_error_wrap(st, "checkpoint %s/index.json, metadata \"%s\"", ckname, META_RUN);
out:
    dt_ckpt_close(ck);
    return st;
}

/* Every rank loads; then all agree (a rank that failed makes all fail). */
static dt_status agree_load(dt_trainer *tr, dt_status st)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st < 0 ? dt_last_error() : "");
    double v = st < 0 ? 1.0 : 0.0;
    dt_pg *tp = dt__ckpt_tp_of(tr); /* tensor parallel: the group first, then the data-parallel ranks */
    dt_status ast = tp ? dt_pg_allreduce(tp, DT_IN_PLACE, &v, 1, DT_F64, DT_REDUCE_SUM) : DT_OK;
    if (ast >= 0)
        ast = dt_trainer_allreduce_sum(tr, &v, 1);
    if (ast < 0)
        return ast;
    if (st < 0)
        return dt_error(st, "%s", msg);
    if (v > 0)
        return dt_error(DT_ERR_IO, "another rank could not load the checkpoint (its error says why)");
    return DT_OK;
}

dt_status dt_trainer_load(dt_trainer *tr, const char *path, dt_trainer_resume_info *info)
{
    if (!tr || !path)
        return dt_error(DT_ERR_NULL, "dt_trainer_load: NULL %s", tr ? "path" : "trainer");
    if (dt_trainer_offload(tr))
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_load: the optimizer state is offloaded to NVMe (offload.h), "
                        "which checkpoints do not hold yet");
    char ck[sizeof ((dt_trainer_resume_info *)0)->path];
    dt_trainer_resume_info ri;
    memset(&ri, 0, sizeof ri);
    dt_status st = load_impl(tr, path, &ri, false, ck, sizeof ck);
    if (st >= 0)
        snprintf(ri.path, sizeof ri.path, "%s", ck);
    st = agree_load(tr, st);
    if (st >= 0) /* every rank loaded what it steps (ZeRO: its shards; a pipeline: its stages'): the rest */
        st = dt__strategy_after_load(dt_trainer_strategy(tr));
    if (info)
        *info = ri;
    return st;
}

dt_status dt_trainer_load_weights(dt_trainer *tr, const char *file)
{
    if (!tr || !file)
        return dt_error(DT_ERR_NULL, "dt_trainer_load_weights: NULL %s", tr ? "file" : "trainer");
    char ck[4096]; /* a checkpoint, a save directory, or one safetensors file (PyTorch's names) */
    dt_status st = agree_load(tr, load_impl(tr, file, NULL, true, ck, sizeof ck));
    if (st >= 0)
        st = dt__strategy_after_load(dt_trainer_strategy(tr));
    return st;
}

dt_status dt_trainer_ckpt_user(const char *path, char **json)
{
    if (!path || !json)
        return dt_error(DT_ERR_NULL, "dt_trainer_ckpt_user: NULL argument");
    *json = NULL;
    char ck[4096];
    dt_status st = resolve(path, ck, sizeof ck);
    if (st < 0)
        return st;
    dt_ckpt *c;
    if ((st = dt_ckpt_open(ck, &c)) < 0)
        return st;
    const char *u;
    if ((st = ckpt_meta(c, ck, META_USER, &u)) >= 0) {
        cJSON *o = cJSON_Parse(u);
        if (!cJSON_IsObject(o))
            st = dt_error(DT_ERR_FORMAT, "checkpoint %s: its \"%s\" metadata is not a JSON object", ck, META_USER);
        else if (!(*json = cJSON_PrintUnformatted(o)))
            st = dt_error(DT_ERR_NO_MEMORY, "checkpoint %s: out of memory", ck);
        cJSON_Delete(o);
    }
    dt_ckpt_close(c);
    return st;
}

#define PEFT_PREFIX "base_model.model."

/* Whether tensors i and j of ck hold the same values (read as f32). */
static dt_status same_values(dt_ckpt *ck, size_t i, size_t j, bool *same)
{
    dt_ckpt_tensor a, b;
    dt_status st = dt_ckpt_tensor_at(ck, i, &a);
    if (st >= 0)
        st = dt_ckpt_tensor_at(ck, j, &b);
    *same = st >= 0 && a.numel == b.numel;
    float *x = *same ? malloc(a.numel * sizeof *x + 1) : NULL, *y = *same ? malloc(a.numel * sizeof *y + 1) : NULL;
    if (*same && (!x || !y))
        st = dt_error(DT_ERR_NO_MEMORY, "out of memory comparing '%s' and '%s'", a.name, b.name);
    if (*same && st >= 0 && (st = dt_ckpt_read(ck, i, 0, a.numel, x, true)) >= 0 &&
        (st = dt_ckpt_read(ck, j, 0, b.numel, y, true)) >= 0)
        *same = !memcmp(x, y, a.numel * sizeof *x);
    free(x);
    free(y);
    return st;
}

/* Every tensor of PEFT's file must be, under PEFT's prefix, an adapter of m or a parameter of a module to save (one
 * m trains beside its adapters); a weight tied to another (tie_word_embeddings) must hold its values, as PEFT's
 * ensure_weight_tying keeps them (without it PEFT trains the two apart, which a tied model cannot hold). */
static dt_status peft_keys(const dt_model *m, dt_ckpt *ck, const char *file)
{
    for (size_t i = 0, n = dt_ckpt_num_tensors(ck); i < n; i++) {
        dt_ckpt_tensor t;
        dt_status st = dt_ckpt_tensor_at(ck, i, &t);
        if (st < 0)
            return st;
        bool mag = false;
        char pn[1100], back[1200]; /* the model's parameter, and the key it is saved under */
        const bool under = dt__lora_peft_param(t.name, pn, sizeof pn), ad = under && dt__lora_peft_key(t.name, &mag);
        const int64_t k = under ? dt_model_find_entry(m, pn) : -1;
        dt_param_info e = {0};
        if (k >= 0)
            dt_model_entry(m, (size_t)k, &e);
        if (k >= 0)
            dt__lora_peft_name(&e, back, sizeof back);
        if (!under || (!ad && (k < 0 || strcmp(back, t.name))))
            return dt_error(DT_ERR_FORMAT, "%s: key '%s' is not a LoRA adapter as PEFT saves them ("
                            PEFT_PREFIX "<layer>.lora_A.weight / .lora_B.weight / .lora_magnitude_vector) nor a "
                            "parameter of this model (a module to save, a bias)", file, t.name);
        if (k < 0)
            return dt_error(DT_ERR_NOT_FOUND, "%s: key '%s': the model has no adapter '%s' (its layer is not a "
                            "target here, or not in this model%s)", file, t.name, pn, mag ? ", or it has no DoRA" : "");
        if (!ad && e.is_buffer)
            return dt_error(DT_ERR_MISMATCH, "%s: key '%s' is the model's '%s', which this run does not train (not in "
                            "modules_to_save, nor a bias the bias setting trains)", file, t.name, pn);
        if (!ad && e.tied_to >= 0) {
            dt_param_info src;
            char sk[1200];
            dt_model_entry(m, (size_t)e.tied_to, &src);
            snprintf(sk, sizeof sk, PEFT_PREFIX "%s", src.name);
            const int64_t j = dt_ckpt_find(ck, sk);
            bool same = false;
            if (j < 0)
                return dt_error(DT_ERR_NOT_FOUND, "%s: key '%s' without '%s', the weight it is tied to", file, t.name,
                                sk);
            if ((st = same_values(ck, i, (size_t)j, &same)) < 0)
                return st;
            if (!same)
                return dt_error(DT_ERR_MISMATCH, "%s: '%s' and '%s' differ, but this model ties them "
                                "(tie_word_embeddings): PEFT trained them apart (ensure_weight_tying false), dtrain "
                                "trains a tied weight as one", file, t.name, sk);
        }
    }
    return DT_OK;
}

dt_status dt_trainer_load_peft(dt_trainer *tr, const char *dir)
{
    if (!tr || !dir)
        return dt_error(DT_ERR_NULL, "dt_trainer_load_peft: NULL %s", tr ? "dir" : "trainer");
    char file[4200], blob[PATH_MAX];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    dt_ckpt *ck = NULL;
    struct stat sb;
    dt_status st = dt__ckpt_tp_known(tr, "loading LoRA adapters");
    /* adapters in the hub cache: read its blob (the messages name the file) */
    const char *src = dt_file_hf_cache_link(file, blob, sizeof blob) ? blob : file;
    if (st >= 0 && lstat(src, &sb) != 0)
        st = dt_error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "LoRA adapters %s: %s: %s (PEFT's "
                      "save_pretrained writes adapter_config.json and adapter_model.safetensors)", dir, file,
                      strerror(errno));
    else if (st >= 0 && !S_ISREG(sb.st_mode))
        st = dt_error(DT_ERR_FORMAT, "LoRA adapters %s: %s is not a regular file (symlinks are not followed)", dir,
                      file);
    if (st >= 0)
        st = dt_ckpt_open(src, &ck);
    if (st >= 0) /* an image-text model's adapters as its language model's; its vision tower's left out */
        st = dt__lora_peft_view(ck, file, NULL);
    if (st >= 0)
        st = peft_keys(dt_trainer_model(tr), ck, file);
    if (st >= 0)
        st = load_pieces(tr, ck, file, true, PEFT_PREFIX);
    dt_ckpt_close(ck);
    st = agree_load(tr, st);
    if (st >= 0)
        st = dt__strategy_after_load(dt_trainer_strategy(tr));
    return st;
}
