/* SPDX-License-Identifier: Apache-2.0 */
/* test_transport.c - the transport contract over loopback with real sockets:
 * frames both ways, payloads straight into dest (and nowhere else), refused
 * payloads, malformed peers cut off without hurting others, wakeup from
 * another thread, send completions exactly once, and no fd left open.
 *
 * Tests that go through the public API run once per transport kind (a TCase
 * per kind; UCX cases are skipped when UCX is not built). Tests that play a
 * malformed peer with a raw socket speak the TCP wire format and run on TCP.
 * Set HS_TEST_BENCH=1 to print the 64 MiB payload rate. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hs_proto.h"
#include "hs_transport.h"
#include "hs_transport_int.h" /* bootstrap counters, the loopback-as-remote switch */
#include "ucx_addr_int.h"
#include "ucx_hello_int.h"
#include "hs_status.h"
#include "hs_time.h"
#include "hs_shuffle.h"
#include "hs_bytes.h"

#define PUMP_LIMIT_S 30.0 /* a guard against hanging, not a timing assertion */
#define MAX_CONNS 8

static hs_tp_kind_t g_kind = HS_TP_TCP;
static uint32_t g_accept_max_frame; /* non-zero: cb_accept sets it on new connections */

/* ---- one side: a transport and what its callbacks saw ---------------------- */

typedef struct {
    hs_tp_t *tp;
    int accepts, frames, payload_frames, payloads_ok, payloads_failed, closes;
    hs_tp_conn_t *accepted[MAX_CONNS];
    /* last frame */
    uint16_t type;
    uint8_t body[4096];
    uint32_t body_len;
    uint64_t payload_bytes;
    uint32_t seq_expected; /* frames carry a u32 sequence number; checks order */
    bool seq_broken;
    /* payload policy: accept into dest (when non-NULL) with this cookie */
    uint8_t *dest;
    uint64_t dest_len;
    uint64_t next_cookie, last_cookie;
    bool wrong_size; /* ask for one byte fewer than announced */
    bool advance;    /* each payload lands right after the previous one */
    hs_status_t last_payload_status;
    int close_at_payload_frame; /* close instead of accepting the n-th payload */
    /* last close */
    hs_tp_conn_t *closed_conn;
    hs_status_t close_reason;
    char close_why[256];
} side_t;

static hs_status_t cb_accept(void *arg, hs_tp_conn_t *conn)
{
    side_t *s = arg;
    if (s->accepts < MAX_CONNS) s->accepted[s->accepts] = conn;
    s->accepts++;
    if (g_accept_max_frame)
        ck_assert_int_eq(hs_tp_conn_set_max_frame(conn, g_accept_max_frame), HS_OK);
    return HS_OK;
}

static void cb_frame(void *arg, hs_tp_conn_t *conn, uint16_t type, const uint8_t *body,
                     uint32_t body_len, uint64_t payload_bytes)
{
    side_t *s = arg;
    s->frames++;
    s->type = type;
    s->body_len = body_len < sizeof s->body ? body_len : (uint32_t)sizeof s->body;
    memcpy(s->body, body, s->body_len);
    s->payload_bytes = payload_bytes;
    if (body_len >= 4) {
        uint32_t seq;
        memcpy(&seq, body, 4);
        if (seq != s->seq_expected) s->seq_broken = true;
        s->seq_expected = seq + 1;
    }
    if (payload_bytes == 0) return;
    s->payload_frames++;
    if (s->payload_frames == s->close_at_payload_frame) {
        hs_tp_close(conn, HS_ERR_CLOSED);
        return;
    }
    if (!s->dest) return; /* refuse */
    ck_assert_uint_le(payload_bytes, s->dest_len);
    uint64_t n = s->wrong_size ? payload_bytes - 1 : payload_bytes;
    hs_status_t st = hs_tp_recv_payload(conn, s->dest, n, s->next_cookie);
    if (s->wrong_size) {
        ck_assert_int_ne(st, HS_OK);
    } else {
        ck_assert_int_eq(st, HS_OK);
        if (s->advance) {
            s->dest += n;
            s->dest_len -= n;
        }
        s->next_cookie++;
    }
}

static void cb_payload(void *arg, hs_tp_conn_t *conn, uint64_t cookie, hs_status_t status)
{
    side_t *s = arg;
    s->last_cookie = cookie;
    s->last_payload_status = status;
    if (status == HS_OK)
        s->payloads_ok++;
    else
        s->payloads_failed++;
}

static void cb_close(void *arg, hs_tp_conn_t *conn, hs_status_t reason, const char *why)
{
    side_t *s = arg;
    s->closes++;
    s->closed_conn = conn;
    s->close_reason = reason;
    snprintf(s->close_why, sizeof s->close_why, "%s", why ? why : "");
}

static const hs_tp_callbacks_t g_cb = {cb_accept, cb_frame, cb_payload, cb_close};

static void side_create(side_t *s, hs_tp_kind_t kind)
{
    memset(s, 0, sizeof *s);
    s->next_cookie = 1000;
    hs_tp_config_t cfg = {.kind = kind, .max_frame_body = 64u << 10};
    ck_assert_int_eq(hs_tp_create(&cfg, &g_cb, s, &s->tp), HS_OK);
}

/* ---- helpers ---------------------------------------------------------------- */

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Complete frame of `type` whose body starts with seq and is `len` bytes. */
static size_t make_frame(uint8_t *buf, uint16_t type, uint32_t seq, uint32_t len)
{
    uint8_t *body = buf + HS_FRAME_HEADER_BYTES;
    for (uint32_t i = 0; i < len; i++)
        body[i] = (uint8_t)(i * 7 + seq);
    if (len >= 4) memcpy(body, &seq, 4);
    hs_frame_header_encode(buf, type, body, len);
    return HS_FRAME_HEADER_BYTES + len;
}

static void pump2(side_t *a, side_t *b)
{
    if (a) ck_assert_int_eq(hs_tp_progress(a->tp, 0), HS_OK);
    if (b) ck_assert_int_eq(hs_tp_progress(b->tp, 1), HS_OK);
}

/* Runs both loops until cond holds; fails after PUMP_LIMIT_S (a hang guard). */
#define PUMP_UNTIL(a, b, cond)                                                                     \
    do {                                                                                           \
        double t0_ = hs_now_s();                                                                   \
        while (!(cond)) {                                                                          \
            ck_assert_msg(hs_now_s() - t0_ < PUMP_LIMIT_S, "never happened: %s", #cond);           \
            pump2((a), (b));                                                                       \
        }                                                                                          \
    } while (0)

/* A server listening on loopback and a client connected to it. */
static side_t S, C;
static hs_tp_conn_t *g_cc; /* the client's connection */
static uint16_t g_port;
static int g_fds0;

/* hs_tp_connect blocks until the connection is up; with UCX that needs the
 * server's loop running meanwhile, as it would in its own process. */
typedef struct {
    side_t *server;
    atomic_int stop;
} serve_t;

static void *serve_loop(void *arg)
{
    serve_t *sv = arg;
    while (!sv->stop)
        if (hs_tp_progress(sv->server->tp, 5) != HS_OK) break; /* the test then times out */
    return NULL;
}

static hs_status_t connect_while_serving(side_t *server, side_t *client, const char *host,
                                         uint16_t port, hs_tp_conn_t **out)
{
    serve_t sv = {server, 0};
    pthread_t th;
    pthread_create(&th, NULL, serve_loop, &sv);
    hs_status_t st = hs_tp_connect(client->tp, host, port, 10000, out);
    sv.stop = 1;
    pthread_join(th, NULL);
    return st;
}

static void pair_open(const char *host)
{
    g_fds0 = count_fds();
    side_create(&S, g_kind);
    side_create(&C, g_kind);
    ck_assert_int_eq(hs_tp_listen(S.tp, host, 0, &g_port), HS_OK);
    ck_assert_uint_ne(g_port, 0);
    ck_assert_int_eq(connect_while_serving(&S, &C, host, g_port, &g_cc), HS_OK);
    PUMP_UNTIL(&S, &C, S.accepts == 1);
}

static void pair_close_and_check_fds(void)
{
    hs_tp_destroy(C.tp);
    hs_tp_destroy(S.tp);
    ck_assert_int_eq(count_fds(), g_fds0);
}

static void setup_tcp(void)
{
    g_kind = HS_TP_TCP;
    g_accept_max_frame = 0;
}
static void setup_shm(void)
{
    g_kind = HS_TP_SHM;
    g_accept_max_frame = 0;
}
static void setup_ucx(void)
{
    g_kind = HS_TP_UCX;
    g_accept_max_frame = 0;
    /* UCX keeps some process-wide state (its async thread's fds) from the
     * first context on; create one first so fd counts compare like with like */
    side_t s;
    side_create(&s, g_kind);
    hs_tp_destroy(s.tp);
}

/* ---- tests through the API (every kind) --------------------------------- */

START_TEST(frames_round_trip_both_ways_in_order)
{
    pair_open("127.0.0.1");
    hs_tp_conn_t *sc = S.accepted[0];
    uint8_t buf[HS_FRAME_HEADER_BYTES + 5000];
    /* many small frames, then bodies of odd sizes incl. empty, both ways */
    for (uint32_t i = 0; i < 1000; i++) {
        size_t n = make_frame(buf, HS_MSG_STATS, i, 4 + i % 97);
        ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    }
    PUMP_UNTIL(&S, &C, S.frames == 1000);
    ck_assert(!S.seq_broken);
    ck_assert_uint_eq(S.type, HS_MSG_STATS);
    ck_assert_uint_eq(S.body_len, 4 + 999 % 97);
    ck_assert_uint_eq(S.payload_bytes, 0);

    size_t n = make_frame(buf, HS_MSG_TICKET, 0, 4093);
    ck_assert_int_eq(hs_tp_send(sc, buf, n), HS_OK);
    /* a body near the limit (64 KiB here) goes through in one piece */
    uint8_t *big = malloc(HS_FRAME_HEADER_BYTES + 65000);
    n = make_frame(big, HS_MSG_PLAN, 1, 65000);
    ck_assert_int_eq(hs_tp_send(sc, big, n), HS_OK);
    free(big); /* copied by hs_tp_send */
    n = make_frame(buf, HS_MSG_BYE, 2, 0);
    ck_assert_int_eq(hs_tp_send(sc, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, C.frames == 3);
    ck_assert(!C.seq_broken);
    ck_assert_uint_eq(C.type, HS_MSG_BYE);
    ck_assert_uint_eq(C.body_len, 0);

    ck_assert(hs_tp_conn_is_loopback(g_cc));
    ck_assert(hs_tp_conn_is_loopback(sc));
    ck_assert_ptr_nonnull(strstr(hs_tp_conn_peer(g_cc), "127.0.0.1:"));
    ck_assert_ptr_nonnull(strstr(hs_tp_conn_describe(g_cc), hs_tp_kind_str(g_kind)));
    int tag;
    hs_tp_conn_set_user(sc, &tag);
    ck_assert_ptr_eq(hs_tp_conn_get_user(sc), &tag);
    ck_assert_int_eq(S.closes + C.closes, 0);
    pair_close_and_check_fds();
}
END_TEST

START_TEST(a_frame_that_breaks_the_send_rules_is_refused_locally)
{
    pair_open("127.0.0.1");
    uint8_t buf[HS_FRAME_HEADER_BYTES + 64];
    size_t n = make_frame(buf, HS_MSG_STATS, 0, 64);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n - 1), HS_ERR_INVALID); /* length != header */
    ck_assert_int_eq(hs_tp_send(g_cc, buf, 3), HS_ERR_INVALID);
    buf[0] ^= 0xff;
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_ERR_INVALID); /* bad magic */
    ck_assert_int_eq(hs_tp_send_payload(g_cc, buf, n, buf, 0, NULL, NULL), HS_ERR_INVALID);
    /* the connection is still fine */
    n = make_frame(buf, HS_MSG_STATS, 0, 8);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, S.frames == 1);
    pair_close_and_check_fds();
}
END_TEST

static int g_sent_ok, g_sent_failed;
static int g_send_calls[64];
static void cb_sent(void *arg, hs_status_t st)
{
    int i = (int)(intptr_t)arg;
    g_send_calls[i]++;
    if (st == HS_OK)
        g_sent_ok++;
    else
        g_sent_failed++;
}

static uint8_t *guarded_alloc(size_t len, size_t guard)
{
    uint8_t *p = malloc(len + 2 * guard);
    ck_assert_ptr_nonnull(p);
    memset(p, 0xA5, guard);
    memset(p + guard, 0, len);
    memset(p + guard + len, 0x5A, guard);
    return p;
}

static void assert_guards(const uint8_t *p, size_t len, size_t guard)
{
    for (size_t i = 0; i < guard; i++) {
        ck_assert_msg(p[i] == 0xA5, "byte %zu before dest was overwritten", guard - i);
        ck_assert_msg(p[guard + len + i] == 0x5A, "byte %zu after dest was overwritten", i);
    }
}

static void fill_pattern(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t st = seed;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = hs_splitmix64(&st);
        memcpy(p + i, &v, 8);
    }
    for (; i < len; i++)
        p[i] = (uint8_t)hs_splitmix64(&st);
}

START_TEST(a_64MiB_payload_lands_exactly_in_dest_and_nowhere_else)
{
    const size_t len = 64u << 20, guard = 4096;
    uint8_t *src = malloc(len);
    ck_assert_ptr_nonnull(src);
    fill_pattern(src, len, 42);
    uint8_t *region = guarded_alloc(len, guard);
    pair_open("127.0.0.1");
    ck_assert_int_eq(hs_tp_mem_register(S.tp, region, len + 2 * guard), HS_OK);
    ck_assert_int_eq(hs_tp_mem_register(C.tp, src, len), HS_OK);
    S.dest = region + guard;
    S.dest_len = len;
    g_sent_ok = g_sent_failed = 0;
    memset(g_send_calls, 0, sizeof g_send_calls);

    uint8_t frame[HS_FRAME_HEADER_BYTES + 40];
    size_t n = make_frame(frame, HS_MSG_DONE, 0, 40);
    double t0 = hs_now_s();
    ck_assert_int_eq(hs_tp_send_payload(g_cc, frame, n, src, len, cb_sent, (void *)0), HS_OK);
    /* the frame buffer is the caller's again at once */
    memset(frame, 0, sizeof frame);
    PUMP_UNTIL(&S, &C, S.payloads_ok + S.payloads_failed == 1 && g_sent_ok + g_sent_failed == 1);
    double dt = hs_now_s() - t0;
    if (getenv("HS_TEST_BENCH"))
        fprintf(stderr, "%s: 64 MiB payload in %.3f s = %.2f GB/s\n", hs_tp_kind_str(g_kind), dt,
                len / dt / 1e9);
    ck_assert_int_eq(S.payloads_ok, 1);
    ck_assert_uint_eq(S.last_cookie, 1000);
    ck_assert_int_eq(g_sent_ok, 1);
    ck_assert_int_eq(S.payload_frames, 1);
    ck_assert_uint_eq(S.payload_bytes, len);
    ck_assert_uint_eq(S.type, HS_MSG_DONE);
    ck_assert_uint_eq(S.body_len, 40);
    ck_assert_msg(memcmp(region + guard, src, len) == 0, "payload bytes differ from what was sent");
    assert_guards(region, len, guard);
    ck_assert_int_eq(S.closes + C.closes, 0);
    pair_close_and_check_fds();
    free(src);
    free(region);
}
END_TEST

/* UCX passes a memory handle with a payload only when one registration
 * holds all of it; otherwise it registers the memory itself, on the data
 * path. The transport counts those payloads. */
START_TEST(ucx_payloads_in_registered_memory_are_not_registered_on_the_fly)
{
    const size_t len = 1u << 20;
    uint8_t *src = malloc(len), *region = malloc(3 * len), *loose = malloc(len);
    ck_assert(src && region && loose);
    fill_pattern(src, len, 7);
    pair_open("127.0.0.1");
    ck_assert_int_eq(hs_tp_mem_register(S.tp, region, 2 * len), HS_OK);
    ck_assert_int_eq(hs_tp_mem_register(C.tp, src, len), HS_OK);
    ck_assert_uint_eq(S.tp->mem_registrations, 1);
    ck_assert_uint_eq(C.tp->mem_registrations, 1);
    uint8_t frame[HS_FRAME_HEADER_BYTES + 40];
    size_t n = make_frame(frame, HS_MSG_DONE, 0, 40);
    g_sent_ok = g_sent_failed = 0;

    S.dest = region + 4096; /* inside the registration */
    S.dest_len = len;
    ck_assert_int_eq(hs_tp_send_payload(g_cc, frame, n, src, len, cb_sent, (void *)0), HS_OK);
    PUMP_UNTIL(&S, &C, S.payloads_ok + S.payloads_failed == 1 && g_sent_ok + g_sent_failed == 1);
    ck_assert_int_eq(S.payloads_ok, 1);
    ck_assert_mem_eq(region + 4096, src, len);
    ck_assert_uint_eq(S.tp->payloads_unregistered, 0);
    ck_assert_uint_eq(C.tp->payloads_unregistered, 0);
    /* The handle travels only over RDMA lanes: over TCP or shared memory it
     * buys no zero copy and costs UCX time on every message. */
    uint64_t with = hs__ucx_describe_has_rdma(hs_tp_conn_describe(g_cc)) ? 1 : 0;
    ck_assert_uint_eq(S.tp->payloads_with_memh, with);
    ck_assert_uint_eq(C.tp->payloads_with_memh, with);

    S.dest = region + len + 4096; /* runs past the end of the registered 2 MiB */
    ck_assert_int_eq(hs_tp_send_payload(g_cc, frame, n, src, len, cb_sent, (void *)0), HS_OK);
    PUMP_UNTIL(&S, &C, S.payloads_ok + S.payloads_failed == 2 && g_sent_ok + g_sent_failed == 2);
    ck_assert_int_eq(S.payloads_ok, 2);
    ck_assert_uint_eq(S.tp->payloads_unregistered, 1);

    S.dest = region + 4096; /* from memory the sender did not register */
    memcpy(loose, src, len);
    ck_assert_int_eq(hs_tp_send_payload(g_cc, frame, n, loose, len, cb_sent, (void *)0), HS_OK);
    PUMP_UNTIL(&S, &C, S.payloads_ok + S.payloads_failed == 3 && g_sent_ok + g_sent_failed == 3);
    ck_assert_int_eq(S.payloads_ok, 3);
    ck_assert_uint_eq(S.tp->payloads_unregistered, 1);
    ck_assert_uint_eq(C.tp->payloads_unregistered, 1);
    ck_assert_int_eq(S.closes + C.closes, 0);
    pair_close_and_check_fds();
    free(src);
    free(region);
    free(loose);
}
END_TEST

START_TEST(payloads_and_frames_interleave_in_order)
{
    /* odd sizes, small (eager-sized) and large, each followed by a frame */
    static const size_t sizes[] = {1, 13, 4095, 65537, 1000003, 8u << 20};
    const int k = sizeof sizes / sizeof sizes[0];
    size_t total = 0;
    for (int i = 0; i < k; i++)
        total += sizes[i];
    uint8_t *src = malloc(total);
    fill_pattern(src, total, 7);
    uint8_t *dst = guarded_alloc(total, 64);
    pair_open("127.0.0.1");
    g_sent_ok = g_sent_failed = 0;
    memset(g_send_calls, 0, sizeof g_send_calls);
    uint8_t frame[HS_FRAME_HEADER_BYTES + 16];
    size_t off = 0;
    uint32_t seq = 0;
    for (int i = 0; i < k; i++) {
        size_t n = make_frame(frame, HS_MSG_DONE, seq++, 16);
        ck_assert_int_eq(
            hs_tp_send_payload(g_cc, frame, n, src + off, sizes[i], cb_sent, (void *)(intptr_t)i),
            HS_OK);
        n = make_frame(frame, HS_MSG_STATS, seq++, 8);
        ck_assert_int_eq(hs_tp_send(g_cc, frame, n), HS_OK);
        off += sizes[i];
    }
    /* the receiver accepts each payload at the next offset */
    S.dest = dst + 64;
    S.dest_len = total;
    S.advance = true;
    PUMP_UNTIL(&S, &C, S.frames == 2 * k && S.payloads_ok == k && g_sent_ok == k);
    ck_assert_uint_eq(S.last_cookie, 1000 + (uint64_t)k - 1);
    ck_assert(!S.seq_broken);
    for (int i = 0; i < k; i++)
        ck_assert_int_eq(g_send_calls[i], 1);
    ck_assert(memcmp(dst + 64, src, total) == 0);
    assert_guards(dst, total, 64);
    pair_close_and_check_fds();
    free(src);
    free(dst);
}
END_TEST

START_TEST(a_refused_payload_closes_the_connection_and_writes_nothing)
{
    const size_t len = 1u << 20;
    uint8_t *src = malloc(len);
    memset(src, 0x77, len);
    uint8_t *region = guarded_alloc(len, 64);
    pair_open("127.0.0.1");
    S.dest = NULL; /* refuse */
    g_sent_ok = g_sent_failed = 0;
    memset(g_send_calls, 0, sizeof g_send_calls);
    uint8_t frame[HS_FRAME_HEADER_BYTES + 8];
    size_t n = make_frame(frame, HS_MSG_DONE, 0, 8);
    ck_assert_int_eq(hs_tp_send_payload(g_cc, frame, n, src, len, cb_sent, (void *)0), HS_OK);
    PUMP_UNTIL(&S, &C, S.closes == 1 && C.closes == 1 && g_send_calls[0] == 1);
    ck_assert_int_eq(S.close_reason, HS_ERR_PROTO);
    ck_assert_ptr_nonnull(strstr(S.close_why, "not accepted"));
    ck_assert_int_eq(S.payloads_ok + S.payloads_failed, 0);
    ck_assert_int_ne(C.close_reason, HS_OK);
    for (size_t i = 0; i < len; i++)
        ck_assert_uint_eq(region[64 + i], 0);
    assert_guards(region, len, 64);
    pair_close_and_check_fds();
    ck_assert_int_eq(g_send_calls[0], 1);
    free(src);
    free(region);
}
END_TEST

START_TEST(a_payload_accepted_with_the_wrong_size_is_refused)
{
    const size_t len = 4096;
    uint8_t *src = malloc(len);
    memset(src, 0x33, len);
    uint8_t *region = guarded_alloc(len, 64);
    pair_open("127.0.0.1");
    S.dest = region + 64;
    S.dest_len = len;
    S.wrong_size = true;
    uint8_t frame[HS_FRAME_HEADER_BYTES + 8];
    size_t n = make_frame(frame, HS_MSG_DONE, 0, 8);
    ck_assert_int_eq(hs_tp_send_payload(g_cc, frame, n, src, len, NULL, NULL), HS_OK);
    PUMP_UNTIL(&S, &C, S.closes == 1);
    ck_assert_int_eq(S.close_reason, HS_ERR_PROTO);
    for (size_t i = 0; i < len; i++)
        ck_assert_uint_eq(region[64 + i], 0);
    assert_guards(region, len, 64);
    pair_close_and_check_fds();
    free(src);
    free(region);
}
END_TEST

START_TEST(a_crc_mismatch_closes_that_connection_only)
{
    pair_open("127.0.0.1");
    /* a second, good connection */
    hs_tp_conn_t *good;
    ck_assert_int_eq(connect_while_serving(&S, &C, "127.0.0.1", g_port, &good), HS_OK);
    PUMP_UNTIL(&S, &C, S.accepts == 2);
    uint8_t buf[HS_FRAME_HEADER_BYTES + 32];
    size_t n = make_frame(buf, HS_MSG_STATS, 0, 32);
    buf[HS_FRAME_HEADER_BYTES + 10] ^= 1; /* header crc no longer matches */
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, S.closes == 1 && C.closes == 1);
    ck_assert_int_eq(S.close_reason, HS_ERR_CHECKSUM);
    ck_assert_ptr_eq(S.closed_conn, S.accepted[0]);
    ck_assert_ptr_eq(C.closed_conn, g_cc);
    ck_assert_int_eq(S.frames, 0);
    n = make_frame(buf, HS_MSG_STATS, 0, 32);
    ck_assert_int_eq(hs_tp_send(good, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, S.frames == 1);
    ck_assert_int_eq(S.closes, 1);
    pair_close_and_check_fds();
}
END_TEST

static atomic_int g_in_progress;
static void *wake_later(void *arg)
{
    hs_tp_t *tp = arg;
    while (!g_in_progress)
        usleep(1000);
    usleep(100 * 1000); /* let the main thread block in progress */
    hs_tp_wakeup(tp);
    return NULL;
}

START_TEST(wakeup_from_another_thread_unblocks_progress)
{
    int fds0 = count_fds();
    side_t s;
    side_create(&s, g_kind);
    /* warm up: a progress with nothing to do returns after its timeout */
    ck_assert_int_eq(hs_tp_progress(s.tp, 0), HS_OK);
    pthread_t th;
    g_in_progress = 0;
    pthread_create(&th, NULL, wake_later, s.tp);
    g_in_progress = 1;
    /* blocks until something happens: only the wakeup can end it (a broken
     * wakeup hangs here and the test's timeout fails it) */
    for (int i = 0; i < 1; i++)
        ck_assert_int_eq(hs_tp_progress(s.tp, -1), HS_OK);
    pthread_join(th, NULL);
    /* a wakeup before progress makes the next one return too */
    hs_tp_wakeup(s.tp);
    ck_assert_int_eq(hs_tp_progress(s.tp, -1), HS_OK);
    hs_tp_destroy(s.tp);
    ck_assert_int_eq(count_fds(), fds0);
}
END_TEST

START_TEST(send_completions_run_exactly_once_when_the_connection_dies)
{
    const size_t len = 4u << 20;
    const int k = 8;
    uint8_t *src = malloc(len);
    memset(src, 1, len);
    uint8_t *dst = malloc(len);
    pair_open("127.0.0.1");
    S.dest = dst;
    S.dest_len = len;
    S.close_at_payload_frame = 2; /* the server hangs up at the second payload */
    g_sent_ok = g_sent_failed = 0;
    memset(g_send_calls, 0, sizeof g_send_calls);
    uint8_t frame[HS_FRAME_HEADER_BYTES + 8];
    for (int i = 0; i < k; i++) {
        size_t n = make_frame(frame, HS_MSG_DONE, (uint32_t)i, 8);
        ck_assert_int_eq(hs_tp_send_payload(g_cc, frame, n, src, len, cb_sent, (void *)(intptr_t)i),
                         HS_OK);
    }
    PUMP_UNTIL(&S, &C, C.closes == 1 && S.closes == 1 && g_sent_ok + g_sent_failed == k);
    /* the one accepted payload was reported once (landed, or failed by the close) */
    ck_assert_int_eq(S.payloads_ok + S.payloads_failed, 1);
    ck_assert_int_eq(S.payload_frames, 2);
    ck_assert_int_eq(g_sent_ok + g_sent_failed, k);
    ck_assert_int_ge(g_sent_failed, 1);
    for (int i = 0; i < k; i++)
        ck_assert_int_eq(g_send_calls[i], 1);
    /* sends on a closed connection's transport still work for new ones */
    pair_close_and_check_fds();
    for (int i = 0; i < k; i++)
        ck_assert_int_eq(g_send_calls[i], 1);
    free(src);
    free(dst);
}
END_TEST

START_TEST(destroy_fails_pending_sends_and_receives_exactly_once)
{
    const size_t len = 32u << 20;
    uint8_t *src = malloc(len);
    memset(src, 2, len);
    uint8_t *dst = malloc(len);
    pair_open("127.0.0.1");
    S.dest = dst;
    S.dest_len = len;
    g_sent_ok = g_sent_failed = 0;
    memset(g_send_calls, 0, sizeof g_send_calls);
    uint8_t frame[HS_FRAME_HEADER_BYTES + 8];
    for (int i = 0; i < 4; i++) {
        size_t n = make_frame(frame, HS_MSG_DONE, (uint32_t)i, 8);
        ck_assert_int_eq(hs_tp_send_payload(g_cc, frame, n, src, len, cb_sent, (void *)(intptr_t)i),
                         HS_OK);
    }
    /* get the first payload going, then tear both ends down mid-transfer */
    PUMP_UNTIL(&S, &C, S.payload_frames >= 1);
    int accepted = S.payload_frames; /* TCP: one at a time; UCX: all may be under way */
    hs_tp_destroy(S.tp);
    ck_assert_int_eq(S.closes, 1);
    ck_assert_int_eq(S.payloads_ok + S.payloads_failed, accepted);
    hs_tp_destroy(C.tp);
    ck_assert_int_eq(C.closes, 1);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(g_send_calls[i], 1);
    ck_assert_int_ge(g_sent_failed, 1);
    ck_assert_int_eq(count_fds(), g_fds0);
    free(src);
    free(dst);
}
END_TEST

START_TEST(a_sender_that_vanishes_mid_payload_fails_the_receive_once)
{
    const size_t len = 64u << 20;
    uint8_t *src = malloc(len);
    memset(src, 3, len);
    uint8_t *dst = malloc(len);
    pair_open("127.0.0.1");
    S.dest = dst;
    S.dest_len = len;
    g_sent_ok = g_sent_failed = 0;
    memset(g_send_calls, 0, sizeof g_send_calls);
    uint8_t frame[HS_FRAME_HEADER_BYTES + 8];
    size_t n = make_frame(frame, HS_MSG_DONE, 0, 8);
    ck_assert_int_eq(hs_tp_send_payload(g_cc, frame, n, src, len, cb_sent, (void *)0), HS_OK);
    PUMP_UNTIL(&S, &C, S.payload_frames == 1);
    hs_tp_destroy(C.tp); /* the producer goes away with its payload half sent */
    ck_assert_int_eq(g_send_calls[0], 1);
    PUMP_UNTIL(&S, NULL, S.closes == 1);
    ck_assert_int_eq(S.payloads_ok + S.payloads_failed, 1);
    if (S.payloads_ok == 0) ck_assert_int_ne(S.close_reason, HS_OK);
    hs_tp_destroy(S.tp);
    ck_assert_int_eq(count_fds(), g_fds0);
    free(src);
    free(dst);
}
END_TEST

START_TEST(close_flushes_queued_frames_and_the_peer_sees_an_orderly_close)
{
    pair_open("127.0.0.1");
    uint8_t buf[HS_FRAME_HEADER_BYTES + 100];
    for (uint32_t i = 0; i < 50; i++) {
        size_t n = make_frame(buf, HS_MSG_STATS, i, 100);
        ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    }
    size_t n = make_frame(buf, HS_MSG_BYE, 50, 4);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    hs_tp_close(g_cc, HS_ERR_CLOSED);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_ERR_CLOSED);
    ck_assert_int_eq(C.closes, 0); /* on_close comes from a later progress */
    PUMP_UNTIL(&S, &C, S.closes == 1 && C.closes == 1);
    ck_assert_int_eq(S.frames, 51);
    ck_assert(!S.seq_broken);
    ck_assert_uint_eq(S.type, HS_MSG_BYE);
    ck_assert_int_eq(S.close_reason, HS_ERR_CLOSED);
    ck_assert_int_eq(C.close_reason, HS_ERR_CLOSED);
    pair_close_and_check_fds();
}
END_TEST

START_TEST(ipv6_loopback_works)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool have6 = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) close(fd);
    if (!have6) {
        fprintf(stderr, "no ::1 here, skipping the IPv6 case\n");
        return;
    }
    pair_open("::1");
    ck_assert(hs_tp_conn_is_loopback(g_cc));
    ck_assert_ptr_nonnull(strstr(hs_tp_conn_peer(g_cc), "[::1]:"));
    uint8_t buf[HS_FRAME_HEADER_BYTES + 8];
    size_t n = make_frame(buf, HS_MSG_HELLO, 0, 8);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, S.frames == 1);
    pair_close_and_check_fds();
}
END_TEST

START_TEST(connect_to_a_port_nobody_listens_on_times_out)
{
    int fds0 = count_fds();
    side_t s;
    side_create(&s, g_kind);
    /* a port that was free a moment ago */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    hs_tp_conn_t *c = NULL;
    hs_status_t st = hs_tp_connect(s.tp, "127.0.0.1", ntohs(a.sin_port), 300, &c);
    ck_assert_int_ne(st, HS_OK);
    ck_assert_ptr_null(c);
    hs_tp_destroy(s.tp);
    ck_assert_int_eq(count_fds(), fds0);
}
END_TEST

/* A loopback port that drops every SYN unanswered, as a black-holed or
 * filtered host does: a listener with backlog 0 whose one queued connection
 * (*filler) is never accepted; with its accept queue full the kernel drops
 * the SYNs that follow. Returns the listener. */
static int black_hole_open(uint16_t *port, int *filler)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(l, 0), 0);
    socklen_t len = sizeof a;
    ck_assert_int_eq(getsockname(l, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    *filler = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_eq(connect(*filler, (struct sockaddr *)&a, sizeof a), 0);
    /* the queue is full now: a further connect must hang */
    int probe = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ck_assert_int_eq(connect(probe, (struct sockaddr *)&a, sizeof a), -1);
    ck_assert_int_eq(errno, EINPROGRESS);
    struct pollfd pf = {.fd = probe, .events = POLLOUT};
    ck_assert_int_eq(poll(&pf, 1, 300), 0);
    close(probe);
    return l;
}

START_TEST(a_connect_to_a_black_holed_port_ends_at_its_deadline)
{
    int fds0 = count_fds();
    side_t s;
    side_create(&s, g_kind);
    uint16_t port;
    int filler, l = black_hole_open(&port, &filler);
    hs_tp_conn_t *c = NULL;
    uint64_t t0 = hs_now_ns();
    hs_status_t st = hs_tp_connect(s.tp, "127.0.0.1", port, 700, &c);
    double took = (double)(hs_now_ns() - t0) / 1e9;
    ck_assert_int_eq(st, HS_ERR_TIMEOUT);
    ck_assert_ptr_null(c);
    /* a connect left to the kernel would wait out its SYN retries (minutes) */
    ck_assert_msg(took >= 0.6 && took < 5.0, "connect took %.2f s for a 0.7 s deadline", took);
    close(filler);
    close(l);
    hs_tp_destroy(s.tp);
    ck_assert_int_eq(count_fds(), fds0);
}
END_TEST

START_TEST(a_connect_that_waiting_cannot_mend_fails_at_once)
{
    int fds0 = count_fds();
    side_t s;
    side_create(&s, g_kind);
    hs_tp_conn_t *c = NULL;
    uint64_t t0 = hs_now_ns();
    /* TCP has no route to a multicast group (ENETUNREACH) on any host */
    hs_status_t st = hs_tp_connect(s.tp, "224.0.0.1", 9, 15000, &c);
    double took = (double)(hs_now_ns() - t0) / 1e9;
    ck_assert_int_eq(st, HS_ERR_IO);
    ck_assert_ptr_null(c);
    ck_assert_msg(took < 3.0, "a connect with no route took %.2f s of its 15 s deadline", took);
    hs_tp_destroy(s.tp);
    ck_assert_int_eq(count_fds(), fds0);
}
END_TEST

START_TEST(require_rdma_refuses_a_path_without_rdma)
{
    int fds0 = count_fds();
    hs_tp_config_t cfg = {.kind = g_kind, .require_rdma = true, .net_devices = "lo"};
    hs_tp_t *tp = NULL;
    if (g_kind == HS_TP_TCP) {
        ck_assert_int_eq(hs_tp_create(&cfg, &g_cb, &C, &tp), HS_ERR_UNSUPPORTED);
        ck_assert_ptr_null(tp);
        return;
    }
    /* loopback over "lo" has no verbs lane: the client refuses it */
    side_create(&S, g_kind);
    memset(&C, 0, sizeof C);
    ck_assert_int_eq(hs_tp_create(&cfg, &g_cb, &C, &C.tp), HS_OK);
    ck_assert_int_eq(hs_tp_listen(S.tp, "127.0.0.1", 0, &g_port), HS_OK);
    hs_tp_conn_t *c = NULL;
    ck_assert_int_eq(connect_while_serving(&S, &C, "127.0.0.1", g_port, &c), HS_ERR_UNSUPPORTED);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(C.closes, 0); /* never handed out, so no on_close */
    PUMP_UNTIL(&S, &C, S.closes == S.accepts);
    hs_tp_destroy(C.tp);
    hs_tp_destroy(S.tp);
    ck_assert_int_eq(count_fds(), fds0);
}
END_TEST

START_TEST(net_devices_limit_what_carries_a_connection)
{
    if (g_kind != HS_TP_UCX) return; /* TCP follows the routing table */
    g_fds0 = count_fds();
    side_create(&S, g_kind);
    memset(&C, 0, sizeof C);
    hs_tp_config_t cfg = {.kind = g_kind, .net_devices = "lo"};
    ck_assert_int_eq(hs_tp_create(&cfg, &g_cb, &C, &C.tp), HS_OK);
    ck_assert_int_eq(hs_tp_listen(S.tp, "127.0.0.1", 0, &g_port), HS_OK);
    ck_assert_int_eq(connect_while_serving(&S, &C, "127.0.0.1", g_port, &g_cc), HS_OK);
    const char *d = hs_tp_conn_describe(g_cc);
    ck_assert_msg(strstr(d, "/lo[") && !strstr(d, "eth"), "described as '%s'", d);
    pair_close_and_check_fds();
}
END_TEST

/* ---- malformed peers over a raw TCP socket ------------------------------- */

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void raw_write(int fd, const void *p, size_t n)
{
    ck_assert_int_eq(write(fd, p, n), (ssize_t)n);
}

/* A raw TCP message: 8-byte payload length, then the frame. */
static size_t raw_message(uint8_t *buf, uint64_t payload_len, uint16_t type, uint32_t body_len)
{
    hs_le64_store(buf, payload_len);
    return 8 + make_frame(buf + 8, type, 0, body_len);
}

/* Reads what the server sent back before closing: expects an ERROR frame. */
static void raw_expect_error_then_eof(int fd)
{
    uint8_t buf[1024];
    size_t got = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ck_assert_int_eq(poll(&p, 1, (int)(PUMP_LIMIT_S * 1000)), 1);
        ssize_t r = read(fd, buf + got, sizeof buf - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    ck_assert_uint_ge(got, 8 + HS_FRAME_HEADER_BYTES);
    hs_frame_header_t h;
    char why[160];
    ck_assert_int_eq(hs_frame_header_decode(buf + 8, HS_FRAME_MAX_BODY, &h, why, sizeof why),
                     HS_OK);
    ck_assert_uint_eq(h.type, HS_MSG_ERROR);
}

/* Server + one good client; a raw socket misbehaves; checks the raw one is
 * closed with `want` and the good one still works. */
static void raw_case(const void *bytes, size_t n, bool then_close, hs_status_t want,
                     bool expect_error_frame)
{
    pair_open("127.0.0.1");
    int fd = raw_connect(g_port);
    PUMP_UNTIL(&S, &C, S.accepts == 2);
    raw_write(fd, bytes, n);
    if (then_close) shutdown(fd, SHUT_WR);
    PUMP_UNTIL(&S, &C, S.closes == 1);
    ck_assert_msg(S.close_reason == want, "closed with %s (%s), expected %s",
                  hs_status_str(S.close_reason), S.close_why, hs_status_str(want));
    ck_assert_ptr_eq(S.closed_conn, S.accepted[1]);
    ck_assert_int_eq(S.frames, 0);
    if (expect_error_frame) raw_expect_error_then_eof(fd);
    close(fd);
    uint8_t buf[HS_FRAME_HEADER_BYTES + 16];
    size_t m = make_frame(buf, HS_MSG_STATS, 0, 16);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, m), HS_OK);
    PUMP_UNTIL(&S, &C, S.frames == 1);
    ck_assert_int_eq(S.closes, 1);
    ck_assert_int_eq(C.closes, 0);
    pair_close_and_check_fds();
}

START_TEST(garbage_bytes_close_that_connection_with_a_format_error)
{
    uint8_t junk[64];
    for (int i = 0; i < 64; i++)
        junk[i] = (uint8_t)(i * 37 + 1);
    raw_case(junk, sizeof junk, false, HS_ERR_FORMAT, true);
}
END_TEST

START_TEST(an_oversized_body_len_is_rejected_before_reading_the_body)
{
    uint8_t buf[8 + HS_FRAME_HEADER_BYTES + 16];
    raw_message(buf, 0, HS_MSG_STATS, 16);
    uint32_t huge = (64u << 10) + 1; /* the server's max_frame_body is 64 KiB */
    hs_le32_store(buf + 8 + 8, huge);
    raw_case(buf, 8 + HS_FRAME_HEADER_BYTES, false, HS_ERR_FORMAT, true);
}
END_TEST

START_TEST(a_truncated_frame_then_eof_closes_with_an_io_error)
{
    uint8_t buf[8 + HS_FRAME_HEADER_BYTES + 100];
    size_t n = raw_message(buf, 0, HS_MSG_STATS, 100);
    raw_case(buf, n - 30, true, HS_ERR_IO, false);
}
END_TEST

START_TEST(a_crc_mismatch_from_a_raw_peer_gets_an_error_frame)
{
    uint8_t buf[8 + HS_FRAME_HEADER_BYTES + 100];
    size_t n = raw_message(buf, 0, HS_MSG_STATS, 100);
    buf[n - 1] ^= 0x40;
    raw_case(buf, n, false, HS_ERR_CHECKSUM, true);
}
END_TEST

START_TEST(a_wrong_protocol_version_closes_with_a_mismatch)
{
    uint8_t buf[8 + HS_FRAME_HEADER_BYTES + 4];
    size_t n = raw_message(buf, 0, HS_MSG_HELLO, 4);
    buf[8 + 4] = 99; /* version */
    raw_case(buf, n, false, HS_ERR_MISMATCH, true);
}
END_TEST

START_TEST(a_per_connection_frame_limit_holds_until_raised)
{
    g_accept_max_frame = 1024; /* as a consumer does before it admits a peer */
    pair_open("127.0.0.1");
    hs_tp_conn_t *sc = S.accepted[0];
    ck_assert_int_eq(hs_tp_conn_set_max_frame(sc, (64u << 10) + 1), HS_ERR_INVALID);
    uint8_t *buf = malloc(HS_FRAME_HEADER_BYTES + 4096);
    size_t n = make_frame(buf, HS_MSG_STATS, 0, 1024);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, S.frames == 1);
    /* raised to the transport's limit: a bigger frame passes */
    ck_assert_int_eq(hs_tp_conn_set_max_frame(sc, 0), HS_OK);
    n = make_frame(buf, HS_MSG_STATS, 1, 4096);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, S.frames == 2);
    /* lowered again: one byte over the limit closes the connection */
    ck_assert_int_eq(hs_tp_conn_set_max_frame(sc, 1024), HS_OK);
    n = make_frame(buf, HS_MSG_STATS, 2, 1025);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, S.closes == 1);
    ck_assert_int_eq(S.close_reason, HS_ERR_FORMAT);
    ck_assert_int_eq(S.frames, 2);
    free(buf);
    g_accept_max_frame = 0;
    pair_close_and_check_fds();
}
END_TEST

/* ---- the UCX bootstrap: who may connect ------------------------------------- */

static hs_auth_key_t g_key_a, g_key_b;

static void keys_make(void)
{
    for (size_t i = 0; i < sizeof g_key_a.bytes; i++) {
        g_key_a.bytes[i] = (uint8_t)(i * 13 + 1);
        g_key_b.bytes[i] = (uint8_t)(i * 13 + 2);
    }
}

static void side_create_auth(side_t *s, const hs_auth_key_t *key, bool allow_remote)
{
    memset(s, 0, sizeof *s);
    s->next_cookie = 1000;
    hs_tp_config_t cfg = {.kind = HS_TP_UCX,
                          .max_frame_body = 64u << 10,
                          .auth_key = key,
                          .allow_remote = allow_remote};
    ck_assert_int_eq(hs_tp_create(&cfg, &g_cb, s, &s->tp), HS_OK);
}

/* Connects a client with client_key to a server with server_key; returns
 * what hs_tp_connect returned and leaves both sides open in S and C. */
static hs_status_t boot_try(const hs_auth_key_t *server_key, bool allow_remote,
                            bool loopback_is_remote, const hs_auth_key_t *client_key)
{
    g_fds0 = count_fds();
    keys_make();
    side_create_auth(&S, server_key, allow_remote);
    side_create_auth(&C, client_key, false);
    S.tp->loopback_is_remote = loopback_is_remote;
    ck_assert_int_eq(hs_tp_listen(S.tp, "127.0.0.1", 0, &g_port), HS_OK);
    g_cc = NULL;
    hs_status_t st = connect_while_serving(&S, &C, "127.0.0.1", g_port, &g_cc);
    if (st == HS_OK) PUMP_UNTIL(&S, &C, S.accepts == 1);
    return st;
}

START_TEST(ucx_a_remote_peer_without_a_secret_is_refused_before_ucx_sees_its_address)
{
    ck_assert_int_eq(boot_try(NULL, false, true, NULL), HS_ERR_AUTH);
    ck_assert_ptr_null(g_cc);
    ck_assert_uint_eq(S.tp->boot_passed, 0);
    ck_assert_uint_eq(S.tp->boot_refused, 1);
    ck_assert_int_eq(S.accepts, 0);
    pair_close_and_check_fds();
    /* --insecure lets it in */
    ck_assert_int_eq(boot_try(NULL, true, true, NULL), HS_OK);
    ck_assert_uint_eq(S.tp->boot_passed, 1);
    pair_close_and_check_fds();
}
END_TEST

START_TEST(ucx_a_shared_secret_is_proved_both_ways_in_the_bootstrap)
{
    /* the right secret, even from a peer that looks remote */
    ck_assert_int_eq(boot_try(&g_key_a, false, true, &g_key_a), HS_OK);
    ck_assert_uint_eq(S.tp->boot_passed, 1);
    uint8_t buf[HS_FRAME_HEADER_BYTES + 16];
    size_t n = make_frame(buf, HS_MSG_STATS, 0, 16);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, S.frames == 1);
    pair_close_and_check_fds();
    /* a wrong secret, no secret, a secret the server does not have */
    const hs_auth_key_t *server[] = {&g_key_a, &g_key_a, NULL};
    const hs_auth_key_t *client[] = {&g_key_b, NULL, &g_key_a};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(boot_try(server[i], false, false, client[i]), HS_ERR_AUTH);
        ck_assert_uint_eq(S.tp->boot_passed, 0);
        ck_assert_uint_eq(S.tp->boot_refused, 1);
        ck_assert_int_eq(S.accepts, 0);
        pair_close_and_check_fds();
    }
}
END_TEST

START_TEST(ucx_malformed_bootstrap_records_never_reach_ucx)
{
    ck_assert_int_eq(boot_try(&g_key_a, false, false, &g_key_a), HS_OK);
    /* what each raw peer sends: a version-1 hello with a 13-byte address,
     * a HELLO with a wrong proof and a 13-byte address right behind it,
     * a body length of 2^32-1, and an AUTH before any HELLO */
    uint8_t v1[12 + 13] = {'H', 'S', 'U', 'X', 1, 0, 0, 0, 13, 0, 0, 0};
    uint8_t hello_auth[48 + 12 + 32 + 13] = {'H', 'S', 'U', 'X', 2, 0, 1, 0, 36, 0, 0, 0, 1};
    memcpy(hello_auth + 48, (uint8_t[]){'H', 'S', 'U', 'X', 2, 0, 3, 0, 45, 0, 0, 0}, 12);
    uint8_t huge[48 + 12] = {'H', 'S', 'U', 'X', 2, 0, 1, 0, 36, 0, 0, 0, 1};
    memcpy(huge + 48, (uint8_t[]){'H', 'S', 'U', 'X', 2, 0, 3, 0, 0xff, 0xff, 0xff, 0xff}, 12);
    uint8_t early[12 + 45] = {'H', 'S', 'U', 'X', 2, 0, 3, 0, 45, 0, 0, 0};
    struct {
        const uint8_t *b;
        size_t n;
    } raw[] = {{v1, sizeof v1},
               {hello_auth, sizeof hello_auth},
               {huge, sizeof huge},
               {early, sizeof early}};
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        int fd = raw_connect(g_port);
        raw_write(fd, raw[i].b, raw[i].n);
        /* a REFUSE record comes back, then the end of the stream */
        uint8_t got[512];
        size_t len = 0;
        double t0 = hs_now_s();
        for (;;) {
            pump2(&S, &C);
            ck_assert_msg(hs_now_s() - t0 < PUMP_LIMIT_S, "raw peer %zu never closed", i);
            ssize_t r = recv(fd, got + len, sizeof got - len, MSG_DONTWAIT);
            if (r < 0 && errno == EAGAIN) continue;
            if (r <= 0) break;
            len += (size_t)r;
        }
        size_t off = len >= 48 && got[6] == 2 ? 48 : 0; /* after a CHALLENGE */
        ck_assert_msg(len >= off + 16 && got[off + 6] == 5, "raw peer %zu: no REFUSE (%zu bytes)",
                      i, len);
        close(fd);
    }
    ck_assert_uint_eq(S.tp->boot_passed, 1); /* the real client only */
    ck_assert_uint_eq(S.tp->boot_refused, 4);
    uint8_t buf[HS_FRAME_HEADER_BYTES + 16];
    size_t n = make_frame(buf, HS_MSG_STATS, 0, 16);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, S.frames == 1);
    ck_assert_int_eq(S.accepts, 1);
    pair_close_and_check_fds();
}
END_TEST

/* ---- UCX worker addresses (ucx_addr.c, no UCX needed) ---------------------- */

/* A v1 worker address as UCX 1.13 packs it: header, uuid, then two devices
 * with one transport each (a 6-byte device address and a 2-byte iface
 * address, like tcp over IPv4; and a shared-memory-like entry without a
 * device address). Returns its length. */
static size_t addr_v1(uint8_t *b, uint16_t csum_a, uint16_t csum_b)
{
    size_t n = 0;
    b[n++] = 0x20; /* version 1 (0), flags: worker uuid */
    for (int i = 0; i < 8; i++)
        b[n++] = (uint8_t)(0xa0 + i);
    const uint16_t csums[2] = {csum_a, csum_b};
    const uint8_t dev_len[2] = {6, 0}, iface_len[2] = {2, 8};
    for (int d = 0; d < 2; d++) {
        b[n++] = (uint8_t)(d + 1);                            /* md index */
        b[n++] = (uint8_t)((d == 1 ? 0x80 : 0) | dev_len[d]); /* last device | length */
        for (int i = 0; i < dev_len[d]; i++)
            b[n++] = (uint8_t)(10 + i);
        memcpy(b + n, &csums[d], 2);
        n += 2;
        float attr[3] = {1e-7f, 1e9f, 2e-6f};
        memcpy(b + n, attr, sizeof attr);
        n += sizeof attr;
        memset(b + n, 0, 4); /* prio and capability flags */
        n += 4;
        b[n++] = (uint8_t)(0x80 | iface_len[d]); /* last transport | length */
        for (int i = 0; i < iface_len[d]; i++)
            b[n++] = (uint8_t)(40 + i);
    }
    return n;
}

START_TEST(ucx_worker_addresses_are_walked_within_their_bytes)
{
    uint8_t a[128], out[128];
    size_t n = addr_v1(a, 0x19cf, 0x7563);
    char why[256];
    hs__ucx_addr_t *p = malloc(sizeof *p), *mine = malloc(sizeof *mine);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(mine);
    ck_assert_int_eq(hs__ucx_addr_parse(a, n, p, why, sizeof why), HS_OK);
    ck_assert_uint_eq(p->version, 1);
    ck_assert_uint_eq(p->n_devices, 2);
    ck_assert_uint_eq(p->n_entries, 2);
    ck_assert_uint_eq(p->entries[0].dev_addr_len, 6);
    ck_assert_uint_eq(p->entries[1].iface_addr_len, 8);
    /* every shorter prefix, and one byte more, are refused */
    for (size_t k = 0; k < n; k++)
        ck_assert_msg(hs__ucx_addr_parse(a, k, p, why, sizeof why) == HS_ERR_FORMAT,
                      "a %zu-byte prefix parsed", k);
    a[n] = 0;
    ck_assert_int_eq(hs__ucx_addr_parse(a, n + 1, p, why, sizeof why), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "after its last device"));
    /* a 1-byte address, an unknown version, a NaN bandwidth, endpoint
     * addresses, an md index UCX cannot hold */
    ck_assert_int_eq(hs__ucx_addr_parse((const uint8_t *)"\x00", 1, p, why, sizeof why),
                     HS_ERR_FORMAT);
    ck_assert_int_eq(hs__ucx_addr_parse(NULL, 0, p, why, sizeof why), HS_ERR_FORMAT);
    uint8_t bad[128];
    memcpy(bad, a, n);
    bad[0] = 0x27; /* version 8 */
    ck_assert_int_eq(hs__ucx_addr_parse(bad, n, p, why, sizeof why), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "version 8"));
    memcpy(bad, a, n);
    float nan_bw = NAN;
    memcpy(bad + 9 + 2 + 6 + 2 + 4, &nan_bw, 4);
    ck_assert_int_eq(hs__ucx_addr_parse(bad, n, p, why, sizeof why), HS_ERR_FORMAT);
    memcpy(bad, a, n);
    bad[9 + 2 + 6 + 2 + 16] |= 0x40; /* endpoint addresses follow */
    ck_assert_int_eq(hs__ucx_addr_parse(bad, n, p, why, sizeof why), HS_ERR_FORMAT);
    memcpy(bad, a, n);
    bad[9] = 0x1f; /* md 31 is fine in v1 */
    ck_assert_int_eq(hs__ucx_addr_parse(bad, n, p, why, sizeof why), HS_OK);
    /* every single-bit flip parses within the buffer or is refused */
    for (size_t k = 0; k < n * 8; k++) {
        memcpy(bad, a, n);
        bad[k / 8] ^= (uint8_t)(1u << (k % 8));
        if (hs__ucx_addr_parse(bad, n, p, why, sizeof why) != HS_OK) continue;
        for (uint32_t e = 0; e < p->n_entries; e++)
            ck_assert(p->entries[e].end <= n && p->entries[e].dev_end <= p->entries[e].start);
    }

    /* filtering: only what this side has too */
    ck_assert_int_eq(hs__ucx_addr_parse(a, n, mine, why, sizeof why), HS_OK);
    size_t m = 0;
    ck_assert_int_eq(hs__ucx_addr_filter(a, n, mine, out, &m, why, sizeof why), HS_OK);
    ck_assert_uint_eq(m, n);
    ck_assert_mem_eq(out, a, n);
    uint8_t other[128];
    size_t on = addr_v1(other, 0x19cf, 0x1234); /* the second transport unknown here */
    ck_assert_int_eq(hs__ucx_addr_filter(other, on, mine, out, &m, why, sizeof why), HS_OK);
    ck_assert_int_eq(hs__ucx_addr_parse(out, m, p, why, sizeof why), HS_OK);
    ck_assert_uint_eq(p->n_entries, 1);
    ck_assert_uint_eq(p->entries[0].tl_csum, 0x19cf);
    ck_assert(out[p->entries[0].dev_len_at] & 0x80); /* now the last device */
    on = addr_v1(other, 0x19cf, 0x7563);
    other[9 + 1] = 4; /* same transport, a 4-byte device address: not ours */
    memmove(other + 9 + 2 + 4, other + 9 + 2 + 6, on - (9 + 2 + 6));
    on -= 2;
    ck_assert_int_eq(hs__ucx_addr_filter(other, on, mine, out, &m, why, sizeof why), HS_OK);
    ck_assert_int_eq(hs__ucx_addr_parse(out, m, p, why, sizeof why), HS_OK);
    ck_assert_uint_eq(p->n_entries, 1);
    ck_assert_uint_eq(p->entries[0].tl_csum, 0x7563);
    on = addr_v1(other, 0x1111, 0x2222);
    ck_assert_int_eq(hs__ucx_addr_filter(other, on, mine, out, &m, why, sizeof why),
                     HS_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(why, "none of the 2 transports"));
    free(p);
    free(mine);
}
END_TEST

/* Plays a producer that holds the secret: HELLO, the proof of the
 * CHALLENGE, then an AUTH carrying `addr`; returns the REFUSE text the
 * server answered with ("" when it sent none). */
static void proven_peer_auth(const uint8_t *addr, size_t addr_len, char *text, size_t cap)
{
    int fd = raw_connect(g_port);
    uint8_t nonce[HS__UCX_BOOT_NONCE], hello[HS__UCX_BOOT_HELLO_BYTES];
    for (size_t i = 0; i < sizeof nonce; i++)
        nonce[i] = (uint8_t)(i * 7 + 3);
    hs__ucx_boot_pack_nonce(hello, HS__UCX_BOOT_HELLO, HS__UCX_BOOT_FLAG_KEY, nonce);
    raw_write(fd, hello, sizeof hello);
    uint8_t got[1024];
    size_t len = 0;
    bool authed = false;
    double t0 = hs_now_s();
    for (;;) {
        pump2(&S, &C);
        ck_assert_msg(hs_now_s() - t0 < PUMP_LIMIT_S, "the server never answered");
        ssize_t r = recv(fd, got + len, sizeof got - len, MSG_DONTWAIT);
        if (r < 0 && errno == EAGAIN) continue;
        if (r <= 0) break;
        len += (size_t)r;
        if (!authed && len >= HS__UCX_BOOT_HELLO_BYTES) {
            ck_assert_uint_eq(got[6], HS__UCX_BOOT_CHALLENGE);
            uint8_t mac[HS_AUTH_MAC_BYTES];
            ck_assert_int_eq(hs_auth_producer_mac(&g_key_a, got + HS__UCX_BOOT_HEAD + 4, nonce,
                                                  hello, sizeof hello, mac),
                             HS_OK);
            uint8_t head[HS__UCX_BOOT_HEAD];
            hs__ucx_boot_head_pack(head, HS__UCX_BOOT_AUTH, (uint32_t)(sizeof mac + addr_len));
            raw_write(fd, head, sizeof head);
            raw_write(fd, mac, sizeof mac);
            raw_write(fd, addr, addr_len);
            authed = true;
        }
    }
    close(fd);
    text[0] = '\0';
    hs__ucx_boot_msg_t m;
    char why[256];
    if (len > HS__UCX_BOOT_HELLO_BYTES &&
        hs__ucx_hello_parse(got + HS__UCX_BOOT_HELLO_BYTES, len - HS__UCX_BOOT_HELLO_BYTES, &m, why,
                            sizeof why) == HS_OK &&
        m.type == HS__UCX_BOOT_REFUSE)
        snprintf(text, cap, "%s", m.text);
}

START_TEST(ucx_a_proven_peer_with_a_malformed_worker_address_is_refused)
{
    ck_assert_int_eq(boot_try(&g_key_a, false, false, &g_key_a), HS_OK);
    uint8_t noise[300];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof noise; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        noise[i] = (uint8_t)x;
    }
    noise[0] = 0x0f; /* a version UCX 1.13 asserts on */
    uint8_t one = 0x00, foreign[128];
    size_t fn = addr_v1(foreign, 0x1111, 0x2222);
    struct {
        const uint8_t *b;
        size_t n;
        const char *want;
    } bad[] = {{&one, 1, "ends inside"},
               {noise, sizeof noise, "version 16"},
               {noise + 1, sizeof noise - 1, "bad UCX worker address"},
               {foreign, fn, "none of the 2 transports"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[HS__UCX_BOOT_TEXT_MAX + 1];
        proven_peer_auth(bad[i].b, bad[i].n, text, sizeof text);
        ck_assert_msg(strstr(text, "bad UCX worker address in AUTH") && strstr(text, bad[i].want),
                      "address %zu: REFUSE '%s', wanted '%s'", i, text, bad[i].want);
    }
    ck_assert_uint_eq(S.tp->boot_passed, 1); /* the real client only */
    ck_assert_uint_eq(S.tp->boot_refused, 4);
    ck_assert_int_eq(S.accepts, 1);
    /* the proven connection carries on */
    uint8_t buf[HS_FRAME_HEADER_BYTES + 16];
    size_t n = make_frame(buf, HS_MSG_STATS, 0, 16);
    ck_assert_int_eq(hs_tp_send(g_cc, buf, n), HS_OK);
    PUMP_UNTIL(&S, &C, S.frames == 1);
    pair_close_and_check_fds();
}
END_TEST

START_TEST(transport_kinds_parse_and_print)
{
    hs_tp_kind_t k;
    ck_assert_int_eq(hs_tp_kind_parse("tcp", &k), HS_OK);
    ck_assert_int_eq(k, HS_TP_TCP);
    ck_assert_str_eq(hs_tp_kind_str(HS_TP_TCP), "tcp");
    ck_assert_str_eq(hs_tp_kind_str(HS_TP_UCX), "ucx");
    ck_assert(hs_tp_kind_available(HS_TP_TCP));
    ck_assert_int_eq(hs_tp_kind_parse("auto", &k), HS_OK);
    ck_assert_int_eq(k, HS_TP_AUTO); /* resolved per host by hs_tp_create */
    ck_assert_int_eq(hs_tp_kind_parse("shm", &k), HS_OK);
    ck_assert_int_eq(k, HS_TP_SHM);
    ck_assert_str_eq(hs_tp_kind_str(HS_TP_SHM), "shm");
    ck_assert_int_eq(hs_tp_kind_parse("ucx", &k),
                     hs_tp_kind_available(HS_TP_UCX) ? HS_OK : HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(hs_tp_kind_parse("carrier-pigeon", &k), HS_ERR_INVALID);
    if (!hs_tp_kind_available(HS_TP_UCX)) {
        hs_tp_config_t cfg = {.kind = HS_TP_UCX};
        hs_tp_t *tp = NULL;
        ck_assert_int_eq(hs_tp_create(&cfg, &g_cb, NULL, &tp), HS_ERR_UNSUPPORTED);
        ck_assert_ptr_null(tp);
    }
}
END_TEST

/* HS_TEST_ONLY=<test name> runs just that test (for debugging). */
#define ADD(tc, fn)                                                                                \
    do {                                                                                           \
        const char *only_ = getenv("HS_TEST_ONLY");                                                \
        if (!only_ || strcmp(only_, #fn) == 0) tcase_add_test((tc), fn);                           \
    } while (0)

/* shm: a connection on this host has no IP address to name, and reaches
 * no other host (the address tests are TCP's and UCX's). */
static void add_api_tests_common(TCase *tc, bool addresses)
{
    if (addresses) ADD(tc, frames_round_trip_both_ways_in_order);
    ADD(tc, a_frame_that_breaks_the_send_rules_is_refused_locally);
    ADD(tc, a_64MiB_payload_lands_exactly_in_dest_and_nowhere_else);
    ADD(tc, payloads_and_frames_interleave_in_order);
    ADD(tc, a_refused_payload_closes_the_connection_and_writes_nothing);
    ADD(tc, a_payload_accepted_with_the_wrong_size_is_refused);
    ADD(tc, a_crc_mismatch_closes_that_connection_only);
    ADD(tc, wakeup_from_another_thread_unblocks_progress);
    ADD(tc, send_completions_run_exactly_once_when_the_connection_dies);
    ADD(tc, destroy_fails_pending_sends_and_receives_exactly_once);
    ADD(tc, close_flushes_queued_frames_and_the_peer_sees_an_orderly_close);
    ADD(tc, a_sender_that_vanishes_mid_payload_fails_the_receive_once);
    if (addresses) ADD(tc, ipv6_loopback_works);
    ADD(tc, connect_to_a_port_nobody_listens_on_times_out);
    ADD(tc, a_connect_to_a_black_holed_port_ends_at_its_deadline);
    if (addresses) ADD(tc, a_connect_that_waiting_cannot_mend_fails_at_once);
    if (addresses) ADD(tc, require_rdma_refuses_a_path_without_rdma);
    ADD(tc, net_devices_limit_what_carries_a_connection);
    ADD(tc, a_per_connection_frame_limit_holds_until_raised);
}

static void add_api_tests(TCase *tc) { add_api_tests_common(tc, true); }

int main(void)
{
    Suite *s = suite_create("transport");
    TCase *tc = tcase_create("common");
    ADD(tc, transport_kinds_parse_and_print);
    ADD(tc, ucx_worker_addresses_are_walked_within_their_bytes);
    suite_add_tcase(s, tc);

    tc = tcase_create("tcp");
    tcase_add_checked_fixture(tc, setup_tcp, NULL);
    tcase_set_timeout(tc, 60);
    add_api_tests(tc);
    ADD(tc, garbage_bytes_close_that_connection_with_a_format_error);
    ADD(tc, an_oversized_body_len_is_rejected_before_reading_the_body);
    ADD(tc, a_truncated_frame_then_eof_closes_with_an_io_error);
    ADD(tc, a_crc_mismatch_from_a_raw_peer_gets_an_error_frame);
    ADD(tc, a_wrong_protocol_version_closes_with_a_mismatch);
    suite_add_tcase(s, tc);

    /* the same contract over shared memory (payloads from plain memory go
     * over its socket; test_shm covers payloads from its segments) */
    tc = tcase_create("shm");
    tcase_add_checked_fixture(tc, setup_shm, NULL);
    tcase_set_timeout(tc, 60);
    add_api_tests_common(tc, false);
    suite_add_tcase(s, tc);

    if (hs_tp_kind_available(HS_TP_UCX)) {
        tc = tcase_create("ucx");
        tcase_add_checked_fixture(tc, setup_ucx, NULL);
        tcase_set_timeout(tc, 60);
        add_api_tests(tc);
        ADD(tc, ucx_a_remote_peer_without_a_secret_is_refused_before_ucx_sees_its_address);
        ADD(tc, ucx_a_shared_secret_is_proved_both_ways_in_the_bootstrap);
        ADD(tc, ucx_malformed_bootstrap_records_never_reach_ucx);
        ADD(tc, ucx_a_proven_peer_with_a_malformed_worker_address_is_refused);
        ADD(tc, ucx_payloads_in_registered_memory_are_not_registered_on_the_fly);
        suite_add_tcase(s, tc);
    } else {
        fprintf(stderr, "transport: UCX not built in, skipping the ucx cases\n");
    }

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
