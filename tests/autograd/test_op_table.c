/* The op table (ops.h): every op has a name, a recording function, an
 * autocast class, a backward (all but the mark) and a FLOP function; the
 * names are unique; the FLOP counts of matmul, linear, addmm, conv2d,
 * attention and the fused LM head match hand counts, both from
 * dt_op_flops and from the tape (dt_ag_tape_flops), and views count 0; a
 * forward of each small zoo model has, on its tape, exactly the GEMM FLOPs
 * its descriptor states (dt_model_desc.fwd_flops_per_sample). White-box:
 * the rows themselves are read through autograd/ag_impl.h. */
#include "autograd/ag_impl.h"
#include "dtrain/autograd.h"
#include "dtrain/models.h"
#include "dtrain/ops.h"
#include "test.h"

#include <string.h>

TEST(every_row_complete)
{
    for (int op = 0; op < DT_OP_COUNT; op++) {
        const dt__op_row *r = &dt__op_table[op];
        if (!r->name || !r->fn || !r->flops) {
            fprintf(stderr, "op %d: name %p fn %p flops %p\n", op, (const void *)r->name, (const void *)r->fn,
                    (const void *)(uintptr_t)r->flops);
            ASSERT(0);
        }
        ASSERT(strcmp(dt_op_name((dt_op)op), "?") != 0);
        ASSERT(r->name[0] != '\0' && r->fn[0] != '\0');
        ASSERT((unsigned)dt_autocast_class((dt_op)op) < DT_AMP_CLASS_COUNT);
        ASSERT(strcmp(dt_amp_class_name(dt_autocast_class((dt_op)op)), "?") != 0);
        /* differentiable: every op but the mark */
        ASSERT_EQ_INT(dt_op_has_backward((dt_op)op), op != DT_OP_MARK);
        ASSERT_EQ_INT(r->backward != NULL, op != DT_OP_MARK);
        for (int k = 0; k < op; k++)
            if (!strcmp(dt__op_table[k].name, r->name)) {
                fprintf(stderr, "ops %d and %d are both named %s\n", k, op, r->name);
                ASSERT(0);
            }
    }
    ASSERT_STR_EQ(dt_op_name((dt_op)DT_OP_COUNT), "?");
    ASSERT(!dt_op_has_backward((dt_op)-1));
    ASSERT(dt_op_flops((dt_op)DT_OP_COUNT, 0, NULL, NULL) == 0.0);
    /* the classes PyTorch's CPU autocast lists give */
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_ATTENTION), DT_AMP_LOWER);
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_ADDMM), DT_AMP_LOWER);
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_LINEAR_CROSS_ENTROPY), DT_AMP_LOWER);
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_CUSTOM), DT_AMP_PROMOTE);
}

static dt_tensor *leaf(dt_ctx *ctx, int ndim, const int64_t *shape)
{
    dt_tensor *t = dt_tensor_zeros(ctx, DT_F32, ndim, shape);
    if (t)
        dt_tensor_set_requires_grad(t, true);
    return t;
}

/* The FLOPs of the last node on ctx's tape, which must be of op. */
static double last_node_flops(dt_ctx *ctx, size_t before, dt_op op)
{
    double by[DT_OP_COUNT];
    size_t len = dt_ag_tape_len(ctx);
    double f = dt_ag_tape_flops(ctx, len - 1, len, by);
    if (len <= before || ctx->tape[len - 1]->op != op || by[op] != f) {
        fprintf(stderr, "last node: %s, wanted %s\n", len > before ? dt_op_name(ctx->tape[len - 1]->op) : "(none)",
                dt_op_name(op));
        return -1;
    }
    return f;
}

TEST(hand_counts)
{
    dt_ctx *ctx;
    ASSERT_EQ_INT(dt_ctx_init(NULL, &ctx), DT_OK);
    size_t t0;

    /* matmul [2, 5, 3] x [3, 7]: 2 x 2*5*7 x 3 */
    dt_tensor *a = leaf(ctx, 3, (int64_t[]){2, 5, 3}), *b = leaf(ctx, 2, (int64_t[]){3, 7});
    t0 = dt_ag_tape_len(ctx);
    dt_tensor *c = dt_matmul(ctx, a, b);
    ASSERT(c != NULL);
    ASSERT(last_node_flops(ctx, t0, DT_OP_MATMUL) == 2.0 * 2 * 5 * 7 * 3);
    ASSERT(dt_op_flops(DT_OP_MATMUL, 2, (const dt_tensor *const[]){a, b}, c) == 420.0);

    /* linear x [4, 6, 8], w [10, 8], bias: 2 x 24 rows x 10 x 8 (bias not counted) */
    dt_tensor *x = leaf(ctx, 3, (int64_t[]){4, 6, 8}), *w = leaf(ctx, 2, (int64_t[]){10, 8});
    dt_tensor *bias = leaf(ctx, 1, (int64_t[]){10});
    t0 = dt_ag_tape_len(ctx);
    ASSERT(dt_linear(ctx, x, w, bias) != NULL);
    ASSERT(last_node_flops(ctx, t0, DT_OP_LINEAR) == 2.0 * 24 * 10 * 8);

    /* addmm x [3, 8] @ w [8, 5]: 2 x 3 x 5 x 8 */
    dt_tensor *wa = leaf(ctx, 2, (int64_t[]){8, 5}), *xa = leaf(ctx, 2, (int64_t[]){3, 8});
    t0 = dt_ag_tape_len(ctx);
    ASSERT(dt_addmm(ctx, xa, wa, NULL) != NULL);
    ASSERT(last_node_flops(ctx, t0, DT_OP_ADDMM) == 2.0 * 3 * 5 * 8);

    /* conv2d x [2, 3, 9, 9], w [4, 3, 3, 3], stride 2, pad 1: out [2, 4, 5, 5];
     * 2 x (2*4*5*5) x 3*3*3 */
    dt_tensor *xi = leaf(ctx, 4, (int64_t[]){2, 3, 9, 9}), *wc = leaf(ctx, 4, (int64_t[]){4, 3, 3, 3});
    t0 = dt_ag_tape_len(ctx);
    dt_tensor *y = dt_conv2d(ctx, xi, wc, NULL, 2, 1);
    ASSERT(y != NULL);
    ASSERT_EQ_INT(y->shape[2], 5);
    ASSERT(last_node_flops(ctx, t0, DT_OP_CONV2D) == 2.0 * (2 * 4 * 5 * 5) * (3 * 3 * 3));

    /* attention over qkv [2, 6, 3*8], 2 heads: q k^T and p v in full,
     * 2 x (B H T T D) each = 4 B T^2 C */
    dt_tensor *qkv = leaf(ctx, 3, (int64_t[]){2, 6, 24});
    t0 = dt_ag_tape_len(ctx);
    ASSERT(dt_attention(ctx, qkv, 2, true, 0.0f, false, (dt_rng_key){0}) != NULL);
    ASSERT(last_node_flops(ctx, t0, DT_OP_ATTENTION) == 2.0 * 2 * (2 * 2 * 6 * 6 * 4));

    /* the fused LM head: x [6, 8], w [11, 8]: 2 x 6 x 11 x 8 */
    dt_tensor *hx = leaf(ctx, 2, (int64_t[]){6, 8}), *hw = leaf(ctx, 2, (int64_t[]){11, 8});
    dt_tensor *lab = dt_tensor_zeros(ctx, DT_I64, 1, (int64_t[]){6});
    t0 = dt_ag_tape_len(ctx);
    ASSERT(dt_linear_cross_entropy(ctx, hx, hw, lab, 0) != NULL);
    ASSERT(last_node_flops(ctx, t0, DT_OP_LINEAR_CROSS_ENTROPY) == 2.0 * 6 * 11 * 8);

    /* views: 0; an elementwise op: one per output element */
    t0 = dt_ag_tape_len(ctx);
    ASSERT(dt_reshape(ctx, x, 2, (int64_t[]){24, 8}) != NULL);
    ASSERT(last_node_flops(ctx, t0, DT_OP_RESHAPE) == 0.0);
    t0 = dt_ag_tape_len(ctx);
    ASSERT(dt_transpose(ctx, x, 0, 1) != NULL);
    ASSERT(last_node_flops(ctx, t0, DT_OP_PERMUTE) == 0.0);
    t0 = dt_ag_tape_len(ctx);
    ASSERT(dt_relu(ctx, x) != NULL);
    ASSERT(last_node_flops(ctx, t0, DT_OP_RELU) == 4.0 * 6 * 8);

    /* the whole tape, per op */
    double by[DT_OP_COUNT];
    double all = dt_ag_tape_flops(ctx, 0, (size_t)-1, by), sum = 0;
    for (int op = 0; op < DT_OP_COUNT; op++)
        sum += by[op];
    ASSERT(all == sum);
    ASSERT(by[DT_OP_MATMUL] == 420.0);
    ASSERT(dt_ag_tape_flops(NULL, 0, 10, by) == 0.0 && by[DT_OP_MATMUL] == 0.0);
    dt_ctx_free(ctx);
}

/* A forward of a zoo model: the GEMM rows of its tape = its descriptor's FLOPs. */
static void check_model(const char *name)
{
    dt_model_config cfg = dt_model_config_default();
    dt_model *m = NULL;
    dt_model_desc d;
    ASSERT_EQ_INT(dt_model_create(name, 1, &cfg, &m, &d), DT_OK);
    dt_model_train(m, false);
    const int64_t B = 2;
    int nd = 0;
    int64_t sh[DT_MAX_DIMS];
    ASSERT_EQ_INT(dt_model_desc_shapes(&d, B, &nd, sh, NULL, NULL, NULL), DT_OK);
    dt_ctx *ctx;
    ASSERT_EQ_INT(dt_ctx_init(NULL, &ctx), DT_OK);
    dt_tensor *x = dt_tensor_zeros(ctx, d.input_dtype, nd, sh);
    ASSERT(x != NULL);
    size_t t0 = dt_ag_tape_len(ctx);
    dt_tensor *y = dt_model_forward(ctx, m, x);
    if (!y)
        fprintf(stderr, "%s: %s\n", name, dt_last_error());
    ASSERT(y != NULL);
    double by[DT_OP_COUNT];
    dt_ag_tape_flops(ctx, t0, dt_ag_tape_len(ctx), by);
    double gemm = by[DT_OP_MATMUL] + by[DT_OP_LINEAR] + by[DT_OP_ADDMM] + by[DT_OP_CONV2D] + by[DT_OP_ATTENTION] +
                  by[DT_OP_LINEAR_CROSS_ENTROPY];
    fprintf(stderr, "%s: tape %.0f, descriptor %.0f GEMM FLOPs for a batch of %lld\n", name, gemm,
            d.fwd_flops_per_sample * (double)B, (long long)B);
    ASSERT(gemm > 0 && gemm == d.fwd_flops_per_sample * (double)B);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

TEST(zoo_flops_match_descriptors)
{
    check_model("convnet");
    check_model("mlp");
    check_model("gpt-micro");
    check_model("llama-tiny");
}

int main(void)
{
    RUN(every_row_complete);
    RUN(hand_counts);
    RUN(zoo_flops_match_descriptors);
    return TEST_REPORT();
}
