/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_mem.c - memory registration for the UCX transport: regions mapped
 * with ucp_mem_map once, and the handle that goes with a payload inside one
 * (see hs_tp_mem_register). */

#include "ucx_int.h"
#include "hs_log.h"

#include <assert.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* The handle of a registration that holds [p, p+len) whole, for a payload
 * of connection c; NULL when there is none (UCX then registers the memory
 * itself, on the data path where it needs to: counted), and NULL too when
 * c's lanes carry no RDMA transport (the handle would only cost time). */
ucp_mem_h hs__ucx_region_memh(ucx_tp_t *tp, ucx_conn_t *c, const void *p, uint64_t len)
{
    if (!tp->use_memh) return NULL;
    if (!c->lanes_known) hs__ucx_conn_refresh_describe(c);
    const uint8_t *b = p;
    for (size_t i = 0; i < tp->n_regions; i++) {
        const uint8_t *r = tp->regions[i].addr;
        if (b >= r && b + len <= r + tp->regions[i].len) {
            if (c->lanes_known && !c->memh_lanes) return NULL;
            tp->base.payloads_with_memh++;
            return tp->regions[i].memh;
        }
    }
    tp->base.payloads_unregistered++;
    return NULL;
}

hs_status_t hs__ucx_mem_register(hs_tp_t *t, void *addr, size_t len)
{
    ucx_tp_t *tp = tp_of(t);
    if (tp->n_regions == tp->cap_regions) {
        size_t ncap = tp->cap_regions ? tp->cap_regions * 2 : 8;
        ucx_region_t *n = realloc(tp->regions, ncap * sizeof *n);
        if (!n) return HS_ERR_NOMEM;
        tp->regions = n;
        tp->cap_regions = ncap;
    }
    ucp_mem_map_params_t p = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = addr,
        .length = len,
    };
    ucp_mem_h memh;
    ucs_status_t st = ucp_mem_map(tp->ctx, &p, &memh);
    if (st != UCS_OK) {
        hs_error("ucp_mem_map of %zu bytes at %p failed: %s (locked-memory limit? see ulimit -l)",
                 len, addr, ucs_status_string(st));
        return HS_ERR_IO;
    }
    tp->regions[tp->n_regions++] = (ucx_region_t){addr, len, memh};
    hs_debug("ucx: registered %zu bytes at %p", len, addr);
    return HS_OK;
}
