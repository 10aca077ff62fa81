/* Scalar monitors (monitor.h): the TensorBoard event file record by record
 * (lengths, masked CRC-32C computed here bit by bit, the Event fields) and
 * byte for byte what PyTorch's SummaryWriter.add_scalar writes for the same
 * scalar (its bytes below, wall time aside: torch 2.x, `add_scalar(tag,
 * value, step)`); the CSV files as DeepSpeed's csvMonitor writes them
 * (Python's csv module: "\r\n", floats as repr; the repr strings below are
 * Python's own); the config blocks' directories (output_path/job_name);
 * dt_dir_make; symlinks refused. */
#include "dtrain/config.h"
#include "dtrain/monitor.h"
#include "test.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static const char *in_dir(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_dir, name);
    return buf;
}

static size_t slurp(const char *path, unsigned char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t k = fread(buf, 1, cap, f);
    fclose(f);
    return k;
}

/* The one events.out.tfevents.* file in dir, into path. */
static int event_file(const char *dir, char *path, size_t n)
{
    DIR *d = opendir(dir);
    int found = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) {
            snprintf(path, n, "%s/%s", dir, e->d_name);
            found++;
        }
    if (d)
        closedir(d);
    return found;
}

static uint32_t crc32c_bitwise(const unsigned char *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (c & 1 ? 0x82f63b78u : 0);
    }
    return c ^ 0xffffffffu;
}

static uint32_t masked(const unsigned char *p, size_t n)
{
    uint32_t c = crc32c_bitwise(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint32_t le32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

static void hex(const unsigned char *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
    out[2 * n] = 0;
}

TEST(float_repr_is_pythons)
{
    static const struct {
        double v;
        const char *want; /* repr(v) in Python 3.11 */
    } cases[] = {
        {0.0, "0.0"},
        {1.0, "1.0"},
        {100.0, "100.0"},
        {0.001, "0.001"},
        {1e-05, "1e-05"},
        {0.0006309297535714574, "0.0006309297535714574"},
        {4.8512938022613525, "4.8512938022613525"},
        {1e16, "1e+16"},
        {1e15, "1000000000000000.0"},
        {123456789.0, "123456789.0"},
        {-2.5, "-2.5"},
        {0.3333333333333333, "0.3333333333333333"},
        {9.5367431640625e-07, "9.5367431640625e-07"},
        {6.02e+23, "6.02e+23"},
        {9999999999999998.0, "9999999999999998.0"},
        {0.0001, "0.0001"},
        {0.00011, "0.00011"},
        {-0.0, "-0.0"},
    };
    char b[40];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ASSERT_STR_EQ(dt_float_repr(cases[i].v, b, sizeof b), cases[i].want);
    ASSERT_STR_EQ(dt_float_repr(NAN, b, sizeof b), "nan");
    ASSERT_STR_EQ(dt_float_repr(-INFINITY, b, sizeof b), "-inf");
}

TEST(tensorboard_records)
{
    char dir[128], path[400];
    in_dir(dir, sizeof dir, "tb/a/b"); /* parents made */
    dt_monitor_params mp = dt_monitor_params_default();
    mp.tensorboard_dir = dir;
    dt_monitor *m;
    ASSERT_OK(dt_monitor_open(&mp, &m));
    ASSERT_OK(dt_monitor_write(m, "Train/Samples/train_loss", 4.866825, 2));
    ASSERT_OK(dt_monitor_write(m, "Train/Samples/lr", 0.0005, 0));
    ASSERT_OK(dt_monitor_write(m, "x", 1.5, 300));
    ASSERT_STATUS(dt_monitor_write(m, "", 1, 0), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_monitor_write(m, "x", 1, -1), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_monitor_close(m));
    ASSERT_EQ_INT(event_file(dir, path, sizeof path), 1);
    unsigned char b[1024];
    size_t n = slurp(path, b, sizeof b), i = 0;
    /* torch.utils.tensorboard's Events (after the 9-byte wall time): */
    static const char *const want[] = {
        "1a0d627261696e2e4576656e743a32", /* file_version "brain.Event:2" */
        /* add_scalar("Train/Samples/train_loss", 4.866825, 2) */
        "10022a210a1f0a18547261696e2f53616d706c65732f747261696e5f6c6f73731508bd9b40",
        "2a190a170a10547261696e2f53616d706c65732f6c72156f12033a", /* add_scalar("Train/Samples/lr", 0.0005, 0) */
        "10ac022a0a0a080a0178150000c03f",                         /* add_scalar("x", 1.5, 300) */
    };
    int nrec = 0;
    while (i + 16 <= n && nrec < 4) {
        uint64_t len = 0;
        for (int k = 0; k < 8; k++)
            len |= (uint64_t)b[i + k] << (8 * k);
        ASSERT(i + 16 + len <= n);
        ASSERT_EQ_U64(le32(b + i + 8), masked(b + i, 8));
        ASSERT_EQ_U64(le32(b + i + 12 + len), masked(b + i + 12, len));
        const unsigned char *ev = b + i + 12;
        ASSERT_EQ_INT(ev[0], 0x09); /* wall_time, a double of now */
        double wt;
        memcpy(&wt, ev + 1, 8);
        ASSERT(wt > 1.7e9 && wt < 4e9);
        char h[600];
        hex(ev + 9, len - 9, h);
        if (strcmp(h, want[nrec]))
            fprintf(stderr, "  record %d: %s, want %s\n", nrec, h, want[nrec]);
        ASSERT_STR_EQ(h, want[nrec]);
        i += 16 + len;
        nrec++;
    }
    ASSERT_EQ_INT(nrec, 4);
    ASSERT_EQ_U64(i, n);
}

TEST(csv_files)
{
    char dir[128], path[400];
    in_dir(dir, sizeof dir, "csv");
    dt_monitor_params mp = dt_monitor_params_default();
    mp.csv_dir = dir;
    for (int round = 0; round < 2; round++) { /* the second run appends, without a second header */
        dt_monitor *m;
        ASSERT_OK(dt_monitor_open(&mp, &m));
        ASSERT_OK(dt_monitor_write(m, "Train/Samples/lr", round ? 0.001 : 0.0, round ? 8 : 4));
        ASSERT_OK(dt_monitor_write(m, "Train/Samples/train_loss", 4.8512938022613525, round ? 8 : 4));
        ASSERT_OK(dt_monitor_write(m, "my tag", 100, 0));
        ASSERT_OK(dt_monitor_close(m));
    }
    unsigned char b[512];
    size_t n = slurp(in_dir(path, sizeof path, "csv/Train_Samples_lr.csv"), b, sizeof b - 1);
    b[n] = 0;
    ASSERT_STR_EQ((char *)b, "step,lr\r\n4,0.0\r\n8,0.001\r\n");
    n = slurp(in_dir(path, sizeof path, "csv/Train_Samples_train_loss.csv"), b, sizeof b - 1);
    b[n] = 0;
    ASSERT_STR_EQ((char *)b, "step,train_loss\r\n4,4.8512938022613525\r\n8,4.8512938022613525\r\n");
    n = slurp(in_dir(path, sizeof path, "csv/my_tag.csv"), b, sizeof b - 1);
    b[n] = 0;
    ASSERT_STR_EQ((char *)b, "step,my tag\r\n0,100.0\r\n0,100.0\r\n");
}

TEST(symlinks_refused)
{
    char real[128], link[128], path[400], file_link[400];
    in_dir(real, sizeof real, "real");
    in_dir(link, sizeof link, "link");
    ASSERT_OK(dt_dir_make(real));
    ASSERT_EQ_INT(symlink(real, link), 0);
    dt_monitor_params mp = dt_monitor_params_default();
    dt_monitor *m = NULL;
    mp.tensorboard_dir = link;
    ASSERT_STATUS(dt_monitor_open(&mp, &m), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "symlink (not followed");
    ASSERT(m == NULL);
    ASSERT_EQ_INT(event_file(real, path, sizeof path), 0); /* nothing written through it */
    /* a CSV file that is a link: refused at its first write, the target untouched */
    snprintf(file_link, sizeof file_link, "%s/x.csv", real);
    ASSERT_EQ_INT(symlink(in_dir(path, sizeof path, "target.txt"), file_link), 0);
    mp.tensorboard_dir = NULL;
    mp.csv_dir = real;
    ASSERT_OK(dt_monitor_open(&mp, &m));
    ASSERT_STATUS(dt_monitor_write(m, "x", 1, 0), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "x.csv");
    ASSERT_OK(dt_monitor_close(m));
    ASSERT(access(path, F_OK) != 0);
    /* a file where the directory should be */
    FILE *f = fopen(in_dir(path, sizeof path, "plain"), "w");
    fclose(f);
    ASSERT_STATUS(dt_dir_make(path), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "not a directory");
    char under[420];
    snprintf(under, sizeof under, "%s/sub", path);
    ASSERT_STATUS(dt_dir_make(under), DT_ERR_IO);
    ASSERT_OK(dt_dir_make(real)); /* one that exists */
}

TEST(config_blocks)
{
    char text[1200], csv_dir[300], tb_dir[300], path[400];
    snprintf(text, sizeof text,
             "{\"tensorboard\": {\"enabled\": true, \"output_path\": \"%s/cfg/\"},"
             " \"csv_monitor\": {\"enabled\": true, \"output_path\": \"%s/cfg\", \"job_name\": \"job1\"},"
             " \"wandb\": {\"enabled\": true}}",
             g_dir, g_dir);
    dt_config *c;
    ASSERT_OK(dt_config_init(&c));
    ASSERT_OK(dt_config_load_string(c, "mon.json", text, strlen(text)));
    dt_monitor *m = NULL;
    ASSERT_OK(dt_monitor_open_config(c, &m));
    ASSERT(m != NULL);
    ASSERT_OK(dt_monitor_write(m, "Train/Samples/lr", 0.5, 1));
    ASSERT_OK(dt_monitor_close(m));
    snprintf(tb_dir, sizeof tb_dir, "%s/cfg/DeepSpeedJobName", g_dir); /* DeepSpeed's default job_name */
    ASSERT_EQ_INT(event_file(tb_dir, path, sizeof path), 1);
    snprintf(csv_dir, sizeof csv_dir, "%s/cfg/job1/Train_Samples_lr.csv", g_dir);
    ASSERT(access(csv_dir, F_OK) == 0);
    dt_config_free(c);
    /* disabled (or absent): no monitor, nothing made */
    static const char off[] = "{\"tensorboard\": {\"enabled\": false, \"output_path\": \"never\"}}";
    ASSERT_OK(dt_config_init(&c));
    ASSERT_OK(dt_config_load_string(c, "off.json", off, strlen(off)));
    ASSERT_OK(dt_monitor_open_config(c, &m));
    ASSERT(m == NULL);
    ASSERT(access("never", F_OK) != 0);
    dt_config_free(c);
    /* a wrong type names the key */
    static const char bad[] = "{\"csv_monitor\": {\"enabled\": \"yes\"}}";
    ASSERT_OK(dt_config_init(&c));
    ASSERT_STATUS(dt_config_load_string(c, "bad.json", bad, strlen(bad)), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "csv_monitor.enabled");
    dt_config_free(c);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dt-test-monitor-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(float_repr_is_pythons);
    RUN(tensorboard_records);
    RUN(csv_files);
    RUN(symlinks_refused);
    RUN(config_blocks);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_REPORT();
}
