/* grammar.c — the compiled grammar as an object (see grammar.h): its
 * reference count, its freeing (the token classes it filled in included,
 * and their share of the process-wide cap) and its GBNF text. The floor of
 * the module's files: it calls none of the others. Layout: grammar_int.h. */
#include "grammar_int.h"

atomic_size_t grammar__pm_total; // bytes of all grammars' token classes (GM__PM_TOTAL_BYTES)

grammar *grammar_ref(grammar *g) {
    atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
    return g;
}

void grammar__pmask_free(gm_pmask *pm) {
    if (!pm) return;
    free(pm->acc);
    free(pm->acc_ids);
    free(pm->unc);
    free(pm);
}

void grammar__free(grammar *g) {
    if (!g) return;
    atomic_fetch_sub_explicit(&grammar__pm_total, atomic_load(&g->pm_bytes), memory_order_relaxed);
    for (gm_vtab *t = atomic_load(&g->vtabs), *nx; t; t = nx) {
        nx = t->next;
        for (uint32_t i = 0; i < t->cap; i++)
            grammar__pmask_free(t->ht[i].pm);
        for (int i = 0; i < GM__SHARED; i++) {
            free(t->shared[i].key);
            free(t->shared[i].bits);
        }
        free(t->ht);
        pthread_mutex_destroy(&t->mu);
        free(t);
    }
    for (uint32_t i = 0; i < g->n_rules; i++)
        free(g->rules[i].name);
    free(g->rules);
    free(g->elems);
    free(g->alts);
    free(g->ranges);
    free(g->csets);
    free(g->ht);
    free(g->text);
    free(g);
}

void grammar_unref(grammar *g) {
    if (!g) return;
    if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) == 1) grammar__free(g);
}

const char *grammar_text(const grammar *g, size_t *len) {
    *len = g->text_len;
    return g->text;
}
