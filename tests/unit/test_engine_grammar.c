/* test_engine_grammar.c — unit tests of the grammar part of module
 * `engine` (include/kvseal/grammar.h): the GBNF parser (each construct,
 * errors with their positions, the bounds), the matcher (accepted and
 * rejected strings, completion, UTF-8 split across calls, pathological
 * grammars staying bounded), JSON schema compilation (each keyword;
 * unsupported ones refused by name) and the token mask against a
 * brute-force check over real vocabularies from ../shared/vocab. */
#include "kvseal/gguf.h"
#include "kvseal/grammar.h"

#include <jansson.h>
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// ----------------------------------------------------------------------------
// GBNF constructs

static void test_constructs(void) {
    grammar *g = gparse("root ::= \"ab\" \"c\"");
    FULL(g, "abc");
    PART(g, "ab");
    NOPE(g, "abd");
    NOPE(g, "abcx");
    grammar_unref(g);

    g = gparse("root ::= [a-c] [^a-z] [xyz-]\n");
    FULL(g, "aZ-");
    FULL(g, "c1x");
    NOPE(g, "da-");
    NOPE(g, "aa-");
    grammar_unref(g);

    g = gparse("root ::= . .");
    FULL(g, "a\xc3\xa9"); // any code point, a 2-byte one too
    PART(g, "a\xc3");     // inside a character
    grammar_unref(g);

    g = gparse("root ::= \"x\" | \"y\" \"z\"\n  | \"w\"");
    FULL(g, "x");
    FULL(g, "yz");
    FULL(g, "w");
    NOPE(g, "y z");
    grammar_unref(g);

    g = gparse("# a comment\nroot ::= a b* # trailing\na ::= \"a\"+\nb ::= (\"b\" | \"c\")?\n");
    FULL(g, "a");
    FULL(g, "aaab");
    FULL(g, "aac");
    FULL(g, "abc"); // b* of (b|c)?
    NOPE(g, "b");
    grammar_unref(g);

    g = gparse("root ::= \"a\"{2} \"b\"{1,3} \"c\"{2,} \"d\"{,1}");
    FULL(g, "aabcc");
    FULL(g, "aabbbccccd");
    NOPE(g, "abcc");
    NOPE(g, "aabbbbcc");
    PART(g, "aabc");
    grammar_unref(g);

    g = gparse("root ::= (\"ab\" \"c\"){2}"); // a multi-element item repeated
    FULL(g, "abcabc");
    NOPE(g, "abcab c");
    grammar_unref(g);

    // escapes
    g = gparse("root ::= \"\\n\\t\\\\\\\"\\x41\\u00e9\\U0001F600\" [\\]\\-]");
    FULL(g, "\n\t\\\"A\xc3\xa9\xf0\x9f\x98\x80]");
    FULL(g, "\n\t\\\"A\xc3\xa9\xf0\x9f\x98\x80-");
    grammar_unref(g);

    // multi-line rule bodies: a rule ends where the next `name ::=` starts
    g = gparse("root ::=\n  item\n  (\",\" item)*\nitem ::=\n  [0-9]+\n");
    FULL(g, "1,22,333");
    NOPE(g, "1,,2");
    grammar_unref(g);

    // negated classes and UTF-8
    g = gparse("root ::= [^\"]* \"\\\"\"");
    FULL(g, "h\xc3\xa9llo \xe2\x82\xac\"");
    NOPE(g, "a\"b");
    grammar_unref(g);
    g = gparse("root ::= [\\u00e0-\\u00ff]");
    FULL(g, "\xc3\xa9");
    NOPE(g, "\xc3\x80"); // U+00C0
    PART(g, "\xc3");     // still possible
    NOPE(g, "\xc2");     // U+0080..U+00BF cannot be in the range
    NOPE(g, "\x80");     // a stray continuation byte
    grammar_unref(g);

    // empty alternatives and recursion (not left)
    g = gparse("root ::= \"(\" root \")\" | ");
    FULL(g, "");
    FULL(g, "((()))");
    PART(g, "((");
    NOPE(g, "())");
    grammar_unref(g);
}

static void test_errors(void) {
    const char *m;
    m = gfail("root ::= \"abc", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "line 1, column 14");
    CHECK_STR_HAS(m, "unterminated string");
    m = gfail("root ::= x\n", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "undefined rule 'x'");
    CHECK_STR_HAS(m, "line 1, column 10");
    m = gfail("a ::= \"a\"\n", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "no 'root'");
    m = gfail("root ::= \"a\"\nroot ::= \"b\"\n", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "defined twice");
    m = gfail("root ::= [a-\n", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "line 1");
    m = gfail("root ::= \"a\"\n  x ::= \"b\" ) \n", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "line 2");
    m = gfail("root ::= (\"a\" | \"b\"\n", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "expected ')'");
    m = gfail("root ::= \"\\q\"", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "unknown escape");
    m = gfail("root ::= [z-a]", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "range end");
    m = gfail("root ::= \"a\"{3,2}", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "max below min");
    m = gfail("root ::= @", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "line 1, column 10: unexpected character '@'");
    m = gfail("just words", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "expected a rule definition");
    // left recursion, direct and through a nullable prefix
    m = gfail("root ::= root \"a\" | \"b\"", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "left recursion");
    m = gfail("root ::= e x\ne ::= \"\" | \"q\"\nx ::= root \"y\" | \"z\"", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "left recursion");
    m = gfail("root ::= (\"a\"?)* root \"x\" | \"y\"", KS_ERR_INVAL); // the star is nullable
    CHECK_STR_HAS(m, "left recursion");
    m = gfail("root ::= x \"a\"\nx ::= \"\" | root", KS_ERR_INVAL); // through a tail edge too
    CHECK_STR_HAS(m, "left recursion");
    {
        // a repetition of something nullable is fine: it never grows a stack
        grammar *g = gparse("root ::= (\"a\"?)* \"b\" (\" \"?)*");
        FULL(g, "aab  ");
        FULL(g, "b");
        grammar_unref(g);
    }
    // bounds
    m = gfail("root ::= \"a\"{1001}", KS_ERR_NOSPACE);
    CHECK_STR_HAS(m, "repetition count above 1000");
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
    grammar *g;
    g = gschema("{\"type\":\"object\"}"); // any object
    FULL(g, "{}");
    FULL(g, "{\"a\": [1, 2.5e3, \"x\", true, null, {\"b\": {}}]}");
    FULL(g, "{\n  \"a\": -0.5\n}");
    NOPE(g, "[]");
    NOPE(g, "{\"a\":01}");
    NOPE(g, "{\"a\":1,}");
    NOPE(g, "{\"a\":\"\x01\"}");            // a raw control character
    NOPE(g, "{   \"a\":1}");                // at most one space of whitespace in a row...
    FULL(g, "{\n                \"a\":1}"); // ...or a newline and up to 16 spaces
    NOPE(g, "{\n                 \"a\":1}");
    grammar_unref(g);

    g = gschema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
                "{\"type\":\"string\"}}},\"required\":[\"name\",\"tags\"],"
                "\"additionalProperties\":false}");
    FULL(g, "{\"name\":\"a\",\"age\":3,\"tags\":[]}");
    FULL(g, "{\"name\":\"a\",\"tags\":[\"x\",\"y\"]}"); // optional age left out
    NOPE(g, "{\"name\":\"a\"}");                        // tags is required...
    PART(g, "{\"name\":\"a\"");
    NOPE(g, "{\"age\":3,\"name\":\"a\",\"tags\":[]}");   // the schema's order
    NOPE(g, "{\"name\":\"a\",\"age\":3.5,\"tags\":[]}"); // integer
    NOPE(g, "{\"name\":\"a\",\"tags\":[],\"x\":1}");     // no additional properties
    grammar_unref(g);

    // only optional properties: any subset in order, commas right
    g = gschema("{\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"boolean\"},"
                "\"c\":{\"const\":7}}}");
    FULL(g, "{}");
    FULL(g, "{\"b\":true}");
    FULL(g, "{\"a\":null,\"c\":7}");
    FULL(g, "{\"a\":null,\"b\":false,\"c\":7}");
    NOPE(g, "{,\"b\":true}");
    NOPE(g, "{\"c\":8}");
    grammar_unref(g);

    g = gschema("{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2,"
                "\"maxItems\":3}");
    NOPE(g, "[1]");
    FULL(g, "[1,2]");
    FULL(g, "[1, -2.5, 3e10]");
    NOPE(g, "[1,2,3,4]");
    grammar_unref(g);

    g = gschema("{\"enum\":[\"red\",\"green\",42,null,{\"k\":[1]}]}");
    FULL(g, "\"red\"");
    FULL(g, "42");
    FULL(g, "null");
    FULL(g, "{\"k\":[1]}");
    NOPE(g, "\"blue\"");
    grammar_unref(g);

    g = gschema("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":2}]}");
    FULL(g, "12");
    FULL(g, "\"ab\"");
    NOPE(g, "\"abc\"");
    NOPE(g, "1.5");
    grammar_unref(g);
    g = gschema("{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}");
    FULL(g, "false");
    FULL(g, "null");
    grammar_unref(g);
    g = gschema("{\"type\":[\"string\",\"null\"],\"minLength\":1}");
    FULL(g, "null");
    FULL(g, "\"x\"");
    NOPE(g, "\"\"");
    grammar_unref(g);

    g = gschema("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
    NOPE(g, "\"a\"");
    FULL(g, "\"ab\"");
    FULL(g, "\"\\n\xc3\xa9\""); // an escape and a 2-byte character count as one each
    NOPE(g, "\"abcd\"");
    grammar_unref(g);

    g = gschema("{\"type\":\"string\",\"format\":\"date\"}");
    FULL(g, "\"2024-02-29\"");
    NOPE(g, "\"2024-13-01\"");
    NOPE(g, "\"24-01-01\"");
    grammar_unref(g);
    g = gschema("{\"type\":\"string\",\"format\":\"time\"}");
    FULL(g, "\"23:59:59Z\"");
    FULL(g, "\"01:02:03.123+05:30\"");
    NOPE(g, "\"24:00:00Z\"");
    grammar_unref(g);
    g = gschema("{\"type\":\"string\",\"format\":\"date-time\"}");
    FULL(g, "\"2024-01-31T12:00:00Z\"");
    NOPE(g, "\"2024-01-31 12:00:00Z\"");
    grammar_unref(g);
    g = gschema("{\"type\":\"string\",\"format\":\"uuid\"}");
    FULL(g, "\"123e4567-e89b-12d3-a456-426614174000\"");
    NOPE(g, "\"123e4567e89b-12d3-a456-426614174000\"");
    grammar_unref(g);

    // $ref / $defs, recursion through a ref, nested required fields
    g = gschema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
                "\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
                "\"required\":[\"v\",\"kids\"]}},\"$ref\":\"#/$defs/node\"}");
    FULL(g,
         "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}");
    NOPE(g, "{\"v\":1,\"kids\":[{\"v\":2}]}");
    grammar_unref(g);
    g = gschema("{\"definitions\":{\"a~b/c\":{\"type\":\"boolean\"}},\"type\":\"object\","
                "\"properties\":{\"x\":{\"$ref\":\"#/definitions/a~0b~1c\",\"description\":\"d\"}},"
                "\"required\":[\"x\"]}");
    FULL(g, "{\"x\":true}");
    grammar_unref(g);
    g = gschema("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}");
    FULL(g, "{\"a\":1,\"b\":2}");
    NOPE(g, "{\"a\":\"x\"}");
    grammar_unref(g);
    g = gschema("true");
    FULL(g, "[1,{}]");
    grammar_unref(g);
    g = gschema("{\"title\":\"anything\",\"description\":\"x\"}");
    FULL(g, "\"s\"");
    grammar_unref(g);
    g = gschema("{\"type\":\"object\",\"properties\":{\"k\\\"q\":{\"type\":\"integer\"}},"
                "\"required\":[\"k\\\"q\"]}"); // a key that needs escaping
    FULL(g, "{\"k\\\"q\":1}");
    grammar_unref(g);

    // refused, by keyword and path
    const char *m;
    m = gschema_fail("{\"type\":\"string\",\"pattern\":\"^a$\"}", KS_ERR_UNSUPPORTED);
    CHECK_STR_HAS(m, "'pattern'");
    m = gschema_fail("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\","
                     "\"minimum\":0}}}",
                     KS_ERR_UNSUPPORTED);
    CHECK_STR_HAS(m, "/properties/a");
    CHECK_STR_HAS(m, "'minimum'");
    m = gschema_fail("{\"type\":\"string\",\"format\":\"email\"}", KS_ERR_UNSUPPORTED);
    CHECK_STR_HAS(m, "email");
    m = gschema_fail("{\"type\":\"array\",\"items\":[{}]}", KS_ERR_UNSUPPORTED);
    m = gschema_fail("{\"allOf\":[{},{}]}", KS_ERR_UNSUPPORTED);
    m = gschema_fail("{\"$ref\":\"http://x/y\"}", KS_ERR_UNSUPPORTED);
    m = gschema_fail("{\"$ref\":\"#/$defs/missing\"}", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "does not resolve");
    m = gschema_fail("{\"type\":\"string\",\"maxLength\":5000}", KS_ERR_UNSUPPORTED);
    CHECK_STR_HAS(m, "maxLength");
    m = gschema_fail("{\"type\":\"frob\"}", KS_ERR_INVAL);
    m = gschema_fail("{\"type\":\"object\",\"required\":[\"a\"]}", KS_ERR_UNSUPPORTED);
    m = gschema_fail("{\"enum\":[]}", KS_ERR_INVAL);
    m = gschema_fail("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", KS_ERR_INVAL);
    m = gschema_fail("{\"type\":\"array\",\"uniqueItems\":true}", KS_ERR_UNSUPPORTED);
    CHECK_STR_HAS(m, "uniqueItems");
    m = gschema_fail("{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}}}",
                     KS_ERR_INVAL); // a ref cycle that consumes nothing
    CHECK_STR_HAS(m, "matches nothing");
    m = gfail("root ::= a\na ::= root", KS_ERR_INVAL);
    CHECK_STR_HAS(m, "matches nothing");
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
    char piece[1024], text[2048];
    int32_t count = 0;
    grammar_matcher *b = NULL;
    for (int32_t id = 0; id < V; id++) {
        size_t n = tok_piece(v, id, false, piece, sizeof piece);
        bool want = false;
        if (n > 0 && n < sizeof piece && !tok_is_eog(v, id)) {
            CHECK_EQ(grammar_matcher_create(g, &b, &eb), KS_OK);
            size_t lp = strlen(prefix);
            memcpy(text, prefix, lp);
            memcpy(text + lp, piece, n);
            want = grammar_matcher_accept(b, text, lp + n);
            grammar_matcher_destroy(b);
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
    CHECK_EQ(count, n_allowed);
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
    char prefix[1024] = "", piece[1024], text[2048];
    for (int c = 0; c < n_chunks; c++) {
        CHECK(grammar_matcher_accept(m, chunks[c], strlen(chunks[c])));
        strcat(prefix, chunks[c]);
        int32_t n_allowed = -1;
        double t0 = now_s();
        CHECK_EQ(grammar_matcher_mask(m, gv, bits, &n_allowed), KS_OK);
        double t1 = now_s();
        int32_t count = 0;
        for (int32_t id = 0; id < V; id++) {
            size_t n = tok_piece(v, id, false, piece, sizeof piece);
            bool want = false;
            if (n > 0 && n < sizeof piece && !tok_is_eog(v, id)) {
                grammar_matcher *b = NULL;
                CHECK_EQ(grammar_matcher_create(g, &b, &eb), KS_OK);
                size_t lp = strlen(prefix);
                memcpy(text, prefix, lp);
                memcpy(text + lp, piece, n);
                want = grammar_matcher_accept(b, text, lp + n);
                grammar_matcher_destroy(b);
            }
            bool got = (bits[id >> 5] >> (id & 31)) & 1u;
            if (got != want)
                fprintf(stderr,
                        "mask mismatch: id %d piece '%.*s' mask %d brute %d (prefix '%s')\n", id,
                        (int)n, piece, got, want, prefix);
            CHECK_EQ(got, want);
            count += want;
        }
        CHECK_EQ(count, n_allowed);
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
    free((void *)json);
    grammar_vocab_destroy(gv);
    tok_vocab_free(v);
}

int main(void) {
    test_constructs();
    test_errors();
    test_bounds();
    test_matcher_api();
    test_schema();
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
    printf("test_engine_grammar: ok\n");
    return 0;
}
