/* How this machine runs a fixed amount of arithmetic right after an idle gap, on 1 thread and
 * on csrc/par.h's pool at 2 threads (docs/cpu.md, "2 threads after an idle gap"): no npurun,
 * no Python, no ONNX Runtime, only the pool every multi-threaded kernel uses.
 *
 *     gcc -O2 -mavx2 -Icsrc bench/idle_pool.c -o /tmp/idle_pool -lpthread
 *     /tmp/idle_pool 4000000 4 100000     # work units, chunks, idle microseconds before each run
 *     /tmp/idle_pool 4000000 4 0          # the same back to back ("hot")
 *
 * Prints each run's time (1 and 2 threads alternating, two warm-up rounds dropped) and the
 * medians. Measures, never asserts. */
#include "par.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct npr_par npr_par = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};
static volatile float sink;
static long work_per_chunk;

static void chunk(void *ctx, int c)
{
    (void)ctx;
    float a = 1.0f + (float)c, b = 0.999f;
    for (long i = 0; i < work_per_chunk; i++) a = a * b + 0.0001f;  /* a dependent chain: pure latency */
    sink = a;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s WORK CHUNKS IDLE_US\n", argv[0]);
        return 2;
    }
    long total = atol(argv[1]), idle_us = atol(argv[3]);
    int chunks = atoi(argv[2]);
    if (total <= 0 || chunks <= 0 || idle_us < 0) {
        fprintf(stderr, "WORK and CHUNKS must be positive, IDLE_US >= 0\n");
        return 2;
    }
    work_per_chunk = total / chunks;
    enum { ROUNDS = 14, WARM = 2 };
    double ms[2][ROUNDS - WARM];
    for (int r = 0; r < ROUNDS; r++)
        for (int th = 1; th <= 2; th++) {
            usleep((useconds_t)idle_us);
            long t0 = par_now();
            par_run(chunk, NULL, chunks, th);
            double t = (par_now() - t0) / 1e6;
            if (r >= WARM) ms[th - 1][r - WARM] = t;
        }
    for (int th = 0; th < 2; th++) {
        printf("%d thread%s:", th + 1, th ? "s" : " ");
        for (int r = 0; r < ROUNDS - WARM; r++) printf(" %.2f", ms[th][r]);
        qsort(ms[th], ROUNDS - WARM, sizeof(double), cmp);
        printf("  ms; median %.2f\n", ms[th][(ROUNDS - WARM) / 2]);
    }
    return 0;
}
