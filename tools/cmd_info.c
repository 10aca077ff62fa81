/* dtrain info — version, build options, compute library, CPU features. */
#include "cmd.h"
#include "dtrain/base.h"

#include <dnnl.h>
#include <stdio.h>
#include <string.h>

int dt_cmd_info(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dtrain info\n  prints the version, build options, compute library and CPU "
                   "features\n");
            return 0;
        }
        fprintf(stderr, "dtrain info: unexpected argument '%s' (dtrain info takes none)\n", argv[i]);
        return 2;
    }
    char feat[256];
    const dnnl_version_t *v = dnnl_version();
    printf("dtrain %s\n", DT_VERSION_STRING);
    printf("build: %s%s%s, mpi backend %s\n", DT_BUILD_TYPE, DT_SANITIZE_STR[0] ? ", sanitizers " : "",
           DT_SANITIZE_STR, DT_HAVE_MPI ? "yes" : "no");
    printf("compute: oneDNN %d.%d.%d (cpu runtime %s), OpenMP threads %d\n", v->major, v->minor,
           v->patch, v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other", dt_get_num_threads());
    printf("cpu features: %s\n", dt_cpu_features_str(dt_cpu_detect(), feat, sizeof feat));
    return 0;
}
