/* fuzz_pd_msg.c — libFuzzer harness for the pd message decoders
 * (src/pd/msg.c, include/kvseal/pd_msg.h).
 *
 * Input: one selector byte (which message, modulo the table below), then the
 * payload. KV_PAGE takes a further byte choosing a link geometry and a u32 LE
 * frame length before its header bytes. A payload that decodes is re-encoded
 * from the decoded struct (the encoder applies the decoder's rules, so it
 * must accept it), and the result must decode and re-encode to the very same
 * bytes: decoding loses nothing the encoder needs, and reserved fields are
 * the only difference from the input. Variable parts are read back through
 * the *_at accessors over their whole length (ASan sees any read past the
 * payload: libFuzzer's buffer is exactly `size` bytes). Built only with
 * KS_FUZZ=ON; see tests/fuzz/README.md. */
#include "kvseal/pd.h"
#include "kvseal/pd_msg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Decodes p[0..len) and re-encodes it into out (cap bytes): KS_OK when both
 * worked, the decoder's error otherwise; an encoder failure aborts. */
typedef ks_err (*fz_rt_fn)(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,
                           uint32_t *out_len);

#define FZ_ENC(call)                                                                          \
    do {                                                                                      \
        if ((call) != KS_OK) abort(); /* what we accept we must be able to send */            \
    } while (0)

#define FZ_SIMPLE(name, T)                                                                    \
    static ks_err fz__##name(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,        \
                             uint32_t *out_len) {                                             \
        T m;                                                                                  \
        ks_err e = pd_msg_##name##_decode(p, len, &m, NULL);                                  \
        if (e) return e;                                                                      \
        FZ_ENC(pd_msg_##name##_encode(&m, out, cap, out_len, NULL));                          \
        return KS_OK;                                                                         \
    }

FZ_SIMPLE(register, pd_msg_register)
FZ_SIMPLE(register_ack, pd_msg_register_ack)
FZ_SIMPLE(health, pd_msg_health)
FZ_SIMPLE(health_ack, pd_msg_health_ack)
FZ_SIMPLE(pool_check_ack, pd_msg_pool_check_ack)
FZ_SIMPLE(peer, pd_msg_peer)
FZ_SIMPLE(link, pd_msg_link)
FZ_SIMPLE(link_ack, pd_msg_link_ack)
FZ_SIMPLE(error, pd_msg_error)
FZ_SIMPLE(admit, pd_msg_admit)
FZ_SIMPLE(deny, pd_msg_deny)
FZ_SIMPLE(reject, pd_msg_reject)
FZ_SIMPLE(abort, pd_msg_abort)
FZ_SIMPLE(finish, pd_msg_finish)

static ks_err fz__abort_ack(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,
                            uint32_t *out_len) {
    (void)out, (void)cap;
    *out_len = 0;
    return pd_msg_abort_ack_decode(p, len, NULL);
}

static pd_msg_grant_entry *fz__entries(const pd_msg_grant *g) {
    pd_msg_grant_entry *en = malloc((g->n_pages ? g->n_pages : 1) * sizeof *en);
    if (!en) abort();
    for (uint32_t i = 0; i < g->n_pages; i++) en[i] = pd_msg_grant_entry_at(g, i);
    return en;
}

static ks_err fz__grant(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,
                        uint32_t *out_len) {
    pd_msg_grant m;
    ks_err e = pd_msg_grant_decode(p, len, &m, NULL);
    if (e) return e;
    pd_msg_grant_entry *en = fz__entries(&m);
    FZ_ENC(pd_msg_grant_encode(&m, en, out, cap, out_len, NULL));
    free(en);
    return KS_OK;
}

static ks_err fz__prefill(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,
                          uint32_t *out_len) {
    pd_msg_prefill m;
    ks_err e = pd_msg_prefill_decode(p, len, &m, NULL);
    if (e) return e;
    int32_t *tok = malloc((m.n_prompt ? m.n_prompt : 1) * sizeof *tok);
    if (!tok) abort();
    for (uint32_t i = 0; i < m.n_prompt; i++) tok[i] = pd_msg_prefill_token(&m, i);
    pd_msg_grant g;
    if (pd_msg_prefill_grant(&m, &g, NULL) == KS_OK) {
        if (g.n_prompt != m.n_prompt) abort();
        free(fz__entries(&g));
    }
    FZ_ENC(pd_msg_prefill_encode(&m, tok, out, cap, out_len, NULL));
    free(tok);
    return KS_OK;
}

static pd_msg_top *fz__tops(const uint8_t *raw, uint32_t n) {
    pd_msg_top *t = malloc((n ? n : 1) * sizeof *t);
    if (!t) abort();
    for (uint32_t i = 0; i < n; i++) t[i] = pd_msg_top_at(raw, i);
    return t;
}

static ks_err fz__token(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,
                        uint32_t *out_len) {
    pd_msg_token m;
    ks_err e = pd_msg_token_decode(p, len, &m, NULL);
    if (e) return e;
    pd_msg_top *t = fz__tops(m.top, m.n_top);
    FZ_ENC(pd_msg_token_encode(&m, t, out, cap, out_len, NULL));
    free(t);
    return KS_OK;
}

static ks_err fz__done(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,
                       uint32_t *out_len) {
    pd_msg_done m;
    ks_err e = pd_msg_done_decode(p, len, &m, NULL);
    if (e) return e;
    pd_msg_top *t = fz__tops(m.top, m.n_top);
    FZ_ENC(pd_msg_done_encode(&m, t, out, cap, out_len, NULL));
    free(t);
    return KS_OK;
}

/* KV_PAGE: p = {geometry u8, frame_len u32 LE, header bytes...}. The
 * re-encoding keeps the first 5 bytes so that it can be decoded the same way. */
/* Append-only (the corpus names geometries by index); planes 0 means 2 (one
 * link says so by the zero value), the last two are 1-plane (MLA) links: a
 * 576-element latent+RoPE row, and Q8_0 pages of 2 mod 4 bytes. */
static const kv_geom fz__geoms[] = {{1, 8, 16, KS_DTYPE_F32, 2, 0},    {2, 64, 16, KS_DTYPE_F32, 2, 0},
                                    {22, 256, 16, KS_DTYPE_F32, 2, 0}, {4, 32, 1, KS_DTYPE_F32, 2, 0},
                                    {2, 64, 16, KS_DTYPE_F16, 0, 0},   {4, 64, 4, KS_DTYPE_Q8_0, 2, 0},
                                    {2, 576, 16, KS_DTYPE_F16, 1, 0},  {3, 32, 5, KS_DTYPE_Q8_0, 1, 0}};

static ks_err fz__kv_page(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,
                          uint32_t *out_len) {
    if (len < 5) return KS_ERR_PROTO;
    const kv_geom *g = &fz__geoms[p[0] % (sizeof fz__geoms / sizeof fz__geoms[0])];
    uint32_t frame_len = pd_load_u32(p + 1);
    pd_msg_kv_page m;
    ks_err e = pd_msg_kv_page_decode(p + 5, len - 5, frame_len, g, &m, NULL);
    if (e) return e;
    if (pd_msg_kv_page_len(g, m.n_rows, m.layer_count) != frame_len) abort();
    if (cap < 5) abort();
    memcpy(out, p, 5);
    FZ_ENC(pd_msg_kv_page_encode(&m, g, out + 5, cap - 5, out_len, NULL));
    *out_len += 5;
    return KS_OK;
}

/* EMBED / EMBED_RESULT (issue 13): tokens and values read back through
 * their accessors over the whole length. */
static ks_err fz__embed(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,
                        uint32_t *out_len) {
    pd_msg_embed m;
    ks_err e = pd_msg_embed_decode(p, len, &m, NULL);
    if (e) return e;
    int32_t *t = malloc(sizeof(int32_t) * m.n_tokens);
    if (!t) abort();
    for (uint32_t i = 0; i < m.n_tokens; i++)
        t[i] = pd_msg_embed_token(&m, i);
    FZ_ENC(pd_msg_embed_encode(&m, t, out, cap, out_len, NULL));
    free(t);
    return KS_OK;
}

static ks_err fz__embed_result(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,
                               uint32_t *out_len) {
    pd_msg_embed_result m;
    ks_err e = pd_msg_embed_result_decode(p, len, &m, NULL);
    if (e) return e;
    float *v = malloc(sizeof(float) * m.n_embd);
    if (!v) abort();
    for (uint32_t i = 0; i < m.n_embd; i++)
        v[i] = pd_msg_embed_value(&m, i);
    FZ_ENC(pd_msg_embed_result_encode(&m, v, out, cap, out_len, NULL));
    free(v);
    return KS_OK;
}

/* PROMPT_LP (echo, issue 12): every record and alternative read back
 * through the accessors over the whole length. */
static ks_err fz__prompt_lp(const uint8_t *p, uint32_t len, uint8_t *out, size_t cap,
                            uint32_t *out_len) {
    pd_msg_prompt_lp m;
    ks_err e = pd_msg_prompt_lp_decode(p, len, &m, NULL);
    if (e) return e;
    uint32_t n = m.n_records ? m.n_records : 1, k = m.n_top ? m.n_top : 1;
    int32_t *t = malloc(sizeof(int32_t) * n);
    float *lp = malloc(sizeof(float) * n);
    pd_msg_top *top = malloc(sizeof(pd_msg_top) * (size_t)n * k);
    if (!t || !lp || !top) abort();
    for (uint32_t i = 0; i < m.n_records; i++) {
        pd_msg_prompt_lp_record(&m, i, &t[i], &lp[i]);
        for (uint32_t j = 0; j < m.n_top; j++)
            top[(size_t)i * m.n_top + j] = pd_msg_prompt_lp_top(&m, i, j);
    }
    FZ_ENC(pd_msg_prompt_lp_encode(&m, t, lp, top, out, cap, out_len, NULL));
    free(t);
    free(lp);
    free(top);
    return KS_OK;
}

static const fz_rt_fn fz__table[] = {
    fz__register, fz__register_ack, fz__health, fz__health_ack,   fz__pool_check_ack, fz__peer,
    fz__link,     fz__link_ack,     fz__error,  fz__admit,        fz__grant,          fz__deny,
    fz__prefill,  fz__reject,       fz__abort,  fz__abort_ack,    fz__token,          fz__finish,
    fz__kv_page,  fz__done,         fz__embed,  fz__embed_result, fz__prompt_lp,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size - 1 > UINT32_MAX) return 0;
    fz_rt_fn rt = fz__table[data[0] % (sizeof fz__table / sizeof fz__table[0])];
    /* a copy of exactly the payload, so ASan bounds every read of it */
    uint32_t len = (uint32_t)(size - 1);
    uint8_t *p = malloc(len ? len : 1);
    if (!p) abort();
    memcpy(p, data + 1, len);
    size_t cap = (size_t)len + 64;
    uint8_t *a = malloc(cap), *b = malloc(cap);
    if (!a || !b) abort();
    uint32_t a_len = 0, b_len = 0;
    if (rt(p, len, a, cap, &a_len) == KS_OK) {
        if (a_len > cap) abort();
        uint8_t *a_exact = malloc(a_len ? a_len : 1);
        if (!a_exact) abort();
        memcpy(a_exact, a, a_len);
        if (rt(a_exact, a_len, b, cap, &b_len) != KS_OK) abort();
        if (b_len != a_len || memcmp(a, b, a_len) != 0) abort();
        free(a_exact);
    }
    free(a);
    free(b);
    free(p);
    return 0;
}
