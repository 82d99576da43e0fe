/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_ctx.c - the UCX context and worker of a transport: opened at create
 * (ucx.c), narrowed to the listen address's interfaces before the first
 * listen (ucx_boot_server.c), closed at destroy; and a peer's worker address
 * matched against this worker's own (both bootstrap sides). */
#include "ucx_int.h"
#include "hs_log.h"

#include "hs_devices.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Opens tp's UCX context and worker with `net_devices` as UCX_NET_DEVICES
 * (NULL: UCX's own setting). On failure tp's UCX fields are left NULL. */
hs_status_t hs__ucx_ctx_open(ucx_tp_t *tp, const char *net_devices)
{
    const hs_tp_config_t *cfg = &tp->base.cfg;
    tp->ctx = NULL;
    tp->worker = NULL;
    tp->my_addr = NULL;
    tp->my_parsed = NULL;
    tp->efd = -1;
    ucp_config_t *config = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config); /* honours UCX_* variables */
    if (st != UCS_OK) {
        hs_error("reading the UCX configuration failed: %s; check the UCX_* environment variables",
                 ucs_status_string(st));
        return HS_ERR_IO;
    }
    if (net_devices && net_devices[0]) {
        st = ucp_config_modify(config, "NET_DEVICES", net_devices);
        if (st != UCS_OK) {
            hs_error("UCX rejects net devices '%s': %s; give a list such as mlx5_0:1,eth0",
                     net_devices, ucs_status_string(st));
            goto err_config;
        }
    }
    if (!getenv("UCX_KEEPALIVE_INTERVAL")) {
        /* a few probes within the peer timeout */
        char v[32];
        uint32_t ms = cfg->peer_timeout_s * 1000u / 3u;
        snprintf(v, sizeof v, "%ums", ms ? ms : 1u);
        (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL", v);
    }
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .name = "hsflow",
    };
    st = ucp_init(&params, config, &tp->ctx);
    if (st != UCS_OK) {
        hs_error("ucp_init failed: %s; check the UCX installation and UCX_* variables",
                 ucs_status_string(st));
        goto err_config;
    }
    ucp_config_release(config);
    config = NULL;
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    st = ucp_worker_create(tp->ctx, &wp, &tp->worker);
    if (st != UCS_OK) {
        hs_error("ucp_worker_create failed: %s", ucs_status_string(st));
        goto err_ctx;
    }
    st = ucp_worker_get_efd(tp->worker, &tp->efd);
    if (st != UCS_OK) {
        hs_error("ucp_worker_get_efd failed: %s", ucs_status_string(st));
        goto err_worker;
    }
    st = ucp_worker_get_address(tp->worker, &tp->my_addr, &tp->my_addr_len);
    if (st != UCS_OK) {
        hs_error("ucp_worker_get_address failed: %s", ucs_status_string(st));
        goto err_worker;
    }
    {
        char why[256];
        tp->my_parsed = malloc(sizeof *tp->my_parsed);
        if (!tp->my_parsed) goto err_worker;
        if (hs__ucx_addr_parse((const uint8_t *)tp->my_addr, tp->my_addr_len, tp->my_parsed, why,
                               sizeof why) != HS_OK) {
            /* peers' addresses could not be checked: none would be safe */
            hs_error("this UCX packs its own worker address in a layout hsflow does not know (%s): "
                     "hsflow checks peers' addresses in UCX 1.13's layout, without "
                     "UCX_UNIFIED_MODE; use UCX 1.13 or --transport tcp",
                     why);
            goto err_worker;
        }
    }
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    tp->max_am_header = ucp_worker_query(tp->worker, &wa) == UCS_OK ? wa.max_am_header : 0;
    static const unsigned ids[] = {AM_FRAME, AM_PAYLOAD, AM_CLOSE};
    ucp_am_recv_callback_t cbs[] = {hs__ucx_am_frame_cb, hs__ucx_am_payload_cb,
                                    hs__ucx_am_close_cb};
    for (int i = 0; i < 3; i++) {
        ucp_am_handler_param_t hp = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                          UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
            .id = ids[i],
            .flags = UCP_AM_FLAG_WHOLE_MSG,
            .cb = cbs[i],
            .arg = tp,
        };
        st = ucp_worker_set_am_recv_handler(tp->worker, &hp);
        if (st != UCS_OK) {
            hs_error("registering UCX active message handler %u failed: %s", ids[i],
                     ucs_status_string(st));
            goto err_worker;
        }
    }
    return HS_OK;

err_worker:
    free(tp->my_parsed);
    if (tp->my_addr) ucp_worker_release_address(tp->worker, tp->my_addr);
    ucp_worker_destroy(tp->worker);
err_ctx:
    ucp_cleanup(tp->ctx);
err_config:
    if (config) ucp_config_release(config);
    tp->ctx = NULL;
    tp->worker = NULL;
    tp->my_addr = NULL;
    tp->my_parsed = NULL;
    tp->efd = -1;
    return HS_ERR_IO;
}

void hs__ucx_ctx_close(ucx_tp_t *tp)
{
    if (!tp->ctx) return;
    ucp_worker_release_address(tp->worker, tp->my_addr);
    free(tp->my_parsed);
    for (size_t i = 0; i < tp->n_regions; i++)
        ucp_mem_unmap(tp->ctx, tp->regions[i].memh);
    ucp_worker_destroy(tp->worker);
    ucp_cleanup(tp->ctx);
    tp->ctx = NULL;
}

hs_status_t hs__ucx_peer_addr(ucx_tp_t *tp, const uint8_t *addr, size_t len, uint8_t **out,
                              char *why, size_t whycap)
{
    uint8_t *buf = calloc(1, len + HS__UCX_ADDR_PAD);
    if (!buf) {
        snprintf(why, whycap, "out of memory for a %zu-byte UCX worker address", len);
        return HS_ERR_NOMEM;
    }
    size_t n = 0;
    hs_status_t st = hs__ucx_addr_filter(addr, len, tp->my_parsed, buf, &n, why, whycap);
    if (st != HS_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    return HS_OK;
}

/* ---- where UCX's own listeners bind ----------------------------------------
 *
 * UCX's tcp transport opens a listening socket on the address of every
 * network interface it uses (src/uct/tcp/tcp_iface.c binds the interface's
 * own address, port from UCX_TCP_PORT_RANGE or the kernel) and accepts on
 * it, in its own thread, any number of connections that it keeps with no
 * time limit. With UCX's default of every interface, a consumer told to
 * listen on 127.0.0.1 was reachable on its external address too. So the
 * first listen narrows UCX_NET_DEVICES to the interfaces that hold the
 * listen address; RDMA ports stay (verbs transports open no socket).
 * Shared-memory transports are not network devices and stay as they are. */

static bool name_add(char *list, size_t cap, const char *name)
{
    size_t l = strlen(name), n = strlen(list);
    for (const char *p = list; *p;) { /* already there? */
        size_t k = strcspn(p, ",");
        if (k == l && strncmp(p, name, l) == 0) return true;
        p += k + (p[k] == ',');
    }
    if (n + (n > 0) + l + 1 > cap) return false;
    if (n) list[n++] = ',';
    memcpy(list + n, name, l + 1);
    return true;
}

static bool sa_same_addr(const struct sockaddr *a, const struct sockaddr *b)
{
    if (a->sa_family != b->sa_family) return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return false;
}

static bool sa_is_wildcard(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return false;
}

/* The interfaces holding host's addresses into list[cap] ("lo", "eth0");
 * *wildcard when host is one. */
static hs_status_t listen_netdevs(const char *host, char *list, size_t cap, bool *wildcard)
{
    list[0] = '\0';
    *wildcard = false;
    struct addrinfo *ai = NULL;
    hs_status_t st = hs__sock_resolve(host, 0, true, &ai);
    if (st != HS_OK) return st;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) {
        hs_warn("cannot list the network interfaces (%m): UCX keeps its own choice of devices");
        freeaddrinfo(ai);
        return HS_ERR_IO;
    }
    for (const struct addrinfo *a = ai; a; a = a->ai_next) {
        if (sa_is_wildcard(a->ai_addr)) *wildcard = true;
        bool lo = hs__tp_addr_is_loopback(a->ai_addr);
        for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != a->ai_addr->sa_family) continue;
            bool holds =
                lo ? (i->ifa_flags & IFF_LOOPBACK) != 0 : sa_same_addr(i->ifa_addr, a->ai_addr);
            if (holds && !name_add(list, cap, i->ifa_name)) st = HS_ERR_NOMEM;
        }
    }
    freeifaddrs(ifs);
    freeaddrinfo(ai);
    return st;
}

hs_status_t hs__ucx_listen_devices(ucx_tp_t *tp, const char *host)
{
    if (tp->devices_chosen || tp->n_lfds > 0 || tp->conns || tp->pending) return HS_OK;
    char list[1024];
    bool wildcard = false;
    if (listen_netdevs(host, list, sizeof list, &wildcard) != HS_OK) return HS_OK;
    if (wildcard) {
        hs_debug("ucx: listening on every address: UCX uses every network interface");
        return HS_OK;
    }
    if (!list[0]) {
        hs_warn("ucx: no network interface holds %s: UCX keeps its own choice of devices, and "
                "its own listeners may bind on other addresses; set UCX_NET_DEVICES",
                host);
        return HS_OK;
    }
    char netdevs[sizeof list];
    memcpy(netdevs, list, sizeof list);
    hs_rdma_port_t *ports = NULL;
    size_t n_ports = 0;
    if (hs_dev_rdma_list(&ports, &n_ports) == HS_OK) {
        for (size_t i = 0; i < n_ports; i++) {
            char name[HS_DEV_NAME_CAP + 16];
            snprintf(name, sizeof name, "%s:%u", ports[i].device, ports[i].port);
            (void)name_add(list, sizeof list, name);
        }
    }
    free(ports);
    /* a new context and worker, then the old ones go (nothing uses them
     * yet: no connection, no listener) */
    ucx_tp_t old = *tp;
    if (hs__ucx_ctx_open(tp, list) != HS_OK) {
        hs_error("ucx: cannot limit UCX to the interfaces of %s (%s); set UCX_NET_DEVICES", host,
                 list);
        *tp = old; /* nothing but the context's fields has changed since */
        return HS_ERR_IO;
    }
    /* the regions again on the new context; the old handles kept aside */
    hs_status_t st = HS_OK;
    ucp_mem_h *old_memh = tp->n_regions ? malloc(tp->n_regions * sizeof *old_memh) : NULL;
    if (tp->n_regions && !old_memh) st = HS_ERR_NOMEM;
    size_t mapped = 0;
    for (; st == HS_OK && mapped < tp->n_regions; mapped++) {
        ucp_mem_map_params_t mp = {
            .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
            .address = tp->regions[mapped].addr,
            .length = tp->regions[mapped].len,
        };
        ucp_mem_h memh;
        ucs_status_t us = ucp_mem_map(tp->ctx, &mp, &memh);
        if (us != UCS_OK) {
            hs_error("ucp_mem_map of %zu bytes failed again on the narrowed UCX context: %s",
                     tp->regions[mapped].len, ucs_status_string(us));
            st = HS_ERR_IO;
            break;
        }
        old_memh[mapped] = tp->regions[mapped].memh;
        tp->regions[mapped].memh = memh;
    }
    /* the context that goes: the old one, or on failure the new one */
    ucx_tp_t gone = *tp;
    if (st != HS_OK) {
        for (size_t i = 0; i < mapped; i++) {
            ucp_mem_unmap(tp->ctx, tp->regions[i].memh);
            tp->regions[i].memh = old_memh[i];
        }
        *tp = old; /* nothing but the context's fields has changed since */
    } else {
        gone = old;
        for (size_t i = 0; i < tp->n_regions; i++)
            ucp_mem_unmap(old.ctx, old_memh[i]);
    }
    free(old_memh);
    gone.n_regions = 0; /* its handles are unmapped above */
    hs__ucx_ctx_close(&gone);
    if (st != HS_OK) return st;
    hs_info("ucx: UCX limited to %s, the interface%s of %s, so that its own listeners bind "
            "there only (set UCX_NET_DEVICES to choose otherwise)",
            list, strchr(netdevs, ',') ? "s" : "", host);
    return HS_OK;
}
