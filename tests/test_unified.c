/* The 12B unified model (gemma4_unified) against transformers 5.23.0:
   data/tiny/unified_like, made by tools/make_unified_goldens.py.

   The text decoder's golden, greedy decode and chunking run in the shared
   golden loop (tests/invariants.h, test_gemma4); here: its config, and the
   encoder-free embedders (>>unified) tap by tap and soft token by soft token.

   Tolerances: every embedder tap and soft token within 1e-4 x max |ref| of
   that tap (the bound). The embedders are three LayerNorms, two
   linears and an RMSNorm per row; measured (this machine, AVX-512 build) at
   most ~1e-6 relative: the only differences are summation orders.

       build/test_unified [DATA_DIR]          last line: "N passed, M failed" */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include "../gemma4_processing.h"

#include <stdlib.h>
#include <string.h>

#include "harness.h"

#include "fixtures.h"

#define EMB_TOL 1e-4

static void *arena_alloc(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

/* ---------------------------------------------------------------- config */

static void test_config(void) {
    g4_model m;
    const g4_config *c = &m.config;
    if (g4_model_load(&m, tiny("unified_like")) != G4_OK) { CHECK(0, "load: %s", m.error); return; }
    CHECK(c->unified == 1, "unified flag");
    CHECK(c->hidden_size_per_layer_input == 0 && c->enable_moe_block == 0, "no PLE, no MoE");
    CHECK(c->hidden_size == 32 && c->num_hidden_layers == 8 && c->num_kv_shared_layers == 3 && c->attention_k_eq_v,
          "text config: H %d L %d shared %d k_eq_v %d", c->hidden_size, c->num_hidden_layers, c->num_kv_shared_layers,
          c->attention_k_eq_v);
    CHECK(m.plan.layer[7].reads == 3 && m.plan.layer[5].reads == 4 && !m.plan.layer[3].has_v_proj &&
          m.plan.layer[6].mlp_width == 96, "plan: readers, k_eq_v, double-wide");
    CHECK(c->unified_vision.present && c->unified_vision.patch_size == 4 && c->unified_vision.pooling_kernel_size == 3 &&
          c->unified_vision.mm_embed_dim == 24 && c->unified_vision.mm_posemb_size == 10 &&
          c->unified_vision.rms_norm_eps == 1e-5f, "vision_config");
    CHECK(c->unified_audio.present && c->unified_audio.audio_embed_dim == 40 && c->unified_audio.rms_norm_eps == 1e-5f,
          "audio_config");
    CHECK(!c->audio.present && !c->vision.present, "the unified sub-configs are not Gemma4AudioConfig / Gemma4VisionConfig");
    CHECK(c->image_token_id == 500 && c->audio_token_id == 503 && c->boi_token_id == 501 && c->eoa_token_id == 505 &&
          c->bidirectional == G4_BIDIR_VISION, "the wrapper's token ids and use_bidirectional_attention");
    CHECK(m.w.unified.pos_embedding.ndim == 3 && m.w.unified.pos_embedding.shape[0] == 10 &&
          m.w.unified.vision_projection.shape[0] == 32 && m.w.unified.audio_projection.shape[1] == 40, "embedder tensors");
    g4_model_free(&m);
}

/* A config text with one substitution (the unified_like config, rewritten). */
static g4_result parse_edit(g4_config *c, const char *from, const char *to) {
    FILE *f = fopen(path2(tiny("unified_like"), "config.json"), "rb");
    char buf[8192], out[8400], *p;
    size_t n;
    if (!f) return G4_ERR_IO;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    p = strstr(buf, from);
    if (!p) { printf("  config has no '%s'\n", from); return G4_ERR_IO; }
    snprintf(out, sizeof out, "%.*s%s%s", (int)(p - buf), buf, to, p + strlen(from));
    return g4_config_parse(c, out, strlen(out), "config.json");
}

static void test_config_errors(void) {
    static const struct { const char *from, *to, *want; } cases[] = {
        {"\"output_proj_dims\": 24", "\"output_proj_dims\": 32", "vision_config.output_proj_dims (32) must equal"},
        {"\"mm_embed_dim\": 24", "\"mm_embed_dim\": 0", "vision_config.mm_embed_dim' is 0"},
        {"\"audio_embed_dim\": 40", "\"audio_embed_dim\": \"40\"", "audio_config.audio_embed_dim' must be an integer"},
        {"\"use_bidirectional_attention\": \"vision\"", "\"use_bidirectional_attention\": \"both\"",
         "use_bidirectional_attention' is \"both\""},
        {"\"vision_config\": {", "\"vision_config\": 3, \"x\": {", "field 'vision_config' must be an object"},
        {"\"model_type\": \"gemma4_unified\"", "\"model_type\": \"gemma4_unified_audio\"", "is not a Gemma 4 text model"},
    };
    int k;
    for (k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++) {
        g4_config c;
        g4_result r = parse_edit(&c, cases[k].from, cases[k].to);
        CHECK(r == G4_ERR_CONFIG && strstr(c.error, cases[k].want), "case %d: result %d, error '%s'", k, (int)r, c.error);
    }
    { /* null sub-configs: no embedder; the text model alone */
        g4_config c;
        g4_result r = parse_edit(&c, "\"vision_config\": {", "\"vision_config\": null, \"x\": {");
        CHECK(r == G4_OK && !c.unified_vision.present && c.unified_audio.present, "vision_config null: %s", c.error);
    }
    { /* "all" (gemma4_unified only): the window becomes sliding_window // 2 + 1, as __post_init__ makes it */
        g4_config c;
        g4_result r = parse_edit(&c, "\"use_bidirectional_attention\": \"vision\"", "\"use_bidirectional_attention\": \"all\"");
        CHECK(r == G4_OK && c.bidirectional == G4_BIDIR_ALL && c.sliding_window == 5, "all: %s", c.error);
    }
    { /* and a Gemma 4 config still refuses it */
        static const char txt[] = "{\"model_type\": \"gemma4_text\", \"vocab_size\": 16, \"hidden_size\": 8, "
                                  "\"intermediate_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
                                  "\"num_key_value_heads\": 1, \"head_dim\": 4, \"global_head_dim\": 4, "
                                  "\"use_bidirectional_attention\": \"all\"}";
        g4_config c;
        g4_result r = g4_config_parse(&c, txt, sizeof txt - 1, "t.json");
        CHECK(r == G4_ERR_CONFIG && strstr(c.error, "use_bidirectional_attention"), "gemma4_text all: %s", c.error);
    }
    { /* Gemma4UnifiedTextConfig's defaults where gemma4_text's differ */
        static const char txt[] = "{\"model_type\": \"gemma4_unified_text\", \"vocab_size\": 16, \"hidden_size\": 8, "
                                  "\"intermediate_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
                                  "\"num_key_value_heads\": 1, \"head_dim\": 4, \"global_head_dim\": 4, "
                                  "\"hidden_size_per_layer_input\": 4, \"enable_moe_block\": true}";
        g4_config c;
        g4_result r = g4_config_parse(&c, txt, sizeof txt - 1, "t.json");
        CHECK(r == G4_OK && c.unified && c.sliding_window == 1024 && c.max_position_embeddings == 262144 &&
              c.hidden_size_per_layer_input == 0 && c.enable_moe_block == 0 && !c.unified_vision.present,
              "gemma4_unified_text defaults: %d %s", (int)r, c.error);
    }
}

/* ------------------------------------------------------------- embedders */

typedef struct { golden *g; int taps, fails, seen; double worst; } tapcheck;

static void check_tap(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    tapcheck *tc = (tapcheck *)user;
    int64_t numel = 0;
    const float *want = golden_f32(tc->g, name, &numel);
    double d, rel;
    (void)layer;
    tc->taps++;
    if (!want) { printf("  golden has no tap '%s'\n", name); tc->fails++; return; }
    if (pos0 != 0 || numel != (int64_t)rows * cols) {
        printf("  %s: %d x %d rows at %d, golden has %lld values\n", name, rows, cols, pos0, (long long)numel);
        tc->fails++;
        return;
    }
    d = max_diff(data, want, (size_t)numel);
    rel = d / max_abs(want, (size_t)numel);
    if (!(rel <= EMB_TOL)) { printf("  %s: %.3g relative from transformers\n", name, rel); tc->fails++; }
    if (rel > tc->worst) tc->worst = rel;
    tc->seen++;
}

static int compare_soft(golden *g, const char *key, const float *soft, int n_soft, int H) {
    int64_t numel = 0;
    const float *want = golden_f32(g, key, &numel);
    double rel;
    if (!want || numel != (int64_t)n_soft * H) {
        printf("  %s: %d soft tokens, golden %lld values\n", key, n_soft, (long long)numel);
        return 0;
    }
    rel = max_diff(soft, want, (size_t)numel) / max_abs(want, (size_t)numel);
    printf("  %s: %d soft tokens, %.3g relative from transformers\n", key, n_soft, rel);
    return rel <= EMB_TOL;
}

static void test_embed_image(void) {
    golden g;
    g4_model m;
    g4_unified_run run;
    tapcheck tc;
    const g4_tensor *pv, *pos;
    float *soft;
    void *arena;
    size_t bytes = 0;
    int n, n_soft = -1, H;
    if (!golden_open_file(&g, "unified_like", "mm_golden.safetensors")) { CHECK(0, "mm golden"); return; }
    if (g4_model_load(&m, tiny("unified_like")) != G4_OK) { CHECK(0, "load: %s", m.error); g4_model_free(&g.m); return; }
    pv = g4_model_tensor(&g.m, "pixel_values");
    pos = g4_model_tensor(&g.m, "image_position_ids");
    CHECK(pv && pos && pv->ndim == 3 && pos->ndim == 3, "golden pixel_values, image_position_ids");
    if (!pv || !pos) { g4_model_free(&m); g4_model_free(&g.m); return; }
    n = (int)(pv->shape[0] * pv->shape[1]); /* both images' rows in one call: each row is independent */
    H = m.config.hidden_size;
    CHECK(g4_unified_size(&m, n, &bytes) == G4_OK, "size");
    arena = arena_alloc(bytes);
    soft = (float *)malloc(sizeof(float) * (size_t)n * H);
    memset(&run, 0, sizeof run);
    memset(&tc, 0, sizeof tc);
    tc.g = &g;
    run.tap = check_tap;
    run.tap_user = &tc;
    CHECK(g4_unified_embed_image(&m, (const float *)pv->data, (const int32_t *)pos->data, n, arena, bytes, &run, soft,
                                 &n_soft) == G4_OK, "embed: %s", run.error);
    printf("  %d patches, %d taps, worst %.3g\n", n, tc.seen, tc.worst);
    CHECK(tc.fails == 0 && tc.seen == 6, "%d of %d taps off (6 expected)", tc.fails, tc.taps);
    CHECK(n_soft == 10 && compare_soft(&g, "image_soft", soft, n_soft, H), "soft tokens (10 expected, got %d)", n_soft);

    /* one row at a time (the arena for one row): the same bits as all rows at once */
    {
        float *one = (float *)malloc(sizeof(float) * (size_t)n * H);
        size_t b1 = 0;
        int t, k = 0, got = 0, same = 1;
        run.tap = NULL;
        CHECK(g4_unified_size(&m, 1, &b1) == G4_OK && b1 < bytes, "one row needs less arena");
        for (t = 0; t < n; t++) {
            int ns = 0;
            CHECK(g4_unified_embed_image(&m, (const float *)pv->data + (size_t)t * pv->shape[2],
                                         (const int32_t *)pos->data + 2 * t, 1, arena, b1, &run, one + (size_t)k * H,
                                         &ns) == G4_OK, "row %d: %s", t, run.error);
            k += ns;
            got += ns;
        }
        for (t = 0; t < got * H; t++) same &= one[t] == soft[t];
        CHECK(got == n_soft && same, "row by row: %d soft tokens, same bits %d", got, same);
        free(one);
    }

    /* bad input: a clear error, nothing written past the arena */
    {
        int32_t bad[2] = {10, 0}, padx[2] = {-2, 0};
        int ns = 7;
        CHECK(g4_unified_embed_image(&m, (const float *)pv->data, bad, 1, arena, bytes, &run, soft, &ns) == G4_ERR_INPUT &&
                  strstr(run.error, "patch 0 has x position 10") && ns == 0, "position past the table: %s", run.error);
        CHECK(g4_unified_embed_image(&m, (const float *)pv->data, padx, 1, arena, bytes, &run, soft, &ns) == G4_ERR_INPUT,
              "position -2: %s", run.error);
        CHECK(g4_unified_embed_image(&m, (const float *)pv->data, (const int32_t *)pos->data, n, arena, bytes - 64, &run,
                                     soft, &ns) == G4_ERR_ARENA && strstr(run.error, "g4_unified_size"),
              "short arena: %s", run.error);
        CHECK(g4_unified_embed_image(&m, (const float *)pv->data, (const int32_t *)pos->data, 0, arena, bytes, &run, soft,
                                     &ns) == G4_ERR_INPUT, "0 rows");
        CHECK(g4_unified_embed_image(&m, (const float *)pv->data, (const int32_t *)pos->data, n,
                                     (char *)arena + 8, bytes - 64, &run, soft, &ns) == G4_ERR_ARENA, "misaligned");
        CHECK(g4_unified_embed_image(&m, (const float *)pv->data, (const int32_t *)pos->data, n, arena, bytes, NULL, soft,
                                     &ns) == G4_ERR_INPUT, "NULL run");
    }
    free(arena);
    free(soft);
    g4_model_free(&m);
    g4_model_free(&g.m);
}

static void test_embed_audio(void) {
    golden g;
    g4_model m;
    g4_unified_run run;
    tapcheck tc;
    const g4_tensor *fe, *mask;
    unsigned char valid[64];
    float *soft;
    void *arena;
    size_t bytes = 0;
    int n, n_soft = -1, H, t;
    if (!golden_open_file(&g, "unified_like", "mm_golden.safetensors")) { CHECK(0, "mm golden"); return; }
    if (g4_model_load(&m, tiny("unified_like")) != G4_OK) { CHECK(0, "load: %s", m.error); g4_model_free(&g.m); return; }
    fe = g4_model_tensor(&g.m, "input_features");
    mask = g4_model_tensor(&g.m, "input_features_mask");
    CHECK(fe && mask && fe->ndim == 3 && fe->shape[2] == 40, "golden input_features");
    if (!fe || !mask || fe->shape[0] * fe->shape[1] > 64) { g4_model_free(&m); g4_model_free(&g.m); return; }
    n = (int)(fe->shape[0] * fe->shape[1]);
    for (t = 0; t < n; t++) valid[t] = ((const int32_t *)mask->data)[t] != 0;
    H = m.config.hidden_size;
    CHECK(g4_unified_size(&m, n, &bytes) == G4_OK, "size");
    arena = arena_alloc(bytes);
    soft = (float *)malloc(sizeof(float) * (size_t)n * H);
    memset(&run, 0, sizeof run);
    memset(&tc, 0, sizeof tc);
    tc.g = &g;
    run.tap = check_tap;
    run.tap_user = &tc;
    CHECK(g4_unified_embed_audio(&m, (const float *)fe->data, valid, n, arena, bytes, &run, soft, &n_soft) == G4_OK,
          "embed: %s", run.error);
    printf("  %d frames, %d taps, worst %.3g\n", n, tc.seen, tc.worst);
    CHECK(tc.fails == 0 && tc.seen == 2, "%d of %d taps off (2 expected)", tc.fails, tc.taps);
    CHECK(n_soft == 4 && compare_soft(&g, "audio_soft", soft, n_soft, H), "soft tokens (4 expected, got %d)", n_soft);
    run.tap = NULL;
    CHECK(g4_unified_embed_audio(&m, (const float *)fe->data, NULL, n, arena, bytes, &run, soft, &n_soft) == G4_OK &&
              n_soft == n, "valid NULL keeps every frame (%d)", n_soft);
    free(arena);
    free(soft);
    g4_model_free(&m);
    g4_model_free(&g.m);
}

/* The whole 12B path: both images' and the clip's soft tokens from the C
   embedders, merged into the prompt by g4_forward_mm (>>vision): the merged
   rows (inputs_embeds tap) and the logits against transformers'
   Gemma4UnifiedForConditionalGeneration with mm_token_type_ids (bidirectional
   image blocks on sliding layers), in one step and in steps of 8 rows (the
   image blocks of 6 and 4 rows never split). Tolerance: 1e-4 x max |logit|,
   the bound. Measured 2.04e-5 (AVX-512 build): this 31-row prompt is
   chaotic, and transformers' own float32 logits are 1.94e-5 from the same
   model run in float64, so that is rounding, not a mask or merge error (a
   wrong block mask, Gemma 4's sliding-only one, was 0.62 off). Also:
   transformers' causal logits (no type ids) differ by 0.9, so the golden
   tells the block mask from a causal one. */
typedef struct { const float *want; int H, fails, seen; double worst; } mergecheck;

static void check_merge_tap(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    mergecheck *mc = (mergecheck *)user;
    (void)layer;
    if (strcmp(name, "inputs_embeds") == 0 && cols == mc->H) {
        double d = max_diff(data, mc->want + (size_t)pos0 * cols, (size_t)rows * cols);
        if (d > mc->worst) mc->worst = d;
        mc->seen += rows;
    }
}

static void test_merge_logits(void) {
    golden g;
    g4_model m;
    g4_unified_run run;
    const g4_tensor *pv, *pos, *fe, *mask;
    const int32_t *ids;
    const float *want, *causal, *emb;
    float *soft, *logits;
    void *arena;
    size_t bytes = 0;
    int n, ni, na, H, V, n_img = 0, n_aud = 0, t, chunk;
    int64_t numel = 0, ne = 0;
    unsigned char valid[64];
    if (!golden_open_file(&g, "unified_like", "mm_golden.safetensors")) { CHECK(0, "mm golden"); return; }
    if (g4_model_load(&m, tiny("unified_like")) != G4_OK) { CHECK(0, "load: %s", m.error); g4_model_free(&g.m); return; }
    pv = g4_model_tensor(&g.m, "pixel_values");
    pos = g4_model_tensor(&g.m, "image_position_ids");
    fe = g4_model_tensor(&g.m, "input_features");
    mask = g4_model_tensor(&g.m, "input_features_mask");
    ids = golden_ids(&g, "mm_input_ids", &n);
    want = golden_f32(&g, "mm_logits", &numel);
    causal = golden_f32(&g, "mm_logits_causal", &numel);
    emb = golden_f32(&g, "mm_inputs_embeds", &ne);
    H = m.config.hidden_size;
    V = m.config.vocab_size;
    CHECK(pv && pos && fe && mask && ids && want && causal && emb && numel == (int64_t)n * V && ne == (int64_t)n * H,
          "golden inputs");
    if (!(pv && pos && fe && mask && ids && want && causal && emb) || fe->shape[0] * fe->shape[1] > 64) {
        g4_model_free(&m);
        g4_model_free(&g.m);
        return;
    }
    ni = (int)(pv->shape[0] * pv->shape[1]);
    na = (int)(fe->shape[0] * fe->shape[1]);
    for (t = 0; t < na; t++) valid[t] = ((const int32_t *)mask->data)[t] != 0;
    CHECK(g4_unified_size(&m, ni > na ? ni : na, &bytes) == G4_OK, "size");
    arena = arena_alloc(bytes);
    soft = (float *)malloc(sizeof(float) * (size_t)(ni + na) * H);
    logits = (float *)malloc(sizeof(float) * (size_t)n * V);
    memset(&run, 0, sizeof run);
    /* the prompt's order: image 0, image 1, then the clip */
    CHECK(g4_unified_embed_image(&m, (const float *)pv->data, (const int32_t *)pos->data, ni, arena, bytes, &run, soft,
                                 &n_img) == G4_OK, "image: %s", run.error);
    CHECK(g4_unified_embed_audio(&m, (const float *)fe->data, valid, na, arena, bytes, &run, soft + (size_t)n_img * H,
                                 &n_aud) == G4_OK, "audio: %s", run.error);
    for (chunk = 0; chunk <= 8; chunk += 8) {
        g4_session_config sc = g4_session_config_init();
        g4_session s;
        mergecheck mc;
        double d, sc_max = max_abs(want, (size_t)n * V), dc;
        memset(&mc, 0, sizeof mc);
        mc.want = emb;
        mc.H = H;
        sc.max_context = n;
        sc.max_chunk = chunk;
        sc.tap = check_merge_tap;
        sc.tap_user = &mc;
        if (g4_session_create(&s, &m, &sc) != G4_OK) { CHECK(0, "session: %s", s.error); break; }
        CHECK(g4_forward_mm(&s, ids, n, soft, n_img + n_aud, logits, G4_LOGITS_ALL, NULL) == G4_OK, "forward_mm: %s",
              s.error);
        d = max_diff(logits, want, (size_t)n * V);
        dc = max_diff(logits, causal, (size_t)n * V);
        printf("  chunk %d: %d rows (%d image, %d audio soft tokens): inputs_embeds %.3g, logits %.3g of max |logit| "
               "%.3g from transformers (from its causal logits: %.3g)\n", chunk, n, n_img, n_aud, mc.worst, d / sc_max,
               sc_max, dc / sc_max);
        CHECK(mc.seen == n && mc.worst <= 1e-4 * max_abs(emb, (size_t)n * H), "inputs_embeds: %d rows, %.3g", mc.seen,
              mc.worst);
        CHECK(d <= 1e-4 * sc_max, "logits %.3g relative", d / sc_max);
        CHECK(dc > 1e-2 * sc_max, "the causal golden must differ (%.3g)", dc / sc_max);
        g4_session_destroy(&s);
    }
    free(arena);
    free(soft);
    free(logits);
    g4_model_free(&m);
    g4_model_free(&g.m);
}

/* A checkpoint whose config promises an embedder must hold its tensors. */
static void test_missing_embedder(void) {
    g4_model m;
    g4_config c;
    CHECK(g4_model_load(&m, tiny("e4b_like")) == G4_OK && !m.config.unified, "a gemma4 wrapper is not unified");
    CHECK(g4_unified_size(&m, 4, NULL) == G4_ERR_INPUT, "size on a non-unified model");
    {
        g4_unified_run run;
        float x[4] = {0, 0, 0, 0}, soft[4];
        int32_t p[2] = {0, 0};
        int ns;
        char ar[4096];
        CHECK(g4_unified_embed_image(&m, x, p, 1, ar, sizeof ar, &run, soft, &ns) == G4_ERR_INPUT &&
                  strstr(run.error, "not a gemma4_unified"), "embed on a non-unified model: %s", run.error);
    }
    g4_model_free(&m);
    (void)c;
}

/* Gemma4UnifiedImageProcessor = Gemma4ImageProcessor's resize, rescale and
   patchify with patches of patch_size * pooling_kernel_size and no pooling:
   its patches_merge gathers each k x k group of p x p patches into the
   (k p) x (k p) x 3 block of the image in (row, column, channel) order, at
   position (x // k, y // k), in row-major order over the merged grid, and
   the target size is the same (side multiple k p, at most max_soft_tokens
   blocks). So g4_image_preprocess with patch_size 12 and pooling_kernel_size
   1 gives its pixel_values bit for bit (torchvision backend), on a 37x50
   image that needs resizing. */
static void test_image_processor(void) {
    golden g;
    g4_image_config ic = g4_image_config_init();
    const g4_tensor *img, *pv, *pos, *ns;
    float *out;
    int32_t *p2;
    uint8_t *px;
    void *scratch;
    int n_soft = -1, i, h, w, rows;
    size_t sb;
    if (!golden_open_file(&g, "unified_like", "image_golden.safetensors")) { CHECK(0, "image golden"); return; }
    img = g4_model_tensor(&g.m, "image");
    pv = g4_model_tensor(&g.m, "pixel_values");
    pos = g4_model_tensor(&g.m, "image_position_ids");
    ns = g4_model_tensor(&g.m, "num_soft_tokens");
    CHECK(img && pv && pos && ns && img->ndim == 3 && img->shape[2] == 3 && pos->shape[0] == 70, "golden tensors");
    if (!(img && pv && pos && ns)) { g4_model_free(&g.m); return; }
    h = (int)img->shape[0];
    w = (int)img->shape[1];
    ic.patch_size = 4 * 3; /* the unified_like vision_config: patch_size 4, pooling_kernel_size 3 */
    ic.pooling_kernel_size = 1;
    ic.max_soft_tokens = 70;
    px = (uint8_t *)malloc((size_t)h * w * 3);
    for (i = 0; i < h * w * 3; i++) px[i] = (uint8_t)((const int32_t *)img->data)[i];
    sb = g4_image_scratch_size(&ic, h, w);
    scratch = arena_alloc(sb);
    rows = 70;
    out = (float *)malloc(sizeof(float) * (size_t)rows * 432);
    p2 = (int32_t *)malloc(sizeof(int32_t) * (size_t)rows * 2);
    CHECK(sb > 0 && g4_image_preprocess(&ic, px, h, w, 3, scratch, sb, out, p2, &n_soft) == G4_OK, "preprocess: %s",
          ic.error);
    CHECK(n_soft == ((const int32_t *)ns->data)[0] && (int64_t)n_soft == pv->shape[0], "%d soft tokens, transformers %d",
          n_soft, ((const int32_t *)ns->data)[0]);
    if (n_soft == pv->shape[0]) {
        int same = memcmp(out, pv->data, sizeof(float) * (size_t)n_soft * 432) == 0, zero = 1;
        for (i = n_soft * 432; i < rows * 432; i++) zero &= out[i] == 0.0f;
        printf("  37x50 -> %d merged patches of 12x12x3: pixel_values %s, positions %s\n", n_soft,
               same ? "bit-identical" : "DIFFERENT",
               memcmp(p2, pos->data, sizeof(int32_t) * 140) == 0 ? "equal" : "DIFFERENT");
        CHECK(same && zero, "pixel_values: same bits %d, padding zero %d", same, zero);
        CHECK(memcmp(p2, pos->data, sizeof(int32_t) * 140) == 0, "positions (with the -1 padding rows)");
    }
    free(px);
    free(scratch);
    free(out);
    free(p2);
    g4_model_free(&g.m);
}

/* Gemma4UnifiedAudioFeatureExtractor: a 1234-sample clip becomes 31 frames of
   40, the last zero-padded, all valid; bit for bit. Too little room is an error. */
static void test_audio_frames(void) {
    golden g;
    g4_model m;
    g4_unified_run run;
    const g4_tensor *pcm, *feat, *mask;
    float frames[32 * 40];
    int n = -1, i, valid = 1;
    if (!golden_open_file(&g, "unified_like", "frames_golden.safetensors")) { CHECK(0, "frames golden"); return; }
    if (g4_model_load(&m, tiny("unified_like")) != G4_OK) { CHECK(0, "load: %s", m.error); g4_model_free(&g.m); return; }
    pcm = g4_model_tensor(&g.m, "pcm");
    feat = g4_model_tensor(&g.m, "input_features");
    mask = g4_model_tensor(&g.m, "input_features_mask");
    CHECK(pcm && feat && mask && feat->shape[0] == 31 && feat->shape[1] == 40, "golden tensors");
    if (pcm && feat && mask) {
        memset(&run, 0, sizeof run);
        CHECK(g4_unified_audio_frames(&m, (const float *)pcm->data, (size_t)pcm->shape[0], frames, 32, &run, &n) == G4_OK,
              "frames: %s", run.error);
        for (i = 0; i < 31; i++) valid &= ((const int32_t *)mask->data)[i] == 1;
        CHECK(n == 31 && valid && memcmp(frames, feat->data, sizeof(float) * 31 * 40) == 0,
              "%d frames, the extractor's 31, all valid %d, same bits", n, valid);
        CHECK(g4_unified_audio_frames(&m, (const float *)pcm->data, (size_t)pcm->shape[0], frames, 30, &run, &n) ==
                  G4_ERR_INPUT && strstr(run.error, "31 frames") && n == 0, "30 frames of room: %s", run.error);
        CHECK(g4_unified_audio_frames(&m, NULL, 0, frames, 1, &run, &n) == G4_OK && n == 0, "an empty clip: no frame");
    }
    g4_model_free(&m);
    g4_model_free(&g.m);
}

/* "all" runs in the forward only: the training reference's attention is causal, so it refuses. */
static void test_all_refused_by_training(void) {
    g4_model m;
    g4_train_config tc = g4_train_config_init();
    size_t a = 0, f = 0;
    if (g4_model_load(&m, tiny("unified_all")) != G4_OK) { CHECK(0, "load: %s", m.error); return; }
    tc.max_seq = 8;
    CHECK(m.config.bidirectional == G4_BIDIR_ALL && m.config.sliding_window == 5, "unified_all config");
    CHECK(g4_train_size(&m, &tc, &a, &f) == G4_ERR_INPUT, "g4_train_size accepts \"all\"");
    g4_model_free(&m);
}

int main(int argc, char **argv) {
    if (argc > 1) g_data = argv[1];
    (void)g_tmp;
    run("unified config: sub-configs, plan, embedder tensors", test_config);
    run("unified config: errors name the field", test_config_errors);
    run("unified embed_vision: every tap and the soft tokens vs transformers", test_embed_image);
    run("unified embed_audio: every tap and the soft tokens vs transformers", test_embed_audio);
    run("unified: the embedders refuse a model without them", test_missing_embedder);
    run("unified: two images and a clip merged (g4_forward_mm): logits vs transformers", test_merge_logits);
    run("unified: \"all\" is refused by the training reference", test_all_refused_by_training);
    run("unified: Gemma4UnifiedAudioFeatureExtractor's frames, bit for bit", test_audio_frames);
    run("unified: Gemma4UnifiedImageProcessor = g4_image_preprocess at patch 12, no pooling, bit for bit", test_image_processor);
    return finish();
}
