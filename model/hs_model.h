/* SPDX-License-Identifier: Apache-2.0 */
/* hs_model.h - the built-in target forward: a Llama-family decoder (Llama
 * 2/3 incl. llama3 rope scaling, Qwen2/2.5 with qkv bias, Qwen3 with q/k
 * norm, Mistral) or the Qwen3.5 / Qwen3.6 hybrid (Gated DeltaNet layers and
 * gated full attention; text decoder only, also out of the vision-language
 * wrapper) loaded from a Hugging Face folder (config.json and
 * *.safetensors, single file or sharded), run up to the highest captured
 * layer, with each captured layer's hidden states written into its column
 * slice of a [T, k*H] buffer. No LM head.
 *
 * Layers are named by their index in Hugging Face's output_hidden_states:
 * 0 = embeddings, i = output of decoder layer i-1 (1 <= i < N),
 * N = the final normed output (N = num_hidden_layers).
 *
 * Ownership: hs_model_load() returns a model the caller releases with
 * hs_model_destroy(); it owns its weights (mapped files or converted copies).
 * Forward calls read the caller's inputs and write only the caller's output
 * buffer. A loaded model is immutable: several threads may run forwards on
 * it at once. hs_model_cuda_* objects borrow the model, which must outlive
 * them. */
#ifndef HS_MODEL_H
#define HS_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "hsflow.h"
#include "hs_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_model hs_model_t;
typedef struct hs_model_cuda hs_model_cuda_t;

typedef enum {
    HS_MODEL_LLAMA = 1,   /* LlamaForCausalLM */
    HS_MODEL_QWEN2 = 2,   /* Qwen2ForCausalLM */
    HS_MODEL_QWEN3 = 3,   /* Qwen3ForCausalLM */
    HS_MODEL_MISTRAL = 4, /* MistralForCausalLM */
    HS_MODEL_QWEN3_5 = 5, /* Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration */
} hs_model_arch_t;

/* A Qwen3.5 decoder layer's token mixer (layer_types in config.json). */
typedef enum {
    HS_LAYER_FULL_ATTENTION = 0,   /* "full_attention": gated softmax attention */
    HS_LAYER_LINEAR_ATTENTION = 1, /* "linear_attention": Gated DeltaNet */
} hs_model_layer_type_t;

/* Most decoder layers a hybrid (Qwen3.5) config may have. */
#define HS_MODEL_MAX_HYBRID_LAYERS 256

/* Output element type of the forward. */
typedef enum { HS_MODEL_OUT_F32 = 0, HS_MODEL_OUT_BF16 = 1 } hs_model_dtype_t;

/* The parsed config.json (Hugging Face names in comments). */
typedef struct {
    hs_model_arch_t arch;
    char architecture[64]; /* architectures[0] */
    char torch_dtype[16];  /* torch_dtype (or dtype); "" when absent */
    int hidden_size;       /* H */
    int intermediate_size; /* I */
    int num_layers;        /* num_hidden_layers, N */
    int num_heads;         /* num_attention_heads */
    int num_kv_heads;      /* num_key_value_heads (default num_heads) */
    int head_dim;          /* head_dim (default hidden_size / num_heads) */
    int vocab_size;
    float rms_norm_eps;
    float rope_theta; /* rope_theta (or rope_parameters.rope_theta) */
    int rope_type;    /* hs_rope_type_t: 0 default, 1 linear, 2 llama3 */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_positions;
    int sliding_window; /* Mistral, or Qwen with use_sliding_window; 0 = none */
    int tie_word_embeddings;
    int qkv_bias;   /* q/k/v projections have a bias (Qwen2, attention_bias) */
    int o_bias;     /* o_proj has a bias (attention_bias) */
    int mlp_bias;   /* gate/up/down have a bias (Llama mlp_bias) */
    int qk_norm;    /* per-head RMSNorm on q and k before rope (Qwen3) */
    int rotary_dim; /* dims of each head RoPE rotates: head_dim, or head_dim *
                       partial_rotary_factor (Qwen3.5) */

    /* Qwen3.5 hybrid only (arch HS_MODEL_QWEN3_5); zero for the others */
    int vl_wrapper;         /* Qwen3_5ForConditionalGeneration: the decoder's config is
                               text_config, its weights model.language_model.* */
    int zero_centered_norm; /* RMSNorm weights scale as (1 + w) (layer, final, q/k) */
    int attn_output_gate;   /* q_proj yields a query and a gate per head; attention
                               output * sigmoid(gate) before o_proj */
    int lin_num_k_heads;    /* linear_num_key_heads */
    int lin_num_v_heads;    /* linear_num_value_heads (a multiple of the key heads) */
    int lin_k_head_dim;     /* linear_key_head_dim */
    int lin_v_head_dim;     /* linear_value_head_dim */
    int lin_conv_kernel;    /* linear_conv_kernel_dim */
    uint8_t layer_type[HS_MODEL_MAX_HYBRID_LAYERS]; /* hs_model_layer_type_t per layer
                                                       (layer_types, or every
                                                       full_attention_interval-th full) */

    /* quantization_config: quant_method "fp8", weight_block_size [128, 128],
       dynamic activation scales. Linear weights stored F8_E4M3 carry
       <name>_scale_inv [ceil(N/128), ceil(K/128)]; the others stay as stored. */
    int fp8_checkpoint;
} hs_model_config_t;

/* Whether decoder layer l (0-based) is a Gated DeltaNet layer. */
static inline int hs_model_layer_is_linear(const hs_model_config_t *c, int l)
{
    return c->arch == HS_MODEL_QWEN3_5 && l >= 0 && l < HS_MODEL_MAX_HYBRID_LAYERS &&
           c->layer_type[l] == HS_LAYER_LINEAR_ATTENTION;
}

/* How the loader holds the Linear projections' weights (q/k/v/o,
 * gate/up/down, and the Gated DeltaNet's in_proj_* and out_proj); the
 * embeddings, norms and small tensors stay as the checkpoint has them. */
typedef enum {
    HS_MODEL_WEIGHTS_AUTO = 0, /* as stored: bf16, or FP8 where an FP8 checkpoint has it */
    HS_MODEL_WEIGHTS_BF16 = HS_DTYPE_BF16, /* FP8 weights dequantised to bf16 at load */
    HS_MODEL_WEIGHTS_FP8 = HS_DTYPE_FP8,   /* bf16 weights quantised at load as FP8
                                              checkpoints are (128x128 blocks, scale_inv =
                                              amax / 448), except the tiny in_proj_a /
                                              in_proj_b, which FP8 checkpoints keep */
} hs_model_weights_t;

/* "auto", then the names of hs_dtype.h ("bf16", "fp8") into *out;
 * HS_ERR_INVALID for another name. */
HS_MUST_CHECK hs_status_t hs_model_weights_parse(const char *s, hs_model_weights_t *out);
const char *hs_model_weights_name(hs_model_weights_t w);

/* Loads the model in folder `dir` (config.json plus model.safetensors, or
 * model.safetensors.index.json and its shards). Weights stored as BF16 are
 * used in place from the mapped files; F16/F32 are converted to bf16
 * (Qwen3.5's A_log and dt_bias are read as fp32). Tensors the decoder does
 * not use (a VL wrapper's vision tower, mtp.*, lm_head) are never read.
 * Unknown architecture, missing or malformed field, missing tensor, wrong
 * shape, unsupported dtype or truncated file: an error naming the field or
 * tensor is logged and HS_ERR_FORMAT (or HS_ERR_IO / HS_ERR_UNSUPPORTED)
 * returned. *out is set only on success. */
HS_MUST_CHECK hs_status_t hs_model_load(const char *dir, hs_model_t **out);
/* As hs_model_load (which is HS_MODEL_WEIGHTS_AUTO), holding the Linear
 * weights as `weights` says. An FP8 checkpoint (config.json's
 * quantization_config, see hs_model_config_t) stores a weight as F8_E4M3
 * plus <name>_scale_inv (F32 or BF16, [ceil(N/128), ceil(K/128)], finite,
 * >= 0); a missing or misshapen factor tensor, an F8_E4M3 weight without
 * quantization_config, or an unsupported quantization_config is an error
 * naming the tensor or field. */
HS_MUST_CHECK hs_status_t hs_model_load_ex(const char *dir, hs_model_weights_t weights,
                                           hs_model_t **out);
/* Number of Linear weights the model holds in FP8 (0 for a bf16 model). */
int hs_model_fp8_weights(const hs_model_t *m);

/* Reads and checks dir/config.json alone (no weight is opened), as
 * hs_model_load does first: layer presets are checked against the depth
 * before any weight is read. *out is set only on success. */
HS_MUST_CHECK hs_status_t hs_model_read_config(const char *dir, hs_model_config_t *out);
void hs_model_destroy(hs_model_t *m); /* NULL is fine */

/* Which attention kernel the CUDA forwards created afterwards run:
 * HS_MODEL_ATTN_AUTO (the default) cuDNN's fused SDPA where the device,
 * build and shape allow it, else the mma.sync kernel; HS_MODEL_ATTN_MMA
 * the mma.sync kernel always (hs-forward and hs-producer: HS_ATTN_BACKEND=mma;
 * kernels/attention.h). */
typedef enum { HS_MODEL_ATTN_AUTO = 0, HS_MODEL_ATTN_MMA = 1 } hs_model_attn_t;
void hs_model_set_attn(hs_model_t *m, hs_model_attn_t attn);
/* "mma" is HS_MODEL_ATTN_MMA; anything else, NULL included, AUTO. */
hs_model_attn_t hs_model_attn_parse(const char *name);

const hs_model_config_t *hs_model_config(const hs_model_t *m);
int hs_model_hidden_size(const hs_model_t *m);
int hs_model_num_layers(const hs_model_t *m); /* N: valid layer indices are 0..N */
int hs_model_vocab_size(const hs_model_t *m);

/* Checks a list of captured layers against a model of n_target_layers
 * decoder layers: at least one entry, each in 0..n_target_layers.
 * Logs what is wrong. */
HS_MUST_CHECK hs_status_t hs_model_check_layers(int n_target_layers, const int32_t *layers,
                                                int n_layers);

/* The longest of the n_seqs sequences of a host cu_seqlens [n_seqs + 1]. */
int hs_model_longest_seq(const int32_t *cu_seqlens, int n_seqs);

/* DFlash's default captured layers for a drafter of n_draft_layers layers on
 * a target of n_target_layers layers, as output_hidden_states indices (here
 * 1..N; DFlash's own target_layer_ids are these minus one):
 *   n_draft == 1: { N/2 + 1 }
 *   else:         { round(1 + i * (N - 4) / (n_draft - 1)) + 1 }, i = 0..n_draft-1
 * (round half to even, as Python's round()). Writes n_draft_layers entries
 * to out[cap]. E.g. N = 32, 5 draft layers: 2, 9, 16, 23, 30. More than one
 * draft layer needs N >= n_draft + 3 (else layers repeat): a shallower
 * target is HS_ERR_INVALID, logged naming its depth. */
HS_MUST_CHECK hs_status_t hs_model_dflash_layers(int n_target_layers, int n_draft_layers,
                                                 int32_t *out, int cap);

/* EAGLE-3's default captured layers, as speculators and vLLM define them
 * (target layer ids 2, N/2, N-3, whose states vLLM takes before decoder
 * layer id runs, i.e. output_hidden_states[id]), plus the final normed
 * state N that speculators' extraction appends: { 2, N/2, N-3, N } as
 * output_hidden_states indices, the same numbers. Writes 4 entries to
 * out[cap]. Needs N >= 7 (else the set repeats or is out of order): a
 * shallower target is HS_ERR_INVALID, logged naming its depth. E.g. N = 32:
 * 2, 16, 29, 32. */
HS_MUST_CHECK hs_status_t hs_model_eagle3_layers(int n_target_layers, int32_t *out, int cap);
#define HS_MODEL_EAGLE3_N_LAYERS 4

/* CPU reference forward (fp32 activations, bf16 weights, fp32 accumulation).
 *   input_ids:  T = cu_seqlens[n_seqs] token ids, each in [0, vocab_size)
 *   cu_seqlens: n_seqs + 1 entries, cu_seqlens[0] = 0, non-decreasing;
 *               each sequence is causal on its own, positions restart at 0
 *   layers:     n_layers output_hidden_states indices in 0..N (any order)
 *   out:        [T, row_stride_elems] of out_dtype (hs_model_dtype_t); layer
 *               layers[j] goes to columns [j*H, (j+1)*H) of every row.
 *               row_stride_elems >= n_layers * H. Other columns untouched.
 * Only decoder layers up to the highest captured index run. Its fp32 work
 * buffers belong to the model: allocated by the first call and kept for the
 * next one, reallocated only
 * for a call with more tokens than any before. Threads may call it at once
 * on one model (each takes a set of buffers of its own).
 * Bad input: HS_ERR_INVALID with a message; nothing written to out. */
HS_MUST_CHECK hs_status_t hs_model_forward_cpu(hs_model_t *m, const int32_t *input_ids,
                                               const int32_t *cu_seqlens, int n_seqs,
                                               const int32_t *layers, int n_layers, void *out,
                                               int out_dtype, size_t row_stride_elems);

/* FLOPs of one forward over cu_seqlens (host, n_seqs + 1 entries) running
 * n_run decoder layers: per layer 2 * (linear parameters of a layer) * T plus
 * 4 * Hq * d per causal (query, key) pair of each sequence (QK^T and PV):
 * L (L + 1) / 2 pairs for a sequence of length L, fewer under a sliding
 * window. A Gated DeltaNet layer counts its projections, the conv
 * (2 * K * channels per token) and the delta rule (6 * dk * dv per token
 * and value head: the state read, its rank-1 update and the output read).
 * Embedding lookups, gates and norms are not counted. Plain arithmetic:
 * available in every build. */
double hs_model_forward_flops(const hs_model_config_t *cfg, int n_run, const int32_t *cu_seqlens,
                              int n_seqs);

/* ---- CUDA forward (model/forward_cuda.c; without CUDA every call returns
 * HS_ERR_UNSUPPORTED) ---------------------------------------------------- */

/* Dense bf16 tensor-core peak of an H100/H200 SXM, TFLOP/s: the default MFU
 * denominator. */
#define HS_MODEL_CUDA_PEAK_TFLOPS 989.4

/* Uploads the weights to `device` and plans every device buffer for batches
 * of up to token_budget tokens and max_seqs sequences; nothing is allocated
 * per batch afterwards. The model must outlive the returned object. */
HS_MUST_CHECK hs_status_t hs_model_cuda_create(hs_model_t *m, int device, uint32_t token_budget,
                                               uint32_t max_seqs, hs_model_cuda_t **out);
/* As hs_model_cuda_create, but uploads only the decoder layers a capture up
 * to output_hidden_states index max_layer runs (min(max_layer, N) of them;
 * max_layer < 0 = all N). Forwards that ask for a layer above max_layer are
 * refused with HS_ERR_INVALID. */
HS_MUST_CHECK hs_status_t hs_model_cuda_create_ex(hs_model_t *m, int device, uint32_t token_budget,
                                                  uint32_t max_seqs, int max_layer,
                                                  hs_model_cuda_t **out);
/* Device bytes hs_model_cuda_create_ex would allocate for these arguments
 * (weights, activations, cuBLASLt workspace; the same number
 * hs_model_cuda_peak_bytes reports once created), computed on the host
 * without touching a GPU. */
HS_MUST_CHECK hs_status_t hs_model_cuda_plan_bytes(const hs_model_t *m, uint32_t token_budget,
                                                   uint32_t max_seqs, int max_layer, uint64_t *out);
/* The same plan in its parts: the weights of the layers run (FP8 Linears at
 * one byte per value plus their block factors), the activations for
 * token_budget tokens and the cuBLASLt workspace. Not in it: cuDNN's
 * attention workspace and the caller's input and output buffers. */
typedef struct {
    uint64_t weights, activations, workspace;
} hs_model_cuda_plan_t;
HS_MUST_CHECK hs_status_t hs_model_cuda_plan(const hs_model_t *m, uint32_t token_budget,
                                             uint32_t max_seqs, int max_layer,
                                             hs_model_cuda_plan_t *out);
/* Runs one packed batch on `stream` (a cudaStream_t; NULL = default stream).
 * d_input_ids [T], d_cu_seqlens [n_seqs + 1] and d_out_bf16 [T,
 * row_stride_elems] are device pointers; semantics as hs_model_forward_cpu
 * with bf16 output. `longest`: the batch's longest sequence, from the
 * caller's host copy of cu_seqlens (hs_model_longest_seq); with it the
 * forward never waits for the device. 0 = unknown: read back once (one
 * stream synchronisation). Asynchronous otherwise: results are ready when
 * the stream is. */
HS_MUST_CHECK hs_status_t hs_model_cuda_forward(hs_model_cuda_t *mc, const int32_t *d_input_ids,
                                                const int32_t *d_cu_seqlens, int n_seqs, int T,
                                                int longest, const int32_t *layers, int n_layers,
                                                void *d_out_bf16, size_t row_stride_elems,
                                                void *stream);
void hs_model_cuda_destroy(hs_model_cuda_t *mc); /* NULL is fine */
/* Peak device memory the object uses (weights + planned buffers), bytes. */
HS_MUST_CHECK hs_status_t hs_model_cuda_peak_bytes(const hs_model_cuda_t *mc, uint64_t *out);

/* Number of CUDA devices this process sees; 0 (and HS_OK) when there is no
 * GPU or no driver. */
HS_MUST_CHECK hs_status_t hs_model_cuda_device_count(int *out);
/* The device's name (into name[name_cap], may be NULL), total and currently
 * free memory in bytes. */
HS_MUST_CHECK hs_status_t hs_model_cuda_device_info(int device, char *name, size_t name_cap,
                                                    uint64_t *total_bytes, uint64_t *free_bytes);

/* What one preflight batch measured. */
typedef struct {
    int n_seqs, seq_len;        /* the shape run */
    uint64_t peak_bytes;        /* planned device memory + this batch's ids, cu_seqlens, output */
    uint64_t device_used_bytes; /* total - free device memory after the run (whole process) */
    double ms;                  /* forward time of the timed run (median) */
    double us_per_token, tokens_per_s;
    double tflop; /* hs_model_forward_flops of the layers run, in TFLOP */
    double mfu;   /* achieved FLOP/s over peak_tflops */
    /* Over all timed runs, from the GPU's energy counter (kernels/gpu_energy.h);
     * metered is false, and the rest 0, where NVML does not give it or the
     * runs took under HS_GPU_ENERGY_MIN_BUSY_S in all. A GPU
     * that holds its power limit (capped share near 1) runs as fast as its
     * joules per token allow. */
    bool metered;
    double joules_per_token, watts, limit_watts;
    double power_capped_share; /* of the timed runs' wall time, 0..1 */
} hs_model_cuda_preflight_t;

/* Bytes a preflight batch of T tokens in n_seqs sequences capturing
 * n_layers layers of width H adds to the plan: its input ids, cu_seqlens and
 * [T, n_layers * H] bf16 output. */
static inline uint64_t hs_model_cuda_batch_bytes(uint64_t T, uint64_t n_seqs, uint64_t n_layers,
                                                 uint64_t H)
{
    return T * n_layers * H * 2u + T * 4u + (n_seqs + 1u) * 4u;
}

/* Runs one batch of n_seqs sequences of seq_len random tokens through the
 * forward (one untimed warm-up run, then `iters` timed runs; the median is
 * reported), capturing `layers` (output_hidden_states indices) into a
 * [T, n_layers * H] buffer it allocates and frees. T = n_seqs * seq_len must
 * fit the token budget and n_seqs the max_seqs given at create.
 * peak_tflops <= 0 means HS_MODEL_CUDA_PEAK_TFLOPS. *out is set on success. */
HS_MUST_CHECK hs_status_t hs_model_cuda_preflight(hs_model_cuda_t *mc, int n_seqs, int seq_len,
                                                  const int32_t *layers, int n_layers, int iters,
                                                  double peak_tflops,
                                                  hs_model_cuda_preflight_t *out);

#ifdef __cplusplus
}
#endif
#endif /* HS_MODEL_H */
