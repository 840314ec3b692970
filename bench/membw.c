/* membw - the machine's memory read bandwidth, the ceiling for decode:
   every thread sums its part of a buffer much larger than the caches, as one
   sequential stream or as two (its two halves side by side, as gemma4.h's
   decode kernel reads); the best of both patterns is reported.
       membw [threads] [MiB]          prints "read: <x> GB/s" */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { const float *p; size_t n; int streams; double sum; } part;

static void *reader(void *arg) {
    part *pt = (part *)arg;
    float acc[16] = {0}, acc2[16] = {0};
    size_t i, h = pt->n / 2 / 16 * 16;
    int k;
    if (pt->streams == 2) {
        const float *q = pt->p + h;
        for (i = 0; i + 16 <= h; i += 16)
            for (k = 0; k < 16; k++) { acc[k] += pt->p[i + k]; acc2[k] += q[i + k]; }
    } else
        for (i = 0; i + 16 <= pt->n; i += 16)
            for (k = 0; k < 16; k++) acc[k] += pt->p[i + k];
    for (k = 0; k < 16; k++) pt->sum += acc[k] + acc2[k];
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN), t, rep;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 2048, n = mib * 1024 * 1024 / sizeof(float);
    float *buf = (float *)malloc(n * sizeof(float));
    pthread_t th[256];
    part pt[256];
    double best = 0, sink = 0;
    if (!buf || threads < 1 || threads > 256) return 1;
    memset(buf, 1, n * sizeof(float)); /* touch every page */
    for (rep = 0; rep < 10; rep++) { /* 5 of each pattern, interleaved */
        double t0 = now(), dt;
        for (t = 0; t < threads; t++) {
            pt[t].p = buf + n / threads * t;
            pt[t].n = n / threads;
            pt[t].streams = 1 + rep % 2;
            pt[t].sum = 0;
            pthread_create(&th[t], NULL, reader, &pt[t]);
        }
        for (t = 0; t < threads; t++) { pthread_join(th[t], NULL); sink += pt[t].sum; }
        dt = now() - t0;
        if (n * sizeof(float) / dt / 1e9 > best) best = n * sizeof(float) / dt / 1e9;
    }
    printf("read: %.2f GB/s (%d threads, %zu MiB, best of 10)%s\n", best, threads, mib, sink == 12345 ? " " : "");
    free(buf);
    return 0;
}
