/* http.c — the HTTP server: libmicrohttpd daemon, routing, auth, the
 * generation handlers (OpenAI chat/completions, Workers AI), SSE streaming,
 * admin, /health and /metrics.
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

#define SRV_SWEEP_MS 50  /* sweeper period: disconnects, deadlines, shutdown */
#define SRV_HTTP_THREADS 4 /* MHD's epoll threads */

typedef struct srv_gen srv_gen;
typedef struct srv_sock srv_sock;

struct server {
    server_opts o;          /* copy; the strings stay borrowed */
    server_backend b;       /* copy; b.impl borrowed */
    const model *m;         /* borrowed */
    const tok_vocab *vocab; /* model's */
    size_t max_token_bytes; /* tok_max_token_bytes(vocab): prompt bytes -> tokens bound */
    srv_tenants *ts;        /* owned */
    chat_tmpl *chat;        /* owned: the model's chat template (or PLAIN) */
    bool log_content;
    srv_metrics met;
    struct MHD_Daemon *d;
    int port;
    atomic_bool stopping;
    atomic_bool draining; /* server_drain: refuse new generations */
    /* the sweeper and what it watches (lmu) */
    pthread_t sweeper;
    bool sweeper_on;
    atomic_bool sweeper_stop;
    pthread_mutex_t lmu;
    srv_gen *gens;   /* every live generation */
    srv_sock *socks; /* every open connection */
    /* chat answers (toolcall.h), from the template and the options */
    toolcall_format tc_format;            /* how tool calls are written */
    const char *think_open, *think_close; /* NULL: reasoning stays content */
};

/* The current request's answer-header state (srv__decorate); set when its
 * head arrives, read by whichever handler answers. Owned by the
 * connection's MHD thread. */
typedef struct srv_reqinfo {
    bool active;                      /* a request is being handled */
    char rid[SRV_REQUEST_ID_MAX + 1]; /* x-request-id: the client's (sane) or ours */
    bool cors;                        /* its Origin is allowed: CORS headers go on */
    char origin[256];                 /* Access-Control-Allow-Origin's value */
    int tenant;                       /* authenticated tenant, -1: none (yet) */
    int64_t need_tokens;              /* tokens its last admission asked of the tenant */
    char line[160];                   /* "METHOD /path", for the log line of an error */
} srv_reqinfo;

/* Per-connection state (MHD's socket context): the request deadline. */
struct srv_sock {
    srv_sock *prev, *next; /* s->socks (lmu) */
    int fd;
    pthread_mutex_t mu;
    uint64_t t_start_ns; /* connection start or previous answer */
    bool req_done;       /* the current request's head and body are complete */
    bool expired;        /* the deadline fired: the connection is being closed */
    srv_reqinfo ri;      /* the current request's (MHD thread only, not mu) */
};

/* Admin work that blocks (the KV check), run on a thread of its own. */
typedef struct srv_job {
    server *s;
    struct MHD_Connection *c;
    uint32_t timeout_ms;
    ks_err err;
    ks_errbuf eb;
    atomic_bool done;
} srv_job;

/* Per-connection request state (MHD's con_cls): the buffered body. */
typedef struct srv_conn {
    srv_buf body;
    size_t body_seen; /* bytes received (counted past the limit too) */
    bool too_large;
    bool started;
    bool http11;      /* HTTP/1.1: 1xx interim answers allowed */
    srv_gen *gen;     /* a generation waiting (suspended) in the access handler */
    srv_job *job;     /* admin work running while the connection is suspended */
    bool refused; /* answered before its body (bad framing or path): ignore the rest */
    bool counted; /* an accepted generation: in met.inflight until srv__completed, so
                     a drain waits for its answer's last byte, not for its last token */
} srv_conn;

/* One choice of a generation (OpenAI's n / best_of; most requests have
 * one): its engine request and what the answer collects of it. */
typedef struct srv_choice {
    void *req;        /* the backend's request handle */
    atomic_bool done; /* its done event was consumed (the sweeper reads it) */
    int32_t n_gen;    /* tokens generated */
    engine_event end; /* its done event */
    srv_buf text;     /* non-streaming: its text (echo: the prompt is added when answering) */
    json_t *lp;       /* non-streaming logprobs of its tokens (chat: content array;
                         completions: {tokens, token_logprobs, top_logprobs, text_offset}) */
    size_t text_off;  /* completions: text_offset of its next token */
    double lp_sum;    /* sum of its tokens' logprobs: best_of ranks by the mean */
    toolcall_parser *tc; /* chat: its answer's tool calls and reasoning (toolcall.h); NULL
                            when neither applies */
    int tc_sent;         /* calls answered (streamed) so far */
} srv_choice;

/* One generation in flight; owned by the handler (non-streaming) or by the
 * streaming response (freed by its free callback). */
struct srv_gen {
    server *s;
    srv_route route;
    srv_choice ch[ENGINE_MAX_N]; /* (n_ch) the choices generated */
    int n_ch;                    /* choices generated: best_of (>= n_ret), 1 with max_tokens 0 */
    int n_ret;                   /* choices answered (n): the best n_ret of n_ch */
    int n_done;                  /* choices whose done event was consumed */
    int cur;                     /* the choice of the last event srv__gen_poll took */
    int rr;                      /* round-robin start of the next poll */
    int first_cur;               /* streaming: the choice of `first` */
    char *echo;                  /* completions with echo: the prompt text (malloc'd) */
    size_t echo_len;
    json_t *plp;                 /* echo + logprobs: the prompt tokens' logprobs (completions
                                    object), shared by every choice */
    size_t ptext_off;            /* its next text_offset */
    int tenant;                  /* index into s->ts; -1 once released */
    int fd;                      /* connection socket, for disconnect checks */
    struct MHD_Connection *conn; /* its connection */
    srv_gen *lprev, *lnext;      /* s->gens (lmu) */
    /* suspension (mu): see the file comment */
    pthread_mutex_t mu;
    bool suspended;   /* the connection is suspended waiting for an event */
    bool wake;        /* an event came while not suspended: look again */
    bool answered;    /* a response was queued: no interim answer any more */
    bool probed;      /* the 102 probe went out */
    bool http11;
    int32_t n_prompt, max_tokens, n_gen;
    int64_t reserved; /* tokens taken from the tenant's bucket */
    char id[16 + SRV_REQUEST_ID_MAX]; /* prefix + the x-request-id */
    char rid[SRV_REQUEST_ID_MAX + 1]; /* the x-request-id, for the log line */
    char model[256]; /* name echoed in answers */
    long long created;
    bool logprobs, include_usage;
    int top;
    uint64_t t_submit_ns, t_first_ns;
    bool done;        /* every choice's done event was consumed */
    atomic_bool gone; /* client left or server stopping (counted once) */
    /* streaming */
    srv_buf out;
    size_t out_off;
    bool head_sent, eof;
    bool has_first;       /* first holds the first event, not yet streamed */
    bool stream;          /* a streamed answer */
    bool oom;             /* collecting: an event could not be kept */
    engine_event first;
    srv_buf text; /* streaming with log_content: the text, for the log */
    /* chat: what every choice's parser (srv_choice.tc) reads */
    json_t *tc_tools; /* the request's tools (a reference): the parsers borrow them */
    toolcall_cfg tc_cfg;
    bool tc_parallel; /* parallel_tool_calls: false keeps the first call only */
    /* embeddings (route EMBEDDINGS, n_ch 0): one backend request per input,
       at most SRV_EMBED_WINDOW of them submitted and not done at a time */
    _Atomic(void *) *ereq; /* (n_ereq) handles (NULL: not submitted); the sweeper reads them */
    atomic_bool *edone;    /* (n_ereq) its done event was taken; the sweeper reads them */
    int n_ereq, n_edone, n_esub; /* inputs, done, submitted (the first n_esub) */
    srv_embed_req erq;           /* the parsed, tokenized inputs */
    const char *etenant;         /* the tenant's name (s->ts, outlives g) */
    srv_route shape; /* the error answers' shape (EMBEDDINGS; WORKERS for its envelope) */
    float *evec;   /* (n_ereq, n_embd) the vectors */
    bool base64;   /* encoding_format base64 */
    bool embed_ok; /* every vector computed: the tenant's tokens were all used */
    /* issue 13 */
    srv_route api;              /* the route as called: error shape, metrics (route: the
                                   answer's shape; WORKERS_CHAT answers as CHAT) */
    srv_anth_sse anth;          /* messages, streamed: the open content block */
    char *stops[SRV_MAX_STOPS]; /* messages: stop_sequences (malloc'd), for stop_sequence */
    int n_stops;
    srv_buf raw;  /* messages with stops: the generated tokens' text, stops not removed */
    bool raw_oom; /* raw is incomplete (out of memory): the answer fails */
};

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

/* The request state of c's current request, or NULL (no socket context). */
static srv_reqinfo *srv__ri(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *si =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_sock *sk = si ? si->socket_context : NULL;
    return sk && sk->ri.active ? &sk->ri : NULL;
}

/* Starts the request state of a new request on c: its x-request-id, and
 * whether its Origin may see the answer. */
static void srv__ri_begin(server *s, struct MHD_Connection *c, const char *method,
                          const char *url) {
    const union MHD_ConnectionInfo *si =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_sock *sk = si ? si->socket_context : NULL;
    if (!sk) return;
    srv_reqinfo *ri = &sk->ri;
    memset(ri, 0, sizeof *ri);
    ri->active = true;
    ri->tenant = -1;
    const char *id = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    if (srv_request_id_ok(id))
        snprintf(ri->rid, sizeof ri->rid, "%s", id);
    else
        srv_request_id_new(ri->rid, sizeof ri->rid);
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (s->o.n_cors_origins > 0 &&
        srv_cors_origin_ok(s->o.cors_origins, s->o.n_cors_origins, origin)) {
        bool any = false;
        for (int i = 0; i < s->o.n_cors_origins; i++)
            any = any || !strcmp(s->o.cors_origins[i], "*");
        // "*" answers "*" (no cookies are ever involved); a list echoes the match
        snprintf(ri->origin, sizeof ri->origin, "%s", any ? "*" : origin);
        ri->cors = strlen(origin) < sizeof ri->origin;
    }
    // the path as a log value: a client's bytes never forge a field or a line
    char path[sizeof ri->line - 18]; // room for "%.16s "
    srv_log_value(url ? url : "?", path, sizeof path);
    snprintf(ri->line, sizeof ri->line, "%.16s %s", method ? method : "?", path);
}

/* The headers every answer carries (see the file comment). Counts the
 * answer for its tenant. Only from an MHD callback of c's connection. */
static void srv__decorate(server *s, struct MHD_Connection *c, struct MHD_Response *r, int status) {
    srv_reqinfo *ri = srv__ri(c);
    int64_t retry = status == 429 || status == 503 ? 1 : 0;
    if (ri) {
        MHD_add_response_header(r, "x-request-id", ri->rid);
        // with a list of origins the answer depends on Origin: caches must know
        if (s->o.n_cors_origins > 0 && !(ri->cors && !strcmp(ri->origin, "*")))
            MHD_add_response_header(r, "Vary", "Origin");
        if (ri->cors) {
            MHD_add_response_header(r, "Access-Control-Allow-Origin", ri->origin);
            MHD_add_response_header(r, "Access-Control-Expose-Headers",
                                    "x-request-id, x-ratelimit-limit-requests, "
                                    "x-ratelimit-remaining-requests, x-ratelimit-reset-requests, "
                                    "x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, "
                                    "x-ratelimit-reset-tokens, retry-after");
        }
        if (ri->tenant >= 0 && (size_t)ri->tenant < s->ts->n) {
            srv_tenant *t = &s->ts->t[ri->tenant];
            atomic_fetch_add_explicit(&t->m_requests, 1, memory_order_relaxed);
            if (status == 429) atomic_fetch_add_explicit(&t->m_limited, 1, memory_order_relaxed);
            srv_ratelimit rl;
            srv_tenants_ratelimit(s->ts, ri->tenant, ri->need_tokens, ks_now_ns(), &rl);
            char v[64];
            if (rl.requests) {
                snprintf(v, sizeof v, "%lld", (long long)rl.limit_requests);
                MHD_add_response_header(r, "x-ratelimit-limit-requests", v);
                snprintf(v, sizeof v, "%lld", (long long)rl.remaining_requests);
                MHD_add_response_header(r, "x-ratelimit-remaining-requests", v);
                srv_duration_fmt(rl.reset_requests_s, v, sizeof v);
                MHD_add_response_header(r, "x-ratelimit-reset-requests", v);
            }
            if (rl.tokens) {
                snprintf(v, sizeof v, "%lld", (long long)rl.limit_tokens);
                MHD_add_response_header(r, "x-ratelimit-limit-tokens", v);
                snprintf(v, sizeof v, "%lld", (long long)rl.remaining_tokens);
                MHD_add_response_header(r, "x-ratelimit-remaining-tokens", v);
                srv_duration_fmt(rl.reset_tokens_s, v, sizeof v);
                MHD_add_response_header(r, "x-ratelimit-reset-tokens", v);
            }
            // the tenant's own limit: the real refill time of what it lacks
            if (status == 429) retry = srv_retry_after_s(rl.retry_s);
        }
        if (status >= 400) {
            char rid[4 * SRV_REQUEST_ID_MAX + 3];
            srv_log_value(ri->rid, rid, sizeof rid);
            ks_log(KS_LOG_INFO, "http %d %s request_id=%s", status, ri->line, rid);
        }
    }
    if (status == 503) { // busy or draining: the queue's expected wait
        engine_stats es;
        s->b.get_stats(s->b.impl, &es);
        unsigned long long n = atomic_load_explicit(&s->met.e2e.n_obs, memory_order_relaxed);
        double mean = n ? (double)atomic_load_explicit(&s->met.e2e.sum_ns, memory_order_relaxed) *
                              1e-9 / (double)n
                        : 0;
        retry = srv_queue_retry_s(mean, es.n_queued, es.n_running);
    }
    if (retry > 0) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)retry);
        MHD_add_response_header(r, "Retry-After", v);
    }
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
    srv__decorate(s, c, r, status);
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
    if (err->reason != ADMIT_OK) srv_metrics_reject(&s->met, err->reason);
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

/* Tenant index for an API request, or -1 with err filled (401; 400 when
 * /v1/messages has two different keys). Anthropic's clients send the key
 * in x-api-key: /v1/messages takes it there too; either way the tenant
 * comes from the key alone (I7). */
static int srv__auth(server *s, struct MHD_Connection *c, srv_route route, srv_error *err) {
    if (s->ts->anonymous) {
        srv_reqinfo *ri = srv__ri(c);
        if (ri) ri->tenant = 0;
        return 0;
    }
    const char *key = srv__bearer(c), *xkey = NULL;
    if (route == SRV_ROUTE_MESSAGES)
        xkey = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (xkey && !*xkey) xkey = NULL;
    if (key && xkey && strcmp(key, xkey) != 0) {
        srv_refuse(err, ADMIT_DUPLICATE_HEADER, NULL,
                   "x-api-key and Authorization carry different keys; send one");
        return -1;
    }
    if (!key) key = xkey;
    if (!key) {
        srv_refuse(err, ADMIT_AUTH, NULL,
                   route == SRV_ROUTE_MESSAGES
                       ? "missing API key: send the header 'x-api-key: <key>'"
                       : "missing API key: send the header 'Authorization: Bearer <key>'");
        return -1;
    }
    int t = srv_tenants_auth(s->ts, key, strlen(key));
    if (t < 0) srv_refuse(err, ADMIT_AUTH, NULL, "invalid API key");
    srv_reqinfo *ri = srv__ri(c);
    if (ri) ri->tenant = t; // its answers carry its x-ratelimit-* headers
    return t;
}

// ----------------------------------------------------------------------------
// Generation: per-event output

/* Counts the request sc carries in met.inflight (once) until srv__completed:
 * MHD sends a non-streamed answer after its generation is freed. */
static void srv__count_inflight(server *s, srv_conn *sc) {
    if (sc->counted) return;
    sc->counted = true;
    atomic_fetch_add_explicit(&s->met.inflight, 1, memory_order_acq_rel);
}

static void srv__gen_release_tenant(srv_gen *g) {
    if (g->tenant < 0) return;
    // never submitted: all of it back; else what was not generated
    int64_t unused = g->ch[0].req ? (int64_t)g->max_tokens * g->n_ch - g->n_gen : g->reserved;
    if (g->route == SRV_ROUTE_EMBEDDINGS) unused = g->embed_ok ? 0 : g->reserved;
    srv_tenants_release_n(g->s->ts, g->tenant, g->n_ch > 1 ? g->n_ch : 1, unused > 0 ? unused : 0);
    g->tenant = -1;
}

/* Frees g once: first out of the sweeper's list, so the sweeper (which
 * cancels under lmu) never reaches a request, an input array or a choice
 * that is being freed. */
static void srv__gen_free(srv_gen *g) {
    if (!g) return;
    server *s = g->s;
    pthread_mutex_lock(&s->lmu);
    if (g->lprev)
        g->lprev->lnext = g->lnext;
    else if (s->gens == g)
        s->gens = g->lnext;
    if (g->lnext) g->lnext->lprev = g->lprev;
    g->lprev = g->lnext = NULL;
    pthread_mutex_unlock(&s->lmu);
    for (int i = 0; i < g->n_ch; i++) {
        srv_choice *ch = &g->ch[i];
        if (ch->req) {
            s->b.set_notify(ch->req, NULL, NULL); // no notify runs or starts after this
            if (!ch->done) s->b.cancel(ch->req);
            s->b.release(ch->req);
        }
        srv_buf_free(&ch->text);
        json_decref(ch->lp);
    }
    for (int i = 0; i < g->n_ereq; i++) {
        if (!g->ereq[i]) continue;
        s->b.set_notify(g->ereq[i], NULL, NULL);
        if (!g->edone[i]) s->b.cancel(g->ereq[i]);
        s->b.release(g->ereq[i]);
    }
    free(g->ereq);
    free(g->edone);
    srv_embed_req_free(&g->erq);
    free(g->evec);
    free(g->echo);
    json_decref(g->plp);
    srv__gen_release_tenant(g);
    srv_buf_free(&g->out);
    srv_buf_free(&g->text);
    srv_buf_free(&g->raw);
    for (int i = 0; i < g->n_stops; i++)
        free(g->stops[i]);
    for (int i = 0; i < ENGINE_MAX_N; i++)
        toolcall_parser_destroy(g->ch[i].tc);
    json_decref(g->tc_tools);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

/* The request's event stream posted an event (the producer's thread, under
 * the stream's lock): resume the connection if it waits, else have the
 * consumer look again before it suspends. */
static void srv__gen_notify(void *ctx) {
    srv_gen *g = ctx;
    pthread_mutex_lock(&g->mu);
    if (g->suspended) {
        g->suspended = false;
        MHD_resume_connection(g->conn);
    } else {
        g->wake = true;
    }
    pthread_mutex_unlock(&g->mu);
}

/* Suspends g's connection until the next event, unless one came since the
 * consumer last looked. True: suspended (return and wait to be called
 * again); false: look again now. Only from an MHD callback of g's
 * connection. */
static bool srv__gen_suspend(srv_gen *g) {
    pthread_mutex_lock(&g->mu);
    bool wait = !g->wake;
    g->wake = false;
    if (wait) {
        g->suspended = true;
        MHD_suspend_connection(g->conn);
    }
    pthread_mutex_unlock(&g->mu);
    return wait;
}

/* Cancels every choice still running. The sweeper calls it while the
 * connection's thread takes events and submits inputs: the done flags and
 * the input handles are atomic (a handle is published with release, so its
 * backend request is complete when read here); a request whose done event
 * is taken just after the load is cancelled harmlessly. */
static void srv__gen_cancel(srv_gen *g) {
    for (int i = 0; i < g->n_ch; i++)
        if (g->ch[i].req && !atomic_load_explicit(&g->ch[i].done, memory_order_relaxed))
            g->s->b.cancel(g->ch[i].req);
    for (int i = 0; i < g->n_ereq; i++) {
        void *r = atomic_load_explicit(&g->ereq[i], memory_order_acquire);
        if (r && !atomic_load_explicit(&g->edone[i], memory_order_relaxed)) g->s->b.cancel(r);
    }
}

/* Takes the next event of any choice if there is one (round robin, so no
 * choice starves the others), without waiting: 1 an event in *ev, its
 * choice in g->cur; 0 none yet; -1 a choice's events ended without a done
 * event. ev->done ends that choice; g->done is set once every choice's
 * done event was taken. */
static int srv__gen_poll(srv_gen *g, engine_event *ev) {
    for (int k = 0; k < g->n_ch; k++) {
        int i = (g->rr + k) % g->n_ch;
        srv_choice *ch = &g->ch[i];
        if (ch->done) continue;
        ks_err e = g->s->b.next(ch->req, ev, 0);
        if (e == KS_ERR_TIMEOUT) continue;
        g->cur = i;
        g->rr = i + 1;
        if (e != KS_OK) {
            atomic_store_explicit(&ch->done, true, memory_order_relaxed);
            g->done = true;
            return -1;
        }
        bool gen = ev->token >= 0 && !ev->prompt;
        if (gen && !g->t_first_ns) g->t_first_ns = ks_now_ns();
        if (gen) {
            ch->n_gen++;
            g->n_gen++;
            ch->lp_sum += (double)ev->sr.logprob;
        }
        if (gen && g->n_stops && !g->raw_oom) { // which stop ended it (srv__anth_stop_seq)
            char piece[256];
            size_t n = tok_piece(g->s->vocab, ev->token, false, piece, sizeof piece);
            g->raw_oom = !srv_buf_add(&g->raw, piece, n < sizeof piece ? n : sizeof piece);
        }
        if (ev->done) {
            atomic_store_explicit(&ch->done, true, memory_order_relaxed);
            ch->end = *ev;
            g->n_gen += ev->n_gen - ch->n_gen; // the engine's count is the truth
            ch->n_gen = ev->n_gen;
            if (g->tenant >= 0) // its grammar's CPU, charged to its tenant
                atomic_fetch_add_explicit(&g->s->ts->t[g->tenant].m_mask_us,
                                          (unsigned long long)(ev->mask_ms * 1e3),
                                          memory_order_relaxed);
            g->done = ++g->n_done == g->n_ch;
        }
        return 1;
    }
    return 0;
}

/* The request's outcome over its choices: ev (a done event) with the
 * completion tokens of every choice and the prompt counted once. */
static engine_event srv__gen_total(const srv_gen *g, const engine_event *ev) {
    engine_event t = *ev;
    t.n_gen = g->n_gen;
    return t;
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
    uint64_t now = ks_now_ns();
    srv_hist_observe(&s->met.e2e, (double)(now - g->t_submit_ns) * 1e-9);
    if (ev->queue_ms >= 0) srv_hist_observe(&s->met.queue, ev->queue_ms * 1e-3);
    srv_metrics_finish(&s->met, ev->finish);
    if (g->tenant >= 0) {
        srv_tenant *t = &s->ts->t[g->tenant];
        atomic_fetch_add_explicit(&t->m_prompt, (unsigned long long)ev->n_prompt,
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&t->m_generation, (unsigned long long)ev->n_gen,
                                  memory_order_relaxed);
    }
    if (ev->n_gen > 0 && g->t_first_ns) {
        double ttft =
            ev->ttft_ms > 0 ? ev->ttft_ms * 1e-3 : (double)(g->t_first_ns - g->t_submit_ns) * 1e-9;
        srv_hist_observe(&s->met.ttft, ttft);
        if (ev->n_gen > 1)
            srv_hist_observe(&s->met.tpot,
                             (double)(ks_now_ns() - g->t_first_ns) * 1e-9 / (ev->n_gen - 1));
    }
    srv__gen_release_tenant(g);
    // the ids hold the client's x-request-id: log values, never raw text
    char id[4 * sizeof g->id + 3], rid[4 * sizeof g->rid + 3];
    srv_log_value(g->id, id, sizeof id);
    srv_log_value(g->rid, rid, sizeof rid);
    if (s->log_content) {
        const srv_buf *t = g->stream ? &g->text : &g->ch[0].text;
        ks_log(KS_LOG_INFO, "request %s output: %.*s", id, (int)t->len, t->p ? t->p : "");
    }
    ks_log(KS_LOG_INFO,
           "request %s: %s, %d prompt tokens (%d cached), %d generated, finish %d%s%s "
           "request_id=%s",
           id, srv_route_name(g->api), ev->n_prompt, ev->n_cached, ev->n_gen, (int)ev->finish,
           ev->errmsg[0] ? ": " : "", ev->errmsg, rid);
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
 * top_logprobs, text_offset}, at text offset *off (advanced). A prompt
 * token (echo) moves the offset by its text without special tokens (BOS is
 * not in the echoed prompt); the first has null logprobs, as OpenAI's. */
static void srv__lp_completion(srv_gen *g, json_t *lp, const engine_event *ev, size_t *off) {
    const tok_vocab *v = g->s->vocab;
    char piece[256];
    size_t n = tok_piece(v, ev->token, true, piece, sizeof piece);
    if (n > sizeof piece) n = sizeof piece;
    char raw[256];
    size_t adv = ev->prompt ? tok_piece(v, ev->token, false, raw, sizeof raw) : n;
    json_array_append_new(json_object_get(lp, "tokens"), srv__jstr(piece, n));
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)*off));
    *off += adv;
    if (ev->no_logprob) {
        json_array_append_new(json_object_get(lp, "token_logprobs"), json_null());
        json_array_append_new(json_object_get(lp, "top_logprobs"), json_null());
        return;
    }
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
}

static json_t *srv__lp_completion_new(void) {
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

/* The SSE chunk for ev (text and/or logprobs) as choice idx's, NULL when
 * there is nothing. */
static json_t *srv__chunk(srv_gen *g, const engine_event *ev, int idx, bool *oom) {
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
                      "choices", "index", idx, "delta", "content", text, "logprobs", lp,
                      "finish_reason");
    } else {
        json_t *lp = json_null();
        if (has_lp) {
            lp = srv__lp_completion_new();
            // a prompt token's offset is the same in every choice; generated
            // ones continue from the end of the prompt
            size_t off = ev->prompt ? g->ptext_off : g->ch[idx].text_off;
            srv__lp_completion(g, lp, ev, &off);
            if (!ev->prompt) g->ch[idx].text_off = off;
        }
        j = json_pack("{s:s, s:s, s:I, s:s, s:[{s:o, s:i, s:o, s:n}]}", "id", g->id, "object",
                      "text_completion", "created", (json_int_t)g->created, "model", g->model,
                      "choices", "text", text, "index", idx, "logprobs", lp, "finish_reason");
    }
    if (!j) *oom = true;
    return j;
}

static void srv__submit_error(ks_err e, const ks_errbuf *eb, srv_route route, srv_error *err);

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

/* The answer to a srv__done_mapped event: a refusal by its reason (the
 * table in kvseal/admit.h, as engine_submit's), else PEER_CLOSED and IO 502,
 * TIMEOUT 504, AGAIN 503, anything else 500; the message is the event's. */
static void srv__done_error(const srv_gen *g, const engine_event *ev, srv_error *err) {
    ks_errbuf eb;
    memset(&eb, 0, sizeof eb);
    eb.code = ev->err;
    eb.reason = ev->reason;
    snprintf(eb.msg, sizeof eb.msg, "%s",
             ev->errmsg[0] ? ev->errmsg
             : ev->err     ? ks_strerror(ev->err)
                           : "the request was rejected");
    if (ev->reason) {
        srv__submit_error(ev->err, &eb, g->route, err);
        return;
    }
    switch (ev->err) {
    case KS_ERR_AGAIN:
        srv_refuse(err, ADMIT_WORKER_UNAVAILABLE, NULL, "%s", eb.msg);
        break;
    case KS_ERR_PEER_CLOSED:
    case KS_ERR_IO:
        srv_refuse(err, ADMIT_UPSTREAM_ERROR, NULL, "%s", eb.msg);
        break;
    case KS_ERR_TIMEOUT:
        srv_refuse(err, ADMIT_UPSTREAM_TIMEOUT, NULL, "%s", eb.msg);
        break;
    default:
        srv_fail(err, 500, "internal_error", "%s", eb.msg);
    }
}

/* Error details of an aborted/failed request, in the route's shape. */
static void srv__gen_error(const srv_gen *g, const engine_event *ev, srv_error *err) {
    // a drain that ran out aborts with CANCELLED (set_online); other aborts
    // during a drain (a queue timeout, a lost worker) keep their own error
    bool shut = atomic_load_explicit(&g->s->draining, memory_order_acquire) &&
                ev->finish == ENGINE_FINISH_ABORT && ev->err == KS_ERR_CANCELLED;
    if ((g->gone && atomic_load(&g->s->stopping)) || shut)
        srv_refuse(err, ADMIT_SHUTDOWN_ABORTED, NULL, NULL);
    else if (srv__done_mapped(ev))
        srv__done_error(g, ev, err);
    else if (ev->finish == ENGINE_FINISH_ABORT)
        srv_refuse(err, ADMIT_RUN_ABORTED, NULL, "the request was aborted: %s",
                   ev->errmsg[0] ? ev->errmsg : "model taken offline or queue timeout");
    else
        srv_fail(err, 500, "internal_error", "the request failed: %s",
                 ev->errmsg[0] ? ev->errmsg : ks_strerror(ev->err));
}

// ----------------------------------------------------------------------------
// Generation: tool calls and reasoning (toolcall.h)

/* The formats this server's chat answers use: --tool-call-format and
 * --reasoning-format, else what the chat template rendered with tools
 * (--chat-template-file's, the GGUF's tool_use variant or its main one)
 * shows. Can't fail: no template has no markers. */
static void srv__toolcall_setup(server *s) {
    const char *src = chat_tmpl_source(s->chat, true);
    s->tc_format = s->o.tool_call_format >= 0 && s->o.tool_call_format < TOOLCALL__COUNT
                       ? (toolcall_format)s->o.tool_call_format
                       : toolcall_format_detect(src);
    if (s->o.reasoning_format != 0 &&
        !toolcall_think_detect(src, &s->think_open, &s->think_close) && s->o.reasoning_format == 1)
        s->think_open = "<think>", s->think_close = "</think>";
    ks_log(KS_LOG_INFO, "chat answers: tool calls in format %s, reasoning %s%s%s",
           toolcall_format_name(s->tc_format), s->think_open ? "split at " : "left in content",
           s->think_open ? s->think_open : "", s->think_open ? s->think_close : "");
}

/* tool_choice "required" or a named function: rq's grammar becomes one
 * call in the server's tool-call format (toolcall_grammar), so decoding
 * can only write a call the parser reads back. False with *err (400) when
 * the request also constrains the output otherwise, or the format has no
 * grammar. */
static bool srv__tool_choice_grammar(server *s, srv_request *rq, srv_error *err) {
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
static ks_err srv__gen_toolcall(server *s, srv_gen *g, const srv_request *rq, const char *prompt,
                                size_t len) {
    const toolcall_req *tr = &rq->tc;
    bool calls = tr->tools && tr->choice != TOOLCALL_CHOICE_NONE && s->tc_format != TOOLCALL_NONE;
    if (!calls && !s->think_open) return KS_OK;
    g->tc_tools = tr->tools ? json_incref((json_t *)tr->tools) : NULL;
    g->tc_cfg = (toolcall_cfg){
        .format = calls ? s->tc_format : TOOLCALL_NONE,
        .think_open = s->think_open,
        .think_close = s->think_close,
        .in_reasoning = toolcall_prompt_opens_think(prompt, len, s->think_open),
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
    if (tok_piece(g->s->vocab, ev->token, false, piece, sizeof piece) != 0) return true;
    size_t n = tok_piece(g->s->vocab, ev->token, true, piece, sizeof piece);
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
static bool srv__tc_stream(srv_gen *g, int idx, const engine_event *ev) {
    toolcall_parser *tc = g->ch[idx].tc;
    srv_buf t = {0};
    toolcall_delta d;
    bool ok =
        srv__tc_text(g, ev, &t) && toolcall_parser_push(tc, t.p ? t.p : "", t.len, &d) == KS_OK;
    srv_buf_free(&t);
    json_t *lp = NULL;
    if (ok && g->logprobs && ev->token >= 0)
        lp = json_pack("{s:[o]}", "content",
                       srv__lp_entry(g->s->vocab, ev->token, ev->sr.logprob, true, &ev->sr));
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
static bool srv__anth_stream_event(srv_gen *g, const engine_event *ev) {
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
    bool oom = false, ok = true;
    int idx = g->cur;
    if (ev->prompt) { // echo: a prompt token's logprobs, the same in every choice
        for (int i = 0; ok && i < g->n_ch * srv__fanout(g); i++)
            ok = srv__sse_put(g, srv__chunk(g, ev, i, &oom), oom);
        char raw[256];
        g->ptext_off += tok_piece(g->s->vocab, ev->token, false, raw, sizeof raw);
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
                          srv_usage_json(ev->n_prompt, ev->n_gen, ev->n_cached));
        ok = j && srv_sse_json(&g->out, j);
        json_decref(j);
    }
    if (!ok || !g->done) return ok; // other choices still running
    if (g->include_usage && g->route != SRV_ROUTE_WORKERS) {
        json_t *j =
            json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", g->id, "object",
                      g->route == SRV_ROUTE_CHAT ? "chat.completion.chunk" : "text_completion",
                      "created", (json_int_t)g->created, "model", g->model, "choices", "usage",
                      srv_usage_json(ev->n_prompt, g->n_gen, ev->n_cached));
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
static enum MHD_Result srv__stream_start(server *s, struct MHD_Connection *c, srv_gen *g,
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

// ----------------------------------------------------------------------------
// Generation: non-streaming

/* The error of a request whose client is gone: 503 while the server stops,
 * else 499. A vanished client gets nothing (MHD notices when it writes):
 * 499 is for the log and metrics. */
static void srv__gone_error(server *s, srv_error *err) {
    if (atomic_load(&s->stopping))
        srv_refuse(err, ADMIT_SHUTDOWN_ABORTED, NULL, NULL);
    else
        srv_refuse(err, ADMIT_CLIENT_CLOSED, NULL, NULL);
}

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
static enum MHD_Result srv__gen_collect(server *s, struct MHD_Connection *c, srv_gen *g,
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
                    ch->lp, srv__lp_entry(s->vocab, ev.token, ev.sr.logprob, true, &ev.sr));
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
    if (g->route == SRV_ROUTE_MESSAGES) {
        json_t *m = srv__anth_answer(g, &g->ch[0].text, &total);
        srv_route api = g->api;
        srv__gen_free(g);
        if (m) return srv__reply_json(s, c, api, 200, m);
        srv_error err;
        srv_fail(&err, 500, "internal_error", "out of memory");
        return srv__reply_error(s, c, api, &err);
    }
    json_t *usage = srv_usage_json(total.n_prompt, total.n_gen, total.n_cached);
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
                                g->route == SRV_ROUTE_CHAT ? "chat.completion" : "text_completion",
                                "created", (json_int_t)g->created, "model", g->model, "choices",
                                choices, "usage", usage)
                    : NULL;
        if (!choices) json_decref(usage);
    }
    srv_route route = g->api;
    srv__gen_free(g);
    return srv__reply_json(s, c, route, 200, j);
}

// ----------------------------------------------------------------------------
// Generation: request -> engine

/* Maps a backend's refusal to the client's error: the reason the refusing
 * process put in eb (kvseal/admit.h) gives status and code, its message is
 * the client's; an error that is not a refusal is a 500. */
static void srv__submit_error(ks_err e, const ks_errbuf *eb, srv_route route, srv_error *err) {
    admit_reason r = (admit_reason)eb->reason;
    if (r == ADMIT_OK || r >= ADMIT__COUNT) {
        srv_fail(err, 500, "internal_error", "cannot start the request: %s",
                 eb->msg[0] ? eb->msg : ks_strerror(e));
        return;
    }
    const char *pparam = route == SRV_ROUTE_COMPLETIONS  ? "prompt"
                         : route == SRV_ROUTE_EMBEDDINGS ? "input"
                                                         : "messages";
    srv_refuse(err, r, r == ADMIT_CONTEXT_LENGTH || r == ADMIT_KV_CAPACITY ? pparam : NULL, "%s",
               eb->msg[0] ? eb->msg : admit_reason_info(r)->msg);
}

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
                 s->o.n_ctx, (long long)g->n_prompt + g->max_tokens, g->n_prompt, g->max_tokens);
}

/* Issue 12's request fields against this server: logit_bias ids within
 * the vocabulary; n / best_of > 1 only on a backend that runs choices
 * (submit_n: kvseal serve and the cluster router). False with err set
 * otherwise. */
static bool srv__gen_choices(server *s, const srv_request *rq, srv_error *err) {
    int32_t V = tok_n_vocab(s->vocab);
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

/* A generation on route api (CHAT, COMPLETIONS, WORKERS, MESSAGES or
 * WORKERS_CHAT): errors and metrics in api's shape, the answer in route's
 * (WORKERS_CHAT answers as CHAT). */
static enum MHD_Result srv__generate(server *s, struct MHD_Connection *c, srv_route api,
                                     const char *url_model, srv_conn *sc) {
    srv_route route = api == SRV_ROUTE_WORKERS_CHAT ? SRV_ROUTE_CHAT : api;
    bool chat_like = route == SRV_ROUTE_CHAT || route == SRV_ROUTE_MESSAGES; // tools, reasoning
    srv_error err;
    int tenant = srv__auth(s, c, api, &err);
    if (tenant < 0) return srv__reply_error(s, c, api, &err);
    if (atomic_load_explicit(&s->draining, memory_order_acquire)) {
        srv_refuse(&err, ADMIT_DRAINING, NULL,
                   "the server is shutting down and takes no new requests; retry on another "
                   "instance");
        return srv__reply_error(s, c, api, &err);
    }
    srv_request rq;
    const char *body = sc->body.p ? sc->body.p : "";
    if (route == SRV_ROUTE_MESSAGES ? !srv_anth_parse(body, sc->body.len, &rq, &err)
                                    : !srv_request_parse(route, body, sc->body.len, &rq, &err))
        return srv__reply_error(s, c, api, &err);
    const char *model_name = url_model ? url_model : rq.model;
    char *text = NULL;
    tok_span *spans = NULL; // where the request's text is in a rendered chat
    size_t n_spans = 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    srv_gen *g = NULL;
    int held = -1;             // tenant admitted here, until g takes it over
    int64_t held_reserved = 0; // tokens it took from the tenant's bucket
    int64_t held_charge = 0;   // tokens to charge if refused as too long
    if (!srv__name_ok(s, model_name)) {
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model",
                   "The model '%s' does not exist; this server serves '%s'", model_name,
                   srv__primary_name(s));
        goto fail;
    }
    ks_errbuf eb = {0};
    bool chat = rq.msgs != NULL;
    bool add_special = true; // BOS/EOS by the vocabulary; a Jinja template writes its own
    if (chat) {
        ks_err e =
            srv_chat_render(s->chat, s->vocab, &rq, &text, &add_special, &spans, &n_spans, &err, &eb);
        if (e == KS_ERR_AGAIN) goto fail; // refused: err is filled
        if (e) {
            if (e == KS_ERR_NOMEM)
                srv_fail(&err, 500, "internal_error", "%s", eb.msg);
            else
                srv_refuse(&err, ADMIT_INVALID, "messages", "%s", eb.msg);
            goto fail;
        }
    }
    const char *ptext = chat ? text : rq.prompt;
    size_t ptext_len = strlen(ptext);
    int32_t max_tokens = rq.max_tokens;
    // issue 12: n / best_of choices, logit_bias, echo (srv__gen_choices)
    int n_ch = rq.best_of;
    if (!srv__gen_choices(s, &rq, &err)) goto fail;
    if (max_tokens == 0) n_ch = 1; // echo only: one prompt, answered n times
    if (max_tokens < 0 && route == SRV_ROUTE_COMPLETIONS) max_tokens = 16; // OpenAI's default
    if (max_tokens < 0 && route == SRV_ROUTE_WORKERS) max_tokens = 256;    // Workers AI's
    // Issue 8: the prompt's bytes give a lower bound on its tokens; a prompt
    // that cannot fit even so is refused before any tokenizing, with the
    // engine's 400. So no request tokenizes more than about n_ctx *
    // max_token_bytes bytes. Issue 38: it is charged as a prompt tokenized
    // and refused as too long is (n_ctx + 1 tokens, where tokenizing stops),
    // within the tenant's limits: a tenant at its limit gets the 429 instead.
    if (!srv_prompt_fits(s->o.n_ctx, ptext_len, s->max_token_bytes, max_tokens, route, &err)) {
        held_reserved = held_charge = (int64_t)s->o.n_ctx + 1;
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
    int64_t min_prompt = srv_prompt_min_tokens(ptext_len, s->max_token_bytes);
    held_reserved = max_tokens < 0 ? (int64_t)s->o.n_ctx * n_ch
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
    ks_err tke = tok_encode_marked(s->vocab, ptext, ptext_len, add_special, chat, spans, n_spans,
                                   (size_t)s->o.n_ctx, &ids, &n_ids, &eb);
    free(spans);
    spans = NULL;
    if (tke) {
        srv_fail(&err, 500, "internal_error", "tokenizer: %s", eb.msg);
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

    if (!(g = calloc(1, sizeof *g))) {
        srv_fail(&err, 500, "internal_error", "out of memory");
        goto fail;
    }
    g->s = s;
    pthread_mutex_init(&g->mu, NULL);
    srv__count_inflight(s, sc);
    g->route = route;
    g->api = api;
    g->n_prompt = n_prompt;
    g->max_tokens = max_tokens;
    g->reserved = held_reserved;
    g->n_ch = n_ch; // the tenant's slots too (srv_tenants_admit_n)
    g->tenant = held; // g releases the tenant from here on
    held = -1;
    g->created = (long long)time(NULL);
    g->logprobs = rq.logprobs;
    g->top = rq.top_logprobs;
    g->include_usage = rq.include_usage;
    g->fd = -1;
    snprintf(g->model, sizeof g->model, "%s", model_name ? model_name : srv__primary_name(s));
    // the completion's id is the request's x-request-id behind OpenAI's (or
    // Anthropic's) prefix, as vLLM does; without request state, a random one
    // of the same form
    if (ri)
        memcpy(g->rid, ri->rid, sizeof g->rid);
    else
        srv_request_id_new(g->rid, sizeof g->rid);
    snprintf(g->id, sizeof g->id, "%s%s",
             route == SRV_ROUTE_COMPLETIONS ? "cmpl-"
             : route == SRV_ROUTE_MESSAGES  ? "msg_"
                                            : "chatcmpl-",
             g->rid);
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
    if (chat_like && !srv__tool_choice_grammar(s, &rq, &err)) goto fail;
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
    free(text);
    free(spans);
    srv_request_free(&rq);
    return srv__reply_error(s, c, api, &err);
}

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
                                  .n_tokens = (int32_t)g->erq.in[i].n_ids};
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
static enum MHD_Result srv__embed_collect(server *s, struct MHD_Connection *c, srv_gen *g,
                                          srv_conn *sc) {
    const int32_t E = model_hp(s->m)->n_embd;
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
static int64_t srv__embed_bound(const server *s) {
    int64_t b = s->o.embed_max_tokens > 0 ? s->o.embed_max_tokens : SERVER_EMBED_MAX_TOKENS;
    return b < s->o.n_ctx ? s->o.n_ctx : b;
}

/* POST /v1/embeddings (OpenAI's shape). url_model: a model named by the URL
 * (a Workers-AI-style route), else NULL and the body's "model" is checked;
 * shape: the route whose error shape refusals take (SRV_ROUTE_EMBEDDINGS,
 * or SRV_ROUTE_WORKERS for Workers AI's envelope; the answer itself is
 * OpenAI's list). Auth, tenant limits (the inputs' tokens count) and
 * admission as the generation routes; each input runs as its own backend
 * request (its own sequence and pages), up to SRV_EMBED_WINDOW at once so
 * they batch together. The glue for /accounts/{id}/ai/v1/embeddings:
 * return srv__embeddings(s, c, NULL, sc, SRV_ROUTE_WORKERS). */
static enum MHD_Result srv__embeddings(server *s, struct MHD_Connection *c, const char *url_model,
                                       srv_conn *sc, srv_route shape) {
    const srv_route route = shape;
    srv_error err;
    int tenant = srv__auth(s, c, route, &err);
    if (tenant < 0) return srv__reply_error(s, c, route, &err);
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
    const int32_t E = model_hp(s->m)->n_embd;
    if (!srv__name_ok(s, model_name)) {
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model",
                   "The model '%s' does not exist; this server serves '%s'", model_name,
                   srv__primary_name(s));
        goto fail;
    }
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
    const int64_t bound = srv__embed_bound(s);
    for (int i = 0; i < rq.n; i++) {
        srv_embed_input *x = &rq.in[i];
        bool cut = false;
        if (!x->is_ids) {
            ks_errbuf eb;
            int64_t left = bound - total; // >= 0: checked below for every input
            size_t cap = left < s->o.n_ctx ? (size_t)left : (size_t)s->o.n_ctx;
            if (tok_encode_max(s->vocab, x->text, x->len, true, false, cap, &x->ids,
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
            if (x->ids[k] >= tok_n_vocab(s->vocab)) {
                srv_refuse(
                    &err, ADMIT_INVALID, "input",
                    "input %d, token %zu: id %d is out of range: the vocabulary has %d tokens", i,
                    k, (int)x->ids[k], (int)tok_n_vocab(s->vocab));
                goto fail;
            }
        if (x->n_ids > (size_t)s->o.n_ctx) {
            srv_refuse(&err, ADMIT_CONTEXT_LENGTH, "input",
                       "This model's maximum context length is %d tokens. However, you "
                       "requested %s%zu tokens (%s%zu in the input, 0 for the completion). "
                       "Please reduce the length of the input.",
                       s->o.n_ctx, cut ? "at least " : "", x->n_ids, cut ? "at least " : "",
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
    if (!(g = calloc(1, sizeof *g))) {
        srv_fail(&err, 500, "internal_error", "out of memory");
        goto fail;
    }
    g->s = s;
    pthread_mutex_init(&g->mu, NULL);
    srv__count_inflight(s, sc);
    g->route = SRV_ROUTE_EMBEDDINGS;
    g->shape = shape;
    g->etenant = s->ts->t[tenant].name;
    g->reserved = total;
    g->n_prompt = (int32_t)total;
    g->tenant = held; // g releases the tenant from here on
    held = -1;
    g->created = (long long)time(NULL);
    g->fd = -1;
    g->conn = c;
    g->http11 = sc->http11;
    g->base64 = rq.base64;
    snprintf(g->model, sizeof g->model, "%s", model_name ? model_name : srv__primary_name(s));
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

/* Refuses a /tokenize or /detokenize of `tokens` (at least) as longer than
 * the context, in the words of the engine's refusal. */
static void srv__tokenize_too_long(server *s, bool detok, int64_t tokens, bool at_least,
                                   srv_error *err) {
    srv_refuse(err, ADMIT_CONTEXT_LENGTH, detok ? "tokens" : "content",
               "This model's maximum context length is %d tokens. However, the %s has %s%lld "
               "tokens. Please send a shorter one.",
               s->o.n_ctx, detok ? "token list" : "text", at_least ? "at least " : "",
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
static enum MHD_Result srv__tokenize(server *s, struct MHD_Connection *c, srv_conn *sc,
                                     bool detok) {
    const srv_route route = SRV_ROUTE_TOKENIZE;
    srv_error err;
    int tenant = srv__auth(s, c, route, &err);
    if (tenant < 0) return srv__reply_error(s, c, route, &err);
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
               : !srv_detokenize_parse(body, sc->body.len, tok_n_vocab(s->vocab), &ids, &n,
                                       &model_name, &root, &err))
        goto out;
    if (!detok) model_name = rq.model;
    if (!srv__name_ok(s, model_name)) {
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model",
                   "The model '%s' does not exist; this server serves '%s'", model_name,
                   srv__primary_name(s));
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
        int64_t lo = srv_prompt_min_tokens(rq.len, s->max_token_bytes);
        if (lo > s->o.n_ctx) { // too long by its bytes: no tokenizing at all
            charge = (int64_t)s->o.n_ctx + 1;
            srv__tokenize_too_long(s, false, lo, true, &err);
            goto out;
        }
        ks_errbuf eb;
        if (tok_encode_max(s->vocab, rq.content, rq.len, rq.add_special, rq.parse_special,
                           (size_t)s->o.n_ctx, &ids, &n, &eb)) {
            srv_fail(&err, 500, "internal_error", "tokenizer: %s", eb.msg);
            goto out;
        }
    }
    if (n > (size_t)s->o.n_ctx) {
        charge = (int64_t)n;
        srv__tokenize_too_long(s, detok, (int64_t)n, !detok, &err);
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
        j = srv_tokenize_answer(s->vocab, ids, n, rq.with_pieces);
    } else {
        size_t len = tok_detokenize(s->vocab, ids, n, false, true, NULL, 0);
        char *text = malloc(len + 1);
        if (text) {
            tok_detokenize(s->vocab, ids, n, false, true, text, len + 1);
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

// ----------------------------------------------------------------------------
// Other routes

/* GET /v1/models/{id}: the model object of a name or alias this server
 * serves, else 404 model_not_found in OpenAI's shape. */
static enum MHD_Result srv__model_get(server *s, struct MHD_Connection *c, const char *id) {
    srv_error err;
    if (srv__auth(s, c, SRV_ROUTE_MODELS, &err) < 0) return srv__reply_error(s, c, SRV_ROUTE_MODELS, &err);
    if (!srv__name_ok(s, id)) {
        srv_refuse(&err, ADMIT_MODEL_NOT_FOUND, "model", "The model '%s' does not exist", id);
        return srv__reply_error(s, c, SRV_ROUTE_MODELS, &err);
    }
    return srv__reply_json(s, c, SRV_ROUTE_MODELS, 200,
                           json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", "model", "created",
                                     (json_int_t)time(NULL), "owned_by", "kvseal"));
}

static enum MHD_Result srv__models(server *s, struct MHD_Connection *c) {
    srv_error err;
    if (srv__auth(s, c, SRV_ROUTE_MODELS, &err) < 0)
        return srv__reply_error(s, c, SRV_ROUTE_MODELS, &err);
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

/* GET /metrics. Tenant names and traffic are tenant data: with tenants
 * configured only the scraper's key (--metrics-key) or the admin key reads
 * them, as a bearer token (Prometheus' authorization); no key, a tenant's
 * key or a wrong one gets 401, and with neither key configured the route
 * is off (403). Without tenants (one anonymous tenant) it is open. */
static enum MHD_Result srv__metrics(server *s, struct MHD_Connection *c) {
    if (!s->ts->anonymous) {
        srv_error err;
        const char *key = srv__bearer(c);
        if (!s->ts->has_metrics && !s->ts->has_admin) {
            srv_refuse(&err, ADMIT_ADMIN_DISABLED, NULL,
                       "/metrics is off: with tenants configured it needs a key; start the "
                       "server with --metrics-key (or an admin key) and scrape with "
                       "'Authorization: Bearer <metrics key>'");
            return srv__reply_error(s, c, SRV_ROUTE_METRICS, &err);
        }
        if (!key || !srv_tenants_metrics_ok(s->ts, key, strlen(key))) {
            srv_refuse(&err, ADMIT_AUTH, NULL,
                       key ? "invalid metrics key"
                           : "missing metrics key: send 'Authorization: Bearer <metrics key>'");
            return srv__reply_error(s, c, SRV_ROUTE_METRICS, &err);
        }
    }
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

static void *srv__job_main(void *arg) {
    srv_job *j = arg;
    memset(&j->eb, 0, sizeof j->eb);
    j->err = j->s->b.check_quiescent(j->s->b.impl, j->timeout_ms, &j->eb);
    atomic_store(&j->done, true);
    MHD_resume_connection(j->c);
    return NULL;
}

/* The KV check's answer, once its job is done (the access handler, resumed). */
static enum MHD_Result srv__kv_check_answer(server *s, struct MHD_Connection *c, srv_conn *sc) {
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
static enum MHD_Result srv__kv_check(server *s, struct MHD_Connection *c, srv_conn *sc) {
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

/* POST /admin/models/{name}/offline|online, body or ?abort_running=; GET
 * /admin/kv/check (rest NULL). */
static enum MHD_Result srv__admin(server *s, struct MHD_Connection *c, const char *rest,
                                  srv_conn *sc) {
    srv_error err;
    const char *key = srv__bearer(c);
    if (!s->ts->has_admin) {
        srv_refuse(&err, ADMIT_ADMIN_DISABLED, NULL,
                   "the admin API is disabled: start the server with --admin-key or an "
                   "admin_key in the tenants file");
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    if (!key || !srv_tenants_admin_ok(s->ts, key, strlen(key))) {
        srv_refuse(&err, ADMIT_AUTH, NULL,
                   key ? "invalid admin key"
                       : "missing admin key: send 'Authorization: Bearer <admin key>'");
        return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
    }
    if (!rest) return srv__kv_check(s, c, sc);
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
    s->b.set_online(s->b.impl, online, abort_running);
    ks_log(KS_LOG_WARN, "admin: model %s set %s%s", name, online ? "online" : "offline",
           !online && abort_running ? " (running requests aborted)" : "");
    return srv__reply_json(s, c, SRV_ROUTE_ADMIN, 200,
                           json_pack("{s:s, s:b, s:b}", "model", name, "online", online,
                                     "abort_running", abort_running));
notfound:
    srv_refuse(&err, ADMIT_UNKNOWN_URL, NULL,
               "Invalid URL: use /admin/models/{name}/offline or /online");
    return srv__reply_error(s, c, SRV_ROUTE_ADMIN, &err);
}

// ----------------------------------------------------------------------------
// Dispatch

/* Cloudflare's REST API serves Workers AI under /client/v4: the same
 * routes with that prefix. Returns path without it. */
static const char *srv__cf_path(const char *url) {
    return !strncmp(url, "/client/v4/accounts/", 20) ? url + 10 : url;
}

/* A Workers AI route under /accounts/{account}/ai/ (path without the
 * /client/v4 prefix): WORKERS for run/{model} (the model copied into
 * wmodel), WORKERS_CHAT for the OpenAI-compatible v1/chat/completions,
 * EMBEDDINGS for v1/embeddings, else OTHER. */
static srv_route srv__workers_route(const char *path, char *wmodel, size_t cap) {
    if (strncmp(path, "/accounts/", 10) != 0) return SRV_ROUTE_OTHER;
    const char *acct = path + 10, *slash = strchr(acct, '/');
    if (!slash || slash == acct) return SRV_ROUTE_OTHER;
    if (!strncmp(slash, "/ai/run/", 8) && slash[8] && strlen(slash + 8) < cap) {
        snprintf(wmodel, cap, "%s", slash + 8);
        return SRV_ROUTE_WORKERS;
    }
    if (!strcmp(slash, "/ai/v1/chat/completions")) return SRV_ROUTE_WORKERS_CHAT;
    if (!strcmp(slash, "/ai/v1/embeddings")) return SRV_ROUTE_EMBEDDINGS; // errors: the envelope
    return SRV_ROUTE_OTHER;
}

static srv_route srv__route_of(const char *url);

static enum MHD_Result srv__dispatch(server *s, struct MHD_Connection *c, const char *url,
                                     const char *method, srv_conn *sc) {
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    srv_route route = SRV_ROUTE_OTHER;
    const char *url_model = NULL, *admin_rest = NULL, *model_id = NULL;
    bool admin_kv = false, detok = false, workers_embed = false;
    char wmodel[256];
    if (!strcmp(url, "/v1/chat/completions"))
        route = SRV_ROUTE_CHAT;
    else if (!strcmp(url, "/v1/completions"))
        route = SRV_ROUTE_COMPLETIONS;
    else if (!strcmp(url, "/v1/models"))
        route = SRV_ROUTE_MODELS;
    else if (!strncmp(url, "/v1/models/", 11) && url[11])
        route = SRV_ROUTE_MODELS, model_id = url + 11;
    else if (!strcmp(url, "/v1/embeddings"))
        route = SRV_ROUTE_EMBEDDINGS;
    else if (!strcmp(url, "/tokenize"))
        route = SRV_ROUTE_TOKENIZE;
    else if (!strcmp(url, "/detokenize"))
        route = SRV_ROUTE_TOKENIZE, detok = true;
    else if (!strcmp(url, "/health"))
        route = SRV_ROUTE_HEALTH;
    else if (!strcmp(url, "/metrics"))
        route = SRV_ROUTE_METRICS;
    else if (!strncmp(url, "/admin/models/", 14))
        route = SRV_ROUTE_ADMIN, admin_rest = url + 14;
    else if (!strcmp(url, "/admin/kv/check"))
        route = SRV_ROUTE_ADMIN, admin_kv = true;
    else if (!strcmp(url, "/v1/messages"))
        route = SRV_ROUTE_MESSAGES;
    else if ((route = srv__workers_route(srv__cf_path(url), wmodel, sizeof wmodel)) ==
             SRV_ROUTE_WORKERS)
        url_model = wmodel;
    else if (route == SRV_ROUTE_EMBEDDINGS)
        workers_embed = true;
    srv_error err;
    if (route == SRV_ROUTE_OTHER) { // in the shape of the API the path belongs to
        srv_refuse(&err, ADMIT_UNKNOWN_URL, NULL, "Invalid URL (%s %s)", method, url);
        return srv__reply_error(s, c, srv__route_of(url), &err);
    }
    bool want_get = route == SRV_ROUTE_MODELS || route == SRV_ROUTE_HEALTH ||
                    route == SRV_ROUTE_METRICS || admin_kv;
    if (want_get ? !get : !post) {
        srv_refuse(&err, ADMIT_METHOD, NULL, "Method %s is not allowed on %s; use %s", method, url,
                   want_get ? "GET" : "POST");
        return srv__reply_error(s, c, route, &err);
    }
    if (sc->too_large) {
        srv_refuse(&err, ADMIT_TOO_LARGE, NULL,
                   "request body of %zu bytes exceeds the limit of %zu bytes", sc->body_seen,
                   s->o.max_body_bytes);
        return srv__reply_error(s, c, route, &err);
    }
    switch (route) {
    case SRV_ROUTE_CHAT:
    case SRV_ROUTE_COMPLETIONS:
    case SRV_ROUTE_WORKERS:
    case SRV_ROUTE_MESSAGES:
    case SRV_ROUTE_WORKERS_CHAT:
        return srv__generate(s, c, route, url_model, sc);
    case SRV_ROUTE_MODELS:
        return model_id ? srv__model_get(s, c, model_id) : srv__models(s, c);
    case SRV_ROUTE_EMBEDDINGS:
        return srv__embeddings(s, c, NULL, sc,
                               workers_embed ? SRV_ROUTE_WORKERS : SRV_ROUTE_EMBEDDINGS);
    case SRV_ROUTE_TOKENIZE:
        return srv__tokenize(s, c, sc, detok);
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
    const char *path = srv__cf_path(url);
    return !strcmp(url, "/v1/chat/completions")                          ? SRV_ROUTE_CHAT
           : !strcmp(url, "/v1/completions")                             ? SRV_ROUTE_COMPLETIONS
           : !strcmp(url, "/v1/embeddings")                              ? SRV_ROUTE_EMBEDDINGS
           : !strcmp(url, "/v1/messages")                                ? SRV_ROUTE_MESSAGES
           : !strncmp(path, "/accounts/", 10) && strstr(path, "/ai/v1/") ? SRV_ROUTE_WORKERS_CHAT
           : !strncmp(path, "/accounts/", 10)                            ? SRV_ROUTE_WORKERS
                                                                         : SRV_ROUTE_OTHER;
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
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, HEAD, OPTIONS");
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
        return srv__kv_check_answer(s, c, sc);
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
                       "the path may not contain an encoded slash (%%2F) or NUL (%%00)");
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
        // refuse an announced oversized body before reading any of it
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (*end == '\0' && n > s->o.max_body_bytes) {
                sc->too_large = true;
                sc->body_seen = (size_t)n;
                srv_refuse(&err, ADMIT_TOO_LARGE, NULL,
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
    o->max_connections = 4096;
    o->max_connections_per_ip = 256;
    o->idle_timeout_s = 120;
    o->request_timeout_s = 10;
    o->tool_call_format = -1;
    o->reasoning_format = -1;
}

// The local engine as a backend: engine.h's calls, with void * handles.
static ks_err srv__eng_submit(void *impl, const engine_params *p, void **req, ks_errbuf *eb) {
    engine_req *r = NULL;
    ks_err e = engine_submit(impl, p, &r, eb);
    *req = r;
    return e;
}
static ks_err srv__eng_submit_n(void *impl, const engine_params *p, int n, void **reqs,
                                ks_errbuf *eb) {
    engine_req *r[ENGINE_MAX_N] = {0};
    ks_err e = engine_submit_n(impl, p, n, r, eb);
    for (int i = 0; i < n && i < ENGINE_MAX_N; i++)
        reqs[i] = r[i];
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
static void srv__eng_set_notify(void *req, void (*fn)(void *), void *ctx) {
    engine_req_set_notify(req, fn, ctx);
}
static ks_err srv__eng_check(void *impl, uint32_t timeout_ms, ks_errbuf *eb) {
    return engine_check_quiescent(impl, timeout_ms, eb);
}

static ks_err srv__eng_embed_submit(void *impl, const engine_embed_params *p, void **req,
                                    ks_errbuf *eb) {
    engine_req *r = NULL;
    ks_err e = engine_embed_submit(impl, p, &r, eb);
    *req = r;
    return e;
}
static ks_err srv__eng_embed_vector(void *req, float *out, int32_t cap) {
    return engine_req_embedding(req, out, cap);
}

void server_engine_backend(engine *e, server_backend *out) {
    *out = (server_backend){.impl = e,
                            .submit = srv__eng_submit,
                            .next = srv__eng_next,
                            .cancel = srv__eng_cancel,
                            .release = srv__eng_release,
                            .set_notify = srv__eng_set_notify,
                            .is_online = srv__eng_is_online,
                            .set_online = srv__eng_set_online,
                            .get_stats = srv__eng_get_stats,
                            .check_quiescent = srv__eng_check,
                            .submit_n = srv__eng_submit_n,
                            .embed_submit = srv__eng_embed_submit,
                            .embed_vector = srv__eng_embed_vector};
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
    s->m = m;
    s->vocab = model_vocab(m);
    pthread_mutex_init(&s->lmu, NULL);
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
    if (o->metrics_key) srv_tenants_set_metrics(s->ts, o->metrics_key);
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
    s->log_content = o->log_content || s->ts->log_content;
    // the chat template: compiled and test-rendered now, so a template this
    // server cannot run stops it here, naming the file and the reason
    if ((err = chat_tmpl_load(model_gguf(m), s->vocab, o->chat_template_file, &s->chat, eb)))
        goto fail;
    if (chat_tmpl_is_plain(s->chat))
        ks_log(KS_LOG_INFO, "chat template: none in the model, chat uses the plain format");
    else
        ks_log(KS_LOG_INFO, "chat template: %s%s", chat_tmpl_origin(s->chat),
               chat_tmpl_source(s->chat, true) != chat_tmpl_source(s->chat, false)
                   ? " (+ tokenizer.chat_template.tool_use for requests with tools)"
                   : "");
    srv__toolcall_setup(s); // its formats come from the template

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
    s->d = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, srv__access, s, MHD_OPTION_EXTERNAL_LOGGER,
        srv__mhd_log, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED,
        srv__completed, s, MHD_OPTION_NOTIFY_CONNECTION, srv__conn_notify, s,
        MHD_OPTION_URI_LOG_CALLBACK, srv__uri_log, s, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)SRV_HTTP_THREADS, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(o->max_connections ? o->max_connections : 4096),
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_connections_per_ip,
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
    if (s->sweeper_on) {
        atomic_store(&s->sweeper_stop, true);
        pthread_join(s->sweeper, NULL);
    }
    srv_tenants_free(s->ts);
    chat_tmpl_free(s->chat);
    pthread_mutex_destroy(&s->lmu);
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
    chat_tmpl_free(s->chat);
    pthread_mutex_destroy(&s->lmu);
    free(s);
}

const char *server_chat_template(const server *s, bool tools) {
    return s ? chat_tmpl_source(s->chat, tools) : NULL;
}
