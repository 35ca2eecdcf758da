/* fuzz_tok.c — libFuzzer harness for the tokenizer (tok_encode and the
 * detokenizers, src/tok/) over real vocabularies.
 *
 * Each input is text (any bytes). It is encoded with the shipped model's
 * SentencePiece vocabulary (models/kjv-mini.gguf) and, when ../shared/vocab
 * is present, with one of three byte-level BPE vocabularies whose
 * pre-tokenizers differ (gpt-2, deepseek-llm, deepseek-coder; chosen by the
 * input's length, as all three at once would run 5x slower: their long lists
 * of special tokens are scanned on every call), with and without special-token
 * parsing; every id must be in the vocabulary, and none may be a control
 * token unless special tokens are parsed; the ids are turned back
 * into text by tok_detokenize and by the streaming detokenizer, whose output
 * must be valid UTF-8. The text also goes through every chat template as a
 * user message. Paths come from KS_FUZZ_MODEL / KS_FUZZ_VOCAB_DIR (set at
 * build time, overridable in the environment). Built only with KS_FUZZ=ON;
 * see tests/fuzz/README.md. */
#include "kvseal/chat.h"
#include "kvseal/gguf.h"
#include "kvseal/tok.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAX_VOCABS 4
static tok_vocab *fz__v[FZ_MAX_VOCABS];
static int fz__n_v;

static void fz__load(const char *path, bool required) {
    gguf_file *f = NULL;
    ks_errbuf eb;
    if (gguf_open(path, &f, &eb) != KS_OK) {
        if (!required) return;
        fprintf(stderr, "fuzz_tok: %s\n", eb.msg);
        abort();
    }
    if (tok_vocab_load(f, &fz__v[fz__n_v], &eb) != KS_OK) {
        fprintf(stderr, "fuzz_tok: %s\n", eb.msg);
        abort();
    }
    fz__n_v++;
    gguf_close(f);
}

static void fz__init(void) {
    const char *model = getenv("KS_FUZZ_MODEL");
    const char *dir = getenv("KS_FUZZ_VOCAB_DIR");
#ifdef KS_FUZZ_MODEL_DEFAULT
    if (!model) model = KS_FUZZ_MODEL_DEFAULT;
#endif
#ifdef KS_FUZZ_VOCAB_DIR_DEFAULT
    if (!dir) dir = KS_FUZZ_VOCAB_DIR_DEFAULT;
#endif
    if (!model) {
        fprintf(stderr, "fuzz_tok: set KS_FUZZ_MODEL to models/kjv-mini.gguf\n");
        abort();
    }
    fz__load(model, true);
    static const char *const bpe[] = {"ggml-vocab-gpt-2.gguf", "ggml-vocab-deepseek-llm.gguf",
                                      "ggml-vocab-deepseek-coder.gguf"};
    for (size_t i = 0; dir && i < sizeof bpe / sizeof bpe[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, bpe[i]);
        fz__load(path, false);
    }
}

/* True when s[0..n) is valid UTF-8 (no overlongs, surrogates or > U+10FFFF). */
static bool fz__utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; }
        else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; }
        else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; }
        else return false;
        if (i + len > n) return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += len;
    }
    return true;
}

static void fz__roundtrip(const tok_vocab *v, const int32_t *ids, size_t n_ids, bool special) {
    int32_t n_vocab = tok_n_vocab(v);
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) abort();
        /* plain text never yields a control token: a prompt cannot forge an
         * end-of-turn or a BOS by spelling it */
        if (!special && tok_token_type(v, ids[i]) == TOK_TYPE_CONTROL) abort();
    }
    size_t need = tok_detokenize(v, ids, n_ids, false, true, NULL, 0);
    char *buf = malloc(need + 1);
    if (!buf) abort();
    if (tok_detokenize(v, ids, n_ids, false, true, buf, need + 1) != need) abort();
    if (buf[need] != '\0') abort();
    free(buf);

    size_t cap = tok_stream_bound(v);
    char *out = malloc(cap);
    if (!out) abort();
    tok_stream st;
    tok_stream_init(&st);
    for (size_t i = 0; i < n_ids; i++) {
        size_t k = tok_stream_push(&st, v, ids[i], out, cap);
        if (k > cap || !fz__utf8_ok((const uint8_t *)out, k)) abort();
    }
    size_t k = tok_stream_flush(&st, out, cap);
    if (k > cap || !fz__utf8_ok((const uint8_t *)out, k)) abort();
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fz__n_v == 0) fz__init();
    int picks[2] = {0, fz__n_v > 1 ? 1 + (int)(size % (size_t)(fz__n_v - 1)) : 0};
    for (int k = 0; k < (fz__n_v > 1 ? 2 : 1); k++) {
        int i = picks[k];
        for (int special = 0; special < 2; special++) {
            int32_t *ids = NULL;
            size_t n_ids = 0;
            ks_errbuf eb;
            if (tok_encode(fz__v[i], (const char *)data, size, special, special, &ids, &n_ids,
                           &eb) != KS_OK)
                abort(); /* only NOMEM can fail here */
            fz__roundtrip(fz__v[i], ids, n_ids, special);
            free(ids);
        }
    }
    /* the text as a chat message, through every template family */
    char *text = malloc(size + 1);
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = '\0';
    chat_message msgs[2] = {{"system", "Be brief."}, {"user", text}};
    for (int fam = CHAT_PLAIN; fam <= CHAT_GEMMA; fam++) {
        char *out = NULL;
        if (chat_render_family((chat_family)fam, fz__v[0], msgs, 2, true, &out, NULL) == KS_OK)
            free(out);
    }
    free(text);
    return 0;
}
