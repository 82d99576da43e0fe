/* forward_bench.c - hs-bench-forward: times the CUDA forward of a model
 * folder at several batch shapes (n_seqs x seq_len) and prints one JSON
 * line per shape: tokens/s, us/token, MFU, peak memory. Used by
 * scripts/bench/forward; the same measurement as the producer's preflight.
 *
 *   hs-bench-forward --model DIR --layers 2,16,29 \
 *       --shapes 64x1024,16x4096,8x8192 [--iters 5] [--device 0] [--peak-tflops 989.4]
 *
 * --attn-only times the attention kernel alone at each shape on random
 * inputs of Llama-3.1-8B's attention shape (32 query heads, 8 kv heads,
 * head_dim 128) and needs no model. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attention.h"
#include "bf16.h"
#include "hs_common.h"
#include "hs_model.h"
#include "hs_model.h"

#define MAX_SHAPES 16
#define MAX_LAYERS 64

static void usage(FILE *fp)
{
    fprintf(fp, "usage: hs-bench-forward --model DIR --layers LIST --shapes NxL[,NxL...]\n"
                "                        [--iters N] [--device N] [--peak-tflops F]\n"
                "       hs-bench-forward --attn-only --shapes NxL[,NxL...] [--iters N]\n"
                "example: hs-bench-forward --model /tmp/llama8b --layers 2,16,29 \\\n"
                "             --shapes 64x1024,16x4096,8x8192 --iters 5\n");
}

/* Times hs_kn_attention at n x L (Llama-3.1-8B heads) on random inputs. */
static int attn_bench(int n, int L, int iters, double peak)
{
    const int Hq = 32, Hkv = 8, D = 128, stride = (Hq + 2 * Hkv) * D;
    const size_t T = (size_t)n * L, elems = T * stride;
    const size_t blk = 1u << 22; /* random block, repeated */
    uint16_t *h = malloc(blk * 2);
    int32_t *cu = malloc(((size_t)n + 1) * 4);
    uint64_t rng = 99;
    for (size_t i = 0; i < blk; i++)
        h[i] = hs_f32_to_bf16(
            (float)((double)(hs_splitmix64(&rng) >> 11) / 9007199254740992.0 * 4 - 2));
    for (int i = 0; i <= n; i++)
        cu[i] = i * L;
    void *x, *o, *dcu, *tiles;
    if (cudaMalloc(&x, elems * 2) || cudaMalloc(&o, T * Hq * D * 2) ||
        cudaMalloc(&dcu, ((size_t)n + 1) * 4) || cudaMalloc(&tiles, ((size_t)n + 1) * 4)) {
        fprintf(stderr, "attn bench: cudaMalloc failed\n");
        return 1;
    }
    for (size_t off = 0; off < elems; off += blk)
        cudaMemcpy((uint16_t *)x + off, h, (elems - off < blk ? elems - off : blk) * 2,
                   cudaMemcpyHostToDevice);
    cudaMemcpy(dcu, cu, ((size_t)n + 1) * 4, cudaMemcpyHostToDevice);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const uint16_t *q = x;
    float best = 1e30f;
    int rc = 0;
    for (int i = 0; i <= iters && !rc; i++) {
        cudaEventRecord(e0, 0);
        rc |= hs_kn_attention_schedule(dcu, n, tiles, 0);
        rc |= hs_kn_attention(q, stride, q + Hq * D, q + (Hq + Hkv) * D, stride, o, Hq * D, dcu,
                              tiles, n, (int)T, Hq, Hkv, D, 1.f / sqrtf((float)D), 0, 0);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i && ms < best) best = ms;
    }
    if (cudaDeviceSynchronize() != cudaSuccess) rc = 1;
    double fl = 4.0 * Hq * D * (double)L * (L + 1) / 2 * n;
    printf("{\"attn_shape\": \"%dx%d\", \"ms\": %.3f, \"tflops\": %.1f, \"of_peak\": %.3f}\n", n, L,
           best, fl / (best / 1e3) / 1e12,
           fl / (best / 1e3) / 1e12 / (peak > 0 ? peak : HS_MODEL_CUDA_PEAK_TFLOPS));
    fflush(stdout);
    cudaFree(x), cudaFree(o), cudaFree(dcu), cudaFree(tiles);
    free(h), free(cu);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *layers_s = NULL, *shapes_s = NULL;
    int iters = 5, device = 0, attn_only = 0;
    double peak = 0;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"layers", required_argument, 0, 'l'},
                                         {"shapes", required_argument, 0, 's'},
                                         {"iters", required_argument, 0, 'i'},
                                         {"device", required_argument, 0, 'd'},
                                         {"peak-tflops", required_argument, 0, 'p'},
                                         {"attn-only", no_argument, 0, 'a'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model_dir = optarg;
            break;
        case 'l':
            layers_s = optarg;
            break;
        case 's':
            shapes_s = optarg;
            break;
        case 'i':
            iters = atoi(optarg);
            break;
        case 'd':
            device = atoi(optarg);
            break;
        case 'p':
            peak = atof(optarg);
            break;
        case 'a':
            attn_only = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (attn_only && shapes_s) {
        int n, L, rc = 0;
        char *d2 = strdup(shapes_s), *sv = NULL;
        cudaSetDevice(device);
        for (char *tok = strtok_r(d2, ",", &sv); tok && !rc; tok = strtok_r(NULL, ",", &sv))
            if (sscanf(tok, "%dx%d", &n, &L) == 2) rc = attn_bench(n, L, iters, peak);
        free(d2);
        return rc;
    }
    if (!model_dir || !layers_s || !shapes_s) {
        usage(stderr);
        return 2;
    }
    int layers_i[MAX_LAYERS], n_layers = 0;
    if (hs_parse_int_list(layers_s, layers_i, MAX_LAYERS, &n_layers) != HS_OK) {
        fprintf(stderr, "hs-bench-forward: --layers '%s': give a comma-separated list\n", layers_s);
        return 2;
    }
    int32_t layers[MAX_LAYERS];
    for (int j = 0; j < n_layers; j++)
        layers[j] = layers_i[j];
    int sn[MAX_SHAPES], sl[MAX_SHAPES], n_shapes = 0;
    char *dup = strdup(shapes_s), *save = NULL;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n_shapes == MAX_SHAPES || sscanf(tok, "%dx%d", &sn[n_shapes], &sl[n_shapes]) != 2 ||
            sn[n_shapes] < 1 || sl[n_shapes] < 1) {
            fprintf(stderr, "hs-bench-forward: --shapes '%s': give NxL entries such as 16x4096\n",
                    tok);
            return 2;
        }
        n_shapes++;
    }
    free(dup);
    uint32_t budget = 0, max_seqs = 0;
    for (int i = 0; i < n_shapes; i++) {
        uint32_t T = (uint32_t)sn[i] * (uint32_t)sl[i];
        if (T > budget) budget = T;
        if ((uint32_t)sn[i] > max_seqs) max_seqs = (uint32_t)sn[i];
    }
    double t0 = hs_now_s();
    hs_model_t *m = NULL;
    if (hs_model_load(model_dir, &m) != HS_OK) return 1;
    hs_model_cuda_t *mc = NULL;
    if (hs_model_cuda_create(m, device, budget, max_seqs, &mc) != HS_OK) return 1;
    hs_info("bench: model loaded and uploaded in %.1f s", hs_now_s() - t0);
    int rc = 0;
    for (int i = 0; i < n_shapes; i++) {
        hs_model_cuda_preflight_t r;
        if (hs_model_cuda_preflight(mc, sn[i], sl[i], layers, n_layers, iters, peak, &r) != HS_OK) {
            rc = 1;
            break;
        }
        printf("{\"shape\": \"%dx%d\", \"tokens\": %d, \"ms\": %.3f, \"tokens_per_s\": %.1f, "
               "\"us_per_token\": %.3f, \"tflop\": %.3f, \"tflops\": %.1f, \"mfu\": %.4f, "
               "\"peak_gib\": %.3f, \"device_used_gib\": %.3f}\n",
               sn[i], sl[i], sn[i] * sl[i], r.ms, r.tokens_per_s, r.us_per_token, r.tflop,
               r.tflop / (r.ms / 1000.0), r.mfu, r.peak_bytes / 1073741824.0,
               r.device_used_bytes / 1073741824.0);
        fflush(stdout);
    }
    hs_model_cuda_destroy(mc);
    hs_model_destroy(m);
    return rc;
}
