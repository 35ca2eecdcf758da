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
 * depends on nothing but its own request (I7, as the prefix cache). */
#include "engine_int.h"

#include <inttypes.h>
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
    if (m > 0) r->n_dm = 0; // the prediction's drafts replaced the draft model's in draft[]
    if (m == 0 && r->n_dm > 0) m = r->n_dm < k ? r->n_dm : k; // the draft model's, in draft[]
#ifdef KS_BROKEN_SPEC_SHARED
    if (m == 0) m = spec__shared_lookup(r, k, r->draft);
#endif
    if (m == 0 && (!e->dctx || r->m_lost)) // with a draft model: its drafts
        m = spec__lookup(e, r, k, r->draft);
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
    // with a draft model or NextN, a single draft lost too: rest 2, 4, .. 32
    // steps (their drafts cost passes of their own, and a source that is
    // never right should not cost them every step; a lookup's or a
    // prediction's cost a row). Any draft kept ends the rests.
    if (kept > 0) {
        r->spec_rest_len = 0;
    } else if (drafted == 1 && e->dctx) {
        r->spec_rest_len = r->spec_rest_len ? (r->spec_rest_len * 2 > ENGINE__SPEC_REST_MAX
                                                   ? ENGINE__SPEC_REST_MAX
                                                   : r->spec_rest_len * 2)
                                            : 2;
        r->spec_rest = r->spec_rest_len;
    }
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

// ----------------------------------------------------------------------------
// The draft model (engine_opts.draft)

ks_err engine__spec_dmodel_create(engine *e, ks_errbuf *eb) {
    const engine_opts *o = &e->o;
    if (o->spec_nextn) {
        if (o->draft)
            return ks_seterr(eb, KS_ERR_INVAL,
                             "engine: draft with a draft model or the NextN block, not both");
        ks_err err = model_mtp_create(o->m, &e->mtp, eb);
        if (err) return err;
    }
    const model *dm = e->mtp ? e->mtp : o->draft;
    const model_hparams *dh = model_hp(dm);
    if (dh->n_vocab != e->V)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "draft model: its vocabulary has %d tokens, the model's %d (a draft "
                         "model must share the model's tokenizer)",
                         dh->n_vocab, e->V);
    kv_geom g = model_kv_geom(dm, o->page_tokens, o->kv_type);
    if (g.state_pages > 0 || dh->encoder)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "draft model: %s cannot draft (its state cannot be rolled back past a "
                         "rejected draft)",
                         dh->encoder ? "an encoder" : "a recurrent model");
    ks_err err = kv_pool_create(&g, o->draft_kv_pages ? o->draft_kv_pages : o->kv_pages, o->scrub,
                                &e->dpool, eb);
    if (!err)
        err = model_ctx_create(dm, e->dpool, o->n_threads, o->max_batch_tokens, o->n_ctx,
                               &e->dctx, eb);
    if (err) return err;
    const size_t R = (size_t)o->max_running, B = (size_t)o->max_batch_tokens;
    if (e->mtp) {
        const size_t E = (size_t)dh->n_embd;
        e->m_hin = malloc(sizeof(float) * B * E);
        e->m_hout = malloc(sizeof(float) * B * E);
        if (!e->m_hin || !e->m_hout) return ks_seterr(eb, KS_ERR_NOMEM, "NextN buffers");
    }
    e->dlogits = malloc(sizeof(float) * R * (size_t)e->V);
    e->d_tok = malloc(sizeof(int32_t) * B * 4);
    e->d_seqs = calloc(R, sizeof *e->d_seqs);
    e->d_err = calloc(R, sizeof *e->d_err);
    e->d_req = calloc(R, sizeof *e->d_req);
    if (!e->dlogits || !e->d_tok || !e->d_seqs || !e->d_err || !e->d_req)
        return ks_seterr(eb, KS_ERR_NOMEM, "draft model buffers");
    e->d_pos = e->d_tok + B;
    e->d_seq = e->d_pos + B;
    e->d_out = e->d_seq + B;
    return KS_OK;
}

void engine__spec_dmodel_free(engine *e) {
    model_ctx_free(e->dctx);
    kv_pool_destroy(e->dpool);
    free(e->dlogits);
    free(e->d_tok);
    free(e->d_seqs);
    free(e->d_err);
    free(e->d_req);
    free(e->m_hin);
    free(e->m_hout);
    model_free(e->mtp);
}

void engine__spec_release(engine *e, engine_req *r) {
    if (!r->has_dseq) return;
    kv_seq_release(e->dpool, &r->dseq);
    r->has_dseq = false;
}

/* The greedy token of a logits row (ties: the lower id). */
static int32_t spec__argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Runs the draft model over the n tokens of e->d_* (nr requests in
 * e->d_req); requests whose pass failed stop drafting (their draft pages
 * released: the target's output never depended on them). Returns false
 * when the whole pass failed. */
static bool spec__dpass(engine *e, int nr, int32_t n, int32_t n_out) {
    model_batch b = {.n_tokens = n,
                     .tokens = e->d_tok,
                     .pos = e->d_pos,
                     .seq = e->d_seq,
                     .out_row = e->d_out,
                     .n_out = n_out,
                     .n_seqs = nr,
                     .seqs = e->d_seqs,
                     .seq_err = e->d_err};
    ks_errbuf eb;
    // the NextN head: hidden rows in (m_hin, one per token) and out (with the logits)
    model_hidden h = {.row = e->d_out, .n_rows = n_out, .out = e->m_hout};
    ks_err err = e->mtp ? model_forward_mtp(e->dctx, &b, e->m_hin, e->dlogits, &h, &eb)
                        : model_forward(e->dctx, &b, e->dlogits, &eb);
    for (int j = 0; j < nr; j++) {
        if (!err && !e->d_err[j]) continue;
        engine_req *r = e->d_req[j];
        ks_log(KS_LOG_ERROR, "request %" PRIu64 ": %s: %s; it drafts no more", r->id,
               e->mtp ? "NextN head" : "draft model",
               err ? eb.msg : "KV page check failed (isolation violation)");
        r->n_dm = 0;
        r->spec = false;
        r->dm_want = 0;
        engine__spec_release(e, r);
    }
    return !err;
}

/* Drafts 2 .. kmax of the nr requests in e->d_req with their draft 1 in
 * (n_dm 1): one greedy pass of the draft model or NextN head per draft,
 * each fed the draft before it (the head also its own hidden row of it,
 * e->m_hout row r->m_row). A request whose pass fails drafts no more. */
static void spec__chain(engine *e, int nr, int32_t kmax) {
    const int32_t V = e->V;
    const size_t E = (size_t)model_hp(e->m)->n_embd;
    for (int32_t d = 1; d < kmax; d++) {
        int na = 0;
        for (int j = 0; j < nr; j++) {
            engine_req *r = e->d_req[j];
            if (r->n_dm != d || r->dm_want <= d) continue;
            e->d_req[na] = r;
            e->d_seqs[na] = &r->dseq;
            e->d_tok[na] = r->draft[d - 1];
            e->d_pos[na] = (int32_t)r->dseq.n_tokens;
            e->d_seq[na] = na;
            e->d_out[na] = na;
            if (e->mtp) {
                memcpy(e->m_hin + (size_t)na * E, e->m_hout + (size_t)r->m_row * E,
                       sizeof(float) * E);
                r->m_row = na;
            }
            na++;
        }
        if (na == 0 || !spec__dpass(e, na, na, na)) break;
        for (int j = 0; j < na; j++) {
            engine_req *r = e->d_req[j];
            if (r->n_dm != d) continue; // its pass failed: it drafts no more
            r->draft[d] = spec__argmax(e->dlogits + (size_t)j * (size_t)V, V);
            r->n_dm = d + 1;
        }
        nr = na;
    }
}

void engine__spec_dmodel(engine *e, bool drafting) {
    const int32_t B = e->o.max_batch_tokens, V = e->V;
    int nr = 0;
    int32_t n = 0, n_out = 0, kmax = 0;
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        r->n_dm = 0;
        if (!e->dctx || !drafting || !r->spec || r->mpending || r->spec_rest > 0 ||
            atomic_load(&r->state) != ENGINE_DECODING || engine_stream_backlogged(r->out))
            continue;
        if (r->pred && r->pred_at >= 0 && r->pred_at < r->n_pred) continue; // in step: it drafts
        int32_t k = r->max_tokens - r->n_gen - 1;
        if (k > r->spec_k) k = r->spec_k;
        if (k <= 0 || n >= B) continue;
        const uint32_t L = (uint32_t)(r->n_prompt + r->n_gen); // its tokens so far
        if (!r->has_dseq) { // its draft pages, for every position it can reach
            ks_errbuf eb;
            kv_seq_init(e->dpool, &r->dseq);
            r->d_uid = r->dseq.uid;
            r->has_dseq = true;
            r->d_valid = 0;
            if (kv_seq_reserve(e->dpool, &r->dseq, L + (uint32_t)(r->max_tokens - r->n_gen), &eb)) {
                engine__spec_release(e, r);
                continue; // the draft pool is full: this request drafts by lookup
            }
        }
        if (r->d_valid >= L) r->d_valid = L - 1; // its last token's row again: no step ran it
        if (r->dseq.n_tokens > r->d_valid) kv_seq_truncate(e->dpool, &r->dseq, r->d_valid);
        // catch its draft KV up with its tokens (a prompt may take steps);
        // the last one's row gives the first draft
        uint32_t from = r->dseq.n_tokens, m = L - from;
        if (m > (uint32_t)(B - n)) m = (uint32_t)(B - n);
        e->d_req[nr] = r;
        e->d_seqs[nr] = &r->dseq;
        for (uint32_t j = 0; j < m; j++, n++) {
            e->d_tok[n] = spec__tok(r, (int32_t)(from + j));
            e->d_pos[n] = (int32_t)(from + j);
            e->d_seq[n] = nr;
            e->d_out[n] = from + j == L - 1 ? n_out++ : -1;
        }
        r->d_valid = from + m;
        r->dm_want = from + m == L ? k : 0;
        if (r->dm_want > kmax) kmax = r->dm_want;
        nr++;
    }
    if (nr == 0 || !spec__dpass(e, nr, n, n_out)) return;
    // draft 1 from the catch-up pass's rows, then one pass per further draft
    int32_t row = 0;
    for (int j = 0; j < nr; j++) {
        engine_req *r = e->d_req[j];
        if (r->dm_want == 0) continue; // still catching up (or its pass failed: spec off)
        r->draft[0] = spec__argmax(e->dlogits + (size_t)row++ * (size_t)V, V);
        r->n_dm = r->spec ? 1 : 0;
    }
    spec__chain(e, nr, kmax);
}

// ----------------------------------------------------------------------------
// The NextN head (engine_opts.spec_nextn)
//
// The head's slot i reads the model's final hidden row of position i and
// the token at i + 1, and predicts the token at i + 2; its KV row of slot i
// is written at dseq position i - m_base. Every position the model computes
// for a request (prompt chunks, a decode step's token and kept drafts)
// gives one slot, caught up at the start of the next step from the rows
// that step's pass left in e->hidden. The last slot (position L - 2, with
// the request's newest token) gives draft 1; draft d + 1 is a further slot
// reading the head's own hidden row of draft d (not the model's: the
// drafts are guesses), and those slots are dropped at the next catch-up.

/* Whether r asks the head for drafts this step: it decodes in it. */
static int32_t spec__mtp_want(const engine_req *r, bool drafting) {
    if (!drafting || r->mpending || r->spec_rest > 0 ||
        atomic_load(&r->state) != ENGINE_DECODING || engine_stream_backlogged(r->out))
        return 0;
    if (r->pred && r->pred_at >= 0 && r->pred_at < r->n_pred) return 0; // its prediction drafts
    int32_t k = r->max_tokens - r->n_gen - 1;
    return k < r->spec_k ? (k > 0 ? k : 0) : r->spec_k;
}

/* r's head stops (a position was missed, or no pages): lookup from here on. */
static void spec__mtp_lose(engine *e, engine_req *r, const char *why) {
    ks_log(KS_LOG_DEBUG, "request %" PRIu64 ": NextN head: %s; it drafts by lookup", r->id, why);
    r->m_lost = true;
    r->n_dm = 0;
    engine__spec_release(e, r);
}

void engine__spec_mtp(engine *e, bool drafting) {
    const int32_t V = e->V;
    const size_t E = (size_t)model_hp(e->m)->n_embd;
    int nr = 0;
    int32_t n = 0, n_out = 0, kmax = 0;
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        const int32_t hn = r->mh_n;
        r->mh_n = 0;
        if (!r->spec || r->m_lost) continue;
        if (hn == 0) continue; // nothing new computed: the drafts it had still stand
        r->n_dm = 0;
        if (!r->has_dseq) { // its head pages, for every position it can reach
            ks_errbuf eb;
            kv_seq_init(e->dpool, &r->dseq);
            r->d_uid = r->dseq.uid;
            r->has_dseq = true;
            r->d_valid = 0;
            r->m_base = r->mh_pos0;
            const uint32_t need = (uint32_t)(r->n_prompt + r->max_tokens - r->m_base);
            if (kv_seq_reserve(e->dpool, &r->dseq, need, &eb)) {
                spec__mtp_lose(e, r, "its KV pool is full");
                continue;
            }
        }
        if (r->mh_pos0 - r->m_base != (int32_t)r->d_valid) {
            spec__mtp_lose(e, r, "a position was not computed in step");
            continue;
        }
        if (r->dseq.n_tokens > r->d_valid) kv_seq_truncate(e->dpool, &r->dseq, r->d_valid);
        e->d_req[nr] = r;
        e->d_seqs[nr] = &r->dseq;
        r->dm_want = spec__mtp_want(r, drafting);
        for (int32_t j = 0; j < hn; j++, n++) {
            const int32_t slot = r->mh_pos0 + j; // its token: the one after it
            e->d_tok[n] = spec__tok(r, slot + 1);
            e->d_pos[n] = slot - r->m_base;
            e->d_seq[n] = nr;
            e->d_out[n] = j == hn - 1 && r->dm_want ? (r->m_row = n_out++) : -1;
            memcpy(e->m_hin + (size_t)n * E, e->hidden + (size_t)(r->mh_row0 + j) * E,
                   sizeof(float) * E);
        }
        r->d_valid += (uint32_t)hn;
        if (r->dm_want > kmax) kmax = r->dm_want;
        nr++;
    }
    if (nr == 0 || !spec__dpass(e, nr, n, n_out)) return;
    for (int j = 0; j < nr; j++) {
        engine_req *r = e->d_req[j];
        if (r->dm_want == 0) continue;
        r->draft[0] = spec__argmax(e->dlogits + (size_t)r->m_row * (size_t)V, V);
        r->n_dm = 1;
    }
    // draft d + 1: a slot after the last, with draft d and the head's own row
    spec__chain(e, nr, kmax);
}
