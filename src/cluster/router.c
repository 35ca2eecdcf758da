/* router.c — `kvseal router`: the cluster's HTTP-facing side (cluster.h);
 * this file is its loop thread and lifecycle (router_int.h names the rest).
 *
 * The HTTP front (server.h) runs unchanged on the server_backend of
 * router_backend.c: rt__submit does the same admission as engine_submit (I4:
 * a rejected request never reaches a worker), then hands the request to the
 * router's loop thread, here, which owns every worker connection and every
 * request's protocol state (docs/pd-protocol.md section 5):
 *
 *   WAITING --ADMIT--> ADMITTING --GRANT--> PREFILLING --TOKEN--> DECODING
 *      ^                   | DENY NOSPACE / NO_LINK: back to WAITING (retry)
 *      `-------------------'
 *   any phase --> terminal: FINISH from decode, REJECT from prefill, DENY,
 *   client gone, worker lost, T_ttft, queue timeout. The first terminal
 *   event wins; later frames for the req_id are dropped (ids never repeat).
 *
 * Workers: one control connection each (accepted here, role checked on
 * HELLO), REGISTER first (geometry, plane count, KV type and model id must
 * equal the router's: cl_register_refused), then HEALTH every
 * health_interval_ms; three missed answers or a closed
 * connection drop the worker, and every request paired with it ends ABORTED
 * (502) with an ABORT to the surviving worker of the pair, except one whose
 * prefill worker is lost before its first token: that one starts over on
 * another prefill worker (at most RT_MAX_RETRIES times; 502 when none is
 * left). Pairing (router_pair.c): the
 * prefill and decode workers with the fewest requests in flight; among
 * prefill workers at most RT_AFFINITY_SLACK busier than that, the one a
 * rendezvous hash of (domain, first prompt page) prefers, so a tenant's
 * repeated prefix meets the prefill worker whose cache holds it.
 *
 * Tokens: decode sends TOKEN ids; the router detokenizes and applies stop
 * strings exactly as the engine does (a stop match ends the request here and
 * sends ABORT STOP to decode), so clients see the same events as from
 * `kvseal serve`.
 *
 * Echo with prompt logprobs (issue 12): PREFILL carries PD_FLAG_PROMPT_LP,
 * the prefill worker sends the prompt's records in PROMPT_LP messages
 * before its DONE, and the router posts them as the engine's prompt events,
 * in position order, checked against the prompt it holds. Decode's TOKEN
 * and FINISH frames that overtake the last PROMPT_LP (they travel on
 * another connection) are held and replayed after it. max_tokens 0 runs
 * as max_tokens 1 on the workers: the request ends at decode's first
 * TOKEN (ABORT STOP, as a stop string) or FINISH, which is never shown. */
#include "router_int.h"

#include "kvseal/admit.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RT_RETRY_MS 20 /* DENY NOSPACE / NO_LINK: try the queue head again after */
#define RT_MAX_RETRIES 3 /* starts over (stale grant, draining or lost prefill) per request */
#define RT_BUSY_WAIT_MAX_MS 320 /* a BUSY prefill worker: the longest wait before placing again */

// ----------------------------------------------------------------------------
// Request objects

/* Drops q's held decode frames. */
static void rt__held_clear(rt_req *q) {
    while (q->held) {
        rt_held *h = q->held;
        q->held = h->next;
        free(h);
    }
    q->held_tail = NULL;
}

void rt__req_free(rt_req *q) {
    rt__held_clear(q);
    engine_stream_destroy(q->out);
    grammar_unref(q->g);
    free(q->bias);
    free(q->prompt);
    free(q->evec);
    free(q);
}

void rt__unref(rt_req *q) {
    if (atomic_fetch_sub_explicit(&q->refs, 1, memory_order_acq_rel) == 1) rt__req_free(q);
}

// ----------------------------------------------------------------------------
// Request table and terminal states (loop thread)

static rt_req **rt__slot(cluster_router *r, uint64_t id) {
    rt_req **pp = &r->tab[id % RT_BUCKETS];
    while (*pp && (*pp)->id != id) pp = &(*pp)->hnext;
    return pp;
}

static rt_req *rt__find(cluster_router *r, uint64_t id) { return *rt__slot(r, id); }

static rt_worker *rt__worker(cluster_router *r, uint32_t id) {
    if (!id) return NULL;
    for (rt_worker *w = r->workers; w; w = w->next)
        if (w->id == id) return w;
    return NULL;
}

static void rt__send(cluster_router *r, rt_worker *w, uint16_t type, uint64_t req_id,
                     const void *payload, uint32_t len) {
    if (!w || !w->c) return;
    struct iovec iov = {.iov_base = (void *)(uintptr_t)payload, .iov_len = len};
    ks_errbuf eb;
    ks_err e = pd_conn_send(w->c, type, req_id, &iov, len ? 1 : 0, &eb);
    if (e == KS_ERR_AGAIN) {  // control frames are small: the queue only fills if the worker stalls
        ks_log(KS_LOG_WARN, "router: worker %u is not reading; dropping it", w->id);
        pd_conn_close(w->c);
    } else if (e && e != KS_ERR_PEER_CLOSED) {
        ks_log(KS_LOG_WARN, "router: send %s to worker %u: %s", pd_msg_type_name(type), w->id, eb.msg);
    }
    (void)r;
}

static void rt__send_abort(cluster_router *r, uint32_t worker_id, uint64_t req_id, uint32_t reason) {
    uint8_t buf[4];
    uint32_t n = 0;
    pd_msg_abort a = {.reason = reason};
    ks_errbuf eb;
    if (pd_msg_abort_encode(&a, buf, sizeof buf, &n, &eb) == KS_OK)
        rt__send(r, rt__worker(r, worker_id), PD_MSG_ABORT, req_id, buf, n);
}

/* Unlinks q from the wait queue if it is there. */
static void rt__unwait(cluster_router *r, rt_req *q) {
    rt_req **pp = &r->wait_head, *prev = NULL;
    while (*pp && *pp != q) {
        prev = *pp;
        pp = &(*pp)->wnext;
    }
    if (!*pp) return;
    *pp = q->wnext;
    if (r->wait_tail == q) r->wait_tail = prev;
    q->wnext = NULL;
    atomic_fetch_sub(&r->n_waiting, 1);
}

/* Ends q (first terminal event wins): posts the done event, forgets the
 * req_id, drops the loop's reference. Aborts sent by the caller. */
static void rt__end(cluster_router *r, rt_req *q, engine_state to, engine_finish fin, ks_err err,
                    admit_reason reason, const char *msg) {
    if (q->phase == RT_DONE) return;
    if (q->phase == RT_WAITING) rt__unwait(r, q);
    else atomic_fetch_sub(&r->n_inflight, 1);
    rt_worker *d = rt__worker(r, q->d_id), *p = rt__worker(r, q->p_id);
    if (d && q->phase != RT_WAITING && d->inflight) d->inflight--;
    if (p && q->phase != RT_WAITING && q->phase != RT_DECODING && p->inflight) p->inflight--;
    q->phase = RT_DONE;
    rt_req **pp = rt__slot(r, q->id);
    if (*pp == q) *pp = q->hnext;
    atomic_store(&q->state, (int)to);
    atomic_fetch_add(to == ENGINE_FINISHED   ? &r->n_finished
                     : to == ENGINE_REJECTED ? &r->n_rejected
                                             : &r->n_aborted,
                     1);
    engine_outcome o = {.state = to,
                        .finish = fin,
                        .err = err,
                        .reason = (uint16_t)reason,
                        .msg = msg,
                        .n_prompt = q->n_prompt,
                        .n_gen = q->n_gen,
                        .n_cached = q->n_cached,
                        .t_submit_ns = q->t_submit_ns,
                        .t_first_ns = q->t_first_ns,
                        .t_sched_ns = q->t_sched_ns};
    engine_stream_finish(q->out, &o, r->piece, r->piece_cap);
    rt__unref(q);
}

/* Ends q in state to (not a refusal). */
static void rt__finish(cluster_router *r, rt_req *q, engine_state to, engine_finish fin, ks_err err,
                       const char *msg) {
    rt__end(r, q, to, fin, err, ADMIT_OK, msg);
}

/* Ends q REJECTED for reason, with the message the refusing process wrote. */
static void rt__refuse(cluster_router *r, rt_req *q, admit_reason reason, const char *msg) {
    rt__end(r, q, ENGINE_REJECTED, ENGINE_FINISH_ERROR, admit_reason_info(reason)->err, reason,
            msg);
}

/* Ends q ABORTED and tells its paired workers (reason) which were reached. */
void rt__abort(cluster_router *r, rt_req *q, uint32_t reason, ks_err err, const char *msg) {
    if (q->phase == RT_DONE) return;
    if (q->phase >= RT_ADMITTING) rt__send_abort(r, q->d_id, q->id, reason);
    if (q->p_sent && q->phase != RT_DECODING) rt__send_abort(r, q->p_id, q->id, reason);
    rt__finish(r, q, ENGINE_ABORTED, ENGINE_FINISH_ABORT, err, msg);
}

// ----------------------------------------------------------------------------
// Embeddings (loop thread): EMBED to one prefill worker, EMBED_RESULT back

static void rt__refused_at_prefill(cluster_router *r, rt_req *q, rt_worker *p, admit_reason reason,
                                   const char *msg);

/* Sends the waiting embedding q (the queue head) to a prefill worker: false
 * (q waits) when none is registered. p_sent stays false: a prefill worker
 * keeps no state for an embedding once it has answered, so an abort (a
 * client gone, a timeout) is the router's alone and the late answer is
 * dropped as a frame for an unknown req_id. */
static bool rt__embed_start(cluster_router *r, rt_req *q, uint64_t now) {
    rt_worker *p = rt__pick_prefill(r, q);
    if (!p) {
        q->retry_ms = now + RT_RETRY_MS;
        return false;
    }
    pd_msg_embed m = {.pooling = q->pooling, .n_tokens = (uint32_t)q->n_prompt};
    memcpy(m.domain_hash, q->domain, sizeof m.domain_hash);
    uint32_t n = 0;
    ks_errbuf eb;
    uint8_t *buf = NULL;
    if (pd_msg_embed_encode(&m, q->prompt, NULL, 0, &n, &eb) == KS_OK) buf = malloc(n);
    rt__unwait(r, q);
    atomic_fetch_add(&r->n_inflight, 1);
    q->phase = RT_PREFILLING; // counted in flight from here on (rt__end)
    q->p_id = p->id;
    q->t_phase_ms = now;
    p->inflight++;
    if (!buf || pd_msg_embed_encode(&m, q->prompt, buf, n, &n, &eb) != KS_OK) {
        free(buf);
        rt__finish(r, q, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_NOMEM,
                   "internal error: cannot build EMBED");
        return true;
    }
    rt__send(r, p, PD_MSG_EMBED, q->id, buf, n);
    free(buf);
    return true;
}

/* A frame for embedding q: EMBED_RESULT (the vector: q ends FINISHED) or
 * REJECT (a refusal, or a retry for DRAINING) from its prefill worker. */
static void rt__on_embed_frame(cluster_router *r, rt_worker *w, rt_req *q, const pd_frame *f) {
    if (w->id != q->p_id || q->phase != RT_PREFILLING) return; // late or stray: dropped
    ks_errbuf eb;
    if (f->hdr.type == PD_MSG_EMBED_RESULT) {
        pd_msg_embed_result m;
        const uint32_t E = (uint32_t)model_hp(r->models[q->mi].m)->n_embd;
        if (pd_msg_embed_result_decode(f->payload, f->payload_len, &m, &eb) != KS_OK ||
            m.n_embd != E || m.n_tokens != (uint32_t)q->n_prompt) {
            ks_log(KS_LOG_WARN, "router: embedding %" PRIu64 ": bad EMBED_RESULT from worker %u",
                   q->id, w->id);
            rt__finish(r, q, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_PROTO,
                       "internal error: bad embedding from the prefill worker");
            return;
        }
        for (uint32_t i = 0; i < E; i++)
            q->evec[i] = pd_msg_embed_value(&m, i);
        rt__finish(r, q, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
    } else if (f->hdr.type == PD_MSG_REJECT) {
        pd_msg_reject j;
        char msg[PD_MSG_MAX_TEXT + 1];
        if (pd_msg_reject_decode(f->payload, f->payload_len, &j, &eb) != KS_OK) return;
        snprintf(msg, sizeof msg, "%.*s", (int)j.msg_len, j.msg);
        rt__refused_at_prefill(r, q, w, (admit_reason)j.reason, msg);
    }
}

// ----------------------------------------------------------------------------
// Scheduling (loop thread)

/* Sends ADMIT for waiting requests while workers are available: FIFO per
 * model (a model whose head request cannot be placed does not hold up the
 * others' requests). */
static void rt__schedule(cluster_router *r) {
    uint64_t now = cl_now_ms(NULL);
    uint64_t blocked = 0; // bit mi: model mi's head waits (RT_MAX_MODELS bits)
    for (rt_req *q = r->wait_head, *nx; q; q = nx) {
        nx = q->wnext; // (q leaves the queue when it starts)
        const uint64_t bit = 1ull << q->mi;
        if (blocked & bit) continue;
        if (q->retry_ms > now) {
            blocked |= bit;
            continue;
        }
        if (q->embed) {
            if (!rt__embed_start(r, q, now)) blocked |= bit;
            continue;
        }
        const int32_t pt = r->models[q->mi].g.page_tokens;
        uint32_t need = (uint32_t)((q->n_prompt + q->max_tokens + pt - 1) / pt);
        // a decode worker without a link from the prefill side (a partition)
        // would deny it forever while it is the least loaded: skip it once
        rt_worker *p = rt__pick_prefill(r, q), *d = NULL;
        if (p && !(d = rt__pick(r, q->mi, PD_ROLE_DECODE, need, q->avoid_d, p->data_plane)))
            d = rt__pick(r, q->mi, PD_ROLE_DECODE, need, 0, p->data_plane);
        if (!d || !p) {
            q->retry_ms = now + RT_RETRY_MS;  // a worker may (re)register
            blocked |= bit;
            continue;
        }
        pd_msg_admit a = {.n_prompt = (uint32_t)q->n_prompt, .prefill_worker_id = p->id, .s = q->ws};
        memcpy(a.domain_hash, q->domain, sizeof a.domain_hash);
        memcpy(a.model_id, r->models[q->mi].model_id, sizeof a.model_id);
        const size_t cap = PD_MSG_ADMIT_FIXED + (size_t)pd_msg_sext_size(&q->ws);
        uint8_t *buf = malloc(cap);
        uint32_t n = 0;
        ks_errbuf eb;
        ks_errbuf_clear(&eb);
        if (!buf || pd_msg_admit_encode(&a, buf, cap, &n, &eb) != KS_OK) {
            free(buf);
            if (!eb.msg[0]) snprintf(eb.msg, sizeof eb.msg, "out of memory");
            rt__unwait(r, q);
            q->phase = RT_ADMITTING;  // counted in flight for rt__finish
            atomic_fetch_add(&r->n_inflight, 1);
            rt__finish(r, q, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_INTERNAL, eb.msg);
            continue;
        }
        rt__unwait(r, q);
        atomic_fetch_add(&r->n_inflight, 1);
        q->phase = RT_ADMITTING;
        q->d_id = d->id;
        q->p_id = p->id;
        q->t_phase_ms = now;
        d->inflight++;
        p->inflight++;
        rt__send(r, d, PD_MSG_ADMIT, q->id, buf, n);
        free(buf);
    }
}

/* Puts q back at the head of the wait queue (DENY NOSPACE / NO_LINK). */
static void rt__requeue(cluster_router *r, rt_req *q, uint64_t retry_ms) {
    rt_worker *d = rt__worker(r, q->d_id), *p = rt__worker(r, q->p_id);
    if (d && d->inflight) d->inflight--;
    if (p && p->inflight) p->inflight--;
    atomic_fetch_sub(&r->n_inflight, 1);
    q->phase = RT_WAITING;
    q->d_id = q->p_id = 0;
    q->retry_ms = retry_ms;
    q->wnext = r->wait_head;
    r->wait_head = q;
    if (!r->wait_tail) r->wait_tail = q;
    atomic_fetch_add(&r->n_waiting, 1);
}

/* Starts q over under a fresh req_id (the old one is spent at both workers)
 * once wait_ms have passed. */
static void rt__rekey_in(cluster_router *r, rt_req *q, uint32_t wait_ms) {
    rt_req **pp = rt__slot(r, q->id);
    if (*pp == q) *pp = q->hnext;
    q->hnext = NULL;
    q->id = atomic_fetch_add(&r->next_req_id, 1);
    pp = rt__slot(r, q->id);
    *pp = q;
    q->p_sent = false;
    rt__held_clear(q); // (none: held frames follow a complete prefill)
    rt__requeue(r, q, cl_now_ms(NULL) + wait_ms);
}

/* rt__rekey_in after RT_RETRY_MS, counted against RT_MAX_RETRIES. */
static void rt__rekey(cluster_router *r, rt_req *q) {
    q->retries++;
    rt__rekey_in(r, q, RT_RETRY_MS);
}

/* Starts q over on another prefill worker when its prefill worker, or the
 * data link from it to decode, was lost before q's first token (nothing
 * reached the client yet). The old req_id is aborted at both workers: at
 * decode its grant's pages stay in QUARANTINE until that link is closed and
 * drained or prefill acknowledges (I5), and the new attempt gets a fresh
 * grant (I6); no page of the old one is reused. False (q untouched) when
 * q already had a token, used up its retries, or no other prefill worker
 * is left. */
static bool rt__replace_prefill(cluster_router *r, rt_req *q, uint32_t lost, const char *why) {
    if (q->phase != RT_ADMITTING && q->phase != RT_PREFILLING) return false;
    if (q->lp_next) return false; // prompt logprobs already reached the client
    if (q->retries >= RT_MAX_RETRIES || !rt__pick(r, q->mi, PD_ROLE_PREFILL, 0, lost, -1)) return false;
    ks_log(KS_LOG_INFO,
           "router: request %" PRIu64 ": %s (prefill worker %u) before the first token; placing "
           "it on another prefill worker",
           q->id, why, lost);
    rt__send_abort(r, q->d_id, q->id, PD_ABORT_WORKER_LOST);
    if (q->p_sent) rt__send_abort(r, q->p_id, q->id, PD_ABORT_WORKER_LOST);
    q->avoid_p = lost;
    atomic_fetch_add(&r->models[q->mi].n_replaced, 1);
    rt__rekey(r, q);
    return true;
}

void rt__on_submit(void *arg) {
    rt_req *q = arg;
    cluster_router *r = q->r;
    if (atomic_load(&q->cancelled) || atomic_load(&r->stop)) {
        q->phase = RT_WAITING;
        q->wnext = NULL;
        atomic_fetch_add(&r->n_waiting, 1);
        if (r->wait_tail) r->wait_tail->wnext = q;
        else r->wait_head = q;
        r->wait_tail = q;
        rt__finish(r, q, ENGINE_ABORTED, ENGINE_FINISH_ABORT, KS_ERR_CANCELLED, "cancelled");
        return;
    }
    rt_req **pp = rt__slot(r, q->id);
    KS_ASSERT(!*pp);
    *pp = q;
    q->phase = RT_WAITING;
    q->t_phase_ms = cl_now_ms(NULL);
    atomic_fetch_add(&r->n_waiting, 1);
    if (r->wait_tail) r->wait_tail->wnext = q;
    else r->wait_head = q;
    r->wait_tail = q;
    rt__schedule(r);
}

void rt__on_cancel(void *arg) {
    rt_req *q = arg;
    cluster_router *r = q->r;
    if (q->phase != RT_DONE && rt__find(r, q->id) == q)
        rt__abort(r, q, PD_ABORT_CLIENT_GONE, KS_ERR_CANCELLED, "cancelled");
    rt__unref(q);
}

// ----------------------------------------------------------------------------
// Frames from workers (loop thread)

/* PEER for decode worker d to every prefill worker of its model (a data link
 * between two models' workers would be refused: LINK carries the model). */
static void rt__broadcast_peer(cluster_router *r, const rt_worker *d, bool removed) {
    uint8_t buf[8 + PD_MSG_MAX_HOST];
    uint32_t n = 0;
    pd_msg_peer m = {.decode_worker_id = d->id, .port = removed ? 0 : d->data_port, .host = d->host,
                     .host_len = (uint16_t)strlen(d->host)};
    ks_errbuf eb;
    if (pd_msg_peer_encode(&m, buf, sizeof buf, &n, &eb) != KS_OK) return;
    for (rt_worker *w = r->workers; w; w = w->next)
        if (w->id && w->role == PD_ROLE_PREFILL && w->mi == d->mi)
            rt__send(r, w, PD_MSG_PEER, 0, buf, n);
}

/* The catalog entry serving model_id, or -1. */
static int rt__model_of(const cluster_router *r, const uint8_t model_id[32]) {
    for (int i = 0; i < r->n_models; i++)
        if (!memcmp(r->models[i].model_id, model_id, 32)) return i;
    return -1;
}

static void rt__on_register(cluster_router *r, rt_worker *w, const pd_frame *f) {
    pd_msg_register m;
    ks_errbuf eb;
    if (pd_msg_register_decode(f->payload, f->payload_len, &m, &eb) != KS_OK) {
        ks_log(KS_LOG_WARN, "router: %s: %s", pd_conn_peer_addr(w->c), eb.msg);
        cl_error_close(w->c, KS_ERR_PROTO, eb.msg);
        return;
    }
    char why[512] = "";
    int mi = rt__model_of(r, m.model_id);
    if (mi < 0) {
        int k = snprintf(why, sizeof why,
                         "the worker serves a different model (%.*s, model_id %02x%02x%02x%02x..) "
                         "than any in the router's catalog:",
                         m.names_len ? (int)(m.names_len > 128 ? 128 : m.names_len) : 9,
                         m.names_len ? m.names : "no names", m.model_id[0], m.model_id[1],
                         m.model_id[2], m.model_id[3]);
        for (int i = 0; i < r->n_models && k > 0 && (size_t)k < sizeof why; i++)
            k += snprintf(why + k, sizeof why - (size_t)k, "%s %s", i ? "," : "",
                          r->models[i].name);
        ks_log(KS_LOG_WARN, "router: refusing worker at %s: %s", pd_conn_peer_addr(w->c), why);
        cl_error_close(w->c, KS_ERR_INVAL, why);
        return;
    }
    rt_model *md = &r->models[mi];
    if (cl_register_refused(&m, pd_conn_peer_role(w->c), md->model_id, &md->g, md->n_ctx, md->name,
                            why, sizeof why) ||
        rt__adapters_missing(r, mi, m.adapters, m.n_adapters, why, sizeof why)) {
        ks_log(KS_LOG_WARN, "router: refusing worker at %s: %s", pd_conn_peer_addr(w->c), why);
        cl_error_close(w->c, KS_ERR_INVAL, why);
        return;
    }
    free(w->adapters); // (a REGISTER again on this connection: the latest list)
    w->adapters = NULL;
    w->n_adapters = 0;
    if (m.n_adapters) {
        w->adapters = malloc((size_t)m.n_adapters * PD_MSG_ADAPTER_BYTES);
        if (!w->adapters) {
            cl_error_close(w->c, KS_ERR_NOMEM, "router: out of memory");
            return;
        }
        memcpy(w->adapters, m.adapters, (size_t)m.n_adapters * PD_MSG_ADAPTER_BYTES);
        w->n_adapters = m.n_adapters;
    }
    w->id = ++r->next_worker_id;
    w->role = m.role;
    w->mi = mi;
    memcpy(w->host, m.host, m.host_len);
    w->host[m.host_len] = 0;
    w->data_port = m.data_port;
    w->data_plane = m.data_plane;
    w->n_pages = m.n_pages;
    w->n_ctx = m.n_ctx;
    w->free_pages = m.n_pages;
    w->last_ack_ms = cl_now_ms(NULL);
    if ((int32_t)m.n_ctx < md->n_ctx)
        ks_log(KS_LOG_WARN,
               "router: worker %u accepts %u-token contexts, less than the %d advertised for %s: "
               "longer requests it is paired with will be rejected",
               w->id, m.n_ctx, md->n_ctx, md->name);
    pd_msg_register_ack ack = {.worker_id = w->id, .health_interval_ms = r->o.health_interval_ms,
                               .router_id = r->router_id};
    uint8_t buf[16];
    uint32_t n = 0;
    if (pd_msg_register_ack_encode(&ack, buf, sizeof buf, &n, &eb) == KS_OK)
        rt__send(r, w, PD_MSG_REGISTER_ACK, 0, buf, n);
    ks_log(KS_LOG_INFO,
           "router: %s worker %u registered from %s for model %s (%u KV pages, context %u, "
           "data plane %s%s%s:%u)",
           m.role == PD_ROLE_DECODE ? "decode" : "prefill", w->id, pd_conn_peer_addr(w->c),
           md->name, m.n_pages, m.n_ctx, m.data_plane == PD_PLANE_UCX ? "ucx" : "tls",
           m.role == PD_ROLE_DECODE ? ", data link " : "",
           m.role == PD_ROLE_DECODE ? w->host : "", m.role == PD_ROLE_DECODE ? m.data_port : 0);
    if (m.role == PD_ROLE_DECODE) {
        atomic_fetch_add(&r->n_decode, 1);
        atomic_fetch_add(&md->n_decode, 1);
        if (m.n_pages > atomic_load(&md->max_decode_pages)) atomic_store(&md->max_decode_pages, m.n_pages);
        rt__broadcast_peer(r, w, false);
    } else {
        atomic_fetch_add(&r->n_prefill, 1);
        atomic_fetch_add(&md->n_prefill, 1);
        for (rt_worker *d = r->workers; d; d = d->next) {  // tell it every decode worker of its model
            if (!d->id || d->role != PD_ROLE_DECODE || d->mi != mi) continue;
            uint8_t pb[8 + PD_MSG_MAX_HOST];
            uint32_t pn = 0;
            pd_msg_peer pm = {.decode_worker_id = d->id, .port = d->data_port, .host = d->host,
                              .host_len = (uint16_t)strlen(d->host)};
            if (pd_msg_peer_encode(&pm, pb, sizeof pb, &pn, &eb) == KS_OK)
                rt__send(r, w, PD_MSG_PEER, 0, pb, pn);
        }
    }
    rt__schedule(r);
}

bool rt__adapters_missing(cluster_router *r, int mi, const uint8_t *have, uint32_t n, char *why,
                          size_t cap) {
    bool missing = false;
    pthread_mutex_lock(&r->amu);
    for (int i = 0; i < r->n_adapters && !missing; i++) {
        const rt_adapter *a = &r->adapters[i];
        if (a->mi != mi) continue;
        bool held = false;
        for (uint32_t j = 0; j < n && !held; j++)
            held = !memcmp(have + (size_t)j * PD_MSG_ADAPTER_BYTES, a->digest,
                           PD_MSG_ADAPTER_BYTES);
        if (held) continue;
        missing = true;
        char hex[2 * ENGINE_ADAPTER_DIGEST_BYTES + 1];
        cl_hex(a->digest, sizeof a->digest, hex);
        // the digest, never the owner or the name: the worker's operator sees it too
        snprintf(why, cap,
                 "the worker lacks LoRA adapter sha256 %s, which the router's tenants file "
                 "names (start the worker with --lora for that file)",
                 hex);
    }
    pthread_mutex_unlock(&r->amu);
    return missing;
}

/* pd_loop_post callback of cluster_router_adapters_seal: a worker that
 * registered while the tenants file's adapters were still being read is
 * checked again, and refused (closed) when it lacks one. */
void rt__on_adapters_sealed(void *arg) {
    cluster_router *r = arg;
    char why[512];
    for (rt_worker *w = r->workers; w; w = w->next)
        if (w->id && rt__adapters_missing(r, w->mi, w->adapters, w->n_adapters, why, sizeof why)) {
            ks_log(KS_LOG_WARN, "router: refusing worker %u at %s: %s", w->id,
                   pd_conn_peer_addr(w->c), why);
            cl_error_close(w->c, KS_ERR_INVAL, why);
        }
}

/* TOKEN for q: detokenize, stop strings, post. */
static void rt__on_token(cluster_router *r, rt_req *q, const pd_msg_token *t) {
    if (t->token < 0 || t->token >= r->models[q->mi].V) {
        rt__abort(r, q, PD_ABORT_ERROR, KS_ERR_PROTO, "internal error: decode sent a bad token");
        return;
    }
    if (q->phase == RT_PREFILLING) {
        q->phase = RT_DECODING;
        q->t_first_ns = ks_now_ns();
        rt_worker *p = rt__worker(r, q->p_id);
        if (p && p->inflight) p->inflight--;  // prefill's part is over
    }
    sample_result sr;
    memset(&sr, 0, sizeof sr);
    sr.token = t->token;
    sr.logprob = t->logprob;
    sr.n_top = (int)(t->n_top < SAMPLE_MAX_TOP ? t->n_top : SAMPLE_MAX_TOP);
    for (int i = 0; i < sr.n_top; i++) {
        pd_msg_top top = pd_msg_top_at(t->top, (uint32_t)i);
        sr.top_ids[i] = top.id;
        sr.top_logprobs[i] = top.logprob;
    }
    q->n_gen++;
    atomic_fetch_add(&r->tokens_out, 1);
    bool matched = false;
    if (engine_stream_token(q->out, r->models[q->mi].vocab, &sr, r->piece, r->piece_cap, &matched) != KS_OK) {
        rt__abort(r, q, PD_ABORT_ERROR, KS_ERR_NOMEM, "out of memory");
        return;
    }
    if (matched) {
        rt__send_abort(r, q->d_id, q->id, PD_ABORT_STOP);
        rt__finish(r, q, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
    }
}

/* The worker is shutting down gracefully: no new request is paired with it. */
static void rt__set_draining(rt_worker *w) {
    if (w->draining) return;
    w->draining = true;
    ks_log(KS_LOG_INFO, "router: worker %u is draining; no new requests go to it", w->id);
}

/* Prefill refused q (its REJECT, or decode's FINISH that carries it): a
 * stale grant or a draining prefill starts over under a new id (nothing was
 * computed or sent); any other reason is the client's answer. */
static void rt__refused_at_prefill(cluster_router *r, rt_req *q, rt_worker *p, admit_reason reason,
                                   const char *msg) {
    if (reason == ADMIT_DRAINING && p) rt__set_draining(p);
    if (reason == ADMIT_BUSY && p && !q->lp_next) {
        // its KV cache is full of other prompts, whose pages free as their
        // transfers end: place q again (another prefill worker first, if
        // there is one) after a backoff, until the queue timeout (waiting
        // counts from submit), rather than answer 503 while capacity frees
        uint32_t wait = RT_RETRY_MS << (q->busy < 5 ? q->busy : 5);
        if (wait > RT_BUSY_WAIT_MAX_MS) wait = RT_BUSY_WAIT_MAX_MS;
        q->busy++;
        q->avoid_p = p->id;
        ks_log(KS_LOG_INFO,
               "router: request %" PRIu64 ": prefill worker %u is busy (%s); placing it again in "
               "%u ms",
               q->id, p->id, msg, wait);
        rt__rekey_in(r, q, wait);
        return;
    }
    if ((reason == ADMIT_STALE_GRANT || reason == ADMIT_DRAINING) && q->retries < RT_MAX_RETRIES &&
        !q->lp_next) {
        ks_log(KS_LOG_INFO, "router: request %" PRIu64 ": %s at prefill worker %u; retrying", q->id,
               reason == ADMIT_DRAINING ? "draining" : "stale grant", q->p_id);
        rt__rekey(r, q);
        return;
    }
    ks_log(KS_LOG_INFO, "router: request %" PRIu64 " rejected by prefill worker %u: %s", q->id,
           q->p_id, admit_reason_info(reason)->name);
    rt__refuse(r, q, reason, msg);
}

// ----------------------------------------------------------------------------
// Prompt logprobs (echo, loop thread): PROMPT_LP from the prefill worker

static void rt__on_req_frame(cluster_router *r, rt_worker *w, const pd_frame *f);

/* A PROMPT_LP that breaks the protocol (docs/pd-protocol.md section 4): its
 * request, if any, ends (502, nothing of the frame is delivered) and the
 * worker's connection closes with ERROR PROTO, as for any bad frame. */
static void rt__lp_refuse(cluster_router *r, rt_worker *w, uint64_t req_id, rt_req *q,
                          const char *why) {
    ks_log(KS_LOG_WARN, "router: worker %u: PROMPT_LP for request %" PRIu64 ": %s; closing it",
           w->id, req_id, why);
    if (q)
        rt__abort(r, q, PD_ABORT_ERROR, KS_ERR_PROTO,
                  "internal error: bad prompt logprobs from the prefill worker");
    cl_error_close(w->c, KS_ERR_PROTO, why);
}

/* Replays q's held decode frames (after the LAST PROMPT_LP), in arrival
 * order, as if they arrived now. */
static void rt__held_replay(cluster_router *r, rt_req *q) {
    atomic_fetch_add(&q->refs, 1); // a replayed frame may end q
    while (q->held && q->phase != RT_DONE) {
        rt_held *h = q->held;
        q->held = h->next;
        if (!q->held) q->held_tail = NULL;
        rt_worker *d = rt__worker(r, q->d_id);
        pd_frame f = {.hdr = {.type = h->type, .req_id = q->id, .len = h->len},
                      .payload = h->len ? h->payload : NULL,
                      .payload_len = h->len};
        if (d) rt__on_req_frame(r, d, &f);
        free(h);
    }
    rt__unref(q);
}

/* PROMPT_LP from worker w for q (NULL: no such request in flight). Only q's
 * own prefill worker, for a request that asked for prompt logprobs, while
 * it prefills, may send it, and every record is checked against the prompt
 * the router holds before any is posted: position order without gap, the
 * prompt's token at each position, the agreed number of alternatives, ids
 * in the vocabulary, LAST exactly at the prompt's end. A late frame (q
 * ended: ids never repeat) is dropped. */
static void rt__on_prompt_lp(cluster_router *r, rt_worker *w, rt_req *q, const pd_frame *f) {
    char why[256];
    if (!q) {
        if (f->hdr.req_id < r->first_req_id || f->hdr.req_id >= atomic_load(&r->next_req_id))
            rt__lp_refuse(r, w, f->hdr.req_id, NULL, "a request id the router never issued");
        return; // it ended already: dropped, not delivered
    }
    if (q->embed || !q->echo_lp || w->id != q->p_id || !q->p_sent || q->phase != RT_PREFILLING ||
        q->lp_done) {
        rt__lp_refuse(r, w, f->hdr.req_id, q->p_id == w->id ? q : NULL,
                      q->embed || !q->echo_lp ? "the request did not ask for prompt logprobs"
                      : w->id != q->p_id      ? "the request is not this worker's"
                      : q->lp_done            ? "records after the last PROMPT_LP"
                                              : "the request is not being prefilled");
        return;
    }
    pd_msg_prompt_lp m;
    ks_errbuf eb;
    if (pd_msg_prompt_lp_decode(f->payload, f->payload_len, &m, &eb) != KS_OK) {
        rt__lp_refuse(r, w, f->hdr.req_id, q, eb.msg);
        return;
    }
    const uint32_t n_prompt = (uint32_t)q->n_prompt, next = q->lp_next ? q->lp_next : 1;
    const bool last = (m.flags & PD_PROMPT_LP_LAST) != 0;
    why[0] = 0;
    if (m.first_pos != next)
        snprintf(why, sizeof why, "records start at position %u, expected %u", m.first_pos, next);
    else if ((uint64_t)m.first_pos + m.n_records > n_prompt)
        snprintf(why, sizeof why, "records up to position %u of a %u-token prompt",
                 m.first_pos + m.n_records - 1, n_prompt);
    else if (last != (m.first_pos + m.n_records == n_prompt))
        snprintf(why, sizeof why, "LAST %s at position %u of %u", last ? "set" : "missing",
                 m.first_pos + m.n_records, n_prompt);
    else if (m.n_top != q->lp_top)
        snprintf(why, sizeof why, "%u alternatives per record, expected %u", m.n_top, q->lp_top);
    for (uint32_t i = 0; !why[0] && i < m.n_records; i++) {
        int32_t tok;
        float lp;
        pd_msg_prompt_lp_record(&m, i, &tok, &lp);
        if (tok != q->prompt[m.first_pos + i])
            snprintf(why, sizeof why, "position %u: token %d is not the prompt's", m.first_pos + i,
                     (int)tok);
        for (uint32_t k = 0; !why[0] && k < m.n_top; k++) {
            pd_msg_top t = pd_msg_prompt_lp_top(&m, i, k);
            if (t.id < 0 || t.id >= r->models[q->mi].V)
                snprintf(why, sizeof why, "position %u: alternative id %d out of range",
                         m.first_pos + i, (int)t.id);
        }
    }
    if (why[0]) {
        rt__lp_refuse(r, w, f->hdr.req_id, q, why);
        return;
    }
    engine_event ev;
    if (q->lp_next == 0) { // prompt token 0: no logprob (OpenAI's null), as the engine posts it
        memset(&ev, 0, sizeof ev);
        ev.prompt = ev.no_logprob = true;
        ev.token = ev.sr.token = q->prompt[0];
        engine_stream_post(q->out, &ev);
    }
    for (uint32_t i = 0; i < m.n_records; i++) {
        memset(&ev, 0, sizeof ev);
        ev.prompt = true;
        pd_msg_prompt_lp_record(&m, i, &ev.token, &ev.sr.logprob);
        ev.sr.token = ev.token;
        ev.sr.n_top = (int)m.n_top;
        for (uint32_t k = 0; k < m.n_top; k++) {
            pd_msg_top t = pd_msg_prompt_lp_top(&m, i, k);
            ev.sr.top_ids[k] = t.id;
            ev.sr.top_logprobs[k] = t.logprob;
        }
        engine_stream_post(q->out, &ev);
    }
    q->lp_next = m.first_pos + m.n_records;
    if (!last) return;
    q->lp_done = true;
    rt__held_replay(r, q);
}

/* Holds a decode frame of q that overtook the LAST PROMPT_LP; false (q
 * ended) when out of memory. */
static bool rt__hold(cluster_router *r, rt_req *q, const pd_frame *f) {
    rt_held *h = malloc(sizeof *h + f->payload_len);
    if (!h) {
        rt__abort(r, q, PD_ABORT_ERROR, KS_ERR_NOMEM, "out of memory");
        return false;
    }
    h->next = NULL;
    h->type = f->hdr.type;
    h->len = f->payload_len;
    if (f->payload_len) memcpy(h->payload, f->payload, f->payload_len);
    if (q->held_tail)
        q->held_tail->next = h;
    else
        q->held = h;
    q->held_tail = h;
    return true;
}

// ----------------------------------------------------------------------------
// Request frames (loop thread)

static void rt__on_req_frame(cluster_router *r, rt_worker *w, const pd_frame *f) {
    rt_req *q = rt__find(r, f->hdr.req_id);
    uint16_t type = f->hdr.type;
    if (type == PD_MSG_PROMPT_LP) {
        rt__on_prompt_lp(r, w, q, f);
        return;
    }
    if (!q) return;  // terminal already (or never ours): dropped
    if (q->embed) {
        rt__on_embed_frame(r, w, q, f);
        return;
    }
    ks_errbuf eb;
    bool from_d = w->id == q->d_id, from_p = w->id == q->p_id;
    char msg[PD_MSG_MAX_TEXT + 1];
    if (type == PD_MSG_GRANT && from_d && q->phase == RT_ADMITTING) {
        pd_msg_grant g;
        if (pd_msg_grant_decode(f->payload, f->payload_len, &g, &eb) != KS_OK ||
            g.n_prompt != (uint32_t)q->n_prompt) {
            ks_log(KS_LOG_WARN, "router: request %" PRIu64 ": bad GRANT from worker %u", q->id, w->id);
            rt__abort(r, q, PD_ABORT_ERROR, KS_ERR_PROTO, "internal error: bad grant");
            return;
        }
        if (!q->t_sched_ns) q->t_sched_ns = ks_now_ns();
        pd_msg_prefill p = {.decode_worker_id = q->d_id, .n_prompt = (uint32_t)q->n_prompt, .s = q->ws,
                            .grant = f->payload, .grant_len = f->payload_len};
        memcpy(p.domain_hash, q->domain, sizeof p.domain_hash);
        uint64_t size =
            pd_msg_prefill_size(f->payload_len, (uint32_t)q->n_prompt) + pd_msg_sext_size(&q->ws);
        uint8_t *buf = size <= PD_MSG_PREFILL_MAX ? malloc((size_t)size) : NULL;
        uint32_t n = 0;
        if (!buf || pd_msg_prefill_encode(&p, q->prompt, buf, (size_t)size, &n, &eb) != KS_OK) {
            free(buf);
            rt__abort(r, q, PD_ABORT_ERROR, KS_ERR_NOMEM, "internal error: cannot build PREFILL");
            return;
        }
        q->phase = RT_PREFILLING;
        q->p_sent = true;
        rt__send(r, rt__worker(r, q->p_id), PD_MSG_PREFILL, q->id, buf, n);
        free(buf);
    } else if (type == PD_MSG_DENY && from_d && q->phase == RT_ADMITTING) {
        pd_msg_deny d;
        if (pd_msg_deny_decode(f->payload, f->payload_len, &d, &eb) != KS_OK) return;
        snprintf(msg, sizeof msg, "%.*s", (int)d.msg_len, d.msg);
        if (d.reason == PD_DENY_DRAINING) rt__set_draining(w);  // pair it elsewhere from now on
        if (d.reason == PD_DENY_NO_LINK) q->avoid_d = w->id;
        if (d.reason == PD_DENY_NOSPACE || d.reason == PD_DENY_NO_LINK || d.reason == PD_DENY_DRAINING) {
            rt__requeue(r, q, cl_now_ms(NULL) + RT_RETRY_MS);
        } else { // CONTEXT: decode's n_ctx is below the router's; INVALID: its grammar or
                 // bias does not compile there; DUPLICATE, MODEL (paired with another
                 // model's decode worker, which kept its pages to itself): a router bug
            if (d.reason == PD_DENY_MODEL)
                ks_log(KS_LOG_ERROR, "router: request %" PRIu64 ": decode worker %u refused it: %s",
                       q->id, w->id, msg);
            rt__refuse(r, q,
                       d.reason == PD_DENY_CONTEXT   ? ADMIT_CONTEXT_LENGTH
                       : d.reason == PD_DENY_INVALID ? ADMIT_INVALID
                                                     : ADMIT_INTERNAL,
                       msg);
        }
    } else if (type == PD_MSG_REJECT && from_p && q->phase == RT_PREFILLING) {
        pd_msg_reject j;
        if (pd_msg_reject_decode(f->payload, f->payload_len, &j, &eb) != KS_OK) return;
        snprintf(msg, sizeof msg, "%.*s", (int)j.msg_len, j.msg);
        // decode frees the grant on prefill's REJECT (F3) if it got it; if
        // prefill could not reach decode (a link just re-established), the
        // ABORT makes decode quarantine and free it now instead of at T_grant
        rt__send_abort(r, q->d_id, q->id, PD_ABORT_ERROR);
        rt__refused_at_prefill(r, q, w, (admit_reason)j.reason, msg);
    } else if (type == PD_MSG_TOKEN && from_d &&
               (q->phase == RT_PREFILLING || q->phase == RT_DECODING)) {
        pd_msg_token t;
        if (pd_msg_token_decode(f->payload, f->payload_len, &t, &eb) != KS_OK) return;
        if (q->echo_lp && !q->lp_done) { // the prompt's records first
            (void)rt__hold(r, q, f);
        } else if (q->prompt_only) { // max_tokens 0: the prompt was all it asked for
            rt__send_abort(r, q->d_id, q->id, PD_ABORT_STOP);
            rt__finish(r, q, ENGINE_FINISHED, ENGINE_FINISH_LENGTH, KS_OK, NULL);
        } else {
            rt__on_token(r, q, &t);
        }
    } else if (type == PD_MSG_FINISH && from_d && q->phase != RT_WAITING) {
        pd_msg_finish fin;
        if (pd_msg_finish_decode(f->payload, f->payload_len, &fin, &eb) != KS_OK) return;
        bool ok = fin.finish == PD_FINISH_STOP || fin.finish == PD_FINISH_LENGTH;
        if (ok && q->echo_lp && !q->lp_done) { // a normal end waits for the prompt's records
            (void)rt__hold(r, q, f);
            return;
        }
        snprintf(msg, sizeof msg, "%.*s", (int)fin.msg_len, fin.msg);
        q->n_cached = fin.n_cached <= (uint32_t)q->n_prompt ? (int32_t)fin.n_cached : 0;
        if (ok) {
            rt__finish(r, q, ENGINE_FINISHED,
                       fin.finish == PD_FINISH_STOP && !q->prompt_only ? ENGINE_FINISH_STOP
                                                                       : ENGINE_FINISH_LENGTH,
                       KS_OK, NULL);
        } else if (fin.reason && q->phase == RT_PREFILLING) {
            // decode saw prefill's REJECT first (F3; it freed the grant): the
            // outcome is the REJECT's, whichever of the two frames is first
            rt__refused_at_prefill(r, q, rt__worker(r, q->p_id), (admit_reason)fin.reason, msg);
        } else if (fin.reason) { // decode refused to adopt it (offline, batch full, ...)
            rt__refuse(r, q, (admit_reason)fin.reason, msg);
        } else {
            ks_err e = fin.err > 0 && fin.err < KS_ERR__COUNT ? (ks_err)fin.err : KS_ERR_INTERNAL;
            // decode lost the data link from prefill (it freed the grant on
            // the drained link, F5): usually the prefill worker died and its
            // control connection's close is still on the way
            if (e == KS_ERR_PEER_CLOSED &&
                rt__replace_prefill(r, q, q->p_id, "data link to decode lost"))
                return;
            if (q->p_sent && q->phase != RT_DECODING) rt__send_abort(r, q->p_id, q->id, PD_ABORT_ERROR);
            rt__finish(r, q, ENGINE_ABORTED,
                       fin.finish == PD_FINISH_ABORT ? ENGINE_FINISH_ABORT : ENGINE_FINISH_ERROR, e,
                       msg[0] ? msg : "the request failed on the decode worker");
        }
    }
    // anything else (wrong sender, wrong phase) is a late or duplicate frame: dropped
}

static void rt__on_check_ack(cluster_router *r, rt_worker *w, const pd_frame *f) {
    pd_msg_pool_check_ack a;
    ks_errbuf eb;
    if (f->hdr.req_id != r->check_id || !w->check_pending ||
        pd_msg_pool_check_ack_decode(f->payload, f->payload_len, &a, &eb) != KS_OK)
        return;
    w->check = a;
    w->check_pending = false;
}

static void rt__on_frame(pd_conn *c, void *ud, const pd_frame *f) {
    rt_worker *w = ud;
    cluster_router *r = w->r;
    uint16_t type = f->hdr.type;
    if (!w->id) {  // the first frame must be REGISTER
        if (type == PD_MSG_REGISTER) rt__on_register(r, w, f);
        else cl_error_close(w->c, KS_ERR_PROTO, "the first frame must be REGISTER");
        return;
    }
    ks_errbuf eb;
    switch (type) {
    case PD_MSG_HEALTH_ACK: {
        pd_msg_health_ack a;
        if (pd_msg_health_ack_decode(f->payload, f->payload_len, &a, &eb) != KS_OK) break;
        if (a.seq > w->acked_seq && a.seq <= w->health_seq) {
            w->acked_seq = a.seq;
            w->last_ack_ms = cl_now_ms(NULL);
            w->active = a.active_requests;
            w->free_pages = a.free_pages;
            w->quarantined = a.quarantined_pages;
            if (a.flags & PD_HEALTH_DRAINING) rt__set_draining(w);
        }
        break;
    }
    case PD_MSG_POOL_CHECK_ACK: rt__on_check_ack(r, w, f); break;
    case PD_MSG_ERROR: {
        pd_msg_error m;
        if (pd_msg_error_decode(f->payload, f->payload_len, &m, &eb) == KS_OK)
            ks_log(KS_LOG_WARN, "router: worker %u reports: %.*s", w->id, (int)m.msg_len, m.msg);
        pd_conn_close(c);
        break;
    }
    case PD_MSG_REGISTER: cl_error_close(w->c, KS_ERR_PROTO, "REGISTER sent twice"); break;
    default: rt__on_req_frame(r, w, f); break;
    }
    rt__schedule(r);
}

static void rt__on_open(pd_conn *c, void *ud) {
    cluster_router *r = ud;
    rt_worker *w = calloc(1, sizeof *w);
    if (!w) {
        pd_conn_close(c);
        return;
    }
    w->r = r;
    w->c = c;
    w->role = pd_conn_peer_role(c);
    w->next = r->workers;
    r->workers = w;
    pd_conn_set_ud(c, w);
}

/* The worker's connection is gone: every request paired with it ends (502),
 * the surviving worker of each pair gets ABORT WORKER_LOST (section 7); a
 * request that lost its prefill worker before its first token is placed on
 * another one instead while there is one (issue 8). */
static void rt__on_close(pd_conn *c, void *ud, ks_err why, const char *msg) {
    (void)c;
    rt_worker *w = ud;  // on_close follows on_open only, so ud is the worker
    cluster_router *r = w->r;
    w->c = NULL;        // nothing more goes to it
    rt_worker **pp = &r->workers;
    while (*pp && *pp != w) pp = &(*pp)->next;
    if (*pp) *pp = w->next;
    if (w->id) {
        if (w->draining && w->inflight == 0)
            ks_log(KS_LOG_INFO, "router: %s worker %u left after draining",
                   w->role == PD_ROLE_DECODE ? "decode" : "prefill", w->id);
        else
            ks_log(KS_LOG_WARN, "router: %s worker %u lost (%s: %s)",
                   w->role == PD_ROLE_DECODE ? "decode" : "prefill", w->id, ks_err_name(why), msg);
        if (w->role == PD_ROLE_DECODE) {
            atomic_fetch_sub(&r->n_decode, 1);
            atomic_fetch_sub(&r->models[w->mi].n_decode, 1);
            rt__broadcast_peer(r, w, true);
            uint32_t mx = 0;
            for (rt_worker *d = r->workers; d; d = d->next)
                if (d != w && d->id && d->role == PD_ROLE_DECODE && d->mi == w->mi && d->n_pages > mx)
                    mx = d->n_pages;
            atomic_store(&r->models[w->mi].max_decode_pages, mx);
        } else {
            atomic_fetch_sub(&r->n_prefill, 1);
            atomic_fetch_sub(&r->models[w->mi].n_prefill, 1);
            // decode refuses a second link for a worker id until the router retires it
            pd_msg_link m = {.prefill_worker_id = w->id, .router_id = r->router_id};
            memcpy(m.model_id, r->models[w->mi].model_id, sizeof m.model_id);
            uint8_t buf[PD_MSG_LINK_LEN];
            uint32_t n = 0;
            if (pd_msg_link_encode(&m, buf, sizeof buf, &n, NULL) == KS_OK)
                for (rt_worker *d = r->workers; d; d = d->next)
                    if (d->id && d->role == PD_ROLE_DECODE && d->mi == w->mi)
                        rt__send(r, d, PD_MSG_RETIRE, 0, buf, n);
        }
        for (int b = 0; b < RT_BUCKETS; b++) {
            for (rt_req *q = r->tab[b], *nx; q; q = nx) {
                nx = q->hnext;
                if (q->phase == RT_WAITING) continue;
                bool on_d = q->d_id == w->id, on_p = q->p_id == w->id && q->phase != RT_DECODING;
                if (!on_d && !on_p) continue;
                // (w is unlinked already: no ABORT goes to it, no count of it changes)
                if (on_p && !on_d && rt__replace_prefill(r, q, w->id, "prefill worker lost"))
                    continue;
                if (on_d) q->d_id = 0;
                if (on_p) q->p_id = 0;
                rt__abort(r, q, PD_ABORT_WORKER_LOST, KS_ERR_PEER_CLOSED,
                          on_d ? "the decode worker serving this request was lost"
                               : "the prefill worker serving this request was lost");
            }
        }
    }
    free(w->adapters);
    free(w);
}

// ----------------------------------------------------------------------------
// Timers (loop thread)

static void rt__tick(cluster_router *r) {
    uint64_t now = cl_now_ms(NULL);
    // health: HEALTH every interval; three intervals without an answer drop the worker
    if (now - r->last_health_ms >= r->o.health_interval_ms) {
        r->last_health_ms = now;
        for (rt_worker *w = r->workers; w; w = w->next) {
            if (!w->id || !w->c) continue;
            if (w->draining && w->inflight == 0) {  // nothing can reach it any more: let it go
                ks_log(KS_LOG_INFO, "router: worker %u drained; releasing it", w->id);
                pd_conn_close_flush(w->c);
                continue;
            }
            if (now - w->last_ack_ms > 3ull * r->o.health_interval_ms) {
                ks_log(KS_LOG_WARN, "router: worker %u missed 3 health checks; dropping it", w->id);
                pd_conn_close(w->c);
                continue;
            }
            pd_msg_health h = {.seq = ++w->health_seq};
            uint8_t buf[8];
            uint32_t n = 0;
            ks_errbuf eb;
            if (pd_msg_health_encode(&h, buf, sizeof buf, &n, &eb) == KS_OK)
                rt__send(r, w, PD_MSG_HEALTH, 0, buf, n);
        }
    }
    // queue and first-token timeouts
    for (int b = 0; b < RT_BUCKETS; b++) {
        for (rt_req *q = r->tab[b], *nx; q; q = nx) {
            nx = q->hnext;
            uint64_t age = now - q->t_phase_ms;
            // waiting counts from submit: a request DENYed again and again still times out
            uint64_t waited = now - q->t_submit_ns / 1000000u;
            if (q->phase == RT_WAITING && waited > r->o.queue_timeout_ms)
                rt__finish(r, q, ENGINE_ABORTED, ENGINE_FINISH_ABORT, KS_ERR_TIMEOUT,
                           "timed out waiting for KV capacity");
            else if ((q->phase == RT_ADMITTING || q->phase == RT_PREFILLING) &&
                     age > r->o.ttft_timeout_ms) {
                rt__send_abort(r, q->d_id, q->id, PD_ABORT_TIMEOUT);
                if (q->p_sent) rt__send_abort(r, q->p_id, q->id, PD_ABORT_TIMEOUT);
                rt__finish(r, q, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_TIMEOUT,  // 504
                           "timed out waiting for the first token");
            }
        }
    }
    // gauges for /metrics
    uint32_t fr = 0, qu = 0, tot = 0;
    for (rt_worker *w = r->workers; w; w = w->next)
        if (w->id && w->role == PD_ROLE_DECODE) {
            fr += w->free_pages;
            qu += w->quarantined;
            tot += w->n_pages;
        }
    atomic_store(&r->kv_free, fr);
    atomic_store(&r->kv_quarantined, qu);
    atomic_store(&r->kv_total, tot);
    rt__schedule(r);
}

// ----------------------------------------------------------------------------
// Cluster-wide pool check (admin route, leak suite)

static void rt__on_check(void *arg) {
    cluster_router *r = arg;
    r->check_id++;
    for (rt_worker *w = r->workers; w; w = w->next) {
        w->check_pending = w->id && w->c;
        if (w->check_pending) rt__send(r, w, PD_MSG_POOL_CHECK, r->check_id, NULL, 0);
    }
}

/* Answers the caller of rt__check_quiescent once every worker replied (or
 * after 2 s: a silent worker makes the check fail). */
static void rt__check_progress(cluster_router *r, uint64_t started_ms) {
    pthread_mutex_lock(&r->mu);
    if (r->check_state != 1) {
        pthread_mutex_unlock(&r->mu);
        return;
    }
    pthread_mutex_unlock(&r->mu);
    bool pending = false;
    for (rt_worker *w = r->workers; w; w = w->next) pending |= w->check_pending;
    if (pending && cl_now_ms(NULL) - started_ms < 2000) return;
    bool clean = true, busy = atomic_load(&r->n_inflight) + atomic_load(&r->n_waiting) > 0;
    char msg[512];
    size_t off = 0;
    msg[0] = 0;
    for (rt_worker *w = r->workers; w; w = w->next) {
        if (!w->id) continue;
        const pd_msg_pool_check_ack *a = &w->check;
        bool ok = !w->check_pending && a->clean;
        busy |= !w->check_pending && a->active > 0;
        clean &= ok;
        if (off < sizeof msg)
            off += (size_t)snprintf(msg + off, sizeof msg - off,
                                    "%s%s worker %u: %s", off ? "; " : "",
                                    w->role == PD_ROLE_DECODE ? "decode" : "prefill", w->id,
                                    w->check_pending ? "no answer"
                                    : ok ? "all pages free and scrubbed"
                                         : "NOT all free and scrubbed");
        if (!w->check_pending && off < sizeof msg)
            off += (size_t)snprintf(msg + off, sizeof msg - off,
                                    " (%u free, %u allocated, %u ready, %u quarantined, %u active)",
                                    a->free_pages, a->allocated, a->ready, a->quarantined, a->active);
        w->check_pending = false;
    }
    pthread_mutex_lock(&r->mu);
    r->check_clean = clean;
    r->check_busy = busy;
    snprintf(r->check_msg, sizeof r->check_msg, "%s", off ? msg : "no workers registered");
    r->check_state = 2;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

// ----------------------------------------------------------------------------
// The loop thread

static void *rt__main(void *arg) {
    cluster_router *r = arg;
    uint64_t check_started = 0, check_seen = 0;
    while (!atomic_load(&r->stop)) {
        ks_err e = pd_loop_run_once(r->loop, 10);
        if (e) ks_log(KS_LOG_ERROR, "router: event loop: %s", ks_err_name(e));
        rt__tick(r);
        pthread_mutex_lock(&r->mu);
        int st = r->check_state;
        uint64_t req = r->check_req;
        pthread_mutex_unlock(&r->mu);
        if (st == 1 && req != check_seen) {
            check_seen = req;
            check_started = cl_now_ms(NULL);
            rt__on_check(r);
        }
        if (st == 1) rt__check_progress(r, check_started);
    }
    // shutdown: every request in flight ends, its workers are told
    for (int b = 0; b < RT_BUCKETS; b++)
        for (rt_req *q = r->tab[b], *nx; q; q = nx) {
            nx = q->hnext;
            rt__abort(r, q, PD_ABORT_SHUTDOWN, KS_ERR_CANCELLED, "the router is shutting down");
        }
    for (int i = 0; i < 20; i++)  // flush the aborts
        if (pd_loop_run_once(r->loop, 5) != KS_OK) break;
    return NULL;
}

// ----------------------------------------------------------------------------
// Lifecycle

void cluster_router_opts_default(cluster_router_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->page_tokens = 16;
    engine_opts d; // the engine's default KV type is the only copy of it
    engine_opts_default(&d);
    o->kv_type = d.kv_type;
    o->health_interval_ms = 1000;
    o->queue_timeout_ms = 30000;
    o->queue_max = 64;
    o->ttft_timeout_ms = 60000;
}

static void rt__free(cluster_router *r) {
    pd_loop_destroy(r->loop);  // closes every conn (their on_close frees the workers)
    while (r->workers) {       // never opened ones
        rt_worker *w = r->workers;
        r->workers = w->next;
        free(w->adapters);
        free(w);
    }
    free(r->piece);
    free(r->models);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->amu);
    if (r->adapters) sodium_memzero(r->adapters, (size_t)r->cap_adapters * sizeof *r->adapters);
    free(r->adapters); // (tenants' adapter names)
    sodium_memzero(r->secret, sizeof r->secret);
    free(r);
}

/* The first request id of this router: the wall clock in microseconds.
 * Workers remember every id they served and refuse one again (ids are never
 * reused, docs/pd-protocol.md), so a restarted router must not start over at
 * 1: it starts past every id its predecessor issued, unless that one issued
 * more than a million a second or the clock went back. Microseconds keep ids
 * under 2^53 (exact as JSON numbers) until the year 2255. */
/* A random 64-bit start below 2^62 (never 0, no wrap in any lifetime): ids
 * stay unique across routers (decode and prefill see several) and across a
 * restart. The clock in microseconds was not: two routers started a
 * millisecond apart collided after 1000 requests. */
static uint64_t rt__first_req_id(void) {
    uint64_t v = 0;
    while (v == 0) {
        randombytes_buf(&v, sizeof v);
        v >>= 2;
    }
    return v;
}

ks_err cluster_router_create(const cluster_router_opts *o, cluster_router **out, ks_errbuf *eb) {
    *out = NULL;
    if (!o->m || !o->secret || o->secret_len < 16 || o->secret_len > 256 || o->n_ctx < 1 ||
        o->page_tokens < 1 || o->health_interval_ms < 1 || o->queue_max < 1 || o->n_more < 0 ||
        o->n_more >= RT_MAX_MODELS || (o->n_more && !o->more))
        return ks_seterr(eb, KS_ERR_INVAL, "router: invalid options (model, secret of 16-256 bytes, "
                                           "context, page tokens and health interval are required; "
                                           "at most %d models)", RT_MAX_MODELS);
    for (int i = 0; i < o->n_more; i++)
        if (!o->more[i].m || o->more[i].n_ctx < 0)
            return ks_seterr(eb, KS_ERR_INVAL, "router: catalog entry %d has no model", i + 1);
    cluster_router *r = calloc(1, sizeof *r);
    if (!r) return ks_seterr(eb, KS_ERR_NOMEM, "router");
    r->o = *o;
    r->o.more = NULL; // borrowed only here: the catalog below keeps what it needs
    r->n_models = 1 + o->n_more;
    r->models = calloc((size_t)r->n_models, sizeof *r->models);
    memcpy(r->secret, o->secret, o->secret_len);
    r->secret_len = o->secret_len;
    r->o.secret = r->secret;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->amu, NULL);
    pthread_cond_init(&r->cv, NULL);
    do randombytes_buf(&r->router_id, sizeof r->router_id);
    while (r->router_id == 0);
    r->first_req_id = rt__first_req_id();
    atomic_init(&r->next_req_id, r->first_req_id);
    atomic_init(&r->online, true);
    ks_err err;
    if (!r->models) {
        err = ks_seterr(eb, KS_ERR_NOMEM, "router");
        goto fail;
    }
    for (int i = 0; i < r->n_models; i++) {
        rt_model *md = &r->models[i];
        const cluster_router_model *cm = i ? &o->more[i - 1] : NULL;
        md->m = i ? cm->m : o->m;
        md->vocab = model_vocab(md->m);
        md->V = model_hp(md->m)->n_vocab;
        md->g = model_kv_geom(md->m, o->page_tokens, o->kv_type);
        md->n_ctx = i && cm->n_ctx > 0 ? cm->n_ctx : o->n_ctx;
        cluster_model_id(md->m, md->model_id);
        snprintf(md->name, sizeof md->name, "%s",
                 (i ? cm->name : o->name) ? (i ? cm->name : o->name) : "model");
        atomic_init(&md->online, true);
        for (int k = 0; k < i; k++)
            if (!memcmp(r->models[k].model_id, md->model_id, sizeof md->model_id)) {
                err = ks_seterr(eb, KS_ERR_INVAL, "router: %s and %s are the same model (model_id)",
                                r->models[k].name, md->name);
                goto fail;
            }
        size_t cap = tok_stream_bound(md->vocab);
        if (cap > r->piece_cap) r->piece_cap = cap;
    }
    r->fault_mispair = false;
#ifdef KS_TEST_FAULTS
    {
        const char *f = getenv("KS_ROUTER_FAULT");
        r->fault_mispair = f && !strcmp(f, "mispair");
        if (r->fault_mispair)
            ks_log(KS_LOG_WARN, "router: TEST FAULT mispair: requests go to other models' decode "
                                "workers");
    }
#endif
    r->piece = malloc(r->piece_cap);
    if (!r->piece) {
        err = ks_seterr(eb, KS_ERR_NOMEM, "router");
        goto fail;
    }
    // what workers may send on a control connection
    if ((err = pd_msg_type_max(NULL, r->type_max, eb))) goto fail;
    static const uint16_t allowed[] = {PD_MSG_REGISTER,     PD_MSG_HEALTH_ACK,     PD_MSG_GRANT,
                                       PD_MSG_DENY,         PD_MSG_REJECT,         PD_MSG_TOKEN,
                                       PD_MSG_FINISH,       PD_MSG_POOL_CHECK_ACK, PD_MSG_ERROR,
                                       PD_MSG_EMBED_RESULT, PD_MSG_PROMPT_LP};
    uint32_t keep[PD_MSG_N_TYPES];
    memcpy(keep, r->type_max, sizeof keep);
    for (uint32_t t = 0; t < PD_MSG_N_TYPES; t++) r->type_max[t] = PD_TYPE_FORBIDDEN;
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++) r->type_max[allowed[i]] = keep[allowed[i]];
    pd_loop_cfg lc = {.secret = r->secret, .secret_len = r->secret_len, .role = PD_ROLE_ROUTER,
                      .max_payload = PD_MSG_MAX_FRAME, .insecure_plaintext = r->o.insecure_plaintext};
    if ((err = pd_loop_create(&lc, &r->loop, eb))) goto fail;
    pd_conn_cbs cbs = {.on_open = rt__on_open, .on_frame = rt__on_frame, .on_close = rt__on_close,
                       .type_max = r->type_max, .n_types = PD_MSG_N_TYPES,
                       .peer_roles = (1u << PD_ROLE_PREFILL) | (1u << PD_ROLE_DECODE)};
    if ((err = pd_tcp_listen(r->loop, o->host, (uint16_t)o->port, &cbs, r, &r->ls, eb))) goto fail;
    r->port = pd_listener_port(r->ls);
    r->last_health_ms = cl_now_ms(NULL);
    if (pthread_create(&r->thread, NULL, rt__main, r) != 0) {
        err = ks_seterr(eb, KS_ERR_NOMEM, "router: cannot start the loop thread");
        goto fail;
    }
    *out = r;
    return KS_OK;
fail:
    rt__free(r);
    return err;
}

int cluster_router_port(const cluster_router *r) { return r->port; }

void cluster_router_destroy(cluster_router *r) {
    if (!r) return;
    atomic_store(&r->stop, true);
    pd_loop_stop(r->loop);
    pthread_join(r->thread, NULL);
    rt__free(r);
}
