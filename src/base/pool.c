/* pool.c — the persistent compute thread pool (see base.h).
 *
 * One 64-bit state word coordinates an op: [gen:31 | closed:1 | active:32].
 * The owner opens op g (new gen, active 0), runs its share, then closes it;
 * a worker joins by CAS-incrementing `active` while the op is open and
 * leaves by decrementing it. The owner returns once the op is closed and no
 * worker is active. Work itself is claimed chunk by chunk inside the task,
 * so a worker that joins late (or never) costs nothing: on a shared,
 * oversubscribed machine the owner never waits for a thread that is not
 * running. Idle workers spin briefly, then sleep on a condition variable. */
#include "kvseal/base.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#define POOL_SPIN 4000  // polls before an idle worker sleeps (~0.2 ms)
#define POOL_GEN_SHIFT 33
#define POOL_CLOSED (1ull << 32)
#define POOL_ACTIVE_MASK 0xffffffffull

struct ks_pool {
    int nth;                    // threads including the owner (thread 0)
    pthread_t *threads;         // (nth-1)
    pthread_mutex_t mu;
    pthread_cond_t cv;          // signalled when a new op opens or on stop
    _Atomic uint64_t state;     // [gen | closed | active], see above
    atomic_int n_sleeping;      // workers blocked on cv
    atomic_int next_ith;        // ith handed to the next joiner of this op
    atomic_bool stop;
    ks_pool_fn fn;              // current op: written before the gen bump
    void *arg;
};

static uint64_t pool__gen(uint64_t s) { return s >> POOL_GEN_SHIFT; }

static void *pool__worker(void *v) {
    ks_pool *p = v;
    uint64_t seen = 0;
    for (;;) {
        uint64_t s;
        int spins = 0;
        while (pool__gen(s = atomic_load_explicit(&p->state, memory_order_acquire)) == seen) {
            if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
            if (++spins < POOL_SPIN) {
                __builtin_ia32_pause();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleeping, 1);
            while (pool__gen(atomic_load(&p->state)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->n_sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        seen = pool__gen(s);
        // join only while this very op is still open
        bool joined = false;
        while (!(s & POOL_CLOSED) && pool__gen(s) == seen) {
            if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel,
                                                      memory_order_acquire)) {
                joined = true;
                break;
            }
        }
        if (!joined) continue;
        int ith = atomic_fetch_add_explicit(&p->next_ith, 1, memory_order_relaxed);
        p->fn(p->arg, ith, p->nth);
        atomic_fetch_sub_explicit(&p->state, 1, memory_order_acq_rel);
    }
}

ks_pool *ks_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    ks_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nth = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        ks_pool_destroy(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&p->threads[i - 1], NULL, pool__worker, p) != 0) {
            ks_pool_destroy(p);  // joins the ones that started
            return NULL;
        }
        p->nth = i + 1;
    }
    return p;
}

void ks_pool_run(ks_pool *p, ks_pool_fn fn, void *arg) {
    if (p->nth == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->next_ith, 1, memory_order_relaxed);
    uint64_t gen = pool__gen(atomic_load_explicit(&p->state, memory_order_relaxed)) + 1;
    atomic_store(&p->state, (gen & ((1ull << 31) - 1)) << POOL_GEN_SHIFT);  // open, 0 active
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, p->nth);
    uint64_t s = atomic_fetch_or_explicit(&p->state, POOL_CLOSED, memory_order_acq_rel);
    // wait for the workers that joined; they are running, so this is short
    for (int spins = 0; (s & POOL_ACTIVE_MASK) != 0; spins++) {
        if (spins < POOL_SPIN) __builtin_ia32_pause();
        else sched_yield();
        s = atomic_load_explicit(&p->state, memory_order_acquire);
    }
}

int ks_pool_nth(const ks_pool *p) { return p->nth; }

void ks_pool_destroy(ks_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->nth; i++) pthread_join(p->threads[i - 1], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
