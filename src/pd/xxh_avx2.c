/* xxh_avx2.c — XXH3-64's streaming update compiled for AVX2 (CMake gives
 * files named *avx2*.c the flags; see pd_xxh.h). libxxhash is built for
 * SSE2 and hashes a KV page at 7-14 GB/s on one core; with AVX2 the
 * same hash runs 2-4x faster, which the frame checksum on both ends of a
 * KV transfer needs to keep up with a socket copy. */
#include "pd_xxh.h"

#define XXH_STATIC_LINKING_ONLY
#define XXH_INLINE_ALL
#include <xxhash.h>

void pd__xxh3_update_avx2(void *state, const void *p, size_t n) {
    (void)XXH3_64bits_update((XXH3_state_t *)state, p, n);
}
