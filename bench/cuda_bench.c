/* cuda_bench.c - decode and prefill speed of the CUDA path (make bench-cuda;
   not a test). For each mode and context C: fill the session to C positions
   (512-token chunks), time one 512-token prefill chunk at C, then GEN decode
   steps after it. Prints one line per (mode, context):

       cuda_bench DIR [--modes exact,fast,fast-bf16] [--ctx 0,8192,32768] [--gen 32] [--splits N]
                      [--bw GB/s] [--peak TFLOP/s]

   FLOPs of a prefill chunk: 2 per weight per token (lm_head for the last row
   only, as G4_LOGITS_LAST) plus attention's 4 x heads x head_dim per (query,
   key) pair it attends (causal, the window on sliding layers). Bytes of a
   decode step: every weight one token reads (g4b_bytes_per_token: one
   embedding row, top-k experts) plus the K and V rows each layer attends over (float32;
   bf16 in the fast bf16 mode). bench/cuda.sh turns them into fractions of the
   card's measured bandwidth and bf16 tensor peak. */
#define GEMMA4_IMPLEMENTATION
#define GEMMA4_CUDA
#include "../gemma4.h"
#include "../examples/bench_bytes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}


/* keys a query at position p attends in layer l */
static double keys_at(const g4_model *m, int l, double p) {
    double w = (double)m->config.sliding_window;
    return m->plan.layer[l].type == G4_SLIDING && p + 1 > w ? w : p + 1;
}

int main(int argc, char **argv) {
    const char *dir, *modes = "exact,fast,fast-bf16", *ctxs = "0,8192,32768";
    int gen = 32, i, chunk = 512, splits = 0; /* splits: g4_cuda_config.kv_splits (0: sized from the device) */
    double bw = 0, peak = 0; /* the card's measured GB/s and bf16 TFLOP/s (bench/cuda.sh), for the fractions */
    g4_model m;
    g4_cuda_model cm;
    double elems, wbytes, head;
    char err[G4_ERROR_MAX], desc[256];
    const char *mp;
    if (argc < 2) { fprintf(stderr, "usage: cuda_bench DIR [--modes exact,fast,fast-bf16] [--ctx 0,8192] [--gen N] [--splits N]\n"); return 2; }
    dir = argv[1];
    for (i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--modes") == 0) modes = argv[i + 1];
        else if (strcmp(argv[i], "--ctx") == 0) ctxs = argv[i + 1];
        else if (strcmp(argv[i], "--gen") == 0) gen = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--splits") == 0) splits = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--bw") == 0) bw = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--peak") == 0) peak = atof(argv[i + 1]);
        else { fprintf(stderr, "cuda_bench: unknown option %s\n", argv[i]); return 2; }
    }
    if (g4_cuda_device_check(desc, sizeof desc, err) != G4_OK) { printf("no CUDA device: %s\n", err); return 1; }
    if (g4_model_load(&m, dir) != G4_OK) { fprintf(stderr, "%s\n", m.error); return 1; }
    if (g4_cuda_model_upload(&cm, &m) != G4_OK) { fprintf(stderr, "%s\n", cm.error); return 1; }
    wbytes = g4b_bytes_per_token(&m, &elems);
    head = (double)m.w.lm_head.shape[0] * (double)m.w.lm_head.shape[1];
    printf("device: %s; model %s: %d layers, vocab %d, %.2f GB of weights (%.2f GB read per token)\n", desc, dir,
           m.config.num_hidden_layers, m.config.vocab_size, (double)cm.weight_bytes / 1e9, wbytes / 1e9);
    for (mp = modes; *mp;) {
        char mode[32];
        size_t ml = strcspn(mp, ",");
        const char *cp;
        snprintf(mode, sizeof mode, "%.*s", (int)ml, mp);
        mp += ml + (mp[ml] == ',');
        for (cp = ctxs; *cp;) {
            int ctx = atoi(cp), p, l, ok = 1;
            size_t cl = strcspn(cp, ",");
            g4_session_config sc = g4_session_config_init();
            g4_cuda_session s;
            g4_cuda_config cc;
            size_t db, hb;
            void *darena = NULL, *harena = NULL;
            int32_t *ids;
            float *logits = (float *)malloc(sizeof(float) * (size_t)m.config.vocab_size);
            double t0, t_fill = 0, t_pre, t_dec, pre_flops = 0, dec_bytes = 0, kvb;
            cp += cl + (cp[cl] == ',');
            sc.max_context = ctx + chunk + gen + 1;
            sc.max_chunk = chunk;
            memset(&cc, 0, sizeof cc);
            cc.fast = strncmp(mode, "fast", 4) == 0;
            cc.kv_splits = splits;
            sc.bf16 = strstr(mode, "bf16") != NULL;
            kvb = cc.fast && sc.bf16 ? 2 : 4;
            ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)sc.max_context);
            for (p = 0; p < sc.max_context; p++) ids[p] = (int32_t)(((int64_t)p * 7919 + 13) % m.config.vocab_size);
            ids[0] = 2;
            if (g4_cuda_session_size(&cm, &sc, &cc, &db, &hb) != G4_OK || g4_cuda_malloc(&darena, db, err) != G4_OK ||
                !(harena = malloc(hb)) || g4_cuda_session_init(&s, &cm, &sc, &cc, darena, db, harena, hb) != G4_OK) {
                printf("%-10s ctx %6d: no session (%s%s)\n", mode, ctx, cm.error, err);
                ok = 0;
            }
            /* warm-up (module load, first-touch), then start over */
            if (ok && (g4_cuda_forward(&s, ids, chunk, logits, G4_LOGITS_LAST) != G4_OK || g4_cuda_session_reset(&s) != G4_OK)) ok = 0;
            t0 = now_s();
            for (p = 0; ok && p < ctx; p += chunk) {
                int n = ctx - p < chunk ? ctx - p : chunk;
                if (g4_cuda_forward(&s, ids + p, n, logits, G4_LOGITS_LAST) != G4_OK) ok = 0;
            }
            t_fill = now_s() - t0;
            t0 = now_s();
            if (ok && g4_cuda_forward(&s, ids + ctx, chunk, logits, G4_LOGITS_LAST) != G4_OK) ok = 0;
            t_pre = now_s() - t0;
            t0 = now_s();
            for (p = 0; ok && p < gen; p++) {
                int32_t next = g4_argmax(logits, m.config.vocab_size);
                if (g4_cuda_forward(&s, &next, 1, logits, G4_LOGITS_LAST) != G4_OK) ok = 0;
            }
            t_dec = now_s() - t0;
            if (!ok) printf("%-10s ctx %6d: failed: %s\n", mode, ctx, s.error);
            else {
                pre_flops = 2.0 * ((elems - head) * chunk + head);
                for (l = 0; l < m.config.num_hidden_layers; l++) {
                    const g4_layer_plan *lp = &m.plan.layer[l];
                    double nh = (double)m.config.num_attention_heads, d = (double)lp->head_dim, kv = 0;
                    for (p = 0; p < chunk; p++) pre_flops += 4.0 * nh * d * keys_at(&m, l, (double)(ctx + p));
                    for (p = 0; p < gen; p++) kv += keys_at(&m, l, (double)(ctx + chunk + p));
                    dec_bytes += kv * 2.0 * (double)lp->kv_heads * d * kvb;
                }
                dec_bytes = dec_bytes / gen + wbytes;
                printf("%-10s ctx %6d: prefill %8.1f tok/s %7.2f TFLOP/s", mode, ctx, chunk / t_pre, pre_flops / t_pre / 1e12);
                if (peak > 0) printf(" (%4.1f%% of bf16 peak)", 100.0 * pre_flops / t_pre / 1e12 / peak);
                printf(" | decode %7.1f tok/s %7.1f GB/s", gen / t_dec, dec_bytes * gen / t_dec / 1e9);
                if (bw > 0) printf(" (%4.1f%% of bandwidth)", 100.0 * dec_bytes * gen / t_dec / 1e9 / bw);
                printf(" | 512 tokens in %.3f s, filling %d in %.1f s, %d steps of %.3f GB\n", t_pre, ctx, t_fill, gen,
                       dec_bytes / 1e9);
            }
            fflush(stdout);
            g4_cuda_free(darena);
            free(harena);
            free(ids);
            free(logits);
        }
    }
    g4_cuda_model_free(&cm);
    g4_model_free(&m);
    return 0;
}
