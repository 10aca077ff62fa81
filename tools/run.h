/* tools/run.h — internals of `dtrain run` (the local launcher), shared by
 * tools/cmd_run.c (options and the supervisor loop), tools/run_output.c
 * (rank-prefixed line forwarding and --tee files) and tools/run_env.c (job id,
 * free port, rank environment, shared-memory cleanup). */
#ifndef DT_TOOLS_RUN_H
#define DT_TOOLS_RUN_H

#include <stddef.h>
#include <sys/types.h>

/* Shared-memory segments of a job are named "/dev/shm/dtrain-<DT_JOB_ID>...";
 * the comm layer creates them with this prefix and the launcher removes any
 * that are left when a job (or one attempt of it) ends. */
#define DT_RUN_SHM_PREFIX "dtrain-"
/* DT_JOB_ID: 128 random bits as 32 lowercase hex digits (+ NUL). */
#define DT_RUN_JOB_ID_LEN 32

/* One output stream (stdout or stderr) of one rank: the read end of its pipe
 * and the partial line not yet forwarded. */
typedef struct {
    int fd;      /* read end of the rank's pipe; -1 once closed */
    int dst;     /* where prefixed lines go: 1 (stdout) or 2 (stderr) */
    int tee;     /* the rank's --tee file, or -1 (borrowed, not closed here) */
    int rank;    /* for the "[rank] " prefix */
    char *buf;   /* bytes after the last newline seen */
    size_t len, cap;
    int live;    /* forward \r-updates (a progress bar) at once: stdout on a terminal */
    size_t sent; /* bytes of buf already forwarded by a live update */
} dt__run_stream;

/* Read what the pipe holds and forward every complete line as "[rank] line".
 * Returns 1 while the pipe stays open, 0 at end of file (the partial last
 * line is flushed with a newline and the fd closed), -1 on error. */
int dt__run_stream_pump(dt__run_stream *s);
/* Forward a pending partial line (adding the newline) and close the pipe. */
void dt__run_stream_close(dt__run_stream *s);
/* Write all n bytes to fd, retrying on EINTR and short writes; 0 or -1. */
int dt__run_write_all(int fd, const char *p, size_t n);

/* Fill id with DT_RUN_JOB_ID_LEN hex digits from getrandom(); 0 or -1. */
int dt__run_job_id(char id[DT_RUN_JOB_ID_LEN + 1]);
/* A TCP port on 127.0.0.1 that was free a moment ago; 0 on failure. */
int dt__run_free_port(void);
/* Remove /dev/shm/dtrain-<job_id>*; returns how many were removed. */
int dt__run_shm_cleanup(const char *job_id);

/* The launcher-wide facts every rank's environment is built from. */
typedef struct {
    int world;             /* number of ranks */
    int restart;           /* DT_RESTART_COUNT of this attempt */
    int max_restarts;      /* --max-restarts */
    int port;              /* MASTER_PORT */
    const char *job_id;    /* DT_JOB_ID */
    int omp_threads;       /* OMP_NUM_THREADS to set, 0 = the user's is kept */
    int stdout_tty;        /* the launcher's stdout is a terminal: DT_STDOUT_TTY=1 (else 0) */
} dt__run_env;

/* In a forked child: set the rank's environment variables (see HELPERS.md
 * and `dtrain run --help`). Returns 0, or -1 if setenv failed. */
int dt__run_env_apply(const dt__run_env *e, int rank);

/* Several nodes (`dtrain run --nnodes N`, tools/run_nodes.c): what the
 * user asked for, torchrun's names. */
typedef struct {
    int nnodes, node_rank, nproc; /* N, R, K ranks per node */
    const char *master_addr;      /* node 0's host (torchrun's MASTER_ADDR) */
    int master_port;              /* 0 = 29500 (torchrun's default) */
    const char *hosts;            /* "H1,H2,...": the nodes' hosts, node-rank order; NULL = unknown */
    int dry_run;                  /* print the commands, run nothing */
    char **argv;                  /* PROGRAM ARGS..., NULL-terminated */
} dt__run_nodes;

/* Run (node rank 0: exec mpirun, which starts every node's ranks) or print
 * the mpirun and srun commands that do; returns the exit code. */
int dt__run_nodes_main(const dt__run_nodes *n);

#endif
