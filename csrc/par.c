/* The one instance of par.h's fork-join pool, shared by every kernel of the library, and where
 * its workers may run. */
#define _GNU_SOURCE  /* sched_getcpu, pthread_setaffinity_np */
#include <sched.h>
#include "par.h"

struct npr_par npr_par = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, -1, 0, 0, 0,
                          ATOMIC_FLAG_INIT, 0, 0, 0, 0, {0}};

/* Why: a worker woken from pthread_cond_wait is often queued on the CPU of the thread that woke
 * it (the kernel's wake-affine placement), and that thread is the caller, which goes straight on
 * to run chunks. On a 2-vCPU VM after an idle gap the worker then did not run for 4-10 ms: every
 * job of a model's first milliseconds ran on one thread, and a chunk the worker had claimed
 * waited for the caller's time slice to end (400 us jobs of 8 x 10 us chunks; pinned, 40 us).
 * So before waking them, the workers' affinity becomes the caller's allowed CPUs less the one
 * it runs on, and the kernel wakes them elsewhere. Done only when a worker sleeps and the caller
 * has moved since the last time (two syscalls per worker, then nothing); a caller allowed only
 * one CPU leaves the workers as they are. */
void npr_par_place(void)
{
    int c = sched_getcpu();
    if (c < 0 || c == npr_par.placed_off) return;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0 || !CPU_ISSET(c, &set) || CPU_COUNT(&set) < 2) return;
    CPU_CLR(c, &set);
    for (int i = 0; i < npr_par.nw; i++) pthread_setaffinity_np(npr_par.th[i], sizeof set, &set);
    npr_par.placed_off = c;
}

/* Subnormal float32 values flushed to zero for the length of a run (native.py says why): the
 * caller's MXCSR gets flush-to-zero (bit 15) and denormals-are-zero (bit 6); the previous value is
 * returned for npr_fp_leave to restore. par.h's workers copy the caller's mode with each job. */
unsigned npr_fp_enter(void)
{
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040u);
    return old;
}

void npr_fp_leave(unsigned old) { _mm_setcsr((_mm_getcsr() & 0x3Fu) | (old & ~0x3Fu)); }
