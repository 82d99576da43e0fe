/* SPDX-License-Identifier: Apache-2.0 */
/* hs_devices.h - RDMA device discovery for --list-devices, --nic and
 * --require-rdma: the ports libibverbs sees, the GPUs on the PCI bus (from
 * sysfs, so no CUDA is needed here), and the NIC nearest each GPU by PCIe
 * distance.
 *
 * Ownership: every array returned here is malloc'd and belongs to the
 * caller, who frees it with free(). Nothing keeps a pointer into it. */
#ifndef HS_DEVICES_H
#define HS_DEVICES_H

#include <stdio.h>
#include <stdbool.h>
#include <stddef.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HS_DEV_NAME_CAP 64
#define HS_DEV_PATH_CAP 256

/* One port of an RDMA device. */
typedef struct {
    char device[HS_DEV_NAME_CAP]; /* "mlx5_0" */
    unsigned port;                /* 1-based */
    bool active;                  /* state is ACTIVE */
    char state[16];               /* "ACTIVE", "DOWN", "INIT", ... */
    char link_layer[16];          /* "InfiniBand" or "Ethernet" */
    unsigned width;               /* lanes: 1, 2, 4, 8, 12 (0 = unknown) */
    double lane_gbps;             /* nominal Gb/s per lane (0 = unknown) */
    int gid_count;                /* GID table length */
    int numa_node;                /* -1 = unknown */
    char pci[32];                 /* PCI address "0000:17:00.0", "" = unknown */
    char sysfs[HS_DEV_PATH_CAP];  /* resolved /sys/devices/... path, "" = unknown */
} hs_rdma_port_t;

/* One NVIDIA GPU on the PCI bus. */
typedef struct {
    int index; /* position in PCI bus order (CUDA's order with CUDA_DEVICE_ORDER=PCI_BUS_ID) */
    char pci[32];
    int numa_node;
    char sysfs[HS_DEV_PATH_CAP];
} hs_gpu_pci_t;

/* Every port of every RDMA device libibverbs lists (*n = 0 and *out = NULL
 * when there is none, which is not an error). */
HS_MUST_CHECK hs_status_t hs_dev_rdma_list(hs_rdma_port_t **out, size_t *n);

/* The folder read as /sys when no other is given (tests point it at a fake
 * tree; hs-consumer and hs-producer take it from HS_SYSFS_ROOT); NULL or ""
 * = /sys, the default. Copied; process-wide; before discovery. */
void hs_dev_sysfs_root_set(const char *root);

/* NVIDIA GPUs (vendor 0x10de, class 0x0300/0x0302) under sysfs_root
 * ("/sys"; NULL = the one hs_dev_sysfs_root_set() named), sorted by PCI
 * address. */
HS_MUST_CHECK hs_status_t hs_dev_gpu_list(const char *sysfs_root, hs_gpu_pci_t **out, size_t *n);

/* The GPU a process calls `cuda_index`: with CUDA_VISIBLE_DEVICES set to
 * indices, the index-th of that list; NULL when it cannot be told (index
 * out of range, or CUDA_VISIBLE_DEVICES holds UUIDs). */
const hs_gpu_pci_t *hs_dev_gpu_for_cuda_index(const hs_gpu_pci_t *gpus, size_t n, int cuda_index);

/* PCIe hops between two resolved sysfs device paths (up from one to their
 * deepest common bridge, then down to the other); -1 when they share no
 * bridge (other root complex) or a path is unknown. */
int hs_dev_pci_distance(const char *sysfs_a, const char *sysfs_b);

/* The port nearest `gpu`, preferring active ports, then fewer PCIe hops,
 * then the same NUMA node; with gpu NULL the first active port. -1 when
 * there is no port (or, with active_only, no active one). */
int hs_dev_nearest_port(const hs_rdma_port_t *ports, size_t n, const hs_gpu_pci_t *gpu,
                        bool active_only);

/* Resolves a --nic value against `ports`:
 *   "auto"           the port nearest `gpu` (NULL: the first active port);
 *                    with no RDMA device, UCX's own choice
 *   "NAME[:PORT],.." each NAME must be a device libibverbs knows (PORT one
 *                    of its ports; without it, port 1); other entries
 *                    (e.g. a netdev such as "eth0:") are not allowed here
 * On success *out is the UCX_NET_DEVICES list ("mlx5_0:1,mlx5_1:1"), or NULL
 * for UCX's choice; the caller frees it. HS_ERR_NOT_FOUND for an unknown
 * device or port (the error, logged, lists the known ones), HS_ERR_INVALID
 * for a malformed value. */
HS_MUST_CHECK hs_status_t hs_dev_nic_resolve(const char *spec, const hs_rdma_port_t *ports,
                                             size_t n, const hs_gpu_pci_t *gpu, char **out);

/* Prints the --list-devices report: each port, then for each GPU its
 * nearest port. */
void hs_dev_print(FILE *f, const hs_rdma_port_t *ports, size_t n, const hs_gpu_pci_t *gpus,
                  size_t n_gpus);

/* Convenience for the CLIs: discover and print (--list-devices). */
HS_MUST_CHECK hs_status_t hs_dev_list_print(FILE *f);
/* Discover and resolve --nic for the process that uses CUDA device
 * `cuda_gpu` (-1 = none); logs what was picked and why. */
HS_MUST_CHECK hs_status_t hs_dev_nic_select(const char *spec, int cuda_gpu, char **out);
/* Number of RDMA devices libibverbs sees (0 on failure). */
size_t hs_dev_rdma_count(void);

#ifdef __cplusplus
}
#endif
#endif /* HS_DEVICES_H */
