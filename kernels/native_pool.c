/* Worker threads for the native CPU ops: pool_run(fn, ctx, n, chunk) runs fn over [0, n) in chunks on the
   calling thread and beside it.

   Where torch runs on libgomp (its x86 Linux wheels do), the loader hands over libgomp's GOMP_parallel and
   the items run on torch's own OpenMP team: one set of worker threads in the process. A second pool would
   fight torch's workers, which spin on their cores for a while after every parallel torch op (measured: the
   helper below then took 99% of the items and the caller spent its share waking it, one core in effect).

   Elsewhere, one helper thread of our own:

   The caller never waits for the helper to start (it takes every chunk the helper has not), so a helper
   without a free core costs only its wake-up; a job is posted only to an idle helper. The helper spins
   briefly after a job, then sleeps on a futex (no core held while idle). One job at a time: a call from
   a second thread while one runs computes its items alone. */

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "native_math.h"

#define HELPER_SPINS 4000 /* pause loops (~50 us) before the idle helper sleeps */

typedef struct {
    pool_fn fn;
    void *ctx;
    int64_t n, chunk;
    _Atomic int64_t next, done; /* items handed out / finished */
} pool_job;

static pool_job job;
static _Atomic uint32_t posted, idle_seq, sleeping;
static _Atomic int helper_state; /* 0 not started, 1 running, -1 could not start */

static inline void relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

static void work(pool_job *j) {
    for (;;) {
        const int64_t i0 = atomic_fetch_add(&j->next, j->chunk);
        if (i0 >= j->n) return;
        const int64_t i1 = i0 + j->chunk < j->n ? i0 + j->chunk : j->n;
        j->fn(j->ctx, i0, i1);
        atomic_fetch_add(&j->done, i1 - i0);
    }
}

static void *helper(void *arg) {
    (void)arg;
    uint32_t seen = 0;
    for (;;) {
        for (int spins = 0; atomic_load(&posted) == seen;) {
            if (++spins < HELPER_SPINS) {
                relax();
                continue;
            }
            atomic_store(&sleeping, 1);
            if (atomic_load(&posted) == seen) syscall(SYS_futex, &posted, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            atomic_store(&sleeping, 0);
            spins = 0;
        }
        seen = atomic_load(&posted);
        work(&job);
        atomic_store(&idle_seq, seen);
    }
    return NULL;
}

static int helper_ready(void) {
    int state = atomic_load(&helper_state);
    if (state == 0) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        state = pthread_create(&thread, &attr, helper, NULL) == 0 ? 1 : -1;
        pthread_attr_destroy(&attr);
        atomic_store(&helper_state, state);
    }
    return state == 1 && atomic_load(&idle_seq) == atomic_load(&posted);
}

static _Atomic int in_use; /* a second engine thread calling at the same time runs its job alone */

/* libgomp's entry point for `#pragma omp parallel` (fn runs once on each thread of the team) */
typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
static gomp_parallel_fn gomp_parallel;
static unsigned gomp_threads;

/* Called once by the loader: run jobs on the OpenMP team of `threads` threads (NULL: the helper thread). */
int ninfer_pool_use_openmp(void *parallel, int64_t threads) {
    if (parallel != NULL && threads < 2) return -2;
    gomp_parallel = (gomp_parallel_fn)parallel;
    gomp_threads = (unsigned)threads;
    return 0;
}

static void work_on_team(void *j) { work((pool_job *)j); }

void pool_run(pool_fn fn, void *ctx, int64_t n, int64_t chunk) {
    if (n < 2 * chunk || atomic_exchange(&in_use, 1)) {
        fn(ctx, 0, n);
        return;
    }
    if (gomp_parallel != NULL) {
        pool_job team_job = {.fn = fn, .ctx = ctx, .n = n, .chunk = chunk};
        const int64_t most = (n + chunk - 1) / chunk;
        gomp_parallel(work_on_team, &team_job, most < gomp_threads ? (unsigned)most : gomp_threads, 0);
        atomic_store(&in_use, 0);
        return;
    }
    if (!helper_ready()) {
        atomic_store(&in_use, 0);
        fn(ctx, 0, n);
        return;
    }
    job.fn = fn, job.ctx = ctx, job.n = n, job.chunk = chunk;
    atomic_store(&job.next, 0);
    atomic_store(&job.done, 0);
    atomic_fetch_add(&posted, 1);
    if (atomic_load(&sleeping)) syscall(SYS_futex, &posted, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    work(&job);
    while (atomic_load(&job.done) < n) relax(); /* the helper's last chunk */
    atomic_store(&in_use, 0);
}
