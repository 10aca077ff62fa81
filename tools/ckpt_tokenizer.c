/* The tokenizer a checkpoint keeps: a run trained with `dtrain train
 * --tokenizer FILE --save DIR` keeps FILE's tokenizer.json in the
 * checkpoint's saved options ("tokenizer_json"), and the tokenizer_config.json
 * beside it when there is one ("tokenizer_config_json": its bos and eos
 * tokens and chat template), and a chat_template.jinja beside it
 * ("chat_template_jinja"); dtrain generate --ckpt and dtrain eval --ckpt
 * encode text with it (dt__ckpt_tokenizer). */
#include "cmd.h"

#include "dtrain/tokenizer.h"
#include "dtrain/train.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

dt_status dt__ckpt_tokenizer(const char *ckpt, dt_tokenizer **out)
{
    *out = NULL;
    char *js = NULL;
    dt_status st = dt_trainer_ckpt_user(ckpt, &js);
    if (st < 0)
        return st;
    cJSON *u = cJSON_Parse(js);
    dt_trainer_run_state_free(js);
    if (!u)
        return dt_error(DT_ERR_FORMAT, "%s: its saved options are not JSON", ckpt);
    const cJSON *tj = cJSON_GetObjectItemCaseSensitive(u, "tokenizer_json");
    const cJSON *cj = cJSON_GetObjectItemCaseSensitive(u, "tokenizer_config_json");
    if (cJSON_IsString(tj)) {
        char name[1100];
        snprintf(name, sizeof name, "the tokenizer.json kept by --ckpt %s", ckpt);
        st = dt_tokenizer_load_mem(tj->valuestring, strlen(tj->valuestring), name, out);
        snprintf(name, sizeof name, "the tokenizer_config.json kept by --ckpt %s", ckpt);
        if (st >= 0 && cJSON_IsString(cj)) /* its bos and eos tokens and chat template, as the run read them */
            st = dt_tokenizer_apply_config(*out, cj->valuestring, strlen(cj->valuestring), name);
        const cJSON *jj = cJSON_GetObjectItemCaseSensitive(u, "chat_template_jinja");
        snprintf(name, sizeof name, "the chat_template.jinja kept by --ckpt %s", ckpt);
        if (st >= 0 && cJSON_IsString(jj))
            st = dt_tokenizer_set_chat_template(*out, jj->valuestring, strlen(jj->valuestring), name);
        if (st < 0) {
            dt_tokenizer_free(*out);
            *out = NULL;
        }
    }
    cJSON_Delete(u);
    return st < 0 ? st : DT_OK;
}
