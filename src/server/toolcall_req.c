/* toolcall_req.c — the request side of tool calls (toolcall.h): the
 * formats by name and as detected in a chat template, the think markers
 * and whether a prompt opens them, tools / tool_choice /
 * parallel_tool_calls validated (toolcall_req_parse), and the grammar of
 * one call in a format (tool_choice required or named). The output parser
 * is toolcall.c. */
#include "toolcall.h"
#include "server_int.h"

#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Formats and their markers

static const char *const tc__names[TOOLCALL__COUNT] = {
    "none", "hermes",  "qwen3_coder", "llama3", "mistral", "glm45",        "deepseek",
    "dsml", "kimi_k2", "nemotron",    "apriel", "granite", "firefunction", "seed_oss", "harmony", "gemma4",
};

const char *toolcall_format_name(toolcall_format f) {
    return (unsigned)f < TOOLCALL__COUNT ? tc__names[f] : "none";
}

bool toolcall_format_parse(const char *name, toolcall_format *out) {
    static const struct {
        const char *alias;
        toolcall_format f;
    } aliases[] = {
        {"qwen", TOOLCALL_HERMES},
        {"qwen3-coder", TOOLCALL_QWEN3_CODER},
        {"deepseek-r1", TOOLCALL_DEEPSEEK},
        {"deepseek-v3.1", TOOLCALL_DEEPSEEK},
        {"deepseek-v3.2", TOOLCALL_DSML},
        {"kimi-k2", TOOLCALL_KIMI_K2},
        {"glm", TOOLCALL_GLM45},
        {"glm-4.5", TOOLCALL_GLM45},
        {"gpt-oss", TOOLCALL_HARMONY},
    };
    if (!name) return false;
    for (int i = 0; i < TOOLCALL__COUNT; i++)
        if (!strcmp(name, tc__names[i])) return *out = (toolcall_format)i, true;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(name, aliases[i].alias)) return *out = aliases[i].f, true;
    return false;
}

bool server_tool_call_format_parse(const char *name, int *out) {
    toolcall_format f;
    if (name && !strcmp(name, "auto")) return *out = -1, true;
    if (!toolcall_format_parse(name, &f)) return false;
    *out = (int)f;
    return true;
}

const char *server_tool_call_format_names(void) {
    return "auto, none, hermes, qwen3_coder, llama3, mistral, glm45, deepseek, dsml, kimi_k2, "
           "nemotron, apriel, granite, firefunction, seed_oss, harmony, gemma4";
}


toolcall_format toolcall_format_detect(const char *src) {
    if (!src) return TOOLCALL_NONE;
    // most specific first: several families share "<tool_call>"
    if (strstr(src, "<|channel|>") && strstr(src, "functions.")) return TOOLCALL_HARMONY;
    if (strstr(src, "<|tool_call>call:")) return TOOLCALL_GEMMA4;
    if (strstr(src, "｜DSML｜")) return TOOLCALL_DSML;
    if (strstr(src, DS_CALL_BEGIN)) return TOOLCALL_DEEPSEEK;
    if (strstr(src, KIMI_CALLS_BEGIN)) return TOOLCALL_KIMI_K2;
    if (strstr(src, "<arg_key>")) return TOOLCALL_GLM45;
    if (strstr(src, "<seed:tool_call>")) return TOOLCALL_SEED_OSS;
    if (strstr(src, "<TOOLCALL>")) return TOOLCALL_NEMOTRON;
    if (strstr(src, "<tool_calls>")) return TOOLCALL_APRIEL;
    if (strstr(src, "<|tool_call|>")) return TOOLCALL_GRANITE;
    if (strstr(src, "functools[")) return TOOLCALL_FIREFUNCTION;
    if (strstr(src, "<function=") && strstr(src, "<parameter=") && strstr(src, "<tool_call>"))
        return TOOLCALL_QWEN3_CODER;
    if (strstr(src, "[TOOL_CALLS]")) return TOOLCALL_MISTRAL;
    if (strstr(src, "<tool_call>")) return TOOLCALL_HERMES;
    if (strstr(src, "<|python_tag|>") ||
        (strstr(src, "<|start_header_id|>") && strstr(src, "\"parameters\"")))
        return TOOLCALL_LLAMA3;
    return TOOLCALL_NONE;
}

bool toolcall_think_detect(const char *src, const char **open, const char **close) {
    *open = *close = NULL;
    if (!src) return false;
    if (strstr(src, "<seed:think>")) {
        *open = "<seed:think>", *close = "</seed:think>";
        return true;
    }
    if (strstr(src, "<|channel>thought")) {
        *open = GEMMA4_THOUGHT, *close = GEMMA4_THOUGHT_END;
        return true;
    }
    if (strstr(src, "<|channel|>") && strstr(src, "analysis")) {
        *open = HARMONY_ANALYSIS, *close = HARMONY_END;
        return true;
    }
    if (strstr(src, "</think>")) {
        *open = "<think>", *close = "</think>";
        return true;
    }
    return false;
}

static bool tc__isws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool toolcall_prompt_opens_think(const char *prompt, size_t len, const char *open) {
    if (!prompt || !open) return false;
    while (len && tc__isws(prompt[len - 1]))
        len--;
    size_t ol = strlen(open);
    return len >= ol && !memcmp(prompt + len - ol, open, ol);
}


// ----------------------------------------------------------------------------
// The request side

#define TC_INVALID(err, param, ...) srv_refuse(err, ADMIT_INVALID, param, __VA_ARGS__)

/* OpenAI's rule for a function name: 1-64 of a-z A-Z 0-9 _ - */
static bool tc__fn_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

static bool tc__tools(json_t *tools, srv_error *err) {
    if (!json_is_array(tools)) return TC_INVALID(err, "tools", "'tools' must be an array");
    if (json_array_size(tools) > TOOLCALL_MAX_TOOLS)
        return TC_INVALID(err, "tools", "'tools' may hold at most %d tools, got %zu",
                          TOOLCALL_MAX_TOOLS, json_array_size(tools));
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char pn[64];
        snprintf(pn, sizeof pn, "tools[%zu]", i);
        json_t *ty = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        if (!json_is_object(t) || !json_is_string(ty) || strcmp(json_string_value(ty), "function"))
            return TC_INVALID(err, pn, "'%s' must be {\"type\": \"function\", \"function\": {...}}",
                              pn);
        snprintf(pn, sizeof pn, "tools[%zu].function", i);
        if (!json_is_object(fn)) return TC_INVALID(err, pn, "'%s' must be an object", pn);
        json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description"),
               *params = json_object_get(fn, "parameters"), *strict = json_object_get(fn, "strict");
        snprintf(pn, sizeof pn, "tools[%zu].function.name", i);
        if (!json_is_string(name) || !tc__fn_name_ok(json_string_value(name)))
            return TC_INVALID(err, pn,
                              "'%s' must be a string of 1 to 64 letters, digits, '_' or '-'", pn);
        for (size_t k = 0; k < i; k++) {
            json_t *other =
                json_object_get(json_object_get(json_array_get(tools, k), "function"), "name");
            if (json_equal(other, name))
                return TC_INVALID(err, pn, "'%s': the function '%s' is defined twice", pn,
                                  json_string_value(name));
        }
        snprintf(pn, sizeof pn, "tools[%zu].function.description", i);
        if (desc && !json_is_null(desc) && !json_is_string(desc))
            return TC_INVALID(err, pn, "'%s' must be a string", pn);
        snprintf(pn, sizeof pn, "tools[%zu].function.parameters", i);
        if (params && !json_is_null(params) && !json_is_object(params))
            return TC_INVALID(err, pn, "'%s' must be a JSON Schema object", pn);
        snprintf(pn, sizeof pn, "tools[%zu].function.strict", i);
        if (strict && !json_is_null(strict) && !json_is_boolean(strict))
            return TC_INVALID(err, pn, "'%s' must be a boolean", pn);
    }
    return true;
}

/* The function tool_choice names, if the tools have it. */
static bool tc__has_tool(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *nm = json_object_get(json_object_get(t, "function"), "name");
        if (json_is_string(nm) && !strcmp(json_string_value(nm), name)) return true;
    }
    return false;
}

/* tool_choice "required" / named constrains the arguments to the tool's
 * parameters schema (toolcall_grammar): a schema the compiler refuses (a
 * keyword it does not enforce, required names it cannot generate) is
 * refused here as response_format's is, never widened to any object. */
static bool tc__check_schemas(const toolcall_req *tr, srv_error *err) {
    size_t i;
    json_t *t;
    json_array_foreach(tr->tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        const json_t *params = json_object_get(fn, "parameters");
        if (!nm || !json_is_object(params) ||
            (tr->choice == TOOLCALL_CHOICE_NAMED && strcmp(nm, tr->name)))
            continue;
        char *g = NULL, param[64];
        ks_errbuf eb = {0};
        ks_err e = grammar_schema_gbnf(params, "t-", &g, &eb);
        free(g);
        if (e == KS_OK) continue;
        snprintf(param, sizeof param, "tools[%zu].function.parameters", i);
        if (e == KS_ERR_NOMEM)
            return srv_fail(err, 503, "overloaded", "out of memory compiling %s", param);
        return srv_refuse(err, e == KS_ERR_UNSUPPORTED ? ADMIT_UNSUPPORTED_PARAMETER : ADMIT_INVALID,
                          param,
                          "invalid '%s' (function '%.64s'; tool_choice constrains the arguments to "
                          "it): %s",
                          param, nm, eb.msg);
    }
    return true;
}

bool toolcall_req_parse(json_t *root, toolcall_req *out, srv_error *err) {
    memset(out, 0, sizeof *out);
    out->parallel = true;
    json_t *tools = json_object_get(root, "tools"), *tc = json_object_get(root, "tool_choice"),
           *par = json_object_get(root, "parallel_tool_calls");
    if (tools && !json_is_null(tools)) {
        if (!tc__tools(tools, err)) return false;
        if (json_array_size(tools)) out->tools = tools;
    }
    if (par && !json_is_null(par)) {
        if (!json_is_boolean(par))
            return TC_INVALID(err, "parallel_tool_calls",
                              "'parallel_tool_calls' must be a boolean");
        out->parallel = json_is_true(par);
    }
    if (!tc || json_is_null(tc)) return true;
    if (json_is_string(tc)) {
        const char *v = json_string_value(tc);
        if (!strcmp(v, "auto"))
            out->choice = TOOLCALL_CHOICE_AUTO;
        else if (!strcmp(v, "none"))
            out->choice = TOOLCALL_CHOICE_NONE;
        else if (!strcmp(v, "required"))
            out->choice = TOOLCALL_CHOICE_REQUIRED;
        else
            return TC_INVALID(
                err, "tool_choice",
                "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                "{\"type\": \"function\", \"function\": {\"name\": ...}}, got \"%.64s\"",
                v);
    } else {
        json_t *ty = json_object_get(tc, "type"), *fn = json_object_get(tc, "function");
        json_t *name = json_object_get(fn, "name");
        if (!json_is_object(tc) || !json_is_string(ty) ||
            strcmp(json_string_value(ty), "function") || !json_is_string(name))
            return TC_INVALID(err, "tool_choice",
                              "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        out->choice = TOOLCALL_CHOICE_NAMED;
        out->name = json_string_value(name);
    }
    if ((out->choice == TOOLCALL_CHOICE_REQUIRED || out->choice == TOOLCALL_CHOICE_NAMED) &&
        !out->tools)
        return TC_INVALID(err, "tool_choice", "'tool_choice' \"%s\" needs a non-empty 'tools'",
                          out->choice == TOOLCALL_CHOICE_NAMED ? out->name : "required");
    if (out->choice == TOOLCALL_CHOICE_NAMED && !tc__has_tool(out->tools, out->name))
        return TC_INVALID(err, "tool_choice",
                          "'tool_choice' names the function '%.64s', which is "
                          "not in 'tools'",
                          out->name);
    if (out->choice == TOOLCALL_CHOICE_REQUIRED || out->choice == TOOLCALL_CHOICE_NAMED)
        return tc__check_schemas(out, err);
    return true;
}

// ----------------------------------------------------------------------------
// The grammar of one call (for tool_choice required / named)

/* Appends a GBNF string literal of s ("..." with escapes). */
static bool tc__gbnf_lit(srv_buf *b, const char *s) {
    bool ok = srv_buf_add(b, "\"", 1);
    for (; *s && ok; s++) {
        char c = *s;
        if (c == '"' || c == '\\')
            ok = srv_buf_add(b, "\\", 1) && srv_buf_add(b, s, 1);
        else if (c == '\n')
            ok = srv_buf_add(b, "\\n", 2);
        else
            ok = srv_buf_add(b, s, 1);
    }
    return ok && srv_buf_add(b, "\"", 1);
}

/* Appends "call ::= ..." (one alternative per tool of tools, or only the one
 * named: its name as a literal, mid, then arguments) and each alternative's
 * argument rules: those of grammar_schema_gbnf for the tool's parameters
 * (prefix "tN-"), or the generic "object" rule where it has none (a
 * schema the compiler refuses was refused by toolcall_req_parse). */
static bool tc__gbnf_calls(srv_buf *b, const json_t *tools, const char *name, const char *mid) {
    srv_buf rules = {0};
    bool ok = srv_buf_add(b, "call ::= ", 9);
    size_t i;
    int n = 0;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (!nm || (name && strcmp(name, nm))) continue;
        char pfx[32], *g = NULL;
        snprintf(pfx, sizeof pfx, "t%zu-", i);
        const json_t *params = json_object_get(fn, "parameters");
        ks_errbuf eb = {0};
        const bool narrowed =
            json_is_object(params) && grammar_schema_gbnf(params, pfx, &g, &eb) == KS_OK;
        if (narrowed) ok = ok && srv_buf_add(&rules, g, strlen(g));
        free(g);
        ok = ok && (!n++ || srv_buf_add(b, " | ", 3)) && srv_buf_add(b, "(", 1) &&
             tc__gbnf_lit(b, nm) && srv_buf_add(b, " ", 1) && tc__gbnf_lit(b, mid) &&
             srv_buf_add(b, " ", 1) &&
             (narrowed ? srv_buf_add(b, pfx, strlen(pfx)) && srv_buf_add(b, "root", 4)
                       : srv_buf_add(b, "object", 6)) &&
             srv_buf_add(b, ")", 1);
    }
    ok = ok && n && srv_buf_add(b, "\n", 1) && (!rules.p || srv_buf_add(b, rules.p, rules.len));
    srv_buf_free(&rules);
    return ok;
}

static bool tc__gbnf_s(srv_buf *b, const char *s) { return srv_buf_add(b, s, strlen(s)); }

/* Gemma 4's call grammar: per allowed tool, its name and an object in the
 * template's notation whose keys are the tool's parameter names (none: the
 * empty object); values any in that notation (strings between <|"|>
 * marks: not narrowed by the schema, as the XML-style formats' text values
 * are not). Malloc'd; NULL on out-of-memory or no such tool. */
static char *tc__gbnf_gemma4(const json_t *tools, const char *name) {
    srv_buf b = {0}, pairs = {0};
    bool ok = tc__gbnf_s(&b, "root ::= \"<|tool_call>call:\" (");
    size_t i;
    int n = 0;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (!nm || (name && strcmp(name, nm))) continue;
        const json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
        char rule[32];
        snprintf(rule, sizeof rule, "t%zu-pair", i);
        ok = ok && (!n++ || tc__gbnf_s(&b, " | ")) && tc__gbnf_lit(&b, nm) &&
             tc__gbnf_s(&b, " \"{\" ");
        if (json_object_size(props)) { // tN-pair ::= ("key" | ...) ":" gval
            ok = ok && tc__gbnf_s(&b, "(") && tc__gbnf_s(&b, rule) && tc__gbnf_s(&b, " (\",\" ") &&
                 tc__gbnf_s(&b, rule) && tc__gbnf_s(&b, ")*)? ") && tc__gbnf_s(&pairs, rule) &&
                 tc__gbnf_s(&pairs, " ::= (");
            const char *key;
            json_t *v;
            int nk = 0;
            json_object_foreach((json_t *)props, key, v) {
                ok = ok && (!nk++ || tc__gbnf_s(&pairs, " | ")) && tc__gbnf_lit(&pairs, key);
            }
            ok = ok && tc__gbnf_s(&pairs, ") \":\" gval\n");
        }
        ok = ok && tc__gbnf_s(&b, "\"}\"");
    }
    ok = ok && n && tc__gbnf_s(&b, ") \"<tool_call|>\"\n") &&
         (!pairs.p || srv_buf_add(&b, pairs.p, pairs.len)) &&
         tc__gbnf_s(&b, "gval ::= \"<|\\\"|>\" [^<]* \"<|\\\"|>\" | \"-\"? [0-9]+ (\".\" [0-9]+)? | "
                        "\"true\" | \"false\" | \"null\" | \"{\" (gpair (\",\" gpair)*)? \"}\" | "
                        "\"[\" (gval (\",\" gval)*)? \"]\"\n"
                        "gpair ::= [a-zA-Z0-9_]{1,64} \":\" gval\n");
    srv_buf_free(&pairs);
    if (!ok) {
        srv_buf_free(&b);
        return NULL;
    }
    return b.p;
}

char *toolcall_grammar(toolcall_format f, const json_t *tools, const char *name) {
    // the call's text, around NAME (a literal) and ARGS (a JSON object);
    // qwen3_coder, seed_oss, glm45 and dsml write parameters as text instead
    static const struct {
        const char *pre, *mid, *post;
    } around[TOOLCALL__COUNT] = {
        [TOOLCALL_HERMES] = {"<tool_call>\n{\"name\": \"",
                             "\", \"arguments\": ", "}\n</tool_call>"},
        [TOOLCALL_LLAMA3] = {"{\"name\": \"", "\", \"parameters\": ", "}"},
        [TOOLCALL_MISTRAL] = {"[TOOL_CALLS]", "[ARGS]", ""},
        [TOOLCALL_DEEPSEEK] = {DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP, "\n```json\n",
                               "\n```" DS_CALL_END DS_CALLS_END},
        [TOOLCALL_KIMI_K2] = {KIMI_CALLS_BEGIN KIMI_CALL_BEGIN "functions.", ":0" KIMI_SEP,
                              KIMI_CALL_END KIMI_CALLS_END},
        [TOOLCALL_NEMOTRON] = {"<TOOLCALL>[{\"name\": \"", "\", \"arguments\": ", "}]</TOOLCALL>"},
        [TOOLCALL_APRIEL] = {"<tool_calls>[{\"name\": \"",
                             "\", \"arguments\": ", "}]</tool_calls>"},
        [TOOLCALL_GRANITE] = {"<|tool_call|>[{\"name\": \"", "\", \"arguments\": ", "}]"},
        [TOOLCALL_FIREFUNCTION] = {" functools[{\"name\": \"", "\", \"arguments\": ", "}]"},
        [TOOLCALL_HARMONY] = {"<|channel|>commentary to=functions.", " <|constrain|>json<|message|>",
                              ""},
    };
    const bool known = (unsigned)f < TOOLCALL__COUNT;
    const char *pre = known ? around[f].pre : NULL, *mid = known ? around[f].mid : NULL,
               *post = known ? around[f].post : NULL;
    static const char coder[] =
        "root ::= \"<tool_call>\\n<function=\" name \">\\n\" param* "
        "\"</function>\\n</tool_call>\"\n"
        "param ::= \"<parameter=\" [a-zA-Z0-9_-]+ \">\\n\" [^<]* \"\\n</parameter>\\n\"\n";
    static const char glm[] =
        "root ::= \"<tool_call>\" name \"\\n\" arg* \"</tool_call>\"\n"
        "arg ::= \"<arg_key>\" [a-zA-Z0-9_-]+ \"</arg_key>\\n<arg_value>\" [^<]* "
        "\"</arg_value>\\n\"\n";
    static const char dsml[] =
        "root ::= \"" DSML "function_calls>\\n" DSML "invoke name=\\\"\" name \"\\\">\\n\" param* "
        "\"</" DSML_T "invoke>\\n</" DSML_T "function_calls>\"\n"
        "param ::= \"" DSML "parameter name=\\\"\" [a-zA-Z0-9_-]+ \"\\\" string=\\\"\" "
        "(\"true\" | \"false\") \"\\\">\" [^<]* \"</" DSML_T "parameter>\\n\"\n";
    static const char json_rules[] =
        "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
        "object ::= \"{\" ws (string \":\" ws value (\",\" ws string \":\" ws value)*)? \"}\" ws\n"
        "array ::= \"[\" ws (value (\",\" ws value)*)? \"]\" ws\n"
        "string ::= \"\\\"\" ([^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
        "[0-9a-fA-F]{4}))* \"\\\"\" ws\n"
        "number ::= \"-\"? ([0-9] | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n"
        "ws ::= [ \\t\\n]{0,20}\n";
    srv_buf b = {0};
    bool ok = true;
    static const char seed[] =
        "root ::= \"<seed:tool_call>\\n<function=\" name \">\\n\" param* "
        "\"</function>\\n</seed:tool_call>\"\n"
        "param ::= \"<parameter=\" [a-zA-Z0-9_-]+ \">\" [^<]* \"</parameter>\\n\"\n";
    if (f == TOOLCALL_QWEN3_CODER)
        ok = srv_buf_add(&b, coder, sizeof coder - 1);
    else if (f == TOOLCALL_SEED_OSS)
        ok = srv_buf_add(&b, seed, sizeof seed - 1);
    else if (f == TOOLCALL_GLM45)
        ok = srv_buf_add(&b, glm, sizeof glm - 1);
    else if (f == TOOLCALL_DSML)
        ok = srv_buf_add(&b, dsml, sizeof dsml - 1);
    else if (f == TOOLCALL_GEMMA4) {
        char *g = tc__gbnf_gemma4(tools, name);
        if (!g) srv_buf_free(&b);
        return g;
    }
    else if (pre) { // JSON arguments: per tool, its name then what its parameters accept
        ok = srv_buf_add(&b, "root ::= ", 9) && tc__gbnf_lit(&b, pre) &&
             srv_buf_add(&b, " call ", 6) && tc__gbnf_lit(&b, post) && srv_buf_add(&b, "\n", 1) &&
             srv_buf_add(&b, json_rules, sizeof json_rules - 1) &&
             tc__gbnf_calls(&b, tools, name, mid);
        if (!ok) {
            srv_buf_free(&b);
            return NULL;
        }
        return b.p;
    } else
        return NULL;
    // name ::= the allowed names
    ok = ok && srv_buf_add(&b, "name ::= ", 9);
    size_t i, n_names = 0;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *nm = json_object_get(json_object_get(t, "function"), "name");
        if (!json_is_string(nm) || (name && strcmp(name, json_string_value(nm)))) continue;
        ok = ok && (!n_names++ || srv_buf_add(&b, " | ", 3)) &&
             tc__gbnf_lit(&b, json_string_value(nm));
    }
    ok = ok && n_names && srv_buf_add(&b, "\n", 1);
    if (!ok) {
        srv_buf_free(&b);
        return NULL;
    }
    return b.p;
}

