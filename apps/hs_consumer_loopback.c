/* SPDX-License-Identifier: Apache-2.0 */
/* hs_consumer_loopback.c - the producers hs-consumer --loopback N starts
 * next to itself: which command, and starting one. */
#include "hs_consumer_loopback_int.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool hs__cli_loopback_has_command(int nargs, char **args) { return nargs > 0 && args[0][0] != '-'; }

/* A bare command name found next to this binary (build/bin holds hs-producer
 * and hsflow-produce side by side) into out; false when it is not there. */
static bool beside_self(const char *name, char *out, size_t cap)
{
    char self[PATH_MAX - 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return false;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash) return false;
    *slash = 0;
    int w = snprintf(out, cap, "%s/%s", self, name);
    return w > 0 && (size_t)w < cap && access(out, X_OK) == 0;
}

void hs__cli_producer_path(const char *command, char *out, size_t cap)
{
    if (command) {
        if (strchr(command, '/') || !beside_self(command, out, cap))
            snprintf(out, cap, "%s", command);
        return;
    }
    const char *env = getenv("HS_PRODUCER_BIN");
    if (env) {
        snprintf(out, cap, "%s", env);
        return;
    }
    if (!beside_self("hs-producer", out, cap)) snprintf(out, cap, "hs-producer");
}

pid_t hs__cli_spawn_producer(const char *bin, uint16_t port, int index, int nargs, char **args)
{
    char to[64], name[64];
    snprintf(to, sizeof(to), "127.0.0.1:%u", port);
    snprintf(name, sizeof(name), "loopback-%d", index);
    bool command = hs__cli_loopback_has_command(nargs, args);
    char **argv = calloc((size_t)nargs + 6, sizeof(char *));
    if (!argv) return -1;
    int k = 0;
    argv[k++] = (char *)bin;
    /* hs-producer's options follow its own --to and --name; a command's
     * arguments come as given and --to and --name after them, where an
     * argparse or getopt command takes them as well as anywhere */
    for (int i = command ? 1 : 0; i < nargs; i++)
        argv[k++] = args[i];
    argv[k++] = "--to";
    argv[k++] = to;
    argv[k++] = "--name";
    argv[k++] = name;
    argv[k] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        execvp(bin, argv);
        fprintf(stderr, "hs-consumer: cannot run %s: %m (%s)\n", bin,
                command ? "the first word after -- is the producer command"
                        : "set HS_PRODUCER_BIN");
        _exit(127);
    }
    free(argv);
    return pid;
}
