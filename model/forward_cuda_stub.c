/* SPDX-License-Identifier: Apache-2.0 */
/* forward_cuda_stub.c - the CUDA forward's entry points in a build without
 * CUDA: each says so and returns HS_ERR_UNSUPPORTED. */
#include "hs_model.h"
#include "hs_log.h"

static hs_status_t no_cuda(const char *what)
{
    hs_error("%s: this build of hsflow has no CUDA support: use --device cpu or rebuild with "
             "-DHS_CUDA=ON",
             what);
    return HS_ERR_UNSUPPORTED;
}

hs_status_t hs_model_cuda_create_ex(hs_model_t *m, int device, uint32_t token_budget,
                                    uint32_t max_seqs, int max_layer, hs_model_cuda_t **out)
{
    hs_error("cuda:%d asked for, but this build of hsflow has no CUDA support: use --device cpu "
             "or rebuild with -DHS_CUDA=ON",
             device);
    return HS_ERR_UNSUPPORTED;
}

hs_status_t hs_model_cuda_plan(const hs_model_t *m, uint32_t token_budget, uint32_t max_seqs,
                               int max_layer, hs_model_cuda_plan_t *out)
{
    return no_cuda("cuda forward plan");
}

hs_status_t hs_model_cuda_forward(hs_model_cuda_t *mc, const int32_t *d_input_ids,
                                  const int32_t *d_cu_seqlens, int n_seqs, int T, int longest,
                                  const int32_t *layers, int n_layers, void *d_out_bf16,
                                  size_t row_stride_elems, void *stream)
{
    return HS_ERR_UNSUPPORTED;
}

void hs_model_cuda_destroy(hs_model_cuda_t *mc) { (void)mc; }

hs_status_t hs_model_cuda_peak_bytes(const hs_model_cuda_t *mc, uint64_t *out)
{
    return HS_ERR_UNSUPPORTED;
}

/* Quiet: callers ask this to learn whether there is a GPU at all. */
hs_status_t hs_model_cuda_device_count(int *out) { return HS_ERR_UNSUPPORTED; }

hs_status_t hs_model_cuda_device_info(int device, char *name, size_t name_cap,
                                      uint64_t *total_bytes, uint64_t *free_bytes)
{
    return no_cuda("cuda device info");
}

hs_status_t hs_model_cuda_preflight(hs_model_cuda_t *mc, int n_seqs, int seq_len,
                                    const int32_t *layers, int n_layers, int iters,
                                    double peak_tflops, hs_model_cuda_preflight_t *out)
{
    return no_cuda("preflight");
}
