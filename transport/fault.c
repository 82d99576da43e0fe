/* SPDX-License-Identifier: Apache-2.0 */
/* fault.c - fault injection for tests (DESIGN §4): a decorator around any
 * transport's callbacks, switched on by hs_tp_config_t.fault of the
 * receiving end (the binaries' --fault, or HS_FAULT), e.g.
 *
 *   corrupt=5       flip one byte of the 5th payload received, after it
 *                   landed (as if damaged in transit)
 *   cut=40          close a connection with an i/o error when it delivers
 *                   its 40th frame (once per process)
 *   delay_ms=20     hold every incoming frame 20 ms
 *
 * (comma-separated, any combination). Each fault fires once unless said
 * otherwise; they let tests prove that a checksum catches corruption and a
 * cut connection loses no batch. */
#include "hs_transport_int.h"
#include "hs_log.h"
#include "hs_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAULT_PENDING_MAX 64

struct hs__tp_fault {
    hs_tp_callbacks_t user_cb;
    void *user_arg;
    uint64_t corrupt_at, cut_at; /* 0 = off */
    uint32_t delay_ms;
    uint64_t payloads, frames;
    /* payloads accepted and not yet landed: where they land */
    struct {
        hs_tp_conn_t *conn;
        uint64_t cookie, bytes;
        uint8_t *dest;
    } pending[FAULT_PENDING_MAX];
};

static hs_status_t fault_accept(void *arg, hs_tp_conn_t *conn)
{
    hs__tp_fault_t *f = arg;
    return f->user_cb.on_accept ? f->user_cb.on_accept(f->user_arg, conn) : HS_OK;
}

static void fault_frame(void *arg, hs_tp_conn_t *conn, uint16_t type, const uint8_t *body,
                        uint32_t body_len, uint64_t payload_bytes)
{
    hs__tp_fault_t *f = arg;
    if (f->delay_ms) {
        struct timespec d = {f->delay_ms / 1000, (long)(f->delay_ms % 1000) * 1000000L};
        nanosleep(&d, NULL);
    }
    if (f->cut_at && ++f->frames == f->cut_at) {
        hs_warn("fault injection: cutting the connection from %s at frame %llu", conn->peer,
                (unsigned long long)f->frames);
        conn->tp->ops->close(conn, HS_ERR_IO); /* the backend's own close, below hs_tp_close */
        return;
    }
    f->user_cb.on_frame(f->user_arg, conn, type, body, body_len, payload_bytes);
}

static void fault_payload(void *arg, hs_tp_conn_t *conn, uint64_t cookie, hs_status_t status)
{
    hs__tp_fault_t *f = arg;
    for (int i = 0; i < FAULT_PENDING_MAX; i++) {
        if (f->pending[i].conn != conn || f->pending[i].cookie != cookie) continue;
        f->pending[i].conn = NULL;
        if (status == HS_OK && f->corrupt_at && ++f->payloads == f->corrupt_at) {
            f->pending[i].dest[f->pending[i].bytes / 2] ^= 0x40;
            conn->sum_valid = false; /* the copy's checksum no longer describes dest */
            hs_warn("fault injection: flipped a byte of payload %llu from %s",
                    (unsigned long long)f->payloads, conn->peer);
        }
        break;
    }
    if (f->user_cb.on_payload) f->user_cb.on_payload(f->user_arg, conn, cookie, status);
}

static void fault_close(void *arg, hs_tp_conn_t *conn, hs_status_t reason, const char *why)
{
    hs__tp_fault_t *f = arg;
    f->user_cb.on_close(f->user_arg, conn, reason, why);
}

hs_status_t hs__tp_fault_wrap(const char *spec, hs_tp_callbacks_t *cb, void **arg,
                              hs__tp_fault_t **out)
{
    *out = NULL;
    if (!spec || !*spec) return HS_OK;
    hs__tp_fault_t *f = calloc(1, sizeof(*f));
    if (!f) return HS_ERR_NOMEM;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        char *eq = strchr(tok, '=');
        if (!eq || hs_parse_u64(eq + 1, &v) != HS_OK || v == 0) goto bad;
        *eq = 0;
        if (!strcmp(tok, "corrupt"))
            f->corrupt_at = v;
        else if (!strcmp(tok, "cut"))
            f->cut_at = v;
        else if (!strcmp(tok, "delay_ms") && v <= 10000)
            f->delay_ms = (uint32_t)v;
        else
            goto bad;
    }
    f->user_cb = *cb;
    f->user_arg = *arg;
    cb->on_accept = fault_accept;
    cb->on_frame = fault_frame;
    cb->on_payload = fault_payload;
    cb->on_close = fault_close;
    *arg = f;
    *out = f;
    hs_warn("fault injection active (%s): for tests only", spec);
    return HS_OK;
bad:
    hs_error("fault '%s': expected corrupt=N, cut=N and/or delay_ms=MS (1 to 10000), "
             "comma-separated",
             spec);
    free(f);
    return HS_ERR_INVALID;
}

void hs__tp_fault_note_recv(hs__tp_fault_t *f, hs_tp_conn_t *conn, void *dest, uint64_t bytes,
                            uint64_t cookie)
{
    for (int i = 0; i < FAULT_PENDING_MAX; i++)
        if (!f->pending[i].conn) {
            f->pending[i].conn = conn;
            f->pending[i].dest = dest;
            f->pending[i].bytes = bytes;
            f->pending[i].cookie = cookie;
            return;
        }
}

void hs__tp_fault_free(hs__tp_fault_t *f) { free(f); }
