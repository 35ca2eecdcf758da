/* test_pd_msg_adapter.c — LoRA adapters on the wire (docs/pd-protocol.md
 * section 4): REGISTER's adapter digests (n_adapters at bytes 62..63, the
 * digests after the names; 0 from a sender before the field), and ADMIT's
 * and PREFILL's PD_FLAG_ADAPTER trailer (the request's adapter digest, the
 * payload's last 32 bytes, after the sampling extension when there is one).
 * Round trips keep every byte; the flag follows the digest on encode; a
 * truncated list, a count past its bound, a flag without room for the
 * digest or with an all-zero one are PROTO; old-layout payloads still read
 * as "no adapter". DONE's PD_DONE_ADAPTER (flags at 28): the adapter the
 * prefill worker computed under, after the top entries, so that decode can
 * refuse KV computed under another adapter than its ADMIT's. */
#include "kvseal/pd.h"
#include "kvseal/pd_msg.h"

#include "../check.h"

#include <stdlib.h>
#include <string.h>

static void test_register_adapters(void) {
    ks_errbuf eb;
    uint8_t buf[512];
    uint32_t n = 0;
    uint8_t dig[3 * 32];
    for (int i = 0; i < (int)sizeof dig; i++) dig[i] = (uint8_t)(i * 7 + 1);
    pd_msg_register m = {.role = PD_ROLE_DECODE, .kv_type = KS_DTYPE_F16, .n_layer = 4,
                         .kv_dim = 64, .page_tokens = 16, .n_pages = 64, .n_ctx = 512,
                         .data_port = 4000, .host = "10.0.0.1", .host_len = 8,
                         .names = "kjv-mini", .names_len = 8, .adapters = dig, .n_adapters = 3};
    CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 64u + 8 + 8 + 3 * 32);
    CHECK_EQ(pd_load_u16(buf + 62), 3); // n_adapters at 62
    CHECK_MEM_EQ(buf + 64 + 16, dig, sizeof dig); // after host and names
    pd_msg_register r;
    CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_OK);
    CHECK_EQ(r.n_adapters, 3);
    CHECK_MEM_EQ(r.adapters, dig, sizeof dig);
    CHECK_MEM_EQ(r.names, "kjv-mini", 8);
    // the list must be whole: one byte short or long is PROTO
    CHECK_EQ(pd_msg_register_decode(buf, n - 1, &r, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "n_adapters");
    CHECK_EQ(pd_msg_register_decode(buf, n + 1, &r, &eb), KS_ERR_PROTO);
    // a count past the bound
    pd_store_u16(buf + 62, PD_MSG_MAX_ADAPTERS + 1);
    CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "n_adapters 1025 exceeds");
    // a sender before the field: bytes 62..63 zero, nothing after the names
    m.n_adapters = 0;
    m.adapters = NULL;
    CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 64u + 16);
    CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_OK);
    CHECK(r.n_adapters == 0 && r.adapters == NULL);
    // the encoder refuses what the decoder would
    m.n_adapters = PD_MSG_MAX_ADAPTERS + 1;
    m.adapters = dig;
    CHECK_EQ(pd_msg_register_encode(&m, NULL, 0, &n, &eb), KS_ERR_INVAL);
    m.n_adapters = 2;
    m.adapters = NULL;
    CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    // the transport's bound fits the largest list
    uint32_t tmax[PD_MSG_N_TYPES];
    CHECK_EQ(pd_msg_type_max(NULL, tmax, &eb), KS_OK);
    CHECK(tmax[PD_MSG_REGISTER] >= 64u + PD_MSG_MAX_HOST + PD_MSG_MAX_NAMES + 32u * 1024u);
    CHECK(tmax[PD_MSG_ADMIT] >= PD_MSG_ADMIT_FIXED + PD_MSG_SEXT_MAX + 32u);
}

static pd_msg_sampling samp(void) {
    pd_msg_sampling s;
    memset(&s, 0, sizeof s);
    s.max_tokens = 8;
    s.temperature = 0.0f;
    s.top_p = 1.0f;
    s.top_k = 0;
    s.repeat_penalty = 1.0f;
    return s;
}

static void test_admit_adapter(void) {
    ks_errbuf eb;
    uint8_t buf[1024];
    uint32_t n = 0;
    pd_msg_admit a;
    memset(&a, 0, sizeof a);
    a.n_prompt = 5;
    a.prefill_worker_id = 2;
    a.s = samp();
    // no adapter: 112 bytes, no flag, a zero digest back
    CHECK_EQ(pd_msg_admit_encode(&a, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, PD_MSG_ADMIT_FIXED);
    CHECK_EQ(pd_load_u32(buf + 12) & PD_FLAG_ADAPTER, 0u);
    pd_msg_admit r;
    CHECK_EQ(pd_msg_admit_decode(buf, n, &r, &eb), KS_OK);
    static const uint8_t zero[32];
    CHECK_MEM_EQ(r.s.adapter, zero, 32);
    // with one: the flag is set by the encoder, the digest is the last 32 bytes
    for (int i = 0; i < 32; i++) a.s.adapter[i] = (uint8_t)(0xa0 + i);
    CHECK_EQ(pd_msg_sext_size(&a.s), 32u);
    CHECK_EQ(pd_msg_admit_encode(&a, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, PD_MSG_ADMIT_FIXED + 32);
    CHECK(pd_load_u32(buf + 12) & PD_FLAG_ADAPTER);
    CHECK_MEM_EQ(buf + n - 32, a.s.adapter, 32);
    CHECK_EQ(pd_msg_admit_decode(buf, n, &r, &eb), KS_OK);
    CHECK_MEM_EQ(r.s.adapter, a.s.adapter, 32);
    // truncated, or an extra byte
    CHECK_EQ(pd_msg_admit_decode(buf, n - 1, &r, &eb), KS_ERR_PROTO);
    CHECK_EQ(pd_msg_admit_decode(buf, n + 1, &r, &eb), KS_ERR_PROTO);
    // the flag with an all-zero digest
    uint8_t bad[1024];
    memcpy(bad, buf, n);
    memset(bad + n - 32, 0, 32);
    CHECK_EQ(pd_msg_admit_decode(bad, n, &r, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "all-zero adapter digest");
    // the flag on a 112-byte ADMIT: no room
    memcpy(bad, buf, PD_MSG_ADMIT_FIXED);
    CHECK_EQ(pd_msg_admit_decode(bad, PD_MSG_ADMIT_FIXED, &r, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "no room");
    // with the sampling extension too: the digest comes after it
    static const char G[] = "root ::= \"a\"";
    a.s.flags |= PD_FLAG_EXT;
    a.s.grammar = G;
    a.s.grammar_len = (uint32_t)strlen(G);
    CHECK_EQ(pd_msg_admit_encode(&a, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, PD_MSG_ADMIT_FIXED + PD_MSG_SEXT_FIXED + strlen(G) + 32);
    CHECK_EQ(pd_msg_admit_decode(buf, n, &r, &eb), KS_OK);
    CHECK_MEM_EQ(r.s.adapter, a.s.adapter, 32);
    CHECK_EQ(r.s.grammar_len, strlen(G));
    CHECK_MEM_EQ(r.s.grammar, G, strlen(G));
}

static void test_prefill_adapter(void) {
    ks_errbuf eb;
    // a grant for 20 tokens of 16-token pages
    uint8_t g[256];
    uint32_t glen = 0;
    pd_msg_grant_entry ent[2] = {{.page_id = 1, .first_token = 0, .n_tokens = 16, .gen = 7},
                                 {.page_id = 2, .first_token = 16, .n_tokens = 4, .gen = 7}};
    pd_msg_grant gm;
    memset(&gm, 0, sizeof gm);
    gm.seq_uid = 99;
    gm.link_epoch = 1;
    gm.n_prompt = 20;
    gm.page_tokens = 16;
    gm.n_pages = 2;
    CHECK_EQ(pd_msg_grant_encode(&gm, ent, g, sizeof g, &glen, &eb), KS_OK);
    int32_t tok[20];
    for (int i = 0; i < 20; i++) tok[i] = i + 3;
    pd_msg_prefill p;
    memset(&p, 0, sizeof p);
    p.decode_worker_id = 1;
    p.n_prompt = 20;
    p.s = samp();
    p.grant = g;
    p.grant_len = glen;
    for (int i = 0; i < 32; i++) p.s.adapter[i] = (uint8_t)(i + 1);
    uint8_t buf[1024];
    uint32_t n = 0;
    CHECK_EQ(pd_msg_prefill_encode(&p, tok, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, pd_msg_prefill_size(glen, 20) + 32);
    CHECK(pd_load_u32(buf + 12) & PD_FLAG_ADAPTER);
    pd_msg_prefill r;
    CHECK_EQ(pd_msg_prefill_decode(buf, n, &r, &eb), KS_OK);
    CHECK_MEM_EQ(r.s.adapter, p.s.adapter, 32);
    CHECK_EQ(pd_msg_prefill_token(&r, 19), 22);
    CHECK_EQ(pd_msg_prefill_decode(buf, n - 1, &r, &eb), KS_ERR_PROTO);
    // the flag cleared: the 32 bytes are trailing garbage
    pd_store_u32(buf + 12, pd_load_u32(buf + 12) & ~(uint32_t)PD_FLAG_ADAPTER);
    CHECK_EQ(pd_msg_prefill_decode(buf, n, &r, &eb), KS_ERR_PROTO);
    // and without a digest: no flag, the old size, a zero digest back
    memset(p.s.adapter, 0, 32);
    CHECK_EQ(pd_msg_prefill_encode(&p, tok, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, pd_msg_prefill_size(glen, 20));
    CHECK_EQ(pd_msg_prefill_decode(buf, n, &r, &eb), KS_OK);
    static const uint8_t zero[32];
    CHECK_MEM_EQ(r.s.adapter, zero, 32);
}

static void test_done_adapter(void) {
    ks_errbuf eb;
    uint8_t buf[32 + 8 * 2 + 32 + 8];
    uint32_t n = 0;
    pd_msg_top top[2] = {{5, -0.5f}, {9, -1.5f}};
    pd_msg_done m = {.covered = 40, .first_token = 5, .logprob = -0.5f, .n_top = 2,
                     .rng_state = 77, .cached = 16};
    for (int i = 0; i < 32; i++) m.adapter[i] = (uint8_t)(0xa0 + i);
    CHECK_EQ(pd_msg_done_encode(&m, top, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 32u + 16 + 32);
    CHECK_EQ(pd_load_u32(buf + 28), PD_DONE_ADAPTER); // the flag follows the digest
    CHECK_MEM_EQ(buf + 48, m.adapter, 32);           // after the top entries
    pd_msg_done r;
    CHECK_EQ(pd_msg_done_decode(buf, n, &r, &eb), KS_OK);
    CHECK_MEM_EQ(r.adapter, m.adapter, 32);
    CHECK(r.n_top == 2 && r.covered == 40 && r.cached == 16 && r.rng_state == 77);
    CHECK(pd_msg_top_at(r.top, 1).id == 9);
    // one byte short: the top entries no longer fit beside the digest
    CHECK_EQ(pd_msg_done_decode(buf, n - 1, &r, &eb), KS_ERR_PROTO);
    // the flag with an all-zero digest, or with no room for one
    uint8_t z[32 + 32] = {0};
    pd_store_u32(z + 28, PD_DONE_ADAPTER);
    CHECK_EQ(pd_msg_done_decode(z, sizeof z, &r, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "all-zero");
    CHECK_EQ(pd_msg_done_decode(z, 40, &r, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "no room");
    // no adapter: the old layout, byte for byte, reads as all zero
    memset(m.adapter, 0, sizeof m.adapter);
    CHECK_EQ(pd_msg_done_encode(&m, top, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 32u + 16);
    CHECK_EQ(pd_load_u32(buf + 28), 0);
    CHECK_EQ(pd_msg_done_decode(buf, n, &r, &eb), KS_OK);
    static const uint8_t zero[32];
    CHECK_MEM_EQ(r.adapter, zero, 32);
}

int main(void) {
    test_register_adapters();
    test_done_adapter();
    test_admit_adapter();
    test_prefill_adapter();
    printf("test_pd_msg_adapter: ok\n");
    return 0;
}
