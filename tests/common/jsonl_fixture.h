/* SPDX-License-Identifier: Apache-2.0 */
/* jsonl_fixture.h - the folder and token dataset the tests that run a
 * producer against a consumer start from, and the producer process itself.
 * Check assertions: for tests only. */
#ifndef HS_TEST_JSONL_FIXTURE_H
#define HS_TEST_JSONL_FIXTURE_H

#include <check.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stddef.h>

#include "hs_time.h"
#include "hs_shuffle.h"

/* A new folder $TMPDIR/TAG.XXXXXX (TMPDIR defaults to /tmp) into dir. */
static inline void hs_test_tmpdir(char *dir, size_t cap, const char *tag)
{
    snprintf(dir, cap, "%s/%s.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", tag);
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

/* n JSONL sequences of 5 .. 5 + spread - 1 token ids below 32000, drawn
 * from `seed`: the same file for the same arguments. */
static inline void hs_test_write_jsonl(const char *path, uint32_t n, uint32_t spread, uint64_t seed)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    uint64_t rng = seed;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = 5 + (uint32_t)(hs_splitmix64(&rng) % spread);
        fputs("{\"input_ids\": [", f);
        for (uint32_t t = 0; t < len; t++)
            fprintf(f, t ? ",%u" : "%u", (unsigned)(hs_splitmix64(&rng) % 32000));
        fputs("]}\n", f);
    }
    ck_assert_int_eq(fclose(f), 0);
}

/* Runs `cmd` through /bin/sh (exec it there to make the pid the command's). */
static inline pid_t hs_test_spawn_sh(const char *cmd)
{
    extern char **environ;
    char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ), 0);
    return pid;
}

/* Waits up to `secs` for process `pid`; its exit status, or -1 (killed
 * when it had not ended by then, or ended by a signal). */
static inline int hs_test_reap(pid_t pid, double secs)
{
    double t_end = hs_now_s() + secs;
    int status;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (hs_now_s() > t_end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(10000);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif /* HS_TEST_JSONL_FIXTURE_H */
