/* grammar_sample.c — one constrained draw (grammar_sample, declared in
 * grammar.h): the grammar module's mask over the row
 * (grammar_matcher_mask_logits), the engine's sampler (sample.c), then the
 * matcher advanced by the pick (grammar_matcher_accept_pick). It lives in
 * engine because it calls the sampler: the grammar module stays a floor
 * below engine and calls nothing up. */
#include "kvseal/admit.h"
#include "kvseal/grammar.h"

/* A refusal of the grammar (KS_ERR_INVAL: too ambiguous, or no token can
 * continue it) carries reason INVALID, so the server answers 400 where
 * nothing was sent yet; returns e. */
static ks_err grammar_sample__refusal(ks_err e, ks_errbuf *eb) {
    if (e == KS_ERR_INVAL && eb) eb->reason = ADMIT_INVALID;
    return e;
}

ks_err grammar_sample(grammar_matcher *m, const grammar_vocab *gv, sampler *smp,
                      const sample_params *sp, float *logits, uint32_t *mask, sample_result *out,
                      bool *end, ks_errbuf *eb) {
    *end = false;
    const bool complete = grammar_matcher_complete(m);
    if (sp->temperature <= 0.0f && !sp->logprobs && sp->n_probs == 0 &&
        !sample_params_penalized(sp)) {
        // Greedy without penalties or logprobs: the argmax of the full row,
        // when the grammar accepts it, is the argmax of the masked row too
        // (masking only lowers the others; ties still go to the lowest id),
        // and greedy draws nothing from the PRNG and leaves the row as it
        // was; so try it first and build the mask only when it is refused.
        sample_result sr;
        sampler_sample(smp, logits, &sr);
        if (grammar_vocab_is_eog(gv, sr.token) ? complete
                                               : grammar_matcher_accept_token(m, gv, sr.token)) {
            *out = sr;
            return KS_OK;
        }
    }
    ks_err e = grammar_matcher_mask_logits(m, gv, complete, logits, mask, end, eb);
    if (e != KS_OK || *end) return grammar_sample__refusal(e, eb);
    sample_result sr;
    sampler_sample(smp, logits, &sr);
    e = grammar_matcher_accept_pick(m, gv, mask, &sr.token, eb);
    if (e != KS_OK) return grammar_sample__refusal(e, eb);
    *out = sr;
    return KS_OK;
}
