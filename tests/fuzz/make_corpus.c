/* SPDX-License-Identifier: Apache-2.0 */
/* make_corpus.c - writes the generated part of the fuzz seed corpus:
 *
 *   fuzz-make-corpus OUT_DIR SOURCE_DIR
 *
 * OUT_DIR/<target>/<name> for every harness in tests/fuzz: small valid
 * inputs made by hsflow's own encoders (frames and messages of every type,
 * sealed batches, safetensors and .hst files, journals, resume states,
 * JSONL), plus a few
 * edge cases next to them. SOURCE_DIR is the repository (its
 * tests/data/<model>/config.json files seed config). Output is the same on
 * every run (fixed nonces and seeds), so the committed corpus only changes
 * when an encoder does. scripts/fuzz --make-corpus runs it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hs_data.h"
#include "hs_proto.h"
#include "safetensors_int.h"
#include "state_int.h"
#include "hs_log.h"

static const char *g_out;

static void die(const char *what)
{
    fprintf(stderr, "fuzz-make-corpus: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void put(const char *target, const char *name, const void *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_out, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) die(path);
    snprintf(path, sizeof path, "%s/%s/%s", g_out, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) die(path);
}

static void put_str(const char *target, const char *name, const char *s)
{
    put(target, name, s, strlen(s));
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    if (!p || fread(p, 1, (size_t)len, f) != (size_t)len) die(path);
    fclose(f);
    *n = (size_t)len;
    return p;
}

/* ---- frames and messages ------------------------------------------------ */

static uint8_t g_frame[1 << 16];

/* Packs msg into a frame; writes it to frame/<name> and, as type byte +
 * body, to msg/<name>. */
static void put_msg(const char *name, uint16_t type, const ProtobufCMessage *m)
{
    size_t n;
    if (hs_msg_pack(type, m, g_frame, sizeof g_frame, &n) != HS_OK) {
        fprintf(stderr, "fuzz-make-corpus: cannot pack %s\n", name);
        exit(1);
    }
    put("frame", name, g_frame, n);
    g_frame[HS_FRAME_HEADER_BYTES - 1] = (uint8_t)type; /* the byte before the body */
    put("msg", name, g_frame + HS_FRAME_HEADER_BYTES - 1, n - HS_FRAME_HEADER_BYTES + 1);
}

static void make_messages(void)
{
    uint8_t nonce[32], mac[32];
    for (int i = 0; i < 32; i++)
        nonce[i] = (uint8_t)(i * 7 + 1), mac[i] = (uint8_t)(0xa5 ^ i);
    hs_layout_t l = {256, HS_DTYPE_BF16, 3, {2, 16, 29}};
    int32_t layers[HS_MAX_LAYERS];

    Hsflow__Layout lm;
    hs_layout_to_msg(&l, &lm, layers);
    Hsflow__Hello h = HSFLOW__HELLO__INIT;
    h.version = HS_PROTO_VERSION;
    h.producer_name = "host:1234";
    h.workers = 2;
    h.prefetch_per_worker = 2;
    h.layout = &lm;
    h.plan_hash = 0x0123456789abcdefull;
    h.n_batches = 40;
    h.seed = 3;
    h.token_budget = 4096;
    h.max_seq_len = 2000;
    h.dataset_fingerprint = 0xfeedfacecafebeefull;
    h.total_tokens = 150000;
    h.client_nonce = (ProtobufCBinaryData){32, nonce};
    h.target_name = "synthetic";
    h.target_fingerprint = hs_target_synthetic_fingerprint();
    h.total_seqs = 200;
    put_msg("hello", HS_MSG_HELLO, &h.base);
    hs_layout_t big = {65536, HS_DTYPE_BF16, HS_MAX_LAYERS, {0}};
    for (int i = 0; i < HS_MAX_LAYERS; i++)
        big.layers[i] = i * 3;
    hs_layout_to_msg(&big, &lm, layers);
    h.workers = HS_MSG_MAX_WORKERS;
    h.n_batches = HS_PLAN_MAX_BATCHES;
    put_msg("hello-limits", HS_MSG_HELLO, &h.base);

    Hsflow__Challenge c = HSFLOW__CHALLENGE__INIT;
    c.server_nonce = (ProtobufCBinaryData){32, nonce};
    put_msg("challenge", HS_MSG_CHALLENGE, &c.base);
    Hsflow__Auth a = HSFLOW__AUTH__INIT;
    a.mac = (ProtobufCBinaryData){32, mac};
    put_msg("auth", HS_MSG_AUTH, &a.base);

    Hsflow__Welcome w = HSFLOW__WELCOME__INIT;
    w.session_id = 77;
    w.epochs = 3;
    w.need_plan = true;
    w.server_mac = (ProtobufCBinaryData){32, mac};
    w.start_epoch = 1;
    w.consumer_name = "trainer:99";
    w.order = 1;
    put_msg("welcome", HS_MSG_WELCOME, &w.base);
    w.server_mac = (ProtobufCBinaryData){0, NULL};
    w.need_plan = false;
    put_msg("welcome-no-mac", HS_MSG_WELCOME, &w.base);

    uint32_t seqs[8] = {1, 2, 3, 5, 8, 13, 21, 34}, toks[8];
    for (int i = 0; i < 8; i++)
        toks[i] = seqs[i] * 100;
    Hsflow__Plan p = HSFLOW__PLAN__INIT;
    p.first_batch = 0;
    p.n_n_seqs = p.n_n_tokens = 8;
    p.n_seqs = seqs;
    p.n_tokens = toks;
    p.last = true;
    put_msg("plan", HS_MSG_PLAN, &p.base);
    p.first_batch = UINT32_MAX - 8;
    p.last = false;
    put_msg("plan-last-ids", HS_MSG_PLAN, &p.base);

    Hsflow__Ticket t = HSFLOW__TICKET__INIT;
    t.ticket_id = 5;
    t.epoch = 1;
    t.batch = 17;
    t.bytes = 1 << 20;
    t.n_seqs = 3;
    t.n_tokens = 900;
    t.worker_hint = 0xffffffffu;
    t.slot_offset = 1 << 24;
    put_msg("ticket", HS_MSG_TICKET, &t.base);

    Hsflow__Done d = HSFLOW__DONE__INIT;
    d.ticket_id = 5;
    d.epoch = 1;
    d.batch = 17;
    d.bytes = 1 << 20;
    d.checksum = 0x1122334455667788ull;
    d.worker = 1;
    d.compute_ns = 123456789;
    put_msg("done", HS_MSG_DONE, &d.base);

    Hsflow__WorkerStats ws[2] = {HSFLOW__WORKER_STATS__INIT, HSFLOW__WORKER_STATS__INIT};
    Hsflow__WorkerStats *wp[2] = {&ws[0], &ws[1]};
    ws[0].worker = 0, ws[0].busy_pct = 97.5, ws[0].tokens = 1000, ws[0].batches = 3;
    ws[1].worker = 1, ws[1].busy_pct = 100.0, ws[1].stall_pct = 0.5;
    Hsflow__Stats s = HSFLOW__STATS__INIT;
    s.worker_count = 2;
    s.n_workers = 2;
    s.workers = wp;
    s.tokens = 5000;
    s.batches = 7;
    s.stall_pct = 1.5;
    s.tokens_per_s = 12345.5;
    s.uptime_ns = 999;
    put_msg("stats", HS_MSG_STATS, &s.base);

    Hsflow__Error e = HSFLOW__ERROR__INIT;
    e.code = HS_ERR_MISMATCH;
    e.text = "plan 0123456789abcdef differs:\n\tstart the producers with the same flags";
    put_msg("error", HS_MSG_ERROR, &e.base);
    Hsflow__Bye b = HSFLOW__BYE__INIT;
    b.reason = "run complete";
    put_msg("bye", HS_MSG_BYE, &b.base);
    b.reason = "";
    put_msg("bye-empty", HS_MSG_BYE, &b.base);
    Hsflow__RankClaim rc[2] = {HSFLOW__RANK_CLAIM__INIT, HSFLOW__RANK_CLAIM__INIT};
    Hsflow__RankClaim *rcp[2] = {&rc[0], &rc[1]};
    for (int i = 0; i < 2; i++) {
        rc[i].world = 2;
        rc[i].instance_id = 0x0c70d684fac78adfull + (uint64_t)i;
        rc[i].started_unix_ms = 1764892800000ull + 585u * (uint64_t)i;
        rc[i].consumer_name = i ? "d2:4711" : "d1:4666";
    }
    Hsflow__Ranks rk = HSFLOW__RANKS__INIT;
    rk.hops = 2;
    rk.n_claims = 2;
    rk.claims = rcp;
    put_msg("ranks", HS_MSG_RANKS, &rk.base);

    /* edge cases: a header alone, bad magic, a body longer than the limit */
    uint8_t hdr[HS_FRAME_HEADER_BYTES];
    hs_frame_header_encode(hdr, HS_MSG_TICKET, "", 0);
    put("frame", "edge-ticket-empty-body", hdr, sizeof hdr);
    hdr[0] ^= 0xff;
    put("frame", "edge-bad-magic", hdr, sizeof hdr);
    hs_frame_header_encode(hdr, HS_MSG_PLAN, "", 0);
    uint32_t huge = HS_FRAME_MAX_BODY + 1;
    memcpy(hdr + 8, &huge, 4);
    put("frame", "edge-body-over-limit", hdr, sizeof hdr);
    put("frame", "edge-short", hdr, 7);
    uint8_t none[1] = {HS_MSG_HELLO};
    put("msg", "edge-hello-empty", none, 1);
    uint8_t unknown[3] = {HS_MSG_TYPE_MAX + 1, 0x08, 0x01};
    put("msg", "edge-unknown-type", unknown, 3);
}

/* ---- batches ------------------------------------------------------------ */

/* The harness's ticket encoding: mode, n-1, T-n, H-1, k-1, layer steps,
 * epoch, index. */
static size_t batch_params(uint8_t *p, int mode, uint32_t n, uint32_t T, const hs_layout_t *l,
                           uint32_t epoch, uint32_t index)
{
    size_t k = 0;
    p[k++] = (uint8_t)mode;
    p[k++] = (uint8_t)(n - 1);
    p[k++] = (uint8_t)(T - n);
    p[k++] = (uint8_t)(l->hidden_size - 1);
    p[k++] = (uint8_t)(l->n_layers - 1);
    for (uint32_t i = 0; i < l->n_layers; i++)
        p[k++] = (uint8_t)(l->layers[i] - (i ? l->layers[i - 1] + 1 : 0));
    p[k++] = (uint8_t)epoch;
    p[k++] = (uint8_t)index;
    return k;
}

static void make_batches(void)
{
    hs_layout_t l = {16, HS_DTYPE_BF16, 2, {1, 4}};
    uint8_t in[1 << 16];
    /* mode 1: built by the harness from lengths and ids */
    size_t k = batch_params(in, 1, 3, 20, &l, 1, 9);
    for (int i = 0; i < 200; i++)
        in[k++] = (uint8_t)(i * 37 + 11);
    put("batch", "built-3x20", in, k);
    k = batch_params(in, 1, 1, 1, &(hs_layout_t){1, HS_DTYPE_BF16, 1, {0}}, 0, 0);
    put("batch", "built-smallest", in, k);
    k = batch_params(in, 1, 8, 55, &(hs_layout_t){40, HS_DTYPE_BF16, 3, {0, 8, 16}}, 3, 255);
    for (int i = 0; i < 400; i++)
        in[k++] = (uint8_t)(i * 13 + 5);
    put("batch", "built-largest", in, k);

    /* mode 0: a sealed synthetic region as a producer sends it */
    uint32_t n = 2, T = 12;
    k = batch_params(in, 0, n, T, &l, 2, 5);
    hs_batch_offsets_t o = hs_batch_offsets(n, T, &l);
    uint8_t *r = aligned_alloc(HS_BATCH_ALIGN, o.total);
    memset(r, 0, o.total);
    hs_batch_view_t v = hs_batch_view(r, n, T, &l);
    hs_batch_header_init(v.header, 2, 5, n, T, &l, 42);
    v.cu_seqlens[0] = 0, v.cu_seqlens[1] = 5, v.cu_seqlens[2] = 12;
    v.sample_ids[0] = 100, v.sample_ids[1] = 7;
    for (uint32_t t = 0; t < T; t++)
        v.input_ids[t] = (int32_t)t, v.loss_mask[t] = t > 1;
    hs_batch_synth_fill(&v, &l);
    hs_batch_seal(r, o.total);
    memcpy(in + k, r, o.total);
    put("batch", "region-sealed", in, k + o.total);
    put("batch", "region-header-only", in, k + HS_BATCH_HEADER_BYTES);
    free(r);
}

/* ---- files: safetensors, .hst, JSONL, journal, config.json -------------- */

static void make_safetensors(const char *tmp)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/t.safetensors", tmp);
    uint16_t bf16[6] = {0x3f80, 0x4000, 0xbf80, 0, 0x7f80, 0x0001};
    uint16_t f16[4] = {0x3c00, 0x0001, 0x7bff, 0xfc00};
    float f32[3] = {1.5f, -0.0f, 3.0e38f};
    int32_t i32[2] = {-1, 7};
    hs__st_write_tensor_t ts[] = {
        {"model.embed_tokens.weight", "BF16", 2, {2, 3}, bf16, 1, 12, 0},
        {"model.norm.weight", "F16", 1, {4}, f16, 1, 8, 0},
        {"lm_head.weight", "F32", 2, {1, 3}, f32, 1, 12, 0},
        {"ids", "I32", 1, {2}, i32, 1, 8, 0},
        {"empty", "BF16", 2, {0, 4}, bf16, 0, 0, 0},
    };
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    if (hs__st_write(path, ts, 5, mk, mv, 1) != HS_OK) die(path);
    size_t n;
    uint8_t *p = slurp(path, &n);
    put("safetensors", "five-tensors", p, n);
    free(p);
    if (hs__st_write(path, ts, 1, NULL, NULL, 0) != HS_OK) die(path);
    p = slurp(path, &n);
    put("safetensors", "one-tensor", p, n);
    free(p);
    unlink(path);
    static const uint8_t empty_header[] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    put("safetensors", "edge-empty-header", empty_header, sizeof empty_header);
    static const char reach[] = "\x3a\0\0\0\0\0\0\0"
                                "{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    put("safetensors", "edge-data-past-end", reach, sizeof reach - 1);
}

static void make_datasets(const char *tmp)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/d.hst", tmp);
    uint32_t lens[3] = {3, 1, 4};
    int32_t ids[8] = {1, 2, 3, 0, 2147483647, 5, 6, 7};
    uint8_t mask[8] = {0, 1, 1, 1, 0, 0, 1, 1};
    hs_dataset_t *ds;
    if (hs_dataset_from_arrays(3, lens, ids, mask, &ds) != HS_OK) die("dataset");
    if (hs_dataset_write_hst(ds, path) != HS_OK) die(path);
    hs_dataset_close(ds);
    size_t n;
    uint8_t *p = slurp(path, &n);
    put("hst", "three-seqs", p, n);
    put("hst", "edge-header-only", p, 64);
    free(p);
    if (hs_dataset_from_arrays(1, lens + 1, ids, NULL, &ds) != HS_OK) die("dataset");
    if (hs_dataset_write_hst(ds, path) != HS_OK) die(path);
    hs_dataset_close(ds);
    p = slurp(path, &n);
    put("hst", "one-token", p, n);
    free(p);
    unlink(path);

    put_str("jsonl", "two-lines",
            "{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}\n"
            "{\"input_ids\": [7], \"loss_mask\": [true]}\n");
    put_str("jsonl", "no-mask-blank-lines",
            "\n{\"input_ids\":[5,6,2147483647]}\n\n  \t\n"
            "{\"input_ids\":[0],\"loss_mask\":null}");
    put_str("jsonl", "bom-crlf",
            "\xEF\xBB\xBF{\"input_ids\": [4, 4], \"extra\": {\"a\": [1]}}\r\n");
    put("jsonl", "edge-nul-byte", "{\"input_ids\": [1]}\n\0\n", 21);
    put_str("jsonl", "edge-empty", "");
    put_str("jsonl", "edge-float-id", "{\"input_ids\": [1.5e3, 2147483648]}\n");

    put_str("journal", "three-entries",
            "hsflow-journal 1 plan=0123456789abcdef batches=4\n"
            "0 0\n0 3\n1 2\n");
    put_str("journal", "epoch-complete",
            "hsflow-journal 1 plan=00000000000000ff batches=2\n"
            "0 0\n0 1\n1 1\n1 1\n");
    put_str("journal", "cut-last-line", "hsflow-journal 1 plan=0123456789abcdef batches=4\n0 1\n1");
    put_str("journal", "header-only", "hsflow-journal 1 plan=0123456789abcdef batches=1\n");
    put_str("journal", "edge-not-a-journal", "0 0\n");
}

static void put_state(const char *name, const hs_state_t *st)
{
    static char text[1 << 16];
    size_t n;
    if (hs_state_encode(st, text, sizeof text, &n) != HS_OK) die(name);
    put("state", name, text, n);
}

static void make_states(void)
{
    hs_state_t *st;
    if (hs_state_create_empty(2, HS_STATE_ARRIVAL, &st) != HS_OK) die("state");
    put_state("no-plan", st);
    hs_state_destroy(st);
    if (hs_state_bind(NULL, 0x0123456789abcdefull, 20, 3, HS_STATE_ARRIVAL, &st) != HS_OK)
        die("state");
    for (uint32_t b = 0; b < 20; b++)
        hs_state_mark(st, 0, b);
    for (uint32_t b = 0; b < 20; b += 3)
        hs_state_mark(st, 1, b);
    hs_state_mark(st, 2, 19);
    put_state("two-partial-epochs", st);
    hs_state_destroy(st);
    if (hs_state_bind(NULL, 0xffull, 9, 1, HS_STATE_PLAN, &st) != HS_OK) die("state");
    for (uint32_t b = 0; b < 4; b++)
        hs_state_mark(st, 0, b);
    put_state("plan-order", st);
    hs_state_destroy(st);
    put_str("state", "edge-bad-base64",
            "{\"hsflow_state\":1,\"plan\":\"0123456789abcdef\",\"batches_per_epoch\":9,"
            "\"epochs\":1,\"order\":\"arrival\",\"delivered\":1,\"epochs_done\":0,"
            "\"partial\":[{\"epoch\":0,\"count\":1,\"bitmap\":\"A*==\"}]}");
}

static void make_configs(const char *src)
{
    static const char *models[] = {"llama3",     "mistral",    "qwen2",     "qwen3",
                                   "qwen3_5_i2", "qwen3_5_i4", "qwen3_5_vl"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char path[4096];
        size_t n;
        snprintf(path, sizeof path, "%s/tests/data/%s/config.json", src, models[i]);
        uint8_t *p = slurp(path, &n);
        put("config", models[i], p, n);
        free(p);
    }
    put_str("config", "rope-linear-v5",
            "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":"
            "128,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
            "\"vocab_size\":100,\"rms_norm_eps\":1e-5,\"rope_parameters\":{\"rope_type\":"
            "\"linear\",\"factor\":2.0,\"rope_theta\":500000.0},\"head_dim\":16}");
    put_str("config", "mistral-window-null",
            "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":32,\"intermediate_size\":"
            "64,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"vocab_size\":10,"
            "\"rms_norm_eps\":1e-6,\"sliding_window\":null,\"hidden_act\":\"silu\"}");
    put_str("config", "edge-not-object", "[1, 2, 3]");
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: fuzz-make-corpus OUT_DIR SOURCE_DIR\n");
        return 2;
    }
    g_out = argv[1];
    if (mkdir(g_out, 0755) != 0 && errno != EEXIST) die(g_out);
    char tmp[] = "/tmp/hs-corpus.XXXXXX";
    if (!mkdtemp(tmp)) die("mkdtemp");
    hs_log_set_level(HS_LOG_ERROR);
    make_messages();
    make_batches();
    make_safetensors(tmp);
    make_datasets(tmp);
    make_configs(argv[2]);
    make_states();
    rmdir(tmp);
    printf("fuzz-make-corpus: wrote %s\n", g_out);
    return 0;
}
