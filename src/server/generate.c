/* generate.c — one generation, request -> engine: parse the body in its
 * dialect, render the chat, bound and tokenize the prompt, admit it for its
 * tenant, submit it to the backend, and hand it to the answer (answer.c,
 * stream.c). */
#include "http_int.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

// ----------------------------------------------------------------------------
// Generation: request -> engine

/* A request the engine refused as too long (issue 8): the tenant is charged
 * the prompt tokens it was tokenized into instead of getting its whole
 * reservation back, and when tokenizing stopped early (cut) the message
 * gives the lower bound, not the prefix's count as if it were the prompt. */
static void srv__refused_long(server *s, srv_gen *g, srv_error *err, bool cut, int64_t charged) {
    if (err->reason != ADMIT_CONTEXT_LENGTH && err->reason != ADMIT_KV_CAPACITY) return;
    if (g->tenant >= 0)
        srv_tenants_refuse_n(s->ts, g->tenant, g->n_ch > 1 ? g->n_ch : 1, g->reserved, charged);
    g->tenant = -1;
    if (cut && err->reason == ADMIT_CONTEXT_LENGTH)
        snprintf(err->msg, sizeof err->msg,
                 "This model's maximum context length is %d tokens. However, you requested at "
                 "least %lld tokens (at least %d in the prompt, %d for the completion). Please "
                 "reduce the length of the prompt or completion.",
                 g->sm->n_ctx, (long long)g->n_prompt + g->max_tokens, g->n_prompt, g->max_tokens);
}

/* Issue 12's request fields against this server: logit_bias ids within
 * the vocabulary; n / best_of > 1 only on a backend that runs choices
 * (submit_n: kvseal serve and the cluster router). False with err set
 * otherwise. */
static bool srv__gen_choices(server *s, const srv_model *sm, const srv_request *rq,
                             srv_error *err) {
    int32_t V = tok_n_vocab(sm->vocab);
    for (int i = 0; i < rq->n_bias; i++)
        if (rq->bias[i].token >= V)
            return srv_refuse(err, ADMIT_INVALID, "logit_bias",
                              "'logit_bias' token id %d is out of range: the vocabulary has %d "
                              "tokens",
                              (int)rq->bias[i].token, (int)V);
    if (rq->best_of > 1 && !s->b.submit_n && !(rq->echo && rq->max_tokens == 0))
        return srv_refuse(err, ADMIT_INVALID, rq->n > 1 ? "n" : "best_of",
                          "'%s' > 1 is not supported in disaggregated serving (kvseal router); "
                          "use kvseal serve",
                          rq->n > 1 ? "n" : "best_of");
    return true;
}

bool srv__chat_prompt(const srv_model *sm, const srv_request *rq, char **text, bool *add_special,
                      tok_span **spans, size_t *n_spans, srv_error *err) {
    ks_errbuf eb = {0};
    ks_err e = srv_chat_render(sm->chat, sm->vocab, rq, text, add_special, spans, n_spans, err, &eb);
    if (e == KS_ERR_AGAIN) return false; // refused: err is filled
    if (e == KS_ERR_NOMEM) return srv_fail(err, 500, "internal_error", "%s", eb.msg);
    if (e) return srv_refuse(err, ADMIT_INVALID, "messages", "%s", eb.msg);
    return true;
}

/* A generation on route api (CHAT, COMPLETIONS, WORKERS, MESSAGES or
 * WORKERS_CHAT): errors and metrics in api's shape, the answer in route's
 * (WORKERS_CHAT answers as CHAT). */
enum MHD_Result srv__generate(server *s, struct MHD_Connection *c, const srv_call *q) {
    const srv_route api = q->route;
    const char *url_model = q->rest; // Workers AI's run/{model}; NULL elsewhere
    srv_conn *sc = q->sc;
    const int tenant = q->tenant;
    const srv_answer_info *ans = srv_route_answer(api);
    srv_route route = ans->answers_as;
    bool chat_like = ans->chat; // tools, reasoning
    srv_error err;
    if (atomic_load_explicit(&s->draining, memory_order_acquire)) {
        srv_refuse(&err, ADMIT_DRAINING, NULL,
                   "the server is shutting down and takes no new requests; retry on another "
                   "instance");
        return srv__reply_error(s, c, api, &err);
    }
    srv_request rq;
    srv_resp_req rx = {0}; // responses: what the answer echoes and stores
    const char *body = sc->body.p ? sc->body.p : "";
    bool parsed = route == SRV_ROUTE_MESSAGES ? srv_anth_parse(body, sc->body.len, &rq, &err)
                  : route == SRV_ROUTE_RESPONSES
                      ? srv_resp_parse(body, sc->body.len, s->resp, s->ts->t[tenant].name,
                                       ks_now_ns(), &rq, &rx, &err)
                      : srv_request_parse(route, body, sc->body.len, &rq, &err);
    if (!parsed) return srv__reply_error(s, c, api, &err);
    const char *model_name = url_model ? url_model : rq.model;
    char *text = NULL;
    tok_span *spans = NULL; // where the request's text is in a rendered chat
    size_t n_spans = 0;
    int32_t *ids = NULL, *pred = NULL; // the prompt's ids, the prediction's
    size_t n_ids = 0, n_pred = 0;
    srv_gen *g = NULL;
    int held = -1;             // tenant admitted here, until g takes it over
    int64_t held_reserved = 0; // tokens it took from the tenant's bucket
    int64_t held_charge = 0;   // tokens to charge if refused as too long
    const char *adapter = NULL; // "base:adapter", or the "adapter" / "lora" field
    const srv_model *sm = srv__model_split(s, model_name, &adapter);
    if (!sm) {
        char served[512];
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model",
                   "The model '%s' does not exist; this server serves %s", model_name,
                   srv__served_names(s, served, sizeof served));
        goto fail;
    }
    if (adapter && rq.adapter && strcmp(adapter, rq.adapter)) {
        srv_refuse(&err, ADMIT_INVALID, "adapter",
                   "the model names adapter '%.64s' and 'adapter' names '%.64s': give one", adapter,
                   rq.adapter);
        goto fail;
    }
    if (!adapter) adapter = rq.adapter;
    if (adapter && !s->b.adapter_add) { // never run without the adapter the request named
        srv_refuse(&err, ADMIT_ADAPTER_NOT_FOUND, "adapter",
                   "The adapter '%.64s' does not exist (this server holds no LoRA adapters)",
                   adapter);
        goto fail;
    }
    ks_errbuf eb = {0};
    bool chat = rq.msgs != NULL;
    bool add_special = true; // BOS/EOS by the vocabulary; a Jinja template writes its own
    if (chat && !srv__chat_prompt(sm, &rq, &text, &add_special, &spans, &n_spans, &err))
        goto fail;
    const char *ptext = chat ? text : rq.prompt;
    size_t ptext_len = strlen(ptext);
    int32_t max_tokens = rq.max_tokens;
    // issue 12: n / best_of choices, logit_bias, echo (srv__gen_choices)
    int n_ch = rq.best_of;
    if (!srv__gen_choices(s, sm, &rq, &err)) goto fail;
    if (max_tokens == 0) n_ch = 1; // echo only: one prompt, answered n times
    if (max_tokens < 0) max_tokens = ans->default_max_tokens; // the API's (-1: the context)
    // Issue 8: the prompt's bytes give a lower bound on its tokens; a prompt
    // that cannot fit even so is refused before any tokenizing, with the
    // engine's 400. So no request tokenizes more than about n_ctx *
    // max_token_bytes bytes. Issue 38: it is charged as a prompt tokenized
    // and refused as too long is (n_ctx + 1 tokens, where tokenizing stops),
    // within the tenant's limits: a tenant at its limit gets the 429 instead.
    if (!srv_prompt_fits(sm->n_ctx, ptext_len, sm->max_token_bytes, max_tokens, route, &err)) {
        held_reserved = held_charge = (int64_t)sm->n_ctx + 1;
        char m429[256];
        admit_reason r429 =
            srv_tenants_admit(s->ts, tenant, held_reserved, ks_now_ns(), m429, sizeof m429);
        if (r429 != ADMIT_OK)
            srv_refuse(&err, r429, NULL, "%s", m429);
        else
            held = tenant; // charged below (fail:)
        goto fail;
    }
    // The tenant's limits apply before the expensive work (tokenizing): on a
    // lower bound of the tokens (chat without max_tokens reserves the whole
    // context), raised to the exact count once tokenized.
    int64_t min_prompt = srv_prompt_min_tokens(ptext_len, sm->max_token_bytes);
    held_reserved = max_tokens < 0 ? (int64_t)sm->n_ctx * n_ch
                                   : (min_prompt > 0 ? min_prompt : 1) + (int64_t)max_tokens * n_ch;
    char msg[256];
    srv_reqinfo *ri = srv__ri(c);
    if (ri) ri->need_tokens = held_reserved; // a 429's Retry-After: when these are there
    admit_reason rj =
        srv_tenants_admit_n(s->ts, tenant, n_ch, held_reserved, ks_now_ns(), msg, sizeof msg);
    if (rj != ADMIT_OK) {
        srv_refuse(&err, rj, NULL, "%s", msg);
        goto fail;
    }
    held = tenant;
    // A chat template's own markers become control tokens, the request's text
    // in it (spans) never does; a raw prompt is all text (issue 38: no one can
    // forge a turn). Stops past n_ctx tokens: more is refused however many.
    ks_err tke = tok_encode_marked(sm->vocab, ptext, ptext_len, add_special, chat, spans, n_spans,
                                   (size_t)sm->n_ctx, &ids, &n_ids, &eb);
    free(spans);
    spans = NULL;
    if (tke) {
        srv_fail(&err, 500, "internal_error", "tokenizer: %s", eb.msg);
        goto fail;
    }
    bool cut = n_ids > (size_t)sm->n_ctx; // only a prefix: the prompt has at least n_ids
    int32_t n_prompt = n_ids > INT32_MAX ? INT32_MAX : (int32_t)n_ids;
    held_charge = n_prompt; // the work done, charged if refused as too long
    if (max_tokens < 0) {
        max_tokens = sm->n_ctx - n_prompt; // chat: up to the context
        if (max_tokens < 1) max_tokens = 1;
    }
    // A request that cannot fit still goes to the engine's admission for its
    // exact refusal (I4 lives there, one contract for every front end).
    bool over = (int64_t)n_prompt + max_tokens > sm->n_ctx;
    if (!over) {
        int64_t want = (int64_t)n_prompt + (int64_t)max_tokens * n_ch; // every choice's tokens
        if (ri) ri->need_tokens = want;
        rj = srv_tenants_grow(s->ts, tenant, held_reserved, want, ks_now_ns(), msg, sizeof msg);
        if (rj != ADMIT_OK) {
            srv_refuse(&err, rj, NULL, "%s", msg);
            goto fail;
        }
        held_reserved = want;
    }
    if (s->log_content) ks_log(KS_LOG_INFO, "prompt (%d tokens): %s", n_prompt, ptext);

    if (!(g = srv__gen_new(s, sm, sc, route, model_name, held, held_reserved))) {
        srv_fail(&err, 500, "internal_error", "out of memory");
        goto fail;
    }
    held = -1; // g releases the tenant from here on
    g->api = api;
    g->n_prompt = n_prompt;
    g->max_tokens = max_tokens;
    g->n_ch = n_ch; // the tenant's slots too (srv_tenants_admit_n)
    g->logprobs = rq.logprobs;
    g->top = rq.top_logprobs;
    g->include_usage = rq.include_usage;
    g->rx = rx;                         // g frees it from here on
    g->etenant = s->ts->t[tenant].name; // whose store keeps the response
    memset(&rx, 0, sizeof rx);
    // the completion's id is the request's x-request-id behind OpenAI's (or
    // Anthropic's) prefix, as vLLM does; without request state, a random one
    // of the same form
    if (ri)
        memcpy(g->rid, ri->rid, sizeof g->rid);
    else
        srv_request_id_new(g->rid, sizeof g->rid);
    snprintf(g->id, sizeof g->id, "%s%s", ans->id_prefix, g->rid);
    // a stored response's id is a key a client must not choose: random
    if (route == SRV_ROUTE_RESPONSES) srv_make_id(ans->id_prefix, g->id, sizeof g->id);
    for (int i = 0; route == SRV_ROUTE_MESSAGES && i < rq.n_stops; i++) {
        if (!(g->stops[i] = strdup(rq.stops[i]))) {
            srv_fail(&err, 500, "internal_error", "out of memory");
            goto fail;
        }
        g->n_stops = i + 1;
    }
    g->n_ch = n_ch;
    g->n_ret = rq.n;
    if (rq.echo && route == SRV_ROUTE_COMPLETIONS) {
        g->echo_len = strlen(rq.prompt);
        if (!(g->echo = malloc(g->echo_len + 1))) {
            srv_fail(&err, 500, "internal_error", "out of memory");
            goto fail;
        }
        memcpy(g->echo, rq.prompt, g->echo_len + 1);
        if (rq.logprobs && !(g->plp = srv__lp_completion_new())) {
            srv_fail(&err, 500, "internal_error", "out of memory");
            goto fail;
        }
    }
    for (int i = 0; i < n_ch; i++) {
        g->ch[i].text_off = g->echo_len; // generated text follows the echoed prompt
        if (rq.logprobs && !(g->ch[i].lp = route == SRV_ROUTE_COMPLETIONS ? srv__lp_completion_new()
                                                                          : json_array())) {
            srv_fail(&err, 500, "internal_error", "out of memory");
            goto fail;
        }
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) g->fd = ci->connect_fd;
    g->conn = c;

    engine_params p = {0};
    p.tenant = s->ts->t[tenant].name; // from authentication only (I7)
    p.cache_domain = s->ts->t[tenant].cache_domain;
    p.prompt = ids;
    p.n_prompt = n_prompt;
    p.max_tokens = max_tokens;
    p.sp = rq.sp;
    if (!rq.seeded) randombytes_buf(&p.sp.seed, sizeof p.sp.seed);
    p.stops = rq.stops;
    p.n_stops = rq.n_stops;
    p.ignore_eos = rq.ignore_eos;
    p.bias = rq.bias;
    p.n_bias = rq.n_bias;
    // echo's max_tokens 0 needs the engine's prompt pass; logprobs need its rows
    p.prompt_logprobs = g->echo && (rq.logprobs || max_tokens == 0);
    p.prompt_top = rq.top_logprobs;
    p.model = sm->index;
    p.adapter = adapter; // resolved by the engine under p.tenant: another's is not found
    p.no_spec = rq.no_spec;
    if (rq.prediction) { // drafts only (engine_opts.spec_tokens): as text of the answer, no BOS;
        // past n_ctx tokens nothing could be drafted from it, so no more is tokenized
        if (tok_encode_max(sm->vocab, rq.prediction, rq.prediction_len, false, false,
                           (size_t)sm->n_ctx, &pred, &n_pred, &eb) != KS_OK) {
            srv_fail(&err, 500, "internal_error", "tokenizer: %s", eb.msg);
            goto fail;
        }
        p.prediction = pred;
        p.n_prediction = n_pred > (size_t)sm->n_ctx ? sm->n_ctx : (int32_t)n_pred;
    }
    if (chat_like && !srv__tool_choice_grammar(sm, &rq, &err)) goto fail;
    p.grammar = rq.grammar;
    if (chat_like) {
        ks_err te = srv__gen_toolcall(s, g, &rq, ptext, ptext_len);
        if (te) {
            srv_fail(&err, 500, "internal_error", "out of memory");
            goto fail;
        }
    }
    g->t_submit_ns = ks_now_ns();
    void *reqs[ENGINE_MAX_N] = {0};
    ks_err e = n_ch > 1 ? s->b.submit_n(s->b.impl, &p, n_ch, reqs, &eb)
                        : s->b.submit(s->b.impl, &p, &reqs[0], &eb);
    for (int i = 0; !e && i < n_ch; i++)
        g->ch[i].req = reqs[i];
    if (e) {
        srv__submit_error(e, &eb, route, &err);
        if (err.reason == ADMIT_UNSUPPORTED_PARAMETER && rq.grammar_param)
            snprintf(err.param, sizeof err.param, "%s", rq.grammar_param);
        srv__refused_long(s, g, &err, cut, held_charge);
        goto fail;
    }
    free(ids);
    free(pred);
    free(text);
    ids = NULL;
    text = NULL;
    g->stream = rq.stream;
    g->http11 = sc->http11;
    srv_request_free(&rq);
    // a generation may take longer than MHD's idle timeout
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    pthread_mutex_lock(&s->lmu);  // the sweeper watches it from now on
    g->lnext = s->gens;
    if (s->gens) s->gens->lprev = g;
    s->gens = g;
    pthread_mutex_unlock(&s->lmu);
    for (int i = 0; i < g->n_ch; i++)
        s->b.set_notify(g->ch[i].req, srv__gen_notify, g);
    return g->stream ? srv__stream_start(s, c, g, sc) : srv__gen_collect(s, c, g, sc);
fail:
    if (held >= 0)
        srv_tenants_refuse_n(s->ts, held, n_ch, held_reserved,
                             err.reason == ADMIT_CONTEXT_LENGTH ? held_charge : 0);
    srv__gen_free(g);
    free(ids);
    free(pred);
    free(text);
    free(spans);
    srv_request_free(&rq);
    srv_resp_req_free(&rx);
    return srv__reply_error(s, c, api, &err);
}

