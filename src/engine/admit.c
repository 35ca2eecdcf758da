/* admit.c — the request contract (include/kvseal/admit.h): the refusal
 * table and the admission checks (I4) shared by every front end. */
#include "kvseal/admit.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "kvseal/engine.h"
#include "kvseal/sample.h"

#define IRE "invalid_request_error"
#define SE "server_error"

/* Append-only: the index is the wire value and the metric's order. Workers
 * AI codes are the documented ones (developers.cloudflare.com/workers-ai/
 * platform/errors) where one fits, else the HTTP status: 5006 is what
 * Workers AI answers for input that fails its checks ("Bad input"), 3003 a
 * missing field, 3042 an unknown model, 3006 too large, 3007 a timeout,
 * 3008 aborted, 3036 the account's (here: the key's) limits, 3040 out of
 * capacity (retry), 10000 Cloudflare's API authentication error. README
 * "Refusals" has the table. */
static const admit_info admit__table[ADMIT__COUNT] = {
    [ADMIT_OK] = {"ok", 200, NULL, NULL, 200, KS_OK, ""},
    [ADMIT_CONTEXT_LENGTH] = {"context_length", 400, IRE, "context_length_exceeded", 5006,
                              KS_ERR_INVAL, "the request does not fit the model's context length"},
    [ADMIT_KV_CAPACITY] = {"pool", 400, IRE, "context_length_exceeded", 5006, KS_ERR_NOSPACE,
                           "the request needs more KV cache than the server has"},
    [ADMIT_INVALID] = {"invalid", 400, IRE, "invalid_parameter", 5006, KS_ERR_INVAL,
                       "a request parameter is out of range"},
    [ADMIT_STALE_GRANT] = {"stale_grant", 503, SE, "worker_unavailable", 3040, KS_ERR_AGAIN,
                           "the decode worker's data link was replaced; retry"},
    [ADMIT_ABORTED] = {"aborted", 503, SE, "request_aborted", 3008, KS_ERR_CANCELLED,
                       "the request was aborted"},
    [ADMIT_DRAINING] = {"shutting_down", 503, SE, "server_shutting_down", 3040, KS_ERR_AGAIN,
                        "the server is shutting down and takes no new requests"},
    [ADMIT_BUSY] = {"queue_full", 503, SE, "queue_full", 3040, KS_ERR_AGAIN, "the server is busy"},
    [ADMIT_OFFLINE] = {"offline", 503, SE, "model_offline", 3040, KS_ERR_AGAIN,
                       "the model is offline"},
    [ADMIT_NO_WORKER] = {"no_worker", 503, SE, "no_worker", 3040, KS_ERR_AGAIN,
                         "no prefill or decode worker is registered"},
    [ADMIT_INTERNAL] = {"internal", 500, SE, "internal_error", 500, KS_ERR_INTERNAL,
                        "internal error"},
    [ADMIT_TENANT_CONCURRENCY] = {"tenant_concurrency", 429, "rate_limit_error",
                                  "rate_limit_exceeded", 3036, KS_ERR_AGAIN,
                                  "too many concurrent requests for this key"},
    [ADMIT_TENANT_RATE] = {"tenant_rate", 429, "rate_limit_error", "rate_limit_exceeded", 3036,
                           KS_ERR_AGAIN, "token rate limit reached for this key"},
    [ADMIT_AUTH] = {"auth", 401, IRE, "invalid_api_key", 10000, KS_ERR_INVAL, "invalid API key"},
    [ADMIT_REQUEST_TIMEOUT] = {"request_timeout", 408, IRE, "request_timeout", 3007, KS_ERR_TIMEOUT,
                               "the request was not received within the deadline"},
    [ADMIT_INVALID_JSON] = {"invalid_json", 400, IRE, "invalid_json", 5006, KS_ERR_INVAL,
                            "the body is not valid JSON"},
    [ADMIT_MISSING_PARAMETER] = {"missing_parameter", 400, IRE, "missing_required_parameter", 3003,
                                 KS_ERR_INVAL, "a required parameter is missing"},
    [ADMIT_UNSUPPORTED_PARAMETER] = {"unsupported_parameter", 400, IRE, "unsupported_parameter",
                                     5006, KS_ERR_INVAL, "a parameter is not supported"},
    [ADMIT_MODEL_NOT_FOUND] = {"model_not_found", 404, IRE, "model_not_found", 3042, KS_ERR_INVAL,
                               "the model does not exist"},
    [ADMIT_TOO_LARGE] = {"too_large", 413, IRE, "request_too_large", 3006, KS_ERR_INVAL,
                         "the request is too large"},
    [ADMIT_UNKNOWN_URL] = {"unknown_url", 404, IRE, "unknown_url", 404, KS_ERR_INVAL,
                           "unknown URL"},
    [ADMIT_METHOD] = {"method_not_allowed", 405, IRE, "method_not_allowed", 405, KS_ERR_INVAL,
                      "method not allowed"},
    [ADMIT_BAD_FRAMING] = {"bad_framing", 400, IRE, "invalid_framing", 400, KS_ERR_INVAL,
                           "the request's HTTP framing is invalid"},
    [ADMIT_BAD_ENCODING] = {"bad_encoding", 415, IRE, "unsupported_content_encoding", 415,
                            KS_ERR_INVAL, "unsupported Content-Encoding"},
    [ADMIT_NOT_IMPLEMENTED] = {"not_implemented", 501, IRE, "unsupported_transfer_encoding", 501,
                               KS_ERR_INVAL, "unsupported Transfer-Encoding"},
    [ADMIT_ADMIN_DISABLED] = {"admin_disabled", 403, "permission_error", "admin_disabled", 403,
                              KS_ERR_INVAL, "the admin routes are disabled"},
    [ADMIT_DUPLICATE_HEADER] = {"duplicate_header", 400, IRE, "duplicate_header", 400, KS_ERR_INVAL,
                                "a header appears more than once"},
    [ADMIT_INVALID_PATH] = {"invalid_path", 400, IRE, "invalid_path", 400, KS_ERR_INVAL,
                            "the path is not allowed"},
};

const admit_info *admit_reason_info(admit_reason r) {
    if ((unsigned)r == ADMIT_OK || (unsigned)r >= ADMIT__COUNT)
        return &admit__table[ADMIT_INTERNAL];
    return &admit__table[r];
}

ks_err admit_refuse(ks_errbuf *eb, admit_reason r, const char *fmt, ...) {
    const admit_info *in = admit_reason_info(r);
    if (eb) {
        eb->code = in->err;
        eb->reason = (uint16_t)((unsigned)r < ADMIT__COUNT && r != ADMIT_OK ? r : ADMIT_INTERNAL);
        if (fmt) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
            va_end(ap);
        } else {
            snprintf(eb->msg, sizeof eb->msg, "%s", in->msg);
        }
    }
    return in->err;
}

ks_err admit_lengths(const admit_limits *lim, int64_t n_prompt, int64_t max_tokens, ks_errbuf *eb) {
    if (n_prompt < 1) return admit_refuse(eb, ADMIT_INVALID, "the prompt is empty");
    if (max_tokens < 1)
        return admit_refuse(eb, ADMIT_INVALID, "max_tokens must be at least 1, got %" PRId64,
                            max_tokens);
    if (n_prompt + max_tokens > lim->n_ctx)
        return admit_refuse(
            eb, ADMIT_CONTEXT_LENGTH,
            "This model's maximum context length is %d tokens. However, you requested %" PRId64
            " tokens (%" PRId64 " in the prompt, %" PRId64
            " for the completion). Please reduce the length of the prompt or completion.",
            lim->n_ctx, n_prompt + max_tokens, n_prompt, max_tokens);
    uint64_t held = (uint64_t)n_prompt + (lim->prompt_only ? 0u : (uint64_t)max_tokens);
    uint64_t pages = (held + lim->page_tokens - 1) / lim->page_tokens;
    if (lim->max_pages && pages > lim->max_pages)
        return admit_refuse(
            eb, ADMIT_KV_CAPACITY,
            "the request needs %" PRIu64 " KV pages of %u tokens (%s), the KV cache "
            "holds %u",
            pages, lim->page_tokens, lim->prompt_only ? "its prompt" : "prompt and completion",
            lim->max_pages);
    return KS_OK;
}

#ifdef KS_BROKEN_PLACEHOLDER
static const int32_t admit__placeholder = 1;
#endif

ks_err admit_request(const admit_limits *lim, const engine_params *p, admit_admitted *out,
                     ks_errbuf *eb) {
    out->prompt = p->prompt;
    out->n_prompt = p->n_prompt;
    out->max_tokens = p->max_tokens;
    ks_err e = admit_lengths(lim, p->prompt ? p->n_prompt : 0, p->max_tokens, eb);
#ifdef KS_BROKEN_PLACEHOLDER
    // TEST ONLY (I9): the incident's bug — a rejected request continues with
    // a one-token placeholder instead of stopping at admission
    if (e && p->prompt && p->n_prompt >= 1 && p->max_tokens >= 1 &&
        (int64_t)p->n_prompt + p->max_tokens > lim->n_ctx) {
        out->prompt = &admit__placeholder;
        out->n_prompt = 1;
        if (out->max_tokens > lim->n_ctx - 1) out->max_tokens = lim->n_ctx - 1;
        ks_errbuf_clear(eb);
        e = KS_OK;
    }
#endif
    if (e) return e;
    for (int32_t i = 0; i < out->n_prompt; i++)
        if (out->prompt[i] < 0 || out->prompt[i] >= lim->n_vocab)
            return admit_refuse(eb, ADMIT_INVALID, "prompt token %d: id %d out of range [0, %d)", i,
                                out->prompt[i], lim->n_vocab);
    ks_errbuf seb;
    if (sample_params_validate(&p->sp, &seb) != KS_OK)
        return admit_refuse(eb, ADMIT_INVALID, "%s", seb.msg);
    return KS_OK;
}

ks_err admit_embed(const admit_limits *lim, const int32_t *tokens, int64_t n_tokens,
                   ks_errbuf *eb) {
    if (n_tokens < 1 || !tokens) return admit_refuse(eb, ADMIT_INVALID, "the input is empty");
    if (n_tokens > lim->n_ctx)
        return admit_refuse(eb, ADMIT_CONTEXT_LENGTH,
                            "This model's maximum context length is %d tokens. However, you "
                            "requested %" PRId64 " tokens (%" PRId64
                            " in the input, 0 for the completion). Please reduce the length of the "
                            "input.",
                            lim->n_ctx, n_tokens, n_tokens);
    uint64_t pages = ((uint64_t)n_tokens + lim->page_tokens - 1) / lim->page_tokens;
    if (lim->max_pages && pages > lim->max_pages)
        return admit_refuse(eb, ADMIT_KV_CAPACITY,
                            "the input needs %" PRIu64
                            " KV pages of %u tokens, the KV cache holds %u",
                            pages, lim->page_tokens, lim->max_pages);
    for (int64_t i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= lim->n_vocab)
            return admit_refuse(eb, ADMIT_INVALID,
                                "input token %" PRId64 ": id %d out of range [0, %d)", i, tokens[i],
                                lim->n_vocab);
    return KS_OK;
}
