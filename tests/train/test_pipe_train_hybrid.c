/* Pipeline training on 3 stages (GPT, 1f1b and zbh1) and dp 2 x pp 2 on 4
 * ranks (the MLP under 1f1b, the GPT under zbh1: gradients averaged over
 * the replicas once per step, the tied wte summed between stages) equals
 * single-process training on the whole batch
 * (pipe_train.h has what is compared and the bound); the dp x tp x pp
 * mesh's layout and the strategy's checks of it. */
// dt-test-timeout: 120
// dt-test-labels: threads
#include "train/pipe_train.h"

TEST(gpt_three_stages)
{
    run("gpt", DT_PIPE_1F1B, 3, 1, 4);
    run("gpt", DT_PIPE_ZBH1, 3, 1, 8);
}

TEST(dp2_pp2)
{
    run("mlp", DT_PIPE_1F1B, 2, 2, 2);
    run("gpt", DT_PIPE_ZBH1, 2, 2, 4);
}

/* The dp x tp x pp mesh: its layout, and the strategy refusing a mesh
 * that is not one (at init, before any collective). */
static int mesh_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_mesh *bad = NULL, *mesh;
    TH_CHECK(dt_pipe_mesh_init(pg, 3, 1, &bad) == DT_ERR_INVALID_ARG && !bad, "tp 3 on 4 ranks accepted");
    TH_CHECK(strstr(dt_last_error(), "tp x pp must divide the world size"), "error '%s'", dt_last_error());
    TH_OK(dt_pipe_mesh_init(pg, 2, 2, &mesh));
    /* rank = (d tp + t) pp + s: 1 dp x 2 tp x 2 pp */
    TH_CHECK(dt_mesh_coord(mesh, 0) == 0 && dt_mesh_coord(mesh, 1) == rank / 2 && dt_mesh_coord(mesh, 2) == rank % 2,
             "rank %d at (%d, %d, %d)", rank, dt_mesh_coord(mesh, 0), dt_mesh_coord(mesh, 1), dt_mesh_coord(mesh, 2));
    dt_pipe_params pp = dt_pipe_params_default();
    pp.pp = 4;
    pp.mesh = mesh;
    dt_strategy *s = NULL;
    TH_CHECK(dt_strategy_pipe_init(pg, &pp, &s) == DT_ERR_INVALID_ARG && !s, "pp 4 on a mesh of pp 2 accepted");
    TH_CHECK(strstr(dt_last_error(), "pp = 4 but the mesh's \"pp\" dim has 2 ranks"), "error '%s'", dt_last_error());
    dt_mesh *flat;
    TH_OK(dt_mesh_init(pg, 2, (int[]){2, 2}, NULL, (const char *[]){"tp", "pp"}, &flat));
    pp.pp = 2;
    pp.mesh = flat;
    TH_CHECK(dt_strategy_pipe_init(pg, &pp, &s) == DT_ERR_INVALID_ARG && !s, "a 2-d mesh accepted");
    TH_CHECK(strstr(dt_last_error(), "not a dp x tp x pp mesh"), "error '%s'", dt_last_error());
    pp.mesh = mesh;
    TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
    dt_strategy_free(s);
    dt_mesh_free(flat);
    dt_mesh_free(mesh);
    dt_pg_free(pg);
    return 0;
}

TEST(mesh_checks)
{
    int codes[8];
    ASSERT_EQ_INT(th_run(4, 30.0, mesh_body, NULL, codes), 0);
}

int main(void)
{
    RUN(mesh_checks);
    RUN(gpt_three_stages);
    RUN(dp2_pp2);
    return TEST_REPORT();
}
