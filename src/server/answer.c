/* answer.c — a generation's answer: the tool-call and reasoning glue
 * (toolcall.h), Anthropic's message shapes (anthropic.h) and the
 * non-streamed answer that collects every event before replying. */
#include "http_int.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

// ----------------------------------------------------------------------------
// Generation: tool calls and reasoning (toolcall.h)

/* The formats this server's chat answers use: --tool-call-format and
 * --reasoning-format, else what the chat template rendered with tools
 * (--chat-template-file's, the GGUF's tool_use variant or its main one)
 * shows. Can't fail: no template has no markers. */
void srv__toolcall_setup(const server *s, srv_model *sm) {
    const char *src = chat_tmpl_source(sm->chat, true);
    sm->tc_format = s->o.tool_call_format >= 0 && s->o.tool_call_format < TOOLCALL__COUNT
                        ? (toolcall_format)s->o.tool_call_format
                        : toolcall_format_detect(src);
    if (s->o.reasoning_format != 0 &&
        !toolcall_think_detect(src, &sm->think_open, &sm->think_close) &&
        s->o.reasoning_format == 1)
        sm->think_open = "<think>", sm->think_close = "</think>";
    ks_log(KS_LOG_INFO, "chat answers for %s: tool calls in format %s, reasoning %s%s%s",
           srv__model_primary(sm), toolcall_format_name(sm->tc_format),
           sm->think_open ? "split at " : "left in content", sm->think_open ? sm->think_open : "",
           sm->think_open ? sm->think_close : "");
}

/* tool_choice "required" or a named function: rq's grammar becomes one
 * call in the server's tool-call format (toolcall_grammar), so decoding
 * can only write a call the parser reads back. False with *err (400) when
 * the request also constrains the output otherwise, or the format has no
 * grammar. */
bool srv__tool_choice_grammar(const srv_model *s, srv_request *rq, srv_error *err) {
    const toolcall_req *tr = &rq->tc;
    if (tr->choice != TOOLCALL_CHOICE_REQUIRED && tr->choice != TOOLCALL_CHOICE_NAMED) return true;
    if (rq->grammar) {
        srv_refuse(err, ADMIT_INVALID, "tool_choice",
                   "'tool_choice' \"required\" or a named function cannot be combined with %s",
                   rq->grammar_param ? rq->grammar_param : "a grammar");
        return false;
    }
    char *gbnf = toolcall_grammar(s->tc_format, tr->tools,
                                  tr->choice == TOOLCALL_CHOICE_NAMED ? tr->name : NULL);
    if (!gbnf) {
        srv_refuse(err, ADMIT_UNSUPPORTED_PARAMETER, "tool_choice",
                   "'tool_choice' \"required\" or a named function needs a tool-call format "
                   "with a grammar; this server's is '%s' (--tool-call-format)",
                   toolcall_format_name(s->tc_format));
        return false;
    }
    ks_errbuf eb = {0};
    ks_err e = grammar_parse(gbnf, strlen(gbnf), &rq->grammar, &eb);
    free(gbnf);
    if (e) {
        srv_refuse(err, ADMIT_INVALID, "tool_choice", "the tool-call grammar: %s", eb.msg);
        return false;
    }
    rq->grammar_param = "tool_choice";
    return true;
}

/* Sets up g's parser when its answer may hold tool calls (tools given,
 * tool_choice not "none", a format known) or reasoning (think markers).
 * prompt is the rendered chat: an answer that starts inside a think block
 * starts as reasoning. Each choice gets its own parser (n > 1: every
 * choice's answer is parsed on its own). KS_ERR_NOMEM. */
ks_err srv__gen_toolcall(server *s, srv_gen *g, const srv_request *rq, const char *prompt,
                                size_t len) {
    const toolcall_req *tr = &rq->tc;
    const srv_model *sm = g->sm;
    (void)s;
    bool calls = tr->tools && tr->choice != TOOLCALL_CHOICE_NONE && sm->tc_format != TOOLCALL_NONE;
    if (!calls && !sm->think_open) return KS_OK;
    g->tc_tools = tr->tools ? json_incref((json_t *)tr->tools) : NULL;
    g->tc_cfg = (toolcall_cfg){
        .format = calls ? sm->tc_format : TOOLCALL_NONE,
        .think_open = sm->think_open,
        .think_close = sm->think_close,
        .in_reasoning = toolcall_prompt_opens_think(prompt, len, sm->think_open),
        .tools = g->tc_tools,
    };
    g->tc_parallel = tr->parallel;
    for (int i = 0; i < g->n_ch; i++) {
        ks_err e = toolcall_parser_create(&g->tc_cfg, &g->ch[i].tc);
        if (e) return e;
    }
    return KS_OK;
}

/* Appends ev's text as the parser reads it to b: the text, then the text of
 * ev's token when that is a special token the detokenizer dropped and one of
 * the parser's markers (DeepSeek's and Mistral's are control tokens). No
 * other special token's text is added (an end-of-turn never is). */
static bool srv__tc_text(const srv_gen *g, const engine_event *ev, srv_buf *b) {
    if (ev->text_len && !srv_buf_add(b, ev->text, ev->text_len)) return false;
    if (ev->token < 0) return true;
    char piece[128];
    if (tok_piece(g->sm->vocab, ev->token, false, piece, sizeof piece) != 0) return true;
    size_t n = tok_piece(g->sm->vocab, ev->token, true, piece, sizeof piece);
    if (n == 0 || n > sizeof piece || !toolcall_is_marker(&g->tc_cfg, piece, n)) return true;
    return srv_buf_add(b, piece, n);
}

/* Appends one chat.completion.chunk of choice idx with this delta (stolen)
 * and logprobs (stolen; NULL: null). */
static bool srv__tc_chunk(srv_gen *g, int idx, json_t *delta, json_t *lp) {
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:o, s:n}]}", "id", g->id, "object",
                          "chat.completion.chunk", "created", (json_int_t)g->created, "model",
                          g->model, "choices", "index", idx, "delta", delta, "logprobs",
                          lp ? lp : json_null(), "finish_reason");
    bool ok = j && srv_sse_json(&g->out, j);
    json_decref(j);
    return ok;
}

/* The chunks of one parser delta of choice idx: its content and reasoning
 * (with lp, the token's logprobs, stolen, NULL: none) in one chunk, then
 * each new call as OpenAI streams one: a chunk with its index, id, type and
 * name (arguments ""), then one with its arguments. parallel_tool_calls
 * false: calls after the first are left out. */
static bool srv__tc_emit(srv_gen *g, int idx, const toolcall_delta *d, json_t *lp) {
    srv_choice *ch = &g->ch[idx];
    bool ok = true;
    if (d->content_len || d->reasoning_len || lp) {
        json_t *delta = json_object();
        if (delta && d->content_len)
            json_object_set_new(delta, "content", srv__jstr(d->content, d->content_len));
        if (delta && d->reasoning_len)
            json_object_set_new(delta, "reasoning_content",
                                srv__jstr(d->reasoning, d->reasoning_len));
        if (!delta) json_decref(lp);
        ok = delta && srv__tc_chunk(g, idx, delta, lp);
    }
    for (int i = 0; ok && i < d->n_calls && (g->tc_parallel || ch->tc_sent == 0); i++) {
        const toolcall_call *c = toolcall_parser_call(ch->tc, d->first_call + i);
        int ci = ch->tc_sent++;
        ok = srv__tc_chunk(g, idx,
                           json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index",
                                     ci, "id", c->id, "type", "function", "function", "name",
                                     c->name, "arguments", ""),
                           NULL) &&
             srv__tc_chunk(g, idx,
                           json_pack("{s:[{s:i, s:{s:s}}]}", "tool_calls", "index", ci, "function",
                                     "arguments", c->arguments),
                           NULL);
    }
    return ok;
}

/* A streamed chat event of choice idx through its parser (the done event
 * also settles what the parser held back). */
bool srv__tc_stream(srv_gen *g, int idx, const engine_event *ev) {
    toolcall_parser *tc = g->ch[idx].tc;
    srv_buf t = {0};
    toolcall_delta d;
    bool ok =
        srv__tc_text(g, ev, &t) && toolcall_parser_push(tc, t.p ? t.p : "", t.len, &d) == KS_OK;
    srv_buf_free(&t);
    json_t *lp = NULL;
    if (ok && g->logprobs && ev->token >= 0)
        lp = json_pack("{s:[o]}", "content",
                       srv__lp_entry(g->sm->vocab, ev->token, ev->sr.logprob, true, &ev->sr));
    ok = ok && srv__tc_emit(g, idx, &d, lp);
    if (ok && ev->done)
        ok = toolcall_parser_finish(tc, &d) == KS_OK && srv__tc_emit(g, idx, &d, NULL);
    return ok;
}

static bool srv__all_ws(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r') return false;
    return true;
}

/* The message of a non-streamed chat answer parsed by tc from its text:
 * content (null when there are calls and nothing but whitespace besides),
 * reasoning_content when there is some, tool_calls when there are; *fin
 * becomes "tool_calls" when there are calls and the answer ended on a stop.
 * NULL on out-of-memory. */
static json_t *srv__tc_message(srv_gen *g, toolcall_parser *tc, const srv_buf *text,
                               const char **fin) {
    toolcall_delta d;
    if (toolcall_parser_push(tc, text->p ? text->p : "", text->len, &d) ||
        toolcall_parser_finish(tc, &d))
        return NULL;
    size_t cl, rl;
    const char *c = toolcall_parser_content(tc, &cl), *r = toolcall_parser_reasoning(tc, &rl);
    int n = toolcall_parser_n_calls(tc);
    if (n > 1 && !g->tc_parallel) n = 1;
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content",
                          n && srv__all_ws(c, cl) ? json_null() : srv__jstr(c, cl));
    if (m && rl) json_object_set_new(m, "reasoning_content", srv__jstr(r, rl));
    if (m && n) {
        json_t *calls = json_array();
        for (int i = 0; i < n && calls; i++) {
            const toolcall_call *call = toolcall_parser_call(tc, i);
            json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", call->id,
                                                   "type", "function", "function", "name",
                                                   call->name, "arguments", call->arguments));
        }
        json_object_set_new(m, "tool_calls", calls);
        if (!strcmp(*fin, "stop")) *fin = "tool_calls";
    }
    return m;
}

// ----------------------------------------------------------------------------
// Generation: Anthropic's Messages answers (anthropic.h builds the shapes)

/* The stop sequence that ended g's answer (ev its done event), or NULL. */
static const char *srv__anth_stop_seq(const srv_gen *g, const engine_event *ev) {
    if (ev->finish != ENGINE_FINISH_STOP || !g->n_stops) return NULL;
    return srv_anth_stop_match(g->raw.p, g->raw.len, (const char *const *)g->stops, g->n_stops);
}

/* The SSE events of one parser delta: reasoning as thinking, content as
 * text, each new call as a whole tool_use block (as srv__tc_emit). */
static bool srv__anth_emit(srv_gen *g, const toolcall_delta *d) {
    bool ok = true;
    if (d->reasoning_len)
        ok = srv_anth_sse_text(&g->anth, &g->out, true, srv__jstr(d->reasoning, d->reasoning_len));
    if (ok && d->content_len)
        ok = srv_anth_sse_text(&g->anth, &g->out, false, srv__jstr(d->content, d->content_len));
    srv_choice *ch = &g->ch[0]; // Messages answers have one choice
    for (int i = 0; ok && i < d->n_calls && (g->tc_parallel || ch->tc_sent == 0); i++) {
        const toolcall_call *c = toolcall_parser_call(ch->tc, d->first_call + i);
        char id[64];
        srv_anth_tool_id(c->id, id, sizeof id);
        ch->tc_sent++;
        ok = srv_anth_sse_tool(&g->anth, &g->out, id, c->name, c->arguments);
    }
    return ok;
}

/* One event of a streamed Messages answer; the done event ends it with
 * message_delta + message_stop, or an error event when it failed. */
bool srv__anth_stream_event(srv_gen *g, const engine_event *ev) {
    bool ok = !g->raw_oom;
    toolcall_parser *tc = g->ch[0].tc; // Messages answers have one choice
    if (ok && tc) {
        srv_buf t = {0};
        toolcall_delta d;
        ok =
            srv__tc_text(g, ev, &t) && toolcall_parser_push(tc, t.p ? t.p : "", t.len, &d) == KS_OK;
        srv_buf_free(&t);
        ok = ok && srv__anth_emit(g, &d);
        if (ok && ev->done) ok = toolcall_parser_finish(tc, &d) == KS_OK && srv__anth_emit(g, &d);
    } else if (ok && ev->text_len) {
        ok = srv_anth_sse_text(&g->anth, &g->out, false, srv__jstr(ev->text, ev->text_len));
    }
    if (ok && g->s->log_content && ev->text_len) ok = srv_buf_add(&g->text, ev->text, ev->text_len);
    if (!ok || !ev->done) return ok;
    const char *seq = srv__anth_stop_seq(g, ev);
    const char *reason = srv_anth_stop_reason(ev->finish, g->ch[0].tc_sent > 0, seq);
    if (!reason) {
        srv_error err;
        srv__gen_error(g, ev, &err);
        return srv_anth_sse_error(&g->out, &err);
    }
    return srv_anth_sse_end(&g->anth, &g->out, reason, strcmp(reason, "stop_sequence") ? NULL : seq,
                            g->n_gen);
}

/* The message of a non-streamed Messages answer from its one choice's text
 * (ev: the done event, totals counted): thinking, text and tool_use
 * blocks. NULL on out-of-memory. */
static json_t *srv__anth_answer(srv_gen *g, const srv_buf *text, const engine_event *ev) {
    const char *c = text->p ? text->p : "", *r = NULL;
    size_t cl = text->len, rl = 0;
    int n = 0;
    toolcall_delta d;
    toolcall_parser *tc = g->ch[0].tc;
    if (tc) {
        if (toolcall_parser_push(tc, c, cl, &d) || toolcall_parser_finish(tc, &d)) return NULL;
        c = toolcall_parser_content(tc, &cl);
        r = toolcall_parser_reasoning(tc, &rl);
        n = toolcall_parser_n_calls(tc);
        if (n > 1 && !g->tc_parallel) n = 1;
    }
    json_t *content = json_array();
    bool ok = content != NULL && !g->raw_oom;
    if (ok && rl) ok = !json_array_append_new(content, srv_anth_text_block(true, srv__jstr(r, rl)));
    if (ok && ((cl && !(n && srv__all_ws(c, cl))) || (!n && !rl)))
        ok = !json_array_append_new(content, srv_anth_text_block(false, srv__jstr(c, cl)));
    for (int i = 0; ok && i < n; i++) {
        const toolcall_call *call = toolcall_parser_call(tc, i);
        char id[64];
        srv_anth_tool_id(call->id, id, sizeof id);
        ok = !json_array_append_new(content, srv_anth_tool_block(id, call->name, call->arguments));
    }
    if (!ok) {
        json_decref(content);
        return NULL;
    }
    const char *seq = srv__anth_stop_seq(g, ev);
    const char *reason = srv_anth_stop_reason(ev->finish, n > 0, seq);
    return srv_anth_message(g->id, g->model, content, reason,
                            reason && !strcmp(reason, "stop_sequence") ? seq : NULL, ev->n_prompt,
                            ev->n_cached, ev->n_gen);
}

// ----------------------------------------------------------------------------
// Generation: OpenAI's Responses answers (responses.h builds the shapes)

/* The items of one parser delta: reasoning, message text, each new call
 * as a whole function_call item (parallel_tool_calls false: the first). */
static bool srv__resp_emit(srv_gen *g, const toolcall_delta *d) {
    bool ok = srv_resp_out_text(&g->ro, true, d->reasoning, d->reasoning_len) &&
              srv_resp_out_text(&g->ro, false, d->content, d->content_len);
    srv_choice *ch = &g->ch[0]; // Responses answers have one choice
    for (int i = 0; ok && i < d->n_calls && (g->tc_parallel || ch->tc_sent == 0); i++) {
        const toolcall_call *c = toolcall_parser_call(ch->tc, d->first_call + i);
        ch->tc_sent++;
        ok = srv_resp_out_call(&g->ro, c->id, c->name, c->arguments);
    }
    return ok;
}

json_t *srv__resp_final(srv_gen *g, const engine_event *ev) {
    const char *status = ev->finish == ENGINE_FINISH_LENGTH ? "incomplete" : "completed";
    json_t *usage = srv_resp_usage(ev->n_prompt, ev->n_cached, ev->n_gen, g->ro.n_reasoning);
    json_t *resp =
        srv_resp_object(g->rx.echo, g->id, g->created, g->model, status, g->ro.output, usage);
    if (!resp || !g->rx.store || !g->s->resp) return resp;
    // the conversation a later previous_response_id continues: inputs, then outputs
    json_t *conv = json_copy(g->rx.items);
    if (!conv || json_array_extend(conv, g->ro.output)) {
        json_decref(conv);
        json_decref(resp);
        return NULL;
    }
    // etenant: set when the generation was created (g->tenant is released by then)
    ks_err e = srv_resp_store_put(g->s->resp, g->etenant, g->id, resp, conv, ks_now_ns());
    json_decref(conv);
    if (e) // not kept: a later GET answers 404, as for store false
        ks_log(KS_LOG_WARN, "response %s not stored: %s", g->id, ks_strerror(e));
    return resp;
}

bool srv__resp_event(srv_gen *g, const engine_event *ev) {
    bool ok = true;
    toolcall_parser *tc = g->ch[0].tc;
    if (tc) {
        srv_buf t = {0};
        toolcall_delta d;
        ok =
            srv__tc_text(g, ev, &t) && toolcall_parser_push(tc, t.p ? t.p : "", t.len, &d) == KS_OK;
        srv_buf_free(&t);
        if (ok && d.reasoning_len && ev->token >= 0) g->ro.n_reasoning++;
        ok = ok && srv__resp_emit(g, &d);
        if (ok && ev->done) ok = toolcall_parser_finish(tc, &d) == KS_OK && srv__resp_emit(g, &d);
    } else {
        ok = srv_resp_out_text(&g->ro, false, ev->text, ev->text_len);
    }
    if (ok && g->s->log_content && ev->text_len) // the log line's output (srv__gen_account)
        ok = srv_buf_add(g->stream ? &g->text : &g->ch[0].text, ev->text, ev->text_len);
    if (!ok || !ev->done) return ok;
    if (!srv_finish_name(ev->finish)) { // failed or aborted
        if (!g->stream) return true;    // the collector answers the error
        srv_error err;
        srv__gen_error(g, ev, &err);
        return srv_resp_out_error(&g->ro, &err);
    }
    if (!srv_resp_out_close(&g->ro)) return false;
    if (!g->stream) return true; // srv__gen_collect answers with srv__resp_final
    json_t *resp = srv__resp_final(g, ev);
    ok = resp && srv_resp_out_end(&g->ro, resp);
    json_decref(resp);
    return ok;
}

// ----------------------------------------------------------------------------
// Generation: non-streaming


/* A non-streamed answer: takes the events there are; once the done event
 * is in, answers and frees g, else suspends the connection with g in
 * sc->gen (the access handler comes back here when an event is posted). */
/* Appends every element of array src to array dst (json_array_extend). */
static void srv__lp_concat(json_t *dst, const json_t *src, const char *key) {
    json_array_extend(json_object_get(dst, key), json_object_get(src, key));
}

/* Choice ch's logprobs for the answer: chat {content}; completions the
 * prompt's (echo) then its own. A new reference, or JSON null. */
static json_t *srv__choice_lp(srv_gen *g, const srv_choice *ch) {
    if (!g->logprobs || !ch->lp) return json_null();
    if (g->route == SRV_ROUTE_CHAT) return json_pack("{s:O}", "content", ch->lp);
    if (!g->plp) return json_incref(ch->lp);
    json_t *lp = json_deep_copy(g->plp);
    static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (int k = 0; lp && k < 4; k++)
        srv__lp_concat(lp, ch->lp, keys[k]);
    return lp ? lp : json_null();
}

/* best_of: the order in which choices are answered, best first: by the
 * mean log-probability of their tokens (OpenAI: "the highest log
 * probability per token"), ties to the lower index. */
static void srv__rank(const srv_gen *g, int *order) {
    double mean[ENGINE_MAX_N];
    for (int i = 0; i < g->n_ch; i++) {
        order[i] = i;
        const srv_choice *ch = &g->ch[i];
        mean[i] = ch->n_gen > 0 ? ch->lp_sum / ch->n_gen : 0.0;
    }
    if (g->n_ch == g->n_ret) return;  // no ranking asked for: keep the indices
    for (int a = 1; a < g->n_ch; a++) // insertion sort: stable, n <= 16
        for (int b = a; b > 0 && mean[order[b]] > mean[order[b - 1]]; b--) {
            int t = order[b];
            order[b] = order[b - 1];
            order[b - 1] = t;
        }
}

/* A non-streamed answer: takes the events there are; once every choice's
 * done event is in, answers and frees g, else suspends the connection with
 * g in sc->gen (the access handler comes back here when an event is
 * posted). */
enum MHD_Result srv__gen_collect(server *s, struct MHD_Connection *c, srv_gen *g,
                                        srv_conn *sc) {
    engine_event ev;
    bool ok = !g->oom;
    sc->gen = NULL;
    for (;;) {
        int got = srv__gen_poll(g, &ev);
        if (got == 0) {
            if (!srv__gen_suspend(g)) continue;
            g->oom = !ok;
            sc->gen = g;
            return MHD_YES;
        }
        if (got < 0 || (ev.done && atomic_load(&g->gone) && ev.state != ENGINE_FINISHED)) {
            srv_error err;
            srv__gone_error(s, &err);
            if (got > 0) {
                engine_event t = srv__gen_total(g, &ev);
                srv__gen_account(g, &t);
            }
            enum MHD_Result r = srv__reply_error(s, c, g->api, &err);
            srv__gen_free(g);
            return r;
        }
        srv_choice *ch = &g->ch[g->cur];
        if (g->route == SRV_ROUTE_RESPONSES) { // its items built as they come
            ok = ok && !g->ro.oom && srv__resp_event(g, &ev);
            if (ev.done) break;
            continue;
        }
        if (ev.prompt) { // echo: the prompt's logprobs, shared by every choice
            if (g->logprobs && g->plp) srv__lp_completion(g, g->plp, &ev, &g->ptext_off);
            continue;
        }
        if (ch->tc) // parsed when answering (srv__tc_message)
            ok = ok && srv__tc_text(g, &ev, &ch->text);
        else if (ev.text_len)
            ok = ok && srv_buf_add(&ch->text, ev.text, ev.text_len);
        if (g->logprobs && ev.token >= 0 && ch->lp) {
            if (g->route == SRV_ROUTE_CHAT)
                json_array_append_new(
                    ch->lp, srv__lp_entry(g->sm->vocab, ev.token, ev.sr.logprob, true, &ev.sr));
            else
                srv__lp_completion(g, ch->lp, &ev, &ch->text_off);
        }
        if (ev.done && !srv_finish_name(ev.finish)) break; // one failed: the answer fails
        if (g->done) break;
    }
    engine_event total = srv__gen_total(g, &ev);
    srv__gen_account(g, &total);
    const char *fin = srv_finish_name(ev.finish);
    if (!fin || !ok) {
        srv_error err;
        if (!ok)
            srv_fail(&err, 500, "internal_error", "out of memory");
        else
            srv__gen_error(g, &ev, &err);
        enum MHD_Result r = srv__reply_error(s, c, g->api, &err);
        srv__gen_free(g);
        return r;
    }
    if (g->route == SRV_ROUTE_RESPONSES) {
        json_t *m = srv__resp_final(g, &total);
        srv_route api = g->api;
        srv__gen_free(g);
        if (m) return srv__reply_json(s, c, api, 200, m);
        srv_error err;
        srv_fail(&err, 500, "internal_error", "out of memory");
        return srv__reply_error(s, c, api, &err);
    }
    if (g->route == SRV_ROUTE_MESSAGES) {
        json_t *m = srv__anth_answer(g, &g->ch[0].text, &total);
        srv_route api = g->api;
        srv__gen_free(g);
        if (m) return srv__reply_json(s, c, api, 200, m);
        srv_error err;
        srv_fail(&err, 500, "internal_error", "out of memory");
        return srv__reply_error(s, c, api, &err);
    }
    json_t *usage = srv_usage_json(&total);
    json_t *j;
    if (g->route == SRV_ROUTE_WORKERS) {
        const srv_buf *t = &g->ch[0].text;
        j = json_pack("{s:{s:o, s:o}, s:b, s:[], s:[]}", "result", "response",
                      srv__jstr(t->p ? t->p : "", t->len), "usage", usage, "success", 1, "errors",
                      "messages");
    } else {
        int order[ENGINE_MAX_N];
        srv__rank(g, order);
        json_t *choices = json_array();
        for (int k = 0; choices && k < g->n_ret; k++) {
            srv_choice *ch = &g->ch[g->n_ch == 1 ? 0 : order[k]];
            const char *cfin = srv_finish_name(ch->end.finish);
            srv_buf t = {0}; // echo: the prompt, then the completion
            bool tok = (!g->echo || srv_buf_add(&t, g->echo, g->echo_len)) &&
                       (!ch->text.len || srv_buf_add(&t, ch->text.p, ch->text.len));
            json_t *text = tok ? srv__jstr(t.p ? t.p : "", t.len) : NULL;
            srv_buf_free(&t);
            json_t *one;
            const char *f = cfin ? cfin : fin;
            if (g->route == SRV_ROUTE_CHAT && ch->tc) { // its content parsed: calls, reasoning
                json_decref(text);
                json_t *msg = srv__tc_message(g, ch->tc, &ch->text, &f);
                one = json_pack("{s:i, s:o, s:o, s:s}", "index", k, "message", msg, "logprobs",
                                srv__choice_lp(g, ch), "finish_reason", f);
            } else if (g->route == SRV_ROUTE_CHAT)
                one = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", k, "message", "role",
                                "assistant", "content", text, "logprobs", srv__choice_lp(g, ch),
                                "finish_reason", f);
            else
                one = json_pack("{s:o, s:i, s:o, s:s}", "text", text, "index", k, "logprobs",
                                srv__choice_lp(g, ch), "finish_reason", cfin ? cfin : fin);
            if (!one || json_array_append_new(choices, one)) {
                json_decref(choices);
                choices = NULL;
            }
        }
        j = choices ? json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", g->id, "object",
                                srv_route_answer(g->route)->object,
                                "created", (json_int_t)g->created, "model", g->model, "choices",
                                choices, "usage", usage)
                    : NULL;
        if (!choices) json_decref(usage);
    }
    srv_route route = g->api;
    srv__gen_free(g);
    return srv__reply_json(s, c, route, 200, j);
}

