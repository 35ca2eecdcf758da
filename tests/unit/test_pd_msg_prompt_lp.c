/* test_pd_msg_prompt_lp.c — the PROMPT_LP codec (echo with prompt
 * logprobs through the router, issue 12; docs/pd-protocol.md section 4):
 * the wire layout at its documented offsets, round trips with every value
 * intact (floats bit for bit), the frame bound in pd_msg_type_max, the
 * PD_FLAG_PROMPT_LP sampling flag, and PROTO for every malformed payload:
 * each truncation and an extra byte, a record count or n_top past its
 * bound, a length that disagrees with them, first_pos 0, an unknown flag,
 * an empty non-last message, positions past 2^31; the encoder refuses what
 * the decoder would. */
#include "kvseal/pd.h"
#include "kvseal/pd_msg.h"

#include "../check.h"

#include <math.h>
#include <stdlib.h>

/* Three records with two alternatives each, starting at position 5. */
static uint32_t sample3(uint8_t *buf, size_t cap, uint32_t flags) {
    int32_t toks[3] = {17, 2047, 0};
    float lps[3] = {-0.25f, -7.3312087059021f, -INFINITY};
    pd_msg_top top[6] = {{17, -0.25f}, {3, -1.5f}, {9, -0.5f}, {2047, -7.3312087059021f},
                         {0, -30.0f},  {1, -31.0f}};
    pd_msg_prompt_lp m = {.first_pos = 5, .n_records = 3, .n_top = 2, .flags = flags};
    uint32_t n = 0;
    ks_errbuf eb;
    CHECK_EQ(pd_msg_prompt_lp_encode(&m, toks, lps, top, buf, cap, &n, &eb), KS_OK);
    return n;
}

static void test_layout_and_round_trip(void) {
    uint8_t buf[256];
    uint32_t n = 0;
    ks_errbuf eb;
    int32_t toks[3] = {17, 2047, 0};
    pd_msg_top top[6] = {{0, 0.0f}};
    pd_msg_prompt_lp m = {.first_pos = 5, .n_records = 3, .n_top = 2, .flags = PD_PROMPT_LP_LAST};
    float lps[3] = {0};
    CHECK_EQ(pd_msg_prompt_lp_encode(&m, toks, lps, top, NULL, 0, &n, &eb), KS_OK); // size only
    CHECK_EQ(n, 16u + 3 * (8 + 8 * 2));
    CHECK_EQ(pd_msg_prompt_lp_encode(&m, toks, lps, top, buf, 20, &n, &eb), KS_ERR_NOSPACE);

    n = sample3(buf, sizeof buf, PD_PROMPT_LP_LAST);
    CHECK_EQ(n, 88u);
    CHECK_EQ(pd_load_u32(buf), 5u);               // first_pos at 0
    CHECK_EQ(pd_load_u32(buf + 4), 3u);           // n_records at 4
    CHECK_EQ(pd_load_u32(buf + 8), 2u);           // n_top at 8
    CHECK_EQ(pd_load_u32(buf + 12), 1u);          // flags at 12 (LAST)
    CHECK_EQ(pd_load_u32(buf + 16), 17u);         // record 0: token
    CHECK_EQ(pd_load_u32(buf + 16 + 8), 17u);     // record 0: alternative 0 id
    CHECK_EQ(pd_load_u32(buf + 16 + 24), 2047u);  // record 1 starts 8 + 16 bytes later
    CHECK_EQ(pd_load_u32(buf + 16 + 48 + 8), 0u); // record 2: alternative 0 id

    pd_msg_prompt_lp d;
    CHECK_EQ(pd_msg_prompt_lp_decode(buf, n, &d, &eb), KS_OK);
    CHECK_EQ(d.first_pos, 5u);
    CHECK_EQ(d.n_records, 3u);
    CHECK_EQ(d.n_top, 2u);
    CHECK_EQ(d.flags, (uint32_t)PD_PROMPT_LP_LAST);
    int32_t t;
    float lp;
    pd_msg_prompt_lp_record(&d, 1, &t, &lp);
    CHECK_EQ(t, 2047);
    CHECK(lp == -7.3312087059021f); // bit for bit
    pd_msg_prompt_lp_record(&d, 2, &t, &lp);
    CHECK_EQ(t, 0);
    CHECK(isinf(lp) && lp < 0);
    pd_msg_top a = pd_msg_prompt_lp_top(&d, 1, 1);
    CHECK_EQ(a.id, 2047);
    CHECK(a.logprob == -7.3312087059021f);
    a = pd_msg_prompt_lp_top(&d, 2, 0);
    CHECK_EQ(a.id, 0);
    CHECK(a.logprob == -30.0f);
    a = pd_msg_prompt_lp_top(&d, 2, 1);
    CHECK_EQ(a.id, 1);
    CHECK(a.logprob == -31.0f);

    // a one-token prompt: one empty LAST message; records without alternatives
    pd_msg_prompt_lp e = {.first_pos = 1, .n_records = 0, .n_top = 0, .flags = PD_PROMPT_LP_LAST};
    CHECK_EQ(pd_msg_prompt_lp_encode(&e, NULL, NULL, NULL, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 16u);
    CHECK_EQ(pd_msg_prompt_lp_decode(buf, n, &d, &eb), KS_OK);
    CHECK_EQ(d.n_records, 0u);
    e.n_records = 2;
    e.flags = 0;
    float lp2[2] = {-1.0f, -2.0f};
    CHECK_EQ(pd_msg_prompt_lp_encode(&e, toks, lp2, NULL, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 16u + 2 * 8);
    CHECK_EQ(pd_msg_prompt_lp_decode(buf, n, &d, &eb), KS_OK);
    pd_msg_prompt_lp_record(&d, 1, &t, &lp);
    CHECK(t == 2047 && lp == -2.0f);
}

static void test_bounds(void) {
    uint32_t tm[PD_MSG_N_TYPES];
    ks_errbuf eb;
    CHECK_EQ(pd_msg_type_max(NULL, tm, &eb), KS_OK);
    CHECK_EQ(PD_MSG_PROMPT_LP, 0x22);
    CHECK(PD_MSG_PROMPT_LP < PD_MSG_N_TYPES);
    CHECK_STR_EQ(pd_msg_type_name(PD_MSG_PROMPT_LP), "PROMPT_LP");
    CHECK_STR_EQ(pd_msg_type_name(0x23), "UNKNOWN");
    CHECK_EQ(tm[PD_MSG_PROMPT_LP], 16u + 256u * (8u + 8u * 64u));
    CHECK_EQ(PD_MSG_PROMPT_LP_MAX, tm[PD_MSG_PROMPT_LP]);

    // the largest message the bound allows encodes, decodes and fits it
    const uint32_t R = PD_MSG_PROMPT_LP_MAX_RECORDS, K = PD_MSG_MAX_TOP;
    int32_t *toks = calloc(R, sizeof *toks);
    float *lps = calloc(R, sizeof *lps);
    pd_msg_top *top = calloc((size_t)R * K, sizeof *top);
    uint8_t *buf = malloc(PD_MSG_PROMPT_LP_MAX + 8);
    CHECK(toks && lps && top && buf);
    pd_msg_prompt_lp m = {.first_pos = 1, .n_records = R, .n_top = K};
    uint32_t n = 0;
    CHECK_EQ(pd_msg_prompt_lp_encode(&m, toks, lps, top, buf, PD_MSG_PROMPT_LP_MAX, &n, &eb),
             KS_OK);
    CHECK_EQ(n, PD_MSG_PROMPT_LP_MAX);
    pd_msg_prompt_lp d;
    CHECK_EQ(pd_msg_prompt_lp_decode(buf, n, &d, &eb), KS_OK);
    // one record or one alternative more: refused both ways
    m.n_records = R + 1;
    CHECK_EQ(pd_msg_prompt_lp_encode(&m, toks, lps, top, NULL, 0, &n, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "n_records 257 exceeds 256");
    m.n_records = 1;
    m.n_top = K + 1;
    CHECK_EQ(pd_msg_prompt_lp_encode(&m, toks, lps, top, NULL, 0, &n, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "n_top 65 exceeds 64");
    pd_store_u32(buf + 4, R + 1);
    CHECK_EQ(pd_msg_prompt_lp_decode(buf, PD_MSG_PROMPT_LP_MAX, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "PROMPT_LP: n_records 257 exceeds 256");
    pd_store_u32(buf + 4, 1);
    pd_store_u32(buf + 8, K + 1);
    CHECK_EQ(pd_msg_prompt_lp_decode(buf, 16 + 8 + 8 * (K + 1), &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "PROMPT_LP: n_top 65 exceeds 64");
    free(toks);
    free(lps);
    free(top);
    free(buf);

    // the PREFILL/ADMIT flag that asks for the records
    CHECK_EQ(PD_FLAG_PROMPT_LP, 8u);
}

static void test_refusals(void) {
    uint8_t buf[256], bad[256];
    ks_errbuf eb;
    pd_msg_prompt_lp d;
    uint32_t n = sample3(buf, sizeof buf, 0);
    CHECK_EQ(pd_msg_prompt_lp_decode(buf, n, &d, &eb), KS_OK);
    // every truncation and an extra byte
    for (uint32_t len = 0; len < n; len++)
        CHECK_EQ(pd_msg_prompt_lp_decode(buf, len, &d, &eb), KS_ERR_PROTO);
    CHECK_EQ(pd_msg_prompt_lp_decode(buf, 8, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "shorter than its fixed part (16)");
    CHECK_EQ(pd_msg_prompt_lp_decode(buf, 40, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "PROMPT_LP: n_records implies 88 payload bytes but len is 40");
    CHECK_EQ(pd_msg_prompt_lp_decode(buf, n + 1, &d, &eb), KS_ERR_PROTO);
    // a count that disagrees with len (records must not be read past it)
    memcpy(bad, buf, n);
    pd_store_u32(bad + 4, 4);
    CHECK_EQ(pd_msg_prompt_lp_decode(bad, n, &d, &eb), KS_ERR_PROTO);
    memcpy(bad, buf, n);
    pd_store_u32(bad + 8, 3);
    CHECK_EQ(pd_msg_prompt_lp_decode(bad, n, &d, &eb), KS_ERR_PROTO);
    // position 0 has no logprob: no record may be for it
    memcpy(bad, buf, n);
    pd_store_u32(bad, 0);
    CHECK_EQ(pd_msg_prompt_lp_decode(bad, n, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "first_pos is 0");
    // positions beyond any prompt
    pd_store_u32(bad, 0x7ffffffeu);
    CHECK_EQ(pd_msg_prompt_lp_decode(bad, n, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "out of range");
    pd_store_u32(bad, 0x7ffffffdu); // the last three positions below 2^31: fine
    CHECK_EQ(pd_msg_prompt_lp_decode(bad, n, &d, &eb), KS_OK);
    // unknown flags
    memcpy(bad, buf, n);
    pd_store_u32(bad + 12, 2);
    CHECK_EQ(pd_msg_prompt_lp_decode(bad, n, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "flags 0x2 has unknown bits");
    // no records is only the LAST message of a one-token prompt
    memset(bad, 0, 16);
    pd_store_u32(bad, 1);
    CHECK_EQ(pd_msg_prompt_lp_decode(bad, 16, &d, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "no records and not the last message");
    pd_store_u32(bad + 12, PD_PROMPT_LP_LAST);
    CHECK_EQ(pd_msg_prompt_lp_decode(bad, 16, &d, &eb), KS_OK);
    // the encoder refuses what the decoder does
    int32_t toks[1] = {1};
    float lps[1] = {-1.0f};
    pd_msg_prompt_lp m = {.first_pos = 0, .n_records = 1};
    uint32_t len = 0;
    CHECK_EQ(pd_msg_prompt_lp_encode(&m, toks, lps, NULL, bad, sizeof bad, &len, &eb),
             KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "first_pos is 0");
    m = (pd_msg_prompt_lp){.first_pos = 1, .n_records = 0};
    CHECK_EQ(pd_msg_prompt_lp_encode(&m, toks, lps, NULL, bad, sizeof bad, &len, &eb),
             KS_ERR_INVAL);
    m = (pd_msg_prompt_lp){.first_pos = 1, .n_records = 1, .flags = 4};
    CHECK_EQ(pd_msg_prompt_lp_encode(&m, toks, lps, NULL, bad, sizeof bad, &len, &eb),
             KS_ERR_INVAL);
}

/* Random bytes and mutated samples: never anything but OK or PROTO with a
 * message, never a read past len (ASan). */
static void test_random(void) {
    uint8_t smp[256], buf[300];
    uint32_t sn = sample3(smp, sizeof smp, PD_PROMPT_LP_LAST);
    uint32_t x = 12345;
    long ok = 0;
    for (int it = 0; it < 20000; it++) {
        uint32_t n = sn;
        memcpy(buf, smp, sn);
        int flips = 1 + it % 4;
        for (int f = 0; f < flips; f++) {
            x = x * 1103515245u + 12345u;
            buf[(x >> 8) % sn] = (uint8_t)(x >> 16);
        }
        if (it % 3 == 0) n = (x >> 4) % (sn + 16);
        uint8_t *p = malloc(n ? n : 1); // exact-size copy: ASan sees any overread
        CHECK(p);
        memcpy(p, buf, n);
        pd_msg_prompt_lp d;
        ks_errbuf eb;
        ks_errbuf_clear(&eb);
        ks_err e = pd_msg_prompt_lp_decode(p, n, &d, &eb);
        CHECK(e == KS_OK || e == KS_ERR_PROTO);
        if (e)
            CHECK(eb.msg[0]);
        else {
            ok++;
            for (uint32_t i = 0; i < d.n_records; i++) {
                int32_t t;
                float lp;
                pd_msg_prompt_lp_record(&d, i, &t, &lp);
                for (uint32_t k = 0; k < d.n_top; k++)
                    (void)pd_msg_prompt_lp_top(&d, i, k);
            }
        }
        free(p);
    }
    CHECK(ok > 0);
}

int main(void) {
    test_layout_and_round_trip();
    test_bounds();
    test_refusals();
    test_random();
    printf("pd_msg PROMPT_LP ok\n");
    return 0;
}
