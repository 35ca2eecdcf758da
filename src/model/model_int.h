/* model_int.h — private model structures shared by load.c and forward.c. */
#ifndef KS_MODEL_INT_H
#define KS_MODEL_INT_H

#include "kvseal/kern.h"
#include "kvseal/model.h"

/* A weight matrix of N rows of K elements: GGUF rows in the file mapping,
 * or the model's r16 copy of them (kern.h) when the kernels want that
 * layout. GGUF/ggml shape is ne = [K, N]. */
typedef struct model__mat {
    const void *data;   // (N, row_bytes) raw GGUF rows, or N/16 r16 groups
    void *packed;       // data when it is the r16 copy (in model.arena), else NULL
    size_t group_bytes; // bytes per r16 group of 16 rows when packed
    ks_dtype type;
    int64_t K, N;
    size_t row_bytes;
} model__mat;

/* True for the architectures with multi-head latent attention. */
static inline bool model__is_mla(model_arch a) {
    return a == MODEL_ARCH_DEEPSEEK2 || a == MODEL_ARCH_DEEPSEEK32 || a == MODEL_ARCH_GLM_DSA;
}

typedef struct model__layer {
    const float *attn_norm;           // (E)
    model__mat wq, wk, wv, wo;        // wq: (H*D, E); wk, wv: (Hkv*D, E); wo: (E, H*D)
    const float *bq, *bk, *bv;        // (H*D), (Hkv*D), (Hkv*D) or NULL (qwen2 only)
    const float *q_norm, *k_norm;     // (D) or NULL (qwen3, gemma3; glm4moe where present)
    const float *ffn_norm;            // (E) (glm4moe: its post_attention_norm)
    model__mat w_gate, w_up, w_down;  // (F, E), (F, E), (E, F); unused in a MoE layer
    // mixture of experts (NULL arrays in a dense layer): the router and each
    // expert's slice of the 3-D GGUF tensors [K, N, n_expert]
    model__mat gate_inp;             // (n_expert, E) router
    model__mat *gate_exps, *up_exps; // (n_expert) of (F_exp, E)
    model__mat *down_exps;           // (n_expert) of (E, F_exp)
    const float *exp_probs_b;        // (n_expert) or NULL (glm4moe): selection bias
    model__mat gate_sh, up_sh;       // (F_exp, E) the shared expert (data NULL: none)
    model__mat down_sh;              // (E, F_exp)
    const float *post_attn_norm;     // (E) or NULL (gemma2/3 only): post_attention_norm
    const float *post_ffn_norm;      // (E) or NULL (gemma2/3 only): post_ffw_norm
    bool swa;                        // sliding-window layer (model_hparams.n_swa)
    // multi-head latent attention (deepseek2; wk/wv unused): Q through the
    // q_lora bottleneck (wq_a, q_a_norm, wq_b) or wq alone; the latent and
    // RoPE key from wkv_a; per-head absorption matrices from the 3-D tensors
    model__mat wq_a, wq_b;  // (q_lora, E), (H*mla_qk, q_lora); wq (H*mla_qk, E) if none
    const float *q_a_norm;  // (q_lora)
    model__mat wkv_a;       // (kv_lora + n_rot, E): attn_kv_a_mqa
    const float *kv_a_norm; // (kv_lora)
    model__mat *wk_b;       // (H) of (kv_lora, nope): q_nope -> latent space
    model__mat *wv_b;       // (H) of (mla_v, kv_lora): latent -> a head's output
    // the sparse-attention indexer (deepseek32, glm-dsa)
    model__mat idx_q_b;                     // (idx_heads * idx_dim, q_lora): indexer.attn_q_b
    model__mat idx_k;                       // (idx_dim, E): indexer.attn_k
    model__mat idx_proj;                    // (idx_heads, E): indexer.proj, the per-head weights
    const float *idx_k_norm, *idx_k_norm_b; // (idx_dim) LayerNorm of the key
} model__layer;

struct model {
    gguf_file *gguf;
    tok_vocab *vocab;
    model_hparams hp;
    model__mat tok_embd;  // (V, E)
    model__mat output;    // (V, E); = tok_embd when tied
    const float *output_norm;  // (E)
    model__layer *layers;      // (n_layer)
    float **owned;             // f32 copies of non-F32 vectors (norms, biases)
    int n_owned;
    void *arena; // every matrix's r16 copy, one huge-page buffer (ks_alloc_huge)
};

#endif
