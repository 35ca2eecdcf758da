/* stop.c — stop strings over streamed, detokenized text.
 *
 * The matcher keeps the text it has not yet released (`buf`). Invariant
 * between calls: the released text contains no stop string, and the held
 * text is the longest suffix of everything pushed that is a proper prefix of
 * some stop string. Hence any future occurrence starts inside the held text,
 * and searching buf alone is enough. The winner among several occurrences
 * is the one that ends first, so results do not depend on piece boundaries
 * (see sample.h). Stop lists are short (OpenAI allows 4), so plain memmem
 * and memcmp scans are the right tool here. */
#include "kvseal/sample.h"

#include <stdlib.h>
#include <string.h>

struct stop_matcher {
    int n_stops;
    char **stops;     // (n_stops) owned copies
    size_t *lens;     // (n_stops) byte lengths, each >= 1
    char *buf;        // held text, then the newly pushed piece; not NUL-terminated
    size_t len;       // bytes in buf
    size_t cap;       // bytes allocated for buf
    size_t released;  // bytes at the front of buf handed out by the last call
    bool done;        // a stop string matched (or the stream was flushed)
    int stop_index;   // the matched stop, -1 if none
};

ks_err stop_matcher_create(const char *const *stops, int n_stops, stop_matcher **out,
                           ks_errbuf *eb) {
    KS_ASSERT(out);
    *out = NULL;
    if (n_stops < 0)
        return ks_seterr(eb, KS_ERR_INVAL, "stop: n_stops must be >= 0, got %d", n_stops);
    if (n_stops > 0 && !stops)
        return ks_seterr(eb, KS_ERR_INVAL, "stop: %d stop strings but no array", n_stops);
    for (int i = 0; i < n_stops; i++) {
        if (!stops[i]) return ks_seterr(eb, KS_ERR_INVAL, "stop string %d is NULL", i);
        if (!stops[i][0]) return ks_seterr(eb, KS_ERR_INVAL, "stop string %d is empty", i);
    }
    stop_matcher *m = calloc(1, sizeof *m);
    if (!m) goto fail;
    m->stop_index = -1;
    if (n_stops > 0) {
        m->stops = calloc((size_t)n_stops, sizeof *m->stops);
        m->lens = calloc((size_t)n_stops, sizeof *m->lens);
        if (!m->stops || !m->lens) goto fail;
        m->n_stops = n_stops; // from here on destroy frees the copies made so far
        for (int i = 0; i < n_stops; i++) {
            m->lens[i] = strlen(stops[i]);
            m->stops[i] = malloc(m->lens[i] + 1);
            if (!m->stops[i]) goto fail;
            memcpy(m->stops[i], stops[i], m->lens[i] + 1);
        }
    }
    *out = m;
    return KS_OK;
fail:
    stop_matcher_destroy(m);
    return ks_seterr(eb, KS_ERR_NOMEM, "stop: out of memory");
}

void stop_matcher_destroy(stop_matcher *m) {
    if (!m) return;
    for (int i = 0; m->stops && i < m->n_stops; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    free(m->buf);
    free(m);
}

/* Drops the bytes the previous call handed out (their pointer dies now). */
static void stop__drop_released(stop_matcher *m) {
    if (m->released == 0) return;
    memmove(m->buf, m->buf + m->released, m->len - m->released);
    m->len -= m->released;
    m->released = 0;
}

ks_err stop_matcher_push(stop_matcher *m, const char *piece, size_t len, stop_result *out) {
    KS_ASSERT(m && out && (len == 0 || piece));
    stop__drop_released(m);
    *out = (stop_result){.text = m->buf, .len = 0, .matched = m->stop_index >= 0,
                         .stop_index = m->stop_index};
    if (m->done) return KS_OK;
    if (m->len + len > m->cap) {
        size_t cap = m->cap ? m->cap : 64;
        while (cap < m->len + len) cap *= 2;
        char *nb = realloc(m->buf, cap);
        if (!nb) return KS_ERR_NOMEM;
        m->buf = nb;
        m->cap = cap;
        out->text = nb;
    }
    if (len) memcpy(m->buf + m->len, piece, len);
    m->len += len;

    // a completed stop string: the one ending first wins, then the longest
    size_t best_end = SIZE_MAX, best_start = 0;
    int best = -1;
    for (int i = 0; i < m->n_stops && m->len > 0; i++) {
        const char *hit = memmem(m->buf, m->len, m->stops[i], m->lens[i]);
        if (!hit) continue;
        size_t start = (size_t)(hit - m->buf), end = start + m->lens[i];
        if (end < best_end || (end == best_end && start < best_start)) {
            best_end = end;
            best_start = start;
            best = i;
        }
    }
    if (best >= 0) {
        m->done = true;
        m->stop_index = best;
        out->len = best_start;
        out->matched = true;
        out->stop_index = best;
        m->released = m->len; // the stop string and anything after are dropped
        return KS_OK;
    }

    // no match: hold back the longest suffix that could still grow into one
    size_t hold = 0;
    for (int i = 0; i < m->n_stops; i++) {
        size_t k = m->lens[i] - 1 < m->len ? m->lens[i] - 1 : m->len;
        for (; k > hold; k--) {
            if (memcmp(m->buf + m->len - k, m->stops[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    out->len = m->len - hold;
    m->released = out->len;
    return KS_OK;
}

void stop_matcher_flush(stop_matcher *m, stop_result *out) {
    KS_ASSERT(m && out);
    stop__drop_released(m);
    *out = (stop_result){.text = m->buf, .len = 0, .matched = m->stop_index >= 0,
                         .stop_index = m->stop_index};
    if (m->done) return;
    m->done = true;
    out->len = m->len;
    m->released = m->len;
}
