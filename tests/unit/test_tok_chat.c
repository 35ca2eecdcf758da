/* test_tok_chat.c — chat_tmpl (src/tok/chat_tmpl.c): a model's Jinja chat
 * template loaded from a GGUF (with its tool_use variant) or a file,
 * test-rendered at load, applied with messages, tools, kwargs and the
 * vocabulary's BOS/EOS text; the PLAIN format without a template; every
 * load error naming its source. */
#include "kvseal/chat.h"
#include "kvseal/gguf.h"
#include "kvseal/tok.h"

#include "../check.h"
#include "tok_fixture.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *k_main =
    "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}{% if flag is defined %}[{{ flag }}]"
    "{% endif %}";
static const char *k_tools =
    "TOOLS{{ tools | map(attribute='function.name') | join(',') }}{% for m in messages %}"
    "{% for tc in m.tool_calls | default([]) %}{{ tc.function.arguments.x }}{% endfor %}"
    "{% endfor %}{{ eos_token }}";

/* A GGUF with the templates given (NULL: absent) and a small BPE vocab. */
static gguf_file *mk_gguf(const char *tmpl, const char *tool_use) {
    gguf_writer *w = gguf_writer_create();
    CHECK(w != NULL);
    if (tmpl) CHECK_EQ(gguf_writer_set_str(w, "tokenizer.chat_template", tmpl), KS_OK);
    if (tool_use)
        CHECK_EQ(gguf_writer_set_str(w, "tokenizer.chat_template.tool_use", tool_use), KS_OK);
    const char *toks[] = {"a", "b", "ab", "<s>", "</s>", "\xc4\x8a"};
    const int32_t types[] = {1, 1, 1, 3, 3, 1};
    const char *merges[] = {"a b"};
    tfx_vocab_kv(w, "gpt2", "default", toks, types, 6, merges, 1);
    CHECK_EQ(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 3), KS_OK);
    CHECK_EQ(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 4), KS_OK);
    return tfx_gguf_open(w);
}

static char *apply(const chat_tmpl *t, const char *msgs, const char *tools, const char *kw,
                   bool gen) {
    json_t *m = json_loads(msgs, 0, NULL), *tl = tools ? json_loads(tools, 0, NULL) : NULL;
    json_t *k = kw ? json_loads(kw, 0, NULL) : NULL;
    CHECK(m);
    char *out = NULL;
    ks_errbuf eb = {0};
    ks_err e = chat_tmpl_apply(t, m, tl, k, gen, 0, &out, &eb);
    if (e) fprintf(stderr, "chat_tmpl_apply: %s\n", eb.msg);
    CHECK_EQ(e, KS_OK);
    json_decref(m);
    json_decref(tl);
    json_decref(k);
    return out;
}

static void test_gguf_templates(void) {
    gguf_file *f = mk_gguf(k_main, k_tools);
    tok_vocab *v = NULL;
    ks_errbuf eb = {0};
    CHECK_EQ(tok_vocab_load(f, &v, &eb), KS_OK);
    chat_tmpl *t = NULL;
    CHECK_EQ(chat_tmpl_load(f, v, NULL, &t, &eb), KS_OK);
    CHECK(!chat_tmpl_is_plain(t));
    CHECK_STR_EQ(chat_tmpl_source(t, false), k_main);
    CHECK_STR_EQ(chat_tmpl_source(t, true), k_tools);
    CHECK_STR_EQ(chat_tmpl_origin(t), "tokenizer.chat_template");
    const char *msgs = "[{\"role\":\"user\",\"content\":\"hi\"}]";
    char *out = apply(t, msgs, NULL, NULL, true);
    CHECK_STR_EQ(out, "<s><user>hi<assistant>");
    free(out);
    out = apply(t, msgs, NULL, "{\"flag\": true}", false);
    CHECK_STR_EQ(out, "<s><user>hi[True]");
    free(out);
    /* kwargs cannot replace the request's own variables */
    out = apply(t, msgs, NULL, "{\"add_generation_prompt\": false, \"bos_token\": \"B\"}", true);
    CHECK_STR_EQ(out, "B<user>hi<assistant>");
    free(out);
    /* tools pick the tool_use variant */
    out = apply(t,
                "[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\","
                "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":7}}}]}]",
                "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]",
                NULL, true);
    CHECK_STR_EQ(out, "TOOLSf,g7</s>");
    free(out);
    chat_tmpl_free(t);
    tok_vocab_free(v);
    gguf_close(f);
}

static void test_plain_and_errors(void) {
    ks_errbuf eb = {0};
    chat_tmpl *t = NULL;
    gguf_file *f = mk_gguf(NULL, NULL);
    CHECK_EQ(chat_tmpl_load(f, NULL, NULL, &t, &eb), KS_OK);
    CHECK(chat_tmpl_is_plain(t));
    CHECK(chat_tmpl_source(t, false) == NULL);
    CHECK_STR_HAS(chat_tmpl_origin(t), "plain");
    char *out =
        apply(t, "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"}]",
              NULL, NULL, true);
    CHECK_STR_EQ(out, "S\n\nUser: U\nAssistant:");
    free(out);
    chat_tmpl_free(t);
    gguf_close(f);
    chat_tmpl_free(NULL);
    CHECK(chat_tmpl_is_plain(NULL));

    /* a syntax error in the model's template, naming the key */
    f = mk_gguf("{% if %}", NULL);
    CHECK_EQ(chat_tmpl_load(f, NULL, NULL, &t, &eb), KS_ERR_FORMAT);
    CHECK(t == NULL);
    CHECK_STR_HAS(eb.msg, "tokenizer.chat_template");
    CHECK_STR_HAS(eb.msg, "line 1");
    gguf_close(f);
    /* a tool_use variant that cannot render */
    f = mk_gguf(k_main, "{{ raise_exception('no tools here') }}");
    CHECK_EQ(chat_tmpl_load(f, NULL, NULL, &t, &eb), KS_ERR_INVAL);
    CHECK_STR_HAS(eb.msg, "tokenizer.chat_template.tool_use");
    CHECK_STR_HAS(eb.msg, "no tools here");
    gguf_close(f);
    /* a tool_use variant that needs tools is test-rendered with one */
    f = mk_gguf(k_main, "{% for t in tools %}{{ t.function.name }}{% endfor %}");
    CHECK_EQ(chat_tmpl_load(f, NULL, NULL, &t, &eb), KS_OK);
    chat_tmpl_free(t);
    gguf_close(f);
    /* a template that refuses a system message still loads */
    const char *nosys = "{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}"
                        "{% endif %}ok";
    CHECK_EQ(chat_tmpl_from_text(nosys, strlen(nosys), "nosys", NULL, &t, &eb), KS_OK);
    chat_tmpl_free(t);
    /* files: override, missing, broken */
    char path[] = "/tmp/test_tok_chat_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const char *file_tmpl = "[{{ messages | length }}]";
    CHECK(write(fd, file_tmpl, strlen(file_tmpl)) == (ssize_t)strlen(file_tmpl));
    close(fd);
    f = mk_gguf(k_main, NULL);
    CHECK_EQ(chat_tmpl_load(f, NULL, path, &t, &eb), KS_OK);
    CHECK_STR_EQ(chat_tmpl_origin(t), path);
    CHECK_STR_EQ(chat_tmpl_source(t, true), "[{{ messages | length }}]");
    out = apply(t, "[{\"role\":\"user\",\"content\":\"x\"}]", NULL, NULL, true);
    CHECK_STR_EQ(out, "[1]");
    free(out);
    chat_tmpl_free(t);
    unlink(path);
    CHECK_EQ(chat_tmpl_load(f, NULL, path, &t, &eb), KS_ERR_IO);
    CHECK_STR_HAS(eb.msg, path);
    gguf_close(f);
    /* no messages */
    CHECK_EQ(chat_tmpl_from_text("x", 1, "x", NULL, &t, &eb), KS_OK);
    json_t *empty = json_array();
    CHECK_EQ(chat_tmpl_apply(t, empty, NULL, NULL, true, 0, &out, &eb), KS_ERR_INVAL);
    json_decref(empty);
    chat_tmpl_free(t);
}

/* Every published template of ../shared/templates loads as a server would
 * load it (compiled, test-rendered), except the few that jinja2 cannot
 * render without tools (tool_use variants, firefunction's `functions`). */
static void test_shared_templates(void) {
    char dir[4096];
    const char *d = getenv("KS_SHARED");
    snprintf(dir, sizeof dir, "%s/templates", d ? d : "../shared");
    DIR *dp = opendir(dir);
    if (!dp) {
        fprintf(stderr, "note: no %s, shared templates not loaded\n", dir);
        return;
    }
    int n = 0, refused = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t l = strlen(de->d_name);
        if (l < 7 || strcmp(de->d_name + l - 6, ".jinja") != 0) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        chat_tmpl *t = NULL;
        ks_errbuf eb = {0};
        ks_err e = chat_tmpl_load(NULL, NULL, path, &t, &eb);
        n++;
        if (e) {
            refused++;
            fprintf(stderr, "refused at load: %s\n", eb.msg);
            CHECK_STR_HAS(eb.msg, de->d_name);
            bool expected = strstr(de->d_name, "tool_use") || strstr(de->d_name, "firefunction");
            CHECK(expected);
        }
        chat_tmpl_free(t);
    }
    closedir(dp);
    printf("shared templates: %d loaded, %d refused (they need tools)\n", n - refused, refused);
    CHECK(n >= 40);
}

int main(void) {
    test_gguf_templates();
    test_plain_and_errors();
    test_shared_templates();
    printf("test_tok_chat: OK\n");
    return 0;
}
