/* admit.c — the request contract (include/kvseal/admit.h): the refusal
 * table and the admission checks (I4) shared by every front end. */
#include "kvseal/admit.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "kvseal/engine.h"
#include "kvseal/sample.h"

/* Generated from ADMIT_REASON_MAP (admit.h), whose order is the wire value
 * and the metric's order. Workers AI codes are the documented ones
 * (developers.cloudflare.com/workers-ai/platform/errors) where one fits,
 * else the HTTP status: 5006 is what Workers AI answers for input that fails
 * its checks ("Bad input"), 3003 a missing field, 3042 an unknown model, 3006
 * too large, 3007 a timeout, 3008 aborted, 3036 the account's (here: the
 * key's) limits, 3040 out of capacity (retry), 10000 Cloudflare's API
 * authentication error. docs/api.md "Errors" has the table. */
static const admit_info admit__table[ADMIT__COUNT] = {
    [ADMIT_OK] = {"ok", 200, NULL, NULL, 200, KS_OK, ""},
#define ADMIT__ROW(E, v, kind, name, status, type, code, wcode, err, msg)                          \
    [ADMIT_##E] = {name, status, type, code, wcode, err, msg},
    ADMIT_REASON_MAP(ADMIT__ROW)
#undef ADMIT__ROW
};

#define ADMIT__ONE(...) +1
_Static_assert(ADMIT__COUNT == 1 ADMIT_REASON_MAP(ADMIT__ONE),
               "ADMIT_REASON_MAP: the values must run 1, 2, 3, ... in the rows' order");
#undef ADMIT__ONE

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
    uint64_t pages = (held + lim->page_tokens - 1) / lim->page_tokens + lim->state_pages;
    if (lim->max_pages && pages > lim->max_pages)
        return admit_refuse(
            eb, ADMIT_KV_CAPACITY,
            "the request needs %" PRIu64 " KV pages of %u tokens (%s%s), the KV cache "
            "holds %u",
            pages, lim->page_tokens, lim->prompt_only ? "its prompt" : "prompt and completion",
            lim->state_pages ? " and its recurrent state" : "", lim->max_pages);
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

ks_err admit_encoder(const char *arch, ks_errbuf *eb) {
    return admit_refuse(eb, ADMIT_INVALID,
                        "this model (%s) is an embedding encoder: it has no LM head and serves "
                        "only /v1/embeddings",
                        arch);
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
    uint64_t pages =
        ((uint64_t)n_tokens + lim->page_tokens - 1) / lim->page_tokens + lim->state_pages;
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
