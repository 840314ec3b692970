/* Tests of the audio side of gemma4.h: Gemma4AudioFeatureExtractor's
   features, the WAV reader, the audio tower (Gemma4AudioModel + embed_audio)
   tap by tap, the soft tokens, and the bad inputs of each.

   Goldens (tools/make_audio_goldens.py, versions in data/tiny/e2b_audio/VERSIONS.txt):
     data/tiny/e2b_audio/{config.json, model.safetensors}  a tiny E2B-style checkpoint
     data/tiny/e2b_audio/clip_{a,b}.wav                    the clips (PCM16, float32)
     data/tiny/e2b_audio/golden.safetensors                features, masks, taps, soft tokens,
                                                           ids and logits with both clips
     data/tiny/e2b_audio_geom/                             another attention geometry (chunk 8,
                                                           context 3 / 2), clip a's taps and tokens

   Tolerances, and why:
     features  2e-6 absolute (log-mel values of magnitude up to ~7): numpy runs
               the 512-point FFT in complex64 (float32), gemma4.h in float64;
               the rest of the pipeline is float64 in both. The FFT's float32
               rounding is ~1e-7 relative to a frame's energy; after the mel sum
               and the log it is below the float32 rounding of the result on
               these clips: measured 4.8e-7, one float32 ulp at 6.9. The bound
               leaves room for quieter bins (the log magnifies a bin's error by
               its level below the frame's). Masks: equal.
     taps      1e-4 x max|golden| per tap, and soft tokens 1e-4 absolute: float32
               throughout, but torch sums the convolutions (oneDNN), the
               matmuls (its BLAS) and the norms in other orders than the scalar
               kernels; those ~1e-7 relative differences grow through the
               clamps, soft-caps and two conformer layers: measured 1.9e-6
               x max|golden| at the worst tap, 1.5e-6 on the soft tokens;
               e2b_audio_geom 1.1e-5 at subsample_conv_projection.layer1 (its
               LayerNorm over C1 = 2 channels magnifies the convolution's
               rounding) and 5.3e-6 on its soft tokens.
     bf16 mode (g4_audio_run.bf16) against the tower run by transformers in
               bfloat16 (bf16.safetensors, make_audio_goldens.py --bf16): identical,
               every bit (41 taps, both clips' soft tokens on 1 and 3 threads, clip
               b's prompt's logits through the bf16 decoder, the CLI's audio --bf16
               and logits --bf16 --audio from the WAVs).
   Run from the repository root (make test does): test_audio [CLI [NAME]]
   (CLI: build/gemma4 by default; NAME: run only the tests whose name has it). */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include "../gemma4_processing.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "fixtures.h"

#define MODEL "e2b_audio"
#define FEAT_TOL 2e-6
#define TAP_TOL 1e-4
#define SOFT_TOL 1e-4

/* ------------------------------------------------------------- helpers */

/* A WAV file -> float PCM (malloc'd), via g4_wav_parse. */
static float *read_wav(const char *path, size_t *n, int *rate, char *err) {
    char *bytes;
    size_t len;
    float *pcm;
    if (g4__read_file(path, &bytes, &len, (size_t)64 << 20, err) != G4_OK) return NULL;
    if (g4_wav_parse((const unsigned char *)bytes, len, NULL, 0, n, rate, err) != G4_OK) { free(bytes); return NULL; }
    pcm = (float *)malloc(sizeof(float) * (*n ? *n : 1));
    if (pcm && g4_wav_parse((const unsigned char *)bytes, len, pcm, *n, n, rate, err) != G4_OK) { free(pcm); pcm = NULL; }
    free(bytes);
    return pcm;
}

/* The clip's features (malloc'd) with g4_audio_features. */
static float *features_of(const float *pcm, int n, int rate, unsigned char **mask, int *n_frames, char *err) {
    g4_audio_fe fe;
    float *feat = NULL, *scratch = NULL;
    int nf;
    *mask = NULL;
    if (g4_audio_fe_init(&fe) != G4_OK) { snprintf(err, G4_ERROR_MAX, "%s", fe.error); return NULL; }
    nf = g4_audio_fe_frames(&fe, n);
    feat = (float *)malloc(sizeof(float) * (size_t)(nf > 0 ? nf : 1) * (size_t)fe.feature_size);
    *mask = (unsigned char *)malloc((size_t)(nf > 0 ? nf : 1));
    scratch = (float *)malloc(sizeof(float) * g4_audio_fe_scratch(&fe));
    if (g4_audio_features(&fe, pcm, n, rate, feat, *mask, n_frames, scratch) != G4_OK) {
        snprintf(err, G4_ERROR_MAX, "%s", fe.error);
        free(feat);
        free(*mask);
        feat = NULL;
        *mask = NULL;
    }
    free(scratch);
    g4_audio_fe_free(&fe);
    return feat;
}

static void *arena_for(const g4_model *m, int frames, size_t *bytes) {
    void *p = NULL;
    if (g4_audio_size(m, frames, bytes) != G4_OK) return NULL;
    if (posix_memalign(&p, 64, *bytes ? *bytes : 1)) return NULL;
    return p;
}

/* The golden's features of clip `c` ("a" or "b") as floats and a byte mask (mask malloc'd). */
static const float *golden_features(golden *g, const char *c, unsigned char **mask, int *n_frames) {
    char name[64];
    const int32_t *mk;
    int64_t numel;
    const float *f;
    int n, i;
    snprintf(name, sizeof name, "%s.input_features_mask", c);
    mk = golden_ids(g, name, &n);
    snprintf(name, sizeof name, "%s.input_features", c);
    f = golden_f32(g, name, &numel);
    if (!mk || !f || numel != (int64_t)n * 128) return NULL;
    *mask = (unsigned char *)malloc((size_t)n);
    for (i = 0; i < n; i++) (*mask)[i] = (unsigned char)(mk[i] != 0);
    *n_frames = n;
    return f;
}

/* ------------------------------------------------------------- features */

static void test_features(void) {
    golden g;
    const char *clips[2] = {"a", "b"};
    int c;
    if (!golden_open(&g, MODEL)) { CHECK(0, "golden"); return; }
    for (c = 0; c < 2; c++) {
        char err[G4_ERROR_MAX], wav[32];
        size_t n;
        int rate, nf = 0, ngf = 0, i, mask_eq = 1;
        unsigned char *mask = NULL, *gmask = NULL;
        float *pcm, *feat;
        const float *gf;
        snprintf(wav, sizeof wav, "clip_%s.wav", clips[c]);
        pcm = read_wav(path2(tiny(MODEL), wav), &n, &rate, err);
        CHECK(pcm != NULL, "%s: %s", wav, err);
        if (!pcm) continue;
        CHECK(rate == 16000 && n == (c == 0 ? 16130u : 7000u), "%s: %zu samples at %d Hz", wav, n, rate);
        feat = features_of(pcm, (int)n, rate, &mask, &nf, err);
        CHECK(feat != NULL, "%s: %s", wav, err);
        gf = golden_features(&g, clips[c], &gmask, &ngf);
        CHECK(gf != NULL, "golden features of clip %s", clips[c]);
        if (feat && gf) {
            double d;
            int valid = 0;
            for (i = 0; i < nf; i++) valid += mask[i];
            CHECK(nf == ngf, "clip %s: %d frames, transformers %d", clips[c], nf, ngf);
            for (i = 0; i < nf && i < ngf; i++) mask_eq &= mask[i] == gmask[i];
            CHECK(mask_eq, "clip %s: the valid-frame masks differ", clips[c]);
            d = max_diff(feat, gf, (size_t)(nf < ngf ? nf : ngf) * 128);
            printf("  clip %s: %d frames (%d valid): features within %.3g of transformers (max |value| %.3g)\n",
                   clips[c], nf, valid, d, max_abs(gf, (size_t)ngf * 128));
            CHECK(d <= FEAT_TOL, "clip %s: features differ by %g (tolerance %g)", clips[c], d, FEAT_TOL);
        }
        free(pcm);
        free(feat);
        free(mask);
        free(gmask);
    }
    g4_model_free(&g.m);
}

/* ----------------------------------------------------------- the tower */

typedef struct {
    golden *g;
    int seen, compared, bad;
    double worst;
    char worst_name[128];
} tapcheck;

static void tap_cb(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    tapcheck *tc = (tapcheck *)user;
    char key[160];
    const g4_tensor *t, *rt;
    int64_t numel;
    const float *ref;
    int r, nr = rows;
    double worst = 0, scale;
    (void)layer;
    (void)pos0;
    tc->seen++;
    snprintf(key, sizeof key, "a.tap.%s", name);
    if (!(t = g4_model_tensor(&tc->g->m, key))) return;
    ref = golden_f32(tc->g, key, &numel);
    snprintf(key, sizeof key, "a.tap_rows.%s", name);
    rt = g4_model_tensor(&tc->g->m, key);
    if (rt) nr = (int)rt->shape[0];
    if (!ref || t->ndim != 2 || t->shape[1] != cols || (!rt && t->shape[0] != rows)) {
        printf("  tap %s: [%d, %d], golden [%lld, %lld]\n", name, rows, cols, (long long)t->shape[0],
               t->ndim > 1 ? (long long)t->shape[1] : -1LL);
        tc->bad++;
        return;
    }
    scale = max_abs(ref, (size_t)numel);
    for (r = 0; r < nr; r++) {
        int row = rt ? ((const int32_t *)rt->data)[r] : r;
        double d;
        if (row < 0 || row >= rows) { tc->bad++; return; }
        d = max_diff(data + (size_t)row * cols, ref + (size_t)r * cols, (size_t)cols);
        if (d > worst) worst = d;
    }
    tc->compared++;
    if (worst > TAP_TOL * (scale > 1 ? scale : 1)) {
        printf("  tap %s: differs by %g (max |golden| %g)\n", name, worst, scale);
        tc->bad++;
    }
    if (worst / (scale > 1 ? scale : 1) > tc->worst) {
        tc->worst = worst / (scale > 1 ? scale : 1);
        snprintf(tc->worst_name, sizeof tc->worst_name, "%s", name);
    }
}

/* Clip a's features through MODEL_DIR's tower: every tap its golden has, and the soft tokens. */
static void taps_case(const char *model_dir) {
    golden g, gm;
    g4_model m;
    tapcheck tc;
    g4_audio_run run;
    unsigned char *mask = NULL;
    const float *feat;
    float *soft = NULL;
    void *arena = NULL;
    size_t bytes = 0;
    int nf, n_soft = 0, golden_taps = 0, i;
    if (!golden_open(&g, model_dir)) { CHECK(0, "golden"); return; }
    if (!golden_open(&gm, MODEL)) { CHECK(0, "golden"); g4_model_free(&g.m); return; }
    if (g4_model_load(&m, tiny(model_dir)) != G4_OK) {
        CHECK(0, "load: %s", m.error);
        g4_model_free(&g.m);
        g4_model_free(&gm.m);
        return;
    }
    CHECK(m.audio.loaded, "audio tower not loaded: %s", m.audio.error);
    feat = golden_features(&gm, "a", &mask, &nf);
    CHECK(feat != NULL, "golden features");
    arena = arena_for(&m, nf, &bytes);
    CHECK(!feat || arena, "no audio arena for %d frames", nf);
    soft = (float *)malloc(sizeof(float) * (size_t)g4_audio_tokens_max(nf) * (size_t)m.config.hidden_size);
    if (feat && arena && soft) {
        memset(&tc, 0, sizeof tc);
        tc.g = &g;
        memset(&run, 0, sizeof run);
        run.tap = tap_cb;
        run.tap_user = &tc;
        CHECK(g4_audio_encode(&m, feat, mask, nf, arena, bytes, &run, soft, &n_soft) == G4_OK, "%s", run.error);
        for (i = 0; i < g.m.n_tensors; i++)
            if (strncmp(g.m.tensors[i].name, "a.tap.", 6) == 0) golden_taps++;
        printf("  %d taps seen, %d compared of the golden's %d; worst %s at %.3g x max(1, max|golden|); arena %zu bytes\n",
               tc.seen, tc.compared, golden_taps, tc.worst_name, tc.worst, bytes);
        CHECK(tc.bad == 0, "%d taps differ", tc.bad);
        CHECK(tc.compared == golden_taps, "only %d of the golden's %d taps were compared", tc.compared, golden_taps);
        {
            int64_t numel;
            const float *ref = golden_f32(&g, "a.soft_tokens", &numel);
            int nref = ref ? (int)(numel / m.config.hidden_size) : -1;
            double d = ref && n_soft == nref ? max_diff(soft, ref, (size_t)numel) : INFINITY;
            printf("  %d soft tokens within %.3g of transformers\n", n_soft, d);
            CHECK(n_soft == nref && d <= SOFT_TOL, "%d soft tokens (transformers %d), max diff %g", n_soft, nref, d);
        }
    }
    free(mask);
    free(soft);
    free(arena);
    g4_model_free(&m);
    g4_model_free(&g.m);
    g4_model_free(&gm.m);
}

static void test_taps(void) { taps_case(MODEL); }
static void test_geom(void) { taps_case(MODEL "_geom"); }

/* Encode clip c from the golden's features or from its WAV; compare the soft tokens. */
static void soft_tokens_case(const char *c, int from_wav) {
    golden g;
    g4_model m;
    g4_audio_run run;
    unsigned char *mask = NULL;
    const float *feat = NULL;
    float *own = NULL, *soft = NULL;
    const float *ref;
    void *arena = NULL;
    size_t bytes = 0;
    int64_t numel;
    int nf = 0, n_soft = -1, nref;
    char name[64], err[G4_ERROR_MAX] = "";
    if (!golden_open(&g, MODEL)) { CHECK(0, "golden"); return; }
    if (g4_model_load(&m, tiny(MODEL)) != G4_OK) { CHECK(0, "load: %s", m.error); g4_model_free(&g.m); return; }
    if (from_wav) {
        char wav[32];
        size_t n;
        int rate;
        float *pcm;
        snprintf(wav, sizeof wav, "clip_%s.wav", c);
        pcm = read_wav(path2(tiny(MODEL), wav), &n, &rate, err);
        if (pcm) feat = own = features_of(pcm, (int)n, rate, &mask, &nf, err);
        free(pcm);
    } else {
        feat = golden_features(&g, c, &mask, &nf);
    }
    snprintf(name, sizeof name, "%s.soft_tokens", c);
    ref = golden_f32(&g, name, &numel);
    CHECK(feat && ref, "inputs: %s", err);
    nref = ref ? (int)(numel / m.config.hidden_size) : 0;
    arena = arena_for(&m, nf, &bytes);
    CHECK(!feat || arena, "no audio arena for %d frames", nf);
    soft = (float *)malloc(sizeof(float) * (size_t)g4_audio_tokens_max(nf > 0 ? nf : 1) * (size_t)m.config.hidden_size);
    memset(&run, 0, sizeof run);
    if (feat && ref && arena && soft) {
        double d;
        CHECK(g4_audio_encode(&m, feat, mask, nf, arena, bytes, &run, soft, &n_soft) == G4_OK, "%s", run.error);
        CHECK(n_soft == nref, "%d soft tokens, transformers %d", n_soft, nref);
        d = n_soft == nref ? max_diff(soft, ref, (size_t)nref * m.config.hidden_size) : INFINITY;
        printf("  clip %s%s: %d soft tokens within %.3g of transformers (max |value| %.3g)\n", c,
               from_wav ? " from its WAV" : "", n_soft, d, max_abs(ref, (size_t)numel));
        CHECK(d <= SOFT_TOL, "soft tokens differ by %g (tolerance %g)", d, SOFT_TOL);
    }
    free(own);
    if (!from_wav || own) free(mask);
    free(soft);
    free(arena);
    g4_model_free(&m);
    g4_model_free(&g.m);
}

static void test_soft_a(void) { soft_tokens_case("a", 0); }
static void test_soft_b(void) { soft_tokens_case("b", 0); }
static void test_soft_wav_a(void) { soft_tokens_case("a", 1); }
static void test_soft_wav_b(void) { soft_tokens_case("b", 1); }

/* transformers batches clips by padding the shorter one with invalid frames
   (the script checks its soft tokens do not change, 1.8e-7); so must these. */
static void test_padding_invariance(void) {
    golden g;
    g4_model m;
    unsigned char *mask = NULL, *mask2;
    const float *feat;
    float *feat2, *s1, *s2;
    void *arena;
    size_t bytes = 0;
    int nf, n1 = 0, n2 = 0, extra = 45, i;
    if (!golden_open(&g, MODEL)) { CHECK(0, "golden"); return; }
    if (g4_model_load(&m, tiny(MODEL)) != G4_OK) { CHECK(0, "load: %s", m.error); g4_model_free(&g.m); return; }
    feat = golden_features(&g, "b", &mask, &nf);
    CHECK(feat != NULL, "golden");
    if (!feat) { g4_model_free(&m); g4_model_free(&g.m); return; }
    feat2 = (float *)malloc(sizeof(float) * 128 * (size_t)(nf + extra));
    mask2 = (unsigned char *)calloc((size_t)(nf + extra), 1);
    memcpy(feat2, feat, sizeof(float) * 128 * (size_t)nf);
    for (i = nf * 128; i < (nf + extra) * 128; i++) feat2[i] = 0.0f; /* the extractor zeroes invalid frames */
    memcpy(mask2, mask, (size_t)nf);
    arena = arena_for(&m, nf + extra, &bytes);
    s1 = (float *)malloc(sizeof(float) * (size_t)g4_audio_tokens_max(nf + extra) * (size_t)m.config.hidden_size);
    s2 = (float *)malloc(sizeof(float) * (size_t)g4_audio_tokens_max(nf + extra) * (size_t)m.config.hidden_size);
    CHECK(g4_audio_encode(&m, feat, mask, nf, arena, bytes, NULL, s1, &n1) == G4_OK, "unpadded");
    CHECK(g4_audio_encode(&m, feat2, mask2, nf + extra, arena, bytes, NULL, s2, &n2) == G4_OK, "padded");
    CHECK(n1 == n2 && n1 > 0, "%d and %d soft tokens", n1, n2);
    if (n1 == n2) {
        double d = max_diff(s1, s2, (size_t)n1 * m.config.hidden_size);
        CHECK(d <= 1e-6, "padding moved the soft tokens by %g", d);
    }
    free(feat2); free(mask2); free(mask); free(s1); free(s2); free(arena);
    g4_model_free(&m);
    g4_model_free(&g.m);
}

/* The whole model with both clips: each WAV through the extractor and the
   tower, the soft tokens merged in order (g4_forward_mm), against
   Gemma4ForConditionalGeneration's logits (which batched the two clips),
   in one step and in steps of 7 rows (runs cut anywhere). Tolerance 1e-4 x
   max|logit| (the bound); the decoder alone is within ~1e-5. */
static void test_logits(void) {
    golden g;
    g4_model m;
    g4_session s;
    g4_session_config sc;
    float *soft = NULL, *logits = NULL;
    const float *ref;
    const int32_t *ids;
    int64_t numel;
    int n_ids, total = 0, c, chunks[2] = {0, 7}, k;
    const int H_room = 64;
    if (!golden_open(&g, MODEL)) { CHECK(0, "golden"); return; }
    if (g4_model_load(&m, tiny(MODEL)) != G4_OK) { CHECK(0, "load: %s", m.error); g4_model_free(&g.m); return; }
    ids = golden_ids(&g, "ids", &n_ids);
    ref = golden_f32(&g, "logits", &numel);
    CHECK(ids && ref && numel == (int64_t)n_ids * m.config.vocab_size, "golden ids and logits");
    soft = (float *)malloc(sizeof(float) * (size_t)H_room * (size_t)m.config.hidden_size);
    logits = (float *)malloc(sizeof(float) * (size_t)(ids ? n_ids : 1) * (size_t)m.config.vocab_size);
    for (c = 0; c < 2 && ids && ref; c++) { /* clip a, then clip b, from their WAVs */
        char wav[32], err[G4_ERROR_MAX] = "";
        size_t n;
        int rate, nf = 0, got = 0;
        unsigned char *mask = NULL;
        float *pcm, *feat = NULL;
        void *arena = NULL;
        size_t bytes = 0;
        g4_audio_run run;
        snprintf(wav, sizeof wav, "clip_%c.wav", "ab"[c]);
        pcm = read_wav(path2(tiny(MODEL), wav), &n, &rate, err);
        if (pcm) feat = features_of(pcm, (int)n, rate, &mask, &nf, err);
        CHECK(feat != NULL, "%s: %s", wav, err);
        if (feat) arena = arena_for(&m, nf, &bytes);
        memset(&run, 0, sizeof run);
        if (feat && arena && total + g4_audio_tokens_max(nf) <= H_room)
            CHECK(g4_audio_encode(&m, feat, mask, nf, arena, bytes, &run, soft + (size_t)total * m.config.hidden_size,
                                  &got) == G4_OK, "%s", run.error);
        total += got;
        free(pcm); free(feat); free(mask); free(arena);
    }
    for (k = 0; k < 2 && ids && ref; k++) {
        sc = g4_session_config_init();
        sc.max_context = n_ids;
        sc.max_chunk = chunks[k] ? chunks[k] : n_ids;
        if (g4_session_create(&s, &m, &sc) != G4_OK) { CHECK(0, "session: %s", s.error); break; }
        {
            g4_result r = g4_forward_mm(&s, ids, n_ids, soft, total, logits, G4_LOGITS_ALL, NULL);
            double d = r == G4_OK ? max_diff(logits, ref, (size_t)numel) : INFINITY, scale = max_abs(ref, (size_t)numel);
            CHECK(r == G4_OK, "g4_forward_mm: %s", s.error);
            printf("  %d ids with %d soft tokens, steps of %d: logits within %.3g of transformers (%.3g x max|logit| %.3g)\n",
                   n_ids, total, sc.max_chunk, d, d / scale, scale);
            CHECK(d <= 1e-4 * scale, "logits differ by %g (max |logit| %g)", d, scale);
        }
        g4_session_destroy(&s);
    }
    free(soft);
    free(logits);
    g4_model_free(&m);
    g4_model_free(&g.m);
}

/* ---------------------------------------------------------- bad inputs */

/* threads (g4_audio_run.pool): a 3-thread pool, with the arena of
   g4_audio_size_pool, gives the same bits as one thread; with an arena sized
   for one thread (g4_audio_size) the pool is not used, and the bits are the same */
static void test_threads(void) {
    golden g;
    g4_model m;
    g4_audio_run run;
    g4_pool *pool = NULL;
    unsigned char *mask = NULL;
    const float *feat;
    float *one = NULL, *three = NULL;
    void *a1 = NULL, *a3 = NULL;
    size_t b1 = 0, b3 = 0, rows;
    int nf = 0, n1 = 0, n3 = 0, c;
    if (!golden_open(&g, MODEL)) { CHECK(0, "golden"); return; }
    if (g4_model_load(&m, tiny(MODEL)) != G4_OK) { CHECK(0, "load: %s", m.error); g4_model_free(&g.m); return; }
    if (g4_pool_create(&pool, 3) != G4_OK) { skip("no threads in this build"); g4_model_free(&m); g4_model_free(&g.m); return; }
    feat = golden_features(&g, "a", &mask, &nf);
    CHECK(feat != NULL, "golden features");
    a1 = arena_for(&m, nf, &b1);
    CHECK(g4_audio_size_pool(&m, nf, pool, &b3) == G4_OK && b3 > b1, "size for 3 threads: %zu bytes, one %zu", b3, b1);
    if (posix_memalign(&a3, 64, b3)) a3 = NULL;
    rows = (size_t)g4_audio_tokens_max(nf > 0 ? nf : 1) * (size_t)m.config.hidden_size;
    one = (float *)malloc(sizeof(float) * rows);
    three = (float *)malloc(sizeof(float) * rows);
    if (feat && a1 && a3 && one && three) {
        memset(&run, 0, sizeof run);
        CHECK(g4_audio_encode(&m, feat, mask, nf, a1, b1, &run, one, &n1) == G4_OK, "%s", run.error);
        for (c = 0; c < 2; c++) {
            run.pool = pool;
            memset(three, 0, sizeof(float) * rows);
            CHECK(g4_audio_encode(&m, feat, mask, nf, c ? a1 : a3, c ? b1 : b3, &run, three, &n3) == G4_OK, "%s", run.error);
            CHECK(n3 == n1 && n1 > 0 && memcmp(one, three, sizeof(float) * (size_t)n1 * m.config.hidden_size) == 0,
                  "3 threads%s: %d soft tokens, one thread %d, max difference %.3g", c ? " (arena for one)" : "", n3, n1,
                  max_diff(one, three, (size_t)n1 * m.config.hidden_size));
        }
    }
    free(one); free(three); free(a1); free(a3); free(mask);
    g4_pool_free(pool);
    g4_model_free(&m);
    g4_model_free(&g.m);
}


static void test_bad_encode(void) {
    g4_model m, text;
    g4_audio_run run;
    float feat[8 * 128], soft[64 * 32];
    unsigned char mask[8];
    void *arena;
    size_t bytes = 0, small = 0;
    int n = -1, i;
    g4_result r;
    if (g4_model_load(&m, tiny(MODEL)) != G4_OK) { CHECK(0, "load: %s", m.error); return; }
    for (i = 0; i < 8 * 128; i++) feat[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    memset(mask, 1, sizeof mask);
    arena = arena_for(&m, 8, &bytes);
    memset(&run, 0, sizeof run);
    r = g4_audio_encode(&m, feat, NULL, 8, arena, bytes, &run, soft, &n);
    CHECK(r == G4_ERR_INPUT && strstr(run.error, "without a mask"), "no mask: %d %s", r, run.error);
    r = g4_audio_encode(&m, feat, mask, 0, arena, bytes, &run, soft, &n);
    CHECK(r == G4_ERR_INPUT && strstr(run.error, "0 feature frames"), "0 frames: %d %s", r, run.error);
    CHECK(g4_audio_size(&m, 4, &small) == G4_OK && small < bytes, "sizes grow with frames");
    r = g4_audio_encode(&m, feat, mask, 8, arena, small, &run, soft, &n);
    CHECK(r == G4_ERR_ARENA && strstr(run.error, "arena"), "small arena: %d %s", r, run.error);
    r = g4_audio_encode(&m, feat, mask, 8, (char *)arena + 4, bytes - 4, &run, soft, &n);
    CHECK(r == G4_ERR_ARENA && strstr(run.error, "aligned"), "misaligned arena: %d %s", r, run.error);
    feat[300] = NAN;
    r = g4_audio_encode(&m, feat, mask, 8, arena, bytes, &run, soft, &n);
    CHECK(r == G4_ERR_INPUT && strstr(run.error, "[2][44] is not finite"), "NaN: %d %s", r, run.error);
    feat[300] = 0.5f;
    r = g4_audio_encode(&m, feat, mask, 8, arena, bytes, NULL, soft, &n);
    CHECK(r == G4_OK && n == 2, "8 frames: %d, %d soft tokens", r, n);
    memset(mask, 0, sizeof mask);
    r = g4_audio_encode(&m, feat, mask, 8, arena, bytes, &run, soft, &n);
    CHECK(r == G4_OK && n == 0, "all frames invalid: %d, %d soft tokens", r, n);
    /* a text-only model */
    if (g4_model_load(&text, tiny("e2b_like")) == G4_OK) {
        size_t b2;
        CHECK(g4_audio_size(&text, 8, &b2) == G4_ERR_INPUT, "size without a tower");
        r = g4_audio_encode(&text, feat, mask, 8, arena, bytes, &run, soft, &n);
        CHECK(r == G4_ERR_INPUT && strstr(run.error, "no audio_config"), "text model: %d %s", r, run.error);
        g4_model_free(&text);
    }
    free(arena);
    g4_model_free(&m);
}

/* A copy of the checkpoint without one tower tensor: the text model still
   loads; the tower refuses, naming the tensor. */
static void test_missing_tensor(void) {
    g4_model src, m;
    st_entry *e;
    char dir[300], cfg[320];
    int i, k = 0;
    const char *drop = "model.audio_tower.layers.1.self_attn.per_dim_scale";
    if (g4_model_load(&src, tiny(MODEL)) != G4_OK) { CHECK(0, "load: %s", src.error); return; }
    e = (st_entry *)calloc((size_t)src.n_tensors, sizeof *e);
    for (i = 0; i < src.n_tensors; i++) {
        const g4__stinfo *st = &src.tensors[i];
        int d;
        if (strcmp(st->name, drop) == 0) continue;
        e[k].name = st->name;
        e[k].dtype = dtype_str(st->t.dtype);
        e[k].ndim = st->t.ndim;
        for (d = 0; d < st->t.ndim && d < 4; d++) e[k].shape[d] = st->t.shape[d];
        e[k].data = st->t.data;
        e[k].bytes = (size_t)(st->end - st->begin);
        k++;
    }
    snprintf(dir, sizeof dir, "%s/missing", g_tmp);
    mkdir(dir, 0755);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    copy_file(path2(tiny(MODEL), "config.json"), cfg);
    CHECK(k == src.n_tensors - 1, "the tensor to drop exists");
    st_write(path2(dir, "model.safetensors"), e, k, NULL);
    CHECK(g4_model_load(&m, dir) == G4_OK, "text still loads: %s", m.error);
    CHECK(!m.audio.loaded && strstr(m.audio.error, drop), "audio error: %s", m.audio.error);
    g4_model_free(&m);
    free(e);
    g4_model_free(&src);
}

/* audio_config fields: wrong types and values are G4_ERR_CONFIG naming the field. */
static void test_bad_config(void) {
    static const struct { const char *audio, *want; } cases[] = {
        {"\"audio_config\": 3", "'audio_config' must be an object"},
        {"\"audio_config\": {\"hidden_act\": \"gelu\"}", "audio_config.hidden_act"},
        {"\"audio_config\": {\"hidden_size\": 1023}", "audio_config.hidden_size 1023 must be even"},
        {"\"audio_config\": {\"hidden_size\": 30, \"num_attention_heads\": 4}", "multiple of num_attention_heads"},
        {"\"audio_config\": {\"num_hidden_layers\": 0}", "audio_config.num_hidden_layers"},
        {"\"audio_config\": {\"subsampling_conv_channels\": [130, 32]}", "multiple of 4"},
        {"\"audio_config\": {\"subsampling_conv_channels\": [128]}", "list of 2 integers"},
        {"\"audio_config\": {\"subsampling_conv_channels\": [128, \"x\"]}", "subsampling_conv_channels[1]"},
        {"\"audio_config\": {\"attention_context_left\": 0}", "audio_config.attention_context_left"},
        {"\"audio_config\": {\"attention_logit_cap\": -1}", "audio_config.attention_logit_cap"},
        {"\"audio_config\": {\"use_clipped_linears\": 1}", "audio_config.use_clipped_linears"},
        {"\"audio_config\": {\"model_type\": \"gemma3n_audio\"}", "audio_config.model_type"},
        {"\"audio_config\": {\"rms_norm_eps\": \"1e-6\"}", "audio_config.rms_norm_eps"},
    };
    const char *text = "\"text_config\": {\"vocab_size\": 16, \"hidden_size\": 8, \"intermediate_size\": 8, "
                       "\"num_hidden_layers\": 1, \"num_attention_heads\": 1, \"num_key_value_heads\": 1, \"head_dim\": 8}";
    char json[1024];
    g4_config c;
    size_t i;
    g4_result r;
    snprintf(json, sizeof json, "{\"model_type\": \"gemma4\", %s, \"audio_config\": {}}", text);
    r = g4_config_parse(&c, json, strlen(json), "t.json");
    CHECK(r == G4_OK && c.audio.present && c.audio.hidden_size == 1024 && c.audio.subsampling_conv_channels[1] == 32 &&
          c.audio.attention_context_left == 13 && c.audio.gradient_clipping == 1e10f && c.audio.use_clipped_linears,
          "defaults: %d %s", r, c.error);
    snprintf(json, sizeof json, "{\"model_type\": \"gemma4\", %s, \"audio_config\": null}", text);
    CHECK(g4_config_parse(&c, json, strlen(json), "t.json") == G4_OK && !c.audio.present, "null: %s", c.error);
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(json, sizeof json, "{\"model_type\": \"gemma4\", %s, %s}", text, cases[i].audio);
        r = g4_config_parse(&c, json, strlen(json), "t.json");
        CHECK(r == G4_ERR_CONFIG && strstr(c.error, cases[i].want) && strstr(c.error, "t.json"), "%s -> %d %s",
              cases[i].audio, r, c.error);
    }
    /* the released E2B config parses with its values */
    CHECK(g4_config_load(&c, "data/configs/gemma-4-E2B.json") == G4_OK && c.audio.present && c.audio.hidden_size == 1024 &&
          c.audio.num_hidden_layers == 12 && c.audio.output_proj_dims == 1536 && c.audio.attention_invalid_logits_value == -1e9f,
          "E2B: %s", c.error);
}

/* processor_config.json's feature extractor (g4_audio_fe_load): the released
   layout (data/mm/e2b_av, saved by the real Gemma4Processor) gives the
   defaults; fe_settings.json (every setting unlike its default: 64 bins,
   25 ms frames, 12.5 ms hops, fft_overdrive, 50-7000 Hz, mel_floor 1e-5,
   input_scale_factor 0.5) gives Gemma4AudioFeatureExtractor.from_dict's
   sizes, mask and features on clip a (FEAT_TOL, the features' bound above;
   the default settings' features are 101 x 128, so the golden tells the
   settings apart). */
static void test_fe_settings(void) {
    g4_audio_fe fe, def;
    golden g;
    char err[G4_ERROR_MAX];
    size_t n;
    int rate, nf = 0, ngf = 0, i, same;
    float *pcm, *feat = NULL, *scratch = NULL;
    unsigned char *mask = NULL;
    const int32_t *sizes, *gmask;
    const float *gf;
    int64_t numel = 0;
    CHECK(g4_audio_fe_init(&def) == G4_OK, "init");
    CHECK(g4_audio_fe_load(&fe, path2(g_data, "mm/e2b_av")) == G4_OK, "released config: %s", fe.error);
    same = fe.sampling_rate == def.sampling_rate && fe.feature_size == def.feature_size &&
           fe.frame_length == def.frame_length && fe.hop_length == def.hop_length && fe.fft_length == def.fft_length &&
           fe.min_frequency == def.min_frequency && fe.max_frequency == def.max_frequency && fe.mel_floor == def.mel_floor &&
           fe.input_scale_factor == 1.0 && fe.audio_seq_length == 750 && fe.max_length == 480000;
    for (i = 0; same && i < def.frame_length; i++) same = fe.window[i] == def.window[i];
    for (i = 0; same && i < (def.fft_length / 2 + 1) * def.feature_size; i++) same = fe.mel_filters[i] == def.mel_filters[i];
    CHECK(same, "the released processor_config.json gives the defaults and their tables");
    g4_audio_fe_free(&fe);
    g4_audio_fe_free(&def);

    if (!golden_open_file(&g, MODEL, "fe_settings_golden.safetensors")) { CHECK(0, "golden"); return; }
    CHECK(g4_audio_fe_load(&fe, path2(tiny(MODEL), "fe_settings.json")) == G4_OK, "fe_settings.json: %s", fe.error);
    sizes = golden_ids(&g, "sizes", &i);
    gmask = golden_ids(&g, "mask", &ngf);
    gf = golden_f32(&g, "features", &numel);
    CHECK(sizes && i == 3 && gmask && gf && numel == (int64_t)ngf * 64, "golden tensors");
    if (!sizes || !gmask || !gf || fe.window == NULL) { g4_audio_fe_free(&fe); g4_model_free(&g.m); return; }
    CHECK(fe.feature_size == 64 && fe.frame_length == sizes[0] && fe.hop_length == sizes[1] && fe.fft_length == sizes[2],
          "sizes %d %d %d %d, transformers' %d %d %d", fe.feature_size, fe.frame_length, fe.hop_length, fe.fft_length,
          sizes[0], sizes[1], sizes[2]);
    pcm = read_wav(path2(tiny(MODEL), "clip_a.wav"), &n, &rate, err);
    CHECK(pcm != NULL, "clip_a: %s", err);
    if (pcm) {
        nf = g4_audio_fe_frames(&fe, (int)n);
        feat = (float *)malloc(sizeof(float) * (size_t)(nf > 0 ? nf : 1) * 64);
        mask = (unsigned char *)malloc((size_t)(nf > 0 ? nf : 1));
        scratch = (float *)malloc(sizeof(float) * g4_audio_fe_scratch(&fe));
        CHECK(g4_audio_features(&fe, pcm, (int)n, rate, feat, mask, &nf, scratch) == G4_OK, "features: %s", fe.error);
        CHECK(nf == ngf, "%d frames, transformers %d", nf, ngf);
        if (nf == ngf) {
            double d = max_diff(feat, gf, (size_t)nf * 64);
            for (i = 0, same = 1; i < nf; i++) same &= mask[i] == (gmask[i] != 0);
            printf("  fe_settings.json: %d frames of 64: mask %s, features within %.3g of transformers (max |value| %.3g)\n",
                   nf, same ? "equal" : "differs", d, max_abs(gf, (size_t)nf * 64));
            CHECK(same && d <= FEAT_TOL, "mask %d, features %g (tolerance %g)", same, d, FEAT_TOL);
        }
    }
    free(pcm); free(feat); free(mask); free(scratch);
    g4_audio_fe_free(&fe);
    g4_model_free(&g.m);
}

/* bad settings are G4_ERR_CONFIG naming the field; the model check */
static void test_fe_settings_bad(void) {
    static const struct { const char *json, *needle; } bad[] = {
        {"{\"feature_extractor\": {\"feature_size\": 0}}", "feature_extractor.feature_size' is 0"},
        {"{\"feature_extractor\": {\"sampling_rate\": \"16000\"}}", "feature_extractor.sampling_rate' must be an integer"},
        {"{\"feature_extractor\": {\"frame_length\": 400}}", "'feature_extractor.frame_length' is 400, but frame_length_ms 20"},
        {"{\"feature_extractor\": {\"frame_length_ms\": 25.0, \"frame_length\": 320}}", "frame_length' is 320"},
        {"{\"feature_extractor\": {\"hop_length\": 100}}", "'feature_extractor.hop_length' is 100"},
        {"{\"feature_extractor\": {\"fft_length\": 1024}}", "'feature_extractor.fft_length' is 1024"},
        {"{\"feature_extractor\": {\"frame_length_ms\": 0.01}}", "frame_length_ms' is 0.01"},
        {"{\"feature_extractor\": {\"hop_length_ms\": -1}}", "hop_length_ms' is -1"},
        {"{\"feature_extractor\": {\"min_frequency\": 9000.0}}", "max_frequency' is 8000, not above"},
        {"{\"feature_extractor\": {\"mel_floor\": -1}}", "mel_floor' is -1"},
        {"{\"feature_extractor\": {\"dither\": 0.0001}}", "dither' is 0.0001"},
        {"{\"feature_extractor\": {\"preemphasis\": 0.97}}", "preemphasis' is 0.97"},
        {"{\"feature_extractor\": {\"per_bin_mean\": [0.0]}}", "per_bin_mean' is set"},
        {"{\"feature_extractor\": {\"padding_side\": \"left\"}}", "padding_side' is \"left\""},
        {"{\"feature_extractor\": {\"return_attention_mask\": false}}", "return_attention_mask' is false"},
        {"{\"feature_extractor\": {\"fft_overdrive\": 1}}", "fft_overdrive' must be true or false"},
        {"{\"feature_extractor\": {\"feature_extractor_type\": \"Gemma4UnifiedAudioFeatureExtractor\"}}", "12B's"},
        {"{\"audio_seq_length\": 0}", "'audio_seq_length' is 0"},
        {"{\"feature_extractor\": 3}", "'feature_extractor' must be an object"},
        {"[1]", "top level must be a JSON object"},
        {"{\"feature_extractor\": {", "t.json"},
    };
    g4_audio_fe fe;
    g4_config c;
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&fe, 0, sizeof fe);
        g4_result r = g4_audio_fe_parse(&fe, bad[i].json, strlen(bad[i].json), "t.json");
        CHECK(r != G4_OK && strstr(fe.error, bad[i].needle) && strstr(fe.error, "t.json") && !fe.window,
              "%s: %d '%s'", bad[i].json, (int)r, fe.error);
    }
    /* a flat preprocessor_config.json and hop rounding half to even: 16000 * 0.03125 / 1000 = 0.5 -> 0 is refused,
       16000 * 10.03125 / 1000 = 160.5 -> 160 (Python's round) */
    {
        const char *j = "{\"hop_length_ms\": 10.03125, \"sampling_rate\": 16000}";
        CHECK(g4_audio_fe_parse(&fe, j, strlen(j), "t.json") == G4_OK && fe.hop_length == 160, "160.5 -> %d: %s",
              fe.hop_length, fe.error);
        g4_audio_fe_free(&fe);
    }
    CHECK(g4_audio_fe_load(&fe, path2(tiny(MODEL), "no-such-dir")) == G4_OK && fe.window && fe.feature_size == 128,
          "a directory without a config: the defaults");
    CHECK(g4_config_load(&c, path2(tiny(MODEL), "config.json")) == G4_OK, "config: %s", c.error);
    CHECK(g4_audio_fe_check(&fe, &c) == G4_OK, "the defaults fit e2b_audio: %s", fe.error);
    g4_audio_fe_free(&fe);
    CHECK(g4_audio_fe_load(&fe, path2(tiny(MODEL), "fe_settings.json")) == G4_OK &&
          g4_audio_fe_check(&fe, &c) == G4_ERR_CONFIG && strstr(fe.error, "feature_size 64") &&
          strstr(fe.error, "subsampling_conv_channels[0]"), "64 bins for a 128-bin tower: %s", fe.error);
    g4_audio_fe_free(&fe);
}

static void test_bad_features(void) {
    g4_audio_fe fe;
    float *pcm, *feat, *scratch;
    unsigned char *mask;
    int nf = -1, i;
    g4_result r;
    CHECK(g4_audio_fe_init(&fe) == G4_OK, "init");
    pcm = (float *)calloc(480001, sizeof(float));
    feat = (float *)malloc(sizeof(float) * 3001 * 128);
    mask = (unsigned char *)malloc(3001);
    scratch = (float *)malloc(sizeof(float) * g4_audio_fe_scratch(&fe));
    for (i = 0; i < 480001; i++) pcm[i] = 0.1f * (float)((int)(((unsigned)i * 7919u) % 200u) - 100) / 100.0f;
    r = g4_audio_features(&fe, pcm, 16000, 8000, feat, mask, &nf, scratch);
    CHECK(r == G4_ERR_INPUT && strstr(fe.error, "8000 Hz") && nf == 0, "rate: %d %s", r, fe.error);
    r = g4_audio_features(&fe, pcm, 480001, 16000, feat, mask, &nf, scratch);
    CHECK(r == G4_ERR_INPUT && strstr(fe.error, "480001 samples"), "30 s: %d %s", r, fe.error);
    /* 480000 samples (transformers: input_features [1, 2999, 128], every frame valid) */
    CHECK(g4_audio_fe_frames(&fe, 480000) == 2999, "30 s: %d frames", g4_audio_fe_frames(&fe, 480000));
    r = g4_audio_features(&fe, pcm, 480000, 16000, feat, mask, &nf, scratch);
    CHECK(r == G4_OK && nf == 2999 && mask[0] && mask[2998], "exactly 30 s: %d %d %s", r, nf, fe.error);
    /* the smallest clips: 128 samples make no frame, 129 one (invalid), 161 one valid */
    CHECK(g4_audio_fe_frames(&fe, 128) == 0 && g4_audio_fe_frames(&fe, 129) == 1, "frame counts");
    r = g4_audio_features(&fe, pcm, 128, 16000, feat, mask, &nf, scratch);
    CHECK(r == G4_ERR_INPUT && strstr(fe.error, "no feature frame"), "128 samples: %d %s", r, fe.error);
    r = g4_audio_features(&fe, pcm, 160, 16000, feat, mask, &nf, scratch);
    CHECK(r == G4_OK && nf == 1 && !mask[0] && feat[0] == 0.0f, "160 samples: %d %d", r, nf);
    r = g4_audio_features(&fe, pcm, 161, 16000, feat, mask, &nf, scratch);
    CHECK(r == G4_OK && nf == 1 && mask[0], "161 samples: %d %d", r, nf);
    pcm[500] = pcm[501] = pcm[502] = 3e38f; /* finite, but their spectrum overflows float32 */
    r = g4_audio_features(&fe, pcm, 1000, 16000, feat, mask, &nf, scratch);
    CHECK(r == G4_ERR_INPUT && strstr(fe.error, "not finite") && nf == 0, "overflow: %d %s", r, fe.error);
    pcm[500] = pcm[501] = pcm[502] = 0.0f;
    pcm[77] = INFINITY;
    r = g4_audio_features(&fe, pcm, 1000, 16000, feat, mask, &nf, scratch);
    CHECK(r == G4_ERR_INPUT && strstr(fe.error, "sample 77"), "inf: %d %s", r, fe.error);
    g4_audio_fe_free(&fe);
    free(pcm); free(feat); free(mask); free(scratch);
}

/* A WAV header (44 bytes) for `data_bytes` of data. */
static size_t wav_header(unsigned char *h, unsigned format, unsigned channels, unsigned rate, unsigned bits,
                         unsigned data_bytes) {
    unsigned align = channels * bits / 8;
    memcpy(h, "RIFF", 4);
    h[4] = (unsigned char)((36 + data_bytes) & 255); h[5] = (unsigned char)((36 + data_bytes) >> 8 & 255);
    h[6] = (unsigned char)((36 + data_bytes) >> 16 & 255); h[7] = (unsigned char)((36 + data_bytes) >> 24);
    memcpy(h + 8, "WAVEfmt ", 8);
    h[16] = 16; h[17] = h[18] = h[19] = 0;
    h[20] = (unsigned char)format; h[21] = (unsigned char)(format >> 8);
    h[22] = (unsigned char)channels; h[23] = 0;
    h[24] = (unsigned char)(rate & 255); h[25] = (unsigned char)(rate >> 8 & 255); h[26] = (unsigned char)(rate >> 16); h[27] = 0;
    h[28] = h[29] = h[30] = h[31] = 0; /* byte rate: not checked */
    h[32] = (unsigned char)align; h[33] = 0;
    h[34] = (unsigned char)bits; h[35] = 0;
    memcpy(h + 36, "data", 4);
    h[40] = (unsigned char)(data_bytes & 255); h[41] = (unsigned char)(data_bytes >> 8 & 255);
    h[42] = (unsigned char)(data_bytes >> 16 & 255); h[43] = (unsigned char)(data_bytes >> 24);
    return 44;
}

static void test_wav(void) {
    unsigned char w[44 + 64];
    float out[32];
    size_t n;
    int rate;
    char err[G4_ERROR_MAX];
    g4_result r;
    memset(w, 0, sizeof w);
    wav_header(w, 1, 1, 16000, 16, 8);
    w[44] = 0x00; w[45] = 0x80; /* -32768 */
    w[46] = 0xff; w[47] = 0x7f; /* 32767 */
    w[48] = 0x01; w[49] = 0x00; /* 1 */
    w[50] = 0xff; w[51] = 0xff; /* -1 */
    r = g4_wav_parse(w, 52, out, 32, &n, &rate, err);
    CHECK(r == G4_OK && n == 4 && rate == 16000 && out[0] == -1.0f && out[1] == 32767.0f / 32768.0f &&
          out[2] == 1.0f / 32768.0f && out[3] == -1.0f / 32768.0f, "pcm16: %d %s", r, err);
    r = g4_wav_parse(w, 52, out, 3, &n, &rate, err);
    CHECK(r == G4_ERR_INPUT && strstr(err, "do not fit"), "cap: %s", err);
    wav_header(w, 1, 2, 16000, 16, 8);
    CHECK(g4_wav_parse(w, 52, out, 32, &n, &rate, err) == G4_ERR_INPUT && strstr(err, "2 channels"), "stereo: %s", err);
    wav_header(w, 1, 1, 16000, 8, 8);
    CHECK(g4_wav_parse(w, 52, out, 32, &n, &rate, err) == G4_ERR_INPUT && strstr(err, "8 bits"), "8-bit: %s", err);
    wav_header(w, 3, 1, 16000, 64, 8);
    CHECK(g4_wav_parse(w, 52, out, 32, &n, &rate, err) == G4_ERR_INPUT && strstr(err, "format 3 with 64 bits"), "f64: %s", err);
    wav_header(w, 1, 1, 16000, 16, 64);
    CHECK(g4_wav_parse(w, 52, out, 32, &n, &rate, err) == G4_ERR_INPUT && strstr(err, "truncated"), "short: %s", err);
    wav_header(w, 1, 1, 16000, 16, 7);
    CHECK(g4_wav_parse(w, 51, out, 32, &n, &rate, err) == G4_ERR_INPUT && strstr(err, "whole number"), "odd: %s", err);
    wav_header(w, 1, 1, 44100, 16, 8);
    CHECK(g4_wav_parse(w, 52, out, 32, &n, &rate, err) == G4_OK && rate == 44100, "the rate is reported: %d", rate);
    memcpy(w + 8, "AVI ", 4);
    CHECK(g4_wav_parse(w, 52, out, 32, &n, &rate, err) == G4_ERR_INPUT && strstr(err, "RIFF/WAVE"), "not wave: %s", err);
    wav_header(w, 1, 1, 16000, 16, 8);
    memcpy(w + 12, "junk", 4); /* the fmt chunk renamed: skipped as an unknown chunk */
    CHECK(g4_wav_parse(w, 52, out, 32, &n, &rate, err) == G4_ERR_INPUT && strstr(err, "no fmt chunk"), "no fmt: %s", err);
    CHECK(g4_wav_parse(w, 10, out, 32, &n, &rate, err) == G4_ERR_INPUT, "10 bytes");
}

/* The CLI: gemma4 audio DIR CLIP.wav --out FILE writes the soft tokens; bad
   input is one line on stderr and exit 1. */
/* ------------------------------------------------------------- bf16 */
/* The bf16 mode (g4_audio_run.bf16) against the tower run by transformers in
   bfloat16 (data/tiny/e2b_audio/bf16.safetensors, make_audio_goldens.py --bf16):
   every tap and the soft tokens of both clips, counted bit for bit. */
typedef struct { golden *g; int compared, exact; size_t values, differ; double worst; char worst_name[128]; } bf16check;

static void bf16_tap_cb(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    bf16check *bc = (bf16check *)user;
    char key[160];
    const g4_tensor *t, *rt;
    int r, nr, c;
    size_t differ = 0;
    double worst = 0, scale = 0;
    (void)layer; (void)pos0;
    snprintf(key, sizeof key, "a.tap.%s", name);
    if (!(t = g4_model_tensor(&bc->g->m, key))) return;
    snprintf(key, sizeof key, "a.tap_rows.%s", name);
    rt = g4_model_tensor(&bc->g->m, key);
    nr = rt ? (int)rt->shape[0] : rows;
    if (t->dtype != G4_BF16 || t->ndim != 2 || t->shape[1] != cols || t->shape[0] != nr) {
        CHECK(0, "bf16 tap %s: [%d, %d], golden %s [%lld, ..]", name, rows, cols, dtype_str(t->dtype), (long long)t->shape[0]);
        return;
    }
    for (r = 0; r < nr * cols; r++) if (fabs(g4__get(t, (size_t)r)) > scale) scale = fabs(g4__get(t, (size_t)r));
    for (r = 0; r < nr; r++) {
        int row = rt ? ((const int32_t *)rt->data)[r] : r;
        for (c = 0; c < cols; c++) {
            float ours = data[(size_t)row * cols + c], gold = g4__get(t, (size_t)r * cols + c);
            if (memcmp(&ours, &gold, 4)) {
                differ++;
                if (fabs((double)ours - gold) > worst) worst = fabs((double)ours - gold);
            }
        }
    }
    bc->compared++;
    bc->exact += differ == 0;
    bc->values += (size_t)nr * cols;
    bc->differ += differ;
    if (differ) printf("  bf16 tap %s: %zu of %d values differ, by up to %.3g (%.3g of max |golden|)\n", name, differ, nr * cols, worst,
                       worst / (scale > 0 ? scale : 1));
    if (worst / (scale > 0 ? scale : 1) > bc->worst) {
        bc->worst = worst / (scale > 0 ? scale : 1);
        snprintf(bc->worst_name, sizeof bc->worst_name, "%s", name);
    }
}

static void test_bf16(void) {
    golden g, gb;
    g4_model m;
    g4_pool *pool = NULL;
    int k, threads;
    if (!golden_open(&g, MODEL) || !golden_open_file(&gb, MODEL, "bf16.safetensors")) { CHECK(0, "goldens"); return; }
    if (g4_model_load(&m, tiny(MODEL)) != G4_OK) { CHECK(0, "load: %s", m.error); return; }
    if (g4_pool_create(&pool, 3) != G4_OK) pool = NULL;
    for (k = 0; k < 2; k++) {
        const char *clip = k ? "b" : "a";
        unsigned char *mask = NULL;
        int nf = 0, n_soft = 0;
        const float *feat = golden_features(&g, clip, &mask, &nf);
        float *soft = NULL, *first = NULL;
        void *arena = NULL;
        size_t bytes = 0;
        char key[64];
        const g4_tensor *gt;
        if (!feat) { CHECK(0, "features %s", clip); continue; }
        snprintf(key, sizeof key, "%s.soft_tokens", clip);
        gt = g4_model_tensor(&gb.m, key);
        soft = (float *)malloc(sizeof(float) * (size_t)g4_audio_tokens_max(nf) * (size_t)m.config.hidden_size);
        first = (float *)malloc(sizeof(float) * (size_t)g4_audio_tokens_max(nf) * (size_t)m.config.hidden_size);
        if (g4_audio_size_pool(&m, nf, pool, &bytes) != G4_OK || posix_memalign(&arena, 64, bytes)) arena = NULL;
        for (threads = 1; arena && soft && first && threads <= (pool ? 3 : 1); threads += 2) {
            g4_audio_run run;
            bf16check bc;
            size_t differ = 0, i, n;
            memset(&run, 0, sizeof run);
            memset(&bc, 0, sizeof bc);
            bc.g = &gb;
            run.bf16 = 1;
            run.pool = threads > 1 ? pool : NULL;
            if (k == 0 && threads == 1) { run.tap = bf16_tap_cb; run.tap_user = &bc; }
            CHECK(g4_audio_encode(&m, feat, mask, nf, arena, bytes, &run, soft, &n_soft) == G4_OK, "%s", run.error);
            n = (size_t)n_soft * (size_t)m.config.hidden_size;
            if (!gt || gt->dtype != G4_BF16 || (size_t)(gt->shape[0] * gt->shape[1]) != n) { CHECK(0, "bf16 %s: %d soft tokens", key, n_soft); continue; }
            for (i = 0; i < n; i++) { float v = g4__get(gt, i); differ += memcmp(&v, soft + i, 4) != 0; }
            if (run.tap) {
                printf("  clip a: %d of %d taps bit-identical (%zu of %zu values differ; worst %s, %.3g of its max)\n", bc.exact,
                       bc.compared, bc.differ, bc.values, bc.worst_name, bc.worst);
                CHECK(bc.compared == 41, "%d bf16 taps compared", bc.compared);
            }
            printf("  clip %s, %d thread%s: %d soft tokens, %zu of %zu values differ from transformers in bf16\n", clip, threads,
                   threads > 1 ? "s" : "", n_soft, differ, n);
            CHECK(differ == 0, "clip %s: %zu bf16 soft-token values differ", clip, differ);
            if (threads == 1) memcpy(first, soft, sizeof(float) * n);
            else CHECK(memcmp(first, soft, sizeof(float) * n) == 0, "clip %s: 3 threads differ from one", clip);
        }
        free(arena); free(soft); free(first); free(mask);
    }
    g4_pool_free(pool);
    g4_model_free(&m);
    g4_model_free(&g.m);
    g4_model_free(&gb.m);
}

/* bf16 end to end: clip b's bf16 soft tokens into the bf16 decoder on one.ids,
   against the whole model in bf16 (one.logits), bit for bit */
static void test_bf16_logits(void) {
    golden g, gb;
    g4_model m;
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    g4_audio_run run;
    unsigned char *mask = NULL;
    int nf = 0, n_soft = 0, n_ids = 0, V;
    const float *feat;
    const int32_t *ids;
    const g4_tensor *gl;
    float soft[64 * 32], *logits = NULL;
    void *arena = NULL;
    size_t bytes = 0, i, differ = 0;
    if (!golden_open(&g, MODEL) || !golden_open_file(&gb, MODEL, "bf16.safetensors")) { CHECK(0, "goldens"); return; }
    if (g4_model_load(&m, tiny(MODEL)) != G4_OK) { CHECK(0, "load: %s", m.error); return; }
    V = m.config.vocab_size;
    feat = golden_features(&g, "b", &mask, &nf);
    ids = golden_ids(&g, "one.ids", &n_ids);
    gl = g4_model_tensor(&gb.m, "one.logits");
    memset(&run, 0, sizeof run);
    run.bf16 = 1;
    sc.max_context = 64; sc.max_chunk = 64; sc.bf16 = 1;
    if (feat && ids && gl && gl->dtype == G4_BF16 && gl->shape[0] == n_ids && gl->shape[1] == V && (arena = arena_for(&m, nf, &bytes)) &&
        g4_audio_tokens_max(nf) <= 64 && g4_audio_encode(&m, feat, mask, nf, arena, bytes, &run, soft, &n_soft) == G4_OK &&
        g4_session_create(&s, &m, &sc) == G4_OK) {
        logits = (float *)malloc(sizeof(float) * (size_t)n_ids * V);
        CHECK(g4_forward_mm(&s, ids, n_ids, soft, n_soft, logits, G4_LOGITS_ALL, NULL) == G4_OK, "%s", s.error);
        for (i = 0; i < (size_t)n_ids * V; i++) { float v = g4__get(gl, i); differ += memcmp(&v, logits + i, 4) != 0; }
        printf("  clip b in its prompt: %d ids, %d soft tokens, %zu of %zu bf16 logits differ from transformers in bf16\n", n_ids, n_soft,
               differ, (size_t)n_ids * V);
        CHECK(differ == 0, "%zu bf16 logits differ", differ);
        g4_session_destroy(&s);
    } else CHECK(0, "bf16 logits setup: %s", run.error);
    free(logits); free(arena); free(mask);
    g4_model_free(&m);
    g4_model_free(&g.m);
    g4_model_free(&gb.m);
}

static const char *g_cli = "build/gemma4";

static void test_cli(void) {
    char args[1024], out[4096], err[4096], path[300], wav8k[300];
    golden g;
    const float *ref;
    int64_t numel;
    int st;
    if (!golden_open(&g, MODEL)) { CHECK(0, "golden"); return; }
    ref = golden_f32(&g, "b.soft_tokens", &numel);
    snprintf(path, sizeof path, "%s/soft.f32", g_tmp);
    snprintf(args, sizeof args, "audio %s %s --out %s", tiny(MODEL), path2(tiny(MODEL), "clip_b.wav"), path);
    st = run_cli(g_cli, args, out, sizeof out, NULL, err, sizeof err);
    CHECK(st == 0 && strstr(out, "11 soft tokens"), "exit %d: %s%s", st, out, err);
    if (st == 0 && ref) {
        char *bytes = NULL;
        size_t len = 0;
        char e2[G4_ERROR_MAX];
        CHECK(g4__read_file(path, &bytes, &len, 1 << 20, e2) == G4_OK && len == (size_t)numel * sizeof(float), "%s: %zu bytes", path, len);
        if (bytes && len == (size_t)numel * sizeof(float)) {
            double d = max_diff((const float *)(void *)bytes, ref, (size_t)numel);
            CHECK(d <= SOFT_TOL, "the CLI's soft tokens differ by %g", d);
        }
        free(bytes);
    }
    { /* --threads: the tower on a pool of 3 writes the same bytes as one thread */
        char p1[300], *b1 = NULL, *b3 = NULL, e2[G4_ERROR_MAX];
        size_t l1 = 0, l3 = 0;
        int t;
        for (t = 1; t <= 3; t += 2) {
            snprintf(p1, sizeof p1, "%s/soft%d.f32", g_tmp, t);
            snprintf(args, sizeof args, "audio %s %s --out %s --threads %d", tiny(MODEL), path2(tiny(MODEL), "clip_b.wav"),
                     p1, t);
            st = run_cli(g_cli, args, out, sizeof out, NULL, err, sizeof err);
            CHECK(st == 0, "audio --threads %d: exit %d: %s%s", t, st, out, err);
            if (st == 0) g4__read_file(p1, t == 1 ? &b1 : &b3, t == 1 ? &l1 : &l3, 1 << 20, e2);
        }
        CHECK(b1 && b3 && l1 == l3 && l1 > 0 && memcmp(b1, b3, l1) == 0, "audio --threads 3 differs from --threads 1");
        free(b1);
        free(b3);
    }
    { /* logits --audio: the ids' one <|audio|> expanded and filled, against transformers with clip b alone */
        const float *lref = golden_f32(&g, "one.logits", &numel);
        int64_t ln = numel;
        snprintf(path, sizeof path, "%s/logits.f32", g_tmp);
        snprintf(args, sizeof args, "logits %s --ids 2,17,200,246,77,123 --audio %s --out %s", tiny(MODEL),
                 path2(tiny(MODEL), "clip_b.wav"), path);
        st = run_cli(g_cli, args, out, sizeof out, NULL, err, sizeof err);
        CHECK(st == 0 && strstr(out, "wrote 18 x 256"), "logits --audio: exit %d: %s%s", st, out, err);
        if (st == 0 && lref) {
            char *bytes = NULL, e2[G4_ERROR_MAX];
            size_t len = 0;
            CHECK(g4__read_file(path, &bytes, &len, 1 << 20, e2) == G4_OK && len == (size_t)ln * sizeof(float), "%zu bytes", len);
            if (bytes && len == (size_t)ln * sizeof(float)) {
                double d = max_diff((const float *)(void *)bytes, lref, (size_t)ln), sc = max_abs(lref, (size_t)ln);
                printf("  logits --audio: within %.3g x max|logit| of transformers\n", d / sc);
                CHECK(d <= 1e-4 * sc, "the CLI's logits differ by %g (max %g)", d, sc);
            }
            free(bytes);
        }
        snprintf(args, sizeof args, "logits %s --ids 2,17,200,77 --audio %s --out %s", tiny(MODEL),
                 path2(tiny(MODEL), "clip_b.wav"), path);
        st = run_cli(g_cli, args, out, sizeof out, NULL, err, sizeof err);
        CHECK(st == 1 && strstr(err, "0 audio placeholders"), "no placeholder: exit %d: %s", st, err);
    }
    { /* an 8 kHz WAV: refused by the extractor, as transformers refuses it */
        unsigned char h[44 + 400];
        FILE *f;
        memset(h, 0, sizeof h);
        wav_header(h, 1, 1, 8000, 16, 400);
        snprintf(wav8k, sizeof wav8k, "%s/8k.wav", g_tmp);
        if ((f = fopen(wav8k, "wb"))) { fwrite(h, 1, sizeof h, f); fclose(f); }
    }
    {
        static const struct { const char *fmt, *want; } bad[] = {
            {"audio %s %s --out %s", "8000 Hz"},                         /* model, 8k wav, out */
            {"audio %s %s", "--out FILE is required"},
            {"audio data/tiny/e2b_like %s --out %s", "no audio tower"},
            {"audio %s %s/missing.wav --out %s", "missing.wav"},
        };
        size_t i;
        for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            int lines = 0;
            const char *c;
            if (i == 0) snprintf(args, sizeof args, bad[i].fmt, tiny(MODEL), wav8k, path);
            else if (i == 1) snprintf(args, sizeof args, bad[i].fmt, tiny(MODEL), path2(tiny(MODEL), "clip_b.wav"));
            else if (i == 2) snprintf(args, sizeof args, bad[i].fmt, path2(tiny(MODEL), "clip_b.wav"), path);
            else snprintf(args, sizeof args, bad[i].fmt, tiny(MODEL), g_tmp, path);
            st = run_cli(g_cli, args, out, sizeof out, NULL, err, sizeof err);
            for (c = err; *c; c++) lines += *c == '\n';
            CHECK(st == 1 && lines == 1 && strstr(err, bad[i].want), "%s: exit %d, stderr: %s", args, st, err);
        }
    }
    g4_model_free(&g.m);
}

/* --bf16 on the CLI: `audio --bf16` from each WAV (1 and 3 threads) writes
   transformers' bf16 soft tokens (the WAV's features differ from the golden's
   by float32 ulps: the same values after the cast to bf16, on both clips);
   `logits --bf16 --audio` writes transformers' bf16 logits */
static void test_cli_bf16(void) {
    golden gb;
    char args[1024], out[4096], err[4096], path[300];
    int k, t, st;
    if (!golden_open_file(&gb, MODEL, "bf16.safetensors")) { CHECK(0, "bf16 golden"); return; }
    for (k = 0; k < 2; k++)
        for (t = 1; t <= 3; t += 2) {
            const g4_tensor *gt = g4_model_tensor(&gb.m, k ? "b.soft_tokens" : "a.soft_tokens");
            char *bytes = NULL, e2[G4_ERROR_MAX];
            size_t len = 0, i, differ = 0, n = gt ? (size_t)(gt->shape[0] * gt->shape[1]) : 0;
            snprintf(path, sizeof path, "%s/bf16_%d_%d.f32", g_tmp, k, t);
            snprintf(args, sizeof args, "audio %s %s --bf16 --threads %d --out %s", tiny(MODEL),
                     path2(tiny(MODEL), k ? "clip_b.wav" : "clip_a.wav"), t, path);
            st = run_cli(g_cli, args, out, sizeof out, NULL, err, sizeof err);
            CHECK(st == 0, "audio --bf16: exit %d: %s%s", st, out, err);
            if (st == 0 && gt && g4__read_file(path, &bytes, &len, 1 << 20, e2) == G4_OK && len == n * sizeof(float)) {
                for (i = 0; i < n; i++) { float v = g4__get(gt, i); differ += memcmp(&v, bytes + 4 * i, 4) != 0; }
                CHECK(differ == 0, "audio --bf16 --threads %d clip %c: %zu of %zu values differ from transformers in bf16", t, k ? 'b' : 'a',
                      differ, n);
            } else CHECK(0, "audio --bf16 clip %c: %zu bytes", k ? 'b' : 'a', len);
            free(bytes);
        }
    {
        const g4_tensor *gl = g4_model_tensor(&gb.m, "one.logits");
        char *bytes = NULL, e2[G4_ERROR_MAX];
        size_t len = 0, i, differ = 0, n = gl ? (size_t)(gl->shape[0] * gl->shape[1]) : 0;
        snprintf(path, sizeof path, "%s/bf16_logits.f32", g_tmp);
        snprintf(args, sizeof args, "logits %s --bf16 --ids 2,17,200,246,77,123 --audio %s --out %s", tiny(MODEL),
                 path2(tiny(MODEL), "clip_b.wav"), path);
        st = run_cli(g_cli, args, out, sizeof out, NULL, err, sizeof err);
        CHECK(st == 0, "logits --bf16 --audio: exit %d: %s%s", st, out, err);
        if (st == 0 && gl && g4__read_file(path, &bytes, &len, 1 << 20, e2) == G4_OK && len == n * sizeof(float)) {
            for (i = 0; i < n; i++) { float v = g4__get(gl, i); differ += memcmp(&v, bytes + 4 * i, 4) != 0; }
            CHECK(differ == 0, "logits --bf16 --audio: %zu of %zu logits differ from transformers in bf16", differ, n);
        } else CHECK(0, "logits --bf16 --audio: %zu bytes", len);
        free(bytes);
    }
    g4_model_free(&gb.m);
}

int main(int argc, char **argv) {
    if (!h_args(argc, argv, &g_cli, NULL, g_tmp, sizeof g_tmp, "audio")) return 1;
    run("features: both clips' WAVs = Gemma4AudioFeatureExtractor", test_features);
    run("tower: every tap of clip a = transformers", test_taps);
    run("tower: another geometry (chunk 8, one future frame, no clipped linears) = transformers", test_geom);
    run("soft tokens: clip a (one padding frame) = transformers", test_soft_a);
    run("soft tokens: clip b (no padding) = transformers", test_soft_b);
    run("soft tokens: clip a from its PCM16 WAV = transformers", test_soft_wav_a);
    run("soft tokens: clip b from its float32 WAV = transformers", test_soft_wav_b);
    run("soft tokens: invalid padding frames change nothing", test_padding_invariance);
    run("tower: a 3-thread pool gives the same bits (and an arena for one thread runs on one)", test_threads);
    run("logits: both clips' WAVs merged into the decoder = transformers", test_logits);
    run("encode: bad inputs are errors", test_bad_encode);
    run("load: a missing tower tensor leaves the text model usable", test_missing_tensor);
    run("config: bad audio_config fields name the field", test_bad_config);
    run("features: bad rate, past 30 s, too short, non-finite", test_bad_features);
    run("features: processor_config.json's settings (released layout = defaults; every setting changed = transformers)",
        test_fe_settings);
    run("features: bad processor_config.json settings name the field; the model check", test_fe_settings_bad);
    run("wav: PCM16 and float32 mono; everything else refused", test_wav);
    run("cli: gemma4 audio and logits --audio = transformers; bad input is one line and exit 1", test_cli);
    run("bf16 tower: taps and soft tokens of both clips against transformers in bf16; 3 threads the same", test_bf16);
    run("bf16 merge: clip b's bf16 soft tokens into the bf16 decoder = transformers' bf16 logits", test_bf16_logits);
    run("cli: audio --bf16 (1 and 3 threads) and logits --bf16 --audio give transformers' bf16 bits", test_cli_bf16);
    {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
        if (system(cmd) != 0) printf("could not remove %s\n", g_tmp);
    }
    return finish();
}
