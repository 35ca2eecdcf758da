/* cmd_mklora.c — `kvseal mklora`: a deterministic random LoRA adapter for a
 * base GGUF, in llama.cpp's adapter format (convert_lora_to_gguf.py's;
 * model.h "LoRA adapters"), for tests and for checking against llama.cpp's
 * --lora.
 *
 * Per targeted matrix W (ne [K, N]) of every layer: A (ne [K, r]) uniform
 * with a standard deviation of 1/sqrt(K), B (ne [r, N]) uniform with one
 * set so that the applied delta (alpha / r) B A has entries of about
 * --delta times W's RMS: the adapter changes the output measurably, but
 * sanely (on kjv-mini, every matrix at 0.2 moves the perplexity by about
 * 3%; random low-rank deltas of 0.03-0.05, by only about 0.1%). */
#include "cli_int.h"

#include "kvseal/gguf.h"
#include "kvseal/kern.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { LO_BASE, LO_OUT, LO_RANK, LO_ALPHA, LO_SEED, LO_TYPE, LO_TARGETS, LO_DELTA, LO__N };
static const cli__opt lo__opts[LO__N] = {
    [LO_BASE] = {"model", 'm', true, false},    [LO_OUT] = {"output", 'o', true, false},
    [LO_RANK] = {"rank", 'r', true, false},     [LO_ALPHA] = {"alpha", 0, true, false},
    [LO_SEED] = {"seed", 0, true, false},       [LO_TYPE] = {"type", 0, true, false},
    [LO_TARGETS] = {"targets", 0, true, false}, [LO_DELTA] = {"delta", 0, true, false},
};

/* The targets' short names (--targets) and GGUF names, in one order. */
static const char *const lo__short[7] = {"q", "k", "v", "o", "gate", "up", "down"};
static const char *const lo__gguf[7] = {"attn_q",   "attn_k", "attn_v", "attn_output",
                                        "ffn_gate", "ffn_up", "ffn_down"};

typedef struct {
    const char *base, *out;
    long rank;
    double alpha, delta;
    unsigned long long seed;
    ks_dtype type;
    unsigned targets; // bit i: lo__short[i]
} lo__cfg;

static void lo__usage(const char *cmd) {
    (void)cmd;
    fprintf(stderr,
            "usage: kvseal mklora -m BASE.gguf -o ADAPTER.gguf [--rank R (8)] [--alpha A (R)]\n"
            "                     [--seed S (1)] [--type f32|f16|q8_0 (f32)]\n"
            "                     [--targets q,k,v,o,gate,up,down (all)] [--delta F (0.2)]\n"
            "  writes a random LoRA adapter for BASE in llama.cpp's format (its --lora reads\n"
            "  it): per targeted matrix W, factors whose delta (alpha / rank) B A has entries\n"
            "  of about F times W's RMS. q8_0 needs a rank that is a multiple of 32.\n");
}

static bool lo__parse_targets(const char *v, unsigned *out) {
    unsigned m = 0;
    const char *p = v;
    while (*p) {
        const char *e = strchr(p, ',');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        int i = 0;
        while (i < 7 && !(strlen(lo__short[i]) == n && !strncmp(p, lo__short[i], n))) i++;
        if (i == 7) {
            fprintf(stderr, "kvseal mklora: --targets '%s': '%.*s' is not one of "
                    "q k v o gate up down\n", v, (int)n, p);
            return false;
        }
        m |= 1u << i;
        p += n + (e ? 1 : 0);
    }
    if (!m) {
        fprintf(stderr, "kvseal mklora: --targets names no matrix\n");
        return false;
    }
    *out = m;
    return true;
}

static int lo__apply(void *ctx, int id, const char *v, bool reset) {
    lo__cfg *c = ctx;
    (void)reset;
    switch (id) {
    case LO_BASE: c->base = v; return 0;
    case LO_OUT: c->out = v; return 0;
    case LO_RANK: return cli__parse_int("--rank", v, 1, MODEL_LORA_MAX_RANK, &c->rank) ? 0 : 2;
    case LO_ALPHA: return cli__parse_float("--alpha", v, &c->alpha) && c->alpha >= 0 ? 0 : 2;
    case LO_DELTA: return cli__parse_float("--delta", v, &c->delta) && c->delta >= 0 ? 0 : 2;
    case LO_SEED: {
        char *end;
        c->seed = strtoull(v, &end, 10);
        if (!*v || *end) {
            fprintf(stderr, "kvseal mklora: --seed expects an integer\n");
            return 2;
        }
        return 0;
    }
    case LO_TYPE:
        if (!ks_dtype_parse(v, &c->type) || (c->type != KS_DTYPE_F32 && c->type != KS_DTYPE_F16 &&
                                             c->type != KS_DTYPE_Q8_0)) {
            fprintf(stderr, "kvseal mklora: --type '%s' is not one of f32 f16 q8_0\n", v);
            return 2;
        }
        return 0;
    case LO_TARGETS: return lo__parse_targets(v, &c->targets) ? 0 : 2;
    }
    return 2;
}

/* splitmix64: the next of a deterministic stream. */
static uint64_t lo__next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n values uniform in [-1, 1) times sd * sqrt(3) (a standard deviation of sd). */
static void lo__fill(uint64_t *s, float *x, size_t n, double sd) {
    const double h = sd * sqrt(3.0);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(((double)(lo__next(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0) * h);
}

/* RMS of tensor t's elements (ne [K, N]), dequantized row by row. */
static double lo__rms(const gguf_tensor *t, float *row) {
    uint64_t rb = 0;
    if (!ks_dtype_row_bytes(t->type, (uint64_t)t->ne[0], &rb)) return 0;
    double ss = 0;
    for (int64_t r = 0; r < t->ne[1]; r++) {
        kern_dequantize_row((ks_dtype)t->type, (const char *)t->data + (size_t)r * rb, row, t->ne[0]);
        for (int64_t k = 0; k < t->ne[0]; k++) ss += (double)row[k] * row[k];
    }
    return sqrt(ss / ((double)t->ne[0] * (double)t->ne[1]));
}

/* One factor's bytes in the file's type (from f32 values n = rows x cols). */
static void *lo__encode(ks_dtype type, const float *x, int64_t cols, int64_t rows, uint64_t *nb) {
    uint64_t rb = 0;
    if (!ks_dtype_row_bytes(type, (uint64_t)cols, &rb)) return NULL;
    char *y = malloc((size_t)rb * (size_t)rows);
    if (!y) return NULL;
    for (int64_t r = 0; r < rows; r++)
        kern_quantize_row(type, x + (size_t)r * (size_t)cols, y + (size_t)r * rb, cols);
    *nb = rb * (uint64_t)rows;
    return y;
}

int cli_mklora(int argc, char **argv) {
    lo__cfg cf = {.rank = 8, .alpha = -1, .delta = 0.2, .seed = 1, .type = KS_DTYPE_F32,
                  .targets = 0x7f};
    const cli__spec sp = {"mklora", lo__opts, LO__N, lo__apply, lo__usage, false, false};
    int prc = cli__opts_parse(&sp, &cf, argc, argv, NULL);
    if (prc) return prc < 0 ? 0 : prc;
    if (!cf.base || !cf.out) {
        fprintf(stderr, "kvseal mklora: -m BASE.gguf and -o ADAPTER.gguf are required\n");
        lo__usage("mklora");
        return 2;
    }
    if (cf.alpha < 0) cf.alpha = (double)cf.rank;
    if (cf.type == KS_DTYPE_Q8_0 && cf.rank % 32) {
        fprintf(stderr, "kvseal mklora: q8_0 needs a rank that is a multiple of 32 (got %ld)\n",
                cf.rank);
        return 2;
    }
    ks_errbuf eb = {0};
    gguf_file *f = NULL;
    gguf_writer *w = NULL;
    void **bufs = NULL;
    size_t n_bufs = 0;
    float *row = NULL;
    int rc = 1;
    if (kern_init(NULL, &eb) || gguf_open(cf.base, &f, &eb)) goto fail;
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch, &eb)) goto fail;
    char arch_s[64];
    snprintf(arch_s, sizeof arch_s, "%.*s", (int)(arch.len < 63 ? arch.len : 63), arch.ptr);
    char key[96];
    snprintf(key, sizeof key, "%s.block_count", arch_s);
    uint32_t n_layer = 0;
    if (gguf_get_u32(f, key, &n_layer, &eb)) goto fail;
    const double scale = cf.alpha > 0 ? cf.alpha / (double)cf.rank : 1.0;
    w = gguf_writer_create();
    bufs = calloc((size_t)n_layer * 7 * 2 + 1, sizeof *bufs);
    if (!w || !bufs) {
        ks_seterr(&eb, KS_ERR_NOMEM, "adapter");
        goto fail;
    }
    if (gguf_writer_set_str(w, "general.architecture", arch_s) ||
        gguf_writer_set_str(w, "general.type", "adapter") ||
        gguf_writer_set_str(w, "general.name", "kvseal-mklora") ||
        gguf_writer_set_str(w, "adapter.type", "lora") ||
        gguf_writer_set_f32(w, "adapter.lora.alpha", (float)cf.alpha)) {
        ks_seterr(&eb, KS_ERR_NOMEM, "adapter keys");
        goto fail;
    }
    int n_mats = 0;
    for (uint32_t il = 0; il < n_layer; il++)
        for (int ti = 0; ti < 7; ti++) {
            if (!(cf.targets >> ti & 1)) continue;
            char name[80];
            snprintf(name, sizeof name, "blk.%u.%s.weight", il, lo__gguf[ti]);
            const gguf_tensor *t = gguf_find_tensor(f, name);
            if (!t || t->n_dims != 2) continue; // a layer without it (MoE, recurrent)
            const int64_t K = t->ne[0], N = t->ne[1], r = cf.rank;
            if (cf.type == KS_DTYPE_Q8_0 && K % 32) {
                ks_seterr(&eb, KS_ERR_INVAL, "%s: K %lld is not a multiple of 32 (q8_0)", name,
                          (long long)K);
                goto fail;
            }
            free(row);
            float *a = malloc(sizeof(float) * (size_t)(K * r)),
                  *b = malloc(sizeof(float) * (size_t)(r * N));
            row = malloc(sizeof(float) * (size_t)K);
            if (!a || !b || !row) {
                free(a), free(b);
                ks_seterr(&eb, KS_ERR_NOMEM, "%s", name);
                goto fail;
            }
            uint64_t st = cf.seed * 0x100000001b3ull ^ ((uint64_t)il << 8 | (uint64_t)ti);
            // delta entries: scale * sqrt(r) * sd_a * sd_b = delta * rms(W)
            const double sd_a = 1.0 / sqrt((double)K),
                         sd_b = cf.delta * lo__rms(t, row) / (scale * sqrt((double)r) * sd_a);
            lo__fill(&st, a, (size_t)(K * r), sd_a);
            lo__fill(&st, b, (size_t)(r * N), sd_b);
            uint64_t na = 0, nb = 0;
            void *ea = lo__encode(cf.type, a, K, r, &na), *eb_ = lo__encode(cf.type, b, r, N, &nb);
            free(a), free(b);
            bufs[n_bufs++] = ea;
            bufs[n_bufs++] = eb_;
            if (!ea || !eb_) {
                ks_seterr(&eb, KS_ERR_NOMEM, "%s", name);
                goto fail;
            }
            char an[96], bn[96];
            snprintf(an, sizeof an, "%s.lora_a", name);
            snprintf(bn, sizeof bn, "%s.lora_b", name);
            const int64_t nea[2] = {K, r}, neb[2] = {r, N};
            if (gguf_writer_add_tensor(w, an, 2, nea, cf.type, ea, na) ||
                gguf_writer_add_tensor(w, bn, 2, neb, cf.type, eb_, nb)) {
                ks_seterr(&eb, KS_ERR_INVAL, "%s: adding its factors failed", name);
                goto fail;
            }
            n_mats++;
        }
    if (!n_mats) {
        ks_seterr(&eb, KS_ERR_INVAL, "%s has none of the targeted matrices", cf.base);
        goto fail;
    }
    if (gguf_writer_write(w, cf.out, &eb)) goto fail;
    fprintf(stderr, "kvseal mklora: %s: %d matrices, rank %ld, alpha %g, %s\n", cf.out, n_mats,
            cf.rank, cf.alpha, ks_dtype_name(cf.type));
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvseal mklora: %s\n", eb.msg[0] ? eb.msg : "failed");
done:
    for (size_t i = 0; i < n_bufs; i++) free(bufs[i]);
    free(bufs);
    free(row);
    gguf_writer_destroy(w);
    gguf_close(f);
    return rc;
}
