/* SPDX-License-Identifier: Apache-2.0 */
/* gpu_worker.c - see gpu_worker_int.h. */
#include "gpu_worker_int.h"
#include "hs_log.h"

#include <stdlib.h>

#ifdef HS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "fp8.h"

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            hs_error("gpu %d: %s failed: %s", w->device, #call, cudaGetErrorString(e_));           \
            return HS_ERR_CUDA;                                                                    \
        }                                                                                          \
    } while (0)

typedef struct {
    int32_t *d_ids, *d_cu;
    uint16_t *d_out;
    /* fp8 layouts: the rows quantised on the device before they leave it,
     * and a flag a non-finite value sets (1 + its row), copied back */
    uint8_t *d_q;
    float *d_scales;
    int *d_bad, *h_bad;
    cudaEvent_t fwd_start, fwd_end, copy_start, copied;
    uint64_t d2h_bytes; /* of the batch last launched in this slot */
} gpu_slot_t;

struct hs__gpu_worker {
    int device;
    hs_model_cuda_t *mc;
    hs_layout_t layout;
    cudaStream_t compute, copy;
    gpu_slot_t slot[2];
    void *staging[2];
    bool pinned[2];
    uint32_t budget, max_seqs;
};

static hs_status_t create(hs__gpu_worker_t *w, hs_model_t *model, void *const staging[2],
                          uint64_t staging_bytes)
{
    CU(cudaSetDevice(w->device));
    /* Only the layers up to the highest captured one are uploaded and run. */
    hs_status_t st = hs_model_cuda_create_ex(model, w->device, w->budget, w->max_seqs,
                                             w->layout.layers[w->layout.n_layers - 1], &w->mc);
    if (st != HS_OK) return st;
    CU(cudaStreamCreateWithFlags(&w->compute, cudaStreamNonBlocking));
    CU(cudaStreamCreateWithFlags(&w->copy, cudaStreamNonBlocking));
    uint64_t row = hs_layout_row_elems(&w->layout);
    for (int i = 0; i < 2; i++) {
        gpu_slot_t *s = &w->slot[i];
        CU(cudaMalloc((void **)&s->d_ids, (size_t)w->budget * sizeof(int32_t)));
        CU(cudaMalloc((void **)&s->d_cu, (size_t)(w->max_seqs + 1) * sizeof(int32_t)));
        CU(cudaMalloc((void **)&s->d_out, (size_t)w->budget * row * 2));
        if (w->layout.dtype == HS_DTYPE_FP8) {
            CU(cudaMalloc((void **)&s->d_q, (size_t)w->budget * row));
            CU(cudaMalloc((void **)&s->d_scales, (size_t)w->budget * sizeof(float)));
            CU(cudaMalloc((void **)&s->d_bad, sizeof(int)));
            CU(cudaMallocHost((void **)&s->h_bad, sizeof(int)));
            *s->h_bad = 0;
        }
        CU(cudaEventCreate(&s->fwd_start));
        CU(cudaEventCreate(&s->fwd_end));
        CU(cudaEventCreate(&s->copy_start));
        CU(cudaEventCreate(&s->copied));
        /* Pinned once, so the D2H runs at copy-engine speed and overlaps. */
        CU(cudaHostRegister(staging[i], staging_bytes, cudaHostRegisterPortable));
        w->staging[i] = staging[i];
        w->pinned[i] = true;
    }
    return HS_OK;
}

hs_status_t hs__gpu_worker_create(hs_model_t *model, int device, uint32_t token_budget,
                                  uint32_t max_seqs, const hs_layout_t *layout,
                                  void *const staging[2], uint64_t staging_bytes,
                                  hs__gpu_worker_t **out)
{
    hs__gpu_worker_t *w = calloc(1, sizeof(*w));
    if (!w) return HS_ERR_NOMEM;
    w->device = device;
    w->layout = *layout;
    w->budget = token_budget;
    w->max_seqs = max_seqs;
    hs_status_t st = create(w, model, staging, staging_bytes);
    if (st != HS_OK) {
        hs_error("gpu %d: cannot set up the worker (model replica, streams, %.2f GiB of buffers)",
                 device, (double)token_budget * hs_layout_token_bytes(layout) * 2 / (1 << 30));
        hs__gpu_worker_destroy(w);
        return st;
    }
    *out = w;
    return HS_OK;
}

void hs__gpu_worker_destroy(hs__gpu_worker_t *w)
{
    if (!w) return;
    cudaSetDevice(w->device);
    if (w->compute) cudaStreamSynchronize(w->compute);
    if (w->copy) cudaStreamSynchronize(w->copy);
    for (int i = 0; i < 2; i++) {
        gpu_slot_t *s = &w->slot[i];
        cudaFree(s->d_ids);
        cudaFree(s->d_cu);
        cudaFree(s->d_out);
        cudaFree(s->d_q);
        cudaFree(s->d_scales);
        cudaFree(s->d_bad);
        cudaFreeHost(s->h_bad);
        if (s->fwd_start) cudaEventDestroy(s->fwd_start);
        if (s->fwd_end) cudaEventDestroy(s->fwd_end);
        if (s->copy_start) cudaEventDestroy(s->copy_start);
        if (s->copied) cudaEventDestroy(s->copied);
        if (w->pinned[i]) cudaHostUnregister(w->staging[i]);
    }
    if (w->compute) cudaStreamDestroy(w->compute);
    if (w->copy) cudaStreamDestroy(w->copy);
    hs_model_cuda_destroy(w->mc);
    free(w);
}

hs_status_t hs__gpu_batch_launch(hs__gpu_worker_t *w, int slot, const hs_batch_view_t *view,
                                 uint32_t n_seqs, uint32_t n_tokens)
{
    gpu_slot_t *s = &w->slot[slot];
    size_t row_elems = hs_layout_row_elems(&w->layout);
    if (n_tokens > w->budget || n_seqs > w->max_seqs) return HS_ERR_INVALID;
    CU(cudaSetDevice(w->device));
    /* The device buffer of this slot is free once its previous D2H is done. */
    CU(cudaStreamWaitEvent(w->compute, s->copied, 0));
    CU(cudaMemcpyAsync(s->d_ids, view->input_ids, (size_t)n_tokens * sizeof(int32_t),
                       cudaMemcpyHostToDevice, w->compute));
    CU(cudaMemcpyAsync(s->d_cu, view->cu_seqlens, (size_t)(n_seqs + 1) * sizeof(int32_t),
                       cudaMemcpyHostToDevice, w->compute));
    CU(cudaEventRecord(s->fwd_start, w->compute));
    hs_status_t st =
        hs_model_cuda_forward(w->mc, s->d_ids, s->d_cu, (int)n_seqs, (int)n_tokens,
                              hs_model_longest_seq(view->cu_seqlens, (int)n_seqs), w->layout.layers,
                              (int)w->layout.n_layers, s->d_out, row_elems, w->compute);
    if (st != HS_OK) return st;
    if (w->layout.dtype == HS_DTYPE_FP8) {
        /* quantised on the device: half the bytes cross PCIe */
        CU(cudaMemsetAsync(s->d_bad, 0, sizeof(int), w->compute));
        st = hs_kn_fp8_quantize_rows(s->d_out, n_tokens, (int64_t)row_elems, s->d_q, s->d_scales,
                                     s->d_bad, w->compute);
        if (st != HS_OK) return st;
    }
    CU(cudaEventRecord(s->fwd_end, w->compute));
    CU(cudaStreamWaitEvent(w->copy, s->fwd_end, 0));
    CU(cudaEventRecord(s->copy_start, w->copy));
    if (w->layout.dtype == HS_DTYPE_FP8) {
        s->d2h_bytes = (uint64_t)n_tokens * (row_elems + sizeof(float));
        CU(cudaMemcpyAsync(view->hidden_fp8, s->d_q, (size_t)n_tokens * row_elems,
                           cudaMemcpyDeviceToHost, w->copy));
        CU(cudaMemcpyAsync(view->scales, s->d_scales, (size_t)n_tokens * sizeof(float),
                           cudaMemcpyDeviceToHost, w->copy));
        CU(cudaMemcpyAsync(s->h_bad, s->d_bad, sizeof(int), cudaMemcpyDeviceToHost, w->copy));
    } else {
        s->d2h_bytes = (uint64_t)n_tokens * row_elems * 2;
        CU(cudaMemcpyAsync(view->hidden, s->d_out, (size_t)n_tokens * row_elems * 2,
                           cudaMemcpyDeviceToHost, w->copy));
    }
    CU(cudaEventRecord(s->copied, w->copy));
    return HS_OK;
}

bool hs__gpu_batch_done(hs__gpu_worker_t *w, int slot)
{
    cudaSetDevice(w->device);
    return cudaEventQuery(w->slot[slot].copied) == cudaSuccess;
}

hs_status_t hs__gpu_batch_wait(hs__gpu_worker_t *w, int slot, hs__gpu_batch_times_t *times)
{
    gpu_slot_t *s = &w->slot[slot];
    CU(cudaSetDevice(w->device));
    CU(cudaEventSynchronize(s->copied));
    float fwd_ms = 0, d2h_ms = 0;
    CU(cudaEventElapsedTime(&fwd_ms, s->fwd_start, s->fwd_end));
    CU(cudaEventElapsedTime(&d2h_ms, s->copy_start, s->copied));
    times->forward_ms = fwd_ms;
    times->d2h_ms = d2h_ms;
    times->d2h_bytes = s->d2h_bytes;
    if (s->h_bad && *s->h_bad) {
        hs_error("gpu %d: token %d's hidden state is not finite; it cannot be quantised to fp8: "
                 "check the model's weights",
                 w->device, *s->h_bad - 1);
        return HS_ERR_INVALID;
    }
    return HS_OK;
}

#else /* !HS_HAVE_CUDA */

hs_status_t hs__gpu_worker_create(hs_model_t *model, int device, uint32_t token_budget,
                                  uint32_t max_seqs, const hs_layout_t *layout,
                                  void *const staging[2], uint64_t staging_bytes,
                                  hs__gpu_worker_t **out)
{
    (void)model, (void)token_budget, (void)max_seqs, (void)layout, (void)staging;
    (void)staging_bytes, (void)out;
    hs_error("GPU worker on gpu %d: this hsflow was built without CUDA (cmake -DHS_CUDA=ON); "
             "use --gpus cpu:N",
             device);
    return HS_ERR_UNSUPPORTED;
}
void hs__gpu_worker_destroy(hs__gpu_worker_t *w) { (void)w; }
hs_status_t hs__gpu_batch_launch(hs__gpu_worker_t *w, int slot, const hs_batch_view_t *view,
                                 uint32_t n_seqs, uint32_t n_tokens)
{
    (void)w, (void)slot, (void)view, (void)n_seqs, (void)n_tokens;
    return HS_ERR_UNSUPPORTED;
}
bool hs__gpu_batch_done(hs__gpu_worker_t *w, int slot)
{
    (void)w, (void)slot;
    return true;
}
hs_status_t hs__gpu_batch_wait(hs__gpu_worker_t *w, int slot, hs__gpu_batch_times_t *times)
{
    (void)w, (void)slot, (void)times;
    return HS_ERR_UNSUPPORTED;
}
#endif
