/* cmd_mkmodel.c — `kvseal mkmodel`: a deterministic random-weight GGUF
 * model with real llama.cpp tensor names and shapes, so tests and benchmarks
 * run on realistic sizes without downloads.
 *
 * The tokenizer comes from a vocab GGUF (every tokenizer.* key is copied;
 * n_vocab = len(tokenizer.ggml.tokens)). Weights are uniform noise from a
 * splitmix64 stream seeded per (seed, tensor name, row), so the file is
 * byte-identical for the same arguments whatever the thread count. Rows are
 * generated, quantized (kern_quantize_row) and streamed to the writer in
 * chunks: a 1.1B-parameter model never sits in memory as floats.
 * Scales keep activations sane: matrices std 1/sqrt(fan_in), residual
 * outputs (attn_output, ffn_down) further / sqrt(2 n_layer), embedding std 1,
 * output.weight std 4/sqrt(n_embd) so logits have std ~4 (clear top-1). */
#include "mkmodel_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Deterministic noise

/* Fills x[0..n) for row `row` of t: uniform in [-a, a] (std a/sqrt(3)),
 * plus 1 for MK__ONES. Two 24-bit uniforms per splitmix64 output. */
static void mk__gen_row(const mk__tensor *t, int64_t row, float *x) {
    int64_t n = t->ne[0];
    uint64_t s = mk__mix(t->seed ^ mk__mix((uint64_t)row + 0x632be59bd9b4e019ull));
    float a = t->scale * 1.7320508f,
          c = t->kind == MK__ONES ? 1.0f : t->kind == MK__NEG ? -0.3f : 0.0f;
    const float k = 1.0f / 8388608.0f; // 2^-23: u in [0, 2)
    if (t->kind == MK__PROP) {
        for (int64_t i = 0; i < n; i++)
            x[i] = i < n / 4 ? 1.0f : 1e30f;
        return;
    }
    for (int64_t i = 0; i < n; i += 2) {
        uint64_t z = mk__mix(s += 0x9e3779b97f4a7c15ull);
        x[i] = c + a * ((float)(z >> 40) * k - 1.0f);
        if (i + 1 < n) x[i + 1] = c + a * ((float)(z & 0xffffff) * k - 1.0f);
    }
}

typedef struct {
    const mk__tensor *t;
    int64_t row0, n_rows;
    uint64_t row_bytes;
    atomic_llong next; /* next row of [0, n_rows) to claim */
} mk__job;

/* Pool task: claims rows dynamically (a worker may never join, see base.h);
 * each row depends only on (tensor seed, row), so who computes it is moot. */
static void mk__job_run(void *arg, int ith, int nth) {
    mk__job *j = arg;
    const mk__plan *p = j->t->plan;
    float *x = p->scratch + (size_t)ith * (size_t)p->max_row;
    (void)nth;
    int64_t r0, r1;
    int64_t step = 1 + 16384 / j->t->ne[0]; // ~16K elements per claim
    while (ks_pool_claim(&j->next, j->n_rows, step, &r0, &r1)) { // rows over ne[1] * ne[2]
        for (int64_t r = r0; r < r1; r++) {
            mk__gen_row(j->t, j->row0 + r, x);
            kern_quantize_row(j->t->type, x, p->chunk + (size_t)r * j->row_bytes, j->t->ne[0]);
        }
    }
}

/* gguf_fill_fn: generates, quantizes and streams the tensor in chunks. */
static ks_err mk__fill(void *ctx, const char *name, gguf_sink *sink, ks_errbuf *eb) {
    const mk__tensor *t = ctx;
    mk__plan *p = t->plan;
    uint64_t row_bytes;
    if (!ks_dtype_row_bytes(t->type, (uint64_t)t->ne[0], &row_bytes))
        return ks_seterr(eb, KS_ERR_INTERNAL, "%s: bad row", name);
    int64_t per_chunk = (int64_t)(p->chunk_cap / row_bytes);
    KS_ASSERT(per_chunk >= 1);
    const int64_t n_rows = t->ne[1] * t->ne[2];
    for (int64_t r0 = 0; r0 < n_rows; r0 += per_chunk) {
        mk__job j = {.t = t,
                     .row0 = r0,
                     .row_bytes = row_bytes,
                     .n_rows = n_rows - r0 < per_chunk ? n_rows - r0 : per_chunk};
        atomic_init(&j.next, 0);
        ks_pool_run(p->pool, mk__job_run, &j);
        ks_err e = gguf_sink_write(sink, p->chunk, (size_t)((uint64_t)j.n_rows * row_bytes));
        if (e) return ks_seterr(eb, e, "write failed");
    }
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Command

static void mk__usage(FILE *fp) {
    fprintf(
        fp,
        "usage: kvseal mkmodel -o OUT.gguf --vocab VOCAB.gguf [options]\n"
        "  --arch "
        "llama|mistral3|qwen2|qwen3|qwen3moe|qwen35|qwen35moe|phi3|gemma2|gemma3|gemma4|\n"
        "         glm4|glm4moe|deepseek2|deepseek32|glm-dsa|nemotron_h|gpt-oss|bert|nomic-bert\n"
        "         architecture\n"
        "                               (default llama); gemma: tied, post-norms, GELU\n"
        "                               gemma4: every --swa-period-th layer (default 6) full,\n"
        "                               with heads of --head-dim-full (default 2x --head-dim)\n"
        "                               and --n-head-kv-full K/V heads (default --n-head-kv),\n"
        "                               no attn_v there with --k-eq-v; proportional RoPE;\n"
        "                               --n-kv-shared S: the last S layers read earlier K/V\n"
        "                               (FFNs twice as wide); --n-embd-per-layer N: per-layer\n"
        "                               embeddings of N (E2B / E4B); --n-expert: experts\n"
        "                               beside every layer's FFN (26B-A4B), their gate and\n"
        "                               up in one ffn_gate_up_exps with --gate-up-exps;\n"
        "                               --suppress-tokens ID,...: logits llama.cpp's gemma4\n"
        "                               graph sets to -inf (tokenizer.ggml.suppress_tokens)\n"
        "                               gpt-oss: 4 layers (even ones slide, --swa 32), heads\n"
        "                               of 64, 8 experts (4 used, n_ff_exp 256), sinks,\n"
        "                               biases, YaRN factor 32 from 4096, base 150000\n"
        "                               bert: an encoder for embeddings (a WordPiece vocab)\n"
        "                               nomic-bert: bert with RoPE and SwiGLU, no biases\n"
        "  --pooling mean|cls           bert, nomic-bert: pooling_type (default mean)\n"
        "  --attn-temp-scale F          mistral3: attention.temperature_scale (the query's\n"
        "                               temperature over --rope-orig-ctx; default none)\n"
        "  --yarn-log-mul F             mistral3: rope.scaling.yarn_log_multiplier (RoPE's\n"
        "                               magnitude 1 / (1 + 0.1 F ln factor); default none)\n"
        "  --type T                     2-D weight type (default f16): f32 f16 bf16 q8_0 q4_0\n"
        "                               q4_1 q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k iq4_xs\n"
        "                               tq1_0 tq2_0 mxfp4\n"
        "  --shape tiny|1.1b|moe-3b     preset (default tiny: 256 embd, 2 layers, 8/2 heads,\n"
        "                               512 ff, ctx 512; 1.1b: TinyLlama 2048/22/32/4/5632/2048;\n"
        "                               moe-3b: 2048 embd, 14 layers, 16/4 heads of 128, 64\n"
        "                               experts of 512 (8 used), n_ff 4096, ctx 4096: about\n"
        "                               3.1B parameters, 0.57B read per token as qwen3moe)\n"
        "  --n-embd N --n-layer N --n-head N --n-head-kv N --n-ff N --ctx N --head-dim N\n"
        "  --n-expert N --n-expert-used K --n-ff-exp N\n"
        "                               mixture of experts (llama: Mixtral style; qwen3moe\n"
        "                               and glm4moe default 8 experts, 2 used, n_ff_exp n_ff/2)\n"
        "  --n-dense N                  glm4moe: leading dense layers (default 1); its other\n"
        "                               defaults: 3 layers + 1 NextN block, a shared expert,\n"
        "                               expert_weights_scale 2.5, norm on, half-head rotary\n"
        "                               deepseek2/32, glm-dsa: with --n-expert N, MoE layers\n"
        "                               from layer --n-dense (default 1), DeepSeek-V3 style\n"
        "  --n-shared S                 glm4moe, MLA with --n-expert: S shared experts, one\n"
        "                               FFN S * n_ff_exp wide (default 1; DeepSeek-V2: 2)\n"
        "  --nextn N                    glm4moe, deepseek2/32, glm-dsa, qwen35(moe): N NextN (MTP)\n"
        "                               blocks after the layers, which inference\n"
        "                               skips (glm4moe default 1, others 0)\n"
        "  --nextn-head                 the NextN blocks' own output matrix\n"
        "                               (nextn.shared_head_head, as large as output.weight)\n"
        "  --expert-groups G --group-used U  expert groups: the top-k is drawn from the U\n"
        "                               groups whose two best experts score highest\n"
        "  --qk-norm                    glm4moe: attn_q_norm / attn_k_norm tensors\n"
        "  --ssm-state S --ssm-k-heads N --ssm-v-heads N --ssm-conv K --attn-interval I\n"
        "                               qwen35's Gated DeltaNet: state size (default 32), key\n"
        "                               and value heads (2, 4), convolution width (4), every\n"
        "                               I-th layer attention (4; tiny: 4 layers)\n"
        "  --pattern P --ssm-head-dim N nemotron_h: a layer per character, M Mamba2, *\n"
        "                               attention (no RoPE), - squared-ReLU MLP (default\n"
        "                               M-M*-M-); with --ssm-state (32), --ssm-k-heads (groups,\n"
        "                               2), --ssm-v-heads (heads, 8), --ssm-head-dim (32),\n"
        "                               --ssm-conv (4)\n"
        "  --tied                       no output.weight (logits use token_embd)\n"
        "  --seed S                     weight seed (default 1)\n"
        "  --rope-base F --rope-scale F (scaling factor; linear unless --rope-type yarn)\n"
        "  --rope-type linear|yarn --rope-orig-ctx N (YaRN's original context)\n"
        "  --rope-freqs                 a rope_freqs.weight tensor (Llama 3 style per-pair\n"
        "                               angle divisors, random in [0.13, 1.87])\n"
        "  --longrope                   phi3's LongRoPE: rope_factors_short/long tensors and\n"
        "                               rope.scaling.attn_factor (long ones past --rope-orig-ctx)\n"
        "  --kv-lora N --q-lora N --qk-nope N --qk-rope N --v-head N\n"
        "                               deepseek2's MLA: latent rank (default 128), query\n"
        "                               rank (192; 0: one attn_q), a head's nope and rope\n"
        "                               dims (64, 32) and output dims (64); every FFN dense\n"
        "  --idx-heads N --idx-dim N --idx-topk K\n"
        "                               deepseek32/glm-dsa's sparse-attention indexer: heads\n"
        "                               (default 8), key length (64), positions kept (8)\n"
        "  --swa N                      attention.sliding_window: gemma's sliding layers\n"
        "                               (default 32); llama: every layer (Mistral style)\n"
        "  --attn-softcap F --final-softcap F  gemma: score / logit soft-capping (gemma2\n"
        "                               default 50 / 30; gemma3 none unless given)\n"
        "  --qk-gain G                  attn_q/k weights G times larger: attention that depends\n"
        "                               on position (so a RoPE mistake shows in perplexity)\n"
        "  --name NAME                  general.name\n"
        "  --lora-of BASE.gguf          a LoRA adapter for BASE instead (kvseal mklora: see\n"
        "                               its --help; --lora-type, --lora-targets, --rank, ...)\n"
        "  -t N                         threads (output does not depend on it)\n");
}

/* general.file_type (llama.cpp's llama_ftype) for an all-`t` model. */
static uint32_t mk__file_type(ks_dtype t) {
    switch (t) {
    case KS_DTYPE_F32:
        return 0;
    case KS_DTYPE_F16:
        return 1;
    case KS_DTYPE_Q4_0:
        return 2;
    case KS_DTYPE_Q8_0:
        return 7;
    case KS_DTYPE_Q4_K:
        return 14; // Q4_K_S
    case KS_DTYPE_Q6_K:
        return 18;
    case KS_DTYPE_Q4_1:
        return 3;
    case KS_DTYPE_Q5_0:
        return 8;
    case KS_DTYPE_Q5_1:
        return 9;
    case KS_DTYPE_Q2_K:
        return 10;
    case KS_DTYPE_Q3_K:
        return 11; // Q3_K_S
    case KS_DTYPE_Q5_K:
        return 16; // Q5_K_S
    case KS_DTYPE_IQ4_NL:
        return 25;
    case KS_DTYPE_IQ4_XS:
        return 30;
    case KS_DTYPE_TQ1_0:
        return 36;
    case KS_DTYPE_TQ2_0:
        return 37;
    case KS_DTYPE_MXFP4:
        return 38; // MXFP4_MOE, the only llama.cpp file type that holds it
    case KS_DTYPE_BF16:
        return 32;
    default:
        return 0;
    }
}

/* Checks the shape against the weight type's block size; prints why not. */
static bool mk__check_shape(const mk__opts *o) {
    if (o->n_embd < 1 || o->n_layer < 1 || o->n_head < 1 || o->n_head_kv < 1 || o->n_ff < 1 ||
        o->n_ctx < 1 || o->head_dim < 2) {
        fprintf(stderr, "kvseal mkmodel: all sizes must be positive\n");
        return false;
    }
    if (o->n_head % o->n_head_kv) {
        fprintf(stderr, "kvseal mkmodel: --n-head %ld is not a multiple of --n-head-kv %ld\n",
                o->n_head, o->n_head_kv);
        return false;
    }
    if (o->head_dim % 2) {
        fprintf(stderr, "kvseal mkmodel: head dim %ld must be even (RoPE rotates pairs)\n",
                o->head_dim);
        return false;
    }
    uint32_t be = ks_dtype_block_elems(o->type);
    const struct {
        const char *what;
        long n;
    } rows[] = {{"n_embd (rows of token_embd, attn_q/k/v, ffn_gate/up, output)", o->n_embd},
                {"n_head*head_dim (rows of attn_output)", o->kv_lora ? 0 : o->n_head * o->head_dim},
                {"n_ff (rows of ffn_down)", o->n_ff},
                {"n_ff_exp (rows of ffn_down_exps)", o->n_expert ? o->n_ff_exp : 0},
                {"q_lora (rows of attn_q_b)", o->q_lora},
                {"qk_nope (rows of attn_k_b)", o->qk_nope},
                {"kv_lora (rows of attn_v_b)", o->kv_lora},
                {"n_head*v_head (rows of attn_output)", o->n_head * o->v_head},
                {"ssm heads*head_dim (rows of ssm_out)",
                 o->pattern ? o->ssm_v_heads * o->ssm_head_dim : 0}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (rows[i].n % be) {
            fprintf(stderr,
                    "kvseal mkmodel: --type %s needs rows that are a multiple of its block size "
                    "%u, but %s = %ld\n",
                    ks_dtype_name(o->type), be, rows[i].what, rows[i].n);
            return false;
        }
    }
    return true;
}

/* Most layers a nemotron_h --pattern may name. */
#define MK__MAX_LAYERS 1024

static bool mk__set_keys(gguf_writer *w, const mk__opts *o, const gguf_file *vocab,
                         int64_t n_vocab) {
    char k[128];
    const char *a = o->arch;
    bool ok = !gguf_writer_set_str(w, "general.architecture", a) &&
              !gguf_writer_set_str(w, "general.name", o->name) &&
              !gguf_writer_set_u32(w, "general.file_type", mk__file_type(o->type));
    if (ok && ks_dtype_block_elems(o->type) > 1)
        ok = !gguf_writer_set_u32(w, "general.quantization_version", 2);
#define MK__U32(suffix, v)                                                                         \
    (snprintf(k, sizeof k, "%s." suffix, a), !gguf_writer_set_u32(w, k, (uint32_t)(v)))
#define MK__F32(suffix, v)                                                                         \
    (snprintf(k, sizeof k, "%s." suffix, a), !gguf_writer_set_f32(w, k, (float)(v)))
    ok = ok && MK__U32("vocab_size", n_vocab) && MK__U32("context_length", o->n_ctx) &&
         MK__U32("embedding_length", o->n_embd) &&
         MK__U32("block_count", o->n_layer + o->n_nextn) &&
         MK__U32("attention.head_count", o->n_head) &&
         MK__F32("attention.layer_norm_rms_epsilon", o->eps);
    const bool g4 = !strcmp(a, "gemma4");
    if (ok && !o->pattern)
        ok = ((g4 && o->n_kv_shared) || MK__U32("feed_forward_length", o->n_ff)) &&
             ((g4 && o->n_head_kv_full != o->n_head_kv) || // gemma4: then an array (below)
              MK__U32("attention.head_count_kv", o->n_head_kv)) &&
             MK__F32("rope.freq_base", o->rope_base) && MK__U32("rope.dimension_count", o->n_rot);
    if (ok && o->pattern) { // nemotron_h: the layer kinds in per-layer arrays, no RoPE
        int32_t kv[MK__MAX_LAYERS], ff[MK__MAX_LAYERS];
        for (long l = 0; l < o->n_layer; l++) {
            kv[l] = o->pattern[l] == '*' ? (int32_t)o->n_head_kv : 0;
            ff[l] = o->pattern[l] == '-' ? (int32_t)o->n_ff : 0;
        }
        ok = (snprintf(k, sizeof k, "%s.attention.head_count_kv", a),
              !gguf_writer_set_arr(w, k, GGUF_TYPE_INT32, kv, (uint64_t)o->n_layer)) &&
             (snprintf(k, sizeof k, "%s.feed_forward_length", a),
              !gguf_writer_set_arr(w, k, GGUF_TYPE_INT32, ff, (uint64_t)o->n_layer)) &&
             MK__U32("attention.key_length", o->head_dim) &&
             MK__U32("attention.value_length", o->head_dim) &&
             MK__U32("ssm.conv_kernel", o->ssm_conv) && MK__U32("ssm.state_size", o->ssm_state) &&
             MK__U32("ssm.group_count", o->ssm_k_heads) &&
             MK__U32("ssm.time_step_rank", o->ssm_v_heads) &&
             MK__U32("ssm.inner_size", o->ssm_v_heads * o->ssm_head_dim);
    }
    if (ok && o->n_expert)
        ok = MK__U32("expert_count", o->n_expert) &&
             MK__U32("expert_used_count", o->n_expert_used) &&
             ((o->n_ff_exp == o->n_ff && !g4) || // gemma4: llama.cpp's default is 0
              MK__U32("expert_feed_forward_length", o->n_ff_exp));
    if (ok && o->kv_lora) // MLA as llama.cpp's converter writes it
        ok = MK__U32("attention.kv_lora_rank", o->kv_lora) &&
             MK__U32("attention.q_lora_rank", o->q_lora) &&
             MK__U32("attention.key_length", o->kv_lora + o->n_rot) &&
             MK__U32("attention.value_length", o->kv_lora) &&
             MK__U32("attention.key_length_mla", o->qk_nope + o->n_rot) &&
             MK__U32("attention.value_length_mla", o->v_head);
    if (ok && o->kv_lora && !o->n_expert) // every FFN dense; llama.cpp still wants the MoE keys
        ok = MK__U32("leading_dense_block_count", o->n_layer) && MK__U32("expert_count", 4) &&
             MK__U32("expert_used_count", 2) &&
             MK__U32("expert_feed_forward_length", o->n_ff / 2) &&
             MK__U32("expert_shared_count", 1) && MK__F32("expert_weights_scale", 1.0) &&
             MK__U32("expert_gating_func", 1);
    if (ok && o->kv_lora && o->n_expert) // DeepSeek-V3 style: sigmoid, bias, norm, scale
        ok =
            MK__U32("expert_feed_forward_length", o->n_ff_exp) &&
            MK__U32("expert_shared_count", (uint32_t)o->n_shared) &&
            MK__U32("leading_dense_block_count", o->n_dense) && MK__U32("expert_gating_func", 2) &&
            MK__F32("expert_weights_scale", 2.5) &&
            (snprintf(k, sizeof k, "%s.expert_weights_norm", a), !gguf_writer_set_bool(w, k, true));
    if (ok && o->n_groups)
        ok = MK__U32("expert_group_count", o->n_groups) &&
             MK__U32("expert_group_used_count", o->n_group_used);
    if (ok && o->idx_topk)
        ok = MK__U32("attention.indexer.head_count", o->idx_heads) &&
             MK__U32("attention.indexer.key_length", o->idx_dim) &&
             MK__U32("attention.indexer.top_k", o->idx_topk) &&
             MK__F32("attention.layer_norm_epsilon", 1e-6);
    if (ok && !strcmp(a, "llama") && o->n_swa) // Mistral style: every layer slides
        ok = MK__U32("attention.sliding_window", o->n_swa);
    if (ok && !strcmp(a, "gpt-oss")) // as convert_hf_to_gguf.py writes gpt-oss's config
        ok = MK__U32("attention.sliding_window", o->n_swa) &&
             (o->n_ff_exp != o->n_ff || MK__U32("expert_feed_forward_length", o->n_ff_exp)) &&
             (o->head_dim * o->n_head != o->n_embd ||
              (MK__U32("attention.key_length", o->head_dim) &&
               MK__U32("attention.value_length", o->head_dim)));
    if (ok && !strcmp(a, "glm4moe")) // as convert_hf_to_gguf.py writes GLM-4.5's config
        ok =
            (o->n_ff_exp != o->n_ff || MK__U32("expert_feed_forward_length", o->n_ff_exp)) &&
            MK__U32("expert_shared_count", (uint32_t)o->n_shared) &&
            MK__U32("leading_dense_block_count", o->n_dense) && MK__U32("expert_gating_func", 2) &&
            MK__F32("expert_weights_scale", 2.5) &&
            (snprintf(k, sizeof k, "%s.expert_weights_norm", a), !gguf_writer_set_bool(w, k, true));
    if (ok && (o->n_nextn || !strcmp(a, "glm4moe")))
        ok = MK__U32("nextn_predict_layers", o->n_nextn);
    if (ok && !strncmp(a, "gemma", 5)) {
        ok = MK__U32("attention.sliding_window", o->n_swa);
        if (ok && o->attn_softcap > 0) ok = MK__F32("attn_logit_softcapping", o->attn_softcap);
        if (ok && o->final_softcap > 0) ok = MK__F32("final_logit_softcapping", o->final_softcap);
    }
    if (ok && g4) { // as llama.cpp's converter writes Gemma 4's config
        uint8_t swa[MK__MAX_LAYERS];
        int32_t kv[MK__MAX_LAYERS], ff[MK__MAX_LAYERS];
        for (long l = 0; l < o->n_layer; l++) {
            swa[l] = mk__g4_swa(o, l);
            kv[l] = (int32_t)(swa[l] ? o->n_head_kv : o->n_head_kv_full);
            ff[l] = (int32_t)mk__g4_ff(o, l);
        }
        ok = (snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", a),
              !gguf_writer_set_arr(w, k, GGUF_TYPE_BOOL, swa, (uint64_t)o->n_layer)) &&
             (o->n_head_kv_full == o->n_head_kv ||
              (snprintf(k, sizeof k, "%s.attention.head_count_kv", a),
               !gguf_writer_set_arr(w, k, GGUF_TYPE_INT32, kv, (uint64_t)o->n_layer))) &&
             MK__U32("attention.key_length", o->head_dim_full) &&
             MK__U32("attention.value_length", o->head_dim_full) &&
             MK__U32("attention.key_length_swa", o->head_dim) &&
             MK__U32("attention.value_length_swa", o->head_dim) &&
             MK__U32("rope.dimension_count_swa", o->head_dim) &&
             MK__F32("rope.freq_base_swa", 10000.0) &&
             MK__U32("attention.shared_kv_layers", o->n_kv_shared) &&
             MK__U32("embedding_length_per_layer_input", o->n_embd_pl) &&
             (!o->n_kv_shared || // the shared layers' FFNs twice as wide: an array
              (snprintf(k, sizeof k, "%s.feed_forward_length", a),
               !gguf_writer_set_arr(w, k, GGUF_TYPE_INT32, ff, (uint64_t)o->n_layer)));
    }
    if (ok && !o->kv_lora && !o->pattern && !g4 &&
        (!strncmp(a, "qwen3", 5) || !strncmp(a, "gemma", 5) ||
         o->head_dim * o->n_head != o->n_embd))
        ok = MK__U32("attention.key_length", o->head_dim) &&
             MK__U32("attention.value_length", o->head_dim);
    if (ok && o->ssm_state && o->n_expert) // qwen35moe: the shared expert's width
        ok = MK__U32("expert_shared_feed_forward_length", o->n_ff_exp * o->n_shared);
    if (ok && o->ssm_state && !o->pattern) { // qwen35, as llama.cpp's converter writes Qwen3.5's config
        const uint32_t a2 = (uint32_t)o->n_rot / 2; // rotary pairs over the first 3 sections
        const int32_t sec[4] = {(int32_t)(a2 + 2) / 3, (int32_t)(a2 + 1) / 3, (int32_t)a2 / 3, 0};
        ok = MK__U32("ssm.conv_kernel", o->ssm_conv) && MK__U32("ssm.state_size", o->ssm_state) &&
             MK__U32("ssm.group_count", o->ssm_k_heads) &&
             MK__U32("ssm.time_step_rank", o->ssm_v_heads) &&
             MK__U32("ssm.inner_size", o->ssm_v_heads * o->ssm_state) &&
             MK__U32("full_attention_interval", o->attn_interval) &&
             (snprintf(k, sizeof k, "%s.rope.dimension_sections", a),
              !gguf_writer_set_arr(w, k, GGUF_TYPE_INT32, sec, 4));
    }
    if (ok && o->attn_temp_scale) // mistral3's query temperature, over the original context
        ok = MK__F32("attention.temperature_scale", o->attn_temp_scale);
    if (ok && o->yarn_log_mul) // mistral3's converter: mscale_all_dim
        ok = MK__F32("rope.scaling.yarn_log_multiplier", o->yarn_log_mul);
    if (ok && (!strcmp(a, "bert") || !strcmp(a, "nomic-bert"))) // an encoder: LayerNorm eps,
                                                                  // bidirectional, its pooling
        ok = MK__F32("attention.layer_norm_epsilon", o->eps) &&
             (snprintf(k, sizeof k, "%s.attention.causal", a), !gguf_writer_set_bool(w, k, false)) &&
             MK__U32("pooling_type", o->pooling);
    if (ok && o->longrope) // sqrt(1 + ln(scale) / ln(original context)), scale 32, orig 4096
        ok = MK__F32("rope.scaling.attn_factor", 1.1902380714238083);
    if (ok && o->rope_orig_ctx && o->rope_scale == 1.0)
        ok = MK__U32("rope.scaling.original_context_length", o->rope_orig_ctx);
    if (ok && o->rope_scale != 1.0) {
        snprintf(k, sizeof k, "%s.rope.scaling.type", a);
        ok = !gguf_writer_set_str(w, k, o->rope_type) &&
             MK__F32("rope.scaling.factor", o->rope_scale);
        if (ok && o->rope_orig_ctx)
            ok = MK__U32("rope.scaling.original_context_length", o->rope_orig_ctx);
    }
#undef MK__U32
#undef MK__F32
    for (uint64_t i = 0; ok && i < gguf_n_kv(vocab); i++) {
        const char *key = gguf_kv_at(vocab, i)->key;
        if (!strncmp(key, "tokenizer.", 10) &&
            (!o->n_suppress || strcmp(key, "tokenizer.ggml.suppress_tokens")))
            ok = !gguf_writer_copy_kv(w, vocab, key);
    }
    if (ok && o->n_suppress)
        ok = !gguf_writer_set_arr(w, "tokenizer.ggml.suppress_tokens", GGUF_TYPE_INT32, o->suppress,
                                  (uint64_t)o->n_suppress);
    return ok;
}

// options: every one takes a value but the flags listed first
static const cli__opt mk__optv[] = {
    {"tied", 0, false, false},         {"rope-freqs", 0, false, false},
    {"longrope", 0, false, false},     {"qk-norm", 0, false, false},
    {"k-eq-v", 0, false, false},       {"gate-up-exps", 0, false, false},
    {"nextn-head", 0, false, false},   {"head-dim-full", 0, true, false},
    {"n-head-kv-full", 0, true, false}, {"swa-period", 0, true, false},
    {"n-kv-shared", 0, true, false},   {"n-embd-per-layer", 0, true, false},
    {"suppress-tokens", 0, true, false},
    {"output", 'o', true, false},      {"vocab", 0, true, false},
    {"arch", 0, true, false},          {"shape", 0, true, false},
    {"name", 0, true, false},          {"type", 0, true, false},
    {"rope-type", 0, true, false},     {"n-shared", 0, true, false},
    {"nextn", 0, true, false},         {"n-dense", 0, true, false},
    {"rope-orig-ctx", 0, true, false}, {"seed", 0, true, false},
    {"threads", 't', true, false},     {"rope-base", 0, true, false},
    {"attn-softcap", 0, true, false},  {"final-softcap", 0, true, false},
    {"qk-gain", 0, true, false},       {"q-lora", 0, true, false},
    {"rope-scale", 0, true, false},    {"n-embd", 0, true, false},
    {"n-layer", 0, true, false},       {"n-head", 0, true, false},
    {"n-head-kv", 0, true, false},     {"n-ff", 0, true, false},
    {"ctx", 0, true, false},           {"head-dim", 0, true, false},
    {"n-expert", 0, true, false},      {"n-expert-used", 0, true, false},
    {"n-ff-exp", 0, true, false},      {"swa", 0, true, false},
    {"kv-lora", 0, true, false},       {"qk-nope", 0, true, false},
    {"qk-rope", 0, true, false},       {"v-head", 0, true, false},
    {"idx-heads", 0, true, false},     {"idx-dim", 0, true, false},
    {"idx-topk", 0, true, false},      {"expert-groups", 0, true, false},
    {"group-used", 0, true, false},    {"ssm-state", 0, true, false},
    {"ssm-k-heads", 0, true, false},   {"ssm-v-heads", 0, true, false},
    {"ssm-conv", 0, true, false},      {"attn-interval", 0, true, false},
    {"attn-temp-scale", 0, true, false}, {"yarn-log-mul", 0, true, false},
    {"pattern", 0, true, false},       {"ssm-head-dim", 0, true, false},
    {"pooling", 0, true, false},
};

/* What the options set before the shape is resolved. */
typedef struct {
    mk__opts o;
    const char *shape;
    long v_embd, v_layer, v_head, v_head_kv, v_ff, v_ctx, v_hd;
    long qk_rope;    // deepseek2: rope.dimension_count
    bool q_lora_set; // --q-lora given (0 is a value)
    double rope_base;
    long v_dense, v_nextn, v_shared;
} mk__cfg;

static void mk__usage_cmd(const char *cmd) {
    (void)cmd;
    mk__usage(stderr);
}

static int mk__apply(void *ctx, int id, const char *v, bool reset) {
    mk__cfg *c = ctx;
    mk__opts *o = &c->o;
    (void)reset;
    char a[40]; // the option as --name, for messages
    snprintf(a, sizeof a, "--%s", mk__optv[id].name);
    long x;
    if (id < 7) {
        bool on = !strcmp(v, "true");
        *(id == 0   ? &o->tied
          : id == 1 ? &o->rope_freqs
          : id == 2 ? &o->longrope
          : id == 3 ? &o->qk_norm
          : id == 4 ? &o->k_eq_v
          : id == 5 ? &o->gate_up_exps
                    : &o->nextn_head) = on;
        return 0;
    }
    if (!strcmp(a, "--output"))
        o->out = v;
    else if (!strcmp(a, "--vocab"))
        o->vocab = v;
    else if (!strcmp(a, "--arch"))
        o->arch = v;
    else if (!strcmp(a, "--shape"))
        c->shape = v;
    else if (!strcmp(a, "--name"))
        o->name = v;
    else if (!strcmp(a, "--pattern"))
        o->pattern = v;
    else if (!strcmp(a, "--suppress-tokens")) { // ID[,ID...]
        o->n_suppress = 0;
        for (const char *p = v; *p;) {
            char *end;
            const long tid = strtol(p, &end, 10);
            if (end == p || tid < 0 || tid > INT32_MAX || o->n_suppress == 64 ||
                (*end && *end != ',')) {
                fprintf(stderr, "kvseal mkmodel: --suppress-tokens '%s': up to 64 ids, "
                                "comma-separated\n", v);
                return 2;
            }
            o->suppress[o->n_suppress++] = (int32_t)tid;
            p = *end ? end + 1 : end;
        }
    }
    else if (!strcmp(a, "--type")) {
        if (!ks_dtype_parse(v, &o->type) || !kern_quantize_supported(o->type)) {
            fprintf(stderr,
                    "kvseal mkmodel: --type '%s' is not one of f32 f16 bf16 q8_0 "
                    "q4_0 q4_1 q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k iq4_xs tq1_0 tq2_0 "
                    "mxfp4\n",
                    v);
            return 2;
        }
    } else if (!strcmp(a, "--rope-type")) {
        if (strcmp(v, "linear") && strcmp(v, "yarn")) {
            fprintf(stderr, "kvseal mkmodel: --rope-type '%s' is not linear or yarn\n", v);
            return 2;
        }
        o->rope_type = v;
    } else if (!strcmp(a, "--pooling")) {
        if (strcmp(v, "mean") && strcmp(v, "cls")) {
            fprintf(stderr, "kvseal mkmodel: --pooling '%s' is not mean or cls\n", v);
            return 2;
        }
        o->pooling = !strcmp(v, "mean") ? 1 : 2;
    } else if (!strcmp(a, "--n-shared")) {
        if (!cli__parse_int(a, v, 0, 8, &c->v_shared)) return 2;
    } else if (!strcmp(a, "--nextn")) {
        if (!cli__parse_int(a, v, 0, 4, &c->v_nextn)) return 2;
    } else if (!strcmp(a, "--n-dense")) {
        if (!cli__parse_int(a, v, 0, 1L << 20, &c->v_dense)) return 2;
    } else if (!strcmp(a, "--rope-orig-ctx")) {
        if (!cli__parse_int(a, v, 1, 1 << 24, &o->rope_orig_ctx)) return 2;
    } else if (!strcmp(a, "--seed")) {
        if (!cli__parse_int(a, v, 0, 0x7fffffffffffffffL, &x)) return 2;
        o->seed = (uint64_t)x;
    } else if (!strcmp(a, "--threads")) {
        if (!cli__parse_int("-t", v, 1, 256, &x)) return 2;
        o->n_threads = (int)x;
    } else if (!strcmp(a, "--rope-base")) {
        if (!cli__parse_float(a, v, &c->rope_base) || !(c->rope_base > 0)) return 2;
    } else if (!strcmp(a, "--attn-softcap") || !strcmp(a, "--final-softcap")) {
        double *dst = a[2] == 'a' ? &o->attn_softcap : &o->final_softcap;
        if (!cli__parse_float(a, v, dst) || !(*dst > 0)) return 2;
    } else if (!strcmp(a, "--attn-temp-scale")) {
        if (!cli__parse_float(a, v, &o->attn_temp_scale) || !(o->attn_temp_scale > 0)) return 2;
    } else if (!strcmp(a, "--yarn-log-mul")) {
        if (!cli__parse_float(a, v, &o->yarn_log_mul) || !(o->yarn_log_mul > 0)) return 2;
    } else if (!strcmp(a, "--qk-gain")) {
        if (!cli__parse_float(a, v, &o->qk_gain) || !(o->qk_gain > 0)) return 2;
    } else if (!strcmp(a, "--q-lora")) { // 0: one attn_q matrix
        if (!cli__parse_int(a, v, 0, 1L << 20, &o->q_lora)) return 2;
        c->q_lora_set = true;
    } else if (!strcmp(a, "--rope-scale")) {
        if (!cli__parse_float(a, v, &o->rope_scale) || !(o->rope_scale > 0)) return 2;
    } else {
        long *dst = !strcmp(a, "--n-embd")          ? &c->v_embd
                    : !strcmp(a, "--n-layer")       ? &c->v_layer
                    : !strcmp(a, "--n-head")        ? &c->v_head
                    : !strcmp(a, "--n-head-kv")     ? &c->v_head_kv
                    : !strcmp(a, "--n-ff")          ? &c->v_ff
                    : !strcmp(a, "--ctx")           ? &c->v_ctx
                    : !strcmp(a, "--head-dim")      ? &c->v_hd
                    : !strcmp(a, "--n-expert")      ? &o->n_expert
                    : !strcmp(a, "--n-expert-used") ? &o->n_expert_used
                    : !strcmp(a, "--n-ff-exp")      ? &o->n_ff_exp
                    : !strcmp(a, "--swa")           ? &o->n_swa
                    : !strcmp(a, "--kv-lora")       ? &o->kv_lora
                    : !strcmp(a, "--qk-nope")       ? &o->qk_nope
                    : !strcmp(a, "--qk-rope")       ? &c->qk_rope
                    : !strcmp(a, "--v-head")        ? &o->v_head
                    : !strcmp(a, "--idx-heads")     ? &o->idx_heads
                    : !strcmp(a, "--idx-dim")       ? &o->idx_dim
                    : !strcmp(a, "--idx-topk")      ? &o->idx_topk
                    : !strcmp(a, "--expert-groups") ? &o->n_groups
                    : !strcmp(a, "--group-used")    ? &o->n_group_used
                    : !strcmp(a, "--ssm-state")     ? &o->ssm_state
                    : !strcmp(a, "--ssm-k-heads")   ? &o->ssm_k_heads
                    : !strcmp(a, "--ssm-v-heads")   ? &o->ssm_v_heads
                    : !strcmp(a, "--ssm-conv")      ? &o->ssm_conv
                    : !strcmp(a, "--attn-interval") ? &o->attn_interval
                    : !strcmp(a, "--ssm-head-dim")  ? &o->ssm_head_dim
                    : !strcmp(a, "--head-dim-full") ? &o->head_dim_full
                    : !strcmp(a, "--n-head-kv-full") ? &o->n_head_kv_full
                    : !strcmp(a, "--swa-period")    ? &o->swa_period
                    : !strcmp(a, "--n-kv-shared")   ? &o->n_kv_shared
                    : !strcmp(a, "--n-embd-per-layer") ? &o->n_embd_pl
                                                    : NULL;
        KS_ASSERT(dst); // every table entry has a case
        if (!cli__parse_int(a, v, 1, 1L << 20, dst)) return 2;
    }
    return 0;
}

/* `mkmodel --lora-of BASE.gguf ...`: kvseal mklora under mkmodel's name,
 * with --lora-of for -m, --lora-type for --type, --lora-targets for
 * --targets (the other options as mklora's). */
static int mk__lora_of(int argc, char **argv) {
    char **av = calloc((size_t)argc + 1, sizeof *av);
    if (!av) return 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        av[i] = !strcmp(a, "--lora-of")       ? "--model"
                : !strcmp(a, "--lora-type")    ? "--type"
                : !strcmp(a, "--lora-targets") ? "--targets"
                                               : argv[i];
    }
    const int rc = cli_mklora(argc, av);
    free(av);
    return rc;
}

int cli_mkmodel(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--lora-of")) return mk__lora_of(argc, argv);
    mk__cfg cf = {.o = {.arch = "llama",
                        .type = KS_DTYPE_F16,
                        .seed = 1,
                        .n_shared = 1,
                        .rope_scale = 1.0,
                        .qk_gain = 1.0,
                        .rope_type = "linear",
                        .n_threads = cli__default_threads()},
                  .shape = "tiny",
                  .v_dense = -1,
                  .v_nextn = -1,
                  .v_shared = -1};
    const cli__spec sp = {"mkmodel", mk__optv,      (int)(sizeof mk__optv / sizeof mk__optv[0]),
                          mk__apply, mk__usage_cmd, false,
                          false};
    int prc = cli__opts_parse(&sp, &cf, argc, argv, NULL);
    if (prc) return prc < 0 ? 0 : prc;
    mk__opts o = cf.o;
    const char *shape = cf.shape;
    long v_embd = cf.v_embd, v_layer = cf.v_layer, v_head = cf.v_head, v_head_kv = cf.v_head_kv,
         v_ff = cf.v_ff, v_ctx = cf.v_ctx, v_hd = cf.v_hd;
    long qk_rope = cf.qk_rope;
    bool q_lora_set = cf.q_lora_set;
    double rope_base = cf.rope_base;
    long v_dense = cf.v_dense, v_nextn = cf.v_nextn, v_shared = cf.v_shared;
    if (!o.out || !o.vocab) {
        fprintf(stderr, "kvseal mkmodel: -o and --vocab are required\n");
        mk__usage(stderr);
        return 2;
    }
    const bool qwen35 = !strcmp(o.arch, "qwen35") || !strcmp(o.arch, "qwen35moe");
    bool qwen = !strcmp(o.arch, "qwen2") || !strcmp(o.arch, "qwen3") ||
                !strcmp(o.arch, "qwen3moe") || qwen35;
    const bool g4 = !strcmp(o.arch, "gemma4");
    bool gemma = !strcmp(o.arch, "gemma2") || !strcmp(o.arch, "gemma3") || g4;
    const bool dsa = !strcmp(o.arch, "deepseek32") || !strcmp(o.arch, "glm-dsa");
    const bool mla = dsa || !strcmp(o.arch, "deepseek2");
    const bool glm4moe = !strcmp(o.arch, "glm4moe");
    // mistral3: llama's tensors, its own rope magnitude and query temperature
    const bool mistral3 = !strcmp(o.arch, "mistral3");
    const bool llama = !strcmp(o.arch, "llama") || mistral3;
    const bool nh = !strcmp(o.arch, "nemotron_h");
    const bool oss = !strcmp(o.arch, "gpt-oss");
    const bool bert = !strcmp(o.arch, "bert") || !strcmp(o.arch, "nomic-bert");
    if (!qwen && !gemma && !mla && !glm4moe && !nh && !oss && !bert && !llama &&
        strcmp(o.arch, "phi3") && strcmp(o.arch, "glm4")) {
        fprintf(stderr,
                "kvseal mkmodel: --arch '%s' is not one of llama mistral3 qwen2 qwen3 qwen3moe "
                "qwen35 qwen35moe phi3 gemma2 gemma3 gemma4 glm4 glm4moe deepseek2 deepseek32 glm-dsa "
                "nemotron_h gpt-oss bert nomic-bert\n",
                o.arch);
        return 2;
    }
    if ((o.attn_temp_scale || o.yarn_log_mul) && !mistral3) {
        fprintf(stderr, "kvseal mkmodel: --attn-temp-scale and --yarn-log-mul are mistral3's\n");
        return 2;
    }
    if ((o.k_eq_v || o.head_dim_full || o.n_head_kv_full || o.swa_period || o.n_kv_shared ||
         o.n_embd_pl || o.gate_up_exps) &&
        !g4) {
        fprintf(stderr, "kvseal mkmodel: --k-eq-v --head-dim-full --n-head-kv-full --swa-period "
                        "--n-kv-shared --n-embd-per-layer --gate-up-exps are gemma4's\n");
        return 2;
    }
    if (o.pooling && !bert) {
        fprintf(stderr, "kvseal mkmodel: --pooling is bert's\n");
        return 2;
    }
    if ((!qwen35 && !nh && (o.ssm_state || o.ssm_k_heads || o.ssm_v_heads || o.ssm_conv)) ||
        (!qwen35 && o.attn_interval) || (!nh && (o.pattern || o.ssm_head_dim))) {
        fprintf(stderr, "kvseal mkmodel: --ssm-* are qwen35's and nemotron_h's, --attn-interval "
                        "qwen35's, --pattern and --ssm-head-dim nemotron_h's\n");
        return 2;
    }
    if (nh) { // tiny: M-M*-M- (3 Mamba2, 1 attention, 3 MLP layers); 8 heads of 32 in 2
        // groups, state 32; 1.1b: Nemotron-H 8B's Mamba2 (128 heads of 64, 8 groups, 128)
        const bool big = !strcmp(shape, "1.1b");
        if (!o.pattern) o.pattern = big ? "M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-" : "M-M*-M-";
        if (!o.ssm_state) o.ssm_state = big ? 128 : 32;
        if (!o.ssm_k_heads) o.ssm_k_heads = big ? 8 : 2;
        if (!o.ssm_v_heads) o.ssm_v_heads = big ? 64 : 8;
        if (!o.ssm_head_dim) o.ssm_head_dim = big ? 64 : 32;
        if (!o.ssm_conv) o.ssm_conv = 4;
        const size_t np = strlen(o.pattern);
        const bool kinds = np >= 1 && np <= MK__MAX_LAYERS &&
                           strspn(o.pattern, "M*-") == np && strchr(o.pattern, '*') &&
                           strchr(o.pattern, '-');
        if (!kinds || o.ssm_state % 16 || o.ssm_state > 256 || o.ssm_v_heads % o.ssm_k_heads ||
            o.ssm_head_dim > 256 || (o.ssm_v_heads * o.ssm_head_dim) % o.ssm_state ||
            o.ssm_conv < 2 || o.ssm_conv > 16) {
            fprintf(stderr, "kvseal mkmodel: --pattern needs M (Mamba2), * (attention) and - "
                            "(MLP) only, at least one * and one -, at most %d layers; "
                            "--ssm-state a multiple of 16 up to 256, --ssm-v-heads (heads) a "
                            "multiple of --ssm-k-heads (groups), --ssm-head-dim at most 256, "
                            "heads x head dim a multiple of the state, --ssm-conv 2..16\n",
                    MK__MAX_LAYERS);
            return 2;
        }
    }
    if (qwen35) { // tiny: 4 layers (3 recurrent, 1 attention), 2 key / 4 value heads of 32;
        // 1.1b: Qwen3.5-2B's recurrent layers, 16 key and 16 value heads of 128
        const bool big = !strcmp(shape, "1.1b");
        if (!o.ssm_state) o.ssm_state = big ? 128 : 32;
        if (!o.ssm_k_heads) o.ssm_k_heads = big ? 16 : 2;
        if (!o.ssm_v_heads) o.ssm_v_heads = big ? o.ssm_k_heads : 2 * o.ssm_k_heads;
        if (!o.ssm_conv) o.ssm_conv = 4;
        if (!o.attn_interval) o.attn_interval = 4;
        if (o.ssm_state % 16 || o.ssm_state > 256 || o.ssm_v_heads % o.ssm_k_heads ||
            o.ssm_conv < 2 || o.ssm_conv > 16) {
            fprintf(stderr, "kvseal mkmodel: --ssm-state must be a multiple of 16 up to 256, "
                            "--ssm-v-heads a multiple of --ssm-k-heads, --ssm-conv 2..16\n");
            return 2;
        }
    }
    if ((o.qk_norm && !glm4moe) || (v_dense >= 0 && !glm4moe && !mla)) {
        fprintf(stderr, "kvseal mkmodel: --qk-norm is glm4moe's, --n-dense glm4moe's and the "
                        "deepseek2 family's\n");
        return 2;
    }
    if (!mla && (o.kv_lora || q_lora_set || o.qk_nope || qk_rope || o.v_head)) {
        fprintf(stderr, "kvseal mkmodel: --kv-lora --q-lora --qk-nope --qk-rope --v-head are "
                        "deepseek2's\n");
        return 2;
    }
    if (!dsa && (o.idx_heads || o.idx_dim || o.idx_topk)) {
        fprintf(stderr, "kvseal mkmodel: --idx-heads --idx-dim --idx-topk are deepseek32's and "
                        "glm-dsa's\n");
        return 2;
    }
    if (dsa) { // an indexer of 8 heads of 64 picking 8 positions: sparse at context 128
        if (!o.idx_heads) o.idx_heads = 8;
        if (!o.idx_dim) o.idx_dim = 64;
        if (!o.idx_topk) o.idx_topk = 8;
    }
    if (mla) { // a small DeepSeek-V3-like attention: the latent 4x a head's nope part
        if (!o.kv_lora) o.kv_lora = 128;
        if (!q_lora_set) o.q_lora = 192;
        if (!o.qk_nope) o.qk_nope = 64;
        if (!qk_rope) qk_rope = 32;
        if (!o.v_head) o.v_head = 64;
        if (qk_rope % 2) {
            fprintf(stderr, "kvseal mkmodel: --qk-rope %ld must be even\n", qk_rope);
            return 2;
        }
    }
    if (o.longrope && strcmp(o.arch, "phi3")) {
        fprintf(stderr, "kvseal mkmodel: --longrope is phi3's\n");
        return 2;
    }
    if (o.n_expert && !qwen && !glm4moe && !mla && !oss && !llama && !g4) {
        fprintf(stderr, "kvseal mkmodel: --n-expert is for llama, mistral3, qwen3moe, glm4moe, "
                        "gpt-oss, gemma4 and the deepseek2 family\n");
        return 2;
    }
    if (o.n_swa && !gemma && !oss && strcmp(o.arch, "llama")) {
        fprintf(stderr, "kvseal mkmodel: --swa is for llama, gemma2, gemma3 and gpt-oss\n");
        return 2;
    }
    if (oss) { // as the released models: a window on every other layer, YaRN 32x from 4096
        if (!o.n_swa) o.n_swa = 32;
        if (o.rope_scale == 1.0) {
            o.rope_scale = 32.0;
            o.rope_type = "yarn";
            if (!o.rope_orig_ctx) o.rope_orig_ctx = 4096;
        }
    }
    if (gemma) { // as the released models: tied, gemma2's caps 50 / 30, a window
        o.tied = true;
        if (!o.n_swa) o.n_swa = 32;
        if (!strcmp(o.arch, "gemma2")) {
            if (!(o.attn_softcap > 0)) o.attn_softcap = 50.0;
            if (!(o.final_softcap > 0)) o.final_softcap = 30.0;
        }
    }
    if (!strcmp(shape, "tiny")) {
        o.n_embd = 256, o.n_layer = 2, o.n_head = 8, o.n_head_kv = 2, o.n_ff = 512, o.n_ctx = 512;
    } else if (!strcmp(shape, "1.1b")) {
        o.n_embd = 2048, o.n_layer = 22, o.n_head = 32, o.n_head_kv = 4, o.n_ff = 5632,
        o.n_ctx = 2048;
    } else if (!strcmp(shape, "moe-3b")) {
        // Qwen3-30B-A3B's proportions at a tenth of its size: 64 experts of 512,
        // 8 used, heads of 128; 14 layers make about 3.1B parameters in all and
        // 0.57B read per token (the used experts, attention, output). n_ff is
        // the dense FFN width where the arch has one (glm4moe's first layer)
        o.n_embd = 2048, o.n_layer = 14, o.n_head = 16, o.n_head_kv = 4, o.n_ff = 4096,
        o.n_ctx = 4096;
        if (!o.n_expert) o.n_expert = 64;
        if (!o.n_expert_used) o.n_expert_used = 8;
        if (!o.n_ff_exp) o.n_ff_exp = 512;
    } else {
        fprintf(stderr, "kvseal mkmodel: --shape '%s' is not one of tiny 1.1b moe-3b\n", shape);
        return 2;
    }
    if (!strcmp(shape, "moe-3b") && strcmp(o.arch, "qwen3moe") && strcmp(o.arch, "qwen35moe") &&
        !glm4moe && !oss && !mla) {
        fprintf(stderr, "kvseal mkmodel: --shape moe-3b needs an arch with --n-ff-exp (qwen3moe, "
                        "qwen35moe, glm4moe, gpt-oss, deepseek2)\n");
        return 2;
    }
    if (qwen35 && !strcmp(shape, "tiny")) o.n_layer = 4;
    if (oss && !strcmp(shape, "tiny")) o.n_layer = 4;
    if (glm4moe) { // (tiny) a dense layer, two MoE ones; the NextN block after them
        if (!strcmp(shape, "tiny")) o.n_layer = 3;
        o.n_dense = v_dense >= 0 ? v_dense : 1;
        o.n_nextn = 1;
    }
    if (v_nextn >= 0 && !glm4moe && !mla && !qwen35) {
        fprintf(stderr,
                "kvseal mkmodel: --nextn is for glm4moe, deepseek2/32, glm-dsa and qwen35(moe)\n");
        return 2;
    }
    if (v_nextn >= 0) o.n_nextn = v_nextn;
    if (v_shared >= 0 && !glm4moe && !(mla && o.n_expert)) {
        fprintf(stderr, "kvseal mkmodel: --n-shared is for glm4moe and the MLA archs' experts\n");
        return 2;
    }
    if (v_shared >= 0) o.n_shared = v_shared;
    if (mla && o.n_expert) o.n_dense = v_dense >= 0 ? v_dense : 1; // MoE from layer n_dense
    if (o.n_groups && (!o.n_expert || o.n_groups < 2 || o.n_expert % o.n_groups ||
                       o.n_group_used < 1 || o.n_group_used >= o.n_groups)) {
        fprintf(stderr, "kvseal mkmodel: --expert-groups G needs --n-expert a multiple of G and "
                        "--group-used U with 0 < U < G\n");
        return 2;
    }
    if (v_embd) o.n_embd = v_embd;
    if (v_layer) o.n_layer = v_layer;
    if (nh) {
        if (v_layer && v_layer != (long)strlen(o.pattern)) {
            fprintf(stderr, "kvseal mkmodel: nemotron_h's layers are --pattern's (%zu)\n",
                    strlen(o.pattern));
            return 2;
        }
        o.n_layer = (long)strlen(o.pattern);
    }
    if (v_head) o.n_head = v_head;
    if (v_head_kv) o.n_head_kv = v_head_kv;
    if (v_ff) o.n_ff = v_ff;
    if (v_ctx) o.n_ctx = v_ctx;
    o.head_dim = v_hd ? v_hd : oss ? 64 : o.n_embd / o.n_head; // gpt-oss: heads of 64
    if (oss && !o.n_expert) o.n_expert = 8;
    if (oss && !o.n_expert_used) o.n_expert_used = o.n_expert < 4 ? o.n_expert : 4;
    if ((!strcmp(o.arch, "qwen3moe") || !strcmp(o.arch, "qwen35moe") || glm4moe) && !o.n_expert)
        o.n_expert = 8;
    if (!strcmp(o.arch, "qwen35") && o.n_expert) {
        fprintf(stderr, "kvseal mkmodel: qwen35 is dense (qwen35moe has experts)\n");
        return 2;
    }
    if (o.n_expert) {
        if (!o.n_expert_used) o.n_expert_used = o.n_expert < 2 ? o.n_expert : 2;
        // llama (Mixtral) experts are n_ff wide; qwen3moe's have their own key
        if (!o.n_ff_exp) o.n_ff_exp = llama ? o.n_ff : o.n_ff / 2;
        if (llama && o.n_ff_exp != o.n_ff) {
            fprintf(stderr,
                    "kvseal mkmodel: a llama MoE's experts are --n-ff wide (no --n-ff-exp)\n");
            return 2;
        }
        if (o.n_expert_used > o.n_expert || o.n_expert_used > 16) {
            fprintf(stderr,
                    "kvseal mkmodel: --n-expert-used %ld: at most --n-expert (%ld) and 16\n",
                    o.n_expert_used, o.n_expert);
            return 2;
        }
    } else if (o.n_expert_used || o.n_ff_exp) {
        fprintf(stderr, "kvseal mkmodel: --n-expert-used and --n-ff-exp need --n-expert\n");
        return 2;
    }
    if (!v_hd && o.n_embd % o.n_head) {
        fprintf(stderr,
                "kvseal mkmodel: --n-embd %ld is not a multiple of --n-head %ld "
                "(give --head-dim)\n",
                o.n_embd, o.n_head);
        return 2;
    }
    o.rope_base = rope_base > 0                                  ? rope_base
                  : qwen || glm4moe || !strcmp(o.arch, "gemma3") || g4 ? 1000000.0
                  : oss                                          ? 150000.0
                                                                 : 10000.0;
    o.eps = qwen || gemma ? 1e-6 : bert ? 1e-12 : 1e-5;
    if (g4) { // full layers: heads twice the sliding ones', their K/V heads, every 6th layer
        if (!o.head_dim_full) o.head_dim_full = 2 * o.head_dim;
        if (!o.n_head_kv_full) o.n_head_kv_full = o.n_head_kv;
        if (!o.swa_period) o.swa_period = 6;
        if (o.head_dim_full % 8 || o.n_head % o.n_head_kv_full || o.n_layer > MK__MAX_LAYERS ||
            (o.n_head * o.head_dim_full) % (long)ks_dtype_block_elems(o.type)) {
            fprintf(stderr, "kvseal mkmodel: gemma4: --head-dim-full must be a multiple of 8 "
                            "(and n_head times it of the type's block), --n-head a multiple of "
                            "--n-head-kv-full, at most %d layers\n",
                    MK__MAX_LAYERS);
            return 2;
        }
        // llama.cpp: a shared sliding layer reads layer n - 2, a full one n - 1
        const long kvfs = o.n_layer - o.n_kv_shared;
        if (o.n_kv_shared &&
            (kvfs < 2 || mk__g4_swa(&o, kvfs - 1) || !mk__g4_swa(&o, kvfs - 2))) {
            fprintf(stderr, "kvseal mkmodel: gemma4: with --n-kv-shared S, layer n_layer - S - 1 "
                            "must be full and n_layer - S - 2 sliding (the layers shared ones "
                            "read)\n");
            return 2;
        }
        if (o.n_embd_pl % (long)ks_dtype_block_elems(o.type)) {
            fprintf(stderr, "kvseal mkmodel: --n-embd-per-layer must be a multiple of the type's "
                            "block size\n");
            return 2;
        }
    }
    if (bert) { // every head its own K/V; mean pooling unless --pooling cls
        o.n_head_kv = o.n_head;
        if (!o.pooling) o.pooling = 1;
    }
    // glm4, glm4moe: partial rotary (half of each head)
    o.n_rot = strcmp(o.arch, "glm4") && !glm4moe ? o.head_dim : o.head_dim / 2;
    if (qwen35) o.n_rot = o.head_dim / 4; // Qwen3.5 turns a quarter of each head
    if (g4) o.n_rot = o.head_dim_full;    // the full layers': "proportional" (rope_freqs)
    if (mla) { // the KV "head" is the latent row; queries are nope + rope per head
        o.n_rot = qk_rope;
        o.n_head_kv = 1;
        o.head_dim = o.kv_lora + qk_rope;
    }
    char name[128];
    if (!o.name) {
        snprintf(name, sizeof name, "mkmodel-%s-%s-%s-seed%llu", o.arch, shape,
                 ks_dtype_name(o.type), (unsigned long long)o.seed);
        o.name = name;
    }
    if (!mk__check_shape(&o)) return 2;

    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    gguf_file *vocab = NULL;
    gguf_writer *w = NULL;
    mk__plan p = {0};
    int rc = 1;
    const gguf_value *toks;
    if (gguf_open(o.vocab, &vocab, &eb) ||
        gguf_get_arr(vocab, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &eb)) {
        fprintf(stderr, "kvseal mkmodel: %s\n", eb.msg);
        goto done;
    }
    int64_t n_vocab = (int64_t)toks->v.arr.n;
    if (n_vocab < 1 || n_vocab > INT32_MAX) {
        fprintf(stderr, "kvseal mkmodel: %s: %lld tokens\n", o.vocab, (long long)n_vocab);
        goto done;
    }
    uint32_t n_types = 2; // BERT's sentence A / B unless the vocabulary says otherwise
    if (gguf_get(vocab, "tokenizer.ggml.token_type_count") &&
        gguf_get_u32(vocab, "tokenizer.ggml.token_type_count", &n_types, &eb) == KS_OK &&
        n_types < 1)
        n_types = 1;
    o.n_types = n_types;
    w = gguf_writer_create();
    if (!w || !mk__set_keys(w, &o, vocab, n_vocab) || !mk__build_plan(&p, &o, n_vocab)) {
        fprintf(stderr, "kvseal mkmodel: out of memory\n");
        goto done;
    }
    p.pool = ks_pool_create(o.n_threads);
    p.chunk_cap = 8u << 20;
    uint64_t max_row_bytes;
    if (!ks_dtype_row_bytes(KS_DTYPE_F32, (uint64_t)p.max_row, &max_row_bytes)) goto done;
    if (max_row_bytes > p.chunk_cap) p.chunk_cap = max_row_bytes;
    p.scratch = malloc((size_t)o.n_threads * (size_t)p.max_row * sizeof(float));
    p.chunk = malloc(p.chunk_cap);
    if (!p.pool || !p.scratch || !p.chunk) {
        fprintf(stderr, "kvseal mkmodel: out of memory (or threads)\n");
        goto done;
    }
    for (int i = 0; i < p.n_t; i++) {
        const mk__tensor *t = &p.t[i];
        if (gguf_writer_add_tensor_fill(w, t->name, t->n_dims, t->ne, t->type, mk__fill, &p.t[i])) {
            fprintf(stderr, "kvseal mkmodel: cannot add tensor '%s'\n", t->name);
            goto done;
        }
    }
    uint64_t t0 = ks_now_ns();
    if (gguf_writer_write(w, o.out, &eb)) {
        fprintf(stderr, "kvseal mkmodel: %s\n", eb.msg);
        goto done;
    }
    printf("wrote %s: %s %s, %d tensors, %llu parameters, n_vocab %lld (%.1f s)\n", o.out, o.arch,
           ks_dtype_name(o.type), p.n_t, (unsigned long long)p.n_params, (long long)n_vocab,
           (double)(ks_now_ns() - t0) * 1e-9);
    rc = 0;
done:
    ks_pool_destroy(p.pool);
    free(p.scratch);
    free(p.chunk);
    free(p.t);
    gguf_writer_destroy(w);
    gguf_close(vocab);
    return rc;
}
