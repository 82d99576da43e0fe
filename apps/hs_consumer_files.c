/* SPDX-License-Identifier: Apache-2.0 */
/* hs_consumer_files.c - the files of the hs-consumer command: the
 * --stats-jsonl lines, the --resume-state file read and the --save-state
 * file written whole. */
#include "hs_consumer_files_int.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_outfile.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* One JSON object per line: the summary's figures now, plus the time as
 * wall-clock Unix seconds ("time", for plots and for lining up with other
 * logs) and as the monotonic clock the rates are measured on
 * ("monotonic_s", immune to clock steps). */
void hs__cli_write_stats_line(hs_consumer_t *c, FILE *f)
{
    hs_consumer_stats_t s;
    char json[4096];
    struct timespec wall;
    hs_consumer_stats(c, &s);
    hs_consumer_stats_json(&s, json, sizeof(json));
    clock_gettime(CLOCK_REALTIME, &wall);
    fprintf(f, "{\"time\": %.3f, \"monotonic_s\": %.3f, ",
            (double)wall.tv_sec + (double)wall.tv_nsec * 1e-9, hs_now_s());
    for (const char *p = json + 1; *p; p++) /* skip the opening brace, fold lines */
        if (*p != '\n') fputc(*p, f);
    fputc('\n', f);
    fflush(f);
}

/* The text of a --resume-state file, read whole (bounded). NULL after
 * printing why. */
char *hs__cli_read_state_file(const char *path)
{
    /* O_NONBLOCK: a FIFO would otherwise hold open() until a writer comes */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "hs-consumer: --resume-state %s: cannot open it: %m\n", path);
        if (fd >= 0) close(fd);
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        fprintf(stderr,
                "hs-consumer: --resume-state %s: not a regular file; give a file written by "
                "--save-state or Consumer.state_dict()\n",
                path);
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        fprintf(stderr, "hs-consumer: --resume-state %s: cannot open it: %m\n", path);
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0, max = HS_CONSUMER_STATE_MAX_BYTES;
    char *buf = malloc(cap + 1);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap || cap > max) break;
        char *n = realloc(buf, cap * 2 + 1);
        if (!n) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = n;
        cap *= 2;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf) {
        fprintf(stderr, "hs-consumer: --resume-state %s: out of memory\n", path);
        return NULL;
    }
    if (err || len > max) {
        if (err)
            fprintf(stderr, "hs-consumer: --resume-state %s: read failed\n", path);
        else
            fprintf(stderr,
                    "hs-consumer: --resume-state %s: more than %u MiB, which no state is; give "
                    "a file written by --save-state or Consumer.state_dict()\n",
                    path, HS_CONSUMER_STATE_MAX_BYTES >> 20);
        free(buf);
        return NULL;
    }
    buf[len] = 0;
    if (strlen(buf) != len) {
        fprintf(stderr, "hs-consumer: --resume-state %s: has NUL bytes; it is not a state\n", path);
        free(buf);
        return NULL;
    }
    return buf;
}

/* Writes the consumer's position to `path` whole (hs_outfile: a temporary
 * file synced and renamed over it), so a crash leaves the previous state or
 * the new one, never half of one. *buf / *cap: a buffer kept between calls. */
hs_status_t hs__cli_save_state(hs_consumer_t *c, const char *path, char **buf, size_t *cap)
{
    size_t len;
    hs_status_t st;
    while ((st = hs_consumer_state_save(c, *buf, *cap, &len)) == HS_ERR_NOSPACE) {
        char *n = realloc(*buf, len + 1);
        if (!n) return HS_ERR_NOMEM;
        *buf = n;
        *cap = len + 1;
    }
    if (st != HS_OK) return st;
    hs_outfile_t *f;
    st = hs_outfile_open(path, NULL, 0, &f);
    if (st != HS_OK) return st;
    if (fwrite(*buf, 1, len, hs_outfile_stream(f)) != len ||
        fputc('\n', hs_outfile_stream(f)) == EOF) {
        hs_error("--save-state %s: write failed: %m", path);
        hs_outfile_abort(f);
        return HS_ERR_IO;
    }
    return hs_outfile_commit(f);
}
