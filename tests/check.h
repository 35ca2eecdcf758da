/* check.h — test assertions (after libuv's task.h). Every CHECK prints both
 * expressions, both values and file:line, then aborts; none is compiled out
 * by NDEBUG. SKIP(reason) exits 77, which CTest reports as skipped. */
#ifndef KS_TESTS_CHECK_H
#define KS_TESTS_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The deadline for a condition that depends only on scheduling (a frame
 * arriving, a thread finishing): generous enough for a sanitizer build on a
 * loaded 2-core machine; a test passes as soon as the condition holds. */
#define TEST_WAIT_MS 120000

#define CHECK(x)                                                                         \
    do {                                                                                 \
        if (!(x)) {                                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #x);        \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#define CHECK_EQ(a, b)                                                                   \
    do {                                                                                 \
        long long ck_a_ = (long long)(a), ck_b_ = (long long)(b);                        \
        if (ck_a_ != ck_b_) {                                                            \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n",         \
                    __FILE__, __LINE__, #a, #b, ck_a_, ck_b_);                           \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                               \
    do {                                                                                 \
        const char *ck_a_ = (a), *ck_b_ = (b);                                           \
        if (!ck_a_ || !ck_b_ || strcmp(ck_a_, ck_b_) != 0) {                             \
            fprintf(stderr, "%s:%d: CHECK_STR_EQ failed: %s == %s (\"%s\" vs \"%s\")\n", \
                    __FILE__, __LINE__, #a, #b, ck_a_ ? ck_a_ : "(null)",                \
                    ck_b_ ? ck_b_ : "(null)");                                           \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* Checks that haystack a contains substring b. */
#define CHECK_STR_HAS(a, b)                                                              \
    do {                                                                                 \
        const char *ck_a_ = (a), *ck_b_ = (b);                                           \
        if (!ck_a_ || !strstr(ck_a_, ck_b_)) {                                           \
            fprintf(stderr, "%s:%d: CHECK_STR_HAS failed: %s contains %s (\"%s\" / \"%s\")\n", \
                    __FILE__, __LINE__, #a, #b, ck_a_ ? ck_a_ : "(null)", ck_b_);        \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#define CHECK_MEM_EQ(a, b, n)                                                            \
    do {                                                                                 \
        if (memcmp((a), (b), (n)) != 0) {                                                \
            fprintf(stderr, "%s:%d: CHECK_MEM_EQ failed: %s == %s (%zu bytes)\n",        \
                    __FILE__, __LINE__, #a, #b, (size_t)(n));                            \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* |a-b| <= tol */
#define CHECK_NEAR(a, b, tol)                                                            \
    do {                                                                                 \
        double ck_a_ = (double)(a), ck_b_ = (double)(b), ck_t_ = (double)(tol);          \
        if (!(fabs(ck_a_ - ck_b_) <= ck_t_)) {                                           \
            fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s ~ %s (%.9g vs %.9g, tol %g)\n", \
                    __FILE__, __LINE__, #a, #b, ck_a_, ck_b_, ck_t_);                    \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#define SKIP(reason)                                                                     \
    do {                                                                                 \
        fprintf(stderr, "SKIP: %s\n", reason);                                           \
        exit(77);                                                                        \
    } while (0)

/* Path of a file in ../shared (KS_SHARED env), or NULL if it is absent. */
static inline const char *check_shared_path(const char *rel, char *buf, size_t cap) {
    const char *d = getenv("KS_SHARED");
    if (!d) d = "../shared";
    snprintf(buf, cap, "%s/%s", d, rel);
    FILE *f = fopen(buf, "rb");
    if (!f) return NULL;
    fclose(f);
    return buf;
}

#endif
