/* http.c — the HTTP server's daemon: libmicrohttpd's callbacks (access,
 * completed, connection notify), routing, the sweeper and the server's
 * life. The handlers live in the rooms http_int.h lists (conn.c, pending.c,
 * answer.c, stream.c, generate.c, routes.c, backend.c). A request is
 * routed by one table, srv__routes (method, path or prefix, route, auth,
 * handler): adding a route is a row there and a handler (srv_handler).
 *
 * The engine is reached only through a server_backend (server.h): the local
 * engine for `kvseal serve`, the cluster for `kvseal router`; "the engine"
 * below means whichever it is.
 *
 * Threading: event-driven. MHD runs a small pool of epoll threads
 * (SRV_HTTP_THREADS); no handler ever blocks one, so thousands of idle or
 * slow connections cost a few KiB each and /health answers whatever they
 * do. A generation waits with its connection SUSPENDED: the request's event
 * stream calls srv__gen_notify on every event it posts (under the stream's
 * lock), which resumes the connection; MHD then calls the access handler
 * (non-streamed answers, and a stream's first event) or the content reader
 * (a stream's later events) again, which take what is there without
 * waiting and suspend again when nothing is. g->mu orders the suspend
 * against the notify, so a wakeup is never lost. No model code runs here: a
 * handler only parses, tokenizes, calls the backend's submit and copies
 * events. A streamed answer's status line waits for the request's first
 * event, so a request refused or lost before any output (a cluster's
 * REJECT, a lost worker) is answered with its own status and error JSON,
 * not 200 + SSE.
 *
 * The sweeper thread (every SRV_SWEEP_MS) does what MHD does not:
 * - a suspended connection is not polled by MHD, so it polls each one's
 *   socket: a reset or hang-up (POLLHUP/POLLERR) cancels the request at
 *   once (its KV pages are freed within a scheduler step, queued or
 *   running). A FIN alone (POLLRDHUP) is a half-close, which HTTP allows
 *   after a complete request: before any answer, the sweeper sends one
 *   interim "102 Processing" (HTTP/1.1 clients must accept 1xx), which a
 *   live client ignores and a vanished one answers with a reset that the
 *   next sweep sees; after the status line, the next write tells;
 * - every connection must deliver a complete request head and body within
 *   request_timeout_s of its start (or of its previous answer), however
 *   slowly the bytes trickle in: past it, 408 and close (silently when it
 *   sent nothing, e.g. an idle keep-alive);
 * - when stopping, it cancels every generation, whose answers then end
 *   with server_shutting_down.
 * A streamed answer's socket keeps at most SRV_STREAM_UNSENT bytes the
 * client has not taken; past that MHD stops pulling events and the engine
 * pauses the request (engine_stream_backlogged) instead of buffering.
 * Blocking admin work (the KV check) runs on a thread of its own while its
 * connection is suspended.
 *
 * Shutdown: server_destroy flags `stopping`, waits (up to a second) for the
 * generations to end their answers, stops the sweeper, then
 * MHD_stop_daemon closes what is left.
 *
 * Every answer passes srv__decorate (srv__reply, a stream's start): its
 * x-request-id, CORS headers when --cors-origin allows the request's
 * Origin, the tenant's x-ratelimit-* and a Retry-After on 429/503 computed
 * from the tenant's buckets or the queue. What they need is the request's
 * srv_reqinfo, kept in the connection's srv_sock (one request at a time per
 * connection), so every handler gets them without passing anything. */
#include "http_int.h"

#include "kvseal/chat.h"
#include "kvseal/kern.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define SRV_SWEEP_MS 50  /* sweeper period: disconnects, deadlines, shutdown */
#define SRV_HTTP_THREADS 4 /* MHD's epoll threads */

// ----------------------------------------------------------------------------
// Dispatch

/* How a row's path is compared with the request's. */
typedef enum srv_match {
    SRV_MATCH_EXACT = 0,  /* the whole path */
    SRV_MATCH_PREFIX = 1, /* a prefix with something after it (srv_call.rest) */
    SRV_MATCH_UNDER = 2,  /* a prefix, maybe nothing after it */
    /* Workers AI: path is what follows /accounts/{account}/ai/ (or the same
       under Cloudflare's REST prefix /client/v4) */
    SRV_MATCH_ACCOUNT = 3,        /* ... exactly */
    SRV_MATCH_ACCOUNT_PREFIX = 4, /* ... as a prefix, the rest (a model name) non-empty and
                                     shorter than SRV_URL_MODEL_MAX */
} srv_match;

#define SRV_URL_MODEL_MAX 256 /* a model name in the URL, NUL included */

/* One route: a request whose method and path match is checked for its
 * auth and handed to fn. The route gives the metrics label and, through
 * dialect.c, the error envelope of every answer before and in fn. */
typedef struct srv_route_def {
    const char *method; /* "GET" (HEAD too), "POST" or "DELETE" */
    srv_match match;
    const char *path;
    srv_route route;
    srv_auth auth;
    srv_handler *fn;
} srv_route_def;

/* The route table. Adding a route is one row here and one handler
 * (http_int.h's srv_handler); a new metrics label or dialect is a
 * srv_route value and its row in dialect.c. First match wins. */
static const srv_route_def srv__routes[] = {
    /* OpenAI */
    {"POST", SRV_MATCH_EXACT, "/v1/chat/completions", SRV_ROUTE_CHAT, SRV_AUTH_TENANT,
     srv__generate},
    {"POST", SRV_MATCH_EXACT, "/v1/completions", SRV_ROUTE_COMPLETIONS, SRV_AUTH_TENANT,
     srv__generate},
    {"GET", SRV_MATCH_EXACT, "/v1/models", SRV_ROUTE_MODELS, SRV_AUTH_TENANT, srv__models},
    {"GET", SRV_MATCH_PREFIX, "/v1/models/", SRV_ROUTE_MODELS, SRV_AUTH_TENANT, srv__model_get},
    {"POST", SRV_MATCH_EXACT, "/v1/embeddings", SRV_ROUTE_EMBEDDINGS, SRV_AUTH_TENANT,
     srv__embeddings},
    /* llama.cpp server's */
    {"POST", SRV_MATCH_EXACT, "/tokenize", SRV_ROUTE_TOKENIZE, SRV_AUTH_TENANT, srv__tokenize},
    {"POST", SRV_MATCH_EXACT, "/detokenize", SRV_ROUTE_TOKENIZE, SRV_AUTH_TENANT,
     srv__detokenize},
    /* operations */
    {"GET", SRV_MATCH_EXACT, "/health", SRV_ROUTE_HEALTH, SRV_AUTH_NONE, srv__health},
    {"GET", SRV_MATCH_EXACT, "/metrics", SRV_ROUTE_METRICS, SRV_AUTH_METRICS, srv__metrics},
    {"POST", SRV_MATCH_UNDER, "/admin/models/", SRV_ROUTE_ADMIN, SRV_AUTH_ADMIN,
     srv__admin_model},
    {"GET", SRV_MATCH_EXACT, "/admin/kv/check", SRV_ROUTE_ADMIN, SRV_AUTH_ADMIN, srv__kv_check},
    {"POST", SRV_MATCH_EXACT, "/v1/responses", SRV_ROUTE_RESPONSES, SRV_AUTH_TENANT,
     srv__generate},
    {"GET", SRV_MATCH_PREFIX, "/v1/responses/", SRV_ROUTE_RESPONSES, SRV_AUTH_TENANT,
     srv__response_get},
    {"DELETE", SRV_MATCH_PREFIX, "/v1/responses/", SRV_ROUTE_RESPONSES, SRV_AUTH_TENANT,
     srv__response_delete},
    {"GET", SRV_MATCH_EXACT, "/admin/pool", SRV_ROUTE_ADMIN, SRV_AUTH_ADMIN, srv__pool},
    {"GET", SRV_MATCH_EXACT, "/admin/adapters", SRV_ROUTE_ADMIN, SRV_AUTH_ADMIN,
     srv__admin_adapters},
    {"POST", SRV_MATCH_EXACT, "/admin/adapters", SRV_ROUTE_ADMIN, SRV_AUTH_ADMIN,
     srv__admin_adapters},
    {"DELETE", SRV_MATCH_PREFIX, "/admin/adapters/", SRV_ROUTE_ADMIN, SRV_AUTH_ADMIN,
     srv__admin_adapters},
    /* the web pages: static, no key (ui.c) */
    {"GET", SRV_MATCH_EXACT, "/", SRV_ROUTE_UI, SRV_AUTH_NONE, srv__ui},
    {"GET", SRV_MATCH_EXACT, "/admin", SRV_ROUTE_UI, SRV_AUTH_NONE, srv__ui},
    {"GET", SRV_MATCH_PREFIX, "/ui/", SRV_ROUTE_UI, SRV_AUTH_NONE, srv__ui},
    /* Anthropic */
    {"POST", SRV_MATCH_EXACT, "/v1/messages", SRV_ROUTE_MESSAGES, SRV_AUTH_TENANT, srv__generate},
    {"POST", SRV_MATCH_EXACT, "/v1/messages/count_tokens", SRV_ROUTE_COUNT_TOKENS,
     SRV_AUTH_TENANT, srv__count_tokens},
    /* Workers AI, under /accounts/{account}/ai/ */
    {"POST", SRV_MATCH_ACCOUNT_PREFIX, "run/", SRV_ROUTE_WORKERS, SRV_AUTH_TENANT, srv__generate},
    {"POST", SRV_MATCH_ACCOUNT, "v1/chat/completions", SRV_ROUTE_WORKERS_CHAT, SRV_AUTH_TENANT,
     srv__generate},
    {"POST", SRV_MATCH_ACCOUNT, "v1/embeddings", SRV_ROUTE_WORKERS, SRV_AUTH_TENANT,
     srv__embeddings},
};

/* What follows /accounts/{account}/ai/ in url (with or without Cloudflare's
 * REST prefix /client/v4), or NULL when url is not under it. */
static const char *srv__account_path(const char *url) {
    if (!strncmp(url, "/client/v4/accounts/", 20)) url += 10;
    if (strncmp(url, "/accounts/", 10) != 0) return NULL;
    const char *acct = url + 10, *slash = strchr(acct, '/');
    if (!slash || slash == acct || strncmp(slash, "/ai/", 4) != 0) return NULL;
    return slash + 4;
}

/* The row url matches (any method), or NULL; *rest: what a prefix row
 * leaves of the path (NULL for an exact row). */
static const srv_route_def *srv__route_find(const char *url, const char **rest) {
    const char *acct = srv__account_path(url);
    for (size_t i = 0; i < sizeof srv__routes / sizeof srv__routes[0]; i++) {
        const srv_route_def *d = &srv__routes[i];
        size_t n = strlen(d->path);
        const char *p = d->match >= SRV_MATCH_ACCOUNT ? acct : url;
        if (!p) continue;
        *rest = NULL;
        switch (d->match) {
        case SRV_MATCH_EXACT:
        case SRV_MATCH_ACCOUNT:
            if (!strcmp(p, d->path)) return d;
            break;
        case SRV_MATCH_PREFIX:
        case SRV_MATCH_UNDER:
            if (!strncmp(p, d->path, n) && (p[n] || d->match == SRV_MATCH_UNDER))
                return *rest = p + n, d;
            break;
        case SRV_MATCH_ACCOUNT_PREFIX:
            if (!strncmp(p, d->path, n) && p[n] && strlen(p + n) < SRV_URL_MODEL_MAX)
                return *rest = p + n, d;
            break;
        }
    }
    *rest = NULL;
    return NULL;
}

/* The route an error answer's shape follows, before dispatch: the path's
 * row, else for a path under Workers AI's /accounts/ its envelope. */
static srv_route srv__route_of(const char *url) {
    const char *rest;
    const srv_route_def *d = srv__route_find(url, &rest);
    if (d) return d->route;
    const char *path = !strncmp(url, "/client/v4/accounts/", 20) ? url + 10 : url;
    return !strncmp(path, "/accounts/", 10) && strstr(path, "/ai/v1/") ? SRV_ROUTE_WORKERS_CHAT
           : !strncmp(path, "/accounts/", 10)                            ? SRV_ROUTE_WORKERS
                                                                         : SRV_ROUTE_OTHER;
}

/* Routes a complete request: 404 for an unknown path (in the shape of the
 * API the path belongs to), 405 for a wrong method, 413 for a body past the
 * limit, the row's auth, then its handler. */
static enum MHD_Result srv__dispatch(server *s, struct MHD_Connection *c, const char *url,
                                     const char *method, srv_conn *sc) {
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    const char *rest;
    const srv_route_def *d = srv__route_find(url, &rest);
    srv_error err;
    if (!d) {
        srv_refuse(&err, ADMIT_UNKNOWN_URL, NULL, "Invalid URL (%s %s)", method, url);
        return srv__reply_error(s, c, srv__route_of(url), &err);
    }
    // rows of the same path for other methods (GET and DELETE /v1/responses/{id})
    for (size_t i = (size_t)(d - srv__routes); i < sizeof srv__routes / sizeof srv__routes[0];
         i++) {
        const srv_route_def *o = &srv__routes[i];
        if (o->match != d->match || strcmp(o->path, d->path) != 0) continue;
        if (!strcmp(o->method, "GET") ? get : !strcmp(o->method, method)) {
            d = o;
            break;
        }
    }
    bool want_get = !strcmp(d->method, "GET");
    if (want_get ? !get : strcmp(method, d->method) != 0) {
        srv_refuse(&err, ADMIT_METHOD, NULL, "Method %s is not allowed on %s; use %s", method, url,
                   d->method);
        return srv__reply_error(s, c, d->route, &err);
    }
    if (sc->too_large) {
        srv_refuse(&err, ADMIT_TOO_LARGE, NULL,
                   "request body of %zu bytes exceeds the limit of %zu bytes", sc->body_seen,
                   sc->body_limit);
        return srv__reply_error(s, c, d->route, &err);
    }
    srv_call q = {.sc = sc, .route = d->route, .rest = rest, .tenant = -1, .path = url,
                  .method = d->method};
    bool ok = true;
    switch (d->auth) {
    case SRV_AUTH_NONE:
        break;
    case SRV_AUTH_TENANT:
        ok = (q.tenant = srv__auth(s, c, d->route, &err)) >= 0;
        break;
    case SRV_AUTH_ADMIN:
        ok = srv__auth_admin(s, c, &err);
        break;
    case SRV_AUTH_METRICS:
        ok = srv__auth_metrics(s, c, &err);
        break;
    }
    if (!ok) return srv__reply_error(s, c, d->route, &err);
    return d->fn(s, c, &q);
}

/* A CORS preflight (OPTIONS with Origin and Access-Control-Request-Method;
 * CORS on): 204 with the allow headers when the Origin is allowed, else 403
 * with none (the browser then refuses the real request). Needs no key. */
static enum MHD_Result srv__preflight(server *s, struct MHD_Connection *c, const char *url) {
    srv_reqinfo *ri = srv__ri(c);
    srv_route route = srv__route_of(url);
    if (!ri || !ri->cors) {
        srv_error err;
        srv_refuse(&err, ADMIT_AUTH, NULL, "CORS: origin not allowed");
        err.status = 403;
        err.type = "permission_error";
        err.code = "cors_origin_not_allowed";
        err.reason = ADMIT_OK; // not a refusal of a request: no rejection counted
        err.workers_code = 403;
        return srv__reply_error(s, c, route, &err);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    char allow[512];
    srv_cors_allow_headers(
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers"), allow,
        sizeof allow);
    srv__decorate(s, c, r, 204);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, HEAD, OPTIONS");
    if (allow[0]) MHD_add_response_header(r, "Access-Control-Allow-Headers", allow);
    MHD_add_response_header(r, "Access-Control-Max-Age", SRV_CORS_MAX_AGE);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
    MHD_destroy_response(r);
    srv_metrics_request(&s->met, route, 204);
    return ret;
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
    server *s = cls;
    srv_conn *sc = *con_cls;
    bool bad_path = sc == (void *)&srv__bad_path;  // srv__uri_log's mark
    if (bad_path) sc = NULL;
    if (sc && sc->gen && sc->gen->route == SRV_ROUTE_EMBEDDINGS) // resumed: an input is done
        return srv__embed_collect(s, c, sc->gen, sc);
    if (sc && sc->gen)  // resumed: an event was posted for the waiting generation
        return sc->gen->stream ? srv__stream_start(s, c, sc->gen, sc)
                               : srv__gen_collect(s, c, sc->gen, sc);
    if (sc && sc->job) {  // resumed: the admin job finished (or a spurious call)
        if (!atomic_load(&sc->job->done)) return MHD_YES;
        return sc->job->pool_map ? srv__pool_answer(s, c, sc) : srv__kv_check_answer(s, c, sc);
    }
    // the request deadline: a connection past it is being closed by the sweeper
    const union MHD_ConnectionInfo *si = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_sock *sk = si ? si->socket_context : NULL;
    bool expired = false;
    if (sk) {
        pthread_mutex_lock(&sk->mu);
        expired = sk->expired;
        if (!expired && sc && !*upload_size && !sc->started) sk->req_done = true;  // head and body in
        pthread_mutex_unlock(&sk->mu);
    }
    if (expired) return MHD_NO;
    if (!sc) {
        if (!(sc = calloc(1, sizeof *sc))) return MHD_NO;
        *con_cls = sc;
        sc->http11 = version && !strcmp(version, MHD_HTTP_VERSION_1_1);
        srv__ri_begin(s, c, method, url);
        // framing and path first (RFC 9112): refused before any body byte
        // is read, and MHD closes the connection, so nothing is smuggled
        srv_error err;
        srv_framing f = {0};
        MHD_get_connection_values(c, MHD_HEADER_KIND, srv__framing_it, &f);
        if (bad_path)
            srv_refuse(&err, ADMIT_INVALID_PATH, NULL,
                       "the path may not contain an encoded slash (%%2F) outside a model "
                       "id, or an encoded NUL (%%00)");
        if (bad_path || !srv_framing_check(&f, &err)) {
            sc->refused = true;
            return srv__reply_error(s, c, srv__route_of(url), &err);
        }
        // a CORS preflight is answered here, before any body and without a key
        if (s->o.n_cors_origins > 0 && !strcmp(method, MHD_HTTP_METHOD_OPTIONS) &&
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin") &&
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method")) {
            sc->refused = true;
            return srv__preflight(s, c, url);
        }
        // an adapter upload may be larger, once the admin key came with it
        sc->body_limit = s->o.max_body_bytes;
        if (!strcmp(method, "POST") && !strcmp(url, "/admin/adapters")) {
            srv_error aerr;
            if (srv__auth_admin(s, c, &aerr) && s->o.max_adapter_bytes > sc->body_limit)
                sc->body_limit = s->o.max_adapter_bytes;
        }
        // refuse an announced oversized body before reading any of it
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (*end == '\0' && n > sc->body_limit) {
                sc->too_large = true;
                sc->body_seen = (size_t)n;
                srv_refuse(&err, ADMIT_TOO_LARGE, NULL,
                           "request body of %llu bytes exceeds the limit of %zu bytes", n,
                           sc->body_limit);
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
        if (!sc->too_large && sc->body.len + *upload_size > sc->body_limit) {
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

/* Milliseconds since fd last received data (TCP_INFO), UINT32_MAX if unknown. */
static uint32_t srv__ms_since_rx(int fd) {
    struct tcp_info ti;
    socklen_t n = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &n) != 0) return UINT32_MAX;
    return ti.tcpi_last_data_recv;
}

static void srv__completed(void *cls, struct MHD_Connection *c, void **con_cls,
                           enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)toe;
    srv_conn *sc = *con_cls;
    // the next request's deadline counts from now
    const union MHD_ConnectionInfo *si = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_sock *sk = si ? si->socket_context : NULL;
    if (sk) {
        pthread_mutex_lock(&sk->mu);
        sk->req_done = false;
        sk->t_start_ns = ks_now_ns();
        pthread_mutex_unlock(&sk->mu);
        sk->ri.active = false;
    }
    *con_cls = NULL;
    // a request that ended before srv__access ran still has srv__uri_log's mark
    if (!sc || sc == (void *)&srv__bad_path) return;
    if (sc->gen) {  // closed while waiting for an event (client gone, or shutdown)
        if (!atomic_exchange(&sc->gen->gone, true) && !atomic_load(&((server *)cls)->stopping))
            atomic_fetch_add_explicit(&((server *)cls)->met.client_disconnects, 1,
                                      memory_order_relaxed);
        srv__gen_free(sc->gen);
    }
    if (sc->job) {  // the job thread still holds it: it ends within its timeout
        while (!atomic_load(&sc->job->done)) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        free(sc->job);
    }
    // the answer's last byte has left (or the connection is gone)
    if (sc->counted)
        atomic_fetch_sub_explicit(&((server *)cls)->met.inflight, 1, memory_order_acq_rel);
    srv_buf_free(&sc->body);
    free(sc);
}

/* Connection open/close (MHD's notify): the per-connection deadline state. */
static void srv__conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                             enum MHD_ConnectionNotificationCode code) {
    server *s = cls;
    srv_sock *sk = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        if (!(sk = calloc(1, sizeof *sk))) return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        sk->fd = ci ? ci->connect_fd : -1;
        pthread_mutex_init(&sk->mu, NULL);
        sk->t_start_ns = ks_now_ns();
        pthread_mutex_lock(&s->lmu);
        sk->next = s->socks;
        if (s->socks) s->socks->prev = sk;
        s->socks = sk;
        pthread_mutex_unlock(&s->lmu);
        atomic_fetch_add(&s->met.http_connections, 1);
        *socket_context = sk;
        return;
    }
    if (!sk) return;
    pthread_mutex_lock(&s->lmu);
    if (sk->prev) sk->prev->next = sk->next;
    else s->socks = sk->next;
    if (sk->next) sk->next->prev = sk->prev;
    pthread_mutex_unlock(&s->lmu);
    atomic_fetch_sub(&s->met.http_connections, 1);
    pthread_mutex_destroy(&sk->mu);
    free(sk);
    *socket_context = NULL;
}

// ----------------------------------------------------------------------------
// The sweeper (see the file comment)

/* Ends a connection whose request missed its deadline: 408 when it sent
 * something, silence for an idle keep-alive; MHD then sees the socket shut
 * and closes the connection. Only while MHD is still reading the request. */
static void srv__sock_expire(server *s, srv_sock *sk, bool sent_something) {
    if (sent_something) {
        srv_error err;
        srv_refuse(&err, ADMIT_REQUEST_TIMEOUT, NULL, "the request was not received within %u s",
                   s->o.request_timeout_s);
        char *body = srv_error_json(SRV_ROUTE_OTHER, &err), msg[1024], rid[40];
        srv_request_id_new(rid, sizeof rid); // no request head came: a fresh id
        int n = body ? snprintf(msg, sizeof msg,
                                "HTTP/1.1 %d Request Timeout\r\nConnection: close\r\nContent-Type: "
                                "application/json\r\nx-request-id: %s\r\nContent-Length: "
                                "%zu\r\n\r\n%s",
                                err.status, rid, strlen(body), body)
                     : 0;
        free(body);
        if (n > 0 && (size_t)n < sizeof msg)
            (void)!send(sk->fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
        srv_metrics_request(&s->met, SRV_ROUTE_OTHER, err.status);
        srv_metrics_reject(&s->met, err.reason);
    }
    shutdown(sk->fd, SHUT_RDWR);
}

static void srv__sweep(server *s) {
    bool stopping = atomic_load_explicit(&s->stopping, memory_order_acquire);
    uint64_t limit = (uint64_t)s->o.request_timeout_s * 1000000000ull;
    pthread_mutex_lock(&s->lmu);
    for (srv_sock *sk = s->socks; sk && limit; sk = sk->next) {
        // the clock is read under sk->mu: a start stamped after a read made
        // before the walk (a connection just opened, an answer just ended)
        // would make the age wrap around to "past every deadline"
        pthread_mutex_lock(&sk->mu);
        uint64_t now = ks_now_ns(), age = now > sk->t_start_ns ? now - sk->t_start_ns : 0;
        bool fire = !sk->req_done && !sk->expired && age > limit;
        if (fire) sk->expired = true;
        pthread_mutex_unlock(&sk->mu);
        // it sent something unless its last data is older than the deadline's start
        if (fire)
            srv__sock_expire(s, sk,
                             (uint64_t)srv__ms_since_rx(sk->fd) * 1000000ull + 50000000ull < age);
    }
    for (srv_gen *g = s->gens; g; g = g->lnext) {
        if (atomic_load(&g->gone)) continue;
        bool gone = stopping;
        pthread_mutex_lock(&g->mu);
        if (!gone && g->suspended && g->fd >= 0) {  // MHD does not watch it: we do
            struct pollfd pf = {.fd = g->fd, .events = POLLRDHUP};
            short rev = poll(&pf, 1, 0) > 0 ? pf.revents : 0;
            if (rev & (POLLHUP | POLLERR | POLLNVAL)) {
                gone = true;
            } else if ((rev & POLLRDHUP) && !g->answered && !g->probed) {
                // half-closed, or gone: an interim answer tells (HTTP/1.0 has none)
                static const char probe[] = "HTTP/1.1 102 Processing\r\n\r\n";
                g->probed = true;
                gone = !g->http11 || send(g->fd, probe, sizeof probe - 1,
                                          MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)(sizeof probe - 1);
                if (!gone) atomic_fetch_add_explicit(&s->met.http_probes, 1, memory_order_relaxed);
            }
        }
        pthread_mutex_unlock(&g->mu);
        if (!gone) continue;
        atomic_store(&g->gone, true);
        if (!stopping)
            atomic_fetch_add_explicit(&s->met.client_disconnects, 1, memory_order_relaxed);
        srv__gen_cancel(g); // their done events resume the connection
    }
    pthread_mutex_unlock(&s->lmu);
}

static void *srv__sweeper_main(void *arg) {
    server *s = arg;
    while (!atomic_load_explicit(&s->sweeper_stop, memory_order_acquire)) {
        srv__sweep(s);
        struct timespec ts = {0, SRV_SWEEP_MS * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void srv__mhd_log(void *cls, const char *fmt, va_list ap) {
    server *s = cls;
    // a failed start is reported once, by server_create's error ("cannot
    // listen on ...: Address already in use"), which quotes MHD's first
    // message where it says more (a TLS key MHD refused): MHD's line is debug
    bool starting = atomic_load_explicit(&s->mhd_starting, memory_order_acquire);
    ks_log_level lvl = starting ? KS_LOG_DEBUG : KS_LOG_WARN;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && buf[n - 1] == '\n')
        buf[--n] = '\0';
    if (starting && pthread_equal(pthread_self(), s->mhd_starter) && !s->mhd_start_msg[0])
        snprintf(s->mhd_start_msg, sizeof s->mhd_start_msg, "%.*s",
                 (int)sizeof s->mhd_start_msg - 1, buf); // its first line, cut to fit
    ks_log(lvl, "http: %s", buf);
}

// ----------------------------------------------------------------------------
// Lifecycle

void server_opts_default(server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_body_bytes = 1u << 20;
    o->max_adapter_bytes = (size_t)1 << 30;
    o->max_connections = 4096;
    o->max_connections_per_ip = 256;
    o->idle_timeout_s = 120;
    o->request_timeout_s = 10;
    o->tool_call_format = -1;
    o->reasoning_format = -1;
    o->responses_ttl_s = 3600;
    o->responses_max = 1000;
    o->responses_max_bytes = (size_t)64 << 20;
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
    if (!b || !b->submit || !b->next || !b->cancel || !b->release || !b->set_notify || !b->is_online ||
        !b->set_online || !b->get_stats || !b->check_quiescent)
        return ks_seterr(eb, KS_ERR_INVAL, "server: incomplete backend");
    if (sodium_init() < 0) return ks_seterr(eb, KS_ERR_INTERNAL, "server: libsodium init failed");
    server *s = calloc(1, sizeof *s);
    if (!s) return ks_seterr(eb, KS_ERR_NOMEM, "server: out of memory");
    ks_err err = KS_OK;
    s->o = *o;
    s->b = *b;
    pthread_mutex_init(&s->lmu, NULL);
    srv_metrics_init(&s->met);
    if (o->n_more < 0 || (o->n_more > 0 && !o->more)) {
        err = ks_seterr(eb, KS_ERR_INVAL, "server: bad catalog (more, n_more)");
        goto fail;
    }
    s->n_mods = 1 + o->n_more;
    if (!(s->mods = calloc((size_t)s->n_mods, sizeof *s->mods))) {
        err = ks_seterr(eb, KS_ERR_NOMEM, "server: out of memory");
        goto fail;
    }
    for (int k = 0; k < s->n_mods; k++) { // the catalog: entry 0 is m, named by the options
        srv_model *sm = &s->mods[k];
        const server_model *e = k ? &o->more[k - 1] : NULL;
        sm->index = k;
        sm->m = k ? e->m : m;
        if (!sm->m) {
            err = ks_seterr(eb, KS_ERR_INVAL, "server: catalog entry %d has no model", k);
            goto fail;
        }
        sm->vocab = model_vocab(sm->m);
        sm->max_token_bytes = tok_max_token_bytes(sm->vocab);
        sm->n_ctx = k && e->n_ctx > 0 ? e->n_ctx : o->n_ctx;
        sm->name = k ? e->name : o->model_name;
        sm->aliases = k ? e->aliases : o->aliases;
        sm->n_aliases = k ? e->n_aliases : o->n_aliases;
    }
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
    if (o->responses_ttl_s && o->responses_max &&
        !(s->resp = srv_resp_store_create(o->responses_max, o->responses_max_bytes,
                                          o->responses_ttl_s))) {
        err = ks_seterr(eb, KS_ERR_NOMEM, "server: out of memory");
        goto fail;
    }
    if (o->admin_key) srv_tenants_set_admin(s->ts, o->admin_key);
    if (o->metrics_key) srv_tenants_set_metrics(s->ts, o->metrics_key);
    if (o->limits_redis) {
        const char *colon = strrchr(o->limits_redis, ':');
        char host[256];
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == o->limits_redis || (size_t)(colon - o->limits_redis) >= sizeof host ||
            !end || *end || port < 1 || port > 65535) {
            err = ks_seterr(eb, KS_ERR_INVAL, "--limits-redis '%s': expected HOST:PORT",
                            o->limits_redis);
            goto fail;
        }
        snprintf(host, sizeof host, "%.*s", (int)(colon - o->limits_redis), o->limits_redis);
        double share = o->limits_local_share > 0 ? o->limits_local_share : 1.0;
        if ((err = srv_tenants_set_redis(s->ts, host, (int)port, o->limits_redis_prefix, share, eb)))
            goto fail;
        ks_log(KS_LOG_INFO, "tenant rate limits shared through redis %s (local share %.3g while "
               "it is unreachable)", o->limits_redis, share);
    }
    s->met.ts = s->ts;
    s->met.model_name = srv__primary_name(s);
    for (int i = 0; i < o->n_cors_origins; i++)
        if (!server_cors_origin_valid(o->cors_origins[i])) {
            err = ks_seterr(eb, KS_ERR_INVAL,
                            "--cors-origin '%s': expected '*' or an origin "
                            "such as https://app.example.com",
                            o->cors_origins[i]);
            goto fail;
        }
    if (!o->tls_cert_pem != !o->tls_key_pem) {
        err = ks_seterr(eb, KS_ERR_INVAL, "HTTPS needs both a certificate and its key");
        goto fail;
    }
    s->log_content = o->log_content || s->ts->log_content;
    // the chat template: compiled and test-rendered now, so a template this
    // server cannot run stops it here, naming the file and the reason
    for (int k = 0; k < s->n_mods; k++) {
        srv_model *sm = &s->mods[k];
        if ((err = chat_tmpl_load(model_gguf(sm->m), sm->vocab, k ? NULL : o->chat_template_file,
                                  &sm->chat, eb)))
            goto fail;
        if (chat_tmpl_is_plain(sm->chat))
            ks_log(KS_LOG_INFO, "chat template of %s: none in the model, chat uses the plain format",
                   srv__model_primary(sm));
        else
            ks_log(KS_LOG_INFO, "chat template of %s: %s%s", srv__model_primary(sm),
                   chat_tmpl_origin(sm->chat),
                   chat_tmpl_source(sm->chat, true) != chat_tmpl_source(sm->chat, false)
                       ? " (+ tokenizer.chat_template.tool_use for requests with tools)"
                       : "");
        srv__toolcall_setup(s, sm); // its formats come from the template
    }
    if ((err = srv__load_adapters(s, eb))) goto fail; // the tenants file's LoRA adapters

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
    if (pthread_create(&s->sweeper, NULL, srv__sweeper_main, s) != 0) {
        freeaddrinfo(ai);
        err = ks_seterr(eb, KS_ERR_NOMEM, "server: cannot start the sweeper thread");
        goto fail;
    }
    s->sweeper_on = true;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    // HTTPS: MHD's TLS (GnuTLS) with the certificate and key server_tls_load checked;
    // without them the array ends at once (MHD_OPTION_END); after the logger, which
    // MHD wants first
    bool tls = o->tls_cert_pem && o->tls_key_pem;
    if (tls) flags |= MHD_USE_TLS;
    struct MHD_OptionItem tls_opts[] = {
        {tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, (void *)o->tls_cert_pem},
        {tls ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, 0, (void *)o->tls_key_pem},
        {MHD_OPTION_END, 0, NULL}};
    s->mhd_starter = pthread_self();
    atomic_store_explicit(&s->mhd_starting, true, memory_order_release);
    s->d = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, srv__access, s, MHD_OPTION_EXTERNAL_LOGGER,
        srv__mhd_log, s, MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, srv__completed, s, MHD_OPTION_NOTIFY_CONNECTION,
        srv__conn_notify, s, MHD_OPTION_URI_LOG_CALLBACK, srv__uri_log, s,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)SRV_HTTP_THREADS, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(o->max_connections ? o->max_connections : 4096),
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_connections_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s, MHD_OPTION_END);
    int bind_errno = errno;
    atomic_store_explicit(&s->mhd_starting, false, memory_order_release);
    freeaddrinfo(ai);
    if (!s->d) {
        // MHD's message, where it says more than errno (a TLS setup failure)
        const char *why = strerror(bind_errno), *mm = s->mhd_start_msg;
        bool more = mm[0] && !strstr(mm, why);
        err = ks_seterr(eb, KS_ERR_IO, "cannot listen on %s:%d%s: %s%s%s%s", o->host, o->port,
                        tls ? " with TLS" : "", why, more ? " (" : "", more ? mm : "",
                        more ? ")" : "");
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
    if (s->sweeper_on) {
        atomic_store(&s->sweeper_stop, true);
        pthread_join(s->sweeper, NULL);
    }
    srv_tenants_free(s->ts);
    srv_resp_store_destroy(s->resp);
    for (int k = 0; s->mods && k < s->n_mods; k++) chat_tmpl_free(s->mods[k].chat);
    free(s->mods);
    pthread_mutex_destroy(&s->lmu);
    free(s);
    return err;
}

// ----------------------------------------------------------------------------
// HTTPS: the certificate and key, checked before the model loads

/* The whole of path, NUL-terminated, in *out (caller frees); at most 1 MiB. */
static ks_err srv__read_pem(const char *what, const char *path, char **out, ks_errbuf *eb) {
    FILE *f = fopen(path, "rb");
    if (!f) return ks_seterr(eb, KS_ERR_IO, "%s '%s': %s", what, path, strerror(errno));
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    if (buf) n = fread(buf, 1, cap + 1, f);
    bool bad = buf && ferror(f);
    int read_errno = errno;
    fclose(f);
    if (!buf) return ks_seterr(eb, KS_ERR_NOMEM, "%s '%s': out of memory", what, path);
    if (bad || n > cap) {
        free(buf);
        return bad ? ks_seterr(eb, KS_ERR_IO, "%s '%s': %s", what, path, strerror(read_errno))
                   : ks_seterr(eb, KS_ERR_FORMAT, "%s '%s': larger than 1 MiB", what, path);
    }
    buf[n] = 0;
    *out = buf;
    return KS_OK;
}

/* OpenSSL's passphrase callback: none is given, so an encrypted key fails
 * (instead of OpenSSL prompting on the terminal). */
static int srv__no_passphrase(char *buf, int size, int rwflag, void *u) {
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

void server_tls_free(char *pem) {
    if (!pem) return;
    sodium_memzero(pem, strlen(pem));
    free(pem);
}

ks_err server_tls_load(const char *cert_path, const char *key_path, char **cert_pem, char **key_pem,
                       ks_errbuf *eb) {
    *cert_pem = *key_pem = NULL;
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                         "HTTPS: this libmicrohttpd was built without TLS support (GnuTLS); "
                         "serve plain HTTP behind a TLS proxy instead");
    char *cert = NULL, *key = NULL;
    X509 *x = NULL;
    EVP_PKEY *pk = NULL;
    BIO *b = NULL;
    ks_err err = srv__read_pem("--ssl-cert-file", cert_path, &cert, eb);
    if (!err) err = srv__read_pem("--ssl-key-file", key_path, &key, eb);
    if (err) goto out;
    ERR_clear_error();
    if (!(b = BIO_new_mem_buf(cert, -1)) || !(x = PEM_read_bio_X509(b, NULL, NULL, NULL))) {
        err = ks_seterr(eb, KS_ERR_FORMAT, "--ssl-cert-file '%s': no PEM certificate in it",
                        cert_path);
        goto out;
    }
    BIO_free(b);
    ERR_clear_error();
    if (!(b = BIO_new_mem_buf(key, -1)) ||
        !(pk = PEM_read_bio_PrivateKey(b, NULL, srv__no_passphrase, NULL))) {
        err = ks_seterr(eb, KS_ERR_FORMAT,
                        "--ssl-key-file '%s': no PEM private key in it (or it is encrypted: "
                        "give it without a passphrase)",
                        key_path);
        goto out;
    }
    ERR_clear_error();
    if (X509_check_private_key(x, pk) != 1) {
        err = ks_seterr(eb, KS_ERR_INVAL,
                        "--ssl-key-file '%s' is not the private key of the certificate in "
                        "--ssl-cert-file '%s'",
                        key_path, cert_path);
        goto out;
    }
    *cert_pem = cert, *key_pem = key;
    cert = key = NULL;
out:
    ERR_clear_error();
    BIO_free(b);
    X509_free(x);
    EVP_PKEY_free(pk);
    free(cert);
    server_tls_free(key);
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
    return s ? atomic_load_explicit(&s->met.inflight, memory_order_acquire) : 0;
}

void server_destroy(server *s) {
    if (!s) return;
    atomic_store_explicit(&s->stopping, true, memory_order_release);
    // the sweeper cancels every generation; their answers end with their
    // last words (503 / an SSE error event): up to a second; then close all
    for (int i = 0; i < 100 && atomic_load_explicit(&s->met.inflight, memory_order_acquire) > 0; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    atomic_store(&s->sweeper_stop, true);
    pthread_join(s->sweeper, NULL);
    srv_tenants_free(s->ts);
    srv_resp_store_destroy(s->resp);
    for (int k = 0; s->mods && k < s->n_mods; k++) chat_tmpl_free(s->mods[k].chat);
    free(s->mods);
    pthread_mutex_destroy(&s->lmu);
    free(s);
}

const char *server_chat_template(const server *s, bool tools) {
    return s ? chat_tmpl_source(s->mods[0].chat, tools) : NULL;
}
