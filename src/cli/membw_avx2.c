/* membw_avx2.c — the streaming-read loops behind the memory-bandwidth figure
 * of `kvseal bench` (AVX2 build; only called when the CPU has AVX2). */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

uint64_t cli__membw_sum_avx2(const void *buf, size_t n_bytes);
uint64_t cli__membw_sum_pf_avx2(const void *buf, size_t n_bytes);
uint64_t cli__membw_sum_pf2_avx2(const void *buf, size_t n_bytes);

/* Folds the four accumulators into one value that depends on every lane. */
static inline uint64_t membw__fold(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 1) ^
           (uint64_t)_mm256_extract_epi64(a, 2) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}

/* Reads n_bytes (multiple of 256, 32-byte aligned) with 4 independent
 * 256-bit accumulators so the loop is bound by memory, not by a dependency
 * chain; returns a value derived from every byte so nothing is elided. pf
 * (a constant at each call) also prefetches 12 KiB ahead of the loads, as
 * the r16 matvec kernels do. The prefetches may run past the buffer's end,
 * which never faults. */
static inline __attribute__((always_inline)) uint64_t membw__sum(const void *buf, size_t n_bytes,
                                                                 int pf) {
    const __m256i *p = buf;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n_bytes / 32; i += 4) {
        if (pf) {
            _mm_prefetch((const char *)(p + i) + 12288, _MM_HINT_T0);
            _mm_prefetch((const char *)(p + i) + 12288 + 64, _MM_HINT_T0);
        }
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(p + i));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(p + i + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(p + i + 2));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(p + i + 3));
    }
    return membw__fold(a0, a1, a2, a3);
}

/* The plain streaming loop: the hardware prefetcher alone. */
uint64_t cli__membw_sum_avx2(const void *buf, size_t n_bytes) { return membw__sum(buf, n_bytes, 0); }

/* The loop with software prefetch: on some cores it streams faster than the
 * hardware prefetcher alone, and the roofline must be the faster of the two. */
uint64_t cli__membw_sum_pf_avx2(const void *buf, size_t n_bytes) {
    return membw__sum(buf, n_bytes, 1);
}

/* The loop with software prefetch over two streams, the buffer's two halves
 * side by side (as the two-group matvecs read), 64 bytes of each per step:
 * where a core keeps more lines in flight from two streams than from one,
 * this is its read rate. */
uint64_t cli__membw_sum_pf2_avx2(const void *buf, size_t n_bytes) {
    const __m256i *p = buf, *q = p + n_bytes / 64;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n_bytes / 64; i += 2) {
        _mm_prefetch((const char *)(p + i) + 12288, _MM_HINT_T0);
        _mm_prefetch((const char *)(q + i) + 12288, _MM_HINT_T0);
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(p + i));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(p + i + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(q + i));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(q + i + 1));
    }
    return membw__fold(a0, a1, a2, a3);
}
