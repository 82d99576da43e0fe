/* SPDX-License-Identifier: Apache-2.0 */
/* hs_proto.h - hsflow's wire format: the batch region and the control frames.
 *
 * Nothing outside proto/ parses bytes that came from the network or from a
 * batch region; everything here bounds-checks its input and returns a status.
 *
 * Ownership: functions that fill caller buffers never allocate; decoded
 * protobuf messages are owned by the caller and freed with the matching
 * hs_msg_free(). */
#ifndef HS_PROTO_H
#define HS_PROTO_H

#include "hs_common.h"
/* The Hsflow__* message types, generated from hsflow.proto by protoc-c into
 * the build tree (see "Control messages" below). */
#include "hsflow.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * Layout: what every batch of a run carries (agreed in the handshake).
 * Layers are Hugging Face output_hidden_states indices (0 = embeddings,
 * i = output of decoder layer i-1, N = final normed output).
 * ==================================================================== */

#define HS_MAX_LAYERS 32
#define HS_DTYPE_BF16 1u
/* float8_e4m3fn values and one fp32 scale per token over all of its k*H
 * values (amax / 448, as speculators stores hidden states): half the bytes */
#define HS_DTYPE_FP8 2u

typedef struct {
    uint32_t hidden_size;          /* H */
    uint32_t dtype;                /* HS_DTYPE_BF16 or HS_DTYPE_FP8 */
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
/* "bf16", "fp8" (or "?"), and back: HS_ERR_INVALID for another name. */
const char *hs_dtype_str(uint32_t dtype);
HS_MUST_CHECK hs_status_t hs_dtype_parse(const char *s, uint32_t *out);
/* Hidden-state values per token: k * H. */
static inline uint64_t hs_layout_row_elems(const hs_layout_t *l)
{
    return (uint64_t)l->n_layers * l->hidden_size;
}
/* Bytes of hidden state per token: k * H * 2 in bf16, k * H + 4 (its
 * scale) in fp8. */
static inline uint64_t hs_layout_token_bytes(const hs_layout_t *l)
{
    return l->dtype == HS_DTYPE_FP8 ? hs_layout_row_elems(l) + 4u : hs_layout_row_elems(l) * 2u;
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

/* ======================================================================
 * Control frames (DESIGN §3):
 *   magic u32 | version u16 | type u16 | body_len u32 | crc32c(body) u32
 * followed by body_len bytes of a protobuf message from hsflow.proto.
 * ==================================================================== */

#define HS_FRAME_MAGIC 0x46534848u /* "HHSF" little-endian */
#define HS_PROTO_VERSION 2u        /* 2: HELLO's plan_basis and target_fingerprint */
#define HS_FRAME_HEADER_BYTES 16u
#define HS_FRAME_MAX_BODY (4u << 20) /* larger bodies are rejected before allocating */

/* Frame types; each carries the hsflow.proto message of the same name. */
typedef enum {
    HS_MSG_HELLO = 1,      /* producer -> consumer: identity, layout, plan hash/shape */
    HS_MSG_AUTH = 2,       /* producer -> consumer: HMAC over the consumer's challenge */
    HS_MSG_WELCOME = 3,    /* consumer -> producer: accepted, session id, epochs, resume */
    HS_MSG_TICKET = 4,     /* consumer -> producer: compute (epoch, index) into slot, B bytes */
    HS_MSG_DONE = 5,       /* producer -> consumer: ticket finished; payload follows */
    HS_MSG_STATS = 6,      /* producer -> consumer: producer-side figures */
    HS_MSG_ERROR = 7,      /* either way: code + text, then close */
    HS_MSG_BYE = 8,        /* consumer -> producer: run over; producer -> consumer: leaving */
    HS_MSG_PLAN = 9,       /* producer -> consumer: a page of the plan's batch shapes */
    HS_MSG_CHALLENGE = 10, /* consumer -> producer: nonce to sign */
    HS_MSG_RANKS = 11,     /* either way: consumers of the run and their ranks */
    HS_MSG_TYPE_MAX = 11
} hs_msg_type_t;

const char *hs_msg_type_str(uint16_t type);

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t body_len;
    uint32_t body_crc;
} hs_frame_header_t;

/* Writes the 16-byte header for `body` (crc computed here). */
void hs_frame_header_encode(uint8_t out[HS_FRAME_HEADER_BYTES], uint16_t type, const void *body,
                            uint32_t body_len);
/* Parses and checks magic, version, type range and body_len <= max_body.
 * On failure says what was wrong in why[whycap]; `out` is set only on success. */
HS_MUST_CHECK hs_status_t hs_frame_header_decode(const uint8_t in[HS_FRAME_HEADER_BYTES],
                                                 uint32_t max_body, hs_frame_header_t *out,
                                                 char *why, size_t whycap);
/* Checks the body's crc32c against the header. */
HS_MUST_CHECK hs_status_t hs_frame_body_check(const hs_frame_header_t *h, const void *body,
                                              char *why, size_t whycap);

/* ======================================================================
 * Control messages: the Hsflow__* messages of hsflow.proto packed into and
 * unpacked from complete frames. A frame of type HS_MSG_X carries exactly
 * the message Hsflow__X.
 * ==================================================================== */

#define HS_AUTH_NONCE_BYTES 32u
#define HS_AUTH_MAC_BYTES 32u
#define HS_MSG_NAME_MAX 256u      /* producer and consumer names, bytes */
#define HS_MSG_TEXT_MAX 4096u     /* error text, bye reason, target name, bytes */
#define HS_MSG_MAX_WORKERS 4096u  /* workers one producer may report */
#define HS_MSG_MAX_PREFETCH 1024u /* tickets per worker a HELLO or WELCOME may name */
#define HS_MSG_MAX_CLAIMS 256u    /* rank claims in one RANKS */
/* Batches per epoch a plan may have (HELLO's n_batches): 16 Mi batches is
 * over 10^12 tokens an epoch at a 65,536-token budget, and the consumer's
 * per-batch state for it (about 48 bytes a batch) stays under 1 GiB. */
#define HS_PLAN_MAX_BATCHES (1u << 24)
/* Batches per PLAN page: each entry costs at most 10 bytes on the wire, so a
 * full page stays far below HS_FRAME_MAX_BODY. */
#define HS_PLAN_PAGE_MAX 262144u

/* The message descriptor a frame of `type` carries; NULL for an unknown type. */
const ProtobufCMessageDescriptor *hs_msg_descriptor(uint16_t type);

/* Bytes of the whole frame (header + body) that hs_msg_pack would write. */
size_t hs_msg_frame_size(const ProtobufCMessage *msg);

/* Validates `msg` (the same checks as hs_msg_unpack) and writes header + body
 * into buf[cap]; *frame_len is set only on success. HS_ERR_INVALID when msg
 * is not the message of `type` or fails validation (logged: a local bug),
 * HS_ERR_NOSPACE when the frame does not fit cap or the body exceeds
 * HS_FRAME_MAX_BODY. */
HS_MUST_CHECK hs_status_t hs_msg_pack(uint16_t type, const ProtobufCMessage *msg, uint8_t *buf,
                                      size_t cap, size_t *frame_len);

/* Field checks for a decoded message of `type`: lengths of nonces and MACs,
 * layout layer counts, plan page arrays, string sizes, counts. Names the bad
 * field in why. HS_ERR_FORMAT on failure. */
HS_MUST_CHECK hs_status_t hs_msg_validate(uint16_t type, const ProtobufCMessage *msg, char *why,
                                          size_t whycap);

/* Decodes the body of a frame of `type` (header already decoded and body crc
 * checked) and validates it. On success *out is a new message the caller
 * frees with hs_msg_free(); cast it to the Hsflow__* type of `type`.
 * HS_ERR_FORMAT (undecodable or invalid, reason in why) or HS_ERR_NOMEM. */
HS_MUST_CHECK hs_status_t hs_msg_unpack(uint16_t type, const uint8_t *body, uint32_t len,
                                        ProtobufCMessage **out, char *why, size_t whycap);

/* Everything at once for a complete frame in frame[len]: header decode, body
 * length, crc and unpack. *type and *out are set only on success. */
HS_MUST_CHECK hs_status_t hs_msg_decode_frame(const uint8_t *frame, size_t len, uint16_t *type,
                                              ProtobufCMessage **out, char *why, size_t whycap);

/* Frees a message from hs_msg_unpack; NULL is fine. */
void hs_msg_free(ProtobufCMessage *msg);

/* ---- decoding without the heap ----------------------------------------- */

/* An arena that the messages of every batch (TICKET, DONE) are decoded into,
 * so that the data path allocates nothing: a ProtobufCAllocator over storage
 * of its own, owned by one thread (one per connection or per network thread)
 * and holding one message at a time. What does not fit (a message with many
 * unknown fields, or a second message while one is alive) comes from the
 * heap instead and is counted in heap_allocs; hs_msg_free_in() frees that
 * part and makes the arena whole again. */
#define HS_MSG_ARENA_BYTES 1024u
typedef struct {
    ProtobufCAllocator alloc; /* allocator_data points at this arena */
    size_t used;              /* bytes of buf handed out to the live message */
    bool live;                /* the message decoded here (top) is not freed yet */
    ProtobufCMessage *top;
    uint64_t heap_allocs;                 /* allocations that did not fit buf (tests, logs) */
    uint64_t buf[HS_MSG_ARENA_BYTES / 8]; /* handed out in 8-byte aligned pieces */
} hs_msg_arena_t;

/* Readies an arena (it holds no memory outside itself: nothing to destroy). */
void hs_msg_arena_init(hs_msg_arena_t *a);

/* hs_msg_unpack() with the message's memory from arena `a` (NULL: the heap,
 * as hs_msg_unpack). The caller frees *out with hs_msg_free_in(a, *out). */
HS_MUST_CHECK hs_status_t hs_msg_unpack_in(hs_msg_arena_t *a, uint16_t type, const uint8_t *body,
                                           uint32_t len, ProtobufCMessage **out, char *why,
                                           size_t whycap);
/* Frees a message from hs_msg_unpack_in(a, ...); NULL is fine. */
void hs_msg_free_in(hs_msg_arena_t *a, ProtobufCMessage *msg);

/* An ERROR frame with `code` and `text` (cut to HS_MSG_TEXT_MAX - 1 bytes). */
HS_MUST_CHECK hs_status_t hs_msg_error_frame(hs_status_t code, const char *text, uint8_t *buf,
                                             size_t cap, size_t *frame_len);

/* Fills `msg` (initialised here) from `layout`, including its layout id.
 * msg->layers points into layers_storage[HS_MAX_LAYERS], which the caller
 * keeps alive as long as msg. */
void hs_layout_to_msg(const hs_layout_t *layout, Hsflow__Layout *msg, int32_t *layers_storage);
/* Converts and checks a received layout: ranges (HS_ERR_FORMAT) and that its
 * layout_id is the id of its fields (HS_ERR_MISMATCH). *out set on success. */
HS_MUST_CHECK hs_status_t hs_layout_from_msg(const Hsflow__Layout *msg, hs_layout_t *out, char *why,
                                             size_t whycap);

/* ======================================================================
 * Authentication over a shared secret (libsodium).
 *
 *   producer HELLO(client_nonce) -> consumer CHALLENGE(server_nonce)
 *   -> producer AUTH(mac = HMAC-SHA256(key, "hsflow-producer" || server_nonce
 *                                      || client_nonce || SHA-256(hello body)))
 *   -> consumer WELCOME(server_mac = HMAC-SHA256(key, "hsflow-consumer"
 *                                      || client_nonce || server_nonce))
 *
 * Both nonces are fresh per connection, so a recorded proof is useless on
 * another connection; hashing the HELLO body binds the proof to what the
 * producer announced.
 * ==================================================================== */

typedef struct {
    uint8_t bytes[32]; /* BLAKE2b-256 of the secret file's content */
} hs_auth_key_t;

/* Initialises libsodium once (thread-safe); every hs_auth_* calls it. */
HS_MUST_CHECK hs_status_t hs_auth_init(void);
/* Reads the shared secret from `path`: at least 16 bytes once a trailing
 * newline is removed, hashed into *key. HS_ERR_IO when it cannot be read,
 * HS_ERR_INVALID when too short or too long, or not a regular file (a FIFO
 * is refused without waiting for a writer); all logged. Warns when group
 * or others may read the file. */
HS_MUST_CHECK hs_status_t hs_auth_load_secret(const char *path, hs_auth_key_t *key);
/* Wipes a key; NULL is fine. */
void hs_auth_key_clear(hs_auth_key_t *key);
/* HS_AUTH_NONCE_BYTES random bytes. */
HS_MUST_CHECK hs_status_t hs_auth_nonce(uint8_t out[HS_AUTH_NONCE_BYTES]);
/* The producer's proof over the consumer's challenge (see above). */
HS_MUST_CHECK hs_status_t hs_auth_producer_mac(const hs_auth_key_t *key,
                                               const uint8_t server_nonce[HS_AUTH_NONCE_BYTES],
                                               const uint8_t client_nonce[HS_AUTH_NONCE_BYTES],
                                               const void *hello_body, size_t hello_len,
                                               uint8_t mac[HS_AUTH_MAC_BYTES]);
/* The consumer's proof, returned in WELCOME. */
HS_MUST_CHECK hs_status_t hs_auth_consumer_mac(const hs_auth_key_t *key,
                                               const uint8_t client_nonce[HS_AUTH_NONCE_BYTES],
                                               const uint8_t server_nonce[HS_AUTH_NONCE_BYTES],
                                               uint8_t mac[HS_AUTH_MAC_BYTES]);
/* Constant-time comparison: HS_OK when equal, HS_ERR_AUTH otherwise. */
HS_MUST_CHECK hs_status_t hs_auth_verify(const uint8_t a[HS_AUTH_MAC_BYTES],
                                         const uint8_t b[HS_AUTH_MAC_BYTES]);

#ifdef __cplusplus
}
#endif
#endif /* HS_PROTO_H */
