/* server.h — the HTTP front end of `kvseal serve`: OpenAI-compatible and
 * Workers-AI-style routes, SSE streaming, tenants and API keys, admin
 * routes, /health and Prometheus /metrics (module `server`).
 *
 * The server never runs model code: for each request it authenticates the
 * tenant (from the Authorization header only, I7), parses and validates the
 * JSON, renders the chat template, tokenizes, applies the tenant's limits
 * and hands the request to the engine (engine_submit, where admission I4
 * happens); then it pulls engine events and writes them out. Rejections are
 * answered with OpenAI's (or Workers AI's) JSON error shape and the right
 * HTTP status. Design notes: docs/design.md (the invariants and the source
 * tour), and the comment at the top of src/server/http.c (threading model). */
#ifndef KS_SERVER_H
#define KS_SERVER_H

#include "kvseal/base.h"
#include "kvseal/engine.h"
#include "kvseal/model.h"

/* The shortest admin key (--admin-key, a tenants file's admin_key) accepted:
 * a shorter one could be guessed; the cluster secret has the same bound. */
#define SERVER_KEY_MIN_BYTES 16

/* A further model the server fronts (server_opts.more): the backend's
 * catalog entry engine_params.model = its index + 1 (`kvseal router` with
 * several models; `kvseal serve` has none). */
typedef struct server_model {
    const model *m;             /* tokenizer, chat template, n_embd; borrowed */
    const char *name;           /* its own name (file basename); borrowed */
    const char *const *aliases; /* (n_aliases) further names; borrowed */
    int n_aliases;
    int32_t n_ctx;              /* its per-request limit (0: server_opts.n_ctx) */
} server_model;

typedef struct server_opts {
    const char *host;           /* address to bind ("127.0.0.1") */
    int port;                   /* TCP port; 0 picks a free one (server_port) */
    const char *const *aliases; /* (n_aliases) extra model names; borrowed */
    int n_aliases;
    const char *model_name;   /* the model's own name (file basename); borrowed */
    const char *tenants_path; /* tenants JSON file; NULL: one anonymous tenant */
    const char *admin_key;    /* overrides the tenants file's admin_key; NULL: none */
    const char *metrics_key;  /* the scraper's key for /metrics (with tenants, /metrics needs it
                                 or the admin key); overrides the file's metrics_key */
    int32_t embed_max_tokens; /* tokens one embeddings request may hold over all its inputs
                                 (0: SERVER_EMBED_MAX_TOKENS, and never below n_ctx) */
    bool log_content;         /* log prompts/outputs (also set by the tenants file) */
    size_t max_body_bytes;    /* larger request bodies get 413 (1 MiB) */
    int32_t n_ctx;            /* the engine's per-request limit (engine_opts.n_ctx) */
    unsigned max_connections; /* concurrent connections (4096); past it, new ones are closed */
    unsigned max_connections_per_ip; /* concurrent connections per client address (256; 0: no limit) */
    unsigned idle_timeout_s;  /* close a connection idle this long (120; 0: never) */
    unsigned request_timeout_s; /* a request's head and body must arrive within this,
                                   counted from the connection's start or its previous
                                   answer, or 408 and close (10; 0: no limit) */
    const char *chat_template_file; /* Jinja chat template overriding the model's
                                       tokenizer.chat_template; NULL: the model's */
    int tool_call_format;           /* chat tool calls: -1 the chat template's format (default),
                                       else a format server_tool_call_format_parse gave (0: none) */
    int reasoning_format;           /* -1 deepseek when the template has think markers (default),
                                       0 none (reasoning stays in content), 1 deepseek (split into
                                       reasoning_content; <think></think> when the template has none) */
    const char *const *cors_origins; /* (n_cors_origins) origins browsers may call from, or "*"
                                        (any); borrowed. None: CORS off, no CORS headers at all */
    int n_cors_origins;
    const server_model *more; /* (n_more) catalog entries 1.. beside the model given to
                                 server_create (entry 0, named model_name and aliases);
                                 borrowed. A request's `model` picks its entry (unknown: 404
                                 model_not_found naming what is served); /v1/models lists all.
                                 chat_template_file applies to entry 0 (the others use their
                                 own templates); tool_call_format and reasoning_format to all */
    int n_more;
    const char *limits_redis;        /* "HOST:PORT": tenant rate limits shared through redis
                                        with every server pointed at it; NULL: per process */
    const char *limits_redis_prefix; /* its key prefix (NULL: "kvseal:") */
    double limits_local_share;       /* redis unreachable: the fraction of each rate limit this
                                        process admits on its own (0: 1) */
    const char *tls_cert_pem;        /* HTTPS: the certificate chain, PEM text (server_tls_load);
                                        NULL with tls_key_pem NULL: plain HTTP. Borrowed, outliving
                                        the server */
    const char *tls_key_pem;         /* HTTPS: tls_cert_pem's private key, PEM text; borrowed */
    /* /v1/responses' store of finished responses (docs/responses.md), per tenant: */
    uint64_t responses_ttl_s;   /* kept this long (3600; 0: nothing is kept) */
    size_t responses_max;       /* at most this many, oldest evicted first (1000) */
    size_t responses_max_bytes; /* at most this many bytes of JSON (64 MiB) */
    size_t max_adapter_bytes;   /* POST /admin/adapters' body (a GGUF file) may be this large,
                                   when the admin key came with it (1 GiB) */
} server_opts;

#define SERVER_EMBED_MAX_TOKENS 32768 /* server_opts.embed_max_tokens's default */

/* Fills defaults (host 127.0.0.1, port 8080, 1 MiB bodies, 4096
 * connections, 256 per address, 120 s idle timeout, 10 s request timeout,
 * tool-call and reasoning formats from the template (-1), the responses
 * store's bounds (1 hour, 1000 responses, 64 MiB per tenant); everything
 * else zero/NULL). Can't fail. */
void server_opts_default(server_opts *o);

/* What the HTTP front runs requests on: the local engine (`kvseal serve`) or
 * a cluster of prefill and decode workers (`kvseal router`). The calls and
 * their contracts are exactly engine.h's (engine_submit, engine_req_next,
 * ...), with the engine replaced by impl and a request handle by void *.
 * next and cancel are called from HTTP connection threads, concurrently for
 * different requests.
 *
 * A done event may also report a failure the local engine never posts after
 * admission. The answer (non-streamed, or streamed when it is the request's
 * first event: a stream's status line waits for it) is then the error JSON
 * with ev.errmsg and a status from ev.err: INVAL 400, NOSPACE 400
 * (context_length_exceeded) and AGAIN 503 as for a submit error,
 * PEER_CLOSED / IO 502 (code upstream_error), TIMEOUT 504 (upstream_timeout),
 * anything else 500. That applies when ev.state is REJECTED, or when ev.err
 * is none of KS_OK, CANCELLED, INTERNAL, NOMEM and a TIMEOUT with
 * finish ABORT; those keep the engine's answers (ABORT: 503 request_aborted,
 * e.g. a queue timeout; ERROR: 500). After a streamed first token, a failure
 * ends the stream with an error event in the same shape, no [DONE]. */
typedef struct server_backend {
    void *impl;
    /* engine_submit: admission (I4), then enqueue; *req owned by the caller */
    ks_err (*submit)(void *impl, const engine_params *p, void **req /* OUT */, ks_errbuf *eb);
    ks_err (*next)(void *req, engine_event *ev /* OUT */, uint32_t timeout_ms); /* engine_req_next */
    void (*cancel)(void *req);                                                  /* engine_req_cancel */
    void (*release)(void *req);                                                 /* engine_req_release */
    void (*set_notify)(void *req, void (*notify)(void *ctx), void *ctx);        /* engine_req_set_notify */
    bool (*is_online)(void *impl);                                              /* engine_is_online */
    void (*set_online)(void *impl, bool online, bool abort_running);            /* engine_set_online */
    void (*get_stats)(void *impl, engine_stats *out /* OUT */);                 /* engine_get_stats */
    ks_err (*check_quiescent)(void *impl, uint32_t timeout_ms, ks_errbuf *eb);  /* engine_check_quiescent */
    /* engine_submit_n: n > 1 choices of one prompt, choice i seeded seed + i
     * (the router's are independent requests, the engine's share the prompt's
     * pages); NULL when the backend has none: such requests are refused */
    ks_err (*submit_n)(void *impl, const engine_params *p, int n, void **reqs /* OUT: (n) */,
                       ks_errbuf *eb);
    /* Embeddings (NULL: the backend has none, and POST /v1/embeddings answers
     * 501): engine_embed_submit's contract (admission, then enqueue); the
     * handle's events (one done event), cancel, release and set_notify are
     * the calls above. embed_vector is engine_req_embedding: the pooled,
     * normalized vector once the done event (FINISHED) was taken. */
    ks_err (*embed_submit)(void *impl, const engine_embed_params *p, void **req /* OUT */,
                           ks_errbuf *eb);
    ks_err (*embed_vector)(void *req, float *out /* OUT */, int32_t cap);
    /* One catalog entry (engine_params.model) offline or online, as set_online is for
     * all (NULL: the backend has one model; /admin's model parameter then names it) */
    void (*set_model_online)(void *impl, int entry, bool online, bool abort_running);
    bool (*is_model_online)(void *impl, int entry); /* NULL with set_model_online */
    /* POST /admin/models/{id}/load (load true) or /unload: queues catalog entry
     * entry's load, or its unload once idle. KS_OK when queued or already so;
     * KS_ERR_AGAIN (eb says why: requests running) when it cannot unload now;
     * NULL member: the routes answer 404. Any thread. */
    ks_err (*model_load)(void *impl, int entry, bool load, ks_errbuf *eb);
    /* Catalog entry entry's state for /v1/models' "status": "loaded", "loading",
     * "unloaded" (static strings; NULL member: no status is listed). Any thread. */
    const char *(*model_status)(void *impl, int entry);
    /* Prometheus text the backend adds to /metrics (series labelled by model, say),
     * malloc'd, the caller frees it; NULL: none (also the member NULL). Any thread. */
    char *(*metrics_text)(void *impl);
    /* engine_map_pages (NULL: the backend holds no pool, as a router; /admin
     * then shows its counters without a map) */
    ks_err (*map_pages)(void *impl, uint32_t timeout_ms, engine_map **out /* OUT */,
                        ks_errbuf *eb);
    /* LoRA adapters of catalog entry entry: engine_adapter_add, _remove and _list's
     * contracts (engine.h "LoRA adapters"). NULL members: the backend holds none (a
     * request naming an adapter is refused as not found; the admin routes answer 501).
     * Any thread. */
    ks_err (*adapter_add)(void *impl, int entry, const engine_adapter_spec *s, ks_errbuf *eb);
    ks_err (*adapter_remove)(void *impl, int entry, const char *tenant, const char *name,
                             ks_errbuf *eb);
    int (*adapter_list)(void *impl, int entry, const char *tenant, engine_adapter_info *out,
                        int cap);
} server_backend;

/* Parses --tool-call-format's value into server_opts.tool_call_format:
 * "auto" (-1), "none" (0) or a format name (server_tool_call_format_names
 * lists them; aliases such as "deepseek-v3.1" too); false when unknown.
 * Can't fail otherwise. */
bool server_tool_call_format_parse(const char *name, int *out /* OUT */);
/* True when o is a --cors-origin value: "*", or an origin as browsers send
 * it (http:// or https://, a host, an optional :port, no path, printable
 * ASCII, at most 255 bytes). Pure. */
bool server_cors_origin_valid(const char *o);
/* The format names server_tool_call_format_parse takes, comma-separated;
 * static storage. */
const char *server_tool_call_format_names(void);

/* The backend that runs requests on engine e (borrowed). Can't fail. */
void server_engine_backend(engine *e, server_backend *out /* OUT */);

typedef struct server server;

/* Reads the PEM certificate chain cert_path and its private key key_path for
 * server_opts.tls_cert_pem/tls_key_pem, and checks them before anything
 * loads: libmicrohttpd built with TLS (else KS_ERR_UNSUPPORTED), both files
 * readable (KS_ERR_IO, naming the file and errno), a certificate and an
 * unencrypted private key in them (KS_ERR_FORMAT), the key the
 * certificate's (KS_ERR_INVAL). On success *cert_pem and *key_pem are
 * NUL-terminated copies the caller frees (the key with server_tls_free).
 * Blocks on the files; thread-safe. */
ks_err server_tls_load(const char *cert_path, const char *key_path, char **cert_pem /* OUT */,
                       char **key_pem /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Wipes and frees a PEM text server_tls_load returned; accepts NULL. */
void server_tls_free(char *pem);

/* Loads the tenants file, binds and starts serving on internal threads.
 * e and m are borrowed and must outlive the server. Errors: KS_ERR_IO
 * (cannot read the tenants file or the chat template file, cannot bind:
 * message names address and errno), KS_ERR_FORMAT (tenants file or chat
 * template malformed: message says where; a chat template that cannot
 * render a test conversation is KS_ERR_INVAL),
 * KS_ERR_INVAL (bad options), KS_ERR_NOMEM. *out owned by the caller. */
ks_err server_create(const server_opts *o, engine *e, const model *m, server **out /* OUT */,
                     ks_errbuf *eb) KS_MUST_USE;
/* As server_create, on any backend (copied; its impl borrowed and outliving
 * the server). m supplies the tokenizer and chat template. Same errors. */
ks_err server_create_backend(const server_opts *o, const server_backend *b, const model *m,
                             server **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* The chat template text the server renders for requests with tools (tools
 * true) or without; NULL when the model has none (plain format). Owned by
 * s, valid until server_destroy. The tool-call parser picks its format from
 * it. Thread-safe (read-only). */
const char *server_chat_template(const server *s, bool tools);
/* The bound TCP port (the real one when opts.port was 0); can't fail. */
int server_port(const server *s);
/* Stops accepting new connections; requests in flight continue. Thread-safe. */
void server_stop_accepting(server *s);
/* Graceful shutdown, step one: from now on new generation requests get 503
 * server_shutting_down and GET /health answers 503 {"status":"draining"}
 * (load balancers stop sending); requests in flight go on. Thread-safe. */
void server_drain(server *s);
/* Generations the server is still answering (0 once a drain has finished). */
int server_inflight(const server *s);
/* Aborts every request in flight (their engine requests are cancelled),
 * closes all connections, joins the server's threads and frees everything;
 * accepts NULL. Call before engine_destroy. Blocks. */
void server_destroy(server *s);

// ----------------------------------------------------------------------------
// Security event log (engine_opts.on_security_event)

typedef struct server_seclog server_seclog;

/* Opens the security log: every event goes to the log (ks_log_fields) as
 * "SECURITY <json>" (a json log line also carries the event's members) and, when path is non-NULL,
 * is appended to that file (flushed per line). Errors: KS_ERR_IO (cannot open path), KS_ERR_NOMEM.
 * Caller owns *out. */
ks_err server_seclog_open(const char *path, server_seclog **out /* OUT */,
                          ks_errbuf *eb) KS_MUST_USE;
/* engine_opts.on_security_event: ctx is a server_seclog *. Thread-safe. */
void server_seclog_write(void *ctx, const char *json);
/* Number of events written so far; thread-safe. */
uint64_t server_seclog_count(const server_seclog *l);
/* Closes the log; accepts NULL. */
void server_seclog_close(server_seclog *l);

#endif /* KS_SERVER_H */
