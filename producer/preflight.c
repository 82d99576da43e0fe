/* SPDX-License-Identifier: Apache-2.0 */
/* preflight.c - hs-producer --preflight and --token-budget auto: runs every
 * batch shape a token budget can produce once per GPU through the built-in
 * CUDA forward, prints peak memory, us/token, tokens/s and MFU per shape,
 * and refuses a budget whose planned peak leaves less than the headroom
 * free. With no budget given it finds the largest that fits from the
 * forward's memory plan (no GPU run per candidate), then runs the table.
 *
 * Planned peak of one GPU worker at budget B: the forward's plan
 * (hs_model_cuda_plan_bytes: weights of the layers run, activations for B
 * tokens, cuBLASLt workspace) plus the worker's two device batch buffers
 * (ids, cu_seqlens and the [B, k*H] bf16 output, one per slot, and with
 * --hs-dtype fp8 the e4m3 rows and scales too: hs__preflight_worker_bytes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hs_model.h"
#include "hs_producer.h"
#include "preflight_int.h"
#include "hs_log.h"
#include "hs_parse.h"

hs_status_t hs_producer_preflight(const hs_producer_config_t *cfg, uint32_t *budget_out);

#define GIB 1073741824.0

/* ---- pure parts (tested without a GPU) -------------------------------------- */

uint32_t hs__preflight_max_seq(uint32_t budget, uint32_t max_seq_len)
{
    uint32_t m = max_seq_len ? max_seq_len : HS__PREFLIGHT_DEFAULT_MAX_SEQ;
    return m < budget ? m : budget;
}

static int shape_add(hs__preflight_shape_t *out, int n, int cap, uint32_t n_seqs, uint32_t len)
{
    if (n_seqs == 0 || len == 0 || n >= cap) return n;
    for (int i = 0; i < n; i++)
        if (out[i].n_seqs == n_seqs && out[i].seq_len == len) return n;
    out[n].n_seqs = n_seqs;
    out[n].seq_len = len;
    return n + 1;
}

int hs__preflight_shapes(uint32_t budget, uint32_t max_seq_len, hs__preflight_shape_t *out, int cap)
{
    if (!budget || !out || cap <= 0) return 0;
    const uint32_t m = hs__preflight_max_seq(budget, max_seq_len);
    int n = shape_add(out, 0, cap, 1, m);
    for (uint32_t div = 1; div <= 8; div *= 2) {
        uint32_t len = m / div;
        if (div > 1 && len < HS__PREFLIGHT_MIN_SEQ) break;
        n = shape_add(out, n, cap, budget / len, len);
    }
    return n;
}

hs_status_t hs__preflight_search(hs__preflight_peak_cb peak, void *ctx, uint64_t limit_bytes,
                                 uint32_t min_budget, uint32_t *out)
{
    if (!peak || !out) return HS_ERR_INVALID;
    const uint32_t step = HS__PREFLIGHT_STEP;
    uint32_t lo = min_budget ? (min_budget + step - 1) / step : 1; /* in steps */
    uint32_t hi = HS__PREFLIGHT_MAX_BUDGET / step;
    if (lo > hi) return HS_ERR_NOSPACE;
    uint64_t p;
    hs_status_t st = peak(ctx, lo * step, &p);
    if (st) return st;
    if (p > limit_bytes) return HS_ERR_NOSPACE;
    /* invariant: lo fits; find the largest fitting in [lo, hi] */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if ((st = peak(ctx, mid * step, &p))) return st;
        if (p <= limit_bytes)
            lo = mid;
        else
            hi = mid - 1;
    }
    *out = lo * step;
    return HS_OK;
}

hs_status_t hs__preflight_headroom_parse(const char *s, double *out)
{
    char buf[64];
    if (!s || !*s || strlen(s) >= sizeof(buf)) return HS_ERR_INVALID;
    snprintf(buf, sizeof(buf), "%s", s);
    size_t len = strlen(buf);
    double scale = 1.0, v;
    if (buf[len - 1] == '%') {
        buf[len - 1] = 0;
        scale = 0.01;
    }
    if (hs_parse_double(buf, &v) != HS_OK || !(v * scale >= 0) || v * scale >= 1)
        return HS_ERR_INVALID;
    *out = v * scale;
    return HS_OK;
}

/* ---- the GPU run -------------------------------------------------------------- */

uint64_t hs__preflight_worker_bytes(uint32_t budget, uint32_t n_layers, uint32_t H, bool fp8)
{
    uint64_t slot = hs_model_cuda_batch_bytes(budget, budget, n_layers, H);
    if (fp8) slot += (uint64_t)budget * n_layers * H + (uint64_t)budget * 4u + sizeof(int);
    return 2 * slot;
}

typedef struct {
    const hs_model_t *m;
    int max_layer, n_layers, H;
    bool fp8_states;
} peak_ctx_t;

/* Planned peak of one GPU worker at `budget` (see the file comment). */
static hs_status_t worker_peak(void *ctx, uint32_t budget, uint64_t *out)
{
    const peak_ctx_t *c = ctx;
    uint64_t plan;
    hs_status_t st = hs_model_cuda_plan_bytes(c->m, budget, budget, c->max_layer, &plan);
    if (st) return st;
    *out = plan +
           hs__preflight_worker_bytes(budget, (uint32_t)c->n_layers, (uint32_t)c->H, c->fp8_states);
    return HS_OK;
}

/* The worst miss of one GPU: which shape, by how many bytes. */
typedef struct {
    int gpu;
    hs__preflight_shape_t shape;
    uint64_t need, limit, total;
} miss_t;

static void miss_note(miss_t *mi, int gpu, hs__preflight_shape_t shape, uint64_t need,
                      uint64_t limit, uint64_t total)
{
    if (need <= limit) return;
    if (mi->gpu >= 0 && need - limit <= mi->need - mi->limit) return;
    mi->gpu = gpu;
    mi->shape = shape;
    mi->need = need;
    mi->limit = limit;
    mi->total = total;
}

static void print_header(void)
{
    printf("%-4s %-22s %-11s %9s %9s %10s %9s %11s %7s %9s %7s  %s\n", "gpu", "device", "shape",
           "peak GiB", "used GiB", "ms/batch", "us/token", "tokens/s", "MFU %", "W/limit", "capped",
           "fits");
}

hs_status_t hs_producer_preflight(const hs_producer_config_t *cfg, uint32_t *budget_out)
{
    if (!cfg || !budget_out) return HS_ERR_INVALID;
    if (!(cfg->preflight_headroom >= 0 && cfg->preflight_headroom < 1) ||
        cfg->preflight_iters > 100 || !(cfg->preflight_peak_tflops >= 0)) {
        hs_error("preflight: headroom %g, %u timed runs, peak %g TFLOP/s: expected a headroom in "
                 "[0, 1), at most 100 runs and a peak >= 0 (0 = the defaults)",
                 cfg->preflight_headroom, cfg->preflight_iters, cfg->preflight_peak_tflops);
        return HS_ERR_INVALID;
    }
    int n_dev = 0;
    hs_status_t st = hs_model_cuda_device_count(&n_dev);
    if (st == HS_ERR_UNSUPPORTED) {
        hs_error("preflight: this build of hsflow has no CUDA support; rebuild with -DHS_CUDA=ON "
                 "on a machine with GPUs");
        return HS_ERR_UNSUPPORTED;
    }
    if (st) return st;
    if (n_dev == 0) {
        hs_error("preflight: no GPU is visible (check the driver and CUDA_VISIBLE_DEVICES); the "
                 "preflight measures the CUDA forward and needs one");
        return HS_ERR_UNSUPPORTED;
    }
    int gpus[HS_PRODUCER_MAX_WORKERS], n_gpus = 0;
    for (uint32_t i = 0; i < cfg->n_workers && i < HS_PRODUCER_MAX_WORKERS; i++) {
        if (cfg->gpu_ids[i] < 0) continue;
        if (cfg->gpu_ids[i] >= n_dev) {
            hs_error("preflight: --gpus names GPU %d but only %d GPU(s) are visible (0..%d)",
                     cfg->gpu_ids[i], n_dev, n_dev - 1);
            return HS_ERR_INVALID;
        }
        gpus[n_gpus++] = cfg->gpu_ids[i];
    }
    if (n_gpus == 0) {
        hs_error("preflight: no GPU worker configured; give --gpus 0,1,... (CPU workers have "
                 "nothing to measure)");
        return HS_ERR_UNSUPPORTED;
    }
    if (!cfg->model_dir) {
        hs_error("preflight: no model; give --model DIR (a Hugging Face folder)");
        return HS_ERR_INVALID;
    }

    hs_model_t *m = NULL;
    hs_model_cuda_t *mc = NULL;
    if ((st = hs_model_load_ex(cfg->model_dir, (hs_model_weights_t)cfg->weights, &m))) return st;
    hs_model_set_attn(m, cfg->attn);
    const int H = hs_model_hidden_size(m), N = hs_model_num_layers(m);
    int32_t layers[HS_MAX_LAYERS];
    int n_layers;
    if (cfg->dflash_layers > 0) {
        n_layers = cfg->dflash_layers;
        if ((st = hs_model_dflash_layers(N, n_layers, layers, HS_MAX_LAYERS))) goto out;
    } else if (cfg->eagle3_layers) {
        n_layers = HS_MODEL_EAGLE3_N_LAYERS;
        if ((st = hs_model_eagle3_layers(N, layers, HS_MAX_LAYERS))) goto out;
    } else {
        n_layers = (int)cfg->layout.n_layers;
        if (n_layers < 1 || n_layers > HS_MAX_LAYERS) {
            hs_error("preflight: no captured layers; give --layers L1,L2,... or --dflash-layers N");
            st = HS_ERR_INVALID;
            goto out;
        }
        memcpy(layers, cfg->layout.layers, (size_t)n_layers * sizeof(int32_t));
    }
    if ((st = hs_model_check_layers(N, layers, n_layers))) goto out;
    if (cfg->layout.hidden_size && cfg->layout.hidden_size != (uint32_t)H) {
        hs_error("preflight: --hidden-size %u but the model in %s has hidden size %d; drop "
                 "--hidden-size or give %d",
                 cfg->layout.hidden_size, cfg->model_dir, H, H);
        st = HS_ERR_INVALID;
        goto out;
    }
    int top = 0;
    for (int j = 0; j < n_layers; j++)
        if (layers[j] > top) top = layers[j];
    const int n_run = top < N ? top : N;

    const double headroom = cfg->preflight_headroom;
    const double peak_tflops =
        cfg->preflight_peak_tflops > 0 ? cfg->preflight_peak_tflops : HS_MODEL_CUDA_PEAK_TFLOPS;
    const int iters = cfg->preflight_iters ? (int)cfg->preflight_iters : 3;
    char names[HS_PRODUCER_MAX_WORKERS][64];
    uint64_t totals[HS_PRODUCER_MAX_WORKERS], limits[HS_PRODUCER_MAX_WORKERS];
    uint64_t min_limit = UINT64_MAX;
    for (int g = 0; g < n_gpus; g++) {
        uint64_t free_b;
        if ((st = hs_model_cuda_device_info(gpus[g], names[g], sizeof(names[g]), &totals[g],
                                            &free_b)))
            goto out;
        limits[g] = (uint64_t)((double)totals[g] * (1.0 - headroom));
        if (limits[g] < min_limit) min_limit = limits[g];
    }
    peak_ctx_t pc = {m, top, n_layers, H, cfg->layout.dtype == HS_DTYPE_FP8};

    uint32_t budget = cfg->token_budget;
    if (budget == 0) {
        /* auto: every worker must fit, so search against the smallest GPU */
        st = hs__preflight_search(worker_peak, &pc, min_limit, cfg->max_seq_len, &budget);
        if (st == HS_ERR_NOSPACE) {
            uint32_t smallest = cfg->max_seq_len > HS__PREFLIGHT_STEP
                                    ? (cfg->max_seq_len + HS__PREFLIGHT_STEP - 1) /
                                          HS__PREFLIGHT_STEP * HS__PREFLIGHT_STEP
                                    : HS__PREFLIGHT_STEP;
            uint64_t need = 0;
            worker_peak(&pc, smallest, &need);
            hs_error("--token-budget auto: even %u tokens need %.2f GiB per GPU, more than the "
                     "%.2f GiB allowed (%.0f%% headroom); capture fewer or lower layers, lower "
                     "--max-seq-len, or use GPUs with more memory",
                     smallest, need / GIB, min_limit / GIB, headroom * 100);
            goto out;
        }
        if (st) goto out;
        uint64_t need = 0;
        worker_peak(&pc, budget, &need);
        hs_info(
            "--token-budget auto: %u tokens (planned peak %.2f GiB of %.2f GiB allowed per GPU)",
            budget, need / GIB, min_limit / GIB);
    }

    hs__preflight_shape_t shapes[HS__PREFLIGHT_MAX_SHAPES];
    const int n_shapes =
        hs__preflight_shapes(budget, cfg->max_seq_len, shapes, HS__PREFLIGHT_MAX_SHAPES);
    uint64_t planned = 0;
    if ((st = worker_peak(&pc, budget, &planned))) goto out;
    const hs_model_config_t *mcfg = hs_model_config(m);
    printf("preflight: %s (%s, %d layers, hidden %d); capturing %d layer(s) up to %d, %d "
           "decoder layers run\n",
           cfg->model_dir, mcfg->architecture, N, H, n_layers, top, n_run);
    printf("budget %u tokens, max sequence length %u%s; planned peak per GPU %.2f GiB; headroom "
           "%.0f%%; MFU against %.1f TFLOP/s; median of %d timed run(s)\n",
           budget, hs__preflight_max_seq(budget, cfg->max_seq_len),
           cfg->token_budget ? "" : " (auto)", planned / GIB, headroom * 100, peak_tflops, iters);
    print_header();
    fflush(stdout);

    miss_t miss = {.gpu = -1};
    for (int g = 0; g < n_gpus; g++) {
        const int dev = gpus[g];
        /* Loading the replica and timing every shape takes a while: say where it is. */
        hs_info("preflight: gpu %d (%d of %d): loading the forward, then %d shape(s)", dev, g + 1,
                n_gpus, n_shapes);
        st = hs_model_cuda_create_ex(m, dev, budget, budget, top, &mc);
        if (st != HS_OK && st != HS_ERR_NOSPACE) goto out;
        for (int i = 0; i < n_shapes; i++) {
            char shape[32];
            snprintf(shape, sizeof(shape), "%ux%u", shapes[i].n_seqs, shapes[i].seq_len);
            if (!mc) {
                /* the plan does not even fit the free memory: nothing to run */
                printf("%-4d %-22.22s %-11s %9.2f %9s %10s %9s %11s %7s %9s %7s  %s\n", dev,
                       names[g], shape, planned / GIB, "-", "-", "-", "-", "-", "-", "-", "no");
                miss_note(&miss, dev, shapes[i], planned, limits[g], totals[g]);
                continue;
            }
            hs_model_cuda_preflight_t r;
            st = hs_model_cuda_preflight(mc, (int)shapes[i].n_seqs, (int)shapes[i].seq_len, layers,
                                         n_layers, iters, peak_tflops, &r);
            if (st) goto out;
            /* the measured use (whole process, CUDA context included) counts too */
            uint64_t need = planned > r.device_used_bytes ? planned : r.device_used_bytes;
            bool fits = need <= limits[g];
            miss_note(&miss, dev, shapes[i], need, limits[g], totals[g]);
            char power[32] = "-", capped[16] = "-";
            if (r.metered) { /* average power / the enforced limit; share of time power-capped */
                snprintf(power, sizeof(power), "%.0f/%.0f", r.watts, r.limit_watts);
                snprintf(capped, sizeof(capped), "%.0f%%", r.power_capped_share * 100);
            }
            printf("%-4d %-22.22s %-11s %9.2f %9.2f %10.2f %9.3f %11.0f %7.1f %9s %7s  %s\n", dev,
                   names[g], shape, planned / GIB, r.device_used_bytes / GIB, r.ms, r.us_per_token,
                   r.tokens_per_s, r.mfu * 100, power, capped, fits ? "yes" : "no");
            fflush(stdout);
        }
        hs_model_cuda_destroy(mc);
        mc = NULL;
    }
    if (miss.gpu >= 0) {
        uint32_t fit = 0;
        hs_status_t fs = hs__preflight_search(worker_peak, &pc, min_limit, cfg->max_seq_len, &fit);
        char hint[96] = "no budget of 1024 tokens or more fits";
        if (fs == HS_OK) snprintf(hint, sizeof(hint), "--token-budget %u (or auto) fits", fit);
        char what[64];
        if (miss.need == planned) /* the plan itself: the same for every shape */
            snprintf(what, sizeof(what), "every shape (planned peak)");
        else
            snprintf(what, sizeof(what), "shape %ux%u (measured)", miss.shape.n_seqs,
                     miss.shape.seq_len);
        printf("does not fit: gpu %d, %s needs %.2f GiB, %.2f GiB over the %.2f GiB allowed "
               "(%.0f%% of %.2f GiB kept free); %s\n",
               miss.gpu, what, miss.need / GIB, (miss.need - miss.limit) / GIB, miss.limit / GIB,
               headroom * 100, miss.total / GIB, hint);
        fflush(stdout);
        hs_error("preflight: budget %u tokens does not fit gpu %d with %.0f%% headroom (%.2f GiB "
                 "over); %s",
                 budget, miss.gpu, headroom * 100, (miss.need - miss.limit) / GIB, hint);
        st = HS_ERR_NOSPACE;
        goto out;
    }
    *budget_out = budget;
    st = HS_OK;
out:
    hs_model_cuda_destroy(mc);
    hs_model_destroy(m);
    return st;
}
