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

typedef enum admit_reason {
    ADMIT_OK = 0,
    /* 1..10 may travel in REJECT (prefill -> router) */
    ADMIT_CONTEXT_LENGTH = 1, /* prompt + max_tokens above the context length */
    ADMIT_KV_CAPACITY = 2,    /* more KV pages than the pool (largest worker) holds */
    ADMIT_INVALID = 3,        /* a parameter out of range (empty prompt, a token id, ...) */
    ADMIT_STALE_GRANT = 4,    /* cluster: the grant's data link is gone (the router retries) */
    ADMIT_ABORTED = 5,        /* the request was aborted before it was served */
    ADMIT_DRAINING = 6,       /* the server or worker is shutting down (the router retries) */
    ADMIT_BUSY = 7,           /* the queue is full, or a worker's KV cache */
    ADMIT_OFFLINE = 8,        /* the model is taken offline */
    ADMIT_NO_WORKER = 9,      /* cluster: no prefill or no decode worker registered */
    ADMIT_INTERNAL = 10,      /* a peer broke the protocol (inconsistent grant, duplicate id) */
    /* the HTTP front only */
    ADMIT_TENANT_CONCURRENCY = 11,
    ADMIT_TENANT_RATE = 12,
    ADMIT_AUTH = 13,            /* missing or wrong API key */
    ADMIT_REQUEST_TIMEOUT = 14, /* request head or body not in within the deadline */
    ADMIT_INVALID_JSON = 15,
    ADMIT_MISSING_PARAMETER = 16,
    ADMIT_UNSUPPORTED_PARAMETER = 17,
    ADMIT_MODEL_NOT_FOUND = 18,
    ADMIT_TOO_LARGE = 19, /* request body above the cap */
    ADMIT_UNKNOWN_URL = 20,
    ADMIT_METHOD = 21,           /* method not allowed on the route */
    ADMIT_BAD_FRAMING = 22,      /* RFC 9112 framing or path the server refuses */
    ADMIT_BAD_ENCODING = 23,     /* unsupported Content-Encoding (415) */
    ADMIT_NOT_IMPLEMENTED = 24,  /* a Transfer-Encoding other than chunked (501) */
    ADMIT_ADMIN_DISABLED = 25,   /* admin routes without an admin key configured */
    ADMIT_DUPLICATE_HEADER = 26, /* a header that must appear once appears twice */
    ADMIT_INVALID_PATH = 27,     /* %2F or %00 in the path */
    ADMIT__COUNT
} admit_reason;

/* The last reason a REJECT frame may carry. */
#define ADMIT_WIRE_MAX ADMIT_INTERNAL

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

#endif
