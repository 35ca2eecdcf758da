/* test_pd_recv.c — the decode-side KVPD transfer state machine on a real
 * kv_pool, without a network (docs/pd-protocol.md sections 6-9): grant
 * contents, zero-copy destinations, commit only on a verified handoff (I6),
 * quarantine until ABORT_ACK or link drain (I5), scrub on every free (I3),
 * duplicates and late frames, and timers that never free by themselves.
 *
 * Each case names the rule it would catch missing; `test_pd_recv NAME` runs
 * one case, on 2-plane pages (K, V) and again on 1-plane pages (one row per
 * position, MLA). */
#include "kvseal/pd_recv.h"

#include "../check.h"

static kv_geom G = {.n_layer = 3, .kv_dim = 4, .page_tokens = 4}; /* main sets planes */
/* Rows per position per layer of G, and the kv index V reads carry: with one
 * plane no V row travels, and V reads back K's row. */
#define NP kv_geom_planes(&G)
#define VKIND (NP == 2 ? 1 : 0)
#define NPAGES 12u
#define EP 7u  /* the data link's epoch */
#define EP2 9u /* another link */

// ----------------------------------------------------------------------------
// Harness: a pool, a receiver with a fake clock, an event log

typedef struct {
    pd_recv_ev ev[64];
    pd_msg_done done; /* copy of the last COMMIT's DONE */
    int n;
} evlog;

typedef struct {
    kv_pool *pool;
    pd_recv *r;
    evlog log;
    uint64_t now;
} harness;

static void on_ev(void *ctx, const pd_recv_ev *ev) {
    evlog *l = ctx;
    CHECK(l->n < 64);
    l->ev[l->n] = *ev;
    if (ev->kind == PD_RECV_EV_COMMIT) l->done = *ev->done;
    l->n++;
}

static uint64_t fake_clock(void *ctx) { return *(const uint64_t *)ctx; }

static void h_init(harness *h) {
    memset(h, 0, sizeof *h);
    h->now = 1000;
    CHECK_EQ(kv_pool_create(&G, NPAGES, KV_SCRUB_ZERO, &h->pool, NULL), KS_OK);
    pd_recv_cfg cfg = {.n_ctx = 64, .t_grant_ms = 300, .t_xfer_ms = 100, .t_ack_ms = 50,
                       .tombstone_ms = 1000, .emit = on_ev, .emit_ctx = &h->log,
                       .clock = fake_clock, .clock_ctx = &h->now};
    CHECK_EQ(pd_recv_create(h->pool, &cfg, &h->r, NULL), KS_OK);
}

static void h_fini(harness *h) {
    pd_recv_destroy(h->r);
    CHECK(kv_pool_all_free_and_scrubbed(h->pool));
    kv_pool_destroy(h->pool);
}

static int count_ev(const harness *h, pd_recv_ev_kind k) {
    int n = 0;
    for (int i = 0; i < h->log.n; i++) n += h->log.ev[i].kind == k;
    return n;
}

static const pd_recv_ev *last_ev(const harness *h, pd_recv_ev_kind k) {
    for (int i = h->log.n - 1; i >= 0; i--)
        if (h->log.ev[i].kind == k) return &h->log.ev[i];
    return NULL;
}

static uint32_t n_state(const harness *h, kv_page_state s) {
    kv_stats st;
    kv_pool_stats(h->pool, &st);
    return st.pages[s];
}

/* A granted request: its decoded grant, over a copy of the payload (r's
 * copy lives only until the request is terminal). */
typedef struct {
    uint64_t req_id;
    uint8_t raw[256];
    pd_msg_grant g;
} granted;

static granted admit(harness *h, uint64_t req_id, uint32_t n_prompt, uint32_t max_tokens,
                     uint64_t epoch) {
    granted gr = {.req_id = req_id};
    const uint8_t *buf;
    uint32_t len, deny;
    pd_recv_admit_args a = {.n_prompt = n_prompt, .max_tokens = max_tokens,
                            .prefill_worker_id = 3, .link_epoch = epoch};
    ks_errbuf eb;
    CHECK_EQ(pd_recv_admit(h->r, req_id, &a, &buf, &len, &deny, &eb), KS_OK);
    CHECK_EQ(deny, 0);
    CHECK(len <= sizeof gr.raw);
    memcpy(gr.raw, buf, len);
    CHECK_EQ(pd_msg_grant_decode(gr.raw, len, &gr.g, &eb), KS_OK);
    static const uint8_t pool_model[32] = {0}; // cfg.model_id: every GRANT carries it
    CHECK_MEM_EQ(gr.g.model_id, pool_model, 32);
    CHECK_EQ(pd_recv_state_of(h->r, req_id), PD_RECV_GRANTED);
    return gr;
}

/* Grant entry i (entries re-pointed at this copy's raw bytes). */
static pd_msg_grant_entry entry(const granted *gr, uint32_t i) {
    pd_msg_grant g = gr->g;
    g.entries = gr->raw + PD_MSG_GRANT_FIXED;
    return pd_msg_grant_entry_at(&g, i);
}

static float val(uint64_t req_id, uint32_t page, uint32_t layer, int kv, uint32_t row,
                 uint32_t col) {
    return (float)(req_id * 100000 + page * 1000 + layer * 100 + (uint32_t)kv * 50 + row * 8 + col + 1);
}

static pd_msg_kv_page page_hdr(const granted *gr, uint32_t page, uint32_t l0, uint32_t nl) {
    pd_msg_grant_entry e = entry(gr, page);
    pd_msg_kv_page hdr = {.page_index = page, .page_id = e.page_id,
                          .tag_seq_uid = gr->g.seq_uid, .tag_gen = e.gen, .n_rows = e.n_tokens,
                          .layer_first = l0, .layer_count = nl};
    return hdr;
}

/* Wire payload of a KV_PAGE (layers l0.., K rows then V rows each; one
 * plane: the rows once). */
static size_t payload(const granted *gr, const pd_msg_kv_page *hdr, float *out) {
    size_t n = 0;
    for (uint32_t l = hdr->layer_first; l < hdr->layer_first + hdr->layer_count; l++)
        for (int kv = 0; kv < NP; kv++)
            for (uint32_t row = 0; row < hdr->n_rows; row++)
                for (uint32_t c = 0; c < (uint32_t)G.kv_dim; c++)
                    out[n++] = val(gr->req_id, hdr->page_index, l, kv, row, c);
    return n * sizeof(float);
}

/* What the transport does: scatter the payload into the destinations. */
static void scatter(const struct iovec *iov, int n, const float *src, size_t bytes) {
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        CHECK(off + iov[i].iov_len <= bytes);
        memcpy(iov[i].iov_base, (const uint8_t *)src + off, iov[i].iov_len);
        off += iov[i].iov_len;
    }
    CHECK_EQ(off, bytes);
}

/* Sends one KV_PAGE frame with hdr on link epoch; returns begin's verdict. */
static bool send_hdr(harness *h, const granted *gr, uint64_t epoch, const pd_msg_kv_page *hdr,
                     bool checksum_ok) {
    struct iovec iov[16];
    int n = -1;
    bool ok = pd_recv_kv_page_begin(h->r, gr->req_id, epoch, hdr, iov, 16, &n);
    if (!ok) {
        CHECK_EQ(n, 0);
        return false;
    }
    static float buf[4096];
    size_t bytes = payload(gr, hdr, buf);
    scatter(iov, n, buf, bytes);
    pd_recv_kv_page_end(h->r, gr->req_id, checksum_ok);
    return true;
}

static bool send_page(harness *h, const granted *gr, uint32_t page, uint32_t l0, uint32_t nl) {
    pd_msg_kv_page hdr = page_hdr(gr, page, l0, nl);
    return send_hdr(h, gr, EP, &hdr, true);
}

static void send_all(harness *h, const granted *gr) {
    for (uint32_t i = 0; i < gr->g.n_pages; i++) CHECK(send_page(h, gr, i, 0, (uint32_t)G.n_layer));
}

static bool done(harness *h, const granted *gr, uint32_t covered) {
    pd_msg_done d = {.covered = covered, .first_token = 42, .logprob = -0.5f, .rng_state = 99};
    return pd_recv_done(h->r, gr->req_id, EP, &d);
}

// ----------------------------------------------------------------------------
// Cases

/* Happy path: the grant's tags are the pool's, every byte arrives through
 * kv_seq_span_write destinations, and COMMIT makes exactly that data readable. */
static void test_happy_path(void) {
    harness h;
    h_init(&h);
    uint32_t free0 = kv_pool_n_free(h.pool);
    granted gr = admit(&h, 1, 10, 3, EP);  // 13 tokens: 4 pages reserved, 3 granted
    CHECK_EQ(kv_pool_n_free(h.pool), free0 - 4);
    CHECK_EQ(gr.g.n_pages, 3);
    CHECK_EQ(gr.g.n_prompt, 10);
    CHECK_EQ(gr.g.link_epoch, EP);
    CHECK_EQ(gr.g.page_tokens, 4);
    for (uint32_t i = 0; i < 3; i++) {
        pd_msg_grant_entry e = entry(&gr, i);
        kv_page_info pi;
        CHECK_EQ(kv_pool_page_info(h.pool, e.page_id, &pi), KS_OK);
        CHECK_EQ(pi.tag.seq_uid, gr.g.seq_uid);
        CHECK_EQ(pi.tag.gen, e.gen);
        CHECK_EQ(pi.state, KV_PAGE_ALLOCATED);
        CHECK_EQ(e.n_tokens, i < 2 ? 4 : 2);
    }
    // page 0: one frame for all layers (a full page: one merged iovec)
    {
        pd_msg_kv_page hdr = page_hdr(&gr, 0, 0, 3);
        struct iovec iov[16];
        int n;
        CHECK(pd_recv_kv_page_begin(h.r, 1, EP, &hdr, iov, 16, &n));
        CHECK_EQ(n, 1);
        static float buf[4096];
        size_t bytes = payload(&gr, &hdr, buf);
        CHECK_EQ(bytes, pd_msg_kv_page_len(&G, 4, 3) - PD_MSG_KV_PAGE_HDR);
        scatter(iov, n, buf, bytes);
        pd_recv_kv_page_end(h.r, 1, true);
    }
    CHECK_EQ(pd_recv_state_of(h.r, 1), PD_RECV_RECEIVING);
    for (uint32_t l = 0; l < 3; l++) CHECK(send_page(&h, &gr, 1, l, 1));  // layer by layer
    // page 2, partial (2 rows), layers 0-1: one iovec per plane per layer, in wire order
    {
        pd_msg_kv_page hdr = page_hdr(&gr, 2, 0, 2);
        struct iovec iov[16];
        int n;
        CHECK(pd_recv_kv_page_begin(h.r, 1, EP, &hdr, iov, 16, &n));
        CHECK_EQ(n, 2 * NP);
        for (int j = 0; j < n; j++)
            CHECK_EQ(iov[j].iov_len, 2 * 4 * sizeof(float));
        static float buf[4096];
        scatter(iov, n, buf, payload(&gr, &hdr, buf));
        pd_recv_kv_page_end(h.r, 1, true);
    }
    CHECK(send_page(&h, &gr, 2, 2, 1));
    CHECK(pd_recv_seq(h.r, 1) == NULL);  // not before the commit
    CHECK(done(&h, &gr, 10));
    CHECK_EQ(pd_recv_state_of(h.r, 1), PD_RECV_COMMITTED);
    CHECK_EQ(count_ev(&h, PD_RECV_EV_COMMIT), 1);
    CHECK_EQ(h.log.done.first_token, 42);
    CHECK_EQ(h.log.done.rng_state, 99);
    CHECK_EQ(count_ev(&h, PD_RECV_EV_ABORT) + count_ev(&h, PD_RECV_EV_FINISH), 0);
    kv_seq *s = pd_recv_seq(h.r, 1);
    CHECK(s != NULL);
    CHECK_EQ(s->n_tokens, 10);
    for (uint32_t i = 0; i < 3; i++) {
        pd_msg_grant_entry e = entry(&gr, i);
        kv_page_info pi;
        CHECK_EQ(kv_pool_page_info(h.pool, e.page_id, &pi), KS_OK);
        CHECK_EQ(pi.state, KV_PAGE_READY);
        for (int l = 0; l < 3; l++) {
            const void *kb, *vb;
            CHECK_EQ(kv_seq_span_read(h.pool, s, i, l, e.n_tokens, &kb, &vb), KS_OK);
            CHECK((vb == kb) == (NP == 1));
            const float *k = kb, *v = vb; // G is an F32 geometry
            for (uint32_t row = 0; row < e.n_tokens; row++)
                for (uint32_t c = 0; c < 4; c++) {
                    CHECK(k[row * 4 + c] == val(1, i, (uint32_t)l, 0, row, c));
                    CHECK(v[row * 4 + c] == val(1, i, (uint32_t)l, VKIND, row, c));
                }
        }
    }
    // a second DONE, a late KV_PAGE: dropped, nothing changes
    CHECK(!done(&h, &gr, 10));
    CHECK_EQ(count_ev(&h, PD_RECV_EV_COMMIT), 1);
    CHECK(!send_page(&h, &gr, 0, 0, 1));
    CHECK_EQ(pd_recv_state_of(h.r, 1), PD_RECV_COMMITTED);
    pd_recv_finish(h.r, 1);  // F1
    CHECK_EQ(pd_recv_state_of(h.r, 1), PD_RECV_FREED);
    CHECK(kv_pool_all_free_and_scrubbed(h.pool));
    // late frames after the terminal state: dropped, no ABORT (it is no unknown id)
    CHECK(!send_page(&h, &gr, 0, 0, 1));
    CHECK(!done(&h, &gr, 10));
    CHECK_EQ(count_ev(&h, PD_RECV_EV_ABORT), 0);
    pd_recv_stats st;
    pd_recv_get_stats(h.r, &st);
    CHECK_EQ(st.committed, 1);
    CHECK_EQ(st.active, 0);
    CHECK_EQ(st.freed_direct, 1);
    h_fini(&h);
}

/* I6 coverage: every page arrived, but DONE.covered < n_prompt -> no commit,
 * FINISH ERROR, pages scrubbed and FREE (F2). */
static void test_done_covered_short(void) {
    harness h;
    h_init(&h);
    granted gr = admit(&h, 2, 10, 2, EP);
    send_all(&h, &gr);
    CHECK(!done(&h, &gr, 9));
    CHECK_EQ(pd_recv_state_of(h.r, 2), PD_RECV_FREED);
    CHECK_EQ(count_ev(&h, PD_RECV_EV_COMMIT), 0);
    const pd_recv_ev *f = last_ev(&h, PD_RECV_EV_FINISH);
    CHECK(f && f->finish == PD_FINISH_ERROR && f->req_id == 2);
    CHECK_STR_HAS(f->msg, "verification");
    CHECK(kv_pool_all_free_and_scrubbed(h.pool));  // data had been written: scrubbed
    h_fini(&h);
}

/* I6 completeness: one page misses a layer -> no commit, even with covered ok. */
static void test_done_missing_layer(void) {
    harness h;
    h_init(&h);
    granted gr = admit(&h, 3, 10, 2, EP);
    CHECK(send_page(&h, &gr, 0, 0, 3));
    CHECK(send_page(&h, &gr, 1, 0, 2));  // layer 2 of page 1 never sent
    CHECK(send_page(&h, &gr, 2, 0, 3));
    CHECK(!done(&h, &gr, 10));
    CHECK_EQ(pd_recv_state_of(h.r, 3), PD_RECV_FREED);
    CHECK_EQ(count_ev(&h, PD_RECV_EV_COMMIT), 0);
    CHECK(kv_pool_all_free_and_scrubbed(h.pool));
    // and a DONE with a whole page missing
    granted g2 = admit(&h, 4, 10, 2, EP);
    CHECK(send_page(&h, &g2, 0, 0, 3));
    CHECK(send_page(&h, &g2, 2, 0, 3));
    CHECK(!done(&h, &g2, 10));
    CHECK_EQ(count_ev(&h, PD_RECV_EV_COMMIT), 0);
    CHECK(kv_pool_all_free_and_scrubbed(h.pool));
    h_fini(&h);
}

/* Checks the pages of a just-failed KV_PAGE check: ABORTING, ABORT + FINISH
 * ERROR emitted, pages in QUARANTINE (not FREE, not reusable). */
static void expect_quarantined(harness *h, const granted *gr, uint32_t n_pages, uint32_t free_before) {
    CHECK_EQ(pd_recv_state_of(h->r, gr->req_id), PD_RECV_ABORTING);
    const pd_recv_ev *a = last_ev(h, PD_RECV_EV_ABORT);
    CHECK(a && a->req_id == gr->req_id && a->link_epoch == EP && a->abort_reason == PD_ABORT_ERROR);
    const pd_recv_ev *f = last_ev(h, PD_RECV_EV_FINISH);
    CHECK(f && f->req_id == gr->req_id && f->finish == PD_FINISH_ERROR);
    CHECK_EQ(n_state(h, KV_PAGE_QUARANTINE), n_pages);
    CHECK_EQ(kv_pool_n_free(h->pool), free_before);
    for (uint32_t i = 0; i < gr->g.n_pages; i++) {
        kv_page_info pi;
        CHECK_EQ(kv_pool_page_info(h->pool, entry(gr, i).page_id, &pi), KS_OK);
        CHECK_EQ(pi.state, KV_PAGE_QUARANTINE);
    }
    // the payload of further frames is discarded, DONE does not commit
    CHECK(!send_page(h, gr, 1, 0, 1));
    CHECK(!done(h, gr, gr->g.n_prompt));
    CHECK_EQ(pd_recv_state_of(h->r, gr->req_id), PD_RECV_ABORTING);
    CHECK_EQ(n_state(h, KV_PAGE_QUARANTINE), n_pages);
}

/* KV_PAGE checks (section 6): wrong tag, wrong page_id (another request's
 * page with ITS valid tag), wrong epoch, duplicate layer, n_rows, page_index
 * -> ABORTING, no byte written, quarantine until ABORT_ACK / link drain (I5). */
static void test_kv_page_checks(void) {
    for (int variant = 0; variant < 6; variant++) {
        harness h;
        h_init(&h);
        granted by = admit(&h, 51, 4, 1, EP2);  // a bystander on another link
        pd_msg_grant_entry bye = entry(&by, 0);
        granted gr = admit(&h, 5, 10, 2, EP);  // 12 tokens: 3 pages
        CHECK(send_page(&h, &gr, 0, 0, 3));
        uint32_t free_before = kv_pool_n_free(h.pool);
        uint32_t q_before = n_state(&h, KV_PAGE_QUARANTINE);
        pd_msg_kv_page hdr = page_hdr(&gr, 1, 0, 1);
        uint64_t epoch = EP;
        bool violation = false;
        switch (variant) {
        case 0: hdr.tag_gen += 1; violation = true; break;
        case 1:  // another request's page with that request's valid tag
            hdr.page_id = bye.page_id;
            hdr.tag_seq_uid = by.g.seq_uid;
            hdr.tag_gen = bye.gen;
            violation = true;
            break;
        case 2: epoch = EP2; break;
        case 3: hdr = page_hdr(&gr, 0, 2, 1); break;  // layer 2 of page 0 again
        case 4: hdr.n_rows = 3; break;
        case 5: hdr.page_index = 3; break;
        }
        pd_recv_stats st0, st1;
        pd_recv_get_stats(h.r, &st0);
        CHECK(!send_hdr(&h, &gr, epoch, &hdr, true));
        pd_recv_get_stats(h.r, &st1);
        CHECK_EQ(st1.page_rejects, st0.page_rejects + 1);
        CHECK_EQ(st1.tag_violations, st0.tag_violations + (violation ? 1 : 0));
        expect_quarantined(&h, &gr, q_before + 3, free_before);
        // the bystander's page was not touched
        CHECK_EQ(pd_recv_state_of(h.r, 51), PD_RECV_GRANTED);
        kv_page_info pi;
        CHECK_EQ(kv_pool_page_info(h.pool, bye.page_id, &pi), KS_OK);
        CHECK_EQ(pi.state, KV_PAGE_ALLOCATED);
        // a new admit cannot reuse quarantined pages: the pool is short now
        uint32_t fr = kv_pool_n_free(h.pool);
        const uint8_t *gb;
        uint32_t gl, deny;
        pd_recv_admit_args a = {.n_prompt = fr * 4, .max_tokens = 1, .link_epoch = EP};
        CHECK_EQ(pd_recv_admit(h.r, 60, &a, &gb, &gl, &deny, NULL), KS_ERR_NOSPACE);
        CHECK_EQ(deny, PD_DENY_NOSPACE);
        // an ACK on the wrong link frees nothing; ticks past T_ack free nothing
        pd_recv_abort_ack(h.r, 5, EP2);
        h.now += 60;  // past T_ack (50), before the bystander's T_grant (300)
        (void)pd_recv_tick(h.r);
        CHECK_EQ(count_ev(&h, PD_RECV_EV_TEARDOWN), 1);
        CHECK_EQ(pd_recv_state_of(h.r, 5), PD_RECV_ABORTING);
        CHECK_EQ(kv_pool_n_free(h.pool), fr);
        if (variant % 2 == 0) {
            pd_recv_abort_ack(h.r, 5, EP);  // F4
        } else {
            CHECK(pd_recv_link_closed(h.r, EP) >= 1);  // F5
        }
        CHECK_EQ(pd_recv_state_of(h.r, 5), PD_RECV_FREED);
        CHECK_EQ(n_state(&h, KV_PAGE_QUARANTINE), q_before);
        CHECK_EQ(kv_pool_n_free(h.pool), fr + 3);
        // every page that held request 5's bytes is scrubbed
        for (uint32_t i = 0; i < 3; i++) {
            kv_page_info p2;
            CHECK_EQ(kv_pool_page_info(h.pool, entry(&gr, i).page_id, &p2), KS_OK);
            CHECK_EQ(p2.state, KV_PAGE_FREE);
        }
        pd_recv_link_closed(h.r, EP2);
        CHECK(kv_pool_all_free_and_scrubbed(h.pool));
        h_fini(&h);
    }
}

/* I5: a router ABORT while RECEIVING quarantines; nothing is freed until
 * ABORT_ACK — not by DONE/REJECT/KV_PAGE in ABORTING, not by T_ack expiry. */
static void test_router_abort_waits_for_ack(void) {
    harness h;
    h_init(&h);
    uint32_t free0 = kv_pool_n_free(h.pool);
    granted gr = admit(&h, 6, 8, 24, EP);  // 32 tokens: 8 of 12 pages
    CHECK(send_page(&h, &gr, 0, 0, 3));
    // a delivery is in progress when the abort comes
    pd_msg_kv_page hdr = page_hdr(&gr, 1, 0, 3);
    struct iovec iov[16];
    int n;
    CHECK(pd_recv_kv_page_begin(h.r, 6, EP, &hdr, iov, 16, &n));
    CHECK(pd_recv_abort(h.r, 6, PD_ABORT_CLIENT_GONE));
    const pd_recv_ev *a = last_ev(&h, PD_RECV_EV_ABORT);
    CHECK(a && a->abort_reason == PD_ABORT_CLIENT_GONE && a->link_epoch == EP);
    const pd_recv_ev *f = last_ev(&h, PD_RECV_EV_FINISH);
    CHECK(f && f->finish == PD_FINISH_ABORT);
    CHECK_EQ(kv_pool_n_free(h.pool), free0 - 8);
    CHECK_EQ(n_state(&h, KV_PAGE_QUARANTINE), 8);
    // the live writer keeps landing bytes: into quarantined pages only
    static float buf[4096];
    scatter(iov, n, buf, payload(&gr, &hdr, buf));
    pd_recv_kv_page_end(h.r, 6, true);
    CHECK_EQ(pd_recv_state_of(h.r, 6), PD_RECV_ABORTING);
    // no admit can get those pages
    const uint8_t *gb;
    uint32_t gl, deny;
    pd_recv_admit_args aa = {.n_prompt = 8, .max_tokens = 9, .link_epoch = EP};  // 5 pages
    CHECK_EQ(pd_recv_admit(h.r, 7, &aa, &gb, &gl, &deny, NULL), KS_ERR_NOSPACE);
    // frames in ABORTING are discarded and free nothing
    CHECK(!done(&h, &gr, 8));
    pd_recv_reject(h.r, 6, EP, ADMIT_CONTEXT_LENGTH, NULL);
    pd_recv_prefill_abort(h.r, 6, EP);
    CHECK(!pd_recv_abort(h.r, 6, PD_ABORT_CLIENT_GONE));  // duplicate router abort
    CHECK_EQ(count_ev(&h, PD_RECV_EV_ABORT), 1);
    CHECK_EQ(kv_pool_n_free(h.pool), free0 - 8);
    // T_ack: teardown requested once, nothing freed
    h.now += 49;
    CHECK_EQ(pd_recv_tick(h.r), 0);
    h.now += 1;
    CHECK_EQ(pd_recv_tick(h.r), 1);
    const pd_recv_ev *t = last_ev(&h, PD_RECV_EV_TEARDOWN);
    CHECK(t && t->link_epoch == EP && t->req_id == 6);
    h.now += 500;
    CHECK_EQ(pd_recv_tick(h.r), 0);
    CHECK_EQ(count_ev(&h, PD_RECV_EV_TEARDOWN), 1);
    CHECK_EQ(kv_pool_n_free(h.pool), free0 - 8);
    CHECK_EQ(pd_recv_state_of(h.r, 6), PD_RECV_ABORTING);
    pd_recv_abort_ack(h.r, 6, EP);  // F4
    CHECK_EQ(pd_recv_state_of(h.r, 6), PD_RECV_FREED);
    CHECK_EQ(kv_pool_n_free(h.pool), free0);
    CHECK(kv_pool_all_free_and_scrubbed(h.pool));
    pd_recv_abort_ack(h.r, 6, EP);  // a duplicate ACK: dropped
    CHECK_EQ(pd_recv_admit(h.r, 7, &aa, &gb, &gl, &deny, NULL), KS_OK);  // now it fits
    pd_recv_reject(h.r, 7, EP, ADMIT_CONTEXT_LENGTH, NULL);
    h_fini(&h);
}

/* F3: REJECT / ABORT from prefill on the grant's link frees directly; on
 * another link it is dropped. */
static void test_reject_frees_directly(void) {
    harness h;
    h_init(&h);
    uint32_t free0 = kv_pool_n_free(h.pool);
    granted gr = admit(&h, 8, 5, 1, EP);
    pd_recv_reject(h.r, 8, EP2, ADMIT_CONTEXT_LENGTH, NULL);
    CHECK_EQ(pd_recv_state_of(h.r, 8), PD_RECV_GRANTED);
    pd_recv_reject(h.r, 8, EP, ADMIT_CONTEXT_LENGTH, NULL);
    CHECK_EQ(pd_recv_state_of(h.r, 8), PD_RECV_FREED);
    CHECK_EQ(kv_pool_n_free(h.pool), free0);
    CHECK_EQ(n_state(&h, KV_PAGE_QUARANTINE), 0);
    const pd_recv_ev *f = last_ev(&h, PD_RECV_EV_FINISH);
    CHECK(f && f->req_id == 8 && f->finish == PD_FINISH_ERROR);
    CHECK_EQ(count_ev(&h, PD_RECV_EV_ABORT), 0);
    pd_recv_reject(h.r, 8, EP, ADMIT_CONTEXT_LENGTH, NULL); // second REJECT: dropped
    CHECK_EQ(count_ev(&h, PD_RECV_EV_FINISH), 1);
    // ABORT from prefill while RECEIVING
    granted g2 = admit(&h, 9, 9, 1, EP);
    CHECK(send_page(&h, &g2, 0, 0, 3));
    pd_recv_prefill_abort(h.r, 9, EP);
    CHECK_EQ(pd_recv_state_of(h.r, 9), PD_RECV_FREED);
    CHECK(kv_pool_all_free_and_scrubbed(h.pool));
    (void)gr;
    h_fini(&h);
}

/* F5: the link closes (drained) -> every request bound to it is freed, in
 * GRANTED, RECEIVING and ABORTING; other links' requests are untouched. */
static void test_link_closed(void) {
    harness h;
    h_init(&h);
    granted a = admit(&h, 10, 4, 1, EP);
    granted b = admit(&h, 11, 5, 1, EP);
    granted c = admit(&h, 12, 6, 1, EP);
    granted d = admit(&h, 13, 4, 1, EP2);
    CHECK(send_page(&h, &b, 0, 0, 3));
    CHECK(send_page(&h, &c, 0, 0, 1));
    CHECK(pd_recv_abort(h.r, 12, PD_ABORT_TIMEOUT));
    int fin0 = count_ev(&h, PD_RECV_EV_FINISH);
    CHECK_EQ(pd_recv_link_closed(h.r, EP), 3);
    CHECK_EQ(pd_recv_state_of(h.r, 10), PD_RECV_FREED);
    CHECK_EQ(pd_recv_state_of(h.r, 11), PD_RECV_FREED);
    CHECK_EQ(pd_recv_state_of(h.r, 12), PD_RECV_FREED);
    CHECK_EQ(pd_recv_state_of(h.r, 13), PD_RECV_GRANTED);
    // a and b reported failed now; c's FINISH went out when it was aborted
    CHECK_EQ(count_ev(&h, PD_RECV_EV_FINISH), fin0 + 2);
    CHECK_EQ(last_ev(&h, PD_RECV_EV_FINISH)->err, KS_ERR_PEER_CLOSED);
    CHECK_EQ(n_state(&h, KV_PAGE_QUARANTINE), 0);
    CHECK_EQ(kv_pool_n_free(h.pool), NPAGES - 2);
    CHECK_EQ(pd_recv_link_closed(h.r, EP), 0);  // again: nothing left
    // F6 (router lost): every live grant goes ABORTING, frees only by F4/F5
    CHECK_EQ(pd_recv_abort_all(h.r, PD_ABORT_WORKER_LOST), 1);
    CHECK_EQ(pd_recv_state_of(h.r, 13), PD_RECV_ABORTING);
    CHECK_EQ(n_state(&h, KV_PAGE_QUARANTINE), 2);
    CHECK_EQ(last_ev(&h, PD_RECV_EV_ABORT)->abort_reason, PD_ABORT_WORKER_LOST);
    pd_recv_abort_ack(h.r, 13, EP2);
    CHECK_EQ(n_state(&h, KV_PAGE_QUARANTINE), 0);
    // a checksum failure: ABORTING, then the caller closes the link (F5)
    granted e = admit(&h, 14, 8, 1, EP2);
    pd_msg_kv_page hdr = page_hdr(&e, 0, 0, 3);
    CHECK(send_hdr(&h, &e, EP2, &hdr, true));
    hdr = page_hdr(&e, 1, 0, 3);
    CHECK(send_hdr(&h, &e, EP2, &hdr, false));
    CHECK_EQ(pd_recv_state_of(h.r, 14), PD_RECV_ABORTING);
    CHECK(n_state(&h, KV_PAGE_QUARANTINE) > 0);
    CHECK_EQ(pd_recv_link_closed(h.r, EP2), 1);
    CHECK(kv_pool_all_free_and_scrubbed(h.pool));
    (void)a;
    (void)d;
    h_fini(&h);
}

/* Section 8: T_grant and T_xfer expiry quarantine (never free); T_ack asks
 * for a teardown; only the drained close frees. */
static void test_timers(void) {
    harness h;
    h_init(&h);
    granted a = admit(&h, 20, 4, 1, EP);  // T_grant 300
    h.now += 200;
    granted b = admit(&h, 21, 8, 1, EP);
    CHECK(send_page(&h, &b, 0, 0, 3));  // T_xfer 100 from now
    h.now += 99;
    CHECK_EQ(pd_recv_tick(h.r), 0);
    CHECK(send_page(&h, &b, 1, 0, 1));  // progress restarts T_xfer
    h.now += 1;                         // now = 1300: a's T_grant expires
    CHECK_EQ(pd_recv_tick(h.r), 2);
    CHECK_EQ(pd_recv_state_of(h.r, 20), PD_RECV_ABORTING);
    CHECK_EQ(pd_recv_state_of(h.r, 21), PD_RECV_RECEIVING);
    const pd_recv_ev *ab = last_ev(&h, PD_RECV_EV_ABORT);
    CHECK(ab && ab->req_id == 20 && ab->abort_reason == PD_ABORT_TIMEOUT);
    CHECK_EQ(last_ev(&h, PD_RECV_EV_FINISH)->err, KS_ERR_TIMEOUT);
    h.now += 49;  // 1349: nothing (a's T_ack ends at 1350, b's T_xfer at 1399)
    CHECK_EQ(pd_recv_tick(h.r), 0);
    h.now += 1;  // 1350: a's T_ack is over: teardown asked, nothing freed
    CHECK_EQ(pd_recv_tick(h.r), 1);
    CHECK_EQ(last_ev(&h, PD_RECV_EV_TEARDOWN)->req_id, 20);
    CHECK_EQ(n_state(&h, KV_PAGE_QUARANTINE), 2);  // a: 5 tokens, 2 pages
    h.now += 49;  // 1399: b's T_xfer expires
    CHECK_EQ(pd_recv_tick(h.r), 2);
    CHECK_EQ(pd_recv_state_of(h.r, 21), PD_RECV_ABORTING);
    CHECK_EQ(n_state(&h, KV_PAGE_QUARANTINE), 5);  // + b: 9 tokens, 3 pages
    h.now += 50;  // 1449: b's T_ack
    CHECK_EQ(pd_recv_tick(h.r), 1);
    CHECK_EQ(count_ev(&h, PD_RECV_EV_TEARDOWN), 2);
    h.now += 10000;
    CHECK_EQ(pd_recv_tick(h.r), 0);
    CHECK_EQ(n_state(&h, KV_PAGE_QUARANTINE), 5);  // nothing freed by time
    CHECK_EQ(pd_recv_link_closed(h.r, EP), 2);
    CHECK(kv_pool_all_free_and_scrubbed(h.pool));
    (void)a;
    h_fini(&h);
}

/* Section 9 duplicates, DENY reasons, unknown ids, tombstones. */
static void test_duplicates_and_denies(void) {
    harness h;
    h_init(&h);
    granted a = admit(&h, 30, 4, 1, EP);
    const uint8_t *gb;
    uint32_t gl, deny;
    ks_errbuf eb;
    pd_recv_admit_args aa = {.n_prompt = 4, .max_tokens = 1, .link_epoch = EP};
    CHECK_EQ(pd_recv_admit(h.r, 30, &aa, &gb, &gl, &deny, &eb), KS_ERR_INVAL);
    CHECK_EQ(deny, PD_DENY_DUPLICATE);
    CHECK_STR_HAS(eb.msg, "duplicate");
    CHECK(gb == NULL && gl == 0);
    CHECK_EQ(pd_recv_state_of(h.r, 30), PD_RECV_GRANTED);  // untouched
    CHECK(send_page(&h, &a, 0, 0, 3));
    CHECK(done(&h, &a, 4));
    pd_recv_finish(h.r, 30);
    CHECK_EQ(pd_recv_admit(h.r, 30, &aa, &gb, &gl, &deny, &eb), KS_ERR_INVAL);  // tombstone
    CHECK_EQ(deny, PD_DENY_DUPLICATE);
    // CONTEXT, NO_LINK, NOSPACE
    pd_recv_admit_args big = {.n_prompt = 60, .max_tokens = 5, .link_epoch = EP};
    CHECK_EQ(pd_recv_admit(h.r, 31, &big, &gb, &gl, &deny, &eb), KS_ERR_INVAL);
    CHECK_EQ(deny, PD_DENY_CONTEXT);
    pd_recv_admit_args nolink = {.n_prompt = 4, .max_tokens = 1, .link_epoch = 0};
    CHECK_EQ(pd_recv_admit(h.r, 31, &nolink, &gb, &gl, &deny, &eb), KS_ERR_INVAL);
    CHECK_EQ(deny, PD_DENY_NO_LINK);
    pd_recv_admit_args full = {.n_prompt = 49, .max_tokens = 1, .link_epoch = EP};
    CHECK_EQ(pd_recv_admit(h.r, 31, &full, &gb, &gl, &deny, &eb), KS_ERR_NOSPACE);
    CHECK_EQ(deny, PD_DENY_NOSPACE);
    CHECK_EQ(pd_recv_state_of(h.r, 31), PD_RECV_NONE);
    CHECK_EQ(kv_pool_n_free(h.pool), NPAGES);
    // MODEL (issue 40): an ADMIT for another model than the pool's is refused before
    // anything is reserved, naming both; the receiver's own model gets a GRANT carrying it
    uint8_t other[32];
    memset(other, 0x42, sizeof other);
    pd_recv_admit_args om = {.n_prompt = 4, .max_tokens = 1, .link_epoch = EP, .model_id = other};
    CHECK_EQ(pd_recv_admit(h.r, 31, &om, &gb, &gl, &deny, &eb), KS_ERR_INVAL);
    CHECK_EQ(deny, PD_DENY_MODEL);
    CHECK_STR_HAS(eb.msg, "the request is for model 42424242.. but this worker's pages hold "
                          "model 00000000..: no page crosses models");
    CHECK(gb == NULL && gl == 0);
    CHECK_EQ(pd_recv_state_of(h.r, 31), PD_RECV_NONE);
    CHECK_EQ(kv_pool_n_free(h.pool), NPAGES);
    // (every GRANT carries the pool's model: admit() checks it)
    // KV_PAGE for an unknown req_id: discarded, ABORT back on that link
    granted ghost = a;
    ghost.req_id = 999;
    pd_msg_kv_page hdr = page_hdr(&a, 0, 0, 1);
    CHECK(!send_hdr(&h, &ghost, EP2, &hdr, true));
    const pd_recv_ev *ab = last_ev(&h, PD_RECV_EV_ABORT);
    CHECK(ab && ab->req_id == 999 && ab->link_epoch == EP2);
    // unexpected ABORT_ACK / router ABORT / finish: dropped
    pd_recv_abort_ack(h.r, 998, EP);
    CHECK(!pd_recv_abort(h.r, 998, PD_ABORT_CLIENT_GONE));
    pd_recv_finish(h.r, 998);
    // the tombstone is forgotten after tombstone_ms
    h.now += 1001;
    (void)pd_recv_tick(h.r);
    CHECK_EQ(pd_recv_state_of(h.r, 30), PD_RECV_NONE);
    CHECK(kv_pool_all_free_and_scrubbed(h.pool));
    h_fini(&h);
}

// ----------------------------------------------------------------------------

static const struct {
    const char *name;
    void (*fn)(void);
} cases[] = {
    {"happy_path", test_happy_path},
    {"done_covered_short", test_done_covered_short},
    {"done_missing_layer", test_done_missing_layer},
    {"kv_page_checks", test_kv_page_checks},
    {"router_abort_waits_for_ack", test_router_abort_waits_for_ack},
    {"reject_frees_directly", test_reject_frees_directly},
    {"link_closed", test_link_closed},
    {"timers", test_timers},
    {"duplicates_and_denies", test_duplicates_and_denies},
};

int main(int argc, char **argv) {
    ks_log_set_level(KS_LOG_OFF);  // rejected pages log at WARN here by design
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0) continue;
        for (int planes = 2; planes >= 1; planes--) {
            G.planes = planes;
            cases[i].fn();
            printf("  %s ok (%s)\n", cases[i].name, planes == 2 ? "2 planes" : "1 plane");
        }
        G.planes = 0;
        ran++;
    }
    CHECK(ran > 0);
    printf("pd_recv ok\n");
    return 0;
}
