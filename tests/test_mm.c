/* Images and audio together through the command line (examples/mm.h,
   examples/gemma4.c): repeatable --image / --audio filling the placeholder
   runs in prompt order, chat messages with image and audio content items
   through the released Gemma 4 template, and the processor's expansion,
   against transformers 5.23.0 (tools/make_mm_goldens.py, data/mm: a tiny
   E2B-style model with both towers, data/mm/VERSIONS.txt) and against the
   library's own g4_forward_mm on the same files.

       build/test_mm [DATA_DIR [CLI]]     (defaults: data build/gemma4)

   Tolerances: logits within 1e-4 x max|logit| of transformers (the issue's
   bar; torch sums the towers' convolutions, matmuls and norms in other
   orders: measured 3.6e-6 and 5.1e-6 here); ids and greedy tokens equal; the
   CLI against g4_forward_mm on the same inputs: the same bits (the same
   kernels on the same rows). Bad files are one stderr line and exit 1, and
   the _san build (build/gemma4_san) reports nothing. */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include "../gemma4_processing.h"
#define H_CLI_OUTPUT /* g_out, g_err, h_run */
#include "harness.h"
#include "fixtures.h"
#define G4_IMAGE_NO_CLI /* (the decoders, not the command) */
#include "../examples/image.h"
#include <unistd.h>
#include <sys/stat.h>

static const char *g_cli = "build/gemma4";
#define V 520 /* the tiny vocabulary */

/* `CLI args` (a shell line after the CLI's path): the status; stdout in g_out, stderr in g_err */
#define cli(...) h_run(g_cli, __VA_ARGS__)

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (; (s = strstr(s, needle)) != NULL; s += strlen(needle)) n++;
    return n;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* data/mm/X, data/vision/images/X, data/tiny/e2b_audio/X (rotating buffers: path2's) */
static const char *mm(const char *x) { return path2(g_data, path2("mm", x)); }
static const char *img(const char *x) { return path2(g_data, path2("vision/images", x)); }
static const char *wav(const char *x) { return path2(g_data, path2("tiny/e2b_audio", x)); }
static char g_model[512]; /* data/mm/e2b_av */

static int open_golden(golden *g) {
    memset(g, 0, sizeof *g);
    if (g4__add_file(&g->m, path2(g_data, "mm"), "golden.safetensors") != G4_OK || g4__st_finish(&g->m) != G4_OK) {
        printf("  cannot read %s: %s\n", mm("golden.safetensors"), g->m.error);
        g4_model_free(&g->m);
        return 0;
    }
    return g->ok = 1;
}

/* "2,5,..." of ids */
static void ids_arg(char *buf, size_t cap, const int32_t *ids, int n) {
    size_t k = 0;
    int i;
    buf[0] = 0;
    for (i = 0; i < n && k + 16 < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%d" : "%d", (int)ids[i]);
}

/* "2 5 ..." of ids, then more */
static void ids_line(char *buf, size_t cap, const int32_t *ids, int n, const int32_t *more, int n_more) {
    size_t k = 0;
    int i;
    buf[0] = 0;
    for (i = 0; i < n + n_more && k + 16 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, i ? " %d" : "%d", (int)(i < n ? ids[i] : more[i - n]));
}

/* a whole file (malloc'd, NUL-terminated) or NULL */
static char *slurp(const char *path, size_t *len) {
    char *text, err[G4_ERROR_MAX];
    if (g4__read_file(path, &text, len, 1 << 26, err) != G4_OK) return NULL;
    return text;
}

/* ------------------------------------------- the library on the same files */

/* One image file's soft tokens through the library (decoder, processor, tower). */
static int lib_image(const g4_model *m, const char *path, float *soft, int *n_soft) {
    g4_image_config ic;
    g4_vision_session vs;
    g4_vision_session_config vc;
    uint8_t *px = NULL;
    float *pv = NULL;
    int32_t *pos = NULL;
    void *scratch = NULL, *arena = NULL;
    size_t bytes, ab;
    int h, w, ch, n = 0, ok = 0, mp;
    if (g4img_read(path, &px, &h, &w, &ch)) return 0;
    if (g4_image_config_load(&ic, g_model) == G4_OK && g4_image_config_check(&ic, &m->config) == G4_OK) {
        mp = ic.max_soft_tokens * ic.pooling_kernel_size * ic.pooling_kernel_size;
        bytes = g4_image_scratch_size(&ic, h, w);
        pv = (float *)malloc(sizeof(float) * (size_t)mp * 3 * ic.patch_size * ic.patch_size);
        pos = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)mp);
        scratch = malloc(bytes);
        memset(&vc, 0, sizeof vc);
        vc.max_patches = mp;
        ok = pv && pos && scratch && g4_image_preprocess(&ic, px, h, w, ch, scratch, bytes, pv, pos, &n) == G4_OK &&
             g4_vision_session_size(m, &vc, &ab) == G4_OK && (arena = malloc(ab)) != NULL &&
             g4_vision_session_init(&vs, m, &vc, arena, ab) == G4_OK &&
             g4_vision_encode(&vs, pv, pos, mp, soft, n_soft) == G4_OK && *n_soft == n;
    }
    free(px); free(pv); free(pos); free(scratch); free(arena);
    return ok;
}

/* One WAV's soft tokens through the library (reader, feature extractor, tower). */
static int lib_audio(const g4_model *m, const char *path, float *soft, int *n_soft) {
    char *bytes, err[G4_ERROR_MAX];
    size_t len, n = 0, ab;
    int rate = 0, nf = 0, ok = 0;
    float *pcm = NULL, *feat = NULL, *scratch = NULL;
    unsigned char *mask = NULL;
    void *arena = NULL;
    g4_audio_fe fe;
    if (!(bytes = slurp(path, &len))) return 0;
    if (g4_wav_parse((const unsigned char *)bytes, len, NULL, 0, &n, &rate, err) == G4_OK && g4_audio_fe_init(&fe) == G4_OK) {
        nf = g4_audio_fe_frames(&fe, (int)n);
        pcm = (float *)malloc(sizeof(float) * n);
        feat = (float *)malloc(sizeof(float) * (size_t)nf * (size_t)fe.feature_size);
        mask = (unsigned char *)malloc((size_t)nf);
        scratch = (float *)malloc(sizeof(float) * g4_audio_fe_scratch(&fe));
        ok = pcm && feat && mask && scratch && g4_wav_parse((const unsigned char *)bytes, len, pcm, n, &n, &rate, err) == G4_OK &&
             g4_audio_features(&fe, pcm, (int)n, rate, feat, mask, &nf, scratch) == G4_OK &&
             g4_audio_size(m, nf, &ab) == G4_OK && posix_memalign(&arena, 64, ab) == 0 &&
             g4_audio_encode(m, feat, mask, nf, arena, ab, NULL, soft, n_soft) == G4_OK;
        g4_audio_fe_free(&fe);
    }
    free(bytes); free(pcm); free(feat); free(mask); free(scratch); free(arena);
    return ok;
}

/* The golden prompt (audio b, image a, image c) through the library:
   logits [n][V] of the processor's ids, g4_forward_mm in steps of `chunk`. */
static float *lib_prompt_logits(const int32_t *ids, int n, int chunk) {
    g4_model m;
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    float *soft, *logits = NULL;
    int used = 0, got = 0, H, ok;
    if (g4_model_load(&m, g_model) != G4_OK) { printf("  %s\n", m.error); return NULL; }
    H = m.config.hidden_size;
    soft = (float *)malloc(sizeof(float) * 400 * (size_t)H);
    ok = soft && lib_audio(&m, wav("clip_b.wav"), soft, &got);
    used += got;
    ok = ok && lib_image(&m, img("a.png"), soft + (size_t)used * H, &got);
    used += got;
    ok = ok && lib_image(&m, img("c.png"), soft + (size_t)used * H, &got);
    used += got;
    sc.max_context = n;
    sc.max_chunk = chunk;
    if (ok && g4_session_create(&s, &m, &sc) == G4_OK) {
        logits = (float *)malloc(sizeof(float) * (size_t)n * V);
        if (logits && g4_forward_mm(&s, ids, n, soft, used, logits, G4_LOGITS_ALL, NULL) != G4_OK) {
            printf("  g4_forward_mm: %s\n", s.error);
            free(logits);
            logits = NULL;
        }
        g4_session_destroy(&s);
    }
    free(soft);
    g4_model_free(&m);
    return logits;
}

/* ------------------------------------------------------------ the tests */

/* logits --audio b --image a --image c on "Hear <|audio|> see <|image|> and <|image|> then" */
static void test_logits_interleaved(void) {
    golden g;
    const int32_t *tids, *pids, *rows;
    const float *ref;
    int nt, np, nr, i;
    int64_t nl;
    char ids[2048], path[300];
    float *got, *lib;
    size_t len = 0;
    if (!open_golden(&g)) { CHECK(0, "golden"); return; }
    tids = golden_ids(&g, "prompt.text_ids", &nt);
    pids = golden_ids(&g, "prompt.ids", &np);
    rows = golden_ids(&g, "prompt.rows", &nr);
    ref = golden_f32(&g, "prompt.logits", &nl);
    if (!tids || !pids || !rows || !ref) { CHECK(0, "golden tensors"); g4_model_free(&g.m); return; }
    ids_arg(ids, sizeof ids, tids, nt);
    snprintf(path, sizeof path, "%s/prompt.f32", g_tmp);
    CHECK(cli("logits %s --ids %s --audio %s --image %s --image %s --out %s --threads 1", g_model, ids, wav("clip_b.wav"),
              img("a.png"), img("c.png"), path) == 0, "exit: %s", g_err);
    got = (float *)slurp(path, &len);
    CHECK(got && len == (size_t)np * V * sizeof(float), "%s: %zu bytes, want %d x %d floats", path, len, np, V);
    if (got && len == (size_t)np * V * sizeof(float)) {
        double worst = 0, sc = max_abs(ref, (size_t)nl);
        for (i = 0; i < nr; i++) {
            double d = max_diff(got + (size_t)rows[i] * V, ref + (size_t)i * V, V);
            if (d > worst) worst = d;
        }
        printf("  %d ids (%d before expansion): within %.3g x max|logit| of transformers\n", np, nt, worst / sc);
        CHECK(worst <= 1e-4 * sc, "the logits differ from transformers' by %g (max|logit| %g)", worst, sc);
        /* the library on the same files and the processor's ids, in the CLI's steps (a whole image run: 65 rows) */
        lib = lib_prompt_logits(pids, np, 65);
        CHECK(lib && memcmp(lib, got, (size_t)np * V * sizeof(float)) == 0, "the CLI's logits are not g4_forward_mm's bits");
        free(lib);
    }
    free(got);
    /* greedy shows the expanded ids: the processor's */
    CHECK(cli("greedy %s --ids %s --image %s --audio %s --image %s --new 1 --threads 2", g_model, ids, img("a.png"),
              wav("clip_b.wav"), img("c.png")) == 0, "greedy: %s", g_err);
    {
        char want[4096];
        int32_t last = g4_argmax(ref + (size_t)(nr - 1) * V, V);
        ids_line(want, sizeof want, pids, np, &last, rows[nr - 1] == np - 1 ? 1 : 0);
        CHECK(strncmp(g_out, want, strlen(want)) == 0 && g_out[strlen(want)] == '\n',
              "greedy's ids and first token are not the processor's ids and transformers' argmax:\n  got  %.200s\n  want %.200s",
              g_out, want);
    }
    g4_model_free(&g.m);
}

/* A video (two frames: a.png and its mirror image) and a clip in a chat, against
   Gemma4Processor.apply_chat_template(tokenize=True) with a video content item
   (video_golden.safetensors, tools/make_mm_goldens.py --video-only): template
   --ids --video gives its 191 ids; logits --ids on the template's text ids (one
   <|video|> id, expanded by the CLI with the frames' stamps) its ids and
   transformers' logits within 1e-4 x max|logit| (the logits bound above);
   greedy's ids and first token; generate --chat --video transformers' greedy
   answer. */
static void test_video_chat(void) {
    golden g;
    const int32_t *tids, *pids, *rows, *greedy;
    const float *ref;
    int nt, np, nr, ng, i;
    int64_t nl = 0;
    char ids[4096], want[8192], out[300], frames[1024], *got;
    size_t len = 0;
    memset(&g, 0, sizeof g);
    if (g4__add_file(&g.m, path2(g_data, "mm"), "video_golden.safetensors") != G4_OK || g4__st_finish(&g.m) != G4_OK) {
        CHECK(0, "%s: %s", mm("video_golden.safetensors"), g.m.error);
        g4_model_free(&g.m);
        return;
    }
    g.ok = 1;
    tids = golden_ids(&g, "video.text_ids", &nt);
    pids = golden_ids(&g, "video.ids", &np);
    rows = golden_ids(&g, "video.rows", &nr);
    greedy = golden_ids(&g, "video.greedy", &ng);
    ref = golden_f32(&g, "video.logits", &nl);
    CHECK(tids && pids && rows && greedy && ref && nl == (int64_t)nr * V && np == 191, "golden tensors");
    if (!tids || !pids || !rows || !greedy || !ref || nl != (int64_t)nr * V) { g4_model_free(&g.m); return; }
    snprintf(frames, sizeof frames, "%s,%s", img("a.png"), path2(g_data, "tiny/unified_like/processor/a_mirror.png"));
    ids_line(want, sizeof want, pids, np, NULL, 0);
    CHECK(cli("template %s --messages %s --ids --video %s --audio %s", g_model, mm("video_chat.json"), frames,
              wav("clip_b.wav")) == 0 && strncmp(g_out, want, strlen(want)) == 0 && g_out[strlen(want)] == '\n',
          "template --ids --video is not apply_chat_template(tokenize=True) with the video:\n  got  %.300s\n  want %.300s%s",
          g_out, want, g_err);
    ids_arg(ids, sizeof ids, tids, nt);
    snprintf(out, sizeof out, "%s/video.f32", g_tmp);
    CHECK(cli("logits %s --ids %s --video %s --audio %s --out %s", g_model, ids, frames, wav("clip_b.wav"), out) == 0,
          "logits --video: %s", g_err);
    got = slurp(out, &len);
    CHECK(got && len == (size_t)np * V * sizeof(float), "%zu bytes of logits, want %d rows", len, np);
    if (got && len == (size_t)np * V * sizeof(float)) {
        double worst = 0, sc = max_abs(ref, (size_t)nl);
        for (i = 0; i < nr; i++) {
            double d = max_diff((const float *)(void *)got + (size_t)rows[i] * V, ref + (size_t)i * V, V);
            if (d > worst) worst = d;
        }
        printf("  %d text ids (one <|video|>) -> %d ids: logits within %.3g x max|logit| of transformers\n", nt, np, worst / sc);
        CHECK(worst <= 1e-4 * sc, "logits --video: %g from transformers (max|logit| %g)", worst, sc);
    }
    free(got);
    ids_line(want, sizeof want, pids, np, greedy, 1);
    CHECK(cli("greedy %s --ids %s --video %s --audio %s --new 1", g_model, ids, frames, wav("clip_b.wav")) == 0 &&
          strncmp(g_out, want, strlen(want)) == 0 && g_out[strlen(want)] == '\n',
          "greedy --video: the processor's ids and transformers' first token:\n  got  %.200s\n  want %.200s", g_out, want);
    { /* generate --chat: the same conversation from a prompt with the placeholders where the items render */
        g4_tokenizer tok;
        char text[256];
        size_t tl = 0;
        CHECK(g4_tokenizer_load(&tok, g_model) == G4_OK &&
              g4_detokenize(&tok, greedy, (size_t)ng, G4_DECODE_SKIP_SPECIAL, text, sizeof text, &tl) == G4_OK, "decode");
        CHECK(cli("generate %s --chat --system \"Be brief.\" --prompt \"Watch<|video|>and hear<|audio|>\" --video %s --audio %s "
                  "--temp 0 --max-tokens %d", g_model, frames, wav("clip_b.wav"), ng) == 0 &&
              strncmp(g_out, text, tl) == 0 && strstr(g_err, "prompt 191 tokens"),
              "generate --chat --video: '%s' (%s), want transformers' '%s'", g_out, g_err, text);
        { /* chat: the same turn with --video/--audio on its command line, and with /video and /audio lines */
            char input[300];
            FILE *f;
            snprintf(input, sizeof input, "%s/video_turn.txt", g_tmp);
            if ((f = fopen(input, "w"))) { fputs("Watch<|video|>and hear<|audio|>\n", f); fclose(f); }
            CHECK(cli("chat %s --system \"Be brief.\" --video %s --audio %s --temp 0 --max-tokens %d < %s", g_model, frames,
                      wav("clip_b.wav"), ng, input) == 0 && strncmp(g_out, text, tl) == 0 && strstr(g_err, "prompt 191 tokens"),
                  "chat --video: '%s' (%s), want transformers' '%s'", g_out, g_err, text);
            if ((f = fopen(input, "w"))) {
                fprintf(f, "/video %s\n/audio %s\nWatch<|video|>and hear<|audio|>\n", frames, wav("clip_b.wav"));
                fclose(f);
            }
            CHECK(cli("chat %s --system \"Be brief.\" --temp 0 --max-tokens %d < %s", g_model, ng, input) == 0 &&
                      strncmp(g_out, text, tl) == 0 && strstr(g_err, "prompt 191 tokens"),
                  "chat /video /audio: '%s' (%s), want transformers' '%s'", g_out, g_err, text);
        }
        g4_tokenizer_free(&tok);
    }
    g4_model_free(&g.m);
}

/* The order of the flags across kinds does not matter (placeholders pick by kind); within a kind it does. */
static void test_flag_order(void) {
    golden g;
    const int32_t *tids;
    int nt;
    char ids[2048], p1[300], p2[300], p3[300];
    char *a, *b, *c;
    size_t la = 0, lb = 0, lc = 0;
    if (!open_golden(&g)) { CHECK(0, "golden"); return; }
    tids = golden_ids(&g, "prompt.text_ids", &nt);
    if (!tids) { CHECK(0, "prompt.text_ids"); g4_model_free(&g.m); return; }
    ids_arg(ids, sizeof ids, tids, nt);
    snprintf(p1, sizeof p1, "%s/o1.f32", g_tmp);
    snprintf(p2, sizeof p2, "%s/o2.f32", g_tmp);
    snprintf(p3, sizeof p3, "%s/o3.f32", g_tmp);
    CHECK(cli("logits %s --ids %s --image %s --image %s --audio %s --out %s", g_model, ids, img("a.png"), img("c.png"),
              wav("clip_b.wav"), p1) == 0, "%s", g_err);
    CHECK(cli("logits %s --ids %s --image %s --audio %s --image %s --out %s", g_model, ids, img("a.png"), wav("clip_b.wav"),
              img("c.png"), p2) == 0, "%s", g_err);
    CHECK(cli("logits %s --ids %s --image %s --image %s --audio %s --out %s", g_model, ids, img("c.png"), img("a.png"),
              wav("clip_b.wav"), p3) == 0, "%s", g_err);
    a = slurp(p1, &la);
    b = slurp(p2, &lb);
    c = slurp(p3, &lc);
    CHECK(a && b && la == lb && memcmp(a, b, la) == 0, "--image a --image c --audio b and --image a --audio b --image c differ");
    CHECK(a && c && la == lc && memcmp(a, c, la) != 0, "the images swapped give the same logits"); /* runs of 60 and 63 */
    free(a); free(b); free(c);
    g4_model_free(&g.m);
}

/* template: image and audio items through the released Gemma 4 template, and the processor's ids */
static void test_template(void) {
    golden g;
    const int32_t *tids, *cids;
    int nt, nc;
    char want[8192];
    char *txt;
    size_t len = 0;
    if (!open_golden(&g)) { CHECK(0, "golden"); return; }
    tids = golden_ids(&g, "chat.text_ids", &nt);
    cids = golden_ids(&g, "chat.ids", &nc);
    txt = slurp(mm("chat.txt"), &len);
    if (!tids || !cids || !txt) { CHECK(0, "golden"); free(txt); g4_model_free(&g.m); return; }
    CHECK(cli("template %s --messages %s", g_model, mm("chat.json")) == 0 && strcmp(g_out, txt) == 0,
          "the rendered chat differs from transformers':\n%s\nwant\n%s", g_out, txt);
    ids_line(want, sizeof want, tids, nt, NULL, 0);
    CHECK(cli("template %s --messages %s --ids", g_model, mm("chat.json")) == 0 && strncmp(g_out, want, strlen(want)) == 0 &&
          g_out[strlen(want)] == '\n', "template --ids: %.200s", g_out);
    ids_line(want, sizeof want, cids, nc, NULL, 0);
    CHECK(cli("template %s --messages %s --ids --image %s --audio %s --audio %s", g_model, mm("chat.json"), img("a.png"),
              wav("clip_a.wav"), wav("clip_b.wav")) == 0 && strncmp(g_out, want, strlen(want)) == 0 &&
          g_out[strlen(want)] == '\n', "template --ids with the files is not apply_chat_template(tokenize=True): %.300s%s",
          g_out, g_err);
    CHECK(cli("template %s --messages %s --image %s", g_model, mm("chat.json"), img("a.png")) == 1 &&
          strstr(g_err, "need --ids"), "files without --ids: %s", g_err);
    CHECK(cli("template %s --messages %s --ids --image %s", g_model, mm("chat.json"), img("a.png")) == 1 &&
          strstr(g_err, "0 audio placeholders") == NULL && strstr(g_err, "2 audio placeholders") &&
          strstr(g_err, "0 --audio files"), "the chat's clips without --audio: %s", g_err);
    free(txt);
    g4_model_free(&g.m);
}

/* greedy, generate --chat and chat with an image and two clips: transformers' greedy answer */
static void test_answer(void) {
    golden g;
    const int32_t *tids, *cids, *gr;
    int nt, nc, ng;
    char ids[2048], want[8192], files[1200], text[256];
    char *answer;
    size_t len = 0;
    if (!open_golden(&g)) { CHECK(0, "golden"); return; }
    tids = golden_ids(&g, "chat.text_ids", &nt);
    cids = golden_ids(&g, "chat.ids", &nc);
    gr = golden_ids(&g, "chat.greedy", &ng);
    answer = slurp(mm("chat_greedy.txt"), &len);
    if (!tids || !cids || !gr || !answer) { CHECK(0, "golden"); free(answer); g4_model_free(&g.m); return; }
    snprintf(files, sizeof files, "--image %s --audio %s --audio %s", img("a.png"), wav("clip_a.wav"), wav("clip_b.wav"));
    ids_arg(ids, sizeof ids, tids, nt);
    ids_line(want, sizeof want, cids, nc, gr, ng);
    CHECK(cli("greedy %s --ids %s %s --new %d", g_model, ids, files, ng) == 0 && strncmp(g_out, want, strlen(want)) == 0,
          "greedy: not the processor's ids and transformers' %d tokens:\n  got  %.300s\n  want %.300s", ng, g_out, want);
    snprintf(text, sizeof text, "%s\n", answer);
    CHECK(cli("generate %s --chat --system 'Be brief.' --prompt '<|image|>Listen:<|audio|>what now?<|audio|>' %s --temp 0 "
              "--max-tokens %d", g_model, files, ng) == 0 && strcmp(g_out, text) == 0 &&
          strstr(g_err, "prompt 145 tokens, generated 4 tokens"),
          "generate --chat: '%s' (want '%s'): %s", g_out, answer, g_err);
    /* chat: the files on the command line go with the first turn */
    CHECK(cli("chat %s --system 'Be brief.' %s --temp 0 --max-tokens %d < %s", g_model, files, ng, "/dev/null") == 0,
          "chat without a turn: %s", g_err);
    {
        char input[300];
        FILE *f;
        snprintf(input, sizeof input, "%s/turn.txt", g_tmp);
        if ((f = fopen(input, "w"))) { fputs("<|image|>Listen:<|audio|>what now?<|audio|>\n", f); fclose(f); }
        CHECK(cli("chat %s --system 'Be brief.' %s --temp 0 --max-tokens %d < %s", g_model, files, ng, input) == 0 &&
              strcmp(g_out, text) == 0, "chat --image --audio: '%s' (want '%s'): %s", g_out, answer, g_err);
        /* the same files attached by /image and /audio lines */
        if ((f = fopen(input, "w"))) {
            fprintf(f, "/image %s\n/audio %s\n/audio %s\n<|image|>Listen:<|audio|>what now?<|audio|>\n", img("a.png"),
                    wav("clip_a.wav"), wav("clip_b.wav"));
            fclose(f);
        }
        CHECK(cli("chat %s --system 'Be brief.' --temp 0 --max-tokens %d < %s", g_model, ng, input) == 0 &&
              strcmp(g_out, text) == 0, "chat /image /audio: '%s' (want '%s'): %s", g_out, answer, g_err);
    }
    free(answer);
    g4_model_free(&g.m);
}

/* A prompt without placeholders gets one per file before its text (as content items under the template). */
static void test_auto_placeholders(void) {
    char a[4096], ea[512], files[800];
    snprintf(files, sizeof files, "--audio %s --image %s", wav("clip_b.wav"), img("a.png"));
    CHECK(cli("generate %s --chat --prompt 'what now?' %s --temp 0 --max-tokens 3", g_model, files) == 0, "%s", g_err);
    snprintf(a, sizeof a, "%.4000s", g_out);
    snprintf(ea, sizeof ea, "%.500s", strstr(g_err, "prompt ") ? strstr(g_err, "prompt ") : g_err);
    if (strchr(ea, ';')) *strchr(ea, ';') = 0;
    CHECK(cli("generate %s --chat --prompt '<|audio|><|image|>what now?' %s --temp 0 --max-tokens 3", g_model, files) == 0 &&
          strcmp(a, g_out) == 0 && strstr(g_err, ea), "chat items (%s: '%s') differ from explicit placeholders ('%s': %s)", ea,
          a, g_out, g_err);
    CHECK(cli("generate %s --prompt 'what now?' %s --temp 0 --max-tokens 3", g_model, files) == 0, "%s", g_err);
    snprintf(a, sizeof a, "%.4000s", g_out);
    snprintf(ea, sizeof ea, "%.500s", strstr(g_err, "prompt ") ? strstr(g_err, "prompt ") : g_err);
    if (strchr(ea, ';')) *strchr(ea, ';') = 0;
    CHECK(cli("generate %s --prompt '<|audio|><|image|>what now?' %s --temp 0 --max-tokens 3", g_model, files) == 0 &&
          strcmp(a, g_out) == 0 && strstr(g_err, ea), "no chat: prefixed (%s) differs from explicit placeholders (%s)", ea, g_err);
}

/* one stderr line naming `want`, exit 1 */
static void refused(const char *want, int st, const char *what) {
    CHECK(st == 1 && count_lines(g_err) == 1 && strstr(g_err, want), "%s: exit %d, want one line with '%s': %s", what, st,
          want, g_err);
}

static void test_mismatch(void) {
    char out[300];
    snprintf(out, sizeof out, "%s/x.f32", g_tmp);
    refused("the prompt has 2 image placeholders (id 513) but 1 --image file was given",
            cli("logits %s --ids 2,513,310,513 --image %s --out %s", g_model, img("a.png"), out), "logits");
    refused("the prompt has 1 image placeholder (id 513) but 2 --image files were given",
            cli("greedy %s --ids 2,513,310 --image %s --image %s --new 1", g_model, img("a.png"), img("c.png")), "greedy");
    refused("the prompt has 0 audio placeholders (id 516) but 1 --audio file was given",
            cli("logits %s --ids 2,513,310 --image %s --audio %s --out %s", g_model, img("a.png"), wav("clip_b.wav"), out),
            "logits, audio");
    refused("the prompt has 2 image placeholders (id 513) but 1 --image file was given",
            cli("generate %s --prompt '<|image|> and <|image|>' --image %s --max-tokens 1", g_model, img("a.png")), "generate");
    refused("--processor needs --image", cli("logits %s --ids 2 --processor %s --out %s", g_model, g_model, out), "processor");
    refused("do not go with --drafter",
            cli("greedy %s --ids 2,513 --image %s --drafter %s --new 1", g_model, img("a.png"), g_model), "drafter");
    refused("do not go with --drafter",
            cli("generate %s --prompt x --audio %s --drafter %s", g_model, wav("clip_b.wav"), g_model), "generate drafter");
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(p, 1, n, f); fclose(f); }
}

static void put16(unsigned char *p, unsigned v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static void put32(unsigned char *p, unsigned long v) { put16(p, (unsigned)(v & 0xffff)); put16(p + 2, (unsigned)(v >> 16)); }

/* truncated PNG, a text file as an image, a non-16 kHz WAV, a stereo WAV, a WAV cut short, a model without the tower */
static void test_bad_files(void) {
    char out[300], tpng[300], txt[300], w8[300], wst[300], wcut[300];
    char *png, *w;
    size_t len = 0, wl = 0;
    unsigned char h[44 + 800];
    snprintf(out, sizeof out, "%s/x.f32", g_tmp);
    snprintf(tpng, sizeof tpng, "%s/trunc.png", g_tmp);
    snprintf(txt, sizeof txt, "%s/text.png", g_tmp);
    snprintf(w8, sizeof w8, "%s/8k.wav", g_tmp);
    snprintf(wst, sizeof wst, "%s/stereo.wav", g_tmp);
    snprintf(wcut, sizeof wcut, "%s/cut.wav", g_tmp);
    png = slurp(img("a.png"), &len);
    if (png) write_bytes(tpng, png, len / 2);
    free(png);
    write_bytes(txt, "not an image at all\n", 20);
    memset(h, 0, sizeof h);
    memcpy(h, "RIFF", 4); put32(h + 4, 36 + 800); memcpy(h + 8, "WAVEfmt ", 8); put32(h + 16, 16);
    put16(h + 20, 1); put16(h + 22, 1); put32(h + 24, 8000); put32(h + 28, 16000); put16(h + 32, 2); put16(h + 34, 16);
    memcpy(h + 36, "data", 4); put32(h + 40, 800);
    write_bytes(w8, h, sizeof h);
    put16(h + 22, 2); put32(h + 24, 16000); put32(h + 28, 64000); put16(h + 32, 4);
    write_bytes(wst, h, sizeof h);
    w = slurp(wav("clip_a.wav"), &wl);
    if (w) write_bytes(wcut, w, 30);
    free(w);
    refused("trunc.png", cli("logits %s --ids 2,513 --image %s --out %s", g_model, tpng, out), "truncated PNG");
    refused("neither PNG nor JPEG", cli("logits %s --ids 2,513 --image %s --out %s", g_model, txt, out), "text file");
    refused("8000", cli("logits %s --ids 2,516 --audio %s --out %s", g_model, w8, out), "8 kHz WAV");
    refused("stereo.wav", cli("greedy %s --ids 2,516 --audio %s --new 1", g_model, wst), "stereo WAV");
    { /* --processor with the feature extractor's settings: a bad one, one that contradicts the tower, a cap */
        char pdir[300], pcfg[340];
        static const struct { const char *json, *want; } bad[] = {
            {"{\"feature_extractor\": {\"dither\": 0.5}}", "feature_extractor.dither' is 0.5"},
            {"{\"feature_extractor\": {\"feature_size\": 64}}", "feature_size 64 contradicts"},
            {"{\"audio_seq_length\": 3}", "caps its placeholders at 3"},
        };
        size_t i;
        snprintf(pdir, sizeof pdir, "%s/proc", g_tmp);
        snprintf(pcfg, sizeof pcfg, "%s/processor_config.json", pdir);
        mkdir(pdir, 0755);
        for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            write_bytes(pcfg, bad[i].json, strlen(bad[i].json));
            refused(bad[i].want, cli("logits %s --ids 2,516 --audio %s --processor %s --out %s", g_model, wav("clip_a.wav"),
                                     pdir, out), bad[i].json);
        }
        remove(pcfg);
        rmdir(pdir);
    }
    refused("cut.wav", cli("generate %s --prompt x --audio %s", g_model, wcut), "WAV cut short");
    refused("missing.wav", cli("logits %s --ids 2,516 --audio %s/missing.wav --out %s", g_model, g_tmp, out), "missing");
    refused("no audio tower", cli("logits %s/vision/e2b_mm --ids 2,516 --audio %s --out %s", g_data, wav("clip_b.wav"), out),
            "model without audio");
    refused("no vision tower", cli("logits %s --ids 2,240 --image %s --out %s", tiny("e2b_audio"), img("a.png"), out),
            "model without vision");
    refused("trunc.png", cli("template %s --messages %s --ids --image %s --audio %s --audio %s", g_model, mm("chat.json"),
                             tpng, wav("clip_a.wav"), wav("clip_b.wav")), "template");
    { /* chat: a bad file on the command line ends it (exit 1); one attached by a line drops that turn only */
        char input[300];
        FILE *f;
        int st;
        snprintf(input, sizeof input, "%s/turns.txt", g_tmp);
        if ((f = fopen(input, "w"))) { fputs("hello\n", f); fclose(f); }
        st = cli("chat %s --image %s --temp 0 --max-tokens 2 < %s", g_model, tpng, input);
        CHECK(st == 1 && strstr(g_err, "trunc.png: not a readable PNG") && g_out[0] == 0, "chat --image trunc.png: exit %d: %s",
              st, g_err);
        if ((f = fopen(input, "w"))) {
            fprintf(f, "/image %s\nfirst\n/audio %s\n<|image|> x\n/image %s\n<|image|> <|image|> y\nhello\n", tpng,
                    wav("clip_b.wav"), img("a.png"));
            fclose(f);
        }
        st = cli("chat %s --temp 0 --max-tokens 2 < %s", g_model, input);
        /* the messages name what was typed: /image, not --image */
        CHECK(st == 0 && strstr(g_err, "trunc.png: not a readable PNG") && strstr(g_err, "0 /image files were given") &&
              strstr(g_err, "2 image placeholders (id 513) but 1 /image file was given") && !strstr(g_err, "--image") &&
              count_of(g_err, "the turn was not sent") == 3 && count_lines(g_out) == 1 && count_of(g_err, "generated 2 tokens") == 1,
              "chat with bad attachments: exit %d, stdout '%s', stderr: %s", st, g_out, g_err);
    }
}

/* info describes both towers, the processor's settings and the feature extractor; "none" and why without them */
static void test_info(void) {
    static const char *want[] = {
        "vision tower: 2 layers, hidden 16, 2 heads of 8 (2 KV), mlp 32, patch 4, pooling 2, position table 48, rope_theta 100, "
        "clipped linears; ids: image 513, boi 512, eoi 514; bidirectional image attention no\n",
        "image processor (processor_config.json): max_soft_tokens 70 (at most 280 patches of 4 x 4 pixels), pooling 2, resize "
        "bicubic, aspect kept, rescale 0.00392157, convert_rgb on\n",
        "audio tower: 2 conformer layers, hidden 24, 3 heads of 8, subsampling channels 128, 4, light conv kernel 5, attention "
        "chunk 12, context left 13 right 0, logit cap 4, gradient_clipping 2.5, output_proj 20, clipped linears; ids: audio 516, "
        "boa 515, eoa 517\n",
        "audio features: 16000 Hz mono, 128 mel bins (0-8000 Hz), 320-sample frames every 160, FFT 512, at most 480000 "
        "samples (2999 frames, 750 soft tokens; placeholders capped at 750)\n",
    };
    size_t i;
    CHECK(cli("info %s", g_model) == 0, "%s", g_err);
    for (i = 0; i < sizeof want / sizeof want[0]; i++) CHECK(strstr(g_out, want[i]) != NULL, "no line %s in:\n%s", want[i], g_out);
    CHECK(strstr(g_out, "\nchat template: ") != NULL, "the chat template line is gone");
    CHECK(cli("info %s", tiny("e2b_like")) == 0 && strstr(g_out, "vision tower: none (config.json has no vision_config)\n") &&
          strstr(g_out, "audio tower: none (config.json has no audio_config)\n"), "a text model: %s", g_out);
    CHECK(cli("info %s/vision/31b_mm", g_data) == 0 &&
          strstr(g_out, "image processor (no processor_config.json: the defaults): unusable: the image processor's patch_size "
                        "16 and pooling_kernel_size 3 contradict the model's vision_config (4, 2)\n"),
          "a directory whose default processor contradicts the tower: %s", g_out);
}

int main(int argc, char **argv) {
    if (!h_args(argc, argv, &g_data, &g_cli, g_tmp, sizeof g_tmp, "mm")) return 1;
    snprintf(g_model, sizeof g_model, "%s/mm/e2b_av", g_data);
    run("logits: audio, image, image in one prompt = transformers and = g4_forward_mm's bits; greedy shows the processor's "
        "ids", test_logits_interleaved);
    run("logits: placeholders take the files of their kind in order, whatever the flags' order across kinds",
        test_flag_order);
    run("template: image and audio items through the released template; --ids with the files = Gemma4Processor",
        test_template);
    run("greedy, generate --chat, chat (--image/--audio, /image and /audio lines): transformers' greedy answer",
        test_answer);
    run("generate: a prompt without placeholders gets one per file before it (chat items or text)", test_auto_placeholders);
    run("video in a chat: template --ids, logits/greedy --ids, generate --chat --video, chat --video and /video = "
        "Gemma4Processor and transformers",
        test_video_chat);
    run("errors: a placeholder count that differs from the files names both; flags that do not go together",
        test_mismatch);
    run("bad files: truncated PNG, not an image, 8 kHz, stereo, cut WAV, missing, no tower: one line, exit 1; chat goes on "
        "after a bad attachment",
        test_bad_files);
    run("info: both towers, the image processor, the feature extractor; none and why", test_info);
    remove_tree(g_tmp);
    return finish();
}
