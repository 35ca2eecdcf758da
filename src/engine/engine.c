/* engine.c — the continuous-batching scheduler (see engine.h): the fair
 * queue, the step, the scheduler thread and the engine's lifecycle. Request
 * objects, admission (I4) and a request's end are in request.c, grammar
 * masks in mask.c; engine_int.h holds the layout they share.
 *
 * Threads: callers run engine_submit / engine_req_next / _cancel; one
 * scheduler thread owns the pool, the prefix cache, the model context and
 * every sequence. They meet at two places only: the engine's incoming queue
 * (e->mu) and each request's event stream (engine_stream, stream.c).
 *
 * Scheduling, one step: retire cancelled / timed-out requests; admit waiting
 * requests while their pages fit, the oldest of the tenant with the fewest
 * sequences running first (FIFO within a tenant; every page a request can need,
 * prompt + max_tokens, is reserved at admission, so a running request never
 * runs out of KV and nothing is ever preempted); build one batch with one
 * decode token per DECODING request plus prefill chunks up to
 * max_batch_tokens; run the forward pass; sample, detokenize, match stop
 * strings and post events. A constrained request's draw (grammar mask +
 * sample) runs on a mask thread instead, never on this one, and the step
 * waits for it no longer than the forward pass took (see mask.c).
 * Sampling is per request with its own seeded sampler, and the forward pass
 * is batch-invariant, so a request's tokens do not depend on what it was
 * batched with.
 *
 * Decode workers (engine_opts.poll): the hook runs on the scheduler thread
 * once per loop iteration and replaces the idle wait; from inside it
 * engine_adopt (request.c) starts a request whose prompt KV arrived over the network.
 * Such a request borrows its kv_seq (r->ext): the step reads and appends to
 * it like any other, but the engine never releases it and the prefix cache
 * never sees it; the hook's owner frees it after the done event. */
#include "engine_int.h"

#include "kvseal/admit.h"
#include "kv/kv_fault.h" /* TEST ONLY: KS_FAULT=swap_page (KS_TEST_FAULTS builds) */

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Options and capacity (I8)

void engine_opts_default(engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_threads = 1;
    o->page_tokens = 16;
    o->kv_type = KS_DTYPE_F16; // as llama.cpp: half the bytes of f32, perplexity within 0.1%
    o->scrub = KV_SCRUB_ZERO;
    o->max_batch_tokens = 256;
    o->max_running = 16;
    o->queue_max = 64;
    o->queue_timeout_ms = 30000;
    o->prefix_cache = true;
    o->grammar_budget_us = 1000000; // a new grammar's first masks build its token classes: 0.1-0.3 s at 150k tokens
    o->grammar_cpu_us = 20000000;
    o->spec_ngram_min = 2;
    o->spec_ngram_max = 4;
    o->spec_max_batch = 4;
}

ks_err engine_capacity_check(const engine_opts *o, bool *warn_out, char *buf, size_t cap) {
    kv_geom g = model_kv_geom(o->m, o->page_tokens, o->kv_type);
    uint64_t page_bytes = kv_page_bytes(&g);
    uint64_t cap_tokens = (uint64_t)o->kv_pages * (uint64_t)o->page_tokens;
    // a full-context sequence's KV pages, and its recurrent state's (hybrid models)
    uint64_t need_pages = ((uint64_t)o->n_ctx + (uint64_t)o->page_tokens - 1) /
                              (uint64_t)o->page_tokens +
                          (uint64_t)(g.state_pages > 0 ? g.state_pages : 0);
    bool fits = o->kv_pages >= need_pages;
    bool warn = fits && cap_tokens < 2 * (uint64_t)o->n_ctx;
    *warn_out = warn;
    char page[256]; // "... bytes/page = L layers x P plane(s) x T tokens x R B per D-element row"
    kv_geom_describe(&g, page, sizeof page);
    snprintf(buf, cap,
             "kv pool: %u pages x %d tokens = %" PRIu64 " tokens (%.1f MiB; kv type %s, %" PRIu64
             " bytes/token; %s); context length %d needs %" PRIu64 " pages: %s (%.2fx the context)",
             o->kv_pages, o->page_tokens, cap_tokens,
             (double)(page_bytes * o->kv_pages) / 1048576.0, kv_type_name(g.kv_type),
             page_bytes / (uint64_t)g.page_tokens, page, o->n_ctx, need_pages,
             !fits  ? "DOES NOT FIT, refusing to start"
             : warn ? "fits, but below 2x"
                    : "ok",
             (double)cap_tokens / (double)o->n_ctx);
    return fits ? KS_OK : KS_ERR_NOSPACE;
}

// ----------------------------------------------------------------------------
// Scheduler helpers: choice groups, isolation violations, the fair queue

/* Whether r's prefill stops at the last page boundary before its last
 * prompt token: a hybrid recurrent model's recurrent state there is what
 * the prefix cache keeps and what the other choices of its group start
 * from (prompt logprobs and embeddings run whole). */
static bool engine__hybrid_stop(const engine *e, const engine_req *r) {
    return kv_pool_geom(e->pool)->state_pages > 0 && !r->prompt_lp && !r->embed &&
           (e->prefix || r->n_fol);
}

/* Prompt pages the other choices of r's group share with choice 0: its full
 * pages before the last prompt token's (a hybrid model's only where its
 * prefill stops there, to hand its state over: engine__hybrid_stop). */
static uint32_t engine__shared_pages(const engine *e, const engine_req *r) {
    if (kv_pool_geom(e->pool)->state_pages > 0 && !engine__hybrid_stop(e, r)) return 0;
    return (uint32_t)(r->n_prompt - 1) / (uint32_t)e->o.page_tokens;
}

/* Choice 0 of a group computed the prompt, or a hybrid model's up to the
 * shared pages' end (its pages are READY): every waiting choice now shares
 * its full prompt pages before the last one (read-only, tags kept, I1),
 * with a copy of its recurrent state there (hybrid), and computes the rest
 * of the prompt itself. Runs before choice 0 samples, so the pages are
 * still held even when its first token ends it. */
static void engine__group_fork(engine *e, engine_req *r) {
    const uint32_t shared = engine__shared_pages(e, r);
    int n = r->n_fol;
    r->n_fol = 0;
    for (int i = 0; i < n; i++) {
        engine_req *f = r->fol[i];
        f->leader = NULL;
        ks_errbuf eb;
        if (kv_seq_share_prefix(e->pool, &f->seq, &r->seq, shared, &eb) != KS_OK) {
            ks_log(KS_LOG_ERROR, "request %" PRIu64 ": cannot share the prompt: %s", f->id, eb.msg);
            f->orphan = true;
            continue;
        }
        f->n_past = (int32_t)(shared * (uint32_t)e->o.page_tokens);
    }
}

static void engine__violation_cb(void *ctx, uint64_t seq_uid, uint32_t page, kv_tag expected,
                                 kv_tag found, kv_page_state state) {
    engine *e = ctx;
    pthread_mutex_lock(&e->vmu);
    // a corrupted table can fail several checks (write, read, release):
    // it is one violation of one sequence, reported once
    bool seen = false;
    for (int i = 0; i < 64 && i < e->n_seen; i++) seen |= e->seen_uid[i] == seq_uid;
    if (!seen) {
        e->seen_uid[e->n_seen++ % 64] = seq_uid;
        atomic_fetch_add(&e->n_violations, 1);
        if (e->n_viol < (int)(sizeof e->viol / sizeof e->viol[0]))
            e->viol[e->n_viol++] = (engine__violation){seq_uid, page, expected, found, state};
    }
    pthread_mutex_unlock(&e->vmu);
}

/* Writes the structured security events for violations seen in the last
 * pass (request id, tenant, page, tags — never content). */
static void engine__report_violations(engine *e) {
    pthread_mutex_lock(&e->vmu);
    int n = e->n_viol;
    engine__violation v[16];
    memcpy(v, e->viol, sizeof(engine__violation) * (size_t)n);
    e->n_viol = 0;
    pthread_mutex_unlock(&e->vmu);
    static const char *states[] = {"FREE", "ALLOCATED", "READY", "QUARANTINE"};
    for (int i = 0; i < n; i++) {
        const engine_req *r = NULL;
        bool draft = false; // the sequence is a request's draft-model KV (e->dpool)
        for (int j = 0; j < e->n_running; j++) {
            engine_req *x = e->running[j];
            if (engine__seq(x)->uid == v[i].seq_uid || (x->d_uid && x->d_uid == v[i].seq_uid))
                r = x, draft = engine__seq(x)->uid != v[i].seq_uid;
        }
        char json[768];
        snprintf(json, sizeof json,
                 "{\"event\":\"isolation_violation\",\"request_id\":%" PRIu64 ",\"tenant\":\"%s\","
                 "\"pool\":\"%s\",\"seq_uid\":\"%016" PRIx64
                 "\",\"page\":%u,\"expected\":{\"seq_uid\":\"%016" PRIx64 "\",\"gen\":%" PRIu64
                 "},\"found\":{\"seq_uid\":\"%016" PRIx64 "\",\"gen\":%" PRIu64
                 "},\"page_state\":\"%s\"}",
                 r ? r->id : 0, r ? r->tenant : "?", draft ? "draft" : "model", v[i].seq_uid,
                 v[i].page, v[i].expected.seq_uid, v[i].expected.gen, v[i].found.seq_uid,
                 v[i].found.gen, (unsigned)v[i].state < 4 ? states[v[i].state] : "?");
        if (e->o.on_security_event) e->o.on_security_event(e->o.event_ctx, json);
        else
            ks_log_fields(KS_LOG_ERROR, json, "SECURITY %s", json);
    }
}

/* Fairness between tenants: the waiting request admitted next is the
 * oldest one of the tenant with the fewest sequences running (FIFO within a
 * tenant, and between tenants running as many). So when a slot frees, a
 * tenant that holds many does not get it while another tenant waits; a
 * request that does not fit yet waits at the front, as in FIFO (no
 * starvation). *prev_out: its predecessor in the list (NULL: the head).
 * e->mu held. */
static engine_req *engine__admit_pick(engine *e, engine_req **prev_out) {
    engine_req *best = NULL, *best_prev = NULL, *prev = NULL;
    int best_n = 0;
    for (engine_req *r = e->wait_head; r; prev = r, r = r->next) {
        int n = 0;
        for (int i = 0; i < e->n_running; i++)
            n += strcmp(e->running[i]->tenant, r->tenant) == 0;
        if (!best || n < best_n) {
            best = r, best_prev = prev, best_n = n;
            if (n == 0) break; // none running: nobody is before it
        }
    }
    *prev_out = best_prev;
    return best;
}

/* Moves waiting requests into the running set while their pages fit, the
 * least-served tenant's first (engine__admit_pick). */
static void engine__admit(engine *e) {
    const uint32_t P = (uint32_t)e->o.page_tokens;
    pthread_mutex_lock(&e->mu);
    // the clock is read under mu, after every waiting request's t_submit (a
    // read before it could precede a stamp, and the age wrap around)
    uint64_t now = ks_now_ns();
    // queue timeouts and cancellations of waiting requests
    engine_req **pp = &e->wait_head, *prev = NULL;
    while (*pp) {
        engine_req *r = *pp;
        bool timeout =
            now > r->t_submit && now - r->t_submit > (uint64_t)e->o.queue_timeout_ms * 1000000ull;
        if (timeout || atomic_load(&r->cancelled) || atomic_load(&e->abort_all)) {
            *pp = r->next;
            if (e->wait_tail == r) e->wait_tail = prev;
            e->n_waiting--;
            r->next = NULL;
            pthread_mutex_unlock(&e->mu);
            engine__finish(e, r, ENGINE_ABORTED, ENGINE_FINISH_ABORT,
                           timeout ? KS_ERR_TIMEOUT : KS_ERR_CANCELLED,
                           timeout ? "timed out waiting for KV capacity" : "cancelled");
            pthread_mutex_lock(&e->mu);
            continue;
        }
        prev = r;
        pp = &r->next;
    }
    for (;;) {
        engine_req *before;
        engine_req *r = engine__admit_pick(e, &before);
        if (!r || e->n_running + 1 + r->n_fol > e->o.max_running) break;
        kv_seq_init(e->pool, &r->seq);
        r->has_seq = true;
        uint32_t cached = 0;
        if (e->prefix && !r->prompt_lp && !r->embed) // echo, embeddings: every position's row
            cached =
                kv_prefix_attach(e->prefix, r->root, r->prompt, (uint32_t)r->n_prompt, &r->seq);
        // max_tokens 0 (echo) was admitted as 1: reserve that one too
        // (an embedding holds its input only)
        uint32_t need = (uint32_t)(r->n_prompt + (r->max_tokens > 0 ? r->max_tokens
                                                  : r->embed        ? 0
                                                                    : 1));
        uint32_t shared = engine__shared_pages(e, r); // pages its other choices share
        uint32_t own = (need + P - 1) / P - shared;  // pages each of them owns
        // (a hybrid model's every sequence also holds its recurrent state's pages)
        uint32_t need_pages =
            kv_seq_pages_needed(e->pool, &r->seq, need) +
            (uint32_t)r->n_fol * (own + (uint32_t)kv_pool_geom(e->pool)->state_pages);
        if (need_pages > kv_pool_n_free(e->pool) && e->prefix)
            kv_prefix_evict(e->prefix, need_pages - kv_pool_n_free(e->pool));
        ks_errbuf eb;
        bool ok = kv_seq_reserve(e->pool, &r->seq, need, &eb) == KS_OK;
        // the group's other choices: their own pages now (all or none), the
        // shared prompt pages once choice 0 has computed them
        for (int i = 0; i < r->n_fol; i++) {
            engine_req *f = r->fol[i];
            kv_seq_init(e->pool, &f->seq);
            f->has_seq = true;
            ok = ok && kv_seq_reserve(e->pool, &f->seq, own * P, &eb) == KS_OK;
        }
        if (!ok) {
            // momentarily full: it waits at the front (nothing passes it)
            for (int i = 0; i < r->n_fol; i++) {
                kv_seq_release(e->pool, &r->fol[i]->seq);
                r->fol[i]->has_seq = false;
            }
            kv_seq_release(e->pool, &r->seq);
            r->has_seq = false;
            break;
        }
        if (before) before->next = r->next;
        else e->wait_head = r->next;
        if (e->wait_tail == r) e->wait_tail = before;
        e->n_waiting--;
        r->next = NULL;
        r->n_past = r->n_cached = (int32_t)cached;
        // a hybrid model resumes a cached prefix from the recurrent state at its
        // end: the prefill stops at the last page boundary before the last prompt
        // token (where an attach of this prompt ends) and the cache keeps that
        // state (kv_prefix_publish_state); its cost is g.state_pages pages
        // (and there the group's other choices take a copy of it)
        r->snap_at = 0;
        bool fork_now = false; // resumed right there: the others take it now
        if (engine__hybrid_stop(e, r)) {
            int32_t at = (r->n_prompt - 1) / (int32_t)P * (int32_t)P;
            if (at > r->n_past) r->snap_at = at;
            fork_now = at > 0 && at == r->n_past && r->n_fol;
        }
        r->t_sched = now;
        engine__set_state(r, ENGINE_PREFILLING);
        e->running[e->n_running++] = r;
        atomic_fetch_add(&e->tokens_in, (unsigned long long)r->n_prompt);
        for (int i = 0; i < r->n_fol; i++) { // they wait in the running set (not batched)
            engine__set_state(r->fol[i], ENGINE_PREFILLING);
            e->running[e->n_running++] = r->fol[i];
        }
        if (fork_now) engine__group_fork(e, r);
    }
    atomic_store(&e->st_queued, e->n_waiting);
    pthread_mutex_unlock(&e->mu);
    atomic_store(&e->st_running, (unsigned)e->n_running);
}

// ----------------------------------------------------------------------------
// The step

#define ENGINE__MASK_IDLE_WAIT_NS 10000000ull // nothing but draws to wait for: 10 ms at a time

void engine_ban_eog(const tok_vocab *v, int32_t min_tokens, int32_t n_gen, float *logits,
                    int32_t n_vocab) {
    if (n_gen >= min_tokens) return;
    for (int32_t i = 0; i < n_vocab; i++)
        if (tok_is_eog(v, i)) logits[i] = -INFINITY;
}

/* Samples the next token of r from its logits row, then engine__take; a
 * constrained request's draw goes to a mask thread (engine__mask_post).
 * Returns true if r finished. */
static bool engine__emit(engine *e, engine_req *r, float *logits_row) {
    if (r->gm) return engine__mask_post(e, r, logits_row); // the grammar decides when EOG may come
    if (!r->ignore_eos) engine_ban_eog(e->vocab, r->sp.min_tokens, r->n_gen, logits_row, e->V);
    sample_result sr;
    sampler_sample(r->smp, logits_row, &sr); // penalizes this step's row in place
    return engine__take(e, r, &sr);
}

/* Speculative decoding: r's logits rows out_row .. out_row + n_draft are
 * those of its last token and of each draft after it. Draws from them in
 * order, exactly as that many decode steps would (same rows, bit for bit:
 * the pass is batch-invariant; same sampler, same draws), as long as each
 * draw confirms the draft the next row was computed for. So greedy output
 * is the non-speculative output token for token, and a seeded sampled one
 * is too: this is rejection sampling with a one-point draft distribution
 * (a draft d is kept with probability p(d); else the token is drawn from p
 * without d, renormalized), done with one draw per token. The rows of the
 * rejected drafts are scrubbed at once (kv_seq_truncate, I3). Returns true
 * if r finished. */
static bool engine__verify(engine *e, engine_req *r) {
    const int32_t nd = r->n_draft;
    const uint32_t p0 = (uint32_t)(r->n_prompt + r->n_gen - 1); // position of `last`
    int32_t kept = 0;
    bool gone = false;
    r->n_draft = 0;
    // counted before any draw: a draw may end r (and free it)
    r->n_drafted += nd;
    atomic_fetch_add(&e->spec_steps, 1);
    atomic_fetch_add(&e->spec_drafted, (unsigned long long)nd);
    for (int32_t i = 0; i <= nd; i++) {
        if ((gone = engine__emit(e, r, e->logits + (size_t)(r->out_row + i) * (size_t)e->V)))
            break;
        if (i == nd || r->last != r->draft[i]) break;
        kept++;
        r->n_accepted++;
        atomic_fetch_add(&e->spec_accepted, 1);
    }
    if (gone) return true; // its pages are released (scrubbed) already
    // rows p0 .. p0 + nd were written; p0 + kept + 1 .. on are rejected drafts'
    if (kept < nd) kv_seq_truncate(e->pool, engine__seq(r), p0 + (uint32_t)kept + 1);
    // the NextN head reads the rows of `last` and the kept drafts
    if (r->mh_n > 0) r->mh_n = kept + 1;
    // the draft model's KV holds `last` and the drafts it fed: valid up to the
    // kept ones, if the drafts were its own (not the prediction's)
    const uint32_t dv = p0 + 1 + (r->n_dm > 0 ? (uint32_t)kept : 0);
    if (!e->mtp && r->has_dseq && r->d_valid > dv) r->d_valid = dv;
    if (!e->mtp && r->has_dseq && r->dseq.n_tokens < r->d_valid) r->d_valid = r->dseq.n_tokens;
    engine__spec_adapt(e, r, nd, kept);
    return false;
}

/* Posts the prompt events of this step's prompt positions of r (echo):
 * token 0 without a logprob, then token p+1 with the log-softmax of
 * position p's logits row, as sample_logprobs_row computes it. */
static void engine__prompt_events(engine *e, engine_req *r) {
    engine_event ev;
    for (int32_t j = 0; j < r->lp_n; j++) {
        int32_t pos = r->lp_pos0 + j;
        if (pos == 0) {
            memset(&ev, 0, sizeof ev);
            ev.prompt = ev.no_logprob = true;
            ev.token = ev.sr.token = r->prompt[0];
            engine_stream_post(r->out, &ev);
        }
        if (pos + 1 >= r->n_prompt) break;
        memset(&ev, 0, sizeof ev);
        ev.prompt = true;
        ev.token = r->prompt[pos + 1];
        const float *row = e->logits + (size_t)(r->lp_row0 + j) * (size_t)e->V;
        sample_logprobs_row(row, e->V, ev.token, r->prompt_top, &ev.sr);
        engine_stream_post(r->out, &ev);
    }
    r->lp_n = 0;
}

#ifdef KS_TEST_FAULTS
/* TEST ONLY (I9): with KS_FAULT=swap_page, once two requests are decoding,
 * point the newer one's first block-table entry at the older one's page;
 * with KS_FAULT=swap_state (a hybrid model), its last recurrent-state entry
 * at the older one's state page; with KS_FAULT=swap_draft, once two
 * decoding requests have draft-model pages, the newer one's first draft
 * page at the older one's. */
static void engine__inject_fault(engine *e) {
    const char *f = getenv("KS_FAULT");
    const bool state = f && !strcmp(f, "swap_state"), draft = f && !strcmp(f, "swap_draft");
    if (e->fault_done || !f || (strcmp(f, "swap_page") != 0 && !state && !draft)) return;
    engine_req *a = NULL, *b = NULL;
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        if (atomic_load(&r->state) != ENGINE_DECODING) continue;
        // swap_draft: requests with draft pages (never shared) and drafts still to make
        if (draft ? !r->has_dseq || r->dseq.n_tokens == 0 || r->max_tokens - r->n_gen < 8
                  : engine__seq(r)->n_shared != 0)
            continue;
        if (!a) a = r;
        else b = r;
    }
    if (!a || !b) return;
    const int sp = kv_pool_geom(e->pool)->state_pages;
    if (draft)
        kv_fault_swap_entry(&b->dseq, &a->dseq, 0);
    else if (state && sp > 0)
        kv_fault_swap_state(engine__seq(b), engine__seq(a), (uint32_t)sp - 1);
    else
        kv_fault_swap_entry(engine__seq(b), engine__seq(a), 0);
    e->fault_done = true;
    const char *what = draft ? "draft-model KV" : state ? "recurrent-state" : "KV";
    ks_log(KS_LOG_WARN,
           "TEST FAULT: request %" PRIu64 " now points at a %s page of request %" PRIu64, b->id,
           what, a->id);
}
#endif

/* Pools this step's hidden rows of embedding request r; once its last
 * position is in, writes the vector and ends it (pages released, I3).
 * Returns true if r finished. */
static bool engine__embed_step(engine *e, engine_req *r) {
    const size_t E = (size_t)model_hp(e->m)->n_embd;
    if (r->hid_n > 0) model_embd_add(&r->ea, e->hidden + (size_t)r->hid_row0 * E, r->hid_n);
    r->hid_n = 0;
    if (r->n_past < r->n_prompt) return false;
    if (model_embd_finish(&r->ea, r->evec) != KS_OK) {
        engine__finish(e, r, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_INTERNAL,
                       "internal error: no hidden row was pooled");
        return true;
    }
    engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
    return true;
}

/* One scheduling step; returns false when there was nothing to run. */
static bool engine__step(engine *e) {
    // retire cancelled requests first: their pages are freed within one step
    for (int i = 0; i < e->n_running;) {
        engine_req *r = e->running[i];
        if (atomic_load(&r->cancelled) || atomic_load(&e->abort_all) || r->orphan) {
            e->running[i] = e->running[--e->n_running];
            engine__finish(e, r, ENGINE_ABORTED, ENGINE_FINISH_ABORT, KS_ERR_CANCELLED,
                           atomic_load(&e->abort_all) ? "aborted: model taken offline"
                           : r->orphan ? "aborted: the request's prompt was not computed"
                                       : "cancelled");
            continue;
        }
        i++;
    }
    engine__admit(e);
    engine__mask_collect(e); // masks done since the last step: their tokens
    if (e->n_running == 0) {
        atomic_store(&e->st_paused, 0);
        return false;
    }
#ifdef KS_TEST_FAULTS
    engine__inject_fault(e);
#endif
    // build the batch: decodes first (one token each), then prefill chunks; a
    // request whose client has not taken its output sits this step out
    int32_t n = 0, n_out = 0, n_hid = 0, budget = e->o.max_batch_tokens;
    unsigned n_paused = 0;
    // speculation pays while a step reads the weights for few tokens: past
    // spec_max_batch decoding requests nobody drafts (engine_opts)
    int n_dec = 0;
    for (int i = 0; i < e->n_running && e->o.spec_tokens > 0; i++)
        n_dec += atomic_load(&e->running[i]->state) == ENGINE_DECODING;
    const bool drafting = e->o.spec_tokens > 0 && n_dec <= e->o.spec_max_batch;
    int n_dec_left = n_dec; // decoding requests whose token is not in yet: drafts leave them room
    if (e->mtp) // the NextN head's drafts, or the draft model's, if there is one
        engine__spec_mtp(e, drafting);
    else
        engine__spec_dmodel(e, drafting);
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        r->batch_slot = i;
        r->out_row = -1;
        r->lp_n = 0;
        r->hid_n = 0;
        e->b_seqs[i] = engine__seq(r);
        e->b_lora[i] = r->adapter ? r->adapter->lora : NULL;
        if (atomic_load(&r->state) != ENGINE_DECODING || n >= budget) continue;
        if (r->mpending) continue; // its next token is still being drawn (mask thread)
        if (engine_stream_backlogged(r->out)) {
            n_paused++;
            continue;
        }
        const bool mh = e->mtp && r->spec && !r->m_lost; // the NextN head reads its rows
        e->b_tok[n] = r->last;
        e->b_pos[n] = r->n_prompt + r->n_gen - 1;
        e->b_seq[n] = i;
        e->b_out[n] = r->out_row = n_out++;
        e->b_hid[n] = mh ? n_hid++ : -1;
        if (mh) r->mh_row0 = e->b_hid[n], r->mh_pos0 = e->b_pos[n], r->mh_n = 1;
        n++;
        // its drafts follow, each with a logits row: at most what the batch
        // has room for and what max_tokens leaves (so every row written
        // lies in the pages reserved at admission)
        r->n_draft = 0;
        n_dec_left--;
        if (drafting && r->spec && r->spec_rest > 0) {
            r->spec_rest--; // resting after lost drafts (engine__spec_adapt)
        } else if (drafting && r->spec) {
            int32_t k = r->max_tokens - r->n_gen - 1;
            if (k > budget - n - n_dec_left) k = budget - n - n_dec_left;
            r->n_draft = engine__spec_draft(e, r, k);
            for (int32_t j = 0; j < r->n_draft; j++, n++) {
                e->b_tok[n] = r->draft[j];
                e->b_pos[n] = e->b_pos[n - 1] + 1;
                e->b_seq[n] = i;
                e->b_out[n] = n_out++;
                e->b_hid[n] = mh ? n_hid++ : -1;
                r->mh_n += mh; // engine__verify keeps the kept drafts' rows
            }
        }
    }
    int32_t lp_rows = ENGINE__PROMPT_ROWS; // extra logits rows left for prompt logprobs
    for (int i = 0; i < e->n_running && n < budget; i++) {
        engine_req *r = e->running[i];
        if (atomic_load(&r->state) != ENGINE_PREFILLING || r->leader) continue;
        int32_t chunk = r->n_prompt - r->n_past;
        // an encoder (bidirectional: every position reads every other one)
        // takes an input whole in one batch; admission kept it within the
        // batch, so it waits for a step with room
        if (e->encoder && chunk > budget - n) continue;
        if (chunk > budget - n) chunk = budget - n;
        if (r->snap_at > r->n_past && r->n_past + chunk > r->snap_at)
            chunk = r->snap_at - r->n_past;
        if (r->prompt_lp) { // a logits row for every prompt position
            if (chunk > lp_rows) chunk = lp_rows;
            if (chunk == 0) continue;
            lp_rows -= chunk;
            r->lp_row0 = n_out;
            r->lp_pos0 = r->n_past;
            r->lp_n = chunk;
        }
        if (r->embed) { // hidden rows, no logits: every position's (mean), the first's or the last's
            r->hid_row0 = n_hid;
            r->hid_n = 0;
        }
        const bool mh = e->mtp && r->spec && !r->m_lost; // the NextN head reads every row
        if (mh) r->mh_row0 = n_hid, r->mh_pos0 = r->n_past, r->mh_n = chunk;
        for (int32_t j = 0; j < chunk; j++) {
            e->b_tok[n] = r->prompt[r->n_past + j];
            e->b_pos[n] = r->n_past + j;
            e->b_seq[n] = i;
            bool last = r->n_past + j == r->n_prompt - 1;
            e->b_hid[n] = mh ? n_hid++ : -1;
            if (r->embed) {
                e->b_out[n] = -1;
                bool want = r->embed == MODEL_POOL_MEAN ||
                            (r->embed == MODEL_POOL_CLS ? r->n_past + j == 0 : last);
                if (want) e->b_hid[n] = n_hid++, r->hid_n++;
            } else {
                e->b_out[n] = last ? (r->out_row = n_out++) : r->prompt_lp ? n_out++ : -1;
            }
            n++;
        }
        r->n_past += chunk;
    }
    atomic_store(&e->st_paused, n_paused);
    if (n == 0) {
        // draws still on the mask threads: wait for one (briefly, so that a
        // decode worker's hook still runs often), then go on; else all are
        // paused: wait for a client (engine__wake) or a cancel
        bool drawing = false;
        for (int i = 0; i < e->n_running && !drawing; i++)
            drawing = e->running[i]->mpending;
        if (!drawing) return false;
        engine__mask_wait(e, ks_now_ns() + ENGINE__MASK_IDLE_WAIT_NS, true);
        return true;
    }
    model_batch b = {.n_tokens = n,
                     .tokens = e->b_tok,
                     .pos = e->b_pos,
                     .seq = e->b_seq,
                     .out_row = e->b_out,
                     .n_out = n_out,
                     .n_seqs = e->n_running,
                     .seqs = e->b_seqs,
                     .seq_err = e->b_err,
                     .lora = e->b_lora};
    model_hidden hid = {.row = e->b_hid, .n_rows = n_hid, .out = e->hidden};
    ks_errbuf eb;
    uint64_t t_fwd = ks_now_ns();
    ks_err err = model_forward_hidden(e->ctx, &b, e->logits, n_hid ? &hid : NULL, &eb);
    t_fwd = ks_now_ns() - t_fwd;
    e->n_steps++;
    engine__report_violations(e);
    bool posted = false; // grammar draws queued for the mask threads
    // results, in running order; finished requests leave the running set
    engine_req **run = e->running;
    int kept = 0, n_run = e->n_running;
    for (int i = 0; i < n_run; i++) {
        engine_req *r = run[i];
        bool gone = false;
        if (err || e->b_err[i]) {
            ks_log(KS_LOG_ERROR, "request %" PRIu64 ": %s", r->id,
                   err ? eb.msg : "KV page check failed (isolation violation); request stopped");
            engine__finish(e, r, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_INTERNAL,
                           err ? "internal error" : "internal error: KV integrity check failed");
            gone = true;
        } else if (r->embed) {
            gone = engine__embed_step(e, r);
        } else {
            // its recurrent state is that after exactly snap_at prompt tokens
            if (r->snap_at > 0 && r->n_past == r->snap_at) {
                if (e->prefix)
                    kv_prefix_publish_state(e->prefix, r->root, r->prompt, (uint32_t)r->snap_at,
                                            &r->seq);
                if (r->n_fol) engine__group_fork(e, r);
                r->snap_at = 0;
            }
            if (r->lp_n > 0) engine__prompt_events(e, r);
            if (r->out_row >= 0) {
                if (atomic_load(&r->state) == ENGINE_PREFILLING) {
                    engine__set_state(r, ENGINE_DECODING);
                    // full prompt pages become reusable by this tenant (I7); a
                    // hybrid model's were offered with their state at snap_at
                    if (e->prefix && !kv_pool_geom(e->pool)->state_pages)
                        kv_prefix_publish(e->prefix, r->root, r->prompt, (uint32_t)r->n_prompt,
                                          &r->seq);
                    if (r->n_fol) engine__group_fork(e, r);
                }
                if (r->max_tokens == 0) { // echo only: the prompt was all it asked for
                    engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_LENGTH, KS_OK, NULL);
                    gone = true;
                } else if (r->n_draft > 0) {
                    gone = engine__verify(e, r);
                } else {
                    gone = engine__emit(e, r, e->logits + (size_t)r->out_row * (size_t)e->V);
                    posted |= !gone && r->mpending; // gone: r may be freed already
                }
            }
        }
        if (!gone) run[kept++] = r;
    }
    e->n_running = kept;
    atomic_store(&e->st_running, (unsigned)kept);
    if (posted) {
        // this step's draws: waited for as long as the forward pass took,
        // then those done are taken and the rest sit steps out
        engine__mask_wait(e, ks_now_ns() + t_fwd, false);
        engine__mask_collect(e);
    }
    return true;
}

/* Runs the decode-worker hook (kind 1: o.poll, 2: o.poll_end); engine_pool
 * and engine_adopt assert that they are called from inside it. */
static void engine__hook(engine *e, int kind, int timeout_ms) {
    e->in_hook = kind;
    if (kind == 1) e->o.poll(e->o.poll_ctx, e, timeout_ms);
    else e->o.poll_end(e->o.poll_ctx, e);
    e->in_hook = 0;
}

kv_pool *engine_pool(engine *e) {
    KS_ASSERT(e);
    KS_ASSERT(pthread_equal(pthread_self(), e->sched_tid) && e->in_hook);  // poll / poll_end only
    return e->pool;
}

typedef struct {
    uint64_t uid;
    int8_t owner;
} engine__uid_owner;

static int engine__uid_cmp(const void *a, const void *b) {
    uint64_t x = ((const engine__uid_owner *)a)->uid, y = ((const engine__uid_owner *)b)->uid;
    return x < y ? -1 : x > y;
}

/* Fills m on the scheduler thread between steps, e->mu held (so an asker
 * that timed out cannot free m meanwhile): each page's state, and the
 * tenant of the running request whose sequence's tag the page carries. */
static void engine__map_fill(engine *e, engine_map *m) {
    engine__uid_owner *uo = malloc(sizeof *uo * (size_t)(e->n_running ? e->n_running : 1));
    int n = 0;
    for (int i = 0; uo && i < e->n_running; i++) {
        const engine_req *r = e->running[i];
        int t = 0;
        while (t < m->n_tenants && strcmp(m->tenant[t], r->tenant))
            t++;
        if (t == m->n_tenants && t < ENGINE_MAP_OWNERS)
            snprintf(m->tenant[m->n_tenants++], sizeof m->tenant[0], "%s", r->tenant);
        if (t < ENGINE_MAP_OWNERS) m->running[t]++;
        uo[n++] = (engine__uid_owner){engine__seq((engine_req *)r)->uid,
                                      (int8_t)(t < ENGINE_MAP_OWNERS ? t : ENGINE_MAP_OTHER)};
    }
    if (n) qsort(uo, (size_t)n, sizeof *uo, engine__uid_cmp);
    for (uint32_t p = 0; p < m->n_pages; p++) {
        kv_page_info pi;
        if (kv_pool_page_info(e->pool, p, &pi) != KS_OK) pi = (kv_page_info){0};
        m->state[p] = (uint8_t)pi.state;
        engine__uid_owner key = {.uid = pi.tag.seq_uid}, *hit;
        hit = n ? bsearch(&key, uo, (size_t)n, sizeof *uo, engine__uid_cmp) : NULL;
        m->owner[p] = pi.state == KV_PAGE_FREE ? ENGINE_MAP_FREE
                      : hit                    ? hit->owner
                                               : ENGINE_MAP_CACHED;
    }
    free(uo);
}

static void *engine__main(void *arg) {
    engine *e = arg;
    e->sched_tid = pthread_self();
    bool busy = false;  // the last step ran something
    for (;;) {
        pthread_mutex_lock(&e->mu);
        bool stop = e->stop;
        uint64_t kick = e->kick;
        if (e->map_out) { // an admin's page map, between two steps
            engine__map_fill(e, e->map_out);
            e->map_out = NULL;
            pthread_cond_broadcast(&e->cv);
        }
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        // a LoRA adapter went: every cached prefix no request uses is dropped
        // (and scrubbed), those computed under it with them
        if (atomic_exchange(&e->prefix_flush, false) && e->prefix)
            kv_prefix_evict(e->prefix, UINT32_MAX);
        // decode workers: the network first, so a request adopted now joins
        // this step's batch (after an idle iteration the hook just ran)
        if (e->o.poll && busy) engine__hook(e, 1, 0);
        if ((busy = engine__step(e))) continue;
        // nothing ran: sleep until a submit, cancel or wake (or a queue timeout is
        // due), unless one came in since this iteration began
        pthread_mutex_lock(&e->mu);
        if (e->check_state == 1 && !e->wait_head && e->n_running == 0) {
            pthread_mutex_unlock(&e->mu);
            if (e->prefix) kv_prefix_evict(e->prefix, UINT32_MAX);
            kv_stats st;
            kv_pool_stats(e->pool, &st);
            bool clean = kv_pool_all_free_and_scrubbed(e->pool) &&
                         (!e->dpool || kv_pool_all_free_and_scrubbed(e->dpool));
            pthread_mutex_lock(&e->mu);
            e->check_clean = clean;
            snprintf(e->check_msg, sizeof e->check_msg,
                     "kv pool: %u free, %u allocated, %u ready, %u quarantined; payload %s",
                     st.pages[KV_PAGE_FREE], st.pages[KV_PAGE_ALLOCATED], st.pages[KV_PAGE_READY],
                     st.pages[KV_PAGE_QUARANTINE], clean ? "scrubbed" : "NOT all free and scrubbed");
            e->check_state = 2;
            pthread_cond_broadcast(&e->cv);
        }
        bool wait = !e->stop && e->kick == kick;
        if (e->o.poll) {
            // the hook's own wait (its epoll) replaces the cond-var wait: a
            // submit, cancel, check or stop is seen within its 50 ms
            pthread_mutex_unlock(&e->mu);
            engine__hook(e, 1, wait ? 50 : 0);
            continue;
        }
        if (wait) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        }
        pthread_mutex_unlock(&e->mu);
    }
    // shutdown: abort everything still here; adopted requests' done events
    // are posted before poll_end, so the hook may free their sequences there
    atomic_store(&e->abort_all, true);
    engine__step(e);
    engine__admit(e);
    if (e->o.poll_end) engine__hook(e, 2, 0);
    return NULL;
}

// ----------------------------------------------------------------------------
// Lifecycle

/* Frees what engine_create built (any prefix of it); the thread is gone. */
static void engine__free(engine *e) {
    // the mask threads first (they read the token trie); a job still queued
    // drops its reference to its request
    pthread_mutex_lock(&e->mmu);
    e->mstop = true;
    pthread_cond_broadcast(&e->mcv);
    pthread_mutex_unlock(&e->mmu);
    for (int i = 0; i < e->n_mthreads; i++)
        pthread_join(e->mthreads[i], NULL);
    while (e->mq_head) {
        engine_req *r = e->mq_head;
        e->mq_head = r->mnext;
        engine__req_unref(r);
    }
    free(e->mthreads);
    free(e->m_act);
    free(e->m_last);
    free(e->m_total);
    pthread_cond_destroy(&e->mcv);
    pthread_cond_destroy(&e->mdone);
    pthread_mutex_destroy(&e->mmu);
    model_ctx_free(e->ctx);
    engine__spec_dmodel_free(e);
    kv_prefix_destroy(e->prefix);
    kv_pool_destroy(e->pool);
    free(e->running);
    free(e->logits);
    free(e->hidden);
    free(e->b_hid);
    grammar_vocab_destroy(e->gvocab);
    free(e->b_tok);
    free(e->b_seqs);
    free(e->b_err);
    free(e->b_lora);
    free(e->piece);
    engine__adapters_free(e); // every request ended: these are the registry's last references
    pthread_mutex_destroy(&e->amu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->vmu);
    free(e);
}

ks_err engine_create(const engine_opts *o, engine **out, ks_errbuf *eb) {
    *out = NULL;
    if (!o->m || o->n_ctx < 1 || o->page_tokens < 1 || o->max_batch_tokens < 1 || o->max_running < 1 ||
        o->queue_max < 0 || o->kv_pages < 1)
        return ks_seterr(eb, KS_ERR_INVAL, "engine: invalid options");
    if (o->spec_tokens < 0 || o->spec_tokens > ENGINE_SPEC_MAX ||
        (o->spec_tokens > 0 && (o->spec_ngram_min < 1 || o->spec_ngram_max < o->spec_ngram_min ||
                                o->spec_max_batch < 1)))
        return ks_seterr(eb, KS_ERR_INVAL,
                         "engine: speculative decoding takes 0..%d draft tokens, n-gram sizes "
                         "1 <= min <= max and a batch limit >= 1 (got %d tokens, n-grams %d..%d, "
                         "batch %d)",
                         ENGINE_SPEC_MAX, o->spec_tokens, o->spec_ngram_min, o->spec_ngram_max,
                         o->spec_max_batch);
    char msg[512];
    bool warn;
    if (engine_capacity_check(o, &warn, msg, sizeof msg))
        return ks_seterr(eb, KS_ERR_NOSPACE, "%s", msg);
    engine *e = calloc(1, sizeof *e);
    if (!e) return ks_seterr(eb, KS_ERR_NOMEM, "engine");
    e->o = *o;
    e->m = o->m;
    e->vocab = model_vocab(o->m);
    e->V = model_hp(o->m)->n_vocab;
    e->encoder = model_hp(o->m)->encoder;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->vmu, NULL);
    pthread_mutex_init(&e->amu, NULL);
    pthread_mutex_init(&e->mmu, NULL);
    pthread_cond_init(&e->mcv, NULL);
    pthread_cond_init(&e->mdone, NULL);
    atomic_init(&e->online, true);
    atomic_init(&e->next_id, 1);
    kv_geom g = model_kv_geom(o->m, o->page_tokens, o->kv_type);
    ks_err err;
    if ((err = kv_pool_create(&g, o->kv_pages, o->scrub, &e->pool, eb))) goto fail;
    kv_pool_set_violation_cb(e->pool, engine__violation_cb, e);
    if (o->prefix_cache &&
        (err = kv_prefix_create(e->pool, o->prefix_max_pages ? o->prefix_max_pages : o->kv_pages / 4,
                                &e->prefix, eb)))
        goto fail;
    if ((err = model_ctx_create(o->m, e->pool, o->n_threads, o->max_batch_tokens, o->n_ctx, &e->ctx, eb)))
        goto fail;
    if ((o->draft || o->spec_nextn) && o->spec_tokens > 0) { // the draft model: its own pool, checked like the model's
        if ((err = engine__spec_dmodel_create(e, eb))) goto fail;
        kv_pool_set_violation_cb(e->dpool, engine__violation_cb, e);
    }
    size_t R = (size_t)o->max_running, B = (size_t)o->max_batch_tokens;
    e->running = calloc(R, sizeof *e->running);
    // a row per running request and per draft it may carry, and echo's rows
    e->logits = malloc(sizeof(float) * (R * (1 + (size_t)o->spec_tokens) + ENGINE__PROMPT_ROWS) *
                       (size_t)e->V);
    e->b_tok = malloc(sizeof(int32_t) * B * 4);
    e->b_seqs = calloc(R, sizeof *e->b_seqs);
    e->b_err = calloc(R, sizeof *e->b_err);
    e->b_lora = calloc(R, sizeof *e->b_lora);
    e->piece_cap = tok_stream_bound(e->vocab);
    e->piece = malloc(e->piece_cap);
    e->hidden = malloc(sizeof(float) * B * (size_t)model_hp(o->m)->n_embd);
    e->b_hid = malloc(sizeof(int32_t) * B);
    if (!e->o.pooling) e->o.pooling = model_pooling_default(o->m);
    if (!e->running || !e->logits || !e->b_tok || !e->b_seqs || !e->b_err || !e->b_lora ||
        !e->piece || !e->hidden || !e->b_hid) {
        err = ks_seterr(eb, KS_ERR_NOMEM, "engine buffers");
        goto fail;
    }
    e->b_pos = e->b_tok + B;
    e->b_seq = e->b_pos + B;
    e->b_out = e->b_seq + B;
    // mask threads: as many as compute threads, two at least (one slow
    // grammar then does not hold up every other constrained request)
    int n_mt = o->n_threads > 2 ? o->n_threads : 2;
    e->mthreads = calloc((size_t)n_mt, sizeof *e->mthreads);
    e->m_act = malloc(R);
    e->m_last = malloc(sizeof(uint64_t) * R);
    e->m_total = malloc(sizeof(uint64_t) * R);
    if (!e->mthreads || !e->m_act || !e->m_last || !e->m_total) {
        err = ks_seterr(eb, KS_ERR_NOMEM, "engine buffers");
        goto fail;
    }
    for (int i = 0; i < n_mt; i++) {
        if (pthread_create(&e->mthreads[i], NULL, engine__mask_main, e) != 0) {
            err = ks_seterr(eb, KS_ERR_NOMEM, "engine: cannot start a mask thread");
            goto fail;
        }
        e->n_mthreads = i + 1;
    }
    if (pthread_create(&e->thread, NULL, engine__main, e) != 0) {
        err = ks_seterr(eb, KS_ERR_NOMEM, "engine: cannot start the scheduler thread");
        goto fail;
    }
    if (o->sizing_logged)
        ks_log(KS_LOG_DEBUG, "%s", msg); // said once (engine_opts)
    else if (warn)
        ks_log(KS_LOG_WARN, "%s", msg);
    else ks_log(KS_LOG_INFO, "%s", msg);
#ifdef KS_BROKEN_NAME
    ks_log(KS_LOG_WARN, "TEST BUILD: safeguard '%s' is switched off — never deploy this binary",
           KS_BROKEN_NAME);
#endif
    *out = e;
    return KS_OK;
fail:
    engine__free(e);
    return err;
}

void engine_destroy(engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    e->kick++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    engine__free(e);
}

ks_err engine_check_quiescent(engine *e, uint32_t timeout_ms, ks_errbuf *eb) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&e->mu);
    e->check_state = 1;
    e->kick++;
    pthread_cond_broadcast(&e->cv);
    while (e->check_state != 2)
        if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) != 0) break;
    ks_err err = KS_ERR_TIMEOUT;
    if (e->check_state == 2) err = e->check_clean ? KS_OK : KS_ERR_INTERNAL;
    ks_seterr(eb, err, "%s", err == KS_ERR_TIMEOUT ? "requests still active" : e->check_msg);
    e->check_state = 0;
    pthread_mutex_unlock(&e->mu);
    return err;
}

ks_err engine_map_pages(engine *e, uint32_t timeout_ms, engine_map **out, ks_errbuf *eb) {
    *out = NULL;
    const uint32_t n = kv_pool_n_pages(e->pool);
    engine_map *m = calloc(1, sizeof *m);
    if (m) m->state = malloc(n ? n : 1), m->owner = malloc(n ? n : 1);
    if (!m || !m->state || !m->owner) {
        engine_map_free(m);
        return ks_seterr(eb, KS_ERR_NOMEM, "no memory for a map of %u pages", n);
    }
    m->n_pages = n;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&e->mu);
    bool timed_out = false;
    while (e->map_out && !timed_out) // another asker's map first
        timed_out = pthread_cond_timedwait(&e->cv, &e->mu, &ts) != 0;
    if (!timed_out) {
        e->map_out = m;
        e->kick++;
        pthread_cond_broadcast(&e->cv);
        while (e->map_out == m && !timed_out)
            timed_out = pthread_cond_timedwait(&e->cv, &e->mu, &ts) != 0;
        if (e->map_out == m)
            e->map_out = NULL; // not taken: withdrawn under the lock
        else
            timed_out = false;
    }
    pthread_mutex_unlock(&e->mu);
    if (timed_out) {
        engine_map_free(m);
        return ks_seterr(eb, KS_ERR_TIMEOUT, "the scheduler did not reach a step boundary in %u ms",
                         timeout_ms);
    }
    *out = m;
    return KS_OK;
}

void engine_map_free(engine_map *m) {
    if (!m) return;
    free(m->state);
    free(m->owner);
    free(m);
}

void engine_set_online(engine *e, bool online, bool abort_running) {
    atomic_store(&e->online, online);
    if (!online && abort_running) atomic_store(&e->abort_all, true);
    if (online) atomic_store(&e->abort_all, false);
    pthread_mutex_lock(&e->mu);
    e->kick++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

bool engine_is_online(const engine *e) { return atomic_load(&((engine *)e)->online); }

void engine_get_stats(engine *e, engine_stats *out) {
    memset(out, 0, sizeof *out);
    kv_pool_stats(e->pool, &out->kv);
    out->n_queued = atomic_load(&e->st_queued);
    out->n_running = atomic_load(&e->st_running);
    out->n_paused = atomic_load(&e->st_paused);
    out->n_finished = atomic_load(&e->n_finished);
    out->n_aborted = atomic_load(&e->n_aborted);
    out->n_rejected = atomic_load(&e->n_rejected);
    out->tokens_in = atomic_load(&e->tokens_in);
    out->tokens_out = atomic_load(&e->tokens_out);
    out->spec_steps = atomic_load(&e->spec_steps);
    out->spec_drafted = atomic_load(&e->spec_drafted);
    out->spec_accepted = atomic_load(&e->spec_accepted);
    out->n_violations = atomic_load(&e->n_violations);
    out->adapters = atomic_load(&e->n_adapters);
    out->adapter_bytes = atomic_load(&e->adapter_bytes);
    out->adapter_requests = atomic_load(&e->adapter_requests);
}
