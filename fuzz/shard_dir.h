/* fuzz/shard_dir.h — the checkpoint-directory fuzz targets' fixture: a
 * temporary directory holding a few small valid safetensors files (one f32
 * tensor each, values 1, 2, 3, ...) beside the file each fuzz input is
 * written to; everything is removed at exit.
 *
 *   static const char *const files[] = {"rank-00000.safetensors"}, *const names[] = {"w"};
 *   static const int64_t numel[] = {6};
 *   if (!sd_dir[0])
 *       sd_setup("/tmp/dt-fuzz-ckpt-XXXXXX", "index.json", 1, files, names, numel);
 *   sd_write_input(data, size);   // then open sd_dir */
#ifndef DT_FUZZ_SHARD_DIR_H
#define DT_FUZZ_SHARD_DIR_H

#include "dtrain/ckpt.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SD_MAX_FILES 4

static char sd_dir[64];
static const char *sd_input;
static const char *const *sd_files;
static int sd_nfiles;

static void sd_path(char *p, size_t cap, const char *file) { snprintf(p, cap, "%s/%s", sd_dir, file); }

static void sd_cleanup(void)
{
    char p[160];
    sd_path(p, sizeof p, sd_input);
    unlink(p);
    for (int i = 0; i < sd_nfiles; i++) {
        sd_path(p, sizeof p, sd_files[i]);
        unlink(p);
    }
    rmdir(sd_dir);
}

/* Makes the directory from the mkdtemp template tmpl with files[i] holding
 * the f32 tensor names[i] of numel[i] (at most 8) elements, i < n. */
static void sd_setup(const char *tmpl, const char *input, int n, const char *const *files, const char *const *names,
                     const int64_t *numel)
{
    snprintf(sd_dir, sizeof sd_dir, "%s", tmpl);
    if (n > SD_MAX_FILES || !mkdtemp(sd_dir))
        abort();
    sd_input = input;
    sd_files = files;
    sd_nfiles = n;
    for (int i = 0; i < n; i++) {
        char p[160];
        sd_path(p, sizeof p, files[i]);
        dt_st_desc d = {.name = names[i], .dtype = DT_ST_F32, .ndim = 1, .shape = {numel[i]}};
        float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        dt_st_writer *w;
        if (numel[i] > 8 || dt_st_writer_open(p, &d, 1, NULL, 0, &w) < 0 ||
            dt_st_writer_write(w, 0, v, (size_t)numel[i] * sizeof *v) < 0 || dt_st_writer_commit(w, NULL) < 0)
            abort();
        dt_st_writer_close(w);
    }
    atexit(sd_cleanup);
}

/* Writes one fuzz input as the directory's input file. */
static void sd_write_input(const uint8_t *data, size_t size)
{
    char p[160];
    sd_path(p, sizeof p, sd_input);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
}

#endif
