/* `dtrain run --nnodes N` (tools/run_nodes.c) without running a job: the
 * exact mpirun and srun commands (--dry-run), what a node other than 0 says,
 * the commands and the reason when the other nodes' hosts are unknown
 * (exit 2), and bad combinations. The job itself runs on the test bed:
 * comm/netbed_run_nnodes (tests/comm/netbed_test.sh). */
// dt-test-timeout: 60
#include "test.h"
#include "tools/train_cli.h"

#include <unistd.h>

static cli_result g_r;

TEST(dry_run_prints_mpirun_and_srun)
{
    cli_runv(&g_r, 30, "DT_MPIRUN_ARGS=--mca btl tcp,self",
             (char *[]){"run", "--nnodes", "2", "--node-rank", "0", "--master-addr", "h0", "--master-port", "1234",
                        "-n", "3", "--hosts", "h0,h1", "--dry-run", "--", "prog", "a b", NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    char want[512];
    snprintf(want, sizeof want,
             "mpirun %s-np 6 --host h0:3,h1:3 --map-by ppr:3:node --bind-to none --mca odls_base_sigkill_timeout 10 "
             "-x MASTER_ADDR=h0 "
             "-x MASTER_PORT=1234 --mca btl tcp,self prog 'a b'\n"
             "srun --nodes=2 --ntasks-per-node=3 --export=ALL,MASTER_ADDR=h0,MASTER_PORT=1234 prog 'a b'\n",
             geteuid() == 0 ? "--allow-run-as-root " : "");
    ASSERT_STR_EQ(g_r.out, want);
}

TEST(other_nodes_and_unknown_hosts)
{
    cli_runv(&g_r, 30, NULL,
             (char *[]){"run", "--nnodes", "2", "--node-rank", "1", "--master-addr", "h0", "-n", "2", "--", "prog",
                        NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT_STR_CONTAINS(g_r.out, "node 1 of 2: Open MPI starts this node's 2 ranks from node 0 (h0)");
    cli_runv(&g_r, 30, NULL,
             (char *[]){"run", "--nnodes", "2", "--node-rank", "0", "--master-addr", "h0", "-n", "2", "--", "prog",
                        NULL});
    ASSERT_EQ_INT(g_r.code, 2);
    ASSERT_STR_CONTAINS(g_r.err, "the other nodes' host names are unknown");
    ASSERT_STR_CONTAINS(g_r.err, "--host HOST0:2,HOST1:2,... --map-by ppr:2:node");
    ASSERT_STR_CONTAINS(g_r.err, "srun --nodes=2 --ntasks-per-node=2 --export=ALL,MASTER_ADDR=h0,MASTER_PORT=29500 prog");
}

TEST(bad_combinations)
{
    char *bad[][16] = {
        {"run", "--nnodes", "2", "--node-rank", "2", "-n", "1", "--", "prog", NULL},
        {"run", "--nnodes", "3", "--hosts", "a,b", "-n", "1", "--", "prog", NULL},
        {"run", "--nnodes", "2", "--master-addr", "x", "--hosts", "a,b", "-n", "1", "--", "prog", NULL},
        {"run", "--nnodes", "0", "-n", "1", "--", "prog", NULL},
        {"run", "--hosts", "a", "-n", "1", "--", "prog", NULL},
        /* a host twice (was mpirun --host a:1,a:1: one node for two nodes' ranks), mpirun's slot syntax
           (was a:4:1), an empty name (was skipped: MASTER_ADDR= empty) and a space (was a host 'a b'), with
           --dry-run so nothing would fail later */
        {"run", "--nnodes", "3", "--hosts", "a,b,a", "-n", "1", "--dry-run", "--", "prog", NULL},
        {"run", "--nnodes", "2", "--hosts", ",a,b", "-n", "1", "--dry-run", "--", "prog", NULL},
        {"run", "--nnodes", "2", "--hosts", "a:4,b", "-n", "1", "--dry-run", "--", "prog", NULL},
        {"run", "--nnodes", "2", "--hosts", "a b,c", "-n", "1", "--dry-run", "--", "prog", NULL},
    };
    const char *msg[] = {"is not below --nnodes", "--hosts names 2 hosts, --nnodes says 3",
                         "--master-addr is 'x'", "--nnodes needs a node count", "for several nodes",
                         "--hosts names 'a' twice", "--hosts ',a,b' has an empty host name",
                         "--hosts: 'a:4' is not a host name",
                         "--hosts: 'a b' is not a host name"};
    for (int i = 0; i < 9; i++) {
        cli_runv(&g_r, 30, NULL, bad[i]);
        ASSERT_EQ_INT(g_r.code, 2);
        ASSERT_STR_CONTAINS(g_r.err, msg[i]);
    }
}

int main(void)
{
    RUN(dry_run_prints_mpirun_and_srun);
    RUN(other_nodes_and_unknown_hosts);
    RUN(bad_combinations);
    return TEST_REPORT();
}
