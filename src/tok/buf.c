/* buf.c — the containers under the tokenizer: growable byte buffers and id
 * lists (the encoders' and the pre-tokenizer's output) and the string hash
 * map behind token and merge lookup. vocab.c, encode.c, pretok.c and chat.c
 * call down into it; it calls none of them. */
#include "tok_int.h"

#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Small growable buffers

bool tok__buf_reserve(tok__buf *b, size_t n) {
    if (b->len + n <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool tok__buf_put(tok__buf *b, const void *p, size_t n) {
    if (!tok__buf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
    return true;
}

bool tok__ids_push(tok__ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *p = realloc(ids->p, cap * sizeof *p);
        if (!p) return false;
        ids->p = p;
        ids->cap = cap;
    }
    ids->p[ids->n++] = id;
    return true;
}

// ----------------------------------------------------------------------------
// Hash map

/* FNV-1a, 64-bit; keys are short token strings. */
uint64_t tok__hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

ks_err tok__map_init(tok__map *m, size_t n) {
    uint32_t cap = 16;
    while (cap < n * 2 && cap < (1u << 30))
        cap *= 2;
    m->slots = malloc((size_t)cap * sizeof *m->slots);
    if (!m->slots) return KS_ERR_NOMEM;
    for (uint32_t i = 0; i < cap; i++)
        m->slots[i].len = UINT32_MAX;
    m->cap = cap;
    m->n = 0;
    return KS_OK;
}

void tok__map_free(tok__map *m) {
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

void tok__map_put(tok__map *m, const char *pool, uint32_t off, uint32_t len, uint32_t aux,
                  int32_t val, bool replace) {
    KS_ASSERT(m->n + 1 < m->cap); /* sized by tok__map_init for every key */
    uint32_t h = (uint32_t)tok__hash(pool + off, len);
    for (uint32_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        tok__slot *s = &m->slots[i];
        if (s->len == UINT32_MAX) {
            *s = (tok__slot){.hash = h, .off = off, .len = len, .aux = aux, .val = val};
            m->n++;
            return;
        }
        if (s->hash == h && s->len == len && s->aux == aux &&
            memcmp(pool + s->off, pool + off, len) == 0) {
            if (replace) s->val = val;
            return;
        }
    }
}

int32_t tok__map_get(const tok__map *m, const char *pool, const char *p, size_t n, uint32_t aux) {
    if (!m->cap || n >= UINT32_MAX) return TOK_NULL;
    uint32_t h = (uint32_t)tok__hash(p, n);
    for (uint32_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const tok__slot *s = &m->slots[i];
        if (s->len == UINT32_MAX) return TOK_NULL;
        if (s->hash == h && s->len == n && s->aux == aux && memcmp(pool + s->off, p, n) == 0)
            return s->val;
    }
}
