/* SPDX-License-Identifier: Apache-2.0 */
/* bench_transport.c - payload rate over loopback, receiver and sender each on
 * its own thread (not a test: prints GB/s).
 *   bench_transport [tcp|ucx] [MiB per payload, default 64] [payloads, default 16] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hs_proto.h"
#include "hs_transport.h"
#include "hs_status.h"
#include "hs_time.h"

typedef struct {
    hs_tp_t *tp;
    uint8_t *dest;
    uint64_t len;
    int want;
    atomic_int got, closes;
    double t_first, t_last;
} rx_t;

static hs_status_t rx_accept(void *arg, hs_tp_conn_t *conn)
{
    fprintf(stderr, "receiver: %s\n", hs_tp_conn_describe(conn));
    return HS_OK;
}
static void rx_frame(void *arg, hs_tp_conn_t *conn, uint16_t type, const uint8_t *body,
                     uint32_t body_len, uint64_t payload_bytes)
{
    rx_t *r = arg;
    if (payload_bytes == 0) return;
    if (r->got == 0) r->t_first = hs_now_s();
    if (payload_bytes != r->len || hs_tp_recv_payload(conn, r->dest, payload_bytes, 0) != HS_OK)
        fprintf(stderr, "unexpected payload of %llu bytes\n", (unsigned long long)payload_bytes);
}
static void rx_payload(void *arg, hs_tp_conn_t *conn, uint64_t cookie, hs_status_t st)
{
    rx_t *r = arg;
    if (st != HS_OK) fprintf(stderr, "payload failed: %s\n", hs_status_str(st));
    r->t_last = hs_now_s();
    r->got++;
}
static void rx_close(void *arg, hs_tp_conn_t *conn, hs_status_t reason, const char *why)
{
    rx_t *r = arg;
    r->closes++;
}

static void *rx_main(void *arg)
{
    rx_t *r = arg;
    while (r->got < r->want && r->closes == 0)
        if (hs_tp_progress(r->tp, 100) != HS_OK) break;
    return NULL;
}

static atomic_int g_done;
static void tx_done(void *arg, hs_status_t st) { g_done++; }
static void tx_noop_frame(void *a, hs_tp_conn_t *c, uint16_t t, const uint8_t *b, uint32_t l,
                          uint64_t p)
{
}
static void tx_close(void *a, hs_tp_conn_t *c, hs_status_t r, const char *w) {}

int main(int argc, char **argv)
{
    hs_tp_kind_t kind = HS_TP_TCP;
    if (argc > 1 && hs_tp_kind_parse(argv[1], &kind) != HS_OK) return 2;
    uint64_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 64;
    int n = argc > 3 ? atoi(argv[3]) : 16;
    rx_t r = {.len = mib << 20, .want = n};
    r.dest = malloc(r.len);
    uint8_t *src = malloc(r.len);
    memset(r.dest, 0, r.len);
    memset(src, 0x5c, r.len);
    hs_tp_config_t cfg = {.kind = kind};
    hs_tp_callbacks_t rcb = {rx_accept, rx_frame, rx_payload, rx_close};
    hs_tp_callbacks_t tcb = {NULL, tx_noop_frame, NULL, tx_close};
    hs_tp_t *tx;
    uint16_t port;
    if (hs_tp_create(&cfg, &rcb, &r, &r.tp) || hs_tp_create(&cfg, &tcb, NULL, &tx) ||
        hs_tp_listen(r.tp, "127.0.0.1", 0, &port))
        return 1;
    if (!getenv("HS_BENCH_NOREG")) {
        if (hs_tp_mem_register(r.tp, r.dest, r.len) != HS_OK ||
            hs_tp_mem_register(tx, src, r.len) != HS_OK)
            fprintf(stderr, "bench: registration failed; measuring unregistered buffers\n");
    }
    pthread_t th;
    pthread_create(&th, NULL, rx_main, &r);
    hs_tp_conn_t *c;
    if (hs_tp_connect(tx, "127.0.0.1", port, 5000, &c)) return 1;
    fprintf(stderr, "sender: %s\n", hs_tp_conn_describe(c));
    uint8_t frame[HS_FRAME_HEADER_BYTES + 8] = {0};
    hs_frame_header_encode(frame, HS_MSG_DONE, frame + HS_FRAME_HEADER_BYTES, 8);
    int sent = 0;
    while (r.got < n && r.closes == 0) {
        /* two in flight, as a producer with a prefetch would have */
        while (sent < n && sent - g_done < 2) {
            if (hs_tp_send_payload(c, frame, sizeof frame, src, r.len, tx_done, NULL)) return 1;
            sent++;
        }
        if (hs_tp_progress(tx, 10) != HS_OK) break;
    }
    pthread_join(th, NULL);
    double dt = r.t_last - r.t_first;
    printf("%s: %d x %llu MiB in %.3f s = %.2f GB/s\n", hs_tp_kind_str(kind), n,
           (unsigned long long)mib, dt, (double)n * r.len / dt / 1e9);
    hs_tp_destroy(tx);
    hs_tp_destroy(r.tp);
    free(src);
    free(r.dest);
    return 0;
}
