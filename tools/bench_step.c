/* dtrain bench step — not built yet; the issue that adds it replaces this file. */
#include "cmd.h"

#include <stdio.h>

int dt_bench_step(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "dtrain bench step: not available in this build yet\n");
    return 1;
}
