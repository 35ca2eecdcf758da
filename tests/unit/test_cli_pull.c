/* test_cli_pull.c — the pure parts of `kvseal pull` (src/cli/pull_hub.c and
 * the models directory's default in util.c): the spec (ORG/REPO[:QUANT],
 * ORG/REPO/path.gguf, hf.co/ prefixes, bad owners and tags refused), the
 * hub's tree listing (LFS sha256 and size, directories skipped, malformed
 * entries refused), choosing a file by quant tag (case, a tag standing
 * alone beating a longer one, ambiguity, mmproj never picked, shards),
 * and the name check that keeps a hub's file names inside the models
 * directory. The network side is tests/e2e/test_pull.sh. */
#include "cli/cli_int.h"

#include "../check.h"

#include <stdlib.h>

static const char SHA_A[] = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

// ----------------------------------------------------------------------------
// The spec

static ks_err spec(const char *s, cli__pull_spec *sp) {
    ks_errbuf eb = {0};
    ks_err e = cli__pull_spec_parse(s, sp, &eb);
    if (e) CHECK(eb.msg[0] != '\0'); // every refusal says why
    return e;
}

static void test_spec(void) {
    cli__pull_spec sp;
    CHECK_EQ(spec("TheBloke/Llama-2-7B-GGUF", &sp), KS_OK);
    CHECK_STR_EQ(sp.repo, "TheBloke/Llama-2-7B-GGUF");
    CHECK_STR_EQ(sp.quant, "");
    CHECK_STR_EQ(sp.path, "");

    CHECK_EQ(spec("unsloth/Qwen3-0.6B-GGUF:q4_k_m", &sp), KS_OK);
    CHECK_STR_EQ(sp.repo, "unsloth/Qwen3-0.6B-GGUF");
    CHECK_STR_EQ(sp.quant, "q4_k_m");

    CHECK_EQ(spec("org/repo/sub/dir/model-Q8_0.gguf", &sp), KS_OK);
    CHECK_STR_EQ(sp.repo, "org/repo");
    CHECK_STR_EQ(sp.path, "sub/dir/model-Q8_0.gguf");
    CHECK_STR_EQ(sp.quant, "");

    CHECK_EQ(spec("hf.co/org/repo:Q8_0", &sp), KS_OK);
    CHECK_STR_EQ(sp.repo, "org/repo");
    CHECK_STR_EQ(sp.quant, "Q8_0");
    CHECK_EQ(spec("https://huggingface.co/org/repo", &sp), KS_OK);
    CHECK_STR_EQ(sp.repo, "org/repo");

    // refused: no slash, bad owner or name, empty or odd tags, bad paths
    CHECK_EQ(spec("justaname", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("/repo", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("../repo", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/re..po", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/.repo", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("-org/repo", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/re po", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/repo?x=1", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/repo:", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/repo:Q4 K", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/repo:Q4/K", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/repo/../evil.gguf", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/repo//evil.gguf", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/repo/README.md", &sp), KS_ERR_INVAL);
    CHECK_EQ(spec("org/repo:q8_0/x.gguf", &sp), KS_ERR_INVAL);
    char longname[200];
    memset(longname, 'a', 150);
    memcpy(longname + 150, "/x", 3);
    CHECK_EQ(spec(longname, &sp), KS_ERR_INVAL); // owner over 96
}

// ----------------------------------------------------------------------------
// Names

static void test_name_check(void) {
    const char *base = NULL;
    ks_errbuf eb = {0};
    CHECK_EQ(cli__pull_name_check("model-Q4_0.gguf", &base, &eb), KS_OK);
    CHECK_STR_EQ(base, "model-Q4_0.gguf");
    CHECK_EQ(cli__pull_name_check("Q4_K_M/model-Q4_K_M.GGUF", &base, &eb), KS_OK);
    CHECK_STR_EQ(base, "model-Q4_K_M.GGUF"); // only the file name is written
    const char *bad[] = {"",
                         "../model.gguf",
                         "a/../../model.gguf",
                         "a/./model.gguf",
                         "/etc/model.gguf",
                         "a//model.gguf",
                         "model.gguf/",
                         "..",
                         "a\\..\\model.gguf",
                         "mod\nel.gguf",
                         "mod\x1b[2Jel.gguf",
                         "mod\x7f.gguf",
                         ".hidden.gguf",
                         "model.bin",
                         "model.gguf.part"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ks_errbuf_clear(&eb);
        if (cli__pull_name_check(bad[i], &base, &eb) != KS_ERR_INVAL) {
            fprintf(stderr, "name check accepted '%s'\n", bad[i]);
            CHECK(0);
        }
        CHECK(eb.msg[0] != '\0');
    }
}

static void test_shard(void) {
    CHECK(cli__pull_is_shard("m-Q8_0-00001-of-00003.gguf"));
    CHECK(cli__pull_is_shard("dir/m-Q8_0-00003-of-00003.gguf"));
    CHECK(!cli__pull_is_shard("m-Q8_0.gguf"));
    CHECK(!cli__pull_is_shard("m-0001-of-0003.gguf"));
    CHECK(!cli__pull_is_shard("m-00001-of-00003.bin"));
    CHECK(!cli__pull_is_shard("-of-.gguf"));
}

// ----------------------------------------------------------------------------
// The listing

static void test_list_parse(void) {
    cli__hub_list l = {0};
    ks_errbuf eb = {0};
    char json[2048];
    snprintf(json, sizeof json,
             "[{\"type\":\"file\",\"oid\":\"abc\",\"size\":1519,\"path\":\".gitattributes\"},"
             "{\"type\":\"directory\",\"oid\":\"def\",\"size\":0,\"path\":\"Q4_K_M\"},"
             "{\"type\":\"file\",\"oid\":\"0123\",\"size\":134,\"path\":\"Q4_K_M/m-Q4_K_M.gguf\","
             "\"lfs\":{\"oid\":\"%s\",\"size\":4368439584,\"pointerSize\":134}}]",
             "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08");
    CHECK_EQ(cli__hub_list_parse(&l, json, strlen(json), &eb), KS_OK);
    CHECK_EQ(l.n, 2); // the directory is skipped
    CHECK_STR_EQ(l.v[0].path, ".gitattributes");
    CHECK_EQ(l.v[0].size, 1519);
    CHECK_STR_EQ(l.v[0].sha256, ""); // not in LFS: no sha256
    CHECK_STR_EQ(l.v[1].path, "Q4_K_M/m-Q4_K_M.gguf");
    CHECK_EQ(l.v[1].size, 4368439584ll); // lfs.size, not the pointer's
    CHECK_STR_EQ(l.v[1].sha256, SHA_A);  // lower-cased
    // a second page appends
    const char *page2 = "[{\"type\":\"file\",\"size\":5,\"path\":\"README.md\"}]";
    CHECK_EQ(cli__hub_list_parse(&l, page2, strlen(page2), &eb), KS_OK);
    CHECK_EQ(l.n, 3);
    cli__hub_list_free(&l);
    CHECK_EQ(l.n, 0);

    const char *bad[] = {
        "not json",
        "{\"type\":\"file\"}",
        "[{\"type\":\"file\",\"size\":5}]",
        "[{\"type\":\"file\",\"path\":\"x.gguf\"}]",
        "[{\"type\":\"file\",\"path\":\"x.gguf\",\"size\":-1}]",
        "[{\"type\":\"file\",\"path\":\"x.gguf\",\"size\":5,\"lfs\":{\"oid\":\"xyz\",\"size\":5}}]",
        "[{\"type\":\"file\",\"path\":\"x.gguf\",\"size\":5,\"lfs\":{\"size\":5}}]",
        ("[{\"type\":\"file\",\"path\":\"x.gguf\",\"size\":5,\"lfs\":{\"oid\":\"" /* 63 hex */
         "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a0\",\"size\":5}}]"),
        "[3]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ks_errbuf_clear(&eb);
        if (cli__hub_list_parse(&l, bad[i], strlen(bad[i]), &eb) != KS_ERR_FORMAT) {
            fprintf(stderr, "listing accepted: %s\n", bad[i]);
            CHECK(0);
        }
        CHECK(eb.msg[0] != '\0');
        cli__hub_list_free(&l);
    }
}

// ----------------------------------------------------------------------------
// Choosing

static void list_of(cli__hub_list *l, const char *const *paths, int n) {
    memset(l, 0, sizeof *l);
    l->v = calloc((size_t)n, sizeof *l->v);
    CHECK(l->v != NULL);
    l->n = l->cap = n;
    for (int i = 0; i < n; i++) {
        l->v[i].path = strdup(paths[i]);
        l->v[i].size = 100 + i;
    }
}

static void test_choose(void) {
    const char *const repo[] = {
        "README.md",
        "model-Q4_K_M.gguf",
        "model-Q4_K_S.gguf",
        "model-Q8_0.gguf",
        "model-Q4_0.gguf",
        "model-Q4_0_4_4.gguf",
        "mmproj-model-f16.gguf",
        "model-F16.gguf",
        "split/model-Q6_K-00001-of-00002.gguf",
        "split/model-Q6_K-00002-of-00002.gguf",
    };
    cli__hub_list l;
    list_of(&l, repo, (int)(sizeof repo / sizeof repo[0]));
    int idx[16];
    CHECK_EQ(cli__pull_choose(&l, "q8_0", idx, 16), 1); // case-insensitive
    CHECK_EQ(idx[0], 3);
    CHECK_EQ(cli__pull_choose(&l, "Q4_K_M", idx, 16), 1);
    CHECK_EQ(idx[0], 1);
    // "Q4_K" is in both K quants, standing alone in neither: ambiguous
    CHECK_EQ(cli__pull_choose(&l, "Q4_K", idx, 16), 2);
    CHECK_EQ(idx[0], 1);
    CHECK_EQ(idx[1], 2);
    // "Q4_0" stands alone in model-Q4_0.gguf only: that one wins
    CHECK_EQ(cli__pull_choose(&l, "Q4_0", idx, 16), 1);
    CHECK_EQ(idx[0], 4);
    // the projector also says f16 but is never picked
    CHECK_EQ(cli__pull_choose(&l, "f16", idx, 16), 1);
    CHECK_EQ(idx[0], 7);
    CHECK_EQ(cli__pull_choose(&l, "Q5_K_M", idx, 16), 0);
    // no tag: every .gguf but the projector (8), README.md never
    CHECK_EQ(cli__pull_choose(&l, NULL, idx, 16), 8);
    CHECK_EQ(cli__pull_choose(&l, "", idx, 4), 8); // count beyond cap
    // the shards of a split file: both match, both are shards
    CHECK_EQ(cli__pull_choose(&l, "Q6_K", idx, 16), 2);
    CHECK(cli__pull_is_shard(l.v[idx[0]].path) && cli__pull_is_shard(l.v[idx[1]].path));
    cli__hub_list_free(&l);

    const char *const one[] = {"README.md", "config.json", "tiny.GGUF"};
    list_of(&l, one, 3);
    CHECK_EQ(cli__pull_choose(&l, NULL, idx, 16), 1);
    CHECK_EQ(idx[0], 2);
    cli__hub_list_free(&l);
}

// ----------------------------------------------------------------------------
// The models directory

static void test_models_dir(void) {
    char buf[256];
    setenv("HOME", "/home/someone", 1);
    unsetenv("KVSEAL_MODELS_DIR");
    CHECK_STR_EQ(cli__models_dir_default(buf, sizeof buf), "/home/someone/.cache/kvseal/models");
    setenv("KVSEAL_MODELS_DIR", "/srv/models", 1);
    CHECK_STR_EQ(cli__models_dir_default(buf, sizeof buf), "/srv/models");
    setenv("KVSEAL_MODELS_DIR", "", 1); // empty: as if unset
    CHECK_STR_EQ(cli__models_dir_default(buf, sizeof buf), "/home/someone/.cache/kvseal/models");
    CHECK(cli__models_dir_default(buf, 10) == NULL); // does not fit
    unsetenv("HOME");
    CHECK(cli__models_dir_default(buf, sizeof buf) == NULL);
}

int main(void) {
    test_spec();
    test_name_check();
    test_shard();
    test_list_parse();
    test_choose();
    test_models_dir();
    printf("test_cli_pull: ok\n");
    return 0;
}
