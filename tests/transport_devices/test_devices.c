/* SPDX-License-Identifier: Apache-2.0 */
/* test_devices.c - RDMA device discovery (transport/devices.c): GPUs found
 * in a fake sysfs tree, PCIe distance, the NIC nearest a GPU, --nic
 * resolution and its errors, the --list-devices report, and the real
 * libibverbs listing of this machine (which may hold no device). */
#include <check.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hs_devices.h"

static char g_root[PATH_MAX];

/* snprintf that fails the test instead of truncating a path. */
__attribute__((format(printf, 3, 4))) static void fmt(char *buf, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(buf, cap, f, ap);
    va_end(ap);
    ck_assert_msg(n >= 0 && (size_t)n < cap, "'%s' does not fit in %zu bytes", f, cap);
}

static void mkdirs(const char *rel)
{
    char path[PATH_MAX];
    fmt(path, sizeof path, "%s/%s", g_root, rel);
    for (char *p = path + strlen(g_root) + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    mkdir(path, 0755);
}

static void put(const char *rel, const char *text)
{
    char path[PATH_MAX];
    fmt(path, sizeof path, "%s/%s", g_root, rel);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* A PCI function at devices/<dir> with vendor, class and NUMA node, linked
 * from bus/pci/devices/<its address>. */
static void pci_dev(const char *dir, const char *vendor, const char *cls, const char *numa)
{
    char rel[PATH_MAX], link[PATH_MAX], target[PATH_MAX];
    fmt(rel, sizeof rel, "devices/%s", dir);
    mkdirs(rel);
    fmt(link, sizeof link, "%s/vendor", rel);
    put(link, vendor);
    fmt(link, sizeof link, "%s/class", rel);
    put(link, cls);
    fmt(link, sizeof link, "%s/numa_node", rel);
    put(link, numa);
    const char *addr = strrchr(dir, '/') + 1;
    fmt(link, sizeof link, "%s/bus/pci/devices/%s", g_root, addr);
    fmt(target, sizeof target, "%s/devices/%s", g_root, dir);
    ck_assert_int_eq(symlink(target, link), 0);
}

#define GPU0_DIR "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0"
#define NICA_DIR "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0"
#define GPU1_DIR "pci0000:80/0000:80:01.0/0000:81:00.0"
#define NICB_DIR "pci0000:80/0000:80:02.0/0000:82:00.0"

/* Two GPUs and two NICs on two root complexes, plus devices that are not GPUs. */
static void fake_sysfs_setup(void)
{
    fmt(g_root, sizeof g_root, "/tmp/hs-devices-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_root));
    char real[PATH_MAX];
    ck_assert_ptr_nonnull(realpath(g_root, real));
    fmt(g_root, sizeof g_root, "%s", real);
    mkdirs("bus/pci/devices");
    pci_dev(GPU1_DIR, "0x10de\n", "0x030200\n", "1\n"); /* listed second by address */
    pci_dev(GPU0_DIR, "0x10de\n", "0x030000\n", "0\n"); /* VGA class counts too */
    pci_dev(NICA_DIR, "0x15b3\n", "0x020700\n", "0\n"); /* behind GPU0's switch */
    pci_dev(NICB_DIR, "0x15b3\n", "0x020700\n", "1\n"); /* GPU1's root complex */
    pci_dev("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.1", "0x10de\n", "0x040300\n",
            "0\n");                                                      /* NVIDIA audio */
    pci_dev("pci0000:00/0000:00:1f.0", "0x8086\n", "0x030000\n", "0\n"); /* other vendor's VGA */
}

static void fake_sysfs_teardown(void)
{
    char cmd[PATH_MAX + 16];
    fmt(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    ck_assert_int_eq(system(cmd), 0);
}

static hs_rdma_port_t port(const char *dev, unsigned p, bool active, const char *dir, int numa)
{
    hs_rdma_port_t r = {0};
    fmt(r.device, sizeof r.device, "%s", dev);
    r.port = p;
    r.active = active;
    fmt(r.state, sizeof r.state, "%s", active ? "ACTIVE" : "DOWN");
    fmt(r.link_layer, sizeof r.link_layer, "InfiniBand");
    r.width = 4;
    r.lane_gbps = 100;
    r.gid_count = 128;
    r.numa_node = numa;
    if (dir) {
        fmt(r.sysfs, sizeof r.sysfs, "%s/devices/%s", g_root, dir);
        fmt(r.pci, sizeof r.pci, "%s", strrchr(dir, '/') + 1);
    }
    return r;
}

START_TEST(gpu_list_finds_nvidia_display_and_3d_controllers_in_pci_order)
{
    hs_gpu_pci_t *g;
    size_t n;
    ck_assert_int_eq(hs_dev_gpu_list(g_root, &g, &n), HS_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(g[0].pci, "0000:02:00.0");
    ck_assert_str_eq(g[1].pci, "0000:81:00.0");
    ck_assert_int_eq(g[0].index, 0);
    ck_assert_int_eq(g[1].index, 1);
    ck_assert_int_eq(g[0].numa_node, 0);
    ck_assert_int_eq(g[1].numa_node, 1);
    char want[PATH_MAX];
    fmt(want, sizeof want, "%s/devices/%s", g_root, GPU1_DIR);
    ck_assert_str_eq(g[1].sysfs, want);
    free(g);
}
END_TEST

START_TEST(gpu_list_of_a_tree_without_pci_bus_is_empty)
{
    hs_gpu_pci_t *g = (hs_gpu_pci_t *)1;
    size_t n = 9;
    char empty[PATH_MAX];
    fmt(empty, sizeof empty, "%s/devices", g_root);
    ck_assert_int_eq(hs_dev_gpu_list(empty, &g, &n), HS_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_null(g);
}
END_TEST

START_TEST(pci_distance_counts_hops_below_the_deepest_common_bridge)
{
    ck_assert_int_eq(
        hs_dev_pci_distance("/sys/devices/pci0000:00/a/b/g", "/sys/devices/pci0000:00/a/b/n"), 2);
    ck_assert_int_eq(
        hs_dev_pci_distance("/sys/devices/pci0000:80/a/g", "/sys/devices/pci0000:80/c/n"), 4);
    ck_assert_int_eq(
        hs_dev_pci_distance("/sys/devices/pci0000:00/a/g", "/sys/devices/pci0000:00/a/g"), 0);
    /* other root complex, or unknown */
    ck_assert_int_eq(
        hs_dev_pci_distance("/sys/devices/pci0000:00/a/g", "/sys/devices/pci0000:80/a/n"), -1);
    ck_assert_int_eq(hs_dev_pci_distance("", "/sys/devices/pci0000:80/a/n"), -1);
    ck_assert_int_eq(hs_dev_pci_distance(NULL, NULL), -1);
}
END_TEST

START_TEST(nearest_port_is_the_one_behind_the_gpus_switch)
{
    hs_gpu_pci_t *g;
    size_t n;
    ck_assert_int_eq(hs_dev_gpu_list(g_root, &g, &n), HS_OK);
    ck_assert_uint_eq(n, 2);
    hs_rdma_port_t p[3] = {port("mlx5_1", 1, true, NICB_DIR, 1),
                           port("mlx5_0", 1, true, NICA_DIR, 0),
                           port("mlx5_0", 2, false, NICA_DIR, 0)};
    ck_assert_int_eq(hs_dev_nearest_port(p, 3, &g[0], false), 1);
    ck_assert_int_eq(hs_dev_nearest_port(p, 3, &g[1], false), 0);
    /* without a GPU: the first active port */
    ck_assert_int_eq(hs_dev_nearest_port(p, 3, NULL, true), 0);
    /* an active port beats a nearer one that is down */
    p[1].active = false;
    ck_assert_int_eq(hs_dev_nearest_port(p, 3, &g[0], true), 0);
    ck_assert_int_eq(hs_dev_nearest_port(p, 3, &g[0], false), 0);
    /* nothing active */
    p[0].active = false;
    ck_assert_int_eq(hs_dev_nearest_port(p, 3, &g[0], true), -1);
    ck_assert_int_eq(hs_dev_nearest_port(p, 0, NULL, false), -1);
    free(g);
}
END_TEST

START_TEST(cuda_index_follows_cuda_visible_devices)
{
    hs_gpu_pci_t g[3] = {{.index = 0}, {.index = 1}, {.index = 2}};
    unsetenv("CUDA_VISIBLE_DEVICES");
    ck_assert_ptr_eq(hs_dev_gpu_for_cuda_index(g, 3, 1), &g[1]);
    ck_assert_ptr_null(hs_dev_gpu_for_cuda_index(g, 3, 3));
    ck_assert_ptr_null(hs_dev_gpu_for_cuda_index(g, 3, -1));
    setenv("CUDA_VISIBLE_DEVICES", "2,0", 1);
    ck_assert_ptr_eq(hs_dev_gpu_for_cuda_index(g, 3, 0), &g[2]);
    ck_assert_ptr_eq(hs_dev_gpu_for_cuda_index(g, 3, 1), &g[0]);
    ck_assert_ptr_null(hs_dev_gpu_for_cuda_index(g, 3, 2));
    setenv("CUDA_VISIBLE_DEVICES", "GPU-5d1a0c3e-0000", 1);
    ck_assert_ptr_null(hs_dev_gpu_for_cuda_index(g, 3, 0));
    unsetenv("CUDA_VISIBLE_DEVICES");
}
END_TEST

START_TEST(nic_auto_picks_the_port_nearest_the_gpu_or_leaves_it_to_ucx)
{
    hs_gpu_pci_t *g;
    size_t n;
    ck_assert_int_eq(hs_dev_gpu_list(g_root, &g, &n), HS_OK);
    hs_rdma_port_t p[2] = {port("mlx5_1", 1, true, NICB_DIR, 1),
                           port("mlx5_0", 1, true, NICA_DIR, 0)};
    char *out = NULL;
    ck_assert_int_eq(hs_dev_nic_resolve("auto", p, 2, &g[0], &out), HS_OK);
    ck_assert_str_eq(out, "mlx5_0:1");
    free(out);
    ck_assert_int_eq(hs_dev_nic_resolve("auto", p, 2, &g[1], &out), HS_OK);
    ck_assert_str_eq(out, "mlx5_1:1");
    free(out);
    ck_assert_int_eq(hs_dev_nic_resolve("auto", p, 2, NULL, &out), HS_OK);
    ck_assert_str_eq(out, "mlx5_1:1");
    free(out);
    /* no RDMA device at all, or none active: UCX's own choice */
    out = (char *)1;
    ck_assert_int_eq(hs_dev_nic_resolve("auto", NULL, 0, &g[0], &out), HS_OK);
    ck_assert_ptr_null(out);
    p[0].active = p[1].active = false;
    out = (char *)1;
    ck_assert_int_eq(hs_dev_nic_resolve("auto", p, 2, NULL, &out), HS_OK);
    ck_assert_ptr_null(out);
    free(g);
}
END_TEST

START_TEST(nic_names_resolve_to_a_ucx_device_list)
{
    hs_rdma_port_t p[3] = {port("mlx5_0", 1, false, NULL, -1), port("mlx5_0", 2, true, NULL, -1),
                           port("mlx5_1", 1, true, NULL, -1)};
    char *out = NULL;
    /* without a port: the device's active port */
    ck_assert_int_eq(hs_dev_nic_resolve("mlx5_0", p, 3, NULL, &out), HS_OK);
    ck_assert_str_eq(out, "mlx5_0:2");
    free(out);
    ck_assert_int_eq(hs_dev_nic_resolve("mlx5_0:1,mlx5_1", p, 3, NULL, &out), HS_OK);
    ck_assert_str_eq(out, "mlx5_0:1,mlx5_1:1");
    free(out);
}
END_TEST

START_TEST(nic_unknown_or_malformed_is_refused_and_sets_nothing)
{
    hs_rdma_port_t p[2] = {port("mlx5_0", 1, true, NULL, -1), port("mlx5_1", 1, true, NULL, -1)};
    const char *not_found[] = {"mlx5_9", "mlx5_0:2", "mlx5_0,eth0", "eth0:1"};
    for (size_t i = 0; i < sizeof not_found / sizeof *not_found; i++) {
        char *out = (char *)1;
        ck_assert_int_eq(hs_dev_nic_resolve(not_found[i], p, 2, NULL, &out), HS_ERR_NOT_FOUND);
        ck_assert_ptr_eq(out, (char *)1);
    }
    const char *invalid[] = {"",         ",",          "mlx5_0:",     "mlx5_0:x",
                             "mlx5_0:0", "mlx5_0:256", "auto,mlx5_0", ":1"};
    for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++) {
        char *out = (char *)1;
        ck_assert_msg(hs_dev_nic_resolve(invalid[i], p, 2, NULL, &out) == HS_ERR_INVALID,
                      "'%s' was not refused as invalid", invalid[i]);
        ck_assert_ptr_eq(out, (char *)1);
    }
    /* a name on a machine without RDMA devices */
    char *out = (char *)1;
    ck_assert_int_eq(hs_dev_nic_resolve("mlx5_0", NULL, 0, NULL, &out), HS_ERR_NOT_FOUND);
    ck_assert_ptr_eq(out, (char *)1);
}
END_TEST

static char *print_to_string(const hs_rdma_port_t *p, size_t n, const hs_gpu_pci_t *g, size_t ng)
{
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    ck_assert_ptr_nonnull(f);
    hs_dev_print(f, p, n, g, ng);
    fclose(f);
    return text;
}

START_TEST(report_says_clearly_when_there_is_no_rdma_device)
{
    char *t = print_to_string(NULL, 0, NULL, 0);
    ck_assert_ptr_nonnull(strstr(t, "no RDMA devices found (libibverbs sees none): UCX will use "
                                    "TCP/shared memory"));
    ck_assert_ptr_nonnull(strstr(t, "GPUs: none"));
    free(t);
}
END_TEST

START_TEST(report_lists_ports_and_the_nic_nearest_each_gpu)
{
    hs_gpu_pci_t *g;
    size_t n;
    ck_assert_int_eq(hs_dev_gpu_list(g_root, &g, &n), HS_OK);
    hs_rdma_port_t p[2] = {port("mlx5_1", 1, true, NICB_DIR, 1),
                           port("mlx5_0", 1, true, NICA_DIR, 0)};
    fmt(p[1].link_layer, sizeof p[1].link_layer, "Ethernet");
    char *t = print_to_string(p, 2, g, n);
    ck_assert_msg(strstr(t, "mlx5_0") && strstr(t, "Ethernet") && strstr(t, "400 Gb/s (4x100)") &&
                      strstr(t, "0000:02:01.0"),
                  "report lacks a port field:\n%s", t);
    ck_assert_msg(strstr(t, "gpu 0   0000:02:00.0  NUMA 0   nearest: mlx5_0:1 (2 PCIe hops, same "
                            "NUMA node)"),
                  "gpu 0 line wrong:\n%s", t);
    ck_assert_msg(strstr(t, "gpu 1   0000:81:00.0  NUMA 1   nearest: mlx5_1:1 (4 PCIe hops, same "
                            "NUMA node)"),
                  "gpu 1 line wrong:\n%s", t);
    free(t);
    /* GPUs but no RDMA device */
    t = print_to_string(NULL, 0, g, n);
    ck_assert_msg(strstr(t, "nearest: none (no RDMA device)"), "%s", t);
    free(t);
    free(g);
}
END_TEST

START_TEST(real_listing_works_on_this_machine)
{
    hs_rdma_port_t *p = NULL;
    size_t n = 0;
    ck_assert_int_eq(hs_dev_rdma_list(&p, &n), HS_OK);
    ck_assert_uint_eq(hs_dev_rdma_count() > 0, n > 0);
    for (size_t i = 0; i < n; i++) {
        ck_assert(p[i].device[0]);
        ck_assert_uint_ge(p[i].port, 1);
    }
    /* a name no machine has is refused, with or without devices */
    char *out = (char *)1;
    ck_assert_int_eq(hs_dev_nic_select("hs_no_such_nic", -1, &out), HS_ERR_NOT_FOUND);
    ck_assert_ptr_eq(out, (char *)1);
    /* auto always resolves: a port, or UCX's choice when there is none */
    out = (char *)1;
    ck_assert_int_eq(hs_dev_nic_select("auto", 0, &out), HS_OK);
    ck_assert(n > 0 || out == NULL);
    if (out != (char *)1) free(out);
    free(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("transport_devices");
    TCase *tc = tcase_create("all");
    tcase_add_checked_fixture(tc, fake_sysfs_setup, fake_sysfs_teardown);
    tcase_add_test(tc, gpu_list_finds_nvidia_display_and_3d_controllers_in_pci_order);
    tcase_add_test(tc, gpu_list_of_a_tree_without_pci_bus_is_empty);
    tcase_add_test(tc, pci_distance_counts_hops_below_the_deepest_common_bridge);
    tcase_add_test(tc, nearest_port_is_the_one_behind_the_gpus_switch);
    tcase_add_test(tc, cuda_index_follows_cuda_visible_devices);
    tcase_add_test(tc, nic_auto_picks_the_port_nearest_the_gpu_or_leaves_it_to_ucx);
    tcase_add_test(tc, nic_names_resolve_to_a_ucx_device_list);
    tcase_add_test(tc, nic_unknown_or_malformed_is_refused_and_sets_nothing);
    tcase_add_test(tc, report_says_clearly_when_there_is_no_rdma_device);
    tcase_add_test(tc, report_lists_ports_and_the_nic_nearest_each_gpu);
    tcase_add_test(tc, real_listing_works_on_this_machine);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
