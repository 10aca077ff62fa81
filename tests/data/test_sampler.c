/* Samplers: sequential, random (seeded, epoch-dependent permutation),
 * distributed (PyTorch DistributedSampler semantics), batch sampler. */
#include "dtrain/data.h"
#include "test.h"

static int is_perm(const int64_t *v, int64_t n)
{
    char *seen = calloc((size_t)n + 1, 1);
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        if (v[i] < 0 || v[i] >= n || seen[v[i]])
            ok = 0;
        else
            seen[v[i]] = 1;
    }
    free(seen);
    return ok;
}

TEST(sequential)
{
    dt_sampler *s = NULL;
    ASSERT_OK(dt_sampler_sequential_init(7, &s));
    ASSERT_EQ_INT(dt_sampler_length(s), 7);
    int64_t v[7];
    dt_sampler_set_epoch(s, 3);
    ASSERT_OK(dt_sampler_indices_current(s, v));
    for (int i = 0; i < 7; i++)
        ASSERT_EQ_INT(v[i], i);
    dt_sampler_free(s);
    ASSERT_STATUS(dt_sampler_sequential_init(-1, &s), DT_ERR_INVALID_ARG);
}

TEST(random_seeded_epoch_dependent)
{
    enum { N = 1000 };
    dt_sampler *a = NULL, *b = NULL, *c = NULL;
    ASSERT_OK(dt_sampler_random_init(N, 5, &a));
    ASSERT_OK(dt_sampler_random_init(N, 5, &b));
    ASSERT_OK(dt_sampler_random_init(N, 6, &c));
    static int64_t va[N], vb[N], vc[N];
    ASSERT_OK(dt_sampler_indices(a, 0, va));
    ASSERT(is_perm(va, N));
    ASSERT_OK(dt_sampler_indices(b, 0, vb));
    ASSERT(memcmp(va, vb, sizeof va) == 0); /* same seed, same epoch */
    int fixed = 0;
    for (int i = 0; i < N; i++)
        fixed += va[i] == i;
    ASSERT(fixed < 20); /* actually shuffled (expected ~1 fixed point) */
    ASSERT_OK(dt_sampler_indices(b, 1, vb));
    ASSERT(is_perm(vb, N));
    ASSERT(memcmp(va, vb, sizeof va) != 0); /* epoch changes the order */
    ASSERT_OK(dt_sampler_indices(c, 0, vc));
    ASSERT(memcmp(vc, vb, sizeof vc) == 0); /* seed 6 epoch 0 == seed 5 epoch 1 */
    /* set_epoch drives indices_current */
    dt_sampler_set_epoch(a, 1);
    ASSERT_EQ_INT(dt_sampler_get_epoch(a), 1);
    ASSERT_OK(dt_sampler_indices_current(a, va));
    ASSERT(memcmp(va, vb, sizeof va) == 0);
    dt_sampler_free(a);
    dt_sampler_free(b);
    dt_sampler_free(c);
}

/* The reference: SEMANTICS.md 3.2 built literally from the list. */
static void dist_reference(const int64_t *perm, int64_t N, int W, int r, bool drop_last,
                           int64_t *out, int64_t *count)
{
    int64_t ns = (drop_last && N % W) ? (N - W + W - 1) / W : (N + W - 1) / W;
    int64_t total = ns * W;
    int64_t *list = malloc((size_t)(total + N + 1) * sizeof *list);
    int64_t len = 0;
    for (int64_t i = 0; i < N; i++)
        list[len++] = perm[i];
    if (!drop_last) {
        while (len < total) /* append indices[:pad], repeating when pad > N */
            for (int64_t i = 0; i < N && len < total; i++)
                list[len++] = perm[i];
    }
    len = total; /* truncate */
    int64_t k = 0;
    for (int64_t q = r; q < len; q += W)
        out[k++] = list[q];
    *count = k;
    free(list);
}

TEST(distributed_matches_reference)
{
    const int64_t Ns[] = {0, 1, 2, 3, 7, 10, 11, 100, 101};
    const int Ws[] = {1, 2, 3, 4, 8};
    int64_t perm[128], got[128], want[128];
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++)
        for (size_t bw = 0; bw < sizeof Ws / sizeof Ws[0]; bw++)
            for (int dl = 0; dl < 2; dl++)
                for (int sh = 0; sh < 2; sh++)
                    for (int64_t epoch = 0; epoch < 2; epoch++) {
                        int64_t N = Ns[a];
                        int W = Ws[bw];
                        /* the permutation the sampler must use */
                        if (sh)
                            dt_rng_permutation(dt_rng_key_make(9 + (uint64_t)epoch, DT_RNG_SHUFFLE, 0, 0),
                                               perm, N);
                        else
                            for (int64_t i = 0; i < N; i++)
                                perm[i] = i;
                        int64_t union_count = 0;
                        for (int r = 0; r < W; r++) {
                            dt_distributed_sampler_params p = dt_distributed_sampler_params_default();
                            p.length = N;
                            p.world_size = W;
                            p.rank = r;
                            p.shuffle = sh;
                            p.seed = 9;
                            p.drop_last = dl;
                            dt_sampler *s = NULL;
                            ASSERT_OK(dt_sampler_distributed_init(&p, &s));
                            int64_t cnt = 0;
                            if (N > 0)
                                dist_reference(perm, N, W, r, dl, want, &cnt);
                            ASSERT_EQ_INT(dt_sampler_length(s), cnt);
                            dt_sampler_set_epoch(s, epoch);
                            ASSERT_OK(dt_sampler_indices_current(s, got));
                            for (int64_t i = 0; i < cnt; i++)
                                if (got[i] != want[i]) {
                                    dt_sampler_free(s);
                                    TEST_FAIL_("N=%lld W=%d r=%d dl=%d sh=%d: [%lld] %lld != %lld",
                                               (long long)N, W, r, dl, sh, (long long)i,
                                               (long long)got[i], (long long)want[i]);
                                }
                            union_count += cnt;
                            dt_sampler_free(s);
                        }
                        /* every rank the same count; padded covers N, dropped <= N */
                        if (N > 0 && !dl)
                            ASSERT_EQ_INT(union_count, ((N + W - 1) / W) * W);
                        if (dl)
                            ASSERT_EQ_INT(union_count, (N / W) * W);
                    }
}

TEST(distributed_known_values)
{
    /* no shuffle, N = 10, W = 3: padded list 0..9,0,1; rank 1 takes 1,4,7,0 */
    dt_distributed_sampler_params p = dt_distributed_sampler_params_default();
    p.length = 10;
    p.world_size = 3;
    p.rank = 1;
    p.shuffle = false;
    dt_sampler *s = NULL;
    ASSERT_OK(dt_sampler_distributed_init(&p, &s));
    int64_t v[4];
    ASSERT_EQ_INT(dt_sampler_length(s), 4);
    ASSERT_OK(dt_sampler_indices(s, 0, v));
    ASSERT_EQ_INT(v[0], 1);
    ASSERT_EQ_INT(v[1], 4);
    ASSERT_EQ_INT(v[2], 7);
    ASSERT_EQ_INT(v[3], 0);
    dt_sampler_free(s);
    /* drop_last: 3 each; rank 2 takes 2,5,8 */
    p.drop_last = true;
    p.rank = 2;
    ASSERT_OK(dt_sampler_distributed_init(&p, &s));
    ASSERT_EQ_INT(dt_sampler_length(s), 3);
    ASSERT_OK(dt_sampler_indices(s, 0, v));
    ASSERT_EQ_INT(v[0], 2);
    ASSERT_EQ_INT(v[1], 5);
    ASSERT_EQ_INT(v[2], 8);
    dt_sampler_free(s);
    /* N = 2, W = 5: pad > N repeats the list: 0,1,0,1,0; rank 4 takes 0 */
    p.length = 2;
    p.world_size = 5;
    p.rank = 4;
    p.drop_last = false;
    ASSERT_OK(dt_sampler_distributed_init(&p, &s));
    ASSERT_EQ_INT(dt_sampler_length(s), 1);
    ASSERT_OK(dt_sampler_indices(s, 0, v));
    ASSERT_EQ_INT(v[0], 0);
    dt_sampler_free(s);
    /* bad params */
    p.rank = 5;
    ASSERT_STATUS(dt_sampler_distributed_init(&p, &s), DT_ERR_INVALID_ARG);
    p.rank = 0;
    p.world_size = 0;
    ASSERT_STATUS(dt_sampler_distributed_init(&p, &s), DT_ERR_INVALID_ARG);
}

TEST(distributed_w1_equals_random)
{
    enum { N = 300 };
    dt_distributed_sampler_params p = dt_distributed_sampler_params_default();
    p.length = N;
    p.seed = 42;
    dt_sampler *d = NULL, *r = NULL;
    ASSERT_OK(dt_sampler_distributed_init(&p, &d));
    ASSERT_OK(dt_sampler_random_init(N, 42, &r));
    int64_t a[N], b[N];
    for (int64_t e = 0; e < 3; e++) {
        ASSERT_OK(dt_sampler_indices(d, e, a));
        ASSERT_OK(dt_sampler_indices(r, e, b));
        ASSERT(memcmp(a, b, sizeof a) == 0);
    }
    dt_sampler_free(d);
    dt_sampler_free(r);
}

TEST(batch_sampler)
{
    dt_sampler *s = NULL;
    ASSERT_OK(dt_sampler_sequential_init(10, &s));
    dt_batch_sampler *bs = NULL;
    ASSERT_OK(dt_batch_sampler_init(s, 4, false, &bs));
    ASSERT_EQ_INT(dt_batch_sampler_length(bs), 3);
    ASSERT_OK(dt_batch_sampler_set_epoch(bs, 0));
    const int64_t *idx;
    int64_t n;
    ASSERT_OK(dt_batch_sampler_get(bs, 2, &idx, &n));
    ASSERT_EQ_INT(n, 2);
    ASSERT_EQ_INT(idx[0], 8);
    ASSERT_EQ_INT(idx[1], 9);
    ASSERT_STATUS(dt_batch_sampler_get(bs, 3, &idx, &n), DT_ERR_RANGE);
    dt_batch_sampler_free(bs);
    ASSERT_OK(dt_batch_sampler_init(s, 4, true, &bs));
    ASSERT_EQ_INT(dt_batch_sampler_length(bs), 2);
    ASSERT_OK(dt_batch_sampler_set_epoch(bs, 0));
    ASSERT_OK(dt_batch_sampler_get(bs, 1, &idx, &n));
    ASSERT_EQ_INT(n, 4);
    ASSERT_EQ_INT(idx[3], 7);
    dt_batch_sampler_free(bs);
    ASSERT_OK(dt_batch_sampler_init(s, 5, true, &bs));
    ASSERT_EQ_INT(dt_batch_sampler_length(bs), 2); /* exact division keeps all */
    dt_batch_sampler_free(bs);
    ASSERT_STATUS(dt_batch_sampler_init(s, 0, false, &bs), DT_ERR_INVALID_ARG);
    dt_sampler_free(s);
}

/* A user sampler through the vtable: reversed order. */
static int64_t rev_len(void *self) { return *(int64_t *)self; }
static dt_status rev_idx(void *self, int64_t epoch, int64_t *out)
{
    (void)epoch;
    int64_t n = *(int64_t *)self;
    for (int64_t i = 0; i < n; i++)
        out[i] = n - 1 - i;
    return DT_OK;
}

TEST(custom_sampler)
{
    static const dt_sampler_vtable vt = {
        .version = DT_SAMPLER_VTABLE_VERSION, .name = "rev", .length = rev_len, .indices = rev_idx, .free = NULL};
    static int64_t n = 5;
    dt_sampler *s = NULL;
    ASSERT_OK(dt_sampler_init(&vt, &n, &s));
    int64_t v[5];
    ASSERT_OK(dt_sampler_indices(s, 0, v));
    ASSERT_EQ_INT(v[0], 4);
    ASSERT_EQ_INT(v[4], 0);
    dt_sampler_free(s);
    static const dt_sampler_vtable bad = {.version = 99, .length = rev_len, .indices = rev_idx};
    ASSERT_STATUS(dt_sampler_init(&bad, &n, &s), DT_ERR_INVALID_ARG);
}

/* Uneven data must not hang DDP: every rank gets the same number of
 * batches of the same sizes, for any N, W, batch size and drop_last. */
TEST(distributed_equal_batches_per_rank)
{
    const int64_t Ns[] = {1, 5, 99, 100, 101, 257};
    const int Ws[] = {2, 3, 4, 8};
    const int64_t Bs[] = {1, 7, 32};
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++)
        for (size_t w = 0; w < sizeof Ws / sizeof Ws[0]; w++)
            for (size_t bb = 0; bb < sizeof Bs / sizeof Bs[0]; bb++)
                for (int dl = 0; dl < 2; dl++) {
                    int64_t nb0 = -1, last0 = -1;
                    for (int r = 0; r < Ws[w]; r++) {
                        dt_distributed_sampler_params p = dt_distributed_sampler_params_default();
                        p.length = Ns[a];
                        p.world_size = Ws[w];
                        p.rank = r;
                        p.drop_last = dl;
                        dt_sampler *s = NULL;
                        dt_batch_sampler *bs = NULL;
                        ASSERT_OK(dt_sampler_distributed_init(&p, &s));
                        ASSERT_OK(dt_batch_sampler_init(s, Bs[bb], false, &bs));
                        ASSERT_OK(dt_batch_sampler_set_epoch(bs, 3));
                        int64_t nb = dt_batch_sampler_length(bs), last = 0;
                        if (nb > 0) {
                            const int64_t *idx;
                            ASSERT_OK(dt_batch_sampler_get(bs, nb - 1, &idx, &last));
                            for (int64_t k = 0; k < last; k++)
                                ASSERT(idx[k] >= 0 && idx[k] < Ns[a]);
                        }
                        if (r == 0) {
                            nb0 = nb;
                            last0 = last;
                        }
                        ASSERT_EQ_INT(nb, nb0);
                        ASSERT_EQ_INT(last, last0);
                        dt_batch_sampler_free(bs);
                        dt_sampler_free(s);
                    }
                }
}

/* DT_SHUFFLE_TORCH: PyTorch's DistributedSampler(range(10), num_replicas=3,
 * rank=r, seed=4) after set_epoch(1) draws torch.randperm(10) seeded 5 =
 * [1, 4, 9, 6, 3, 5, 0, 2, 8, 7] (tests/base/test_torch_rng.c), pads to 12
 * with its head [1, 4] and rank r takes every third entry from r. */
TEST(torch_shuffle_is_torch_distributed_sampler)
{
    const int64_t want[3][4] = {{1, 6, 0, 7}, {4, 3, 2, 1}, {9, 5, 8, 4}};
    for (int r = 0; r < 3; r++) {
        dt_distributed_sampler_params p = dt_distributed_sampler_params_default();
        p.length = 10;
        p.world_size = 3;
        p.rank = r;
        p.seed = 4;
        p.rng = DT_SHUFFLE_TORCH;
        dt_sampler *d = NULL;
        ASSERT_OK(dt_sampler_distributed_init(&p, &d));
        ASSERT_EQ_INT(dt_sampler_length(d), 4);
        int64_t got[4];
        ASSERT_OK(dt_sampler_indices(d, 1, got));
        for (int k = 0; k < 4; k++)
            ASSERT_EQ_INT(got[k], want[r][k]);
        dt_sampler_free(d);
    }
    dt_sampler *s = NULL;
    int64_t got[10];
    ASSERT_OK(dt_sampler_random_init_rng(10, 3, DT_SHUFFLE_TORCH, &s));
    ASSERT_OK(dt_sampler_indices(s, 2, got)); /* seed 3 + epoch 2 */
    const int64_t perm5[10] = {1, 4, 9, 6, 3, 5, 0, 2, 8, 7};
    for (int k = 0; k < 10; k++)
        ASSERT_EQ_INT(got[k], perm5[k]);
    dt_sampler_free(s);
    ASSERT_STATUS(dt_sampler_random_init_rng(10, 3, (dt_shuffle_rng)7, &s), DT_ERR_INVALID_ARG);
    dt_distributed_sampler_params p = dt_distributed_sampler_params_default();
    p.length = 10;
    p.rng = (dt_shuffle_rng)7;
    ASSERT_STATUS(dt_sampler_distributed_init(&p, &s), DT_ERR_INVALID_ARG);
}

int main(void)
{
    RUN(sequential);
    RUN(random_seeded_epoch_dependent);
    RUN(distributed_matches_reference);
    RUN(distributed_known_values);
    RUN(distributed_w1_equals_random);
    RUN(distributed_equal_batches_per_rank);
    RUN(batch_sampler);
    RUN(custom_sampler);
    RUN(torch_shuffle_is_torch_distributed_sampler);
    return TEST_REPORT();
}
