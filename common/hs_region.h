/* SPDX-License-Identifier: Apache-2.0 */
/* hs_region.h - the batch region: the layout every batch of a run carries,
 * one token's fp8 row, and the contiguous little-endian block per batch
 * (offsets, header, typed views, seal/verify, synthetic hidden states).
 *
 * No protobuf: the dataset plan fills regions through these views without
 * the wire messages of proto/ (hs_proto.h includes this header).
 *
 * Ownership: nothing here allocates; views alias a region the caller owns.
 * Everything that reads a region bounds-checks it and returns a status. */
#ifndef HS_REGION_H
#define HS_REGION_H

#include <stdint.h>
#include <stddef.h>

#include "hsflow.h"
#include "hs_checksum.h"
#include "hs_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Layout: what every batch of a run carries (agreed in the handshake).
 * Layers are Hugging Face output_hidden_states indices (0 = embeddings,
 * i = output of decoder layer i-1, N = final normed output).
 * ==================================================================== */

#define HS_MAX_LAYERS 32

typedef struct {
    uint32_t hidden_size;          /* H */
    uint32_t dtype;                /* hs_dtype_t: HS_DTYPE_BF16 or HS_DTYPE_FP8 */
    uint32_t n_layers;             /* k, 1..HS_MAX_LAYERS */
    int32_t layers[HS_MAX_LAYERS]; /* captured indices, strictly increasing */
} hs_layout_t;

/* Validates ranges (H in 1..65536, k in 1..HS_MAX_LAYERS, indices >= 0 and
 * strictly increasing, known dtype). */
HS_MUST_CHECK hs_status_t hs_layout_check(const hs_layout_t *layout);
/* Same checks, without logging: the reason goes to why[whycap]. */
HS_MUST_CHECK hs_status_t hs_layout_validate(const hs_layout_t *layout, char *why, size_t whycap);
/* Stable 64-bit id of a layout (XXH3 of its canonical little-endian form). */
uint64_t hs_layout_id(const hs_layout_t *layout);
/* "H=4096 dtype=bf16 layers=[2,16,29]" into buf. */
void hs_layout_describe(const hs_layout_t *layout, char *buf, size_t cap);
/* The layout as a flag value, "H=4096,layers=2,16,29,dtype=bf16" (the form
 * hs-consumer --expect-layout takes and hs-data plan prints), into buf. */
void hs_layout_spec(const hs_layout_t *layout, char *buf, size_t cap);
/* Parses that form: H=, layers= and dtype= in any order, each once, H and
 * layers required, dtype bf16 (the default) or fp8; the numbers after layers= run
 * up to the next key. A valid layout into *out, or HS_ERR_INVALID with the
 * reason in why[whycap] (nothing logged). */
HS_MUST_CHECK hs_status_t hs_layout_parse(const char *spec, hs_layout_t *out, char *why,
                                          size_t whycap);
/* Hidden-state values per token: k * H. */
static inline uint64_t hs_layout_row_elems(const hs_layout_t *l)
{
    return (uint64_t)l->n_layers * l->hidden_size;
}
/* Bytes of hidden state per token, from the dtype table: k * H * 2 in
 * bf16, k * H + 4 (its scale) in fp8 (an unknown dtype counts as bf16). */
static inline uint64_t hs_layout_token_bytes(const hs_layout_t *l)
{
    const hs_dtype_info_t *d = hs_dtype_info(l->dtype);
    return d ? hs_layout_row_elems(l) * d->elem_bytes + d->row_scale_bytes
             : hs_layout_row_elems(l) * 2u;
}

/* fp8 rows (HS_DTYPE_FP8): one token's n = k*H values with one scale.
 * Quantising takes bf16 values: scale = amax / 448 (1 for a row of zeros),
 * q[i] = e4m3(x[i] / scale) rounded to nearest even (hs_fp8_from_f32);
 * HS_ERR_INVALID, with *bad the index, for a NaN or infinite value (nothing
 * else written is meaningful then). Dequantising gives bf16(e4m3(q) *
 * scale), rounded to nearest even; the CUDA twins in kernels/fp8.cu give
 * the same bits. */
HS_MUST_CHECK hs_status_t hs_fp8_quantize_row_bf16(const uint16_t *x, uint64_t n, uint8_t *q,
                                                   float *scale, uint64_t *bad);
void hs_fp8_dequantize_row_bf16(const uint8_t *q, uint64_t n, float scale, uint16_t *out);
/* Whether a received row can be dequantised into what its producer meant:
 * the scale finite, not negative (-0 included), 448 * scale within bf16, a
 * scale of 0 only over codes that are all +-0, and no NaN code (0x7f, 0xff).
 * Every row a quantiser above writes passes. HS_OK, or HS_ERR_FORMAT with
 * the reason in why[whycap]. */
HS_MUST_CHECK hs_status_t hs_fp8_row_check(const uint8_t *q, uint64_t n, float scale, char *why,
                                           size_t whycap);

/* ======================================================================
 * Batch region: one contiguous little-endian block per batch.
 *
 *   [header 256 B][cu_seqlens i32 x n+1][sample_ids u64 x n]
 *   [input_ids i32 x T][loss_mask u8 x T][hidden bf16 x T*k*H]
 *
 * every part starting on a HS_BATCH_ALIGN boundary; total size rounded up to
 * HS_BATCH_ALIGN. The checksum is hs_checksum64() over bytes
 * [HS_BATCH_HEADER_BYTES, total_bytes); header fields are checked one by one
 * against the ticket instead.
 * ==================================================================== */

#define HS_BATCH_MAGIC 0x31425348u /* "HSB1" little-endian */
#define HS_BATCH_VERSION 1u
#define HS_BATCH_ALIGN 256u
#define HS_BATCH_HEADER_BYTES 256u

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t dtype;
    uint32_t epoch;
    uint32_t index;       /* batch index within the epoch's plan */
    uint32_t n_seqs;      /* n */
    uint32_t n_tokens;    /* T */
    uint32_t hidden_size; /* H */
    uint32_t n_layers;    /* k */
    uint64_t layout_id;
    uint64_t total_bytes;
    uint64_t checksum; /* hs_checksum64 of the body */
    uint64_t plan_hash;
    uint8_t reserved[HS_BATCH_HEADER_BYTES - 64];
} hs_batch_header_t;

/* Byte offsets of each part inside the region. */
typedef struct {
    /* scales == total (no bytes) in bf16 */
    uint64_t cu_seqlens, sample_ids, input_ids, loss_mask, hidden, scales, total;
} hs_batch_offsets_t;

/* Offsets for a batch of n sequences and T tokens in `layout`. */
hs_batch_offsets_t hs_batch_offsets(uint32_t n_seqs, uint32_t n_tokens, const hs_layout_t *layout);
/* Same as hs_batch_offsets(...).total. */
uint64_t hs_batch_bytes(uint32_t n_seqs, uint32_t n_tokens, const hs_layout_t *layout);

/* Typed views into a region; pointers alias `region`, which the caller owns. */
typedef struct hs_batch_view {
    hs_batch_header_t *header;
    int32_t *cu_seqlens;
    uint64_t *sample_ids;
    int32_t *input_ids;
    uint8_t *loss_mask;
    uint16_t *hidden;    /* bf16: bf16 bits, [T][k*H]; fp8: NULL */
    uint8_t *hidden_fp8; /* fp8: e4m3 bytes, [T][k*H]; bf16: NULL */
    float *scales;       /* fp8: [T] one scale per token; bf16: NULL */
} hs_batch_view_t;

hs_batch_view_t hs_batch_view(void *region, uint32_t n_seqs, uint32_t n_tokens,
                              const hs_layout_t *layout);

/* Writes the header fields (everything but checksum, which is 0). */
void hs_batch_header_init(hs_batch_header_t *h, uint32_t epoch, uint32_t index, uint32_t n_seqs,
                          uint32_t n_tokens, const hs_layout_t *layout, uint64_t plan_hash);
/* Computes the body checksum and stores it in the header (batches of 64 MiB
 * and more with up to 4 threads). */
void hs_batch_seal(void *region, uint64_t total_bytes);

/* Checks a received region of `bytes` bytes against what its ticket said:
 * magic, version, epoch, index, n, T, layout id, total size, cu_seqlens
 * monotone from 0 to T, and the checksum. Returns HS_ERR_FORMAT,
 * HS_ERR_MISMATCH or HS_ERR_CHECKSUM with the reason in why[whycap]. */
HS_MUST_CHECK hs_status_t hs_batch_verify(const void *region, uint64_t bytes, uint32_t epoch,
                                          uint32_t index, uint32_t n_seqs, uint32_t n_tokens,
                                          const hs_layout_t *layout, char *why, size_t whycap);
/* The same, with the body's checksum (hs_checksum64 of the region after its
 * header) already computed from the region as it is now, e.g. while it was
 * copied in (hs_tp_recv_payload_sum); NULL body_sum = compute it here. */
HS_MUST_CHECK hs_status_t hs_batch_verify_sum(const void *region, uint64_t bytes, uint32_t epoch,
                                              uint32_t index, uint32_t n_seqs, uint32_t n_tokens,
                                              const hs_layout_t *layout, const uint64_t *body_sum,
                                              char *why, size_t whycap);

/* Synthetic hidden states: bf16 bits that are a deterministic function of
 * (sample id, layer index, token position within its sequence, channel);
 * in an fp8 layout, each token's row of them quantised as every producer
 * quantises (hs_fp8_quantize_row_bf16). hs_batch_synth_fill writes the
 * hidden part of a view whose cu_seqlens and sample_ids are already set;
 * hs_batch_synth_check compares every element (and scale) and reports the
 * first mismatch in why. */
/* (hs_synth_value, the value of one element, is public: hsflow.h.) */
void hs_batch_synth_fill(hs_batch_view_t *v, const hs_layout_t *layout);
/* hs_batch_synth_fill + hs_batch_seal in one pass: each row is hashed right
 * after it is written (one trip through memory instead of two). The header
 * must be initialised; `cs` is scratch owned by the caller. */
void hs_batch_synth_fill_seal(hs_batch_view_t *v, const hs_layout_t *layout, uint64_t total_bytes,
                              hs_checksum_stream_t *cs);
HS_MUST_CHECK hs_status_t hs_batch_synth_check(const hs_batch_view_t *v, const hs_layout_t *layout,
                                               char *why, size_t whycap);

#ifdef __cplusplus
}
#endif

#endif /* HS_REGION_H */
