/* SPDX-License-Identifier: Apache-2.0 */
/* cli_net.c - the command-line flags and signal handling hs-consumer and
 * hs-producer share (hs_cli_net.h): one parser for the transport, RDMA and
 * secret flags, one check of --require-rdma and --nic, one pair of signal
 * handlers. */
#include "hs_cli_net.h"
#include "hs_log.h"
#include "hs_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hs_devices.h"
#include "hs_transport.h"

int hs_cli_net_apply(hs_cli_net_t *n, const char *prog, int opt, const char *arg, const char *from)
{
    uint64_t u;
    switch (opt) {
    case HS_CLI_NET_OPT_SECRET:
        n->secret_file = arg;
        return 0;
    case HS_CLI_NET_OPT_INSECURE:
        n->insecure = true;
        return 0;
    case HS_CLI_NET_OPT_TRANSPORT:
        if (strcmp(arg, "auto") && strcmp(arg, "tcp") && strcmp(arg, "ucx") && strcmp(arg, "shm"))
            return hs_cli_bad(prog, "transport", arg, from, "expected auto, shm, tcp or ucx");
        n->transport = arg;
        return 0;
    case HS_CLI_NET_OPT_TCP_SOCKBUF:
        if (hs_parse_size(arg, &u) != HS_OK || u > HS_TP_SOCKBUF_MAX)
            return hs_cli_bad(prog, "tcp-sockbuf", arg, from,
                              "expected a size up to 1G such as 16M, or 0");
        n->tcp_sockbuf = u ? u : HS_TP_SOCKBUF_AUTOTUNE; /* 0: the kernel's autotuning */
        return 0;
    case HS_CLI_NET_OPT_UCX_MEMH:
        if (strcmp(arg, "0") && strcmp(arg, "1"))
            return hs_cli_bad(prog, "ucx-memh", arg, from, "expected 1 or 0");
        n->ucx_no_memh = !strcmp(arg, "0");
        return 0;
    case HS_CLI_NET_OPT_FAULT:
        n->fault = arg; /* checked where the transport starts */
        return 0;
    case HS_CLI_NET_OPT_NIC:
        if (!arg[0])
            return hs_cli_bad(prog, "nic", arg, from,
                              "expected auto or NAME[:PORT], e.g. mlx5_0:1");
        n->nic = arg;
        return 0;
    case HS_CLI_NET_OPT_REQUIRE_RDMA:
        n->require_rdma = true;
        return 0;
    case HS_CLI_NET_OPT_LIST_DEVICES:
        n->list_devices = true;
        return 0;
    }
    return -1;
}

int hs_cli_net_resolve(hs_cli_net_t *n, const char *prog, int cuda_gpu)
{
    bool tcp = n->transport && !strcmp(n->transport, "tcp");
    if (n->require_rdma) {
        if (tcp) {
            fprintf(stderr,
                    "%s: --require-rdma cannot be met with --transport tcp: use --transport ucx "
                    "(or auto), or drop --require-rdma\n",
                    prog);
            return 2;
        }
        if (hs_dev_rdma_count() == 0) {
            fprintf(stderr,
                    "%s: --require-rdma: no RDMA device on this machine (ibv_get_device_list "
                    "found none); drop --require-rdma to run over TCP\n",
                    prog);
            return 2;
        }
    }
    if (n->nic) {
        if (tcp)
            hs_warn("--nic %s is ignored with --transport tcp (it selects UCX's devices)", n->nic);
        else if (hs_dev_nic_select(n->nic, cuda_gpu, &n->net_devices) != HS_OK)
            return 2;
    }
    return 0;
}

void hs_cli_net_fini(hs_cli_net_t *n)
{
    if (!n) return;
    free(n->net_devices);
    n->net_devices = NULL;
}

/* ---- signals ------------------------------------------------------------ */

static volatile sig_atomic_t g_signal;
static char g_first_msg[256], g_second_msg[128]; /* written before the handlers exist */
static size_t g_first_len, g_second_len;

static void on_signal(int sig)
{
    if (g_signal) {
        ssize_t w = write(STDERR_FILENO, g_second_msg, g_second_len);
        (void)w;
        _exit(128 + sig);
    }
    g_signal = sig;
    if (g_first_len) {
        ssize_t w = write(STDERR_FILENO, g_first_msg, g_first_len);
        (void)w;
    }
}

volatile sig_atomic_t *hs_cli_signals_install(const char *prog, const char *first_msg)
{
    int k =
        snprintf(g_second_msg, sizeof g_second_msg, "%s: second signal: exiting at once\n", prog);
    g_second_len = k > 0 && (size_t)k < sizeof g_second_msg ? (size_t)k : 0;
    k = first_msg ? snprintf(g_first_msg, sizeof g_first_msg, "%s", first_msg) : 0;
    g_first_len = k > 0 && (size_t)k < sizeof g_first_msg ? (size_t)k : 0;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    return &g_signal;
}
