/* engine.c — request lifecycle, admission (I4) and the continuous-batching
 * scheduler (see engine.h).
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
 * waits for it no longer than the forward pass took (see "Grammar masks").
 * Sampling is per request with its own seeded sampler, and the forward pass
 * is batch-invariant, so a request's tokens do not depend on what it was
 * batched with.
 *
 * Decode workers (engine_opts.poll): the hook runs on the scheduler thread
 * once per loop iteration and replaces the idle wait; from inside it
 * engine_adopt starts a request whose prompt KV arrived over the network.
 * Such a request borrows its kv_seq (r->ext): the step reads and appends to
 * it like any other, but the engine never releases it and the prefix cache
 * never sees it; the hook's owner frees it after the done event. */
#include "kvseal/engine.h"
#include "kvseal/admit.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

// ----------------------------------------------------------------------------
// State machine

static const char *const engine__state_names[] = {"QUEUED",   "PREFILLING", "DECODING",
                                                  "FINISHED", "REJECTED",   "ABORTED"};

const char *engine_state_name(engine_state s) {
    return (unsigned)s < 6 ? engine__state_names[s] : "?";
}

bool engine_transition_ok(engine_state from, engine_state to) {
    // rows: from; columns: to. REJECTED has no incoming edge from a running
    // state and no terminal state has an outgoing edge (I4).
    static const bool ok[6][6] = {
        /* QUEUED     */ {0, 1, 0, 0, 0, 1},
        /* PREFILLING */ {0, 0, 1, 1, 0, 1},
        /* DECODING   */ {0, 0, 0, 1, 0, 1},
        /* FINISHED   */ {0, 0, 0, 0, 0, 0},
        /* REJECTED   */ {0, 0, 0, 0, 0, 0},
        /* ABORTED    */ {0, 0, 0, 0, 0, 0},
    };
    return (unsigned)from < 6 && (unsigned)to < 6 && ok[from][to];
}

// ----------------------------------------------------------------------------
// Types

struct engine_req {
    atomic_int refs;  // the caller's handle + the scheduler's
    engine *e;
    uint64_t id;
    // immutable after submit
    char tenant[128];
    uint8_t root[KV_ROOT_BYTES];  // prefix-cache domain of the tenant (I7)
    int32_t *prompt;              // (n_prompt)
    int32_t n_prompt, max_tokens;
    sample_params sp;
    bool ignore_eos;
    uint64_t t_submit;
    uint64_t t_first;  // first token sampled (0 = not yet)
    uint64_t t_sched;  // left the wait queue (0 = not yet): queue time for /metrics
    // scheduler-owned
    atomic_int state;  // engine_state, readable from any thread
    kv_seq seq;
    bool has_seq;      // seq holds pages the engine must release
    kv_seq *ext;       // adopted requests: the caller's sequence (borrowed, never released)
    sampler *smp;
    grammar_matcher *gm; // NULL: unconstrained
    uint32_t *gmask;     // ((V + 31) / 32) allowed tokens this step
    // grammar masks on the mask threads (engine__mask_*): while a job is
    // queued or running, its thread owns gm, smp, gmask, mlogits and the
    // results below; the scheduler reads them once it saw the job DONE
    // (under e->mmu), and then owns them again
    atomic_int mstate;          // ENGINE__MASK_IDLE, _QUEUED, _RUNNING, _DONE
    bool mpending;              // scheduler-owned: posted, not yet collected
    uint64_t mstep;             // scheduler-owned: the step that posted it (e->n_steps)
    struct engine_req *mnext;   // mask queue link (e->mmu)
    float *mlogits;             // (V) the step's logits row, copied: e->logits is reused
    sample_result msr;          // the job's result
    bool mend;
    ks_err merr;
    uint16_t mreason;           // merr's refusal reason (ADMIT_INVALID: the grammar's fault), or 0
    char mmsg[512];
    clockid_t mclk;             // RUNNING: its thread's CPU clock, and the reading at the start
    uint64_t mcpu0;
    uint64_t mlast_ns, mask_ns; // CPU of the last mask and of them all (e->mmu)
    int32_t n_past;    // prompt tokens computed (or attached from the cache)
    int32_t n_cached;  // prompt tokens attached from the prefix cache
    int32_t n_gen;
    int32_t last;      // last sampled token, fed next step
    int batch_slot;    // index in this step's seqs[], -1 if not in the batch
    int out_row;       // logits row this step, -1 if none
    struct engine_req *next;  // waiting / running list link
    engine_stream *out;  // events, detokenizer, stop strings (thread-safe)
    atomic_bool cancelled;
    // issue 12: prompt logprobs (echo) and choice groups (n, best_of); scheduler-owned
    bool prompt_lp;        // post a prompt event per prompt token (engine_params.prompt_logprobs)
    int32_t prompt_top;    // alternatives per prompt token
    int32_t lp_row0;       // this step: logits row of position lp_pos0 (rows are consecutive)
    int32_t lp_pos0, lp_n; // this step's prompt positions with a logits row; lp_n 0: none
    struct engine_req *leader; // choice > 0 not forked yet: the choice 0 prefilling the prompt
    struct engine_req *fol[ENGINE_MAX_N - 1]; // choice 0: the choices waiting for its prompt
    int n_fol;
    bool orphan; // its choice 0 ended before computing the prompt: abort it at the next step
    // embeddings (engine_embed_submit); scheduler-owned until the done event
    model_pooling embed;     // MEAN or LAST: an embedding request; DEFAULT: a generation
    model_embd_acc ea;       // the pooled state, over eacc
    double *eacc;            // (n_embd)
    float *evec;             // (n_embd) the result, written before the done event
    int32_t hid_row0, hid_n; // this step: its hidden rows (consecutive), hid_n 0: none
};

typedef struct {
    uint64_t seq_uid;
    uint32_t page;
    kv_tag expected, found;
    kv_page_state state;
} engine__violation;

struct engine {
    engine_opts o;
    const model *m;
    const tok_vocab *vocab;
    int32_t V;
    kv_pool *pool;
    kv_prefix *prefix;
    model_ctx *ctx;
    pthread_t thread;
    pthread_t sched_tid;  // set by the scheduler thread itself before the first hook call
    int in_hook;          // scheduler-owned: 1 inside o.poll, 2 inside o.poll_end, else 0
    // shared with submitters (mu)
    pthread_mutex_t mu;
    pthread_cond_t cv;
    engine_req *wait_head, *wait_tail;  // QUEUED, FIFO
    uint32_t n_waiting;
    bool stop;
    uint64_t kick;       // bumped (with a broadcast) by everything the scheduler must see
    atomic_bool online;
    atomic_bool abort_all;
    atomic_ullong next_id;
    // scheduler-owned
    engine_req **running;  // (max_running)
    int n_running;
    float *logits;                           // (max_running + ENGINE__PROMPT_ROWS, V)
    float *hidden;                           // (max_batch_tokens, n_embd) embeddings' rows
    int32_t *b_hid;                          // (max_batch_tokens) hidden row per token, or -1
    int32_t *b_tok, *b_pos, *b_seq, *b_out;  // (max_batch_tokens)
    kv_seq **b_seqs;       // (max_running)
    ks_err *b_err;         // (max_running)
    char *piece;           // (piece_cap) detokenizer output
    size_t piece_cap;
    grammar_vocab *gvocab; // token trie, built at the first constrained request
    // mask threads (engine__mask_main): queued jobs, one per request at most
    pthread_t *mthreads;    // (n_mthreads)
    int n_mthreads;
    pthread_mutex_t mmu;
    pthread_cond_t mcv;     // a job was queued, or stop
    pthread_cond_t mdone;   // a job is done
    engine_req *mq_head, *mq_tail;
    bool mstop;
    uint64_t n_steps;            // scheduler-owned: forward passes run
    uint8_t *m_act;              // (max_running) engine__mask_collect's scratch
    uint64_t *m_last, *m_total;  // (max_running)
    // isolation violations reported by kv during a pass (any thread)
    pthread_mutex_t vmu;
    engine__violation viol[16];
    int n_viol;
    uint64_t seen_uid[64];  // sequences already reported (ring): one violation per sequence
    int n_seen;
    atomic_ullong n_violations;
    // stats
    atomic_ullong n_finished, n_aborted, n_rejected, tokens_in, tokens_out;
    atomic_uint st_queued, st_running, st_paused;
    // engine_check_quiescent handshake (mu)
    int check_state;  // 0 idle, 1 requested, 2 answered
    bool check_clean;
    char check_msg[256];
#ifdef KS_TEST_FAULTS
    bool fault_done;
#endif
};

/* Logits rows per step for prompt logprobs (echo), past the one row per
 * running request: a prompt-logprobs prefill is chunked to fit them, so
 * the buffer stays fixed (no allocation on the step) at the cost of more
 * steps for long echoed prompts. */
#define ENGINE__PROMPT_ROWS 64

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
}

ks_err engine_capacity_check(const engine_opts *o, bool *warn_out, char *buf, size_t cap) {
    kv_geom g = model_kv_geom(o->m, o->page_tokens, o->kv_type);
    uint64_t page_bytes = kv_page_bytes(&g);
    uint64_t cap_tokens = (uint64_t)o->kv_pages * (uint64_t)o->page_tokens;
    uint64_t need_pages = ((uint64_t)o->n_ctx + (uint64_t)o->page_tokens - 1) / (uint64_t)o->page_tokens;
    bool fits = o->kv_pages >= need_pages;
    bool warn = fits && cap_tokens < 2 * (uint64_t)o->n_ctx;
    *warn_out = warn;
    char page[192]; // "... bytes/page = L layers x P plane(s) x T tokens x R B per D-element row"
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
// Events

ks_err engine_req_next(engine_req *r, engine_event *ev, uint32_t timeout_ms) {
    return engine_stream_next(r->out, ev, timeout_ms);
}

// ----------------------------------------------------------------------------
// Request objects

static void engine__req_free(engine_req *r) {
    KS_ASSERT(!r->has_seq);  // pages are released by the scheduler, exactly once
    sampler_destroy(r->smp);
    grammar_matcher_destroy(r->gm);
    free(r->gmask);
    free(r->mlogits);
    engine_stream_destroy(r->out);
    free(r->prompt);
    free(r->eacc);
    free(r->evec);
    free(r);
}

static void engine__req_unref(engine_req *r) {
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) engine__req_free(r);
}

static void engine__set_state(engine_req *r, engine_state to) {
    engine_state from = (engine_state)atomic_load(&r->state);
    KS_ASSERT(engine_transition_ok(from, to));  // the table is the only way between states
    atomic_store(&r->state, (int)to);
}

/* The block table the step works on: the borrowed one for adopted requests. */
static kv_seq *engine__seq(engine_req *r) { return r->ext ? r->ext : &r->seq; }

engine_state engine_req_state(const engine_req *r) {
    return (engine_state)atomic_load(&((engine_req *)r)->state);
}

/* engine_stream wake hook: a paused request's client caught up. */
static void engine__wake(void *ctx) {
    engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    e->kick++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_req_cancel(engine_req *r) {
    if (atomic_exchange(&r->cancelled, true)) return;
    engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    e->kick++;
    pthread_cond_broadcast(&e->cv);  // the scheduler retires it at the next step
    pthread_mutex_unlock(&e->mu);
}

void engine_req_set_notify(engine_req *r, void (*notify)(void *ctx), void *ctx) {
    engine_stream_set_notify(r->out, notify, ctx);
}

void engine_req_release(engine_req *r) {
    if (!r) return;
    if (!engine_stream_done_posted(r->out)) engine_req_cancel(r);
    engine__req_unref(r);
}

// ----------------------------------------------------------------------------
// Admission (I4): everything is checked before a request exists

/* A QUEUED request with both references (caller's + scheduler's) and its
 * id; NULL on out-of-memory. The caller fills the rest. */
static engine_req *engine__req_new(engine *e, const char *tenant) {
    engine_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    atomic_init(&r->refs, 2);
    atomic_init(&r->state, ENGINE_QUEUED);
    r->e = e;
    r->id = atomic_fetch_add(&e->next_id, 1);
    snprintf(r->tenant, sizeof r->tenant, "%s", tenant ? tenant : "default");
    r->batch_slot = r->out_row = -1;
    return r;
}

void engine_domain_root(const engine_params *p, uint8_t root[KV_ROOT_BYTES]) {
    // the cache domain is the tenant unless the operator declared a group
    char domain[160];
    if (p->cache_domain) snprintf(domain, sizeof domain, "%s", p->cache_domain);
    else snprintf(domain, sizeof domain, "tenant:%s", p->tenant ? p->tenant : "default");
    kv_prefix_root(domain, strlen(domain), root);
}

/* The request's matcher and mask buffer (HTTP thread; the trie is the
 * scheduler's, built at the first step that needs it). */
static ks_err engine__grammar_init(engine *e, engine_req *r, grammar *g, ks_errbuf *eb) {
    ks_err err = grammar_matcher_create(g, &r->gm, eb);
    if (err) return err;
    r->gmask = malloc(((size_t)e->V + 31) / 32 * sizeof *r->gmask);
    r->mlogits = malloc((size_t)e->V * sizeof *r->mlogits);
    return r->gmask && r->mlogits ? KS_OK : ks_seterr(eb, KS_ERR_NOMEM, "request");
}

/* Builds one QUEUED request of p for choice i (seed p->sp.seed + i) into
 * *out; prompt/n_prompt/max_tokens are the admitted ones. Errors: NOMEM,
 * INVAL (sampler). */
static ks_err engine__req_build(engine *e, const engine_params *p, const int32_t *prompt,
                                int32_t n_prompt, int32_t max_tokens, int i, engine_req **out,
                                ks_errbuf *eb) {
    *out = NULL;
    engine_req *r = engine__req_new(e, p->tenant);
    if (!r) return ks_seterr(eb, KS_ERR_NOMEM, "request");
    engine_domain_root(p, r->root);
    r->prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    r->n_prompt = n_prompt;
    r->max_tokens = max_tokens;
    r->sp = p->sp;
    r->sp.seed = p->sp.seed + (uint64_t)i; // choice i: an n=1 request with seed + i
    r->ignore_eos = p->ignore_eos;
    r->prompt_lp = i == 0 && p->prompt_logprobs;
    r->prompt_top = p->prompt_top;
    r->t_submit = ks_now_ns();
    ks_err ce = KS_OK;
    if (r->prompt) memcpy(r->prompt, prompt, sizeof(int32_t) * (size_t)n_prompt);
    if (!r->prompt || (ce = sampler_create(&r->sp, e->V, &r->smp, eb)) ||
        (ce = sampler_set_bias(r->smp, p->bias, p->n_bias, eb)) ||
        (ce = engine_stream_create(p->stops, p->n_stops, &r->out, eb)) ||
        (p->grammar && (ce = engine__grammar_init(e, r, p->grammar, eb)))) {
        engine__req_free(r);
        return ce ? ce : ks_seterr(eb, KS_ERR_NOMEM, "request");
    }
    engine_stream_set_wake(r->out, engine__wake, e);
    engine_stream_set_min_tokens(r->out, p->sp.min_tokens);
    *out = r;
    return KS_OK;
}

/* Pages a group of n choices can need at most: choice 0's prompt +
 * max_tokens, and each other choice's pages past the shared ones. */
static uint64_t engine__group_pages(uint32_t P, int32_t n_prompt, int32_t max_tokens, int n) {
    uint64_t total = ((uint64_t)n_prompt + (uint64_t)max_tokens + P - 1) / P;
    uint64_t shared = n_prompt > 0 ? (uint64_t)(n_prompt - 1) / P : 0;
    return total + (uint64_t)(n - 1) * (total - shared);
}

ks_err engine_submit(engine *e, const engine_params *p, engine_req **out, ks_errbuf *eb) {
    return engine_submit_n(e, p, 1, out, eb);
}

ks_err engine_submit_n(engine *e, const engine_params *p, int n, engine_req **out, ks_errbuf *eb) {
    for (int i = 0; i < n && i < ENGINE_MAX_N; i++)
        out[i] = NULL;
    admit_limits lim = {.n_ctx = e->o.n_ctx,
                        .n_vocab = e->V,
                        .page_tokens = (uint32_t)e->o.page_tokens,
                        .max_pages = kv_pool_n_pages(e->pool)};
    // echo with max_tokens 0: admitted (and reserved) as one token
    engine_params q = *p;
    bool prompt_only = p->prompt_logprobs && p->max_tokens == 0;
    if (prompt_only) q.max_tokens = 1;
    admit_admitted ad;
    ks_err err = KS_OK;
    ks_errbuf seb;
    if (n < 1 || n > ENGINE_MAX_N)
        err = admit_refuse(eb, ADMIT_INVALID, "n must be in [1, %d], got %d", ENGINE_MAX_N, n);
    else if (n > e->o.max_running)
        err = admit_refuse(eb, ADMIT_INVALID,
                           "%d choices run at once, and this server runs at most %d sequences "
                           "(--max-running)",
                           n, e->o.max_running);
    else if (prompt_only && n > 1)
        err = admit_refuse(eb, ADMIT_INVALID, "max_tokens 0 allows one choice only, got n=%d", n);
    else if (p->prompt_top < 0 || p->prompt_top > SAMPLE_MAX_TOP)
        err = admit_refuse(eb, ADMIT_INVALID, "prompt logprobs: %d alternatives (at most %d)",
                           (int)p->prompt_top, SAMPLE_MAX_TOP);
    else if (sample_bias_validate(p->bias, p->n_bias, e->V, &seb) != KS_OK)
        err = admit_refuse(eb, ADMIT_INVALID, "%s", seb.msg);
    if (!err) err = admit_request(&lim, &q, &ad, eb);
    const int32_t *prompt = ad.prompt;
    const int32_t n_prompt = ad.n_prompt, max_tokens = prompt_only ? 0 : ad.max_tokens;
    if (!err && n > 1) {
        uint64_t need = engine__group_pages(lim.page_tokens, n_prompt, ad.max_tokens, n);
        if (need > lim.max_pages)
            err = admit_refuse(eb, ADMIT_KV_CAPACITY,
                               "%d choices of %d prompt + %d completion tokens need up to %" PRIu64
                               " KV pages (the prompt's shared), and the pool has %u",
                               n, n_prompt, ad.max_tokens, need, lim.max_pages);
    }
    if (!err && !atomic_load(&e->online)) err = admit_refuse(eb, ADMIT_OFFLINE, NULL);
    if (err) {
        atomic_fetch_add(&e->n_rejected, 1);
        return err;
    }
    engine_req *rs[ENGINE_MAX_N] = {0};
    for (int i = 0; i < n; i++) {
        ks_err be = engine__req_build(e, p, prompt, n_prompt, max_tokens, i, &rs[i], eb);
        if (be) {
            for (int k = 0; k < i; k++)
                engine__req_free(rs[k]);
            return be;
        }
        if (i > 0) { // choice 0 leads: it alone sits in the queue and prefills the prompt
            rs[i]->leader = rs[0];
            rs[0]->fol[rs[0]->n_fol++] = rs[i];
        }
    }
    engine_req *r = rs[0];
    pthread_mutex_lock(&e->mu);
    if (e->n_waiting >= (uint32_t)e->o.queue_max || e->stop) {
        pthread_mutex_unlock(&e->mu);
        for (int k = 0; k < n; k++)
            engine__req_free(rs[k]);
        atomic_fetch_add(&e->n_rejected, 1);
        return e->stop
                   ? admit_refuse(eb, ADMIT_DRAINING, NULL)
                   : admit_refuse(eb, ADMIT_BUSY, "the server is busy: %d requests already waiting",
                                  e->o.queue_max);
    }
    if (e->wait_tail) e->wait_tail->next = r;
    else e->wait_head = r;
    e->wait_tail = r;
    e->n_waiting++;
    atomic_store(&e->st_queued, e->n_waiting);
    e->kick++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n; i++)
        out[i] = rs[i];
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Scheduler helpers

static void engine__group_leave(engine *e, engine_req *r);

/* Ends a request: releases its pages (exactly once), posts the done event,
 * drops the scheduler's reference. */

static uint64_t engine__mask_cpu(engine *e, engine_req *r);

static void engine__finish_reason(engine *e, engine_req *r, engine_state to, engine_finish fin,
                                  ks_err err, uint16_t reason, const char *msg) {
    engine__set_state(r, to);
    engine__group_leave(e, r);
    if (r->has_seq) {
        kv_seq_release(e->pool, &r->seq);
        r->has_seq = false;
    }
    atomic_fetch_add(to == ENGINE_FINISHED ? &e->n_finished : &e->n_aborted, 1);
    engine_outcome o = {.state = to,
                        .finish = fin,
                        .err = err,
                        .msg = msg,
                        .n_prompt = r->n_prompt,
                        .n_gen = r->n_gen,
                        .n_cached = r->n_cached,
                        .t_submit_ns = r->t_submit,
                        .t_first_ns = r->t_first,
                        .t_sched_ns = r->t_sched,
                        .reason = reason,
                        .mask_ns = r->gm ? engine__mask_cpu(e, r) : 0};
    engine_stream_finish(r->out, &o, e->piece, e->piece_cap);
    engine__req_unref(r);
}

static void engine__finish(engine *e, engine_req *r, engine_state to, engine_finish fin, ks_err err,
                           const char *msg) {
    engine__finish_reason(e, r, to, fin, err, 0, msg);
}

/* Unlinks an ending request from its choice group: a choice still waiting
 * for the prompt leaves its choice 0's list; a choice 0 ending before its
 * choices forked ends them too (queued ones here, running ones at the next
 * step, where they are in the running set), so none waits for a prompt
 * that will never be computed. Their pages are released by their own
 * finish, exactly once each. */
static void engine__group_leave(engine *e, engine_req *r) {
    if (r->leader) {
        engine_req *l = r->leader;
        for (int i = 0; i < l->n_fol; i++)
            if (l->fol[i] == r) {
                l->fol[i] = l->fol[--l->n_fol];
                break;
            }
        r->leader = NULL;
    }
    int n = r->n_fol;
    r->n_fol = 0;
    for (int i = 0; i < n; i++) {
        engine_req *f = r->fol[i];
        f->leader = NULL;
        if (atomic_load(&f->state) == ENGINE_QUEUED)
            engine__finish(e, f, ENGINE_ABORTED, ENGINE_FINISH_ABORT, KS_ERR_CANCELLED,
                           "aborted: the request's prompt was not computed");
        else
            f->orphan = true;
    }
}

/* Choice 0 of a group computed the prompt (its pages are READY): every
 * waiting choice now shares its full prompt pages before the last one
 * (read-only, tags kept, I1) and computes the rest of the prompt itself.
 * Runs before choice 0 samples, so the pages are still held even when its
 * first token ends it. */
static void engine__group_fork(engine *e, engine_req *r) {
    const uint32_t P = (uint32_t)e->o.page_tokens;
    const uint32_t shared = (uint32_t)(r->n_prompt - 1) / P;
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
        f->n_past = (int32_t)(shared * P);
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
        for (int j = 0; j < e->n_running; j++)
            if (engine__seq(e->running[j])->uid == v[i].seq_uid) r = e->running[j];
        char json[768];
        snprintf(json, sizeof json,
                 "{\"event\":\"isolation_violation\",\"request_id\":%" PRIu64 ",\"tenant\":\"%s\","
                 "\"seq_uid\":\"%016" PRIx64 "\",\"page\":%u,\"expected\":{\"seq_uid\":\"%016" PRIx64
                 "\",\"gen\":%" PRIu64 "},\"found\":{\"seq_uid\":\"%016" PRIx64 "\",\"gen\":%" PRIu64
                 "},\"page_state\":\"%s\"}",
                 r ? r->id : 0, r ? r->tenant : "?", v[i].seq_uid, v[i].page, v[i].expected.seq_uid,
                 v[i].expected.gen, v[i].found.seq_uid, v[i].found.gen,
                 (unsigned)v[i].state < 4 ? states[v[i].state] : "?");
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
        uint32_t shared = (uint32_t)(r->n_prompt - 1) / P; // pages its other choices share
        uint32_t own = (need + P - 1) / P - shared;        // pages each of them owns
        uint32_t need_pages = (need + P - 1) / P - r->seq.n_pages + (uint32_t)r->n_fol * own;
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
        r->t_sched = now;
        engine__set_state(r, ENGINE_PREFILLING);
        e->running[e->n_running++] = r;
        atomic_fetch_add(&e->tokens_in, (unsigned long long)r->n_prompt);
        for (int i = 0; i < r->n_fol; i++) { // they wait in the running set (not batched)
            engine__set_state(r->fol[i], ENGINE_PREFILLING);
            e->running[e->n_running++] = r->fol[i];
        }
    }
    atomic_store(&e->st_queued, e->n_waiting);
    pthread_mutex_unlock(&e->mu);
    atomic_store(&e->st_running, (unsigned)e->n_running);
}

void engine_ban_eog(const tok_vocab *v, int32_t min_tokens, int32_t n_gen, float *logits,
                    int32_t n_vocab) {
    if (n_gen >= min_tokens) return;
    for (int32_t i = 0; i < n_vocab; i++)
        if (tok_is_eog(v, i)) logits[i] = -INFINITY;
}

/* Handles one chosen token of r (sampled here, or by a prefill worker for an
 * adopted request): EOS, penalty history, text, stop strings, max_tokens.
 * Returns true if r finished. */
static bool engine__take(engine *e, engine_req *r, const sample_result *sr) {
    if (!r->t_first) r->t_first = ks_now_ns();
    if ((!r->ignore_eos || r->gm) && tok_is_eog(e->vocab, sr->token)) {
        engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
        return true;
    }
    sampler_accept(r->smp, sr->token);
    r->n_gen++;
    r->last = sr->token;
    atomic_fetch_add(&e->tokens_out, 1);
    bool matched = false;
    if (engine_stream_token(r->out, e->vocab, sr, e->piece, e->piece_cap, &matched) != KS_OK) {
        engine__finish(e, r, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_NOMEM, "out of memory");
        return true;
    }
    if (matched) {
        engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
        return true;
    }
    if (r->n_gen >= r->max_tokens) {
        engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_LENGTH, KS_OK, NULL);
        return true;
    }
    return false;
}

/* The scheduler's token trie, built at the first constrained step. False
 * (r finished with an error) on out-of-memory. */
static bool engine__grammar_vocab(engine *e, engine_req *r) {
    if (e->gvocab) return true;
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    if (grammar_vocab_create(e->vocab, &e->gvocab, &eb) != KS_OK) {
        engine__finish(e, r, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_NOMEM,
                       "out of memory for the grammar's token trie");
        return false;
    }
    return true;
}

// ----------------------------------------------------------------------------
// Grammar masks, off the scheduler thread
//
// A constrained request's draw (grammar_sample: mask, sample, advance) runs
// as a job on a mask thread, from a copy of its logits row. The step waits
// for its jobs at most as long as its forward pass took; a request whose
// job is not done by then sits the next steps out (mpending) and is
// collected at the start of a later step. The budgets are CPU time of the
// job's thread, checked when the job is done and, while it runs, at every
// step: a request over one ends at once (its job runs on and is dropped).

enum { ENGINE__MASK_IDLE, ENGINE__MASK_QUEUED, ENGINE__MASK_RUNNING, ENGINE__MASK_DONE };

#define ENGINE__MASK_NICE 10 // mask threads yield the CPU to the forward pass
#define ENGINE__MASK_IDLE_WAIT_NS 10000000ull // nothing but draws to wait for: 10 ms at a time

static uint64_t engine__clock_ns(clockid_t clk) {
    struct timespec ts;
    if (clock_gettime(clk, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CPU r's masks took, the running one's so far included; e->mmu held. */
static uint64_t engine__mask_cpu_locked(engine_req *r) {
    uint64_t ns = r->mask_ns;
    if (atomic_load(&r->mstate) == ENGINE__MASK_RUNNING) {
        uint64_t now = engine__clock_ns(r->mclk);
        if (now > r->mcpu0) ns += now - r->mcpu0;
    }
    return ns;
}

static uint64_t engine__mask_cpu(engine *e, engine_req *r) {
    pthread_mutex_lock(&e->mmu);
    uint64_t ns = engine__mask_cpu_locked(r);
    pthread_mutex_unlock(&e->mmu);
    return ns;
}

static void engine__wake(void *ctx);

/* A mask thread: takes jobs, least-served request first, until stop. */
static void *engine__mask_main(void *arg) {
    engine *e = arg;
#ifdef __linux__
    // per-thread niceness (Linux): a grammar's CPU never delays a batch's forward pass
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), ENGINE__MASK_NICE) != 0)
        ks_log(KS_LOG_DEBUG, "mask thread: setpriority: %s", strerror(errno));
#endif
    clockid_t clk = CLOCK_THREAD_CPUTIME_ID;
    if (pthread_getcpuclockid(pthread_self(), &clk) != 0) clk = CLOCK_THREAD_CPUTIME_ID;
    pthread_mutex_lock(&e->mmu);
    for (;;) {
        while (!e->mq_head && !e->mstop)
            pthread_cond_wait(&e->mcv, &e->mmu);
        if (e->mstop) break; // what is still queued is dropped by engine__free
        // the job of the request whose masks have cost least so far (FIFO
        // among equals): a cheap grammar's draw never waits behind an
        // expensive one's, whoever queued first
        engine_req *r = e->mq_head, *before = NULL;
        for (engine_req *q = e->mq_head, *p = NULL; q; p = q, q = q->mnext)
            if (q->mask_ns < r->mask_ns) r = q, before = p;
        if (before) before->mnext = r->mnext;
        else e->mq_head = r->mnext;
        if (e->mq_tail == r) e->mq_tail = before;
        r->mnext = NULL;
        r->mclk = clk;
        r->mcpu0 = engine__clock_ns(clk);
        atomic_store(&r->mstate, ENGINE__MASK_RUNNING);
        pthread_mutex_unlock(&e->mmu);
        // a request that already ended (cancelled, over its budget) is not worked on
        engine_state st = engine_req_state(r);
        if (st != ENGINE_FINISHED && st != ENGINE_ABORTED) {
            ks_errbuf eb;
            ks_errbuf_clear(&eb);
            r->mend = false;
            r->merr = grammar_sample(r->gm, e->gvocab, r->smp, &r->sp, r->mlogits, r->gmask,
                                     &r->msr, &r->mend, &eb);
            if (r->merr) {
                r->mreason = eb.reason;
                snprintf(r->mmsg, sizeof r->mmsg, "%s", eb.msg);
            }
        }
        uint64_t c1 = engine__clock_ns(clk);
        pthread_mutex_lock(&e->mmu);
        r->mlast_ns = c1 > r->mcpu0 ? c1 - r->mcpu0 : 0;
        r->mask_ns += r->mlast_ns;
        atomic_store(&r->mstate, ENGINE__MASK_DONE);
        pthread_cond_broadcast(&e->mdone);
        pthread_mutex_unlock(&e->mmu);
        engine__wake(e); // the scheduler may sleep with nothing else to run
        engine__req_unref(r);
        pthread_mutex_lock(&e->mmu);
    }
    pthread_mutex_unlock(&e->mmu);
    return NULL;
}

/* Queues r's draw from logits_row (copied). Returns true if r finished
 * instead (no token trie: out of memory). */
static bool engine__mask_post(engine *e, engine_req *r, const float *logits_row) {
    if (!engine__grammar_vocab(e, r)) return true;
    memcpy(r->mlogits, logits_row, sizeof(float) * (size_t)e->V);
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed); // the job's
    r->mpending = true;
    r->mstep = e->n_steps;
    pthread_mutex_lock(&e->mmu);
    atomic_store(&r->mstate, ENGINE__MASK_QUEUED);
    if (e->mq_tail) e->mq_tail->mnext = r;
    else e->mq_head = r;
    e->mq_tail = r;
    pthread_cond_signal(&e->mcv);
    pthread_mutex_unlock(&e->mmu);
    return false;
}

/* Ends r for going over a mask budget (a 400 naming the limit). */
static void engine__mask_over(engine *e, engine_req *r, bool per_token, uint64_t ns) {
    char msg[256];
    if (per_token)
        snprintf(msg, sizeof msg,
                 "the grammar's mask took %.1f ms of CPU for one token, over this server's limit "
                 "of %g ms (--grammar-budget-ms); simplify the grammar",
                 (double)ns / 1e6, (double)e->o.grammar_budget_us / 1e3);
    else
        snprintf(msg, sizeof msg,
                 "the grammar's masks took %.1f ms of CPU in all, over this server's limit of %g "
                 "ms per request (--grammar-cpu-ms); simplify the grammar or lower max_tokens",
                 (double)ns / 1e6, (double)e->o.grammar_cpu_us / 1e3);
    ks_log(KS_LOG_WARN, "request %" PRIu64 " (tenant %s): %s", r->id, r->tenant, msg);
    engine__finish_reason(e, r, ENGINE_ABORTED, ENGINE_FINISH_ERROR, KS_ERR_INVAL, ADMIT_INVALID,
                          msg);
}

/* A done job's result: the budgets, then the token as engine__take handles
 * it; ends the request once the grammar can accept nothing more. Returns
 * true if r finished. */
static bool engine__mask_take(engine *e, engine_req *r, uint64_t last_ns, uint64_t total_ns) {
    const uint64_t us = 1000ull; // budgets are in microseconds, CPU clocks in nanoseconds
    if (e->o.grammar_budget_us && last_ns > e->o.grammar_budget_us * us) {
        engine__mask_over(e, r, true, last_ns);
        return true;
    }
    if (e->o.grammar_cpu_us && total_ns > e->o.grammar_cpu_us * us) {
        engine__mask_over(e, r, false, total_ns);
        return true;
    }
    if (r->merr != KS_OK) { // a grammar no token can continue is the request's fault (400)
        engine__finish_reason(e, r, ENGINE_ABORTED, ENGINE_FINISH_ERROR, r->merr, r->mreason,
                              r->mmsg);
        return true;
    }
    if (r->mend) {
        engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
        return true;
    }
    if (engine__take(e, r, &r->msr)) return true;
    if (grammar_matcher_done(r->gm)) {
        engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
        return true;
    }
    return false;
}

/* Collects the running set's done jobs (their tokens) and ends requests
 * whose running job is already over a budget; finished requests leave the
 * running set. */
static void engine__mask_collect(engine *e) {
    enum { KEEP, TAKE, OVER_TOKEN, OVER_TOTAL };
    uint8_t *act = e->m_act;
    uint64_t *last = e->m_last, *total = e->m_total;
    const uint64_t us = 1000ull; // budgets are in microseconds, CPU clocks in nanoseconds
    bool any = false;
    pthread_mutex_lock(&e->mmu);
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        act[i] = KEEP;
        if (!r->mpending) continue;
        int st = atomic_load(&r->mstate);
        if (st == ENGINE__MASK_DONE) {
            atomic_store(&r->mstate, ENGINE__MASK_IDLE);
            act[i] = TAKE;
            last[i] = r->mlast_ns;
            total[i] = r->mask_ns;
        } else if (st == ENGINE__MASK_RUNNING) {
            uint64_t now = engine__clock_ns(r->mclk);
            last[i] = now > r->mcpu0 ? now - r->mcpu0 : 0;
            total[i] = r->mask_ns + last[i];
            if (e->o.grammar_budget_us && last[i] > e->o.grammar_budget_us * us) act[i] = OVER_TOKEN;
            else if (e->o.grammar_cpu_us && total[i] > e->o.grammar_cpu_us * us)
                act[i] = OVER_TOTAL;
        }
        any |= act[i] != KEEP;
    }
    pthread_mutex_unlock(&e->mmu);
    if (!any) return;
    int kept = 0, n_run = e->n_running;
    for (int i = 0; i < n_run; i++) {
        engine_req *r = e->running[i];
        bool gone = false;
        if (act[i] == TAKE) {
            r->mpending = false;
            gone = engine__mask_take(e, r, last[i], total[i]);
        } else if (act[i] != KEEP) {
            engine__mask_over(e, r, act[i] == OVER_TOKEN, act[i] == OVER_TOKEN ? last[i] : total[i]);
            gone = true;
        }
        if (!gone) e->running[kept++] = r;
    }
    e->n_running = kept;
    atomic_store(&e->st_running, (unsigned)kept);
}

/* Waits until every job of the running set that this step posted is done
 * (any: one job of any step), or until deadline_ns (ks_now_ns clock). A job
 * of an earlier step that is still running is an expensive one: waiting
 * for it again would only slow the others. */
static void engine__mask_wait(engine *e, uint64_t deadline_ns, bool any) {
    pthread_mutex_lock(&e->mmu);
    for (;;) {
        int n_pending = 0, n_done = 0;
        for (int i = 0; i < e->n_running; i++) {
            engine_req *r = e->running[i];
            if (!r->mpending || (!any && r->mstep != e->n_steps)) continue;
            if (atomic_load(&r->mstate) == ENGINE__MASK_DONE) n_done++;
            else n_pending++;
        }
        uint64_t now = ks_now_ns();
        if (!n_pending || (any && n_done) || now >= deadline_ns) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (deadline_ns - now);
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&e->mdone, &e->mmu, &ts);
    }
    pthread_mutex_unlock(&e->mmu);
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
 * point the newer one's first block-table entry at the older one's page. */
static void engine__inject_fault(engine *e) {
    const char *f = getenv("KS_FAULT");
    if (e->fault_done || !f || strcmp(f, "swap_page") != 0) return;
    engine_req *a = NULL, *b = NULL;
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        if (atomic_load(&r->state) != ENGINE_DECODING || engine__seq(r)->n_shared) continue;
        if (!a) a = r;
        else b = r;
    }
    if (!a || !b) return;
    kv_fault_swap_entry(engine__seq(b), engine__seq(a), 0);
    e->fault_done = true;
    ks_log(KS_LOG_WARN, "TEST FAULT: request %" PRIu64 " now points at a page of request %" PRIu64,
           b->id, a->id);
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
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        r->batch_slot = i;
        r->out_row = -1;
        r->lp_n = 0;
        r->hid_n = 0;
        e->b_seqs[i] = engine__seq(r);
        if (atomic_load(&r->state) != ENGINE_DECODING || n >= budget) continue;
        if (r->mpending) continue; // its next token is still being drawn (mask thread)
        if (engine_stream_backlogged(r->out)) {
            n_paused++;
            continue;
        }
        e->b_tok[n] = r->last;
        e->b_pos[n] = r->n_prompt + r->n_gen - 1;
        e->b_seq[n] = i;
        e->b_out[n] = r->out_row = n_out++;
        e->b_hid[n] = -1;
        n++;
    }
    int32_t lp_rows = ENGINE__PROMPT_ROWS; // extra logits rows left for prompt logprobs
    for (int i = 0; i < e->n_running && n < budget; i++) {
        engine_req *r = e->running[i];
        if (atomic_load(&r->state) != ENGINE_PREFILLING || r->leader) continue;
        int32_t chunk = r->n_prompt - r->n_past;
        if (chunk > budget - n) chunk = budget - n;
        if (r->prompt_lp) { // a logits row for every prompt position
            if (chunk > lp_rows) chunk = lp_rows;
            if (chunk == 0) continue;
            lp_rows -= chunk;
            r->lp_row0 = n_out;
            r->lp_pos0 = r->n_past;
            r->lp_n = chunk;
        }
        if (r->embed) { // hidden rows, no logits: every position's (mean) or the last's
            r->hid_row0 = n_hid;
            r->hid_n = 0;
        }
        for (int32_t j = 0; j < chunk; j++) {
            e->b_tok[n] = r->prompt[r->n_past + j];
            e->b_pos[n] = r->n_past + j;
            e->b_seq[n] = i;
            bool last = r->n_past + j == r->n_prompt - 1;
            e->b_hid[n] = -1;
            if (r->embed) {
                e->b_out[n] = -1;
                if (r->embed == MODEL_POOL_MEAN || last) e->b_hid[n] = n_hid++, r->hid_n++;
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
                     .seq_err = e->b_err};
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
            if (r->lp_n > 0) engine__prompt_events(e, r);
            if (r->out_row >= 0) {
                if (atomic_load(&r->state) == ENGINE_PREFILLING) {
                    engine__set_state(r, ENGINE_DECODING);
                    if (e->prefix) // full prompt pages become reusable by this tenant (I7)
                        kv_prefix_publish(e->prefix, r->root, r->prompt, (uint32_t)r->n_prompt,
                                          &r->seq);
                    if (r->n_fol) engine__group_fork(e, r);
                }
                if (r->max_tokens == 0) { // echo only: the prompt was all it asked for
                    engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_LENGTH, KS_OK, NULL);
                    gone = true;
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

static void *engine__main(void *arg) {
    engine *e = arg;
    e->sched_tid = pthread_self();
    bool busy = false;  // the last step ran something
    for (;;) {
        pthread_mutex_lock(&e->mu);
        bool stop = e->stop;
        uint64_t kick = e->kick;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
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
            bool clean = kv_pool_all_free_and_scrubbed(e->pool);
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
// Decode workers: adopting a request whose prompt KV was computed elsewhere

kv_pool *engine_pool(engine *e) {
    KS_ASSERT(e);
    KS_ASSERT(pthread_equal(pthread_self(), e->sched_tid) && e->in_hook);  // poll / poll_end only
    return e->pool;
}

ks_err engine_adopt(engine *e, const engine_adopt_args *a, engine_req **out, ks_errbuf *eb) {
    KS_ASSERT(e && a && out);
    KS_ASSERT(pthread_equal(pthread_self(), e->sched_tid) && e->in_hook == 1);  // poll only
    *out = NULL;
    const uint64_t P = (uint64_t)e->o.page_tokens;
    const int32_t n_prompt = a->n_prompt, max_tokens = a->max_tokens;
    admit_limits lim = {.n_ctx = e->o.n_ctx, .n_vocab = e->V, .page_tokens = (uint32_t)P};
    ks_err err = a->seq ? admit_lengths(&lim, n_prompt, max_tokens, eb)
                        : admit_refuse(eb, ADMIT_INTERNAL, "adopt: no KV sequence");
    if (!err && (a->first.token < 0 || a->first.token >= e->V))
        err = admit_refuse(eb, ADMIT_INTERNAL, "adopt: first token id %d out of range [0, %d)",
                           a->first.token, e->V);
    else if (!err && (a->first.n_top < 0 || a->first.n_top > SAMPLE_MAX_TOP))
        err = admit_refuse(eb, ADMIT_INTERNAL, "adopt: %d top logprobs (at most %d)",
                           a->first.n_top, SAMPLE_MAX_TOP);
    else if (!err && a->rng_draws > (uint64_t)e->o.n_ctx) // one draw per token at most
        err = admit_refuse(eb, ADMIT_INTERNAL,
                           "adopt: rng_draws %" PRIu64 " above the context length %d", a->rng_draws,
                           e->o.n_ctx);
    else if (!err && (a->seq->n_tokens < (uint32_t)n_prompt ||
                      (uint64_t)a->seq->n_pages * P < (uint64_t)n_prompt + (uint64_t)max_tokens))
        err = admit_refuse(eb, ADMIT_INTERNAL,
                           "adopt: the sequence has %u positions filled and %u pages; the request "
                           "needs %d filled and room for %d",
                           a->seq->n_tokens, a->seq->n_pages, n_prompt, n_prompt + max_tokens);
    for (int k = 0; !err && k < a->first.n_top; k++)
        if (a->first.top_ids[k] < 0 || a->first.top_ids[k] >= e->V)
            err = admit_refuse(eb, ADMIT_INTERNAL, "adopt: top logprob id %d out of range [0, %d)",
                               a->first.top_ids[k], e->V);
    ks_errbuf seb;
    if (!err && sample_params_validate(&a->sp, &seb) != KS_OK)
        err = admit_refuse(eb, ADMIT_INVALID, "%s", seb.msg);
    else if (!err && sample_bias_validate(a->bias, a->n_bias, e->V, &seb) != KS_OK)
        err = admit_refuse(eb, ADMIT_INVALID, "%s", seb.msg);
    if (!err && (!atomic_load(&e->online) || atomic_load(&e->abort_all)))
        err = admit_refuse(eb, ADMIT_OFFLINE, NULL);
    if (!err && e->n_running >= e->o.max_running)
        err = admit_refuse(eb, ADMIT_BUSY, "decode batch full: %d requests running", e->n_running);
    if (err) {
        atomic_fetch_add(&e->n_rejected, 1);
        return err;
    }
    engine_req *r = engine__req_new(e, a->tenant);
    if (!r) return ks_seterr(eb, KS_ERR_NOMEM, "request");
    r->n_prompt = n_prompt;  // the prompt's ids stay with the prefill side (r->prompt NULL)
    r->max_tokens = max_tokens;
    r->sp = a->sp;
    r->ignore_eos = a->ignore_eos;
    r->t_submit = ks_now_ns();
    ks_err ce;
    if ((ce = sampler_create(&a->sp, e->V, &r->smp, eb)) ||
        (ce = sampler_set_bias(r->smp, a->bias, a->n_bias, eb)) ||
        (ce = engine_stream_create(NULL, 0, &r->out, eb)) || // no stop strings: the router's
        (a->grammar && (ce = engine__grammar_init(e, r, a->grammar, eb)))) {
        engine__req_free(r);
        return ce;
    }
    if (r->gm) { // the prefill side's first token advances the grammar as a sampled one does
        if (!e->gvocab && (ce = grammar_vocab_create(e->vocab, &e->gvocab, eb))) {
            engine__req_free(r);
            return ce;
        }
        bool ok = tok_is_eog(e->vocab, a->first.token)
                      ? grammar_matcher_complete(r->gm)
                      : grammar_matcher_accept_token(r->gm, e->gvocab, a->first.token);
        if (!ok) {
            engine__req_free(r);
            atomic_fetch_add(&e->n_rejected, 1);
            return admit_refuse(eb, ADMIT_INVALID,
                                "adopt: the first token %d does not match the grammar",
                                a->first.token);
        }
    }
    engine_stream_set_wake(r->out, engine__wake, e);
    sampler_skip_draws(r->smp, a->rng_draws);  // continue the prefill side's PRNG sequence
    r->ext = a->seq;
    r->n_past = n_prompt;
    // through the table like any request: its prompt was prefilled elsewhere
    engine__set_state(r, ENGINE_PREFILLING);
    engine__set_state(r, ENGINE_DECODING);
    atomic_fetch_add(&e->tokens_in, (unsigned long long)n_prompt);
    *out = r;
    // the first token exactly as engine__emit handles a sampled one; the step
    // then feeds it at position n_prompt
    bool ended = engine__take(e, r, &a->first);
    if (!ended && r->gm && grammar_matcher_done(r->gm)) {
        engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
        ended = true;
    }
    if (!ended) {
        e->running[e->n_running++] = r;
        atomic_store(&e->st_running, (unsigned)e->n_running);
    }
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Embeddings (engine.h): a prompt-only request kind

ks_err engine_embed_submit(engine *e, const engine_embed_params *p, engine_req **out,
                           ks_errbuf *eb) {
    *out = NULL;
    admit_limits lim = {.n_ctx = e->o.n_ctx,
                        .n_vocab = e->V,
                        .page_tokens = (uint32_t)e->o.page_tokens,
                        .max_pages = kv_pool_n_pages(e->pool)};
    model_pooling pool = p->pooling ? p->pooling : e->o.pooling;
    ks_err err = admit_embed(&lim, p->tokens, p->n_tokens, eb);
    if (!err && !model_pooling_name(pool))
        err =
            admit_refuse(eb, ADMIT_INVALID, "pooling %d is not supported (mean, last)", (int)pool);
    if (!err && !atomic_load(&e->online)) err = admit_refuse(eb, ADMIT_OFFLINE, NULL);
    if (err) {
        atomic_fetch_add(&e->n_rejected, 1);
        return err;
    }
    const size_t E = (size_t)model_hp(e->m)->n_embd;
    engine_req *r = engine__req_new(e, p->tenant);
    if (!r) return ks_seterr(eb, KS_ERR_NOMEM, "request");
    engine_params dp = {.tenant = p->tenant};
    engine_domain_root(&dp, r->root); // the tenant's domain, though embeddings never use the cache
    r->prompt = malloc(sizeof(int32_t) * (size_t)p->n_tokens);
    r->eacc = malloc(sizeof(double) * E);
    r->evec = malloc(sizeof(float) * E);
    r->n_prompt = p->n_tokens;
    r->max_tokens = 0; // prompt only: its pages hold the input, nothing more
    r->embed = pool;
    r->t_submit = ks_now_ns();
    ks_err ce = KS_OK;
    if (!r->prompt || !r->eacc || !r->evec || (ce = engine_stream_create(NULL, 0, &r->out, eb))) {
        engine__req_free(r);
        return ce ? ce : ks_seterr(eb, KS_ERR_NOMEM, "request");
    }
    memcpy(r->prompt, p->tokens, sizeof(int32_t) * (size_t)p->n_tokens);
    model_embd_begin(&r->ea, pool, (int32_t)E, r->eacc);
    engine_stream_set_wake(r->out, engine__wake, e);
    pthread_mutex_lock(&e->mu);
    if (e->n_waiting >= (uint32_t)e->o.queue_max || e->stop) {
        bool stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        engine__req_free(r);
        atomic_fetch_add(&e->n_rejected, 1);
        return stop
                   ? admit_refuse(eb, ADMIT_DRAINING, NULL)
                   : admit_refuse(eb, ADMIT_BUSY, "the server is busy: %d requests already waiting",
                                  e->o.queue_max);
    }
    if (e->wait_tail)
        e->wait_tail->next = r;
    else
        e->wait_head = r;
    e->wait_tail = r;
    e->n_waiting++;
    atomic_store(&e->st_queued, e->n_waiting);
    e->kick++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return KS_OK;
}

ks_err engine_req_embedding(engine_req *r, float *out, int32_t cap) {
    int32_t E = model_hp(r->e->m)->n_embd;
    if (!r->embed || cap < E || engine_req_state(r) != ENGINE_FINISHED ||
        !engine_stream_done_posted(r->out))
        return KS_ERR_INVAL;
    memcpy(out, r->evec, sizeof(float) * (size_t)E);
    return KS_OK;
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
    free(e->piece);
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
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->vmu, NULL);
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
    size_t R = (size_t)o->max_running, B = (size_t)o->max_batch_tokens;
    e->running = calloc(R, sizeof *e->running);
    e->logits = malloc(sizeof(float) * (R + ENGINE__PROMPT_ROWS) * (size_t)e->V);
    e->b_tok = malloc(sizeof(int32_t) * B * 4);
    e->b_seqs = calloc(R, sizeof *e->b_seqs);
    e->b_err = calloc(R, sizeof *e->b_err);
    e->piece_cap = tok_stream_bound(e->vocab);
    e->piece = malloc(e->piece_cap);
    e->hidden = malloc(sizeof(float) * B * (size_t)model_hp(o->m)->n_embd);
    e->b_hid = malloc(sizeof(int32_t) * B);
    if (!e->o.pooling) e->o.pooling = model_pooling_default(o->m);
    if (!e->running || !e->logits || !e->b_tok || !e->b_seqs || !e->b_err || !e->piece ||
        !e->hidden || !e->b_hid) {
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
    if (warn) ks_log(KS_LOG_WARN, "%s", msg);
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
    out->n_violations = atomic_load(&e->n_violations);
}
