/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_journal.c - the consumer's resume journal reader
 * (consumer/journal.c): the "hsflow-journal 1 plan=... batches=..."
 * header, "<epoch> <batch>" lines, a last line cut short, then binding the
 * journal to the run it names.
 *
 * The journal is a file the consumer opens by path, so each input is
 * written to a scratch file (in /dev/shm when there is one) and opened from
 * there; a journal that opens is bound to its own plan (up to 65536 batches
 * per epoch; the consumer takes the count from the run's validated plan) for
 * 1 to 4 epochs (the last byte of the input chooses) and its bitmap read. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "journal_int.h"

static char g_path[256];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(g_path, sizeof g_path, "%s/hs-fuzz-journal.%d", dir ? dir : "/tmp", (int)getpid());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) abort();
    if (write(fd, data, size) != (ssize_t)size) abort();
    close(fd);
    hs_journal_t *j = NULL;
    if (hs_journal_open(g_path, &j) == HS_OK) {
        unsigned long long plan = 0;
        unsigned batches = 1;
        char head[128] = "";
        memcpy(head, data, size < sizeof head - 1 ? size : sizeof head - 1);
        if (sscanf(head, "hsflow-journal 1 plan=%16llx batches=%u", &plan, &batches) != 2)
            plan = 0, batches = 1;
        if (batches > 65536) batches = 65536; /* bound the harness's walk over the bitmap */
        uint32_t epochs = 1 + (size ? data[size - 1] % 4 : 0);
        char why[512];
        if (hs_journal_check(j, plan, batches, why, sizeof why) != HS_OK)
            why[0] = 0; /* a refused journal goes on to bind, which must refuse it too */
        if (hs_journal_bind(j, plan, batches, epochs, why, sizeof why) == HS_OK) {
            uint32_t start = hs_journal_start_epoch(j);
            if (start > epochs) abort();
            const uint8_t *done = hs_journal_done(j);
            uint64_t bits = (uint64_t)(epochs - start) * batches, set = 0;
            for (uint64_t b = 0; b < bits; b++)
                set += done[b / 8] >> (b % 8) & 1;
            if (set > hs_journal_count(j)) abort();
            if (hs_journal_append(j, start < epochs ? start : 0, 0) != HS_OK)
                why[0] = 0; /* a full or refused append is an answer, not a crash */
        }
        hs_journal_close(j);
    }
    unlink(g_path);
    return 0;
}
