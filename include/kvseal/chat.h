/* chat.h — chat templates: turns a conversation into the prompt text a chat
 * model was trained on. Part of the tok module.
 *
 * chat_tmpl (src/tok/chat_tmpl.c) is what the server uses: the model's own
 * Jinja template (tokenizer.chat_template, or a file given by the operator)
 * run by the jinja module with Hugging Face's semantics, on OpenAI-shaped
 * messages (JSON). A model without a template gets the PLAIN format below.
 *
 * The fixed family formatters (src/tok/chat.c) predate the Jinja engine:
 * the family is detected from distinctive substrings of the template. They
 * stay as the PLAIN format's implementation and for tools that want a
 * template-free rendering; the server no longer detects families.
 *
 * The rendered text contains special tokens as TEXT ("<|im_start|>"). The
 * *_marked renderers also report where the request's text went (message
 * contents; with Jinja every string of messages, tools and kwargs), and the
 * caller tokenizes with tok_encode_marked(parse_special=true) over those
 * spans: only the markers the template writes become control tokens, and a
 * message that spells "<|im_end|>" stays text (issue 38).
 * BOS rule: a family whose template starts with BOS gets the BOS text at the
 * start of the rendered string only when the vocabulary does NOT add BOS
 * itself (!tok_add_bos(v)); otherwise tok_encode adds it, so it appears
 * exactly once either way. BOS/EOS inside the conversation (Llama 2's
 * "</s><s>", Mistral's "</s>") are always rendered as text.
 *
 * Everything here is pure and thread-safe; nothing blocks. */
#ifndef KS_CHAT_H
#define KS_CHAT_H

#include "kvseal/base.h"
#include "kvseal/gguf.h"
#include "kvseal/tok.h"

#include <jansson.h>
#include <time.h>

/* One message. Roles: "system", "user", "assistant" (others are INVAL).
 * Both strings are NUL-terminated and owned by the caller. */
typedef struct chat_message {
    const char *role;    /* public */
    const char *content; /* public */
} chat_message;

/* Template families (append-only). Exact formats, for S = system, U1 A1 U2 =
 * user, assistant, user, generation prompt on, BOS added by the tokenizer:
 *   PLAIN    "S\n\nUser: U1\nAssistant: A1\nUser: U2\nAssistant:"
 *            (a lone user message and no system: exactly U1, nothing else)
 *   LLAMA2   "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]"
 *   LLAMA3   "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>" then the
 *            same for user/assistant, then "<|start_header_id|>assistant<|end_header_id|>\n\n"
 *   CHATML   "<|im_start|>system\nS<|im_end|>\n" ... "<|im_start|>assistant\n"
 *   MISTRAL  "[INST] S\n\nU1 [/INST] A1</s>[INST] U2 [/INST]"
 *   PHI3     "<|system|>\nS<|end|>\n<|user|>\nU1<|end|>\n" ... "<|assistant|>\n"
 *   GEMMA    "<start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1"
 *            "<end_of_turn>\n" ... "<start_of_turn>model\n"
 * LLAMA2, LLAMA3 and GEMMA trim ASCII whitespace around each content, as
 * their templates do. LLAMA2, MISTRAL and GEMMA take at most one system
 * message, first, merged into the first user turn, and then need strictly
 * alternating user/assistant turns starting with user. LLAMA2 and MISTRAL
 * have no assistant header: their prompt ends with "[/INST]" and
 * add_generation_prompt adds nothing. BOS families: LLAMA2, LLAMA3, MISTRAL,
 * PHI3, GEMMA (never PLAIN or CHATML). */
typedef enum chat_family {
    CHAT_PLAIN = 0,
    CHAT_LLAMA2 = 1,
    CHAT_LLAMA3 = 2,
    CHAT_CHATML = 3,
    CHAT_MISTRAL = 4,
    CHAT_PHI3 = 5,
    CHAT_GEMMA = 6,
} chat_family;

/* Detects the family from f's tokenizer.chat_template text. f NULL, no
 * template, or a template not recognised -> CHAT_PLAIN. Can't fail. */
chat_family chat_detect(const gguf_file *f);
/* Same, from len bytes of template text (need not be NUL-terminated; tmpl
 * NULL -> CHAT_PLAIN). Checked in this order: "<|im_start|>" CHATML,
 * "<|start_header_id|>" LLAMA3, "<start_of_turn>" GEMMA, "<|end|>" with
 * "<|user|>" or "<|assistant|>" PHI3, "[INST]" with "<<SYS>>" LLAMA2, "[INST]" MISTRAL. */
chat_family chat_detect_text(const char *tmpl, size_t len);
/* Lower-case name ("plain", "llama2", "llama3", "chatml", "mistral", "phi3",
 * "gemma"; "unknown" otherwise); static storage, never NULL. */
const char *chat_family_name(chat_family fam);
/* Parses a name as chat_family_name spells it into *out; false (and *out
 * untouched) when unknown. Can't fail otherwise. */
bool chat_family_parse(const char *name, chat_family *out /* OUT */);

/* Renders msgs[0..n) for the family chat_detect(f) finds. v gives the BOS/EOS
 * text and whether the tokenizer adds BOS (v may be NULL: then no leading BOS
 * text and "<s>"-style defaults inside the conversation). On success *out is
 * a malloc'd NUL-terminated string (caller frees). add_generation_prompt
 * appends the assistant header so the model answers next.
 * Errors: KS_ERR_INVAL (n == 0, NULL role/content, unknown role, or a role
 * order the family cannot express; the message names the index and role),
 * KS_ERR_NOMEM. *out is NULL on error. */
ks_err chat_render(const tok_vocab *v, const gguf_file *f, const chat_message *msgs, size_t n,
                   bool add_generation_prompt, char **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Same with the family given (tests, or a configured override). */
ks_err chat_render_family(chat_family fam, const tok_vocab *v, const chat_message *msgs, size_t n,
                          bool add_generation_prompt, char **out /* OUT */,
                          ks_errbuf *eb) KS_MUST_USE;
/* chat_render_family that also reports where message contents went:
 * *spans (malloc'd, caller frees; NULL when *n_spans is 0) sorted,
 * disjoint byte ranges of *out, for tok_encode_marked. spans and n_spans
 * may be NULL. Same errors; *spans NULL on error. */
ks_err chat_render_family_marked(chat_family fam, const tok_vocab *v, const chat_message *msgs,
                                 size_t n, bool add_generation_prompt, char **out /* OUT */,
                                 tok_span **spans /* OUT */, size_t *n_spans /* OUT */,
                                 ks_errbuf *eb) KS_MUST_USE;

// ----------------------------------------------------------------------------
// Jinja chat templates (src/tok/chat_tmpl.c)

typedef struct chat_tmpl chat_tmpl;

/* Loads the chat template of a model: the file at path when path is
 * non-NULL (the operator's override), else f's tokenizer.chat_template, plus
 * f's tokenizer.chat_template.tool_use variant when it has one (used when a
 * request has tools). Each template is compiled and test-rendered on a tiny
 * conversation, so a template that cannot render fails here and not on the
 * first request. No template at all (path NULL, f without one) gives a
 * PLAIN template (chat_tmpl_is_plain). v (borrowed, may be NULL) gives
 * bos_token / eos_token. *out owned by the caller (chat_tmpl_free).
 * Errors: KS_ERR_IO (cannot read path), KS_ERR_FORMAT (syntax error) or
 * KS_ERR_INVAL (render error or a limit), the message naming the file or
 * key and the reason; KS_ERR_NOMEM. Blocks on file I/O only. */
ks_err chat_tmpl_load(const gguf_file *f, const tok_vocab *v, const char *path,
                      chat_tmpl **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Same from template text (len bytes); what names it in messages. */
ks_err chat_tmpl_from_text(const char *src, size_t len, const char *what, const tok_vocab *v,
                           chat_tmpl **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* True when t has no Jinja template (the PLAIN format). Can't fail. */
bool chat_tmpl_is_plain(const chat_tmpl *t);
/* The template text rendered for a request with (tools true) or without
 * tools; NULL for PLAIN. Owned by t, valid until chat_tmpl_free. The
 * tool-call parser picks its format from it. Can't fail. */
const char *chat_tmpl_source(const chat_tmpl *t, bool tools);
/* Where the template came from ("tokenizer.chat_template", a path, ...);
 * static or owned by t. Can't fail. */
const char *chat_tmpl_origin(const chat_tmpl *t);

/* Renders messages (a JSON array of OpenAI messages as the template expects
 * them: content a string or null, tool_calls arguments as objects) with
 * tools (array or NULL), the keys of kwargs (object or NULL; they cannot
 * replace messages, tools or add_generation_prompt) and
 * add_generation_prompt, plus bos_token / eos_token. now: strftime_now's
 * clock (0: real time). All borrowed. On success *out is malloc'd text
 * (caller frees). Errors: KS_ERR_INVAL (the template raised or failed; the
 * message says why), KS_ERR_NOMEM. PLAIN templates render through
 * chat_render_family(CHAT_PLAIN) and need string contents. Thread-safe. */
ks_err chat_tmpl_apply(const chat_tmpl *t, const json_t *messages, const json_t *tools,
                       const json_t *kwargs, bool add_generation_prompt, time_t now,
                       char **out /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* chat_tmpl_apply that also reports which bytes of *out came from the
 * request: every string of messages, tools and kwargs (object keys too;
 * role names excepted, which the server checks and templates build
 * markers from), kept through the template's concatenations and marked
 * whole through its filters (jinja_render_marked). *spans (malloc'd,
 * caller frees; NULL when *n_spans is 0) are sorted, disjoint byte ranges
 * for tok_encode_marked. PLAIN marks every content. spans and n_spans may
 * be NULL. Same errors; *spans NULL on error. Thread-safe. */
ks_err chat_tmpl_apply_marked(const chat_tmpl *t, const json_t *messages, const json_t *tools,
                              const json_t *kwargs, bool add_generation_prompt, time_t now,
                              char **out /* OUT */, tok_span **spans /* OUT */,
                              size_t *n_spans /* OUT */, ks_errbuf *eb) KS_MUST_USE;
/* Frees t; accepts NULL. */
void chat_tmpl_free(chat_tmpl *t);

#endif /* KS_CHAT_H */
