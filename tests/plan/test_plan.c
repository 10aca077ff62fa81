/* dt_plan (plan.h): the degrees checked against the world with named
 * errors, the layout's groups and strategy, the memory estimate from one
 * function, and the degrees of a DeepSpeed-style config; context
 * parallelism's layouts (dp x cp, cp x tp), degrees and keys; the
 * planner's collective curve over a 2-rank group (dt_plan_calibrate_comm). */
// dt-test-timeout: 120
// dt-test-labels: threads
#include "comm/harness.h"
#include "test.h"

#include "dtrain/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_plan_params degrees(int dp, int tp, int pp, int stage)
{
    dt_plan_params p = dt_plan_params_default();
    p.dp = dp, p.tp = tp, p.pp = pp, p.zero_stage = stage;
    return p;
}

TEST(bad_degrees_are_named)
{
    dt_plan_params p = degrees(0, 2, 1, 0);
    ASSERT_STATUS(dt_plan_check(&p, 3), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "tp 2 needs a multiple of 2 ranks; this job has 3");
    p = degrees(2, 2, 2, 1);
    p.names[0] = "--dp", p.names[1] = "--tp", p.names[2] = "--pp";
    ASSERT_STATUS(dt_plan_check(&p, 4), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "--dp 2 x --tp 2 x --pp 2 is 8 ranks; this job has 4");
    ASSERT_OK(dt_plan_check(&p, 8));
    p = degrees(0, 2, 1, 2); /* ZeRO-2 does not combine with tensor parallelism */
    ASSERT_STATUS(dt_plan_check(&p, 4), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "ZeRO stage 2 with tp 2");
    p = degrees(0, 1, 1, 0);
    p.fsdp = DT_FSDP_FULL_SHARD; /* FSDP's name sets the stage */
    p.ddp.comm_hook = DT_COMM_HOOK_FP16;
    ASSERT_STATUS(dt_plan_check(&p, 2), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "ZeRO stage 3");
    p = degrees(0, 1, 1, 0); /* context parallelism: the degrees against the world, and not with a pipeline */
    p.cp = 2;
    ASSERT_OK(dt_plan_check(&p, 2));
    ASSERT_STATUS(dt_plan_check(&p, 3), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "cp 2 needs a multiple of 2 ranks; this job has 3");
    p.dp = 1;
    ASSERT_STATUS(dt_plan_check(&p, 4), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "dp 1 x cp 2 x tp 1 x pp 1 is 2 ranks; this job has 4");
    p = degrees(0, 2, 1, 0);
    p.cp = 2;
    ASSERT_STATUS(dt_plan_check(&p, 6), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "cp 2 x tp 2 x pp 1 (4 ranks per replica) does not divide this job's 6");
    p = degrees(0, 1, 2, 0); /* cp 2 x pp 2: one mesh of 4 */
    p.cp = 2;
    ASSERT_OK(dt_plan_check(&p, 4));
    ASSERT_STATUS(dt_plan_check(&p, 6), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "cp 2 x tp 1 x pp 2 (4 ranks per replica) does not divide this job's 6");
    p = degrees(0, 1, 1, 0);
    p.cp = 0;
    ASSERT_STATUS(dt_plan_check(&p, 1), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "cp 0");
}

/* dp 2 x cp 2 (rank = d cp + c) with ZeRO-1, and cp 2 x tp 2 (rank = c tp + t): the replica's index and
 * count, the cp group, the gradient group (dp x cp), the memory sharded over dp x cp. */
static int body_cp(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *world;
    TH_OK(th_pg(rank, size, NULL, &world));
    dt_plan_params p = degrees(0, 1, 1, 1);
    p.cp = 2;
    dt_plan *pl;
    TH_OK(dt_plan_init(world, &p, &pl));
    dt_cp_params c = dt_plan_cp_params(pl);
    TH_CHECK(dt_plan_world(pl) == 2 && dt_plan_rank(pl) == rank / 2 && dt_plan_cp_rank(pl) == rank % 2 &&
                 dt_plan_cp(pl) == 2, "rank %d: replica %d of %d, cp rank %d", rank, dt_plan_rank(pl),
             dt_plan_world(pl), dt_plan_cp_rank(pl));
    TH_CHECK(c.group && dt_pg_size(c.group) == 2 && dt_pg_rank(c.group) == rank % 2 && c.impl == DT_CP_RING &&
                 c.balance, "rank %d: the cp group and its defaults", rank);
    TH_CHECK(dt_pg_size(dt_plan_dp_group(pl)) == 4 && !dt_plan_tp_group(pl), "rank %d: gradients over dp x cp",
             rank);
    dt_mem_estimate got, want;
    TH_OK(dt_plan_memory(pl, 1000, 4, DT_OPTIM_ADAMW, false, NULL, &got));
    dt_mem_policy mp = {.numel = 1000, .world = 4, .zero_stage = 1, .param_bytes = 4, .optimizer = DT_OPTIM_ADAMW};
    TH_OK(dt_mem_model_states(&mp, &want));
    TH_CHECK(got.total == want.total, "rank %d: %g vs %g bytes (ZeRO-1 over 4)", rank, (double)got.total,
             (double)want.total);
    TH_CHECK(dt_plan_is_main(pl) == (rank == 0), "rank %d: main", rank);
    dt_plan_free(pl);
    p = degrees(0, 2, 1, 0);
    p.cp = 2;
    p.cp_impl = DT_CP_ULYSSES;
    TH_OK(dt_plan_init(world, &p, &pl));
    c = dt_plan_cp_params(pl);
    TH_CHECK(dt_plan_world(pl) == 1 && dt_plan_tp_rank(pl) == rank % 2 && dt_plan_cp_rank(pl) == rank / 2 &&
                 c.impl == DT_CP_ULYSSES && !c.balance, "rank %d: cp 2 x tp 2 (tp %d, cp %d)", rank,
             dt_plan_tp_rank(pl), dt_plan_cp_rank(pl));
    TH_CHECK(dt_pg_size(dt_plan_dp_group(pl)) == 2 && dt_pg_size(dt_plan_tp_group(pl)) == 2 &&
                 dt_pg_size(c.group) == 2, "rank %d: groups", rank);
    dt_plan_free(pl);
    dt_pg_free(world);
    return 0;
}

TEST(cp_layouts_over_four_ranks)
{
    int codes[4];
    ASSERT_EQ_INT(th_run(4, 60.0, body_cp, NULL, codes), 0);
}

/* dp 2 x tp 2 (Megatron order: tp ranks adjacent) and dp 2 x pp 2. */
static int body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *world;
    TH_OK(th_pg(rank, size, NULL, &world));
    dt_plan_params p = degrees(0, 2, 1, 1);
    dt_plan *pl;
    TH_OK(dt_plan_init(world, &p, &pl));
    TH_CHECK(dt_plan_world(pl) == 2 && dt_plan_rank(pl) == rank / 2 && dt_plan_tp_rank(pl) == rank % 2,
             "rank %d: dp %d of %d, tp rank %d", rank, dt_plan_rank(pl), dt_plan_world(pl), dt_plan_tp_rank(pl));
    TH_CHECK(dt_pg_size(dt_plan_tp_group(pl)) == 2 && dt_pg_size(dt_plan_dp_group(pl)) == 2, "rank %d: groups",
             rank);
    /* the memory of the layout: ZeRO-1 over the 2 replicas, as offload.h's model says */
    dt_mem_estimate got, want;
    TH_OK(dt_plan_memory(pl, 1000, 4, DT_OPTIM_ADAMW, false, NULL, &got));
    dt_mem_policy mp = {.numel = 1000, .world = 2, .zero_stage = 1, .param_bytes = 4, .optimizer = DT_OPTIM_ADAMW};
    TH_OK(dt_mem_model_states(&mp, &want));
    TH_CHECK(got.total == want.total && got.optim == want.optim, "rank %d: %g vs %g bytes", rank,
             (double)got.total, (double)want.total);
    TH_CHECK(!dt_plan_meta_model(pl) && dt_plan_is_main(pl) == (rank == 0), "rank %d: meta, main", rank);
    dt_plan_free(pl);
    p = degrees(2, 1, 2, 0);
    TH_OK(dt_plan_init(world, &p, &pl));
    TH_CHECK(dt_plan_mesh(pl) && dt_plan_world(pl) == 2 && dt_plan_pp_rank(pl) == rank % 2 && !dt_plan_tp_group(pl),
             "rank %d: pipeline layout", rank);
    TH_CHECK(dt_plan_meta_model(pl), "rank %d: a pipeline fills only its stages", rank);
    dt_plan_free(pl);
    dt_pg_free(world);
    return 0;
}

TEST(layouts_over_four_ranks)
{
    int codes[4];
    ASSERT_EQ_INT(th_run(4, 60.0, body, NULL, codes), 0);
}

/* The collective curve over a 2-rank shared-memory group: every kind's latency and bus bandwidth
   measured (the sentinels replaced by positive, finite figures), the same on both ranks (the slowest
   rank's times, agreed), the group's size recorded; a group of one changes nothing. */
static int body_curve(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *g;
    TH_OK(th_pg(rank, size, NULL, &g));
    dt_plan_calib c;
    memset(&c, 0, sizeof c);
    c.coll_bw = c.ag_bw = c.rs_bw = 7, c.coll_lat_s = c.ag_lat_s = c.rs_lat_s = 7;
    const double t0 = dt_time_s();
    TH_OK(dt_plan_calibrate_comm(g, &c));
    const double took = dt_time_s() - t0;
    const double v[6] = {c.coll_bw, c.coll_lat_s, c.ag_bw, c.ag_lat_s, c.rs_bw, c.rs_lat_s};
    for (int k = 0; k < 6; k++) {
        TH_CHECK(isfinite(v[k]) && v[k] > 0 && v[k] != 7, "rank %d: figure %d is %g", rank, k, v[k]);
        if (th_shared)
            th_shared[8 * rank + k] = v[k];
    }
    TH_CHECK(c.coll_lat_s < 1 && c.ag_lat_s < 1 && c.rs_lat_s < 1 && c.ag_bw > 1e6 && c.rs_bw > 1e6,
             "rank %d: latencies %g %g %g s, bandwidths %g %g B/s", rank, c.coll_lat_s, c.ag_lat_s, c.rs_lat_s,
             c.ag_bw, c.rs_bw);
    TH_CHECK(c.coll_measured == 2, "rank %d: measured on %d ranks", rank, c.coll_measured);
    if (rank == 0)
        fprintf(stderr, "  the curve took %.2f s: all-reduce %.2f GB/s + %.0f us, all-gather %.2f GB/s + %.0f us, "
                        "reduce-scatter %.2f GB/s + %.0f us\n", took, c.coll_bw / 1e9, c.coll_lat_s * 1e6,
                c.ag_bw / 1e9, c.ag_lat_s * 1e6, c.rs_bw / 1e9, c.rs_lat_s * 1e6);
    dt_pg_free(g);
    return 0;
}

TEST(comm_curve_two_ranks)
{
    int codes[2];
    ASSERT_EQ_INT(th_run(2, 100.0, body_curve, NULL, codes), 0);
    ASSERT(th_shared != NULL);
    for (int k = 0; k < 6; k++)
        ASSERT(th_shared[k] == th_shared[8 + k]); /* both ranks fitted the same agreed times */
    dt_plan_calib c;
    memset(&c, 0, sizeof c);
    c.coll_bw = 5;
    dt_pg_params pp = dt_pg_params_default();
    pp.rank = 0, pp.world_size = 1, pp.backend = "self";
    dt_pg *one;
    ASSERT_OK(dt_pg_init(&pp, &one));
    ASSERT_OK(dt_plan_calibrate_comm(one, &c));
    ASSERT(c.coll_bw == 5 && c.ag_bw == 0 && c.coll_measured == 0);
    dt_pg_free(one);
    ASSERT_STATUS(dt_plan_calibrate_comm(NULL, &c), DT_ERR_NULL);
}

TEST(one_process)
{
    unsetenv("WORLD_SIZE");
    dt_plan_params p = degrees(0, 1, 1, 0);
    dt_plan *pl;
    ASSERT_OK(dt_plan_init(NULL, &p, &pl));
    ASSERT(dt_plan_world_group(pl) == NULL); /* DDP on one rank: no group at all */
    ASSERT_EQ_INT(dt_plan_world(pl), 1);
    dt_mem_estimate e;
    ASSERT_OK(dt_plan_memory(pl, 100, 4, DT_OPTIM_SGD, true, NULL, &e));
    ASSERT(e.total == 100 * (4 + 4 + 4)); /* parameters, gradients, momentum */
    dt_plan_free(pl);
}

TEST(from_config)
{
    dt_config *c;
    ASSERT_OK(dt_config_init(&c));
    const char *text = "{\"zero_optimization\": {\"stage\": 1}, \"pipeline\": {\"stages\": 2}, "
                       "\"dtrain\": {\"tensor_parallel_size\": 2, \"data_parallel_size\": 2, "
                       "\"hierarchical_allreduce\": true}}";
    ASSERT_OK(dt_config_load_string(c, "p.json", text, strlen(text)));
    dt_plan_params p = dt_plan_params_default();
    ASSERT_OK(dt_plan_from_config(c, &p));
    ASSERT_EQ_INT(p.dp, 2);
    ASSERT_EQ_INT(p.tp, 2);
    ASSERT_EQ_INT(p.pp, 2);
    ASSERT_EQ_INT(p.zero_stage, 1);
    ASSERT(p.hierarchical);
    ASSERT_OK(dt_plan_check(&p, 8));
    ASSERT_EQ_INT(p.fsdp, -1);
    dt_config_free(c);
    /* context parallelism: DeepSpeed's Ulysses degree; dtrain's keys; the impl key over the size keys */
    const struct {
        const char *text;
        int cp, impl, balance;
    } cases[] = {{"{\"sequence_parallel_size\": 2}", 2, DT_CP_ULYSSES, -1},
                 {"{\"dtrain\": {\"context_parallel_size\": 4, \"context_parallel_balance\": false}}", 4, DT_CP_RING,
                  0},
                 {"{\"sequence_parallel_size\": 2, \"dtrain\": {\"context_parallel_impl\": \"ring\"}}", 2, DT_CP_RING,
                  -1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ASSERT_OK(dt_config_init(&c));
        ASSERT_OK(dt_config_load_string(c, "cp.json", cases[i].text, strlen(cases[i].text)));
        p = dt_plan_params_default();
        ASSERT_OK(dt_plan_from_config(c, &p));
        ASSERT_EQ_INT(p.cp, cases[i].cp);
        ASSERT_EQ_INT((int)p.cp_impl, cases[i].impl);
        ASSERT_EQ_INT(p.cp_balance, cases[i].balance);
        dt_config_free(c);
    }
    const char *bad = "{\"dtrain\": {\"context_parallel_impl\": \"tree\"}}";
    ASSERT_OK(dt_config_init(&c));
    ASSERT(dt_config_load_string(c, "bad.json", bad, strlen(bad)) < 0); /* the key's choices */
    ASSERT_STR_CONTAINS(dt_last_error(), "context_parallel_impl");
    dt_config_free(c);
}

/* The seed configs' hybrid sharding key (what `dtrain train --config`
 * reads through dt_plan_from_config): FSDP's HYBRID_SHARD, stage 3 within
 * a machine; false leaves the stage alone. */
TEST(from_config_hybrid_shard)
{
    const char *texts[2] = {"{\"zero_optimization\": {\"stage\": 3}, \"dtrain\": {\"hybrid_shard\": true}}",
                            "{\"zero_optimization\": {\"stage\": 3}, \"dtrain\": {\"hybrid_shard\": false}}"};
    for (int i = 0; i < 2; i++) {
        dt_config *c;
        ASSERT_OK(dt_config_init(&c));
        ASSERT_OK(dt_config_load_string(c, "h.json", texts[i], strlen(texts[i])));
        dt_plan_params p = dt_plan_params_default();
        ASSERT_OK(dt_plan_from_config(c, &p));
        ASSERT_EQ_INT(p.zero_stage, 3);
        ASSERT_EQ_INT(p.fsdp, i == 0 ? (int)DT_FSDP_HYBRID_SHARD : -1);
        dt_config_free(c);
    }
}

int main(void)
{
    RUN(bad_degrees_are_named);
    RUN(layouts_over_four_ranks);
    RUN(cp_layouts_over_four_ranks);
    RUN(comm_curve_two_ranks);
    RUN(one_process);
    RUN(from_config);
    RUN(from_config_hybrid_shard);
    return TEST_REPORT();
}
