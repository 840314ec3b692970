/* Tests of the CUDA path (gemma4_cuda.cu): the goldens and shared-KV
   invariants of tests/invariants.h (the CPU suite runs the same ones), here
   on the CUDA backend, each layer also compared with the scalar CPU path; and
   CUDA's own: the bf16 mode against the CPU's, tiled = plain matmul, the
   device's table checks, head dims 256/512, arenas, injected failures.

   Built twice from this one file:
     make test-cuda-emu  gemma4_cuda.cu compiled as host C++ against
                         tests/cuda_emu.h (no GPU, no nvcc: g++ alone);
     make test-cuda      gemma4_cuda.cu compiled by nvcc, on a real GPU
                         (says so and runs nothing when there is none;
                         with G4_CUDA_REQUIRED=1, as tests/cuda_device.sh
                         runs it, that is a failure).

   Tolerances, and why:
     vs transformers: max |cuda - ref| <= 2e-5 * max |ref|, logits and every
       tap, exactly the CPU suite's bound (see tests/test_gemma4.c).
     vs the CPU path, layer by layer (every tap and the logits), float32 and
       bf16 modes: bit for bit (0), emulated and on a GPU. The kernels sum in
       the CPU's order without FMA contraction (checked at session init on
       the device), call the CPU's own exp/tanh (g4__expf, g4__tanhf: IEEE
       double operations, no libm) and take RoPE's cos/sin from the host;
       division and sqrtf are IEEE on both sides. Exactness is what catches
       a summation order that drifted from the CPU's.
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
#define G4_TESTING /* g4__cuda_session_*_testing: reader_copies (gemma4_cuda.cu is built with it too) */
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef G4_CUDA_EMULATE
extern void g4emu_on_call(int (*fail)(void));
extern long g4emu_launches(const char *kernel);
extern void g4emu_fault_in(const char *kernel, long n);
extern void g4emu_reset_device(void);
extern void g4emu_ftz(int on);
extern long g4emu_mmas(void);
extern void g4emu_set_sms(int n);
#endif
#define CPU_TOL 0.0      /* the exact mode: see the top comment */
#define CPU_TOL_BF16 0.0

#define FAST_TOL 4e-5      /* the fast mode: see "fast mode" below */
#define FAST_TAP_TOL 1e-4
#define FAST_TOL_BF16 3e-2
#define FAST_ATT_TOL 2e-6  /* flash-decoding's attention alone vs float64 at up to 16k keys (measured <= 5.6e-7
                              emulated): see test_fast_long_context */

#include "harness.h" /* g_only: argv[2], run only tests whose name contains it */
#include "fixtures.h"
#include "invariants.h"

static g4i_worst g_worst; /* over all models, relative: vs transformers, vs the CPU path */

/* the first `small` of a test's n models in a sized run (G4_CUDA_SUITE=sized, g4i_sized), else all n */
#define SIZED(n, small) (g4i_sized ? (small) : (n))

/* --------------------------------------------- the CUDA backend for invariants.h */

typedef struct {
    g4_cuda_session s;
    void *darena, *harena;
    size_t dbytes, hbytes;
} cuda_impl;

static void *cuda_model_open(const g4_model *m) {
    g4_cuda_model *cm = (g4_cuda_model *)calloc(1, sizeof *cm);
    if (cm && g4_cuda_model_upload(cm, m) != G4_OK) {
        printf("  upload: %s\n", cm->error);
        free(cm);
        cm = NULL;
    }
    return cm;
}

static void cuda_model_close(void *bm) {
    g4_cuda_model_free((g4_cuda_model *)bm);
    free(bm);
}

/* a backend's variant: the matmul kind, or'ed with these */
#define V_FAST 0x100 /* g4_cuda_config.fast */
#define V_BF16 0x200 /* cfg.bf16 from the start (the fast mode's K/V dtype follows it) */

static int g_kv_splits; /* g4_cuda_config.kv_splits of the sessions cuda_open makes (0: from the device) */

static int cuda_open(g4i_session *s, void *bm, const g4_session_config *cfg_in, int variant) {
    cuda_impl *c = (cuda_impl *)calloc(1, sizeof *c);
    char err[G4_ERROR_MAX];
    g4_session_config cfg_v = *cfg_in, *cfg = &cfg_v;
    g4_cuda_config cc = {0};
    int matmul = variant & 0xff, copies = (variant & G4I_READER_COPIES) != 0;
    cc.kv_splits = g_kv_splits;
    if (variant & V_FAST) cc.fast = 1;
    if (variant & V_BF16) cfg_v.bf16 = 1;
    memset(s, 0, sizeof *s);
    if (!(s->impl = c)) return 0;
    s->error = c->s.error;
    if (g4__cuda_session_size_testing((g4_cuda_model *)bm, cfg, &cc, copies, &c->dbytes, &c->hbytes) != G4_OK) {
        printf("  session size\n");
        return 0;
    }
    if (g4_cuda_malloc(&c->darena, c->dbytes, err) != G4_OK) { printf("  %s\n", err); return 0; }
    if (!(c->harena = malloc(c->hbytes))) return 0;
    if (g4__cuda_session_init_testing(&c->s, (g4_cuda_model *)bm, cfg, &cc, copies, c->darena, c->dbytes, c->harena,
                                      c->hbytes) != G4_OK) {
        printf("  session: %s\n", c->s.error);
        return 0;
    }
    c->s.matmul = matmul;
    s->cfg = &c->s.cfg;
    s->pos = &c->s.pos;
    s->slots = c->s.slots;
    s->n_slots = c->s.n_slots;
    s->layer_slot = c->s.layer_slot;
    s->bytes = c->dbytes;
    return 1;
}

static g4_cuda_session *cuda_session(g4i_session *s) { return &((cuda_impl *)s->impl)->s; }

static g4_result cuda_forward(g4i_session *s, const int32_t *ids, int n, float *logits, int mode) {
    return g4_cuda_forward(cuda_session(s), ids, n, logits, mode);
}

static g4_result cuda_reset(g4i_session *s) { return g4_cuda_session_reset(cuda_session(s)); }

static g4_result cuda_read_table(g4i_session *s, g4_kv_slot *out, int max) {
    return g4_cuda_session_table(cuda_session(s), out, max);
}

static void cuda_close(g4i_session *s) {
    cuda_impl *c = (cuda_impl *)s->impl;
    g4_cuda_free(c->darena);
    free(c->harena);
    free(c);
    s->impl = NULL;
}

static const g4i_backend g4i_cuda = {"cuda", G4_CUDA_MATMUL_TILED, cuda_model_open, cuda_model_close, cuda_open,
                                     cuda_forward, cuda_reset, cuda_close, cuda_read_table};
static const g4i_backend g4i_cuda_plain = {"cuda (plain matmul)", G4_CUDA_MATMUL_PLAIN, cuda_model_open, cuda_model_close,
                                           cuda_open, cuda_forward, cuda_reset, cuda_close, cuda_read_table};

/* the fast mode (float32, and bf16 from the start) */
static const g4i_backend g4i_cuda_fast = {"cuda fast", V_FAST, cuda_model_open, cuda_model_close, cuda_open,
                                          cuda_forward, cuda_reset, cuda_close, cuda_read_table};
static const g4i_backend g4i_cuda_fast_bf16 = {"cuda fast bf16", V_FAST | V_BF16, cuda_model_open, cuda_model_close,
                                               cuda_open, cuda_forward, cuda_reset, cuda_close, cuda_read_table};
static const g4i_backend g4i_cuda_bf16 = {"cuda bf16", V_BF16, cuda_model_open, cuda_model_close, cuda_open,
                                          cuda_forward, cuda_reset, cuda_close, cuda_read_table};

/* ----------------------------------------------- goldens, layer by layer */

/* transformers' goldens with the plain matmul, every tap and the logits also
   against the scalar CPU path (the tiled matmul: g4i_run_all in main) */
static void test_golden_plain_matmul(void) {
    g4i_golden(&g4i_cuda_plain, "e2b_like", &g4i_cpu, CPU_TOL, &g_worst);
    if (g4i_sized) return;
    g4i_golden(&g4i_cuda_plain, "26b_like", &g4i_cpu, CPU_TOL, &g_worst);
    g4i_golden(&g4i_cuda_plain, "legacy_keys", &g4i_cpu, CPU_TOL, &g_worst);
}

/* The bf16-faithful mode: every tap and the logits equal the CPU's bf16 mode
   (the scalar CPU path, whose bf16 mode matches transformers-bf16: see the
   core suite), and differ from float32 (the mode is on). */
static void check_bf16(const char *model) {
    golden g;
    g4i_run cpu, c;
    g4i_taps rec;
    g4i_tap_check tc;
    int n, V;
    const int32_t *ids;
    float *out = NULL, *cpu_out = NULL, *f32_out = NULL;
    memset(&rec, 0, sizeof rec);
    memset(&tc, 0, sizeof tc);
    memset(&c, 0, sizeof c);
    if (!(ids = g4i_input_ids(&g, model, &n))) return;
    if (g4i_open(&cpu, &g4i_cpu, tiny(model), n, 0, 0)) { /* the CPU's bf16 mode, every tap recorded */
        cpu.s.cfg->bf16 = 1;
        cpu.s.cfg->tap = g4i_record_tap;
        cpu.s.cfg->tap_user = &rec;
        cpu_out = (float *)malloc(sizeof(float) * (size_t)n * cpu.m.config.vocab_size);
        CHECK(g4i_cpu.forward(&cpu.s, ids, n, cpu_out, G4_LOGITS_ALL) == G4_OK, "cpu forward: %s", cpu.s.error);
    }
    g4i_close(&cpu);
    if (cpu_out && g4i_open(&c, &g4i_cuda, tiny(model), n, 0, 0)) {
        V = c.m.config.vocab_size;
        f32_out = (float *)malloc(sizeof(float) * (size_t)n * V);
        out = (float *)malloc(sizeof(float) * (size_t)n * V);
        CHECK(g4i_cuda.forward(&c.s, ids, n, f32_out, G4_LOGITS_ALL) == G4_OK, "f32 forward: %s", c.s.error);
        g4i_cuda.reset(&c.s);
        tc.ref = &rec;
        tc.ref_tol = CPU_TOL_BF16;
        c.s.cfg->bf16 = 1;
        c.s.cfg->tap = g4i_compare_tap;
        c.s.cfg->tap_user = &tc;
        CHECK(g4i_cuda.forward(&c.s, ids, n, out, G4_LOGITS_ALL) == G4_OK, "bf16 forward: %s", c.s.error);
        {
            double dc = max_diff(out, cpu_out, (size_t)n * V), s2 = max_abs(cpu_out, (size_t)n * V);
            double df = max_diff(out, f32_out, (size_t)n * V);
            printf("  %s bf16 mode: logits vs the CPU's bf16 mode %.3g relative, worst tap %.3g; vs float32 %.3g\n",
                   model, dc / s2, tc.worst_ref, df / s2);
            CHECK(dc <= CPU_TOL_BF16 * s2, "bf16 logits differ from the CPU's: %.3g", dc / s2);
            CHECK(df > 1e-3 * s2, "bf16 logits are float32's: the mode is not on");
        }
        CHECK(tc.fails == 0, "%d taps differ", tc.fails);
        CHECK(tc.seen_ref == tc.taps && tc.taps == rec.n, "tap sets: CUDA %d, matched %d, CPU %d", tc.taps, tc.seen_ref,
              rec.n);
    } else {
        CHECK(0, "cpu run or cuda session");
    }
    g4i_close(&c);
    g4i_taps_free(&rec);
    free(cpu_out);
    free(f32_out);
    free(out);
    g4_model_free(&g.m);
}

static void test_bf16_mode(void) {
    static const char *models[] = {"e2b_like", "e4b_like", "31b_like", "26b_like"};
    int k;
    for (k = 0; k < SIZED(4, 1); k++) check_bf16(models[k]);
}

/* the tiled matmul equals the plain one bit for bit (same summation order) */
static void test_tiled_equals_plain(void) {
    static const char *models[] = {"e2b_like", "31b_like", "26b_like", "plain"};
    int k;
    for (k = 0; k < SIZED(4, 1); k++) {
        golden g;
        int n;
        const int32_t *ids;
        float *a, *b;
        if (!(ids = g4i_input_ids(&g, models[k], &n))) continue;
        a = g4i_logits(&g4i_cuda, tiny(models[k]), ids, n, 64, 0, 0);
        b = g4i_logits(&g4i_cuda_plain, tiny(models[k]), ids, n, 64, 0, 0);
        CHECK(a && b && max_diff(a, b, (size_t)n * 512) == 0.0, "%s: tiled and plain matmul differ", models[k]);
        free(a);
        free(b);
        g4_model_free(&g.m);
    }
}

/* Write once, then read, checked on both sides: a host table that says a
   slot was already written is refused before any kernel runs, and a reader
   pointed at a slot of another shape is caught by the attention kernel from
   the DEVICE's table (the host's n_pos check passes); so is a sliding ring
   too short for the window. */
static void test_table_checks(void) {
    g4i_run r;
    g4_cuda_session *cs;
    int32_t ids[3] = {2, 81, 101};
    float logits[512];
    if (!g4i_open(&r, &g4i_cuda, tiny("e2b_like"), 16, 4, 0)) { CHECK(0, "open"); g4i_close(&r); return; }
    cs = cuda_session(&r.s);
    CHECK(cs->slots[2].writer == 2, "slot 2 is layer 2's");
    cs->slots[2].n_pos = 5; /* owner 2's slot claims positions it never wrote */
    CHECK(g4_cuda_forward(cs, ids, 3, logits, G4_LOGITS_LAST) == G4_ERR_INPUT && strstr(cs->error, "out of order"),
          "host check: %s", cs->error);
    CHECK(g4_cuda_session_reset(cs) == G4_OK, "reset");
    {   /* a sliding reader (head_dim 16) pointed at the full owner's slot (32) */
        int i, reader = -1, full_slot = -1;
        char want[64];
        for (i = 0; i < r.m.plan.n_layers; i++) {
            const g4_layer_plan *lp = &r.m.plan.layer[i];
            if (lp->reads >= 0 && lp->type == G4_SLIDING && reader < 0) reader = i;
            if (lp->reads < 0 && lp->type == G4_FULL) full_slot = lp->kv_slot;
        }
        CHECK(reader >= 0 && full_slot >= 0, "e2b_like has a sliding reader and a full owner");
        if (reader < 0 || full_slot < 0) { g4i_close(&r); return; }
        cs->layer_slot[reader] = full_slot;
        snprintf(want, sizeof want, "device table check: layer %d", reader);
        cs->error[0] = 0;
        CHECK(g4_cuda_forward(cs, ids, 3, logits, G4_LOGITS_LAST) == G4_ERR_INPUT && strstr(cs->error, want),
              "device check: %s", cs->error);
        cs->layer_slot[reader] = r.m.plan.layer[reader].kv_slot;
    }
    {   /* invariant 7 on the device: a sliding slot whose ring is shorter than
           window - 1 + chunk (uploaded to the device by reset) loses keys the
           window still needs; the attention kernel sees it. */
        int32_t many[12] = {2, 81, 101, 77, 5, 9, 300, 4, 6, 8, 10, 12};
        CHECK(cs->slots[0].capacity == 8 - 1 + 4, "sliding capacity %d", cs->slots[0].capacity);
        cs->slots[0].capacity = 6;
        CHECK(g4_cuda_session_reset(cs) == G4_OK, "reset");
        cs->error[0] = 0;
        CHECK(g4_cuda_forward(cs, many, 12, logits, G4_LOGITS_LAST) == G4_ERR_INPUT &&
                  strstr(cs->error, "no longer holds"),
              "ring check: %s", cs->error);
        cs->slots[0].capacity = 8 - 1 + 4;
        CHECK(g4_cuda_session_reset(cs) == G4_OK && g4_cuda_forward(cs, many, 12, logits, G4_LOGITS_LAST) == G4_OK,
              "the intact table runs: %s", cs->error);
    }
    g4i_close(&r);
}

/* A text file (a test checkpoint's config.json). */
static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) { fputs(text, f); fclose(f); }
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
        CHECK(g4_model_load(&m, dir) == G4_OK, "load: %s", m.error);
        CHECK(m.plan.layer[0].head_dim == 256 && m.plan.layer[1].head_dim == 512, "head dims %d %d",
              m.plan.layer[0].head_dim, m.plan.layer[1].head_dim);
        g4_model_free(&m);
    }
    cpu = g4i_logits(&g4i_cpu, dir, ids, n, 0, 0, 0);
    gpu = g4i_logits(&g4i_cuda, dir, ids, n, 5, 0, 0);
    {
        double d = gpu && cpu ? max_diff(gpu, cpu, (size_t)n * V) : INFINITY, sc = cpu ? max_abs(cpu, (size_t)n * V) : 1;
        printf("  head dims 256/512: CUDA vs CPU %.3g relative (max |logit| %.3g)\n", d / sc, sc);
        CHECK(d <= CPU_TOL * sc, "CUDA differs from CPU by %.3g", d);
        if (d / sc > g_worst.ref) g_worst.ref = d / sc;
    }
    { /* the fast mode: D = 256 and 512 take a lane 8 elements at a time, one and two passes */
        float *fast = g4i_logits(&g4i_cuda_fast, dir, ids, n, 5, 0, 0), *fb = g4i_logits(&g4i_cuda_fast, dir, ids, n, 5, 1, 0);
        double d = fast && cpu ? max_diff(fast, cpu, (size_t)n * V) : INFINITY, sc = cpu ? max_abs(cpu, (size_t)n * V) : 1;
        double dd = fast && fb ? max_diff(fb, cpu, (size_t)n * V) : INFINITY;
        printf("  head dims 256/512: fast vs CPU %.3g relative, fast decode %.3g\n", d / sc, dd / sc);
        CHECK(d <= FAST_TOL * sc && dd <= FAST_TOL * sc, "fast differs from CPU by %.3g / %.3g", d / sc, dd / sc);
        free(fast);
        free(fb);
    }
    free(cpu);
    free(gpu);
    for (i = 0; i < ne; i++) free(buf[i]);
}

/* ------------------------------------------------------------ fast mode */
/* The fast mode (g4_cuda_config.fast) is bounded against the exact mode, the
   oracle: FAST_TOL on the logits in float32 (other summation orders:
   split-K, warp butterflies, the online softmax; about 1e-6 is typical, the
   bound leaves room for the device's transcendental functions on a GPU),
   FAST_TAP_TOL on every intermediate tap (each relative to that tap's own
   max; a norm's output carries its input's reordering error forward through
   every later layer: on an H100, e2b_like's layers.9.post_attention_layernorm
   differed by 4.82e-5 of its max while the logits differed by 1.08e-5; the
   emulator's smaller blocks gave 3.41e-5), FAST_TOL_BF16 in
   the bf16 mode against the bf16-faithful mode (a different order moves a
   bf16 rounding now and then: one bf16 ulp is 3.9e-3 relative). */

static g4i_worst g_fast; /* golden: fast f32 vs exact f32; ref: fast bf16 vs bf16-faithful */

/* the goldens: fast float32 within FAST_TOL of exact float32 (the logits)
   and FAST_TAP_TOL (every tap), the same taps by name; and within G4I_TOL of
   transformers */
static void test_fast_goldens(void) {
    static const char *models[] = {"e2b_like", "e4b_like", "31b_like", "26b_like", "plain", "legacy_keys"};
    g4i_worst w;
    memset(&w, 0, sizeof w);
    for (int k = 0; k < SIZED(6, 4); k++) g4i_golden_tol(&g4i_cuda_fast, models[k], &g4i_cuda, FAST_TOL, FAST_TAP_TOL, &w);
    if (w.ref > g_fast.golden) g_fast.golden = w.ref;
    if (w.ref_taps > g_fast.ref_taps) g_fast.ref_taps = w.ref_taps;
}

/* n greedy tokens after the golden's first 6 (prefill, then one per call) */
static int greedy_tokens(const g4i_backend *b, const char *model, int32_t *out, int *n_out) {
    golden g;
    g4i_run r;
    int n, i, V, ok = 1;
    const int32_t *want;
    float *logits;
    *n_out = 0;
    memset(&r, 0, sizeof r); /* (g4i_close below may run without g4i_open) */
    if (!golden_open(&g, model)) return 0;
    want = golden_ids(&g, "greedy_ids", &n);
    if (!want || n <= 6 || n > 64 || !g4i_open(&r, b, tiny(model), n, 0, 0)) {
        g4i_close(&r);
        g4_model_free(&g.m);
        return 0;
    }
    V = r.m.config.vocab_size;
    logits = (float *)malloc(sizeof(float) * V);
    memcpy(out, want, sizeof(int32_t) * 6);
    ok = b->forward(&r.s, want, 6, logits, G4_LOGITS_LAST) == G4_OK;
    for (i = 6; ok && i < n; i++) {
        out[i] = g4_argmax(logits, V);
        if (i + 1 < n) ok = b->forward(&r.s, &out[i], 1, logits, G4_LOGITS_LAST) == G4_OK;
    }
    if (!ok) printf("  %s: %s\n", b->name, r.s.error);
    *n_out = ok ? n : 0;
    free(logits);
    g4i_close(&r);
    g4_model_free(&g.m);
    return ok;
}

/* fast bf16 against the bf16-faithful mode: logits and every tap within
   FAST_TOL_BF16, the same taps; greedy decode gives the same tokens */
static void check_fast_bf16(const char *model) {
    golden g;
    g4i_run ex, fa;
    g4i_taps rec;
    g4i_tap_check tc;
    int n, V, ne = 0, nf = 0;
    const int32_t *ids;
    float *ref = NULL, *out = NULL;
    int32_t te[64], tf[64];
    memset(&rec, 0, sizeof rec);
    memset(&tc, 0, sizeof tc);
    memset(&fa, 0, sizeof fa);
    if (!(ids = g4i_input_ids(&g, model, &n))) return;
    if (g4i_open(&ex, &g4i_cuda_bf16, tiny(model), n, 0, 0)) {
        ex.s.cfg->tap = g4i_record_tap;
        ex.s.cfg->tap_user = &rec;
        ref = (float *)malloc(sizeof(float) * (size_t)n * ex.m.config.vocab_size);
        CHECK(g4i_cuda_bf16.forward(&ex.s, ids, n, ref, G4_LOGITS_ALL) == G4_OK, "bf16-faithful: %s", ex.s.error);
    }
    g4i_close(&ex);
    if (ref && g4i_open(&fa, &g4i_cuda_fast_bf16, tiny(model), n, 0, 0)) {
        double d, sc;
        V = fa.m.config.vocab_size;
        out = (float *)malloc(sizeof(float) * (size_t)n * V);
        tc.ref = &rec;
        tc.ref_tol = FAST_TOL_BF16;
        fa.s.cfg->tap = g4i_compare_tap;
        fa.s.cfg->tap_user = &tc;
        CHECK(g4i_cuda_fast_bf16.forward(&fa.s, ids, n, out, G4_LOGITS_ALL) == G4_OK, "fast bf16: %s", fa.s.error);
        d = max_diff(out, ref, (size_t)n * V);
        sc = max_abs(ref, (size_t)n * V);
        CHECK(greedy_tokens(&g4i_cuda_bf16, model, te, &ne) && greedy_tokens(&g4i_cuda_fast_bf16, model, tf, &nf) &&
                  ne == nf, "greedy runs");
        printf("  %s fast bf16: logits %.3g of max |logit| %.3g from the bf16-faithful mode, worst tap %.3g; "
               "greedy %d tokens %s\n", model, d / sc, sc, tc.worst_ref, ne - 6,
               ne == nf && memcmp(te, tf, sizeof(int32_t) * (size_t)ne) == 0 ? "equal" : "DIFFER");
        CHECK(d <= FAST_TOL_BF16 * sc, "logits differ by %.3g relative", d / sc);
        CHECK(tc.fails == 0, "%d taps differ", tc.fails);
        CHECK(tc.seen_ref == tc.taps && tc.taps == rec.n, "tap sets: fast %d, matched %d, faithful %d", tc.taps,
              tc.seen_ref, rec.n);
        CHECK(ne == nf && ne > 6 && memcmp(te, tf, sizeof(int32_t) * (size_t)ne) == 0, "greedy tokens differ");
        if (d / sc > g_fast.ref) g_fast.ref = d / sc;
        if (tc.worst_ref > g_fast.ref) g_fast.ref = tc.worst_ref;
    } else {
        CHECK(0, "bf16-faithful run or fast session");
    }
    g4i_close(&fa);
    g4i_taps_free(&rec);
    free(ref);
    free(out);
    g4_model_free(&g.m);
}

static void test_fast_bf16(void) {
    static const char *models[] = {"e2b_like", "e4b_like", "31b_like", "26b_like", "plain"};
#ifdef G4_CUDA_EMULATE
    long mmas = g4emu_mmas();
#endif
    for (int k = 0; k < SIZED(5, 1); k++) check_fast_bf16(models[k]);
#ifdef G4_CUDA_EMULATE
    printf("  %ld warp MMAs (bf16 tensor-core steps of the prefill GEMM)\n", g4emu_mmas() - mmas);
    CHECK(g4emu_mmas() > mmas, "the bf16 prefill must run the GEMM's MMA path");
#endif
}

/* The prefill GEMM's tensor-core path (bf16 mode, bf16 weights) against the
   same fragments summed on CUDA cores (G4_CUDA_MATMUL_PLAIN): the products
   are exact in both, and the emulator's MMA sums each output's 16 products
   in k order as the CUDA-core path does, so emulated the two agree bit for
   bit: a fragment read from the wrong lane or register would not. On a GPU
   the tensor core's own accumulation order leaves FAST_TOL_BF16. */
static void test_fast_mma_fragments(void) {
    static const g4i_backend cores = {"cuda fast bf16 (CUDA cores)", V_FAST | V_BF16 | G4_CUDA_MATMUL_PLAIN,
                                      cuda_model_open, cuda_model_close, cuda_open, cuda_forward, cuda_reset,
                                      cuda_close, cuda_read_table};
    static const char *models[] = {"e2b_like", "26b_like"};
    for (int k = 0; k < 2; k++) {
        golden g;
        int n;
        const int32_t *ids;
        float *a, *b;
        double d, sc;
        if (!(ids = g4i_input_ids(&g, models[k], &n))) continue;
#ifdef G4_CUDA_EMULATE
        long before = g4emu_mmas(), mid;
#endif
        a = g4i_logits(&g4i_cuda_fast_bf16, tiny(models[k]), ids, n, 64, 0, 0);
#ifdef G4_CUDA_EMULATE
        mid = g4emu_mmas();
#endif
        b = g4i_logits(&cores, tiny(models[k]), ids, n, 64, 0, 0);
        d = a && b ? max_diff(a, b, (size_t)n * 512) : INFINITY;
        sc = b ? max_abs(b, (size_t)n * 512) : 1;
        printf("  %s: tensor-core GEMM vs CUDA-core GEMM %.3g relative\n", models[k], d / sc);
#ifdef G4_CUDA_EMULATE
        CHECK(mid > before && g4emu_mmas() == mid, "MMAs: %ld with tensor cores, %ld without", mid - before,
              g4emu_mmas() - mid);
        CHECK(d == 0.0, "%s: the MMA path differs from the CUDA-core path by %.3g", models[k], d);
#else
        CHECK(d <= FAST_TOL_BF16 * sc, "%s: the MMA path differs from the CUDA-core path by %.3g", models[k], d / sc);
#endif
        free(a);
        free(b);
        g4_model_free(&g.m);
    }
}

/* fast float32 greedy decode: transformers' generate, logits and tokens */
static void test_fast_greedy(void) {
    static const char *models[] = {"e2b_like", "e4b_like", "31b_like", "26b_like", "plain"};
    for (int k = 0; k < SIZED(5, 1); k++) g4i_greedy(&g4i_cuda_fast, models[k]);
}

/* decode (one token per call: matvec, flash-decoding with KV splits) and
   chunked prefill against one-shot prefill, within the mode's tolerance; the
   same plan twice gives the same bits */
static void check_fast_chunking(const g4i_backend *b, const char *model, double tol) {
    static const int plans[][2] = {{1, 1}, {3, 5}, {13, 0}};
    golden g;
    g4_config c = g4i_config(model);
    int n, k;
    const int32_t *ids;
    float *ref, *again;
    double worst = 0;
    if (!(ids = g4i_input_ids(&g, model, &n))) return;
    ref = g4i_logits(b, tiny(model), ids, n, 64, 0, 0);
    again = g4i_logits(b, tiny(model), ids, n, 64, 0, 0);
    CHECK(ref && again && max_diff(ref, again, (size_t)n * c.vocab_size) == 0.0, "%s: a run must repeat bit for bit", model);
    for (k = 0; ref && k < (int)(sizeof plans / sizeof plans[0]); k++) {
        float *out = g4i_logits(b, tiny(model), ids, n, plans[k][0], plans[k][1], 0);
        double d = out ? max_diff(out, ref, (size_t)n * c.vocab_size) / max_abs(ref, (size_t)n * c.vocab_size) : INFINITY;
        CHECK(d <= tol, "%s: max_chunk %d, %d per call: %.3g relative from one-shot prefill", model, plans[k][0],
              plans[k][1], d);
        if (d > worst) worst = d;
        free(out);
    }
    printf("  %s %s: chunked and decode vs one-shot, worst %.3g relative (bound %.1g)\n", b->name, model, worst, tol);
    free(ref);
    free(again);
    g4_model_free(&g.m);
}

static void test_fast_chunking(void) {
    static const char *models[] = {"e2b_like", "26b_like", "31b_like"};
    for (int k = 0; k < SIZED(3, 1); k++) check_fast_chunking(&g4i_cuda_fast, models[k], FAST_TOL);
    for (int k = 0; k < SIZED(2, 1); k++) check_fast_chunking(&g4i_cuda_fast_bf16, models[k], FAST_TOL_BF16);
}

/* The shared-KV table in the fast mode (g4i_table: owners only, readers
   share, positions per step, the device's table agrees; a bf16 cache), the
   debug copies, NaN stale reader weights, bad input: the invariants, with
   exactness where the same kernels run in the same order. */
static void test_fast_table(void) {
    g4i_table(&g4i_cuda_fast);
    g4i_table(&g4i_cuda_fast_bf16);
    g4i_reader_copies(&g4i_cuda_fast_bf16);
    g4i_stale_reader_kv(&g4i_cuda_fast);
    g4i_forward_errors(&g4i_cuda_fast);
}

/* Two fast sessions on one model, interleaved (one token per call, two per
   call): each gives the bits of its own plan run alone. */
static void test_fast_sessions(void) {
    golden g;
    g4i_run a;
    g4i_session s2;
    int n, i, even;
    const int32_t *ids;
    float *ra, *rb, *la, *lb;
    if (!(ids = g4i_input_ids(&g, "e2b_like", &n))) return;
    if (n > 12) n = 12; /* past the window (8) */
    even = n - n % 2;
    ra = g4i_logits(&g4i_cuda_fast, tiny("e2b_like"), ids, n, 4, 1, 0);
    rb = g4i_logits(&g4i_cuda_fast, tiny("e2b_like"), ids, even, 4, 2, 0);
    memset(&s2, 0, sizeof s2);
    la = (float *)malloc(sizeof(float) * (size_t)n * 512);
    lb = (float *)malloc(sizeof(float) * (size_t)n * 512);
    if (!g4i_open(&a, &g4i_cuda_fast, tiny("e2b_like"), n, 4, 0) || !cuda_open(&s2, a.bm, a.s.cfg, V_FAST)) {
        CHECK(0, "open");
    } else {
        for (i = 0; i < n; i++) {
            CHECK(cuda_forward(&a.s, ids + i, 1, la + (size_t)i * 512, G4_LOGITS_ALL) == G4_OK, "a: %s", a.s.error);
            if (i % 2 == 1)
                CHECK(cuda_forward(&s2, ids + i - 1, 2, lb + (size_t)(i - 1) * 512, G4_LOGITS_ALL) == G4_OK, "b: %s",
                      s2.error);
        }
        CHECK(ra && max_diff(la, ra, (size_t)n * 512) == 0.0, "session a drifted");
        CHECK(rb && max_diff(lb, rb, (size_t)even * 512) == 0.0, "session b drifted");
        CHECK(cuda_reset(&a.s) == G4_OK, "reset");
        for (i = 0; i < n; i++)
            CHECK(cuda_forward(&a.s, ids + i, 1, lb + (size_t)i * 512, G4_LOGITS_ALL) == G4_OK, "a again: %s", a.s.error);
        CHECK(max_diff(la, lb, (size_t)n * 512) == 0.0, "a reset session must reproduce its first run");
    }
    if (s2.impl) cuda_close(&s2);
    g4i_close(&a);
    free(ra);
    free(rb);
    free(la);
    free(lb);
    g4_model_free(&g.m);
}

/* Flash-decoding: a decode step's KV splits sized from the device (several
   emulated multiprocessor counts) or asked for (1, 2, 3, 7: uneven pieces,
   empty ones when there are more splits than keys), each decode run within
   the fast bound of the exact mode's one-shot logits, and the last run
   repeated, a second run bit for bit (the combine adds the splits in split
   order). */
static void test_fast_kv_splits(void) {
    static const int asked[] = {1, 3, 0, 0};
    static const int sms[] = {2, 2, 1, 64};
#ifdef G4_CUDA_EMULATE
    const int last = 3;
#else
    const int last = 2; /* (k 3 does not run on a GPU, below) */
#endif
    const char *model = "e2b_like";
    golden g;
    g4_config c = g4i_config(model);
    int n, k;
    const int32_t *ids;
    float *ref;
    double worst = 0;
    if (!(ids = g4i_input_ids(&g, model, &n))) return;
    ref = g4i_logits(&g4i_cuda, tiny(model), ids, n, 64, 0, 0);
    CHECK(ref != NULL, "exact one-shot run");
    for (k = 0; ref && k < (int)(sizeof asked / sizeof asked[0]); k++) {
        float *a, *b;
        double d;
        g_kv_splits = asked[k];
#ifdef G4_CUDA_EMULATE
        g4emu_set_sms(sms[k]);
#else
        if (!asked[k] && k > 2) continue; /* a GPU reports its own count: one run of it is enough */
#endif
        a = g4i_logits(&g4i_cuda_fast, tiny(model), ids, n, 1, 1, 0);
        b = k == last ? g4i_logits(&g4i_cuda_fast, tiny(model), ids, n, 1, 1, 0) : NULL;
        d = a ? max_diff(a, ref, (size_t)n * c.vocab_size) / max_abs(ref, (size_t)n * c.vocab_size) : INFINITY;
        if (k == last)
            CHECK(a && b && max_diff(a, b, (size_t)n * c.vocab_size) == 0.0, "kv_splits %d (sms %d): a second run must "
                  "repeat the first bit for bit", asked[k], sms[k]);
        (void)sms;
        CHECK(d <= FAST_TOL, "kv_splits %d (sms %d): decode %.3g relative from the exact one-shot logits", asked[k],
              sms[k], d);
        if (d > worst) worst = d;
        free(b);
        free(a);
    }
    g_kv_splits = 0;
#ifdef G4_CUDA_EMULATE
    g4emu_set_sms(2);
#endif
    printf("  %s token by token, splits 1 and 3 and sized for 1 and 64 multiprocessors: worst %.3g of the exact "
           "logits (bound %.1g), the last run repeated bit for bit\n", model, worst, FAST_TOL);
    free(ref);
    g4_model_free(&g.m);
}

/* The long-context bound, on the attention alone: one decode query (4
   heads of one KV head, D 64) over N keys with scores of standard deviation
   5 and values of mean 1 (no cancellation to hide the running sums'
   rounding), the fast kernels (1 split: a prefill tile's single chain; more:
   flash-decoding) and the exact mode's order (the CPU's g4__attend, which
   the exact kernel equals bit for bit) each against a float64 reference. */
static double fast_attention_err(const float *q, const float *k, const float *v, const double *ref, int N, int G, int D,
                                 int splits) {
    float *out = (float *)malloc(sizeof(float) * (size_t)G * D);
    char err[G4_ERROR_MAX];
    double worst = 0, mx = 0;
    int i;
    if (g4__cuda_fast_attention_testing(out, q, k, v, N, G, D, splits, err) != G4_OK) {
        CHECK(0, "fast attention: %s", err);
        free(out);
        return INFINITY;
    }
    for (i = 0; i < G * D; i++) {
        if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        if (fabs(out[i] - ref[i]) > worst) worst = fabs(out[i] - ref[i]);
    }
    free(out);
    return worst / mx;
}

static void test_fast_long_context(void) {
    enum { G = 4, D = 64 };
    int Ns[3] = {1024, 4096, 16384}, ni;
    uint64_t rng = 88172645463325252ull;
    for (ni = 0; ni < (g4i_sized ? 2 : 3); ni++) {
        int N = Ns[ni], i, sp[3] = {1, 16, 128};
        float *q = (float *)malloc(sizeof(float) * G * D), *k = (float *)malloc(sizeof(float) * (size_t)N * D);
        float *v = (float *)malloc(sizeof(float) * (size_t)N * D), *ex = (float *)malloc(sizeof(float) * G * D);
        float *scores = (float *)malloc(sizeof(float) * (size_t)G * N);
        double *ref = (double *)calloc((size_t)G * D, sizeof(double)), *p = (double *)malloc(sizeof(double) * N);
        double e_ex = 0, mx = 0, e_fast[3];
        attention_case(&rng, G, N, D, 0.7906, q, k, v, p, ref, ex, scores); /* q.k over 64 dims: sd 0.79^2 8 = 5 */
        for (i = 0; i < G * D; i++) {
            if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
            if (fabs(ex[i] - ref[i]) > e_ex) e_ex = fabs(ex[i] - ref[i]);
        }
        e_ex /= mx;
        for (i = 0; i < 3; i++) e_fast[i] = fast_attention_err(q, k, v, ref, N, G, D, sp[i]);
        printf("  %5d keys, max|out - float64| / max|float64|: exact order %.2e; fast, 1 split %.2e, 16 splits %.2e, "
               "128 splits %.2e\n", N, e_ex, e_fast[0], e_fast[1], e_fast[2]);
        /* one split (a prefill tile's single running sum) no farther from float64 than the exact order is
           (before each key tile was summed from zero it was: 8.3e-6 against 7.65e-6 at 16k keys with the GPU's
           32-key tiles, emulated); flash-decoding's splits within FAST_ATT_TOL at every length, and at the
           longest, closer than one split (shorter running sums) */
        CHECK(e_fast[0] <= e_ex, "%d keys, 1 split: the fast attention is %.3g from float64, the exact order %.3g", N,
              e_fast[0], e_ex);
        for (i = 1; i < 3; i++)
            CHECK(e_fast[i] <= FAST_ATT_TOL && (ni < (g4i_sized ? 1 : 2) || e_fast[i] < e_fast[0]),
                  "%d keys, %d splits: the fast attention is %.3g from float64 (bound %.1g; 1 split %.3g)", N, sp[i],
                  e_fast[i], FAST_ATT_TOL, e_fast[0]);
        free(q); free(k); free(v); free(ex); free(scores); free(ref); free(p);
    }
}

/* The fast mode's arena: sized up front (no score buffer; a bf16 cache in
   the bf16 mode, so smaller again), undersized by a byte refused, and a
   model outside its attention kernel refused by name. */
static void test_fast_arena(void) {
    g4_model m;
    g4_cuda_model cm;
    g4_cuda_session s;
    g4_session_config sc = g4_session_config_init();
    g4_cuda_config fast = {0};
    int nh;
    size_t de, he, df, hf, db, hb;
    void *darena = NULL, *harena;
    char err[G4_ERROR_MAX];
    if (g4_model_load(&m, tiny("e2b_like")) != G4_OK) { CHECK(0, "%s", m.error); return; }
    CHECK(g4_cuda_model_upload(&cm, &m) == G4_OK, "upload: %s", cm.error);
    sc.max_context = 1000;
    fast.fast = 1;
    CHECK(g4_cuda_session_size(&cm, &sc, NULL, &de, &he) == G4_OK, "exact size");
    CHECK(g4_cuda_session_size(&cm, &sc, &fast, &df, &hf) == G4_OK, "fast size");
    sc.bf16 = 1;
    CHECK(g4_cuda_session_size(&cm, &sc, &fast, &db, &hb) == G4_OK, "fast bf16 size");
    printf("  device arena for 1000 positions: exact %lu, fast %lu, fast bf16 %lu bytes\n", (unsigned long)de,
           (unsigned long)df, (unsigned long)db);
    CHECK(df < de && db < df, "the fast arenas must be smaller (no scores; bf16 K/V)");
    CHECK(g4_cuda_malloc(&darena, db, err) == G4_OK, "%s", err);
    harena = malloc(hb);
    CHECK(g4_cuda_session_init(&s, &cm, &sc, &fast, darena, db - 1, harena, hb) == G4_ERR_ARENA &&
              strstr(s.error, "device arena") && strstr(s.error, "too small"),
          "undersized device arena: %s", s.error);
    CHECK(g4_cuda_session_init(&s, &cm, &sc, &fast, darena, db, harena, hb) == G4_OK && s.fast && s.kv_bf16 && !s.d_scores,
          "exactly the reported sizes must do: %s", s.error);
    {
        int32_t ids[3] = {2, 81, 101};
        float logits[512];
        CHECK(g4_cuda_forward(&s, ids, 3, logits, G4_LOGITS_LAST) == G4_OK, "forward: %s", s.error);
    }
    /* more query heads per KV head than the attention block holds */
    nh = m.config.num_attention_heads;
    m.config.num_attention_heads = 16 * m.plan.layer[0].kv_heads;
    CHECK(g4_cuda_session_init(&s, &cm, &sc, &fast, darena, db, harena, hb) == G4_ERR_CONFIG &&
              strstr(s.error, "fast mode") && strstr(s.error, "layer 0"), "a group of 16: %s", s.error);
    CHECK(g4_cuda_session_size(&cm, &sc, &fast, &df, &hf) == G4_ERR_CONFIG, "sized: a group of 16");
    m.config.num_attention_heads = nh;
    fast.kv_splits = 257; /* past G4F_MAX_KV_SPLIT */
    CHECK(g4_cuda_session_size(&cm, &sc, &fast, &df, &hf) == G4_ERR_INPUT, "kv_splits 257 must be refused");
    fast.kv_splits = -1;
    CHECK(g4_cuda_session_init(&s, &cm, &sc, &fast, darena, db, harena, hb) == G4_ERR_INPUT &&
              strstr(s.error, "kv_splits"), "kv_splits -1: %s", s.error);
    g4_cuda_free(darena);
    free(harena);
    g4_cuda_model_free(&cm);
    g4_model_free(&m);
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
    CHECK(g4_cuda_session_size(&cm, &sc, NULL, &db, &hb) == G4_OK && db > 0 && hb > 0, "size");
    CHECK(g4_cuda_malloc(&darena, db + 64, err) == G4_OK, "%s", err);
    harena = malloc(hb + 64);
    CHECK(g4_cuda_session_init(&s, &cm, &sc, NULL, darena, db - 1, harena, hb) == G4_ERR_ARENA &&
              strstr(s.error, "device arena") && strstr(s.error, "too small"),
          "undersized device arena: %s", s.error);
    CHECK(g4_cuda_session_init(&s, &cm, &sc, NULL, darena, db, harena, hb - 1) == G4_ERR_ARENA &&
              strstr(s.error, "host arena") && strstr(s.error, "too small"),
          "undersized host arena: %s", s.error);
    CHECK(g4_cuda_session_init(&s, &cm, &sc, NULL, (char *)darena + 4, db, harena, hb) == G4_ERR_ARENA &&
              strstr(s.error, "aligned"), "misaligned: %s", s.error);
    CHECK(g4_cuda_session_init(&s, &cm, &sc, NULL, NULL, db, harena, hb) == G4_ERR_ARENA, "NULL device arena");
    CHECK(g4_cuda_session_init(&s, &cm, &sc, NULL, darena, db, NULL, hb) == G4_ERR_ARENA, "NULL host arena");
    sc.max_context = 0;
    CHECK(g4_cuda_session_size(&cm, &sc, NULL, &db, &hb) == G4_ERR_INPUT, "max_context 0");
    sc.max_context = 100;
    CHECK(g4_cuda_session_size(&cm, &sc, NULL, &db, &hb) == G4_OK &&
              g4_cuda_session_init(&s, &cm, &sc, NULL, darena, db, harena, hb) == G4_OK,
          "exactly the reported sizes must do: %s", s.error);
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
   plain matmul launches; 26b_like the MoE and tiled matmul ones.
   One run goes through, and at each call the emulator asks inject_fork,
   which forks: in the child that call fails and the run goes on to its end
   (a failed decode step is retried there), then the child exits with what
   it saw (INJ_*); the parent waits, and its call succeeds. So each k costs
   the rest of a failed run, not a whole run up to k: on the Zen 3 the
   test took 13 s instead of 30 (under ASan 28 instead of 50). */
enum { INJ_REPORTED = 10, INJ_STEP_KEPT, INJ_STEP_CHANGED, INJ_WRONG }; /* a child's exit status */
static long inj_call;              /* the calls so far (in a child: the one that failed) */
static long inj_seen[INJ_WRONG + 1]; /* the parent's count of each exit status */
static long inj_lost;              /* children that ended otherwise (a crash), or no fork */
static int inj_child;

static int inject_fork(void) {
    pid_t pid;
    int st = 0;
    inj_call++;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        inj_child = 1;
        g4emu_on_call(NULL); /* the rest of the child's run fails nowhere else */
        return 1;
    }
    if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) >= INJ_REPORTED &&
        WEXITSTATUS(st) <= INJ_WRONG)
        inj_seen[WEXITSTATUS(st)]++;
    else {
        inj_lost++;
        if (pid < 0) printf("  failure injected at call %ld: fork failed\n", inj_call);
        else if (WIFSIGNALED(st)) printf("  failure injected at call %ld: the run crashed (signal %d)\n", inj_call, WTERMSIG(st));
        else printf("  failure injected at call %ld: the run ended with status %d\n", inj_call, WEXITSTATUS(st));
    }
    return 0;
}

static void check_injected(const char *model, int reader_copies, int matmul) {
    g4_model m;
    int32_t ids[2] = {2, 81};
    float logits[512], clean[512];
    int in_step = 0, kept = 1, retried = 0;
    long failures;
    char err[G4_ERROR_MAX];
    g4_cuda_model cm;
    g4_cuda_session s;
    g4_session_config sc = g4_session_config_init();
    size_t db = 0, hb = 0;
    void *darena = NULL, *harena = NULL;
    g4_result r;
    const char *msg = err;
    g4_cuda_config cc = {0};
    if (g4_model_load(&m, tiny(model)) != G4_OK) { CHECK(0, "%s", m.error); return; }
    { /* the decode step's logits without a failure */
        float *all = g4i_logits(matmul & V_FAST ? &g4i_cuda_fast : &g4i_cuda, tiny(model), ids, 2, 2, 1, reader_copies);
        CHECK(all != NULL, "clean run");
        if (!all) { g4_model_free(&m); return; }
        memcpy(clean, all + m.config.vocab_size, sizeof(float) * (size_t)m.config.vocab_size);
        free(all);
    }
    sc.max_context = 2;
    cc.fast = (matmul & V_FAST) != 0;
    err[0] = 0;
    inj_call = inj_lost = 0;
    memset(inj_seen, 0, sizeof inj_seen);
    g4emu_on_call(inject_fork);
    r = g4_cuda_model_upload(&cm, &m);
    msg = cm.error;
    if (r == G4_OK) {
        g4__cuda_session_size_testing(&cm, &sc, &cc, reader_copies, &db, &hb);
        r = g4_cuda_malloc(&darena, db, err);
        msg = err;
        harena = malloc(hb);
        if (r == G4_OK) {
            msg = s.error;
            r = g4__cuda_session_init_testing(&s, &cm, &sc, &cc, reader_copies, darena, db, harena, hb);
            s.matmul = matmul & 0xff;
            if (r == G4_OK) r = g4_cuda_forward(&s, ids, 1, logits, G4_LOGITS_LAST);
            if (r == G4_OK) {
                r = g4_cuda_forward(&s, ids + 1, 1, logits, G4_LOGITS_LAST);
                if (r != G4_OK) { /* a failed step keeps nothing, and runs again to the same bits */
                    int i;
                    char keep[G4_ERROR_MAX];
                    memcpy(keep, s.error, sizeof keep);
                    in_step = 1;
                    kept = s.pos == 1;
                    for (i = 0; i < s.n_slots; i++) kept &= s.slots[i].n_pos == 1;
                    retried = g4_cuda_forward(&s, ids + 1, 1, logits, G4_LOGITS_LAST) == G4_OK && s.pos == 2 &&
                              memcmp(logits, clean, sizeof(float) * (size_t)m.config.vocab_size) == 0;
                    memcpy(s.error, keep, sizeof keep);
                }
            }
        }
        g4_cuda_free(darena);
        free(harena);
        g4_cuda_model_free(&cm);
    }
    g4emu_on_call(NULL);
    if (inj_child) { /* what the failure at call inj_call came to */
        int reported = (r == G4_ERR_CUDA || r == G4_ERR_NOMEM) && strstr(msg, "failed");
        if (!reported) printf("  %s: failure injected at call %ld: result %d, message \"%s\"\n", model, inj_call, (int)r, msg);
        else if (in_step && !(kept && retried))
            printf("  %s: failure injected at call %ld, in the decode step: the session %s, the retry %s\n", model,
                   inj_call, kept ? "unchanged" : "CHANGED", retried ? "equal to a clean run" : "DIFFERENT");
        fflush(stdout);
        _exit(!reported ? INJ_WRONG : !in_step ? INJ_REPORTED : kept && retried ? INJ_STEP_KEPT : INJ_STEP_CHANGED);
    }
    failures = inj_seen[INJ_REPORTED] + inj_seen[INJ_STEP_KEPT] + inj_seen[INJ_STEP_CHANGED] + inj_seen[INJ_WRONG] + inj_lost;
    printf("  %s: %ld calls, each failed in turn: %ld reported, %ld of them in the decode step, after each the session "
           "unchanged and the step's retry bit-equal to a clean run: %ld; with none failed the run completes: %s\n", model,
           failures, failures - inj_seen[INJ_WRONG] - inj_lost, inj_seen[INJ_STEP_KEPT] + inj_seen[INJ_STEP_CHANGED],
           inj_seen[INJ_STEP_KEPT], r == G4_OK ? "yes" : msg);
    CHECK(r == G4_OK, "%s: the run with no failure injected: %s", model, msg);
    CHECK(failures == inj_call && failures > 100 && inj_seen[INJ_WRONG] == 0 && inj_lost == 0,
          "%ld of %ld failures not reported, %ld runs lost", inj_seen[INJ_WRONG], failures, inj_lost);
    CHECK(inj_seen[INJ_STEP_KEPT] > 50 && inj_seen[INJ_STEP_CHANGED] == 0,
          "a failed step changed the session or its retry differed (%ld of %ld)", inj_seen[INJ_STEP_CHANGED],
          inj_seen[INJ_STEP_KEPT] + inj_seen[INJ_STEP_CHANGED]);
    g4_model_free(&m);
}

static void test_every_cuda_call_checked(void) {
    check_injected("e2b_like", 1, G4_CUDA_MATMUL_PLAIN);
    check_injected("26b_like", 0, G4_CUDA_MATMUL_TILED);
    check_injected("e2b_like", 1, V_FAST); /* the fast mode's launches: reader copies, a tap-free decode */
}

/* A kernel that faults (an illegal address) is reported at the step's sync,
   under that step's positions, as sticky; the session's position and table
   are as before the step; every later call fails until the device is reset
   (the emulator's stand-in for ending the process). */
static void test_kernel_fault(void) {
    g4i_run r;
    g4_cuda_session *cs;
    int32_t ids[5] = {2, 81, 101, 77, 5};
    float logits[512];
    int i, same = 1;
    g4_result res;
    if (!g4i_open(&r, &g4i_cuda, tiny("e2b_like"), 16, 4, 0)) { CHECK(0, "open"); g4i_close(&r); return; }
    cs = cuda_session(&r.s);
    CHECK(g4_cuda_forward(cs, ids, 3, logits, G4_LOGITS_LAST) == G4_OK, "prefill: %s", cs->error);
    g4emu_fault_in("g4c_attention", 2); /* layer 1's attention in the next step */
    res = g4_cuda_forward(cs, ids + 3, 2, logits, G4_LOGITS_LAST);
    printf("  %s\n", cs->error);
    CHECK(res == G4_ERR_CUDA, "result %d", (int)res);
    CHECK(strstr(cs->error, "forward step at positions 3..4") && strstr(cs->error, "a kernel of this step failed") &&
              strstr(cs->error, "illegal memory access") && strstr(cs->error, "unusable"),
          "message: %s", cs->error);
    for (i = 0; i < cs->n_slots; i++) same &= cs->slots[i].n_pos == 3;
    CHECK(cs->pos == 3 && same, "position %d and the table must be as before the step", cs->pos);
    CHECK(g4_cuda_forward(cs, ids + 3, 1, logits, G4_LOGITS_LAST) == G4_ERR_CUDA && cs->pos == 3,
          "a later call on the dead context fails too: %s", cs->error);
    g4emu_reset_device();
    g4i_close(&r);
}

/* The device's arithmetic is checked at session init: a device build that
   flushes denormals (what -use_fast_math's -ftz=true does; the emulator sets
   the CPU's FTZ/DAZ bits for its kernels) is refused with a message. */
static void test_ieee_probe(void) {
    g4i_run r;
    int ok;
    g4emu_ftz(1);
    ok = g4i_open(&r, &g4i_cuda, tiny("e2b_like"), 16, 4, 0);
    g4emu_ftz(0);
    CHECK(!ok && strstr(r.s.error, "flushes denormals") && strstr(r.s.error, "-use_fast_math"), "refused: %s",
          r.s.error);
    g4i_close(&r);
    CHECK(g4i_open(&r, &g4i_cuda, tiny("e2b_like"), 16, 4, 0), "without FTZ the session opens");
    g4i_close(&r);
}

/* A host build with -ffast-math is refused at compile time (gemma4.h's
   #error), here with the emulated build's compiler. */
static void test_fast_math_refused(void) {
    char cmd[512];
    int rc;
    if (system("command -v c++ > /dev/null 2>&1") != 0) { skip("no c++ compiler here"); return; }
    snprintf(cmd, sizeof cmd, "c++ -std=c++17 -ffast-math -fsyntax-only -DG4_CUDA_EMULATE -include tests/cuda_emu.h "
             "-x c++ gemma4_cuda.cu > %s/fastmath.log 2>&1", g_tmp);
    rc = system(cmd);
    snprintf(cmd, sizeof cmd, "grep -q 'built with -ffast-math' %s/fastmath.log", g_tmp);
    CHECK(rc != 0 && system(cmd) == 0, "c++ -ffast-math gemma4_cuda.cu must fail with gemma4.h's #error (rc %d)", rc);
}
#endif

/* FP contraction is off on both sides: this file's build (the CPU path) and,
   at every session init, the device's (g4c_fp_probe). */
static void test_no_contraction(void) {
    volatile float a = 1.000244140625f, c = -1.00048828125f; /* 1 + 2^-12, -(1 + 2^-11) */
    float r = g4__fp_contract_probe(a, a, c);
    CHECK(r == 0.0f, "the CPU build fuses a * b + c (got %g): build with -ffp-contract=off", (double)r);
}

/* g4__expf and g4__tanhf (the float32 softmax and soft-cap on both sides)
   against a correctly rounded reference (long double expl/tanhl rounded to
   float), on 2M inputs each spread over their ranges plus the special
   values. The whole float32 range is checked by tools/check_exp_tanh.c. */
static void test_exp_tanh(void) {
    uint32_t rng = 1;
    long i, bad_e = 0, bad_t = 0, n = g4i_sized ? 65536 : 2000000;
    for (i = 0; i < n; i++) {
        float x, y, r;
        rng = rng * 1664525u + 1013904223u;
        x = -110.0f + 200.0f * (float)(rng >> 8) / 16777216.0f; /* [-110, 90] */
        y = g4__expf(x);
        r = (float)expl((long double)x);
        bad_e += memcmp(&y, &r, 4) != 0;
        x = (float)ldexp((double)(rng >> 8) / 16777216.0 - 0.5, (int)(rng % 16) - 10); /* |x| < 16, down to 2^-11 */
        y = g4__tanhf(x);
        r = (float)tanhl((long double)x);
        bad_t += memcmp(&y, &r, 4) != 0;
    }
    printf("  exp: %ld of %ld misrounded, tanh: %ld of %ld\n", bad_e, n, bad_t, n);
    CHECK(bad_e <= 2 && bad_t <= 2, "misrounded: exp %ld, tanh %ld", bad_e, bad_t);
    CHECK(g4__expf(0.0f) == 1.0f && g4__expf(-INFINITY) == 0.0f && g4__expf(INFINITY) == INFINITY &&
              g4__expf(88.72283935546875f) == INFINITY && g4__expf(88.72283172607422f) < INFINITY &&
              g4__expf(-104.5f) == 0.0f && g4__expf(NAN) != g4__expf(NAN),
          "exp special values");
    CHECK(g4__tanhf(INFINITY) == 1.0f && g4__tanhf(-INFINITY) == -1.0f && g4__tanhf(20.0f) == 1.0f &&
              signbit(g4__tanhf(-0.0f)) && g4__tanhf(-0.0f) == 0.0f && g4__tanhf(1e-30f) == 1e-30f &&
              g4__tanhf(NAN) != g4__tanhf(NAN),
          "tanh special values");
}

#ifdef G4_CUDA_EMULATE
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
    char desc[256], err[G4_ERROR_MAX];
    if (argc > 1) g_data = argv[1];
    if (argc > 2) g_only = argv[2];
    { /* G4_CUDA_SUITE=sized: the sanitizer-sized run (tests/cuda_device.sh, docs/cuda.md) */
        const char *sz = getenv("G4_CUDA_SUITE");
        g4i_sized = sz && strcmp(sz, "sized") == 0;
        if (sz && !g4i_sized && *sz) { printf("G4_CUDA_SUITE=%s: unknown (sized, or unset)\n", sz); return 2; }
    }
    if (g4_cuda_device_check(desc, sizeof desc, err) != G4_OK) {
        printf("no CUDA device here (%s): the CUDA tests did NOT run. Without a GPU, run make test-cuda-emu.\n", err);
        return h_no_gpu();
    }
    printf("device: %s%s\n", desc, g4i_sized ? "; the sized suite (G4_CUDA_SUITE=sized): fewer models and inputs" : "");
    if (!h_tmpdir(g_tmp, sizeof g_tmp, "cuda-test")) return 1;

#ifdef G4_CUDA_EMULATE
    /* first, while the process is small: it forks at every call, and a fork copies the page tables (after the
       other tests, under ASan, the forks took 54 s of system time instead of 6) */
    run("cuda every runtime call and launch is checked (injected failures)", test_every_cuda_call_checked);
#endif
    /* tests/invariants.h: the goldens (each layer also against the scalar CPU
       path, g4i_cpu), greedy decode, chunking, the shared-KV table, sessions,
       stale reader weights, bad input */
    g4i_run_all(&g4i_cuda, &g4i_cpu, CPU_TOL, &g_worst);
    run("cuda goldens with the plain matmul", test_golden_plain_matmul);
    run("cuda bf16-faithful mode = the CPU's, tap by tap", test_bf16_mode);
    run("cuda tiled matmul = plain matmul, bit for bit", test_tiled_equals_plain);
    run("cuda write-once-then-read checks (host and device)", test_table_checks);
    run("cuda head dims 256 and 512 = CPU", test_head_dims_256_512);
    run("cuda arenas: undersized, misaligned, NULL", test_arena_errors);
    run("cuda and CPU builds without FP contraction", test_no_contraction);
    run("exp and tanh (both sides' float32 softmax and soft-cap) correctly rounded", test_exp_tanh);
    run("cuda fast f32 = exact f32 within 4e-5 (goldens, every tap)", test_fast_goldens);
    run("cuda fast bf16 = bf16-faithful within 3e-2, greedy tokens equal", test_fast_bf16);
    run("cuda fast tensor-core GEMM = CUDA-core GEMM on the same fragments", test_fast_mma_fragments);
    run("cuda fast greedy decode: transformers generate", test_fast_greedy);
    run("cuda fast decode and chunked prefill = one-shot within tolerance", test_fast_chunking);
    run("cuda fast shared-KV table, reader copies, stale weights, bad input", test_fast_table);
    run("cuda fast sessions on one model are independent; reset", test_fast_sessions);
    run("cuda fast arenas: sizes up front, undersized, unsupported shapes", test_fast_arena);
    run("cuda fast flash-decoding: splits sized from the device or asked, = exact within 4e-5, repeatable",
        test_fast_kv_splits);
    run("cuda fast attention at long context vs float64 (1, 16, 128 splits)", test_fast_long_context);
#ifdef G4_CUDA_EMULATE
    run("cuda kernel fault: reported under its step, sticky, session unchanged", test_kernel_fault);
    run("cuda device arithmetic checked at session init (FTZ refused)", test_ieee_probe);
    run("cuda -ffast-math build refused", test_fast_math_refused);
    run("cuda every kernel ran", test_every_kernel_ran);
#endif
    remove_tree(g_tmp);
    printf("max relative difference: vs transformers %.3g (bound %.1g), vs CPU path %.3g (bound %.1g)\n",
           g_worst.golden, G4I_TOL, g_worst.ref > g_worst.ref_taps ? g_worst.ref : g_worst.ref_taps, CPU_TOL);
    printf("fast mode, max relative difference: f32 vs exact f32 %.3g in the logits (bound %.1g), %.3g in a tap (bound "
           "%.1g); bf16 vs bf16-faithful %.3g (bound %.1g)\n",
           g_fast.golden, FAST_TOL, g_fast.ref_taps, FAST_TAP_TOL, g_fast.ref, FAST_TOL_BF16);
    return finish();
}
