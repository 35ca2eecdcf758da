/* chat.c — chat template detection and rendering (include/kvseal/chat.h).
 *
 * Each family is a small formatter that writes the same text its model's
 * Jinja template produces for plain system/user/assistant conversations
 * (formats taken from the model cards and templates; exact strings in
 * chat.h). Validation happens before any output: roles are checked first,
 * then the role order the family can express, so errors name one message. */
#include "tok_int.h"

#include "kvseal/chat.h"

#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// Detection

static bool chat__has(const char *s, size_t n, const char *needle) {
    return memmem(s, n, needle, strlen(needle)) != NULL;
}

chat_family chat_detect_text(const char *tmpl, size_t len) {
    if (!tmpl || len == 0) return CHAT_PLAIN;
    if (chat__has(tmpl, len, "<|im_start|>")) return CHAT_CHATML;
    if (chat__has(tmpl, len, "<|start_header_id|>")) return CHAT_LLAMA3;
    if (chat__has(tmpl, len, "<start_of_turn>")) return CHAT_GEMMA;
    if (chat__has(tmpl, len, "<|end|>") &&
        (chat__has(tmpl, len, "<|user|>") || chat__has(tmpl, len, "<|assistant|>")))
        return CHAT_PHI3; /* Phi-3-small spells the role as '<|' + role + '|>' */
    if (chat__has(tmpl, len, "[INST]"))
        return chat__has(tmpl, len, "<<SYS>>") ? CHAT_LLAMA2 : CHAT_MISTRAL;
    return CHAT_PLAIN;
}

chat_family chat_detect(const gguf_file *f) {
    if (!f || !gguf_get(f, "tokenizer.chat_template")) return CHAT_PLAIN;
    gguf_str s;
    if (gguf_get_str(f, "tokenizer.chat_template", &s, NULL) != KS_OK) return CHAT_PLAIN;
    return chat_detect_text(s.ptr, (size_t)s.len);
}

static const char *const chat__names[] = {"plain",   "llama2", "llama3", "chatml",
                                          "mistral", "phi3",   "gemma"};
#define CHAT__N_FAMILIES (sizeof chat__names / sizeof chat__names[0])

const char *chat_family_name(chat_family fam) {
    return (unsigned)fam < CHAT__N_FAMILIES ? chat__names[fam] : "unknown";
}

bool chat_family_parse(const char *name, chat_family *out) {
    if (!name) return false;
    for (size_t i = 0; i < CHAT__N_FAMILIES; i++) {
        if (strcmp(name, chat__names[i]) == 0) {
            *out = (chat_family)i;
            return true;
        }
    }
    return false;
}

// ----------------------------------------------------------------------------
// Validation

typedef enum chat__role { CHAT__SYSTEM, CHAT__USER, CHAT__ASSISTANT } chat__role;

static const char *const chat__role_names[] = {"system", "user", "assistant"};

/* Maps every message's role, or INVAL naming the first bad message. */
static ks_err chat__roles(const chat_message *msgs, size_t n, chat__role *roles, ks_errbuf *eb) {
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role) return ks_seterr(eb, KS_ERR_INVAL, "message %zu: missing role", i);
        if (!msgs[i].content)
            return ks_seterr(eb, KS_ERR_INVAL, "message %zu (%s): missing content", i,
                             msgs[i].role);
        size_t r = 0;
        while (r < 3 && strcmp(msgs[i].role, chat__role_names[r]) != 0)
            r++;
        if (r == 3)
            return ks_seterr(eb, KS_ERR_INVAL,
                             "message %zu: unknown role '%.64s' (system, user or assistant)", i,
                             msgs[i].role);
        roles[i] = (chat__role)r;
    }
    return KS_OK;
}

/* Families that fold the system prompt into the first user turn need
 * [system] user (assistant user)* [assistant]. */
static ks_err chat__check_alternating(chat_family fam, const chat__role *roles, size_t n,
                                      ks_errbuf *eb) {
    size_t first = roles[0] == CHAT__SYSTEM ? 1 : 0;
    if (first == 1 && n == 1)
        return ks_seterr(eb, KS_ERR_INVAL,
                         "message 0 (system): %s needs a user message after the system message",
                         chat_family_name(fam));
    for (size_t i = first; i < n; i++) {
        chat__role want = (i - first) % 2 == 0 ? CHAT__USER : CHAT__ASSISTANT;
        if (roles[i] == want) continue;
        if (roles[i] == CHAT__SYSTEM)
            return ks_seterr(eb, KS_ERR_INVAL,
                             "message %zu (system): %s accepts one system message, only first", i,
                             chat_family_name(fam));
        return ks_seterr(eb, KS_ERR_INVAL,
                         "message %zu (%s): %s needs user/assistant turns alternating, "
                         "starting with user",
                         i, chat__role_names[roles[i]], chat_family_name(fam));
    }
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Output helpers

typedef struct chat__out {
    tok__buf b;
    bool oom;
    tok_span *sp; /* where message contents went (request text) */
    size_t n_sp, cap_sp;
} chat__out;

static void chat__put(chat__out *o, const char *s, size_t n) {
    if (!o->oom && !tok__buf_put(&o->b, s, n)) o->oom = true;
}

static void chat__puts(chat__out *o, const char *s) { chat__put(o, s, strlen(s)); }

static bool chat__space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Writes content, trimmed of ASCII whitespace on both ends if trim. */
static void chat__content(chat__out *o, const char *s, bool trim) {
    size_t n = strlen(s);
    if (trim) {
        while (n && chat__space(s[n - 1]))
            n--;
        while (n && chat__space(*s)) {
            s++;
            n--;
        }
    }
    size_t at = o->b.len;
    chat__put(o, s, n);
    if (o->oom || n == 0) return;
    if (o->n_sp && o->sp[o->n_sp - 1].off + o->sp[o->n_sp - 1].len == at) {
        o->sp[o->n_sp - 1].len += n; // adjacent: one span
        return;
    }
    if (o->n_sp == o->cap_sp) {
        size_t cap = o->cap_sp ? 2 * o->cap_sp : 8;
        tok_span *p = realloc(o->sp, cap * sizeof *p);
        if (!p) {
            o->oom = true;
            return;
        }
        o->sp = p;
        o->cap_sp = cap;
    }
    o->sp[o->n_sp++] = (tok_span){at, n};
}

/* Text of special token id in v, or dflt when v or the token is absent. */
static const char *chat__special(const tok_vocab *v, int32_t id, const char *dflt) {
    if (!v || id == TOK_NULL) return dflt;
    const char *t = tok_token_text(v, id);
    return *t ? t : dflt;
}

/* The leading BOS text, only when the tokenizer will not add BOS itself. */
static void chat__bos_lead(chat__out *o, const tok_vocab *v) {
    if (v && !tok_add_bos(v) && tok_bos(v) != TOK_NULL)
        chat__puts(o, tok_token_text(v, tok_bos(v)));
}

// ----------------------------------------------------------------------------
// Formatters. Each gets validated roles; the alternating ones have already
// passed chat__check_alternating.

/* Plain LM: a lone user message is the raw text (so a base model such as
 * kjv-mini continues it); otherwise role-prefixed lines. */
static void chat__plain(chat__out *o, const chat_message *m, const chat__role *roles, size_t n,
                        bool gen) {
    if (n == 1 && roles[0] == CHAT__USER) {
        chat__content(o, m[0].content, false);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (roles[i] == CHAT__SYSTEM) {
            chat__content(o, m[i].content, false);
            chat__puts(o, "\n\n");
        } else {
            chat__puts(o, roles[i] == CHAT__USER ? "User: " : "Assistant: ");
            chat__content(o, m[i].content, false);
            chat__puts(o, "\n");
        }
    }
    if (gen) chat__puts(o, "Assistant:");
}

static void chat__llama2(chat__out *o, const tok_vocab *v, const chat_message *m,
                         const chat__role *roles, size_t n) {
    const char *bos = chat__special(v, v ? tok_bos(v) : TOK_NULL, "<s>");
    const char *eos = chat__special(v, v ? tok_eos(v) : TOK_NULL, "</s>");
    size_t first = roles[0] == CHAT__SYSTEM ? 1 : 0;
    chat__bos_lead(o, v);
    for (size_t i = first; i < n; i++) {
        if (roles[i] == CHAT__USER) {
            if (i > first) chat__puts(o, bos);
            chat__puts(o, "[INST] ");
            if (i == first && first == 1) {
                chat__puts(o, "<<SYS>>\n");
                chat__content(o, m[0].content, true);
                chat__puts(o, "\n<</SYS>>\n\n");
            }
            chat__content(o, m[i].content, true);
            chat__puts(o, " [/INST]");
        } else {
            chat__puts(o, " ");
            chat__content(o, m[i].content, true);
            chat__puts(o, " ");
            chat__puts(o, eos);
        }
    }
}

static void chat__mistral(chat__out *o, const tok_vocab *v, const chat_message *m,
                          const chat__role *roles, size_t n) {
    const char *eos = chat__special(v, v ? tok_eos(v) : TOK_NULL, "</s>");
    size_t first = roles[0] == CHAT__SYSTEM ? 1 : 0;
    chat__bos_lead(o, v);
    for (size_t i = first; i < n; i++) {
        if (roles[i] == CHAT__USER) {
            chat__puts(o, "[INST] ");
            if (i == first && first == 1) {
                chat__content(o, m[0].content, false);
                chat__puts(o, "\n\n");
            }
            chat__content(o, m[i].content, false);
            chat__puts(o, " [/INST]");
        } else {
            chat__puts(o, " ");
            chat__content(o, m[i].content, false);
            chat__puts(o, eos);
        }
    }
}

static void chat__gemma(chat__out *o, const tok_vocab *v, const chat_message *m,
                        const chat__role *roles, size_t n, bool gen) {
    size_t first = roles[0] == CHAT__SYSTEM ? 1 : 0;
    chat__bos_lead(o, v);
    for (size_t i = first; i < n; i++) {
        chat__puts(o, roles[i] == CHAT__USER ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
        if (i == first && first == 1) {
            chat__content(o, m[0].content, true);
            chat__puts(o, "\n\n");
        }
        chat__content(o, m[i].content, true);
        chat__puts(o, "<end_of_turn>\n");
    }
    if (gen) chat__puts(o, "<start_of_turn>model\n");
}

static void chat__llama3(chat__out *o, const tok_vocab *v, const chat_message *m,
                         const chat__role *roles, size_t n, bool gen) {
    chat__bos_lead(o, v);
    for (size_t i = 0; i < n; i++) {
        chat__puts(o, "<|start_header_id|>");
        chat__puts(o, chat__role_names[roles[i]]);
        chat__puts(o, "<|end_header_id|>\n\n");
        chat__content(o, m[i].content, true);
        chat__puts(o, "<|eot_id|>");
    }
    if (gen) chat__puts(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void chat__chatml(chat__out *o, const chat_message *m, const chat__role *roles, size_t n,
                         bool gen) {
    for (size_t i = 0; i < n; i++) {
        chat__puts(o, "<|im_start|>");
        chat__puts(o, chat__role_names[roles[i]]);
        chat__puts(o, "\n");
        chat__content(o, m[i].content, false);
        chat__puts(o, "<|im_end|>\n");
    }
    if (gen) chat__puts(o, "<|im_start|>assistant\n");
}

static void chat__phi3(chat__out *o, const tok_vocab *v, const chat_message *m,
                       const chat__role *roles, size_t n, bool gen) {
    chat__bos_lead(o, v);
    for (size_t i = 0; i < n; i++) {
        chat__puts(o, "<|");
        chat__puts(o, chat__role_names[roles[i]]);
        chat__puts(o, "|>\n");
        chat__content(o, m[i].content, false);
        chat__puts(o, "<|end|>\n");
    }
    if (gen) chat__puts(o, "<|assistant|>\n");
}

// ----------------------------------------------------------------------------
// Entry points

ks_err chat_render_family(chat_family fam, const tok_vocab *v, const chat_message *msgs, size_t n,
                          bool add_generation_prompt, char **out, ks_errbuf *eb) {
    return chat_render_family_marked(fam, v, msgs, n, add_generation_prompt, out, NULL, NULL, eb);
}

ks_err chat_render_family_marked(chat_family fam, const tok_vocab *v, const chat_message *msgs,
                                 size_t n, bool add_generation_prompt, char **out,
                                 tok_span **spans, size_t *n_spans, ks_errbuf *eb) {
    *out = NULL;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    if ((unsigned)fam >= CHAT__N_FAMILIES)
        return ks_seterr(eb, KS_ERR_INVAL, "unknown chat family %d", (int)fam);
    if (n == 0 || !msgs) return ks_seterr(eb, KS_ERR_INVAL, "no messages");
    chat__role *roles = malloc(n * sizeof *roles);
    if (!roles) return ks_seterr(eb, KS_ERR_NOMEM, "chat: %zu messages", n);
    ks_err e = chat__roles(msgs, n, roles, eb);
    if (!e && (fam == CHAT_LLAMA2 || fam == CHAT_MISTRAL || fam == CHAT_GEMMA))
        e = chat__check_alternating(fam, roles, n, eb);
    if (e) {
        free(roles);
        return e;
    }
    bool gen = add_generation_prompt;
    chat__out o = {{0}, false, NULL, 0, 0};
    switch (fam) {
    case CHAT_PLAIN:
        chat__plain(&o, msgs, roles, n, gen);
        break;
    case CHAT_LLAMA2:
        chat__llama2(&o, v, msgs, roles, n);
        break;
    case CHAT_LLAMA3:
        chat__llama3(&o, v, msgs, roles, n, gen);
        break;
    case CHAT_CHATML:
        chat__chatml(&o, msgs, roles, n, gen);
        break;
    case CHAT_MISTRAL:
        chat__mistral(&o, v, msgs, roles, n);
        break;
    case CHAT_PHI3:
        chat__phi3(&o, v, msgs, roles, n, gen);
        break;
    case CHAT_GEMMA:
        chat__gemma(&o, v, msgs, roles, n, gen);
        break;
    }
    free(roles);
    chat__put(&o, "", 1); /* NUL; also makes the buffer non-NULL for empty output */
    if (o.oom) {
        free(o.b.p);
        free(o.sp);
        return ks_seterr(eb, KS_ERR_NOMEM, "chat: rendering %zu messages", n);
    }
    *out = o.b.p;
    if (spans && n_spans) {
        *spans = o.sp;
        *n_spans = o.n_sp;
    } else {
        free(o.sp);
    }
    return KS_OK;
}

ks_err chat_render(const tok_vocab *v, const gguf_file *f, const chat_message *msgs, size_t n,
                   bool add_generation_prompt, char **out, ks_errbuf *eb) {
    return chat_render_family(chat_detect(f), v, msgs, n, add_generation_prompt, out, eb);
}
