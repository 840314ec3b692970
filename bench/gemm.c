/* gemm - the prefill GEMM alone, one thread, on E2B's matmul shapes (bf16
   weights): GFLOP/s of the packed GEMM (g4__gemm) against the float32 FMA
   peak (build/fmapeak 1).
       gemm [tokens...]      default: 64 512; prints one line per shape
   BF16DOT=1: the bf16 mode's bf16_fast GEMM (VDPBF16PS, avx512_bf16 builds)
   against its own peak, twice the float32 one; BWD=1: the backward's two
   products (g4__gemm_acc)
   Each repetition reads another copy of the weights, 96 MB of copies in all,
   so they come from memory as in a model's prefill, not from the 32 MB L3 a
   single copy would stay in (WARM=1: one copy, the old, optimistic setting). */
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include <time.h>

/* this thread's CPU time: the machine is shared, and time slices lost to
   other processes are not the kernel's */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#ifdef G4__SIMD_NAME
/* BWD=1: the backward's two products of y = x W^T on the same shapes
   (g4__gemm_acc, >>backward's g4__linear_backward): dX += dY W (W bf16,
   k-major) and dW += dY^T X (X float32), each 2 out in n FLOPs, one thread */
static int backward(const int (*shapes)[2], const int *ns, int nn, int reps) {
    int a, b, r, p;
    printf("backward products (g4__gemm_acc), blocks mc %d kc %d nc %d\n", g4__gemm_acc_blocks.mc, g4__gemm_acc_blocks.kc,
           g4__gemm_acc_blocks.nc);
    for (a = 0; a < 4; a++)
        for (b = 0; b < nn; b++) {
            int out = shapes[a][0], in = shapes[a][1], n = ns[b];
            size_t i;
            uint16_t *w = (uint16_t *)malloc(2 * (size_t)out * in);
            float *dy = (float *)malloc(4 * (size_t)n * out), *dyt = (float *)malloc(4 * (size_t)n * out);
            float *xt = (float *)malloc(4 * (size_t)n * in), *dx = (float *)calloc((size_t)n * in, 4);
            float *dw = (float *)calloc((size_t)out * in, 4), *ws = (float *)aligned_alloc(64, 4 * (size_t)(G4__PACK_THREAD + 16));
            double best[2] = {1e30, 1e30}, t;
            for (i = 0; i < (size_t)out * in; i++) w[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 0x700);
            for (i = 0; i < (size_t)n * out; i++) dy[i] = dyt[i] = (float)(i % 11) * 0.01f - 0.05f;
            for (i = 0; i < (size_t)n * in; i++) xt[i] = (float)(i % 13) * 0.01f - 0.06f;
            for (r = 0; r < reps; r++)
                for (p = 0; p < 2; p++) {
                    t = now();
                    if (p == 0) g4__gemm_acc(dx, (size_t)in, dy, (size_t)out, (const unsigned char *)w, G4_BF16, (size_t)in, 1, out, n, 0, in, ws,
                                             &g4__gemm_acc_blocks);
                    else g4__gemm_acc(dw, (size_t)in, dyt, (size_t)n, (const unsigned char *)xt, G4_F32, (size_t)n, 0, n, out, 0, in, ws,
                                      &g4__gemm_acc_blocks);
                    t = now() - t;
                    if (t < best[p]) best[p] = t;
                }
            printf("%5d x %5d, %3d tokens: dX = dY W %6.1f GFLOP/s, dW = dY^T X %6.1f GFLOP/s (CPU time, best of %d)\n", out, in, n,
                   2.0 * out * in * n / best[0] / 1e9, 2.0 * out * in * n / best[1] / 1e9, reps);
            free(w); free(dy); free(dyt); free(xt); free(dx); free(dw); free(ws);
        }
    return 0;
}
#endif

int main(int argc, char **argv) {
    static const int shapes[][2] = {{2048, 1536}, {6144, 1536}, {1536, 6144}, {1536, 12288}}; /* out, in */
    int ns[8] = {64, 512}, nn = 2, a, b, r, c, reps = getenv("REPS") ? atoi(getenv("REPS")) : 5;
    int warm = getenv("WARM") && atoi(getenv("WARM")), dot = getenv("BF16DOT") && atoi(getenv("BF16DOT"));
    if (argc > 1) for (nn = 0; nn < argc - 1 && nn < 8; nn++) ns[nn] = atoi(argv[nn + 1]);
#ifdef G4__SIMD_NAME
    if (getenv("BWD") && atoi(getenv("BWD"))) return backward(shapes, ns, nn, reps);
#endif
    printf("kernels: %s, GEMM micro-kernel %d x %d, blocks mc %d kc %d nc %d\n", g4_simd_name(), G4__TR, G4__TT,
#ifdef G4__SIMD_NAME
           g4__gemm_blocks.mc, g4__gemm_blocks.kc, g4__gemm_blocks.nc
#else
           0, 0, 0
#endif
    );
    for (a = 0; a < 4; a++)
        for (b = 0; b < nn; b++) {
            int out = shapes[a][0], in = shapes[a][1], n = ns[b], rows = out, copies;
            size_t i, wbytes;
            uint16_t *wd;
            float *x = (float *)malloc(4 * (size_t)n * in), *y = (float *)malloc(4 * (size_t)n * out);
            float *ws = (float *)aligned_alloc(64, 4 * (size_t)(G4__PACK_THREAD + 16));
            uint16_t *xb = (uint16_t *)malloc(2 * (size_t)n * in);
            g4_tensor w;
            double best = 1e30, t;
            while ((double)rows * in * n > 1.5e9 && rows > 96) rows /= 2; /* keep a run under a second */
            wbytes = 2 * (size_t)rows * (size_t)in;
            copies = warm ? 1 : (int)(((size_t)96 << 20) / wbytes + 1);
            wd = (uint16_t *)malloc(wbytes * (size_t)copies);
            if (!wd) { fprintf(stderr, "gemm: out of memory\n"); return 1; }
            for (i = 0; i < (size_t)rows * in; i++) wd[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 0x700);
            for (c = 1; c < copies; c++) memcpy((char *)wd + (size_t)c * wbytes, wd, wbytes);
            for (i = 0; i < (size_t)n * in; i++) x[i] = g4__bf16_round((float)(i % 13) * 0.01f - 0.06f);
#if G4__BF16DOT
            g4__to_bf16(xb, x, n, in);
#endif
            memset(&w, 0, sizeof w);
            w.dtype = G4_BF16; w.ndim = 2; w.shape[0] = out; w.shape[1] = in;
            for (r = 0; r < reps; r++) {
                w.data = (char *)wd + (size_t)(r % copies) * wbytes;
                t = now();
#if G4__BF16DOT
                if (dot) g4__matmul_bf16dot(y, x, xb, &w, n, 0, rows, ws, 0);
                else
#endif
                g4__matmul_rows(y, x, &w, n, 0, rows, ws);
                t = now() - t;
                if (t < best) best = t;
            }
            printf("%5d x %5d, %3d tokens: %6.1f GFLOP/s (CPU time, best of %d, %s weights%s)\n", out, in, n, 2.0 * rows * in * n / best / 1e9, reps,
                   warm ? "warm" : "cold", dot ? ", VDPBF16PS" : "");
            free(wd); free(x); free(y); free(ws); free(xb);
        }
    return 0;
}
