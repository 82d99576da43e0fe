/* SPDX-License-Identifier: Apache-2.0 */
/* hs_consumer_loopback.c - the producers hs-consumer --loopback N starts
 * next to itself: which hs-producer binary, and starting one. */
#include "hs_consumer_loopback_int.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The hs-producer next to this binary, else the one on PATH. */
void hs__cli_producer_path(char *out, size_t cap)
{
    const char *env = getenv("HS_PRODUCER_BIN");
    if (env) {
        snprintf(out, cap, "%s", env);
        return;
    }
    char self[PATH_MAX - 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            snprintf(out, cap, "%s/hs-producer", self);
            if (access(out, X_OK) == 0) return;
        }
    }
    snprintf(out, cap, "hs-producer");
}

pid_t hs__cli_spawn_producer(const char *bin, uint16_t port, int index, int nargs, char **args)
{
    char to[64], name[64];
    snprintf(to, sizeof(to), "127.0.0.1:%u", port);
    snprintf(name, sizeof(name), "loopback-%d", index);
    char **argv = calloc((size_t)nargs + 6, sizeof(char *));
    if (!argv) return -1;
    int k = 0;
    argv[k++] = (char *)bin;
    argv[k++] = "--to";
    argv[k++] = to;
    argv[k++] = "--name";
    argv[k++] = name;
    for (int i = 0; i < nargs; i++)
        argv[k++] = args[i];
    argv[k] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        execvp(bin, argv);
        fprintf(stderr, "hs-consumer: cannot run %s: %m (set HS_PRODUCER_BIN)\n", bin);
        _exit(127);
    }
    free(argv);
    return pid;
}
