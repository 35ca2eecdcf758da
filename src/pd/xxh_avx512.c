/* xxh_avx512.c — XXH3-64's streaming update compiled for AVX512 (CMake gives
 * files named *avx512*.c the flags; see pd_xxh.h). libxxhash is built for
 * SSE2 and hashes a KV page at 7-14 GB/s on one core; with AVX512 the
 * same hash runs 2-4x faster, which the frame checksum on both ends of a
 * KV transfer needs to keep up with a socket copy. */
#include "pd_xxh.h"

#define XXH_STATIC_LINKING_ONLY
#define XXH_INLINE_ALL
#include <xxhash.h>

void pd__xxh3_update_avx512(void *state, const void *p, size_t n) {
    (void)XXH3_64bits_update((XXH3_state_t *)state, p, n);
}
