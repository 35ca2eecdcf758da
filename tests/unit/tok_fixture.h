/* tok_fixture.h — tiny vocabularies written to a GGUF on the fly, shared
 * by the tokenizer tests (test_tok.c, test_tok_chat.c): the vocabulary keys
 * and the round trip through a temporary file. Header-only (static inline). */
#ifndef KS_TESTS_TOK_FIXTURE_H
#define KS_TESTS_TOK_FIXTURE_H

#include "../check.h"
#include "kvseal/gguf.h"

#include <unistd.h>

/* Sets a vocabulary's keys on w: tokenizer.ggml.model, .pre (NULL: left
 * out), .tokens and .token_type (n each), .merges (NULL: left out; n_merges
 * 0: an empty list). */
static inline void tfx_vocab_kv(gguf_writer *w, const char *model, const char *pre,
                                const char *const *toks, const int32_t *types, size_t n,
                                const char *const *merges, size_t n_merges) {
    CHECK_EQ(gguf_writer_set_str(w, "tokenizer.ggml.model", model), KS_OK);
    if (pre) CHECK_EQ(gguf_writer_set_str(w, "tokenizer.ggml.pre", pre), KS_OK);
    CHECK_EQ(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, n), KS_OK);
    CHECK_EQ(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n), KS_OK);
    if (merges)
        CHECK_EQ(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, n_merges), KS_OK);
}

/* Writes w to a temporary file and destroys w; returns the file opened
 * again (already unlinked: the mapping keeps it), the caller's to close. */
static inline gguf_file *tfx_gguf_open(gguf_writer *w) {
    char path[] = "/tmp/test_tok_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    ks_errbuf eb;
    CHECK_EQ(gguf_writer_write(w, path, &eb), KS_OK);
    gguf_writer_destroy(w);
    gguf_file *f = NULL;
    CHECK_EQ(gguf_open(path, &f, &eb), KS_OK);
    unlink(path);
    return f;
}

#endif
