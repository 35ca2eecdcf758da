/* pull_hub.c — the pure half of `kvseal pull` (cli_int.h; the command and
 * its network side are cmd_pull.c): parsing ORG/REPO[:QUANT] and
 * ORG/REPO/path.gguf, reading the Hugging Face tree API's file list
 * (GET /api/models/ORG/REPO/tree/REV: a JSON array of {type, path, size,
 * oid, lfs: {oid (the sha256), size}}), choosing the file a quant tag names,
 * and checking a file name from the hub before it names a file on disk.
 * Everything here is untrusted input from the user or from the hub; no
 * function does I/O. */
#include "cli_int.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Most entries a listing may hold (every page together). */
#define PULL_MAX_FILES 200000

// ----------------------------------------------------------------------------
// The spec

/* A repository owner or name: 1-96 of [A-Za-z0-9._-], no "..", not starting
 * with '.' or '-' (the hub's rule, and nothing a URL or a path would read
 * as more than a name). */
static bool hub__name_ok(const char *s, size_t n) {
    if (n < 1 || n > 96 || s[0] == '.' || s[0] == '-') return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '.' && c != '_' && c != '-') return false;
        if (c == '.' && i + 1 < n && s[i + 1] == '.') return false;
    }
    return true;
}

ks_err cli__pull_spec_parse(const char *s, cli__pull_spec *sp, ks_errbuf *eb) {
    memset(sp, 0, sizeof *sp);
    static const char *const prefixes[] = {"https://huggingface.co/", "https://hf.co/",
                                           "huggingface.co/", "hf.co/"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        size_t n = strlen(prefixes[i]);
        if (!strncmp(s, prefixes[i], n)) {
            s += n;
            break;
        }
    }
    const char *slash = strchr(s, '/');
    if (!slash)
        return ks_seterr(eb, KS_ERR_INVAL, "'%s': expected ORG/REPO[:QUANT] or ORG/REPO/FILE.gguf",
                         s);
    size_t n_org = (size_t)(slash - s);
    const char *name = slash + 1;
    const char *rest = strchr(name, '/');
    const char *colon = strchr(name, ':');
    size_t n_name = rest ? (size_t)(rest - name) : colon ? (size_t)(colon - name) : strlen(name);
    if (!hub__name_ok(s, n_org))
        return ks_seterr(eb, KS_ERR_INVAL,
                         "'%.*s': not a repository owner (1-96 of A-Z a-z 0-9 . _ -, no '..')",
                         (int)n_org, s);
    if (!hub__name_ok(name, n_name))
        return ks_seterr(eb, KS_ERR_INVAL,
                         "'%.*s': not a repository name (1-96 of A-Z a-z 0-9 . _ -, no '..')",
                         (int)n_name, name);
    snprintf(sp->repo, sizeof sp->repo, "%.*s/%.*s", (int)n_org, s, (int)n_name, name);
    if (rest) {
        const char *path = rest + 1, *base;
        if (strlen(path) >= sizeof sp->path)
            return ks_seterr(eb, KS_ERR_INVAL, "the file path is longer than %zu bytes",
                             sizeof sp->path - 1);
        ks_err e = cli__pull_name_check(path, &base, eb);
        if (e) return e;
        snprintf(sp->path, sizeof sp->path, "%s", path);
        return KS_OK;
    }
    if (colon) {
        const char *q = colon + 1;
        size_t n = strlen(q);
        if (n < 1 || n >= sizeof sp->quant)
            return ks_seterr(eb, KS_ERR_INVAL, "the quant tag after ':' must be 1-%zu characters",
                             sizeof sp->quant - 1);
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)q[i];
            if (!isalnum(c) && c != '.' && c != '_' && c != '-')
                return ks_seterr(eb, KS_ERR_INVAL,
                                 "quant tag '%s': only A-Z a-z 0-9 . _ - (such as Q4_K_M or q8_0)",
                                 q);
        }
        memcpy(sp->quant, q, n + 1);
    }
    return KS_OK;
}

// ----------------------------------------------------------------------------
// Names

static bool hub__ends_with_ci(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && !strncasecmp(s + n - k, suffix, k);
}

ks_err cli__pull_name_check(const char *path, const char **base, ks_errbuf *eb) {
    size_t n = strlen(path);
    if (n == 0) return ks_seterr(eb, KS_ERR_INVAL, "empty file name");
    if (n > 1000) return ks_seterr(eb, KS_ERR_INVAL, "file name longer than 1000 bytes");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c < 0x20 || c == 0x7f)
            return ks_seterr(eb, KS_ERR_INVAL, "file name with a control character (byte %zu)", i);
        if (c == '\\') return ks_seterr(eb, KS_ERR_INVAL, "file name '%s' has a backslash", path);
    }
    if (path[0] == '/') return ks_seterr(eb, KS_ERR_INVAL, "'%s' is an absolute path", path);
    const char *comp = path;
    for (;;) {
        const char *end = strchr(comp, '/');
        size_t len = end ? (size_t)(end - comp) : strlen(comp);
        if (len == 0 || (len == 1 && comp[0] == '.') || (len == 2 && !strncmp(comp, "..", 2)))
            return ks_seterr(eb, KS_ERR_INVAL,
                             "'%s': a path component is empty, '.' or '..'", path);
        if (!end) break;
        comp = end + 1;
    }
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t nb = strlen(b);
    if (b[0] == '.') return ks_seterr(eb, KS_ERR_INVAL, "'%s': a hidden file name", path);
    if (nb > 200) return ks_seterr(eb, KS_ERR_INVAL, "'%s': file name over 200 bytes", path);
    if (!hub__ends_with_ci(b, nb, ".gguf"))
        return ks_seterr(eb, KS_ERR_INVAL, "'%s' is not a .gguf file", path);
    *base = b;
    return KS_OK;
}

bool cli__pull_is_shard(const char *path) {
    // "-NNNNN-of-NNNNN.gguf" (gguf-split's names)
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    const size_t tail = 1 + 5 + 4 + 5 + 5; // "-00001-of-00003.gguf"
    if (n < tail || !hub__ends_with_ci(b, n, ".gguf")) return false;
    const char *t = b + n - tail;
    if (t[0] != '-' || strncmp(t + 6, "-of-", 4) != 0) return false;
    for (int i = 0; i < 5; i++)
        if (!isdigit((unsigned char)t[1 + i]) || !isdigit((unsigned char)t[10 + i])) return false;
    return true;
}

// ----------------------------------------------------------------------------
// The listing

ks_err cli__hub_list_parse(cli__hub_list *l, const char *json, size_t len, ks_errbuf *eb) {
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root) return ks_seterr(eb, KS_ERR_FORMAT, "the hub's file list is not JSON: %s", je.text);
    ks_err e = KS_OK;
    if (!json_is_array(root)) {
        e = ks_seterr(eb, KS_ERR_FORMAT, "the hub's file list is not a JSON array");
        goto done;
    }
    size_t i;
    json_t *it;
    json_array_foreach(root, i, it) {
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *path = json_string_value(json_object_get(it, "path"));
        if (!json_is_object(it) || !type || !path) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "the hub's file list: entry %zu lacks type or path", i);
            goto done;
        }
        if (strcmp(type, "file") != 0) continue; // directories (recursive listings list both)
        json_t *lfs = json_object_get(it, "lfs");
        json_t *size = json_object_get(lfs ? lfs : it, "size");
        const char *oid = lfs ? json_string_value(json_object_get(lfs, "oid")) : NULL;
        if (!json_is_integer(size) || json_integer_value(size) < 0) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "the hub's file list: '%.200s' has no size", path);
            goto done;
        }
        if (lfs) {
            bool hex = oid && strlen(oid) == 64;
            for (int k = 0; hex && k < 64; k++) hex = isxdigit((unsigned char)oid[k]) != 0;
            if (!hex) {
                e = ks_seterr(eb, KS_ERR_FORMAT,
                              "the hub's file list: '%.200s': lfs.oid is not a sha256", path);
                goto done;
            }
        }
        if (l->n >= PULL_MAX_FILES) {
            e = ks_seterr(eb, KS_ERR_FORMAT, "the hub's file list holds over %d files",
                          PULL_MAX_FILES);
            goto done;
        }
        if (l->n == l->cap) {
            int cap = l->cap ? l->cap * 2 : 64;
            cli__hub_file *v = realloc(l->v, sizeof *v * (size_t)cap);
            if (!v) {
                e = ks_seterr(eb, KS_ERR_NOMEM, "the hub's file list");
                goto done;
            }
            l->v = v;
            l->cap = cap;
        }
        cli__hub_file *f = &l->v[l->n];
        memset(f, 0, sizeof *f);
        if (!(f->path = strdup(path))) {
            e = ks_seterr(eb, KS_ERR_NOMEM, "the hub's file list");
            goto done;
        }
        f->size = (int64_t)json_integer_value(size);
        for (int k = 0; oid && k < 64; k++) f->sha256[k] = (char)tolower((unsigned char)oid[k]);
        l->n++;
    }
done:
    json_decref(root);
    return e;
}

void cli__hub_list_free(cli__hub_list *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i].path);
    free(l->v);
    memset(l, 0, sizeof *l);
}

// ----------------------------------------------------------------------------
// Choosing

/* Where quant occurs in s case-insensitively; NULL if it does not. */
static const char *hub__find_ci(const char *s, const char *quant) {
    size_t nq = strlen(quant);
    for (const char *p = s; *p; p++)
        if (!strncasecmp(p, quant, nq)) return p;
    return NULL;
}

static bool hub__word(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* 0: quant is not in name; 1: it is; 2: it is, standing alone somewhere. */
static int hub__quant_match(const char *name, const char *quant) {
    int m = 0;
    size_t nq = strlen(quant);
    for (const char *p = name; (p = hub__find_ci(p, quant)) != NULL; p++) {
        m = 1;
        bool left = p == name || !hub__word(p[-1]);
        bool right = !hub__word(p[nq]);
        if (left && right) return 2;
    }
    return m;
}

int cli__pull_choose(const cli__hub_list *l, const char *quant, int *idx, int cap) {
    int n = 0, best = 0;
    for (int pass = 0; pass < 2; pass++) {
        n = 0;
        for (int i = 0; i < l->n; i++) {
            const char *p = l->v[i].path;
            const char *b = strrchr(p, '/');
            b = b ? b + 1 : p;
            size_t nb = strlen(b);
            if (!hub__ends_with_ci(b, nb, ".gguf") || hub__find_ci(b, "mmproj")) continue;
            int m = quant && *quant ? hub__quant_match(b, quant) : 2;
            if (pass == 0) {
                if (m > best) best = m;
                continue;
            }
            // several contain the tag: those where it stands alone, if any
            if (m == 0 || m < best) continue;
            if (n < cap) idx[n] = i;
            n++;
        }
        if (best == 0) return 0;
    }
    return n;
}
