/* common.c — what every kernel file stands on: the weight type table
 * (which types a matmul takes, and the activation type each quantizes its
 * input to) and the r16 repacked layout (kern.h: group sizes, packing and
 * unpacking, and the unpack-and-call path of a vtab without a native r16
 * kernel). It calls no other file of kern/: ref.c, avx2.c, avx512*.c and
 * dispatch.c all call down into it. */
#include "kern/kern_int.h"

#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Types


bool kern_wtype_supported(ks_dtype t) {
    switch (t) {
    case KS_DTYPE_F32:
    case KS_DTYPE_F16:
    case KS_DTYPE_BF16:
    case KS_DTYPE_Q8_0:
    case KS_DTYPE_Q4_0:
    case KS_DTYPE_Q4_K:
    case KS_DTYPE_Q6_K:
    case KS_DTYPE_Q4_1:
    case KS_DTYPE_Q5_0:
    case KS_DTYPE_Q5_1:
    case KS_DTYPE_IQ4_NL:
    case KS_DTYPE_Q5_K:
    case KS_DTYPE_Q3_K:
    case KS_DTYPE_Q2_K:
    case KS_DTYPE_IQ4_XS:
    case KS_DTYPE_TQ1_0:
    case KS_DTYPE_TQ2_0:
    case KS_DTYPE_MXFP4:
    case KS_DTYPE_IQ2_XXS:
    case KS_DTYPE_IQ2_XS:
    case KS_DTYPE_IQ2_S:
    case KS_DTYPE_IQ3_XXS:
    case KS_DTYPE_IQ3_S:
    case KS_DTYPE_IQ1_S:
    case KS_DTYPE_IQ1_M:
        return true;
    default: return false;
    }
}

ks_dtype kern_act_type(ks_dtype wtype) {
    switch (wtype) {
    case KS_DTYPE_Q8_0:
    case KS_DTYPE_Q4_0:
    case KS_DTYPE_Q4_1:
    case KS_DTYPE_Q5_0:
    case KS_DTYPE_Q5_1:
    case KS_DTYPE_IQ4_NL:
    case KS_DTYPE_MXFP4:
        return KS_DTYPE_Q8_0;
    case KS_DTYPE_Q4_K:
    case KS_DTYPE_Q6_K:
    case KS_DTYPE_Q5_K:
    case KS_DTYPE_Q3_K:
    case KS_DTYPE_Q2_K:
    case KS_DTYPE_IQ4_XS:
    case KS_DTYPE_TQ1_0:
    case KS_DTYPE_TQ2_0:
    case KS_DTYPE_IQ2_XXS:
    case KS_DTYPE_IQ2_XS:
    case KS_DTYPE_IQ2_S:
    case KS_DTYPE_IQ3_XXS:
    case KS_DTYPE_IQ3_S:
    case KS_DTYPE_IQ1_S:
    case KS_DTYPE_IQ1_M:
        return KS_DTYPE_Q8_K;
    default: return KS_DTYPE_F32;
    }
}

bool kern_quantize_supported(ks_dtype t) {
    return t == KS_DTYPE_Q8_K || (kern_wtype_supported(t) && !kern__is_iq_grid(t));
}

// ----------------------------------------------------------------------------
// r16: 16 rows interleaved (layout in kern.h)

size_t kern_r16_group_bytes(ks_dtype t, int64_t K) {
    if (K <= 0) return 0;
    switch (t) {
    case KS_DTYPE_Q8_0:
        return K % 64 ? 0 : (size_t)(K / 32) * 16 * 34;
    case KS_DTYPE_Q4_0:
        return K % 64 ? 0 : (size_t)(K / 32) * 16 * 18;
    case KS_DTYPE_Q4_K:
        return K % 256 ? 0 : (size_t)(K / 256) * KERN_R16_Q4K_SB;
    case KS_DTYPE_Q6_K:
        return K % 256 ? 0 : (size_t)(K / 256) * KERN_R16_Q6K_SB;
    case KS_DTYPE_Q5_0:
        return K % 64 ? 0 : (size_t)(K / 32) * 16 * 22;
    case KS_DTYPE_Q5_K:
        return K % 256 ? 0 : (size_t)(K / 256) * KERN_R16_Q5K_SB;
    case KS_DTYPE_Q3_K:
        return K % 256 ? 0 : (size_t)(K / 256) * KERN_R16_Q3K_SB;
    case KS_DTYPE_Q2_K:
        return K % 256 ? 0 : (size_t)(K / 256) * KERN_R16_Q2K_SB;
    case KS_DTYPE_IQ4_XS:
        return K % 256 ? 0 : (size_t)(K / 256) * KERN_R16_IQ4XS_SB;
    case KS_DTYPE_MXFP4: // whole quads, then a pair in a quad's 64 + 2 * 256 bytes
        return K % 64 ? 0 : (size_t)(K / 128) * KERN_R16_MXFP4_QUAD + (K % 128 ? 576 : 0);
    default:
        return 0;
    }
}

/* Bytes of one block's quants in a Q8_0/Q4_0 group, and of one GGUF block. */
static int kern__r16_qbytes(ks_dtype t) { return t == KS_DTYPE_Q8_0 ? 512 : 256; }
static int kern__r16_bbytes(ks_dtype t) { return t == KS_DTYPE_Q8_0 ? 34 : 18; }

/* Offset in a Q8_0/Q4_0 group of block b's scale of row r, and of its quant
 * bytes qs[4s .. 4s+3] (step s) of row r. */
static size_t kern__r16_doff(ks_dtype t, int64_t b, int r) {
    return (size_t)(b / 2) * (size_t)(64 + 2 * kern__r16_qbytes(t)) + (size_t)(b % 2) * 32 +
           (size_t)r * 2;
}
static size_t kern__r16_qoff(ks_dtype t, int64_t b, int s, int r) {
    return (size_t)(b / 2) * (size_t)(64 + 2 * kern__r16_qbytes(t)) + 64 +
           (size_t)(b % 2) * (size_t)kern__r16_qbytes(t) + (size_t)s * 64 + (size_t)r * 4;
}

/* One Q4_K row's super-block b into / out of its r16 super-block g (kern.h). */
static void kern__r16_q4k(bool pack, uint8_t *g, kern_block_q4_K *b, int r) {
    memcpy(pack ? g + 2 * r : (uint8_t *)&b->d, pack ? (uint8_t *)&b->d : g + 2 * r, 2);
    memcpy(pack ? g + 32 + 2 * r : (uint8_t *)&b->dmin, pack ? (uint8_t *)&b->dmin : g + 32 + 2 * r,
           2);
    uint8_t *sc = g + 64, *mp = g + 192;
    if (pack) {
        for (int j = 0; j < 8; j++) {
            int s, m;
            kern__q4k_scale_min(b->scales, j, &s, &m);
            sc[16 * j + r] = (uint8_t)s;
            mp[32 * (j / 2) + 2 * r + (j % 2)] = (uint8_t)m;
        }
    } else {
        for (int j = 0; j < 4; j++) { // the inverse of kern__q4k_scale_min
            int s0 = sc[16 * j + r], s4 = sc[16 * (j + 4) + r];
            int m0 = mp[32 * (j / 2) + 2 * r + (j % 2)],
                m4 = mp[32 * ((j + 4) / 2) + 2 * r + (j % 2)];
            b->scales[j] = (uint8_t)(s0 | (s4 >> 4) << 6);
            b->scales[j + 4] = (uint8_t)(m0 | (m4 >> 4) << 6);
            b->scales[j + 8] = (uint8_t)((s4 & 15) | (m4 & 15) << 4);
        }
    }
    for (int jp = 0; jp < 4; jp++)
        for (int k = 0; k < 8; k++) {
            uint8_t *q = g + 320 + 512 * jp + 64 * k + 4 * r, *o = b->qs + 32 * jp + 4 * k;
            memcpy(pack ? q : o, pack ? o : q, 4);
        }
}

/* One Q6_K row's super-block b into / out of its r16 super-block g (kern.h). */
static void kern__r16_q6k(bool pack, uint8_t *g, kern_block_q6_K *b, int r) {
#define KERN__MV(gp, bp, n) memcpy(pack ? (gp) : (bp), pack ? (bp) : (gp), n)
    KERN__MV(g + 2 * r, (uint8_t *)&b->d, 2);
    for (int j = 0; j < 16; j++)
        KERN__MV(g + 32 + 16 * j + r, (uint8_t *)&b->scales[j], 1);
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 8; k++) {
            uint8_t *st = g + KERN_R16_Q6K_STEP(n, k) + 4 * r;
            for (int h = 0; h < 2; h++)
                KERN__MV(st + 64 * h, b->ql + 64 * n + 32 * h + 4 * k, 4);
            KERN__MV(st + 128, b->qh + 32 * n + 4 * k, 4);
        }
#undef KERN__MV
}

/* One Q5_K row's super-block b into / out of its r16 super-block g (kern.h):
 * d, dmin, scales and qs go where Q4_K's do, qh after them. */
static void kern__r16_q5k(bool pack, uint8_t *g, kern_block_q5_K *b, int r) {
    kern_block_q4_K q4;
    if (pack) {
        memcpy(&q4, b, 16); // d, dmin, scales[12]: the same bytes in both types
        memcpy(q4.qs, b->qs, 128);
    }
    kern__r16_q4k(pack, g, &q4, r);
    if (!pack) {
        memcpy(b, &q4, 16);
        memcpy(b->qs, q4.qs, 128);
    }
    for (int k = 0; k < 8; k++) {
        uint8_t *q = g + KERN_R16_Q4K_SB + 64 * k + 4 * r, *o = b->qh + 4 * k;
        memcpy(pack ? q : o, pack ? o : q, 4);
    }
}

/* One Q3_K row's super-block b into / out of its r16 super-block g (kern.h). */
static void kern__r16_q3k(bool pack, uint8_t *g, kern_block_q3_K *b, int r) {
#define KERN__MV(gp, bp, n) memcpy(pack ? (gp) : (bp), pack ? (bp) : (gp), n)
    KERN__MV(g + 2 * r, (uint8_t *)&b->d, 2);
    if (pack) {
        for (int s = 0; s < 16; s++)
            g[32 + 16 * s + r] = (uint8_t)(int8_t)(kern__q3k_scale(b->scales, s) - 32);
    } else { // the inverse of kern__q3k_scale
        int sc[16];
        for (int s = 0; s < 16; s++)
            sc[s] = (int8_t)g[32 + 16 * s + r] + 32;
        memset(b->scales, 0, 12);
        for (int s = 0; s < 8; s++)
            b->scales[s] = (uint8_t)((sc[s] & 15) | (sc[s + 8] & 15) << 4);
        for (int s = 0; s < 16; s++)
            b->scales[8 + s % 4] |= (uint8_t)(((sc[s] >> 4) & 3) << (2 * (s / 4)));
    }
    for (int k = 0; k < 8; k++) {
        for (int n = 0; n < 2; n++)
            KERN__MV(g + 288 + 512 * n + 64 * k + 4 * r, b->qs + 32 * n + 4 * k, 4);
        KERN__MV(g + 1312 + 64 * k + 4 * r, b->hmask + 4 * k, 4);
    }
#undef KERN__MV
}

/* One Q2_K row's super-block b into / out of its r16 super-block g (kern.h). */
static void kern__r16_q2k(bool pack, uint8_t *g, kern_block_q2_K *b, int r) {
#define KERN__MV(gp, bp, n) memcpy(pack ? (gp) : (bp), pack ? (bp) : (gp), n)
    KERN__MV(g + 2 * r, (uint8_t *)&b->d, 2);
    KERN__MV(g + 32 + 2 * r, (uint8_t *)&b->dmin, 2);
    for (int s = 0; s < 16; s++)
        KERN__MV(g + 64 + 16 * s + r, b->scales + s, 1);
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 8; k++)
            KERN__MV(g + 320 + 512 * n + 64 * k + 4 * r, b->qs + 32 * n + 4 * k, 4);
#undef KERN__MV
}

/* One IQ4_XS row's super-block b into / out of its r16 super-block g
 * (kern.h). */
static void kern__r16_iq4xs(bool pack, uint8_t *g, kern_block_iq4_xs *b, int r) {
#define KERN__MV(gp, bp, n) memcpy(pack ? (gp) : (bp), pack ? (bp) : (gp), n)
    KERN__MV(g + 2 * r, (uint8_t *)&b->d, 2);
    if (pack) {
        for (int j = 0; j < 8; j++)
            g[32 + 16 * j + r] = (uint8_t)(int8_t)(kern__iq4xs_scale(b, j) - 32);
    } else { // the inverse of kern__iq4xs_scale
        uint16_t h = 0;
        memset(b->scales_l, 0, 4);
        for (int j = 0; j < 8; j++) {
            int ls = (int8_t)g[32 + 16 * j + r] + 32;
            b->scales_l[j / 2] |= (uint8_t)((ls & 15) << (4 * (j % 2)));
            h |= (uint16_t)(((ls >> 4) & 3) << (2 * j));
        }
        b->scales_h = h;
    }
    for (int j = 0; j < 8; j++)
        for (int k = 0; k < 4; k++)
            KERN__MV(g + 160 + 256 * j + 64 * k + 4 * r, b->qs + 16 * j + 4 * k, 4);
#undef KERN__MV
}

/* One MXFP4 row's block b into / out of group g (kern.h): its exponent at
 * 16 (b % 4) + r of quad b / 4, its qs[4j .. 4j+3] at step j of the
 * block's 256 bytes after the quad's 64 exponent bytes. */
static void kern__r16_mxfp4(bool pack, uint8_t *g, uint8_t *blk, int64_t b, int r) {
    uint8_t *q = g + (size_t)(b / 4) * KERN_R16_MXFP4_QUAD;
    uint8_t *e = q + 16 * (b % 4) + r, *s = q + 64 + 256 * (b % 4) + 4 * r;
    if (pack)
        *e = blk[0];
    else
        blk[0] = *e;
    for (int j = 0; j < 4; j++)
        memcpy(pack ? s + 64 * j : blk + 1 + 4 * j, pack ? blk + 1 + 4 * j : s + 64 * j, 4);
}

/* Q5_0's qh (bit e = element e, u32 LE) to the r16 order, where element
 * 4s + i sits at byte i, bit s (s: its 4-byte step, low nibbles s < 4), and
 * back. */
static uint32_t kern__r16_q5h(bool pack, uint32_t h) {
    uint32_t o = 0;
    for (int s = 0; s < 8; s++)
        for (int i = 0; i < 4; i++) {
            int e = 4 * s + i, n = 8 * i + s;
            o |= ((h >> (pack ? e : n)) & 1u) << (pack ? n : e);
        }
    return o;
}

/* One Q5_0 row's block b into / out of group g (kern.h): d at doff, qs at
 * qoff (4 steps x 16 rows x 4 bytes), the reordered qh 256 bytes after it. */
static void kern__r16_q50(bool pack, uint8_t *g, uint8_t *blk, int64_t b, int r) {
    uint8_t *p = g + (size_t)(b / 2) * 704 + (size_t)(b % 2) * 32 + (size_t)r * 2;
    memcpy(pack ? p : blk, pack ? blk : p, 2);
    uint8_t *q = g + (size_t)(b / 2) * 704 + 64 + (size_t)(b % 2) * 320 + (size_t)r * 4;
    for (int j = 0; j < 4; j++)
        memcpy(pack ? q + 64 * j : blk + 6 + 4 * j, pack ? blk + 6 + 4 * j : q + 64 * j, 4);
    uint32_t h;
    memcpy(&h, pack ? blk + 2 : q + 256, 4);
    h = kern__r16_q5h(pack, h);
    memcpy(pack ? q + 256 : blk + 2, &h, 4);
}

void kern_r16_pack(ks_dtype t, int64_t K, const void *W, size_t w_stride, void *dst) {
    KS_ASSERT(kern_r16_group_bytes(t, K) > 0);
    uint8_t *o = dst;
    if (t == KS_DTYPE_Q5_0) {
        for (int r = 0; r < 16; r++)
            for (int64_t b = 0; b < K / 32; b++) {
                uint8_t blk[22];
                memcpy(blk, (const uint8_t *)W + (size_t)r * w_stride + (size_t)b * 22, 22);
                kern__r16_q50(true, o, blk, b, r);
            }
        return;
    }
    if (t == KS_DTYPE_MXFP4) { // a last pair's quad: its exponent bytes 32..63 zero
        if (K % 128) memset(o + (size_t)(K / 128) * KERN_R16_MXFP4_QUAD + 32, 0, 32);
        for (int r = 0; r < 16; r++)
            for (int64_t b = 0; b < K / 32; b++) {
                uint8_t blk[17];
                memcpy(blk, (const uint8_t *)W + (size_t)r * w_stride + (size_t)b * 17, 17);
                kern__r16_mxfp4(true, o, blk, b, r);
            }
        return;
    }
    if (t == KS_DTYPE_IQ4_XS) {
        for (int r = 0; r < 16; r++)
            for (int64_t b = 0; b < K / 256; b++) {
                kern_block_iq4_xs blk;
                memcpy(&blk, (const uint8_t *)W + (size_t)r * w_stride + (size_t)b * 136, 136);
                kern__r16_iq4xs(true, o + (size_t)b * KERN_R16_IQ4XS_SB, &blk, r);
            }
        return;
    }
    if (t == KS_DTYPE_Q2_K) {
        for (int r = 0; r < 16; r++)
            for (int64_t b = 0; b < K / 256; b++) {
                kern_block_q2_K blk;
                memcpy(&blk, (const uint8_t *)W + (size_t)r * w_stride + (size_t)b * 84, 84);
                kern__r16_q2k(true, o + (size_t)b * KERN_R16_Q2K_SB, &blk, r);
            }
        return;
    }
    if (t == KS_DTYPE_Q5_K || t == KS_DTYPE_Q3_K) {
        const bool q5 = t == KS_DTYPE_Q5_K;
        const size_t bb = q5 ? 176 : 110, sb = q5 ? KERN_R16_Q5K_SB : KERN_R16_Q3K_SB;
        for (int r = 0; r < 16; r++)
            for (int64_t b = 0; b < K / 256; b++) {
                const uint8_t *src = (const uint8_t *)W + (size_t)r * w_stride + (size_t)b * bb;
                if (q5) {
                    kern_block_q5_K blk;
                    memcpy(&blk, src, bb);
                    kern__r16_q5k(true, o + (size_t)b * sb, &blk, r);
                } else {
                    kern_block_q3_K blk;
                    memcpy(&blk, src, bb);
                    kern__r16_q3k(true, o + (size_t)b * sb, &blk, r);
                }
            }
        return;
    }
    if (t == KS_DTYPE_Q4_K || t == KS_DTYPE_Q6_K) {
        const bool q4 = t == KS_DTYPE_Q4_K;
        const size_t bb = q4 ? 144 : 210, sb = q4 ? KERN_R16_Q4K_SB : KERN_R16_Q6K_SB;
        for (int r = 0; r < 16; r++)
            for (int64_t b = 0; b < K / 256; b++) {
                const uint8_t *src = (const uint8_t *)W + (size_t)r * w_stride + (size_t)b * bb;
                if (q4) {
                    kern_block_q4_K blk;
                    memcpy(&blk, src, bb);
                    kern__r16_q4k(true, o + (size_t)b * sb, &blk, r);
                } else {
                    kern_block_q6_K blk;
                    memcpy(&blk, src, bb);
                    kern__r16_q6k(true, o + (size_t)b * sb, &blk, r);
                }
            }
        return;
    }
    const int bb = kern__r16_bbytes(t), ns = kern__r16_qbytes(t) / 64;
    const uint8_t flip = t == KS_DTYPE_Q8_0 ? 0x80 : 0x00;
    for (int r = 0; r < 16; r++) {
        const uint8_t *row = (const uint8_t *)W + (size_t)r * w_stride;
        for (int64_t b = 0; b < K / 32; b++) {
            const uint8_t *blk = row + (size_t)b * (size_t)bb;
            memcpy(o + kern__r16_doff(t, b, r), blk, 2);
            for (int s = 0; s < ns; s++)
                for (int i = 0; i < 4; i++)
                    o[kern__r16_qoff(t, b, s, r) + (size_t)i] = blk[2 + 4 * s + i] ^ flip;
        }
    }
}

void kern_r16_unpack_row(ks_dtype t, int64_t K, const void *group, int r, void *row) {
    KS_ASSERT(kern_r16_group_bytes(t, K) > 0 && r >= 0 && r < 16);
    const uint8_t *g = group;
    uint8_t *gm = (uint8_t *)(uintptr_t)g; // the helpers only read it when unpacking
    if (t == KS_DTYPE_Q5_0) {
        for (int64_t b = 0; b < K / 32; b++)
            kern__r16_q50(false, gm, (uint8_t *)row + (size_t)b * 22, b, r);
        return;
    }
    if (t == KS_DTYPE_MXFP4) {
        for (int64_t b = 0; b < K / 32; b++)
            kern__r16_mxfp4(false, gm, (uint8_t *)row + (size_t)b * 17, b, r);
        return;
    }
    if (t == KS_DTYPE_Q5_K) {
        for (int64_t b = 0; b < K / 256; b++) {
            kern_block_q5_K blk;
            kern__r16_q5k(false, gm + (size_t)b * KERN_R16_Q5K_SB, &blk, r);
            memcpy((uint8_t *)row + (size_t)b * 176, &blk, 176);
        }
        return;
    }
    if (t == KS_DTYPE_IQ4_XS) {
        for (int64_t b = 0; b < K / 256; b++) {
            kern_block_iq4_xs blk;
            kern__r16_iq4xs(false, gm + (size_t)b * KERN_R16_IQ4XS_SB, &blk, r);
            memcpy((uint8_t *)row + (size_t)b * 136, &blk, 136);
        }
        return;
    }
    if (t == KS_DTYPE_Q2_K) {
        for (int64_t b = 0; b < K / 256; b++) {
            kern_block_q2_K blk;
            kern__r16_q2k(false, gm + (size_t)b * KERN_R16_Q2K_SB, &blk, r);
            memcpy((uint8_t *)row + (size_t)b * 84, &blk, 84);
        }
        return;
    }
    if (t == KS_DTYPE_Q3_K) {
        for (int64_t b = 0; b < K / 256; b++) {
            kern_block_q3_K blk;
            kern__r16_q3k(false, gm + (size_t)b * KERN_R16_Q3K_SB, &blk, r);
            memcpy((uint8_t *)row + (size_t)b * 110, &blk, 110);
        }
        return;
    }
    if (t == KS_DTYPE_Q4_K) {
        for (int64_t b = 0; b < K / 256; b++) {
            kern_block_q4_K blk;
            kern__r16_q4k(false, (uint8_t *)(uintptr_t)(g + (size_t)b * KERN_R16_Q4K_SB), &blk, r);
            memcpy((uint8_t *)row + (size_t)b * 144, &blk, 144);
        }
        return;
    }
    if (t == KS_DTYPE_Q6_K) {
        for (int64_t b = 0; b < K / 256; b++) {
            kern_block_q6_K blk;
            kern__r16_q6k(false, (uint8_t *)(uintptr_t)(g + (size_t)b * KERN_R16_Q6K_SB), &blk, r);
            memcpy((uint8_t *)row + (size_t)b * 210, &blk, 210);
        }
        return;
    }
    const int bb = kern__r16_bbytes(t), ns = kern__r16_qbytes(t) / 64;
    const uint8_t flip = t == KS_DTYPE_Q8_0 ? 0x80 : 0x00;
    for (int64_t b = 0; b < K / 32; b++) {
        uint8_t *blk = (uint8_t *)row + (size_t)b * (size_t)bb;
        memcpy(blk, g + kern__r16_doff(t, b, r), 2);
        for (int s = 0; s < ns; s++)
            for (int i = 0; i < 4; i++)
                blk[2 + 4 * s + i] = g[kern__r16_qoff(t, b, s, r) + (size_t)i] ^ flip;
    }
}

void kern__matmul_r16_via(kern_matmul_fn fn, ks_dtype t, int64_t K, int n_rows, int n_cols,
                          const void *W, size_t ws, const void *X, size_t xs, float *Y, size_t ys) {
    KS_ASSERT(n_rows % 16 == 0);
    const size_t gb = kern_r16_group_bytes(t, K);
    uint8_t *buf = malloc(16 * ws);
    KS_ASSERT(buf); // a few KB: out of memory here is out of memory everywhere
    for (int g = 0; g < n_rows / 16; g++) {
        const uint8_t *grp = (const uint8_t *)W + (size_t)g * gb;
        for (int r = 0; r < 16; r++)
            kern_r16_unpack_row(t, K, grp, r, buf + (size_t)r * ws);
        fn(K, 16, n_cols, buf, ws, X, xs, Y + 16 * g, ys);
    }
    free(buf);
}
