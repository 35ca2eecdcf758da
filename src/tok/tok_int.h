/* tok_int.h — private to src/tok: the vocabulary layout, the string hash
 * map and the pre-tokenizer, shared by vocab.c, encode.c and pretok.c
 * (the map and the growable buffers live in buf.c, a floor below them). */
#ifndef KS_TOK_INT_H
#define KS_TOK_INT_H

#include "kvseal/tok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

// ----------------------------------------------------------------------------
// Byte-string -> int32 hash map (open addressing, linear probing). Keys are
// (offset, length) into a pool owned by the map's user; the map never copies.

typedef struct tok__slot {
    uint32_t hash; /* low 32 bits of the key hash; slot empty when len == UINT32_MAX */
    uint32_t off;  /* key offset in the pool */
    uint32_t len;  /* key length in bytes */
    uint32_t aux;  /* caller data compared on lookup (split point of a merge) */
    int32_t val;   /* value */
} tok__slot;

typedef struct tok__map {
    tok__slot *slots; /* (cap) */
    uint32_t cap;     /* power of two */
    uint32_t n;       /* used slots */
} tok__map;

uint64_t tok__hash(const void *p, size_t n);
/* Sizes an empty map for n keys; KS_ERR_NOMEM on failure. */
ks_err tok__map_init(tok__map *m, size_t n);
void tok__map_free(tok__map *m);
/* Inserts (off,len,aux)->val; if an equal key exists: replace it when
 * `replace`, else keep the old value. */
void tok__map_put(tok__map *m, const char *pool, uint32_t off, uint32_t len, uint32_t aux,
                  int32_t val, bool replace);
/* Value of the key bytes p[0..n) with aux, or TOK_NULL. */
int32_t tok__map_get(const tok__map *m, const char *pool, const char *p, size_t n, uint32_t aux);

// ----------------------------------------------------------------------------
// Vocabulary

#define TOK__MAX_RE 8

/* Pre-tokenizer: an ordered list of regexes; each one splits the pieces left
 * by the previous ones (matches and the gaps between them both become
 * pieces), as llama.cpp's unicode_regex_split does. */
typedef struct tok__pretok {
    char name[32]; /* canonical name, e.g. "llama3" */
    int n_re;      /* regexes in re */
    pcre2_code *re[TOK__MAX_RE];
    char enc[256][2];   /* UTF-8 of each byte's GPT-2 code point */
    uint8_t enc_n[256]; /* its length (1 or 2) */
} tok__pretok;

/* Token attribute bits (llama.cpp's LLAMA_TOKEN_ATTR_*, subset). */
enum {
    TOK__ATTR_RSTRIP = 1 << 0, /* eat whitespace to the right when split out */
    TOK__ATTR_LSTRIP = 1 << 1, /* eat whitespace to the left when split out */
};

struct tok_vocab {
    tok_kind kind;
    int32_t n_vocab;
    char *pool;         /* all token texts, each NUL-terminated */
    uint32_t *text_off; /* (n_vocab) offset of each text in pool */
    uint32_t *text_len; /* (n_vocab) bytes, without the NUL */
    float *scores;      /* (n_vocab) SPM scores; 0 when absent */
    uint8_t *type;      /* (n_vocab) tok_type */
    uint8_t *attr;      /* (n_vocab) TOK__ATTR_* bits */
    uint8_t *eog;       /* (n_vocab) 1 for end-of-generation tokens */
    tok__map tok_map;   /* text -> id (the last duplicate wins, as llama.cpp) */

    char *merge_pool;   /* BPE merges "a b", each NUL-terminated */
    tok__map merge_map; /* "a b" (aux = length of "a") -> rank (first wins) */

    int32_t *special; /* (n_special) control/unknown/user-defined ids, longest text first */
    int32_t n_special;

    int32_t byte_tok[256]; /* SPM: id of "<0xXX>"; BPE: id of the 1-byte text; TOK_NULL if none */

    int32_t bos, eos, eot, eom, unk;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    bool escape_ws;      /* BPE "gemma4": spaces become U+2581 before the merges, which
                            run over raw UTF-8 (no GPT-2 byte map) in runs of newlines
                            and of everything else; <0xXX> byte tokens */
    char *piece_pool;    /* every token's piece as rendered with render_special */
    uint32_t *piece_off; /* (n_vocab) offset in piece_pool */
    uint32_t *piece_len; /* (n_vocab) bytes */
    size_t max_piece;    /* longest piece in bytes (at least 1) */
    size_t max_text;     /* longest token text in bytes (WPM's match window) */
    bool add_sep;        /* WPM: append the separator ([SEP]) with add_special */
    int32_t sep;         /* WPM: separator id, TOK_NULL if none */
    tok__pretok pre;     /* BPE only */
};

/* Compiles the pre-tokenizer for `name` (NULL or empty -> "default"; an
 * unknown name -> KS_ERR_UNSUPPORTED). Sets *ignore_merges / *add_bos when
 * the pre-tokenizer implies them (llama3, tekken). */
ks_err tok__pretok_init(tok__pretok *p, const char *name, size_t name_len, bool *ignore_merges,
                        bool *add_bos, ks_errbuf *eb);
void tok__pretok_free(tok__pretok *p);

/* Growable byte buffer for encoders. */
typedef struct tok__buf {
    char *p;
    size_t len, cap;
} tok__buf;
bool tok__buf_reserve(tok__buf *b, size_t n);
bool tok__buf_put(tok__buf *b, const void *p, size_t n);

/* Growable id list. */
typedef struct tok__ids {
    int32_t *p;
    size_t n, cap;
} tok__ids;
bool tok__ids_push(tok__ids *ids, int32_t id);

/* Splits text[0..len) (valid UTF-8) with the pre-tokenizer and appends each
 * piece, byte-encoded to GPT-2 code points, to *words as consecutive strings
 * whose byte lengths go to *lens. false on NOMEM. */
bool tok__pretok_split(const tok__pretok *p, const char *text, size_t len, tok__buf *words,
                       tok__ids *lens);

/* GPT-2 byte <-> code point map. */
uint32_t tok__byte_to_cpt(uint8_t b);
/* Byte for a GPT-2 code point, or -1 if cpt is not in the map. */
int tok__cpt_to_byte(uint32_t cpt);

/* UTF-8 helpers. Length of a sequence from its lead byte, as llama.cpp's
 * unicode_len_utf8 (continuation and invalid bytes count 1). */
static inline size_t tok__utf8_len(uint8_t c) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}
/* Appends the UTF-8 encoding of cpt (< 0x110000) to out; returns bytes (1-4). */
size_t tok__utf8_put(uint32_t cpt, char *out);

// ----------------------------------------------------------------------------
// WordPiece (BERT): unicode_wpm.c holds the generated tables, wpm.c the encoder

/* Code point classes of the WordPiece pre-tokenizer. */
enum { TOK__CLS_OTHER, TOK__CLS_WS, TOK__CLS_CTRL, TOK__CLS_PUNCT, TOK__CLS_SYM, TOK__CLS_MARK };
typedef struct tok__cls_range {
    uint32_t start; /* first code point of the range (it runs to the next start) */
    uint8_t cls;    /* TOK__CLS_* */
} tok__cls_range;
typedef struct tok__cpt_pair {
    uint32_t cpt, to;
} tok__cpt_pair;
typedef struct tok__nfd_range {
    uint32_t first, last, head; /* every code point in [first, last] decomposes to head + ... */
} tok__nfd_range;
extern const tok__cls_range tok__cls_ranges[];
extern const size_t tok__n_cls_ranges;
extern const tok__cpt_pair tok__lower_map[];
extern const size_t tok__n_lower_map;
extern const tok__nfd_range tok__nfd_ranges[];
extern const size_t tok__n_nfd_ranges;

/* WordPiece-encodes the raw text t[0..n) (no special tokens in it) and
 * appends the ids to *out, stopping at a word boundary once out holds more
 * than max_ids; word is scratch. false on NOMEM. */
bool tok__wpm_encode(const tok_vocab *v, const char *t, size_t n, tok__ids *out, size_t max_ids,
                     tok__buf *word);

#endif /* KS_TOK_INT_H */
