/* kern.h — compute kernels: quantized matmul, activation quantization and
 * the vector ops of the forward pass, each with a scalar reference (ref.c)
 * and AVX2 / AVX-512 versions chosen once at run time.
 *
 * Batch invariance (the server's isolation tests depend on it): every output
 * element of a matmul is computed by one fixed sequence of operations that
 * depends only on K, the weight row and the activation row — never on
 * n_rows, n_cols, the element's position inside the tile, or the thread
 * count. Callers may therefore split a matmul into any tiles on any threads
 * and get bit-identical results. Within one vtab, results are deterministic;
 * across vtabs (ref vs avx2 vs avx512) they agree within per-type tolerances
 * documented in tests/unit/test_kern.c. */
#ifndef KS_KERN_H
#define KS_KERN_H

#include "kvseal/base.h"

/* Y[c*y_stride + r] = sum_k W[r][k] * X[c][k], for r < n_rows, c < n_cols.
 * W: n_rows rows of K elements of the weight type, row r at W + r*w_stride
 *    bytes (rows are raw GGUF rows, K a multiple of the type's block size).
 * X: n_cols rows of K elements already in kern_act_type(weight type),
 *    row c at X + c*x_stride bytes.
 * Y: f32, y_stride in floats. Pointers need no alignment. */
typedef void (*kern_matmul_fn)(int64_t K, int n_rows, int n_cols, const void *W,
                               size_t w_stride, const void *X, size_t x_stride, float *Y,
                               size_t y_stride);

/* Converts one row of n f32 values to an activation format (F32 copy, Q8_0
 * or Q8_K); n is a multiple of the format's block size. */
typedef void (*kern_quant_fn)(const float *x, void *y, int64_t n);

/* Attention over one plane of a KV page (kv.h) for the G query heads that
 * share its KV head (grouped-query attention): rows of n elements in a KV
 * type (F32, F16 or Q8_0; for Q8_0 n % 32 == 0 and every row starts on a
 * block), row j at k + j * k_stride BYTES. Pointers need no alignment.
 * q holds the G heads' n floats back to back;
 * out[g * o_stride + j] = dot(q_g, row j) * scale. */
typedef void (*kern_dot_rows_fn)(int64_t n, int G, const float *q, const void *k, size_t k_stride,
                                 int rows, float scale, float *out, size_t o_stride);
/* y_g[i] = fma(s_g[j], row j [i], y_g[i]) for j = 0 .. rows-1 in order
 * (rows as above), where y holds the G heads' n floats back to back and
 * s_g = s + g * s_stride. */
typedef void (*kern_axpy_rows_fn)(int64_t n, int G, const float *s, size_t s_stride, const void *v,
                                  size_t v_stride, int rows, float *y);

/* Keys per attention block (kern_vtab.attn_block): blocks start at absolute
 * positions that are multiples of it, so a query row meets the same blocks
 * whatever else is in its batch. */
#define KERN_ATTN_BLOCK 64
/* Query rows of one attention tile, at most. */
#define KERN_ATTN_ROWS 8
/* Floats of scratch attn_block needs for heads of D (keys) and Dv (values)
 * elements: the block's keys transposed and its values. */
#define KERN_ATTN_SCRATCH(D, Dv) ((size_t)(KERN_ATTN_BLOCK) * ((size_t)(D) + (size_t)(Dv)))

/* Rows the attention kernel prefetches, a line at a time, spread over its
 * arithmetic (the next block's K and V rows: a burst of prefetches at the
 * block's start would stall on the core's miss buffers instead of
 * overlapping the block's arithmetic). k[i], v[i]: row i's first byte
 * (v == k: one plane); lines: 64-byte lines a row; row, line, side: the
 * cursor, start at 0. Only a hint: never changes a result. */
typedef struct kern_attn_pf {
    const uint8_t *const *k, *const *v;
    int n, lines;
    int row, line, side;
} kern_attn_pf;

/* One block of keys for a tile of R query rows x G query heads that share a
 * KV head, with one online-softmax state per (row, head) (flash attention's
 * running maximum m, sum l and unnormalised output o; softmax·V = o / l once
 * every block is in). Row pointers: krow[i], vrow[i] hold block lane i's K and
 * V row (i < n) in kv_type (F32, F16, Q8_0; Q8_0 needs D % 32 == 0 and, for
 * V, Dv % 32 == 0); V reads the first Dv elements (MLA: vrow = krow).
 * Query row r reads lanes [lo[r], hi[r]) (0 <= lo, hi <= n; none if lo >= hi,
 * then its state is untouched). D and Dv are multiples of 16. */
typedef struct kern_attn_blk {
    int D, Dv, G, R;
    ks_dtype kv_type;
    const float *q;  /* row r, head g: q + r * q_stride + g * D */
    size_t q_stride; /* floats */
    const uint8_t *const *krow, *const *vrow;
    int n;
    const int *lo, *hi; /* R entries */
    float scale;
    float *m, *l; /* R * G entries, index r * G + g; start at -inf and 0 */
    float *o;     /* R * G rows of Dv floats; start at 0 */
    float *scratch; /* KERN_ATTN_SCRATCH(D, Dv) floats, 64-byte aligned */
    struct kern_attn_pf *pf; /* optional (NULL: none): lines to prefetch as it computes */
} kern_attn_blk;
/* For each (r, g) with lo < hi, scores s_j = dot(q_rg, K_j) * scale for j in
 * [lo, hi), M = max(m, max_j s_j), p_j = exp(s_j - M), then
 * l = l * exp(m - M) + sum p_j, o = o * exp(m - M) + sum_j p_j V_j (j in
 * order), m = M. Batch invariance: a (row, head)'s new state is a function of
 * its own q, state, lo, hi and rows only (never of R, G, n or the other
 * rows), bit for bit within one vtab. Can't fail; thread-safe on disjoint
 * states and scratch. */
typedef void (*kern_attn_block_fn)(const kern_attn_blk *a);

typedef struct kern_vtab {
    const char *name; /* "ref", "avx2", "avx512" */
    /* indexed by weight ks_dtype; NULL where the type is unsupported */
    kern_matmul_fn matmul[KS_DTYPE__COUNT];
    /* the same products over weights repacked by kern_r16_pack: W is the
     * first of n_rows/16 groups (n_rows a multiple of 16) laid out
     * kern_r16_group_bytes apart, w_stride the GGUF row bytes; Q8_0, Q4_0,
     * Q5_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and MXFP4 only, NULL elsewhere */
    kern_matmul_fn matmul_r16[KS_DTYPE__COUNT];
    /* indexed by activation ks_dtype (F32, Q8_0, Q8_K) */
    kern_quant_fn quantize_act[KS_DTYPE__COUNT];
    /* sum a[i]*b[i] */
    float (*dot_f32)(int64_t n, const float *a, const float *b);
    /* y[i] = fma(a, x[i], y[i]) */
    void (*axpy_f32)(int64_t n, float a, const float *x, float *y);
    /* Indexed by KV ks_dtype (F32, F16, Q8_0; NULL elsewhere). Dequantizing a
     * KV element to f32 is exact (an f16, or an f16 scale times an int8), and
     * each typed op computes exactly what its F32 entry computes on the
     * dequantized rows, bit for bit; the F32 entries give the same values as
     * dot_f32 * scale per head and row (dot_rows) and as one axpy_f32 per
     * head and row in order (axpy_rows): a head's values never depend on G.
     * Attention scores and output over one KV page. */
    kern_dot_rows_fn dot_rows[KS_DTYPE__COUNT];
    kern_axpy_rows_fn axpy_rows[KS_DTYPE__COUNT];
    /* Indexed by KV ks_dtype: stores one K or V row of n floats in the KV
     * type — F32 a copy, F16 round-to-nearest-even (ks_f32_to_f16), Q8_0 as
     * quantize_act[Q8_0] (GGUF blocks, d = f16(amax/127)). SIMD versions
     * write the same bytes as the reference (NaN inputs: some NaN). */
    kern_quant_fn kv_store[KS_DTYPE__COUNT];
    /* y = x / sqrt(mean(x^2) + eps) * w ; y may alias x */
    void (*rmsnorm)(int64_t n, const float *x, const float *w, float eps, float *y);
    /* y[i] = silu(g[i]) * u[i] ; y may alias g or u */
    void (*silu_mul)(int64_t n, const float *g, const float *u, float *y);
    /* y[i] = gelu(g[i]) * u[i], GELU's tanh approximation 0.5 g (1 + tanh(z)),
     * z = sqrt(2/pi) g (1 + 0.044715 g^2), computed as g / (1 + exp(-2z))
     * (the same function, without tanh's cancellation for g < 0); y may
     * alias g or u */
    void (*gelu_mul)(int64_t n, const float *g, const float *u, float *y);
    /* x = softmax(x) in place */
    void (*softmax)(int64_t n, float *x);
    /* One block of tiled online-softmax attention (kern_attn_blk above). */
    kern_attn_block_fn attn_block;
    /* The same with q and K rounded to bf16 for the scores and the weights
     * p and V for P.V (bf16 dot products: two exact products a lane); m, l
     * (the sum of the rounded weights), the exponentials and o stay f32.
     * NULL where absent; kern_attn_block picks between the two. */
    kern_attn_block_fn attn_block_bf16;
    /* Whether both attention blocks issue kern_attn_blk.pf's prefetches
     * (else the caller prefetches the next block itself). */
    bool attn_prefetch;
    /* One token of the gated delta rule on one value head (hybrid models'
     * linear attention, model.h): the state is S rows of S floats (rows[j]:
     * value element j against key elements 0..S-1; S a multiple of 16, rows
     * anywhere). Each row is multiplied by decay, then corrected toward v[j]
     * by the delta rule, r += k * (v[j] - r.k) * beta, and read by the query:
     * out[j] = r.q after the update. Rows are updated in place; the SIMD
     * versions match the reference within f32 rounding of the two dot
     * products, each in a fixed order (so a token's values never depend on
     * the batch). */
    void (*gdn_step)(int S, float *const *rows, const float *q, const float *k, const float *v,
                     float decay, float beta, float *out);
} kern_vtab;

/* Selects the best vtab the CPU and OS support, or the one named by isa
 * ("ref", "avx2", "avx512"); isa NULL reads KS_FORCE_ISA from the
 * environment. Errors: KS_ERR_UNSUPPORTED if the named ISA is unavailable
 * or KS_ATTN=bf16 (kern_attn_block) is set on a CPU without it, KS_ERR_INVAL
 * for an unknown name or KS_ATTN value. Call once at startup; thread-safe
 * after. */
ks_err kern_init(const char *isa, ks_errbuf *eb) KS_MUST_USE;
/* The vtab chosen by kern_init (the best available if kern_init was never
 * called). Never NULL; static storage. */
const kern_vtab *kern_get(void);
/* The vtab for isa if this CPU supports it, else NULL. Static storage. */
const kern_vtab *kern_vtab_for(const char *isa);
/* The attention block kernel a context on v runs: v's attn_block_bf16 where
 * the environment says KS_ATTN=bf16 (kern_init refuses it on a CPU without
 * AVX512-BF16; every vtab's bf16 entry computes the same values), v has one
 * and this CPU has the instructions; else v's attn_block (f32, the default:
 * its greedy tokens are llama.cpp's). The same for every call of a process. */
kern_attn_block_fn kern_attn_block(const kern_vtab *v);
/* Whether kern_attn_block(v) is v's BF16 kernel. */
bool kern_attn_bf16(const kern_vtab *v);

/* The weight types the matmul supports, as errors list them. */
#define KERN_WTYPES                                                                                \
    "F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS TQ1_0 TQ2_0 MXFP4 "                     \
    "IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S"
/* True for the weight types of KERN_WTYPES. */
bool kern_wtype_supported(ks_dtype t);
/* The activation format a weight type multiplies against: F32 for
 * F32/F16/BF16; Q8_0 for the 32-element types (Q8_0 Q4_0 Q4_1 Q5_0 Q5_1
 * IQ4_NL MXFP4: Q4_1/Q5_1 take the block sum of x from its qs, so no Q8_1);
 * Q8_K for the 256-element ones (Q2_K..Q6_K, IQ4_XS, TQ1_0, TQ2_0 and the
 * codebook types IQ1_*, IQ2_*, IQ3_*). */
ks_dtype kern_act_type(ks_dtype wtype);

/* The r16 weight layout: 16 rows of a Q8_0 or Q4_0 matrix interleaved so
 * that one 64-byte vector holds the same 4 bytes of all 16 rows, which a
 * dot-product instruction multiplies by one broadcast activation word; the
 * rows' sums land in 16 lanes, with no horizontal reduction. Per pair of
 * 32-element blocks (K a multiple of 64), in bytes:
 *   [0, 64)    the f16 scales d of block 2p, rows 0..15, then block 2p+1
 *   then per block (2p, 2p+1):
 *     Q8_0: 8 steps s x 16 rows x 4 bytes: qs[4s .. 4s+3] ^ 0x80 (w + 128)
 *     Q4_0: 4 steps j x 16 rows x 4 bytes: qs[4j .. 4j+3] as in the file
 *           (low nibbles elements 4j.., high nibbles 16 + 4j..)
 * A pair spans 32 GGUF blocks' bytes, so a group of 16 rows is exactly
 * 16 * row_bytes long. Q4_K, per 256-element super-block (2368 bytes):
 *   [0, 32) d, [32, 64) dmin: f16 per row
 *   [64, 192)   the 6-bit scale of sub-block j of row r at 16j + r (a byte)
 *   [192, 320)  the mins of sub-blocks 2p, 2p+1 of row r at 32p + 2r, +1
 *   [320, 2368) 4 pairs p x 8 steps k x 16 rows x 4 bytes: qs[32p + 4k ..]
 *               (low nibbles sub-block 2p, high nibbles sub-block 2p+1)
 * Q6_K, per super-block (3360 bytes = 16 x 210):
 *   [0, 32) d: f16 per row; [32, 288) scale of sub-block j of row r at 16j + r
 *   [288, 3360)  steps n < 2, k < 8, each 3 x 16 rows x 4 bytes: ql[64n +
 *                4k ..], ql[64n + 32 + 4k ..], qh[32n + 4k ..] (a matvec
 *                reads one step's three lines, then the next step's)
 * Q5_0, per pair of blocks as Q4_0 (704 bytes = 32 x 22), except that each
 * block's 256 quant bytes are followed by 16 rows x 4 bytes of its qh with
 * the bits reordered: element 4s + i at byte i, bit s (so step j's low
 * nibbles take bit j of each byte, its high nibbles bit 4 + j).
 * Q5_K, per super-block (2880 bytes): [0, 2368) as Q4_K (qs in the place of
 * Q4_K's), then [2368, 2880) 8 steps k x 16 rows x 4 bytes: qh[4k ..]
 * (bit j of a byte: bit 4 of the same byte of sub-block j's step k).
 * Q3_K, per super-block (1824 bytes):
 *   [0, 32) d: f16 per row; [32, 288) the 6-bit scale of sub-block s of row
 *               r, minus 32, at 16s + r (an int8)
 *   [288, 1312)  n < 2, k < 8 x 16 rows x 4 bytes: qs[32n + 4k ..]
 *   [1312, 1824) k < 8 x 16 rows x 4 bytes: hmask[4k ..]
 * Q2_K, per super-block (1344 bytes = 16 x 84): [0, 32) d, [32, 64) dmin:
 *   f16 per row; [64, 320) the scales byte (scale | min << 4) of sub-block
 *   s of row r at 16s + r; [320, 1344) qs as Q3_K's
 * IQ4_XS, per super-block (2208 bytes): [0, 32) d: f16 per row; [32, 160)
 *   the 6-bit scale of sub-block j of row r, minus 32, at 16j + r (an
 *   int8); [160, 2208) j < 8, k < 4 x 16 rows x 4 bytes: qs[16j + 4k ..]
 * MXFP4, per quad of 4 blocks (1088 bytes = 16 x 4 x 17, so every quad's
 * quant lines are 64-byte aligned): [0, 64) the E8M0 exponent of block i of
 * row r at 16i + r; [64, 1088) per block i, 4 steps j x 16 rows x 4 bytes:
 * qs[4j .. 4j+3] (low nibbles elements 4j.., high 16 + 4j..). K % 128 ==
 * 64 ends in a quad of 2 blocks (576 bytes, exponent bytes 32..63 zero). */

/* The int8 dot-product peak of the calling thread's core, in ops/s (a
 * multiply and an add each, as 2 * params * tokens counts a matmul): 512-bit
 * vpdpbusd on registers, 128 ops an instruction, the best of 5 runs of about
 * ms / 5 milliseconds each. 0 where the CPU lacks AVX512-VNNI. Blocks for
 * about ms; can't fail; any thread (run it on each to load every core). */
double kern_int8_peak_ops(int ms);

/* Whether model loading should repack a [K, N] matrix of type t for the
 * chosen vtab: it has a native r16 kernel for t, the layout takes K
 * (kern_r16_group_bytes > 0), N % 16 == 0, and KS_NO_REPACK is unset. */
bool kern_r16_wanted(ks_dtype t, int64_t K, int64_t N);
/* Bytes of one r16 group of 16 rows of K elements of type t; 0 where the
 * layout does not exist (other types, Q8_0/Q4_0/Q5_0 K % 64 != 0). */
size_t kern_r16_group_bytes(ks_dtype t, int64_t K);
/* Repacks 16 GGUF rows (row r at W + r * w_stride) of type t into one r16
 * group at dst (kern_r16_group_bytes(t, K) > 0). */
void kern_r16_pack(ks_dtype t, int64_t K, const void *W, size_t w_stride, void *dst);
/* Row r (0..15) of an r16 group, back to its GGUF bytes (the inverse). */
void kern_r16_unpack_row(ks_dtype t, int64_t K, const void *group, int r, void *row);

/* True for the types kern_quantize_row writes: Q8_K and every
 * kern_wtype_supported type but the codebook ones (IQ1_*, IQ2_*, IQ3_*),
 * which only an importance-weighted grid search (llama-quantize) writes. */
bool kern_quantize_supported(ks_dtype t);
/* Reference (scalar) conversion of n floats into type t, for weights and
 * tests: every kern_quantize_supported type. n must be a multiple of
 * the block size. Deterministic, round to nearest around simple scales:
 * valid blocks, but not the bytes llama-quantize (which searches scales)
 * would write. Can't fail (asserts on bad t/n). */
void kern_quantize_row(ks_dtype t, const float *x, void *y, int64_t n);
/* Reference conversion of n elements of type t back to floats: every
 * kern_wtype_supported type and Q8_K (codebook types bit for bit as llama.cpp). */
void kern_dequantize_row(ks_dtype t, const void *x, float *y, int64_t n);

/* RoPE on one head vector of n_dims (even) values at position pos, in place.
 * neox=false rotates adjacent pairs (x[2i], x[2i+1]) — llama.cpp "normal";
 * neox=true rotates (x[i], x[i+n_rot/2]) — qwen2/qwen3. The angle of pair i
 * is pos * freq_scale * freq_base^(-2i/n_rot), where freq_scale = 1/factor
 * for linear RoPE scaling (1 = none); only the first n_rot dims rotate.
 * Scalar, shared by all ISAs (cheap next to the matmuls). */
void kern_rope(float *x, int n_dims, int n_rot, int64_t pos, float freq_base,
               float freq_scale, bool neox);
/* The cos/sin of kern_rope's n_rot/2 angles at pos, as cs[2i] = cos, cs[2i+1]
 * = sin: computed once per token and shared by all its heads. */
void kern_rope_table(float *cs, int n_rot, int64_t pos, float freq_base, float freq_scale);
/* How RoPE turns a position into angles: the GGUF <arch>.rope.* keys and the
 * Llama 3 rope_freqs tensor. For pair i, the extrapolated angle is
 * te = pos * freq_base^(-2i/n_rot) / freq_factors[i] and the interpolated
 * one ti = freq_scale * te (linear scaling). Without YaRN (ext_factor 0)
 * theta = ti and cos/sin are scaled by attn_factor. With YaRN, pairs below
 * corr_lo extrapolate and pairs above corr_hi interpolate: with
 * r = ext_factor * (1 - clamp((i - corr_lo) / max(0.001, corr_hi -
 * corr_lo), 0, 1)), theta = ti * (1 - r) + te * r, and cos/sin are scaled
 * by attn_factor * (1 + 0.1 ln(1 / freq_scale)). */
typedef struct kern_rope_cfg {
    int n_rot;
    float freq_base, freq_scale;
    const float *freq_factors; /* n_rot/2 divisors, or NULL (all 1) */
    float ext_factor, attn_factor, corr_lo, corr_hi;
} kern_rope_cfg;
/* YaRN's correction range for a model trained on n_ctx_orig positions: the
 * pairs that turn beta_fast and beta_slow times over n_ctx_orig positions,
 * floored / ceiled and clamped to [0, n_rot - 1]. */
void kern_rope_yarn_corr(int n_rot, int n_ctx_orig, float freq_base, float beta_fast,
                         float beta_slow, float *lo, float *hi);
/* kern_rope_table for a kern_rope_cfg: cs[2i] = cos, cs[2i+1] = sin of pair
 * i's angle at pos, times the magnitude scale. With only freq_base and
 * freq_scale set, the same values as kern_rope_table. */
void kern_rope_table_cfg(float *cs, const kern_rope_cfg *c, int64_t pos);
/* kern_rope with a kern_rope_table: the same values, bit for bit. */
void kern_rope_apply(float *x, int n_rot, const float *cs, bool neox);

#endif /* KS_KERN_H */
