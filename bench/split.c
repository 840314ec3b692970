/* split - where a prefill's time goes: the matmuls (the packed GEMM, with the
   threads' fork and join) against everything else (attention, norms, RoPE,
   GELU, the per-layer inputs, the other threaded jobs' joins), on a
   checkpoint, per run, in wall-clock time (read it on a quiet machine, with
   the load average). The prefill's GFLOP/s counts the matmuls' FLOPs, as
   gemma4 bench does. Built by bench/split.sh against a copy of gemma4.h with
   timers (bench/split.py); not a test.
       split MODEL_DIR THREADS TOKENS [RUNS]   one line per run */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "gemma4_split.h"
#include <stdio.h>

static double cpu_all(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    g4_model m;
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    g4_pool *pool = NULL;
    int threads, n, runs, i, r;
    float *logits;
    int32_t *ids;
    if (argc < 4) { fprintf(stderr, "usage: split MODEL_DIR THREADS TOKENS [RUNS]\n"); return 1; }
    threads = atoi(argv[2]); n = atoi(argv[3]); runs = argc > 4 ? atoi(argv[4]) : 5;
    if (threads < 1 || threads > 64 || n < 2 || runs < 1) { fprintf(stderr, "split: bad arguments\n"); return 1; }
    if (g4_model_load(&m, argv[1]) != G4_OK) { fprintf(stderr, "split: %s\n", m.error); return 1; }
    memset(&s, 0, sizeof s);
    if (g4_pool_create(&pool, threads) != G4_OK) return 1;
    sc.max_context = n + 4; sc.max_chunk = n; sc.pool = pool;
    logits = (float *)malloc(sizeof(float) * (size_t)m.config.vocab_size);
    ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    if (!logits || !ids || g4_session_create(&s, &m, &sc) != G4_OK) { fprintf(stderr, "split: %s\n", s.error); return 1; }
    for (i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919 + 13) % m.config.vocab_size); /* as gemma4 bench */
    ids[0] = 2 % m.config.vocab_size;
    g4_forward(&s, ids, 4, logits, G4_LOGITS_LAST); /* fault the mapped weights in */
    for (r = 0; r < runs; r++) {
        double t0, c0, wall, cpu;
        g4_session_reset(&s);
        g4s_mm_wall = g4s_mm_flop = 0;
        for (i = 0; i < 64; i++) g4s_part_wall[i] = g4s_part_cpu[i] = 0;
        t0 = g4s_now(); c0 = cpu_all();
        if (g4_forward(&s, ids, n, logits, G4_LOGITS_LAST) != G4_OK) { fprintf(stderr, "split: %s\n", s.error); return 1; }
        wall = g4s_now() - t0; cpu = cpu_all() - c0;
        printf("%d tokens, %d threads: prefill %.3f s (%.3f CPU-s), %.1f GFLOP/s; matmuls %.3f s = %.1f%%, %.1f GFLOP at %.1f GFLOP/s; the rest %.3f s",
               n, threads, wall, cpu, g4s_mm_flop / wall / 1e9, g4s_mm_wall, 100 * g4s_mm_wall / wall, g4s_mm_flop / 1e9,
               g4s_mm_flop / g4s_mm_wall / 1e9, wall - g4s_mm_wall);
        for (i = 0; i < threads; i++) printf("; thread %d in its matmul parts %.3f s (%.3f CPU-s)", i, g4s_part_wall[i], g4s_part_cpu[i]);
        printf("\n");
    }
    g4_session_destroy(&s);
    g4_model_free(&m);
    g4_pool_free(pool);
    free(logits); free(ids);
    return 0;
}
