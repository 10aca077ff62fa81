/* The op table: one row per dt_op with its name, the function that records
 * it, its backward, its autocast class and its FLOP count (ops.h documents
 * the columns and the FLOP convention). The tape calls a node's backward
 * through its row (tape.c), autocast reads the class (ops_cast.c), and
 * dt_ag_tape_flops, the tape's profiler, sums the FLOP column.
 *
 * To add an op: a dt_op value in ops.h (appended before DT_OP_COUNT), its
 * backward beside its forward (declared in ag_impl.h), and a row here. */
#include "autograd/ag_impl.h"

/* ---- FLOP counts (2 per multiply-add; ops.h) ------------------------------------ */

static double numel(const dt_tensor *t) { return t ? (double)dt_tensor_numel(t) : 0.0; }

static double flops_zero(int nin, const dt_tensor *const *in, const dt_tensor *out)
{
    (void)nin, (void)in, (void)out;
    return 0.0;
}

/* One per output element. */
static double flops_out(int nin, const dt_tensor *const *in, const dt_tensor *out)
{
    (void)nin, (void)in;
    return numel(out);
}

/* One per element of the first input (reductions, losses, pooling). */
static double flops_in(int nin, const dt_tensor *const *in, const dt_tensor *out)
{
    (void)out;
    return nin >= 1 ? numel(in[0]) : 0.0;
}

/* matmul, linear, addmm: out [..., M, N] from x [..., M, K]: 2 x out x K. */
static double flops_gemm(int nin, const dt_tensor *const *in, const dt_tensor *out)
{
    if (nin < 2 || !in[0] || in[0]->ndim < 1)
        return 0.0;
    return 2.0 * numel(out) * (double)in[0]->shape[in[0]->ndim - 1];
}

/* conv2d: w [OC, C/groups, KH, KW]: 2 x out x C/groups x KH x KW. */
static double flops_conv(int nin, const dt_tensor *const *in, const dt_tensor *out)
{
    if (nin < 2 || !in[1] || in[1]->ndim != 4)
        return 0.0;
    const dt_tensor *w = in[1];
    return 2.0 * numel(out) * (double)w->shape[1] * (double)w->shape[2] * (double)w->shape[3];
}

/* attention: out [B, T, C] from qkv [B, T, 3C]: q k^T and p v in full, 4 B T^2 C. */
static double flops_attn(int nin, const dt_tensor *const *in, const dt_tensor *out)
{
    (void)nin, (void)in;
    if (!out || out->ndim != 3)
        return 0.0;
    return 4.0 * numel(out) * (double)out->shape[1];
}

/* the fused LM head: x [N, C] times w [V, C]^T, 2 N V C (the loss not counted). */
static double flops_lmhead(int nin, const dt_tensor *const *in, const dt_tensor *out)
{
    (void)out;
    if (nin < 2 || !in[0] || !in[1] || in[1]->ndim != 2)
        return 0.0;
    return 2.0 * numel(in[0]) * (double)in[1]->shape[0];
}

/* ---- the table -------------------------------------------------------------------- */

#define P DT_AMP_PROMOTE
#define L DT_AMP_LOWER
#define F DT_AMP_FP32

const dt__op_row dt__op_table[DT_OP_COUNT] = {
    /*  op                              name                            function                   backward            amp  FLOPs */
    [DT_OP_MATMUL] =               {"matmul",                       "dt_matmul",               dt__bw_matmul,      L, flops_gemm},
    [DT_OP_LINEAR] =               {"linear",                       "dt_linear",               dt__bw_dense,       L, flops_gemm},
    [DT_OP_CONV2D] =               {"conv2d",                       "dt_conv2d",               dt__bw_conv,        L, flops_conv},
    [DT_OP_ADD] =                  {"add",                          "dt_add",                  dt__bw_binary,      P, flops_out},
    [DT_OP_SUB] =                  {"sub",                          "dt_sub",                  dt__bw_binary,      P, flops_out},
    [DT_OP_MUL] =                  {"mul",                          "dt_mul",                  dt__bw_binary,      P, flops_out},
    [DT_OP_DIV] =                  {"div",                          "dt_div",                  dt__bw_binary,      P, flops_out},
    [DT_OP_SCALE] =                {"mul_scalar",                   "dt_scale",                dt__bw_unary,       P, flops_out},
    [DT_OP_RELU] =                 {"relu",                         "dt_relu",                 dt__bw_relu,        P, flops_out},
    [DT_OP_GELU] =                 {"gelu",                         "dt_gelu",                 dt__bw_unary,       P, flops_out},
    [DT_OP_GELU_TANH] =            {"gelu_tanh",                    "dt_gelu_tanh",            dt__bw_unary,       P, flops_out},
    [DT_OP_DROPOUT] =              {"dropout",                      "dt_dropout",              dt__bw_unary,       P, flops_out},
    [DT_OP_MAX_POOL2D] =           {"max_pool2d",                   "dt_max_pool2d",           dt__bw_pool,        P, flops_in},
    [DT_OP_AVG_POOL2D] =           {"avg_pool2d",                   "dt_avg_pool2d",           dt__bw_pool,        P, flops_in},
    [DT_OP_BATCH_NORM] =           {"batch_norm",                   "dt_batch_norm",           dt__bw_bn,          P, flops_out},
    [DT_OP_LAYER_NORM] =           {"layer_norm",                   "dt_layer_norm",           dt__bw_ln,          P, flops_out},
    [DT_OP_EMBEDDING] =            {"embedding",                    "dt_embedding",            dt__bw_embedding,   P, flops_zero},
    [DT_OP_SOFTMAX] =              {"softmax",                      "dt_softmax",              dt__bw_softmax,     P, flops_out},
    [DT_OP_LOG_SOFTMAX] =          {"log_softmax",                  "dt_log_softmax",          dt__bw_softmax,     P, flops_out},
    [DT_OP_CROSS_ENTROPY] =        {"cross_entropy_loss",           "dt_cross_entropy",        dt__bw_ce,          F, flops_in},
    [DT_OP_MSE_LOSS] =             {"mse_loss",                     "dt_mse_loss",             dt__bw_mse,         F, flops_in},
    [DT_OP_SUM] =                  {"sum",                          "dt_sum",                  dt__bw_sum,         P, flops_in},
    [DT_OP_MEAN] =                 {"mean",                         "dt_mean",                 dt__bw_sum,         P, flops_in},
    [DT_OP_RESHAPE] =              {"reshape",                      "dt_reshape",              dt__bw_view,        P, flops_zero},
    [DT_OP_TRANSPOSE] =            {"transpose",                    "dt_transpose",            dt__bw_view,        P, flops_zero},
    [DT_OP_PERMUTE] =              {"permute",                      "dt_permute",              dt__bw_view,        P, flops_zero},
    [DT_OP_NARROW] =               {"narrow",                       "dt_narrow",               dt__bw_view,        P, flops_zero},
    [DT_OP_FLATTEN] =              {"flatten",                      "dt_flatten",              dt__bw_view,        P, flops_zero},
    [DT_OP_CONTIGUOUS] =           {"contiguous",                   "dt_contiguous",           dt__bw_contiguous,  P, flops_zero},
    [DT_OP_CAST] =                 {"to",                           "dt_cast",                 dt__bw_cast,        P, flops_zero},
    [DT_OP_ATTENTION] =            {"scaled_dot_product_attention", "dt_attention",            dt__bw_attn,        L, flops_attn},
    [DT_OP_BIAS_GELU_TANH] =       {"bias_gelu_tanh",               "dt_bias_gelu_tanh",       dt__bw_bias_gelu,   P, flops_out},
    [DT_OP_ADDMM] =                {"addmm",                        "dt_addmm",                dt__bw_dense,       L, flops_gemm},
    [DT_OP_RMS_NORM] =             {"rms_norm",                     "dt_rms_norm",             dt__bw_rms,         P, flops_out},
    [DT_OP_ROPE] =                 {"rotary_embedding",             "dt_rope",                 dt__bw_rope,        P, flops_out},
    [DT_OP_SWIGLU] =               {"swiglu",                       "dt_swiglu",               dt__bw_swiglu,      P, flops_out},
    [DT_OP_GQA_PACK] =             {"gqa_pack",                     "dt_gqa_pack",             dt__bw_pack,        P, flops_zero},
    [DT_OP_LINEAR_CROSS_ENTROPY] = {"linear_cross_entropy",         "dt_linear_cross_entropy", dt__bw_lmhead,      L, flops_lmhead},
    [DT_OP_TO_PLAIN] =             {"to_plain",                     "to_plain",                dt__bw_plain,       P, flops_zero},
    [DT_OP_CHECKPOINT] =           {"checkpoint",                   "dt_ag_checkpoint",        dt__bw_ckpt,        P, flops_zero},
    [DT_OP_CUSTOM] =               {"custom",                       "dt_ag_custom",            dt__bw_custom,      P, flops_zero},
    [DT_OP_MARK] =                 {"mark",                         "dt_ag_mark",              NULL,               P, flops_zero},
    [DT_OP_BN_RELU_POOL] =         {"batch_norm_relu_max_pool2d",   "dt_batch_norm_relu_max_pool2x2",
                                    dt__bw_bn_pool, P, flops_in},
    [DT_OP_SOFTCAP] =              {"softcap",                      "dt_softcap",              dt__bw_unary,       P, flops_out},
};
_Static_assert(sizeof dt__op_table / sizeof dt__op_table[0] == DT_OP_COUNT, "one row per op");

#undef P
#undef L
#undef F

/* ---- the public readers ----------------------------------------------------------- */

static bool known(dt_op op) { return (unsigned)op < DT_OP_COUNT && dt__op_table[op].name; }

const char *dt_op_name(dt_op op) { return known(op) ? dt__op_table[op].name : "?"; }

dt_amp_class dt_autocast_class(dt_op op) { return known(op) ? dt__op_table[op].amp : DT_AMP_PROMOTE; }

const char *dt_amp_class_name(dt_amp_class c)
{
    static const char *const names[] = {"promote", "lower", "fp32"};
    _Static_assert(sizeof names / sizeof names[0] == DT_AMP_CLASS_COUNT, "one name per class");
    return (unsigned)c < DT_AMP_CLASS_COUNT ? names[c] : "?";
}

bool dt_op_has_backward(dt_op op) { return known(op) && dt__op_table[op].backward != NULL; }

double dt_op_flops(dt_op op, int nin, const dt_tensor *const *in, const dt_tensor *out)
{
    if (!known(op) || !out || nin < 0 || (nin > 0 && !in) || !dt__op_table[op].flops)
        return 0.0;
    return dt__op_table[op].flops(nin, in, out);
}

double dt_ag_tape_flops(const dt_ctx *ctx, size_t from, size_t to, double *by_op)
{
    if (by_op)
        for (int k = 0; k < DT_OP_COUNT; k++)
            by_op[k] = 0.0;
    if (!ctx)
        return 0.0;
    if (to > ctx->tape_len)
        to = ctx->tape_len;
    double total = 0.0;
    for (size_t k = from; k < to; k++) {
        const dt__node *n = ctx->tape[k];
        double f = dt_op_flops(n->op, n->nin, (const dt_tensor *const *)n->in, n->out);
        total += f;
        if (by_op)
            by_op[n->op] += f;
    }
    return total;
}
