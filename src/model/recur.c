/* recur.c — the recurrent layers of hybrid models (model.h): qwen35's Gated
 * DeltaNet (a causal convolution over the q|k|v channels, then per value
 * head the gated delta rule over a state of S x S, read by the query, then
 * a gated RMSNorm and the output projection) and nemotron_h's Mamba2 (the
 * same convolution over x|B|C, with a bias; per head a state of head_dim x
 * S decayed and fed by B x dt, read by C (kern_ssm.h); the D skip, the
 * silu(z) gate, an RMSNorm per group and the output projection).
 *
 * The state of a sequence lives in its state pages (kv.h), resolved through
 * kv's tag check once per pass (model__state_resolve). It is kept as rows
 * of S floats: per recurrent layer, first the convolution window (the last
 * conv - 1 inputs of every channel: row w * C/S + c/S holds channels
 * [c, c + S) of the input w steps back from the oldest, oldest first), then
 * each value head's S rows (kern.h gdn_step), or each Mamba2 head's
 * head_dim rows. Row g is row g % R of state
 * page g / R, R = page bytes / (4 S).
 *
 * Every token of a sequence runs through the recurrence one at a time, in
 * position order, on one thread per (sequence, channel block) or (sequence,
 * head): a prompt chunked any way, batched with anything, gives the state
 * and outputs the token-by-token pass gives, bit for bit. */
#include "model_int.h"

#include "kvseal/kern_ssm.h"

#include <math.h>
#include <string.h>

/* Row g of sequence si's state. */
static inline float *rec__row(const model_ctx *c, int si, int64_t g) {
    return (float *)c->st_pg[(size_t)si * (size_t)c->st_pages + (size_t)(g / c->st_rpp)] +
           (size_t)(g % c->st_rpp) * (size_t)c->m->hp.ssm_state;
}

bool model__state_resolve(model_ctx *c, const model_batch *b) {
    bool all = true;
    for (int s = 0; s < b->n_seqs; s++) {
        if (c->seq_first[s] < 0) continue;
        for (int i = 0; i < c->st_pages; i++)
            if (kv_seq_state(c->pool, b->seqs[s], (uint32_t)i,
                             &c->st_pg[(size_t)s * (size_t)c->st_pages + (size_t)i]) != KS_OK) {
                atomic_store(&c->seq_bad[s], 1); // I1: this sequence stops; others go on
                all = false;
                break;
            }
    }
    return all;
}

void model__order_tokens(model_ctx *c, const model_batch *b) {
    int32_t *off = c->ord_off;
    memset(off, 0, sizeof(int32_t) * (size_t)(b->n_seqs + 1));
    for (int t = 0; t < b->n_tokens; t++)
        off[b->seq[t] + 1]++;
    for (int s = 0; s < b->n_seqs; s++)
        off[s + 1] += off[s];
    int32_t *fill = c->ord_fill;
    memcpy(fill, off, sizeof(int32_t) * (size_t)b->n_seqs);
    for (int t = 0; t < b->n_tokens; t++) // in batch order: a sequence's tokens by position
        c->ord[fill[b->seq[t]]++] = t;
}

typedef enum { REC_CONV, REC_PREP, REC_SCAN, REC_OUT } rec__phase;

typedef struct {
    model_ctx *c;
    const model_batch *b;
    const model__layer *L;
    rec__phase ph;
    kern_ssm_scan_fn scan; // Mamba2's step (NULL: a Gated DeltaNet layer)
    int64_t n;         // units: (sequence, block), tokens, (sequence, head), tokens
    atomic_llong next; // next unit to claim
} rec__run;

/* The causal convolution of sequence si's tokens over channels [q S, q S +
 * S) (plus the bias, where the layer has one), then SiLU, in place in ssm_x; the window moves along. Layout: the
 * transposed taps (K, C) and the window rows put S channels side by side,
 * so the inner loops run along contiguous channels. */
static void rec__conv(rec__run *a, int si, int q) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const int S = hp->ssm_state, K = hp->ssm_conv;
    const int64_t C = 2 * (int64_t)hp->ssm_k_heads * S + hp->ssm_inner;
    const int64_t nb = C / S, g0 = (int64_t)a->L->rec_layer * c->st_rows_layer;
    const float *bias = a->L->ssm_conv_b ? a->L->ssm_conv_b + (size_t)q * (size_t)S : NULL;
    float *win[16]; // the window's rows for this block, oldest first
    for (int w = 0; w < K - 1; w++)
        win[w] = rec__row(c, si, g0 + w * nb + q);
    const float *wt = a->L->ssm_conv1d + (size_t)q * (size_t)S; // tap r of channel j: wt[r C + j]
    float x[MODEL_MAX_SSM_STATE];
    for (int32_t i = c->ord_off[si]; i < c->ord_off[si + 1]; i++) {
        float *y = c->ssm_x + (size_t)c->ord[i] * (size_t)C + (size_t)q * (size_t)S;
        memcpy(x, y, sizeof(float) * (size_t)S);
        for (int j = 0; j < S; j++)
            y[j] = x[j] * wt[(size_t)(K - 1) * (size_t)C + (size_t)j];
        for (int w = 0; w < K - 1; w++)
            for (int j = 0; j < S; j++)
                y[j] = fmaf(win[w][j], wt[(size_t)w * (size_t)C + (size_t)j], y[j]);
        if (bias) // Mamba2's, after the taps as llama.cpp adds it
            for (int j = 0; j < S; j++)
                y[j] += bias[j];
        for (int j = 0; j < S; j++)
            y[j] = y[j] / (1.0f + expf(-y[j]));
        float *oldest = win[0]; // the window moves: the oldest row takes the new input
        for (int w = 0; w + 1 < K - 1; w++)
            win[w] = win[w + 1];
        win[K - 2] = oldest;
        memcpy(oldest, x, sizeof(float) * (size_t)S);
    }
    // the rows rotated: put them back in their fixed places (oldest first)
    float tmp[16][MODEL_MAX_SSM_STATE];
    for (int w = 0; w < K - 1; w++)
        memcpy(tmp[w], win[w], sizeof(float) * (size_t)S);
    for (int w = 0; w < K - 1; w++)
        memcpy(rec__row(c, si, g0 + w * nb + q), tmp[w], sizeof(float) * (size_t)S);
}

/* Token t's heads made ready for the scan: q and k L2-normalized per head
 * (q also by 1/sqrt(S)), beta = sigmoid, decay = exp(softplus(alpha + dt) * a). */
static void rec__prep(rec__run *a, int t) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const int S = hp->ssm_state, Hk = hp->ssm_k_heads, Hv = hp->ssm_v_heads;
    const int64_t C = 2 * (int64_t)Hk * S + (int64_t)Hv * S;
    float *x = c->ssm_x + (size_t)t * (size_t)C;
    const float qs = 1.0f / sqrtf((float)S);
    for (int h = 0; h < 2 * Hk; h++) { // the Hk query heads, then the Hk key heads
        float *v = x + (size_t)h * (size_t)S;
        double ss = 0.0;
        for (int i = 0; i < S; i++)
            ss += (double)v[i] * v[i];
        float n = sqrtf((float)ss);
        float sc = 1.0f / (n > hp->norm_eps ? n : hp->norm_eps);
        if (h < Hk) sc *= qs;
        for (int i = 0; i < S; i++)
            v[i] *= sc;
    }
    float *beta = c->ssm_b + (size_t)t * (size_t)Hv, *dec = c->ssm_a + (size_t)t * (size_t)Hv;
    for (int h = 0; h < Hv; h++) {
        beta[h] = 1.0f / (1.0f + expf(-beta[h]));
        const float z = dec[h] + a->L->ssm_dt[h];
        const float sp = z > 20.0f ? z : log1pf(expf(z)); // softplus
        dec[h] = expf(sp * a->L->ssm_a[h]);
    }
}

/* Value head h of sequence si over its tokens in order. */
static void rec__scan(rec__run *a, int si, int h) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const int S = hp->ssm_state, Hk = hp->ssm_k_heads, Hv = hp->ssm_v_heads;
    const int64_t C = 2 * (int64_t)Hk * S + (int64_t)Hv * S;
    const int64_t g0 = (int64_t)a->L->rec_layer * c->st_rows_layer +
                       (int64_t)(hp->ssm_conv - 1) * (C / S) + (int64_t)h * S;
    float *rows[MODEL_MAX_SSM_STATE];
    for (int j = 0; j < S; j++)
        rows[j] = rec__row(c, si, g0 + j);
    const int kh = h % Hk; // value head h reads key head h % Hk (llama.cpp's repeat)
    for (int32_t i = c->ord_off[si]; i < c->ord_off[si + 1]; i++) {
        const int t = c->ord[i];
        const float *x = c->ssm_x + (size_t)t * (size_t)C;
        c->kv->gdn_step(S, rows, x + (size_t)kh * (size_t)S, x + (size_t)(Hk + kh) * (size_t)S,
                        x + (size_t)(2 * Hk + h) * (size_t)S,
                        c->ssm_a[(size_t)t * (size_t)Hv + (size_t)h],
                        c->ssm_b[(size_t)t * (size_t)Hv + (size_t)h],
                        c->ssm_o + (size_t)t * (size_t)(Hv * S) + (size_t)h * (size_t)S);
    }
}

/* Token t's output heads: RMSNorm(o_h) * ssm_norm * silu(z_h), in place. */
static void rec__out(rec__run *a, int t) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const int S = hp->ssm_state, Hv = hp->ssm_v_heads;
    for (int h = 0; h < Hv; h++) {
        float *o = c->ssm_o + (size_t)t * (size_t)(Hv * S) + (size_t)h * (size_t)S;
        const float *z = c->ssm_z + (size_t)t * (size_t)(Hv * S) + (size_t)h * (size_t)S;
        c->kv->rmsnorm(S, o, a->L->ssm_norm, hp->norm_eps, o);
        c->kv->silu_mul(S, z, o, o);
    }
}

/* Mamba2: token t's heads made ready for the scan: dt = softplus(dt +
 * dt_bias) into ssm_b, the decay exp(dt A) into ssm_a (over the raw dt). */
static void rec__m2_prep(rec__run *a, int t) {
    const model__layer *L = a->L;
    const int H = a->c->m->hp.ssm_v_heads;
    float *dt = a->c->ssm_b + (size_t)t * (size_t)H, *da = a->c->ssm_a + (size_t)t * (size_t)H;
    for (int h = 0; h < H; h++) {
        const float z = da[h] + L->ssm_dt[h];
        const float sp = z > 20.0f ? z : log1pf(expf(z)); // softplus
        dt[h] = sp;
        da[h] = expf(sp * L->ssm_a[h]);
    }
}

/* Mamba2: head h of sequence si over its tokens in order. Token rows of
 * ssm_x are x (heads of head_dim) | B (groups of S) | C (groups of S);
 * head h reads group h / (heads / groups) (llama.cpp's repeat_interleave). */
static void rec__m2_scan(rec__run *a, int si, int h) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const int S = hp->ssm_state, P = hp->ssm_head_dim, G = hp->ssm_k_heads, H = hp->ssm_v_heads;
    const int64_t DI = hp->ssm_inner, C = DI + 2 * (int64_t)G * S;
    const int64_t g0 = (int64_t)a->L->rec_layer * c->st_rows_layer +
                       (int64_t)(hp->ssm_conv - 1) * (C / S) + (int64_t)h * P;
    float *rows[MODEL_MAX_SSM_STATE];
    for (int i = 0; i < P; i++)
        rows[i] = rec__row(c, si, g0 + i);
    const int g = h / (H / G);
    for (int32_t i = c->ord_off[si]; i < c->ord_off[si + 1]; i++) {
        const int t = c->ord[i];
        const float *x = c->ssm_x + (size_t)t * (size_t)C;
        a->scan(S, P, rows, x + (size_t)h * (size_t)P, x + (size_t)(DI + (int64_t)g * S),
                x + (size_t)(DI + (int64_t)(G + g) * S), c->ssm_a[(size_t)t * (size_t)H + (size_t)h],
                c->ssm_b[(size_t)t * (size_t)H + (size_t)h],
                c->ssm_o + (size_t)t * (size_t)DI + (size_t)h * (size_t)P);
    }
}

/* Mamba2: token t's output, y + D_h x, times silu(z), RMS-normed per group
 * of d_inner / groups elements, in place in ssm_o. */
static void rec__m2_out(rec__run *a, int t) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const int P = hp->ssm_head_dim, G = hp->ssm_k_heads, H = hp->ssm_v_heads;
    const int64_t DI = hp->ssm_inner, C = DI + 2 * (int64_t)G * hp->ssm_state, GD = DI / G;
    float *y = c->ssm_o + (size_t)t * (size_t)DI;
    const float *x = c->ssm_x + (size_t)t * (size_t)C;
    for (int h = 0; h < H; h++)
        for (int i = h * P; i < (h + 1) * P; i++) {
            const float d = x[i] * a->L->ssm_d[h];
            y[i] += d;
        }
    c->kv->silu_mul(DI, c->ssm_z + (size_t)t * (size_t)DI, y, y);
    for (int g = 0; g < G; g++)
        c->kv->rmsnorm(GD, y + g * GD, a->L->ssm_norm + g * GD, hp->norm_eps, y + g * GD);
}

static void rec__task(void *arg, int ith, int nth) {
    rec__run *a = arg;
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const int64_t nb = 2 * (int64_t)hp->ssm_k_heads + hp->ssm_inner / hp->ssm_state; // C / S
    (void)ith, (void)nth;
    int64_t u0, u1;
    while (ks_pool_claim(&a->next, a->n, 1, &u0, &u1))
        for (int64_t u = u0; u < u1; u++) {
            switch (a->ph) {
            case REC_CONV: {
                const int si = (int)(u / nb);
                if (c->ord_off[si] < c->ord_off[si + 1] && // it has tokens in this batch
                    !atomic_load_explicit(&c->seq_bad[si], memory_order_relaxed))
                    rec__conv(a, si, (int)(u % nb));
                break;
            }
            case REC_PREP:
                if (a->scan)
                    rec__m2_prep(a, (int)u);
                else
                    rec__prep(a, (int)u);
                break;
            case REC_SCAN: {
                const int si = (int)(u / hp->ssm_v_heads);
                if (c->ord_off[si] < c->ord_off[si + 1] &&
                    !atomic_load_explicit(&c->seq_bad[si], memory_order_relaxed))
                    (a->scan ? rec__m2_scan : rec__scan)(a, si, (int)(u % hp->ssm_v_heads));
                break;
            }
            case REC_OUT:
                if (a->scan)
                    rec__m2_out(a, (int)u);
                else
                    rec__out(a, (int)u);
                break;
            }
        }
}

static void rec__phase_run(rec__run *a, rec__phase ph, int64_t n) {
    a->ph = ph;
    a->n = n;
    atomic_init(&a->next, 0);
    model__run_rows(a->c, n, rec__task, a);
}

void model__gdn_layer(model_ctx *c, const model_batch *b, const model__layer *L) {
    const model_hparams *hp = &c->m->hp;
    const int T = b->n_tokens;
    const model__mat *ws[] = {&L->ssm_qkv, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha};
    float *const ys[] = {c->ssm_x, c->ssm_z, c->ssm_b, c->ssm_a};
    model__matmuls(c, 4, ws, c->xn, T, ys);
    rec__run a = {.c = c, .b = b, .L = L};
    rec__phase_run(&a, REC_CONV,
                   (int64_t)b->n_seqs * (2 * (int64_t)hp->ssm_k_heads + hp->ssm_v_heads));
    rec__phase_run(&a, REC_PREP, T);
    rec__phase_run(&a, REC_SCAN, (int64_t)b->n_seqs * hp->ssm_v_heads);
    rec__phase_run(&a, REC_OUT, T);
    model__matmul(c, &L->ssm_out, c->ssm_o, T, c->tmp);
}

void model__mamba2_layer(model_ctx *c, const model_batch *b, const model__layer *L) {
    const model_hparams *hp = &c->m->hp;
    const int T = b->n_tokens;
    // ssm_in's row ranges: x|B|C (the convolution's channels), z, dt
    const model__mat *ws[] = {&L->ssm_qkv, &L->ssm_z, &L->ssm_alpha};
    float *const ys[] = {c->ssm_x, c->ssm_z, c->ssm_a};
    model__matmuls(c, 3, ws, c->xn, T, ys);
    rec__run a = {.c = c, .b = b, .L = L, .scan = kern_ssm_scan_for(c->kv)};
    rec__phase_run(&a, REC_CONV,
                   (int64_t)b->n_seqs *
                       (2 * (int64_t)hp->ssm_k_heads + hp->ssm_inner / hp->ssm_state));
    rec__phase_run(&a, REC_PREP, T);
    rec__phase_run(&a, REC_SCAN, (int64_t)b->n_seqs * hp->ssm_v_heads);
    rec__phase_run(&a, REC_OUT, T);
    model__matmul(c, &L->ssm_out, c->ssm_o, T, c->tmp);
}
