/* fmapeak - float32 FMA peak of this machine with the widest vectors the
   compiler targets (-march=native), all threads: the ceiling for prefill.
       fmapeak [threads]              prints "fma: <x> GFLOP/s" and the same per CPU-second */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define VL 16
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define SET(x) _mm512_set1_ps(x)
#define SUM(v) _mm512_reduce_add_ps(v)
#else
typedef __m256 vec;
#define VL 8
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define SET(x) _mm256_set1_ps(x)
static float SUM(__m256 v) { float f[8]; int i; float s = 0; _mm256_storeu_ps(f, v); for (i = 0; i < 8; i++) s += f[i]; return s; }
#endif
#define ITERS 50000000L

static float out[256];
static double cpu[256]; /* each thread's CPU time in run(): the peak per CPU-second, which
                           time slices taken by other processes do not lower */

static void *run(void *arg) {
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    vec a0 = SET(1.0f), a1 = SET(1.1f), a2 = SET(1.2f), a3 = SET(1.3f), a4 = SET(1.4f), a5 = SET(1.5f);
    vec a6 = SET(1.6f), a7 = SET(1.7f), a8 = SET(1.8f), a9 = SET(1.9f), b = SET(0.999999f), c = SET(1e-7f);
    long i;
    for (i = 0; i < ITERS; i++) {
        a0 = FMA(a0, b, c); a1 = FMA(a1, b, c); a2 = FMA(a2, b, c); a3 = FMA(a3, b, c); a4 = FMA(a4, b, c);
        a5 = FMA(a5, b, c); a6 = FMA(a6, b, c); a7 = FMA(a7, b, c); a8 = FMA(a8, b, c); a9 = FMA(a9, b, c);
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    cpu[(float *)arg - out] = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
    *(float *)arg = SUM(a0) + SUM(a1) + SUM(a2) + SUM(a3) + SUM(a4) + SUM(a5) + SUM(a6) + SUM(a7) + SUM(a8) + SUM(a9);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN), t, rep;
    pthread_t th[256];
    struct timespec t0, t1;
    double dt, best = 0.0, best_cpu = 0.0;
    if (threads < 1 || threads > 256) return 1;
    for (rep = 0; rep < 5; rep++) { /* best of 5: the machines are shared */
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (t = 0; t < threads; t++) pthread_create(&th[t], NULL, run, &out[t]);
        for (t = 0; t < threads; t++) pthread_join(th[t], NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        dt = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
        if (2.0 * VL * 10 * ITERS * threads / dt / 1e9 > best) best = 2.0 * VL * 10 * ITERS * threads / dt / 1e9;
        for (t = 0, dt = 0; t < threads; t++) dt += cpu[t];
        if (2.0 * VL * 10 * ITERS * threads / dt / 1e9 > best_cpu) best_cpu = 2.0 * VL * 10 * ITERS * threads / dt / 1e9;
    }
    printf("fma: %.1f GFLOP/s (%d threads, %d-lane vectors, best of 5)%s\n", best, threads, VL, out[0] == 12345 ? " " : "");
    printf("fma per CPU-second: %.1f GFLOP (one thread's CPU time, best of 5)\n", best_cpu);
    return 0;
}
