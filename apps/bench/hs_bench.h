/* SPDX-License-Identifier: Apache-2.0 */
/* hs_bench.h - what the benches' C drivers (apps/bench/) share, so that each
 * keeps only its question (what it runs, what it checks, what it prints):
 * the batch shapes a bench takes, random operands uploaded to the GPU, the
 * timing loops (CUDA events around calls on the default stream, the wall
 * clock around rounds of calls) and the median. Their flags go through
 * hs_cli_parse_table (hs_cli.h).
 *
 * For mains only: the CUDA helpers print what failed, with the program's
 * name. hs_bench.c is plain C; hs_bench_cuda.c (built with CUDA) holds the
 * functions marked CUDA. Nothing here keeps state between calls. */
#ifndef HS_BENCH_H
#define HS_BENCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HS_BENCH_MAX_SHAPES 16 /* entries of a --shapes list */
#define HS_BENCH_MAX_REPS 100  /* rounds of hs_bench_wall_rounds */

/* A batch of n_seqs sequences of seq_len tokens ("NxL"). */
typedef struct {
    int n_seqs, seq_len;
} hs_bench_shape_t;

/* Parses --shapes "NxL[,NxL...]" (N, L >= 1, at most HS_BENCH_MAX_SHAPES)
 * into out[] and *count. Returns 0, or 2 (main's exit status) after printing
 * "PROG: --shapes 'ENTRY': give NxL entries such as 16x4096". */
int hs_bench_shapes_parse(const char *prog, const char *list, hs_bench_shape_t *out, int *count);

/* One call of what a bench times, with its context: 0, or non-zero when it
 * failed (the timing stops there and returns that value). */
typedef int (*hs_bench_call_cb)(void *ctx);

/* The median of v[0..n) (v[n / 2] once sorted; sorts v in place). */
double hs_bench_median(double *v, int n);

/* reps rounds (1..HS_BENCH_MAX_REPS) of calls[0..n) in turn, each timed on
 * the monotonic clock, so that the candidates share the machine's state
 * round by round; median_ms[i] gets calls[i]'s median in ms. Returns 0, or
 * the first failing call's value (median_ms then unset). */
int hs_bench_wall_rounds(const hs_bench_call_cb *calls, int n, void *ctx, int reps,
                         double *median_ms);

/* uniform [-scale, scale) bf16 values from the project's PRNG into h[0..n):
 * bf16((float)(2u - 1) * scale), u a 53-bit draw; *rng moves on by n. */
void hs_bench_random_bf16(uint16_t *h, size_t n, uint64_t *rng, float scale);

/* How a timing loop sums up its calls' times. */
typedef enum {
    HS_BENCH_MEAN, /* one pair of events around all calls, divided by their number */
    HS_BENCH_BEST, /* a pair of events around each call, the shortest */
} hs_bench_stat_t;

/* CUDA: warmup calls, then iters (>= 1) timed calls on the default stream;
 * *ms gets the mean or the best ms of a call. Returns 0; the first failing
 * call's value; or -1 after printing the CUDA error (events, or the device
 * after the calls). */
int hs_bench_cuda_time(hs_bench_call_cb call, void *ctx, int warmup, int iters,
                       hs_bench_stat_t stat, double *ms);

/* CUDA: bytes of device memory dst filled with host block[0..block_bytes)
 * repeated (the last copy cut short). 0, or -1 after printing the error. */
int hs_bench_upload_tiled(void *dst, size_t bytes, const void *block, size_t block_bytes);

/* CUDA, for a bench's setup: err (a cudaError_t) must be 0, else the program
 * exits 1 after printing "PROG: WHAT: the CUDA error". */
void hs_bench_cuda_must(int err, const char *what);
#define HS_BENCH_CUDA(call) hs_bench_cuda_must((int)(call), #call)

#ifdef __cplusplus
}
#endif
#endif /* HS_BENCH_H */
