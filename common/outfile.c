/* SPDX-License-Identifier: Apache-2.0 */
/* outfile.c - output files written whole or not at all, never onto an input.
 *
 * The bytes go to PATH.tmp.<pid>.<n> in PATH's folder (so the final rename
 * stays on one file system and is atomic); commit flushes, fsyncs and renames
 * it over PATH. A crash or a failed write leaves PATH as it was (at worst a
 * stray temporary file next to it). Before anything is created, PATH is
 * compared with the inputs by device and inode, so a symlink or hard link to
 * an input is caught as well as the same name. */
#include "hsflow.h"
#include "hs_log.h"
#include "hs_outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct hs_outfile {
    FILE *fp;
    char *path;
    char *tmp;
};

/* The folder holding `path` ("." for a bare name), in a new string. */
static char *parent_dir(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return NULL;
    char *d = strdup(dirname(copy));
    free(copy);
    return d;
}

hs_status_t hs_outfile_check(const char *path, const char *const *inputs, int n_inputs)
{
    if (!path || !*path) {
        hs_error("no output file name given");
        return HS_ERR_INVALID;
    }
    struct stat out, dir;
    bool exists = stat(path, &out) == 0;
    if (exists && S_ISDIR(out.st_mode)) {
        hs_error("%s: the output is a folder; give a file name", path);
        return HS_ERR_INVALID;
    }
    char *pd = parent_dir(path);
    if (!pd) return HS_ERR_NOMEM;
    bool have_dir = stat(pd, &dir) == 0;
    free(pd);
    for (int i = 0; i < n_inputs; i++) {
        struct stat in;
        if (!inputs[i] || stat(inputs[i], &in) != 0) continue;
        if (S_ISDIR(in.st_mode)) {
            if (have_dir && dir.st_dev == in.st_dev && dir.st_ino == in.st_ino) {
                hs_error("%s: the output would go inside the input folder %s and could replace "
                         "or join its files; write it somewhere else",
                         path, inputs[i]);
                return HS_ERR_INVALID;
            }
        } else if (exists && out.st_dev == in.st_dev && out.st_ino == in.st_ino) {
            hs_error("%s: the output is the input %s%s; writing it would destroy the input: give "
                     "another output name",
                     path, inputs[i],
                     strcmp(path, inputs[i]) ? " (the same file by another name or link)" : "");
            return HS_ERR_INVALID;
        }
    }
    return HS_OK;
}

hs_status_t hs_outfile_open(const char *path, const char *const *inputs, int n_inputs,
                            hs_outfile_t **out)
{
    hs_status_t st = hs_outfile_check(path, inputs, n_inputs);
    if (st != HS_OK) return st;
    hs_outfile_t *f = calloc(1, sizeof(*f));
    size_t cap = strlen(path) + 48;
    if (!f || !(f->path = strdup(path)) || !(f->tmp = malloc(cap))) {
        st = HS_ERR_NOMEM;
        goto err;
    }
    static _Atomic unsigned counter;
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(f->tmp, cap, "%s.tmp.%d.%u", path, (int)getpid(), counter++);
        fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666); /* umask applies */
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        hs_error("%s: cannot create the temporary file %s: %m; check that the folder exists and "
                 "is writable",
                 path, f->tmp);
        st = HS_ERR_IO;
        goto err;
    }
    struct stat old;
    if (stat(path, &old) == 0)
        (void)fchmod(fd, old.st_mode & 07777); /* keep a replaced file's mode */
    if (!(f->fp = fdopen(fd, "wb"))) {
        hs_error("%s: fdopen failed: %m", f->tmp);
        close(fd);
        unlink(f->tmp);
        st = HS_ERR_IO;
        goto err;
    }
    *out = f;
    return HS_OK;
err:
    if (f) {
        free(f->path);
        free(f->tmp);
        free(f);
    }
    return st;
}

FILE *hs_outfile_stream(hs_outfile_t *f) { return f->fp; }

static void outfile_free(hs_outfile_t *f)
{
    free(f->path);
    free(f->tmp);
    free(f);
}

hs_status_t hs_outfile_commit(hs_outfile_t *f)
{
    if (!f) return HS_ERR_INVALID;
    int err = ferror(f->fp) ? (errno ? errno : EIO) : 0;
    if (fflush(f->fp) != 0 && !err) err = errno;
    if (fsync(fileno(f->fp)) != 0 && !err) err = errno;
    if (fclose(f->fp) != 0 && !err) err = errno;
    f->fp = NULL;
    if (err) {
        hs_error("%s: writing %s failed: %s; check free disk space (%s is unchanged)", f->path,
                 f->tmp, strerror(err), f->path);
        unlink(f->tmp);
        outfile_free(f);
        return HS_ERR_IO;
    }
    if (rename(f->tmp, f->path) != 0) {
        hs_error("%s: cannot rename %s over it: %m", f->path, f->tmp);
        unlink(f->tmp);
        outfile_free(f);
        return HS_ERR_IO;
    }
    /* The rename itself survives a power cut once the folder is synced too. */
    char *pd = parent_dir(f->path);
    int dfd = pd ? open(pd, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    free(pd);
    outfile_free(f);
    return HS_OK;
}

void hs_outfile_abort(hs_outfile_t *f)
{
    if (!f) return;
    if (f->fp) fclose(f->fp);
    unlink(f->tmp);
    outfile_free(f);
}
