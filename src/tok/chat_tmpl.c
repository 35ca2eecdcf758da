/* chat_tmpl.c — a model's Jinja chat template, loaded, checked and applied
 * (include/kvseal/chat.h, "Jinja chat templates").
 *
 * The variables a template sees are the ones Hugging Face transformers
 * passes: messages, tools (None when the request has none), add_generation_
 * prompt, bos_token, eos_token, and the request's chat_template_kwargs. A
 * template is test-rendered at load on a two-message conversation so a
 * template this engine cannot run is refused at startup, never at the first
 * request and never by silently falling back to another format. */
#include "tok_int.h"

#include "kvseal/chat.h"
#include "kvseal/jinja.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct chat_tmpl {
    jinja_tmpl *main, *tools; /* NULL: PLAIN; tools NULL: main serves tool requests too */
    char *main_src, *tools_src;
    char *origin;
    char *bos, *eos; /* token texts, "" when the vocabulary has none */
};

bool chat_tmpl_is_plain(const chat_tmpl *t) { return !t || !t->main; }

const char *chat_tmpl_source(const chat_tmpl *t, bool tools) {
    if (!t || !t->main) return NULL;
    return tools && t->tools ? t->tools_src : t->main_src;
}

const char *chat_tmpl_origin(const chat_tmpl *t) {
    return t && t->origin ? t->origin : "none (plain format)";
}

void chat_tmpl_free(chat_tmpl *t) {
    if (!t) return;
    jinja_free(t->main);
    jinja_free(t->tools);
    free(t->main_src);
    free(t->tools_src);
    free(t->origin);
    free(t->bos);
    free(t->eos);
    free(t);
}

static char *chat__dup(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static const char *chat__tok_text(const tok_vocab *v, int32_t id) {
    if (!v || id == TOK_NULL) return "";
    return tok_token_text(v, id);
}

/* The role names a request may carry (the server checks them): they stay
 * unmarked, so a template may build its markers from them ('<|' + role). */
static const char *const chat__roles_plain[] = {"system", "user",      "assistant",
                                                "tool",   "developer", NULL};

/* Renders with the request's messages, tools and kwargs as marked data
 * (spans NULL: not reported), and bos_token, eos_token (unless kwargs set
 * them) and add_generation_prompt as the template's own. */
static ks_err chat__render(const chat_tmpl *t, const jinja_tmpl *jt, const json_t *messages,
                           const json_t *tools, const json_t *kwargs, bool gen, time_t now,
                           char **out, tok_span **spans, size_t *n_spans, ks_errbuf *eb) {
    json_t *ctx = json_object(), *data = json_object();
    if (!ctx || !data) {
        json_decref(ctx);
        json_decref(data);
        return ks_seterr(eb, KS_ERR_NOMEM, "chat template: out of memory");
    }
    int bad = 0;
    /* kwargs may set bos_token / eos_token (then they are request data) */
    if (!json_object_get(kwargs, "bos_token"))
        bad |= json_object_set_new(ctx, "bos_token", json_string(t->bos));
    if (!json_object_get(kwargs, "eos_token"))
        bad |= json_object_set_new(ctx, "eos_token", json_string(t->eos));
    if (json_is_object(kwargs)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)kwargs, k, v) { bad |= json_object_set(data, k, v); }
    }
    bad |= json_object_set(data, "messages", (json_t *)messages);
    bad |= json_object_set(data, "tools", tools ? (json_t *)tools : json_null());
    bad |= json_object_set_new(ctx, "add_generation_prompt", json_boolean(gen));
    if (bad) {
        json_decref(ctx);
        json_decref(data);
        return ks_seterr(eb, KS_ERR_NOMEM, "chat template: out of memory");
    }
    jinja_opts o = {.now = now, .data = data, .data_plain = chat__roles_plain};
    jinja_span *js = NULL;
    size_t n_js = 0;
    ks_err e = jinja_render_marked(jt, ctx, &o, out, NULL, spans ? &js : NULL, &n_js, eb);
    json_decref(ctx);
    json_decref(data);
    if (!e && spans && n_js) { /* the same ranges, in the tokenizer's type */
        *spans = malloc(n_js * sizeof **spans);
        if (!*spans) {
            free(*out);
            *out = NULL;
            e = ks_seterr(eb, KS_ERR_NOMEM, "chat template: out of memory");
        } else {
            for (size_t i = 0; i < n_js; i++)
                (*spans)[i] = (tok_span){js[i].off, js[i].len};
            *n_spans = n_js;
        }
    }
    free(js);
    return e;
}

/* Compiles and test-renders one template; what names it in messages. A
 * tool_use variant is tried with a tool, as it will be used (some refuse to
 * render without one). */
static ks_err chat__compile(chat_tmpl *t, const char *src, size_t len, const char *what,
                            bool with_tools, jinja_tmpl **jt, char **copy, ks_errbuf *eb) {
    ks_errbuf tmp = {0};
    ks_err e = jinja_compile(src, len, NULL, jt, &tmp);
    if (e) return ks_seterr(eb, e, "chat template %s: %s", what, tmp.msg);
    if (!(*copy = chat__dup(src, len))) return ks_seterr(eb, KS_ERR_NOMEM, "out of memory");
    /* the test conversation: a system, a user, an answer, a user again */
    json_t *msgs =
        json_pack("[{s:s,s:s},{s:s,s:s},{s:s,s:s},{s:s,s:s}]", "role", "system", "content",
                  "You are a test.", "role", "user", "content", "Hello", "role", "assistant",
                  "content", "Hi.", "role", "user", "content", "Bye");
    if (!msgs) return ks_seterr(eb, KS_ERR_NOMEM, "out of memory");
    json_t *tools = with_tools ? json_pack("[{s:s,s:{s:s,s:s,s:{s:s,s:{}}}}]", "type", "function",
                                           "function", "name", "test", "description", "A test.",
                                           "parameters", "type", "object", "properties")
                               : NULL;
    char *out = NULL;
    e = chat__render(t, *jt, msgs, tools, NULL, true, 0, &out, NULL, NULL, &tmp);
    if (e == KS_ERR_INVAL) { /* some templates refuse a system message: try without */
        json_array_remove(msgs, 0);
        ks_errbuf tmp2 = {0};
        e = chat__render(t, *jt, msgs, tools, NULL, true, 0, &out, NULL, NULL, &tmp2);
    }
    json_decref(tools);
    json_decref(msgs);
    free(out);
    if (e)
        return ks_seterr(eb, e, "chat template %s cannot render a test conversation: %s", what,
                         tmp.msg);
    return KS_OK;
}

ks_err chat_tmpl_from_text(const char *src, size_t len, const char *what, const tok_vocab *v,
                           chat_tmpl **out, ks_errbuf *eb) {
    *out = NULL;
    chat_tmpl *t = calloc(1, sizeof *t);
    if (!t) return ks_seterr(eb, KS_ERR_NOMEM, "out of memory");
    const char *b = chat__tok_text(v, v ? tok_bos(v) : TOK_NULL);
    const char *e_ = chat__tok_text(v, v ? tok_eos(v) : TOK_NULL);
    t->bos = chat__dup(b, strlen(b));
    t->eos = chat__dup(e_, strlen(e_));
    t->origin = chat__dup(what, strlen(what));
    ks_err e = KS_OK;
    if (!t->bos || !t->eos || !t->origin) {
        e = ks_seterr(eb, KS_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (src && (e = chat__compile(t, src, len, what, false, &t->main, &t->main_src, eb))) goto fail;
    *out = t;
    return KS_OK;
fail:
    chat_tmpl_free(t);
    return e;
}

ks_err chat_tmpl_load(const gguf_file *f, const tok_vocab *v, const char *path, chat_tmpl **out,
                      ks_errbuf *eb) {
    *out = NULL;
    if (path) {
        FILE *fp = fopen(path, "rb");
        if (!fp) return ks_seterr(eb, KS_ERR_IO, "chat template %s: %s", path, strerror(errno));
        tok__buf b = {0};
        char chunk[8192];
        size_t n;
        bool ok = true;
        while (ok && (n = fread(chunk, 1, sizeof chunk, fp)) > 0) {
            ok = tok__buf_put(&b, chunk, n);
            if (b.len > ((size_t)1 << 20)) ok = false;
        }
        bool rerr = ferror(fp);
        fclose(fp);
        if (rerr || !ok) {
            free(b.p);
            return ks_seterr(eb, rerr ? KS_ERR_IO : KS_ERR_INVAL, "chat template %s: %s", path,
                             rerr ? "read error" : "larger than 1 MiB (or out of memory)");
        }
        ks_err e = chat_tmpl_from_text(b.p ? b.p : "", b.len, path, v, out, eb);
        free(b.p);
        return e;
    }
    gguf_str s;
    if (!f || !gguf_get(f, "tokenizer.chat_template") ||
        gguf_get_str(f, "tokenizer.chat_template", &s, NULL) != KS_OK)
        return chat_tmpl_from_text(NULL, 0, "none (plain format)", v, out, eb);
    ks_err e = chat_tmpl_from_text(s.ptr, (size_t)s.len, "tokenizer.chat_template", v, out, eb);
    if (e) return e;
    gguf_str ts;
    if (gguf_get(f, "tokenizer.chat_template.tool_use") &&
        gguf_get_str(f, "tokenizer.chat_template.tool_use", &ts, NULL) == KS_OK) {
        e = chat__compile(*out, ts.ptr, (size_t)ts.len, "tokenizer.chat_template.tool_use", true,
                          &(*out)->tools, &(*out)->tools_src, eb);
        if (e) {
            chat_tmpl_free(*out);
            *out = NULL;
            return e;
        }
    }
    return KS_OK;
}

ks_err chat_tmpl_apply(const chat_tmpl *t, const json_t *messages, const json_t *tools,
                       const json_t *kwargs, bool add_generation_prompt, time_t now, char **out,
                       ks_errbuf *eb) {
    return chat_tmpl_apply_marked(t, messages, tools, kwargs, add_generation_prompt, now, out,
                                  NULL, NULL, eb);
}

ks_err chat_tmpl_apply_marked(const chat_tmpl *t, const json_t *messages, const json_t *tools,
                              const json_t *kwargs, bool add_generation_prompt, time_t now,
                              char **out, tok_span **spans, size_t *n_spans, ks_errbuf *eb) {
    *out = NULL;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    if (!json_is_array(messages) || json_array_size(messages) == 0)
        return ks_seterr(eb, KS_ERR_INVAL, "no messages");
    if (!chat_tmpl_is_plain(t)) {
        const jinja_tmpl *jt = tools && t->tools ? t->tools : t->main;
        return chat__render(t, jt, messages, tools, kwargs, add_generation_prompt, now, out,
                            spans && n_spans ? spans : NULL, n_spans, eb);
    }
    size_t n = json_array_size(messages);
    chat_message *m = calloc(n, sizeof *m);
    if (!m) return ks_seterr(eb, KS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(messages, i);
        m[i].role = json_string_value(json_object_get(msg, "role"));
        m[i].content = json_string_value(json_object_get(msg, "content"));
    }
    ks_err e = chat_render_family_marked(CHAT_PLAIN, NULL, m, n, add_generation_prompt, out,
                                         spans && n_spans ? spans : NULL, n_spans, eb);
    free(m);
    return e;
}
