/* SPDX-License-Identifier: Apache-2.0 */
/* replay_main.c - runs a libFuzzer harness over files, without libFuzzer.
 *
 *   fuzz_X_replay DIR_OR_FILE...
 *
 * Every regular file given, or found in a folder given, is passed once to
 * LLVMFuzzerTestOneInput (after LLVMFuzzerInitialize, when the harness has
 * one). This is how the committed corpus, regression inputs included, runs in
 * every build, whatever the compiler; a crash or sanitizer report fails it.
 * Exit 0 when every input ran, 1 when none was found. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    /* An exact-size copy, so that a read past the input is caught. */
    uint8_t *exact = malloc(len > 0 ? (size_t)len : 1);
    memcpy(exact, buf, (size_t)len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, (size_t)len);
    free(exact);
    return 1;
}

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (n + 1) * sizeof *names);
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp);
    int ran = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) ran += run_file(path);
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int ran = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s does not exist\n", argv[i]);
            return 2;
        }
        ran += S_ISDIR(sb.st_mode) ? run_dir(argv[i]) : run_file(argv[i]);
    }
    printf("replay: %d input(s) ran clean\n", ran);
    return ran > 0 ? 0 : 1;
}
