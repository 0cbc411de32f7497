/* A tiny fork-join pool for conv_gemm.c's multi-threaded entry points: persistent workers
 * that spin for SPIN_NS after each job before sleeping on a condition variable, and chunks
 * claimed one at a time from a shared ticket, so a worker the OS does not run (another
 * process, or a peer runtime's spinning threads, on the core) delays only its own chunk.
 *
 * Why not the Program's Python pool: a conv of YOLOv8n takes 0.05-0.6 ms, and a pool thread
 * woken through a futex on a 2-vCPU VM starts late: the two halves of a 0.33 ms conv took
 * 0.25-0.3 ms each (0.17 ms when timed alone), so 2 threads ran no faster than 1. ORT's
 * threads spin between ops the same way. One job at a time: a second caller while one runs
 * (two programs in two threads) runs its chunks inline. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define PAR_MAXW 15
#define SPIN_NS 300000L  /* a worker spins this long after its last job (YOLOv8n: ops 10-100 us apart) */

typedef void (*par_fn)(void *ctx, int chunk);

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;              /* bumped once per job: wakes the workers */
    atomic_ullong ticket;         /* (job's gen << 32) | next chunk to claim */
    atomic_int done;              /* chunks finished in this job */
    atomic_flag busy;
    par_fn fn;
    void *ctx;
    int chunks, nw;
    pthread_t th[PAR_MAXW];
} par = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, ATOMIC_FLAG_INIT, 0, 0, 0, 0, {0}};

static long par_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Claim and run chunks of job `g` until none is left (or the job is no longer g). */
static void par_claim(unsigned g)
{
    for (;;) {
        unsigned long long t = atomic_load_explicit(&par.ticket, memory_order_acquire);
        if ((unsigned)(t >> 32) != g || (int)(t & 0xffffffffu) >= par.chunks) return;
        if (!atomic_compare_exchange_weak(&par.ticket, &t, t + 1)) continue;
        /* claimed: job g cannot be replaced before this chunk counts as done */
        par.fn(par.ctx, (int)(t & 0xffffffffu));
        atomic_fetch_add_explicit(&par.done, 1, memory_order_release);
    }
}

static void *par_worker(void *arg)
{
    unsigned seen = (unsigned)(uintptr_t)arg;
    for (;;) {
        unsigned g;
        long t0 = par_now();
        for (long spins = 1; (g = atomic_load_explicit(&par.gen, memory_order_acquire)) == seen; spins++) {
            _mm_pause();
            if (spins % 256 == 0 && par_now() - t0 > SPIN_NS) {
                pthread_mutex_lock(&par.mu);
                while ((g = atomic_load(&par.gen)) == seen) pthread_cond_wait(&par.cv, &par.mu);
                pthread_mutex_unlock(&par.mu);
                break;
            }
        }
        seen = g;
        par_claim(g);
    }
    return NULL;
}

/* fn(ctx, c) for every c in [0, chunks), on the caller and up to threads - 1 workers. */
static void par_run(par_fn fn, void *ctx, int chunks, int threads)
{
    if (threads > PAR_MAXW + 1) threads = PAR_MAXW + 1;
    if (threads <= 1 || chunks <= 1 || atomic_flag_test_and_set(&par.busy)) {
        for (int c = 0; c < chunks; c++) fn(ctx, c);
        return;
    }
    /* workers are made on first need and live with the process */
    while (par.nw < threads - 1 &&
           pthread_create(&par.th[par.nw], NULL, par_worker, (void *)(uintptr_t)atomic_load(&par.gen)) == 0)
        par.nw++;
    unsigned g = atomic_load(&par.gen) + 1;
    par.fn = fn;
    par.ctx = ctx;
    par.chunks = chunks;
    atomic_store(&par.done, 0);
    atomic_store_explicit(&par.ticket, (unsigned long long)g << 32, memory_order_release);
    pthread_mutex_lock(&par.mu);
    atomic_store_explicit(&par.gen, g, memory_order_release);
    pthread_cond_broadcast(&par.cv);
    pthread_mutex_unlock(&par.mu);
    par_claim(g);
    while (atomic_load_explicit(&par.done, memory_order_acquire) < chunks) _mm_pause();
    atomic_flag_clear(&par.busy);
}
