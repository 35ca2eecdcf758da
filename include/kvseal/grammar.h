/* grammar.h — constrained decoding (module `grammar`): GBNF
 * grammars (llama.cpp's format), JSON schemas compiled to GBNF, a
 * per-sequence matcher over UTF-8 bytes, and the set of vocabulary tokens a
 * matcher can accept next (a byte trie of the vocabulary walked with the
 * matcher's state).
 *
 * Grammars and schemas are untrusted input (a request body): every size is
 * bounded (GRAMMAR_MAX_*), left recursion is refused at compile time, and
 * a matcher's work per byte is bounded, so no input can make the server
 * loop or allocate without bound. A path that would pass a bound is simply
 * not accepted (the token is masked), never an unbounded computation;
 * grammar_matcher_ambiguous says when that happened.
 *
 * Threads: a grammar and a grammar_vocab are shared read-only by any
 * number of threads (a grammar's precomputed token classes fill in behind
 * a mutex and atomics). A matcher belongs to one sequence and is used by
 * one thread at a time; different matchers, of the same grammar or not,
 * run their accept/mask/sample calls concurrently on different threads
 * with no locking beyond a short lookup in the grammar's class table.
 * Design notes: comments at the top of src/grammar/compile.c, match.c and
 * mask.c. grammar_sample, the draw under a grammar, is the engine's
 * (src/engine/grammar_sample.c): it calls the engine's sampler. */
#ifndef KS_GRAMMAR_H
#define KS_GRAMMAR_H

#include "kvseal/base.h"
#include "kvseal/sample.h"
#include "kvseal/tok.h"

#define GRAMMAR_MAX_TEXT (256 * 1024) /* bytes of GBNF text */
#define GRAMMAR_MAX_ELEMS 200000      /* compiled elements, after {m,n} expansion */
#define GRAMMAR_MAX_RULES 20000       /* rules, generated ones included */
#define GRAMMAR_MAX_REPEAT 1000       /* largest m or n in x{m,n} */
#define GRAMMAR_MAX_STACKS 1024       /* live parse stacks of one matcher state */
#define GRAMMAR_MAX_DEPTH 512         /* rule nesting depth of one stack */
#define GRAMMAR_MAX_WORK 20000        /* closure steps per byte advanced */

// ----------------------------------------------------------------------------
// Compiled grammars: immutable (but for their cache of token classes, which
// fills in on first use), reference-counted, shareable across threads.

typedef struct grammar grammar;

/* Parses GBNF text (len bytes; NUL not required): rules `name ::= alts`,
 * string literals with \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes,
 * character classes [a-z] and [^...], `.`, grouping, `|`, `*` `+` `?`,
 * `{m}` `{m,}` `{m,n}` `{,n}`, `#` comments; `root` is the start rule. A
 * rule ends where the next `name ::=` starts. On success *out holds one
 * reference (grammar_unref). Errors: KS_ERR_INVAL with "line L, column C:
 * what" in eb (syntax, an undefined rule, no root, left recursion), and
 * KS_ERR_NOSPACE when a GRAMMAR_MAX_* bound is passed; KS_ERR_NOMEM. Each
 * call compiles a grammar of its own (never shared between requests, so
 * neither its token classes nor their timing cross tenants). Refused too: a grammar in which one character
 * opens more parses than the matcher's bounds (KS_ERR_INVAL, "too
 * ambiguous", naming the rule). Thread-safe. */
ks_err grammar_parse(const char *text, size_t len, grammar **out /* OUT */,
                     ks_errbuf *eb) KS_MUST_USE;
/* The GBNF text g was parsed from (*len bytes, NUL-terminated), owned by g:
 * what a peer needs to compile the same grammar. Can't fail. */
const char *grammar_text(const grammar *g, size_t *len /* OUT */);
/* Adds a reference; returns g. Thread-safe. */
grammar *grammar_ref(grammar *g);
/* Drops a reference (frees on the last); accepts NULL. Thread-safe. */
void grammar_unref(grammar *g);

// ----------------------------------------------------------------------------
// JSON schema -> GBNF (for response_format and, later, tool calls)

struct json_t; /* jansson's */

/* Writes GBNF rules accepting exactly the JSON texts (compact, with bounded
 * optional whitespace) that validate against schema. Rules are named
 * prefix + "root" (the entry) and prefix + "...": distinct prefixes let a
 * caller concatenate several schemas' rules with its own root (prefix ""
 * makes a complete grammar). Supported: type (and type lists), properties
 * (emitted in the schema's order), required, additionalProperties, items,
 * minItems, maxItems, enum, const, anyOf, oneOf, $ref to #/$defs/x or
 * #/definitions/x (or "#"), minLength, maxLength, format (date, time,
 * date-time, uuid, email, ipv4), pattern (a regex subset; the whole string
 * matches), minimum, maximum, exclusiveMinimum, exclusiveMaximum (exact
 * for integers; docs/structured-output.md says what a bounded number
 * emits); annotations (title, description, default, examples, $schema,
 * $id, $comment) are ignored. Numbers have at most 16 integer digits, 16
 * fraction digits and 3 exponent digits. Objects hold only the declared
 * properties (still valid against the schema). On success *gbnf is
 * malloc'd (caller frees). Errors: KS_ERR_UNSUPPORTED with the keyword (or
 * the regex construct and its byte offset) and its JSON path in eb ("at
 * /properties/a: unsupported keyword 'multipleOf'"), KS_ERR_INVAL
 * (malformed schema or pattern, an unresolved $ref, bounds no integer
 * meets), KS_ERR_NOSPACE (too large), KS_ERR_NOMEM. Thread-safe. */
ks_err grammar_schema_gbnf(const struct json_t *schema, const char *prefix, char **gbnf /* OUT */,
                           ks_errbuf *eb) KS_MUST_USE;
/* grammar_schema_gbnf(schema, "") then grammar_parse; same errors. */
ks_err grammar_from_schema(const struct json_t *schema, grammar **out /* OUT */,
                           ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// Vocabulary tries: one per vocabulary, built once, read-only after.

typedef struct grammar_vocab grammar_vocab;

/* Builds the byte trie of every token's piece (tok_piece, specials not
 * rendered); tokens with an empty piece and end-of-generation tokens are
 * left out (the matcher allows EOG only when complete). v must outlive it.
 * Errors: KS_ERR_NOMEM. Read-only once built: thread-safe to share. */
ks_err grammar_vocab_create(const tok_vocab *v, grammar_vocab **out /* OUT */,
                            ks_errbuf *eb) KS_MUST_USE;
/* The same from raw pieces: token id i is pieces[i] (lens[i] bytes, not
 * NUL-terminated; 0 bytes: not in the trie); no id is end-of-generation.
 * The arrays are copied (the caller keeps them). For benchmarks and tests
 * of vocabularies no GGUF holds. Errors: KS_ERR_NOMEM. */
ks_err grammar_vocab_create_pieces(const char *const *pieces, const uint32_t *lens, int32_t n,
                                   grammar_vocab **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Frees it; accepts NULL. */
void grammar_vocab_destroy(grammar_vocab *gv);
/* Number of token ids (words of a mask: (n + 31) / 32). Can't fail. */
int32_t grammar_vocab_n(const grammar_vocab *gv);
/* True when id is one of the vocabulary's end-of-generation tokens (never
 * for a vocabulary of pieces). Can't fail. */
bool grammar_vocab_is_eog(const grammar_vocab *gv, int32_t id);

// ----------------------------------------------------------------------------
// Matchers: one per sequence, used by one thread at a time.

typedef struct grammar_matcher grammar_matcher;

/* Creates a matcher at the start of g's root (holds a reference to g).
 * Errors: KS_ERR_INVAL (the root cannot start within the GRAMMAR_MAX_*
 * bounds), KS_ERR_NOMEM. */
ks_err grammar_matcher_create(grammar *g, grammar_matcher **out /* OUT */,
                              ks_errbuf *eb) KS_MUST_USE;
/* Frees it; accepts NULL. */
void grammar_matcher_destroy(grammar_matcher *m);
/* Returns m to the start state (as fresh from grammar_matcher_create, its
 * caches kept): a cheap way to match many texts with one matcher.
 * Errors: KS_ERR_NOMEM (m then unusable but for destroy). */
ks_err grammar_matcher_reset(grammar_matcher *m) KS_MUST_USE;
/* Advances by n bytes (UTF-8; a character may be split across calls).
 * Returns true when they were accepted; false leaves the matcher as it was
 * (including on out-of-memory). */
bool grammar_matcher_accept(grammar_matcher *m, const char *bytes, size_t n);
/* True when the text so far is a complete sentence of the grammar (an
 * end-of-generation token may follow). Can't fail. */
bool grammar_matcher_complete(const grammar_matcher *m);
/* True when the last grammar_matcher_accept that failed, or the last
 * grammar_matcher_mask, dropped parses at a GRAMMAR_MAX_* bound: the
 * grammar is too ambiguous for the matcher here (its refusals then say
 * nothing about the text). Can't fail. */
bool grammar_matcher_ambiguous(const grammar_matcher *m);
/* True when complete and no further byte can be accepted. Can't fail. */
bool grammar_matcher_done(const grammar_matcher *m);
/* Fills bits (grammar_vocab_n(gv) bits, word w bit b = id 32w+b) with the
 * tokens whose whole piece the matcher accepts next; EOG tokens are never
 * set (see grammar_matcher_complete). Uses (and on first use computes) the
 * grammar's token classes for gv; results of expensive states are also
 * cached per matcher. Returns the number of ids set. Errors: KS_ERR_NOMEM
 * (bits then unspecified). Safe concurrently with other matchers' calls. */
ks_err grammar_matcher_mask(grammar_matcher *m, const grammar_vocab *gv, uint32_t *bits /* OUT */,
                            int32_t *n_allowed /* OUT */) KS_MUST_USE;
/* grammar_matcher_accept on token id's piece (from gv); false for an id out
 * of range or not in the trie (EOG, empty pieces). */
bool grammar_matcher_accept_token(grammar_matcher *m, const grammar_vocab *gv, int32_t id);

/* The mask side of one constrained draw (grammar_sample's first half):
 * fills mask ((n_vocab + 31) / 32 words) with the tokens m accepts next,
 * end-of-generation ids too when complete (grammar_matcher_complete, passed
 * in), and sets every other entry of logits (n_vocab floats) to -inf.
 * *end true (KS_OK, logits untouched): complete and no token can continue.
 * Errors: KS_ERR_INVAL (too ambiguous, or incomplete and no token of the
 * vocabulary can continue it: a refusal of the grammar), KS_ERR_NOMEM; the
 * message in eb. Safe concurrently with other matchers' calls. */
ks_err grammar_matcher_mask_logits(grammar_matcher *m, const grammar_vocab *gv, bool complete,
                                   float *logits, uint32_t *mask, bool *end /* OUT */,
                                   ks_errbuf *eb) KS_MUST_USE;
/* The other half, after a sampler drew *token from the row that
 * grammar_matcher_mask_logits left (mask as it left it): a masked
 * pick (a row of NaN) becomes the lowest allowed non-EOG id; then m is
 * advanced by it (not by an EOG). Errors: KS_ERR_INVAL (too ambiguous),
 * KS_ERR_INTERNAL (the matcher refused it); the message in eb. */
ks_err grammar_matcher_accept_pick(grammar_matcher *m, const grammar_vocab *gv,
                                   const uint32_t *mask, int32_t *token /* IN/OUT */,
                                   ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// The draw under a grammar: module engine (src/engine/grammar_sample.c), as
// it calls the engine's sampler (sample.h); declared here beside its parts.

/* One constrained draw: samples the next token from logits (n_vocab
 * floats; masked tokens set to -inf in place) with smp (whose params are
 * sp) among the tokens m accepts next, end-of-generation ids only when the
 * text so far is complete; then advances m by the token (not by an EOG).
 * mask is scratch of (n_vocab + 31) / 32 words. On KS_OK either *out holds
 * the token, or *end is true: the grammar is complete and no token can
 * continue it (the generation ends there, without a token). Errors:
 * KS_ERR_INVAL (a refusal, eb->reason ADMIT_INVALID: too ambiguous, or
 * incomplete and no token of the vocabulary can continue it),
 * KS_ERR_NOMEM, KS_ERR_INTERNAL (the matcher refused its own pick); the
 * message in eb. Same results on every thread and batch. */
ks_err grammar_sample(grammar_matcher *m, const grammar_vocab *gv, sampler *smp,
                      const sample_params *sp, float *logits, uint32_t *mask,
                      sample_result *out /* OUT */, bool *end /* OUT */, ks_errbuf *eb) KS_MUST_USE;

#endif /* KS_GRAMMAR_H */
