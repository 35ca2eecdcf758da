/* bench_grammar.c — the grammar matcher alone (grammar.h): time per token
 * of grammar_matcher_mask on a 150,000-token vocabulary, for
 *   json:  a JSON schema (an object with typed properties and a nested
 *          array of objects),
 *   tool:  a tool call as the server constrains it (toolcall_grammar,
 *          hermes format, two tools),
 *   patho: root ::= (x x x x x x x x x x x x "\n")*, x ::= [ -~]*
 *          (the grammar of issue 38: ~43 ms/token before).
 * A generation is driven through a fixed valid text: each step computes
 * the mask (timed), then takes the longest token the mask allows that the
 * remaining text starts with. ROUNDS generations run with fresh matchers
 * on the same compiled grammar: round 1 is cold (nothing the grammar
 * precomputes exists yet), round 2 generates another text (other: warm
 * token classes, mostly new states), the later ones the first text again
 * (warm: every state's mask seen). Prints median, p99, max and mean per
 * token of each phase.
 *
 * The vocabulary: every piece of ../shared/vocab's largest vocabulary
 * (deepseek-llm, ~100k), then pairs of its pieces (a fixed LCG) up to
 * 150,000 ids; without ../shared, 150,000 synthesized byte strings.
 *
 * usage: bench_grammar [-r ROUNDS] [-v VOCAB.gguf] [-n N_VOCAB] */
#include "../src/server/toolcall.h"
#include "kvseal/gguf.h"
#include "kvseal/grammar.h"
#include "kvseal/tok.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33);
}

// The vocabulary: pieces and a hash from piece to id (the longest-match drive).
static char **g_piece;
static uint32_t *g_len;
static int32_t g_n;
static int32_t *g_ht;
static uint32_t g_ht_cap;

static uint32_t hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static void add_piece(const char *s, uint32_t n) {
    g_piece[g_n] = malloc(n + 1);
    memcpy(g_piece[g_n], s, n);
    g_piece[g_n][n] = 0;
    g_len[g_n++] = n;
}

static void build_vocab(const char *path, int32_t want) {
    g_piece = calloc((size_t)want, sizeof *g_piece);
    g_len = calloc((size_t)want, sizeof *g_len);
    gguf_file *f = NULL;
    ks_errbuf eb;
    tok_vocab *v = NULL;
    if (gguf_open(path, &f, &eb) == KS_OK) {
        if (tok_vocab_load(f, &v, &eb) != KS_OK) v = NULL;
        gguf_close(f);
    }
    if (v) {
        char buf[512];
        for (int32_t id = 0; id < tok_n_vocab(v) && g_n < want; id++) {
            size_t n = tok_is_eog(v, id) ? 0 : tok_piece(v, id, false, buf, sizeof buf);
            add_piece(buf, n > sizeof buf ? 0 : (uint32_t)n);
        }
        tok_vocab_free(v);
        printf("vocabulary: %s (%d ids) + pairs of its pieces up to %d\n", path, g_n, want);
        int32_t base = g_n;
        while (g_n < want) {
            int32_t a = (int32_t)(rnd() % (uint32_t)base), b = (int32_t)(rnd() % (uint32_t)base);
            if (!g_len[a] || !g_len[b] || g_len[a] + g_len[b] > 16) continue;
            char t[40];
            memcpy(t, g_piece[a], g_len[a]);
            memcpy(t + g_len[a], g_piece[b], g_len[b]);
            add_piece(t, g_len[a] + g_len[b]);
        }
    } else {
        printf("vocabulary: %s absent: %d synthesized byte strings\n", path, want);
        for (int c = 0; c < 256; c++) { // every byte alone
            char t = (char)c;
            add_piece(&t, 1);
        }
        static const char alpha[] = "etaoinshrdlucmfwypvbgkjqxz ETAOINSHR0123456789 .,:;\"'{}[]"
                                    "()_-\n\t\\/";
        while (g_n < want) {
            char t[16];
            uint32_t n = 2 + rnd() % 10;
            for (uint32_t i = 0; i < n; i++)
                t[i] = alpha[rnd() % (sizeof alpha - 1)];
            add_piece(t, n);
        }
    }
    g_ht_cap = 1;
    while (g_ht_cap < (uint32_t)g_n * 2)
        g_ht_cap *= 2;
    g_ht = malloc(g_ht_cap * sizeof *g_ht);
    for (uint32_t i = 0; i < g_ht_cap; i++)
        g_ht[i] = -1;
    for (int32_t id = 0; id < g_n; id++) {
        if (!g_len[id]) continue;
        uint32_t h = hash(g_piece[id], g_len[id]) & (g_ht_cap - 1);
        while (g_ht[h] >= 0)
            h = (h + 1) & (g_ht_cap - 1);
        g_ht[h] = id;
    }
}

/* Some id whose piece is s[0..n) and whose mask bit is set, or -1. */
static int32_t find_allowed(const char *s, uint32_t n, const uint32_t *bits) {
    uint32_t h = hash(s, n) & (g_ht_cap - 1);
    for (; g_ht[h] >= 0; h = (h + 1) & (g_ht_cap - 1)) {
        int32_t id = g_ht[h];
        if (g_len[id] == n && !memcmp(g_piece[id], s, n) && (bits[id >> 5] >> (id & 31) & 1u))
            return id;
    }
    return -1;
}

/* One generation of text through grammar g; appends each mask's ms to t. */
static int generate(grammar *g, const grammar_vocab *gv, const char *text, double *t, int *n_t) {
    ks_errbuf eb;
    grammar_matcher *m = NULL;
    if (grammar_matcher_create(g, &m, &eb) != KS_OK) {
        fprintf(stderr, "matcher: %s\n", eb.msg);
        return -1;
    }
    uint32_t *bits = malloc(((size_t)g_n + 31) / 32 * sizeof *bits);
    size_t at = 0, len = strlen(text);
    int rc = 0;
    while (at < len) {
        int32_t n_allowed = 0;
        double t0 = now_ms();
        ks_err e = grammar_matcher_mask(m, gv, bits, &n_allowed);
        t[(*n_t)++] = now_ms() - t0;
        if (e != KS_OK) {
            rc = -1;
            break;
        }
        int32_t id = -1;
        for (uint32_t n = len - at < 16 ? (uint32_t)(len - at) : 16; n > 0 && id < 0; n--)
            id = find_allowed(text + at, n, bits);
        if (id < 0 || !grammar_matcher_accept_token(m, gv, id)) {
            fprintf(stderr, "drive: no allowed token at byte %zu ('%.20s')\n", at, text + at);
            rc = -1;
            break;
        }
        at += g_len[id];
    }
    free(bits);
    grammar_matcher_destroy(m);
    return rc;
}

static void report(const char *name, const char *phase, double *t, int n) {
    if (n <= 0) return;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += t[i];
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    int i99 = (int)(0.99 * (n - 1) + 0.5);
    printf("  %-6s %-5s %5d tokens: median %8.4f ms  p99 %8.3f ms  max %8.3f ms  mean %8.4f ms\n",
           name, phase, n, t[n / 2], t[i99], t[n - 1], sum / n);
}

/* Round 1 generates text (cold: a grammar compiled for the first time),
 * round 2 text2 (other values: warm classes, new states), rounds 3.. text
 * again (warm: the grammar's states seen, as a popular schema's are). */
static void bench(const char *name, const char *gbnf, const char *text, const char *text2,
                  const grammar_vocab *gv, int rounds) {
    ks_errbuf eb;
    grammar *g = NULL;
    double t0 = now_ms();
    ks_err e = grammar_parse(gbnf, strlen(gbnf), &g, &eb);
    double t_parse = now_ms() - t0;
    if (e != KS_OK) {
        printf("  %-6s refused: %s\n", name, eb.msg);
        return;
    }
    size_t cap = (strlen(text) + strlen(text2)) * (size_t)rounds + 1;
    double *cold = malloc(cap * sizeof *cold), *other = malloc(cap * sizeof *other),
           *warm = malloc(cap * sizeof *warm);
    int n_cold = 0, n_other = 0, n_warm = 0;
    for (int r = 0; r < rounds; r++) {
        int rc = r == 0   ? generate(g, gv, text, cold, &n_cold)
                 : r == 1 ? generate(g, gv, text2, other, &n_other)
                          : generate(g, gv, text, warm, &n_warm);
        if (rc < 0) break;
    }
    printf("  %-6s compiled in %.2f ms\n", name, t_parse);
    report(name, "cold", cold, n_cold);
    report(name, "other", other, n_other);
    report(name, "warm", warm, n_warm);
    free(cold);
    free(other);
    free(warm);
    grammar_unref(g);
}

int main(int argc, char **argv) {
    int rounds = 4;
    int32_t want = 150000;
    const char *sh = getenv("KS_SHARED");
    char path[1024];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-deepseek-llm.gguf", sh ? sh : "../shared");
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-r"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-v"))
            snprintf(path, sizeof path, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            want = atoi(argv[i + 1]);
    }
    if (rounds < 1) rounds = 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (want < 300) want = 300;
    build_vocab(path, want);
    ks_errbuf eb;
    grammar_vocab *gv = NULL;
    if (grammar_vocab_create_pieces((const char *const *)g_piece, g_len, g_n, &gv, &eb) != KS_OK) {
        fprintf(stderr, "bench_grammar: %s\n", eb.msg);
        return 1;
    }

    // (a) a JSON schema: typed properties and a nested array of objects
    const char *schema =
        "{\"type\":\"object\",\"properties\":{"
        "\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
        "\"score\":{\"type\":\"number\"},\"active\":{\"type\":\"boolean\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
        "\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{"
        "\"id\":{\"type\":\"integer\"},\"label\":{\"type\":\"string\"}},"
        "\"required\":[\"id\",\"label\"]}}},"
        "\"required\":[\"name\",\"age\",\"score\",\"active\",\"tags\",\"items\"]}";
    json_t *s = json_loads(schema, 0, NULL);
    char *json_gbnf = NULL;
    if (!s || grammar_schema_gbnf(s, "", &json_gbnf, &eb) != KS_OK) {
        fprintf(stderr, "bench_grammar: schema: %s\n", eb.msg);
        return 1;
    }
    const char *json_text =
        "{\"name\": \"Ada Lovelace, the first programmer of the Analytical Engine\", "
        "\"age\": 36, \"score\": 98.25, \"active\": true, "
        "\"tags\": [\"mathematics\", \"poetry of science\", \"notes on the engine\"], "
        "\"items\": [{\"id\": 1, \"label\": \"Bernoulli numbers, computed by the engine\"}, "
        "{\"id\": 2, \"label\": \"a letter to Charles Babbage about the program\"}, "
        "{\"id\": 3, \"label\": \"translation of Menabrea's memoir, with notes A to G\"}]}";

    // (b) a tool call: what the server constrains tool_choice "required" to
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
        "\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\"}},"
        "\"required\":[\"city\",\"unit\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"},"
        "\"filters\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
        "\"required\":[\"query\"]}}}]",
        0, NULL);
    char *tool_gbnf = toolcall_grammar(TOOLCALL_HERMES, tools, NULL);
    const char *tool_text = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"the "
                            "weather in Paris next week and the week after\", \"filters\": "
                            "[\"news\", \"forecasts from the last two days\"]}}\n</tool_call>";

    // (c) the pathological grammar of issue 38
    const char *patho_gbnf = "root ::= (x x x x x x x x x x x x \"\\n\")*\nx ::= [ -~]*\n";
    char patho_text[4096] = "";
    for (int i = 0; i < 8; i++)
        strcat(patho_text, "The quick brown fox jumps over the lazy dog; it ran, then sat.\n");

    printf("bench_grammar: mask time per token, %d ids, %d rounds (1 cold + %d warm)\n", g_n,
           rounds, rounds - 1);
    const char *json_text2 =
        "{\"name\": \"Grace Hopper\", \"age\": 85, \"score\": -3.5e2, \"active\": false, "
        "\"tags\": [], \"items\": [{\"id\": 42, \"label\": \"COBOL \\\"compiler\\\" notes\"}]}";
    const char *tool_text2 = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                             "\"Lyon\", \"unit\": \"celsius\", \"days\": 3}}\n</tool_call>";
    char patho_text2[4096] = "";
    for (int i = 0; i < 6; i++)
        strcat(patho_text2, "{\"k\": [1, 2, 3]} -- a line of other ASCII: ~!@#$%^&*()_+|\n");
    bench("json", json_gbnf, json_text, json_text2, gv, rounds);
    if (tool_gbnf) bench("tool", tool_gbnf, tool_text, tool_text2, gv, rounds);
    bench("patho", patho_gbnf, patho_text, patho_text2, gv, rounds);
    free(json_gbnf);
    free(tool_gbnf);
    json_decref(s);
    json_decref(tools);
    grammar_vocab_destroy(gv);
    for (int32_t i = 0; i < g_n; i++)
        free(g_piece[i]);
    free(g_piece);
    free(g_len);
    free(g_ht);
    return 0;
}
