/* Checkpoint checksums: CRC-32C (the SSE4.2 path and the table path give
 * the standard value and each other's, at every length and alignment; the
 * combine of pieces equals the whole), zlib's CRC-32 through
 * dt_ckpt_sum_update, old checkpoints (index "crc32") still verified and a
 * flipped byte still caught under both checksums, and dt_ckpt_read_batch's
 * one-pass verification: requests out of file order, overlapping and with
 * gaps read the right values, and a damaged byte is caught wherever it is
 * (in a byte read, in a gap, after the last request). */
#include "dtrain/ckpt.h"
#include "test.h"
#include "tmp_util.h"

#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

static uint8_t *rand_bytes(size_t n, uint64_t seed)
{
    uint8_t *p = malloc(n ? n : 1);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
    return p;
}

TEST(crc32c_values)
{
    ASSERT_EQ_U64(dt_crc32c(0, "123456789", 9), 0xE3069283u);
    ASSERT_EQ_U64(dt_crc32c_portable(0, "123456789", 9), 0xE3069283u);
    ASSERT_EQ_U64(dt_crc32c(0, "", 0), 0);
    /* RFC 3720 B.4: 32 bytes of zeros, of 0xff */
    uint8_t z[32] = {0}, f[32];
    memset(f, 0xff, sizeof f);
    ASSERT_EQ_U64(dt_crc32c(0, z, 32), 0x8A9136AAu);
    ASSERT_EQ_U64(dt_crc32c(0, f, 32), 0x62A8AB43u);
    ASSERT_EQ_U64(dt_ckpt_sum_update(DT_SUM_CRC32, 0, "123456789", 9), 0xCBF43926u);
    ASSERT_EQ_U64(dt_ckpt_sum_update(DT_SUM_CRC32C, 0, "123456789", 9), 0xE3069283u);
    ASSERT_STR_EQ(dt_ckpt_sum_name(DT_SUM_CRC32C), "crc32c");
    ASSERT_STR_EQ(dt_ckpt_sum_name(DT_SUM_CRC32), "crc32");
    printf("  dt_crc32c uses %s\n", dt_crc32c_impl());
}

TEST(crc32c_paths_agree)
{
    /* lengths around the 3 x 4096-byte blocks of the SSE4.2 path, every
     * alignment of the start; the two paths and a byte-at-a-time chain */
    const size_t N = 3 * 4096 * 3 + 64;
    uint8_t *p = rand_bytes(N, 1);
    static const size_t lens[] = {0, 1, 7, 8, 9, 63, 4095, 12287, 12288, 12289, 24576 + 5, 3 * 12288, 3 * 12288 + 63};
    int bad = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (size_t a = 0; a < 8; a++) {
            size_t n = lens[li];
            if (a + n > N)
                continue;
            uint32_t h = dt_crc32c(0, p + a, n), s = dt_crc32c_portable(0, p + a, n);
            bad += h != s;
            /* continued in two pieces = whole */
            uint32_t c2 = dt_crc32c(dt_crc32c(0, p + a, n / 3), p + a + n / 3, n - n / 3);
            bad += c2 != h;
            /* the combine of the pieces = whole */
            uint32_t cb = dt_crc32c_combine(dt_crc32c(0, p + a, n / 2), dt_crc32c(0, p + a + n / 2, n - n / 2),
                                            n - n / 2);
            bad += cb != h;
        }
    uint32_t c = 0;
    for (size_t i = 0; i < 1000; i++)
        c = dt_crc32c_portable(c, p + i, 1);
    bad += c != dt_crc32c(0, p, 1000);
    ASSERT_EQ_INT(bad, 0);
    /* a flipped bit changes it, on both paths */
    uint32_t before = dt_crc32c(0, p, N);
    p[N / 2] ^= 0x04;
    ASSERT(dt_crc32c(0, p, N) != before);
    ASSERT(dt_crc32c_portable(0, p, N) != before);
    free(p);
}

/* A 3-rank checkpoint of four f32 tensors, whole and ranged. */
#define NT 4
static const int64_t LEN[NT] = {5000, 70000, 3, 120000};
static const char *NAMES[NT] = {"a.weight", "b.weight", "c.bias", "d.weight"};

static float val(int t, uint64_t i)
{
    return (float)(t * 1000003 + (int64_t)i) * 0.25f;
}

static void save_ckpt(const char *dir)
{
    dt_ckpt_entry e[3][NT];
    const dt_ckpt_entry *ranks[3];
    float *data[3][NT];
    for (int r = 0; r < 3; r++) {
        for (int t = 0; t < NT; t++) {
            uint64_t n = (uint64_t)LEN[t], lo = n * (uint64_t)r / 3, hi = n * (uint64_t)(r + 1) / 3;
            data[r][t] = malloc((hi - lo + 1) * sizeof(float));
            for (uint64_t i = lo; i < hi; i++)
                data[r][t][i - lo] = val(t, i);
            e[r][t] = (dt_ckpt_entry){.name = NAMES[t], .dtype = DT_F32, .ndim = 1, .shape = {LEN[t]}, .lo = lo,
                                      .hi = hi, .data = data[r][t]};
        }
        ranks[r] = e[r];
    }
    dt_ckpt_save_params p = dt_ckpt_save_params_default();
    if (dt_ckpt_save_ranks(dir, ranks, 3, NT, &p) < 0)
        fprintf(stderr, "save: %s\n", dt_last_error());
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < NT; t++)
            free(data[r][t]);
}

static int flip(const char *path, long at, int whence)
{
    FILE *f = fopen(path, "r+b");
    if (!f)
        return -1;
    fseek(f, at, whence);
    int c = fgetc(f);
    fseek(f, at, whence);
    fputc(c ^ 0x20, f);
    fclose(f);
    return 0;
}

/* Read requests in a scrambled order, overlapping, with gaps; check values. */
static dt_status batch_read(const char *dir, bool verify, int *wrong)
{
    dt_ckpt *ck;
    dt_status st = dt_ckpt_open(dir, &ck);
    if (st < 0)
        return st;
    float *buf[6];
    dt_ckpt_req r[6];
    int idx[6] = {3, 0, 1, 3, 2, 1};
    uint64_t lo[6] = {90000, 0, 30000, 10, 0, 29000}, hi[6] = {120000, 5000, 31000, 50000, 3, 60000};
    for (int k = 0; k < 6; k++) {
        int64_t t = dt_ckpt_find(ck, NAMES[idx[k]]);
        buf[k] = calloc(hi[k] - lo[k], sizeof(float));
        r[k] = (dt_ckpt_req){.tensor = (size_t)t, .lo = lo[k], .hi = hi[k], .dst = buf[k]};
    }
    st = dt_ckpt_read_batch(ck, r, 6, verify);
    *wrong = 0;
    for (int k = 0; st == DT_OK && k < 6; k++)
        for (uint64_t i = lo[k]; i < hi[k]; i++)
            *wrong += buf[k][i - lo[k]] != val(idx[k], i);
    for (int k = 0; k < 6; k++)
        free(buf[k]);
    dt_ckpt_close(ck);
    return st;
}

TEST(batch_reads_and_catches_damage)
{
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s/batch", t_tmpdir("checksum"));
    save_ckpt(dir);
    snprintf(p, sizeof p, "%s/index.json", dir);
    struct stat sb;
    ASSERT(stat(p, &sb) == 0);
    int wrong = -1;
    ASSERT_OK(batch_read(dir, true, &wrong));
    ASSERT_EQ_INT(wrong, 0);
    /* the index names the checksum */
    FILE *f = fopen(p, "rb");
    char *js = calloc(1, (size_t)sb.st_size + 1);
    ASSERT(f && fread(js, 1, (size_t)sb.st_size, f) == (size_t)sb.st_size);
    fclose(f);
    ASSERT_STR_CONTAINS(js, "\"crc32c\":");
    ASSERT(strstr(js, "\"crc32\":") == NULL);
    free(js);
    /* damage at three places of rank 1's file: a byte two requests read, a
     * byte no request reads (a gap), the last byte (after the last request) */
    snprintf(p, sizeof p, "%s/rank-00001.safetensors", dir);
    dt_st_file *sf;
    ASSERT_OK(dt_st_open(p, &sf));
    const dt_st_tensor *tb = dt_st_find(sf, "b.weight"), *td = dt_st_find(sf, "d.weight");
    ASSERT(tb && td);
    /* rank 1 holds b [23333, 46666) (element 30500 is read twice) and d
     * [40000, 80000) (60000 and 79999 are not read) */
    const long where[3] = {(long)(tb->offset + (30500 - 23333) * 4), (long)(td->offset + (60000 - 40000) * 4), -1};
    dt_st_close(sf);
    for (int k = 0; k < 3; k++) {
        ASSERT_EQ_INT(flip(p, where[k], k == 2 ? SEEK_END : SEEK_SET), 0);
        ASSERT_STATUS(batch_read(dir, true, &wrong), DT_ERR_FORMAT);
        ASSERT_STR_CONTAINS(dt_last_error(), "rank-00001.safetensors: CRC-32C");
        ASSERT_STR_CONTAINS(dt_last_error(), "damaged");
        ASSERT_OK(batch_read(dir, false, &wrong)); /* unchecked: the reads go through */
        ASSERT_EQ_INT(wrong, k == 0 ? 2 : 0);
        ASSERT_EQ_INT(flip(p, where[k], k == 2 ? SEEK_END : SEEK_SET), 0); /* mend */
        ASSERT_OK(batch_read(dir, true, &wrong));
        ASSERT_EQ_INT(wrong, 0);
    }
    t_rm_rf(dir);
}

/* Rewrite the index's "crc32c" of every file as the zlib CRC-32 under the
 * key "crc32" (what a checkpoint written before CRC-32C holds). */
static int to_old_index(const char *dir)
{
    char p[600];
    snprintf(p, sizeof p, "%s/index.json", dir);
    FILE *f = fopen(p, "rb");
    if (!f)
        return -1;
    char *js = calloc(1, 1 << 20);
    size_t n = fread(js, 1, (1 << 20) - 1, f);
    fclose(f);
    char *out = calloc(1, (1 << 20) + 256);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const char *key = "\"crc32c\":";
        if (strncmp(js + i, key, strlen(key)) == 0) {
            /* the file this entry names: the last "name":"..." before it */
            char *nm = NULL;
            for (char *q = js + i; q > js; q--)
                if (strncmp(q, "\"name\":", 7) == 0) {
                    nm = q + 7;
                    break;
                }
            if (!nm)
                return -1;
            while (*nm == ' ' || *nm == '\t' || *nm == '"')
                nm++;
            char fname[128], fp[800];
            snprintf(fname, sizeof fname, "%.*s", (int)(strchr(nm, '"') - nm), nm);
            snprintf(fp, sizeof fp, "%s/%s", dir, fname);
            dt_st_file *sf;
            uint32_t c;
            if (dt_st_open(fp, &sf) < 0 || dt_st_checksum(sf, DT_SUM_CRC32, &c) < 0)
                return -1;
            dt_st_close(sf);
            o += (size_t)sprintf(out + o, "\"crc32\":%u", c);
            i += strlen(key);
            while (i < n && (js[i] == ' ' || js[i] == '\t'))
                i++;
            while (i < n && js[i] >= '0' && js[i] <= '9')
                i++;
        } else {
            out[o++] = js[i++];
        }
    }
    free(js);
    dt_status st = dt_file_write_atomic(p, out, o, 0644);
    free(out);
    return st < 0 ? -1 : 0;
}

TEST(old_crc32_checkpoints)
{
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s/old", t_tmpdir("checksum"));
    save_ckpt(dir);
    ASSERT_EQ_INT(to_old_index(dir), 0);
    snprintf(p, sizeof p, "%s/index.json", dir);
    FILE *f = fopen(p, "rb");
    char js[8192] = {0};
    ASSERT(f && fread(js, 1, sizeof js - 1, f) > 0);
    fclose(f);
    ASSERT_STR_CONTAINS(js, "\"crc32\":");
    ASSERT(strstr(js, "crc32c") == NULL);
    /* verified: the batch, dt_ckpt_read's verify-first and dt_ckpt_verify */
    int wrong = -1;
    ASSERT_OK(batch_read(dir, true, &wrong));
    ASSERT_EQ_INT(wrong, 0);
    dt_ckpt *ck;
    ASSERT_OK(dt_ckpt_open(dir, &ck));
    ASSERT_OK(dt_ckpt_verify(ck));
    dt_ckpt_close(ck);
    /* a flipped byte: caught by all three, naming CRC-32 */
    snprintf(p, sizeof p, "%s/rank-00002.safetensors", dir);
    ASSERT_EQ_INT(flip(p, -5, SEEK_END), 0);
    ASSERT_STATUS(batch_read(dir, true, &wrong), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "rank-00002.safetensors: CRC-32 ");
    ASSERT_OK(dt_ckpt_open(dir, &ck));
    float x[4];
    ASSERT_STATUS(dt_ckpt_read(ck, (size_t)dt_ckpt_find(ck, "d.weight"), 119990, 119994, x, true), DT_ERR_FORMAT);
    ASSERT_STATUS(dt_ckpt_verify(ck), DT_ERR_FORMAT);
    dt_ckpt_close(ck);
    /* both checksums for one file: refused */
    ASSERT_EQ_INT(flip(p, -5, SEEK_END), 0);
    snprintf(p, sizeof p, "%s/index.json", dir);
    char *both = strstr(js, "\"crc32\":");
    ASSERT(both != NULL);
    char js2[8300];
    snprintf(js2, sizeof js2, "%.*s\"crc32c\":1,%s", (int)(both - js), js, both);
    ASSERT_OK(dt_file_write_atomic(p, js2, strlen(js2), 0644));
    ASSERT_STATUS(dt_ckpt_open(dir, &ck), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "both \"crc32\" and \"crc32c\"");
    t_rm_rf(dir);
}

int main(void)
{
    if (!t_tmpdir("checksum")[0])
        DT_TEST_SKIP_ALL("cannot make a scratch directory");
    RUN(crc32c_values);
    RUN(crc32c_paths_agree);
    RUN(batch_reads_and_catches_damage);
    RUN(old_crc32_checkpoints);
    t_rm_rf(t_tmpdir("checksum"));
    return TEST_REPORT();
}
