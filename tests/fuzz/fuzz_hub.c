/* fuzz_hub.c — libFuzzer harness for `kvseal pull`'s reading of what the
 * hub and the user send (src/cli/pull_hub.c).
 *
 * Each input is a first line, then a file list: the line goes to
 * cli__pull_spec_parse as a spec and to cli__pull_choose as a quant tag, the
 * rest to cli__hub_list_parse as a tree API page (twice: pages append).
 * Whatever is accepted must be safe to use: a parsed spec's repository is
 * "owner/name" with one '/', its tag and path pass their own checks; every
 * file that cli__pull_name_check accepts yields a file name with no '/',
 * no control character, not starting with '.', ending in ".gguf", inside
 * the path; every file cli__pull_choose picks is a listed .gguf whose name
 * holds the tag. A refusal must say why. Built only with KS_FUZZ=ON; see
 * tests/fuzz/README.md. */
#include "cli/cli_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void hub_check_base(const char *path) {
    const char *base = NULL;
    ks_errbuf eb;
    memset(&eb, 0, sizeof eb);
    if (cli__pull_name_check(path, &base, &eb) != KS_OK) {
        if (eb.msg[0] == '\0') abort();
        return;
    }
    size_t np = strlen(path), nb = strlen(base);
    if (base < path || base + nb != path + np) abort(); // inside the path, its tail
    if (strchr(base, '/') || base[0] == '.' || nb < 5 || strcasecmp(base + nb - 5, ".gguf") != 0)
        abort();
    for (const char *p = path; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '\\') abort();
    if (path[0] == '/' || strstr(path, "/../") || !strncmp(path, "../", 3) || strstr(path, "//"))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size);
    size_t n_line = nl ? (size_t)(nl - data) : size;
    char *line = malloc(n_line + 1);
    if (!line) return 0;
    memcpy(line, data, n_line);
    line[n_line] = '\0'; // a NUL inside ends the line early, as argv would
    const char *json = nl ? (const char *)nl + 1 : "";
    size_t n_json = nl ? size - n_line - 1 : 0;

    cli__pull_spec sp;
    ks_errbuf eb;
    memset(&eb, 0, sizeof eb);
    if (cli__pull_spec_parse(line, &sp, &eb) == KS_OK) {
        const char *slash = strchr(sp.repo, '/');
        if (!slash || strchr(slash + 1, '/') || slash == sp.repo || !slash[1]) abort();
        if (strstr(sp.repo, "..")) abort();
        if (sp.path[0]) hub_check_base(sp.path);
        if (sp.path[0] && sp.quant[0]) abort();
    } else if (eb.msg[0] == '\0') {
        abort();
    }

    cli__hub_list l;
    memset(&l, 0, sizeof l);
    for (int page = 0; page < 2; page++) {
        memset(&eb, 0, sizeof eb);
        ks_err e = cli__hub_list_parse(&l, json, n_json, &eb);
        if (e != KS_OK && eb.msg[0] == '\0') abort();
        if (e != KS_OK) break;
    }
    for (int i = 0; i < l.n; i++) {
        const cli__hub_file *f = &l.v[i];
        if (!f->path || f->size < 0) abort();
        size_t ns = strlen(f->sha256);
        if (ns != 0 && ns != 64) abort();
        hub_check_base(f->path);
        (void)cli__pull_is_shard(f->path);
    }
    int idx[8];
    int n = cli__pull_choose(&l, line, idx, 8);
    if (n < 0 || n > l.n) abort();
    for (int k = 0; k < (n < 8 ? n : 8); k++) {
        if (idx[k] < 0 || idx[k] >= l.n) abort();
        const char *p = l.v[idx[k]].path;
        const char *b = strrchr(p, '/');
        b = b ? b + 1 : p;
        size_t nb = strlen(b), nq = strlen(line);
        if (nb < 5 || strcasecmp(b + nb - 5, ".gguf") != 0) abort();
        bool has = nq == 0;
        for (size_t j = 0; !has && j + nq <= nb; j++) has = !strncasecmp(b + j, line, nq);
        if (!has) abort();
    }
    cli__hub_list_free(&l);
    free(line);
    return 0;
}
