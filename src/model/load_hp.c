/* load_hp.c — a GGUF model's hyper-parameters: the `<arch>.*` keys of every
 * architecture read and checked into model_hparams (load.c binds the
 * weight tensors they describe). Errors name the file and the key. */
#include "model_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Metadata

typedef struct {
    const gguf_file *f;
    const char *arch;
    ks_errbuf *eb;
} load__ctx;

static ks_err load__u32(load__ctx *c, const char *suffix, bool required, uint32_t dflt,
                        int32_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", c->arch, suffix);
    if (!gguf_get(c->f, key)) {
        if (required)
            return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: missing required key '%s'",
                             gguf_path(c->f), key);
        *out = (int32_t)dflt;
        return KS_OK;
    }
    uint32_t v;
    ks_err e = gguf_get_u32(c->f, key, &v, c->eb);
    if (e) return e;
    if (v > INT32_MAX || (required && v == 0))
        return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: key '%s' has invalid value %u", gguf_path(c->f),
                         key, v);
    *out = (int32_t)v;
    return KS_OK;
}

static ks_err load__f32(load__ctx *c, const char *suffix, float dflt, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", c->arch, suffix);
    if (!gguf_get(c->f, key)) {
        *out = dflt;
        return KS_OK;
    }
    return gguf_get_f32(c->f, key, out, c->eb);
}

/* DeepSeek-V3-style routing and layer plan (glm4moe: GLM-4.5/4.6/4.7; the
 * deepseek2 family), as llama.cpp reads them: the top-k weights renormalized
 * only where expert_weights_norm says so, then multiplied by
 * expert_weights_scale (absent or 0: not scaled); a required
 * expert_shared_count (kvseal runs 0 or 1 shared expert: DeepSeek-V3's,
 * GLM's; V2's two are refused); leading_dense_block_count dense layers
 * first; expert groups (expert_group_count, expert_group_used_count): the
 * top-k is drawn from the used groups whose two best biased scores sum
 * highest. */
static ks_err load__moe_ds(load__ctx *c, model_hparams *hp) {
    const char *path = gguf_path(c->f);
    char key[128];
    ks_err e;
    bool norm = false;
    snprintf(key, sizeof key, "%s.expert_weights_norm", c->arch);
    if (gguf_get(c->f, key) && (e = gguf_get_bool(c->f, key, &norm, c->eb))) return e;
    hp->expert_norm = norm;
    float scale;
    if ((e = load__f32(c, "expert_weights_scale", 0.0f, &scale))) return e;
    if (!(scale >= 0.0f && isfinite(scale)))
        return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: %s.expert_weights_scale %g must be >= 0", path,
                         c->arch, (double)scale);
    hp->expert_scale = scale == 0.0f ? 1.0f : scale;
    snprintf(key, sizeof key, "%s.expert_shared_count", c->arch);
    if (!gguf_get(c->f, key)) // 0 is valid, so load__u32's `required` (> 0) does not fit
        return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: missing required key '%s'", path, key);
    int32_t groups, used;
    if ((e = load__u32(c, "expert_shared_count", false, 0, &hp->n_expert_shared)) ||
        (e = load__u32(c, "leading_dense_block_count", false, 0, &hp->n_layer_dense)) ||
        (e = load__u32(c, "expert_group_count", false, 1, &groups)) ||
        (e = load__u32(c, "expert_group_used_count", false, (uint32_t)groups, &used)))
        return e;
    if (hp->n_expert_shared > MODEL_MAX_SHARED_EXPERTS)
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: %s.expert_shared_count %d: at most %d shared experts are supported",
                         path, c->arch, hp->n_expert_shared, MODEL_MAX_SHARED_EXPERTS);
    if (groups > 1 &&
        (hp->n_expert % groups || used < 1 || used > groups || hp->n_expert / groups < 2 ||
         groups > MODEL_MAX_EXPERT_GROUPS || used * (hp->n_expert / groups) < hp->n_expert_used))
        return ks_seterr(c->eb, KS_ERR_FORMAT,
                         "%s: %s.expert_group_count %d / expert_group_used_count %d: want at "
                         "most %d groups of 2 or more of the %d experts, 1..groups of them used, "
                         "holding expert_used_count",
                         path, c->arch, groups, used, MODEL_MAX_EXPERT_GROUPS, hp->n_expert);
    hp->n_expert_groups = groups > 1 && used < groups ? groups : 0; // all groups used: no limit
    hp->n_group_used = used;
    return KS_OK;
}

/* qwen35moe's experts, as llama.cpp reads them: each expert_feed_forward_length
 * wide (default feed_forward_length / expert_used_count), the top-k
 * renormalized, scaled by expert_weights_scale where set; one shared expert
 * expert_shared_feed_forward_length wide (default feed_forward_length),
 * run as expert_shared_count-style S experts' width (a multiple of an
 * expert's) and weighted per token by sigmoid(ffn_gate_inp_shexp . x). */
static ks_err load__moe_q35(load__ctx *c, model_hparams *hp) {
    int32_t fx, fs;
    float scale;
    ks_err e;
    if ((e = load__u32(c, "feed_forward_length", false, 0, &hp->n_ff)) ||
        (e = load__u32(c, "expert_feed_forward_length", false,
                       (uint32_t)(hp->n_ff / (hp->n_expert_used ? hp->n_expert_used : 1)), &fx)) ||
        (e = load__u32(c, "expert_shared_feed_forward_length", false, (uint32_t)hp->n_ff, &fs)) ||
        (e = load__f32(c, "expert_weights_scale", 0.0f, &scale)))
        return e;
    if (fx < 1 || fs < fx || fs % fx || fs / fx > MODEL_MAX_SHARED_EXPERTS || !(scale >= 0.0f))
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: %s experts %d wide, shared expert %d wide: kvseal runs a shared "
                         "expert 1..%d times an expert's width",
                         gguf_path(c->f), c->arch, fx, fs, MODEL_MAX_SHARED_EXPERTS);
    hp->n_ff_exp = fx;
    hp->n_expert_shared = fs / fx;
    hp->expert_scale = scale == 0.0f ? 1.0f : scale;
    return KS_OK;
}

/* Mixture-of-experts keys: expert_count (0 or absent: dense), the top-k
 * expert_used_count, each expert's expert_feed_forward_length (default
 * feed_forward_length) and the gating function. llama (Mixtral) and
 * qwen3moe renormalize the top-k weights; glm4moe and the deepseek2 family
 * read more (load__moe_ds) and need expert_feed_forward_length; glm4moe and
 * glm-dsa gate by sigmoid unless told otherwise. */
static ks_err load__experts(load__ctx *c, model_hparams *hp) {
    ks_err e;
    const bool glm = hp->arch == MODEL_ARCH_GLM4MOE;
    const bool q35 = hp->arch == MODEL_ARCH_QWEN35MOE;
    const bool oss = hp->arch == MODEL_ARCH_GPT_OSS;
    // DeepSeek-V3-style MoE (a shared expert, a selection bias, groups): glm4moe, the MLA family
    const bool ds = glm || model__is_mla(hp->arch);
    hp->gating = MODEL_GATING_SOFTMAX;
    hp->expert_norm = true;
    hp->expert_scale = 1.0f;
    if ((e = load__u32(c, "expert_count", hp->arch == MODEL_ARCH_QWEN3MOE || glm || q35 || oss, 0,
                       &hp->n_expert)))
        return e;
    if (hp->n_expert == 0) return KS_OK;
    if (hp->arch != MODEL_ARCH_LLAMA && hp->arch != MODEL_ARCH_MISTRAL3 &&
        hp->arch != MODEL_ARCH_QWEN3MOE && hp->arch != MODEL_ARCH_GEMMA4 && !glm && !q35 && !oss &&
        !model__is_mla(hp->arch))
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: %s.expert_count %d: mixture-of-experts runs for llama (Mixtral), "
                         "mistral3, qwen3moe, glm4moe, gpt-oss, gemma4 and the deepseek2 family, "
                         "not %s",
                         gguf_path(c->f), hp->arch_name, hp->n_expert, hp->arch_name);
    int32_t gf;
    if ((e = load__u32(c, "expert_used_count", true, 0, &hp->n_expert_used)) ||
        (e = load__u32(c, "expert_feed_forward_length", ds || oss, 0, &hp->n_ff_exp)) ||
        (e = load__u32(c, "expert_gating_func", false,
                       glm || hp->arch == MODEL_ARCH_GLM_DSA ? 2 : 1, &gf)))
        return e;
    if (hp->n_expert_used > hp->n_expert || hp->n_expert_used > MODEL_MAX_EXPERTS_USED)
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: %s.expert_used_count %d: at most expert_count (%d) and %d",
                         gguf_path(c->f), hp->arch_name, hp->n_expert_used, hp->n_expert,
                         MODEL_MAX_EXPERTS_USED);
    if (hp->arch == MODEL_ARCH_GEMMA4) { // llama.cpp's graph fixes it: softmax, top-k renormed
        hp->gating = MODEL_GATING_SOFTMAX;
        return KS_OK;
    }
    if (oss) { // llama.cpp's graph fixes gpt-oss's routing whatever the file says
        hp->gating = MODEL_GATING_SOFTMAX_WEIGHT;
        hp->expert_norm = false; // the softmax over the k already sums to 1
        return KS_OK;
    }
    if (ds && gf == 0) gf = glm || hp->arch == MODEL_ARCH_GLM_DSA ? 2 : 1; // llama.cpp's "none"
    if (gf != 1 && gf != 2) // llama.cpp's numbering: 1 softmax, 2 sigmoid
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: %s.expert_gating_func %d is not supported (1 softmax, 2 sigmoid)",
                         gguf_path(c->f), hp->arch_name, gf);
    hp->gating = gf == 2 ? MODEL_GATING_SIGMOID : MODEL_GATING_SOFTMAX;
    if (q35) return load__moe_q35(c, hp);
    return ds ? load__moe_ds(c, hp) : KS_OK;
}

/* glm4 and glm4moe files of the vision releases (GLM-4.1V, 4.5V) carry
 * rope.dimension_sections, and llama.cpp then rotates in the multimodal
 * (M-RoPE) style, which kvseal does not run: nonzero sections are refused. */
static ks_err load__rope_sections(load__ctx *c) {
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", c->arch);
    const gguf_value *v = gguf_get(c->f, key);
    if (!v) return KS_OK;
    const gguf_type et = v->type == GGUF_TYPE_ARRAY ? v->v.arr.elem_type : GGUF_TYPE__COUNT;
    if (!(et <= GGUF_TYPE_INT32 || et == GGUF_TYPE_UINT64 || et == GGUF_TYPE_INT64))
        return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: %s is not an array of integers",
                         gguf_path(c->f), key);
    for (uint64_t i = 0; i < v->v.arr.n; i++)
        if (gguf_arr_i64(v, i) != 0)
            return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                             "%s: %s: multimodal RoPE (M-RoPE) sections are not supported",
                             gguf_path(c->f), key);
    return KS_OK;
}

/* deepseek2's multi-head latent attention, as llama.cpp's converter writes
 * it for absorbed decoding: attention.kv_lora_rank, q_lora_rank (0: one
 * attn_q), key_length_mla / value_length_mla (a head's nope + rope and v
 * dims), and the latent row as the one KV head: key_length = kv_lora +
 * n_rot, value_length = kv_lora, head_count_kv 1. Older files (attn_kv_b
 * only, no _mla keys) are refused. leading_dense_block_count layers run a
 * dense FFN. vlen: the file's value_length. */
static ks_err load__mla(load__ctx *c, model_hparams *hp, int32_t vlen) {
    const char *path = gguf_path(c->f);
    ks_err e;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.key_length_mla", c->arch);
    if (!gguf_get(c->f, key))
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: no %s: a deepseek2 file from before absorbed MLA (attn_kv_b "
                         "instead of attn_k_b/attn_v_b); convert it again with a current "
                         "convert_hf_to_gguf.py",
                         path, key);
    if ((e = load__u32(c, "attention.kv_lora_rank", true, 0, &hp->kv_lora)) ||
        (e = load__u32(c, "attention.q_lora_rank", false, 0, &hp->q_lora)) ||
        (e = load__u32(c, "attention.key_length_mla", true, 0, &hp->mla_qk)) ||
        (e = load__u32(c, "attention.value_length_mla", true, 0, &hp->mla_v)) ||
        (e = load__u32(c, "leading_dense_block_count", false, 0, &hp->n_layer_dense)))
        return e;
    if (hp->kv_lora < 1 || hp->n_head_kv != 1 || hp->head_dim != hp->kv_lora + hp->n_rot ||
        vlen != hp->kv_lora || hp->mla_qk <= hp->n_rot || hp->mla_v < 1 || hp->n_rot < 2)
        return ks_seterr(c->eb, KS_ERR_FORMAT,
                         "%s: MLA shape: kv_lora_rank %d, head_count_kv %d (want 1), key_length "
                         "%d (want kv_lora_rank + rope %d), value_length %d (want kv_lora_rank), "
                         "key_length_mla %d (want > rope), value_length_mla %d",
                         path, hp->kv_lora, hp->n_head_kv, hp->head_dim, hp->n_rot, vlen,
                         hp->mla_qk, hp->mla_v);
    hp->head_dim_v = hp->kv_lora;
    if (hp->arch != MODEL_ARCH_DEEPSEEK2) { // the sparse-attention indexer
        if ((e = load__u32(c, "attention.indexer.head_count", true, 0, &hp->idx_heads)) ||
            (e = load__u32(c, "attention.indexer.key_length", true, 0, &hp->idx_dim)) ||
            (e = load__u32(c, "attention.indexer.top_k", true, 0, &hp->idx_topk)) ||
            (e = load__f32(c, "attention.layer_norm_epsilon", 1e-6f, &hp->ln_eps)))
            return e;
        if (hp->idx_heads < 1 || hp->idx_dim <= hp->n_rot || hp->idx_dim > MODEL_MAX_HEAD_DIM ||
            hp->idx_topk < 1 || hp->q_lora < 1)
            return ks_seterr(c->eb, KS_ERR_FORMAT,
                             "%s: indexer shape: head_count %d, key_length %d (want > rope %d, "
                             "<= %d), top_k %d, q_lora_rank %d (the indexer reads the query "
                             "bottleneck: want > 0)",
                             path, hp->idx_heads, hp->idx_dim, hp->n_rot, MODEL_MAX_HEAD_DIM,
                             hp->idx_topk, hp->q_lora);
    }
    if (hp->n_layer_dense < 0 || hp->n_layer_dense > hp->n_layer) hp->n_layer_dense = hp->n_layer;
    return KS_OK;
}

/* Gemma 2 and 3, as llama.cpp reads them: embeddings scaled by sqrt(n_embd),
 * GELU FFN, RMSNorm on each sublayer's output (the file's norm weights
 * already hold gemma's 1 + w), tied output, sliding-window layers. gemma2:
 * every other layer slides (even il), scores and logits soft-capped (keys,
 * else 50 and 30). gemma3: 5 of every 6 layers slide (il % 6 < 5, or
 * attention.sliding_window_pattern), sliding layers use RoPE base
 * rope.freq_base_swa (else 10000) without scaling; no score cap; a logit cap
 * only where final_logit_softcapping is set; no window key: no sliding.
 * Queries are scaled by 1/sqrt(key_length), except for the 27B shapes (46
 * and 62 layers), trained with query_pre_attn_scalar = n_embd / n_head. */
static ks_err load__gemma(load__ctx *c, model_hparams *hp) {
    const bool g2 = hp->arch == MODEL_ARCH_GEMMA2;
    const char *path = gguf_path(c->f);
    ks_err e;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->ffn_gelu = true;
    hp->post_norms = true;
    if ((g2 && hp->n_layer == 46) || (!g2 && hp->n_layer == 62))
        hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    if ((e = load__u32(c, "attention.sliding_window", g2, 0, &hp->n_swa)) ||
        (e = load__f32(c, "final_logit_softcapping", g2 ? 30.0f : 0.0f, &hp->final_softcap)))
        return e;
    if (g2 && (e = load__f32(c, "attn_logit_softcapping", 50.0f, &hp->attn_softcap))) return e;
    if (hp->attn_softcap < 0.0f || hp->final_softcap < 0.0f || !isfinite(hp->attn_softcap) ||
        !isfinite(hp->final_softcap))
        return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: softcapping %g / %g must be >= 0", path,
                         (double)hp->attn_softcap, (double)hp->final_softcap);
    if (hp->n_swa == 0) return KS_OK; // gemma3 without a window: every layer is global
    hp->swa_period = g2 ? 2 : 6;
    if (g2) return KS_OK;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", c->arch);
    const gguf_value *pv = gguf_get(c->f, key);
    if (pv && pv->type == GGUF_TYPE_ARRAY)
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: %s as a per-layer array is not supported (a period is)", path, key);
    if ((e = load__u32(c, "attention.sliding_window_pattern", false, 6, &hp->swa_period)) ||
        (e = load__f32(c, "rope.freq_base_swa", 10000.0f, &hp->rope_base_swa)))
        return e;
    if (!(hp->rope_base_swa > 0.0f))
        return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: rope.freq_base_swa %g must be positive", path,
                         (double)hp->rope_base_swa);
    hp->rope_scale_swa = 1.0f;
    return KS_OK;
}

/* gpt-oss, as llama.cpp reads it: a required attention.sliding_window on
 * every other layer (even il slide, as gemma2's), the same RoPE (YaRN from
 * the rope.scaling keys) on both kinds; head size rope.dimension_count
 * (llama.cpp shapes the heads by it: key_length must agree); the experts'
 * clamped SwiGLU with alpha 1.702 and limit 7, constants of llama.cpp's
 * graph, not keys. Routing: load__experts. */
static ks_err load__gptoss(load__ctx *c, model_hparams *hp) {
    ks_err e;
    if ((e = load__u32(c, "attention.sliding_window", true, 0, &hp->n_swa))) return e;
    if (hp->n_rot != hp->head_dim || hp->n_expert < 1)
        return ks_seterr(c->eb, KS_ERR_FORMAT,
                         "%s: gpt-oss: rope.dimension_count %d must equal key_length %d, and "
                         "expert_count (%d) be set",
                         gguf_path(c->f), hp->n_rot, hp->head_dim, hp->n_expert);
    hp->swa_period = 2;
    hp->swiglu_alpha = 1.702f;
    hp->swiglu_limit = 7.0f;
    return KS_OK;
}

/* Most value heads x state size a Gated DeltaNet layer may have (scratch per token). */
#define LOAD__MAX_SSM_DIM 65536

/* The recurrent layers' shape keys both hybrid families write:
 * ssm.conv_kernel, state_size, group_count, time_step_rank, inner_size. */
static ks_err load__ssm_shape(load__ctx *c, model_hparams *hp, int32_t *inner) {
    ks_err e;
    if ((e = load__u32(c, "ssm.conv_kernel", true, 0, &hp->ssm_conv)) ||
        (e = load__u32(c, "ssm.state_size", true, 0, &hp->ssm_state)) ||
        (e = load__u32(c, "ssm.group_count", true, 0, &hp->ssm_k_heads)) ||
        (e = load__u32(c, "ssm.time_step_rank", true, 0, &hp->ssm_v_heads)) ||
        (e = load__u32(c, "ssm.inner_size", true, 0, inner)))
        return e;
    return KS_OK;
}

/* qwen35's Gated DeltaNet keys, as llama.cpp reads them: ssm.conv_kernel,
 * ssm.state_size (a head's key and value size: they are equal),
 * ssm.group_count key heads, ssm.time_step_rank value heads (a multiple),
 * ssm.inner_size = value heads x state size, and full_attention_interval
 * (default 4): every interval-th layer attends, with the query's output
 * gate; the others recur. */
static ks_err load__ssm(load__ctx *c, model_hparams *hp) {
    const char *path = gguf_path(c->f);
    int32_t inner;
    ks_err e;
    if ((e = load__ssm_shape(c, hp, &inner)) ||
        (e = load__u32(c, "full_attention_interval", false, 4, &hp->attn_interval)))
        return e;
    if (hp->ssm_conv < 2 || hp->ssm_conv > 16 || hp->ssm_state % 16 ||
        hp->ssm_state > MODEL_MAX_SSM_STATE ||
        hp->ssm_v_heads % hp->ssm_k_heads || inner != hp->ssm_v_heads * hp->ssm_state ||
        (int64_t)hp->ssm_v_heads * hp->ssm_state > LOAD__MAX_SSM_DIM || hp->attn_interval < 1)
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: Gated DeltaNet shape: conv_kernel %d (want 2..16), state_size %d "
                         "(want a multiple of 16, at most 256), group_count %d, time_step_rank %d (want a "
                         "multiple of group_count), inner_size %d (want time_step_rank x "
                         "state_size, at most %d), full_attention_interval %d",
                         path, hp->ssm_conv, hp->ssm_state, hp->ssm_k_heads, hp->ssm_v_heads,
                         inner, LOAD__MAX_SSM_DIM, hp->attn_interval);
    hp->n_layer_attn = hp->n_layer / hp->attn_interval;
    hp->n_layer_rec = hp->n_layer - hp->n_layer_attn;
    hp->ssm_inner = inner;
    hp->ssm_head_dim = hp->ssm_state;
    if (hp->n_layer_attn < 1)
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: block_count %d with full_attention_interval %d leaves no attention "
                         "layer",
                         path, hp->n_layer, hp->attn_interval);
    hp->attn_out_gate = true;
    return KS_OK;
}

/* mistral3 (llama's layers otherwise): with rope.scaling.yarn_log_multiplier
 * m set (its converter writes mscale_all_dim), the YaRN magnitude factor
 * handed to RoPE is 1 / (1 + 0.1 m ln f) for the scaling factor f > 1 (so
 * with m = 1 it cancels YaRN's own 1 + 0.1 ln f: cos/sin stay unit), in
 * place of the file's attention factors, as llama.cpp computes it (checked
 * against the anchor for m = 0.5, 1, 2); with
 * attention.temperature_scale set, the query at position p is multiplied by
 * 1 + scale * log(floor(p / L) + 1), L the original context length. No
 * sliding window (the key is not read). */
static ks_err load__mistral3(load__ctx *c, model_hparams *hp) {
    float log_mul;
    ks_err e = load__f32(c, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul);
    if (e) return e;
    if (log_mul != 0.0f) {
        const float f = 1.0f / hp->rope_scale;
        hp->rope_attn_factor = f <= 1.0f ? 1.0f : 1.0f / (1.0f + 0.1f * log_mul * logf(f));
    }
    if ((e = load__f32(c, "attention.temperature_scale", 0.0f, &hp->attn_temp_scale))) return e;
    if (!isfinite(hp->attn_temp_scale))
        return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: %s.attention.temperature_scale is not finite",
                         gguf_path(c->f), hp->arch_name);
    hp->attn_temp_floor = hp->rope_orig_ctx;
    if (hp->attn_temp_scale != 0.0f && hp->attn_temp_floor < 1)
        return ks_seterr(c->eb, KS_ERR_FORMAT,
                         "%s: attention temperature scaling needs an original context length "
                         "(%s.rope.scaling.original_context_length)",
                         gguf_path(c->f), hp->arch_name);
    hp->swa_period = 0;
    return KS_OK;
}

/* Value il of per-layer key `suffix` (an array of block_count integers, or
 * one integer for every layer), or -1 where the array is malformed. */
int64_t model__layer_val(const gguf_file *f, const char *arch, const char *suffix, int il) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const gguf_value *v = gguf_get(f, key);
    if (!v) return -1;
    if (v->type == GGUF_TYPE_ARRAY) {
        if (v->v.arr.items || (uint64_t)il >= v->v.arr.n || v->v.arr.elem_type == GGUF_TYPE_FLOAT32 ||
            v->v.arr.elem_type == GGUF_TYPE_FLOAT64 || v->v.arr.elem_type == GGUF_TYPE_BOOL)
            return -1;
        const int64_t x = gguf_arr_i64(v, (uint64_t)il);
        return x < 0 || x > INT32_MAX ? -1 : x;
    }
    uint32_t u;
    ks_errbuf eb;
    if (gguf_get_u32(f, key, &u, &eb)) return -1;
    return u > INT32_MAX ? -1 : (int64_t)u;
}

/* nemotron_h layer il's kind from the per-layer arrays, as llama.cpp reads
 * them: 'M' Mamba2 (no K/V heads, no FFN), '*' attention (K/V heads), '-'
 * an MLP (an FFN width); 0 when the arrays say neither or both. */
char model__nh_kind(const gguf_file *f, const char *arch, int il) {
    const int64_t kv = model__layer_val(f, arch, "attention.head_count_kv", il),
                  ff = model__layer_val(f, arch, "feed_forward_length", il);
    if (kv < 0 || ff < 0 || (kv > 0 && ff > 0)) return 0;
    return kv > 0 ? '*' : ff > 0 ? '-' : 'M';
}

/* nemotron_h's keys: the per-layer head_count_kv and feed_forward_length
 * arrays (the attention and MLP layers share one shape), head_count, and
 * the Mamba2 shape (ssm.conv_kernel, state_size, group_count,
 * time_step_rank heads, inner_size). */
static ks_err load__nemotron_h(load__ctx *c, model_hparams *hp) {
    const char *path = gguf_path(c->f);
    // every layer has tensors of its own (load__weights checks it again):
    // a corrupt block_count is refused before the per-layer scan
    if ((uint64_t)hp->n_layer > gguf_n_tensors(c->f))
        return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: block_count %d but the file holds %llu tensors",
                         path, hp->n_layer, (unsigned long long)gguf_n_tensors(c->f));
    hp->n_head = hp->n_head_kv = hp->n_ff = 0;
    hp->n_layer_attn = hp->n_layer_rec = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const char k = model__nh_kind(c->f, c->arch, il);
        const int64_t h = model__layer_val(c->f, c->arch, "attention.head_count", il),
                      kv = model__layer_val(c->f, c->arch, "attention.head_count_kv", il),
                      ff = model__layer_val(c->f, c->arch, "feed_forward_length", il);
        int32_t *same[] = {&hp->n_head, &hp->n_head_kv, &hp->n_ff};
        const int64_t val[] = {k == '*' ? h : 0, k == '*' ? kv : 0, k == '-' ? ff : 0};
        bool ok = k != 0 && (k != '*' || h > 0);
        for (int i = 0; ok && i < 3; i++) {
            if (val[i] && *same[i] && *same[i] != val[i]) ok = false;
            if (val[i]) *same[i] = (int32_t)val[i];
        }
        if (!ok)
            return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                             "%s: layer %d: head_count %lld, head_count_kv %lld, "
                             "feed_forward_length %lld: want a Mamba2 layer (0, 0), attention "
                             "(heads, 0) or an MLP (0, width), every attention / MLP layer alike",
                             path, il, (long long)h, (long long)kv, (long long)ff);
        hp->n_layer_attn += k == '*';
        hp->n_layer_rec += k == 'M';
    }
    if (hp->n_layer_attn < 1 || !hp->n_ff)
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: nemotron_h without an attention layer or an MLP layer", path);
    int32_t inner;
    ks_err e;
    if ((e = load__ssm_shape(c, hp, &inner))) return e;
    hp->ssm_inner = inner;
    hp->ssm_head_dim = inner / hp->ssm_v_heads;
    if (hp->ssm_conv < 2 || hp->ssm_conv > 16 || hp->ssm_state % 16 ||
        hp->ssm_state > MODEL_MAX_SSM_STATE || inner % hp->ssm_v_heads ||
        hp->ssm_v_heads % hp->ssm_k_heads || inner % hp->ssm_state ||
        hp->ssm_head_dim > MODEL_MAX_SSM_STATE || inner > LOAD__MAX_SSM_DIM)
        return ks_seterr(c->eb, KS_ERR_UNSUPPORTED,
                         "%s: Mamba2 shape: conv_kernel %d (want 2..16), state_size %d (want a "
                         "multiple of 16, at most 256), group_count %d, time_step_rank %d (heads: "
                         "a multiple of group_count), inner_size %d (want a multiple of heads and "
                         "of state_size, at most 256 per head and %d in all)",
                         path, hp->ssm_conv, hp->ssm_state, hp->ssm_k_heads, hp->ssm_v_heads,
                         inner, LOAD__MAX_SSM_DIM);
    return KS_OK;
}

/* Layer il's value of the bool-per-layer key `suffix` (an array of
 * block_count bools or integers, or one bool for every layer): 1, 0, or -1
 * where it is absent or malformed. */
int model__layer_flag(const gguf_file *f, const char *arch, const char *suffix, int il) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const gguf_value *v = gguf_get(f, key);
    if (!v) return -1;
    if (v->type == GGUF_TYPE_BOOL) return v->v.u64 != 0;
    if (v->type != GGUF_TYPE_ARRAY || v->v.arr.items || (uint64_t)il >= v->v.arr.n ||
        v->v.arr.elem_type == GGUF_TYPE_FLOAT32 || v->v.arr.elem_type == GGUF_TYPE_FLOAT64)
        return -1;
    return gguf_arr_i64(v, (uint64_t)il) != 0;
}

/* gemma4's head_count and its per-layer head_count_kv and
 * feed_forward_length (each an array of block_count integers or one for
 * every layer, as llama.cpp reads them): n_head_kv and n_ff are the largest. */
static ks_err load__gemma4_counts(load__ctx *c, model_hparams *hp) {
    const char *path = gguf_path(c->f);
    if ((uint64_t)hp->n_layer > gguf_n_tensors(c->f))
        return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: block_count %d but the file holds %llu tensors",
                         path, hp->n_layer, (unsigned long long)gguf_n_tensors(c->f));
    ks_err e = load__u32(c, "attention.head_count", true, 0, &hp->n_head);
    if (e) return e;
    hp->n_head_kv = hp->n_ff = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const int64_t kv = model__layer_val(c->f, c->arch, "attention.head_count_kv", il),
                      ff = model__layer_val(c->f, c->arch, "feed_forward_length", il);
        if (kv < 1 || ff < 1 || hp->n_head % kv)
            return ks_seterr(c->eb, KS_ERR_FORMAT,
                             "%s: layer %d: head_count_kv %lld, feed_forward_length %lld: want "
                             "both set and positive (one value or one per layer), head_count %d "
                             "a multiple of the first",
                             path, il, (long long)kv, (long long)ff, hp->n_head);
        if (kv > hp->n_head_kv) hp->n_head_kv = (int32_t)kv;
        if (ff > hp->n_ff) hp->n_ff = (int32_t)ff;
    }
    return KS_OK;
}

/* Gemma 4, as llama.cpp reads it (model.h's gemma4 comment): a required
 * attention.sliding_window and sliding_window_pattern (a bool per layer),
 * the sliding layers' key_length_swa / value_length_swa (equal; default
 * key_length), rope.dimension_count_swa (default rope.dimension_count) and
 * rope.freq_base_swa (default rope.freq_base), final_logit_softcapping
 * where set; embeddings scaled by sqrt(n_embd), GELU FFN, RMSNorm on each
 * sublayer's output (the weights as stored: no 1 + w), tied output unless
 * output.weight; shared KV layers and per-layer embeddings (E2B, E4B) where
 * attention.shared_kv_layers / embedding_length_per_layer_input say. */
static ks_err load__gemma4(load__ctx *c, model_hparams *hp) {
    const char *path = gguf_path(c->f);
    int32_t vswa, n_shared, n_pl;
    ks_err e;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->ffn_gelu = true;
    hp->post_norms = true;
    hp->attn_scale = 1.0f; // llama.cpp: f_attention_scale 1 (the Q/K norms set the scale)
    hp->v_norm = true;
    hp->rope_freqs_full = true;
    if ((e = load__u32(c, "attention.sliding_window", true, 0, &hp->n_swa)) ||
        (e = load__u32(c, "attention.key_length_swa", false, (uint32_t)hp->head_dim,
                       &hp->head_dim_swa)) ||
        (e = load__u32(c, "attention.value_length_swa", false, (uint32_t)hp->head_dim_swa,
                       &vswa)) ||
        (e = load__u32(c, "rope.dimension_count_swa", false, (uint32_t)hp->n_rot,
                       &hp->n_rot_swa)) ||
        (e = load__f32(c, "rope.freq_base_swa", hp->rope_base, &hp->rope_base_swa)) ||
        (e = load__f32(c, "final_logit_softcapping", 0.0f, &hp->final_softcap)) ||
        (e = load__u32(c, "attention.shared_kv_layers", false, 0, &n_shared)) ||
        (e = load__u32(c, "embedding_length_per_layer_input", false, 0, &n_pl)))
        return e;
    if (hp->head_dim_swa < 1 || hp->head_dim_swa > MODEL_MAX_HEAD_DIM || vswa != hp->head_dim_swa ||
        hp->n_rot_swa > hp->head_dim_swa || hp->n_rot_swa % 2 || !(hp->rope_base_swa > 0.0f) ||
        !(hp->final_softcap >= 0.0f && isfinite(hp->final_softcap)))
        return ks_seterr(c->eb, KS_ERR_FORMAT,
                         "%s: gemma4 sliding layers: key_length_swa %d (want 1..%d), "
                         "value_length_swa %d (want the same), rope.dimension_count_swa %d (want "
                         "even, at most the head), rope.freq_base_swa %g, "
                         "final_logit_softcapping %g",
                         path, hp->head_dim_swa, MODEL_MAX_HEAD_DIM, vswa, hp->n_rot_swa,
                         (double)hp->rope_base_swa, (double)hp->final_softcap);
    // shared KV layers read layer n_layer_attn - 2 (sliding) or - 1 (full)
    hp->n_layer_attn = hp->n_layer - n_shared;
    if (n_shared < 0 || hp->n_layer_attn < (n_shared ? 2 : 1) || n_pl < 0 || n_pl > 65536)
        return ks_seterr(c->eb, KS_ERR_FORMAT,
                         "%s: gemma4: attention.shared_kv_layers %d of block_count %d (at least "
                         "2 layers must keep K/V when any share), "
                         "embedding_length_per_layer_input %d",
                         path, n_shared, hp->n_layer, n_pl);
    hp->n_embd_pl = n_pl;
    hp->rope_scale_swa = hp->rope_scale;
    hp->kv_dim = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const int swa = model__layer_flag(c->f, c->arch, "attention.sliding_window_pattern", il);
        if (swa < 0)
            return ks_seterr(c->eb, KS_ERR_FORMAT,
                             "%s: %s.attention.sliding_window_pattern: missing, or no bool for "
                             "layer %d",
                             path, c->arch, il);
        const int64_t kvd = model__layer_val(c->f, c->arch, "attention.head_count_kv", il) *
                            (swa ? hp->head_dim_swa : hp->head_dim);
        if (kvd > (1 << 24))
            return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: layer %d keeps %lld K/V elements a position",
                             path, il, (long long)kvd);
        if (il < hp->n_layer_attn && kvd > hp->kv_dim) hp->kv_dim = (int32_t)kvd; // owners only
    }
    return KS_OK;
}

/* Every architecture's keys into m->hp (model_int.h). */
ks_err model__load_hparams(model *m, ks_errbuf *eb) {
    const gguf_file *f = m->gguf;
    model_hparams *hp = &m->hp;
    gguf_str a;
    ks_err e = gguf_get_str(f, "general.architecture", &a, eb);
    if (e) return e;
    if (a.len >= sizeof hp->arch_name) a.len = sizeof hp->arch_name - 1;
    memcpy(hp->arch_name, a.ptr, a.len);
    hp->arch_name[a.len] = '\0';
    if (!strcmp(hp->arch_name, "llama")) hp->arch = MODEL_ARCH_LLAMA;
    else if (!strcmp(hp->arch_name, "bert")) hp->arch = MODEL_ARCH_BERT;
    else if (!strcmp(hp->arch_name, "nomic-bert")) hp->arch = MODEL_ARCH_NOMIC_BERT;
    else if (!strcmp(hp->arch_name, "qwen2")) hp->arch = MODEL_ARCH_QWEN2;
    else if (!strcmp(hp->arch_name, "qwen3")) hp->arch = MODEL_ARCH_QWEN3;
    else if (!strcmp(hp->arch_name, "qwen3moe"))
        hp->arch = MODEL_ARCH_QWEN3MOE;
    else if (!strcmp(hp->arch_name, "phi3"))
        hp->arch = MODEL_ARCH_PHI3;
    else if (!strcmp(hp->arch_name, "gemma2"))
        hp->arch = MODEL_ARCH_GEMMA2;
    else if (!strcmp(hp->arch_name, "gemma3"))
        hp->arch = MODEL_ARCH_GEMMA3;
    else if (!strcmp(hp->arch_name, "gemma4"))
        hp->arch = MODEL_ARCH_GEMMA4;
    else if (!strcmp(hp->arch_name, "glm4"))
        hp->arch = MODEL_ARCH_GLM4;
    else if (!strcmp(hp->arch_name, "glm4moe"))
        hp->arch = MODEL_ARCH_GLM4MOE;
    else if (!strcmp(hp->arch_name, "deepseek2"))
        hp->arch = MODEL_ARCH_DEEPSEEK2;
    else if (!strcmp(hp->arch_name, "deepseek32"))
        hp->arch = MODEL_ARCH_DEEPSEEK32;
    else if (!strcmp(hp->arch_name, "glm-dsa"))
        hp->arch = MODEL_ARCH_GLM_DSA;
    else if (!strcmp(hp->arch_name, "qwen35"))
        hp->arch = MODEL_ARCH_QWEN35;
    else if (!strcmp(hp->arch_name, "qwen35moe"))
        hp->arch = MODEL_ARCH_QWEN35MOE;
    else if (!strcmp(hp->arch_name, "mistral3"))
        hp->arch = MODEL_ARCH_MISTRAL3;
    else if (!strcmp(hp->arch_name, "nemotron_h"))
        hp->arch = MODEL_ARCH_NEMOTRON_H;
    else if (!strcmp(hp->arch_name, "gpt-oss"))
        hp->arch = MODEL_ARCH_GPT_OSS;
    else
        return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                         "%s: unsupported architecture '%s' (supported: " MODEL_ARCHS ")",
                         gguf_path(f), hp->arch_name);
    load__ctx c = {f, hp->arch_name, eb};
    if ((e = load__experts(&c, hp))) return e;
    const bool nh = hp->arch == MODEL_ARCH_NEMOTRON_H;
    if ((e = load__u32(&c, "context_length", true, 0, &hp->n_ctx_train)) ||
        (e = load__u32(&c, "embedding_length", true, 0, &hp->n_embd)) ||
        (e = load__u32(&c, "block_count", true, 0, &hp->n_layer)))
        return e;
    if (nh) { // per-layer arrays
        if ((e = load__nemotron_h(&c, hp))) return e;
    } else if (hp->arch == MODEL_ARCH_GEMMA4) { // per-layer arrays
        if ((e = load__gemma4_counts(&c, hp))) return e;
    } else if ((e = load__u32(&c, "feed_forward_length",
                              hp->n_expert == 0 || hp->n_layer_dense > 0, (uint32_t)hp->n_ff,
                              &hp->n_ff)) ||
               (e = load__u32(&c, "attention.head_count", true, 0, &hp->n_head)) ||
               (e = load__u32(&c, "attention.head_count_kv", false, (uint32_t)hp->n_head,
                              &hp->n_head_kv))) {
        return e;
    }
    // glm4moe's and the MLA families' block_count counts the NextN blocks
    // after the main ones (as llama.cpp's converter writes GLM-4.5 and GLM-5);
    // they predict further tokens for speculative decoding, and neither
    // llama.cpp nor kvseal runs them
    // (Qwen3.5's MTP blocks likewise: llama.cpp counts them in block_count)
    if ((hp->arch == MODEL_ARCH_GLM4MOE || model__is_mla(hp->arch) ||
         hp->arch == MODEL_ARCH_QWEN35 || hp->arch == MODEL_ARCH_QWEN35MOE) &&
        (e = load__u32(&c, "nextn_predict_layers", false, 0, &hp->n_layer_nextn)))
        return e;
    if (hp->n_layer_nextn >= hp->n_layer)
        return ks_seterr(eb, KS_ERR_FORMAT,
                         "%s: %s.nextn_predict_layers %d must be below block_count %d",
                         gguf_path(f), hp->arch_name, hp->n_layer_nextn, hp->n_layer);
    hp->n_layer -= hp->n_layer_nextn;
    if (!nh) hp->n_layer_attn = hp->n_layer; // gemma4: less its shared KV layers (load__gemma4)
    if ((hp->arch == MODEL_ARCH_QWEN35 || hp->arch == MODEL_ARCH_QWEN35MOE) &&
        (e = load__ssm(&c, hp)))
        return e;
    if ((hp->arch == MODEL_ARCH_GLM4 || hp->arch == MODEL_ARCH_GLM4MOE) &&
        (e = load__rope_sections(&c)))
        return e;
    if (hp->n_expert && !hp->n_ff_exp) hp->n_ff_exp = hp->n_ff;
    if (hp->n_expert && hp->n_ff_exp < 1)
        return ks_seterr(eb, KS_ERR_FORMAT,
                         "%s: %s.expert_count %d but no expert_feed_forward_length or "
                         "feed_forward_length",
                         gguf_path(f), hp->arch_name, hp->n_expert);
    if (hp->n_embd % hp->n_head)
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: embedding_length %d is not a multiple of head_count %d",
                         gguf_path(f), hp->n_embd, hp->n_head);
    if ((e = load__u32(&c, "attention.key_length", false, (uint32_t)(hp->n_embd / hp->n_head),
                       &hp->head_dim)) ||
        (e = load__u32(&c, "rope.dimension_count", false, (uint32_t)hp->head_dim, &hp->n_rot)))
        return e;
    if (hp->head_dim < 1 || hp->head_dim > MODEL_MAX_HEAD_DIM)
        return ks_seterr(eb, KS_ERR_UNSUPPORTED, "%s: key_length %d is not in 1..%d", gguf_path(f),
                         hp->head_dim, MODEL_MAX_HEAD_DIM);
    int32_t vlen;
    if ((e = load__u32(&c, "attention.value_length", false, (uint32_t)hp->head_dim, &vlen))) return e;
    hp->head_dim_v = hp->head_dim;
    if (model__is_mla(hp->arch)) {
        if ((e = load__mla(&c, hp, vlen))) return e;
    } else if (vlen != hp->head_dim)
        return ks_seterr(eb, KS_ERR_UNSUPPORTED, "%s: value_length %d differs from key_length %d",
                         gguf_path(f), vlen, hp->head_dim);
    if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv)
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d",
                         gguf_path(f), hp->n_head, hp->n_head_kv);
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: rope.dimension_count %d invalid for head size %d",
                         gguf_path(f), hp->n_rot, hp->head_dim);
    if ((e = load__f32(&c, "rope.freq_base", 10000.0f, &hp->rope_base)) ||
        (e = load__f32(&c, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->norm_eps)))
        return e;
    // RoPE scaling: rope.scaling.type = "linear" or "yarn" + rope.scaling.factor,
    // or the older rope.scale_linear (Llama 3's per-pair factors are a tensor)
    float factor = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch_name);
    gguf_str st;
    bool yarn = false;
    hp->rope_ext_factor = 0.0f;
    hp->rope_attn_factor = 1.0f;
    hp->rope_corr[0] = hp->rope_corr[1] = 0.0f;
    if (gguf_get(f, key)) {
        if ((e = gguf_get_str(f, key, &st, eb))) return e;
        bool linear = st.len == 6 && !memcmp(st.ptr, "linear", 6);
        bool none = st.len == 4 && !memcmp(st.ptr, "none", 4);
        yarn = st.len == 4 && !memcmp(st.ptr, "yarn", 4);
        if (!linear && !none && !yarn)
            return ks_seterr(eb, KS_ERR_UNSUPPORTED,
                             "%s: %s '%.*s' is not supported (linear, yarn, none)", gguf_path(f),
                             key, (int)st.len, st.ptr);
        if (!none && (e = load__f32(&c, "rope.scaling.factor", 1.0f, &factor))) return e;
    } else if ((e = load__f32(&c, "rope.scale_linear", 1.0f, &factor))) {
        return e;
    }
    if (!(factor > 0.0f))
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: rope scaling factor %g must be positive", gguf_path(f),
                         (double)factor);
    hp->rope_scale = 1.0f / factor;
    if ((e = load__u32(&c, "rope.scaling.original_context_length", false, (uint32_t)hp->n_ctx_train,
                       &hp->rope_orig_ctx)))
        return e;
    if (yarn) {
        const int32_t orig = hp->rope_orig_ctx;
        float beta_fast, beta_slow;
        if ((e = load__f32(&c, "rope.scaling.yarn_ext_factor", 1.0f, &hp->rope_ext_factor)) ||
            (e = load__f32(&c, "rope.scaling.yarn_attn_factor", 1.0f, &hp->rope_attn_factor)) ||
            (e = load__f32(&c, "rope.scaling.yarn_beta_fast", 32.0f, &beta_fast)) ||
            (e = load__f32(&c, "rope.scaling.yarn_beta_slow", 1.0f, &beta_slow)))
            return e;
        if (orig < 1 || !(beta_fast > 0.0f) || !(beta_slow > 0.0f) ||
            !(hp->rope_ext_factor >= 0.0f && hp->rope_ext_factor <= 1.0f) ||
            !(hp->rope_attn_factor > 0.0f))
            return ks_seterr(eb, KS_ERR_FORMAT,
                             "%s: YaRN parameters out of range (original context %d, beta %g/%g, "
                             "ext_factor %g, attn_factor %g)",
                             gguf_path(f), orig, (double)beta_fast, (double)beta_slow,
                             (double)hp->rope_ext_factor, (double)hp->rope_attn_factor);
        kern_rope_yarn_corr(hp->n_rot, (int)orig, hp->rope_base, beta_fast, beta_slow,
                            &hp->rope_corr[0], &hp->rope_corr[1]);
    }
    // a magnitude factor on cos/sin for any scaling (phi3's LongRoPE writes it)
    float attn_factor;
    if ((e = load__f32(&c, "rope.scaling.attn_factor", 1.0f, &attn_factor))) return e;
    if (!(attn_factor > 0.0f && isfinite(attn_factor)))
        return ks_seterr(eb, KS_ERR_FORMAT, "%s: %s.rope.scaling.attn_factor %g must be positive",
                         gguf_path(f), hp->arch_name, (double)attn_factor);
    hp->rope_attn_factor *= attn_factor;
    // glm4 dense turns adjacent pairs, glm4moe NEOX halves (its converter
    // leaves Q/K unpermuted), the deepseek2 family adjacent pairs: llama.cpp's
    // rope types
    hp->rope_neox = hp->arch != MODEL_ARCH_LLAMA && hp->arch != MODEL_ARCH_MISTRAL3 &&
                    hp->arch != MODEL_ARCH_GLM4 && !model__is_mla(hp->arch);
    if (nh) hp->n_rot = 0; // nemotron_h's attention has no RoPE (llama.cpp: rope type none)
    hp->post_norms = hp->arch == MODEL_ARCH_GLM4; // and gemma's (load__gemma)
    hp->rope_base_swa = hp->rope_base;
    hp->rope_scale_swa = hp->rope_scale;
    hp->attn_scale = 1.0f / sqrtf((float)(hp->kv_lora ? hp->mla_qk : hp->head_dim));
    hp->embd_scale = 1.0f;
    hp->head_dim_swa = hp->head_dim;
    hp->n_rot_swa = hp->n_rot;
    hp->kv_dim = hp->n_head_kv * hp->head_dim + hp->idx_dim; // gemma4: its layers' largest
    if (hp->kv_lora && yarn) { // deepseek2: YaRN's magnitude moves from cos/sin into the scores
        float log_mul;
        if ((e = load__f32(&c, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul))) return e;
        const float l = logf(1.0f / hp->rope_scale);
        const float mscale = hp->rope_attn_factor * (1.0f + 0.1f * log_mul * l);
        hp->attn_scale *= mscale * mscale;
        hp->rope_attn_factor /= 1.0f + 0.1f * l; // the rope kernel's YaRN factor, cancelled
    }
    if (hp->arch == MODEL_ARCH_MISTRAL3) return load__mistral3(&c, hp);
    if (hp->arch == MODEL_ARCH_GEMMA2 || hp->arch == MODEL_ARCH_GEMMA3) return load__gemma(&c, hp);
    if (hp->arch == MODEL_ARCH_GEMMA4) return load__gemma4(&c, hp);
    if (hp->arch == MODEL_ARCH_GPT_OSS) return load__gptoss(&c, hp);
    // LayerNorms (llama.cpp's default eps 1e-12); bert: no RoPE, nomic-bert
    // NEOX-style RoPE over the whole head
    if (hp->arch == MODEL_ARCH_BERT || hp->arch == MODEL_ARCH_NOMIC_BERT) {
        hp->encoder = true;
        if (hp->arch == MODEL_ARCH_BERT) hp->n_rot = 0;
        return load__f32(&c, "attention.layer_norm_epsilon", 1e-12f, &hp->norm_eps);
    }
    // Mistral-style llama files: every layer slides where a window is set, as
    // Hugging Face and vLLM run them (llama.cpp ignores the key for llama)
    if (hp->arch == MODEL_ARCH_LLAMA &&
        (e = load__u32(&c, "attention.sliding_window", false, 0, &hp->n_swa)))
        return e;
    hp->swa_period = 0; // with n_swa > 0: every layer
    return KS_OK;
}
