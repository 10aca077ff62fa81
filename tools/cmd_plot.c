/* dtrain plot — not built yet; the issue that adds it replaces this file. */
#include "cmd.h"

#include <stdio.h>

int dt_cmd_plot(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "dtrain plot: not available in this build yet\n");
    return 1;
}
