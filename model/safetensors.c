/* SPDX-License-Identifier: Apache-2.0 */
/* safetensors.c - safetensors reader (mmap, bounds-checked, single file or
 * sharded via model.safetensors.index.json) and writer. See
 * safetensors_int.h for the format and the ownership rules. */
#include "safetensors_int.h"
#include "hs_log.h"
#include "hs_bytes.h"
#include "hs_outfile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hs_float.h"

/* A header larger than this is not a model file (real ones are < 1 MB). */
#define HS_ST_MAX_HEADER (256u << 20)

typedef struct {
    char *path;
    void *map; /* the file's read-only mapping, or the caller's image */
    size_t size;
    bool mapped; /* close() unmaps it */
} st_file_t;

struct hs__st_set {
    st_file_t *files;
    int n_files;
    hs__st_tensor_t *tensors;
    size_t n_tensors, cap_tensors;
    char **meta_keys, **meta_vals;
    int n_meta;
    void **owned; /* converted tensors */
    size_t n_owned, cap_owned;
};

static const struct {
    const char *name;
    hs__st_dtype_t dtype;
    size_t size;
} st_dtypes[] = {
    {"BF16", HS_ST_BF16, 2},  {"F16", HS_ST_F16, 2},         {"F32", HS_ST_F32, 4},
    {"I32", HS_ST_I32, 4},    {"I64", HS_ST_I64, 8},         {"U8", HS_ST_U8, 1},
    {"F64", HS_ST_OTHER, 8},  {"I8", HS_ST_OTHER, 1},        {"I16", HS_ST_OTHER, 2},
    {"U16", HS_ST_OTHER, 2},  {"U32", HS_ST_OTHER, 4},       {"U64", HS_ST_OTHER, 8},
    {"BOOL", HS_ST_OTHER, 1}, {"F8_E4M3", HS_ST_F8_E4M3, 1}, {"F8_E5M2", HS_ST_OTHER, 1},
};

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static hs_status_t set_alloc(hs__st_set_t **out)
{
    hs__st_set_t *st = calloc(1, sizeof *st);
    if (!st) return HS_ERR_NOMEM;
    *out = st;
    return HS_OK;
}

static hs_status_t push_tensor(hs__st_set_t *st, const hs__st_tensor_t *t)
{
    if (st->n_tensors == st->cap_tensors) {
        size_t cap = st->cap_tensors ? st->cap_tensors * 2 : 64;
        hs__st_tensor_t *n = realloc(st->tensors, cap * sizeof *n);
        if (!n) return HS_ERR_NOMEM;
        st->tensors = n;
        st->cap_tensors = cap;
    }
    st->tensors[st->n_tensors++] = *t;
    return HS_OK;
}

/* Non-negative integral JSON number that fits in int64 (exact in a double). */
static int json_u53(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Parses one entry of a header into *t (name not set). */
static hs_status_t parse_entry(const cJSON *e, const char *name, const char *path, size_t data_size,
                               const uint8_t *data, hs__st_tensor_t *t)
{
    memset(t, 0, sizeof *t);
    if (!cJSON_IsObject(e)) {
        hs_error("%s: tensor '%s': header entry is not an object", path, name);
        return HS_ERR_FORMAT;
    }
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
        cJSON_GetArraySize(off) != 2) {
        hs_error("%s: tensor '%s': needs string 'dtype', array 'shape' and 2-entry 'data_offsets'",
                 path, name);
        return HS_ERR_FORMAT;
    }
    size_t esize = 0;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(dt->valuestring, st_dtypes[i].name) == 0) {
            t->dtype = st_dtypes[i].dtype;
            esize = st_dtypes[i].size;
        }
    }
    if (!esize) {
        hs_error("%s: tensor '%s': unknown dtype '%s'", path, name, dt->valuestring);
        return HS_ERR_FORMAT;
    }
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dt->valuestring);
    int nd = cJSON_GetArraySize(sh);
    if (nd > HS_ST_MAX_DIMS) {
        hs_error("%s: tensor '%s': %d dimensions, at most %d supported", path, name, nd,
                 HS_ST_MAX_DIMS);
        return HS_ERR_FORMAT;
    }
    t->ndim = nd;
    uint64_t count = 1;
    for (int i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_u53(cJSON_GetArrayItem(sh, i), &d) || d > (uint64_t)INT64_MAX) {
            hs_error("%s: tensor '%s': shape entry %d is not a non-negative integer", path, name,
                     i);
            return HS_ERR_FORMAT;
        }
        t->shape[i] = (int64_t)d;
        if (d && count > UINT64_MAX / d) {
            hs_error("%s: tensor '%s': shape overflows", path, name);
            return HS_ERR_FORMAT;
        }
        count *= d;
    }
    uint64_t b, en;
    if (!json_u53(cJSON_GetArrayItem(off, 0), &b) || !json_u53(cJSON_GetArrayItem(off, 1), &en) ||
        b > en) {
        hs_error("%s: tensor '%s': data_offsets must be two integers begin <= end", path, name);
        return HS_ERR_FORMAT;
    }
    if (en > data_size) {
        hs_error("%s: tensor '%s': data_offsets [%llu, %llu] reach past the end of the file's "
                 "%zu data bytes (file truncated or header corrupt)",
                 path, name, (unsigned long long)b, (unsigned long long)en, data_size);
        return HS_ERR_FORMAT;
    }
    if (count > UINT64_MAX / esize || en - b != count * esize) {
        hs_error("%s: tensor '%s': data_offsets span %llu bytes but shape x %s needs %llu", path,
                 name, (unsigned long long)(en - b), dt->valuestring,
                 (unsigned long long)(count * esize));
        return HS_ERR_FORMAT;
    }
    t->data = data + b;
    t->nbytes = (size_t)(en - b);
    return HS_OK;
}

/* Takes ownership of image[size] as the set's next file (unmapped by close()
 * when `mapped`), then parses its header and appends its tensors to st. */
static hs_status_t add_image(hs__st_set_t *st, const char *path, void *image, size_t size,
                             bool mapped)
{
    hs_status_t rc = HS_ERR_FORMAT;
    cJSON *root = NULL;
    st_file_t *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) {
        if (mapped) munmap(image, size);
        return HS_ERR_NOMEM;
    }
    st->files = nf;
    st_file_t *f = &st->files[st->n_files];
    f->path = dup_str(path);
    if (!f->path) {
        if (mapped) munmap(image, size);
        return HS_ERR_NOMEM;
    }
    f->map = image;
    f->size = size;
    f->mapped = mapped;
    st->n_files++; /* owned by the set from here */

    if (size < 8) {
        hs_error("%s: %zu bytes, shorter than the 8-byte header length (truncated file?)", path,
                 size);
        return HS_ERR_FORMAT;
    }
    const uint8_t *p = image;
    uint64_t hlen = hs_le64_load(p);
    if (hlen > size - 8 || hlen > HS_ST_MAX_HEADER) {
        hs_error("%s: header length %llu does not fit in the file's %zu bytes (truncated file?)",
                 path, (unsigned long long)hlen, size);
        goto err;
    }
    root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        hs_error("%s: header is not a JSON object", path);
        goto err;
    }
    const uint8_t *data = p + 8 + hlen;
    size_t data_size = size - 8 - (size_t)hlen;
    const cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (st->n_files > 1 || !cJSON_IsObject(e)) continue; /* first file's only */
            const cJSON *kv;
            cJSON_ArrayForEach(kv, e)
            {
                if (!cJSON_IsString(kv)) continue;
                char **k = realloc(st->meta_keys, (size_t)(st->n_meta + 1) * sizeof *k);
                if (!k) goto err_nomem;
                st->meta_keys = k;
                char **v = realloc(st->meta_vals, (size_t)(st->n_meta + 1) * sizeof *v);
                if (!v) goto err_nomem;
                st->meta_vals = v;
                k[st->n_meta] = dup_str(kv->string);
                v[st->n_meta] = dup_str(kv->valuestring);
                st->n_meta++;
                if (!k[st->n_meta - 1] || !v[st->n_meta - 1]) goto err_nomem;
            }
            continue;
        }
        if (hs__st_find(st, e->string)) {
            hs_error("%s: tensor '%s' appears twice in the set", path, e->string);
            goto err;
        }
        hs__st_tensor_t t;
        rc = parse_entry(e, e->string, path, data_size, data, &t);
        if (rc != HS_OK) goto err;
        t.name = dup_str(e->string);
        t.file = f->path;
        if (!t.name) goto err_nomem;
        if (push_tensor(st, &t) != HS_OK) {
            free((char *)t.name);
            goto err_nomem;
        }
    }
    cJSON_Delete(root);
    return HS_OK;

err_nomem:
    rc = HS_ERR_NOMEM;
err:
    if (rc == HS_OK) rc = HS_ERR_FORMAT;
    cJSON_Delete(root);
    return rc;
}

/* Maps `path` and appends its tensors to st. */
static hs_status_t add_file(hs__st_set_t *st, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        hs_error("cannot open safetensors file %s: %m", path);
        return HS_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        hs_error("cannot stat %s: %m", path);
        close(fd);
        return HS_ERR_IO;
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) { /* nothing to map; add_image says what is wrong */
        close(fd);
        return add_image(st, path, NULL, size, false);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        hs_error("cannot map %s: %m", path);
        return HS_ERR_IO;
    }
    return add_image(st, path, map, size, true);
}

hs_status_t hs__st_open_file(const char *path, hs__st_set_t **out)
{
    hs__st_set_t *st;
    hs_status_t rc = set_alloc(&st);
    if (rc != HS_OK) return rc;
    rc = add_file(st, path);
    if (rc != HS_OK) {
        hs__st_close(st);
        return rc;
    }
    *out = st;
    return HS_OK;
}

hs_status_t hs__st_open_memory(const void *image, size_t size, const char *name, hs__st_set_t **out)
{
    hs__st_set_t *st;
    hs_status_t rc = set_alloc(&st);
    if (rc != HS_OK) return rc;
    rc = add_image(st, name, (void *)image, size, false);
    if (rc != HS_OK) {
        hs__st_close(st);
        return rc;
    }
    *out = st;
    return HS_OK;
}

static char *read_text(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 4096) {
            cap = cap ? cap * 2 : 65536;
            if (cap > HS_ST_MAX_HEADER) break;
            char *b = realloc(buf, cap + 1);
            if (!b) break;
            buf = b;
        }
        size_t r = fread(buf + n, 1, cap - n, fp);
        n += r;
        if (r == 0) {
            if (ferror(fp)) break;
            fclose(fp);
            buf[n] = 0;
            *len = n;
            return buf;
        }
    }
    fclose(fp);
    free(buf);
    return NULL;
}

hs_status_t hs__st_open_dir(const char *dir, hs__st_set_t **out)
{
    char path[PATH_MAX];
    hs_status_t rc;
    hs__st_set_t *st = NULL;
    cJSON *idx = NULL;
    char *text = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) != 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) != 0) {
            hs_error("%s has neither model.safetensors nor model.safetensors.index.json: point "
                     "--model at a Hugging Face model folder",
                     dir);
            return HS_ERR_NOT_FOUND;
        }
        return hs__st_open_file(path, out);
    }
    size_t len;
    text = read_text(path, &len);
    if (!text) {
        hs_error("cannot read %s: %m", path);
        return HS_ERR_IO;
    }
    idx = cJSON_ParseWithLength(text, len);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    if (!cJSON_IsObject(wm)) {
        hs_error("%s: no 'weight_map' object", path);
        rc = HS_ERR_FORMAT;
        goto err;
    }
    rc = set_alloc(&st);
    if (rc != HS_OK) goto err;
    /* open every shard named in the map, once */
    const cJSON *e;
    cJSON_ArrayForEach(e, wm)
    {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || e->valuestring[0] == '.') {
            hs_error("%s: weight_map['%s'] must be a file name in the same folder", path,
                     e->string);
            rc = HS_ERR_FORMAT;
            goto err;
        }
        char shard[PATH_MAX];
        snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
        int seen = 0;
        for (int i = 0; i < st->n_files && !seen; i++)
            seen = strcmp(st->files[i].path, shard) == 0;
        if (!seen) {
            rc = add_file(st, shard);
            if (rc != HS_OK) goto err;
        }
    }
    /* every mapped tensor must be in the shard the map names */
    cJSON_ArrayForEach(e, wm)
    {
        const hs__st_tensor_t *t = hs__st_find(st, e->string);
        char shard[PATH_MAX];
        snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
        if (!t || strcmp(t->file, shard) != 0) {
            hs_error("tensor '%s': the index maps it to %s but that shard does not hold it",
                     e->string, shard);
            rc = HS_ERR_FORMAT;
            goto err;
        }
    }
    cJSON_Delete(idx);
    free(text);
    *out = st;
    return HS_OK;
err:
    hs__st_close(st);
    cJSON_Delete(idx);
    free(text);
    return rc;
}

void hs__st_close(hs__st_set_t *st)
{
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        if (st->files[i].mapped) munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    for (size_t i = 0; i < st->n_tensors; i++)
        free((char *)st->tensors[i].name);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_vals[i]);
    }
    for (size_t i = 0; i < st->n_owned; i++)
        free(st->owned[i]);
    free(st->owned);
    free(st->meta_keys);
    free(st->meta_vals);
    free(st->files);
    free(st->tensors);
    free(st);
}

size_t hs__st_count(const hs__st_set_t *st) { return st->n_tensors; }

const hs__st_tensor_t *hs__st_at(const hs__st_set_t *st, size_t i)
{
    return i < st->n_tensors ? &st->tensors[i] : NULL;
}

const hs__st_tensor_t *hs__st_find(const hs__st_set_t *st, const char *name)
{
    for (size_t i = 0; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

const char *hs__st_metadata(const hs__st_set_t *st, const char *key)
{
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_vals[i];
    return NULL;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400u));
            u = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else {
        u = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void shape_str(const int64_t *shape, int ndim, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The tensor `name` if it exists with exactly this shape (else logged). */
static hs_status_t find_shaped(const hs__st_set_t *st, const char *name, int ndim,
                               const int64_t *shape, const hs__st_tensor_t **out)
{
    const hs__st_tensor_t *t = hs__st_find(st, name);
    if (!t) {
        hs_error("tensor '%s' is missing from the model's safetensors files", name);
        return HS_ERR_NOT_FOUND;
    }
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char want[128], got[128];
        shape_str(shape, ndim, want, sizeof want);
        shape_str(t->shape, t->ndim, got, sizeof got);
        hs_error("tensor '%s' has shape %s, config.json implies %s", name, got, want);
        return HS_ERR_FORMAT;
    }
    *out = t;
    return HS_OK;
}

/* Room for one more owned buffer. */
static hs_status_t owned_reserve(hs__st_set_t *st)
{
    if (st->n_owned < st->cap_owned) return HS_OK;
    size_t cap = st->cap_owned ? st->cap_owned * 2 : 64;
    void **o = realloc(st->owned, cap * sizeof *o);
    if (!o) return HS_ERR_NOMEM;
    st->owned = o;
    st->cap_owned = cap;
    return HS_OK;
}

/* ---- non-finite weights ------------------------------------------------- *
 * A weight that is NaN or infinite (a diverged run's save, a damaged copy)
 * poisons every hidden state computed after it, silently: each tensor is
 * checked once where it is read, in blocks OR-reduced first so the common
 * case is one vectorised pass over the weights the forward reads anyway. */

#define NONFINITE_BLOCK 4096

/* Index of the first NaN or infinite entry of bf16 w[n], or n. */
static size_t bf16_first_nonfinite(const uint16_t *w, size_t n)
{
    for (size_t b = 0; b < n; b += NONFINITE_BLOCK) {
        size_t e = n - b < NONFINITE_BLOCK ? n : b + NONFINITE_BLOCK;
        unsigned bad = 0;
        for (size_t i = b; i < e; i++)
            bad |= (w[i] & 0x7f80u) == 0x7f80u;
        if (!bad) continue;
        for (size_t i = b; i < e; i++)
            if ((w[i] & 0x7f80u) == 0x7f80u) return i;
    }
    return n;
}

/* Index of the first NaN or infinite entry of f[n], or n. */
static size_t f32_first_nonfinite(const float *f, size_t n)
{
    for (size_t b = 0; b < n; b += NONFINITE_BLOCK) {
        size_t e = n - b < NONFINITE_BLOCK ? n : b + NONFINITE_BLOCK;
        unsigned bad = 0;
        for (size_t i = b; i < e; i++) {
            uint32_t u;
            memcpy(&u, &f[i], sizeof u);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        if (!bad) continue;
        for (size_t i = b; i < e; i++)
            if (!isfinite(f[i])) return i;
    }
    return n;
}

/* Logs that entry i of tensor t (of n) is `v` as the file holds it, which
 * is not finite, or finite but too large for the bf16 it became. */
static hs_status_t nonfinite_error(const hs__st_tensor_t *t, size_t i, size_t n, float v)
{
    char what[64];
    if (isnan(v))
        snprintf(what, sizeof what, "NaN");
    else if (isinf(v))
        snprintf(what, sizeof what, "%sInf", v < 0 ? "-" : "+");
    else
        snprintf(what, sizeof what, "%g, beyond bf16's range,", (double)v);
    hs_error("tensor '%s' (%s) holds %s at element %zu of %zu: the checkpoint is damaged or "
             "from a diverged run; load another checkpoint or re-export this one",
             t->name, t->dtype_name, what, i, n);
    return HS_ERR_FORMAT;
}

/* Entry i of tensor t as the file holds it (BF16, F16 or F32). */
static float source_value(const hs__st_tensor_t *t, size_t i)
{
    const uint8_t *src = t->data;
    if (t->dtype == HS_ST_F32) {
        float f;
        memcpy(&f, src + 4 * i, 4);
        return f;
    }
    uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
    return t->dtype == HS_ST_BF16 ? hs_bf16_to_f32(h) : f16_to_f32(h);
}

hs_status_t hs__st_get_f32(hs__st_set_t *st, const char *name, int ndim, const int64_t *shape,
                           const float **out)
{
    const hs__st_tensor_t *t;
    hs_status_t rc = find_shaped(st, name, ndim, shape, &t);
    if (rc != HS_OK) return rc;
    size_t esize = t->dtype == HS_ST_F32 ? 4 : 2;
    if (t->dtype != HS_ST_BF16 && t->dtype != HS_ST_F16 && t->dtype != HS_ST_F32) {
        hs_error("tensor '%s' has dtype %s; only BF16, F16 and F32 weights are supported", name,
                 t->dtype_name);
        return HS_ERR_UNSUPPORTED;
    }
    size_t count = t->nbytes / esize;
    if ((rc = owned_reserve(st)) != HS_OK) return rc;
    float *buf = malloc(count ? count * sizeof *buf : 1);
    if (!buf) return HS_ERR_NOMEM;
    const uint8_t *src = t->data;
    for (size_t i = 0; i < count; i++) {
        uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
        if (t->dtype == HS_ST_BF16)
            buf[i] = hs_bf16_to_f32(h);
        else if (t->dtype == HS_ST_F16)
            buf[i] = f16_to_f32(h);
        else
            memcpy(&buf[i], src + 4 * i, 4);
    }
    size_t bad = f32_first_nonfinite(buf, count);
    if (bad < count) {
        free(buf);
        return nonfinite_error(t, bad, count, source_value(t, bad));
    }
    st->owned[st->n_owned++] = buf;
    *out = buf;
    return HS_OK;
}

hs_status_t hs__st_get_bf16(hs__st_set_t *st, const char *name, int ndim, const int64_t *shape,
                            const uint16_t **out)
{
    const hs__st_tensor_t *t;
    hs_status_t rc = find_shaped(st, name, ndim, shape, &t);
    if (rc != HS_OK) return rc;
    size_t count = t->nbytes;
    if (t->dtype == HS_ST_BF16) {
        count /= 2;
        if (((uintptr_t)t->data & 1u) == 0) {
            size_t bad = bf16_first_nonfinite(t->data, count);
            if (bad < count) return nonfinite_error(t, bad, count, source_value(t, bad));
            *out = t->data;
            return HS_OK;
        }
    } else if (t->dtype == HS_ST_F16) {
        count /= 2;
    } else if (t->dtype == HS_ST_F32) {
        count /= 4;
    } else {
        hs_error("tensor '%s' has dtype %s; only BF16, F16 and F32 weights are supported", name,
                 t->dtype_name);
        return HS_ERR_UNSUPPORTED;
    }
    if ((rc = owned_reserve(st)) != HS_OK) return rc;
    uint16_t *buf = malloc(count ? count * 2 : 1);
    if (!buf) return HS_ERR_NOMEM;
    const uint8_t *src = t->data;
    for (size_t i = 0; i < count; i++) {
        if (t->dtype == HS_ST_BF16) {
            buf[i] = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
        } else if (t->dtype == HS_ST_F16) {
            buf[i] = hs_f32_to_bf16(f16_to_f32((uint16_t)(src[2 * i] | src[2 * i + 1] << 8)));
        } else {
            float f;
            memcpy(&f, src + 4 * i, 4);
            buf[i] = hs_f32_to_bf16(f);
        }
    }
    size_t bad = bf16_first_nonfinite(buf, count);
    if (bad < count) {
        free(buf);
        return nonfinite_error(t, bad, count, source_value(t, bad));
    }
    st->owned[st->n_owned++] = buf;
    *out = buf;
    return HS_OK;
}

hs_status_t hs__st_get_fp8(hs__st_set_t *st, const char *name, int ndim, const int64_t *shape,
                           const uint8_t **out)
{
    const hs__st_tensor_t *t;
    hs_status_t rc = find_shaped(st, name, ndim, shape, &t);
    if (rc != HS_OK) return rc;
    if (t->dtype != HS_ST_F8_E4M3) {
        hs_error("tensor '%s' has dtype %s where F8_E4M3 was expected", name, t->dtype_name);
        return HS_ERR_FORMAT;
    }
    const uint8_t *q = t->data;
    for (size_t i = 0; i < t->nbytes; i++) {
        if ((q[i] & 0x7fu) == 0x7fu) {
            hs_error("tensor '%s' (F8_E4M3) holds NaN at element %zu of %zu: the checkpoint is "
                     "damaged; load another checkpoint or re-export this one",
                     name, i, t->nbytes);
            return HS_ERR_FORMAT;
        }
    }
    *out = q;
    return HS_OK;
}

/* ---- writer ------------------------------------------------------------ */

hs_status_t hs__st_write(const char *path, const hs__st_write_tensor_t *tensors, int n,
                         const char *const *meta_keys, const char *const *meta_vals, int n_meta)
{
    hs_status_t rc = HS_ERR_NOMEM;
    char *hdr = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root) return HS_ERR_NOMEM;
    if (n_meta > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        if (!meta) goto err;
        for (int i = 0; i < n_meta; i++)
            if (!cJSON_AddStringToObject(meta, meta_keys[i], meta_vals[i])) goto err;
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const hs__st_write_tensor_t *t = &tensors[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        if (!e || !cJSON_AddStringToObject(e, "dtype", t->dtype)) goto err;
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        if (!sh) goto err;
        for (int d = 0; d < t->ndim; d++)
            if (!cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]))) goto err;
        uint64_t nb = (uint64_t)t->rows * t->row_bytes;
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        if (!offs || !cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off)) ||
            !cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + nb))))
            goto err;
        off += nb;
    }
    hdr = cJSON_PrintUnformatted(root);
    if (!hdr) goto err;
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) / 8 * 8; /* data starts 8-byte aligned */
    hs_outfile_t *of;
    rc = hs_outfile_open(path, NULL, 0, &of);
    if (rc != HS_OK) goto err;
    FILE *fp = hs_outfile_stream(of);
    uint8_t len8[8];
    hs_le64_store(len8, padded);
    int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(hdr, 1, hlen, fp) == hlen;
    for (size_t i = hlen; ok && i < padded; i++)
        ok = fputc(' ', fp) != EOF;
    for (int i = 0; ok && i < n; i++) {
        const hs__st_write_tensor_t *t = &tensors[i];
        size_t stride = t->src_stride ? t->src_stride : t->row_bytes;
        if (stride == t->row_bytes) {
            size_t nb = t->rows * t->row_bytes;
            ok = fwrite(t->data, 1, nb, fp) == nb;
        } else {
            for (size_t r = 0; ok && r < t->rows; r++)
                ok = fwrite((const uint8_t *)t->data + r * stride, 1, t->row_bytes, fp) ==
                     t->row_bytes;
        }
    }
    if (!ok) {
        hs_error("cannot write %s: %m; check free disk space", path);
        hs_outfile_abort(of);
        rc = HS_ERR_IO;
        goto err;
    }
    rc = hs_outfile_commit(of);
err:
    free(hdr);
    cJSON_Delete(root);
    return rc;
}
