/* SPDX-License-Identifier: Apache-2.0 */
/* hs_outfile.h - output files written whole or not at all. */
#ifndef HS_OUTFILE_H
#define HS_OUTFILE_H

#include <stdio.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A file written whole or not at all, never onto one of the program's inputs.
 * hs_outfile_open() creates a temporary file next to PATH (PATH.tmp.<pid>.<n>,
 * mode 0666 minus the umask, or the mode of the file it replaces);
 * hs_outfile_commit() flushes, fsyncs and renames it over PATH; a failed write
 * or a crash leaves PATH untouched. hs-forward, hs-data and the summaries use
 * it.
 *
 * hs_outfile_check(): HS_ERR_INVALID, logged naming both paths, when PATH is
 * the same file as one of inputs[0..n_inputs) (same device and inode, so a
 * symlink or hard link to an input counts), or lies directly inside an input
 * that is a folder, or is a folder itself. NULL or missing inputs are
 * skipped; a PATH that does not exist yet is fine. Call it before the work
 * that leads to the output, so a mistake costs nothing.
 *
 * Ownership: hs_outfile_open() sets *out only on success; the stream belongs
 * to the outfile (do not fclose it). commit and abort both free the outfile;
 * abort removes the temporary file and accepts NULL. */
typedef struct hs_outfile hs_outfile_t;
HS_MUST_CHECK hs_status_t hs_outfile_check(const char *path, const char *const *inputs,
                                           int n_inputs);
HS_MUST_CHECK hs_status_t hs_outfile_open(const char *path, const char *const *inputs, int n_inputs,
                                          hs_outfile_t **out);
FILE *hs_outfile_stream(hs_outfile_t *f);
HS_MUST_CHECK hs_status_t hs_outfile_commit(hs_outfile_t *f);
void hs_outfile_abort(hs_outfile_t *f);

#ifdef __cplusplus
}
#endif

#endif /* HS_OUTFILE_H */
