/* router_pair.c — the router's pairing policy (router_int.h): which prefill
 * and which decode worker a request goes to. Decode: the worker with the
 * fewest requests in flight whose pool can hold the request. Prefill: the
 * least loaded one, unless the one a rendezvous hash of (domain, first
 * prompt page) prefers is at most RT_AFFINITY_SLACK requests busier, so a
 * tenant's repeated prefix meets the prefill worker whose cache holds it.
 * Runs on the router's loop thread (rt__schedule), reading its worker list;
 * it sends nothing and changes no state. */
#include "router_int.h"

#include <sodium.h>
#include <string.h>

#define RT_AFFINITY_SLACK 1 /* extra requests in flight a prefix-preferred prefill may have */

rt_worker *rt__pick(cluster_router *r, int mi, uint8_t role, uint32_t need_pages, uint32_t avoid) {
    rt_worker *best = NULL;
    // the test-only mispair fault picks decode workers of the other models only: decode
    // must refuse them
    bool other_model = role == PD_ROLE_DECODE && r->fault_mispair;
    for (rt_worker *w = r->workers; w; w = w->next) {
        if (!w->id || w->role != role || w->draining || w->id == avoid) continue;
        if ((w->mi != mi) != other_model) continue;
        if (role == PD_ROLE_DECODE && w->n_pages < need_pages) continue;
        if (!best || w->inflight < best->inflight ||
            (w->inflight == best->inflight && w->free_pages > best->free_pages))
            best = w;
    }
    return best;
}

/* Rendezvous score of worker id for an affinity key: stable while workers
 * come and go, so a key moves only when its worker does. */
static uint64_t rt__score(const uint8_t aff[8], uint32_t id) {
    static const unsigned char key[crypto_shorthash_KEYBYTES] = {0};
    uint8_t in[12], out[crypto_shorthash_BYTES];
    memcpy(in, aff, 8);
    memcpy(in + 8, &id, 4);
    crypto_shorthash(out, in, sizeof in, key);
    uint64_t s;
    memcpy(&s, out, sizeof s);
    return s;
}

/* The prefill worker for q: the least loaded one, unless the worker q's
 * prefix prefers is within RT_AFFINITY_SLACK requests of it (prefix reuse
 * at prefill saves more than the small imbalance costs). */
rt_worker *rt__pick_prefill(cluster_router *r, const rt_req *q) {
    // the worker q lost only if it is the one left (its loss may be a blip)
    uint32_t avoid = rt__pick(r, q->mi, PD_ROLE_PREFILL, 0, q->avoid_p) ? q->avoid_p : 0;
    rt_worker *least = rt__pick(r, q->mi, PD_ROLE_PREFILL, 0, avoid);
    static const uint8_t none[8] = {0};
    if (!least || !memcmp(q->affinity, none, 8)) return least;
    rt_worker *pref = NULL;
    uint64_t best = 0;
    for (rt_worker *w = r->workers; w; w = w->next) {
        if (!w->id || w->role != PD_ROLE_PREFILL || w->draining || w->id == avoid || w->mi != q->mi)
            continue;
        uint64_t s = rt__score(q->affinity, w->id);
        if (!pref || s > best) pref = w, best = s;
    }
    return pref && pref->inflight <= least->inflight + RT_AFFINITY_SLACK ? pref : least;
}

/* The affinity key is the prefix cache's unit: the first full page of the
 * prompt, in the request's cache domain (a tenant's prefix never steers
 * another domain's requests). */
void rt__affinity(const uint8_t domain[32], const int32_t *prompt, int32_t n_prompt,
                  int32_t page_tokens, uint8_t out[8]) {
    if (n_prompt <= page_tokens) return; // no full page the prefill cache could hold
    crypto_generichash_state hs;
    uint8_t h[crypto_generichash_BYTES_MIN];
    crypto_generichash_init(&hs, NULL, 0, sizeof h);
    crypto_generichash_update(&hs, domain, 32);
    crypto_generichash_update(&hs, (const unsigned char *)prompt,
                              sizeof(int32_t) * (size_t)page_tokens);
    crypto_generichash_final(&hs, h, sizeof h);
    memcpy(out, h, 8);
    if (!memcmp(out, (const uint8_t[8]){0}, 8)) out[0] = 1;
}
