/* admit.h — the request contract (issue 8 section 5): one append-only table
 * of the reasons a request is refused, and the admission checks every front
 * end (kvseal serve, the cluster router, the prefill worker, engine_adopt)
 * runs before anything is allocated (I4).
 *
 * A reason's number is also its wire value (the KVPD REJECT frame carries it,
 * docs/pd-protocol.md) and its index in kvseal_rejections_total: append new
 * reasons at the end, never renumber or reuse one. The HTTP status, the
 * OpenAI error type and code and the Workers AI code come from the table
 * only, so a refusal reads the same whichever process made it. */
#ifndef KS_ADMIT_H
#define KS_ADMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "kvseal/base.h"

typedef struct engine_params engine_params;

/* The refusal table, one row per reason (the house's X-macro idiom, as
 * KS_ERR_MAP): X(ENUM, value, kind, name, http_status, type, code,
 * workers_code, err, msg). value: the reason's number (append-only, in
 * order: it is the wire value and the metric's index); kind: ADMIT_WIRE, a
 * refusal that may cross the cluster wire (KVPD REJECT/FINISH), ADMIT_HTTP,
 * a refusal of the HTTP front only, or ADMIT_FAILURE, a failure after
 * admission (HTTP front only; not counted in kvseal_rejections_total); the
 * rest fill admit_info. Adding a reason is one row here (and README
 * "Refusals"). */
#define ADMIT_WIRE 1
#define ADMIT_HTTP 2
#define ADMIT_FAILURE 3
#define ADMIT_IRE "invalid_request_error"
#define ADMIT_SE "server_error"
#define ADMIT_REASON_MAP(X)                                                                        \
    /* prompt + max_tokens above the context length */                                             \
    X(CONTEXT_LENGTH, 1, ADMIT_WIRE, "context_length", 400, ADMIT_IRE, "context_length_exceeded",  \
      5006, KS_ERR_INVAL, "the request does not fit the model's context length")                   \
    /* more KV pages than the pool (largest worker) holds */                                       \
    X(KV_CAPACITY, 2, ADMIT_WIRE, "pool", 400, ADMIT_IRE, "context_length_exceeded", 5006,         \
      KS_ERR_NOSPACE, "the request needs more KV cache than the server has")                       \
    /* a parameter out of range (empty prompt, a token id, ...) */                                 \
    X(INVALID, 3, ADMIT_WIRE, "invalid", 400, ADMIT_IRE, "invalid_parameter", 5006, KS_ERR_INVAL,  \
      "a request parameter is out of range")                                                       \
    /* cluster: the grant's data link is gone (the router retries) */                              \
    X(STALE_GRANT, 4, ADMIT_WIRE, "stale_grant", 503, ADMIT_SE, "worker_unavailable", 3040,        \
      KS_ERR_AGAIN, "the decode worker's data link was replaced; retry")                           \
    /* the request was aborted before it was served */                                             \
    X(ABORTED, 5, ADMIT_WIRE, "aborted", 503, ADMIT_SE, "request_aborted", 3008, KS_ERR_CANCELLED, \
      "the request was aborted")                                                                   \
    /* the server or worker is shutting down (the router retries) */                               \
    X(DRAINING, 6, ADMIT_WIRE, "shutting_down", 503, ADMIT_SE, "server_shutting_down", 3040,       \
      KS_ERR_AGAIN, "the server is shutting down and takes no new requests")                       \
    /* the queue is full, or a worker's KV cache */                                                \
    X(BUSY, 7, ADMIT_WIRE, "queue_full", 503, ADMIT_SE, "queue_full", 3040, KS_ERR_AGAIN,          \
      "the server is busy")                                                                        \
    /* the model is taken offline */                                                               \
    X(OFFLINE, 8, ADMIT_WIRE, "offline", 503, ADMIT_SE, "model_offline", 3040, KS_ERR_AGAIN,       \
      "the model is offline")                                                                      \
    /* cluster: no prefill or no decode worker registered */                                       \
    X(NO_WORKER, 9, ADMIT_WIRE, "no_worker", 503, ADMIT_SE, "no_worker", 3040, KS_ERR_AGAIN,       \
      "no prefill or decode worker is registered")                                                 \
    /* a peer broke the protocol (inconsistent grant, duplicate id) */                             \
    X(INTERNAL, 10, ADMIT_WIRE, "internal", 500, ADMIT_SE, "internal_error", 500, KS_ERR_INTERNAL, \
      "internal error")                                                                            \
    /* from here on: the HTTP front only */                                                        \
    X(TENANT_CONCURRENCY, 11, ADMIT_HTTP, "tenant_concurrency", 429, "rate_limit_error",           \
      "rate_limit_exceeded", 3036, KS_ERR_AGAIN, "too many concurrent requests for this key")      \
    X(TENANT_RATE, 12, ADMIT_HTTP, "tenant_rate", 429, "rate_limit_error", "rate_limit_exceeded",  \
      3036, KS_ERR_AGAIN, "token rate limit reached for this key")                                 \
    /* missing or wrong API key */                                                                 \
    X(AUTH, 13, ADMIT_HTTP, "auth", 401, ADMIT_IRE, "invalid_api_key", 10000, KS_ERR_INVAL,        \
      "invalid API key")                                                                           \
    /* request head or body not in within the deadline */                                          \
    X(REQUEST_TIMEOUT, 14, ADMIT_HTTP, "request_timeout", 408, ADMIT_IRE, "request_timeout", 3007, \
      KS_ERR_TIMEOUT, "the request was not received within the deadline")                          \
    X(INVALID_JSON, 15, ADMIT_HTTP, "invalid_json", 400, ADMIT_IRE, "invalid_json", 5006,          \
      KS_ERR_INVAL, "the body is not valid JSON")                                                  \
    X(MISSING_PARAMETER, 16, ADMIT_HTTP, "missing_parameter", 400, ADMIT_IRE,                      \
      "missing_required_parameter", 3003, KS_ERR_INVAL, "a required parameter is missing")         \
    X(UNSUPPORTED_PARAMETER, 17, ADMIT_HTTP, "unsupported_parameter", 400, ADMIT_IRE,              \
      "unsupported_parameter", 5006, KS_ERR_INVAL, "a parameter is not supported")                 \
    X(MODEL_NOT_FOUND, 18, ADMIT_HTTP, "model_not_found", 404, ADMIT_IRE, "model_not_found", 3042, \
      KS_ERR_INVAL, "the model does not exist")                                                    \
    /* request body above the cap */                                                               \
    X(TOO_LARGE, 19, ADMIT_HTTP, "too_large", 413, ADMIT_IRE, "request_too_large", 3006,           \
      KS_ERR_INVAL, "the request is too large")                                                    \
    X(UNKNOWN_URL, 20, ADMIT_HTTP, "unknown_url", 404, ADMIT_IRE, "unknown_url", 404,              \
      KS_ERR_INVAL, "unknown URL")                                                                 \
    /* method not allowed on the route */                                                          \
    X(METHOD, 21, ADMIT_HTTP, "method_not_allowed", 405, ADMIT_IRE, "method_not_allowed", 405,     \
      KS_ERR_INVAL, "method not allowed")                                                          \
    /* RFC 9112 framing or path the server refuses */                                              \
    X(BAD_FRAMING, 22, ADMIT_HTTP, "bad_framing", 400, ADMIT_IRE, "invalid_framing", 400,          \
      KS_ERR_INVAL, "the request's HTTP framing is invalid")                                       \
    /* unsupported Content-Encoding (415) */                                                       \
    X(BAD_ENCODING, 23, ADMIT_HTTP, "bad_encoding", 415, ADMIT_IRE,                                \
      "unsupported_content_encoding", 415, KS_ERR_INVAL, "unsupported Content-Encoding")           \
    /* a Transfer-Encoding other than chunked (501) */                                             \
    X(NOT_IMPLEMENTED, 24, ADMIT_HTTP, "not_implemented", 501, ADMIT_IRE,                          \
      "unsupported_transfer_encoding", 501, KS_ERR_INVAL, "unsupported Transfer-Encoding")         \
    /* admin routes without an admin key configured */                                             \
    X(ADMIN_DISABLED, 25, ADMIT_HTTP, "admin_disabled", 403, "permission_error", "admin_disabled", \
      403, KS_ERR_INVAL, "the admin routes are disabled")                                          \
    /* a header that must appear once appears twice */                                             \
    X(DUPLICATE_HEADER, 26, ADMIT_HTTP, "duplicate_header", 400, ADMIT_IRE, "duplicate_header",    \
      400, KS_ERR_INVAL, "a header appears more than once")                                        \
    /* %2F or %00 in the path */                                                                   \
    X(INVALID_PATH, 27, ADMIT_HTTP, "invalid_path", 400, ADMIT_IRE, "invalid_path", 400,           \
      KS_ERR_INVAL, "the path is not allowed")                                                     \
    /* from here on: failures after admission (not refusals: no rejection counted) */              \
    /* the client went away before its answer (for the log and metrics; nothing is sent) */        \
    X(CLIENT_CLOSED, 28, ADMIT_FAILURE, "client_closed", 499, ADMIT_IRE, "client_closed", 499,     \
      KS_ERR_CANCELLED, "the client closed the connection")                                        \
    /* cluster: a worker's connection was lost or it failed the request */                         \
    X(UPSTREAM_ERROR, 29, ADMIT_FAILURE, "upstream_error", 502, ADMIT_SE, "upstream_error", 502,   \
      KS_ERR_PEER_CLOSED, "a worker failed the request")                                           \
    /* cluster: no worker could go on with the request (retry) */                                  \
    X(WORKER_UNAVAILABLE, 30, ADMIT_FAILURE, "worker_unavailable", 503, ADMIT_SE,                  \
      "worker_unavailable", 503, KS_ERR_AGAIN, "no worker can serve the request now; retry")       \
    /* cluster: a worker did not answer in time (first token, a stalled link) */                   \
    X(UPSTREAM_TIMEOUT, 31, ADMIT_FAILURE, "upstream_timeout", 504, ADMIT_SE, "upstream_timeout",  \
      504, KS_ERR_TIMEOUT, "a worker did not answer in time")                                      \
    /* the server stopped while the request ran */                                                 \
    X(SHUTDOWN_ABORTED, 32, ADMIT_FAILURE, "shutdown_aborted", 503, ADMIT_SE,                      \
      "server_shutting_down", 503, KS_ERR_CANCELLED,                                               \
      "the server is shutting down; the request was aborted")                                      \
    /* aborted while it ran (model taken offline, queue timeout) */                                \
    X(RUN_ABORTED, 33, ADMIT_FAILURE, "run_aborted", 503, ADMIT_SE, "request_aborted", 503,        \
      KS_ERR_CANCELLED, "the request was aborted")                                                 \
    /* kvseal serve with several models: the request's model is being loaded (retry) */           \
    X(MODEL_LOADING, 34, ADMIT_HTTP, "model_loading", 503, ADMIT_SE, "model_loading", 3040,        \
      KS_ERR_AGAIN, "the model is loading; retry shortly")                                        \
    /* a LoRA adapter name the tenant has none of (another tenant's reads the same) */            \
    X(ADAPTER_NOT_FOUND, 35, ADMIT_WIRE, "adapter_not_found", 404, ADMIT_IRE, "adapter_not_found", \
      3042, KS_ERR_INVAL, "the adapter does not exist")

typedef enum admit_reason {
    ADMIT_OK = 0,
#define ADMIT__ENUM(E, v, ...) ADMIT_##E = v,
    ADMIT_REASON_MAP(ADMIT__ENUM)
#undef ADMIT__ENUM
        ADMIT__COUNT
} admit_reason;

/* Whether reason r (any number) may travel in a KVPD REJECT or FINISH frame:
 * the table's wire column; false for ADMIT_OK and unknown numbers. Pure;
 * header-only, so pd (which does not link engine) can use it. */
static inline bool admit_reason_on_wire(uint32_t r) {
    switch (r) {
#define ADMIT__WIRE(E, v, kind, ...)                                                               \
    case v:                                                                                        \
        return kind == ADMIT_WIRE;
        ADMIT_REASON_MAP(ADMIT__WIRE)
#undef ADMIT__WIRE
    default:
        return false;
    }
}

/* Whether r is a refusal (kind ADMIT_WIRE or ADMIT_HTTP: counted in
 * kvseal_rejections_total) rather than a failure after admission; false for
 * ADMIT_OK and unknown numbers. Pure; header-only. */
static inline bool admit_reason_is_refusal(uint32_t r) {
    switch (r) {
#define ADMIT__REFUSAL(E, v, kind, ...)                                                            \
    case v:                                                                                        \
        return kind != ADMIT_FAILURE;
        ADMIT_REASON_MAP(ADMIT__REFUSAL)
#undef ADMIT__REFUSAL
    default:
        return false;
    }
}

typedef struct admit_info {
    const char *name;      /* metric label and log word, e.g. "context_length" */
    uint16_t http_status;  /* 400, 401, 404, 408, 413, 429, 500, 503, ... */
    const char *type;      /* OpenAI error.type */
    const char *code;      /* OpenAI error.code */
    uint16_t workers_code; /* Workers AI errors[].code (the HTTP status where it documents none) */
    ks_err err;            /* the ks_err class a refusal returns */
    const char *msg;       /* default message */
} admit_info;

/* The table entry of r (ADMIT_OK and out-of-range values: the INTERNAL
 * entry, never NULL). Pure. */
const admit_info *admit_reason_info(admit_reason r);

/* Fills eb (if non-NULL) with r's ks_err class, r, and the printf message
 * (the table's default when fmt is NULL); returns the ks_err. */
ks_err admit_refuse(ks_errbuf *eb, admit_reason r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* What a front end admits against. */
typedef struct admit_limits {
    int32_t n_ctx, n_vocab;
    uint32_t page_tokens; /* KV page size in tokens */
    uint32_t max_pages;   /* 0: not checked (the cluster router before any decode worker) */
    uint32_t state_pages; /* pages of recurrent state a sequence holds beside its KV pages
                             (hybrid models, kv.h g.state_pages; 0: none) */
    bool prompt_only;     /* the pages hold the prompt only (a prefill worker) */
} admit_limits;

/* The length checks: a prompt of at least one token, max_tokens >= 1,
 * prompt + max_tokens <= n_ctx (OpenAI's context_length_exceeded text), and
 * the KV pages the request needs <= max_pages. Refuses with admit_refuse. */
ks_err admit_lengths(const admit_limits *lim, int64_t n_prompt, int64_t max_tokens,
                     ks_errbuf *eb) KS_MUST_USE;

/* What admit_request lets through (the prompt as given; only the TEST-ONLY
 * placeholder build, KS_BROKEN=placeholder, rewrites it). */
typedef struct admit_admitted {
    const int32_t *prompt;
    int32_t n_prompt, max_tokens;
} admit_admitted;

/* Every check of admission (I4) on a whole request, before anything is
 * allocated: admit_lengths, token ids in [0, n_vocab), the sampling
 * parameters. Pure; thread-safe. */
ks_err admit_request(const admit_limits *lim, const engine_params *p, admit_admitted *out /* OUT */,
                     ks_errbuf *eb) KS_MUST_USE;

/* Admission of an embedding input (engine_embed_submit, the router, a
 * prefill worker's EMBED): at least one token (else INVALID "the input is
 * empty"), at most n_ctx (else CONTEXT_LENGTH, OpenAI's text with 0 for the
 * completion), ids in [0, n_vocab), its pages <= max_pages. Pure. */
ks_err admit_embed(const admit_limits *lim, const int32_t *tokens, int64_t n_tokens,
                   ks_errbuf *eb) KS_MUST_USE;

/* The refusal of a generation (completion, chat) on an embedding encoder
 * (arch: its architecture name), which has no LM head: INVALID, the same
 * words in kvseal serve and through the router. Pure. */
ks_err admit_encoder(const char *arch, ks_errbuf *eb) KS_MUST_USE;

#endif
