/* SPDX-License-Identifier: Apache-2.0 */
/* attention_cudnn.cpp - varlen causal attention on cuDNN's fused SDPA
 * (flash attention on Hopper's wgmma/TMA units), through the cuDNN frontend's
 * graph API. The only C++ of the project: the frontend is header-only C++,
 * kept to this file behind attention_int.h's C interface.
 *
 * Math as attention.h: out[i, h] = softmax_j(scale q[i, h] . k[j, g]) v[j, g]
 * over keys j <= i of the same sequence (i - j < window when window > 0),
 * g = h / (Hq / Hkv). Precision: bf16 in and out, fp32 scores, softmax and
 * accumulation (cuDNN's intermediate and compute types).
 *
 * Layout: one graph per bucket (S, B) of tensors [B, H, S, d] whose rows are
 * the packed token rows of the forward (stride of a token: the row stride;
 * of a head: d); each sequence's first row is found from a ragged offset
 * (elements from the base pointer) and its length from seq_len, so nothing
 * is padded or copied. Sequence b >= n_seqs of a batch has length 0.
 * cuDNN is loaded with dlopen (the frontend's dynamic loading): a binary
 * built here runs, on today's kernel, where libcudnn is absent. */
#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>

#include "attention_int.h"
#include "cublaslt.h"
#include "hs_log.h"

namespace fe = cudnn_frontend;

/* The frontend's dynamic loading looks its symbols up in this handle. */
void *cudnn_frontend::cudnn_dlhandle = nullptr;

namespace
{

enum : int64_t {
    UID_Q = 1,
    UID_K,
    UID_V,
    UID_O,
    UID_SEQ_Q,
    UID_SEQ_KV,
    UID_RAG_Q,
    UID_RAG_K,
    UID_RAG_V,
    UID_RAG_O
};

struct bucket_t {
    std::shared_ptr<fe::graph::Graph> graph;
    std::unordered_map<int64_t, void *> pack; /* filled at create: run only overwrites values */
};

/* Builds the graph and plan of one bucket; false (logged at debug) when
 * cuDNN refuses it. */
bool build_bucket(cudnnHandle_t handle, const hs__attn_dnn_shape_t *sh, int64_t S, int64_t B,
                  bucket_t *b, int64_t *workspace)
{
    const int64_t hq = sh->n_heads, hk = sh->n_kv_heads, d = sh->head_dim;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto offsets = [&](const char *name, int64_t uid) {
        return g->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim({B + 1, 1, 1, 1})
                             .set_stride({1, 1, 1, 1})
                             .set_data_type(fe::DataType_t::INT32));
    };
    auto rows = [&](const char *name, int64_t uid, int64_t h, int64_t stride,
                    std::shared_ptr<fe::graph::Tensor_attributes> rag) {
        return g->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim({B, h, S, d})
                             .set_stride({S * stride, d, stride, 1})
                             .set_ragged_offset(rag));
    };
    auto lens = [&](const char *name, int64_t uid) {
        return g->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim({B, 1, 1, 1})
                             .set_stride({1, 1, 1, 1})
                             .set_data_type(fe::DataType_t::INT32));
    };
    auto rq = offsets("ragged_q", UID_RAG_Q), rk = offsets("ragged_k", UID_RAG_K),
         rv = offsets("ragged_v", UID_RAG_V), ro = offsets("ragged_o", UID_RAG_O);
    auto q = rows("q", UID_Q, hq, sh->q_stride, rq);
    auto k = rows("k", UID_K, hk, sh->kv_stride, rk);
    auto v = rows("v", UID_V, hk, sh->kv_stride, rv);
    auto sq = lens("seq_q", UID_SEQ_Q), skv = lens("seq_kv", UID_SEQ_KV);
    auto opt = fe::graph::SDPA_attributes()
                   .set_name("sdpa")
                   .set_generate_stats(false)
                   .set_attn_scale(sh->scale)
                   .set_causal_mask(true)
                   .set_padding_mask(true)
                   .set_seq_len_q(sq)
                   .set_seq_len_kv(skv);
    if (sh->window > 0) opt.set_sliding_window_length(sh->window);
    auto [o, stats] = g->sdpa(q, k, v, opt);
    (void)stats;
    o->set_output(true)
        .set_uid(UID_O)
        .set_dim({B, hq, S, d})
        .set_stride({S * sh->out_stride, d, sh->out_stride, 1})
        .set_ragged_offset(ro);

    fe::error_t e = g->validate();
    if (e.is_good()) e = g->build_operation_graph(handle);
    if (e.is_good()) e = g->create_execution_plans({fe::HeurMode_t::A});
    if (e.is_good()) e = g->check_support(handle);
    if (e.is_good()) e = g->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
    int64_t ws = 0;
    if (e.is_good()) e = g->get_workspace_size(ws);
    if (e.is_bad()) {
        hs_debug("attention: cudnn refuses bucket %lld x %lld (d %lld, %lld/%lld heads): %s",
                 (long long)B, (long long)S, (long long)d, (long long)hq, (long long)hk,
                 e.get_message().c_str());
        return false;
    }
    b->graph = std::move(g);
    for (int64_t uid = UID_Q; uid <= UID_RAG_O; uid++)
        b->pack[uid] = nullptr;
    if (ws > *workspace) *workspace = ws;
    return true;
}

} // namespace

struct hs__attn_dnn {
    cudnnHandle_t handle = nullptr;
    std::vector<bucket_t> buckets;
    void *workspace = nullptr;
    long version = 0;
};

extern "C" hs_status_t hs__attn_dnn_create(const hs__attn_dnn_shape_t *shape, const int *S,
                                           const int *B, int n, int *ok, hs__attn_dnn_t **out)
{
    *out = nullptr;
    /* loaded once per process (forwards of several GPUs may be created from
     * several threads) and kept: the frontend's symbols point into it */
    static std::once_flag loaded;
    std::call_once(loaded, [] {
        fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
        if (!fe::cudnn_dlhandle)
            hs_info("attention: cudnn not loaded (%s); using the built-in kernel", dlerror());
    });
    if (!fe::cudnn_dlhandle) return HS_ERR_UNSUPPORTED;
    hs__attn_dnn_t *dnn = new (std::nothrow) hs__attn_dnn_t;
    if (!dnn) return HS_ERR_NOMEM;
    int built = 0;
    try {
        dnn->version = (long)fe::detail::get_backend_version();
        if (dnn->version < 90000) {
            hs_info("attention: cudnn %ld is older than 9.0; using the built-in kernel",
                    dnn->version);
            delete dnn;
            return HS_ERR_UNSUPPORTED;
        }
        if (fe::detail::create_handle(&dnn->handle) != CUDNN_STATUS_SUCCESS) {
            hs_info("attention: cudnnCreate failed; using the built-in kernel");
            dnn->handle = nullptr;
            hs__attn_dnn_destroy(dnn);
            return HS_ERR_UNSUPPORTED;
        }
        int64_t ws = 0;
        dnn->buckets.resize((size_t)n);
        for (int i = 0; i < n; i++) {
            ok[i] = build_bucket(dnn->handle, shape, S[i], B[i], &dnn->buckets[(size_t)i], &ws);
            built += ok[i];
        }
        if (built && ws > 0) {
            hs_status_t st = HS_CUDA_CHECK(cudaMalloc(&dnn->workspace, (size_t)ws));
            if (st) {
                hs__attn_dnn_destroy(dnn);
                return st;
            }
        }
    } catch (const std::exception &ex) {
        hs_info("attention: cudnn failed (%s); using the built-in kernel", ex.what());
        hs__attn_dnn_destroy(dnn);
        return HS_ERR_UNSUPPORTED;
    }
    if (!built) {
        hs__attn_dnn_destroy(dnn);
        return HS_ERR_UNSUPPORTED;
    }
    *out = dnn;
    return HS_OK;
}

extern "C" void hs__attn_dnn_destroy(hs__attn_dnn_t *dnn)
{
    if (!dnn) return;
    dnn->buckets.clear();
    cudaFree(dnn->workspace);
    if (dnn->handle) fe::detail::destroy_handle(dnn->handle);
    delete dnn;
}

extern "C" long hs__attn_dnn_version(const hs__attn_dnn_t *dnn) { return dnn ? dnn->version : 0; }

extern "C" hs_status_t hs__attn_dnn_run(hs__attn_dnn_t *dnn, int i, const void *q, const void *k,
                                        const void *v, void *out, const int32_t *seq_len,
                                        const int32_t *ragged_q, const int32_t *ragged_kv,
                                        const int32_t *ragged_out, void *stream)
{
    bucket_t &b = dnn->buckets[(size_t)i];
    b.pack[UID_Q] = const_cast<void *>(q);
    b.pack[UID_K] = const_cast<void *>(k);
    b.pack[UID_V] = const_cast<void *>(v);
    b.pack[UID_O] = out;
    b.pack[UID_SEQ_Q] = const_cast<int32_t *>(seq_len);
    b.pack[UID_SEQ_KV] = const_cast<int32_t *>(seq_len);
    b.pack[UID_RAG_Q] = const_cast<int32_t *>(ragged_q);
    b.pack[UID_RAG_K] = const_cast<int32_t *>(ragged_kv);
    b.pack[UID_RAG_V] = const_cast<int32_t *>(ragged_kv);
    b.pack[UID_RAG_O] = const_cast<int32_t *>(ragged_out);
    if (fe::detail::set_stream(dnn->handle, (cudaStream_t)stream) != CUDNN_STATUS_SUCCESS) {
        hs_error("attention: cudnnSetStream failed");
        return HS_ERR_CUDA;
    }
    fe::error_t e = b.graph->execute(dnn->handle, b.pack, dnn->workspace);
    if (e.is_bad()) {
        hs_error("attention: cudnn sdpa failed: %s", e.get_message().c_str());
        return HS_ERR_CUDA;
    }
    return HS_OK;
}
