/* SPDX-License-Identifier: Apache-2.0 */
/* producer.c - the producer engine (DESIGN §2, §5): its configuration,
 * opening (dataset, plan, model, staging, transport, the first connection
 * of every link), hs_producer_run (the workers plus the network loop on the
 * calling thread) and the library API, where the caller is the one worker
 * and the network loop has a thread of its own.
 *
 * The parts: worker.c (the workers), session.c (the links and their
 * handshake), net.c (the network loop), report.c (STATS, status, summary);
 * producer_int.h says which thread owns which state. */
#include "producer_int.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_checksum.h"
#include "hs_parse.h"
#include "hs_version.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net_int.h"
#include "report_int.h"
#include "session_int.h"
#include "worker_int.h"
#include "preflight_int.h" /* the default headroom */

static hs_status_t load_inputs(producer_t *pr)
{
    const hs_producer_config_t *cfg = pr->cfg;
    hs_status_t st = hs_dataset_open(cfg->data_path, &pr->ds);
    if (st != HS_OK) return st;
    hs_plan_config_t pc = {.token_budget = cfg->token_budget,
                           .max_seq_len = cfg->max_seq_len,
                           .overflow = (hs_overflow_t)cfg->overflow,
                           .seed = cfg->seed,
                           .progress_interval_s = cfg->status_interval_s};
    st = hs_plan_build(pr->ds, &pc, &pr->plan);
    if (st != HS_OK) return st;
    hs_plan_stats_t ps;
    hs_plan_stats(pr->plan, &ps);
    uint32_t n = hs_plan_n_batches(pr->plan);
    if (n > HS_PLAN_MAX_BATCHES) {
        hs_error("the plan of %s has %u batches per epoch, more than the %u a run may have: "
                 "raise --token-budget or split the data",
                 cfg->data_path, n, HS_PLAN_MAX_BATCHES);
        return HS_ERR_INVALID;
    }
    for (uint32_t b = 0; b < n; b++) {
        hs_plan_batch_t pb;
        if ((st = hs_plan_batch(pr->plan, b, &pb)) != HS_OK) return st;
        uint64_t bytes = hs_batch_bytes(pb.n_seqs, pb.n_tokens, &cfg->layout);
        if (bytes > pr->max_batch_bytes) pr->max_batch_bytes = bytes;
        if (pb.n_seqs > pr->max_batch_seqs) pr->max_batch_seqs = pb.n_seqs;
    }
    hs_info("plan %016llx: %llu sequences (%llu truncated, %llu dropped), %llu tokens in %u "
            "batches (%.1f%% full), largest batch %.1f MiB",
            (unsigned long long)hs_plan_hash(pr->plan), (unsigned long long)ps.n_kept,
            (unsigned long long)ps.n_truncated, (unsigned long long)ps.n_dropped,
            (unsigned long long)ps.tokens, n, ps.mean_fill_pct,
            (double)pr->max_batch_bytes / (1 << 20));
    hs_plan_warn_lost(pr->plan, cfg->data_path);
    if (cfg->source == HS_SOURCE_MODEL) {
        uint32_t h = (uint32_t)hs_model_hidden_size(pr->model);
        if (h != cfg->layout.hidden_size) {
            hs_error("--hidden-size %u but the model at %s has hidden size %u: drop "
                     "--hidden-size or give %u",
                     cfg->layout.hidden_size, cfg->model_dir, h, h);
            return HS_ERR_INVALID;
        }
        int max_layer = cfg->layout.layers[cfg->layout.n_layers - 1];
        int n_model = hs_model_num_layers(pr->model);
        if (max_layer > n_model) {
            hs_error("--layers asks for hidden state %d but the model has %d layers (valid: 0..%d)",
                     max_layer, n_model, n_model);
            return HS_ERR_INVALID;
        }
    }
    return HS_OK;
}

/* With --source model: read its config, resolve a layer preset
 * (--dflash-layers, --eagle3-layers) against its depth before any weight is
 * read, then load it and take the hidden size from it. */
static hs_status_t load_model(producer_t *pr)
{
    hs_producer_config_t *cfg = &pr->config;
    hs_model_config_t mc;
    hs_status_t st = hs_model_read_config(cfg->model_dir, &mc);
    if (st != HS_OK) return st;
    if (cfg->dflash_layers > 0) {
        st = hs_model_dflash_layers(mc.num_layers, cfg->dflash_layers, cfg->layout.layers,
                                    HS_MAX_LAYERS);
        if (st != HS_OK) return st;
        cfg->layout.n_layers = (uint32_t)cfg->dflash_layers;
    } else if (cfg->eagle3_layers) {
        st = hs_model_eagle3_layers(mc.num_layers, cfg->layout.layers, HS_MAX_LAYERS);
        if (st != HS_OK) return st;
        cfg->layout.n_layers = HS_MODEL_EAGLE3_N_LAYERS;
    }
    st = hs_model_load_ex(cfg->model_dir, (hs_model_weights_t)cfg->weights, &pr->model);
    if (st != HS_OK) return st;
    hs_model_set_attn(pr->model, cfg->attn);
    if (!cfg->layout.hidden_size)
        cfg->layout.hidden_size = (uint32_t)hs_model_hidden_size(pr->model);
    char desc[200];
    hs_layout_describe(&cfg->layout, desc, sizeof(desc));
    hs_info("model %s: %d layers, hidden %d, --dtype %s (%d fp8 weights); capturing %s",
            cfg->model_dir, hs_model_num_layers(pr->model), hs_model_hidden_size(pr->model),
            hs_model_weights_name((hs_model_weights_t)cfg->weights),
            hs_model_fp8_weights(pr->model), desc);
    return HS_OK;
}

/* The target the states come from (hs_target_fingerprint): the model
 * folder's config and weights, marked when its Linear layers run as FP8
 * (other states than the same weights in bf16, which hsflow-produce and
 * hs-producer share); the synthetic source's; or the library caller's own,
 * which it must give. */
static hs_status_t target_identify(producer_t *pr)
{
    hs_producer_config_t *cfg = &pr->config;
    if (cfg->source == HS_SOURCE_SYNTHETIC) {
        cfg->target_fingerprint = hs_target_synthetic_fingerprint();
        cfg->target_name = "synthetic";
    } else if (cfg->source == HS_SOURCE_MODEL) {
        uint64_t fp;
        hs_status_t st = hs_target_fingerprint(cfg->model_dir, &fp);
        if (st != HS_OK) return st;
        if (hs_model_fp8_weights(pr->model) > 0) {
            char mix[64];
            int n = snprintf(mix, sizeof(mix), "%016llx linear=fp8", (unsigned long long)fp);
            fp = hs_checksum64(mix, (size_t)n);
            fp = fp ? fp : 1;
            hs_info("target %s with FP8 Linear weights: fingerprint %016llx", cfg->model_dir,
                    (unsigned long long)fp);
        }
        cfg->target_fingerprint = fp;
        cfg->target_name = cfg->model_dir;
    } else if (!cfg->target_fingerprint) {
        hs_error("producer: say which target computes the states: target_fingerprint is 0 (give "
                 "hs_target_fingerprint() of the model folder, hs_target_synthetic_fingerprint() "
                 "for hs_synth_value's states, or a fingerprint of your own)");
        return HS_ERR_INVALID;
    }
    if (!cfg->target_name || !cfg->target_name[0]) cfg->target_name = "unnamed";
    return HS_OK;
}

/* Frees everything producer_open() made; worker threads must be joined. */
static void producer_free(producer_t *pr)
{
    if (!pr) return;
    for (uint32_t i = 0; i < HS_PRODUCER_MAX_WORKERS; i++) {
        hs__gpu_worker_destroy(pr->workers[i].gpu_w); /* unpins staging */
        pr->workers[i].gpu_w = NULL;
    }
    /* Completion callbacks of anything still queued run during destroy;
     * staging is the transport's memory (hs_tp_mem_alloc) and goes with it. */
    hs_tp_destroy(pr->tp);
    pr->sh.outbox = NULL; /* its records are the staging buffers' */
    hs__ticket_pool_free(pr);
    for (uint32_t i = 0; i < HS_PRODUCER_MAX_WORKERS; i++) {
        hs_checksum_stream_destroy(pr->workers[i].checksum);
        free(pr->workers[i].fp8_scratch);
    }
    hs_model_destroy(pr->model);
    hs_plan_destroy(pr->plan);
    hs_dataset_close(pr->ds);
    hs_auth_key_clear(&pr->key);
    for (uint32_t i = 0; i < HS_PRODUCER_MAX_LINKS; i++)
        free(pr->net.links[i].hello_body);
    free(pr->net.frame_buf);
    pthread_mutex_destroy(&pr->sh.lock);
    pthread_cond_destroy(&pr->sh.cond);
    free(pr);
}

/* The settings not in the connection line, defaults resolved. */
static void log_effective_config(const producer_t *pr, const hs_tp_config_t *tc)
{
    const hs_producer_config_t *cfg = pr->cfg;
    char status[32], tuning[160];
    double si = cfg->status_interval_s == 0 ? 5.0 : cfg->status_interval_s;
    if (si > 0)
        snprintf(status, sizeof status, "%g s", si);
    else
        snprintf(status, sizeof status, "never");
    hs_tp_config_describe(tc, tuning, sizeof tuning);
    hs_info("producer settings: prefetch %u, connect timeout %u s, reconnect %s, status every %s, "
            "%s",
            cfg->prefetch, cfg->connect_timeout_s, cfg->reconnect ? "on" : "off", status, tuning);
}

/* Loads data, plan and model, allocates staging, connects and says HELLO.
 * No thread is started. */
static hs_status_t producer_open(const hs_producer_config_t *config, producer_t **out)
{
    hs_status_t st;
    producer_t *pr = calloc(1, sizeof(*pr));
    if (!pr) return HS_ERR_NOMEM;
    pr->config = *config;
    const hs_producer_config_t *cfg = pr->cfg = &pr->config;
    pthread_mutex_init(&pr->sh.lock, NULL);
    pthread_cond_init(&pr->sh.cond, NULL);
    hs_msg_arena_init(&pr->net.ticket_arena);

    if (cfg->source == HS_SOURCE_MODEL) {
        st = load_model(pr);
        if (st != HS_OK) goto err;
    }
    st = target_identify(pr);
    if (st != HS_OK) goto err;
    if (hs_layout_check(&cfg->layout) != HS_OK || cfg->n_workers == 0 ||
        cfg->n_workers > HS_PRODUCER_MAX_WORKERS || cfg->prefetch == 0) {
        hs_error("invalid producer configuration (layout, workers or prefetch)");
        st = HS_ERR_INVALID;
        goto err;
    }
    if (cfg->source == HS_SOURCE_SYNTHETIC && cfg->gpu_ids[0] >= 0)
        hs_info("--source synthetic: the %u listed GPUs act as %u CPU workers", cfg->n_workers,
                cfg->n_workers);
    if (cfg->secret_file) {
        st = hs_auth_load_secret(cfg->secret_file, &pr->key);
        if (st != HS_OK) goto err;
        pr->have_secret = true;
    }
    st = load_inputs(pr);
    if (st != HS_OK) goto err;
    pr->net.frame_buf = malloc(HS_FRAME_MAX_BODY + HS_FRAME_HEADER_BYTES);
    if (!pr->net.frame_buf) {
        st = HS_ERR_NOMEM;
        goto err;
    }

    hs_tp_config_t tc = {0};
    st = hs_tp_kind_parse(cfg->transport ? cfg->transport : "auto", &tc.kind);
    if (st != HS_OK) {
        hs_error("unknown transport '%s': use auto, shm, tcp or ucx", cfg->transport);
        goto err;
    }
    tc.net_devices = cfg->net_devices;
    tc.require_rdma = cfg->require_rdma;
    tc.auth_key = pr->have_secret ? &pr->key : NULL; /* copied: pr->key stays ours */
    tc.tcp_sockbuf = cfg->tcp_sockbuf;
    tc.ucx_no_memh = cfg->ucx_no_memh;
    tc.fault = cfg->fault;
    st = hs_tp_create(&tc, &hs__producer_callbacks, pr, &pr->tp);
    if (st != HS_OK) goto err;
    log_effective_config(pr, &tc);

    /* Staging: batch-sized buffers per worker (two, or the API's three),
     * registered once. */
    for (uint32_t i = 0; i < cfg->n_workers; i++) {
        worker_t *w = &pr->workers[i];
        w->pr = pr;
        w->index = i;
        w->gpu = cfg->gpu_ids[i];
        w->n_staging = cfg->staging_buffers ? cfg->staging_buffers : STAGING_BUILTIN;
        w->checksum = hs_checksum_stream_create();
        if (!w->checksum) {
            st = HS_ERR_NOMEM;
            goto err;
        }
        for (uint32_t k = 0; k < w->n_staging; k++) {
            staging_t *sg = &w->staging[k];
            sg->owner = w;
            /* the transport's memory: on this host a consumer copies batches
             * straight out of it (shared memory), elsewhere it is registered */
            void *buf = NULL;
            st = hs_tp_mem_alloc(pr->tp, pr->max_batch_bytes, &buf);
            if (st != HS_OK) {
                hs_error("cannot allocate %.1f MiB of staging for worker %u",
                         (double)pr->max_batch_bytes / (1 << 20), i);
                goto err;
            }
            sg->buf = buf;
            memset(sg->buf, 0, pr->max_batch_bytes); /* fault the pages in now, not per batch */
        }
        if (cfg->source == HS_SOURCE_MODEL && w->gpu < 0 && cfg->layout.dtype == HS_DTYPE_FP8) {
            /* the CPU forward writes bf16 rows here; they are quantised into the batch */
            uint64_t bytes = (uint64_t)cfg->token_budget * hs_layout_row_elems(&cfg->layout) * 2;
            if (!(w->fp8_scratch = malloc(bytes))) {
                hs_error("cannot allocate %.1f MiB of bf16 rows for worker %u's fp8 batches",
                         (double)bytes / (1 << 20), i);
                st = HS_ERR_NOMEM;
                goto err;
            }
        }
        if (cfg->source == HS_SOURCE_MODEL && w->gpu >= 0) {
            void *bufs[2] = {w->staging[0].buf, w->staging[1].buf};
            st = hs__gpu_worker_create(pr->model, w->gpu, cfg->token_budget, pr->max_batch_seqs,
                                       &cfg->layout, bufs, pr->max_batch_bytes, &w->gpu_w);
            if (st != HS_OK) goto err;
            hs_info("worker %u on gpu %d: model replica and buffers for %u tokens ready", i, w->gpu,
                    cfg->token_budget);
        }
    }

    if (cfg->to && cfg->to->n) {
        pr->net.n_links = cfg->to->n;
        for (uint32_t i = 0; i < pr->net.n_links; i++) {
            snprintf(pr->net.links[i].host, sizeof(pr->net.links[i].host), "%s", cfg->to->host[i]);
            pr->net.links[i].port = cfg->to->port[i];
        }
    } else {
        pr->net.n_links = 1;
        snprintf(pr->net.links[0].host, sizeof(pr->net.links[0].host), "%s", cfg->to_host);
        pr->net.links[0].port = cfg->to_port;
    }
    /* A consumer holds at most workers x prefetch tickets of this producer
     * (it offers no more in HELLO), so that many records per link are
     * planned now; more are added only for a consumer asking beyond that. */
    uint64_t records = (uint64_t)pr->net.n_links * cfg->n_workers * cfg->prefetch;
    st = hs__ticket_pool_grow(pr, records < 65536 ? (uint32_t)records : 65536);
    if (st != HS_OK) goto err;
    static const char *source_names[] = {"?", "synthetic", "model", "external"};
    double t_setup = hs_now_s();
    for (uint32_t i = 0; i < pr->net.n_links; i++) {
        link_t *l = &pr->net.links[i];
        l->pr = pr;
        l->index = i;
        snprintf(l->consumer_name, sizeof(l->consumer_name), "%s:%u", l->host, l->port);
        /* The first consumer is waited for (--connect-timeout). Once one is
         * connected it may already be ticketing this producer, whose workers
         * start only when this returns: a consumer not up yet gets one short
         * try, and the network loop keeps trying it while the workers feed
         * the others (a late rank no longer holds the others' tickets). */
        bool wait = i == 0;
        st = hs__link_connect(l, wait ? (int)cfg->connect_timeout_s * 1000 : 1000,
                              wait ? 0 : HS_TP_CONNECT_QUIET);
        if (st != HS_OK && l->done) {
            st = HS_OK; /* told BYE (or refused, as logged) while connecting */
            hs__links_update_done(pr);
            continue;
        }
        if (st == HS_ERR_TIMEOUT && !wait) {
            hs_info("consumer %s:%u is not reachable yet; trying again for up to %u s while "
                    "feeding the others",
                    l->host, l->port, cfg->connect_timeout_s);
            l->lost = l->pending = true;
            l->t_lost = t_setup;
            l->t_try = hs_now_s();
            st = HS_OK;
            continue;
        }
        if (st != HS_OK) {
            /* a refusal (secret, version) was explained by the transport */
            if (st == HS_ERR_TIMEOUT || st == HS_ERR_IO)
                hs_error("cannot reach the consumer at %s:%u within %u s: is hs-consumer "
                         "running there?",
                         l->host, l->port, cfg->connect_timeout_s);
            goto err;
        }
        hs_info("hsflow %s connected to %s:%u over %s; %u %s worker(s)", hs_version_line(), l->host,
                l->port, hs_tp_conn_describe(l->conn), cfg->n_workers, source_names[cfg->source]);
        if (l->done) continue; /* its consumer said BYE or refused us while we connected */
        st = hs__link_send_hello(l);
        if (st != HS_OK) goto err;
    }
    *out = pr;
    return HS_OK;
err:
    producer_free(pr);
    return st;
}

hs_status_t hs_producer_run(const hs_producer_config_t *config)
{
    char why[256];
    if (hs_producer_config_check(config, false, why, sizeof why) != HS_OK) {
        hs_error("producer: %s", why);
        return HS_ERR_INVALID;
    }
    hs_producer_config_t cfg = *config;
    hs_producer_addrs_t *addrs = NULL;
    if (!cfg.to && cfg.to_list && cfg.to_list[0]) {
        if (!(addrs = malloc(sizeof(*addrs)))) return HS_ERR_NOMEM;
        if (hs_producer_parse_to(cfg.to_list, addrs) != HS_OK) { /* logged */
            free(addrs);
            return HS_ERR_INVALID;
        }
        cfg.to = addrs;
    }
    producer_t *pr;
    hs_status_t st = producer_open(&cfg, &pr);
    free(addrs);
    if (st != HS_OK) return st;
    pr->config.to = NULL; /* `addrs` is gone; only used to connect (links keep the addresses) */
    uint32_t started = 0;
    for (; started < pr->cfg->n_workers; started++) {
        worker_t *w = &pr->workers[started];
        if (pthread_create(&w->thread, NULL, w->gpu_w ? hs__worker_gpu_main : hs__worker_cpu_main,
                           w) != 0) {
            pr->sh.result = HS_ERR_NOMEM;
            pr->net.done = true;
            break;
        }
        /* A GPU worker's thread polls while its GPU computes (or hangs): its
         * CPU time says nothing; its launches and finishes do. */
        if (!w->gpu_w) {
            pthread_mutex_lock(&pr->sh.lock);
            w->has_cpu_clock = pthread_getcpuclockid(w->thread, &w->cpu_clock) == 0;
            pthread_mutex_unlock(&pr->sh.lock);
        }
    }
    hs__net_main(pr);
    pthread_mutex_lock(&pr->sh.lock);
    pr->sh.stop = true;
    pthread_cond_broadcast(&pr->sh.cond);
    pthread_mutex_unlock(&pr->sh.lock);
    for (uint32_t i = 0; i < started; i++)
        pthread_join(pr->workers[i].thread, NULL);
    if (started) hs__report_print_summary(pr); /* a summary not written fails the run */
    st = pr->sh.result;                        /* with what the workers met at exit */
    producer_free(pr);
    return st;
}

/* ---- the library's producer API: the caller is the one worker ------------- */

hs_status_code_t hs_producer_open(const hs_producer_client_config_t *cc, hs_producer_t **out)
{
    hs_producer_config_t cfg;
    hs_producer_config_default(&cfg);
    hs_producer_addrs_t *addrs = malloc(sizeof(*addrs));
    if (!addrs) return HS_ERR_NOMEM;
    if (hs_producer_parse_to(cc->to, addrs) != HS_OK) {
        hs_error("producer: 'to' must be HOST:PORT[,HOST:PORT...] or HOST:LO-HI, got '%s'",
                 cc->to ? cc->to : "(null)");
        free(addrs);
        return HS_ERR_INVALID;
    }
    if (!cc->data_path || !cc->layers || cc->n_layers == 0 || cc->n_layers > HS_MAX_LAYERS ||
        cc->hidden_size == 0 || cc->token_budget == 0) {
        hs_error("producer: data_path, token_budget, hidden_size and 1..%d layers are required",
                 HS_MAX_LAYERS);
        free(addrs);
        return HS_ERR_INVALID;
    }
    cfg.to = addrs;
    cfg.data_path = cc->data_path;
    cfg.token_budget = cc->token_budget;
    cfg.max_seq_len = cc->max_seq_len;
    cfg.overflow = cc->overflow_drop ? HS_OVERFLOW_DROP : HS_OVERFLOW_TRUNCATE;
    cfg.seed = cc->seed;
    cfg.layout.hidden_size = cc->hidden_size;
    if (cc->hs_dtype != 0 && cc->hs_dtype != HS_HIDDEN_BF16 && cc->hs_dtype != HS_HIDDEN_FP8) {
        hs_error("producer: hs_dtype %d is neither HS_HIDDEN_BF16 nor HS_HIDDEN_FP8",
                 (int)cc->hs_dtype);
        free(addrs);
        return HS_ERR_INVALID;
    }
    cfg.layout.dtype = cc->hs_dtype == HS_HIDDEN_FP8 ? HS_DTYPE_FP8 : HS_DTYPE_BF16;
    cfg.layout.n_layers = cc->n_layers;
    memcpy(cfg.layout.layers, cc->layers, cc->n_layers * sizeof(int32_t));
    if (cc->staging_buffers == 1 || cc->staging_buffers > HS_PRODUCER_STAGING_MAX) {
        hs_error("producer: staging_buffers %u: give 2..%d (0 = %d)", cc->staging_buffers,
                 HS_PRODUCER_STAGING_MAX, STAGING_API_DEFAULT);
        free(addrs);
        return HS_ERR_INVALID;
    }
    cfg.staging_buffers = cc->staging_buffers ? cc->staging_buffers : STAGING_API_DEFAULT;
    cfg.source = HS_SOURCE_EXTERNAL;
    cfg.target_fingerprint = cc->target_fingerprint;
    cfg.target_name = cc->target_name;
    cfg.n_workers = 1;
    cfg.gpu_ids[0] = -1;
    if (cc->prefetch) cfg.prefetch = cc->prefetch;
    cfg.secret_file = cc->secret_file;
    if (cc->transport) cfg.transport = cc->transport;
    if (cc->connect_timeout_s) cfg.connect_timeout_s = cc->connect_timeout_s;
    cfg.name = cc->name;
    cfg.reconnect = cc->reconnect;
    if (cc->status_interval_s) cfg.status_interval_s = cc->status_interval_s;

    producer_t *pr;
    hs_status_t st = producer_open(&cfg, &pr);
    free(addrs);
    if (st != HS_OK) return st;
    pr->config.to = NULL; /* `addrs` is gone; only used to connect (links keep the addresses) */
    if (pthread_create(&pr->api.net_thread, NULL, hs__net_main, pr) != 0) {
        producer_free(pr);
        return HS_ERR_NOMEM;
    }
    pr->api.net_started = true;
    *out = pr;
    return HS_OK;
}

/* The caller's worker waited for a ticket since t_wait: its stall, counted
 * from the run's start. Under sh.lock. */
static void stall_end(producer_t *pr, worker_t *w, double t_wait)
{
    if (pr->sh.t_start > 0)
        w->stall_s += hs_now_s() - (t_wait > pr->sh.t_start ? t_wait : pr->sh.t_start);
    w->t_stall = 0;
}

hs_status_code_t hs_producer_next(hs_producer_t *pr, hs_work_t *out, int timeout_ms)
{
    worker_t *w = &pr->workers[0];
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms >= 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    double t_wait = hs_now_s();
    pthread_mutex_lock(&pr->sh.lock);
    staging_t *st = NULL;
    for (;;) {
        st = NULL;
        for (uint32_t i = 0; i < w->n_staging; i++)
            if (!w->staging[i].busy) st = &w->staging[i];
        if (pr->sh.tickets && st) break;
        if (pr->sh.net_done || pr->sh.stop) {
            hs_status_t r = pr->sh.result != HS_OK ? pr->sh.result : HS_ERR_CLOSED;
            pthread_mutex_unlock(&pr->sh.lock);
            return r;
        }
        w->t_stall = t_wait; /* waiting for a ticket, as a worker of hs-producer does */
        if (timeout_ms < 0) {
            pthread_cond_wait(&pr->sh.cond, &pr->sh.lock);
        } else if (pthread_cond_timedwait(&pr->sh.cond, &pr->sh.lock, &dl) == ETIMEDOUT) {
            stall_end(pr, w, t_wait);
            pthread_mutex_unlock(&pr->sh.lock);
            return HS_ERR_TIMEOUT;
        }
    }
    if (w->t_stall > 0) stall_end(pr, w, t_wait);
    ticket_t tk, *t = &tk;
    hs__ticket_pop(pr, &tk);
    st->busy = true;
    st->gen = t->gen;
    st->link = t->link;
    w->computing = true;
    w->t_progress = hs_now_s();
    pthread_mutex_unlock(&pr->sh.lock);

    const hs_layout_t *layout = &pr->cfg->layout;
    hs_batch_view_t v;
    hs_status_t fst = hs__worker_fill_meta(pr, t, st->buf, &v);
    if (fst != HS_OK) { /* the dataset changed under us: logged, the run cannot go on */
        pthread_mutex_lock(&pr->sh.lock);
        st->busy = false;
        pr->sh.result = fst;
        pr->sh.stop = true;
        pthread_cond_broadcast(&pr->sh.cond);
        pthread_mutex_unlock(&pr->sh.lock);
        hs_tp_wakeup(pr->tp);
        return fst;
    }
    memset(out, 0, sizeof(*out));
    out->ticket = t->id;
    out->epoch = t->epoch;
    out->batch = t->batch;
    out->n_seqs = t->n_seqs;
    out->n_tokens = t->n_tokens;
    out->hidden_size = layout->hidden_size;
    out->n_layers = layout->n_layers;
    out->cu_seqlens = v.cu_seqlens;
    out->sample_ids = v.sample_ids;
    out->input_ids = v.input_ids;
    out->loss_mask = v.loss_mask;
    out->hidden = v.hidden;
    out->hidden_fp8 = v.hidden_fp8;
    out->hidden_scales = v.scales;
    out->bytes = t->bytes;
    out->handle = (uint64_t)(uintptr_t)st;
    w->t_taken = hs_now_s();
    return HS_OK;
}

hs_status_code_t hs_producer_submit(hs_producer_t *pr, const hs_work_t *work)
{
    worker_t *w = &pr->workers[0];
    staging_t *st = NULL;
    for (uint32_t i = 0; i < w->n_staging; i++)
        if ((uintptr_t)&w->staging[i] == work->handle) st = &w->staging[i];
    pthread_mutex_lock(&pr->sh.lock);
    bool taken = st && st->busy && !st->queued;
    pthread_mutex_unlock(&pr->sh.lock);
    if (!taken) {
        hs_error("hs_producer_submit: not a batch taken with hs_producer_next (or sent twice)");
        return HS_ERR_INVALID;
    }
    outgoing_t *o = &st->out;
    hs_batch_seal(st->buf, work->bytes);
    o->t = (ticket_t){NULL,           work->ticket, work->epoch, work->batch, work->n_seqs,
                      work->n_tokens, work->bytes,  st->gen,     st->link};
    o->st = st;
    o->worker = 0;
    o->checksum = ((hs_batch_header_t *)st->buf)->checksum;
    pthread_mutex_lock(&pr->sh.lock);
    double now = hs_now_s();
    o->compute_ns = (uint64_t)((now - w->t_taken) * 1e9);
    w->busy_s += now - w->t_taken;
    w->computing = false;
    w->t_progress = now;
    w->batches++;
    w->tokens += work->n_tokens;
    w->bytes += work->bytes;
    o->next = pr->sh.outbox;
    pr->sh.outbox = o;
    st->queued = true;
    pthread_mutex_unlock(&pr->sh.lock);
    hs_tp_wakeup(pr->tp);
    return HS_OK;
}

hs_status_code_t hs_producer_info(const hs_producer_t *pr, hs_producer_info_t *out)
{
    if (!pr || !out) return HS_ERR_INVALID;
    hs_producer_info_t info = {0};
    info.plan_hash = hs_plan_hash(pr->plan);
    info.n_batches = hs_plan_n_batches(pr->plan);
    for (uint32_t b = 0; b < info.n_batches; b++) {
        hs_plan_batch_t pb;
        hs_status_t st = hs_plan_batch(pr->plan, b, &pb);
        if (st != HS_OK) return st;
        if (pb.n_tokens > info.max_batch_tokens) info.max_batch_tokens = pb.n_tokens;
    }
    for (uint32_t i = 0; i < pr->workers[0].n_staging && i < HS_PRODUCER_STAGING_MAX; i++)
        info.staging[i] = pr->workers[0].staging[i].buf;
    info.staging_bytes = pr->max_batch_bytes;
    *out = info;
    return HS_OK;
}

void hs_producer_close(hs_producer_t *pr)
{
    if (!pr) return;
    if (pr->api.net_started) {
        pr->api.close_requested = true;
        hs_tp_wakeup(pr->tp);
        pthread_join(pr->api.net_thread, NULL);
    }
    producer_free(pr);
}
