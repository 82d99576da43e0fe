/* SPDX-License-Identifier: Apache-2.0 */
/* test_shm.c - shared memory between a producer and a consumer on one host
 * (transport/shm_int.h): payloads copied out of the producer's segment by
 * the copier threads, released, and unchanged by the producer's later
 * writes; a close while a copy is out reported once; descriptors past
 * a segment, for a segment never attached or for another producer's
 * segment refused with nothing delivered; no memory taken from a peer
 * before it is trusted, nor from a file that could shrink; peers of another
 * kernel refused; auto picking shared memory on loopback and TCP where the
 * consumer offers none; nothing left open. Raw peers speak the wire format
 * of shm_int.h on the abstract socket. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "hs_proto.h"
#include "hs_transport.h"
#include "hs_transport_int.h" /* the shared-memory counters */
#include "shm_int.h"
#include "hs_time.h"
#include "hs_checksum.h"
#include "hs_bytes.h"

#define PUMP_LIMIT_S 30.0 /* a hang guard, not a timing assertion */
#define MAX_CONNS 4
#define SEG_BYTES (1u << 20)

typedef struct {
    hs_tp_t *tp;
    int accepts, frames, payloads_ok, payloads_failed, closes;
    hs_tp_conn_t *accepted[MAX_CONNS];
    bool trust_on_accept;
    uint64_t sum_from; /* hs_tp_recv_payload_sum from this byte (0: plain receive) */
    bool sum_valid;    /* what hs_tp_conn_payload_checksum said for the last payload */
    uint64_t sum, last_len;
    uint8_t *dest;
    uint64_t dest_len;
    hs_status_t close_reason;
    char close_why[256];
} side_t;

static int g_sends_ok, g_sends_failed;

static hs_status_t cb_accept(void *arg, hs_tp_conn_t *conn)
{
    side_t *s = arg;
    if (s->accepts < MAX_CONNS) s->accepted[s->accepts] = conn;
    s->accepts++;
    if (s->trust_on_accept) hs_tp_conn_set_trusted(conn);
    return HS_OK;
}

static void cb_frame(void *arg, hs_tp_conn_t *conn, uint16_t type, const uint8_t *body,
                     uint32_t body_len, uint64_t payload_bytes)
{
    side_t *s = arg;
    s->frames++;
    if (payload_bytes && s->dest && payload_bytes <= s->dest_len) {
        s->last_len = payload_bytes;
        if (s->sum_from)
            ck_assert_int_eq(hs_tp_recv_payload_sum(conn, s->dest, payload_bytes, 7, s->sum_from),
                             HS_OK);
        else
            ck_assert_int_eq(hs_tp_recv_payload(conn, s->dest, payload_bytes, 7), HS_OK);
    }
}

static void cb_payload(void *arg, hs_tp_conn_t *conn, uint64_t cookie, hs_status_t status)
{
    side_t *s = arg;
    s->sum_valid = hs_tp_conn_payload_checksum(conn, &s->sum);
    if (status == HS_OK)
        s->payloads_ok++;
    else
        s->payloads_failed++;
}

static void cb_close(void *arg, hs_tp_conn_t *conn, hs_status_t reason, const char *why)
{
    side_t *s = arg;
    s->closes++;
    s->close_reason = reason;
    snprintf(s->close_why, sizeof s->close_why, "%s", why ? why : "");
}

static const hs_tp_callbacks_t g_cb = {cb_accept, cb_frame, cb_payload, cb_close};

static void send_done(void *arg, hs_status_t st)
{
    if (st == HS_OK)
        g_sends_ok++;
    else
        g_sends_failed++;
}

static void side_create(side_t *s, hs_tp_kind_t kind)
{
    memset(s, 0, sizeof *s);
    hs_tp_config_t cfg = {.kind = kind, .max_frame_body = 64u << 10};
    ck_assert_int_eq(hs_tp_create(&cfg, &g_cb, s, &s->tp), HS_OK);
}

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

static size_t make_frame(uint8_t *buf, uint32_t len)
{
    uint8_t *body = buf + HS_FRAME_HEADER_BYTES;
    for (uint32_t i = 0; i < len; i++)
        body[i] = (uint8_t)i;
    hs_frame_header_encode(buf, HS_MSG_DONE, body, len);
    return HS_FRAME_HEADER_BYTES + len;
}

static void pump_once(side_t *a, side_t *b)
{
    if (a) ck_assert_int_eq(hs_tp_progress(a->tp, 0), HS_OK);
    if (b) ck_assert_int_eq(hs_tp_progress(b->tp, 1), HS_OK);
    if (!b) poll(NULL, 0, 1);
}

#define PUMP_UNTIL(a, b, cond)                                                                     \
    do {                                                                                           \
        double t0_ = hs_now_s();                                                                   \
        while (!(cond)) {                                                                          \
            ck_assert_msg(hs_now_s() - t0_ < PUMP_LIMIT_S, "never happened: %s", #cond);           \
            pump_once((a), (b));                                                                   \
        }                                                                                          \
    } while (0)

/* Pumps both for `ms` (to show that something does NOT happen). */
static void pump_for(side_t *a, side_t *b, int ms)
{
    double t0 = hs_now_s();
    while (hs_now_s() - t0 < ms / 1e3)
        pump_once(a, b);
}

typedef struct {
    side_t *server;
    atomic_int stop;
} serve_t;

static void *serve_loop(void *arg)
{
    serve_t *sv = arg;
    while (!sv->stop)
        if (hs_tp_progress(sv->server->tp, 5) != HS_OK) break;
    return NULL;
}

static hs_status_t connect_while_serving(side_t *server, side_t *client, uint16_t port,
                                         hs_tp_conn_t **out)
{
    serve_t sv = {server, 0};
    pthread_t th;
    pthread_create(&th, NULL, serve_loop, &sv);
    hs_status_t st = hs_tp_connect(client->tp, "127.0.0.1", port, 10000, out);
    sv.stop = 1;
    pthread_join(th, NULL);
    return st;
}

static side_t S, C, C2;
static uint16_t g_port;
static int g_fds0;

static void setup(void)
{
    g_sends_ok = g_sends_failed = 0;
    g_fds0 = count_fds();
    side_create(&S, HS_TP_SHM);
    ck_assert_int_eq(hs_tp_listen(S.tp, "127.0.0.1", 0, &g_port), HS_OK);
    S.dest = calloc(1, SEG_BYTES);
    S.dest_len = SEG_BYTES;
}

static void teardown(void)
{
    if (C.tp) hs_tp_destroy(C.tp);
    if (C2.tp) hs_tp_destroy(C2.tp);
    uint8_t *d = S.dest;
    hs_tp_destroy(S.tp);
    free(d);
    memset(&C, 0, sizeof C);
    memset(&C2, 0, sizeof C2);
    ck_assert_int_eq(count_fds(), g_fds0); /* no socket, memfd or listener left open */
}

/* ---- a raw peer on the abstract socket ------------------------------------ */

static int raw_connect(const char *boot_id)
{
    struct sockaddr_un sa;
    socklen_t len = hs__shm_addr(g_port, &sa);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, len), 0);
    uint8_t pre[SHM_PREAMBLE_BYTES];
    hs__shm_preamble_make(pre);
    if (boot_id) {
        memset(pre + 16, 0, SHM_BOOT_ID_BYTES);
        memcpy(pre + 16, boot_id, strlen(boot_id));
    }
    ck_assert_int_eq(send(fd, pre, sizeof pre, MSG_NOSIGNAL), (ssize_t)sizeof pre);
    return fd;
}

/* A sealed memfd of SEG_BYTES filled with `v` (the caller closes it). */
static int sealed_memfd(uint8_t v, bool seal, bool holes)
{
    int fd = memfd_create("test-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, SEG_BYTES), 0);
    if (holes) return fd; /* sparse: nothing written */
    uint8_t *p = mmap(NULL, SEG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(p, MAP_FAILED);
    memset(p, v, SEG_BYTES);
    munmap(p, SEG_BYTES);
    if (seal) ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    return fd;
}

static void raw_attach(int sock, uint32_t seg, uint64_t size, int memfd)
{
    uint8_t m[24];
    hs_le64_store(m, (uint64_t)SHM_TAG_ATTACH << SHM_TAG_SHIFT);
    hs_le64_store(m + 8, seg);
    hs_le64_store(m + 16, size);
    struct iovec iov = {.iov_base = m, .iov_len = sizeof m};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (memfd >= 0) {
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
    }
    ck_assert_int_eq(sendmsg(sock, &msg, MSG_NOSIGNAL), (ssize_t)sizeof m);
}

/* A DONE-like frame whose payload is [off, off + len) of segment seg. */
static void raw_ring_frame(int sock, uint32_t seg, uint64_t off, uint64_t len)
{
    uint8_t m[8 + HS_FRAME_HEADER_BYTES + 32 + SHM_DESC_BYTES];
    hs_le64_store(m, (uint64_t)SHM_TAG_RING << SHM_TAG_SHIFT | len);
    size_t f = make_frame(m + 8, 32);
    uint8_t *d = m + 8 + f;
    hs_le32_store(d, seg);
    hs_le32_store(d + 4, 0);
    hs_le64_store(d + 8, off);
    hs_le64_store(d + 16, 1);
    ck_assert_int_eq(send(sock, m, 8 + f + SHM_DESC_BYTES, MSG_NOSIGNAL),
                     (ssize_t)(8 + f + SHM_DESC_BYTES));
}

/* ---- through the API ------------------------------------------------------ */

START_TEST(a_payload_is_copied_out_of_the_ring_and_later_writes_change_nothing)
{
    S.trust_on_accept = true;
    side_create(&C, HS_TP_SHM);
    hs_tp_conn_t *cc = NULL;
    ck_assert_int_eq(connect_while_serving(&S, &C, g_port, &cc), HS_OK);
    ck_assert_str_eq(hs_tp_conn_kind(cc), "shm");
    PUMP_UNTIL(&S, &C, S.accepts == 1);
    ck_assert_str_eq(hs_tp_conn_kind(S.accepted[0]), "shm");
    ck_assert(hs_tp_conn_is_loopback(S.accepted[0]));
    uint8_t *ring = NULL;
    ck_assert_int_eq(hs_tp_mem_alloc(C.tp, SEG_BYTES, (void **)&ring), HS_OK);
    for (uint32_t i = 0; i < SEG_BYTES; i++)
        ring[i] = (uint8_t)(i * 13 + 1);
    uint8_t frame[256];
    size_t flen = make_frame(frame, 40);
    /* two payloads from one segment: it is attached (and mapped) once */
    ck_assert_int_eq(
        hs_tp_send_payload(cc, frame, flen, ring + 4096, SEG_BYTES - 8192, send_done, NULL), HS_OK);
    PUMP_UNTIL(&S, &C, S.payloads_ok == 1 && g_sends_ok == 1);
    for (uint32_t i = 0; i < SEG_BYTES - 8192; i++)
        ck_assert_uint_eq(S.dest[i], (uint8_t)((i + 4096) * 13 + 1));
    /* the producer writes into its ring after DONE, and past the payload */
    memset(ring, 0xEE, SEG_BYTES);
    pump_for(&S, &C, 50);
    for (uint32_t i = 0; i < SEG_BYTES - 8192; i++)
        ck_assert_uint_eq(S.dest[i], (uint8_t)((i + 4096) * 13 + 1));
    ck_assert_uint_eq(S.dest[SEG_BYTES - 8192], 0); /* nothing past the payload */
    ck_assert_int_eq(hs_tp_send_payload(cc, frame, flen, ring, 100, send_done, NULL), HS_OK);
    PUMP_UNTIL(&S, &C, S.payloads_ok == 2 && g_sends_ok == 2);
    ck_assert_uint_eq(S.dest[0], 0xEE);
    ck_assert(!S.sum_valid); /* not asked for */
    /* the checksum computed while copying is the checksum of dest */
    S.sum_from = 256;
    for (uint32_t i = 0; i < SEG_BYTES; i++)
        ring[i] = (uint8_t)(i * 7 + 3);
    ck_assert_int_eq(
        hs_tp_send_payload(cc, frame, flen, ring + 100, SEG_BYTES - 100, send_done, NULL), HS_OK);
    PUMP_UNTIL(&S, &C, S.payloads_ok == 3 && g_sends_ok == 3);
    ck_assert(S.sum_valid);
    ck_assert_uint_eq(S.sum, hs_checksum64(S.dest + 256, SEG_BYTES - 100 - 256));
    memset(ring, 0, SEG_BYTES); /* later writes: dest and its checksum stand */
    ck_assert_uint_eq(S.sum, hs_checksum64(S.dest + 256, SEG_BYTES - 100 - 256));
    ck_assert_uint_eq(S.tp->shm_mapped, 1);
    ck_assert_uint_eq(S.tp->shm_ring_payloads, 3);
    ck_assert_uint_eq(S.tp->shm_plain_payloads, 0);
    ck_assert_uint_eq(S.tp->shm_refused, 0);
    /* memory outside any segment still travels, over the socket */
    uint8_t plain[333];
    memset(plain, 0x5A, sizeof plain);
    ck_assert_int_eq(hs_tp_send_payload(cc, frame, flen, plain, sizeof plain, send_done, NULL),
                     HS_OK);
    PUMP_UNTIL(&S, &C, S.payloads_ok == 4 && g_sends_ok == 4);
    ck_assert_uint_eq(S.dest[332], 0x5A);
    ck_assert(!S.sum_valid); /* over the socket: the receiver checks it */
    ck_assert_uint_eq(S.tp->shm_plain_payloads, 1);
    ck_assert_int_eq(S.closes, 0);
}
END_TEST

/* The copy of a payload runs on a copier thread and is finished by a later
 * progress. A receiver that closes the connection in between (its producer
 * dropped, say) gets on_payload(HS_ERR_CLOSED) once, never HS_OK, and the
 * close waits for the copier: nothing writes into dest afterwards (ASan,
 * TSan). */
START_TEST(a_connection_closed_while_its_payload_is_copied_reports_it_once_as_closed)
{
    S.trust_on_accept = true;
    side_create(&C, HS_TP_SHM);
    hs_tp_conn_t *cc = NULL;
    ck_assert_int_eq(connect_while_serving(&S, &C, g_port, &cc), HS_OK);
    PUMP_UNTIL(&S, &C, S.accepts == 1);
    uint8_t *ring = NULL;
    ck_assert_int_eq(hs_tp_mem_alloc(C.tp, SEG_BYTES, (void **)&ring), HS_OK);
    memset(ring, 0x42, SEG_BYTES);
    uint8_t frame[256];
    size_t flen = make_frame(frame, 40);
    S.sum_from = 64;
    ck_assert_int_eq(hs_tp_send_payload(cc, frame, flen, ring, SEG_BYTES, send_done, NULL), HS_OK);
    PUMP_UNTIL(&S, &C, S.frames == 1); /* the copy is handed out in this progress */
    hs_tp_close(S.accepted[0], HS_ERR_CLOSED);
    PUMP_UNTIL(&S, &C, S.closes == 1 && g_sends_failed + g_sends_ok == 1);
    ck_assert_int_eq(S.payloads_ok, 0);
    ck_assert_int_eq(S.payloads_failed, 1);
    ck_assert_uint_eq(S.tp->shm_ring_payloads, 0); /* not delivered */
    ck_assert_int_eq(g_sends_failed, 1);           /* never released: the sender knows */
    pump_for(&S, &C, 20);
    ck_assert_int_eq(S.payloads_ok + S.payloads_failed, 1);
}
END_TEST

/* Payloads of several producers are copied by several copiers, each whole
 * and with its own checksum. */
START_TEST(payloads_of_two_producers_are_each_copied_whole_with_their_own_checksum)
{
    S.trust_on_accept = true;
    side_create(&C, HS_TP_SHM);
    side_create(&C2, HS_TP_SHM);
    hs_tp_conn_t *c1 = NULL, *c2 = NULL;
    ck_assert_int_eq(connect_while_serving(&S, &C, g_port, &c1), HS_OK);
    ck_assert_int_eq(connect_while_serving(&S, &C2, g_port, &c2), HS_OK);
    PUMP_UNTIL(&S, &C, S.accepts == 2);
    uint8_t *r1 = NULL, *r2 = NULL;
    ck_assert_int_eq(hs_tp_mem_alloc(C.tp, SEG_BYTES, (void **)&r1), HS_OK);
    ck_assert_int_eq(hs_tp_mem_alloc(C2.tp, SEG_BYTES, (void **)&r2), HS_OK);
    memset(r1, 0x11, SEG_BYTES);
    memset(r2, 0x22, SEG_BYTES);
    uint8_t frame[256];
    size_t flen = make_frame(frame, 40);
    S.sum_from = 8;
    /* one at a time into S.dest, the two connections alternating */
    for (int round = 0; round < 6; round++) {
        hs_tp_conn_t *c = round % 2 ? c2 : c1;
        side_t *peer = round % 2 ? &C2 : &C;
        ck_assert_int_eq(
            hs_tp_send_payload(c, frame, flen, round % 2 ? r2 : r1, SEG_BYTES / 2, send_done, NULL),
            HS_OK);
        PUMP_UNTIL(&S, peer, S.payloads_ok == round + 1);
        ck_assert(S.sum_valid);
        ck_assert_uint_eq(S.dest[0], round % 2 ? 0x22 : 0x11);
        ck_assert_uint_eq(S.dest[SEG_BYTES / 2 - 1], round % 2 ? 0x22 : 0x11);
        ck_assert_uint_eq(S.sum, hs_checksum64(S.dest + 8, SEG_BYTES / 2 - 8));
    }
    /* the releases reach both producers */
    double t0 = hs_now_s();
    while (g_sends_ok < 6) {
        ck_assert_msg(hs_now_s() - t0 < PUMP_LIMIT_S, "the releases never came");
        pump_once(&S, &C);
        pump_once(NULL, &C2);
    }
    ck_assert_uint_eq(S.tp->shm_ring_payloads, 6);
    ck_assert_int_eq(S.closes, 0);
}
END_TEST

START_TEST(a_peer_not_yet_trusted_gets_no_memory_mapped)
{
    side_create(&C, HS_TP_SHM);
    hs_tp_conn_t *cc = NULL;
    ck_assert_int_eq(connect_while_serving(&S, &C, g_port, &cc), HS_OK);
    PUMP_UNTIL(&S, &C, S.accepts == 1);
    uint8_t *ring = NULL;
    ck_assert_int_eq(hs_tp_mem_alloc(C.tp, SEG_BYTES, (void **)&ring), HS_OK);
    memset(ring, 1, SEG_BYTES);
    uint8_t frame[256];
    size_t flen = make_frame(frame, 40);
    ck_assert_int_eq(hs_tp_send_payload(cc, frame, flen, ring, 4096, send_done, NULL), HS_OK);
    PUMP_UNTIL(&S, &C, S.closes == 1 && g_sends_failed == 1);
    ck_assert_int_eq(S.close_reason, HS_ERR_PROTO);
    ck_assert_ptr_nonnull(strstr(S.close_why, "before the peer proved itself"));
    ck_assert_uint_eq(S.tp->shm_mapped, 0);
    ck_assert_int_eq(S.frames, 0);
    ck_assert_int_eq(S.payloads_ok, 0);
    ck_assert_int_eq(g_sends_ok, 0);
}
END_TEST

START_TEST(auto_picks_shared_memory_on_loopback_and_tcp_where_none_is_offered)
{
    side_create(&C, HS_TP_AUTO);
    hs_tp_conn_t *cc = NULL;
    ck_assert_int_eq(connect_while_serving(&S, &C, g_port, &cc), HS_OK);
    ck_assert_str_eq(hs_tp_conn_kind(cc), "shm");
    PUMP_UNTIL(&S, &C, S.accepts == 1);
    /* a consumer on plain TCP: auto falls back to it */
    side_t T;
    side_create(&T, HS_TP_TCP);
    uint16_t tport;
    ck_assert_int_eq(hs_tp_listen(T.tp, "127.0.0.1", 0, &tport), HS_OK);
    side_create(&C2, HS_TP_AUTO);
    serve_t sv = {&T, 0};
    pthread_t th;
    pthread_create(&th, NULL, serve_loop, &sv);
    hs_tp_conn_t *c2 = NULL;
    hs_status_t st = hs_tp_connect(C2.tp, "127.0.0.1", tport, 10000, &c2);
    sv.stop = 1;
    pthread_join(th, NULL);
    ck_assert_int_eq(st, HS_OK);
    ck_assert_str_eq(hs_tp_conn_kind(c2), "tcp");
    hs_tp_destroy(C2.tp);
    C2.tp = NULL;
    hs_tp_destroy(T.tp);
}
END_TEST

START_TEST(a_shm_only_consumer_refuses_tcp_peers_and_a_shm_producer_needs_a_local_consumer)
{
    side_create(&C, HS_TP_TCP);
    hs_tp_conn_t *cc = NULL;
    ck_assert_int_eq(connect_while_serving(&S, &C, g_port, &cc), HS_OK); /* TCP accepts, then: */
    PUMP_UNTIL(&S, &C, C.closes == 1);
    ck_assert_int_eq(S.accepts, 0);
    ck_assert_uint_eq(S.tp->shm_refused, 1);
    side_create(&C2, HS_TP_SHM);
    /* TEST-NET-1: not an address of this host */
    ck_assert_int_eq(hs_tp_connect(C2.tp, "192.0.2.1", g_port, 1000, &cc), HS_ERR_INVALID);
}
END_TEST

/* ---- raw peers ------------------------------------------------------------ */

/* Sends an ATTACH of a good segment, then descriptor (seg, off, len); the
 * consumer must close with a protocol error and deliver nothing. */
static void forged(uint32_t seg, uint64_t off, uint64_t len, const char *why_has)
{
    S.trust_on_accept = true;
    int sock = raw_connect(NULL);
    PUMP_UNTIL(&S, NULL, S.accepts == 1);
    int mfd = sealed_memfd(0x42, true, false);
    raw_attach(sock, 0, SEG_BYTES, mfd);
    close(mfd);
    raw_ring_frame(sock, seg, off, len);
    PUMP_UNTIL(&S, NULL, S.closes == 1);
    ck_assert_int_eq(S.close_reason, HS_ERR_PROTO);
    ck_assert_msg(strstr(S.close_why, why_has), "%s", S.close_why);
    ck_assert_int_eq(S.frames, 0);
    ck_assert_int_eq(S.payloads_ok, 0);
    ck_assert_uint_eq(S.dest[0], 0);
    close(sock);
}

START_TEST(a_descriptor_past_the_segment_is_refused)
{
    forged(0, SEG_BYTES - 10, 100, "lies outside");
}
END_TEST

START_TEST(a_descriptor_whose_offset_wraps_is_refused)
{
    forged(0, UINT64_MAX - 10, 100, "lies outside");
}
END_TEST

START_TEST(a_descriptor_for_a_segment_never_attached_is_refused)
{
    forged(7, 0, 100, "never attached");
}
END_TEST

START_TEST(a_descriptor_for_another_producers_segment_is_refused)
{
    /* producer A attaches its segment 0 and sends from it */
    S.trust_on_accept = true;
    side_create(&C, HS_TP_SHM);
    hs_tp_conn_t *cc = NULL;
    ck_assert_int_eq(connect_while_serving(&S, &C, g_port, &cc), HS_OK);
    uint8_t *ring = NULL;
    ck_assert_int_eq(hs_tp_mem_alloc(C.tp, SEG_BYTES, (void **)&ring), HS_OK);
    memset(ring, 0x11, SEG_BYTES);
    uint8_t frame[256];
    size_t flen = make_frame(frame, 40);
    ck_assert_int_eq(hs_tp_send_payload(cc, frame, flen, ring, 4096, send_done, NULL), HS_OK);
    PUMP_UNTIL(&S, &C, S.payloads_ok == 1);
    memset(S.dest, 0, SEG_BYTES);
    /* producer B names segment 0 without attaching anything */
    int sock = raw_connect(NULL);
    PUMP_UNTIL(&S, &C, S.accepts == 2);
    raw_ring_frame(sock, 0, 0, 4096);
    PUMP_UNTIL(&S, &C, S.closes == 1);
    ck_assert_int_eq(S.close_reason, HS_ERR_PROTO);
    ck_assert_ptr_nonnull(strstr(S.close_why, "never attached"));
    ck_assert_int_eq(S.payloads_ok, 1);
    ck_assert_uint_eq(S.dest[0], 0);
    /* A is unaffected */
    ck_assert_int_eq(hs_tp_send_payload(cc, frame, flen, ring, 4096, send_done, NULL), HS_OK);
    PUMP_UNTIL(&S, &C, S.payloads_ok == 2);
    ck_assert_uint_eq(S.dest[0], 0x11);
    close(sock);
}
END_TEST

START_TEST(a_segment_that_could_shrink_is_not_mapped)
{
    S.trust_on_accept = true;
    int sock = raw_connect(NULL);
    PUMP_UNTIL(&S, NULL, S.accepts == 1);
    int mfd = sealed_memfd(0x42, false, false);
    raw_attach(sock, 0, SEG_BYTES, mfd);
    close(mfd);
    PUMP_UNTIL(&S, NULL, S.closes == 1);
    ck_assert_int_eq(S.close_reason, HS_ERR_PROTO);
    ck_assert_ptr_nonnull(strstr(S.close_why, "sealed"));
    ck_assert_uint_eq(S.tp->shm_mapped, 0);
    close(sock);
}
END_TEST

START_TEST(an_attach_without_a_descriptor_or_larger_than_the_file_is_refused)
{
    S.trust_on_accept = true;
    int sock = raw_connect(NULL);
    PUMP_UNTIL(&S, NULL, S.accepts == 1);
    raw_attach(sock, 0, SEG_BYTES, -1);
    PUMP_UNTIL(&S, NULL, S.closes == 1);
    ck_assert_ptr_nonnull(strstr(S.close_why, "without its descriptor"));
    close(sock);
    sock = raw_connect(NULL);
    PUMP_UNTIL(&S, NULL, S.accepts == 2);
    int mfd = sealed_memfd(0x42, true, false);
    raw_attach(sock, 0, 2ull * SEG_BYTES, mfd);
    close(mfd);
    PUMP_UNTIL(&S, NULL, S.closes == 2);
    ck_assert_ptr_nonnull(strstr(S.close_why, "not a file of"));
    ck_assert_uint_eq(S.tp->shm_mapped, 0);
    close(sock);
}
END_TEST

START_TEST(a_sparse_segment_is_not_mapped)
{
    /* reading its holes would allocate memory on the consumer's side */
    S.trust_on_accept = true;
    int sock = raw_connect(NULL);
    PUMP_UNTIL(&S, NULL, S.accepts == 1);
    int mfd = sealed_memfd(0, false, true);
    ck_assert_int_eq(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    raw_attach(sock, 0, SEG_BYTES, mfd);
    close(mfd);
    PUMP_UNTIL(&S, NULL, S.closes == 1);
    ck_assert_int_eq(S.close_reason, HS_ERR_PROTO);
    ck_assert_ptr_nonnull(strstr(S.close_why, "has holes"));
    ck_assert_uint_eq(S.tp->shm_mapped, 0);
    close(sock);
}
END_TEST

START_TEST(a_peer_on_another_kernel_is_refused_before_any_frame)
{
    int sock = raw_connect("00000000-0000-0000-0000-000000000000");
    PUMP_UNTIL(&S, NULL, S.closes == 1);
    ck_assert_int_eq(S.close_reason, HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(S.close_why, "another kernel"));
    ck_assert_int_eq(S.frames, 0);
    close(sock);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("shm");
    TCase *tc = tcase_create("shm");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_payload_is_copied_out_of_the_ring_and_later_writes_change_nothing);
    tcase_add_test(tc, a_connection_closed_while_its_payload_is_copied_reports_it_once_as_closed);
    tcase_add_test(tc, payloads_of_two_producers_are_each_copied_whole_with_their_own_checksum);
    tcase_add_test(tc, a_peer_not_yet_trusted_gets_no_memory_mapped);
    tcase_add_test(tc, auto_picks_shared_memory_on_loopback_and_tcp_where_none_is_offered);
    tcase_add_test(tc,
                   a_shm_only_consumer_refuses_tcp_peers_and_a_shm_producer_needs_a_local_consumer);
    tcase_add_test(tc, a_descriptor_past_the_segment_is_refused);
    tcase_add_test(tc, a_descriptor_whose_offset_wraps_is_refused);
    tcase_add_test(tc, a_descriptor_for_a_segment_never_attached_is_refused);
    tcase_add_test(tc, a_descriptor_for_another_producers_segment_is_refused);
    tcase_add_test(tc, a_segment_that_could_shrink_is_not_mapped);
    tcase_add_test(tc, an_attach_without_a_descriptor_or_larger_than_the_file_is_refused);
    tcase_add_test(tc, a_sparse_segment_is_not_mapped);
    tcase_add_test(tc, a_peer_on_another_kernel_is_refused_before_any_frame);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
