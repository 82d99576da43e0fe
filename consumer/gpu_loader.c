/* SPDX-License-Identifier: Apache-2.0 */
/* gpu_loader.c - host-to-device delivery of verified batches; see
 * gpu_loader_int.h. */
#include "gpu_loader_int.h"
#include "hs_status.h"
#include "hs_log.h"

#include <stdatomic.h>
#include <stdlib.h>

#ifdef HS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "fp8.h"

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            hs_error("%s failed: %s", #call, cudaGetErrorString(e_));                              \
            return HS_ERR_CUDA;                                                                    \
        }                                                                                          \
    } while (0)

typedef struct {
    void *dptr;
    void *drows;          /* bf16 rows of fp8 batches, or NULL */
    cudaEvent_t consumed; /* recorded on the trainer's stream */
    cudaEvent_t copy_start;
    cudaEvent_t ready;   /* the copy, and the dequantisation of an fp8 batch, are done */
    uint64_t copy_bytes; /* of the copy whose timing is not yet counted */
    bool timing_pending;
} loader_buf_t;

/* One host callback's record: its slot in the loader's ring is reused once
 * the callback has run (the ring's `done` count passes it). */
typedef struct {
    hs__loader_copied_cb cb;
    void *arg;
    hs__loader_t *loader;
} host_cb_t;

/* More than the two copies that can be queued (one per buffer) plus the
 * callbacks of earlier copies that the copy stream has not reached yet. */
#define LOADER_RING 8

/* An fp8 batch's rows cross PCIe in pieces of about this many bytes; each
 * piece is dequantised on a second stream while the next one is copied, so
 * only the last piece's dequantisation adds to the copy's time. */
#define DEQUANT_PIECE_BYTES (8u << 20)
#define DEQUANT_PIECES_MAX 64

struct hs__loader {
    int device;
    cudaStream_t stream;          /* the copies */
    cudaStream_t dequant_stream;  /* fp8 dequantisation, at the device's highest priority */
    cudaStream_t callback_stream; /* the host callbacks, once a batch is ready */
    cudaEvent_t piece_copied[DEQUANT_PIECES_MAX];
    uint64_t capacity, rows_capacity;
    loader_buf_t buf[2];
    uint64_t bytes_copied;
    double copy_s;
    host_cb_t ring[LOADER_RING];
    uint64_t issued;            /* callbacks queued (the copying thread's) */
    _Atomic uint64_t completed; /* callbacks run (the callback thread's) */
};

static void CUDART_CB on_copied(void *p)
{
    host_cb_t *h = p;
    hs__loader_copied_cb cb = h->cb;
    void *arg = h->arg;
    hs__loader_t *l = h->loader;
    /* the slot is free again from here: read it first */
    atomic_fetch_add_explicit(&l->completed, 1, memory_order_release);
    cb(arg);
}

hs_status_t hs__loader_create(int device, hs__loader_t **out)
{
    hs__loader_t *l = calloc(1, sizeof(*l));
    if (!l) return HS_ERR_NOMEM;
    l->device = device;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        hs_error("cannot use GPU %d: %s (check --gpu and CUDA_VISIBLE_DEVICES)", device,
                 cudaGetErrorString(e));
        free(l);
        return HS_ERR_CUDA;
    }
    /* The dequantisation shares the GPU with the trainer's kernels (or a
     * producer's forward): at normal priority a piece's kernel waits for
     * their blocks to drain, and the batch is late by that much. At the
     * highest priority its blocks are scheduled first as SMs free up.
     * Non-blocking streams: the trainer's work on the legacy default stream
     * would otherwise wait for the next batch's copy, queued behind it. */
    int least = 0, greatest = 0;
    if (cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) greatest = 0;
    if (cudaStreamCreateWithFlags(&l->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithPriority(&l->dequant_stream, cudaStreamNonBlocking, greatest) !=
            cudaSuccess ||
        cudaStreamCreateWithFlags(&l->callback_stream, cudaStreamNonBlocking) != cudaSuccess)
        goto err;
    for (int i = 0; i < DEQUANT_PIECES_MAX; i++)
        if (cudaEventCreateWithFlags(&l->piece_copied[i], cudaEventDisableTiming) != cudaSuccess)
            goto err;
    for (int i = 0; i < 2; i++) {
        if (cudaEventCreateWithFlags(&l->buf[i].consumed, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreate(&l->buf[i].copy_start) != cudaSuccess ||
            cudaEventCreate(&l->buf[i].ready) != cudaSuccess)
            goto err;
        cudaEventRecord(l->buf[i].consumed, l->stream);
        cudaEventRecord(l->buf[i].ready, l->stream);
    }
    *out = l;
    return HS_OK;
err:
    hs_error("GPU %d: cannot create the copy stream and events", device);
    hs__loader_destroy(l);
    return HS_ERR_CUDA;
}

void hs__loader_destroy(hs__loader_t *l)
{
    if (!l) return;
    cudaSetDevice(l->device);
    if (l->stream) cudaStreamSynchronize(l->stream);
    if (l->dequant_stream) cudaStreamSynchronize(l->dequant_stream);
    if (l->callback_stream) cudaStreamSynchronize(l->callback_stream);
    for (int i = 0; i < 2; i++) {
        cudaFree(l->buf[i].dptr);
        cudaFree(l->buf[i].drows);
        if (l->buf[i].consumed) cudaEventDestroy(l->buf[i].consumed);
        if (l->buf[i].copy_start) cudaEventDestroy(l->buf[i].copy_start);
        if (l->buf[i].ready) cudaEventDestroy(l->buf[i].ready);
    }
    for (int i = 0; i < DEQUANT_PIECES_MAX; i++)
        if (l->piece_copied[i]) cudaEventDestroy(l->piece_copied[i]);
    if (l->dequant_stream) cudaStreamDestroy(l->dequant_stream);
    if (l->callback_stream) cudaStreamDestroy(l->callback_stream);
    if (l->stream) cudaStreamDestroy(l->stream);
    free(l);
}

hs_status_t hs__loader_reserve(hs__loader_t *l, uint64_t bytes)
{
    if (bytes <= l->capacity) return HS_OK;
    CU(cudaSetDevice(l->device));
    CU(cudaDeviceSynchronize());
    for (int i = 0; i < 2; i++) {
        cudaFree(l->buf[i].dptr);
        l->buf[i].dptr = NULL;
        cudaError_t e = cudaMalloc(&l->buf[i].dptr, bytes);
        if (e != cudaSuccess) {
            hs_error("GPU %d: cannot allocate two delivery buffers of %.2f GiB: %s", l->device,
                     (double)bytes / (1 << 30), cudaGetErrorString(e));
            l->capacity = 0;
            return HS_ERR_CUDA;
        }
    }
    l->capacity = bytes;
    return HS_OK;
}

hs_status_t hs__loader_reserve_rows(hs__loader_t *l, uint64_t bytes)
{
    if (bytes <= l->rows_capacity) return HS_OK;
    CU(cudaSetDevice(l->device));
    CU(cudaDeviceSynchronize());
    for (int i = 0; i < 2; i++) {
        cudaFree(l->buf[i].drows);
        l->buf[i].drows = NULL;
        cudaError_t e = cudaMalloc(&l->buf[i].drows, bytes);
        if (e != cudaSuccess) {
            hs_error("GPU %d: cannot allocate two %.2f GiB buffers for dequantised fp8 batches: "
                     "%s",
                     l->device, (double)bytes / (1 << 30), cudaGetErrorString(e));
            l->rows_capacity = 0;
            return HS_ERR_CUDA;
        }
    }
    l->rows_capacity = bytes;
    return HS_OK;
}

/* Adds the timing of buffer b's last copy once its end event has passed. */
static void account(hs__loader_t *l, loader_buf_t *b)
{
    if (!b->timing_pending || cudaEventQuery(b->ready) != cudaSuccess) return;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, b->copy_start, b->ready) == cudaSuccess) {
        l->bytes_copied += b->copy_bytes;
        l->copy_s += ms * 1e-3;
    }
    b->timing_pending = false;
}

/* Copies an fp8 batch: everything but the rows first (ids, masks, scales),
 * then the rows piece by piece on the copy stream, each piece dequantised on
 * the dequantisation stream once it has landed. */
static hs_status_t copy_dequantising(hs__loader_t *l, loader_buf_t *b, const hs_cache_t *cache,
                                     uint64_t offset, uint64_t bytes, const hs__loader_fp8_t *fp8)
{
    uint64_t row_bytes = (uint64_t)fp8->row_elems;
    uint64_t rows_end = fp8->hidden_off + (uint64_t)fp8->rows * row_bytes;
    if (fp8->hidden_off > bytes || rows_end > bytes ||
        fp8->scales_off + 4 * (uint64_t)fp8->rows > bytes)
        return HS_ERR_INVALID;
    hs_status_t st = hs_cache_copy_to_device(cache, b->dptr, offset, fp8->hidden_off, l->stream);
    if (st == HS_OK)
        st = hs_cache_copy_to_device(cache, (uint8_t *)b->dptr + rows_end, offset + rows_end,
                                     bytes - rows_end, l->stream);
    if (st != HS_OK) return st;
    int64_t piece_rows = (int64_t)(DEQUANT_PIECE_BYTES / (row_bytes ? row_bytes : 1));
    int64_t min_rows = (fp8->rows + DEQUANT_PIECES_MAX - 1) / DEQUANT_PIECES_MAX;
    if (piece_rows < min_rows) piece_rows = min_rows;
    if (piece_rows < 1) piece_rows = 1;
    const uint8_t *q = (const uint8_t *)b->dptr + fp8->hidden_off;
    const float *scales = (const float *)((const uint8_t *)b->dptr + fp8->scales_off);
    uint16_t *out = b->drows;
    for (int64_t r = 0, i = 0; r < fp8->rows; r += piece_rows, i++) {
        int64_t n = fp8->rows - r < piece_rows ? fp8->rows - r : piece_rows;
        st = hs_cache_copy_to_device(cache, (uint8_t *)b->dptr + fp8->hidden_off + r * row_bytes,
                                     offset + fp8->hidden_off + r * row_bytes, n * row_bytes,
                                     l->stream);
        if (st != HS_OK) return st;
        /* a wait takes the event as last recorded, so the pieces' events
         * can be recorded again by the next batch */
        CU(cudaEventRecord(l->piece_copied[i], l->stream));
        CU(cudaStreamWaitEvent(l->dequant_stream, l->piece_copied[i], 0));
        st = hs_kn_fp8_dequantize_rows(q + r * row_bytes, scales + r, n, fp8->row_elems,
                                       out + r * fp8->row_elems, l->dequant_stream);
        if (st != HS_OK) {
            hs_error("GPU %d: the dequantisation of an fp8 batch could not start (%s)", l->device,
                     hs_status_str(st));
            return st;
        }
    }
    return HS_OK;
}

hs_status_t hs__loader_copy(hs__loader_t *l, int buf, const hs_cache_t *cache, uint64_t offset,
                            uint64_t bytes, const hs__loader_fp8_t *fp8,
                            hs__loader_copied_cb copied, void *arg)
{
    loader_buf_t *b = &l->buf[buf];
    if (bytes > l->capacity) return HS_ERR_INVALID;
    if (fp8 && (uint64_t)(fp8->rows * fp8->row_elems) * 2 > l->rows_capacity) return HS_ERR_INVALID;
    CU(cudaSetDevice(l->device));
    if (b->timing_pending) {
        cudaEventSynchronize(b->ready);
        account(l, b);
    }
    /* a full ring (the streams are far behind) waits for its callbacks */
    if (l->issued - atomic_load_explicit(&l->completed, memory_order_acquire) >= LOADER_RING)
        CU(cudaStreamSynchronize(l->callback_stream));
    host_cb_t *h = &l->ring[l->issued % LOADER_RING];
    h->cb = copied;
    h->arg = arg;
    h->loader = l;
    CU(cudaStreamWaitEvent(l->stream, b->consumed, 0));
    CU(cudaStreamWaitEvent(l->stream, b->ready, 0)); /* a batch never handed over */
    CU(cudaEventRecord(b->copy_start, l->stream));
    hs_status_t st = fp8 ? copy_dequantising(l, b, cache, offset, bytes, fp8)
                         : hs_cache_copy_to_device(cache, b->dptr, offset, bytes, l->stream);
    if (st != HS_OK) return st;
    /* The batch is ready when the dequantisation stream has passed both its
     * own work and the copy; the host slot is given back after that, on a
     * stream of its own (a host function blocks its stream for the
     * callback's latency: on the copy stream it would stall the next copy,
     * on the dequantisation stream the next batch's first pieces). */
    CU(cudaEventRecord(b->ready, l->stream));
    CU(cudaStreamWaitEvent(l->dequant_stream, b->ready, 0));
    CU(cudaEventRecord(b->ready, l->dequant_stream));
    CU(cudaStreamWaitEvent(l->callback_stream, b->ready, 0));
    b->copy_bytes = bytes;
    b->timing_pending = true;
    CU(cudaLaunchHostFunc(l->callback_stream, on_copied, h));
    l->issued++;
    return HS_OK;
}

hs_status_t hs__loader_hand_over(hs__loader_t *l, int buf, void **dptr, void **drows)
{
    CU(cudaSetDevice(l->device));
    CU(cudaStreamWaitEvent(0, l->buf[buf].ready, 0));
    account(l, &l->buf[buf]);
    *dptr = l->buf[buf].dptr;
    *drows = l->buf[buf].drows;
    return HS_OK;
}

hs_status_t hs__loader_consumed(hs__loader_t *l, int buf)
{
    CU(cudaSetDevice(l->device));
    CU(cudaEventRecord(l->buf[buf].consumed, 0));
    return HS_OK;
}

void hs__loader_stats(hs__loader_t *l, uint64_t *bytes, double *seconds)
{
    for (int i = 0; i < 2; i++)
        account(l, &l->buf[i]);
    *bytes = l->bytes_copied;
    *seconds = l->copy_s;
}

#else /* !HS_HAVE_CUDA */

hs_status_t hs__loader_create(int device, hs__loader_t **out)
{
    (void)out;
    hs_error("delivery to GPU %d needs a build with CUDA (cmake -DHS_CUDA=ON); use --gpu none",
             device);
    return HS_ERR_UNSUPPORTED;
}
void hs__loader_destroy(hs__loader_t *l) { (void)l; }
hs_status_t hs__loader_reserve(hs__loader_t *l, uint64_t bytes)
{
    (void)l, (void)bytes;
    return HS_ERR_UNSUPPORTED;
}
hs_status_t hs__loader_reserve_rows(hs__loader_t *l, uint64_t bytes)
{
    (void)l, (void)bytes;
    return HS_ERR_UNSUPPORTED;
}
hs_status_t hs__loader_copy(hs__loader_t *l, int buf, const hs_cache_t *cache, uint64_t offset,
                            uint64_t bytes, const hs__loader_fp8_t *fp8,
                            hs__loader_copied_cb copied, void *arg)
{
    (void)l, (void)buf, (void)cache, (void)offset, (void)bytes, (void)fp8, (void)copied, (void)arg;
    return HS_ERR_UNSUPPORTED;
}
hs_status_t hs__loader_hand_over(hs__loader_t *l, int buf, void **dptr, void **drows)
{
    (void)l, (void)buf, (void)dptr, (void)drows;
    return HS_ERR_UNSUPPORTED;
}
hs_status_t hs__loader_consumed(hs__loader_t *l, int buf)
{
    (void)l, (void)buf;
    return HS_ERR_UNSUPPORTED;
}
void hs__loader_stats(hs__loader_t *l, uint64_t *bytes, double *seconds)
{
    (void)l;
    *bytes = 0;
    *seconds = 0;
}
#endif
