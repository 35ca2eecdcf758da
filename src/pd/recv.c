/* recv.c — the decode-side transfer state machine of KVPD v1
 * (docs/pd-protocol.md sections 6, 7, 8, 9; include/kvseal/pd_recv.h).
 *
 * Reading order: the request table, state changes (the only places that free
 * or quarantine pages: rec__free_direct, rec__free_quarantine,
 * rec__go_aborting), then one function per incoming event, then timers.
 *
 * The rule this file exists for (I5): pages of a request leave its ownership
 * only through F1-F5 of section 7. A request that ends any other way goes to
 * ABORTING with its pages in QUARANTINE, and only ABORT_ACK on the grant's
 * link (F4) or the drained close of that link (F5) frees them. */
#include "kvseal/pd_recv.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Request table

typedef struct rec__req {
    uint64_t req_id;
    uint64_t link_epoch;
    uint32_t prefill_worker_id;
    uint32_t n_prompt, max_tokens;
    pd_recv_state state;
    kv_seq seq;                 /* the block table: prompt + generation pages */
    uint64_t seq_uid;           /* tag part 1; stays after the table is emptied */
    uint32_t n_grant;           /* pages in the grant: the prompt's, then the state's */
    uint32_t n_kv;              /* of which the prompt's KV pages (the rest: recurrent state) */
    pd_msg_grant_entry *ent;    /* n_grant grant entries */
    uint64_t *bits;             /* n_grant * words: received layers per page */
    uint8_t *grant_buf;         /* the encoded GRANT payload */
    uint32_t grant_len;
    uint64_t deadline_ms;       /* T_grant / T_xfer / T_ack, by state */
    uint64_t tomb_until_ms;     /* FREED: forgotten after this */
    bool teardown_asked;        /* ABORTING: EV_TEARDOWN already emitted */
    bool pending;               /* a KV_PAGE delivery is in progress */
    uint32_t pend_page, pend_l0, pend_nl;
} rec__req;

struct pd_recv {
    kv_pool *pool;
    pd_recv_cfg cfg;
    kv_geom g;
    uint32_t words;             /* u64 words per page layer bitmap */
    rec__req **req;
    uint32_t n_req, cap_req;
    pd_recv_stats st;
};

static uint64_t rec__clock_default(void *ctx) {
    (void)ctx;
    return ks_now_ns() / 1000000u;
}

static uint64_t rec__now(const pd_recv *r) { return r->cfg.clock(r->cfg.clock_ctx); }

static rec__req *rec__find(const pd_recv *r, uint64_t req_id) {
    for (uint32_t i = 0; i < r->n_req; i++)
        if (r->req[i]->req_id == req_id) return r->req[i];
    return NULL;
}

static bool rec__live(const rec__req *q) {
    return q->state == PD_RECV_GRANTED || q->state == PD_RECV_RECEIVING;
}

static void rec__drop_buffers(rec__req *q) {
    free(q->ent);
    free(q->bits);
    free(q->grant_buf);
    q->ent = NULL;
    q->bits = NULL;
    q->grant_buf = NULL;
    q->grant_len = 0;
}

static void rec__emit(pd_recv *r, const pd_recv_ev *ev) { r->cfg.emit(r->cfg.emit_ctx, ev); }

static void rec__emit_finish(pd_recv *r, const rec__req *q, uint32_t finish, ks_err err,
                             uint32_t reason, const char *msg) {
    pd_recv_ev ev = {.kind = PD_RECV_EV_FINISH,
                     .req_id = q->req_id,
                     .link_epoch = q->link_epoch,
                     .finish = finish,
                     .err = err,
                     .reason = reason,
                     .msg = msg,
                     .n_prompt = q->n_prompt};
    rec__emit(r, &ev);
}

static void rec__emit_abort(pd_recv *r, uint64_t req_id, uint64_t link_epoch, uint32_t reason) {
    pd_recv_ev ev = {.kind = PD_RECV_EV_ABORT, .req_id = req_id, .link_epoch = link_epoch,
                     .abort_reason = reason};
    rec__emit(r, &ev);
}

// ----------------------------------------------------------------------------
// State changes: the only code that frees or quarantines pages

static void rec__terminal(pd_recv *r, rec__req *q) {
    q->state = PD_RECV_FREED;
    q->pending = false;
    q->tomb_until_ms = rec__now(r) + r->cfg.tombstone_ms;
    rec__drop_buffers(q);
    KS_ASSERT(r->st.active > 0);
    r->st.active--;
}

/* F1, F2, F3, F5 of a live grant: no writer can be live; scrub and free. */
static void rec__free_direct(pd_recv *r, rec__req *q) {
    kv_seq_release(r->pool, &q->seq);
    r->st.freed_direct++;
    rec__terminal(r, q);
}

/* F4, F5 of an ABORTING request: the writer is quiesced; scrub and free. */
static void rec__free_quarantine(pd_recv *r, rec__req *q) {
    KS_ASSERT(q->state == PD_RECV_ABORTING);
    (void)kv_pool_quarantine_free(r->pool, q->seq_uid);
    r->st.freed_quarantine++;
    rec__terminal(r, q);
}

/* Everything else that ends a live grant (section 7): pages to QUARANTINE,
 * ABORT to prefill on the grant's link, FINISH to the router. A delivery in
 * progress keeps writing into quarantined pages, which is what quarantine is
 * for; its pd_recv_kv_page_end is then ignored. */
static void rec__go_aborting(pd_recv *r, rec__req *q, uint32_t abort_reason, uint32_t finish,
                             ks_err err, const char *msg) {
    KS_ASSERT(rec__live(q));
#ifdef KS_BROKEN_FREE_BEFORE_QUIESCE
    // TEST ONLY: frees pages a writer may still target (violates I5, F4/F5)
    kv_seq_release(r->pool, &q->seq);
#else
    (void)kv_seq_quarantine(r->pool, &q->seq);
#endif
    q->state = PD_RECV_ABORTING;
    q->deadline_ms = rec__now(r) + r->cfg.t_ack_ms;
    q->teardown_asked = false;
    r->st.aborts++;
    rec__emit_abort(r, q->req_id, q->link_epoch, abort_reason);
    rec__emit_finish(r, q, finish, err, 0, msg);
}

// ----------------------------------------------------------------------------
// Lifetime

ks_err pd_recv_create(kv_pool *pool, const pd_recv_cfg *cfg, pd_recv **out, ks_errbuf *eb) {
    *out = NULL;
    if (!pool || !cfg || !cfg->emit)
        return ks_seterr(eb, KS_ERR_INVAL, "pd_recv: pool and cfg.emit are required");
    pd_recv *r = calloc(1, sizeof *r);
    if (!r) return ks_seterr(eb, KS_ERR_NOMEM, "pd_recv: out of memory");
    r->pool = pool;
    r->cfg = *cfg;
    if (!r->cfg.t_grant_ms) r->cfg.t_grant_ms = 30000;
    if (!r->cfg.t_xfer_ms) r->cfg.t_xfer_ms = 10000;
    if (!r->cfg.t_ack_ms) r->cfg.t_ack_ms = 5000;
    if (!r->cfg.tombstone_ms) r->cfg.tombstone_ms = 2 * r->cfg.t_grant_ms;
    if (!r->cfg.clock) r->cfg.clock = rec__clock_default;
    r->g = *kv_pool_geom(pool);
    r->words = ((uint32_t)r->g.n_layer + 63u) / 64u;
    *out = r;
    return KS_OK;
}

void pd_recv_destroy(pd_recv *r) {
    if (!r) return;
    for (uint32_t i = 0; i < r->n_req; i++) {
        rec__req *q = r->req[i];
        if (q->state == PD_RECV_ABORTING) (void)kv_pool_quarantine_free(r->pool, q->seq_uid);
        kv_seq_release(r->pool, &q->seq);
        rec__drop_buffers(q);
        free(q);
    }
    free(r->req);
    free(r);
}

// ----------------------------------------------------------------------------
// ADMIT -> GRANT / DENY

static ks_err rec__deny(pd_recv *r, uint32_t *deny_reason, uint32_t reason, ks_err code,
                        ks_errbuf *eb, const char *msg) {
    r->st.denied++;
    *deny_reason = reason;
    return ks_seterr(eb, code, "%s", msg);
}

ks_err pd_recv_admit(pd_recv *r, uint64_t req_id, const pd_recv_admit_args *a,
                     const uint8_t **grant, uint32_t *grant_len, uint32_t *deny_reason,
                     ks_errbuf *eb) {
    *grant = NULL;
    *grant_len = 0;
    *deny_reason = 0;
    if (rec__find(r, req_id))
        return rec__deny(r, deny_reason, PD_DENY_DUPLICATE, KS_ERR_INVAL, eb,
                         "duplicate request id");
    static const uint8_t no_model[32] = {0};
    const uint8_t *mid = a->model_id ? a->model_id : no_model;
    if (memcmp(mid, r->cfg.model_id, sizeof r->cfg.model_id)) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "the request is for model %02x%02x%02x%02x.. but this worker's pages hold model "
                 "%02x%02x%02x%02x..: no page crosses models",
                 mid[0], mid[1], mid[2], mid[3],
                 r->cfg.model_id[0], r->cfg.model_id[1], r->cfg.model_id[2], r->cfg.model_id[3]);
        return rec__deny(r, deny_reason, PD_DENY_MODEL, KS_ERR_INVAL, eb, msg);
    }
    if (a->n_prompt < 1 || a->max_tokens < 1)
        return rec__deny(r, deny_reason, PD_DENY_CONTEXT, KS_ERR_INVAL, eb,
                         "n_prompt and max_tokens must be at least 1");
    uint64_t total = (uint64_t)a->n_prompt + a->max_tokens;
    if (total > UINT32_MAX || (r->cfg.n_ctx && total > r->cfg.n_ctx))
        return rec__deny(r, deny_reason, PD_DENY_CONTEXT, KS_ERR_INVAL, eb,
                         "prompt plus max_tokens exceeds the context length");
    if (a->link_epoch == 0)
        return rec__deny(r, deny_reason, PD_DENY_NO_LINK, KS_ERR_INVAL, eb,
                         "no data link from the prefill worker");

    if (r->n_req == r->cap_req) {
        uint32_t cap = r->cap_req ? r->cap_req * 2 : 16;
        rec__req **nr = realloc(r->req, sizeof *nr * cap);
        if (!nr)
            return rec__deny(r, deny_reason, PD_DENY_NOSPACE, KS_ERR_NOMEM, eb, "out of memory");
        r->req = nr;
        r->cap_req = cap;
    }
    rec__req *q = calloc(1, sizeof *q);
    if (!q) return rec__deny(r, deny_reason, PD_DENY_NOSPACE, KS_ERR_NOMEM, eb, "out of memory");
    kv_seq_init(r->pool, &q->seq);
    ks_errbuf kb;
    ks_err e = kv_seq_reserve(r->pool, &q->seq, (uint32_t)total, &kb);
    if (e != KS_OK) {
        kv_seq_release(r->pool, &q->seq);
        free(q);
        return rec__deny(r, deny_reason, PD_DENY_NOSPACE, e == KS_ERR_NOSPACE ? e : KS_ERR_NOMEM,
                         eb, "KV cache full");
    }
    uint32_t pt = (uint32_t)r->g.page_tokens;
    q->req_id = req_id;
    q->link_epoch = a->link_epoch;
    q->prefill_worker_id = a->prefill_worker_id;
    q->n_prompt = a->n_prompt;
    q->max_tokens = a->max_tokens;
    q->seq_uid = q->seq.uid;
    q->n_kv = (a->n_prompt + pt - 1) / pt;
    q->n_grant = q->n_kv + (uint32_t)r->g.state_pages; // a hybrid model's state travels too
    KS_ASSERT(q->seq.n_pages >= q->n_kv);
    q->ent = calloc(q->n_grant, sizeof *q->ent);
    q->bits = calloc((size_t)q->n_grant * r->words, sizeof *q->bits);
    pd_msg_grant gm = {.seq_uid = q->seq_uid, .link_epoch = a->link_epoch,
                       .n_prompt = a->n_prompt, .page_tokens = pt, .n_pages = q->n_grant};
    memcpy(gm.model_id, r->cfg.model_id, sizeof gm.model_id);
    uint64_t glen = pd_msg_grant_size(q->n_grant);
    if (glen <= PD_MSG_GRANT_MAX) q->grant_buf = malloc((size_t)glen);
    if (!q->ent || !q->bits || !q->grant_buf) goto fail_nomem;
    for (uint32_t i = 0; i < q->n_grant; i++) {
        const bool st = i >= q->n_kv; // the grant announces id and tag of every page
        const kv_entry ke = st ? kv_seq_state_entry(&q->seq, i - q->n_kv) : kv_seq_entry(&q->seq, i);
        KS_ASSERT(ke.tag.seq_uid == q->seq_uid);
        q->ent[i].page_id = ke.page;
        q->ent[i].first_token = st ? PD_MSG_STATE_PAGE : i * pt;
        q->ent[i].n_tokens = st ? pt : (i + 1 == q->n_kv) ? a->n_prompt - i * pt : pt;
        q->ent[i].gen = ke.tag.gen;
    }
    if (pd_msg_grant_encode(&gm, q->ent, q->grant_buf, (size_t)glen, &q->grant_len, &kb) != KS_OK) {
        ks_log(KS_LOG_ERROR, "pd_recv: grant for request %llu: %s", (unsigned long long)req_id,
               kb.msg);
        goto fail_nomem;
    }
    q->state = PD_RECV_GRANTED;
    q->deadline_ms = rec__now(r) + r->cfg.t_grant_ms;
    r->req[r->n_req++] = q;
    r->st.granted++;
    r->st.active++;
    *grant = q->grant_buf;
    *grant_len = q->grant_len;
    return KS_OK;

fail_nomem:
    kv_seq_release(r->pool, &q->seq);
    rec__drop_buffers(q);
    free(q);
    return rec__deny(r, deny_reason, PD_DENY_NOSPACE, KS_ERR_NOMEM, eb,
                     "grant too large or out of memory");
}

// ----------------------------------------------------------------------------
// KV_PAGE (section 6: every check before a single byte lands in a page)

static bool rec__bit(const rec__req *q, uint32_t words, uint32_t page, uint32_t layer) {
    return (q->bits[(size_t)page * words + layer / 64] >> (layer % 64)) & 1u;
}

static void rec__page_fail(pd_recv *r, rec__req *q, bool violation, const char *why) {
    r->st.page_rejects++;
    if (violation) {
        r->st.tag_violations++;
        ks_log(KS_LOG_WARN, "pd_recv: security: request %llu: KV_PAGE %s (isolation violation)",
               (unsigned long long)q->req_id, why);
    } else {
        ks_log(KS_LOG_WARN, "pd_recv: request %llu: KV_PAGE %s", (unsigned long long)q->req_id,
               why);
    }
    rec__go_aborting(r, q, PD_ABORT_ERROR, PD_FINISH_ERROR, KS_ERR_PROTO,
                     "KV handoff failed verification");
}

bool pd_recv_kv_page_begin(pd_recv *r, uint64_t req_id, uint64_t link_epoch,
                           const pd_msg_kv_page *hdr, struct iovec *dst, int cap_dst,
                           int *n_dst) {
    *n_dst = 0;
    rec__req *q = rec__find(r, req_id);
    if (!q) {  // section 9: payload discarded, ABORT back so a confused prefill stops
        r->st.dropped++;
        rec__emit_abort(r, req_id, link_epoch, PD_ABORT_ERROR);
        return false;
    }
    if (!rec__live(q)) {  // ABORTING or terminal: discarded (section 7, 9)
        r->st.dropped++;
        return false;
    }
    KS_ASSERT(!q->pending);  // the transport ends one delivery before the next frame
    if (link_epoch != q->link_epoch) {
        rec__page_fail(r, q, false, "on a link other than the grant's");
        return false;
    }
    if (hdr->page_index >= q->n_grant) {
        rec__page_fail(r, q, false, "page_index outside the grant");
        return false;
    }
    const pd_msg_grant_entry *ge = &q->ent[hdr->page_index];
    if (hdr->page_id != ge->page_id || hdr->tag_seq_uid != q->seq_uid || hdr->tag_gen != ge->gen) {
        rec__page_fail(r, q, true, "page_id/tag differ from the grant entry");
        return false;
    }
    kv_page_info pi;
    if (kv_pool_page_info(r->pool, hdr->page_id, &pi) != KS_OK || pi.tag.seq_uid != q->seq_uid ||
        pi.tag.gen != ge->gen ||
        (pi.state != KV_PAGE_ALLOCATED && pi.state != KV_PAGE_READY)) {
        rec__page_fail(r, q, true, "page_id/tag differ from the pool header");
        return false;
    }
    if (hdr->n_rows != ge->n_tokens) {
        rec__page_fail(r, q, false, "n_rows differs from the grant entry");
        return false;
    }
    if (hdr->layer_count < 1 || hdr->layer_first >= (uint32_t)r->g.n_layer ||
        hdr->layer_count > (uint32_t)r->g.n_layer - hdr->layer_first) {
        rec__page_fail(r, q, false, "layer range outside the model");
        return false;
    }
    for (uint32_t l = hdr->layer_first; l < hdr->layer_first + hdr->layer_count; l++) {
        if (rec__bit(q, r->words, hdr->page_index, l)) {
            rec__page_fail(r, q, false, "repeats a layer already received");
            return false;
        }
    }
    // Destinations, only through kv_seq_span_write (I1); adjacent spans merge,
    // so a full page needs one iovec however many layers it carries.
    size_t row_bytes = kv_row_bytes(&r->g); // rows arrive in the pool's KV type
    size_t span = (size_t)hdr->n_rows * row_bytes;
    int n = 0;
    for (uint32_t l = hdr->layer_first; l < hdr->layer_first + hdr->layer_count; l++) {
        void *k, *v;
        // a state page (past the prompt's) moves whole: its layers as page planes
        const ks_err se =
            hdr->page_index < q->n_kv
                ? kv_seq_span_write(r->pool, &q->seq, hdr->page_index, (int)l, &k, &v)
                : kv_seq_state_span(r->pool, &q->seq, hdr->page_index - q->n_kv, (int)l, &k, &v);
        if (se != KS_OK) {
            rec__page_fail(r, q, true, "rejected by the pool's tag check");
            return false;
        }
        void *seg[2] = {k, v}; // 1 plane: v is NULL, the single row arrives through k
        for (int s = 0; s < kv_geom_planes(&r->g); s++) {
            if (n > 0 && (uint8_t *)dst[n - 1].iov_base + dst[n - 1].iov_len == (uint8_t *)seg[s]) {
                dst[n - 1].iov_len += span;
                continue;
            }
            if (n == cap_dst) {
                rec__page_fail(r, q, false, "needs more destination iovecs than the sink has");
                return false;
            }
            dst[n].iov_base = seg[s];
            dst[n].iov_len = span;
            n++;
        }
    }
    q->pending = true;
    q->pend_page = hdr->page_index;
    q->pend_l0 = hdr->layer_first;
    q->pend_nl = hdr->layer_count;
    r->st.pages_accepted++;
    *n_dst = n;
    return true;
}

void pd_recv_kv_page_end(pd_recv *r, uint64_t req_id, bool checksum_ok) {
    rec__req *q = rec__find(r, req_id);
    if (!q || !q->pending) {
        r->st.dropped++;
        return;
    }
    q->pending = false;
    if (!checksum_ok) r->st.checksum_fails++;
    if (!rec__live(q)) return;  // aborted mid-delivery: the bytes stay in quarantine
    if (!checksum_ok) {
        // PROTO error: the caller closes the link; F5 scrubs before any reuse.
        rec__go_aborting(r, q, PD_ABORT_ERROR, PD_FINISH_ERROR, KS_ERR_PROTO,
                         "KV handoff failed verification");
        return;
    }
    for (uint32_t l = q->pend_l0; l < q->pend_l0 + q->pend_nl; l++)
        q->bits[(size_t)q->pend_page * r->words + l / 64] |= (uint64_t)1 << (l % 64);
    q->state = PD_RECV_RECEIVING;
    q->deadline_ms = rec__now(r) + r->cfg.t_xfer_ms;
}

// ----------------------------------------------------------------------------
// DONE, REJECT, ABORT, ABORT_ACK, link close, finish

static bool rec__page_complete(const pd_recv *r, const rec__req *q, uint32_t page) {
    for (uint32_t l = 0; l < (uint32_t)r->g.n_layer; l++)
        if (!rec__bit(q, r->words, page, l)) return false;
    return true;
}

bool pd_recv_done(pd_recv *r, uint64_t req_id, uint64_t link_epoch, const pd_msg_done *d) {
    rec__req *q = rec__find(r, req_id);
    if (!q || !rec__live(q) || link_epoch != q->link_epoch) {
        r->st.dropped++;
        return false;
    }
    KS_ASSERT(!q->pending);
    // I6: every grant page complete for every layer, those pages cover exactly
    // the prompt, and prefill says it sent all of it.
    uint64_t covered = 0;
    bool all = true;
    for (uint32_t i = 0; i < q->n_grant; i++) {
        if (!rec__page_complete(r, q, i))
            all = false;
        else if (i < q->n_kv) // the state pages cover no prompt position
            covered += q->ent[i].n_tokens;
    }
#ifdef KS_BROKEN_NO_COVERAGE
    // TEST ONLY: commits without the completeness and coverage checks (violates I6)
    (void)all;
    (void)covered;
    if (false) {
#else
    if (!all || covered != q->n_prompt || d->covered != q->n_prompt) {
#endif
        ks_log(KS_LOG_WARN,
               "pd_recv: request %llu: DONE not verified (pages complete: %s, pages cover %llu, "
               "covered %u, n_prompt %u)",
               (unsigned long long)req_id, all ? "all" : "not all", (unsigned long long)covered,
               d->covered, q->n_prompt);
        r->st.verify_failed++;
        rec__free_direct(r, q);  // F2: DONE is prefill's last frame, no writer is live
        rec__emit_finish(r, q, PD_FINISH_ERROR, KS_ERR_PROTO, 0, "KV handoff failed verification");
        return false;
    }
    kv_seq_set_filled(r->pool, &q->seq, q->n_prompt);
    q->state = PD_RECV_COMMITTED;
    r->st.committed++;
    pd_recv_ev ev = {.kind = PD_RECV_EV_COMMIT, .req_id = req_id, .link_epoch = link_epoch,
                     .n_prompt = q->n_prompt, .done = d};
    rec__emit(r, &ev);
    return true;
}

/* F3: prefill's last frame for req_id on the grant's link. */
static void rec__prefill_end(pd_recv *r, uint64_t req_id, uint64_t link_epoch, uint32_t finish,
                             ks_err err, uint32_t reason, const char *msg) {
    rec__req *q = rec__find(r, req_id);
    if (!q || !rec__live(q) || link_epoch != q->link_epoch) {
        r->st.dropped++;
        return;
    }
    KS_ASSERT(!q->pending);
    rec__free_direct(r, q);
    rec__emit_finish(r, q, finish, err, reason, msg);
}

void pd_recv_reject(pd_recv *r, uint64_t req_id, uint64_t link_epoch, uint32_t reason,
                    const char *msg) {
    rec__prefill_end(r, req_id, link_epoch, PD_FINISH_ERROR, KS_ERR_INVAL, reason,
                     msg ? msg : "prefill rejected the request");
}

void pd_recv_prefill_abort(pd_recv *r, uint64_t req_id, uint64_t link_epoch) {
    rec__prefill_end(r, req_id, link_epoch, PD_FINISH_ABORT, KS_ERR_CANCELLED, 0,
                     "prefill aborted the request");
}

bool pd_recv_abort(pd_recv *r, uint64_t req_id, uint32_t reason) {
    rec__req *q = rec__find(r, req_id);
    if (!q || !rec__live(q)) {
        if (!q || q->state != PD_RECV_COMMITTED) r->st.dropped++;
        return false;
    }
    rec__go_aborting(r, q, reason, PD_FINISH_ABORT,
                     reason == PD_ABORT_TIMEOUT ? KS_ERR_TIMEOUT : KS_ERR_CANCELLED,
                     "request aborted");
    return true;
}

uint32_t pd_recv_abort_all(pd_recv *r, uint32_t reason) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->n_req; i++) {
        if (!rec__live(r->req[i])) continue;
        rec__go_aborting(r, r->req[i], reason, PD_FINISH_ABORT, KS_ERR_CANCELLED,
                         "request aborted");
        n++;
    }
    return n;
}

void pd_recv_abort_ack(pd_recv *r, uint64_t req_id, uint64_t link_epoch) {
    rec__req *q = rec__find(r, req_id);
    if (!q || q->state != PD_RECV_ABORTING || link_epoch != q->link_epoch) {
        r->st.dropped++;  // an ACK we did not ask for (section 9)
        return;
    }
    KS_ASSERT(!q->pending);  // ABORT_ACK follows the last frame on the link
    rec__free_quarantine(r, q);
}

uint32_t pd_recv_link_closed(pd_recv *r, uint64_t link_epoch) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->n_req; i++) {
        rec__req *q = r->req[i];
        if (q->link_epoch != link_epoch) continue;
        q->pending = false;  // drained: no delivery is pending any more
        if (rec__live(q)) {
            rec__free_direct(r, q);
            rec__emit_finish(r, q, PD_FINISH_ERROR, KS_ERR_PEER_CLOSED, 0,
                             "the prefill worker's data link was lost");
            n++;
        } else if (q->state == PD_RECV_ABORTING) {
            rec__free_quarantine(r, q);
            n++;
        }
    }
    return n;
}

void pd_recv_finish(pd_recv *r, uint64_t req_id) {
    rec__req *q = rec__find(r, req_id);
    if (!q || q->state != PD_RECV_COMMITTED) {
        r->st.dropped++;
        return;
    }
    rec__free_direct(r, q);  // F1
}

// ----------------------------------------------------------------------------
// Timers (section 8): nothing is freed because time passed

uint32_t pd_recv_tick(pd_recv *r) {
    uint64_t now = rec__now(r);
    uint32_t n_ev = 0;
    for (uint32_t i = 0; i < r->n_req;) {
        rec__req *q = r->req[i];
        if (rec__live(q) && now >= q->deadline_ms) {
            r->st.timeouts++;
            rec__go_aborting(r, q, PD_ABORT_TIMEOUT, PD_FINISH_ABORT, KS_ERR_TIMEOUT,
                             "KV transfer timed out");
            n_ev += 2;
        } else if (q->state == PD_RECV_ABORTING && !q->teardown_asked && now >= q->deadline_ms) {
            q->teardown_asked = true;
            r->st.teardowns++;
            pd_recv_ev ev = {.kind = PD_RECV_EV_TEARDOWN, .req_id = q->req_id,
                             .link_epoch = q->link_epoch, .n_prompt = q->n_prompt};
            rec__emit(r, &ev);
            n_ev++;
        } else if (q->state == PD_RECV_FREED && now >= q->tomb_until_ms) {
            free(q);
            r->req[i] = r->req[--r->n_req];
            continue;
        }
        i++;
    }
    return n_ev;
}

// ----------------------------------------------------------------------------
// Queries

pd_recv_state pd_recv_state_of(const pd_recv *r, uint64_t req_id) {
    const rec__req *q = rec__find(r, req_id);
    return q ? q->state : PD_RECV_NONE;
}

kv_seq *pd_recv_seq(pd_recv *r, uint64_t req_id) {
    rec__req *q = rec__find(r, req_id);
    return q && q->state == PD_RECV_COMMITTED ? &q->seq : NULL;
}

void pd_recv_get_stats(const pd_recv *r, pd_recv_stats *out) { *out = r->st; }

const char *pd_recv_state_name(pd_recv_state s) {
    switch (s) {
    case PD_RECV_NONE: return "NONE";
    case PD_RECV_GRANTED: return "GRANTED";
    case PD_RECV_RECEIVING: return "RECEIVING";
    case PD_RECV_COMMITTED: return "COMMITTED";
    case PD_RECV_ABORTING: return "ABORTING";
    case PD_RECV_FREED: return "FREED";
    }
    return "?";
}
