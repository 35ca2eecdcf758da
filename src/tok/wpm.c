/* wpm.c — the WordPiece (BERT, tokenizer.ggml.model "bert") encoder, as
 * llama.cpp's WPM tokenizer behaves:
 *
 *  1. basic tokenization, per code point (invalid UTF-8 reads as U+FFFD):
 *     replace it with the first code point of its canonical decomposition
 *     (so accents drop: "é" -> "e"); whitespace ends the current word; NUL,
 *     U+FFFD, control / format / private-use code points and combining marks
 *     (category M, as llama.cpp today) are dropped;
 *     punctuation, ASCII symbols and CJK ideographs become one-character
 *     words of their own; everything else, lowercased, extends the word;
 *  2. each word, prefixed with U+2581 (the converted vocabulary marks a
 *     word-initial piece with it where BERT marks continuations "##"), is
 *     cut greedily into the longest vocabulary tokens from left to right;
 *     if some position matches no token the whole word is [UNK].
 *
 * The Unicode facts come from the generated tables of unicode_wpm.c. */
#include "tok_int.h"

#include <string.h>

/* Class of code point c (TOK__CLS_*): binary search for the last range
 * starting at or before c. */
static int wpm__cls(uint32_t c) {
    size_t a = 0, b = tok__n_cls_ranges; /* ranges [0, a) start at or before c */
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (tok__cls_ranges[m].start <= c)
            a = m + 1;
        else
            b = m;
    }
    return a ? tok__cls_ranges[a - 1].cls : TOK__CLS_OTHER;
}

static uint32_t wpm__lower(uint32_t c) {
    size_t a = 0, b = tok__n_lower_map;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (tok__lower_map[m].cpt == c) return tok__lower_map[m].to;
        if (tok__lower_map[m].cpt < c)
            a = m + 1;
        else
            b = m;
    }
    return c;
}

static uint32_t wpm__nfd(uint32_t c) {
    size_t a = 0, b = tok__n_nfd_ranges;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        const tok__nfd_range *r = &tok__nfd_ranges[m];
        if (c < r->first)
            b = m;
        else if (c > r->last)
            a = m + 1;
        else
            return r->head;
    }
    return c;
}

static bool wpm__chinese(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Decodes the code point at t[*i..n) and advances *i; an ill-formed
 * sequence (bad lead or continuation byte, truncated, surrogate, past
 * U+10FFFF) is U+FFFD and one byte. */
static uint32_t wpm__next(const char *t, size_t n, size_t *i) {
    uint8_t b = (uint8_t)t[*i];
    size_t l;
    uint32_t c;
    if (b < 0x80)
        l = 1, c = b;
    else if ((b & 0xE0) == 0xC0)
        l = 2, c = b & 0x1F;
    else if ((b & 0xF0) == 0xE0)
        l = 3, c = b & 0x0F;
    else if ((b & 0xF8) == 0xF0)
        l = 4, c = b & 0x07;
    else
        l = 0, c = 0;
    bool ok = l > 0 && *i + l <= n;
    for (size_t k = 1; ok && k < l; k++) {
        uint8_t d = (uint8_t)t[*i + k];
        ok = (d & 0xC0) == 0x80;
        c = (c << 6) | (d & 0x3F);
    }
    if (ok && ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF)) ok = false;
    if (!ok) {
        *i += 1;
        return 0xFFFD;
    }
    *i += l;
    return c;
}

/* Cuts the word w[0..n) (starting with U+2581) into the longest tokens
 * from the left; the whole word is [UNK] when a position matches none. */
static bool wpm__word(const tok_vocab *v, const char *w, size_t n, tok__ids *out) {
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        size_t j = n - i < v->max_text ? n : i + v->max_text;
        int32_t id = TOK_NULL;
        for (; j > i; j--)
            if ((id = tok_find(v, w + i, j - i)) != TOK_NULL) break;
        if (id == TOK_NULL) {
            out->n = start;
            break;
        }
        if (!tok__ids_push(out, id)) return false;
        i = j;
    }
    if (out->n == start && v->unk != TOK_NULL) return tok__ids_push(out, v->unk);
    return true;
}

bool tok__wpm_encode(const tok_vocab *v, const char *t, size_t n, tok__ids *out, size_t max_ids,
                     tok__buf *word) {
    static const char mark[3] = {'\xE2', '\x96', '\x81'}; /* U+2581 */
    word->len = 0;
    if (!tok__buf_put(word, mark, 3)) return false;
    for (size_t i = 0; i < n && out->n <= max_ids;) {
        uint32_t c = wpm__nfd(wpm__next(t, n, &i));
        int k = wpm__cls(c);
        bool alone = k == TOK__CLS_PUNCT || (k == TOK__CLS_SYM && c < 0x7F) || wpm__chinese(c);
        if (k == TOK__CLS_WS || alone) { /* the word so far ends */
            if (word->len > 3 && !wpm__word(v, word->p, word->len, out)) return false;
            word->len = 3;
            if (k == TOK__CLS_WS) continue;
        }
        if (c == 0 || c == 0xFFFD || k == TOK__CLS_CTRL || k == TOK__CLS_MARK) continue;
        char u[4];
        if (!tok__buf_put(word, u, tok__utf8_put(wpm__lower(c), u))) return false;
        if (alone) {
            if (!wpm__word(v, word->p, word->len, out)) return false;
            word->len = 3;
        }
    }
    if (word->len > 3 && out->n <= max_ids && !wpm__word(v, word->p, word->len, out)) return false;
    return true;
}
