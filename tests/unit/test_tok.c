/* test_tok.c — tokenizer tests: every llama.cpp test vector in
 * ../shared/vocab token for token, round trips through the detokenizer, the
 * kjv-mini reference tokenizations, special-token parsing on and off, the
 * streaming UTF-8 decoder, a synthetic BPE vocabulary (unknown pre-tokenizer
 * refused, merges by rank) and speed on a whole held-out text. The last
 * section tests chat templates (kvseal/chat.h, src/tok/chat.c). */
#include "kvseal/tok.h"

#include "kvseal/chat.h"
#include "tok/tok_int.h"

#include "../check.h"
#include "tok_fixture.h"

#include <unistd.h>

// ----------------------------------------------------------------------------
// Helpers

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long sz = ftell(f);
    CHECK(sz >= 0);
    rewind(f);
    char *buf = malloc((size_t)sz + 1);
    CHECK(buf != NULL);
    CHECK(fread(buf, 1, (size_t)sz, f) == (size_t)sz);
    buf[sz] = '\0';
    fclose(f);
    *n = (size_t)sz;
    return buf;
}

/* The vocabulary of f (named what in messages); closes f. */
static tok_vocab *vocab_of(gguf_file *f, const char *what) {
    ks_errbuf eb;
    tok_vocab *v = NULL;
    ks_err e = tok_vocab_load(f, &v, &eb);
    if (e) fprintf(stderr, "tok_vocab_load(%s): %s\n", what, eb.msg);
    CHECK_EQ(e, KS_OK);
    gguf_close(f); /* the vocabulary must not depend on the mapping */
    return v;
}

static tok_vocab *load_vocab(const char *path) {
    gguf_file *f = NULL;
    ks_errbuf eb;
    ks_err e = gguf_open(path, &f, &eb);
    if (e) fprintf(stderr, "gguf_open(%s): %s\n", path, eb.msg);
    CHECK_EQ(e, KS_OK);
    return vocab_of(f, path);
}

static size_t encode(const tok_vocab *v, const char *s, size_t n, bool add_special,
                     bool parse_special, int32_t **ids) {
    size_t n_ids = 0;
    ks_errbuf eb;
    CHECK_EQ(tok_encode(v, s, n, add_special, parse_special, ids, &n_ids, &eb), KS_OK);
    return n_ids;
}

/* Checks ids[0..n) against want, printing both (labelled what and s) when
 * they differ. */
static void expect_ids(const char *what, const char *s, const int32_t *ids, size_t n,
                       const int32_t *want, size_t n_want) {
    bool same = n == n_want && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!same) {
        fprintf(stderr, "%s [%s]: got", what, s);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < n_want; i++)
            fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    CHECK(same);
}

static void check_ids(const tok_vocab *v, const char *s, bool add_special, bool parse_special,
                      const int32_t *want, size_t n_want) {
    int32_t *ids;
    size_t n = encode(v, s, strlen(s), add_special, parse_special, &ids);
    expect_ids("tokenize", s, ids, n, want, n_want);
    free(ids);
}

static double now_s(void) { return (double)ks_now_ns() * 1e-9; }

// ----------------------------------------------------------------------------
// llama.cpp vectors: *.gguf.inp holds strings separated (and ended) by
// "\n__ggml_vocab_test__\n"; *.gguf.out one line of ids per string.

static const char *const k_vocabs[][2] = { /* folder of ../shared, name */
    {"vocab", "llama-spm"},    {"vocab", "phi-3"},        {"vocab", "gpt-2"},
    {"vocab", "starcoder"},    {"vocab", "deepseek-llm"}, {"vocab", "deepseek-coder"},
    {"vocab-wpm", "bert-bge"},
};

static int run_vectors(const char *dir, const char *name, int *n_vec) {
    char rel[256], p_gguf[1024], p_inp[1024], p_out[1024];
    snprintf(rel, sizeof rel, "%s/ggml-vocab-%s.gguf", dir, name);
    if (!check_shared_path(rel, p_gguf, sizeof p_gguf)) return -1;
    snprintf(rel, sizeof rel, "%s/ggml-vocab-%s.gguf.inp", dir, name);
    CHECK(check_shared_path(rel, p_inp, sizeof p_inp));
    snprintf(rel, sizeof rel, "%s/ggml-vocab-%s.gguf.out", dir, name);
    CHECK(check_shared_path(rel, p_out, sizeof p_out));

    double t0 = now_s();
    tok_vocab *v = load_vocab(p_gguf);
    double t_load = now_s() - t0;
    size_t n_inp, n_out;
    char *inp = read_all(p_inp, &n_inp), *outs = read_all(p_out, &n_out);
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sep_n = strlen(sep);

    int fails = 0, count = 0, rt_fail = 0;
    char *line = outs, *s = inp, *inp_end = inp + n_inp;
    while (line < outs + n_out) {
        char *nl = memchr(line, '\n', (size_t)(outs + n_out - line));
        if (!nl) nl = outs + n_out;
        *nl = '\0';
        /* the matching input string */
        CHECK(s <= inp_end);
        char *e = memmem(s, (size_t)(inp_end - s), sep, sep_n);
        size_t sn = e ? (size_t)(e - s) : (size_t)(inp_end - s);
        /* expected ids */
        int32_t want[1024];
        size_t n_want = 0;
        for (char *q = line; *q;) {
            char *end;
            long id = strtol(q, &end, 10);
            if (end == q) break;
            CHECK(n_want < 1024);
            want[n_want++] = (int32_t)id;
            q = end;
        }
        int32_t *ids;
        size_t n = encode(v, s, sn, false, false, &ids);
        bool same = n == n_want && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
        if (!same) {
            fails++;
            fprintf(stderr, "%s #%d '%.*s'\n  got ", name, count, (int)sn, s);
            for (size_t i = 0; i < n; i++)
                fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n  want");
            for (size_t i = 0; i < n_want; i++)
                fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n");
        }
        /* the server's bounds (issue 8): a text of sn bytes has at least
         * ceil(sn / L) tokens, and a bounded encode stops with an exact prefix */
        size_t L = tok_max_token_bytes(v);
        if (L) CHECK(n >= (sn + L - 1) / L);
        for (size_t max = 0; max < n; max += 1 + n / 3) {
            int32_t *pre;
            size_t n_pre;
            ks_errbuf peb = {0};
            CHECK(tok_encode_max(v, s, sn, false, false, max, &pre, &n_pre, &peb) == KS_OK);
            CHECK(n_pre > max && n_pre <= n);
            CHECK(memcmp(pre, ids, n_pre * sizeof *ids) == 0);
            free(pre);
        }
        /* round trip: the pieces give the input back (SPM: minus the added
         * leading space). Valid UTF-8 inputs only, all of these are. Not
         * WordPiece: it lowercases, drops accents and spaces. */
        if (tok_vocab_kind(v) == TOK_KIND_WPM) {
            free(ids);
            count++;
            s += sn + sep_n;
            line = nl + 1;
            continue;
        }
        size_t cap = sn * 4 + 16;
        char *back = malloc(cap);
        CHECK(back != NULL);
        size_t bn = tok_detokenize(v, ids, n, false, true, back, cap);
        if (bn != sn || memcmp(back, s, sn) != 0) {
            rt_fail++;
            fprintf(stderr, "%s #%d round trip: '%.*s' -> '%s'\n", name, count, (int)sn, s, back);
        }
        free(back);
        free(ids);
        count++;
        s += sn + sep_n;
        line = nl + 1;
    }
    fprintf(
        stderr,
        "%-15s %2d/%2d vectors match, %d round-trip failures, load %.3f s (%d tokens, pre %s)\n",
        name, count - fails, count, rt_fail, t_load, tok_n_vocab(v), tok_pre_name(v));
    CHECK(count == 46);
    free(inp);
    free(outs);
    tok_vocab_free(v);
    *n_vec = count;
    return fails + rt_fail;
}

static void test_vectors(void) {
    int total_fail = 0, files = 0;
    for (size_t i = 0; i < sizeof k_vocabs / sizeof k_vocabs[0]; i++) {
        int n_vec = 0, r = run_vectors(k_vocabs[i][0], k_vocabs[i][1], &n_vec);
        if (r < 0) continue;
        files++;
        total_fail += r;
    }
    if (files == 0) {
        fprintf(stderr, "note: ../shared/vocab absent, llama.cpp vectors skipped\n");
        return;
    }
    CHECK_EQ(total_fail, 0);
}

// ----------------------------------------------------------------------------
// kjv-mini (SPM, shipped in models/)

static const char *kjv_path(char *buf, size_t cap) {
    const char *src = getenv("KS_SRC");
    snprintf(buf, cap, "%s/models/kjv-mini.gguf", src ? src : "..");
    return access(buf, R_OK) == 0 ? buf : NULL;
}

static void test_kjv_reference(const tok_vocab *v) {
    CHECK_EQ(tok_vocab_kind(v), TOK_KIND_SPM);
    CHECK_EQ(tok_n_vocab(v), 2048);
    CHECK_EQ(tok_bos(v), 1);
    CHECK_EQ(tok_eos(v), 2);
    CHECK(tok_add_bos(v));
    CHECK(!tok_add_eos(v));
    CHECK(tok_is_eog(v, 2));
    CHECK(!tok_is_eog(v, 1));
    CHECK(!tok_is_eog(v, 1043));
    CHECK(!tok_is_eog(v, -1));
    CHECK_STR_EQ(tok_token_text(v, 1), "<s>");
    CHECK_EQ(tok_token_type(v, 1), TOK_TYPE_CONTROL);
    CHECK_EQ(tok_token_type(v, 13), TOK_TYPE_BYTE);
    CHECK_EQ(tok_find(v, "<0x0A>", 6), 13);
    CHECK_EQ(tok_find(v, "no such token", 13), TOK_NULL);

    /* /work/shared/models/README.md, "Reference tokenizations" (BOS included) */
    static const int32_t r1[] = {1, 1043, 261, 1786, 1244};
    static const int32_t r2[] = {1, 420, 577, 1991, 1168};
    static const int32_t r3[] = {1, 1986, 305, 912, 294, 426, 1971};
    static const int32_t r4[] = {1, 305, 434, 493, 13, 1997, 434, 698};
    static const int32_t r5[] = {1,   1986, 53,  51,  53,   55,  1986, 198,
                                 191, 1992, 198, 178, 2004, 334, 1987};
    check_ids(v, "In the beginning", true, false, r1, 5);
    check_ids(v, "Hello world", true, false, r2, 5);
    check_ids(v, " leading space", true, false, r3, 7);
    check_ids(v, "line one\nline two", true, false, r4, 8);
    check_ids(v,
              "2024 \xc3\xbc"
              "n\xc3\xaf"
              "code",
              true, false, r5, 15);
    /* without add_special: the same minus BOS; empty text gives nothing */
    check_ids(v, "In the beginning", false, false, r1 + 1, 4);
    check_ids(v, "", true, false, r1, 1);
    check_ids(v, "", false, false, NULL, 0);

    /* pieces */
    char buf[64];
    CHECK_EQ(tok_piece(v, 1, false, buf, sizeof buf), 0);
    CHECK_EQ(tok_piece(v, 1, true, buf, sizeof buf), 3);
    CHECK(memcmp(buf, "<s>", 3) == 0);
    CHECK_EQ(tok_piece(v, 13, false, buf, sizeof buf), 1);
    CHECK_EQ(buf[0], '\n');
    size_t pn = tok_piece(v, 261, false, buf, sizeof buf); /* "▁the" */
    CHECK_EQ(pn, 4);
    CHECK(memcmp(buf, " the", 4) == 0);
    CHECK_EQ(tok_piece(v, 261, false, buf, 2), 4); /* truncated, length still reported */
    CHECK_EQ(tok_piece(v, 99999, true, buf, sizeof buf), 0);

    char text[128];
    size_t tn = tok_detokenize(v, r5, 15, false, true, text, sizeof text);
    CHECK_EQ(tn, strlen("2024 \xc3\xbc"
                        "n\xc3\xaf"
                        "code"));
    CHECK_STR_EQ(text, "2024 \xc3\xbc"
                       "n\xc3\xaf"
                       "code");
    tn = tok_detokenize(v, r1, 5, true, false, text, sizeof text);
    CHECK_STR_EQ(text, "<s> In the beginning");
}

static void test_special_parsing(const tok_vocab *v) {
    int32_t *a, *b;
    /* parse_special: "<s>" is BOS; the text after it gets its own space prefix */
    size_t na = encode(v, "<s>Hello world", 14, false, true, &a);
    size_t nb = encode(v, "Hello world", 11, false, false, &b);
    CHECK_EQ(na, nb + 1);
    CHECK_EQ(a[0], 1);
    CHECK(memcmp(a + 1, b, nb * sizeof *b) == 0);
    free(a);
    free(b);
    /* without parse_special the same text is plain characters: no control id */
    na = encode(v, "<s>Hello world</s>", 18, false, false, &a);
    CHECK(na > nb);
    for (size_t i = 0; i < na; i++)
        CHECK(a[i] != 1 && a[i] != 2);
    char back[64];
    tok_detokenize(v, a, na, false, true, back, sizeof back);
    CHECK_STR_EQ(back, "<s>Hello world</s>");
    free(a);
    /* longest match and several occurrences, with text between */
    na = encode(v, "a</s></s>b<s>", 13, false, true, &a);
    CHECK(na >= 5);
    CHECK_EQ(a[na - 1], 1);
    int n_eos = 0;
    for (size_t i = 0; i < na; i++)
        n_eos += a[i] == 2;
    CHECK_EQ(n_eos, 2);
    free(a);
}

/* tok_encode_marked(v, s, parse_special on, spans) == want[0..n_want) */
static void check_marked(const tok_vocab *v, const char *s, const tok_span *sp, size_t n_sp,
                         const int32_t *want, size_t n_want) {
    int32_t *ids = NULL;
    size_t n = 0;
    ks_errbuf eb = {0};
    CHECK_EQ(tok_encode_marked(v, s, strlen(s), false, true, sp, n_sp, SIZE_MAX, &ids, &n, &eb),
             KS_OK);
    expect_ids("marked", s, ids, n, want, n_want);
    free(ids);
}

/* Issue 38: inside request spans a control token's text is text; outside
 * them it is the token; the spans cut nothing else. */
static void test_special_marked(const tok_vocab *v) {
    int32_t *t, *w = malloc(64 * sizeof *w);
    /* "<s>" + request "A</s>B" + "</s>": BOS, the request as text, EOS */
    size_t nt = encode(v, "A</s>B", 6, false, false, &t);
    w[0] = 1;
    memcpy(w + 1, t, nt * sizeof *t);
    w[nt + 1] = 2;
    check_marked(v, "<s>A</s>B</s>", (tok_span[]){{3, 6}}, 1, w, nt + 2);
    free(t);
    /* a span over part of a token's text (either edge) keeps it text */
    nt = encode(v, "x</s>y", 6, false, false, &t);
    check_marked(v, "x</s>y", (tok_span[]){{1, 1}}, 1, t, nt);
    check_marked(v, "x</s>y", (tok_span[]){{4, 2}}, 1, t, nt);
    free(t);
    /* spans next to a token, or empty, leave it a token; no spans: tok_encode */
    nt = encode(v, "x</s>y", 6, false, true, &t);
    check_marked(v, "x</s>y", (tok_span[]){{0, 1}, {5, 1}}, 2, t, nt);
    check_marked(v, "x</s>y", (tok_span[]){{2, 0}}, 1, t, nt);
    check_marked(v, "x</s>y", NULL, 0, t, nt);
    free(t);
    /* a request's "</s>" between two of the template's: only those parse */
    nt = encode(v, "</s>", 4, false, false, &t);
    w[0] = 2;
    memcpy(w + 1, t, nt * sizeof *t);
    w[nt + 1] = 2;
    check_marked(v, "</s></s></s>", (tok_span[]){{4, 4}}, 1, w, nt + 2);
    free(t);
    /* spans out of order, overlapping or past the text are INVAL */
    int32_t *ids = NULL;
    size_t n = 0;
    ks_errbuf eb = {0};
    CHECK_EQ(tok_encode_marked(v, "abc", 3, false, true, (tok_span[]){{1, 1}, {0, 1}}, 2, SIZE_MAX,
                               &ids, &n, &eb),
             KS_ERR_INVAL);
    CHECK_EQ(tok_encode_marked(v, "abc", 3, false, true, (tok_span[]){{0, 2}, {1, 1}}, 2, SIZE_MAX,
                               &ids, &n, &eb),
             KS_ERR_INVAL);
    CHECK_EQ(tok_encode_marked(v, "abc", 3, false, true, (tok_span[]){{2, 2}}, 1, SIZE_MAX, &ids,
                               &n, &eb),
             KS_ERR_INVAL);
    CHECK(ids == NULL && n == 0);
    free(w);
}

static void test_stream(const tok_vocab *v) {
    tok_stream s;
    tok_stream_init(&s);
    char out[256];
    /* "ü" = C3 BC = byte tokens <0xC3> (198) + <0xBC> (191) */
    CHECK_EQ(tok_stream_push(&s, v, 198, out, sizeof out), 0);
    CHECK_EQ(tok_stream_push(&s, v, 191, out, sizeof out), 2);
    CHECK(memcmp(out, "\xc3\xbc", 2) == 0);
    /* a whole reference sequence streams to the exact text */
    static const int32_t r5[] = {1,   1986, 53,  51,  53,   55,  1986, 198,
                                 191, 1992, 198, 178, 2004, 334, 1987};
    char acc[128];
    size_t n = 0;
    for (size_t i = 0; i < 15; i++) {
        size_t k = tok_stream_push(&s, v, r5[i], acc + n, sizeof acc - n);
        CHECK(k <= sizeof acc - n);
        /* every chunk on its own is complete UTF-8: never ends in a lead byte */
        if (k) CHECK(((uint8_t)acc[n + k - 1] & 0xC0) != 0xC0);
        n += k;
    }
    n += tok_stream_flush(&s, acc + n, sizeof acc - n);
    acc[n] = '\0';
    CHECK_STR_EQ(acc, " 2024 \xc3\xbc"
                      "n\xc3\xaf"
                      "code");
    /* an incomplete tail is one U+FFFD on flush */
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0xE2, out, sizeof out), 0);
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0x82, out, sizeof out), 0);
    CHECK_EQ(tok_stream_flush(&s, out, sizeof out), 3);
    CHECK(memcmp(out, "\xEF\xBF\xBD", 3) == 0);
    CHECK_EQ(tok_stream_flush(&s, out, sizeof out), 0);
    /* bytes that can never be valid come out at once as U+FFFD */
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0xFF, out, sizeof out), 3);
    CHECK(memcmp(out, "\xEF\xBF\xBD", 3) == 0);
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0x80, out, sizeof out), 3);
    /* overlong lead bytes C0/C1 are never valid: C0 80 is two U+FFFD */
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0xC0, out, sizeof out), 3);
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0x80, out, sizeof out), 3);
    /* surrogates (ED A0..) are invalid too */
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0xED, out, sizeof out), 0);
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0xA0, out, sizeof out), 6);
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0x80, out, sizeof out), 3);
    /* a broken sequence: lead byte then ASCII -> U+FFFD then the text */
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0xC3, out, sizeof out), 0);
    size_t k = tok_stream_push(&s, v, 261, out, sizeof out);
    CHECK_EQ(k, 3 + 4);
    CHECK(memcmp(out, "\xEF\xBF\xBD the", 7) == 0);
    /* too small a buffer: nothing consumed, the size needed is returned */
    CHECK_EQ(tok_stream_push(&s, v, 3 + 0xC3, out, sizeof out), 0);
    CHECK_EQ(tok_stream_push(&s, v, 261, out, 2), 7);
    CHECK_EQ(tok_stream_push(&s, v, 261, out, sizeof out), 7);
    /* control tokens: hidden unless asked */
    CHECK_EQ(tok_stream_push(&s, v, 1, out, sizeof out), 0);
    s.render_special = true;
    CHECK_EQ(tok_stream_push(&s, v, 1, out, sizeof out), 3);
    CHECK(tok_stream_bound(v) >= 3 * tok_max_piece(v));
}

static void test_heldout_speed(const tok_vocab *v) {
    char p[1024];
    if (!check_shared_path("models/kjv-heldout.txt", p, sizeof p)) {
        fprintf(stderr, "note: kjv-heldout.txt absent, speed check skipped\n");
        return;
    }
    size_t n;
    char *text = read_all(p, &n);
    int32_t *ids;
    double t0 = now_s();
    size_t n_ids = encode(v, text, n, true, false, &ids);
    double dt = now_s() - t0;
    fprintf(stderr, "kjv-heldout.txt: %zu bytes -> %zu tokens in %.3f s\n", n, n_ids, dt);
    CHECK_EQ(n_ids, 8702); /* README: 8702 tokens with BOS (llama.cpp) */
    CHECK(dt < 1.0);
    char *back = malloc(n + 1);
    CHECK(tok_detokenize(v, ids, n_ids, false, true, back, n + 1) == n);
    CHECK(memcmp(back, text, n) == 0);
    free(back);
    free(ids);
    free(text);
}

// ----------------------------------------------------------------------------
// BPE vocabularies from ../shared: special tokens, user-defined tokens, speed

static void test_bpe_shared(void) {
    char p[1024];
    if (check_shared_path("vocab/ggml-vocab-gpt-2.gguf", p, sizeof p)) {
        tok_vocab *v = load_vocab(p);
        CHECK_EQ(tok_vocab_kind(v), TOK_KIND_BPE);
        CHECK_STR_EQ(tok_pre_name(v), "gpt2");
        CHECK(tok_is_eog(v, 50256));
        CHECK(!tok_add_bos(v));
        int32_t *ids;
        size_t n = encode(v, "Hi<|endoftext|>", 15, false, true, &ids);
        CHECK(n >= 2);
        CHECK_EQ(ids[n - 1], 50256);
        free(ids);
        n = encode(v, "Hi<|endoftext|>", 15, false, false, &ids);
        for (size_t i = 0; i < n; i++)
            CHECK(ids[i] != 50256);
        free(ids);
        char buf[32];
        CHECK_EQ(tok_piece(v, 50256, false, buf, sizeof buf), 0);
        CHECK_EQ(tok_piece(v, 220, false, buf, sizeof buf), 1); /* "Ġ" -> space */
        CHECK_EQ(buf[0], ' ');
        /* invalid UTF-8 never crashes; each bad byte reads as U+FFFD */
        n = encode(v,
                   "a\xff\xc3"
                   "(b",
                   5, false, false, &ids);
        CHECK(n >= 3);
        free(ids);
        tok_vocab_free(v);
    }
    if (check_shared_path("vocab/ggml-vocab-phi-3.gguf", p, sizeof p)) {
        /* "</s>", stored as user-defined, is an EOG text, hence CONTROL in
         * llama.cpp: split out only with parse_special (llama-tokenize
         * gives 829 29879 29958 for "</s>" after a comma, parsing off);
         * control "<|user|>" neither */
        tok_vocab *v = load_vocab(p);
        CHECK(tok_is_eog(v, 2));
        int32_t *ids;
        static const int32_t hi_off[] = {6324, 29892, 829, 29879, 29958, 12711};
        check_ids(v, "Hi,</s>there", false, false, hi_off, 6);
        size_t n = encode(v, "x</s>", 5, false, true, &ids);
        CHECK(n >= 2);
        CHECK_EQ(ids[n - 1], 2);
        free(ids);
        n = encode(v, "<|user|>", 8, false, false, &ids);
        for (size_t i = 0; i < n; i++)
            CHECK(ids[i] != 32010);
        free(ids);
        n = encode(v, "<|user|> hi", 11, false, true, &ids); /* RSTRIP eats the space */
        CHECK(n >= 2);
        CHECK_EQ(ids[0], 32010);
        CHECK(tok_is_eog(v, 32007)); /* <|end|> */
        free(ids);
        tok_vocab_free(v);
    }
    if (check_shared_path("vocab/ggml-vocab-deepseek-llm.gguf", p, sizeof p)) {
        double t0 = now_s();
        tok_vocab *v = load_vocab(p);
        double t_load = now_s() - t0;
        char hp[1024];
        if (check_shared_path("models/kjv-heldout.txt", hp, sizeof hp)) {
            size_t n;
            char *text = read_all(hp, &n);
            int32_t *ids;
            t0 = now_s();
            size_t n_ids = encode(v, text, n, true, false, &ids);
            double dt = now_s() - t0;
            fprintf(stderr, "deepseek-llm: load %.3f s; kjv-heldout %zu tokens in %.3f s\n", t_load,
                    n_ids, dt);
            CHECK(dt < 1.0);
            char *back = malloc(n + 1);
            CHECK(tok_detokenize(v, ids, n_ids, false, false, back, n + 1) == n);
            CHECK(memcmp(back, text, n) == 0);
            free(back);
            free(ids);
            free(text);
        }
        CHECK(t_load < 2.0); /* target < 0.3 s in release builds; generous for sanitizers */
        tok_vocab_free(v);
    }
}

// ----------------------------------------------------------------------------
// Synthetic BPE vocabulary (no ../shared needed): an unknown pre-tokenizer
// is refused (as llama.cpp); merges apply by rank, not by order of appearance.

/* Writes a tiny byte-level BPE vocabulary with tokenizer.ggml.pre = pre
 * (none when NULL) and loads it: KS_OK and *out, or the load error. */
static ks_err synthetic_bpe_load(const char *pre, tok_vocab **out) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w != NULL);
    /* byte-level alphabet: "a" "b" "c" "Ġ"; merges: "b c" rank 0, "a b" rank 1 */
    const char *toks[] = {"a", "b", "c", "\xc4\xa0", "bc",  "ab",   "abc", "<|end|>", "1",
                          "2", "3", "4", "12",       "123", "1234", "c",   "ca"};
    /* "<|end|>" is stored as user-defined: load must make it CONTROL (EOG by
     * text); "c" appears twice: the last id wins, as in llama.cpp; "ca" has
     * no merge that builds it */
    const int32_t types[] = {1, 1, 1, 1, 1, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const char *merges[] = {"b c", "a b", "a bc", "1 2", "12 3", "123 4"};
    tfx_vocab_kv(w, "gpt2", pre, toks, types, 17, merges, 6);
    CHECK_EQ(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 7), KS_OK);
    gguf_file *f = tfx_gguf_open(w);
    ks_errbuf eb;
    *out = NULL;
    ks_err e = tok_vocab_load(f, out, &eb);
    gguf_close(f);
    return e;
}

static tok_vocab *synthetic_bpe(const char *pre) {
    tok_vocab *v = NULL;
    CHECK_EQ(synthetic_bpe_load(pre, &v), KS_OK);
    return v;
}

static void test_synthetic_bpe(void) {
    /* every known pre-tokenizer compiles and splits text */
    static const char *const pres[] = {"default",        "llama3",          "llama-bpe",
                                       "dbrx",           "chatglm-bpe",     "deepseek-llm",
                                       "deepseek-coder", "falcon",          "starcoder",
                                       "refact",         "gpt-2",           "mpt",
                                       "qwen2",          "poro-chat",       "viking",
                                       "tekken",         "gpt-4o",          "seed-coder",
                                       "command-r",      "smollm",          "stablelm2",
                                       "qwen35",         "deepseek-v3",     "hunyuan-dense",
                                       "joyai-llm",      "grok-2",          "solar-open",
                                       "minimax-m2",     "granite-docling", "pixtral",
                                       "falcon-h1",      "midm-2.0",        "lfm2",
                                       "glm4",           "a.x-4.0",         "mellum",
                                       "exaone4",        "kormo",           "bailingmoe",
                                       "bailingmoe2",    "llada-moe",       "chameleon"};
    for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++) {
        tok_vocab *v = synthetic_bpe(pres[i]);
        CHECK(strcmp(tok_pre_name(v), "default") != 0 || !strcmp(pres[i], "default"));
        int32_t *ids;
        size_t n = encode(v, "ab abc 1234\n  ca's", 19, true, false, &ids);
        CHECK(n >= 5);
        free(ids);
        tok_vocab_free(v);
    }
    /* llama3: BOS implied, whole-word tokens skip the merges, digits in threes */
    tok_vocab *v = synthetic_bpe("llama3");
    CHECK(tok_add_bos(v));
    static const int32_t l1[] = {16};
    check_ids(v, "ca", false, false, l1, 1);
    static const int32_t l2[] = {13, 11};
    check_ids(v, "1234", false, false, l2, 2);
    tok_vocab_free(v);
    v = synthetic_bpe("gpt-2"); /* no ignore_merges: "ca" is "c" + "a" */
    CHECK(!tok_add_bos(v));
    static const int32_t g1[] = {15, 0};
    check_ids(v, "ca", false, false, g1, 2);
    static const int32_t g2[] = {14};
    check_ids(v, "1234", false, false, g2, 1);
    tok_vocab_free(v);

    /* GLM (chatglm-bpe, glm4) has no default BOS: only the metadata's */
    v = synthetic_bpe("glm4");
    CHECK_EQ(tok_bos(v), TOK_NULL);
    CHECK(!tok_add_bos(v));
    tok_vocab_free(v);
    v = synthetic_bpe("qwen2");
    CHECK_EQ(tok_bos(v), 11); /* BPE's default */
    tok_vocab_free(v);

    /* a name llama.cpp does not know is refused, as llama.cpp refuses it;
     * no name at all means "default" */
    CHECK_EQ(synthetic_bpe_load("no-such-pre", &v), KS_ERR_UNSUPPORTED);
    CHECK(v == NULL);
    v = synthetic_bpe(NULL);
    CHECK_STR_EQ(tok_pre_name(v), "default");
    CHECK_EQ(tok_eos(v), 7);
    CHECK(tok_is_eog(v, 7));
    CHECK_EQ(tok_token_type(v, 7), TOK_TYPE_CONTROL);
    CHECK_EQ(tok_find(v, "c", 1), 15);
    int32_t *ids;
    size_t n = encode(v, "a<|end|>", 8, false, false, &ids);
    for (size_t i = 0; i < n; i++)
        CHECK(ids[i] != 7);
    free(ids);
    n = encode(v, "a<|end|>", 8, false, true, &ids);
    CHECK_EQ(n, 2);
    CHECK_EQ(ids[1], 7);
    free(ids);
    /* "abc": "b c" (rank 0) first, then "a bc" -> "abc" */
    static const int32_t w1[] = {6};
    check_ids(v, "abc", false, false, w1, 1);
    /* "ab ab": words "ab", " ab" (space is Ġ, no merge with it) */
    static const int32_t w2[] = {5, 3, 5};
    check_ids(v, "ab ab", false, false, w2, 3);
    /* "cab": no merge touches "c"; "a b" gives "ab" */
    static const int32_t w3[] = {15, 5};
    check_ids(v, "cab", false, false, w3, 2);
    /* a character with no token is dropped (llama.cpp) */
    static const int32_t w4[] = {0};
    check_ids(v, "az", false, false, w4, 1);
    /* the default pre-tokenizer cuts digit runs into groups of three
     * ("[0-9][0-9][0-9]"), so "1234" is "123" + "4", never "1234" */
    static const int32_t w5[] = {13, 11};
    check_ids(v, "1234", false, false, w5, 2);
    tok_vocab_free(v);
}

// ----------------------------------------------------------------------------
// Token types decided by text, as llama.cpp's loader does (found with the
// oracle test, tests/e2e/test_tokenize_oracle.sh): DeepSeek-Coder stores its
// FIM tokens and Phi-3 its "</s>" as USER_DEFINED, which llama.cpp turns into
// CONTROL (FIM roles, EOG texts), so without parse_special they are plain
// text; GPT-OSS's channel tokens go the other way (always split out).

/* Writes a vocabulary of model "gpt2" (BPE, pre "gpt-2") or "llama" (SPM)
 * from n tokens and types, merges for BPE, and loads it. */
static tok_vocab *synthetic_vocab(const char *model, const char *const *toks, const int32_t *types,
                                  size_t n, const char *const *merges, size_t n_merges) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w != NULL);
    static const char *const no_merges[1] = {NULL};
    bool bpe = !strcmp(model, "gpt2"); // BPE: a merges list, empty or not
    tfx_vocab_kv(w, model, bpe ? "gpt-2" : NULL, toks, types, n,
                 bpe ? (merges ? merges : no_merges) : NULL, n_merges);
    CHECK_EQ(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0), KS_OK);
    CHECK_EQ(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 0), KS_OK);
    return vocab_of(tfx_gguf_open(w), "synthetic");
}

/* True when encoding text (no BOS) gives token id somewhere. */
static bool encodes_to(const tok_vocab *v, const char *text, bool parse_special, int32_t id) {
    int32_t *ids;
    size_t n = encode(v, text, strlen(text), false, parse_special, &ids);
    bool found = false;
    for (size_t i = 0; i < n; i++)
        found |= ids[i] == id;
    free(ids);
    return found;
}

static void test_special_by_text(void) {
    static const char *const toks[] = {"<|endoftext|>",
                                       "<\xef\xbd\x9c"
                                       "fim\xe2\x96\x81"
                                       "hole\xef\xbd\x9c>", /* 1: DeepSeek FIM suffix */
                                       "</s>",              /* 2: an EOG text */
                                       "<|channel|>",       /* 3: GPT-OSS */
                                       "<pad>",             /* 4: plain user-defined */
                                       "<|fim_prefix|>",
                                       "<fim-prefix>", /* 5, 6: one FIM role, the first text wins */
                                       "<|eom_id|>",   /* 7: EOM */
                                       "<",
                                       "x",
                                       "y"};
    static const int32_t types[] = {3, 4, 4, 3, 4, 4, 4, 4, 1, 1, 1};
    tok_vocab *v = synthetic_vocab("gpt2", toks, types, 11, NULL, 0);
    CHECK_EQ(tok_token_type(v, 1), TOK_TYPE_CONTROL);
    CHECK_EQ(tok_token_type(v, 2), TOK_TYPE_CONTROL);
    CHECK_EQ(tok_token_type(v, 3), TOK_TYPE_USER_DEFINED);
    CHECK_EQ(tok_token_type(v, 4), TOK_TYPE_USER_DEFINED);
    CHECK_EQ(tok_token_type(v, 5), TOK_TYPE_CONTROL);
    CHECK_EQ(tok_token_type(v, 6), TOK_TYPE_USER_DEFINED);
    CHECK_EQ(tok_token_type(v, 7), TOK_TYPE_CONTROL);
    CHECK(tok_is_eog(v, 2) && tok_is_eog(v, 7));
    /* control: split out only when parsing special tokens */
    for (int32_t id = 1; id <= 7; id++) {
        char text[64];
        snprintf(text, sizeof text, "x%sy", tok_token_text(v, id));
        bool control = tok_token_type(v, id) == TOK_TYPE_CONTROL;
        CHECK(encodes_to(v, text, true, id));
        CHECK_EQ(encodes_to(v, text, false, id), !control);
    }
    tok_vocab_free(v);

    /* harmony: with <|return|> and <|call|>, "<|end|>" is no EOG and
     * USER_DEFINED; with "<|tool_response>", "</s>" is no EOG and NORMAL */
    static const char *const h[] = {"<|end|>", "<|return|>", "<|call|>", "</s>",
                                    "<|tool_response>"};
    static const int32_t ht[] = {3, 3, 3, 3, 3};
    v = synthetic_vocab("llama", h, ht, 5, NULL, 0);
    CHECK_EQ(tok_token_type(v, 0), TOK_TYPE_USER_DEFINED);
    CHECK_EQ(tok_token_type(v, 3), TOK_TYPE_NORMAL);
    CHECK(!tok_is_eog(v, 3) && tok_is_eog(v, 1) && tok_is_eog(v, 4));
    CHECK(tok_is_eog(v, 0)); /* still EOS: the metadata's EOS always ends generation */
    tok_vocab_free(v);
}

// ----------------------------------------------------------------------------
// Pre-tokenizers of the families people run, for which ../shared holds no
// vocabulary: the regex split itself, against splits worked out by hand from
// the published regexes (a leftmost match, alternatives tried in order,
// greedy quantifiers backtracking):
//  - Llama 3 ("llama-bpe"), Meta's tokenizer.py pat_str (tiktoken):
//    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//  - Qwen2, PRETOKENIZE_REGEX of transformers' tokenization_qwen2.py: the
//    same with \p{N} (one digit per piece) for \p{N}{1,3}.

/* Splits text with the pre-tokenizer `pre` and returns the pieces, decoded
 * back to bytes, joined by '|' (static buffer). */
static const char *pretok_split(const char *pre, const char *text) {
    static char out[1024];
    tok__pretok p;
    bool im = false, ab = false;
    ks_errbuf eb;
    CHECK_EQ(tok__pretok_init(&p, pre, strlen(pre), &im, &ab, &eb), KS_OK);
    tok__buf words = {0};
    tok__ids lens = {0};
    CHECK(tok__pretok_split(&p, text, strlen(text), &words, &lens));
    size_t o = 0, off = 0;
    for (size_t k = 0; k < lens.n; k++) {
        if (k) out[o++] = '|';
        for (size_t i = off; i < off + (size_t)lens.p[k];) { /* GPT-2 code points -> bytes */
            uint8_t c = (uint8_t)words.p[i];
            uint32_t cpt =
                c < 0x80 ? c : ((uint32_t)(c & 0x1F) << 6) | ((uint8_t)words.p[i + 1] & 0x3F);
            i += c < 0x80 ? 1 : 2;
            int b = tok__cpt_to_byte(cpt);
            CHECK(b >= 0 && o + 2 < sizeof out);
            out[o++] = (char)b;
        }
        off += (size_t)lens.p[k];
    }
    out[o] = '\0';
    free(words.p);
    free(lens.p);
    tok__pretok_free(&p);
    return out;
}

static void check_split(const char *pre, const char *text, const char *want) {
    const char *got = pretok_split(pre, text);
    if (strcmp(got, want))
        fprintf(stderr, "%s split '%s': got '%s', want '%s'\n", pre, text, got, want);
    CHECK_STR_EQ(got, want);
}

static void test_pretok_families(void) {
    static const char *const l3[] = {"llama-bpe", "llama3"};
    for (int k = 0; k < 2; k++) {
        const char *p = l3[k];
        check_split(p, "Hello world", "Hello| world");
        /* "I": letters; "'M": contraction, any case; " " before a digit is
         * only \s+ (the last alternative); digits in threes; " it" */
        check_split(p, "I'M 12345 it's", "I|'M| |123|45| it|'s");
        /* after a space the contraction loses to " ?[^\s\p{L}\p{N}]+": " '" */
        check_split(p, "DON'T 'll've", "DON|'T| '|ll|'ve");
        /* \s+(?!\S) leaves the last space to the next word; \s*[\r\n]+
         * takes blank lines; punctuation keeps the newlines after it */
        check_split(p, "  hello\n\n  world!!\n", " | hello|\n\n| | world|!!\n");
        /* one non-letter, non-digit may lead a word: ",b"; "$" stands alone */
        check_split(p, "a,b $100abc", "a|,b| $|100|abc");
        check_split(p, "\xd0\x9f\xd1\x80\xd0\xb8 \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80!",
                    "\xd0\x9f\xd1\x80\xd0\xb8| \xe4\xb8\x96\xe7\x95\x8c| \xf0\x9f\x98\x80!");
        check_split(p, "a   ", "a|   ");
        /* \s*[\r\n]+ backtracks to end on the newline */
        check_split(p, "x \t\r\ny", "x| \t\r\n|y");
    }
    /* Qwen2: the same, one digit per piece */
    check_split("qwen2", "abc 123 x\n\n", "abc| |1|2|3| x|\n\n");
    check_split("qwen2", "I'M 2024's", "I|'M| |2|0|2|4|'s");
    check_split("qwen2", "a,b $100abc", "a|,b| $|1|0|0|abc");
    /* Qwen3.5 (tokenizer.json of Qwen3.5): Qwen2's with [\p{L}\p{M}]+ for
     * \p{L}+ and \p{M} in the punctuation class, so a combining accent
     * (U+0301) stays in its word; Qwen2 cuts it out */
    check_split("qwen35", "cafe\xcc\x81 e\xcc\x81t", "cafe\xcc\x81| e\xcc\x81t");
    check_split("qwen2", "cafe\xcc\x81 e\xcc\x81t", "cafe|\xcc\x81| e|\xcc\x81t");
    /* DeepSeek-V3 (tokenizer.json of DeepSeek-V3, three regexes in turn):
     * \p{N}{1,3}; [\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+;
     * [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?
     * [\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ .
     * " ~x": llama.cpp's \p{S} lacks ASCII '~' (llama-tokenize gives " " and
     * "~x" on such a vocabulary), so " ?[\p{P}\p{S}]+" cannot take " ~";
     * " $" is punctuation/symbol as usual */
    /* Chameleon (llama.cpp's list after facebook/chameleon-7b's
     * tokenizer.json): <sentinel:N>, image tokens, [\t\n]|4 spaces|2 spaces,
     * \p{N}, one punctuation mark, then GPT-2's; each regex splits the
     * pieces the one before left */
    check_split("chameleon", "<sentinel:12>ab  12", "<|sentinel|:|1|2|>|ab|  |1|2");
    check_split("deepseek-v3",
                "123456 \xe4\xb8\x96\xe7\x95\x8c"
                "abc ~x $y",
                "123|456| |\xe4\xb8\x96\xe7\x95\x8c|abc| |~x| $|y");
}

// Gemma's SPM (tokenizer.ggml.add_space_prefix = false): no dummy "\u2581"
// before the text or after a special token; spaces still become U+2581.
static void test_spm_no_prefix(void) {
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81",
                                       "H",     "i",   "Hi",   "\xe2\x96\x81Hi"};
    static const int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1};
    static const float scores[] = {0, 0, 0, -1, -2, -2, -1, -0.5f};
    for (int prefix = 0; prefix < 2; prefix++) {
        gguf_writer *w = gguf_writer_create();
        CHECK(w != NULL);
        tfx_vocab_kv(w, "llama", NULL, toks, types, 8, NULL, 0);
        CHECK_EQ(gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 8),
                 KS_OK);
        CHECK_EQ(gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", prefix), KS_OK);
        tok_vocab *v = vocab_of(tfx_gguf_open(w), "spm without prefix");
        static const int32_t no[] = {1, 6}, no_sp[] = {1, 7}, no_sp2[] = {1, 6, 1, 6};
        static const int32_t yes[] = {1, 7}, yes_sp[] = {1, 3, 7}, yes_sp2[] = {1, 7, 1, 7};
        check_ids(v, "Hi", true, false, prefix ? yes : no, 2);
        check_ids(v, " Hi", true, false, prefix ? yes_sp : no_sp, prefix ? 3 : 2);
        check_ids(v, "Hi<s>Hi", true, true, prefix ? yes_sp2 : no_sp2, 4);
        tok_vocab_free(v);
    }
}

// ----------------------------------------------------------------------------
// Robustness: random bytes (invalid UTF-8 included) and long runs never crash,
// stay fast, and SPM keeps every byte (byte fallback round-trips exactly).

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static void robustness(const tok_vocab *v, const char *name) {
    enum { N = 4096, LONG = 40000 };
    char *buf = malloc(LONG + 1), *back = malloc(LONG * 4 + 16);
    CHECK(buf && back);
    double t0 = now_s();
    for (int round = 0; round < 40; round++) {
        size_t n = rng() % N;
        bool valid = round & 4; /* valid UTF-8 from random code points */
        for (size_t i = 0; i < n;) {
            uint32_t r = rng();
            if (valid && (r & 3) == 3) {
                uint32_t cpt =
                    0x80 +
                    (r >> 8) %
                        0x2FF00; /* planes 0-2: every byte-level vocab has their lead bytes */
                if ((cpt >= 0xD800 && cpt <= 0xDFFF) || cpt == 0x2581) cpt = 0xE9;
                char tmp[4];
                int l = cpt < 0x800 ? 2 : cpt < 0x10000 ? 3 : 4;
                if (l == 2) tmp[0] = (char)(0xC0 | (cpt >> 6));
                if (l == 3) tmp[0] = (char)(0xE0 | (cpt >> 12));
                if (l == 4) tmp[0] = (char)(0xF0 | (cpt >> 18));
                for (int k = 1; k < l; k++)
                    tmp[k] = (char)(0x80 | ((cpt >> (6 * (l - 1 - k))) & 0x3F));
                if (i + (size_t)l > n) {
                    buf[i++] = 'a';
                    continue;
                }
                memcpy(buf + i, tmp, (size_t)l);
                i += (size_t)l;
                continue;
            }
            /* ASCII letters, spaces, newlines; raw high bytes when not `valid` */
            buf[i++] = (char)((r & 3) == 0            ? ' '
                              : (r & 7) == 1          ? '\n'
                              : (r & 3) == 2 || valid ? 'a' + (r >> 8) % 26
                                                      : (r >> 8));
        }
        int32_t *ids;
        size_t n_ids = encode(v, buf, n, round & 1, round & 2, &ids);
        for (size_t i = 0; i < n_ids; i++)
            CHECK(ids[i] >= 0 && ids[i] < tok_n_vocab(v));
        if (valid && tok_vocab_kind(v) != TOK_KIND_WPM && /* WPM normalizes: no round trip */
            (tok_vocab_kind(v) == TOK_KIND_SPM || !(round & 2))) {
            /* valid UTF-8 round-trips (SPM and BPE); parse_special could turn
             * text into control tokens, which render as nothing */
            size_t bn = tok_detokenize(v, ids, n_ids, false, true, back, LONG * 4 + 16);
            if (bn != n || memcmp(back, buf, n)) {
                fprintf(stderr, "%s: round %d: %zu bytes back from %zu\n", name, round, bn, n);
                size_t d = 0;
                while (d < n && d < bn && back[d] == buf[d])
                    d++;
                fprintf(stderr, "  first difference at %zu:", d);
                for (size_t q = d > 8 ? d - 8 : 0; q < d + 12 && q < n; q++)
                    fprintf(stderr, " %02x", (uint8_t)buf[q]);
                fprintf(stderr, "\n  got:");
                for (size_t q = d > 8 ? d - 8 : 0; q < d + 12 && q < bn; q++)
                    fprintf(stderr, " %02x", (uint8_t)back[q]);
                fprintf(stderr, "\n");
            }
            CHECK_EQ(bn, n);
            CHECK(memcmp(back, buf, n) == 0);
        }
        /* the stream decoder emits only valid UTF-8 and never loses text */
        tok_stream s;
        tok_stream_init(&s);
        size_t cap = tok_stream_bound(v), total = 0;
        char *out = malloc(cap);
        CHECK(out != NULL);
        for (size_t i = 0; i < n_ids; i++) {
            size_t k = tok_stream_push(&s, v, ids[i], out, cap);
            CHECK(k <= cap);
            total += k;
        }
        total += tok_stream_flush(&s, out, cap);
        CHECK(n_ids == 0 || total > 0 || n == 0 || tok_vocab_kind(v) == TOK_KIND_BPE);
        free(out);
        free(ids);
    }
    /* long runs: one huge word / whitespace run */
    const char fills[] = {'a', ' ', '\n', '7'};
    for (size_t k = 0; k < sizeof fills; k++) {
        memset(buf, fills[k], LONG);
        buf[LONG - 1] = 'x';
        int32_t *ids;
        size_t n_ids = encode(v, buf, LONG, false, false, &ids);
        CHECK(n_ids > 0);
        free(ids);
    }
    double dt = now_s() - t0;
    fprintf(stderr, "%-15s robustness: %.3f s\n", name, dt);
    CHECK(dt < 10.0);
    free(buf);
    free(back);
}

static void test_robustness_shared(void) {
    for (size_t i = 0; i < sizeof k_vocabs / sizeof k_vocabs[0]; i++) {
        char rel[256], p[1024];
        snprintf(rel, sizeof rel, "%s/ggml-vocab-%s.gguf", k_vocabs[i][0], k_vocabs[i][1]);
        if (!check_shared_path(rel, p, sizeof p)) continue;
        tok_vocab *v = load_vocab(p);
        robustness(v, k_vocabs[i][1]);
        tok_vocab_free(v);
    }
}

// ----------------------------------------------------------------------------
// Chat templates (kvseal/chat.h): every family's exact text for a
// system+user+assistant+user conversation, BOS handling against the
// tokenizer, the plain fallback, detection and errors.

static const chat_message k_conv[] = {
    {"system", "You are terse."},
    {"user", "Hello"},
    {"assistant", "Hi!"},
    {"user", "Who are you?"},
};

static char *render(chat_family fam, const tok_vocab *v, const chat_message *m, size_t n,
                    bool gen) {
    char *out = (char *)1;
    ks_errbuf eb;
    ks_err e = chat_render_family(fam, v, m, n, gen, &out, &eb);
    if (e) fprintf(stderr, "chat_render_family(%s): %s\n", chat_family_name(fam), eb.msg);
    CHECK_EQ(e, KS_OK);
    CHECK(out != NULL);
    return out;
}

static void check_render(chat_family fam, const tok_vocab *v, const chat_message *m, size_t n,
                         bool gen, const char *want) {
    char *got = render(fam, v, m, n, gen);
    CHECK_STR_EQ(got, want);
    free(got);
}

/* Expects INVAL whose message mentions `has`; *out must come back NULL. */
static void check_render_inval(chat_family fam, const chat_message *m, size_t n, const char *has) {
    char *out = (char *)1;
    ks_errbuf eb;
    CHECK_EQ(chat_render_family(fam, NULL, m, n, true, &out, &eb), KS_ERR_INVAL);
    CHECK(out == NULL);
    CHECK_STR_HAS(eb.msg, has);
}

static void test_chat_families(void) {
    /* v == NULL: as if the tokenizer adds BOS itself, so no leading BOS text */
    check_render(CHAT_CHATML, NULL, k_conv, 4, true,
                 "<|im_start|>system\nYou are terse.<|im_end|>\n"
                 "<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\nHi!<|im_end|>\n"
                 "<|im_start|>user\nWho are you?<|im_end|>\n"
                 "<|im_start|>assistant\n");
    check_render(CHAT_CHATML, NULL, k_conv, 4, false,
                 "<|im_start|>system\nYou are terse.<|im_end|>\n"
                 "<|im_start|>user\nHello<|im_end|>\n"
                 "<|im_start|>assistant\nHi!<|im_end|>\n"
                 "<|im_start|>user\nWho are you?<|im_end|>\n");
    check_render(CHAT_LLAMA3, NULL, k_conv, 4, true,
                 "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHi!<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
    check_render(CHAT_LLAMA2, NULL, k_conv, 4, true,
                 "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHello [/INST] Hi! </s>"
                 "<s>[INST] Who are you? [/INST]");
    check_render(CHAT_MISTRAL, NULL, k_conv, 4, true,
                 "[INST] You are terse.\n\nHello [/INST] Hi!</s>[INST] Who are you? [/INST]");
    check_render(CHAT_PHI3, NULL, k_conv, 4, true,
                 "<|system|>\nYou are terse.<|end|>\n<|user|>\nHello<|end|>\n"
                 "<|assistant|>\nHi!<|end|>\n<|user|>\nWho are you?<|end|>\n<|assistant|>\n");
    check_render(CHAT_GEMMA, NULL, k_conv, 4, true,
                 "<start_of_turn>user\nYou are terse.\n\nHello<end_of_turn>\n"
                 "<start_of_turn>model\nHi!<end_of_turn>\n"
                 "<start_of_turn>user\nWho are you?<end_of_turn>\n"
                 "<start_of_turn>model\n");
    check_render(CHAT_GEMMA, NULL, k_conv, 4, false,
                 "<start_of_turn>user\nYou are terse.\n\nHello<end_of_turn>\n"
                 "<start_of_turn>model\nHi!<end_of_turn>\n"
                 "<start_of_turn>user\nWho are you?<end_of_turn>\n");
    check_render(CHAT_PLAIN, NULL, k_conv, 4, true,
                 "You are terse.\n\nUser: Hello\nAssistant: Hi!\nUser: Who are you?\nAssistant:");
    /* without a system message the merging families start at the user turn */
    check_render(CHAT_LLAMA2, NULL, k_conv + 1, 3, true,
                 "[INST] Hello [/INST] Hi! </s><s>[INST] Who are you? [/INST]");
    check_render(CHAT_GEMMA, NULL, k_conv + 1, 1, true,
                 "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n");

    /* trimming: Llama 2/3 and Gemma trim contents, ChatML/Phi-3/Mistral keep them */
    const chat_message padded[] = {{"user", "  Hi \n"}};
    check_render(CHAT_LLAMA3, NULL, padded, 1, false,
                 "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
    check_render(CHAT_LLAMA2, NULL, padded, 1, false, "[INST] Hi [/INST]");
    check_render(CHAT_GEMMA, NULL, padded, 1, false, "<start_of_turn>user\nHi<end_of_turn>\n");
    check_render(CHAT_CHATML, NULL, padded, 1, false, "<|im_start|>user\n  Hi \n<|im_end|>\n");

    /* plain fallback: a lone user message is the raw text (base LMs continue it) */
    const chat_message lone[] = {{"user", "In the beginning"}};
    check_render(CHAT_PLAIN, NULL, lone, 1, true, "In the beginning");
    check_render(CHAT_PLAIN, NULL, lone, 1, false, "In the beginning");
    check_render(CHAT_PLAIN, NULL, k_conv, 2, false, "You are terse.\n\nUser: Hello\n");
    /* empty content is allowed */
    const chat_message empty[] = {{"user", ""}};
    check_render(CHAT_PLAIN, NULL, empty, 1, true, "");
    check_render(CHAT_CHATML, NULL, empty, 1, true,
                 "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n");
    /* ChatML-like families accept any order, several system messages included */
    const chat_message free_order[] = {{"assistant", "A"}, {"system", "S"}, {"user", "U"}};
    check_render(CHAT_PHI3, NULL, free_order, 3, false,
                 "<|assistant|>\nA<|end|>\n<|system|>\nS<|end|>\n<|user|>\nU<|end|>\n");
}

static void test_chat_errors(void) {
    char *out = (char *)1;
    ks_errbuf eb;
    for (int fam = CHAT_PLAIN; fam <= CHAT_GEMMA; fam++) {
        out = (char *)1;
        CHECK_EQ(chat_render_family((chat_family)fam, NULL, k_conv, 0, true, &out, &eb),
                 KS_ERR_INVAL);
        CHECK(out == NULL);
        const chat_message tool[] = {{"user", "x"}, {"tool", "y"}};
        check_render_inval((chat_family)fam, tool, 2, "message 1: unknown role 'tool'");
        const chat_message nocontent[] = {{"user", NULL}};
        check_render_inval((chat_family)fam, nocontent, 1, "message 0 (user): missing content");
        const chat_message norole[] = {{NULL, "x"}};
        check_render_inval((chat_family)fam, norole, 1, "message 0: missing role");
    }
    CHECK_EQ(chat_render_family((chat_family)99, NULL, k_conv, 4, true, &out, &eb), KS_ERR_INVAL);
    CHECK(out == NULL);
    const chat_family merging[] = {CHAT_LLAMA2, CHAT_MISTRAL, CHAT_GEMMA};
    for (size_t i = 0; i < 3; i++) {
        const chat_message asst_first[] = {{"assistant", "A"}, {"user", "U"}};
        check_render_inval(merging[i], asst_first, 2, "message 0 (assistant)");
        const chat_message two_users[] = {{"system", "S"}, {"user", "U"}, {"user", "V"}};
        check_render_inval(merging[i], two_users, 3, "message 2 (user)");
        const chat_message late_sys[] = {{"user", "U"}, {"assistant", "A"}, {"system", "S"}};
        check_render_inval(merging[i], late_sys, 3, "message 2 (system)");
        const chat_message sys_only[] = {{"system", "S"}};
        check_render_inval(merging[i], sys_only, 1, "message 0 (system)");
    }
    /* the same orders are fine where the template can express them */
    const chat_message late_sys[] = {{"user", "U"}, {"assistant", "A"}, {"system", "S"}};
    free(render(CHAT_CHATML, NULL, late_sys, 3, true));
    free(render(CHAT_LLAMA3, NULL, late_sys, 3, true));
    free(render(CHAT_PLAIN, NULL, late_sys, 3, true));
}

/* Writes a GGUF with the given KVs: an optional chat template and, if
 * with_vocab, a tiny byte-level BPE vocabulary with a BOS token whose
 * automatic use is add_bos. Returns the open file (the path is unlinked). */
static gguf_file *chat_gguf(const char *tmpl, bool with_vocab, bool add_bos) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w != NULL);
    if (tmpl) CHECK_EQ(gguf_writer_set_str(w, "tokenizer.chat_template", tmpl), KS_OK);
    if (with_vocab) {
        const char *toks[] = {"a",
                              "b",
                              "ab",
                              "<|begin_of_text|>",
                              "<|eot_id|>",
                              "<|start_header_id|>",
                              "<|end_header_id|>",
                              "\xc4\x8a"};
        const int32_t types[] = {1, 1, 1, 3, 3, 3, 3, 1};
        const char *merges[] = {"a b"};
        tfx_vocab_kv(w, "gpt2", "default", toks, types, 8, merges, 1);
        CHECK_EQ(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 3), KS_OK);
        CHECK_EQ(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 4), KS_OK);
        CHECK_EQ(gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos), KS_OK);
    }
    return tfx_gguf_open(w);
}

static void test_chat_detect(void) {
    static const struct {
        const char *tmpl;
        chat_family want;
    } cases[] = {
        {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
         CHAT_CHATML},
        {"{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
         "+ message['content'] | trim + '<|eot_id|>' %}",
         CHAT_LLAMA3},
        {"{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + role + '\\n' + "
         "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}",
         CHAT_GEMMA},
        {"{{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\\n' + "
         "message['content'] + '<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
         "{{ '<|assistant|>\\n' }}{% endif %}",
         CHAT_PHI3}, /* Phi-3-small: role spliced in, "<|assistant|>" only in the prompt */
        {"{% if message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + "
         "'<|end|>\\n'}}{% endif %}",
         CHAT_PHI3},
        {"{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' %}"
         "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}",
         CHAT_LLAMA2},
        {"{{ bos_token }}{% for message in messages %}{{ '[INST] ' + message['content'] + "
         "' [/INST]' }}{% endfor %}",
         CHAT_MISTRAL},
        {"{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% endfor %}", CHAT_PLAIN},
        {"", CHAT_PLAIN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        chat_family got = chat_detect_text(cases[i].tmpl, strlen(cases[i].tmpl));
        if (got != cases[i].want)
            fprintf(stderr, "template %zu: got %s, want %s\n", i, chat_family_name(got),
                    chat_family_name(cases[i].want));
        CHECK_EQ(got, cases[i].want);
    }
    CHECK_EQ(chat_detect_text(NULL, 10), CHAT_PLAIN);
    /* length is honoured: the marker past len is not seen */
    CHECK_EQ(chat_detect_text("xx<|im_start|>", 2), CHAT_PLAIN);
    CHECK_EQ(chat_detect(NULL), CHAT_PLAIN);

    /* names */
    for (int fam = CHAT_PLAIN; fam <= CHAT_GEMMA; fam++) {
        chat_family back = CHAT_PLAIN;
        CHECK(chat_family_parse(chat_family_name((chat_family)fam), &back));
        CHECK_EQ(back, fam);
    }
    CHECK_STR_EQ(chat_family_name(CHAT_CHATML), "chatml");
    CHECK_STR_EQ(chat_family_name((chat_family)42), "unknown");
    chat_family untouched = CHAT_GEMMA;
    CHECK(!chat_family_parse("jinja", &untouched));
    CHECK_EQ(untouched, CHAT_GEMMA);

    /* from a GGUF: template present, absent, and not a string */
    gguf_file *f = chat_gguf(cases[0].tmpl, false, false);
    CHECK_EQ(chat_detect(f), CHAT_CHATML);
    char *out = NULL;
    ks_errbuf eb;
    CHECK_EQ(chat_render(NULL, f, k_conv + 1, 1, true, &out, &eb), KS_OK);
    CHECK_STR_EQ(out, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    gguf_close(f);
    f = chat_gguf(NULL, false, false);
    CHECK_EQ(chat_detect(f), CHAT_PLAIN);
    gguf_close(f);
}

/* BOS text appears at the start only when the tokenizer does not add BOS;
 * either way the tokenized prompt starts with exactly one BOS. */
static void test_chat_bos(const tok_vocab *kjv) {
    const char *tmpl = "{{ bos_token }}<|start_header_id|>";
    for (int add_bos = 0; add_bos <= 1; add_bos++) {
        gguf_file *f = chat_gguf(tmpl, true, add_bos);
        tok_vocab *v = NULL;
        ks_errbuf eb;
        CHECK_EQ(tok_vocab_load(f, &v, &eb), KS_OK);
        CHECK_EQ(tok_add_bos(v), add_bos);
        char *out = NULL;
        const chat_message m[] = {{"user", "ab"}};
        CHECK_EQ(chat_render(v, f, m, 1, true, &out, &eb), KS_OK);
        const char *body = "<|start_header_id|>user<|end_header_id|>\n\nab<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n";
        char want[256];
        snprintf(want, sizeof want, "%s%s", add_bos ? "" : "<|begin_of_text|>", body);
        CHECK_STR_EQ(out, want);
        int32_t *ids;
        size_t n = encode(v, out, strlen(out), true, true, &ids);
        CHECK(n > 2);
        CHECK_EQ(ids[0], 3);
        size_t n_bos = 0;
        for (size_t i = 0; i < n; i++)
            n_bos += ids[i] == 3;
        CHECK_EQ(n_bos, 1);
        CHECK_EQ(ids[1], 5); /* <|start_header_id|> parsed as the special token */
        free(ids);
        free(out);
        tok_vocab_free(v);
        gguf_close(f);
    }

    /* kjv-mini adds BOS itself: no leading "<s>", but Llama 2's in-conversation
     * "</s><s>" stay and tokenize to EOS, BOS */
    CHECK(tok_add_bos(kjv));
    char *out = render(CHAT_LLAMA2, kjv, k_conv + 1, 3, true);
    CHECK_STR_EQ(out, "[INST] Hello [/INST] Hi! </s><s>[INST] Who are you? [/INST]");
    int32_t *ids;
    size_t n = encode(kjv, out, strlen(out), true, true, &ids);
    size_t n_bos = 0, n_eos = 0;
    for (size_t i = 0; i < n; i++) {
        n_bos += ids[i] == tok_bos(kjv);
        n_eos += ids[i] == tok_eos(kjv);
    }
    CHECK_EQ(ids[0], tok_bos(kjv));
    CHECK_EQ(n_bos, 2);
    CHECK_EQ(n_eos, 1);
    free(ids);
    free(out);
    /* ChatML never has BOS text, whatever the vocabulary */
    out = render(CHAT_CHATML, kjv, k_conv + 1, 1, false);
    CHECK_STR_EQ(out, "<|im_start|>user\nHello<|im_end|>\n");
    free(out);
}

/* The shipped kjv-mini has no chat template: plain, and a lone user message
 * renders to exactly its text so chat completions continue it. */
static void test_chat_kjv(const char *kjv_file, const tok_vocab *v) {
    gguf_file *f = NULL;
    ks_errbuf eb;
    CHECK_EQ(gguf_open(kjv_file, &f, &eb), KS_OK);
    CHECK(gguf_get(f, "tokenizer.chat_template") == NULL);
    CHECK_EQ(chat_detect(f), CHAT_PLAIN);
    const chat_message m[] = {{"user", "In the beginning"}};
    char *out = NULL;
    CHECK_EQ(chat_render(v, f, m, 1, true, &out, &eb), KS_OK);
    CHECK_STR_EQ(out, "In the beginning");
    free(out);
    gguf_close(f);
}

int main(void) {
    test_chat_families();
    test_chat_errors();
    test_chat_detect();
    test_synthetic_bpe();
    test_special_by_text();
    test_pretok_families();
    test_spm_no_prefix();
    char p[1024];
    const char *kjv = kjv_path(p, sizeof p);
    CHECK(kjv != NULL); /* shipped in the repository */
    tok_vocab *v = load_vocab(kjv);
    test_chat_bos(v);
    test_chat_kjv(kjv, v);
    test_kjv_reference(v);
    test_special_parsing(v);
    test_special_marked(v);
    test_stream(v);
    test_heldout_speed(v);
    robustness(v, "kjv-mini");
    tok_vocab_free(v);
    test_bpe_shared();
    test_robustness_shared();
    test_vectors();
    char shared_probe[1024];
    if (!check_shared_path("vocab/ggml-vocab-llama-spm.gguf", shared_probe, sizeof shared_probe))
        SKIP("../shared/vocab absent: llama.cpp vectors not run (kjv-mini checks passed)");
    printf("test_tok: ok\n");
    return 0;
}
