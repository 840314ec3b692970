/* The 12B unified model (gemma4_unified) against transformers 5.23.0:
   data/tiny/unified_like, made by tools/make_unified_goldens.py.

   The text decoder's golden, greedy decode and chunking run in the shared
   golden loop (tests/invariants.h, test_gemma4); here: its config, and the
   encoder-free embedders (>>unified) tap by tap and soft token by soft token.

   Tolerances: every embedder tap and soft token within 1e-4 x max |ref| of
   that tap (the bound). The embedders are three LayerNorms, two
   linears and an RMSNorm per row; measured (this machine, AVX-512 build) at
   most ~1e-6 relative: the only differences are summation orders.

       build/test_unified [DATA_DIR [CLI]]    last line: "N passed, M failed"
   (CLI: the gemma4 binary the CLI cases run, build/gemma4 by default) */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include "../gemma4_processing.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* A two-layer text config of model_type, with the fields `extra` */
static g4_result parse_small(g4_config *c, const char *model_type, const char *extra) {
    char txt[512];
    snprintf(txt, sizeof txt, "{\"model_type\": \"%s\", \"vocab_size\": 16, \"hidden_size\": 8, \"intermediate_size\": 8, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4, "
             "\"global_head_dim\": 4, %s}", model_type, extra);
    return g4_config_parse(c, txt, strlen(txt), "t.json");
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
        g4_config c;
        g4_result r = parse_small(&c, "gemma4_text", "\"use_bidirectional_attention\": \"all\"");
        CHECK(r == G4_ERR_CONFIG && strstr(c.error, "use_bidirectional_attention"), "gemma4_text all: %s", c.error);
    }
    { /* Gemma4UnifiedTextConfig's defaults where gemma4_text's differ */
        g4_config c;
        g4_result r = parse_small(&c, "gemma4_unified_text", "\"hidden_size_per_layer_input\": 4, \"enable_moe_block\": true");
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

/* An embedder call over n rows: its arena (*bytes) and soft-token buffer, and
   run's taps compared with g's through tc */
static void embed_prepare(const g4_model *m, golden *g, int n, void **arena, size_t *bytes, float **soft,
                          g4_unified_run *run, tapcheck *tc) {
    CHECK(g4_unified_size(m, n, bytes) == G4_OK, "size");
    *arena = arena_alloc(*bytes);
    *soft = (float *)malloc(sizeof(float) * (size_t)n * m->config.hidden_size);
    memset(run, 0, sizeof *run);
    memset(tc, 0, sizeof *tc);
    tc->g = g;
    run->tap = check_tap;
    run->tap_user = tc;
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
    embed_prepare(&m, &g, n, &arena, &bytes, &soft, &run, &tc);
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
    embed_prepare(&m, &g, n, &arena, &bytes, &soft, &run, &tc);
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

/* The embedders on the decoder's backend (the packed GEMM with output rows split
   across a pool, the norms split by rows) against the scalar oracle
   (g4__unified_image / g4__unified_audio with scalar 1: g4__matmul_ref and the
   row loops on one thread), on 64 rows of random patches (some padding, some
   with one axis -1) and 64 random frames, enough that every matmul and row
   the image's row loops split across 2 and 3 threads (G4_PARALLEL_MIN). Any pool gives the
   same bits as no pool, and an arena sized for one thread runs a pool on one;
   the oracle differs only in the matmuls' summation order (K = 432 and 40 in
   float32): within 1e-5 x max |soft| (measured 5.3e-7 and 1.4e-7, AVX-512). */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float rnd(void) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

static void test_embed_pool(void) {
    enum { N = 64 };
    g4_model m;
    g4_unified_run run;
    g4_pool *pools[3] = {NULL, NULL, NULL};
    float *pv, *fr, *ref, *got;
    int32_t pos[2 * N];
    size_t bytes1 = 0, bytes3 = 0, i;
    void *arena;
    int t, p, H, Pd, A, kind;
    if (g4_model_load(&m, tiny("unified_like")) != G4_OK) { CHECK(0, "load: %s", m.error); return; }
    H = m.config.hidden_size;
    Pd = 3 * 12 * 12;
    A = m.config.unified_audio.audio_embed_dim;
    CHECK(Pd == 3 * m.config.unified_vision.patch_size * m.config.unified_vision.pooling_kernel_size *
                   m.config.unified_vision.patch_size * m.config.unified_vision.pooling_kernel_size, "Pd");
    pv = (float *)malloc(sizeof(float) * N * Pd);
    fr = (float *)malloc(sizeof(float) * N * A);
    ref = (float *)malloc(sizeof(float) * N * H);
    got = (float *)malloc(sizeof(float) * N * H);
    for (i = 0; i < (size_t)N * Pd; i++) pv[i] = 0.5f + 0.5f * rnd();
    for (i = 0; i < (size_t)N * A; i++) fr[i] = 0.3f * rnd();
    for (t = 0; t < N; t++) {
        pos[2 * t] = t % 11 == 10 ? -1 : t % 10;       /* some rows with x = -1 */
        pos[2 * t + 1] = t % 7 == 6 ? -1 : (t / 10) % 10;
    }
    pos[2 * 5] = pos[2 * 5 + 1] = -1; /* padding rows */
    pos[2 * 40] = pos[2 * 40 + 1] = -1;
    CHECK(g4_pool_create(&pools[1], 2) == G4_OK && g4_pool_create(&pools[2], 3) == G4_OK, "pools");
    CHECK(g4_unified_size(&m, N, &bytes1) == G4_OK && g4_unified_size_pool(&m, N, pools[2], &bytes3) == G4_OK &&
              bytes3 >= bytes1, "size_pool: %zu for 3 threads, %zu for one", bytes3, bytes1);
    arena = arena_alloc(bytes3);
    memset(&run, 0, sizeof run);
    for (kind = 0; kind < 2; kind++) {
        int n_ref = 0, n_got = 0, same = 1;
        double d, scale;
        g4_result r = kind ? g4__unified_audio(&m, fr, NULL, N, arena, bytes3, &run, ref, &n_ref, 1)
                           : g4__unified_image(&m, pv, pos, N, arena, bytes3, &run, ref, &n_ref, 1);
        CHECK(r == G4_OK && n_ref == (kind ? N : N - 2), "%s oracle: %s", kind ? "audio" : "image", run.error);
        for (p = 0; p < 4; p++) {
            run.pool = pools[p < 3 ? p : 2];
            memset(got, 0, sizeof(float) * N * H);
            r = kind ? g4_unified_embed_audio(&m, fr, NULL, N, arena, p < 3 ? bytes3 : bytes1, &run, got, &n_got)
                     : g4_unified_embed_image(&m, pv, pos, N, arena, p < 3 ? bytes3 : bytes1, &run, got, &n_got);
            CHECK(r == G4_OK && n_got == n_ref, "%s pool %d: %s", kind ? "audio" : "image", p, run.error);
            if (p == 0) {
                d = max_diff(got, ref, (size_t)n_ref * H);
                scale = max_abs(ref, (size_t)n_ref * H);
                printf("  %s: SIMD vs scalar oracle %.3g x max|soft|\n", kind ? "audio" : "image", d / scale);
                CHECK(d <= 1e-5 * scale, "%s: %.3g from the oracle", kind ? "audio" : "image", d / scale);
                memcpy(ref, got, sizeof(float) * N * H); /* the pools against no pool, bit for bit */
            } else {
                for (i = 0; i < (size_t)n_ref * H; i++) same &= got[i] == ref[i];
            }
        }
        CHECK(same, "%s: pools of 2 and 3 threads (and 3 on a one-thread arena) give no-pool's bits",
              kind ? "audio" : "image");
    }
    free(arena);
    free(pv); free(fr); free(ref); free(got);
    g4_pool_free(pools[1]);
    g4_pool_free(pools[2]);
    g4_model_free(&m);
}

/* The bf16-faithful mode (run.bf16) against transformers' embedders run in
   torch.bfloat16 (embed_bf16_golden.safetensors: the checkpoint loaded with
   dtype=bfloat16, on mm_golden's float32 inputs): every tap and the soft tokens
   bit for bit (tolerance 0), from the scalar oracle, on no pool and on 3
   threads. */
typedef struct { golden *g; int taps, seen, off; } bf16check;

static void check_tap_bf16(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    bf16check *bc = (bf16check *)user;
    int64_t numel = 0, i, off = 0;
    const float *want = golden_f32(bc->g, name, &numel);
    (void)layer;
    bc->taps++;
    if (!want || pos0 != 0 || numel != (int64_t)rows * cols) {
        printf("  %s: %d x %d, golden %lld values\n", name, rows, cols, (long long)numel);
        bc->off++;
        return;
    }
    for (i = 0; i < numel; i++) off += data[i] != want[i];
    if (off) printf("  %s: %lld of %lld values differ from transformers' bf16\n", name, (long long)off, (long long)numel);
    bc->off += off != 0;
    bc->seen++;
}

static void test_embed_bf16(void) {
    golden g, gb;
    g4_model m;
    g4_unified_run run;
    g4_pool *pool = NULL;
    const g4_tensor *pv, *pos, *fe, *mask;
    unsigned char valid[64];
    float *soft;
    void *arena;
    size_t bytes = 0;
    int n_img, n_aud, t, H, pass, kind;
    if (!golden_open_file(&g, "unified_like", "mm_golden.safetensors")) { CHECK(0, "mm golden"); return; }
    if (!golden_open_file(&gb, "unified_like", "embed_bf16_golden.safetensors")) { CHECK(0, "bf16 golden"); g4_model_free(&g.m); return; }
    if (g4_model_load(&m, tiny("unified_like")) != G4_OK) { CHECK(0, "load: %s", m.error); goto out; }
    pv = g4_model_tensor(&g.m, "pixel_values");
    pos = g4_model_tensor(&g.m, "image_position_ids");
    fe = g4_model_tensor(&g.m, "input_features");
    mask = g4_model_tensor(&g.m, "input_features_mask");
    CHECK(pv && pos && fe && mask && fe->shape[0] * fe->shape[1] <= 64, "golden inputs");
    if (!pv || !pos || !fe || !mask || fe->shape[0] * fe->shape[1] > 64) { g4_model_free(&m); goto out; }
    n_img = (int)(pv->shape[0] * pv->shape[1]);
    n_aud = (int)(fe->shape[0] * fe->shape[1]);
    for (t = 0; t < n_aud; t++) valid[t] = ((const int32_t *)mask->data)[t] != 0;
    H = m.config.hidden_size;
    CHECK(g4_pool_create(&pool, 3) == G4_OK, "pool");
    CHECK(g4_unified_size_pool(&m, n_img > n_aud ? n_img : n_aud, pool, &bytes) == G4_OK, "size");
    arena = arena_alloc(bytes);
    soft = (float *)malloc(sizeof(float) * (size_t)n_img * H);
    for (pass = 0; pass < 3; pass++) /* the scalar oracle, no pool, 3 threads */
        for (kind = 0; kind < 2; kind++) {
            bf16check bc;
            int ns = 0;
            g4_result r;
            memset(&run, 0, sizeof run);
            memset(&bc, 0, sizeof bc);
            bc.g = &gb;
            run.tap = check_tap_bf16;
            run.tap_user = &bc;
            run.bf16 = 1;
            run.pool = pass == 2 ? pool : NULL;
            r = kind ? g4__unified_audio(&m, (const float *)fe->data, valid, n_aud, arena, bytes, &run, soft, &ns, pass == 0)
                     : g4__unified_image(&m, (const float *)pv->data, (const int32_t *)pos->data, n_img, arena, bytes, &run,
                                         soft, &ns, pass == 0);
            CHECK(r == G4_OK, "%s: %s", kind ? "audio" : "image", run.error);
            {
                int64_t numel = 0, i, off = 0;
                const float *want = golden_f32(&gb, kind ? "audio_soft" : "image_soft", &numel);
                if (want && numel == (int64_t)ns * H)
                    for (i = 0; i < numel; i++) off += soft[i] != want[i];
                printf("  %s, %s: %d taps bit-identical of %d; %d soft tokens, %lld values differ\n",
                       pass == 0 ? "scalar oracle" : pass == 1 ? "no pool" : "3 threads", kind ? "audio" : "image",
                       bc.seen - bc.off, bc.taps, ns, (long long)off);
                CHECK(want && numel == (int64_t)ns * H && off == 0 && bc.off == 0 && bc.seen == (kind ? 2 : 6),
                      "%s pass %d: %d taps off, %lld soft values off", kind ? "audio" : "image", pass, bc.off, (long long)off);
            }
        }
    free(arena);
    free(soft);
    g4_pool_free(pool);
    g4_model_free(&m);
out:
    g4_model_free(&g.m);
    g4_model_free(&gb.m);
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

/* ------------------------------------------- the processor (Gemma4UnifiedProcessor) */
/* data/tiny/unified_like/processor/ is what the real Gemma4UnifiedProcessor's
   save_pretrained wrote (patch 4, pooling 3, 70 soft tokens, 40 samples a
   frame; the tiny tokenizer with ids 500..506 made the multimodal tokens);
   processor_golden.safetensors its apply_chat_template(tokenize=True) output
   on two conversations with a.png, c.png (RGBA), clip_b.wav and a 1234-sample
   clip, and unified_like's logits on the first (tools/make_unified_goldens.py). */
#define UPROC "unified_like/processor"

static const char *const uchats[2] = {
    "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Describe\"}, {\"type\": \"image\"}, "
    "{\"type\": \"text\", \"text\": \"and\"}, {\"type\": \"audio\"}, {\"type\": \"text\", \"text\": \".\"}]}]}",
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": [{\"type\": \"image\"}, "
    "{\"type\": \"audio\"}, {\"type\": \"text\", \"text\": \"then\"}, {\"type\": \"image\"}, {\"type\": \"audio\"}]}, "
    "{\"role\": \"assistant\", \"content\": \"A cat.\"}, {\"role\": \"user\", \"content\": [{\"type\": \"audio\"}, "
    "{\"type\": \"text\", \"text\": \"again?\"}]}]}",
};

/* an 8-bit image of data/vision/processor.safetensors (image.0: a.png, image.2: c.png RGBA) */
static uint8_t *vision_image(golden *vg, int k, int *h, int *w, int *ch) {
    char key[16];
    const g4_tensor *t;
    uint8_t *px;
    size_t i, n;
    snprintf(key, sizeof key, "image.%d", k);
    t = g4_model_tensor(&vg->m, key);
    if (!t || t->dtype != G4_I16 || t->ndim != 3) return NULL;
    n = (size_t)(t->shape[0] * t->shape[1] * t->shape[2]);
    if (!(px = (uint8_t *)malloc(n))) return NULL;
    for (i = 0; i < n; i++) px[i] = (uint8_t)((const int16_t *)t->data)[i];
    *h = (int)t->shape[0]; *w = (int)t->shape[1]; *ch = (int)t->shape[2];
    return px;
}

static int open_vision_golden(golden *vg) {
    memset(vg, 0, sizeof *vg);
    if (g4__add_file(&vg->m, path2(g_data, "vision"), "processor.safetensors") != G4_OK || g4__st_finish(&vg->m) != G4_OK) {
        printf("  cannot read vision/processor.safetensors: %s\n", vg->m.error);
        g4_model_free(&vg->m);
        return 0;
    }
    return vg->ok = 1;
}

/* a WAV file's samples (malloc'ed), or NULL */
static float *read_wav(const char *path, size_t *n) {
    char *bytes = NULL, err[G4_ERROR_MAX];
    size_t len;
    int rate = 0;
    float *pcm = NULL;
    *n = 0;
    if (g4__read_file(path, &bytes, &len, (size_t)1 << 24, err) != G4_OK) { printf("  %s\n", err); return NULL; }
    if (g4_wav_parse((const unsigned char *)bytes, len, NULL, 0, n, &rate, err) != G4_OK || rate != 16000 ||
        !(pcm = (float *)malloc(sizeof(float) * (*n + 1))) ||
        g4_wav_parse((const unsigned char *)bytes, len, pcm, *n, n, &rate, err) != G4_OK) {
        printf("  %s: %s\n", path, err);
        free(pcm);
        pcm = NULL;
    }
    free(bytes);
    return pcm;
}

/* One image through the unified image processor: pv [70][432], pos [70][2]. */
static int uimage(g4_image_config *ic, golden *vg, int k, float *pv, int32_t *pos, int *n_soft) {
    int h, w, ch, ok;
    uint8_t *px = vision_image(vg, k, &h, &w, &ch);
    size_t sb;
    void *scratch;
    if (!px) return 0;
    sb = g4_image_scratch_size(ic, h, w);
    scratch = arena_alloc(sb);
    ok = sb > 0 && scratch && g4_image_preprocess(ic, px, h, w, ch, scratch, sb, pv, pos, n_soft) == G4_OK;
    if (!ok) printf("  image %d: %s\n", k, ic->error);
    free(scratch);
    free(px);
    return ok;
}

static g4_result parse_img(g4_image_config *ic, const char *json) { return g4_image_config_parse(ic, json, strlen(json), "t.json"); }
static g4_result parse_fe(g4_unified_fe *fe, const char *json) { return g4_unified_fe_parse(fe, json, strlen(json), "t.json"); }

/* processor_config.json: kinds, the checks against the model, the errors */
static void test_processor_config(void) {
    g4_image_config ic;
    g4_unified_fe fe;
    g4_config uc, vc;
    g4_result r;
    if (g4_config_load(&uc, tiny("unified_like/config.json")) != G4_OK) { CHECK(0, "config: %s", uc.error); return; }
    if (g4_config_load(&vc, path2(g_data, "vision/e2b_mm/config.json")) != G4_OK) { CHECK(0, "config: %s", vc.error); return; }
    CHECK(g4_image_config_load(&ic, tiny(UPROC)) == G4_OK && ic.kind == G4_IMAGE_UNIFIED && ic.patch_size == 12 &&
              ic.pooling_kernel_size == 1 && ic.max_soft_tokens == 70, "unified processor: kind %d patch %d k %d: %s",
          ic.kind, ic.patch_size, ic.pooling_kernel_size, ic.error);
    CHECK(g4_image_config_check(&ic, &uc) == G4_OK, "against unified_like: %s", ic.error);
    CHECK(g4_image_config_check(&ic, &vc) == G4_ERR_CONFIG && strstr(ic.error, "Gemma4UnifiedImageProcessor"),
          "a unified processor for a Gemma 4 tower: %s", ic.error);
    CHECK(g4_image_config_load(&ic, path2(g_data, "vision/processor")) == G4_OK && ic.kind == G4_IMAGE_GEMMA4 &&
              g4_image_config_check(&ic, &uc) == G4_ERR_CONFIG && strstr(ic.error, "Gemma4ImageProcessor"),
          "a Gemma4ImageProcessor for the 12B: %s", ic.error);
    /* no type named: the 12B's model makes it unified (4 x 3 -> 12); the defaults (16 x 3) contradict it */
    CHECK(parse_img(&ic, "{\"image_processor\": {\"patch_size\": 4, \"pooling_kernel_size\": 3, \"max_soft_tokens\": 70}}") ==
              G4_OK && ic.kind == G4_IMAGE_ANY && g4_image_config_check(&ic, &uc) == G4_OK && ic.kind == G4_IMAGE_UNIFIED &&
              ic.patch_size == 12 && ic.pooling_kernel_size == 1, "untyped: %s", ic.error);
    ic = g4_image_config_init();
    CHECK(g4_image_config_check(&ic, &uc) == G4_ERR_CONFIG && strstr(ic.error, "48 pixels") && strstr(ic.error, "4 x"),
          "defaults against unified_like: %s", ic.error);
    CHECK(parse_img(&ic, "{\"processor_class\": \"Gemma4UnifiedProcessor\", \"image_processor\": {\"patch_size\": 4}}") ==
              G4_OK && ic.kind == G4_IMAGE_UNIFIED && ic.patch_size == 12, "processor_class: kind %d", ic.kind);
    r = parse_img(&ic, "{\"image_processor\": {\"image_processor_type\": \"SiglipImageProcessor\"}}");
    CHECK(r == G4_ERR_CONFIG && strstr(ic.error, "image_processor.image_processor_type") && strstr(ic.error, "Siglip"),
          "another type: %s", ic.error);
    r = parse_img(&ic, "{\"image_processor_type\": 3}");
    CHECK(r == G4_ERR_CONFIG && strstr(ic.error, "image_processor_type"), "a type that is no string: %s", ic.error);
    r = parse_img(&ic, "{\"image_processor_type\": \"Gemma4UnifiedImageProcessor\", \"patch_size\": 512, \"pooling_kernel_size\": 3}");
    CHECK(r == G4_ERR_CONFIG && strstr(ic.error, "1024"), "a merged patch of 1536: %s", ic.error);
    /* the feature extractor */
    CHECK(g4_unified_fe_load(&fe, tiny(UPROC)) == G4_OK && fe.audio_samples_per_token == 40 && fe.sampling_rate == 16000,
          "feature extractor: %d: %s", fe.audio_samples_per_token, fe.error);
    CHECK(g4_unified_fe_check(&fe, &uc) == G4_OK, "against unified_like: %s", fe.error);
    CHECK(g4_unified_fe_check(&fe, &vc) == G4_ERR_CONFIG && strstr(fe.error, "gemma4_unified"), "against e2b_mm: %s", fe.error);
    CHECK(g4_unified_audio_tokens(&fe, 1234) == 31 && g4_unified_audio_tokens(&fe, 7000) == 175 &&
              g4_unified_audio_tokens(&fe, 0) == 0 && g4_unified_audio_tokens(&fe, 1) == 1, "ceil(n / 40)");
    fe = g4_unified_fe_init();
    CHECK(fe.audio_samples_per_token == 640 && g4_unified_fe_check(&fe, &uc) == G4_ERR_CONFIG && strstr(fe.error, "640") &&
              strstr(fe.error, "40"), "640 against 40: %s", fe.error);
    CHECK(g4_unified_fe_load(&fe, path2(g_data, "vision/processor")) == G4_ERR_CONFIG &&
              strstr(fe.error, "Gemma4AudioFeatureExtractor"), "Gemma 4's log-mel extractor: %s", fe.error);
    CHECK(parse_fe(&fe, "{\"feature_size\": 40, \"audio_samples_per_token\": 64}") == G4_ERR_CONFIG &&
              strstr(fe.error, "feature_size"), "feature_size 40, 64 a frame: %s", fe.error);
    CHECK(parse_fe(&fe, "{\"feature_extractor\": {\"audio_samples_per_token\": 0}}") == G4_ERR_CONFIG &&
              strstr(fe.error, "feature_extractor.audio_samples_per_token"), "0 a frame: %s", fe.error);
    CHECK(parse_fe(&fe, "{\"feature_extractor\": 7}") == G4_ERR_CONFIG && strstr(fe.error, "feature_extractor"),
          "not an object: %s", fe.error);
    CHECK(parse_fe(&fe, "{\"audio_samples_per_token\": 64}") == G4_OK && fe.audio_samples_per_token == 64 &&
              g4_unified_audio_tokens(&fe, 128) == 2, "flat preprocessor_config.json: %s", fe.error);
}

/* pixel values and frames bit for bit: c.png (RGBA: PIL's alpha composite,
   then the resize) and the 1234-sample clip; a.png's count and positions */
static void test_processor_pixels(void) {
    golden pg, vg;
    g4_image_config ic;
    g4_model m;
    g4_unified_run run;
    const g4_tensor *pvc, *pos1, *fs, *short_pcm;
    float pv[70 * 432], frames[32 * 40];
    int32_t pos[70 * 2];
    int n_soft = -1, nf = -1, i, zero = 1;
    if (!golden_open_file(&pg, "unified_like", "processor_golden.safetensors")) { CHECK(0, "processor golden"); return; }
    if (!open_vision_golden(&vg)) { CHECK(0, "vision golden"); g4_model_free(&pg.m); return; }
    if (g4_model_load(&m, tiny("unified_like")) != G4_OK) { CHECK(0, "load: %s", m.error); goto out; }
    pvc = g4_model_tensor(&pg.m, "pixel_values.c");
    pos1 = g4_model_tensor(&pg.m, "image_position_ids.1");
    fs = g4_model_tensor(&pg.m, "input_features.short");
    short_pcm = g4_model_tensor(&pg.m, "audio.short");
    CHECK(pvc && pos1 && fs && short_pcm && pvc->shape[0] == 60 && pos1->shape[0] == 2 && fs->shape[0] == 31, "golden tensors");
    if (!(pvc && pos1 && fs && short_pcm)) goto out;
    CHECK(g4_image_config_load(&ic, tiny(UPROC)) == G4_OK && g4_image_config_check(&ic, &m.config) == G4_OK, "%s", ic.error);
    CHECK(uimage(&ic, &vg, 0, pv, pos, &n_soft) && n_soft == 63 &&
              memcmp(pos, pos1->data, sizeof(int32_t) * 70 * 2) == 0, "a.png: %d soft tokens (63), positions", n_soft);
    CHECK(uimage(&ic, &vg, 2, pv, pos, &n_soft) && n_soft == 60, "c.png: %d soft tokens (60)", n_soft);
    for (i = 60 * 432; i < 70 * 432; i++) zero &= pv[i] == 0.0f;
    printf("  c.png (RGBA 60x40) -> %d merged patches: pixel_values %s, padding zero %d\n", n_soft,
           memcmp(pv, pvc->data, sizeof(float) * 60 * 432) == 0 ? "bit-identical" : "DIFFERENT", zero);
    CHECK(memcmp(pv, pvc->data, sizeof(float) * 60 * 432) == 0 && zero, "c.png pixel_values bit for bit");
    CHECK(memcmp(pos, (const int32_t *)pos1->data + 70 * 2, sizeof(int32_t) * 70 * 2) == 0, "c.png positions");
    memset(&run, 0, sizeof run);
    CHECK(g4_unified_audio_frames(&m, (const float *)short_pcm->data, (size_t)short_pcm->shape[0], frames, 32, &run, &nf) ==
              G4_OK && nf == 31 && memcmp(frames, fs->data, sizeof(float) * 31 * 40) == 0,
          "the 1234-sample clip: %d frames (31), bit for bit", nf);
    { /* the processing side's framing (g4_unified_fe_frames, the processor's settings) gives the same */
        g4_unified_fe fe;
        CHECK(g4_unified_fe_load(&fe, tiny(UPROC)) == G4_OK &&
                  g4_unified_fe_frames(&fe, (const float *)short_pcm->data, (size_t)short_pcm->shape[0], frames, 32, &nf) ==
                      G4_OK && nf == 31 && memcmp(frames, fs->data, sizeof(float) * 31 * 40) == 0,
              "g4_unified_fe_frames: %d frames (31), bit for bit: %s", nf, fe.error);
        CHECK(g4_unified_fe_frames(&fe, (const float *)short_pcm->data, (size_t)short_pcm->shape[0], frames, 30, &nf) ==
                  G4_ERR_INPUT && nf == 0 && strstr(fe.error, "31 frames of 40; room for 30"), "no room: %s", fe.error);
        CHECK(g4_unified_fe_frames(&fe, NULL, 0, frames, 0, &nf) == G4_OK && nf == 0, "an empty clip: no frame");
    }
out:
    g4_model_free(&m);
    g4_model_free(&vg.m);
    g4_model_free(&pg.m);
}

/* The chat template's ids, expanded with the counts of g4_image_preprocess
   and g4_unified_audio_tokens, are apply_chat_template's (every id). */
static int32_t *uchat_ids(int c, const g4_tokenizer *tok, const g4_template *tpl, size_t *n) {
    g4_template_options o = g4_template_options_init();
    int32_t *ids = NULL;
    char err[G4_ERROR_MAX];
    o.enable_thinking = -1; /* apply_chat_template was not given it */
    if (g4_template_encode(tpl, tok, uchats[c], strlen(uchats[c]), &o, &ids, n, err) != G4_OK) {
        printf("  chat %d: %s\n", c, err);
        return NULL;
    }
    return ids;
}

static void test_processor_ids(void) {
    golden pg, vg;
    g4_tokenizer tok;
    g4_template tpl;
    g4_image_config ic;
    g4_unified_fe fe;
    g4_config uc;
    float pv[70 * 432];
    int32_t pos[70 * 2], *out = NULL;
    size_t n_short = 1234, n_b = 0, n_out = 0;
    float *clip_b = NULL;
    int c, ok_tpl;
    char err[G4_ERROR_MAX];
    memset(&tok, 0, sizeof tok);
    memset(&tpl, 0, sizeof tpl);
    if (!golden_open_file(&pg, "unified_like", "processor_golden.safetensors")) { CHECK(0, "processor golden"); return; }
    if (!open_vision_golden(&vg)) { CHECK(0, "vision golden"); g4_model_free(&pg.m); return; }
    CHECK(g4_config_load(&uc, tiny("unified_like/config.json")) == G4_OK, "config: %s", uc.error);
    CHECK(g4_tokenizer_load(&tok, tiny(UPROC)) == G4_OK, "tokenizer: %s", tok.error);
    ok_tpl = g4_template_load(&tpl, path2(g_data, "templates/e2b")) == G4_OK;
    CHECK(ok_tpl, "template: %s", tpl.error);
    if (ok_tpl) g4_template_set_tokens(&tpl, &tok);
    CHECK(g4_image_config_load(&ic, tiny(UPROC)) == G4_OK && g4_image_config_check(&ic, &uc) == G4_OK, "%s", ic.error);
    CHECK(g4_unified_fe_load(&fe, tiny(UPROC)) == G4_OK && g4_unified_fe_check(&fe, &uc) == G4_OK, "%s", fe.error);
    clip_b = read_wav(path2(g_data, "tiny/e2b_audio/clip_b.wav"), &n_b);
    CHECK(clip_b && n_b == 7000, "clip_b.wav: %zu samples", n_b);
    if (!ok_tpl || !clip_b || !tok.n_vocab) goto out;
    for (c = 0; c < 2; c++) {
        char key[32];
        int n_want = 0, n_img_rows = 0, n_aud_rows = 0, n_img, n_aud, k, imgs[2], auds[3];
        const int32_t *want, *img_rows, *aud_rows;
        size_t n_ids = 0;
        int32_t *ids = uchat_ids(c, &tok, &tpl, &n_ids);
        snprintf(key, sizeof key, "ids.%d", c);
        want = golden_ids(&pg, key, &n_want);
        snprintf(key, sizeof key, "image_rows.%d", c);
        img_rows = golden_ids(&pg, key, &n_img_rows);
        snprintf(key, sizeof key, "audio_rows.%d", c);
        aud_rows = golden_ids(&pg, key, &n_aud_rows);
        CHECK(ids && want && img_rows && aud_rows, "case %d: ids and golden", c);
        if (!(ids && want && img_rows && aud_rows)) { g4_template_free_output(ids); continue; }
        /* the conversations' media in order: case 0 a.png, clip_b; case 1 a.png, clip_b, c.png, short, clip_b */
        n_img = c == 0 ? 1 : 2;
        n_aud = c == 0 ? 1 : 3;
        for (k = 0; k < n_img; k++) CHECK(uimage(&ic, &vg, k == 0 ? 0 : 2, pv, pos, &imgs[k]), "case %d image %d", c, k);
        auds[0] = (int)g4_unified_audio_tokens(&fe, n_b);
        auds[1] = (int)g4_unified_audio_tokens(&fe, c == 0 ? n_b : n_short);
        auds[2] = (int)g4_unified_audio_tokens(&fe, n_b);
        CHECK(n_img_rows == n_img && n_aud_rows == n_aud && memcmp(imgs, img_rows, sizeof(int) * (size_t)n_img) == 0 &&
                  memcmp(auds, aud_rows, sizeof(int) * (size_t)n_aud) == 0, "case %d: the runs' lengths", c);
        err[0] = 0;
        CHECK(g4_mm_expand(&uc, ids, (int)n_ids, imgs, n_img, auds, n_aud, NULL, 0, &n_out, err) == G4_ERR_INPUT &&
                  n_out == (size_t)n_want, "case %d: length %zu, the processor's %d (%s)", c, n_out, n_want, err);
        out = (int32_t *)malloc(sizeof(int32_t) * (n_out + 1));
        CHECK(out && g4_mm_expand(&uc, ids, (int)n_ids, imgs, n_img, auds, n_aud, out, n_out, &n_out, err) == G4_OK &&
                  n_out == (size_t)n_want && memcmp(out, want, sizeof(int32_t) * (size_t)n_want) == 0,
              "case %d: ids differ from the processor's (%s)", c, err);
        printf("  case %d: %zu template ids -> %zu ids (%d images, %d clips), the processor's %d: %s\n", c, n_ids, n_out,
               n_img, n_aud, n_want, out && n_out == (size_t)n_want && !memcmp(out, want, sizeof(int32_t) * n_out) ? "equal" : "DIFFERENT");
        if (c == 1) { /* bad input: counts that differ, a negative count, no room, a config without the audio ids */
            g4_config nc = uc;
            CHECK(g4_mm_expand(&uc, ids, (int)n_ids, imgs, 1, auds, n_aud, out, n_out, &n_out, err) == G4_ERR_INPUT &&
                      strstr(err, "2 image placeholders") && strstr(err, "1 images"), "one image short: %s", err);
            CHECK(g4_mm_expand(&uc, ids, (int)n_ids, imgs, n_img, auds, 2, out, n_out, &n_out, err) == G4_ERR_INPUT &&
                      strstr(err, "3 audio placeholders") && strstr(err, "2 clips"), "one clip short: %s", err);
            CHECK(g4_mm_expand(&uc, ids, (int)n_ids, imgs, n_img, NULL, 0, out, (size_t)n_want, &n_out, err) ==
                      G4_ERR_INPUT && strstr(err, "audio placeholders"), "clips in the ids, none given: %s", err);
            auds[1] = -1;
            CHECK(g4_mm_expand(&uc, ids, (int)n_ids, imgs, n_img, auds, n_aud, out, (size_t)n_want, &n_out, err) ==
                      G4_ERR_INPUT && strstr(err, "clip 1"), "a negative count: %s", err);
            auds[1] = 31;
            CHECK(g4_mm_expand(&uc, ids, (int)n_ids, imgs, n_img, auds, n_aud, out, (size_t)n_want - 1, &n_out, err) ==
                      G4_ERR_INPUT && n_out == (size_t)n_want && strstr(err, "do not fit"), "no room: %s", err);
            nc.boa_token_id = -1;
            CHECK(g4_mm_expand(&nc, ids, (int)n_ids, imgs, n_img, auds, n_aud, out, (size_t)n_want, &n_out, err) ==
                      G4_ERR_INPUT && strstr(err, "boa_token_id"), "no boa: %s", err);
            CHECK(g4_mm_expand(&uc, ids, -1, imgs, n_img, auds, n_aud, out, (size_t)n_want, &n_out, err) == G4_ERR_INPUT &&
                      n_out == 0, "n < 0: %s", err);
        }
        free(out);
        out = NULL;
        g4_template_free_output(ids);
    }
out:
    free(clip_b);
    g4_template_free(&tpl);
    g4_tokenizer_free(&tok);
    g4_model_free(&vg.m);
    g4_model_free(&pg.m);
}

/* The CLI under test (argv[2]), quiet; a file of n float32 (NULL after a
   message when it holds another count); ids as --ids takes them. */
static const char *g_cli = "build/gemma4";

static int run_quiet(const char *cmd) { return system(cmd); }

static float *read_floats(const char *path, size_t n) {
    FILE *f = fopen(path, "rb");
    float *x = (float *)malloc(sizeof(float) * (n + 1));
    size_t got = 0;
    if (f && x) { got = fread(x, sizeof(float), n + 1, f); }
    if (f) fclose(f);
    if (got != n) { printf("  %s: %zu floats, %zu expected\n", path, got, n); free(x); return NULL; }
    return x;
}

static void ids_csv(const int32_t *ids, size_t n, char *buf, size_t size) {
    char *q = buf;
    size_t k;
    buf[0] = 0;
    for (k = 0; k < n && q < buf + size - 16; k++) q += sprintf(q, "%s%d", k ? "," : "", (int)ids[k]);
}

/* The CLI's --bf16 on a 12B against the library's bf16 run of case 0
   (processor_logits(1)): soft [63 image + 175 audio][H], logits [n_out][V];
   every byte equal. */
static void cli_bf16(const g4_model *m, const int32_t *ids, size_t n_ids, const float *soft, const float *logits,
                     size_t n_out) {
    char cmd[4096], ids_arg[1024], out[128], img[1024], wav[1024]; /* path2's buffer is reused */
    int H = m->config.hidden_size, V = m->config.vocab_size, k, low = 0;
    float *got;
    snprintf(out, sizeof out, "/tmp/g4_unified_bf16_%d.bin", (int)getpid());
    ids_csv(ids, n_ids, ids_arg, sizeof ids_arg);
    snprintf(img, sizeof img, "%s", path2(g_data, "vision/images/a.png"));
    snprintf(wav, sizeof wav, "%s", path2(g_data, "tiny/e2b_audio/clip_b.wav"));
    for (k = 0; k < 2; k++) { /* image, audio */
        int rows = k ? 175 : 63;
        size_t i;
        snprintf(cmd, sizeof cmd, "%s %s %s %s --processor %s --bf16 --threads 3 --out %s > /dev/null", g_cli,
                 k ? "audio" : "image", tiny("unified_like"), k ? wav : img, tiny(UPROC), out);
        CHECK(run_quiet(cmd) == 0, "%s: exit status", cmd);
        got = read_floats(out, (size_t)rows * H);
        for (i = 0; got && i < (size_t)rows * H; i++) {
            uint32_t u;
            memcpy(&u, &got[i], 4);
            low += (u & 0xffff) != 0;
        }
        printf("  %s --bf16: %d soft tokens, %s the library's bf16 run's bytes\n", k ? "audio" : "image", rows,
               got && memcmp(got, soft + (k ? (size_t)63 * H : 0), sizeof(float) * rows * (size_t)H) == 0 ? "equal to"
                                                                                                         : "NOT");
        CHECK(got && low == 0 && memcmp(got, soft + (k ? (size_t)63 * H : 0), sizeof(float) * rows * (size_t)H) == 0,
              "%s --bf16: the CLI's soft tokens differ from the library's bf16 run (%d not bf16 values)",
              k ? "audio" : "image", low);
        free(got);
    }
    snprintf(cmd, sizeof cmd, "%s logits %s --ids %s --image %s --audio %s --processor %s --bf16 --out %s > /dev/null", g_cli,
             tiny("unified_like"), ids_arg, img, wav, tiny(UPROC), out);
    CHECK(run_quiet(cmd) == 0, "%s: exit status", cmd);
    got = read_floats(out, n_out * (size_t)V);
    printf("  logits --bf16 --image --audio: %zu rows, %s the library's bf16 logits' bytes\n", n_out,
           got && memcmp(got, logits, sizeof(float) * n_out * (size_t)V) == 0 ? "equal to" : "NOT");
    CHECK(got && memcmp(got, logits, sizeof(float) * n_out * (size_t)V) == 0, "logits --bf16: the CLI's logits differ");
    free(got);
    remove(out);
}

/* Chat 0 of the processor golden, where the library and the CLI checks
   below both start: the processor and vision goldens, the model, the
   processor's tokenizer with the E2B template, the chat's ids and the golden
   logit rows. chat0_open returns 0 (having freed what it opened) or 1; then
   chat0_close frees it all. */
typedef struct {
    golden pg, vg;
    g4_model m;
    g4_tokenizer tok;
    g4_template tpl;
    int32_t *ids;
    size_t n_ids;
    const int32_t *rows; /* the golden's logit rows */
    const float *want;   /* [n_rows][V] their logits */
    int n_rows;
    int64_t numel;
} chat0;

static void chat0_close(chat0 *c) {
    g4_template_free_output(c->ids);
    g4_template_free(&c->tpl);
    g4_tokenizer_free(&c->tok);
    g4_model_free(&c->m);
    g4_model_free(&c->vg.m);
    g4_model_free(&c->pg.m);
}

static int chat0_open(chat0 *c) {
    memset(&c->tok, 0, sizeof c->tok);
    memset(&c->tpl, 0, sizeof c->tpl);
    c->ids = NULL;
    if (!golden_open_file(&c->pg, "unified_like", "processor_golden.safetensors")) { CHECK(0, "processor golden"); return 0; }
    if (!open_vision_golden(&c->vg)) { CHECK(0, "vision golden"); g4_model_free(&c->pg.m); return 0; }
    if (g4_model_load(&c->m, tiny("unified_like")) != G4_OK) { CHECK(0, "load: %s", c->m.error); goto fail; }
    if (g4_tokenizer_load(&c->tok, tiny(UPROC)) != G4_OK || g4_template_load(&c->tpl, path2(g_data, "templates/e2b")) != G4_OK) {
        CHECK(0, "tokenizer, template: %s %s", c->tok.error, c->tpl.error);
        goto fail;
    }
    g4_template_set_tokens(&c->tpl, &c->tok);
    if (!(c->ids = uchat_ids(0, &c->tok, &c->tpl, &c->n_ids))) { CHECK(0, "chat ids"); goto fail; }
    c->rows = golden_ids(&c->pg, "logit_rows.0", &c->n_rows);
    c->want = golden_f32(&c->pg, "logits.0", &c->numel);
    if (!c->rows || !c->want || c->numel != (int64_t)c->n_rows * c->m.config.vocab_size) { CHECK(0, "golden logits"); goto fail; }
    return 1;
fail:
    chat0_close(c);
    return 0;
}

/* Case 0 end to end through the library, as the CLI runs it: the template's
   ids, a.png and clip_b through the processor and the embedders, expanded,
   g4_forward_mm; logits within 1e-4 x max |logit| of transformers' on the
   processor's output (the bound; the merge test above measures ~2e-5).
   bf16: the same in the bf16-faithful mode: its logits bit-identical to
   transformers' whole model in torch.bfloat16 on the same chat
   (embed_bf16_golden's logits.0; against the float32 golden only a sanity
   bound, 0.25 x max |logit|: measured 0.133 on this tiny random model), and
   the CLI's --bf16 on the same files must write the library's bytes: image
   and audio (soft tokens, on 3 threads) and logits --image --audio (every
   row). */
static void processor_logits(int bf16) {
    chat0 c;
    g4_image_config ic;
    g4_unified_run run;
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    float pv[70 * 432], *frames = NULL, *soft = NULL, *logits = NULL, *clip_b = NULL;
    int32_t pos[70 * 2], *out = NULL;
    size_t n_b = 0, n_out = 0, bytes = 0;
    void *arena = NULL;
    int n_img = 0, n_aud = 0, nf = 0, H, V, k, got = 0;
    double worst = 0, scale;
    char err[G4_ERROR_MAX];
    memset(&run, 0, sizeof run);
    if (!chat0_open(&c)) return;
    H = c.m.config.hidden_size;
    V = c.m.config.vocab_size;
    clip_b = read_wav(path2(g_data, "tiny/e2b_audio/clip_b.wav"), &n_b);
    CHECK(clip_b && g4_image_config_load(&ic, tiny(UPROC)) == G4_OK && g4_image_config_check(&ic, &c.m.config) == G4_OK &&
              uimage(&ic, &c.vg, 0, pv, pos, &n_img), "clip, image");
    if (!clip_b || n_img != 63) goto out;
    frames = (float *)malloc(sizeof(float) * 175 * 40);
    soft = (float *)malloc(sizeof(float) * (63 + 175) * (size_t)H);
    CHECK(g4_unified_size(&c.m, 175, &bytes) == G4_OK && (arena = arena_alloc(bytes)) && frames && soft, "arena");
    if (!arena || !frames || !soft) goto out;
    run.bf16 = bf16;
    CHECK(g4_unified_embed_image(&c.m, pv, pos, 70, arena, bytes, &run, soft, &n_img) == G4_OK && n_img == 63, "image: %s",
          run.error);
    CHECK(g4_unified_audio_frames(&c.m, clip_b, n_b, frames, 175, &run, &nf) == G4_OK && nf == 175, "frames: %s", run.error);
    CHECK(g4_unified_embed_audio(&c.m, frames, NULL, nf, arena, bytes, &run, soft + (size_t)n_img * H, &n_aud) == G4_OK &&
              n_aud == 175, "audio: %s", run.error);
    out = (int32_t *)malloc(sizeof(int32_t) * (c.n_ids + 63 + 175 + 4));
    CHECK(out && g4_mm_expand(&c.m.config, c.ids, (int)c.n_ids, &n_img, 1, &n_aud, 1, out, c.n_ids + 63 + 175 + 4, &n_out, err) ==
              G4_OK && (int)n_out > c.rows[c.n_rows - 1], "expand: %s", err);
    if (!out || (int)n_out <= c.rows[c.n_rows - 1]) goto out;
    sc.max_context = (int)n_out;
    sc.bf16 = bf16;
    logits = (float *)malloc(sizeof(float) * n_out * (size_t)V);
    if (!logits || g4_session_create(&s, &c.m, &sc) != G4_OK) { CHECK(0, "session: %s", s.error); goto out; }
    CHECK(g4_forward_mm(&s, out, (int)n_out, soft, n_img + n_aud, logits, G4_LOGITS_ALL, NULL) == G4_OK, "forward_mm: %s",
          s.error);
    scale = max_abs(c.want, (size_t)c.numel);
    for (k = 0; k < c.n_rows; k++) {
        double d = max_diff(logits + (size_t)c.rows[k] * V, c.want + (size_t)k * V, (size_t)V);
        if (d > worst) worst = d;
        got++;
    }
    printf("  %s: %zu ids (63 image, 175 audio soft tokens): %d logit rows within %.3g of max |logit| %.3g (float32 "
           "transformers)\n", bf16 ? "bf16" : "float32", n_out, got, worst / scale, scale);
    CHECK(got == c.n_rows && worst <= (bf16 ? 0.25 : 1e-4) * scale, "logits %.3g relative", worst / scale);
    if (bf16) { /* transformers in torch.bfloat16 on the same chat (embed_bf16_golden's logits.0): bit for bit */
        golden gb;
        const float *wb;
        int64_t nb = 0;
        long bad = 0;
        if (golden_open_file(&gb, "unified_like", "embed_bf16_golden.safetensors")) {
            wb = golden_f32(&gb, "logits.0", &nb);
            CHECK(wb && nb == c.numel, "bf16 golden logits.0: %lld values, want %lld", (long long)nb, (long long)c.numel);
            for (k = 0; wb && nb == c.numel && k < c.n_rows; k++) {
                size_t j;
                for (j = 0; j < (size_t)V; j++) bad += memcmp(&logits[(size_t)c.rows[k] * V + j], &wb[(size_t)k * V + j], 4) != 0;
            }
            printf("  bf16: %d logit rows against transformers in torch.bfloat16: %ld of %lld values differ\n", c.n_rows,
                   bad, (long long)nb);
            CHECK(wb && bad == 0, "bf16 logits: %ld values differ from transformers in torch.bfloat16", bad);
            g4_model_free(&gb.m);
        } else CHECK(0, "bf16 golden");
    }
    g4_session_destroy(&s);
    if (bf16) cli_bf16(&c.m, c.ids, c.n_ids, soft, logits, n_out);
out:
    free(arena); free(frames); free(soft); free(logits); free(clip_b); free(out);
    chat0_close(&c);
}

static void test_processor_logits(void) { processor_logits(0); }
static void test_processor_logits_bf16(void) { processor_logits(1); }

/* Gemma4UnifiedVideoProcessor = Gemma4VideoProcessor with merged patches
   (kind G4_IMAGE_UNIFIED): two frames (a.png and its mirror image) give its
   positions and (the stored 16 merged patches of frame 1) its pixel values
   bit for bit, the fused float32(v) / 255 rescale included; the text
   expansion (g4_mm_expand_videos, 24 fps, both frames 00:00) tokenized is
   Gemma4UnifiedProcessor's ids; the frames through g4_unified_embed_image and
   g4_forward_mm (a block per frame) give transformers' logits on unified_like
   (1e-4 x max |logit|); the family checks refuse the other's. */
static void test_processor_video(void) {
    golden pg, vg;
    g4_video_config vc;
    g4_config uc, ec;
    g4_tokenizer tok;
    const g4_tensor *pos, *pv1;
    const int32_t *want, *rows;
    int n_want = 0, n_rows = 0, h = 0, w = 0, ch = 0, y, x, k, n_soft = -1;
    uint8_t *px = NULL, *frames = NULL;
    float *pv = NULL;
    int32_t *p2 = NULL, ids[1024];
    void *scratch = NULL;
    size_t sb, n_text = 0, n_ids = 0;
    char text[16384], err[G4_ERROR_MAX] = "";
    g4_video_item it;
    memset(&tok, 0, sizeof tok);
    if (!golden_open_file(&pg, "unified_like", "processor_golden.safetensors")) { CHECK(0, "processor golden"); return; }
    if (!open_vision_golden(&vg)) { CHECK(0, "vision golden"); g4_model_free(&pg.m); return; }
    CHECK(g4_config_load(&uc, tiny("unified_like/config.json")) == G4_OK &&
              g4_config_load(&ec, path2(g_data, "vision/e2b_mm/config.json")) == G4_OK, "configs");
    pos = g4_model_tensor(&pg.m, "video_position_ids");
    pv1 = g4_model_tensor(&pg.m, "pixel_values_videos.1");
    want = golden_ids(&pg, "ids.video", &n_want);
    rows = golden_ids(&pg, "video_rows", &n_rows);
    CHECK(pos && pv1 && want && rows && pos->shape[0] == 2 && pos->shape[1] == 70, "golden");
    if (!(pos && pv1 && want && rows)) goto out;
    if (!(px = vision_image(&vg, 0, &h, &w, &ch)) || ch != 3) {
        CHECK(0, "vision/processor.safetensors' image.0: %s", px ? "not 3 channels" : "absent, or not int16 [h][w][c]");
        goto out;
    }
    CHECK(g4_video_config_load(&vc, tiny(UPROC)) == G4_OK && vc.kind == G4_IMAGE_UNIFIED && vc.patch_size == 12 &&
              vc.pooling_kernel_size == 1 && g4_video_config_check(&vc, &uc) == G4_OK, "unified video processor: %s", vc.error);
    frames = (uint8_t *)malloc((size_t)2 * h * w * 3);
    for (y = 0; y < h; y++) /* frame 0: a.png; frame 1: mirrored left to right */
        for (x = 0; x < w; x++)
            for (k = 0; k < 3; k++) {
                frames[((size_t)y * w + x) * 3 + k] = px[((size_t)y * w + x) * 3 + k];
                frames[(size_t)h * w * 3 + ((size_t)y * w + x) * 3 + k] = px[((size_t)y * w + (w - 1 - x)) * 3 + k];
            }
    sb = g4_video_scratch_size(&vc, h, w);
    scratch = arena_alloc(sb);
    pv = (float *)malloc(sizeof(float) * 2 * 70 * 432);
    p2 = (int32_t *)malloc(sizeof(int32_t) * 2 * 70 * 2);
    CHECK(sb && scratch && pv && p2 && g4_video_preprocess(&vc, frames, 2, h, w, 3, scratch, sb, pv, p2, &n_soft) == G4_OK,
          "preprocess: %s", vc.error);
    CHECK(n_soft == rows[0], "%d soft tokens a frame, the processor's %d", n_soft, rows[0]);
    CHECK(memcmp(p2, pos->data, sizeof(int32_t) * 2 * 70 * 2) == 0, "video_position_ids");
    CHECK(memcmp(pv + 70 * 432, pv1->data, sizeof(float) * 16 * 432) == 0, "frame 1's pixel values differ");
    printf("  2 frames -> %d merged patches each: positions %s, frame 1's stored patches %s\n", n_soft,
           memcmp(p2, pos->data, sizeof(int32_t) * 280) ? "DIFFERENT" : "equal",
           memcmp(pv + 70 * 432, pv1->data, sizeof(float) * 16 * 432) ? "DIFFERENT" : "bit-identical");
    /* the ids: the text expanded with the frames' stamps, then tokenized with <bos> */
    memset(&it, 0, sizeof it);
    it.n_frames = 2; it.n_soft = n_soft; it.fps = 0;
    CHECK(g4_tokenizer_load(&tok, tiny(UPROC)) == G4_OK &&
              g4_mm_expand_videos(&tok, &uc, "Watch <|video|> now", 19, &it, 1, text, sizeof text, &n_text, err) == G4_OK &&
              g4_tokenize(&tok, text, n_text, G4_ENCODE_ADD_SPECIAL, ids, 1024, &n_ids) == G4_OK,
          "expand, tokenize: %s %s", err, tok.error);
    CHECK(n_ids == (size_t)n_want && memcmp(ids, want, sizeof(int32_t) * n_ids) == 0, "ids: %zu, the processor's %d", n_ids,
          n_want);
    { /* the frames through the embedder and the merge (each frame a bidirectional block): transformers' logits */
        g4_model m;
        g4_session s;
        g4_session_config sc = g4_session_config_init();
        g4_unified_run run;
        const int32_t *lrows;
        const float *lwant;
        int64_t numel = 0;
        int n_lrows = 0, f, got = 0, n_v = 0;
        size_t bytes = 0;
        void *arena = NULL;
        float *soft = (float *)malloc(sizeof(float) * 2 * 70 * 32), *logits = (float *)malloc(sizeof(float) * 1024 * 512);
        double worst = 0, scale = 1;
        memset(&run, 0, sizeof run);
        lrows = golden_ids(&pg, "logit_rows.video", &n_lrows);
        lwant = golden_f32(&pg, "logits.video", &numel);
        if (lrows && lwant && soft && logits && g4_model_load(&m, tiny("unified_like")) == G4_OK) {
            CHECK(g4_unified_size(&m, 70, &bytes) == G4_OK && (arena = arena_alloc(bytes)) != NULL, "arena");
            for (f = 0; arena && f < 2; f++) {
                CHECK(g4_unified_embed_image(&m, pv + (size_t)f * 70 * 432, p2 + (size_t)f * 70 * 2, 70, arena, bytes, &run,
                                             soft + (size_t)n_v * 32, &got) == G4_OK, "frame %d: %s", f, run.error);
                n_v += got;
            }
            sc.max_context = (int)n_ids;
            if (g4_session_create(&s, &m, &sc) == G4_OK) {
                CHECK(g4_forward_mm(&s, ids, (int)n_ids, soft, n_v, logits, G4_LOGITS_ALL, NULL) == G4_OK, "forward_mm: %s",
                      s.error);
                scale = max_abs(lwant, (size_t)numel);
                for (k = 0; k < n_lrows; k++) {
                    double d = max_diff(logits + (size_t)lrows[k] * 512, lwant + (size_t)k * 512, 512);
                    if (d > worst) worst = d;
                }
                printf("  the video prompt (%zu ids, %d soft tokens): %d logit rows within %.3g x max |logit| %.3g\n", n_ids,
                       n_v, n_lrows, worst / scale, scale);
                CHECK(n_v == 2 * n_soft && worst <= 1e-4 * scale, "video logits %.3g relative", worst / scale);
                g4_session_destroy(&s);
            } else CHECK(0, "session: %s", s.error);
            g4_model_free(&m);
        } else CHECK(0, "golden video logits, model");
        free(arena); free(soft); free(logits);
    }
    /* the families */
    CHECK(g4_video_config_check(&vc, &ec) == G4_ERR_CONFIG && strstr(vc.error, "Gemma4UnifiedVideoProcessor"),
          "a unified video processor for a Gemma 4 tower: %s", vc.error);
    CHECK(g4_video_config_load(&vc, path2(g_data, "vision/processor")) == G4_OK && vc.kind == G4_IMAGE_GEMMA4 &&
              g4_video_config_check(&vc, &uc) == G4_ERR_CONFIG && strstr(vc.error, "Gemma4VideoProcessor"),
          "a Gemma4VideoProcessor for the 12B: %s", vc.error);
    CHECK(g4_video_config_parse(&vc, "{\"video_processor\": {\"patch_size\": 4, \"pooling_kernel_size\": 3}}", 64, "t") ==
              G4_OK && vc.kind == G4_IMAGE_ANY && g4_video_config_check(&vc, &uc) == G4_OK && vc.patch_size == 12 &&
              vc.pooling_kernel_size == 1, "untyped: %s", vc.error);
    CHECK(g4_video_config_parse(&vc, "{\"video_processor_type\": \"LlavaVideoProcessor\"}", 47, "t") == G4_ERR_CONFIG &&
              strstr(vc.error, "video_processor_type"), "another type: %s", vc.error);
out:
    free(px); free(frames); free(pv); free(p2); free(scratch);
    g4_tokenizer_free(&tok);
    g4_model_free(&vg.m);
    g4_model_free(&pg.m);
}

/* ------------------------------------------------------------------ CLI */
/* gemma4 logits / greedy / image / audio / info on the 12B: the chat's ids
   (one placeholder per file, from the template), a.png and clip_b.wav with
   --processor give transformers' logits on the processor's output (1e-4 x
   max |logit|), greedy its next token; `image` and `audio` write what the
   library's embedders give (the same functions: the same bits), also with
   --adapter (LoRA on the embedders) and --bf16; a
   Gemma4ImageProcessor, a count mismatch and an 8 kHz clip are one line and
   exit 1. */

static void test_cli(void) {
    chat0 c;
    g4_image_config ic;
    g4_unified_run run;
    char cmd[4096], ids_arg[1024], out[128], wav8[128], line[1024];
    int32_t pos[70 * 2];
    float pv[70 * 432], *got = NULL, *lib = NULL, *frames = NULL, *clip_b = NULL;
    size_t n_b = 0, bytes = 0;
    int V, H, n = 0, nf = 0, i, found;
    double worst = 0, scale;
    void *arena = NULL;
    FILE *p;
    memset(&run, 0, sizeof run);
    snprintf(out, sizeof out, "/tmp/g4_unified_cli_%d.bin", (int)getpid());
    snprintf(wav8, sizeof wav8, "/tmp/g4_unified_cli_%d.wav", (int)getpid());
    if (!chat0_open(&c)) return;
    H = c.m.config.hidden_size;
    V = c.m.config.vocab_size;
    ids_csv(c.ids, c.n_ids, ids_arg, sizeof ids_arg);
    /* logits: every golden row */
    snprintf(cmd, sizeof cmd, "%s logits %s --ids %s --image %s --audio %s --processor %s --out %s > /dev/null", g_cli,
             tiny("unified_like"), ids_arg, path2(g_data, "vision/images/a.png"), path2(g_data, "tiny/e2b_audio/clip_b.wav"),
             tiny(UPROC), out);
    CHECK(run_quiet(cmd) == 0, "%s: exit status", cmd);
    got = read_floats(out, (size_t)266 * V);
    scale = max_abs(c.want, (size_t)c.numel);
    for (i = 0; got && i < c.n_rows; i++) {
        double d = max_diff(got + (size_t)c.rows[i] * V, c.want + (size_t)i * V, (size_t)V);
        if (d > worst) worst = d;
    }
    printf("  logits --image a.png --audio clip_b.wav: 266 rows, the golden %d within %.3g x max |logit|\n", c.n_rows,
           worst / scale);
    CHECK(got && worst <= 1e-4 * scale, "CLI logits %.3g relative", worst / scale);
    /* greedy: the first new token is transformers' argmax of the last row */
    snprintf(cmd, sizeof cmd, "%s greedy %s --ids %s --image %s --audio %s --processor %s --new 1", g_cli, tiny("unified_like"),
             ids_arg, path2(g_data, "vision/images/a.png"), path2(g_data, "tiny/e2b_audio/clip_b.wav"), tiny(UPROC));
    if ((p = popen(cmd, "r")) != NULL) {
        char big[8192] = "", *last;
        int rc, want_tok = c.rows[c.n_rows - 1] == 265 ? (int)g4_argmax(c.want + (size_t)(c.n_rows - 1) * V, V) : -2;
        if (!fgets(big, sizeof big, p)) big[0] = 0;
        rc = pclose(p);
        last = strrchr(big, ' ');
        CHECK(rc == 0 && last && atoi(last + 1) == want_tok, "greedy: status %d, last token %s, want %d", rc,
              last ? last + 1 : "none", want_tok);
    } else CHECK(0, "popen");
    /* image: the library's embedding of the same file (one thread; the CLI on 3: the same bits) */
    snprintf(cmd, sizeof cmd, "%s image %s %s --processor %s --threads 3 --out %s > /dev/null", g_cli, tiny("unified_like"),
             path2(g_data, "vision/images/a.png"), tiny(UPROC), out);
    CHECK(run_quiet(cmd) == 0, "%s: exit status", cmd);
    free(got);
    got = read_floats(out, (size_t)63 * H);
    CHECK(g4_unified_size(&c.m, 175, &bytes) == G4_OK && (arena = arena_alloc(bytes)) != NULL, "arena");
    lib = (float *)malloc(sizeof(float) * 175 * (size_t)H);
    if (!arena || !lib) goto out;
    CHECK(g4_image_config_load(&ic, tiny(UPROC)) == G4_OK && g4_image_config_check(&ic, &c.m.config) == G4_OK &&
              uimage(&ic, &c.vg, 0, pv, pos, &n) && g4_unified_embed_image(&c.m, pv, pos, 70, arena, bytes, &run, lib, &n) == G4_OK &&
              n == 63, "library image: %s", run.error);
    CHECK(got && memcmp(got, lib, sizeof(float) * 63 * (size_t)H) == 0, "image: the CLI's soft tokens differ from the library's");
    /* audio: the same */
    snprintf(cmd, sizeof cmd, "%s audio %s %s --processor %s --threads 3 --out %s > /dev/null", g_cli, tiny("unified_like"),
             path2(g_data, "tiny/e2b_audio/clip_b.wav"), tiny(UPROC), out);
    CHECK(run_quiet(cmd) == 0, "%s: exit status", cmd);
    free(got);
    got = read_floats(out, (size_t)175 * H);
    clip_b = read_wav(path2(g_data, "tiny/e2b_audio/clip_b.wav"), &n_b);
    frames = (float *)malloc(sizeof(float) * 175 * 40);
    CHECK(clip_b && frames && g4_unified_audio_frames(&c.m, clip_b, n_b, frames, 175, &run, &nf) == G4_OK &&
              g4_unified_embed_audio(&c.m, frames, NULL, nf, arena, bytes, &run, lib, &n) == G4_OK && n == 175,
          "library audio: %s", run.error);
    CHECK(got && memcmp(got, lib, sizeof(float) * 175 * (size_t)H) == 0, "audio: the CLI's soft tokens differ from the library's");
    /* --adapter (LoRA on the embedders' linears, data/lora/unified_embedders; tests/test_lora.c checks the
       library against peft): image on 3 threads and audio in the bf16 mode, the library's bytes */
    {
        g4_model ma;
        void *arena2 = NULL;
        size_t bytes2 = 0;
        float *lib2 = (float *)malloc(sizeof(float) * 175 * (size_t)H);
        char adapter[600];
        int k;
        snprintf(adapter, sizeof adapter, "%s", path2(g_data, "lora/unified_embedders"));
        memset(&ma, 0, sizeof ma);
        CHECK(lib2 && g4_model_load(&ma, tiny("unified_like")) == G4_OK && g4_model_load_adapter(&ma, adapter) == G4_OK &&
                  g4_unified_size(&ma, 175, &bytes2) == G4_OK && (arena2 = arena_alloc(bytes2)) != NULL,
              "the adapted model: %s", ma.error);
        for (k = 0; k < 2 && arena2; k++) {
            int ns = 0;
            g4_unified_run r2;
            memset(&r2, 0, sizeof r2);
            r2.bf16 = k;
            snprintf(cmd, sizeof cmd, "%s %s %s %s --processor %s --adapter %s%s --out %s > /dev/null", g_cli, k ? "audio" : "image",
                     tiny("unified_like"), k ? path2(g_data, "tiny/e2b_audio/clip_b.wav") : path2(g_data, "vision/images/a.png"),
                     tiny(UPROC), adapter, k ? " --bf16" : " --threads 3", out);
            CHECK(run_quiet(cmd) == 0, "%s: exit status", cmd);
            free(got);
            got = read_floats(out, (size_t)(k ? 175 : 63) * H);
            CHECK((k ? g4_unified_embed_audio(&ma, frames, NULL, nf, arena2, bytes2, &r2, lib2, &ns)
                     : g4_unified_embed_image(&ma, pv, pos, 70, arena2, bytes2, &r2, lib2, &ns)) == G4_OK &&
                      ns == (k ? 175 : 63), "library %s with the adapter: %s", k ? "audio" : "image", r2.error);
            CHECK((k ? g4_unified_embed_audio(&c.m, frames, NULL, nf, arena, bytes, &r2, lib, &n)
                     : g4_unified_embed_image(&c.m, pv, pos, 70, arena, bytes, &r2, lib, &n)) == G4_OK && n == ns,
                  "library %s without it: %s", k ? "audio" : "image", r2.error);
            CHECK(got && memcmp(got, lib2, sizeof(float) * (size_t)ns * H) == 0 && memcmp(lib2, lib, sizeof(float) * (size_t)ns * H) != 0,
                  "%s --adapter: the CLI's soft tokens differ from the library's (or the adapter changed nothing)",
                  k ? "audio --bf16" : "image");
        }
        free(arena2);
        free(lib2);
        g4_model_free(&ma);
    }
    /* info */
    snprintf(cmd, sizeof cmd, "%s info %s", g_cli, tiny("unified_like"));
    found = 0;
    if ((p = popen(cmd, "r")) != NULL) {
        while (fgets(line, sizeof line, p))
            found += strstr(line, "unified vision embedder (no encoder): merged patches of 12 x 12 pixels (patch 4 x pooling 3), "
                                  "width 24, position table 10; ids: image 500, boi 501, eoi 502; bidirectional image "
                                  "attention on every layer") != NULL ||
                     strstr(line, "unified audio embedder (no encoder): frames of 40 raw samples; ids: audio 503, boa 504, "
                                  "eoa 505") != NULL;
        CHECK(pclose(p) == 0 && found == 2, "info: %d of the 2 embedder lines", found);
    }
    /* bad input: Gemma 4's processor, a placeholder without its file, a clip at 8 kHz */
    snprintf(cmd, sizeof cmd, "%s logits %s --ids %s --image %s --audio %s --processor %s --out %s 2> /dev/null", g_cli,
             tiny("unified_like"), ids_arg, path2(g_data, "vision/images/a.png"), path2(g_data, "tiny/e2b_audio/clip_b.wav"),
             path2(g_data, "vision/processor"), out);
    CHECK(run_quiet(cmd) != 0, "a Gemma4ImageProcessor for the 12B: exit 0");
    snprintf(cmd, sizeof cmd, "%s logits %s --ids %s --image %s --processor %s --out %s 2> /dev/null", g_cli,
             tiny("unified_like"), ids_arg, path2(g_data, "vision/images/a.png"), tiny(UPROC), out);
    CHECK(run_quiet(cmd) != 0, "an audio placeholder without --audio: exit 0");
    {
        static const unsigned char hdr[44] = {'R', 'I', 'F', 'F', 36 + 16, 0, 0, 0, 'W', 'A', 'V', 'E', 'f', 'm', 't', ' ',
                                              16, 0, 0, 0, 1, 0, 1, 0, 0x40, 0x1f, 0, 0, 0x80, 0x3e, 0, 0, 2, 0, 16, 0,
                                              'd', 'a', 't', 'a', 16, 0, 0, 0};
        static const unsigned char zeros[16] = {0};
        FILE *f = fopen(wav8, "wb");
        if (f) { fwrite(hdr, 1, sizeof hdr, f); fwrite(zeros, 1, sizeof zeros, f); fclose(f); }
        snprintf(cmd, sizeof cmd, "%s audio %s %s --processor %s --out %s 2>&1", g_cli, tiny("unified_like"), wav8,
                 tiny(UPROC), out);
        found = 0;
        if ((p = popen(cmd, "r")) != NULL) {
            while (fgets(line, sizeof line, p)) found |= strstr(line, "8000 Hz") != NULL;
            CHECK(pclose(p) != 0 && found, "an 8 kHz clip: no error naming the rate");
        }
        remove(wav8);
    }
out:
    remove(out);
    free(got); free(lib); free(frames); free(clip_b); free(arena);
    chat0_close(&c);
}

/* The chat path on a 12B directory assembled from the pieces (config and
   weights of unified_like, the processor's files, the E2B template; links in
   /tmp): `template --ids --image --audio` prints Gemma4UnifiedProcessor's
   apply_chat_template ids for the conversation, and `generate --chat --temp 0`
   on the same chat as a prompt ("Describe<|image|>and<|audio|>.") writes the
   text of transformers' argmax of the last row. */
static int link_into(const char *dir, const char *target, const char *name) {
    char abs_path[4096], link[1024];
    if (!realpath(target, abs_path)) { printf("  %s: not found\n", target); return 0; }
    snprintf(link, sizeof link, "%s/%s", dir, name);
    return symlink(abs_path, link) == 0;
}

static void test_cli_chat(void) {
    golden pg;
    g4_tokenizer tok;
    char dir[128], msgs[160], cmd[4096], text[4096], line[16384] = "", want_text[256] = "";
    const char *names[6] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                            "processor_config.json", "chat_template.jinja"};
    const char *targets[6];
    const int32_t *want, *rows;
    const float *logits;
    int n_want = 0, n_rows = 0, k, ok = 1, n_got = 0, same = 1;
    int64_t numel = 0;
    size_t len = 0;
    FILE *p, *f;
    char *q, *end;
    int32_t next;
    memset(&tok, 0, sizeof tok);
    snprintf(dir, sizeof dir, "/tmp/g4_unified_dir_%d", (int)getpid());
    snprintf(msgs, sizeof msgs, "/tmp/g4_unified_msgs_%d.json", (int)getpid());
    if (!golden_open_file(&pg, "unified_like", "processor_golden.safetensors")) { CHECK(0, "processor golden"); return; }
    want = golden_ids(&pg, "ids.0", &n_want);
    rows = golden_ids(&pg, "logit_rows.0", &n_rows);
    logits = golden_f32(&pg, "logits.0", &numel);
    if (!want || !rows || !logits || rows[n_rows - 1] != n_want - 1) { CHECK(0, "golden"); g4_model_free(&pg.m); return; }
    targets[0] = strdup(tiny("unified_like/config.json"));
    targets[1] = strdup(tiny("unified_like/model.safetensors"));
    targets[2] = strdup(tiny(UPROC "/tokenizer.json"));
    targets[3] = strdup(tiny(UPROC "/tokenizer_config.json"));
    targets[4] = strdup(tiny(UPROC "/processor_config.json"));
    targets[5] = strdup(path2(g_data, "templates/e2b/chat_template.jinja"));
    ok = mkdir(dir, 0700) == 0;
    for (k = 0; k < 6 && ok; k++) ok = link_into(dir, targets[k], names[k]);
    CHECK(ok, "the directory %s", dir);
    if ((f = fopen(msgs, "w")) != NULL) { fputs(uchats[0], f); fclose(f); }
    /* template --ids */
    snprintf(cmd, sizeof cmd, "%s template %s --messages %s --ids --image %s --audio %s", g_cli, dir, msgs,
             path2(g_data, "vision/images/a.png"), path2(g_data, "tiny/e2b_audio/clip_b.wav"));
    if (ok && (p = popen(cmd, "r")) != NULL) {
        size_t got = fread(line, 1, sizeof line - 1, p);
        line[got] = 0;
        CHECK(pclose(p) == 0, "%s: exit status", cmd);
        for (q = line; *q; q = end) {
            long v = strtol(q, &end, 10);
            if (end == q) break;
            same &= n_got < n_want && v == want[n_got];
            n_got++;
        }
        printf("  template --ids --image --audio: %d ids, the processor's %d: %s\n", n_got, n_want,
               same && n_got == n_want ? "equal" : "DIFFERENT");
        CHECK(same && n_got == n_want, "template ids differ from apply_chat_template's");
    }
    /* generate --chat --temp 0: the first token's text */
    next = (int32_t)g4_argmax(logits + (size_t)(n_rows - 1) * 512, 512);
    CHECK(g4_tokenizer_load(&tok, tiny(UPROC)) == G4_OK &&
              g4_detokenize(&tok, &next, 1, 0, want_text, sizeof want_text, &len) == G4_OK, "decode: %s", tok.error);
    snprintf(cmd, sizeof cmd, "%s generate %s --prompt 'Describe<|image|>and<|audio|>.' --chat --image %s --audio %s "
             "--temp 0 --max-tokens 1 2> /dev/null", g_cli, dir, path2(g_data, "vision/images/a.png"),
             path2(g_data, "tiny/e2b_audio/clip_b.wav"));
    if (ok && (p = popen(cmd, "r")) != NULL) {
        size_t got = fread(text, 1, sizeof text - 1, p);
        text[got] = 0;
        while (got && (text[got - 1] == '\n')) text[--got] = 0;
        CHECK(pclose(p) == 0 && strcmp(text, want_text) == 0, "generate: '%s', transformers' argmax %d is '%s'", text,
              (int)next, want_text);
    }
    { /* generate --prompt with a video of two frame files: the text of transformers' argmax on the video prompt */
        const int32_t *vrows;
        const float *vlog;
        int n_vrows = 0;
        int64_t vnum = 0;
        int32_t vnext;
        char vwant[256] = "";
        vrows = golden_ids(&pg, "logit_rows.video", &n_vrows);
        vlog = golden_f32(&pg, "logits.video", &vnum);
        if (vrows && vlog && n_vrows > 0) {
            vnext = (int32_t)g4_argmax(vlog + (size_t)(n_vrows - 1) * 512, 512);
            CHECK(g4_detokenize(&tok, &vnext, 1, 0, vwant, sizeof vwant, &len) == G4_OK, "decode");
            snprintf(cmd, sizeof cmd, "%s generate %s --prompt 'Watch <|video|> now' --video %s,%s --temp 0 --max-tokens 1 "
                     "2> /dev/null", g_cli, dir, path2(g_data, "vision/images/a.png"), tiny(UPROC "/a_mirror.png"));
            if (ok && (p = popen(cmd, "r")) != NULL) {
                size_t got = fread(text, 1, sizeof text - 1, p);
                text[got] = 0;
                while (got && text[got - 1] == '\n') text[--got] = 0;
                CHECK(pclose(p) == 0 && strcmp(text, vwant) == 0, "generate --video: '%s', transformers' argmax %d is '%s'",
                      text, (int)vnext, vwant);
            }
        } else CHECK(0, "golden video logits");
    }
    for (k = 0; k < 6; k++) {
        char link[1024];
        snprintf(link, sizeof link, "%s/%s", dir, names[k]);
        remove(link);
        free((void *)targets[k]);
    }
    rmdir(dir);
    remove(msgs);
    g4_tokenizer_free(&tok);
    g4_model_free(&pg.m);
}

int main(int argc, char **argv) {
    if (argc > 1) g_data = argv[1];
    if (argc > 2) g_cli = argv[2];
    (void)g_tmp;
    run("unified config: sub-configs, plan, embedder tensors", test_config);
    run("unified config: errors name the field", test_config_errors);
    run("unified embed_vision: every tap and the soft tokens vs transformers", test_embed_image);
    run("unified embed_audio: every tap and the soft tokens vs transformers", test_embed_audio);
    run("unified: the embedders on a pool = no pool bit for bit, and the scalar oracle", test_embed_pool);
    run("unified: the embedders' bf16 mode = transformers in torch.bfloat16, every tap bit for bit", test_embed_bf16);
    run("unified: the embedders refuse a model without them", test_missing_embedder);
    run("unified: two images and a clip merged (g4_forward_mm): logits vs transformers", test_merge_logits);
    run("unified: \"all\" is refused by the training reference", test_all_refused_by_training);
    run("unified: Gemma4UnifiedAudioFeatureExtractor's frames, bit for bit", test_audio_frames);
    run("unified: Gemma4UnifiedImageProcessor = g4_image_preprocess at patch 12, no pooling, bit for bit", test_image_processor);
    run("unified processor: processor_config.json kinds, checks against the model, errors", test_processor_config);
    run("unified processor: c.png's pixel values and a clip's frames bit for bit", test_processor_pixels);
    run("unified processor: chats with images and clips give apply_chat_template's ids (g4_mm_expand)", test_processor_ids);
    run("unified processor: a chat with a.png and clip_b through the library: logits vs transformers", test_processor_logits);
    run("unified bf16: the same chat in the bf16-faithful mode = transformers in torch.bfloat16 bit for bit; the CLI's "
        "image/audio/logits --bf16 = the library's bytes",
        test_processor_logits_bf16);
    run("unified processor: a video's merged frames bit for bit, its ids, its logits (Gemma4UnifiedVideoProcessor)",
        test_processor_video);
    run("unified CLI: logits/greedy with --image and --audio, image, audio, info, bad input", test_cli);
    run("unified CLI: template --ids, generate --chat with an image and a clip, generate --video, on a 12B directory",
        test_cli_chat);
    return finish();
}
