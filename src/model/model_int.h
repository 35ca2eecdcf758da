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
    void *packed;       // data when it is the r16 copy (owned), else NULL
    size_t group_bytes; // bytes per r16 group of 16 rows when packed
    ks_dtype type;
    int64_t K, N;
    size_t row_bytes;
} model__mat;

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
};

#endif
