/* adapter.c — the engine's LoRA adapters (engine.h "LoRA adapters"): a
 * registry of tenant-owned adapters, resolved under the request's tenant at
 * submit, referenced by every request that uses one, and scrubbed when the
 * last reference goes.
 *
 * An adapter is a tenant's private data, and so is everything computed
 * with it: a name resolves only among the tenant's own adapters and the
 * public ones (any other answers "not found", the same words whether or
 * not another tenant has the name, after the same scan of the whole list),
 * and a request's prefix-cache root mixes in the adapter's digest, so a
 * cached prefix is found only by requests of the same domain AND adapter.
 * The registry is guarded by e->amu; the adapter objects are immutable
 * once registered (the forward pass reads their factors from the scheduler
 * thread while others look names up). */
#include "engine_int.h"

#include "kvseal/admit.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

bool engine_adapter_name_ok(const char *n) {
    size_t len = n ? strlen(n) : 0;
    if (len == 0 || len >= ENGINE_ADAPTER_NAME_MAX || n[0] == '.') return false;
    for (size_t i = 0; i < len; i++) {
        char c = n[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

void engine_root_with_adapter(uint8_t root[KV_ROOT_BYTES],
                              const uint8_t digest[ENGINE_ADAPTER_DIGEST_BYTES]) {
#ifdef KS_BROKEN_ADAPTER_SHARED_PREFIX
    (void)root, (void)digest; // TEST ONLY: prefixes pass between adapters of a domain
#else
    static const char label[] = "kvseal/prefix/v1/adapter";
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, (const uint8_t *)label, sizeof label - 1);
    crypto_hash_sha256_update(&st, root, KV_ROOT_BYTES);
    crypto_hash_sha256_update(&st, digest, ENGINE_ADAPTER_DIGEST_BYTES);
    crypto_hash_sha256_final(&st, root);
#endif
}

void engine_adapter_digest(const void *data, size_t len, float scale,
                           uint8_t out[ENGINE_ADAPTER_DIGEST_BYTES]) {
    if (scale == 0.0f) scale = 1.0f;
    uint32_t bits;
    memcpy(&bits, &scale, sizeof bits);
    const uint8_t le[4] = {(uint8_t)bits, (uint8_t)(bits >> 8), (uint8_t)(bits >> 16),
                           (uint8_t)(bits >> 24)};
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, data, len);
    crypto_hash_sha256_update(&st, le, sizeof le);
    crypto_hash_sha256_final(&st, out);
}

/* Frees a's factors (model_lora_free scrubs them) and a itself, and has the
 * scheduler drop the cached prefixes no request uses: KV computed under a
 * removed adapter is its tenant's data too. The last reference goes with a
 * request's end, after its pages were released, so its prefixes go too. */
static void adapter__free(engine *e, engine__adapter *a) {
    atomic_fetch_sub(&e->adapter_bytes, a->bytes);
    model_lora_free(a->lora);
    sodium_memzero(a, sizeof *a); // the name is the tenant's too
    free(a);
    atomic_store(&e->prefix_flush, true);
}

void engine__adapter_unref(engine *e, engine__adapter *a) {
    if (a && atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) == 1)
        adapter__free(e, a);
}

/* Whether a is visible to tenant: its own, or public. Both comparisons run
 * whatever the first gives. */
static bool adapter__visible(const engine__adapter *a, const char *tenant, const char *name) {
#ifdef KS_BROKEN_ADAPTER_ANY_TENANT
    (void)tenant; // TEST ONLY: any tenant's adapter answers to its name
    return !strcmp(a->name, name);
#else
    bool own = !strcmp(a->tenant, tenant), named = !strcmp(a->name, name);
    return named & (own | a->pub);
#endif
}

/* The adapter tenant's request named name resolves to (a reference the
 * caller drops with engine__adapter_unref), or NULL. Its own wins over a
 * public one of that name; the whole list is scanned either way. */
static engine__adapter *engine__adapter_get(engine *e, const char *tenant, const char *name) {
    engine__adapter *own = NULL, *pub = NULL;
    pthread_mutex_lock(&e->amu);
    for (engine__adapter *a = e->adapters; a; a = a->next) {
        bool v = adapter__visible(a, tenant, name);
        if (v && !strcmp(a->tenant, tenant) && !own) own = a;
        else if (v && !pub) pub = a;
    }
    engine__adapter *a = own ? own : pub;
    if (a) atomic_fetch_add(&a->refs, 1);
    pthread_mutex_unlock(&e->amu);
    return a;
}

bool engine_adapter_visible(engine *e, const char *tenant, const char *name) {
    engine__adapter *a = engine__adapter_get(e, tenant ? tenant : "default", name ? name : "");
    engine__adapter_unref(e, a);
    return a != NULL;
}

ks_err engine__adapter_resolve(engine *e, const char *tenant, const char *name,
                               engine__adapter **out, ks_errbuf *eb) {
    *out = NULL;
    if (!name || !*name) return KS_OK;
    *out = engine__adapter_get(e, tenant ? tenant : "default", name);
    if (*out) return KS_OK;
    // the same words whether another tenant has the name or nobody does
    char shown[ENGINE_ADAPTER_NAME_MAX];
    snprintf(shown, sizeof shown, "%s", name);
    return admit_refuse(eb, ADMIT_ADAPTER_NOT_FOUND, "The adapter '%s%s' does not exist", shown,
                        strlen(name) >= sizeof shown ? "..." : "");
}

ks_err engine_adapter_add(engine *e, const engine_adapter_spec *s, ks_errbuf *eb) {
    const char *tenant = s->tenant ? s->tenant : "default";
    if (!engine_adapter_name_ok(s->name))
        return ks_seterr(eb, KS_ERR_INVAL,
                         "adapter name '%.64s': 1-%d of [A-Za-z0-9._-], not starting with '.'",
                         s->name ? s->name : "", ENGINE_ADAPTER_NAME_MAX - 1);
    if (strlen(tenant) >= sizeof((engine__adapter *)0)->tenant)
        return ks_seterr(eb, KS_ERR_INVAL, "tenant name too long");
    float scale = s->scale == 0.0f ? 1.0f : s->scale;
    if (!(scale > -100.0f && scale < 100.0f))
        return ks_seterr(eb, KS_ERR_INVAL, "adapter scale %g: must be in (-100, 100)",
                         (double)s->scale);
    engine__adapter *a = calloc(1, sizeof *a);
    if (!a) return ks_seterr(eb, KS_ERR_NOMEM, "adapter");
    gguf_file *f = NULL;
    ks_err err = gguf_open_mem(s->data, s->len, s->name, &f, eb);
    if (!err) err = model_lora_load_file(e->m, f, &a->lora, eb); // closes f
    if (err) {
        free(a);
        return err;
    }
    model_lora_set_scale(a->lora, scale);
    atomic_init(&a->refs, 1); // the registry's
    snprintf(a->tenant, sizeof a->tenant, "%s", tenant);
    snprintf(a->name, sizeof a->name, "%s", s->name);
    a->pub = s->is_public;
    a->scale = scale;
    a->bytes = model_lora_bytes(a->lora);
    // the digest: the file's bytes and the scale (same file, same scale:
    // the same computation, on any worker of a cluster)
    engine_adapter_digest(s->data, s->len, scale, a->digest);
    pthread_mutex_lock(&e->amu);
    const char *clash = NULL;
    ks_err why = KS_ERR_EXISTS;
    uint32_t n = 0;
    engine__adapter **tail = &e->adapters;
    for (engine__adapter *b = *tail; b; tail = &b->next, b = b->next, n++) {
        if (strcmp(b->name, a->name)) continue;
        if (!strcmp(b->tenant, tenant)) clash = "this tenant already has an adapter named";
        else if (b->pub && a->pub) clash = "a public adapter is already named";
    }
    if (!clash && n >= ENGINE_ADAPTERS_MAX) {
        clash = "the adapter limit is reached; not added:";
        why = KS_ERR_NOSPACE;
    }
    if (!clash) {
        *tail = a;
        atomic_fetch_add(&e->adapter_bytes, a->bytes);
        atomic_fetch_add(&e->n_adapters, 1);
    }
    pthread_mutex_unlock(&e->amu);
    if (clash) {
        model_lora_free(a->lora);
        free(a);
        return ks_seterr(eb, why, "%s '%s'", clash, s->name);
    }
    return KS_OK;
}

ks_err engine_adapter_remove(engine *e, const char *tenant, const char *name, ks_errbuf *eb) {
    tenant = tenant ? tenant : "default";
    engine__adapter *found = NULL;
    pthread_mutex_lock(&e->amu);
    for (engine__adapter **pp = &e->adapters; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->tenant, tenant) && !strcmp((*pp)->name, name ? name : "")) {
            found = *pp;
            *pp = found->next;
            atomic_fetch_sub(&e->n_adapters, 1);
            break;
        }
    pthread_mutex_unlock(&e->amu);
    if (!found)
        return admit_refuse(eb, ADMIT_ADAPTER_NOT_FOUND, "The adapter '%.64s' does not exist",
                            name ? name : "");
    engine__adapter_unref(e, found); // the registry's reference
    pthread_mutex_lock(&e->mu); // an idle scheduler drops the prefixes now
    e->kick++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return KS_OK;
}

int engine_adapter_list(engine *e, const char *tenant, engine_adapter_info *out, int cap) {
    int n = 0;
    pthread_mutex_lock(&e->amu);
    for (engine__adapter *a = e->adapters; a; a = a->next) {
        if (tenant && strcmp(a->tenant, tenant) && !a->pub) continue;
        if (n < cap) {
            engine_adapter_info *i = &out[n];
            memset(i, 0, sizeof *i);
            snprintf(i->tenant, sizeof i->tenant, "%s", a->tenant);
            snprintf(i->name, sizeof i->name, "%s", a->name);
            i->is_public = a->pub;
            i->scale = a->scale;
            i->rank = model_lora_rank(a->lora);
            i->n_mats = model_lora_n_mats(a->lora);
            i->bytes = a->bytes;
            i->running = (uint32_t)atomic_load(&a->refs) - 1;
            memcpy(i->digest, a->digest, sizeof i->digest);
        }
        n++;
    }
    pthread_mutex_unlock(&e->amu);
    return n;
}

void engine__adapters_free(engine *e) {
    engine__adapter *a = e->adapters;
    e->adapters = NULL;
    while (a) {
        engine__adapter *next = a->next;
        engine__adapter_unref(e, a);
        a = next;
    }
}
