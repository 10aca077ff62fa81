/* dtrain info — version, build options, compute library, CPU features, the
 * code paths chosen for this CPU. */
#include "cmd.h"
#include "dtrain/base.h"
#include "dtrain/kernels.h"

#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dt_cmd_info(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dtrain info\n  prints the version, build options, compute library, the CPU's "
                   "model and features, the instruction sets dtrain and oneDNN use and the activation layout\n");
            return 0;
        }
        dt__cli_err("dtrain info: unexpected argument '%s' (dtrain info takes none)\n", argv[i]);
        return 2;
    }
    char feat[256];
    const dnnl_version_t *v = dnnl_version();
    printf("dtrain %s\n", DT_VERSION_STRING);
    printf("build: %s%s%s, mpi backend %s, zstd (parquet: data) %s\n", DT_BUILD_TYPE,
           DT_SANITIZE_STR[0] ? ", sanitizers " : "", DT_SANITIZE_STR, DT_HAVE_MPI ? "yes" : "no",
           DT_HAVE_ZSTD ? "yes" : "no");
    printf("compute: oneDNN %d.%d.%d (cpu runtime %s), OpenMP threads %d\n", v->major, v->minor,
           v->patch, v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other", dt_get_num_threads());
    const char *wp = getenv("OMP_WAIT_POLICY"), *sc = getenv("GOMP_SPINCOUNT"), *dw = getenv("DT_OMP_WAIT");
    if (dw && !strncmp(dw, "default", 7) && (!wp != !sc))
        printf("OpenMP waiting: %s%s (dtrain's default for %s machine at start (%s): %s; OMP_WAIT_POLICY or "
               "GOMP_SPINCOUNT set choose another)\n", sc ? "GOMP_SPINCOUNT=" : "", sc ? sc : wp,
               sc ? "an idle" : "a busy", dw[7] == ',' ? dw + 9 : "load unknown",
               sc ? "a short spin before sleeping" : "threads sleep at once, no spinning on shared cores");
    else if (wp || sc)
        printf("OpenMP waiting: %s%s%s%s%s (from the environment)\n", wp ? "OMP_WAIT_POLICY=" : "", wp ? wp : "",
               wp && sc ? ", " : "", sc ? "GOMP_SPINCOUNT=" : "", sc ? sc : "");
    else
        printf("OpenMP waiting: the runtime's default (spins before sleeping)\n");
    char model[160];
    printf("cpu: %s\n", dt_cpu_model_str(model, sizeof model));
    printf("cpu features: %s\n", dt_cpu_features_str(dt_cpu_detect_hw(), feat, sizeof feat));
    dt_cpu_isa_cap cap = dt_cpu_max_isa();
    printf("dtrain isa: %s (DT_MAX_CPU_ISA=%s; features used: %s), conversions %s\n",
           cap == DT_CPU_ISA_ALL ? "no cap" : "capped", dt_cpu_isa_cap_name(cap),
           dt_cpu_features_str(dt_cpu_detect(), feat, sizeof feat), dt_k_isa_name(dt_k_get_isa()));
    const char *one = getenv("ONEDNN_MAX_CPU_ISA");
    printf("oneDNN isa: %s%s%s%s\n", dt_k_onednn_isa(), one ? " (ONEDNN_MAX_CPU_ISA=" : "", one ? one : "",
           one ? ")" : "");
    const char *amx_why = NULL;
    bool amx = dt_k_matmul_amx(&amx_why);
    bool part = !amx && !strncmp(amx_why, "auto", 4); /* auto on AMX: a training step's products on dtrain's */
    printf("bf16 matmul: %s\n", amx    ? "dtrain's AMX GEMM (tdpbf16ps tiles)"
                                 : part ? "dtrain's AMX GEMM (tdpbf16ps tiles) for a training step's products, "
                                          "oneDNN on AMX tiles for decode rows and small ones"
                                 : strstr(dt_k_onednn_isa(), "amx") ? "oneDNN on AMX tiles"
                                 : dt_k_matmul_native(DT_BF16)
                                     ? "oneDNN, native bf16"
                                     : "widened to f32 exactly, then oneDNN's f32 matmul (no native bf16 matmul "
                                       "here: no AVX512_BF16, or oneDNN capped below it)");
    if (part)
        printf("dtrain AMX GEMM: %s\n", amx_why);
    else if (!amx)
        printf("dtrain AMX GEMM: off (%s)\n", amx_why);
    int64_t min_t = 0;
    const char *att = dt_k_attention_lp_tiles(&min_t);
    const char *where = att && !strcmp(att, "amx") ? "the AMX tiles" : "vdpbf16ps tile by tile (no AMX)";
    if (att && min_t > 1)
        printf("bf16 attention: its products on %s from %lld tokens, shorter sequences on the vdpbf16ps rows\n",
               where, (long long)min_t);
    else if (att)
        printf("bf16 attention: its products on %s at every length (DT_ATTN_AMX=on)\n", where);
    else
        printf("bf16 attention: on the vector rows%s\n", dt_k_get_isa() == DT_K_ISA_AVX512_BF16
                                                            ? " (DT_ATTN_AMX=off, or no tiles built here)"
                                                            : " (no AVX512_BF16 path here: its products widen to f32)");
    const char *blk = getenv("DT_BLOCKED");
    int pref = dt_k_onednn_block(), use = dt_k_act_block();
    printf("activation layout: %s (oneDNN prefers %s%s%s%s)\n", dt_k_block_name(use), dt_k_block_name(pref),
           blk ? "; DT_BLOCKED=" : "", blk ? blk : "", use == pref ? "" : "; not the preferred layout: more reorders");
    return 0;
}
