/* routes.c — the routes other than generation: embeddings (one backend
 * request per input), tokenize/detokenize, models, health, metrics and
 * admin (models online/offline, the KV check). */
#include "http_int.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "kvseal/kern.h"

// ----------------------------------------------------------------------------
// Embeddings (issue 13): one backend request per input, answered together

#define SRV_EMBED_WINDOW                                                                           \
    16 /* inputs of one request in the engine at a time (its max_running                           \
          default): a request of 2048 inputs never fills the queue */

/* Submits g's next inputs while fewer than SRV_EMBED_WINDOW are in flight.
 * False with err filled when the backend refuses one (the whole request
 * fails: its vectors would be incomplete). */
static bool srv__embed_submit_more(server *s, srv_gen *g, srv_error *err) {
    while (g->n_esub < g->n_ereq && g->n_esub - g->n_edone < SRV_EMBED_WINDOW) {
        int i = g->n_esub;
        engine_embed_params ep = {.tenant = g->etenant, // from authentication (I7)
                                  .tokens = g->erq.in[i].ids,
                                  .n_tokens = (int32_t)g->erq.in[i].n_ids,
                                  .model = g->sm->index};
        ks_errbuf eb = {0};
        void *req = NULL;
        ks_err e = s->b.embed_submit(s->b.impl, &ep, &req, &eb);
        if (e) {
            srv__submit_error(e, &eb, SRV_ROUTE_EMBEDDINGS, err);
            size_t ml = strlen(err->msg);
            if (g->n_ereq > 1 && ml + 16 < sizeof err->msg) { // name the input
                char pre[16];
                int k = snprintf(pre, sizeof pre, "input %d: ", i);
                memmove(err->msg + k, err->msg, ml + 1);
                memcpy(err->msg, pre, (size_t)k);
            }
            return false;
        }
        atomic_store_explicit(&g->ereq[i], req, memory_order_release); // the sweeper may cancel it
        g->n_esub++;
        s->b.set_notify(req, srv__gen_notify, g);
    }
    return true;
}

/* Takes the done events of g's inputs without waiting; answers once every
 * vector is in (or the first failure), else suspends like srv__gen_collect. */
enum MHD_Result srv__embed_collect(server *s, struct MHD_Connection *c, srv_gen *g,
                                          srv_conn *sc) {
    const int32_t E = model_hp(g->sm->m)->n_embd;
    sc->gen = NULL;
    for (;;) {
        for (int i = 0; i < g->n_esub; i++) {
            if (g->edone[i]) continue;
            engine_event ev;
            ks_err e = s->b.next(g->ereq[i], &ev, 0);
            if (e == KS_ERR_TIMEOUT) continue;
            if (e != KS_OK) { // the events ended without a done event: a failure
                memset(&ev, 0, sizeof ev);
                ev.done = true;
                ev.state = ENGINE_ABORTED;
                ev.finish = ENGINE_FINISH_ERROR;
                ev.err = KS_ERR_INTERNAL;
                snprintf(ev.errmsg, sizeof ev.errmsg, "input %d: no result", i);
            }
            if (!ev.done) continue; // an embedding posts its done event only
            atomic_store_explicit(&g->edone[i], true, memory_order_relaxed);
            g->n_edone++;
            if (ev.state == ENGINE_FINISHED &&
                s->b.embed_vector(g->ereq[i], g->evec + (size_t)i * (size_t)E, E) == KS_OK)
                continue;
            srv_error err;
            if (atomic_load(&g->gone) && !atomic_load(&s->stopping))
                srv_refuse(&err, ADMIT_CLIENT_CLOSED, NULL, NULL);
            else if (ev.state == ENGINE_FINISHED)
                srv_fail(&err, 500, "internal_error", "input %d: the embedding is missing", i);
            else
                srv__gen_error(g, &ev, &err);
            enum MHD_Result r = srv__reply_error(s, c, g->shape, &err);
            srv__gen_free(g); // cancels the other inputs; the tenant gets its tokens back
            return r;
        }
        if (g->n_edone == g->n_ereq) break;
        srv_error err;
        // a client that left gets no more inputs submitted: the sweeper's
        // cancels may have found every input in flight already done
        if (atomic_load(&g->gone)) {
            srv__gone_error(s, &err);
            enum MHD_Result r = srv__reply_error(s, c, g->shape, &err);
            srv__gen_free(g); // cancels the inputs in flight
            return r;
        }
        int n_sub = g->n_esub;
        if (!srv__embed_submit_more(s, g, &err)) {
            enum MHD_Result r = srv__reply_error(s, c, g->shape, &err);
            srv__gen_free(g);
            return r;
        }
        // look at new ones before suspending: an event posted before their
        // set_notify wakes nobody
        if (g->n_esub != n_sub) continue;
        if (!srv__gen_suspend(g)) continue;
        sc->gen = g;
        return MHD_YES;
    }
    g->embed_ok = true;
    json_t *j = srv_embed_answer(g->evec, g->n_ereq, E, g->base64, g->model, g->n_prompt);
    ks_log(KS_LOG_INFO, "embeddings: %d inputs, %d tokens, %.1f ms", g->n_ereq, (int)g->n_prompt,
           (double)(ks_now_ns() - g->t_submit_ns) / 1e6);
    srv__gen_free(g);
    // 9 significant digits give every f32 back exactly (FLT_DECIMAL_DIG), in
    // about half the bytes of jansson's default 17
    char *body = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    enum MHD_Result r = srv__reply(s, c, SRV_ROUTE_EMBEDDINGS, 200, body, "application/json");
    free(body);
    return r;
}

/* Tokens one embeddings request may hold over all its inputs:
 * --embed-max-tokens (SERVER_EMBED_MAX_TOKENS by default), never below the
 * context (one whole input always fits). */
static int64_t srv__embed_bound(const server *s, const srv_model *sm) {
    int64_t b = s->o.embed_max_tokens > 0 ? s->o.embed_max_tokens : SERVER_EMBED_MAX_TOKENS;
    return b < sm->n_ctx ? sm->n_ctx : b;
}

/* POST /v1/embeddings (OpenAI's shape). q->rest: a model named by the URL
 * (a Workers-AI-style route), else NULL and the body's "model" is checked;
 * q->route: the route whose error shape refusals take (SRV_ROUTE_EMBEDDINGS,
 * or SRV_ROUTE_WORKERS for Workers AI's envelope at
 * /accounts/{id}/ai/v1/embeddings; the answer itself is OpenAI's list).
 * Tenant limits (the inputs' tokens count) and admission as the generation
 * routes; each input runs as its own backend request (its own sequence and
 * pages), up to SRV_EMBED_WINDOW at once so they batch together. */
enum MHD_Result srv__embeddings(server *s, struct MHD_Connection *c, const srv_call *q) {
    const srv_route route = q->route, shape = q->route;
    const char *url_model = q->rest;
    srv_conn *sc = q->sc;
    const int tenant = q->tenant;
    srv_error err;
    if (atomic_load_explicit(&s->draining, memory_order_acquire)) {
        srv_refuse(&err, ADMIT_DRAINING, NULL,
                   "the server is shutting down and takes no new requests; retry on another "
                   "instance");
        return srv__reply_error(s, c, route, &err);
    }
    srv_embed_req rq;
    if (!srv_embed_parse(sc->body.p ? sc->body.p : "", sc->body.len, &rq, &err))
        return srv__reply_error(s, c, route, &err);
    srv_gen *g = NULL;
    int held = -1;
    int64_t total = 0, charge = 0; // charge: tokens charged when refused for size
    const char *model_name = url_model ? url_model : rq.model;
    const srv_model *sm = srv__model_find(s, model_name);
    if (!sm) {
        char served[512];
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model",
                   "The model '%s' does not exist; this server serves %s", model_name,
                   srv__served_names(s, served, sizeof served));
        goto fail;
    }
    const int32_t E = model_hp(sm->m)->n_embd;
    if (rq.dimensions >= 0 && rq.dimensions != E) {
        srv_refuse(&err, ADMIT_UNSUPPORTED_PARAMETER, "dimensions",
                   "'dimensions' %lld is not supported: this model's embeddings have %d "
                   "dimensions (omit it, or send %d)",
                   (long long)rq.dimensions, (int)E, (int)E);
        goto fail;
    }
    if (!s->b.embed_submit || !s->b.embed_vector) {
        srv_fail(&err, 501, "not_implemented", "embeddings are not supported by this server");
        goto fail;
    }
    // tokenize (BOS/EOS as the vocabulary says; never special-token text), at
    // most n_ctx + 1 ids each, so an over-long input costs about n_ctx tokens,
    // and no more than the request's bound over all inputs (issue 38: one
    // request held ~511k tokens, 103 s of engine time)
    const int64_t bound = srv__embed_bound(s, sm);
    for (int i = 0; i < rq.n; i++) {
        srv_embed_input *x = &rq.in[i];
        bool cut = false;
        if (!x->is_ids) {
            ks_errbuf eb;
            int64_t left = bound - total; // >= 0: checked below for every input
            size_t cap = left < sm->n_ctx ? (size_t)left : (size_t)sm->n_ctx;
            if (tok_encode_max(sm->vocab, x->text, x->len, true, false, cap, &x->ids,
                               &x->n_ids, &eb)) {
                srv_fail(&err, 500, "internal_error", "tokenizer: %s", eb.msg);
                goto fail;
            }
            cut = x->n_ids > cap;
            if (x->n_ids == 0) {
                srv_refuse(&err, ADMIT_INVALID, "input", "input %d has no tokens", i);
                goto fail;
            }
        }
        for (size_t k = 0; x->is_ids && k < x->n_ids; k++)
            if (x->ids[k] >= tok_n_vocab(sm->vocab)) {
                srv_refuse(
                    &err, ADMIT_INVALID, "input",
                    "input %d, token %zu: id %d is out of range: the vocabulary has %d tokens", i,
                    k, (int)x->ids[k], (int)tok_n_vocab(sm->vocab));
                goto fail;
            }
        if (x->n_ids > (size_t)sm->n_ctx) {
            srv_refuse(&err, ADMIT_CONTEXT_LENGTH, "input",
                       "This model's maximum context length is %d tokens. However, you "
                       "requested %s%zu tokens (%s%zu in the input, 0 for the completion). "
                       "Please reduce the length of the input.",
                       sm->n_ctx, cut ? "at least " : "", x->n_ids, cut ? "at least " : "",
                       x->n_ids);
            charge = total + (int64_t)x->n_ids;
            goto fail;
        }
        total += (int64_t)x->n_ids;
        if (total > bound) {
            srv_refuse(&err, ADMIT_CONTEXT_LENGTH, "input",
                       "The inputs hold %s%lld tokens (through input %d of %d), more than the "
                       "%lld tokens one embeddings request may hold; send fewer or shorter "
                       "inputs per request",
                       cut || i + 1 < rq.n ? "at least " : "", (long long)total, i, rq.n,
                       (long long)bound);
            charge = total;
            goto fail;
        }
    }
    char msg[256];
    admit_reason rj = srv_tenants_admit(s->ts, tenant, total, ks_now_ns(), msg, sizeof msg);
    if (rj != ADMIT_OK) {
        srv_refuse(&err, rj, NULL, "%s", msg);
        goto fail;
    }
    held = tenant;
    if (!(g = srv__gen_new(s, sm, sc, SRV_ROUTE_EMBEDDINGS, model_name, held, total))) {
        srv_fail(&err, 500, "internal_error", "out of memory");
        goto fail;
    }
    held = -1; // g releases the tenant from here on
    g->shape = shape;
    g->etenant = s->ts->t[tenant].name;
    g->n_prompt = (int32_t)total;
    g->conn = c;
    g->http11 = sc->http11;
    g->base64 = rq.base64;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) g->fd = ci->connect_fd;
    g->ereq = calloc((size_t)rq.n, sizeof *g->ereq);
    g->edone = calloc((size_t)rq.n, sizeof *g->edone);
    g->evec = malloc(sizeof(float) * (size_t)rq.n * (size_t)E);
    if (!g->ereq || !g->edone || !g->evec) {
        srv_fail(&err, 500, "internal_error", "out of memory");
        goto fail;
    }
    g->n_ereq = rq.n;
    g->erq = rq; // g owns the inputs from here on
    memset(&rq, 0, sizeof rq);
    g->t_submit_ns = ks_now_ns();
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    pthread_mutex_lock(&s->lmu); // the sweeper watches it from now on
    g->lnext = s->gens;
    if (s->gens) s->gens->lprev = g;
    s->gens = g;
    pthread_mutex_unlock(&s->lmu);
    if (!srv__embed_submit_more(s, g, &err)) goto fail;
    return srv__embed_collect(s, c, g, sc);
fail:
    if (held >= 0) srv_tenants_release(s->ts, held, total);
    // refused for size: charged what was tokenized, as an over-long prompt is
    // (within the tenant's limits: one at its limit gets the 429 instead)
    if (charge > 0 && err.reason == ADMIT_CONTEXT_LENGTH) {
        char m429[256];
        admit_reason r429 = srv_tenants_admit(s->ts, tenant, charge, ks_now_ns(), m429, sizeof m429);
        if (r429 != ADMIT_OK)
            srv_refuse(&err, r429, NULL, "%s", m429);
        else
            srv_tenants_refuse(s->ts, tenant, charge, charge);
    }
    srv__gen_free(g);
    srv_embed_req_free(&rq);
    return srv__reply_error(s, c, route, &err);
}

/* The largest vocabulary of the catalog (a detokenize list's first bound). */
static int32_t srv__max_vocab(const server *s) {
    int32_t v = 0;
    for (int k = 0; k < s->n_mods; k++)
        if (tok_n_vocab(s->mods[k].vocab) > v) v = tok_n_vocab(s->mods[k].vocab);
    return v;
}

/* Refuses a /tokenize or /detokenize of `tokens` (at least) as longer than
 * the context, in the words of the engine's refusal. */
static void srv__tokenize_too_long(const srv_model *sm, bool detok, int64_t tokens,
                                   bool at_least, srv_error *err) {
    srv_refuse(err, ADMIT_CONTEXT_LENGTH, detok ? "tokens" : "content",
               "This model's maximum context length is %d tokens. However, the %s has %s%lld "
               "tokens. Please send a shorter one.",
               sm->n_ctx, detok ? "token list" : "text", at_least ? "at least " : "",
               (long long)tokens);
}

/* POST /tokenize and /detokenize (llama.cpp server's shapes): the model's
 * vocabulary, here on the HTTP thread (no model code). A tenant key is
 * needed where keys are configured. detokenize renders no special token
 * and drops the space-prefix rule's leading space, so detokenize(tokenize
 * (text)) == text. Issue 38: each is a request of its tenant (its
 * concurrency and requests per minute, admitted before any work), its
 * tokens count against the tenant's tokens per minute, and it is bounded
 * as a prompt is: a text or token list longer than the context is refused
 * (400) and charged what was tokenized (tokenizing stops past n_ctx, and a
 * text too long by its bytes alone is not tokenized at all). So an HTTP
 * thread does at most about n_ctx tokens of work per request. */
static enum MHD_Result srv__tokenize_do(server *s, struct MHD_Connection *c, const srv_call *q,
                                        bool detok) {
    const srv_route route = q->route;
    srv_conn *sc = q->sc;
    const int tenant = q->tenant;
    srv_error err;
    const char *body = sc->body.p ? sc->body.p : "";
    json_t *j = NULL, *root = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int64_t charge = 0; // tokens charged when refused for size
    bool held = false;
    char msg[256];
    srv_tokenize_req rq = {0};
    const char *model_name = NULL;
    if (!detok ? !srv_tokenize_parse(body, sc->body.len, &rq, &err)
               : !srv_detokenize_parse(body, sc->body.len, srv__max_vocab(s), &ids, &n,
                                       &model_name, &root, &err))
        goto out;
    if (!detok) model_name = rq.model;
    const srv_model *sm = srv__model_find(s, model_name);
    if (!sm) {
        char served[512];
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model",
                   "The model '%s' does not exist; this server serves %s", model_name,
                   srv__served_names(s, served, sizeof served));
        goto out;
    }
    for (size_t k = 0; detok && k < n; k++) // the parse checked the largest vocabulary
        if (ids[k] >= tok_n_vocab(sm->vocab)) {
            srv_refuse(&err, ADMIT_INVALID, "tokens",
                       "token %zu: id %d is out of range: the vocabulary has %d tokens", k,
                       (int)ids[k], (int)tok_n_vocab(sm->vocab));
            goto out;
        }
    // a request of the tenant: its slot and its share of requests first
    admit_reason rj = srv_tenants_admit(s->ts, tenant, 0, ks_now_ns(), msg, sizeof msg);
    if (rj != ADMIT_OK) {
        srv_refuse(&err, rj, NULL, "%s", msg);
        goto out;
    }
    held = true;
    if (!detok) {
        int64_t lo = srv_prompt_min_tokens(rq.len, sm->max_token_bytes);
        if (lo > sm->n_ctx) { // too long by its bytes: no tokenizing at all
            charge = (int64_t)sm->n_ctx + 1;
            srv__tokenize_too_long(sm, false, lo, true, &err);
            goto out;
        }
        ks_errbuf eb;
        if (tok_encode_max(sm->vocab, rq.content, rq.len, rq.add_special, rq.parse_special,
                           (size_t)sm->n_ctx, &ids, &n, &eb)) {
            srv_fail(&err, 500, "internal_error", "tokenizer: %s", eb.msg);
            goto out;
        }
    }
    if (n > (size_t)sm->n_ctx) {
        charge = (int64_t)n;
        srv__tokenize_too_long(sm, detok, (int64_t)n, !detok, &err);
        goto out;
    }
    srv_reqinfo *ri = srv__ri(c);
    if (ri) ri->need_tokens = (int64_t)n; // a 429's Retry-After: when these are there
    rj = srv_tenants_grow(s->ts, tenant, 0, (int64_t)n, ks_now_ns(), msg, sizeof msg);
    if (rj != ADMIT_OK) {
        srv_refuse(&err, rj, NULL, "%s", msg);
        goto out;
    }
    if (!detok) {
        j = srv_tokenize_answer(sm->vocab, ids, n, rq.with_pieces);
    } else {
        size_t len = tok_detokenize(sm->vocab, ids, n, false, true, NULL, 0);
        char *text = malloc(len + 1);
        if (text) {
            tok_detokenize(sm->vocab, ids, n, false, true, text, len + 1);
            json_t *t = srv__jstr(text, len);
            j = t ? json_pack("{s:o}", "content", t) : NULL;
        }
        free(text);
    }
    srv_tenants_release(s->ts, tenant, 0); // its tokens stay spent
    held = false;
    free(ids);
    json_decref(rq.root);
    json_decref(root);
    return srv__reply_json(s, c, route, 200, j);
out:
    if (held)
        srv_tenants_refuse(s->ts, tenant, 0, err.reason == ADMIT_CONTEXT_LENGTH ? charge : 0);
    free(ids);
    json_decref(rq.root);
    json_decref(root);
    return srv__reply_error(s, c, route, &err);
}

enum MHD_Result srv__tokenize(server *s, struct MHD_Connection *c, const srv_call *q) {
    return srv__tokenize_do(s, c, q, false);
}

enum MHD_Result srv__detokenize(server *s, struct MHD_Connection *c, const srv_call *q) {
    return srv__tokenize_do(s, c, q, true);
}

/* POST /v1/messages/count_tokens (Anthropic's): the body as /v1/messages
 * takes it (model, messages, system, tools, tool_choice, thinking; no
 * max_tokens), rendered and tokenized as /v1/messages does it, answered
 * {"input_tokens": N}. Charged as /tokenize is: a request of its tenant
 * (admitted before any work), its tokens from the tenant's tokens per
 * minute; a prompt longer than the context is refused (400) and charged
 * what was tokenized, so the work stays bounded by about n_ctx tokens. */
enum MHD_Result srv__count_tokens(server *s, struct MHD_Connection *c, const srv_call *q) {
    const srv_route route = q->route;
    const int tenant = q->tenant;
    srv_conn *sc = q->sc;
    srv_error err;
    srv_request rq;
    char *text = NULL, msg[256];
    tok_span *spans = NULL;
    size_t n_spans = 0, n = 0;
    int32_t *ids = NULL;
    int64_t charge = 0; // tokens charged when refused for size
    bool held = false, add_special = true;
    if (!srv_anth_count_parse(sc->body.p ? sc->body.p : "", sc->body.len, &rq, &err)) goto out;
    const srv_model *sm = srv__model_find(s, rq.model);
    if (!sm) {
        char served[512];
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model",
                   "The model '%s' does not exist; this server serves %s", rq.model,
                   srv__served_names(s, served, sizeof served));
        goto out;
    }
    // a request of the tenant: its slot and its share of requests first
    admit_reason rj = srv_tenants_admit(s->ts, tenant, 0, ks_now_ns(), msg, sizeof msg);
    if (rj != ADMIT_OK) {
        srv_refuse(&err, rj, NULL, "%s", msg);
        goto out;
    }
    held = true;
    if (!srv__chat_prompt(sm, &rq, &text, &add_special, &spans, &n_spans, &err)) goto out;
    size_t len = strlen(text);
    int64_t lo = srv_prompt_min_tokens(len, sm->max_token_bytes);
    if (lo > sm->n_ctx) { // too long by its bytes: no tokenizing at all
        charge = (int64_t)sm->n_ctx + 1;
        n = (size_t)lo;
    } else {
        ks_errbuf eb;
        if (tok_encode_marked(sm->vocab, text, len, add_special, true, spans, n_spans,
                              (size_t)sm->n_ctx, &ids, &n, &eb)) {
            srv_fail(&err, 500, "internal_error", "tokenizer: %s", eb.msg);
            goto out;
        }
        charge = (int64_t)n;
    }
    if (n > (size_t)sm->n_ctx) {
        srv_refuse(&err, ADMIT_CONTEXT_LENGTH, "messages",
                   "This model's maximum context length is %d tokens. However, the messages "
                   "have at least %lld tokens. Please send shorter ones.",
                   sm->n_ctx, (long long)n);
        goto out;
    }
    srv_reqinfo *ri = srv__ri(c);
    if (ri) ri->need_tokens = (int64_t)n; // a 429's Retry-After: when these are there
    rj = srv_tenants_grow(s->ts, tenant, 0, (int64_t)n, ks_now_ns(), msg, sizeof msg);
    if (rj != ADMIT_OK) {
        srv_refuse(&err, rj, NULL, "%s", msg);
        goto out;
    }
    srv_tenants_release(s->ts, tenant, 0); // its tokens stay spent
    free(ids);
    free(text);
    free(spans);
    srv_request_free(&rq);
    return srv__reply_json(s, c, route, 200, json_pack("{s:I}", "input_tokens", (json_int_t)n));
out:
    if (held)
        srv_tenants_refuse(s->ts, tenant, 0, err.reason == ADMIT_CONTEXT_LENGTH ? charge : 0);
    free(ids);
    free(text);
    free(spans);
    srv_request_free(&rq);
    return srv__reply_error(s, c, route, &err);
}

// ----------------------------------------------------------------------------
// Other routes

/* GET /v1/responses/{id}: the response the caller's tenant stored under
 * id. Anything else (unknown, expired, not stored, another tenant's) is the
 * same 404, so an id says nothing about whether another tenant has it. */
enum MHD_Result srv__response_get(server *s, struct MHD_Connection *c, const srv_call *q) {
    json_t *r = srv_resp_store_get(s->resp, s->ts->t[q->tenant].name, q->rest, false, ks_now_ns());
    if (r) return srv__reply_json(s, c, SRV_ROUTE_RESPONSES, 200, r);
    srv_error err;
    srv_fail(&err, 404, NULL, "Response with id '%.80s' not found.", q->rest);
    return srv__reply_error(s, c, SRV_ROUTE_RESPONSES, &err);
}

/* DELETE /v1/responses/{id}: {id, object:"response", deleted:true} once
 * the entry is wiped; 404 as GET. */
enum MHD_Result srv__response_delete(server *s, struct MHD_Connection *c, const srv_call *q) {
    if (srv_resp_store_delete(s->resp, s->ts->t[q->tenant].name, q->rest, ks_now_ns()))
        return srv__reply_json(
            s, c, SRV_ROUTE_RESPONSES, 200,
            json_pack("{s:s, s:s, s:b}", "id", q->rest, "object", "response", "deleted", 1));
    srv_error err;
    srv_fail(&err, 404, NULL, "Response with id '%.80s' not found.", q->rest);
    return srv__reply_error(s, c, SRV_ROUTE_RESPONSES, &err);
}

/* GET /v1/models/{id}: the model object of a name or alias this server
 * serves, else 404 model_not_found in OpenAI's shape. */
enum MHD_Result srv__model_get(server *s, struct MHD_Connection *c, const srv_call *q) {
    const char *id = q->rest;
    srv_error err;
    if (!srv__model_find(s, id)) {
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model", "The model '%s' does not exist", id);
        return srv__reply_error(s, c, SRV_ROUTE_MODELS, &err);
    }
    return srv__reply_json(s, c, SRV_ROUTE_MODELS, 200,
                           json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", "model", "created",
                                     (json_int_t)time(NULL), "owned_by", "kvseal"));
}

enum MHD_Result srv__models(server *s, struct MHD_Connection *c, const srv_call *q) {
    json_t *data = json_array();
    long long t = (long long)time(NULL);
    for (int k = 0; k < s->n_mods; k++) { // every catalog entry: its aliases, then its name
        const srv_model *sm = &s->mods[k];
        // serve with several models: whether it is loaded (as llama-server's router mode says)
        const char *st = s->b.model_status ? s->b.model_status(s->b.impl, k) : NULL;
        bool listed = false;
        for (int i = 0; i <= sm->n_aliases; i++) {
            const char *id = i < sm->n_aliases ? sm->aliases[i] : listed ? NULL : sm->name;
            if (i < sm->n_aliases && sm->name && !strcmp(sm->aliases[i], sm->name)) listed = true;
            if (!id) continue;
            json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", "model", "created",
                                  (json_int_t)t, "owned_by", "kvseal");
            if (o && st) json_object_set_new(o, "status", json_pack("{s:s}", "value", st));
            json_array_append_new(data, o);
        }
        srv__models_adapters(s, k, q->tenant, t, data); // the caller's own and public ones
    }
    return srv__reply_json(s, c, SRV_ROUTE_MODELS, 200,
                           json_pack("{s:s, s:o}", "object", "list", "data", data));
}

enum MHD_Result srv__health(server *s, struct MHD_Connection *c, const srv_call *q) {
    (void)q;
    bool online = s->b.is_online(s->b.impl);
    bool draining = atomic_load_explicit(&s->draining, memory_order_acquire);
    json_t *j = json_pack("{s:s, s:s, s:s, s:b, s:i}", "status",
                          draining ? "draining" : online ? "ok" : "offline", "model",
                          srv__primary_name(s), "kernels", kern_get()->name, "online", online,
                          "n_ctx", (int)s->mods[0].n_ctx);
    return srv__reply_json(s, c, SRV_ROUTE_HEALTH, draining ? 503 : 200, j);
}

/* GET /metrics (its key checked by srv__auth_metrics). */
enum MHD_Result srv__metrics(server *s, struct MHD_Connection *c, const srv_call *q) {
    (void)q;
    engine_stats es;
    s->b.get_stats(s->b.impl, &es);
    char *text = srv_metrics_render(&s->met, &es, s->b.is_online(s->b.impl));
    char *more = text && s->b.metrics_text ? s->b.metrics_text(s->b.impl) : NULL;
    if (more) { // the backend's own series (the router's per-model ones)
        size_t a = strlen(text), n = strlen(more);
        char *both = realloc(text, a + n + 1);
        if (both) {
            memcpy(both + a, more, n + 1);
            text = both;
        }
        free(more);
    }
    // count this scrape before rendering the next one; the text shows earlier ones
    enum MHD_Result r =
        srv__reply(s, c, SRV_ROUTE_METRICS, 200, text, "text/plain; version=0.0.4; charset=utf-8");
    free(text);
    return r;
}


static void *srv__job_main(void *arg) {
    srv_job *j = arg;
    memset(&j->eb, 0, sizeof j->eb);
    j->err = j->s->b.check_quiescent(j->s->b.impl, j->timeout_ms, &j->eb);
    atomic_store(&j->done, true);
    MHD_resume_connection(j->c);
    return NULL;
}

/* The KV check's answer, once its job is done (the access handler, resumed). */
enum MHD_Result srv__kv_check_answer(server *s, struct MHD_Connection *c, srv_conn *sc) {
    srv_job *j = sc->job;
    sc->job = NULL;
    ks_err e = j->err;
    enum MHD_Result r = srv__reply_json(
        s, c, SRV_ROUTE_ADMIN, e == KS_ERR_TIMEOUT ? 409 : 200,
        json_pack("{s:b, s:s}", "clean", e == KS_OK, "message",
                  j->eb.msg[0] ? j->eb.msg : (e == KS_OK ? "clean" : ks_strerror(e))));
    free(j);
    return r;
}

/* GET /admin/kv/check[?timeout_ms=N]: waits for the engine to go idle, then
 * verifies every KV page is FREE and scrubbed (the leak suite's last step).
 * 200 {"clean": true|false, "message"}; 409 when requests stayed active.
 * The wait runs on a thread of its own, the connection suspended meanwhile. */
enum MHD_Result srv__kv_check(server *s, struct MHD_Connection *c, const srv_call *q) {
    srv_conn *sc = q->sc;
    const char *t = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "timeout_ms");
    unsigned long timeout = 5000;
    if (t) {
        char *end;
        timeout = strtoul(t, &end, 10);
        if (*end || !*t || timeout > 600000) {
            srv_error err;
            srv_refuse(&err, ADMIT_INVALID, "timeout_ms",
                       "timeout_ms must be an integer in [0, 600000]");
            return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
        }
    }
    srv_job *j = calloc(1, sizeof *j);
    pthread_t th;
    pthread_attr_t at;
    if (!j) return MHD_NO;
    *j = (srv_job){.s = s, .c = c, .timeout_ms = (uint32_t)timeout};
    sc->job = j;
    MHD_suspend_connection(c);  // before the thread can resume it
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    bool started = pthread_create(&th, &at, srv__job_main, j) == 0;
    pthread_attr_destroy(&at);
    if (!started) {
        j->err = ks_seterr(&j->eb, KS_ERR_NOMEM, "cannot start the check");
        atomic_store(&j->done, true);
        MHD_resume_connection(c);
    }
    return MHD_YES;
}

/* POST /admin/models/{name}/offline|online, body or ?abort_running=, and
 * /load|/unload where the backend loads models (the admin key checked by
 * srv__auth_admin). */
enum MHD_Result srv__admin_model(server *s, struct MHD_Connection *c, const srv_call *q) {
    const char *rest = q->rest;
    srv_conn *sc = q->sc;
    srv_error err;
    const char *slash = strrchr(rest, '/');
    char name[256];
    if (!slash || slash == rest || (size_t)(slash - rest) >= sizeof name) goto notfound;
    snprintf(name, sizeof name, "%.*s", (int)(slash - rest), rest);
    bool online = false, load = !strcmp(slash + 1, "load");
    if (load || !strcmp(slash + 1, "unload")) { // serve with several models
        const srv_model *lm = s->b.model_load ? srv__model_find(s, name) : NULL;
        if (!s->b.model_load) goto notfound;
        if (!lm) {
            srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, NULL, "The model '%s' does not exist", name);
            return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
        }
        ks_errbuf eb = {0};
        if (s->b.model_load(s->b.impl, lm->index, load, &eb)) {
            srv_fail(&err, 409, "model_busy", "%s", eb.msg);
            return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
        }
        ks_log(KS_LOG_WARN, "admin: model %s %s", name, load ? "load asked" : "unload asked");
        return srv__reply_json(s, c, SRV_ROUTE_ADMIN, 202,
                               json_pack("{s:s, s:s}", "model", name, "status",
                                         s->b.model_status(s->b.impl, lm->index)));
    }
    if (!strcmp(slash + 1, "offline"))
        online = false;
    else if (!strcmp(slash + 1, "online"))
        online = true;
    else
        goto notfound;
    // "*": the whole fleet (every model); a name: that model only where the
    // backend fronts several (the router's catalog), else the one it serves
    const srv_model *sm = strcmp(name, "*") ? srv__model_find(s, name) : NULL;
    if (strcmp(name, "*") && !sm) {
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, NULL, "The model '%s' does not exist", name);
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    bool abort_running =
        srv__truthy(MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "abort_running"));
    if (sc->body.len) {
        json_error_t je;
        json_t *j = json_loadb(sc->body.p, sc->body.len, 0, &je);
        json_t *v = json_object_get(j, "abort_running");
        if (!j || (v && !json_is_boolean(v))) {
            json_decref(j);
            srv_refuse(&err, ADMIT_INVALID, "abort_running",
                       "body must be {\"abort_running\": true|false}");
            return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
        }
        if (v) abort_running = json_is_true(v);
        json_decref(j);
    }
    if (sm && s->n_mods > 1 && s->b.set_model_online)
        s->b.set_model_online(s->b.impl, sm->index, online, abort_running);
    else
        s->b.set_online(s->b.impl, online, abort_running);
    ks_log(KS_LOG_WARN, "admin: model %s set %s%s", name, online ? "online" : "offline",
           !online && abort_running ? " (running requests aborted)" : "");
    return srv__reply_json(s, c, SRV_ROUTE_ADMIN, 200,
                           json_pack("{s:s, s:b, s:b}", "model", name, "online", online,
                                     "abort_running", abort_running));
notfound:
    srv_refuse(&err, ADMIT_UNKNOWN_URL, NULL,
               "Invalid URL: use /admin/models/{name}/offline or /online (and, serving several "
               "models, /load or /unload)");
    return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
}

