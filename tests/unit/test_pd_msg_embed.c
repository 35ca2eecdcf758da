/* test_pd_msg_embed.c — the EMBED / EMBED_RESULT codecs (issue 13,
 * docs/pd-protocol.md section 4): round trips with the values intact
 * (floats bit for bit), the frame bounds in pd_msg_type_max, and PROTO for
 * every malformed payload: each truncation, a wrong length field, n_tokens
 * 0, an unknown pooling, n_embd 0 or above the bound; the encoders refuse
 * what the decoders would. */
#include "kvseal/pd.h"
#include "kvseal/pd_msg.h"

#include "../check.h"

#include <math.h>

static void test_embed(void) {
    int32_t toks[5] = {1, 42, 7, 2047, 0};
    pd_msg_embed m = {.pooling = 3, .n_tokens = 5, .domain_hash = {9, 8, 7}};
    uint8_t buf[256];
    uint32_t n = 0;
    ks_errbuf eb;
    CHECK_EQ(pd_msg_embed_encode(&m, toks, NULL, 0, &n, &eb), KS_OK); // size only
    CHECK_EQ(n, 40u + 4 * 5);
    CHECK_EQ(pd_msg_embed_encode(&m, toks, buf, 10, &n, &eb), KS_ERR_NOSPACE);
    CHECK_EQ(pd_msg_embed_encode(&m, toks, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 60u);
    CHECK_EQ(pd_load_u32(buf), 3u);     // pooling at 0
    CHECK_EQ(pd_load_u32(buf + 4), 5u); // n_tokens at 4
    CHECK_EQ(buf[8], 9);                // domain_hash at 8
    pd_msg_embed d;
    CHECK_EQ(pd_msg_embed_decode(buf, n, &d, &eb), KS_OK);
    CHECK_EQ(d.pooling, 3u);
    CHECK_EQ(d.n_tokens, 5u);
    CHECK_MEM_EQ(d.domain_hash, m.domain_hash, 32);
    for (uint32_t i = 0; i < 5; i++)
        CHECK_EQ(pd_msg_embed_token(&d, i), toks[i]);
    // every truncation and an extra byte
    for (uint32_t len = 0; len < n; len++)
        CHECK_EQ(pd_msg_embed_decode(buf, len, &d, &eb), KS_ERR_PROTO);
    CHECK_EQ(pd_msg_embed_decode(buf, n + 1, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "n_tokens implies");
    // n_tokens 0, a pooling outside {0, 1, 3}
    uint8_t bad[60];
    memcpy(bad, buf, n);
    pd_store_u32(bad + 4, 0);
    CHECK_EQ(pd_msg_embed_decode(bad, 40, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "n_tokens is 0");
    memcpy(bad, buf, n);
    pd_store_u32(bad, 2);
    CHECK_EQ(pd_msg_embed_decode(bad, n, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "pooling 2");
    pd_store_u32(bad, 0); // the worker's own: fine
    CHECK_EQ(pd_msg_embed_decode(bad, n, &d, &eb), KS_OK);
    m.pooling = 7;
    CHECK_EQ(pd_msg_embed_encode(&m, toks, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    m.pooling = 1;
    m.n_tokens = 0;
    CHECK_EQ(pd_msg_embed_encode(&m, toks, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    m.n_tokens = PD_MSG_EMBED_MAX; // far past the frame bound
    CHECK_EQ(pd_msg_embed_encode(&m, toks, NULL, 0, &n, &eb), KS_ERR_INVAL);
}

static void test_embed_result(void) {
    float vec[4] = {0.5f, -0.25f, 1e-30f, -0.0f};
    pd_msg_embed_result m = {.n_embd = 4, .n_tokens = 12, .pooling = 1};
    uint8_t buf[64];
    uint32_t n = 0;
    ks_errbuf eb;
    CHECK_EQ(pd_msg_embed_result_encode(&m, vec, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 16u + 16);
    pd_msg_embed_result d;
    CHECK_EQ(pd_msg_embed_result_decode(buf, n, &d, &eb), KS_OK);
    CHECK_EQ(d.n_embd, 4u);
    CHECK_EQ(d.n_tokens, 12u);
    CHECK_EQ(d.pooling, 1u);
    for (uint32_t i = 0; i < 4; i++) {
        float v = pd_msg_embed_value(&d, i);
        CHECK_MEM_EQ(&v, &vec[i], sizeof v); // bit for bit (-0 and denormal-range included)
    }
    for (uint32_t len = 0; len < n; len++)
        CHECK_EQ(pd_msg_embed_result_decode(buf, len, &d, &eb), KS_ERR_PROTO);
    uint8_t bad[64];
    memcpy(bad, buf, n);
    pd_store_u32(bad, 0); // n_embd 0
    CHECK_EQ(pd_msg_embed_result_decode(bad, 16, &d, &eb), KS_ERR_PROTO);
    pd_store_u32(bad, PD_MSG_EMBED_MAX_DIM + 1);
    CHECK_EQ(pd_msg_embed_result_decode(bad, n, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "out of range");
    memcpy(bad, buf, n);
    pd_store_u32(bad + 4, 0); // n_tokens 0
    CHECK_EQ(pd_msg_embed_result_decode(bad, n, &d, &eb), KS_ERR_PROTO);
    memcpy(bad, buf, n);
    pd_store_u32(bad + 8, 0); // pooling must say what was used: 1 or 3
    CHECK_EQ(pd_msg_embed_result_decode(bad, n, &d, &eb), KS_ERR_PROTO);
    m.pooling = 0;
    CHECK_EQ(pd_msg_embed_result_encode(&m, vec, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    m.pooling = 3;
    m.n_embd = 0;
    CHECK_EQ(pd_msg_embed_result_encode(&m, vec, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
}

static void test_bounds(void) {
    uint32_t tm[PD_MSG_N_TYPES];
    ks_errbuf eb;
    CHECK_EQ(pd_msg_type_max(NULL, tm, &eb), KS_OK);
    CHECK_EQ(tm[PD_MSG_EMBED], PD_MSG_EMBED_MAX);
    CHECK_EQ(tm[PD_MSG_EMBED_RESULT], 16u + 4u * PD_MSG_EMBED_MAX_DIM);
    CHECK_STR_EQ(pd_msg_type_name(PD_MSG_EMBED), "EMBED");
    CHECK_STR_EQ(pd_msg_type_name(PD_MSG_EMBED_RESULT), "EMBED_RESULT");
    CHECK(PD_MSG_EMBED_RESULT < PD_MSG_N_TYPES);
}

int main(void) {
    test_embed();
    test_embed_result();
    test_bounds();
    printf("pd_msg embed ok\n");
    return 0;
}
