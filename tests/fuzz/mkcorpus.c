/* mkcorpus.c — writes the generated seed inputs of tests/fuzz/corpus/ with
 * the project's own encoders: tiny GGUF files from gguf_writer (gguf/: two
 * vocabularies, and a tiny model of every architecture model_load runs), and
 * pd frames and messages from pd_frame_encode / pd_msg_*_encode (pd_wire/,
 * pd_msg/). The text seeds (json/, tenants/, tok/) are written by hand.
 *
 *   build-fuzz/fuzz_mkcorpus tests/fuzz/corpus
 *
 * Output is deterministic, so rerunning it changes nothing unless an encoder
 * changed. Seeds are kept small (libFuzzer's default -max_len follows the
 * largest one). */
#include "kvseal/gguf.h"
#include "kvseal/pd.h"
#include "kvseal/pd_msg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *root;

static void die_if(ks_err e, const char *what, const ks_errbuf *eb) {
    if (e == KS_OK) return;
    fprintf(stderr, "mkcorpus: %s: %s\n", what, eb ? eb->msg : ks_strerror(e));
    exit(1);
}

static void put(const char *dir, const char *name, const void *a, size_t a_len, const void *b,
                size_t b_len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", root, dir, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(a, 1, a_len, fp) != a_len || (b_len && fwrite(b, 1, b_len, fp) != b_len) ||
        fclose(fp) != 0) {
        fprintf(stderr, "mkcorpus: cannot write %s\n", path);
        exit(1);
    }
}

// ----------------------------------------------------------------------------
// GGUF

#define W(call) die_if((call), #call, NULL)

static void gguf_seed(const char *name, bool bpe) {
    gguf_writer *w = gguf_writer_create();
    if (!w) exit(1);
    W(gguf_writer_set_str(w, "general.architecture", "llama"));
    W(gguf_writer_set_u32(w, "llama.context_length", 64));
    W(gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f));
    W(gguf_writer_set_bool(w, "general.flag", true));
    W(gguf_writer_set_i32(w, "general.i32", -7));
    W(gguf_writer_set_u64(w, "general.u64", 1ull << 40));
    if (bpe) {
        const char *toks[] = {"a", "b", "c", "\xc4\xa0", "bc", "ab", "<|end|>", "<|im_start|>"};
        const int32_t types[] = {1, 1, 1, 1, 1, 1, 3, 4};
        const char *merges[] = {"b c", "a b"};
        W(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"));
        W(gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama3"));
        W(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 8));
        W(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 8));
        W(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 2));
        W(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 6));
        W(gguf_writer_set_str(w, "tokenizer.chat_template", "<|im_start|>{{ m }}<|im_end|>"));
    } else {
        const char *toks[] = {"<unk>", "<s>", "</s>", "<0x41>", "\xe2\x96\x81", "a", "b",
                              "\u2581ab"};
        const float scores[] = {0, 0, 0, 0, -1, -2, -3, -0.5f};
        const int32_t types[] = {2, 3, 3, 6, 1, 1, 1, 1};
        W(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
        W(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 8));
        W(gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 8));
        W(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 8));
        W(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
        W(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2));
        W(gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true));
        W(gguf_writer_set_str(w, "tokenizer.chat_template", "[INST] <<SYS>> {{ m }} [/INST]"));
    }
    static float f32[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t ne2[2] = {4, 2};
    W(gguf_writer_add_tensor(w, "token_embd.weight", 2, ne2, KS_DTYPE_F32, f32, sizeof f32));
    static uint8_t q8[34]; /* one q8_0 block: f16 scale + 32 int8 */
    int64_t ne1[1] = {32};
    W(gguf_writer_add_tensor(w, "output_norm.weight", 1, ne1, KS_DTYPE_Q8_0, q8, sizeof q8));
    char path[4096];
    snprintf(path, sizeof path, "%s/gguf/%s", root, name);
    ks_errbuf eb;
    die_if(gguf_writer_write(w, path, &eb), path, &eb);
    gguf_writer_destroy(w);
}

/* A tiny model of architecture `arch` that model_load accepts (all weights
 * zero, F32; 16 embd, 2 heads of 8, 1 KV head, 32 ff, 2 layers, the 8-token
 * SPM vocabulary above), so the fuzzer starts inside every architecture's
 * key and tensor checks. moe: 2 experts, 1 used (glm4moe: its first layer
 * dense, a shared expert, a selection bias, one NextN block counted in
 * block_count whose tensors kvseal never reads, so none are written). */
static void model_seed(const char *name, const char *arch, bool moe) {
    enum { E = 16, H = 2, HKV = 1, D = 8, F = 32, NL = 2, V = 8, X = 2 };
    static float zero[E * F * X];
    const bool qwen2 = !strcmp(arch, "qwen2"), glm4 = !strcmp(arch, "glm4");
    const bool phi3 = !strcmp(arch, "phi3"), gemma = !strncmp(arch, "gemma", 5);
    const bool qk_norm = !strncmp(arch, "qwen3", 5) || !strcmp(arch, "gemma3");
    const bool glm4moe = !strcmp(arch, "glm4moe");
    gguf_writer *w = gguf_writer_create();
    if (!w) exit(1);
    char k[128];
#define KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, arch), k)
    W(gguf_writer_set_str(w, "general.architecture", arch));
    W(gguf_writer_set_u32(w, KEY("context_length"), 64));
    W(gguf_writer_set_u32(w, KEY("embedding_length"), E));
    W(gguf_writer_set_u32(w, KEY("block_count"), glm4moe ? NL + 1 : NL));
    W(gguf_writer_set_u32(w, KEY("feed_forward_length"), F));
    W(gguf_writer_set_u32(w, KEY("attention.head_count"), H));
    W(gguf_writer_set_u32(w, KEY("attention.head_count_kv"), HKV));
    W(gguf_writer_set_u32(w, KEY("attention.key_length"), D));
    W(gguf_writer_set_u32(w, KEY("attention.value_length"), D));
    W(gguf_writer_set_u32(w, KEY("rope.dimension_count"), glm4 || glm4moe ? D / 2 : D));
    W(gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f));
    if (moe) {
        W(gguf_writer_set_u32(w, KEY("expert_count"), X));
        W(gguf_writer_set_u32(w, KEY("expert_used_count"), 1));
    }
    if (glm4moe) {
        W(gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), F));
        W(gguf_writer_set_u32(w, KEY("expert_shared_count"), 1));
        W(gguf_writer_set_u32(w, KEY("leading_dense_block_count"), 1));
        W(gguf_writer_set_u32(w, KEY("expert_gating_func"), 2));
        W(gguf_writer_set_f32(w, KEY("expert_weights_scale"), 2.5f));
        W(gguf_writer_set_bool(w, KEY("expert_weights_norm"), true));
        W(gguf_writer_set_u32(w, KEY("nextn_predict_layers"), 1));
    }
    if (gemma) W(gguf_writer_set_u32(w, KEY("attention.sliding_window"), 4));
    if (phi3) {
        W(gguf_writer_set_f32(w, KEY("rope.scaling.attn_factor"), 1.19f));
        W(gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"), 32));
    }
#undef KEY
    const char *toks[] = {"<unk>", "<s>", "</s>", "<0x41>", "\xe2\x96\x81", "a", "b", "\u2581ab"};
    const float scores[] = {0, 0, 0, 0, -1, -2, -3, -0.5f};
    const int32_t types[] = {2, 3, 3, 6, 1, 1, 1, 1};
    W(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
    W(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, V));
    W(gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, V));
    W(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, V));
    // tensors: name, then up to 3 dims (0 ends)
#define T(nm, a, b, c)                                                                             \
    do {                                                                                           \
        int64_t ne[3] = {a, b, c};                                                                 \
        uint32_t nd = c ? 3 : b ? 2 : 1;                                                           \
        W(gguf_writer_add_tensor(w, nm, nd, ne, KS_DTYPE_F32, zero,                                \
                                 sizeof(float) * (size_t)(a) * (size_t)(b ? b : 1) *               \
                                     (size_t)(c ? c : 1)));                                        \
    } while (0)
    T("token_embd.weight", E, V, 0);
    T("output_norm.weight", E, 0, 0);
    if (!gemma) T("output.weight", E, V, 0);
    if (phi3) { // LongRoPE factors must be positive
        static const float ones[D / 2] = {1, 1, 1, 1};
        int64_t nf[1] = {D / 2};
        W(gguf_writer_add_tensor(w, "rope_factors_short.weight", 1, nf, KS_DTYPE_F32, ones,
                                 sizeof ones));
        W(gguf_writer_add_tensor(w, "rope_factors_long.weight", 1, nf, KS_DTYPE_F32, ones,
                                 sizeof ones));
    }
    char n[96];
    for (int l = 0; l < NL; l++) {
#define L(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
        T(L("attn_norm.weight"), E, 0, 0);
        if (phi3) {
            T(L("attn_qkv.weight"), E, H * D + 2 * HKV * D, 0);
        } else {
            T(L("attn_q.weight"), E, H * D, 0);
            T(L("attn_k.weight"), E, HKV * D, 0);
            T(L("attn_v.weight"), E, HKV * D, 0);
        }
        if (qwen2 || glm4 || glm4moe) {
            T(L("attn_q.bias"), H * D, 0, 0);
            T(L("attn_k.bias"), HKV * D, 0, 0);
            T(L("attn_v.bias"), HKV * D, 0, 0);
        }
        if (qk_norm) {
            T(L("attn_q_norm.weight"), D, 0, 0);
            T(L("attn_k_norm.weight"), D, 0, 0);
        }
        T(L("attn_output.weight"), H * D, E, 0);
        if (gemma || glm4) {
            T(L("post_attention_norm.weight"), E, 0, 0);
            T(L("post_ffw_norm.weight"), E, 0, 0);
        }
        if (glm4moe) // its post_attention_norm is the FFN's input norm
            T(L("post_attention_norm.weight"), E, 0, 0);
        else
            T(L("ffn_norm.weight"), E, 0, 0);
        if (moe && !(glm4moe && l == 0)) {
            T(L("ffn_gate_inp.weight"), E, X, 0);
            T(L("ffn_gate_exps.weight"), E, F, X);
            T(L("ffn_up_exps.weight"), E, F, X);
            T(L("ffn_down_exps.weight"), F, E, X);
            if (glm4moe) {
                T(L("exp_probs_b.bias"), X, 0, 0);
                T(L("ffn_gate_shexp.weight"), E, F, 0);
                T(L("ffn_up_shexp.weight"), E, F, 0);
                T(L("ffn_down_shexp.weight"), F, E, 0);
            }
        } else if (phi3 || glm4) {
            T(L("ffn_up.weight"), E, 2 * F, 0);
            T(L("ffn_down.weight"), F, E, 0);
        } else {
            T(L("ffn_gate.weight"), E, F, 0);
            T(L("ffn_up.weight"), E, F, 0);
            T(L("ffn_down.weight"), F, E, 0);
        }
#undef L
    }
#undef T
    char path[4096];
    snprintf(path, sizeof path, "%s/gguf/%s", root, name);
    ks_errbuf eb;
    die_if(gguf_writer_write(w, path, &eb), path, &eb);
    gguf_writer_destroy(w);
}

// ----------------------------------------------------------------------------
// pd messages and frames

#define ENC(call) die_if((call), #call, NULL)

/* Selector bytes of fuzz_pd_msg.c's table. */
enum {
    S_REGISTER,
    S_REGISTER_ACK,
    S_HEALTH,
    S_HEALTH_ACK,
    S_POOL_CHECK_ACK,
    S_PEER,
    S_LINK,
    S_LINK_ACK,
    S_ERROR,
    S_ADMIT,
    S_GRANT,
    S_DENY,
    S_PREFILL,
    S_REJECT,
    S_ABORT,
    S_ABORT_ACK,
    S_TOKEN,
    S_FINISH,
    S_KV_PAGE,
    S_DONE,
    S_EMBED,
    S_EMBED_RESULT,
    S_PROMPT_LP
};

static void msg_put(const char *name, uint8_t sel, const uint8_t *p, uint32_t len) {
    put("pd_msg", name, &sel, 1, p, len);
}

static uint32_t grant_bytes(uint8_t *buf, size_t cap) {
    pd_msg_grant g = {.seq_uid = 77, .link_epoch = 3, .n_prompt = 20, .page_tokens = 16,
                      .n_pages = 2};
    pd_msg_grant_entry en[2] = {{5, 0, 16, 1}, {9, 16, 4, 2}};
    uint32_t len;
    ENC(pd_msg_grant_encode(&g, en, buf, cap, &len, NULL));
    return len;
}

static void pd_msg_seeds(void) {
    uint8_t b[1024];
    uint32_t n;
    pd_msg_register reg = {.role = PD_ROLE_DECODE,
                           .kv_type = KS_DTYPE_F16,
                           .planes = 2,
                           .n_layer = 2,
                           .kv_dim = 64,
                           .page_tokens = 16,
                           .n_pages = 128,
                           .n_ctx = 512,
                           .data_port = 7071,
                           .model_id = {1, 2, 3},
                           .host = "10.0.0.2",
                           .host_len = 8};
    ENC(pd_msg_register_encode(&reg, b, sizeof b, &n, NULL));
    msg_put("register", S_REGISTER, b, n);
    reg.planes = 1; /* an MLA worker: one row per position */
    reg.kv_dim = 576;
    ENC(pd_msg_register_encode(&reg, b, sizeof b, &n, NULL));
    msg_put("register_mla", S_REGISTER, b, n);
    pd_msg_register_ack ra = {4, 1000, 0x0123456789abcdefull};
    ENC(pd_msg_register_ack_encode(&ra, b, sizeof b, &n, NULL));
    msg_put("register_ack", S_REGISTER_ACK, b, n);
    pd_msg_health h = {42};
    ENC(pd_msg_health_encode(&h, b, sizeof b, &n, NULL));
    msg_put("health", S_HEALTH, b, n);
    pd_msg_health_ack ha = {42, 1, 100, 2, PD_HEALTH_DRAINING};
    ENC(pd_msg_health_ack_encode(&ha, b, sizeof b, &n, NULL));
    msg_put("health_ack", S_HEALTH_ACK, b, n);
    pd_msg_pool_check_ack pc = {1, 0, 128, 0, 0, 0};
    ENC(pd_msg_pool_check_ack_encode(&pc, b, sizeof b, &n, NULL));
    msg_put("pool_check_ack", S_POOL_CHECK_ACK, b, n);
    pd_msg_peer pe = {3, 7071, "decode-1", 8};
    ENC(pd_msg_peer_encode(&pe, b, sizeof b, &n, NULL));
    msg_put("peer", S_PEER, b, n);
    pd_msg_link li = {.prefill_worker_id = 2, .model_id = {1, 2, 3},
                      .router_id = 0x0123456789abcdefull};
    ENC(pd_msg_link_encode(&li, b, sizeof b, &n, NULL));
    msg_put("link", S_LINK, b, n);
    pd_msg_link_ack la = {9};
    ENC(pd_msg_link_ack_encode(&la, b, sizeof b, &n, NULL));
    msg_put("link_ack", S_LINK_ACK, b, n);
    pd_msg_error er = {KS_ERR_PROTO, "bad frame", 9};
    ENC(pd_msg_error_encode(&er, b, sizeof b, &n, NULL));
    msg_put("error", S_ERROR, b, n);
    pd_msg_sampling s = {.max_tokens = 40,
                         .flags = PD_FLAG_LOGPROBS,
                         .seed = 1234,
                         .temperature = 0.7f,
                         .top_p = 0.9f,
                         .min_p = 0.05f,
                         .top_k = 40,
                         .n_probs = 2};
    pd_msg_admit ad = {.n_prompt = 20, .prefill_worker_id = 1, .domain_hash = {9}, .s = s};
    ENC(pd_msg_admit_encode(&ad, b, sizeof b, &n, NULL));
    msg_put("admit", S_ADMIT, b, n);
    n = grant_bytes(b, sizeof b);
    msg_put("grant", S_GRANT, b, n);
    pd_msg_deny de = {PD_DENY_NOSPACE, "pool full", 9};
    ENC(pd_msg_deny_encode(&de, b, sizeof b, &n, NULL));
    msg_put("deny", S_DENY, b, n);
    uint8_t gb[256];
    uint32_t gl = grant_bytes(gb, sizeof gb);
    int32_t toks[20];
    for (int i = 0; i < 20; i++) toks[i] = 100 + i;
    pd_msg_prefill pf = {.decode_worker_id = 3, .n_prompt = 20, .domain_hash = {9}, .s = s,
                         .grant = gb, .grant_len = gl};
    ENC(pd_msg_prefill_encode(&pf, toks, b, sizeof b, &n, NULL));
    msg_put("prefill", S_PREFILL, b, n);
    // the sampling extension (penalties, logit bias, grammar) after each
    static const char gram[] = "root ::= \"yes\" | [0-9]+";
    uint8_t bias[16];
    pd_msg_bias_store(bias, 0, 7, 1.5f);
    pd_msg_bias_store(bias, 1, 300, -100.0f);
    pd_msg_sampling sx = s;
    sx.flags |= PD_FLAG_EXT;
    sx.repeat_penalty = 1.1f;
    sx.repeat_last_n = 64;
    sx.frequency_penalty = 0.5f;
    sx.n_bias = 2;
    sx.bias = bias;
    sx.grammar = gram;
    sx.grammar_len = (uint32_t)strlen(gram);
    ad.s = sx;
    ENC(pd_msg_admit_encode(&ad, b, sizeof b, &n, NULL));
    msg_put("admit_ext", S_ADMIT, b, n);
    pf.s = sx;
    ENC(pd_msg_prefill_encode(&pf, toks, b, sizeof b, &n, NULL));
    msg_put("prefill_ext", S_PREFILL, b, n);
    pd_msg_reject rj = {ADMIT_CONTEXT_LENGTH, "too long", 8};
    ENC(pd_msg_reject_encode(&rj, b, sizeof b, &n, NULL));
    msg_put("reject", S_REJECT, b, n);
    pd_msg_abort ab = {PD_ABORT_CLIENT_GONE};
    ENC(pd_msg_abort_encode(&ab, b, sizeof b, &n, NULL));
    msg_put("abort", S_ABORT, b, n);
    msg_put("abort_ack", S_ABORT_ACK, b, 0);
    pd_msg_top top[2] = {{5, -0.1f}, {6, -2.5f}};
    pd_msg_token tk = {.token = 5, .logprob = -0.1f, .n_top = 2};
    ENC(pd_msg_token_encode(&tk, top, b, sizeof b, &n, NULL));
    msg_put("token", S_TOKEN, b, n);
    pd_msg_finish fi = {PD_FINISH_ERROR, 20, 7, KS_ERR_INVAL, NULL, 0, 16, ADMIT_DRAINING};
    ENC(pd_msg_finish_encode(&fi, b, sizeof b, &n, NULL));
    msg_put("finish", S_FINISH, b, n);
    /* KV_PAGE: geometry index 1 of fuzz_pd_msg.c ({2, 64, 16}), frame_len, header */
    kv_geom g = {2, 64, 16, KS_DTYPE_F32, 2};
    pd_msg_kv_page kp = {1, 9, 77, 2, 4, 0, 2};
    b[0] = 1;
    pd_store_u32(b + 1, (uint32_t)pd_msg_kv_page_len(&g, 4, 2));
    ENC(pd_msg_kv_page_encode(&kp, &g, b + 5, sizeof b - 5, &n, NULL));
    msg_put("kv_page", S_KV_PAGE, b, n + 5);
    /* the same header on geometry index 6, a 1-plane (MLA) link */
    kv_geom g1 = {2, 576, 16, KS_DTYPE_F16, 1};
    b[0] = 6;
    pd_store_u32(b + 1, (uint32_t)pd_msg_kv_page_len(&g1, 4, 2));
    ENC(pd_msg_kv_page_encode(&kp, &g1, b + 5, sizeof b - 5, &n, NULL));
    msg_put("kv_page_mla", S_KV_PAGE, b, n + 5);
    pd_msg_done dn = {.covered = 20, .first_token = 5, .logprob = -0.1f, .n_top = 2,
                      .rng_state = 99, .cached = 16};
    ENC(pd_msg_done_encode(&dn, top, b, sizeof b, &n, NULL));
    msg_put("done", S_DONE, b, n);
    pd_msg_embed em = {.pooling = 1, .n_tokens = 20, .domain_hash = {9}};
    ENC(pd_msg_embed_encode(&em, toks, b, sizeof b, &n, NULL));
    msg_put("embed", S_EMBED, b, n);
    float vec[16];
    for (int i = 0; i < 16; i++)
        vec[i] = (float)i / 16.0f - 0.5f;
    pd_msg_embed_result er2 = {.n_embd = 16, .n_tokens = 20, .pooling = 3};
    ENC(pd_msg_embed_result_encode(&er2, vec, b, sizeof b, &n, NULL));
    msg_put("embed_result", S_EMBED_RESULT, b, n);
    /* PROMPT_LP: a middle chunk of 3 records with 2 alternatives, and the
     * LAST one of a one-token prompt (no records) */
    int32_t lt[3] = {261, 7, 0};
    float ll[3] = {-0.5f, -7.25f, -30.0f};
    pd_msg_top lt2[6] = {{261, -0.5f}, {5, -1.0f},  {9, -2.0f},
                         {7, -7.25f},  {0, -30.0f}, {1, -31.0f}};
    pd_msg_prompt_lp pl = {.first_pos = 65, .n_records = 3, .n_top = 2};
    ENC(pd_msg_prompt_lp_encode(&pl, lt, ll, lt2, b, sizeof b, &n, NULL));
    msg_put("prompt_lp", S_PROMPT_LP, b, n);
    pd_msg_prompt_lp pll = {.first_pos = 1, .flags = PD_PROMPT_LP_LAST};
    ENC(pd_msg_prompt_lp_encode(&pll, NULL, NULL, NULL, b, sizeof b, &n, NULL));
    msg_put("prompt_lp_last", S_PROMPT_LP, b, n);
}

/* A stream of frames: HEALTH, an empty POOL_CHECK, a KV_PAGE-sized one. */
static void pd_wire_seeds(void) {
    uint8_t s[2048], p[512];
    size_t off = 0, k;
    uint32_t n;
    pd_msg_health h = {1};
    ENC(pd_msg_health_encode(&h, p, sizeof p, &n, NULL));
    ENC(pd_frame_encode(s + off, sizeof s - off, PD_MSG_HEALTH, 0, p, n, 65536, &k, NULL));
    off += k;
    ENC(pd_frame_encode(s + off, sizeof s - off, PD_MSG_POOL_CHECK, 12, NULL, 0, 65536, &k, NULL));
    off += k;
    for (int i = 0; i < 200; i++) p[i] = (uint8_t)(i * 7);
    ENC(pd_frame_encode(s + off, sizeof s - off, PD_MSG_KV_PAGE, 5, p, 200, 65536, &k, NULL));
    off += k;
    /* mode bytes: see fuzz_pd_wire.c */
    static const struct { const char *name; uint8_t mode; } modes[] = {
        {"feed_all", 0x00}, {"feed_by7", 0x0e}, {"transport_all", 0x40},
        {"transport_by5", 0x4a}, {"fix_transport_by1", 0x43},
    };
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        put("pd_wire", modes[i].name, &modes[i].mode, 1, s, off);
    /* a handshake-sized frame under the small pre-auth limit */
    memset(p, 0xab, 36);
    ENC(pd_frame_encode(s, sizeof s, PD_TYPE_HELLO, 0, p, 36, PD_MAX_PAYLOAD_UNAUTH, &k, NULL));
    uint8_t mode = 0x80;
    put("pd_wire", "hello_unauth", &mode, 1, s, k);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s tests/fuzz/corpus\n", argv[0]);
        return 2;
    }
    root = argv[1];
    gguf_seed("spm.gguf", false);
    gguf_seed("bpe.gguf", true);
    static const char *archs[] = {"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "glm4"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "model-%s.gguf", archs[i]);
        model_seed(name, archs[i], false);
    }
    model_seed("model-llama-moe.gguf", "llama", true);
    model_seed("model-qwen3moe.gguf", "qwen3moe", true);
    model_seed("model-glm4moe.gguf", "glm4moe", true);
    pd_msg_seeds();
    pd_wire_seeds();
    return 0;
}
