/* A tiny fork-join pool for the multi-threaded entry points (conv_gemm.c, winograd.c, smallc.c): persistent workers
 * that spin for SPIN_NS after each job before sleeping on a condition variable, and chunks
 * claimed one at a time from a shared ticket, so a worker the OS does not run (another
 * process, or a peer runtime's spinning threads, on the core) delays only its own chunk.
 *
 * Why not the Program's Python pool: a conv of YOLOv8n takes 0.05-0.6 ms, and a pool thread
 * woken through a futex on a 2-vCPU VM starts late: the two halves of a 0.33 ms conv took
 * 0.25-0.3 ms each (0.17 ms when timed alone), so 2 threads ran no faster than 1. ORT's
 * threads spin between ops the same way. One job at a time: a second caller while one runs
 * (two programs in two threads) runs its chunks inline. */
#ifndef NPR_PAR_H
#define NPR_PAR_H
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define PAR_MAXW 15
#define SPIN_NS 300000L  /* a worker spins this long after its last job (YOLOv8n: ops 10-100 us apart) */

typedef void (*par_fn)(void *ctx, int chunk);

/* ONE pool for the whole library: the state is defined once, in par.c, and every translation
 * unit (conv_gemm.c, winograd.c, smallc.c) runs its jobs on the same workers, so two sets of
 * spinning workers never fight over the cores. The functions below are static per unit but
 * only touch this shared state. */
struct npr_par {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int asleep;            /* workers in pthread_cond_wait (waking them needs npr_par_place) */
    int placed_off;               /* the CPU the workers' affinity leaves out (-1: none) */
    atomic_uint gen;              /* bumped once per job: wakes the workers */
    atomic_ullong ticket;         /* (job's gen << 32) | next chunk to claim */
    atomic_int done;              /* chunks finished in this job */
    atomic_flag busy;
    par_fn fn;
    void *ctx;
    int chunks, nw;
    pthread_t th[PAR_MAXW];
    unsigned csr;                 /* the caller's MXCSR for this job (its rounding and subnormal modes) */
};
extern struct npr_par npr_par;

/* Before waking sleeping workers: keep them off the caller's CPU (par.c says why). */
void npr_par_place(void);

static inline long par_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Claim and run chunks of job `g` until none is left (or the job is no longer g). */
static inline void par_claim(unsigned g)
{
    for (;;) {
        unsigned long long t = atomic_load_explicit(&npr_par.ticket, memory_order_acquire);
        if ((unsigned)(t >> 32) != g || (int)(t & 0xffffffffu) >= npr_par.chunks) return;
        if (!atomic_compare_exchange_weak(&npr_par.ticket, &t, t + 1)) continue;
        /* claimed: job g cannot be replaced before this chunk counts as done */
        npr_par.fn(npr_par.ctx, (int)(t & 0xffffffffu));
        atomic_fetch_add_explicit(&npr_par.done, 1, memory_order_release);
    }
}

static inline void *par_worker(void *arg)
{
    unsigned seen = (unsigned)(uintptr_t)arg;
    for (;;) {
        unsigned g;
        long t0 = par_now();
        for (long spins = 1; (g = atomic_load_explicit(&npr_par.gen, memory_order_acquire)) == seen; spins++) {
            _mm_pause();
            if (spins % 256 == 0 && par_now() - t0 > SPIN_NS) {
                pthread_mutex_lock(&npr_par.mu);
                atomic_fetch_add(&npr_par.asleep, 1);
                while ((g = atomic_load(&npr_par.gen)) == seen) pthread_cond_wait(&npr_par.cv, &npr_par.mu);
                atomic_fetch_sub(&npr_par.asleep, 1);
                pthread_mutex_unlock(&npr_par.mu);
                break;
            }
        }
        seen = g;
        /* a worker computes in the caller's floating-point mode (the cpu backend flushes
         * subnormals to zero during a run, native.py), so a chunk's bits do not depend on
         * which thread ran it; the status flags (bits 0-5) are left as they are */
        unsigned mine = _mm_getcsr();
        if ((mine ^ npr_par.csr) & ~0x3Fu) _mm_setcsr((mine & 0x3Fu) | (npr_par.csr & ~0x3Fu));
        par_claim(g);
    }
    return NULL;
}

/* Where chunk i of `chunks` near-equal parts of [lo, hi) begins (it ends where chunk i + 1
 * begins): how every multi-threaded entry point cuts its rows, channels or panels. */
static inline long par_at(long lo, long hi, int i, int chunks)
{
    return lo + (hi - lo) * i / chunks;
}

/* fn(ctx, c) for every c in [0, chunks), on the caller and up to threads - 1 workers. */
static inline void par_run(par_fn fn, void *ctx, int chunks, int threads)
{
    if (threads > PAR_MAXW + 1) threads = PAR_MAXW + 1;
    if (threads <= 1 || chunks <= 1 || atomic_flag_test_and_set(&npr_par.busy)) {
        for (int c = 0; c < chunks; c++) fn(ctx, c);
        return;
    }
    /* workers are made on first need and live with the process */
    while (npr_par.nw < threads - 1 &&
           pthread_create(&npr_par.th[npr_par.nw], NULL, par_worker, (void *)(uintptr_t)atomic_load(&npr_par.gen)) == 0)
        npr_par.nw++;
    unsigned g = atomic_load(&npr_par.gen) + 1;
    npr_par.fn = fn;
    npr_par.ctx = ctx;
    npr_par.chunks = chunks;
    npr_par.csr = _mm_getcsr();
    atomic_store(&npr_par.done, 0);
    atomic_store_explicit(&npr_par.ticket, (unsigned long long)g << 32, memory_order_release);
    if (atomic_load(&npr_par.asleep)) npr_par_place();
    pthread_mutex_lock(&npr_par.mu);
    atomic_store_explicit(&npr_par.gen, g, memory_order_release);
    pthread_cond_broadcast(&npr_par.cv);
    pthread_mutex_unlock(&npr_par.mu);
    par_claim(g);
    while (atomic_load_explicit(&npr_par.done, memory_order_acquire) < chunks) _mm_pause();
    atomic_flag_clear(&npr_par.busy);
}
#endif
