/* encode.c — text to token ids: special-token splitting, the SentencePiece
 * bigram merge and the byte-level BPE merge.
 *
 * Both merges reproduce llama.cpp's tokenizers (llm_tokenizer_spm /
 * llm_tokenizer_bpe) exactly, including tie-breaks: SPM repeatedly merges the
 * adjacent pair whose concatenation is a token with the highest score
 * (leftmost on ties), then emits each symbol as a token or as <0xXX> byte
 * tokens; BPE merges, inside each pre-tokenized word, the adjacent pair with
 * the lowest merge rank (leftmost on ties). Work is O(n log n) per fragment
 * with a binary heap; stale heap entries are skipped when popped. */
#include "tok_int.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Fragments: raw text spans and already-resolved special tokens

typedef struct enc__frag {
    int32_t id; /* TOK_NULL for raw text */
    size_t off; /* raw text: byte offset */
    size_t len; /* raw text: bytes */
} enc__frag;

typedef struct enc__frags {
    enc__frag *p;
    size_t n, cap;
} enc__frags;

static bool enc__frag_push(enc__frags *f, int32_t id, size_t off, size_t len) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        enc__frag *p = realloc(f->p, cap * sizeof *p);
        if (!p) return false;
        f->p = p;
        f->cap = cap;
    }
    f->p[f->n++] = (enc__frag){id, off, len};
    return true;
}

/* True when text[lo, hi) overlaps one of the sorted, disjoint spans
 * sp[0..n): binary search for the last span starting before hi. */
static bool enc__in_spans(const tok_span *sp, size_t n, size_t lo, size_t hi) {
    size_t a = 0, b = n; // spans [0, a) start before hi, [b, n) at or after it
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (sp[m].off < hi)
            a = m + 1;
        else
            b = m;
    }
    return a > 0 && sp[a - 1].len > 0 && sp[a - 1].off + sp[a - 1].len > lo;
}

/* Splits the raw fragments of *in on every occurrence of special tokens,
 * longest token first (llama.cpp's tokenizer_st_partition). Control and
 * unknown tokens take part only with parse_special; user-defined ones
 * always do; and none where its text overlaps one of the text spans
 * sp[0..n_sp) (request text). */
static bool enc__partition(const tok_vocab *v, const char *text, enc__frags *in, enc__frags *tmp,
                           bool parse_special, const tok_span *sp, size_t n_sp) {
    for (int32_t k = 0; k < v->n_special; k++) {
        int32_t id = v->special[k];
        uint8_t t = v->type[id];
        bool ctl = t == TOK_TYPE_CONTROL || t == TOK_TYPE_UNKNOWN;
        if (!parse_special && ctl) continue;
        const char *s = v->pool + v->text_off[id];
        size_t sn = v->text_len[id];
        if (sn == 0) continue;
        bool any = false;
        for (size_t i = 0; i < in->n && !any; i++)
            any = in->p[i].id == TOK_NULL && in->p[i].len >= sn &&
                  memmem(text + in->p[i].off, in->p[i].len, s, sn);
        if (!any) continue;
        tmp->n = 0;
        for (size_t i = 0; i < in->n; i++) {
            enc__frag fr = in->p[i];
            if (fr.id != TOK_NULL) {
                if (!enc__frag_push(tmp, fr.id, 0, 0)) return false;
                continue;
            }
            size_t pos = fr.off, end = fr.off + fr.len, from = pos;
            while (from < end) {
                const char *m = end - from >= sn ? memmem(text + from, end - from, s, sn) : NULL;
                if (!m) break;
                size_t ms = (size_t)(m - text), left = ms - pos;
                if (n_sp && enc__in_spans(sp, n_sp, ms, ms + sn)) {
                    from = ms + 1; // request text spelling the token: stays text
                    continue;
                }
                if (v->attr[id] & TOK__ATTR_LSTRIP)
                    while (left > 0 && isspace((unsigned char)text[pos + left - 1]))
                        left--;
                if (left > 0 && !enc__frag_push(tmp, TOK_NULL, pos, left)) return false;
                if (!enc__frag_push(tmp, id, 0, 0)) return false;
                pos = ms + sn;
                if (v->attr[id] & TOK__ATTR_RSTRIP)
                    while (pos < end && isspace((unsigned char)text[pos]))
                        pos++;
                from = pos;
            }
            if (pos < end && !enc__frag_push(tmp, TOK_NULL, pos, end - pos)) return false;
        }
        enc__frags x = *in;
        *in = *tmp;
        *tmp = x;
    }
    return true;
}

// ----------------------------------------------------------------------------
// Symbols and the merge heap (shared by SPM and BPE)

typedef struct enc__sym {
    int32_t off;  /* byte offset of the symbol's text in the word */
    int32_t n;    /* bytes; 0 once merged into its left neighbour */
    int32_t prev; /* index of the previous live symbol, -1 at the start */
    int32_t next; /* index of the next live symbol, -1 at the end */
} enc__sym;

typedef struct enc__pair {
    float score;   /* SPM: token score (higher first); BPE: -rank */
    int32_t left;  /* left symbol index (lower first on ties) */
    int32_t right; /* right symbol index */
    int32_t size;  /* bytes of the merged text, to detect stale entries */
} enc__pair;

typedef struct enc__heap {
    enc__pair *p;
    size_t n, cap;
} enc__heap;

/* True when a must be popped before b. */
static inline bool enc__before(const enc__pair *a, const enc__pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static bool enc__heap_push(enc__heap *h, enc__pair x) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        enc__pair *p = realloc(h->p, cap * sizeof *p);
        if (!p) return false;
        h->p = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!enc__before(&x, &h->p[up])) break;
        h->p[i] = h->p[up];
        i = up;
    }
    h->p[i] = x;
    return true;
}

static enc__pair enc__heap_pop(enc__heap *h) {
    enc__pair top = h->p[0], x = h->p[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && enc__before(&h->p[c + 1], &h->p[c])) c++;
        if (!enc__before(&h->p[c], &x)) break;
        h->p[i] = h->p[c];
        i = c;
    }
    if (h->n) h->p[i] = x;
    return top;
}

/* Per-call scratch, reused across fragments and words. */
typedef struct enc__ctx {
    const tok_vocab *v;
    enc__sym *sym;
    size_t n_sym, cap_sym;
    enc__heap heap;
    tok__buf key;   /* BPE merge key "left right" */
    tok__buf text;  /* SPM escaped fragment; BPE sanitized fragment */
    tok__buf words; /* BPE pre-tokenized words */
    tok__ids lens;  /* BPE word lengths */
    tok__ids *out;
    size_t max_ids; /* stop at a word or fragment boundary once out holds more */
} enc__ctx;

/* Splits w[0..n) into UTF-8 characters (lengths from the lead byte only, as
 * llama.cpp) and links them. */
static bool enc__symbols(enc__ctx *c, size_t n) {
    if (n > (size_t)INT32_MAX) return false;
    if (n > c->cap_sym) {
        enc__sym *p = realloc(c->sym, n * sizeof *p);
        if (!p) return false;
        c->sym = p;
        c->cap_sym = n;
    }
    c->n_sym = 0;
    return true;
}

static void enc__add_sym(enc__ctx *c, size_t off, size_t len, size_t total) {
    int32_t i = (int32_t)c->n_sym++;
    c->sym[i] = (enc__sym){(int32_t)off, (int32_t)len, i - 1, off + len == total ? -1 : i + 1};
}

// ----------------------------------------------------------------------------
// SentencePiece

static bool spm__try_pair(enc__ctx *c, const char *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return true;
    const enc__sym *l = &c->sym[left], *r = &c->sym[right];
    int32_t id = tok_find(c->v, w + l->off, (size_t)(l->n + r->n));
    if (id == TOK_NULL) return true;
    return enc__heap_push(&c->heap, (enc__pair){c->v->scores[id], left, right, l->n + r->n});
}

/* Starts a merge over w[0..n): one symbol per UTF-8 character (a truncated
 * sequence at the end is one symbol) and an empty pair heap. */
static bool enc__split_chars(enc__ctx *c, const char *w, size_t n) {
    if (!enc__symbols(c, n)) return false;
    for (size_t off = 0; off < n;) {
        size_t l = tok__utf8_len((uint8_t)w[off]);
        if (l > n - off) l = n - off;
        enc__add_sym(c, off, l, n);
        off += l;
    }
    c->heap.n = 0;
    return true;
}

/* Tokenizes w[0..n) (already space-escaped) and appends ids. */
static bool spm__encode(enc__ctx *c, const char *w, size_t n) {
    if (n == 0) return true;
    if (!enc__split_chars(c, w, n)) return false;
    for (size_t i = 1; i < c->n_sym; i++)
        if (!spm__try_pair(c, w, (int32_t)i - 1, (int32_t)i)) return false;
    while (c->heap.n) {
        enc__pair p = enc__heap_pop(&c->heap);
        enc__sym *l = &c->sym[p.left], *r = &c->sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) c->sym[r->next].prev = p.left;
        if (!spm__try_pair(c, w, l->prev, p.left) || !spm__try_pair(c, w, p.left, l->next))
            return false;
    }
    for (int32_t i = 0; i != -1; i = c->sym[i].next) {
        const enc__sym *s = &c->sym[i];
        int32_t id = tok_find(c->v, w + s->off, (size_t)s->n);
        if (id != TOK_NULL) {
            if (!tok__ids_push(c->out, id)) return false;
            continue;
        }
        /* no token for this character: byte fallback (<unk> without byte tokens) */
        for (int32_t k = 0; k < s->n; k++) {
            int32_t b = c->v->byte_tok[(uint8_t)w[s->off + k]];
            if (b == TOK_NULL) b = c->v->unk;
            if (b != TOK_NULL && !tok__ids_push(c->out, b)) return false;
        }
    }
    return true;
}

// ----------------------------------------------------------------------------
// Byte-level BPE

static bool bpe__try_pair(enc__ctx *c, const char *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return true;
    const enc__sym *l = &c->sym[left], *r = &c->sym[right];
    c->key.len = 0;
    if (!tok__buf_put(&c->key, w + l->off, (size_t)l->n) || !tok__buf_put(&c->key, " ", 1) ||
        !tok__buf_put(&c->key, w + r->off, (size_t)r->n))
        return false;
    int32_t rank =
        tok__map_get(&c->v->merge_map, c->v->merge_pool, c->key.p, c->key.len, (uint32_t)l->n);
    if (rank == TOK_NULL) return true;
    return enc__heap_push(&c->heap, (enc__pair){-(float)rank, left, right, l->n + r->n});
}

/* Merges one pre-tokenized (byte-encoded) word and appends its ids. */
static bool bpe__word(enc__ctx *c, const char *w, size_t n) {
    const tok_vocab *v = c->v;
    if (n == 0) return true;
    if (v->ignore_merges) {
        int32_t id = tok_find(v, w, n);
        if (id != TOK_NULL) return tok__ids_push(c->out, id);
    }
    if (!enc__split_chars(c, w, n)) return false;
    for (size_t i = 1; i < c->n_sym; i++)
        if (!bpe__try_pair(c, w, (int32_t)i - 1, (int32_t)i)) return false;
    while (c->heap.n) {
        enc__pair p = enc__heap_pop(&c->heap);
        enc__sym *l = &c->sym[p.left], *r = &c->sym[p.right];
        /* stale: a side was merged away, or the left side grew (then the pair
         * text differs); right's start never moves, so sizes decide */
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size || l->next != p.right) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) c->sym[r->next].prev = p.left;
        if (!bpe__try_pair(c, w, l->prev, p.left) || !bpe__try_pair(c, w, p.left, l->next))
            return false;
    }
    for (int32_t i = 0; i != -1; i = c->sym[i].next) {
        const enc__sym *s = &c->sym[i];
        int32_t id = tok_find(v, w + s->off, (size_t)s->n);
        if (id != TOK_NULL) {
            if (!tok__ids_push(c->out, id)) return false;
            continue;
        }
        for (int32_t k = 0; k < s->n; k++) { /* llama.cpp: single-byte tokens, else dropped */
            int32_t b = v->byte_tok[(uint8_t)w[s->off + k]];
            if (b != TOK_NULL && !tok__ids_push(c->out, b)) return false;
        }
    }
    return true;
}

/* Copies t[0..n) into c->text as valid UTF-8: every byte that does not start
 * a well-formed sequence becomes U+FFFD (llama.cpp's unicode_cpts_from_utf8;
 * surrogates and code points past U+10FFFF are replaced too, which PCRE2
 * requires). */
static bool bpe__sanitize(enc__ctx *c, const char *t, size_t n) {
    c->text.len = 0;
    if (!tok__buf_reserve(&c->text, n * 3 + 1)) return false;
    char *o = c->text.p;
    size_t on = 0;
    for (size_t i = 0; i < n;) {
        uint8_t b = (uint8_t)t[i];
        size_t l = 0;
        uint32_t cpt = 0;
        if (b < 0x80)
            l = 1, cpt = b;
        else if ((b & 0xE0) == 0xC0)
            l = 2, cpt = b & 0x1F;
        else if ((b & 0xF0) == 0xE0)
            l = 3, cpt = b & 0x0F;
        else if ((b & 0xF8) == 0xF0)
            l = 4, cpt = b & 0x07;
        bool ok = l > 0 && i + l <= n;
        for (size_t k = 1; ok && k < l; k++) {
            uint8_t d = (uint8_t)t[i + k];
            ok = (d & 0xC0) == 0x80;
            cpt = (cpt << 6) | (d & 0x3F);
        }
        if (ok && ((cpt >= 0xD800 && cpt <= 0xDFFF) || cpt > 0x10FFFF)) ok = false;
        if (!ok) {
            memcpy(o + on, "\xEF\xBF\xBD", 3);
            on += 3;
            i++;
            continue;
        }
        on += tok__utf8_put(cpt, o + on);
        i += l;
    }
    c->text.len = on;
    return true;
}

/* gemma4 (SentencePiece-style BPE, llama.cpp's pre-type GEMMA4): t[0..n)
 * with every space as U+2581, made valid UTF-8, cut into runs of newlines
 * and runs of everything else (its regex "[^\n]+|[\n]+"); a run of newlines
 * that is a token is taken whole, every other run merged over its UTF-8
 * characters (bytes with no token: <0xXX> tokens). */
static bool bpe__encode_ws(enc__ctx *c, const char *t, size_t n) {
    c->words.len = 0;
    if (!tok__buf_reserve(&c->words, n * 3 + 1)) return false;
    for (size_t k = 0; k < n; k++) {
        if (t[k] == ' ') {
            memcpy(c->words.p + c->words.len, "\xE2\x96\x81", 3);
            c->words.len += 3;
        } else {
            c->words.p[c->words.len++] = t[k];
        }
    }
    if (!bpe__sanitize(c, c->words.p, c->words.len)) return false;
    const char *w = c->text.p;
    for (size_t i = 0, m = c->text.len; i < m && c->out->n <= c->max_ids;) {
        const bool nl = w[i] == '\n';
        size_t j = i + 1;
        while (j < m && (w[j] == '\n') == nl)
            j++;
        const int32_t id = nl ? tok_find(c->v, w + i, j - i) : TOK_NULL;
        if (id != TOK_NULL ? !tok__ids_push(c->out, id) : !bpe__word(c, w + i, j - i))
            return false;
        i = j;
    }
    return true;
}

static bool bpe__encode(enc__ctx *c, const char *t, size_t n) {
    if (n == 0) return true;
    if (c->v->escape_ws) return bpe__encode_ws(c, t, n);
    if (!bpe__sanitize(c, t, n)) return false;
    c->words.len = 0;
    c->lens.n = 0;
    if (!tok__pretok_split(&c->v->pre, c->text.p, c->text.len, &c->words, &c->lens)) return false;
    size_t off = 0;
    for (size_t i = 0; i < c->lens.n && c->out->n <= c->max_ids; i++) {
        if (!bpe__word(c, c->words.p + off, (size_t)c->lens.p[i])) return false;
        off += (size_t)c->lens.p[i];
    }
    return true;
}

// ----------------------------------------------------------------------------
// Public entry point

ks_err tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special,
                  bool parse_special, int32_t **ids, size_t *n_ids, ks_errbuf *eb) {
    return tok_encode_max(v, text, len, add_special, parse_special, SIZE_MAX, ids, n_ids, eb);
}

ks_err tok_encode_max(const tok_vocab *v, const char *text, size_t len, bool add_special,
                      bool parse_special, size_t max_ids, int32_t **ids, size_t *n_ids,
                      ks_errbuf *eb) {
    return tok_encode_marked(v, text, len, add_special, parse_special, NULL, 0, max_ids, ids,
                             n_ids, eb);
}

ks_err tok_encode_marked(const tok_vocab *v, const char *text, size_t len, bool add_special,
                         bool parse_special, const tok_span *text_spans, size_t n_spans,
                         size_t max_ids, int32_t **ids, size_t *n_ids, ks_errbuf *eb) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len > 0) return ks_seterr(eb, KS_ERR_INVAL, "tok_encode: NULL text");
    for (size_t i = 0; i < n_spans; i++)
        if (text_spans[i].off > len || text_spans[i].len > len - text_spans[i].off ||
            (i && text_spans[i].off < text_spans[i - 1].off + text_spans[i - 1].len))
            return ks_seterr(eb, KS_ERR_INVAL, "tok_encode: text span %zu out of order or range",
                             i);
    tok__ids out = {0};
    enc__frags frags = {0}, tmp = {0};
    enc__ctx c = {.v = v, .out = &out, .max_ids = max_ids};
    bool ok = true;

    if (len > 0) ok = enc__frag_push(&frags, TOK_NULL, 0, len);
    if (ok && len > 0) ok = enc__partition(v, text, &frags, &tmp, parse_special, text_spans, n_spans);
    if (ok && add_special && v->add_bos) ok = tok__ids_push(&out, v->bos);

    bool prev_special = true; /* SPM: the first fragment gets the space prefix */
    // BPE words and the fragments between special tokens are tokenized
    // independently, so stopping between two of them leaves an exact prefix
    for (size_t i = 0; ok && i < frags.n && out.n <= max_ids; i++) {
        const enc__frag *fr = &frags.p[i];
        if (fr->id != TOK_NULL) {
            ok = tok__ids_push(&out, fr->id);
            prev_special = true;
            continue;
        }
        if (v->kind == TOK_KIND_SPM) {
            /* " " prefix after a special token or at the start, then every
             * space becomes U+2581 */
            c.text.len = 0;
            ok = tok__buf_reserve(&c.text, fr->len * 3 + 3);
            if (!ok) break;
            if (v->add_space_prefix && prev_special) ok = tok__buf_put(&c.text, "\xE2\x96\x81", 3);
            for (size_t k = 0; ok && k < fr->len; k++) {
                char ch = text[fr->off + k];
                if (ch == ' ') {
                    memcpy(c.text.p + c.text.len, "\xE2\x96\x81", 3);
                    c.text.len += 3;
                } else {
                    c.text.p[c.text.len++] = ch;
                }
            }
            ok = ok && spm__encode(&c, c.text.p, c.text.len);
        } else if (v->kind == TOK_KIND_WPM) {
            ok = tok__wpm_encode(v, text + fr->off, fr->len, &out, max_ids, &c.text);
        } else {
            ok = bpe__encode(&c, text + fr->off, fr->len);
        }
        prev_special = false;
    }
    if (ok && add_special && v->add_eos && out.n <= max_ids) ok = tok__ids_push(&out, v->eos);
    if (ok && add_special && v->add_sep && out.n <= max_ids) ok = tok__ids_push(&out, v->sep);

    free(frags.p);
    free(tmp.p);
    free(c.sym);
    free(c.heap.p);
    free(c.key.p);
    free(c.text.p);
    free(c.words.p);
    free(c.lens.p);
    if (!ok) {
        free(out.p);
        return ks_seterr(eb, KS_ERR_NOMEM, "tok_encode: no memory (%zu bytes of text)", len);
    }
    *ids = out.n ? out.p : NULL;
    if (!out.n) free(out.p);
    *n_ids = out.n;
    return KS_OK;
}
