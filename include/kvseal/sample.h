/* sample.h — token sampling over a logits vector, and stop-string matching
 * over the streamed text (module `engine`, sampling part).
 *
 * The sampler applies llama.cpp's default chain: penalties -> top-k -> top-p
 * -> min-p -> temperature -> seeded random draw (temperature 0: argmax).
 * Each stage works on the survivors of the one before, renormalized; top-p
 * and min-p see temperature-1 probabilities (temperature only shapes the
 * final draw). Candidates are ordered by (logit desc, id asc), so ties at a
 * cut always keep the lower ids.
 * It is reproducible: the same params (seed included) and the same sequence
 * of logits give the same tokens on every IEEE-754 machine, because it uses
 * its own PRNG (xoshiro256** seeded by splitmix64) and its own exp/log for
 * every value a decision depends on (no rand(), no libm in the decisions).
 * Design notes: docs/design.md, comments at the top of src/engine/sample.c. */
#ifndef KS_SAMPLE_H
#define KS_SAMPLE_H

#include <float.h>

#include "kvseal/base.h"

// ----------------------------------------------------------------------------
// Parameters

#define SAMPLE_MAX_TOP 20            /* most alternatives a result can carry */
#define SAMPLE_MAX_LAST_N (1 << 20)  /* largest penalty window, in tokens */

/* The sampler parameters, one row each: the single list every copy is
 * generated from (issue 39; the house idiom, as KS_ERR_MAP). Columns:
 *   field   sample_params member (also the pd_msg_sampling member)
 *   T       SAMPLE_F32 (float) or SAMPLE_I32 (int32_t)
 *   key     its JSON key in OpenAI / Workers AI requests (server/sampling_json.c),
 *           NULL: read by hand (n_probs comes from logprobs/top_logprobs)
 *   alias   a second JSON key for the same field, read before key (NULL: none)
 *   def     sample_params_default's value
 *   off     the value that turns it off; a cluster worker reads it when the
 *           ADMIT/PREFILL sampling extension is absent
 *   lo, lo_open, hi   what sample_params_validate accepts: lo < x (lo_open) or
 *           lo <= x, and x <= hi; NaN never (FLT_MAX as hi: finite only)
 *   what    its message: "<field> must be <what>, got <value>"
 *   jhi     the HTTP API's upper bound (the lower is lo): out of [lo, jhi] is
 *           "'<key>' must be in [lo, jhi], got <value>"
 *   wire    SAMPLE_WIRE_BASE: a fixed slot of ADMIT/PREFILL coded by hand in
 *           pd/msg.c (frozen); SAMPLE_WIRE_EXT: a 4-byte slot of the sampling
 *           extension, in row order (generated; adding one changes the layout:
 *           bump PD_VERSION, docs/pd-protocol.md)
 *   cli     `kvseal run` option (--NAME; integers in [lo, jhi])
 *   anth    also a field of Anthropic's Messages API (passed through as is)
 * A new parameter: one row here, its effect where it acts (the sampler, or
 * engine.c), and README. */
#define SAMPLE_PARAM_MAP(X)                                                                        \
    /* 0 means greedy: argmax, ties to the lowest id */                                            \
    X(temperature, SAMPLE_F32, "temperature", NULL, 0.8f, 1.0f, 0, 0, FLT_MAX,                     \
      "a finite number >= 0", 2, SAMPLE_WIRE_BASE, "temp", 1)                                      \
    /* 0 or -1 disables; >= n_vocab disables */                                                    \
    X(top_k, SAMPLE_I32, "top_k", NULL, 40, 0, -1, 0, INT32_MAX, ">= -1 (0 or -1 disables)",       \
      INT32_MAX, SAMPLE_WIRE_BASE, "top-k", 1)                                                     \
    /* 1 disables */                                                                               \
    X(top_p, SAMPLE_F32, "top_p", NULL, 0.95f, 1.0f, 0, 1, 1, "in (0, 1]", 1, SAMPLE_WIRE_BASE,    \
      "top-p", 1)                                                                                  \
    /* 0 disables; relative to the top token */                                                    \
    X(min_p, SAMPLE_F32, "min_p", NULL, 0.05f, 0.0f, 0, 0, 1, "in [0, 1]", 1, SAMPLE_WIRE_BASE,    \
      "min-p", 0)                                                                                  \
    /* 1 disables; llama.cpp: logit > 0 divide, else multiply */                                   \
    X(repeat_penalty, SAMPLE_F32, "repeat_penalty", "repetition_penalty", 1.0f, 1.0f, 0, 1,        \
      FLT_MAX, "a finite number > 0 (1 disables)", 10, SAMPLE_WIRE_EXT, "repeat-penalty", 0)       \
    /* window of accepted tokens the three penalties count over; 0 disables them all */            \
    X(repeat_last_n, SAMPLE_I32, "repeat_last_n", NULL, 64, 0, 0, 0, SAMPLE_MAX_LAST_N,            \
      "in [0, 1048576] (0 disables penalties; pass the context length for the whole context)",     \
      SAMPLE_MAX_LAST_N, SAMPLE_WIRE_EXT, "repeat-last-n", 0)                                      \
    /* logit -= freq * count (OpenAI) */                                                           \
    X(frequency_penalty, SAMPLE_F32, "frequency_penalty", NULL, 0.0f, 0.0f, -2, 0, 2,              \
      "in [-2, 2]", 2, SAMPLE_WIRE_EXT, "frequency-penalty", 0)                                    \
    /* logit -= presence * (count > 0) (OpenAI) */                                                 \
    X(presence_penalty, SAMPLE_F32, "presence_penalty", NULL, 0.0f, 0.0f, -2, 0, 2, "in [-2, 2]",  \
      2, SAMPLE_WIRE_EXT, "presence-penalty", 0)                                                   \
    /* alternatives to report */                                                                   \
    X(n_probs, SAMPLE_I32, NULL, NULL, 0, 0, 0, 0, SAMPLE_MAX_TOP, "in [0, 20]", SAMPLE_MAX_TOP,   \
      SAMPLE_WIRE_BASE, "n-probs", 0)                                                              \
    /* vLLM's: end-of-generation tokens and stop strings cannot end generation before this many    \
       tokens were generated (the engine bans EOG; stop strings are looked for from the            \
       min_tokens-th token's text on); max_tokens still ends it */                                 \
    X(min_tokens, SAMPLE_I32, "min_tokens", NULL, 0, 0, 0, 0, INT32_MAX, ">= 0", INT32_MAX,        \
      SAMPLE_WIRE_EXT, "min-tokens", 0)

#define SAMPLE_F32 1
#define SAMPLE_I32 2
#define SAMPLE_WIRE_BASE 0
#define SAMPLE_WIRE_EXT 1
#define SAMPLE_CTYPE_SAMPLE_F32 float
#define SAMPLE_CTYPE_SAMPLE_I32 int32_t
/* The members of SAMPLE_PARAM_MAP's rows, for a struct body. */
#define SAMPLE__FIELD(field, T, ...) SAMPLE_CTYPE_##T field;
#define SAMPLE_PARAM_FIELDS SAMPLE_PARAM_MAP(SAMPLE__FIELD)

/* Caller-allocated; fill with sample_params_default, then override. The
 * ranges are SAMPLE_PARAM_MAP's. */
typedef struct sample_params {
    SAMPLE_PARAM_FIELDS
    uint64_t seed; /* PRNG seed; the caller picks a random one if the
                      request has none (the sampler never does) */
    bool logprobs; /* fill sample_result.logprob (costs one pass over the
                      vocabulary; implied by n_probs > 0) */
} sample_params;

/* Fills p with llama.cpp-like defaults (SAMPLE_PARAM_MAP's def column):
 * temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off
 * (repeat_penalty 1, repeat_last_n 64, frequency/presence 0), n_probs 0,
 * min_tokens 0, seed 0, logprobs off. Can't fail. */
void sample_params_default(sample_params *p);

/* Checks every field's range. Returns KS_OK, or KS_ERR_INVAL with a message
 * in eb naming the first bad field, its allowed range and the value given
 * ("top_p must be in (0, 1], got 0"). eb may be NULL. Pure; thread-safe. */
ks_err sample_params_validate(const sample_params *p, ks_errbuf *eb) KS_MUST_USE;

/* True when p's penalties change a draw: a window (repeat_last_n > 0) and
 * one of repeat/frequency/presence not neutral. The one place that says
 * which penalty values are "off" (the sampler, the grammar's greedy
 * shortcut and the cluster's codec ask it). Pure. */
bool sample_params_penalized(const sample_params *p);

// ----------------------------------------------------------------------------
// Sampler: one per sequence, owned and used by one thread at a time.

typedef struct sampler sampler;

/* What sampler_sample chose. Caller-allocated.
 *
 * Log-probabilities are reported under ONE documented distribution: the
 * log-softmax of the PENALIZED logits over the FULL vocabulary at
 * temperature 1, i.e. before top-k/top-p/min-p truncation and before
 * temperature: the model's penalty-adjusted belief, taken as what OpenAI's
 * `logprobs` report. It does not depend on the truncation knobs, and the
 * greedy and sampled paths agree on it. (llama.cpp's n_probs and vLLM's
 * default logprobs use the logits before penalties; with penalties off,
 * the default, all three agree.) */
typedef struct sample_result {
    int32_t token;                       /* chosen id, in [0, n_vocab) */
    float logprob;                       /* log p(token); 0 unless logprobs or n_probs > 0 */
    int n_top;                           /* entries in top_* (= n_probs, or n_vocab if smaller) */
    int32_t top_ids[SAMPLE_MAX_TOP];     /* most likely ids, best first (ties: lower id first);
                                            the chosen token may or may not be among them */
    float top_logprobs[SAMPLE_MAX_TOP];  /* their log-probabilities */
} sample_result;

/* Creates a sampler for a vocabulary of n_vocab ids with a copy of *p. It
 * preallocates every buffer sampler_sample needs (8*n_vocab bytes + 16 KiB,
 * plus 4*n_vocab + 4*repeat_last_n when penalties are on), so sampling
 * never allocates. On success *out is owned by the caller (free
 * with sampler_destroy). Errors: KS_ERR_INVAL (bad params, as
 * sample_params_validate; n_vocab <= 0), KS_ERR_NOMEM. *out is NULL on error. */
ks_err sampler_create(const sample_params *p, int32_t n_vocab, sampler **out /* OUT */,
                      ks_errbuf *eb) KS_MUST_USE;
/* Frees the sampler; accepts NULL. */
void sampler_destroy(sampler *s);
/* Forgets the penalty history and restarts the PRNG from params.seed, so the
 * sampler behaves exactly like a fresh one. Can't fail. */
void sampler_reset(sampler *s);
/* Appends tok (0 <= tok < n_vocab, asserted) to the penalty history; only the
 * last repeat_last_n accepted tokens count. The caller decides what counts:
 * accept the prompt too for llama.cpp behaviour, only generated tokens for
 * OpenAI's. A no-op when penalties are off. O(1); can't fail. */
void sampler_accept(sampler *s, int32_t tok);
/* sampler_accept for each of toks[0..n). */
void sampler_accept_n(sampler *s, const int32_t *toks, int64_t n);
/* Random draws taken since creation or the last reset: with the seed, the
 * whole PRNG state (what a prefill worker hands to decode in DONE). O(1). */
uint64_t sampler_draws(const sampler *s);
/* Restarts the PRNG from params.seed and advances it by n draws, so a fresh
 * sampler continues another one's sequence; the penalty history is kept.
 * O(n); can't fail. */
void sampler_skip_draws(sampler *s, uint64_t n);
/* logit_bias (OpenAI): a bias added to one token's logit before anything
 * else in the chain (before the penalties), so -100 effectively bans a
 * token and +100 all but forces it. Reported logprobs see the biased
 * logits (they are what the sampler draws from). */
#define SAMPLE_MAX_BIAS 1024     /* most entries one request may carry */
#define SAMPLE_BIAS_LIMIT 100.0f /* |bias| <= this */
typedef struct sample_bias {
    int32_t token; /* in [0, n_vocab) */
    float bias;    /* in [-SAMPLE_BIAS_LIMIT, SAMPLE_BIAS_LIMIT] */
} sample_bias;

/* Checks n entries (n in [0, SAMPLE_MAX_BIAS], ids in [0, n_vocab), finite
 * biases in range). KS_ERR_INVAL with a message naming the first bad entry
 * ("logit_bias: token id 99999 out of range [0, 32000)"); eb may be NULL.
 * Pure; thread-safe. */
ks_err sample_bias_validate(const sample_bias *b, int n, int32_t n_vocab,
                            ks_errbuf *eb) KS_MUST_USE;
/* Gives the sampler a copy of the n bias entries (replacing any before;
 * n 0 removes them); a repeated token's biases add up. Errors: as
 * sample_bias_validate, KS_ERR_NOMEM. Call before sampling; the sampler
 * never allocates while sampling. */
ks_err sampler_set_bias(sampler *s, const sample_bias *b, int n, ks_errbuf *eb) KS_MUST_USE;

/* The log-probabilities sampler_sample reports, for any logits row: the
 * log-softmax of logits (n_vocab floats, unchanged; sanitized as the
 * sampler does) at token, into out->logprob, and the n_top (<=
 * SAMPLE_MAX_TOP) most likely ids into out->top_* (out->token = token).
 * For prompt logprobs (echo). Pure; can't fail. */
void sample_logprobs_row(const float *logits, int32_t n_vocab, int32_t token, int n_top,
                         sample_result *out /* OUT */);

/* Chooses the next token from logits (n_vocab floats, caller-owned). The
 * logit biases (sampler_set_bias), then the penalties, are applied IN PLACE (only to biased tokens
 * and tokens in the window); nothing else in logits changes, so on return it holds the biased,
 * penalized logits. NaN logits count as -FLT_MAX and +-inf as +-FLT_MAX. Does not accept the token
 * (call sampler_accept). Never allocates; O(n_vocab) plus small sorts;
 * can't fail. */
void sampler_sample(sampler *s, float *logits, sample_result *out /* OUT */);

// ----------------------------------------------------------------------------
// Stop strings over streamed text

typedef struct stop_matcher stop_matcher;

/* What stop_matcher_push / _flush allow the caller to send now. */
typedef struct stop_result {
    const char *text; /* bytes safe to emit; points into the matcher, valid until
                         its next call; not NUL-terminated */
    size_t len;       /* number of bytes at text */
    bool matched;     /* a stop string occurred: text ends right before it and
                         generation must stop; later pushes emit nothing */
    int stop_index;   /* index of the matched stop string, -1 if none */
} stop_result;

/* Creates a matcher for n_stops stop strings (NUL-terminated, copied; the
 * caller keeps ownership of its array). n_stops may be 0 (text passes through
 * unchanged). Errors: KS_ERR_INVAL (n_stops < 0, a NULL or empty string),
 * KS_ERR_NOMEM. On success *out is owned by the caller. */
ks_err stop_matcher_create(const char *const *stops, int n_stops, stop_matcher **out /* OUT */,
                           ks_errbuf *eb) KS_MUST_USE;
/* Frees the matcher; accepts NULL. */
void stop_matcher_destroy(stop_matcher *m);
/* Feeds the next detokenized piece (len bytes, may be 0). Holds back the
 * longest suffix of the text that is a proper prefix of a stop string and
 * emits the rest. When several stop strings occur, the one that ENDS first
 * wins (ties: the longer one), which is what a byte-by-byte stream would see,
 * so the output does not depend on how the text is split into pieces. With
 * valid UTF-8 pieces and stop strings, emitted text ends on a character
 * boundary. Errors: KS_ERR_NOMEM (out then emits nothing; the matcher is
 * unchanged). */
ks_err stop_matcher_push(stop_matcher *m, const char *piece, size_t len,
                         stop_result *out /* OUT */) KS_MUST_USE;
/* Ends the stream (EOS, max tokens): emits whatever is still held back (no
 * stop string can complete any more). Nothing after a match. Can't fail. */
void stop_matcher_flush(stop_matcher *m, stop_result *out /* OUT */);

#endif /* KS_SAMPLE_H */
