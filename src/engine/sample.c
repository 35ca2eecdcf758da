/* sample.c — the sampler: penalties -> top-k -> top-p -> min-p ->
 * temperature -> seeded draw, over one logits vector per call.
 *
 * Contract (sample.h): no allocation per call; reproducible bit for bit on
 * any IEEE-754 machine. Every value a decision depends on comes from +,-,*,/
 * in double, our own exp/log below, and xoshiro256**; candidates are ordered
 * by the total order (logit desc, id asc), so ties never depend on a sort's
 * stability. Each stage keeps a prefix of that order, which is what lets us
 * avoid sorting the vocabulary: top-k is a heap (small k) or a radix
 * pre-pass plus quickselect, top-p grows its sorted prefix geometrically,
 * min-p is a single threshold. Costs at n_vocab 152k (instructions per
 * call): greedy ~2M, default chain (top-k 40) ~1M, anything that needs the
 * softmax of the whole vocabulary (top-p without top-k, no truncation at
 * all, logprobs) ~10M, dominated by exp. Like every file here, this one
 * must not be built with -ffast-math (the -0 and NaN handling relies on
 * IEEE semantics). */
#include "kvseal/sample.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* GCC: -std=c11 already implies -ffp-contract=off */
#endif

// ----------------------------------------------------------------------------
// Params

void sample_params_default(sample_params *p) {
    KS_ASSERT(p);
    memset(p, 0, sizeof *p);
#define SAMPLE__DEF(field, T, key, alias, def, ...) p->field = def;
    SAMPLE_PARAM_MAP(SAMPLE__DEF)
#undef SAMPLE__DEF
    p->seed = 0;
    p->logprobs = false;
}

/* The "got" part of a message: %g for floats, %d for integers. */
#define SAMPLE__FMT_SAMPLE_F32 "%g"
#define SAMPLE__FMT_SAMPLE_I32 "%d"
#define SAMPLE__ARG_SAMPLE_F32(v) (double)(v)
#define SAMPLE__ARG_SAMPLE_I32(v) (int)(v)

_Static_assert(SAMPLE_MAX_LAST_N == 1048576 && SAMPLE_MAX_TOP == 20,
               "SAMPLE_PARAM_MAP's messages spell these out");

bool sample_params_penalized(const sample_params *p) {
    return p->repeat_last_n > 0 && (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
                                    p->presence_penalty != 0.0f);
}

ks_err sample_params_validate(const sample_params *p, ks_errbuf *eb) {
    if (!p) return ks_seterr(eb, KS_ERR_INVAL, "sample params: NULL");
    // in the row order; the !(x >= a) forms also reject NaN
#define SAMPLE__CHECK(field, T, key, alias, def, off, lo, lo_open, hi, what, ...)                  \
    if (!((lo_open ? (double)p->field > (double)(lo) : (double)p->field >= (double)(lo)) &&        \
          (double)p->field <= (double)(hi)))                                                       \
        return ks_seterr(eb, KS_ERR_INVAL, #field " must be " what ", got " SAMPLE__FMT_##T,       \
                         SAMPLE__ARG_##T(p->field));
    SAMPLE_PARAM_MAP(SAMPLE__CHECK)
#undef SAMPLE__CHECK
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Deterministic math and PRNG

/* 2^(j/32), j = 0..31, as exact hexadecimal constants. */
static const double sample__exp2_tab[32] = {
    0x1.0000000000000p+0,
    0x1.059b0d3158574p+0,
    0x1.0b5586cf9890fp+0,
    0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0,
    0x1.1d4873168b9aap+0,
    0x1.2387a6e756238p+0,
    0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0,
    0x1.371a7373aa9cbp+0,
    0x1.3dea64c123422p+0,
    0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0,
    0x1.5342b569d4f82p+0,
    0x1.5ab07dd485429p+0,
    0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0,
    0x1.71f75e8ec5f74p+0,
    0x1.7a11473eb0187p+0,
    0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0,
    0x1.93737b0cdc5e5p+0,
    0x1.9c49182a3f090p+0,
    0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0,
    0x1.b7f76f2fb5e47p+0,
    0x1.c199bdd85529cp+0,
    0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0,
    0x1.dfc97337b9b5fp+0,
    0x1.ea4afa2a490dap+0,
    0x1.f50765b6e4540p+0,
};

/* exp(x) for x <= 0 (x below -708, or NaN, is taken as -708: the result
 * then rounds to 0 in float). x = (32e + j) ln2/32 + r with |r| <= ln2/64
 * (Cody-Waite split of ln2/32: k*hi is exact), exp(r) by a degree-4
 * polynomial (relative error < 1e-12), times 2^(j/32) from the table and an
 * exact 2^e. Only +,-,* and exact scalings: identical on every IEEE-754
 * machine, unlike libm's expf, and short dependency chains so loops over
 * the vocabulary overlap iterations. */
static inline double sample__exp(double x) {
    x = x > -708.0 ? x : -708.0;
    int k = (int)(x * 0x1.71547652b82fep+5 - 0.5); // round(x * 32/ln2) for x <= 0
    double r = x - (double)k * 0x1.62e42fefa0000p-6; // ln2/32 high part
    r = r - (double)k * 0x1.cf79abc9e3b3ap-45;      // ln2/32 low part
    double r2 = r * r;
    double p = (1.0 + r) + r2 * (0.5 + r * (1.0 / 6.0)) + (r2 * r2) * (1.0 / 24.0);
    int j = k & 31, e = (k - j) / 32; // e in [-1022, 0]: a normal 2^e
    uint64_t bits = (uint64_t)(int64_t)(e + 1023) << 52;
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return sample__exp2_tab[j] * p * scale;
}

/* log(x) for x > 0 finite: frexp (exact) and the atanh series
 * log(m) = 2(s + s^3/3 + ...), s = (m-1)/(m+1), |s| <= 0.172. Deterministic
 * like sample__exp; used for the min-p threshold and for logprobs. */
static double sample__log(double x) {
    int e;
    double m = frexp(x, &e); // m in [0.5, 1)
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e -= 1;
    }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double p = 1.0 / 19.0;
    for (int i = 17; i >= 1; i -= 2) p = p * s2 + 1.0 / (double)i;
    return 2.0 * s * p + (double)e * 0.69314718055994530942;
}

static uint64_t sample__splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t sample__rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman & Vigna): one 64-bit output per call. */
static uint64_t sample__next(uint64_t st[4]) {
    uint64_t result = sample__rotl(st[1] * 5, 7) * 9;
    uint64_t t = st[1] << 17;
    st[2] ^= st[0];
    st[3] ^= st[1];
    st[1] ^= st[2];
    st[0] ^= st[3];
    st[2] ^= t;
    st[3] = sample__rotl(st[3], 45);
    return result;
}

static void sample__seed(uint64_t st[4], uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) st[i] = sample__splitmix64(&x);
}

/* Uniform in [0, 1) with 53 random bits. */
static double sample__uniform(uint64_t st[4]) {
    return (double)(sample__next(st) >> 11) * 0x1.0p-53;
}

// ----------------------------------------------------------------------------
// Candidates and their order

#define SAMPLE__BINS 4096 // top 12 bits of a float key: sign, exponent, 3 mantissa bits

typedef struct sample__cand {
    int32_t id;
    float v; // logit while selecting; the draw weight once temperature is applied
} sample__cand;

struct sampler {
    sample_params p;
    int32_t n_vocab;
    double log_min_p;     // log(min_p), 0 when min_p is 0 (unused)
    bool penalties_on;
    uint64_t rng[4];      // xoshiro256** state
    uint64_t draws;       // PRNG outputs taken since creation / reset / skip base
    sample__cand *cand;   // (n_vocab) scratch
    uint32_t bins[SAMPLE__BINS]; // radix-select histogram scratch
    int32_t *counts;      // (n_vocab) occurrences in the window; NULL if penalties off
    int32_t *hist;        // (repeat_last_n) ring of accepted ids; NULL if penalties off
    int32_t hist_head;    // next slot to write
    int32_t hist_len;     // filled slots, <= repeat_last_n
    sample_bias *bias;    // (n_bias) logit_bias entries; NULL if none
    int n_bias;
};

/* NaN -> -FLT_MAX, +-inf -> +-FLT_MAX, -0 -> +0, so the order is total,
 * every difference to the max is a number, and equal values look equal. */
static inline float sample__sane(float x) {
    x = x > -FLT_MAX ? x : -FLT_MAX; // NaN and -inf fail the compare
    return (x < FLT_MAX ? x : FLT_MAX) + 0.0f; // and -0 becomes +0
}

#define SAMPLE__LANES 8 // independent chains: fixed order, so still reproducible

/* Max of the raw values x[0..n) (NaN ignored; -FLT_MAX if none is larger)
 * in SAMPLE__LANES independent chains, so it runs at throughput rather than
 * at the latency of one compare-select chain. */
static float sample__rawmax(const float *x, int32_t n) {
    float m[SAMPLE__LANES];
    for (int j = 0; j < SAMPLE__LANES; j++) m[j] = -FLT_MAX;
    int32_t i = 0;
    for (; i + SAMPLE__LANES <= n; i += SAMPLE__LANES)
        for (int j = 0; j < SAMPLE__LANES; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    float M = m[0];
    for (int j = 1; j < SAMPLE__LANES; j++) M = m[j] > M ? m[j] : M;
    return M;
}

/* The total order of candidates: higher logit first, then lower id. */
static inline bool sample__better(sample__cand a, sample__cand b) {
    return a.v > b.v || (a.v == b.v && a.id < b.id);
}

static void sample__heap_down(sample__cand *h, int32_t m, int32_t i) {
    // min-heap under `better`: the root is the worst kept candidate
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < m && sample__better(h[w], h[l])) w = l;
        if (r < m && sample__better(h[w], h[r])) w = r;
        if (w == i) return;
        sample__cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Heapsort of c[0..n), best first: the fallback of sample__sort. */
static void sample__heapsort(sample__cand *c, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) sample__heap_down(c, n, i);
    for (int32_t end = n - 1; end > 0; end--) { // the worst goes last
        sample__cand t = c[0];
        c[0] = c[end];
        c[end] = t;
        sample__heap_down(c, end, 0);
    }
}

/* Branch-free Lomuto partition of c[lo..hi] around the element at pi:
 * always swap, advance on `better`; [st, i) holds only worse elements, so
 * the swap never breaks the split. Returns the pivot's final index. */
static int32_t sample__partition(sample__cand *c, int32_t lo, int32_t hi, int32_t pi) {
    sample__cand pv = c[pi];
    c[pi] = c[hi];
    c[hi] = pv;
    int32_t st = lo;
    for (int32_t i = lo; i < hi; i++) {
        sample__cand t = c[i];
        c[i] = c[st];
        c[st] = t;
        st += sample__better(t, pv);
    }
    c[hi] = c[st];
    c[st] = pv;
    return st;
}

/* Sorts c[0..n) best first, in place, without allocating (qsort may call
 * malloc; glibc's does). Quicksort with a fixed pseudo-random pivot and
 * insertion sort below 16; past a depth limit a range falls back to
 * heapsort, so the worst case stays O(n log n). The order is total, so the
 * result is unique whatever the algorithm. */
static void sample__sort(sample__cand *c, int32_t n) {
    struct sample__range {
        int32_t lo, hi, depth;
    } stack[64];
    int sp = 0;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    stack[sp++] = (struct sample__range){0, n - 1, 0};
    while (sp > 0) {
        int32_t lo = stack[sp - 1].lo, hi = stack[sp - 1].hi, depth = stack[sp - 1].depth;
        sp--;
        while (hi - lo >= 16) {
            if (depth++ > 48) {
                sample__heapsort(c + lo, hi - lo + 1);
                lo = hi; // done with this range
                break;
            }
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int32_t p = sample__partition(c, lo, hi, lo + (int32_t)(x % (uint64_t)(hi - lo + 1)));
            // push the larger side, loop on the smaller: the stack stays
            // under log2(n) entries
            if (p - lo > hi - p) {
                stack[sp++] = (struct sample__range){lo, p - 1, depth};
                lo = p + 1;
            } else {
                stack[sp++] = (struct sample__range){p + 1, hi, depth};
                hi = p - 1;
            }
        }
        for (int32_t i = lo + 1; i <= hi; i++) { // insertion sort of the rest
            sample__cand t = c[i];
            int32_t j = i;
            for (; j > lo && sample__better(t, c[j - 1]); j--) c[j] = c[j - 1];
            c[j] = t;
        }
    }
}

#define SAMPLE__HEAP_MAX 256 // up to this many, one pass with a heap beats the rest

/* Monotone map of a sanitized float to u32: a > b  <=>  key(a) > key(b)
 * (sample__sane has turned -0 into +0, so equal floats get equal keys). */
static inline uint32_t sample__key(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* Reorders c[0..n) so that c[0..m) are its m best (in no order). Quickselect
 * with a fixed pseudo-random pivot: expected O(n), never varies from run to
 * run, and keys are distinct under the total order, so equal logits do not
 * degrade it. */
static void sample__select(sample__cand *c, int32_t n, int32_t m) {
    int32_t lo = 0, hi = n - 1, kth = m - 1;
    uint64_t x = 0x2545F4914F6CDD1Dull;
    while (lo < hi) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int32_t st = sample__partition(c, lo, hi, lo + (int32_t)(x % (uint64_t)(hi - lo + 1)));
        if (st == kth) return;
        if (st > kth) hi = st - 1;
        else lo = st + 1;
    }
}

/* Fills dst[0..m) with the m best of logits[0..n) (sanitized), sorted best
 * first. dst has room for n; bins is SAMPLE__BINS scratch counters.
 * Small m: one pass comparing against a heap's root (almost every element
 * is rejected by one compare, a block of 16 at a time). Large m: a radix
 * pre-pass (histogram of the top 12 key bits) finds the bucket holding the
 * m-th best, only tokens from that bucket up are copied, and quickselect
 * finishes on those few. */
static void sample__top(const float *logits, int32_t n, int32_t m, sample__cand *dst,
                        uint32_t *bins) {
    KS_ASSERT(m >= 1 && m <= n);
    if (m == n) {
        for (int32_t i = 0; i < n; i++) dst[i] = (sample__cand){i, sample__sane(logits[i])};
    } else if (m <= SAMPLE__HEAP_MAX) {
        for (int32_t i = 0; i < m; i++) dst[i] = (sample__cand){i, sample__sane(logits[i])};
        for (int32_t i = m / 2 - 1; i >= 0; i--) sample__heap_down(dst, m, i);
        // Ids only grow from here, so a newcomer must be strictly larger than
        // the root to get in: a block with no raw value above it is skipped
        // whole (NaN compares false, like its sanitized -FLT_MAX would).
        const int32_t B = 16;
        for (int32_t i0 = m; i0 < n; i0 += B) {
            int32_t i1 = n - i0 < B ? n : i0 + B;
            if (i1 - i0 == B) {
                const float thr = dst[0].v;
                int hit = 0;
                for (int32_t j = 0; j < B; j++) hit |= logits[i0 + j] > thr;
                if (!hit) continue;
            }
            for (int32_t i = i0; i < i1; i++) {
                sample__cand c = {i, sample__sane(logits[i])};
                if (c.v > dst[0].v) {
                    dst[0] = c;
                    sample__heap_down(dst, m, 0);
                }
            }
        }
    } else {
        memset(bins, 0, SAMPLE__BINS * sizeof *bins);
        for (int32_t i = 0; i < n; i++) bins[sample__key(sample__sane(logits[i])) >> 20]++;
        int32_t b = SAMPLE__BINS - 1;
        for (uint32_t above = 0; above + bins[b] < (uint32_t)m; b--) above += bins[b];
        const uint32_t lo_key = (uint32_t)b << 20;
        int32_t n_c = 0;
        for (int32_t i = 0; i < n; i++) {
            float v = sample__sane(logits[i]);
            if (sample__key(v) >= lo_key) dst[n_c++] = (sample__cand){i, v};
        }
        sample__select(dst, n_c, m);
    }
    sample__sort(dst, m);
}

// ----------------------------------------------------------------------------
// Sampler lifetime and penalty history

ks_err sampler_create(const sample_params *p, int32_t n_vocab, sampler **out, ks_errbuf *eb) {
    KS_ASSERT(out);
    *out = NULL;
    ks_err err = sample_params_validate(p, eb);
    if (err) return err;
    if (n_vocab <= 0)
        return ks_seterr(eb, KS_ERR_INVAL, "sampler: n_vocab must be > 0, got %d", (int)n_vocab);
    sampler *s = calloc(1, sizeof *s);
    if (!s) goto fail;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->log_min_p = p->min_p > 0.0f ? sample__log((double)p->min_p) : 0.0;
    s->penalties_on = sample_params_penalized(p);
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    if (!s->cand) goto fail;
    if (s->penalties_on) {
        s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
        s->hist = malloc((size_t)p->repeat_last_n * sizeof *s->hist);
        if (!s->counts || !s->hist) goto fail;
    }
    sample__seed(s->rng, p->seed);
    *out = s;
    return KS_OK;
fail:
    sampler_destroy(s);
    return ks_seterr(eb, KS_ERR_NOMEM, "sampler: out of memory for n_vocab %d", (int)n_vocab);
}

void sampler_destroy(sampler *s) {
    if (!s) return;
    free(s->hist);
    free(s->counts);
    free(s->cand);
    free(s->bias);
    free(s);
}

void sampler_reset(sampler *s) {
    KS_ASSERT(s);
    if (s->penalties_on) {
        // clear only what the window touched
        for (int32_t i = 0; i < s->hist_len; i++) s->counts[s->hist[i]] = 0;
    }
    s->hist_head = 0;
    s->hist_len = 0;
    sample__seed(s->rng, s->p.seed);
    s->draws = 0;
}

uint64_t sampler_draws(const sampler *s) {
    KS_ASSERT(s);
    return s->draws;
}

void sampler_skip_draws(sampler *s, uint64_t n) {
    KS_ASSERT(s);
    // (seed, draws) is the whole PRNG state: replaying the draws is exact,
    // and O(n) is cheap next to the forward passes those draws came from
    sample__seed(s->rng, s->p.seed);
    for (uint64_t i = 0; i < n; i++) (void)sample__next(s->rng);
    s->draws = n;
}

void sampler_accept(sampler *s, int32_t tok) {
    KS_ASSERT(s);
    KS_ASSERT(tok >= 0 && tok < s->n_vocab);
    if (!s->penalties_on) return;
    int32_t W = s->p.repeat_last_n;
    if (s->hist_len == W) s->counts[s->hist[s->hist_head]]--; // evict the oldest
    else s->hist_len++;
    s->hist[s->hist_head] = tok;
    s->counts[tok]++;
    s->hist_head = s->hist_head + 1 == W ? 0 : s->hist_head + 1;
}

void sampler_accept_n(sampler *s, const int32_t *toks, int64_t n) {
    KS_ASSERT(n == 0 || toks);
    for (int64_t i = 0; i < n; i++) sampler_accept(s, toks[i]);
}

/* Applies the three penalties once to each distinct token in the window.
 * counts[t] is negated while t is done, then restored: O(window), no extra
 * memory, and tokens outside the window are never read. The expressions
 * are llama.cpp's, in float, so tests can recompute them bit for bit. */
static void sample__penalize(sampler *s, float *logits) {
    const float rp = s->p.repeat_penalty, fp = s->p.frequency_penalty,
                pp = s->p.presence_penalty;
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[i], c = s->counts[t];
        if (c <= 0) continue; // already done
        float l = logits[t];
        if (rp != 1.0f) l = l <= 0.0f ? l * rp : l / rp;
        l -= (float)c * fp + (float)(c > 0) * pp;
        logits[t] = l;
        s->counts[t] = -c;
    }
    for (int32_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[i];
        if (s->counts[t] < 0) s->counts[t] = -s->counts[t];
    }
}

// ----------------------------------------------------------------------------
// Sampling

/* Largest sanitized logit: NaN and -inf never beat -FLT_MAX, +inf clamps. */
static double sample__max(const float *logits, int32_t n) {
    float M = sample__rawmax(logits, n);
    return (double)(M > FLT_MAX ? FLT_MAX : M);
}

/* Sum of exp(l - M) over the whole vocabulary, in a fixed lane order. */
static double sample__sumexp(const float *logits, int32_t n, double M) {
    double acc[SAMPLE__LANES] = {0};
    int32_t i = 0;
    for (; i + SAMPLE__LANES <= n; i += SAMPLE__LANES)
        for (int j = 0; j < SAMPLE__LANES; j++)
            acc[j] += sample__exp((double)sample__sane(logits[i + j]) - M);
    for (; i < n; i++) acc[0] += sample__exp((double)sample__sane(logits[i]) - M);
    double Z = 0.0;
    for (int j = 0; j < SAMPLE__LANES; j++) Z += acc[j];
    return Z;
}

/* Greedy: first index of the largest sanitized logit. The max comes first
 * (fast), then the first index holding it; ids whose sanitized value equals
 * a clamped max (+-inf, NaN at -FLT_MAX) are matched the same way. */
static int32_t sample__argmax(const float *logits, int32_t n) {
    float M = sample__rawmax(logits, n);
    if (M > FLT_MAX) M = FLT_MAX;
    for (int32_t i = 0; i < n; i++)
        if (sample__sane(logits[i]) == M) return i;
    return 0; // unreachable: some logit sanitizes to M
}

/* Builds the candidate list after top-k, top-p and min-p. Returns its size;
 * *M_out is the largest candidate logit. Sorted best first whenever a
 * truncation needed the order; otherwise (only min-p, or nothing) in id
 * order, which is just as deterministic. */
static int32_t sample__truncate(sampler *s, const float *logits, double *M_out) {
    const int32_t n = s->n_vocab;
    sample__cand *c = s->cand;
    const double top_p = (double)s->p.top_p, L = s->log_min_p;
    const bool use_p = s->p.top_p < 1.0f, use_min_p = s->p.min_p > 0.0f;
    int32_t n_c;
    double M;

    if (s->p.top_k > 0 && s->p.top_k < n) {
        // top-k, then top-p and min-p renormalized over those k (the chain)
        n_c = s->p.top_k;
        sample__top(logits, n, n_c, c, s->bins);
        M = (double)c[0].v;
        if (use_p) {
            double Z = 0.0;
            for (int32_t i = 0; i < n_c; i++) Z += sample__exp((double)c[i].v - M);
            double cum = 0.0, target = top_p * Z;
            for (int32_t i = 0; i < n_c; i++) {
                cum += sample__exp((double)c[i].v - M);
                if (cum >= target) {
                    n_c = i + 1;
                    break;
                }
            }
        }
        if (use_min_p) {
            int32_t k = 1; // the best always stays
            while (k < n_c && (double)c[k].v - M >= L) k++;
            n_c = k;
        }
    } else if (use_p) {
        // top-p over the whole vocabulary: Z needs every token, but only the
        // kept prefix needs sorting
        M = sample__max(logits, n);
        double Z = sample__sumexp(logits, n, M), target = top_p * Z;
        if (use_min_p) {
            // min-p survivors are a prefix; top-p keeps a prefix; keep the shorter
            n_c = 0;
            for (int32_t i = 0; i < n; i++) {
                float v = sample__sane(logits[i]);
                if ((double)v - M >= L) c[n_c++] = (sample__cand){i, v};
            }
            sample__sort(c, n_c);
            double cum = 0.0;
            for (int32_t i = 0; i < n_c; i++) {
                cum += sample__exp((double)c[i].v - M);
                if (cum >= target) {
                    n_c = i + 1;
                    break;
                }
            }
        } else {
            // grow the sorted prefix geometrically until it holds top_p of
            // the mass; total work stays O(n) expected
            int32_t m = n < 64 ? n : 64;
            for (;;) {
                sample__top(logits, n, m, c, s->bins);
                double cum = 0.0;
                int32_t cut = -1;
                for (int32_t i = 0; i < m; i++) {
                    cum += sample__exp((double)c[i].v - M);
                    if (cum >= target) {
                        cut = i + 1;
                        break;
                    }
                }
                if (cut > 0) {
                    n_c = cut;
                    break;
                }
                if (m == n) { // rounding left cum a hair short of top_p*Z: keep all
                    n_c = n;
                    break;
                }
                m = m > n / 4 ? n : m * 4;
            }
        }
    } else {
        // no order needed: copy (min-p survivors, or everything) in id order
        M = sample__max(logits, n);
        n_c = 0;
        for (int32_t i = 0; i < n; i++) {
            float v = sample__sane(logits[i]);
            if (!use_min_p || (double)v - M >= L) c[n_c++] = (sample__cand){i, v};
        }
    }
    *M_out = M;
    return n_c;
}

/* Fills out->logprob (of out->token) and the n_probs best alternatives
 * (see sample_result) from the log-softmax of logits[0..n). */
static void sample__logprobs_n(const float *logits, int32_t n, int32_t n_probs,
                               sample_result *out) {
    double M = sample__max(logits, n);
    double logZ = M + sample__log(sample__sumexp(logits, n, M)); // sum >= 1: the max adds 1
    out->logprob = (float)((double)sample__sane(logits[out->token]) - logZ);
    int32_t n_top = n_probs < n ? n_probs : n;
    if (n_top > 0) {
        sample__cand top[SAMPLE_MAX_TOP];
        // heap select into a stack array: sample__top needs n slots only for large m
        for (int32_t i = 0; i < n_top; i++) top[i] = (sample__cand){i, sample__sane(logits[i])};
        for (int32_t i = n_top / 2 - 1; i >= 0; i--) sample__heap_down(top, n_top, i);
        for (int32_t i = n_top; i < n; i++) {
            sample__cand c = {i, sample__sane(logits[i])};
            if (sample__better(c, top[0])) {
                top[0] = c;
                sample__heap_down(top, n_top, 0);
            }
        }
        sample__sort(top, n_top);
        for (int32_t i = 0; i < n_top; i++) {
            out->top_ids[i] = top[i].id;
            out->top_logprobs[i] = (float)((double)top[i].v - logZ);
        }
    }
    out->n_top = (int)n_top;
}

static void sample__logprobs(const sampler *s, const float *logits, sample_result *out) {
    sample__logprobs_n(logits, s->n_vocab, s->p.n_probs, out);
}

void sample_logprobs_row(const float *logits, int32_t n_vocab, int32_t token, int n_top,
                         sample_result *out) {
    KS_ASSERT(logits && out && n_vocab > 0 && token >= 0 && token < n_vocab);
    KS_ASSERT(n_top >= 0 && n_top <= SAMPLE_MAX_TOP);
    out->token = token;
    sample__logprobs_n(logits, n_vocab, n_top, out);
}

// ----------------------------------------------------------------------------
// logit_bias

ks_err sample_bias_validate(const sample_bias *b, int n, int32_t n_vocab, ks_errbuf *eb) {
    if (n < 0 || n > SAMPLE_MAX_BIAS)
        return ks_seterr(eb, KS_ERR_INVAL, "logit_bias may hold at most %d entries, got %d",
                         SAMPLE_MAX_BIAS, n);
    if (n > 0 && !b) return ks_seterr(eb, KS_ERR_INVAL, "logit_bias: NULL entries");
    for (int i = 0; i < n; i++) {
        if (b[i].token < 0 || b[i].token >= n_vocab)
            return ks_seterr(eb, KS_ERR_INVAL, "logit_bias: token id %d out of range [0, %d)",
                             (int)b[i].token, (int)n_vocab);
        if (!(b[i].bias >= -SAMPLE_BIAS_LIMIT && b[i].bias <= SAMPLE_BIAS_LIMIT))
            return ks_seterr(eb, KS_ERR_INVAL,
                             "logit_bias: the bias of token %d must be in [-100, 100], got %g",
                             (int)b[i].token, (double)b[i].bias);
    }
    return KS_OK;
}

ks_err sampler_set_bias(sampler *s, const sample_bias *b, int n, ks_errbuf *eb) {
    KS_ASSERT(s);
    ks_err err = sample_bias_validate(b, n, s->n_vocab, eb);
    if (err) return err;
    sample_bias *copy = NULL;
    if (n > 0) {
        copy = malloc((size_t)n * sizeof *copy);
        if (!copy) return ks_seterr(eb, KS_ERR_NOMEM, "logit_bias: out of memory");
        memcpy(copy, b, (size_t)n * sizeof *copy);
    }
    free(s->bias);
    s->bias = copy;
    s->n_bias = n;
    return KS_OK;
}

/* Adds the biases in place, in entry order (a fixed order, so repeated ids
 * add up reproducibly). A NaN logit stays NaN (the sampler's -FLT_MAX). */
static void sample__bias(const sampler *s, float *logits) {
    for (int i = 0; i < s->n_bias; i++)
        logits[s->bias[i].token] += s->bias[i].bias;
}

void sampler_sample(sampler *s, float *logits, sample_result *out) {
    KS_ASSERT(s && logits && out);
    out->logprob = 0.0f;
    out->n_top = 0;
    if (s->n_bias) sample__bias(s, logits);
    if (s->penalties_on) sample__penalize(s, logits);

    if (s->p.temperature <= 0.0f) {
        out->token = sample__argmax(logits, s->n_vocab);
    } else {
        double M;
        int32_t n_c = sample__truncate(s, logits, &M);
        sample__cand *c = s->cand;
        // temperature, then the draw: weights exp((l - M) / T), M the kept max
        const double inv_t = 1.0 / (double)s->p.temperature;
        double acc[SAMPLE__LANES] = {0};
        int32_t i0 = 0;
        for (; i0 + SAMPLE__LANES <= n_c; i0 += SAMPLE__LANES) {
            for (int j = 0; j < SAMPLE__LANES; j++) {
                float w = (float)sample__exp(((double)c[i0 + j].v - M) * inv_t);
                c[i0 + j].v = w;
                acc[j] += (double)w;
            }
        }
        for (; i0 < n_c; i0++) {
            float w = (float)sample__exp(((double)c[i0].v - M) * inv_t);
            c[i0].v = w;
            acc[0] += (double)w;
        }
        double Z = 0.0;
        for (int j = 0; j < SAMPLE__LANES; j++) Z += acc[j];
        double target = sample__uniform(s->rng) * Z, cum = 0.0;
        s->draws++; // the only PRNG draw: sampler_draws counts exactly these
        int32_t pick = -1;
        for (int32_t i = 0; i < n_c; i++) {
            if (c[i].v <= 0.0f) continue;
            cum += (double)c[i].v;
            pick = i; // rounding: if target is never passed, the last positive wins
            if (target < cum) break;
        }
        // Z >= 1 (the max weighs exp(0)), so some weight is positive
        KS_ASSERT(pick >= 0);
        out->token = c[pick].id;
    }
    if (s->p.logprobs || s->p.n_probs > 0) sample__logprobs(s, logits, out);
}
