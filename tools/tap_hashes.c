/* tools/tap_hashes.c - a fingerprint of every output bit, for refactors that
   must change none: build it against the header before and after, run both on
   the same models and diff the output (tools/tap_hashes.sh does both).

   For each model directory given: the forward with every tap (tap_projections
   on) and all logits, float32 and bf16 (and bf16 with bf16_fast where the
   build has its kernel), on 1 and 2 threads, in chunks of 1, 3 and the whole
   prompt; and the training reference (loss, every gradient, the
   gradient taps), float32, 1 and 2 threads, with and without recompute. Each
   line is one run: FNV-1a 64 over the taps (name, layer, shape, position,
   data bits, in call order), over the logits, over the gradients.

       cc -O2 -march=native -I. -o build/tap_hashes tools/tap_hashes.c -lm -lpthread
       build/tap_hashes data/tiny/e2b_like data/tiny/26b_like ... data/tiny/e2b_drafter=data/tiny/e2b_like

   A DRAFTER=TARGET argument runs the drafter on its target: the target's
   prefill, then four drafting steps (float32 and bf16).

   A model with a vision tower also runs it (float32, 1 and 2 threads) on one
   made-up image (6 x 8 patches and 16 padding patches: every tap and the soft
   tokens), one with an audio tower runs that on made-up features (37 frames,
   the last 5 masked). */
#define GEMMA4_IMPLEMENTATION
#include "gemma4.h"
#include <stdlib.h>
#include <string.h>

typedef struct { uint64_t h; long n; } th_hash;

static void th_mix(th_hash *t, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++) { t->h ^= b[i]; t->h *= 1099511628211ull; }
}
static void th_init(th_hash *t) { t->h = 14695981039346656037ull; t->n = 0; }

static void th_tap(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    th_hash *t = (th_hash *)user;
    int meta[4];
    meta[0] = layer; meta[1] = rows; meta[2] = cols; meta[3] = pos0;
    th_mix(t, name, strlen(name) + 1);
    th_mix(t, meta, sizeof(meta));
    th_mix(t, data, sizeof(float) * (size_t)rows * (size_t)cols);
    t->n++;
}

#define TH_N 11
static const int32_t th_ids[TH_N] = {2, 81, 101, 77, 5, 9, 64, 3, 17, 250, 42};

static int th_forward(const char *dir, const g4_model *m, int bf16, int threads, int chunk) {
    g4_session_config sc = g4_session_config_init();
    g4_session s;
    g4_pool *pool = NULL;
    th_hash taps, lg;
    int V = m->config.vocab_size, p, n, v;
    float *logits = (float *)malloc(sizeof(float) * (size_t)V * TH_N);
    th_init(&taps); th_init(&lg);
    for (n = 0; n < TH_N; n++) if (th_ids[n] >= V) { free(logits); return 0; }
    if (threads > 1 && g4_pool_create(&pool, threads) != G4_OK) { printf("%s: no pool\n", dir); free(logits); return 1; }
    sc.max_context = 64; sc.max_chunk = chunk; sc.bf16 = bf16 > 0; sc.bf16_fast = bf16 == 2; sc.pool = pool;
    sc.tap = th_tap; sc.tap_user = &taps; sc.tap_projections = 1;
    if (g4_session_create(&s, m, &sc) != G4_OK) { printf("%s: %s\n", dir, s.error); free(logits); g4_pool_free(pool); return 1; }
    for (p = 0; p < TH_N; p += n) {
        n = TH_N - p < chunk ? TH_N - p : chunk;
        if (g4_forward(&s, th_ids + p, n, logits + (size_t)p * V, G4_LOGITS_ALL) != G4_OK) {
            printf("%s: %s\n", dir, s.error); break;
        }
    }
    th_mix(&lg, logits, sizeof(float) * (size_t)V * TH_N);
    v = g4_argmax(logits + (size_t)(TH_N - 1) * V, V);
    printf("%-24s fwd  %s threads %d chunk %2d: %4ld taps %016llx logits %016llx argmax %d\n", dir,
           bf16 == 2 ? "fast" : bf16 ? "bf16" : "f32 ", threads, chunk, taps.n, (unsigned long long)taps.h, (unsigned long long)lg.h, v);
    g4_session_destroy(&s);
    g4_pool_free(pool);
    free(logits);
    return 0;
}

static int th_train(const char *dir, const g4_model *m, int threads, int recompute) {
    g4_train_config tc = g4_train_config_init();
    g4_train t;
    g4_pool *pool = NULL;
    th_hash taps, gtaps, gr;
    size_t ab, gf;
    void *arena;
    float *grads, loss = 0;
    th_init(&taps); th_init(&gtaps); th_init(&gr);
    if (threads > 1 && g4_pool_create(&pool, threads) != G4_OK) return 1;
    tc.max_seq = TH_N; tc.recompute = recompute; tc.pool = pool;
    tc.tap = th_tap; tc.tap_user = &taps; tc.grad_tap = th_tap; tc.grad_tap_user = &gtaps;
    if (g4_train_size(m, &tc, &ab, &gf) != G4_OK) { printf("%s: train size fails\n", dir); g4_pool_free(pool); return 0; }
    arena = malloc(ab);
    grads = (float *)malloc(sizeof(float) * gf);
    if (g4_train_init(&t, m, &tc, arena, ab) != G4_OK || g4_loss_and_grad(&t, th_ids, NULL, TH_N, &loss, grads) != G4_OK) {
        printf("%s: train: %s\n", dir, t.error);
    } else {
        th_mix(&gr, &loss, sizeof(loss));
        th_mix(&gr, grads, sizeof(float) * gf);
        printf("%-24s grad f32  threads %d recompute %d: %4ld taps %016llx %4ld grad taps %016llx loss+grads %016llx (%.9g)\n",
               dir, threads, recompute, taps.n, (unsigned long long)taps.h, gtaps.n, (unsigned long long)gtaps.h,
               (unsigned long long)gr.h, (double)loss);
    }
    free(grads); free(arena);
    g4_pool_free(pool);
    return 0;
}

/* A drafter on its target: the target's prefill (taps, logits, hidden), then
   four drafting steps (the drafter's taps, logits, next hidden). */
static int th_draft(const char *ddir, const char *tdir, int bf16) {
    g4_model tm, dm;
    g4_session_config sc = g4_session_config_init();
    g4_session t, d;
    th_hash taps, out;
    size_t bytes;
    void *arena = NULL;
    float *logits = NULL, *hidden = NULL;
    int i, V, H;
    int32_t tok = th_ids[8];
    if (g4_model_load(&tm, tdir) != G4_OK) { printf("%s: %s\n", tdir, tm.error); return 1; }
    if (g4_model_load(&dm, ddir) != G4_OK) { printf("%s: %s\n", ddir, dm.error); g4_model_free(&tm); return 1; }
    th_init(&taps); th_init(&out);
    V = tm.config.vocab_size; H = tm.config.hidden_size;
    sc.max_context = 64; sc.max_chunk = 8; sc.bf16 = bf16; sc.tap = th_tap; sc.tap_user = &taps;
    logits = (float *)malloc(sizeof(float) * (size_t)V * 8);
    hidden = (float *)malloc(sizeof(float) * (size_t)H * 8);
    if (g4_session_create(&t, &tm, &sc) != G4_OK) { printf("%s: %s\n", tdir, t.error); goto done; }
    if (g4_forward_hidden(&t, th_ids, 8, logits, G4_LOGITS_LAST, hidden) != G4_OK) { printf("%s\n", t.error); goto done2; }
    th_mix(&out, logits, sizeof(float) * (size_t)V);
    th_mix(&out, hidden, sizeof(float) * (size_t)H);
    if (g4_drafter_size(&dm, &t, &bytes) != G4_OK || !(arena = malloc(bytes)) ||
        g4_drafter_init(&d, &dm, &t, arena, bytes) != G4_OK) { printf("%s: drafter init fails\n", ddir); goto done2; }
    for (i = 0; i < 4; i++) {
        if (g4_draft_step(&d, tok, hidden, logits, hidden) != G4_OK) { printf("%s: %s\n", ddir, d.error); goto done2; }
        th_mix(&out, logits, sizeof(float) * (size_t)V);
        th_mix(&out, hidden, sizeof(float) * (size_t)H);
        tok = g4_argmax(logits, V);
    }
    printf("%-24s draft %s on %s: %4ld taps %016llx logits+hidden %016llx last %d\n", ddir, bf16 ? "bf16" : "f32 ",
           tdir, taps.n, (unsigned long long)taps.h, (unsigned long long)out.h, (int)tok);
done2:
    g4_session_destroy(&t);
done:
    free(arena); free(logits); free(hidden);
    g4_model_free(&dm); g4_model_free(&tm);
    return 0;
}

static uint32_t th_lcg = 12345u;
static float th_rand(void) { th_lcg = th_lcg * 1664525u + 1013904223u; return (float)(th_lcg >> 8) / 16777216.0f; }

/* a tower's line: its taps' fingerprint and its n_soft soft tokens' (H wide) */
static void th_tower_line(const char *dir, const char *tower, int threads, const th_hash *taps, const float *soft, int n_soft,
                          int H) {
    th_hash out;
    th_init(&out);
    th_mix(&out, soft, sizeof(float) * (size_t)n_soft * H);
    printf("%-24s %-6s f32  threads %d: %4ld taps %016llx soft %016llx (%d tokens)\n", dir, tower, threads, taps->n,
           (unsigned long long)taps->h, (unsigned long long)out.h, n_soft);
}

static int th_vision(const char *dir, const g4_model *m, int threads) {
    const g4_vision_config *v = &m->config.vision;
    int k = v->pooling_kernel_size, gw = 4 * k, gh = 3 * k, real = gw * gh, n = real + 4 * k * k, P = 3 * v->patch_size * v->patch_size;
    int t, n_soft = 0;
    g4_vision_session_config vc;
    g4_vision_session vs;
    g4_pool *pool = NULL;
    th_hash taps;
    size_t bytes;
    void *arena = NULL;
    float *pv = (float *)malloc(sizeof(float) * (size_t)n * (size_t)P), *soft = (float *)malloc(sizeof(float) * (size_t)n * m->config.hidden_size);
    int32_t *pos = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)n);
    th_init(&taps);
    th_lcg = 12345u;
    for (t = 0; t < n * P; t++) pv[t] = t < real * P ? th_rand() : 0.0f;
    for (t = 0; t < n; t++) { pos[2 * t] = t < real ? t % gw : -1; pos[2 * t + 1] = t < real ? t / gw : -1; }
    if (threads > 1 && g4_pool_create(&pool, threads) != G4_OK) { printf("%s: no pool\n", dir); goto done; }
    memset(&vc, 0, sizeof vc);
    vc.max_patches = n; vc.pool = pool; vc.tap = th_tap; vc.tap_user = &taps;
    if (g4_vision_session_size(m, &vc, &bytes) != G4_OK || !(arena = malloc(bytes)) ||
        g4_vision_session_init(&vs, m, &vc, arena, bytes) != G4_OK || g4_vision_encode(&vs, pv, pos, n, soft, &n_soft) != G4_OK) {
        printf("%s: vision: %s\n", dir, vs.error);
        goto done;
    }
    th_tower_line(dir, "vision", threads, &taps, soft, n_soft, m->config.hidden_size);
done:
    free(arena); free(pv); free(soft); free(pos);
    g4_pool_free(pool);
    return 0;
}

static int th_audio(const char *dir, const g4_model *m, int threads) {
    int nf = 37, C0 = m->config.audio.subsampling_conv_channels[0], t, n_soft = 0;
    g4_audio_run run;
    g4_pool *pool = NULL;
    th_hash taps;
    size_t bytes = 0;
    void *arena = NULL;
    float *feat = (float *)malloc(sizeof(float) * (size_t)nf * (size_t)C0);
    float *soft = (float *)malloc(sizeof(float) * (size_t)g4_audio_tokens_max(nf) * m->config.hidden_size);
    unsigned char mask[37];
    th_init(&taps);
    th_lcg = 777u;
    for (t = 0; t < nf * C0; t++) feat[t] = 4.0f * th_rand() - 3.0f;
    for (t = 0; t < nf; t++) mask[t] = t < nf - 5;
    if (threads > 1 && g4_pool_create(&pool, threads) != G4_OK) { printf("%s: no pool\n", dir); goto done; }
    memset(&run, 0, sizeof run);
    run.pool = pool; run.tap = th_tap; run.tap_user = &taps;
    if (g4_audio_size_pool(m, nf, pool, &bytes) != G4_OK || !(arena = malloc(bytes)) ||
        g4_audio_encode(m, feat, mask, nf, arena, bytes, &run, soft, &n_soft) != G4_OK) {
        printf("%s: audio: %s\n", dir, run.error);
        goto done;
    }
    th_tower_line(dir, "audio", threads, &taps, soft, n_soft, m->config.hidden_size);
done:
    free(arena); free(feat); free(soft);
    g4_pool_free(pool);
    return 0;
}

int main(int argc, char **argv) {
    static const int chunks[] = {1, 3, TH_N};
    int a, bf16, threads, c, rc = 0;
    if (argc < 2) { fprintf(stderr, "usage: tap_hashes MODEL_DIR...\n"); return 2; }
    printf("kernels: %s\n", g4_simd_name());
    for (a = 1; a < argc; a++) {
        g4_model m;
        char *eq = strchr(argv[a], '=');
        if (eq) { /* DRAFTER=TARGET */
            *eq = 0;
            for (bf16 = 0; bf16 < 2; bf16++) rc |= th_draft(argv[a], eq + 1, bf16);
            continue;
        }
        if (g4_model_load(&m, argv[a]) != G4_OK) { printf("%-24s load: %s\n", argv[a], m.error); continue; }
        for (bf16 = 0; bf16 < (g4_bf16_fast_available() ? 3 : 2); bf16++) /* 2: bf16_fast */
            for (threads = 1; threads <= 2; threads++)
                for (c = 0; c < 3; c++) rc |= th_forward(argv[a], &m, bf16, threads, chunks[c]);
        for (threads = 1; threads <= 2; threads++)
            for (c = 0; c < 2; c++) rc |= th_train(argv[a], &m, threads, c);
        for (threads = 1; threads <= 2; threads++) {
            if (m.vision.loaded) rc |= th_vision(argv[a], &m, threads);
            if (m.audio.loaded) rc |= th_audio(argv[a], &m, threads);
        }
        g4_model_free(&m);
    }
    return rc;
}
