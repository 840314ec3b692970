/* test_vision.c - the vision tower (Gemma4VisionModel + embed_vision), the
   merge of its soft tokens into the decoder (g4_forward_mm), the image and
   video processors, against transformers 5.23.0 on the tiny models of
   tools/make_vision_goldens.py (data/vision/: e2b_mm, E2B-style with clipped
   linears and PLE; 31b_mm, 31B-style with bidirectional vision attention and
   standardize) and tools/make_video_goldens.py (26b_mm, 26B-style: a MoE
   decoder; the video cases on all three).

   Tolerances, all relative to the largest magnitude of the golden tensor:
     tower taps and soft tokens 1e-4 (float32; the tower's matmuls and attention
       sum in another order than torch's: measured below 2e-6, see the output);
     logits 1e-4 x max|logit| (the bar), end to end: our tower's soft
       tokens into our decoder (measured 4.3e-5 on e2b_mm, 4.6e-6 on 31b_mm,
       1.2e-5 on 26b_mm; with video 5.8e-5, 5.4e-6, 1.5e-5);
     pixel values (images and video frames) and ids: identical;
     the bf16 mode (g4_vision_session_config.bf16) against the tower run by
       transformers in bfloat16 (data/vision/<model>/bf16.safetensors,
       tools/make_vision_goldens.py --bf16): identical, every bit (taps, soft
       tokens of images and a video, the logits of case 0 through the bf16
       decoder, the CLI's image --bf16 and logits --bf16 --image);
     the final norm of every row 1e-4, from transformers' own soft tokens (the
       merge alone: 1.1e-5; from ours the E2B-style model's chaotic tiny decoder
       amplifies the tower's 3e-6 to 1.2e-4 on some rows, while the logits stay
       within 4.3e-5 x max|logit|).
   Usage: test_vision [DATA_DIR [GEMMA4_CLI]] [-k NAME] */
#define _POSIX_C_SOURCE 200809L /* getpid */
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include "../gemma4_processing.h"
#include "harness.h"
#include "fixtures.h"
#define G4_IMAGE_NO_CLI /* (the decoders and the pipeline, not the command) */
#include "../examples/image.h"
#include <unistd.h>

static const char *vdir(const char *name) { return path2(g_data, path2("vision", name)); }

/* data/vision/<dir>/<file> (or data/vision/<file> when dir is NULL) */
static int vgolden(golden *g, const char *dir, const char *file) {
    memset(g, 0, sizeof *g);
    if (g4__add_file(&g->m, dir ? vdir(dir) : path2(g_data, "vision"), file) != G4_OK || g4__st_finish(&g->m) != G4_OK) {
        printf("  cannot read %s/%s: %s\n", dir ? vdir(dir) : "vision", file, g->m.error);
        g4_model_free(&g->m);
        return 0;
    }
    return g->ok = 1;
}

static const int32_t *gi32(golden *g, const char *name, int64_t *numel) {
    const g4_tensor *t = g4_model_tensor(&g->m, name);
    int k;
    *numel = 0;
    if (!t || t->dtype != G4_I32) return NULL;
    *numel = 1;
    for (k = 0; k < t->ndim; k++) *numel *= t->shape[k];
    return (const int32_t *)t->data;
}

/* relative difference against the golden's largest magnitude */
static double rel_diff(const float *a, const float *gold, size_t n) {
    double m = max_abs(gold, n);
    return max_diff(a, gold, n) / (m > 0 ? m : 1.0);
}

/* ------------------------------------------------------------ taps */
typedef struct { golden *g; double worst; int compared; char worst_name[160]; } tapcmp;

static void tap_cb(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    tapcmp *tc = (tapcmp *)user;
    char key[200];
    const float *gold;
    int64_t numel;
    double d;
    (void)layer; (void)pos0;
    snprintf(key, sizeof key, "tap.%s", strncmp(name, "vision_tower.", 13) == 0 && strcmp(name, "vision_tower.") ? name + 13 : name);
    if (!(gold = golden_f32(tc->g, key, &numel))) { CHECK(0, "no golden for tap %s", name); return; }
    if (numel % cols || numel / cols > rows) { CHECK(0, "tap %s: golden %lld values, ours [%d][%d]", name, (long long)numel, rows, cols); return; }
    d = rel_diff(data, gold, (size_t)numel); /* the golden's first rows */
    CHECK(d <= 1e-4, "tap %s: relative difference %.3g", name, d);
    if (d > tc->worst) { tc->worst = d; snprintf(tc->worst_name, sizeof tc->worst_name, "%s", name); }
    tc->compared++;
}

/* one image of processor.safetensors' case c */
typedef struct { const float *pv; const int32_t *pos; int n_img, n_patches, pdim; } images;

static int case_images(golden *pg, int c, images *im) {
    char k[64];
    int64_t n, np;
    const g4_tensor *t;
    if (c == 3) return 0;
    snprintf(k, sizeof k, "pixel_values.%d", c);
    if (!(im->pv = golden_f32(pg, k, &n)) || !(t = g4_model_tensor(&pg->m, k)) || t->ndim != 3) return 0;
    im->n_img = (int)t->shape[0]; im->n_patches = (int)t->shape[1]; im->pdim = (int)t->shape[2];
    snprintf(k, sizeof k, "positions.%d", c);
    if (!(im->pos = gi32(pg, k, &np)) || np != (int64_t)im->n_img * im->n_patches * 2) return 0;
    return 1;
}

/* The soft tokens of case c (case 3: cases 0 and 1's images in turn), through the tower */
static int encode_case(g4_vision_session *vs, golden *pg, int c, float *soft, int *n_soft) {
    images im;
    int k, cases[2], n_cases = c == 3 ? 2 : 1, got;
    cases[0] = c == 3 ? 0 : c; cases[1] = 1;
    *n_soft = 0;
    for (k = 0; k < n_cases; k++) {
        int i;
        if (!case_images(pg, cases[k], &im)) { CHECK(0, "processor golden lacks case %d", cases[k]); return 0; }
        for (i = 0; i < im.n_img; i++) {
            g4_result r = g4_vision_encode(vs, im.pv + (size_t)i * im.n_patches * im.pdim, im.pos + (size_t)i * im.n_patches * 2,
                                           im.n_patches, soft + (size_t)*n_soft * vs->model->config.hidden_size, &got);
            CHECK(r == G4_OK, "g4_vision_encode: %s", vs->error);
            if (r != G4_OK) return 0;
            *n_soft += got;
        }
    }
    return 1;
}

typedef struct {
    g4_model m;
    g4_vision_session vs;
    void *varena;
    golden gold, pg;
} fixture;

/* *vs: a vision session of m for 280 patches (pool and tap as given) in a new arena *arena, to free */
static int vision_session(g4_model *m, g4_pool *pool, g4_tap_fn tap, void *tap_user, g4_vision_session *vs, void **arena) {
    g4_vision_session_config vc;
    size_t bytes;
    memset(&vc, 0, sizeof vc);
    vc.max_patches = 280;
    vc.pool = pool;
    vc.tap = tap; vc.tap_user = tap_user;
    *arena = NULL;
    if (g4_vision_session_size(m, &vc, &bytes) != G4_OK) { CHECK(0, "vision size"); return 0; }
    *arena = malloc(bytes);
    if (g4_vision_session_init(vs, m, &vc, *arena, bytes) != G4_OK) { CHECK(0, "vision init: %s", vs->error); return 0; }
    return 1;
}

static int fixture_open(fixture *f, const char *model, g4_tap_fn tap, void *tap_user) {
    memset(f, 0, sizeof *f);
    if (g4_model_load(&f->m, vdir(model)) != G4_OK) { CHECK(0, "load %s: %s", model, f->m.error); return 0; }
    CHECK(f->m.vision.loaded, "%s: vision tower not bound: %s", model, f->m.vision.error);
    if (!vgolden(&f->gold, model, "golden.safetensors") || !vgolden(&f->pg, NULL, "processor.safetensors")) {
        CHECK(0, "goldens");
        return 0;
    }
    return vision_session(&f->m, NULL, tap, tap_user, &f->vs, &f->varena);
}

static void fixture_close(fixture *f) {
    free(f->varena);
    if (f->gold.ok) g4_model_free(&f->gold.m);
    if (f->pg.ok) g4_model_free(&f->pg.m);
    g4_model_free(&f->m);
}

#define N_MODELS 3 /* 26b_mm: tools/make_video_goldens.py (MoE decoder), with these image goldens' keys */
static const char *g_models[N_MODELS] = {"e2b_mm", "31b_mm", "26b_mm"};

/* fn(f, model) on each model's fixture (no tap) */
static void each_model(void (*fn)(fixture *f, const char *model)) {
    int k;
    for (k = 0; k < N_MODELS; k++) {
        fixture f;
        if (fixture_open(&f, g_models[k], NULL, NULL)) fn(&f, g_models[k]);
        fixture_close(&f);
    }
}

/* every module output of the tower against transformers' forward hooks (case 0) */
static void test_taps(void) {
    int k;
    for (k = 0; k < N_MODELS; k++) {
        fixture f;
        tapcmp tc;
        float soft[80 * 64];
        int n_soft;
        memset(&tc, 0, sizeof tc);
        if (!fixture_open(&f, g_models[k], tap_cb, &tc)) { fixture_close(&f); continue; }
        tc.g = &f.gold;
        encode_case(&f.vs, &f.pg, 0, soft, &n_soft);
        CHECK(tc.compared == 2 + 12 * f.m.config.vision.num_hidden_layers + 1,
              "%s: %d taps compared", g_models[k], tc.compared);
        printf("  %s: %d taps, worst relative difference %.3g (%s)\n", g_models[k], tc.compared, tc.worst, tc.worst_name);
        fixture_close(&f);
    }
}

/* each case's soft tokens (get_image_features' pooler_output, concatenated) */
static void soft_tokens(fixture *f, const char *model) {
    int c;
    for (c = 0; c < 4; c++) {
        float soft[160 * 64];
        char key[32];
        int n_soft;
        int64_t numel;
        const float *gold;
        snprintf(key, sizeof key, "soft.%d", c);
        gold = golden_f32(&f->gold, key, &numel);
        if (!gold || !encode_case(&f->vs, &f->pg, c, soft, &n_soft)) { CHECK(0, "%s case %d", model, c); continue; }
        CHECK((int64_t)n_soft * f->m.config.hidden_size == numel, "%s case %d: %d soft tokens, golden %lld values", model, c,
              n_soft, (long long)numel);
        if ((int64_t)n_soft * f->m.config.hidden_size != numel) continue;
        {
            double d = rel_diff(soft, gold, (size_t)numel);
            CHECK(d <= 1e-4, "%s case %d: soft tokens differ by %.3g relative", model, c, d);
            printf("  %s case %d: %d soft tokens, relative difference %.3g\n", model, c, n_soft, d);
        }
    }
}
static void test_soft_tokens(void) { each_model(soft_tokens); }

/* logits with images: ids from the processor, soft tokens from our tower, one
   g4_forward_mm call (max_chunk as given) */
static void check_logits(fixture *f, const char *model, int c, int max_chunk, int split_calls) {
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    float soft[160 * 64], *logits;
    int n_soft, V = f->m.config.vocab_size, H = f->m.config.hidden_size, r, first_soft = 0;
    int64_t n_ids, n_rows, nl;
    char key[32];
    const int32_t *ids, *rows;
    const float *gold;
    snprintf(key, sizeof key, "ids.%d", c);
    ids = gi32(&f->pg, key, &n_ids);
    snprintf(key, sizeof key, "logit_rows.%d", c);
    rows = gi32(&f->gold, key, &n_rows);
    snprintf(key, sizeof key, "logits.%d", c);
    gold = golden_f32(&f->gold, key, &nl);
    if (!ids || !rows || !gold || !encode_case(&f->vs, &f->pg, c, soft, &n_soft)) { CHECK(0, "%s case %d goldens", model, c); return; }
    sc.max_context = 256;
    sc.max_chunk = max_chunk;
    if (g4_session_create(&s, &f->m, &sc) != G4_OK) { CHECK(0, "session: %s", s.error); return; }
    logits = (float *)malloc(sizeof(float) * (size_t)n_ids * V);
    if (split_calls) { /* the prompt in two calls, cut after the first image's block */
        int cut = 0, soft0 = 0, t;
        while (cut < n_ids && g4_mm_type(&f->m.config, ids[cut]) != G4_MM_IMAGE) cut++;
        while (cut < n_ids && g4_mm_type(&f->m.config, ids[cut]) == G4_MM_IMAGE) cut++;
        for (t = 0; t < cut; t++) soft0 += g4_mm_type(&f->m.config, ids[t]) != G4_MM_TEXT;
        r = g4_forward_mm(&s, ids, cut, soft, soft0, logits, G4_LOGITS_ALL, NULL);
        CHECK(r == G4_OK, "%s: %s", model, s.error);
        r = g4_forward_mm(&s, ids + cut, (int)n_ids - cut, soft + (size_t)soft0 * H, n_soft - soft0,
                          logits + (size_t)cut * V, G4_LOGITS_ALL, NULL);
        first_soft = soft0;
    } else {
        r = g4_forward_mm(&s, ids, (int)n_ids, soft, n_soft, logits, G4_LOGITS_ALL, NULL);
    }
    (void)first_soft;
    CHECK(r == G4_OK, "%s case %d: %s", model, c, s.error);
    if (r == G4_OK) {
        double worst = 0, mx = max_abs(gold, (size_t)nl);
        int i;
        for (i = 0; i < n_rows; i++) {
            double d = max_diff(logits + (size_t)rows[i] * V, gold + (size_t)i * V, (size_t)V);
            if (d > worst) worst = d;
        }
        CHECK(worst <= 1e-4 * mx, "%s case %d (max_chunk %d%s): logits differ by %.3g (max|logit| %.3g)", model, c, max_chunk,
              split_calls ? ", two calls" : "", worst, mx);
        printf("  %s case %d, max_chunk %d%s: %lld ids, %d soft tokens, logits within %.3g of transformers (%.2g x max|logit|)\n",
               model, c, max_chunk, split_calls ? ", two calls" : "", (long long)n_ids, n_soft, worst, worst / mx);
    }
    free(logits);
    g4_session_destroy(&s);
}

static void logits_cases(fixture *f, const char *model) {
    int c;
    for (c = 0; c < 4; c++) check_logits(f, model, c, 256, 0);
}
static void test_logits(void) { each_model(logits_cases); }

/* chunking: the E2B-style model (causal) in chunks of 16 rows; the 31B-style
   one with chunks that must end before a block (80 rows, blocks of 63/64),
   and in two calls cut after the first image */
static void test_chunks(void) {
    fixture f;
    if (fixture_open(&f, "e2b_mm", NULL, NULL)) {
        check_logits(&f, "e2b_mm", 3, 16, 0);
        check_logits(&f, "e2b_mm", 3, 16, 1);
    }
    fixture_close(&f);
    if (fixture_open(&f, "31b_mm", NULL, NULL)) {
        check_logits(&f, "31b_mm", 3, 80, 0);
        check_logits(&f, "31b_mm", 0, 70, 0);
        check_logits(&f, "31b_mm", 3, 256, 1);
    }
    fixture_close(&f);
}

/* threads split the tower's work, never change a bit */
static void test_threads(void) {
    fixture f;
    g4_pool *pool = NULL;
    g4_vision_session vs3;
    void *arena;
    float a[160 * 64], b[160 * 64];
    int na = 0, nb = 0;
    if (!fixture_open(&f, "e2b_mm", NULL, NULL)) { fixture_close(&f); return; }
    if (g4_pool_create(&pool, 3) != G4_OK) { skip("no threads in this build"); fixture_close(&f); return; }
    if (!vision_session(&f.m, pool, NULL, NULL, &vs3, &arena)) { /* (it CHECKed why) */
        free(arena);
        g4_pool_free(pool);
        fixture_close(&f);
        return;
    }
    encode_case(&f.vs, &f.pg, 3, a, &na);
    encode_case(&vs3, &f.pg, 3, b, &nb);
    CHECK(na == nb && na > 0 && memcmp(a, b, sizeof(float) * (size_t)na * f.m.config.hidden_size) == 0,
          "3 threads: %d soft tokens, one thread %d, max difference %.3g", nb, na, max_diff(a, b, (size_t)na * 32));
    free(arena);
    g4_pool_free(pool);
    fixture_close(&f);
}

/* the patches' order does not matter (attention over the real patches, pooling by
   position): a padding patch moved to the front takes the general attention loop
   instead of the decoder's kernel, and gives the same soft tokens (1e-5) */
static void test_patch_order(void) {
    fixture f;
    images im;
    static float pv[280 * 48], a[80 * 32], b[80 * 32];
    static int32_t pos[280 * 2];
    int na = 0, nb = 0, last = 279;
    if (!fixture_open(&f, "31b_mm", NULL, NULL) || !case_images(&f.pg, 0, &im)) { CHECK(0, "setup"); fixture_close(&f); return; }
    CHECK(im.pos[2 * last] == -1, "case 0 ends in padding");
    memcpy(pv, im.pv, sizeof pv);
    memcpy(pos, im.pos, sizeof pos);
    /* swap patch 0 (real) with the last (padding) */
    memcpy(pv + (size_t)last * 48, im.pv, sizeof(float) * 48);
    memcpy(pv, im.pv + (size_t)last * 48, sizeof(float) * 48);
    pos[0] = pos[1] = -1;
    pos[2 * last] = im.pos[0];
    pos[2 * last + 1] = im.pos[1];
    CHECK(g4_vision_encode(&f.vs, im.pv, im.pos, 280, a, &na) == G4_OK, "%s", f.vs.error);
    CHECK(g4_vision_encode(&f.vs, pv, pos, 280, b, &nb) == G4_OK, "%s", f.vs.error);
    CHECK(na == nb && na > 0 && rel_diff(b, a, (size_t)na * 32) <= 1e-5, "reordered: %d / %d soft tokens, relative difference %.3g",
          nb, na, rel_diff(b, a, (size_t)na * 32));
    fixture_close(&f);
}

/* the tower's fast paths against their references: g4__expf_n and
   g4__softmax_n give g4__expf's and g4__softmax's bits (g4__expf_n only in
   the builds with SIMD doubles, G4__EXPD_W: elsewhere it is g4__expf's own
   loop, nothing to compare); the GEMM attention
   (g4__vattn_gemm) gives the reference's scores bit for bit (g4__dot's order)
   and its output within 2e-6 of max |out| of the reference (g4__vattn_part:
   p V summed key by key from zero, the GEMM in VL lane chains), with one
   thread and with three */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float urand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng >> 12; g_rng ^= g_rng << 25; g_rng ^= g_rng >> 27;
    return (float)((double)((g_rng * 0x2545F4914F6CDD1Dull) >> 40) / (double)(1ull << 23)) - 1.0f;
}

static void test_fast_paths(void) {
    static float y[4096], z[4096];
#ifdef G4__EXPD_W
    static float x[4096];
    static const float special[12] = {0.0f, -0.0f, -104.0f, -103.99999f, -104.00001f, 88.72283935546875f, 88.72283f,
                                      -87.3f, 1e-30f, -1e-30f, 100.0f, -200.0f};
    uint32_t u;
    long checked = 0;
    int n;
#endif
    long bad = 0;
    int i, len, k;
    fixture f;
    g4_pool *pool = NULL;
#ifdef G4__EXPD_W
    /* exp: every 61st float in [-110, 95] (both signs), the cut-offs, NaN and infinities */
    for (n = 0, u = 0; u < 0xffffffffu - 61; u += 61) {
        float v;
        memcpy(&v, &u, 4);
        if (!(v >= -110.0f && v <= 95.0f)) continue;
        x[n++] = v;
        if (n == 4096 || u + 122 < u || u + 122 >= 0xffffffffu - 61) {
            g4__expf_n(y, x, (size_t)n);
            for (i = 0; i < n; i++) { z[i] = g4__expf(x[i]); bad += memcmp(&y[i], &z[i], 4) != 0; }
            checked += n;
            n = 0;
        }
    }
    for (i = 0; i < 12; i++) x[i] = special[i];
    x[12] = NAN; x[13] = INFINITY; x[14] = -INFINITY; x[15] = 0.5f;
    g4__expf_n(y, x, 16);
    for (i = 0; i < 16; i++) {
        z[i] = g4__expf(x[i]);
        bad += !(memcmp(&y[i], &z[i], 4) == 0 || (y[i] != y[i] && z[i] != z[i]));
    }
    checked += 16;
    CHECK(bad == 0 && checked > 1000000, "g4__expf_n: %ld of %ld differ from g4__expf", bad, checked);
    printf("  g4__expf_n = g4__expf on %ld inputs\n", checked);
#else
    printf("  g4__expf_n not compared: no SIMD doubles in this build (G4__EXPD_W), it is g4__expf's own loop\n");
#endif
    for (bad = 0, len = 1; len <= 300; len += 7) { /* softmax rows */
        for (i = 0; i < len; i++) y[i] = z[i] = 30.0f * urand();
        g4__softmax_n(y, len);
        g4__softmax(z, len);
        bad += memcmp(y, z, sizeof(float) * (size_t)len) != 0;
    }
    CHECK(bad == 0, "g4__softmax_n: %ld rows differ from g4__softmax", bad);
    /* the attention on random heads of e2b_mm's tower shapes: 280 patches, the last 37 padding */
    if (!fixture_open(&f, "e2b_mm", NULL, NULL)) { fixture_close(&f); return; }
    if (g4_pool_create(&pool, 3) != G4_OK) pool = NULL;
    for (k = 0; k < 2; k++) {
        g4_vision_session *vs = &f.vs, vs3;
        const g4_vision_config *v = &f.m.config.vision;
        int NH = v->num_attention_heads, KVH = v->num_key_value_heads, D = v->head_dim, np = 280, real = 243, t, h, c;
        size_t nq = (size_t)np * NH * D, nk = (size_t)np * KVH * D;
        static int32_t pos[280 * 2];
        float *ref = (float *)malloc(sizeof(float) * nq), *one = (float *)malloc(sizeof(float) * nq);
        g4__vattn_job aj;
        double worst = 0.0, m = 0.0;
        void *arena3 = NULL;
        long sbad = 0;
        for (i = 0; i < (int)nq; i++) vs->q[i] = 2.0f * urand();
        for (i = 0; i < (int)nk; i++) { vs->k[i] = 2.0f * urand(); vs->v[i] = urand(); }
        if (k == 1) for (i = 0; i < (int)nk; i++) vs->k[i] *= 8.0f; /* peaked softmax rows */
        for (t = 0; t < np; t++) { pos[2 * t] = t < real ? t % 17 : -1; pos[2 * t + 1] = t < real ? t / 17 : -1; }
        aj.vs = vs; aj.pos = pos; aj.n = np; aj.real = 0; /* the general loop: every key, padding masked */
        g4__vattn_part(&aj, 0, 1);
        memcpy(ref, vs->att, sizeof(float) * nq);
        g4__vattn_gemm(vs, np, real);
        memcpy(one, vs->att, sizeof(float) * nq);
        m = max_abs(ref, nq);
        worst = max_diff(one, ref, nq) / (m > 0 ? m : 1.0);
        CHECK(worst <= 2e-6, "GEMM attention (%s rows): %.3g of max |out| from the reference", k ? "peaked" : "flat", worst);
        printf("  GEMM attention, %s softmax rows: within %.2g of max |out| of the reference\n", k ? "peaked" : "flat", worst);
        /* its scores: q . k as g4__dot sums it, bit for bit (first block of head 1) */
        memset(vs->scores, 0, sizeof(float) * 4 * (size_t)real);
        h = 1 % NH;
        g4__bwd_mm(&vs->mm, vs->scores, (size_t)real, vs->q + (size_t)h * D, (size_t)NH * D,
                   (const unsigned char *)(vs->k + (size_t)(h / (NH / KVH)) * D), G4_F32, (size_t)KVH * D, 0, D, 4, real);
        for (t = 0; t < 4; t++)
            for (c = 0; c < real; c++)
                sbad += vs->scores[(size_t)t * real + c] !=
                        g4__dot(vs->q + ((size_t)t * NH + h) * D, vs->k + ((size_t)c * KVH + h / (NH / KVH)) * D, D);
        CHECK(sbad == 0, "GEMM scores: %ld of %d differ from g4__dot", sbad, 4 * real);
        if (pool && vision_session(&f.m, pool, NULL, NULL, &vs3, &arena3)) { /* three threads: the same bits as one */
            memcpy(vs3.q, vs->q, sizeof(float) * nq);
            memcpy(vs3.k, vs->k, sizeof(float) * nk);
            memcpy(vs3.v, vs->v, sizeof(float) * nk);
            g4__vattn_gemm(&vs3, np, real);
            CHECK(memcmp(vs3.att, one, sizeof(float) * nq) == 0, "GEMM attention: 3 threads differ from one");
        }
        free(arena3);
        { /* the bf16 mode: g4__attend_torch over the real keys = g4__vattn_torch over all (masked), bit for bit */
            long bbad = 0;
            for (i = 0; i < (int)nq; i++) vs->q[i] = g4__bf16_round(vs->q[i]);
            for (i = 0; i < (int)nk; i++) { vs->k[i] = g4__bf16_round(vs->k[i]); vs->v[i] = g4__bf16_round(vs->v[i]); }
            vs->cfg.bf16 = 1;
            aj.real = 0;
            g4__vattn_part(&aj, 0, 1); /* (real 0: the scalar g4__vattn_torch) */
            memcpy(ref, vs->att, sizeof(float) * nq);
            aj.real = real;
            g4__vattn_part(&aj, 0, 1);
            vs->cfg.bf16 = 0;
            for (i = 0; i < (int)nq; i++) bbad += memcmp(&ref[i], &vs->att[i], 4) != 0;
            CHECK(bbad == 0, "bf16 attention (%s rows): %ld of %zu values differ from g4__vattn_torch", k ? "peaked" : "flat",
                  bbad, nq);
            printf("  bf16 attention, %s softmax rows: %ld of %zu values differ from g4__vattn_torch\n", k ? "peaked" : "flat",
                   bbad, nq);
        }
        free(ref);
        free(one);
    }
    if (pool) g4_pool_free(pool);
    fixture_close(&f);
}

/* The bf16 attention's fast path (g4__attend_torch over the real keys) against
   its reference (g4__vattn_torch over every key, the padding masked), bit for
   bit, at the released towers' head shapes: E2B/E4B 12 heads of 64, 31B/26B
   16 heads of 72 (test_fast_paths checks the tiny fixture's). Only the
   attention runs, so e2b_mm's weights serve under another head shape: a copy
   of the model whose vision config says it, for the session's buffers. */
static void test_bf16_attention_shapes(void) {
    static const int shapes[2][2] = {{12, 64}, {16, 72}};
    static int32_t pos[280 * 2];
    int np = 280, real = 243, s, k, t;
    size_t i;
    fixture f;
    if (!fixture_open(&f, "e2b_mm", NULL, NULL)) { fixture_close(&f); return; }
    for (t = 0; t < np; t++) { pos[2 * t] = t < real ? t % 17 : -1; pos[2 * t + 1] = t < real ? t / 17 : -1; }
    for (s = 0; s < 2; s++) {
        g4_model m = f.m; /* (a shallow copy: never freed) */
        g4_vision_session vs;
        g4__vattn_job aj;
        void *arena = NULL;
        size_t nq = (size_t)np * (size_t)shapes[s][0] * (size_t)shapes[s][1];
        float *ref = (float *)malloc(sizeof(float) * nq);
        m.config.vision.num_attention_heads = m.config.vision.num_key_value_heads = shapes[s][0];
        m.config.vision.head_dim = shapes[s][1];
        if (!ref || !vision_session(&m, NULL, NULL, NULL, &vs, &arena)) { free(ref); free(arena); break; }
        vs.cfg.bf16 = 1;
        for (k = 0; k < 2; k++) { /* flat and peaked softmax rows */
            long bad = 0;
            for (i = 0; i < nq; i++) {
                vs.q[i] = g4__bf16_round(2.0f * urand());
                vs.k[i] = g4__bf16_round((k ? 16.0f : 2.0f) * urand());
                vs.v[i] = g4__bf16_round(urand());
            }
            aj.vs = &vs; aj.pos = pos; aj.n = np; aj.real = 0; /* real 0: the reference over every key */
            g4__vattn_part(&aj, 0, 1);
            memcpy(ref, vs.att, sizeof(float) * nq);
            aj.real = real;
            g4__vattn_part(&aj, 0, 1);
            for (i = 0; i < nq; i++) bad += memcmp(&ref[i], &vs.att[i], 4) != 0;
            CHECK(bad == 0, "bf16 attention, %d heads of %d (%s rows): %ld of %zu values differ from g4__vattn_torch",
                  shapes[s][0], shapes[s][1], k ? "peaked" : "flat", bad, nq);
            printf("  bf16 attention, %d heads of %d, %s softmax rows: %ld of %zu values differ from g4__vattn_torch\n",
                   shapes[s][0], shapes[s][1], k ? "peaked" : "flat", bad, nq);
        }
        free(ref);
        free(arena);
    }
    fixture_close(&f);
}

/* the final norm of case 0 (every row) */
static void test_norm_rows(void) {
    int k;
    for (k = 0; k < N_MODELS; k++) {
        fixture f;
        g4_session s;
        g4_session_config sc = g4_session_config_init();
        float soft[80 * 64], *hidden, *logits;
        int n_soft;
        int64_t n_ids, nn;
        const int32_t *ids;
        const float *gold;
        if (!fixture_open(&f, g_models[k], NULL, NULL)) { fixture_close(&f); continue; }
        ids = gi32(&f.pg, "ids.0", &n_ids);
        gold = golden_f32(&f.gold, "norm.0", &nn);
        sc.max_context = 128;
        if (!ids || !gold || !encode_case(&f.vs, &f.pg, 0, soft, &n_soft) || g4_session_create(&s, &f.m, &sc) != G4_OK) {
            CHECK(0, "setup");
            fixture_close(&f);
            continue;
        }
        hidden = (float *)malloc(sizeof(float) * (size_t)nn);
        logits = (float *)malloc(sizeof(float) * (size_t)n_ids * f.m.config.vocab_size);
        { /* the merge alone: transformers' own soft tokens */
            int64_t ns;
            const float *gsoft = golden_f32(&f.gold, "soft.0", &ns);
            CHECK(gsoft && ns == (int64_t)n_soft * f.m.config.hidden_size, "soft.0");
            if (gsoft) memcpy(soft, gsoft, sizeof(float) * (size_t)ns);
        }
        CHECK(g4_forward_mm(&s, ids, (int)n_ids, soft, n_soft, logits, G4_LOGITS_ALL, hidden) == G4_OK, "%s", s.error);
        CHECK(rel_diff(hidden, gold, (size_t)nn) <= 1e-4, "%s: final norm differs by %.3g", g_models[k], rel_diff(hidden, gold, (size_t)nn));
        printf("  %s: final norm of every row, from transformers' soft tokens: within %.3g relative\n", g_models[k],
               rel_diff(hidden, gold, (size_t)nn));
        free(hidden);
        free(logits);
        g4_session_destroy(&s);
        fixture_close(&f);
    }
}

/* bad input is an error with a message, never a crash */
static void test_errors(void) {
    fixture f;
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    float soft[160 * 64], logits[520];
    int n_soft, got;
    int64_t n_ids;
    const int32_t *ids;
    images im;
    int32_t pos[280 * 2];
    if (!fixture_open(&f, "31b_mm", NULL, NULL)) { fixture_close(&f); return; }
    ids = gi32(&f.pg, "ids.3", &n_ids);
    sc.max_context = 256;
    sc.max_chunk = 40; /* shorter than an image's block */
    if (!ids || !encode_case(&f.vs, &f.pg, 3, soft, &n_soft) || g4_session_create(&s, &f.m, &sc) != G4_OK) {
        CHECK(0, "setup");
        fixture_close(&f);
        return;
    }
    CHECK(g4_forward_mm(&s, ids, (int)n_ids, soft, n_soft - 1, logits, G4_LOGITS_LAST, NULL) == G4_ERR_INPUT &&
              strstr(s.error, "placeholder"), "count mismatch: %s", s.error);
    CHECK(g4_forward_mm(&s, ids, (int)n_ids, soft, n_soft, logits, G4_LOGITS_LAST, NULL) == G4_ERR_INPUT &&
              strstr(s.error, "max_chunk"), "block longer than max_chunk: %s", s.error);
    g4_session_reset(&s);
    { /* a call that ends inside an image block, then one that goes on with it */
        int a = 0, t;
        while (g4_mm_type(&f.m.config, ids[a]) != G4_MM_IMAGE) a++;
        for (t = 0; t < a + 5; t++) CHECK(t < a || g4_mm_type(&f.m.config, ids[t]) == G4_MM_IMAGE, "row %d", t);
        CHECK(g4_forward_mm(&s, ids, a + 5, soft, 5, logits, G4_LOGITS_LAST, NULL) == G4_OK, "%s", s.error);
        CHECK(g4_forward_mm(&s, ids + a + 5, 5, soft + 5 * 32, 5, logits, G4_LOGITS_LAST, NULL) == G4_ERR_INPUT &&
              strstr(s.error, "inside the image block"), "split block: %s", s.error);
    }
    g4_session_destroy(&s);
    /* the tower's inputs */
    if (case_images(&f.pg, 0, &im)) {
        memcpy(pos, im.pos, sizeof pos);
        CHECK(g4_vision_encode(&f.vs, im.pv, im.pos, 281, soft, &got) == G4_ERR_INPUT, "too many patches");
        CHECK(g4_vision_encode(&f.vs, im.pv, im.pos, 278, soft, &got) == G4_ERR_INPUT, "not a multiple of k^2");
        CHECK(g4_vision_encode(&f.vs, im.pv, im.pos, 0, soft, &got) == G4_ERR_INPUT, "no patches");
        pos[2 * 5] = 48; /* outside the position table */
        CHECK(g4_vision_encode(&f.vs, im.pv, pos, 280, soft, &got) == G4_ERR_INPUT && strstr(f.vs.error, "position"), "%s", f.vs.error);
        pos[2 * 5] = -3;
        CHECK(g4_vision_encode(&f.vs, im.pv, pos, 280, soft, &got) == G4_ERR_INPUT, "negative position");
        memset(pos, 0xff, sizeof pos); /* all padding */
        CHECK(g4_vision_encode(&f.vs, im.pv, pos, 280, soft, &got) == G4_ERR_INPUT, "all padding");
        CHECK(g4_vision_encode(&f.vs, NULL, im.pos, 280, soft, &got) == G4_ERR_INPUT, "NULL pixels");
    }
    fixture_close(&f);
}

/* vision_config parsing: defaults, the wrapper's ids, and refusals */
static void test_config(void) {
    g4_config c;
    const char *base = "{\"model_type\": \"gemma4\", \"image_token_id\": 7, \"audio_token_id\": null%s, "
                       "\"text_config\": {\"vocab_size\": 16, \"hidden_size\": 8, \"intermediate_size\": 8, "
                       "\"num_hidden_layers\": 1, \"num_attention_heads\": 1, \"num_key_value_heads\": 1, \"head_dim\": 8%s}, "
                       "\"vision_config\": %s}";
    char buf[2048];
    static const char *bad[][2] = {
        {"{\"head_dim\": 6}", "multiple of 4"},
        {"{\"pooling_kernel_size\": 1}", "pooling_kernel_size"},
        {"{\"rope_parameters\": {\"rope_type\": \"mrope\", \"rope_theta\": 10}}", "rope_type"},
        {"{\"num_attention_heads\": 3, \"num_key_value_heads\": 2}", "num_key_value_heads"},
        {"{\"hidden_size\": 0}", "hidden_size"},
        {"{\"standardize\": 1}", "standardize"},
        {"[1]", "vision_config"},
    };
    size_t i;
    snprintf(buf, sizeof buf, base, ", \"video_token_id\": 8", "", "{\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 50.0}}");
    CHECK(g4_config_parse(&c, buf, strlen(buf), "t") == G4_OK, "%s", c.error);
    CHECK(c.vision.present && c.vision.hidden_size == 768 && c.vision.pooling_kernel_size == 3 && c.vision.rope_theta == 50.0f &&
              c.image_token_id == 7 && c.audio_token_id == -1 && c.video_token_id == 8 && c.boi_token_id == 255999 &&
              c.bidirectional == G4_BIDIR_NONE, "parsed: present %d H %d k %d theta %g image %d audio %d",
          c.vision.present, c.vision.hidden_size, c.vision.pooling_kernel_size, c.vision.rope_theta, c.image_token_id,
          c.audio_token_id);
    snprintf(buf, sizeof buf, base, "", ", \"use_bidirectional_attention\": \"vision\"", "null");
    CHECK(g4_config_parse(&c, buf, strlen(buf), "t") == G4_OK && c.video_token_id == 258884 && !c.vision.present &&
              c.bidirectional == G4_BIDIR_VISION, "defaults (an id outside the vocabulary, as transformers allows): %s", c.error);
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char b2[2048];
        snprintf(b2, sizeof b2, "{\"model_type\": \"gemma4\", \"image_token_id\": 7, \"video_token_id\": 8, \"audio_token_id\": 9, "
                 "\"text_config\": {\"vocab_size\": 16, \"hidden_size\": 8, \"intermediate_size\": 8, \"num_hidden_layers\": 1, "
                 "\"num_attention_heads\": 1, \"num_key_value_heads\": 1, \"head_dim\": 8}, \"vision_config\": %s}", bad[i][0]);
        CHECK(g4_config_parse(&c, b2, strlen(b2), "t") == G4_ERR_CONFIG && strstr(c.error, bad[i][1]), "%s: %s", bad[i][0], c.error);
    }
    CHECK(g4_config_load(&c, path2(vdir("31b_mm"), "config.json")) == G4_OK && c.bidirectional == G4_BIDIR_VISION &&
              c.vision.standardize && !c.vision.use_clipped_linears && c.image_token_id == 513, "31b_mm: %s", c.error);
    /* a text-only config has no placeholder ids: g4_forward_mm refuses */
    CHECK(g4_config_load(&c, path2(path2(g_data, "tiny/e2b_like"), "config.json")) == G4_OK && c.image_token_id == -1 &&
              !c.vision.present, "e2b_like: image id %d", c.image_token_id);
}

/* a checkpoint with a vision_config but no tower tensors loads (text), and the tower refuses */
static void test_no_tower(void) {
    g4_model m;
    g4_vision_session_config vc;
    size_t bytes;
    if (g4_model_load(&m, tiny("e4b_like")) != G4_OK) { CHECK(0, "%s", m.error); return; }
    memset(&vc, 0, sizeof vc);
    vc.max_patches = 9;
    /* e4b_like's tiny tower has 1 layer of 16 and pooling 3: it IS bound */
    CHECK(m.vision.loaded == 1, "e4b_like tower: %s", m.vision.error);
    CHECK(g4_vision_session_size(&m, &vc, &bytes) == G4_OK && bytes > 0, "size");
    g4_model_free(&m);
    if (g4_model_load(&m, tiny("e2b_like")) != G4_OK) { CHECK(0, "%s", m.error); return; }
    CHECK(!m.vision.loaded && g4_vision_session_size(&m, &vc, &bytes) == G4_ERR_INPUT, "text-only model");
    g4_model_free(&m);
}


/* ------------------------------------------------------ image processor */

static const int g_sizes[][7] = { /* patch, k, max_soft_tokens, h, w -> get_aspect_ratio_preserving_size (transformers 5.23) */
    {4,2,70,37,50,56,72}, {4,2,70,64,64,64,64}, {4,2,70,40,60,48,80}, {4,2,70,1,1,64,64}, {4,2,70,1,1000,8,560},
    {4,2,70,1000,1,560,8}, {4,2,70,3,7000,8,560}, {4,2,70,768,1024,56,72}, {4,2,70,4000,3000,72,56},
    {4,2,70,224,224,64,64}, {4,2,70,17,5000,8,560}, {4,2,70,5000,17,560,8}, {4,2,70,2,2,64,64},
    {16,3,280,37,50,672,912}, {16,3,280,64,64,768,768}, {16,3,280,40,60,624,960}, {16,3,280,1,1,768,768},
    {16,3,280,1,1000,48,13440}, {16,3,280,1000,1,13440,48}, {16,3,280,3,7000,48,13440}, {16,3,280,768,1024,672,912},
    {16,3,280,4000,3000,912,672}, {16,3,280,224,224,768,768}, {16,3,280,17,5000,48,13440},
    {16,3,280,5000,17,13440,48}, {16,3,280,2,2,768,768}, {16,3,1120,37,50,1344,1824}, {16,3,1120,64,64,1584,1584},
    {16,3,1120,40,60,1296,1920}, {16,3,1120,1,1,1584,1584}, {16,3,1120,1,1000,48,50784}, {16,3,1120,1000,1,50784,48},
    {16,3,1120,3,7000,48,53760}, {16,3,1120,768,1024,1344,1824}, {16,3,1120,4000,3000,1824,1344},
    {16,3,1120,224,224,1584,1584}, {16,3,1120,17,5000,48,27504}, {16,3,1120,5000,17,27504,48},
    {16,3,1120,2,2,1584,1584},
};

static void test_target_sizes(void) {
    size_t i;
    for (i = 0; i < sizeof g_sizes / sizeof g_sizes[0]; i++) {
        g4_image_config ic = g4_image_config_init();
        int th = 0, tw = 0;
        ic.patch_size = g_sizes[i][0]; ic.pooling_kernel_size = g_sizes[i][1]; ic.max_soft_tokens = g_sizes[i][2];
        CHECK(g4_image_target_size(&ic, g_sizes[i][3], g_sizes[i][4], &th, &tw) == G4_OK && th == g_sizes[i][5] &&
                  tw == g_sizes[i][6], "%d %d %d: %d x %d -> %d x %d, transformers %d x %d (%s)", g_sizes[i][0], g_sizes[i][1],
              g_sizes[i][2], g_sizes[i][3], g_sizes[i][4], th, tw, g_sizes[i][5], g_sizes[i][6], ic.error);
    }
}

/* the case texts of tools/make_vision_goldens.py and their images */
static const char *g_texts[4] = {"Look at <|image|> and say", "<|image|> is square", "Alpha <|image|>: what",
                                 "First <|image|> then <|image|> end"};
static const int g_case_imgs[4][2] = {{0, -1}, {1, -1}, {2, -1}, {0, 1}};

/* image.<k> of the processor golden (I16 [h][w][c]) through g4_image_preprocess */
static int preprocess_golden_image(golden *pg, g4_image_config *ic, int k, float *pv, int32_t *pos, int *n_soft) {
    char key[32];
    const g4_tensor *t;
    uint8_t *px;
    void *scratch;
    size_t bytes, i, n;
    int ok;
    snprintf(key, sizeof key, "image.%d", k);
    t = g4_model_tensor(&pg->m, key);
    if (!t || t->dtype != G4_I16 || t->ndim != 3) return 0;
    n = (size_t)(t->shape[0] * t->shape[1] * t->shape[2]);
    px = (uint8_t *)malloc(n);
    for (i = 0; i < n; i++) px[i] = (uint8_t)((const int16_t *)t->data)[i];
    bytes = g4_image_scratch_size(ic, (int)t->shape[0], (int)t->shape[1]);
    scratch = malloc(bytes ? bytes : 1);
    ok = bytes > 0 && g4_image_preprocess(ic, px, (int)t->shape[0], (int)t->shape[1], (int)t->shape[2], scratch, bytes, pv, pos,
                                          n_soft) == G4_OK;
    free(scratch);
    free(px);
    return ok;
}

/* pixel_values and positions bit for bit, ids as Gemma4Processor's */
static void test_image_processor(void) {
    golden pg;
    g4_image_config ic;
    g4_config cfg;
    g4_tokenizer tok;
    int c;
    if (!vgolden(&pg, NULL, "processor.safetensors")) { CHECK(0, "processor golden"); return; }
    CHECK(g4_image_config_load(&ic, vdir("processor")) == G4_OK, "%s", ic.error);
    CHECK(ic.patch_size == 4 && ic.pooling_kernel_size == 2 && ic.max_soft_tokens == 70 && ic.image_seq_length == 70,
          "parsed %d %d %d %d", ic.patch_size, ic.pooling_kernel_size, ic.max_soft_tokens, ic.image_seq_length);
    CHECK(g4_config_load(&cfg, path2(vdir("e2b_mm"), "config.json")) == G4_OK, "%s", cfg.error);
    CHECK(g4_image_config_check(&ic, &cfg) == G4_OK, "%s", ic.error);
    if (g4_tokenizer_load(&tok, vdir("processor")) != G4_OK) { CHECK(0, "tokenizer: %s", tok.error); g4_model_free(&pg.m); return; }
    for (c = 0; c < 4; c++) {
        float pv[2][280 * 48];
        int32_t pos[2][280 * 2], ids[64], out[400];
        int n_soft[2], k, n_img = g_case_imgs[c][1] < 0 ? 1 : 2;
        size_t n_ids, n_out;
        int64_t ng, npos, nimg;
        char key[32];
        const float *gpv;
        const int32_t *gpos, *gids;
        for (k = 0; k < n_img; k++) {
            CHECK(preprocess_golden_image(&pg, &ic, g_case_imgs[c][k], pv[k], pos[k], &n_soft[k]), "case %d image %d: %s", c, k,
                  ic.error);
        }
        (void)nimg;
        snprintf(key, sizeof key, "pixel_values.%d", c < 3 ? c : 0);
        if (c < 3 && (gpv = golden_f32(&pg, key, &ng)) != NULL) {
            snprintf(key, sizeof key, "positions.%d", c);
            gpos = gi32(&pg, key, &npos);
            CHECK(ng == 280 * 48 && memcmp(pv[0], gpv, sizeof pv[0]) == 0, "case %d: pixel_values differ (max %.3g)", c,
                  max_diff(pv[0], gpv, (size_t)ng));
            CHECK(gpos && npos == 280 * 2 && memcmp(pos[0], gpos, sizeof pos[0]) == 0, "case %d: positions differ", c);
        }
        /* the text, tokenized, with each image's placeholder expanded */
        CHECK(g4_tokenize(&tok, g_texts[c], strlen(g_texts[c]), G4_ENCODE_ADD_SPECIAL, ids, 64, &n_ids) == G4_OK, "tokenize");
        snprintf(key, sizeof key, "ids.%d", c);
        gids = gi32(&pg, key, &ng);
        CHECK(g4_mm_expand_images(&cfg, ids, (int)n_ids, n_soft, n_img, out, 400, &n_out, cfg.error) == G4_OK, "%s", cfg.error);
        CHECK(gids && (int64_t)n_out == ng && memcmp(out, gids, sizeof(int32_t) * n_out) == 0, "case %d: ids differ (%zu, golden %lld)",
              c, n_out, (long long)ng);
        CHECK(g4_mm_expand_images(&cfg, ids, (int)n_ids, n_soft, n_img + 1, out, 400, &n_out, cfg.error) == G4_ERR_INPUT,
              "image count mismatch");
        CHECK(g4_mm_expand_images(&cfg, ids, (int)n_ids, n_soft, n_img, out, 10, &n_out, cfg.error) == G4_ERR_INPUT &&
                  n_out == (size_t)ng, "too small");
    }
    for (c = 3; c < 5; c++) { /* the shrinking image and the 6 x 200 RGBA one: their real rows */
        float pv[280 * 48];
        int32_t pos[280 * 2];
        int n_soft;
        char key[32];
        int64_t ng, np;
        const float *gpv;
        const int32_t *gpos;
        CHECK(preprocess_golden_image(&pg, &ic, c, pv, pos, &n_soft), "image %d: %s", c, ic.error);
        snprintf(key, sizeof key, "pixel_values_x.%d", c);
        gpv = golden_f32(&pg, key, &ng);
        snprintf(key, sizeof key, "positions_x.%d", c);
        gpos = gi32(&pg, key, &np);
        CHECK(gpv && gpos && ng == (int64_t)n_soft * 4 * 48 && np == (int64_t)n_soft * 4 * 2, "image %d: %d soft tokens", c, n_soft);
        if (gpv && gpos && ng <= 280 * 48 && np <= 280 * 2) {
            CHECK(memcmp(pv, gpv, sizeof(float) * (size_t)ng) == 0, "image %d: pixel_values differ (max %.3g)", c,
                  max_diff(pv, gpv, (size_t)ng));
            CHECK(memcmp(pos, gpos, sizeof(int32_t) * (size_t)np) == 0 && pos[np] == -1, "image %d: positions differ", c);
        }
    }
    g4_tokenizer_free(&tok);
    g4_model_free(&pg.m);
}

/* processor configs that g4_image_config_parse ('i') and g4_video_config_parse ('v') refuse,
   and the field each message names */
static const struct {
    char kind;
    const char *json, *field;
} g_bad_configs[] = {
    {'i', "{\"image_processor\": {\"max_soft_tokens\": 100}}", "max_soft_tokens"},
    {'i', "{\"image_processor\": {\"do_normalize\": true}}", "do_normalize"},
    {'i', "{\"image_processor\": {\"resample\": 2}}", "resample"},
    {'i', "{\"image_processor\": {\"patch_size\": 0}}", "patch_size"},
    {'i', "{\"image_processor\": {\"patch_size\": \"16\"}}", "patch_size"},
    {'i', "{\"image_processor\": []}", "image_processor"},
    {'i', "{\"pooling_kernel_size\": 65}", "pooling_kernel_size"},
    {'i', "[]", "top level"},
    {'i', "{\"image_processor\": {", "processor_config"},
    {'v', "{\"video_processor\": {\"max_soft_tokens\": 100}}", "max_soft_tokens"},
    {'v', "{\"video_processor\": {\"resample\": 2}}", "resample"},
    {'v', "{\"video_processor\": {\"image_std\": [1, 0, 1]}}", "image_std"},
    {'v', "{\"video_processor\": {\"image_mean\": [0.5, 0.5]}}", "image_mean"},
    {'v', "{\"video_processor\": {\"num_frames\": 2.5}}", "num_frames"},
    {'v', "{\"video_processor\": {\"num_frames\": 0}}", "num_frames"},
    {'v', "{\"video_processor\": {\"fps\": \"x\"}}", "fps"},
    {'v', "{\"video_processor\": {\"do_normalize\": 1}}", "do_normalize"},
    {'v', "{\"video_processor\": 3}", "video_processor"},
    {'v', "[]", "top level"},
};

/* processor_config.json: what is refused, and a processor that contradicts the model */
static void test_image_config(void) {
    g4_image_config ic;
    g4_config cfg;
    size_t i;
    uint8_t px[12] = {0};
    float pv[4];
    int32_t pos[2];
    int n, th, tw;
    for (i = 0; i < sizeof g_bad_configs / sizeof g_bad_configs[0]; i++)
        if (g_bad_configs[i].kind == 'i')
            CHECK(g4_image_config_parse(&ic, g_bad_configs[i].json, strlen(g_bad_configs[i].json), "processor_config.json") !=
                          G4_OK && strstr(ic.error, g_bad_configs[i].field), "%s: %s", g_bad_configs[i].json, ic.error);
    CHECK(g4_image_config_parse(&ic, "{\"patch_size\": 14, \"max_soft_tokens\": 560}", 42, "preprocessor_config.json") == G4_OK &&
              ic.patch_size == 14 && ic.max_soft_tokens == 560 && ic.pooling_kernel_size == 3, "flat form: %s", ic.error);
    CHECK(g4_config_load(&cfg, path2(vdir("31b_mm"), "config.json")) == G4_OK, "%s", cfg.error);
    CHECK(g4_image_config_check(&ic, &cfg) == G4_ERR_CONFIG && strstr(ic.error, "contradict"), "%s", ic.error);
    ic.patch_size = 4; ic.pooling_kernel_size = 2;
    CHECK(g4_image_config_check(&ic, &cfg) == G4_OK, "%s", ic.error);
    ic = g4_image_config_init();
    CHECK(g4_image_target_size(&ic, 0, 5, &th, &tw) == G4_ERR_INPUT, "zero height");
    CHECK(g4_image_target_size(&ic, 40000, 5, &th, &tw) == G4_ERR_INPUT, "huge height");
    CHECK(g4_image_target_size(&ic, 20000, 20000, &th, &tw) == G4_ERR_INPUT, "huge area");
    CHECK(g4_image_scratch_size(&ic, 0, 0) == 0, "scratch of nothing");
    CHECK(g4_image_preprocess(&ic, px, 2, 2, 2, NULL, 0, pv, pos, &n) == G4_ERR_INPUT && strstr(ic.error, "channels"), "%s", ic.error);
    CHECK(g4_image_preprocess(&ic, px, 2, 2, 3, px, 1, pv, pos, &n) == G4_ERR_ARENA, "scratch too small");
}

/* the CLI's decoders (libpng, libjpeg) give the pixels PIL gives; a file through
   decoding, the processor and the tower gives transformers' soft tokens */
static void test_image_files(void) {
    golden pg;
    fixture f;
    uint8_t *px = NULL;
    int h, w, ch, k;
    int64_t n;
    const g4_tensor *t;
    if (!vgolden(&pg, NULL, "processor.safetensors")) { CHECK(0, "golden"); return; }
    for (k = 0; k < 3; k++) {
        static const char *files[3] = {"images/a.png", "images/c.png", "images/a.jpg"};
        static const char *keys[3] = {"image.0", "image.2", "jpeg_pixels.a"};
        size_t i, bad = 0;
        t = g4_model_tensor(&pg.m, keys[k]);
        if (g4img_read(vdir(files[k]), &px, &h, &w, &ch) != 0 || !t) { CHECK(0, "%s", files[k]); continue; }
        n = (int64_t)h * w * ch;
        CHECK(t->ndim == 3 && t->shape[0] == h && t->shape[1] == w && t->shape[2] == ch, "%s: %d x %d x %d", files[k], h, w, ch);
        if (t->ndim == 3 && t->shape[0] * t->shape[1] * t->shape[2] == n)
            for (i = 0; i < (size_t)n; i++) bad += px[i] != (uint8_t)((const int16_t *)t->data)[i];
        CHECK(bad == 0, "%s: %zu of %lld values differ from PIL's", files[k], bad, (long long)n);
        free(px);
        px = NULL;
    }
    CHECK(g4img_read(vdir("processor/processor_config.json"), &px, &h, &w, &ch) == 1 && !px, "not an image");
    CHECK(g4img_read(vdir("nonexistent.png"), &px, &h, &w, &ch) == 1, "missing file");
    { /* truncated files are errors, as PIL's */
        static const char *files[2] = {"images/a.png", "images/a.jpg"};
        for (k = 0; k < 2; k++) {
            FILE *in = fopen(vdir(files[k]), "rb"), *out;
            char buf[4096], tmp[64];
            size_t got = in ? fread(buf, 1, sizeof buf, in) : 0;
            snprintf(tmp, sizeof tmp, "/tmp/g4_trunc_%d_%d%s", (int)getpid(), k, k ? ".jpg" : ".png");
            if (in) fclose(in);
            if ((out = fopen(tmp, "wb")) != NULL) { fwrite(buf, 1, got / 2, out); fclose(out); }
            CHECK(got > 100 && g4img_read(tmp, &px, &h, &w, &ch) == 1 && !px, "%s cut in half", files[k]);
            remove(tmp);
        }
    }
    g4_model_free(&pg.m);
    if (fixture_open(&f, "e2b_mm", NULL, NULL)) {
        g4img_ctx c;
        float soft[80 * 32];
        int n_soft = 0;
        int64_t ng;
        const float *gold = golden_f32(&f.gold, "soft.0", &ng);
        CHECK(g4img_open(&c, &f.m, vdir("e2b_mm"), NULL, 0) == 1, "e2b_mm has no processor_config.json of its own: defaults, "
              "which contradict its patch_size");
        if (g4img_open(&c, &f.m, vdir("processor"), NULL, 0) == 0) {
            CHECK(g4img_encode_file(&c, vdir("images/a.png"), soft, &n_soft, 32) == 0 && gold && (int64_t)n_soft * 32 == ng &&
                      rel_diff(soft, gold, (size_t)ng) <= 1e-4, "a.png: %d soft tokens", n_soft);
            { /* a prompt with an image file: the processor's ids, then transformers' logits */
                static const char *files[1];
                int32_t raw[16], *ids = NULL;
                int n_ids = 0, n_raw, ns = 0, i;
                int64_t ngi, nr, nl;
                float *s_soft = NULL;
                const int32_t *gids = gi32(&f.pg, "ids.0", &ngi), *rows = gi32(&f.gold, "logit_rows.0", &nr);
                const float *glog = golden_f32(&f.gold, "logits.0", &nl);
                files[0] = vdir("images/a.png");
                /* ids.0 with its image run collapsed to one placeholder: the tokenized text */
                for (i = 0, n_ids = 0; gids && i < ngi && n_ids < 16; i++)
                    if (gids[i] != f.m.config.boi_token_id && gids[i] != f.m.config.eoi_token_id &&
                        (gids[i] != f.m.config.image_token_id || gids[i - 1] != f.m.config.image_token_id))
                        raw[n_ids++] = gids[i];
                n_raw = n_ids;
                CHECK(g4img_prompt(&c, &f.m, raw, n_raw, files, 1, &ids, &n_ids, &s_soft, &ns) == 0 && n_ids == ngi &&
                          memcmp(ids, gids, sizeof(int32_t) * (size_t)ngi) == 0, "expanded ids: %d (golden %lld)", n_ids,
                      (long long)ngi);
                if (ids && rows && glog && n_ids == ngi) {
                    g4_session s;
                    g4_session_config sc = g4_session_config_init();
                    float *logits = (float *)malloc(sizeof(float) * (size_t)n_ids * 520);
                    sc.max_context = 128;
                    CHECK(g4_session_create(&s, &f.m, &sc) == G4_OK &&
                              g4_forward_mm(&s, ids, n_ids, s_soft, ns, logits, G4_LOGITS_ALL, NULL) == G4_OK, "%s", s.error);
                    for (i = 0; i < nr; i++)
                        CHECK(max_diff(logits + (size_t)rows[i] * 520, glog + (size_t)i * 520, 520) <= 1e-4 * max_abs(glog, (size_t)nl),
                              "file to logits, row %d", rows[i]);
                    free(logits);
                    g4_session_destroy(&s);
                }
                free(ids);
                free(s_soft);
                /* a placeholder without its image file: an error, and nothing allocated */
                CHECK(g4img_prompt(&c, &f.m, raw, n_raw, files, 0, &ids, &n_ids, &s_soft, &ns) == 1 && !ids && !s_soft,
                      "a placeholder and no image");
            }
            g4img_close(&c);
        } else CHECK(0, "g4img_open");
    }
    fixture_close(&f);
}

/* gemma4 logits --image: the file, the processor's expansion of the ids' one
   placeholder, the tower and the merge give transformers' logits; a
   placeholder count that differs from the images is an error (exit 1) */
/* ------------------------------------------------------------ video */
/* tools/make_video_goldens.py: data/vision/video.safetensors (the processor),
   video_cases.txt (sampling and stamps), <model>/video.safetensors (soft
   tokens and logits). Case v0: "Watch <|video|> and tell", video 0 (8 frames
   of 18 x 26 at 0.08 fps) sampled with num_frames 3 (frames 0, 2, 5 at 00:00,
   00:25, 01:02); v1: "<|image|> and <|video|> end", image 1 and frames 1 and 7
   passed pre-sampled (do_sample_frames false, fps unknown: 24). */
typedef struct { const char *key, *text; int sample, n_frames, frames[3], image; double fps; } vcase;
static const vcase g_vcases[2] = {{"v0", "Watch <|video|> and tell", 1, 3, {0, 2, 5}, -1, 0.08},
                                  {"v1", "<|image|> and <|video|> end", 0, 2, {1, 7, 0}, 1, 0.0}};

typedef struct {
    int n_frames, n_soft, max_patches;  /* n_soft: per frame */
    float *pv;                          /* [n_frames][max_patches][48] */
    int32_t *pos;                       /* [n_frames][max_patches][2] */
} vframes;

/* The golden video's frames `idx` through g4_video_preprocess; checked bit for
   bit against pixel_values.<key> (real rows; the rest zero padding at (-1, -1)) */
static int video_frames(golden *vg, g4_video_config *vc, const int *idx, int n, const char *key, vframes *out) {
    const g4_tensor *t = g4_model_tensor(&vg->m, "video.0");
    char k[32];
    const float *gpv;
    const int32_t *gpos;
    int64_t ng, np;
    uint8_t *frames;
    void *scratch;
    size_t fpx, bytes, i, P = 48;
    int f, ok = 1, real;
    memset(out, 0, sizeof *out);
    if (!t || t->dtype != G4_I16 || t->ndim != 4) { CHECK(0, "video.0"); return 0; }
    fpx = (size_t)(t->shape[1] * t->shape[2] * t->shape[3]);
    frames = (uint8_t *)malloc(fpx * (size_t)n);
    for (f = 0; f < n; f++)
        for (i = 0; i < fpx; i++) frames[(size_t)f * fpx + i] = (uint8_t)((const int16_t *)t->data)[(size_t)idx[f] * fpx + i];
    out->n_frames = n;
    out->max_patches = vc->max_soft_tokens * vc->pooling_kernel_size * vc->pooling_kernel_size;
    out->pv = (float *)malloc(sizeof(float) * (size_t)n * out->max_patches * P);
    out->pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)n * out->max_patches * 2);
    bytes = g4_video_scratch_size(vc, (int)t->shape[1], (int)t->shape[2]);
    scratch = malloc(bytes ? bytes : 1);
    if (!bytes || g4_video_preprocess(vc, frames, n, (int)t->shape[1], (int)t->shape[2], (int)t->shape[3], scratch, bytes, out->pv,
                                      out->pos, &out->n_soft) != G4_OK) {
        CHECK(0, "%s: g4_video_preprocess: %s", key, vc->error);
        ok = 0;
    }
    free(scratch);
    free(frames);
    if (!ok) return 0;
    snprintf(k, sizeof k, "pixel_values.%s", key);
    gpv = golden_f32(vg, k, &ng);
    snprintf(k, sizeof k, "positions.%s", key);
    gpos = gi32(vg, k, &np);
    real = out->n_soft * vc->pooling_kernel_size * vc->pooling_kernel_size;
    if (!gpv || !gpos || ng != (int64_t)n * real * (int64_t)P || np != (int64_t)n * real * 2) {
        CHECK(0, "%s: %d frames of %d patches, golden %lld values", key, n, real, (long long)ng);
        return 0;
    }
    for (f = 0; f < n; f++) {
        const float *pv = out->pv + (size_t)f * out->max_patches * P;
        const int32_t *pos = out->pos + (size_t)f * out->max_patches * 2;
        int pad_ok = 1;
        for (i = (size_t)real * P; i < (size_t)out->max_patches * P; i++) pad_ok &= pv[i] == 0.0f;
        for (i = (size_t)real * 2; i < (size_t)out->max_patches * 2; i++) pad_ok &= pos[i] == -1;
        CHECK(memcmp(pv, gpv + (size_t)f * real * P, sizeof(float) * (size_t)real * P) == 0,
              "%s frame %d: pixel_values differ (max %.3g)", key, f, max_diff(pv, gpv + (size_t)f * real * P, (size_t)real * P));
        CHECK(memcmp(pos, gpos + (size_t)f * real * 2, sizeof(int32_t) * (size_t)real * 2) == 0 && pad_ok,
              "%s frame %d: positions or padding differ", key, f);
    }
    return 1;
}

static void vframes_free(vframes *v) { free(v->pv); free(v->pos); }

static int video_config(g4_video_config *vc) {
    if (g4_video_config_load(vc, vdir("processor")) != G4_OK) { CHECK(0, "video config: %s", vc->error); return 0; }
    return 1;
}

/* a case's frames as the processor keeps them (v0: sampled) */
static int vcase_frames(golden *vg, const vcase *vcs, vframes *out) {
    g4_video_config vc;
    int idx[8], n = 0, k;
    if (!video_config(&vc)) return 0;
    if (vcs->sample) {
        vc.num_frames = vcs->n_frames;
        CHECK(g4_video_sample_frames(&vc, 8, vcs->fps, idx, 8, &n) == G4_OK, "%s", vc.error);
        for (k = 0; k < vcs->n_frames; k++) CHECK(n == vcs->n_frames && idx[k] == vcs->frames[k], "%s: sampled frame %d", vcs->key, k);
    } else {
        vc.do_sample_frames = 0;
        for (k = 0; k < vcs->n_frames; k++) idx[k] = vcs->frames[k];
        n = vcs->n_frames;
    }
    return video_frames(vg, &vc, idx, n, vcs->key, out);
}

/* the text expanded, tokenized, its images expanded: input_ids as Gemma4Processor's */
static int vcase_ids(const g4_tokenizer *tok, const g4_config *cfg, golden *pg, const vcase *vcs, int n_soft_frame,
                     int32_t *out, size_t cap, size_t *n_out) {
    char text[20000];
    size_t n_text, n_ids;
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * cap);
    g4_video_item it;
    char err[G4_ERROR_MAX] = "";
    int ok = 1, n_img_soft = 0;
    memset(&it, 0, sizeof it);
    it.n_frames = vcs->n_frames; it.n_soft = n_soft_frame; it.frame_indices = vcs->frames; it.fps = vcs->fps;
    if (g4_mm_expand_videos(tok, cfg, vcs->text, strlen(vcs->text), &it, 1, text, sizeof text, &n_text, err) != G4_OK ||
        g4_tokenize(tok, text, n_text, G4_ENCODE_ADD_SPECIAL, ids, cap, &n_ids) != G4_OK) {
        CHECK(0, "%s: expand or tokenize: %s", vcs->key, err);
        ok = 0;
    } else if (vcs->image >= 0) {
        g4_image_config ic;
        float *pv = (float *)malloc(sizeof(float) * 280 * 48);
        int32_t pos[280 * 2];
        g4_config c2 = *cfg;
        CHECK(g4_image_config_load(&ic, vdir("processor")) == G4_OK, "%s", ic.error);
        ok = preprocess_golden_image(pg, &ic, vcs->image, pv, pos, &n_img_soft) &&
             g4_mm_expand_images(&c2, ids, (int)n_ids, &n_img_soft, 1, out, cap, n_out, c2.error) == G4_OK;
        CHECK(ok, "%s: image: %s %s", vcs->key, ic.error, c2.error);
        free(pv);
    } else {
        memcpy(out, ids, sizeof(int32_t) * n_ids);
        *n_out = n_ids;
    }
    free(ids);
    return ok;
}

/* pixel_values_videos bit for bit, the sampled frames, ids and mm_token_type_ids as Gemma4Processor's */
static void test_video_processor(void) {
    golden vg, pg;
    g4_tokenizer tok;
    g4_config cfg;
    g4_video_config vc;
    int c;
    if (!vgolden(&vg, NULL, "video.safetensors") || !vgolden(&pg, NULL, "processor.safetensors")) { CHECK(0, "goldens"); return; }
    if (!video_config(&vc)) return;
    CHECK(vc.patch_size == 4 && vc.pooling_kernel_size == 2 && vc.max_soft_tokens == 70 && vc.num_frames == 32 && vc.do_normalize &&
              vc.do_sample_frames && vc.rescale_factor == 1.0 / 255.0 && vc.image_std[2] == 1.0f && vc.image_mean[0] == 0.0f,
          "parsed %d %d %d %d", vc.patch_size, vc.pooling_kernel_size, vc.max_soft_tokens, vc.num_frames);
    CHECK(g4_config_load(&cfg, path2(vdir("31b_mm"), "config.json")) == G4_OK, "%s", cfg.error);
    CHECK(g4_video_config_check(&vc, &cfg) == G4_OK, "%s", vc.error);
    if (g4_tokenizer_load(&tok, vdir("processor")) != G4_OK) { CHECK(0, "tokenizer: %s", tok.error); return; }
    for (c = 0; c < 2; c++) {
        vframes vf;
        int32_t ids[400];
        size_t n_ids = 0;
        int64_t ng, nt;
        const int32_t *gids, *gtypes;
        char key[32];
        if (!vcase_frames(&vg, &g_vcases[c], &vf)) continue;
        CHECK(vf.n_soft == 60, "%s: %d soft tokens a frame", g_vcases[c].key, vf.n_soft);
        snprintf(key, sizeof key, "ids.%s", g_vcases[c].key);
        gids = gi32(&vg, key, &ng);
        snprintf(key, sizeof key, "mm_types.%s", g_vcases[c].key);
        gtypes = gi32(&vg, key, &nt);
        if (vcase_ids(&tok, &cfg, &pg, &g_vcases[c], vf.n_soft, ids, 400, &n_ids)) {
            size_t t;
            int types_ok = 1;
            CHECK(gids && (int64_t)n_ids == ng && memcmp(ids, gids, sizeof(int32_t) * n_ids) == 0, "%s: ids differ (%zu, golden %lld)",
                  g_vcases[c].key, n_ids, (long long)ng);
            for (t = 0; gtypes && nt == ng && t < n_ids; t++) types_ok &= g4_mm_type(&cfg, ids[t]) == gtypes[t];
            CHECK(gtypes && nt == ng && types_ok, "%s: mm_token_type_ids differ", g_vcases[c].key);
        }
        vframes_free(&vf);
    }
    { /* another normalisation: mean and std per channel, fused with the rescale */
        static const int idx[1] = {3};
        vframes vf;
        vc.do_sample_frames = 0;
        vc.image_mean[0] = 0.5f; vc.image_mean[1] = 0.4f; vc.image_mean[2] = 0.3f;
        vc.image_std[0] = 0.2f; vc.image_std[1] = 0.25f; vc.image_std[2] = 0.3f;
        if (video_frames(&vg, &vc, idx, 1, "n", &vf)) vframes_free(&vf);
    }
    g4_tokenizer_free(&tok);
    g4_model_free(&vg.m);
    g4_model_free(&pg.m);
}

/* video_cases.txt: sample_frames and replace_video_token's stamps on edge cases */
static void test_video_cases(void) {
    FILE *fp = fopen(vdir("video_cases.txt"), "r");
    char line[4096];
    g4_tokenizer tok;
    g4_config cfg;
    int n_sample = 0, n_stamp = 0;
    if (!fp) { CHECK(0, "video_cases.txt"); return; }
    if (g4_tokenizer_load(&tok, vdir("processor")) != G4_OK) { CHECK(0, "tokenizer: %s", tok.error); fclose(fp); return; }
    CHECK(g4_config_load(&cfg, path2(vdir("e2b_mm"), "config.json")) == G4_OK, "%s", cfg.error);
    while (fgets(line, sizeof line, fp)) {
        char *colon = strstr(line, " : "), *p;
        if (line[0] == '#' || !colon) continue;
        *colon = 0;
        colon += 3;
        colon[strcspn(colon, "\n")] = 0;
        if (!strncmp(line, "sample ", 7)) {
            g4_video_config vc = g4_video_config_init();
            int total, nf, idx[64], n = 0, k, ok = 1;
            double vfps, fps;
            g4_result r;
            if (sscanf(line + 7, "%d %lf %d %lf", &total, &vfps, &nf, &fps) != 4) { CHECK(0, "bad line %s", line); continue; }
            vc.num_frames = nf; vc.fps = fps;
            r = g4_video_sample_frames(&vc, total, vfps, idx, 64, &n);
            if (!strcmp(colon, "error")) {
                CHECK(r == G4_ERR_INPUT && vc.error[0], "sample %s: transformers refuses, gemma4.h gave %d frames", line + 7, n);
            } else {
                for (p = colon, k = 0; r == G4_OK && *p; k++) {
                    long v = strtol(p, &p, 10);
                    ok &= k < n && idx[k] == v;
                    while (*p == ' ') p++;
                }
                CHECK(r == G4_OK && ok && k == n, "sample %s: %d frames (%s), transformers %s", line + 7, n, vc.error, colon);
            }
            n_sample++;
        } else if (!strncmp(line, "stamp ", 6)) {
            g4_video_item it;
            int idx[16], n = 0;
            double fps;
            char want[4096], got[4096], *w = want, unit[64];
            size_t n_got;
            const char *q;
            p = line + 6;
            fps = strtod(p, &p);
            while (*p == ' ' && n < 16) { idx[n++] = (int)strtol(p, &p, 10); while (*p == ' ' && p[1] == 0) p++; }
            snprintf(unit, sizeof unit, "%.*s%.*s%.*s", (int)tok.text_len[cfg.boi_token_id], tok.text + tok.text_off[cfg.boi_token_id],
                     (int)tok.text_len[cfg.video_token_id], tok.text + tok.text_off[cfg.video_token_id],
                     (int)tok.text_len[cfg.eoi_token_id], tok.text + tok.text_off[cfg.eoi_token_id]);
            for (q = colon; *q && w < want + sizeof want - 64; q++) { /* '|' stands for a frame's run of one soft token */
                if (*q == '|') { strcpy(w, unit); w += strlen(unit); } else *w++ = *q;
            }
            *w = 0;
            memset(&it, 0, sizeof it);
            it.n_frames = n; it.n_soft = 1; it.frame_indices = idx; it.fps = fps;
            CHECK(g4_mm_expand_videos(&tok, &cfg, "<|video|>", 9, &it, 1, got, sizeof got, &n_got, cfg.error) == G4_OK &&
                      !strcmp(got, want) && n_got == strlen(want), "stamp %s: \"%s\", transformers \"%s\" (%s)", line + 6, got, want, cfg.error);
            n_stamp++;
        }
    }
    fclose(fp);
    CHECK(n_sample == 17 && n_stamp == 7, "%d sample and %d stamp lines", n_sample, n_stamp);
    g4_tokenizer_free(&tok);
}

/* soft tokens (get_image_features + get_video_features, in prompt order) and
   logits against transformers, from our processor's frames through our tower
   and decoder; chunked too (a frame's block must end a step) */
static void test_video_logits(void) {
    golden vpg;
    g4_tokenizer tok;
    int k, c;
    if (!vgolden(&vpg, NULL, "video.safetensors")) { CHECK(0, "video golden"); return; }
    if (g4_tokenizer_load(&tok, vdir("processor")) != G4_OK) { CHECK(0, "tokenizer: %s", tok.error); g4_model_free(&vpg.m); return; }
    for (k = 0; k < N_MODELS; k++) {
        fixture f;
        golden vg;
        if (!fixture_open(&f, g_models[k], NULL, NULL)) { fixture_close(&f); continue; }
        if (!vgolden(&vg, g_models[k], "video.safetensors")) { CHECK(0, "%s video golden", g_models[k]); fixture_close(&f); continue; }
        for (c = 0; c < 2; c++) {
            const vcase *vcs = &g_vcases[c];
            vframes vf;
            int32_t ids[400];
            size_t n_ids;
            int H = f.m.config.hidden_size, V = f.m.config.vocab_size, n_soft = 0, got, chunk;
            float *soft = (float *)malloc(sizeof(float) * 400 * (size_t)H), *logits = (float *)malloc(sizeof(float) * 400 * (size_t)V);
            char key[32];
            int64_t ng, nr, nl;
            const float *gsoft, *glog;
            const int32_t *rows;
            snprintf(key, sizeof key, "soft.%s", vcs->key);
            gsoft = golden_f32(&vg, key, &ng);
            snprintf(key, sizeof key, "logits.%s", vcs->key);
            glog = golden_f32(&vg, key, &nl);
            snprintf(key, sizeof key, "logit_rows.%s", vcs->key);
            rows = gi32(&vg, key, &nr);
            if (!gsoft || !glog || !rows || !vcase_frames(&vpg, vcs, &vf)) { CHECK(0, "%s %s goldens", g_models[k], vcs->key); goto next; }
            if (!vcase_ids(&tok, &f.m.config, &f.pg, vcs, vf.n_soft, ids, 400, &n_ids)) goto next_vf;
            if (vcs->image >= 0) { /* the image first: it comes first in the prompt */
                g4_image_config ic;
                float *pv = (float *)malloc(sizeof(float) * 280 * 48);
                int32_t pos[280 * 2];
                int n_img;
                CHECK(g4_image_config_load(&ic, vdir("processor")) == G4_OK, "%s", ic.error);
                if (preprocess_golden_image(&f.pg, &ic, vcs->image, pv, pos, &n_img))
                    CHECK(g4_vision_encode(&f.vs, pv, pos, 280, soft, &n_soft) == G4_OK, "%s", f.vs.error);
                free(pv);
            }
            CHECK(g4_video_encode(&f.vs, vf.pv, vf.pos, vf.n_frames, vf.max_patches, soft + (size_t)n_soft * H, &got) == G4_OK &&
                      got == vf.n_frames * vf.n_soft, "%s %s: g4_video_encode: %s (%d soft tokens)", g_models[k], vcs->key, f.vs.error, got);
            n_soft += got;
            if ((int64_t)n_soft * H != ng) { CHECK(0, "%s %s: %d soft tokens, golden %lld values", g_models[k], vcs->key, n_soft, (long long)ng); goto next_vf; }
            {
                double d = rel_diff(soft, gsoft, (size_t)ng);
                CHECK(d <= 1e-4, "%s %s: soft tokens differ by %.3g relative", g_models[k], vcs->key, d);
                printf("  %s %s: %d soft tokens (%d frames), relative difference %.3g\n", g_models[k], vcs->key, n_soft, vf.n_frames, d);
            }
            for (chunk = 0; chunk < 2; chunk++) {
                g4_session s;
                g4_session_config sc = g4_session_config_init();
                double worst = 0, mx = max_abs(glog, (size_t)nl);
                int i;
                sc.max_context = 256;
                sc.max_chunk = chunk ? (f.m.config.bidirectional == G4_BIDIR_VISION ? 70 : 16) : 256;
                if (g4_session_create(&s, &f.m, &sc) != G4_OK) { CHECK(0, "session: %s", s.error); continue; }
                if (g4_forward_mm(&s, ids, (int)n_ids, soft, n_soft, logits, G4_LOGITS_ALL, NULL) != G4_OK) {
                    CHECK(0, "%s %s: %s", g_models[k], vcs->key, s.error);
                } else {
                    for (i = 0; i < nr; i++) {
                        double d = max_diff(logits + (size_t)rows[i] * V, glog + (size_t)i * V, (size_t)V);
                        if (d > worst) worst = d;
                    }
                    CHECK(worst <= 1e-4 * mx, "%s %s (max_chunk %d): logits differ by %.3g (max|logit| %.3g)", g_models[k], vcs->key,
                          sc.max_chunk, worst, mx);
                    printf("  %s %s, max_chunk %d: %zu ids, logits within %.3g of transformers (%.2g x max|logit|)\n", g_models[k],
                           vcs->key, sc.max_chunk, n_ids, worst, worst / mx);
                }
                g4_session_destroy(&s);
            }
        next_vf:
            vframes_free(&vf);
        next:
            free(soft);
            free(logits);
        }
        g4_model_free(&vg.m);
        fixture_close(&f);
    }
    g4_tokenizer_free(&tok);
    g4_model_free(&vpg.m);
}

/* bad video input is an error with a message, never a crash */
static void test_video_errors(void) {
    g4_video_config vc;
    g4_config cfg;
    g4_tokenizer tok;
    uint8_t frames[2 * 18 * 26 * 4];
    float *pv = (float *)malloc(sizeof(float) * 2 * 280 * 48);
    int32_t pos[2 * 280 * 2], idx[8];
    void *scratch;
    size_t i, bytes, n_out;
    int n, n_soft;
    char text[4096];
    g4_video_item it;
    for (i = 0; i < sizeof g_bad_configs / sizeof g_bad_configs[0]; i++)
        if (g_bad_configs[i].kind == 'v')
            CHECK(g4_video_config_parse(&vc, g_bad_configs[i].json, strlen(g_bad_configs[i].json), "p.json") == G4_ERR_CONFIG &&
                      strstr(vc.error, g_bad_configs[i].field), "%s: %s", g_bad_configs[i].json, vc.error);
    {
        const char *ok = "{\"video_processor\": {\"num_frames\": null, \"fps\": 2, \"image_mean\": 0.25, \"rescale_factor\": 0.5}}";
        CHECK(g4_video_config_parse(&vc, ok, strlen(ok), "p.json") == G4_OK && vc.num_frames == 0 && vc.fps == 2.0 &&
                  vc.image_mean[2] == 0.25f && vc.rescale_factor == 0.5, "null num_frames, scalar mean: %s", vc.error);
    }
    vc = g4_video_config_init(); /* patch 16, k 3: contradicts the tiny models' 4, 2 */
    CHECK(g4_config_load(&cfg, path2(vdir("e2b_mm"), "config.json")) == G4_OK, "%s", cfg.error);
    CHECK(g4_video_config_check(&vc, &cfg) == G4_ERR_CONFIG && strstr(vc.error, "contradict"), "%s", vc.error);
    /* sampling */
    vc.num_frames = 9;
    CHECK(g4_video_sample_frames(&vc, 8, 1.0, idx, 8, &n) == G4_ERR_INPUT && strstr(vc.error, "from a video of 8"), "%s", vc.error);
    vc.num_frames = 4;
    CHECK(g4_video_sample_frames(&vc, 8, 1.0, idx, 3, &n) == G4_ERR_INPUT && strstr(vc.error, "cap"), "cap: %s", vc.error);
    CHECK(g4_video_sample_frames(&vc, 0, 1.0, idx, 8, &n) == G4_ERR_INPUT, "no frames");
    vc.fps = 1.0;
    CHECK(g4_video_sample_frames(&vc, 8, 1.0, idx, 8, &n) == G4_ERR_INPUT && strstr(vc.error, "both"), "%s", vc.error);
    vc.num_frames = 0;
    CHECK(g4_video_sample_frames(&vc, 8, 0.0, idx, 8, &n) == G4_ERR_INPUT && strstr(vc.error, "rate"), "%s", vc.error);
    vc.num_frames = 5000; vc.fps = 0;
    CHECK(g4_video_sample_frames(&vc, 6000, 0.0, idx, 8, &n) == G4_ERR_INPUT && strstr(vc.error, "G4_VIDEO_MAX_FRAMES"), "%s", vc.error);
    /* preprocessing */
    CHECK(video_config(&vc), "config");
    memset(frames, 100, sizeof frames);
    bytes = g4_video_scratch_size(&vc, 18, 26);
    scratch = malloc(bytes);
    CHECK(g4_video_preprocess(&vc, frames, 0, 18, 26, 3, scratch, bytes, pv, pos, &n_soft) == G4_ERR_INPUT && strstr(vc.error, "0 frames"),
          "zero frames: %s", vc.error);
    CHECK(g4_video_preprocess(&vc, frames, G4_VIDEO_MAX_FRAMES + 1, 18, 26, 3, scratch, bytes, pv, pos, &n_soft) == G4_ERR_INPUT,
          "too many frames");
    CHECK(g4_video_preprocess(&vc, frames, 2, 18, 26, 4, scratch, bytes, pv, pos, &n_soft) == G4_ERR_INPUT && strstr(vc.error, "RGB"),
          "RGBA: %s", vc.error);
    CHECK(g4_video_preprocess(&vc, frames, 2, 0, 26, 3, scratch, bytes, pv, pos, &n_soft) == G4_ERR_INPUT, "zero height: %s", vc.error);
    CHECK(g4_video_preprocess(&vc, frames, 2, 18, 26, 3, scratch, bytes / 2, pv, pos, &n_soft) == G4_ERR_ARENA, "small scratch: %s",
          vc.error);
    CHECK(g4_video_preprocess(&vc, frames, 2, 18, 26, 3, scratch, bytes, pv, pos, &n_soft) == G4_OK && n_soft == 60 &&
              pv[0] == 100.0f / 255.0f, "a grey video: %s", vc.error);
    free(scratch);
    /* the expansion */
    if (g4_tokenizer_load(&tok, vdir("processor")) == G4_OK) {
        memset(&it, 0, sizeof it);
        it.n_frames = 2; it.n_soft = 3;
        CHECK(g4_mm_expand_videos(&tok, &cfg, "a <|video|> b <|video|>", 23, &it, 1, text, sizeof text, &n_out, cfg.error) == G4_ERR_INPUT &&
                  strstr(cfg.error, "2 video placeholders"), "count: %s", cfg.error);
        CHECK(g4_mm_expand_videos(&tok, &cfg, "no video", 8, &it, 1, text, sizeof text, &n_out, cfg.error) == G4_ERR_INPUT, "none");
        CHECK(g4_mm_expand_videos(&tok, &cfg, "a <|video|>", 11, &it, 1, text, 20, &n_out, cfg.error) == G4_ERR_INPUT && n_out > 20,
              "small: %zu", n_out);
        CHECK(g4_mm_expand_videos(&tok, &cfg, "a <|video|>", 11, &it, 1, text, sizeof text, &n_out, cfg.error) == G4_OK &&
                  !strcmp(text, "a 00:00 <|image><|video|><|video|><|video|><image|> 00:00 <|image><|video|><|video|><|video|><image|>") &&
                  n_out == strlen(text), "two frames at 24 fps: %s", text);
        it.n_frames = 0;
        CHECK(g4_mm_expand_videos(&tok, &cfg, "a <|video|>", 11, &it, 1, text, sizeof text, &n_out, cfg.error) == G4_ERR_INPUT, "0 frames");
        it.n_frames = 1; it.fps = 1e-12;
        CHECK(g4_mm_expand_videos(&tok, &cfg, "a <|video|>", 11, &it, 1, text, sizeof text, &n_out, cfg.error) == G4_OK, "%s", cfg.error);
        g4_tokenizer_free(&tok);
    } else {
        CHECK(0, "tokenizer");
    }
    { /* the tower: no frames, a frame outside the position table */
        fixture f;
        float soft[2 * 70 * 32];
        int got;
        if (fixture_open(&f, "e2b_mm", NULL, NULL)) {
            CHECK(g4_video_encode(&f.vs, pv, pos, 0, 280, soft, &got) == G4_ERR_INPUT && strstr(f.vs.error, "0 frames"), "%s", f.vs.error);
            pos[280 * 2 + 4] = 48;
            CHECK(g4_video_encode(&f.vs, pv, pos, 2, 280, soft, &got) == G4_ERR_INPUT && strstr(f.vs.error, "video frame 1"), "%s",
                  f.vs.error);
        }
        fixture_close(&f);
    }
    free(pv);
}

/* ------------------------------------------------------------ bf16 */
/* The bf16-faithful mode (g4_vision_session_config.bf16) against the tower
   run by transformers in bfloat16 (data/vision/<model>/bf16.safetensors,
   tools/make_vision_goldens.py --bf16): every tap, the soft tokens of three
   images and of a video's three frames, bit for bit (no tolerance). */
static const char *g_bf16_models[2] = {"e2b_mm", "31b_mm"};

/* a BF16 golden tensor as floats (malloc'd; NULL when absent) */
static float *golden_bf16(golden *g, const char *name, int64_t *numel) {
    const g4_tensor *t = g4_model_tensor(&g->m, name);
    float *out;
    int64_t i;
    int k;
    *numel = 0;
    if (!t || t->dtype != G4_BF16) return NULL;
    *numel = 1;
    for (k = 0; k < t->ndim; k++) *numel *= t->shape[k];
    out = (float *)malloc(sizeof(float) * (size_t)(*numel > 0 ? *numel : 1));
    for (i = 0; i < *numel; i++) out[i] = g4__get(t, (size_t)i);
    return out;
}

/* values of a that differ in any bit from b */
static size_t count_diff_bits(const float *a, const float *b, size_t n) {
    size_t i, c = 0;
    for (i = 0; i < n; i++) c += memcmp(a + i, b + i, sizeof(float)) != 0;
    return c;
}

typedef struct { golden *g; int compared, exact; } bf16cmp;

static void bf16_tap_cb(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    bf16cmp *bc = (bf16cmp *)user;
    char key[200];
    float *gold;
    int64_t numel;
    size_t bad;
    (void)layer; (void)pos0;
    snprintf(key, sizeof key, "tap.%s", !strcmp(name, "embed_vision") ? "soft.0" : strncmp(name, "vision_tower.", 13) == 0 ? name + 13 : name);
    if (!strcmp(name, "embed_vision")) snprintf(key, sizeof key, "soft.0"); /* (the golden stores it once) */
    if (!(gold = golden_bf16(bc->g, key, &numel))) { CHECK(0, "no bf16 golden for tap %s", name); return; }
    if (numel % cols || numel / cols > rows) {
        CHECK(0, "tap %s: golden %lld values, ours [%d][%d]", name, (long long)numel, rows, cols);
        free(gold);
        return;
    }
    bad = count_diff_bits(data, gold, (size_t)numel);
    CHECK(bad == 0, "bf16 tap %s: %zu of %lld values differ (max %.3g)", name, bad, (long long)numel, max_diff(data, gold, (size_t)numel));
    bc->compared++;
    bc->exact += bad == 0;
    free(gold);
}

/* a bf16 vision session on f's model (pool may be NULL) */
static int bf16_session(fixture *f, g4_vision_session *vs, void **arena, g4_pool *pool, g4_tap_fn tap, void *tap_user) {
    g4_vision_session_config vc;
    size_t bytes;
    memset(&vc, 0, sizeof vc);
    vc.max_patches = 280;
    vc.bf16 = 1;
    vc.pool = pool;
    vc.tap = tap; vc.tap_user = tap_user;
    *arena = NULL;
    if (g4_vision_session_size(&f->m, &vc, &bytes) != G4_OK) { CHECK(0, "vision size"); return 0; }
    *arena = malloc(bytes);
    if (g4_vision_session_init(vs, &f->m, &vc, *arena, bytes) != G4_OK) { CHECK(0, "bf16 vision init: %s", vs->error); return 0; }
    return 1;
}

static void test_bf16_taps(void) {
    int k;
    for (k = 0; k < 2; k++) {
        fixture f;
        golden gb;
        g4_vision_session vs;
        void *arena = NULL;
        bf16cmp bc;
        float soft[80 * 64];
        int n_soft;
        memset(&bc, 0, sizeof bc);
        if (!fixture_open(&f, g_bf16_models[k], NULL, NULL) || !vgolden(&gb, g_bf16_models[k], "bf16.safetensors")) {
            CHECK(0, "%s: bf16 golden", g_bf16_models[k]);
            fixture_close(&f);
            continue;
        }
        bc.g = &gb;
        if (bf16_session(&f, &vs, &arena, NULL, bf16_tap_cb, &bc)) encode_case(&vs, &f.pg, 0, soft, &n_soft);
        CHECK(bc.compared == 2 + 12 * f.m.config.vision.num_hidden_layers + 1, "%s: %d taps compared", g_bf16_models[k], bc.compared);
        printf("  %s: %d of %d taps bit-identical to transformers in bf16\n", g_bf16_models[k], bc.exact, bc.compared);
        free(arena);
        g4_model_free(&gb.m);
        fixture_close(&f);
    }
}

/* images 0, 1, 2 alone and video case v0's three frames (one get_video_features batch); with
   a 3-thread pool too */
static void test_bf16_soft(void) {
    golden vpg;
    g4_pool *pool = NULL;
    int k, c, threads;
    if (!vgolden(&vpg, NULL, "video.safetensors")) { CHECK(0, "video golden"); return; }
    if (g4_pool_create(&pool, 3) != G4_OK) { skip("no threads in this build"); pool = NULL; }
    for (k = 0; k < 2; k++) {
        fixture f;
        golden gb;
        vframes vf;
        if (!fixture_open(&f, g_bf16_models[k], NULL, NULL) || !vgolden(&gb, g_bf16_models[k], "bf16.safetensors")) {
            CHECK(0, "%s: bf16 golden", g_bf16_models[k]);
            fixture_close(&f);
            continue;
        }
        if (!vcase_frames(&vpg, &g_vcases[0], &vf)) { g4_model_free(&gb.m); fixture_close(&f); continue; }
        for (threads = 1; threads <= (pool ? 3 : 1); threads += 2) {
            g4_vision_session vs;
            void *arena = NULL;
            if (!bf16_session(&f, &vs, &arena, threads > 1 ? pool : NULL, NULL, NULL)) { free(arena); continue; }
            for (c = 0; c < 4; c++) {
                float soft[200 * 64], *gold;
                char key[32];
                int n_soft = 0;
                int64_t numel;
                g4_result r;
                size_t bad;
                snprintf(key, sizeof key, c < 3 ? "soft.%d" : "soft.v0", c);
                if (!(gold = golden_bf16(&gb, key, &numel))) { CHECK(0, "%s: no %s", g_bf16_models[k], key); continue; }
                if (c < 3) {
                    images im;
                    if (!case_images(&f.pg, c, &im)) { CHECK(0, "case %d", c); free(gold); continue; }
                    r = g4_vision_encode(&vs, im.pv, im.pos, im.n_patches, soft, &n_soft);
                } else
                    r = g4_video_encode(&vs, vf.pv, vf.pos, vf.n_frames, vf.max_patches, soft, &n_soft);
                CHECK(r == G4_OK && (int64_t)n_soft * f.m.config.hidden_size == numel, "%s %s: %s, %d soft tokens", g_bf16_models[k],
                      key, vs.error, n_soft);
                if (r == G4_OK && (int64_t)n_soft * f.m.config.hidden_size == numel) {
                    bad = count_diff_bits(soft, gold, (size_t)numel);
                    CHECK(bad == 0, "%s %s (%d threads): %zu of %lld values differ from transformers in bf16 (max %.3g)",
                          g_bf16_models[k], key, threads, bad, (long long)numel, max_diff(soft, gold, (size_t)numel));
                    printf("  %s %s, %d thread%s: %d soft tokens, %zu values differ\n", g_bf16_models[k], key, threads,
                           threads > 1 ? "s" : "", n_soft, bad);
                }
                free(gold);
            }
            free(arena);
        }
        vframes_free(&vf);
        g4_model_free(&gb.m);
        fixture_close(&f);
    }
    g4_pool_free(pool);
    g4_model_free(&vpg.m);
}

/* bf16 end to end: case 0's prompt, our bf16 tower's soft tokens into the bf16
   decoder (g4_forward_mm), against the whole model run by transformers in
   bf16 (logits.0 at logit_rows.0), bit for bit; e2b_mm causal, 31b_mm with
   bidirectional image attention */
static void test_bf16_logits(void) {
    int k;
    for (k = 0; k < 2; k++) {
        fixture f;
        golden gb;
        g4_vision_session vs;
        g4_session s;
        g4_session_config sc = g4_session_config_init();
        void *arena = NULL;
        float soft[80 * 64], *logits = NULL, *gold = NULL;
        int n_soft = 0, V, i;
        int64_t n_ids, n_rows, nl;
        const int32_t *ids, *rows;
        size_t bad = 0;
        if (!fixture_open(&f, g_bf16_models[k], NULL, NULL) || !vgolden(&gb, g_bf16_models[k], "bf16.safetensors")) {
            CHECK(0, "%s: bf16 golden", g_bf16_models[k]);
            fixture_close(&f);
            continue;
        }
        V = f.m.config.vocab_size;
        ids = gi32(&f.pg, "ids.0", &n_ids);
        rows = gi32(&f.gold, "logit_rows.0", &n_rows);
        gold = golden_bf16(&gb, "logits.0", &nl);
        sc.max_context = 128; sc.max_chunk = 128; sc.bf16 = 1;
        if (ids && rows && gold && nl == n_rows * V && bf16_session(&f, &vs, &arena, NULL, NULL, NULL) && encode_case(&vs, &f.pg, 0, soft, &n_soft) &&
            g4_session_create(&s, &f.m, &sc) == G4_OK) {
            logits = (float *)malloc(sizeof(float) * (size_t)n_ids * V);
            CHECK(g4_forward_mm(&s, ids, (int)n_ids, soft, n_soft, logits, G4_LOGITS_ALL, NULL) == G4_OK, "%s", s.error);
            for (i = 0; i < n_rows; i++) bad += count_diff_bits(logits + (size_t)rows[i] * V, gold + (size_t)i * V, (size_t)V);
            CHECK(bad == 0, "%s: %zu of %lld bf16 logits differ from transformers' in bf16", g_bf16_models[k], bad, (long long)nl);
            printf("  %s case 0: %lld ids, %d soft tokens, %lld logits (%lld rows), %zu differ\n", g_bf16_models[k], (long long)n_ids,
                   n_soft, (long long)nl, (long long)n_rows, bad);
            g4_session_destroy(&s);
        } else CHECK(0, "%s: bf16 logits setup", g_bf16_models[k]);
        free(logits);
        free(gold);
        free(arena);
        g4_model_free(&gb.m);
        fixture_close(&f);
    }
}

static const char *g_cli = "build/gemma4";

/* gemma4 logits' float32 file of e2b_mm's case 0 (75 rows of 520), read whole; to free */
static float *read_case0_logits(const char *path) {
    float *l = (float *)calloc(75 * 520, sizeof(float));
    FILE *f = fopen(path, "rb");
    if (f) {
        CHECK(fread(l, sizeof(float), 75 * 520, f) == 75 * 520 && fgetc(f) == EOF, "%s: not 75 x 520 floats", path);
        fclose(f);
    } else CHECK(0, "no %s", path);
    return l;
}

static void test_cli_logits(void) {
    char cmd[1024], out[64];
    int64_t nr, nl;
    const int32_t *rows;
    const float *gold;
    golden g;
    float *l;
    int i, rc;
    snprintf(out, sizeof out, "/tmp/g4_vision_cli_%d.bin", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s logits %s --ids 2,310,428,331,350,340,349,513,363,356,381 --image %s --processor %s "
             "--out %s > /dev/null", g_cli, vdir("e2b_mm"), vdir("images/a.png"), vdir("processor"), out);
    rc = system(cmd);
    CHECK(rc == 0, "%s: status %d", cmd, rc);
    if (!vgolden(&g, "e2b_mm", "golden.safetensors")) { CHECK(0, "golden"); return; }
    rows = gi32(&g, "logit_rows.0", &nr);
    gold = golden_f32(&g, "logits.0", &nl);
    l = read_case0_logits(out);
    for (i = 0; rows && gold && i < nr; i++)
        CHECK(max_diff(l + (size_t)rows[i] * 520, gold + (size_t)i * 520, 520) <= 1e-4 * max_abs(gold, (size_t)nl),
              "row %d differs", rows[i]);
    { /* info describes the tower */
        char line[1024];
        FILE *pp;
        int found = 0;
        snprintf(cmd, sizeof cmd, "%s info %s", g_cli, vdir("31b_mm"));
        if ((pp = popen(cmd, "r")) != NULL) {
            while (fgets(line, sizeof line, pp))
                found |= strstr(line, "vision tower: 2 layers, hidden 16, 2 heads of 8 (2 KV), mlp 32, patch 4, pooling 2, "
                                      "position table 48, rope_theta 50, standardize; ids: image 513, boi 512, eoi 514; "
                                      "bidirectional image attention on sliding layers") != NULL;
            CHECK(pclose(pp) == 0 && found, "info: no vision tower line");
        }
    }
    snprintf(cmd, sizeof cmd, "%s logits %s --ids 2,310 --image %s --processor %s --out %s 2> /dev/null", g_cli,
             vdir("e2b_mm"), vdir("images/a.png"), vdir("processor"), out);
    CHECK(system(cmd) != 0, "no placeholder for the image: exit 0");
    remove(out);
    free(l);
    g4_model_free(&g.m);
    /* greedy --image on the bidirectional model: the first new token is the argmax of transformers' last row */
    if (vgolden(&g, "31b_mm", "golden.safetensors")) {
        char line[4096] = "";
        FILE *p;
        int last = -1, want;
        const char *q;
        gold = golden_f32(&g, "logits.0", &nl);
        rows = gi32(&g, "logit_rows.0", &nr);
        want = gold && rows && nr > 0 && rows[nr - 1] == 74 ? (int)g4_argmax(gold + (size_t)(nr - 1) * 520, 520) : -2;
        snprintf(cmd, sizeof cmd, "%s greedy %s --ids 2,310,428,331,350,340,349,513,363,356,381 --image %s --processor %s "
                 "--new 1", g_cli, vdir("31b_mm"), vdir("images/a.png"), vdir("processor"));
        if ((p = popen(cmd, "r")) != NULL) {
            if (!fgets(line, sizeof line, p)) line[0] = 0;
            rc = pclose(p);
            for (q = line, i = 0; *q; q++) if (*q == ' ') i++;
            q = strrchr(line, ' ');
            if (q) last = atoi(q + 1);
            CHECK(rc == 0 && i == 75 && last == want, "greedy: status %d, %d ids, last %d, want %d", rc, i + 1, last, want);
        } else CHECK(0, "popen");
        g4_model_free(&g.m);
    } else CHECK(0, "31b_mm golden");
}

/* generate --video: case v1 from files (images/b.png, images/video/f1.png and f7.png): the
   prompt's length is the processor's and the first greedy token transformers' argmax of
   the last row; bad uses are one line and exit 1 */
static void test_cli_video(void) {
    char cmd[2048], line[4096], want_text[64] = "";
    const char *common = "--processor %s --tokenizer %s --temp 0";
    golden g;
    g4_tokenizer tok;
    int64_t nr, nl;
    const int32_t *rows;
    const float *gold;
    size_t tl = 0;
    int rc, k;
    static const char *bad[][2] = {
        {"generate %s --prompt \"<|video|> and <|video|>\" --video %s", "2 video placeholders"},
        {"generate %s --prompt \"<|video|>\" --video %s --video-fps 0", "--video-fps"},
        {"logits %s --ids 2,518,300,518 --video %s --out /dev/null", "2 video placeholders (id 518) but 1 video was given (--video)"},
        {"generate %s --prompt \"<|video|>\" --video %s,data/vision/images/b.png", "a video of 26 x 18"},
    };
    if (!vgolden(&g, "31b_mm", "video.safetensors")) { CHECK(0, "golden"); return; }
    gold = golden_f32(&g, "logits.v1", &nl);
    rows = gi32(&g, "logit_rows.v1", &nr);
    if (g4_tokenizer_load(&tok, vdir("processor")) == G4_OK && gold && rows && nr > 0 && rows[nr - 1] == 204) {
        int32_t want = g4_argmax(gold + (size_t)(nr - 1) * 520, 520);
        CHECK(g4_detokenize(&tok, &want, 1, 0, want_text, sizeof want_text - 1, &tl) == G4_OK && tl > 0, "the token's text");
        want_text[tl] = 0;
        g4_tokenizer_free(&tok);
    } else CHECK(0, "tokenizer or golden rows");
    snprintf(cmd, sizeof cmd, "%s generate %s --prompt \"<|image|> and <|video|> end\" --image %s --video %s --max-tokens 1 ", g_cli,
             vdir("31b_mm"), vdir("images/b.png"), vdir("images/video"));
    snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), common, vdir("processor"), vdir("processor"));
    strcat(cmd, " 2>&1");
    rc = run_cli("", cmd, line, sizeof line, NULL, NULL, 0);
    CHECK(rc == 0 && !strncmp(line, want_text, strlen(want_text)) && strstr(line, "prompt 205 tokens"),
          "generate --video: status %d, output \"%s\", want \"%s\" and 205 prompt tokens", rc, line, want_text);
    for (k = 0; k < (int)(sizeof bad / sizeof bad[0]); k++) {
        char args[1024];
        snprintf(args, sizeof args, bad[k][0], vdir("31b_mm"), k == 3 ? vdir("images/video/f1.png") : vdir("images/video"));
        snprintf(cmd, sizeof cmd, "%s %s ", g_cli, args);
        if (k == 2) /* logits takes no sampling flags */
            snprintf(cmd, sizeof cmd, "%s %s --processor %s", g_cli, args, vdir("processor"));
        else
            snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), common, vdir("processor"), vdir("processor"));
        strcat(cmd, " 2>&1");
        rc = run_cli("", cmd, line, sizeof line, NULL, NULL, 0);
        CHECK(rc > 0 && strstr(line, bad[k][1]) && strchr(line, '\n') == line + strlen(line) - 1,
              "%s: status %d, \"%s\" (want one line naming %s)", args, rc, line, bad[k][1]);
    }
    g4_model_free(&g.m);
}

/* --bf16 on the CLI: `image --bf16` writes the bf16 golden's soft tokens (the PNG
   through the processor and the bf16 tower), the same bytes on 3 threads;
   `logits --bf16 --image` transformers' bf16 logits */
static void test_cli_bf16(void) {
    char cmd[1024], out[2][64], lout[64];
    golden gb, g;
    float *gold = NULL, *glog = NULL, *got = NULL, *l = NULL;
    int64_t ng = 0, nl = 0, nr = 0;
    const int32_t *rows = NULL;
    int t, i, rc;
    FILE *f;
    if (!vgolden(&gb, "e2b_mm", "bf16.safetensors")) { CHECK(0, "bf16 golden"); return; }
    gold = golden_bf16(&gb, "soft.0", &ng);
    for (t = 0; t < 2; t++) {
        snprintf(out[t], sizeof out[t], "/tmp/g4_vision_bf16_%d_%d.bin", (int)getpid(), t);
        snprintf(cmd, sizeof cmd, "%s image %s %s --processor %s --bf16 --threads %d --out %s > /dev/null", g_cli, vdir("e2b_mm"),
                 vdir("images/a.png"), vdir("processor"), t ? 3 : 1, out[t]);
        rc = system(cmd);
        CHECK(rc == 0, "%s: status %d", cmd, rc);
    }
    got = (float *)calloc((size_t)(ng > 0 ? ng : 1) + 1, sizeof(float));
    for (t = 0; t < 2; t++) {
        if ((f = fopen(out[t], "rb")) != NULL) {
            size_t r = fread(got, sizeof(float), (size_t)ng + 1, f);
            fclose(f);
            CHECK(gold && r == (size_t)ng && count_diff_bits(got, gold, (size_t)ng) == 0,
                  "image --bf16 --threads %d: %zu floats, %zu differ from transformers in bf16", t ? 3 : 1, r,
                  gold && r == (size_t)ng ? count_diff_bits(got, gold, (size_t)ng) : (size_t)0);
        } else CHECK(0, "no %s", out[t]);
        remove(out[t]);
    }
    snprintf(lout, sizeof lout, "/tmp/g4_vision_bf16_l_%d.bin", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s logits %s --bf16 --ids 2,310,428,331,350,340,349,513,363,356,381 --image %s --processor %s "
             "--out %s > /dev/null", g_cli, vdir("e2b_mm"), vdir("images/a.png"), vdir("processor"), lout);
    rc = system(cmd);
    CHECK(rc == 0, "%s: status %d", cmd, rc);
    if (vgolden(&g, "e2b_mm", "golden.safetensors")) {
        size_t bad = 0;
        rows = gi32(&g, "logit_rows.0", &nr);
        glog = golden_bf16(&gb, "logits.0", &nl);
        l = read_case0_logits(lout);
        for (i = 0; rows && glog && nl == nr * 520 && i < nr; i++) bad += count_diff_bits(l + (size_t)rows[i] * 520, glog + (size_t)i * 520, 520);
        CHECK(rows && glog && bad == 0, "logits --bf16 --image: %zu bf16 logits differ from transformers'", bad);
        g4_model_free(&g.m);
    } else CHECK(0, "golden");
    remove(lout);
    free(l); free(glog); free(got); free(gold);
    g4_model_free(&gb.m);
}

int main(int argc, char **argv) {
    (void)g_tmp;
    h_args(argc, argv, &g_data, &g_cli, NULL, 0, NULL);
    run("vision config: vision_config, the wrapper's ids, refusals", test_config);
    run("vision: a checkpoint without a tower loads; the tower refuses", test_no_tower);
    run("vision tower: every tap against transformers (e2b_mm, 31b_mm)", test_taps);
    run("vision tower: soft tokens of 4 cases (resize, none, RGBA, two images)", test_soft_tokens);
    run("vision tower: a 3-thread pool gives the same bits", test_threads);
    run("vision tower: padding before a real patch (the general attention loop) gives the same soft tokens", test_patch_order);
    run("vision tower: the fast paths against their references (exp, softmax, the GEMM attention)", test_fast_paths);
    run("merge: logits with images, one call (e2b_mm, 31b_mm)", test_logits);
    run("merge: final norm rows of case 0", test_norm_rows);
    run("merge: chunked steps and two calls give the same logits", test_chunks);
    run("merge: bad input is an error", test_errors);
    run("image processor: target sizes as get_aspect_ratio_preserving_size", test_target_sizes);
    run("image processor: pixel_values bit for bit (torchvision backend; up, none, RGBA, down, 6x200), positions, ids as "
        "Gemma4Processor", test_image_processor);
    run("image processor: processor_config.json refusals, a processor contradicting the model", test_image_config);
    run("image files: PNG (RGB, RGBA) and JPEG decode as PIL decodes them; a file to soft tokens", test_image_files);
    run("video processor: pixel_values_videos bit for bit (sampled, pre-sampled, another mean/std), ids with the frames' "
        "stamps and mm_token_type_ids as Gemma4Processor's", test_video_processor);
    run("video processor: sample_frames and the mm:ss stamps on edge cases as transformers'", test_video_cases);
    run("video: soft tokens and logits against transformers (e2b_mm, 31b_mm, 26b_mm; a video, an image and a video; "
        "chunked)", test_video_logits);
    run("video: bad input is an error", test_video_errors);
    run("bf16 tower: every tap of case 0 bit-identical to transformers in bf16 (e2b_mm, 31b_mm)", test_bf16_taps);
    run("bf16 tower: soft tokens of 3 images and a 3-frame video bit-identical; 3 threads the same", test_bf16_soft);
    run("bf16 tower: the fast attention = its reference at the released head shapes (12 x 64, 16 x 72)",
        test_bf16_attention_shapes);
    run("bf16 merge: case 0's logits, our bf16 tower into the bf16 decoder, bit-identical to transformers in bf16", test_bf16_logits);
    run("cli: logits --image gives transformers' logits, greedy --image its next token; a missing placeholder is an "
        "error", test_cli_logits);
    run("cli: generate --video (an image and two frame files) gives the processor's prompt length and transformers' "
        "first token; bad uses are an error", test_cli_video);
    run("cli: image --bf16 (1 and 3 threads) and logits --bf16 --image give transformers' bf16 bits", test_cli_bf16);
    return finish();
}
