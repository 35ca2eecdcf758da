/* request.c — the engine's request objects (engine.h, engine_int.h): the
 * state machine, submitting (engine_submit_n: admit.c's checks, then the
 * engine's own, I4; the choices of a group), adopting a request whose prompt
 * was prefilled elsewhere (engine_adopt, decode workers), embeddings,
 * events, cancel and release, and a request's end (engine__finish: pages
 * released exactly once, the done event posted). Submitters run on their
 * own threads and meet the scheduler only at the engine's queue (e->mu)
 * and at each request's event stream; adopting, ending and taking a token
 * run on the scheduler thread. */
#include "engine_int.h"

#include "kvseal/admit.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
// Events

ks_err engine_req_next(engine_req *r, engine_event *ev, uint32_t timeout_ms) {
    return engine_stream_next(r->out, ev, timeout_ms);
}

// ----------------------------------------------------------------------------
// Request objects

static void engine__req_free(engine_req *r) {
    KS_ASSERT(!r->has_seq);  // pages are released by the scheduler, exactly once
    engine__adapter_unref(r->e, r->adapter); // a request that never ran (ended ones hold none)
    sampler_destroy(r->smp);
    grammar_matcher_destroy(r->gm);
    free(r->gmask);
    free(r->mlogits);
    engine_stream_destroy(r->out);
    free(r->prompt);
    free(r->gen);
    free(r->pred);
    free(r->eacc);
    free(r->evec);
    free(r);
}

void engine__req_unref(engine_req *r) {
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) engine__req_free(r);
}

void engine__set_state(engine_req *r, engine_state to) {
    engine_state from = (engine_state)atomic_load(&r->state);
    KS_ASSERT(engine_transition_ok(from, to));  // the table is the only way between states
    atomic_store(&r->state, (int)to);
}

/* The block table the step works on: the borrowed one for adopted requests. */
kv_seq *engine__seq(engine_req *r) { return r->ext ? r->ext : &r->seq; }

engine_state engine_req_state(const engine_req *r) {
    return (engine_state)atomic_load(&((engine_req *)r)->state);
}

/* engine_stream wake hook: a paused request's client caught up. */
void engine__wake(void *ctx) {
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
static ks_err engine__req_build(engine *e, const engine_params *p, engine__adapter *ad,
                                const int32_t *prompt, int32_t n_prompt, int32_t max_tokens,
                                int i, engine_req **out, ks_errbuf *eb) {
    *out = NULL;
    engine_req *r = engine__req_new(e, p->tenant);
    if (!r) return ks_seterr(eb, KS_ERR_NOMEM, "request");
    engine_domain_root(p, r->root);
    if (ad) { // (tenant domain, adapter): no prefix passes between adapters (I7)
        atomic_fetch_add(&ad->refs, 1);
        r->adapter = ad;
        engine_root_with_adapter(r->root, ad->digest);
    }
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
        (p->grammar && (ce = engine__grammar_init(e, r, p->grammar, eb))) ||
        (ce = engine__spec_init(e, r, p, eb))) {
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
                        .max_pages = kv_pool_n_pages(e->pool),
                        .state_pages = (uint32_t)kv_pool_geom(e->pool)->state_pages};
    if (e->encoder) { // no LM head: nothing to generate from
        atomic_fetch_add(&e->n_rejected, 1);
        return admit_encoder(model_hp(e->m)->arch_name, eb);
    }
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
    engine__adapter *adp = NULL;
    if (!err) err = engine__adapter_resolve(e, p->tenant, p->adapter, &adp, eb);
    if (err) {
        atomic_fetch_add(&e->n_rejected, 1);
        return err;
    }
    engine_req *rs[ENGINE_MAX_N] = {0};
    for (int i = 0; i < n; i++) {
        ks_err be = engine__req_build(e, p, adp, prompt, n_prompt, max_tokens, i, &rs[i], eb);
        if (be) {
            for (int k = 0; k < i; k++)
                engine__req_free(rs[k]);
            engine__adapter_unref(e, adp);
            return be;
        }
        if (i > 0) { // choice 0 leads: it alone sits in the queue and prefills the prompt
            rs[i]->leader = rs[0];
            rs[0]->fol[rs[0]->n_fol++] = rs[i];
        }
    }
    if (adp) atomic_fetch_add(&e->adapter_requests, 1);
    engine__adapter_unref(e, adp); // each choice holds its own reference
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
// A request's end and its tokens (scheduler thread)
//
// The done event reports the CPU the request's grammar masks took (mask.c
// runs them and keeps the count under e->mmu): read here, at the end.

uint64_t engine__clock_ns(clockid_t clk) {
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

void engine__finish_reason(engine *e, engine_req *r, engine_state to, engine_finish fin,
                                  ks_err err, uint16_t reason, const char *msg) {
    engine__set_state(r, to);
    engine__group_leave(e, r);
    if (r->has_seq) {
        kv_seq_release(e->pool, &r->seq);
        r->has_seq = false;
    }
    engine__spec_release(e, r); // its draft model's pages, if it drafted with one
    engine__adapter_unref(e, r->adapter); // a removed adapter is scrubbed with its last request
    r->adapter = NULL;
    atomic_fetch_add(to == ENGINE_FINISHED ? &e->n_finished : &e->n_aborted, 1);
    engine_outcome o = {.state = to,
                        .finish = fin,
                        .err = err,
                        .msg = msg,
                        .n_prompt = r->n_prompt,
                        .n_gen = r->n_gen,
                        .n_cached = r->n_cached,
                        .n_drafted = r->n_drafted,
                        .n_accepted = r->n_accepted,
                        .t_submit_ns = r->t_submit,
                        .t_first_ns = r->t_first,
                        .t_sched_ns = r->t_sched,
                        .reason = reason,
                        .mask_ns = r->gm ? engine__mask_cpu(e, r) : 0};
    engine_stream_finish(r->out, &o, e->piece, e->piece_cap);
    engine__req_unref(r);
}

void engine__finish(engine *e, engine_req *r, engine_state to, engine_finish fin, ks_err err,
                           const char *msg) {
    engine__finish_reason(e, r, to, fin, err, 0, msg);
}

/* Handles one chosen token of r (sampled here, or by a prefill worker for an
 * adopted request): EOS, penalty history, text, stop strings, max_tokens.
 * Returns true if r finished. */
bool engine__take(engine *e, engine_req *r, const sample_result *sr) {
    if (!r->t_first) r->t_first = ks_now_ns();
    if ((!r->ignore_eos || r->gm) && tok_is_eog(e->vocab, sr->token)) {
        engine__finish(e, r, ENGINE_FINISHED, ENGINE_FINISH_STOP, KS_OK, NULL);
        return true;
    }
    sampler_accept(r->smp, sr->token);
    r->n_gen++;
    r->last = sr->token;
    engine__spec_taken(r, sr->token);
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

// ----------------------------------------------------------------------------
// Decode workers: adopting a request whose prompt KV was computed elsewhere

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
    engine__adapter *adp = NULL;
    if (!err) err = engine__adapter_resolve(e, a->tenant, a->adapter, &adp, eb);
    if (err) {
        atomic_fetch_add(&e->n_rejected, 1);
        return err;
    }
    engine_req *r = engine__req_new(e, a->tenant);
    if (!r) {
        engine__adapter_unref(e, adp);
        return ks_seterr(eb, KS_ERR_NOMEM, "request");
    }
    r->adapter = adp; // the resolve's reference
    if (adp) atomic_fetch_add(&e->adapter_requests, 1);
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
                        .max_pages = kv_pool_n_pages(e->pool),
                        .state_pages = (uint32_t)kv_pool_geom(e->pool)->state_pages};
    model_pooling pool = p->pooling ? p->pooling : e->o.pooling;
    if (e->encoder) { // the whole input in one batch, and its positions in position_embd
        if (lim.n_ctx > e->o.max_batch_tokens) lim.n_ctx = e->o.max_batch_tokens;
        if (lim.n_ctx > model_hp(e->m)->n_ctx_train) lim.n_ctx = model_hp(e->m)->n_ctx_train;
    }
    ks_err err = admit_embed(&lim, p->tokens, p->n_tokens, eb);
    if (!err && !model_pooling_name(pool))
        err =
            admit_refuse(eb, ADMIT_INVALID, "pooling %d is not supported (mean, cls, last)", (int)pool);
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
