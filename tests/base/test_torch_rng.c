/* PyTorch's CPU generator (dt_torch_rng) and dt_model_init_torch against
 * values printed by torch 1.13 (Debian's python3-torch):
 *
 *   torch.manual_seed(3); torch.empty(6).uniform_(-0.2, 0.2)
 *   torch.manual_seed(7); torch.empty(40).normal_(0.5, 2.0)   # 16-wide path
 *   torch.manual_seed(7); torch.empty(5).normal_(0.5, 2.0)    # scalar path
 *   torch.randperm(10, generator=torch.Generator().manual_seed(5))
 *   torch.randperm(60000, generator=torch.Generator().manual_seed(5))
 *   torch.manual_seed(0); ConvNet()   # bench/train_convnet_pytorch.py's model
 *   torch.manual_seed(1); nn.Embedding(7, 3)
 *
 * uniform_ and randperm are bit-exact; normal_ within 1 ulp (torch's
 * vectorised log/sin/cos round on their own). */
#include "dtrain/base.h"
#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "test.h"
#include "model_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void expect_floats(const float *got, const float *want, int n, float ulps)
{
    for (int i = 0; i < n; i++) {
        float tol = ulps * (nextafterf(fabsf(want[i]), INFINITY) - fabsf(want[i]));
        if (!(fabsf(got[i] - want[i]) <= tol)) {
            TEST_FAIL_("element %d: got %.9g, want %.9g", i, (double)got[i], (double)want[i]);
            return;
        }
    }
}

TEST(uniform_is_torch_uniform)
{
    dt_torch_rng g;
    dt_torch_rng_seed(&g, 3);
    float x[6];
    dt_torch_rng_uniform(&g, x, 6, -0.2, 0.2);
    const float want[6] = {-0.198294595f, -0.157772258f, -0.0856630132f, -0.189218074f, -0.0113542555f, -0.175953493f};
    expect_floats(x, want, 6, 0);
}

TEST(normal_is_torch_normal)
{
    dt_torch_rng g;
    dt_torch_rng_seed(&g, 7);
    float x[40];
    dt_torch_rng_normal(&g, x, 40, 0.5, 2.0);
    const float head[4] = {-1.14026904f, 1.29126239f, 2.29781699f, -2.27680779f};
    const float tail[4] = {0.298531353f, 0.974029183f, 1.76536417f, 0.316645682f};
    expect_floats(x, head, 4, 1);
    expect_floats(x + 36, tail, 4, 1);

    dt_torch_rng_seed(&g, 7);
    dt_torch_rng_normal(&g, x, 5, 0.5, 2.0);
    const float small[5] = {0.206409812f, 2.07228255f, 2.39364314f, -1.728688f, 3.88158035f};
    expect_floats(x, small, 5, 1);
}

/* dt_torch_rng_normal_part keeps the elements [lo, hi) of what
 * dt_torch_rng_normal draws, and leaves the stream where it does: over a
 * range of many whole 16-blocks (transformed on the compute threads) with
 * cut blocks at both ends and the redrawn tail (n % 16 != 0), on 1 and 3
 * threads; also past 624 draws (the twist) and for an empty range. */
TEST(normal_part_is_a_slice_of_normal)
{
    enum { N = 300003 }; /* more than 2^18 elements: the blocks' transform runs on the threads */
    float *full = malloc(N * sizeof *full), *part = malloc(N * sizeof *part);
    ASSERT(full && part);
    const size_t ranges[][2] = {{0, N}, {5, N - 7}, {17, 270001}, {N - 10, N}, {100, 100}};
    for (int nt = 1; nt <= 3; nt += 2) {
        dt_set_num_threads(nt);
        for (size_t r = 0; r < sizeof ranges / sizeof *ranges; r++) {
            dt_torch_rng g, h;
            dt_torch_rng_seed(&g, 11);
            dt_torch_rng_seed(&h, 11);
            dt_torch_rng_normal(&g, full, N, 0.25, 0.02);
            size_t lo = ranges[r][0], hi = ranges[r][1];
            dt_torch_rng_normal_part(&h, N, lo, hi, part, 0.25, 0.02);
            ASSERT(memcmp(part, full + lo, (hi - lo) * sizeof *part) == 0);
            ASSERT_EQ_U64(dt_torch_rng_next(&g), dt_torch_rng_next(&h));
        }
    }
    dt_set_num_threads(0);
    free(full);
    free(part);
}

TEST(randperm_is_torch_randperm)
{
    int64_t p[10];
    ASSERT_OK(dt_torch_randperm(5, p, 10));
    const int64_t want[10] = {1, 4, 9, 6, 3, 5, 0, 2, 8, 7};
    for (int i = 0; i < 10; i++)
        ASSERT_EQ_INT(p[i], want[i]);
    int64_t *q = dt_alloc(60000 * sizeof *q);
    ASSERT(q);
    ASSERT_OK(dt_torch_randperm(5, q, 60000));
    const int64_t head[8] = {53411, 765, 31431, 44421, 31202, 28270, 18376, 35073}, tail[3] = {28987, 39300, 13447};
    for (int i = 0; i < 8; i++)
        ASSERT_EQ_INT(q[i], head[i]);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ_INT(q[60000 - 3 + i], tail[i]);
    dt_free(q);
    ASSERT_STATUS(dt_torch_randperm(1, NULL, 3), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_torch_randperm(1, NULL, 0));
}

static void expect_entry(dt_model *m, const char *name, const float *head, const float *tail, double sum)
{
    int64_t i = dt_model_find_entry(m, name);
    ASSERT(i >= 0);
    dt_param_info p;
    ASSERT_OK(dt_model_entry(m, (size_t)i, &p));
    const float *x = p.tensor->data;
    expect_floats(x, head, 3, 0);
    expect_floats(x + p.numel - 2, tail, 2, 0);
    double s = 0;
    for (size_t k = 0; k < p.numel; k++)
        s += x[k];
    ASSERT_NEAR(s, sum, 1e-6, 1e-6);
}

TEST(convnet_starts_from_torch_weights)
{
    dt_model *m = t_create("convnet", 99, NULL);
    ASSERT(m);
    ASSERT_OK(dt_model_init_torch(m, 0));
    expect_entry(m, "layer1.0.weight", (const float[]){-0.00149736402f, 0.107288718f, -0.16460903f},
                 (const float[]){-0.1157372f, 0.1545811f}, -0.73990403);
    expect_entry(m, "layer1.0.bias", (const float[]){0.127897784f, 0.0148668056f, -0.0944270641f},
                 (const float[]){-0.14144364f, -0.0668465868f}, 0.369743391);
    expect_entry(m, "layer2.0.weight", (const float[]){-0.0135722579f, -0.00964643992f, 0.00478503108f},
                 (const float[]){-0.0403933898f, -0.0183393303f}, 2.14901288);
    expect_entry(m, "layer2.0.bias", (const float[]){-0.0221673492f, -0.0343725644f, -0.046636682f},
                 (const float[]){0.0250928048f, 0.0439369753f}, 0.190682994);
    expect_entry(m, "fc.weight", (const float[]){0.00987538323f, -0.0161089525f, 0.00929174852f},
                 (const float[]){-0.00556770992f, -0.00976543408f}, 2.9029059);
    expect_entry(m, "fc.bias", (const float[]){0.00949398428f, -0.00927705131f, -0.00702318829f},
                 (const float[]){-0.00812510215f, -0.00585309556f}, -0.0392035984);
    /* constant inits untouched */
    int64_t w = dt_model_find_entry(m, "layer1.1.weight"), rv = dt_model_find_entry(m, "layer2.1.running_var");
    dt_param_info p;
    ASSERT_OK(dt_model_entry(m, (size_t)w, &p));
    ASSERT(((float *)p.tensor->data)[3] == 1.0f);
    ASSERT_OK(dt_model_entry(m, (size_t)rv, &p));
    ASSERT(((float *)p.tensor->data)[5] == 1.0f);
    dt_model_free(m);
    ASSERT_STATUS(dt_model_init_torch(NULL, 0), DT_ERR_NULL);
}

TEST(embedding_starts_from_torch_weights)
{
    dt_model *m = t_build(dt_nn_embedding(7, 3), 5);
    ASSERT(m);
    ASSERT_OK(dt_model_init_torch(m, 1));
    dt_param_info p;
    ASSERT_OK(dt_model_entry(m, 0, &p));
    const float *x = p.tensor->data;
    expect_floats(x, (const float[]){-1.5255959f, -0.750231802f, -0.653980911f, -1.60948479f}, 4, 1);
    expect_floats(x + 19, (const float[]){1.71630263f, -0.0561396666f}, 2, 1);
    dt_model_free(m);
}

/* A bf16 model (batch norm included: keep_batchnorm_fp32 false) started
 * from torch's stream equals the f32 model rounded once, constant inits
 * (batch-norm weight 1, bias 0) included. They once were read from an
 * unset scratch buffer: the weights were garbage and the first loss
 * differed from run to run. */
TEST(bf16_model_starts_from_rounded_torch_weights)
{
    dt_model_config cfg = dt_model_config_default();
    dt_model *m32 = t_create("convnet", 99, &cfg);
    cfg.build.param_dtype = DT_BF16;
    cfg.build.keep_batchnorm_fp32 = false;
    dt_model *m16 = t_create("convnet", 99, &cfg);
    ASSERT(m32 && m16);
    ASSERT_OK(dt_model_init_torch(m32, 0));
    ASSERT_OK(dt_model_init_torch(m16, 0));
    const char *names[] = {"layer1.0.weight", "layer1.1.weight", "layer1.1.bias", "layer2.1.weight",
                           "layer2.1.bias", "fc.weight", "fc.bias"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        int64_t a = dt_model_find_entry(m32, names[i]), b = dt_model_find_entry(m16, names[i]);
        ASSERT(a >= 0 && b >= 0);
        dt_param_info p32, p16;
        ASSERT_OK(dt_model_entry(m32, (size_t)a, &p32));
        ASSERT_OK(dt_model_entry(m16, (size_t)b, &p16));
        ASSERT_EQ_INT(p16.dtype, DT_BF16);
        ASSERT_EQ_INT((long long)p16.numel, (long long)p32.numel);
        uint16_t *want = malloc(p32.numel * sizeof *want);
        ASSERT(want);
        ASSERT_OK(dt_k_convert(p32.tensor->data, DT_F32, want, DT_BF16, (int64_t)p32.numel));
        ASSERT(memcmp(want, p16.tensor->data, p32.numel * sizeof *want) == 0);
        free(want);
    }
    dt_model_free(m32);
    dt_model_free(m16);
}

int main(void)
{
    RUN(uniform_is_torch_uniform);
    RUN(normal_is_torch_normal);
    RUN(normal_part_is_a_slice_of_normal);
    RUN(randperm_is_torch_randperm);
    RUN(convnet_starts_from_torch_weights);
    RUN(embedding_starts_from_torch_weights);
    RUN(bf16_model_starts_from_rounded_torch_weights);
    return TEST_REPORT();
}
