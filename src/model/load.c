/* load.c — binds the weight tensors of a GGUF model (its hyper-parameters:
 * load_hp.c).
 *
 * Everything comes from metadata (`<arch>.*` keys) and tensor shapes; every
 * tensor is checked for presence, shape and a supported type before any
 * pointer is taken, and errors name the file and the key or tensor. Weights
 * stay in the read-only mapping; only small vectors (norms, biases) stored
 * as F16/BF16 are converted to f32 copies. */
#include "model_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Tensors

static const gguf_tensor *load__tensor(model *m, const char *name, bool required, ks_errbuf *eb,
                                       ks_err *err) {
    const gguf_tensor *t = gguf_find_tensor(m->gguf, name);
    if (!t && required)
        *err = ks_seterr(eb, KS_ERR_FORMAT, "%s: missing tensor '%s'", gguf_path(m->gguf), name);
    return t;
}

/* Binds matrix `name` with ggml shape [K, N]. */
static ks_err load__mat(model *m, const char *name, int64_t K, int64_t N, model__mat *out,
                        ks_errbuf *eb) {
    ks_err e = KS_OK;
    const gguf_tensor *t = load__tensor(m, name, true, eb, &e);
    if (!t) return e;
    if (t->n_dims != 2 || t->ne[0] != K || t->ne[1] != N)
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]",
                         gguf_path(m->gguf), name, (long long)t->ne[0], (long long)t->ne[1],
                         t->n_dims, (long long)K, (long long)N);
    if (!kern_wtype_supported((ks_dtype)t->type))
        return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                         "%s: tensor '%s' has type %s, not supported (" KERN_WTYPES ")",
                         gguf_path(m->gguf), name, ks_dtype_name(t->type));
    out->data = t->data;
    out->type = (ks_dtype)t->type;
    out->K = K;
    out->N = N;
    out->row_bytes = (size_t)(t->n_bytes / (uint64_t)N);
    return KS_OK;
}

/* Binds the 3-D expert tensor `name`, ggml shape [K, N, n]: (*out)[e] is
 * expert e's [K, N] slice. */
static ks_err load__mat_experts(model *m, const char *name, int64_t K, int64_t N, int64_t n,
                                model__mat **out, ks_errbuf *eb) {
    ks_err e = KS_OK;
    const gguf_tensor *t = load__tensor(m, name, true, eb, &e);
    if (!t) return e;
    if (t->n_dims != 3 || t->ne[0] != K || t->ne[1] != N || t->ne[2] != n)
        return ks_seterr(eb, KS_ERR_FORMAT,
                         "%s: tensor '%s' has shape [%lld, %lld, %lld] (%u dims), expected [%lld, "
                         "%lld, %lld]",
                         gguf_path(m->gguf), name, (long long)t->ne[0], (long long)t->ne[1],
                         (long long)t->ne[2], t->n_dims, (long long)K, (long long)N, (long long)n);
    if (!kern_wtype_supported((ks_dtype)t->type))
        return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                         "%s: tensor '%s' has type %s, not supported (" KERN_WTYPES ")",
                         gguf_path(m->gguf), name, ks_dtype_name(t->type));
    *out = calloc((size_t)n, sizeof **out);
    if (!*out) return ks_seterr(eb, KS_ERR_NOMEM, "%s: tensor '%s'", gguf_path(m->gguf), name);
    const size_t row_bytes = (size_t)(t->n_bytes / (uint64_t)(N * n));
    for (int64_t x = 0; x < n; x++) {
        model__mat *w = &(*out)[x];
        w->data = (const uint8_t *)t->data + (size_t)x * (size_t)N * row_bytes;
        w->type = (ks_dtype)t->type;
        w->K = K;
        w->N = N;
        w->row_bytes = row_bytes;
    }
    return KS_OK;
}

/* Binds the floats of `name`, ggml shape [n0, n1] (n1 rows of n0; n1 1: a
 * vector), F32 in place, F16/BF16 converted; flat: of any shape holding
 * n0 * n1 elements. */
static ks_err load__vec2(model *m, const char *name, int64_t n0, int64_t n1, bool required,
                         bool flat, const float **out, ks_errbuf *eb) {
    ks_err e = KS_OK;
    *out = NULL;
    const gguf_tensor *t = load__tensor(m, name, required, eb, &e);
    if (!t) return e;
    const int64_t n = n0 * n1;
    if (t->n_elems != (uint64_t)n || (!flat && t->ne[0] != n0))
        return ks_seterr(eb, KS_ERR_FORMAT,
                         "%s: tensor '%s' has %llu elements in rows of %lld, expected %lld x %lld",
                         gguf_path(m->gguf), name, (unsigned long long)t->n_elems,
                         (long long)t->ne[0], (long long)n1, (long long)n0);
    if (t->type == KS_DTYPE_F32 && ((uintptr_t)t->data % sizeof(float)) == 0) {
        *out = t->data;
        return KS_OK;
    }
    if (t->type != KS_DTYPE_F32 && t->type != KS_DTYPE_F16 && t->type != KS_DTYPE_BF16)
        return ks_seterr(eb, KS_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s (vectors must be F32/F16/BF16)",
                         gguf_path(m->gguf), name, ks_dtype_name(t->type));
    float *v = malloc(sizeof(float) * (size_t)n);
    float **owned = realloc(m->owned, sizeof *owned * (size_t)(m->n_owned + 1));
    if (!v || !owned) {
        free(v);
        if (owned) m->owned = owned;
        return ks_seterr(eb, KS_ERR_NOMEM, "%s: tensor '%s'", gguf_path(m->gguf), name);
    }
    m->owned = owned;
    m->owned[m->n_owned++] = v;
    if (t->type == KS_DTYPE_F32) memcpy(v, t->data, sizeof(float) * (size_t)n);
    else kern_dequantize_row((ks_dtype)t->type, t->data, v, n);
    *out = v;
    return KS_OK;
}

/* Binds tensor `name` of n floats as one vector (load__vec2); flat: of any
 * shape holding n elements. */
static ks_err load__vec_n(model *m, const char *name, int64_t n, bool required, bool flat,
                          const float **out, ks_errbuf *eb) {
    return load__vec2(m, name, n, 1, required, flat, out, eb);
}

/* Binds vector `name` of n floats (load__vec2, shape [n]). */
static ks_err load__vec(model *m, const char *name, int64_t n, bool required, const float **out,
                        ks_errbuf *eb) {
    return load__vec2(m, name, n, 1, required, false, out, eb);
}

/* Binds the optional vector of n_rot/2 RoPE angle divisors `name`, each
 * positive and finite. */
static ks_err load__rope_factors(model *m, const char *name, const float **out, ks_errbuf *eb) {
    const int n = m->hp.n_rot / 2;
    ks_err e = load__vec(m, name, n, false, out, eb);
    if (e) return e;
    for (int i = 0; *out && i < n; i++)
        if (!((*out)[i] > 0.0f && isfinite((*out)[i])))
            return ks_seterr(eb, KS_ERR_FORMAT, "%s: %s[%d] = %g is not a positive factor",
                             gguf_path(m->gguf), name, i, (double)(*out)[i]);
    return KS_OK;
}

/* Rows [r0, r0 + n) of w as a matrix of its own (a part of a fused tensor). */
static model__mat load__rows(const model__mat *w, int64_t r0, int64_t n) {
    model__mat v = *w;
    v.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    v.N = n;
    return v;
}

/* Binds layer il's multi-head latent attention tensors (model_int.h). */
static ks_err load__mla_layer(model *m, int il, model__layer *L, ks_errbuf *eb) {
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, H = hp->n_head, R = hp->n_rot, KL = hp->kv_lora;
    const int64_t QL = hp->q_lora, QK = hp->mla_qk, NOPE = QK - R;
    char n[96];
#define LNAME(s) (snprintf(n, sizeof n, "blk.%d.%s", il, s), n)
    ks_err e;
    if (QL) {
        if ((e = load__mat(m, LNAME("attn_q_a.weight"), E, QL, &L->wq_a, eb)) ||
            (e = load__vec(m, LNAME("attn_q_a_norm.weight"), QL, true, &L->q_a_norm, eb)) ||
            (e = load__mat(m, LNAME("attn_q_b.weight"), QL, H * QK, &L->wq_b, eb)))
            return e;
    } else if ((e = load__mat(m, LNAME("attn_q.weight"), E, H * QK, &L->wq, eb))) {
        return e;
    }
    if ((e = load__mat(m, LNAME("attn_kv_a_mqa.weight"), E, KL + R, &L->wkv_a, eb)) ||
        (e = load__vec(m, LNAME("attn_kv_a_norm.weight"), KL, true, &L->kv_a_norm, eb)) ||
        (e = load__mat_experts(m, LNAME("attn_k_b.weight"), NOPE, KL, H, &L->wk_b, eb)) ||
        (e = load__mat_experts(m, LNAME("attn_v_b.weight"), KL, hp->mla_v, H, &L->wv_b, eb)))
        return e;
    const int64_t NI = hp->idx_heads, I = hp->idx_dim;
    if (hp->idx_topk &&
        ((e = load__mat(m, LNAME("indexer.attn_q_b.weight"), QL, NI * I, &L->idx_q_b, eb)) ||
         (e = load__mat(m, LNAME("indexer.attn_k.weight"), E, I, &L->idx_k, eb)) ||
         (e = load__mat(m, LNAME("indexer.proj.weight"), E, NI, &L->idx_proj, eb)) ||
         (e = load__vec(m, LNAME("indexer.k_norm.weight"), I, true, &L->idx_k_norm, eb)) ||
         (e = load__vec(m, LNAME("indexer.k_norm.bias"), I, true, &L->idx_k_norm_b, eb))))
        return e;
#undef LNAME
    return KS_OK;
}

/* Binds the convolution taps `name`, ggml shape [K, C] (each channel's K
 * taps in time order, F32/F16/BF16), as an owned f32 copy transposed to
 * (K, C): tap r of every channel in one row, the layout the convolution
 * kernel runs along channels with. */
static ks_err load__conv(model *m, const char *name, int64_t K, int64_t C, const float **out,
                         ks_errbuf *eb) {
    ks_err e = KS_OK;
    const gguf_tensor *t = load__tensor(m, name, true, eb, &e);
    if (!t) return e;
    if (t->n_dims != 2 || t->ne[0] != K || t->ne[1] != C)
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]",
                         gguf_path(m->gguf), name, (long long)t->ne[0], (long long)t->ne[1],
                         t->n_dims, (long long)K, (long long)C);
    if (t->type != KS_DTYPE_F32 && t->type != KS_DTYPE_F16 && t->type != KS_DTYPE_BF16)
        return ks_seterr(eb, KS_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s (want F32/F16/BF16)",
                         gguf_path(m->gguf), name, ks_dtype_name(t->type));
    float *v = malloc(sizeof(float) * (size_t)(K * C));
    float *row = malloc(sizeof(float) * (size_t)K);
    float **owned = realloc(m->owned, sizeof *owned * (size_t)(m->n_owned + 1));
    if (owned) m->owned = owned;
    if (!v || !row || !owned) {
        free(v);
        free(row);
        return ks_seterr(eb, KS_ERR_NOMEM, "%s: tensor '%s'", gguf_path(m->gguf), name);
    }
    m->owned[m->n_owned++] = v;
    const size_t rb = (size_t)(t->n_bytes / (uint64_t)C);
    for (int64_t ch = 0; ch < C; ch++) {
        kern_dequantize_row((ks_dtype)t->type, (const uint8_t *)t->data + (size_t)ch * rb, row, K);
        for (int64_t r = 0; r < K; r++)
            v[r * C + ch] = row[r];
    }
    free(row);
    *out = v;
    return KS_OK;
}

/* Binds qwen35 layer il: its mixer (Gated DeltaNet, or attention whose
 * attn_q rows carry the output gate), post_attention_norm (the norm before
 * the FFN) and the dense FFN. */
static ks_err load__qwen35_layer(model *m, int il, model__layer *L, ks_errbuf *eb) {
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, D = hp->head_dim, F = hp->n_ff, S = hp->ssm_state;
    const int64_t HD = (int64_t)hp->n_head * D, KVD = (int64_t)hp->n_head_kv * D;
    const int64_t VD = (int64_t)hp->ssm_v_heads * S, CD = 2 * (int64_t)hp->ssm_k_heads * S + VD;
    char n[96];
#define LNAME(s) (snprintf(n, sizeof n, "blk.%d.%s", il, s), n)
    ks_err e;
    if (L->recurrent) {
        if ((e = load__mat(m, LNAME("attn_qkv.weight"), E, CD, &L->ssm_qkv, eb)) ||
            (e = load__mat(m, LNAME("attn_gate.weight"), E, VD, &L->ssm_z, eb)) ||
            (e = load__mat(m, LNAME("ssm_beta.weight"), E, hp->ssm_v_heads, &L->ssm_beta, eb)) ||
            (e = load__mat(m, LNAME("ssm_alpha.weight"), E, hp->ssm_v_heads, &L->ssm_alpha, eb)) ||
            (e = load__vec(m, LNAME("ssm_dt.bias"), hp->ssm_v_heads, true, &L->ssm_dt, eb)) ||
            (e = load__vec(m, LNAME("ssm_a"), hp->ssm_v_heads, true, &L->ssm_a, eb)) ||
            (e = load__conv(m, LNAME("ssm_conv1d.weight"), hp->ssm_conv, CD, &L->ssm_conv1d, eb)) ||
            (e = load__vec(m, LNAME("ssm_norm.weight"), S, true, &L->ssm_norm, eb)) ||
            (e = load__mat(m, LNAME("ssm_out.weight"), VD, E, &L->ssm_out, eb)))
            return e;
    } else if ((e = load__mat(m, LNAME("attn_q.weight"), E, 2 * HD, &L->wq, eb)) ||
               (e = load__mat(m, LNAME("attn_k.weight"), E, KVD, &L->wk, eb)) ||
               (e = load__mat(m, LNAME("attn_v.weight"), E, KVD, &L->wv, eb)) ||
               (e = load__mat(m, LNAME("attn_output.weight"), HD, E, &L->wo, eb)) ||
               (e = load__vec(m, LNAME("attn_q_norm.weight"), D, true, &L->q_norm, eb)) ||
               (e = load__vec(m, LNAME("attn_k_norm.weight"), D, true, &L->k_norm, eb))) {
        return e;
    }
    if ((e = load__vec(m, LNAME("post_attention_norm.weight"), E, true, &L->ffn_norm, eb)))
        return e;
    if (hp->n_expert) { // qwen35moe: routed experts, the shared one and its gate
        const int64_t X = hp->n_expert, FX = hp->n_ff_exp, SF = FX * hp->n_expert_shared;
        if ((e = load__mat(m, LNAME("ffn_gate_inp.weight"), E, X, &L->gate_inp, eb)) ||
            (e = load__mat_experts(m, LNAME("ffn_gate_exps.weight"), E, FX, X, &L->gate_exps,
                                   eb)) ||
            (e = load__mat_experts(m, LNAME("ffn_up_exps.weight"), E, FX, X, &L->up_exps, eb)) ||
            (e = load__mat_experts(m, LNAME("ffn_down_exps.weight"), FX, E, X, &L->down_exps,
                                   eb)) ||
            (e = load__vec(m, LNAME("ffn_gate_inp_shexp.weight"), E, true, &L->shexp_gate, eb)) ||
            (e = load__mat(m, LNAME("ffn_gate_shexp.weight"), E, SF, &L->gate_sh, eb)) ||
            (e = load__mat(m, LNAME("ffn_up_shexp.weight"), E, SF, &L->up_sh, eb)) ||
            (e = load__mat(m, LNAME("ffn_down_shexp.weight"), SF, E, &L->down_sh, eb)))
            return e;
        return KS_OK;
    }
    if ((e = load__mat(m, LNAME("ffn_gate.weight"), E, F, &L->w_gate, eb)) ||
        (e = load__mat(m, LNAME("ffn_up.weight"), E, F, &L->w_up, eb)) ||
        (e = load__mat(m, LNAME("ffn_down.weight"), F, E, &L->w_down, eb)))
        return e;
#undef LNAME
    return KS_OK;
}

/* Binds gemma4 layer il's experts (model_int.h's gemma4 MoE fields): the
 * router and its scale, the three norms, the experts' gate and up (two 3-D
 * tensors, or ffn_gate_up_exps with each expert's gate rows first) and
 * down, and the optional per-expert ffn_down_exps.scale. */
static ks_err load__gemma4_moe(model *m, int il, model__layer *L, ks_errbuf *eb) {
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, X = hp->n_expert, FX = hp->n_ff_exp;
    char n[96];
#define LNAME(s) (snprintf(n, sizeof n, "blk.%d.%s", il, s), n)
    ks_err e;
    if (!X)
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: %s without %s.expert_count", gguf_path(m->gguf),
                         LNAME("ffn_gate_inp.weight"), hp->arch_name);
    if ((e = load__mat(m, LNAME("ffn_gate_inp.weight"), E, X, &L->gate_inp, eb)) ||
        (e = load__vec(m, LNAME("ffn_gate_inp.scale"), E, true, &L->gate_inp_s, eb)) ||
        (e = load__vec(m, LNAME("pre_ffw_norm_2.weight"), E, true, &L->moe_pre_norm, eb)) ||
        (e = load__vec(m, LNAME("post_ffw_norm_1.weight"), E, true, &L->moe_post_norm1, eb)) ||
        (e = load__vec(m, LNAME("post_ffw_norm_2.weight"), E, true, &L->moe_post_norm2, eb)) ||
        (e = load__mat_experts(m, LNAME("ffn_down_exps.weight"), FX, E, X, &L->down_exps, eb)) ||
        (e = load__vec(m, LNAME("ffn_down_exps.scale"), X, false, &L->down_exps_s, eb)))
        return e;
    if (!gguf_find_tensor(m->gguf, LNAME("ffn_gate_up_exps.weight"))) {
        if ((e = load__mat_experts(m, LNAME("ffn_gate_exps.weight"), E, FX, X, &L->gate_exps,
                                   eb)) ||
            (e = load__mat_experts(m, LNAME("ffn_up_exps.weight"), E, FX, X, &L->up_exps, eb)))
            return e;
        return KS_OK;
    }
    model__mat *gu = NULL; // each expert's [gate rows | up rows]
    if ((e = load__mat_experts(m, n, E, 2 * FX, X, &gu, eb))) return e;
    L->gate_exps = calloc((size_t)X, sizeof *L->gate_exps);
    L->up_exps = calloc((size_t)X, sizeof *L->up_exps);
    if (!L->gate_exps || !L->up_exps) {
        free(gu);
        return ks_seterr(eb, KS_ERR_NOMEM, "%s: %s", gguf_path(m->gguf), n);
    }
    for (int64_t x = 0; x < X; x++) {
        L->gate_exps[x] = load__rows(&gu[x], 0, FX);
        L->up_exps[x] = load__rows(&gu[x], FX, FX);
    }
    free(gu);
#undef LNAME
    return KS_OK;
}

/* Binds gemma4 layer il (model.h's gemma4 comment): Q/K/V (attn_v optional:
 * V is then the K projection), attn_output, the Q/K norms, post-norms of
 * both sublayers, the GELU FFN of the layer's width and the optional
 * layer_output_scale; sets the layer's attention shape. */
static ks_err load__gemma4_layer(model *m, int il, model__layer *L, ks_errbuf *eb) {
    const model_hparams *hp = &m->hp;
    const int swa = model__layer_flag(m->gguf, hp->arch_name, "attention.sliding_window_pattern", il);
    const int64_t kvh = model__layer_val(m->gguf, hp->arch_name, "attention.head_count_kv", il),
                  F = model__layer_val(m->gguf, hp->arch_name, "feed_forward_length", il);
    KS_ASSERT(swa >= 0 && kvh > 0 && F > 0); // load__gemma4 checked them
    L->swa = swa;
    L->head_dim = swa ? hp->head_dim_swa : hp->head_dim;
    L->n_head_kv = (int32_t)kvh;
    L->n_rot = swa ? hp->n_rot_swa : hp->n_rot;
    const int64_t E = hp->n_embd, D = L->head_dim, HD = (int64_t)hp->n_head * D, KVD = kvh * D;
    const int64_t PL = hp->n_embd_pl;
    // a shared KV layer (no K/V of its own) reads its source's pages
    const bool own = il < hp->n_layer_attn;
    L->kv_layer = own ? il : hp->n_layer_attn - (swa ? 2 : 1);
    const model__layer *S = &m->layers[L->kv_layer];
    if (!own && (S->swa != L->swa || S->head_dim != L->head_dim || S->n_head_kv != L->n_head_kv))
        return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                         "%s: gemma4 layer %d (%s, %d K/V heads of %d) shares layer %d's K/V "
                         "(%s, %d of %d): llama.cpp's rule pairs a sliding shared layer with "
                         "layer n - 2 and a full one with n - 1 (n = block_count - "
                         "shared_kv_layers); they must be of the same kind and shape",
                         gguf_path(m->gguf), il, swa ? "sliding" : "full", L->n_head_kv,
                         L->head_dim, L->kv_layer, S->swa ? "sliding" : "full", S->n_head_kv,
                         S->head_dim);
    char n[96];
#define LNAME(s) (snprintf(n, sizeof n, "blk.%d.%s", il, s), n)
    ks_err e;
    if ((e = load__mat(m, LNAME("attn_q.weight"), E, HD, &L->wq, eb)) ||
        (own && (e = load__mat(m, LNAME("attn_k.weight"), E, KVD, &L->wk, eb))) ||
        (own && gguf_find_tensor(m->gguf, LNAME("attn_v.weight")) &&
         (e = load__mat(m, n, E, KVD, &L->wv, eb))) ||
        (e = load__mat(m, LNAME("attn_output.weight"), HD, E, &L->wo, eb)) ||
        (e = load__vec(m, LNAME("attn_q_norm.weight"), D, true, &L->q_norm, eb)) ||
        (own && (e = load__vec(m, LNAME("attn_k_norm.weight"), D, true, &L->k_norm, eb))) ||
        (PL && ((e = load__mat(m, LNAME("inp_gate.weight"), E, PL, &L->ple_gate, eb)) ||
                (e = load__mat(m, LNAME("proj.weight"), PL, E, &L->ple_proj, eb)) ||
                (e = load__vec(m, LNAME("post_norm.weight"), E, true, &L->ple_norm, eb)))) ||
        (e = load__vec(m, LNAME("post_attention_norm.weight"), E, true, &L->post_attn_norm, eb)) ||
        (e = load__vec(m, LNAME("ffn_norm.weight"), E, true, &L->ffn_norm, eb)) ||
        (e = load__mat(m, LNAME("ffn_gate.weight"), E, F, &L->w_gate, eb)) ||
        (e = load__mat(m, LNAME("ffn_up.weight"), E, F, &L->w_up, eb)) ||
        (e = load__mat(m, LNAME("ffn_down.weight"), F, E, &L->w_down, eb)) ||
        (e = load__vec(m, LNAME("post_ffw_norm.weight"), E, true, &L->post_ffn_norm, eb)) ||
        (e = load__vec_n(m, LNAME("layer_output_scale.weight"), 1, false, true, &L->out_scale,
                         eb)))
        return e;
    // the MoE layers (26B-A4B): experts beside the dense FFN, as load__gemma4_moe binds them
    if (gguf_find_tensor(m->gguf, LNAME("ffn_gate_inp.weight")) &&
        (e = load__gemma4_moe(m, il, L, eb)))
        return e;
    if (!swa && !hp->rope_freqs) // llama.cpp requires it of a full layer
        return ks_seterr(eb, KS_ERR_FORMAT,
                         "%s: missing tensor 'rope_freqs.weight' (gemma4's full-attention layers "
                         "turn by it)",
                         gguf_path(m->gguf));
#undef LNAME
    return KS_OK;
}

/* Binds nemotron_h layer il of kind k (model__nh_kind): a Mamba2 mixer
 * (ssm_in cut into z, x|B|C and dt rows), attention, or the MLP (up, down). */
static ks_err load__nemotron_h_layer(model *m, int il, char k, model__layer *L, ks_errbuf *eb) {
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, D = hp->head_dim, F = hp->n_ff, H = hp->ssm_v_heads;
    const int64_t HD = (int64_t)hp->n_head * D, KVD = (int64_t)hp->n_head_kv * D;
    const int64_t DI = hp->ssm_inner, CD = DI + 2 * (int64_t)hp->ssm_k_heads * hp->ssm_state;
    char n[96];
#define LNAME(s) (snprintf(n, sizeof n, "blk.%d.%s", il, s), n)
    ks_err e;
    L->no_ffn = k != '-';
    L->ffn_only = k == '-';
    if (k == 'M') {
        model__mat in = {0};
        L->mamba2 = true;
        if ((e = load__mat(m, LNAME("ssm_in.weight"), E, DI + CD + H, &in, eb)) ||
            (e = load__conv(m, LNAME("ssm_conv1d.weight"), hp->ssm_conv, CD, &L->ssm_conv1d, eb)) ||
            (e = load__vec(m, LNAME("ssm_conv1d.bias"), CD, true, &L->ssm_conv_b, eb)) ||
            (e = load__vec(m, LNAME("ssm_dt.bias"), H, true, &L->ssm_dt, eb)) ||
            (e = load__vec_n(m, LNAME("ssm_a"), H, true, true, &L->ssm_a, eb)) ||
            (e = load__vec_n(m, LNAME("ssm_d"), H, true, true, &L->ssm_d, eb)) ||
            (e = load__vec_n(m, LNAME("ssm_norm.weight"), DI, true, true, &L->ssm_norm, eb)) ||
            (e = load__mat(m, LNAME("ssm_out.weight"), DI, E, &L->ssm_out, eb)))
            return e;
        L->ssm_z = load__rows(&in, 0, DI);
        L->ssm_qkv = load__rows(&in, DI, CD);
        L->ssm_alpha = load__rows(&in, DI + CD, H);
    } else if (k == '*') {
        if ((e = load__mat(m, LNAME("attn_q.weight"), E, HD, &L->wq, eb)) ||
            (e = load__mat(m, LNAME("attn_k.weight"), E, KVD, &L->wk, eb)) ||
            (e = load__mat(m, LNAME("attn_v.weight"), E, KVD, &L->wv, eb)) ||
            (e = load__mat(m, LNAME("attn_output.weight"), HD, E, &L->wo, eb)))
            return e;
    } else if ((e = load__mat(m, LNAME("ffn_up.weight"), E, F, &L->w_up, eb)) ||
               (e = load__mat(m, LNAME("ffn_down.weight"), F, E, &L->w_down, eb))) {
        return e;
    }
#undef LNAME
    return KS_OK;
}

/* bert's tensors after token_embd (llama.cpp's LLM_ARCH_BERT names), Q/K/V
 * split or fused as attn_qkv; every bias and LayerNorm required. nomic-bert:
 * no position_embd (RoPE), ffn_gate (SwiGLU), the biases optional. */
static ks_err load__bert(model *m, ks_errbuf *eb) {
    model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff, HD = (int64_t)hp->n_head * hp->head_dim;
    ks_err e;
    if (hp->n_head_kv != hp->n_head)
        return ks_seterr(eb, KS_ERR_UNSUPPORTED, "%s: bert with head_count_kv %d != head_count %d",
                         gguf_path(m->gguf), hp->n_head_kv, hp->n_head);
    const bool nomic = hp->arch == MODEL_ARCH_NOMIC_BERT, rb = !nomic; // biases required
    const gguf_tensor *tt = load__tensor(m, "token_types.weight", true, eb, &e);
    if (!tt) return e;
    if (tt->n_dims != 2 || tt->ne[1] < 1 || tt->ne[1] > 64)
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: token_types.weight: expected [%lld, 1..64]",
                         gguf_path(m->gguf), (long long)E);
    if ((e = load__mat(m, "token_types.weight", E, tt->ne[1], &m->type_embd, eb)) ||
        (!nomic &&
         (e = load__mat(m, "position_embd.weight", E, hp->n_ctx_train, &m->pos_embd, eb))) ||
        (e = load__vec(m, "token_embd_norm.weight", E, true, &m->embd_norm, eb)) ||
        (e = load__vec(m, "token_embd_norm.bias", E, true, &m->embd_norm_b, eb)))
        return e;
    if ((uint64_t)hp->n_layer > gguf_n_tensors(m->gguf))
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: block_count %d but the file holds %llu tensors",
                         gguf_path(m->gguf), hp->n_layer,
                         (unsigned long long)gguf_n_tensors(m->gguf));
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return ks_seterr(eb, KS_ERR_NOMEM, "%s: layers", gguf_path(m->gguf));
    hp->tied_output = true; // no LM head: nothing reads output
    m->output = m->tok_embd;
    for (int il = 0; il < hp->n_layer; il++) {
        model__layer *L = &m->layers[il];
        char n[96];
#define LNAME(s) (snprintf(n, sizeof n, "blk.%d.%s", il, s), n)
        L->kv_layer = il;
        if (gguf_find_tensor(m->gguf, LNAME("attn_qkv.weight"))) { // Q, K, V rows in one
            model__mat fused = {0};
            const float *b = NULL;
            if ((e = load__mat(m, n, E, 3 * HD, &fused, eb)) ||
                (e = load__vec(m, LNAME("attn_qkv.bias"), 3 * HD, rb, &b, eb)))
                return e;
            L->wq = load__rows(&fused, 0, HD);
            L->wk = load__rows(&fused, HD, HD);
            L->wv = load__rows(&fused, 2 * HD, HD);
            if (b) L->bq = b, L->bk = b + HD, L->bv = b + 2 * HD;
        } else if ((e = load__mat(m, LNAME("attn_q.weight"), E, HD, &L->wq, eb)) ||
                   (e = load__mat(m, LNAME("attn_k.weight"), E, HD, &L->wk, eb)) ||
                   (e = load__mat(m, LNAME("attn_v.weight"), E, HD, &L->wv, eb)) ||
                   (e = load__vec(m, LNAME("attn_q.bias"), HD, rb, &L->bq, eb)) ||
                   (e = load__vec(m, LNAME("attn_k.bias"), HD, rb, &L->bk, eb)) ||
                   (e = load__vec(m, LNAME("attn_v.bias"), HD, rb, &L->bv, eb))) {
            return e;
        }
        if ((e = load__mat(m, LNAME("attn_output.weight"), HD, E, &L->wo, eb)) ||
            (e = load__vec(m, LNAME("attn_output.bias"), E, rb, &L->bo, eb)) ||
            (e = load__vec(m, LNAME("attn_output_norm.weight"), E, true, &L->ln_attn, eb)) ||
            (e = load__vec(m, LNAME("attn_output_norm.bias"), E, true, &L->ln_attn_b, eb)) ||
            (e = load__mat(m, LNAME("ffn_up.weight"), E, F, &L->w_up, eb)) ||
            (e = load__vec(m, LNAME("ffn_up.bias"), F, rb, &L->b_up, eb)) ||
            (nomic && (e = load__mat(m, LNAME("ffn_gate.weight"), E, F, &L->w_gate, eb))) ||
            (e = load__mat(m, LNAME("ffn_down.weight"), F, E, &L->w_down, eb)) ||
            (e = load__vec(m, LNAME("ffn_down.bias"), E, rb, &L->b_down, eb)) ||
            (e = load__vec(m, LNAME("layer_output_norm.weight"), E, true, &L->ln_out, eb)) ||
            (e = load__vec(m, LNAME("layer_output_norm.bias"), E, true, &L->ln_out_b, eb)))
            return e;
#undef LNAME
    }
    return KS_OK;
}

/* Binds layer il's tensors of a plain transformer block (attention or
 * MLA, then a dense FFN or the experts) into L: every architecture's but
 * gemma4's, nemotron_h's and the hybrids' (load__weights). Also the NextN
 * block's (model_mtp_create), whose il is past hp->n_layer. */
static ks_err load__std_layer(model *m, int il, model__layer *L, ks_errbuf *eb) {
    const model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, D = hp->head_dim, F = hp->n_ff;
    const int64_t HD = (int64_t)hp->n_head * D, KVD = (int64_t)hp->n_head_kv * D;
    const int64_t HO = hp->kv_lora ? (int64_t)hp->n_head * hp->mla_v : HD;
    const bool glm4moe = hp->arch == MODEL_ARCH_GLM4MOE, oss = hp->arch == MODEL_ARCH_GPT_OSS;
    char n[96];
#define LNAME(s) (snprintf(n, sizeof n, "blk.%d.%s", il, s), n)
    model__mat fused = {0};
    ks_err e;
    if (hp->kv_lora) {
        if ((e = load__mla_layer(m, il, L, eb))) return e;
    } else if (gguf_find_tensor(m->gguf, LNAME("attn_qkv.weight"))) { // Q, K, V rows in one
        if ((e = load__mat(m, n, E, HD + 2 * KVD, &fused, eb))) return e;
        L->wq = load__rows(&fused, 0, HD);
        L->wk = load__rows(&fused, HD, KVD);
        L->wv = load__rows(&fused, HD + KVD, KVD);
        const float *b = NULL; // and its bias, when there is one, split the same way
        if ((e = load__vec(m, LNAME("attn_qkv.bias"), HD + 2 * KVD, false, &b, eb))) return e;
        if (b) L->bq = b, L->bk = b + HD, L->bv = b + HD + KVD;
    } else if ((e = load__mat(m, LNAME("attn_q.weight"), E, HD, &L->wq, eb)) ||
               (e = load__mat(m, LNAME("attn_k.weight"), E, KVD, &L->wk, eb)) ||
               (e = load__mat(m, LNAME("attn_v.weight"), E, KVD, &L->wv, eb))) {
        return e;
    }
    // glm4moe's and gpt-oss's post_attention_norm is the norm before the
    // FFN (on the residual stream, as other models' ffn_norm), not a post-norm
    if ((e = load__mat(m, LNAME("attn_output.weight"), HO, E, &L->wo, eb)) ||
        (e = load__vec(m,
                       LNAME(glm4moe || oss ? "post_attention_norm.weight" : "ffn_norm.weight"),
                       E, true, &L->ffn_norm, eb)))
        return e;
    // gpt-oss: attn_output's bias, the sinks, the router's and experts'
    // biases. The converter always writes the sinks (llama.cpp requires
    // them); a layer without them runs the plain softmax, as a sink of
    // -inf would (unit_model compares the two)
    if (oss && ((e = load__vec(m, LNAME("attn_output.bias"), E, true, &L->bo, eb)) ||
                (e = load__vec(m, LNAME("attn_sinks.weight"), hp->n_head, false,
                               &L->attn_sinks, eb)) ||
                (e = load__vec(m, LNAME("ffn_gate_inp.bias"), hp->n_expert, true,
                               &L->gate_inp_b, eb)) ||
                (e = load__vec2(m, LNAME("ffn_gate_exps.bias"), hp->n_ff_exp, hp->n_expert,
                                true, false, &L->gate_exps_b, eb)) ||
                (e = load__vec2(m, LNAME("ffn_up_exps.bias"), hp->n_ff_exp, hp->n_expert,
                                true, false, &L->up_exps_b, eb)) ||
                (e = load__vec2(m, LNAME("ffn_down_exps.bias"), E, hp->n_expert, true, false,
                                &L->down_exps_b, eb))))
        return e;
    // a dense FFN, or the experts: every layer of a MoE file but the
    // leading dense ones (glm4moe's leading_dense_block_count)
    const bool moe = hp->n_expert > 0 && il >= hp->n_layer_dense;
    const bool fused_ffn = hp->arch == MODEL_ARCH_PHI3 || hp->arch == MODEL_ARCH_GLM4;
    if (!moe && fused_ffn) { // gate rows, then up rows
        if ((e = load__mat(m, LNAME("ffn_up.weight"), E, 2 * F, &fused, eb))) return e;
        L->w_gate = load__rows(&fused, 0, F);
        L->w_up = load__rows(&fused, F, F);
    } else if (!moe && ((e = load__mat(m, LNAME("ffn_gate.weight"), E, F, &L->w_gate, eb)) ||
                        (e = load__mat(m, LNAME("ffn_up.weight"), E, F, &L->w_up, eb)))) {
        return e;
    }
    if (!moe && (e = load__mat(m, LNAME("ffn_down.weight"), F, E, &L->w_down, eb))) return e;
    const int64_t X = hp->n_expert, FX = hp->n_ff_exp;
    if (moe &&
        ((e = load__mat(m, LNAME("ffn_gate_inp.weight"), E, X, &L->gate_inp, eb)) ||
         (e = load__mat_experts(m, LNAME("ffn_gate_exps.weight"), E, FX, X, &L->gate_exps,
                                eb)) ||
         (e = load__mat_experts(m, LNAME("ffn_up_exps.weight"), E, FX, X, &L->up_exps, eb)) ||
         (e = load__mat_experts(m, LNAME("ffn_down_exps.weight"), FX, E, X, &L->down_exps,
                                eb))))
        return e;
    // glm4moe: the router's selection bias and the shared expert
    if (moe && (glm4moe || model__is_mla(hp->arch)) && // DeepSeek-V2 has none
        (e = load__vec(m, LNAME("exp_probs_b.bias"), X, glm4moe, &L->exp_probs_b, eb)))
        return e;
    // the shared experts as one FFN n_expert_shared times as wide (DeepSeek-V2: 2)
    const int64_t SF = FX * hp->n_expert_shared;
    if (moe && hp->n_expert_shared &&
        ((e = load__mat(m, LNAME("ffn_gate_shexp.weight"), E, SF, &L->gate_sh, eb)) ||
         (e = load__mat(m, LNAME("ffn_up_shexp.weight"), E, SF, &L->up_sh, eb)) ||
         (e = load__mat(m, LNAME("ffn_down_shexp.weight"), SF, E, &L->down_sh, eb))))
        return e;
    // Q/K/V biases: qwen2's always, glm4's where the file has them (all three)
    const bool need_b = hp->arch == MODEL_ARCH_QWEN2 || oss;
    if (!L->bq &&
        (need_b || ((hp->arch == MODEL_ARCH_GLM4 || glm4moe) &&
                    gguf_find_tensor(m->gguf, LNAME("attn_q.bias")))) &&
        ((e = load__vec(m, LNAME("attn_q.bias"), HD, true, &L->bq, eb)) ||
         (e = load__vec(m, LNAME("attn_k.bias"), KVD, true, &L->bk, eb)) ||
         (e = load__vec(m, LNAME("attn_v.bias"), KVD, true, &L->bv, eb))))
        return e;
    if (hp->post_norms &&
        ((e = load__vec(m, LNAME("post_attention_norm.weight"), E, true, &L->post_attn_norm,
                        eb)) ||
         (e = load__vec(m, LNAME("post_ffw_norm.weight"), E, true, &L->post_ffn_norm, eb))))
        return e;
    L->swa = hp->n_swa > 0 && (hp->swa_period == 0 || il % hp->swa_period < hp->swa_period - 1);
    // per-head Q/K norms: qwen3's and gemma3's always; glm4moe's where
    // present (the GLM-4.5 355B release has them, Air not), each on its own
    const bool need_qk = hp->arch == MODEL_ARCH_QWEN3 || hp->arch == MODEL_ARCH_QWEN3MOE ||
                         hp->arch == MODEL_ARCH_GEMMA3;
    if ((need_qk || glm4moe) &&
        ((e = load__vec(m, LNAME("attn_q_norm.weight"), D, need_qk, &L->q_norm, eb)) ||
         (e = load__vec(m, LNAME("attn_k_norm.weight"), D, need_qk, &L->k_norm, eb))))
        return e;
#undef LNAME
    return KS_OK;
}

static ks_err load__weights(model *m, ks_errbuf *eb) {
    model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd;
    ks_err e;
    const gguf_tensor *te = load__tensor(m, "token_embd.weight", true, eb, &e);
    if (!te) return e;
    if (te->n_dims != 2 || te->ne[0] != E || te->ne[1] < 1 || te->ne[1] > INT32_MAX)
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: tensor 'token_embd.weight' has shape [%lld, %lld], expected [%lld, n_vocab]",
                         gguf_path(m->gguf), (long long)te->ne[0], (long long)te->ne[1], (long long)E);
    hp->n_vocab = (int32_t)te->ne[1];
    if ((e = load__mat(m, "token_embd.weight", E, hp->n_vocab, &m->tok_embd, eb))) return e;
    if (hp->encoder) return load__bert(m, eb);
    if ((e = load__vec(m, "output_norm.weight", E, true, &m->output_norm, eb))) return e;
    // per-pair angle divisors: Llama 3.x's, or phi3's LongRoPE short and long
    if ((e = load__rope_factors(m, "rope_freqs.weight", &hp->rope_freqs, eb))) return e;
    if (!hp->rope_freqs &&
        ((e = load__rope_factors(m, "rope_factors_short.weight", &hp->rope_freqs, eb)) ||
         (e = load__rope_factors(m, "rope_factors_long.weight", &hp->rope_freqs_long, eb))))
        return e;
    if (hp->rope_freqs_long && !hp->rope_freqs)
        return ks_seterr(eb, KS_ERR_FORMAT,
                         "%s: rope_factors_long.weight without rope_factors_short.weight",
                         gguf_path(m->gguf));
    hp->tied_output = !gguf_find_tensor(m->gguf, "output.weight");
    if (hp->tied_output) m->output = m->tok_embd;
    else if ((e = load__mat(m, "output.weight", E, hp->n_vocab, &m->output, eb))) return e;

    // every layer has tensors of its own: a block_count past the tensor count
    // is a corrupt file, refused before the layer table is allocated
    if ((uint64_t)hp->n_layer > gguf_n_tensors(m->gguf))
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: block_count %d but the file holds %llu tensors",
                         gguf_path(m->gguf), hp->n_layer,
                         (unsigned long long)gguf_n_tensors(m->gguf));
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return ks_seterr(eb, KS_ERR_NOMEM, "%s: layers", gguf_path(m->gguf));
    const int64_t PLA = (int64_t)hp->n_embd_pl * hp->n_layer; // gemma4's per-layer inputs
    if (PLA && ((e = load__mat(m, "per_layer_token_embd.weight", PLA, hp->n_vocab, &m->ple_tok,
                               eb)) ||
                (e = load__mat(m, "per_layer_model_proj.weight", E, PLA, &m->ple_in, eb)) ||
                (e = load__vec(m, "per_layer_proj_norm.weight", hp->n_embd_pl, true,
                               &m->ple_in_norm, eb))))
        return e;
    if (PLA && hp->n_embd_pl % (int64_t)ks_dtype_block_elems(m->ple_tok.type))
        return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                         "%s: per_layer_token_embd.weight of type %s: a layer's part (%d) is not "
                         "whole blocks",
                         gguf_path(m->gguf), ks_dtype_name(m->ple_tok.type), hp->n_embd_pl);
    int n_kv = 0, n_rec = 0; // nemotron_h: attention and Mamba2 layers so far
    // layers [n_layer, block_count) are the NextN blocks: not part of the
    // pass, bound only by model_mtp_create (--spec-nextn)
    for (int il = 0; il < hp->n_layer; il++) {
        model__layer *L = &m->layers[il];
        char n[96];
#define LNAME(s) (snprintf(n, sizeof n, "blk.%d.%s", il, s), n)
        if ((e = load__vec(m, LNAME("attn_norm.weight"), E, true, &L->attn_norm, eb))) return e;
        L->kv_layer = il;
        if (hp->arch == MODEL_ARCH_GEMMA4) {
            if ((e = load__gemma4_layer(m, il, L, eb))) return e;
            continue;
        }
        if (hp->arch == MODEL_ARCH_NEMOTRON_H) { // KV and state rows in layer order
            const char k = model__nh_kind(m->gguf, hp->arch_name, il);
            L->recurrent = k == 'M';
            L->kv_layer = k == '*' ? n_kv++ : -1;
            L->rec_layer = k == 'M' ? n_rec++ : -1;
            if ((e = load__nemotron_h_layer(m, il, k, L, eb))) return e;
            continue;
        }
        if (hp->ssm_state) { // hybrid: the KV layers are the attention layers, in order
            L->recurrent = (il + 1) % hp->attn_interval != 0;
            L->kv_layer = L->recurrent ? -1 : (il + 1) / hp->attn_interval - 1;
            L->rec_layer = L->recurrent ? il - il / hp->attn_interval : -1;
            if ((e = load__qwen35_layer(m, il, L, eb))) return e;
            continue;
        }
        if ((e = load__std_layer(m, il, L, eb))) return e;
#undef LNAME
    }
    return KS_OK;
}

/* Calls fn on every matrix the matmuls read (not token_embd: rows are
 * looked up by token; nor a tied output, which is the same rows), in one
 * fixed order. */
static void load__each_mat(model *m, void (*fn)(const gguf_file *, model__mat *, void *),
                           void *arg) {
    if (!m->hp.tied_output && (!m->base || m->own_output)) fn(m->gguf, &m->output, arg);
    if (m->mtp_eh.data) fn(m->gguf, &m->mtp_eh, arg);
    if (m->ple_in.data) fn(m->gguf, &m->ple_in, arg);
    for (int il = 0; il < m->hp.n_layer; il++) {
        model__layer *L = &m->layers[il];
        model__mat *ws[] = {&L->wq,     &L->wk,      &L->wv,    &L->wo,      &L->w_gate, &L->w_up,
                            &L->w_down, &L->gate_sh, &L->up_sh, &L->down_sh, &L->wq_a,   &L->wq_b,
                            &L->wkv_a,  &L->idx_q_b, &L->idx_k, &L->idx_proj, &L->ssm_qkv,
                            &L->ssm_z,  &L->ssm_beta, &L->ssm_alpha, &L->ssm_out,
                            &L->ple_gate, &L->ple_proj};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if (ws[i]->data) fn(m->gguf, ws[i], arg);
        for (int h = 0; L->wk_b && h < m->hp.n_head; h++) {
            fn(m->gguf, &L->wk_b[h], arg);
            fn(m->gguf, &L->wv_b[h], arg);
        }
        for (int x = 0; L->gate_exps && x < m->hp.n_expert; x++) {
            fn(m->gguf, &L->gate_exps[x], arg);
            fn(m->gguf, &L->up_exps[x], arg);
            fn(m->gguf, &L->down_exps[x], arg);
        }
    }
}

/* Bytes of w's r16 copy in the arena (64-byte aligned), 0 when the kernels
 * do not want the layout for it (kern_r16_wanted). */
static size_t load__r16_bytes(const model__mat *w) {
    if (!kern_r16_wanted(w->type, w->K, w->N)) return 0;
    return (kern_r16_group_bytes(w->type, w->K) * (size_t)(w->N / 16) + 63) & ~(size_t)63;
}

static void load__r16_sum(const gguf_file *f, model__mat *w, void *arg) {
    (void)f;
    *(size_t *)arg += load__r16_bytes(w);
}

/* Repacks w at *arg (the arena's next free byte) when the kernels want the
 * r16 layout, and tells the kernel the mmapped rows are no longer needed, so
 * they leave the process's resident memory. */
static void load__r16_pack(const gguf_file *f, model__mat *w, void *arg) {
    uint8_t **next = arg;
    const size_t bytes = load__r16_bytes(w);
    if (!bytes) return;
    const size_t gb = kern_r16_group_bytes(w->type, w->K);
    uint8_t *p = *next;
    for (int64_t g = 0; g < w->N / 16; g++)
        kern_r16_pack(w->type, w->K, (const uint8_t *)w->data + (size_t)g * 16 * w->row_bytes,
                      w->row_bytes, p + (size_t)g * gb);
    gguf_advise_unneeded(f, w->data, w->row_bytes * (size_t)w->N);
    w->data = w->packed = p;
    w->group_bytes = gb;
    *next = p + bytes;
}

/* Repacks every matrix the kernels want in r16 into one arena of huge
 * pages: a decode step streams all of them, and with 4 KiB pages it took a
 * TLB miss every 4 KiB of weights. Where the arena cannot be allocated the
 * matrices stay in the file's rows (slower, still correct). */
static void load__repack_all(model *m) {
    size_t total = 0;
    load__each_mat(m, load__r16_sum, &total);
    if (!total || !(m->arena = ks_alloc_huge(total))) return;
    uint8_t *next = m->arena;
    load__each_mat(m, load__r16_pack, &next);
    KS_ASSERT((size_t)(next - (uint8_t *)m->arena) == total);
}

// ----------------------------------------------------------------------------
// Public

/* gemma4's tokenizer.ggml.suppress_tokens (an integer array; absent: none):
 * llama.cpp's gemma4 graph adds -inf to those logits (ids outside the
 * vocabulary are skipped, as it does). */
static ks_err load__suppress(model *m, ks_errbuf *eb) {
    const gguf_value *a = gguf_get(m->gguf, "tokenizer.ggml.suppress_tokens");
    if (!a || m->hp.arch != MODEL_ARCH_GEMMA4) return KS_OK;
    if (a->type != GGUF_TYPE_ARRAY || a->v.arr.items || a->v.arr.elem_type == GGUF_TYPE_FLOAT32 ||
        a->v.arr.elem_type == GGUF_TYPE_FLOAT64 || a->v.arr.elem_type == GGUF_TYPE_BOOL)
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: tokenizer.ggml.suppress_tokens: want integers",
                         gguf_path(m->gguf));
    if (a->v.arr.n > (uint64_t)m->hp.n_vocab)
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: tokenizer.ggml.suppress_tokens: %llu ids",
                         gguf_path(m->gguf), (unsigned long long)a->v.arr.n);
    m->suppress = malloc(sizeof *m->suppress * (a->v.arr.n + 1));
    if (!m->suppress) return ks_seterr(eb, KS_ERR_NOMEM, "%s: suppress_tokens", gguf_path(m->gguf));
    for (uint64_t i = 0; i < a->v.arr.n; i++) {
        const int64_t id = gguf_arr_i64(a, i);
        if (id >= 0 && id < m->hp.n_vocab) m->suppress[m->n_suppress++] = (int32_t)id;
    }
    return KS_OK;
}

/* The model's attention shape on every layer load__weights left unset
 * (all but gemma4's), and the ones vector of unweighted norms. */
static ks_err load__layer_shapes(model *m, ks_errbuf *eb) {
    for (int il = 0; m->layers && il < m->hp.n_layer; il++) {
        model__layer *L = &m->layers[il];
        if (L->head_dim) continue;
        L->head_dim = m->hp.head_dim;
        L->n_head_kv = m->hp.n_head_kv;
        L->n_rot = m->hp.n_rot;
    }
    float *ones = malloc(sizeof(float) * MODEL_MAX_HEAD_DIM);
    float **owned = realloc(m->owned, sizeof *owned * (size_t)(m->n_owned + 1));
    if (owned) m->owned = owned;
    if (!ones || !owned) {
        free(ones);
        return ks_seterr(eb, KS_ERR_NOMEM, "%s: model", gguf_path(m->gguf));
    }
    for (int i = 0; i < MODEL_MAX_HEAD_DIM; i++)
        ones[i] = 1.0f;
    m->owned[m->n_owned++] = ones;
    m->ones = ones;
    return KS_OK;
}

/* model_load of the open file f (taken over: closed with the model or on
 * failure), repacking the weights only when asked. */
static ks_err load__model_file(gguf_file *f, bool repack, model **out, ks_errbuf *eb) {
    *out = NULL;
    const char *path = gguf_path(f);
    model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(f);
        return ks_seterr(eb, KS_ERR_NOMEM, "model");
    }
    m->gguf = f;
    ks_err e;
    if ((e = model__load_hparams(m, eb))) goto fail;
    if ((e = load__weights(m, eb)) || (e = load__layer_shapes(m, eb)) ||
        (e = load__suppress(m, eb)))
        goto fail;
    if (repack) load__repack_all(m);
    // a decode step reads one embedding row at random: with its pages
    // unmapped, each new token took a page fault (~50 us in a VM, 0.4% of
    // a TinyLlama Q4_0 token on 2 threads) the first time it was seen
    if (!m->tok_embd.packed)
        gguf_advise_resident(f, m->tok_embd.data, m->tok_embd.row_bytes * (size_t)m->hp.n_vocab);
    if ((e = tok_vocab_load(m->gguf, &m->vocab, eb))) goto fail;
    if (tok_n_vocab(m->vocab) > m->hp.n_vocab) {
        e = ks_seterr(eb, KS_ERR_FORMAT, "%s: vocabulary has %d tokens but token_embd has %d rows",
                      path, tok_n_vocab(m->vocab), m->hp.n_vocab);
        goto fail;
    }
    *out = m;
    return KS_OK;
fail:
    model_free(m);
    return e;
}

/* load__model_file of the file at path. */
static ks_err load__model(const char *path, bool repack, model **out, ks_errbuf *eb) {
    gguf_file *f;
    *out = NULL;
    ks_err e = gguf_open(path, &f, eb);
    return e ? e : load__model_file(f, repack, out, eb);
}

ks_err model_load(const char *path, model **out, ks_errbuf *eb) {
    return load__model(path, true, out, eb);
}

ks_err model_load_unpacked(const char *path, model **out, ks_errbuf *eb) {
    return load__model(path, false, out, eb);
}

ks_err model_check(const char *path, ks_errbuf *eb) {
    model *m;
    ks_err e = load__model(path, false, &m, eb);
    model_free(m);
    return e;
}

ks_err model_check_file(gguf_file *f, ks_errbuf *eb) {
    model *m;
    ks_err e = load__model_file(f, false, &m, eb);
    model_free(m);
    return e;
}

void model_free(model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->suppress);
    free(m->owned);
    ks_free_aligned(m->arena);
    for (int il = 0; m->layers && il < m->hp.n_layer; il++) {
        model__layer *L = &m->layers[il];
        void *ps[] = {L->wk_b, L->wv_b, L->gate_exps, L->up_exps, L->down_exps};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
            free(ps[i]);
    }
    free(m->layers);
    if (!m->base) { // a NextN head borrows these
        tok_vocab_free(m->vocab);
        gguf_close(m->gguf);
    }
    free(m);
}

bool model_has_mtp(const model *m) {
    const model_hparams *hp = &m->hp;
    // a plain block after the layers (not a hybrid's: its state cannot roll back)
    return hp->n_layer_nextn > 0 && !m->base && !hp->ssm_state && !hp->encoder &&
           hp->arch != MODEL_ARCH_GEMMA4 && hp->arch != MODEL_ARCH_NEMOTRON_H;
}

ks_err model_mtp_create(const model *base, model **out, ks_errbuf *eb) {
    *out = NULL;
    if (!model_has_mtp(base))
        return ks_seterr(eb, KS_ERR_INVAL,
                         "%s: no NextN (multi-token prediction) block to draft with (%s.nextn_"
                         "predict_layers is 0, or the architecture's blocks are not plain ones)",
                         gguf_path(base->gguf), base->hp.arch_name);
    model *m = calloc(1, sizeof *m);
    if (!m) return ks_seterr(eb, KS_ERR_NOMEM, "NextN head");
    m->base = base;
    m->gguf = base->gguf;
    m->vocab = base->vocab;
    m->hp = base->hp;
    m->tok_embd = base->tok_embd;
    m->output = base->output;
    m->hp.n_layer = m->hp.n_layer_attn = 1; // the first NextN block (the one every draft runs)
    m->hp.n_layer_nextn = 0;
    const int il = base->hp.n_layer;
    const int64_t E = m->hp.n_embd;
    char n[96];
#define LNAME(s) (snprintf(n, sizeof n, "blk.%d.%s", il, s), n)
    ks_err e;
    model__layer *L = m->layers = calloc(1, sizeof *m->layers);
    if (!L) {
        e = ks_seterr(eb, KS_ERR_NOMEM, "NextN head");
        goto fail;
    }
    if ((e = load__vec(m, LNAME("attn_norm.weight"), E, true, &L->attn_norm, eb)) ||
        (e = load__std_layer(m, il, L, eb)) ||
        (e = load__mat(m, LNAME("nextn.eh_proj.weight"), 2 * E, E, &m->mtp_eh, eb)) ||
        (e = load__vec(m, LNAME("nextn.enorm.weight"), E, true, &m->mtp_enorm, eb)) ||
        (e = load__vec(m, LNAME("nextn.hnorm.weight"), E, true, &m->mtp_hnorm, eb)) ||
        (e = load__vec(m, LNAME("nextn.shared_head_norm.weight"), E, true, &m->output_norm, eb)))
        goto fail;
    // its own embedding and head where the file keeps them (else the model's)
    if (gguf_find_tensor(m->gguf, LNAME("nextn.embed_tokens.weight")) &&
        (e = load__mat(m, n, E, m->hp.n_vocab, &m->tok_embd, eb)))
        goto fail;
    if (gguf_find_tensor(m->gguf, LNAME("nextn.shared_head_head.weight"))) {
        if ((e = load__mat(m, n, E, m->hp.n_vocab, &m->output, eb))) goto fail;
        m->own_output = true;
        m->hp.tied_output = false;
    }
#undef LNAME
    L->kv_layer = 0;
    if ((e = load__layer_shapes(m, eb))) goto fail;
    load__repack_all(m);
    *out = m;
    return KS_OK;
fail:
    model_free(m);
    return e;
}

const model_hparams *model_hp(const model *m) { return &m->hp; }
const tok_vocab *model_vocab(const model *m) { return m->vocab; }
const gguf_file *model_gguf(const model *m) { return m->gguf; }

/* Bytes of w (elems: its K * N elements instead). */
static uint64_t load__mat_size(const model__mat *w, bool elems) {
    return (elems ? (uint64_t)w->K : (uint64_t)w->row_bytes) * (uint64_t)w->N;
}

/* The matmul weights one token runs through in the layers (bytes, or
 * elements with elems): every layer's attention and FFN once; of a mixture
 * of experts, the router, the n_expert_used experts a token runs and the
 * shared ones. Not the embedding row nor the output. */
static uint64_t load__layers_per_token(const model *m, bool elems) {
    uint64_t b = 0;
#define LOAD__SZ(w) load__mat_size(&(w), elems)
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model__layer *L = &m->layers[il];
        b += LOAD__SZ(L->ple_gate) + LOAD__SZ(L->ple_proj);
        b += LOAD__SZ(L->wq) + LOAD__SZ(L->wk) + LOAD__SZ(L->wv) + LOAD__SZ(L->wo) +
             LOAD__SZ(L->wq_a) + LOAD__SZ(L->wq_b) + LOAD__SZ(L->wkv_a) + LOAD__SZ(L->idx_q_b) +
             LOAD__SZ(L->idx_k) + LOAD__SZ(L->idx_proj) + LOAD__SZ(L->ssm_qkv) +
             LOAD__SZ(L->ssm_z) + LOAD__SZ(L->ssm_beta) + LOAD__SZ(L->ssm_alpha) +
             LOAD__SZ(L->ssm_out);
        if (L->wk_b) // every head's absorption matrices
            b += (uint64_t)m->hp.n_head * (LOAD__SZ(L->wk_b[0]) + LOAD__SZ(L->wv_b[0]));
        if (L->gate_exps) // the router, the experts a token runs, the shared one
            b += LOAD__SZ(L->gate_inp) +
                 (uint64_t)m->hp.n_expert_used *
                     (LOAD__SZ(L->gate_exps[0]) + LOAD__SZ(L->up_exps[0]) +
                      LOAD__SZ(L->down_exps[0])) +
                 LOAD__SZ(L->gate_sh) + LOAD__SZ(L->up_sh) + LOAD__SZ(L->down_sh) +
                 (L->moe_post_norm1 ? LOAD__SZ(L->w_gate) + LOAD__SZ(L->w_up) +
                                          LOAD__SZ(L->w_down)
                                    : 0); // gemma4: its dense FFN beside the experts
        else
            b += LOAD__SZ(L->w_gate) + LOAD__SZ(L->w_up) + LOAD__SZ(L->w_down);
    }
#undef LOAD__SZ
    return b;
}

uint64_t model_bytes_per_token(const model *m) {
    uint64_t b = m->tok_embd.row_bytes + load__mat_size(&m->output, false);
    if (m->ple_tok.data) b += m->ple_tok.row_bytes + load__mat_size(&m->ple_in, false);
    return b + load__layers_per_token(m, false);
}

uint64_t model_params_per_token(const model *m) {
    return load__layers_per_token(m, true) +
           (m->ple_tok.data ? load__mat_size(&m->ple_in, true) : 0);
}

int64_t model_state_rows(const model_hparams *hp) {
    if (!hp->ssm_state) return 0;
    // conv channels: qwen35's q | k | v, Mamba2's x | B | C; then the heads'
    // state rows (qwen35: S per head, Mamba2: head_dim), ssm_inner in all
    const int64_t S = hp->ssm_state, CD = 2 * (int64_t)hp->ssm_k_heads * S + hp->ssm_inner;
    return (int64_t)hp->n_layer_rec * ((hp->ssm_conv - 1) * CD / S + hp->ssm_inner);
}

kv_geom model_kv_geom(const model *m, int page_tokens, int kv_type) {
    kv_geom g = {.n_layer = m->hp.n_layer_attn,
                 .kv_dim = m->hp.kv_dim,
                 .page_tokens = page_tokens,
                 .kv_type = kv_type,
                 .planes = m->hp.kv_lora ? 1 : 2}; // MLA: V is read from the one row
    const int64_t rows = model_state_rows(&m->hp);
    if (rows) { // state rows of S floats, kv_page_bytes / (4 S) of them a page
        const uint64_t per = kv_page_bytes(&g) / (4u * (uint64_t)m->hp.ssm_state);
        g.state_pages = per ? (int)(((uint64_t)rows + per - 1) / per) : -1;
    }
    return g;
}

ks_err model_kv_type_check(const model *m, int kv_type, ks_errbuf *eb) {
    if (!kv_type_ok(kv_type))
        return ks_seterr(eb, KS_ERR_INVAL, "KV type %d is not one of " KV_TYPE_CHOICES, kv_type);
    uint32_t blk = ks_dtype_block_elems((uint32_t)kv_type);
    if (m->hp.kv_lora % (int)blk != 0) // MLA: V is the row's first kv_lora elements
        return ks_seterr(eb, KS_ERR_INVAL,
                         "KV type %s needs kv_lora_rank to be a multiple of %u; this model's is "
                         "%d: use --kv-type f16 or f32",
                         kv_type_name(kv_type), blk, m->hp.kv_lora);
    if (m->hp.idx_dim % (int)blk != 0) // the indexer key follows the attention key
        return ks_seterr(eb, KS_ERR_INVAL,
                         "KV type %s needs attention.indexer.key_length to be a multiple of %u; "
                         "this model's is %d: use --kv-type f16 or f32",
                         kv_type_name(kv_type), blk, m->hp.idx_dim);
    if (m->hp.head_dim % (int)blk != 0 || m->hp.head_dim_swa % (int)blk != 0)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "KV type %s needs head_dim to be a multiple of %u (its blocks must not "
                         "straddle attention heads); this model's head_dim is %d (sliding "
                         "layers: %d): use --kv-type f16 or f32",
                         kv_type_name(kv_type), blk, m->hp.head_dim, m->hp.head_dim_swa);
    return KS_OK;
}
