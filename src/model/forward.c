/* forward.c — the batched forward pass over paged KV (see model.h; its
 * context, model_ctx_create: ctx.c).
 *
 * One pass runs layer by layer over all T tokens of the batch. Each op is a
 * ks_pool task split by (ith, nth): matmuls split output rows, row ops split
 * tokens, attention splits (token, head) pairs. Every output element is
 * produced by exactly one thread with a fixed reduction order, so results do
 * not depend on the thread count or on what else is in the batch. The
 * matmul runs and the activation quantization are matmul.c's, a floor below.
 *
 * Shape legend: T tokens in the batch, E n_embd, H query heads, Hkv K/V
 * heads, D head_dim, F n_ff, V n_vocab, P page_tokens. */
#include "model_int.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Row ops (split by token)

typedef enum {
    FWD_EMBED,         // x[t] = token_embd[tok[t]]
    FWD_MTP_IN,        // cat[t] = [enorm(token_embd[tok[t]]) | hnorm(mtp_in[t])]
    FWD_NORM,          // xn[t] = rmsnorm(x[t]) * w
    FWD_ADD_NORM,      // x[t] += tmp[t] (+ tb); xn[t] = rmsnorm(x[t]) * w  (w NULL: add only)
    FWD_QKV,           // biases, q/k norm, rope on q[t], k[t]; write k, v to the KV page
    FWD_SWIGLU,        // g[r] = silu(g[r]) * u[r], rows of ff
    FWD_SWIGLU_OAI,    // gpt-oss's expert rows r: g[r] = swiglu_oai(g[r] + gb, u[r] + ub),
                       // the biases of row r's expert (row_exp)
    FWD_GEGLU,         // g[t] = gelu(g[t]) * u[t]
    FWD_RELU2,         // g[t] = relu(g[t])^2 (nemotron_h's MLP: no gate)
    FWD_POST_ADD_NORM, // tmp[t] = rmsnorm(tmp[t]) * w2, then FWD_ADD_NORM (gemma post-norms)
    FWD_MOE_GATHER,    // xe[r] = xn[row_tok[r]], rows in expert order
    FWD_MOE_COMBINE,   // tmp[t] = sum over t's slots j of sel_w[t][j] * xe[slot_row[t][j]]
                       // (+ xe[sh_row0 + t], the shared expert's, after the sum)
    FWD_MLA_QNORM,     // mla_qa[t] = rmsnorm(mla_qa[t]) * w
    FWD_MLA_QKV,       // rope q/k, q_nope to mla_qn, latent normed; write the KV row
    FWD_DSA_SELECT,    // the indexer's top_k positions of token t into dsa_sel[t]
    FWD_ATTN_GATE,     // att[t] *= sigmoid(gate[t]) (qwen35's gated attention)
    FWD_PLE_IN,        // ple[t] (per_layer_model_proj x[t]) into the token's per-layer inputs
    FWD_PLE_GATE,      // g[t] = gelu(g[t]) * ple[t][layer] (n_embd_pl: gemma4)
    FWD_G4_MOE_IN,     // gemma4 MoE: tmp2 = rmsnorm(tmp) * post_norm_1 (the dense FFN's),
                       // xn = rmsnorm(x) * pre_norm_2, tmp = rmsnorm(x) / sqrt(E) * router scale
    FWD_G4_MOE_OUT,    // gemma4 MoE: tmp = tmp2 + rmsnorm(tmp) * post_norm_2
} fwd__rowop;

typedef struct {
    model_ctx *c;
    const model_batch *b;
    fwd__rowop op;
    const float *w;  // norm weight
    const float *w2; // FWD_POST_ADD_NORM: the sublayer output's norm weight
    const float *tb; // FWD_ADD_NORM: a bias (E) of the sublayer output, added to it first
    float xs;        // FWD_ADD_NORM: the residual stream times this after the add (1: none)
    int layer;
    int n;             // rows to claim: tokens, or (token, expert) rows
    int64_t ff;        // FWD_SWIGLU's row length
    int64_t part;      // > 0: a one-token SwiGLU / GeGLU cut into parts of this many elements
    // with qfn: each token row t the op writes (qsrc[t], qK floats) is then
    // quantized into qdst[t] (qrb bytes a row) by the same thread, so the
    // matmul after the op finds its input in the act cache
    kern_quant_fn qfn;
    ks_dtype qtype; // qfn's type
    const float *qsrc;
    int64_t qK;
    void *qdst;
    size_t qrb;
    atomic_llong next; // next row to claim
    atomic_llong left; // rows not yet done
} fwd__rows;

/* The model's RoPE settings at this context (sliding layers override the base). */
static kern_rope_cfg fwd__rope_cfg(const model_ctx *c) {
    const model_hparams *hp = &c->m->hp;
    return (kern_rope_cfg){.n_rot = hp->n_rot,
                           .freq_base = hp->rope_base,
                           .freq_scale = hp->rope_scale,
                           .freq_factors = c->rope_freqs,
                           .ext_factor = hp->rope_ext_factor,
                           .attn_factor = hp->rope_attn_factor,
                           .corr_lo = hp->rope_corr[0],
                           .corr_hi = hp->rope_corr[1]};
}

static void fwd__qkv_row(fwd__rows *a, int t) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const model__layer *L = &c->m->layers[a->layer];
    const kern_vtab *kv = c->kv;
    const int D = L->head_dim, H = hp->n_head, Hkv = L->n_head_kv, KVD = Hkv * D;
    float *q = c->q + (size_t)t * (size_t)(H * D);
    float *k = c->k + (size_t)t * (size_t)KVD;
    float *v = c->v + (size_t)t * (size_t)KVD;
    if (hp->attn_out_gate) // attn_q's rows per head: the query, then its output gate
        for (int h = 0; h < H; h++) {
            const float *qg = c->qg + (size_t)t * (size_t)(2 * H * D) + (size_t)(2 * h * D);
            memcpy(q + h * D, qg, sizeof(float) * (size_t)D);
            memcpy(c->gate + (size_t)t * (size_t)(H * D) + (size_t)(h * D), qg + D,
                   sizeof(float) * (size_t)D);
        }
    if (L->bq) {
        for (int i = 0; i < H * D; i++) q[i] += L->bq[i];
        for (int i = 0; i < KVD; i++) k[i] += L->bk[i];
        for (int i = 0; i < KVD; i++) v[i] += L->bv[i];
    }
    if (L->wk.data && !L->wv.data) // gemma4 without attn_v: V is the K projection (before its norm)
        memcpy(v, k, sizeof(float) * (size_t)KVD);
    const int32_t pos = a->b->pos[t];
    float cs[MODEL_MAX_HEAD_DIM]; // the position's angles, shared by every head
    kern_rope_cfg rl = fwd__rope_cfg(c);
    rl.n_rot = L->n_rot;
    if (L->swa) { // gemma3's and gemma4's sliding layers turn at their own base
        rl.freq_base = hp->rope_base_swa;
        rl.freq_scale = hp->rope_scale_swa;
        if (hp->rope_freqs_full) rl.freq_factors = NULL; // gemma4: the full layers' only
    }
    kern_rope_table_cfg(cs, &rl, pos);
    for (int h = 0; h < H; h++) {
        if (L->q_norm) kv->rmsnorm(D, q + h * D, L->q_norm, hp->norm_eps, q + h * D);
        kern_rope_apply(q + h * D, L->n_rot, cs, hp->rope_neox);
    }
    if (hp->attn_temp_scale != 0.0f) { // mistral3: the query's temperature at this position
        const float ts = logf(floorf((float)pos / (float)hp->attn_temp_floor) + 1.0f) *
                             hp->attn_temp_scale +
                         1.0f;
        for (int i = 0; i < H * D; i++) q[i] *= ts;
    }
    if (!L->wk.data) return; // gemma4's shared KV layers: the source layer wrote K/V
    for (int h = 0; h < Hkv; h++) {
        if (L->k_norm) kv->rmsnorm(D, k + h * D, L->k_norm, hp->norm_eps, k + h * D);
        kern_rope_apply(k + h * D, L->n_rot, cs, hp->rope_neox);
        if (hp->v_norm) kv->rmsnorm(D, v + h * D, c->m->ones, hp->norm_eps, v + h * D);
    }
    // K/V rows go to their page through kv (the only code that knows addresses)
    const int si = a->b->seq[t];
    const kv_seq *s = a->b->seqs[si];
    const uint32_t P = (uint32_t)kv_pool_geom(c->pool)->page_tokens;
    void *kp, *vp;
    if (atomic_load_explicit(&c->seq_bad[si], memory_order_relaxed)) return;
    if (kv_seq_span_write(c->pool, s, (uint32_t)pos / P, L->kv_layer, &kp, &vp) != KS_OK) {
        atomic_store(&c->seq_bad[si], 1);  // I1: this sequence stops here; others go on
        return;
    }
    // stored in the pool's KV type (f32 copy, f16, or q8_0 blocks within a head)
    const size_t row = (size_t)((uint32_t)pos % P) * c->kv_row;
    kv->kv_store[c->kv_type](k, (uint8_t *)kp + row, KVD);
    kv->kv_store[c->kv_type](v, (uint8_t *)vp + row, KVD);
}

/* x = (x - mean) / sqrt(var + eps) * w + b over n floats, sums in double. */
static void fwd__layernorm(int n, float *x, const float *w, const float *b, float eps) {
    double sum = 0.0, sq = 0.0;
    for (int i = 0; i < n; i++)
        sum += x[i];
    const float mean = (float)(sum / n);
    for (int i = 0; i < n; i++) {
        x[i] -= mean;
        sq += (double)x[i] * x[i];
    }
    const float scale = 1.0f / sqrtf((float)(sq / n) + eps);
    for (int i = 0; i < n; i++)
        x[i] = x[i] * scale * w[i] + b[i];
}

/* MLA's per-token part of the attention input: each head's query splits
 * into nope (to mla_qn, for the absorption matmuls) and rope (rotated into
 * q[t][h*D + kv_lora ..], behind the room the absorbed nope part will fill);
 * the KV row k[t] = [rmsnorm(latent) * kv_a_norm | rotated rope key] goes
 * to the page, one row per layer. */
static void fwd__mla_row(fwd__rows *a, int t) {
    model_ctx *c = a->c;
    const model_hparams *hp = &c->m->hp;
    const model__layer *L = &c->m->layers[a->layer];
    const int H = hp->n_head, D = hp->head_dim, KL = hp->kv_lora, R = hp->n_rot;
    const int QK = hp->mla_qk, NOPE = QK - R;
    const float *qf = c->mla_qf + (size_t)t * (size_t)(H * QK);
    float *q = c->q + (size_t)t * (size_t)(H * D), *qn = c->mla_qn + (size_t)t * (size_t)(H * NOPE);
    float *kr = c->k + (size_t)t * (size_t)D;
    const int32_t pos = a->b->pos[t];
    float cs[MODEL_MAX_HEAD_DIM];
    const kern_rope_cfg rc = fwd__rope_cfg(c);
    kern_rope_table_cfg(cs, &rc, pos);
    for (int h = 0; h < H; h++) {
        memcpy(qn + h * NOPE, qf + h * QK, sizeof(float) * (size_t)NOPE);
        float *qpe = q + h * D + KL;
        memcpy(qpe, qf + h * QK + NOPE, sizeof(float) * (size_t)R);
        kern_rope_apply(qpe, R, cs, hp->rope_neox);
    }
    c->kv->rmsnorm(KL, kr, L->kv_a_norm, hp->norm_eps, kr);
    kern_rope_apply(kr + KL, R, cs, hp->rope_neox);
    const int NI = hp->idx_heads, I = hp->idx_dim;
    float *ik = hp->idx_topk ? c->dsa_k + (size_t)t * (size_t)I : NULL;
    if (ik) { // the indexer's key: LayerNorm, then its rope part (first, NEOX pairs) turns
        fwd__layernorm(I, ik, L->idx_k_norm, L->idx_k_norm_b, hp->ln_eps);
        kern_rope_apply(ik, R, cs, true);
        float *iq = c->dsa_q + (size_t)t * (size_t)(NI * I);
        for (int h = 0; h < NI; h++)
            kern_rope_apply(iq + h * I, R, cs, true);
    }
    const int si = a->b->seq[t];
    const uint32_t P = (uint32_t)kv_pool_geom(c->pool)->page_tokens;
    void *kp, *vp;
    if (atomic_load_explicit(&c->seq_bad[si], memory_order_relaxed)) return;
    if (kv_seq_span_write(c->pool, a->b->seqs[si], (uint32_t)pos / P, a->layer, &kp, &vp) !=
        KS_OK) {
        atomic_store(&c->seq_bad[si], 1); // I1: this sequence stops here; others go on
        return;
    }
    uint8_t *row = (uint8_t *)kp + (size_t)((uint32_t)pos % P) * c->kv_row;
    c->kv->kv_store[c->kv_type](kr, row, D);
    if (ik) c->kv->kv_store[c->kv_type](ik, row + c->dsa_off, I);
}

/* Heap order of the indexer's candidates: the worse of two (lower score,
 * or on a tie the later position) sorts first. */
static bool fwd__dsa_worse(float sa, int32_t ja, float sb, int32_t jb) {
    return sa < sb || (sa == sb && ja > jb);
}

/* Token t's indexer scores of positions [j0, j1) (page-aligned j0) into
 * score[j]: sum_h relu(q_h . k_j) * w_h / sqrt(heads * dim) from the
 * indexer keys in its own pages (the table fwd__resolve checked). sc: the
 * thread's scratch of idx_heads rows of max_ctx floats. Position j's score
 * comes from the same page-at-a-time dot_rows call whatever the range. */
static void fwd__dsa_score(model_ctx *c, const model_batch *b, int t, uint32_t j0, uint32_t j1,
                           float *sc, float *score) {
    const model_hparams *hp = &c->m->hp;
    const int NI = hp->idx_heads, I = hp->idx_dim;
    const uint32_t P = (uint32_t)kv_pool_geom(c->pool)->page_tokens;
    const size_t S = (size_t)c->max_ctx;
    const void *const *kp = c->kp + (size_t)b->seq[t] * (size_t)c->max_pages;
    const float *iq = c->dsa_q + (size_t)t * (size_t)(NI * I),
                *w = c->dsa_w + (size_t)t * (size_t)NI;
    for (uint32_t j = j0; j < j1;) { // sc[h*S + j] = q_h . k_j, a page's rows at a time
        const uint32_t r = j % P, nj = j1 - j < P - r ? j1 - j : P - r;
        const uint8_t *rows = (const uint8_t *)kp[j / P] + (size_t)r * c->kv_row + c->dsa_off;
        c->kv->dot_rows[c->kv_type](I, NI, iq, rows, c->kv_row, (int)nj, 1.0f, sc + j, S);
        j += nj;
    }
    const float scale = 1.0f / sqrtf((float)NI * (float)I);
    for (uint32_t j = j0; j < j1; j++) {
        float v = 0.0f;
        for (int h = 0; h < NI; h++)
            v += fmaxf(sc[(size_t)h * S + j], 0.0f) * w[h];
        score[j] = v * scale;
    }
}

/* Whether token t selects at all: its context is past top_k and its
 * sequence's pages resolved (otherwise dsa_n[t] stays 0: attention reads
 * every position, or nothing). */
static bool fwd__dsa_sparse(const model_ctx *c, const model_batch *b, int t) {
    return b->pos[t] + 1 > c->m->hp.idx_topk &&
           !atomic_load_explicit(&c->seq_bad[b->seq[t]], memory_order_relaxed);
}

/* Token t's top_k positions by score[0..pos], ascending, into dsa_sel[t]. */
static void fwd__dsa_topk(model_ctx *c, const model_batch *b, int t, const float *score) {
    const int K = c->m->hp.idx_topk;
    const uint32_t n_ctx = (uint32_t)b->pos[t] + 1;
    // a min-heap of the K best so far (the root: the worst of them)
    int32_t *heap = c->dsa_sel + (size_t)t * (size_t)K;
    for (uint32_t j = 0; j < n_ctx; j++) {
        int i = (int)j;
        if (j < (uint32_t)K) { // sift up
            for (; i > 0; i = (i - 1) / 2) {
                const int32_t up = heap[(i - 1) / 2];
                if (!fwd__dsa_worse(score[j], (int32_t)j, score[up], up)) break;
                heap[i] = up;
            }
            heap[i] = (int32_t)j;
            continue;
        }
        if (!fwd__dsa_worse(score[heap[0]], heap[0], score[j], (int32_t)j)) continue;
        for (i = 0;;) { // j replaces the root: sift down
            int l = 2 * i + 1, mi = i;
            int32_t worst = (int32_t)j;
            if (l < K && fwd__dsa_worse(score[heap[l]], heap[l], score[worst], worst))
                mi = l, worst = heap[l];
            if (l + 1 < K && fwd__dsa_worse(score[heap[l + 1]], heap[l + 1], score[worst], worst))
                mi = l + 1, worst = heap[l + 1];
            if (mi == i) break;
            heap[i] = heap[mi];
            i = mi;
        }
        heap[i] = (int32_t)j;
    }
    // ascending positions: attention reads them in order (a fixed sum order)
    for (int i = 1; i < K; i++) {
        const int32_t v = heap[i];
        int k = i;
        for (; k > 0 && heap[k - 1] > v; k--)
            heap[k] = heap[k - 1];
        heap[k] = v;
    }
    c->dsa_n[t] = K;
}

/* Token t's sparse-attention selection on one thread: every past position
 * scored (fwd__dsa_score) and the top_k kept (fwd__dsa_topk). sc: scratch
 * of (idx_heads + 1) * max_ctx floats. */
static void fwd__dsa_select(fwd__rows *a, int t, float *sc) {
    model_ctx *c = a->c;
    c->dsa_n[t] = 0;
    if (!fwd__dsa_sparse(c, a->b, t)) return;
    float *score = sc + (size_t)c->m->hp.idx_heads * (size_t)c->max_ctx;
    fwd__dsa_score(c, a->b, t, 0, (uint32_t)a->b->pos[t] + 1, sc, score);
    fwd__dsa_topk(c, a->b, t, score);
}

static void fwd__rows_task(void *arg, int ith, int nth) {
    fwd__rows *a = arg;
    model_ctx *c = a->c;
    const model *m = c->m;
    const int64_t E = m->hp.n_embd, F = a->ff;
    int64_t t0, t1;
    for (; ks_pool_claim(&a->next, a->n, 1, &t0, &t1);
         atomic_fetch_sub_explicit(&a->left, 1, memory_order_relaxed)) {
        const int t = (int)t0;
        // token rows (a MoE op's rows t may run past max_tokens: no pointer here)
        const size_t xo = (size_t)t * (size_t)E;
        switch (a->op) {
        case FWD_EMBED: {
            const model__mat *w = &m->tok_embd;
            kern_dequantize_row(w->type,
                                (const char *)w->data + (size_t)a->b->tokens[t] * w->row_bytes,
                                c->x + xo, E);
            if (m->hp.embd_scale != 1.0f)
                for (int64_t i = 0; i < E; i++)
                    c->x[xo + (size_t)i] *= m->hp.embd_scale;
            break;
        }
        case FWD_MTP_IN: { // layout: cat rows of 2E, the embedding's half first
            const model__mat *w = &m->tok_embd;
            float *cat = c->mtp_cat + (size_t)t * 2 * (size_t)E;
            kern_dequantize_row(w->type,
                                (const char *)w->data + (size_t)a->b->tokens[t] * w->row_bytes,
                                cat, E);
            c->kv->rmsnorm(E, cat, m->mtp_enorm, m->hp.norm_eps, cat);
            c->kv->rmsnorm(E, c->mtp_in + (size_t)t * (size_t)E, m->mtp_hnorm, m->hp.norm_eps,
                           cat + E);
            break;
        }
        case FWD_POST_ADD_NORM: {
            float *o = c->tmp + (size_t)t * (size_t)E;
            c->kv->rmsnorm(E, o, a->w2, m->hp.norm_eps, o);
        }
            // fall through
        case FWD_ADD_NORM:
            if (a->tb) // as llama.cpp: (out + bias) + residual
                for (int64_t i = 0; i < E; i++)
                    c->x[xo + (size_t)i] += c->tmp[xo + (size_t)i] + a->tb[i];
            else
                for (int64_t i = 0; i < E; i++)
                    c->x[xo + (size_t)i] += c->tmp[xo + (size_t)i];
            if (a->xs != 1.0f) // gemma4's layer_output_scale: (out + residual) * s, as llama.cpp
                for (int64_t i = 0; i < E; i++)
                    c->x[xo + (size_t)i] *= a->xs;
            if (!a->w) break;
            // fall through
        case FWD_NORM:
            c->kv->rmsnorm(E, c->x + xo, a->w, m->hp.norm_eps, c->xn + xo);
            break;
        case FWD_QKV: fwd__qkv_row(a, t); break;
        case FWD_MLA_QKV:
            fwd__mla_row(a, t);
            break;
        case FWD_DSA_SELECT:
            fwd__dsa_select(
                a, t, c->scores + (size_t)ith * (size_t)(m->hp.idx_heads + 1) * (size_t)c->max_ctx);
            break;
        case FWD_ATTN_GATE: {
            const int64_t n = (int64_t)m->hp.n_head * m->hp.head_dim;
            float *o = c->att + (size_t)t * (size_t)n;
            const float *gt = c->gate + (size_t)t * (size_t)n;
            for (int64_t i = 0; i < n; i++)
                o[i] /= 1.0f + expf(-gt[i]);
            break;
        }
        case FWD_PLE_IN: { // model.h's gemma4 comment, in llama.cpp's order of operations
            const int64_t PL = m->hp.n_embd_pl, NL = m->hp.n_layer;
            float *p = c->ple + (size_t)t * (size_t)(NL * PL), *sel = c->ple_sel + ith * PL;
            const model__mat *w = &m->ple_tok;
            const float s_in = 1.0f / sqrtf((float)E), s_sel = sqrtf((float)PL),
                        s_out = 1.0f / sqrtf(2.0f);
            uint64_t off = 0;
            for (int64_t l = 0; l < NL; l++, p += PL) {
                for (int64_t i = 0; i < PL; i++)
                    p[i] *= s_in;
                c->kv->rmsnorm(PL, p, m->ple_in_norm, m->hp.norm_eps, p);
                // layer l's part of the token's row: whole blocks (load checked n_embd_pl)
                KS_ASSERT(ks_dtype_row_bytes(w->type, (uint64_t)(l * PL), &off));
                kern_dequantize_row(w->type,
                                    (const char *)w->data +
                                        (size_t)a->b->tokens[t] * w->row_bytes + off,
                                    sel, PL);
                for (int64_t i = 0; i < PL; i++)
                    p[i] = (p[i] + sel[i] * s_sel) * s_out;
            }
            break;
        }
        case FWD_G4_MOE_IN: { // llama.cpp's order of operations (model_int.h)
            const model__layer *L = &m->layers[a->layer];
            float *o = c->tmp + xo;
            c->kv->rmsnorm(E, o, L->moe_post_norm1, m->hp.norm_eps, c->tmp2 + xo);
            c->kv->rmsnorm(E, c->x + xo, L->moe_pre_norm, m->hp.norm_eps, c->xn + xo);
            c->kv->rmsnorm(E, c->x + xo, m->ones, m->hp.norm_eps, o); // ones: exact
            const float inv = 1.0f / sqrtf((float)E);
            for (int64_t i = 0; i < E; i++)
                o[i] = o[i] * inv * L->gate_inp_s[i];
            break;
        }
        case FWD_G4_MOE_OUT: {
            const model__layer *L = &m->layers[a->layer];
            float *o = c->tmp + xo;
            c->kv->rmsnorm(E, o, L->moe_post_norm2, m->hp.norm_eps, o);
            for (int64_t i = 0; i < E; i++)
                o[i] = c->tmp2[xo + (size_t)i] + o[i];
            break;
        }
        case FWD_PLE_GATE: {
            const int64_t PL = m->hp.n_embd_pl;
            float *g = c->g + (size_t)t * (size_t)PL;
            c->kv->gelu_mul(PL, g,
                            c->ple + (size_t)t * (size_t)(m->hp.n_layer * PL) +
                                (size_t)a->layer * (size_t)PL,
                            g);
            break;
        }
        case FWD_MLA_QNORM: {
            float *r = c->mla_qa + (size_t)t * (size_t)m->hp.q_lora;
            c->kv->rmsnorm(m->hp.q_lora, r, a->w, m->hp.norm_eps, r);
            break;
        }
        case FWD_SWIGLU:
        case FWD_GEGLU:
        case FWD_RELU2: {
            // row t, or part t of the one row: [e0, e0 + ne)
            const int64_t e0 = a->part ? t * a->part : 0,
                          ne = a->part ? (F - e0 < a->part ? F - e0 : a->part) : F;
            float *g = c->g + (a->part ? 0 : (size_t)t * (size_t)F) + e0;
            const float *u = c->u + (a->part ? 0 : (size_t)t * (size_t)F) + e0;
            if (a->op == FWD_SWIGLU)
                c->kv->silu_mul(ne, g, u, g);
            else if (a->op == FWD_GEGLU)
                c->kv->gelu_mul(ne, g, u, g);
            else
                for (int64_t i = 0; i < ne; i++)
                    g[i] = g[i] > 0.0f ? g[i] * g[i] : 0.0f;
            if (a->part && a->qfn) { // whole blocks: the bytes the row's quantization writes there
                uint64_t off = 0;
                KS_ASSERT(ks_dtype_row_bytes(a->qtype, (uint64_t)e0, &off));
                a->qfn(g, (char *)a->qdst + off, ne);
                continue;
            }
            break;
        }
        case FWD_SWIGLU_OAI: {
            // g, u: (rows, F) in expert order; the biases (n_expert, F)
            const model__layer *L = &m->layers[a->layer];
            const int ex = c->row_exp[t];
            float *g = c->g + (size_t)t * (size_t)F;
            const float *u = c->u + (size_t)t * (size_t)F;
            const float *gb = L->gate_exps_b + (size_t)ex * (size_t)F,
                        *ub = L->up_exps_b + (size_t)ex * (size_t)F;
            const float al = m->hp.swiglu_alpha, lim = m->hp.swiglu_limit;
            for (int64_t i = 0; i < F; i++) { // ggml's swiglu_oai: the gate clamped above,
                const float x = fminf(g[i] + gb[i], lim); // the up value both ways
                const float y = fmaxf(fminf(u[i] + ub[i], lim), -lim);
                g[i] = x / (1.0f + expf(al * (-x))) * (y + 1.0f);
            }
            break;
        }
        case FWD_MOE_GATHER:
            memcpy(c->xe + (size_t)t * (size_t)E, c->xn + (size_t)c->row_tok[t] * (size_t)E,
                   sizeof(float) * (size_t)E);
            break;
        case FWD_MOE_COMBINE: {
            // slots in selection order, the same for a token whatever the batch
            const int KX = m->hp.n_expert_used;
            float *y = c->tmp + (size_t)t * (size_t)E;
            const int32_t *rows = c->slot_row + (size_t)t * (size_t)KX;
            const float *wt = c->sel_w + (size_t)t * (size_t)KX;
            const float *db = m->layers[a->layer].down_exps_b; // gpt-oss: (n_expert, E)
            if (db) { // each expert's output with its bias, then weighted (llama.cpp's order)
                const int32_t *sel = c->sel + (size_t)t * (size_t)KX;
                for (int j = 0; j < KX; j++) {
                    const float *xr = c->xe + (size_t)rows[j] * (size_t)E,
                                *br = db + (size_t)sel[j] * (size_t)E;
                    if (j == 0)
                        for (int64_t i = 0; i < E; i++)
                            y[i] = wt[0] * (xr[i] + br[i]);
                    else
                        for (int64_t i = 0; i < E; i++)
                            y[i] += wt[j] * (xr[i] + br[i]);
                }
            } else if (m->layers[a->layer].down_exps_s) { // gemma4: (out * s[e]) * weight
                const float *ds = m->layers[a->layer].down_exps_s;
                const int32_t *sel = c->sel + (size_t)t * (size_t)KX;
                for (int j = 0; j < KX; j++) {
                    const float *xr = c->xe + (size_t)rows[j] * (size_t)E;
                    const float s = ds[sel[j]];
                    if (j == 0)
                        for (int64_t i = 0; i < E; i++)
                            y[i] = xr[i] * s * wt[0];
                    else
                        for (int64_t i = 0; i < E; i++)
                            y[i] += xr[i] * s * wt[j];
                }
            } else {
                for (int64_t i = 0; i < E; i++)
                    y[i] = wt[0] * c->xe[(size_t)rows[0] * (size_t)E + (size_t)i];
                for (int j = 1; j < KX; j++) {
                    const float *xr = c->xe + (size_t)rows[j] * (size_t)E;
                    for (int64_t i = 0; i < E; i++)
                        y[i] += wt[j] * xr[i];
                }
            }
            if (c->sh_row0 >= 0) { // as llama.cpp adds it: routed sum + shared
                const float *xr = c->xe + (size_t)(c->sh_row0 + t) * (size_t)E;
                const float *sg = m->layers[a->layer].shexp_gate;
                if (sg) { // qwen35moe: weighted by sigmoid(gate . x), x the FFN's input row
                    const float w =
                        1.0f / (1.0f + expf(-c->kv->dot_f32(E, c->xn + (size_t)t * (size_t)E, sg)));
                    for (int64_t i = 0; i < E; i++)
                        y[i] += w * xr[i];
                } else {
                    for (int64_t i = 0; i < E; i++)
                        y[i] += xr[i];
                }
            }
            break;
        }
        }
        if (a->qfn)
            a->qfn(a->qsrc + (size_t)t * (size_t)a->qK, (char *)a->qdst + (size_t)t * a->qrb,
                   a->qK);
    }
    model__idle_prefetch(c, ith, nth, &a->left);
}

/* Runs op over n rows (tokens, or (token, expert) rows) of layer `layer`;
 * ff is FWD_SWIGLU's row length. */
static void fwd__rows_run_n(model_ctx *c, const model_batch *b, fwd__rowop op, int n, int64_t ff,
                            int layer) {
    fwd__rows a = {.c = c, .b = b, .op = op, .n = n, .ff = ff, .layer = layer};
    atomic_init(&a.next, 0);
    atomic_init(&a.left, a.n);
    ks_pool_run(c->threads, fwd__rows_task, &a);
}

/* Runs row op `op` over every token of the batch (w, w2: its norm weights;
 * tb: FWD_ADD_NORM's bias of the sublayer output, or NULL).
 * An op that writes a matmul input (xn: the norms; g: SwiGLU, GeGLU)
 * empties the act cache; with qw (that input's next weight, not read as
 * F32), it fills qw's slot in the same run: one pool run fewer per matmul,
 * and the same bytes model__act would write. */
static void fwd__rows_run3(model_ctx *c, const model_batch *b, fwd__rowop op, const float *w,
                           const float *w2, const float *tb, float xs, int layer,
                           const model__mat *qw) {
    const model__layer *L = &c->m->layers[layer];
    fwd__rows a = {.c = c,
                   .b = b,
                   .op = op,
                   .w = w,
                   .w2 = w2,
                   .tb = tb,
                   .xs = xs,
                   .layer = layer,
                   .n = b->n_tokens,
                   // the layer's FFN width (gemma4's may differ per layer)
                   .ff = L->w_gate.data ? L->w_gate.N : c->m->hp.n_ff};
    const bool to_xn = (op == FWD_NORM || op == FWD_ADD_NORM || op == FWD_POST_ADD_NORM) && w,
               to_g = op == FWD_SWIGLU || op == FWD_GEGLU || op == FWD_RELU2;
    KS_ASSERT(!qw || to_xn || to_g);
    int slot = -1;
    if (qw && kern_act_type(qw->type) != KS_DTYPE_F32) {
        slot = model__act_slot(c, qw, &a.qrb);
        a.qtype = kern_act_type(qw->type);
        a.qfn = c->kv->quantize_act[a.qtype];
        a.qsrc = to_xn ? c->xn : c->g;
        a.qK = qw->K;
        a.qdst = c->act[slot].buf;
        KS_ASSERT(a.qfn && a.qK == (to_xn ? c->m->hp.n_embd : a.ff));
    }
    const int nth = ks_pool_nth(c->threads);
    if (to_g && a.n == 1 && nth > 1) {
        // one token: the row cut into a part per thread at super-block
        // boundaries (each quantization block whole; elementwise, so the
        // values are the one-thread pass's bit for bit). Alone, the caller
        // pulled the half of g or u the other thread wrote while that one
        // waited: 6-8 us a layer in a Q4_0 timing build, ~0.5% of a token
        // (2026-12-04)
        a.part = ((a.ff + nth - 1) / nth + 255) / 256 * 256;
        a.n = (int)((a.ff + a.part - 1) / a.part);
    }
    atomic_init(&a.next, 0);
    atomic_init(&a.left, a.n);
    model__run_rows(c, a.n, fwd__rows_task, &a);
    if (to_xn || to_g) model__act_reset(c);
    if (slot >= 0) {
        c->act[slot].src = a.qsrc;
        c->act[slot].K = a.qK;
    }
}

/* fwd__rows_run3 without a bias. */
static void fwd__rows_run2(model_ctx *c, const model_batch *b, fwd__rowop op, const float *w,
                           const float *w2, int layer, const model__mat *qw) {
    fwd__rows_run3(c, b, op, w, w2, NULL, 1.0f, layer, qw);
}

/* Runs op over the batch's tokens (w: the norm weight, layer: FWD_QKV's). */
static void fwd__rows_run(model_ctx *c, const model_batch *b, fwd__rowop op, const float *w,
                          int layer) {
    fwd__rows_run2(c, b, op, w, NULL, layer, NULL);
}

/* A decode step's indexer scan with fewer tokens than threads: each
 * token's positions are cut into page-aligned chunks that any thread scores
 * into dsa_score[t] (phase 0), then one thread per token keeps its top_k
 * (phase 1). The scores are the one-thread path's (fwd__dsa_score), so the
 * selection is too, whatever the thread count. */
typedef struct {
    model_ctx *c;
    const model_batch *b;
    int phase;
    int nch;           // chunks per token (of the longest context)
    uint32_t chunk;    // positions per chunk, a multiple of page_tokens
    atomic_llong next; // next (token, chunk) or token to claim
} fwd__dsa_split;

static void fwd__dsa_split_task(void *arg, int ith, int nth) {
    fwd__dsa_split *a = arg;
    model_ctx *c = a->c;
    const size_t S = (size_t)c->max_ctx;
    const int nu = a->phase ? 1 : a->nch;
    (void)nth;
    int64_t u0, u1;
    while (ks_pool_claim(&a->next, (int64_t)a->b->n_tokens * nu, 1, &u0, &u1))
        for (int64_t u = u0; u < u1; u++) {
            const int t = (int)(u / nu);
            float *score = c->dsa_score + (size_t)t * S;
            if (a->phase) {
                c->dsa_n[t] = 0;
                if (fwd__dsa_sparse(c, a->b, t)) fwd__dsa_topk(c, a->b, t, score);
                continue;
            }
            const uint32_t n_ctx = (uint32_t)a->b->pos[t] + 1, j0 = (uint32_t)(u % nu) * a->chunk;
            if (j0 >= n_ctx || !fwd__dsa_sparse(c, a->b, t)) continue;
            const uint32_t j1 = n_ctx - j0 < a->chunk ? n_ctx : j0 + a->chunk;
            fwd__dsa_score(c, a->b, t, j0, j1,
                           c->scores + (size_t)ith * (size_t)(c->m->hp.idx_heads + 1) * S, score);
        }
}

/* The sparse-attention selection of every token of the batch (dsa_sel,
 * dsa_n): one thread per token, or split by positions in a decode step. */
static void fwd__dsa_run(model_ctx *c, const model_batch *b, int layer) {
    const int nth = ks_pool_nth(c->threads), T = b->n_tokens;
    if (T >= nth) {
        fwd__rows_run(c, b, FWD_DSA_SELECT, NULL, layer);
        return;
    }
    const uint32_t P = (uint32_t)kv_pool_geom(c->pool)->page_tokens;
    uint32_t n_max = 1;
    for (int t = 0; t < T; t++)
        if ((uint32_t)b->pos[t] + 1 > n_max) n_max = (uint32_t)b->pos[t] + 1;
    fwd__dsa_split a = {.c = c, .b = b, .nch = (2 * nth + T - 1) / T};
    a.chunk = ((n_max + (uint32_t)a.nch - 1) / (uint32_t)a.nch + P - 1) / P * P;
    for (a.phase = 0; a.phase < 2; a.phase++) {
        atomic_init(&a.next, 0);
        ks_pool_run(c->threads, fwd__dsa_split_task, &a);
    }
}

/* The residual add after a sublayer whose output is in tmp (plus bias tb,
 * gpt-oss's attn_output.bias; NULL: none), the sum times xs (gemma4's
 * layer_output_scale; 1: none), then the next norm: gemma first normalizes
 * the sublayer output (post_norm). qw: the first weight to read the normed
 * rows (NULL: not known here). */
static void fwd__residual(model_ctx *c, const model_batch *b, const float *post_norm,
                          const float *tb, float xs, const float *next_norm, int layer,
                          const model__mat *qw) {
    KS_ASSERT(!(post_norm && tb)); // no architecture has both
    fwd__rows_run3(c, b, post_norm ? FWD_POST_ADD_NORM : FWD_ADD_NORM, next_norm, post_norm, tb,
                   xs, layer, qw);
}

// ----------------------------------------------------------------------------
// Mixture of experts: route each token to its top-k experts, run every
// expert once over the rows routed to it (rows grouped by expert), and sum
// each token's expert outputs in its own selection order. A token's values
// depend only on its own row: matmul rows are batch-invariant (kern.h) and
// the routing and the sum are per token.

/* Routes the T tokens from their router logits (c->router): selection,
 * weights, and the rows in expert order. A token picks the k experts of
 * highest probability (softmax or sigmoid of the logits) plus, where layer L
 * has one, the expert's selection bias (glm4moe's exp_probs_b, DeepSeek-V3's
 * "noaux" balancing); the weights are the probabilities without the bias,
 * renormalized (expert_norm: divided by their sum, at least 2^-14 as
 * llama.cpp clamps it) and multiplied by expert_scale. gpt-oss adds the
 * router's bias to the logits, picks the k largest logits and weights them
 * by a softmax over those k (MODEL_GATING_SOFTMAX_WEIGHT). The shared
 * expert's rows (n_expert_shared) follow the routed ones, in token order.
 * Serial: O(T * n_expert). */
static void fwd__route(model_ctx *c, const model__layer *L, int T) {
    const model_hparams *hp = &c->m->hp;
    const int NX = hp->n_expert, KX = hp->n_expert_used;
    const float *bias = L->exp_probs_b;
    int32_t *fill = c->x_off + NX + 1; // (n_expert) rows placed so far
    memset(c->x_off, 0, sizeof(int32_t) * (size_t)(2 * NX + 1));
    for (int t = 0; t < T; t++) {
        float *p = c->router + (size_t)t * (size_t)NX;
        if (L->gate_inp_b) // gpt-oss: the router's bias joins the logits
            for (int e = 0; e < NX; e++)
                p[e] += L->gate_inp_b[e];
        if (hp->gating == MODEL_GATING_SOFTMAX)
            c->kv->softmax(NX, p);
        else if (hp->gating == MODEL_GATING_SIGMOID)
            for (int e = 0; e < NX; e++)
                p[e] = 1.0f / (1.0f + expf(-p[e]));
        // MODEL_GATING_SOFTMAX_WEIGHT: the top-k of the logits themselves
        int32_t *sel = c->sel + (size_t)t * (size_t)KX;
        float *w = c->sel_w + (size_t)t * (size_t)KX;
        float sum = 0.0f;
        // expert groups: only the n_group_used groups whose two best biased
        // scores sum highest may be picked (ties go to the lower group)
        bool shut[MODEL_MAX_EXPERT_GROUPS] = {false};
        const int NG = hp->n_expert_groups, GS = NG ? NX / NG : 0;
        if (NG) {
            float gs[MODEL_MAX_EXPERT_GROUPS];
            for (int g = 0; g < NG; g++) {
                float b1 = -INFINITY, b2 = -INFINITY;
                for (int e = g * GS; e < (g + 1) * GS; e++) {
                    const float v = bias ? p[e] + bias[e] : p[e];
                    if (v > b1)
                        b2 = b1, b1 = v;
                    else if (v > b2)
                        b2 = v;
                }
                gs[g] = b1 + b2;
                shut[g] = true;
            }
            for (int k = 0; k < hp->n_group_used; k++) {
                int best = -1;
                for (int g = 0; g < NG; g++)
                    if (shut[g] && (best < 0 || gs[g] > gs[best])) best = g;
                shut[best] = false;
                gs[best] = -INFINITY;
            }
        }
        for (int j = 0; j < KX; j++) { // top-k by repeated argmax; ties go to the lower index
            int best = -1;
            float best_s = 0.0f;
            for (int e = 0; e < NX; e++) {
                bool taken = NG && shut[e / GS];
                for (int i = 0; i < j; i++)
                    taken |= sel[i] == e;
                const float s = bias ? p[e] + bias[e] : p[e];
                if (!taken && (best < 0 || s > best_s)) best = e, best_s = s;
            }
            sel[j] = best;
            w[j] = p[best];
            sum += w[j];
            c->x_off[best + 1]++;
        }
        if (hp->gating == MODEL_GATING_SOFTMAX_WEIGHT) { // softmax over the k chosen logits
            // (the first is the largest: top-k is in descending order)
            const float mx = w[0];
            double z = 0.0;
            for (int j = 0; j < KX; j++)
                z += (double)(w[j] = expf(w[j] - mx));
            const float inv = (float)(1.0 / z);
            for (int j = 0; j < KX; j++)
                w[j] *= inv;
            continue;
        }
        if (sum < 6.103515625e-5f) sum = 6.103515625e-5f; // llama.cpp's clamp (smallest f16 normal)
        for (int j = 0; j < KX; j++)
            w[j] = (hp->expert_norm ? w[j] / sum : w[j]) * hp->expert_scale;
    }
    for (int e = 0; e < NX; e++)
        c->x_off[e + 1] += c->x_off[e];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < KX; j++) {
            const int e = c->sel[(size_t)t * (size_t)KX + (size_t)j];
            const int32_t r = c->x_off[e] + fill[e]++;
            c->slot_row[(size_t)t * (size_t)KX + (size_t)j] = r;
            c->row_tok[r] = t;
            c->row_exp[r] = e;
        }
    c->sh_row0 = L->gate_sh.data ? T * KX : -1;
    for (int t = 0; c->sh_row0 >= 0 && t < T; t++) {
        c->row_tok[c->sh_row0 + t] = t;
        c->row_exp[c->sh_row0 + t] = -1;
    }
}

/* The MoE feed-forward block of layer L: xn (T, E) in (the router reads
 * rin, (T, E): xn but for gemma4), tmp (T, E) out. The
 * shared experts (where L has them: S of them stored as one FFN of S * FX)
 * are one more expert whose rows are every token's, run in the same pool
 * runs as the routed ones; its gate/up output for token t is S rows of FX
 * in g/u from row R + S*t, which SwiGLU treats as rows like any other. */
static void fwd__moe(model_ctx *c, const model_batch *b, const model__layer *L, int il,
                     const float *rin) {
    const model_hparams *hp = &c->m->hp;
    const int T = b->n_tokens, NX = hp->n_expert, R = T * hp->n_expert_used;
    const int64_t E = hp->n_embd, FX = hp->n_ff_exp;
    model__matmul(c, &L->gate_inp, rin, T, c->router);
    fwd__route(c, L, T);
    const int RS = c->sh_row0 >= 0 ? R + T : R; // rows: routed, then shared
    const int S = hp->n_expert_shared, RG = c->sh_row0 >= 0 ? R + S * T : R; // FX-wide rows
    fwd__rows_run_n(c, b, FWD_MOE_GATHER, RS, 0, il);
    model__act_reset(c); // xe and g hold new rows
    int n = 0;
    for (int e = 0; e <= NX; e++) { // e == NX: the shared expert
        const bool sh = e == NX;
        if (sh && c->sh_row0 < 0) break;
        const int r0 = sh ? R : c->x_off[e], rows = sh ? T : c->x_off[e + 1] - c->x_off[e];
        if (!rows) continue;
        const model__mat *ws[2] = {sh ? &L->gate_sh : &L->gate_exps[e],
                                   sh ? &L->up_sh : &L->up_exps[e]};
        float *ys[2] = {c->g, c->u};
        for (int i = 0; i < 2; i++) {
            model__mm_part *p = &c->parts[n++];
            *p = (model__mm_part){.w = ws[i], .T = rows, .Y = ys[i] + (size_t)r0 * (size_t)FX};
            model__act(c, ws[i], c->xe, RS, &p->X, &p->x_stride);
            p->X = (const char *)p->X + (size_t)r0 * p->x_stride;
        }
    }
    model__mm_run(c, c->parts, n);
    // gpt-oss: the experts' biases and the clamped SwiGLU (it has no shared expert)
    fwd__rows_run_n(c, b,
                    hp->swiglu_alpha > 0.0f ? FWD_SWIGLU_OAI
                    : hp->ffn_gelu          ? FWD_GEGLU // gemma4's experts
                                            : FWD_SWIGLU,
                    RG, FX, il);
    n = 0;
    for (int e = 0; e <= NX; e++) {
        const bool sh = e == NX;
        if (sh && (c->sh_row0 < 0 || S > 1)) break; // S > 1: its own run below
        const int r0 = sh ? R : c->x_off[e], rows = sh ? T : c->x_off[e + 1] - c->x_off[e];
        if (!rows) continue;
        model__mm_part *p = &c->parts[n++];
        *p = (model__mm_part){.w = sh ? &L->down_sh : &L->down_exps[e],
                              .T = rows,
                              .Y = c->xe + (size_t)r0 * (size_t)E};
        model__act(c, p->w, c->g, RS, &p->X, &p->x_stride);
        p->X = (const char *)p->X + (size_t)r0 * p->x_stride;
    }
    model__mm_run(c, c->parts, n);
    if (c->sh_row0 >= 0 && S > 1) { // its K is S * FX: an activation quantization of its own
        model__act_reset(c);
        model__matmul(c, &L->down_sh, c->g + (size_t)R * (size_t)FX, T,
                      c->xe + (size_t)R * (size_t)E);
    }
    model__act_reset(c);
    fwd__rows_run(c, b, FWD_MOE_COMBINE, NULL, il);
}

// ----------------------------------------------------------------------------
// Multi-head latent attention (deepseek2), absorbed: a head's query moves into
// the latent space (wk_b), attention runs as one KV head of [latent | rope
// key] rows with V the latent, and the output leaves it through wv_b.

/* p reads head h's rows of X, a (T*H, w->K) matrix of T tokens' H heads:
 * one quantization of all rows, then every H-th row from h. */
static void fwd__act_head(model_ctx *c, model__mm_part *p, const float *X, int T, int H, int h) {
    const void *xa;
    size_t st;
    model__act(c, p->w, X, T * H, &xa, &st);
    p->X = (const char *)xa + (size_t)h * st;
    p->x_stride = (size_t)H * st;
    p->T = T;
}

/* Layer L's queries (absorbed, into q) and KV rows (into the pages), from xn. */
static void fwd__mla_in(model_ctx *c, const model_batch *b, const model__layer *L, int il) {
    const model_hparams *hp = &c->m->hp;
    const int T = b->n_tokens, H = hp->n_head, D = hp->head_dim;
    if (hp->q_lora) { // with the indexer: its key and head weights from xn, queries from qa
        const model__mat *ws[] = {&L->wq_a, &L->wkv_a, &L->idx_k, &L->idx_proj};
        float *const ys[] = {c->mla_qa, c->k, c->dsa_k, c->dsa_w};
        model__matmuls(c, hp->idx_topk ? 4 : 2, ws, c->xn, T, ys);
        fwd__rows_run(c, b, FWD_MLA_QNORM, L->q_a_norm, il);
        const model__mat *wb[] = {&L->wq_b, &L->idx_q_b};
        float *const yb[] = {c->mla_qf, c->dsa_q};
        model__matmuls(c, hp->idx_topk ? 2 : 1, wb, c->mla_qa, T, yb);
    } else {
        const model__mat *ws[] = {&L->wq, &L->wkv_a};
        float *const ys[] = {c->mla_qf, c->k};
        model__matmuls(c, 2, ws, c->xn, T, ys);
    }
    fwd__rows_run(c, b, FWD_MLA_QKV, NULL, il);
    for (int h = 0; h < H; h++) { // q[t][h*D .. + kv_lora] = wk_b[h] q_nope[t][h]
        model__mm_part *p = &c->parts[h];
        *p = (model__mm_part){
            .w = &L->wk_b[h], .Y = c->q + (size_t)h * (size_t)D, .ldy = (size_t)(H * D)};
        fwd__act_head(c, p, c->mla_qn, T, H, h);
    }
    model__mm_run(c, c->parts, H);
}

/* The attention output (att: T tokens' H latent vectors) through each
 * head's wv_b, then attn_output, into tmp. */
static void fwd__mla_out(model_ctx *c, const model_batch *b, const model__layer *L) {
    const model_hparams *hp = &c->m->hp;
    const int T = b->n_tokens, H = hp->n_head, HV = H * hp->mla_v;
    float *o = c->xn; // (T, H * mla_v): xn is free until the residual add rewrites it
    for (int h = 0; h < H; h++) {
        model__mm_part *p = &c->parts[h];
        *p = (model__mm_part){
            .w = &L->wv_b[h], .Y = o + (size_t)h * (size_t)hp->mla_v, .ldy = (size_t)HV};
        fwd__act_head(c, p, c->att, T, H, h);
    }
    model__mm_run(c, c->parts, H);
    model__act_reset(c); // xn now holds other values
    model__matmul(c, &L->wo, o, T, c->tmp);
}

// ----------------------------------------------------------------------------
// Attention's page tables (the attention itself: attn.c)

/* Resolves every page each sequence of the batch reads at this layer,
 * through kv's tag/state check (I1), once per layer per pass. A sequence
 * whose table fails the check is marked bad and skipped from here on. */
static void fwd__resolve(model_ctx *c, const model_batch *b, int layer) {
    for (int s = 0; s < b->n_seqs; s++) {
        if (c->seq_first[s] < 0 || atomic_load_explicit(&c->seq_bad[s], memory_order_relaxed))
            continue;
        size_t off = (size_t)s * (size_t)c->max_pages;
        if (kv_seq_span_read_all(c->pool, b->seqs[s], layer, (uint32_t)c->seq_next[s], c->kp + off,
                                 c->vp + off) != KS_OK)
            atomic_store(&c->seq_bad[s], 1);  // I1: never yields tokens
    }
}

// ----------------------------------------------------------------------------
// Final logit soft-capping (gemma): x = c * tanh(x / c), row by row

typedef struct {
    float *x;  // (rows, n) logits
    int64_t n; // V
    int32_t rows;
    float cap;
    atomic_llong next; // next row to claim
} fwd__softcap;

static void fwd__softcap_task(void *arg, int ith, int nth) {
    fwd__softcap *a = arg;
    const float inv = 1.0f / a->cap; // as llama.cpp: x * (1/c), tanh, * c
    (void)ith, (void)nth;
    int64_t r0, r1;
    while (ks_pool_claim(&a->next, a->rows, 1, &r0, &r1))
        for (float *x = a->x + r0 * a->n, *e = a->x + r1 * a->n; x < e; x++)
            *x = tanhf(*x * inv) * a->cap;
}

// ----------------------------------------------------------------------------
// The pass

static ks_err fwd__validate(model_ctx *c, const model_batch *b, const model_hidden *h,
                            ks_errbuf *eb) {
    const model_hparams *hp = &c->m->hp;
    if (b->n_tokens < 1 || b->n_tokens > c->max_tokens)
        return ks_seterr(eb, KS_ERR_INVAL, "batch of %d tokens (context allows 1..%d)", b->n_tokens,
                         c->max_tokens);
    if (b->n_out < 0 || b->n_out > b->n_tokens)
        return ks_seterr(eb, KS_ERR_INVAL, "batch asks for %d logit rows of %d tokens", b->n_out,
                         b->n_tokens);
    if (b->n_seqs < 1 || b->n_seqs > c->max_tokens)
        return ks_seterr(eb, KS_ERR_INVAL, "batch has %d sequences", b->n_seqs);
    const uint32_t P = (uint32_t)kv_pool_geom(c->pool)->page_tokens;
    for (int s = 0; s < b->n_seqs; s++) {
        c->seq_next[s] = (int32_t)b->seqs[s]->n_tokens;
        c->seq_first[s] = -1;
    }
    int n_out = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        int s = b->seq[t];
        if (s < 0 || s >= b->n_seqs)
            return ks_seterr(eb, KS_ERR_INVAL, "token %d: sequence index %d out of range", t, s);
        if (b->tokens[t] < 0 || b->tokens[t] >= hp->n_vocab)
            return ks_seterr(eb, KS_ERR_INVAL, "token %d: id %d out of range [0, %d)", t,
                             b->tokens[t], hp->n_vocab);
        // positions of a sequence must continue where its KV ends, in order:
        // attention never reads a position that has not been written
        if (b->pos[t] != c->seq_next[s] || b->pos[t] >= c->max_ctx)
            return ks_seterr(eb, KS_ERR_INVAL, "token %d: position %d (sequence expects %d, context %d)",
                             t, b->pos[t], c->seq_next[s], c->max_ctx);
        if ((uint32_t)b->pos[t] / P >= b->seqs[s]->n_pages)
            return ks_seterr(eb, KS_ERR_INVAL, "token %d: position %d has no reserved page", t, b->pos[t]);
        if (c->seq_first[s] < 0) c->seq_first[s] = c->seq_next[s];
        c->seq_next[s]++;
        if (b->out_row[t] >= 0) {
            if (b->out_row[t] >= b->n_out)
                return ks_seterr(eb, KS_ERR_INVAL, "token %d: logits row %d >= %d", t, b->out_row[t],
                                 b->n_out);
            n_out++;
        }
    }
    if (n_out != b->n_out)
        return ks_seterr(eb, KS_ERR_INVAL, "batch asks for %d logit rows but marks %d", b->n_out, n_out);
    if (!h) return KS_OK;
    if (h->n_rows < 0 || h->n_rows > b->n_tokens || !h->row || (h->n_rows > 0 && !h->out))
        return ks_seterr(eb, KS_ERR_INVAL, "batch asks for %d hidden rows of %d tokens", h->n_rows,
                         b->n_tokens);
    int n_hid = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        if (h->row[t] < 0) continue;
        if (h->row[t] >= h->n_rows)
            return ks_seterr(eb, KS_ERR_INVAL, "token %d: hidden row %d >= %d", t, h->row[t],
                             h->n_rows);
        n_hid++;
    }
    if (n_hid != h->n_rows)
        return ks_seterr(eb, KS_ERR_INVAL, "batch asks for %d hidden rows but marks %d", h->n_rows,
                         n_hid);
    return KS_OK;
}

ks_err model_forward(model_ctx *c, const model_batch *b, float *logits, ks_errbuf *eb) {
    return model_forward_hidden(c, b, logits, NULL, eb);
}

/* The first weight layer L's attention block reads xn with (NULL for MLA,
 * whose first matmuls fwd__mla_in runs). */
static const model__mat *fwd__first_w(const model_ctx *c, const model__layer *L) {
    if (L->ffn_only) return &L->w_up; // nemotron_h's MLP layer
    return L->recurrent ? &L->ssm_qkv : c->m->hp.kv_lora ? NULL : &L->wq;
}

ks_err model_forward_mtp(model_ctx *c, const model_batch *b, const float *h_in, float *logits,
                         const model_hidden *h, ks_errbuf *eb) {
    if (!c->m->mtp_eh.data || !h_in)
        return ks_seterr(eb, KS_ERR_INVAL, "a NextN pass needs a NextN head and its hidden rows");
    c->mtp_in = h_in;
    ks_err e = model_forward_hidden(c, b, logits, h, eb);
    c->mtp_in = NULL;
    return e;
}

ks_err model_forward_hidden(model_ctx *c, const model_batch *b, float *logits,
                            const model_hidden *h, ks_errbuf *eb) {
    if (c->m->mtp_eh.data && !c->mtp_in)
        return ks_seterr(eb, KS_ERR_INVAL, "a NextN head runs by model_forward_mtp");
    ks_err e = fwd__validate(c, b, h, eb);
    if (!e) e = model__lora_begin(c, b, eb); // model__matmuls adds the adapters' deltas
    if (e) return e;
    const model *m = c->m;
    const model_hparams *hp = &m->hp;
    if (hp->encoder) return model__bert_forward(c, b, h, eb);
    const int T = b->n_tokens;
    const int64_t E = hp->n_embd;
    for (int s = 0; s < b->n_seqs; s++) atomic_store_explicit(&c->seq_bad[s], 0, memory_order_relaxed);
    c->pf_i = T == 1 ? 0 : -1;
    model__act_reset(c);
    if (m->mtp_eh.data) { // a NextN head: x = eh_proj [enorm(embedding) | hnorm(hidden)]
        fwd__rows_run(c, b, FWD_MTP_IN, NULL, 0);
        model__matmul(c, &m->mtp_eh, c->mtp_cat, T, c->x);
        model__act_reset(c);
    } else {
        fwd__rows_run(c, b, FWD_EMBED, NULL, 0);
    }
    if (m->ple_in.data) { // gemma4: every layer's per-layer input, from the scaled embedding
        model__matmul(c, &m->ple_in, c->x, T, c->ple);
        fwd__rows_run(c, b, FWD_PLE_IN, NULL, 0);
    }
    if (hp->ssm_state) { // hybrid: each sequence's state pages, checked once (I1)
        model__order_tokens(c, b);
        (void)model__state_resolve(c, b);
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const model__layer *L = &m->layers[il];
        // attention block (the first norm; later ones are fused with the
        // residual add, and the quantization of xn for wq with both)
        if (il == 0) fwd__rows_run2(c, b, FWD_NORM, L->attn_norm, NULL, il, fwd__first_w(c, L));
        if (L->ffn_only) goto ffn_in; // nemotron_h's MLP layer: xn is its input
        if (L->recurrent) {
            if (L->mamba2)
                model__mamba2_layer(c, b, L);
            else
                model__gdn_layer(c, b, L);
            goto ffn;
        }
        if (hp->kv_lora) {
            fwd__mla_in(c, b, L, il);
        } else {
            const model__mat *qkv[] = {&L->wq, &L->wk, &L->wv};
            float *const qkv_out[] = {hp->attn_out_gate ? c->qg : c->q, c->k, c->v};
            // gemma4: V may be K's projection, and a shared KV layer has neither
            model__matmuls(c, L->wk.data ? L->wv.data ? 3 : 2 : 1, qkv, c->xn, T, qkv_out);
            fwd__rows_run(c, b, FWD_QKV, NULL, il);
        }
        if (L->kv_layer == 0) // rows of every layer at these positions are written before read
            for (int s = 0; s < b->n_seqs; s++)
                if (!atomic_load(&c->seq_bad[s]))
                    kv_seq_set_filled(c->pool, b->seqs[s], (uint32_t)c->seq_next[s]);
        fwd__resolve(c, b, L->kv_layer);
        if (hp->idx_topk) fwd__dsa_run(c, b, il);
        model__attn(c, b, il);
        if (hp->attn_out_gate) fwd__rows_run(c, b, FWD_ATTN_GATE, NULL, il);
        if (hp->kv_lora)
            fwd__mla_out(c, b, L);
        else
            model__matmul(c, &L->wo, c->att, T, c->tmp);
    ffn:
        if (L->no_ffn) goto next; // nemotron_h: the mixer was the layer
        fwd__residual(c, b, L->post_attn_norm, L->bo, 1.0f, L->ffn_norm, il,
                      L->gate_exps && !L->moe_post_norm1 ? NULL : &L->w_gate);
    ffn_in:
        // feed-forward block
        if (L->gate_exps && L->moe_post_norm1) { // gemma4: the dense FFN, then the experts
            const model__mat *gu[] = {&L->w_gate, &L->w_up};
            float *const gu_out[] = {c->g, c->u};
            model__matmuls(c, 2, gu, c->xn, T, gu_out);
            fwd__rows_run2(c, b, FWD_GEGLU, NULL, NULL, il, &L->w_down);
            model__matmul(c, &L->w_down, c->g, T, c->tmp);
            fwd__rows_run(c, b, FWD_G4_MOE_IN, NULL, il);
            model__act_reset(c); // xn and tmp hold new rows
            fwd__moe(c, b, L, il, c->tmp);
            fwd__rows_run(c, b, FWD_G4_MOE_OUT, NULL, il);
        } else if (L->gate_exps) {
            fwd__moe(c, b, L, il, c->xn);
        } else if (!L->w_gate.data) { // nemotron_h: down(relu(up x)^2)
            model__matmul(c, &L->w_up, c->xn, T, c->g);
            fwd__rows_run2(c, b, FWD_RELU2, NULL, NULL, il, &L->w_down);
            model__matmul(c, &L->w_down, c->g, T, c->tmp);
        } else {
            const model__mat *gu[] = {&L->w_gate, &L->w_up};
            float *const gu_out[] = {c->g, c->u};
            model__matmuls(c, 2, gu, c->xn, T, gu_out);
            fwd__rows_run2(c, b, hp->ffn_gelu ? FWD_GEGLU : FWD_SWIGLU, NULL, NULL, il, &L->w_down);
            model__matmul(c, &L->w_down, c->g, T, c->tmp);
        }
    next:;
        const bool last = il + 1 == hp->n_layer;
        const float *post = L->post_ffn_norm;
        if (L->ple_gate.data) { // gemma4: the per-layer embedding joins after the FFN's add
            fwd__residual(c, b, post, NULL, 1.0f, NULL, il, NULL);
            model__act_reset(c); // x changed, and no norm run reset the cache
            model__matmul(c, &L->ple_gate, c->x, T, c->g);
            fwd__rows_run(c, b, FWD_PLE_GATE, NULL, il);
            model__act_reset(c);
            model__matmul(c, &L->ple_proj, c->g, T, c->tmp);
            post = L->ple_norm;
        }
        fwd__residual(c, b, post, NULL, L->out_scale ? L->out_scale[0] : 1.0f,
                      last ? m->output_norm : m->layers[il + 1].attn_norm,
                      il, last ? NULL : fwd__first_w(c, &m->layers[il + 1]));
    }
    int n_bad = 0, first_bad = -1;
    for (int s = 0; s < b->n_seqs; s++) {
        bool bad = atomic_load(&c->seq_bad[s]);
        if (b->seq_err) b->seq_err[s] = bad ? KS_ERR_INTERNAL : KS_OK;
        if (bad && n_bad++ == 0) first_bad = s;
    }
    if (n_bad && !b->seq_err)
        return ks_seterr(eb, KS_ERR_INTERNAL, "sequence %d: a block-table entry failed the page check",
                         first_bad);
    // hidden rows (embeddings): the normed final state, before the LM head;
    // a NextN head's: the block's output before shared_head_norm
    const float *hsrc = m->mtp_eh.data ? c->x : c->xn;
    for (int t = 0; h && h->n_rows > 0 && t < T; t++)
        if (h->row[t] >= 0)
            memcpy(h->out + (size_t)h->row[t] * (size_t)E, hsrc + (size_t)t * (size_t)E,
                   sizeof(float) * (size_t)E);
    if (b->n_out == 0) return KS_OK;
    // gather the normed rows that want logits, in output-row order (rows of a
    // failed sequence are computed but must not be used: seq_err says so)
    float *rows = c->tmp;  // (n_out, E); tmp is (T, E) and free now
    for (int t = 0; t < T; t++)
        if (b->out_row[t] >= 0)
            memcpy(rows + (size_t)b->out_row[t] * (size_t)E, c->xn + (size_t)t * (size_t)E,
                   sizeof(float) * (size_t)E);
    model__act_reset(c);
    model__matmul(c, &m->output, rows, b->n_out, logits);
    if (hp->final_softcap > 0.0f) {
        fwd__softcap a = {
            .x = logits, .n = hp->n_vocab, .rows = b->n_out, .cap = hp->final_softcap};
        atomic_init(&a.next, 0);
        ks_pool_run(c->threads, fwd__softcap_task, &a);
    }
    for (int32_t r = 0; r < b->n_out; r++) // gemma4's suppressed tokens (as llama.cpp: + -inf)
        for (int32_t i = 0; i < m->n_suppress; i++)
            logits[(size_t)r * (size_t)hp->n_vocab + (size_t)m->suppress[i]] = -INFINITY;
    return KS_OK;
}
