/* `dtrain run --nnodes N --node-rank R --master-addr A --master-port P -n K
 * [--hosts H1,...,HN] -- PROGRAM ARGS...`: torchrun's multi-node form, run
 * on top of Open MPI.
 *
 * torchrun starts one agent per node and the agents meet at MASTER_ADDR.
 * dtrain's ranks across machines talk through MPI (Open MPI is the engine
 * across machines, not a home-made transport), and an MPI job is
 * started once, by one mpirun that reaches every node (ssh, or the launcher's
 * agent set in Open MPI's MCA parameters). So:
 *   - node rank 0 (the master) with the nodes' hosts known (--hosts) and
 *     mpirun installed: exec mpirun -np N*K --host H1:K,...,HN:K --map-by
 *     ppr:K:node --mca odls_base_sigkill_timeout 10 (the ranks that outlive
 *     a dead one get the time to name it), passing MASTER_ADDR/MASTER_PORT,
 *     plus the words of
 *     $DT_MPIRUN_ARGS (site options: an rsh agent, btl_tcp_if_include);
 *     its exit status is the job's;
 *   - node rank R > 0: mpirun on node 0 starts this node's ranks; say so and
 *     print the command, exit 0 (a torchrun script that runs the same line
 *     on every node works unchanged);
 *   - otherwise (no --hosts: the other nodes' names are unknown here, as
 *     torchrun learns them only at rendezvous; or no mpirun): print the
 *     exact mpirun command and the srun one that do the same, and why, and
 *     exit 2. --dry-run prints them and exits 0.
 * The ranks get Open MPI's OMPI_COMM_WORLD_* variables, so dt_pg_init picks
 * the `mpi` backend; Slurm's srun gives SLURM_PROCID etc. the same way. */
#include "cmd.h"
#include "run.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_WORDS 512

/* Append a word, shell-quoted when needed, to buf. */
static void put_word(char *buf, size_t cap, const char *w)
{
    size_t n = strlen(buf);
    if (n && n < cap - 1)
        buf[n++] = ' ', buf[n] = '\0';
    int plain = *w != '\0';
    for (const char *p = w; *p; p++)
        if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+=./:,@%", *p))
            plain = 0;
    if (plain) {
        snprintf(buf + n, cap - n, "%s", w);
        return;
    }
    size_t k = n;
    if (k < cap - 1)
        buf[k++] = '\'';
    for (const char *p = w; *p && k < cap - 5; p++) {
        if (*p == '\'') {
            memcpy(buf + k, "'\\''", 4);
            k += 4;
        } else {
            buf[k++] = *p;
        }
    }
    if (k < cap - 1)
        buf[k++] = '\'';
    buf[k] = '\0';
}

static int have_mpirun(void)
{
    const char *path = getenv("PATH");
    if (!path)
        return 0;
    char dir[4096];
    for (const char *p = path; *p;) {
        size_t l = strcspn(p, ":");
        snprintf(dir, sizeof dir, "%.*s/mpirun", (int)l, p);
        if (l && access(dir, X_OK) == 0)
            return 1;
        p += l + (p[l] == ':');
    }
    return 0;
}

int dt__run_nodes_main(const dt__run_nodes *n)
{
    static char *words[MAX_WORDS];
    static char hostlist[8192], opt[64], env_a[512], env_p[64], extra[4096];
    int port = n->master_port ? n->master_port : 29500;
    /* the hosts: --hosts, checked against --nnodes and --master-addr */
    int nh = 0;
    if (n->hosts) {
        char tmp[8192];
        snprintf(tmp, sizeof tmp, "%s", n->hosts);
        hostlist[0] = '\0';
        size_t hl = strlen(n->hosts);
        if (n->hosts[0] == ',' || n->hosts[hl - 1] == ',' || strstr(n->hosts, ",,")) {
            dt__cli_err("dtrain run: --hosts '%s' has an empty host name\n", n->hosts);
            return 2; /* was skipped: ",a,b" made MASTER_ADDR empty */
        }
        char *save = NULL;
        for (char *h = strtok_r(tmp, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
            /* a host is one node: mpirun's own slot syntax (a:4) would become a:4:K, and a host named
               twice is one node given two nodes' ranks (mpirun refuses the mapping, or crowds the node) */
            if (h[strcspn(h, ": \t\n")]) {
                dt__cli_err("dtrain run: --hosts: '%s' is not a host name (no ':' slot counts or spaces: -n gives "
                            "the ranks per node)\n", h);
                return 2;
            }
            for (const char *q = tmp; q < h; q += strlen(q) + 1) /* the hosts before, NUL-terminated by strtok */
                if (!strcmp(q, h)) {
                    dt__cli_err("dtrain run: --hosts names '%s' twice: each of the --nnodes nodes is one host\n", h);
                    return 2;
                }
            if (nh == 0 && n->master_addr && strcmp(h, n->master_addr)) {
                dt__cli_err("dtrain run: --hosts starts with '%s' but --master-addr is '%s': node rank 0 "
                            "(the first host) is the master\n", h, n->master_addr);
                return 2;
            }
            size_t l = strlen(hostlist);
            snprintf(hostlist + l, sizeof hostlist - l, "%s%s:%d", nh ? "," : "", h, n->nproc);
            nh++;
        }
        if (nh != n->nnodes) {
            dt__cli_err("dtrain run: --hosts names %d host%s, --nnodes says %d\n", nh, nh == 1 ? "" : "s",
                        n->nnodes);
            return 2;
        }
    }
    /* mpirun -np N*K --host ... --map-by ppr:K:node -x MASTER_ADDR -x MASTER_PORT [extra] prog */
    int k = 0;
    words[k++] = "mpirun";
    if (geteuid() == 0)
        words[k++] = "--allow-run-as-root";
    static char np[32];
    snprintf(np, sizeof np, "%d", n->nnodes * n->nproc);
    words[k++] = "-np";
    words[k++] = np;
    words[k++] = "--host";
    static char placeholder[64];
    snprintf(placeholder, sizeof placeholder, "HOST0:%d,HOST1:%d,...", n->nproc, n->nproc);
    words[k++] = nh ? hostlist : placeholder;
    snprintf(opt, sizeof opt, "ppr:%d:node", n->nproc);
    words[k++] = "--map-by";
    words[k++] = opt;
    words[k++] = "--bind-to";
    words[k++] = "none";
    /* when a rank dies, mpirun SIGTERMs the others and SIGKILLs them this
     * many seconds later (1 by default): time for them to say which rank
     * died (DT_ERR_PEER_FAILED) */
    words[k++] = "--mca";
    words[k++] = "odls_base_sigkill_timeout";
    words[k++] = "10";
    if (n->master_addr)
        snprintf(env_a, sizeof env_a, "MASTER_ADDR=%s", n->master_addr);
    else if (nh) /* the first host */
        snprintf(env_a, sizeof env_a, "MASTER_ADDR=%.*s", (int)strcspn(n->hosts, ","), n->hosts);
    else
        snprintf(env_a, sizeof env_a, "MASTER_ADDR=HOST0");
    snprintf(env_p, sizeof env_p, "MASTER_PORT=%d", port);
    words[k++] = "-x";
    words[k++] = env_a;
    words[k++] = "-x";
    words[k++] = env_p;
    const char *ex = getenv("DT_MPIRUN_ARGS");
    if (ex && *ex) {
        snprintf(extra, sizeof extra, "%s", ex);
        char *save = NULL;
        for (char *w = strtok_r(extra, " \t\n", &save); w && k < MAX_WORDS - 64; w = strtok_r(NULL, " \t\n", &save))
            words[k++] = w;
    }
    for (int i = 0; n->argv[i] && k < MAX_WORDS - 1; i++)
        words[k++] = n->argv[i];
    words[k] = NULL;
    static char line[16384], sline[16384];
    line[0] = sline[0] = '\0';
    for (int i = 0; i < k; i++)
        put_word(line, sizeof line, words[i]);
    snprintf(sline, sizeof sline, "srun --nodes=%d --ntasks-per-node=%d --export=ALL,%s,%s", n->nnodes, n->nproc,
             env_a, env_p);
    for (int i = 0; n->argv[i]; i++)
        put_word(sline, sizeof sline, n->argv[i]);

    if (n->dry_run) {
        printf("%s\n%s\n", line, sline);
        return 0;
    }
    if (n->node_rank > 0) {
        printf("dtrain run: node %d of %d: Open MPI starts this node's %d ranks from node 0 (%s); nothing to "
               "run here. On node 0:\n  %s\n",
               n->node_rank, n->nnodes, n->nproc, n->master_addr ? n->master_addr : "the master", line);
        return 0;
    }
    const char *why = !nh ? "the other nodes' host names are unknown here (give them with --hosts H0,H1,...; "
                            "torchrun learns them only at its own rendezvous)"
                      : !have_mpirun() ? "mpirun is not installed here (Debian: openmpi-bin)"
                                       : NULL;
    if (why) {
        dt__cli_err("dtrain run: --nnodes %d: cannot start the job from here: %s.\n", n->nnodes, why);
        dt__cli_err("Start it with Open MPI from node 0:\n");
        dt__cli_err("  %s\n", line);
        dt__cli_err("or, inside a Slurm allocation of %d nodes:\n", n->nnodes);
        dt__cli_err("  %s\n", sline);
        return 2;
    }
    dt__cli_err("dtrain run: %d nodes x %d ranks through Open MPI: %s\n", n->nnodes, n->nproc, line);
    fflush(NULL);
    execvp("mpirun", words);
    dt__cli_err("dtrain run: cannot execute mpirun: %s\n", strerror(errno));
    return 127;
}
