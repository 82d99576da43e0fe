/* SPDX-License-Identifier: Apache-2.0 */
/* gpu_worker_int.h - the GPU half of a producer worker (DESIGN §5): one
 * model replica per GPU, a compute stream and a copy stream, two device
 * output buffers, and the worker's two staging buffers pinned.
 *
 * Per batch, hs__gpu_batch_launch() queues, without waiting: the H2D copy of
 * input_ids and cu_seqlens from the (pinned) staging region, the forward on
 * the compute stream writing the captured layers straight into their column
 * slices of a [T, k*H] device buffer, and the D2H copy of that buffer into
 * the staging region's hidden part on the copy stream. So the forward of
 * batch k+1 runs while batch k is copied out and sent.
 *
 * Without CUDA, create returns HS_ERR_UNSUPPORTED. */
#ifndef HS_GPU_WORKER_INT_H
#define HS_GPU_WORKER_INT_H

#include <stdint.h>
#include <stdbool.h>

#include "hsflow.h"
#include "hs_proto.h"
#include "hs_model.h"

typedef struct hs__gpu_worker hs__gpu_worker_t;

/* `staging` are the two host buffers of `staging_bytes` each that this
 * worker's batches are built in; they are pinned here (unpinned at destroy). */
HS_MUST_CHECK hs_status_t hs__gpu_worker_create(hs_model_t *model, int device,
                                                uint32_t token_budget, uint32_t max_seqs,
                                                const hs_layout_t *layout, void *const staging[2],
                                                uint64_t staging_bytes, hs__gpu_worker_t **out);
void hs__gpu_worker_destroy(hs__gpu_worker_t *w); /* NULL ok */

/* Queues batch `slot` (0/1: the staging buffer and device buffer it uses)
 * whose metadata (ids, cu_seqlens) is already in `view`. */
HS_MUST_CHECK hs_status_t hs__gpu_batch_launch(hs__gpu_worker_t *w, int slot,
                                               const hs_batch_view_t *view, uint32_t n_seqs,
                                               uint32_t n_tokens);
/* Whether batch `slot`'s hidden states are already in its staging buffer
 * (does not wait). */
bool hs__gpu_batch_done(hs__gpu_worker_t *w, int slot);
/* A batch's GPU times (CUDA events): its forward, and its device-to-host
 * copy of d2h_bytes into the staging buffer (a shared-memory ring's, over
 * --transport shm). */
typedef struct {
    double forward_ms, d2h_ms;
    uint64_t d2h_bytes;
} hs__gpu_batch_times_t;

/* Waits until batch `slot`'s hidden states are in its staging buffer. */
HS_MUST_CHECK hs_status_t hs__gpu_batch_wait(hs__gpu_worker_t *w, int slot,
                                             hs__gpu_batch_times_t *times);

#endif /* HS_GPU_WORKER_INT_H */
