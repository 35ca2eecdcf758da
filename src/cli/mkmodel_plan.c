/* mkmodel_plan.c — the tensor plan of `kvseal mkmodel` for every
 * architecture: names, shapes, types and the noise each tensor gets, as
 * llama.cpp's converter writes such a file (cmd_mkmodel.c fills and writes
 * them). */
#include "mkmodel_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t mk__mix(uint64_t z) { // splitmix64 finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t mk__hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; // FNV-1a
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

/* Adds tensor fmt % layer of [ne0, ne1, ne2] (ne1 0: a vector; ne2 0: 2-D). */
static bool mk__add3(mk__plan *p, const mk__opts *o, ks_dtype type, int kind, float scale,
                     int64_t ne0, int64_t ne1, int64_t ne2, const char *fmt, int layer) {
    if (p->n_t == p->cap_t) {
        int cap = p->cap_t ? 2 * p->cap_t : 64;
        mk__tensor *t = realloc(p->t, (size_t)cap * sizeof *t);
        if (!t) return false;
        p->t = t;
        p->cap_t = cap;
    }
    mk__tensor *t = &p->t[p->n_t++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->n_dims = ne2 > 0 ? 3 : ne1 > 0 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 > 0 ? ne1 : 1;
    t->ne[2] = ne2 > 0 ? ne2 : 1;
    t->type = type;
    t->kind = kind;
    t->scale = scale;
    t->seed = mk__mix(o->seed ^ mk__hash_str(t->name));
    t->plan = p;
    if (ne0 > p->max_row) p->max_row = ne0;
    p->n_params += (uint64_t)ne0 * (uint64_t)t->ne[1] * (uint64_t)t->ne[2];
    return true;
}

/* mk__add3 of a vector or matrix. */
static bool mk__add(mk__plan *p, const mk__opts *o, ks_dtype type, int kind, float scale,
                    int64_t ne0, int64_t ne1, const char *fmt, int layer) {
    return mk__add3(p, o, type, kind, scale, ne0, ne1, 0, fmt, layer);
}

/* The tensors a NextN (multi-token prediction) block l adds to a whole
 * layer, named as llama.cpp's converter writes them (the optional
 * embed_tokens left out; shared_head_head with --nextn-head). */
static bool mk__add_nextn(mk__plan *p, const mk__opts *o, int l, int64_t n_vocab) {
    const int64_t E = o->n_embd;
    const float noise = 0.02f;
    if (o->nextn_head && !mk__add(p, o, o->type, MK__RAND, 4.0f / sqrtf((float)E), E, n_vocab,
                                  "blk.%d.nextn.shared_head_head.weight", l))
        return false;
    return mk__add(p, o, o->type, MK__RAND, 1.0f / sqrtf(2.0f * (float)E), 2 * E, E,
                   "blk.%d.nextn.eh_proj.weight", l) &&
           mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "blk.%d.nextn.enorm.weight", l) &&
           mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "blk.%d.nextn.hnorm.weight", l) &&
           mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0,
                   "blk.%d.nextn.shared_head_norm.weight", l);
}

/* qwen35's tensors: Gated DeltaNet layers, every attn_interval-th one
 * attention whose attn_q rows carry a gate per head, each with
 * post_attention_norm (its FFN's input norm) and a dense FFN. */
static bool mk__build_plan_qwen35(mk__plan *p, const mk__opts *o, int64_t n_vocab) {
    const int64_t E = o->n_embd, HD = o->head_dim, F = o->n_ff, S = o->ssm_state;
    const int64_t QD = o->n_head * HD, KD = o->n_head_kv * HD, Hv = o->ssm_v_heads;
    const int64_t VD = Hv * S, C = 2 * o->ssm_k_heads * S + VD;
    const ks_dtype W = o->type;
    const float s_in = 1.0f / sqrtf((float)E), res = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    const float noise = 0.02f, s_qk = s_in * (float)o->qk_gain;
    bool ok = mk__add(p, o, W, MK__RAND, 1.0f, E, n_vocab, "token_embd.weight", 0);
    for (int l = 0; ok && l < o->n_layer + o->n_nextn; l++) {
        // blocks from n_layer on are MTP (NextN) blocks: an attention layer and
        // the nextn tensors, counted in block_count as llama.cpp's converter writes
        const bool mtp = l >= o->n_layer;
        ok = mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "blk.%d.attn_norm.weight", l);
        if (ok && mtp)
            ok = mk__add_nextn(p, o, l, n_vocab);
        if (ok && !mtp && (l + 1) % o->attn_interval != 0) // a Gated DeltaNet layer
            ok = mk__add(p, o, W, MK__RAND, s_qk, E, C, "blk.%d.attn_qkv.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_in, E, VD, "blk.%d.attn_gate.weight", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__RAND, 1.0f / sqrtf((float)o->ssm_conv),
                         o->ssm_conv, C, "blk.%d.ssm_conv1d.weight", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.5f, Hv, 0, "blk.%d.ssm_dt.bias", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__NEG, 0.1f, Hv, 0, "blk.%d.ssm_a", l) &&
                 mk__add(p, o, W, MK__RAND, s_in, E, Hv, "blk.%d.ssm_beta.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_in, E, Hv, "blk.%d.ssm_alpha.weight", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, S, 0, "blk.%d.ssm_norm.weight", l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)VD), VD, E,
                         "blk.%d.ssm_out.weight", l);
        else if (ok)
            ok = mk__add(p, o, W, MK__RAND, s_qk, E, 2 * QD, "blk.%d.attn_q.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_qk, E, KD, "blk.%d.attn_k.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_in, E, KD, "blk.%d.attn_v.weight", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, HD, 0, "blk.%d.attn_q_norm.weight",
                         l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, HD, 0, "blk.%d.attn_k_norm.weight",
                         l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)QD), QD, E,
                         "blk.%d.attn_output.weight", l);
        ok = ok && mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0,
                           "blk.%d.post_attention_norm.weight", l);
        if (o->n_expert) { // qwen35moe: the router, the experts, the gated shared expert
            const int64_t X = o->n_expert, FX = o->n_ff_exp, SF = FX * o->n_shared;
            ok = ok &&
                 mk__add(p, o, KS_DTYPE_F32, MK__RAND, 4.0f * s_in, E, X,
                         "blk.%d.ffn_gate_inp.weight", l) &&
                 mk__add3(p, o, W, MK__RAND, s_in, E, FX, X, "blk.%d.ffn_gate_exps.weight", l) &&
                 mk__add3(p, o, W, MK__RAND, s_in, E, FX, X, "blk.%d.ffn_up_exps.weight", l) &&
                 // routed experts' down projections at 0.3 of the usual scale,
                 // as glm4moe's: a token routed the other way at a near tie (the
                 // engines' rounding decides such ties either way) then moves
                 // perplexity less (full scale: Q8_0 ratios 0.996-1.005 by seed)
                 mk__add3(p, o, W, MK__RAND, 0.3f * res / sqrtf((float)FX), FX, E, X,
                          "blk.%d.ffn_down_exps.weight", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__RAND, 2.0f * s_in, E, 0,
                         "blk.%d.ffn_gate_inp_shexp.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_in, E, SF, "blk.%d.ffn_gate_shexp.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_in, E, SF, "blk.%d.ffn_up_shexp.weight", l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)SF), SF, E,
                         "blk.%d.ffn_down_shexp.weight", l);
            continue;
        }
        ok = ok && mk__add(p, o, W, MK__RAND, s_in, E, F, "blk.%d.ffn_gate.weight", l) &&
             mk__add(p, o, W, MK__RAND, s_in, E, F, "blk.%d.ffn_up.weight", l) &&
             mk__add(p, o, W, MK__RAND, res / sqrtf((float)F), F, E, "blk.%d.ffn_down.weight", l);
    }
    ok = ok && mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "output_norm.weight", 0);
    if (ok && !o->tied)
        ok = mk__add(p, o, W, MK__RAND, 4.0f / sqrtf((float)E), E, n_vocab, "output.weight", 0);
    return ok;
}

/* nemotron_h's tensors, as llama.cpp's converter writes Nemotron-H: one
 * norm and one mixer per layer (o->pattern): Mamba2 (ssm_in rows z | x B C
 * | dt, the convolution and its bias, dt bias, A = -exp(A_log) and D as
 * {1, heads}, the gated norm as {d_inner / groups, groups}, ssm_out),
 * attention without RoPE, or an MLP of up and down. */
static bool mk__build_plan_nh(mk__plan *p, const mk__opts *o, int64_t n_vocab) {
    const int64_t E = o->n_embd, HD = o->head_dim, F = o->n_ff, S = o->ssm_state;
    const int64_t QD = o->n_head * HD, KD = o->n_head_kv * HD, H = o->ssm_v_heads;
    const int64_t G = o->ssm_k_heads, DI = H * o->ssm_head_dim, C = DI + 2 * G * S;
    const ks_dtype W = o->type;
    const float s_in = 1.0f / sqrtf((float)E), res = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    const float noise = 0.02f, s_qk = s_in * (float)o->qk_gain;
    bool ok = mk__add(p, o, W, MK__RAND, 1.0f, E, n_vocab, "token_embd.weight", 0);
    for (int l = 0; ok && l < o->n_layer; l++) {
        ok = mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "blk.%d.attn_norm.weight", l);
        const char k = o->pattern[l];
        if (ok && k == 'M')
            ok = mk__add(p, o, W, MK__RAND, s_in, E, DI + C + H, "blk.%d.ssm_in.weight", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__RAND, 1.0f / sqrtf((float)o->ssm_conv),
                         o->ssm_conv, C, "blk.%d.ssm_conv1d.weight", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.1f, C, 0, "blk.%d.ssm_conv1d.bias", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.5f, H, 0, "blk.%d.ssm_dt.bias", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__NEG, 0.1f, 1, H, "blk.%d.ssm_a", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__ONES, 0.2f, 1, H, "blk.%d.ssm_d", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, DI / G, G, "blk.%d.ssm_norm.weight",
                         l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)DI), DI, E,
                         "blk.%d.ssm_out.weight", l);
        else if (ok && k == '*')
            ok = mk__add(p, o, W, MK__RAND, s_qk, E, QD, "blk.%d.attn_q.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_qk, E, KD, "blk.%d.attn_k.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_in, E, KD, "blk.%d.attn_v.weight", l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)QD), QD, E,
                         "blk.%d.attn_output.weight", l);
        else if (ok)
            ok = mk__add(p, o, W, MK__RAND, s_in, E, F, "blk.%d.ffn_up.weight", l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)F), F, E, "blk.%d.ffn_down.weight",
                         l);
    }
    ok = ok && mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "output_norm.weight", 0);
    if (ok && !o->tied)
        ok = mk__add(p, o, W, MK__RAND, 4.0f / sqrtf((float)E), E, n_vocab, "output.weight", 0);
    return ok;
}

/* gpt-oss's tensors, as llama.cpp's converter names them: biased Q/K/V and
 * attn_output, a sink logit per head, post_attention_norm (the FFN's input
 * norm), a biased router and experts with biases (2-D: a row per expert).
 * Sinks uniform with std 1 (the scores' scale: they take a visible share
 * of the softmax); the gate and up biases std 1.5, so that a few of the
 * experts' gate and up values pass the SwiGLU's clamp at 7. */
static bool mk__build_plan_gptoss(mk__plan *p, const mk__opts *o, int64_t n_vocab) {
    const int64_t E = o->n_embd, HD = o->head_dim, QD = o->n_head * HD, KD = o->n_head_kv * HD;
    const int64_t X = o->n_expert, FX = o->n_ff_exp;
    const ks_dtype W = o->type;
    const float s_in = 1.0f / sqrtf((float)E), res = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    const float noise = 0.02f, s_qk = s_in * (float)o->qk_gain;
    bool ok = mk__add(p, o, W, MK__RAND, 1.0f, E, n_vocab, "token_embd.weight", 0);
    for (int l = 0; ok && l < o->n_layer; l++)
        ok = mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "blk.%d.attn_norm.weight", l) &&
             mk__add(p, o, W, MK__RAND, s_qk, E, QD, "blk.%d.attn_q.weight", l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.1f, QD, 0, "blk.%d.attn_q.bias", l) &&
             mk__add(p, o, W, MK__RAND, s_qk, E, KD, "blk.%d.attn_k.weight", l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.1f, KD, 0, "blk.%d.attn_k.bias", l) &&
             mk__add(p, o, W, MK__RAND, s_in, E, KD, "blk.%d.attn_v.weight", l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.1f, KD, 0, "blk.%d.attn_v.bias", l) &&
             mk__add(p, o, W, MK__RAND, res / sqrtf((float)QD), QD, E,
                     "blk.%d.attn_output.weight", l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.1f * res, E, 0, "blk.%d.attn_output.bias",
                     l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__RAND, 1.0f, o->n_head, 0, "blk.%d.attn_sinks.weight",
                     l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0,
                     "blk.%d.post_attention_norm.weight", l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__RAND, 4.0f * s_in, E, X, "blk.%d.ffn_gate_inp.weight",
                     l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.5f, X, 0, "blk.%d.ffn_gate_inp.bias", l) &&
             mk__add3(p, o, W, MK__RAND, s_in, E, FX, X, "blk.%d.ffn_gate_exps.weight", l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__RAND, 1.5f, FX, X, "blk.%d.ffn_gate_exps.bias", l) &&
             mk__add3(p, o, W, MK__RAND, s_in, E, FX, X, "blk.%d.ffn_up_exps.weight", l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__RAND, 1.5f, FX, X, "blk.%d.ffn_up_exps.bias", l) &&
             mk__add3(p, o, W, MK__RAND, 0.3f * res / sqrtf((float)FX), FX, E, X,
                      "blk.%d.ffn_down_exps.weight", l) &&
             mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.1f * res, E, X, "blk.%d.ffn_down_exps.bias",
                     l);
    ok = ok && mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "output_norm.weight", 0);
    if (ok && !o->tied)
        ok = mk__add(p, o, W, MK__RAND, 4.0f / sqrtf((float)E), E, n_vocab, "output.weight", 0);
    return ok;
}

/* The llama.cpp tensor set for o, in llama.cpp's file order. */
/* nomic-bert's tensors: bert's without position_embd (RoPE instead) and
 * without biases, Q/K/V fused in attn_qkv, a SwiGLU FFN (ffn_gate). */
static bool mk__build_plan_nomic(mk__plan *p, const mk__opts *o, int64_t n_vocab,
                                 int64_t n_types) {
    const int64_t E = o->n_embd, F = o->n_ff, QD = o->n_head * o->head_dim;
    const ks_dtype W = o->type, F32 = KS_DTYPE_F32;
    const float s_in = 1.0f / sqrtf((float)E), noise = 0.02f;
    bool ok = mk__add(p, o, W, MK__RAND, 1.0f, E, n_vocab, "token_embd.weight", 0) &&
              mk__add(p, o, F32, MK__RAND, 0.3f, E, n_types, "token_types.weight", 0) &&
              mk__add(p, o, F32, MK__ONES, noise, E, 0, "token_embd_norm.weight", 0) &&
              mk__add(p, o, F32, MK__RAND, noise, E, 0, "token_embd_norm.bias", 0);
    for (int l = 0; ok && l < o->n_layer; l++)
        ok = mk__add(p, o, W, MK__RAND, s_in * (float)o->qk_gain, E, 3 * QD,
                     "blk.%d.attn_qkv.weight", l) &&
             mk__add(p, o, W, MK__RAND, 1.0f / sqrtf((float)QD), QD, E,
                     "blk.%d.attn_output.weight", l) &&
             mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.attn_output_norm.weight", l) &&
             mk__add(p, o, F32, MK__RAND, noise, E, 0, "blk.%d.attn_output_norm.bias", l) &&
             mk__add(p, o, W, MK__RAND, s_in, E, F, "blk.%d.ffn_up.weight", l) &&
             mk__add(p, o, W, MK__RAND, s_in, E, F, "blk.%d.ffn_gate.weight", l) &&
             mk__add(p, o, W, MK__RAND, 1.0f / sqrtf((float)F), F, E, "blk.%d.ffn_down.weight",
                     l) &&
             mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.layer_output_norm.weight", l) &&
             mk__add(p, o, F32, MK__RAND, noise, E, 0, "blk.%d.layer_output_norm.bias", l);
    return ok;
}

/* bert's tensors (llama.cpp's LLM_ARCH_BERT names): token, token-type and
 * learned position embeddings with a LayerNorm, then per layer Q/K/V/O with
 * biases, the post-attention LayerNorm (attn_output_norm), a GELU FFN with
 * biases and the post-FFN LayerNorm (layer_output_norm); no output head. */
static bool mk__build_plan_bert(mk__plan *p, const mk__opts *o, int64_t n_vocab,
                                int64_t n_types) {
    if (!strcmp(o->arch, "nomic-bert")) return mk__build_plan_nomic(p, o, n_vocab, n_types);
    const int64_t E = o->n_embd, F = o->n_ff, QD = o->n_head * o->head_dim;
    const ks_dtype W = o->type, F32 = KS_DTYPE_F32;
    const float s_in = 1.0f / sqrtf((float)E), noise = 0.02f, s_qk = s_in * (float)o->qk_gain;
    bool ok = mk__add(p, o, W, MK__RAND, 1.0f, E, n_vocab, "token_embd.weight", 0) &&
              mk__add(p, o, F32, MK__RAND, 0.3f, E, n_types, "token_types.weight", 0) &&
              mk__add(p, o, F32, MK__RAND, 0.3f, E, o->n_ctx, "position_embd.weight", 0) &&
              mk__add(p, o, F32, MK__ONES, noise, E, 0, "token_embd_norm.weight", 0) &&
              mk__add(p, o, F32, MK__RAND, noise, E, 0, "token_embd_norm.bias", 0);
    static const char *const qkv[3][2] = {{"blk.%d.attn_q.weight", "blk.%d.attn_q.bias"},
                                          {"blk.%d.attn_k.weight", "blk.%d.attn_k.bias"},
                                          {"blk.%d.attn_v.weight", "blk.%d.attn_v.bias"}};
    for (int l = 0; ok && l < o->n_layer; l++) {
        for (int i = 0; ok && i < 3; i++)
            ok = mk__add(p, o, W, MK__RAND, i < 2 ? s_qk : s_in, E, QD, qkv[i][0], l) &&
                 mk__add(p, o, F32, MK__RAND, noise, QD, 0, qkv[i][1], l);
        ok = ok &&
             mk__add(p, o, W, MK__RAND, 1.0f / sqrtf((float)QD), QD, E,
                     "blk.%d.attn_output.weight", l) &&
             mk__add(p, o, F32, MK__RAND, noise, E, 0, "blk.%d.attn_output.bias", l) &&
             mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.attn_output_norm.weight", l) &&
             mk__add(p, o, F32, MK__RAND, noise, E, 0, "blk.%d.attn_output_norm.bias", l) &&
             mk__add(p, o, W, MK__RAND, s_in, E, F, "blk.%d.ffn_up.weight", l) &&
             mk__add(p, o, F32, MK__RAND, noise, F, 0, "blk.%d.ffn_up.bias", l) &&
             mk__add(p, o, W, MK__RAND, 1.0f / sqrtf((float)F), F, E, "blk.%d.ffn_down.weight",
                     l) &&
             mk__add(p, o, F32, MK__RAND, noise, E, 0, "blk.%d.ffn_down.bias", l) &&
             mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.layer_output_norm.weight", l) &&
             mk__add(p, o, F32, MK__RAND, noise, E, 0, "blk.%d.layer_output_norm.bias", l);
    }
    return ok;
}

/* Whether gemma4 layer l slides (mk__opts' swa_period). */
bool mk__g4_swa(const mk__opts *o, long l) {
    return l % o->swa_period != o->swa_period - 1;
}

/* gemma4 layer l's FFN width: twice n_ff on a shared KV layer. */
int64_t mk__g4_ff(const mk__opts *o, long l) {
    return l >= o->n_layer - o->n_kv_shared ? 2 * o->n_ff : o->n_ff;
}

/* gemma4's tensors, as llama.cpp's converter writes a 31B-style dense
 * model: per layer Q/K/V (no attn_v on a full layer with k_eq_v), the Q/K
 * norms of the layer's head size, post-norms of both sublayers, a GELU FFN
 * and layer_output_scale (uniform in [0.48, 1.52]); rope_freqs for the full
 * layers (MK__PROP). E2B / E4B style: no K/V tensors on the shared KV
 * layers, and the per-layer embedding's tensors (model.h's gemma4 comment). */
static bool mk__build_plan_gemma4(mk__plan *p, const mk__opts *o, int64_t n_vocab) {
    const int64_t E = o->n_embd, PL = o->n_embd_pl, PLA = PL * o->n_layer;
    const ks_dtype W = o->type, F32 = KS_DTYPE_F32;
    const float s_in = 1.0f / sqrtf((float)E), res = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    const float noise = 0.02f, s_qk = s_in * (float)o->qk_gain;
    bool ok = mk__add(p, o, W, MK__RAND, o->tied ? 4.0f / sqrtf((float)E) : 1.0f, E, n_vocab,
                      "token_embd.weight", 0) &&
              mk__add(p, o, F32, MK__PROP, 0.0f, o->head_dim_full / 2, 0, "rope_freqs.weight", 0);
    if (ok && PL)
        ok = mk__add(p, o, W, MK__RAND, 1.0f / sqrtf((float)PL), PLA, n_vocab,
                     "per_layer_token_embd.weight", 0) &&
             mk__add(p, o, W, MK__RAND, s_in, E, PLA, "per_layer_model_proj.weight", 0) &&
             mk__add(p, o, F32, MK__ONES, noise, PL, 0, "per_layer_proj_norm.weight", 0);
    for (int l = 0; ok && l < o->n_layer; l++) {
        const bool swa = mk__g4_swa(o, l), own = l < o->n_layer - o->n_kv_shared;
        const int64_t F = mk__g4_ff(o, l);
        const int64_t D = swa ? o->head_dim : o->head_dim_full, QD = o->n_head * D;
        const int64_t KD = (swa ? o->n_head_kv : o->n_head_kv_full) * D;
        ok = mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.attn_norm.weight", l) &&
             mk__add(p, o, W, MK__RAND, s_qk, E, QD, "blk.%d.attn_q.weight", l) &&
             (!own || mk__add(p, o, W, MK__RAND, s_qk, E, KD, "blk.%d.attn_k.weight", l)) &&
             (!own || (!swa && o->k_eq_v) ||
              mk__add(p, o, W, MK__RAND, s_in, E, KD, "blk.%d.attn_v.weight", l)) &&
             mk__add(p, o, F32, MK__ONES, noise, D, 0, "blk.%d.attn_q_norm.weight", l) &&
             (!own ||
              mk__add(p, o, F32, MK__ONES, noise, D, 0, "blk.%d.attn_k_norm.weight", l)) &&
             mk__add(p, o, W, MK__RAND, res / sqrtf((float)QD), QD, E, "blk.%d.attn_output.weight",
                     l) &&
             mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.post_attention_norm.weight", l) &&
             mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.ffn_norm.weight", l) &&
             mk__add(p, o, W, MK__RAND, s_in, E, F, "blk.%d.ffn_gate.weight", l) &&
             mk__add(p, o, W, MK__RAND, s_in, E, F, "blk.%d.ffn_up.weight", l) &&
             mk__add(p, o, W, MK__RAND, res / sqrtf((float)F), F, E, "blk.%d.ffn_down.weight", l) &&
             mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.post_ffw_norm.weight", l) &&
             mk__add(p, o, F32, MK__ONES, 0.3f, 1, 0, "blk.%d.layer_output_scale.weight", l);
        const int64_t X = o->n_expert, FX = o->n_ff_exp;
        if (ok && X) // 26B-A4B: experts beside the dense FFN, with their own norms
            ok = mk__add(p, o, F32, MK__RAND, 4.0f, E, X, "blk.%d.ffn_gate_inp.weight", l) &&
                 mk__add(p, o, F32, MK__ONES, 0.1f, E, 0, "blk.%d.ffn_gate_inp.scale", l) &&
                 mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.pre_ffw_norm_2.weight", l) &&
                 mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.post_ffw_norm_1.weight", l) &&
                 mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.post_ffw_norm_2.weight", l) &&
                 (o->gate_up_exps
                      ? mk__add3(p, o, W, MK__RAND, s_in, E, 2 * FX, X,
                                 "blk.%d.ffn_gate_up_exps.weight", l)
                      : mk__add3(p, o, W, MK__RAND, s_in, E, FX, X, "blk.%d.ffn_gate_exps.weight",
                                 l) &&
                            mk__add3(p, o, W, MK__RAND, s_in, E, FX, X,
                                     "blk.%d.ffn_up_exps.weight", l)) &&
                 mk__add3(p, o, W, MK__RAND, res / sqrtf((float)FX), FX, E, X,
                          "blk.%d.ffn_down_exps.weight", l) &&
                 mk__add(p, o, F32, MK__ONES, 0.5f, X, 0, "blk.%d.ffn_down_exps.scale", l);
        if (ok && PL)
            ok = mk__add(p, o, W, MK__RAND, s_in, E, PL, "blk.%d.inp_gate.weight", l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)PL), PL, E, "blk.%d.proj.weight",
                         l) &&
                 mk__add(p, o, F32, MK__ONES, noise, E, 0, "blk.%d.post_norm.weight", l);
    }
    ok = ok && mk__add(p, o, F32, MK__ONES, noise, E, 0, "output_norm.weight", 0);
    if (ok && !o->tied)
        ok = mk__add(p, o, W, MK__RAND, 4.0f / sqrtf((float)E), E, n_vocab, "output.weight", 0);
    return ok;
}

bool mk__build_plan(mk__plan *p, const mk__opts *o, int64_t n_vocab) {
    if (!strcmp(o->arch, "gemma4")) return mk__build_plan_gemma4(p, o, n_vocab);
    if (o->pattern) return mk__build_plan_nh(p, o, n_vocab);
    if (o->ssm_state) return mk__build_plan_qwen35(p, o, n_vocab);
    if (!strcmp(o->arch, "gpt-oss")) return mk__build_plan_gptoss(p, o, n_vocab);
    if (!strcmp(o->arch, "bert") || !strcmp(o->arch, "nomic-bert"))
        return mk__build_plan_bert(p, o, n_vocab, o->n_types);
    const int64_t E = o->n_embd, HD = o->head_dim, F = o->n_ff;
    const int64_t QD = o->n_head * HD, KD = o->n_head_kv * HD;
    const ks_dtype W = o->type;
    const float s_in = 1.0f / sqrtf((float)E), res = 1.0f / sqrtf(2.0f * (float)o->n_layer);
    const bool qwen2 = !strcmp(o->arch, "qwen2");
    const bool qwen3 = !strcmp(o->arch, "qwen3") || !strcmp(o->arch, "qwen3moe");
    const int64_t X = o->n_expert, FX = o->n_ff_exp;
    const bool phi3 = !strcmp(o->arch, "phi3"); // fused QKV and gate/up rows
    const bool glm4 = !strcmp(o->arch, "glm4"); // QKV biases, fused gate/up, post-norms
    // glm4moe: QKV biases, its post_attention_norm before the FFN, leading
    // dense layers, sigmoid router with a selection bias, a shared expert
    const bool glm4moe = !strcmp(o->arch, "glm4moe");
    // ... and the deepseek2 family's MoE layers, built the same way (DeepSeek-V3 style)
    const bool dsmoe = glm4moe || (o->kv_lora && X);
    const bool gemma = !strncmp(o->arch, "gemma", 5), gemma3 = !strcmp(o->arch, "gemma3");
    const float noise = 0.02f, s_qk = s_in * (float)o->qk_gain;
    bool ok = mk__add(p, o, W, MK__RAND, o->tied ? 4.0f / sqrtf((float)E) : 1.0f, E, n_vocab,
                      "token_embd.weight", 0);
    if (ok && o->rope_freqs)
        ok = mk__add(p, o, KS_DTYPE_F32, MK__ONES, 0.5f, HD / 2, 0, "rope_freqs.weight", 0);
    if (ok &&
        o->longrope) // phi3's LongRoPE: short factors in [0.91, 1.09], long ones in [0.13, 1.87]
        ok = mk__add(p, o, KS_DTYPE_F32, MK__ONES, 0.05f, HD / 2, 0, "rope_factors_short.weight",
                     0) &&
             mk__add(p, o, KS_DTYPE_F32, MK__ONES, 0.5f, HD / 2, 0, "rope_factors_long.weight", 0);
    for (int l = 0; ok && l < o->n_layer + o->n_nextn; l++) {
        const bool moe = X && l >= o->n_dense;
        ok = mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "blk.%d.attn_norm.weight", l);
        if (ok && o->kv_lora) { // MLA: low-rank Q, the latent + rope key, per-head k_b / v_b
            const int64_t KL = o->kv_lora, QL = o->q_lora, R = o->n_rot, NP = o->qk_nope;
            const int64_t QH = o->n_head * (NP + R), VH = o->v_head;
            if (QL)
                ok = mk__add(p, o, W, MK__RAND, s_in, E, QL, "blk.%d.attn_q_a.weight", l) &&
                     mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, QL, 0,
                             "blk.%d.attn_q_a_norm.weight", l) &&
                     mk__add(p, o, W, MK__RAND, s_qk * sqrtf((float)E / (float)QL), QL, QH,
                             "blk.%d.attn_q_b.weight", l);
            else
                ok = mk__add(p, o, W, MK__RAND, s_qk, E, QH, "blk.%d.attn_q.weight", l);
            ok = ok &&
                 mk__add(p, o, W, MK__RAND, s_qk, E, KL + R, "blk.%d.attn_kv_a_mqa.weight", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, KL, 0, "blk.%d.attn_kv_a_norm.weight",
                         l) &&
                 mk__add3(p, o, W, MK__RAND, 1.0f / sqrtf((float)NP), NP, KL, o->n_head,
                          "blk.%d.attn_k_b.weight", l) &&
                 mk__add3(p, o, W, MK__RAND, 1.0f / sqrtf((float)KL), KL, VH, o->n_head,
                          "blk.%d.attn_v_b.weight", l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)(o->n_head * VH)), o->n_head * VH, E,
                         "blk.%d.attn_output.weight", l);
            const int64_t NI = o->idx_heads, I = o->idx_dim;
            if (ok && o->idx_topk) // the indexer: queries from the bottleneck, key and weights
                ok = mk__add(p, o, W, MK__RAND, s_qk * sqrtf((float)E / (float)QL), QL, NI * I,
                             "blk.%d.indexer.attn_q_b.weight", l) &&
                     mk__add(p, o, W, MK__RAND, s_qk, E, I, "blk.%d.indexer.attn_k.weight", l) &&
                     mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, I, 0,
                             "blk.%d.indexer.k_norm.weight", l) &&
                     mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.1f, I, 0, "blk.%d.indexer.k_norm.bias",
                             l) &&
                     mk__add(p, o, W, MK__RAND, s_in, E, NI, "blk.%d.indexer.proj.weight", l);
        } else if (ok && phi3)
            ok = mk__add(p, o, W, MK__RAND, s_qk, E, QD + 2 * KD, "blk.%d.attn_qkv.weight", l);
        else if (ok)
            ok = mk__add(p, o, W, MK__RAND, s_qk, E, QD, "blk.%d.attn_q.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_qk, E, KD, "blk.%d.attn_k.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_in, E, KD, "blk.%d.attn_v.weight", l);
        if (ok && (qwen2 || glm4 || glm4moe))
            ok = mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.1f, QD, 0, "blk.%d.attn_q.bias", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.1f, KD, 0, "blk.%d.attn_k.bias", l) &&
                 mk__add(p, o, KS_DTYPE_F32, MK__RAND, 0.1f, KD, 0, "blk.%d.attn_v.bias", l);
        if (ok && (qwen3 || gemma3 || (glm4moe && o->qk_norm)))
            ok =
                mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, HD, 0, "blk.%d.attn_q_norm.weight",
                        l) &&
                mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, HD, 0, "blk.%d.attn_k_norm.weight", l);
        if (!o->kv_lora)
            ok = ok && mk__add(p, o, W, MK__RAND, res / sqrtf((float)QD), QD, E,
                               "blk.%d.attn_output.weight", l);
        // norms of the sublayer outputs (gemma's: 1 + w already); glm4moe's
        // post_attention_norm is its FFN's input norm, and it has no ffn_norm
        if (ok && (gemma || glm4 || glm4moe))
            ok = mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0,
                         "blk.%d.post_attention_norm.weight", l);
        if (ok && !glm4moe)
            ok = mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "blk.%d.ffn_norm.weight", l);
        if (ok && !moe && (phi3 || glm4))
            ok = mk__add(p, o, W, MK__RAND, s_in, E, 2 * F, "blk.%d.ffn_up.weight", l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)F), F, E, "blk.%d.ffn_down.weight",
                         l);
        else if (ok && !moe)
            ok = mk__add(p, o, W, MK__RAND, s_in, E, F, "blk.%d.ffn_gate.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_in, E, F, "blk.%d.ffn_up.weight", l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)F), F, E, "blk.%d.ffn_down.weight",
                         l);
        // router logits of std ~4 (a clear choice), experts as 3-D tensors.
        // glm4moe: sigmoid probabilities of logits of std ~2, so they spread
        // over (0, 1), and a selection bias uniform in [-1.7, 1.7] that
        // decides most tokens' choice with them (ignoring it changes the
        // routing of most tokens); its routed experts' down projections at 0.3
        // of the usual scale, so that their sum, weighted to 2.5 in all
        // (expert_weights_scale), is about as large as the shared expert's
        // output. With full-scale ones a token routed the other way at a near
        // tie moved llama.cpp's Q8_0 / Q4_K_M perplexity by up to 1-2% (the
        // engines' rounding decides such ties either way); at 0.3, 0.5%.
        if (ok && moe)
            ok = mk__add(p, o, KS_DTYPE_F32, MK__RAND, (dsmoe ? 2.0f : 4.0f) * s_in, E, X,
                         "blk.%d.ffn_gate_inp.weight", l);
        if (ok && moe && dsmoe)
            ok = mk__add(p, o, KS_DTYPE_F32, MK__RAND, 1.0f, X, 0, "blk.%d.exp_probs_b.bias", l);
        if (ok && moe)
            ok = mk__add3(p, o, W, MK__RAND, s_in, E, FX, X, "blk.%d.ffn_gate_exps.weight", l) &&
                 mk__add3(p, o, W, MK__RAND, s_in, E, FX, X, "blk.%d.ffn_up_exps.weight", l) &&
                 mk__add3(p, o, W, MK__RAND, (dsmoe ? 0.3f : 1.0f) * res / sqrtf((float)FX), FX, E,
                          X, "blk.%d.ffn_down_exps.weight", l);
        const int64_t SF = FX * o->n_shared; // the shared experts as one FFN
        if (ok && moe && dsmoe && SF)
            ok = mk__add(p, o, W, MK__RAND, s_in, E, SF, "blk.%d.ffn_gate_shexp.weight", l) &&
                 mk__add(p, o, W, MK__RAND, s_in, E, SF, "blk.%d.ffn_up_shexp.weight", l) &&
                 mk__add(p, o, W, MK__RAND, res / sqrtf((float)SF), SF, E,
                         "blk.%d.ffn_down_shexp.weight", l);
        if (ok && (gemma || glm4))
            ok = mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "blk.%d.post_ffw_norm.weight",
                         l);
        // a NextN (multi-token prediction) block: a whole layer plus these
        // (mk__add_nextn)
        if (ok && l >= o->n_layer)
            ok = mk__add_nextn(p, o, l, n_vocab);
    }
    ok = ok && mk__add(p, o, KS_DTYPE_F32, MK__ONES, noise, E, 0, "output_norm.weight", 0);
    if (ok && !o->tied)
        ok = mk__add(p, o, W, MK__RAND, 4.0f / sqrtf((float)E), E, n_vocab, "output.weight", 0);
    return ok;
}
