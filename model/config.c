/* SPDX-License-Identifier: Apache-2.0 */
/* config.c - parses a Hugging Face config.json into hs_model_config_t.
 * Defaults follow transformers' config classes for each family; a missing
 * required field or an unsupported value is an error naming the field (and
 * the value). A Qwen3.5 vision-language wrapper is read through its
 * text_config: the vision tower's config is not looked at. */
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attention.h"
#include "model_int.h"
#include "rope.h"
#include "hs_log.h"

static const struct {
    const char *name;
    hs_model_arch_t arch;
} archs[] = {
    {"LlamaForCausalLM", HS_MODEL_LLAMA},     {"Qwen2ForCausalLM", HS_MODEL_QWEN2},
    {"Qwen3ForCausalLM", HS_MODEL_QWEN3},     {"MistralForCausalLM", HS_MODEL_MISTRAL},
    {"Qwen3_5ForCausalLM", HS_MODEL_QWEN3_5}, {"Qwen3_5ForConditionalGeneration", HS_MODEL_QWEN3_5},
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
    /* Kept as float: a value outside float's normal range would become 0 or
     * infinity there (an rms_norm_eps of 1e-61 would be 0). */
    double d = cJSON_IsNumber(v) ? v->valuedouble : 0.0;
    if (!(d >= FLT_MIN && d <= FLT_MAX)) {
        hs_error("%s: field '%s' must be a positive number between %g and %g", path, key,
                 (double)FLT_MIN, (double)FLT_MAX);
        return HS_ERR_FORMAT;
    }
    *out = (float)d;
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

/* A string-valued list of num_layers entries, each "linear_attention" or
 * "full_attention", into c->layer_type; or, without layer_types, every
 * full_attention_interval-th layer full (default 4), as Qwen3_5TextConfig. */
static hs_status_t parse_layer_types(const cJSON *r, const char *path, hs_model_config_t *c)
{
    const cJSON *lt = item(r, "layer_types");
    int interval = 0;
    hs_status_t rc = get_int(r, path, "full_attention_interval", 4, &interval);
    if (rc != HS_OK) return rc;
    if (!lt) {
        for (int l = 0; l < c->num_layers; l++)
            c->layer_type[l] =
                (l + 1) % interval ? HS_LAYER_LINEAR_ATTENTION : HS_LAYER_FULL_ATTENTION;
        return HS_OK;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->num_layers) {
        hs_error("%s: field 'layer_types' must be a list of num_hidden_layers = %d entries", path,
                 c->num_layers);
        return HS_ERR_FORMAT;
    }
    int l = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, lt)
    {
        const char *v = cJSON_IsString(e) ? e->valuestring : "(not a string)";
        if (strcmp(v, "linear_attention") == 0) {
            c->layer_type[l] = HS_LAYER_LINEAR_ATTENTION;
        } else if (strcmp(v, "full_attention") == 0) {
            c->layer_type[l] = HS_LAYER_FULL_ATTENTION;
        } else {
            hs_error("%s: layer_types[%d] is '%s'; Qwen3.5 layers are \"linear_attention\" or "
                     "\"full_attention\"",
                     path, l, v);
            return HS_ERR_UNSUPPORTED;
        }
        l++;
    }
    return HS_OK;
}

/* Qwen3.5's rope: default rope type only, partial_rotary_factor (in
 * rope_parameters, else top level, default 0.25) and the mrope fields. For
 * text tokens the three mrope position streams are equal, so mrope_section
 * and mrope_interleaved do not change the math; they are checked for form. */
static hs_status_t parse_qwen3_5_rope(const cJSON *r, const char *path, hs_model_config_t *c)
{
    if (c->rope_type != HS_ROPE_DEFAULT) {
        hs_error("%s: rope_type %s is not supported for Qwen3.5 (only \"default\", with "
                 "partial_rotary_factor and mrope)",
                 path, c->rope_type == HS_ROPE_LINEAR ? "linear" : "llama3");
        return HS_ERR_UNSUPPORTED;
    }
    const cJSON *rp = item(r, "rope_parameters");
    if (!rp) rp = item(r, "rope_scaling");
    const cJSON *prf = rp ? item(rp, "partial_rotary_factor") : NULL;
    if (!prf) prf = item(r, "partial_rotary_factor");
    double f = 0.25;
    if (prf) {
        if (!cJSON_IsNumber(prf) || !(prf->valuedouble > 0 && prf->valuedouble <= 1)) {
            hs_error("%s: partial_rotary_factor must be a number in (0, 1]", path);
            return HS_ERR_FORMAT;
        }
        f = prf->valuedouble;
    }
    int rot = (int)(c->head_dim * f); /* int() as transformers */
    if (rot < 2 || rot % 2) {
        hs_error("%s: partial_rotary_factor %g of head_dim %d gives %d rotary dims; it must be an "
                 "even number >= 2",
                 path, f, c->head_dim, rot);
        return HS_ERR_UNSUPPORTED;
    }
    c->rotary_dim = rot;
    const cJSON *ms = rp ? item(rp, "mrope_section") : NULL;
    if (ms) {
        int sum = 0, n = cJSON_IsArray(ms) ? cJSON_GetArraySize(ms) : -1, ok = n == 3;
        const cJSON *e;
        cJSON_ArrayForEach(e, ms)
        {
            ok = ok && cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble <= 1024 &&
                 e->valuedouble == floor(e->valuedouble);
            if (ok) sum += (int)e->valuedouble;
        }
        if (!ok || sum != rot / 2) {
            char *txt = cJSON_PrintUnformatted(ms);
            hs_error("%s: mrope_section %s must be 3 integers adding up to rotary_dim / 2 = %d "
                     "(head_dim %d x partial_rotary_factor %g / 2)",
                     path, txt ? txt : "?", rot / 2, c->head_dim, f);
            cJSON_free(txt);
            return HS_ERR_UNSUPPORTED;
        }
    }
    const cJSON *mi = rp ? item(rp, "mrope_interleaved") : NULL;
    if (mi && !cJSON_IsBool(mi)) {
        hs_error("%s: mrope_interleaved must be true or false", path);
        return HS_ERR_FORMAT;
    }
    return HS_OK;
}

/* Qwen3_5TextConfig: hybrid layer schedule, Gated DeltaNet shapes, gated
 * attention with q/k norm, zero-centred norms. Defaults as transformers. */
static hs_status_t parse_qwen3_5(const cJSON *r, const char *path, hs_model_config_t *c)
{
    hs_status_t rc;
    const cJSON *mt = item(r, "model_type");
    if (mt && (!cJSON_IsString(mt) || strcmp(mt->valuestring, "qwen3_5_text") != 0)) {
        hs_error("%s: model_type '%s' with a Qwen3.5 architecture; the built-in forward reads "
                 "qwen3_5_text (text_config of a qwen3_5 wrapper)",
                 path, cJSON_IsString(mt) ? mt->valuestring : "(not a string)");
        return HS_ERR_UNSUPPORTED;
    }
    if (c->num_layers > HS_MODEL_MAX_HYBRID_LAYERS) {
        hs_error("%s: num_hidden_layers %d: a hybrid model may have at most %d layers", path,
                 c->num_layers, HS_MODEL_MAX_HYBRID_LAYERS);
        return HS_ERR_UNSUPPORTED;
    }
    int bias = 0, gate = 1;
    if ((rc = get_bool(r, path, "attention_bias", 0, &bias)) != HS_OK ||
        (rc = get_bool(r, path, "attn_output_gate", 1, &gate)) != HS_OK)
        return rc;
    if (bias) {
        hs_error("%s: attention_bias is true; Qwen3.5 models without attention biases only", path);
        return HS_ERR_UNSUPPORTED;
    }
    if (!gate) {
        hs_error("%s: attn_output_gate is false; Qwen3.5's attention is always gated (q_proj "
                 "holds a query and a gate per head)",
                 path);
        return HS_ERR_UNSUPPORTED;
    }
    if ((rc = get_int(r, path, "linear_num_key_heads", 16, &c->lin_num_k_heads)) != HS_OK ||
        (rc = get_int(r, path, "linear_num_value_heads", 32, &c->lin_num_v_heads)) != HS_OK ||
        (rc = get_int(r, path, "linear_key_head_dim", 128, &c->lin_k_head_dim)) != HS_OK ||
        (rc = get_int(r, path, "linear_value_head_dim", 128, &c->lin_v_head_dim)) != HS_OK ||
        (rc = get_int(r, path, "linear_conv_kernel_dim", 4, &c->lin_conv_kernel)) != HS_OK)
        return rc;
    if (c->lin_num_v_heads % c->lin_num_k_heads) {
        hs_error("%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", path,
                 c->lin_num_v_heads, c->lin_num_k_heads);
        return HS_ERR_FORMAT;
    }
    if (c->lin_k_head_dim > 1024 || c->lin_v_head_dim > 1024 || c->lin_num_v_heads > 4096 ||
        c->lin_conv_kernel > 64) {
        hs_error("%s: linear heads of %d (key) / %d (value) dims, %d value heads, conv kernel %d: "
                 "at most 1024 dims, 4096 heads and a kernel of 64 are supported",
                 path, c->lin_k_head_dim, c->lin_v_head_dim, c->lin_num_v_heads,
                 c->lin_conv_kernel);
        return HS_ERR_UNSUPPORTED;
    }
    if ((rc = parse_layer_types(r, path, c)) != HS_OK) return rc;
    if ((rc = parse_qwen3_5_rope(r, path, c)) != HS_OK) return rc;
    c->qk_norm = 1;
    c->zero_centered_norm = 1;
    c->attn_output_gate = 1;
    return HS_OK;
}

/* A string field of quantization_config that, when present, must be `want`. */
static hs_status_t quant_str(const cJSON *q, const char *path, const char *key, const char *want)
{
    const cJSON *v = item(q, key);
    if (!v || (cJSON_IsString(v) && strcmp(v->valuestring, want) == 0)) return HS_OK;
    hs_error("%s: quantization_config.%s is %s%s%s; only \"%s\" is supported (block-scaled FP8 "
             "with dynamic activation scales)",
             path, key, cJSON_IsString(v) ? "'" : "",
             cJSON_IsString(v) ? v->valuestring : "not a string", cJSON_IsString(v) ? "'" : "",
             want);
    return HS_ERR_UNSUPPORTED;
}

/* quantization_config (top level, or the text config's): absent or null is
 * a plain checkpoint; else only Hugging Face's fine-grained FP8 is read:
 * quant_method "fp8", weight_block_size [128, 128], activation_scheme
 * "dynamic" and fmt "e4m3" when given, modules_to_not_convert a list of
 * names or null (which Linear weights are FP8 is then read from each
 * tensor's dtype). */
static hs_status_t parse_quant(const cJSON *root, const cJSON *r, const char *path,
                               hs_model_config_t *c)
{
    const cJSON *q = item(root, "quantization_config");
    if (!q) q = item(r, "quantization_config");
    if (!q) return HS_OK;
    if (!cJSON_IsObject(q)) {
        hs_error("%s: quantization_config must be an object or null", path);
        return HS_ERR_FORMAT;
    }
    const cJSON *m = item(q, "quant_method");
    if (!cJSON_IsString(m) || strcmp(m->valuestring, "fp8") != 0) {
        hs_error("%s: quantization_config.quant_method is %s%s%s; the built-in forward reads "
                 "block-scaled FP8 checkpoints (\"fp8\") only: load the bf16 checkpoint instead "
                 "(--dtype fp8 quantises it at load)",
                 path, cJSON_IsString(m) ? "'" : "", cJSON_IsString(m) ? m->valuestring : "missing",
                 cJSON_IsString(m) ? "'" : "");
        return HS_ERR_UNSUPPORTED;
    }
    const cJSON *bs = item(q, "weight_block_size");
    const cJSON *b0 = cJSON_IsArray(bs) ? cJSON_GetArrayItem(bs, 0) : NULL;
    const cJSON *b1 = cJSON_IsArray(bs) ? cJSON_GetArrayItem(bs, 1) : NULL;
    if (!cJSON_IsArray(bs) || cJSON_GetArraySize(bs) != 2 || !cJSON_IsNumber(b0) ||
        !cJSON_IsNumber(b1) || b0->valuedouble != 128 || b1->valuedouble != 128) {
        hs_error("%s: quantization_config.weight_block_size must be [128, 128] (%s); other block "
                 "sizes and per-tensor FP8 are not supported: load the bf16 checkpoint instead",
                 path, bs ? "it is something else" : "it is missing");
        return HS_ERR_UNSUPPORTED;
    }
    hs_status_t rc;
    if ((rc = quant_str(q, path, "activation_scheme", "dynamic")) != HS_OK ||
        (rc = quant_str(q, path, "fmt", "e4m3")) != HS_OK)
        return rc;
    const cJSON *skip = item(q, "modules_to_not_convert");
    const cJSON *e;
    if (skip && !cJSON_IsArray(skip)) {
        hs_error("%s: quantization_config.modules_to_not_convert must be a list of names or null",
                 path);
        return HS_ERR_FORMAT;
    }
    cJSON_ArrayForEach(e, skip)
    {
        if (!cJSON_IsString(e)) {
            hs_error("%s: quantization_config.modules_to_not_convert holds a non-string entry",
                     path);
            return HS_ERR_FORMAT;
        }
    }
    c->fp8_checkpoint = 1;
    return HS_OK;
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
                 "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, "
                 "Qwen3_5ForCausalLM and Qwen3_5ForConditionalGeneration (its text decoder)",
                 path, a0->valuestring);
        rc = HS_ERR_UNSUPPORTED;
        goto out;
    }
    snprintf(c.architecture, sizeof c.architecture, "%s", a0->valuestring);
    /* r: the decoder's own config (a VL wrapper's text_config) */
    const cJSON *r = root;
    if (strcmp(a0->valuestring, "Qwen3_5ForConditionalGeneration") == 0) {
        c.vl_wrapper = 1;
        r = item(root, "text_config");
        if (!cJSON_IsObject(r)) {
            hs_error("%s: %s needs a 'text_config' object (the decoder's config)", path,
                     a0->valuestring);
            rc = HS_ERR_FORMAT;
            goto out;
        }
    }
    const cJSON *dt = item(r, "torch_dtype");
    if (!dt) dt = item(r, "dtype");
    if (!dt) dt = item(root, "torch_dtype");
    if (!dt) dt = item(root, "dtype");
    if (cJSON_IsString(dt)) snprintf(c.torch_dtype, sizeof c.torch_dtype, "%s", dt->valuestring);

    if ((rc = parse_quant(root, r, path, &c)) != HS_OK) goto out;

    const cJSON *act = item(r, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0)) {
        hs_error("%s: hidden_act must be \"silu\" (SwiGLU MLP)", path);
        rc = HS_ERR_UNSUPPORTED;
        goto out;
    }

    if ((rc = get_int(r, path, "hidden_size", 0, &c.hidden_size)) != HS_OK ||
        (rc = get_int(r, path, "intermediate_size", 0, &c.intermediate_size)) != HS_OK ||
        (rc = get_int(r, path, "num_hidden_layers", 0, &c.num_layers)) != HS_OK ||
        (rc = get_int(r, path, "num_attention_heads", 0, &c.num_heads)) != HS_OK ||
        (rc = get_int(r, path, "vocab_size", 0, &c.vocab_size)) != HS_OK ||
        (rc = get_int(r, path, "num_key_value_heads", c.arch == HS_MODEL_QWEN3_5 ? 4 : c.num_heads,
                      &c.num_kv_heads)) != HS_OK ||
        (rc = get_num(r, path, "rms_norm_eps", 0, 0, &c.rms_norm_eps)) != HS_OK)
        goto out;
    if (item(r, "head_dim") || c.arch == HS_MODEL_QWEN3_5) {
        /* Qwen3_5TextConfig's default head_dim is 256, not H / heads */
        if ((rc = get_int(r, path, "head_dim", 256, &c.head_dim)) != HS_OK) goto out;
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
    c.rotary_dim = c.head_dim;
    if ((rc = parse_rope(r, path, &c)) != HS_OK) goto out;
    if ((rc = get_bool(r, path, "tie_word_embeddings", 0, &c.tie_word_embeddings)) != HS_OK)
        goto out;

    int attention_bias = 0, use_sw = 0;
    switch (c.arch) {
    case HS_MODEL_LLAMA:
        if ((rc = get_bool(r, path, "attention_bias", 0, &attention_bias)) != HS_OK ||
            (rc = get_bool(r, path, "mlp_bias", 0, &c.mlp_bias)) != HS_OK)
            goto out;
        c.qkv_bias = c.o_bias = attention_bias;
        break;
    case HS_MODEL_QWEN2:
        c.qkv_bias = 1; /* always, o_proj never */
        if ((rc = get_bool(r, path, "use_sliding_window", 0, &use_sw)) != HS_OK) goto out;
        break;
    case HS_MODEL_QWEN3:
        c.qk_norm = 1;
        if ((rc = get_bool(r, path, "attention_bias", 0, &attention_bias)) != HS_OK ||
            (rc = get_bool(r, path, "use_sliding_window", 0, &use_sw)) != HS_OK)
            goto out;
        c.qkv_bias = c.o_bias = attention_bias;
        break;
    case HS_MODEL_MISTRAL:
        use_sw = 1;
        break;
    case HS_MODEL_QWEN3_5:
        if ((rc = parse_qwen3_5(r, path, &c)) != HS_OK) goto out;
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
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(r, "sliding_window");
        if (!sw) {
            c.sliding_window = 4096; /* MistralConfig's default */
        } else if (!cJSON_IsNull(sw) &&
                   (rc = get_int(r, path, "sliding_window", 0, &c.sliding_window)) != HS_OK) {
            goto out;
        }
    }
    rc = HS_OK;
    *out = c;
out:
    cJSON_Delete(root);
    return rc;
}
