/* cuda_real.c - the CUDA path at real shapes, on a GPU (tests/cuda_device.sh
   builds it and makes the checkpoints with `gemma4 synth`):

       cuda_real cpu DIR PROMPT       exact mode = the CPU path, bit for bit, in
                                      float32 and in the bf16-faithful mode; the
                                      fast modes within their bounds; chunks of
                                      64 and 512 (and 1: decode) = one chunk of
                                      PROMPT tokens (prompt first, then 3 decode
                                      steps; logits of the last row each step)
       cuda_real long DIR POSITIONS   exact and fast sessions side by side over
                                      POSITIONS (past 100k: the sliding rings wrap
                                      hundreds of times), chunks of 512, then 3
                                      decode steps: fast within its bound of exact
       cuda_real limits DIR           an arena past the device's memory fails
                                      cleanly (an error, no crash) and the device
                                      works after it; a max_context past the
                                      config's max_position_embeddings is accepted,
                                      as on the CPU
       cuda_real threads DIR          two sessions on one uploaded model, run from
                                      two host threads at once = each run alone
       cuda_real attn DIR KEYS        the fast attention kernels alone at the model's
                                      full-layer shape (head dim, query heads per KV
                                      head), one decode query over KEYS keys, 1, 16
                                      and 256 splits, against a float64 reference,
                                      beside the exact mode's order (the long-context
                                      bound without the network's amplification)

   The bounds: the exact mode 0 (the scalar CPU's bits); the fast mode op by
   op where nothing has been amplified yet (see "taps" below). Prints
   "N passed, M failed". Not part of make test: it needs a GPU. */
/* The CPU side is the scalar reference (as tests/test_cuda.c): the order the
   exact mode's kernels mirror; threads split rows and change no bit. */
#define G4_NO_SIMD
#define GEMMA4_IMPLEMENTATION
#define GEMMA4_CUDA
#define G4_TESTING /* g4__cuda_fast_attention_testing (cuda_real.sh builds gemma4_cuda.cu with it too) */
#include "../gemma4.h"
#include "harness.h"
#include "fixtures.h" /* max_abs, max_diff */

#include <pthread.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}


#define FAST_TOL 4e-5
#define FAST_TOL_BF16 3e-2
#define FAST_ATT_TOL 2e-6 /* the fast attention alone vs float64 (tests/test_cuda.c's test_fast_long_context) */

typedef struct {
    int cuda;
    g4_session cpu;
    g4_pool *pool;
    g4_cuda_session g;
    void *darena, *harena;
    const char *error;
} runner;

static g4_model g_m;
static g4_cuda_model g_cm;
static int g_V;

static int open_runner(runner *r, int cuda, int fast, int bf16, int max_context, int max_chunk, int threads) {
    g4_session_config sc = g4_session_config_init();
    g4_cuda_config cc;
    char err[G4_ERROR_MAX];
    size_t db, hb;
    memset(r, 0, sizeof *r);
    memset(&cc, 0, sizeof cc);
    sc.max_context = max_context;
    sc.max_chunk = max_chunk;
    sc.bf16 = bf16;
    cc.fast = fast;
    r->cuda = cuda;
    if (!cuda) {
        if (threads > 1 && g4_pool_create(&r->pool, threads) != G4_OK) return 0;
        sc.pool = r->pool;
        r->error = r->cpu.error;
        if (g4_session_create(&r->cpu, &g_m, &sc) != G4_OK) { printf("  cpu session: %s\n", r->cpu.error); return 0; }
        return 1;
    }
    r->error = r->g.error;
    if (g4_cuda_session_size(&g_cm, &sc, &cc, &db, &hb) != G4_OK) { printf("  session size: %s\n", g_cm.error); return 0; }
    if (g4_cuda_malloc(&r->darena, db, err) != G4_OK) { printf("  %s\n", err); return 0; }
    if (!(r->harena = malloc(hb))) return 0;
    if (g4_cuda_session_init(&r->g, &g_cm, &sc, &cc, r->darena, db, r->harena, hb) != G4_OK) {
        printf("  cuda session: %s\n", r->g.error);
        return 0;
    }
    return 1;
}

static void close_runner(runner *r) {
    if (r->cuda) {
        g4_cuda_free(r->darena);
        free(r->harena);
    } else {
        g4_session_destroy(&r->cpu);
        g4_pool_free(r->pool);
    }
    memset(r, 0, sizeof *r);
}

static g4_result fwd(runner *r, const int32_t *ids, int n, float *logits) {
    return r->cuda ? g4_cuda_forward(&r->g, ids, n, logits, G4_LOGITS_LAST)
                   : g4_forward(&r->cpu, ids, n, logits, G4_LOGITS_LAST);
}

/* feeds ids[0..n) in chunks of `chunk`, then `steps` greedy decode steps;
   out gets the last row's logits after the prompt and after each step */
static int run_seq(runner *r, const int32_t *ids, int n, int chunk, int steps, float *out) {
    int i, k = 0;
    for (i = 0; i < n; i += chunk) {
        int c = n - i < chunk ? n - i : chunk;
        if (fwd(r, ids + i, c, out) != G4_OK) { printf("  forward at %d: %s\n", i, r->error); return 0; }
    }
    for (k = 0; k < steps; k++) {
        int32_t next = g4_argmax(out + (size_t)k * g_V, g_V);
        if (fwd(r, &next, 1, out + (size_t)(k + 1) * g_V) != G4_OK) {
            printf("  decode step %d: %s\n", k, r->error);
            return 0;
        }
    }
    return 1;
}

static double rel_diff(const float *a, const float *b, size_t n) { return max_diff(a, b, n) / max_abs(b, n); }

static int32_t *make_ids(int n) {
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    int i;
    for (i = 0; ids && i < n; i++) ids[i] = (int32_t)(((int64_t)i * 7919 + 13) % g_V);
    if (ids) ids[0] = 2;
    return ids;
}

static int load(const char *dir) {
    if (g4_model_load(&g_m, dir) != G4_OK) { printf("load %s: %s\n", dir, g_m.error); return 0; }
    if (g4_cuda_model_upload(&g_cm, &g_m) != G4_OK) { printf("upload: %s\n", g_cm.error); return 0; }
    g_V = g_m.config.vocab_size;
    printf("%s: %d layers, hidden %d, vocab %d, head dims %d (sliding) / %d (last layer), window %d, %.2f GB of "
           "weights on the device\n", dir, g_m.config.num_hidden_layers, g_m.config.hidden_size, g_V,
           g_m.config.layer_head_dim[0], g_m.config.layer_head_dim[g_m.config.num_hidden_layers - 1],
           g_m.config.sliding_window, (double)g_cm.weight_bytes / 1e9);
    return 1;
}

/* ---------------------------------------------------------------- taps */
/* The fast mode against the exact one, op by op: a random-weight network
   amplifies any change of summation order layer after layer (on a 10-layer
   E2B-shaped synth the CPU's AVX2 kernels, another correct order, move from
   the scalar path's bits by 3.4e-6 of max at layer 0's output and 1.2e-4 at
   the logits; 35 layers take that to about 1e-2), so at real shapes the bound
   applies where nothing has been amplified yet: the embedding, the per-layer
   inputs and every tap of layer 0 (the projections at the real K and N, the
   norms, RoPE, attention, the MLP), FAST_TAP_TOL (bf16: FAST_TOL_BF16) of each
   tap's max; deeper taps and the logits are reported. */
#define FAST_TAP_TOL 1e-4
#define MAX_TAPS 4096
typedef struct {
    int n, recording, checked, fails, deep_from, seen; /* seen: bounded taps compared */
    double tol, worst, worst_deep;
    char *name[MAX_TAPS];
    float *data[MAX_TAPS];
    size_t cnt[MAX_TAPS];
} taps;

/* a tap before layer `deep_from`: bounded */
static int shallow(const char *name, int deep_from) {
    if (strncmp(name, "layers.", 7) == 0) return atoi(name + 7) < deep_from;
    return strcmp(name, "embed_tokens") == 0 || strcmp(name, "per_layer_inputs") == 0 ||
           strncmp(name, "per_layer_model_projection", 26) == 0;
}

static void tap_fn(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    taps *t = (taps *)user;
    size_t cnt = (size_t)rows * cols;
    int i;
    (void)layer; (void)pos0;
    if (t->recording) {
        if (t->n >= MAX_TAPS) return;
        t->name[t->n] = strdup(name);
        t->data[t->n] = (float *)malloc(sizeof(float) * cnt);
        memcpy(t->data[t->n], data, sizeof(float) * cnt);
        t->cnt[t->n++] = cnt;
        return;
    }
    for (i = t->checked; i < t->n; i++)
        if (strcmp(t->name[i], name) == 0 && t->cnt[i] == cnt) {
            double d = max_diff(data, t->data[i], cnt) / max_abs(t->data[i], cnt);
            if (shallow(name, t->deep_from)) {
                t->seen++;
                if (!(d <= t->tol)) { printf("  %s: %.3g of its max from the exact mode's\n", name, d); t->fails++; }
                if (d > t->worst) t->worst = d;
            } else if (d > t->worst_deep) t->worst_deep = d;
            t->checked = i + 1;
            return;
        }
}

static void taps_free(taps *t) {
    int i;
    for (i = 0; i < t->n; i++) { free(t->name[i]); free(t->data[i]); }
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------- cpu */
static void test_cpu(int prompt) {
    const int steps = 3, rows = steps + 1;
    int32_t *ids = make_ids(prompt);
    float *ref = (float *)malloc(sizeof(float) * (size_t)rows * g_V), *got = (float *)malloc(sizeof(float) * (size_t)rows * g_V);
    int bf16, chunks[3] = {64, 512, 1}, c, k, ctx = prompt + steps + 1;
    static taps tp;
    for (bf16 = 0; bf16 <= 1; bf16++) {
        runner r;
        double t0 = now_s();
        const char *md = bf16 ? "bf16" : "f32";
        k = open_runner(&r, 0, 0, bf16, ctx, prompt, 16) && run_seq(&r, ids, prompt, prompt, steps, ref);
        close_runner(&r);
        CHECK(k, "cpu run");
        printf("  cpu (scalar kernels, 16 threads) %s: %d tokens + %d steps in %.1f s\n", md, prompt, steps, now_s() - t0);
        for (c = 0; c < 3; c++) {
            int chunk = chunks[c] < prompt ? chunks[c] : prompt, same;
            t0 = now_s();
            k = open_runner(&r, 1, 0, bf16, ctx, chunk, 0) && run_seq(&r, ids, prompt, chunk, steps, got);
            close_runner(&r);
            CHECK(k, "cuda exact run");
            if (!k) continue;
            same = memcmp(got, ref, sizeof(float) * (size_t)rows * g_V) == 0;
            printf("  exact %s, chunks of %d: %s the CPU's bits (%.3g relative; %.1f s)\n", md, chunk, same ? "=" : "!=",
                   rel_diff(got, ref, (size_t)rows * g_V), now_s() - t0);
            CHECK(same, "exact %s, chunks of %d: logits differ from the CPU's", md, chunk);
        }
        /* the fast mode: the exact mode's taps recorded in one chunk, then
           compared op by op (see taps above); chunked runs reported */
        memset(&tp, 0, sizeof tp);
        tp.recording = 1;
        tp.deep_from = 1;
        tp.tol = bf16 ? FAST_TOL_BF16 : FAST_TAP_TOL;
        k = open_runner(&r, 1, 0, bf16, ctx, prompt, 0);
        if (k) { r.g.cfg.tap = tap_fn; r.g.cfg.tap_user = &tp; }
        k = k && fwd(&r, ids, prompt, got) == G4_OK;
        close_runner(&r);
        tp.recording = 0;
        k = k && open_runner(&r, 1, 1, bf16, ctx, prompt, 0);
        if (k) { r.g.cfg.tap = tap_fn; r.g.cfg.tap_user = &tp; }
        k = k && fwd(&r, ids, prompt, got) == G4_OK;
        close_runner(&r);
        CHECK(k && tp.n > 10 && tp.seen > 0, "fast tap runs (%d taps, %d bounded ones compared)", tp.n, tp.seen);
        printf("  fast %s vs exact, op by op: embedding, per-layer inputs and layer 0 within %.3g of each tap's max "
               "(bound %.0e); deeper taps up to %.3g\n", md, tp.worst, tp.tol, tp.worst_deep);
        CHECK(tp.fails == 0, "fast %s: %d shallow taps over the bound", md, tp.fails);
        taps_free(&tp);
        for (c = 0; c < 3; c++) {
            int chunk = chunks[c] < prompt ? chunks[c] : prompt, same = 1;
            k = open_runner(&r, 1, 1, bf16, ctx, chunk, 0) && run_seq(&r, ids, prompt, chunk, steps, got);
            close_runner(&r);
            CHECK(k, "cuda fast run");
            if (!k) continue;
            for (k = 0; k < rows; k++) same &= g4_argmax(got + (size_t)k * g_V, g_V) == g4_argmax(ref + (size_t)k * g_V, g_V);
            printf("  fast %s, chunks of %d: logits %.3g of max|logit| from the exact mode's, argmax %s\n", md, chunk,
                   rel_diff(got, ref, (size_t)rows * g_V), same ? "equal" : "differs");
            for (k = 0; k < rows * g_V; k++)
                if (!(got[k] == got[k])) { CHECK(0, "a NaN in the fast logits"); break; }
        }
    }
    free(ids); free(ref); free(got);
}

/* ---------------------------------------------------------------- long */
/* Fills `positions` in chunks of 512 and decodes 3 steps. With exact = 1 the
   exact mode runs too and each decode step's owner-layer taps (the sliding
   rings wrapped, the full layers over every key) are compared with the fast
   mode's (FAST_TAP_TOL of each tap's max, layers before the first reader);
   without, the fast mode alone: finite logits, the rings wrapped. */
static void test_long(int positions, int exact) {
    const int steps = 3, rows = steps + 1, chunk = 512;
    int32_t *ids = make_ids(positions);
    float *a = (float *)malloc(sizeof(float) * (size_t)rows * g_V), *b = (float *)malloc(sizeof(float) * (size_t)rows * g_V);
    runner r;
    double t0;
    int k, mode, first_reader = g_m.config.num_hidden_layers, ok;
    static taps tp;
    for (k = 0; k < g_m.config.num_hidden_layers; k++)
        if (g_m.plan.layer[k].reads >= 0) { first_reader = k; break; }
    memset(&tp, 0, sizeof tp);
    tp.tol = FAST_TAP_TOL;
    tp.deep_from = first_reader;
    for (mode = exact ? 0 : 1; mode <= 1; mode++) {
        float *out = mode ? b : a;
        t0 = now_s();
        ok = open_runner(&r, 1, mode, 0, positions + steps + 1, chunk, 0) && run_seq(&r, ids, positions, chunk, 0, out);
        if (ok && exact) { r.g.cfg.tap = tap_fn; r.g.cfg.tap_user = &tp; tp.recording = mode == 0; tp.checked = 0; }
        for (k = 0; ok && k < steps; k++) {
            int32_t next = g4_argmax(out + (size_t)k * g_V, g_V);
            ok = fwd(&r, &next, 1, out + (size_t)(k + 1) * g_V) == G4_OK;
        }
        CHECK(ok, "%s run: %s", mode ? "fast" : "exact", r.error);
        printf("  %s: %d positions in chunks of %d + %d decode steps in %.1f s", mode ? "fast" : "exact", positions, chunk,
               steps, now_s() - t0);
        for (k = 0; ok && k < r.g.n_slots; k++)
            if (r.g.slots[k].capacity < positions) {
                printf("; slot %d is a ring of %d rows holding positions %d..%d", k, r.g.slots[k].capacity,
                       r.g.slots[k].oldest, r.g.slots[k].n_pos - 1);
                CHECK(r.g.slots[k].oldest > 0, "the ring did not wrap");
                break;
            }
        printf("\n");
        close_runner(&r);
        for (k = 0; k < rows * g_V; k++)
            if (!(out[k] == out[k])) { CHECK(0, "a NaN in the logits"); break; }
    }
    if (exact) {
        printf("  fast vs exact, decode steps at positions %d..%d, layers 0..%d (before the first reader): within %.3g "
               "of each tap's max (bound %.0e); logits %.3g of max|logit|\n", positions, positions + steps - 1,
               first_reader - 1, tp.worst, tp.tol, rel_diff(b + g_V, a + g_V, (size_t)steps * g_V));
        CHECK(tp.fails == 0 && tp.seen > 0, "fast vs exact taps: %d over, %d compared", tp.fails, tp.seen);
    }
    taps_free(&tp);
    free(ids); free(a); free(b);
}

/* ---------------------------------------------------------------- attn */
static void test_attn(int N) {
    const g4_layer_plan *lp = NULL;
    int G, D, i, j, sp[3] = {1, 16, 256};
    uint64_t rng = 88172645463325252ull;
    float *q, *k, *v, *ex, *scores, *out;
    double *ref, *p, sigma, e_ex = 0, mx = 0, e_fast[3];
    char err[G4_ERROR_MAX];
    for (i = 0; i < g_m.plan.n_layers && !lp; i++)
        if (g_m.plan.layer[i].type == G4_FULL && g_m.plan.layer[i].reads < 0) lp = &g_m.plan.layer[i];
    if (!lp) { CHECK(0, "no full-attention owner layer"); return; }
    G = g_m.config.num_attention_heads / lp->kv_heads;
    D = lp->head_dim;
    if (G > 8) G = 8;
    sigma = sqrt(5.0 / sqrt((double)D)); /* scores of standard deviation 5 */
    q = (float *)malloc(sizeof(float) * (size_t)G * D);
    k = (float *)malloc(sizeof(float) * (size_t)N * D);
    v = (float *)malloc(sizeof(float) * (size_t)N * D);
    ex = (float *)malloc(sizeof(float) * (size_t)G * D);
    out = (float *)malloc(sizeof(float) * (size_t)G * D);
    scores = (float *)malloc(sizeof(float) * (size_t)G * N);
    ref = (double *)calloc((size_t)G * D, sizeof(double));
    p = (double *)malloc(sizeof(double) * (size_t)N);
    attention_case(&rng, G, N, D, sigma, q, k, v, p, ref, ex, scores);
    for (i = 0; i < G * D; i++) {
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        if (fabs(ex[i] - ref[i]) > e_ex) e_ex = fabs(ex[i] - ref[i]);
    }
    e_ex /= mx;
    for (j = 0; j < 3; j++) {
        double w = 0;
        if (g4__cuda_fast_attention_testing(out, q, k, v, N, G, D, sp[j], err) != G4_OK) {
            CHECK(0, "fast attention: %s", err);
            e_fast[j] = INFINITY;
            continue;
        }
        for (i = 0; i < G * D; i++)
            if (fabs(out[i] - ref[i]) > w) w = fabs(out[i] - ref[i]);
        e_fast[j] = w / mx;
    }
    printf("  %d keys, head dim %d, %d query heads: max|out - float64| / max|float64|: exact order %.2e; fast, 1 split "
           "%.2e, 16 splits %.2e, 256 splits %.2e\n", N, D, G, e_ex, e_fast[0], e_fast[1], e_fast[2]);
    CHECK(e_fast[0] <= e_ex, "1 split: %.3g from float64, the exact order %.3g", e_fast[0], e_ex);
    for (j = 1; j < 3; j++)
        CHECK(e_fast[j] <= FAST_ATT_TOL, "%d splits: %.3g from float64 (bound %.1g)", sp[j], e_fast[j], FAST_ATT_TOL);
    free(q); free(k); free(v); free(ex); free(out); free(scores); free(ref); free(p);
}

/* ---------------------------------------------------------------- limits */
static void test_limits(void) {
    g4_session_config sc = g4_session_config_init();
    size_t db = 0, hb = 0;
    char err[G4_ERROR_MAX];
    void *p = NULL;
    g4_result res;
    int fit = g_m.config.max_position_embeddings;
    sc.max_context = fit;
    sc.max_chunk = 512;
    /* the largest legal context fits the size computation; whether its arena
       fits the card is the caller's cudaMalloc's answer, reported cleanly */
    res = g4_cuda_session_size(&g_cm, &sc, NULL, &db, &hb);
    CHECK(res == G4_OK, "size at max_position_embeddings %d: %s", fit, g_cm.error);
    printf("  max_context %d: device arena %.2f GB\n", fit, db / 1e9);
    sc.max_context = fit + 1;
    res = g4_cuda_session_size(&g_cm, &sc, NULL, &db, &hb);
    printf("  max_context %d: %s\n", fit + 1, res == G4_OK ? "accepted" : g_cm.error);
    CHECK(res == G4_OK, "max_context %d, past max_position_embeddings, must be accepted as on the CPU (docs/cuda.md): %s",
          fit + 1, g_cm.error);
    sc.max_context = fit;
    sc.max_chunk = 1 << 20; /* a chunk this large blows the scratch past the card */
    res = g4_cuda_session_size(&g_cm, &sc, NULL, &db, &hb);
    printf("  max_chunk %d: %s, device arena %.1f GB\n", sc.max_chunk, res == G4_OK ? "sized" : g_cm.error, db / 1e9);
    if (res == G4_OK) {
        res = g4_cuda_malloc(&p, db, err);
        printf("  its cudaMalloc: %s\n", res == G4_OK ? "succeeded" : err);
        CHECK(res != G4_OK && strlen(err) > 0, "a %.1f GB arena must fail cleanly on an 80 GB card", db / 1e9);
        if (res == G4_OK) g4_cuda_free(p);
    }
    /* after the failed allocation the device still works */
    {
        runner r;
        int32_t ids[3] = {2, 5, 7};
        float *lg = (float *)malloc(sizeof(float) * (size_t)g_V);
        CHECK(open_runner(&r, 1, 1, 0, 16, 4, 0) && fwd(&r, ids, 3, lg) == G4_OK, "a session after the failed allocation");
        close_runner(&r);
        free(lg);
    }
}

/* ---------------------------------------------------------------- threads */
typedef struct { const int32_t *ids; int n, fast, ok; float *out; } job;

static void *run_job(void *p) {
    job *j = (job *)p;
    runner r;
    j->ok = open_runner(&r, 1, j->fast, 0, j->n + 4, 64, 0) && run_seq(&r, j->ids, j->n, 64, 3, j->out);
    close_runner(&r);
    return NULL;
}

static void test_threads(void) {
    int n = 200, k;
    int32_t *ids = make_ids(n), *ids2 = make_ids(n + 1);
    job j[4];
    pthread_t t[2];
    for (k = 0; k < 4; k++) {
        j[k].ids = k % 2 ? ids2 + 1 : ids;
        j[k].n = n;
        j[k].fast = k % 2;
        j[k].out = (float *)malloc(sizeof(float) * 4 * (size_t)g_V);
    }
    run_job(&j[2]); /* alone: exact on ids, fast on ids2 */
    run_job(&j[3]);
    CHECK(pthread_create(&t[0], NULL, run_job, &j[0]) == 0 && pthread_create(&t[1], NULL, run_job, &j[1]) == 0,
          "threads");
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    CHECK(j[0].ok && j[1].ok && j[2].ok && j[3].ok, "runs");
    CHECK(memcmp(j[0].out, j[2].out, sizeof(float) * 4 * (size_t)g_V) == 0, "exact session beside a fast one != alone");
    CHECK(memcmp(j[1].out, j[3].out, sizeof(float) * 4 * (size_t)g_V) == 0, "fast session beside an exact one != alone");
    printf("  two sessions (exact, fast) from two threads at once = each alone: %s\n",
           memcmp(j[0].out, j[2].out, sizeof(float) * 4 * (size_t)g_V) == 0 &&
                   memcmp(j[1].out, j[3].out, sizeof(float) * 4 * (size_t)g_V) == 0
               ? "bit for bit"
               : "NO");
    for (k = 0; k < 4; k++) free(j[k].out);
    free(ids);
    free(ids2);
}

int main(int argc, char **argv) {
    char desc[256], err[G4_ERROR_MAX];
    const char *what = argc > 2 ? argv[1] : "";
    int n = argc > 3 ? atoi(argv[3]) : 0;
    (void)g_tmp; /* fixtures.h's; no temporary files here */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) { printf("usage: cuda_real cpu|long|longfast|limits|threads|attn DIR [N]\n"); return 2; }
    if (g4_cuda_device_check(desc, sizeof desc, err) != G4_OK) {
        printf("no CUDA device: %s\n", err);
        return h_no_gpu();
    }
    printf("device: %s\n", desc);
    if (!load(argv[2])) return 1;
    begin("real shapes (%s): %s %s", argv[2], what, argc > 3 ? argv[3] : "");
    if (strcmp(what, "cpu") == 0) test_cpu(n > 0 ? n : 80);
    else if (strcmp(what, "long") == 0) test_long(n > 0 ? n : 16384, 1);
    else if (strcmp(what, "longfast") == 0) test_long(n > 0 ? n : 102400, 0);
    else if (strcmp(what, "limits") == 0) test_limits();
    else if (strcmp(what, "threads") == 0) test_threads();
    else if (strcmp(what, "attn") == 0) test_attn(n > 0 ? n : 16384);
    else CHECK(0, "unknown test %s", what);
    end();
    g4_cuda_model_free(&g_cm);
    g4_model_free(&g_m);
    return finish();
}
