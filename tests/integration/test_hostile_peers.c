/* SPDX-License-Identifier: Apache-2.0 */
/* test_hostile_peers.c - an in-process consumer facing hostile raw-socket
 * peers that speak (or abuse) the TCP wire format of transport/tcp.c: each
 * bad peer must get an ERROR frame or be cut off, and afterwards a real
 * producer (hs_producer_run in a thread) must complete the run with every
 * batch of every epoch delivered exactly once.
 *
 * A trainer thread takes every batch with hs_consumer_next(), checks it again
 * (header, checksum and every synthetic element) and counts each
 * (epoch, batch) it sees: a write outside a granted slot would corrupt a batch
 * that was already verified, and this second check would catch it.
 *
 * Peers that go through the handshake use the very plan the real producer
 * will build (same dataset, same planner), so the run they define is the one
 * the producer joins. */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/jsonl_fixture.h"
#include "hsflow.h"
#include "hs_producer.h"
#include "hs_data.h"
#include "hs_status.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_bytes.h"
#include "hs_memory.h"

#define EPOCHS 2u
#define BUDGET 256u
#define HIDDEN 32u
#define N_SEQS 60u
#define RECV_TIMEOUT_S 10 /* a guard against hanging, not a timing assertion */

extern char **environ;
static const char *g_producer_bin; /* the hs-producer binary (argv[1]) */

/* ---- fixture: a small dataset and its plan, built once ---------------------- */

static char g_dir[256];
static char g_data[300];
static hs_dataset_t *g_ds;
static hs_plan_t *g_plan;
static hs_layout_t g_layout;

static void fixture_setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    hs_test_tmpdir(g_dir, sizeof g_dir, "hs-hostile");
    snprintf(g_data, sizeof g_data, "%s/data.jsonl", g_dir);
    hs_test_write_jsonl(g_data, N_SEQS, 180, 12345);
    ck_assert_int_eq(hs_dataset_open(g_data, &g_ds), HS_OK);
    hs_plan_config_t pc = {
        .token_budget = BUDGET, .max_seq_len = 0, .overflow = HS_OVERFLOW_TRUNCATE, .seed = 7};
    ck_assert_int_eq(hs_plan_build(g_ds, &pc, &g_plan), HS_OK);
    ck_assert_uint_ge(hs_plan_n_batches(g_plan), 4);
    memset(&g_layout, 0, sizeof g_layout);
    g_layout.hidden_size = HIDDEN;
    g_layout.dtype = HS_DTYPE_BF16;
    g_layout.n_layers = 2;
    g_layout.layers[0] = 1;
    g_layout.layers[1] = 3;
}

static void fixture_teardown(void)
{
    hs_plan_destroy(g_plan);
    hs_dataset_close(g_ds);
    unlink(g_data);
    rmdir(g_dir);
}

/* ---- the consumer under attack, with a checking trainer thread --------------- */

typedef struct {
    hs_consumer_t *c;
    pthread_t trainer;
    atomic_bool stop;
    uint32_t n_batches;
    hs_order_t order;
    uint32_t *seen;     /* [EPOCHS][n_batches] deliveries */
    uint32_t *sequence; /* epoch * n_batches + batch, in delivery order */
    atomic_uint delivered, out_of_range, bad;
    char bad_why[256];
    bool corrupt_peers; /* peers send corrupt batches: checksum failures expected */
} harness_t;

static void *trainer_main(void *arg)
{
    harness_t *h = arg;
    while (!atomic_load(&h->stop)) {
        hs_batch_t b;
        hs_status_code_t st = hs_consumer_next(h->c, &b, 100);
        if (st == HS_ERR_TIMEOUT) continue;
        if (st != HS_OK) break; /* HS_ERR_CLOSED: every batch delivered */
        atomic_fetch_add(&h->delivered, 1);
        if (b.epoch >= EPOCHS || b.batch >= h->n_batches) {
            atomic_fetch_add(&h->out_of_range, 1);
        } else {
            uint32_t k = atomic_load(&h->delivered) - 1;
            if (k < EPOCHS * h->n_batches) h->sequence[k] = b.epoch * h->n_batches + b.batch;
            h->seen[b.epoch * h->n_batches + b.batch]++;
            /* The region starts hs_batch_offsets().cu_seqlens bytes before cu_seqlens. */
            hs_batch_offsets_t off = hs_batch_offsets(b.n_seqs, b.n_tokens, &g_layout);
            uint8_t *region = (uint8_t *)(uintptr_t)b.cu_seqlens - off.cu_seqlens;
            char why[256] = "";
            hs_status_t v = hs_batch_verify(region, b.bytes, b.epoch, b.batch, b.n_seqs, b.n_tokens,
                                            &g_layout, why, sizeof why);
            if (v == HS_OK) {
                hs_batch_view_t view = hs_batch_view(region, b.n_seqs, b.n_tokens, &g_layout);
                v = hs_batch_synth_check(&view, &g_layout, why, sizeof why);
            }
            if (v != HS_OK && atomic_fetch_add(&h->bad, 1) == 0)
                snprintf(h->bad_why, sizeof h->bad_why, "batch %u/%u: %s", b.epoch, b.batch, why);
        }
        ck_assert_int_eq(hs_consumer_release(h->c, &b), HS_OK);
    }
    return NULL;
}

/* Consumer settings a test changes; zero fields keep the harness's own. */
typedef struct {
    const char *journal;
    uint64_t cache_bytes;
    double lease_timeout_s;
    double handshake_timeout_s;
} harness_opts_t;

static void harness_start_ex(harness_t *h, hs_order_t order, const harness_opts_t *o)
{
    memset(h, 0, sizeof *h);
    hs_consumer_config_t cfg;
    hs_consumer_config_default(&cfg);
    cfg.listen_host = "127.0.0.1";
    cfg.listen_port = 0;
    cfg.cache_bytes = o && o->cache_bytes ? o->cache_bytes : 64ull << 20;
    cfg.journal = o ? o->journal : NULL;
    if (o && o->lease_timeout_s > 0) cfg.lease_timeout_s = o->lease_timeout_s;
    if (o && o->handshake_timeout_s > 0) cfg.handshake_timeout_s = o->handshake_timeout_s;
    cfg.epochs = EPOCHS;
    cfg.order = order;
    cfg.verify_synthetic = true;
    cfg.transport = "tcp"; /* the raw peers speak the TCP framing */
    ck_assert_int_eq(hs_consumer_create(&cfg, &h->c), HS_OK);
    ck_assert_uint_ne(hs_consumer_port(h->c), 0);
    h->n_batches = hs_plan_n_batches(g_plan);
    h->order = order;
    h->seen = calloc((size_t)EPOCHS * h->n_batches, sizeof(uint32_t));
    h->sequence = calloc((size_t)EPOCHS * h->n_batches, sizeof(uint32_t));
    ck_assert_ptr_nonnull(h->seen);
    ck_assert_ptr_nonnull(h->sequence);
    ck_assert_int_eq(pthread_create(&h->trainer, NULL, trainer_main, h), 0);
}

static void harness_start(harness_t *h, hs_order_t order) { harness_start_ex(h, order, NULL); }

typedef struct {
    uint16_t port;
    hs_status_t result;
} producer_arg_t;

static void *producer_main(void *arg)
{
    producer_arg_t *a = arg;
    hs_producer_config_t cfg;
    hs_producer_config_default(&cfg);
    cfg.to_host = "127.0.0.1";
    cfg.to_port = a->port;
    cfg.data_path = g_data;
    cfg.token_budget = BUDGET;
    cfg.seed = 7;
    cfg.layout = g_layout;
    cfg.source = HS_SOURCE_SYNTHETIC;
    cfg.n_workers = 2;
    cfg.gpu_ids[0] = cfg.gpu_ids[1] = -1;
    cfg.transport = "tcp";
    cfg.connect_timeout_s = 10;
    cfg.name = "real-producer";
    a->result = hs_producer_run(&cfg);
    return NULL;
}

/* With --order plan the trainer saw epoch 0 in its plan order, then epoch 1
 * in its own, whatever the peers did. */
static void harness_check_order(const harness_t *h)
{
    if (h->order != HS_ORDER_PLAN) return;
    uint32_t *order = calloc(h->n_batches, sizeof(uint32_t));
    ck_assert_ptr_nonnull(order);
    for (uint32_t e = 0; e < EPOCHS; e++) {
        hs_plan_epoch_order(g_plan, e, order);
        for (uint32_t i = 0; i < h->n_batches; i++) {
            uint32_t got = h->sequence[e * h->n_batches + i];
            ck_assert_msg(got == e * h->n_batches + order[i],
                          "plan order broken at delivery %u: got batch %u/%u, plan says %u/%u",
                          e * h->n_batches + i, got / h->n_batches, got % h->n_batches, e,
                          order[i]);
        }
    }
    free(order);
}

/* Runs a real producer to the end, then checks that the whole run arrived
 * exactly once and intact; *out gets the consumer's final figures. */
static void harness_finish(harness_t *h, hs_consumer_stats_t *out)
{
    producer_arg_t pa = {.port = hs_consumer_port(h->c), .result = HS_ERR_INVALID};
    pthread_t pt;
    ck_assert_int_eq(pthread_create(&pt, NULL, producer_main, &pa), 0);
    pthread_join(pt, NULL);
    if (pa.result != HS_OK) atomic_store(&h->stop, true);
    pthread_join(h->trainer, NULL);
    hs_consumer_stats(h->c, out);
    hs_consumer_destroy(h->c);
    h->c = NULL;

    ck_assert_msg(pa.result == HS_OK, "the real producer ended with %s after the hostile peers",
                  hs_status_str(pa.result));
    ck_assert_msg(atomic_load(&h->bad) == 0, "a delivered batch was corrupt: %s", h->bad_why);
    ck_assert_uint_eq(atomic_load(&h->out_of_range), 0);
    uint64_t planned = (uint64_t)EPOCHS * h->n_batches;
    ck_assert_uint_eq(out->batches_planned, planned);
    ck_assert_uint_eq(out->batches_delivered, planned);
    ck_assert_uint_eq(atomic_load(&h->delivered), planned);
    for (uint32_t i = 0; i < EPOCHS * h->n_batches; i++)
        ck_assert_msg(h->seen[i] == 1, "batch %u of epoch %u delivered %u times", i % h->n_batches,
                      i / h->n_batches, h->seen[i]);
    ck_assert_uint_eq(out->duplicates, 0);
    if (!h->corrupt_peers) ck_assert_uint_eq(out->checksum_failures, 0);
    ck_assert_msg(out->producers_dropped <= out->producers_seen,
                  "%llu producers dropped of %llu seen: a peer was counted twice",
                  (unsigned long long)out->producers_dropped,
                  (unsigned long long)out->producers_seen);
    ck_assert(out->finished);
    /* Slots of dropped peers came back: nothing is left reserved. */
    ck_assert_uint_le(out->cache_high_water, out->cache_capacity);
    ck_assert_uint_eq(out->cache_used, 0);
    harness_check_order(h);
    free(h->seen);
    free(h->sequence);
}

/* ---- a raw peer speaking the TCP framing ------------------------------------- */

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct timeval tv = {.tv_sec = RECV_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s",
                  strerror(errno));
    return fd;
}

/* Best effort: the consumer may already have cut us off. */
static bool raw_send(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        len -= (size_t)w;
    }
    return true;
}

/* Transport prefix (payload_len) + a packed frame of `type`. */
static size_t raw_build(uint8_t *buf, size_t cap, uint16_t type, const ProtobufCMessage *m,
                        uint64_t payload_len)
{
    size_t len;
    ck_assert_int_eq(hs_msg_pack(type, m, buf + 8, cap - 8, &len), HS_OK);
    hs_le64_store(buf, payload_len);
    return len + 8;
}

static bool raw_send_msg(int fd, uint16_t type, const ProtobufCMessage *m, uint64_t payload_len)
{
    static uint8_t buf[HS_FRAME_MAX_BODY + 64];
    size_t n = raw_build(buf, sizeof buf, type, m, payload_len);
    return raw_send(fd, buf, n);
}

/* Packs `m` with protobuf-c directly, skipping hs_msg_pack()'s field checks,
 * into a frame with a correct header and crc: what a buggy or hostile
 * producer could send. */
static bool raw_send_unchecked(int fd, uint16_t type, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(8 + HS_FRAME_HEADER_BYTES + n + 1);
    ck_assert_ptr_nonnull(buf);
    hs_le64_store(buf, 0);
    protobuf_c_message_pack(m, buf + 8 + HS_FRAME_HEADER_BYTES);
    hs_frame_header_encode(buf + 8, type, buf + 8 + HS_FRAME_HEADER_BYTES, (uint32_t)n);
    bool ok = raw_send(fd, buf, 8 + HS_FRAME_HEADER_BYTES + n);
    free(buf);
    return ok;
}

typedef enum { RX_MSG, RX_EOF, RX_RESET, RX_TIMEOUT } rx_t;

static rx_t raw_recv_exact(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = recv(fd, p, len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return RX_EOF;
        if (r < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? RX_TIMEOUT : RX_RESET;
        p += r;
        len -= (size_t)r;
    }
    return RX_MSG;
}

/* The next frame from the consumer, decoded; payloads are never sent to us. */
static rx_t raw_recv_msg(int fd, uint16_t *type, ProtobufCMessage **m)
{
    uint8_t head[8 + HS_FRAME_HEADER_BYTES];
    rx_t r = raw_recv_exact(fd, head, sizeof head);
    if (r != RX_MSG) return r;
    hs_frame_header_t h;
    char why[200];
    ck_assert_msg(hs_frame_header_decode(head + 8, HS_FRAME_MAX_BODY, &h, why, sizeof why) == HS_OK,
                  "the consumer sent a bad frame header: %s", why);
    uint8_t *frame = malloc(HS_FRAME_HEADER_BYTES + h.body_len + 1);
    ck_assert_ptr_nonnull(frame);
    memcpy(frame, head + 8, HS_FRAME_HEADER_BYTES);
    r = raw_recv_exact(fd, frame + HS_FRAME_HEADER_BYTES, h.body_len);
    if (r == RX_MSG) {
        ck_assert_msg(hs_msg_decode_frame(frame, HS_FRAME_HEADER_BYTES + h.body_len, type, m, why,
                                          sizeof why) == HS_OK,
                      "the consumer sent an undecodable frame: %s", why);
    }
    free(frame);
    return r;
}

/* Waits until the consumer refuses us: an ERROR frame (whose text must
 * contain `needle` when given) followed by the end of the stream, or the
 * stream cut without one when `error_required` is false. Frames the
 * consumer had queued before (WELCOME, TICKET) are skipped. */
static void expect_refused(int fd, const char *needle, bool error_required)
{
    bool got_error = false;
    for (;;) {
        uint16_t type;
        ProtobufCMessage *m = NULL;
        rx_t r = raw_recv_msg(fd, &type, &m);
        ck_assert_msg(r != RX_TIMEOUT,
                      "the consumer neither refused nor cut off a bad peer within %d s",
                      RECV_TIMEOUT_S);
        if (r != RX_MSG) break; /* closed or reset */
        if (type == HS_MSG_ERROR) {
            Hsflow__Error *e = (Hsflow__Error *)m;
            ck_assert_int_lt(e->code, 0);
            if (needle)
                ck_assert_msg(strstr(e->text, needle) != NULL,
                              "ERROR text '%s' does not mention '%s'", e->text, needle);
            got_error = true;
        } else {
            ck_assert_msg(!got_error, "the consumer sent %s after its ERROR frame",
                          hs_msg_type_str(type));
            ck_assert_msg(type == HS_MSG_WELCOME || type == HS_MSG_TICKET,
                          "unexpected %s while waiting for a refusal", hs_msg_type_str(type));
        }
        hs_msg_free(m);
    }
    if (error_required) ck_assert_msg(got_error, "cut off without an ERROR frame saying why");
    close(fd);
}

/* ---- handshake pieces ----------------------------------------------------------- */

/* A correct HELLO for the fixture's plan; lm, layers and nonce are the
 * caller's storage. */
static void hello_fill(Hsflow__Hello *out, const char *name, Hsflow__Layout *lm, int32_t *layers,
                       uint8_t *nonce)
{
    Hsflow__Hello h = HSFLOW__HELLO__INIT;
    hs_layout_to_msg(&g_layout, lm, layers);
    hs_plan_stats_t ps;
    hs_plan_stats(g_plan, &ps);
    h.version = HS_PROTO_VERSION;
    h.producer_name = (char *)name;
    h.workers = 1;
    h.prefetch_per_worker = 2;
    h.layout = lm;
    h.plan_hash = hs_plan_hash(g_plan);
    h.plan_basis = hs_plan_basis(g_plan);
    h.n_batches = hs_plan_n_batches(g_plan);
    h.seed = 7;
    h.token_budget = BUDGET;
    h.max_seq_len = ps.max_seq_len;
    h.dataset_fingerprint = hs_dataset_fingerprint(g_ds);
    h.total_tokens = ps.tokens;
    h.total_seqs = ps.n_kept;
    h.client_nonce.data = nonce;
    h.client_nonce.len = HS_AUTH_NONCE_BYTES;
    h.target_name = "synthetic";
    h.target_fingerprint = hs_target_synthetic_fingerprint();
    *out = h;
}

static void hello_send(int fd, const char *name)
{
    Hsflow__Hello h;
    Hsflow__Layout lm;
    int32_t layers[HS_MAX_LAYERS];
    uint8_t nonce[HS_AUTH_NONCE_BYTES] = {1, 2, 3};
    hello_fill(&h, name, &lm, layers, nonce);
    ck_assert(raw_send_msg(fd, HS_MSG_HELLO, &h.base, 0));
}

/* Receives the WELCOME; returns its need_plan. */
static bool welcome_recv(int fd)
{
    uint16_t type;
    ProtobufCMessage *m;
    ck_assert_int_eq(raw_recv_msg(fd, &type, &m), RX_MSG);
    ck_assert_msg(type == HS_MSG_WELCOME, "expected WELCOME, got %s", hs_msg_type_str(type));
    bool need_plan = ((Hsflow__Welcome *)m)->need_plan;
    hs_msg_free(m);
    return need_plan;
}

/* PLAN page for batches [first, first + n) of the real plan. */
static void plan_send(int fd, uint32_t first, uint32_t n, bool last)
{
    uint32_t *ns = calloc(n, sizeof *ns), *nt = calloc(n, sizeof *nt);
    for (uint32_t i = 0; i < n; i++) {
        hs_plan_batch_t b;
        ck_assert_int_eq(hs_plan_batch(g_plan, first + i, &b), HS_OK);
        ns[i] = b.n_seqs;
        nt[i] = b.n_tokens;
    }
    Hsflow__Plan p = HSFLOW__PLAN__INIT;
    p.first_batch = first;
    p.n_n_seqs = p.n_n_tokens = n;
    p.n_seqs = ns;
    p.n_tokens = nt;
    p.last = last;
    ck_assert(raw_send_msg(fd, HS_MSG_PLAN, &p.base, 0));
    free(ns);
    free(nt);
}

/* A peer that went through HELLO claiming `workers` workers (+ the whole
 * plan when asked) and is ready. */
static int peer_ready_workers(uint16_t port, const char *name, uint32_t workers)
{
    int fd = raw_connect(port);
    Hsflow__Hello h;
    Hsflow__Layout lm;
    int32_t layers[HS_MAX_LAYERS];
    uint8_t nonce[HS_AUTH_NONCE_BYTES] = {1, 2, 3};
    hello_fill(&h, name, &lm, layers, nonce);
    h.workers = workers;
    ck_assert(raw_send_msg(fd, HS_MSG_HELLO, &h.base, 0));
    if (welcome_recv(fd)) plan_send(fd, 0, hs_plan_n_batches(g_plan), true);
    return fd;
}

/* A peer that went through HELLO (+ the whole plan when asked) and is ready. */
static int peer_ready(uint16_t port, const char *name) { return peer_ready_workers(port, name, 1); }

static void ticket_recv(int fd, Hsflow__Ticket *out)
{
    uint16_t type;
    ProtobufCMessage *m;
    ck_assert_int_eq(raw_recv_msg(fd, &type, &m), RX_MSG);
    ck_assert_msg(type == HS_MSG_TICKET, "expected TICKET, got %s", hs_msg_type_str(type));
    Hsflow__Ticket *t = (Hsflow__Ticket *)m;
    *out = *t;
    out->base.unknown_fields = NULL;
    out->base.n_unknown_fields = 0;
    hs_msg_free(m);
}

static void done_init(Hsflow__Done *d, const Hsflow__Ticket *t)
{
    Hsflow__Done init = HSFLOW__DONE__INIT;
    *d = init;
    d->ticket_id = t->ticket_id;
    d->epoch = t->epoch;
    d->batch = t->batch;
    d->bytes = t->bytes;
}

/* The region a correct producer would send for ticket t. */
static uint8_t *batch_make(const Hsflow__Ticket *t)
{
    uint8_t *region = hs_aligned_alloc(4096, t->bytes);
    ck_assert_ptr_nonnull(region);
    memset(region, 0, t->bytes);
    hs_batch_view_t v = hs_batch_view(region, t->n_seqs, t->n_tokens, &g_layout);
    hs_batch_header_init(v.header, t->epoch, t->batch, t->n_seqs, t->n_tokens, &g_layout,
                         hs_plan_hash(g_plan));
    ck_assert_int_eq(hs_plan_fill_batch(g_plan, g_ds, t->batch, &v), HS_OK);
    hs_batch_synth_fill(&v, &g_layout);
    hs_batch_seal(region, t->bytes);
    return region;
}

/* DONE for ticket t and its payload with one hidden-state byte flipped (the
 * checksum fails), as one buffer: transport prefix, frame, payload. */
static uint8_t *corrupt_done_make(const Hsflow__Ticket *t, size_t *len)
{
    uint8_t *region = batch_make(t);
    Hsflow__Done d;
    done_init(&d, t);
    d.checksum = ((hs_batch_header_t *)region)->checksum;
    uint8_t *buf = malloc(1024 + t->bytes);
    ck_assert_ptr_nonnull(buf);
    size_t n = raw_build(buf, 1024, HS_MSG_DONE, &d.base, t->bytes);
    region[t->bytes - 1] ^= 0x5a;
    memcpy(buf + n, region, t->bytes);
    hs_aligned_free(region);
    *len = n + t->bytes;
    return buf;
}

/* The consumer's log (stderr) goes to a file while a test runs, so the test
 * can count lines. */
typedef struct {
    int saved_fd;
    char path[320];
} log_capture_t;

static void log_capture_start(log_capture_t *lc)
{
    snprintf(lc->path, sizeof lc->path, "%s/log.XXXXXX", g_dir);
    int fd = mkstemp(lc->path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    lc->saved_fd = dup(2);
    ck_assert_int_ge(lc->saved_fd, 0);
    ck_assert_int_ge(dup2(fd, 2), 0);
    close(fd);
}

/* Restores stderr and returns how many logged lines contain `needle`. */
static unsigned log_capture_stop(log_capture_t *lc, const char *needle)
{
    fflush(stderr);
    dup2(lc->saved_fd, 2);
    close(lc->saved_fd);
    FILE *f = fopen(lc->path, "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    unsigned n = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, needle)) n++;
        fputs(line, stderr); /* still shown with the test's output */
    }
    fclose(f);
    unlink(lc->path);
    return n;
}

/* Waits (bounded) until the consumer's stats satisfy `cond`. */
#define WAIT_STATS(c, s, cond)                                                                     \
    do {                                                                                           \
        double t_end_ = hs_now_s() + 20.0;                                                         \
        for (;;) {                                                                                 \
            hs_consumer_stats((c), &(s));                                                          \
            if (cond) break;                                                                       \
            ck_assert_msg(hs_now_s() < t_end_, "timed out waiting for " #cond);                    \
            usleep(2000);                                                                          \
        }                                                                                          \
    } while (0)

/* ---- tests ------------------------------------------------------------------------ */

START_TEST(test_raw_peer_with_valid_batches_is_accepted)
{
    /* The control: the raw client is a correct producer when it wants to be,
     * so the refusals below are about what each hostile peer does wrong. */
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    int fd = peer_ready(hs_consumer_port(h.c), "raw-good");
    Hsflow__Ticket t;
    ticket_recv(fd, &t);
    uint8_t *region = batch_make(&t);
    Hsflow__Done d;
    done_init(&d, &t);
    d.checksum = ((hs_batch_header_t *)region)->checksum;
    ck_assert(raw_send_msg(fd, HS_MSG_DONE, &d.base, t.bytes));
    ck_assert(raw_send(fd, region, t.bytes));
    hs_consumer_stats_t s;
    WAIT_STATS(h.c, s, s.batches_delivered >= 1);
    hs_aligned_free(region);
    close(fd); /* its second ticket goes back to the queue */
    harness_finish(&h, &s);
    ck_assert_uint_eq(s.protocol_errors, 0);
    ck_assert_uint_ge(s.leases_returned, 1);
}
END_TEST

START_TEST(test_wrong_magic_gets_error_and_run_completes)
{
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    int fd = raw_connect(hs_consumer_port(h.c));
    uint8_t buf[8 + HS_FRAME_HEADER_BYTES] = {0};
    hs_frame_header_encode(buf + 8, HS_MSG_HELLO, NULL, 0);
    buf[8] ^= 0xff; /* first byte of the magic */
    ck_assert(raw_send(fd, buf, sizeof buf));
    expect_refused(fd, "magic", true);
    /* and plain text, as a stray HTTP client would send */
    fd = raw_connect(hs_consumer_port(h.c));
    const char *http = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
    ck_assert(raw_send(fd, http, strlen(http)));
    expect_refused(fd, NULL, false);
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.protocol_errors, 2);
}
END_TEST

START_TEST(test_silent_peer_is_cut_off_after_the_handshake_timeout)
{
    harness_t h;
    harness_start_ex(&h, HS_ORDER_ARRIVAL, &(harness_opts_t){.handshake_timeout_s = 1});
    int fd = raw_connect(hs_consumer_port(h.c)); /* connects, never says HELLO */
    expect_refused(fd, "handshake", true);
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.producers_dropped, 1);
}
END_TEST

START_TEST(test_oversized_body_len_is_refused_before_allocating)
{
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    uint32_t sizes[] = {HS_FRAME_MAX_BODY + 1, 0xffffffffu};
    for (int i = 0; i < 2; i++) {
        int fd = raw_connect(hs_consumer_port(h.c));
        uint8_t buf[8 + HS_FRAME_HEADER_BYTES] = {0};
        hs_frame_header_encode(buf + 8, HS_MSG_HELLO, NULL, 0);
        hs_le32_store(buf + 8 + 8, sizes[i]); /* body_len */
        ck_assert(raw_send(fd, buf, sizeof buf));
        /* no body follows: a consumer that waited for it would hang here */
        expect_refused(fd, NULL, true);
    }
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.protocol_errors, 2);
}
END_TEST

START_TEST(test_truncated_body_then_close_is_dropped)
{
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    int fd = raw_connect(hs_consumer_port(h.c));
    static uint8_t buf[HS_FRAME_MAX_BODY];
    Hsflow__Bye b = HSFLOW__BYE__INIT;
    b.reason = "this text is cut short on the wire";
    size_t n = raw_build(buf, sizeof buf, HS_MSG_BYE, &b.base, 0);
    ck_assert(raw_send(fd, buf, n - 10));
    shutdown(fd, SHUT_WR);
    expect_refused(fd, NULL, false);
    hs_consumer_stats_t s;
    WAIT_STATS(h.c, s, s.producers_seen >= 1);
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.producers_seen, 2);
}
END_TEST

START_TEST(test_crc_mismatch_is_refused)
{
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    int fd = raw_connect(hs_consumer_port(h.c));
    static uint8_t buf[HS_FRAME_MAX_BODY];
    Hsflow__Bye b = HSFLOW__BYE__INIT;
    b.reason = "one bit of this body flips";
    size_t n = raw_build(buf, sizeof buf, HS_MSG_BYE, &b.base, 0);
    buf[n - 3] ^= 0x04;
    ck_assert(raw_send(fd, buf, n));
    expect_refused(fd, "crc", true);
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.protocol_errors, 1);
}
END_TEST

START_TEST(test_done_for_a_ticket_the_peer_does_not_hold_is_refused)
{
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    uint16_t port = hs_consumer_port(h.c);
    int a = peer_ready(port, "raw-holder");
    Hsflow__Ticket ta;
    ticket_recv(a, &ta);
    /* Peer b holds tickets of its own but claims one of a's, with the right
     * size and a payload of junk that must land nowhere. */
    int b = peer_ready(port, "raw-thief");
    Hsflow__Ticket tb;
    ticket_recv(b, &tb);
    Hsflow__Done d;
    done_init(&d, &ta);
    uint8_t *junk = malloc(ta.bytes);
    memset(junk, 0xab, ta.bytes);
    ck_assert(raw_send_msg(b, HS_MSG_DONE, &d.base, ta.bytes));
    expect_refused(b, "does not hold", true);
    /* A DONE for a ticket nobody was ever given. */
    int c = peer_ready(port, "raw-forger");
    Hsflow__Ticket tc;
    ticket_recv(c, &tc);
    done_init(&d, &tc);
    d.ticket_id = tc.ticket_id + 1000000;
    ck_assert(raw_send_msg(c, HS_MSG_DONE, &d.base, tc.bytes));
    raw_send(c, junk, tc.bytes);
    expect_refused(c, NULL, false);
    /* a's ticket is still a's: its correct batch is accepted. */
    uint8_t *region = batch_make(&ta);
    done_init(&d, &ta);
    d.checksum = ((hs_batch_header_t *)region)->checksum;
    ck_assert(raw_send_msg(a, HS_MSG_DONE, &d.base, ta.bytes));
    ck_assert(raw_send(a, region, ta.bytes));
    hs_consumer_stats_t s;
    WAIT_STATS(h.c, s, s.batches_delivered >= 1);
    close(a);
    free(junk);
    hs_aligned_free(region);
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.protocol_errors, 2);
    ck_assert_uint_ge(s.producers_dropped, 2);
    ck_assert_uint_ge(s.leases_returned, 3); /* b's, c's and a's unfinished tickets */
}
END_TEST

START_TEST(test_second_done_for_a_ticket_is_refused_and_writes_nothing_into_its_slot)
{
    /* A peer sends its batch, then at once a second DONE for the same
     * ticket with junk behind it, while the first payload is being checked.
     * That second payload once landed in the slot after the check, changing
     * the batch under the trainer; it must be refused before a byte lands. */
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    int fd = peer_ready(hs_consumer_port(h.c), "raw-twice");
    Hsflow__Ticket t;
    ticket_recv(fd, &t);
    uint8_t *region = batch_make(&t);
    Hsflow__Done d;
    done_init(&d, &t);
    d.checksum = ((hs_batch_header_t *)region)->checksum;
    uint8_t *junk = malloc(t.bytes);
    ck_assert_ptr_nonnull(junk);
    memset(junk, 0x5a, t.bytes);
    /* one buffer, so both arrive in one read */
    size_t cap = 2 * (1024 + t.bytes), n = 0;
    uint8_t *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    n += raw_build(buf + n, 1024, HS_MSG_DONE, &d.base, t.bytes);
    memcpy(buf + n, region, t.bytes);
    n += t.bytes;
    n += raw_build(buf + n, 1024, HS_MSG_DONE, &d.base, t.bytes);
    memcpy(buf + n, junk, t.bytes);
    n += t.bytes;
    raw_send(fd, buf, n); /* may be cut off part way */
    expect_refused(fd, NULL, false);
    free(buf);
    free(junk);
    hs_aligned_free(region);
    hs_consumer_stats_t s;
    harness_finish(&h, &s); /* every delivered batch verified by the trainer */
    ck_assert_uint_ge(s.protocol_errors, 1);
    ck_assert_uint_eq(s.checksum_failures, 0);
}
END_TEST

START_TEST(test_payload_of_the_wrong_size_is_refused)
{
    harness_t h;
    harness_start(&h, HS_ORDER_PLAN);
    uint16_t port = hs_consumer_port(h.c);
    /* Too long: DONE says the granted size, the stream says more, and the
     * extra bytes follow at once (they would run past the slot). */
    int a = peer_ready(port, "raw-long");
    Hsflow__Ticket t;
    ticket_recv(a, &t);
    uint8_t *region = batch_make(&t);
    uint64_t long_len = t.bytes + 64 * 1024;
    uint8_t *big = calloc(1, long_len);
    memcpy(big, region, t.bytes);
    memset(big + t.bytes, 0xcd, long_len - t.bytes);
    Hsflow__Done d;
    done_init(&d, &t);
    d.checksum = ((hs_batch_header_t *)region)->checksum;
    ck_assert(raw_send_msg(a, HS_MSG_DONE, &d.base, long_len));
    raw_send(a, big, long_len);
    expect_refused(a, NULL, false);
    /* Too short, and DONE agrees with the stream: still not what was granted. */
    int b = peer_ready(port, "raw-short");
    ticket_recv(b, &t);
    done_init(&d, &t);
    d.bytes = t.bytes - HS_BATCH_ALIGN;
    ck_assert(raw_send_msg(b, HS_MSG_DONE, &d.base, d.bytes));
    expect_refused(b, "granted exactly", true);
    free(big);
    hs_aligned_free(region);
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.protocol_errors, 2);
    ck_assert_uint_ge(s.leases_returned, 2);
}
END_TEST

START_TEST(test_plan_pages_out_of_order_are_refused_and_the_plan_restarts)
{
    harness_t h;
    harness_start(&h, HS_ORDER_PLAN);
    uint16_t port = hs_consumer_port(h.c);
    uint32_t n = hs_plan_n_batches(g_plan);
    /* Skips the first page. */
    int a = raw_connect(port);
    hello_send(a, "raw-skipper");
    ck_assert(welcome_recv(a));
    plan_send(a, 1, n - 1, true);
    expect_refused(a, "PLAN page", true);
    /* Sends the first half twice: the consumer has batches 0..k-1 from the
     * first page when the repeat arrives. */
    int b = raw_connect(port);
    hello_send(b, "raw-repeater");
    ck_assert(welcome_recv(b));
    plan_send(b, 0, n / 2, false);
    plan_send(b, 0, n / 2, false);
    expect_refused(b, "PLAN page", true);
    /* Stops half way and leaves: the next producer must send the plan from 0. */
    int c = raw_connect(port);
    hello_send(c, "raw-quitter");
    ck_assert(welcome_recv(c));
    plan_send(c, 0, n / 2, false);
    hs_consumer_stats_t s;
    WAIT_STATS(h.c, s, s.producers_seen >= 3);
    close(c);
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.protocol_errors, 2);
}
END_TEST

START_TEST(test_second_hello_and_other_out_of_protocol_frames_are_refused)
{
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    uint16_t port = hs_consumer_port(h.c);
    /* HELLO twice (the first one defines the run and gets the plan asked for). */
    int a = raw_connect(port);
    hello_send(a, "raw-twice");
    ck_assert(welcome_recv(a));
    hello_send(a, "raw-twice");
    expect_refused(a, "HELLO", true);
    /* DONE before any handshake. */
    int b = raw_connect(port);
    Hsflow__Ticket fake = HSFLOW__TICKET__INIT;
    fake.ticket_id = 1;
    fake.bytes = 4096;
    Hsflow__Done d;
    done_init(&d, &fake);
    ck_assert(raw_send_msg(b, HS_MSG_DONE, &d.base, 0));
    expect_refused(b, NULL, true);
    /* A payload after a frame that cannot carry one. */
    int c = raw_connect(port);
    Hsflow__Bye bye = HSFLOW__BYE__INIT;
    bye.reason = "with a payload";
    ck_assert(raw_send_msg(c, HS_MSG_BYE, &bye.base, 1u << 20));
    expect_refused(c, "payload", true);
    /* A frame type only the consumer may send. */
    int e = raw_connect(port);
    Hsflow__Ticket t = HSFLOW__TICKET__INIT;
    t.bytes = 4096;
    t.n_seqs = t.n_tokens = 1;
    ck_assert(raw_send_msg(e, HS_MSG_TICKET, &t.base, 0));
    expect_refused(e, NULL, true);
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.protocol_errors, 4);
}
END_TEST

START_TEST(test_stats_before_the_handshake_is_a_protocol_error)
{
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    uint16_t port = hs_consumer_port(h.c);
    Hsflow__Stats st = HSFLOW__STATS__INIT;
    st.progressing = true;
    /* before HELLO: the first STATS ends the connection, never a stream of them */
    int a = raw_connect(port);
    ck_assert(raw_send_msg(a, HS_MSG_STATS, &st.base, 0));
    for (int i = 0; i < 1000; i++)
        if (!raw_send_unchecked(a, HS_MSG_STATS, &st.base)) break;
    expect_refused(a, "STATS before the handshake", true);
    /* after HELLO, while another producer's plan is still to come (admitted, not welcomed) */
    int b = raw_connect(port);
    hello_send(b, "raw-sender");
    ck_assert(welcome_recv(b)); /* asked for the plan: keeps it pending */
    int w = raw_connect(port);
    hello_send(w, "raw-waiting");
    ck_assert(raw_send_msg(w, HS_MSG_STATS, &st.base, 0));
    expect_refused(w, "STATS before the handshake", true);
    close(b);
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.protocol_errors, 2);
}
END_TEST

START_TEST(test_well_framed_but_invalid_messages_are_refused)
{
    /* Correct frames (magic, length, crc) around messages whose fields are
     * wrong: the consumer must check fields before it uses them. */
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    uint16_t port = hs_consumer_port(h.c);
    Hsflow__Hello hello;
    Hsflow__Layout lm;
    int32_t layers[HS_MAX_LAYERS + 8];
    uint8_t nonce[HS_AUTH_NONCE_BYTES] = {9};
    int refused = 0;

    for (int variant = 0; variant < 7; variant++) {
        hello_fill(&hello, "raw-invalid", &lm, layers, nonce);
        switch (variant) {
        case 0:
            hello.client_nonce.len = 0;
            hello.client_nonce.data = NULL;
            break;
        case 1:
            hello.client_nonce.len = 3;
            break;
        case 2:
            hello.layout = NULL;
            break;
        case 3: /* more layers than HS_MAX_LAYERS */
            for (int i = 0; i < HS_MAX_LAYERS + 8; i++)
                layers[i] = i;
            lm.n_layers = HS_MAX_LAYERS + 8;
            break;
        case 4:
            lm.layout_id ^= 1;
            break;
        case 5:
            lm.hidden_size = 0;
            break;
        case 6:
            hello.workers = 0;
            break;
        }
        int fd = raw_connect(port);
        ck_assert(raw_send_unchecked(fd, HS_MSG_HELLO, &hello.base));
        expect_refused(fd, NULL, true);
        refused++;
    }
    /* Undecodable protobuf inside a correct frame. */
    {
        int fd = raw_connect(port);
        uint8_t buf[8 + HS_FRAME_HEADER_BYTES + 32];
        memset(buf, 0, 8);
        for (int i = 0; i < 32; i++)
            buf[8 + HS_FRAME_HEADER_BYTES + i] = 0xff;
        hs_frame_header_encode(buf + 8, HS_MSG_HELLO, buf + 8 + HS_FRAME_HEADER_BYTES, 32);
        ck_assert(raw_send(fd, buf, sizeof buf));
        expect_refused(fd, NULL, true);
        refused++;
    }
    /* PLAN pages with inconsistent arrays or impossible batches, from the
     * peer asked for the plan. */
    uint32_t n = hs_plan_n_batches(g_plan);
    for (int variant = 0; variant < 3; variant++) {
        int fd = raw_connect(port);
        hello_send(fd, "raw-bad-plan");
        ck_assert(welcome_recv(fd));
        uint32_t *ns = calloc(n, sizeof *ns), *nt = calloc(n, sizeof *nt);
        for (uint32_t i = 0; i < n; i++) {
            hs_plan_batch_t b;
            ck_assert_int_eq(hs_plan_batch(g_plan, i, &b), HS_OK);
            ns[i] = b.n_seqs;
            nt[i] = b.n_tokens;
        }
        Hsflow__Plan p = HSFLOW__PLAN__INIT;
        p.n_n_seqs = p.n_n_tokens = n;
        p.n_seqs = ns;
        p.n_tokens = nt;
        p.last = true;
        if (variant == 0) p.n_n_tokens = n - 1;   /* arrays of different lengths */
        if (variant == 1) nt[n / 2] = BUDGET + 1; /* over the token budget */
        if (variant == 2) ns[0] = 0;              /* a batch of no sequence */
        ck_assert(raw_send_unchecked(fd, HS_MSG_PLAN, &p.base));
        expect_refused(fd, NULL, true);
        free(ns);
        free(nt);
        refused++;
    }
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.producers_seen, (uint64_t)refused + 1);
}
END_TEST

START_TEST(test_bad_peers_beside_verified_batches_write_nothing_outside_their_slot)
{
    /* Plan order, and a raw peer holding the first two tickets of the plan:
     * the real producer fills every other batch, and they all wait verified
     * in the cache, next to the held slots, undeliverable until the holder
     * leaves. Then hostile peers act, the holder last of all with an
     * oversized payload aimed at its own slot. Every waiting batch is checked
     * again when it is finally delivered, so a stray write would show. */
    harness_t h;
    harness_start(&h, HS_ORDER_PLAN);
    uint16_t port = hs_consumer_port(h.c);
    int holder = peer_ready(port, "raw-holder");
    Hsflow__Ticket t1, t2;
    ticket_recv(holder, &t1);
    ticket_recv(holder, &t2);
    uint64_t run_bytes = 0;
    for (uint32_t i = 0; i < h.n_batches; i++) {
        hs_plan_batch_t pb;
        ck_assert_int_eq(hs_plan_batch(g_plan, i, &pb), HS_OK);
        run_bytes += EPOCHS * hs_batch_bytes(pb.n_seqs, pb.n_tokens, &g_layout);
    }
    producer_arg_t pa = {.port = port, .result = HS_ERR_INVALID};
    pthread_t pt;
    ck_assert_int_eq(pthread_create(&pt, NULL, producer_main, &pa), 0);
    hs_consumer_stats_t s;
    WAIT_STATS(h.c, s, s.bytes_received == run_bytes - t1.bytes - t2.bytes);
    ck_assert_uint_eq(s.batches_delivered, 0); /* all waiting behind the held tickets */

    for (int i = 0; i < 3; i++) {
        int fd = raw_connect(port);
        uint8_t junk[64];
        for (size_t k = 0; k < sizeof junk; k++)
            junk[k] = (uint8_t)(k * 37 + i);
        ck_assert(raw_send(fd, junk, sizeof junk));
        expect_refused(fd, NULL, false);
    }
    uint8_t *junk = malloc(t1.bytes + 65536);
    memset(junk, 0xee, t1.bytes + 65536);
    int thief = peer_ready(port, "raw-thief");
    Hsflow__Done d;
    done_init(&d, &t1);
    ck_assert(raw_send_msg(thief, HS_MSG_DONE, &d.base, t1.bytes));
    raw_send(thief, junk, t1.bytes);
    expect_refused(thief, NULL, false);
    done_init(&d, &t1);
    ck_assert(raw_send_msg(holder, HS_MSG_DONE, &d.base, t1.bytes + 65536));
    raw_send(holder, junk, t1.bytes + 65536);
    expect_refused(holder, NULL, false);
    free(junk);

    pthread_join(pt, NULL);
    pthread_join(h.trainer, NULL);
    hs_consumer_stats(h.c, &s);
    hs_consumer_destroy(h.c);
    ck_assert_int_eq(pa.result, HS_OK);
    ck_assert_msg(atomic_load(&h.bad) == 0, "a delivered batch was corrupt: %s", h.bad_why);
    uint64_t planned = (uint64_t)EPOCHS * h.n_batches;
    ck_assert_uint_eq(s.batches_delivered, planned);
    for (uint32_t i = 0; i < EPOCHS * h.n_batches; i++)
        ck_assert_uint_eq(h.seen[i], 1);
    harness_check_order(&h);
    ck_assert_uint_eq(s.duplicates, 0);
    ck_assert_uint_eq(s.checksum_failures, 0);
    ck_assert_uint_eq(s.bytes_received, run_bytes);
    ck_assert_uint_ge(s.protocol_errors, 5);
    ck_assert_uint_ge(s.leases_returned, 2);
    ck_assert_uint_eq(s.cache_used, 0);
    free(h.seen);
    free(h.sequence);
}
END_TEST

/* A HELLO for another plan (hash of the real one with a bit flipped) with
 * `n_batches`, sent without hs_msg_pack()'s checks. */
static void hello_send_other_plan(int fd, const char *name, uint32_t n_batches)
{
    Hsflow__Hello h;
    Hsflow__Layout lm;
    int32_t layers[HS_MAX_LAYERS];
    uint8_t nonce[HS_AUTH_NONCE_BYTES] = {4, 5, 6};
    hello_fill(&h, name, &lm, layers, nonce);
    h.plan_hash ^= 1;
    h.n_batches = n_batches;
    ck_assert(raw_send_unchecked(fd, HS_MSG_HELLO, &h.base));
}

static long file_size(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

START_TEST(test_plan_left_half_way_is_discarded_whole_and_a_larger_plan_fits)
{
    /* A peer offers a 3-batch plan, sends 2 batches of it and leaves: nothing
     * of it may outlive it. The real plan is larger; writing it where the
     * small one was kept would run past its arrays. A batch count beyond
     * HS_PLAN_MAX_BATCHES is refused before anything is allocated for it. */
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    uint16_t port = hs_consumer_port(h.c);
    ck_assert_uint_gt(h.n_batches, 3);
    int a = raw_connect(port);
    hello_send_other_plan(a, "raw-small-plan", 3);
    ck_assert(welcome_recv(a));
    plan_send(a, 0, 2, false);
    hs_consumer_stats_t s;
    WAIT_STATS(h.c, s, s.producers_seen >= 1);
    close(a);
    int b = raw_connect(port);
    hello_send_other_plan(b, "raw-huge-plan", 0xffffffffu);
    expect_refused(b, "n_batches", true);
    int c = raw_connect(port);
    hello_send_other_plan(c, "raw-too-many", HS_PLAN_MAX_BATCHES + 1);
    expect_refused(c, "n_batches", true);
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.producers_dropped, 2);
}
END_TEST

START_TEST(test_stalled_plan_sender_is_cut_off_and_a_waiting_producer_defines_the_run)
{
    /* The first peer offers another plan, is asked for it and sends nothing.
     * The real producer arriving meanwhile is not refused for a plan that was
     * never complete: it waits, and sends its own once the staller is cut off. */
    harness_t h;
    harness_start_ex(&h, HS_ORDER_ARRIVAL, &(harness_opts_t){.handshake_timeout_s = 1});
    int a = raw_connect(hs_consumer_port(h.c));
    hello_send_other_plan(a, "raw-staller", hs_plan_n_batches(g_plan));
    ck_assert(welcome_recv(a));
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
    expect_refused(a, "PLAN page", true);
    ck_assert_uint_ge(s.producers_dropped, 1);
}
END_TEST

START_TEST(test_unverified_hello_writes_nothing_to_the_journal)
{
    /* A peer offers another plan, is asked for it and leaves: the journal
     * stays empty, and the real producer (another plan) is not refused. */
    char journal[320];
    snprintf(journal, sizeof journal, "%s/journal", g_dir);
    unlink(journal);
    harness_opts_t o = {.journal = journal};
    harness_t h;
    harness_start_ex(&h, HS_ORDER_ARRIVAL, &o);
    uint16_t port = hs_consumer_port(h.c);
    int a = raw_connect(port);
    hello_send_other_plan(a, "raw-poisoner", hs_plan_n_batches(g_plan));
    ck_assert(welcome_recv(a));
    close(a);
    hs_consumer_stats_t s;
    WAIT_STATS(h.c, s, s.producers_seen >= 1);
    ck_assert_msg(file_size(journal) == 0, "the journal has %ld bytes before any plan completed",
                  file_size(journal));
    harness_finish(&h, &s);
    FILE *f = fopen(journal, "r");
    ck_assert_ptr_nonnull(f);
    char line[256], want[64];
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    snprintf(want, sizeof want, "plan=%016llx", (unsigned long long)hs_plan_hash(g_plan));
    ck_assert_msg(strstr(line, want) != NULL, "journal header '%s' is not for the real plan", line);
    unsigned entries = 0;
    while (fgets(line, sizeof line, f))
        entries++;
    fclose(f);
    ck_assert_uint_eq(entries, EPOCHS * h.n_batches);

    /* Restarted with that journal, the consumer refuses another plan at
     * HELLO, before any plan exchange, and writes nothing. */
    long before = file_size(journal);
    hs_consumer_config_t cfg;
    hs_consumer_config_default(&cfg);
    cfg.listen_host = "127.0.0.1";
    cfg.listen_port = 0;
    cfg.cache_bytes = 64ull << 20;
    cfg.epochs = EPOCHS;
    cfg.transport = "tcp";
    cfg.journal = journal;
    hs_consumer_t *c2;
    ck_assert_int_eq(hs_consumer_create(&cfg, &c2), HS_OK);
    int b = raw_connect(hs_consumer_port(c2));
    hello_send_other_plan(b, "raw-other-plan", hs_plan_n_batches(g_plan));
    expect_refused(b, "journal", true);
    hs_consumer_destroy(c2);
    ck_assert_int_eq(file_size(journal), before);
    unlink(journal);
}
END_TEST

/* Starts the hs-producer binary for the fixture's run (2 CPU workers) with
 * `extra` flags; its output goes to `log`. */
static pid_t producer_spawn(uint16_t port, const char *name, const char *extra, const char *log)
{
    ck_assert_msg(g_producer_bin != NULL, "give the hs-producer binary as the first argument");
    char to[64], budget[16], cmd[2048];
    snprintf(to, sizeof to, "127.0.0.1:%u", port);
    snprintf(budget, sizeof budget, "%u", BUDGET);
    snprintf(cmd, sizeof cmd,
             "exec '%s' --to %s --data '%s' --token-budget %s --seed 7 --hidden-size %u "
             "--layers 1,3 --source synthetic --gpus cpu:2 --transport tcp --connect-timeout 20 "
             "--name %s %s >'%s' 2>&1",
             g_producer_bin, to, g_data, budget, HIDDEN, name, extra, log);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ), 0);
    return pid;
}

/* Waits up to `secs` for process `pid` to end; true when it did. */
static bool process_reaped(pid_t pid, double secs)
{
    double t_end = hs_now_s() + secs;
    int status;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (hs_now_s() > t_end) return false;
        usleep(10000);
    }
    return true;
}

static bool file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

/* Reads the TICKETs the consumer sent until none comes for `quiet_ms`;
 * returns how many and adds their bytes to *bytes. */
static uint32_t tickets_drain(int fd, int quiet_ms, uint64_t *bytes)
{
    uint32_t n = 0;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    while (poll(&pf, 1, quiet_ms) == 1) {
        Hsflow__Ticket t;
        ticket_recv(fd, &t);
        *bytes += t.bytes;
        n++;
    }
    return n;
}

START_TEST(test_a_peer_claiming_4096_workers_gets_a_fair_share_of_the_cache)
{
    /* Two ready peers: the first holds its two tickets, the second claims
     * 4096 workers. It may pin half the cache (plus the batch that crosses
     * the line), not every free slot; the rest stays for the others. */
    harness_opts_t o = {.cache_bytes = 1u << 20};
    harness_t h;
    harness_start_ex(&h, HS_ORDER_ARRIVAL, &o);
    uint16_t port = hs_consumer_port(h.c);
    int first = peer_ready(port, "raw-first");
    Hsflow__Ticket t1, t2;
    ticket_recv(first, &t1);
    ticket_recv(first, &t2);
    int hoarder = peer_ready_workers(port, "raw-hoarder", 4096);
    uint64_t bytes = 0;
    uint32_t n = tickets_drain(hoarder, 500, &bytes);
    uint64_t max_batch = 0;
    for (uint32_t i = 0; i < h.n_batches; i++) {
        hs_plan_batch_t pb;
        ck_assert_int_eq(hs_plan_batch(g_plan, i, &pb), HS_OK);
        uint64_t b = hs_batch_bytes(pb.n_seqs, pb.n_tokens, &g_layout);
        if (b > max_batch) max_batch = b;
    }
    ck_assert_uint_ge(n, 1);
    ck_assert_msg(bytes <= o.cache_bytes / 2,
                  "a peer claiming 4096 workers holds %u tickets, %llu bytes of a %llu-byte cache "
                  "shared by 2 peers",
                  n, (unsigned long long)bytes, (unsigned long long)o.cache_bytes);
    /* the other half is the first peer's to take: it is granted more once
     * its batches are in */
    ck_assert_uint_ge(o.cache_bytes - bytes - t1.bytes - t2.bytes, max_batch);
    close(hoarder);
    close(first);
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
}
END_TEST

START_TEST(test_tickets_of_a_hoarder_and_a_stopped_producer_expire_and_the_run_completes)
{
    /* A raw peer claims 4096 workers, takes tickets and never sends a DONE; a
     * real hs-producer joins and is stopped (SIGSTOP: its kernel still ACKs,
     * its connection looks alive). With a 2 s lease both lose their tickets,
     * the stopped one rejoins (--reconnect) once it runs again, and the run
     * completes with every batch exactly once. */
    harness_opts_t o = {.cache_bytes = 1u << 20, .lease_timeout_s = 2};
    harness_t h;
    harness_start_ex(&h, HS_ORDER_ARRIVAL, &o);
    uint16_t port = hs_consumer_port(h.c);
    hs_consumer_stats_t s;
    int hoarder = peer_ready_workers(port, "raw-hoarder", 4096);
    WAIT_STATS(h.c, s, s.tickets_out > 0);
    char log[320];
    snprintf(log, sizeof log, "%s/stopped.log", g_dir);
    pid_t pid = producer_spawn(port, "stopped", "--reconnect", log);
    WAIT_STATS(h.c, s, s.producers_connected >= 2);
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    WAIT_STATS(h.c, s, s.producers_dropped >= 2); /* the hoarder, then the stopped one */
    expect_refused(hoarder, "no progress", true);
    ck_assert_int_eq(kill(pid, SIGCONT), 0);
    harness_finish(&h, &s);
    ck_assert_uint_ge(s.leases_returned, 2);
    bool ended = process_reaped(pid, 30);
    if (!ended) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    ck_assert_msg(ended, "the resumed producer did not end after the run");
    ck_assert_msg(file_has(log, "dropped us: no progress"),
                  "the resumed producer was not told why it lost its tickets");
    ck_assert_msg(file_has(log, "reconnected to"), "the resumed producer did not rejoin");
    unlink(log);
}
END_TEST

static void stats_send(int fd, bool progressing)
{
    Hsflow__Stats st = HSFLOW__STATS__INIT;
    st.worker_count = 1;
    st.progressing = progressing;
    raw_send_msg(fd, HS_MSG_STATS, &st.base, 0); /* may fail once we are cut off */
}

START_TEST(test_heartbeats_keep_tickets_past_the_lease_but_not_beyond_the_batchs_bound)
{
    /* With a 1 s lease, two peers hold tickets and never send a DONE. One
     * beats "progressing" (a worker computing a long batch), the other beats
     * without progress (its workers hang): the hung one loses its tickets
     * first. Heartbeats alone hold tickets only for the lease plus the time
     * a 256-token batch takes at --lease-min-rate (200 tokens/s: 1.3 s), not
     * for as long as they come: the beating one is dropped too, while it
     * still beats. */
    harness_opts_t o = {.lease_timeout_s = 1};
    harness_t h;
    harness_start_ex(&h, HS_ORDER_ARRIVAL, &o);
    uint16_t port = hs_consumer_port(h.c);
    int busy = peer_ready(port, "raw-computing");
    Hsflow__Ticket t;
    ticket_recv(busy, &t);
    int hung = peer_ready(port, "raw-hung");
    ticket_recv(hung, &t);
    hs_consumer_stats_t s;
    double t0 = hs_now_s(), t_first = 0, t_both = 0;
    /* 15 s: the beating one is due at about 2.3 s; the bound only has to
     * be finite, and a loaded machine may take several times as long */
    while (hs_now_s() - t0 < 15.0) {
        stats_send(busy, true);
        stats_send(hung, false);
        usleep(50000);
        hs_consumer_stats(h.c, &s);
        if (s.producers_dropped >= 1 && t_first == 0) t_first = hs_now_s() - t0;
        if (s.producers_dropped >= 2) {
            t_both = hs_now_s() - t0;
            break;
        }
    }
    ck_assert_msg(t_first > 0 && t_both > t_first + 0.2,
                  "the hung peer was dropped after %.2f s, the beating one after %.2f s: it must "
                  "keep its tickets a while longer",
                  t_first, t_both);
    ck_assert_msg(t_both > 0, "a peer beating progress kept its tickets for 15 s with no DONE");
    expect_refused(hung, "no progress", true);
    expect_refused(busy, "heartbeats but no finished batch", true);
    harness_finish(&h, &s);
    ck_assert_uint_eq(s.producers_dropped, 2);
}
END_TEST

START_TEST(test_each_checksum_failure_is_logged_and_a_peer_is_dropped_once)
{
    /* Peer a sends two corrupt batches at once: both can fail verification
     * while a's connection is still closing, and a is dropped (and counted)
     * once. Peer b sends one and closes at once: its failure is found after
     * b is gone and must still be logged. */
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    h.corrupt_peers = true;
    uint16_t port = hs_consumer_port(h.c);
    log_capture_t lc;
    log_capture_start(&lc);
    int a = peer_ready_workers(port, "raw-corrupt-twice", 2);
    Hsflow__Ticket ta[2];
    ticket_recv(a, &ta[0]);
    ticket_recv(a, &ta[1]);
    size_t n0, n1;
    uint8_t *d0 = corrupt_done_make(&ta[0], &n0), *d1 = corrupt_done_make(&ta[1], &n1);
    uint8_t *both = malloc(n0 + n1);
    memcpy(both, d0, n0);
    memcpy(both + n0, d1, n1);
    ck_assert(raw_send(a, both, n0 + n1));
    expect_refused(a, "failed verification", true);
    free(d0);
    free(d1);
    free(both);

    int b = peer_ready(port, "raw-corrupt-and-gone");
    Hsflow__Ticket tb;
    ticket_recv(b, &tb);
    size_t nb;
    uint8_t *db = corrupt_done_make(&tb, &nb);
    ck_assert(raw_send(b, db, nb));
    close(b);
    free(db);

    hs_consumer_stats_t s;
    WAIT_STATS(h.c, s, s.checksum_failures >= 2);
    harness_finish(&h, &s);
    unsigned logged = log_capture_stop(&lc, "failed verification");
    ck_assert_uint_ge(s.checksum_failures, 2);
    ck_assert_msg(logged == s.checksum_failures, "%u checksum failures but %u logged",
                  (unsigned)s.checksum_failures, logged);
    ck_assert_msg(s.producers_dropped <= 2, "2 bad peers, %llu drops counted",
                  (unsigned long long)s.producers_dropped);
}
END_TEST

START_TEST(test_fp8_rows_with_a_nan_scale_are_refused_and_the_batch_is_computed_again)
{
    /* A NaN scale with a good checksum would dequantise into a row of
     * +-0.0: the peer is dropped as for a bad checksum and the real producer
     * computes the batch again (harness_finish checks every value). */
    g_layout.dtype = HS_DTYPE_FP8;
    harness_t h;
    harness_start(&h, HS_ORDER_ARRIVAL);
    h.corrupt_peers = true;
    int fd = peer_ready(hs_consumer_port(h.c), "raw-nan-scale");
    Hsflow__Ticket t;
    ticket_recv(fd, &t);
    uint8_t *region = batch_make(&t);
    hs_batch_view_t v = hs_batch_view(region, t.n_seqs, t.n_tokens, &g_layout);
    v.scales[t.n_tokens / 2] = NAN;
    hs_batch_seal(region, t.bytes);
    Hsflow__Done d;
    done_init(&d, &t);
    d.checksum = ((hs_batch_header_t *)region)->checksum;
    ck_assert(raw_send_msg(fd, HS_MSG_DONE, &d.base, t.bytes));
    ck_assert(raw_send(fd, region, t.bytes));
    expect_refused(fd, "cannot be dequantised", true);
    hs_aligned_free(region);
    hs_consumer_stats_t s;
    harness_finish(&h, &s);
    ck_assert_uint_eq(s.checksum_failures, 1);
    ck_assert_uint_ge(s.leases_returned, 1);
    g_layout.dtype = HS_DTYPE_BF16;
}
END_TEST

static Suite *hostile_suite(void)
{
    Suite *s = suite_create("hostile_peers");
    TCase *tc = tcase_create("consumer");
    tcase_add_unchecked_fixture(tc, fixture_setup, fixture_teardown);
    tcase_add_test(tc, test_raw_peer_with_valid_batches_is_accepted);
    tcase_add_test(tc, test_wrong_magic_gets_error_and_run_completes);
    tcase_add_test(tc, test_oversized_body_len_is_refused_before_allocating);
    tcase_add_test(tc, test_silent_peer_is_cut_off_after_the_handshake_timeout);
    tcase_add_test(tc, test_truncated_body_then_close_is_dropped);
    tcase_add_test(tc, test_stats_before_the_handshake_is_a_protocol_error);
    tcase_add_test(tc, test_crc_mismatch_is_refused);
    tcase_add_test(tc, test_done_for_a_ticket_the_peer_does_not_hold_is_refused);
    tcase_add_test(tc, test_payload_of_the_wrong_size_is_refused);
    tcase_add_test(tc, test_second_done_for_a_ticket_is_refused_and_writes_nothing_into_its_slot);
    tcase_add_test(tc, test_plan_pages_out_of_order_are_refused_and_the_plan_restarts);
    tcase_add_test(tc, test_second_hello_and_other_out_of_protocol_frames_are_refused);
    tcase_add_test(tc, test_well_framed_but_invalid_messages_are_refused);
    tcase_add_test(tc, test_bad_peers_beside_verified_batches_write_nothing_outside_their_slot);
    tcase_add_test(tc, test_each_checksum_failure_is_logged_and_a_peer_is_dropped_once);
    tcase_add_test(tc, test_fp8_rows_with_a_nan_scale_are_refused_and_the_batch_is_computed_again);
    tcase_add_test(tc, test_plan_left_half_way_is_discarded_whole_and_a_larger_plan_fits);
    tcase_add_test(tc, test_stalled_plan_sender_is_cut_off_and_a_waiting_producer_defines_the_run);
    tcase_add_test(tc, test_unverified_hello_writes_nothing_to_the_journal);
    tcase_add_test(tc, test_a_peer_claiming_4096_workers_gets_a_fair_share_of_the_cache);
    tcase_add_test(tc,
                   test_tickets_of_a_hoarder_and_a_stopped_producer_expire_and_the_run_completes);
    tcase_add_test(tc, test_heartbeats_keep_tickets_past_the_lease_but_not_beyond_the_batchs_bound);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    g_producer_bin = argc > 1 ? argv[1] : NULL;
    if (!getenv("HS_LOG_LEVEL")) hs_log_set_level(HS_LOG_WARN);
    SRunner *sr = srunner_create(hostile_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
