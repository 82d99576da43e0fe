/* SPDX-License-Identifier: Apache-2.0 */
/* hs_consumer_files_int.h - the files of the hs-consumer command
 * (hs_consumer_files.c), apart from its flags and loop in
 * hs_consumer_main.c. Main's thread only. */
#ifndef HS_CONSUMER_FILES_INT_H
#define HS_CONSUMER_FILES_INT_H

#include <stdio.h>
#include <stddef.h>

#include "hsflow.h"

/* Appends one JSON object on one line to f: the summary's figures now, with
 * the wall-clock and monotonic times; flushed. */
void hs__cli_write_stats_line(hs_consumer_t *c, FILE *f);
/* The text of a --resume-state file, read whole (bounded by
 * HS_CONSUMER_STATE_MAX_BYTES); the caller frees it. NULL after printing
 * why. */
char *hs__cli_read_state_file(const char *path);
/* Writes the consumer's position to `path` whole (a temporary file synced
 * and renamed over it). *buf / *cap: a buffer kept between calls, grown as
 * needed; the caller frees *buf. */
HS_MUST_CHECK hs_status_t hs__cli_save_state(hs_consumer_t *c, const char *path, char **buf,
                                             size_t *cap);

#endif /* HS_CONSUMER_FILES_INT_H */
