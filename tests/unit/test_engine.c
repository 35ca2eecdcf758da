/* test_engine.c — unit tests of module `engine`: the sampler (including the
 * draw count a prefill worker hands to decode) and the stop matcher
 * (include/kvseal/sample.h).
 *
 * Statistical tests use fixed seeds, so they are deterministic; their
 * tolerances are set so that each named bug moves the statistic far past
 * them. A reference xoshiro256** and splitmix64 written here independently pins
 * the exact draw sequence that makes outputs reproducible across machines.
 * This file includes src/engine/sample.c to test its static helpers (the
 * selection against a sort oracle, exp/log against libm). */
#include "kvseal/admit.h"
#include "kvseal/engine.h"
#include "kvseal/sample.h"

#include <float.h>
#include <time.h>

#include "../check.h"
// White-box: the selection and math helpers are static. The library's copy
// of sample.c is then never pulled from the archive (every symbol it defines
// is defined here first), so there is no duplicate.
#include "../../src/engine/sample.c"

// ----------------------------------------------------------------------------
// Helpers

static sampler *mk(const sample_params *p, int32_t n_vocab) {
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    sampler *s = NULL;
    ks_err e = sampler_create(p, n_vocab, &s, &eb);
    if (e) fprintf(stderr, "sampler_create: %s\n", eb.msg);
    CHECK_EQ(e, KS_OK);
    CHECK(s);
    return s;
}

/* Params with every truncation off: plain temperature sampling. */
static sample_params plain(float temp, uint64_t seed) {
    sample_params p;
    sample_params_default(&p);
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

/* Draws n_draws tokens from the same logits; counts[id] += 1 per draw. */
static void draw_counts(const sample_params *p, const float *logits, int32_t n, int n_draws,
                        long *counts) {
    sampler *s = mk(p, n);
    float *buf = malloc((size_t)n * sizeof *buf);
    CHECK(buf);
    memset(counts, 0, (size_t)n * sizeof *counts);
    for (int i = 0; i < n_draws; i++) {
        memcpy(buf, logits, (size_t)n * sizeof *buf);
        sample_result r;
        sampler_sample(s, buf, &r);
        CHECK(r.token >= 0 && r.token < n);
        counts[r.token]++;
    }
    free(buf);
    sampler_destroy(s);
}

/* Which ids were drawn at least once, as a bitmask (n <= 64). */
static uint64_t drawn_set(const sample_params *p, const float *logits, int32_t n, int n_draws) {
    long counts[64];
    CHECK(n <= 64);
    draw_counts(p, logits, n, n_draws, counts);
    uint64_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (counts[i]) m |= 1ull << i;
    return m;
}

/* Small LCG for test data (not the thing under test). */
static uint32_t t_rand(uint64_t *st) {
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*st >> 33);
}
static float t_randf(uint64_t *st) { return (float)t_rand(st) / 2147483648.0f; } // [0, 1)

// Reference PRNG, written from the published algorithms.
static uint64_t ref_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t ref_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t ref_xoshiro(uint64_t s[4]) {
    uint64_t r = ref_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t;
    s[3] = ref_rotl(s[3], 45);
    return r;
}

// ----------------------------------------------------------------------------
// Params

static void test_params_validate(void) {
    sample_params d;
    sample_params_default(&d);
    CHECK_NEAR(d.temperature, 0.8, 1e-7);
    CHECK_EQ(d.top_k, 40);
    CHECK_NEAR(d.top_p, 0.95, 1e-7);
    CHECK_NEAR(d.min_p, 0.05, 1e-7);
    CHECK_NEAR(d.repeat_penalty, 1.0, 0);
    CHECK_EQ(d.n_probs, 0);
    ks_errbuf eb;
    CHECK_EQ(sample_params_validate(&d, &eb), KS_OK);

    sample_params p;
#define BAD(field, val, want)                                                    \
    do {                                                                         \
        p = d;                                                                   \
        p.field = (val);                                                         \
        ks_errbuf_clear(&eb);                                                    \
        CHECK_EQ(sample_params_validate(&p, &eb), KS_ERR_INVAL);                 \
        CHECK_EQ(eb.code, KS_ERR_INVAL);                                         \
        CHECK_STR_HAS(eb.msg, want);                                             \
        sampler *s_ = (sampler *)&p; /* non-NULL sentinel */                      \
        CHECK_EQ(sampler_create(&p, 10, &s_, &eb), KS_ERR_INVAL);                \
        CHECK(s_ == NULL);                                                       \
    } while (0)
    BAD(temperature, -0.5f, "temperature must be a finite number >= 0, got -0.5");
    BAD(temperature, NAN, "temperature");
    BAD(temperature, INFINITY, "temperature");
    BAD(top_k, -2, "top_k must be >= -1 (0 or -1 disables), got -2");
    BAD(top_p, 0.0f, "top_p must be in (0, 1], got 0");
    BAD(top_p, 1.5f, "top_p must be in (0, 1], got 1.5");
    BAD(top_p, NAN, "top_p");
    BAD(min_p, -0.1f, "min_p must be in [0, 1], got -0.1");
    BAD(min_p, 2.0f, "min_p must be in [0, 1], got 2");
    BAD(repeat_penalty, 0.0f, "repeat_penalty must be a finite number > 0 (1 disables), got 0");
    BAD(repeat_last_n, -1, "repeat_last_n must be in [0, 1048576]");
    BAD(repeat_last_n, SAMPLE_MAX_LAST_N + 1, "got 1048577");
    BAD(frequency_penalty, 2.5f, "frequency_penalty must be in [-2, 2], got 2.5");
    BAD(presence_penalty, -3.0f, "presence_penalty must be in [-2, 2], got -3");
    BAD(n_probs, 21, "n_probs must be in [0, 20], got 21");
    BAD(n_probs, -1, "n_probs must be in [0, 20], got -1");
    BAD(min_tokens, -1, "min_tokens must be >= 0, got -1");
#undef BAD

    // edges that are valid
    p = d;
    p.temperature = 0.0f;
    p.top_k = -1;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.repeat_last_n = 0;
    p.frequency_penalty = -2.0f;
    p.presence_penalty = 2.0f;
    p.n_probs = 20;
    CHECK_EQ(sample_params_validate(&p, &eb), KS_OK);

    sampler *s = NULL;
    CHECK_EQ(sampler_create(&d, 0, &s, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "n_vocab must be > 0, got 0");
    CHECK(s == NULL);
    sampler_destroy(NULL);
}

// ----------------------------------------------------------------------------
// Greedy and top-k

static void test_greedy_argmax(void) {
    enum { N = 1000 };
    static float l[N], orig[N];
    uint64_t st = 7;
    for (int i = 0; i < N; i++) l[i] = t_randf(&st) * 10.0f - 5.0f;
    l[617] = 9.0f;
    l[123] = NAN; // never wins
    memcpy(orig, l, sizeof l);
    sample_params p = plain(0.0f, 1);
    sampler *s = mk(&p, N);
    sample_result r;
    sampler_sample(s, l, &r);
    CHECK_EQ(r.token, 617);
    CHECK_MEM_EQ(l, orig, sizeof l); // penalties off: logits untouched
    // ties go to the lowest id, wherever the first one sits
    l[900] = 9.0f;
    l[40] = 9.0f;
    sampler_sample(s, l, &r);
    CHECK_EQ(r.token, 40);
    l[0] = 9.0f;
    sampler_sample(s, l, &r);
    CHECK_EQ(r.token, 0);
    // -inf and NaN everywhere but one
    for (int i = 0; i < N; i++) l[i] = (i & 1) ? -INFINITY : NAN;
    l[N - 1] = -1e30f;
    sampler_sample(s, l, &r);
    CHECK_EQ(r.token, N - 1);
    sampler_destroy(s);
}

static void test_topk1_equals_greedy(void) {
    enum { N = 5000 };
    static float l[N];
    const float temps[] = {0.05f, 0.7f, 1.0f, 3.0f, 100.0f};
    uint64_t st = 99;
    for (int trial = 0; trial < 20; trial++) {
        for (int i = 0; i < N; i++) l[i] = t_randf(&st) * 4.0f;
        int want = (int)(t_rand(&st) % N);
        l[want] = 5.0f;
        if (trial % 3 == 0) l[N - 1] = 5.0f; // a tie after `want`: still want
        if (trial % 5 == 0) {                 // a tie before it: the lower id
            int lo = want / 2;
            l[lo] = 5.0f;
            want = lo;
        }
        for (size_t t = 0; t < sizeof temps / sizeof temps[0]; t++) {
            sample_params p = plain(temps[t], (uint64_t)trial * 31 + t);
            p.top_k = 1;
            sampler *s = mk(&p, N);
            for (int k = 0; k < 5; k++) {
                sample_result r;
                sampler_sample(s, l, &r);
                CHECK_EQ(r.token, want);
            }
            sampler_destroy(s);
        }
    }
}

/* top-k keeps exactly the k best (ties by lower id), renormalized */
static void test_top_k(void) {
    const float l[8] = {1.0f, 3.0f, 2.0f, 3.0f, 0.5f, 2.5f, -1.0f, 2.0f};
    sample_params p = plain(5.0f, 3); // hot: everything kept would show up
    p.top_k = 4;                      // 1,3 (3.0), 5 (2.5), then 2 beats 7 (tie 2.0)
    CHECK_EQ(drawn_set(&p, l, 8, 4000), (1u << 1) | (1u << 3) | (1u << 5) | (1u << 2));
    p.top_k = 8; // == n_vocab: disabled
    CHECK_EQ(drawn_set(&p, l, 8, 4000), 0xFFu);
    p.top_k = -1;
    CHECK_EQ(drawn_set(&p, l, 8, 4000), 0xFFu);
}

// ----------------------------------------------------------------------------
// White-box: helpers against oracles

static void test_exp_log(void) {
    double worst = 0;
    for (double x = -708.0; x <= 0.0; x += 0.00137) {
        double e = fabs(sample__exp(x) - exp(x)) / exp(x);
        worst = e > worst ? e : worst;
    }
    fprintf(stderr, "  exp max rel err %.3g\n", worst);
    CHECK(worst < 1e-11);
    CHECK(sample__exp(0.0) == 1.0);
    CHECK(sample__exp(-1e-300) == 1.0);
    CHECK(sample__exp(-INFINITY) < 1e-300);
    CHECK(sample__exp(NAN) < 1e-300);
    CHECK((float)sample__exp(-800.0) == 0.0f);
    worst = 0;
    for (double x = 1e-300; x < 1e300; x *= 1.0037) {
        double e = fabs(sample__log(x) - log(x));
        worst = e > worst ? e : worst;
    }
    fprintf(stderr, "  log max abs err %.3g\n", worst);
    CHECK(worst < 1e-12);
    CHECK(sample__log(1.0) == 0.0);
}

static int oracle_cmp(const void *pa, const void *pb) {
    const sample__cand *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return a->id < b->id ? -1 : (a->id > b->id);
}

/* sample__top (heap, radix + quickselect, and sort) against a full sort of
 * the sanitized logits, on data full of ties, NaN, +-inf and -0/+0. */
static void test_top_select_oracle(void) {
    const int32_t ns[] = {1, 2, 15, 16, 17, 33, 100, 1000, 5000};
    const int32_t ms[] = {1, 2, 3, 15, 16, 17, 40, 255, 256, 257, 1000, 4999};
    const float pool[] = {-1.0f, -0.0f, 0.0f, 1.0f, 2.0f, 0.5f, -3.0f, NAN, INFINITY, -INFINITY};
    static float l[5000];
    static sample__cand got[5000], want[5000];
    static uint32_t bins[SAMPLE__BINS];
    uint64_t st = 555;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        const int32_t n = ns[a];
        for (int mode = 0; mode < 3; mode++) {
            for (int32_t i = 0; i < n; i++) {
                if (mode == 0) l[i] = pool[t_rand(&st) % 10];         // ties and specials
                else if (mode == 1) l[i] = t_randf(&st) * 8.0f - 4.0f; // distinct
                else l[i] = (float)(i % 7) - (float)((i * 13) % 5) * 0.25f; // patterned
            }
            for (int32_t i = 0; i < n; i++) want[i] = (sample__cand){i, sample__sane(l[i])};
            qsort(want, (size_t)n, sizeof *want, oracle_cmp);
            for (size_t b = 0; b < sizeof ms / sizeof ms[0] + 3; b++) {
                // plus cuts at 40%, 50%, 60%: inside the -0/+0 group of mode 0
                const size_t nm = sizeof ms / sizeof ms[0];
                int32_t m = b < nm ? ms[b] : n * (int32_t)(4 + b - nm) / 10;
                m = m < 1 ? 1 : (m < n ? m : n);
                sample__top(l, n, m, got, bins);
                for (int32_t i = 0; i < m; i++) {
                    if (got[i].id != want[i].id)
                        fprintf(stderr, "  n %d m %d mode %d: [%d] id %d want %d\n", (int)n,
                                (int)m, mode, (int)i, (int)got[i].id, (int)want[i].id);
                    CHECK_EQ(got[i].id, want[i].id);
                    CHECK(got[i].v == want[i].v);
                }
            }
        }
    }
    // the sort alone, on sizes around the insertion-sort cut-off
    for (int32_t n = 1; n < 70; n++) {
        for (int32_t i = 0; i < n; i++) got[i] = (sample__cand){i, pool[t_rand(&st) % 7]};
        memcpy(want, got, (size_t)n * sizeof *got);
        sample__sort(got, n);
        qsort(want, (size_t)n, sizeof *want, oracle_cmp);
        for (int32_t i = 0; i < n; i++) CHECK_EQ(got[i].id, want[i].id);
    }
}

// ----------------------------------------------------------------------------
// Reproducibility

static void test_reference_prng(void) {
    // the reference itself against published values: xoshiro256** from
    // state {1,2,3,4}, splitmix64 from 0
    uint64_t s4[4] = {1, 2, 3, 4};
    CHECK(ref_xoshiro(s4) == 11520u);
    CHECK(ref_xoshiro(s4) == 0u);
    CHECK(ref_xoshiro(s4) == 1509978240u);
    uint64_t x = 0;
    CHECK(ref_splitmix(&x) == 0xE220A8397B1DCDAFull);

    // the sampler's draws are exactly: state = 4 splitmix64 outputs from the
    // seed; u = (next >> 11) * 2^-53; walk ids in order until u*Z < cum
    const float l[5] = {0.3f, -1.0f, 1.2f, 0.0f, 0.7f};
    double w[5], Z = 0;
    for (int i = 0; i < 5; i++) Z += (w[i] = exp((double)l[i] - 1.2));
    const uint64_t seeds[] = {0, 1, 42, 0xFFFFFFFFull, 0xDEADBEEFCAFEF00Dull};
    for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) {
        uint64_t rs[4], sx = seeds[k];
        for (int i = 0; i < 4; i++) rs[i] = ref_splitmix(&sx);
        sample_params p = plain(1.0f, seeds[k]);
        sampler *s = mk(&p, 5);
        for (int t = 0; t < 500; t++) {
            double target = (double)(ref_xoshiro(rs) >> 11) * 0x1.0p-53 * Z, cum = 0;
            int want = 4;
            for (int i = 0; i < 5; i++) {
                cum += w[i];
                if (target < cum) {
                    want = i;
                    break;
                }
            }
            float buf[5];
            memcpy(buf, l, sizeof buf);
            sample_result r;
            sampler_sample(s, buf, &r);
            CHECK_EQ(r.token, want);
        }
        sampler_destroy(s);
    }
}

static void test_seed_reproducible(void) {
    enum { N = 50, T = 200 };
    float flat[N];
    for (int i = 0; i < N; i++) flat[i] = 0.0f;
    int32_t a[T], b[T], c[T], d[T];
    sample_params p = plain(1.0f, 1234);
    sampler *s1 = mk(&p, N), *s2 = mk(&p, N);
    p.seed = 1235;
    sampler *s3 = mk(&p, N);
    for (int t = 0; t < T; t++) {
        sample_result r;
        float buf[N];
        memcpy(buf, flat, sizeof buf);
        sampler_sample(s1, buf, &r);
        a[t] = r.token;
        memcpy(buf, flat, sizeof buf);
        sampler_sample(s2, buf, &r);
        b[t] = r.token;
        memcpy(buf, flat, sizeof buf);
        sampler_sample(s3, buf, &r);
        c[t] = r.token;
    }
    CHECK_MEM_EQ(a, b, sizeof a);
    int same = 0;
    for (int t = 0; t < T; t++) same += a[t] == c[t];
    CHECK(same < T / 5); // ~T/N expected by chance
    // reset restarts the same stream
    sampler_reset(s1);
    for (int t = 0; t < T; t++) {
        sample_result r;
        float buf[N];
        memcpy(buf, flat, sizeof buf);
        sampler_sample(s1, buf, &r);
        d[t] = r.token;
    }
    CHECK_MEM_EQ(a, d, sizeof a);
    sampler_destroy(s1);
    sampler_destroy(s2);
    sampler_destroy(s3);
}

/* sampler_draws / sampler_skip_draws: what a prefill worker hands to decode.
 * A sampler takes token 1; a fresh one that accepts token 1 and skips the
 * first one's draws must then choose exactly the same tokens 2..K (with
 * penalties on, so the kept history matters too). Skipping the wrong count
 * must diverge, and greedy sampling never draws. */
static void test_draws_skip(void) {
    enum { N = 50, K = 40 };
    static float L[K][N];
    uint64_t st = 77;
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N; i++) L[k][i] = 3.0f * t_randf(&st);
    sample_params p;
    sample_params_default(&p);
    p.temperature = 0.9f;
    p.top_k = 0;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.3f;
    p.seed = 4242;
    int32_t a[K], b[K], c[K];
    float buf[N];
    sample_result r;
    sampler *s1 = mk(&p, N);
    CHECK_EQ(sampler_draws(s1), (uint64_t)0);
    for (int k = 0; k < K; k++) {
        memcpy(buf, L[k], sizeof buf);
        sampler_sample(s1, buf, &r);
        sampler_accept(s1, r.token);
        a[k] = r.token;
        if (k == 0) CHECK_EQ(sampler_draws(s1), (uint64_t)1);
    }
    CHECK_EQ(sampler_draws(s1), (uint64_t)K);
    sampler_reset(s1);
    CHECK_EQ(sampler_draws(s1), (uint64_t)0);
    sampler_destroy(s1);

    // the continuing sampler, as decode builds it: fresh, history of token 1, skip
    for (int variant = 0; variant < 2; variant++) {
        sampler *s2 = mk(&p, N);
        sampler_accept(s2, a[0]);
        sampler_skip_draws(s2, variant == 0 ? 1 : 0); // variant 1: the wrong count
        CHECK_EQ(sampler_draws(s2), (uint64_t)(variant == 0 ? 1 : 0));
        int32_t *out = variant == 0 ? b : c;
        out[0] = a[0];
        for (int k = 1; k < K; k++) {
            memcpy(buf, L[k], sizeof buf);
            sampler_sample(s2, buf, &r);
            sampler_accept(s2, r.token);
            out[k] = r.token;
        }
        CHECK_EQ(sampler_draws(s2), (uint64_t)(K - 1 + (variant == 0 ? 1 : 0)));
        sampler_destroy(s2);
    }
    CHECK_MEM_EQ(a, b, sizeof a);
    int same = 0;
    for (int k = 1; k < K; k++) same += a[k] == c[k];
    CHECK(same < K - 1); // a skip of the wrong length is visible

    // skipping n restarts from the seed: skip(5) then skip(1) equals skip(1)
    sampler *s3 = mk(&p, N), *s4 = mk(&p, N);
    sampler_skip_draws(s3, 5);
    sampler_skip_draws(s3, 1);
    sampler_skip_draws(s4, 1);
    for (int k = 0; k < K; k++) {
        sample_result r3, r4;
        memcpy(buf, L[k], sizeof buf);
        sampler_sample(s3, buf, &r3);
        memcpy(buf, L[k], sizeof buf);
        sampler_sample(s4, buf, &r4);
        CHECK_EQ(r3.token, r4.token);
    }
    sampler_destroy(s3);
    sampler_destroy(s4);

    // greedy never draws
    p.temperature = 0.0f;
    sampler *g = mk(&p, N);
    for (int k = 0; k < K; k++) {
        memcpy(buf, L[k], sizeof buf);
        sampler_sample(g, buf, &r);
        sampler_accept(g, r.token);
    }
    CHECK_EQ(sampler_draws(g), (uint64_t)0);
    sampler_destroy(g);
}

// ----------------------------------------------------------------------------
// Distributions

/* Pearson chi-square of counts against probabilities q (sum 1). */
static double chi2(const long *counts, const double *q, int n, long total) {
    double x = 0;
    for (int i = 0; i < n; i++) {
        double e = q[i] * (double)total, d = (double)counts[i] - e;
        x += d * d / e;
    }
    return x;
}

static void softmax_ref(const float *l, int n, double temp, double *q) {
    double m = -1e300, z = 0;
    for (int i = 0; i < n; i++) m = l[i] > m ? l[i] : m;
    for (int i = 0; i < n; i++) z += (q[i] = exp(((double)l[i] - m) / temp));
    for (int i = 0; i < n; i++) q[i] /= z;
}

static void test_distribution(void) {
    enum { N = 6, DRAWS = 60000 };
    const float l[N] = {1.0f, 2.0f, 0.0f, 2.5f, -1.0f, 1.5f};
    long counts[N];
    double q[N];
    // df = 5: P(chi2 > 20.5) = 0.001; the wrong temperature gives thousands
    const float temps[] = {1.0f, 0.5f, 2.0f};
    for (int t = 0; t < 3; t++) {
        sample_params p = plain(temps[t], 777 + (uint64_t)t);
        draw_counts(&p, l, N, DRAWS, counts);
        softmax_ref(l, N, temps[t], q);
        double x = chi2(counts, q, N, DRAWS);
        fprintf(stderr, "  chi2 at T=%.1f: %.2f\n", (double)temps[t], x);
        CHECK(x < 20.5);
        // the statistic has power: the T=1 distribution is far off at T=0.5 / 2
        if (t > 0) {
            double q1[N];
            softmax_ref(l, N, 1.0, q1);
            CHECK(chi2(counts, q1, N, DRAWS) > 200.0);
        }
    }
    // top-k renormalizes over the kept tokens
    sample_params p = plain(1.0f, 4242);
    p.top_k = 3; // ids 3, 1, 5
    draw_counts(&p, l, N, DRAWS, counts);
    CHECK_EQ(counts[0] + counts[2] + counts[4], 0);
    const float lk[3] = {l[3], l[1], l[5]};
    double qk[3];
    softmax_ref(lk, 3, 1.0, qk);
    long ck[3] = {counts[3], counts[1], counts[5]};
    CHECK(chi2(ck, qk, 3, DRAWS) < 13.8); // df = 2, p = 0.001
}

/* probabilities 0.5, 0.3, 0.15, 0.04, 0.01 (as logits log p) */
static void five(float *l) {
    const double pr[5] = {0.5, 0.3, 0.15, 0.04, 0.01};
    for (int i = 0; i < 5; i++) l[i] = (float)log(pr[i]);
}

static void test_top_p(void) {
    float l[5];
    five(l);
    // permute so that sorted order differs from id order: ids 3,0,4,1,2
    const float pl[5] = {l[1], l[3], l[4], l[0], l[2]}; // id 3 -> 0.5, 0 -> 0.3, 4 -> 0.15 ...
    sample_params p = plain(1.0f, 11);
    const int D = 6000;
    // no top-k: cumulative 0.5, 0.8, 0.95, 0.99, 1
    p.top_p = 0.4f;
    CHECK_EQ(drawn_set(&p, pl, 5, D), 1u << 3);
    p.top_p = 0.75f;
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0));
    p.top_p = 0.85f;
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0) | (1u << 4));
    p.top_p = 0.97f;
    CHECK_EQ(drawn_set(&p, pl, 5, D), 0x1Fu & ~(1u << 2));
    // after top-k = 3, top-p sees the renormalized 0.526, 0.316, 0.158:
    // 0.83 keeps two (without renormalization it would keep three)
    p.top_k = 3;
    p.top_p = 0.83f;
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0));
    p.top_p = 0.80f; // 0.5 < 0.8 and 0.8 > 0.7895 (renormalized: still two)
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0));
    p.top_p = 0.86f;
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0) | (1u << 4));
    // the kept tokens keep their relative odds (0.5 : 0.3)
    p.top_k = 0;
    p.top_p = 0.75f;
    long counts[5];
    draw_counts(&p, pl, 5, 20000, counts);
    CHECK_NEAR((double)counts[3] / 20000.0, 0.625, 0.02);
}

/* A vocabulary large enough that top-p must grow its prefix past the first
 * selection (64) and the heap limit (256) into the radix-select path:
 * uniform over 1200 ids, so the kept set is exactly the first ids in order. */
static void test_top_p_large(void) {
    enum { N = 1200 };
    static float l[N];
    static long counts[N];
    for (int i = 0; i < N; i++) l[i] = 0.0f;
    sample_params p = plain(1.0f, 5);
    p.top_p = 0.50025f; // 600/1200 < p <= 601/1200: keep ids 0..600
    draw_counts(&p, l, N, 5000, counts);
    int max_id = -1, distinct = 0;
    for (int i = 0; i < N; i++)
        if (counts[i]) max_id = i, distinct++;
    CHECK_EQ(max_id, 600);
    CHECK(distinct > 590);
    // shuffled distinct values: top-p keeps the highest, wherever they are
    uint64_t st = 3;
    for (int i = 0; i < N; i++) l[i] = -(float)i * 0.001f; // 0, -0.001, ...
    for (int i = N - 1; i > 0; i--) {
        int j = (int)(t_rand(&st) % (uint32_t)(i + 1));
        float t = l[i];
        l[i] = l[j];
        l[j] = t;
    }
    // keep the 400 highest (values 0 .. -0.399): top_p inside the 400th's mass
    double Z = 0, top400 = 0;
    for (int i = 0; i < N; i++) {
        double w = exp((double)l[i]);
        Z += w;
        if (l[i] > -0.3995f) top400 += w;
    }
    p.top_p = (float)((top400 - 0.5 * exp(-0.399)) / Z);
    draw_counts(&p, l, N, 5000, counts);
    int kept = 0;
    for (int i = 0; i < N; i++) {
        if (l[i] > -0.3995f) kept += counts[i] > 0;
        else CHECK_EQ(counts[i], 0);
    }
    CHECK(kept > 380);
}

static void test_min_p(void) {
    float l[5];
    five(l);
    const float pl[5] = {l[1], l[3], l[4], l[0], l[2]}; // 0.3, 0.04, 0.01, 0.5, 0.15
    const int D = 6000;
    sample_params p = plain(1.0f, 21);
    // threshold min_p * 0.5: 0.2 -> 0.1 keeps 0.5, 0.3, 0.15
    p.min_p = 0.2f;
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0) | (1u << 4));
    p.min_p = 0.35f; // 0.175: 0.5, 0.3
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0));
    p.min_p = 0.05f; // 0.025: all but 0.01
    CHECK_EQ(drawn_set(&p, pl, 5, D), 0x1Fu & ~(1u << 2));
    p.min_p = 1.0f; // only the max
    CHECK_EQ(drawn_set(&p, pl, 5, D), 1u << 3);
    // the same through the top-k path
    p.top_k = 4;
    p.min_p = 0.2f;
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0) | (1u << 4));
    // and through the top-p path (no top-k): the shorter prefix wins
    p.top_k = 0;
    p.top_p = 0.97f; // alone: four tokens
    p.min_p = 0.2f;  // alone: three
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0) | (1u << 4));
    p.top_p = 0.75f; // alone: two; min-p alone: three
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0));
    // min-p is relative to the max after top-k, so it does not depend on k
    p.top_p = 1.0f;
    p.top_k = 2;
    p.min_p = 0.5f; // 0.3/0.5 = 0.6 >= 0.5: both stay
    CHECK_EQ(drawn_set(&p, pl, 5, D), (1u << 3) | (1u << 0));
}

/* Temperature is applied after truncation: a very hot draw still never
 * leaves the kept set, and it flattens the kept tokens. */
static void test_temperature_after_truncation(void) {
    float l[5];
    five(l);
    sample_params p = plain(50.0f, 8);
    p.top_p = 0.75f; // ids 0 and 1 (0.5, 0.3)
    long counts[5];
    draw_counts(&p, l, 5, 20000, counts);
    CHECK_EQ(counts[2] + counts[3] + counts[4], 0);
    CHECK_NEAR((double)counts[0] / 20000.0, 0.5, 0.02); // near-uniform over the two
}

// ----------------------------------------------------------------------------
// Penalties

static void test_penalties_exact(void) {
    enum { N = 10 };
    const float l0[N] = {2.0f, -1.5f, 0.0f, 3.0f, -0.25f, 1.0f, 0.7f, -3.0f, 4.0f, 0.1f};
    sample_params p = plain(0.0f, 1);
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.4f;
    p.presence_penalty = 0.25f;
    p.repeat_last_n = 4;
    sampler *s = mk(&p, N);
    // history 8, 8, 1, 0, 0, 2: the window of 4 is {1, 0, 0, 2}
    const int32_t hist[] = {8, 8, 1, 0, 0, 2};
    sampler_accept_n(s, hist, 6);
    float l[N];
    memcpy(l, l0, sizeof l);
    sample_result r;
    sampler_sample(s, l, &r);
    float want[N];
    memcpy(want, l0, sizeof want);
    const float rp = 1.3f, fp = 0.4f, pp = 0.25f;
    want[0] = l0[0] / rp - (2.0f * fp + pp); // positive: divided; count 2
    want[1] = l0[1] * rp - (1.0f * fp + pp); // negative: multiplied
    want[2] = l0[2] * rp - (1.0f * fp + pp); // zero: multiplied (stays 0)
    for (int i = 0; i < N; i++) {
        if (l[i] != want[i]) fprintf(stderr, "  id %d: %.9g want %.9g\n", i, l[i], want[i]);
        CHECK(l[i] == want[i]); // bit-exact, and ids 3..9 (8 left the window) untouched
    }
    CHECK_EQ(r.token, 8); // greedy sees the penalized logits
    // penalties change the greedy choice: 8 now in the window 3 times
    sampler_accept_n(s, (const int32_t[]){8, 8, 8}, 3);
    memcpy(l, l0, sizeof l);
    sampler_sample(s, l, &r);
    CHECK(l[8] == l0[8] / rp - (3.0f * fp + pp)); // 4/1.3 - 1.45 = 1.63
    CHECK(l[2] == l0[2] * rp - (1.0f * fp + pp));  // window is now {2, 8, 8, 8}
    CHECK(l[0] == l0[0] && l[1] == l0[1] && l[3] == l0[3]);
    CHECK_EQ(r.token, 3);
    // sampling again without accepting applies exactly the same penalties
    float again[N];
    memcpy(again, l0, sizeof again);
    sampler_sample(s, again, &r);
    CHECK_MEM_EQ(again, l, sizeof l);
    // reset forgets the history
    sampler_reset(s);
    memcpy(l, l0, sizeof l);
    sampler_sample(s, l, &r);
    CHECK_MEM_EQ(l, l0, sizeof l);
    sampler_destroy(s);

    // only repeat_penalty; frequency/presence only (OpenAI form, negative too)
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    s = mk(&p, N);
    sampler_accept(s, 3);
    sampler_accept(s, 7);
    memcpy(l, l0, sizeof l);
    sampler_sample(s, l, &r);
    CHECK(l[3] == 1.5f && l[7] == -6.0f && l[0] == 2.0f);
    sampler_destroy(s);
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = -0.5f;
    p.presence_penalty = 1.0f;
    s = mk(&p, N);
    sampler_accept_n(s, (const int32_t[]){9, 9, 9}, 3);
    memcpy(l, l0, sizeof l);
    sampler_sample(s, l, &r);
    CHECK(l[9] == 0.1f - (3.0f * -0.5f + 1.0f)); // 0.1 + 0.5
    CHECK(l[8] == 4.0f);
    sampler_destroy(s);
    // repeat_last_n = 0 disables everything
    p.repeat_last_n = 0;
    s = mk(&p, N);
    sampler_accept_n(s, (const int32_t[]){9, 9, 9}, 3);
    memcpy(l, l0, sizeof l);
    sampler_sample(s, l, &r);
    CHECK_MEM_EQ(l, l0, sizeof l);
    sampler_destroy(s);
}

// ----------------------------------------------------------------------------
// Log-probabilities

static void test_logprobs(void) {
    enum { N = 30 };
    float l0[N];
    uint64_t st = 17;
    for (int i = 0; i < N; i++) l0[i] = t_randf(&st) * 6.0f - 3.0f;
    l0[12] = 4.0f;
    l0[5] = 3.5f;
    l0[20] = 3.5f; // tie with 5: 5 listed first
    double m = 4.0, z = 0;
    for (int i = 0; i < N; i++) z += exp((double)l0[i] - m);
    double lz = m + log(z);

    sample_params p = plain(0.0f, 1);
    p.n_probs = 3;
    sampler *s = mk(&p, N);
    float l[N];
    memcpy(l, l0, sizeof l);
    sample_result r;
    sampler_sample(s, l, &r);
    CHECK_EQ(r.token, 12);
    CHECK_NEAR(r.logprob, 4.0 - lz, 1e-5);
    CHECK_EQ(r.n_top, 3);
    CHECK_EQ(r.top_ids[0], 12);
    CHECK_EQ(r.top_ids[1], 5);
    CHECK_EQ(r.top_ids[2], 20);
    CHECK_NEAR(r.top_logprobs[0], 4.0 - lz, 1e-5);
    CHECK_NEAR(r.top_logprobs[1], 3.5 - lz, 1e-5);
    CHECK_NEAR(r.top_logprobs[2], 3.5 - lz, 1e-5);
    sampler_destroy(s);

    // full-vocabulary, temperature-1 logprob even when truncation and
    // temperature leave a single token (documented choice)
    p = plain(0.3f, 2);
    p.top_k = 1;
    p.logprobs = true;
    s = mk(&p, N);
    memcpy(l, l0, sizeof l);
    sampler_sample(s, l, &r);
    CHECK_EQ(r.token, 12);
    CHECK_NEAR(r.logprob, 4.0 - lz, 1e-5);
    CHECK_EQ(r.n_top, 0);
    sampler_destroy(s);

    // n_probs larger than the vocabulary; logprobs sum to 1
    p = plain(1.0f, 3);
    p.n_probs = 20;
    s = mk(&p, 4);
    float small[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    sampler_sample(s, small, &r);
    CHECK_EQ(r.n_top, 4);
    double sum = 0;
    for (int i = 0; i < 4; i++) sum += exp(r.top_logprobs[i]);
    CHECK_NEAR(sum, 1.0, 1e-6);
    CHECK_EQ(r.top_ids[0], 3);
    int found = 0;
    for (int i = 0; i < 4; i++)
        if (r.top_ids[i] == r.token) {
            found = 1;
            CHECK(r.top_logprobs[i] == r.logprob);
        }
    CHECK(found);
    sampler_destroy(s);

    // logprobs of the penalized logits
    p = plain(0.0f, 1);
    p.logprobs = true;
    p.presence_penalty = 2.0f;
    p.repeat_last_n = 8;
    s = mk(&p, N);
    sampler_accept(s, 12);
    memcpy(l, l0, sizeof l);
    sampler_sample(s, l, &r);
    CHECK_EQ(r.token, 5); // 12 fell to 2.0
    z = 0;
    for (int i = 0; i < N; i++) z += exp((double)l[i] - 3.5);
    CHECK_NEAR(r.logprob, -log(z), 1e-5);
    sampler_destroy(s);

    // logprobs off: nothing reported
    p = plain(0.0f, 1);
    s = mk(&p, N);
    memcpy(l, l0, sizeof l);
    sampler_sample(s, l, &r);
    CHECK(r.logprob == 0.0f && r.n_top == 0);
    sampler_destroy(s);
}

// ----------------------------------------------------------------------------
// Large vocabulary: correctness of the selection paths and a timing print

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); // CPU time: the host is shared
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_large_vocab(void) {
    enum { N = 152064 };
    float *l0 = malloc(N * sizeof *l0), *l = malloc(N * sizeof *l);
    CHECK(l0 && l);
    uint64_t st = 2024;
    for (int i = 0; i < N; i++) { // LLM-like: a broad body and a few strong tokens
        float u = t_randf(&st) + t_randf(&st) + t_randf(&st) - 1.5f;
        l0[i] = u * 4.0f;
    }
    for (int k = 0; k < 30; k++) l0[t_rand(&st) % N] = 12.0f + (float)k * 0.25f;

    struct {
        const char *name;
        float temp;
        int32_t top_k;
        float top_p, min_p;
    } cfg[] = {
        {"greedy", 0.0f, 40, 0.95f, 0.05f},   {"default", 0.8f, 40, 0.95f, 0.05f},
        {"top_k=1000", 1.0f, 1000, 1.0f, 0.0f}, {"top_p=0.9", 1.0f, 0, 0.9f, 0.0f},
        {"min_p=0.05", 1.0f, 0, 1.0f, 0.05f}, {"top_p+min_p", 1.0f, 0, 0.99f, 0.01f},
        {"full", 1.0f, 0, 1.0f, 0.0f},
    };
    double t0 = now_s();
    for (int i = 0; i < 50; i++) {
        memcpy(l, l0, N * sizeof *l);
        __asm__ volatile("" ::"r"(l) : "memory"); // keep the copies
    }
    const double copy_us = (now_s() - t0) / 50 * 1e6;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        sample_params p = plain(cfg[c].temp, 9);
        p.top_k = cfg[c].top_k;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        sampler *s = mk(&p, N);
        const int reps = 50;
        int32_t toks[50];
        t0 = now_s();
        for (int i = 0; i < reps; i++) {
            memcpy(l, l0, N * sizeof *l);
            sample_result r;
            sampler_sample(s, l, &r);
            toks[i] = r.token;
        }
        double us = (now_s() - t0) / reps * 1e6 - copy_us;
        for (int i = 0; i < reps; i++) {
            CHECK(toks[i] >= 0 && toks[i] < N);
            if (cfg[c].top_k == 1000 && i < 5) {
                int better = 0; // at most 999 ids beat the chosen one
                for (int j = 0; j < N; j++)
                    better += l0[j] > l0[toks[i]] || (l0[j] == l0[toks[i]] && j < toks[i]);
                CHECK(better < 1000);
            }
            if (cfg[c].temp == 0.0f) CHECK_EQ(toks[i], toks[0]);
        }
        fprintf(stderr, "  n_vocab %d %-12s %8.1f us/token\n", N, cfg[c].name, us);
        sampler_destroy(s);
    }
    free(l0);
    free(l);
}

// ----------------------------------------------------------------------------
// Stop strings

/* Pushes the pieces, collects the emitted text; returns matched index or -1. */
static int run_stop(const char *const *stops, int n_stops, const char *const *pieces,
                    int n_pieces, bool flush, char *out, size_t cap) {
    stop_matcher *m = NULL;
    ks_errbuf eb;
    CHECK_EQ(stop_matcher_create(stops, n_stops, &m, &eb), KS_OK);
    size_t len = 0;
    int idx = -1;
    for (int i = 0; i < n_pieces; i++) {
        stop_result r;
        CHECK_EQ(stop_matcher_push(m, pieces[i], strlen(pieces[i]), &r), KS_OK);
        CHECK(len + r.len < cap);
        memcpy(out + len, r.text, r.len);
        len += r.len;
        if (r.matched) {
            CHECK(r.stop_index >= 0 && r.stop_index < n_stops);
            idx = r.stop_index;
        } else {
            CHECK_EQ(r.stop_index, -1);
        }
    }
    if (flush) {
        stop_result r;
        stop_matcher_flush(m, &r);
        CHECK(len + r.len < cap);
        memcpy(out + len, r.text, r.len);
        len += r.len;
    }
    out[len] = '\0';
    stop_matcher_destroy(m);
    return idx;
}

static void test_stop_basic(void) {
    char out[256];
    // spans three pieces; the emitted text stops right before it
    {
        const char *stops[] = {"</s>"};
        const char *pieces[] = {"Hello <", "/", "s> world"};
        CHECK_EQ(run_stop(stops, 1, pieces, 3, true, out, sizeof out), 0);
        CHECK_STR_EQ(out, "Hello ");
    }
    // step by step: what is held and what is released at each push
    {
        const char *stops[] = {"STOP"};
        stop_matcher *m = NULL;
        CHECK_EQ(stop_matcher_create(stops, 1, &m, NULL), KS_OK);
        stop_result r;
        CHECK_EQ(stop_matcher_push(m, "abcST", 5, &r), KS_OK);
        CHECK_EQ(r.len, 3); // "ST" held
        CHECK(memcmp(r.text, "abc", 3) == 0 && !r.matched);
        CHECK_EQ(stop_matcher_push(m, "x", 1, &r), KS_OK);
        CHECK_EQ(r.len, 3); // "STx" can no longer become STOP
        CHECK(memcmp(r.text, "STx", 3) == 0 && !r.matched);
        CHECK_EQ(stop_matcher_push(m, "S", 1, &r), KS_OK);
        CHECK_EQ(r.len, 0);
        CHECK_EQ(stop_matcher_push(m, "TO", 2, &r), KS_OK);
        CHECK_EQ(r.len, 0);
        CHECK_EQ(stop_matcher_push(m, "", 0, &r), KS_OK);
        CHECK_EQ(r.len, 0);
        CHECK_EQ(stop_matcher_push(m, "P and more", 10, &r), KS_OK);
        CHECK_EQ(r.len, 0);
        CHECK(r.matched && r.stop_index == 0);
        // after a match nothing more comes out
        CHECK_EQ(stop_matcher_push(m, "tail", 4, &r), KS_OK);
        CHECK(r.len == 0 && r.matched);
        stop_matcher_flush(m, &r);
        CHECK(r.len == 0 && r.matched);
        stop_matcher_destroy(m);
        // after a flush the stream is over too
        CHECK_EQ(stop_matcher_create(stops, 1, &m, NULL), KS_OK);
        CHECK_EQ(stop_matcher_push(m, "abST", 4, &r), KS_OK);
        CHECK_EQ(r.len, 2);
        stop_matcher_flush(m, &r);
        CHECK(r.len == 2 && memcmp(r.text, "ST", 2) == 0);
        CHECK(!r.matched && r.stop_index == -1);
        CHECK_EQ(stop_matcher_push(m, "cd", 2, &r), KS_OK);
        CHECK(r.len == 0 && !r.matched);
        stop_matcher_destroy(m);
    }
    // overlapping partial prefixes: "aab" with stop "ab"
    {
        const char *stops[] = {"ab"};
        const char *one[] = {"aab"};
        CHECK_EQ(run_stop(stops, 1, one, 1, true, out, sizeof out), 0);
        CHECK_STR_EQ(out, "a");
        const char *split[] = {"a", "a", "b"};
        CHECK_EQ(run_stop(stops, 1, split, 3, true, out, sizeof out), 0);
        CHECK_STR_EQ(out, "a");
        const char *stops2[] = {"aab"};
        const char *p3[] = {"xaa", "a", "ab!"}; // "xaaaab!": held "aa", then "aa" again
        CHECK_EQ(run_stop(stops2, 1, p3, 3, true, out, sizeof out), 0);
        CHECK_STR_EQ(out, "xaa");
        const char *stops3[] = {"abab"};
        const char *p4[] = {"xab", "a", "c", "abab"}; // "xabac" is released, then a match
        CHECK_EQ(run_stop(stops3, 1, p4, 4, true, out, sizeof out), 0);
        CHECK_STR_EQ(out, "xabac");
    }
    // stop at the very start
    {
        const char *stops[] = {"###"};
        const char *pieces[] = {"###", "text"};
        CHECK_EQ(run_stop(stops, 1, pieces, 2, true, out, sizeof out), 0);
        CHECK_STR_EQ(out, "");
        const char *split[] = {"#", "##text"};
        CHECK_EQ(run_stop(stops, 1, split, 2, true, out, sizeof out), 0);
        CHECK_STR_EQ(out, "");
    }
    // no false hold-back: flush releases a held prefix that never completed
    {
        const char *stops[] = {"STOP", "\n\n"};
        const char *pieces[] = {"the end ST", "O", "\n"};
        char noflush[64];
        CHECK_EQ(run_stop(stops, 2, pieces, 3, false, noflush, sizeof noflush), -1);
        CHECK_STR_EQ(noflush, "the end STO"); // "\n" still held
        CHECK_EQ(run_stop(stops, 2, pieces, 3, true, out, sizeof out), -1);
        CHECK_STR_EQ(out, "the end STO\n");
        // text unrelated to any stop string is never held
        stop_matcher *m = NULL;
        CHECK_EQ(stop_matcher_create(stops, 2, &m, NULL), KS_OK);
        stop_result r;
        CHECK_EQ(stop_matcher_push(m, "plain text", 10, &r), KS_OK);
        CHECK_EQ(r.len, 10);
        stop_matcher_destroy(m);
    }
    // no stop strings at all: pass-through
    {
        const char *pieces[] = {"a", "bc", ""};
        CHECK_EQ(run_stop(NULL, 0, pieces, 3, false, out, sizeof out), -1);
        CHECK_STR_EQ(out, "abc");
    }
    // several stop strings: the one that ends first wins, then the longer
    {
        const char *stops[] = {"abcdef", "cd"};
        const char *pieces[] = {"xxabcdef"};
        CHECK_EQ(run_stop(stops, 2, pieces, 1, true, out, sizeof out), 1);
        CHECK_STR_EQ(out, "xxab");
        const char *stops2[] = {"d", "bcd"};
        CHECK_EQ(run_stop(stops2, 2, pieces, 1, true, out, sizeof out), 1);
        CHECK_STR_EQ(out, "xxa");
    }
    // multi-byte UTF-8 stop spanning pieces that split a character
    {
        const char *stops[] = {"\xC3\xA9t\xC3\xA9"}; // "été"
        const char *pieces[] = {"un \xC3", "\xA9t\xC3", "\xA9 chaud"};
        CHECK_EQ(run_stop(stops, 1, pieces, 3, true, out, sizeof out), 0);
        CHECK_STR_EQ(out, "un ");
    }
}

/* The output must not depend on where the text is split into pieces. */
static void test_stop_chunking_invariance(void) {
    const char *stops[] = {"abcab", "bca", "cc", "aaaa"};
    uint64_t st = 12345;
    for (int trial = 0; trial < 2000; trial++) {
        char text[40];
        int n = 5 + (int)(t_rand(&st) % 30);
        for (int i = 0; i < n; i++) text[i] = "abc"[t_rand(&st) % 3];
        text[n] = '\0';
        // reference: byte by byte
        char ref[64], got[64];
        char bytes[40][2];
        const char *pb[40];
        for (int i = 0; i < n; i++) bytes[i][0] = text[i], bytes[i][1] = 0, pb[i] = bytes[i];
        int want = run_stop(stops, 4, pb, n, true, ref, sizeof ref);
        // random split
        char chunks[40][41];
        const char *pc[40];
        int nc = 0, pos = 0;
        while (pos < n) {
            int k = 1 + (int)(t_rand(&st) % 6);
            if (pos + k > n) k = n - pos;
            memcpy(chunks[nc], text + pos, (size_t)k);
            chunks[nc][k] = '\0';
            pc[nc] = chunks[nc];
            nc++;
            pos += k;
        }
        CHECK_EQ(run_stop(stops, 4, pc, nc, true, got, sizeof got), want);
        CHECK_STR_EQ(got, ref);
        // and the emitted text is the prefix before the first-ending occurrence
        const char *pt[1] = {text};
        CHECK_EQ(run_stop(stops, 4, pt, 1, true, got, sizeof got), want);
        CHECK_STR_EQ(got, ref);
        if (want < 0) CHECK_STR_EQ(ref, text);
        else CHECK(strncmp(text, ref, strlen(ref)) == 0 &&
                   strncmp(text + strlen(ref), stops[want], strlen(stops[want])) == 0);
        for (int k = 0; k < 4; k++) CHECK(strstr(ref, stops[k]) == NULL);
    }
}

static void test_stop_errors(void) {
    ks_errbuf eb;
    stop_matcher *m = (stop_matcher *)&eb; // non-NULL sentinel
    const char *empty[] = {"ok", ""};
    CHECK_EQ(stop_matcher_create(empty, 2, &m, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "stop string 1 is empty");
    CHECK(m == NULL);
    const char *nul[] = {NULL};
    CHECK_EQ(stop_matcher_create(nul, 1, &m, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "stop string 0 is NULL");
    CHECK_EQ(stop_matcher_create(NULL, -1, &m, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "n_stops must be >= 0, got -1");
    stop_matcher_destroy(NULL);
}

/* The request contract's table (admit.h): wire numbers never move, every
 * entry is complete, names (metric labels) are unique, and the checks refuse
 * with the right reason and the OpenAI text. */
static void test_admit(void) {
    // append-only: these are REJECT's wire values and must never change
    CHECK_EQ(ADMIT_CONTEXT_LENGTH, 1);
    CHECK_EQ(ADMIT_KV_CAPACITY, 2);
    CHECK_EQ(ADMIT_INVALID, 3);
    CHECK_EQ(ADMIT_STALE_GRANT, 4);
    CHECK_EQ(ADMIT_ABORTED, 5);
    CHECK_EQ(ADMIT_DRAINING, 6);
    CHECK_EQ(ADMIT_INTERNAL, 10);
    // the wire column: 1..10 may cross the cluster wire, the HTTP front's never
    for (int r = 0; r <= ADMIT__COUNT + 1; r++)
        CHECK_EQ(admit_reason_on_wire((uint32_t)r),
                 (r >= 1 && r <= 10) || r == ADMIT_ADAPTER_NOT_FOUND); // a worker refuses it too
    // the failures after admission (499/502/503/504) are rows too, but no refusals
    for (int r = 0; r <= ADMIT__COUNT + 1; r++)
        CHECK_EQ(admit_reason_is_refusal((uint32_t)r),
                 (r >= 1 && r <= ADMIT_INVALID_PATH) || (r >= ADMIT_MODEL_LOADING && r < ADMIT__COUNT));
    CHECK_EQ(admit_reason_info(ADMIT_MODEL_LOADING)->http_status, 503); // serve, several models
    CHECK_EQ(admit_reason_info(ADMIT_ADAPTER_NOT_FOUND)->http_status, 404); // LoRA (I7)
    CHECK_EQ(admit_reason_info(ADMIT_CLIENT_CLOSED)->http_status, 499);
    CHECK_EQ(admit_reason_info(ADMIT_UPSTREAM_ERROR)->http_status, 502);
    CHECK_EQ(admit_reason_info(ADMIT_WORKER_UNAVAILABLE)->http_status, 503);
    CHECK_EQ(admit_reason_info(ADMIT_UPSTREAM_TIMEOUT)->http_status, 504);
    for (int r = 1; r < ADMIT__COUNT; r++) {
        const admit_info *in = admit_reason_info((admit_reason)r);
        CHECK(in->name && in->type && in->code && in->msg && in->msg[0]);
        CHECK(in->http_status >= 400 && in->http_status <= 599);
        CHECK(in->workers_code >= 400);
        CHECK(in->err != KS_OK);
        for (int q = 1; q < r; q++)
            CHECK(strcmp(in->name, admit_reason_info((admit_reason)q)->name) != 0);
    }
    CHECK(admit_reason_info(ADMIT__COUNT) == admit_reason_info(ADMIT_INTERNAL));
    ks_errbuf eb;
    CHECK_EQ(admit_refuse(&eb, ADMIT_BUSY, "%d waiting", 3), KS_ERR_AGAIN);
    CHECK_EQ(eb.reason, ADMIT_BUSY);
    CHECK_STR_EQ(eb.msg, "3 waiting");
    CHECK_EQ(admit_refuse(&eb, ADMIT_OFFLINE, NULL), KS_ERR_AGAIN);
    CHECK_STR_EQ(eb.msg, "the model is offline");
    ks_seterr(&eb, KS_ERR_IO, "x"); // not a refusal: no reason left behind
    CHECK_EQ(eb.reason, 0);

    admit_limits lim = {.n_ctx = 64, .n_vocab = 100, .page_tokens = 16, .max_pages = 3};
    CHECK_EQ(admit_lengths(&lim, 0, 4, &eb), KS_ERR_INVAL);
    CHECK_EQ(eb.reason, ADMIT_INVALID);
    CHECK_EQ(admit_lengths(&lim, 4, 0, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "max_tokens must be at least 1");
    CHECK_EQ(admit_lengths(&lim, 60, 5, &eb), KS_ERR_INVAL);
    CHECK_EQ(eb.reason, ADMIT_CONTEXT_LENGTH);
    CHECK_STR_HAS(eb.msg, "maximum context length is 64 tokens. However, you requested 65 tokens");
    CHECK_EQ(admit_lengths(&lim, 40, 9, &eb), KS_ERR_NOSPACE); // 49 tokens: 4 pages of 16 > 3
    CHECK_EQ(eb.reason, ADMIT_KV_CAPACITY);
    CHECK_EQ(admit_lengths(&lim, 40, 8, &eb), KS_OK);
    lim.prompt_only = true; // a prefill worker holds the prompt only
    CHECK_EQ(admit_lengths(&lim, 48, 16, &eb), KS_OK);
    CHECK_EQ(admit_lengths(&lim, 49, 1, &eb), KS_ERR_NOSPACE);
    int32_t toks[3] = {1, 100, 2};
    engine_params p = {.prompt = toks, .n_prompt = 3, .max_tokens = 2};
    sample_params_default(&p.sp);
    admit_admitted ad;
    CHECK_EQ(admit_request(&lim, &p, &ad, &eb), KS_ERR_INVAL);
    CHECK_EQ(eb.reason, ADMIT_INVALID);
    CHECK_STR_HAS(eb.msg, "prompt token 1: id 100 out of range");
    toks[1] = 99;
    p.sp.top_p = 0;
    CHECK_EQ(admit_request(&lim, &p, &ad, &eb), KS_ERR_INVAL);
    CHECK_EQ(eb.reason, ADMIT_INVALID);
    CHECK_STR_HAS(eb.msg, "top_p");
    p.sp.top_p = 1;
    CHECK_EQ(admit_request(&lim, &p, &ad, &eb), KS_OK);
    CHECK(ad.prompt == toks && ad.n_prompt == 3 && ad.max_tokens == 2);
}

int main(void) {
#define RUN(t)                                                           \
    do {                                                                 \
        double t0_ = now_s();                                            \
        t();                                                             \
        fprintf(stderr, "%-36s %6.0f ms\n", #t, (now_s() - t0_) * 1e3); \
    } while (0)
    RUN(test_admit);
    RUN(test_params_validate);
    RUN(test_greedy_argmax);
    RUN(test_topk1_equals_greedy);
    RUN(test_top_k);
    RUN(test_exp_log);
    RUN(test_top_select_oracle);
    RUN(test_reference_prng);
    RUN(test_seed_reproducible);
    RUN(test_draws_skip);
    RUN(test_distribution);
    RUN(test_top_p);
    RUN(test_top_p_large);
    RUN(test_min_p);
    RUN(test_temperature_after_truncation);
    RUN(test_penalties_exact);
    RUN(test_logprobs);
    RUN(test_large_vocab);
    RUN(test_stop_basic);
    RUN(test_stop_chunking_invariance);
    RUN(test_stop_errors);
#undef RUN
    printf("test_engine: ok\n");
    return 0;
}
