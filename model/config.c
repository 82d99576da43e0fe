/* config.c - parses a Hugging Face config.json into hs_model_config_t.
 * Defaults follow transformers' config classes for each family; a missing
 * required field or an unsupported value is an error naming the field. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attention.h"
#include "model_int.h"
#include "rope.h"

static const struct {
    const char *name;
    hs_model_arch_t arch;
} archs[] = {
    {"LlamaForCausalLM", HS_MODEL_LLAMA},
    {"Qwen2ForCausalLM", HS_MODEL_QWEN2},
    {"Qwen3ForCausalLM", HS_MODEL_QWEN3},
    {"MistralForCausalLM", HS_MODEL_MISTRAL},
};

static const cJSON *item(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* Positive integer field; required unless def > 0 is given. */
static hs_status_t get_int(const cJSON *root, const char *path, const char *key, int def, int *out)
{
    const cJSON *v = item(root, key);
    if (!v) {
        if (def > 0) {
            *out = def;
            return HS_OK;
        }
        hs_error("%s: required field '%s' is missing", path, key);
        return HS_ERR_FORMAT;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
        v->valuedouble > 1e9) {
        hs_error("%s: field '%s' must be a positive integer", path, key);
        return HS_ERR_FORMAT;
    }
    *out = (int)v->valuedouble;
    return HS_OK;
}

/* Positive number field; required unless has_def. */
static hs_status_t get_num(const cJSON *obj, const char *path, const char *key, int has_def,
                           double def, float *out)
{
    const cJSON *v = item(obj, key);
    if (!v) {
        if (has_def) {
            *out = (float)def;
            return HS_OK;
        }
        hs_error("%s: required field '%s' is missing", path, key);
        return HS_ERR_FORMAT;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble)) {
        hs_error("%s: field '%s' must be a positive number", path, key);
        return HS_ERR_FORMAT;
    }
    *out = (float)v->valuedouble;
    return HS_OK;
}

static hs_status_t get_bool(const cJSON *root, const char *path, const char *key, int def, int *out)
{
    const cJSON *v = item(root, key);
    if (!v) {
        *out = def;
        return HS_OK;
    }
    if (!cJSON_IsBool(v)) {
        hs_error("%s: field '%s' must be true or false", path, key);
        return HS_ERR_FORMAT;
    }
    *out = cJSON_IsTrue(v);
    return HS_OK;
}

/* rope_scaling (transformers 4.x) or rope_parameters (5.x). */
static hs_status_t parse_rope(const cJSON *root, const char *path, hs_model_config_t *c)
{
    const cJSON *params = item(root, "rope_parameters");
    const cJSON *scaling = item(root, "rope_scaling");
    if (params && !cJSON_IsObject(params)) {
        hs_error("%s: field 'rope_parameters' must be an object", path);
        return HS_ERR_FORMAT;
    }
    if (scaling && !cJSON_IsObject(scaling)) {
        hs_error("%s: field 'rope_scaling' must be an object or null", path);
        return HS_ERR_FORMAT;
    }
    hs_status_t rc;
    if (!item(root, "rope_theta") && params && item(params, "rope_theta"))
        rc = get_num(params, path, "rope_theta", 0, 0, &c->rope_theta);
    else
        rc = get_num(root, path, "rope_theta", 1, 10000.0, &c->rope_theta);
    if (rc != HS_OK) return rc;

    const cJSON *s = scaling ? scaling : params;
    c->rope_type = HS_ROPE_DEFAULT;
    if (!s) return HS_OK;
    const cJSON *type = item(s, "rope_type");
    if (!type) type = item(s, "type");
    const char *tname = cJSON_IsString(type) ? type->valuestring : "default";
    if (strcmp(tname, "default") == 0) return HS_OK;
    if (strcmp(tname, "linear") == 0) {
        c->rope_type = HS_ROPE_LINEAR;
        return get_num(s, path, "factor", 0, 0, &c->rope_factor);
    }
    if (strcmp(tname, "llama3") == 0) {
        c->rope_type = HS_ROPE_LLAMA3;
        if ((rc = get_num(s, path, "factor", 0, 0, &c->rope_factor)) != HS_OK ||
            (rc = get_num(s, path, "low_freq_factor", 0, 0, &c->rope_low_freq_factor)) != HS_OK ||
            (rc = get_num(s, path, "high_freq_factor", 0, 0, &c->rope_high_freq_factor)) != HS_OK ||
            (rc = get_num(s, path, "original_max_position_embeddings", 0, 0,
                          &c->rope_original_max_positions)) != HS_OK)
            return rc;
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor)) {
            hs_error("%s: llama3 rope scaling needs high_freq_factor > low_freq_factor", path);
            return HS_ERR_FORMAT;
        }
        return HS_OK;
    }
    hs_error("%s: rope scaling type '%s' is not supported (default, linear and llama3 are)", path,
             tname);
    return HS_ERR_UNSUPPORTED;
}

hs_status_t hs__model_config_parse(const char *json, size_t len, const char *path,
                                   hs_model_config_t *out)
{
    hs_status_t rc = HS_ERR_FORMAT;
    hs_model_config_t c;
    memset(&c, 0, sizeof c);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root)) {
        hs_error("%s: not a JSON object", path);
        goto out;
    }
    const cJSON *ar = item(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(ar) ? cJSON_GetArrayItem(ar, 0) : NULL;
    if (!cJSON_IsString(a0)) {
        hs_error("%s: required field 'architectures' (a list with the model class name) is "
                 "missing",
                 path);
        goto out;
    }
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(a0->valuestring, archs[i].name) == 0) c.arch = archs[i].arch;
    if (!c.arch) {
        hs_error("%s: architecture '%s' is not supported; the built-in forward runs "
                 "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and MistralForCausalLM",
                 path, a0->valuestring);
        rc = HS_ERR_UNSUPPORTED;
        goto out;
    }
    snprintf(c.architecture, sizeof c.architecture, "%s", a0->valuestring);
    const cJSON *dt = item(root, "torch_dtype");
    if (!dt) dt = item(root, "dtype");
    if (cJSON_IsString(dt)) snprintf(c.torch_dtype, sizeof c.torch_dtype, "%s", dt->valuestring);

    const cJSON *act = item(root, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0)) {
        hs_error("%s: hidden_act must be \"silu\" (SwiGLU MLP)", path);
        rc = HS_ERR_UNSUPPORTED;
        goto out;
    }

    if ((rc = get_int(root, path, "hidden_size", 0, &c.hidden_size)) != HS_OK ||
        (rc = get_int(root, path, "intermediate_size", 0, &c.intermediate_size)) != HS_OK ||
        (rc = get_int(root, path, "num_hidden_layers", 0, &c.num_layers)) != HS_OK ||
        (rc = get_int(root, path, "num_attention_heads", 0, &c.num_heads)) != HS_OK ||
        (rc = get_int(root, path, "vocab_size", 0, &c.vocab_size)) != HS_OK ||
        (rc = get_int(root, path, "num_key_value_heads", c.num_heads, &c.num_kv_heads)) != HS_OK ||
        (rc = get_num(root, path, "rms_norm_eps", 0, 0, &c.rms_norm_eps)) != HS_OK)
        goto out;
    if (item(root, "head_dim")) {
        if ((rc = get_int(root, path, "head_dim", 0, &c.head_dim)) != HS_OK) goto out;
    } else {
        if (c.hidden_size % c.num_heads) {
            hs_error("%s: no 'head_dim' and hidden_size %d is not a multiple of "
                     "num_attention_heads %d",
                     path, c.hidden_size, c.num_heads);
            rc = HS_ERR_FORMAT;
            goto out;
        }
        c.head_dim = c.hidden_size / c.num_heads;
    }
    if (c.num_heads % c.num_kv_heads) {
        hs_error("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path,
                 c.num_heads, c.num_kv_heads);
        rc = HS_ERR_FORMAT;
        goto out;
    }
    if (c.head_dim % 2 || c.head_dim > HS_KN_ATTN_MAX_HEAD_DIM) {
        hs_error("%s: head_dim %d must be even and at most %d", path, c.head_dim,
                 HS_KN_ATTN_MAX_HEAD_DIM);
        rc = HS_ERR_UNSUPPORTED;
        goto out;
    }
    if ((rc = parse_rope(root, path, &c)) != HS_OK) goto out;
    if ((rc = get_bool(root, path, "tie_word_embeddings", 0, &c.tie_word_embeddings)) != HS_OK)
        goto out;

    int attention_bias = 0, use_sw = 0;
    switch (c.arch) {
    case HS_MODEL_LLAMA:
        if ((rc = get_bool(root, path, "attention_bias", 0, &attention_bias)) != HS_OK ||
            (rc = get_bool(root, path, "mlp_bias", 0, &c.mlp_bias)) != HS_OK)
            goto out;
        c.qkv_bias = c.o_bias = attention_bias;
        break;
    case HS_MODEL_QWEN2:
        c.qkv_bias = 1; /* always, o_proj never */
        if ((rc = get_bool(root, path, "use_sliding_window", 0, &use_sw)) != HS_OK) goto out;
        break;
    case HS_MODEL_QWEN3:
        c.qk_norm = 1;
        if ((rc = get_bool(root, path, "attention_bias", 0, &attention_bias)) != HS_OK ||
            (rc = get_bool(root, path, "use_sliding_window", 0, &use_sw)) != HS_OK)
            goto out;
        c.qkv_bias = c.o_bias = attention_bias;
        break;
    case HS_MODEL_MISTRAL:
        use_sw = 1;
        break;
    }
    if (use_sw) {
        if (c.arch != HS_MODEL_MISTRAL) {
            /* Qwen's max_window_layers mixes windowed and full layers */
            hs_error("%s: use_sliding_window is true; sliding-window Qwen models are not "
                     "supported",
                     path);
            rc = HS_ERR_UNSUPPORTED;
            goto out;
        }
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
        if (!sw) {
            c.sliding_window = 4096; /* MistralConfig's default */
        } else if (!cJSON_IsNull(sw) &&
                   (rc = get_int(root, path, "sliding_window", 0, &c.sliding_window)) != HS_OK) {
            goto out;
        }
    }
    rc = HS_OK;
    *out = c;
out:
    cJSON_Delete(root);
    return rc;
}
