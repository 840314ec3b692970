/* The training reference's tests: the backward ops against finite
   differences in double, then g4_loss_and_grad against torch autograd on
   transformers (data/tiny/<model>/grad_golden.safetensors, written by
   tools/make_grad_goldens.py) and against float64 finite differences of
   transformers' loss, recompute = no recompute and 1 thread = 2 threads bit for
   bit, the shared-KV gradient slots (a planted reader-drop bug is caught at
   the owner's k_proj), and the input errors.

   Tolerances (float32 gemma4.h vs float32 torch autograd, same weights):
     loss:      |ours - ref| <= 1e-5 * |ref|
     gradients: max |ours - ref| <= GTOL * max |ref| per tensor (full tensors);
                sum of squares within 2 * GTOL relative, max |g| within GTOL
                relative, each of the 8 sign projections within GTOL * ||ref||_2
                * sqrt(8) (a projection sums n terms: its float32 noise grows
                like sqrt(n) * the per-element error);
     finite differences (float64 transformers, h = 1e-5): |ours - fd| <=
                GTOL * max |ref| of the tensor.
   e2b_like's larger gradients are stored as int16 against their own max m
   (gradq.*, tools/make_grad_goldens.py): within m / 65534 of the float32
   gradient, so that bound (GQ_ERR) is added to the measured error: a pass
   still means max |ours - ref| <= GTOL * m.
   GTOL = 1e-4: torch's own eager and sdpa paths differ by up to 3.6e-5, and
   its float32 and float64 autograd by up to 4.3e-5, on these models
   (data/tiny/GRAD_VERSIONS.txt). A wrong term (a dropped path, a missing
   transpose, the pad row) shows as 1e-2 or more. */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#define G4_TESTING /* g4_train_config.debug_drop_reader_kv_grads: the planted shared-KV bug */
#define G4_PARALLEL_MIN 1 /* split every job, however small, when a pool is set */
#include "../gemma4.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"
#include "fixtures.h"

#define GTOL 1e-4
#define GQ_MAX 32767.0        /* gradq: int16 steps per max |g| */
#define GQ_ERR (0.5 / GQ_MAX) /* their rounding, relative to max |g| */

static const char *g_cli; /* build/gemma4, from the command line (argv[2]) */

/* ----------------------------------------------- ops vs finite differences */

static uint64_t g_rng = 88172645463325252ULL;
static double urand(void) { /* [-1, 1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 4503599627370496.0 - 1.0;
}

static g4_tensor f32_tensor(const float *data, int rows, int cols) {
    g4_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data; t.dtype = G4_F32; t.ndim = cols ? 2 : 1;
    t.shape[0] = rows; t.shape[1] = cols;
    return t;
}

/* double-precision forwards of the ops, for the finite differences */
static void rms_d(double *y, const double *x, const double *w, int n, double eps) {
    double ss = 0;
    int i;
    for (i = 0; i < n; i++) ss += x[i] * x[i];
    for (i = 0; i < n; i++) y[i] = x[i] / sqrt(ss / n + eps) * (w ? w[i] : 1.0);
}

static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x))); }

#define FD_H 1e-6
#define OPS_TOL 2e-5 /* relative to the largest gradient: float32 backward vs double differences */

static void test_rmsnorm_backward(void) {
    enum { N = 24 };
    int pass, i, j;
    for (pass = 0; pass < 2; pass++) {
        float x[N], w[N], dy[N], dx[N], dw[N];
        double xd[N], wd[N], c[N], y[N], ref_dx[N], ref_dw[N], big = 0, err = 0;
        g4_tensor wt = f32_tensor(w, N, 0);
        for (i = 0; i < N; i++) {
            x[i] = (float)(2 * urand()); w[i] = (float)(1 + 0.5 * urand()); dy[i] = (float)urand();
            xd[i] = x[i]; wd[i] = w[i]; c[i] = dy[i]; dw[i] = 0;
        }
        for (j = 0; j < N; j++) { /* d/dx_j and d/dw_j of sum(c * y) */
            double s[2];
            int k;
            for (k = 0; k < 2; k++) {
                double h = k ? -FD_H : FD_H, acc = 0;
                xd[j] += h;
                rms_d(y, xd, pass ? wd : NULL, N, 1e-6);
                for (i = 0; i < N; i++) acc += c[i] * y[i];
                xd[j] -= h;
                s[k] = acc;
            }
            ref_dx[j] = (s[0] - s[1]) / (2 * FD_H);
            for (k = 0; k < 2; k++) {
                double h = k ? -FD_H : FD_H, acc = 0;
                wd[j] += h;
                rms_d(y, xd, wd, N, 1e-6);
                for (i = 0; i < N; i++) acc += c[i] * y[i];
                wd[j] -= h;
                s[k] = acc;
            }
            ref_dw[j] = (s[0] - s[1]) / (2 * FD_H);
        }
        g4__rmsnorm_backward(dx, pass ? dw : NULL, dy, x, pass ? &wt : NULL, N, 1e-6f);
        for (i = 0; i < N; i++) {
            big = fmax(big, fabs(ref_dx[i]));
            err = fmax(err, fabs(dx[i] - ref_dx[i]));
            if (pass) err = fmax(err, fabs(dw[i] - ref_dw[i]));
        }
        CHECK(err <= OPS_TOL * big, "%s: max error %.3g vs max |dx| %.3g", pass ? "weighted" : "weightless", err, big);
        /* in place (dx == dy) gives the same bits */
        {
            float in[N];
            memcpy(in, dy, sizeof in);
            g4__rmsnorm_backward(in, NULL, in, x, pass ? &wt : NULL, N, 1e-6f);
            if (!pass) CHECK(!memcmp(in, dx, sizeof in), "in place differs");
        }
    }
}

static void test_rope_backward(void) {
    enum { D = 16 };
    float inv[D / 2], g[D], ref[D];
    double big = 0, err = 0;
    int j, i;
    g4_rope_config rc;
    memset(&rc, 0, sizeof rc);
    rc.proportional = 1; rc.theta = 10000.0f; rc.partial_rotary_factor = 0.5f; rc.factor = 1.0f;
    g4__rope_init(inv, &rc, D); /* half the pairs rotate, half do not */
    for (i = 0; i < D; i++) g[i] = (float)urand();
    /* RoPE is linear: the backward is the transpose of the forward's matrix */
    for (j = 0; j < D; j++) {
        float e[D];
        double acc = 0;
        for (i = 0; i < D; i++) e[i] = i == j ? 1.0f : 0.0f;
        g4__rope(e, 1, inv, D, 7, 0);             /* column j of the forward's matrix */
        for (i = 0; i < D; i++) acc += (double)e[i] * g[i];
        ref[j] = (float)acc;
    }
    g4__rope_backward(g, inv, D, 7);
    for (i = 0; i < D; i++) { big = fmax(big, fabs(ref[i])); err = fmax(err, fabs(g[i] - ref[i])); }
    CHECK(err <= 1e-6 * big, "max error %.3g", err);
}

static void test_softmax_gelu_backward(void) {
    enum { N = 12 };
    float x[N], p[N], dp[N];
    double xd[N], ref[N], big = 0, err = 0;
    int i, j;
    for (i = 0; i < N; i++) { x[i] = (float)(3 * urand()); dp[i] = (float)urand(); xd[i] = x[i]; }
    memcpy(p, x, sizeof p);
    g4__softmax(p, N);
    for (j = 0; j < N; j++) {
        double s[2];
        int k;
        for (k = 0; k < 2; k++) {
            double h = k ? -FD_H : FD_H, mx = -1e300, z = 0, acc = 0;
            xd[j] += h;
            for (i = 0; i < N; i++) mx = fmax(mx, xd[i]);
            for (i = 0; i < N; i++) z += exp(xd[i] - mx);
            for (i = 0; i < N; i++) acc += dp[i] * exp(xd[i] - mx) / z;
            xd[j] -= h;
            s[k] = acc;
        }
        ref[j] = (s[0] - s[1]) / (2 * FD_H);
    }
    g4__softmax_backward(dp, p, N);
    for (i = 0; i < N; i++) { big = fmax(big, fabs(ref[i])); err = fmax(err, fabs(dp[i] - ref[i])); }
    CHECK(err <= OPS_TOL * big, "softmax: max error %.3g vs %.3g", err, big);
    for (i = -60; i <= 60; i++) {
        double v = i / 10.0, ref = (gelu_d(v + FD_H) - gelu_d(v - FD_H)) / (2 * FD_H);
        CHECK(fabs(g4__gelu_grad((float)v) - ref) <= 1e-6 + 1e-6 * fabs(ref), "gelu'(%g) = %.9g, fd %.9g", v,
              g4__gelu_grad((float)v), ref);
    }
}

/* two threads' GEMM packing buffers, for the sessions made by hand below */
static float g_pack[2 * G4__PACK_THREAD + 1];

/* g4__gemm_acc (the packed GEMM's accumulating product, >>gemm) against its
   scalar reference g4__gemm_acc_ref: both orders of B (k-major, as dX = dY W
   reads W, and rows along k), the three dtypes, sizes past one block in every
   direction (k > kc: several blocks' sums; columns > mc; rows > nc) with edges
   that are not multiples of the tile (G4__TR, G4__TT) or of VL (the k tail).
   The two sum in different orders (lanes vs one chain): within float32
   rounding of the sum of |terms|. And y is added to, not overwritten. */
static void test_gemm_acc(void) {
#if G4__HAVE_GEMM
    static const int shapes[][3] = {{7, 150, 13}, {70, 53, 1100}, {5, 3, 4}, {131, 100, 37}, {130, 61, 600}, /* n, N, K */
                                    {1013, 13, 21}}; /* (rows past AVX-512's 504) */
    int si, kmajor, dt;
    for (si = 0; si < 6; si++)
        for (kmajor = 0; kmajor < 2; kmajor++)
            for (dt = 0; dt < 3; dt++) {
                int n = shapes[si][0], N = shapes[si][1], K = shapes[si][2], i, t, c, k;
                size_t esz = dt == 0 ? 4 : 2, ldb = kmajor ? (size_t)N + 3 : (size_t)K + 5; /* rows ldb apart */
                size_t nb = kmajor ? (size_t)K * ldb : (size_t)N * ldb;
                unsigned char *B = (unsigned char *)malloc(nb * esz);
                float *x = (float *)malloc(sizeof(float) * (size_t)n * K), *y = (float *)malloc(sizeof(float) * (size_t)n * N);
                float *yr = (float *)malloc(sizeof(float) * (size_t)n * N);
                double worst = 0;
                g4_dtype bdt = dt == 0 ? G4_F32 : dt == 1 ? G4_BF16 : G4_F16;
                g4_tensor e;
                if (!B || !x || !y || !yr) { CHECK(0, "out of memory"); free(B); free(x); free(y); free(yr); return; }
                for (i = 0; i < (int)nb; i++) {
                    float f = (float)urand();
                    if (dt == 0) memcpy(B + 4 * (size_t)i, &f, 4);
                    else {
                        uint32_t u;
                        uint16_t h;
                        int ex;
                        memcpy(&u, &f, 4);
                        ex = (int)((u >> 23) & 0xff) - 127 + 15; /* f16: truncated, tiny values flushed to 0 */
                        h = dt == 1 ? (uint16_t)(u >> 16)
                                    : ex <= 0 ? 0 : (uint16_t)(((u >> 31) << 15) | ((uint32_t)ex << 10) | ((u >> 13) & 0x3ff));
                        memcpy(B + 2 * (size_t)i, &h, 2);
                    }
                }
                for (i = 0; i < n * K; i++) x[i] = (float)urand();
                for (i = 0; i < n * N; i++) y[i] = yr[i] = (float)urand();
                c = N / 2 / G4__TR * G4__TR; /* in two column parts, as two threads split them */
                g4__gemm_acc(y, (size_t)N, x, (size_t)K, B, bdt, ldb, kmajor, K, n, 0, c, g_pack, &g4__gemm_acc_blocks);
                g4__gemm_acc(y, (size_t)N, x, (size_t)K, B, bdt, ldb, kmajor, K, n, c, N, g_pack, &g4__gemm_acc_blocks);
                g4__gemm_acc_ref(yr, (size_t)N, x, (size_t)K, B, bdt, ldb, kmajor, K, n, 0, N);
                e.data = B; e.dtype = bdt;
                for (t = 0; t < n; t++)
                    for (c = 0; c < N; c++) {
                        double mag = 1.0, d;
                        for (k = 0; k < K; k++)
                            mag += fabs(x[t * K + k] * g4__get(&e, kmajor ? (size_t)k * ldb + (size_t)c : (size_t)c * ldb + (size_t)k));
                        d = fabs((double)y[t * N + c] - (double)yr[t * N + c]) / mag;
                        if (!(d <= worst)) worst = d;
                    }
                CHECK(worst <= 4e-6, "n %d N %d K %d kmajor %d dtype %d: worst error %.3g of the sum of |terms|", n, N, K, kmajor,
                      dt, worst);
                free(B); free(x); free(y); free(yr);
            }
#else
    skip("this build has no packed GEMM (G4__HAVE_GEMM 0): g4__gemm_acc is the reference itself");
#endif
}

/* the matmul backward (g4__matmul_bwd) against double sums, bf16 weights read
   as stored, odd sizes (tiles and column tails); then 1 thread = 2 threads */
static void test_matmul_backward_bf16(void) {
    enum { N = 7, IN = 150, OUT = 13 };
    uint16_t wb[OUT * IN];
    float x[N * IN], dy[N * OUT], dx[N * IN], dw[OUT * IN], dx2[N * IN], dw2[OUT * IN], dyt[N * OUT], xt[N * IN];
    double err = 0, big = 0;
    g4_tensor w;
    g4_session s;
    g4_pool *pool = NULL;
    int t, o, i;
    for (i = 0; i < OUT * IN; i++) { float f = (float)urand(); uint32_t u; memcpy(&u, &f, 4); wb[i] = (uint16_t)(u >> 16); }
    for (i = 0; i < N * IN; i++) { x[i] = (float)urand(); dx[i] = dx2[i] = 0.5f; }
    for (i = 0; i < N * OUT; i++) dy[i] = (float)urand();
    for (i = 0; i < OUT * IN; i++) dw[i] = dw2[i] = 0.25f;
    memset(&w, 0, sizeof w);
    memset(&s, 0, sizeof s);
    s.pack = g_pack; s.pack_parts = 2;
    w.data = wb; w.dtype = G4_BF16; w.ndim = 2; w.shape[0] = OUT; w.shape[1] = IN;
    g4__matmul_bwd(&s, dx, dw, dy, x, &w, N, dyt, xt); /* both accumulate (+=) */
    for (t = 0; t < N; t++)
        for (i = 0; i < IN; i++) {
            double acc = 0.5;
            for (o = 0; o < OUT; o++) acc += (double)dy[t * OUT + o] * g4__bf16_to_f32(wb[o * IN + i]);
            err = fmax(err, fabs(acc - dx[t * IN + i])); big = fmax(big, fabs(acc));
        }
    for (o = 0; o < OUT; o++)
        for (i = 0; i < IN; i++) {
            double acc = 0.25;
            for (t = 0; t < N; t++) acc += (double)dy[t * OUT + o] * x[t * IN + i];
            err = fmax(err, fabs(acc - dw[o * IN + i])); big = fmax(big, fabs(acc));
        }
    CHECK(err <= 2e-6 * big, "max error %.3g", err);
    if (g4_pool_create(&pool, 2) == G4_OK) {
        s.cfg.pool = pool;
        g4__matmul_bwd(&s, dx2, dw2, dy, x, &w, N, dyt, xt);
        CHECK(!memcmp(dx, dx2, sizeof dx) && !memcmp(dw, dw2, sizeof dw), "2 threads give other bits");
        g4_pool_free(pool);
    }
}

/* attention of one query head over a slot, sliding window, against finite
   differences of a double forward in q, K and V */
static void test_attend_backward(void) {
    enum { T = 6, D = 8, KVH = 2 };
    float k[T * KVH * D], v[T * KVH * D], q[D], dout[D], dq[D], dk[T * KVH * D], dv[T * KVH * D], p[T];
    double big = 0, err = 0;
    g4_kv_slot sl;
    int lo = 2, hi = 5, kvh = 1, i, which;
    for (i = 0; i < T * KVH * D; i++) { k[i] = (float)urand(); v[i] = (float)urand(); dk[i] = dv[i] = 0; }
    for (i = 0; i < D; i++) { q[i] = (float)(2 * urand()); dout[i] = (float)urand(); }
    memset(&sl, 0, sizeof sl);
    sl.kv_heads = KVH; sl.head_dim = D; sl.capacity = T; sl.n_pos = T; sl.k = k; sl.v = v;
    g4__attend_backward(dq, dk, dv, dout, q, &sl, kvh, lo, hi, p);
    for (which = 0; which < 3; which++) { /* q, K, V */
        int n = which ? T * KVH * D : D, j;
        for (j = 0; j < n; j++) {
            double s[2], ours;
            int sgn;
            for (sgn = 0; sgn < 2; sgn++) {
                double h = sgn ? -FD_H : FD_H, sc[T], mx = -1e300, z = 0, acc = 0;
                int kk, d;
                double qd[D];
                for (d = 0; d < D; d++) qd[d] = q[d] + (which == 0 && d == j ? h : 0);
                for (kk = lo; kk <= hi; kk++) {
                    double a = 0;
                    for (d = 0; d < D; d++) {
                        int at = (kk * KVH + kvh) * D + d;
                        a += qd[d] * (k[at] + (which == 1 && at == j ? h : 0));
                    }
                    sc[kk] = a; mx = fmax(mx, a);
                }
                for (kk = lo; kk <= hi; kk++) z += exp(sc[kk] - mx);
                for (kk = lo; kk <= hi; kk++)
                    for (d = 0; d < D; d++) {
                        int at = (kk * KVH + kvh) * D + d;
                        acc += dout[d] * exp(sc[kk] - mx) / z * (v[at] + (which == 2 && at == j ? h : 0));
                    }
                s[sgn] = acc;
            }
            ours = which == 0 ? dq[j] : which == 1 ? dk[j] : dv[j];
            big = fmax(big, fabs((s[0] - s[1]) / (2 * FD_H)));
            err = fmax(err, fabs(ours - (s[0] - s[1]) / (2 * FD_H)));
        }
    }
    CHECK(err <= OPS_TOL * big, "max error %.3g vs max |grad| %.3g", err, big);
    CHECK(dk[0] == 0 && dv[(1 * KVH + kvh) * D] == 0, "keys outside the window got a gradient");
}

/* the layer's two-pass attention backward (g4__attn_bwd_q / _kv, threaded)
   = the reference pair by pair, bit for bit: window 3, 2 KV heads of 4 query
   heads; pass A's heads' outputs (o_proj's input) = the forward's g4__attend,
   which gives the same bits one head at a time and NH / KVH heads at a time */
static void test_attention_backward_passes(void) {
    enum { T = 9, D = 8, KVH = 2, NH = 4, W = 3 };
    float k[T * KVH * D], v[T * KVH * D], q[T * NH * D], dout[T * NH * D];
    float dq[T * NH * D], dk[T * KVH * D], dv[T * KVH * D], dq2[T * NH * D], dk2[T * KVH * D], dv2[T * KVH * D];
    float p[T], p3[NH * T], stats[T * NH * 3], scratch[4 * T], att[T * NH * D], att2[T * NH * D], att3[T * NH * D];
    g4_kv_slot sl;
    g4__attn_bwd_job j;
    g4_pool *pool = NULL;
    int i, pass;
    for (i = 0; i < T * KVH * D; i++) { k[i] = (float)urand(); v[i] = (float)urand(); dk[i] = dv[i] = 0; }
    for (i = 0; i < T * NH * D; i++) { q[i] = (float)(2 * urand()); dout[i] = (float)urand(); }
    memset(&sl, 0, sizeof sl);
    sl.kv_heads = KVH; sl.head_dim = D; sl.capacity = T; sl.n_pos = T; sl.k = k; sl.v = v;
    for (i = 0; i < T * NH; i++) {
        int t = i / NH, h = i % NH, lo = t - W + 1 > 0 ? t - W + 1 : 0;
        g4__attend_backward(dq + i * D, dk, dv, dout + i * D, q + i * D, &sl, h / (NH / KVH), lo, t, p);
        g4__attend(att + i * D, q + i * D, 1, &sl, h / (NH / KVH), lo, t, p, 0);
    }
    for (i = 0; i < T * KVH; i++) { /* the forward's items of NH / KVH heads at once: the same bits */
        int t = i / KVH, g = i % KVH, lo = t - W + 1 > 0 ? t - W + 1 : 0;
        g4__attend(att3 + (t * NH + g * (NH / KVH)) * D, q + (t * NH + g * (NH / KVH)) * D, NH / KVH, &sl, g, lo, t, p3, 0);
    }
    CHECK(!memcmp(att, att3, sizeof att), "the forward's heads taken %d at a time differ from one at a time", NH / KVH);
    if (g4_pool_create(&pool, 2) != G4_OK) { CHECK(0, "pool"); return; }
    for (pass = 0; pass < 2; pass++) { /* one thread, then two */
        memset(dk2, 0, sizeof dk2); memset(dv2, 0, sizeof dv2);
        memset(att2, 0, sizeof att2);
        j.sl = &sl; j.q = q; j.dout = dout; j.att = att2; j.dq = dq2; j.dk = dk2; j.dv = dv2; j.stats = stats; j.scratch = scratch;
        j.scratch_len = T; j.n = T; j.NH = NH; j.group = NH / KVH; j.window = W;
        g4__parallel(pass ? pool : NULL, g4__attn_bwd_q, &j);
        g4__parallel(pass ? pool : NULL, g4__attn_bwd_kv, &j);
        CHECK(!memcmp(dq, dq2, sizeof dq) && !memcmp(dk, dk2, sizeof dk) && !memcmp(dv, dv2, sizeof dv),
              "%d thread(s): the two passes differ from the reference", pass + 1);
        CHECK(!memcmp(att, att2, sizeof att), "%d thread(s): the heads' outputs differ from the forward's", pass + 1);
    }
    g4_pool_free(pool);
}

/* The backward's recomputed forward quantities have the forward's bits: the
   attention probabilities (g4__expf, as g4__softmax), the logits' soft-cap
   (g4__tanhf, as g4__softcap) and GELU's tanh (g4__gelu_tanh, as g4__gelu_n).
   The inputs are ones where the C library's expf/tanhf round differently from
   g4__expf/g4__tanhf (searched for here; glibc 2.36 misrounds about 4e-5 of
   expf's inputs and 2.8% of tanhf's), so a backward calling the C library
   gives other bits. Where none is found (another libm) the checks still run. */
static float libm_differs(int tanh_fn, float from) {
    float x = from;
    int i;
    for (i = 0; i < 4000000; i++) {
        if (tanh_fn ? tanhf(x) != g4__tanhf(x) : expf(x) != g4__expf(x)) return x;
        x = nextafterf(x, tanh_fn ? 10.0f : -30.0f);
    }
    return from;
}

/* The loss's row (g4__ce_row: its tanh and exps in SIMD where the build has
   them) against its scalar reference g4__ce_row_ref, bit for bit: the loss
   and every gradient, soft-cap on (30, the released one; 0.75, so that
   |z / cap| crosses 0.25 and 9.1 in every group) and off, rows of lengths
   that leave tails, the label in a group and in the tail, and rows with 0,
   +-inf, NaN and logits 300 apart (exp below -250: the scalar branch). A NaN
   matches any NaN: its sign and payload follow the order of the operands,
   which the compiler may swap (at -O1 under ASan, the row with a NaN logit
   summed to -nan in one and nan in the other). */
static void test_ce_row_simd(void) {
#ifdef G4__EXPD_W
    enum { VMAX = 203 };
    const float caps[3] = {30.0f, 0.75f, 0.0f};
    const int lens[4] = {VMAX, 64, 7, 1};
    float z[VMAX], zr[VMAX], zs[VMAX];
    int c, n, k, i, rows = 0, bad = 0;
    for (c = 0; c < 3; c++)
        for (n = 0; n < 4; n++)
            for (k = 0; k < 4; k++) {
                int V = lens[n], y = k == 0 ? 0 : k == 1 ? V / 2 : V - 1;
                double lr, ls;
                for (i = 0; i < V; i++) z[i] = (float)(urand() * (k == 3 ? 3.0 : 12.0));
                if (k == 2 && V > 8) { z[1] = 0.0f; z[3] = -0.0f; z[5] = 300.0f; z[6] = -300.0f; }
                if (k == 3 && V > 8) { z[2] = INFINITY; z[4] = -INFINITY; }
                if (k == 3 && V == 64) z[9] = NAN;
                memcpy(zr, z, sizeof(float) * (size_t)V);
                memcpy(zs, z, sizeof(float) * (size_t)V);
                lr = g4__ce_row_ref(zr, V, y, caps[c], 0.125f);
                ls = g4__ce_row(zs, V, y, caps[c], 0.125f);
                rows++;
                int same = !memcmp(&lr, &ls, sizeof lr) || (lr != lr && ls != ls); /* NaN: any sign and payload */
                for (i = 0; i < V; i++) same &= !memcmp(&zr[i], &zs[i], sizeof(float)) || (zr[i] != zr[i] && zs[i] != zs[i]);
                if (!same) {
                    if (!bad) printf("  cap %g, V %d, case %d: loss %.17g vs reference %.17g\n", caps[c], V, k, ls, lr);
                    bad++;
                }
            }
    printf("  %d rows, %d differ\n", rows, bad);
    CHECK(bad == 0, "%d of %d rows differ from the reference", bad, rows);
#else
    skip("this build has no SIMD doubles (G4__EXPD_W): g4__ce_row is the reference itself");
#endif
}

static void test_backward_recomputes_forward_bits(void) {
    enum { T = 2, D = 4, V = 5 };
    float ex = libm_differs(0, -1.5f), th = libm_differs(1, 0.3f);
    printf("  libm differs from g4__: expf at %.9g (%s), tanhf at %.9g (%s)\n", ex,
           expf(ex) != g4__expf(ex) ? "yes" : "none found", th, tanhf(th) != g4__tanhf(th) ? "yes" : "none found");
    { /* attention: query 1 over keys 0 and 1, scores 0 and ex (q = e_0) */
        float k[T * D] = {0}, v[T * D], q[T * D] = {0}, dout[T * D], dq[T * D], dk[T * D] = {0}, dv[T * D] = {0};
        float dq2[T * D], dk2[T * D] = {0}, dv2[T * D] = {0}, p[T], stats[T * 3], scratch[2 * T], att[T * D];
        g4_kv_slot sl;
        g4__attn_bwd_job j;
        int i;
        k[D] = ex;
        q[0] = q[D] = 1.0f;
        for (i = 0; i < T * D; i++) { v[i] = (float)urand(); dout[i] = (float)urand(); }
        sl = g4__kv_slot_of(1, D, T, k, v);
        for (i = 0; i < T; i++) g4__attend_backward(dq + i * D, dk, dv, dout + i * D, q + i * D, &sl, 0, 0, i, p);
        memset(&j, 0, sizeof j);
        j.sl = &sl; j.q = q; j.dout = dout; j.att = att; j.dq = dq2; j.dk = dk2; j.dv = dv2; j.stats = stats;
        j.scratch = scratch; j.scratch_len = T; j.n = T; j.NH = 1; j.group = 1;
        g4__parallel(NULL, g4__attn_bwd_q, &j);
        g4__parallel(NULL, g4__attn_bwd_kv, &j);
        p[0] = 0.0f; p[1] = ex;
        g4__softmax(p, 2);
        CHECK(stats[3 + 1] == 1.0f + g4__expf(ex), "pass A's softmax sum %.9g is not the forward's %.9g", stats[4],
              1.0f + g4__expf(ex));
        CHECK(!memcmp(dq, dq2, sizeof dq) && !memcmp(dk, dk2, sizeof dk) && !memcmp(dv, dv2, sizeof dv),
              "the two passes' probabilities are not g4__softmax's");
    }
    { /* the loss: soft-cap 2 (z / cap exact), the label's logit at th */
        float z[V] = {0.5f, -1.25f, 0.0f, 1.0f, 3.0f}, c[V], cap = 2.0f;
        float mx;
        double sum = 0, ref, loss;
        g4_session s;
        int i, y = 2;
        z[y] = 2.0f * th;
        memcpy(c, z, sizeof c);
        memset(&s, 0, sizeof s);
        g4__softcap(&s, c, cap, V); /* the forward's capped logits */
        for (mx = c[0], i = 1; i < V; i++) mx = c[i] > mx ? c[i] : mx; /* -log softmax, as g4__ce_row sums it */
        for (i = 0; i < V; i++) sum += g4__exp_nonpos((double)(c[i] - mx)); /* the forward's exp (g4__exp_d) */
        ref = (double)mx + log(sum) - (double)c[y];
        loss = g4__ce_row(z, V, y, cap, 1.0f);
        CHECK(loss == ref, "cross-entropy %.17g from other capped logits than the forward's (%.17g)", loss, ref);
    }
    { /* the loss's exp in double, g4__exp_nonpos (the forward's g4__exp_d): within an ulp of libm's
         exp on [-250, 0] (100001 points), and 0 below, where exp is under 1e-108 */
        int i, far = 0, eq = 0;
        for (i = 0; i <= 100000; i++) {
            double x = -250.0 * (double)i / 100000.0 - (double)urand() * 1e-3, a = g4__exp_nonpos(x), b = exp(x);
            if (x < -250.0) { far += a != 0.0; continue; }
            far += fabs(a - b) > 2.3e-16 * b;
            eq += a == b;
        }
        printf("  the loss's exp (g4__exp_d): %d of 100001 points equal to libm's exp, the rest within an ulp\n", eq);
        CHECK(far == 0, "%d points: g4__exp_nonpos is more than an ulp from exp", far);
        CHECK(g4__exp_nonpos(-250.5) == 0.0 && g4__exp_nonpos(0.0) == 1.0, "exp_nonpos's ends");
    }
    { /* GELU: the backward's tanh gives the forward's g4__gelu_n, bit for bit */
        float x[4001], y[4001];
        int i, bad = 0;
        for (i = 0; i < 4001; i++) x[i] = (float)(i - 2000) / 160.0f + (float)urand() * 1e-3f;
        g4__gelu_n(y, x, 4001);
        for (i = 0; i < 4001; i++) bad += y[i] != (0.5f * x[i]) * (1.0f + g4__gelu_tanh(x[i], 1));
        CHECK(bad == 0, "%d of 4001 inputs: g4__gelu_tanh is not the tanh of the forward's gelu", bad);
    }
}

/* ------------------------------------------------------- the whole model */

typedef struct {
    g4_model m;
    g4_train t;
    void *arena;
    float *G;
    g4_pool *pool;
} tctx;

static int tctx_open_dir(tctx *c, const char *dir, int max_seq, int recompute, int threads, int drop) {
    g4_train_config cfg = g4_train_config_init();
    size_t bytes, floats;
    memset(c, 0, sizeof *c);
    if (g4_model_load(&c->m, dir) != G4_OK) { CHECK(0, "load %s: %s", dir, c->m.error); return 0; }
    if (threads > 1 && g4_pool_create(&c->pool, threads) != G4_OK) { CHECK(0, "pool"); return 0; }
    cfg.max_seq = max_seq;
    cfg.recompute = recompute;
    cfg.pool = c->pool;
    cfg.debug_drop_reader_kv_grads = drop;
    if (g4_train_size(&c->m, &cfg, &bytes, &floats) != G4_OK) { CHECK(0, "train size"); return 0; }
    c->arena = malloc(bytes);
    c->G = (float *)malloc(sizeof(float) * floats);
    if (!c->arena || !c->G) { CHECK(0, "out of memory"); return 0; }
    if (g4_train_init(&c->t, &c->m, &cfg, c->arena, bytes) != G4_OK) { CHECK(0, "train init: %s", c->t.error); return 0; }
    CHECK(c->t.grad_floats == floats, "grad_floats %zu != %zu", c->t.grad_floats, floats);
    return 1;
}

static int tctx_open(tctx *c, const char *model, int max_seq, int recompute, int threads, int drop) {
    return tctx_open_dir(c, tiny(model), max_seq, recompute, threads, drop);
}

static void tctx_free(tctx *c) {
    free(c->arena);
    free(c->G);
    g4_pool_free(c->pool);
    g4_model_free(&c->m);
}

static int grad_golden_open(golden *g, const char *model) {
    memset(g, 0, sizeof *g);
    if (g4__add_file(&g->m, tiny(model), "grad_golden.safetensors") != G4_OK || g4__st_finish(&g->m) != G4_OK) {
        printf("  cannot read %s/grad_golden.safetensors: %s\n", tiny(model), g->m.error);
        g4_model_free(&g->m);
        return 0;
    }
    return g->ok = 1;
}

static double sign_proj(const float *g, size_t n, int j) { /* tools/make_grad_goldens.py sign_vector */
    double acc = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        uint64_t h = g4__splitmix64((uint64_t)i + ((uint64_t)(j + 1) << 32));
        acc += (h >> 63) ? -(double)g[i] : (double)g[i];
    }
    return acc;
}

typedef struct { int checked, failed, full, fd; double worst; char worst_name[128], first_bad[128]; } gcheck;

/* max |ours - ref| / max |ref| over a tensor of `rows` rows whose golden holds
   only the rows idx[0..k) (ascending; stored [k][cols]), every other row
   exactly 0 (grad_rows.<name>, tools/make_grad_goldens.py); INFINITY when the
   golden is malformed */
static double sparse_rows_rel(const float *ours, const float *ref, const int32_t *idx, int k, int64_t rows, int64_t cols) {
    double mx = 0, ra = 0;
    int64_t r, c;
    int at = 0;
    for (r = 0; r < rows; r++) {
        const float *want = at < k && idx[at] == r ? ref + (size_t)at++ * (size_t)cols : NULL;
        for (c = 0; c < cols; c++) {
            double w = want ? want[c] : 0.0, d = fabs((double)ours[(size_t)(r * cols + c)] - w);
            if (d > mx || d != d) mx = d != d ? INFINITY : d; /* as max_diff: a NaN is INFINITY */
            if (fabs(w) > ra) ra = fabs(w);
        }
    }
    if (at != k) return INFINITY; /* indices not ascending or out of range */
    return mx / fmax(ra, 1e-30);
}

/* max(a, b), a NaN giving INFINITY (fmax drops a NaN: a NaN gradient would
   pass the sum-of-squares, max and projection checks) */
static double worse(double a, double b) { return a != a || b != b ? INFINITY : a > b ? a : b; }

/* One tensor's gradient against the golden; returns its worst relative error. */
static double check_entry(golden *g, const g4_grad_entry *e, const float *ours, gcheck *gc, int verbose) {
    char key[160];
    int64_t n;
    const float *st, *full, *fd;
    const g4_tensor *q;
    double ss = 0, mx = 0, worst = 0, norm;
    size_t i;
    int j;
    snprintf(key, sizeof key, "gstat.%s", e->name);
    st = golden_f32(g, key, &n);
    if (!st || n != 10) { if (verbose) printf("  golden has no %s\n", key); return INFINITY; }
    for (i = 0; i < e->count; i++) { ss += (double)ours[i] * ours[i]; mx = worse(mx, fabs(ours[i])); }
    norm = sqrt((double)st[0]);
    worst = worse(worst, fabs(ss - st[0]) / fmax(st[0], 1e-30) / 2);
    worst = worse(worst, fabs(mx - st[1]) / fmax(st[1], 1e-30));
    for (j = 0; j < 8; j++)
        worst = worse(worst, fabs(sign_proj(ours, e->count, j) - st[2 + j]) / fmax(norm * sqrt(8.0), 1e-30));
    snprintf(key, sizeof key, "grad.%s", e->name);
    full = golden_f32(g, key, &n);
    if (full) {
        const int32_t *rows;
        int k;
        snprintf(key, sizeof key, "grad_rows.%s", e->name);
        if ((rows = golden_ids(g, key, &k)) != NULL) { /* the nonzero rows only */
            if (e->ndim != 2 || (int64_t)k * e->shape[1] != n) return INFINITY;
            worst = worse(worst, sparse_rows_rel(ours, full, rows, k, e->shape[0], e->shape[1]));
        } else {
            if ((size_t)n != e->count) return INFINITY;
            worst = worse(worst, max_diff(ours, full, e->count) / fmax(max_abs(full, e->count), 1e-30));
        }
        gc->full++;
    } else if (snprintf(key, sizeof key, "gradq.%s", e->name), (q = g4_model_tensor(&g->m, key)) != NULL) {
        double s = st[1] / GQ_MAX, d = 0;
        int64_t count = 1;
        for (j = 0; j < q->ndim; j++) count *= q->shape[j];
        if (q->dtype != G4_I16 || (size_t)count != e->count || !(st[1] > 0)) return INFINITY;
        for (i = 0; i < e->count; i++) {
            int16_t v;
            double di;
            memcpy(&v, (const unsigned char *)q->data + 2 * i, 2);
            di = fabs((double)ours[i] - v * s);
            if (di > d || di != di) d = di != di ? INFINITY : di; /* as max_diff: a NaN is INFINITY */
        }
        worst = worse(worst, d / st[1] + GQ_ERR);
        gc->full++;
    }
    snprintf(key, sizeof key, "fd.%s", e->name);
    fd = golden_f32(g, key, &n);
    if (fd) {
        for (i = 0; i + 1 < (size_t)n; i += 2) {
            size_t at = (size_t)fd[i];
            if (at >= e->count) return INFINITY;
            worst = worse(worst, fabs(ours[at] - fd[i + 1]) / fmax((double)st[1], 1e-30));
            gc->fd++;
        }
    }
    return worst;
}

/* Every gradient against the golden, reporting the first divergent one in
   backward order (the reverse of the checkpoint walk: last layer first). */
static void check_grads(golden *g, const g4_train *t, const float *G, gcheck *gc, int verbose) {
    int i;
    memset(gc, 0, sizeof *gc);
    for (i = t->n_grads - 1; i >= 0; i--) {
        const g4_grad_entry *e = &t->grads[i];
        double w = check_entry(g, e, G + e->offset, gc, verbose);
        gc->checked++;
        if (!(w <= GTOL)) {
            if (!gc->failed) snprintf(gc->first_bad, sizeof gc->first_bad, "%s", e->name);
            gc->failed++;
            if (verbose) printf("  %s: relative error %.3g\n", e->name, w);
        }
        if (w > gc->worst || w != w) { gc->worst = w; snprintf(gc->worst_name, sizeof gc->worst_name, "%s", e->name); }
    }
}

/* the golden's gradient set, counted */
static int golden_grad_count(golden *g) {
    int i, n = 0;
    for (i = 0; i < g->m.n_tensors; i++) n += !strncmp(g->m.tensors[i].name, "gstat.", 6);
    return n;
}

static void check_model(const char *model) {
    golden g;
    tctx c;
    const int32_t *ids, *labels;
    int n, nl;
    int64_t k;
    float loss;
    const float *ref;
    gcheck gc;
    if (!grad_golden_open(&g, model)) { CHECK(0, "no grad golden for %s", model); return; }
    ids = golden_ids(&g, "input_ids", &n);
    labels = golden_ids(&g, "labels", &nl);
    ref = golden_f32(&g, "loss", &k);
    if (!ids || !labels || nl != n || !ref) { CHECK(0, "golden incomplete"); g4_model_free(&g.m); return; }
    if (tctx_open(&c, model, n, 0, 1, 0)) {
        g4_result r = g4_loss_and_grad(&c.t, ids, labels, n, &loss, c.G);
        CHECK(r == G4_OK, "loss_and_grad: %s", c.t.error);
        CHECK(fabs(loss - ref[0]) <= 1e-5 * fabs(ref[0]), "loss %.7f vs transformers %.7f", loss, ref[0]);
        CHECK(c.t.n_grads == golden_grad_count(&g), "gradient set: %d tensors, transformers trains %d", c.t.n_grads,
              golden_grad_count(&g));
        check_grads(&g, &c.t, c.G, &gc, 1);
        CHECK(gc.failed == 0, "%d of %d gradients off; first in backward order: %s", gc.failed, gc.checked, gc.first_bad);
        CHECK(gc.fd > 0, "no finite-difference points checked");
        printf("  loss %.7f (ref %.7f); %d gradients (%d in full, %d finite-difference points): worst %.3g at %s\n",
               loss, ref[0], gc.checked, gc.full, gc.fd, gc.worst, gc.worst_name);
    }
    tctx_free(&c);
    g4_model_free(&g.m);
}

/* The golden keeps only the nonzero rows of e2b_like's PLE table gradient
   (grad_rows.*): every other row must still be checked as exactly 0. A
   gradient planted in the pad row (id 0: padding_idx, no lookup gradient) is
   over tolerance; the unplanted gradient is not. */
static void test_sparse_golden_rows(void) {
    golden g;
    tctx c;
    const int32_t *ids, *labels, *rows;
    int n, nl, k;
    float loss;
    gcheck gc;
    const g4_grad_entry *e;
    memset(&c, 0, sizeof c);
    if (!grad_golden_open(&g, "e2b_like")) { CHECK(0, "no grad golden"); return; }
    ids = golden_ids(&g, "input_ids", &n);
    labels = golden_ids(&g, "labels", &nl);
    rows = golden_ids(&g, "grad_rows.model.embed_tokens_per_layer.weight", &k);
    CHECK(rows && k > 0 && rows[0] > 0, "the golden's PLE table gradient is not stored by rows, or has the pad row");
    if (rows && tctx_open(&c, "e2b_like", n, 0, 1, 0) && (e = g4_train_grad(&c.t, "model.embed_tokens_per_layer.weight"))) {
        CHECK(g4_loss_and_grad(&c.t, ids, labels, n, &loss, c.G) == G4_OK, "%s", c.t.error);
        memset(&gc, 0, sizeof gc);
        CHECK(check_entry(&g, e, c.G + e->offset, &gc, 0) <= GTOL, "the PLE table's gradient is off");
        c.G[e->offset + 7] = 1e-3f; /* row 0, column 7 */
        CHECK(check_entry(&g, e, c.G + e->offset, &gc, 0) > GTOL, "a gradient in the pad row passed");
    }
    tctx_free(&c);
    g4_model_free(&g.m);
}

static void test_e2b(void) { check_model("e2b_like"); }
static void test_e4b(void) { check_model("e4b_like"); }
static void test_31b(void) { check_model("31b_like"); }
static void test_26b(void) { check_model("26b_like"); }
static void test_plain(void) { check_model("plain"); }
static void test_legacy(void) { check_model("legacy_keys"); }
static void test_ple_wide(void) { check_model("ple_wide"); }
/* the 12B unified model's stand-in (Gemma4UnifiedForConditionalGeneration:
   attention_k_eq_v, per-layer head_dim / KV heads on the full layers, shared
   KV, double-wide MLP), text tokens only, golden from
   tools/make_unified_grad_goldens.py. The same GTOL = 1e-4 as the models
   above: on this model torch's sdpa and eager gradients differ by 2.0e-5 and
   its float64 and float32 autograd by 2.0e-5 (data/tiny/UNIFIED_GRAD_VERSIONS.txt). */
static void test_unified(void) { check_model("unified_like"); }

/* recompute = no recompute, and 2 threads = 1 thread, bit for bit (and an
   arena for longer sequences: extra = more max_seq than the sequence) */
static void same_bits_ex(const char *model, int recompute, int threads, int extra) {
    golden g;
    tctx a, b;
    const int32_t *ids, *labels;
    int n, nl;
    float la = 0, lb = 1;
    if (!grad_golden_open(&g, model)) { CHECK(0, "no grad golden"); return; }
    ids = golden_ids(&g, "input_ids", &n);
    labels = golden_ids(&g, "labels", &nl);
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    if (tctx_open(&a, model, n, 0, 1, 0) && tctx_open(&b, model, n + extra, recompute, threads, 0)) {
        CHECK(g4_loss_and_grad(&a.t, ids, labels, n, &la, a.G) == G4_OK, "%s", a.t.error);
        CHECK(g4_loss_and_grad(&b.t, ids, labels, n, &lb, b.G) == G4_OK, "%s", b.t.error);
        CHECK(la == lb, "loss %.9g vs %.9g", la, lb);
        CHECK(!memcmp(a.G, b.G, sizeof(float) * a.t.grad_floats), "gradients differ");
        if (recompute)
            CHECK(b.t.saved_bytes < a.t.saved_bytes, "recompute keeps %zu bytes, not less than %zu", b.t.saved_bytes,
                  a.t.saved_bytes);
        if (recompute) printf("  saved activations: %zu bytes, %zu with recompute\n", a.t.saved_bytes, b.t.saved_bytes);
    }
    tctx_free(&a);
    tctx_free(&b);
    g4_model_free(&g.m);
}

static void same_bits(const char *model, int recompute, int threads) { same_bits_ex(model, recompute, threads, 0); }
static void test_longer_arena(void) { same_bits_ex("e2b_like", 0, 1, 9); }
static void test_recompute_e2b(void) { same_bits("e2b_like", 1, 1); }
static void test_recompute_moe(void) { same_bits("26b_like", 1, 1); }
static void test_threads_e2b(void) { same_bits("e2b_like", 0, 2); }
static void test_threads_moe(void) { same_bits("26b_like", 1, 3); }
static void test_recompute_ple_wide(void) { same_bits("ple_wide", 1, 2); }

/* Every scratch row sized by the widest width it holds: a checkpoint whose
   widths are ordered unlike the goldens' (attention narrower than the hidden
   size on sliding layers, NH*D 32 < H 48 < 64 on full ones; 64 experts > H;
   the experts' [gate | up] 80 wider than everything; the vocabulary 64 and
   the PLE width 8 small; a double-wide reader), made by `gemma4 synth`, runs
   the forward and the backward (with the ASan red zones of the sanitizer
   build: a row sized too small is an ASan error), and recompute + 2 threads
   give the same bits. No golden: the red zones are the check, the bits the
   second one. */
static void test_arena_widths(void) {
    static const char config[] =
        "{\"architectures\": [\"Gemma4ForCausalLM\"], \"model_type\": \"gemma4_text\", \"attention_k_eq_v\": false,\n"
        " \"enable_moe_block\": true, \"num_experts\": 64, \"top_k_experts\": 4, \"moe_intermediate_size\": 40,\n"
        " \"final_logit_softcapping\": 30.0, \"head_dim\": 16, \"hidden_activation\": \"gelu_pytorch_tanh\",\n"
        " \"hidden_size\": 48, \"hidden_size_per_layer_input\": 8, \"vocab_size_per_layer_input\": 64,\n"
        " \"intermediate_size\": 20, \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\",\n"
        " \"full_attention\"], \"max_position_embeddings\": 128, \"num_attention_heads\": 2, \"num_hidden_layers\": 4,\n"
        " \"num_key_value_heads\": 1, \"num_kv_shared_layers\": 1, \"pad_token_id\": 0,\n"
        " \"per_layer_config\": {\"2\": {\"head_dim\": 32}, \"3\": {\"head_dim\": 32}}, \"rms_norm_eps\": 1e-06,\n"
        " \"rope_parameters\": {\"full_attention\": {\"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0,\n"
        " \"rope_type\": \"proportional\"}, \"sliding_attention\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}},\n"
        " \"sliding_window\": 4, \"tie_word_embeddings\": true, \"use_double_wide_mlp\": true, \"vocab_size\": 64}\n";
    char path[1024], dir[1024], cmd[3072], res[4096];
    int32_t ids[12] = {2, 5, 9, 11, 40, 3, 7, 7, 60, 20, 30, 4};
    float la = 0, lb = 1;
    tctx a, b;
    FILE *f;
    if (!g_cli) { skip("no CLI path given (argv[2]): gemma4 synth makes the checkpoint"); return; }
    snprintf(path, sizeof path, "%s/widths.json", g_tmp);
    snprintf(dir, sizeof dir, "%s/widths", g_tmp);
    if (!(f = fopen(path, "w"))) { CHECK(0, "cannot write %s", path); return; }
    fputs(config, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s synth --config %s --out %s 2>&1", g_cli, path, dir);
    if (run_cli("", cmd, res, sizeof res, NULL, NULL, 0) != 0) { CHECK(0, "synth: %s", res); return; }
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    if (tctx_open_dir(&a, dir, 12, 0, 1, 0) && tctx_open_dir(&b, dir, 12, 1, 2, 0)) {
        CHECK(a.m.config.hidden_size == 48 && a.m.config.num_experts == 64 && a.m.plan.layer[3].reads == 2 &&
                  a.m.plan.layer[3].mlp_width == 40,
              "the synthesized checkpoint is not the shape under test");
        CHECK(g4_loss_and_grad(&a.t, ids, NULL, 12, &la, a.G) == G4_OK, "%s", a.t.error);
        CHECK(g4_loss_and_grad(&b.t, ids, NULL, 12, &lb, b.G) == G4_OK, "%s", b.t.error);
        CHECK(la == lb && la > 0 && la < 20, "loss %.9g, with recompute and 2 threads %.9g", la, lb);
        CHECK(!memcmp(a.G, b.G, sizeof(float) * a.t.grad_floats), "recompute + 2 threads: other gradient bits");
    }
    tctx_free(&a);
    tctx_free(&b);
}

/* Recompute reads the shared-KV slots from the table and never captures them
   again. At the forward's last tap ("norm") every slot's K/V get their lowest
   mantissa bit flipped: an owner's recompute that wrote its slot again (as the
   forward does: project, norm, RoPE, store) would put the original bits back.
   After the backward the slots must still hash as flipped. */
typedef struct { const g4_session *s; uint64_t hash; int poisoned; } poison_ctx;

static uint64_t slots_hash(const g4_session *s) {
    uint64_t h = 1469598103934665603ULL;
    int i;
    size_t j, n;
    for (i = 0; i < s->n_slots; i++) {
        const g4_kv_slot *sl = &s->slots[i];
        n = (size_t)sl->capacity * (size_t)sl->kv_heads * (size_t)sl->head_dim;
        for (j = 0; j < 2 * n; j++) {
            uint32_t u;
            memcpy(&u, j < n ? &sl->k[j] : &sl->v[j - n], 4);
            h = (h ^ u) * 1099511628211ULL;
        }
    }
    return h;
}

static void poison_tap(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    poison_ctx *pc = (poison_ctx *)user;
    int i;
    size_t j, n;
    (void)layer; (void)data; (void)rows; (void)cols; (void)pos0;
    if (strcmp(name, "norm")) return;
    for (i = 0; i < pc->s->n_slots; i++) {
        const g4_kv_slot *sl = &pc->s->slots[i];
        n = (size_t)sl->capacity * (size_t)sl->kv_heads * (size_t)sl->head_dim;
        for (j = 0; j < n; j++) {
            uint32_t u;
            memcpy(&u, &sl->k[j], 4); u ^= 1; memcpy(&sl->k[j], &u, 4);
            memcpy(&u, &sl->v[j], 4); u ^= 1; memcpy(&sl->v[j], &u, 4);
        }
    }
    pc->hash = slots_hash(pc->s);
    pc->poisoned = 1;
}

static void test_recompute_reads_table(void) {
    tctx c;
    int32_t ids[12] = {2, 5, 9, 11, 40, 3, 7, 7, 100, 200, 300, 4};
    float loss;
    poison_ctx pc;
    if (tctx_open(&c, "e2b_like", 12, 1, 1, 0)) {
        memset(&pc, 0, sizeof pc);
        pc.s = &c.t.s;
        c.t.cfg.tap = poison_tap;
        c.t.cfg.tap_user = &pc;
        CHECK(g4_loss_and_grad(&c.t, ids, NULL, 12, &loss, c.G) == G4_OK, "%s", c.t.error);
        CHECK(pc.poisoned, "the forward's norm tap did not run");
        CHECK(slots_hash(&c.t.s) == pc.hash, "the recompute wrote the shared-KV table again");
    }
    tctx_free(&c);
}

/* The seeds' failure: reader layers whose dK/dV never reach the owner (a
   rebuilt shared-KV dict). Every layer after the owner still matches; the
   owner's k_proj gradient does not, and is named. */
static void test_planted_reader_drop(void) {
    golden g;
    tctx c;
    const int32_t *ids, *labels;
    int n, nl, i, owner = -1, later_bad = 0, kproj_bad = 0;
    float loss;
    char kname[128];
    gcheck gc;
    if (!grad_golden_open(&g, "e2b_like")) { CHECK(0, "no grad golden"); return; }
    ids = golden_ids(&g, "input_ids", &n);
    labels = golden_ids(&g, "labels", &nl);
    if (tctx_open(&c, "e2b_like", n, 0, 1, 1)) {
        const g4_plan *p = &c.m.plan;
        for (i = 0; i < p->n_layers; i++)
            if (p->layer[i].reads > owner) owner = p->layer[i].reads; /* the last owner that has readers */
        snprintf(kname, sizeof kname, "%slayers.%d.self_attn.k_proj.weight", c.m.prefix, owner);
        CHECK(g4_loss_and_grad(&c.t, ids, labels, n, &loss, c.G) == G4_OK, "%s", c.t.error);
        check_grads(&g, &c.t, c.G, &gc, 0);
        for (i = 0; i < c.t.n_grads; i++) {
            const g4_grad_entry *e = &c.t.grads[i];
            gcheck one;
            int layer = -1;
            double w;
            memset(&one, 0, sizeof one);
            w = check_entry(&g, e, c.G + e->offset, &one, 0);
            sscanf(strstr(e->name, "layers.") ? strstr(e->name, "layers.") : "", "layers.%d", &layer);
            if (layer > owner && !(w <= GTOL)) later_bad++;
            if (!strcmp(e->name, kname)) { kproj_bad = !(w <= GTOL); printf("  %s: relative error %.3g\n", kname, w); }
        }
        CHECK(kproj_bad, "the dropped reader gradients went unnoticed at %s", kname);
        CHECK(later_bad == 0, "%d gradients of layers after the owner changed", later_bad);
        CHECK(gc.failed > 0, "no gradient differs");
        printf("  caught: %d gradients off; first in backward order: %s\n", gc.failed, gc.first_bad);
    }
    tctx_free(&c);
    g4_model_free(&g.m);
}

/* the owner's backward refuses to run before all of its readers */
static void test_pending_readers_checked(void) {
    tctx c;
    int32_t ids[12] = {2, 5, 9, 11, 40, 3, 7, 7, 100, 200, 300, 4};
    float loss;
    if (tctx_open(&c, "e2b_like", 12, 0, 1, 0)) {
        const g4_plan *p = &c.m.plan;
        int l, owner = -1;
        g4_result r;
        for (l = 0; l < p->n_layers; l++) if (p->layer[l].reads > owner) owner = p->layer[l].reads;
        /* run the forward and the layers above the owner's readers, then the owner with a reader left out */
        CHECK(g4_loss_and_grad(&c.t, ids, NULL, 12, &loss, c.G) == G4_OK, "%s", c.t.error);
        c.t.pending[p->layer[owner].kv_slot] = 1;
        r = g4__attention_backward(&c.t, c.G, owner, 12, c.t.dbr, c.t.dxn);
        CHECK(r == G4_ERR_INPUT && strstr(c.t.error, "reader"), "got %d '%s'", r, c.t.error);
    }
    tctx_free(&c);
}

static void test_errors(void) {
    tctx c;
    int32_t ids[8] = {2, 5, 9, 11, 40, 3, 7, 7}, labels[8] = {-100, -100, -100, -100, -100, -100, -100, -100};
    float loss;
    g4_train t2;
    g4_train_config cfg = g4_train_config_init();
    size_t bytes, floats;
    if (!tctx_open(&c, "e2b_like", 8, 0, 1, 0)) { tctx_free(&c); return; }
    CHECK(g4_loss_and_grad(&c.t, ids, labels, 8, &loss, c.G) == G4_ERR_INPUT && strstr(c.t.error, "-100"),
          "all ignored: %s", c.t.error);
    labels[0] = 5; /* labels[0] is shifted out: still nothing to learn */
    CHECK(g4_loss_and_grad(&c.t, ids, labels, 8, &loss, c.G) == G4_ERR_INPUT, "only labels[0] set");
    labels[3] = 512;
    CHECK(g4_loss_and_grad(&c.t, ids, labels, 8, &loss, c.G) == G4_ERR_INPUT && strstr(c.t.error, "label 512 at index 3"),
          "label out of range: %s", c.t.error);
    labels[3] = -7;
    CHECK(g4_loss_and_grad(&c.t, ids, labels, 8, &loss, c.G) == G4_ERR_INPUT && strstr(c.t.error, "label -7"),
          "negative label: %s", c.t.error);
    CHECK(g4_loss_and_grad(&c.t, ids, NULL, 9, &loss, c.G) == G4_ERR_INPUT && strstr(c.t.error, "max_seq of 8"),
          "too long: %s", c.t.error);
    ids[2] = 600;
    CHECK(g4_loss_and_grad(&c.t, ids, NULL, 8, &loss, c.G) == G4_ERR_INPUT && strstr(c.t.error, "token id 600"),
          "bad id: %s", c.t.error);
    cfg.max_seq = 8;
    CHECK(g4_train_size(&c.m, &cfg, &bytes, &floats) == G4_OK, "size");
    CHECK(g4_train_init(&t2, &c.m, &cfg, c.arena, bytes - 64) == G4_ERR_ARENA && strstr(t2.error, "too small"),
          "undersized arena: %s", t2.error);
    cfg.bf16 = 1;
    CHECK(g4_train_init(&t2, &c.m, &cfg, c.arena, bytes) == G4_ERR_INPUT && strstr(t2.error, "float32 only"),
          "bf16: %s", t2.error);
    cfg.bf16 = 0;
    cfg.max_seq = 1;
    CHECK(g4_train_size(&c.m, &cfg, &bytes, &floats) == G4_ERR_INPUT, "max_seq 1");
    tctx_free(&c);
}

/* ------------------------------------------------------------ the CLI */

static void list(char *buf, size_t cap, const int32_t *v, int n) {
    size_t len = 0;
    int i;
    buf[0] = 0;
    for (i = 0; i < n && len + 16 < cap; i++) len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "", (int)v[i]);
}

/* `gemma4 grad` writes exactly what g4_loss_and_grad computes, named and shaped as the checkpoint */
static void test_cli_grad(void) {
    golden g, out;
    tctx c;
    const int32_t *ids, *labels;
    int n, nl, i, bad = 0;
    float loss;
    char cmd[4096], ib[1024], lb[1024], res[2048], file[300];
    if (!g_cli) { skip("no CLI path given (argv[2])"); return; }
    if (!grad_golden_open(&g, "26b_like")) { CHECK(0, "no grad golden"); return; }
    ids = golden_ids(&g, "input_ids", &n);
    labels = golden_ids(&g, "labels", &nl);
    list(ib, sizeof ib, ids, n);
    list(lb, sizeof lb, labels, n);
    snprintf(file, sizeof file, "%s/grad.safetensors", g_tmp);
    snprintf(cmd, sizeof cmd, "%s grad %s --ids %s --labels %s --recompute --threads 2 --out %s 2>&1", g_cli,
             tiny("26b_like"), ib, lb, file);
    CHECK(run_cli("", cmd, res, sizeof res, NULL, NULL, 0) == 0, "grad failed: %s", res);
    memset(&out, 0, sizeof out);
    if (tctx_open(&c, "26b_like", n, 0, 1, 0) && g4__add_file(&out.m, g_tmp, "grad.safetensors") == G4_OK &&
        g4__st_finish(&out.m) == G4_OK) {
        int64_t k;
        const float *l = golden_f32(&out, "loss", &k);
        CHECK(g4_loss_and_grad(&c.t, ids, labels, n, &loss, c.G) == G4_OK, "%s", c.t.error);
        CHECK(l && k == 1 && *l == loss, "loss in the file %g, in process %g", l ? *l : -1.0, loss);
        CHECK(out.m.n_tensors == c.t.n_grads + 1, "%d tensors in the file", out.m.n_tensors);
        for (i = 0; i < c.t.n_grads; i++) {
            const g4_grad_entry *e = &c.t.grads[i];
            const g4_tensor *ft = g4_model_tensor(&out.m, e->name), *wt = g4_model_tensor(&c.m, e->name);
            const float *f = golden_f32(&out, e->name, &k);
            int d, same_shape = ft && wt && ft->ndim == wt->ndim;
            for (d = 0; same_shape && d < ft->ndim; d++) same_shape = ft->shape[d] == wt->shape[d];
            if (!f || !same_shape || (size_t)k != e->count || memcmp(f, c.G + e->offset, 4 * e->count)) {
                if (!bad) printf("  first mismatch: %s\n", e->name);
                bad++;
            }
        }
        CHECK(bad == 0, "%d gradients differ from the checkpoint's names/shapes or from g4_loss_and_grad", bad);
    } else CHECK(0, "cannot read %s: %s", file, out.m.error);
    g4_model_free(&out.m);
    tctx_free(&c);
    g4_model_free(&g.m);
}

/* `gemma4 compare` on a gradient dump: the golden file has hf_dump --grad's layout */
static void test_cli_compare_grads(void) {
    static char res[1 << 16];
    char cmd[1024];
    int rc;
    if (!g_cli) { skip("no CLI path given (argv[2])"); return; }
    snprintf(cmd, sizeof cmd, "%s compare %s %s/grad_golden.safetensors 2>&1", g_cli, tiny("e2b_like"), tiny("e2b_like"));
    rc = run_cli("", cmd, res, sizeof res, NULL, NULL, 0);
    CHECK(rc == 0, "compare exit %d:\n%s", rc, res);
    CHECK(strstr(res, "grad.layers.9") && strstr(res, "153 parameter gradients compared, 0 over tolerance"),
          "no gradient report:\n%.2000s", res);
    /* other weights of the same shapes (gemma4 synth on e2b_like's config): over tolerance,
       exit 2, the first divergence named */
    snprintf(cmd, sizeof cmd, "%s synth --config %s/config.json --out %s/e2b_synth 2>&1", g_cli, tiny("e2b_like"), g_tmp);
    if (run_cli("", cmd, res, sizeof res, NULL, NULL, 0) != 0) { CHECK(0, "synth: %s", res); return; }
    snprintf(cmd, sizeof cmd, "%s compare %s/e2b_synth %s/grad_golden.safetensors 2>&1", g_cli, g_tmp, tiny("e2b_like"));
    rc = run_cli("", cmd, res, sizeof res, NULL, NULL, 0);
    CHECK(rc == 2 && strstr(res, "<== first over tolerance") && !strstr(res, "shape differs"), "exit %d:\n%.1500s", rc, res);
}

/* `gemma4 info DIR --train N` = g4_train_size, from the config alone */
static void test_cli_info_train(void) {
    char cmd[1024], res[8192];
    tctx c;
    const char *line;
    double mb = -1, mb_rc = -1;
    if (!g_cli) { skip("no CLI path given (argv[2])"); return; }
    snprintf(cmd, sizeof cmd, "%s info %s --train 24 2>&1", g_cli, tiny("26b_like"));
    CHECK(run_cli("", cmd, res, sizeof res, NULL, NULL, 0) == 0, "%s", res);
    line = strstr(res, "training, 24 tokens: arena ");
    CHECK(line && sscanf(line, "training, 24 tokens: arena %lf MB", &mb) == 1, "%s", res);
    line = line ? strstr(line, "with recompute ") : NULL;
    CHECK(line && sscanf(line, "with recompute %lf MB", &mb_rc) == 1, "%s", res);
    if (tctx_open(&c, "26b_like", 24, 0, 1, 0)) {
        g4_train_config cfg = g4_train_config_init();
        size_t b, f;
        cfg.max_seq = 24;
        CHECK(g4_train_size(&c.m, &cfg, &b, &f) == G4_OK && fabs(b / 1048576.0 - mb) < 0.051, "%zu bytes vs %.1f MB", b, mb);
        cfg.recompute = 1;
        CHECK(g4_train_size(&c.m, &cfg, &b, &f) == G4_OK && fabs(b / 1048576.0 - mb_rc) < 0.051, "%zu vs %.1f MB", b, mb_rc);
    }
    tctx_free(&c);
}

static void test_cli_errors(void) {
    char cmd[1024], res[2048];
    if (!g_cli) { skip("no CLI path given (argv[2])"); return; }
    snprintf(cmd, sizeof cmd, "%s grad %s --ids 2,5,9 --labels 1,600,3 --out %s/x 2>&1", g_cli, tiny("plain"), g_tmp);
    CHECK(run_cli("", cmd, res, sizeof res, NULL, NULL, 0) == 1 && strstr(res, "label 600 at index 1"), "label range: %s", res);
    snprintf(cmd, sizeof cmd, "%s grad %s --ids 2,5,9 --labels 1,-100 --out %s/x 2>&1", g_cli, tiny("plain"), g_tmp);
    CHECK(run_cli("", cmd, res, sizeof res, NULL, NULL, 0) == 1 && strstr(res, "2 labels for 3 ids"), "label count: %s", res);
    snprintf(cmd, sizeof cmd, "%s grad %s --ids 2,5,9 --labels 1,-100,-100 --out %s/x 2>&1", g_cli, tiny("plain"), g_tmp);
    CHECK(run_cli("", cmd, res, sizeof res, NULL, NULL, 0) == 1 && strstr(res, "-100"), "all ignored: %s", res);
    snprintf(cmd, sizeof cmd, "%s grad %s --ids 2,5,9 --labels 1,x,3 --out %s/x 2>&1", g_cli, tiny("plain"), g_tmp);
    CHECK(run_cli("", cmd, res, sizeof res, NULL, NULL, 0) == 1 && strstr(res, "--labels"), "bad labels: %s", res);
    snprintf(cmd, sizeof cmd, "%s grad %s --ids 2,5,9 2>&1", g_cli, tiny("plain"));
    CHECK(run_cli("", cmd, res, sizeof res, NULL, NULL, 0) == 1 && strstr(res, "usage: gemma4 grad"), "no --out: %s", res);
    snprintf(cmd, sizeof cmd, "%s grad %s --ids 2,5,9 --out /nonexistent-dir/x 2>&1", g_cli, tiny("plain"));
    CHECK(run_cli("", cmd, res, sizeof res, NULL, NULL, 0) == 1 && strstr(res, "cannot write"), "unwritable: %s", res);
}

int main(int argc, char **argv) {
    if (argc > 1) g_data = argv[1];
    if (argc > 2) g_cli = argv[2];
    if (!h_tmpdir(g_tmp, sizeof g_tmp, "train")) return 1;
    run("rmsnorm backward = finite differences (weighted, weightless, in place)", test_rmsnorm_backward);
    run("rope backward = the forward's transpose (proportional pairs)", test_rope_backward);
    run("softmax and gelu_pytorch_tanh backward = finite differences", test_softmax_gelu_backward);
    run("packed GEMM's accumulating product = its scalar reference (both B orders, 3 dtypes, past every block)", test_gemm_acc);
    run("matmul backward = double sums (bf16 weights, tile edges); 2 threads = 1", test_matmul_backward_bf16);
    run("attention backward (window, one KV head of two) = finite differences", test_attend_backward);
    run("attention backward: the two threaded passes = the reference, bit for bit", test_attention_backward_passes);
    run("the backward's recomputed exp, soft-cap and GELU tanh = the forward's, bit for bit", test_backward_recomputes_forward_bits);
    run("the loss's row in SIMD = its scalar reference, bit for bit (caps, tails, 0, inf, NaN, exp below -250)", test_ce_row_simd);
    run("grad e2b_like = torch autograd (shared KV, PLE, double-wide MLP)", test_e2b);
    run("grad golden by rows (e2b_like's PLE table): the rows it leaves out are checked as 0", test_sparse_golden_rows);
    run("grad e4b_like = torch autograd (wrapper prefix)", test_e4b);
    run("grad 31b_like = torch autograd (attention_k_eq_v, sharded)", test_31b);
    run("grad 26b_like = torch autograd (MoE router and experts)", test_26b);
    run("grad plain = torch autograd (f16 weights)", test_plain);
    run("grad legacy_keys = torch autograd (no gradient for stale reader K/V)", test_legacy);
    run("grad ple_wide = torch autograd (per-layer inputs wider than the hidden size: P 24 > H 16)", test_ple_wide);
    run("grad unified_like = torch autograd (the 12B unified model's text decoder)", test_unified);
    run("recompute = no recompute, bit for bit (e2b_like)", test_recompute_e2b);
    run("recompute = no recompute, bit for bit (MoE)", test_recompute_moe);
    run("2 threads = 1 thread, bit for bit (e2b_like)", test_threads_e2b);
    run("an arena for 33 tokens runs 24 with the same bits", test_longer_arena);
    run("3 threads + recompute = 1 thread, bit for bit (MoE)", test_threads_moe);
    run("2 threads + recompute = 1 thread, bit for bit (ple_wide: P > H)", test_recompute_ple_wide);
    run("recompute reads the shared-KV slots from the table, never writes them (flipped bits stay)", test_recompute_reads_table);
    run("arena widths: attention narrower than the hidden size, 64 experts, wide experts, small vocab (synth)", test_arena_widths);
    run("planted bug: readers' dK/dV dropped -> caught at the owner's k_proj", test_planted_reader_drop);
    run("the owner's backward waits for every reader (checked)", test_pending_readers_checked);
    run("errors: all labels ignored, label range, too long, arena, bf16", test_errors);
    run("CLI grad: the file = g4_loss_and_grad, checkpoint names and shapes (MoE, recompute, 2 threads)", test_cli_grad);
    run("CLI compare on a gradient dump: loss, dL/d taps, parameters; first divergence", test_cli_compare_grads);
    run("CLI info --train = g4_train_size (with and without recompute)", test_cli_info_train);
    run("CLI grad errors: labels, counts, usage, unwritable file", test_cli_errors);
    remove_tree(g_tmp);
    return finish();
}
