/* Model-state memory, measured against the ZeRO formula (offload.h), and
 * what NVMe offload saves. Run by bench/offload_memory.sh; not a test.
 *
 *   offload_mem formula                 the estimator's table: psi = the
 *       "mlp" model's parameters, N = 1, 2, 4, stages 0-3, f32 AdamW, next to
 *       the paper's mixed-precision (2 + 2 + 12) figures
 *   offload_mem measure DIM HIDDEN DIR  one process per case (none, nvme:DIR):
 *       an MLP of 2 * DIM * HIDDEN parameters, one AdamW trainer step; prints
 *       the bytes the trainer holds (parameter and gradient flats, optimizer
 *       state in memory) next to the estimate, and the peak RSS.
 * The measured bytes are the allocations themselves (flat sizes, state
 * buffer sizes), so the comparison is exact; RSS also counts activations,
 * the library and the data. */
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

static int formula(void)
{
    dt_model *m;
    dt_model_config cfg = dt_model_config_default();
    cfg.build.meta = true;
    if (dt_model_create("mlp", 0, &cfg, &m, NULL) < 0) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    size_t psi = dt_model_param_count(m);
    dt_model_free(m);
    printf("ZeRO model-state bytes per rank for psi = %zu (the mlp), AdamW\n", psi);
    printf("%-6s %-3s %16s %16s %16s %16s\n", "stage", "N", "f32 (4+4+8)", "formula f32", "mixed (2+2+12)",
           "formula mixed");
    int bad = 0;
    for (int n = 1; n <= 4; n *= 2)
        for (int s = 0; s <= 3; s++) {
            dt_mem_policy p = {.numel = psi, .world = n, .zero_stage = s, .optimizer = DT_OPTIM_ADAMW, .param_bytes = 4};
            dt_mem_estimate e32, e16;
            dt_mem_model_states(&p, &e32);
            p.param_bytes = 2;
            p.master_weights = true;
            dt_mem_model_states(&p, &e16);
            double P = (double)psi, sh = (double)((psi + (size_t)n - 1) / (size_t)n);
            /* the paper's rows, written out independently of the library */
            double f32 = s == 0 ? 16 * P : s == 1 ? 8 * P + 8 * sh : s == 2 ? 4 * P + 12 * sh : 16 * sh;
            double f16 = s == 0 ? 16 * P : s == 1 ? 4 * P + 12 * sh : s == 2 ? 2 * P + 14 * sh : 16 * sh;
            bad |= e32.total != f32 || e16.total != f16;
            printf("%-6d %-3d %16.0f %16.0f %16.0f %16.0f%s\n", s, n, e32.total, f32, e16.total, f16,
                   e32.total != f32 || e16.total != f16 ? "  MISMATCH" : "");
        }
    printf("%s\n", bad ? "formula check: MISMATCH" : "formula check: every row equal");
    return bad;
}

static int measure_one(int64_t dim, int64_t hidden, const char *dir)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.mlp_dim = dim;
    cfg.mlp_hidden = hidden;
    cfg.mlp_seq = 8;
    dt_model *m;
    dt_model_desc d;
    if (dt_model_create("mlp", 0, &cfg, &m, &d) < 0)
        return fprintf(stderr, "%s\n", dt_last_error()), 1;
    dt_strategy *s;
    dt_strategy_none_init(&s);
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW;
    tp.loss_fn = dt_model_desc_loss_fn;
    tp.loss_ud = &d;
    if (dir) {
        tp.offload.device = DT_OFFLOAD_NVME;
        tp.offload.nvme_path = dir;
        tp.offload.sub_group_size = (size_t)1 << 23;
    }
    dt_trainer *tr;
    if (dt_trainer_init(m, s, &tp, &tr) < 0)
        return fprintf(stderr, "%s\n", dt_last_error()), 1;
    const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32), *G = dt_model_flat(m, DT_FLAT_GRADS, DT_F32);
    double held_p = (double)dt_flat_nbytes(P), held_g = (double)dt_flat_nbytes(G), held_o = 0;
    dt_optim *o = dt_trainer_optim(tr);
    for (size_t r = 0; r < dt_optim_num_ranges(o); r++)
        for (int i = 0; i < dt_optim_num_states(o); i++) {
            size_t n;
            dt_optim_state(o, r, i, NULL, NULL, &n);
            held_o += 4.0 * (double)n;
        }
    if (dt_trainer_offload(tr))
        held_o = (double)dt_offload_optim_buffer_bytes(dt_trainer_offload(tr));
    int64_t xs[DT_MAX_DIMS];
    int nd;
    dt_model_desc_shapes(&d, 1, &nd, xs, NULL, NULL, NULL);
    size_t nx = 1;
    for (int i = 0; i < nd; i++)
        nx *= (size_t)xs[i];
    float *x = calloc(nx, sizeof(float));
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    dt_trainer_batch b = dt_trainer_batch_make(x, DT_F32, nd, xs, NULL, DT_F32, 0, NULL);
    dt_trainer_metrics r;
    double t0 = dt_time_s();
    if (dt_trainer_step(tr, &b, 1, &r) < 0)
        return fprintf(stderr, "%s\n", dt_last_error()), 1;
    double t = dt_time_s() - t0;
    dt_mem_policy mp = {.numel = P->total, .world = 1, .optimizer = DT_OPTIM_ADAMW, .param_bytes = 4,
                        .offload = dir ? DT_OFFLOAD_NVME : DT_OFFLOAD_NONE,
                        .offload_buffer_bytes = (size_t)held_o};
    dt_mem_estimate e;
    dt_mem_model_states(&mp, &e);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("%-5s psi %zu: held params %.0f grads %.0f optimizer %.0f = %.3f GiB; estimate %.3f GiB (%s); "
           "step %.1f s, loss %.6f; peak RSS %.3f GiB\n",
           dir ? "nvme" : "none", P->total, held_p, held_g, held_o, gib(held_p + held_g + held_o), gib(e.total),
           held_p + held_g + held_o == e.total ? "equal" : "DIFFERENT", t, r.loss, gib((double)ru.ru_maxrss * 1024));
    if (dt_trainer_offload(tr)) {
        dt_nvme_stats ns;
        dt_nvme_store *st = dt_offload_optim_store(dt_trainer_offload(tr));
        dt_nvme_store_stats(st, &ns);
        printf("      engine %s, %zu sub-groups, %.0f MiB read, %.0f MiB written, %.2f s waiting for I/O\n",
               dt_offload_io_name(dt_nvme_store_io(st)), dt_offload_optim_num_subgroups(dt_trainer_offload(tr)),
               ns.bytes_read / 1048576.0, ns.bytes_written / 1048576.0, ns.wait_s);
    }
    free(x);
    dt_trainer_free(tr);
    dt_model_free(m);
    return held_p + held_g + held_o == e.total ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "formula"))
        return formula();
    if (argc == 5 && !strcmp(argv[1], "measure")) {
        int rc = 0;
        for (int c = 0; c < 2; c++) { /* separate processes: separate peak RSS */
            fflush(NULL);
            pid_t pid = fork();
            if (pid < 0) {
                perror("offload_mem: fork");
                return 1;
            }
            if (pid == 0) {
                int r = measure_one(atoll(argv[2]), atoll(argv[3]), c ? argv[4] : NULL);
                fflush(NULL);
                _exit(r);
            }
            int status;
            waitpid(pid, &status, 0);
            rc |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        }
        return rc;
    }
    fprintf(stderr, "usage: offload_mem formula | offload_mem measure DIM HIDDEN DIR\n");
    return 2;
}
