/* test_pd_send.c — the prefill-side KVPD transfer state machine on a real
 * kv_pool with a fake forward pass, without a network (docs/pd-protocol.md
 * section 6 "Prefill, per request", 7, 9), wired end to end into a pd_recv
 * over a second pool: the frames pd_send emits are fed to the decode side.
 *
 * Each case names the rule it would catch missing: above all I4 — a PREFILL
 * failing re-validation gets exactly one REJECT (per destination) and never a
 * KV_PAGE or DONE (no placeholder, no partial KV). `test_pd_send NAME` runs
 * one case. Cases marked per_planes run on 2-plane pages (K, V) and again on
 * 1-plane pages (one row per position, MLA). */
#include "kvseal/pd.h"
#include "kvseal/pd_recv.h"
#include "kvseal/pd_send.h"

#include "../check.h"

static kv_geom G = {.n_layer = 3, .kv_dim = 4, .page_tokens = 4}; /* test_deep_model deepens it;
                                                                      main sets planes */
/* Rows per position per layer of G, and the kv index V reads carry: with one
 * plane there is no V row, V reads back K's. */
#define NP kv_geom_planes(&G)
#define VKIND (NP == 2 ? 1 : 0)
#define DEC_PAGES 48u /* decode pool */
#define PRE_PAGES 12u /* prefill pool: 48 tokens */
#define N_CTX 64u
#define N_VOCAB 100u
#define W 3u    /* decode worker id */
#define EP 7u   /* data link epoch */
#define EP2 9u  /* the link's next epoch */
#define FIRST_TOKEN 42
#define RNG_STATE 0xABCDEF0123ull

// ----------------------------------------------------------------------------
// Harness: both pools, pd_send with a fake compute, pd_recv, a frame log

typedef struct {
    uint32_t worker;
    uint64_t epoch; /* PD_SEND_ROUTER: to the router */
    uint16_t type;
    uint64_t req_id;
    uint8_t *data;
    size_t len;
} frame;

typedef struct {
    kv_pool *dpool, *ppool;
    pd_recv *r;
    pd_send *s;
    frame f[256];
    int n;
    uint64_t now;
    int computes;
    uint32_t compute_from; /* seq->n_tokens at the last compute (prefix-cached tokens) */
    bool compute_fail;
    uint32_t n_ctx;    /* what fake_admit allows */
    kv_prefix *prefix; /* test_prefix_cache's cache (prefix_reserve) */
    pd_recv_ev ev[64];
    int n_ev;
} harness;

static float val(int32_t tok, uint32_t pos, int layer, int kv, int d) {
    return (float)(tok * 7 + (int)pos * 131 + layer * 17 + kv * 5 + d);
}

static void on_frame(void *ctx, uint32_t worker, uint64_t epoch, uint16_t type, uint64_t req_id,
                     const struct iovec *iov, int n_iov) {
    harness *h = ctx;
    CHECK(h->n < 256);
    frame *f = &h->f[h->n++];
    f->worker = worker;
    f->epoch = epoch;
    f->type = type;
    f->req_id = req_id;
    f->len = 0;
    for (int i = 0; i < n_iov; i++) f->len += iov[i].iov_len;
    f->data = malloc(f->len ? f->len : 1);
    CHECK(f->data);
    size_t off = 0;
    for (int i = 0; i < n_iov; i++) {
        memcpy(f->data + off, iov[i].iov_base, iov[i].iov_len);
        off += iov[i].iov_len;
    }
}

static ks_err fake_compute(void *ctx, kv_pool *pool, kv_seq *seq, const int32_t *tokens,
                           uint32_t n, const pd_msg_sampling *sp, pd_send_first *out,
                           ks_errbuf *eb) {
    harness *h = ctx;
    (void)sp;
    h->computes++;
    h->compute_from = seq->n_tokens;
    if (h->compute_fail) return ks_seterr(eb, KS_ERR_INTERNAL, "fake compute failure");
    uint32_t pt = (uint32_t)G.page_tokens;
    // pages below seq->n_tokens are shared prefix-cache pages: read-only
    for (uint32_t pg = seq->n_tokens / pt; pg * pt < n; pg++) {
        for (int l = 0; l < G.n_layer; l++) {
            void *kb, *vb;
            CHECK(kv_seq_span_write(pool, seq, pg, l, &kb, &vb) == KS_OK);
            CHECK((vb == NULL) == (NP == 1)); // one plane: the model writes only the row
            float *k = kb, *v = vb;           // G is an F32 geometry
            for (uint32_t row = 0; row < pt && pg * pt + row < n; row++) {
                uint32_t pos = pg * pt + row;
                for (int d = 0; d < G.kv_dim; d++) {
                    k[row * (uint32_t)G.kv_dim + (uint32_t)d] = val(tokens[pos], pos, l, 0, d);
                    if (NP == 2)
                        v[row * (uint32_t)G.kv_dim + (uint32_t)d] = val(tokens[pos], pos, l, 1, d);
                }
            }
        }
    }
    memset(out, 0, sizeof *out);
    out->first_token = FIRST_TOKEN;
    out->logprob = -0.5f;
    out->n_top = 3; /* clamped to the request's n_probs (2) */
    for (uint32_t i = 0; i < 3; i++) out->top[i] = (pd_msg_top){.id = 40 + (int32_t)i, .logprob = -1.0f - (float)i};
    out->rng_state = RNG_STATE;
    return KS_OK;
}

/* Stands in for the request contract (admit.h, which cluster/prefill.c
 * calls): refuses as admit_refuse would, with the reason in eb. */
static ks_err refuse(ks_errbuf *eb, ks_err code, admit_reason r, const char *msg) {
    ks_seterr(eb, code, "%s", msg);
    eb->reason = (uint16_t)r;
    return code;
}

static ks_err fake_admit(void *ctx, const int32_t *toks, uint32_t n, const pd_msg_sampling *sp,
                         ks_errbuf *eb) {
    harness *h = ctx;
    if ((uint64_t)n + sp->max_tokens > h->n_ctx)
        return refuse(eb, KS_ERR_INVAL, ADMIT_CONTEXT_LENGTH, "context length exceeded");
    for (uint32_t i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= (int32_t)N_VOCAB)
            return refuse(eb, KS_ERR_INVAL, ADMIT_INVALID, "token id out of range");
    if ((n + (uint32_t)G.page_tokens - 1) / (uint32_t)G.page_tokens > PRE_PAGES)
        return refuse(eb, KS_ERR_NOSPACE, ADMIT_KV_CAPACITY, "the prompt does not fit the pool");
    return KS_OK;
}

static void on_ev(void *ctx, const pd_recv_ev *ev) {
    harness *h = ctx;
    CHECK(h->n_ev < 64);
    h->ev[h->n_ev] = *ev;
    h->ev[h->n_ev].done = NULL;
    h->n_ev++;
}

static uint64_t fake_clock(void *ctx) { return ((const harness *)ctx)->now; }

static void h_init(harness *h, uint32_t send_n_ctx) {
    memset(h, 0, sizeof *h);
    h->now = 1000;
    CHECK(kv_pool_create(&G, DEC_PAGES, KV_SCRUB_ZERO, &h->dpool, NULL) == KS_OK);
    CHECK(kv_pool_create(&G, PRE_PAGES, KV_SCRUB_ZERO, &h->ppool, NULL) == KS_OK);
    pd_recv_cfg rc = {.n_ctx = 0, .emit = on_ev, .emit_ctx = h, .clock = fake_clock,
                      .clock_ctx = h};
    CHECK(pd_recv_create(h->dpool, &rc, &h->r, NULL) == KS_OK);
    h->n_ctx = send_n_ctx;
    pd_send_cfg sc = {.tombstone_ms = 60000,
                      .emit = on_frame,
                      .emit_ctx = h,
                      .admit = fake_admit,
                      .admit_ctx = h,
                      .compute = fake_compute,
                      .compute_ctx = h,
                      .clock = fake_clock,
                      .clock_ctx = h};
    CHECK(pd_send_create(h->ppool, &sc, &h->s, NULL) == KS_OK);
    CHECK(pd_send_link_up(h->s, W, EP, NULL) == KS_OK);
}

static void h_fini(harness *h) {
    // I3 on prefill's pool: every local page was released and scrubbed.
    CHECK(kv_pool_all_free_and_scrubbed(h->ppool));
    pd_send_destroy(h->s);
    pd_recv_destroy(h->r);
    CHECK(kv_pool_all_free_and_scrubbed(h->dpool));
    kv_pool_destroy(h->dpool);
    kv_pool_destroy(h->ppool);
    for (int i = 0; i < h->n; i++) free(h->f[i].data);
}

static int count(const harness *h, uint64_t req_id, uint16_t type, bool to_router) {
    int c = 0;
    for (int i = 0; i < h->n; i++)
        if (h->f[i].req_id == req_id && h->f[i].type == type &&
            (h->f[i].epoch == PD_SEND_ROUTER) == to_router)
            c++;
    return c;
}

static int count_ev(const harness *h, uint64_t req_id, pd_recv_ev_kind k) {
    int c = 0;
    for (int i = 0; i < h->n_ev; i++)
        if (h->ev[i].req_id == req_id && h->ev[i].kind == k) c++;
    return c;
}

/* Index of the last frame for req_id on a data link, -1 if none. */
static int last_link_frame(const harness *h, uint64_t req_id) {
    for (int i = h->n - 1; i >= 0; i--)
        if (h->f[i].req_id == req_id && h->f[i].epoch != PD_SEND_ROUTER) return i;
    return -1;
}

static int32_t tok_of(uint32_t i) { return (int32_t)((i * 13u + 5u) % N_VOCAB); }
static uint8_t g_domain; /* every byte of the next PREFILLs' domain_hash */

/* ADMIT on decode for a link epoch; returns a copy of the grant. */
static uint32_t admit(harness *h, uint64_t req_id, uint32_t n_prompt, uint32_t max_tokens,
                      uint64_t epoch, uint8_t *grant, size_t cap) {
    pd_recv_admit_args a = {.n_prompt = n_prompt, .max_tokens = max_tokens,
                            .prefill_worker_id = 1, .link_epoch = epoch};
    const uint8_t *g;
    uint32_t gl, deny;
    ks_errbuf eb;
    ks_err e = pd_recv_admit(h->r, req_id, &a, &g, &gl, &deny, &eb);
    if (e != KS_OK) fprintf(stderr, "admit %llu: %s\n", (unsigned long long)req_id, eb.msg);
    CHECK(e == KS_OK);
    CHECK(gl <= cap);
    memcpy(grant, g, gl);
    return gl;
}

/* Builds the router's PREFILL payload into buf; returns its length. */
static uint32_t prefill_payload(uint32_t n_prompt, uint32_t max_tokens, const uint8_t *grant,
                                uint32_t grant_len, const int32_t *toks, uint8_t *buf,
                                size_t cap) {
    pd_msg_prefill m = {.decode_worker_id = W, .n_prompt = n_prompt, .grant = grant,
                        .grant_len = grant_len};
    memset(m.domain_hash, g_domain, sizeof m.domain_hash);
    m.s.max_tokens = max_tokens;
    m.s.seed = 1;
    m.s.temperature = 1.0f;
    m.s.top_p = 1.0f;
    m.s.n_probs = 2;
    uint32_t len = 0;
    ks_errbuf eb;
    ks_err e = pd_msg_prefill_encode(&m, toks, buf, cap, &len, &eb);
    if (e != KS_OK) fprintf(stderr, "prefill encode: %s\n", eb.msg);
    CHECK(e == KS_OK);
    return len;
}

/* admit + PREFILL with tokens tok_of(i); returns pd_send's state. */
static pd_send_state start(harness *h, uint64_t req_id, uint32_t n_prompt, uint32_t max_tokens) {
    uint8_t grant[1024], buf[4096];
    int32_t toks[128];
    uint32_t gl = admit(h, req_id, n_prompt, max_tokens, EP, grant, sizeof grant);
    for (uint32_t i = 0; i < n_prompt; i++) toks[i] = tok_of(i);
    uint32_t len = prefill_payload(n_prompt, max_tokens, grant, gl, toks, buf, sizeof buf);
    pd_send_state st;
    CHECK(pd_send_prefill(h->s, req_id, buf, len, &st, NULL) == KS_OK);
    return st;
}

/* Feeds the link frames f[from..n) to pd_recv as decode's transport would. */
static void deliver(harness *h, int from) {
    for (int i = from; i < h->n; i++) {
        const frame *f = &h->f[i];
        if (f->epoch == PD_SEND_ROUTER) continue;
        CHECK_EQ(f->worker, W);
        switch (f->type) {
        case PD_MSG_KV_PAGE: {
            pd_msg_kv_page hdr;
            CHECK(pd_msg_kv_page_decode(f->data, (uint32_t)f->len, (uint32_t)f->len, &G, &hdr,
                                        NULL) == KS_OK);
            struct iovec dst[PD_MAX_IOV];
            int nd = 0;
            if (!pd_recv_kv_page_begin(h->r, f->req_id, f->epoch, &hdr, dst, PD_MAX_IOV, &nd)) break;
            size_t off = PD_MSG_KV_PAGE_HDR;
            for (int j = 0; j < nd; j++) {
                CHECK(off + dst[j].iov_len <= f->len);
                memcpy(dst[j].iov_base, f->data + off, dst[j].iov_len);
                off += dst[j].iov_len;
            }
            CHECK_EQ(off, f->len);
            pd_recv_kv_page_end(h->r, f->req_id, true);
            break;
        }
        case PD_MSG_DONE: {
            pd_msg_done d;
            CHECK(pd_msg_done_decode(f->data, (uint32_t)f->len, &d, NULL) == KS_OK);
            (void)pd_recv_done(h->r, f->req_id, f->epoch, &d);
            break;
        }
        case PD_MSG_REJECT: {
            pd_msg_reject rj;
            CHECK(pd_msg_reject_decode(f->data, (uint32_t)f->len, &rj, NULL) == KS_OK);
            pd_recv_reject(h->r, f->req_id, f->epoch, rj.reason, NULL);
            break;
        }
        case PD_MSG_ABORT:
            pd_recv_prefill_abort(h->r, f->req_id, f->epoch);
            break;
        case PD_MSG_ABORT_ACK:
            CHECK_EQ(f->len, 0);
            pd_recv_abort_ack(h->r, f->req_id, f->epoch);
            break;
        default:
            CHECK(!"unexpected frame type on the data link");
        }
    }
}

/* Decode's EV_ABORTs from index from on: handed to pd_send as frames on the link. */
static void route_aborts(harness *h, int from) {
    for (int i = from; i < h->n_ev; i++)
        if (h->ev[i].kind == PD_RECV_EV_ABORT)
            pd_send_abort(h->s, h->ev[i].req_id, W, h->ev[i].link_epoch);
}

/* The decode pages of a COMMITTED request hold exactly the prefill's KV. */
static void check_decode_kv(harness *h, uint64_t req_id, uint32_t n_prompt) {
    kv_seq *q = pd_recv_seq(h->r, req_id);
    CHECK(q);
    uint32_t pt = (uint32_t)G.page_tokens;
    for (uint32_t pg = 0; pg * pt < n_prompt; pg++) {
        uint32_t rows = n_prompt - pg * pt < pt ? n_prompt - pg * pt : pt;
        for (int l = 0; l < G.n_layer; l++) {
            const void *kb, *vb;
            CHECK(kv_seq_span_read(h->dpool, q, pg, l, rows, &kb, &vb) == KS_OK);
            CHECK((vb == kb) == (NP == 1));
            const float *k = kb, *v = vb;
            for (uint32_t row = 0; row < rows; row++)
                for (int d = 0; d < G.kv_dim; d++) {
                    uint32_t pos = pg * pt + row;
                    CHECK(k[row * (uint32_t)G.kv_dim + (uint32_t)d] == val(tok_of(pos), pos, l, 0, d));
                    CHECK(v[row * (uint32_t)G.kv_dim + (uint32_t)d] ==
                          val(tok_of(pos), pos, l, VKIND, d));
                }
        }
    }
}

// ----------------------------------------------------------------------------
// Cases

/* Happy path: KV_PAGE per grant page with the grant's tags and the local
 * rows, then DONE{covered = n_prompt}; end to end into pd_recv -> COMMITTED
 * with decode's pages holding exactly prefill's KV. */
static void test_happy_path(void) {
    harness h;
    h_init(&h, N_CTX);
    uint8_t grant[1024];
    uint32_t gl = admit(&h, 11, 10, 5, EP, grant, sizeof grant);
    pd_msg_grant g;
    CHECK(pd_msg_grant_decode(grant, gl, &g, NULL) == KS_OK);
    CHECK_EQ(g.n_pages, 3);
    uint8_t buf[4096];
    int32_t toks[10];
    for (uint32_t i = 0; i < 10; i++) toks[i] = tok_of(i);
    uint32_t len = prefill_payload(10, 5, grant, gl, toks, buf, sizeof buf);
    pd_send_state st;
    CHECK(pd_send_prefill(h.s, 11, buf, len, &st, NULL) == KS_OK);
    CHECK_EQ(st, PD_SEND_SENDING);
    CHECK_EQ(h.computes, 1);
    CHECK_EQ(h.n, 0);                           // nothing before the pump
    CHECK_EQ(kv_pool_n_free(h.ppool), PRE_PAGES - 3); // local pages held while sending

    CHECK_EQ(pd_send_pump(h.s, 1000), 3);
    CHECK_EQ(h.n, 4);
    for (uint32_t i = 0; i < 3; i++) {
        const frame *f = &h.f[i];
        CHECK_EQ(f->type, PD_MSG_KV_PAGE);
        CHECK_EQ(f->req_id, 11);
        CHECK_EQ(f->worker, W);
        CHECK_EQ(f->epoch, EP);
        pd_msg_grant_entry ge = pd_msg_grant_entry_at(&g, i);
        pd_msg_kv_page hdr;
        CHECK(pd_msg_kv_page_decode(f->data, (uint32_t)f->len, (uint32_t)f->len, &G, &hdr,
                                    NULL) == KS_OK);
        CHECK_EQ(hdr.page_index, i);
        CHECK_EQ(hdr.page_id, ge.page_id);
        CHECK_EQ(hdr.tag_seq_uid, g.seq_uid);
        CHECK_EQ(hdr.tag_gen, ge.gen);
        CHECK_EQ(hdr.n_rows, ge.n_tokens);
        CHECK_EQ(hdr.layer_first, 0);
        CHECK_EQ(hdr.layer_count, (uint32_t)G.n_layer);
        CHECK_EQ(f->len, pd_msg_kv_page_len(&G, ge.n_tokens, (uint32_t)G.n_layer));
        // data: per layer K rows then V rows [0, n_rows) (one plane: the rows
        // once), as computed locally
        const uint8_t *p = f->data + PD_MSG_KV_PAGE_HDR;
        for (int l = 0; l < G.n_layer; l++)
            for (int kv = 0; kv < NP; kv++)
                for (uint32_t row = 0; row < ge.n_tokens; row++)
                    for (int d = 0; d < G.kv_dim; d++) {
                        float x;
                        memcpy(&x, p, 4);
                        p += 4;
                        uint32_t pos = ge.first_token + row;
                        CHECK(x == val(tok_of(pos), pos, l, kv, d));
                    }
    }
    CHECK_EQ(h.f[3].type, PD_MSG_DONE);
    CHECK_EQ(h.f[3].epoch, EP);
    pd_msg_done d;
    CHECK(pd_msg_done_decode(h.f[3].data, (uint32_t)h.f[3].len, &d, NULL) == KS_OK);
    CHECK_EQ(d.covered, 10);
    CHECK_EQ(d.first_token, FIRST_TOKEN);
    CHECK(d.logprob == -0.5f);
    CHECK_EQ(d.n_top, 2); // clamped to n_probs
    CHECK_EQ(d.rng_state, RNG_STATE);
    CHECK_EQ(pd_msg_top_at(d.top, 1).id, 41);
    CHECK_EQ(pd_send_state_of(h.s, 11), PD_SEND_DONE_SENT);
    CHECK(kv_pool_all_free_and_scrubbed(h.ppool)); // released right after DONE
    CHECK_EQ(pd_send_pump(h.s, 1000), 0);
    CHECK_EQ(h.n, 4);

    // End to end: decode verifies and commits.
    deliver(&h, 0);
    CHECK_EQ(pd_recv_state_of(h.r, 11), PD_RECV_COMMITTED);
    CHECK_EQ(count_ev(&h, 11, PD_RECV_EV_COMMIT), 1);
    check_decode_kv(&h, 11, 10);
    pd_recv_finish(h.r, 11);
    h_fini(&h);
}

/* A model deeper than one frame's iovec budget (70 layers of 2 planes: a
 * partial page needs 141 iovecs, PD_MAX_IOV is 128): each page goes out as
 * two KV_PAGE frames, layers [0, 63) then [63, 70), and decode still commits
 * exactly prefill's KV. With one plane a partial page needs 71 iovecs: one
 * frame per page. */
static void test_deep_model(void) {
    kv_geom keep = G;
    G.n_layer = 70;
    harness h;
    h_init(&h, N_CTX);
    CHECK_EQ(start(&h, 12, 6, 3), PD_SEND_SENDING);  // 2 pages: 4 + 2 rows
    int nf = NP == 2 ? 4 : 2;
    CHECK_EQ(pd_send_pump(h.s, 1000), (uint32_t)nf);
    CHECK_EQ(h.n, nf + 1);
    uint32_t firsts[4] = {0, 63, 0, 63}, counts[4] = {63, 7, 63, 7}, pages[4] = {0, 0, 1, 1};
    if (NP == 1) {
        uint32_t f1[2] = {0, 0}, c1[2] = {70, 70}, p1[2] = {0, 1};
        memcpy(firsts, f1, sizeof f1), memcpy(counts, c1, sizeof c1), memcpy(pages, p1, sizeof p1);
    }
    for (int i = 0; i < nf; i++) {
        pd_msg_kv_page hdr;
        CHECK_EQ(h.f[i].type, PD_MSG_KV_PAGE);
        CHECK(pd_msg_kv_page_decode(h.f[i].data, (uint32_t)h.f[i].len, (uint32_t)h.f[i].len, &G, &hdr,
                                    NULL) == KS_OK);
        CHECK_EQ(hdr.page_index, pages[i]);
        CHECK_EQ(hdr.layer_first, firsts[i]);
        CHECK_EQ(hdr.layer_count, counts[i]);
    }
    CHECK_EQ(h.f[nf].type, PD_MSG_DONE);
    deliver(&h, 0);
    CHECK_EQ(pd_recv_state_of(h.r, 12), PD_RECV_COMMITTED);
    check_decode_kv(&h, 12, 6);
    pd_recv_finish(h.r, 12);
    h_fini(&h);
    G = keep;
}

/* Chunked sending of two requests: one page per pump, oldest first, and the
 * transfer ends the same. */
static void test_chunked_two_requests(void) {
    harness h;
    h_init(&h, N_CTX);
    CHECK_EQ(start(&h, 21, 9, 1), PD_SEND_SENDING);
    CHECK_EQ(start(&h, 22, 4, 1), PD_SEND_SENDING);
    uint32_t total = 0, n;
    while ((n = pd_send_pump(h.s, 1)) > 0) {
        CHECK_EQ(n, 1);
        total++;
    }
    CHECK_EQ(total, 4);
    CHECK_EQ(count(&h, 21, PD_MSG_KV_PAGE, false), 3);
    CHECK_EQ(count(&h, 22, PD_MSG_KV_PAGE, false), 1);
    CHECK_EQ(h.f[last_link_frame(&h, 21)].type, PD_MSG_DONE);
    CHECK_EQ(h.f[last_link_frame(&h, 22)].type, PD_MSG_DONE);
    deliver(&h, 0);
    CHECK_EQ(pd_recv_state_of(h.r, 21), PD_RECV_COMMITTED);
    CHECK_EQ(pd_recv_state_of(h.r, 22), PD_RECV_COMMITTED);
    check_decode_kv(&h, 21, 9);
    check_decode_kv(&h, 22, 4);
    pd_recv_finish(h.r, 21);
    pd_recv_finish(h.r, 22);
    h_fini(&h);
}

/* DONE's cached field for req_id (the request must have sent DONE). */
static uint32_t done_cached(const harness *h, uint64_t req_id) {
    int i = last_link_frame(h, req_id);
    CHECK(i >= 0 && h->f[i].type == PD_MSG_DONE);
    pd_msg_done d;
    CHECK(pd_msg_done_decode(h->f[i].data, (uint32_t)h->f[i].len, &d, NULL) == KS_OK);
    return d.cached;
}

/* One request through to COMMITTED and finished; returns DONE's cached. */
static uint32_t run_one(harness *h, uint64_t req_id, uint32_t n_prompt) {
    int from = h->n;
    CHECK_EQ(start(h, req_id, n_prompt, 1), PD_SEND_SENDING);
    while (pd_send_pump(h->s, 1) > 0) {
    }
    deliver(h, from);
    CHECK_EQ(pd_recv_state_of(h->r, req_id), PD_RECV_COMMITTED);
    check_decode_kv(h, req_id, n_prompt);
    pd_recv_finish(h->r, req_id);
    return done_cached(h, req_id);
}

/* A cache policy as cluster/prefill.c's: attach under the domain, reserve. */
static ks_err prefix_reserve(void *ctx, kv_pool *pool, const uint8_t domain[32],
                             const int32_t *toks, uint32_t n, kv_seq *seq, ks_errbuf *eb) {
    harness *h = ctx;
    (void)kv_prefix_attach(h->prefix, domain, toks, n, seq);
    return kv_seq_reserve(pool, seq, n, eb);
}

static void prefix_computed(void *ctx, kv_pool *pool, const uint8_t domain[32], const int32_t *toks,
                            uint32_t n, kv_seq *seq) {
    (void)pool;
    kv_prefix_publish(((harness *)ctx)->prefix, domain, toks, n, seq);
}

/* cfg.reserve/computed with a prefix cache (I7): a repeated prompt of the same domain attaches its
 * full pages (never the page holding the last token), compute starts after them, decode still
 * receives exactly the KV a full compute gives and DONE says how many tokens were cached; another
 * domain's identical prompt gets nothing. */
static void test_prefix_cache(void) {
    harness h;
    h_init(&h, N_CTX);
    pd_send_destroy(h.s);
    kv_prefix *pc;
    CHECK(kv_prefix_create(h.ppool, 4, &pc, NULL) == KS_OK);
    h.prefix = pc;
    pd_send_cfg sc = {.tombstone_ms = 60000,
                      .emit = on_frame,
                      .emit_ctx = &h,
                      .admit = fake_admit,
                      .admit_ctx = &h,
                      .reserve = prefix_reserve,
                      .computed = prefix_computed,
                      .reserve_ctx = &h,
                      .compute = fake_compute,
                      .compute_ctx = &h,
                      .clock = fake_clock,
                      .clock_ctx = &h};
    CHECK(pd_send_create(h.ppool, &sc, &h.s, NULL) == KS_OK);
    CHECK(pd_send_link_up(h.s, W, EP, NULL) == KS_OK);
    g_domain = 1;
    CHECK_EQ(run_one(&h, 31, 10), 0);  // cold
    CHECK_EQ(h.compute_from, 0);
    CHECK_EQ(kv_prefix_n_pages(pc), 2);  // the two full pages of 10 tokens
    CHECK_EQ(run_one(&h, 32, 10), 8);  // warm: pages 0-1 reused, page 2 computed
    CHECK_EQ(h.compute_from, 8);
    CHECK_EQ(run_one(&h, 33, 9), 8);  // a longer shared run is not needed: 9 tokens, 2 pages
    g_domain = 2;  // same tokens, another tenant
    CHECK_EQ(run_one(&h, 34, 10), 0);
    CHECK_EQ(h.compute_from, 0);
    g_domain = 0;
    pd_send_stats st;
    pd_send_get_stats(h.s, &st);
    CHECK_EQ(st.cached_tokens, 16);
    kv_prefix_destroy(pc);  // every cached page back to FREE and scrubbed (h_fini checks)
    h_fini(&h);
}

/* I4 check for one rejected req_id: exactly one REJECT to the router with
 * `reason`, `to_decode` REJECTs on the link, never a KV_PAGE or DONE (also
 * after pumping), no compute, no local page kept. */
static void expect_reject_only(harness *h, uint64_t req_id, uint32_t reason, int to_decode) {
    CHECK_EQ(pd_send_pump(h->s, 1000), 0);
    CHECK_EQ(count(h, req_id, PD_MSG_REJECT, true), 1);
    CHECK_EQ(count(h, req_id, PD_MSG_REJECT, false), to_decode);
    for (int i = 0; i < h->n; i++) {
        if (h->f[i].req_id != req_id) continue;
        CHECK(h->f[i].type == PD_MSG_REJECT);  // no KV_PAGE, no DONE, no placeholder
        pd_msg_reject rj;
        CHECK(pd_msg_reject_decode(h->f[i].data, (uint32_t)h->f[i].len, &rj, NULL) == KS_OK);
        CHECK_EQ(rj.reason, reason);
        CHECK(rj.msg_len > 0);
        if (h->f[i].epoch != PD_SEND_ROUTER) {
            CHECK_EQ(h->f[i].worker, W);
            CHECK_EQ(h->f[i].epoch, EP);
        }
    }
    CHECK(kv_pool_all_free_and_scrubbed(h->ppool));
}

/* Every re-validation failure: REJECT only (the incident: a placeholder or a
 * partial KV after a failed validation fails here). */
static void test_revalidation_rejects(void) {
    harness h;
    h_init(&h, N_CTX);
    uint8_t grant[1024], buf[4096];
    int32_t toks[128];
    for (uint32_t i = 0; i < 128; i++) toks[i] = tok_of(i);
    pd_send_state st;

    // context too long (decode admitted it: its n_ctx is unlimited here)
    uint32_t gl = admit(&h, 31, 10, 60, EP, grant, sizeof grant);
    uint32_t len = prefill_payload(10, 60, grant, gl, toks, buf, sizeof buf);
    CHECK(pd_send_prefill(h.s, 31, buf, len, &st, NULL) == KS_OK);
    CHECK_EQ(st, PD_SEND_REJECTED);
    expect_reject_only(&h, 31, ADMIT_CONTEXT_LENGTH, 1);

    // bad token ids: one past the vocabulary, and negative
    gl = admit(&h, 32, 6, 2, EP, grant, sizeof grant);
    toks[3] = (int32_t)N_VOCAB;
    len = prefill_payload(6, 2, grant, gl, toks, buf, sizeof buf);
    CHECK(pd_send_prefill(h.s, 32, buf, len, &st, NULL) == KS_OK);
    CHECK_EQ(st, PD_SEND_REJECTED);
    expect_reject_only(&h, 32, ADMIT_INVALID, 1);
    gl = admit(&h, 33, 6, 2, EP, grant, sizeof grant);
    toks[3] = -1;
    len = prefill_payload(6, 2, grant, gl, toks, buf, sizeof buf);
    CHECK(pd_send_prefill(h.s, 33, buf, len, &st, NULL) == KS_OK);
    expect_reject_only(&h, 33, ADMIT_INVALID, 1);
    toks[3] = tok_of(3);

    // inconsistent grant: entry 0's first_token moved (layout intact)
    gl = admit(&h, 34, 6, 2, EP, grant, sizeof grant);
    grant[PD_MSG_GRANT_FIXED + 4] = 1;
    len = prefill_payload(6, 2, grant, gl, toks, buf, sizeof buf);
    CHECK(pd_send_prefill(h.s, 34, buf, len, &st, NULL) == KS_OK);
    expect_reject_only(&h, 34, ADMIT_INTERNAL, 1);

    // prompt larger than prefill's own pool (48 tokens)
    gl = admit(&h, 35, 52, 1, EP, grant, sizeof grant);
    len = prefill_payload(52, 1, grant, gl, toks, buf, sizeof buf);
    CHECK(pd_send_prefill(h.s, 35, buf, len, &st, NULL) == KS_OK);
    expect_reject_only(&h, 35, ADMIT_KV_CAPACITY, 1);

    // issue 40: a grant for another model (its model_id, inside the PREFILL) is
    // refused before any page is computed: no page crosses models
    gl = admit(&h, 36, 6, 2, EP, grant, sizeof grant);
    grant[32] ^= 0xff; // GRANT's model_id (offset 32): not the prefill worker's
    len = prefill_payload(6, 2, grant, gl, toks, buf, sizeof buf);
    CHECK(pd_send_prefill(h.s, 36, buf, len, &st, NULL) == KS_OK);
    CHECK_EQ(st, PD_SEND_REJECTED);
    expect_reject_only(&h, 36, ADMIT_INTERNAL, 1);

    CHECK_EQ(h.computes, 0);
    // decode: every REJECT frees its grant directly (F3)
    deliver(&h, 0);
    for (uint64_t id = 31; id <= 36; id++) {
        CHECK_EQ(pd_recv_state_of(h.r, id), PD_RECV_FREED);
        CHECK_EQ(count_ev(&h, id, PD_RECV_EV_COMMIT), 0);
    }
    CHECK_EQ(kv_pool_n_free(h.dpool), DEC_PAGES);

    // A rejected req_id stays rejected: a retry of the same PREFILL is refused.
    CHECK(pd_send_prefill(h.s, 31, buf, len, &st, NULL) == KS_OK);
    CHECK_EQ(st, PD_SEND_REJECTED);
    CHECK_EQ(count(&h, 31, PD_MSG_KV_PAGE, false) + count(&h, 31, PD_MSG_DONE, false), 0);
    CHECK_EQ(h.computes, 0);
    h_fini(&h);
}

/* Stale grant: the link to decode was re-opened (new epoch) after the grant. */
static void test_stale_epoch(void) {
    harness h;
    h_init(&h, N_CTX);
    uint8_t grant[1024], buf[4096];
    int32_t toks[16];
    for (uint32_t i = 0; i < 16; i++) toks[i] = tok_of(i);
    uint32_t gl = admit(&h, 41, 8, 2, EP, grant, sizeof grant);
    CHECK(pd_send_link_up(h.s, W, EP2, NULL) == KS_OK); // EP is gone
    uint32_t len = prefill_payload(8, 2, grant, gl, toks, buf, sizeof buf);
    pd_send_state st;
    CHECK(pd_send_prefill(h.s, 41, buf, len, &st, NULL) == KS_OK);
    CHECK_EQ(st, PD_SEND_REJECTED);
    // the grant's link is down: REJECT to the router only, nothing on EP2
    expect_reject_only(&h, 41, ADMIT_STALE_GRANT, 0);
    CHECK_EQ(h.computes, 0);
    CHECK_EQ(pd_recv_link_closed(h.r, EP), 1); // decode's F5
    // no link at all to that worker: STALE as well
    CHECK_EQ(pd_send_link_closed(h.s, W, EP2), 0);
    gl = admit(&h, 42, 8, 2, EP2, grant, sizeof grant);
    len = prefill_payload(8, 2, grant, gl, toks, buf, sizeof buf);
    CHECK(pd_send_prefill(h.s, 42, buf, len, &st, NULL) == KS_OK);
    expect_reject_only(&h, 42, ADMIT_STALE_GRANT, 0);
    CHECK_EQ(pd_recv_link_closed(h.r, EP2), 1);
    h_fini(&h);
}

/* Duplicate PREFILL while the first is SENDING: one REJECT to the router,
 * nothing on the link, and the original transfer completes untouched. */
static void test_duplicate(void) {
    harness h;
    h_init(&h, N_CTX);
    uint8_t grant[1024], buf[4096];
    int32_t toks[16];
    for (uint32_t i = 0; i < 16; i++) toks[i] = tok_of(i);
    uint32_t gl = admit(&h, 51, 7, 2, EP, grant, sizeof grant);
    uint32_t len = prefill_payload(7, 2, grant, gl, toks, buf, sizeof buf);
    pd_send_state st;
    CHECK(pd_send_prefill(h.s, 51, buf, len, &st, NULL) == KS_OK);
    CHECK_EQ(st, PD_SEND_SENDING);
    CHECK_EQ(pd_send_pump(h.s, 1), 1);
    CHECK(pd_send_prefill(h.s, 51, buf, len, &st, NULL) == KS_OK);
    CHECK_EQ(st, PD_SEND_SENDING);
    CHECK_EQ(h.computes, 1);
    CHECK_EQ(count(&h, 51, PD_MSG_REJECT, true), 1);
    CHECK_EQ(count(&h, 51, PD_MSG_REJECT, false), 0);
    CHECK_EQ(pd_send_pump(h.s, 1000), 1);
    CHECK_EQ(count(&h, 51, PD_MSG_KV_PAGE, false), 2); // not doubled
    CHECK_EQ(count(&h, 51, PD_MSG_DONE, false), 1);
    deliver(&h, 0);
    CHECK_EQ(pd_recv_state_of(h.r, 51), PD_RECV_COMMITTED);
    check_decode_kv(&h, 51, 7);
    // and after DONE_SENT, still refused
    CHECK(pd_send_prefill(h.s, 51, buf, len, &st, NULL) == KS_OK);
    CHECK_EQ(count(&h, 51, PD_MSG_REJECT, true), 2);
    CHECK_EQ(count(&h, 51, PD_MSG_DONE, false), 1);
    pd_recv_finish(h.r, 51);
    h_fini(&h);
}

/* ABORT from decode between pages: no further KV_PAGE, no DONE, ABORT_ACK is
 * the last frame on the link; decode frees on the ACK (F4). Duplicates are
 * answered again; a router ABORT mid-SENDING acks on the grant's link. */
static void test_abort_mid_sending(void) {
    harness h;
    h_init(&h, N_CTX);
    CHECK_EQ(start(&h, 61, 12, 2), PD_SEND_SENDING);
    CHECK_EQ(pd_send_pump(h.s, 1), 1);
    deliver(&h, 0);
    CHECK_EQ(pd_recv_state_of(h.r, 61), PD_RECV_RECEIVING);
    int ev0 = h.n_ev, f0 = h.n;
    CHECK(pd_recv_abort(h.r, 61, PD_ABORT_CLIENT_GONE)); // router -> decode: ABORTING
    route_aborts(&h, ev0);
    CHECK_EQ(pd_send_state_of(h.s, 61), PD_SEND_ABORTED);
    CHECK(kv_pool_all_free_and_scrubbed(h.ppool));
    CHECK_EQ(pd_send_pump(h.s, 1000), 0);
    CHECK_EQ(count(&h, 61, PD_MSG_KV_PAGE, false), 1);
    CHECK_EQ(count(&h, 61, PD_MSG_DONE, false), 0);
    int last = last_link_frame(&h, 61);
    CHECK_EQ(h.f[last].type, PD_MSG_ABORT_ACK);
    CHECK_EQ(h.f[last].epoch, EP);
    deliver(&h, f0);
    CHECK_EQ(pd_recv_state_of(h.r, 61), PD_RECV_FREED);
    CHECK_EQ(kv_pool_n_free(h.dpool), DEC_PAGES);
    // duplicate ABORT: answered again, still nothing else
    pd_send_abort(h.s, 61, W, EP);
    CHECK_EQ(count(&h, 61, PD_MSG_ABORT_ACK, false), 2);
    CHECK_EQ(h.f[h.n - 1].type, PD_MSG_ABORT_ACK);
    // router ABORT mid-SENDING
    CHECK_EQ(start(&h, 62, 12, 2), PD_SEND_SENDING);
    CHECK_EQ(pd_send_pump(h.s, 2), 2);
    pd_send_abort(h.s, 62, 0, PD_SEND_ROUTER);
    CHECK_EQ(pd_send_pump(h.s, 1000), 0);
    CHECK_EQ(count(&h, 62, PD_MSG_KV_PAGE, false), 2);
    CHECK_EQ(count(&h, 62, PD_MSG_DONE, false), 0);
    CHECK_EQ(h.f[last_link_frame(&h, 62)].type, PD_MSG_ABORT_ACK);
    CHECK_EQ(count(&h, 62, PD_MSG_ABORT_ACK, true), 0);
    CHECK(pd_recv_abort(h.r, 62, PD_ABORT_CLIENT_GONE));
    deliver(&h, f0);
    CHECK_EQ(pd_recv_state_of(h.r, 62), PD_RECV_FREED);
    h_fini(&h);
}

/* ABORT from decode overtakes the PREFILL: ACK at once, then the PREFILL is
 * dropped (REJECT ABORTED to the router only, nothing on the link, no compute). */
static void test_abort_before_prefill(void) {
    harness h;
    h_init(&h, N_CTX);
    pd_send_abort(h.s, 71, W, EP);
    CHECK_EQ(h.n, 1);
    CHECK_EQ(h.f[0].type, PD_MSG_ABORT_ACK);
    CHECK_EQ(h.f[0].epoch, EP);
    CHECK_EQ(pd_send_state_of(h.s, 71), PD_SEND_ABORTED);
    pd_send_state st;
    uint8_t grant[1024], buf[4096];
    int32_t toks[8];
    for (uint32_t i = 0; i < 8; i++) toks[i] = tok_of(i);
    uint32_t gl = admit(&h, 71, 8, 2, EP, grant, sizeof grant);
    uint32_t len = prefill_payload(8, 2, grant, gl, toks, buf, sizeof buf);
    CHECK(pd_send_prefill(h.s, 71, buf, len, &st, NULL) == KS_OK);
    CHECK_EQ(st, PD_SEND_ABORTED);
    CHECK_EQ(pd_send_pump(h.s, 1000), 0);
    CHECK_EQ(h.computes, 0);
    CHECK_EQ(count(&h, 71, PD_MSG_REJECT, true), 1);
    CHECK_EQ(h.f[h.n - 1].epoch, PD_SEND_ROUTER);
    pd_msg_reject rj;
    CHECK(pd_msg_reject_decode(h.f[h.n - 1].data, (uint32_t)h.f[h.n - 1].len, &rj, NULL) == KS_OK);
    CHECK_EQ(rj.reason, ADMIT_ABORTED);
    CHECK_EQ(last_link_frame(&h, 71), 0); // the ACK stays the last frame on the link
    // router ABORT for an unknown req_id: tombstone only, no frame
    pd_send_abort(h.s, 72, 0, PD_SEND_ROUTER);
    CHECK_EQ(count(&h, 72, PD_MSG_ABORT_ACK, false) + count(&h, 72, PD_MSG_ABORT_ACK, true), 0);
    CHECK_EQ(pd_send_state_of(h.s, 72), PD_SEND_ABORTED);
    // tombstones are forgotten after tombstone_ms, not before
    CHECK_EQ(pd_send_tick(h.s), 0);
    h.now += 60000;
    CHECK_EQ(pd_send_tick(h.s), 2);
    CHECK_EQ(pd_send_state_of(h.s, 71), PD_SEND_NONE);
    CHECK_EQ(pd_recv_link_closed(h.r, EP), 1); // decode's grant of 71 dies with the link
    h_fini(&h);
}

/* The link closes mid-SENDING: no frame at all afterwards, local pages freed;
 * a later ABORT for it on the dead link is not answered there. */
static void test_link_closed(void) {
    harness h;
    h_init(&h, N_CTX);
    CHECK_EQ(start(&h, 81, 12, 2), PD_SEND_SENDING);
    CHECK_EQ(start(&h, 82, 5, 2), PD_SEND_SENDING);
    CHECK_EQ(pd_send_pump(h.s, 1), 1);
    CHECK(pd_send_link_up(h.s, W, EP, NULL) == KS_OK); // same epoch again: nothing dropped
    CHECK_EQ(pd_send_state_of(h.s, 81), PD_SEND_SENDING);
    CHECK_EQ(pd_send_link_closed(h.s, W, EP + 100), 0); // another epoch: not this link
    int n0 = h.n;
    CHECK_EQ(pd_send_link_closed(h.s, W, EP), 2);
    CHECK_EQ(pd_send_state_of(h.s, 81), PD_SEND_ABORTED);
    CHECK_EQ(pd_send_state_of(h.s, 82), PD_SEND_ABORTED);
    CHECK(kv_pool_all_free_and_scrubbed(h.ppool));
    CHECK_EQ(pd_send_pump(h.s, 1000), 0);
    pd_send_abort(h.s, 81, W, EP);
    CHECK_EQ(h.n, n0);
    CHECK_EQ(pd_recv_link_closed(h.r, EP), 2); // decode's F5
    h_fini(&h);
}

/* A compute error: ABORT{ERROR} to decode, no KV_PAGE/DONE; decode frees on
 * it (F3), and a later ABORT from decode is still answered. */
static void test_compute_error(void) {
    harness h;
    h_init(&h, N_CTX);
    h.compute_fail = true;
    CHECK_EQ(start(&h, 91, 6, 2), PD_SEND_ABORTED);
    CHECK_EQ(pd_send_pump(h.s, 1000), 0);
    CHECK_EQ(h.n, 1);
    CHECK_EQ(h.f[0].type, PD_MSG_ABORT);
    CHECK_EQ(h.f[0].epoch, EP);
    pd_msg_abort ab;
    CHECK(pd_msg_abort_decode(h.f[0].data, (uint32_t)h.f[0].len, &ab, NULL) == KS_OK);
    CHECK_EQ(ab.reason, PD_ABORT_ERROR);
    CHECK(kv_pool_all_free_and_scrubbed(h.ppool));
    deliver(&h, 0);
    CHECK_EQ(pd_recv_state_of(h.r, 91), PD_RECV_FREED);
    pd_send_abort(h.s, 91, W, EP);
    CHECK_EQ(h.f[h.n - 1].type, PD_MSG_ABORT_ACK);
    h_fini(&h);
}

/* Pages of one plane count never land in a pool of the other: the KV_PAGE
 * frames a 2-plane prefill sends are refused by a 1-plane decode link (and
 * the other way round) as PROTO, the message naming both plane counts, and
 * a 1-plane page is half the bytes of a 2-plane one. (The router refuses
 * such a pair at REGISTER already: test_cluster_ctrl register_check.) */
static void test_planes_mismatch(void) {
    kv_geom keep = G;
    uint64_t len_of[3] = {0};
    for (int np = 2; np >= 1; np--) {
        G.planes = np;
        harness h;
        h_init(&h, N_CTX);
        CHECK_EQ(start(&h, 13, 4, 1), PD_SEND_SENDING); // one full page
        CHECK_EQ(pd_send_pump(h.s, 1000), 1);
        CHECK_EQ(h.f[0].type, PD_MSG_KV_PAGE);
        len_of[np] = h.f[0].len;
        kv_geom other = G;
        other.planes = 3 - np;
        pd_msg_kv_page hdr;
        ks_errbuf eb;
        CHECK_EQ(pd_msg_kv_page_decode(h.f[0].data, (uint32_t)h.f[0].len, (uint32_t)h.f[0].len,
                                       &other, &hdr, &eb),
                 KS_ERR_PROTO);
        CHECK_STR_HAS(eb.msg, np == 2 ? "fits pages of 2 planes (K, V) per layer, but this "
                                        "link's pages have 1 plane"
                                      : "fits pages of 1 plane per layer, but this link's pages "
                                        "have 2 planes (K, V)");
        deliver(&h, 0); // on the link of the sender's own plane count: committed
        CHECK_EQ(pd_recv_state_of(h.r, 13), PD_RECV_COMMITTED);
        check_decode_kv(&h, 13, 4);
        pd_recv_finish(h.r, 13);
        h_fini(&h);
    }
    CHECK_EQ(len_of[2] - PD_MSG_KV_PAGE_HDR, 2 * (len_of[1] - PD_MSG_KV_PAGE_HDR));
    G = keep;
}

/* A PREFILL that does not parse: PROTO, nothing emitted or recorded. */
static void test_bad_payload(void) {
    harness h;
    h_init(&h, N_CTX);
    uint8_t junk[40] = {0};
    pd_send_state st;
    CHECK(pd_send_prefill(h.s, 99, junk, sizeof junk, &st, NULL) == KS_ERR_PROTO);
    CHECK_EQ(h.n, 0);
    CHECK_EQ(pd_send_state_of(h.s, 99), PD_SEND_NONE);
    h_fini(&h);
}

static const struct {
    const char *name;
    void (*fn)(void);
    bool per_planes; /* run with G.planes 2, then 1 */
} CASES[] = {
    {"happy_path", test_happy_path, true},
    {"deep_model", test_deep_model, true},
    {"chunked_two_requests", test_chunked_two_requests, true},
    {"prefix_cache", test_prefix_cache, true},
    {"revalidation_rejects", test_revalidation_rejects, true},
    {"stale_epoch", test_stale_epoch, true},
    {"duplicate", test_duplicate, true},
    {"abort_mid_sending", test_abort_mid_sending, true},
    {"abort_before_prefill", test_abort_before_prefill, true},
    {"link_closed", test_link_closed, true},
    {"compute_error", test_compute_error, true},
    {"bad_payload", test_bad_payload, true},
    {"planes_mismatch", test_planes_mismatch, false},
};

int main(int argc, char **argv) {
    int ran = 0;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        if (argc > 1 && strcmp(argv[1], CASES[i].name) != 0) continue;
        for (int planes = 2; planes >= (CASES[i].per_planes ? 1 : 2); planes--) {
            G.planes = planes;
            CASES[i].fn();
            printf("ok %s%s\n", CASES[i].name,
                   !CASES[i].per_planes ? ""
                   : planes == 2        ? " (2 planes)"
                                        : " (1 plane)");
        }
        G.planes = 0;
        ran++;
    }
    CHECK(ran > 0);
    return 0;
}
