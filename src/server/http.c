/* http.c — the HTTP server: libmicrohttpd daemon, routing, auth, the
 * generation handlers (OpenAI chat/completions, Workers AI), SSE streaming,
 * admin, /health and /metrics.
 *
 * The engine is reached only through a server_backend (server.h): the local
 * engine for `kvseal serve`, the cluster for `kvseal router`; "the engine"
 * below means whichever it is.
 *
 * Threading: MHD runs one internal accept thread and one thread per
 * connection (MHD_USE_THREAD_PER_CONNECTION). The engine's interface is a
 * blocking pull (engine_req_next with a timeout), so a connection thread
 * simply waits for its request's events: non-streaming answers are built in
 * the access handler, streaming answers in the response's content-reader
 * callback (MHD calls it on the same thread whenever the socket can take
 * more; blocking there is allowed in this mode). An epoll loop with
 * suspended connections would need a wakeup from the engine, which it does
 * not offer, and would still have to poll. No model code runs here: a
 * handler only parses, tokenizes, calls engine_submit and copies events.
 * A streamed answer's status line waits for the request's first event, so a
 * request refused or lost before any output (a cluster's REJECT, a lost
 * worker) is answered with its own status and error JSON, not 200 + SSE.
 *
 * Client disconnects: between events (every 50 ms at most) the waiting
 * thread polls the connection's socket for POLLRDHUP/POLLHUP and cancels
 * the engine request at once; MHD's request-completed path (response free
 * callback) releases the request too, so a vanished client never keeps
 * its KV pages longer than one scheduler step after we notice.
 *
 * Shutdown: server_destroy flags `stopping` (every waiting thread cancels
 * its request and ends its answer), then MHD_stop_daemon joins the
 * connection threads. */
#include "server_int.h"

#include "kvseal/chat.h"
#include "kvseal/kern.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define SRV_WAIT_MS 50 /* longest wait between disconnect checks */

struct server {
    server_opts o;          /* copy; the strings stay borrowed */
    server_backend b;       /* copy; b.impl borrowed */
    const model *m;         /* borrowed */
    const tok_vocab *vocab; /* model's */
    size_t max_token_bytes; /* tok_max_token_bytes(vocab): prompt bytes -> tokens bound */
    srv_tenants *ts;        /* owned */
    bool log_content;
    srv_metrics met;
    struct MHD_Daemon *d;
    int port;
    atomic_bool stopping;
    atomic_bool draining; /* server_drain: refuse new generations */
    atomic_int inflight; /* srv_gen objects alive (drained at shutdown) */
};

/* Per-connection request state (MHD's con_cls): the buffered body. */
typedef struct srv_conn {
    srv_buf body;
    size_t body_seen; /* bytes received (counted past the limit too) */
    bool too_large;
    bool started;
    bool refused; /* answered before its body (bad framing or path): ignore the rest */
} srv_conn;

/* One generation in flight; owned by the handler (non-streaming) or by the
 * streaming response (freed by its free callback). */
typedef struct srv_gen {
    server *s;
    srv_route route;
    void *req;                   /* the backend's request handle */
    int tenant;                  /* index into s->ts; -1 once released */
    int fd;                      /* connection socket, for disconnect checks */
    struct MHD_Connection *conn; /* its connection (this thread's) */
    int32_t n_prompt, max_tokens, n_gen;
    int64_t reserved; /* tokens taken from the tenant's bucket */
    char id[48];
    char model[256]; /* name echoed in answers */
    long long created;
    bool logprobs, include_usage;
    int top;
    uint64_t t_submit_ns, t_first_ns;
    bool done; /* the done event was consumed */
    bool gone; /* client left or server stopping (counted once) */
    /* streaming */
    srv_buf out;
    size_t out_off;
    bool head_sent, eof;
    bool has_first;       /* first holds the first event, not yet streamed */
    engine_event first;
    /* non-streaming: accumulated text and logprobs */
    srv_buf text;
    json_t *lp;      /* chat: content array; completions: logprobs object */
    size_t text_off; /* completions text_offset */
} srv_gen;

// ----------------------------------------------------------------------------
// Small helpers

/* Copies s into a buffer as valid UTF-8 (each invalid byte -> U+FFFD) and
 * makes a JSON string of it; token pieces can be lone bytes. */
static json_t *srv__jstr(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    srv_buf b = {0};
    size_t i = 0;
    bool ok = true;
    while (i < n && ok) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool valid = len && i + len <= n;
        for (size_t k = 1; valid && k < len; k++)
            valid = ((unsigned char)s[i + k] >> 6) == 2;
        if (valid && len > 1) {
            json_t *t = json_stringn(s + i, len); // overlong/surrogate check by jansson
            valid = t != NULL;
            json_decref(t);
        }
        if (valid)
            ok = srv_buf_add(&b, s + i, len), i += len;
        else
            ok = srv_buf_add(&b, "\xEF\xBF\xBD", 3), i++;
    }
    j = ok ? json_stringn(b.p ? b.p : "", b.len) : NULL;
    srv_buf_free(&b);
    return j;
}

static bool srv__peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    int n = poll(&p, 1, 0);
    return n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static bool srv__name_ok(const server *s, const char *name) {
    if (!name) return true;
    if (s->o.model_name && !strcmp(name, s->o.model_name)) return true;
    for (int i = 0; i < s->o.n_aliases; i++)
        if (!strcmp(name, s->o.aliases[i])) return true;
    return false;
}

static const char *srv__primary_name(const server *s) {
    if (s->o.n_aliases > 0) return s->o.aliases[0];
    return s->o.model_name ? s->o.model_name : "model";
}

static enum MHD_Result srv__reply(server *s, struct MHD_Connection *c, srv_route route, int status,
                                  const char *body, const char *ctype) {
    const char *fallback = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                           "\"param\":null,\"code\":null}}";
    if (!body) body = fallback, status = 500;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 415)
        MHD_add_response_header(r, "Accept-Encoding", "identity"); // RFC 9110 15.5.16
    if (status == 405) {
        // /admin/kv/check is the one GET among the admin routes
        const char *allow =
            route == SRV_ROUTE_MODELS || route == SRV_ROUTE_HEALTH || route == SRV_ROUTE_METRICS
                ? "GET"
            : route == SRV_ROUTE_ADMIN ? "GET, POST"
                                       : "POST";
        MHD_add_response_header(r, "Allow", allow);
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    srv_metrics_request(&s->met, route, status);
    return ret;
}

static enum MHD_Result srv__reply_json(server *s, struct MHD_Connection *c, srv_route route,
                                       int status, json_t *j) {
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    enum MHD_Result r = srv__reply(s, c, route, status, body, "application/json");
    free(body);
    return r;
}

static enum MHD_Result srv__reply_error(server *s, struct MHD_Connection *c, srv_route route,
                                        const srv_error *err) {
    if (err->reject != SRV_REJECT_NONE) srv_metrics_reject(&s->met, err->reject);
    char *body = srv_error_json(route, err);
    enum MHD_Result r = srv__reply(s, c, route, err->status, body, "application/json");
    free(body);
    return r;
}

/* The bearer token of the request, or NULL. */
static const char *srv__bearer(struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h) return NULL;
    while (*h == ' ')
        h++;
    if (strncasecmp(h, "Bearer ", 7) != 0) return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    return *h ? h : NULL;
}

/* Tenant index for an API request, or -1 with err filled (401). */
static int srv__auth(server *s, struct MHD_Connection *c, srv_error *err) {
    if (s->ts->anonymous) return 0;
    const char *key = srv__bearer(c);
    if (!key) {
        srv_error_set(err, 401, "invalid_request_error", "invalid_api_key", NULL, SRV_REJECT_AUTH,
                      "missing API key: send the header 'Authorization: Bearer <key>'");
        return -1;
    }
    int t = srv_tenants_auth(s->ts, key, strlen(key));
    if (t < 0)
        srv_error_set(err, 401, "invalid_request_error", "invalid_api_key", NULL, SRV_REJECT_AUTH,
                      "invalid API key");
    return t;
}

// ----------------------------------------------------------------------------
// Generation: per-event output

static void srv__gen_release_tenant(srv_gen *g) {
    if (g->tenant < 0) return;
    // never submitted: all of it back; else what was not generated
    int64_t unused = g->req ? (int64_t)g->max_tokens - g->n_gen : g->reserved;
    srv_tenants_release(g->s->ts, g->tenant, unused > 0 ? unused : 0);
    g->tenant = -1;
}

static void srv__gen_free(srv_gen *g) {
    if (!g) return;
    if (g->req) {
        if (!g->done) g->s->b.cancel(g->req);
        g->s->b.release(g->req);
    }
    srv__gen_release_tenant(g);
    srv_buf_free(&g->out);
    srv_buf_free(&g->text);
    json_decref(g->lp);
    atomic_fetch_sub_explicit(&g->s->inflight, 1, memory_order_acq_rel);
    free(g);
}

/* Waits for the next event, checking for a vanished client and shutdown
 * between waits. False when the request was cancelled for either. */
static bool srv__gen_next(srv_gen *g, engine_event *ev) {
    for (;;) {
        if (atomic_load_explicit(&g->s->stopping, memory_order_acquire) || srv__peer_gone(g->fd)) {
            if (!g->gone && !atomic_load_explicit(&g->s->stopping, memory_order_acquire))
                atomic_fetch_add_explicit(&g->s->met.client_disconnects, 1, memory_order_relaxed);
            g->s->b.cancel(g->req);
            g->gone = true;
            return false;
        }
        ks_err e = g->s->b.next(g->req, ev, SRV_WAIT_MS);
        if (e == KS_OK) {
            if (ev->token >= 0 && !g->t_first_ns) g->t_first_ns = ks_now_ns();
            if (ev->token >= 0) g->n_gen++;
            if (ev->done) {
                g->done = true;
                g->n_gen = ev->n_gen;
            }
            return true;
        }
        if (e != KS_ERR_TIMEOUT) {
            g->done = true;
            g->gone = true;
            return false;
        }
    }
}

/* Metrics and tenant refund once the done event arrived; the connection's
 * idle timeout, suspended while generating, applies again (MHD restarts
 * the idle clock when a timeout is set on a connection that had none). */
static void srv__gen_account(srv_gen *g, const engine_event *ev) {
    server *s = g->s;
    if (g->conn)
        MHD_set_connection_option(g->conn, MHD_CONNECTION_OPTION_TIMEOUT, s->o.idle_timeout_s);
    atomic_fetch_add_explicit(&s->met.tokens_in, (unsigned long long)ev->n_prompt,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->met.tokens_out, (unsigned long long)ev->n_gen,
                              memory_order_relaxed);
    if (ev->n_gen > 0 && g->t_first_ns) {
        double ttft =
            ev->ttft_ms > 0 ? ev->ttft_ms * 1e-3 : (double)(g->t_first_ns - g->t_submit_ns) * 1e-9;
        srv_hist_observe(&s->met.ttft, ttft);
        if (ev->n_gen > 1)
            srv_hist_observe(&s->met.tpot,
                             (double)(ks_now_ns() - g->t_first_ns) * 1e-9 / (ev->n_gen - 1));
    }
    srv__gen_release_tenant(g);
    if (s->log_content)
        ks_log(KS_LOG_INFO, "request %s output: %.*s", g->id, (int)g->text.len,
               g->text.p ? g->text.p : "");
    ks_log(KS_LOG_INFO, "request %s: %s, %d prompt tokens (%d cached), %d generated, finish %d%s%s",
           g->id, srv_route_name(g->route), ev->n_prompt, ev->n_cached, ev->n_gen, (int)ev->finish,
           ev->errmsg[0] ? ": " : "", ev->errmsg);
}

/* One logprobs entry for a chat answer: {token, logprob, bytes, top_logprobs}. */
static json_t *srv__lp_entry(const tok_vocab *v, int32_t id, float lp, bool with_top,
                             const sample_result *sr) {
    char piece[256];
    size_t n = tok_piece(v, id, true, piece, sizeof piece);
    if (n > sizeof piece) n = sizeof piece;
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(bytes, json_integer((unsigned char)piece[i]));
    json_t *e = json_pack("{s:o, s:f, s:o}", "token", srv__jstr(piece, n), "logprob",
                          isfinite(lp) ? (double)lp : -9999.0, "bytes", bytes);
    if (e && with_top) {
        json_t *top = json_array();
        for (int k = 0; k < sr->n_top; k++)
            json_array_append_new(top,
                                  srv__lp_entry(v, sr->top_ids[k], sr->top_logprobs[k], false, sr));
        json_object_set_new(e, "top_logprobs", top);
    }
    return e;
}

/* Adds ev's token to a completions logprobs object {tokens, token_logprobs,
 * top_logprobs, text_offset}. */
static void srv__lp_completion(srv_gen *g, json_t *lp, const engine_event *ev) {
    const tok_vocab *v = g->s->vocab;
    char piece[256];
    size_t n = tok_piece(v, ev->token, true, piece, sizeof piece);
    if (n > sizeof piece) n = sizeof piece;
    json_array_append_new(json_object_get(lp, "tokens"), srv__jstr(piece, n));
    json_array_append_new(json_object_get(lp, "token_logprobs"),
                          json_real(isfinite(ev->sr.logprob) ? ev->sr.logprob : -9999.0));
    json_t *top = json_object();
    for (int k = 0; k < ev->sr.n_top; k++) {
        char tp[256];
        size_t tn = tok_piece(v, ev->sr.top_ids[k], true, tp, sizeof tp);
        json_t *key = srv__jstr(tp, tn > sizeof tp ? sizeof tp : tn);
        if (key)
            json_object_set_new(
                top, json_string_value(key),
                json_real(isfinite(ev->sr.top_logprobs[k]) ? ev->sr.top_logprobs[k] : -9999.0));
        json_decref(key);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"),
                          json_integer((json_int_t)g->text_off));
    g->text_off += n;
}

static json_t *srv__lp_completion_new(void) {
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

/* The SSE chunk for ev (text and/or logprobs), NULL when there is nothing. */
static json_t *srv__chunk(srv_gen *g, const engine_event *ev, bool *oom) {
    bool has_lp = g->logprobs && ev->token >= 0;
    if (!ev->text_len && !has_lp) return NULL;
    json_t *text = srv__jstr(ev->text, ev->text_len);
    json_t *j = NULL;
    if (g->route == SRV_ROUTE_WORKERS) {
        j = json_pack("{s:o}", "response", text);
    } else if (g->route == SRV_ROUTE_CHAT) {
        json_t *lp = json_null();
        if (has_lp)
            lp = json_pack("{s:[o]}", "content",
                           srv__lp_entry(g->s->vocab, ev->token, ev->sr.logprob, true, &ev->sr));
        j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:o}, s:o, s:n}]}", "id", g->id, "object",
                      "chat.completion.chunk", "created", (json_int_t)g->created, "model", g->model,
                      "choices", "index", 0, "delta", "content", text, "logprobs", lp,
                      "finish_reason");
    } else {
        json_t *lp = json_null();
        if (has_lp) {
            lp = srv__lp_completion_new();
            srv__lp_completion(g, lp, ev);
        }
        j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:o, s:i, s:o, s:n}]}", "id", g->id, "object",
                      "text_completion", "created", (json_int_t)g->created, "model", g->model,
                      "choices", "text", text, "index", 0, "logprobs", lp, "finish_reason");
    }
    if (!j) *oom = true;
    return j;
}

static void srv__submit_error(server *s, ks_err e, const ks_errbuf *eb, int32_t n_prompt,
                              int32_t max_tokens, srv_route route, srv_error *err);

/* True for a done event whose error the local engine never reports after
 * admission: a rejection that came with the done event (a cluster's prefill
 * REJECT or decode DENY: state REJECTED), or a failure elsewhere (a lost
 * worker: PEER_CLOSED/IO; a first-token timeout: TIMEOUT other than a
 * queue timeout's FINISH_ABORT; PROTO, ...). These get the status their
 * error implies (srv__done_error). The engine's own (CANCELLED, a queue
 * TIMEOUT, INTERNAL, NOMEM) keep their answers: 503 aborted, 500 failed. */
static bool srv__done_mapped(const engine_event *ev) {
    if (ev->state == ENGINE_REJECTED) return true;
    switch (ev->err) {
    case KS_OK:
    case KS_ERR_CANCELLED:
    case KS_ERR_INTERNAL:
    case KS_ERR_NOMEM:
        return false;
    case KS_ERR_TIMEOUT:
        return ev->finish != ENGINE_FINISH_ABORT;
    default:
        return true;
    }
}

/* The answer to a srv__done_mapped event: INVAL, NOSPACE and AGAIN as an
 * engine_submit failure (400 / 400 context_length_exceeded / 503),
 * PEER_CLOSED and IO 502, TIMEOUT 504, anything else 500; the message is
 * the event's. */
static void srv__done_error(const srv_gen *g, const engine_event *ev, srv_error *err) {
    ks_errbuf eb;
    memset(&eb, 0, sizeof eb);
    eb.code = ev->err;
    snprintf(eb.msg, sizeof eb.msg, "%s",
             ev->errmsg[0] ? ev->errmsg
             : ev->err     ? ks_strerror(ev->err)
                           : "the request was rejected");
    switch (ev->err) {
    case KS_ERR_INVAL:
    case KS_ERR_NOSPACE:
    case KS_ERR_AGAIN:
        srv__submit_error(g->s, ev->err, &eb, g->n_prompt, g->max_tokens, g->route, err);
        break;
    case KS_ERR_PEER_CLOSED:
    case KS_ERR_IO:
        srv_error_set(err, 502, "server_error", "upstream_error", NULL, SRV_REJECT_NONE, "%s", eb.msg);
        break;
    case KS_ERR_TIMEOUT:
        srv_error_set(err, 504, "server_error", "upstream_timeout", NULL, SRV_REJECT_NONE, "%s",
                      eb.msg);
        break;
    default:
        srv_error_set(err, 500, "server_error", "internal_error", NULL, SRV_REJECT_NONE, "%s", eb.msg);
    }
}

/* Error details of an aborted/failed request, in the route's shape. */
static void srv__gen_error(const srv_gen *g, const engine_event *ev, srv_error *err) {
    // a drain that ran out aborts with CANCELLED (set_online); other aborts
    // during a drain (a queue timeout, a lost worker) keep their own error
    bool shut = atomic_load_explicit(&g->s->draining, memory_order_acquire) &&
                ev->finish == ENGINE_FINISH_ABORT && ev->err == KS_ERR_CANCELLED;
    if ((g->gone && atomic_load(&g->s->stopping)) || shut)
        srv_error_set(err, 503, "server_error", "server_shutting_down", NULL, SRV_REJECT_NONE,
                      "the server is shutting down; the request was aborted");
    else if (srv__done_mapped(ev))
        srv__done_error(g, ev, err);
    else if (ev->finish == ENGINE_FINISH_ABORT)
        srv_error_set(err, 503, "server_error", "request_aborted", NULL, SRV_REJECT_NONE,
                      "the request was aborted: %s",
                      ev->errmsg[0] ? ev->errmsg : "model taken offline or queue timeout");
    else
        srv_error_set(err, 500, "server_error", "internal_error", NULL, SRV_REJECT_NONE,
                      "the request failed: %s", ev->errmsg[0] ? ev->errmsg : ks_strerror(ev->err));
}

// ----------------------------------------------------------------------------
// Generation: streaming (SSE)

static bool srv__stream_event(srv_gen *g, const engine_event *ev) {
    bool oom = false;
    json_t *chunk = srv__chunk(g, ev, &oom);
    bool ok = !oom && (!chunk || srv_sse_json(&g->out, chunk));
    json_decref(chunk);
    if (ok && g->s->log_content && ev->text_len) ok = srv_buf_add(&g->text, ev->text, ev->text_len);
    if (!ok || !ev->done) return ok;

    const char *fin = srv_finish_name(ev->finish);
    if (!fin) { // aborted or failed after the stream started: an error event, no [DONE]
        srv_error err;
        srv__gen_error(g, ev, &err);
        char *body = srv_error_json(g->route, &err);
        ok = body && srv_buf_add(&g->out, "data: ", 6) &&
             srv_buf_add(&g->out, body, strlen(body)) && srv_buf_add(&g->out, "\n\n", 2);
        free(body);
        return ok;
    }
    json_t *j = NULL;
    if (g->route == SRV_ROUTE_CHAT)
        j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{}, s:n, s:s}]}", "id", g->id, "object",
                      "chat.completion.chunk", "created", (json_int_t)g->created, "model", g->model,
                      "choices", "index", 0, "delta", "logprobs", "finish_reason", fin);
    else if (g->route == SRV_ROUTE_COMPLETIONS)
        j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:s, s:i, s:n, s:s}]}", "id", g->id, "object",
                      "text_completion", "created", (json_int_t)g->created, "model", g->model,
                      "choices", "text", "", "index", 0, "logprobs", "finish_reason", fin);
    else
        j = json_pack("{s:s, s:o}", "response", "", "usage",
                      srv_usage_json(ev->n_prompt, ev->n_gen, ev->n_cached));
    ok = j && srv_sse_json(&g->out, j);
    json_decref(j);
    if (ok && g->include_usage && g->route != SRV_ROUTE_WORKERS) {
        j = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", g->id, "object",
                      g->route == SRV_ROUTE_CHAT ? "chat.completion.chunk" : "text_completion",
                      "created", (json_int_t)g->created, "model", g->model, "choices", "usage",
                      srv_usage_json(ev->n_prompt, ev->n_gen, ev->n_cached));
        ok = j && srv_sse_json(&g->out, j);
        json_decref(j);
    }
    return ok && srv_sse_done(&g->out);
}

static ssize_t srv__stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_gen *g = cls;
    while (g->out_off == g->out.len) {
        g->out.len = g->out_off = 0;
        if (g->eof) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!g->head_sent) {
            g->head_sent = true;
            if (g->route == SRV_ROUTE_CHAT) { // the role comes first, in its own delta
                json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:n, s:n}]}",
                                      "id", g->id, "object", "chat.completion.chunk", "created",
                                      (json_int_t)g->created, "model", g->model, "choices", "index",
                                      0, "delta", "role", "assistant", "content", "", "logprobs",
                                      "finish_reason");
                bool ok = j && srv_sse_json(&g->out, j);
                json_decref(j);
                if (!ok) return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            continue;
        }
        engine_event ev;
        bool got = g->has_first;  // the event srv__generate waited for comes first
        if (got) {
            ev = g->first;
            g->has_first = false;
        } else {
            got = srv__gen_next(g, &ev);
        }
        if (!got) {
            if (!atomic_load_explicit(&g->s->stopping, memory_order_acquire))
                return MHD_CONTENT_READER_END_WITH_ERROR; // the client is gone
            // shutting down: tell the client why the stream ends
            srv_error err;
            srv_error_set(&err, 503, "server_error", "server_shutting_down", NULL, SRV_REJECT_NONE,
                          "the server is shutting down; the request was aborted");
            char *body = srv_error_json(g->route, &err);
            bool ok = body && srv_buf_add(&g->out, "data: ", 6) &&
                      srv_buf_add(&g->out, body, strlen(body)) && srv_buf_add(&g->out, "\n\n", 2);
            free(body);
            g->eof = true;
            if (!ok) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        bool ok = srv__stream_event(g, &ev);
        if (ev.done) {
            g->eof = true;
            srv__gen_account(g, &ev);
        }
        if (!ok) {
            g->s->b.cancel(g->req);
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
    if (!whole && !g->gone && !atomic_load_explicit(&g->s->stopping, memory_order_acquire))
        atomic_fetch_add_explicit(&g->s->met.client_disconnects, 1, memory_order_relaxed);
    srv__gen_free(g);
}

// ----------------------------------------------------------------------------
// Generation: non-streaming

static enum MHD_Result srv__gen_blocking(server *s, struct MHD_Connection *c, srv_gen *g) {
    engine_event ev;
    bool ok = true;
    for (;;) {
        if (!srv__gen_next(g, &ev)) {
            srv_error err;
            // a vanished client gets nothing (MHD notices when it writes): 499 is for metrics
            if (atomic_load(&s->stopping))
                srv_error_set(&err, 503, "server_error", "server_shutting_down", NULL,
                              SRV_REJECT_NONE,
                              "the server is shutting down; the request was aborted");
            else
                srv_error_set(&err, 499, "invalid_request_error", "client_closed", NULL,
                              SRV_REJECT_NONE, "the client closed the connection");
            enum MHD_Result r = srv__reply_error(s, c, g->route, &err);
            srv__gen_free(g);
            return r;
        }
        if (ev.text_len) ok = ok && srv_buf_add(&g->text, ev.text, ev.text_len);
        if (g->logprobs && ev.token >= 0 && g->lp) {
            if (g->route == SRV_ROUTE_CHAT)
                json_array_append_new(
                    g->lp, srv__lp_entry(s->vocab, ev.token, ev.sr.logprob, true, &ev.sr));
            else
                srv__lp_completion(g, g->lp, &ev);
        }
        if (ev.done) break;
    }
    srv__gen_account(g, &ev);
    const char *fin = srv_finish_name(ev.finish);
    if (!fin || !ok) {
        srv_error err;
        if (!ok)
            srv_error_set(&err, 500, "server_error", NULL, NULL, SRV_REJECT_NONE, "out of memory");
        else
            srv__gen_error(g, &ev, &err);
        enum MHD_Result r = srv__reply_error(s, c, g->route, &err);
        srv__gen_free(g);
        return r;
    }
    json_t *text = srv__jstr(g->text.p ? g->text.p : "", g->text.len);
    json_t *usage = srv_usage_json(ev.n_prompt, ev.n_gen, ev.n_cached);
    json_t *j;
    if (g->route == SRV_ROUTE_WORKERS) {
        j = json_pack("{s:{s:o, s:o}, s:b, s:[], s:[]}", "result", "response", text, "usage", usage,
                      "success", 1, "errors", "messages");
    } else if (g->route == SRV_ROUTE_CHAT) {
        json_t *lp = g->logprobs && g->lp ? json_pack("{s:O}", "content", g->lp) : json_null();
        j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:o}, s:o, s:s}], s:o}", "id", g->id,
                      "object", "chat.completion", "created", (json_int_t)g->created, "model",
                      g->model, "choices", "index", 0, "message", "role", "assistant", "content",
                      text, "logprobs", lp, "finish_reason", fin, "usage", usage);
    } else {
        json_t *lp = g->logprobs && g->lp ? json_incref(g->lp) : json_null();
        j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:o, s:i, s:o, s:s}], s:o}", "id", g->id, "object",
                      "text_completion", "created", (json_int_t)g->created, "model", g->model,
                      "choices", "text", text, "index", 0, "logprobs", lp, "finish_reason", fin,
                      "usage", usage);
    }
    srv_route route = g->route;
    srv__gen_free(g);
    return srv__reply_json(s, c, route, 200, j);
}

// ----------------------------------------------------------------------------
// Generation: request -> engine

/* Maps an engine_submit failure to the client's error. */
static void srv__submit_error(server *s, ks_err e, const ks_errbuf *eb, int32_t n_prompt,
                              int32_t max_tokens, srv_route route, srv_error *err) {
    const char *pparam = route == SRV_ROUTE_COMPLETIONS ? "prompt" : "messages";
    switch (e) {
    case KS_ERR_INVAL:
        if ((int64_t)n_prompt + max_tokens > s->o.n_ctx || strstr(eb->msg, "context length"))
            srv_error_set(err, 400, "invalid_request_error", "context_length_exceeded", pparam,
                          SRV_REJECT_CONTEXT_LENGTH, "%s", eb->msg);
        else
            srv_error_set(err, 400, "invalid_request_error", "invalid_parameter", NULL,
                          SRV_REJECT_INVALID, "%s", eb->msg);
        break;
    case KS_ERR_NOSPACE:
        srv_error_set(err, 400, "invalid_request_error", "context_length_exceeded", pparam,
                      SRV_REJECT_POOL, "%s", eb->msg);
        break;
    case KS_ERR_AGAIN:
        if (!s->b.is_online(s->b.impl))
            srv_error_set(err, 503, "server_error", "model_offline", NULL, SRV_REJECT_OFFLINE, "%s",
                          strstr(eb->msg, "offline") ? eb->msg : "the model is offline");
        else
            srv_error_set(err, 503, "server_error", "queue_full", NULL, SRV_REJECT_QUEUE_FULL,
                          "the server is busy: %s", eb->msg);
        break;
    default:
        srv_error_set(err, 500, "server_error", "internal_error", NULL, SRV_REJECT_NONE,
                      "cannot start the request: %s", eb->msg[0] ? eb->msg : ks_strerror(e));
    }
}

/* A request the engine refused as too long (issue 8): the tenant is charged
 * the prompt tokens it was tokenized into instead of getting its whole
 * reservation back, and when tokenizing stopped early (cut) the message
 * gives the lower bound, not the prefix's count as if it were the prompt. */
static void srv__refused_long(server *s, srv_gen *g, srv_error *err, bool cut, int64_t charged) {
    if (err->reject != SRV_REJECT_CONTEXT_LENGTH && err->reject != SRV_REJECT_POOL) return;
    if (g->tenant >= 0) srv_tenants_refuse(s->ts, g->tenant, g->reserved, charged);
    g->tenant = -1;
    if (cut && err->reject == SRV_REJECT_CONTEXT_LENGTH)
        snprintf(err->msg, sizeof err->msg,
                 "This model's maximum context length is %d tokens. However, you requested at "
                 "least %lld tokens (at least %d in the prompt, %d for the completion). Please "
                 "reduce the length of the prompt or completion.",
                 s->o.n_ctx, (long long)g->n_prompt + g->max_tokens, g->n_prompt, g->max_tokens);
}

static enum MHD_Result srv__generate(server *s, struct MHD_Connection *c, srv_route route,
                                     const char *url_model, const srv_conn *sc) {
    srv_error err;
    int tenant = srv__auth(s, c, &err);
    if (tenant < 0) return srv__reply_error(s, c, route, &err);
    if (atomic_load_explicit(&s->draining, memory_order_acquire)) {
        srv_error_set(&err, 503, "server_error", "server_shutting_down", NULL, SRV_REJECT_SHUTDOWN,
                      "the server is shutting down and takes no new requests; retry on another "
                      "instance");
        return srv__reply_error(s, c, route, &err);
    }
    srv_request rq;
    if (!srv_request_parse(route, sc->body.p ? sc->body.p : "", sc->body.len, &rq, &err))
        return srv__reply_error(s, c, route, &err);
    const char *model_name = url_model ? url_model : rq.model;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    srv_gen *g = NULL;
    enum MHD_Result ret;
    int held = -1;             // tenant admitted here, until g takes it over
    int64_t held_reserved = 0; // tokens it took from the tenant's bucket
    int64_t held_charge = 0;   // tokens to charge if refused as too long
    if (!srv__name_ok(s, model_name)) {
        srv_error_set(&err, 404, "invalid_request_error", "model_not_found", "model",
                      SRV_REJECT_INVALID, "The model '%s' does not exist; this server serves '%s'",
                      model_name, srv__primary_name(s));
        goto fail;
    }
    ks_errbuf eb = {0};
    bool chat = rq.msgs != NULL;
    if (chat) {
        ks_err e = chat_render(s->vocab, model_gguf(s->m), rq.msgs, rq.n_msgs, true, &text, &eb);
        if (e) {
            srv_error_set(&err, e == KS_ERR_NOMEM ? 500 : 400, "invalid_request_error",
                          "invalid_parameter", "messages", SRV_REJECT_INVALID, "%s", eb.msg);
            goto fail;
        }
    }
    const char *ptext = chat ? text : rq.prompt;
    size_t ptext_len = strlen(ptext);
    int32_t max_tokens = rq.max_tokens;
    if (max_tokens < 0 && route == SRV_ROUTE_COMPLETIONS) max_tokens = 16; // OpenAI's default
    if (max_tokens < 0 && route == SRV_ROUTE_WORKERS) max_tokens = 256;    // Workers AI's
    // Issue 8: the prompt's bytes give a lower bound on its tokens; a prompt
    // that cannot fit even so is refused before any tokenizing, with the
    // engine's 400, whatever the tenant's budget (it cost a parse, as a
    // malformed body does, and is not charged). So no request tokenizes more
    // than about n_ctx * max_token_bytes bytes.
    if (!srv_prompt_fits(s->o.n_ctx, ptext_len, s->max_token_bytes, max_tokens, route, &err))
        goto fail;
    // The tenant's limits apply before the expensive work (tokenizing): on a
    // lower bound of the tokens (chat without max_tokens reserves the whole
    // context), raised to the exact count once tokenized.
    int64_t min_prompt = srv_prompt_min_tokens(ptext_len, s->max_token_bytes);
    held_reserved = max_tokens < 0 ? s->o.n_ctx : (min_prompt > 0 ? min_prompt : 1) + max_tokens;
    char msg[256];
    srv_reject rj = srv_tenants_admit(s->ts, tenant, held_reserved, ks_now_ns(), msg, sizeof msg);
    if (rj != SRV_REJECT_NONE) {
        srv_error_set(&err, 429, "rate_limit_error", "rate_limit_exceeded", NULL, rj, "%s", msg);
        goto fail;
    }
    held = tenant;
    // chat templates carry special tokens as text; a raw prompt's text is never
    // turned into control tokens (a user cannot forge turn markers). Stops past
    // n_ctx tokens: more than that is refused however many there are.
    if (tok_encode_max(s->vocab, ptext, ptext_len, true, chat, (size_t)s->o.n_ctx, &ids, &n_ids,
                       &eb)) {
        srv_error_set(&err, 500, "server_error", NULL, NULL, SRV_REJECT_NONE, "tokenizer: %s",
                      eb.msg);
        goto fail;
    }
    bool cut = n_ids > (size_t)s->o.n_ctx; // only a prefix: the prompt has at least n_ids
    int32_t n_prompt = n_ids > INT32_MAX ? INT32_MAX : (int32_t)n_ids;
    held_charge = n_prompt; // the work done, charged if refused as too long
    if (max_tokens < 0) {
        max_tokens = s->o.n_ctx - n_prompt; // chat: up to the context
        if (max_tokens < 1) max_tokens = 1;
    }
    // A request that cannot fit still goes to the engine's admission for its
    // exact refusal (I4 lives there, one contract for every front end).
    bool over = (int64_t)n_prompt + max_tokens > s->o.n_ctx;
    if (!over) {
        rj = srv_tenants_grow(s->ts, tenant, held_reserved, (int64_t)n_prompt + max_tokens,
                              ks_now_ns(), msg, sizeof msg);
        if (rj != SRV_REJECT_NONE) {
            srv_error_set(&err, 429, "rate_limit_error", "rate_limit_exceeded", NULL, rj, "%s",
                          msg);
            goto fail;
        }
        held_reserved = (int64_t)n_prompt + max_tokens;
    }
    if (s->log_content) ks_log(KS_LOG_INFO, "prompt (%d tokens): %s", n_prompt, ptext);

    if (!(g = calloc(1, sizeof *g))) {
        srv_error_set(&err, 500, "server_error", NULL, NULL, SRV_REJECT_NONE, "out of memory");
        goto fail;
    }
    g->s = s;
    atomic_fetch_add_explicit(&s->inflight, 1, memory_order_acq_rel);
    g->route = route;
    g->n_prompt = n_prompt;
    g->max_tokens = max_tokens;
    g->reserved = held_reserved;
    g->tenant = held; // g releases the tenant from here on
    held = -1;
    g->created = (long long)time(NULL);
    g->logprobs = rq.logprobs;
    g->top = rq.top_logprobs;
    g->include_usage = rq.include_usage;
    g->fd = -1;
    snprintf(g->model, sizeof g->model, "%s", model_name ? model_name : srv__primary_name(s));
    srv_make_id(route == SRV_ROUTE_COMPLETIONS ? "cmpl-" : "chatcmpl-", g->id, sizeof g->id);
    if (rq.logprobs)
        g->lp = route == SRV_ROUTE_COMPLETIONS ? srv__lp_completion_new() : json_array();
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
    g->t_submit_ns = ks_now_ns();
    ks_err e = s->b.submit(s->b.impl, &p, &g->req, &eb);
    if (e) {
        g->req = NULL;
        srv__submit_error(s, e, &eb, n_prompt, max_tokens, route, &err);
        srv__refused_long(s, g, &err, cut, held_charge);
        goto fail;
    }
    free(ids);
    free(text);
    ids = NULL;
    text = NULL;
    bool stream = rq.stream;
    srv_request_free(&rq);
    // a generation may take longer than MHD's idle timeout
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (!stream) return srv__gen_blocking(s, c, g);

    // The status line waits for the first event: a request refused or lost
    // before any output is answered like a non-streamed one (its status, the
    // error JSON). Any other first event is kept for the stream, which then
    // reads exactly as if it had been pulled there; if the client left or the
    // server is stopping, the stream's next pull sees that again.
    if (srv__gen_next(g, &g->first)) {
        if (g->first.done && !srv_finish_name(g->first.finish) && srv__done_mapped(&g->first)) {
            srv__gen_account(g, &g->first);
            srv__done_error(g, &g->first, &err);
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
    srv__stream_socket(s, g);
    ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r); // g is freed with the response
    srv_metrics_request(&s->met, route, 200);
    return ret;
fail:
    if (held >= 0)
        srv_tenants_refuse(s->ts, held, held_reserved,
                           err.reject == SRV_REJECT_CONTEXT_LENGTH ? held_charge : 0);
    srv__gen_free(g);
    free(ids);
    free(text);
    srv_request_free(&rq);
    return srv__reply_error(s, c, route, &err);
}

// ----------------------------------------------------------------------------
// Other routes

static enum MHD_Result srv__models(server *s, struct MHD_Connection *c) {
    srv_error err;
    if (srv__auth(s, c, &err) < 0) return srv__reply_error(s, c, SRV_ROUTE_MODELS, &err);
    json_t *data = json_array();
    long long t = (long long)time(NULL);
    for (int i = 0; i < s->o.n_aliases; i++)
        json_array_append_new(data,
                              json_pack("{s:s, s:s, s:I, s:s}", "id", s->o.aliases[i], "object",
                                        "model", "created", (json_int_t)t, "owned_by", "kvseal"));
    bool listed = false;
    for (int i = 0; i < s->o.n_aliases; i++)
        if (s->o.model_name && !strcmp(s->o.aliases[i], s->o.model_name)) listed = true;
    if (s->o.model_name && !listed)
        json_array_append_new(data,
                              json_pack("{s:s, s:s, s:I, s:s}", "id", s->o.model_name, "object",
                                        "model", "created", (json_int_t)t, "owned_by", "kvseal"));
    return srv__reply_json(s, c, SRV_ROUTE_MODELS, 200,
                           json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static enum MHD_Result srv__health(server *s, struct MHD_Connection *c) {
    bool online = s->b.is_online(s->b.impl);
    bool draining = atomic_load_explicit(&s->draining, memory_order_acquire);
    json_t *j = json_pack("{s:s, s:s, s:s, s:b, s:i}", "status",
                          draining ? "draining" : online ? "ok" : "offline", "model",
                          srv__primary_name(s), "kernels", kern_get()->name, "online", online,
                          "n_ctx", (int)s->o.n_ctx);
    return srv__reply_json(s, c, SRV_ROUTE_HEALTH, draining ? 503 : 200, j);
}

static enum MHD_Result srv__metrics(server *s, struct MHD_Connection *c) {
    engine_stats es;
    s->b.get_stats(s->b.impl, &es);
    char *text = srv_metrics_render(&s->met, &es, s->b.is_online(s->b.impl));
    // count this scrape before rendering the next one; the text shows earlier ones
    enum MHD_Result r =
        srv__reply(s, c, SRV_ROUTE_METRICS, 200, text, "text/plain; version=0.0.4; charset=utf-8");
    free(text);
    return r;
}

static bool srv__truthy(const char *v) {
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"));
}

/* GET /admin/kv/check[?timeout_ms=N]: waits for the engine to go idle, then
 * verifies every KV page is FREE and scrubbed (the leak suite's last step).
 * 200 {"clean": true|false, "message"}; 409 when requests stayed active. */
static enum MHD_Result srv__kv_check(server *s, struct MHD_Connection *c) {
    const char *t = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "timeout_ms");
    unsigned long timeout = 5000;
    if (t) {
        char *end;
        timeout = strtoul(t, &end, 10);
        if (*end || !*t || timeout > 600000) {
            srv_error err;
            srv_error_set(&err, 400, "invalid_request_error", "invalid_parameter", "timeout_ms",
                          SRV_REJECT_INVALID, "timeout_ms must be an integer in [0, 600000]");
            return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
        }
    }
    ks_errbuf eb = {0};
    ks_err e = s->b.check_quiescent(s->b.impl, (uint32_t)timeout, &eb);
    return srv__reply_json(s, c, SRV_ROUTE_ADMIN, e == KS_ERR_TIMEOUT ? 409 : 200,
                           json_pack("{s:b, s:s}", "clean", e == KS_OK, "message",
                                     eb.msg[0] ? eb.msg : (e == KS_OK ? "clean" : ks_strerror(e))));
}

/* POST /admin/models/{name}/offline|online, body or ?abort_running=; GET
 * /admin/kv/check (rest NULL). */
static enum MHD_Result srv__admin(server *s, struct MHD_Connection *c, const char *rest,
                                  const srv_conn *sc) {
    srv_error err;
    const char *key = srv__bearer(c);
    if (!s->ts->has_admin) {
        srv_error_set(&err, 403, "permission_error", "admin_disabled", NULL, SRV_REJECT_AUTH,
                      "the admin API is disabled: start the server with --admin-key or an "
                      "admin_key in the tenants file");
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    if (!key || !srv_tenants_admin_ok(s->ts, key, strlen(key))) {
        srv_error_set(&err, 401, "invalid_request_error", "invalid_api_key", NULL, SRV_REJECT_AUTH,
                      key ? "invalid admin key"
                          : "missing admin key: send 'Authorization: Bearer <admin key>'");
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    if (!rest) return srv__kv_check(s, c);
    const char *slash = strrchr(rest, '/');
    char name[256];
    if (!slash || slash == rest || (size_t)(slash - rest) >= sizeof name) goto notfound;
    snprintf(name, sizeof name, "%.*s", (int)(slash - rest), rest);
    bool online;
    if (!strcmp(slash + 1, "offline"))
        online = false;
    else if (!strcmp(slash + 1, "online"))
        online = true;
    else
        goto notfound;
    if (!srv__name_ok(s, name)) {
        srv_error_set(&err, 404, "invalid_request_error", "model_not_found", NULL, SRV_REJECT_NONE,
                      "The model '%s' does not exist", name);
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
            srv_error_set(&err, 400, "invalid_request_error", "invalid_parameter", "abort_running",
                          SRV_REJECT_INVALID, "body must be {\"abort_running\": true|false}");
            return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
        }
        if (v) abort_running = json_is_true(v);
        json_decref(j);
    }
    s->b.set_online(s->b.impl, online, abort_running);
    ks_log(KS_LOG_WARN, "admin: model %s set %s%s", name, online ? "online" : "offline",
           !online && abort_running ? " (running requests aborted)" : "");
    return srv__reply_json(s, c, SRV_ROUTE_ADMIN, 200,
                           json_pack("{s:s, s:b, s:b}", "model", name, "online", online,
                                     "abort_running", abort_running));
notfound:
    srv_error_set(&err, 404, "invalid_request_error", "unknown_url", NULL, SRV_REJECT_NONE,
                  "Invalid URL: use /admin/models/{name}/offline or /online");
    return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
}

// ----------------------------------------------------------------------------
// Dispatch

static enum MHD_Result srv__dispatch(server *s, struct MHD_Connection *c, const char *url,
                                     const char *method, const srv_conn *sc) {
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    srv_route route = SRV_ROUTE_OTHER;
    const char *url_model = NULL, *admin_rest = NULL;
    bool admin_kv = false;
    char wmodel[256];
    if (!strcmp(url, "/v1/chat/completions"))
        route = SRV_ROUTE_CHAT;
    else if (!strcmp(url, "/v1/completions"))
        route = SRV_ROUTE_COMPLETIONS;
    else if (!strcmp(url, "/v1/models"))
        route = SRV_ROUTE_MODELS;
    else if (!strcmp(url, "/health"))
        route = SRV_ROUTE_HEALTH;
    else if (!strcmp(url, "/metrics"))
        route = SRV_ROUTE_METRICS;
    else if (!strncmp(url, "/admin/models/", 14))
        route = SRV_ROUTE_ADMIN, admin_rest = url + 14;
    else if (!strcmp(url, "/admin/kv/check"))
        route = SRV_ROUTE_ADMIN, admin_kv = true;
    else if (!strncmp(url, "/accounts/", 10)) {
        const char *p = strstr(url + 10, "/ai/run/");
        if (p && p > url + 10 && !memchr(url + 10, '/', (size_t)(p - url - 10)) && p[8] &&
            strlen(p + 8) < sizeof wmodel) {
            route = SRV_ROUTE_WORKERS;
            snprintf(wmodel, sizeof wmodel, "%s", p + 8);
            url_model = wmodel;
        }
    }
    srv_error err;
    if (route == SRV_ROUTE_OTHER) {
        srv_error_set(&err, 404, "invalid_request_error", "unknown_url", NULL, SRV_REJECT_NONE,
                      "Invalid URL (%s %s)", method, url);
        return srv__reply_error(s, c, route, &err);
    }
    bool want_get = route == SRV_ROUTE_MODELS || route == SRV_ROUTE_HEALTH ||
                    route == SRV_ROUTE_METRICS || admin_kv;
    if (want_get ? !get : !post) {
        srv_error_set(&err, 405, "invalid_request_error", "method_not_allowed", NULL,
                      SRV_REJECT_NONE, "Method %s is not allowed on %s; use %s", method, url,
                      want_get ? "GET" : "POST");
        return srv__reply_error(s, c, route, &err);
    }
    if (sc->too_large) {
        srv_error_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                      SRV_REJECT_INVALID,
                      "request body of %zu bytes exceeds the limit of %zu bytes", sc->body_seen,
                      s->o.max_body_bytes);
        return srv__reply_error(s, c, route, &err);
    }
    switch (route) {
    case SRV_ROUTE_CHAT:
    case SRV_ROUTE_COMPLETIONS:
    case SRV_ROUTE_WORKERS:
        return srv__generate(s, c, route, url_model, sc);
    case SRV_ROUTE_MODELS:
        return srv__models(s, c);
    case SRV_ROUTE_HEALTH:
        return srv__health(s, c);
    case SRV_ROUTE_METRICS:
        return srv__metrics(s, c);
    case SRV_ROUTE_ADMIN:
        return srv__admin(s, c, admin_kv ? NULL : admin_rest, sc);
    default:
        return MHD_NO;
    }
}

/* The route an error answer's shape follows, before dispatch. */
static srv_route srv__route_of(const char *url) {
    return !strcmp(url, "/v1/chat/completions") ? SRV_ROUTE_CHAT
           : !strcmp(url, "/v1/completions")    ? SRV_ROUTE_COMPLETIONS
           : !strncmp(url, "/accounts/", 10)    ? SRV_ROUTE_WORKERS
                                                : SRV_ROUTE_OTHER;
}

/* MHD decodes the path before srv__access sees it, so %2F and %00 are
 * looked for in the raw target here; what this returns becomes the
 * request's first *con_cls: NULL, or this mark for a bad path. Static, so
 * nothing leaks if the request dies before srv__access runs. */
static char srv__bad_path;
static void *srv__uri_log(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)cls, (void)c;
    srv_error err;
    return uri && !srv_path_check(uri, &err) ? &srv__bad_path : NULL;
}

/* MHD header iterator: every request header into a srv_framing (cls). */
static enum MHD_Result srv__framing_it(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value) {
    (void)kind;
    srv_framing_add(cls, key, value);
    return MHD_YES;
}

static enum MHD_Result srv__access(void *cls, struct MHD_Connection *c, const char *url,
                                   const char *method, const char *version, const char *upload,
                                   size_t *upload_size, void **con_cls) {
    (void)version;
    server *s = cls;
    srv_conn *sc = *con_cls;
    if (!sc || sc == (void *)&srv__bad_path) {
        bool bad_path = sc != NULL;
        if (!(sc = calloc(1, sizeof *sc))) return MHD_NO;
        *con_cls = sc;
        // framing and path first (RFC 9112): refused before any body byte
        // is read, and MHD closes the connection, so nothing is smuggled
        srv_error err;
        srv_framing f = {0};
        MHD_get_connection_values(c, MHD_HEADER_KIND, srv__framing_it, &f);
        if (bad_path)
            srv_error_set(&err, 400, "invalid_request_error", "invalid_path", NULL,
                          SRV_REJECT_INVALID,
                          "the path may not contain an encoded slash (%%2F) or NUL (%%00)");
        if (bad_path || !srv_framing_check(&f, &err)) {
            sc->refused = true;
            return srv__reply_error(s, c, srv__route_of(url), &err);
        }
        // refuse an announced oversized body before reading any of it
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (*end == '\0' && n > s->o.max_body_bytes) {
                sc->too_large = true;
                sc->body_seen = (size_t)n;
                srv_error_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                              SRV_REJECT_INVALID,
                              "request body of %llu bytes exceeds the limit of %zu bytes", n,
                              s->o.max_body_bytes);
                return srv__reply_error(s, c, srv__route_of(url), &err);
            }
        }
        return MHD_YES;
    }
    if (sc->refused) { // already answered: drop whatever MHD still hands over
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        // past the limit (chunked bodies): keep counting, stop buffering
        sc->body_seen += *upload_size;
        if (!sc->too_large && sc->body.len + *upload_size > s->o.max_body_bytes) {
            sc->too_large = true;
            srv_buf_free(&sc->body);
        }
        if (!sc->too_large && !srv_buf_add(&sc->body, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (sc->started) return MHD_YES;
    sc->started = true;
    return srv__dispatch(s, c, url, method, sc);
}

static void srv__completed(void *cls, struct MHD_Connection *c, void **con_cls,
                           enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    srv_conn *sc = *con_cls;
    *con_cls = NULL;
    // a request that ended before srv__access ran still has srv__uri_log's mark
    if (!sc || sc == (void *)&srv__bad_path) return;
    srv_buf_free(&sc->body);
    free(sc);
}

static void srv__mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && buf[n - 1] == '\n')
        buf[--n] = '\0';
    ks_log(KS_LOG_WARN, "http: %s", buf);
}

// ----------------------------------------------------------------------------
// Lifecycle

void server_opts_default(server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_body_bytes = 1u << 20;
    o->max_connections = 256;
    o->idle_timeout_s = 120;
}

// The local engine as a backend: engine.h's calls, with void * handles.
static ks_err srv__eng_submit(void *impl, const engine_params *p, void **req, ks_errbuf *eb) {
    engine_req *r = NULL;
    ks_err e = engine_submit(impl, p, &r, eb);
    *req = r;
    return e;
}
static ks_err srv__eng_next(void *req, engine_event *ev, uint32_t timeout_ms) {
    return engine_req_next(req, ev, timeout_ms);
}
static void srv__eng_cancel(void *req) { engine_req_cancel(req); }
static void srv__eng_release(void *req) { engine_req_release(req); }
static bool srv__eng_is_online(void *impl) { return engine_is_online(impl); }
static void srv__eng_set_online(void *impl, bool online, bool abort_running) {
    engine_set_online(impl, online, abort_running);
}
static void srv__eng_get_stats(void *impl, engine_stats *out) { engine_get_stats(impl, out); }
static ks_err srv__eng_check(void *impl, uint32_t timeout_ms, ks_errbuf *eb) {
    return engine_check_quiescent(impl, timeout_ms, eb);
}

void server_engine_backend(engine *e, server_backend *out) {
    *out = (server_backend){.impl = e,
                            .submit = srv__eng_submit,
                            .next = srv__eng_next,
                            .cancel = srv__eng_cancel,
                            .release = srv__eng_release,
                            .is_online = srv__eng_is_online,
                            .set_online = srv__eng_set_online,
                            .get_stats = srv__eng_get_stats,
                            .check_quiescent = srv__eng_check};
}

ks_err server_create(const server_opts *o, engine *e, const model *m, server **out, ks_errbuf *eb) {
    *out = NULL;
    if (!e) return ks_seterr(eb, KS_ERR_INVAL, "server: no engine");
    server_backend b;
    server_engine_backend(e, &b);
    return server_create_backend(o, &b, m, out, eb);
}

ks_err server_create_backend(const server_opts *o, const server_backend *b, const model *m,
                             server **out, ks_errbuf *eb) {
    *out = NULL;
    if (!o->host || o->port < 0 || o->port > 65535 || o->n_ctx <= 0 || !m)
        return ks_seterr(eb, KS_ERR_INVAL, "server: bad options (host, port 0-65535, n_ctx > 0)");
    if (!b || !b->submit || !b->next || !b->cancel || !b->release || !b->is_online ||
        !b->set_online || !b->get_stats || !b->check_quiescent)
        return ks_seterr(eb, KS_ERR_INVAL, "server: incomplete backend");
    if (sodium_init() < 0) return ks_seterr(eb, KS_ERR_INTERNAL, "server: libsodium init failed");
    server *s = calloc(1, sizeof *s);
    if (!s) return ks_seterr(eb, KS_ERR_NOMEM, "server: out of memory");
    ks_err err = KS_OK;
    s->o = *o;
    s->b = *b;
    s->m = m;
    s->vocab = model_vocab(m);
    s->max_token_bytes = tok_max_token_bytes(s->vocab);
    srv_metrics_init(&s->met);
    if (o->tenants_path) {
        size_t len = 0;
        char *text = NULL;
        FILE *f = fopen(o->tenants_path, "rb");
        if (f) {
            srv_buf fb = {0};
            char chunk[4096];
            size_t n;
            bool ok = true;
            while (ok && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
                ok = srv_buf_add(&fb, chunk, n);
            if (ferror(f) || !ok) srv_buf_free(&fb);
            fclose(f);
            text = fb.p ? fb.p : (ok ? strdup("") : NULL);
            len = fb.len;
        }
        if (!text) {
            err = ks_seterr(eb, KS_ERR_IO, "tenants file %s: %s", o->tenants_path, strerror(errno));
            goto fail;
        }
        err = srv_tenants_parse(text, len, &s->ts, eb);
        free(text);
        if (err) {
            char tmp[KS_ERRMSG_CAP];
            snprintf(tmp, sizeof tmp, "%s", eb ? eb->msg : "");
            ks_seterr(eb, err, "%s: %s", o->tenants_path, tmp);
            goto fail;
        }
    } else if (!(s->ts = srv_tenants_anonymous())) {
        err = ks_seterr(eb, KS_ERR_NOMEM, "server: out of memory");
        goto fail;
    }
    if (o->admin_key) srv_tenants_set_admin(s->ts, o->admin_key);
    s->log_content = o->log_content || s->ts->log_content;

    // resolve the listen address (numeric or a name such as localhost)
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai != 0 || !ai) {
        err = ks_seterr(eb, KS_ERR_INVAL, "cannot resolve listen address '%s': %s", o->host,
                        gai_strerror(gai));
        goto fail;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, srv__access, s,
                            MHD_OPTION_EXTERNAL_LOGGER, srv__mhd_log, s, MHD_OPTION_SOCK_ADDR,
                            ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, srv__completed, s,
                            MHD_OPTION_URI_LOG_CALLBACK, srv__uri_log, s,
                            MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)(o->max_connections ? o->max_connections : 256),
                            MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s, MHD_OPTION_END);
    int bind_errno = errno;
    freeaddrinfo(ai);
    if (!s->d) {
        err = ks_seterr(eb, KS_ERR_IO, "cannot listen on %s:%d: %s", o->host, o->port,
                        strerror(bind_errno));
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    if (s->ts->anonymous)
        ks_log(KS_LOG_WARN, "no --tenants file: every client is the anonymous tenant 'default' "
                            "and NO API key is required");
    if (s->log_content) ks_log(KS_LOG_WARN, "prompt and output logging is ON (log_content)");
    *out = s;
    return KS_OK;
fail:
    srv_tenants_free(s->ts);
    free(s);
    return err;
}

int server_port(const server *s) { return s->port; }

void server_stop_accepting(server *s) {
    if (!s || !s->d) return;
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void server_drain(server *s) {
    if (s) atomic_store_explicit(&s->draining, true, memory_order_release);
}

int server_inflight(const server *s) {
    return s ? atomic_load_explicit(&s->inflight, memory_order_acquire) : 0;
}

void server_destroy(server *s) {
    if (!s) return;
    atomic_store_explicit(&s->stopping, true, memory_order_release);
    // let waiting handlers cancel their requests and write their last words
    // (503 / an SSE error event) for up to a second; then close everything
    for (int i = 0; i < 100 && atomic_load_explicit(&s->inflight, memory_order_acquire) > 0; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    srv_tenants_free(s->ts);
    free(s);
}
