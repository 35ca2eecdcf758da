/* test_grammar.c — unit tests of module `grammar` (include/kvseal/grammar.h;
 * grammar_sample, the engine's draw under a grammar, too): the GBNF parser
 * (each construct, errors with their positions, the bounds), the matcher (accepted and
 * rejected strings, completion, UTF-8 split across calls, pathological
 * grammars staying bounded), JSON schema compilation (each keyword, the
 * pattern regex subset, numeric bounds and formats at their edges;
 * unsupported ones refused by name) and the token mask against a
 * brute-force check over real vocabularies from ../shared/vocab. */
#include "kvseal/admit.h"
#include "kvseal/gguf.h"
#include "kvseal/grammar.h"

#include <jansson.h>
#include <pthread.h>
#include <time.h>

#include "../check.h"

// ----------------------------------------------------------------------------
// Helpers

static grammar *gparse(const char *text) {
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    grammar *g = NULL;
    ks_err e = grammar_parse(text, strlen(text), &g, &eb);
    if (e) fprintf(stderr, "grammar_parse: %s\n--\n%s\n--\n", eb.msg, text);
    CHECK_EQ(e, KS_OK);
    return g;
}

/* The error message of a grammar that must fail with code want. */
static const char *gfail(const char *text, ks_err want) {
    static ks_errbuf eb;
    ks_errbuf_clear(&eb);
    grammar *g = NULL;
    ks_err e = grammar_parse(text, strlen(text), &g, &eb);
    if (e != want)
        fprintf(stderr, "expected %s for:\n%s\ngot %s: %s\n", ks_err_name(want), text,
                ks_err_name(e), eb.msg);
    CHECK_EQ(e, want);
    CHECK(!g);
    return eb.msg;
}

/* 0: s rejected; 1: accepted but not complete; 2: complete. */
static int gmatch(grammar *g, const char *s) {
    grammar_matcher *m = NULL;
    ks_errbuf eb;
    CHECK_EQ(grammar_matcher_create(g, &m, &eb), KS_OK);
    int r = grammar_matcher_accept(m, s, strlen(s)) ? (grammar_matcher_complete(m) ? 2 : 1) : 0;
    grammar_matcher_destroy(m);
    return r;
}

#define FULL(g, s) CHECK_EQ(gmatch(g, s), 2)
#define PART(g, s) CHECK_EQ(gmatch(g, s), 1)
#define NOPE(g, s) CHECK_EQ(gmatch(g, s), 0)

static grammar *gschema(const char *json) {
    json_error_t je;
    json_t *s = json_loads(json, JSON_DECODE_ANY, &je);
    CHECK(s);
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    grammar *g = NULL;
    ks_err e = grammar_from_schema(s, &g, &eb);
    if (e) fprintf(stderr, "grammar_from_schema(%s): %s\n", json, eb.msg);
    CHECK_EQ(e, KS_OK);
    json_decref(s);
    return g;
}

static const char *gschema_fail(const char *json, ks_err want) {
    static ks_errbuf eb;
    json_error_t je;
    json_t *s = json_loads(json, JSON_DECODE_ANY, &je);
    CHECK(s);
    ks_errbuf_clear(&eb);
    grammar *g = NULL;
    ks_err e = grammar_from_schema(s, &g, &eb);
    if (e != want)
        fprintf(stderr, "schema %s: expected %s, got %s: %s\n", json, ks_err_name(want),
                ks_err_name(e), eb.msg);
    CHECK_EQ(e, want);
    json_decref(s);
    return eb.msg;
}

/* A table of match cases: a T_GBNF or T_SCHEMA row compiles the grammar
 * that the T_FULL / T_PART / T_NOPE rows after it are matched against. */
typedef struct gcase {
    enum { GC_GBNF, GC_SCHEMA, GC_TEXT } kind;
    const char *text;
    int want; /* GC_TEXT: gmatch's answer */
} gcase;

#define T_GBNF(t)                                                                                  \
    { GC_GBNF, t, 0 }
#define T_SCHEMA(t)                                                                                \
    { GC_SCHEMA, t, 0 }
#define T_FULL(s)                                                                                  \
    { GC_TEXT, s, 2 }
#define T_PART(s)                                                                                  \
    { GC_TEXT, s, 1 }
#define T_NOPE(s)                                                                                  \
    { GC_TEXT, s, 0 }

static void run_cases(const gcase *c, size_t n) {
    grammar *g = NULL;
    const char *src = NULL;
    for (size_t i = 0; i < n; i++) {
        if (c[i].kind != GC_TEXT) {
            grammar_unref(g);
            g = c[i].kind == GC_GBNF ? gparse(c[i].text) : gschema(c[i].text);
            src = c[i].text;
            continue;
        }
        CHECK(g);
        int got = gmatch(g, c[i].text);
        if (got != c[i].want)
            fprintf(stderr, "grammar:\n%s\non '%s': gmatch %d, want %d\n", src, c[i].text, got,
                    c[i].want);
        CHECK_EQ(got, c[i].want);
    }
    grammar_unref(g);
}

/* A table of refusals: the grammar (kind GC_GBNF or GC_SCHEMA) fails with
 * code want, and its message holds has and has2 where given. */
typedef struct fcase {
    int kind;
    const char *text;
    ks_err want;
    const char *has, *has2;
} fcase;

static void run_fails(const fcase *c, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const char *m =
            c[i].kind == GC_GBNF ? gfail(c[i].text, c[i].want) : gschema_fail(c[i].text, c[i].want);
        if (c[i].has) CHECK_STR_HAS(m, c[i].has);
        if (c[i].has2) CHECK_STR_HAS(m, c[i].has2);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ----------------------------------------------------------------------------
// GBNF constructs

static void test_constructs(void) {
    static const gcase cases[] = {
        T_GBNF("root ::= \"ab\" \"c\""),
        T_FULL("abc"),
        T_PART("ab"),
        T_NOPE("abd"),
        T_NOPE("abcx"),

        T_GBNF("root ::= [a-c] [^a-z] [xyz-]\n"),
        T_FULL("aZ-"),
        T_FULL("c1x"),
        T_NOPE("da-"),
        T_NOPE("aa-"),

        T_GBNF("root ::= . ."),
        T_FULL("a\xc3\xa9"), // any code point, a 2-byte one too
        T_PART("a\xc3"),     // inside a character

        T_GBNF("root ::= \"x\" | \"y\" \"z\"\n  | \"w\""),
        T_FULL("x"),
        T_FULL("yz"),
        T_FULL("w"),
        T_NOPE("y z"),

        T_GBNF("# a comment\nroot ::= a b* # trailing\na ::= \"a\"+\nb ::= (\"b\" | \"c\")?\n"),
        T_FULL("a"),
        T_FULL("aaab"),
        T_FULL("aac"),
        T_FULL("abc"), // b* of (b|c)?
        T_NOPE("b"),

        T_GBNF("root ::= \"a\"{2} \"b\"{1,3} \"c\"{2,} \"d\"{,1}"),
        T_FULL("aabcc"),
        T_FULL("aabbbccccd"),
        T_NOPE("abcc"),
        T_NOPE("aabbbbcc"),
        T_PART("aabc"),

        T_GBNF("root ::= (\"ab\" \"c\"){2}"), // a multi-element item repeated
        T_FULL("abcabc"),
        T_NOPE("abcab c"),

        // escapes
        T_GBNF("root ::= \"\\n\\t\\\\\\\"\\x41\\u00e9\\U0001F600\" [\\]\\-]"),
        T_FULL("\n\t\\\"A\xc3\xa9\xf0\x9f\x98\x80]"),
        T_FULL("\n\t\\\"A\xc3\xa9\xf0\x9f\x98\x80-"),

        // multi-line rule bodies: a rule ends where the next `name ::=` starts
        T_GBNF("root ::=\n  item\n  (\",\" item)*\nitem ::=\n  [0-9]+\n"),
        T_FULL("1,22,333"),
        T_NOPE("1,,2"),

        // negated classes and UTF-8
        T_GBNF("root ::= [^\"]* \"\\\"\""),
        T_FULL("h\xc3\xa9llo \xe2\x82\xac\""),
        T_NOPE("a\"b"),
        T_GBNF("root ::= [\\u00e0-\\u00ff]"),
        T_FULL("\xc3\xa9"),
        T_NOPE("\xc3\x80"), // U+00C0
        T_PART("\xc3"),     // still possible
        T_NOPE("\xc2"),     // U+0080..U+00BF cannot be in the range
        T_NOPE("\x80"),     // a stray continuation byte

        // empty alternatives and recursion (not left)
        T_GBNF("root ::= \"(\" root \")\" | "),
        T_FULL(""),
        T_FULL("((()))"),
        T_PART("(("),
        T_NOPE("())"),
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

static void test_errors(void) {
    static const fcase cases[] = {
        {GC_GBNF, "root ::= \"abc", KS_ERR_INVAL, "line 1, column 14", "unterminated string"},
        {GC_GBNF, "root ::= x\n", KS_ERR_INVAL, "undefined rule 'x'", "line 1, column 10"},
        {GC_GBNF, "a ::= \"a\"\n", KS_ERR_INVAL, "no 'root'", NULL},
        {GC_GBNF, "root ::= \"a\"\nroot ::= \"b\"\n", KS_ERR_INVAL, "defined twice", NULL},
        {GC_GBNF, "root ::= [a-\n", KS_ERR_INVAL, "line 1", NULL},
        {GC_GBNF, "root ::= \"a\"\n  x ::= \"b\" ) \n", KS_ERR_INVAL, "line 2", NULL},
        {GC_GBNF, "root ::= (\"a\" | \"b\"\n", KS_ERR_INVAL, "expected ')'", NULL},
        {GC_GBNF, "root ::= \"\\q\"", KS_ERR_INVAL, "unknown escape", NULL},
        {GC_GBNF, "root ::= [z-a]", KS_ERR_INVAL, "range end", NULL},
        {GC_GBNF, "root ::= \"a\"{3,2}", KS_ERR_INVAL, "max below min", NULL},
        {GC_GBNF, "root ::= @", KS_ERR_INVAL, "line 1, column 10: unexpected character '@'", NULL},
        {GC_GBNF, "just words", KS_ERR_INVAL, "expected a rule definition", NULL},
        // left recursion, direct and through a nullable prefix
        {GC_GBNF, "root ::= root \"a\" | \"b\"", KS_ERR_INVAL, "left recursion", NULL},
        {GC_GBNF, "root ::= e x\ne ::= \"\" | \"q\"\nx ::= root \"y\" | \"z\"", KS_ERR_INVAL,
         "left recursion", NULL},
        {GC_GBNF, "root ::= (\"a\"?)* root \"x\" | \"y\"", KS_ERR_INVAL, "left recursion",
         NULL}, // the star is nullable
        {GC_GBNF, "root ::= x \"a\"\nx ::= \"\" | root", KS_ERR_INVAL, "left recursion",
         NULL}, // through a tail edge too
        // bounds
        {GC_GBNF, "root ::= \"a\"{1001}", KS_ERR_NOSPACE, "repetition count above 1000", NULL},
    };
    run_fails(cases, sizeof cases / sizeof cases[0]);
    const char *m;
    {
        // a repetition of something nullable is fine: it never grows a stack
        grammar *g = gparse("root ::= (\"a\"?)* \"b\" (\" \"?)*");
        FULL(g, "aab  ");
        FULL(g, "b");
        grammar_unref(g);
    }
    {
        // 201 items of 1000 elements each
        size_t cap = 201 * 16 + 16;
        char *big = malloc(cap);
        CHECK(big);
        strcpy(big, "root ::=");
        for (int i = 0; i < 201; i++)
            strcat(big, " [a-z]{1000}");
        m = gfail(big, KS_ERR_NOSPACE);
        CHECK_STR_HAS(m, "elements");
        free(big);
    }
    {
        size_t n = GRAMMAR_MAX_TEXT + 1;
        char *big = malloc(n);
        CHECK(big);
        memset(big, ' ', n);
        ks_errbuf eb;
        grammar *g = NULL;
        CHECK_EQ(grammar_parse(big, n, &g, &eb), KS_ERR_NOSPACE);
        free(big);
    }
    {
        // groups nested deeper than the parser allows
        char buf[512] = "root ::= ";
        for (int i = 0; i < 100; i++)
            strcat(buf, "(");
        strcat(buf, "\"a\"");
        for (int i = 0; i < 100; i++)
            strcat(buf, ")");
        gfail(buf, KS_ERR_NOSPACE);
    }
}

/* Ambiguous and deep grammars stay bounded: no blow-up in time, and paths
 * past the bounds are rejected, not followed. */
static void test_bounds(void) {
    // ambiguity: every "a" can be read three ways
    grammar *g = gparse("root ::= (\"a\" | \"a\" | x)*\nx ::= \"a\" | \"a\" \"a\"");
    char s[4001];
    memset(s, 'a', 4000);
    s[4000] = 0;
    double t0 = now_s();
    FULL(g, s);
    CHECK(now_s() - t0 < 5.0);
    grammar_unref(g);
    // exponentially many nullable paths collapse in the (pos, parent) dedup
    g = gparse("root ::= e e e e e e e e e e e e e e e e e e e e e e e e e e e e e e \"z\"\n"
               "e ::= \"\" | \"\" | \"y\"?\n");
    t0 = now_s();
    FULL(g, "z");
    FULL(g, "yyyz");
    CHECK(now_s() - t0 < 1.0);
    grammar_unref(g);
    // issue 38's grammar: twelve nullable x in a row. Stacks equal in
    // structure are shared, so a long line stays 13 parses (they used to
    // be copied every byte until the 1024-stack bound refused any line of
    // 128 characters or more fed in one call)
    g = gparse("root ::= (x x x x x x x x x x x x \"\\n\")*\nx ::= [ -~]*");
    {
        grammar_matcher *m = NULL;
        ks_errbuf eb;
        CHECK_EQ(grammar_matcher_create(g, &m, &eb), KS_OK);
        char line[302];
        for (int i = 0; i < 300; i++)
            line[i] = (char)(' ' + i % 95);
        line[300] = '\n';
        line[301] = 0;
        t0 = now_s();
        for (int i = 0; i < 10; i++) // one call each: no compaction in between
            CHECK(grammar_matcher_accept(m, line, strlen(line)));
        CHECK(!grammar_matcher_ambiguous(m));
        CHECK(now_s() - t0 < 2.0);
        grammar_matcher_destroy(m);
    }
    grammar_unref(g);
    // nesting depth: past GRAMMAR_MAX_DEPTH the path dies
    g = gparse("root ::= \"(\" root \")\" | \"x\"");
    char deep[2 * 600 + 2];
    int n = 0;
    for (int i = 0; i < 100; i++)
        deep[n++] = '(';
    deep[n++] = 'x';
    for (int i = 0; i < 100; i++)
        deep[n++] = ')';
    deep[n] = 0;
    FULL(g, deep);
    n = 0;
    for (int i = 0; i < 600; i++)
        deep[n++] = '(';
    deep[n] = 0;
    NOPE(g, deep);
    grammar_unref(g);
}

/* One grammar_sample over a vocabulary of pieces (greedy on flat logits):
 * returns its error, *end, and the message in eb. */
static ks_err sample_once(const char *gb, const char *const *pieces, int32_t n, bool *end,
                          ks_errbuf *eb) {
    uint32_t lens[16];
    CHECK(n <= 16);
    for (int32_t i = 0; i < n; i++)
        lens[i] = (uint32_t)strlen(pieces[i]);
    grammar_vocab *gv = NULL;
    CHECK_EQ(grammar_vocab_create_pieces(pieces, lens, n, &gv, eb), KS_OK);
    grammar *g = gparse(gb);
    grammar_matcher *m = NULL;
    CHECK_EQ(grammar_matcher_create(g, &m, eb), KS_OK);
    sample_params sp;
    sample_params_default(&sp);
    sp.temperature = 0.0f;
    sampler *smp = NULL;
    CHECK_EQ(sampler_create(&sp, n, &smp, eb), KS_OK);
    float logits[16] = {0};
    uint32_t mask[1];
    sample_result sr;
    ks_errbuf_clear(eb);
    *end = false;
    ks_err e = grammar_sample(m, gv, smp, &sp, logits, mask, &sr, end, eb);
    sampler_destroy(smp);
    grammar_matcher_destroy(m);
    grammar_unref(g);
    grammar_vocab_destroy(gv);
    return e;
}

/* Issue 38 item 6: grammars no token can satisfy, or that the matcher can
 * only satisfy by dropping every parse, are refusals (400), never a 500 or
 * a silent empty answer; a grammar in which one character opens more
 * parses than the bounds allow is refused at compile time. */
static void test_refusals(void) {
    ks_errbuf eb;
    bool end = false;
    // no piece holds the character the grammar needs: a refusal (reason
    // INVALID, so the server answers 400), not an internal error
    static const char *const abc[] = {"a", "b", "ab", "c"};
    CHECK_EQ(sample_once("root ::= \"z\"", abc, 4, &end, &eb), KS_ERR_INVAL);
    CHECK_EQ(eb.reason, ADMIT_INVALID);
    CHECK(strstr(eb.msg, "no token"));
    // each 'a' opens two parses that differ below (r's "b" or "c" to
    // come): twelve in one piece pass 1024 stacks. The start is complete
    // (r is nullable), and every piece drops every parse: that used to end
    // the output with no token (an empty 200); it is a clear error now
    static const char *const longs[] = {"aaaaaaaaaaaaa", "aaaaaaaaaaaaaa", "aaaaaaaaaaaaaaa"};
    const char *amb = "root ::= r\nr ::= [a-z] r \"b\" | [a-z] r \"c\" | \"\"";
    CHECK_EQ(sample_once(amb, longs, 3, &end, &eb), KS_ERR_INVAL);
    CHECK(!end);
    CHECK_EQ(eb.reason, ADMIT_INVALID);
    CHECK(strstr(eb.msg, "too ambiguous"));
    static const char *const shorts[] = {"a", "aa", "b"};
    CHECK_EQ(sample_once(amb, shorts, 3, &end, &eb), KS_OK); // within the bounds: fine
    // the same text compiles to a grammar of its own: classes (and so first-mask
    // timing) are never shared between requests, so not between tenants (I7)
    grammar *g1 = gparse("root ::= [a-z]+ \"!\""), *g2 = gparse("root ::= [a-z]+ \"!\"");
    CHECK(g1 != g2);
    grammar_unref(g1);
    grammar_unref(g2);
    // compile time: after "x", one character opens 1100 parses
    char *big = malloc(64 + 1100 * 16);
    int n = sprintf(big, "root ::= \"x\" big | \"\"\nbig ::= ");
    for (int i = 0; i < 1100; i++)
        n += sprintf(big + n, "%s\"%c\" r%d", i ? " | " : "", 'a' + i % 26, i % 7);
    for (int i = 0; i < 7; i++)
        n += sprintf(big + n, "\nr%d ::= \"%d\"", i, i);
    grammar *g = NULL;
    CHECK_EQ(grammar_parse(big, (size_t)n, &g, &eb), KS_ERR_INVAL);
    CHECK(strstr(eb.msg, "too ambiguous"));
    CHECK(strstr(eb.msg, "'root'"));
    free(big);
}

/* Matchers of one grammar on several threads at once (grammar.h: a
 * grammar and a vocabulary are shared, a matcher is its thread's): each
 * thread's masks along a text equal one thread's alone, while the
 * grammar's classes and shared masks fill in under them. */
#define MT_THREADS 4
#define MT_VOCAB 3000
typedef struct mt_arg {
    grammar *g;
    const grammar_vocab *gv;
    const char *text;
    uint64_t sum; // a digest of every mask
    bool ok;
} mt_arg;

static void *mt_run(void *p) {
    mt_arg *a = p;
    ks_errbuf eb;
    grammar_matcher *m = NULL;
    a->ok = grammar_matcher_create(a->g, &m, &eb) == KS_OK;
    uint32_t bits[(MT_VOCAB + 31) / 32];
    for (size_t i = 0; a->ok && a->text[i]; i++) {
        int32_t n = 0;
        a->ok = grammar_matcher_mask(m, a->gv, bits, &n) == KS_OK &&
                grammar_matcher_accept(m, a->text + i, 1);
        for (int w = 0; w < (MT_VOCAB + 31) / 32; w++)
            a->sum = (a->sum ^ bits[w]) * 0x100000001B3ull;
    }
    grammar_matcher_destroy(m);
    return NULL;
}

static void test_threads(void) {
    // a vocabulary of pieces: every printable byte, then short strings
    static char store[MT_VOCAB][8];
    const char *pieces[MT_VOCAB];
    uint32_t lens[MT_VOCAB];
    static const char alpha[] = "abc \"{}[],:0123456789xyz\\n";
    uint64_t r = 1;
    for (int i = 0; i < MT_VOCAB; i++) {
        int n = i < 95 ? 1 : 2 + (int)(r >> 60) % 5;
        for (int j = 0; j < n; j++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            store[i][j] = i < 95 ? (char)(' ' + i) : alpha[(r >> 33) % (sizeof alpha - 1)];
        }
        pieces[i] = store[i];
        lens[i] = (uint32_t)n;
    }
    ks_errbuf eb;
    grammar_vocab *gv = NULL;
    CHECK_EQ(grammar_vocab_create_pieces(pieces, lens, MT_VOCAB, &gv, &eb), KS_OK);
    json_t *sc = json_loads("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},"
                            "\"b\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}}",
                            0, NULL);
    char *gb = NULL;
    CHECK_EQ(grammar_schema_gbnf(sc, "", &gb, &eb), KS_OK);
    json_decref(sc);
    const char *text = "{\"a\": \"xy \\\"z\\\" abc\", \"b\": [1, 23, 456]}";
    // alone, on a grammar of its own
    char *gb1 = malloc(strlen(gb) + 16);
    sprintf(gb1, "%s\n# alone\n", gb);
    mt_arg ref = {.g = gparse(gb1), .gv = gv, .text = text};
    mt_run(&ref);
    CHECK(ref.ok);
    grammar *g = gparse(gb);
    pthread_t th[MT_THREADS];
    mt_arg args[MT_THREADS];
    for (int i = 0; i < MT_THREADS; i++) {
        args[i] = (mt_arg){.g = g, .gv = gv, .text = text};
        CHECK_EQ(pthread_create(&th[i], NULL, mt_run, &args[i]), 0);
    }
    for (int i = 0; i < MT_THREADS; i++) {
        CHECK_EQ(pthread_join(th[i], NULL), 0);
        CHECK(args[i].ok);
        CHECK_EQ(args[i].sum, ref.sum);
    }
    grammar_unref(g);
    grammar_unref(ref.g);
    grammar_vocab_destroy(gv);
    free(gb1);
    free(gb);
}

static void test_matcher_api(void) {
    grammar *g = gparse("root ::= \"h\\u00e9\" \"!\"?");
    grammar_matcher *m = NULL;
    ks_errbuf eb;
    CHECK_EQ(grammar_matcher_create(g, &m, &eb), KS_OK);
    grammar_unref(g); // the matcher holds its own reference
    CHECK(!grammar_matcher_complete(m));
    CHECK(grammar_matcher_accept(m, "h\xc3", 2)); // a character split over two calls
    CHECK(!grammar_matcher_complete(m));
    CHECK(!grammar_matcher_accept(m, "\xc3", 1)); // not a continuation byte: refused...
    CHECK(grammar_matcher_accept(m, "\xa9", 1));  // ...and the state is as before
    CHECK(grammar_matcher_complete(m));
    CHECK(!grammar_matcher_done(m)); // "!" may follow
    CHECK(!grammar_matcher_accept(m, "?", 1));
    CHECK(grammar_matcher_accept(m, "!", 1));
    CHECK(grammar_matcher_done(m));
    grammar_matcher_destroy(m);
    grammar_matcher_destroy(NULL);
    grammar_unref(NULL);
}

// ----------------------------------------------------------------------------
// JSON schema

static void test_schema(void) {
    static const gcase cases[] = {
        T_SCHEMA("{\"type\":\"object\"}"), // any object
        T_FULL("{}"),
        T_FULL("{\"a\": [1, 2.5e3, \"x\", true, null, {\"b\": {}}]}"),
        T_FULL("{\n  \"a\": -0.5\n}"),
        T_NOPE("[]"),
        T_NOPE("{\"a\":01}"),
        T_NOPE("{\"a\":1,}"),
        T_NOPE("{\"a\":\"\x01\"}"),            // a raw control character
        T_NOPE("{   \"a\":1}"),                // at most one space of whitespace in a row...
        T_FULL("{\n                \"a\":1}"), // ...or a newline and up to 16 spaces
        T_NOPE("{\n                 \"a\":1}"),

        T_SCHEMA("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                 "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
                 "{\"type\":\"string\"}}},\"required\":[\"name\",\"tags\"],"
                 "\"additionalProperties\":false}"),
        T_FULL("{\"name\":\"a\",\"age\":3,\"tags\":[]}"),
        T_FULL("{\"name\":\"a\",\"tags\":[\"x\",\"y\"]}"), // optional age left out
        T_NOPE("{\"name\":\"a\"}"),                        // tags is required...
        T_PART("{\"name\":\"a\""),
        T_NOPE("{\"age\":3,\"name\":\"a\",\"tags\":[]}"),   // the schema's order
        T_NOPE("{\"name\":\"a\",\"age\":3.5,\"tags\":[]}"), // integer
        T_NOPE("{\"name\":\"a\",\"tags\":[],\"x\":1}"),     // no additional properties

        // only optional properties: any subset in order, commas right
        T_SCHEMA("{\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"boolean\"},"
                 "\"c\":{\"const\":7}}}"),
        T_FULL("{}"),
        T_FULL("{\"b\":true}"),
        T_FULL("{\"a\":null,\"c\":7}"),
        T_FULL("{\"a\":null,\"b\":false,\"c\":7}"),
        T_NOPE("{,\"b\":true}"),
        T_NOPE("{\"c\":8}"),

        T_SCHEMA("{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2,"
                 "\"maxItems\":3}"),
        T_NOPE("[1]"),
        T_FULL("[1,2]"),
        T_FULL("[1, -2.5, 3e10]"),
        T_NOPE("[1,2,3,4]"),

        T_SCHEMA("{\"enum\":[\"red\",\"green\",42,null,{\"k\":[1]}]}"),
        T_FULL("\"red\""),
        T_FULL("42"),
        T_FULL("null"),
        T_FULL("{\"k\":[1]}"),
        T_NOPE("\"blue\""),

        T_SCHEMA("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":2}]}"),
        T_FULL("12"),
        T_FULL("\"ab\""),
        T_NOPE("\"abc\""),
        T_NOPE("1.5"),
        T_SCHEMA("{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}"),
        T_FULL("false"),
        T_FULL("null"),
        T_SCHEMA("{\"type\":[\"string\",\"null\"],\"minLength\":1}"),
        T_FULL("null"),
        T_FULL("\"x\""),
        T_NOPE("\"\""),

        T_SCHEMA("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}"),
        T_NOPE("\"a\""),
        T_FULL("\"ab\""),
        T_FULL("\"\\n\xc3\xa9\""), // an escape and a 2-byte character count as one each
        T_NOPE("\"abcd\""),

        T_SCHEMA("{\"type\":\"string\",\"format\":\"date\"}"),
        T_FULL("\"2024-02-29\""),
        T_NOPE("\"2024-13-01\""),
        T_NOPE("\"24-01-01\""),
        T_SCHEMA("{\"type\":\"string\",\"format\":\"time\"}"),
        T_FULL("\"23:59:59Z\""),
        T_FULL("\"01:02:03.123+05:30\""),
        T_NOPE("\"24:00:00Z\""),
        T_SCHEMA("{\"type\":\"string\",\"format\":\"date-time\"}"),
        T_FULL("\"2024-01-31T12:00:00Z\""),
        T_NOPE("\"2024-01-31 12:00:00Z\""),
        T_SCHEMA("{\"type\":\"string\",\"format\":\"uuid\"}"),
        T_FULL("\"123e4567-e89b-12d3-a456-426614174000\""),
        T_NOPE("\"123e4567e89b-12d3-a456-426614174000\""),

        // $ref / $defs, recursion through a ref, nested required fields
        T_SCHEMA(
            "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
            "\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
            "\"required\":[\"v\",\"kids\"]}},\"$ref\":\"#/$defs/node\"}"),
        T_FULL("{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}"
               "]}"),
        T_NOPE("{\"v\":1,\"kids\":[{\"v\":2}]}"),
        T_SCHEMA(
            "{\"definitions\":{\"a~b/c\":{\"type\":\"boolean\"}},\"type\":\"object\","
            "\"properties\":{\"x\":{\"$ref\":\"#/definitions/a~0b~1c\",\"description\":\"d\"}},"
            "\"required\":[\"x\"]}"),
        T_FULL("{\"x\":true}"),
        T_SCHEMA("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}"),
        T_FULL("{\"a\":1,\"b\":2}"),
        T_NOPE("{\"a\":\"x\"}"),
        T_SCHEMA("true"),
        T_FULL("[1,{}]"),
        T_SCHEMA("{\"title\":\"anything\",\"description\":\"x\"}"),
        T_FULL("\"s\""),
        T_SCHEMA("{\"type\":\"object\",\"properties\":{\"k\\\"q\":{\"type\":\"integer\"}},"
                 "\"required\":[\"k\\\"q\"]}"), // a key that needs escaping
        T_FULL("{\"k\\\"q\":1}"),
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);

    // refused, by keyword and path
    static const fcase refused[] = {
        {GC_SCHEMA, "{\"type\":\"object\",\"patternProperties\":{\"^a\":{}}}", KS_ERR_UNSUPPORTED,
         "'patternProperties'", NULL},
        {GC_SCHEMA,
         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"multipleOf\":2}}}",
         KS_ERR_UNSUPPORTED, "/properties/a", "'multipleOf'"},
        {GC_SCHEMA, "{\"type\":\"string\",\"format\":\"uri\"}", KS_ERR_UNSUPPORTED, "uri", NULL},
        {GC_SCHEMA, "{\"type\":\"array\",\"items\":[{}]}", KS_ERR_UNSUPPORTED, NULL, NULL},
        {GC_SCHEMA, "{\"allOf\":[{},{}]}", KS_ERR_UNSUPPORTED, NULL, NULL},
        {GC_SCHEMA, "{\"$ref\":\"http://x/y\"}", KS_ERR_UNSUPPORTED, NULL, NULL},
        {GC_SCHEMA, "{\"$ref\":\"#/$defs/missing\"}", KS_ERR_INVAL, "does not resolve", NULL},
        {GC_SCHEMA, "{\"type\":\"string\",\"maxLength\":5000}", KS_ERR_UNSUPPORTED, "maxLength",
         NULL},
        {GC_SCHEMA, "{\"type\":\"frob\"}", KS_ERR_INVAL, NULL, NULL},
        {GC_SCHEMA, "{\"type\":\"object\",\"required\":[\"a\"]}", KS_ERR_UNSUPPORTED, NULL, NULL},
        {GC_SCHEMA, "{\"enum\":[]}", KS_ERR_INVAL, NULL, NULL},
        {GC_SCHEMA, "{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", KS_ERR_INVAL, NULL, NULL},
        {GC_SCHEMA, "{\"type\":\"array\",\"uniqueItems\":true}", KS_ERR_UNSUPPORTED, "uniqueItems",
         NULL},
        {GC_SCHEMA, "{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}}}",
         KS_ERR_INVAL, "matches nothing", NULL}, // a ref cycle that consumes nothing
        {GC_GBNF, "root ::= a\na ::= root", KS_ERR_INVAL, "matches nothing", NULL},
    };
    run_fails(refused, sizeof refused / sizeof refused[0]);
    {
        // nesting past the bound
        char buf[8192] = "";
        for (int i = 0; i < 80; i++)
            strcat(buf, "{\"type\":\"array\",\"items\":");
        strcat(buf, "{}");
        for (int i = 0; i < 80; i++)
            strcat(buf, "}");
        gschema_fail(buf, KS_ERR_NOSPACE);
    }
    // prefixes make grammars that can be combined
    {
        json_t *s = json_loads("{\"type\":\"integer\"}", 0, NULL);
        char *a = NULL, *b = NULL, *c = NULL;
        ks_errbuf eb;
        CHECK_EQ(grammar_schema_gbnf(s, "x-", &a, &eb), KS_OK);
        CHECK_EQ(grammar_schema_gbnf(s, "y-", &b, &eb), KS_OK);
        CHECK_EQ(grammar_schema_gbnf(s, "bad prefix", &c, &eb), KS_ERR_INVAL);
        CHECK(!c);
        size_t n = strlen(a) + strlen(b) + 64;
        char *t = malloc(n);
        snprintf(t, n, "root ::= x-root \" \" y-root\n%s%s", a, b);
        grammar *g2 = gparse(t);
        FULL(g2, "1 -2");
        grammar_unref(g2);
        free(t);
        free(a);
        free(b);
        json_decref(s);
    }
}

// ----------------------------------------------------------------------------
// JSON schema: pattern, numeric bounds, formats

/* The grammar of {"type":"string","pattern":re} (re as plain C text). */
static grammar *gpattern(const char *re) {
    json_t *s = json_pack("{s:s,s:s}", "type", "string", "pattern", re);
    CHECK(s);
    ks_errbuf eb;
    ks_errbuf_clear(&eb);
    grammar *g = NULL;
    ks_err e = grammar_from_schema(s, &g, &eb);
    if (e) fprintf(stderr, "pattern '%s': %s\n", re, eb.msg);
    CHECK_EQ(e, KS_OK);
    json_decref(s);
    return g;
}

/* gmatch of the JSON string that encodes v (jansson's escapes). */
static int gmatch_str(grammar *g, const char *v) {
    json_t *j = json_string(v);
    CHECK(j);
    char *t = json_dumps(j, JSON_ENCODE_ANY);
    CHECK(t);
    int r = gmatch(g, t);
    free(t);
    json_decref(j);
    return r;
}

/* Every value in yes matches the pattern as a whole string, none in no. */
static void check_pattern(const char *re, const char *const *yes, const char *const *no) {
    grammar *g = gpattern(re);
    for (; yes && *yes; yes++) {
        if (gmatch_str(g, *yes) != 2) fprintf(stderr, "pattern '%s': '%s' refused\n", re, *yes);
        CHECK_EQ(gmatch_str(g, *yes), 2);
    }
    for (; no && *no; no++) {
        if (gmatch_str(g, *no) == 2) fprintf(stderr, "pattern '%s': '%s' accepted\n", re, *no);
        CHECK(gmatch_str(g, *no) != 2);
    }
    grammar_unref(g);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The refusal of pattern re: code want, message with has and has2. */
static void check_pattern_fail(const char *re, ks_err want, const char *has, const char *has2) {
    json_t *s = json_pack("{s:s,s:s}", "type", "string", "pattern", re);
    CHECK(s);
    char *t = json_dumps(s, JSON_COMPACT);
    const char *m = gschema_fail(t, want);
    if (has) CHECK_STR_HAS(m, has);
    if (has2) CHECK_STR_HAS(m, has2);
    free(t);
    json_decref(s);
}

static void test_schema_pattern(void) {
    // literals and escapes
    check_pattern("^a\\.b$", L("a.b"), L("axb", "a.bc", ""));
    check_pattern("^\\d{3}-\\d{4}$", L("555-1234", "000-0000"),
                  L("55-1234", "555-12345", "5a5-1234"));
    check_pattern("\\w+", L("a_Z9", "_"), L("", "a-1", "\xc3\xa9"));
    check_pattern("^\\s\\S\\D\\W$", L(" x_-", "\tA .", "\xe3\x80\x80yz!"),
                  L("xx_-", " x1-", " x_a"));
    check_pattern("^a\\/b\\\\c\\-\\(\\)\\[\\]\\{\\}\\*\\+\\?\\|\\^\\$$", L("a/b\\c-()[]{}*+?|^$"),
                  L("a/bc-()[]{}*+?|^$"));
    check_pattern("^\\u00e9\\x41\\u{1F600}\\uD83D\\uDE00\\t\\n$",
                  L("\xc3\xa9"
                    "A\xf0\x9f\x98\x80\xf0\x9f\x98\x80\t\n"),
                  L("eA"));
    // '.' is any character but a line terminator; what JSON escapes is escaped
    check_pattern("^.$", L("x", "\"", "\\", "\x01", "\x1f", "\t", "\xe2\x82\xac"),
                  L("\n", "\r", "\xe2\x80\xa8", "", "xy"));
    // classes: ranges, negation, escapes inside, '-' at the ends, \b is backspace
    check_pattern("^[a-c1-3_]+$", L("a1_", "cc33"), L("d", "4", "a-"));
    check_pattern("^[^a-z\"]$", L("A", "\\", "\n", "\x7f"), L("a", "q", "\""));
    check_pattern("^[-\\d\\s.\\]]*$", L("-1 .]", ""), L("a", "["));
    check_pattern("^[\\b]$", L("\b"), L("b"));
    check_pattern("^[^]$", L("\n", "x"), L(""));
    // groups, alternation, quantifiers
    check_pattern("^(ab|cd)+$", L("ab", "abcd", "cdcdab"), L("", "abc", "ac"));
    check_pattern("^(?:x|y)(?<n>z)?|w$", L("x", "yz", "w"), L("xw", "z", ""));
    check_pattern("^a{2}b{2,}c{2,3}d?e*$", L("aabbcc", "aabbbbccc", "aabbccdeee"),
                  L("abbcc", "aabcc", "aabbc", "aabbcccc", "aabbccdd"));
    check_pattern("^(a|)$", L("a", ""), L("aa"));
    // unanchored: the whole string must match all the same
    check_pattern("abc", L("abc"), L("xabc", "abcx"));
    check_pattern("^ab", L("ab"), L("abc"));
    // quotes in the pattern come out escaped
    check_pattern("^\"[a-z]\"$", L("\"q\""), L("q"));
    {
        grammar *g = gpattern("^.$");
        NOPE(g, "\"\"\"");   // a raw quote would end the string
        NOPE(g, "\"\x01\""); // a raw control character is not JSON
        FULL(g, "\"\\u001f\"");
        FULL(g, "\"\\u001F\"");
        grammar_unref(g);
    }
    // outside the subset: refused, the construct and its offset named
    check_pattern_fail("(?=a)b", KS_ERR_UNSUPPORTED, "lookahead", "offset 0");
    check_pattern_fail("a(?!b)", KS_ERR_UNSUPPORTED, "lookahead", "offset 1");
    check_pattern_fail("a(?<=b)", KS_ERR_UNSUPPORTED, "lookbehind", "offset 1");
    check_pattern_fail("(a)\\1", KS_ERR_UNSUPPORTED, "backreference", "offset 3");
    check_pattern_fail("(?<x>a)\\k<x>", KS_ERR_UNSUPPORTED, "named backreference", "offset 7");
    check_pattern_fail("ab*?", KS_ERR_UNSUPPORTED, "lazy quantifier", "offset 3");
    check_pattern_fail("a{2,3}?", KS_ERR_UNSUPPORTED, "lazy quantifier", "offset 6");
    check_pattern_fail("a++", KS_ERR_UNSUPPORTED, "quantifier after a quantifier", "offset 2");
    check_pattern_fail("\\bfoo", KS_ERR_UNSUPPORTED, "word boundary", "offset 0");
    check_pattern_fail("a^b", KS_ERR_UNSUPPORTED, "anchor '^'", "offset 1");
    check_pattern_fail("a$b", KS_ERR_UNSUPPORTED, "anchor '$'", "offset 1");
    check_pattern_fail("x\\p{L}", KS_ERR_UNSUPPORTED, "Unicode property", "offset 1");
    check_pattern_fail("(?i)a", KS_ERR_UNSUPPORTED, "group modifier", "offset 0");
    check_pattern_fail("a[]", KS_ERR_UNSUPPORTED, "empty class", "offset 1");
    check_pattern_fail("a{1001}", KS_ERR_UNSUPPORTED, "above 1000", "offset 1");
    check_pattern_fail("\\cA", KS_ERR_UNSUPPORTED, "control escape", "offset 0");
    check_pattern_fail("\\012", KS_ERR_UNSUPPORTED, "octal", "offset 0");
    check_pattern_fail("\\uD800", KS_ERR_UNSUPPORTED, "lone surrogate", "offset 0");
    // malformed
    check_pattern_fail("(a", KS_ERR_INVAL, "unclosed '('", "offset 0");
    check_pattern_fail("a)", KS_ERR_INVAL, "unmatched ')'", "offset 1");
    check_pattern_fail("[a", KS_ERR_INVAL, "unterminated '['", "offset 0");
    check_pattern_fail("*a", KS_ERR_INVAL, "nothing to repeat", "offset 0");
    check_pattern_fail("x[z-a]", KS_ERR_INVAL, "out of order", "offset 2");
    check_pattern_fail("a{3,2}", KS_ERR_INVAL, "below n", "offset 1");
    check_pattern_fail("\\q", KS_ERR_INVAL, "unknown escape", "offset 0");
    gschema_fail("{\"type\":\"string\",\"pattern\":\"^a$\",\"maxLength\":3}", KS_ERR_UNSUPPORTED);
    gschema_fail("{\"type\":\"string\",\"pattern\":\"^a$\",\"format\":\"date\"}",
                 KS_ERR_UNSUPPORTED);
    gschema_fail("{\"type\":\"string\",\"pattern\":1}", KS_ERR_INVAL);
    // the path of a nested pattern is named
    CHECK_STR_HAS(
        gschema_fail("{\"properties\":{\"a\":{\"pattern\":\"(?=x)\"}}}", KS_ERR_UNSUPPORTED),
        "/properties/a: pattern: a lookahead at offset 0");
}

/* Every integer of [from, to] matches the schema iff lo <= v <= hi. */
static void check_int_sweep(grammar *g, const char *src, long long lo, long long hi, long long from,
                            long long to) {
    for (long long v = from; v <= to; v++) {
        char t[32];
        snprintf(t, sizeof t, "%lld", v);
        int want = v >= lo && v <= hi ? 2 : 0, got = gmatch(g, t) == 2 ? 2 : 0;
        if (got != want) fprintf(stderr, "schema %s on %s: %d, want %d\n", src, t, got, want);
        CHECK_EQ(got, want);
    }
}

static void test_schema_bounds(void) {
    // integers: every integer in range and no other, swept around every bound
    static const struct {
        const char *schema;
        long long lo, hi;
    } ranges[] = {
        {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":100}", 0, 100},
        {"{\"type\":\"integer\",\"minimum\":-15,\"maximum\":7}", -15, 7},
        {"{\"type\":\"integer\",\"minimum\":-1234,\"maximum\":-99}", -1234, -99},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":5}", 5, 5},
        {"{\"type\":\"integer\",\"minimum\":7,\"maximum\":1234}", 7, 1234},
        {"{\"type\":\"integer\",\"minimum\":190,\"maximum\":2099}", 190, 2099},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}", 1, 9},
        {"{\"type\":\"integer\",\"minimum\":-3,\"exclusiveMinimum\":-1,\"maximum\":3,"
         "\"exclusiveMaximum\":8}",
         0, 3}, // the tighter of two
        {"{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":true,\"maximum\":10,"
         "\"exclusiveMaximum\":true}",
         1, 9}, // draft 4's boolean form
        {"{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":false,\"maximum\":10}", 0, 10},
        {"{\"type\":\"integer\",\"minimum\":1.5,\"maximum\":4.5}", 2, 4},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":-2.5,\"exclusiveMaximum\":-1.0}", -2, -2},
        {"{\"minimum\":-1,\"maximum\":1,\"type\":[\"integer\",\"null\"]}", -1, 1},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
        grammar *g = gschema(ranges[i].schema);
        check_int_sweep(g, ranges[i].schema, ranges[i].lo, ranges[i].hi, ranges[i].lo - 150,
                        ranges[i].hi + 150);
        NOPE(g, "-0");
        NOPE(g, "+1");
        grammar_unref(g);
    }
    // large bounds: around each bound and each power of ten between
    {
        const char *sc = "{\"type\":\"integer\",\"minimum\":-98765432109,\"maximum\":"
                         "123456789012345678}";
        grammar *g = gschema(sc);
        check_int_sweep(g, sc, -98765432109LL, 123456789012345678LL, -98765432109LL - 20,
                        -98765432109LL + 20);
        check_int_sweep(g, sc, -98765432109LL, 123456789012345678LL, 123456789012345678LL - 20,
                        123456789012345678LL + 20);
        long long p = 1;
        for (int d = 0; d < 18; d++, p *= 10) {
            check_int_sweep(g, sc, -98765432109LL, 123456789012345678LL, p - 2, p + 2);
            if (p < 98765432109LL)
                check_int_sweep(g, sc, -98765432109LL, 123456789012345678LL, -p - 2, -p + 2);
        }
        grammar_unref(g);
    }
    // one side open: 16 digits, as for every integer
    {
        grammar *g = gschema("{\"type\":\"integer\",\"minimum\":10}");
        check_int_sweep(g, "minimum 10", 10, 1000000, -30, 200);
        FULL(g, "9999999999999999");
        NOPE(g, "10000000000000000");
        grammar_unref(g);
        g = gschema("{\"type\":\"integer\",\"exclusiveMaximum\":-5}");
        check_int_sweep(g, "exclusiveMaximum -5", -1000000, -6, -200, 30);
        FULL(g, "-9999999999999999");
        grammar_unref(g);
    }
    static const gcase cases[] = {
        // numbers: integers in range, and fractions whose unit interval is
        T_SCHEMA("{\"type\":\"number\",\"minimum\":0,\"maximum\":10}"),
        T_FULL("0"),
        T_FULL("10"),
        T_FULL("9.5"),
        T_FULL("0.25"),
        T_FULL("0.000001"),
        T_NOPE("10.5"),
        T_NOPE("11"),
        T_NOPE("-0.5"),
        T_NOPE("-1"),
        T_NOPE("1e1"), // no exponent under bounds
        T_PART("5.0"), // a fraction's last digit is not 0 (5 is emitted as 5)
        T_NOPE("-0"),
        T_SCHEMA("{\"type\":\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":3}"),
        T_FULL("-2"),
        T_FULL("2"),
        T_FULL("2.999"),
        T_FULL("-1.5"),
        T_FULL("-0.5"),
        T_NOPE("3"),
        T_NOPE("3.5"),
        T_NOPE("-3"),
        T_NOPE("-2.1"), // valid, but in the unit interval of a fractional bound: not generated
        T_SCHEMA("{\"type\":\"number\",\"exclusiveMinimum\":0}"),
        T_FULL("0.5"),
        T_FULL("1"),
        T_PART("0"), // only as the start of 0.x
        T_NOPE("-0.5"),
        T_SCHEMA("{\"type\":\"number\",\"maximum\":-1}"),
        T_FULL("-1"),
        T_FULL("-1.5"),
        T_FULL("-123"),
        T_NOPE("-0.5"),
        T_NOPE("0"),
        T_SCHEMA("{\"maximum\":1}"), // no type: a number
        T_FULL("0.5"),
        T_NOPE("\"x\""),
        T_SCHEMA("{\"type\":\"string\",\"minimum\":3}"), // a string: the bound is a no-op
        T_FULL("\"x\""),
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    static const fcase refused[] = {
        {GC_SCHEMA, "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", KS_ERR_INVAL,
         "no integer lies within the bounds", NULL},
        {GC_SCHEMA, "{\"type\":\"integer\",\"exclusiveMinimum\":4,\"exclusiveMaximum\":5}",
         KS_ERR_INVAL, "no integer", NULL},
        {GC_SCHEMA, "{\"type\":\"number\",\"minimum\":0.2,\"maximum\":0.7}", KS_ERR_UNSUPPORTED,
         "whole unit interval", NULL},
        {GC_SCHEMA, "{\"type\":\"integer\",\"minimum\":\"1\"}", KS_ERR_INVAL,
         "'minimum' must be a number", NULL},
        {GC_SCHEMA, "{\"type\":\"integer\",\"minimum\":true}", KS_ERR_INVAL,
         "'minimum' must be a number", NULL},
        {GC_SCHEMA, "{\"type\":\"integer\",\"exclusiveMinimum\":true}", KS_ERR_INVAL,
         "'exclusiveMinimum': true needs 'minimum'", NULL},
        {GC_SCHEMA, "{\"type\":\"number\",\"maximum\":1e20}", KS_ERR_UNSUPPORTED, "10^15", NULL},
        {GC_SCHEMA, "{\"type\":\"integer\",\"maximum\":2000000000000000000}", KS_ERR_UNSUPPORTED,
         "10^18", NULL},
        {GC_SCHEMA, "{\"properties\":{\"n\":{\"type\":\"integer\",\"multipleOf\":2}}}",
         KS_ERR_UNSUPPORTED, "/properties/n", "'multipleOf'"},
    };
    run_fails(refused, sizeof refused / sizeof refused[0]);
}

static void test_schema_formats(void) {
    static const gcase cases[] = {
        T_SCHEMA("{\"type\":\"string\",\"format\":\"date\"}"),
        T_FULL("\"2024-02-29\""),
        T_FULL("\"2000-02-29\""),
        T_FULL("\"0400-02-29\""),
        T_FULL("\"2023-02-28\""),
        T_FULL("\"2023-04-30\""),
        T_FULL("\"2023-12-31\""),
        T_FULL("\"2023-01-01\""),
        T_NOPE("\"2023-02-29\""), // not a leap year
        T_NOPE("\"1900-02-29\""), // a century not divisible by 400
        T_NOPE("\"2024-02-30\""),
        T_NOPE("\"2023-04-31\""),
        T_NOPE("\"2023-11-31\""),
        T_NOPE("\"2023-00-10\""),
        T_NOPE("\"2023-01-00\""),
        T_NOPE("\"2023-01-32\""),
        T_SCHEMA("{\"type\":\"string\",\"format\":\"date-time\"}"),
        T_FULL("\"2024-02-29T23:59:59.123456-08:00\""),
        T_NOPE("\"2023-02-29T00:00:00Z\""),
        T_NOPE("\"2024-01-01T00:00:60Z\""),
        T_NOPE("\"2024-01-01T00:00:00\""), // an offset is required
        T_SCHEMA("{\"type\":\"string\",\"format\":\"email\"}"),
        T_FULL("\"a.b+c@example.com\""),
        T_FULL("\"x_y!#$%&'*.+/=?^`{|}~-@mail-1.sub.example.org\""),
        T_FULL("\"abcdefghijklmno.b.c.d@a.b.c.d.io\""),
        T_NOPE("\"abcdefghijklmnop@x.com\""), // an atom of 16 (the local part stays <= 64)
        T_NOPE("\"a.b.c.d.e@x.com\""),
        T_NOPE("\"a@a.b.c.d.e.io\""),
        T_NOPE("\".a@example.com\""),
        T_NOPE("\"a.@example.com\""),
        T_NOPE("\"a..b@example.com\""),
        T_NOPE("\"a@com\""),
        T_NOPE("\"a@-x.com\""),
        T_NOPE("\"a@x-.com\""),
        T_NOPE("\"a@x.c0m\""),
        T_NOPE("\"a b@x.com\""),
        T_NOPE("\"@x.com\""),
        T_SCHEMA("{\"type\":\"string\",\"format\":\"ipv4\"}"),
        T_FULL("\"192.168.0.1\""),
        T_FULL("\"255.255.255.255\""),
        T_FULL("\"0.0.0.0\""),
        T_FULL("\"10.200.249.9\""),
        T_NOPE("\"256.1.1.1\""),
        T_NOPE("\"1.1.1.260\""),
        T_NOPE("\"01.1.1.1\""),
        T_NOPE("\"1.1.1\""),
        T_NOPE("\"1.1.1.1.1\""),
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    CHECK_STR_HAS(gschema_fail("{\"type\":\"string\",\"format\":\"hostname\"}", KS_ERR_UNSUPPORTED),
                  "format 'hostname' is not supported");
}

// ----------------------------------------------------------------------------
// Token masks against brute force on real vocabularies

static tok_vocab *load_vocab(const char *path) {
    gguf_file *f = NULL;
    ks_errbuf eb;
    if (gguf_open(path, &f, &eb) != KS_OK) return NULL;
    tok_vocab *v = NULL;
    ks_err e = tok_vocab_load(f, &v, &eb);
    gguf_close(f);
    return e ? NULL : v;
}

#if defined(__SANITIZE_ADDRESS__)
/* Under ASan a fresh matcher per token of a 150k vocabulary takes most of an
 * hour: every id the mask allows is still checked, and 1 in 16 of the rest. */
#define BRUTE_STRIDE 16
#else
#define BRUTE_STRIDE 1
#endif

/* Checks a mask (bits) of grammar g (text gb) after prefix by brute force:
 * token id is allowed exactly when a fresh matcher accepts prefix + its
 * piece (an EOG token or a piece too long: never). Returns how many are. */
static int32_t check_mask_brute(const tok_vocab *v, grammar *g, const char *gb, const char *prefix,
                                const uint32_t *bits) {
    int32_t V = tok_n_vocab(v), count = 0;
    char piece[1024], text[2048];
    size_t lp = strlen(prefix);
    CHECK(lp < sizeof text - sizeof piece);
    ks_errbuf eb;
    grammar_matcher *b = NULL; // reset to the start for each id: as fresh
    CHECK_EQ(grammar_matcher_create(g, &b, &eb), KS_OK);
    for (int32_t id = 0; id < V; id++) {
        if (BRUTE_STRIDE > 1 && id % BRUTE_STRIDE && !((bits[id >> 5] >> (id & 31)) & 1u))
            continue; // (sanitizer builds) a refused id left out: it counts as refused
        size_t n = tok_piece(v, id, false, piece, sizeof piece);
        bool want = false;
        if (n > 0 && n < sizeof piece && !tok_is_eog(v, id)) {
            CHECK_EQ(grammar_matcher_reset(b), KS_OK);
            memcpy(text, prefix, lp);
            memcpy(text + lp, piece, n);
            want = grammar_matcher_accept(b, text, lp + n);
        }
        bool got = (bits[id >> 5] >> (id & 31)) & 1u;
        if (got != want)
            fprintf(stderr,
                    "mask mismatch: id %d piece '%.*s' mask %d brute %d (grammar %s, "
                    "prefix '%s')\n",
                    id, (int)n, piece, got, want, gb, prefix);
        CHECK_EQ(got, want);
        count += want;
    }
    grammar_matcher_destroy(b);
    return count;
}

/* For grammar text gb after prefix: the mask equals, for every token, a
 * fresh matcher fed prefix + the token's piece. */
static void check_mask(const tok_vocab *v, const grammar_vocab *gv, const char *gb,
                       const char *prefix) {
    grammar *g = gparse(gb);
    ks_errbuf eb;
    grammar_matcher *m = NULL;
    CHECK_EQ(grammar_matcher_create(g, &m, &eb), KS_OK);
    CHECK(grammar_matcher_accept(m, prefix, strlen(prefix)));
    int32_t V = tok_n_vocab(v);
    uint32_t *bits = calloc(((size_t)V + 31) / 32, sizeof *bits);
    int32_t n_allowed = -1;
    double t0 = now_s();
    CHECK_EQ(grammar_matcher_mask(m, gv, bits, &n_allowed), KS_OK);
    double t1 = now_s();
    // again: from the cache when the walk was expensive, identical either way
    uint32_t *bits2 = calloc(((size_t)V + 31) / 32, sizeof *bits2);
    int32_t n2 = -1;
    CHECK_EQ(grammar_matcher_mask(m, gv, bits2, &n2), KS_OK);
    double t2 = now_s();
    CHECK_EQ(n2, n_allowed);
    CHECK(!memcmp(bits, bits2, ((size_t)V + 31) / 32 * sizeof *bits));
    CHECK_EQ(check_mask_brute(v, g, gb, prefix, bits), n_allowed);
    // a token the mask allows is accepted by the matcher itself
    for (int32_t id = 0; id < V; id++)
        if ((bits[id >> 5] >> (id & 31)) & 1u) {
            CHECK(grammar_matcher_accept_token(m, gv, id));
            break;
        }
    printf("  mask (grammar of %zu bytes) after '%s': %d allowed, %.2f ms (again %.2f ms)\n",
           strlen(gb), prefix, n_allowed, (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    free(bits);
    free(bits2);
    grammar_matcher_destroy(m);
    grammar_unref(g);
}

/* One matcher fed chunk after chunk, its mask after each checked against
 * brute force on the whole prefix so far: masks cached in one context
 * (a string inside the outer object) and reused in another (a string
 * nested deeper) must still be exact. */
static void check_mask_seq(const tok_vocab *v, const grammar_vocab *gv, const char *gb,
                           const char *const *chunks, int n_chunks) {
    grammar *g = gparse(gb);
    ks_errbuf eb;
    grammar_matcher *m = NULL;
    CHECK_EQ(grammar_matcher_create(g, &m, &eb), KS_OK);
    int32_t V = tok_n_vocab(v);
    uint32_t *bits = calloc(((size_t)V + 31) / 32, sizeof *bits);
    char prefix[1024] = "";
    for (int c = 0; c < n_chunks; c++) {
        CHECK(strlen(prefix) + strlen(chunks[c]) < sizeof prefix);
        CHECK(grammar_matcher_accept(m, chunks[c], strlen(chunks[c])));
        strcat(prefix, chunks[c]);
        int32_t n_allowed = -1;
        double t0 = now_s();
        CHECK_EQ(grammar_matcher_mask(m, gv, bits, &n_allowed), KS_OK);
        double t1 = now_s();
        CHECK_EQ(check_mask_brute(v, g, gb, prefix, bits), n_allowed);
        printf("  mask sequence after '%s': %d allowed, %.2f ms\n", prefix, n_allowed,
               (t1 - t0) * 1e3);
    }
    free(bits);
    grammar_matcher_destroy(m);
    grammar_unref(g);
}

static void test_masks(const char *path) {
    tok_vocab *v = load_vocab(path);
    if (!v) {
        printf("  (%s absent: mask brute force skipped)\n", path);
        return;
    }
    printf(" vocab %s\n", path);
    grammar_vocab *gv = NULL;
    ks_errbuf eb;
    CHECK_EQ(grammar_vocab_create(v, &gv, &eb), KS_OK);
    CHECK_EQ(grammar_vocab_n(gv), tok_n_vocab(v));
    const char *json = NULL;
    {
        json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
                               "\"string\"},\"n\":{\"type\":\"integer\"}},\"required\":"
                               "[\"name\",\"n\"]}",
                               0, NULL);
        char *t = NULL;
        CHECK_EQ(grammar_schema_gbnf(s, "", &t, &eb), KS_OK);
        json_decref(s);
        json = t;
    }
    check_mask(v, gv, json, "");
    check_mask(v, gv, json, "{\"na");
    check_mask(v, gv, json, "{\"name\": \"Jo");   // inside a free string: most tokens
    check_mask(v, gv, json, "{\"name\": \"\xc3"); // inside a character
    check_mask(v, gv, json, "{\"name\":\"x\",\"n\":1");
    {
        // pattern, bounds and formats: the masks of their rules against brute force
        json_t *s = json_pack("{s:s,s:{s:{s:s,s:s},s:{s:s,s:i,s:i},s:{s:s,s:i,s:i},s:{s:s,s:s},s:{"
                              "s:s,s:s}},s:[sssss]}",
                              "type", "object", "properties", "p", "type", "string", "pattern",
                              "^[^a-c\"]{1,4}\\.(x|\\d+)$", "n", "type", "integer", "minimum", -150,
                              "maximum", 2024, "r", "type", "number", "exclusiveMinimum", -1,
                              "maximum", 9, "d", "type", "string", "format", "date", "e", "type",
                              "string", "format", "email", "required", "p", "n", "r", "d", "e");
        CHECK(s);
        char *t = NULL;
        CHECK_EQ(grammar_schema_gbnf(s, "", &t, &eb), KS_OK);
        json_decref(s);
        check_mask(v, gv, t, "{\"p\":\"");
        check_mask(v, gv, t, "{\"p\":\"\\");              // inside an escape
        check_mask(v, gv, t, "{\"p\":\"z\\\\\xc3\xa9.1"); // an escaped backslash, a raw é
        check_mask(v, gv, t, "{\"p\":\"zz.x\",\"n\":20");
        check_mask(v, gv, t, "{\"p\":\"zz.x\",\"n\":-");
        check_mask(v, gv, t, "{\"p\":\"zz.x\",\"n\":7,\"r\":-0.");
        check_mask(v, gv, t, "{\"p\":\"zz.x\",\"n\":7,\"r\":2,\"d\":\"2024-02-");
        check_mask(v, gv, t, "{\"p\":\"zz.x\",\"n\":7,\"r\":2,\"d\":\"2024-02-29\",\"e\":\"a.b@x");
        free(t);
    }
    {
        json_t *s = json_loads("{\"type\":\"object\"}", 0, NULL);
        char *t = NULL;
        CHECK_EQ(grammar_schema_gbnf(s, "", &t, &eb), KS_OK);
        json_decref(s);
        static const char *const chunks[] = {
            "{\"a\": \"x",              // a string in the outer object: walked, cached
            "y\", \"b\": [{\"c\": \"z", // a string two levels deeper: the same entry
            "\"}, 1",                   // in the array, after an element
            ", {\"d\": 2",              // a number in a nested object
            "}], \"e\": 3",             // a number in the outer object
            ", \"f\": \"",              // a string in the outer object again
        };
        check_mask_seq(v, gv, t, chunks, 6);
        free(t);
    }
    check_mask(v, gv, "root ::= [^a-z]* \"a\"", "");
    check_mask(v, gv, "root ::= \"\\u00e9t\\u00e9\" | [\\u4e00-\\u9fff]+", "");
    check_mask(v, gv, "root ::= (\" \" [a-z]+)+ \".\"", " the");
    // issue 38's grammar: every top's classes, and the lines' ends checked
    check_mask(v, gv, "root ::= (x x x x x x x x x x x x \"\\n\")*\nx ::= [ -~]*",
               "The quick brown fox\njumps");
    free((void *)json);
    grammar_vocab_destroy(gv);
    tok_vocab_free(v);
}

int main(void) {
    test_constructs();
    test_errors();
    test_bounds();
    test_matcher_api();
    test_refusals();
    test_threads();
    test_schema();
    test_schema_pattern();
    test_schema_bounds();
    test_schema_formats();
    const char *sh = getenv("KS_SHARED");
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-spm.gguf", sh ? sh : "../shared");
    FILE *f = fopen(path, "rb");
    if (!f)
        SKIP("../shared/vocab absent: the token-mask brute force was not run (the rest passed)");
    fclose(f);
    test_masks(path);
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-gpt-2.gguf", sh ? sh : "../shared");
    test_masks(path); // byte-level BPE: pieces that split characters
    printf("test_grammar: ok\n");
    return 0;
}
