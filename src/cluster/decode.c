/* decode.c — the decode worker (`kvseal decode`, cluster.h): page grants for
 * ADMIT, KV received straight into the engine's pool over data links from
 * prefill workers, the verified commit (I6) and generation, streaming
 * TOKEN/FINISH to the router (docs/pd-protocol.md sections 5-9).
 *
 * Everything network runs on the engine's scheduler thread through
 * engine_opts.poll: the pd_loop, the data-link listener and links, the
 * control connections (one cl_ctrl per router: a worker serves several
 * routers over one pool) and the transfer receiver (pd_recv) are
 * created on the first poll and destroyed in poll_end, so the pool, the
 * receiver and every running sequence have one owner. The calling thread
 * only waits for the start, then for *stop. */
#include "cluster_int.h"
#include "ucx_plane.h"

#include "kvseal/grammar.h"

#include "kvseal/admit.h"

#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvseal/pd_recv.h"

// ----------------------------------------------------------------------------
// State

/* One data link from a prefill worker (accepted conn). */
typedef struct dec__link {
    struct dec__worker *w;
    pd_conn *c;
    uint64_t epoch;       /* 0 until LINK arrived */
    uint32_t prefill_id;  /* from LINK: in router router_id's numbering */
    uint64_t router_id;   /* from LINK: whose worker id prefill_id is */
    bool retired;         /* the router retired its prefill worker: closing */
    bool sink_pending;    /* a KV_PAGE payload is being received into a page */
    uint64_t sink_req;
    struct dec__link *next;
} dec__link;

/* One granted request (ADMIT we answered with GRANT), until its FINISH. */
typedef struct dec__req {
    uint64_t req_id;
    int rt;         /* the router (dec__worker.rts index) that sent its ADMIT */
    uint32_t n_prompt;
    pd_msg_sampling s;
    engine_req *er; /* adopted: generation runs */
    uint64_t t_first_page_ns; /* first KV_PAGE accepted (for the handoff log) */
    char domain[24];          /* "domain:" + 16 hex digits of ADMIT's domain_hash: who the
                                 request belongs to in logs and security events, without a
                                 tenant name ever crossing the wire */
    uint64_t kv_bytes;        /* KV_PAGE payload bytes accepted */
    uint32_t n_cached;        /* DONE's cached: prompt tokens prefill took from its cache */
    grammar *g;               /* ADMIT's grammar, compiled here (NULL: none); owned */
    sample_bias *bias;        /* (n_bias) ADMIT's logit_bias; owned */
    int n_bias;
} dec__req;

/* A verified DONE waiting for engine_adopt (EV_COMMIT is queued: emit runs
 * inside pd_recv calls, and a failed adopt must call pd_recv_finish). */
typedef struct dec__commit {
    uint64_t req_id;
    int32_t first_token;
    float logprob;
    uint32_t n_top;
    pd_msg_top top[PD_MSG_MAX_TOP];
    uint64_t rng_state;
} dec__commit;

/* One router: its control connection (cl_ctrl's ud). */
typedef struct dec__rt {
    struct dec__worker *w;
    int idx;
    cl_ctrl *ctrl;
} dec__rt;

enum { DEC__STARTING = 0, DEC__RUNNING = 1, DEC__FAILED = 2 };
#define DEC__MAX_COMMITS 4

typedef struct dec__worker {
    const cluster_worker_opts *o;
    engine *e;
    kv_pool *pool;
    kv_geom g;
    int32_t max_running;
    _Atomic int phase;     /* DEC__*; written by the scheduler thread */
    atomic_bool draining;  /* set by the main thread on stop: ADMIT gets DENY DRAINING */
    atomic_uint live;      /* requests held (granted, transferring, generating, quarantined):
                              the scheduler thread's count, for the main thread's drain */
    atomic_bool released;  /* draining and the router let go (closed the control conn) */
    bool quiesced;         /* scheduler thread: cl_ctrl_quiesce done */
    ks_errbuf start_eb;    /* the start failure (read after phase = FAILED) */
    pd_loop *l;
    pd_listener *ls;
    dec__rt rts[CLUSTER_MAX_ROUTERS];
    int n_rt;
    cl_health *health;     /* --health-port's endpoint, or NULL; set before the engine starts */
    pd_recv *rcv;
    cl_ucx *ucx;           /* --data-plane ucx, else NULL */
    uint64_t ucx_active_ms; /* when the UCX worker last had events */
    uint32_t tm_data[PD_MSG_N_TYPES], tm_ctrl[PD_MSG_N_TYPES];
    char host[PD_MSG_MAX_HOST + 1]; /* REGISTER host (borrowed by ctrl) */
    uint8_t model_id[PD_MSG_HASH_BYTES]; /* cluster_model_id of the model served */
    dec__link *links;
    dec__req *req;
    uint32_t n_req, cap_req;
    /* only pd_recv_done emits COMMIT (one per call) and every pd_recv call
     * site flushes right after it: one slot would do */
    dec__commit commits[DEC__MAX_COMMITS];
    uint32_t n_commits;
    uint8_t *adapters;     /* (o->n_lora, 32) the digests of the --lora adapters (REGISTER) */
} dec__worker;

// ----------------------------------------------------------------------------
// Link epochs: 64 random bits from the CSPRNG (libsodium), never 0 and never
// one of a live link, so nobody can predict the next one from the last

static uint64_t dec__new_epoch(const struct dec__worker *w) {
    for (;;) {
        uint64_t ep = 0;
        randombytes_buf(&ep, sizeof ep);
        bool used = ep == 0;
        for (const dec__link *k = w->links; k && !used; k = k->next) used = k->epoch == ep;
        if (!used) return ep;
    }
}

// ----------------------------------------------------------------------------
// Requests

static dec__req *dec__find(dec__worker *w, uint64_t req_id) {
    for (uint32_t i = 0; i < w->n_req; i++)
        if (w->req[i].req_id == req_id) return &w->req[i];
    return NULL;
}

/* Makes room for one more request entry; false when out of memory. */
static bool dec__reserve(dec__worker *w) {
    if (w->n_req < w->cap_req) return true;
    uint32_t cap = w->cap_req ? 2 * w->cap_req : 16;
    dec__req *p = realloc(w->req, cap * sizeof *p);
    if (!p) return false;
    w->req = p;
    w->cap_req = cap;
    return true;
}

/* Adds an entry; dec__reserve must have returned true since the last add. */
/* Adds a request; takes ownership of g and bias. */
static void dec__add(dec__worker *w, int rt, uint64_t req_id, uint32_t n_prompt, const pd_msg_sampling *s,
                     const uint8_t domain_hash[PD_MSG_HASH_BYTES], grammar *g, sample_bias *bias) {
    KS_ASSERT(w->n_req < w->cap_req);
    dec__req *q = &w->req[w->n_req++];
    *q = (dec__req){.req_id = req_id,
                    .rt = rt,
                    .n_prompt = n_prompt,
                    .s = *s,
                    .g = g,
                    .bias = bias,
                    .n_bias = (int)s->n_bias};
    q->s.grammar = NULL; // the payload goes away: g and bias are the owned copies
    q->s.bias = NULL;
    int off = snprintf(q->domain, sizeof q->domain, "domain:");
    for (int i = 0; i < 8; i++) off += snprintf(q->domain + off, sizeof q->domain - (size_t)off, "%02x", domain_hash[i]);
}

/* Frees what a request owns (not its engine request). */
static void dec__req_clear(dec__req *q) {
    grammar_unref(q->g);
    free(q->bias);
    q->g = NULL;
    q->bias = NULL;
}

static void dec__remove(dec__worker *w, uint64_t req_id) {
    for (uint32_t i = 0; i < w->n_req; i++)
        if (w->req[i].req_id == req_id) {
            dec__req_clear(&w->req[i]);
            w->req[i] = w->req[--w->n_req];
            return;
        }
}

// ----------------------------------------------------------------------------
// Frames to the router and to prefill

/* Sends a frame to router rt (an index of w->rts; -1: none, dropped). */
static void dec__ctrl_send(dec__worker *w, int rt, uint16_t type, uint64_t req_id, const void *p,
                           uint32_t len) {
    if (rt < 0 || rt >= w->n_rt) return;
    cl_ctrl *c = w->rts[rt].ctrl;
    if (!c || !cl_ctrl_registered(c)) return;  // lost: the router fails it (F6)
    struct iovec iov = {.iov_base = (void *)p, .iov_len = len};
    ks_errbuf eb;
    ks_err e = cl_ctrl_send(c, type, req_id, &iov, len ? 1 : 0, &eb);
    if (e != KS_OK && e != KS_ERR_PEER_CLOSED)
        ks_log(KS_LOG_WARN, "decode: %s for request %llu not sent: %s", pd_msg_type_name(type),
               (unsigned long long)req_id, eb.msg);
}

static void dec__send_finish(dec__worker *w, uint64_t req_id, uint32_t finish, uint32_t n_prompt,
                             uint32_t n_gen, ks_err err, uint32_t reason, const char *msg) {
    if (finish == PD_FINISH_STOP || finish == PD_FINISH_LENGTH) err = KS_OK, reason = 0;
    if (reason && !admit_reason_on_wire(reason)) reason = ADMIT_INTERNAL; // an HTTP-front reason: not ours
    if ((finish == PD_FINISH_ABORT || finish == PD_FINISH_ERROR) && err == KS_OK)
        err = finish == PD_FINISH_ABORT ? KS_ERR_CANCELLED : KS_ERR_INTERNAL;
    size_t ml = msg ? strlen(msg) : 0;
    if (ml > PD_MSG_MAX_TEXT) ml = PD_MSG_MAX_TEXT;
    const dec__req *q = dec__find(w, req_id);
    pd_msg_finish m = {.finish = finish,
                       .n_prompt = n_prompt,
                       .n_gen = n_gen,
                       .err = (uint32_t)err,
                       .msg = msg ? msg : "",
                       .msg_len = (uint32_t)ml,
                       .n_cached = q && q->n_cached <= n_prompt ? q->n_cached : 0,
                       .reason = reason};
    uint8_t buf[28 + PD_MSG_MAX_TEXT];
    uint32_t len = 0;
    ks_errbuf eb;
    if (pd_msg_finish_encode(&m, buf, sizeof buf, &len, &eb) != KS_OK) {
        ks_log(KS_LOG_ERROR, "decode: FINISH for request %llu: %s", (unsigned long long)req_id,
               eb.msg);
        return;
    }
    dec__ctrl_send(w, q ? q->rt : -1, PD_MSG_FINISH, req_id, buf, len);
}

static dec__link *dec__link_by_epoch(dec__worker *w, uint64_t epoch) {
    for (dec__link *k = w->links; k; k = k->next)
        if (k->epoch == epoch && epoch != 0) return k;
    return NULL;
}

static void dec__link_send(dec__link *k, uint16_t type, uint64_t req_id, const void *p,
                           uint32_t len) {
    struct iovec iov = {.iov_base = (void *)p, .iov_len = len};
    ks_errbuf eb;
    ks_err e = pd_conn_send(k->c, type, req_id, &iov, len ? 1 : 0, &eb);
    if (e == KS_ERR_AGAIN) {
        // the link is backed up with our own small frames only if prefill
        // stopped reading: it is broken; tearing it down is F5
        ks_log(KS_LOG_WARN, "decode: link %llu output full; closing it",
               (unsigned long long)k->epoch);
        pd_conn_close(k->c);
    }
}

/* Best-effort ERROR, then close: a PROTO error ends only this peer's conn. */
static void dec__proto_close(pd_conn *c, const char *why) {
    ks_log(KS_LOG_WARN, "decode: closing %s: %s", pd_conn_peer_addr(c), why);
    cl_error_close(c, KS_ERR_PROTO, why);
}

// ----------------------------------------------------------------------------
// pd_recv events

static void dec__emit(void *ctx, const pd_recv_ev *ev) {
    dec__worker *w = ctx;
    switch (ev->kind) {
    case PD_RECV_EV_ABORT: {
        dec__link *k = dec__link_by_epoch(w, ev->link_epoch);
        if (!k) break;  // the link is gone: F5 already covers it
        uint8_t buf[4];
        uint32_t len = 0;
        pd_msg_abort m = {.reason = ev->abort_reason};
        if (pd_msg_abort_encode(&m, buf, sizeof buf, &len, NULL) == KS_OK)
            dec__link_send(k, PD_MSG_ABORT, ev->req_id, buf, len);
        break;
    }
    case PD_RECV_EV_FINISH:
        if (w->ucx) cl_ucxd_end(w->ucx, ev->req_id); // the transfer is over: revoke its key
        dec__send_finish(w, ev->req_id, ev->finish, ev->n_prompt, 0, ev->err, ev->reason, ev->msg);
        dec__remove(w, ev->req_id);
        break;
    case PD_RECV_EV_COMMIT: {
        KS_ASSERT(w->n_commits < DEC__MAX_COMMITS);  // a pd_recv call site without dec__flush
        dec__commit *c = &w->commits[w->n_commits++];
        const pd_msg_done *d = ev->done;
        c->req_id = ev->req_id;
        c->first_token = d->first_token;
        c->logprob = d->logprob;
        c->n_top = d->n_top > PD_MSG_MAX_TOP ? PD_MSG_MAX_TOP : d->n_top;
        for (uint32_t i = 0; i < c->n_top; i++) c->top[i] = pd_msg_top_at(d->top, i);
        c->rng_state = d->rng_state;
        dec__req *q = dec__find(w, ev->req_id);
        if (q) q->n_cached = d->cached;
        if (q && q->t_first_page_ns)  // the figure bench/cluster.sh reports
            ks_log(KS_LOG_INFO, "decode: request %llu: KV handoff: %llu bytes in %.3f ms",
                   (unsigned long long)ev->req_id, (unsigned long long)q->kv_bytes,
                   (double)(ks_now_ns() - q->t_first_page_ns) / 1e6);
        break;
    }
    case PD_RECV_EV_TEARDOWN: {
        dec__link *k = dec__link_by_epoch(w, ev->link_epoch);
        if (k) {
            ks_log(KS_LOG_INFO, "decode: link %llu torn down (no ABORT_ACK in time)",
                   (unsigned long long)k->epoch);
            pd_conn_close(k->c);  // on_close: pd_recv_link_closed (F5)
        }
        break;
    }
    }
}

/* Runs the queued commits: engine_adopt each (outside any pd_recv call). */
static void dec__flush(dec__worker *w) {
    for (uint32_t i = 0; i < w->n_commits; i++) {
        const dec__commit *c = &w->commits[i];
        dec__req *q = dec__find(w, c->req_id);
        kv_seq *seq = pd_recv_seq(w->rcv, c->req_id);
        ks_errbuf eb;
        ks_errbuf_clear(&eb);
        ks_err e = KS_ERR_INTERNAL;
        if (q && seq) {
            engine_adopt_args a;
            memset(&a, 0, sizeof a);
            a.tenant = q->domain;
            a.n_prompt = (int32_t)q->n_prompt;
            a.max_tokens = (int32_t)q->s.max_tokens;
            cl_sampling_from_msg(&q->s, &a.sp, &a.ignore_eos);
            a.seq = seq;
            a.first.token = c->first_token;
            a.first.logprob = c->logprob;
            uint32_t nt = c->n_top < (uint32_t)q->s.n_probs ? c->n_top : (uint32_t)q->s.n_probs;
            if (nt > SAMPLE_MAX_TOP) nt = SAMPLE_MAX_TOP;
            a.first.n_top = (int)nt;
            for (uint32_t j = 0; j < nt; j++) {
                a.first.top_ids[j] = c->top[j].id;
                a.first.top_logprobs[j] = c->top[j].logprob;
            }
            a.rng_draws = c->rng_state;
            // the adapter ADMIT named: registered under its digest's hex (dec__adapters)
            static const uint8_t none[PD_MSG_ADAPTER_BYTES];
            char ahex[2 * PD_MSG_ADAPTER_BYTES + 1];
            if (memcmp(q->s.adapter, none, sizeof none)) {
                cl_hex(q->s.adapter, sizeof q->s.adapter, ahex);
                a.adapter = ahex;
            }
            a.grammar = q->g;
            a.bias = q->bias;
            a.n_bias = q->n_bias;
            e = engine_adopt(w->e, &a, &q->er, &eb);
            if (e != KS_OK) q->er = NULL;
        } else {
            ks_seterr(&eb, KS_ERR_INTERNAL, "committed request not found");
        }
        if (e != KS_OK) {
            ks_log(KS_LOG_WARN, "decode: request %llu: cannot start generation: %s",
                   (unsigned long long)c->req_id, eb.msg);
            uint32_t np = q ? q->n_prompt : 0;
            pd_recv_finish(w->rcv, c->req_id);  // F1: nothing generates from these pages
            char msg[PD_MSG_MAX_TEXT];
            snprintf(msg, sizeof msg, "decode worker could not start generation: %.400s", eb.msg);
            dec__send_finish(w, c->req_id, PD_FINISH_ERROR, np, 0, e, eb.reason, msg);
            dec__remove(w, c->req_id);
        }
    }
    w->n_commits = 0;
}

/* Streams every adopted request's pending events: TOKEN, and FINISH + F1. */
static void dec__drain(dec__worker *w) {
    for (uint32_t i = 0; i < w->n_req;) {
        dec__req *q = &w->req[i];
        if (!q->er) {
            i++;
            continue;
        }
        bool removed = false;
        engine_event ev;
        while (engine_req_next(q->er, &ev, 0) == KS_OK) {
            if (ev.token >= 0) {
                pd_msg_token t = {.token = ev.token, .logprob = ev.sr.logprob};
                pd_msg_top top[PD_MSG_MAX_TOP];
                uint32_t nt = ev.sr.n_top > 0 ? (uint32_t)ev.sr.n_top : 0;
                if (nt > (uint32_t)q->s.n_probs) nt = (uint32_t)q->s.n_probs;
                for (uint32_t j = 0; j < nt; j++)
                    top[j] = (pd_msg_top){.id = ev.sr.top_ids[j], .logprob = ev.sr.top_logprobs[j]};
                t.n_top = nt;
                uint8_t buf[12 + 8 * PD_MSG_MAX_TOP];
                uint32_t len = 0;
                if (pd_msg_token_encode(&t, top, buf, sizeof buf, &len, NULL) == KS_OK)
                    dec__ctrl_send(w, q->rt, PD_MSG_TOKEN, q->req_id, buf, len);
            }
            if (ev.done) {
                uint64_t id = q->req_id;
                uint32_t fin = ev.finish >= ENGINE_FINISH_STOP && ev.finish <= ENGINE_FINISH_ERROR
                                   ? (uint32_t)ev.finish
                                   : PD_FINISH_ERROR;
                dec__send_finish(w, id, fin, ev.n_prompt > 0 ? (uint32_t)ev.n_prompt : q->n_prompt,
                                 ev.n_gen > 0 ? (uint32_t)ev.n_gen : 0, ev.err, ev.reason,
                                 ev.errmsg);
                engine_req_release(q->er);
                q->er = NULL;
                pd_recv_finish(w->rcv, id);  // F1: the engine no longer touches the pages
                dec__remove(w, id);
                removed = true;
                break;
            }
        }
        if (!removed) i++;
    }
}

// ----------------------------------------------------------------------------
// Data links

static void dl__on_open(pd_conn *c, void *ud) {
    dec__worker *w = ud;
    dec__link *k = calloc(1, sizeof *k);
    if (!k) {
        ks_log(KS_LOG_ERROR, "decode: out of memory for a data link; closing it");
        pd_conn_close(c);
        return;
    }
    k->w = w;
    k->c = c;
    k->next = w->links;
    w->links = k;
    pd_conn_set_ud(c, k);
}

static ks_err dl__sink(pd_conn *c, void *ud, const pd_frame_hdr *hdr, const uint8_t *prefix,
                       uint32_t prefix_len, struct iovec *iov, int *n_iov) {
    (void)c;
    dec__link *k = ud;
    dec__worker *w = k->w;
    *n_iov = 0;
    if (hdr->type != PD_MSG_KV_PAGE) return KS_OK;  // small frames: buffered as usual
    if (k->epoch == 0) return KS_ERR_PROTO;         // KV_PAGE before LINK
    pd_msg_kv_page ph;
    ks_errbuf eb;
    if (pd_msg_kv_page_decode(prefix, prefix_len, hdr->len, &w->g, &ph, &eb) != KS_OK) {
        ks_log(KS_LOG_WARN, "decode: link %llu: %s", (unsigned long long)k->epoch, eb.msg);
        return KS_ERR_PROTO;
    }
    if ((uint64_t)kv_geom_planes(&w->g) * ph.layer_count > PD_MAX_IOV) {
        ks_log(KS_LOG_WARN, "decode: link %llu: KV_PAGE of %u layers exceeds one sink (%d iovecs)",
               (unsigned long long)k->epoch, ph.layer_count, PD_MAX_IOV);
        return KS_ERR_PROTO;
    }
    int nd = 0;
    bool ok = pd_recv_kv_page_begin(w->rcv, hdr->req_id, k->epoch, &ph, iov, PD_MAX_IOV, &nd);
    if (ok && nd > 0) {
        dec__req *q = dec__find(w, hdr->req_id);
        if (q) {
            if (!q->t_first_page_ns) {  // the tests' "transfer started" (tests/e2e/netns.sh)
                q->t_first_page_ns = ks_now_ns();
                ks_log(KS_LOG_DEBUG, "decode: request %llu: first KV page from %s (link %llu)",
                       (unsigned long long)hdr->req_id, pd_conn_peer_addr(k->c),
                       (unsigned long long)k->epoch);
            }
            q->kv_bytes += hdr->len;
        }
        k->sink_pending = true;
        k->sink_req = hdr->req_id;
        *n_iov = nd;
    }
    return KS_OK;
}

/* A KV_PAGE delivery ended before its last byte. Bad bytes (PROTO: the
 * frame checksum) fail the request's verification; a connection lost in the
 * middle of the payload says nothing about the KV: the delivery just stops,
 * and on_close, which the loop runs right after, ends the link's requests
 * as a lost link (F5: scrubbed, "data link lost", which the router may
 * place again) instead of as a failed verification. */
static void dl__on_sink_fail(pd_conn *c, void *ud, const pd_frame_hdr *hdr, ks_err why) {
    (void)c;
    dec__link *k = ud;
    if (!k->sink_pending) return;
    k->sink_pending = false;
    if (why != KS_ERR_PROTO) return;  // pd_recv_link_closed clears the pending delivery
    pd_recv_kv_page_end(k->w->rcv, hdr->req_id, false);
    dec__flush(k->w);
}

static void dl__on_link(dec__link *k, const pd_frame *f) {
    dec__worker *w = k->w;
    pd_msg_link m;
    ks_errbuf eb;
    if (k->epoch != 0) {
        dec__proto_close(k->c, "LINK: a second LINK on one data link");
        return;
    }
    if (pd_msg_link_decode(f->payload, f->payload_len, &m, &eb) != KS_OK) {
        dec__proto_close(k->c, eb.msg);
        return;
    }
    // (a restarted router has a new identity: ids of its predecessor never match)
    for (dec__link *o = w->links; o; o = o->next)
        if (o != k && o->epoch != 0 && !o->retired && o->prefill_id == m.prefill_worker_id &&
            o->router_id == m.router_id) {
            // A live link is never replaced: only the router's RETIRE ends it. The
            // newcomer may be a relay or a confused worker; its grants would be
            // the old link's (section 3).
            char why[128];
            snprintf(why, sizeof why,
                     "LINK refused: prefill worker %u has a live link the router has not retired",
                     m.prefill_worker_id);
            ks_log(KS_LOG_WARN, "decode: %s (from %s)", why, pd_conn_peer_addr(k->c));
            cl_error_close(k->c, KS_ERR_PROTO, why);
            return;
        }
    if (memcmp(m.model_id, w->model_id, sizeof w->model_id)) {
        // pages of one model are meaningless (and a leak) under another's weights
        char why[192];
        snprintf(why, sizeof why,
                 "LINK refused: prefill worker %u serves model %02x%02x%02x%02x.., this decode "
                 "worker model %02x%02x%02x%02x..: no page crosses models",
                 m.prefill_worker_id, m.model_id[0], m.model_id[1], m.model_id[2], m.model_id[3],
                 w->model_id[0], w->model_id[1], w->model_id[2], w->model_id[3]);
        ks_log(KS_LOG_WARN, "decode: %s (from %s)", why, pd_conn_peer_addr(k->c));
        cl_error_close(k->c, KS_ERR_PROTO, why);
        return;
    }
    k->epoch = dec__new_epoch(w);
    k->router_id = m.router_id;
    k->prefill_id = m.prefill_worker_id;
    pd_msg_link_ack ack = {.link_epoch = k->epoch};
    if (w->ucx) { // the UCX plane: the link's sealing key, and our UCX address for prefill
        size_t alen = 0;
        ack.ucx_addr = cl_ucxd_address(w->ucx, &alen);
        ack.ucx_addr_len = (uint32_t)alen;
        if (cl_ucxd_link_up(w->ucx, k->c, k->epoch, &eb) != KS_OK) {
            ks_log(KS_LOG_WARN, "decode: link from prefill %u: %s", k->prefill_id, eb.msg);
            cl_error_close(k->c, KS_ERR_INTERNAL, eb.msg);
            return;
        }
    }
    uint8_t buf[12 + PD_MSG_UCX_ADDR_MAX];
    uint32_t len = 0;
    if (pd_msg_link_ack_encode(&ack, buf, sizeof buf, &len, NULL) == KS_OK)
        dec__link_send(k, PD_MSG_LINK_ACK, 0, buf, len);
    ks_log(KS_LOG_INFO, "decode: link up: prefill %u (router %016llx) from %s, epoch %llu",
           k->prefill_id, (unsigned long long)k->router_id, pd_conn_peer_addr(k->c),
           (unsigned long long)k->epoch);
}

static void dl__on_frame(pd_conn *c, void *ud, const pd_frame *f) {
    (void)c;
    dec__link *k = ud;
    dec__worker *w = k->w;
    uint16_t t = f->hdr.type;
    uint64_t id = f->hdr.req_id;
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    if (t == PD_MSG_LINK) {
        dl__on_link(k, f);
        return;
    }
    if (t == PD_MSG_ERROR) {
        pd_msg_error m;
        if (pd_msg_error_decode(f->payload, f->payload_len, &m, NULL) == KS_OK)
            ks_log(KS_LOG_WARN, "decode: link %llu: prefill sent ERROR %s: %.*s",
                   (unsigned long long)k->epoch, ks_err_name((ks_err)m.err), (int)m.msg_len, m.msg);
        pd_conn_close(k->c);
        return;
    }
    if (k->epoch == 0) {
        dec__proto_close(k->c, "data link: frame before LINK");
        return;
    }
    switch (t) {
    case PD_MSG_KV_PAGE:
        if (f->sunk) {
            if (k->sink_pending) {
                k->sink_pending = false;
                pd_recv_kv_page_end(w->rcv, id, true);
            }
        } else if (f->hdr.len <= PD_MSG_KV_PAGE_HDR) {
            dec__proto_close(k->c, "KV_PAGE: payload shorter than its page header");
            return;
        }
        // not sunk: pd_recv said discard (unknown, ABORTING or a failed check)
        break;
    case PD_MSG_DONE: {
        pd_msg_done d;
        if (pd_msg_done_decode(f->payload, f->payload_len, &d, &eb) != KS_OK) {
            dec__proto_close(k->c, eb.msg);
            return;
        }
        dec__req *q = dec__find(w, id);
        if (q && memcmp(q->s.adapter, d.adapter, sizeof d.adapter)) {
            // KV computed under another LoRA adapter than the request's (or
            // with one where it named none, or the reverse): not one of its
            // pages is used; freed (scrubbed) as a prefill REJECT would
            ks_log(KS_LOG_WARN, "decode: request %llu: prefill computed its KV under another "
                   "LoRA adapter than its ADMIT named; refused", (unsigned long long)id);
            pd_recv_reject(w->rcv, id, k->epoch, ADMIT_INTERNAL,
                           "the prompt's KV was computed under another LoRA adapter than the "
                           "request's; no page of it was used");
            break;
        }
        if (w->ucx) { // the UCX plane: every put landed before DONE; open them into the pages
            uint64_t t0 = ks_now_ns(), n = cl_ucxd_deliver(w->ucx, id, w->rcv);
            if (q && n) {
                q->kv_bytes += n;
                if (!q->t_first_page_ns) q->t_first_page_ns = t0;
            }
            ks_log(KS_LOG_INFO, "decode: request %llu: %llu KV bytes opened from UCX staging "
                   "in %.3f ms", (unsigned long long)id, (unsigned long long)n,
                   (double)(ks_now_ns() - t0) / 1e6);
        }
        (void)pd_recv_done(w->rcv, id, k->epoch, &d);
        break;
    }
    case PD_MSG_REJECT: {
        pd_msg_reject m;
        if (pd_msg_reject_decode(f->payload, f->payload_len, &m, &eb) != KS_OK) {
            dec__proto_close(k->c, eb.msg);
            return;
        }
        char msg[PD_MSG_MAX_TEXT + 1];
        snprintf(msg, sizeof msg, "%.*s", (int)m.msg_len, m.msg);
        pd_recv_reject(w->rcv, id, k->epoch, m.reason, msg);
        break;
    }
    case PD_MSG_ABORT: {
        pd_msg_abort m;
        if (pd_msg_abort_decode(f->payload, f->payload_len, &m, &eb) != KS_OK) {
            dec__proto_close(k->c, eb.msg);
            return;
        }
        pd_recv_prefill_abort(w->rcv, id, k->epoch);
        break;
    }
    case PD_MSG_ABORT_ACK:
        if (pd_msg_abort_ack_decode(f->payload, f->payload_len, &eb) != KS_OK) {
            dec__proto_close(k->c, eb.msg);
            return;
        }
        pd_recv_abort_ack(w->rcv, id, k->epoch);
        ks_log(KS_LOG_INFO, "decode: request %llu: ABORT_ACK, the transfer is quiesced",
               (unsigned long long)id);
        break;
    default:  // type_max forbids the rest; defensive
        dec__proto_close(k->c, "data link: unexpected frame type");
        return;
    }
    dec__flush(w);
}

static void dl__on_close(pd_conn *c, void *ud, ks_err why, const char *msg) {
    (void)c;
    dec__link *k = ud;
    dec__worker *w = k->w;
    if (k->sink_pending) {  // on_sink_fail should have run; never leave a delivery open
        k->sink_pending = false;
        pd_recv_kv_page_end(w->rcv, k->sink_req, false);
    }
    for (dec__link **pp = &w->links; *pp; pp = &(*pp)->next)
        if (*pp == k) {
            *pp = k->next;
            break;
        }
    if (k->epoch != 0) {
        if (w->ucx) cl_ucxd_link_closed(w->ucx, k->epoch); // its grants' keys revoked first
        // the transport stopped delivering into pages for this link: F5
        uint32_t n = w->rcv ? pd_recv_link_closed(w->rcv, k->epoch) : 0;
        ks_log(KS_LOG_INFO, "decode: link down: prefill %u, epoch %llu (%s%s%s), %u request(s) ended",
               k->prefill_id, (unsigned long long)k->epoch, ks_err_name(why), msg ? ": " : "",
               msg ? msg : "", n);
        dec__flush(w);
    }
    free(k);
}

// ----------------------------------------------------------------------------
// Control connection (router)

/* The live link of prefill worker prefill_id of router router_id, or NULL. */
static dec__link *dec__link_of_prefill(dec__worker *w, uint64_t router_id, uint32_t prefill_id) {
    for (dec__link *k = w->links; k; k = k->next)
        if (k->epoch != 0 && !k->retired && k->prefill_id == prefill_id &&
            k->router_id == router_id && router_id != 0)
            return k;
    return NULL;
}

static void dec__deny(dec__worker *w, int rt, uint64_t req_id, uint32_t reason, const char *text) {
    size_t ml = strlen(text);
    if (ml > PD_MSG_MAX_TEXT) ml = PD_MSG_MAX_TEXT;
    pd_msg_deny m = {.reason = reason, .msg = text, .msg_len = (uint32_t)ml};
    uint8_t buf[8 + PD_MSG_MAX_TEXT];
    uint32_t len = 0;
    if (pd_msg_deny_encode(&m, buf, sizeof buf, &len, NULL) == KS_OK)
        dec__ctrl_send(w, rt, PD_MSG_DENY, req_id, buf, len);
}

static void dec__on_admit(dec__worker *w, int rt, uint64_t req_id, const pd_frame *f) {
    pd_msg_admit m;
    ks_errbuf eb;
    if (pd_msg_admit_decode(f->payload, f->payload_len, &m, &eb) != KS_OK) {
        ks_log(KS_LOG_WARN, "decode: bad ADMIT from the router: %s", eb.msg);
        return;
    }
    if (atomic_load(&w->draining)) {  // graceful stop: the router places it elsewhere
        dec__deny(w, rt, req_id, PD_DENY_DRAINING, "the decode worker is shutting down");
        return;
    }
    if (w->max_running > 0 && !dec__find(w, req_id) && w->n_req >= (uint32_t)w->max_running) {
        dec__deny(w, rt, req_id, PD_DENY_NOSPACE, "decode worker is at its running-request limit");
        return;
    }
    if (!dec__reserve(w)) {
        dec__deny(w, rt, req_id, PD_DENY_NOSPACE, "decode worker: out of memory");
        return;
    }
    // the sampling extension compiles and validates here before anything is granted
    grammar *g = NULL;
    sample_bias *bias = m.s.n_bias ? malloc(sizeof *bias * m.s.n_bias) : NULL;
    if (m.s.n_bias && !bias) {
        dec__deny(w, rt, req_id, PD_DENY_NOSPACE, "decode worker: out of memory");
        return;
    }
    int n_bias = cl_bias_from_msg(&m.s, bias);
    ks_errbuf_clear(&eb);
    // (token ids are checked against the vocabulary at engine_adopt)
    if (sample_bias_validate(bias, n_bias, INT32_MAX, &eb) != KS_OK ||
        (m.s.grammar_len && grammar_parse(m.s.grammar, m.s.grammar_len, &g, &eb) != KS_OK)) {
        free(bias);
        dec__deny(w, rt, req_id, PD_DENY_INVALID, eb.msg);
        return;
    }
    dec__link *k = dec__link_of_prefill(w, cl_ctrl_router_id(w->rts[rt].ctrl), m.prefill_worker_id);
    pd_recv_admit_args a = {.n_prompt = m.n_prompt, .max_tokens = m.s.max_tokens,
                            .prefill_worker_id = m.prefill_worker_id,
                            .link_epoch = k ? k->epoch : 0, .model_id = m.model_id};
    const uint8_t *grant = NULL;
    uint32_t grant_len = 0, deny = 0;
    ks_errbuf_clear(&eb);
    if (pd_recv_admit(w->rcv, req_id, &a, &grant, &grant_len, &deny, &eb) != KS_OK) {
        grammar_unref(g);
        free(bias);
        dec__deny(w, rt, req_id, deny ? deny : PD_DENY_NOSPACE, eb.msg);
        return;
    }
    if (w->ucx && k) { // the UCX plane: a staging area and its remote key go with the GRANT
        ks_errbuf_clear(&eb);
        if (cl_ucxd_grant(w->ucx, req_id, k->epoch, grant, grant_len, &grant, &grant_len, &eb) !=
            KS_OK)
            ks_log(KS_LOG_WARN, "decode: request %llu: no UCX staging (%s); its pages come on "
                   "the TLS link", (unsigned long long)req_id, eb.msg);
    }
    dec__add(w, rt, req_id, m.n_prompt, &m.s, m.domain_hash, g, bias);
    dec__ctrl_send(w, rt, PD_MSG_GRANT, req_id, grant, grant_len);
}

static void dec__on_ctrl_frame(void *ud, const pd_frame *f) {
    dec__rt *rt = ud;
    dec__worker *w = rt->w;
    uint64_t id = f->hdr.req_id;
    switch (f->hdr.type) {
    case PD_MSG_ADMIT:
        dec__on_admit(w, rt->idx, id, f);
        break;
    case PD_MSG_ABORT: {
        pd_msg_abort m;
        if (pd_msg_abort_decode(f->payload, f->payload_len, &m, NULL) != KS_OK) {
            ks_log(KS_LOG_WARN, "decode: bad ABORT from the router");
            break;
        }
        dec__req *own = dec__find(w, id);
        if (own && own->rt != rt->idx) break;  // only the router that sent it may stop it
        if (!pd_recv_abort(w->rcv, id, m.reason)) {
            dec__flush(w);
            dec__req *q = dec__find(w, id);
            if (q && q->er) engine_req_cancel(q->er);  // its done event FINISHes and frees (F1)
        }
        break;
    }
    case PD_MSG_ERROR: {
        pd_msg_error m;
        if (pd_msg_error_decode(f->payload, f->payload_len, &m, NULL) == KS_OK)
            ks_log(KS_LOG_WARN, "decode: router sent ERROR %s: %.*s", ks_err_name((ks_err)m.err),
                   (int)m.msg_len, m.msg);
        break;
    }
    case PD_MSG_RETIRE: {  // the prefill worker is gone for the router: so are its links (F5)
        pd_msg_link m;
        if (pd_msg_link_decode(f->payload, f->payload_len, &m, NULL) != KS_OK) {
            ks_log(KS_LOG_WARN, "decode: bad RETIRE from the router");
            break;
        }
        uint64_t rid = cl_ctrl_router_id(rt->ctrl);
        if (m.router_id != rid) {
            ks_log(KS_LOG_WARN, "decode: RETIRE names another router's worker; ignored");
            break;
        }
        for (dec__link *k = w->links; k; k = k->next)
            if (k->epoch != 0 && !k->retired && k->prefill_id == m.prefill_worker_id &&
                k->router_id == rid) {
                ks_log(KS_LOG_INFO, "decode: router retired prefill %u; closing its link %llu",
                       m.prefill_worker_id, (unsigned long long)k->epoch);
                k->retired = true;
                pd_conn_close(k->c);
            }
        break;
    }
    default:
        break;
    }
    dec__flush(w);
}

/* F6 for this router's requests only (the other routers' go on): each
 * transfer in flight goes ABORTING; running generation stops. */
static void dec__on_lost(void *ud) {
    dec__rt *rt = ud;
    dec__worker *w = rt->w;
    uint32_t n = 0;
    for (uint32_t i = 0; i < w->n_req; i++) n += w->req[i].rt == rt->idx;
    ks_log(KS_LOG_INFO, "decode: router %s lost; aborting its %u request(s)", cl_ctrl_name(rt->ctrl), n);
    uint64_t *ids = n ? malloc(n * sizeof *ids) : NULL;
    if (n && !ids) {  // cannot tell them apart: end everything rather than leave any
        (void)pd_recv_abort_all(w->rcv, PD_ABORT_WORKER_LOST);
        dec__flush(w);
        for (uint32_t i = 0; i < w->n_req; i++)
            if (w->req[i].er) engine_req_cancel(w->req[i].er);
        return;
    }
    n = 0;
    for (uint32_t i = 0; i < w->n_req; i++)
        if (w->req[i].rt == rt->idx) ids[n++] = w->req[i].req_id;
    for (uint32_t i = 0; i < n; i++) {  // (an abort's FINISH removes entries: by id)
        if (pd_recv_abort(w->rcv, ids[i], PD_ABORT_WORKER_LOST)) {
            dec__flush(w);
            continue;
        }
        dec__req *q = dec__find(w, ids[i]);
        if (q && q->er) engine_req_cancel(q->er);
    }
    free(ids);
}

static void dec__health(void *ud, pd_msg_health_ack *out) {
    dec__worker *w = ((dec__rt *)ud)->w;
    pd_recv_stats rs;
    pd_recv_get_stats(w->rcv, &rs);
    cl_health_fill(w->pool, rs.active, atomic_load(&w->draining), out);
}

static void dec__pool_check(void *ud, pd_msg_pool_check_ack *out) {
    dec__worker *w = ((dec__rt *)ud)->w;
    pd_recv_stats rs;
    pd_recv_get_stats(w->rcv, &rs);
    // we are on the scheduler thread: no forward pass runs while this reads
    cl_pool_check_fill(w->pool, rs.active > w->n_req ? rs.active : w->n_req, w->n_commits > 0, out);
}

// ----------------------------------------------------------------------------
// Start and stop (scheduler thread)

static ks_err dec__type_tables(dec__worker *w, ks_errbuf *eb) {
    ks_err e = pd_msg_type_max(&w->g, w->tm_data, eb);
    if (e != KS_OK) return e;
    memcpy(w->tm_ctrl, w->tm_data, sizeof w->tm_ctrl);
    static const uint16_t data_ok[] = {PD_MSG_LINK,  PD_MSG_KV_PAGE,   PD_MSG_DONE, PD_MSG_REJECT,
                                       PD_MSG_ABORT, PD_MSG_ABORT_ACK, PD_MSG_ERROR};
    static const uint16_t ctrl_ok[] = {PD_MSG_REGISTER_ACK, PD_MSG_HEALTH,     PD_MSG_ADMIT,
                                       PD_MSG_ABORT,        PD_MSG_POOL_CHECK, PD_MSG_ERROR,
                                       PD_MSG_RETIRE};
    for (uint32_t t = 0; t < PD_MSG_N_TYPES; t++) {
        bool d = false, c = false;
        for (size_t i = 0; i < sizeof data_ok / sizeof data_ok[0]; i++) d |= data_ok[i] == t;
        for (size_t i = 0; i < sizeof ctrl_ok / sizeof ctrl_ok[0]; i++) c |= ctrl_ok[i] == t;
        if (!d) w->tm_data[t] = PD_TYPE_FORBIDDEN;
        if (!c) w->tm_ctrl[t] = PD_TYPE_FORBIDDEN;
    }
    return KS_OK;
}

/* The --lora adapters into the engine, each PUBLIC and named by its
 * digest's hex (what ADMIT's PD_FLAG_ADAPTER digest resolves to at
 * engine_adopt, whoever the request's domain): loaded before REGISTER lists
 * them, so no request can name one that is not here yet. */
static ks_err dec__adapters(dec__worker *w, engine *e, ks_errbuf *eb) {
    const cluster_worker_opts *o = w->o;
    if (o->n_lora <= 0) return KS_OK;
    if (o->n_lora > (int)PD_MSG_MAX_ADAPTERS)
        return ks_seterr(eb, KS_ERR_INVAL, "at most %u --lora adapters", PD_MSG_MAX_ADAPTERS);
    w->adapters = calloc((size_t)o->n_lora, PD_MSG_ADAPTER_BYTES);
    if (!w->adapters) return ks_seterr(eb, KS_ERR_NOMEM, "adapters");
    for (int i = 0; i < o->n_lora; i++) {
        uint8_t *buf = NULL, *dig = w->adapters + (size_t)i * PD_MSG_ADAPTER_BYTES;
        size_t len = 0;
        ks_errbuf aeb;
        ks_errbuf_clear(&aeb);
        ks_err err = cl_lora_read(&o->lora[i], &buf, &len, dig, &aeb);
        char hex[2 * PD_MSG_ADAPTER_BYTES + 1];
        cl_hex(dig, PD_MSG_ADAPTER_BYTES, hex);
        engine_adapter_spec sp = {.tenant = "cluster", .name = hex, .is_public = true,
                                  .scale = o->lora[i].scale, .data = buf, .len = len};
        if (!err) err = engine_adapter_add(e, &sp, &aeb);
        if (buf) sodium_memzero(buf, len);
        free(buf);
        if (err) {
            if (err == KS_ERR_INVAL && strstr(aeb.msg, "already"))
                return ks_seterr(eb, err, "--lora %s: the same adapter is given twice",
                                 o->lora[i].path);
            return ks_seterr(eb, err, "--lora %s: %s", o->lora[i].path, aeb.msg);
        }
        ks_log(KS_LOG_INFO, "decode worker: LoRA adapter %s (sha256 %s) loaded", o->lora[i].path,
               hex);
    }
    return KS_OK;
}

static ks_err dec__start(dec__worker *w, engine *e, ks_errbuf *eb) {
    const cluster_worker_opts *o = w->o;
    w->e = e;
    w->pool = engine_pool(e);
    w->g = *kv_pool_geom(w->pool);
    ks_err err = dec__type_tables(w, eb);
    if (err != KS_OK) return err;
    if ((err = dec__adapters(w, e, eb)) != KS_OK) return err;
    pd_loop_cfg lc = {.secret = o->secret, .secret_len = o->secret_len, .role = PD_ROLE_DECODE,
                      .max_payload = PD_MSG_MAX_FRAME, .insecure_plaintext = o->insecure_plaintext};
    if ((err = pd_loop_create(&lc, &w->l, eb)) != KS_OK) return err;
    pd_recv_cfg rc = {.n_ctx = o->eng.n_ctx > 0 ? (uint32_t)o->eng.n_ctx : 0,
                      .t_grant_ms = o->t_grant_ms, .t_xfer_ms = o->t_xfer_ms,
                      .t_ack_ms = o->t_ack_ms, .emit = dec__emit, .emit_ctx = w,
                      .clock = cl_now_ms};
    cluster_model_id(o->m, w->model_id);
    memcpy(rc.model_id, w->model_id, sizeof rc.model_id);
    if ((err = pd_recv_create(w->pool, &rc, &w->rcv, eb)) != KS_OK) return err;
    if (o->data_plane == PD_PLANE_UCX && (err = cl_ucx_create(&w->g, &w->ucx, eb)) != KS_OK)
        return err;
    pd_conn_cbs dc = {.on_open = dl__on_open, .on_frame = dl__on_frame, .sink = dl__sink,
                      .sink_prefix = PD_MSG_KV_PAGE_HDR, .type_max = w->tm_data,
                      .n_types = PD_MSG_N_TYPES, .peer_roles = 1u << PD_ROLE_PREFILL,
                      .on_sink_fail = dl__on_sink_fail, .on_close = dl__on_close};
    if ((err = pd_tcp_listen(w->l, o->data_host, (uint16_t)o->data_port, &dc, w, &w->ls, eb)) !=
        KS_OK)
        return err;
    uint16_t port = pd_listener_port(w->ls);
    printf("data link on %s:%u\n", o->data_host ? o->data_host : "0.0.0.0", (unsigned)port);
    fflush(stdout);
    const char *adv = o->advertise_host ? o->advertise_host
                      : o->data_host    ? o->data_host
                                        : "127.0.0.1";
    snprintf(w->host, sizeof w->host, "%s", adv);
    cluster_router_addr ra[CLUSTER_MAX_ROUTERS];
    int n_rt = cl_worker_routers(o, ra);
    if (n_rt == 0) return ks_seterr(eb, KS_ERR_INVAL, "decode worker: bad router list");
    cl_ctrl_cfg cc;
    memset(&cc, 0, sizeof cc);
    cc.reg.role = PD_ROLE_DECODE;
    cc.reg.kv_type = (uint8_t)w->g.kv_type;
    cc.reg.planes = (uint8_t)kv_geom_planes(&w->g);
    cc.reg.n_layer = (uint32_t)w->g.n_layer;
    cc.reg.kv_dim = (uint32_t)w->g.kv_dim;
    cc.reg.page_tokens = (uint32_t)w->g.page_tokens;
    cc.reg.n_pages = kv_pool_n_pages(w->pool);
    cc.reg.n_ctx = (uint32_t)o->eng.n_ctx;
    cc.reg.data_port = port;
    memcpy(cc.reg.model_id, w->model_id, sizeof cc.reg.model_id);
    cc.reg.data_plane = o->data_plane;
    cc.reg.host = w->host;
    cc.reg.host_len = (uint16_t)strlen(w->host);
    cc.reg.names = o->names ? o->names : "";
    cc.reg.names_len = (uint16_t)strlen(cc.reg.names);
    cc.reg.adapters = w->adapters;
    cc.reg.n_adapters = (uint16_t)(w->adapters ? w->o->n_lora : 0);
    cc.type_max = w->tm_ctrl;
    cc.t_router_ms = o->t_router_ms;
    cl_ctrl_cbs cb = {.on_frame = dec__on_ctrl_frame,
                      .on_lost = dec__on_lost, .health = dec__health,
                      .pool_check = dec__pool_check};
    for (int i = 0; i < n_rt; i++) {
        cc.router_host = ra[i].host;
        cc.router_port = ra[i].port;
        w->rts[i] = (dec__rt){.w = w, .idx = i};
        if ((err = cl_ctrl_start(w->l, &cc, &cb, &w->rts[i], &w->rts[i].ctrl, eb)) != KS_OK)
            return err;
        w->n_rt = i + 1;
    }
    return KS_OK;
}

/* True when some router holds this worker registered. */
static bool dec__any_registered(const dec__worker *w) {
    for (int i = 0; i < w->n_rt; i++)
        if (w->rts[i].ctrl && cl_ctrl_registered(w->rts[i].ctrl)) return true;
    return false;
}

/* Tears down the network side: abort (SHUTDOWN), stop the control conn,
 * close every link (F5 in on_close), then free the receiver. */
static void dec__teardown(dec__worker *w) {
    if (w->rcv) {
        (void)pd_recv_abort_all(w->rcv, PD_ABORT_SHUTDOWN);
        dec__flush(w);
        for (uint32_t i = 0; i < w->n_req; i++)
            if (w->req[i].er) engine_req_cancel(w->req[i].er);
        dec__drain(w);  // the engine already aborted them: their done events
        // a request whose done event has not been posted yet keeps nothing we
        // own alive past here: release the handle, then F1
        while (w->n_req > 0) {
            dec__req *q = &w->req[w->n_req - 1];
            uint64_t id = q->req_id;
            if (q->er) engine_req_release(q->er);
            q->er = NULL;
            dec__req_clear(q);
            w->n_req--;
            pd_recv_finish(w->rcv, id);
        }
    }
    for (int i = 0; i < w->n_rt; i++) {
        cl_ctrl_destroy(w->rts[i].ctrl);
        w->rts[i].ctrl = NULL;
    }
    w->n_rt = 0;
    pd_listener_close(w->ls);
    w->ls = NULL;
    pd_loop_destroy(w->l);  // closes the links: on_close runs pd_recv_link_closed (F5)
    w->l = NULL;
    cl_ucx_destroy(w->ucx); // every link closed: every key revoked
    w->ucx = NULL;
    pd_recv_destroy(w->rcv);
    w->rcv = NULL;
    w->n_commits = 0;
}

static void dec__sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void dec__poll(void *ctx, engine *e, int timeout_ms) {
    dec__worker *w = ctx;
    int phase = atomic_load(&w->phase);
    if (phase == DEC__STARTING) {
        ks_errbuf_clear(&w->start_eb);
        if (dec__start(w, e, &w->start_eb) != KS_OK) {
            dec__teardown(w);
            atomic_store(&w->phase, DEC__FAILED);
            return;
        }
        atomic_store(&w->phase, DEC__RUNNING);
    } else if (phase == DEC__FAILED) {
        dec__sleep_ms(timeout_ms > 50 ? 50 : timeout_ms > 0 ? timeout_ms : 0);
        return;
    }
    int t = timeout_ms < 0 || timeout_ms > 50 ? 50 : timeout_ms;
    if (w->ucx) { // puts land while the worker progresses: while a grant is mapped, spin
        // as long as puts arrive, else wake every ms (prefill may compute for
        // long before its first put, and spinning would take its CPU)
        uint64_t now = cl_now_ms(NULL);
        if (cl_ucx_progress(w->ucx) > 0) w->ucx_active_ms = now;
        if (cl_ucx_busy(w->ucx)) t = now - w->ucx_active_ms < 20 ? 0 : t > 1 ? 1 : t;
    }
    if (pd_loop_run_once(w->l, t) != KS_OK) dec__sleep_ms(t);
    (void)pd_recv_tick(w->rcv);
    dec__flush(w);
    for (int i = 0; i < w->n_rt; i++) cl_ctrl_tick(w->rts[i].ctrl);
    cl_health_beat(w->health, dec__any_registered(w), atomic_load(&w->draining));
    dec__drain(w);
    pd_recv_stats rs;
    pd_recv_get_stats(w->rcv, &rs);
    atomic_store(&w->live, rs.active > w->n_req ? rs.active : w->n_req);
    if (atomic_load(&w->draining)) {
        if (!w->quiesced)
            for (int i = 0; i < w->n_rt; i++) cl_ctrl_quiesce(w->rts[i].ctrl);
        w->quiesced = true;
        atomic_store(&w->released, !dec__any_registered(w));
    }
}

static void dec__poll_end(void *ctx, engine *e) {
    (void)e;
    dec__worker *w = ctx;
    if (atomic_load(&w->phase) == DEC__RUNNING) dec__teardown(w);
}

// ----------------------------------------------------------------------------
// Entry point

ks_err cluster_decode_run(const cluster_worker_opts *o, const atomic_int *stop,
                          ks_errbuf *eb) {
    cluster_router_addr ra[CLUSTER_MAX_ROUTERS];
    if (!o || !o->m || !o->secret || o->secret_len < 16 || cl_worker_routers(o, ra) == 0 ||
        o->data_port < 0 || o->data_port > 65535 || !stop)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "decode worker: model, secret (>= 16 bytes), router address and "
                         "ports are required");
    if (o->data_plane > PD_PLANE_UCX || (o->data_plane == PD_PLANE_UCX && o->insecure_plaintext))
        return ks_seterr(eb, KS_ERR_INVAL, "decode worker: --data-plane ucx seals pages under "
                         "keys of the TLS data link: not with --insecure-plaintext");
    if (o->advertise_host && strlen(o->advertise_host) > PD_MSG_MAX_HOST)
        return ks_seterr(eb, KS_ERR_INVAL, "decode worker: advertise host longer than %u bytes",
                         PD_MSG_MAX_HOST);
    dec__worker *w = calloc(1, sizeof *w);
    if (!w) return ks_seterr(eb, KS_ERR_NOMEM, "decode worker: out of memory");
    w->o = o;
    atomic_init(&w->phase, DEC__STARTING);
    engine_opts eo = o->eng;
    if (!eo.m) eo.m = o->m;
    eo.prefix_cache = false;
    eo.poll = dec__poll;
    eo.poll_end = dec__poll_end;
    eo.poll_ctx = w;
    w->max_running = eo.max_running;
    ks_err err;
    if (o->health_host &&
        (err = cl_health_start(o->health_host, o->health_port, 0, &w->health, eb))) {
        free(w);
        return err;
    }
    engine *e = NULL;
    err = engine_create(&eo, &e, eb);
    if (err != KS_OK) {
        cl_health_destroy(w->health);
        free(w);
        return err;
    }
    // the scheduler starts the network side on its first poll
    while (atomic_load(&w->phase) == DEC__STARTING &&
           !atomic_load_explicit(stop, memory_order_acquire))
        dec__sleep_ms(5);
    if (atomic_load(&w->phase) == DEC__FAILED) {
        engine_destroy(e);
        err = ks_seterr(eb, w->start_eb.code ? w->start_eb.code : KS_ERR_IO, "decode worker: %s",
                        w->start_eb.msg);
        cl_health_destroy(w->health);
        free(w->req);
        free(w->adapters);
        free(w);
        return err;
    }
    while (!atomic_load_explicit(stop, memory_order_acquire))
        dec__sleep_ms(50);
    if (o->drain_ms) {  // graceful stop: finish what is held, take nothing new
        atomic_store(&w->draining, true);
        ks_log(KS_LOG_INFO, "decode worker: draining %u request(s) (up to %u ms)",
               atomic_load(&w->live), o->drain_ms);
        uint64_t deadline = cl_now_ms(NULL) + o->drain_ms;
        // done once idle AND released by the router (no ADMIT can still come)
        while ((atomic_load(&w->live) > 0 || !atomic_load(&w->released)) && cl_now_ms(NULL) < deadline)
            dec__sleep_ms(20);
        if (atomic_load(&w->live) > 0)
            ks_log(KS_LOG_WARN, "decode worker: drain timed out; aborting %u request(s)",
                   atomic_load(&w->live));
    }
    engine_destroy(e);  // runs poll_end: abort, links closed, receiver freed
    cl_health_destroy(w->health);
    free(w->req);
    free(w->adapters);
    free(w);
    return KS_OK;
}
