/* http_int.h — the HTTP front's private parts, shared by its rooms and by
 * nothing else: the server object, a connection's and a request's state,
 * one generation in flight (srv_gen), and the calls the rooms make of each
 * other. The rooms, each calling only those listed before it:
 *   conn.c     connection work: request state, auth, answer headers, replies
 *   pending.c  the pending request an answer waits on: its life, its events,
 *              its errors
 *   answer.c   a generation's answer: tool calls and reasoning, Anthropic's
 *              message, the non-streamed answer
 *   stream.c   a generation's streamed answer (SSE)
 *   generate.c one generation: request -> engine
 *   routes.c   the other routes: embeddings, tokenize, models, health,
 *              metrics, admin
 *   backend.c  the local engine as a server_backend
 *   http.c     the daemon, the route table and the sweeper
 * See http.c's comment for the threading and the suspend/resume protocol. */
#ifndef KS_SERVER_HTTP_INT_H
#define KS_SERVER_HTTP_INT_H

#include "server_int.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

typedef struct srv_gen srv_gen;
typedef struct srv_sock srv_sock;

/* One catalog entry: what a request for that model is tokenized, admitted
 * and answered with. Entry i is the backend's engine_params.model i. */
typedef struct srv_model {
    int index;              /* engine_params.model */
    const model *m;         /* borrowed */
    const tok_vocab *vocab; /* model's */
    size_t max_token_bytes; /* tok_max_token_bytes(vocab): prompt bytes -> tokens bound */
    chat_tmpl *chat;        /* owned: the model's chat template (or PLAIN) */
    int32_t n_ctx;          /* its per-request limit */
    const char *name;       /* its own name; borrowed */
    const char *const *aliases; /* (n_aliases) borrowed */
    int n_aliases;
    /* chat answers (toolcall.h), from the template and the options */
    toolcall_format tc_format;            /* how tool calls are written */
    const char *think_open, *think_close; /* NULL: reasoning stays content */
} srv_model;

struct server {
    server_opts o;          /* copy; the strings stay borrowed */
    server_backend b;       /* copy; b.impl borrowed */
    srv_model *mods;        /* (n_mods) the catalog, owned; mods[0] is server_create's model */
    int n_mods;
    srv_tenants *ts;        /* owned */
    srv_resp_store *resp;   /* owned: /v1/responses' stored responses; NULL: none kept */
    bool log_content;
    srv_metrics met;
    struct MHD_Daemon *d;
    atomic_bool mhd_starting; /* in MHD_start_daemon: its errors are ours to say, once */
    pthread_t mhd_starter;    /* the thread in MHD_start_daemon */
    char mhd_start_msg[256];  /* MHD's first message then (mhd_starter's), for the error */
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
    bool pool_map;        /* GET /admin/pool (ui.c), not the KV check */
    engine_map *map;      /* its answer: the backend's page map */
    engine_stats st;      /* and the engine's counters */
} srv_job;

/* Per-connection request state (MHD's con_cls): the buffered body. */
typedef struct srv_conn {
    srv_buf body;
    size_t body_seen; /* bytes received (counted past the limit too) */
    size_t body_limit; /* this request's body bound: max_body_bytes, or an adapter upload's */
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
    const srv_model *sm; /* the catalog entry it runs on */
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
    int32_t n_drafted, n_accepted; /* speculative decoding, over the choices done */
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
    /* responses (route RESPONSES) */
    srv_resp_req rx; /* its echoed parameters, conversation items, store */
    srv_resp_out ro; /* its output items (and events, streamed) */
};

// ----------------------------------------------------------------------------
// Routes (http.c's table srv__routes: one row per method and path)

/* Who may call a route; the dispatcher checks it before the handler runs. */
typedef enum srv_auth {
    SRV_AUTH_NONE = 0,    /* anyone (/health) */
    SRV_AUTH_TENANT = 1,  /* a tenant's API key (srv__auth): srv_call.tenant */
    SRV_AUTH_ADMIN = 2,   /* the admin key (srv__auth_admin) */
    SRV_AUTH_METRICS = 3, /* the scraper's or the admin key (srv__auth_metrics) */
} srv_auth;

/* What a handler is called with, besides the server and the connection. */
typedef struct srv_call {
    srv_conn *sc;     /* the connection's request: its buffered body */
    srv_route route;  /* the row's route: metrics label, error envelope (its dialect) */
    const char *rest; /* a prefix row: the path past the prefix (Workers AI's model,
                         a model id, an admin path); NULL for an exact row */
    int tenant;       /* SRV_AUTH_TENANT: the caller's tenant; else -1 */
    const char *path; /* the request's path (MHD's, decoded) */
    const char *method; /* the row's method ("GET" also for HEAD) */
} srv_call;

/* A route's handler: answers (or suspends) the request. Only from MHD's
 * access callback of c's connection. */
typedef enum MHD_Result srv_handler(server *s, struct MHD_Connection *c, const srv_call *q);

// ----------------------------------------------------------------------------
// conn.c: connection work

/* s as a JSON string, each invalid UTF-8 byte replaced by U+FFFD (token
 * pieces can be lone bytes); NULL on out-of-memory. */
json_t *srv__jstr(const char *s, size_t n);
/* The catalog entry name (NULL: none given, entry 0) names, by its own name
 * or an alias; NULL when no entry has that name. */
const srv_model *srv__model_find(const server *s, const char *name);
/* srv__model_find, and else name read as "MODEL:ADAPTER" (the longest MODEL
 * before a colon that is served): *adapter then points into name at the
 * adapter's name, else NULL. */
/* Whether a query value reads as yes ("1", "true", "yes", any case). */
bool srv__truthy(const char *v);
/* GET, POST /admin/adapters and DELETE /admin/adapters/{tenant}/{name}
 * (adapters.c; the admin key checked by the route's auth). */
enum MHD_Result srv__admin_adapters(server *s, struct MHD_Connection *c, const srv_call *q);
/* Appends to data (/v1/models' list) catalog entry entry's adapters the
 * tenant (an index of s->ts) may use, as "MODEL:ADAPTER" entries whose
 * "parent" is the model (as vLLM lists LoRA modules). */
void srv__models_adapters(server *s, int entry, int tenant, long long created, json_t *data);
/* Loads the tenants file's adapters into the backend (server_create).
 * Errors name the tenant, the adapter and the cause. */
ks_err srv__load_adapters(server *s, ks_errbuf *eb) KS_MUST_USE;
const srv_model *srv__model_split(const server *s, const char *name, const char **adapter /* OUT */);
/* The name the server answers with: the first alias, else the model name (entry 0's). */
const char *srv__primary_name(const server *s);
/* Entry sm's answer name: its first alias, else its own name. */
const char *srv__model_primary(const srv_model *sm);
/* The served names, ", "-separated ("a, b (alias x)"), for a 404's message,
 * into buf[0..cap). */
const char *srv__served_names(const server *s, char *buf, size_t cap);
/* The request state of c's current request, or NULL (no socket context). */
srv_reqinfo *srv__ri(struct MHD_Connection *c);
/* Starts the request state of a new request on c: its x-request-id, and
 * whether its Origin may see the answer. */
void srv__ri_begin(server *s, struct MHD_Connection *c, const char *method, const char *url);
/* Adds the headers every answer carries (x-request-id, CORS, x-ratelimit-*,
 * Retry-After) to r and counts it for its tenant. Only from an MHD callback
 * of c's connection. */
void srv__decorate(server *s, struct MHD_Connection *c, struct MHD_Response *r, int status);
/* Queues an answer with body (copied; NULL: a 500 out-of-memory body) and
 * counts it in the metrics under route. */
enum MHD_Result srv__reply(server *s, struct MHD_Connection *c, srv_route route, int status,
                           const char *body, const char *ctype);
/* srv__reply of j as compact JSON (j is stolen; NULL: out of memory). */
enum MHD_Result srv__reply_json(server *s, struct MHD_Connection *c, srv_route route, int status,
                                json_t *j);
/* srv__reply of err in route's error envelope; counts a refusal. */
enum MHD_Result srv__reply_error(server *s, struct MHD_Connection *c, srv_route route,
                                 const srv_error *err);
/* The bearer token of the request, or NULL. */
const char *srv__bearer(struct MHD_Connection *c);
/* Tenant index for an API request, or -1 with err filled (401, or 400 for
 * two different keys); the key header besides Authorization is the route's
 * dialect's. */
int srv__auth(server *s, struct MHD_Connection *c, srv_route route, srv_error *err);
/* True when the request may read /metrics; else false with err (401/403). */
bool srv__auth_metrics(server *s, struct MHD_Connection *c, srv_error *err);
/* True when the request carries the admin key; else false with err (401/403). */
bool srv__auth_admin(server *s, struct MHD_Connection *c, srv_error *err);

// ----------------------------------------------------------------------------
// pending.c: the pending request an answer waits on

/* Counts sc's request in met.inflight (once) until srv__completed. */
void srv__count_inflight(server *s, srv_conn *sc);
/* A new generation of route on catalog entry sm for the connection sc (counted in flight),
 * its model name name (NULL: sm's primary), holding tenant's reserved
 * tokens: the generation releases the tenant from here on (the caller
 * stops holding it). Everything else zero, fd -1. NULL when out of
 * memory. */
srv_gen *srv__gen_new(server *s, const srv_model *sm, srv_conn *sc, srv_route route,
                      const char *name, int tenant,
                      int64_t reserved);
/* Frees g (NULL: nothing): off the sweeper's list first, then its requests. */
void srv__gen_free(srv_gen *g);
/* A request's event callback: resumes g's connection, or marks a wakeup. */
void srv__gen_notify(void *ctx);
/* Suspends g's connection until its next event; false: an event came, look
 * again now. Only from an MHD callback of g's connection. */
bool srv__gen_suspend(srv_gen *g);
/* Cancels every choice and input of g still running (the sweeper's call). */
void srv__gen_cancel(srv_gen *g);
/* Takes the next event of any choice without waiting: 1 an event, 0 none
 * yet, -1 a choice's events ended without a done event. */
int srv__gen_poll(srv_gen *g, engine_event *ev);
/* ev (a done event) with every choice's completion tokens counted. */
engine_event srv__gen_total(const srv_gen *g, const engine_event *ev);
/* Metrics, the tenant's refund and the log line once g is done. */
void srv__gen_account(srv_gen *g, const engine_event *ev);
/* One chat logprobs entry {token, logprob, bytes, top_logprobs}; new reference. */
json_t *srv__lp_entry(const tok_vocab *v, int32_t id, float lp, bool with_top,
                      const sample_result *sr);
/* Adds ev's token to a completions logprobs object at text offset *off. */
void srv__lp_completion(srv_gen *g, json_t *lp, const engine_event *ev, size_t *off);
/* An empty completions logprobs object; NULL on out-of-memory. */
json_t *srv__lp_completion_new(void);
/* The SSE chunk for ev as choice idx's, NULL when there is nothing (*oom set
 * when it could not be built). */
json_t *srv__chunk(srv_gen *g, const engine_event *ev, int idx, bool *oom);
/* True for a done event whose error maps to its own status (srv__done_error). */
bool srv__done_mapped(const engine_event *ev);
/* The answer to a srv__done_mapped event: its refusal, or 502/503/504/500. */
void srv__done_error(const srv_gen *g, const engine_event *ev, srv_error *err);
/* Error details of an aborted or failed request. */
void srv__gen_error(const srv_gen *g, const engine_event *ev, srv_error *err);
/* Maps a backend's refusal (eb->reason) to the client's error; else a 500. */
void srv__submit_error(ks_err e, const ks_errbuf *eb, srv_route route, srv_error *err);
/* The error of a request whose client is gone: 503 while stopping, else 499. */
void srv__gone_error(server *s, srv_error *err);

// ----------------------------------------------------------------------------
// answer.c: a generation's answer

/* Sets s's tool-call and reasoning formats from the options and the template. */
void srv__toolcall_setup(const server *s, srv_model *sm);
/* Compiles tool_choice's grammar into rq (required or a named function);
 * false with err set when it cannot. */
bool srv__tool_choice_grammar(const srv_model *s, srv_request *rq, srv_error *err);
/* Gives each of g's choices its tool-call/reasoning parser; KS_ERR_NOMEM. */
ks_err srv__gen_toolcall(server *s, srv_gen *g, const srv_request *rq, const char *prompt,
                         size_t len);
/* Streams choice idx's event through its parser; false on out-of-memory. */
bool srv__tc_stream(srv_gen *g, int idx, const engine_event *ev);
/* Takes ev of a Responses answer into g->ro (its events too when
 * streamed); the done event ends it (response.completed or .incomplete,
 * or an error event) and stores it when asked. False on out-of-memory. */
bool srv__resp_event(srv_gen *g, const engine_event *ev);
/* The response object of g's finished answer (ev: its done event, totals
 * counted), stored when the request asked; NULL on out-of-memory. */
json_t *srv__resp_final(srv_gen *g, const engine_event *ev);
/* Streams ev as Anthropic's named events; false on out-of-memory. */
bool srv__anth_stream_event(srv_gen *g, const engine_event *ev);
/* A non-streamed answer: takes the events there are; answers and frees g
 * once done, else suspends with g in sc->gen. */
enum MHD_Result srv__gen_collect(server *s, struct MHD_Connection *c, srv_gen *g, srv_conn *sc);

// ----------------------------------------------------------------------------
// stream.c: a streamed answer

/* Starts (or, resumed, goes on with) g's streamed answer: the status line
 * waits for its first event; a refusal before it is answered as an error. */
enum MHD_Result srv__stream_start(server *s, struct MHD_Connection *c, srv_gen *g, srv_conn *sc);

// ----------------------------------------------------------------------------
// generate.c: one generation

/* A generation on q->route (CHAT, COMPLETIONS, WORKERS, MESSAGES or
 * WORKERS_CHAT): parse, render, tokenize, admit, submit, answer. */
srv_handler srv__generate;
/* A chat request's prompt as the chat template renders it: *text (malloc'd),
 * whether the vocabulary adds BOS/EOS, and where the request's own text is
 * in it (*spans, malloc'd: never control tokens). False with err filled
 * (400 the template refused the conversation, 500 out of memory). */
bool srv__chat_prompt(const srv_model *sm, const srv_request *rq, char **text, bool *add_special,
                      tok_span **spans, size_t *n_spans, srv_error *err);

// ----------------------------------------------------------------------------
// routes.c: the other routes

/* An embeddings request resumed: takes its done inputs, answers when all are. */
enum MHD_Result srv__embed_collect(server *s, struct MHD_Connection *c, srv_gen *g, srv_conn *sc);
/* POST /v1/embeddings, and Workers AI's (q->route WORKERS: its envelope). */
srv_handler srv__embeddings;
/* POST /tokenize. */
srv_handler srv__tokenize;
/* POST /detokenize. */
srv_handler srv__detokenize;
/* POST /v1/messages/count_tokens: {"input_tokens": N}, the prompt tokens
 * /v1/messages would have for the same body. */
srv_handler srv__count_tokens;
/* GET /v1/responses/{id} (q->rest): the caller's tenant's stored response,
 * else 404 (unknown, expired and another tenant's alike). */
srv_handler srv__response_get;
/* DELETE /v1/responses/{id}: removes (wipes) it; 404 as GET. */
srv_handler srv__response_delete;
/* GET /v1/models/{id} (q->rest). */
srv_handler srv__model_get;
/* GET /v1/models. */
srv_handler srv__models;
/* GET /health. */
srv_handler srv__health;
/* GET /metrics. */
srv_handler srv__metrics;
/* The KV check's answer once its job is done (the access handler, resumed). */
enum MHD_Result srv__kv_check_answer(server *s, struct MHD_Connection *c, srv_conn *sc);
/* GET /admin/pool's answer once its job is done (ui.c; the access handler, resumed). */
enum MHD_Result srv__pool_answer(server *s, struct MHD_Connection *c, srv_conn *sc);
/* The web pages and their files (ui.c): GET /, /admin, /ui/...; no key. */
srv_handler srv__ui;
/* GET /admin/pool (ui.c): the KV pool's pages by state and tenant, the
 * queue, the tenants' usage and the isolation counters, for /admin. */
srv_handler srv__pool;
/* GET /admin/kv/check[?timeout_ms=N]. */
srv_handler srv__kv_check;
/* POST /admin/models/{name}/offline|online (q->rest: "{name}/offline"). */
srv_handler srv__admin_model;

#endif /* KS_SERVER_HTTP_INT_H */
