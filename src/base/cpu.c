/* cpu.c — CPU feature detection, clocks, aligned memory, half-precision
 * conversion and the ggml element-type table.
 *
 * Feature detection follows the rule in STYLE.md section 9: CPUID says what
 * the core implements, XGETBV says whether the OS saves the wider registers
 * (XCR0 & 0x6 for YMM, & 0xe6 for ZMM); both must agree. */
#define _POSIX_C_SOURCE 200809L
#include "kvseal/base.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>

// ----------------------------------------------------------------------------
// CPU features

static ks_cpu ks__cpu;
static pthread_once_t ks__cpu_once = PTHREAD_ONCE_INIT;

static uint64_t cpu__xgetbv(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void cpu__detect(void) {
    unsigned a, b, c, d;
    memset(&ks__cpu, 0, sizeof ks__cpu);
    if (__get_cpuid(0, &a, &b, &c, &d)) // the vendor string is EBX, EDX, ECX
        ks__cpu.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    uint64_t xcr0 = cpu__xgetbv();
    bool ymm_ok = (xcr0 & 0x6) == 0x6, zmm_ok = (xcr0 & 0xe6) == 0xe6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    bool avx2 = (b >> 5) & 1;
    bool f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    bool vnni = (c >> 11) & 1, gfni = (c >> 8) & 1;
    ks__cpu.avx2 = ymm_ok && avx2 && fma && f16c;
    ks__cpu.avx512 = ks__cpu.avx2 && zmm_ok && f && dq && bw && vl;
    ks__cpu.avx512vnni = ks__cpu.avx512 && vnni;
    ks__cpu.gfni = ks__cpu.avx512 && gfni;
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1))
        ks__cpu.avx512bf16 = ks__cpu.avx512 && ((a1 >> 5) & 1);
}

const ks_cpu *ks_cpu_get(void) {
    pthread_once(&ks__cpu_once, cpu__detect);
    return &ks__cpu;
}

// ----------------------------------------------------------------------------
// Clocks and memory

uint64_t ks_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *ks_alloc_aligned(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? (n + 63) & ~(size_t)63 : 64) != 0) return NULL;
    return p;
}

void ks_free_aligned(void *p) { free(p); }

#define KS_HUGE_PAGE ((size_t)2 << 20)

void *ks_alloc_huge(size_t n) {
    void *p = NULL;
    if (n > SIZE_MAX - KS_HUGE_PAGE) return NULL;
    const size_t sz = n ? (n + KS_HUGE_PAGE - 1) & ~(KS_HUGE_PAGE - 1) : KS_HUGE_PAGE;
    if (posix_memalign(&p, KS_HUGE_PAGE, sz) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, sz, MADV_HUGEPAGE); // a hint: without it the pages are 4 KiB, still correct
#endif
    return p;
}

// ----------------------------------------------------------------------------
// Element types: (name, elements per block, bytes per block)

typedef struct {
    const char *name;
    uint32_t elems, bytes;
} dtype__info;

static const dtype__info dtype__table[KS_DTYPE__COUNT] = {
    [KS_DTYPE_F32] = {"F32", 1, 4},         [KS_DTYPE_F16] = {"F16", 1, 2},
    [KS_DTYPE_Q4_0] = {"Q4_0", 32, 18},     [KS_DTYPE_Q4_1] = {"Q4_1", 32, 20},
    [KS_DTYPE_Q5_0] = {"Q5_0", 32, 22},     [KS_DTYPE_Q5_1] = {"Q5_1", 32, 24},
    [KS_DTYPE_Q8_0] = {"Q8_0", 32, 34},     [KS_DTYPE_Q8_1] = {"Q8_1", 32, 36},
    [KS_DTYPE_Q2_K] = {"Q2_K", 256, 84},    [KS_DTYPE_Q3_K] = {"Q3_K", 256, 110},
    [KS_DTYPE_Q4_K] = {"Q4_K", 256, 144},   [KS_DTYPE_Q5_K] = {"Q5_K", 256, 176},
    [KS_DTYPE_Q6_K] = {"Q6_K", 256, 210},   [KS_DTYPE_Q8_K] = {"Q8_K", 256, 292},
    [KS_DTYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66}, [KS_DTYPE_IQ2_XS] = {"IQ2_XS", 256, 74},
    [KS_DTYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98}, [KS_DTYPE_IQ1_S] = {"IQ1_S", 256, 50},
    [KS_DTYPE_IQ4_NL] = {"IQ4_NL", 32, 18},  [KS_DTYPE_IQ3_S] = {"IQ3_S", 256, 110},
    [KS_DTYPE_IQ2_S] = {"IQ2_S", 256, 82},   [KS_DTYPE_IQ4_XS] = {"IQ4_XS", 256, 136},
    [KS_DTYPE_I8] = {"I8", 1, 1},            [KS_DTYPE_I16] = {"I16", 1, 2},
    [KS_DTYPE_I32] = {"I32", 1, 4},          [KS_DTYPE_I64] = {"I64", 1, 8},
    [KS_DTYPE_F64] = {"F64", 1, 8},          [KS_DTYPE_IQ1_M] = {"IQ1_M", 256, 56},
    [KS_DTYPE_BF16] = {"BF16", 1, 2},        [KS_DTYPE_TQ1_0] = {"TQ1_0", 256, 54},
    [KS_DTYPE_TQ2_0] = {"TQ2_0", 256, 66},   [KS_DTYPE_MXFP4] = {"MXFP4", 32, 17},
};

bool ks_dtype_known(uint32_t t) { return t < KS_DTYPE__COUNT && dtype__table[t].name; }
uint32_t ks_dtype_block_elems(uint32_t t) { return ks_dtype_known(t) ? dtype__table[t].elems : 0; }
uint32_t ks_dtype_block_bytes(uint32_t t) { return ks_dtype_known(t) ? dtype__table[t].bytes : 0; }
const char *ks_dtype_name(uint32_t t) { return ks_dtype_known(t) ? dtype__table[t].name : "?"; }

bool ks_dtype_parse(const char *name, ks_dtype *out) {
    for (uint32_t t = 0; t < KS_DTYPE__COUNT; t++) {
        if (dtype__table[t].name && strcasecmp(dtype__table[t].name, name) == 0) {
            *out = (ks_dtype)t;
            return true;
        }
    }
    return false;
}

bool ks_dtype_row_bytes(uint32_t t, uint64_t n, uint64_t *out) {
    if (!ks_dtype_known(t)) return false;
    const dtype__info *d = &dtype__table[t];
    if (n % d->elems) return false;
    return ks_mul_ok(n / d->elems, d->bytes, out);
}

// ----------------------------------------------------------------------------
// Half precision

float ks_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    union { uint32_t u; float f; } v = {.u = bits};
    return v.f;
}

uint16_t ks_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    uint32_t x = v.u, sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to inf
    if (ax < 0x38800000u) {                                    // subnormal or zero in f16
        if (ax < 0x33000000u) return (uint16_t)sign;           // < half the smallest subnormal
        // value = m * 2^(e-150) and the f16 subnormal unit is 2^-24, so the
        // f16 mantissa is m >> (126 - e), rounded to nearest even
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t s = 126 - e, r = m >> s;
        uint32_t rem = m & ((1u << s) - 1), half = 1u << (s - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

uint16_t ks_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fff + ((v.u >> 16) & 1)) >> 16);
}
