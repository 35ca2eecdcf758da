/* cmd_bench.c — `kvseal bench`: prompt processing (pp, one batch of N
 * tokens) and text generation (tg, N single-token steps from an empty
 * cache) in tokens/s, like llama-bench's pp512/tg128, plus the machine's
 * memory read bandwidth measured in this process right before the
 * generation phase, and tg as a fraction of the bandwidth roofline
 * (bandwidth / bytes read per generated token). -o md|json reports each
 * test's mean and standard deviation over -r repetitions the way llama-bench
 * does (its md table; its json array's avg_ts/stddev_ts fields). */
#include "cli_int.h"

#include "kvseal/engine.h"
#include "kvseal/kern.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t cli__membw_sum_avx2(const void *buf, size_t n_bytes);
uint64_t cli__membw_sum_pf_avx2(const void *buf, size_t n_bytes);
uint64_t cli__membw_sum_pf2_avx2(const void *buf, size_t n_bytes);

#define BENCH_BW_CHUNK (4 << 20)  // bytes claimed at a time

// the probe's read loops: plain (the hardware prefetcher alone), with
// software prefetch, and with it over two streams
enum { BENCH_LOOP_PLAIN, BENCH_LOOP_PF, BENCH_LOOP_PF2, BENCH_LOOPS };

typedef struct {
    const uint8_t *buf;
    size_t n;           // multiple of BENCH_BW_CHUNK
    int loop;           // BENCH_LOOP_*
    uint64_t sink[64];  // per thread, keeps the reads observable
    atomic_llong next;
} bench__bw;

/* XOR of a 64-byte-aligned chunk, streamed by loop (BENCH_LOOP_*; without
 * AVX2 a plain scalar loop). */
static uint64_t bench__bw_chunk(const uint8_t *p, size_t per, int loop) {
    uint64_t s = 0;
    if (ks_cpu_get()->avx2) {
        s = loop == BENCH_LOOP_PF2  ? cli__membw_sum_pf2_avx2(p, per)
            : loop == BENCH_LOOP_PF ? cli__membw_sum_pf_avx2(p, per)
                                    : cli__membw_sum_avx2(p, per);
    } else {
        const uint64_t *q = (const uint64_t *)p;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i < per / 8; i += 4) {
            s0 ^= q[i];
            s1 ^= q[i + 1];
            s2 ^= q[i + 2];
            s3 ^= q[i + 3];
        }
        s = s0 ^ s1 ^ s2 ^ s3;
    }
    return s;
}

static void bench__bw_task(void *arg, int ith, int nth) {
    bench__bw *a = arg;
    (void)nth;
    int64_t i0, i1;
    while (ks_pool_claim(&a->next, (int64_t)(a->n / BENCH_BW_CHUNK), 1, &i0, &i1))
        a->sink[ith & 63] ^=
            bench__bw_chunk(a->buf + (size_t)i0 * BENCH_BW_CHUNK, BENCH_BW_CHUNK, a->loop);
}

/* The memory-read probe: a buffer far larger than the caches (on huge pages,
 * as the weights are), read by every thread of its own pool at once, with
 * each of the BENCH_LOOPS loops in turn: a decode step's kernels prefetch
 * and read two streams a thread, and with a plain one-stream loop alone tg
 * could exceed the "roofline". */
typedef struct {
    uint8_t *buf;
    ks_pool *pool;
    bench__bw a;
    double peak;     // best of the passes before generation, bytes/s
    double ns[BENCH_LOOPS];    // interleaved passes' time, per loop
    double bytes[BENCH_LOOPS]; // and bytes read
    int n_passes;    // interleaved passes so far
} bench__probe;

#define BENCH_PROBE_BYTES ((size_t)1 << 30)
#define BENCH_SEG_TOKENS 16 // generated tokens between two interleaved passes

/* Seconds one pass of the probe takes with loop (BENCH_LOOP_*). */
static double bench__probe_pass(bench__probe *p, int loop) {
    p->a.loop = loop;
    atomic_store(&p->a.next, 0);
    uint64_t t0 = ks_now_ns();
    ks_pool_run(p->pool, bench__bw_task, &p->a);
    return (double)(ks_now_ns() - t0) / 1e9;
}

/* Allocates the probe and measures its peak: the best of 6 passes, 2 of
 * each loop. Returns false on NOMEM. */
static bool bench__probe_open(bench__probe *p, int n_threads) {
    memset(p, 0, sizeof *p);
    p->buf = ks_alloc_huge(BENCH_PROBE_BYTES);
    p->pool = ks_pool_create(n_threads);
    if (!p->buf || !p->pool) return false;
    memset(p->buf, 1, BENCH_PROBE_BYTES); // fault every page in before timing
    p->a.buf = p->buf;
    p->a.n = BENCH_PROBE_BYTES;
    for (int r = 0; r < 6; r++) {
        double bw = (double)BENCH_PROBE_BYTES / bench__probe_pass(p, r % BENCH_LOOPS);
        p->peak = bw > p->peak ? bw : p->peak;
    }
    return true;
}

/* One pass between two stretches of generation, the loops alternating. */
static void bench__probe_interleave(bench__probe *p) {
    const int loop = p->n_passes++ % BENCH_LOOPS;
    p->ns[loop] += bench__probe_pass(p, loop);
    p->bytes[loop] += (double)BENCH_PROBE_BYTES;
}

/* The read bandwidth over the interleaved passes, bytes/s: the faster
 * loop's total bytes over its total time, so the roofline is measured over
 * the same minutes as the tokens it is compared with, and as an average as
 * they are (the peak, a maximum over a few 50 ms passes, sits above what
 * any stream keeps up on a shared machine). The peak when none ran. */
static double bench__probe_sustained(const bench__probe *p) {
    double best = 0;
    for (int l = 0; l < BENCH_LOOPS; l++)
        if (p->ns[l] > 0 && p->bytes[l] / p->ns[l] > best) best = p->bytes[l] / p->ns[l];
    return best > 0 ? best : p->peak;
}

static void bench__probe_close(bench__probe *p) {
    if (p->a.sink[0] == 0x1234567) fprintf(stderr, " "); // keep the reads observable
    ks_pool_destroy(p->pool);
    ks_free_aligned(p->buf);
}

/* Each pool thread's int8 dot-product peak (kern_int8_peak_ops), all at
 * once, so the sum is the peak of the cores the benchmark ran on (0.25 s). */
typedef struct {
    double ops[256];
} bench__peak;

static void bench__peak_task(void *arg, int ith, int nth) {
    (void)nth;
    ((bench__peak *)arg)->ops[ith & 255] = kern_int8_peak_ops(250);
}

/* The int8 peak of n_threads cores at once, ops/s (0 without AVX512-VNNI or
 * on failure to start the threads). */
static double bench__int8_peak(int n_threads) {
    ks_pool *pool = ks_pool_create(n_threads);
    if (!pool) return 0;
    bench__peak pk = {{0}};
    ks_pool_run(pool, bench__peak_task, &pk);
    double sum = 0;
    for (int i = 0; i < n_threads && i < 256; i++)
        sum += pk.ops[i];
    ks_pool_destroy(pool);
    return sum;
}

/* The ops of a prefill of T tokens from an empty cache: 2 per weight a
 * token runs through (model_params_per_token), the output for the last
 * token, and causal attention, 2 (D + Dv) per head and (query, key) pair
 * (sliding windows and sparse indexers not discounted). */
static double bench__pp_ops(const model *m, double T) {
    const model_hparams *hp = model_hp(m);
    const double dv = hp->head_dim_v ? hp->head_dim_v : hp->head_dim;
    return 2.0 * (double)model_params_per_token(m) * T + 2.0 * hp->n_vocab * (double)hp->n_embd +
           2.0 * hp->n_layer_attn * (double)hp->n_head * (hp->head_dim + dv) * T * (T + 1) / 2;
}

/* n deterministic token ids in [0, n_vocab) (xorshift64). */
static void bench__tokens(int32_t *toks, int32_t n, int32_t n_vocab) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int32_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)n_vocab);
    }
}

/* The greedy token of a logits row (ties: the lower id). */
static int32_t bench__argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Speculative verification's ceiling (issue 42; docs/speculative.md): the
 * target as its own draft. After a prompt of n_pp tokens, n_tg greedy
 * tokens one pass each (timed: the plain rate, and the drafts), then the
 * same tokens again with K of them drafted a pass: each pass computes the
 * last kept token and the K drafts after it (K + 1 logits rows), keeps the
 * drafts the rows' greedy tokens confirm and rolls the cache back past the
 * rest, as the engine's verify does. The drafts cost nothing, so the ratio
 * is the mechanism's ceiling with its overhead; a kept count below the
 * drafts means the rows of a pass differ from one-token passes'. Best of
 * reps rounds each. */
static int bench__spec(cli__session *s, const int32_t *toks, int K, int32_t n_pp, int32_t n_tg,
                       long reps) {
    const int32_t V = model_hp(s->m)->n_vocab;
    int32_t *g = malloc(sizeof(int32_t) * (size_t)(n_tg + K + 1));
    float *logits = malloc(sizeof(float) * (size_t)V * (size_t)(K + 1));
    ks_errbuf eb = {0};
    double best0 = 0, best1 = 0;
    long kept = 0, drafted = 0;
    int rc = 1;
    if (!g || !logits) goto done;
    for (long r = 0; r < reps; r++) {
        kv_seq_release(s->pool, &s->seq);
        if (cli__session_eval(s, toks, n_pp, 0, NULL, logits, &eb)) goto done;
        g[0] = bench__argmax(logits, V);
        uint64_t t0 = ks_now_ns();
        for (int32_t i = 1; i < n_tg + K + 1; i++) { // one pass a token (the drafts run on past n_tg)
            if (cli__session_eval(s, g + i - 1, 1, 0, NULL, logits, &eb)) goto done;
            g[i] = bench__argmax(logits, V);
            if (i == n_tg) t0 = ks_now_ns() - t0;
        }
        const double r0 = (double)n_tg / ((double)t0 / 1e9);
        best0 = r0 > best0 ? r0 : best0;
        kv_seq_truncate(s->pool, &s->seq, (uint32_t)n_pp);
        uint64_t t1 = ks_now_ns();
        kept = drafted = 0;
        for (int32_t i = 0; i < n_tg;) { // g[i] is the last kept token, not yet in the cache
            if (cli__session_eval(s, g + i, K + 1, 0, logits, NULL, &eb)) goto done;
            int32_t k = 0;
            while (k < K && bench__argmax(logits + (size_t)k * (size_t)V, V) == g[i + k + 1])
                k++;
            drafted += K;
            kept += k;
            // rows i .. i + k hold kept tokens; the pass wrote K + 1 rows
            kv_seq_truncate(s->pool, &s->seq, (uint32_t)(n_pp + i + k + 1));
            i += k + 1;
        }
        const double r1 = (double)n_tg / ((double)(ks_now_ns() - t1) / 1e9);
        best1 = r1 > best1 ? r1 : best1;
    }
    printf("spec %d: tg%d greedy %.2f tokens/s; with %d drafts a pass (the target as its own "
           "draft) %.2f tokens/s: %.2fx; drafts kept %ld of %ld\n",
           K, n_tg, best0, K, best1, best1 / best0, kept, drafted);
    rc = 0;
done:
    if (rc) fprintf(stderr, "kvseal bench: %s\n", eb.msg[0] ? eb.msg : "out of memory");
    free(g);
    free(logits);
    return rc;
}

#define BENCH_MAX_LORA 16 // --lora files

/* Aggregate decode with n_streams sequences at once, as llama-batched-bench
 * measures it: each stream's n_pp-token prompt is prefilled (batches of up
 * to 512 tokens), then n_tg steps each decode one token of every stream in
 * one batch. Stream i runs with adapter lora[i % n_lora] (n_lora 0: none).
 * Prints prefill and decode tokens/s over all streams; the decode rate into
 * *tg_ts. */
static int bench__streams(cli__session *s, const int32_t *toks, int n_streams, int32_t n_pp,
                          int32_t n_tg, model_lora *const *lora, int n_lora, double *tg_ts) {
    const model_hparams *hp = model_hp(s->m);
    const int32_t ctx = n_pp + n_tg, ub = 512;
    kv_geom g = model_kv_geom(s->m, 16, s->kv_type);
    uint32_t pages = (uint32_t)n_streams *
                     (uint32_t)((ctx + g.page_tokens - 1) / g.page_tokens + g.state_pages);
    kv_pool *pool = NULL;
    model_ctx *mc = NULL;
    kv_seq *seqs = calloc((size_t)n_streams, sizeof *seqs);
    int32_t *bt = malloc(sizeof(int32_t) * 4 * (size_t)ub);
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab * (size_t)n_streams);
    ks_errbuf eb = {0};
    int rc = 1;
    if (!seqs || !bt || !logits || n_streams > ub) {
        snprintf(eb.msg, sizeof eb.msg, "out of memory, or more than %d streams", ub);
        goto done;
    }
    if (kv_pool_create(&g, pages, KV_SCRUB_ZERO, &pool, &eb) ||
        model_ctx_create(s->m, pool, s->n_threads, ub, ctx, &mc, &eb))
        goto done;
    kv_seq *sp[512];
    const model_lora *lr[512];
    for (int i = 0; i < n_streams; i++) {
        kv_seq_init(pool, &seqs[i]);
        sp[i] = &seqs[i];
        lr[i] = n_lora ? lora[i % n_lora] : NULL;
        if (kv_seq_reserve(pool, &seqs[i], (uint32_t)ctx, &eb)) goto done;
    }
    int32_t *tok = bt, *pos = bt + ub, *seq = bt + 2 * ub, *out = bt + 3 * ub;
    // prefill: the streams' prompts back to back, cut into batches of ub
    uint64_t t0 = ks_now_ns();
    int32_t total = n_pp * n_streams;
    for (int32_t i0 = 0; i0 < total; i0 += ub) {
        int32_t nb = total - i0 < ub ? total - i0 : ub, n_out = 0;
        int first = (i0 / n_pp), last = (i0 + nb - 1) / n_pp;
        for (int32_t j = 0; j < nb; j++) {
            int32_t i = i0 + j;
            tok[j] = toks[(i * 7 + i / n_pp) % n_pp]; // streams differ
            pos[j] = i % n_pp;
            seq[j] = i / n_pp - first;
            out[j] = i % n_pp == n_pp - 1 ? n_out++ : -1;
        }
        model_batch b = {.n_tokens = nb,
                         .tokens = tok,
                         .pos = pos,
                         .seq = seq,
                         .out_row = out,
                         .n_out = n_out,
                         .n_seqs = last - first + 1,
                         .seqs = sp + first,
                         .lora = n_lora ? lr + first : NULL};
        if (model_forward(mc, &b, logits, &eb)) goto done;
    }
    double t_pp = (double)(ks_now_ns() - t0) / 1e9;
    t0 = ks_now_ns();
    for (int32_t step = 0; step < n_tg; step++) {
        for (int i = 0; i < n_streams; i++) {
            tok[i] = toks[(step * 13 + i) % n_pp];
            pos[i] = n_pp + step;
            seq[i] = i;
            out[i] = i;
        }
        model_batch b = {.n_tokens = n_streams,
                         .tokens = tok,
                         .pos = pos,
                         .seq = seq,
                         .out_row = out,
                         .n_out = n_streams,
                         .n_seqs = n_streams,
                         .seqs = sp,
                         .lora = n_lora ? lr : NULL};
        if (model_forward(mc, &b, logits, &eb)) goto done;
    }
    double t_tg = (double)(ks_now_ns() - t0) / 1e9;
    *tg_ts = (double)n_streams * n_tg / t_tg;
    char with[48] = "";
    if (n_lora) snprintf(with, sizeof with, " (%d LoRA adapter%s)", n_lora, n_lora > 1 ? "s" : "");
    printf("streams %d%s: pp %d x %d: %.2f tokens/s, tg %d x %d: %.2f tokens/s aggregate\n",
           n_streams, with, n_streams, n_pp, total / t_pp, n_streams, n_tg, *tg_ts);
    rc = 0;
done:
    if (rc) fprintf(stderr, "kvseal bench: %s\n", eb.msg);
    for (int i = 0; seqs && pool && i < n_streams; i++)
        kv_seq_release(pool, &seqs[i]);
    model_ctx_free(mc);
    kv_pool_destroy(pool);
    free(seqs);
    free(bt);
    free(logits);
    return rc;
}

enum { BO_MODEL, BO_PP, BO_TG, BO_THREADS, BO_REPS, BO_STREAMS, BO_KV_TYPE, BO_OUTPUT, BO_DEPTH,
       BO_SPEC, BO_LORA, BO__N };
static const cli__opt bench__opts[BO__N] = {
    [BO_MODEL] = {"model", 'm', true, false},      [BO_PP] = {"n-prompt", 'p', true, false},
    [BO_TG] = {"n-gen", 'n', true, false},         [BO_THREADS] = {"threads", 't', true, false},
    [BO_REPS] = {"repetitions", 'r', true, false}, [BO_STREAMS] = {"streams", 0, true, false},
    [BO_KV_TYPE] = {"kv-type", 0, true, false},    [BO_OUTPUT] = {"output", 'o', true, false},
    [BO_DEPTH] = {"n-depth", 'd', true, false},    [BO_SPEC] = {"spec", 0, true, false},
    [BO_LORA] = {"lora", 0, true, true},
};

#define BENCH_MAX_DEPTHS 16

typedef enum { BENCH_TEXT, BENCH_MD, BENCH_JSON } bench__fmt;

typedef struct {
    const char *path, *streams;
    long spec; // --spec K: speculative verification's ceiling with K drafts (0: off)
    long n_pp, n_tg, threads, reps;
    long depth[BENCH_MAX_DEPTHS]; // -d: tokens already in the cache before each test
    int n_depth;
    int kv_type;
    bench__fmt fmt;
    const char *lora[BENCH_MAX_LORA]; // --lora FILE: the streams' adapters, round-robin
    int n_lora;
} bench__cfg;

static void bench__usage(const char *cmd) {
    (void)cmd;
    fprintf(
        stderr,
        "usage: kvseal bench [-m MODEL] [-p PP_TOKENS (512)] [-n TG_TOKENS (128)] [-t THREADS]\n"
        "                    [-r REPS (1; 5 with -o md|json)] [-o text|md|json]\n"
        "                    [--streams N,N,...]  (aggregate decode of N streams:\n"
        "                    each prefills PP tokens, then TG steps of one token each)\n"
        "                    [--lora FILE]...  (with --streams, up to %d: each count runs\n"
        "                    without adapters, then with them taken round-robin by the\n"
        "                    streams, -r REPS rounds, and prints the median decode ratio)\n"
        "                    [--kv-type f32|f16|q8_0 (f16)]\n"
        "                    [--spec K]  (speculative verification's ceiling: TG greedy tokens\n"
        "                    one pass each, then again with K of them drafted a pass)\n"
        "                    [-d DEPTH,DEPTH,... (0)]  (as llama-bench -d: the pp and tg tests\n"
        "                    run after DEPTH tokens in the cache; -p 0 or -n 0 skips a test)\n"
        "  -o text: the best of the repetitions and the bandwidth roofline; md and json: each\n"
        "  test's mean and standard deviation over the repetitions, as llama-bench prints them\n",
        BENCH_MAX_LORA);
}

static int bench__apply(void *ctx, int id, const char *v, bool reset) {
    bench__cfg *c = ctx;
    switch (id) {
    case BO_MODEL:
        c->path = v;
        return 0;
    case BO_PP:
        return cli__parse_int("-p", v, 0, 1 << 16, &c->n_pp) ? 0 : 2;
    case BO_TG:
        return cli__parse_int("-n", v, 0, 1 << 16, &c->n_tg) ? 0 : 2;
    case BO_DEPTH:
        c->n_depth = 0;
        for (const char *p = v; *p;) {
            char *end;
            long d = strtol(p, &end, 10);
            if (end == p || d < 0 || d > (1 << 20) || (*end && *end != ',') ||
                c->n_depth == BENCH_MAX_DEPTHS) {
                fprintf(stderr, "kvseal bench: -d wants a list like 0,8192 (each 0..%d, at most %d)\n",
                        1 << 20, BENCH_MAX_DEPTHS);
                return 2;
            }
            c->depth[c->n_depth++] = d;
            p = *end ? end + 1 : end;
        }
        return 0;
    case BO_SPEC:
        return cli__parse_int("--spec", v, 1, ENGINE_SPEC_MAX, &c->spec) ? 0 : 2;
    case BO_THREADS:
        return cli__parse_int("-t", v, 1, 256, &c->threads) ? 0 : 2;
    case BO_REPS:
        return cli__parse_int("-r", v, 1, 100, &c->reps) ? 0 : 2;
    case BO_STREAMS:
        c->streams = v;
        return 0;
    case BO_LORA:
        if (reset) c->n_lora = 0;
        if (c->n_lora == BENCH_MAX_LORA) {
            fprintf(stderr, "kvseal bench: at most %d --lora files\n", BENCH_MAX_LORA);
            return 2;
        }
        c->lora[c->n_lora++] = v;
        return 0;
    case BO_KV_TYPE:
        return cli__parse_kv_type(v, &c->kv_type) ? 0 : 2;
    case BO_OUTPUT:
        if (!strcmp(v, "text"))
            c->fmt = BENCH_TEXT;
        else if (!strcmp(v, "md"))
            c->fmt = BENCH_MD;
        else if (!strcmp(v, "json"))
            c->fmt = BENCH_JSON;
        else {
            fprintf(stderr, "kvseal bench: -o expects text, md or json, got '%s'\n", v);
            return 2;
        }
        return 0;
    }
    return 2;
}

void cli__stats(const double *x, int n, double *mean, double *sd) {
    double m = 0, q = 0;
    for (int i = 0; i < n; i++)
        m += x[i];
    m = n > 0 ? m / n : 0;
    for (int i = 0; i < n; i++)
        q += (x[i] - m) * (x[i] - m);
    *mean = m;
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0;
}

/* One test's repetitions: ns[r] the time of repetition r for n tokens. */
typedef struct {
    char name[48]; // "pp512", "tg128", "tg128 @ d8192"
    long n_prompt, n_gen, n_depth;
    const double *ns;
    int n;
    double bpt; // tg: bytes read per generated token (weights + KV at this depth)
} bench__test;

/* The md table or the json array of the tests, llama-bench's columns and
 * field names (avg_ts/stddev_ts: tokens/s; avg_ns/stddev_ns: a repetition's
 * time); json goes through jansson, so every string is escaped. */
static int bench__report(const bench__cfg *c, cli__session *s, const bench__test *t, int n_t,
                         double bw, double bw_peak, double peak, double pp_ops) {
    const model_hparams *hp = model_hp(s->m);
    const char *base = strrchr(c->path, '/') ? strrchr(c->path, '/') + 1 : c->path;
    double size_mib = (double)model_bytes_per_token(s->m) / 1048576.0;
    if (c->fmt == BENCH_MD) {
        printf("| model | size | arch | kernels | threads | type_kv | test | t/s |\n");
        printf("| ----- | ---: | ---- | ------- | ------: | ------- | ---: | --: |\n");
    }
    json_t *arr = c->fmt == BENCH_JSON ? json_array() : NULL;
    for (int k = 0; k < n_t; k++) {
        long n_tok = t[k].n_prompt + t[k].n_gen;
        double ts[128], m_ts, sd_ts, m_ns, sd_ns;
        for (int r = 0; r < t[k].n; r++)
            ts[r] = (double)n_tok / (t[k].ns[r] / 1e9);
        cli__stats(ts, t[k].n, &m_ts, &sd_ts);
        cli__stats(t[k].ns, t[k].n, &m_ns, &sd_ns);
        if (c->fmt == BENCH_MD) {
            printf("| %s | %.2f MiB | %s | %s | %d | %s | %s | %.2f ± %.2f |\n", base, size_mib,
                   hp->arch_name, kern_get()->name, s->n_threads, kv_type_name(s->kv_type),
                   t[k].name, m_ts, sd_ts);
            continue;
        }
        json_t *o = json_object(), *sns = json_array(), *sts = json_array();
        for (int r = 0; r < t[k].n; r++) {
            json_array_append_new(sns, json_integer((json_int_t)t[k].ns[r]));
            json_array_append_new(sts, json_real(ts[r]));
        }
        json_object_set_new(o, "model_filename", json_string(c->path));
        json_object_set_new(o, "model_type", json_string(hp->arch_name));
        json_object_set_new(o, "model_size", json_integer((json_int_t)model_bytes_per_token(s->m)));
        json_object_set_new(o, "kernels", json_string(kern_get()->name));
        json_object_set_new(o, "n_threads", json_integer(s->n_threads));
        json_object_set_new(o, "type_kv", json_string(kv_type_name(s->kv_type)));
        json_object_set_new(o, "test", json_string(t[k].name));
        json_object_set_new(o, "n_prompt", json_integer(t[k].n_prompt));
        json_object_set_new(o, "n_gen", json_integer(t[k].n_gen));
        json_object_set_new(o, "n_depth", json_integer(t[k].n_depth));
        json_object_set_new(o, "repetitions", json_integer(t[k].n));
        json_object_set_new(o, "avg_ns", json_integer((json_int_t)m_ns));
        json_object_set_new(o, "stddev_ns", json_integer((json_int_t)sd_ns));
        json_object_set_new(o, "avg_ts", json_real(m_ts));
        json_object_set_new(o, "stddev_ts", json_real(sd_ts));
        json_object_set_new(o, "samples_ns", sns);
        json_object_set_new(o, "samples_ts", sts);
        if (t[k].n_prompt && peak > 0) { // prefill against the int8 dot-product peak
            json_object_set_new(o, "int8_peak_gops", json_real(peak / 1e9));
            json_object_set_new(o, "ops", json_real(pp_ops));
            json_object_set_new(o, "peak_fraction", json_real(pp_ops / (m_ns / 1e9) / peak));
        }
        if (t[k].n_gen) { // the roofline applies to generation
            json_object_set_new(o, "membw_gbs", json_real(bw / 1e9));
            json_object_set_new(o, "membw_peak_gbs", json_real(bw_peak / 1e9));
            json_object_set_new(o, "roofline_ts", json_real(bw / t[k].bpt));
            json_object_set_new(o, "bytes_per_token", json_real(t[k].bpt));
        }
        json_array_append_new(arr, o);
    }
    if (arr) {
        char *text = json_dumps(arr, JSON_INDENT(2) | JSON_REAL_PRECISION(8));
        json_decref(arr);
        if (!text) {
            fprintf(stderr, "kvseal bench: out of memory\n");
            return 1;
        }
        printf("%s\n", text);
        free(text);
    }
    fflush(stdout);
    return 0;
}

int cli_bench(int argc, char **argv) {
    engine_opts eo; // the engine's default KV type is the only copy of it
    engine_opts_default(&eo);
    bench__cfg cf = {
        .path = cli_default_model(), .n_pp = 512, .n_tg = 128, .reps = 0, .kv_type = eo.kv_type};
    const cli__spec sp = {"bench", bench__opts, BO__N, bench__apply, bench__usage, false, false};
    int prc = cli__opts_parse(&sp, &cf, argc, argv, NULL);
    if (prc) return prc < 0 ? 0 : prc;
    const char *path = cf.path, *streams = cf.streams;
    long n_pp = cf.n_pp, n_tg = cf.n_tg, threads = cf.threads;
    long reps = cf.reps ? cf.reps : cf.fmt == BENCH_TEXT ? 1 : 5; // llama-bench's default is 5
    int kv_type = cf.kv_type;
    if (streams && cf.fmt != BENCH_TEXT) {
        fprintf(stderr,
                "kvseal bench: -o md|json reports the pp/tg tests; --streams prints text\n");
        return 2;
    }
    if (streams && (cf.n_depth || !n_pp || !n_tg)) {
        fprintf(stderr, "kvseal bench: --streams wants -p and -n of at least 1, and no -d\n");
        return 2;
    }
    if (cf.n_lora && !streams) {
        fprintf(stderr, "kvseal bench: --lora measures aggregate decode: it wants --streams\n");
        return 2;
    }
    if (cf.spec) { // speculative verification's ceiling (bench__spec)
        if (streams || cf.n_depth || cf.fmt != BENCH_TEXT || !n_pp || !n_tg) {
            fprintf(stderr, "kvseal bench: --spec wants -p and -n of at least 1, text output, "
                            "no -d and no --streams\n");
            return 2;
        }
        cli__session s;
        const int32_t ctx = (int32_t)(n_pp + n_tg + cf.spec + 2);
        if (cli__session_open(&s, path, (int)threads, ctx, (int32_t)(n_pp > 64 ? n_pp : 64),
                              kv_type))
            return 1;
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_pp);
        int rc = toks ? 0 : 1;
        if (toks) {
            bench__tokens(toks, (int32_t)n_pp, model_hp(s.m)->n_vocab);
            printf("model: %s, kernels: %s, threads: %d\n", path, kern_get()->name, s.n_threads);
            rc = bench__spec(&s, toks, (int)cf.spec, (int32_t)n_pp, (int32_t)n_tg, reps);
        }
        free(toks);
        cli__session_close(&s);
        return rc;
    }
    if (streams) {
        cli__session s;
        if (cli__session_open(&s, path, (int)threads, (int32_t)n_pp, 1, kv_type)) return 1;
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_pp);
        int rc = toks ? 0 : 1;
        model_lora *lora[BENCH_MAX_LORA] = {0};
        for (int i = 0; !rc && i < cf.n_lora; i++) {
            ks_errbuf eb = {0};
            if (model_lora_load(s.m, cf.lora[i], &lora[i], &eb)) {
                fprintf(stderr, "kvseal bench: %s\n", eb.msg);
                rc = 1;
            }
        }
        if (toks) bench__tokens(toks, (int32_t)n_pp, model_hp(s.m)->n_vocab);
        if (!rc) {
            printf("model: %s, kernels: %s, threads: %d, kv: %s\n", path, kern_get()->name,
                   s.n_threads, kv_type_name(kv_type));
            for (int i = 0; i < cf.n_lora; i++)
                printf("lora %d: %s (rank %d, %d matrices)\n", i, cf.lora[i],
                       model_lora_rank(lora[i]), model_lora_n_mats(lora[i]));
        }
        for (const char *p = streams; !rc && *p;) {
            char *end;
            long n = strtol(p, &end, 10);
            if (end == p || n < 1 || n > 512 || (*end && *end != ',')) {
                fprintf(stderr, "kvseal bench: --streams wants a list like 1,4,16 (each 1..512)\n");
                rc = 2;
                break;
            }
            // with adapters: each repetition runs without and with them on the same
            // streams and tokens (the order alternating), its ratio kept; the
            // median of the ratios, and each side's best rate
            double best[2] = {0, 0}, ratio[100];
            const long nr = cf.n_lora ? reps : 1;
            for (long r = 0; !rc && r < nr; r++) {
                double ts[2] = {0, 0};
                for (int k = 0; !rc && k < (cf.n_lora ? 2 : 1); k++) {
                    const int w = cf.n_lora ? (int)((k + r) % 2) : 0;
                    rc = bench__streams(&s, toks, (int)n, (int32_t)n_pp, (int32_t)n_tg, lora,
                                        w ? cf.n_lora : 0, &ts[w]);
                    best[w] = ts[w] > best[w] ? ts[w] : best[w];
                }
                ratio[r] = ts[0] > 0 ? ts[1] / ts[0] : 0.0;
            }
            if (!rc && cf.n_lora) {
                for (long i = 1; i < nr; i++) // insertion sort: at most 100
                    for (long j = i; j > 0 && ratio[j - 1] > ratio[j]; j--) {
                        const double t = ratio[j];
                        ratio[j] = ratio[j - 1];
                        ratio[j - 1] = t;
                    }
                const double med = nr % 2 ? ratio[nr / 2] : (ratio[nr / 2 - 1] + ratio[nr / 2]) / 2;
                printf("streams %ld: decode with %d LoRA adapter%s / without: best %.2f / %.2f "
                       "tokens/s; median of %ld rounds' ratios = %.3f\n", n, cf.n_lora,
                       cf.n_lora > 1 ? "s" : "", best[1], best[0], nr, med);
            }
            p = *end ? end + 1 : end;
        }
        for (int i = 0; i < cf.n_lora; i++) model_lora_free(lora[i]);
        free(toks);
        cli__session_close(&s);
        return rc;
    }
    if (!cf.n_depth) cf.depth[cf.n_depth++] = 0;
    const int n_d = cf.n_depth;
    long d_max = 0;
    for (int i = 0; i < n_d; i++)
        d_max = cf.depth[i] > d_max ? cf.depth[i] : d_max;
    int32_t ctx = (int32_t)(d_max + (n_pp > n_tg ? n_pp : n_tg));
    cli__session s;
    if (cli__session_open(&s, path, (int)threads, ctx, (int32_t)(n_pp ? n_pp : 512), kv_type))
        return 1;
    const model_hparams *hp = model_hp(s.m);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)ctx);
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    // per depth: pp and tg repetitions' times (reps <= 100)
    double *ns = calloc((size_t)n_d * 2 * 100, sizeof(double));
    double tg_ns_all[BENCH_MAX_DEPTHS] = {0}, pp_best[BENCH_MAX_DEPTHS] = {0},
           tg_best[BENCH_MAX_DEPTHS] = {0};
    int rc = 1;
    ks_errbuf eb = {0};
    if (!toks || !logits || !ns) goto done;
    bench__tokens(toks, ctx, hp->n_vocab);
    // the int8 peak of the same cores before and right after the prompts;
    // the larger (a busy host only lowers it) is the one pp is held to
    // (Q8_0/Q4_0/Q4_K matmuls run on vpdpbusd; pp's ops are 2 x params x T)
    const double peak0 = bench__int8_peak(s.n_threads);
    bench__probe probe;
    const bool probe_ok = bench__probe_open(&probe, s.n_threads); // else no roofline (bw 0)
    for (int di = 0; di < n_d; di++) {
        const int32_t d = (int32_t)cf.depth[di];
        double *pp_ns = ns + (size_t)di * 200, *tg_ns = pp_ns + 100;
        // the depth's tokens, once (untimed); each repetition cuts the cache back to them
        kv_seq_release(s.pool, &s.seq);
        if (d && cli__session_eval(&s, toks, d, 0, NULL, logits, &eb)) goto fail_probe;
        for (long r = 0; r < reps && n_pp; r++) {
            kv_seq_set_filled(s.pool, &s.seq, (uint32_t)d);
            uint64_t t0 = ks_now_ns();
            if (cli__session_eval(&s, toks + d, (int32_t)n_pp, 0, NULL, logits, &eb)) goto fail_probe;
            pp_ns[r] = (double)(ks_now_ns() - t0);
            double pp = (double)n_pp / (pp_ns[r] / 1e9);
            pp_best[di] = pp > pp_best[di] ? pp : pp_best[di];
        }
        for (long r = 0; r < reps && n_tg; r++) {
            kv_seq_set_filled(s.pool, &s.seq, (uint32_t)d);
            tg_ns[r] = 0;
            for (int32_t i = 0; i < (int32_t)n_tg;) { // stretches of generation between probe passes
                const int32_t i1 = i + BENCH_SEG_TOKENS < n_tg ? i + BENCH_SEG_TOKENS : (int32_t)n_tg;
                uint64_t t0 = ks_now_ns();
                for (; i < i1; i++)
                    if (cli__session_eval(&s, toks + d + i, 1, 0, NULL, logits, &eb)) goto fail_probe;
                tg_ns[r] += (double)(ks_now_ns() - t0);
                if (probe_ok) bench__probe_interleave(&probe);
            }
            tg_ns_all[di] += tg_ns[r];
            double tg = (double)n_tg / (tg_ns[r] / 1e9);
            tg_best[di] = tg > tg_best[di] ? tg : tg_best[di];
        }
    }
    const double peak1 = bench__int8_peak(s.n_threads), peak = peak1 > peak0 ? peak1 : peak0;
    const double pp_ops = bench__pp_ops(s.m, (double)n_pp);
    const double bw = probe_ok ? bench__probe_sustained(&probe) : 0, bw_peak = probe.peak;
    const int n_passes = probe.n_passes;
    double loop_bw[BENCH_LOOPS]; // each loop's own rate over its interleaved passes
    for (int l = 0; l < BENCH_LOOPS; l++)
        loop_bw[l] = probe.ns[l] > 0 ? probe.bytes[l] / probe.ns[l] : 0;
    bench__probe_close(&probe);
    // bytes per generated token at depth d: every weight once, plus the KV
    // rows of the average context (d + n_tg/2 positions) read by attention,
    // as the pool stores them (its element type and plane count: K and V, or
    // MLA's one row)
    const double kv_tok = (double)kv_pool_page_bytes(s.pool) / kv_pool_geom(s.pool)->page_tokens;
    const double w_bytes = (double)model_bytes_per_token(s.m);
    bench__test t[2 * BENCH_MAX_DEPTHS];
    int n_t = 0;
    for (int di = 0; di < n_d; di++) {
        const long d = cf.depth[di];
        char at[24] = "";
        if (d) snprintf(at, sizeof at, " @ d%ld", d);
        if (n_pp) {
            t[n_t] = (bench__test){.n_prompt = n_pp, .n_depth = d, .ns = ns + (size_t)di * 200, .n = (int)reps};
            snprintf(t[n_t++].name, sizeof t[0].name, "pp%ld%s", n_pp, at);
        }
        if (n_tg) {
            t[n_t] = (bench__test){.n_gen = n_tg, .n_depth = d, .ns = ns + (size_t)di * 200 + 100,
                                   .n = (int)reps, .bpt = w_bytes + kv_tok * ((double)d + (double)n_tg / 2)};
            snprintf(t[n_t++].name, sizeof t[0].name, "tg%ld%s", n_tg, at);
        }
    }
    if (cf.fmt != BENCH_TEXT) {
        rc = bench__report(&cf, &s, t, n_t, bw, bw_peak, peak, pp_ops);
        goto done;
    }
    printf("model: %s (%s, %d layers, n_embd %d, %.1f MiB of weights/token)\n", path, hp->arch_name,
           hp->n_layer, hp->n_embd, (double)model_bytes_per_token(s.m) / 1048576.0);
    printf("kernels: %s, threads: %d, kv: %s (%.0f bytes per position), attention: %s\n",
           kern_get()->name, s.n_threads, kv_type_name(kv_type), kv_tok,
           kern_attn_bf16(kern_get()) ? "bf16" : "f32");
    for (int k = 0; k < n_t; k++) {
        const int di = (int)((t[k].ns - ns) / 200);
        printf("%s: %.2f tokens/s\n", t[k].name, t[k].n_gen ? tg_best[di] : pp_best[di]);
    }
    if (n_pp && peak > 0)
        printf("pp%ld / int8 peak: %.3f (%.1f GOP a prompt: 2 x %.3g params x tokens + "
               "attention; vpdpbusd peak %.1f GOP/s on %d threads)\n",
               n_pp, pp_ops * pp_best[0] / (double)n_pp / peak, pp_ops / 1e9,
               (double)model_params_per_token(s.m), peak / 1e9, s.n_threads);
    else if (n_pp)
        printf("pp%ld / int8 peak: not measured (no AVX512-VNNI)\n", n_pp);
    if (!probe_ok) {
        printf("memory read bandwidth: not measured (no memory for the %zu-byte probe)\n",
               BENCH_PROBE_BYTES);
        rc = 0;
        goto done;
    }
    if (!n_tg) {
        rc = 0;
        goto done;
    }
    printf("memory read bandwidth: %.2f GB/s (%d passes between stretches of generation; best "
           "pass before it %.2f GB/s)\n",
           bw / 1e9, n_passes, bw_peak / 1e9);
    static const char *const loop_name[BENCH_LOOPS] = {"plain", "prefetch", "two streams"};
    printf("probe loops (GB/s, - where no interleaved pass ran it):");
    for (int l = 0; l < BENCH_LOOPS; l++)
        if (loop_bw[l] > 0)
            printf(" %s %.2f", loop_name[l], loop_bw[l] / 1e9);
        else
            printf(" %s -", loop_name[l]);
    printf("\n");
    for (int k = 0; k < n_t; k++) {
        if (!t[k].n_gen) continue;
        const int di = (int)((t[k].ns - ns) / 200);
        // tg over all repetitions, an average as the sustained bandwidth is
        const double tg_mean = (double)n_tg * (double)reps / (tg_ns_all[di] / 1e9);
        const double roof = bw / t[k].bpt, kvb = t[k].bpt - w_bytes;
        char at[24] = "";
        if (t[k].n_depth) snprintf(at, sizeof at, " @ d%ld", t[k].n_depth);
        printf("roofline tg%s: %.2f tokens/s (%.1f MB read per token: %.1f weights + %.1f KV)\n",
               at, roof, t[k].bpt / 1e6, w_bytes / 1e6, kvb / 1e6);
        printf("tg / roofline%s: %.3f\n", at, tg_mean / roof);
        printf("tg / best-pass roofline%s: %.3f\n", at, tg_mean / (bw_peak / t[k].bpt));
    }
    rc = 0;
    goto done;
fail_probe:
    bench__probe_close(&probe);
    fprintf(stderr, "kvseal bench: %s\n", eb.msg);
done:
    free(toks);
    free(logits);
    free(ns);
    cli__session_close(&s);
    return rc;
}
