/* fuzz_grammar.c — libFuzzer harness for the grammar compiler and matcher
 * (src/grammar/: compile.c, match.c, mask.c, schema.c): untrusted request input.
 *
 * The input is GBNF text, then (after the first NUL, if any) bytes fed to a
 * matcher of the grammar one at a time. A grammar that parses gives a
 * matcher whose per-byte work is bounded; one that fails says why. The
 * same text is also tried as a JSON schema, whose GBNF must always parse.
 * Built only with KS_FUZZ=ON; see tests/fuzz/README.md. */
#include "kvseal/grammar.h"

#include <jansson.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const char *nul = memchr(data, 0, size);
    size_t n_text = nul ? (size_t)(nul - text) : size;
    ks_errbuf eb;
    memset(&eb, 0, sizeof eb);
    grammar *g = NULL;
    ks_err e = grammar_parse(text, n_text, &g, &eb);
    if (e != KS_OK) {
        if (g || eb.msg[0] == '\0') abort();
    } else {
        grammar_matcher *m = NULL;
        if (grammar_matcher_create(g, &m, &eb) == KS_OK) {
            for (size_t i = n_text + 1; i < size; i++) {
                bool was_done = grammar_matcher_done(m);
                bool ok = grammar_matcher_accept(m, text + i, 1);
                if (was_done && ok) abort(); // done means nothing more is accepted
            }
            (void)grammar_matcher_complete(m);
            grammar_matcher_destroy(m);
        } else if (eb.msg[0] == '\0')
            abort();
        grammar_unref(g);
    }
    json_t *s = json_loadb(text, n_text, JSON_DECODE_ANY, NULL);
    if (s) {
        char *gbnf = NULL;
        if (grammar_schema_gbnf(s, "", &gbnf, &eb) == KS_OK) {
            grammar *g2 = NULL;
            ks_err e2 = grammar_parse(gbnf, strlen(gbnf), &g2, &eb);
            // a schema's grammar always parses, except for a $ref cycle
            // that consumes nothing or the size bounds
            if (e2 != KS_OK && !strstr(eb.msg, "left recursion") &&
                !strstr(eb.msg, "matches nothing") && e2 != KS_ERR_NOSPACE)
                abort();
            grammar_unref(g2);
            free(gbnf);
        }
        json_decref(s);
    }
    return 0;
}
