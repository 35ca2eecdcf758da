/* server_int.h — the server module's private parts, shared by its files and
 * reached by tests/unit/test_server.c: the error builders and small helpers
 * (errors.c, the floor below), the dialect table and error envelopes
 * (dialect.c), request parsing and validation (api.c), response JSON and SSE
 * framing (api.c), tenants, keys and per-tenant limits (tenants.c), and
 * metrics (metrics.c). Everything here except the tenants' limit counters is
 * pure. */
#ifndef KS_SERVER_INT_H
#define KS_SERVER_INT_H

#include "anthropic.h"
#include "responses.h"
#include "kvseal/admit.h"
#include "kvseal/chat.h"
#include "kvseal/engine.h"
#include "kvseal/sample.h"
#include "kvseal/server.h"
#include "toolcall.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

// ----------------------------------------------------------------------------
// Routes and errors

typedef enum srv_route {
    SRV_ROUTE_CHAT = 0,        /* POST /v1/chat/completions */
    SRV_ROUTE_COMPLETIONS = 1, /* POST /v1/completions */
    SRV_ROUTE_WORKERS = 2,     /* POST /accounts/{a}/ai/run/{model} */
    SRV_ROUTE_MODELS = 3,      /* GET /v1/models */
    SRV_ROUTE_HEALTH = 4,      /* GET /health */
    SRV_ROUTE_METRICS = 5,     /* GET /metrics */
    SRV_ROUTE_ADMIN = 6,       /* POST /admin/models/{name}/offline|online */
    SRV_ROUTE_OTHER = 7,       /* anything else (404/405) */
    SRV_ROUTE_EMBEDDINGS = 8,  /* POST /v1/embeddings */
    SRV_ROUTE_TOKENIZE = 9,    /* POST /tokenize, /detokenize */
    SRV_ROUTE_MESSAGES = 10,     /* POST /v1/messages (Anthropic; anthropic.c) */
    SRV_ROUTE_WORKERS_CHAT = 11, /* POST /accounts/{a}/ai/v1/chat/completions: chat, with
                                    errors in Workers AI's envelope */
    SRV_ROUTE_COUNT_TOKENS = 12, /* POST /v1/messages/count_tokens (Anthropic) */
    SRV_ROUTE_RESPONSES = 13,    /* POST, GET, DELETE /v1/responses[/{id}] (responses.c) */
    SRV_ROUTE_UI = 14,           /* GET /, /admin, /ui/...: the web pages (ui.c) */
    SRV_ROUTE__COUNT = 15,
} srv_route;

/* Label of a route for metrics ("chat_completions", ...); static storage. */
const char *srv_route_name(srv_route r);

/* An error answer: HTTP status and OpenAI's error fields. */
typedef struct srv_error {
    int status;        /* HTTP status */
    const char *type;  /* "invalid_request_error", ...; static storage */
    const char *code;  /* "model_not_found", ... or NULL (JSON null); static storage */
    char param[64];    /* the offending parameter, "" for JSON null */
    char msg[512];     /* human-readable, says what was wrong and why */
    admit_reason reason;   /* a refusal (kvseal_rejections_total), or ADMIT_OK */
    uint16_t workers_code; /* Workers AI errors[].code */
} srv_error;

/* A refusal: status, type, code and Workers AI code from the request
 * contract's table (kvseal/admit.h), the offending parameter (NULL: none)
 * and a printf message (NULL: the table's). Returns false so parsers can
 * `return srv_refuse(...)`. The message is cut to fit and made valid UTF-8
 * (a byte that starts no valid character, e.g. from a model name in the URL
 * or a character the cut split, becomes '?'), so srv_error_json can always
 * encode it. */
bool srv_refuse(srv_error *e, admit_reason r, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A request that was admitted and then failed (5xx, 499): not a refusal,
 * so the status and code are the caller's. Otherwise as srv_refuse. */
bool srv_fail(srv_error *e, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The APIs the server speaks; what differs between them is one row of
 * dialect.c's table (srv_dialect_info), not a branch at each use. */
typedef enum srv_dialect {
    SRV_DIALECT_OPENAI = 0,    /* OpenAI's (and llama.cpp server's) routes */
    SRV_DIALECT_WORKERS = 1,   /* Cloudflare Workers AI: its error envelope */
    SRV_DIALECT_ANTHROPIC = 2, /* Anthropic's Messages API */
    SRV_DIALECT__COUNT = 3,
} srv_dialect;

/* One dialect's row (static storage). */
typedef struct srv_dialect_info {
    const char *name;                         /* "openai", "workers_ai", "anthropic" */
    char *(*error_json)(const srv_error *e);  /* its error body (malloc'd; NULL: out of memory) */
    const char *key_header;  /* a header the API key may come in besides Authorization, or NULL */
    const char *missing_key; /* the 401 message when no key came */
    bool stream_usage;       /* a stream may end with OpenAI's usage chunk (include_usage) */
} srv_dialect_info;

/* The row of dialect d (an unknown d: OpenAI's). Pure; can't fail. */
const srv_dialect_info *srv_dialect_get(srv_dialect d);
/* The dialect whose error envelope route r answers in. Pure; can't fail. */
srv_dialect srv_route_dialect(srv_route r);

/* What a generation route answers with (dialect.c; static storage). */
typedef struct srv_answer_info {
    srv_route answers_as;       /* the answer's shape: WORKERS_CHAT answers as CHAT */
    bool chat;                  /* messages with tools and reasoning (chat, Anthropic's) */
    const char *id_prefix;      /* of the answer's id: "chatcmpl-", "cmpl-", "msg_" */
    int32_t default_max_tokens; /* without max_tokens; -1: up to the context */
    const char *object;         /* "object" of an answer ("chat.completion", ...), or NULL */
    const char *chunk_object;   /* "object" of a streamed chunk, or NULL */
} srv_answer_info;

/* The answer row of generation route r (CHAT, COMPLETIONS, WORKERS,
 * MESSAGES, WORKERS_CHAT); any other route: CHAT's. Pure; can't fail. */
const srv_answer_info *srv_route_answer(srv_route r);

/* Error body in the route's shape (its dialect's error_json): OpenAI {"error":{message,type,param,code}};
 * for SRV_ROUTE_WORKERS and SRV_ROUTE_WORKERS_CHAT, {"result":null,
 * "success":false,"errors":[{code,message}],"messages":[]}; for
 * SRV_ROUTE_MESSAGES, Anthropic's {"type":"error","error":{type,message}}. Returns a malloc'd
 * NUL-terminated string (caller frees) or NULL on out-of-memory. */
char *srv_error_json(srv_route route, const srv_error *e);

// ----------------------------------------------------------------------------
// HTTP framing (RFC 9112), checked before any body byte is read

/* The headers that decide how a request's body is framed and whose it is,
 * as srv__access collects them (MHD keeps every field separately). Values
 * point into the connection (MHD's storage); zero-initialize. */
typedef struct srv_framing {
    int n_content_length;          /* Content-Length fields */
    const char *content_length;    /* the first one's value */
    bool content_length_differ;    /* another one said something else */
    int n_transfer_encoding;       /* Transfer-Encoding fields */
    const char *transfer_encoding; /* a value other than "chunked", or NULL */
    const char *content_encoding;  /* a Content-Encoding other than identity, or NULL */
    int n_authorization;           /* Authorization fields */
    int n_x_api_key;               /* x-api-key fields (Anthropic's clients) */
} srv_framing;

/* Adds one request header to f (names compared case-insensitively);
 * for MHD_get_connection_values. Pure; can't fail. */
void srv_framing_add(srv_framing *f, const char *name, const char *value);
/* True when the body's framing is unambiguous and supported; otherwise
 * fills *err and returns false: 400 two different Content-Lengths, 400
 * Content-Length together with Transfer-Encoding (request smuggling: two
 * parsers may disagree on where the body ends), 501 a transfer coding
 * other than chunked, 415 a content coding other than identity (bodies are
 * read as they come, never decompressed), 400 Authorization sent more than
 * once, and so is x-api-key (which key would be meant is ambiguous). Pure. */
bool srv_framing_check(const srv_framing *f, srv_error *err /* OUT */);
/* True when the raw request target's path (before percent-decoding, up to
 * '?') has no %2F (a slash decoding would make out of a path segment, and
 * so another route) outside the model id of /v1/models/{id},
 * [/client/v4]/accounts/{a}/ai/run/{id} and /admin/models/{id}/{action}
 * (whose route the literal prefix already fixed), and no %00 (a NUL that
 * would cut the decoded path short); otherwise fills *err (400) and
 * returns false. Pure. */
bool srv_path_check(const char *raw_target, srv_error *err /* OUT */);

// ----------------------------------------------------------------------------
// Requests

#define SRV_MAX_STOPS 4
/* Content parts (OpenAI) or blocks (Anthropic) one request may carry over
 * all its messages: more is a 400, so a body of many tiny parts cannot buy
 * work out of proportion to its size. */
#define SRV_MAX_CONTENT_PARTS 4096
#define SRV_MAX_TOKENS_LIMIT (1 << 24) /* larger max_tokens is invalid, not "too long" */

/* A parsed, validated generation request. Strings point into root. */
typedef struct srv_request {
    srv_route route;
    json_t *root;       /* owns every string below */
    const char *model;  /* requested model name, NULL if absent */
    const char *adapter; /* LoRA adapter name ("adapter", Workers AI's "lora"), NULL if absent */
    const char *prompt; /* completions / workers prompt, or NULL */
    chat_message *msgs; /* (n_msgs) malloc'd; strings in root or in owned */
    size_t n_msgs;
    char **owned;       /* (n_msgs) joined multi-part contents, or NULL entries */
    json_t *tmpl_msgs;  /* messages as a chat template sees them (owned; chat_req.c) */
    json_t *tools;      /* request tools (borrowed from root), or NULL */
    json_t *tmpl_kwargs; /* chat_template_kwargs (borrowed from root), or NULL */
    int32_t max_tokens; /* -1: the route's default */
    sample_params sp;   /* validated */
    bool seeded;        /* seed given (else the server draws one) */
    const char *stops[SRV_MAX_STOPS];
    int n_stops;
    bool stream, include_usage;
    bool logprobs;    /* report logprobs */
    int top_logprobs; /* alternatives per token, 0..SAMPLE_MAX_TOP */
    bool ignore_eos;
    grammar *grammar;          /* response_format / grammar compiled (NULL: none); owned */
    const char *grammar_param; /* the field it came from ("response_format", "grammar") */
    toolcall_req tc;           /* chat: tools, tool_choice, parallel_tool_calls (toolcall.h) */
    /* issue 12 */
    int n;             /* choices returned, [1, ENGINE_MAX_N] */
    int best_of;       /* choices generated (completions), [n, ENGINE_MAX_N]; n when absent */
    bool echo;         /* completions: the answer's text starts with the prompt */
    sample_bias *bias; /* (n_bias) logit_bias, malloc'd; ids checked >= 0 only (the
                          vocabulary's size is checked where the model is known) */
    int n_bias;
    /* speculative decoding (issue 42) */
    char *prediction;  /* OpenAI's predicted outputs: the expected text, malloc'd; NULL: none */
    size_t prediction_len;
    bool no_spec;      /* "speculative": false: this request never drafts */
} srv_request;

/* Parses and validates a request body for route (CHAT, COMPLETIONS or
 * WORKERS). On success fills *r (free with srv_request_free) and returns
 * true; otherwise fills *err (400: malformed JSON with line/column/position,
 * wrong types, out-of-range values, unsupported n, missing prompt/messages)
 * and returns false with *r empty. Pure; thread-safe. */
bool srv_request_parse(srv_route route, const char *body, size_t len, srv_request *r /* OUT */,
                       srv_error *err /* OUT */);
/* Compiles the request's structured-output fields (response_format,
 * grammar) of root into r->grammar (api_format.c). False with *err filled
 * (400 naming the parameter: malformed, unsupported keyword, too large;
 * 503 out of memory). Pure; thread-safe. */
bool srv_request_format(srv_request *r, json_t *root, srv_error *err /* OUT */);
/* Frees what srv_request_parse allocated; accepts a zeroed request. */
void srv_request_free(srv_request *r);

/* chat_req.c: validates what a chat request gives its template (roles
 * system/developer/user/assistant/tool, content null on assistant messages
 * with tool_calls, tool_calls with JSON-string arguments, tool_call_id,
 * name, reasoning_content; the tools array; chat_template_kwargs) and builds
 * r->tmpl_msgs (tool-call arguments parsed into objects, as vLLM passes
 * them). False with *err filled (400 naming the param) on bad input. */
bool srv_chat_prepare(srv_request *r, json_t *root, srv_error *err /* OUT */);
/* The message keys srv_chat_prepare accepts besides role and content. */
bool srv_chat_message_key_ok(const char *key);
/* Renders r's conversation with t (the PLAIN format when t has no
 * template). *out malloc'd; *add_special says whether the tokenizer should
 * add BOS/EOS (true only for PLAIN); *spans (malloc'd, may be NULL) where
 * the request's text lies in *out, to tokenize as text (tok_encode_marked).
 * Returns KS_ERR_AGAIN after filling *err with a refusal (tools with no
 * template), INVAL/NOMEM from rendering with eb filled. Thread-safe. */
ks_err srv_chat_render(const chat_tmpl *t, const tok_vocab *v, const srv_request *r,
                       char **out /* OUT */, bool *add_special /* OUT */,
                       tok_span **spans /* OUT */, size_t *n_spans /* OUT */,
                       srv_error *err /* OUT */, ks_errbuf *eb);

/* A lower bound on the tokens of a prompt text of text_bytes bytes when no
 * token stands for more than max_token_bytes bytes (tok_max_token_bytes):
 * ceil(text_bytes / max_token_bytes); 0 when that is 0 (no bound). Pure. */
int64_t srv_prompt_min_tokens(size_t text_bytes, size_t max_token_bytes);
/* The check made before tokenizing (issue 8): true when the prompt's lower
 * bound leaves room for at least one generated token in n_ctx (so at most
 * about n_ctx * max_token_bytes bytes are ever tokenized); otherwise fills
 * *err with the 400 context_length_exceeded the engine would give, saying
 * "at least" (max_tokens, <= 0 when the route's default depends on the
 * prompt, is only quoted), and returns false. Pure. */
bool srv_prompt_fits(int32_t n_ctx, size_t text_bytes, size_t max_token_bytes, int32_t max_tokens,
                     srv_route route, srv_error *err /* OUT */);

// ----------------------------------------------------------------------------
// Responses and SSE framing

/* A random id with prefix ("chatcmpl-", "cmpl-"): prefix + 24 hex digits. */
void srv_make_id(const char *prefix, char *buf, size_t cap);

/* A growing byte buffer, always NUL-terminated after len (p NULL when
 * empty). Zero-initialize; owned by whoever holds it. */
typedef struct srv_buf {
    char *p;
    size_t len, cap;
} srv_buf;
/* Appends n bytes of s; false on out-of-memory (b unchanged). */
bool srv_buf_add(srv_buf *b, const char *s, size_t n) KS_MUST_USE;
/* Frees the bytes and zeroes b; can't fail. */
void srv_buf_free(srv_buf *b);
/* Appends one SSE event carrying j (compact JSON); false on out-of-memory.
 * Does not take ownership of j. */
bool srv_sse_json(srv_buf *b, const json_t *j) KS_MUST_USE;
/* Appends "data: [DONE]\n\n". */
bool srv_sse_done(srv_buf *b) KS_MUST_USE;

/* The usage object {prompt_tokens, completion_tokens, total_tokens,
 * prompt_tokens_details: {cached_tokens}} (OpenAI's names); new reference. */
json_t *srv_usage_json(const engine_event *total);
/* "stop" / "length" (NULL for others). */
const char *srv_finish_name(engine_finish f);

// ----------------------------------------------------------------------------
// Tenants and keys

/* A LoRA adapter a tenants file gives a tenant (loaded at start). */
typedef struct srv_tenant_adapter {
    char name[ENGINE_ADAPTER_NAME_MAX];
    char *path;     /* the GGUF file */
    char *model;    /* the catalog entry's name it is for (NULL: the first model) */
    float scale;    /* 0: 1 */
    bool is_public; /* every tenant may use it */
} srv_tenant_adapter;

typedef struct srv_tenant {
    char name[64];           /* from the file; engine_params.tenant */
    srv_tenant_adapter *adapters; /* (n_adapters) its "adapters" entries */
    size_t n_adapters;
    char cache_domain[80];   /* prefix-cache domain: the name, or "share:<group>" when the
                                operator put this tenant in a prefix-sharing group (I7) */
    uint8_t (*key_hash)[32]; /* (n_keys) SHA-256 of each key; keys are never stored */
    size_t n_keys;
    int32_t max_concurrent;    /* 0: unlimited */
    int64_t tokens_per_minute; /* 0: unlimited */
    int64_t requests_per_minute; /* 0: unlimited */
    /* runtime, under srv_tenants.mu: */
    int32_t running;    /* admitted requests not yet finished */
    double bucket;      /* tokens available now (<= tokens_per_minute) */
    double rbucket;     /* requests available now (<= requests_per_minute) */
    uint64_t bucket_ns; /* when bucket and rbucket were last refilled */
    /* /metrics, lock-free (tenant="name"; the names come from the file only) */
    atomic_ullong m_requests;   /* answers to requests authenticated as this tenant */
    atomic_ullong m_limited;    /* of which 429 (its own limits) */
    atomic_ullong m_prompt;     /* prompt tokens of its finished generations */
    atomic_ullong m_generation; /* tokens generated for it */
    atomic_ullong m_mask_us;    /* CPU its grammar masks took (engine_event.mask_ms) */
    atomic_ullong m_spec_drafted, m_spec_accepted; /* its speculative drafts, and those kept */
} srv_tenant;

/* Tenant rate limits shared between routers through redis (limits_redis.c). */
typedef struct srv_redis srv_redis;
/* One shared bucket pair after a call: whether the amounts were taken, and
 * what is left (tokens, requests; refilled to the redis server's now). */
typedef struct srv_redis_state {
    bool taken;
    double tokens, requests;
} srv_redis_state;
/* Connects to redis at host:port (keys start with prefix, "kvseal:" when
 * NULL); an unreachable redis is not an error (logged; calls fail with
 * KS_ERR_IO until it answers). Errors: KS_ERR_INVAL, KS_ERR_NOMEM. Caller
 * owns *out (srv_redis_destroy). */
ks_err srv_redis_create(const char *host, int port, const char *prefix, srv_redis **out /* OUT */,
                        ks_errbuf *eb) KS_MUST_USE;
/* Frees; accepts NULL. */
void srv_redis_destroy(srv_redis *r);
/* Atomically refills tenant's shared buckets (limits tpm, rpm; 0:
 * unlimited) and takes `tokens` and `requests` from them: only when both
 * suffice (force false), or whatever the level (force true; negative
 * amounts give back, never above the limit). KS_OK with *out filled, or
 * KS_ERR_IO when redis is unreachable (logged once per outage; a reconnect
 * is tried at most once a second). Blocks up to ~200 ms; not thread-safe
 * (callers hold srv_tenants.mu). */
ks_err srv_redis_bucket(srv_redis *r, const char *tenant, int64_t tpm, int64_t rpm, bool force,
                        int64_t tokens, int64_t requests, srv_redis_state *out /* OUT */);

typedef struct srv_tenants {
    srv_tenant *t; /* (n) */
    size_t n;
    bool anonymous; /* no tenants file: one tenant "default", no auth */
    bool has_admin;
    uint8_t admin_hash[32]; /* SHA-256 of the admin key */
    bool has_metrics;
    uint8_t metrics_hash[32]; /* SHA-256 of the scraper's key (/metrics) */
    bool log_content;
    pthread_mutex_t mu; /* guards the runtime fields of every tenant (and redis) */
    srv_redis *redis;   /* NULL: limits are this process's own */
    double local_share; /* redis unreachable: the fraction of each rate limit kept locally */
    atomic_ullong m_redis_errors; /* limit calls that found redis unreachable */
    atomic_bool redis_up;         /* the last redis call succeeded */
} srv_tenants;

/* Parses a tenants file's text: {"tenants":[{"name","keys":[...],
 * "max_concurrent","tokens_per_minute","requests_per_minute"}],
 * "admin_key", "metrics_key", "log_content"}.
 * Names must be unique, non-empty, <= 63 bytes; keys non-empty and unique
 * across tenants. Errors: KS_ERR_FORMAT with the JSON position or the
 * offending field (never a key). Caller owns *out (srv_tenants_free). */
ks_err srv_tenants_parse(const char *json, size_t len, srv_tenants **out /* OUT */,
                         ks_errbuf *eb) KS_MUST_USE;
/* The no-file configuration: one tenant "default", no auth. NULL on OOM. */
srv_tenants *srv_tenants_anonymous(void);
/* Sets (key non-NULL) the admin key, overriding the file's. */
void srv_tenants_set_admin(srv_tenants *ts, const char *key);
/* Sets (key non-NULL) the scraper's key for /metrics, overriding the file's. */
void srv_tenants_set_metrics(srv_tenants *ts, const char *key);
/* Frees; accepts NULL. */
void srv_tenants_free(srv_tenants *ts);
/* Shares the rate limits (tokens_per_minute, requests_per_minute) with
 * every process pointed at the same redis host:port and key prefix; while
 * redis is unreachable each process admits up to local_share (0, 1] of each
 * limit from its own buckets. max_concurrent stays per process. Call before
 * serving. Errors: as srv_redis_create, KS_ERR_INVAL for a share outside
 * (0, 1]. */
ks_err srv_tenants_set_redis(srv_tenants *ts, const char *host, int port, const char *prefix,
                             double local_share, ks_errbuf *eb) KS_MUST_USE;

/* Index of the tenant owning key[0..len), or -1. Constant time in the key
 * and in which tenant matched: hashes key once and compares the hash with
 * every stored hash (sodium_memcmp), never stopping early. */
int srv_tenants_auth(const srv_tenants *ts, const char *key, size_t len);
/* True when key is the admin key (constant time); false when none is set. */
bool srv_tenants_admin_ok(const srv_tenants *ts, const char *key, size_t len);
/* True when key may read /metrics: the metrics key or the admin key
 * (constant time in the key); false when neither is set. */
bool srv_tenants_metrics_ok(const srv_tenants *ts, const char *key, size_t len);

/* Admits one request of `tokens` (prompt + max_tokens) for tenant i at time
 * now_ns: checks the concurrency limit, takes one request from the request
 * bucket and the tokens from the token bucket (all or nothing).
 * Returns ADMIT_OK (then call srv_tenants_release exactly once),
 * ADMIT_TENANT_CONCURRENCY or ADMIT_TENANT_RATE (msg says which
 * limit and the numbers). Thread-safe. */
admit_reason srv_tenants_admit(srv_tenants *ts, int i, int64_t tokens, uint64_t now_ns, char *msg,
                               size_t cap);
/* srv_tenants_admit for a request of `slots` sequences (n / best_of
 * choices): each takes one of the tenant's max_concurrent; more slots than
 * the limit is ADMIT_TENANT_CONCURRENCY at once (msg: lower n). End it with
 * the _n calls below and the same slots. Thread-safe. */
admit_reason srv_tenants_admit_n(srv_tenants *ts, int i, int slots, int64_t tokens, uint64_t now_ns,
                                 char *msg, size_t cap);
/* Ends an admitted request, refunding `unused` tokens. Thread-safe. */
void srv_tenants_release(srv_tenants *ts, int i, int64_t unused);
/* srv_tenants_release of a request admitted with `slots`. Thread-safe. */
void srv_tenants_release_n(srv_tenants *ts, int i, int slots, int64_t unused);
/* Raises an admitted request's reservation from `reserved` tokens (what
 * srv_tenants_admit took: a lower bound known before tokenizing) to its
 * exact `tokens`, taking the difference from the bucket. Returns
 * ADMIT_OK, or ADMIT_TENANT_RATE (msg filled, nothing taken;
 * the request is still admitted: end it with srv_tenants_refuse).
 * Thread-safe. */
admit_reason srv_tenants_grow(srv_tenants *ts, int i, int64_t reserved, int64_t tokens,
                              uint64_t now_ns, char *msg, size_t cap);
/* Ends an admitted request that was refused after doing `charged` tokens
 * of work (the prompt tokens it was tokenized into): of the `reserved`
 * tokens it holds, the rest is refunded, or the difference taken when the
 * work was more (the bucket may go below zero, a debt that refilling pays
 * off). Thread-safe; can't fail. */
void srv_tenants_refuse(srv_tenants *ts, int i, int64_t reserved, int64_t charged);
/* srv_tenants_refuse of a request admitted with `slots`. Thread-safe. */
void srv_tenants_refuse_n(srv_tenants *ts, int i, int slots, int64_t reserved, int64_t charged);

/* A tenant's rate limits as OpenAI's x-ratelimit-* headers state them. */
typedef struct srv_ratelimit {
    bool requests, tokens;      /* which limits the tenant has (neither: no headers) */
    int64_t limit_requests;     /* requests_per_minute */
    int64_t remaining_requests; /* whole requests in the bucket now (>= 0) */
    double reset_requests_s;    /* until the request bucket is full again */
    int64_t limit_tokens;       /* tokens_per_minute */
    int64_t remaining_tokens;   /* whole tokens in the bucket now (>= 0) */
    double reset_tokens_s;      /* until the token bucket is full again */
    double retry_s;             /* until one request of `tokens` passes both buckets (0: now); a
                                   request larger than the limit never does: then until full */
} srv_ratelimit;

/* Snapshot of tenant i's buckets at now_ns (refilled to then) for a request
 * of `tokens` (0: just the request slot). Thread-safe; can't fail. */
void srv_tenants_ratelimit(srv_tenants *ts, int i, int64_t tokens, uint64_t now_ns,
                           srv_ratelimit *out /* OUT */);
/* Retry-After's value for a wait of s seconds: whole seconds rounded up,
 * never below 1 (RFC 9110 delay-seconds; 0 would invite a retry storm).
 * Pure. */
int64_t srv_retry_after_s(double s);
/* Formats s seconds as OpenAI's x-ratelimit-reset-* values do ("20ms",
 * "1s", "6m0s", "1h2m3.5s"; rounded up to the millisecond) into buf;
 * returns the length (cut to cap - 1). Pure. */
size_t srv_duration_fmt(double s, char *buf, size_t cap);

// ----------------------------------------------------------------------------
// Answer headers (headers.c): CORS, x-request-id, Retry-After for a queue

#define SRV_REQUEST_ID_MAX 128    /* longer client ids are replaced */
#define SRV_QUEUE_RETRY_MAX_S 600 /* cap of the queue's Retry-After estimate */
#define SRV_CORS_MAX_AGE "600"    /* preflight cache, seconds */

/* True when origin (a request's Origin header) may call: it equals one of
 * origins (ASCII case-insensitively) or one of them is "*". NULL/empty:
 * false. Pure. */
bool srv_cors_origin_ok(const char *const *origins, int n, const char *origin);
/* A preflight's Access-Control-Allow-Headers: the headers of `requested`
 * (Access-Control-Request-Headers, comma-separated) that these routes
 * accept (authorization, content-type, x-api-key, anthropic-version,
 * anthropic-beta, x-request-id, accept, cache-control, openai-*,
 * x-stainless-*, ...), lowercased, joined by ", " into out; the rest are
 * left out, so the browser refuses a request that sends them. Returns the
 * length (0: none). Pure. */
size_t srv_cors_allow_headers(const char *requested, char *out, size_t cap);
/* True when a client's x-request-id can be kept: 1..SRV_REQUEST_ID_MAX-1
 * bytes, each printable ASCII without space (0x21..0x7e), so it is safe in
 * a header, a log line and a JSON id. Pure. */
bool srv_request_id_ok(const char *v);
/* v as a value of a text log line's `key=value` field: as it is when every
 * byte is a letter, a digit or one of "-._~:/@+,", so the usual ids and
 * paths read unchanged; otherwise in double quotes, `"` and `\` escaped
 * with a backslash and any byte outside printable ASCII as \xNN, so a
 * client's value (x-request-id, a URL) can never forge another field
 * ("tenant=beta") or a line. Writes at most cap - 1 bytes and a NUL (a
 * quoted value cut short still ends in '"'); returns the length. Pure. */
size_t srv_log_value(const char *v, char *out, size_t cap);
/* A new request id: 32 lowercase hex digits of 128 random bits
 * (libsodium), unique for all practical purposes. cap >= 33. */
void srv_request_id_new(char *buf, size_t cap);
/* Retry-After (seconds, >= 1) for a 503 of a busy server: the mean
 * end-to-end latency seen so far times the requests ahead (the queue, plus
 * this one) over the requests served at once, capped at
 * SRV_QUEUE_RETRY_MAX_S; 1 before anything was measured. Pure. */
int64_t srv_queue_retry_s(double mean_e2e_s, uint32_t n_queued, uint32_t n_running);

// ----------------------------------------------------------------------------
// Metrics

#define SRV_N_STATUS 16

typedef struct srv_hist {
    const double *bounds; /* (n) upper bounds, seconds */
    int n;
    atomic_ullong count[16]; /* per bucket (non-cumulative), [n] = +Inf */
    atomic_ullong n_obs;
    atomic_ullong sum_ns; /* sum of observations, nanoseconds */
} srv_hist;

typedef struct srv_metrics {
    atomic_ullong requests[SRV_ROUTE__COUNT][SRV_N_STATUS]; /* by route and status index */
    atomic_ullong rejections[ADMIT__COUNT];
    atomic_ullong tokens_in, tokens_out;
    atomic_ullong client_disconnects;
    atomic_llong http_connections; /* open now */
    atomic_ullong http_probes;     /* 102 probes sent to half-closed connections */
    atomic_int inflight;           /* generations alive, answers being written included
                                      (what a drain waits for) */
    srv_hist ttft, tpot;
    srv_hist e2e;              /* submit -> the answer's last event, per finished generation */
    srv_hist queue;            /* submit -> scheduled (engine_event.queue_ms) */
    atomic_ullong finished[3]; /* generations by end: stop, length, abort (errors too) */
    /* set once before serving; borrowed: */
    const char *model_name; /* model_name="..." on the model-level (vllm:*) series */
    const srv_tenants *ts;  /* tenant="..." series, one per tenant in the file */
} srv_metrics;

/* Zeroes the counters and sets the histogram buckets. Can't fail. */
void srv_metrics_init(srv_metrics *m);
/* Counts one answer; statuses outside the known set count as "other".
 * Lock-free; any thread. */
void srv_metrics_request(srv_metrics *m, srv_route route, int status);
/* Counts one rejection by reason (ADMIT_OK is ignored). Any thread. */
void srv_metrics_reject(srv_metrics *m, admit_reason r);
/* Counts one finished generation by its end (vllm:request_success_total's
 * finished_reason). Any thread. */
void srv_metrics_finish(srv_metrics *m, engine_finish f);
/* Appends v to b as a Prometheus label value (backslash, double quote and
 * newline escaped); false on out-of-memory. */
bool srv_prom_label(srv_buf *b, const char *v) KS_MUST_USE;
/* Records an observation in seconds (negative/NaN count as 0). Any thread. */
void srv_hist_observe(srv_hist *h, double seconds);
/* Prometheus text exposition of m plus the engine's gauges (es may be NULL):
 * kvseal's own series, per-tenant counters (m->ts), and the vllm:* names a
 * vLLM dashboard reads, labelled model_name (docs/metrics.md has the map).
 * malloc'd (caller frees); NULL on out-of-memory. */
char *srv_metrics_render(srv_metrics *m, const engine_stats *es, bool online);

// ----------------------------------------------------------------------------
// Embeddings, tokenize, detokenize (api_embed.c)

#define SRV_EMBED_MAX_INPUTS 2048 /* inputs of one /v1/embeddings request (OpenAI's) */

/* One input of an embeddings request: text, or token ids. */
typedef struct srv_embed_input {
    bool is_ids;
    const char *text; /* in the request's root */
    size_t len;
    int32_t *ids; /* (n_ids) malloc'd, ids >= 0 (the vocabulary is checked at admission) */
    size_t n_ids;
} srv_embed_input;

/* A parsed POST /v1/embeddings body. */
typedef struct srv_embed_req {
    json_t *root;        /* owns the strings */
    const char *model;   /* NULL: absent */
    srv_embed_input *in; /* (n) */
    int n;
    bool base64;        /* encoding_format "base64": little-endian f32 */
    int64_t dimensions; /* -1: absent */
} srv_embed_req;

/* Parses an embeddings body: input (a string, an array of strings, an array
 * of token ids, an array of such arrays; none empty; at most
 * SRV_EMBED_MAX_INPUTS), model, encoding_format (float, base64), dimensions
 * (a positive integer; the caller compares it with n_embd), user; unknown
 * fields refused. False with *err (400, or 500 on out-of-memory) and *r
 * empty. Pure; thread-safe. */
bool srv_embed_parse(const char *body, size_t len, srv_embed_req *r /* OUT */,
                     srv_error *err /* OUT */);
/* Frees what srv_embed_parse filled; accepts an empty r. */
void srv_embed_req_free(srv_embed_req *r);
/* OpenAI's answer for n vectors (n, E) row-major: {"object":"list","data":
 * [{"object":"embedding","index":i,"embedding":[...] or base64}],"model",
 * "usage":{prompt_tokens,total_tokens}}. NULL on out-of-memory; caller owns. */
json_t *srv_embed_answer(const float *vecs, int n, int32_t E, bool base64, const char *model,
                         int64_t prompt_tokens);

/* A parsed POST /tokenize body (llama.cpp server's shape). */
typedef struct srv_tokenize_req {
    json_t *root; /* owns content */
    const char *content;
    size_t len;
    const char *model;  /* NULL: absent */
    bool add_special;   /* BOS/EOS as the vocabulary says (false) */
    bool parse_special; /* special-token text becomes its token (false) */
    bool with_pieces;   /* answer [{id, piece}] (false) */
} srv_tokenize_req;
/* Parses a tokenize body; false with *err (400) otherwise. Free r->root
 * with json_decref. Pure. */
bool srv_tokenize_parse(const char *body, size_t len, srv_tokenize_req *r /* OUT */,
                        srv_error *err /* OUT */);
/* {"tokens":[ids]} or, with pieces, {"tokens":[{"id":..,"piece":..}]} (a
 * piece that is not valid UTF-8 as its byte values). NULL on out-of-memory. */
json_t *srv_tokenize_answer(const tok_vocab *v, const int32_t *ids, size_t n, bool with_pieces);
/* Parses a detokenize body {"tokens":[ids]}: every id in [0, n_vocab), else
 * 400 naming it. On success *ids is malloc'd (NULL when empty), *model
 * points into *root (json_decref it). Pure. */
bool srv_detokenize_parse(const char *body, size_t len, int32_t n_vocab, int32_t **ids /* OUT */,
                          size_t *n /* OUT */, const char **model /* OUT */,
                          json_t **root /* OUT */, srv_error *err /* OUT */);

/* A JSON value's type as the parameter errors name it: "object", "array",
 * "string", "integer", "number", "boolean" or "null". Static storage. */
const char *srv_json_type(const json_t *v);

/* What a JSON value is, for messages: "an object", "an array", "a string",
 * "a number", "a boolean" or "null". Static storage; can't fail. */
const char *srv_json_kind(const json_t *v);

/* Reads the sampler parameters of a request body into sp (filled with the
 * route's defaults): every SAMPLE_PARAM_MAP row with a JSON key, in its API
 * range, then sample_params_validate. False with err (400 naming the key the
 * client sent, e.g. "'top_p' must be in (0, 1], got 0") on a wrong type or
 * value. Pure (sampling_json.c). */
bool srv_sampling_read(json_t *root, sample_params *sp, srv_error *err /* OUT */);
/* True when k is a JSON key (or alias) of a SAMPLE_PARAM_MAP row; with
 * anthropic, only of the rows Anthropic's Messages API has. Pure. */
bool srv_sampling_known(const char *k, bool anthropic);

#endif /* KS_SERVER_INT_H */
