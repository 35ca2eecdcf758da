/* chat.h — chat templates: turns a list of {role, content} messages into the
 * prompt text a chat model was trained on. Part of the tok module
 * (src/tok/chat.c). No Jinja: the family is detected from distinctive
 * substrings of the GGUF's tokenizer.chat_template and rendered by a fixed
 * C formatter per family.
 *
 * The rendered text contains special tokens as TEXT ("<|im_start|>"); the
 * caller tokenizes it with tok_encode(add_special=true, parse_special=true).
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

#endif /* KS_CHAT_H */
