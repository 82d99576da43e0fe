/* SPDX-License-Identifier: Apache-2.0 */
/* hs_proto.h - hsflow's wire format: the control frames, and (through
 * hs_region.h, in common/) the batch region they announce.
 *
 * Nothing outside proto/ and hs_region.h parses bytes that came from the
 * network or from a batch region; everything here bounds-checks its input
 * and returns a status.
 *
 * Ownership: functions that fill caller buffers never allocate; decoded
 * protobuf messages are owned by the caller and freed with the matching
 * hs_msg_free(). */
#ifndef HS_PROTO_H
#define HS_PROTO_H

#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>

#include "hsflow.h"
/* The layout, fp8 rows and the batch region: no protobuf. */
#include "hs_region.h"
/* The Hsflow__* message types, generated from hsflow.proto by protoc-c into
 * the build tree (see "Control messages" below). */
#include "hsflow.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

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
