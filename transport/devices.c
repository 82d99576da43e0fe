/* SPDX-License-Identifier: Apache-2.0 */
/* devices.c - RDMA device discovery (libibverbs), GPUs from sysfs PCI, and
 * the NIC nearest each GPU by PCIe distance (hs_devices.h).
 *
 * PCIe distance is read from the resolved sysfs paths of the two devices:
 * /sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0 lists every
 * bridge from the root complex down, so two devices behind the same switch
 * share a long prefix and the hop count is the number of components below
 * their deepest common bridge (what nvidia-smi topo calls PIX/PXB/PHB). This
 * needs neither CUDA nor hwloc. */
#include "hs_devices.h"
#include "hs_log.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HS_HAVE_IBVERBS
#include <infiniband/verbs.h>
#endif

static char g_sysfs_root[128]; /* hs_dev_sysfs_root_set(); "" = /sys */

void hs_dev_sysfs_root_set(const char *root)
{
    snprintf(g_sysfs_root, sizeof g_sysfs_root, "%s", root ? root : "");
}

static const char *sysfs_root(const char *root)
{
    if (root) return root;
    return g_sysfs_root[0] ? g_sysfs_root : "/sys";
}

/* First line of a small sysfs file into buf (newline stripped); false if
 * it cannot be read. */
static bool read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (!ok) return false;
    buf[strcspn(buf, "\n")] = '\0';
    return true;
}

static int read_numa(const char *dir)
{
    char path[HS_DEV_PATH_CAP + 32], buf[32];
    snprintf(path, sizeof path, "%s/numa_node", dir);
    if (!read_line(path, buf, sizeof buf)) return -1;
    char *end;
    long v = strtol(buf, &end, 10);
    return end != buf && v >= 0 && v < 4096 ? (int)v : -1;
}

/* Resolves `dir` (a symlink into /sys/devices) into real[HS_DEV_PATH_CAP]
 * and its last component into pci[32]; both "" when unknown. */
static void resolve_pci(const char *dir, char *real, char *pci)
{
    char buf[PATH_MAX];
    real[0] = pci[0] = '\0';
    if (!realpath(dir, buf) || strlen(buf) >= HS_DEV_PATH_CAP) return;
    snprintf(real, HS_DEV_PATH_CAP, "%s", buf);
    const char *slash = strrchr(buf, '/');
    snprintf(pci, 32, "%s", slash ? slash + 1 : buf);
}

/* ---- RDMA ports (libibverbs) --------------------------------------------- */

#ifdef HS_HAVE_IBVERBS
/* Nominal Gb/s per lane for ibv_port_attr.active_speed. */
static double speed_gbps(uint8_t s)
{
    switch (s) {
    case 1:
        return 2.5; /* SDR */
    case 2:
        return 5.0; /* DDR */
    case 4:
        return 10.0; /* QDR */
    case 8:
        return 10.0; /* FDR10 */
    case 16:
        return 14.0; /* FDR */
    case 32:
        return 25.0; /* EDR */
    case 64:
        return 50.0; /* HDR */
    case 128:
        return 100.0; /* NDR */
    default:
        return 0.0;
    }
}

static unsigned width_lanes(uint8_t w)
{
    switch (w) {
    case 1:
        return 1;
    case 2:
        return 4;
    case 4:
        return 8;
    case 8:
        return 12;
    case 16:
        return 2;
    default:
        return 0;
    }
}

static void port_fill_sysfs(hs_rdma_port_t *p)
{
    char dir[HS_DEV_PATH_CAP];
    snprintf(dir, sizeof dir, "%s/class/infiniband/%s/device", sysfs_root(NULL), p->device);
    resolve_pci(dir, p->sysfs, p->pci);
    p->numa_node = read_numa(dir);
}
#endif

hs_status_t hs_dev_rdma_list(hs_rdma_port_t **out, size_t *n)
{
#ifndef HS_HAVE_IBVERBS
    *out = NULL;
    *n = 0;
    return HS_OK;
#else
    int n_dev = 0;
    struct ibv_device **list = ibv_get_device_list(&n_dev);
    if (!list) {
        /* ENOSYS: no kernel support at all, which is "no device" to us */
        if (errno == ENOSYS || errno == ENOENT) {
            *out = NULL;
            *n = 0;
            return HS_OK;
        }
        hs_error("ibv_get_device_list failed: %m");
        return HS_ERR_IO;
    }
    hs_rdma_port_t *ports = NULL;
    size_t np = 0, cap = 0;
    hs_status_t st = HS_OK;
    for (int i = 0; i < n_dev; i++) {
        const char *name = ibv_get_device_name(list[i]);
        struct ibv_context *ctx = ibv_open_device(list[i]);
        struct ibv_device_attr da;
        unsigned n_port = 0;
        if (ctx && ibv_query_device(ctx, &da) == 0) n_port = da.phys_port_cnt;
        if (!ctx)
            hs_warn("rdma device %s: cannot open it: %m; listing it without port details", name);
        for (unsigned p = 1; p <= (n_port ? n_port : 1); p++) {
            if (np == cap) {
                size_t nc = cap ? 2 * cap : 8;
                hs_rdma_port_t *g = realloc(ports, nc * sizeof *g);
                if (!g) {
                    st = HS_ERR_NOMEM;
                    if (ctx) ibv_close_device(ctx);
                    goto err_list;
                }
                ports = g;
                cap = nc;
            }
            hs_rdma_port_t *rp = &ports[np++];
            memset(rp, 0, sizeof *rp);
            snprintf(rp->device, sizeof rp->device, "%s", name ? name : "?");
            rp->port = p;
            rp->gid_count = -1;
            snprintf(rp->state, sizeof rp->state, "unknown");
            snprintf(rp->link_layer, sizeof rp->link_layer, "unknown");
            struct ibv_port_attr pa;
            if (n_port && ibv_query_port(ctx, (uint8_t)p, &pa) == 0) {
                rp->active = pa.state == IBV_PORT_ACTIVE;
                snprintf(rp->state, sizeof rp->state, "%s", ibv_port_state_str(pa.state));
                snprintf(rp->link_layer, sizeof rp->link_layer, "%s",
                         pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand");
                rp->width = width_lanes(pa.active_width);
                rp->lane_gbps = speed_gbps(pa.active_speed);
                rp->gid_count = pa.gid_tbl_len;
            }
            port_fill_sysfs(rp);
        }
        if (ctx) ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    *out = ports;
    *n = np;
    return HS_OK;
err_list:
    free(ports);
    ibv_free_device_list(list);
    return st;
#endif
}

size_t hs_dev_rdma_count(void)
{
    hs_rdma_port_t *p;
    size_t n;
    if (hs_dev_rdma_list(&p, &n) != HS_OK) return 0;
    free(p);
    return n;
}

/* ---- GPUs (sysfs PCI) ------------------------------------------------------ */

static int cmp_gpu(const void *a, const void *b)
{
    return strcmp(((const hs_gpu_pci_t *)a)->pci, ((const hs_gpu_pci_t *)b)->pci);
}

hs_status_t hs_dev_gpu_list(const char *root, hs_gpu_pci_t **out, size_t *n)
{
    char dir[HS_DEV_PATH_CAP];
    snprintf(dir, sizeof dir, "%s/bus/pci/devices", sysfs_root(root));
    DIR *d = opendir(dir);
    if (!d) { /* no PCI bus visible (container): no GPU to place */
        *out = NULL;
        *n = 0;
        return HS_OK;
    }
    hs_gpu_pci_t *gpus = NULL;
    size_t ng = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[2 * HS_DEV_PATH_CAP + 16], buf[32];
        snprintf(path, sizeof path, "%s/%s/vendor", dir, e->d_name);
        if (!read_line(path, buf, sizeof buf) || strtoul(buf, NULL, 16) != 0x10de) continue;
        snprintf(path, sizeof path, "%s/%s/class", dir, e->d_name);
        if (!read_line(path, buf, sizeof buf)) continue;
        unsigned long cls = strtoul(buf, NULL, 16) >> 8; /* 0xCCSSPP: class, subclass */
        if (cls != 0x0300 && cls != 0x0302) continue;    /* VGA or 3D controller */
        if (ng == cap) {
            size_t nc = cap ? 2 * cap : 8;
            hs_gpu_pci_t *g = realloc(gpus, nc * sizeof *g);
            if (!g) {
                free(gpus);
                closedir(d);
                return HS_ERR_NOMEM;
            }
            gpus = g;
            cap = nc;
        }
        hs_gpu_pci_t *g = &gpus[ng++];
        memset(g, 0, sizeof *g);
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        resolve_pci(path, g->sysfs, g->pci);
        if (!g->pci[0]) snprintf(g->pci, sizeof g->pci, "%.31s", e->d_name);
        g->numa_node = read_numa(path);
    }
    closedir(d);
    if (ng) qsort(gpus, ng, sizeof *gpus, cmp_gpu);
    for (size_t i = 0; i < ng; i++)
        gpus[i].index = (int)i;
    *out = gpus;
    *n = ng;
    return HS_OK;
}

const hs_gpu_pci_t *hs_dev_gpu_for_cuda_index(const hs_gpu_pci_t *gpus, size_t n, int cuda_index)
{
    if (cuda_index < 0) return NULL;
    long phys = cuda_index;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis && vis[0]) {
        const char *p = vis;
        for (int i = 0;; i++) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || (*end != ',' && *end != '\0')) return NULL; /* UUIDs, MIG ids */
            if (i == cuda_index) {
                phys = v;
                break;
            }
            if (*end == '\0') return NULL;
            p = end + 1;
        }
    }
    return phys >= 0 && (size_t)phys < n ? &gpus[phys] : NULL;
}

/* ---- PCIe distance ----------------------------------------------------------- */

/* Splits a path into at most cap components (pointers into buf). */
static int split_path(char *buf, char **comp, int cap)
{
    int k = 0;
    for (char *save = NULL, *s = strtok_r(buf, "/", &save); s && k < cap;
         s = strtok_r(NULL, "/", &save))
        comp[k++] = s;
    return k;
}

int hs_dev_pci_distance(const char *a, const char *b)
{
    if (!a || !b || !a[0] || !b[0]) return -1;
    char ba[HS_DEV_PATH_CAP], bb[HS_DEV_PATH_CAP];
    snprintf(ba, sizeof ba, "%s", a);
    snprintf(bb, sizeof bb, "%s", b);
    char *ca[64], *cb[64];
    int na = split_path(ba, ca, 64), nb = split_path(bb, cb, 64);
    int common = 0;
    while (common < na && common < nb && strcmp(ca[common], cb[common]) == 0)
        common++;
    /* they must share at least the root complex ("pciDDDD:BB") */
    bool shares_root = false;
    for (int i = 0; i < common; i++)
        if (strncmp(ca[i], "pci", 3) == 0) shares_root = true;
    if (!shares_root) return -1;
    return (na - common) + (nb - common);
}

/* Rank of a port for a GPU: lower is nearer. */
static long port_rank(const hs_rdma_port_t *p, const hs_gpu_pci_t *gpu)
{
    long r = p->active ? 0 : 1000000;
    if (gpu) {
        int d = hs_dev_pci_distance(p->sysfs, gpu->sysfs);
        r += (d < 0 ? 1000 : d) * 10;
        if (p->numa_node < 0 || p->numa_node != gpu->numa_node) r += 5;
    }
    return r;
}

int hs_dev_nearest_port(const hs_rdma_port_t *ports, size_t n, const hs_gpu_pci_t *gpu,
                        bool active_only)
{
    int best = -1;
    long best_rank = 0;
    for (size_t i = 0; i < n; i++) {
        if (active_only && !ports[i].active) continue;
        long r = port_rank(&ports[i], gpu);
        if (best < 0 || r < best_rank) { /* ties: the first in libibverbs' order */
            best = (int)i;
            best_rank = r;
        }
    }
    return best;
}

/* ---- --nic -------------------------------------------------------------------- */

/* "mlx5_0 (ports 1,2), mlx5_1 (port 1)" or "none". */
static void known_devices(const hs_rdma_port_t *ports, size_t n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (i && !strcmp(ports[i].device, ports[i - 1].device)) continue;
        size_t nports = 0;
        char list[64] = "";
        size_t ll = 0;
        for (size_t j = i; j < n && !strcmp(ports[j].device, ports[i].device); j++, nports++)
            ll += (size_t)snprintf(list + ll, ll < sizeof list ? sizeof list - ll : 0, "%s%u",
                                   nports ? "," : "", ports[j].port);
        len += (size_t)snprintf(buf + len, len < cap ? cap - len : 0, "%s%s (port%s %s)",
                                len ? ", " : "", ports[i].device, nports > 1 ? "s" : "", list);
    }
    if (!n) snprintf(buf, cap, "none");
}

static hs_status_t append(char **s, size_t *len, size_t *cap, const char *part)
{
    size_t pl = strlen(part);
    if (*len + pl + 2 > *cap) {
        size_t nc = (*len + pl + 2) * 2;
        char *g = realloc(*s, nc);
        if (!g) return HS_ERR_NOMEM;
        *s = g;
        *cap = nc;
    }
    if (*len) (*s)[(*len)++] = ',';
    memcpy(*s + *len, part, pl + 1);
    *len += pl;
    return HS_OK;
}

hs_status_t hs_dev_nic_resolve(const char *spec, const hs_rdma_port_t *ports, size_t n,
                               const hs_gpu_pci_t *gpu, char **out)
{
    if (!spec || !spec[0]) {
        hs_error("--nic is empty: give auto or an RDMA device such as mlx5_0 or mlx5_0:1");
        return HS_ERR_INVALID;
    }
    if (!strcmp(spec, "auto")) {
        if (!n) {
            *out = NULL;
            return HS_OK;
        }
        int i = hs_dev_nearest_port(ports, n, gpu, true);
        if (i < 0) {
            *out = NULL; /* every port is down: UCX decides (and require_rdma will tell) */
            return HS_OK;
        }
        char buf[HS_DEV_NAME_CAP + 16];
        snprintf(buf, sizeof buf, "%s:%u", ports[i].device, ports[i].port);
        char *s = strdup(buf);
        if (!s) return HS_ERR_NOMEM;
        *out = s;
        return HS_OK;
    }
    char known[1024];
    known_devices(ports, n, known, sizeof known);
    char *copy = strdup(spec);
    if (!copy) return HS_ERR_NOMEM;
    char *res = NULL;
    size_t len = 0, cap = 0;
    hs_status_t st = HS_OK;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        unsigned want = 0;
        if (colon) {
            *colon = '\0';
            char *end;
            unsigned long v = strtoul(colon + 1, &end, 10);
            if (end == colon + 1 || *end || v == 0 || v > 255) {
                hs_error("--nic '%s': '%s:%s' has no valid port number; write NAME or NAME:PORT "
                         "such as mlx5_0:1",
                         spec, tok, colon + 1);
                st = HS_ERR_INVALID;
                goto err;
            }
            want = (unsigned)v;
        }
        if (!tok[0] || !strcmp(tok, "auto")) {
            hs_error("--nic '%s': expected auto alone, or a list of RDMA devices such as "
                     "mlx5_0:1,mlx5_1:1",
                     spec);
            st = HS_ERR_INVALID;
            goto err;
        }
        int pick = -1;
        bool dev_known = false;
        for (size_t i = 0; i < n; i++) {
            if (strcmp(ports[i].device, tok)) continue;
            dev_known = true;
            if (want ? ports[i].port == want
                     : (pick < 0 || (!ports[pick].active && ports[i].active)))
                pick = (int)i;
        }
        if (!dev_known) {
            if (n)
                hs_error("--nic '%s': libibverbs knows no RDMA device '%s'; known: %s", spec, tok,
                         known);
            else
                hs_error("--nic '%s': libibverbs knows no RDMA device '%s' (no RDMA device on "
                         "this machine); use --nic auto or leave --nic out to let UCX choose",
                         spec, tok);
            st = HS_ERR_NOT_FOUND;
            goto err;
        }
        if (pick < 0) {
            hs_error("--nic '%s': RDMA device '%s' has no port %u; known: %s", spec, tok, want,
                     known);
            st = HS_ERR_NOT_FOUND;
            goto err;
        }
        if (!ports[pick].active)
            hs_warn("--nic: %s port %u is %s, not ACTIVE: UCX will not use it", tok,
                    ports[pick].port, ports[pick].state);
        char buf[HS_DEV_NAME_CAP + 16];
        snprintf(buf, sizeof buf, "%s:%u", ports[pick].device, ports[pick].port);
        st = append(&res, &len, &cap, buf);
        if (st != HS_OK) goto err;
    }
    if (!res) {
        hs_error("--nic '%s': no device given; write auto or NAME[:PORT][,NAME[:PORT]...]", spec);
        st = HS_ERR_INVALID;
        goto err;
    }
    free(copy);
    *out = res;
    return HS_OK;
err:
    free(res);
    free(copy);
    return st;
}

/* ---- report -------------------------------------------------------------------- */

static void describe_distance(const hs_rdma_port_t *p, const hs_gpu_pci_t *g, char *buf, size_t cap)
{
    int d = hs_dev_pci_distance(p->sysfs, g->sysfs);
    const char *numa = p->numa_node >= 0 && p->numa_node == g->numa_node ? "same NUMA node"
                       : p->numa_node < 0 || g->numa_node < 0            ? "NUMA unknown"
                                                                         : "other NUMA node";
    if (d < 0)
        snprintf(buf, cap, "other PCIe root complex, %s", numa);
    else
        snprintf(buf, cap, "%d PCIe hop%s, %s", d, d == 1 ? "" : "s", numa);
}

void hs_dev_print(FILE *f, const hs_rdma_port_t *ports, size_t n, const hs_gpu_pci_t *gpus,
                  size_t n_gpus)
{
    if (!n) {
        fprintf(f, "no RDMA devices found (libibverbs sees none): UCX will use TCP/shared "
                   "memory\n");
    } else {
        fprintf(f, "RDMA devices (libibverbs):\n");
        fprintf(f, "  %-12s %4s  %-8s %-10s %-20s %5s %5s  %s\n", "device", "port", "state", "link",
                "speed", "GIDs", "NUMA", "PCI");
        for (size_t i = 0; i < n; i++) {
            const hs_rdma_port_t *p = &ports[i];
            char speed[48] = "unknown", numa[16] = "?", gids[16] = "?";
            if (p->width && p->lane_gbps > 0)
                snprintf(speed, sizeof speed, "%g Gb/s (%ux%g)", p->width * p->lane_gbps, p->width,
                         p->lane_gbps);
            if (p->numa_node >= 0) snprintf(numa, sizeof numa, "%d", p->numa_node);
            if (p->gid_count >= 0) snprintf(gids, sizeof gids, "%d", p->gid_count);
            fprintf(f, "  %-12s %4u  %-8s %-10s %-20s %5s %5s  %s\n", p->device, p->port, p->state,
                    p->link_layer, speed, gids, numa, p->pci[0] ? p->pci : "?");
        }
        int a = hs_dev_nearest_port(ports, n, NULL, true);
        if (a >= 0)
            fprintf(f, "--nic auto without a GPU: %s:%u\n", ports[a].device, ports[a].port);
        else
            fprintf(f, "no RDMA port is ACTIVE: --nic auto leaves the choice to UCX\n");
    }
    if (!n_gpus) {
        fprintf(f, "GPUs: none on the PCI bus\n");
        return;
    }
    fprintf(f, "GPUs (PCI bus order; CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID) and the RDMA port "
               "nearest each:\n");
    for (size_t i = 0; i < n_gpus; i++) {
        const hs_gpu_pci_t *g = &gpus[i];
        char numa[16] = "?";
        if (g->numa_node >= 0) snprintf(numa, sizeof numa, "%d", g->numa_node);
        int k = hs_dev_nearest_port(ports, n, g, false);
        if (k < 0) {
            fprintf(f, "  gpu %-3d %s  NUMA %-3s nearest: none (no RDMA device)\n", g->index,
                    g->pci, numa);
            continue;
        }
        char why[96];
        describe_distance(&ports[k], g, why, sizeof why);
        fprintf(f, "  gpu %-3d %s  NUMA %-3s nearest: %s:%u (%s%s)\n", g->index, g->pci, numa,
                ports[k].device, ports[k].port, why, ports[k].active ? "" : ", port not ACTIVE");
    }
}

hs_status_t hs_dev_list_print(FILE *f)
{
    hs_rdma_port_t *ports = NULL;
    hs_gpu_pci_t *gpus = NULL;
    size_t n = 0, ng = 0;
    hs_status_t st = hs_dev_rdma_list(&ports, &n);
    if (st != HS_OK) return st;
    st = hs_dev_gpu_list(NULL, &gpus, &ng);
    if (st != HS_OK) goto err_ports;
    hs_dev_print(f, ports, n, gpus, ng);
    free(gpus);
err_ports:
    free(ports);
    return st;
}

hs_status_t hs_dev_nic_select(const char *spec, int cuda_gpu, char **out)
{
    hs_rdma_port_t *ports = NULL;
    hs_gpu_pci_t *gpus = NULL;
    size_t n = 0, ng = 0;
    hs_status_t st = hs_dev_rdma_list(&ports, &n);
    if (st != HS_OK) return st;
    const hs_gpu_pci_t *gpu = NULL;
    bool is_auto = spec && !strcmp(spec, "auto");
    if (is_auto && cuda_gpu >= 0 && n) {
        st = hs_dev_gpu_list(NULL, &gpus, &ng);
        if (st != HS_OK) goto err;
        gpu = hs_dev_gpu_for_cuda_index(gpus, ng, cuda_gpu);
        if (!gpu)
            hs_warn("--nic auto: cannot tell which PCI device CUDA GPU %d is (%zu NVIDIA GPU(s) "
                    "on the PCI bus, CUDA_VISIBLE_DEVICES=%s); picking the first active RDMA "
                    "port instead; give --nic NAME to choose",
                    cuda_gpu, ng,
                    getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    }
    char *res = NULL;
    st = hs_dev_nic_resolve(spec, ports, n, gpu, &res);
    if (st != HS_OK) goto err;
    if (is_auto) {
        if (!n)
            hs_info("--nic auto: no RDMA device (libibverbs sees none): UCX chooses its "
                    "devices itself (TCP/shared memory)");
        else if (!res)
            hs_warn("--nic auto: no RDMA port is ACTIVE: UCX chooses its devices itself");
        else if (gpu) {
            char why[96] = "";
            int k = hs_dev_nearest_port(ports, n, gpu, true);
            describe_distance(&ports[k], gpu, why, sizeof why);
            hs_info("--nic auto: %s, nearest to GPU %d (PCI %s; %s)", res, cuda_gpu, gpu->pci, why);
        } else
            hs_info("--nic auto: %s (the first active RDMA port)", res);
    } else {
        hs_info("--nic %s: UCX_NET_DEVICES=%s", spec, res);
    }
    *out = res;
err:
    free(gpus);
    free(ports);
    return st;
}
