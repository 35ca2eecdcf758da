/* toolcall.h — the model's output turned into OpenAI's shapes (server
 * module; the parser in src/server/toolcall.c, the request side in
 * src/server/toolcall_req.c): tool calls in each model family's own
 * format parsed into {id, name, arguments}, and the text between a
 * template's think markers split out as reasoning_content. One parser,
 * fed text incrementally (streaming) or all at once; either way the final
 * result is the same (tests/unit/test_server_toolcall.c feeds every split).
 *
 * Families and their formats (as their chat templates in ../shared/templates
 * render assistant tool calls):
 *   hermes       <tool_call>{"name": N, "arguments": {...}}</tool_call>
 *                (Hermes 2/3, Qwen2.5, Qwen3, QwQ, MiMo, Granite 4, ...)
 *   qwen3_coder  <tool_call><function=N><parameter=P>\nV\n</parameter>...
 *                </function></tool_call>
 *   llama3       {"name": N, "parameters": {...}} as the whole answer,
 *                optionally after <|python_tag|>
 *   mistral      [TOOL_CALLS][{"name": N, "arguments": {...}, "id"?}, ...] or
 *                [TOOL_CALLS]N[CALL_ID]ID[ARGS]{...} / [TOOL_CALLS]N[ARGS]{...}
 *   glm45        <tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
 *   deepseek     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N
 *                ```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (R1,
 *                V3) and <｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
 *                (V3.1)
 *   dsml         <｜DSML｜function_calls> (V3.2; V4: tool_calls) <｜DSML｜invoke
 *                name="N"><｜DSML｜parameter name="K" string="true|false">V
 *                </｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>
 *   kimi_k2      <|tool_calls_section_begin|><|tool_call_begin|>functions.N:I
 *                <|tool_call_argument_begin|>{...}<|tool_call_end|>...
 *                <|tool_calls_section_end|>
 *   nemotron     <TOOLCALL>[{"name": N, "arguments": {...}}, ...]</TOOLCALL>
 *   apriel       <tool_calls>[{"name": N, "arguments": {...}}, ...]</tool_calls>
 *   granite      <|tool_call|>[{"name": N, "arguments": {...}}, ...] (Granite 3.x)
 *   firefunction functools[{"name": N, "arguments": {...}}, ...]
 *   seed_oss     <seed:tool_call><function=N><parameter=P>V</parameter>...
 *                </function></seed:tool_call>
 *   harmony      (gpt-oss) a message to functions.N: [<|start|>assistant][ to=functions.N]
 *                <|channel|>commentary[ to=functions.N] [<|constrain|>]json<|message|>{...}
 *                [<|call|>] (the recipient in the role header or the channel header)
 *   gemma4       <|tool_call>call:N{k:v,...}<tool_call|>, values in the template's
 *                notation: strings between <|"|> marks, bare keys, JSON numbers and
 *                literals, nested {k:v} and [v,...]
 * Text that looks like a call but does not parse stays content: no byte of
 * the output is lost, except the whitespace right after a closing think
 * marker and before an opening one (formatting, as the templates strip it).
 *
 * Everything here is pure and single-threaded per object; nothing blocks. */
#ifndef KS_TOOLCALL_H
#define KS_TOOLCALL_H

#include "kvseal/base.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct srv_error srv_error;

/* Markers the parser (toolcall.c) reads and the call grammar
 * (toolcall_req.c) writes: DeepSeek's, DSML's and Kimi K2's. */
#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN "<｜tool▁call▁begin｜>"
#define DS_SEP "<｜tool▁sep｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DSML_T "｜DSML｜"
#define DSML "<" DSML_T
#define KIMI_CALLS_BEGIN "<|tool_calls_section_begin|>"
#define KIMI_CALLS_END "<|tool_calls_section_end|>"
#define KIMI_CALL_BEGIN "<|tool_call_begin|>"
#define KIMI_SEP "<|tool_call_argument_begin|>"
#define KIMI_CALL_END "<|tool_call_end|>"
/* gpt-oss's harmony format: the answer is a run of messages, each a header
 * up to <|message|>, a body and an end (<|end|>, <|call|>, <|return|>);
 * the analysis channel is the reasoning, a message to functions.N a call,
 * any other body content, and the headers and ends are formatting. */
#define HARMONY_ANALYSIS "<|channel|>analysis<|message|>"
#define HARMONY_END "<|end|>"
/* Gemma 4's thought channel: the reasoning. */
#define GEMMA4_THOUGHT "<|channel>thought\n"
#define GEMMA4_THOUGHT_END "<channel|>"

/* Tool-call formats (append-only). */
typedef enum toolcall_format {
    TOOLCALL_NONE = 0, /* no parsing: the output is content */
    TOOLCALL_HERMES = 1,
    TOOLCALL_QWEN3_CODER = 2,
    TOOLCALL_LLAMA3 = 3,
    TOOLCALL_MISTRAL = 4,
    TOOLCALL_GLM45 = 5,
    TOOLCALL_DEEPSEEK = 6,
    TOOLCALL_DSML = 7,
    TOOLCALL_KIMI_K2 = 8,
    TOOLCALL_NEMOTRON = 9,
    TOOLCALL_APRIEL = 10,
    TOOLCALL_GRANITE = 11,
    TOOLCALL_FIREFUNCTION = 12,
    TOOLCALL_SEED_OSS = 13,
    TOOLCALL_HARMONY = 14,
    TOOLCALL_GEMMA4 = 15,
    TOOLCALL__COUNT = 16,
} toolcall_format;

#define TOOLCALL_MAX_CALLS 64   /* calls kept per answer; later ones stay content */
#define TOOLCALL_MAX_TOOLS 128  /* tools per request */
#define TOOLCALL_MAX_DEPTH 64   /* JSON nesting in a call's arguments */
#define TOOLCALL_MAX_PARAMS 256 /* parameters of one XML-style call */
/* A call (or a section of calls), marker to end, longer than this is
 * content: it bounds the re-parsing of an open call to this many bytes per
 * push. */
#define TOOLCALL_MAX_CALL_BYTES 32768

/* The format a chat template's source text renders tool calls in, from its
 * distinctive markers; TOOLCALL_NONE when it has none (or src is NULL).
 * Pure; can't fail. */
toolcall_format toolcall_format_detect(const char *template_src);
/* Lower-case name ("hermes", ...; "none"); static storage, never NULL. */
const char *toolcall_format_name(toolcall_format f);
/* Parses a name as toolcall_format_name spells it (plus the aliases
 * "qwen", "qwen3-coder", "deepseek-r1", "deepseek-v3.1", "deepseek-v3.2",
 * "kimi-k2", "glm", "glm-4.5") into *out; false when unknown. */
bool toolcall_format_parse(const char *name, toolcall_format *out /* OUT */);

/* The think markers of a template's source ("<think>"/"</think>", Seed's
 * "<seed:think>"/"</seed:think>", Gemma 4's "<|channel>thought\n"/"<channel|>", or harmony's HARMONY_ANALYSIS /
 * HARMONY_END, whose content then starts after the final channel's header,
 * which the parser drops); false (and NULLs) when it has none.
 * The strings are static. Pure; can't fail. */
bool toolcall_think_detect(const char *template_src, const char **open /* OUT */,
                           const char **close /* OUT */);
/* True when a rendered prompt leaves the answer inside a think block: its
 * last non-whitespace text is the open marker (DeepSeek-R1's and QwQ's
 * generation prompts end with "<think>\n"). Pure; can't fail. */
bool toolcall_prompt_opens_think(const char *prompt, size_t len, const char *open);

/* What to parse. Strings and tools are borrowed for the parser's life. */
typedef struct toolcall_cfg {
    toolcall_format format;               /* NONE: no calls, only reasoning (if any) */
    const char *think_open, *think_close; /* both NULL: no reasoning split */
    bool in_reasoning;                    /* the output starts inside the think block */
    const json_t *tools;                  /* the request's tools (array) or NULL: parameter
                                             types for the XML-style formats' values */
} toolcall_cfg;

/* True when piece (a special token's text) is one of cfg's markers, or
 * part of one (harmony's markers are several tokens): the think markers or
 * a tool-call marker of its format. The server feeds such
 * tokens' text to the parser (the detokenizer drops control tokens' text,
 * and some families' markers are control tokens), and no other special
 * token's. Pure; can't fail. */
bool toolcall_is_marker(const toolcall_cfg *cfg, const char *piece, size_t n);

/* One parsed call. */
typedef struct toolcall_call {
    char id[48];     /* "call_" + 24 hex digits (mistral: 9 alphanumerics; kimi_k2: the model's) */
    char *name;      /* malloc'd, NUL-terminated */
    char *arguments; /* malloc'd compact JSON object text (see toolcall.c on numbers) */
} toolcall_call;

typedef struct toolcall_parser toolcall_parser;

/* New text since the previous push: pointers valid until the next call on
 * the parser. Content that is only whitespace so far is held back while a
 * call may still come, and never sent when calls came (the answer's
 * content is then null); otherwise the deltas add up to the content. */
typedef struct toolcall_delta {
    const char *content; /* (content_len) */
    size_t content_len;
    const char *reasoning; /* (reasoning_len) */
    size_t reasoning_len;
    int first_call; /* toolcall_parser_call(p, first_call .. first_call + n_calls - 1) are new */
    int n_calls;
} toolcall_delta;

/* A parser for one answer. cfg is copied (its pointers stay borrowed).
 * Errors: KS_ERR_NOMEM. Caller owns *out (toolcall_parser_destroy). */
ks_err toolcall_parser_create(const toolcall_cfg *cfg, toolcall_parser **out /* OUT */) KS_MUST_USE;
/* Frees; accepts NULL. */
void toolcall_parser_destroy(toolcall_parser *p);
/* Feeds the next piece of generated text; *d gets what can no longer change:
 * content and reasoning text (a possible start of a marker is held back, as
 * stop strings are) and the calls completed by this piece. KS_ERR_NOMEM
 * (the parser is then unusable). After toolcall_parser_finish: nothing. */
ks_err toolcall_parser_push(toolcall_parser *p, const char *text, size_t len,
                            toolcall_delta *d /* OUT */) KS_MUST_USE;
/* The text ended: what was held back is settled (an unfinished call is
 * content). KS_ERR_NOMEM. */
ks_err toolcall_parser_finish(toolcall_parser *p, toolcall_delta *d /* OUT */) KS_MUST_USE;
/* Calls so far; call i (0 <= i < n) is owned by the parser. */
int toolcall_parser_n_calls(const toolcall_parser *p);
const toolcall_call *toolcall_parser_call(const toolcall_parser *p, int i);
/* All content / reasoning so far (what the deltas added up to), not
 * NUL-terminated; owned by the parser. */
const char *toolcall_parser_content(const toolcall_parser *p, size_t *len /* OUT */);
const char *toolcall_parser_reasoning(const toolcall_parser *p, size_t *len /* OUT */);

// ----------------------------------------------------------------------------
// The request side: tools, tool_choice, parallel_tool_calls

typedef enum toolcall_choice {
    TOOLCALL_CHOICE_AUTO = 0, /* default with tools: the model decides */
    TOOLCALL_CHOICE_NONE = 1, /* no call: the output is not parsed for calls */
    TOOLCALL_CHOICE_REQUIRED = 2,
    TOOLCALL_CHOICE_NAMED = 3,
} toolcall_choice;

/* The validated tool fields of a chat request; pointers into its JSON. */
typedef struct toolcall_req {
    const json_t *tools; /* the "tools" array, NULL when absent or empty */
    toolcall_choice choice;
    const char *name; /* NAMED: the function */
    bool parallel;    /* parallel_tool_calls (default true): false keeps one call */
} toolcall_req;

/* Validates "tools", "tool_choice" and "parallel_tool_calls" of a chat body
 * (root) into *out. False with *err filled (400, param named): wrong types or
 * shapes, a function name OpenAI would refuse, tool_choice naming a function
 * that is not in tools, "required"/named without tools, and with
 * "required"/named a tool's parameters schema the schema compiler refuses
 * (param "tools[i].function.parameters"; "required" and a named function
 * are enforced by toolcall_grammar's grammar). Pure. */
bool toolcall_req_parse(json_t *root, toolcall_req *out /* OUT */, srv_error *err /* OUT */);

/* GBNF (llama.cpp's grammar syntax) for exactly one call, in format f, of
 * the function `name` or (NULL) of any of tools: what tool_choice
 * "required" / named will constrain decoding to. Arguments are any JSON
 * object (the schema compiler narrows them to the tool's parameters).
 * Returns a malloc'd string (caller frees), NULL on out-of-memory or for a
 * format without a grammar (NONE). Pure. */
char *toolcall_grammar(toolcall_format f, const json_t *tools, const char *name);

#endif /* KS_TOOLCALL_H */
