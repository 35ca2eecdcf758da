/* free_watch.h — proves that memory holding a tenant's data is zero when it
 * is freed. A test program that includes it (in one file) links with
 * -Wl,--wrap=free (CMakeLists.txt), so every free() of the code under test
 * passes through __wrap_free first, which checks the watched ranges inside
 * the block being freed: a scrub removed from a free path fails the test,
 * which reading the memory after the free (undefined) could not show. */
#ifndef KS_TEST_FREE_WATCH_H
#define KS_TEST_FREE_WATCH_H

#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>

void __real_free(void *p);
void __wrap_free(void *p);

#define FREE_WATCH_MAX 1024

typedef struct free_watch_range {
    const unsigned char *p;
    size_t n;
    int freed; /* times a block holding p was freed */
    int dirty; /* of those, times a byte of [p, p+n) was not zero */
} free_watch_range;

static free_watch_range fw__r[FREE_WATCH_MAX];
static _Atomic int fw__n; /* ranges watched (set while one thread runs) */

/* Watches [p, p+n): the free of the block holding p is checked and counted. */
static void free_watch_add(const void *p, size_t n) {
    int k = atomic_load(&fw__n);
    if (!p || !n || k >= FREE_WATCH_MAX) return;
    fw__r[k] = (free_watch_range){.p = p, .n = n};
    atomic_store(&fw__n, k + 1);
}

/* Stops watching; *freed and *dirty: ranges whose block was freed, and of
 * those the ones not all zero at their free. Returns the ranges watched. */
static int free_watch_end(int *freed, int *dirty) {
    int n = atomic_exchange(&fw__n, 0);
    *freed = *dirty = 0;
    for (int i = 0; i < n; i++) {
        *freed += fw__r[i].freed > 0;
        *dirty += fw__r[i].dirty > 0;
    }
    return n;
}

void __wrap_free(void *p) {
    int n = atomic_load(&fw__n);
    if (p && n) {
        const unsigned char *b = p, *e = b + malloc_usable_size(p);
        for (int i = 0; i < n; i++) {
            free_watch_range *r = &fw__r[i];
            if (r->p < b || r->p >= e) continue;
            r->freed++;
            for (size_t j = 0; j < r->n; j++)
                if (r->p[j]) {
                    r->dirty++;
                    break;
                }
        }
    }
    __real_free(p);
}

#endif
