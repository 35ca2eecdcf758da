/* test_pd_msg.c — KVPD v1 message codecs (include/kvseal/pd_msg.h): round
 * trip of every message (including max-size variable parts), exact byte
 * layouts against docs/pd-protocol.md section 4 for ADMIT, GRANT, the KV_PAGE
 * header and DONE (hand-built arrays), rejection of every truncation, a
 * trailing byte, each inconsistent length field, out-of-range counts and
 * enums, GRANT coverage errors and KV_PAGE length mismatches, the per-type
 * bound table, and random byte strings fed to every decoder. */
#include "kvseal/pd_msg.h"
#include "kvseal/pd.h"

#include "../check.h"

// ----------------------------------------------------------------------------
// Helpers

static const kv_geom GEOM = {.n_layer = 4, .kv_dim = 8, .page_tokens = 16};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* Dispatches to the decoder of type t (KV_PAGE: header = whole buffer, frame
 * length = the exact length its header implies for GEOM, or len when the
 * header is too short to say). */
static ks_err dec_any(uint16_t t, const uint8_t *p, uint32_t len, ks_errbuf *eb) {
    union {
        pd_msg_register reg;
        pd_msg_register_ack rack;
        pd_msg_health h;
        pd_msg_health_ack hack;
        pd_msg_peer peer;
        pd_msg_link link;
        pd_msg_link_ack lack;
        pd_msg_admit admit;
        pd_msg_grant grant;
        pd_msg_deny deny;
        pd_msg_prefill pre;
        pd_msg_kv_page kv;
        pd_msg_done done;
        pd_msg_reject rej;
        pd_msg_abort ab;
        pd_msg_token tok;
        pd_msg_finish fin;
        pd_msg_error err;
    } u;
    switch (t) {
    case PD_MSG_REGISTER: return pd_msg_register_decode(p, len, &u.reg, eb);
    case PD_MSG_REGISTER_ACK: return pd_msg_register_ack_decode(p, len, &u.rack, eb);
    case PD_MSG_HEALTH: return pd_msg_health_decode(p, len, &u.h, eb);
    case PD_MSG_HEALTH_ACK: return pd_msg_health_ack_decode(p, len, &u.hack, eb);
    case PD_MSG_PEER: return pd_msg_peer_decode(p, len, &u.peer, eb);
    case PD_MSG_LINK: return pd_msg_link_decode(p, len, &u.link, eb);
    case PD_MSG_LINK_ACK: return pd_msg_link_ack_decode(p, len, &u.lack, eb);
    case PD_MSG_ADMIT: return pd_msg_admit_decode(p, len, &u.admit, eb);
    case PD_MSG_GRANT: return pd_msg_grant_decode(p, len, &u.grant, eb);
    case PD_MSG_DENY: return pd_msg_deny_decode(p, len, &u.deny, eb);
    case PD_MSG_PREFILL: {
        ks_err e = pd_msg_prefill_decode(p, len, &u.pre, eb);
        if (e) return e;
        pd_msg_grant g;
        ks_errbuf tmp;
        ks_err ge = pd_msg_prefill_grant(&u.pre, &g, &tmp); /* must not crash either way */
        CHECK(ge == KS_OK || ge == KS_ERR_PROTO);
        for (uint32_t i = 0; i < u.pre.n_prompt; i++) (void)pd_msg_prefill_token(&u.pre, i);
        return KS_OK;
    }
    case PD_MSG_KV_PAGE: {
        uint32_t frame = len;
        if (len >= PD_MSG_KV_PAGE_HDR) {
            uint64_t w = pd_msg_kv_page_len(&GEOM, pd_load_u32(p + 24), pd_load_u32(p + 32));
            frame = w > 0xffffffffu ? 0 : (uint32_t)w;
        }
        return pd_msg_kv_page_decode(p, len, frame, &GEOM, &u.kv, eb);
    }
    case PD_MSG_DONE: return pd_msg_done_decode(p, len, &u.done, eb);
    case PD_MSG_REJECT: return pd_msg_reject_decode(p, len, &u.rej, eb);
    case PD_MSG_ABORT: return pd_msg_abort_decode(p, len, &u.ab, eb);
    case PD_MSG_ABORT_ACK: return pd_msg_abort_ack_decode(p, len, eb);
    case PD_MSG_TOKEN: return pd_msg_token_decode(p, len, &u.tok, eb);
    case PD_MSG_FINISH: return pd_msg_finish_decode(p, len, &u.fin, eb);
    case PD_MSG_ERROR: return pd_msg_error_decode(p, len, &u.err, eb);
    default: abort();
    }
}

static const uint16_t ALL_TYPES[] = {
    PD_MSG_REGISTER, PD_MSG_REGISTER_ACK, PD_MSG_HEALTH, PD_MSG_HEALTH_ACK, PD_MSG_PEER,
    PD_MSG_LINK,     PD_MSG_LINK_ACK,     PD_MSG_ADMIT,  PD_MSG_GRANT,      PD_MSG_DENY,
    PD_MSG_PREFILL,  PD_MSG_KV_PAGE,      PD_MSG_DONE,   PD_MSG_REJECT,     PD_MSG_ABORT,
    PD_MSG_ABORT_ACK, PD_MSG_TOKEN,       PD_MSG_FINISH, PD_MSG_ERROR,
};
#define N_TYPES (sizeof ALL_TYPES / sizeof ALL_TYPES[0])

static char TEXT512[512];
static char HOST255[255];

/* Grant entries covering n_prompt tokens with page_tokens per page. */
static uint32_t fill_entries(pd_msg_grant_entry *en, uint32_t n_prompt, uint32_t pt) {
    uint32_t n = (n_prompt + pt - 1) / pt;
    for (uint32_t i = 0; i < n; i++) {
        en[i].page_id = 1000 + i * 7;
        en[i].first_token = i * pt;
        en[i].n_tokens = n_prompt - i * pt < pt ? n_prompt - i * pt : pt;
        en[i].gen = 0x0102030405060708ull + i;
    }
    return n;
}

static const pd_msg_sampling SAMP = {.max_tokens = 128, .flags = PD_FLAG_IGNORE_EOS,
                                     .seed = 0xdeadbeefcafef00dull, .temperature = 0.7f,
                                     .top_p = 0.9f, .min_p = 0.05f, .top_k = -1, .n_probs = 5};

/* A representative valid payload of type t (with non-empty variable parts)
 * in buf; returns its length. */
static uint32_t sample(uint16_t t, uint8_t *buf, size_t cap) {
    uint32_t n = 0;
    ks_errbuf eb;
    ks_err e = KS_OK;
    pd_msg_top top[3] = {{5, -0.5f}, {7, -1.25f}, {-1, -9.0f}};
    switch (t) {
    case PD_MSG_REGISTER: {
        pd_msg_register m = {.role = PD_ROLE_DECODE, .n_layer = 22, .kv_dim = 256,
                             .page_tokens = 16, .n_pages = 4096, .n_ctx = 2048,
                             .data_port = 7070, .host = "10.0.0.5", .host_len = 8};
        for (int i = 0; i < 32; i++) m.model_id[i] = (uint8_t)(0xa0 + i);
        e = pd_msg_register_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_REGISTER_ACK: {
        pd_msg_register_ack m = {3, 1000, 0x0102030405060708ull};
        e = pd_msg_register_ack_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_HEALTH: {
        pd_msg_health m = {42};
        e = pd_msg_health_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_HEALTH_ACK: {
        pd_msg_health_ack m = {42, 3, 100, 2, 0};
        e = pd_msg_health_ack_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_PEER: {
        pd_msg_peer m = {9, 7070, "host.example", 12};
        e = pd_msg_peer_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_LINK: {
        pd_msg_link m = {.prefill_worker_id = 4, .router_id = 0x1112131415161718ull};
        memset(m.model_id, 0xa7, sizeof m.model_id);
        e = pd_msg_link_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_LINK_ACK: {
        pd_msg_link_ack m = {.link_epoch = 0x1122334455667788ull};
        e = pd_msg_link_ack_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_ADMIT: {
        pd_msg_admit m = {.n_prompt = 60, .prefill_worker_id = 4, .s = SAMP};
        memset(m.domain_hash, 0x5a, 32);
        for (int i = 0; i < 32; i++) m.model_id[i] = (uint8_t)(0xc0 + i);
        e = pd_msg_admit_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_GRANT: {
        pd_msg_grant_entry en[4];
        pd_msg_grant m = {.seq_uid = 77, .link_epoch = 5, .n_prompt = 60, .page_tokens = 16};
        m.n_pages = fill_entries(en, 60, 16);
        e = pd_msg_grant_encode(&m, en, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_DENY: {
        pd_msg_deny m = {PD_DENY_NOSPACE, "pool full", 9};
        e = pd_msg_deny_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_PREFILL: {
        uint8_t g[256];
        uint32_t gl = sample(PD_MSG_GRANT, g, sizeof g);
        int32_t tok[60];
        for (int i = 0; i < 60; i++) tok[i] = i * 31 - 5;
        pd_msg_prefill m = {.decode_worker_id = 2, .n_prompt = 60, .s = SAMP, .grant = g,
                            .grant_len = gl};
        memset(m.domain_hash, 0x33, 32);
        e = pd_msg_prefill_encode(&m, tok, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_KV_PAGE: {
        pd_msg_kv_page m = {.page_index = 3, .page_id = 1021, .tag_seq_uid = 77,
                            .tag_gen = 11, .n_rows = 12, .layer_first = 1, .layer_count = 2};
        e = pd_msg_kv_page_encode(&m, &GEOM, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_DONE: {
        pd_msg_done m = {.covered = 60, .first_token = 1234, .logprob = -0.25f, .n_top = 3,
                         .rng_state = 0xfeedfacefeedfaceull, .cached = 32};
        e = pd_msg_done_encode(&m, top, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_REJECT: {
        pd_msg_reject m = {ADMIT_CONTEXT_LENGTH, "too long", 8};
        e = pd_msg_reject_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_ABORT: {
        pd_msg_abort m = {PD_ABORT_STOP};
        e = pd_msg_abort_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_ABORT_ACK: n = 0; break;
    case PD_MSG_TOKEN: {
        pd_msg_token m = {.token = 99, .logprob = -0.125f, .n_top = 3};
        e = pd_msg_token_encode(&m, top, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_FINISH: {
        pd_msg_finish m = {PD_FINISH_ERROR, 60, 17, KS_ERR_PROTO, "handoff failed", 14, 16, 0};
        e = pd_msg_finish_encode(&m, buf, cap, &n, &eb);
        break;
    }
    case PD_MSG_ERROR: {
        pd_msg_error m = {KS_ERR_PROTO, "bad frame", 9};
        e = pd_msg_error_encode(&m, buf, cap, &n, &eb);
        break;
    }
    default: abort();
    }
    if (e) fprintf(stderr, "sample %s: %s\n", pd_msg_type_name(t), eb.msg);
    CHECK_EQ(e, KS_OK);
    return n;
}

/* Decoding must fail with KS_ERR_PROTO and a message containing `has`. */
#define REJECTS(t, p, len, has)                                                          \
    do {                                                                                 \
        ks_errbuf eb_;                                                                   \
        ks_errbuf_clear(&eb_);                                                           \
        CHECK_EQ(dec_any((t), (p), (len), &eb_), KS_ERR_PROTO);                          \
        CHECK_STR_HAS(eb_.msg, pd_msg_type_name(t));                                     \
        CHECK_STR_HAS(eb_.msg, (has));                                                   \
    } while (0)

// ----------------------------------------------------------------------------
// Names, bounds

static void test_names_and_bounds(void) {
    CHECK_STR_EQ(pd_msg_type_name(PD_MSG_GRANT), "GRANT");
    CHECK_STR_EQ(pd_msg_type_name(0x1A), "FINISH");
    CHECK_STR_EQ(pd_msg_type_name(0x1F), "ERROR");
    CHECK_STR_EQ(pd_msg_type_name(0x0B), "UNKNOWN");
    CHECK_STR_EQ(pd_msg_type_name(0x23), "UNKNOWN"); /* 0x20-0x22: EMBED, EMBED_RESULT, PROMPT_LP */
    for (size_t i = 0; i < N_TYPES; i++) CHECK(strcmp(pd_msg_type_name(ALL_TYPES[i]), "UNKNOWN"));
    /* doc numbers */
    CHECK_EQ(PD_MSG_ADMIT, 0x10);
    CHECK_EQ(PD_MSG_KV_PAGE, 0x14);
    CHECK_EQ(PD_MSG_TOKEN, 0x19);
    CHECK_EQ(PD_MSG_HELLO, PD_TYPE_HELLO);
    CHECK_EQ(PD_MSG_REGISTER, PD_TYPE_FIRST_PROTO);

    uint32_t tm[PD_MSG_N_TYPES];
    ks_errbuf eb;
    CHECK_EQ(pd_msg_type_max(&GEOM, tm, &eb), KS_OK);
    CHECK_EQ(tm[PD_MSG_HELLO], PD_TYPE_FORBIDDEN);
    CHECK_EQ(tm[PD_MSG_AUTH], PD_TYPE_FORBIDDEN);
    CHECK_EQ(tm[0], PD_TYPE_FORBIDDEN);
    CHECK_EQ(tm[0x0B], PD_TYPE_FORBIDDEN);
    CHECK_EQ(tm[0x1E], PD_TYPE_FORBIDDEN);
    CHECK_EQ(tm[PD_MSG_POOL_CHECK], 0);
    CHECK_EQ(tm[PD_MSG_POOL_CHECK_ACK], 24);
    CHECK_EQ(tm[PD_MSG_RETIRE], 48);
    CHECK_STR_EQ(pd_msg_type_name(PD_MSG_RETIRE), "RETIRE");
    CHECK_EQ(tm[PD_MSG_REGISTER], 64 + 255 + 1024 + 32 * 1024); /* v3: + names; + adapter digests */
    CHECK_EQ(tm[PD_MSG_REGISTER_ACK], 16);
    CHECK_EQ(tm[PD_MSG_HEALTH], 8);
    CHECK_EQ(tm[PD_MSG_HEALTH_ACK], 24);
    CHECK_EQ(tm[PD_MSG_PEER], 263);
    CHECK_EQ(tm[PD_MSG_LINK], 48); /* v3: + the model_id, the router identity */
    CHECK_EQ(tm[PD_MSG_LINK_ACK], 12 + 8192); // with a UCX worker address
    CHECK_EQ(tm[PD_MSG_ADMIT], 112 + 28 + 8 * 1024 + 262144 + 32); // the largest extension, an adapter
    CHECK_EQ(tm[PD_MSG_GRANT], 4194304);
    CHECK_EQ(tm[PD_MSG_DENY], 520);
    CHECK_EQ(tm[PD_MSG_PREFILL], 16777216);
    CHECK_EQ(tm[PD_MSG_KV_PAGE], 40 + 4 * 2 * 16 * 8 * 4);
    CHECK_EQ(tm[PD_MSG_DONE], 32 + 8 * 64);
    CHECK_EQ(tm[PD_MSG_REJECT], 524);
    CHECK_EQ(tm[PD_MSG_ABORT], 4);
    CHECK_EQ(tm[PD_MSG_ABORT_ACK], 0);
    CHECK_EQ(tm[PD_MSG_TOKEN], 12 + 8 * 64);
    CHECK_EQ(tm[PD_MSG_FINISH], 540);
    CHECK_EQ(tm[PD_MSG_ERROR], 520);
    /* every sample fits its bound */
    static uint8_t buf[4096];
    for (size_t i = 0; i < N_TYPES; i++) CHECK(sample(ALL_TYPES[i], buf, sizeof buf) <= tm[ALL_TYPES[i]]);

    CHECK_EQ(pd_msg_type_max(NULL, tm, &eb), KS_OK);
    CHECK_EQ(tm[PD_MSG_KV_PAGE], PD_TYPE_FORBIDDEN);
    CHECK_EQ(tm[PD_MSG_ADMIT], 112 + 28 + 8 * 1024 + 262144 + 32);    // the largest extension, an adapter
    kv_geom big = {.n_layer = 64, .kv_dim = 8192, .page_tokens = 64}; /* 256 MiB page */
    CHECK_EQ(pd_msg_type_max(&big, tm, &eb), KS_ERR_INVAL);
    kv_geom zero = {.n_layer = 0, .kv_dim = 8, .page_tokens = 16};
    CHECK_EQ(pd_msg_type_max(&zero, tm, &eb), KS_ERR_INVAL);
    kv_geom tl = {.n_layer = 22, .kv_dim = 256, .page_tokens = 16}; /* TinyLlama */
    CHECK_EQ(pd_msg_type_max(&tl, tm, &eb), KS_OK);
    CHECK_EQ(tm[PD_MSG_KV_PAGE], 40 + 22 * 2 * 16 * 256 * 4);
    /* pages travel in their KV type: the bound follows the row bytes */
    tl.kv_type = KS_DTYPE_F16;
    CHECK_EQ(pd_msg_type_max(&tl, tm, &eb), KS_OK);
    CHECK_EQ(tm[PD_MSG_KV_PAGE], 40 + 22 * 2 * 16 * 256 * 2);
    tl.kv_type = KS_DTYPE_Q8_0;
    CHECK_EQ(pd_msg_type_max(&tl, tm, &eb), KS_OK);
    CHECK_EQ(tm[PD_MSG_KV_PAGE], 40 + 22 * 2 * 16 * (256 / 32 * 34));
    kv_geom odd = {.n_layer = 2, .kv_dim = 48, .page_tokens = 16, .kv_type = KS_DTYPE_Q8_0};
    CHECK_EQ(pd_msg_type_max(&odd, tm, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "KV type 8 with kv_dim 48");
    odd.kv_type = KS_DTYPE_Q4_0;
    odd.kv_dim = 64;
    CHECK_EQ(pd_msg_type_max(&odd, tm, &eb), KS_ERR_INVAL);
}

// ----------------------------------------------------------------------------
// Exact byte layouts (hand-built from docs/pd-protocol.md section 4)

static void test_layout_admit(void) {
    uint8_t want[112] = {
        60, 0, 0, 0,         /* 0 n_prompt */
        128, 0, 0, 0,        /* 4 max_tokens */
        4, 0, 0, 0,          /* 8 prefill_worker_id */
        1, 0, 0, 0,          /* 12 flags: ignore_eos */
    };
    memset(want + 16, 0x5a, 32);                                            /* 16 domain_hash */
    const uint8_t seed[8] = {0x0d, 0xf0, 0xfe, 0xca, 0xef, 0xbe, 0xad, 0xde}; /* 48 seed */
    memcpy(want + 48, seed, 8);
    const uint8_t f07[4] = {0x33, 0x33, 0x33, 0x3f}; /* 0.7f = 0x3f333333 */
    memcpy(want + 56, f07, 4);
    const uint8_t f09[4] = {0x66, 0x66, 0x66, 0x3f}; /* 0.9f = 0x3f666666 */
    memcpy(want + 60, f09, 4);
    const uint8_t f005[4] = {0xcd, 0xcc, 0x4c, 0x3d}; /* 0.05f = 0x3d4ccccd */
    memcpy(want + 64, f005, 4);
    memset(want + 68, 0xff, 4); /* top_k -1 */
    want[72] = 5;               /* n_probs */
    /* 76 reserved = 0 */
    for (int i = 0; i < 32; i++) want[80 + i] = (uint8_t)(0xc0 + i); /* 80 model_id (v3) */
    uint8_t buf[112];
    CHECK_EQ(sample(PD_MSG_ADMIT, buf, sizeof buf), 112);
    CHECK_MEM_EQ(buf, want, 112);

    pd_msg_admit a;
    ks_errbuf eb;
    want[76] = 0xee; /* reserved: ignored */
    CHECK_EQ(pd_msg_admit_decode(want, 112, &a, &eb), KS_OK);
    CHECK_MEM_EQ(a.model_id, want + 80, 32);
    CHECK_EQ(pd_msg_admit_decode(want, 80, &a, &eb), KS_ERR_PROTO); /* a v2 ADMIT: too short */
    CHECK_EQ(a.n_prompt, 60);
    CHECK_EQ(a.s.max_tokens, 128);
    CHECK_EQ(a.prefill_worker_id, 4);
    CHECK_EQ(a.s.flags, 1);
    CHECK_EQ(a.domain_hash[31], 0x5a);
    CHECK(a.s.seed == 0xdeadbeefcafef00dull);
    CHECK(a.s.temperature == 0.7f && a.s.top_p == 0.9f && a.s.min_p == 0.05f);
    CHECK_EQ(a.s.top_k, -1);
    CHECK_EQ(a.s.n_probs, 5);
}

static void test_layout_grant(void) {
    /* 2 pages: n_prompt 20, page_tokens 16 */
    uint8_t want[64 + 48] = {
        0x4d, 0, 0, 0, 0, 0, 0, 0,          /* 0 seq_uid 77 */
        5, 0, 0, 0, 0, 0, 0, 0,             /* 8 link_epoch 5 */
        20, 0, 0, 0,                        /* 16 n_prompt */
        16, 0, 0, 0,                        /* 20 page_tokens */
        2, 0, 0, 0,                         /* 24 n_pages */
        0, 0, 0, 0,                         /* 28 ucx_key_len: 0 (the TLS plane) */
        0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1, /* 32 model_id (v3) */
        0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1,
        0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1,
        0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0xb1,
        0xe8, 0x03, 0, 0,                   /* page 0: page_id 1000 */
        0, 0, 0, 0,                         /*   first_token 0 */
        16, 0, 0, 0,                        /*   n_tokens 16 */
        0, 0, 0, 0,                         /*   reserved */
        8, 7, 6, 5, 4, 3, 2, 1,             /*   gen 0x0102030405060708 */
        0xef, 0x03, 0, 0,                   /* page 1: page_id 1007 */
        16, 0, 0, 0,                        /*   first_token 16 */
        4, 0, 0, 0,                         /*   n_tokens 4 */
        0, 0, 0, 0,                         /*   reserved */
        9, 7, 6, 5, 4, 3, 2, 1,             /*   gen +1 */
    };
    pd_msg_grant_entry en[2];
    pd_msg_grant m = {.seq_uid = 77, .link_epoch = 5, .n_prompt = 20, .page_tokens = 16};
    memset(m.model_id, 0xb1, sizeof m.model_id);
    m.n_pages = fill_entries(en, 20, 16);
    uint8_t buf[sizeof want];
    uint32_t n;
    ks_errbuf eb;
    CHECK_EQ(pd_msg_grant_size(2), sizeof want);
    CHECK_EQ(pd_msg_grant_encode(&m, en, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, sizeof want);
    CHECK_MEM_EQ(buf, want, sizeof want);
    want[64 + 12] = 0x99; /* reserved fields are ignored (offset 28 is ucx_key_len since v3) */
    pd_msg_grant g;
    CHECK_EQ(pd_msg_grant_decode(want, sizeof want, &g, &eb), KS_OK);
    CHECK(g.seq_uid == 77 && g.link_epoch == 5);
    CHECK_MEM_EQ(g.model_id, m.model_id, 32);
    CHECK_EQ(g.n_pages, 2);
    pd_msg_grant_entry e1 = pd_msg_grant_entry_at(&g, 1);
    CHECK_EQ(e1.page_id, 1007);
    CHECK_EQ(e1.first_token, 16);
    CHECK_EQ(e1.n_tokens, 4);
    CHECK(e1.gen == 0x0102030405060709ull);
    CHECK(g.entries == want + 64); /* zero-copy */
}

static void test_layout_kv_page(void) {
    uint8_t want[40] = {
        3, 0, 0, 0,                   /* 0 page_index */
        0xfd, 0x03, 0, 0,             /* 4 page_id 1021 */
        0x4d, 0, 0, 0, 0, 0, 0, 0,    /* 8 tag_seq_uid 77 */
        11, 0, 0, 0, 0, 0, 0, 0,      /* 16 tag_gen */
        12, 0, 0, 0,                  /* 24 n_rows */
        1, 0, 0, 0,                   /* 28 layer_first */
        2, 0, 0, 0,                   /* 32 layer_count */
        0, 0, 0, 0,                   /* 36 reserved */
    };
    uint8_t buf[40];
    CHECK_EQ(sample(PD_MSG_KV_PAGE, buf, sizeof buf), 40);
    CHECK_MEM_EQ(buf, want, 40);
    /* len = 40 + layer_count * 2 * n_rows * kv_dim * 4 */
    CHECK_EQ(pd_msg_kv_page_len(&GEOM, 12, 2), 40 + 2 * 2 * 12 * 8 * 4);
    pd_msg_kv_page k;
    ks_errbuf eb;
    want[37] = 0x42;
    CHECK_EQ(pd_msg_kv_page_decode(want, 40, 40 + 2 * 2 * 12 * 8 * 4, &GEOM, &k, &eb), KS_OK);
    CHECK(k.page_index == 3 && k.page_id == 1021 && k.tag_seq_uid == 77 && k.tag_gen == 11);
    CHECK(k.n_rows == 12 && k.layer_first == 1 && k.layer_count == 2);
    /* a longer prefix is fine (only 40 bytes are read) */
    uint8_t longer[64] = {0};
    memcpy(longer, want, 40);
    CHECK_EQ(pd_msg_kv_page_decode(longer, 64, 40 + 2 * 2 * 12 * 8 * 4, &GEOM, &k, &eb), KS_OK);
}

static void test_layout_done(void) {
    uint8_t want[32 + 8] = {
        60, 0, 0, 0,                                    /* 0 covered */
        0xd2, 0x04, 0, 0,                               /* 4 first_token 1234 */
        0, 0, 0x80, 0xbe,                               /* 8 logprob -0.25f */
        1, 0, 0, 0,                                     /* 12 n_top */
        0xce, 0xfa, 0xed, 0xfe, 0xce, 0xfa, 0xed, 0xfe, /* 16 rng_state */
        48, 0, 0, 0,                                    /* 24 cached */
        0, 0, 0, 0,                                     /* 28 reserved */
        0xfb, 0xff, 0xff, 0xff,                         /* top[0].id -5 */
        0, 0, 0xa0, 0xbf,                               /* top[0].logprob -1.25f */
    };
    pd_msg_done m = {.covered = 60, .first_token = 1234, .logprob = -0.25f, .n_top = 1,
                     .rng_state = 0xfeedfacefeedfaceull, .cached = 48};
    pd_msg_top top = {-5, -1.25f};
    uint8_t buf[40];
    uint32_t n;
    ks_errbuf eb;
    CHECK_EQ(pd_msg_done_encode(&m, &top, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 40);
    CHECK_MEM_EQ(buf, want, 40);
    pd_msg_done d;
    CHECK_EQ(pd_msg_done_decode(want, 40, &d, &eb), KS_OK);
    CHECK(d.covered == 60 && d.first_token == 1234 && d.logprob == -0.25f && d.n_top == 1 &&
          d.cached == 48);
    CHECK(d.rng_state == 0xfeedfacefeedfaceull);
    pd_msg_top t0 = pd_msg_top_at(d.top, 0);
    CHECK(t0.id == -5 && t0.logprob == -1.25f);
}

// ----------------------------------------------------------------------------
// Round trips (including max-size variable parts)

static void test_round_trip_small(void) {
    ks_errbuf eb;
    uint8_t buf[2048];
    uint32_t n;
    {
        pd_msg_register m = {.role = PD_ROLE_PREFILL,
                             .kv_type = KS_DTYPE_Q8_0,
                             .n_layer = 22,
                             .kv_dim = 256,
                             .page_tokens = 16,
                             .n_pages = 512,
                             .n_ctx = 2048,
                             .data_port = 0,
                             .host = HOST255,
                             .host_len = 255};
        memset(m.model_id, 0xc3, 32);
        CHECK_EQ(pd_msg_register_encode(&m, NULL, 0, &n, &eb), KS_OK);
        CHECK_EQ(n, 319);
        CHECK_EQ(pd_msg_register_encode(&m, buf, 318, &n, &eb), KS_ERR_NOSPACE);
        CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(n, 319);
        pd_msg_register r;
        CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_OK);
        CHECK(r.role == 2 && r.n_layer == 22 && r.kv_dim == 256 && r.page_tokens == 16);
        CHECK(r.n_pages == 512 && r.n_ctx == 2048 && r.data_port == 0 && r.host_len == 255);
        CHECK_MEM_EQ(r.model_id, m.model_id, 32);
        CHECK_MEM_EQ(r.host, HOST255, 255);
        /* kv_type: u8 at offset 1 (byte 2 is planes, m.planes 0 goes out as 2; byte 3
           stays reserved, zero); 0 (what a sender that predates the field wrote there)
           reads as F32; an unknown type is refused */
        CHECK(buf[0] == 2 && buf[1] == 8 && buf[2] == 2 && buf[3] == 0);
        CHECK_EQ(r.planes, 2);
        CHECK_EQ(r.kv_type, KS_DTYPE_Q8_0);
        buf[1] = 0;
        CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_OK);
        CHECK_EQ(r.kv_type, KS_DTYPE_F32);
        buf[1] = KS_DTYPE_F16;
        CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_OK);
        CHECK_EQ(r.kv_type, KS_DTYPE_F16);
        buf[1] = KS_DTYPE_Q4_0;
        CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_ERR_PROTO);
        CHECK_STR_HAS(eb.msg, "REGISTER: kv_type 2");
        buf[1] = 0xff;
        CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_ERR_PROTO);
        m.kv_type = 3;
        CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
        CHECK_STR_HAS(eb.msg, "kv_type");
        m.kv_type = KS_DTYPE_F16;
        m.host_len = 256;
        CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
        m.host_len = 3;
        m.role = PD_ROLE_ROUTER;
        CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
        CHECK_STR_HAS(eb.msg, "role");
        /* v3: the names the worker serves its model as follow the host */
        m.role = PD_ROLE_DECODE;
        m.data_port = 7000;
        m.names = "kjv-mini,bible";
        m.names_len = 14;
        CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(n, 64 + 3 + 14);
        CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_OK);
        CHECK(r.names_len == 14 && r.names == (const char *)buf + 64 + 3);
        CHECK_MEM_EQ(r.names, "kjv-mini,bible", 14);
        buf[64 + 3 + 8] = 0; /* a NUL in the names */
        CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_ERR_PROTO);
        CHECK_STR_HAS(eb.msg, "names");
        CHECK_EQ(pd_msg_register_decode(buf, n - 1, &r, &eb), KS_ERR_PROTO); /* short */
        m.names_len = PD_MSG_MAX_NAMES + 1;
        CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    }
    {
        pd_msg_register_ack m = {0xfffffffe, 1000, UINT64_MAX - 1}, r;
        CHECK_EQ(pd_msg_register_ack_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_register_ack_decode(buf, n, &r, &eb), KS_OK);
        CHECK(n == 16 && r.worker_id == 0xfffffffe && r.health_interval_ms == 1000 &&
              r.router_id == UINT64_MAX - 1);
        // worker ids are one router's numbering: a router without an identity is refused
        memset(buf + 8, 0, 8);
        CHECK_EQ(pd_msg_register_ack_decode(buf, n, &r, &eb), KS_ERR_PROTO);
        CHECK_STR_HAS(eb.msg, "router identity");
        m.router_id = 0;
        CHECK_EQ(pd_msg_register_ack_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    }
    {
        pd_msg_link m = {.prefill_worker_id = 77, .router_id = 0xa1a2a3a4a5a6a7a8ull}, r;
        CHECK_EQ(pd_msg_link_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_link_decode(buf, n, &r, &eb), KS_OK);
        CHECK(n == 48 && r.prefill_worker_id == 77 && r.router_id == 0xa1a2a3a4a5a6a7a8ull);
        memset(buf + 40, 0, 8);
        CHECK_EQ(pd_msg_link_decode(buf, n, &r, &eb), KS_ERR_PROTO);
        CHECK_EQ(pd_msg_link_decode(buf, 8, &r, &eb), KS_ERR_PROTO); // a v2 LINK
    }
    {
        pd_msg_health m = {UINT64_MAX}, r;
        CHECK_EQ(pd_msg_health_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_health_decode(buf, n, &r, &eb), KS_OK);
        CHECK(n == 8 && r.seq == UINT64_MAX);
    }
    {
        pd_msg_health_ack m = {0x123456789ull, 7, 8, 9, PD_HEALTH_DRAINING}, r;
        CHECK_EQ(pd_msg_health_ack_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_health_ack_decode(buf, n, &r, &eb), KS_OK);
        CHECK(n == 24 && r.seq == 0x123456789ull && r.active_requests == 7 &&
              r.free_pages == 8 && r.quarantined_pages == 9 && r.flags == PD_HEALTH_DRAINING);
        buf[20] = 2;  // an unknown flag
        CHECK_EQ(pd_msg_health_ack_decode(buf, n, &r, &eb), KS_ERR_PROTO);
        CHECK_STR_HAS(eb.msg, "HEALTH_ACK: flags 0x2");
    }
    {
        pd_msg_pool_check_ack m = {1, 0, 10, 2, 3, 4}, r;
        CHECK_EQ(pd_msg_pool_check_ack_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_pool_check_ack_decode(buf, n, &r, &eb), KS_OK);
        CHECK(n == 24 && r.clean == 1 && r.active == 0 && r.free_pages == 10 && r.allocated == 2 &&
              r.ready == 3 && r.quarantined == 4);
        buf[0] = 2;  // clean is a boolean on the wire
        CHECK_EQ(pd_msg_pool_check_ack_decode(buf, n, &r, &eb), KS_ERR_PROTO);
        CHECK_STR_HAS(eb.msg, "POOL_CHECK_ACK: clean 2");
        CHECK_EQ(pd_msg_pool_check_ack_decode(buf, n - 1, &r, &eb), KS_ERR_PROTO);
    }
    {
        pd_msg_peer m = {12, 0, HOST255, 255}, r;
        CHECK_EQ(pd_msg_peer_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(n, 263);
        CHECK_EQ(pd_msg_peer_decode(buf, n, &r, &eb), KS_OK);
        CHECK(r.decode_worker_id == 12 && r.port == 0 && r.host_len == 255);
        CHECK(r.host == (const char *)buf + 8);
        m.host_len = 0; /* empty host is layout-valid */
        CHECK_EQ(pd_msg_peer_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_peer_decode(buf, n, &r, &eb), KS_OK);
        CHECK_EQ(r.host_len, 0);
    }
    {
        pd_msg_link m = {.prefill_worker_id = 31, .router_id = 9}, r;
        for (int i = 0; i < 32; i++) m.model_id[i] = (uint8_t)(0x40 + i);
        CHECK_EQ(pd_msg_link_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_link_decode(buf, n, &r, &eb), KS_OK);
        CHECK(n == 48 && r.prefill_worker_id == 31 && r.router_id == 9); /* v3: + model, router */
        CHECK_MEM_EQ(r.model_id, m.model_id, 32);
        pd_msg_link_ack a = {.link_epoch = 1}, ra;
        CHECK_EQ(pd_msg_link_ack_encode(&a, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_link_ack_decode(buf, n, &ra, &eb), KS_OK);
        CHECK(n == 8 && ra.link_epoch == 1);
        a.link_epoch = 0;
        CHECK_EQ(pd_msg_link_ack_encode(&a, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    }
    {
        pd_msg_deny m = {PD_DENY_DRAINING, TEXT512, 512}, r;
        CHECK_EQ(pd_msg_deny_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(n, 520);
        CHECK_EQ(pd_msg_deny_decode(buf, n, &r, &eb), KS_OK);
        CHECK(r.reason == 5 && r.msg_len == 512 && r.msg == (const char *)buf + 8);
        CHECK_MEM_EQ(r.msg, TEXT512, 512);
        m.msg_len = 513;
        CHECK_EQ(pd_msg_deny_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
        m.msg_len = 0;
        m.reason = PD_DENY_INVALID;
        CHECK_EQ(pd_msg_deny_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        m.reason = PD_DENY_MODEL; /* v3: another model's ADMIT */
        CHECK_EQ(pd_msg_deny_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_deny_decode(buf, n, &r, &eb), KS_OK);
        CHECK_EQ(r.reason, 7);
        m.reason = 8;
        CHECK_EQ(pd_msg_deny_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    }
    {
        pd_msg_reject m = {ADMIT_DRAINING, TEXT512, 512}, r;
        CHECK_EQ(pd_msg_reject_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(n, 524);
        CHECK_EQ(pd_msg_reject_decode(buf, n, &r, &eb), KS_OK);
        CHECK(r.reason == 6 && r.msg_len == 512);
        CHECK_MEM_EQ(r.msg, TEXT512, 512);
        m.reason = ADMIT_TENANT_RATE; // an HTTP-front reason never travels
        CHECK_EQ(pd_msg_reject_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    }
    {
        pd_msg_abort m = {PD_ABORT_CLIENT_GONE}, r;
        CHECK_EQ(pd_msg_abort_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_abort_decode(buf, n, &r, &eb), KS_OK);
        CHECK(n == 4 && r.reason == 1);
        m.reason = 7;
        CHECK_EQ(pd_msg_abort_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
        CHECK_EQ(pd_msg_abort_ack_decode(buf, 0, &eb), KS_OK);
        CHECK_EQ(pd_msg_abort_ack_decode(NULL, 0, &eb), KS_OK);
    }
    pd_msg_top top[64];
    for (int i = 0; i < 64; i++) top[i] = (pd_msg_top){i * 1000 - 7, -(float)i / 8.0f};
    {
        pd_msg_token m = {.token = -3, .logprob = -0.5f, .n_top = 64}, r;
        CHECK_EQ(pd_msg_token_encode(&m, top, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(n, 12 + 8 * 64);
        CHECK_EQ(pd_msg_token_decode(buf, n, &r, &eb), KS_OK);
        CHECK(r.token == -3 && r.logprob == -0.5f && r.n_top == 64);
        for (uint32_t i = 0; i < 64; i++) {
            pd_msg_top t = pd_msg_top_at(r.top, i);
            CHECK(t.id == top[i].id && t.logprob == top[i].logprob);
        }
        m.n_top = 65;
        CHECK_EQ(pd_msg_token_encode(&m, top, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    }
    {
        pd_msg_done m = {.covered = 1, .first_token = 2, .logprob = -3.0f, .n_top = 64,
                         .rng_state = 12345, .cached = 1},
                    r;
        CHECK_EQ(pd_msg_done_encode(&m, top, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(n, 32 + 8 * 64);
        CHECK_EQ(pd_msg_done_decode(buf, n, &r, &eb), KS_OK);
        CHECK(r.covered == 1 && r.first_token == 2 && r.n_top == 64 && r.rng_state == 12345 &&
              r.cached == 1);
        pd_msg_top t = pd_msg_top_at(r.top, 63);
        CHECK(t.id == top[63].id && t.logprob == top[63].logprob);
        CHECK_EQ(pd_msg_done_encode(&m, top, buf, 32 + 8 * 64 - 1, &n, &eb), KS_ERR_NOSPACE);
        // cached beyond covered, or an unknown flag: refused
        m.cached = 2;
        CHECK_EQ(pd_msg_done_encode(&m, top, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
        m.cached = 0;
        CHECK_EQ(pd_msg_done_encode(&m, top, buf, sizeof buf, &n, &eb), KS_OK);
        buf[28] = 2; // flags other than PD_DONE_ADAPTER (test_pd_msg_adapter.c)
        CHECK_EQ(pd_msg_done_decode(buf, n, &r, &eb), KS_ERR_PROTO);
        CHECK_STR_HAS(eb.msg, "flags");
    }
    {
        pd_msg_finish m = {PD_FINISH_STOP, 60, 100, 0, TEXT512, 512, 48, 0}, r;
        CHECK_EQ(pd_msg_finish_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(n, 540);
        CHECK_EQ(pd_msg_finish_decode(buf, n, &r, &eb), KS_OK);
        CHECK(r.finish == 1 && r.n_prompt == 60 && r.n_gen == 100 && r.err == 0 &&
              r.msg_len == 512 && r.n_cached == 48);
        m.n_cached = 61;  // more cached than prompt tokens
        CHECK_EQ(pd_msg_finish_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
        m.n_cached = 0;
        m.err = KS_ERR_PROTO;
        CHECK_EQ(pd_msg_finish_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
        m.finish = PD_FINISH_ABORT;
        CHECK_EQ(pd_msg_finish_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        m.reason = ADMIT_DRAINING; // a refusal travels with an ERROR/ABORT
        CHECK_EQ(pd_msg_finish_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_finish_decode(buf, n, &r, &eb), KS_OK);
        CHECK_EQ(r.reason, ADMIT_DRAINING);
        m.reason = ADMIT_TENANT_CONCURRENCY; // an HTTP-front reason never travels
        CHECK_EQ(pd_msg_finish_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
        m.reason = ADMIT_BUSY;
        m.finish = PD_FINISH_LENGTH;
        m.err = 0;
        CHECK_EQ(pd_msg_finish_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    }
    {
        pd_msg_error m = {KS_ERR_PROTO, TEXT512, 512}, r;
        CHECK_EQ(pd_msg_error_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(n, 520);
        CHECK_EQ(pd_msg_error_decode(buf, n, &r, &eb), KS_OK);
        CHECK(r.err == KS_ERR_PROTO && r.msg_len == 512);
    }
    {
        pd_msg_admit m = {.n_prompt = 1, .prefill_worker_id = 0, .s = SAMP};
        m.s.n_probs = 64;
        m.s.flags = 0;
        pd_msg_admit r;
        CHECK_EQ(pd_msg_admit_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(pd_msg_admit_decode(buf, n, &r, &eb), KS_OK);
        CHECK(r.n_prompt == 1 && r.s.n_probs == 64 && r.s.flags == 0);
        m.s.n_probs = 65;
        CHECK_EQ(pd_msg_admit_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
        CHECK_STR_HAS(eb.msg, "n_probs");
    }
    {
        pd_msg_kv_page m = {.page_index = 0, .page_id = 1, .tag_seq_uid = 2, .tag_gen = 3,
                            .n_rows = 16, .layer_first = 0, .layer_count = 4},
                       r;
        CHECK_EQ(pd_msg_kv_page_encode(&m, &GEOM, buf, sizeof buf, &n, &eb), KS_OK);
        CHECK_EQ(n, 40);
        CHECK_EQ(pd_msg_kv_page_decode(buf, n, (uint32_t)pd_msg_kv_page_len(&GEOM, 16, 4),
                                       &GEOM, &r, &eb),
                 KS_OK);
        CHECK(r.n_rows == 16 && r.layer_count == 4);
        m.layer_first = 1;
        CHECK_EQ(pd_msg_kv_page_encode(&m, &GEOM, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    }
}

static void test_round_trip_big(void) {
    ks_errbuf eb;
    uint32_t n;
    /* GRANT at its largest: 174760 pages of one token (4194304 bytes) */
    uint32_t np = (PD_MSG_GRANT_MAX - 64) / 24;
    CHECK_EQ(np, 174760);
    pd_msg_grant_entry *en = malloc(sizeof *en * (np + 1));
    CHECK(en);
    pd_msg_grant m = {.seq_uid = 1, .link_epoch = 2, .n_prompt = np, .page_tokens = 1};
    m.n_pages = fill_entries(en, np, 1);
    size_t cap = PD_MSG_PREFILL_MAX + 64;
    uint8_t *buf = malloc(cap);
    CHECK(buf);
    CHECK_EQ(pd_msg_grant_encode(&m, en, buf, cap, &n, &eb), KS_OK);
    CHECK_EQ(n, 4194304);
    pd_msg_grant g;
    CHECK_EQ(pd_msg_grant_decode(buf, n, &g, &eb), KS_OK);
    CHECK_EQ(g.n_pages, np);
    CHECK_EQ(pd_msg_grant_entry_at(&g, np - 1).first_token, np - 1);
    /* one page more is over the 4 MiB bound */
    m.n_prompt = np + 1;
    m.n_pages = fill_entries(en, np + 1, 1);
    CHECK_EQ(pd_msg_grant_encode(&m, en, buf, cap, &n, &eb), KS_ERR_INVAL);
    pd_store_u32(buf + 16, np + 1);
    pd_store_u32(buf + 24, np + 1);
    REJECTS(PD_MSG_GRANT, buf, 4194328, "bound");
    free(en);

    /* PREFILL at exactly 16 MiB: one page covering n_prompt = 4194262 tokens */
    uint32_t nt = 4194262;
    int32_t *tok = malloc(sizeof *tok * (nt + 1));
    CHECK(tok);
    for (uint32_t i = 0; i <= nt; i++) tok[i] = (int32_t)(i * 2654435761u);
    pd_msg_grant_entry one = {.page_id = 5, .first_token = 0, .n_tokens = nt, .gen = 9};
    pd_msg_grant g1 = {.seq_uid = 3, .link_epoch = 4, .n_prompt = nt, .page_tokens = nt,
                       .n_pages = 1};
    uint8_t gbytes[88];
    CHECK_EQ(pd_msg_grant_encode(&g1, &one, gbytes, sizeof gbytes, &n, &eb), KS_OK);
    pd_msg_prefill p = {.decode_worker_id = 8, .n_prompt = nt, .s = SAMP, .grant = gbytes,
                        .grant_len = 88};
    CHECK_EQ(pd_msg_prefill_size(88, nt), PD_MSG_PREFILL_MAX);
    CHECK_EQ(pd_msg_prefill_encode(&p, tok, buf, cap, &n, &eb), KS_OK);
    CHECK_EQ(n, PD_MSG_PREFILL_MAX);
    pd_msg_prefill r;
    CHECK_EQ(pd_msg_prefill_decode(buf, n, &r, &eb), KS_OK);
    CHECK(r.decode_worker_id == 8 && r.n_prompt == nt && r.grant_len == 88);
    CHECK_MEM_EQ(r.grant, gbytes, 88);
    CHECK(r.grant == buf + 80 && r.tokens == buf + 168);
    for (uint32_t i = 0; i < nt; i += 4099) CHECK_EQ(pd_msg_prefill_token(&r, i), tok[i]);
    CHECK_EQ(pd_msg_prefill_token(&r, nt - 1), tok[nt - 1]);
    CHECK_EQ(pd_msg_prefill_grant(&r, &g, &eb), KS_OK);
    CHECK(g.seq_uid == 3 && g.n_pages == 1);
    /* one token more is over the 16 MiB bound */
    p.n_prompt = nt + 1;
    CHECK_EQ(pd_msg_prefill_encode(&p, tok, buf, cap, &n, &eb), KS_ERR_INVAL);
    pd_store_u32(buf + 4, nt + 1);
    REJECTS(PD_MSG_PREFILL, buf, PD_MSG_PREFILL_MAX + 4, "bound");
    free(tok);
    free(buf);
}

// ----------------------------------------------------------------------------
// Rejections

/* Every truncation and one trailing byte of every sample. */
static void test_truncation_and_trailing(void) {
    static uint8_t buf[4096];
    for (size_t i = 0; i < N_TYPES; i++) {
        uint16_t t = ALL_TYPES[i];
        uint32_t n = sample(t, buf, sizeof buf);
        ks_errbuf eb;
        CHECK_EQ(dec_any(t, buf, n, &eb), KS_OK);
        if (t == PD_MSG_KV_PAGE) {
            /* the page header: every short prefix; the frame len: +-1 */
            for (uint32_t l = 0; l < n; l++) REJECTS(t, buf, l, "page header");
            pd_msg_kv_page k;
            uint32_t want = (uint32_t)pd_msg_kv_page_len(&GEOM, 12, 2);
            CHECK_EQ(pd_msg_kv_page_decode(buf, 40, want - 1, &GEOM, &k, &eb), KS_ERR_PROTO);
            CHECK_STR_HAS(eb.msg, "KV_PAGE: len");
            CHECK_EQ(pd_msg_kv_page_decode(buf, 40, want + 1, &GEOM, &k, &eb), KS_ERR_PROTO);
            continue;
        }
        for (uint32_t l = 0; l < n; l++) {
            ks_errbuf e2;
            if (dec_any(t, buf, l, &e2) != KS_ERR_PROTO) {
                fprintf(stderr, "%s accepted a truncation to %u of %u\n", pd_msg_type_name(t),
                        l, n);
                abort();
            }
            CHECK_STR_HAS(e2.msg, pd_msg_type_name(t));
        }
        buf[n] = 0;
        REJECTS(t, buf, n + 1, "");
    }
}

/* Each length field off by one in both directions (len unchanged), and each
 * count/length over its bound with len made consistent. */
static void test_length_fields(void) {
    static uint8_t buf[4096];
    struct {
        uint16_t type;
        uint32_t off, width; /* the length field */
        const char *field;
    } lf[] = {
        {PD_MSG_REGISTER, 26, 2, "host_len"}, {PD_MSG_PEER, 6, 2, "host_len"},
        {PD_MSG_DENY, 4, 4, "msg_len"},       {PD_MSG_REJECT, 8, 4, "msg_len"},
        {PD_MSG_FINISH, 20, 4, "msg_len"},    {PD_MSG_ERROR, 4, 4, "msg_len"},
        {PD_MSG_DONE, 12, 4, "n_top"},        {PD_MSG_TOKEN, 8, 4, "n_top"},
        {PD_MSG_GRANT, 24, 4, "n_pages"},     {PD_MSG_PREFILL, 76, 4, "grant_len"},
        {PD_MSG_PREFILL, 4, 4, "n_prompt"},
    };
    for (size_t i = 0; i < sizeof lf / sizeof lf[0]; i++) {
        uint32_t n = sample(lf[i].type, buf, sizeof buf);
        const uint8_t *f = buf + lf[i].off;
        uint32_t v = lf[i].width == 2 ? pd_load_u16(f) : pd_load_u32(f);
        for (int d = -1; d <= 1; d += 2) {
            uint8_t cp[4096];
            memcpy(cp, buf, n);
            if (lf[i].width == 2) pd_store_u16(cp + lf[i].off, (uint16_t)(v + (uint32_t)d));
            else pd_store_u32(cp + lf[i].off, v + (uint32_t)d);
            ks_errbuf eb;
            CHECK_EQ(dec_any(lf[i].type, cp, n, &eb), KS_ERR_PROTO);
            CHECK_STR_HAS(eb.msg, pd_msg_type_name(lf[i].type));
            CHECK_STR_HAS(eb.msg, lf[i].field);
        }
        /* all ones: huge count, must not overflow into acceptance */
        uint8_t cp[4096];
        memcpy(cp, buf, n);
        memset(cp + lf[i].off, 0xff, lf[i].width);
        REJECTS(lf[i].type, cp, n, lf[i].field);
    }
    /* over-bound counts with a consistent len */
    static uint8_t big[4096];
    memset(big, 0, sizeof big);
    big[0] = PD_ROLE_DECODE;
    pd_store_u16(big + 26, 256);
    REJECTS(PD_MSG_REGISTER, big, 60 + 256, "host_len 256 exceeds 255");
    memset(big, 0, sizeof big);
    pd_store_u16(big + 6, 256);
    REJECTS(PD_MSG_PEER, big, 8 + 256, "host_len 256 exceeds 255");
    struct {
        uint16_t type;
        uint32_t fixed, off;
    } tx[] = {
        {PD_MSG_DENY, 8, 4}, {PD_MSG_REJECT, 12, 8}, {PD_MSG_FINISH, 28, 20}, {PD_MSG_ERROR, 8, 4}};
    for (size_t i = 0; i < 4; i++) {
        memset(big, 0, sizeof big);
        pd_store_u32(big, 1);
        pd_store_u32(big + tx[i].off, 513);
        REJECTS(tx[i].type, big, tx[i].fixed + 513, "msg_len 513 exceeds 512");
        pd_store_u32(big + tx[i].off, 512); /* the boundary itself is fine */
        ks_errbuf eb;
        if (tx[i].type == PD_MSG_FINISH) pd_store_u32(big, 1);
        CHECK_EQ(dec_any(tx[i].type, big, tx[i].fixed + 512, &eb), KS_OK);
    }
    memset(big, 0, sizeof big);
    pd_store_u32(big + 12, 65);
    REJECTS(PD_MSG_DONE, big, 24 + 8 * 65, "n_top 65 exceeds 64");
    memset(big, 0, sizeof big);
    pd_store_u32(big + 8, 65);
    REJECTS(PD_MSG_TOKEN, big, 12 + 8 * 65, "n_top 65 exceeds 64");
    /* PREFILL: grant_len not matching the embedded grant's n_pages */
    uint32_t n = sample(PD_MSG_PREFILL, buf, sizeof buf);
    pd_store_u32(buf + 80 + 24, 3); /* grant says 3 pages, grant_len holds 4 */
    REJECTS(PD_MSG_PREFILL, buf, n, "PREFILL: grant");
    n = sample(PD_MSG_PREFILL, buf, sizeof buf);
    /* grant_len shorter than a GRANT's fixed part, tokens fill the rest */
    memset(big, 0, sizeof big);
    pd_store_u32(big + 4, 1);  /* n_prompt */
    pd_store_u32(big + 76, 8); /* grant_len */
    REJECTS(PD_MSG_PREFILL, big, 80 + 8 + 4, "PREFILL: grant");
}

static void put_u32(uint8_t *cp, const uint8_t *src, uint32_t n, uint32_t off, uint32_t v) {
    memcpy(cp, src, n);
    pd_store_u32(cp + off, v);
}

static void test_enums_and_ranges(void) {
    static uint8_t buf[4096], cp[4096];
    uint32_t n;
    n = sample(PD_MSG_REGISTER, buf, sizeof buf);
    memcpy(cp, buf, n);
    for (uint8_t role = 0; role < 6; role++) {
        cp[0] = role;
        ks_errbuf eb;
        CHECK_EQ(dec_any(PD_MSG_REGISTER, cp, n, &eb) == KS_OK, role == 2 || role == 3);
    }
    n = sample(PD_MSG_LINK_ACK, buf, sizeof buf);
    memset(cp, 0, 8);
    REJECTS(PD_MSG_LINK_ACK, cp, 8, "link_epoch is 0");

    n = sample(PD_MSG_ADMIT, buf, sizeof buf);
    put_u32(cp, buf, n, 0, 0);
    REJECTS(PD_MSG_ADMIT, cp, n, "n_prompt");
    put_u32(cp, buf, n, 4, 0);
    REJECTS(PD_MSG_ADMIT, cp, n, "max_tokens");
    put_u32(cp, buf, n, 12, 32); /* 8 is PD_FLAG_PROMPT_LP, 16 PD_FLAG_ADAPTER */
    REJECTS(PD_MSG_ADMIT, cp, n, "flags");
    put_u32(cp, buf, n, 72, 65);
    REJECTS(PD_MSG_ADMIT, cp, n, "n_probs 65");
    put_u32(cp, buf, n, 76, 0xffffffff); /* reserved */
    ks_errbuf eb;
    CHECK_EQ(dec_any(PD_MSG_ADMIT, cp, n, &eb), KS_OK);

    n = sample(PD_MSG_PREFILL, buf, sizeof buf);
    put_u32(cp, buf, n, 12, 0x80);
    REJECTS(PD_MSG_PREFILL, cp, n, "flags");
    put_u32(cp, buf, n, 72, 65);
    REJECTS(PD_MSG_PREFILL, cp, n, "n_probs");

    n = sample(PD_MSG_DENY, buf, sizeof buf);
    put_u32(cp, buf, n, 0, 0);
    REJECTS(PD_MSG_DENY, cp, n, "reason 0");
    put_u32(cp, buf, n, 0, 8);
    REJECTS(PD_MSG_DENY, cp, n, "reason 8");

    n = sample(PD_MSG_REJECT, buf, sizeof buf);
    put_u32(cp, buf, n, 0, 0);
    REJECTS(PD_MSG_REJECT, cp, n, "reason 0");
    put_u32(cp, buf, n, 0, ADMIT_TENANT_CONCURRENCY); /* 11: HTTP front only */
    REJECTS(PD_MSG_REJECT, cp, n, "reason 11");
    memcpy(cp, buf, n);
    pd_store_u32(cp + 4, 0xbeef); /* reserved */
    CHECK_EQ(dec_any(PD_MSG_REJECT, cp, n, &eb), KS_OK);

    n = sample(PD_MSG_ABORT, buf, sizeof buf);
    put_u32(cp, buf, n, 0, 0);
    REJECTS(PD_MSG_ABORT, cp, n, "reason 0");
    put_u32(cp, buf, n, 0, 7);
    REJECTS(PD_MSG_ABORT, cp, n, "reason 7");

    n = sample(PD_MSG_FINISH, buf, sizeof buf);
    put_u32(cp, buf, n, 0, 0);
    REJECTS(PD_MSG_FINISH, cp, n, "finish 0");
    put_u32(cp, buf, n, 0, 5);
    REJECTS(PD_MSG_FINISH, cp, n, "finish 5");
    put_u32(cp, buf, n, 12, KS_ERR__COUNT);
    REJECTS(PD_MSG_FINISH, cp, n, "err");
    put_u32(cp, buf, n, 0, PD_FINISH_LENGTH); /* err PROTO with LENGTH */
    REJECTS(PD_MSG_FINISH, cp, n, "must be 0");

    n = sample(PD_MSG_ERROR, buf, sizeof buf);
    put_u32(cp, buf, n, 0, 0);
    REJECTS(PD_MSG_ERROR, cp, n, "err 0");
    put_u32(cp, buf, n, 0, KS_ERR__COUNT);
    REJECTS(PD_MSG_ERROR, cp, n, "err");

    n = sample(PD_MSG_HEALTH_ACK, buf, sizeof buf);
    put_u32(cp, buf, n, 20, 0xffffffff); /* flags (once reserved): unknown bits */
    REJECTS(PD_MSG_HEALTH_ACK, cp, n, "flags");
    n = sample(PD_MSG_LINK, buf, sizeof buf);
    put_u32(cp, buf, n, 4, 0xffffffff); /* reserved */
    CHECK_EQ(dec_any(PD_MSG_LINK, cp, n, &eb), KS_OK);
}

static void test_grant_coverage(void) {
    static uint8_t buf[4096], cp[4096];
    uint32_t n = sample(PD_MSG_GRANT, buf, sizeof buf); /* 60 tokens, 16/page, 4 pages */
    ks_errbuf eb;
    pd_msg_grant g;
    CHECK_EQ(n, 64 + 4 * 24);
#define ENT(i, f) (64 + 24 * (i) + (f))
    /* the doc's example: last page claims 22 rows */
    put_u32(cp, buf, n, ENT(3, 8), 22);
    CHECK_EQ(pd_msg_grant_decode(cp, n, &g, &eb), KS_ERR_PROTO);
    CHECK_STR_EQ(eb.msg, "GRANT: page 3 covers tokens [48, 70) but n_prompt is 60");
    /* gap: page 1 starts at 17 */
    put_u32(cp, buf, n, ENT(1, 4), 17);
    REJECTS(PD_MSG_GRANT, cp, n, "page 1 has first_token 17, expected 16");
    /* overlap: page 2 starts at 30 */
    put_u32(cp, buf, n, ENT(2, 4), 30);
    REJECTS(PD_MSG_GRANT, cp, n, "page 2 has first_token 30, expected 32");
    /* short middle page (gap after it; sum 59) */
    put_u32(cp, buf, n, ENT(1, 8), 15);
    REJECTS(PD_MSG_GRANT, cp, n, "page 1 covers tokens [16, 31), expected [16, 32)");
    /* short last page: sum 59 != n_prompt */
    put_u32(cp, buf, n, ENT(3, 8), 11);
    REJECTS(PD_MSG_GRANT, cp, n, "page 3 covers tokens [48, 59), expected [48, 60)");
    /* empty page */
    put_u32(cp, buf, n, ENT(0, 8), 0);
    REJECTS(PD_MSG_GRANT, cp, n, "page 0 covers tokens [0, 0)");
    /* long middle page (overlap with the next) */
    put_u32(cp, buf, n, ENT(0, 8), 17);
    REJECTS(PD_MSG_GRANT, cp, n, "page 0 covers tokens [0, 17)");
    /* n_prompt changed: n_pages inconsistent */
    put_u32(cp, buf, n, 16, 64 + 1);
    REJECTS(PD_MSG_GRANT, cp, n, "n_pages 4 but ceil(n_prompt 65 / page_tokens 16) is 5");
    put_u32(cp, buf, n, 16, 48); /* 3 pages needed: the 4th is not a state page */
    REJECTS(PD_MSG_GRANT, cp, n, "page 3 past the prompt's 3 is not a state page");
    /* n_pages 5 with a 5th entry (len consistent): only state entries may follow */
    memcpy(cp, buf, n);
    memcpy(cp + n, cp + ENT(3, 0), 24);
    pd_store_u32(cp + 24, 5);
    REJECTS(PD_MSG_GRANT, cp, n + 24, "page 4 past the prompt's 4 is not a state page");
    /* ... as a recurrent-state entry (hybrid models) it is accepted: n_state 1 */
    pd_store_u32(cp + n + 4, PD_MSG_STATE_PAGE);
    pd_store_u32(cp + n + 8, 16);
    CHECK_EQ(pd_msg_grant_decode(cp, n + 24, &g, &eb), KS_OK);
    CHECK_EQ(g.n_pages, 5);
    CHECK_EQ(g.n_state, 1);
    CHECK_EQ(pd_msg_grant_entry_at(&g, 4).first_token, PD_MSG_STATE_PAGE);
    pd_store_u32(cp + n + 8, 15); /* a state page travels whole: n_tokens = page_tokens */
    REJECTS(PD_MSG_GRANT, cp, n + 24, "page 4 past the prompt's 4 is not a state page");
    /* a state entry in the prompt's pages is a gap */
    memcpy(cp, buf, n);
    pd_store_u32(cp + ENT(3, 4), PD_MSG_STATE_PAGE);
    REJECTS(PD_MSG_GRANT, cp, n, "page 3 has first_token 4294967295, expected 48");
    CHECK_EQ(pd_msg_grant_decode(buf, n, &g, &eb), KS_OK);
    CHECK_EQ(g.n_state, 0); /* a plain model's grant, byte for byte as before */
    put_u32(cp, buf, n, 20, 0);
    REJECTS(PD_MSG_GRANT, cp, n, "page_tokens is 0");
    put_u32(cp, buf, n, 20, 15); /* 60/15 = 4 pages, but entries are 16-based */
    REJECTS(PD_MSG_GRANT, cp, n, "page 0 covers tokens [0, 16), expected [0, 15)");
    memcpy(cp, buf, n);
    pd_store_u64(cp + 8, 0);
    REJECTS(PD_MSG_GRANT, cp, n, "link_epoch is 0");
    /* n_prompt 0 with 0 pages */
    memset(cp, 0, 64);
    pd_store_u64(cp + 8, 1);
    pd_store_u32(cp + 20, 16);
    REJECTS(PD_MSG_GRANT, cp, 64, "n_prompt is 0");
    /* first_token + n_tokens overflowing u32 must not wrap into acceptance */
    put_u32(cp, buf, n, ENT(3, 8), 0xffffffff - 47);
    REJECTS(PD_MSG_GRANT, cp, n, "page 3 covers");
    /* huge page_tokens: ceil without overflow */
    memset(cp, 0, 88);
    pd_store_u64(cp + 8, 1);
    pd_store_u32(cp + 16, 0xffffffff);
    pd_store_u32(cp + 20, 0xffffffff);
    pd_store_u32(cp + 24, 1);
    pd_store_u32(cp + 64 + 8, 0xffffffff);
    CHECK_EQ(pd_msg_grant_decode(cp, 88, &g, &eb), KS_OK);
    /* reserved fields ignored; offset 28 (ucx_key_len since v3) must fit len */
    put_u32(cp, buf, n, 28, 0xdeadbeef);
    REJECTS(PD_MSG_GRANT, cp, n, "ucx_key_len");
    put_u32(cp, buf, n, 28, 0);
    pd_store_u32(cp + ENT(2, 12), 0xdeadbeef);
    CHECK_EQ(pd_msg_grant_decode(cp, n, &g, &eb), KS_OK);
    /* encoder refuses the same mistakes */
    pd_msg_grant_entry en[4];
    pd_msg_grant m = {.seq_uid = 1, .link_epoch = 1, .n_prompt = 60, .page_tokens = 16};
    m.n_pages = fill_entries(en, 60, 16);
    en[2].first_token = 31;
    uint32_t len;
    CHECK_EQ(pd_msg_grant_encode(&m, en, cp, sizeof cp, &len, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "page 2");

    /* PREFILL: a bad embedded grant parses as PREFILL but fails the grant check */
    n = sample(PD_MSG_PREFILL, buf, sizeof buf);
    put_u32(cp, buf, n, 80 + ENT(3, 8), 22);
    pd_msg_prefill p;
    CHECK_EQ(pd_msg_prefill_decode(cp, n, &p, &eb), KS_OK);
    CHECK_EQ(pd_msg_prefill_grant(&p, &g, &eb), KS_ERR_PROTO);
    CHECK_STR_EQ(eb.msg,
                 "PREFILL: grant: GRANT: page 3 covers tokens [48, 70) but n_prompt is 60");
    /* PREFILL n_prompt differs from the grant's (len kept consistent) */
    uint8_t g20[64 + 48];
    pd_msg_grant_entry e2[2];
    pd_msg_grant gm = {.seq_uid = 1, .link_epoch = 1, .n_prompt = 20, .page_tokens = 16};
    gm.n_pages = fill_entries(e2, 20, 16);
    CHECK_EQ(pd_msg_grant_encode(&gm, e2, g20, sizeof g20, &len, &eb), KS_OK);
    int32_t tok[21] = {0};
    pd_msg_prefill pm = {.n_prompt = 21, .s = SAMP, .grant = g20, .grant_len = len};
    CHECK_EQ(pd_msg_prefill_encode(&pm, tok, cp, sizeof cp, &len, &eb), KS_OK);
    CHECK_EQ(pd_msg_prefill_decode(cp, len, &p, &eb), KS_OK);
    CHECK_EQ(pd_msg_prefill_grant(&p, &g, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "PREFILL: n_prompt 21 but its grant covers 20");
#undef ENT
}

static void test_kv_page_checks(void) {
    static uint8_t buf[64], cp[64];
    uint32_t n = sample(PD_MSG_KV_PAGE, buf, sizeof buf);
    uint32_t ok_len = (uint32_t)pd_msg_kv_page_len(&GEOM, 12, 2);
    pd_msg_kv_page k;
    ks_errbuf eb;
#define KVREJ(has, frame)                                                                \
    do {                                                                                 \
        CHECK_EQ(pd_msg_kv_page_decode(cp, n, (frame), &GEOM, &k, &eb), KS_ERR_PROTO);   \
        CHECK_STR_HAS(eb.msg, "KV_PAGE: ");                                              \
        CHECK_STR_HAS(eb.msg, has);                                                      \
    } while (0)
    memcpy(cp, buf, n);
    KVREJ("len", ok_len - 4); /* one float short */
    KVREJ("len", ok_len + 4);
    KVREJ("len", pd_msg_kv_page_len(&GEOM, 16, 2)); /* full page but n_rows 12 */
    KVREJ("len", pd_msg_kv_page_len(&GEOM, 12, 1));
    KVREJ("len", 40);
    put_u32(cp, buf, n, 24, 0);
    KVREJ("n_rows 0", 40);
    put_u32(cp, buf, n, 24, 17);
    KVREJ("n_rows 17", (uint32_t)pd_msg_kv_page_len(&GEOM, 17, 2));
    put_u32(cp, buf, n, 32, 0);
    KVREJ("layer_count is 0", 40);
    put_u32(cp, buf, n, 28, 3); /* layers [3, 5) of 4 */
    KVREJ("exceed n_layer 4", ok_len);
    put_u32(cp, buf, n, 28, 0xffffffff); /* overflow */
    KVREJ("exceed n_layer", ok_len);
    /* the same header is fine for another geometry's exact len */
    kv_geom g2 = {.n_layer = 4, .kv_dim = 16, .page_tokens = 16};
    memcpy(cp, buf, n);
    CHECK_EQ(pd_msg_kv_page_decode(cp, n, ok_len, &g2, &k, &eb), KS_ERR_PROTO);
    CHECK_EQ(pd_msg_kv_page_decode(cp, n, (uint32_t)pd_msg_kv_page_len(&g2, 12, 2), &g2, &k,
                                   &eb),
             KS_OK);
    /* a link of another KV type: the length follows its row bytes, so an f32
       frame_len is refused on an f16 link (and the f16 length accepted) */
    kv_geom g16 = GEOM, g8 = GEOM;
    g16.kv_type = KS_DTYPE_F16;
    g8.kv_type = KS_DTYPE_Q8_0; /* kv_dim 8: not a whole block */
    memcpy(cp, buf, n);
    CHECK_EQ(pd_msg_kv_page_decode(cp, n, ok_len, &g16, &k, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "(f16, 16 bytes a row)");
    CHECK_EQ(pd_msg_kv_page_len(&g16, 12, 2), 40 + 2 * 2 * 12 * 8 * 2);
    CHECK_EQ(pd_msg_kv_page_decode(cp, n, (uint32_t)pd_msg_kv_page_len(&g16, 12, 2), &g16, &k, &eb),
             KS_OK);
    CHECK_EQ(pd_msg_kv_page_decode(cp, n, 40, &g8, &k, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "no valid geometry");
    put_u32(cp, buf, n, 36, 0xffffffff); /* reserved */
    CHECK_EQ(pd_msg_kv_page_decode(cp, n, ok_len, &GEOM, &k, &eb), KS_OK);
#undef KVREJ
}

/* Plane counts (kv.h kv_geom.planes): REGISTER carries them in byte 2 (0
 * from an older sender reads as 2, 3+ is PROTO), and a KV_PAGE's length
 * follows them: a 1-plane link's pages are half the data, and a frame sized
 * for the other plane count is refused with a message naming both. */
static void test_planes(void) {
    ks_errbuf eb;
    uint8_t buf[512];
    uint32_t n;
    /* REGISTER */
    pd_msg_register m = {.role = PD_ROLE_DECODE,
                         .kv_type = KS_DTYPE_F16,
                         .planes = 1,
                         .n_layer = 27,
                         .kv_dim = 576,
                         .page_tokens = 16,
                         .n_pages = 64,
                         .n_ctx = 4096,
                         .data_port = 7071,
                         .host = "h",
                         .host_len = 1};
    memset(m.model_id, 0x5a, 32);
    CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 65);
    CHECK(buf[1] == KS_DTYPE_F16 && buf[2] == 1 && buf[3] == 0);
    pd_msg_register r;
    CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_OK);
    CHECK_EQ(r.planes, 1);
    CHECK(r.kv_type == KS_DTYPE_F16 && r.kv_dim == 576 && r.n_layer == 27);
    buf[2] = 2;
    CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_OK);
    CHECK_EQ(r.planes, 2);
    buf[2] = 0; /* a sender from before the field: its pages had K and V */
    CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_OK);
    CHECK_EQ(r.planes, 2);
    for (unsigned v = 3; v < 256; v += 84) {
        buf[2] = (uint8_t)v;
        char want[48];
        snprintf(want, sizeof want, "REGISTER: planes %u is not 1", v);
        CHECK_EQ(pd_msg_register_decode(buf, n, &r, &eb), KS_ERR_PROTO);
        CHECK_STR_HAS(eb.msg, want);
    }
    m.planes = 3;
    CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "planes 3");
    m.planes = 0;
    CHECK_EQ(pd_msg_register_encode(&m, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(buf[2], 2);

    /* KV_PAGE lengths and bounds */
    kv_geom g2 = GEOM, g1 = GEOM, gx = GEOM;
    g2.planes = 2;
    g1.planes = 1;
    CHECK_EQ(pd_msg_kv_page_len(&GEOM, 12, 2), 40 + 2 * 2 * 12 * 8 * 4);
    CHECK_EQ(pd_msg_kv_page_len(&g2, 12, 2), 40 + 2 * 2 * 12 * 8 * 4);
    CHECK_EQ(pd_msg_kv_page_len(&g1, 12, 2), 40 + 2 * 1 * 12 * 8 * 4);
    uint32_t tm[PD_MSG_N_TYPES];
    kv_geom mla = {
        .n_layer = 27, .kv_dim = 576, .page_tokens = 16, .kv_type = KS_DTYPE_F16, .planes = 1};
    CHECK_EQ(pd_msg_type_max(&mla, tm, &eb), KS_OK);
    CHECK_EQ(tm[PD_MSG_KV_PAGE], 40 + 27 * 1 * 16 * 576 * 2);
    gx.planes = 3;
    CHECK_EQ(pd_msg_type_max(&gx, tm, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "planes 3 is not 1 or 2");
    gx.planes = -1;
    CHECK_EQ(pd_msg_type_max(&gx, tm, &eb), KS_ERR_INVAL);

    /* KV_PAGE header against 1- and 2-plane links */
    pd_msg_kv_page h = {.page_index = 3,
                        .page_id = 1021,
                        .tag_seq_uid = 77,
                        .tag_gen = 11,
                        .n_rows = 12,
                        .layer_first = 1,
                        .layer_count = 2},
                   k;
    uint8_t hdr[40];
    CHECK_EQ(pd_msg_kv_page_encode(&h, &g1, hdr, sizeof hdr, &n, &eb), KS_OK);
    CHECK_EQ(n, 40);
    uint32_t len1 = (uint32_t)pd_msg_kv_page_len(&g1, 12, 2);
    uint32_t len2 = (uint32_t)pd_msg_kv_page_len(&g2, 12, 2);
    CHECK_EQ(len2 - 40, 2 * (len1 - 40));
    CHECK_EQ(pd_msg_kv_page_decode(hdr, 40, len1, &g1, &k, &eb), KS_OK);
    CHECK(k.page_id == 1021 && k.n_rows == 12 && k.layer_count == 2);
    /* a 2-plane sender's frame on a 1-plane link */
    CHECK_EQ(pd_msg_kv_page_decode(hdr, 40, len2, &g1, &k, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "KV_PAGE: len 1576 fits pages of 2 planes (K, V) per layer, but this "
                          "link's pages have 1 plane: 2 layers x 1 plane x 12 rows x 32 bytes "
                          "need 808");
    /* and the other way round */
    CHECK_EQ(pd_msg_kv_page_decode(hdr, 40, len1, &GEOM, &k, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "fits pages of 1 plane per layer, but this link's pages have 2 planes");
    /* any other wrong length still gets the plain message, with the plane count */
    CHECK_EQ(pd_msg_kv_page_decode(hdr, 40, len1 + 4, &g1, &k, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "but 2 layers x 1 plane x 12 rows x kv_dim 8");
    /* a link geometry with a bad plane count decodes nothing */
    CHECK_EQ(pd_msg_kv_page_decode(hdr, 40, len1, &gx, &k, &eb), KS_ERR_PROTO);
    CHECK_STR_HAS(eb.msg, "no valid geometry");
}

// ----------------------------------------------------------------------------
// Random input

static void test_random(void) {
    static uint8_t buf[4096], smp[4096];
    long accepted = 0;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint16_t t = ALL_TYPES[ti];
        uint32_t sn = sample(t, smp, sizeof smp);
        for (int it = 0; it < 3000; it++) {
            uint32_t n;
            if (it % 2 == 0) { /* pure random bytes */
                n = rnd() % 700;
                for (uint32_t i = 0; i < n; i++) buf[i] = (uint8_t)rnd();
            } else { /* a valid sample with a few bytes changed and maybe resized */
                n = sn;
                memcpy(buf, smp, sn);
                int flips = 1 + (int)(rnd() % 4);
                for (int f = 0; f < flips && n; f++) buf[rnd() % n] = (uint8_t)rnd();
                if (rnd() % 4 == 0) n = rnd() % (sn + 16);
            }
            ks_errbuf eb;
            ks_errbuf_clear(&eb);
            ks_err e = dec_any(t, buf, n, &eb);
            CHECK(e == KS_OK || e == KS_ERR_PROTO);
            if (e) CHECK(eb.msg[0]);
            accepted += e == KS_OK;
        }
    }
    CHECK(accepted > 0);
    printf("random: %zu decoders x 3000 inputs, %ld accepted\n", N_TYPES, accepted);
}

/* The sampling extension (PD_FLAG_EXT) of ADMIT and PREFILL: penalties,
 * logit bias and grammar text cross the wire exactly, and every length or
 * value a peer could get wrong is refused as PROTO. */
static void test_sampling_ext(void) {
    static const char G[] = "root ::= \"yes\" | \"no\"";
    const uint32_t X = PD_MSG_SEXT_FIXED; /* the SAMPLE_WIRE_EXT slots + n_bias + grammar_len */
    const uint32_t gl = (uint32_t)strlen(G);
    uint8_t bias[16];
    pd_msg_bias_store(bias, 0, 17, 2.5f);
    pd_msg_bias_store(bias, 1, 31999, -100.0f);
    pd_msg_sampling s = SAMP;
    s.flags |= PD_FLAG_EXT;
    s.repeat_penalty = 1.25f;
    s.repeat_last_n = 64;
    s.frequency_penalty = 0.5f;
    s.presence_penalty = -0.25f;
    s.min_tokens = 7;
    s.n_bias = 2;
    s.bias = bias;
    s.grammar = G;
    s.grammar_len = gl;
    CHECK_EQ(pd_msg_sext_size(&s), X + 16 + gl);
    ks_errbuf eb;
    uint32_t n = 0;
    uint8_t buf[1024];

    // ADMIT: 112 (v3: the model_id) + extension
    pd_msg_admit a = {.n_prompt = 9, .prefill_worker_id = 3, .s = s}, ra;
    CHECK_EQ(pd_msg_admit_encode(&a, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 112 + X + 16 + gl);
    CHECK_EQ(pd_msg_admit_decode(buf, n, &ra, &eb), KS_OK);
    CHECK(ra.s.repeat_penalty == 1.25f && ra.s.repeat_last_n == 64 &&
          ra.s.frequency_penalty == 0.5f && ra.s.presence_penalty == -0.25f && ra.s.min_tokens == 7);
    CHECK(ra.s.n_bias == 2 && ra.s.grammar_len == gl && ra.s.grammar == (const char *)buf + 112 + X + 16);
    CHECK_MEM_EQ(ra.s.grammar, G, gl);
    int32_t t;
    float b;
    pd_msg_bias_at(&ra.s, 1, &t, &b);
    CHECK(t == 31999 && b == -100.0f);
    // the extension is all that follows the fixed part: one byte less or more is refused
    REJECTS(PD_MSG_ADMIT, buf, n - 1, "sampling extension");
    REJECTS(PD_MSG_ADMIT, buf, 112, "fixed part");
    // without the flag, ADMIT is exactly 112 bytes and reads the extension's defaults
    uint32_t flags = pd_load_u32(buf + 12);
    pd_store_u32(buf + 12, flags & ~PD_FLAG_EXT);
    REJECTS(PD_MSG_ADMIT, buf, n, "expected 112");
    CHECK_EQ(pd_msg_admit_decode(buf, 112, &ra, &eb), KS_OK);
    CHECK(ra.s.repeat_penalty == 1.0f && ra.s.repeat_last_n == 0 && ra.s.n_bias == 0 &&
          !ra.s.grammar && !ra.s.bias);
    pd_store_u32(buf + 12, flags | PD_FLAG_PROMPT_LP); // echo's prompt logprobs: a known bit
    CHECK_EQ(pd_msg_admit_decode(buf, n, &ra, &eb), KS_OK);
    CHECK(ra.s.flags & PD_FLAG_PROMPT_LP);
    pd_store_u32(buf + 12, flags | 64u);
    REJECTS(PD_MSG_ADMIT, buf, n, "unknown bits");
    pd_store_u32(buf + 12, flags);
    // counts over their bounds, non-finite penalties, bad entries, a NUL in the text
    uint8_t bad[1024];
    memcpy(bad, buf, n);
    pd_store_u32(bad + 112 + X - 8, PD_MSG_MAX_BIAS + 1);
    REJECTS(PD_MSG_ADMIT, bad, n, "n_bias");
    memcpy(bad, buf, n);
    pd_store_u32(bad + 112 + X - 4, PD_MSG_MAX_GRAMMAR + 1);
    REJECTS(PD_MSG_ADMIT, bad, n, "grammar_len");
    memcpy(bad, buf, n);
    pd_store_u32(bad + 112 + X - 4, gl + 1);
    REJECTS(PD_MSG_ADMIT, bad, n, "imply");
    memcpy(bad, buf, n);
    pd_store_u32(bad + 112 + 8, 0x7fc00000u); // NaN frequency penalty
    REJECTS(PD_MSG_ADMIT, bad, n, "finite");
    memcpy(bad, buf, n);
    pd_store_u32(bad + 112 + X, 0xffffffffu); // token -1
    REJECTS(PD_MSG_ADMIT, bad, n, "bias entry 0");
    memcpy(bad, buf, n);
    bad[112 + X + 16 + 3] = 0;
    REJECTS(PD_MSG_ADMIT, bad, n, "NUL");
    // the encoder refuses what the decoder would
    pd_msg_admit big = a;
    big.s.n_bias = PD_MSG_MAX_BIAS + 1;
    CHECK_EQ(pd_msg_admit_encode(&big, NULL, 0, &n, &eb), KS_ERR_INVAL);

    // PREFILL: the extension follows the prompt tokens
    uint8_t g[256];
    uint32_t glen = sample(PD_MSG_GRANT, g, sizeof g);
    int32_t tok[60];
    for (int i = 0; i < 60; i++)
        tok[i] = i * 7;
    pd_msg_prefill p = {.decode_worker_id = 2,
                        .n_prompt = 60,
                        .s = s,
                        .grant = g,
                        .grant_len = glen},
                   rp;
    CHECK_EQ(pd_msg_prefill_encode(&p, tok, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, pd_msg_prefill_size(glen, 60) + X + 16 + gl);
    CHECK_EQ(pd_msg_prefill_decode(buf, n, &rp, &eb), KS_OK);
    CHECK_EQ(pd_msg_prefill_token(&rp, 59), 59 * 7);
    CHECK(rp.s.n_bias == 2 && rp.s.grammar_len == gl && rp.s.repeat_last_n == 64);
    CHECK_MEM_EQ(rp.s.grammar, G, gl);
    REJECTS(PD_MSG_PREFILL, buf, n - 1, "sampling extension");
    REJECTS(PD_MSG_PREFILL, buf, (uint32_t)pd_msg_prefill_size(glen, 60) + X - 1, "fixed part");
    REJECTS(PD_MSG_PREFILL, buf, (uint32_t)pd_msg_prefill_size(glen, 59), "at least");
}

/* The UCX data plane's fields (issue 40): REGISTER data_plane, LINK_ACK's
 * worker address, GRANT's staging area and remote key; each round-trips,
 * each inconsistent length or value is PROTO, and the TLS plane's frames keep
 * their sizes. */
static void test_ucx_fields(void) {
    uint8_t buf[1024];
    uint32_t n = 0;
    ks_errbuf eb;
    // REGISTER byte 3
    pd_msg_register r = {.role = PD_ROLE_PREFILL, .n_layer = 2, .kv_dim = 8, .page_tokens = 16,
                         .n_pages = 4, .n_ctx = 64, .data_plane = PD_PLANE_UCX};
    CHECK_EQ(pd_msg_register_encode(&r, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(buf[3], 1);
    pd_msg_register rr;
    CHECK_EQ(pd_msg_register_decode(buf, n, &rr, &eb), KS_OK);
    CHECK_EQ(rr.data_plane, PD_PLANE_UCX);
    buf[3] = 2;
    CHECK_EQ(pd_msg_register_decode(buf, n, &rr, &eb), KS_ERR_PROTO);
    CHECK(strstr(eb.msg, "data_plane 2") != NULL);
    // LINK_ACK: 8 bytes without an address, 12 + len with one
    const uint8_t addr[5] = {1, 2, 3, 4, 5};
    pd_msg_link_ack a = {.link_epoch = 9}, ra;
    CHECK_EQ(pd_msg_link_ack_encode(&a, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 8);
    CHECK_EQ(pd_msg_link_ack_decode(buf, n, &ra, &eb), KS_OK);
    CHECK_EQ(ra.ucx_addr_len, 0);
    a.ucx_addr = addr;
    a.ucx_addr_len = 5;
    CHECK_EQ(pd_msg_link_ack_encode(&a, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, 17);
    CHECK_EQ(pd_msg_link_ack_decode(buf, n, &ra, &eb), KS_OK);
    CHECK(ra.link_epoch == 9 && ra.ucx_addr_len == 5 && !memcmp(ra.ucx_addr, addr, 5));
    CHECK_EQ(pd_msg_link_ack_decode(buf, n - 1, &ra, &eb), KS_ERR_PROTO);
    CHECK_EQ(pd_msg_link_ack_decode(buf, 10, &ra, &eb), KS_ERR_PROTO);
    pd_store_u32(buf + 8, 0);
    CHECK_EQ(pd_msg_link_ack_decode(buf, n, &ra, &eb), KS_ERR_PROTO);
    // GRANT: the trailer after the entries, its length in the old reserved field
    pd_msg_grant_entry en[4];
    const uint8_t key[7] = {9, 8, 7, 6, 5, 4, 3};
    pd_msg_grant g = {.seq_uid = 77, .link_epoch = 5, .n_prompt = 60, .page_tokens = 16};
    g.n_pages = fill_entries(en, 60, 16);
    CHECK_EQ(pd_msg_grant_encode(&g, en, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, pd_msg_grant_size(4));
    g.ucx_key_len = 7;
    g.ucx_key = key;
    g.ucx_addr = 0x7f0012345000ull;
    g.ucx_len = 1u << 20;
    CHECK_EQ(pd_msg_grant_encode(&g, en, buf, sizeof buf, &n, &eb), KS_OK);
    CHECK_EQ(n, pd_msg_grant_size(4) + 16 + 7);
    pd_msg_grant rg;
    CHECK_EQ(pd_msg_grant_decode(buf, n, &rg, &eb), KS_OK);
    CHECK(rg.ucx_key_len == 7 && rg.ucx_addr == g.ucx_addr && rg.ucx_len == g.ucx_len &&
          !memcmp(rg.ucx_key, key, 7));
    CHECK_EQ(pd_msg_grant_decode(buf, n - 1, &rg, &eb), KS_ERR_PROTO);
    pd_store_u32(buf + 28, PD_MSG_UCX_KEY_MAX + 1);
    CHECK_EQ(pd_msg_grant_decode(buf, n, &rg, &eb), KS_ERR_PROTO);
    pd_store_u32(buf + 28, 7);
    pd_store_u64(buf + pd_msg_grant_size(4) + 8, 0);
    CHECK_EQ(pd_msg_grant_decode(buf, n, &rg, &eb), KS_ERR_PROTO);
}

int main(void) {
    memset(TEXT512, 'm', sizeof TEXT512);
    memset(HOST255, 'h', sizeof HOST255);
    test_names_and_bounds();
    test_layout_admit();
    test_layout_grant();
    test_layout_kv_page();
    test_layout_done();
    test_round_trip_small();
    test_round_trip_big();
    test_truncation_and_trailing();
    test_length_fields();
    test_enums_and_ranges();
    test_grant_coverage();
    test_kv_page_checks();
    test_planes();
    test_random();
    test_sampling_ext();
    test_ucx_fields();
    printf("test_pd_msg: ok\n");
    return 0;
}
