/* dtrain train — not built yet; the issue that adds it replaces this file. */
#include "cmd.h"

#include <stdio.h>

int dt_cmd_train(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "dtrain train: not available in this build yet\n");
    return 1;
}
