/* A PEFT adapter directory written by hand, for the tests that feed
 * dtrain adapters it must refuse or rename (tests/nn/test_lora_peft.c,
 * tests/tools/test_hf_cli.c). Include after test.h (ASSERT). */
#ifndef DT_TEST_PEFT_FILES_H
#define DT_TEST_PEFT_FILES_H

#include "dtrain/base.h"
#include "dtrain/ckpt.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* dir (made if missing) with adapter_model.safetensors of the n (<= 4) f32
 * zero tensors keys[i] of shapes[i] (at most 256 values each) and an
 * adapter_config.json of r 4, lora_alpha 8 and target_modules [targets]
 * (targets: the JSON list's items as they are written) */
static inline void t_write_adapters(const char *dir, const char *targets, const char *const *keys,
                                    const int64_t (*shapes)[2], int n)
{
    char f[600], js[600];
    ASSERT(n >= 1 && n <= 4);
    ASSERT(mkdir(dir, 0755) == 0 || errno == EEXIST);
    snprintf(f, sizeof f, "%s/adapter_config.json", dir);
    snprintf(js, sizeof js, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [%s]}",
             targets);
    ASSERT_OK(dt_file_write_atomic(f, js, strlen(js), 0644));
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", dir);
    dt_st_desc d[4];
    for (int i = 0; i < n; i++) {
        ASSERT(shapes[i][0] * shapes[i][1] <= 256);
        d[i] = (dt_st_desc){.name = keys[i], .dtype = DT_ST_F32, .ndim = 2, .shape = {shapes[i][0], shapes[i][1]}};
    }
    dt_st_writer *w = NULL;
    static const float z[256];
    ASSERT_OK(dt_st_writer_open(f, d, (size_t)n, NULL, 0, &w));
    for (int i = 0; w && i < n; i++)
        ASSERT_OK(dt_st_writer_write(w, (size_t)i, z, (size_t)(shapes[i][0] * shapes[i][1]) * sizeof z[0]));
    ASSERT_OK(dt_st_writer_commit(w, NULL));
    dt_st_writer_close(w);
}

#endif
