/* libFuzzer target for a Hugging Face model directory's config.json
 * (models.h dt_hf_config_read): the architecture, the Llama/Mistral/Qwen2/
 * Qwen3/Gemma/Phi-3 and GPT-2 keys with their defaults, rope_scaling / rope_parameters, the
 * special token ids and the configuration checks. The input is written as
 * config.json into a directory; any input must give either a configuration
 * that dt_llama_config_check accepts (Llama family) or an error whose
 * message names config.json; never a crash or a leak. The same file is
 * read for its generation settings (dt_hf_generation_config: config.json's
 * keys when there is no generation_config.json): settings that
 * dt_model_generate accepts, or an error naming the file. */
// fuzz-sources: src/base/*.c models/hf_config.c models/llama_config.c models/gpt2_config.c models/hf_generation.c
// fuzz-libs: -lcjson
#include "dtrain/generate.h"
#include "dtrain/models.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

static void cleanup(void)
{
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/dt-fuzz-hfcfg-XXXXXX");
        if (!mkdtemp(dir))
            abort();
        atexit(cleanup);
    }
    char p[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    dt_generate_params g = {.max_new_tokens = 64, .temperature = 1, .top_p = 1, .typical_p = 1,
                            .repetition_penalty = 1};
    char ign[256];
    dt_error_clear();
    if (dt_hf_generation_config(dir, &g, ign, sizeof ign) < 0) {
        if (!strstr(dt_last_error(), "config.json"))
            abort();
    } else if (!(g.temperature >= 0 && g.temperature <= 1e6) || g.top_k < 0 || !(g.top_p > 0 && g.top_p <= 1) ||
               !(g.min_p >= 0 && g.min_p <= 1) || !(g.typical_p > 0 && g.typical_p <= 1) ||
               !(g.top_h >= 0 && g.top_h <= 1) || !(g.epsilon_cutoff >= 0 && g.epsilon_cutoff < 1) ||
               !(g.eta_cutoff >= 0 && g.eta_cutoff < 1) ||
               !(g.repetition_penalty > 0 && g.repetition_penalty <= 1e6) || g.max_new_tokens < 0 || g.n_eos < 0 ||
               g.n_eos > DT_GENERATE_MAX_EOS || strlen(ign) >= sizeof ign) {
        abort(); /* what the reader returns, dt_model_generate takes */
    }
    for (int i = 0; i < g.n_eos; i++)
        if (g.eos_ids[i] < 0)
            abort();
    dt_hf_config h;
    dt_error_clear();
    if (dt_hf_config_read(dir, &h) < 0) {
        if (!strstr(dt_last_error(), "config.json"))
            abort(); /* every refusal names the file */
        return 0;
    }
    if (!h.architecture[0])
        abort();
    if (!h.is_gpt2 && dt_llama_config_check(&h.llama) < 0)
        abort(); /* the reader checked it */
    return 0;
}
