/* fuzz_tenants.c — libFuzzer harness for the tenants file parser
 * (srv_tenants_parse, src/server/tenants.c).
 *
 * Each input is the text of a tenants file. A file that parses must give a
 * usable table: tenant i is the file's tenants[i], each of its keys (read
 * back from the file with jansson) authenticates as tenant i and no other,
 * the admin key is the admin key, a key that is not in the file never
 * authenticates, and admission and release work for every tenant. A file
 * that fails must say why. Built only with KS_FUZZ=ON; see
 * tests/fuzz/README.md. */
#include "server/server_int.h"

#include <jansson.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    srv_tenants *ts = NULL;
    ks_errbuf eb;
    memset(&eb, 0, sizeof eb);
    ks_err e = srv_tenants_parse((const char *)data, size, &ts, &eb);
    if (e != KS_OK) {
        if (ts || eb.msg[0] == '\0') abort();
        return 0;
    }
    if (!ts || ts->n == 0) abort();
    /* a key no file can hold: it never matches a tenant */
    /* jansson refuses \u0000 in strings, so no file holds a key with a NUL */
    static const char nokey[] = "not\0a-key";
    if (srv_tenants_auth(ts, nokey, sizeof nokey - 1) != -1) abort();
    (void)srv_tenants_admin_ok(ts, nokey, sizeof nokey - 1);
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    json_t *arr = json_object_get(root, "tenants");
    if (!root || json_array_size(arr) != ts->n) abort();
    for (size_t i = 0; i < ts->n; i++) {
        json_t *t = json_array_get(arr, i), *keys = json_object_get(t, "keys"), *key;
        if (strcmp(ts->t[i].name, json_string_value(json_object_get(t, "name"))) != 0) abort();
        size_t k;
        json_array_foreach(keys, k, key) {
            if (srv_tenants_auth(ts, json_string_value(key), json_string_length(key)) != (int)i)
                abort();
        }
    }
    json_t *admin = json_object_get(root, "admin_key");
    if (json_is_string(admin) &&
        !srv_tenants_admin_ok(ts, json_string_value(admin), json_string_length(admin)))
        abort();
    json_decref(root);
    for (size_t i = 0; i < ts->n; i++) {
        if (ts->t[i].name[0] == '\0') abort();
        char msg[256];
        admit_reason rj = srv_tenants_admit(ts, (int)i, 100, 1000000000ull, msg, sizeof msg);
        if (rj == ADMIT_OK) srv_tenants_release(ts, (int)i, 10);
    }
    srv_tenants_free(ts);
    return 0;
}
