/* generate_tps — tokens per second of dt_model_generate with and without
 * its key/value cache (dt_generate_params.kv_cache), interleaved.
 *
 *     build/bench/generate_tps [--model gpt2] [--prompt 16] [--new 64]
 *                              [--rounds 3] [--threads T] [--beams 1]
 *
 * One model (the zoo's initialisation, seed 1); each round generates
 * --new tokens greedily (or by beam search with --beams N > 1, no stop
 * token: exactly --new tokens) after a --prompt token prompt, uncached
 * then cached (the order alternates by round). Prints per mode the median wall and
 * process-CPU tokens/s and the ratio of the medians (cached / uncached),
 * and whether both produced the same tokens. */
#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    const char *name = "gpt2";
    int64_t np = 16, nnew = 64;
    int rounds = 3, threads = 0;
    int64_t beams = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            name = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt"))
            np = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--new"))
            nnew = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--beams"))
            beams = atoll(argv[i + 1]);
        else {
            fprintf(stderr, "generate_tps: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (np < 1 || nnew < 1 || rounds < 1 || rounds > 100 || threads < 0 || beams < 1 || beams > 64) {
        fprintf(stderr, "generate_tps: --prompt, --new, --rounds (<= 100), --beams (<= 64) >= 1 please\n");
        return 2;
    }
    if (threads)
        dt_set_num_threads(threads);
    dt_model *m = NULL;
    dt_model_desc d;
    if (dt_model_create(name, 1, NULL, &m, &d) < 0) {
        fprintf(stderr, "generate_tps: %s\n", dt_last_error());
        return 2;
    }
    int64_t cap = np + nnew, *prompt = calloc((size_t)np, sizeof *prompt);
    int64_t *out[2] = {calloc((size_t)cap, sizeof(int64_t)), calloc((size_t)cap, sizeof(int64_t))};
    double wall[2][100], cpu[2][100];
    bool same = true;
    if (!prompt || !out[0] || !out[1])
        return 1;
    for (int64_t i = 0; i < np; i++)
        prompt[i] = (i * 7919) % d.input_classes;
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 2; k++) {
            int mode = (r % 2) ? 1 - k : k; /* 0 uncached, 1 cached */
            dt_generate_params gp = dt_generate_params_default();
            gp.temperature = 0;
            gp.max_new_tokens = nnew;
            gp.kv_cache = mode == 1;
            gp.num_beams = beams;
            int64_t n = 0;
            double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
            if (dt_model_generate(m, &gp, prompt, np, out[mode], cap, &n) < 0) {
                fprintf(stderr, "generate_tps: %s\n", dt_last_error());
                return 1;
            }
            wall[mode][r] = (double)nnew / (now(CLOCK_MONOTONIC) - w0);
            cpu[mode][r] = (double)nnew / (now(CLOCK_PROCESS_CPUTIME_ID) - c0);
        }
        same = same && !memcmp(out[0], out[1], (size_t)cap * sizeof(int64_t));
    }
    double wu = median(wall[0], rounds), wc = median(wall[1], rounds);
    double cu = median(cpu[0], rounds), cc = median(cpu[1], rounds);
    printf("%s prompt %lld new %lld beams %lld threads %d rounds %d\n", name, (long long)np, (long long)nnew,
           (long long)beams, dt_get_num_threads(), rounds);
    printf("uncached  %8.2f tokens/s wall  %8.2f tokens/CPU-s\n", wu, cu);
    printf("kv cache  %8.2f tokens/s wall  %8.2f tokens/CPU-s\n", wc, cc);
    printf("ratio     %8.2fx wall          %8.2fx CPU   same tokens: %s\n", wc / wu, cc / cu, same ? "yes" : "NO");
    free(prompt);
    free(out[0]);
    free(out[1]);
    dt_model_free(m);
    return same ? 0 : 1;
}
