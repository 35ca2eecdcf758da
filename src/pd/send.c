/* send.c — the prefill-side transfer state machine of KVPD v1
 * (docs/pd-protocol.md section 6 "Prefill, per request", 7, 9;
 * include/kvseal/pd_send.h).
 *
 * Reading order: tables (requests, links), frame helpers, state changes (the
 * only code that releases local pages: snd__end), then one function per
 * incoming event, then pumping.
 *
 * The rule this file exists for (I4): a PREFILL that fails validation gets a
 * REJECT and nothing else, ever — validation runs completely before any
 * local page is computed or any KV_PAGE/DONE frame can exist for it. */
#include "kvseal/pd_send.h"

#include "kvseal/pd.h" /* PD_MAX_IOV: the transport's per-frame iovec budget */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Tables

typedef struct snd__req {
    uint64_t req_id;
    pd_send_state state;
    uint32_t worker_id;      /* decode_worker_id of the PREFILL */
    uint64_t link_epoch;     /* the grant's link (0 unknown) */
    bool transfer_started;   /* validation passed: frames may have gone on the link */
    bool abort_seen;         /* tombstone reason: ABORT processed */
    uint64_t seq_uid;        /* grant tag part 1 */
    uint32_t n_prompt, n_pages, next_page;
    uint32_t n_kv; /* the grant's KV pages; pages n_kv.. hold the recurrent state (hybrid) */
    uint32_t cached;     /* leading prompt tokens cfg.reserve attached from a cache */
    uint32_t next_layer; /* within next_page: a page goes out in layer groups */
    pd_msg_grant_entry *ent; /* n_pages grant entries */
    kv_seq seq;              /* local pages (SENDING only) */
    pd_send_first first;
    uint8_t adapter[PD_MSG_ADAPTER_BYTES]; /* the LoRA adapter compute ran under (DONE says it) */
    uint64_t tomb_until_ms;  /* terminal: forgotten after this */
} snd__req;

typedef struct snd__link {
    uint32_t worker_id;
    uint64_t epoch;
} snd__link;

struct pd_send {
    kv_pool *pool;
    pd_send_cfg cfg;
    kv_geom g;
    snd__req **req;
    uint32_t n_req, cap_req;
    snd__link *link;
    uint32_t n_link, cap_link;
    int planes;        /* kv_geom_planes(&g): rows per position per layer that travel */
    struct iovec *iov; /* 1 + planes * n_layer, for KV_PAGE frames */
    pd_send_stats st;
    bool draining;     /* pd_send_set_draining: new PREFILLs are rejected */
};

static uint64_t snd__clock_default(void *ctx) {
    (void)ctx;
    return ks_now_ns() / 1000000u;
}

static uint64_t snd__now(const pd_send *s) { return s->cfg.clock(s->cfg.clock_ctx); }

static snd__req *snd__find(const pd_send *s, uint64_t req_id) {
    for (uint32_t i = 0; i < s->n_req; i++)
        if (s->req[i]->req_id == req_id) return s->req[i];
    return NULL;
}

/* The up link's epoch to worker_id, 0 when none. */
static uint64_t snd__link_epoch(const pd_send *s, uint32_t worker_id) {
    for (uint32_t i = 0; i < s->n_link; i++)
        if (s->link[i].worker_id == worker_id) return s->link[i].epoch;
    return 0;
}

static bool snd__link_is_up(const pd_send *s, uint32_t worker_id, uint64_t epoch) {
    return epoch != 0 && snd__link_epoch(s, worker_id) == epoch;
}

/* Appends a fresh record (state NONE) or returns NULL on NOMEM. */
static snd__req *snd__add(pd_send *s, uint64_t req_id) {
    if (s->n_req == s->cap_req) {
        uint32_t cap = s->cap_req ? s->cap_req * 2 : 16;
        snd__req **nr = realloc(s->req, sizeof *nr * cap);
        if (!nr) return NULL;
        s->req = nr;
        s->cap_req = cap;
    }
    snd__req *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->req_id = req_id;
    kv_seq_init(s->pool, &q->seq);
    s->req[s->n_req++] = q;
    return q;
}

// ----------------------------------------------------------------------------
// Frames

static void snd__emit(pd_send *s, uint32_t worker_id, uint64_t epoch, uint16_t type,
                      uint64_t req_id, const struct iovec *iov, int n_iov) {
    s->cfg.emit(s->cfg.emit_ctx, worker_id, epoch, type, req_id, iov, n_iov);
}

static void snd__emit_reject(pd_send *s, uint32_t worker_id, uint64_t epoch, uint64_t req_id,
                             uint32_t reason, const char *msg) {
    uint8_t buf[12 + PD_MSG_MAX_TEXT];
    size_t ml = strlen(msg);
    if (ml > PD_MSG_MAX_TEXT) ml = PD_MSG_MAX_TEXT;
    if (!admit_reason_on_wire(reason)) reason = ADMIT_INTERNAL;  // a callback's HTTP-only reason
    pd_msg_reject m = {.reason = reason, .msg = msg, .msg_len = (uint32_t)ml};
    uint32_t len = 0;
    ks_errbuf eb;
    ks_err e = pd_msg_reject_encode(&m, buf, sizeof buf, &len, &eb);
    KS_ASSERT(e == KS_OK);
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    snd__emit(s, worker_id, epoch, PD_MSG_REJECT, req_id, &iov, 1);
}

static void snd__emit_abort(pd_send *s, uint32_t worker_id, uint64_t epoch, uint64_t req_id,
                            uint32_t reason) {
    uint8_t buf[4];
    uint32_t len = 0;
    pd_msg_abort m = {.reason = reason};
    ks_err e = pd_msg_abort_encode(&m, buf, sizeof buf, &len, NULL);
    KS_ASSERT(e == KS_OK);
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    snd__emit(s, worker_id, epoch, PD_MSG_ABORT, req_id, &iov, 1);
}

static void snd__emit_ack(pd_send *s, uint32_t worker_id, uint64_t epoch, uint64_t req_id) {
    s->st.acks_sent++;
    snd__emit(s, worker_id, epoch, PD_MSG_ABORT_ACK, req_id, NULL, 0);
}

// ----------------------------------------------------------------------------
// State changes: the only code that releases local pages

/* Moves q to a terminal state, releasing (scrubbing) its local pages. */
static void snd__end(pd_send *s, snd__req *q, pd_send_state st) {
    if (q->state == PD_SEND_SENDING) {
        KS_ASSERT(s->st.active > 0);
        s->st.active--;
    }
    kv_seq_release(s->pool, &q->seq);
    free(q->ent);
    q->ent = NULL;
    q->state = st;
    q->tomb_until_ms = snd__now(s) + s->cfg.tombstone_ms;
}

// ----------------------------------------------------------------------------
// Lifetime

ks_err pd_send_create(kv_pool *pool, const pd_send_cfg *cfg, pd_send **out, ks_errbuf *eb) {
    *out = NULL;
    if (!pool || !cfg || !cfg->emit || !cfg->admit || !cfg->compute)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "pd_send: pool, cfg.emit, cfg.admit and cfg.compute are required");
    pd_send *s = calloc(1, sizeof *s);
    if (!s) return ks_seterr(eb, KS_ERR_NOMEM, "pd_send: out of memory");
    s->pool = pool;
    s->cfg = *cfg;
    if (!s->cfg.tombstone_ms) s->cfg.tombstone_ms = 60000;
    if (!s->cfg.clock) s->cfg.clock = snd__clock_default;
    s->g = *kv_pool_geom(pool);
    s->planes = kv_geom_planes(&s->g);
    s->iov = calloc(1 + (size_t)s->planes * (size_t)s->g.n_layer, sizeof *s->iov);
    if (!s->iov) {
        free(s);
        return ks_seterr(eb, KS_ERR_NOMEM, "pd_send: out of memory");
    }
    *out = s;
    return KS_OK;
}

void pd_send_destroy(pd_send *s) {
    if (!s) return;
    for (uint32_t i = 0; i < s->n_req; i++) {
        kv_seq_release(s->pool, &s->req[i]->seq);
        free(s->req[i]->ent);
        free(s->req[i]);
    }
    free(s->req);
    free(s->link);
    free(s->iov);
    free(s);
}

// ----------------------------------------------------------------------------
// Links

uint32_t pd_send_link_closed(pd_send *s, uint32_t decode_worker_id, uint64_t link_epoch) {
    bool found = false;
    for (uint32_t i = 0; i < s->n_link; i++) {
        if (s->link[i].worker_id == decode_worker_id && s->link[i].epoch == link_epoch) {
            s->link[i] = s->link[--s->n_link];
            found = true;
            break;
        }
    }
    if (!found) return 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_req; i++) {
        snd__req *q = s->req[i];
        if (q->state == PD_SEND_SENDING && q->worker_id == decode_worker_id &&
            q->link_epoch == link_epoch) {
            snd__end(s, q, PD_SEND_ABORTED);  // no frame: the link is gone (F5 on decode)
            s->st.link_drops++;
            n++;
        }
    }
    return n;
}

ks_err pd_send_link_up(pd_send *s, uint32_t decode_worker_id, uint64_t link_epoch,
                       ks_errbuf *eb) {
    if (link_epoch == 0) return ks_seterr(eb, KS_ERR_INVAL, "pd_send: link epoch 0");
    uint64_t old = snd__link_epoch(s, decode_worker_id);
    if (old == link_epoch) return KS_OK;  // repeated notice: the link's transfers go on
    if (old) (void)pd_send_link_closed(s, decode_worker_id, old);
    if (s->n_link == s->cap_link) {
        uint32_t cap = s->cap_link ? s->cap_link * 2 : 8;
        snd__link *nl = realloc(s->link, sizeof *nl * cap);
        if (!nl) return ks_seterr(eb, KS_ERR_NOMEM, "pd_send: out of memory");
        s->link = nl;
        s->cap_link = cap;
    }
    s->link[s->n_link++] = (snd__link){.worker_id = decode_worker_id, .epoch = link_epoch};
    return KS_OK;
}

// ----------------------------------------------------------------------------
// PREFILL: VALIDATING (everything before any compute, I4)

/* A validation failure: REJECT to the router and, if the grant's link is up,
 * to decode; the request is REJECTED forever. */
static ks_err snd__reject(pd_send *s, snd__req *q, uint32_t reason, const char *msg,
                          pd_send_state *state_out) {
    snd__emit_reject(s, 0, PD_SEND_ROUTER, q->req_id, reason, msg);
    if (snd__link_is_up(s, q->worker_id, q->link_epoch))
        snd__emit_reject(s, q->worker_id, q->link_epoch, q->req_id, reason, msg);
    s->st.rejected++;
    snd__end(s, q, PD_SEND_REJECTED);
    if (state_out) *state_out = PD_SEND_REJECTED;
    return KS_OK;
}

static uint64_t snd__load_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

ks_err pd_send_prefill(pd_send *s, uint64_t req_id, const uint8_t *payload, uint32_t len,
                       pd_send_state *state_out, ks_errbuf *eb) {
    if (state_out) *state_out = PD_SEND_NONE;
    pd_msg_prefill p;
    ks_err e = pd_msg_prefill_decode(payload, len, &p, eb);
    if (e != KS_OK) return e;

    // Known or tombstoned: never served again, and decode is not told (a
    // REJECT there would end a grant another PREFILL may be writing).
    snd__req *old = snd__find(s, req_id);
    if (old) {
        s->st.rejected++;
        if (old->abort_seen)
            snd__emit_reject(s, 0, PD_SEND_ROUTER, req_id, ADMIT_ABORTED, "request was aborted");
        else
            snd__emit_reject(s, 0, PD_SEND_ROUTER, req_id, ADMIT_INTERNAL, "duplicate request id");
        if (state_out) *state_out = old->state;
        return KS_OK;
    }

    snd__req *q = snd__add(s, req_id);
    if (!q) return ks_seterr(eb, KS_ERR_NOMEM, "pd_send: out of memory");
    q->worker_id = p.decode_worker_id;
    q->n_prompt = p.n_prompt;
    pd_msg_grant g;
    ks_errbuf geb;
    bool grant_ok = pd_msg_prefill_grant(&p, &g, &geb) == KS_OK;
    // The link the grant names, for the REJECT to decode (even when the
    // grant's content is inconsistent, its epoch field is where the layout put it).
    if (grant_ok)
        q->link_epoch = g.link_epoch;
    else if (p.grant_len >= 16)
        q->link_epoch = snd__load_u64(p.grant + 8);

    uint32_t pt = (uint32_t)s->g.page_tokens;
    if (s->draining)  // graceful shutdown: the router places the request elsewhere
        return snd__reject(s, q, ADMIT_DRAINING, "the prefill worker is shutting down", state_out);
    int32_t *toks = malloc(sizeof *toks * (p.n_prompt ? p.n_prompt : 1));
    if (!toks) return snd__reject(s, q, ADMIT_BUSY, "prefill worker out of memory", state_out);
    for (uint32_t i = 0; i < p.n_prompt; i++)
        toks[i] = pd_msg_prefill_token(&p, i);
    // the request contract, exactly as the router and `kvseal serve` admit (I4)
    ks_errbuf aeb;
    ks_errbuf_clear(&aeb);
    if (s->cfg.admit(s->cfg.admit_ctx, toks, p.n_prompt, &p.s, &aeb) != KS_OK) {
        free(toks);
        return snd__reject(s, q, aeb.reason ? aeb.reason : ADMIT_INVALID, aeb.msg, state_out);
    }
    uint32_t need = (p.n_prompt + pt - 1) / pt;
    const char *bad = !grant_ok ? "inconsistent grant"
                      : g.page_tokens != pt || g.n_pages != need + (uint32_t)s->g.state_pages ||
                              g.n_state != (uint32_t)s->g.state_pages || g.seq_uid == 0
                          ? "grant does not match the KV page geometry"
                      : memcmp(g.model_id, s->cfg.model_id, sizeof g.model_id)
                          ? "grant is for another model: no page crosses models"
                          : NULL;
    if (bad) {
        if (!grant_ok)
            ks_log(KS_LOG_WARN, "pd_send: request %llu: %s", (unsigned long long)req_id, geb.msg);
        free(toks);
        return snd__reject(s, q, ADMIT_INTERNAL, bad, state_out);
    }
    if (!snd__link_is_up(s, p.decode_worker_id, g.link_epoch)) {
        free(toks);
        return snd__reject(s, q, ADMIT_STALE_GRANT, "grant is bound to a data link that is gone",
                           state_out);
    }

    q->ent = calloc(g.n_pages, sizeof *q->ent);
    if (!q->ent) {
        free(toks);
        return snd__reject(s, q, ADMIT_BUSY, "prefill worker out of memory", state_out);
    }
    for (uint32_t i = 0; i < g.n_pages; i++)
        q->ent[i] = pd_msg_grant_entry_at(&g, i);
    q->seq_uid = g.seq_uid;
    q->n_pages = g.n_pages;
    q->n_kv = need;
    ks_errbuf keb;
    ks_errbuf_clear(&keb);
    ks_err re = s->cfg.reserve ? s->cfg.reserve(s->cfg.reserve_ctx, s->pool, p.domain_hash, toks,
                                                p.n_prompt, &q->seq, &keb)
                               : kv_seq_reserve(s->pool, &q->seq, p.n_prompt, &keb);
    if (re != KS_OK) {
        free(toks);
        return snd__reject(s, q, keb.reason ? keb.reason : ADMIT_BUSY,
                           keb.reason ? keb.msg : "prefill worker's KV cache is full", state_out);
    }
    q->cached = q->seq.n_tokens;

    // Validated: from here on the request can only end DONE_SENT or ABORTED.
    q->state = PD_SEND_SENDING;
    q->transfer_started = true;
    s->st.active++;
    s->st.started++;
    ks_errbuf ceb;
    ks_errbuf_clear(&ceb);
    memcpy(q->adapter, p.s.adapter, sizeof q->adapter); // compute runs under it (or refuses)
    e = s->cfg.compute(s->cfg.compute_ctx, s->pool, &q->seq, toks, p.n_prompt, &p.s, &q->first,
                       &ceb);
    if (e == KS_OK) {
        kv_seq_set_filled(s->pool, &q->seq, p.n_prompt);
        if (s->cfg.computed)
            s->cfg.computed(s->cfg.reserve_ctx, s->pool, p.domain_hash, toks, p.n_prompt, &q->seq);
        s->st.cached_tokens += q->cached;
    }
    free(toks);
    if (e != KS_OK) {
        ks_log(KS_LOG_WARN, "pd_send: request %llu: compute failed: %s", (unsigned long long)req_id,
               ceb.msg);
        s->st.compute_errors++;
        snd__emit_abort(s, q->worker_id, q->link_epoch, req_id, PD_ABORT_ERROR);
        snd__end(s, q, PD_SEND_ABORTED);
        if (state_out) *state_out = PD_SEND_ABORTED;
        return KS_OK;
    }
    if (q->first.n_top > (uint32_t)p.s.n_probs) q->first.n_top = (uint32_t)p.s.n_probs;
    if (q->first.n_top > PD_MSG_MAX_TOP) q->first.n_top = PD_MSG_MAX_TOP;
    if (state_out) *state_out = PD_SEND_SENDING;
    return KS_OK;
}

// ----------------------------------------------------------------------------
// ABORT (section 6: any state, unknown req_id included)

void pd_send_abort(pd_send *s, uint64_t req_id, uint32_t decode_worker_id, uint64_t link_epoch) {
    s->st.aborts++;
    snd__req *q = snd__find(s, req_id);
    if (!q) {  // ABORT overtook the PREFILL: tombstone, so the PREFILL is dropped
        q = snd__add(s, req_id);
        if (q) {
            q->worker_id = decode_worker_id;
            q->link_epoch = link_epoch;
            snd__end(s, q, PD_SEND_ABORTED);
            q->abort_seen = true;
        } else {
            ks_log(KS_LOG_ERROR, "pd_send: out of memory recording the tombstone of %llu",
                   (unsigned long long)req_id);
        }
    } else {
        if (q->state == PD_SEND_SENDING) snd__end(s, q, PD_SEND_ABORTED);
        q->abort_seen = true;
    }
    if (link_epoch != PD_SEND_ROUTER) {
        if (snd__link_is_up(s, decode_worker_id, link_epoch))
            snd__emit_ack(s, decode_worker_id, link_epoch, req_id);
        return;
    }
    if (q && q->transfer_started && snd__link_is_up(s, q->worker_id, q->link_epoch))
        snd__emit_ack(s, q->worker_id, q->link_epoch, req_id);
}

// ----------------------------------------------------------------------------
// SENDING: one KV_PAGE per grant page, then DONE

/* Most layers one KV_PAGE frame carries: a partial page needs an iovec per
 * plane per layer (K and V, or the single row) plus the header within
 * PD_MAX_IOV (a 64-layer model's 2-plane pages go out as two frames each). */
static uint32_t snd__max_layers(const pd_send *s) {
    return (uint32_t)((PD_MAX_IOV - 1) / s->planes);
}

/* Emits the next KV_PAGE of q (page next_page, layers from next_layer);
 * false when the local read failed. */
static bool snd__send_page(pd_send *s, snd__req *q) {
    uint32_t i = q->next_page;
    const pd_msg_grant_entry *ge = &q->ent[i];
    uint32_t l0 = q->next_layer, nl = (uint32_t)s->g.n_layer - l0;
    if (nl > snd__max_layers(s)) nl = snd__max_layers(s);
    pd_msg_kv_page h = {.page_index = i, .page_id = ge->page_id, .tag_seq_uid = q->seq_uid,
                        .tag_gen = ge->gen, .n_rows = ge->n_tokens, .layer_first = l0,
                        .layer_count = nl};
    uint8_t hdr[PD_MSG_KV_PAGE_HDR];
    uint32_t hl = 0;
    ks_errbuf eb;
    if (pd_msg_kv_page_encode(&h, &s->g, hdr, sizeof hdr, &hl, &eb) != KS_OK) {
        ks_log(KS_LOG_ERROR, "pd_send: request %llu: %s", (unsigned long long)q->req_id, eb.msg);
        return false;
    }
    s->iov[0] = (struct iovec){.iov_base = hdr, .iov_len = hl};
    int n = 1;
    size_t span = (size_t)ge->n_tokens * kv_row_bytes(&s->g); // rows travel in the pool's KV type
    for (int l = (int)l0; l < (int)(l0 + nl); l++) {
        const void *k, *v;
        if (i >= q->n_kv) { // a state page moves whole, read through kv's check as any page
            void *sk, *sv;
            if (kv_seq_state_span(s->pool, &q->seq, i - q->n_kv, l, &sk, &sv) != KS_OK)
                return false;
            k = sk;
            v = sv ? sv : sk;
        } else if (kv_seq_span_read(s->pool, &q->seq, i, l, ge->n_tokens, &k, &v) != KS_OK) {
            return false;
        }
        const void *seg[2] = {k, v}; // 1 plane: v == k, and only k travels
        for (int j = 0; j < s->planes; j++) {
            struct iovec *last = &s->iov[n - 1];
            if (n > 1 && (const uint8_t *)last->iov_base + last->iov_len == (const uint8_t *)seg[j]) {
                last->iov_len += span;
                continue;
            }
            s->iov[n].iov_base = (void *)(uintptr_t)seg[j];
            s->iov[n].iov_len = span;
            n++;
        }
    }
    snd__emit(s, q->worker_id, q->link_epoch, PD_MSG_KV_PAGE, q->req_id, s->iov, n);
    s->st.pages_sent++;
    q->next_layer = l0 + nl;
    if (q->next_layer == (uint32_t)s->g.n_layer) {
        q->next_layer = 0;
        q->next_page++;
    }
    return true;
}

static void snd__send_done(pd_send *s, snd__req *q) {
    pd_msg_done d = {.covered = q->n_prompt, .first_token = q->first.first_token,
                     .logprob = q->first.logprob, .n_top = q->first.n_top,
                     .rng_state = q->first.rng_state, .cached = q->cached};
    memcpy(d.adapter, q->adapter, sizeof d.adapter); // what the KV was computed under
    uint8_t buf[32 + 8 * PD_MSG_MAX_TOP + PD_MSG_ADAPTER_BYTES];
    uint32_t len = 0;
    ks_errbuf eb;
    ks_err e = pd_msg_done_encode(&d, q->first.top, buf, sizeof buf, &len, &eb);
    KS_ASSERT(e == KS_OK);
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    snd__emit(s, q->worker_id, q->link_epoch, PD_MSG_DONE, q->req_id, &iov, 1);
    s->st.done_sent++;
    snd__end(s, q, PD_SEND_DONE_SENT);
}

uint32_t pd_send_pump(pd_send *s, uint32_t budget_pages) {
    uint32_t sent = 0;
    for (uint32_t r = 0; r < s->n_req && sent < budget_pages; r++) {
        snd__req *q = s->req[r];
        while (q->state == PD_SEND_SENDING && sent < budget_pages && q->next_page < q->n_pages) {
            if (!snd__send_page(s, q)) {
                s->st.compute_errors++;
                snd__emit_abort(s, q->worker_id, q->link_epoch, q->req_id, PD_ABORT_ERROR);
                snd__end(s, q, PD_SEND_ABORTED);
                break;
            }
            sent++;
        }
        if (q->state == PD_SEND_SENDING && q->next_page == q->n_pages) snd__send_done(s, q);
    }
    return sent;
}

// ----------------------------------------------------------------------------
// Timers, queries

void pd_send_set_draining(pd_send *s, bool draining) { s->draining = draining; }

uint32_t pd_send_tick(pd_send *s) {
    uint64_t now = snd__now(s);
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->n_req;) {
        snd__req *q = s->req[i];
        if (q->state != PD_SEND_SENDING && now >= q->tomb_until_ms) {
            kv_seq_release(s->pool, &q->seq);
            free(q->ent);
            free(q);
            // keep the order: pd_send_pump serves the oldest transfer first
            memmove(&s->req[i], &s->req[i + 1], sizeof *s->req * (s->n_req - i - 1));
            s->n_req--;
            n++;
        } else {
            i++;
        }
    }
    return n;
}

pd_send_state pd_send_state_of(const pd_send *s, uint64_t req_id) {
    const snd__req *q = snd__find(s, req_id);
    return q ? q->state : PD_SEND_NONE;
}

void pd_send_get_stats(const pd_send *s, pd_send_stats *out) { *out = s->st; }

const char *pd_send_state_name(pd_send_state st) {
    switch (st) {
    case PD_SEND_NONE: return "NONE";
    case PD_SEND_SENDING: return "SENDING";
    case PD_SEND_DONE_SENT: return "DONE_SENT";
    case PD_SEND_REJECTED: return "REJECTED";
    case PD_SEND_ABORTED: return "ABORTED";
    }
    return "UNKNOWN";
}
