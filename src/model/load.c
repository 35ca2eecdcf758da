/* load.c — reads hyper-parameters and binds weight tensors of a GGUF model.
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
static int64_t load__layer_val(const gguf_file *f, const char *arch, const char *suffix, int il) {
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
static char load__nh_kind(const gguf_file *f, const char *arch, int il) {
    const int64_t kv = load__layer_val(f, arch, "attention.head_count_kv", il),
                  ff = load__layer_val(f, arch, "feed_forward_length", il);
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
        const char k = load__nh_kind(c->f, c->arch, il);
        const int64_t h = load__layer_val(c->f, c->arch, "attention.head_count", il),
                      kv = load__layer_val(c->f, c->arch, "attention.head_count_kv", il),
                      ff = load__layer_val(c->f, c->arch, "feed_forward_length", il);
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
static int load__layer_flag(const gguf_file *f, const char *arch, const char *suffix, int il) {
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
        const int64_t kv = load__layer_val(c->f, c->arch, "attention.head_count_kv", il),
                      ff = load__layer_val(c->f, c->arch, "feed_forward_length", il);
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
        const int swa = load__layer_flag(c->f, c->arch, "attention.sliding_window_pattern", il);
        if (swa < 0)
            return ks_seterr(c->eb, KS_ERR_FORMAT,
                             "%s: %s.attention.sliding_window_pattern: missing, or no bool for "
                             "layer %d",
                             path, c->arch, il);
        const int64_t kvd = load__layer_val(c->f, c->arch, "attention.head_count_kv", il) *
                            (swa ? hp->head_dim_swa : hp->head_dim);
        if (kvd > (1 << 24))
            return ks_seterr(c->eb, KS_ERR_FORMAT, "%s: layer %d keeps %lld K/V elements a position",
                             path, il, (long long)kvd);
        if (il < hp->n_layer_attn && kvd > hp->kv_dim) hp->kv_dim = (int32_t)kvd; // owners only
    }
    return KS_OK;
}

static ks_err load__hparams(model *m, ks_errbuf *eb) {
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
    const int swa = load__layer_flag(m->gguf, hp->arch_name, "attention.sliding_window_pattern", il);
    const int64_t kvh = load__layer_val(m->gguf, hp->arch_name, "attention.head_count_kv", il),
                  F = load__layer_val(m->gguf, hp->arch_name, "feed_forward_length", il);
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

/* Binds nemotron_h layer il of kind k (load__nh_kind): a Mamba2 mixer
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

static ks_err load__weights(model *m, ks_errbuf *eb) {
    model_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, D = hp->head_dim, F = hp->n_ff;
    const int64_t HD = (int64_t)hp->n_head * D, KVD = (int64_t)hp->n_head_kv * D;
    // attn_output's input: H heads of D, or of mla_v under MLA
    const int64_t HO = hp->kv_lora ? (int64_t)hp->n_head * hp->mla_v : HD;
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
    const bool glm4moe = hp->arch == MODEL_ARCH_GLM4MOE, oss = hp->arch == MODEL_ARCH_GPT_OSS;
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
    // layers [n_layer, block_count) are the NextN blocks: never run,
    // so never bound (their tensors may be of any type)
    for (int il = 0; il < hp->n_layer; il++) {
        model__layer *L = &m->layers[il];
        char n[96];
#define LNAME(s) (snprintf(n, sizeof n, "blk.%d.%s", il, s), n)
        model__mat fused = {0};
        if ((e = load__vec(m, LNAME("attn_norm.weight"), E, true, &L->attn_norm, eb))) return e;
        L->kv_layer = il;
        if (hp->arch == MODEL_ARCH_GEMMA4) {
            if ((e = load__gemma4_layer(m, il, L, eb))) return e;
            continue;
        }
        if (hp->arch == MODEL_ARCH_NEMOTRON_H) { // KV and state rows in layer order
            const char k = load__nh_kind(m->gguf, hp->arch_name, il);
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
    }
    return KS_OK;
}

/* Calls fn on every matrix the matmuls read (not token_embd: rows are
 * looked up by token; nor a tied output, which is the same rows), in one
 * fixed order. */
static void load__each_mat(model *m, void (*fn)(const gguf_file *, model__mat *, void *),
                           void *arg) {
    if (!m->hp.tied_output) fn(m->gguf, &m->output, arg);
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
    if ((e = load__hparams(m, eb))) goto fail;
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
    tok_vocab_free(m->vocab);
    gguf_close(m->gguf);
    free(m);
}

const model_hparams *model_hp(const model *m) { return &m->hp; }
const tok_vocab *model_vocab(const model *m) { return m->vocab; }
const gguf_file *model_gguf(const model *m) { return m->gguf; }

static uint64_t load__mat_bytes(const model__mat *w) { return (uint64_t)w->row_bytes * (uint64_t)w->N; }

uint64_t model_bytes_per_token(const model *m) {
    uint64_t b = m->tok_embd.row_bytes + load__mat_bytes(&m->output);
    if (m->ple_tok.data) b += m->ple_tok.row_bytes + load__mat_bytes(&m->ple_in);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const model__layer *L = &m->layers[il];
        b += load__mat_bytes(&L->ple_gate) + load__mat_bytes(&L->ple_proj);
        b += load__mat_bytes(&L->wq) + load__mat_bytes(&L->wk) + load__mat_bytes(&L->wv) +
             load__mat_bytes(&L->wo) + load__mat_bytes(&L->wq_a) + load__mat_bytes(&L->wq_b) +
             load__mat_bytes(&L->wkv_a) + load__mat_bytes(&L->idx_q_b) +
             load__mat_bytes(&L->idx_k) + load__mat_bytes(&L->idx_proj) +
             load__mat_bytes(&L->ssm_qkv) + load__mat_bytes(&L->ssm_z) +
             load__mat_bytes(&L->ssm_beta) + load__mat_bytes(&L->ssm_alpha) +
             load__mat_bytes(&L->ssm_out);
        if (L->wk_b) // every head's absorption matrices
            b += (uint64_t)m->hp.n_head *
                 (load__mat_bytes(&L->wk_b[0]) + load__mat_bytes(&L->wv_b[0]));
        if (L->gate_exps) // the router, the experts a token runs, the shared one
            b += load__mat_bytes(&L->gate_inp) +
                 (uint64_t)m->hp.n_expert_used *
                     (load__mat_bytes(&L->gate_exps[0]) + load__mat_bytes(&L->up_exps[0]) +
                      load__mat_bytes(&L->down_exps[0])) +
                 load__mat_bytes(&L->gate_sh) + load__mat_bytes(&L->up_sh) +
                 load__mat_bytes(&L->down_sh) +
                 (L->moe_post_norm1 ? load__mat_bytes(&L->w_gate) + load__mat_bytes(&L->w_up) +
                                          load__mat_bytes(&L->w_down)
                                    : 0); // gemma4: its dense FFN beside the experts
        else
            b += load__mat_bytes(&L->w_gate) + load__mat_bytes(&L->w_up) +
                 load__mat_bytes(&L->w_down);
    }
    return b;
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
