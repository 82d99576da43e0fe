/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_describe.c - what an endpoint of the UCX transport runs over, in one
 * line (hs_tp_conn_describe), and whether that includes an RDMA lane
 * (require_rdma, memory handles). A part of ucx.c's transport that calls
 * none of the others. */
#include "ucx_int.h"
#include "hs_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A one-line summary of ucp_ep_print_info(), e.g.
 *   "ucx: tcp/lo[am,bw] tcp/eth0[bw] cm=rdmacm rndv>=8192"
 * from lines such as
 *   lane[1]:  1:tcp/lo.0 md[1] -> md[1]/tcp/sysdev[255] rma_bw#0 am am_bw#0 wireup
 *   am_send: 0..<egr/short>..8185..<egr/zcopy>..8192..<rndv>..(inf)
 * The whole text is logged at trace level. */
void hs__ucx_conn_refresh_describe(ucx_conn_t *c)
{
    if (!c->ep || c->ep_closed || !c->connected) return;
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    if (!f) return;
    ucp_ep_print_info(c->ep, f);
    fclose(f);
    if (!text) return;
    hs_trace("ucx endpoint to %s:\n%s", c->base.peer, text);
    char out[HS__TP_DESCRIBE_CAP];
    size_t n = (size_t)snprintf(out, sizeof out, "ucx:");
    char *save = NULL; /* strtok_r: other threads' transports describe too */
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *lane = strstr(line, "lane[");
        char *rndv = strstr(line, "..<rndv>");
        if (lane) {
            char *p = strstr(lane, "]:");
            if (!p) continue;
            p += 2;
            while (*p == ' ')
                p++;
            if (strncmp(p, "cm ", 3) == 0) {
                n +=
                    (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, " cm=%s", p + 3);
                continue;
            }
            while (*p >= '0' && *p <= '9')
                p++;
            if (*p == ':') p++;
            char tl[64];
            size_t l = strcspn(p, " ");
            if (l == 0 || l >= sizeof tl) continue;
            memcpy(tl, p, l);
            tl[l] = '\0';
            char *slash = strchr(tl, '/');
            char *dot = strrchr(tl, '.'); /* "lo.0" -> "lo": the path index */
            if (slash && dot && dot > slash) *dot = '\0';
            bool am = strstr(p, " am ") || strstr(p, " am\0") || strstr(p, " am_bw");
            bool bw = strstr(p, "am_bw") || strstr(p, "rma_bw");
            n += (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, " %s[%s%s%s]", tl,
                                  am ? "am" : "", am && bw ? "," : "", bw ? "bw" : "");
        } else if (rndv) {
            /* the number just before "..<rndv>" */
            char *q = rndv;
            while (q > line && q[-1] >= '0' && q[-1] <= '9')
                q--;
            if (q < rndv)
                n += (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, " rndv>=%.*s",
                                      (int)(rndv - q), q);
        }
    }
    free(text);
    if (n > 4) snprintf(c->base.describe, sizeof c->base.describe, "%s", out);
    c->lanes_known = true;
    c->memh_lanes = n <= 4 || hs__ucx_describe_has_rdma(out); /* unread lanes: as if RDMA */
}

bool hs__ucx_describe_has_rdma(const char *d)
{
    /* rc_verbs, rc_mlx5, dc_mlx5, ud_verbs, ud_mlx5 (not "cm=rdmacm") */
    static const char *tls[] = {" rc_", " dc_", " ud_", " rc/", " dc/", " ud/"};
    for (size_t i = 0; i < sizeof tls / sizeof tls[0]; i++)
        if (strstr(d, tls[i])) return true;
    return false;
}
