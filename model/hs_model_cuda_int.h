/* hs_model_cuda_int.h - extra entry points of the CUDA forward
 * (model/forward_cuda.c) beyond those hs_model.h declares: the preflight
 * run that measures one batch shape. Built only with CUDA. */
#ifndef HS_MODEL_CUDA_INT_H
#define HS_MODEL_CUDA_INT_H

#include "hs_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Dense bf16 tensor-core peak of an H100/H200 SXM, TFLOP/s: the default MFU
 * denominator. */
#define HS_MODEL_CUDA_PEAK_TFLOPS 989.4

/* What one preflight batch measured. */
typedef struct {
    int n_seqs, seq_len;        /* the shape run */
    uint64_t peak_bytes;        /* planned device memory + this batch's ids, cu_seqlens, output */
    uint64_t device_used_bytes; /* total - free device memory after the run (whole process) */
    double ms;                  /* forward time of the timed run */
    double us_per_token, tokens_per_s;
    double tflop; /* 2 * params * T + causal attention FLOPs of the layers run */
    double mfu;   /* achieved FLOP/s over peak_tflops */
} hs_model_cuda_preflight_t;

/* Runs one batch of n_seqs sequences of seq_len random tokens through the
 * forward (one untimed warm-up run, then `iters` timed runs; the median is
 * reported), capturing `layers` (output_hidden_states indices) into a
 * [T, n_layers * H] buffer it allocates and frees. T = n_seqs * seq_len must
 * fit the token budget and n_seqs the max_seqs given at create.
 * peak_tflops <= 0 means HS_MODEL_CUDA_PEAK_TFLOPS. */
hs_status_t hs_model_cuda_preflight(hs_model_cuda_t *mc, int n_seqs, int seq_len,
                                    const int32_t *layers, int n_layers, int iters,
                                    double peak_tflops, hs_model_cuda_preflight_t *out);

/* FLOPs of one forward over cu_seqlens (host) running n_run decoder layers:
 * 2 * (linear parameters of those layers) * T + 2 * Hq * d * L * (L + 1)
 * per sequence of length L and layer (causal QK^T and PV). */
double hs_model_forward_flops(const hs_model_config_t *cfg, int n_run, const int32_t *cu_seqlens,
                              int n_seqs);

#ifdef __cplusplus
}
#endif
#endif /* HS_MODEL_CUDA_INT_H */
