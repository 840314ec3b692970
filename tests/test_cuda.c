/* Tests of the CUDA path (gemma4_cuda.cu): the same goldens and shared-KV
   invariants as tests/test_gemma4.c, run through the CUDA kernels.

   Built twice from this one file:
     make test-cuda-emu  gemma4_cuda.cu compiled as host C++ against
                         tests/cuda_emu.h (no GPU, no nvcc: g++ alone);
     make test-cuda      gemma4_cuda.cu compiled by nvcc, on a real GPU
                         (says so and runs nothing when there is none).

   Tolerances, and why:
     vs transformers: max |cuda - ref| <= 2e-5 * max |ref|, logits and every
       tap, exactly the CPU suite's bound (see tests/test_gemma4.c).
     vs the CPU path, layer by layer (every tap and the logits):
       emulated:   bit for bit (0). The kernels sum in the CPU's order
                   without FMA contraction and use the same libm; the one
                   different order, RMSNorm's sum of squares (a tree in double
                   instead of a loop in double), would need a double rounding
                   difference to cross a float rounding boundary (about 2^-29
                   per norm). Exactness is what catches a summation order
                   that drifted from the CPU's.
       real GPU:   2e-5 * max |cpu|, as vs transformers: the device's expf,
                   tanhf, sinf, cosf differ from glibc by a few ulp, which
                   these random models amplify about 2x per layer.
     chunked prefill = decode = one-shot, reader copies, NaN stale reader
       weights, plain = tiled matmul, sessions/reset: exact (0). Every kernel
       is row-wise and its reduction order depends only on the block size. */
#define _POSIX_C_SOURCE 200809L
/* The CPU side is the scalar reference, one thread: the order the kernels
   mirror (SIMD or threaded CPU kernels, where the header has them, sum in
   other orders). Both macros are harmless where the header has neither. */
#define G4_NO_SIMD
#define G4_NO_THREADS
#define GEMMA4_CUDA
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef G4_CUDA_EMULATE
extern void g4emu_fail_after(long n);
extern long g4emu_launches(const char *kernel);
#define CPU_TOL 0.0
#define CPU_TOL_BF16 0.0
#else
#define CPU_TOL 2e-5
#define CPU_TOL_BF16 3e-2 /* a device tanhf/expf ulp can move a bf16 rounding: one bf16 ulp is 3.9e-3 */
#endif
#define TOL 2e-5

#include "harness.h" /* g_only: argv[2], run only tests whose name contains it */
static double g_worst_golden, g_worst_cpu; /* over all models, relative */


#include "fixtures.h"

/* A loaded model, uploaded, with one CUDA session. */
typedef struct {
    g4_model m;
    g4_cuda_model cm;
    g4_cuda_session s;
    void *darena, *harena;
    size_t dbytes, hbytes;
} cctx;

static int cctx_open(cctx *c, const char *dir, int max_context, int chunk, int reader_copies) {
    g4_session_config sc = g4_session_config_init();
    char err[G4_ERROR_MAX];
    memset(c, 0, sizeof *c);
    if (g4_model_load(&c->m, dir) != G4_OK) { printf("  load %s: %s\n", dir, c->m.error); return 0; }
    if (g4_cuda_model_upload(&c->cm, &c->m) != G4_OK) { printf("  upload: %s\n", c->cm.error); return 0; }
    sc.max_context = max_context;
    sc.max_chunk = chunk;
    sc.reader_copies = reader_copies;
    if (g4_cuda_session_size(&c->cm, &sc, &c->dbytes, &c->hbytes) != G4_OK) return 0;
    if (g4_cuda_malloc(&c->darena, c->dbytes, err) != G4_OK) { printf("  %s\n", err); return 0; }
    c->harena = malloc(c->hbytes);
    if (g4_cuda_session_init(&c->s, &c->cm, &sc, c->darena, c->dbytes, c->harena, c->hbytes) != G4_OK) {
        printf("  session: %s\n", c->s.error);
        return 0;
    }
    return 1;
}

static void cctx_free(cctx *c) {
    g4_cuda_free(c->darena);
    free(c->harena);
    g4_cuda_model_free(&c->cm);
    g4_model_free(&c->m);
}

/* All logits [n][V] of ids through a fresh CUDA session, `step` tokens per
   g4_cuda_forward call (0 = all at once). */
static float *cuda_logits(const char *dir, const int32_t *ids, int n, int chunk, int step, int reader_copies,
                          int matmul) {
    cctx c;
    float *out;
    int done;
    if (!cctx_open(&c, dir, n, chunk, reader_copies)) { cctx_free(&c); return NULL; }
    c.s.matmul = matmul;
    out = (float *)malloc(sizeof(float) * (size_t)n * c.m.config.vocab_size);
    for (done = 0; done < n;) {
        int k = step ? (n - done < step ? n - done : step) : n;
        if (g4_cuda_forward(&c.s, ids + done, k, out + (size_t)done * c.m.config.vocab_size, G4_LOGITS_ALL) != G4_OK) {
            printf("  forward: %s\n", c.s.error);
            free(out);
            cctx_free(&c);
            return NULL;
        }
        done += k;
    }
    cctx_free(&c);
    return out;
}

/* ------------------------------------------- taps: record CPU, compare CUDA */

/* every tap of a CPU run, in order (grown as needed) */
typedef struct {
    int n, cap;
    char (*name)[96];
    float **data;
    size_t *cnt;
} tap_record;

static void record_tap(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    tap_record *r = (tap_record *)user;
    size_t cnt = (size_t)rows * cols;
    (void)layer;
    (void)pos0;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->name = (char(*)[96])realloc(r->name, sizeof *r->name * (size_t)r->cap);
        r->data = (float **)realloc(r->data, sizeof *r->data * (size_t)r->cap);
        r->cnt = (size_t *)realloc(r->cnt, sizeof *r->cnt * (size_t)r->cap);
    }
    snprintf(r->name[r->n], sizeof r->name[0], "%s", name);
    r->data[r->n] = (float *)malloc(sizeof(float) * cnt);
    memcpy(r->data[r->n], data, sizeof(float) * cnt);
    r->cnt[r->n++] = cnt;
}

static void record_free(tap_record *r) {
    int i;
    for (i = 0; i < r->n; i++) free(r->data[i]);
    free(r->name);
    free(r->data);
    free(r->cnt);
}

typedef struct {
    golden *g;                       /* NULL: compare with the CPU run only */
    tap_record *cpu;
    int fails, seen, seen_cpu, taps; /* taps: every CUDA tap; seen_cpu: those the CPU run also had */
    double worst, worst_cpu;
} tap_check;

static void compare_tap(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    tap_check *tc = (tap_check *)user;
    char key[64];
    int64_t numel;
    const float *ref;
    size_t cnt = (size_t)rows * cols;
    int i;
    (void)layer;
    tc->taps++;
    /* (b) the CPU path, the same tap */
    for (i = 0; i < tc->cpu->n; i++)
        if (strcmp(tc->cpu->name[i], name) == 0) {
            double d = tc->cpu->cnt[i] == cnt ? max_diff(data, tc->cpu->data[i], cnt) : INFINITY;
            double rel = d / max_abs(tc->cpu->data[i], cnt);
            if (!(rel <= CPU_TOL)) {
                printf("  %s: CUDA vs CPU max diff %.3g (%.3g relative)\n", name, d, rel);
                tc->fails++;
            }
            if (rel > tc->worst_cpu) tc->worst_cpu = rel;
            tc->seen_cpu++;
            break;
        }
    /* (a) transformers */
    if (!tc->g) return;
    if (strncmp(name, "layers.", 7) == 0 && !strchr(name + 7, '.')) snprintf(key, sizeof key, "layer.%s", name + 7);
    else if (strcmp(name, "embed") == 0 || strcmp(name, "embed_tokens") == 0) snprintf(key, sizeof key, "embed");
    else if (strcmp(name, "per_layer_inputs") == 0) snprintf(key, sizeof key, "%s", name);
    else if (strcmp(name, "norm") == 0) snprintf(key, sizeof key, "final_norm");
    else return;
    ref = golden_f32(tc->g, key, &numel);
    if (!ref) { printf("  golden has no '%s'\n", key); tc->fails++; return; }
    {
        size_t off = (size_t)pos0 * cols;
        double d = off + cnt <= (size_t)numel ? max_diff(data, ref + off, cnt) : INFINITY;
        double rel = d / max_abs(ref, (size_t)numel);
        if (!(rel <= TOL)) {
            printf("  %s: CUDA vs transformers max diff %.3g (%.3g relative)\n", key, d, rel);
            tc->fails++;
        }
        if (rel > tc->worst) tc->worst = rel;
        tc->seen++;
    }
}

/* ----------------------------------------------- goldens, layer by layer */

/* The CPU path on `model` (float32 or the bf16 mode) over n ids: every tap
   recorded in *rec, all logits in r->logits (cpu_run_free frees both). */
typedef struct {
    g4_model m;
    void *arena;
    float *logits;
} cpu_run;

static int cpu_record(cpu_run *r, const char *model, int bf16, const int32_t *ids, int n, tap_record *rec) {
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    size_t bytes;
    memset(rec, 0, sizeof *rec);
    r->arena = NULL;
    r->logits = NULL;
    if (g4_model_load(&r->m, tiny(model)) != G4_OK) { CHECK(0, "load: %s", r->m.error); return 0; }
    sc.max_context = n;
    sc.bf16 = bf16;
    sc.tap = record_tap;
    sc.tap_user = rec;
    g4_session_size(&r->m, &sc, &bytes);
    r->arena = malloc(bytes);
    r->logits = (float *)malloc(sizeof(float) * (size_t)n * r->m.config.vocab_size);
    CHECK(g4_session_init(&s, &r->m, &sc, r->arena, bytes) == G4_OK && g4_forward(&s, ids, n, r->logits, G4_LOGITS_ALL) == G4_OK,
          "cpu forward: %s", s.error);
    return 1;
}

static void cpu_run_free(cpu_run *r, tap_record *rec) {
    record_free(rec);
    free(r->logits);
    free(r->arena);
    g4_model_free(&r->m);
}

static void check_golden(const char *model, int matmul) {
    golden g;
    cctx c;
    cpu_run cpu;
    int n, V;
    int64_t numel;
    const int32_t *ids;
    const float *ref;
    float *out, *cpu_out;
    tap_record rec;
    tap_check tc;
    if (!golden_open(&g, model)) { CHECK(0, "no golden for %s", model); return; }
    ids = golden_ids(&g, "input_ids", &n);
    ref = golden_f32(&g, "logits", &numel);
    CHECK(ids && ref, "golden lacks input_ids/logits");
    if (!ids || !ref || !cpu_record(&cpu, model, 0, ids, n, &rec)) { g4_model_free(&g.m); return; }
    V = cpu.m.config.vocab_size;
    cpu_out = cpu.logits;
    /* the CUDA path, every tap compared with both */
    if (!cctx_open(&c, tiny(model), n, 0, 0)) {
        CHECK(0, "cuda session");
    } else {
        memset(&tc, 0, sizeof tc);
        tc.g = &g;
        tc.cpu = &rec;
        c.s.cfg.tap = compare_tap;
        c.s.cfg.tap_user = &tc;
        c.s.matmul = matmul;
        out = (float *)malloc(sizeof(float) * (size_t)n * V);
        CHECK(g4_cuda_forward(&c.s, ids, n, out, G4_LOGITS_ALL) == G4_OK, "forward: %s", c.s.error);
        {
            double d = max_diff(out, ref, (size_t)n * V), scale = max_abs(ref, (size_t)n * V);
            double dc = max_diff(out, cpu_out, (size_t)n * V), sc2 = max_abs(cpu_out, (size_t)n * V);
            printf("  %s (%s matmul): logits vs transformers %.3g relative, vs CPU %.3g; worst tap vs transformers "
                   "%.3g, vs CPU %.3g\n", model, matmul == G4_CUDA_MATMUL_PLAIN ? "plain" : "tiled", d / scale,
                   dc / sc2, tc.worst, tc.worst_cpu);
            CHECK(d <= TOL * scale, "logits differ from transformers: %.3g > %.3g", d, TOL * scale);
            CHECK(dc <= CPU_TOL * sc2, "logits differ from the CPU path: %.3g > %.3g", dc, CPU_TOL * sc2);
            if (d / scale > g_worst_golden) g_worst_golden = d / scale;
            if (dc / sc2 > g_worst_cpu) g_worst_cpu = dc / sc2;
            if (tc.worst > g_worst_golden) g_worst_golden = tc.worst;
            if (tc.worst_cpu > g_worst_cpu) g_worst_cpu = tc.worst_cpu;
        }
        CHECK(tc.fails == 0, "%d taps differ", tc.fails);
        CHECK(tc.seen >= cpu.m.config.num_hidden_layers + 2, "only %d taps compared with transformers", tc.seen);
        CHECK(tc.seen_cpu == tc.taps && tc.taps >= cpu.m.config.num_hidden_layers + 3,
              "only %d of the %d CUDA taps have a CPU tap of the same name", tc.seen_cpu, tc.taps);
        CHECK(tc.taps == rec.n, "the CUDA path emits %d taps, the CPU path %d: the tap sets must be the same", tc.taps,
              rec.n);
        free(out);
    }
    cctx_free(&c);
    cpu_run_free(&cpu, &rec);
    g4_model_free(&g.m);
}

/* The bf16-faithful mode: every tap and the logits equal the CPU's bf16 mode
   (the scalar CPU path, whose bf16 mode matches transformers-bf16: see the
   core suite), and differ from float32 (the mode is on). */
static void check_bf16(const char *model) {
    golden g;
    cctx c;
    cpu_run cpu;
    int n, V;
    const int32_t *ids;
    float *out, *cpu_out, *f32_out;
    tap_record rec;
    tap_check tc;
    if (!golden_open(&g, model)) { CHECK(0, "no golden for %s", model); return; }
    ids = golden_ids(&g, "input_ids", &n);
    if (!ids || !cpu_record(&cpu, model, 1, ids, n, &rec)) { CHECK(ids != NULL, "golden lacks input_ids"); g4_model_free(&g.m); return; }
    V = cpu.m.config.vocab_size;
    cpu_out = cpu.logits;
    f32_out = (float *)malloc(sizeof(float) * (size_t)n * V);
    out = (float *)malloc(sizeof(float) * (size_t)n * V);
    if (!cctx_open(&c, tiny(model), n, 0, 0)) {
        CHECK(0, "cuda session");
    } else {
        CHECK(g4_cuda_forward(&c.s, ids, n, f32_out, G4_LOGITS_ALL) == G4_OK, "f32 forward: %s", c.s.error);
        g4_cuda_session_reset(&c.s);
        memset(&tc, 0, sizeof tc);
        tc.cpu = &rec;
        c.s.cfg.bf16 = 1;
        c.s.cfg.tap = compare_tap;
        c.s.cfg.tap_user = &tc;
        CHECK(g4_cuda_forward(&c.s, ids, n, out, G4_LOGITS_ALL) == G4_OK, "bf16 forward: %s", c.s.error);
        {
            double dc = max_diff(out, cpu_out, (size_t)n * V), s2 = max_abs(cpu_out, (size_t)n * V);
            double df = max_diff(out, f32_out, (size_t)n * V);
            printf("  %s bf16 mode: logits vs the CPU's bf16 mode %.3g relative, worst tap %.3g; vs float32 %.3g\n",
                   model, dc / s2, tc.worst_cpu, df / s2);
            CHECK(dc <= CPU_TOL_BF16 * s2, "bf16 logits differ from the CPU's: %.3g", dc / s2);
            CHECK(df > 1e-3 * s2, "bf16 logits are float32's: the mode is not on");
        }
        CHECK(tc.fails == 0, "%d taps differ", tc.fails);
        CHECK(tc.seen_cpu == tc.taps && tc.taps == rec.n, "tap sets: CUDA %d, matched %d, CPU %d", tc.taps, tc.seen_cpu, rec.n);
    }
    cctx_free(&c);
    cpu_run_free(&cpu, &rec);
    free(f32_out);
    free(out);
    g4_model_free(&g.m);
}

static void test_bf16_mode(void) {
    static const char *models[] = {"e2b_like", "e4b_like", "31b_like", "26b_like"};
    int k;
    for (k = 0; k < 4; k++) check_bf16(models[k]);
}

static void test_golden_e2b_like(void) { check_golden("e2b_like", G4_CUDA_MATMUL_TILED); }
static void test_golden_e4b_like(void) { check_golden("e4b_like", G4_CUDA_MATMUL_TILED); }
static void test_golden_31b_like(void) { check_golden("31b_like", G4_CUDA_MATMUL_TILED); }
static void test_golden_26b_like(void) { check_golden("26b_like", G4_CUDA_MATMUL_TILED); }
static void test_golden_plain(void) { check_golden("plain", G4_CUDA_MATMUL_TILED); }
static void test_golden_legacy_keys(void) { check_golden("legacy_keys", G4_CUDA_MATMUL_TILED); }
static void test_golden_plain_matmul(void) {
    check_golden("e2b_like", G4_CUDA_MATMUL_PLAIN);
    check_golden("26b_like", G4_CUDA_MATMUL_PLAIN);
    check_golden("legacy_keys", G4_CUDA_MATMUL_PLAIN);
}

/* the tiled matmul equals the plain one bit for bit (same summation order) */
static void test_tiled_equals_plain(void) {
    static const char *models[] = {"e2b_like", "31b_like", "26b_like", "plain"};
    int k;
    for (k = 0; k < 4; k++) {
        golden g;
        int n;
        const int32_t *ids;
        float *a, *b;
        if (!golden_open(&g, models[k])) { CHECK(0, "no golden"); continue; }
        ids = golden_ids(&g, "input_ids", &n);
        a = ids ? cuda_logits(tiny(models[k]), ids, n, 64, 0, 0, G4_CUDA_MATMUL_TILED) : NULL;
        b = ids ? cuda_logits(tiny(models[k]), ids, n, 64, 0, 0, G4_CUDA_MATMUL_PLAIN) : NULL;
        CHECK(a && b && max_diff(a, b, (size_t)n * 512) == 0.0, "%s: tiled and plain matmul differ", models[k]);
        free(a);
        free(b);
        g4_model_free(&g.m);
    }
}

/* greedy decode through the CUDA path, one token per call, = generate */
static void check_greedy(const char *model) {
    golden g;
    cctx c;
    int n, i, prompt = 6;
    int64_t numel;
    const int32_t *want;
    const float *step_ref;
    float *logits;
    if (!golden_open(&g, model)) { CHECK(0, "no golden"); return; }
    want = golden_ids(&g, "greedy_ids", &n);
    CHECK(want && n > prompt, "golden lacks greedy_ids");
    if (!want || n <= prompt || !cctx_open(&c, tiny(model), n, 0, 0)) { g4_model_free(&g.m); return; }
    logits = (float *)malloc(sizeof(float) * c.m.config.vocab_size);
    step_ref = golden_f32(&g, "greedy_logits", &numel);
    CHECK(step_ref && numel == (int64_t)(n - prompt) * c.m.config.vocab_size, "golden lacks greedy_logits");
    CHECK(g4_cuda_forward(&c.s, want, prompt, logits, G4_LOGITS_LAST) == G4_OK, "prefill: %s", c.s.error);
    for (i = prompt; i < n; i++) {
        int32_t next = g4_argmax(logits, c.m.config.vocab_size);
        if (step_ref) {
            const float *r = step_ref + (size_t)(i - prompt) * c.m.config.vocab_size;
            double d = max_diff(logits, r, (size_t)c.m.config.vocab_size), sc = max_abs(r, (size_t)c.m.config.vocab_size);
            CHECK(d <= TOL * sc, "%s step %d: decode logits differ by %.3g (%.3g relative)", model, i - prompt, d, d / sc);
        }
        CHECK(next == want[i], "%s token %d: got %d, transformers %d", model, i, (int)next, (int)want[i]);
        if (next != want[i]) break;
        if (i + 1 < n) CHECK(g4_cuda_forward(&c.s, &next, 1, logits, G4_LOGITS_LAST) == G4_OK, "decode: %s", c.s.error);
    }
    free(logits);
    cctx_free(&c);
    g4_model_free(&g.m);
}

static void test_greedy_matches_generate(void) {
    check_greedy("e2b_like");
    check_greedy("e4b_like");
    check_greedy("31b_like");
    check_greedy("26b_like");
    check_greedy("plain");
}

/* --------------------------------------- one code path: chunks and decode */

static void check_chunking(const char *model) {
    golden g;
    int n, k;
    const int32_t *ids;
    float *ref;
    static const int plans[][2] = {{1, 1}, {3, 0}, {3, 5}, {13, 0}, {64, 7}, {2, 2}};
    if (!golden_open(&g, model)) { CHECK(0, "no golden"); return; }
    ids = golden_ids(&g, "input_ids", &n);
    if (!ids) { CHECK(0, "golden lacks input_ids"); g4_model_free(&g.m); return; }
    CHECK(n > 8, "sequence (%d) must exceed the window (8)", n);
    ref = cuda_logits(tiny(model), ids, n, 64, 0, 0, G4_CUDA_MATMUL_TILED);
    CHECK(ref != NULL, "one-shot run");
    for (k = 0; ref && k < (int)(sizeof plans / sizeof plans[0]); k++) {
        float *out = cuda_logits(tiny(model), ids, n, plans[k][0], plans[k][1], 0, G4_CUDA_MATMUL_TILED);
        CHECK(out && max_diff(out, ref, (size_t)n * 512) == 0.0, "%s: max_chunk %d, %d per call: differs from one-shot",
              model, plans[k][0], plans[k][1]);
        free(out);
    }
    free(ref);
    g4_model_free(&g.m);
}

static void test_chunked_e2b(void) { check_chunking("e2b_like"); }
static void test_chunked_moe(void) { check_chunking("26b_like"); }
static void test_chunked_31b(void) { check_chunking("31b_like"); }

/* ----------------------------------------------- shared-KV table invariants */

static void test_reader_copies_same_logits(void) {
    golden g;
    int n;
    const int32_t *ids;
    float *a, *b;
    if (!golden_open(&g, "e2b_like")) { CHECK(0, "no golden"); return; }
    ids = golden_ids(&g, "input_ids", &n);
    a = ids ? cuda_logits(tiny("e2b_like"), ids, n, 5, 0, 0, G4_CUDA_MATMUL_TILED) : NULL;
    b = ids ? cuda_logits(tiny("e2b_like"), ids, n, 5, 0, 1, G4_CUDA_MATMUL_TILED) : NULL;
    CHECK(a && b && max_diff(a, b, (size_t)n * 512) == 0.0, "owners-only table and per-reader copies differ");
    free(a);
    free(b);
    g4_model_free(&g.m);
}

/* The table on the device: one slot per owner, readers share their owner's
   slot, capacities as on the CPU, the device's copy agrees with the host's,
   and after each step every slot holds exactly the positions consumed. */
static void test_table_on_device(void) {
    cctx c, d;
    g4_kv_slot dev[2 * G4_MAX_LAYERS];
    int32_t ids[7] = {2, 81, 101, 77, 5, 9, 300};
    float logits[512];
    int i, readers = 0, step;
    if (!cctx_open(&c, tiny("e2b_like"), 32, 4, 0) || !cctx_open(&d, tiny("e2b_like"), 32, 4, 1)) {
        CHECK(0, "open");
        return;
    }
    CHECK(c.s.n_slots == c.m.plan.first_shared, "slots %d != owners %d", c.s.n_slots, c.m.plan.first_shared);
    for (i = 0; i < c.m.plan.n_layers; i++) {
        const g4_layer_plan *lp = &c.m.plan.layer[i];
        if (lp->reads >= 0) {
            readers++;
            CHECK(c.s.layer_slot[i] == c.s.layer_slot[lp->reads], "reader %d does not share slot of %d", i, lp->reads);
            CHECK(d.s.layer_slot[i] != d.s.layer_slot[lp->reads] && d.s.slots[d.s.layer_slot[i]].writer == i,
                  "reader_copies: reader %d must have its own slot", i);
        } else {
            CHECK(c.s.slots[c.s.layer_slot[i]].writer == i, "slot of owner %d has writer %d", i,
                  c.s.slots[c.s.layer_slot[i]].writer);
        }
    }
    CHECK(readers == 4, "e2b_like has 4 readers, plan says %d", readers);
    CHECK(d.s.n_slots == c.s.n_slots + readers, "debug copies: %d slots", d.s.n_slots);
    CHECK(d.dbytes > c.dbytes, "reader copies must need more device arena (%lu vs %lu)", (unsigned long)d.dbytes,
          (unsigned long)c.dbytes);
    CHECK(c.s.slots[0].capacity == 8 - 1 + 4, "sliding capacity %d", c.s.slots[0].capacity);
    CHECK(c.s.slots[4].capacity == 32, "full capacity %d", c.s.slots[4].capacity);
    for (step = 0; step < 3; step++) {
        int k = step == 0 ? 5 : 1, pos = c.s.pos;
        CHECK(g4_cuda_forward(&c.s, ids + (step ? 4 + step : 0), k, logits, G4_LOGITS_LAST) == G4_OK, "%s", c.s.error);
        CHECK(g4_cuda_session_table(&c.s, dev, 2 * G4_MAX_LAYERS) == G4_OK, "read table: %s", c.s.error);
        for (i = 0; i < c.s.n_slots; i++) {
            const g4_kv_slot *h = &c.s.slots[i], *v = &dev[i];
            CHECK(v->writer == h->writer && v->capacity == h->capacity && v->k == h->k && v->v == h->v &&
                      v->head_dim == h->head_dim && v->kv_heads == h->kv_heads,
                  "slot %d: the device's table differs from the host's", i);
            CHECK(v->n_pos == pos + k && h->n_pos == pos + k, "slot %d holds %d (device) / %d (host), want %d", i,
                  v->n_pos, h->n_pos, pos + k);
        }
    }
    CHECK(g4_cuda_session_reset(&c.s) == G4_OK && g4_cuda_session_table(&c.s, dev, 2 * G4_MAX_LAYERS) == G4_OK &&
              dev[0].n_pos == 0 && c.s.pos == 0,
          "reset must empty the device's table");
    cctx_free(&c);
    cctx_free(&d);
}

/* Write once, then read, checked on both sides: a host table that says a
   slot was already written is refused before any kernel runs, and a reader
   pointed at a slot of another shape is caught by the attention kernel from
   the DEVICE's table (the host's n_pos check passes); so is a sliding ring
   too short for the window. */
static void test_table_checks(void) {
    cctx c;
    int32_t ids[3] = {2, 81, 101};
    float logits[512];
    if (!cctx_open(&c, tiny("e2b_like"), 16, 4, 0)) { CHECK(0, "open"); return; }
    CHECK(c.s.slots[2].writer == 2, "slot 2 is layer 2's");
    c.s.slots[2].n_pos = 5; /* owner 2's slot claims positions it never wrote */
    CHECK(g4_cuda_forward(&c.s, ids, 3, logits, G4_LOGITS_LAST) == G4_ERR_INPUT && strstr(c.s.error, "out of order"),
          "host check: %s", c.s.error);
    CHECK(g4_cuda_session_reset(&c.s) == G4_OK, "reset");
    {   /* a sliding reader (head_dim 16) pointed at the full owner's slot (32) */
        int i, reader = -1, full_slot = -1;
        char want[64];
        for (i = 0; i < c.m.plan.n_layers; i++) {
            const g4_layer_plan *lp = &c.m.plan.layer[i];
            if (lp->reads >= 0 && lp->type == G4_SLIDING && reader < 0) reader = i;
            if (lp->reads < 0 && lp->type == G4_FULL) full_slot = lp->kv_slot;
        }
        CHECK(reader >= 0 && full_slot >= 0, "e2b_like has a sliding reader and a full owner");
        if (reader < 0 || full_slot < 0) { cctx_free(&c); return; }
        c.s.layer_slot[reader] = full_slot;
        snprintf(want, sizeof want, "device table check: layer %d", reader);
        c.s.error[0] = 0;
        CHECK(g4_cuda_forward(&c.s, ids, 3, logits, G4_LOGITS_LAST) == G4_ERR_INPUT && strstr(c.s.error, want),
              "device check: %s", c.s.error);
        c.s.layer_slot[reader] = c.m.plan.layer[reader].kv_slot;
    }
    {   /* invariant 7 on the device: a sliding slot whose ring is shorter than
           window - 1 + chunk (uploaded to the device by reset) loses keys the
           window still needs; the attention kernel sees it. */
        int32_t many[12] = {2, 81, 101, 77, 5, 9, 300, 4, 6, 8, 10, 12};
        CHECK(c.s.slots[0].capacity == 8 - 1 + 4, "sliding capacity %d", c.s.slots[0].capacity);
        c.s.slots[0].capacity = 6;
        CHECK(g4_cuda_session_reset(&c.s) == G4_OK, "reset");
        c.s.error[0] = 0;
        CHECK(g4_cuda_forward(&c.s, many, 12, logits, G4_LOGITS_LAST) == G4_ERR_INPUT &&
                  strstr(c.s.error, "no longer holds"),
              "ring check: %s", c.s.error);
        c.s.slots[0].capacity = 8 - 1 + 4;
        CHECK(g4_cuda_session_reset(&c.s) == G4_OK && g4_cuda_forward(&c.s, many, 12, logits, G4_LOGITS_LAST) == G4_OK,
              "the intact table runs: %s", c.s.error);
    }
    cctx_free(&c);
}

/* Minimal safetensors writer for test checkpoints. */
static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) { fputs(text, f); fclose(f); }
}


/* Invariant 8 on the device: NaN reader K/V weights change no output bit
   (they are not even uploaded). */
static void test_stale_reader_kv_weights_ignored(void) {
    golden g;
    int n, i, k = 0;
    const int32_t *ids;
    float *a, *b, *nan_kv = (float *)malloc(sizeof(float) * 32 * 64);
    st_entry extra[12];
    char names[12][96], dir[512];
    snprintf(dir, sizeof dir, "%s/stale_kv", g_tmp);
    for (i = 0; i < 32 * 64; i++) nan_kv[i] = NAN;
    for (i = 6; i < 10; i++) {
        int D = i == 9 ? 32 : 16, w;
        static const char *what[3] = {"k_proj.weight", "v_proj.weight", "k_norm.weight"};
        for (w = 0; w < 3; w++, k++) {
            snprintf(names[k], sizeof names[k], "model.layers.%d.self_attn.%s", i, what[w]);
            extra[k].name = names[k];
            extra[k].dtype = "F32";
            extra[k].ndim = w == 2 ? 1 : 2;
            extra[k].shape[0] = D;
            extra[k].shape[1] = 64;
            extra[k].data = nan_kv;
            extra[k].bytes = sizeof(float) * (size_t)D * (w == 2 ? 1 : 64);
        }
    }
    CHECK(rewrite_checkpoint("e2b_like", dir, extra, k), "write %s", dir);
    if (!golden_open(&g, "e2b_like")) { CHECK(0, "no golden"); free(nan_kv); return; }
    ids = golden_ids(&g, "input_ids", &n);
    a = ids ? cuda_logits(tiny("e2b_like"), ids, n, 64, 0, 0, G4_CUDA_MATMUL_TILED) : NULL;
    b = ids ? cuda_logits(dir, ids, n, 64, 0, 0, G4_CUDA_MATMUL_TILED) : NULL;
    CHECK(b != NULL, "checkpoint with stale reader K/V must load and run");
    CHECK(a && b && max_diff(a, b, (size_t)n * 512) == 0.0, "NaN reader K/V weights changed the output");
    free(a);
    free(b);
    free(nan_kv);
    g4_model_free(&g.m);
}

/* Two interleaved sessions on one uploaded model stay independent; reset. */
static void test_sessions_independent(void) {
    golden g;
    cctx a;
    g4_cuda_session b;
    void *bd = NULL, *bh;
    int n, i;
    const int32_t *ids;
    float *la, *lb, *ref;
    char err[G4_ERROR_MAX];
    if (!golden_open(&g, "e2b_like")) { CHECK(0, "no golden"); return; }
    ids = golden_ids(&g, "input_ids", &n);
    if (!ids) { CHECK(0, "golden lacks input_ids"); g4_model_free(&g.m); return; }
    ref = cuda_logits(tiny("e2b_like"), ids, n, 64, 0, 0, G4_CUDA_MATMUL_TILED);
    if (!cctx_open(&a, tiny("e2b_like"), n, 4, 0)) { CHECK(0, "open"); g4_model_free(&g.m); return; }
    CHECK(g4_cuda_malloc(&bd, a.dbytes, err) == G4_OK, "%s", err);
    bh = malloc(a.hbytes);
    CHECK(g4_cuda_session_init(&b, &a.cm, &a.s.cfg, bd, a.dbytes, bh, a.hbytes) == G4_OK, "init b: %s", b.error);
    la = (float *)malloc(sizeof(float) * (size_t)n * 512);
    lb = (float *)malloc(sizeof(float) * (size_t)n * 512);
    for (i = 0; i < n; i++) {
        CHECK(g4_cuda_forward(&a.s, ids + i, 1, la + (size_t)i * 512, G4_LOGITS_ALL) == G4_OK, "a");
        if (i % 2 == 1)
            CHECK(g4_cuda_forward(&b, ids + i - 1, 2, lb + (size_t)(i - 1) * 512, G4_LOGITS_ALL) == G4_OK, "b");
    }
    CHECK(ref && max_diff(la, ref, (size_t)(n - n % 2) * 512) == 0.0, "session a drifted");
    CHECK(ref && max_diff(lb, ref, (size_t)(n - n % 2) * 512) == 0.0, "session b drifted");
    CHECK(g4_cuda_session_reset(&a.s) == G4_OK && a.s.pos == 0, "reset");
    CHECK(g4_cuda_forward(&a.s, ids, n, la, G4_LOGITS_ALL) == G4_OK && ref && max_diff(la, ref, (size_t)n * 512) == 0.0,
          "a reset session must reproduce the first run");
    free(la);
    free(lb);
    free(ref);
    free(bh);
    g4_cuda_free(bd);
    cctx_free(&a);
    g4_model_free(&g.m);
}

/* ----------------------------------------------- head dims 256 and 512 */

/* A synthetic two-layer model with the released head dims (sliding 256,
   full 512 with proportional RoPE), so the attention kernels run with D far
   above the block size; CUDA must match the CPU path. No golden: the CPU
   path is the oracle here, its own goldens cover the math. */
static uint32_t g_rng = 12345;
static float frand(void) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return ((float)(g_rng >> 8) / 16777216.0f - 0.5f);
}

/* A random F32 tensor [d0, d1] (d1 0: a vector around 1, as norm weights) */
static void add_tensor(st_entry *e, float **buf, char (*names)[96], int *ne, const char *name, int d0, int d1) {
    size_t cnt = (size_t)d0 * (size_t)(d1 ? d1 : 1), i;
    st_entry *t = &e[*ne];
    snprintf(names[*ne], 96, "%s", name);
    buf[*ne] = (float *)malloc(sizeof(float) * cnt);
    for (i = 0; i < cnt; i++) buf[*ne][i] = d1 ? frand() * 0.5f : 1.0f + frand() * 0.2f;
    t->name = names[*ne];
    t->dtype = "F32";
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = buf[*ne];
    t->bytes = sizeof(float) * cnt;
    (*ne)++;
}

static void test_head_dims_256_512(void) {
    const int H = 64, V = 64, NH = 2, I = 96, L = 2;
    char dir[512], names[64][96];
    st_entry e[64];
    float *buf[64];
    int ne = 0, l, i, n = 12;
    int32_t ids[12];
    float *cpu, *gpu;
    snprintf(dir, sizeof dir, "%s/bigdims", g_tmp);
    mkdir(dir, 0755);
    write_text(path2(dir, "config.json"),
               "{\"model_type\":\"gemma4_text\",\"vocab_size\":64,\"hidden_size\":64,\"intermediate_size\":96,"
               "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":256,"
               "\"global_head_dim\":512,\"sliding_window\":4,\"final_logit_softcapping\":30.0,"
               "\"layer_types\":[\"sliding_attention\",\"full_attention\"],\"hidden_size_per_layer_input\":0,"
               "\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":10000.0},"
               "\"full_attention\":{\"rope_type\":\"proportional\",\"rope_theta\":1000000.0,"
               "\"partial_rotary_factor\":0.25}},\"tie_word_embeddings\":true}");
    add_tensor(e, buf, names, &ne, "model.embed_tokens.weight", V, H);
    add_tensor(e, buf, names, &ne, "model.norm.weight", H, 0);
    for (l = 0; l < L; l++) {
        static const char *norms[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
                                      "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"};
        int D = l == 0 ? 256 : 512, k;
        char nm[96];
        for (k = 0; k < 4; k++) {
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, norms[k]);
            add_tensor(e, buf, names, &ne, nm, H, 0);
        }
#define LADD(suffix, d0, d1) \
    do { snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix); add_tensor(e, buf, names, &ne, nm, d0, d1); } while (0)
        LADD("self_attn.q_proj.weight", NH * D, H);
        LADD("self_attn.k_proj.weight", D, H);
        LADD("self_attn.v_proj.weight", D, H);
        LADD("self_attn.o_proj.weight", H, NH * D);
        LADD("self_attn.q_norm.weight", D, 0);
        LADD("self_attn.k_norm.weight", D, 0);
        LADD("mlp.gate_proj.weight", I, H);
        LADD("mlp.up_proj.weight", I, H);
        LADD("mlp.down_proj.weight", H, I);
        LADD("layer_scalar", 1, 0);
#undef LADD
    }
    CHECK(st_write(path2(dir, "model.safetensors"), e, ne, NULL), "write");
    for (i = 0; i < n; i++) ids[i] = (i * 37 + 5) % V;
    {
        g4_model m;
        g4_session s;
        g4_session_config sc = g4_session_config_init();
        size_t bytes;
        void *arena;
        cpu = (float *)malloc(sizeof(float) * (size_t)n * V);
        CHECK(g4_model_load(&m, dir) == G4_OK, "load: %s", m.error);
        CHECK(m.plan.layer[0].head_dim == 256 && m.plan.layer[1].head_dim == 512, "head dims %d %d",
              m.plan.layer[0].head_dim, m.plan.layer[1].head_dim);
        sc.max_context = n;
        g4_session_size(&m, &sc, &bytes);
        arena = malloc(bytes);
        CHECK(g4_session_init(&s, &m, &sc, arena, bytes) == G4_OK && g4_forward(&s, ids, n, cpu, G4_LOGITS_ALL) == G4_OK,
              "cpu: %s", s.error);
        free(arena);
        g4_model_free(&m);
    }
    gpu = cuda_logits(dir, ids, n, 5, 0, 0, G4_CUDA_MATMUL_TILED);
    {
        double d = gpu ? max_diff(gpu, cpu, (size_t)n * V) : INFINITY, sc = max_abs(cpu, (size_t)n * V);
        printf("  head dims 256/512: CUDA vs CPU %.3g relative (max |logit| %.3g)\n", d / sc, sc);
        CHECK(d <= CPU_TOL * sc, "CUDA differs from CPU by %.3g", d);
        if (d / sc > g_worst_cpu) g_worst_cpu = d / sc;
    }
    free(cpu);
    free(gpu);
    for (i = 0; i < ne; i++) free(buf[i]);
}

/* --------------------------------------------------------------- errors */

static void test_arena_errors(void) {
    g4_model m;
    g4_cuda_model cm;
    g4_cuda_session s;
    g4_session_config sc = g4_session_config_init();
    size_t db, hb;
    void *darena = NULL, *harena;
    char err[G4_ERROR_MAX];
    if (g4_model_load(&m, tiny("e2b_like")) != G4_OK) { CHECK(0, "%s", m.error); return; }
    CHECK(g4_cuda_model_upload(&cm, &m) == G4_OK, "upload: %s", cm.error);
    sc.max_context = 100;
    CHECK(g4_cuda_session_size(&cm, &sc, &db, &hb) == G4_OK && db > 0 && hb > 0, "size");
    CHECK(g4_cuda_malloc(&darena, db + 64, err) == G4_OK, "%s", err);
    harena = malloc(hb + 64);
    CHECK(g4_cuda_session_init(&s, &cm, &sc, darena, db - 1, harena, hb) == G4_ERR_ARENA &&
              strstr(s.error, "device arena") && strstr(s.error, "too small"),
          "undersized device arena: %s", s.error);
    CHECK(g4_cuda_session_init(&s, &cm, &sc, darena, db, harena, hb - 1) == G4_ERR_ARENA &&
              strstr(s.error, "host arena") && strstr(s.error, "too small"),
          "undersized host arena: %s", s.error);
    CHECK(g4_cuda_session_init(&s, &cm, &sc, (char *)darena + 4, db, harena, hb) == G4_ERR_ARENA &&
              strstr(s.error, "aligned"), "misaligned: %s", s.error);
    CHECK(g4_cuda_session_init(&s, &cm, &sc, NULL, db, harena, hb) == G4_ERR_ARENA, "NULL device arena");
    CHECK(g4_cuda_session_init(&s, &cm, &sc, darena, db, NULL, hb) == G4_ERR_ARENA, "NULL host arena");
    sc.max_context = 0;
    CHECK(g4_cuda_session_size(&cm, &sc, &db, &hb) == G4_ERR_INPUT, "max_context 0");
    sc.max_context = 100;
    CHECK(g4_cuda_session_size(&cm, &sc, &db, &hb) == G4_OK &&
              g4_cuda_session_init(&s, &cm, &sc, darena, db, harena, hb) == G4_OK,
          "exactly the reported sizes must do: %s", s.error);
    {
        int32_t ids[2] = {2, 512};
        float logits[2 * 512];
        CHECK(g4_cuda_forward(&s, ids, 2, logits, G4_LOGITS_ALL) == G4_ERR_INPUT && strstr(s.error, "512"), "bad id");
        CHECK(g4_cuda_forward(&s, ids, 0, logits, G4_LOGITS_ALL) == G4_ERR_INPUT, "no tokens");
        CHECK(g4_cuda_forward(&s, ids, 1, NULL, G4_LOGITS_ALL) == G4_ERR_INPUT, "NULL logits");
        CHECK(g4_cuda_forward(&s, ids, 1, logits, 9) == G4_ERR_INPUT, "bad mode");
        CHECK(s.pos == 0, "errors must not advance the session");
    }
    g4_cuda_free(darena);
    free(harena);
    g4_cuda_model_free(&cm);
    g4_model_free(&m);
}

#ifdef G4_CUDA_EMULATE
/* Every CUDA call is checked: fail the k-th runtime call or launch, for
   every k of an upload + session + prefill + decode, and each must come back
   as an error with a message naming the call, never a crash or a G4_OK.
   e2b_like with reader copies and the plain matmul reaches the PLE, copy and
   plain matmul launches; 26b_like the MoE and tiled matmul ones. */
static void check_injected(const char *model, int reader_copies, int matmul) {
    g4_model m;
    int32_t ids[2] = {2, 81};
    float logits[512];
    long k;
    int failures = 0, completed = 0;
    char err[G4_ERROR_MAX];
    if (g4_model_load(&m, tiny(model)) != G4_OK) { CHECK(0, "%s", m.error); return; }
    for (k = 1; k < 100000 && !completed; k++) {
        g4_cuda_model cm;
        g4_cuda_session s;
        g4_session_config sc = g4_session_config_init();
        size_t db = 0, hb = 0;
        void *darena = NULL, *harena = NULL;
        g4_result r;
        const char *msg = err;
        sc.max_context = 2;
        sc.reader_copies = reader_copies;
        err[0] = 0;
        g4emu_fail_after(k);
        r = g4_cuda_model_upload(&cm, &m);
        msg = cm.error;
        if (r == G4_OK) {
            g4_cuda_session_size(&cm, &sc, &db, &hb);
            r = g4_cuda_malloc(&darena, db, err);
            msg = err;
            harena = malloc(hb);
            if (r == G4_OK) {
                msg = s.error;
                r = g4_cuda_session_init(&s, &cm, &sc, darena, db, harena, hb);
                s.matmul = matmul;
                if (r == G4_OK) r = g4_cuda_forward(&s, ids, 1, logits, G4_LOGITS_LAST);
                if (r == G4_OK) r = g4_cuda_forward(&s, ids + 1, 1, logits, G4_LOGITS_LAST);
            }
            g4_cuda_free(darena);
            free(harena);
            g4_cuda_model_free(&cm);
        }
        g4emu_fail_after(-1);
        if (r == G4_OK) { completed = 1; break; }
        failures++;
        if (!((r == G4_ERR_CUDA || r == G4_ERR_NOMEM) && strstr(msg, "failed"))) {
            CHECK(0, "%s: failure injected at call %ld: result %d, message \"%s\"", model, k, (int)r, msg);
            break;
        }
    }
    printf("  %s: %d injected failures, each reported; the run completes once none is injected\n", model, failures);
    CHECK(completed && failures > 100, "completed %d after %d failures", completed, failures);
    g4_model_free(&m);
}

static void test_every_cuda_call_checked(void) {
    check_injected("e2b_like", 1, G4_CUDA_MATMUL_PLAIN);
    check_injected("26b_like", 0, G4_CUDA_MATMUL_TILED);
}

/* Every __global__ kernel in gemma4_cuda.cu ran during this suite. */
static void test_every_kernel_ran(void) {
    char *text, *p, err[G4_ERROR_MAX];
    size_t len;
    int kernels = 0;
    if (g4__read_file("gemma4_cuda.cu", &text, &len, 1 << 22, err) != G4_OK) { CHECK(0, "%s", err); return; }
    for (p = strstr(text, "\n__global__ void "); p; p = strstr(p + 1, "\n__global__ void ")) {
        char name[64];
        int i = 0;
        const char *q = p + strlen("\n__global__ void ");
        while (i < 63 && (q[i] == '_' || (q[i] >= 'a' && q[i] <= 'z') || (q[i] >= '0' && q[i] <= '9'))) { name[i] = q[i]; i++; }
        name[i] = 0;
        kernels++;
        CHECK(g4emu_launches(name) > 0, "kernel %s never ran", name);
    }
    printf("  %d kernels, each launched\n", kernels);
    CHECK(kernels >= 20, "found only %d kernels", kernels);
    free(text);
}
#endif

int main(int argc, char **argv) {
    char tmpl[] = "/tmp/gemma4-cuda-test-XXXXXX", desc[256], err[G4_ERROR_MAX];
    if (argc > 1) g_data = argv[1];
    if (argc > 2) g_only = argv[2];
    if (g4_cuda_device_check(desc, sizeof desc, err) != G4_OK) {
        printf("no CUDA device here (%s): the CUDA tests did NOT run. Without a GPU, run make test-cuda-emu.\n", err);
        printf("0 passed, 0 failed (skipped: no GPU)\n");
        return 0;
    }
    printf("device: %s\n", desc);
    if (!mkdtemp(tmpl)) { printf("cannot create a temporary directory\n"); return 1; }
    snprintf(g_tmp, sizeof g_tmp, "%s", tmpl);

    run("cuda golden e2b_like, layer by layer vs transformers and CPU", test_golden_e2b_like);
    run("cuda golden e4b_like", test_golden_e4b_like);
    run("cuda golden 31b_like (k_eq_v)", test_golden_31b_like);
    run("cuda golden 26b_like (MoE)", test_golden_26b_like);
    run("cuda golden plain (f16)", test_golden_plain);
    run("cuda golden legacy_keys (f32)", test_golden_legacy_keys);
    run("cuda goldens with the plain matmul", test_golden_plain_matmul);
    run("cuda bf16-faithful mode = the CPU's, tap by tap", test_bf16_mode);
    run("cuda tiled matmul = plain matmul, bit for bit", test_tiled_equals_plain);
    run("cuda greedy decode = transformers generate", test_greedy_matches_generate);
    run("cuda chunked prefill and decode = one-shot (e2b_like)", test_chunked_e2b);
    run("cuda chunked prefill and decode = one-shot (MoE)", test_chunked_moe);
    run("cuda chunked prefill and decode = one-shot (k_eq_v)", test_chunked_31b);
    run("cuda owners-only table = per-reader copies", test_reader_copies_same_logits);
    run("cuda table on the device: owners only, shared slots, positions", test_table_on_device);
    run("cuda write-once-then-read checks (host and device)", test_table_checks);
    run("cuda stale reader K/V weights (NaN) are never read", test_stale_reader_kv_weights_ignored);
    run("cuda sessions on one model are independent; reset", test_sessions_independent);
    run("cuda head dims 256 and 512 = CPU", test_head_dims_256_512);
    run("cuda arenas and inputs: errors", test_arena_errors);
#ifdef G4_CUDA_EMULATE
    run("cuda every runtime call and launch is checked (injected failures)", test_every_cuda_call_checked);
    run("cuda every kernel ran", test_every_kernel_ran);
#endif
    {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
        if (system(cmd) != 0) printf("(could not remove %s)\n", g_tmp);
    }
    printf("max relative difference: vs transformers %.3g (bound %.1g), vs CPU path %.3g (bound %.1g)\n",
           g_worst_golden, TOL, g_worst_cpu, CPU_TOL);
    return finish();
}
