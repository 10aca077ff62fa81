/* dtrain run — start N local ranks and supervise them.
 *
 *     dtrain run -n N [--max-restarts K] [--tee DIR] [--grace S] -- PROGRAM ARGS...
 *
 * The supervisor is one thread around one poll() loop. Each rank is forked
 * into its own process group (so that stopping a rank also stops whatever it
 * started, and so that a terminal's Ctrl-C reaches the ranks only through the
 * launcher, exactly once), with its stdout and stderr on pipes and
 * PR_SET_PDEATHSIG so the ranks die with the launcher even if it is
 * SIGKILLed. Signals reach the loop through a self-pipe: SIGCHLD reaps,
 * SIGINT/SIGTERM/SIGHUP are forwarded to every rank and end the job,
 * SIGUSR1/SIGUSR2 are forwarded only.
 *
 * Failure policy (torchrun's): when any rank fails (non-zero exit or a
 * signal), all the others are stopped: SIGTERM, then SIGKILL after the grace
 * period (default 3 s, so every rank is gone within ~3 s of the failure).
 * Then either the whole job is started again with DT_RESTART_COUNT + 1 (up
 * to --max-restarts times), or the launcher exits with the failed rank's exit
 * code (128 + signal number when it was killed). A restarted job starts
 * from scratch unless the program resumes itself: dtrain train --resume auto
 * loads the newest complete checkpoint of its --save directory. Between attempts and at the
 * end, shared-memory segments named after the job id are removed. */
#include "cmd.h"
#include "dtrain/base.h"
#include "dtrain/comm.h"
#include "run.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define DT_RUN_MAX_RANKS 1024

typedef struct {
    int nranks;
    int max_restarts;
    double grace_s;
    const char *tee_dir;
    int master_port;     /* 0 = pick a free one per attempt */
    int nnodes, node_rank;  /* --nnodes (1), --node-rank (0) */
    const char *master_addr, *hosts; /* --master-addr, --hosts (several nodes) */
    int dry_run;
    char **argv;         /* PROGRAM ARGS..., NULL-terminated */
} run_opts;

typedef struct {
    pid_t pid;
    int alive;
    int status;          /* wait status once reaped */
    dt__run_stream out, err;
    int tee;             /* fd of tee_file, or -1 */
    dt_file *tee_file;   /* --tee DIR/rank<r>.log (dt_file: no symlink followed) */
} rank_proc;

/* How an attempt ended. */
typedef struct {
    int failed_rank;     /* first rank that failed, -1 if none */
    int status;          /* its wait status */
    int signo;           /* launcher signal that ended the job, 0 if none */
} attempt_result;

static int sig_pipe[2] = {-1, -1};

static void on_signal(int signo)
{
    int saved = errno;
    unsigned char b = (unsigned char)signo;
    ssize_t r = write(sig_pipe[1], &b, 1);
    (void)r;
    errno = saved;
}

static const int handled_signals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};
#define N_HANDLED ((int)(sizeof handled_signals / sizeof handled_signals[0]))

static int install_signals(void)
{
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_HANDLED; i++)
        if (sigaction(handled_signals[i], &sa, NULL) < 0)
            return -1;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain run -n N [options] -- PROGRAM [ARGS...]\n"
            "\n"
            "Start N ranks of PROGRAM on this machine and supervise them.\n"
            "\n"
            "options:\n"
            "  -n, --nproc N         number of ranks (1..%d); also --nproc-per-node N\n"
            "  --max-restarts K      restart all ranks up to K times after a failure (0);\n"
            "                        with dtrain train --save DIR --save-every N --resume auto\n"
            "                        they continue from the newest complete checkpoint;\n"
            "                        a rank that exits 2 (bad input) is not restarted; a PROGRAM\n"
            "                        that cannot be executed is refused (exit 2) before any starts\n"
            "  --tee DIR             also write rank r's output to DIR/rank<r>.log (DIR is this\n"
            "                        job's while it runs: another job given it is refused)\n"
            "  --grace S             seconds between SIGTERM and SIGKILL when stopping (3)\n"
            "  --master-port P       MASTER_PORT (default: a free port per attempt; 29500 with\n"
            "                        --nnodes)\n"
            "\n"
            "several nodes (torchrun's form; the job runs under Open MPI):\n"
            "  --nnodes N            number of nodes (1); -n is then ranks per node\n"
            "  --node-rank R         this node (0..N-1); node 0 starts the job with mpirun,\n"
            "                        other nodes only print what node 0 runs\n"
            "  --master-addr A       node 0's host (MASTER_ADDR)\n"
            "  --hosts H0,H1,...     the N nodes' hosts, node 0 first; without them the mpirun\n"
            "                        and srun commands are printed instead (exit 2)\n"
            "  --dry-run             print the mpirun and srun commands, run nothing\n"
            "  $DT_MPIRUN_ARGS       extra mpirun options (an rsh agent, btl_tcp_if_include)\n"
            "torchrun's spellings work too: --nproc_per_node=2, --node_rank 1, --master_addr=A.\n"
            "\n"
            "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,\n"
            "MASTER_PORT (torchrun's names), DT_RANK, DT_WORLD_SIZE, DT_LOCAL_RANK,\n"
            "DT_LOCAL_WORLD_SIZE, DT_JOB_ID (random, per job), DT_RESTART_COUNT,\n"
            "DT_MAX_RESTARTS, DT_STDOUT_TTY (1 when this launcher's stdout is a terminal)\n"
            "and OMP_NUM_THREADS = max(1, cores / N) unless already set. Output lines are\n"
            "prefixed with \"[rank] \", except stdout lines that are a whole JSON object or\n"
            "array (--json output), which pass unchanged so that `| jq .` works. When a\n"
            "rank fails the others are stopped and the job restarts or exits with the\n"
            "rank's exit code (128 + signal if killed).\n",
            DT_RUN_MAX_RANKS);
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    int64_t v;
    if (dt_parse_int("value", s, lo, hi, &v) < 0)
        return -1;
    *out = (int)v;
    return 0;
}

/* Returns 0 to run, 1 when help was printed, 2 on bad usage. */
static int parse_args(int argc, char **argv, run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->nranks = -1;
    o->nnodes = 1;
    o->grace_s = 3.0;
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        /* torchrun's spellings: --nproc_per_node=2 is --nproc-per-node 2 */
        char norm[64];
        int inl = 0; /* the value came with the flag: consume no argument */
        if (a[0] == '-' && a[1] == '-' && a[2] && strlen(a) < sizeof norm) {
            size_t k = 0;
            for (; a[k] && a[k] != '='; k++)
                norm[k] = a[k] == '_' && k > 2 ? '-' : a[k];
            norm[k] = '\0';
            if (a[k] == '=') {
                v = a + k + 1;
                inl = 1;
            }
            a = norm;
        }
        if (!strcmp(a, "--")) {
            i++;
            break;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--nproc") || !strcmp(a, "--nproc-per-node")) {
            if (!v || parse_int(v, 1, DT_RUN_MAX_RANKS, &o->nranks) < 0) {
                dt__cli_err("dtrain run: %s needs a rank count in 1..%d\n", a, DT_RUN_MAX_RANKS);
                return 2;
            }
            i += !inl;
        } else if (!strcmp(a, "--max-restarts")) {
            if (!v || parse_int(v, 0, 1000000, &o->max_restarts) < 0) {
                dt__cli_err("dtrain run: --max-restarts needs a count >= 0\n");
                return 2;
            }
            i += !inl;
        } else if (!strcmp(a, "--tee")) {
            if (!v || !*v) {
                dt__cli_err("dtrain run: --tee needs a directory\n");
                return 2;
            }
            o->tee_dir = v;
            i += !inl;
        } else if (!strcmp(a, "--grace")) {
            if (!v || dt_parse_double("--grace", v, 0, 3600, &o->grace_s) < 0) {
                dt__cli_err("dtrain run: --grace needs seconds in 0..3600\n");
                return 2;
            }
            i += !inl;
        } else if (!strcmp(a, "--nnodes") || !strcmp(a, "--node-rank") || !strcmp(a, "--node_rank")) {
            int lo = a[2] == 'n' && a[3] == 'n' ? 1 : 0;
            if (!v || parse_int(v, lo, 100000, lo ? &o->nnodes : &o->node_rank) < 0) {
                dt__cli_err("dtrain run: %s needs a %s\n", a, lo ? "node count >= 1" : "node rank >= 0");
                return 2;
            }
            i += !inl;
        } else if (!strcmp(a, "--master-addr") || !strcmp(a, "--master_addr") || !strcmp(a, "--hosts")) {
            if (!v || !*v) {
                dt__cli_err("dtrain run: %s needs a value\n", a);
                return 2;
            }
            *(a[2] == 'h' ? &o->hosts : &o->master_addr) = v;
            i += !inl;
        } else if (!strcmp(a, "--dry-run")) {
            if (inl) {
                dt__cli_err("dtrain run: --dry-run takes no value\n");
                return 2;
            }
            o->dry_run = 1;
        } else if (!strcmp(a, "--master-port") || !strcmp(a, "--master_port")) {
            if (!v || parse_int(v, 1, 65535, &o->master_port) < 0) {
                dt__cli_err("dtrain run: --master-port needs a port in 1..65535\n");
                return 2;
            }
            i += !inl;
        } else if (a[0] == '-') {
            static const char *const names[] = {"nproc", "nproc-per-node", "max-restarts", "tee", "grace",
                                                "nnodes", "node-rank", "master-addr", "hosts", "dry-run",
                                                "master-port", "help"};
            const char *near = a[1] == '-' ? dt__cli_suggest(a + 2, names, sizeof names / sizeof names[0]) : NULL;
            if (near)
                dt__cli_err("dtrain run: unknown option '%s' (did you mean --%s? see dtrain run --help)\n", a, near);
            else
                dt__cli_err("dtrain run: unknown option '%s' (see dtrain run --help)\n", a);
            return 2;
        } else {
            break; /* the program, without a "--" before it */
        }
    }
    if (o->nranks < 0) {
        dt__cli_err("dtrain run: missing -n N (the number of ranks)\n");
        usage(stderr);
        return 2;
    }
    if (i >= argc) {
        dt__cli_err("dtrain run: missing the program to run (dtrain run -n N -- PROGRAM ARGS...)\n");
        return 2;
    }
    o->argv = argv + i;
    if (o->node_rank >= o->nnodes) {
        dt__cli_err("dtrain run: --node-rank %d is not below --nnodes %d\n", o->node_rank, o->nnodes);
        return 2;
    }
    if (o->nnodes == 1 && (o->hosts || o->dry_run)) {
        dt__cli_err("dtrain run: --hosts and --dry-run are for several nodes (--nnodes N > 1)\n");
        return 2;
    }
    return 0;
}

static void describe_status(int status, char *buf, size_t n)
{
    if (WIFEXITED(status))
        snprintf(buf, n, "exited with code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, n, "was killed by signal %d (SIG%s)%s", WTERMSIG(status),
                 sigabbrev_np(WTERMSIG(status)) ? sigabbrev_np(WTERMSIG(status)) : "?",
                 WCOREDUMP(status) ? ", core dumped" : "");
    else
        snprintf(buf, n, "ended with wait status 0x%x", status);
}

static int status_failed(int status)
{
    return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void signal_ranks(rank_proc *rk, int n, int signo)
{
    for (int r = 0; r < n; r++)
        if (rk[r].alive && rk[r].pid > 1) /* never kill(-1) or kill(0): every process */
            kill(-rk[r].pid, signo);
}

/* The child side of fork(): become a rank and exec the program. Only
 * async-signal-safe work matters here in principle; the launcher is
 * single-threaded, so setenv is safe as well. */
static void child_exec(const run_opts *o, const dt__run_env *env, int rank, int out_w, int err_w,
                       pid_t launcher)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_HANDLED; i++)
        sigaction(handled_signals[i], &sa, NULL);
    sigaction(SIGPIPE, &sa, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher)
        _exit(1); /* the launcher died before prctl took effect */
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
        dup2(devnull, 0);
        if (devnull > 2)
            close(devnull);
    }
    dup2(out_w, 1);
    dup2(err_w, 2);
    if (dt__run_env_apply(env, rank) < 0)
        dprintf(2, "dtrain run: cannot set the environment of rank %d\n", rank);
    execvp(o->argv[0], o->argv);
    dprintf(2, "dtrain run: cannot execute '%s': %s\n", o->argv[0], strerror(errno));
    _exit(127);
}

static int spawn_rank(const run_opts *o, const dt__run_env *env, rank_proc *p, int rank)
{
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) < 0)
        return -1;
    if (pipe2(err, O_CLOEXEC) < 0) {
        close(out[0]);
        close(out[1]);
        return -1;
    }
    fflush(NULL);
    pid_t launcher = getpid();
    /* Block our signals across fork: a signal that reached the child before
     * it reset the handlers would run on_signal() there and write into the
     * launcher's self-pipe, as if the launcher had received it. The child
     * unblocks them once their dispositions are back to the defaults. */
    sigset_t all, old;
    sigemptyset(&all);
    for (int i = 0; i < N_HANDLED; i++)
        sigaddset(&all, handled_signals[i]);
    sigprocmask(SIG_BLOCK, &all, &old);
    pid_t pid = fork();
    if (pid == 0)
        child_exec(o, env, rank, out[1], err[1], launcher);
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        close(out[0]), close(out[1]), close(err[0]), close(err[1]);
        errno = fork_errno;
        return -1;
    }
    setpgid(pid, pid); /* also here, so kill(-pid) works before the child runs */
    close(out[1]);
    close(err[1]);
    p->pid = pid;
    p->alive = 1;
    p->status = 0;
    p->out = (dt__run_stream){.fd = out[0], .dst = 1, .tee = p->tee, .rank = rank, .live = isatty(1)};
    p->err = (dt__run_stream){.fd = err[0], .dst = 2, .tee = p->tee, .rank = rank};
    return 0;
}

static void reap(rank_proc *rk, int n, attempt_result *res, int *stopping, double *kill_at,
                 double grace_s)
{
    for (;;) {
        /* Peek first (WNOWAIT): while the rank is an unreaped zombie its pid
         * cannot be reused, so killing its process group hits only what the
         * rank left behind. */
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0 || info.si_pid == 0)
            return;
        pid_t pid = info.si_pid;
        int r = 0;
        while (r < n && !(rk[r].alive && rk[r].pid == pid))
            r++;
        if (r < n && (*stopping || info.si_code != CLD_EXITED || info.si_status != 0))
            kill(-pid, SIGKILL);
        int status;
        if (waitpid(pid, &status, 0) < 0 || r == n)
            continue;
        rk[r].alive = 0;
        rk[r].status = status;
        if (!*stopping && status_failed(status)) {
            char how[128];
            describe_status(status, how, sizeof how);
            dt__cli_err("dtrain run: rank %d (pid %d) %s; stopping the other ranks\n", r,
                    (int)pid, how);
            res->failed_rank = r;
            res->status = status;
            *stopping = 1;
            *kill_at = dt_time_s() + grace_s;
            signal_ranks(rk, n, SIGTERM);
        }
    }
}

/* Run one attempt of the job to its end. Returns 0, or -1 if the ranks could
 * not be started (the message is printed). */
static int run_attempt(const run_opts *o, const dt__run_env *env, rank_proc *rk,
                       attempt_result *res)
{
    int n = o->nranks;
    res->failed_rank = -1;
    res->status = 0;
    res->signo = 0;
    int stopping = 0;
    double kill_at = 0, drain_until = 0;
    int killed = 0;
    for (int r = 0; r < n; r++)
        rk[r].pid = 0, rk[r].alive = 0, rk[r].out.fd = rk[r].err.fd = -1;
    for (int r = 0; r < n; r++) {
        if (spawn_rank(o, env, &rk[r], r) < 0) {
            dt__cli_err("dtrain run: cannot start rank %d: %s\n", r, strerror(errno));
            stopping = 1;
            kill_at = dt_time_s() + o->grace_s;
            res->failed_rank = r;
            res->status = 127 << 8;
            signal_ranks(rk, r, SIGTERM);
            break;
        }
    }
    struct pollfd *pf = calloc((size_t)(2 * n + 1), sizeof *pf);
    dt__run_stream **ps = calloc((size_t)(2 * n + 1), sizeof *ps);
    if (!pf || !ps) {
        free(pf);
        free(ps);
        signal_ranks(rk, n, SIGKILL);
        return -1;
    }
    for (;;) {
        int alive = 0, open_streams = 0;
        for (int r = 0; r < n; r++)
            alive += rk[r].alive, open_streams += (rk[r].out.fd >= 0) + (rk[r].err.fd >= 0);
        double now = dt_time_s();
        if (!alive) {
            if (drain_until == 0)
                drain_until = now + 2.0; /* grandchildren may hold the pipes open */
            if (!open_streams || now >= drain_until)
                break;
        }
        if (stopping && alive && !killed && now >= kill_at) {
            signal_ranks(rk, n, SIGKILL);
            killed = 1;
        }
        double wake = 1.0;
        if (stopping && alive && !killed)
            wake = kill_at - now;
        if (!alive)
            wake = drain_until - now;
        int timeout_ms = wake <= 0 ? 0 : (int)(wake * 1000) + 1;
        if (timeout_ms > 1000)
            timeout_ms = 1000; /* a lost SIGCHLD cannot stall us for long */
        nfds_t k = 0;
        pf[k++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
        for (int r = 0; r < n; r++) {
            dt__run_stream *s2[2] = {&rk[r].out, &rk[r].err};
            for (int j = 0; j < 2; j++)
                if (s2[j]->fd >= 0) {
                    ps[k] = s2[j];
                    pf[k++] = (struct pollfd){.fd = s2[j]->fd, .events = POLLIN};
                }
        }
        int pr = poll(pf, k, timeout_ms);
        if (pr < 0 && errno != EINTR)
            break;
        if (pr > 0 && (pf[0].revents & POLLIN)) {
            unsigned char sigs[64];
            ssize_t m;
            while ((m = read(sig_pipe[0], sigs, sizeof sigs)) > 0) {
                for (ssize_t j = 0; j < m; j++) {
                    int sg = sigs[j];
                    if (sg == SIGCHLD)
                        continue;
                    if (sg == SIGUSR1 || sg == SIGUSR2) {
                        signal_ranks(rk, n, sg);
                        continue;
                    }
                    if (res->signo && !killed) {
                        dt__cli_err("dtrain run: second signal; killing the ranks\n");
                        signal_ranks(rk, n, SIGKILL);
                        killed = 1;
                        continue;
                    }
                    if (!res->signo) {
                        dt__cli_err("dtrain run: got SIG%s; forwarding it to the ranks\n",
                                sigabbrev_np(sg) ? sigabbrev_np(sg) : "?");
                        res->signo = sg;
                        signal_ranks(rk, n, sg);
                        if (!stopping) {
                            stopping = 1;
                            kill_at = dt_time_s() + o->grace_s;
                        }
                    }
                }
            }
        }
        reap(rk, n, res, &stopping, &kill_at, o->grace_s);
        for (nfds_t j = 1; pr > 0 && j < k; j++)
            if (pf[j].revents & (POLLIN | POLLHUP | POLLERR))
                dt__run_stream_pump(ps[j]);
    }
    for (int r = 0; r < n; r++) {
        dt__run_stream_close(&rk[r].out);
        dt__run_stream_close(&rk[r].err);
    }
    free(pf);
    free(ps);
    return 0;
}

/* --tee DIR: DIR/rank<R>.log for every rank. Everything is checked and
 * every new log created (beside its name: dt_file) before any is renamed
 * into place, so a refused --tee (a planted symlink, a directory in the
 * way, an unwritable DIR) leaves the previous job's logs as they were.
 * DIR itself must be a directory, not a symlink. The launcher holds
 * DIR (dt_dir_lock) for its life (the kernel drops it when the
 * launcher ends): a second job given the same DIR is refused instead of
 * replacing the logs of one still running. Bad input: exit 2. */
static int open_tee(const run_opts *o, rank_proc *rk)
{
    for (int r = 0; r < o->nranks; r++)
        rk[r].tee = -1;
    if (!o->tee_dir)
        return 0;
    struct stat sb;
    memset(&sb, 0, sizeof sb);
    if (mkdir(o->tee_dir, 0755) < 0 && errno != EEXIST) {
        dt__cli_err("dtrain run: cannot create --tee directory '%s': %s\n", o->tee_dir, strerror(errno));
        return -1;
    }
    if (lstat(o->tee_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        dt__cli_err("dtrain run: --tee '%s' is %s\n", o->tee_dir,
                    S_ISLNK(sb.st_mode) ? "a symbolic link (not followed: give the directory itself)"
                                        : "not a directory");
        return -1;
    }
    int lk = -1; /* stays open, and DIR locked, until the launcher ends */
    if (dt_dir_lock(o->tee_dir, &lk) < 0) {
        dt__cli_err("dtrain run: --tee: %s%s\n", dt_last_error(),
                    dt_last_status() == DT_ERR_STATE ? "; give each job its own --tee directory" : "");
        return -1;
    }
    int r = 0;
    for (; r < o->nranks; r++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/rank%d.log", o->tee_dir, r);
        if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
            dt__cli_err("dtrain run: --tee: %s %s\n", path,
                        S_ISLNK(sb.st_mode) ? "is a symbolic link (not followed)"
                                            : "exists and is not a regular file");
            break;
        }
        if (dt_file_open(path, 0644, &rk[r].tee_file) < 0) {
            dt__cli_err("dtrain run: --tee: %s\n", dt_last_error());
            break;
        }
    }
    /* all created: now replace the old logs (visible while the job runs) */
    for (int k = 0; r == o->nranks && k < o->nranks; k++) {
        if (dt_file_commit(rk[k].tee_file) < 0) {
            dt__cli_err("dtrain run: --tee: %s\n", dt_last_error());
            r = k; /* the committed ones are the new (empty) logs; the rest unchanged */
            break;
        }
        rk[k].tee = dt_file_fd(rk[k].tee_file);
    }
    if (r == o->nranks)
        return 0;
    for (int k = 0; k < o->nranks; k++) {
        dt_file_close(rk[k].tee_file); /* an uncommitted one removes its temporary */
        rk[k].tee_file = NULL;
        rk[k].tee = -1;
    }
    return -1;
}

int dt_cmd_run(int argc, char **argv)
{
    run_opts o;
    int pa = parse_args(argc, argv, &o);
    if (pa)
        return pa == 1 ? 0 : 2;
    char why[256];
    if (o.nnodes == 1 && dt__cli_which(o.argv[0], NULL, 0, why, sizeof why) < 0) {
        dt__cli_err("dtrain run: cannot execute '%s': %s\n", o.argv[0], why);
        return 2;
    }
    if (o.nnodes > 1) {
        dt__run_nodes nd = {.nnodes = o.nnodes, .node_rank = o.node_rank, .nproc = o.nranks,
                            .master_addr = o.master_addr, .master_port = o.master_port, .hosts = o.hosts,
                            .dry_run = o.dry_run, .argv = o.argv};
        return dt__run_nodes_main(&nd);
    }
    char job_id[DT_RUN_JOB_ID_LEN + 1];
    if (dt__run_job_id(job_id) < 0) {
        dt__cli_err("dtrain run: getrandom failed: %s\n", strerror(errno));
        return 1;
    }
    rank_proc *rk = calloc((size_t)o.nranks, sizeof *rk);
    if (!rk) {
        dt__cli_err("dtrain run: out of memory\n");
        return 1;
    }
    int rc = 1;
    if (open_tee(&o, rk) < 0) {
        rc = 2; /* --tee problems are bad input */
        goto out;
    }
    if (install_signals() < 0)
        goto out;
    dt__run_env env = {
        .world = o.nranks,
        .max_restarts = o.max_restarts,
        .job_id = job_id,
        .stdout_tty = isatty(1),
    };
    const char *omp = getenv("OMP_NUM_THREADS");
    if (!omp || !*omp)
        env.omp_threads = dt_threads_per_rank(o.nranks);
    int orphans = 0;
    if (dt_pg_orphan_cleanup(&orphans) == 0 && orphans > 0)
        dt__cli_err(
                "dtrain run: removed %d shared-memory segment(s) of earlier jobs whose launcher "
                "and ranks are gone\n",
                orphans);
    for (int attempt = 0;; attempt++) {
        env.restart = attempt;
        env.port = o.master_port ? o.master_port : dt__run_free_port();
        attempt_result res;
        int ar = run_attempt(&o, &env, rk, &res);
        int removed = dt__run_shm_cleanup(job_id);
        if (removed > 0)
            dt__cli_err("dtrain run: removed %d shared-memory segment(s) left by job %s\n",
                    removed, job_id);
        if (ar < 0) {
            rc = 1;
            break;
        }
        if (res.signo) {
            rc = 128 + res.signo;
            break;
        }
        if (res.failed_rank < 0) {
            rc = 0;
            break;
        }
        char how[128];
        describe_status(res.status, how, sizeof how);
        /* exit 2 is bad input (a flag, a file, the environment): it fails
         * the same way on every attempt, so it ends the job at once */
        const bool bad_input = WIFEXITED(res.status) && WEXITSTATUS(res.status) == 2;
        if (attempt < o.max_restarts && !bad_input) {
            dt__cli_err("dtrain run: restarting all %d ranks (restart %d of %d) after rank %d %s\n",
                    o.nranks, attempt + 1, o.max_restarts, res.failed_rank, how);
            continue;
        }
        dt__cli_err("dtrain run: job failed: rank %d %s%s\n", res.failed_rank, how,
                    bad_input && attempt < o.max_restarts ? " (bad input: not restarted)"
                    : o.max_restarts                      ? " (no restarts left)"
                                                          : "");
        if (WIFEXITED(res.status))
            rc = WEXITSTATUS(res.status);
        else if (WIFSIGNALED(res.status))
            rc = 128 + WTERMSIG(res.status);
        break;
    }
out:
    for (int r = 0; r < o.nranks; r++)
        dt_file_close(rk[r].tee_file);
    free(rk);
    return rc;
}
