/* SPDX-License-Identifier: Apache-2.0 */
/* hs_forward_main.c - hs-forward: runs the built-in target forward on token
 * sequences from a JSONL file and writes the captured hidden states to a
 * safetensors file, to check parity with another stack. Sequences come from
 * a JSONL or .hst file, read by the producer's dataset module.
 *
 * Output: one tensor per captured layer, "hidden_states.<idx>" [T_total, H]
 * (F32 on cpu, BF16 on cuda), plus "cu_seqlens" I32 [n+1] and "input_ids"
 * I32 [T_total]; __metadata__ holds the model folder and the layers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hs_cli.h"
#include "hsflow.h"
#include "hs_status.h"
#include "hs_log.h"
#include "hs_outfile.h"
#include "hs_parse.h"
#include "hs_version.h"
#include "hs_data.h"
#include "hs_model.h"
#include "safetensors_int.h"

#ifdef HS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define MAX_CAPTURED 64

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: hs-forward --model DIR --data FILE (--layers LIST | --dflash-layers N)\n"
            "                  [--device cpu|cuda:N] [--dtype auto|bf16|fp8] [--token-budget N]\n"
            "                  --out FILE\n"
            "       hs-forward --plan --model DIR (--layers LIST | --dflash-layers N)\n"
            "                  [--dtype auto|bf16|fp8] [--token-budget N]\n"
            "\n"
            "Runs the built-in forward on every sequence of FILE and writes the hidden states\n"
            "of the captured layers to a safetensors file: hidden_states.<idx> [T_total, H]\n"
            "(F32 on cpu, BF16 on cuda), cu_seqlens I32 [n+1] and input_ids I32 [T_total].\n"
            "\n"
            "  --model DIR         Hugging Face folder (config.json, *.safetensors): Llama,\n"
            "                      Qwen2/3, Mistral, or Qwen3.5/3.6 (text decoder, VL\n"
            "                      checkpoints too)\n"
            "  --data FILE         JSONL, one {\"input_ids\": [...]} object per line, or .hst\n"
            "  --layers LIST       output_hidden_states indices: 0 = embeddings, i = output of\n"
            "                      decoder layer i-1, N = final normed output\n"
            "  --dflash-layers N   DFlash's default set for an N-layer drafter instead\n"
            "  --device DEV        cpu (default) or cuda:0, cuda:1, ...\n"
            "  --dtype W           Linear weights: auto (as stored, default: an FP8 checkpoint\n"
            "                      runs its GEMMs in fp8), bf16 (dequantise FP8 at load) or\n"
            "                      fp8 (quantise bf16 at load in 128x128 blocks, as FP8\n"
            "                      checkpoints are; the GEMMs in fp8 on an H100/H200)\n"
            "  --token-budget N    tokens per forward call (default 16384)\n"
            "  --plan              print the GPU memory the CUDA forward plans for this model,\n"
            "                      budget, layers and dtype (weights, activations, cuBLASLt\n"
            "                      workspace; as hs-producer plans: up to --token-budget\n"
            "                      sequences) and exit; no GPU is needed, and with --dtype\n"
            "                      auto no weight is read (a conversion reads them)\n"
            "  --out FILE          safetensors file to write (whole or not at all: through a\n"
            "                      temporary file renamed at the end; never onto --data or\n"
            "                      into the --model folder)\n"
            "  --version           the release, git checkout and build options\n"
            "Every flag can also be set as HS_<FLAG> in the environment (HS_MODEL=...).\n"
            "\n"
            "example:\n"
            "  hs-forward --model ~/models/Llama-3.1-8B --data tokens.jsonl \\\n"
            "             --layers 2,16,29 --device cuda:0 --out hs.safetensors\n");
}

/* --plan: the CUDA forward's memory plan, host arithmetic only. */
static int print_plan(const hs_model_t *m, uint32_t budget, const int32_t *layers, int k,
                      hs_model_weights_t weights)
{
    int top = 0;
    for (int i = 0; i < k; i++)
        if (layers[i] > top) top = layers[i];
    hs_model_cuda_plan_t p;
    if (hs_model_cuda_plan(m, budget, budget, top, &p) != HS_OK) return 1;
    const double gib = 1073741824.0;
    int N = hs_model_num_layers(m), run = top < N ? top : N;
    printf("hs-forward --plan: %d of %d decoder layers run (up to layer %d captured), --dtype %s "
           "(%d fp8 Linear weights), --token-budget %u (up to %u sequences)\n",
           run, N, top, hs_model_weights_name(weights), hs_model_fp8_weights(m), budget, budget);
    printf("  weights      %8.2f GiB (%llu bytes)\n", p.weights / gib,
           (unsigned long long)p.weights);
    printf("  activations  %8.2f GiB (%llu bytes)\n", p.activations / gib,
           (unsigned long long)p.activations);
    printf("  workspace    %8.2f GiB (%llu bytes, cuBLASLt)\n", p.workspace / gib,
           (unsigned long long)p.workspace);
    uint64_t total = p.weights + p.activations + p.workspace;
    printf("  total        %8.2f GiB (%llu bytes); not counted: cuDNN's attention workspace and "
           "the caller's input and output buffers\n",
           total / gib, (unsigned long long)total);
    return 0;
}

typedef struct {
    int32_t *ids;
    int32_t *cu; /* n + 1 */
    int n;
    int64_t T;
} seqs_t;

static void seqs_free(seqs_t *s)
{
    free(s->ids);
    free(s->cu);
}

/* Reads the sequences of a JSONL or .hst token file (the producer's dataset
 * reader: the same files hs-producer takes). */
static hs_status_t read_tokens(const char *path, seqs_t *out)
{
    hs_dataset_t *ds = NULL;
    hs_status_t rc = hs_dataset_open(path, &ds);
    if (rc != HS_OK) return rc;
    uint64_t n = hs_dataset_count(ds), T = hs_dataset_total_tokens(ds);
    if (n > 0x7fffffffu || T > 0x7fffffffu) {
        hs_error("%s: %llu sequences / %llu tokens, more than one int32 cu_seqlens can index; "
                 "split the file",
                 path, (unsigned long long)n, (unsigned long long)T);
        hs_dataset_close(ds);
        return HS_ERR_INVALID;
    }
    seqs_t s = {0};
    s.ids = malloc((size_t)(T ? T : 1) * sizeof *s.ids);
    s.cu = malloc((size_t)(n + 1) * sizeof *s.cu);
    if (!s.ids || !s.cu) {
        seqs_free(&s);
        hs_dataset_close(ds);
        return HS_ERR_NOMEM;
    }
    s.cu[0] = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t len = hs_dataset_seq_len(ds, i);
        memcpy(s.ids + s.cu[i], hs_dataset_ids(ds, i), (size_t)len * sizeof *s.ids);
        s.cu[i + 1] = s.cu[i] + (int32_t)len;
    }
    rc = hs_dataset_check(ds);
    s.n = (int)n;
    s.T = (int64_t)T;
    hs_dataset_close(ds);
    if (rc != HS_OK) {
        seqs_free(&s);
        return rc;
    }
    *out = s;
    return HS_OK;
}

#ifdef HS_HAVE_CUDA
/* One chunk on the GPU: ids and cu_seqlens (rebased to 0) up, bf16 down. */
static hs_status_t run_cuda_chunk(hs_model_cuda_t *mc, const int32_t *ids, const int32_t *cu, int n,
                                  const int32_t *layers, int k, int H, uint16_t *out_host,
                                  void *d_ids, void *d_cu, void *d_out)
{
    int T = cu[n] - cu[0];
    int32_t *rebased = malloc((size_t)(n + 1) * sizeof *rebased);
    if (!rebased) return HS_ERR_NOMEM;
    for (int i = 0; i <= n; i++)
        rebased[i] = cu[i] - cu[0];
    hs_status_t rc = HS_ERR_CUDA;
    if (cudaMemcpy(d_ids, ids + cu[0], (size_t)T * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(d_cu, rebased, (size_t)(n + 1) * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
        hs_error("cuda: copying a chunk's inputs failed");
        goto out;
    }
    rc = hs_model_cuda_forward(mc, d_ids, d_cu, n, T, hs_model_longest_seq(rebased, n), layers, k,
                               d_out, (size_t)k * H, NULL);
    if (rc != HS_OK) goto out;
    if (cudaMemcpy(out_host, d_out, (size_t)T * k * H * 2, cudaMemcpyDeviceToHost) != cudaSuccess) {
        hs_error("cuda: forward or copy back failed");
        rc = HS_ERR_CUDA;
        goto out;
    }
    rc = HS_OK;
out:
    free(rebased);
    return rc;
}
#endif

/* The flags as given (command line over HS_* environment), checked in main. */
typedef struct {
    const char *model, *data, *layers, *dflash, *device, *out, *budget, *dtype;
    bool plan_only;
} options_t;

int main(int argc, char **argv)
{
    if (hs_cli_wants_version(argc, argv)) {
        hs_version_print(stdout, "hs-forward");
        return 0;
    }
    options_t o = {0};
    const hs_cli_flag_t flags[] = {
        HS_CLI_TRUE("plan", &o.plan_only),
        HS_CLI_STR("model", &o.model),
        HS_CLI_STR("data", &o.data),
        HS_CLI_STR("layers", &o.layers),
        HS_CLI_STR("dflash-layers", &o.dflash),
        HS_CLI_STR("device", &o.device),
        HS_CLI_STR("token-budget", &o.budget),
        HS_CLI_STR("dtype", &o.dtype), /* Linear weights: auto, bf16, fp8 */
        HS_CLI_STR("out", &o.out),
        {0},
    };
    int exit_now = hs_cli_parse_table(argc, argv, flags, "hs-forward", usage);
    if (exit_now >= 0) return exit_now;
    if (!o.model || (!o.plan_only && (!o.data || !o.out))) {
        fprintf(stderr, "hs-forward: --model, --data and --out are required (--plan: --model "
                        "only; see --help)\n");
        return 2;
    }
    if (!!o.layers == !!o.dflash) {
        fprintf(stderr, "hs-forward: give exactly one of --layers LIST or --dflash-layers N\n");
        return 2;
    }
    if (!o.device) o.device = "cpu";
    int cuda_dev = -1;
    if (strncmp(o.device, "cuda:", 5) == 0) {
        int64_t v;
        if (hs_parse_i64(o.device + 5, &v) != HS_OK || v < 0 || v > 1023) {
            fprintf(stderr, "hs-forward: --device '%s': use cpu or cuda:N\n", o.device);
            return 2;
        }
        cuda_dev = (int)v;
    } else if (strcmp(o.device, "cpu") != 0) {
        fprintf(stderr, "hs-forward: --device '%s': use cpu or cuda:N\n", o.device);
        return 2;
    }
    hs_model_weights_t weights = HS_MODEL_WEIGHTS_AUTO;
    if (o.dtype && hs_model_weights_parse(o.dtype, &weights) != HS_OK) {
        char names[64];
        fprintf(stderr, "hs-forward: --dtype '%s': use %s\n", o.dtype,
                hs_dtype_names(names, sizeof names, "auto", ", ", " or "));
        return 2;
    }
    uint64_t budget = 16384;
    if (o.budget &&
        (hs_parse_u64(o.budget, &budget) != HS_OK || budget < 1 || budget > 2147483647u)) {
        fprintf(stderr, "hs-forward: --token-budget '%s' must be a positive integer\n", o.budget);
        return 2;
    }
    int dflash_n = 0, layer_list[MAX_CAPTURED], k = 0;
    if (o.layers) {
        if (hs_parse_int_list(o.layers, layer_list, MAX_CAPTURED, &k) != HS_OK || k < 1) {
            fprintf(stderr,
                    "hs-forward: --layers '%s': expected a comma-separated list such as 2,16,29 "
                    "(at most %d)\n",
                    o.layers, MAX_CAPTURED);
            return 2;
        }
    } else {
        int64_t v;
        if (hs_parse_i64(o.dflash, &v) != HS_OK || v < 1 || v > MAX_CAPTURED) {
            fprintf(stderr, "hs-forward: --dflash-layers '%s' must be 1..%d\n", o.dflash,
                    MAX_CAPTURED);
            return 2;
        }
        dflash_n = (int)v;
    }

    /* Before the model is loaded: writing onto the tokens or the model's own
     * files would destroy them. */
    const char *inputs[] = {o.data, o.model};
    if (!o.plan_only && hs_outfile_check(o.out, inputs, 2) != HS_OK) return 2;

    int rc = 1;
    hs_model_t *m = NULL;
    seqs_t s = {0};
    void *out = NULL;
    int32_t layers[MAX_CAPTURED];
#ifdef HS_HAVE_CUDA
    hs_model_cuda_t *mc = NULL;
    void *d_ids = NULL, *d_cu = NULL, *d_out = NULL;
#endif
    if (hs_model_load_ex(o.model, weights, &m) != HS_OK) goto done;
    hs_model_set_attn(m, hs_model_attn_parse(getenv("HS_ATTN_BACKEND")));
    int N = hs_model_num_layers(m), H = hs_model_hidden_size(m);
    if (dflash_n) {
        if (hs_model_dflash_layers(N, dflash_n, layers, MAX_CAPTURED) != HS_OK) goto done;
        k = dflash_n;
    } else {
        for (int i = 0; i < k; i++)
            layers[i] = layer_list[i];
    }
    if (hs_model_check_layers(N, layers, k) != HS_OK) goto done;
    for (int j = 1; j < k; j++) {
        for (int i = 0; i < j; i++) {
            if (layers[i] == layers[j]) {
                hs_error("hs-forward: layer %d is listed twice in --layers", layers[j]);
                goto done;
            }
        }
    }
    if (o.plan_only) {
        rc = print_plan(m, (uint32_t)budget, layers, k, weights);
        goto done;
    }
    if (read_tokens(o.data, &s) != HS_OK) goto done;
    char lay[512];
    size_t ln = 0;
    lay[0] = 0;
    for (int i = 0; i < k && ln < sizeof lay; i++)
        ln += (size_t)snprintf(lay + ln, sizeof lay - ln, "%s%d", i ? "," : "", layers[i]);
    hs_info("hs-forward: model=%s data=%s (%d sequences, %lld tokens) layers=%s device=%s "
            "dtype=%s token-budget=%llu out=%s",
            o.model, o.data, s.n, (long long)s.T, lay, o.device, hs_model_weights_name(weights),
            (unsigned long long)budget, o.out);

    int esize = cuda_dev >= 0 ? 2 : 4;
    size_t row = (size_t)k * (size_t)H;
    out = malloc((size_t)s.T * row * (size_t)esize);
    if (!out) {
        hs_error("hs-forward: no memory for %lld tokens x %d layers x H=%d of output",
                 (long long)s.T, k, H);
        goto done;
    }
    for (int i = 0; i < s.n; i++) {
        if ((uint64_t)(s.cu[i + 1] - s.cu[i]) > budget) {
            hs_error("hs-forward: sequence %d has %d tokens, more than --token-budget %llu", i,
                     s.cu[i + 1] - s.cu[i], (unsigned long long)budget);
            goto done;
        }
    }
    if (cuda_dev >= 0) {
#ifdef HS_HAVE_CUDA
        /* a chunk holds at most `budget` sequences (each has >= 1 token) */
        uint32_t max_seqs = (uint64_t)s.n < budget ? (uint32_t)s.n : (uint32_t)budget;
        if (hs_model_cuda_create(m, cuda_dev, (uint32_t)budget, max_seqs, &mc) != HS_OK) goto done;
        if (cudaMalloc(&d_ids, budget * 4) != cudaSuccess ||
            cudaMalloc(&d_cu, ((size_t)s.n + 1) * 4) != cudaSuccess ||
            cudaMalloc(&d_out, budget * row * 2) != cudaSuccess) {
            hs_error("hs-forward: cudaMalloc of the input/output buffers failed");
            goto cuda_done;
        }
#else
        hs_model_cuda_t *none = NULL; /* fails, saying CUDA is not built in */
        if (hs_model_cuda_create(m, cuda_dev, (uint32_t)budget, (uint32_t)s.n, &none) != HS_OK)
            goto done;
        hs_model_cuda_destroy(none);
        goto done;
#endif
    }
    /* greedy chunks of whole sequences under the budget, in file order */
    int first = 0;
    while (first < s.n) {
        int last = first + 1;
        while (last < s.n && (uint64_t)(s.cu[last + 1] - s.cu[first]) <= budget)
            last++;
        int n = last - first;
        uint8_t *dst = (uint8_t *)out + (size_t)s.cu[first] * row * (size_t)esize;
        hs_status_t st;
        if (cuda_dev < 0) {
            int32_t *cu = malloc((size_t)(n + 1) * sizeof *cu);
            if (!cu) goto done;
            for (int i = 0; i <= n; i++)
                cu[i] = s.cu[first + i] - s.cu[first];
            st = hs_model_forward_cpu(m, s.ids + s.cu[first], cu, n, layers, k, dst,
                                      HS_MODEL_OUT_F32, row);
            free(cu);
        } else {
#ifdef HS_HAVE_CUDA
            st = run_cuda_chunk(mc, s.ids, s.cu + first, n, layers, k, H, (uint16_t *)dst, d_ids,
                                d_cu, d_out);
#else
            st = HS_ERR_UNSUPPORTED;
#endif
        }
        if (st != HS_OK) {
            hs_error("hs-forward: forward of sequences %d..%d failed: %s", first, last - 1,
                     hs_status_str(st));
#ifdef HS_HAVE_CUDA
            goto cuda_done;
#else
            goto done;
#endif
        }
        hs_debug("hs-forward: sequences %d..%d done", first, last - 1);
        first = last;
    }

    {
        hs__st_write_tensor_t *t = calloc((size_t)k + 2, sizeof *t);
        char(*names)[48] = calloc((size_t)k, sizeof *names);
        if (!t || !names) {
            free(t);
            free(names);
            goto cuda_done;
        }
        for (int j = 0; j < k; j++) {
            snprintf(names[j], sizeof names[j], "hidden_states.%d", layers[j]);
            t[j] = (hs__st_write_tensor_t){
                .name = names[j],
                .dtype = esize == 4 ? "F32" : "BF16",
                .ndim = 2,
                .shape = {s.T, H},
                .data = (uint8_t *)out + (size_t)j * H * esize,
                .rows = (size_t)s.T,
                .row_bytes = (size_t)H * esize,
                .src_stride = row * esize,
            };
        }
        t[k] = (hs__st_write_tensor_t){.name = "cu_seqlens",
                                       .dtype = "I32",
                                       .ndim = 1,
                                       .shape = {s.n + 1},
                                       .data = s.cu,
                                       .rows = 1,
                                       .row_bytes = ((size_t)s.n + 1) * 4};
        t[k + 1] = (hs__st_write_tensor_t){.name = "input_ids",
                                           .dtype = "I32",
                                           .ndim = 1,
                                           .shape = {s.T},
                                           .data = s.ids,
                                           .rows = 1,
                                           .row_bytes = (size_t)s.T * 4};
        const char *mk[] = {"format", "model", "layers", "device"};
        const char *mv[] = {"hsflow-hidden-states", o.model, lay, o.device};
        hs_status_t st = hs__st_write(o.out, t, k + 2, mk, mv, 4);
        free(t);
        free(names);
        if (st != HS_OK) goto cuda_done;
    }
    hs_info("hs-forward: wrote %d layers x %lld tokens x H=%d to %s", k, (long long)s.T, H, o.out);
    rc = 0;
cuda_done:
#ifdef HS_HAVE_CUDA
    cudaFree(d_ids);
    cudaFree(d_cu);
    cudaFree(d_out);
    hs_model_cuda_destroy(mc);
#endif
done:
    free(out);
    seqs_free(&s);
    hs_model_destroy(m);
    return rc;
}
