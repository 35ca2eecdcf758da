/* stream.c — a generation's streamed answer (SSE): the status line waits
 * for the first event, then MHD's content reader pulls events as the
 * socket takes them (at most SRV_STREAM_UNSENT bytes unsent). */
#include "http_int.h"

#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

// ----------------------------------------------------------------------------
// Generation: streaming (SSE)

/* How many answer choices an event of choice idx stands for: with
 * max_tokens 0 (echo) one choice is generated and answered n times. */
static int srv__fanout(const srv_gen *g) { return g->n_ch == 1 ? g->n_ret : 1; }

/* Appends chunk j (consumed) to the stream; false on out of memory. */
static bool srv__sse_put(srv_gen *g, json_t *j, bool oom) {
    bool ok = !oom && (!j || srv_sse_json(&g->out, j));
    json_decref(j);
    return ok;
}

static bool srv__stream_event(srv_gen *g, const engine_event *ev) {
    if (g->route == SRV_ROUTE_MESSAGES) return srv__anth_stream_event(g, ev);
    if (g->route == SRV_ROUTE_RESPONSES) return srv__resp_event(g, ev);
    bool oom = false, ok = true;
    int idx = g->cur;
    if (ev->prompt) { // echo: a prompt token's logprobs, the same in every choice
        for (int i = 0; ok && i < g->n_ch * srv__fanout(g); i++)
            ok = srv__sse_put(g, srv__chunk(g, ev, i, &oom), oom);
        char raw[256];
        g->ptext_off += tok_piece(g->sm->vocab, ev->token, false, raw, sizeof raw);
        return ok;
    }
    if (g->ch[idx].tc) // each choice through its own parser
        ok = srv__tc_stream(g, idx, ev);
    else
        for (int k = 0; ok && k < srv__fanout(g); k++)
            ok = srv__sse_put(g, srv__chunk(g, ev, idx + k, &oom), oom);
    if (ok && g->s->log_content && ev->text_len) ok = srv_buf_add(&g->text, ev->text, ev->text_len);
    if (!ok || !ev->done) return ok;

    const char *fin = srv_finish_name(ev->finish);
    if (fin && g->ch[idx].tc_sent && ev->finish == ENGINE_FINISH_STOP) fin = "tool_calls";
    if (!fin) { // aborted or failed after the stream started: an error event, no [DONE]
        srv_error err;
        srv__gen_error(g, ev, &err);
        char *body = srv_error_json(g->api, &err);
        ok = body && srv_buf_add(&g->out, "data: ", 6) &&
             srv_buf_add(&g->out, body, strlen(body)) && srv_buf_add(&g->out, "\n\n", 2);
        free(body);
        return ok;
    }
    for (int k = 0; ok && k < srv__fanout(g); k++) {
        json_t *j = NULL;
        if (g->route == SRV_ROUTE_CHAT)
            j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{}, s:n, s:s}]}", "id", g->id, "object",
                          "chat.completion.chunk", "created", (json_int_t)g->created, "model",
                          g->model, "choices", "index", idx + k, "delta", "logprobs",
                          "finish_reason", fin);
        else if (g->route == SRV_ROUTE_COMPLETIONS)
            j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:s, s:i, s:n, s:s}]}", "id", g->id, "object",
                          "text_completion", "created", (json_int_t)g->created, "model", g->model,
                          "choices", "text", "", "index", idx + k, "logprobs", "finish_reason",
                          fin);
        else
            j = json_pack("{s:s, s:o}", "response", "", "usage",
                          srv_usage_json(ev));
        ok = j && srv_sse_json(&g->out, j);
        json_decref(j);
    }
    if (!ok || !g->done) return ok; // other choices still running
    if (g->include_usage && srv_dialect_get(srv_route_dialect(g->route))->stream_usage) {
        json_t *j =
            json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", g->id, "object",
                      srv_route_answer(g->route)->chunk_object,
                      "created", (json_int_t)g->created, "model", g->model, "choices", "usage",
                      srv_usage_json(&(engine_event){.n_prompt = ev->n_prompt,
                                                     .n_gen = g->n_gen,
                                                     .n_cached = ev->n_cached,
                                                     .n_drafted = g->n_drafted,
                                                     .n_accepted = g->n_accepted}));
        ok = j && srv_sse_json(&g->out, j);
        json_decref(j);
    }
    return ok && srv_sse_done(&g->out);
}

/* The first chunks of a stream: chat's role delta, a completion's echoed
 * prompt, for every choice. False on out of memory. */
static bool srv__stream_head(srv_gen *g) {
    if (g->route == SRV_ROUTE_MESSAGES)
        return srv_anth_sse_start(&g->anth, &g->out, g->id, g->model, g->n_prompt, 0);
    if (g->route == SRV_ROUTE_RESPONSES) { // the object as it starts: no output, no usage
        json_t *r =
            srv_resp_object(g->rx.echo, g->id, g->created, g->model, "in_progress", NULL, NULL);
        bool ok = r && srv_resp_out_start(&g->ro, &g->out, r);
        json_decref(r);
        return ok;
    }
    bool ok = true;
    for (int i = 0; ok && i < g->n_ch * srv__fanout(g); i++) {
        json_t *j = NULL;
        if (g->route == SRV_ROUTE_CHAT) // the role comes first, in its own delta
            j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:n, s:n}]}", "id", g->id,
                          "object", "chat.completion.chunk", "created", (json_int_t)g->created,
                          "model", g->model, "choices", "index", i, "delta", "role", "assistant",
                          "content", "", "logprobs", "finish_reason");
        else if (g->echo)
            j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:o, s:i, s:n, s:n}]}", "id", g->id, "object",
                          "text_completion", "created", (json_int_t)g->created, "model", g->model,
                          "choices", "text", srv__jstr(g->echo, g->echo_len), "index", i,
                          "logprobs", "finish_reason");
        else
            break;
        ok = j && srv_sse_json(&g->out, j);
        json_decref(j);
    }
    return ok;
}

static ssize_t srv__stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_gen *g = cls;
    while (g->out_off == g->out.len) {
        g->out.len = g->out_off = 0;
        if (g->eof) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!g->head_sent) {
            g->head_sent = true;
            if (!srv__stream_head(g)) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        engine_event ev;
        int got = g->has_first ? 1 : 0;  // the event srv__generate waited for comes first
        if (got) {
            ev = g->first;
            g->cur = g->first_cur;
            g->has_first = false;
        } else if ((got = srv__gen_poll(g, &ev)) == 0) {
            if (srv__gen_suspend(g)) return 0;  // called again once an event is posted
            continue;
        }
        if (got < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        bool ok = srv__stream_event(g, &ev);
        // the end: every choice done, or one failed (the others are cancelled)
        if (g->done || (ev.done && !srv_finish_name(ev.finish))) {
            g->eof = true;
            srv__gen_cancel(g);
            engine_event t = srv__gen_total(g, &ev);
            srv__gen_account(g, &t);
        }
        if (!ok) {
            srv__gen_cancel(g);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = g->out.len - g->out_off;
    if (n > max) n = max;
    memcpy(buf, g->out.p + g->out_off, n);
    g->out_off += n;
    return (ssize_t)n;
}

/* Back-pressure for a streamed answer: the kernel keeps at most
 * SRV_STREAM_UNSENT bytes the client has not taken (instead of megabytes
 * with autotuning), so a client that stops reading soon stops MHD pulling
 * events, and then the engine pauses the request (ENGINE_STREAM_BACKLOG)
 * rather than generating into memory. A client that takes nothing for the
 * idle timeout is dropped, and its request with it. */
#define SRV_STREAM_UNSENT 16384
static void srv__stream_socket(server *s, srv_gen *g) {
    int lowat = SRV_STREAM_UNSENT;
    if (g->fd >= 0) (void)setsockopt(g->fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, sizeof lowat);
    MHD_set_connection_option(g->conn, MHD_CONNECTION_OPTION_TIMEOUT, s->o.idle_timeout_s);
}

/* MHD is done with the streaming response: the answer was sent whole, or
 * the client went away (a failed write) and the request is cancelled now. */
static void srv__stream_free(void *cls) {
    srv_gen *g = cls;
    bool whole = g->eof && g->out_off == g->out.len;
    if (!whole && !atomic_exchange(&g->gone, true) &&
        !atomic_load_explicit(&g->s->stopping, memory_order_acquire))
        atomic_fetch_add_explicit(&g->s->met.client_disconnects, 1, memory_order_relaxed);
    srv__gen_free(g);
}

/* A streamed answer's start. The status line waits for the first event: a
 * request refused or lost before any output is answered like a
 * non-streamed one (its status, the error JSON). Any other first event is
 * kept for the stream, which then reads exactly as if it had been pulled
 * there. Until the first event, the connection waits suspended with g in
 * sc->gen (the access handler comes back here). */
enum MHD_Result srv__stream_start(server *s, struct MHD_Connection *c, srv_gen *g,
                                         srv_conn *sc) {
    sc->gen = NULL;
    int got;
    while ((got = srv__gen_poll(g, &g->first)) == 0) {
        if (srv__gen_suspend(g)) {
            sc->gen = g;
            return MHD_YES;
        }
    }
    g->first_cur = g->cur;
    if (got > 0) {
        if (g->first.done && !srv_finish_name(g->first.finish) && srv__done_mapped(&g->first)) {
            srv_error err;
            srv__gen_account(g, &g->first);
            srv__done_error(g, &g->first, &err);
            srv_route route = g->api;
            srv__gen_free(g);
            return srv__reply_error(s, c, route, &err);
        }
        g->has_first = true;
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                               srv__stream_cb, g, srv__stream_free);
    if (!r) {
        srv__gen_free(g);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    srv__decorate(s, c, r, 200);
    srv__stream_socket(s, g);
    pthread_mutex_lock(&g->mu);
    g->answered = true;  // the sweeper sends no interim answer from now on
    pthread_mutex_unlock(&g->mu);
    srv_route route = g->api;
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r); // g is freed with the response
    srv_metrics_request(&s->met, route, 200);
    return ret;
}

