/* The rank environment of `dtrain run`: job id, rendezvous port, thread
 * count, the variables each rank gets, and removal of a job's leftover
 * shared-memory segments.
 *
 * The job id names the job's shared-memory segments, so it must not be
 * guessable by other users of the machine (a predictable name lets them
 * create the segment first): 128 bits from getrandom(). */
#include "run.h"

#include "dtrain/comm.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

int dt__run_job_id(char id[DT_RUN_JOB_ID_LEN + 1])
{
    unsigned char raw[DT_RUN_JOB_ID_LEN / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)r;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        id[2 * i] = hex[raw[i] >> 4];
        id[2 * i + 1] = hex[raw[i] & 15];
    }
    id[DT_RUN_JOB_ID_LEN] = '\0';
    return 0;
}

int dt__run_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

int dt__run_shm_cleanup(const char *job_id)
{
    /* Two kinds of names belong to a job: anything "dtrain-<job id>..." and
     * the shm backend's segment, which the library names and removes
     * (dt_pg_job_cleanup). Subgroup segments have random names the launcher
     * cannot know; the backend unlinks those as soon as every rank has
     * attached. */
    int removed = 0;
    if (dt_pg_job_cleanup(job_id, &removed) < 0)
        removed = 0;
    char prefix[64];
    snprintf(prefix, sizeof prefix, DT_RUN_SHM_PREFIX "%s", job_id);
    size_t plen = strlen(prefix);
    DIR *d = opendir("/dev/shm");
    if (!d)
        return removed;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}

static int setenv_int(const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    return setenv(name, buf, 1);
}

int dt__run_env_apply(const dt__run_env *e, int rank)
{
    /* A launcher started under mpirun or srun must not let its ranks believe
     * they are MPI or Slurm tasks: those variables describe the launcher. */
    static const char *const foreign[] = {
        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
        "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
        "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID",
        "SLURM_LOCALID",
    };
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++)
        unsetenv(foreign[i]);
    int bad = 0;
    /* torchrun's contract (single node: local == global). */
    bad |= setenv_int("RANK", rank);
    bad |= setenv_int("WORLD_SIZE", e->world);
    bad |= setenv_int("LOCAL_RANK", rank);
    bad |= setenv_int("LOCAL_WORLD_SIZE", e->world);
    bad |= setenv_int("GROUP_RANK", 0);
    bad |= setenv_int("GROUP_WORLD_SIZE", 1);
    bad |= setenv("MASTER_ADDR", "127.0.0.1", 1);
    bad |= setenv_int("MASTER_PORT", e->port);
    bad |= setenv_int("TORCHELASTIC_RESTART_COUNT", e->restart);
    bad |= setenv_int("TORCHELASTIC_MAX_RESTARTS", e->max_restarts);
    bad |= setenv("TORCHELASTIC_RUN_ID", e->job_id, 1);
    /* dtrain's own. */
    bad |= setenv_int("DT_RANK", rank);
    bad |= setenv_int("DT_WORLD_SIZE", e->world);
    bad |= setenv_int("DT_LOCAL_RANK", rank);
    bad |= setenv_int("DT_LOCAL_WORLD_SIZE", e->world);
    bad |= setenv("DT_JOB_ID", e->job_id, 1);
    bad |= setenv_int("DT_RESTART_COUNT", e->restart);
    bad |= setenv_int("DT_STDOUT_TTY", e->stdout_tty);
    bad |= setenv_int("DT_MAX_RESTARTS", e->max_restarts);
    if (e->omp_threads > 0)
        bad |= setenv_int("OMP_NUM_THREADS", e->omp_threads);
    return bad ? -1 : 0;
}
