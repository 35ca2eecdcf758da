/* toolcall.c — tool calls and reasoning out of a model's text (toolcall.h):
 * the output parser (the request side is toolcall_req.c).
 *
 * One state machine over the text, three phases: START (before a possible
 * opening think marker), REASONING (up to the closing marker), CONTENT
 * (content text with tool calls in it). The parser keeps only the text it
 * has not settled; each push appends and re-runs the machine from there.
 * A phase settles text once no later text can change what it is: content
 * up to the longest suffix that could still start a call marker (the stop
 * matcher's rule, src/engine/stop.c), reasoning up to a possible start of
 * the closing marker, a call once its last byte is in. A call that is still
 * open waits whole (and is re-parsed from its marker on the next push: calls
 * are short, so the quadratic worst case stays small). Every decision depends
 * only on text before the point it settles, so any split of the same text
 * gives the same result (tests/unit/test_server_toolcall.c checks all).
 *
 * Calls are streamed whole: a call's delta carries its name and all its
 * arguments once the call is complete (OpenAI's shape allows any split of
 * the arguments; finer fragments are issue 12's follow-up). Arguments are
 * re-serialized by jansson (compact, keys in the model's order); a real
 * number keeps the shortest of 15 or 17 significant digits that reads back
 * to the same double, so 0.1 stays "0.1". */
#include "toolcall.h"
#include "server_int.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// The markers of each format

static bool tc__isws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The markers that start a call (or a section of calls) in format f. */
static const char *const *tc__starts(toolcall_format f) {
    static const char *const tool_call[] = {"<tool_call>", NULL};
    static const char *const llama3[] = {"<|python_tag|>", NULL};
    static const char *const mistral[] = {"[TOOL_CALLS]", NULL};
    static const char *const deepseek[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN, NULL};
    static const char *const dsml[] = {DSML "function_calls>", DSML "tool_calls>", NULL};
    static const char *const kimi[] = {KIMI_CALLS_BEGIN, KIMI_CALL_BEGIN, NULL};
    static const char *const nemotron[] = {"<TOOLCALL>", NULL};
    static const char *const apriel[] = {"<tool_calls>", NULL};
    static const char *const granite[] = {"<|tool_call|>", NULL};
    static const char *const firefunction[] = {"functools[", NULL};
    static const char *const seed[] = {"<seed:tool_call>", NULL};
    static const char *const gemma4[] = {"<|tool_call>", NULL};
    static const char *const none[] = {NULL};
    switch (f) {
    case TOOLCALL_HERMES:
    case TOOLCALL_QWEN3_CODER:
    case TOOLCALL_GLM45:
        return tool_call;
    case TOOLCALL_LLAMA3:
        return llama3;
    case TOOLCALL_MISTRAL:
        return mistral;
    case TOOLCALL_DEEPSEEK:
        return deepseek;
    case TOOLCALL_DSML:
        return dsml;
    case TOOLCALL_KIMI_K2:
        return kimi;
    case TOOLCALL_NEMOTRON:
        return nemotron;
    case TOOLCALL_APRIEL:
        return apriel;
    case TOOLCALL_GRANITE:
        return granite;
    case TOOLCALL_FIREFUNCTION:
        return firefunction;
    case TOOLCALL_SEED_OSS:
        return seed;
    case TOOLCALL_GEMMA4:
        return gemma4;
    default:
        return none;
    }
}

/* harmony's control tokens, one after another: every special token among
 * them is a marker */
#define TC_HARMONY_TOKENS "<|start|><|channel|><|message|><|end|><|constrain|><|call|><|return|>"

/* True when piece (n bytes) occurs in marker. */
static bool tc__in(const char *marker, const char *piece, size_t n) {
    if (!marker) return false;
    for (const char *m = marker; strlen(m) >= n; m++)
        if (!memcmp(m, piece, n)) return true;
    return false;
}

bool toolcall_is_marker(const toolcall_cfg *cfg, const char *piece, size_t n) {
    if (n < 3 || (piece[0] != '<' && piece[0] != '[')) return false;
    // the think markers, or a special token of one (Gemma 4's is "<|channel>" + text)
    if (tc__in(cfg->think_open, piece, n) || tc__in(cfg->think_close, piece, n)) return true;
    if (cfg->format == TOOLCALL_HARMONY ||
        (cfg->think_open && !strcmp(cfg->think_open, HARMONY_ANALYSIS)))
        return tc__in(TC_HARMONY_TOKENS, piece, n);
    // every marker of the format, one after another
    static const char *const all[TOOLCALL__COUNT] = {
        [TOOLCALL_HERMES] = "<tool_call></tool_call>",
        [TOOLCALL_QWEN3_CODER] =
            "<tool_call></tool_call><function=</function><parameter=</parameter>",
        [TOOLCALL_LLAMA3] = "<|python_tag|>",
        [TOOLCALL_MISTRAL] = "[TOOL_CALLS][CALL_ID][ARGS]",
        [TOOLCALL_GLM45] = "<tool_call></tool_call><arg_key></arg_key><arg_value></arg_value>",
        [TOOLCALL_DEEPSEEK] = DS_CALLS_BEGIN DS_CALLS_END DS_CALL_BEGIN DS_SEP DS_CALL_END,
        [TOOLCALL_DSML] = "<"
                          "｜DSML｜"
                          "</"
                          "｜DSML｜",
        [TOOLCALL_KIMI_K2] = KIMI_CALLS_BEGIN KIMI_CALLS_END KIMI_CALL_BEGIN KIMI_SEP KIMI_CALL_END,
        [TOOLCALL_NEMOTRON] = "<TOOLCALL></TOOLCALL>",
        [TOOLCALL_APRIEL] = "<tool_calls></tool_calls>",
        [TOOLCALL_GRANITE] = "<|tool_call|>",
        [TOOLCALL_SEED_OSS] =
            "<seed:tool_call></seed:tool_call><function=</function><parameter=</parameter>",
        [TOOLCALL_GEMMA4] = "<|tool_call><tool_call|><|\"|>",
    };
    const char *cat = (unsigned)cfg->format < TOOLCALL__COUNT ? all[cfg->format] : NULL;
    return cat && memmem(cat, strlen(cat), piece, n) != NULL;
}

// ----------------------------------------------------------------------------
// The parser's state

typedef enum tc__phase { TC_START, TC_REASONING, TC_CONTENT } tc__phase;

/* A call parser's verdict on the text at a marker. */
typedef enum tc__res {
    TC_OK,   /* calls added; *end bytes consumed */
    TC_MORE, /* it may still become a call: wait for text */
    TC_BAD,  /* not a call: *end bytes (at least the marker) are content */
} tc__res;

struct toolcall_parser {
    toolcall_cfg cfg;
    srv_buf pend; /* text pushed and not settled yet */
    tc__phase phase;
    bool after_think;   /* content starts: its leading whitespace is formatting */
    bool harmony;       /* harmony's messages: think_open is HARMONY_ANALYSIS, or the format */
    bool harmony_next;  /* harmony: a message ended; the whitespace before the next is formatting */
    bool content_nonws; /* content has something other than whitespace */
    bool finished;
    srv_buf content, reasoning; /* everything settled so far */
    size_t content_mark, reasoning_mark;
    toolcall_call *calls; /* (n_calls) */
    int n_calls, cap_calls, calls_mark;
    bool oom;
};

ks_err toolcall_parser_create(const toolcall_cfg *cfg, toolcall_parser **out) {
    *out = NULL;
    toolcall_parser *p = calloc(1, sizeof *p);
    if (!p) return KS_ERR_NOMEM;
    p->cfg = *cfg;
    if (!p->cfg.think_open || !p->cfg.think_close) {
        p->cfg.think_open = p->cfg.think_close = NULL;
        p->cfg.in_reasoning = false;
    }
    p->phase = p->cfg.in_reasoning ? TC_REASONING : p->cfg.think_open ? TC_START : TC_CONTENT;
    p->harmony = p->cfg.format == TOOLCALL_HARMONY ||
                 (p->cfg.think_open && !strcmp(p->cfg.think_open, HARMONY_ANALYSIS));
    if (p->harmony && !p->cfg.in_reasoning) p->phase = TC_START; // a header first
    *out = p;
    return KS_OK;
}

static void tc__call_free(toolcall_call *c) {
    free(c->name);
    free(c->arguments);
    memset(c, 0, sizeof *c);
}

void toolcall_parser_destroy(toolcall_parser *p) {
    if (!p) return;
    for (int i = 0; i < p->n_calls; i++)
        tc__call_free(&p->calls[i]);
    free(p->calls);
    srv_buf_free(&p->pend);
    srv_buf_free(&p->content);
    srv_buf_free(&p->reasoning);
    free(p);
}

int toolcall_parser_n_calls(const toolcall_parser *p) { return p->n_calls; }
const toolcall_call *toolcall_parser_call(const toolcall_parser *p, int i) {
    return i >= 0 && i < p->n_calls ? &p->calls[i] : NULL;
}
const char *toolcall_parser_content(const toolcall_parser *p, size_t *len) {
    *len = p->content.len;
    return p->content.p ? p->content.p : "";
}
const char *toolcall_parser_reasoning(const toolcall_parser *p, size_t *len) {
    *len = p->reasoning.len;
    return p->reasoning.p ? p->reasoning.p : "";
}

static void tc__content(toolcall_parser *p, const char *s, size_t n) {
    if (!n) return;
    if (!srv_buf_add(&p->content, s, n)) p->oom = true;
    for (size_t i = 0; i < n && !p->content_nonws; i++)
        if (!tc__isws(s[i])) p->content_nonws = true;
}

static void tc__reasoning(toolcall_parser *p, const char *s, size_t n) {
    if (n && !srv_buf_add(&p->reasoning, s, n)) p->oom = true;
}

// ----------------------------------------------------------------------------
// Small scanners

static size_t tc__skip_ws(const char *s, size_t n) {
    size_t k = 0;
    while (k < n && tc__isws(s[k]))
        k++;
    return k;
}

/* Whether s[0..n) starts with lit: 1 yes, 0 it is a proper prefix of lit
 * (more text may make it), -1 no. */
static int tc__lit(const char *s, size_t n, const char *lit) {
    size_t l = strlen(lit);
    if (n >= l) return memcmp(s, lit, l) ? -1 : 1;
    return memcmp(s, lit, n) ? -1 : 0;
}

static const char *tc__find(const char *s, size_t n, const char *lit) {
    return memmem(s, n, lit, strlen(lit));
}

/* Narrows [*b, *e) to leave out white space at both ends. */
static void tc__trim(const char **b, const char **e) {
    while (*b < *e && tc__isws(**b))
        (*b)++;
    while (*e > *b && tc__isws((*e)[-1]))
        (*e)--;
}

/* The next item of a call body at s + *k, past white space (*k moves past
 * it): 1 the text there starts with open, 2 with close, 0 it ends inside
 * either (or here: more text may decide), -1 neither. */
static int tc__next(const char *s, size_t n, size_t *k, const char *open, const char *close) {
    *k += tc__skip_ws(s + *k, n - *k);
    int a = tc__lit(s + *k, n - *k, open), b = tc__lit(s + *k, n - *k, close);
    if (a == 0 || b == 0) return 0;
    if (b == 1) return 2;
    return a == 1 ? 1 : -1;
}

/* Longest suffix of s[0..n) that is a proper prefix of one of the markers. */
static size_t tc__hold(const char *s, size_t n, const char *const *marks) {
    size_t hold = 0;
    for (; *marks; marks++) {
        size_t l = strlen(*marks), k = l - 1 < n ? l - 1 : n;
        for (; k > hold; k--)
            if (!memcmp(s + n - k, *marks, k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* The extent of the JSON object or array at s: TC_OK with *end past its
 * closing bracket, TC_MORE when the text ends inside it, TC_BAD when s does
 * not start one or it nests deeper than TOOLCALL_MAX_DEPTH. Only brackets
 * and strings are tracked; jansson checks the rest. */
static tc__res tc__json_span(const char *s, size_t n, size_t *end) {
    if (!n) return TC_MORE;
    if (s[0] != '{' && s[0] != '[') return TC_BAD;
    int depth = 0;
    bool str = false, esc = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (str) {
            if (esc)
                esc = false;
            else if (c == '\\')
                esc = true;
            else if (c == '"')
                str = false;
            continue;
        }
        if (c == '"')
            str = true;
        else if (c == '{' || c == '[') {
            if (++depth > TOOLCALL_MAX_DEPTH) return TC_BAD;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) return *end = i + 1, TC_OK;
        }
    }
    return TC_MORE;
}

static json_t *tc__json(const char *s, size_t n, size_t flags) {
    json_error_t je;
    return json_loadb(s, n, flags, &je);
}

/* The type the request's tools give parameter pname of function fname
 * ("string", ...), or NULL when unknown. */
static const char *tc__param_type(const toolcall_parser *p, const char *fname, const char *pname) {
    size_t i;
    json_t *t;
    json_array_foreach(p->cfg.tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        json_t *nm = json_object_get(fn, "name");
        if (!json_is_string(nm) || strcmp(json_string_value(nm), fname)) continue;
        json_t *ty = json_object_get(
            json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"),
                            pname),
            "type");
        if (json_is_string(ty)) return json_string_value(ty);
        if (json_is_array(ty) && json_is_string(json_array_get(ty, 0)))
            return json_string_value(json_array_get(ty, 0));
        return NULL;
    }
    return NULL;
}

/* A parameter value written as text (qwen3_coder, glm45, dsml): a string
 * when the tool says so (or as_string), else JSON when it reads as JSON,
 * else the string. NULL when it is not valid UTF-8. */
static json_t *tc__value(const toolcall_parser *p, const char *fname, const char *pname,
                         const char *v, size_t n, int as_string /* 1 yes, 0 no, -1 unknown */) {
    const char *ty = as_string < 0 && fname ? tc__param_type(p, fname, pname) : NULL;
    if (as_string == 1 || (ty && !strcmp(ty, "string"))) return json_stringn(v, n);
    json_t *j = tc__json(v, n, JSON_DECODE_ANY);
    return j ? j : json_stringn(v, n);
}

// ----------------------------------------------------------------------------
// Calls

/* Dumps args compact: reals with 15 significant digits when that reads back
 * exactly, else 17. NULL on out-of-memory. */
static char *tc__dump(const json_t *args) {
    char *s = json_dumps(args, JSON_COMPACT | JSON_REAL_PRECISION(15));
    if (!s) return NULL;
    json_t *back = tc__json(s, strlen(s), 0);
    bool same = back && json_equal(back, (json_t *)args);
    json_decref(back);
    if (same) return s;
    free(s);
    return json_dumps(args, JSON_COMPACT | JSON_REAL_PRECISION(17));
}

static bool tc__name_ok(const char *s, size_t n) {
    if (n == 0 || n > 256) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == '<' || s[i] == '>' || s[i] == '"') return false;
    json_t *j = json_stringn(s, n); // valid UTF-8
    json_decref(j);
    return j != NULL;
}

/* Copies the name s[0..n) into name as a C string when tc__name_ok. */
static bool tc__name_copy(char name[static 257], const char *s, size_t n) {
    if (!tc__name_ok(s, n)) return false;
    memcpy(name, s, n);
    name[n] = '\0';
    return true;
}

/* Adds a call; args is stolen (an object, or a string holding one). id NULL
 * draws one. False when it is not a call (bad name or arguments) or on
 * out-of-memory (p->oom). */
static bool tc__add(toolcall_parser *p, const char *name, size_t nlen, json_t *args, const char *id,
                    size_t id_len) {
    if (json_is_string(args)) { // some models write the arguments as a JSON string
        json_t *o = tc__json(json_string_value(args), json_string_length(args), 0);
        json_decref(args);
        args = o;
    }
    if (!json_is_object(args) || !tc__name_ok(name, nlen) || p->n_calls >= TOOLCALL_MAX_CALLS) {
        json_decref(args);
        return false;
    }
    if (p->n_calls == p->cap_calls) {
        int cap = p->cap_calls ? 2 * p->cap_calls : 4;
        toolcall_call *c = realloc(p->calls, (size_t)cap * sizeof *c);
        if (!c) goto oom;
        p->calls = c;
        p->cap_calls = cap;
    }
    toolcall_call *c = &p->calls[p->n_calls];
    memset(c, 0, sizeof *c);
    c->name = malloc(nlen + 1);
    c->arguments = tc__dump(args);
    json_decref(args);
    if (!c->name || !c->arguments) {
        tc__call_free(c);
        p->oom = true;
        return false;
    }
    memcpy(c->name, name, nlen);
    c->name[nlen] = '\0';
    if (id && id_len && id_len < sizeof c->id) {
        memcpy(c->id, id, id_len);
    } else if (p->cfg.format == TOOLCALL_MISTRAL) {
        // Mistral's templates refuse any id but 9 alphanumerics
        static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        for (int i = 0; i < 9; i++)
            c->id[i] = al[randombytes_uniform(sizeof al - 1)];
    } else {
        srv_make_id("call_", c->id, sizeof c->id);
    }
    p->n_calls++;
    return true;
oom:
    json_decref(args);
    p->oom = true;
    return false;
}

/* The end of a call whose body ended at s (end tag optional at the very end
 * of the answer): TC_OK with *used past the tag (or 0 without it), TC_MORE
 * while it may still come. */
static tc__res tc__close(const char *s, size_t n, const char *tag, bool final, size_t *used) {
    size_t k = tc__skip_ws(s, n);
    int m = tc__lit(s + k, n - k, tag);
    if (m == 1) return *used = k + strlen(tag), TC_OK;
    if (k == n && !final) return TC_MORE;
    if (m == 0 && k < n && !final) return TC_MORE;
    *used = 0; // a call without its end tag: what follows is content
    return TC_OK;
}

/* {"name": N, "arguments"|"parameters": {...}} -> a call. */
static bool tc__json_call(toolcall_parser *p, json_t *o, const char *id_key) {
    json_t *name = json_object_get(o, "name");
    json_t *args = json_object_get(o, "arguments");
    if (!args) args = json_object_get(o, "parameters");
    json_t *id = id_key ? json_object_get(o, id_key) : NULL;
    if (!json_is_string(name) || !args) return false;
    return tc__add(p, json_string_value(name), json_string_length(name), json_incref(args),
                   json_is_string(id) ? json_string_value(id) : NULL,
                   json_is_string(id) ? json_string_length(id) : 0);
}

/* A JSON object (or, with arrays, an array of objects) of calls at s. */
static tc__res tc__json_calls(toolcall_parser *p, const char *s, size_t n, bool arrays,
                              const char *id_key, size_t *end) {
    tc__res r = tc__json_span(s, n, end);
    if (r != TC_OK) return r;
    if (s[0] == '[' && !arrays) return TC_BAD;
    json_t *j = tc__json(s, *end, 0);
    if (!j) return TC_BAD;
    bool ok = true;
    if (json_is_array(j)) {
        size_t i;
        json_t *o;
        ok = json_array_size(j) > 0;
        json_array_foreach(j, i, o) ok = ok && tc__json_call(p, o, id_key);
    } else {
        ok = tc__json_call(p, j, id_key);
    }
    json_decref(j);
    return ok ? TC_OK : TC_BAD;
}

/* hermes: <tool_call> {json} </tool_call> */
static tc__res tc__hermes(toolcall_parser *p, const char *s, size_t n, bool final, size_t *end) {
    size_t k = strlen("<tool_call>");
    k += tc__skip_ws(s + k, n - k);
    size_t jl, used;
    tc__res r = tc__json_calls(p, s + k, n - k, false, NULL, &jl);
    if (r != TC_OK) return r == TC_BAD ? (*end = strlen("<tool_call>"), TC_BAD) : TC_MORE;
    if (tc__close(s + k + jl, n - k - jl, "</tool_call>", final, &used) == TC_MORE) return TC_MORE;
    *end = k + jl + used;
    return TC_OK;
}

/* qwen3_coder: <tool_call> <function=N> (<parameter=P>\nV\n</parameter>)*
 * </function> </tool_call>; seed_oss: the same in <seed:tool_call>. */
static tc__res tc__coder(toolcall_parser *p, const char *s, size_t n, bool final, size_t *end,
                         const char *open, const char *close) {
    size_t mk = strlen(open), k = mk;
    *end = mk;
    k += tc__skip_ws(s + k, n - k);
    int m = tc__lit(s + k, n - k, "<function=");
    if (m <= 0) return m == 0 ? TC_MORE : TC_BAD;
    k += strlen("<function=");
    const char *gt = memchr(s + k, '>', n - k);
    if (!gt) return n - k > 256 ? TC_BAD : TC_MORE;
    size_t nlen = (size_t)(gt - (s + k));
    char name[257];
    if (!tc__name_copy(name, s + k, nlen)) return TC_BAD;
    k += nlen + 1;
    json_t *args = json_object();
    if (!args) return p->oom = true, TC_BAD;
    tc__res r = TC_BAD;
    for (int np = 0;; np++) {
        int t = tc__next(s, n, &k, "<parameter=", "</function>");
        if (t == 0) {
            r = TC_MORE;
            break;
        }
        if (t == 2) {
            k += strlen("</function>");
            size_t used;
            if (tc__close(s + k, n - k, close, final, &used) == TC_MORE) {
                r = TC_MORE;
                break;
            }
            if (!tc__add(p, name, nlen, args, NULL, 0)) return TC_BAD;
            *end = k + used;
            return TC_OK;
        }
        if (t != 1 || np >= TOOLCALL_MAX_PARAMS) break;
        k += strlen("<parameter=");
        const char *pg = memchr(s + k, '>', n - k);
        if (!pg) {
            r = n - k > 256 ? TC_BAD : TC_MORE;
            break;
        }
        size_t pl = (size_t)(pg - (s + k));
        char pname[257];
        if (!tc__name_copy(pname, s + k, pl)) break;
        k += pl + 1;
        const char *ve = tc__find(s + k, n - k, "</parameter>");
        if (!ve) {
            r = TC_MORE;
            break;
        }
        const char *v = s + k;
        size_t vl = (size_t)(ve - v);
        if (vl && v[0] == '\n') v++, vl--; // the template writes "\n" V "\n"
        if (vl && v[vl - 1] == '\n') vl--;
        json_t *val = tc__value(p, name, pname, v, vl, -1);
        if (!val || json_object_set_new(args, pname, val)) break;
        k = (size_t)(ve - s) + strlen("</parameter>");
    }
    json_decref(args);
    return r;
}

/* glm45: <tool_call>N (<arg_key>K</arg_key> <arg_value>V</arg_value>)* </tool_call> */
static tc__res tc__glm(toolcall_parser *p, const char *s, size_t n, bool final, size_t *end) {
    size_t mk = strlen("<tool_call>"), k = mk;
    *end = mk;
    const char *lt = memchr(s + k, '<', n - k);
    if (!lt) return n - k > 300 ? TC_BAD : TC_MORE;
    const char *nb = s + k, *ne = lt;
    tc__trim(&nb, &ne);
    size_t nlen = (size_t)(ne - nb);
    char name[257];
    if (!tc__name_copy(name, nb, nlen)) return TC_BAD;
    k = (size_t)(lt - s);
    json_t *args = json_object();
    if (!args) return p->oom = true, TC_BAD;
    tc__res r = TC_BAD;
    for (int np = 0;; np++) {
        k += tc__skip_ws(s + k, n - k);
        if (k == n) {
            r = final ? TC_OK : TC_MORE; // the end tag may be missing at the very end
            if (r == TC_OK) {
                if (!tc__add(p, name, nlen, args, NULL, 0)) return TC_BAD;
                *end = k;
                return TC_OK;
            }
            break;
        }
        int t = tc__next(s, n, &k, "<arg_key>", "</tool_call>");
        if (t == 0) {
            r = TC_MORE;
            break;
        }
        if (t == 2) {
            if (!tc__add(p, name, nlen, args, NULL, 0)) return TC_BAD;
            *end = k + strlen("</tool_call>");
            return TC_OK;
        }
        if (t != 1 || np >= TOOLCALL_MAX_PARAMS) break;
        k += strlen("<arg_key>");
        const char *ke = tc__find(s + k, n - k, "</arg_key>");
        if (!ke) {
            r = TC_MORE;
            break;
        }
        size_t kl = (size_t)(ke - (s + k));
        char key[257];
        if (!tc__name_copy(key, s + k, kl)) break;
        k = (size_t)(ke - s) + strlen("</arg_key>");
        k += tc__skip_ws(s + k, n - k);
        int c = tc__lit(s + k, n - k, "<arg_value>");
        if (c <= 0) {
            r = c == 0 ? TC_MORE : TC_BAD;
            break;
        }
        k += strlen("<arg_value>");
        const char *ve = tc__find(s + k, n - k, "</arg_value>");
        if (!ve) {
            r = TC_MORE;
            break;
        }
        json_t *val = tc__value(p, name, key, s + k, (size_t)(ve - (s + k)), -1);
        if (!val || json_object_set_new(args, key, val)) break;
        k = (size_t)(ve - s) + strlen("</arg_value>");
    }
    json_decref(args);
    return r;
}

/* llama3: [<|python_tag|>] {"name": N, "parameters": {...}} */
static tc__res tc__llama3(toolcall_parser *p, const char *s, size_t n, size_t mk, size_t *end) {
    size_t k = mk + tc__skip_ws(s + mk, n - mk), jl;
    tc__res r = tc__json_calls(p, s + k, n - k, false, NULL, &jl);
    if (r == TC_OK)
        *end = k + jl;
    else if (r == TC_BAD)
        *end = mk ? mk : (tc__json_span(s, n, &jl) == TC_OK ? jl : 1);
    return r;
}

/* mistral: [TOOL_CALLS] [{...}, ...]  |  [TOOL_CALLS]N[CALL_ID]ID[ARGS]{...} */
static tc__res tc__mistral(toolcall_parser *p, const char *s, size_t n, size_t *end) {
    size_t mk = strlen("[TOOL_CALLS]"), k = mk, jl;
    *end = mk;
    k += tc__skip_ws(s + k, n - k);
    if (k == n) return TC_MORE;
    if (s[k] == '[' && tc__lit(s + k, n - k, "[ARGS]") < 0 &&
        tc__lit(s + k, n - k, "[CALL_ID]") < 0) {
        tc__res r = tc__json_calls(p, s + k, n - k, true, "id", &jl);
        if (r == TC_OK) *end = k + jl;
        return r;
    }
    size_t nb = k;
    while (k < n && s[k] != '[' && k - nb <= 256)
        k++;
    if (k == n) return k - nb > 256 ? TC_BAD : TC_MORE;
    size_t nlen = k - nb;
    const char *id = NULL;
    size_t id_len = 0;
    int m = tc__lit(s + k, n - k, "[CALL_ID]");
    if (m == 0) return TC_MORE;
    if (m == 1) {
        k += strlen("[CALL_ID]");
        id = s + k;
        while (k < n && s[k] != '[' && (size_t)(s + k - id) <= 40)
            k++;
        if (k == n) return TC_MORE;
        id_len = (size_t)(s + k - id);
    }
    m = tc__lit(s + k, n - k, "[ARGS]");
    if (m <= 0) return m == 0 ? TC_MORE : TC_BAD;
    k += strlen("[ARGS]");
    k += tc__skip_ws(s + k, n - k);
    tc__res r = tc__json_span(s + k, n - k, &jl);
    if (r != TC_OK) return r;
    json_t *args = tc__json(s + k, jl, 0);
    if (!args || !tc__add(p, s + nb, nlen, args, id, id_len)) return TC_BAD;
    *end = k + jl;
    return TC_OK;
}

/* nemotron, apriel, granite, firefunction: MARKER [{"name": N, "arguments":
 * {...}}, ...] [CLOSE]; the JSON starts mk bytes in, close NULL: none. */
static tc__res tc__jsonlist(toolcall_parser *p, const char *s, size_t n, bool final, size_t *end,
                            size_t mk, const char *close) {
    size_t k = mk + tc__skip_ws(s + mk, n - mk), jl, used = 0;
    *end = s[0] == 'f' ? mk + 1 : mk; // a bad call: the marker ("functools[" whole) is content
    tc__res r = tc__json_calls(p, s + k, n - k, true, NULL, &jl);
    if (r != TC_OK) return r;
    if (close && tc__close(s + k + jl, n - k - jl, close, final, &used) == TC_MORE) return TC_MORE;
    *end = k + jl + used;
    return TC_OK;
}

/* The markers of a sectioned format (deepseek, kimi_k2). */
typedef struct tc__sect {
    const char *begin, *end, *call, *sep, *call_end;
} tc__sect;

/* One call's body between the call marker and its end marker. */
static bool tc__sect_call(toolcall_parser *p, const char *b, size_t n, const char *sep) {
    const char *sp = tc__find(b, n, sep);
    if (!sp) return false;
    const char *l = b, *le = sp, *r = sp + strlen(sep);
    tc__trim(&l, &le);
    size_t ll = (size_t)(le - l), rl = n - (size_t)(r - b);
    if (p->cfg.format == TOOLCALL_KIMI_K2) {
        // "functions.NAME:IDX": the whole string is the call's id
        const char *nm = l;
        size_t nl = ll;
        if (nl > 10 && !memcmp(nm, "functions.", 10)) nm += 10, nl -= 10;
        const char *colon = memrchr(nm, ':', nl);
        if (colon) nl = (size_t)(colon - nm);
        size_t k = tc__skip_ws(r, rl), jl;
        if (tc__json_span(r + k, rl - k, &jl) != TC_OK) return false;
        return tc__add(p, nm, nl, tc__json(r + k, jl, 0), l, ll);
    }
    const char *fence = tc__find(r, rl, "```");
    if (fence && ll == 8 &&
        !memcmp(l, "function", 8)) { // R1/V3: "function" SEP NAME \n ```json \n {...} \n ```
        const char *nm = r, *ne = fence;
        tc__trim(&nm, &ne);
        const char *js = fence + 3, *end = r + rl;
        if (end - js >= 4 && !memcmp(js, "json", 4)) js += 4;
        const char *close = tc__find(js, (size_t)(end - js), "```");
        if (!close) return false;
        size_t k = tc__skip_ws(js, (size_t)(close - js)), jl;
        if (tc__json_span(js + k, (size_t)(close - js) - k, &jl) != TC_OK) return false;
        return tc__add(p, nm, (size_t)(ne - nm), tc__json(js + k, jl, 0), NULL, 0);
    }
    // V3.1: NAME SEP {...}
    size_t k = tc__skip_ws(r, rl), jl;
    if (tc__json_span(r + k, rl - k, &jl) != TC_OK ||
        tc__skip_ws(r + k + jl, rl - k - jl) != rl - k - jl)
        return false;
    return tc__add(p, l, ll, tc__json(r + k, jl, 0), NULL, 0);
}

static tc__res tc__sectioned(toolcall_parser *p, const tc__sect *m, const char *s, size_t n,
                             bool final, size_t *end) {
    size_t k = 0;
    bool section = tc__lit(s, n, m->begin) == 1;
    if (section) k = strlen(m->begin);
    *end = section ? strlen(m->begin) : strlen(m->call);
    for (int nc = 0;; nc++) {
        if (!section && nc) return *end = k, TC_OK; // a lone call: one at a time
        size_t w = tc__skip_ws(s + k, n - k);
        if (k + w == n) {
            if (!final) return TC_MORE;
            if (!nc) return TC_BAD;
            *end = k; // the section's end marker may be missing at the very end
            return TC_OK;
        }
        int c = tc__lit(s + k + w, n - k - w, m->call);
        int e = section ? tc__lit(s + k + w, n - k - w, m->end) : -1;
        if (c == 0 || e == 0) return final ? (nc ? (*end = k, TC_OK) : TC_BAD) : TC_MORE;
        if (e == 1) return *end = k + w + strlen(m->end), nc ? TC_OK : TC_BAD;
        if (c != 1) { // something else: the calls end here
            if (!nc) return TC_BAD;
            *end = k;
            return TC_OK;
        }
        size_t b = k + w + strlen(m->call);
        const char *ce = tc__find(s + b, n - b, m->call_end);
        if (!ce) return final ? (nc ? (*end = k, TC_OK) : TC_BAD) : TC_MORE;
        if (!tc__sect_call(p, s + b, (size_t)(ce - (s + b)), m->sep)) return TC_BAD;
        k = (size_t)(ce - s) + strlen(m->call_end);
        *end = k;
    }
}

/* dsml: <｜DSML｜function_calls> (<｜DSML｜invoke name="N"> (<｜DSML｜parameter
 * name="K" string="B">V</｜DSML｜parameter>)* </｜DSML｜invoke>)* </...> */
static tc__res tc__dsml(toolcall_parser *p, const char *s, size_t n, bool final, size_t *end) {
    const char *kind =
        tc__lit(s, n, DSML "function_calls>") == 1 ? "function_calls>" : "tool_calls>";
    char close[64];
    snprintf(close, sizeof close, "</" DSML_T "%s", kind);
    size_t k = strlen(DSML) + strlen(kind);
    *end = k;
    for (int nc = 0;; nc++) {
        k += tc__skip_ws(s + k, n - k);
        if (k == n) {
            if (!final) return TC_MORE;
            if (!nc) return TC_BAD;
            return *end = k, TC_OK;
        }
        int t = tc__next(s, n, &k, DSML "invoke name=\"", close);
        if (t == 0) return final ? (nc ? (*end = k, TC_OK) : TC_BAD) : TC_MORE;
        if (t == 2) return *end = k + strlen(close), nc ? TC_OK : TC_BAD;
        if (t != 1) return nc ? (*end = k, TC_OK) : TC_BAD;
        const char *ie = tc__find(s + k, n - k, "</" DSML_T "invoke>");
        if (!ie) return final ? (nc ? (*end = k, TC_OK) : TC_BAD) : TC_MORE;
        // one invoke, whole: header, then parameters
        const char *q = s + k + strlen(DSML "invoke name=\""), *e = ie;
        const char *qe = memchr(q, '"', (size_t)(e - q));
        char name[257];
        if (!qe || qe + 1 >= e || qe[1] != '>' || !tc__name_copy(name, q, (size_t)(qe - q)))
            return TC_BAD;
        json_t *args = json_object();
        if (!args) return p->oom = true, TC_BAD;
        const char *c = qe + 2;
        for (int np = 0;; np++) {
            c += tc__skip_ws(c, (size_t)(e - c));
            if (c == e) break;
            const char *pre = DSML "parameter name=\"";
            if (np >= TOOLCALL_MAX_PARAMS || tc__lit(c, (size_t)(e - c), pre) != 1) goto bad;
            c += strlen(pre);
            const char *pe = memchr(c, '"', (size_t)(e - c));
            char pname[257];
            if (!pe || !tc__name_copy(pname, c, (size_t)(pe - c))) goto bad;
            const char *gt = memchr(pe, '>', (size_t)(e - pe));
            if (!gt) goto bad;
            int as_string = -1;
            if (tc__find(pe, (size_t)(gt - pe), "string=\"true\""))
                as_string = 1;
            else if (tc__find(pe, (size_t)(gt - pe), "string=\"false\""))
                as_string = 0;
            const char *ve = tc__find(gt + 1, (size_t)(e - gt - 1), "</" DSML_T "parameter>");
            if (!ve) goto bad;
            json_t *val = tc__value(p, name, pname, gt + 1, (size_t)(ve - gt - 1), as_string);
            if (!val || json_object_set_new(args, pname, val)) goto bad;
            c = ve + strlen("</" DSML_T "parameter>");
        }
        if (!tc__add(p, name, strlen(name), args, NULL, 0)) return TC_BAD;
        k = (size_t)(ie - s) + strlen("</" DSML_T "invoke>");
        *end = k;
        continue;
    bad:
        json_decref(args);
        return TC_BAD;
    }
}

/* One value of Gemma 4's argument notation at s + *k (*k moves past it):
 * <|"|>text<|"|> a string, {key:value,...} with bare keys an object,
 * [value,...] an array, else a JSON number or literal up to the next , } ]
 * (text that is not JSON: a string). 1 with *out (owned), 0 the text ends
 * inside it, -1 malformed. */
static int tc__g4_value(const char *s, size_t n, size_t *k, int depth, json_t **out) {
    static const char Q[] = "<|\"|>";
    const size_t ql = sizeof Q - 1;
    *out = NULL;
    if (*k >= n) return 0;
    if (depth > TOOLCALL_MAX_DEPTH) return -1;
    int m = tc__lit(s + *k, n - *k, Q);
    if (m == 0) return 0;
    if (m == 1) {
        const char *e = tc__find(s + *k + ql, n - *k - ql, Q);
        if (!e) return 0;
        const char *b = s + *k + ql;
        *out = json_stringn(b, (size_t)(e - b)); // NULL: not UTF-8
        *k = (size_t)(e - s) + ql;
        return *out ? 1 : -1;
    }
    const char c = s[*k];
    if (c == '{' || c == '[') {
        json_t *o = c == '{' ? json_object() : json_array();
        if (!o) return -1;
        (*k)++;
        for (int i = 0;; i++) {
            if (*k >= n) goto more;
            if (s[*k] == (c == '{' ? '}' : ']') && i == 0) break;
            char key[257] = "";
            if (c == '{') { // a bare key up to ':'
                size_t ks = *k;
                while (*k < n && s[*k] != ':' && s[*k] != '}' && s[*k] != ',' && *k - ks <= 256)
                    (*k)++;
                if (*k >= n) goto more;
                if (s[*k] != ':' || !tc__name_copy(key, s + ks, *k - ks)) goto bad;
                (*k)++;
            }
            json_t *v;
            int r = tc__g4_value(s, n, k, depth + 1, &v);
            if (r <= 0) {
                json_decref(o);
                return r;
            }
            if (c == '{' ? json_object_set_new(o, key, v) : json_array_append_new(o, v)) goto bad;
            if (*k >= n) goto more;
            if (s[*k] == ',') {
                (*k)++;
                continue;
            }
            if (s[*k] != (c == '{' ? '}' : ']')) goto bad;
            break;
        }
        (*k)++;
        *out = o;
        return 1;
    more:
        json_decref(o);
        return 0;
    bad:
        json_decref(o);
        return -1;
    }
    size_t b = *k; // a literal: up to , } ]
    while (*k < n && s[*k] != ',' && s[*k] != '}' && s[*k] != ']' && s[*k] != '<' &&
           *k - b < 64)
        (*k)++;
    if (*k >= n) return 0;
    if (*k == b || s[*k] == '<') return -1;
    json_t *j = tc__json(s + b, *k - b, JSON_DECODE_ANY);
    *out = j && !json_is_object(j) && !json_is_array(j) ? j : json_stringn(s + b, *k - b);
    if (j && *out != j) json_decref(j);
    return *out ? 1 : -1;
}

/* Gemma 4: <|tool_call>call:NAME{args}<tool_call|> (one call a marker). */
static tc__res tc__gemma4(toolcall_parser *p, const char *s, size_t n, bool final, size_t *end) {
    size_t k = strlen("<|tool_call>");
    int m = tc__lit(s + k, n - k, "call:");
    if (m < 0) return TC_BAD;
    if (m == 0) return final ? TC_BAD : TC_MORE;
    k += 5;
    const char *br = memchr(s + k, '{', n - k > 257 ? 257 : n - k);
    char name[257];
    if (!br) return final || n - k > 256 ? TC_BAD : TC_MORE;
    if (!tc__name_copy(name, s + k, (size_t)(br - s - k))) return TC_BAD;
    k = (size_t)(br - s);
    json_t *args;
    int r = tc__g4_value(s, n, &k, 0, &args);
    if (r < 0) return TC_BAD;
    if (r == 0) return final ? TC_BAD : TC_MORE;
    size_t used;
    tc__res cr = tc__close(s + k, n - k, "<tool_call|>", final, &used);
    if (cr == TC_MORE) {
        json_decref(args);
        return TC_MORE;
    }
    if (!tc__add(p, name, strlen(name), args, NULL, 0)) return TC_BAD;
    return *end = k + used, TC_OK;
}

/* The call (or section of calls) at s, which starts with start marker mi
 * of the format (mi -1: llama3's bare JSON object). */
static tc__res tc__call(toolcall_parser *p, int mi, const char *s, size_t n, bool final,
                        size_t *end) {
    static const tc__sect ds = {DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_SEP, DS_CALL_END};
    static const tc__sect kimi = {KIMI_CALLS_BEGIN, KIMI_CALLS_END, KIMI_CALL_BEGIN, KIMI_SEP,
                                  KIMI_CALL_END};
    switch (p->cfg.format) {
    case TOOLCALL_HERMES:
        return tc__hermes(p, s, n, final, end);
    case TOOLCALL_QWEN3_CODER:
        return tc__coder(p, s, n, final, end, "<tool_call>", "</tool_call>");
    case TOOLCALL_SEED_OSS:
        return tc__coder(p, s, n, final, end, "<seed:tool_call>", "</seed:tool_call>");
    case TOOLCALL_NEMOTRON:
        return tc__jsonlist(p, s, n, final, end, strlen("<TOOLCALL>"), "</TOOLCALL>");
    case TOOLCALL_APRIEL:
        return tc__jsonlist(p, s, n, final, end, strlen("<tool_calls>"), "</tool_calls>");
    case TOOLCALL_GRANITE:
        return tc__jsonlist(p, s, n, final, end, strlen("<|tool_call|>"), NULL);
    case TOOLCALL_FIREFUNCTION: // the marker's "[" opens the list
        return tc__jsonlist(p, s, n, final, end, strlen("functools"), NULL);
    case TOOLCALL_GLM45:
        return tc__glm(p, s, n, final, end);
    case TOOLCALL_LLAMA3:
        return tc__llama3(p, s, n, mi < 0 ? 0 : strlen("<|python_tag|>"), end);
    case TOOLCALL_MISTRAL:
        return tc__mistral(p, s, n, end);
    case TOOLCALL_DEEPSEEK:
        return tc__sectioned(p, &ds, s, n, final, end);
    case TOOLCALL_KIMI_K2:
        return tc__sectioned(p, &kimi, s, n, final, end);
    case TOOLCALL_DSML:
        return tc__dsml(p, s, n, final, end);
    case TOOLCALL_GEMMA4:
        return tc__gemma4(p, s, n, final, end);
    default:
        return *end = n, TC_BAD;
    }
}

// ----------------------------------------------------------------------------
// The machine

/* Settles what it can of p->pend (all of it when final). */
static void tc__run(toolcall_parser *p, bool final) {
    const char *buf = p->pend.p ? p->pend.p : "";
    size_t len = p->pend.len, pos = 0;
    const toolcall_cfg *c = &p->cfg;
    while (pos < len && !p->oom) {
        const char *s = buf + pos;
        size_t n = len - pos;
        if (p->phase == TC_START) {
            size_t k = tc__skip_ws(s, n);
            int m = k < n ? tc__lit(s + k, n - k, c->think_open) : 0;
            if (k > 4096) m = -1; // no think block after that much whitespace: bounds the wait
            if (m == 1) {
                pos += k + strlen(c->think_open);
                p->phase = TC_REASONING;
                continue;
            }
            if (m == 0 && !final) break;
            p->phase = TC_CONTENT;
            continue;
        }
        if (p->phase == TC_REASONING) {
            const char *e = tc__find(s, n, c->think_close);
            if (e) {
                tc__reasoning(p, s, (size_t)(e - s));
                pos += (size_t)(e - s) + strlen(c->think_close);
                p->phase = TC_CONTENT;
                p->after_think = true;
                continue;
            }
            const char *const close[] = {c->think_close, NULL};
            size_t hold = final ? 0 : tc__hold(s, n, close);
            tc__reasoning(p, s, n - hold);
            pos += n - hold;
            break;
        }
        // TC_CONTENT
        if (p->after_think) {
            size_t k = tc__skip_ws(s, n);
            pos += k;
            if (k == n) break;
            p->after_think = false;
            continue;
        }
        const char *const *starts = tc__starts(c->format);
        size_t at = n;
        int mi = -2;
        if (c->format == TOOLCALL_LLAMA3 && !p->content_nonws) {
            size_t k = tc__skip_ws(s, n); // a bare JSON call is the whole answer
            if (k < n && s[k] == '{') at = k, mi = -1;
        }
        for (int i = 0; starts[i]; i++) {
            const char *f = tc__find(s, at, starts[i]);
            if (f && (size_t)(f - s) < at) at = (size_t)(f - s), mi = i;
        }
        if (mi == -2) {
            size_t hold = final ? 0 : tc__hold(s, n, starts);
            tc__content(p, s, n - hold);
            pos += n - hold;
            break;
        }
        tc__content(p, s, at);
        pos += at;
        // A call is parsed within TOOLCALL_MAX_CALL_BYTES of its marker, as if
        // the answer ended there: a longer one is content. That bounds the work
        // of re-parsing an open call on every push, and the verdict is the same
        // however the text was split (the parser sees the same window).
        size_t win = n - at, end = 0;
        bool fin = final;
        if (win > TOOLCALL_MAX_CALL_BYTES) win = TOOLCALL_MAX_CALL_BYTES, fin = true;
        int n0 = p->n_calls;
        tc__res r = tc__call(p, mi, s + at, win, fin, &end);
        if (r == TC_MORE) end = win; // the text ended inside it: content
        if (end > win) end = win;
        if (end == 0) r = TC_BAD, end = 1; // every verdict consumes its marker; never loop
        if (r != TC_OK) {                  // calls added by a parse that failed later are dropped
            while (p->n_calls > n0)
                tc__call_free(&p->calls[--p->n_calls]);
            if (r == TC_MORE && !fin) break;
            tc__content(p, s + at, end);
        }
        pos += end;
    }
    if (pos) {
        memmove(p->pend.p, p->pend.p + pos, len - pos);
        p->pend.len = len - pos;
        p->pend.p[p->pend.len] = '\0';
    }
}

// ----------------------------------------------------------------------------
// harmony (gpt-oss): messages, each a header, a body and an end

/* What ends a message (the first three), and what starts a header mid-text. */
static const char *const tc__h_marks[] = {"<|end|>",   "<|call|>",    "<|return|>",
                                          "<|start|>", "<|channel|>", NULL};
#define TC_H_ENDS 3
#define TC_H_HEAD_MAX 512 /* a header is shorter than this, or it is none */

/* A message's header. */
typedef struct tc__hhead {
    size_t len;       /* its bytes, through <|message|> */
    bool analysis;    /* the analysis channel, to no recipient */
    const char *name; /* to functions.NAME: NAME (name_len bytes, in the text); else NULL */
    size_t name_len;
} tc__hhead;

/* The header at s: 1 whole (*h), 0 more text may make one, -1 none. The
 * answer's first message, whose "<|start|>assistant" was the prompt's, may
 * start at its recipient (first: " to=functions.N<|channel|>...", s past
 * the space). */
static int tc__hheader(const char *s, size_t n, bool first, bool final, tc__hhead *h) {
    static const char *const opens[] = {"<|start|>", "<|channel|>", "to=", NULL};
    int m = -1;
    for (int i = 0; opens[i] && (i < 2 || first); i++) {
        int r = tc__lit(s, n, opens[i]);
        if (r > m) m = r;
    }
    if (m < 0) return -1;
    size_t w = n < TC_H_HEAD_MAX ? n : TC_H_HEAD_MAX;
    const char *e = m == 1 ? tc__find(s, w, "<|message|>") : NULL;
    size_t hl = e ? (size_t)(e - s) : w;
    for (int i = 0; i < TC_H_ENDS; i++) // an end before <|message|>: no header
        if (tc__find(s, hl, tc__h_marks[i])) return -1;
    if (!e) return final || n >= TC_H_HEAD_MAX ? -1 : 0;
    *h = (tc__hhead){.len = hl + strlen("<|message|>")};
    const char *to = tc__find(s, hl, "to="), *ch = tc__find(s, hl, "<|channel|>");
    if (to) {
        const char *r = to + 3, *re = r;
        while (re < s + hl && !tc__isws(*re) && *re != '<')
            re++;
        if (tc__lit(r, (size_t)(re - r), "functions.") == 1)
            h->name = r + 10, h->name_len = (size_t)(re - r) - 10;
    } else if (ch) {
        ch += strlen("<|channel|>");
        size_t l = (size_t)(s + hl - ch);
        h->analysis = l >= 8 && !memcmp(ch, "analysis", 8) &&
                      (l == 8 || tc__isws(ch[8]) || ch[8] == '<');
    }
    return 1;
}

/* A call's text: header h at s, its JSON arguments (within
 * TOOLCALL_MAX_CALL_BYTES). TC_OK with *end past the arguments; TC_MORE;
 * TC_BAD with *end past what is content (the header, and the arguments when
 * they end but do not parse). */
static tc__res tc__hcall(toolcall_parser *p, const tc__hhead *h, const char *s, size_t n,
                         bool final, size_t *end) {
    const char *a = s + h->len;
    size_t an = n - h->len, w = an < TOOLCALL_MAX_CALL_BYTES ? an : TOOLCALL_MAX_CALL_BYTES;
    size_t j = tc__skip_ws(a, w), je = 0;
    tc__res r = tc__json_span(a + j, w - j, &je);
    if (r == TC_MORE && !final && w == an) return TC_MORE;
    *end = h->len + (r == TC_OK ? j + je : r == TC_MORE ? w : 0);
    if (r != TC_OK) return TC_BAD;
    json_t *args = tc__json(a + j, je, 0);
    return args && tc__add(p, h->name, h->name_len, args, NULL, 0) ? TC_OK : TC_BAD;
}

/* tc__run for harmony: TC_START waits for a header, TC_REASONING and
 * TC_CONTENT are a body up to its end (dropped) or the next header. A
 * message to functions.N is a call when calls are parsed (else its body is
 * content); the analysis channel is reasoning when reasoning is split (else
 * content). The whitespace between messages is formatting. */
static void tc__run_harmony(toolcall_parser *p, bool final) {
    const char *buf = p->pend.p ? p->pend.p : "";
    size_t len = p->pend.len, pos = 0;
    while (pos < len && !p->oom) {
        const char *s = buf + pos;
        size_t n = len - pos;
        if (p->phase == TC_START) {
            bool first = !p->harmony_next && !p->content.len && !p->reasoning.len && !p->n_calls;
            size_t k = tc__skip_ws(s, n), end = 0;
            if (k == n && !final) break;
            tc__hhead h;
            int r = k > 4096 ? -1 : tc__hheader(s + k, n - k, first, final, &h);
            if (r == 0) break;
            if (r < 0) { // no header: content (the whitespace after a message is not)
                if (p->harmony_next) s += k, n -= k, pos += k;
                // a header's mark that starts none is content too (or it would be
                // read as a header again, forever)
                for (int i = TC_H_ENDS; tc__h_marks[i]; i++)
                    if (tc__lit(s, n, tc__h_marks[i]) == 1) {
                        size_t l = strlen(tc__h_marks[i]);
                        tc__content(p, s, l);
                        pos += l;
                    }
                p->harmony_next = false;
                p->phase = TC_CONTENT;
                continue;
            }
            p->harmony_next = false;
            if (h.name && p->cfg.format == TOOLCALL_HARMONY) {
                int n0 = p->n_calls;
                tc__res cr = tc__hcall(p, &h, s + k, n - k, final, &end);
                if (cr == TC_MORE) break;
                pos += k + end;
                if (cr == TC_OK) {
                    p->harmony_next = true; // its end (<|call|>) follows, if fed
                } else {                    // not a call: its text is content
                    while (p->n_calls > n0)
                        tc__call_free(&p->calls[--p->n_calls]);
                    tc__content(p, s + k, end);
                    p->phase = TC_CONTENT;
                }
                continue;
            }
            pos += k + h.len;
            p->phase = h.analysis && p->cfg.think_open ? TC_REASONING : TC_CONTENT;
            continue;
        }
        // a body, up to the first end or header
        size_t at = n;
        int mi = -1;
        for (int i = 0; tc__h_marks[i]; i++) {
            const char *f = tc__find(s, at, tc__h_marks[i]);
            if (f) at = (size_t)(f - s), mi = i;
        }
        if (mi < 0) at = n - (final ? 0 : tc__hold(s, n, tc__h_marks));
        if (p->phase == TC_REASONING)
            tc__reasoning(p, s, at);
        else
            tc__content(p, s, at);
        pos += at;
        if (mi < 0) break;
        if (mi < TC_H_ENDS) pos += strlen(tc__h_marks[mi]);
        p->phase = TC_START;
        p->harmony_next = true;
    }
    if (pos) {
        memmove(p->pend.p, p->pend.p + pos, len - pos);
        p->pend.len = len - pos;
        p->pend.p[p->pend.len] = '\0';
    }
}

/* The delta since the previous one. Content that is only whitespace so far
 * is held back while calls may come: beside calls it is no content at all
 * (the answer's content is null), so a stream never sends it. */
static void tc__delta(toolcall_parser *p, toolcall_delta *d, bool final) {
    d->content = p->content.p ? p->content.p + p->content_mark : "";
    d->content_len = p->content.len - p->content_mark;
    if (p->cfg.format != TOOLCALL_NONE && !p->content_nonws && (!final || p->n_calls)) {
        d->content_len = 0;
        if (final) p->content_mark = p->content.len; // never sent: null beside the calls
    } else {
        p->content_mark = p->content.len;
    }
    d->reasoning = p->reasoning.p ? p->reasoning.p + p->reasoning_mark : "";
    d->reasoning_len = p->reasoning.len - p->reasoning_mark;
    d->first_call = p->calls_mark;
    d->n_calls = p->n_calls - p->calls_mark;
    p->reasoning_mark = p->reasoning.len;
    p->calls_mark = p->n_calls;
}

ks_err toolcall_parser_push(toolcall_parser *p, const char *text, size_t len, toolcall_delta *d) {
    memset(d, 0, sizeof *d);
    d->content = d->reasoning = "";
    if (p->oom) return KS_ERR_NOMEM;
    if (p->finished) return KS_OK;
    if (len && !srv_buf_add(&p->pend, text, len)) return p->oom = true, KS_ERR_NOMEM;
    (p->harmony ? tc__run_harmony : tc__run)(p, false);
    if (p->oom) return KS_ERR_NOMEM;
    tc__delta(p, d, false);
    return KS_OK;
}

ks_err toolcall_parser_finish(toolcall_parser *p, toolcall_delta *d) {
    memset(d, 0, sizeof *d);
    d->content = d->reasoning = "";
    if (p->oom) return KS_ERR_NOMEM;
    if (p->finished) return KS_OK;
    p->finished = true;
    (p->harmony ? tc__run_harmony : tc__run)(p, true);
    if (p->oom) return KS_ERR_NOMEM;
    tc__delta(p, d, true);
    return KS_OK;
}

