/* _lib.c - the flat C API the Python package binds with ctypes (gemma4/_core.py).

   A thin shim over the public API of gemma4.h and gemma4_processing.h (the
   tokenizer, chat layout and templates), nothing more: opaque handles
   (malloc'd structs holding the library's objects), plain C types in and out,
   every failing call returns the library's g4_result (negative) and copies the
   failed object's message into the caller's `err` buffer (G4PY_ERROR_MAX
   bytes). No Python objects, no CPython API: ctypes releases the GIL around
   every call. Built by python/setup.py (or gemma4/_build.py) with the system C
   compiler into gemma4/_gemma4.so:

       cc -std=c99 -O2 -march=native -ffp-contract=off -fPIC -shared -fvisibility=hidden -I<repo> _lib.c -lm -lpthread

   GEMMA4_STATIC keeps the library's own symbols private to the .so; only the
   g4py_* functions below are exported. */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_STATIC
#define GEMMA4_IMPLEMENTATION
#include "gemma4.h"
#include "gemma4_processing.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define G4PY_API __attribute__((visibility("default")))
#else
#define G4PY_API
#endif

#define G4PY_ERROR_MAX G4_ERROR_MAX

static int g4py_fail(char *err, int r, const char *fmt, ...) {
    va_list ap;
    if (err) {
        va_start(ap, fmt);
        vsnprintf(err, G4PY_ERROR_MAX, fmt, ap);
        va_end(ap);
    }
    return r;
}

/* err <- msg (the failed object's .error) when r is an error; returns r */
static int g4py_ret(char *err, int r, const char *msg) {
    if (r != G4_OK && err) snprintf(err, G4PY_ERROR_MAX, "%s", msg && msg[0] ? msg : g4_result_str((g4_result)r));
    return r;
}

G4PY_API int g4py_abi(void) { return 1; }
G4PY_API int g4py_error_max(void) { return G4PY_ERROR_MAX; }
G4PY_API const char *g4py_result_str(int r) { return g4_result_str((g4_result)r); }
G4PY_API const char *g4py_simd_name(void) { return g4_simd_name(); }

/* a pool of n threads (NULL for n <= 1) */
static int g4py_pool(g4_pool **pool, int threads, char *err) {
    g4_result r;
    *pool = NULL;
    if (threads <= 1) return G4_OK;
    if ((r = g4_pool_create(pool, threads)) != G4_OK) return g4py_fail(err, r, "cannot start a pool of %d threads", threads);
    return G4_OK;
}

/* ----------------------------------------------------------------- model */

G4PY_API void g4py_model_free(g4_model *m) {
    if (!m) return;
    g4_model_free(m);
    free(m);
}

G4PY_API int g4py_model_load(const char *path, const char *adapter, g4_model **out, char *err) {
    g4_model *m = (g4_model *)calloc(1, sizeof *m);
    g4_result r;
    *out = NULL;
    if (!m) return g4py_fail(err, G4_ERR_NOMEM, "out of memory");
    if ((r = g4_model_load(m, path)) == G4_OK && adapter) r = g4_model_load_adapter(m, adapter);
    if (r != G4_OK) {
        g4py_ret(err, r, m->error);
        g4py_model_free(m);
        return r;
    }
    *out = m;
    return G4_OK;
}

/* A JSON text of the resolved config (g4_config) and the plan (g4_plan),
   written into buf[cap]; returns its length (> cap - 1: call again with more). */
typedef struct { char *buf; size_t cap, len; } g4py_out;

static void g4py_put(g4py_out *o, const char *fmt, ...) {
    va_list ap;
    int n;
    char tmp[512];
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (o->len + (size_t)n < o->cap) memcpy(o->buf + o->len, tmp, (size_t)n + 1);
    o->len += (size_t)n;
}

G4PY_API size_t g4py_model_json(const g4_model *m, char *buf, size_t cap) {
    const g4_config *c = &m->config;
    const g4_plan *p = &m->plan;
    g4py_out o;
    int i, t;
    o.buf = buf; o.cap = cap; o.len = 0;
    if (cap) buf[0] = 0;
    g4py_put(&o, "{\"config\": {\"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, ", c->vocab_size,
             c->hidden_size, c->intermediate_size);
    g4py_put(&o, "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, ",
             c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads, c->head_dim);
    g4py_put(&o, "\"max_position_embeddings\": %d, \"rms_norm_eps\": %.9g, \"sliding_window\": %d, ",
             c->max_position_embeddings, (double)c->rms_norm_eps, c->sliding_window);
    g4py_put(&o, "\"final_logit_softcapping\": %.9g, \"tie_word_embeddings\": %d, \"pad_token_id\": %d, ",
             (double)c->final_logit_softcapping, c->tie_word_embeddings, c->pad_token_id);
    g4py_put(&o, "\"vocab_size_per_layer_input\": %d, \"hidden_size_per_layer_input\": %d, \"attention_k_eq_v\": %d, ",
             c->vocab_size_per_layer_input, c->hidden_size_per_layer_input, c->attention_k_eq_v);
    g4py_put(&o, "\"num_kv_shared_layers\": %d, \"use_double_wide_mlp\": %d, \"enable_moe_block\": %d, ",
             c->num_kv_shared_layers, c->use_double_wide_mlp, c->enable_moe_block);
    g4py_put(&o, "\"num_experts\": %d, \"top_k_experts\": %d, \"moe_intermediate_size\": %d, ", c->num_experts,
             c->top_k_experts, c->moe_intermediate_size);
    for (t = 0; t < 2; t++)
        g4py_put(&o, "\"rope_%s\": {\"rope_type\": \"%s\", \"rope_theta\": %.9g, \"partial_rotary_factor\": %.9g, \"factor\": %.9g}, ",
                 t == G4_SLIDING ? "sliding_attention" : "full_attention", c->rope[t].proportional ? "proportional" : "default",
                 (double)c->rope[t].theta, (double)c->rope[t].partial_rotary_factor, (double)c->rope[t].factor);
    g4py_put(&o, "\"layer_types\": [");
    for (i = 0; i < c->num_hidden_layers; i++)
        g4py_put(&o, "%s\"%s\"", i ? ", " : "", c->layer_types[i] == G4_FULL ? "full_attention" : "sliding_attention");
    g4py_put(&o, "], \"image_token_id\": %d, \"video_token_id\": %d, \"audio_token_id\": %d, ", c->image_token_id,
             c->video_token_id, c->audio_token_id);
    g4py_put(&o, "\"vision\": {\"present\": %d, \"hidden_size\": %d, \"patch_size\": %d, \"pooling_kernel_size\": %d, "
             "\"position_embedding_size\": %d}, ", c->vision.present, c->vision.hidden_size, c->vision.patch_size,
             c->vision.pooling_kernel_size, c->vision.position_embedding_size);
    g4py_put(&o, "\"audio\": {\"present\": %d, \"hidden_size\": %d, \"mel_bins\": %d}, ", c->audio.present,
             c->audio.hidden_size, c->audio.subsampling_conv_channels[0]);
    g4py_put(&o, "\"assistant\": %d}, ", c->assistant);
    g4py_put(&o, "\"plan\": {\"first_shared\": %d, \"n_slots\": %d, \"layers\": [", p->first_shared, p->n_slots);
    for (i = 0; i < p->n_layers; i++) {
        const g4_layer_plan *l = &p->layer[i];
        g4py_put(&o, "%s{\"type\": \"%s\", \"head_dim\": %d, \"kv_heads\": %d, \"has_v_proj\": %d, \"reads\": %d, ",
                 i ? ", " : "", l->type == G4_FULL ? "full_attention" : "sliding_attention", l->head_dim, l->kv_heads,
                 l->has_v_proj, l->reads);
        g4py_put(&o, "\"kv_slot\": %d, \"mlp_width\": %d, \"moe\": %d}", l->kv_slot, l->mlp_width, l->moe);
    }
    g4py_put(&o, "]}, \"prefix\": \"%s\", \"n_lora\": %d, \"lora_ignored\": %d}", m->prefix, m->n_lora, m->lora_ignored);
    return o.len;
}

/* --------------------------------------------------------------- session */

typedef struct { g4_session s; g4_pool *pool; } g4py_session;

G4PY_API void g4py_session_free(g4py_session *s) {
    if (!s) return;
    g4_session_destroy(&s->s);
    g4_pool_free(s->pool);
    free(s);
}

G4PY_API int g4py_session_new(const g4_model *m, int max_context, int max_chunk, int bf16, int lora_bf16, int threads,
                              g4_tap_fn tap, void *tap_user, g4py_session **out, char *err) {
    g4py_session *s = (g4py_session *)calloc(1, sizeof *s);
    g4_session_config sc = g4_session_config_init();
    g4_result r;
    *out = NULL;
    if (!s) return g4py_fail(err, G4_ERR_NOMEM, "out of memory");
    if ((r = g4py_pool(&s->pool, threads, err)) != G4_OK) { free(s); return r; }
    sc.max_context = max_context;
    sc.max_chunk = max_chunk;
    sc.bf16 = bf16;
    sc.lora_bf16 = lora_bf16;
    sc.pool = s->pool;
    sc.tap = tap;
    sc.tap_user = tap_user;
    if ((r = g4_session_create(&s->s, m, &sc)) != G4_OK) {
        g4py_ret(err, r, s->s.error);
        g4py_session_free(s);
        return r;
    }
    *out = s;
    return G4_OK;
}

/* tap NULL: no taps */
G4PY_API void g4py_session_set_tap(g4py_session *s, g4_tap_fn tap, void *tap_user) {
    s->s.cfg.tap = tap;
    s->s.cfg.tap_user = tap_user;
}

G4PY_API int g4py_session_forward(g4py_session *s, const int32_t *ids, int n, float *logits, int mode, float *hidden,
                                  char *err) {
    g4_result r = hidden ? g4_forward_hidden(&s->s, ids, n, logits, mode, hidden) : g4_forward(&s->s, ids, n, logits, mode);
    return g4py_ret(err, r, s->s.error);
}

/* g4_forward_mm: soft [n_soft][H], the soft tokens of the placeholder rows in order */
G4PY_API int g4py_session_forward_mm(g4py_session *s, const int32_t *ids, int n, const float *soft, int n_soft,
                                     float *logits, int mode, float *hidden, char *err) {
    return g4py_ret(err, g4_forward_mm(&s->s, ids, n, soft, n_soft, logits, mode, hidden), s->s.error);
}

G4PY_API int g4py_session_pos(const g4py_session *s) { return s->s.pos; }
G4PY_API int g4py_session_max_context(const g4py_session *s) { return s->s.cfg.max_context; }
G4PY_API size_t g4py_session_arena_bytes(const g4py_session *s) { return s->s.arena_bytes; }
G4PY_API void g4py_session_reset(g4py_session *s) { g4_session_reset(&s->s); }
G4PY_API int g4py_session_rewind(g4py_session *s, int pos, char *err) {
    return g4py_ret(err, g4_session_rewind(&s->s, pos), s->s.error);
}

/* ------------------------------------------------------------ multimodal */

/* One image through the vision tower (an arena sized for its n_patches, freed
   before returning): soft [n_patches / k^2][H] room, *n_soft written. */
G4PY_API int g4py_vision_encode(const g4_model *m, const float *pixel_values, const int32_t *positions, int n_patches,
                                int threads, float *soft, int *n_soft, char *err) {
    g4_vision_session_config vc;
    g4_vision_session *vs = (g4_vision_session *)calloc(1, sizeof *vs);
    size_t bytes = 0;
    void *arena = NULL;
    g4_result r;
    memset(&vc, 0, sizeof vc);
    *n_soft = 0;
    if (!vs) return g4py_fail(err, G4_ERR_NOMEM, "out of memory");
    vc.max_patches = n_patches;
    if ((r = g4py_pool(&vc.pool, threads, err)) != G4_OK) { free(vs); return r; }
    if ((r = g4_vision_session_size(m, &vc, &bytes)) != G4_OK) g4py_ret(err, r, m->error[0] ? m->error : "vision: cannot size the session");
    else if (!(arena = malloc(bytes ? bytes : 1))) r = (g4_result)g4py_fail(err, G4_ERR_NOMEM, "out of memory: a vision arena of %zu bytes", bytes);
    else if ((r = g4_vision_session_init(vs, m, &vc, arena, bytes)) != G4_OK) g4py_ret(err, r, vs->error);
    else if ((r = g4_vision_encode(vs, pixel_values, positions, n_patches, soft, n_soft)) != G4_OK) g4py_ret(err, r, vs->error);
    free(arena);
    g4_pool_free(vc.pool);
    free(vs);
    return r;
}

G4PY_API int g4py_audio_tokens_max(int n_frames) { return g4_audio_tokens_max(n_frames); }

/* One clip's features [n_frames][C0] and mask through the audio tower: soft
   [g4_audio_tokens_max(n_frames)][H] room, *n_soft written. */
G4PY_API int g4py_audio_encode(const g4_model *m, const float *features, const unsigned char *mask, int n_frames,
                               float *soft, int *n_soft, char *err) {
    g4_audio_run run;
    size_t bytes = 0;
    void *arena = NULL;
    g4_result r;
    memset(&run, 0, sizeof run);
    *n_soft = 0;
    if ((r = g4_audio_size(m, n_frames, &bytes)) != G4_OK) return g4py_ret(err, r, m->error[0] ? m->error : "audio: cannot size the arena");
    if (!(arena = malloc(bytes ? bytes : 1))) return g4py_fail(err, G4_ERR_NOMEM, "out of memory: an audio arena of %zu bytes", bytes);
    r = g4_audio_encode(m, features, mask, n_frames, arena, bytes, &run, soft, n_soft);
    free(arena);
    return g4py_ret(err, r, run.error);
}

/* The feature extractor's frames for n_samples (0 if none), feature_size in *bins. */
G4PY_API int g4py_audio_frames(int n_samples, int *bins, char *err) {
    g4_audio_fe fe;
    int n;
    g4_result r = g4_audio_fe_init(&fe);
    if (r != G4_OK) { g4py_ret(err, r, fe.error); g4_audio_fe_free(&fe); return -1; }
    n = g4_audio_fe_frames(&fe, n_samples);
    *bins = fe.feature_size;
    g4_audio_fe_free(&fe);
    return n;
}

/* pcm[n_samples] -> features [cap_frames][feature_size], mask [cap_frames]. */
G4PY_API int g4py_audio_features(const float *pcm, int n_samples, int rate, float *features, unsigned char *mask,
                                 int cap_frames, int *n_frames, char *err) {
    g4_audio_fe fe;
    float *scratch;
    g4_result r = g4_audio_fe_init(&fe);
    *n_frames = 0;
    if (r != G4_OK) { g4py_ret(err, r, fe.error); g4_audio_fe_free(&fe); return r; }
    if (g4_audio_fe_frames(&fe, n_samples) > cap_frames) {
        int need = g4_audio_fe_frames(&fe, n_samples);
        g4_audio_fe_free(&fe);
        return g4py_fail(err, G4_ERR_INPUT, "audio: %d frames do not fit in %d", need, cap_frames);
    }
    if (!(scratch = (float *)malloc(sizeof(float) * (g4_audio_fe_scratch(&fe) + 1)))) {
        g4_audio_fe_free(&fe);
        return g4py_fail(err, G4_ERR_NOMEM, "out of memory");
    }
    r = g4_audio_features(&fe, pcm, n_samples, rate, features, mask, n_frames, scratch);
    g4py_ret(err, r, fe.error);
    free(scratch);
    g4_audio_fe_free(&fe);
    return r;
}

/* A WAV file's bytes -> float PCM (out NULL: *n and *rate only). */
G4PY_API int g4py_wav_parse(const unsigned char *data, size_t len, float *out, size_t cap, size_t *n, int *rate, char *err) {
    return g4_wav_parse(data, len, out, cap, n, rate, err);
}

/* The image processor's settings (dir or file: processor_config.json /
   preprocessor_config.json; NULL: Gemma4ImageProcessor's defaults), checked
   against the model's vision config when m is set: patch_size, max_patches. */
static int g4py_image_cfg(g4_image_config *ic, const char *path, const g4_model *m, char *err) {
    g4_result r;
    *ic = g4_image_config_init();
    if (path && (r = g4_image_config_load(ic, path)) != G4_OK) return g4py_ret(err, r, ic->error);
    if (m && (r = g4_image_config_check(ic, &m->config)) != G4_OK) return g4py_ret(err, r, ic->error);
    return G4_OK;
}

G4PY_API int g4py_image_config(const char *path, const g4_model *m, int *patch_size, int *max_patches, char *err) {
    g4_image_config ic;
    int r = g4py_image_cfg(&ic, path, m, err);
    if (r != G4_OK) return r;
    *patch_size = ic.patch_size;
    *max_patches = ic.max_soft_tokens * ic.pooling_kernel_size * ic.pooling_kernel_size;
    return G4_OK;
}

/* pixels [h][w][c] (uint8, c 3 or 4) -> pixel_values [max_patches][3 p^2], positions [max_patches][2] */
G4PY_API int g4py_image_preprocess(const char *path, const g4_model *m, const uint8_t *pixels, int h, int w, int c,
                                   float *pixel_values, int32_t *positions, int *n_soft, char *err) {
    g4_image_config ic;
    size_t bytes;
    void *scratch;
    int r = g4py_image_cfg(&ic, path, m, err);
    *n_soft = 0;
    if (r != G4_OK) return r;
    if (!(bytes = g4_image_scratch_size(&ic, h, w)))
        return g4py_fail(err, G4_ERR_INPUT, "image: %d x %d pixels is not a size the processor takes", h, w);
    if (!(scratch = malloc(bytes))) return g4py_fail(err, G4_ERR_NOMEM, "out of memory: %zu bytes of image scratch", bytes);
    r = g4_image_preprocess(&ic, pixels, h, w, c, scratch, bytes, pixel_values, positions, n_soft);
    free(scratch);
    return g4py_ret(err, r, ic.error);
}

/* Gemma4Processor's expansion of each image placeholder into boi, n_soft[k] image tokens, eoi */
G4PY_API int g4py_mm_expand_images(const g4_model *m, const int32_t *ids, int n, const int *n_soft, int n_images,
                                   int32_t *out, size_t cap, size_t *n_out, char *err) {
    return g4_mm_expand_images(&m->config, ids, n, n_soft, n_images, out, cap, n_out, err);
}

/* -------------------------------------------------------------- training */

typedef struct { g4_train t; void *arena; g4_pool *pool; } g4py_train;

G4PY_API void g4py_train_free(g4py_train *t) {
    if (!t) return;
    free(t->arena);
    g4_pool_free(t->pool);
    free(t);
}

G4PY_API int g4py_train_new(const g4_model *m, int max_seq, int recompute, int threads, g4py_train **out,
                            size_t *grad_floats, int *n_grads, char *err) {
    g4py_train *t = (g4py_train *)calloc(1, sizeof *t);
    g4_train_config tc = g4_train_config_init();
    size_t bytes = 0, floats = 0;
    g4_result r;
    *out = NULL;
    if (!t) return g4py_fail(err, G4_ERR_NOMEM, "out of memory");
    if ((r = g4py_pool(&t->pool, threads, err)) != G4_OK) { free(t); return r; }
    tc.max_seq = max_seq;
    tc.recompute = recompute;
    tc.pool = t->pool;
    if ((r = g4_train_size(m, &tc, &bytes, &floats)) != G4_OK) {
        g4py_ret(err, r, m->error);
    } else if (!(t->arena = malloc(bytes ? bytes : 1))) {
        r = (g4_result)g4py_fail(err, G4_ERR_NOMEM, "out of memory: a training arena of %zu bytes", bytes);
    } else if ((r = g4_train_init(&t->t, m, &tc, t->arena, bytes)) != G4_OK) {
        g4py_ret(err, r, t->t.error);
    }
    if (r != G4_OK) {
        g4py_train_free(t);
        return r;
    }
    *grad_floats = t->t.grad_floats;
    *n_grads = t->t.n_grads;
    *out = t;
    return G4_OK;
}

/* entry i: name (128 bytes), offset and count in floats, ndim, shape[3] */
G4PY_API int g4py_train_grad_info(const g4py_train *t, int i, char *name, size_t *offset, size_t *count, int *ndim,
                                  int64_t *shape) {
    const g4_grad_entry *e;
    if (i < 0 || i >= t->t.n_grads) return G4_ERR_INPUT;
    e = &t->t.grads[i];
    snprintf(name, sizeof e->name, "%s", e->name);
    *offset = e->offset;
    *count = e->count;
    *ndim = e->ndim;
    memcpy(shape, e->shape, sizeof e->shape);
    return G4_OK;
}

G4PY_API int g4py_loss_and_grad(g4py_train *t, const int32_t *ids, const int32_t *labels, int n, float *loss,
                                float *grads, char *err) {
    return g4py_ret(err, g4_loss_and_grad(&t->t, ids, labels, n, loss, grads), t->t.error);
}

/* --------------------------------------------------------------- sampler */

G4PY_API void g4py_sampler_free(g4_sampler *s) {
    if (!s) return;
    g4_sampler_free(s);
    free(s);
}

G4PY_API int g4py_sampler_new(int vocab, float temperature, int top_k, float top_p, float min_p,
                              float repetition_penalty, uint64_t seed, g4_sampler **out, char *err) {
    g4_sampler *s = (g4_sampler *)calloc(1, sizeof *s);
    g4_sampler_config sc = g4_sampler_config_init();
    g4_result r;
    *out = NULL;
    if (!s) return g4py_fail(err, G4_ERR_NOMEM, "out of memory");
    sc.temperature = temperature;
    sc.top_k = top_k;
    sc.top_p = top_p;
    sc.min_p = min_p;
    sc.repetition_penalty = repetition_penalty;
    sc.seed = seed;
    if ((r = g4_sampler_init(s, &sc, vocab)) != G4_OK) {
        g4py_ret(err, r, s->error);
        g4py_sampler_free(s);
        return r;
    }
    *out = s;
    return G4_OK;
}

G4PY_API void g4py_sampler_accept(g4_sampler *s, int32_t id) { g4_sampler_accept(s, id); }

/* the id, or -1 with the message in err; logits[vocab] are modified */
G4PY_API int32_t g4py_sampler_sample(g4_sampler *s, float *logits, char *err) {
    int32_t id = g4_sampler_sample(s, logits);
    if (id < 0) g4py_ret(err, G4_ERR_INPUT, s->error);
    return id;
}

/* ------------------------------------------------------------- tokenizer */

G4PY_API void g4py_tokenizer_free(g4_tokenizer *t) {
    if (!t) return;
    g4_tokenizer_free(t);
    free(t);
}

G4PY_API int g4py_tokenizer_load(const char *path, g4_tokenizer **out, char *err) {
    g4_tokenizer *t = (g4_tokenizer *)calloc(1, sizeof *t);
    g4_result r;
    *out = NULL;
    if (!t) return g4py_fail(err, G4_ERR_NOMEM, "out of memory");
    if ((r = g4_tokenizer_load(t, path)) != G4_OK) {
        g4py_ret(err, r, t->error);
        g4py_tokenizer_free(t);
        return r;
    }
    *out = t;
    return G4_OK;
}

/* n_vocab; special[0..6) = bos, eos, pad, turn_open, turn_close, think (-1: none) */
G4PY_API int g4py_tokenizer_info(const g4_tokenizer *t, int32_t *special) {
    special[0] = t->bos; special[1] = t->eos; special[2] = t->pad;
    special[3] = t->turn_open; special[4] = t->turn_close; special[5] = t->think;
    return t->n_vocab;
}

G4PY_API int32_t g4py_token_id(const g4_tokenizer *t, const char *s) { return g4_token_id(t, s); }
G4PY_API size_t g4py_tokenize_max(const g4_tokenizer *t, size_t len) { return g4_tokenize_max(t, len); }

G4PY_API int g4py_tokenize(const g4_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids, size_t cap,
                           size_t *n_ids, char *err) {
    g4_result r = g4_tokenize(t, text, len, flags, ids, cap, n_ids);
    if (r == G4_ERR_INPUT) return g4py_fail(err, r, "tokenize: %zu ids do not fit in %zu", *n_ids, cap);
    return g4py_ret(err, r, r == G4_ERR_NOMEM ? "tokenize: out of memory" : "");
}

/* the text (NUL-terminated) into out[cap]; G4_ERR_INPUT with *len the length
   needed when it does not fit, or for an id outside the vocabulary (err says which) */
G4PY_API int g4py_detokenize(const g4_tokenizer *t, const int32_t *ids, size_t n, int flags, char *out, size_t cap,
                             size_t *len, char *err) {
    size_t i;
    for (i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return g4py_fail(err, G4_ERR_INPUT, "detokenize: id %ld at index %zu is outside the vocabulary [0, %d)",
                             (long)ids[i], i, t->n_vocab);
    return g4py_ret(err, g4_detokenize(t, ids, n, flags, out, cap, len), "detokenize: the text does not fit");
}

/* Streaming decode (g4_decode_next / g4_decode_flush): the state is allocated here. */
G4PY_API g4_decode_state *g4py_decode_new(void) { return (g4_decode_state *)calloc(1, sizeof(g4_decode_state)); }

G4PY_API void g4py_decode_free(g4_decode_state *st) {
    if (!st) return;
    g4_decode_free(st);
    free(st);
}

/* *piece: the text that id completes (often empty), valid until the next call on st */
G4PY_API int g4py_decode_next(const g4_tokenizer *t, g4_decode_state *st, int32_t id, int flags, const char **piece,
                              size_t *len, char *err) {
    g4_result r = g4_decode_next(t, st, id, flags, piece, len);
    if (r == G4_ERR_INPUT) return g4py_fail(err, r, "decode: id %ld is outside the vocabulary [0, %d)", (long)id, t->n_vocab);
    return g4py_ret(err, r, "decode: out of memory");
}

G4PY_API int g4py_decode_flush(g4_decode_state *st, const char **piece, size_t *len, char *err) {
    return g4py_ret(err, g4_decode_flush(st, piece, len), "decode: out of memory");
}

G4PY_API int g4py_chat_encode(const g4_tokenizer *t, const char *const *roles, const char *const *contents, int n_msgs,
                              int flags, int32_t *ids, size_t cap, size_t *n_ids, char *err) {
    g4_chat_message *msgs = (g4_chat_message *)calloc(n_msgs > 0 ? (size_t)n_msgs : 1, sizeof *msgs);
    g4_result r;
    int i;
    if (!msgs) return g4py_fail(err, G4_ERR_NOMEM, "out of memory");
    for (i = 0; i < n_msgs; i++) { msgs[i].role = roles[i]; msgs[i].content = contents[i]; }
    *n_ids = 0;
    r = g4_chat_encode(t, msgs, n_msgs, flags, ids, cap, n_ids);
    free(msgs);
    if (r == G4_ERR_INPUT && t->turn_open < 0) return g4py_fail(err, r, "chat: the tokenizer has no <|turn>/<turn|> tokens");
    if (r == G4_ERR_INPUT && *n_ids > cap) return g4py_fail(err, r, "chat: %zu ids do not fit in %zu", *n_ids, cap);
    return g4py_ret(err, r, "chat: bad input");
}

G4PY_API int g4py_chat_is_stop(const g4_tokenizer *t, int32_t id) { return g4_chat_is_stop(t, id); }

/* -------------------------------------------------------------- template */

/* dir: a checkpoint directory (chat_template.jinja or tokenizer_config.json);
   src: template text instead (dir then only names it). tok may be NULL. */
G4PY_API void g4py_template_free(g4_template *t) {
    if (!t) return;
    g4_template_free(t);
    free(t);
}

G4PY_API int g4py_template_new(const char *dir, const char *src, size_t len, const g4_tokenizer *tok, g4_template **out,
                               char *err) {
    g4_template *t = (g4_template *)calloc(1, sizeof *t);
    g4_result r;
    *out = NULL;
    if (!t) return g4py_fail(err, G4_ERR_NOMEM, "out of memory");
    r = src ? g4_template_parse(t, src, len, dir ? dir : "template") : g4_template_load(t, dir);
    if (r != G4_OK) {
        g4py_ret(err, r, t->error);
        g4py_template_free(t);
        return r;
    }
    if (tok) g4_template_set_tokens(t, tok);
    *out = t;
    return G4_OK;
}

/* tok NULL: *text (free with g4py_free_output); else *ids (the same) */
G4PY_API int g4py_template_apply(const g4_template *t, const g4_tokenizer *tok, const char *json, size_t len,
                                 int add_generation_prompt, int enable_thinking, char **text, size_t *text_len,
                                 int32_t **ids, size_t *n_ids, char *err) {
    g4_template_options o = g4_template_options_init();
    o.add_generation_prompt = add_generation_prompt;
    o.enable_thinking = enable_thinking;
    if (tok) return g4_template_encode(t, tok, json, len, &o, ids, n_ids, err);
    return g4_template_render(t, json, len, &o, text, text_len, err);
}

G4PY_API void g4py_free_output(void *p) { g4_template_free_output(p); }
