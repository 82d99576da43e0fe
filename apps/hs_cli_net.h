/* SPDX-License-Identifier: Apache-2.0 */
/* hs_cli_net.h - what the two network commands (hs-consumer, hs-producer)
 * share on their command lines: the transport flags (--transport,
 * --tcp-sockbuf, --ucx-memh, --fault), the RDMA ones (--nic,
 * --require-rdma, --list-devices), the secret (--secret-file, and the
 * consumer's --insecure), and the handling of SIGINT/SIGTERM/SIGPIPE.
 *
 * A command puts HS_CLI_NET_OPTIONS (and HS_CLI_NET_OPTION_INSECURE where it
 * offers it) in its getopt_long table, so each flag is also read from its
 * HS_<NAME> environment variable by hs_cli_parse(), and hands every option
 * to hs_cli_net_apply() before its own. Its --help keeps its own words for
 * these flags.
 *
 * Ownership: the strings of hs_cli_net_t point into argv or the
 * environment; net_devices is the struct's own, freed by
 * hs_cli_net_fini(). */
#ifndef HS_CLI_NET_H
#define HS_CLI_NET_H

#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdbool.h>

#include "hs_cli.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    HS_CLI_NET_OPT_SECRET = 0x4e00, /* above every command's own option values */
    HS_CLI_NET_OPT_INSECURE,
    HS_CLI_NET_OPT_TRANSPORT,
    HS_CLI_NET_OPT_TCP_SOCKBUF,
    HS_CLI_NET_OPT_UCX_MEMH,
    HS_CLI_NET_OPT_FAULT,
    HS_CLI_NET_OPT_NIC,
    HS_CLI_NET_OPT_REQUIRE_RDMA,
    HS_CLI_NET_OPT_LIST_DEVICES,
};

/* Entries of a struct option table (the last without its comma). */
/* clang-format off */
#define HS_CLI_NET_OPTIONS                                               \
    {"secret-file", required_argument, NULL, HS_CLI_NET_OPT_SECRET},     \
    {"transport", required_argument, NULL, HS_CLI_NET_OPT_TRANSPORT},    \
    {"tcp-sockbuf", required_argument, NULL, HS_CLI_NET_OPT_TCP_SOCKBUF}, \
    {"ucx-memh", required_argument, NULL, HS_CLI_NET_OPT_UCX_MEMH},      \
    {"fault", required_argument, NULL, HS_CLI_NET_OPT_FAULT},            \
    {"nic", required_argument, NULL, HS_CLI_NET_OPT_NIC},                \
    {"require-rdma", no_argument, NULL, HS_CLI_NET_OPT_REQUIRE_RDMA},    \
    {"list-devices", no_argument, NULL, HS_CLI_NET_OPT_LIST_DEVICES}
#define HS_CLI_NET_OPTION_INSECURE {"insecure", no_argument, NULL, HS_CLI_NET_OPT_INSECURE}
/* clang-format on */

/* The flags as given; zero-initialised is "none given". */
typedef struct {
    const char *secret_file; /* --secret-file; NULL = none */
    bool insecure;           /* --insecure */
    const char *transport;   /* --transport auto|shm|tcp|ucx; NULL = not given (auto) */
    uint64_t tcp_sockbuf;    /* --tcp-sockbuf: 0 = not given, HS_TP_SOCKBUF_AUTOTUNE for 0 */
    bool ucx_no_memh;        /* --ucx-memh 0 */
    const char *fault;       /* --fault SPEC, checked where the transport starts */
    const char *nic;         /* --nic; NULL = UCX's choice */
    bool require_rdma;       /* --require-rdma */
    bool list_devices;       /* --list-devices */
    char *net_devices;       /* UCX_NET_DEVICES from --nic (hs_cli_net_resolve); owned */
} hs_cli_net_t;

/* The flags into `cfg`, a configuration with the same field names
 * (hs_consumer_config_t, hs_producer_config_t): what was given replaces
 * the default. --insecure, which only the consumer has, is the caller's,
 * and so is --fault: hs_producer_config_t.fault, the consumer's
 * hs__consumer_fault_set(). */
#define HS_CLI_NET_CONFIGURE(cfg, n)                                                               \
    do {                                                                                           \
        (cfg)->secret_file = (n)->secret_file;                                                     \
        if ((n)->transport) (cfg)->transport = (n)->transport;                                     \
        if ((n)->tcp_sockbuf) (cfg)->tcp_sockbuf = (n)->tcp_sockbuf;                               \
        (cfg)->ucx_no_memh = (n)->ucx_no_memh;                                                     \
        (cfg)->require_rdma = (n)->require_rdma;                                                   \
    } while (0)

/* One option of hs_cli_parse()'s callback: 0 when it was one of these flags
 * and its value is good, 2 when the value is bad (printed as
 * "PROG: --FLAG 'VALUE' (FROM): what was expected"), -1 when `opt` is not
 * one of these flags. */
int hs_cli_net_apply(hs_cli_net_t *n, const char *prog, int opt, const char *arg, const char *from);

/* After parsing, before the transport starts: --require-rdma must be
 * possible (not with --transport tcp, an RDMA device present) and --nic is
 * resolved for the process's CUDA device `cuda_gpu` (-1 = none) into
 * n->net_devices (ignored, with a warning, under --transport tcp). 0, or 2
 * after printing (or logging) why not. */
int hs_cli_net_resolve(hs_cli_net_t *n, const char *prog, int cuda_gpu);

/* Frees net_devices; the struct may be resolved again. NULL is fine. */
void hs_cli_net_fini(hs_cli_net_t *n);

/* SIGPIPE ignored; the first SIGINT or SIGTERM stores the signal's number
 * in the returned flag and writes first_msg (NULL = nothing) to stderr; a
 * second one writes "PROG: second signal: exiting at once" and exits at
 * once with 128 + the signal's number. The flag is the process's one; the
 * caller polls it or hands it to the engine. */
volatile sig_atomic_t *hs_cli_signals_install(const char *prog, const char *first_msg);

#ifdef __cplusplus
}
#endif
#endif /* HS_CLI_NET_H */
