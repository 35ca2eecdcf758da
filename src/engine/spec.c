/* spec.c — speculative decoding's drafts (engine.h: engine_opts.spec_tokens;
 * docs/speculative.md).
 *
 * A request that speculates proposes, each decode step, up to spec_k tokens
 * that it guesses will follow its last one; the step computes them in the
 * same pass as that token (one read of the weights), and engine.c's
 * engine__verify keeps the longest run the request's own draws confirm.
 *
 * Where drafts come from, in order:
 *   1. its prediction (OpenAI's predicted outputs): while the output has
 *      followed it, the prediction's next ids; once the output leaves it,
 *      the prediction is searched for the output's last n-gram to step in
 *      again;
 *   2. prompt lookup: the latest earlier occurrence, in the request's own
 *      prompt and output, of its last n tokens (n = spec_ngram_max down to
 *      spec_ngram_min), and the tokens that followed it.
 * Both read only the request's own tokens: a draft never carries another
 * request's text, and whether a draft is kept (the speed a client sees)
 * depends on nothing but its own request (I6). */
#include "engine_int.h"

#include <stdlib.h>
#include <string.h>

/* Token i of r's history: its prompt, then what it generated. */
static inline int32_t spec__tok(const engine_req *r, int32_t i) {
    return i < r->n_prompt ? r->prompt[i] : r->gen[i - r->n_prompt];
}

/* Whether the n tokens of r's history at a equal those at b. */
static bool spec__eq(const engine_req *r, int32_t a, int32_t b, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (spec__tok(r, a + i) != spec__tok(r, b + i)) return false;
    return true;
}

/* Prompt lookup: up to k tokens that followed the latest earlier
 * occurrence of r's last n-gram (the longest n that occurs), into out.
 * O(history * n) per call: a scan back, no index to keep. */
static int32_t spec__lookup(const engine *e, const engine_req *r, int32_t k, int32_t *out) {
    const int32_t L = r->n_prompt + r->n_gen;
    for (int32_t n = e->o.spec_ngram_max; n >= e->o.spec_ngram_min; n--) {
        if (n < 1 || n >= L) continue;
        const int32_t key = L - n; // the last n tokens
        const int32_t last = spec__tok(r, L - 1);
        for (int32_t s = key - 1; s >= 0; s--) { // latest first
            if (spec__tok(r, s + n - 1) != last || !spec__eq(r, s, key, n)) continue;
            int32_t m = 0;
            for (int32_t j = s + n; j < L && m < k; j++)
                out[m++] = spec__tok(r, j);
            if (m > 0) return m;
        }
    }
    return 0;
}

/* The prediction: in step with the output, its next ids; out of step, the
 * first place its ids repeat the output's last n tokens (n as above). */
static int32_t spec__predicted(const engine *e, engine_req *r, int32_t k, int32_t *out) {
    if (r->pred_at < 0) { // step in again where the output's last n-gram occurs
        const int32_t L = r->n_prompt + r->n_gen;
        for (int32_t n = e->o.spec_ngram_max; n >= e->o.spec_ngram_min && r->pred_at < 0; n--) {
            if (n < 1 || n > r->n_gen) continue;
            for (int32_t s = 0; s + n < r->n_pred; s++) {
                int32_t i = 0;
                while (i < n && r->pred[s + i] == spec__tok(r, L - n + i))
                    i++;
                if (i == n) {
                    r->pred_at = s + n;
                    break;
                }
            }
        }
        if (r->pred_at < 0) return 0;
    }
    int32_t m = 0;
    for (int32_t j = r->pred_at; j < r->n_pred && m < k; j++)
        out[m++] = r->pred[j];
    return m;
}

#ifdef KS_BROKEN_SPEC_SHARED
/* TEST ONLY (I9): the broken build's draft source shared by every request:
 * the prompts of the requests that drafted before, in one table (what a
 * server-wide n-gram cache or suffix tree over the traffic is). Its drafts
 * never change an output (verification), only how many are kept: the
 * timing channel tests/e2e/spec_channel_run.sh measures. */
static int32_t spec__shared[8192];
static int32_t spec__n_shared;

static int32_t spec__shared_lookup(const engine_req *r, int32_t k, int32_t *out) {
    if (r->n_gen == 1) // its first draft: its prompt joins the table
        for (int32_t i = 0; i < r->n_prompt && spec__n_shared < 8192; i++)
            spec__shared[spec__n_shared++] = r->prompt[i];
    const int32_t L = r->n_prompt + r->n_gen;
    if (L < 2) return 0;
    for (int32_t s = spec__n_shared - 2; s >= 0; s--) {
        if (spec__shared[s] != spec__tok(r, L - 2) || spec__shared[s + 1] != spec__tok(r, L - 1))
            continue;
        int32_t m = 0;
        for (int32_t j = s + 2; j < spec__n_shared && m < k; j++)
            out[m++] = spec__shared[j];
        if (m > 0) return m;
    }
    return 0;
}
#endif

int32_t engine__spec_draft(engine *e, engine_req *r, int32_t k) {
    if (k > r->spec_k) k = r->spec_k;
    if (k <= 0) return 0;
    int32_t m = r->pred ? spec__predicted(e, r, k, r->draft) : 0;
#ifdef KS_BROKEN_SPEC_SHARED
    if (m == 0) m = spec__shared_lookup(r, k, r->draft);
#endif
    if (m == 0) m = spec__lookup(e, r, k, r->draft);
    return m;
}

void engine__spec_taken(engine_req *r, int32_t tok) {
    if (!r->gen) return;
    r->gen[r->n_gen - 1] = tok; // engine__take counted it
    if (r->pred && r->pred_at >= 0)
        r->pred_at = r->pred_at < r->n_pred && r->pred[r->pred_at] == tok ? r->pred_at + 1 : -1;
}

void engine__spec_adapt(const engine *e, engine_req *r, int32_t drafted, int32_t kept) {
    // all kept: ask for more (up to spec_tokens); none: half as many. A
    // wrong draft costs its row's compute, a kept one saves a whole pass.
    if (kept == drafted)
        r->spec_k = r->spec_k * 2 > e->o.spec_tokens ? e->o.spec_tokens : r->spec_k * 2;
    else if (kept == 0)
        r->spec_k = r->spec_k / 2 > 1 ? r->spec_k / 2 : 1;
}

ks_err engine__spec_init(engine *e, engine_req *r, const engine_params *p, ks_errbuf *eb) {
    r->pred_at = -1;
    // a recurrent state cannot be rolled back past a rejected draft; a
    // grammar's draws run on the mask threads, one at a time
    if (e->o.spec_tokens <= 0 || p->no_spec || p->grammar || r->max_tokens < 2 ||
        kv_pool_geom(e->pool)->state_pages > 0)
        return KS_OK;
    r->gen = malloc(sizeof(int32_t) * (size_t)r->max_tokens);
    int32_t np = p->prediction ? p->n_prediction : 0;
    if (np > e->o.n_ctx) np = e->o.n_ctx; // past it nothing could be drafted from it
    if (np > 0 && (r->pred = malloc(sizeof(int32_t) * (size_t)np)))
        memcpy(r->pred, p->prediction, sizeof(int32_t) * (size_t)np), r->n_pred = np, r->pred_at = 0;
    if (!r->gen || (np > 0 && !r->pred)) return ks_seterr(eb, KS_ERR_NOMEM, "request");
    r->spec = true;
    r->spec_k = e->o.spec_tokens;
    return KS_OK;
}
