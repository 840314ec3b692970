/* gemma4.h - the Gemma 4 text decoder in one C header, exactly as Hugging Face
   transformers defines it.                                   MIT-0, see LICENSE

   WHAT IT IS
     A reference implementation of Google's Gemma 4 language models (E2B, E4B,
     31B, 26B-A4B and anything else with a Gemma 4 config.json): config parsing,
     safetensors loading (single file or sharded, read in place), the text
     decoder forward pass on the CPU in float32, and the shared-KV table that
     Gemma 4's later layers read their keys and values from. It is meant to be
     read op by op next to transformers' modeling_gemma4.py.

   INTEGRATION
     In exactly one C or C++ file:
         #define GEMMA4_IMPLEMENTATION
         #include "gemma4.h"
     Everywhere else just #include "gemma4.h". Link with -lm (and -lpthread
     once threads land). Options, defined before the include:
         GEMMA4_STATIC      make every function static (private to one file)
         G4_NO_MMAP         read weight files with fread instead of mmap
         G4_MALLOC/G4_FREE  the allocator used by the load functions
         G4_MAX_LAYERS      most decoder layers a config may have (256)

   EXAMPLE (error handling shortened; see examples/gemma4.c)
         g4_model model;
         if (g4_model_load(&model, "gemma-4-E2B/") != G4_OK)
             { fprintf(stderr, "%s\n", model.error); return 1; }
         g4_session_config sc = g4_session_config_init();
         sc.max_context = 4096;                 // positions the session can hold
         sc.max_chunk   = 64;                   // tokens per forward step
         size_t bytes;
         g4_session_size(&model, &sc, &bytes);  // the arena this needs
         void *arena = malloc(bytes);
         g4_session s;
         g4_session_init(&s, &model, &sc, arena, bytes);
         int32_t prompt[] = {2, 818, 1010};
         float *logits = malloc(sizeof(float) * model.config.vocab_size);
         g4_forward(&s, prompt, 3, logits, G4_LOGITS_LAST);  // prefill
         int32_t next = g4_argmax(logits, model.config.vocab_size);
         g4_forward(&s, &next, 1, logits, G4_LOGITS_LAST);   // decode one
         free(logits); free(arena); g4_model_free(&model);

   MEMORY MODEL
     g4_model_load maps the safetensors files (nothing is converted or copied)
     and allocates a small tensor table. Everything a session needs - the K/V
     storage of the layers that own K/V, the shared-KV table and all scratch -
     lives in ONE caller-provided arena whose size g4_session_size reports.
     g4_forward never allocates. Layers that read another layer's K/V (Gemma 4's
     "KV-shared" layers) get no storage: they hold a slot index into the table.
     Print the plan (g4_plan_print) to see who owns and who reads what.

   THREAD SAFETY
     A loaded g4_model is read-only: any number of sessions, on any threads,
     may share it. A session must be used by one thread at a time.

   NUMERICS
     Activations, K/V and accumulation are float32; weights are read as stored
     (BF16, F16 or F32). This matches transformers run in float32 on the same
     checkpoint (loaded with dtype=torch.float32), to about 1e-5 relative. In
     float32, transformers' embedding scale is sqrt(hidden_size) in float32; the
     bf16-rounded scale (39.25 for E2B) is what it uses when run in bf16.

   LIMITS
     Text decoder only (vision/audio tensors are ignored). Batch size 1 per
     session. Assistant/drafter configs whose layers all read an external
     model's K/V are rejected. use_bidirectional_attention only matters for
     image tokens and is ignored.

   ERRORS
     Functions return a g4_result (G4_OK = 0, errors negative); the object that
     failed holds a message naming the file, tensor or field in its .error.
     Nothing in the library exits, prints (except g4_plan_print) or asserts on
     input.
*/
#ifndef GEMMA4_H
#define GEMMA4_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef GEMMA4_STATIC
#define G4_API static
#else
#define G4_API extern
#endif

#ifndef G4_MAX_LAYERS
#define G4_MAX_LAYERS 256
#endif
#define G4_ERROR_MAX 512

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    G4_OK = 0,
    G4_ERR_IO = -1,          /* a file could not be opened or read           */
    G4_ERR_JSON = -2,        /* a JSON file is malformed                     */
    G4_ERR_CONFIG = -3,      /* a config field is missing, mistyped or out of range */
    G4_ERR_PLAN = -4,        /* the layer plan is inconsistent (KV sharing)  */
    G4_ERR_SAFETENSORS = -5, /* a safetensors file or shard index is malformed */
    G4_ERR_WEIGHTS = -6,     /* a tensor is missing or has the wrong shape/dtype */
    G4_ERR_ARENA = -7,       /* the session arena is too small or misaligned */
    G4_ERR_INPUT = -8,       /* bad argument: token id, length, NULL         */
    G4_ERR_NOMEM = -9        /* an allocation in a load function failed      */
} g4_result;

G4_API const char *g4_result_str(g4_result r);

/* ---------------------------------------------------------------- config */

enum { G4_SLIDING = 0, G4_FULL = 1 }; /* layer types: "sliding_attention", "full_attention" */

typedef struct {
    int proportional;            /* 0: rope_type "default", 1: "proportional" */
    float theta;                 /* rope_theta */
    float partial_rotary_factor; /* proportional: fraction of pairs that rotate */
    float factor;                /* proportional: inv_freq is divided by it (1.0) */
} g4_rope_config;

/* The fields of Gemma4TextConfig that drive the text decoder. 0 means "off"
   for the optional ones. Per-layer values are resolved into g4_plan. */
typedef struct {
    int vocab_size, hidden_size, intermediate_size, num_hidden_layers;
    int num_attention_heads, num_key_value_heads, head_dim;
    int max_position_embeddings;
    float rms_norm_eps;
    int sliding_window;
    float final_logit_softcapping;      /* 0: none */
    int tie_word_embeddings;
    int vocab_size_per_layer_input;
    int hidden_size_per_layer_input;    /* P; 0 disables per-layer embeddings */
    int attention_k_eq_v;
    int num_kv_shared_layers;
    int use_double_wide_mlp;
    int enable_moe_block, num_experts, top_k_experts, moe_intermediate_size;
    g4_rope_config rope[2];             /* [G4_SLIDING], [G4_FULL] */
    unsigned char layer_types[G4_MAX_LAYERS];   /* G4_SLIDING / G4_FULL */
    int layer_head_dim[G4_MAX_LAYERS];  /* resolved head dim of every layer */
    int layer_kv_heads[G4_MAX_LAYERS];  /* resolved KV heads of every layer */
    char error[G4_ERROR_MAX];
} g4_config;

/* Parse a config.json text (multimodal "gemma4" wrapper or text-only
   "gemma4_text"; legacy global_head_dim keys or per_layer_config). `name`
   only labels error messages. */
G4_API g4_result g4_config_parse(g4_config *c, const char *json, size_t len, const char *name);
G4_API g4_result g4_config_load(g4_config *c, const char *path);

/* ------------------------------------------------------------------ plan */

/* What every layer does, computed once from the config. */
typedef struct {
    int type;        /* G4_SLIDING or G4_FULL */
    int head_dim;    /* D */
    int kv_heads;    /* KVH */
    int has_v_proj;  /* 0 on attention_k_eq_v full layers: V = v_norm(k_proj(x)) */
    int reads;       /* -1: owns its K/V; else the owner layer whose K/V it reads */
    int kv_slot;     /* slot of the shared-KV table it attends over */
    int mlp_width;   /* dense MLP width (doubled on E2B's readers) */
    int moe;         /* router + experts after the dense MLP */
} g4_layer_plan;

typedef struct {
    int n_layers;
    int first_shared;                 /* layers >= this read another's K/V */
    int n_slots;                      /* one slot per owner layer */
    int slot_writer[G4_MAX_LAYERS];   /* slot -> the layer that writes it */
    g4_layer_plan layer[G4_MAX_LAYERS];
    char error[G4_ERROR_MAX];
} g4_plan;

G4_API g4_result g4_plan_build(g4_plan *p, const g4_config *c);
/* A summary, then one line per layer:
   "layer <i> <sliding|full> head_dim <D> kv_heads <n> <owner|reads <j>> mlp <width>" */
G4_API void g4_plan_print(const g4_plan *p, const g4_config *c, FILE *f);

/* --------------------------------------------------------------- weights */

typedef enum { G4_F32 = 0, G4_F16 = 1, G4_BF16 = 2, G4_I32 = 3, G4_I64 = 4, G4_DTYPE_OTHER = 5 } g4_dtype;

typedef struct {
    const void *data;     /* in the mapped file; NULL if absent */
    g4_dtype dtype;
    int ndim;
    int64_t shape[8];
} g4_tensor;

/* One decoder layer; names follow transformers' modules. W is [out, in]. */
typedef struct {
    g4_tensor input_layernorm, post_attention_layernorm;         /* [H] */
    g4_tensor pre_feedforward_layernorm, post_feedforward_layernorm; /* [H] */
    g4_tensor q_proj;          /* [NH*D, H] */
    g4_tensor q_norm;          /* [D] */
    g4_tensor k_proj;          /* [KVH*D, H]  owners only */
    g4_tensor k_norm;          /* [D]         owners only */
    g4_tensor v_proj;          /* [KVH*D, H]  owners with has_v_proj */
    g4_tensor o_proj;          /* [H, NH*D] */
    g4_tensor gate_proj, up_proj; /* [I, H] */
    g4_tensor down_proj;       /* [H, I] */
    g4_tensor per_layer_input_gate;      /* [P, H]  PLE */
    g4_tensor per_layer_projection;      /* [H, P]  PLE */
    g4_tensor post_per_layer_input_norm; /* [H]     PLE */
    g4_tensor router_proj;               /* [E, H]  MoE */
    g4_tensor router_scale;              /* [H]     MoE */
    g4_tensor router_per_expert_scale;   /* [E]     MoE */
    g4_tensor experts_gate_up;           /* [E, 2*Ie, H] gate rows first */
    g4_tensor experts_down;              /* [E, H, Ie] */
    g4_tensor pre_feedforward_layernorm_2, post_feedforward_layernorm_1, post_feedforward_layernorm_2; /* [H] */
    g4_tensor layer_scalar;    /* [1] */
} g4_layer_weights;

typedef struct {
    g4_tensor embed_tokens;               /* [V, H] */
    g4_tensor embed_tokens_per_layer;     /* [V_ple, L*P]  PLE */
    g4_tensor per_layer_model_projection; /* [L*P, H]      PLE */
    g4_tensor per_layer_projection_norm;  /* [P]           PLE */
    g4_tensor norm;                       /* [H] */
    g4_tensor lm_head;                    /* [V, H]; = embed_tokens when tied */
    g4_layer_weights *layers;             /* [L] */
} g4_weights;

typedef struct g4__file g4__file;
typedef struct g4__stinfo g4__stinfo;

typedef struct {
    g4_config config;
    g4_plan plan;
    g4_weights w;
    char prefix[32];         /* "model.language_model." or "model." */
    /* private */
    g4__file *files; int n_files;
    g4__stinfo *tensors; int n_tensors, tensors_cap;
    char error[G4_ERROR_MAX];
} g4_model;

/* PATH is a checkpoint directory (config.json + model.safetensors or
   model.safetensors.index.json + shards). Allocates; free with g4_model_free. */
G4_API g4_result g4_model_load(g4_model *m, const char *path);
G4_API void g4_model_free(g4_model *m);
/* A tensor of the checkpoint by its full name (NULL if absent). */
G4_API const g4_tensor *g4_model_tensor(const g4_model *m, const char *name);

/* --------------------------------------------------------------- session */

/* Taps: called at points where transformers has a module output, with the
   rows of the current step (rows = tokens of the chunk, first at position
   pos0). Names: "embed", "per_layer_inputs", "layers.<i>", "norm", "logits". */
typedef void (*g4_tap_fn)(void *user, const char *name, int layer,
                          const float *data, int rows, int cols, int pos0);

typedef struct {
    int max_context;     /* most positions the session holds (required) */
    int max_chunk;       /* most tokens per internal step; 0 = 64 */
    int reader_copies;   /* debug: every reader layer gets its own K/V copy */
    g4_tap_fn tap; void *tap_user;
} g4_session_config;

/* One entry of the shared-KV table: the K/V a writer layer appended, in a
   ring of `capacity` rows (position p lives in row p % capacity). */
typedef struct {
    int writer;      /* layer that writes this slot */
    int type, kv_heads, head_dim;
    int capacity;    /* full: max_context; sliding: min(window-1+max_chunk, max_context) */
    int n_pos;       /* positions written: valid are [max(0,n_pos-capacity), n_pos) */
    float *k, *v;    /* [capacity][kv_heads][head_dim] */
} g4_kv_slot;

typedef struct {
    const g4_model *model;
    g4_session_config cfg;
    int pos;                   /* positions consumed so far */
    int n_slots;
    g4_kv_slot *slots;         /* the shared-KV table */
    int *layer_slot;           /* [L] slot each layer attends over */
    /* scratch, all carved from the arena: rows = max_chunk */
    float *x, *xn, *branch, *branch2; /* [rows][H] */
    float *q, *att;            /* [rows][NH*Dmax] */
    float *k_new, *v_new;      /* [rows][KVHmax*Dmax] */
    float *scores;             /* [max_context] */
    float *gate, *up;          /* [rows][max(Imax, 2*Ie)] */
    float *pli;                /* [rows][L*P] per-layer inputs */
    float *ple;                /* [rows][P] */
    float *router;             /* [E] router probabilities */
    float *moe_y;              /* [H] one expert's output */
    float *inv_freq[2];        /* [Dmax/2] per layer type */
    char error[G4_ERROR_MAX];
} g4_session;

G4_API g4_session_config g4_session_config_init(void);
G4_API g4_result g4_session_size(const g4_model *m, const g4_session_config *cfg, size_t *bytes);
/* arena: at least g4_session_size bytes, 16-byte aligned. */
G4_API g4_result g4_session_init(g4_session *s, const g4_model *m, const g4_session_config *cfg,
                                 void *arena, size_t arena_bytes);
G4_API void g4_session_reset(g4_session *s); /* forget all positions */

enum { G4_LOGITS_NONE = 0, G4_LOGITS_LAST = 1, G4_LOGITS_ALL = 2 };
/* Run n tokens at positions s->pos .. s->pos+n-1 (prefill or decode: the same
   code). logits: NULL, or room for vocab (LAST) or n*vocab (ALL) floats. */
G4_API g4_result g4_forward(g4_session *s, const int32_t *ids, int n, float *logits, int logits_mode);
G4_API int32_t g4_argmax(const float *x, int n);

#ifdef GEMMA4_CUDA
/* ------------------------------------------------------------------ cuda */
/* The CUDA twin of the forward pass, in gemma4_cuda.cu (compile it with nvcc
   and link it with the program that defines GEMMA4_IMPLEMENTATION; define
   GEMMA4_CUDA before including this header to see these declarations). Same
   concepts as the CPU path: weights uploaded once as stored (BF16, F16, F32),
   one DEVICE arena provided by the caller (K/V of the owner layers, the
   shared-KV table, all scratch) plus a small HOST arena (the host mirror of
   the table, tap staging), the same plan, one code path for prefill and
   decode, the same taps (copied to the host only when cfg.tap is set).
   Pointers named d_* and the k/v of every g4_kv_slot here are device memory. */

#ifndef G4_CUDA_API
#define G4_CUDA_API extern /* extern even under GEMMA4_STATIC: gemma4_cuda.cu is its own file */
#endif
#define G4_ERR_CUDA ((g4_result)-10) /* a CUDA runtime call failed; .error names it */
enum { G4_CUDA_MATMUL_TILED = 0, G4_CUDA_MATMUL_PLAIN = 1 };

typedef struct {
    const g4_model *host;   /* config and plan are read here: keep it loaded */
    g4_weights w;           /* host->w's tensors, data in device memory (layers: host array) */
    void *d_weights;        /* the one device allocation holding every tensor */
    size_t weight_bytes;
    char error[G4_ERROR_MAX];
} g4_cuda_model;

typedef struct {
    const g4_cuda_model *model;
    g4_session_config cfg;
    int matmul;                /* G4_CUDA_MATMUL_TILED (default) or G4_CUDA_MATMUL_PLAIN */
    int pos;                   /* positions consumed so far */
    int n_slots;
    g4_kv_slot *slots;         /* host arena: the table as the host tracks it (k, v: device) */
    int *layer_slot;           /* host arena: [L] slot each layer attends over */
    float *stage;              /* host arena: tap staging [rows][max(H, L*P)] */
    g4_kv_slot *d_slots;       /* device arena: the table the kernels read */
    int *d_status;             /* device arena: nonzero when a kernel found a table violation */
    int32_t *d_ids;            /* [rows] */
    float *d_x, *d_xn, *d_branch, *d_branch2; /* [rows][H] */
    float *d_q, *d_att;        /* [rows][NH*Dmax] */
    float *d_k_new, *d_v_new;  /* [rows][KVHmax*Dmax] */
    float *d_scores;           /* [rows*NH][max_context] */
    float *d_gate, *d_up;      /* [rows][Imax] */
    float *d_pli, *d_ple;      /* [rows][L*P], [rows][P] */
    float *d_router;           /* [rows][E] */
    int *d_top;                /* [rows][K] chosen experts, ascending id */
    float *d_topw;             /* [rows][K] their weights */
    float *d_moe_h, *d_moe_y;  /* [rows*K][2*Ie], [rows*K][H] */
    float *d_logits;           /* [rows][V] */
    float *d_inv_freq[2];      /* [Dmax/2] per layer type */
    char error[G4_ERROR_MAX];
} g4_cuda_session;

/* Convenience for C callers without cuda_runtime.h: cudaMalloc / cudaFree
   (for the device arena; the library itself never calls them per step). */
G4_CUDA_API g4_result g4_cuda_malloc(void **p, size_t bytes, char *err);
G4_CUDA_API void g4_cuda_free(void *p);
/* G4_OK when a CUDA device is usable; else G4_ERR_CUDA with the reason in err
   (G4_ERROR_MAX bytes). desc (may be NULL) gets the device's name. */
G4_CUDA_API g4_result g4_cuda_device_check(char *desc, size_t desc_len, char *err);
/* Copies every tensor the plan uses into one device allocation (reader layers'
   stale K/V weights are not bound, hence never uploaded). */
G4_CUDA_API g4_result g4_cuda_model_upload(g4_cuda_model *cm, const g4_model *m);
G4_CUDA_API void g4_cuda_model_free(g4_cuda_model *cm);
G4_CUDA_API g4_result g4_cuda_session_size(const g4_cuda_model *cm, const g4_session_config *cfg, size_t *device_bytes,
                                      size_t *host_bytes);
/* device_arena: cudaMalloc'd (or any device memory), >= device_bytes, 16-byte
   aligned; host_arena: >= host_bytes, 16-byte aligned. Both stay the caller's. */
G4_CUDA_API g4_result g4_cuda_session_init(g4_cuda_session *s, const g4_cuda_model *cm, const g4_session_config *cfg,
                                      void *device_arena, size_t device_bytes, void *host_arena, size_t host_bytes);
G4_CUDA_API g4_result g4_cuda_session_reset(g4_cuda_session *s);
/* As g4_forward; ids and logits are host memory. */
G4_CUDA_API g4_result g4_cuda_forward(g4_cuda_session *s, const int32_t *ids, int n, float *logits, int logits_mode);
/* Copies the device's shared-KV table (n_slots entries) to out, for checks. */
G4_CUDA_API g4_result g4_cuda_session_table(g4_cuda_session *s, g4_kv_slot *out, int max);
#endif /* GEMMA4_CUDA */

#ifdef __cplusplus
}
#endif
#endif /* GEMMA4_H */

/* ======================================================================== */
/*                              IMPLEMENTATION                              */
/* ======================================================================== */
#ifdef GEMMA4_IMPLEMENTATION
#ifndef GEMMA4_IMPLEMENTATION_DONE
#define GEMMA4_IMPLEMENTATION_DONE

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#if !defined(G4_NO_MMAP) && (defined(__unix__) || defined(__APPLE__))
#define G4__MMAP 1
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#else
#define G4__MMAP 0
#endif

#ifndef G4_MALLOC
#define G4_MALLOC(n) malloc(n)
#define G4_FREE(p) free(p)
#endif

#if defined(GEMMA4_STATIC) && (defined(__GNUC__) || defined(__clang__))
#define G4__DEF static __attribute__((unused)) /* a user may call only some */
#elif defined(GEMMA4_STATIC)
#define G4__DEF static
#else
#define G4__DEF
#endif

#if defined(__GNUC__) || defined(__clang__)
#define G4__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define G4__PRINTF(a, b)
#endif

/* ------------------------------------------------------------ utilities */

static void g4__seterr(char *dst, const char *fmt, ...) G4__PRINTF(2, 3);
static void g4__seterr(char *dst, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, G4_ERROR_MAX, fmt, ap);
    va_end(ap);
}

G4__DEF const char *g4_result_str(g4_result r) {
    switch (r) {
    case G4_OK: return "ok";
    case G4_ERR_IO: return "i/o error";
    case G4_ERR_JSON: return "malformed JSON";
    case G4_ERR_CONFIG: return "bad config";
    case G4_ERR_PLAN: return "inconsistent layer plan";
    case G4_ERR_SAFETENSORS: return "malformed safetensors";
    case G4_ERR_WEIGHTS: return "missing or mis-shaped weights";
    case G4_ERR_ARENA: return "arena too small or misaligned";
    case G4_ERR_INPUT: return "bad input";
    case G4_ERR_NOMEM: return "out of memory";
    }
    return "unknown result";
}

static float g4__bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float g4__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    float f;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);          /* inf, nan */
    else if (exp != 0) u = sign | ((exp + 112) << 23) | (man << 13); /* normal */
    else if (man == 0) u = sign;                                     /* zero */
    else {                                                           /* subnormal */
        f = (float)man * (1.0f / 16777216.0f); /* man * 2^-24 */
        return sign ? -f : f;
    }
    memcpy(&f, &u, 4);
    return f;
}

static size_t g4__dtype_size(g4_dtype t) {
    switch (t) {
    case G4_F32: case G4_I32: return 4;
    case G4_F16: case G4_BF16: return 2;
    case G4_I64: return 8;
    default: return 0;
    }
}

/* Element i of a float tensor as float32, whatever its stored dtype. */
static float g4__get(const g4_tensor *t, size_t i) {
    const unsigned char *p = (const unsigned char *)t->data;
    uint16_t h;
    float f;
    switch (t->dtype) {
    case G4_F32: memcpy(&f, p + 4 * i, 4); return f;
    case G4_BF16: memcpy(&h, p + 2 * i, 2); return g4__bf16_to_f32(h);
    case G4_F16: memcpy(&h, p + 2 * i, 2); return g4__f16_to_f32(h);
    default: return 0.0f;
    }
}

static char *g4__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = (char *)G4_MALLOC(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Whole file into memory (for JSON files), NUL-terminated. */
static g4_result g4__read_file(const char *path, char **out, size_t *len, size_t max, char *err) {
    FILE *f = fopen(path, "rb");
    long n;
    char *buf;
    *out = NULL;
    if (!f) { g4__seterr(err, "%s: cannot open", path); return G4_ERR_IO; }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        g4__seterr(err, "%s: cannot determine size (not a regular file?)", path);
        return G4_ERR_IO;
    }
    if ((size_t)n > max) {
        fclose(f);
        g4__seterr(err, "%s: %ld bytes, more than the %lu allowed for this file", path, n, (unsigned long)max);
        return G4_ERR_IO;
    }
    buf = (char *)G4_MALLOC((size_t)n + 1);
    if (!buf) { fclose(f); g4__seterr(err, "%s: out of memory", path); return G4_ERR_NOMEM; }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        G4_FREE(buf);
        g4__seterr(err, "%s: read failed", path);
        return G4_ERR_IO;
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    *len = (size_t)n;
    return G4_OK;
}

/* ----------------------------------------------------------------- JSON */
/* A small DOM parser (RFC 8259, strict: no NaN/Infinity, no comments, no
   trailing commas), depth-limited, with every string decoded once. */

enum { G4__JNULL, G4__JFALSE, G4__JTRUE, G4__JNUM, G4__JSTR, G4__JARR, G4__JOBJ };
#define G4__JSON_MAX_DEPTH 64

typedef struct {
    int type;
    int child, next, count;  /* first child, next sibling (-1 = none), #children */
    const char *key;         /* member name when the parent is an object */
    const char *str;         /* decoded string (NUL-terminated) */
    size_t len;
    double num;
    int is_int;              /* a JSON integer that fits in int64 */
    int64_t ival;
} g4__jnode;

typedef struct {
    g4__jnode *nodes;
    int n, cap;
    char *strbuf;
    size_t strpos;
    const char *src;
    size_t len, pos;
    const char *name;        /* file name, for messages */
    char *err;
} g4__json;

static int g4__json_fail(g4__json *j, const char *what) {
    size_t i, line = 1, col = 1;
    for (i = 0; i < j->pos && i < j->len; i++) {
        if (j->src[i] == '\n') { line++; col = 1; } else col++;
    }
    g4__seterr(j->err, "%s: invalid JSON at line %lu, column %lu: %s", j->name, (unsigned long)line,
               (unsigned long)col, what);
    return -1;
}

static void g4__json_ws(g4__json *j) {
    while (j->pos < j->len) {
        char ch = j->src[j->pos];
        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') break;
        j->pos++;
    }
}

static int g4__json_hex4(g4__json *j, unsigned *out) {
    unsigned v = 0;
    int i;
    if (j->len - j->pos < 4) return g4__json_fail(j, "truncated \\u escape");
    for (i = 0; i < 4; i++) {
        char ch = j->src[j->pos++];
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f') v |= (unsigned)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F') v |= (unsigned)(ch - 'A' + 10);
        else return g4__json_fail(j, "bad hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

/* Decodes the string at j->pos (just after the opening quote) into strbuf. */
static int g4__json_string(g4__json *j, const char **out, size_t *outlen) {
    char *d = j->strbuf + j->strpos, *start = d;
    for (;;) {
        unsigned char ch;
        if (j->pos >= j->len) return g4__json_fail(j, "unterminated string");
        ch = (unsigned char)j->src[j->pos++];
        if (ch == '"') break;
        if (ch < 0x20) return g4__json_fail(j, "control character in string");
        if (ch != '\\') { *d++ = (char)ch; continue; }
        if (j->pos >= j->len) return g4__json_fail(j, "unterminated escape");
        ch = (unsigned char)j->src[j->pos++];
        switch (ch) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '/': *d++ = '/'; break;
        case 'b': *d++ = '\b'; break;
        case 'f': *d++ = '\f'; break;
        case 'n': *d++ = '\n'; break;
        case 'r': *d++ = '\r'; break;
        case 't': *d++ = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (g4__json_hex4(j, &cp)) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (j->len - j->pos < 6 || j->src[j->pos] != '\\' || j->src[j->pos + 1] != 'u')
                    return g4__json_fail(j, "unpaired surrogate in \\u escape");
                j->pos += 2;
                if (g4__json_hex4(j, &lo)) return -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return g4__json_fail(j, "bad low surrogate in \\u escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return g4__json_fail(j, "unpaired surrogate in \\u escape");
            }
            if (cp < 0x80) *d++ = (char)cp;
            else if (cp < 0x800) { *d++ = (char)(0xC0 | (cp >> 6)); *d++ = (char)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                *d++ = (char)(0xE0 | (cp >> 12)); *d++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                *d++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *d++ = (char)(0xF0 | (cp >> 18)); *d++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *d++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *d++ = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: return g4__json_fail(j, "unknown escape in string");
        }
    }
    *d++ = 0;
    *out = start;
    *outlen = (size_t)(d - start - 1);
    j->strpos += (size_t)(d - start);
    return 0;
}

/* Numbers: strict JSON grammar, converted without the C locale. Integers
   are exact; decimals use one correctly rounded division when the digits fit
   (every value a config holds), else pow(). */
static int g4__json_number(g4__json *j, g4__jnode *nd) {
    static const double p10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    int neg = 0, digits = 0, frac = 0, has_frac = 0, has_exp = 0, eneg = 0, dropped = 0;
    uint64_t mant = 0;
    long e = 0, ex;
    double v;
    if (j->src[j->pos] == '-') { neg = 1; j->pos++; }
    if (j->pos >= j->len || j->src[j->pos] < '0' || j->src[j->pos] > '9') return g4__json_fail(j, "bad number");
    if (j->src[j->pos] == '0' && j->pos + 1 < j->len && j->src[j->pos + 1] >= '0' && j->src[j->pos + 1] <= '9')
        return g4__json_fail(j, "number with a leading zero");
    while (j->pos < j->len && j->src[j->pos] >= '0' && j->src[j->pos] <= '9') {
        if (digits < 19) { mant = mant * 10 + (uint64_t)(j->src[j->pos] - '0'); if (mant) digits++; }
        else dropped++;
        j->pos++;
    }
    if (j->pos < j->len && j->src[j->pos] == '.') {
        has_frac = 1;
        j->pos++;
        if (j->pos >= j->len || j->src[j->pos] < '0' || j->src[j->pos] > '9') return g4__json_fail(j, "bad fraction");
        while (j->pos < j->len && j->src[j->pos] >= '0' && j->src[j->pos] <= '9') {
            if (digits < 19) { mant = mant * 10 + (uint64_t)(j->src[j->pos] - '0'); if (mant) digits++; frac++; }
            j->pos++;
        }
    }
    if (j->pos < j->len && (j->src[j->pos] == 'e' || j->src[j->pos] == 'E')) {
        has_exp = 1;
        j->pos++;
        if (j->pos < j->len && (j->src[j->pos] == '+' || j->src[j->pos] == '-')) eneg = j->src[j->pos++] == '-';
        if (j->pos >= j->len || j->src[j->pos] < '0' || j->src[j->pos] > '9') return g4__json_fail(j, "bad exponent");
        while (j->pos < j->len && j->src[j->pos] >= '0' && j->src[j->pos] <= '9') {
            if (e < 100000) e = e * 10 + (j->src[j->pos] - '0');
            j->pos++;
        }
    }
    ex = (eneg ? -e : e) - frac + dropped;
    if (ex == 0) v = (double)mant;
    else if (mant < (1ull << 53) && ex < 0 && ex >= -22) v = (double)mant / p10[-ex];
    else if (mant < (1ull << 53) && ex > 0 && ex <= 22) v = (double)mant * p10[ex];
    else v = (double)mant * pow(10.0, (double)ex);
    nd->type = G4__JNUM;
    nd->num = neg ? -v : v;
    nd->is_int = !has_frac && !has_exp && !dropped && mant <= (uint64_t)INT64_MAX;
    nd->ival = nd->is_int ? (neg ? -(int64_t)mant : (int64_t)mant) : 0;
    return 0;
}

static int g4__json_value(g4__json *j, int depth);

static int g4__json_new(g4__json *j, int type) {
    g4__jnode *nd;
    if (j->n >= j->cap) return g4__json_fail(j, "too many values");
    nd = &j->nodes[j->n];
    memset(nd, 0, sizeof *nd);
    nd->type = type;
    nd->child = nd->next = -1;
    return j->n++;
}

static int g4__json_container(g4__json *j, int depth, int is_obj) {
    int self = g4__json_new(j, is_obj ? G4__JOBJ : G4__JARR), last = -1;
    char close = is_obj ? '}' : ']';
    if (self < 0) return -1;
    if (depth > G4__JSON_MAX_DEPTH) return g4__json_fail(j, "nesting deeper than 64");
    j->pos++; /* [ or { */
    g4__json_ws(j);
    if (j->pos < j->len && j->src[j->pos] == close) { j->pos++; return self; }
    for (;;) {
        const char *key = NULL;
        size_t klen;
        int child;
        g4__json_ws(j);
        if (is_obj) {
            if (j->pos >= j->len || j->src[j->pos] != '"') return g4__json_fail(j, "expected a member name");
            j->pos++;
            if (g4__json_string(j, &key, &klen)) return -1;
            g4__json_ws(j);
            if (j->pos >= j->len || j->src[j->pos] != ':') return g4__json_fail(j, "expected ':'");
            j->pos++;
        }
        child = g4__json_value(j, depth + 1);
        if (child < 0) return -1;
        j->nodes[child].key = key;
        if (last < 0) j->nodes[self].child = child; else j->nodes[last].next = child;
        last = child;
        j->nodes[self].count++;
        g4__json_ws(j);
        if (j->pos < j->len && j->src[j->pos] == ',') { j->pos++; continue; }
        if (j->pos < j->len && j->src[j->pos] == close) { j->pos++; return self; }
        return g4__json_fail(j, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int g4__json_lit(g4__json *j, const char *lit, int type) {
    size_t n = strlen(lit);
    if (j->len - j->pos < n || memcmp(j->src + j->pos, lit, n) != 0) return g4__json_fail(j, "invalid literal");
    j->pos += n;
    return g4__json_new(j, type);
}

static int g4__json_value(g4__json *j, int depth) {
    char ch;
    int nd;
    g4__json_ws(j);
    if (j->pos >= j->len) return g4__json_fail(j, "unexpected end of input");
    ch = j->src[j->pos];
    switch (ch) {
    case '{': return g4__json_container(j, depth, 1);
    case '[': return g4__json_container(j, depth, 0);
    case '"':
        if ((nd = g4__json_new(j, G4__JSTR)) < 0) return -1;
        j->pos++;
        if (g4__json_string(j, &j->nodes[nd].str, &j->nodes[nd].len)) return -1;
        return nd;
    case 't': return g4__json_lit(j, "true", G4__JTRUE);
    case 'f': return g4__json_lit(j, "false", G4__JFALSE);
    case 'n': return g4__json_lit(j, "null", G4__JNULL);
    default:
        if (ch == '-' || (ch >= '0' && ch <= '9')) {
            if ((nd = g4__json_new(j, G4__JNUM)) < 0) return -1;
            if (g4__json_number(j, &j->nodes[nd])) return -1;
            return nd;
        }
        return g4__json_fail(j, "unexpected character (NaN, Infinity and comments are not JSON)");
    }
}

static void g4__json_free(g4__json *j) {
    G4_FREE(j->nodes);
    G4_FREE(j->strbuf);
    j->nodes = NULL;
    j->strbuf = NULL;
}

/* Parses src[0..len) into j; node 0 is the root. err: G4_ERROR_MAX bytes. */
static g4_result g4__json_parse(g4__json *j, const char *src, size_t len, const char *name, char *err) {
    memset(j, 0, sizeof *j);
    j->src = src;
    j->len = len;
    j->name = name;
    j->err = err;
    if (len > (size_t)1 << 30) { g4__seterr(err, "%s: JSON text larger than 1 GiB", name); return G4_ERR_JSON; }
    j->cap = (int)(len / 2 + 2); /* every value takes at least one byte and a separator */
    j->nodes = (g4__jnode *)G4_MALLOC(sizeof(g4__jnode) * (size_t)j->cap);
    j->strbuf = (char *)G4_MALLOC(len + 1);
    if (!j->nodes || !j->strbuf) {
        g4__json_free(j);
        g4__seterr(err, "%s: out of memory parsing JSON", name);
        return G4_ERR_NOMEM;
    }
    if (g4__json_value(j, 0) < 0) { g4__json_free(j); return G4_ERR_JSON; }
    g4__json_ws(j);
    if (j->pos != len) {
        g4__json_fail(j, "trailing characters after the JSON value");
        g4__json_free(j);
        return G4_ERR_JSON;
    }
    return G4_OK;
}

/* Member `key` of object node `obj` (the last one if repeated, as Python's json), or -1. */
static int g4__jget(const g4__json *j, int obj, const char *key) {
    int c, found = -1;
    if (obj < 0 || j->nodes[obj].type != G4__JOBJ) return -1;
    for (c = j->nodes[obj].child; c >= 0; c = j->nodes[c].next)
        if (strcmp(j->nodes[c].key, key) == 0) found = c;
    return found;
}

static const char *g4__jtype_name(int t) {
    static const char *names[] = {"null", "false", "true", "a number", "a string", "an array", "an object"};
    return names[t];
}

/* --------------------------------------------------------------- config */

typedef struct {
    const g4__json *j;
    int obj;             /* the text config object */
    const char *name;    /* file name */
    const char *scope;   /* "" or "text_config." */
    char *err;
} g4__cfg;

/* Reads an integer field: absent or null gives `def` (or an error when
   required); otherwise it must be a JSON integer in [lo, hi]. */
static g4_result g4__cfg_int(const g4__cfg *c, const char *key, int *out, int def, int required, int64_t lo,
                             int64_t hi) {
    int n = g4__jget(c->j, c->obj, key);
    const g4__jnode *nd;
    if (n < 0 || c->j->nodes[n].type == G4__JNULL) {
        if (required) {
            g4__seterr(c->err, "%s: field '%s%s' is missing", c->name, c->scope, key);
            return G4_ERR_CONFIG;
        }
        *out = def;
        return G4_OK;
    }
    nd = &c->j->nodes[n];
    if (nd->type != G4__JNUM || !nd->is_int) {
        g4__seterr(c->err, "%s: field '%s%s' must be an integer, got %s", c->name, c->scope, key,
                   nd->type == G4__JNUM ? "a fractional number" : g4__jtype_name(nd->type));
        return G4_ERR_CONFIG;
    }
    if (nd->ival < lo || nd->ival > hi) {
        g4__seterr(c->err, "%s: field '%s%s' is %lld, outside [%lld, %lld]", c->name, c->scope, key,
                   (long long)nd->ival, (long long)lo, (long long)hi);
        return G4_ERR_CONFIG;
    }
    *out = (int)nd->ival;
    return G4_OK;
}

static g4_result g4__cfg_num_node(const g4__cfg *c, int n, const char *what, float *out, double lo, double hi) {
    const g4__jnode *nd = &c->j->nodes[n];
    if (nd->type != G4__JNUM) {
        g4__seterr(c->err, "%s: field '%s%s' must be a number, got %s", c->name, c->scope, what,
                   g4__jtype_name(nd->type));
        return G4_ERR_CONFIG;
    }
    if (!(nd->num >= lo && nd->num <= hi)) {
        g4__seterr(c->err, "%s: field '%s%s' is %g, outside [%g, %g]", c->name, c->scope, what, nd->num, lo, hi);
        return G4_ERR_CONFIG;
    }
    *out = (float)nd->num;
    return G4_OK;
}

static g4_result g4__cfg_float(const g4__cfg *c, const char *key, float *out, float def, double lo, double hi) {
    int n = g4__jget(c->j, c->obj, key);
    if (n < 0 || c->j->nodes[n].type == G4__JNULL) { *out = def; return G4_OK; }
    return g4__cfg_num_node(c, n, key, out, lo, hi);
}

static g4_result g4__cfg_bool(const g4__cfg *c, const char *key, int *out, int def) {
    int n = g4__jget(c->j, c->obj, key);
    if (n < 0 || c->j->nodes[n].type == G4__JNULL) { *out = def; return G4_OK; }
    if (c->j->nodes[n].type != G4__JTRUE && c->j->nodes[n].type != G4__JFALSE) {
        g4__seterr(c->err, "%s: field '%s%s' must be true or false, got %s", c->name, c->scope, key,
                   g4__jtype_name(c->j->nodes[n].type));
        return G4_ERR_CONFIG;
    }
    *out = c->j->nodes[n].type == G4__JTRUE;
    return G4_OK;
}

/* A string field that must be absent, null or one of the accepted values. */
static g4_result g4__cfg_expect_str(const g4__cfg *c, const char *key, const char *ok1, const char *ok2) {
    int n = g4__jget(c->j, c->obj, key);
    const g4__jnode *nd;
    if (n < 0 || c->j->nodes[n].type == G4__JNULL) return G4_OK;
    nd = &c->j->nodes[n];
    if (nd->type != G4__JSTR) {
        g4__seterr(c->err, "%s: field '%s%s' must be a string, got %s", c->name, c->scope, key,
                   g4__jtype_name(nd->type));
        return G4_ERR_CONFIG;
    }
    if (strcmp(nd->str, ok1) != 0 && (!ok2 || strcmp(nd->str, ok2) != 0)) {
        g4__seterr(c->err, "%s: field '%s%s' is \"%.64s\"; gemma4.h supports only \"%s\"%s%s%s", c->name, c->scope,
                   key, nd->str, ok1, ok2 ? " or \"" : "", ok2 ? ok2 : "", ok2 ? "\"" : "");
        return G4_ERR_CONFIG;
    }
    return G4_OK;
}

static const char *g4__type_name(int t) { return t == G4_FULL ? "full_attention" : "sliding_attention"; }

static g4_result g4__cfg_rope(const g4__cfg *c, g4_config *cfg, int used[2]) {
    int rp = g4__jget(c->j, c->obj, "rope_parameters"), t;
    g4_result r;
    /* transformers' defaults when rope_parameters is absent */
    cfg->rope[G4_SLIDING].proportional = 0;
    cfg->rope[G4_SLIDING].theta = 10000.0f;
    cfg->rope[G4_SLIDING].partial_rotary_factor = 1.0f;
    cfg->rope[G4_SLIDING].factor = 1.0f;
    cfg->rope[G4_FULL].proportional = 1;
    cfg->rope[G4_FULL].theta = 1000000.0f;
    cfg->rope[G4_FULL].partial_rotary_factor = 0.25f;
    cfg->rope[G4_FULL].factor = 1.0f;
    if (rp < 0 || c->j->nodes[rp].type == G4__JNULL) return G4_OK;
    if (c->j->nodes[rp].type != G4__JOBJ) {
        g4__seterr(c->err, "%s: field '%srope_parameters' must be an object keyed by layer type", c->name, c->scope);
        return G4_ERR_CONFIG;
    }
    for (t = 0; t < 2; t++) {
        char what[96];
        int e = g4__jget(c->j, rp, g4__type_name(t)), n, prop;
        g4_rope_config *rc = &cfg->rope[t];
        if (e < 0) {
            if (!used[t]) continue;
            g4__seterr(c->err, "%s: field '%srope_parameters' has no \"%s\" entry, which layer types need", c->name,
                       c->scope, g4__type_name(t));
            return G4_ERR_CONFIG;
        }
        if (c->j->nodes[e].type != G4__JOBJ) {
            g4__seterr(c->err, "%s: field '%srope_parameters.%s' must be an object", c->name, c->scope,
                       g4__type_name(t));
            return G4_ERR_CONFIG;
        }
        n = g4__jget(c->j, e, "rope_type");
        if (n < 0 || c->j->nodes[n].type != G4__JSTR) {
            g4__seterr(c->err, "%s: field '%srope_parameters.%s.rope_type' must be a string", c->name, c->scope,
                       g4__type_name(t));
            return G4_ERR_CONFIG;
        }
        if (strcmp(c->j->nodes[n].str, "default") == 0) prop = 0;
        else if (strcmp(c->j->nodes[n].str, "proportional") == 0) prop = 1;
        else {
            g4__seterr(c->err, "%s: rope_type \"%.64s\" in '%srope_parameters.%s' is not supported (default, proportional)",
                       c->name, c->j->nodes[n].str, c->scope, g4__type_name(t));
            return G4_ERR_CONFIG;
        }
        rc->proportional = prop;
        snprintf(what, sizeof what, "rope_parameters.%s.rope_theta", g4__type_name(t));
        n = g4__jget(c->j, e, "rope_theta");
        if (n < 0) {
            g4__seterr(c->err, "%s: field '%s%s' is missing", c->name, c->scope, what);
            return G4_ERR_CONFIG;
        }
        if ((r = g4__cfg_num_node(c, n, what, &rc->theta, 1e-3, 1e30)) != G4_OK) return r;
        rc->partial_rotary_factor = 1.0f;
        rc->factor = 1.0f;
        if (prop) { /* "default" ignores both, as transformers does */
            snprintf(what, sizeof what, "rope_parameters.%s.partial_rotary_factor", g4__type_name(t));
            if ((n = g4__jget(c->j, e, "partial_rotary_factor")) >= 0 &&
                (r = g4__cfg_num_node(c, n, what, &rc->partial_rotary_factor, 0.0, 1.0)) != G4_OK)
                return r;
            snprintf(what, sizeof what, "rope_parameters.%s.factor", g4__type_name(t));
            if ((n = g4__jget(c->j, e, "factor")) >= 0 &&
                (r = g4__cfg_num_node(c, n, what, &rc->factor, 1e-6, 1e30)) != G4_OK)
                return r;
        }
    }
    return G4_OK;
}

/* per_layer_config (transformers >= 5.15): {"04": {"head_dim": 512}, ...} */
static g4_result g4__cfg_per_layer(const g4__cfg *c, g4_config *cfg, int plc) {
    int e;
    if (c->j->nodes[plc].type != G4__JOBJ) {
        g4__seterr(c->err, "%s: field '%sper_layer_config' must be an object", c->name, c->scope);
        return G4_ERR_CONFIG;
    }
    for (e = c->j->nodes[plc].child; e >= 0; e = c->j->nodes[e].next) {
        const char *k = c->j->nodes[e].key, *p;
        long idx = 0;
        int a;
        if (!*k) goto badkey;
        for (p = k; *p; p++) {
            if (*p < '0' || *p > '9' || idx > 100000) goto badkey;
            idx = idx * 10 + (*p - '0');
        }
        if (idx >= cfg->num_hidden_layers) goto badkey;
        if (c->j->nodes[e].type != G4__JOBJ) {
            g4__seterr(c->err, "%s: field '%sper_layer_config.%s' must be an object", c->name, c->scope, k);
            return G4_ERR_CONFIG;
        }
        for (a = c->j->nodes[e].child; a >= 0; a = c->j->nodes[a].next) {
            const g4__jnode *v = &c->j->nodes[a];
            int is_hd = strcmp(v->key, "head_dim") == 0, is_kv = strcmp(v->key, "num_key_value_heads") == 0;
            if (!is_hd && !is_kv) {
                g4__seterr(c->err, "%s: per_layer_config.%s.%.64s: only head_dim and num_key_value_heads may vary by layer",
                           c->name, k, v->key);
                return G4_ERR_CONFIG;
            }
            if (v->type != G4__JNUM || !v->is_int || v->ival < 1 || v->ival > 65536) {
                g4__seterr(c->err, "%s: per_layer_config.%s.%s must be an integer in [1, 65536]", c->name, k, v->key);
                return G4_ERR_CONFIG;
            }
            if (is_hd) cfg->layer_head_dim[idx] = (int)v->ival;
            else cfg->layer_kv_heads[idx] = (int)v->ival;
        }
    }
    return G4_OK;
badkey:
    g4__seterr(c->err, "%s: per_layer_config key \"%.32s\" is not a layer index below num_hidden_layers (%d)", c->name,
               c->j->nodes[e].key, cfg->num_hidden_layers);
    return G4_ERR_CONFIG;
}

static g4_result g4__config_from_json(g4_config *cfg, const g4__json *j, const char *name) {
    g4__cfg c;
    int root = 0, mt, n, i, used[2] = {0, 0}, global_head_dim, global_kv;
    g4_result r;
    c.j = j;
    c.obj = 0;
    c.name = name;
    c.scope = "";
    c.err = cfg->error;
    if (j->nodes[root].type != G4__JOBJ) {
        g4__seterr(cfg->error, "%s: the top level must be a JSON object, got %s", name,
                   g4__jtype_name(j->nodes[root].type));
        return G4_ERR_CONFIG;
    }
    mt = g4__jget(j, root, "model_type");
    if (mt >= 0 && j->nodes[mt].type != G4__JSTR) {
        g4__seterr(cfg->error, "%s: field 'model_type' must be a string", name);
        return G4_ERR_CONFIG;
    }
    if (mt >= 0 && strcmp(j->nodes[mt].str, "gemma4") != 0 && strcmp(j->nodes[mt].str, "gemma4_text") != 0) {
        g4__seterr(cfg->error, "%s: model_type \"%.64s\" is not a Gemma 4 text model (gemma4, gemma4_text)", name,
                   j->nodes[mt].str);
        return G4_ERR_CONFIG;
    }
    n = g4__jget(j, root, "text_config");
    if (n >= 0 && j->nodes[n].type != G4__JNULL) {
        if (j->nodes[n].type != G4__JOBJ) {
            g4__seterr(cfg->error, "%s: field 'text_config' must be an object", name);
            return G4_ERR_CONFIG;
        }
        c.obj = n;
        c.scope = "text_config.";
    } else if (mt >= 0 && strcmp(j->nodes[mt].str, "gemma4") == 0) {
        g4__seterr(cfg->error, "%s: model_type gemma4 needs a 'text_config' object", name);
        return G4_ERR_CONFIG;
    }

#define G4__TRY(x) do { if ((r = (x)) != G4_OK) return r; } while (0)
    G4__TRY(g4__cfg_int(&c, "vocab_size", &cfg->vocab_size, 0, 1, 1, 1 << 24));
    G4__TRY(g4__cfg_int(&c, "hidden_size", &cfg->hidden_size, 0, 1, 1, 1 << 20));
    G4__TRY(g4__cfg_int(&c, "intermediate_size", &cfg->intermediate_size, 0, 1, 1, 1 << 22));
    G4__TRY(g4__cfg_int(&c, "num_hidden_layers", &cfg->num_hidden_layers, 0, 1, 1, G4_MAX_LAYERS));
    G4__TRY(g4__cfg_int(&c, "num_attention_heads", &cfg->num_attention_heads, 0, 1, 1, 4096));
    G4__TRY(g4__cfg_int(&c, "num_key_value_heads", &cfg->num_key_value_heads, 0, 1, 1, 4096));
    G4__TRY(g4__cfg_int(&c, "head_dim", &cfg->head_dim, 256, 0, 2, 65536));
    G4__TRY(g4__cfg_int(&c, "max_position_embeddings", &cfg->max_position_embeddings, 131072, 0, 1, INT32_MAX));
    G4__TRY(g4__cfg_float(&c, "rms_norm_eps", &cfg->rms_norm_eps, 1e-6f, 0.0, 1.0));
    G4__TRY(g4__cfg_int(&c, "sliding_window", &cfg->sliding_window, 512, 0, 1, INT32_MAX));
    G4__TRY(g4__cfg_float(&c, "final_logit_softcapping", &cfg->final_logit_softcapping, 0.0f, 1e-6, 1e30));
    G4__TRY(g4__cfg_bool(&c, "tie_word_embeddings", &cfg->tie_word_embeddings, 1));
    G4__TRY(g4__cfg_int(&c, "vocab_size_per_layer_input", &cfg->vocab_size_per_layer_input, 262144, 0, 1, 1 << 24));
    G4__TRY(g4__cfg_int(&c, "hidden_size_per_layer_input", &cfg->hidden_size_per_layer_input, 256, 0, 0, 65536));
    G4__TRY(g4__cfg_bool(&c, "attention_k_eq_v", &cfg->attention_k_eq_v, 0));
    G4__TRY(g4__cfg_int(&c, "num_kv_shared_layers", &cfg->num_kv_shared_layers, 0, 0, 0, G4_MAX_LAYERS));
    G4__TRY(g4__cfg_bool(&c, "use_double_wide_mlp", &cfg->use_double_wide_mlp, 0));
    G4__TRY(g4__cfg_bool(&c, "enable_moe_block", &cfg->enable_moe_block, 0));
    G4__TRY(g4__cfg_int(&c, "num_experts", &cfg->num_experts, 0, 0, 1, 65536));
    G4__TRY(g4__cfg_int(&c, "top_k_experts", &cfg->top_k_experts, 0, 0, 1, 65536));
    G4__TRY(g4__cfg_int(&c, "moe_intermediate_size", &cfg->moe_intermediate_size, 0, 0, 1, 1 << 22));
    G4__TRY(g4__cfg_int(&c, "global_head_dim", &global_head_dim, 512, 0, 2, 65536));
    G4__TRY(g4__cfg_int(&c, "num_global_key_value_heads", &global_kv, 0, 0, 1, 4096));
    G4__TRY(g4__cfg_expect_str(&c, "hidden_activation", "gelu_pytorch_tanh", NULL));
    G4__TRY(g4__cfg_expect_str(&c, "use_bidirectional_attention", "vision", NULL));
    {
        int bias;
        G4__TRY(g4__cfg_bool(&c, "attention_bias", &bias, 0));
        if (bias) {
            g4__seterr(cfg->error, "%s: field '%sattention_bias' is true; Gemma 4 has no attention biases", name, c.scope);
            return G4_ERR_CONFIG;
        }
    }
    if (c.obj != root) { /* the wrapper's own tie_word_embeddings decides for Gemma4ForConditionalGeneration */
        g4__cfg top = c;
        top.obj = root;
        top.scope = "";
        G4__TRY(g4__cfg_bool(&top, "tie_word_embeddings", &cfg->tie_word_embeddings, cfg->tie_word_embeddings));
    }
    if (cfg->hidden_size_per_layer_input > 0 && (int64_t)cfg->num_hidden_layers * cfg->hidden_size_per_layer_input > (1 << 24)) {
        g4__seterr(cfg->error, "%s: num_hidden_layers * hidden_size_per_layer_input is too large", name);
        return G4_ERR_CONFIG;
    }

    /* layer_types: absent means every 6th layer is full; the last is forced full */
    n = g4__jget(j, c.obj, "layer_types");
    if (n < 0 || j->nodes[n].type == G4__JNULL) {
        for (i = 0; i < cfg->num_hidden_layers; i++) cfg->layer_types[i] = (i + 1) % 6 ? G4_SLIDING : G4_FULL;
    } else {
        int e;
        if (j->nodes[n].type != G4__JARR || j->nodes[n].count != cfg->num_hidden_layers) {
            g4__seterr(cfg->error, "%s: field '%slayer_types' must be an array of num_hidden_layers (%d) strings", name,
                       c.scope, cfg->num_hidden_layers);
            return G4_ERR_CONFIG;
        }
        for (i = 0, e = j->nodes[n].child; e >= 0; e = j->nodes[e].next, i++) {
            const g4__jnode *v = &j->nodes[e];
            if (v->type == G4__JSTR && strcmp(v->str, "sliding_attention") == 0) cfg->layer_types[i] = G4_SLIDING;
            else if (v->type == G4__JSTR && strcmp(v->str, "full_attention") == 0) cfg->layer_types[i] = G4_FULL;
            else {
                g4__seterr(cfg->error, "%s: %slayer_types[%d] must be \"sliding_attention\" or \"full_attention\"",
                           name, c.scope, i);
                return G4_ERR_CONFIG;
            }
        }
    }
    cfg->layer_types[cfg->num_hidden_layers - 1] = G4_FULL; /* as transformers forces it */
    for (i = 0; i < cfg->num_hidden_layers; i++) used[cfg->layer_types[i]] = 1;
    G4__TRY(g4__cfg_rope(&c, cfg, used));

    /* per-layer head dim and KV heads: per_layer_config, else the legacy keys */
    for (i = 0; i < cfg->num_hidden_layers; i++) {
        cfg->layer_head_dim[i] = cfg->head_dim;
        cfg->layer_kv_heads[i] = cfg->num_key_value_heads;
    }
    n = g4__jget(j, c.obj, "per_layer_config");
    if (n >= 0 && j->nodes[n].type != G4__JNULL) {
        G4__TRY(g4__cfg_per_layer(&c, cfg, n));
    } else {
        for (i = 0; i < cfg->num_hidden_layers; i++) {
            if (cfg->layer_types[i] != G4_FULL) continue;
            cfg->layer_head_dim[i] = global_head_dim;
            if (cfg->attention_k_eq_v && global_kv > 0) cfg->layer_kv_heads[i] = global_kv;
        }
    }
#undef G4__TRY

    /* cross-field checks */
    for (i = 0; i < cfg->num_hidden_layers; i++) {
        int d = cfg->layer_head_dim[i], kv = cfg->layer_kv_heads[i];
        if (d % 2) {
            g4__seterr(cfg->error, "%s: layer %d has odd head_dim %d; RoPE needs an even head dim", name, i, d);
            return G4_ERR_CONFIG;
        }
        if (cfg->num_attention_heads % kv) {
            g4__seterr(cfg->error, "%s: layer %d: num_attention_heads (%d) is not a multiple of its KV heads (%d)",
                       name, i, cfg->num_attention_heads, kv);
            return G4_ERR_CONFIG;
        }
        if ((int64_t)cfg->num_attention_heads * d > (1 << 22)) {
            g4__seterr(cfg->error, "%s: layer %d: num_attention_heads * head_dim is too large", name, i);
            return G4_ERR_CONFIG;
        }
    }
    for (i = 0; i < cfg->num_hidden_layers; i++) { /* RoPE tables are per type, so head dims must be too */
        int k;
        for (k = 0; k < i; k++)
            if (cfg->layer_types[k] == cfg->layer_types[i] && cfg->layer_head_dim[k] != cfg->layer_head_dim[i]) {
                g4__seterr(cfg->error, "%s: layers %d and %d are both %s but have head_dim %d and %d", name, k, i,
                           g4__type_name(cfg->layer_types[i]), cfg->layer_head_dim[k], cfg->layer_head_dim[i]);
                return G4_ERR_CONFIG;
            }
    }
    if (cfg->num_kv_shared_layers >= cfg->num_hidden_layers) {
        g4__seterr(cfg->error, "%s: num_kv_shared_layers (%d) must be below num_hidden_layers (%d): every layer would "
                   "read K/V that no layer of this model writes", name, cfg->num_kv_shared_layers, cfg->num_hidden_layers);
        return G4_ERR_CONFIG;
    }
    if (cfg->enable_moe_block) {
        if (cfg->num_experts < 1 || cfg->top_k_experts < 1 || cfg->moe_intermediate_size < 1 ||
            cfg->top_k_experts > cfg->num_experts) {
            g4__seterr(cfg->error, "%s: enable_moe_block needs num_experts >= top_k_experts >= 1 and moe_intermediate_size >= 1",
                       name);
            return G4_ERR_CONFIG;
        }
    }
    return G4_OK;
}

G4__DEF g4_result g4_config_parse(g4_config *cfg, const char *json, size_t len, const char *name) {
    g4__json j;
    g4_result r;
    if (!cfg) return G4_ERR_INPUT;
    memset(cfg, 0, sizeof *cfg);
    if (!name) name = "config.json";
    if (!json) { g4__seterr(cfg->error, "%s: NULL text", name); return G4_ERR_INPUT; }
    if ((r = g4__json_parse(&j, json, len, name, cfg->error)) != G4_OK) return r;
    r = g4__config_from_json(cfg, &j, name);
    g4__json_free(&j);
    return r;
}

G4__DEF g4_result g4_config_load(g4_config *cfg, const char *path) {
    char *text;
    size_t len;
    g4_result r;
    if (!cfg) return G4_ERR_INPUT;
    memset(cfg, 0, sizeof *cfg);
    if (!path) { g4__seterr(cfg->error, "NULL path"); return G4_ERR_INPUT; }
    if ((r = g4__read_file(path, &text, &len, 64u << 20, cfg->error)) != G4_OK) return r;
    r = g4_config_parse(cfg, text, len, path);
    G4_FREE(text);
    return r;
}

/* ----------------------------------------------------------------- plan */
/* transformers' rule (Gemma4TextConfig.kv_sharing_modes): layers at or after
   first_shared = L - num_kv_shared_layers read the K/V of the LAST earlier
   layer of the same type. Every other layer owns a slot of the table. */

G4__DEF g4_result g4_plan_build(g4_plan *p, const g4_config *c) {
    int i, L;
    if (!p) return G4_ERR_INPUT;
    memset(p, 0, sizeof *p);
    if (!c) { g4__seterr(p->error, "NULL config"); return G4_ERR_INPUT; }
    L = c->num_hidden_layers;
    if (L < 1 || L > G4_MAX_LAYERS || c->num_kv_shared_layers < 0 || c->num_kv_shared_layers >= L) {
        g4__seterr(p->error, "num_kv_shared_layers (%d) must be in [0, num_hidden_layers %d)", c->num_kv_shared_layers, L);
        return G4_ERR_PLAN;
    }
    p->n_layers = L;
    p->first_shared = L - c->num_kv_shared_layers;
    for (i = 0; i < L; i++) {
        g4_layer_plan *lp = &p->layer[i];
        lp->type = c->layer_types[i];
        lp->head_dim = c->layer_head_dim[i];
        lp->kv_heads = c->layer_kv_heads[i];
        lp->has_v_proj = !(c->attention_k_eq_v && lp->type == G4_FULL);
        lp->moe = c->enable_moe_block;
        lp->mlp_width = c->intermediate_size *
                        (c->use_double_wide_mlp && i >= p->first_shared && p->first_shared > 0 ? 2 : 1);
        lp->reads = -1;
        if (i < p->first_shared) {
            lp->kv_slot = p->n_slots;
            p->slot_writer[p->n_slots++] = i;
        } else {
            int j, owner = -1;
            for (j = p->first_shared - 1; j >= 0; j--)
                if (c->layer_types[j] == lp->type) { owner = j; break; }
            if (owner < 0) {
                g4__seterr(p->error, "layer %d (%s) reads shared K/V, but no layer before %d is %s to own it", i,
                           g4__type_name(lp->type), p->first_shared, g4__type_name(lp->type));
                return G4_ERR_PLAN;
            }
            if (c->layer_head_dim[owner] != lp->head_dim || c->layer_kv_heads[owner] != lp->kv_heads) {
                g4__seterr(p->error, "layer %d reads layer %d's K/V but their shapes differ (head_dim %d vs %d, "
                           "kv_heads %d vs %d)", i, owner, lp->head_dim, c->layer_head_dim[owner], lp->kv_heads,
                           c->layer_kv_heads[owner]);
                return G4_ERR_PLAN;
            }
            lp->reads = owner;
            lp->kv_slot = p->layer[owner].kv_slot;
        }
    }
    return G4_OK;
}

G4__DEF void g4_plan_print(const g4_plan *p, const g4_config *c, FILE *f) {
    int i;
    fprintf(f, "gemma4: %d layers, hidden %d, %d heads, vocab %d, window %d\n", c->num_hidden_layers, c->hidden_size,
            c->num_attention_heads, c->vocab_size, c->sliding_window);
    fprintf(f, "per-layer embeddings: %s", c->hidden_size_per_layer_input ? "" : "none\n");
    if (c->hidden_size_per_layer_input) fprintf(f, "%d per layer\n", c->hidden_size_per_layer_input);
    if (c->enable_moe_block)
        fprintf(f, "moe: %d experts, top %d, width %d\n", c->num_experts, c->top_k_experts, c->moe_intermediate_size);
    fprintf(f, "kv sharing: %d owner layers (slots), %d reader layers from layer %d\n", p->n_slots,
            p->n_layers - p->first_shared, p->first_shared);
    for (i = 0; i < p->n_layers; i++) {
        const g4_layer_plan *lp = &p->layer[i];
        fprintf(f, "layer %d %s head_dim %d kv_heads %d ", i, lp->type == G4_FULL ? "full" : "sliding", lp->head_dim,
                lp->kv_heads);
        if (lp->reads < 0) fprintf(f, "owner");
        else fprintf(f, "reads %d", lp->reads);
        fprintf(f, " mlp %d\n", lp->mlp_width);
    }
}

/* ---------------------------------------------------------- safetensors */
/* File layout: u64 little-endian N, N bytes of JSON header, then the data.
   Header: {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]},
   "__metadata__": {...}}; offsets are relative to the data. Every number is
   checked before it is used: the file is untrusted. */

struct g4__file {
    char *path;
    unsigned char *bytes;    /* the whole file, mapped or read */
    size_t size;
    int mapped;
    g4__json header;         /* owns the tensor-name strings */
};

struct g4__stinfo {
    const char *name;
    int file;
    uint64_t begin, end;     /* offsets in the file's data section */
    g4_tensor t;
};

#define G4__MAX_HEADER ((uint64_t)256 << 20)

static g4_result g4__file_open(g4__file *f, const char *path, char *err) {
    memset(f, 0, sizeof *f);
    f->path = g4__strdup(path);
    if (!f->path) { g4__seterr(err, "out of memory"); return G4_ERR_NOMEM; }
#if G4__MMAP
    {
        struct stat st;
        void *p;
        int fd = open(path, O_RDONLY);
        if (fd < 0) { g4__seterr(err, "%s: cannot open", path); return G4_ERR_IO; }
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            g4__seterr(err, "%s: not a regular file", path);
            return G4_ERR_IO;
        }
        f->size = (size_t)st.st_size;
        if (f->size == 0) { close(fd); return G4_OK; }
        p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (p == MAP_FAILED) { g4__seterr(err, "%s: mmap failed", path); return G4_ERR_IO; }
        f->bytes = (unsigned char *)p;
        f->mapped = 1;
        return G4_OK;
    }
#else
    {
        char *buf;
        g4_result r = g4__read_file(path, &buf, &f->size, (size_t)-1 / 2, err);
        f->bytes = (unsigned char *)buf;
        return r;
    }
#endif
}

static void g4__file_close(g4__file *f) {
#if G4__MMAP
    if (f->mapped && f->bytes) munmap(f->bytes, f->size);
    else
#endif
        G4_FREE(f->bytes);
    g4__json_free(&f->header);
    G4_FREE(f->path);
    memset(f, 0, sizeof *f);
}

static g4_dtype g4__dtype_from(const char *s) {
    if (strcmp(s, "F32") == 0) return G4_F32;
    if (strcmp(s, "F16") == 0) return G4_F16;
    if (strcmp(s, "BF16") == 0) return G4_BF16;
    if (strcmp(s, "I32") == 0) return G4_I32;
    if (strcmp(s, "I64") == 0) return G4_I64;
    return G4_DTYPE_OTHER;
}

static int g4__st_cmp_name(const void *a, const void *b) {
    return strcmp(((const g4__stinfo *)a)->name, ((const g4__stinfo *)b)->name);
}

static int g4__st_cmp_offset(const void *a, const void *b) {
    const g4__stinfo *x = *(const g4__stinfo *const *)a, *y = *(const g4__stinfo *const *)b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* Parses file `fi`'s header and appends its tensors to the list. */
static g4_result g4__st_parse(g4__file *f, int fi, g4__stinfo **list, int *n, int *cap, char *err) {
    uint64_t hlen = 0, data_size;
    const unsigned char *data;
    g4__json *j = &f->header;
    g4_result r;
    int e, i;
    if (f->size < 8) {
        g4__seterr(err, "%s: %lu bytes; a safetensors file starts with an 8-byte header length", f->path,
                   (unsigned long)f->size);
        return G4_ERR_SAFETENSORS;
    }
    for (i = 7; i >= 0; i--) hlen = (hlen << 8) | f->bytes[i];
    if (hlen > f->size - 8 || hlen > G4__MAX_HEADER || hlen < 2) {
        g4__seterr(err, "%s: header length %llu does not fit the file (%lu bytes)", f->path, (unsigned long long)hlen,
                   (unsigned long)f->size);
        return G4_ERR_SAFETENSORS;
    }
    if ((r = g4__json_parse(j, (const char *)f->bytes + 8, (size_t)hlen, f->path, err)) != G4_OK)
        return r == G4_ERR_JSON ? G4_ERR_SAFETENSORS : r;
    if (j->nodes[0].type != G4__JOBJ) {
        g4__seterr(err, "%s: the header must be a JSON object", f->path);
        return G4_ERR_SAFETENSORS;
    }
    data = f->bytes + 8 + hlen;
    data_size = f->size - 8 - hlen;
    for (e = j->nodes[0].child; e >= 0; e = j->nodes[e].next) {
        const char *name = j->nodes[e].key;
        int dt, sh, off, d, k;
        g4__stinfo *st;
        uint64_t numel = 1, esz;
        if (strcmp(name, "__metadata__") == 0) continue;
        if (j->nodes[e].type != G4__JOBJ) {
            g4__seterr(err, "%s: tensor '%.200s': entry must be an object", f->path, name);
            return G4_ERR_SAFETENSORS;
        }
        if (*n >= *cap) {
            int ncap = *cap ? *cap * 2 : 256;
            g4__stinfo *nl = (g4__stinfo *)G4_MALLOC(sizeof(g4__stinfo) * (size_t)ncap);
            if (!nl) { g4__seterr(err, "out of memory"); return G4_ERR_NOMEM; }
            if (*n) memcpy(nl, *list, sizeof(g4__stinfo) * (size_t)*n);
            G4_FREE(*list);
            *list = nl;
            *cap = ncap;
        }
        st = &(*list)[*n];
        memset(st, 0, sizeof *st);
        st->name = name;
        st->file = fi;
        dt = g4__jget(j, e, "dtype");
        sh = g4__jget(j, e, "shape");
        off = g4__jget(j, e, "data_offsets");
        if (dt < 0 || j->nodes[dt].type != G4__JSTR) {
            g4__seterr(err, "%s: tensor '%.200s' has no dtype string", f->path, name);
            return G4_ERR_SAFETENSORS;
        }
        st->t.dtype = g4__dtype_from(j->nodes[dt].str);
        if (sh < 0 || j->nodes[sh].type != G4__JARR || j->nodes[sh].count > 8) {
            g4__seterr(err, "%s: tensor '%.200s' needs a shape array of at most 8 dims", f->path, name);
            return G4_ERR_SAFETENSORS;
        }
        st->t.ndim = j->nodes[sh].count;
        for (k = 0, d = j->nodes[sh].child; d >= 0; d = j->nodes[d].next, k++) {
            const g4__jnode *v = &j->nodes[d];
            if (v->type != G4__JNUM || !v->is_int || v->ival < 0 || v->ival > ((int64_t)1 << 40)) {
                g4__seterr(err, "%s: tensor '%.200s': shape[%d] is not an integer in [0, 2^40]", f->path, name, k);
                return G4_ERR_SAFETENSORS;
            }
            st->t.shape[k] = v->ival;
            if (v->ival && numel > ((uint64_t)1 << 62) / (uint64_t)v->ival) {
                g4__seterr(err, "%s: tensor '%.200s': element count overflows", f->path, name);
                return G4_ERR_SAFETENSORS;
            }
            numel *= (uint64_t)v->ival;
        }
        if (off < 0 || j->nodes[off].type != G4__JARR || j->nodes[off].count != 2) {
            g4__seterr(err, "%s: tensor '%.200s' needs data_offsets [begin, end]", f->path, name);
            return G4_ERR_SAFETENSORS;
        }
        {
            const g4__jnode *b = &j->nodes[j->nodes[off].child], *en = &j->nodes[b->next];
            if (b->type != G4__JNUM || !b->is_int || en->type != G4__JNUM || !en->is_int || b->ival < 0 ||
                en->ival < b->ival || (uint64_t)en->ival > data_size) {
                g4__seterr(err, "%s: tensor '%.200s': data_offsets must satisfy 0 <= begin <= end <= %llu (data size)",
                           f->path, name, (unsigned long long)data_size);
                return G4_ERR_SAFETENSORS;
            }
            st->begin = (uint64_t)b->ival;
            st->end = (uint64_t)en->ival;
        }
        esz = g4__dtype_size(st->t.dtype);
        if (esz && st->end - st->begin != numel * esz) {
            g4__seterr(err, "%s: tensor '%.200s': %llu bytes of data, but its shape and dtype need %llu", f->path, name,
                       (unsigned long long)(st->end - st->begin), (unsigned long long)(numel * esz));
            return G4_ERR_SAFETENSORS;
        }
        st->t.data = data + st->begin;
        (*n)++;
    }
    return G4_OK;
}

/* After all files are parsed: sort by name, reject duplicates and overlaps. */
static g4_result g4__st_finish(g4_model *m) {
    int i;
    g4__stinfo **byoff;
    qsort(m->tensors, (size_t)m->n_tensors, sizeof(g4__stinfo), g4__st_cmp_name);
    for (i = 1; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i - 1].name, m->tensors[i].name) == 0) {
            g4__seterr(m->error, "tensor '%.200s' appears twice (%s and %s)", m->tensors[i].name,
                       m->files[m->tensors[i - 1].file].path, m->files[m->tensors[i].file].path);
            return G4_ERR_SAFETENSORS;
        }
    if (m->n_tensors < 2) return G4_OK;
    byoff = (g4__stinfo **)G4_MALLOC(sizeof(g4__stinfo *) * (size_t)m->n_tensors);
    if (!byoff) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
    for (i = 0; i < m->n_tensors; i++) byoff[i] = &m->tensors[i];
    qsort(byoff, (size_t)m->n_tensors, sizeof(g4__stinfo *), g4__st_cmp_offset);
    for (i = 1; i < m->n_tensors; i++) {
        const g4__stinfo *a = byoff[i - 1], *b = byoff[i];
        if (a->file == b->file && b->begin < a->end && b->begin != b->end) {
            g4__seterr(m->error, "%s: tensors '%.200s' and '%.200s' overlap", m->files[a->file].path, a->name, b->name);
            G4_FREE(byoff);
            return G4_ERR_SAFETENSORS;
        }
    }
    G4_FREE(byoff);
    return G4_OK;
}

static const g4__stinfo *g4__st_find(const g4_model *m, const char *name) {
    g4__stinfo key;
    if (!m->tensors) return NULL;
    key.name = name;
    return (const g4__stinfo *)bsearch(&key, m->tensors, (size_t)m->n_tensors, sizeof(g4__stinfo), g4__st_cmp_name);
}

G4__DEF const g4_tensor *g4_model_tensor(const g4_model *m, const char *name) {
    const g4__stinfo *st = m && name ? g4__st_find(m, name) : NULL;
    return st ? &st->t : NULL;
}

/* --------------------------------------------------------- model loading */

static char *g4__join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = (char *)G4_MALLOC(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int g4__exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

static g4_result g4__add_file(g4_model *m, const char *dir, const char *name) {
    char *path = g4__join(dir, name);
    g4__file *nf;
    g4_result r;
    if (!path) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
    nf = (g4__file *)G4_MALLOC(sizeof(g4__file) * (size_t)(m->n_files + 1));
    if (!nf) { G4_FREE(path); g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
    if (m->n_files) memcpy(nf, m->files, sizeof(g4__file) * (size_t)m->n_files);
    G4_FREE(m->files);
    m->files = nf;
    r = g4__file_open(&m->files[m->n_files], path, m->error);
    G4_FREE(path);
    m->n_files++;
    if (r != G4_OK) return r;
    return g4__st_parse(&m->files[m->n_files - 1], m->n_files - 1, &m->tensors, &m->n_tensors, &m->tensors_cap,
                        m->error);
}

/* A shard name from model.safetensors.index.json: a plain file name inside
   the model directory. Anything with a path separator or ".." is refused. */
static int g4__safe_shard_name(const char *s) {
    if (!*s || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return 0;
    for (; *s; s++)
        if (*s == '/' || *s == '\\' || *s == ':') return 0;
    return 1;
}

static g4_result g4__load_index(g4_model *m, const char *dir, const char *index_path) {
    char *text;
    size_t len;
    g4__json j;
    g4_result r;
    int wm, e, k, n_names = 0;
    const char **names;
    if ((r = g4__read_file(index_path, &text, &len, 256u << 20, m->error)) != G4_OK) return r;
    r = g4__json_parse(&j, text, len, index_path, m->error);
    if (r != G4_OK) { G4_FREE(text); return r; }
    wm = g4__jget(&j, 0, "weight_map");
    if (wm < 0 || j.nodes[wm].type != G4__JOBJ) {
        g4__seterr(m->error, "%s: needs a \"weight_map\" object", index_path);
        r = G4_ERR_SAFETENSORS;
        goto done;
    }
    names = (const char **)G4_MALLOC(sizeof(char *) * (size_t)(j.nodes[wm].count + 1));
    if (!names) { g4__seterr(m->error, "out of memory"); r = G4_ERR_NOMEM; goto done; }
    for (e = j.nodes[wm].child; e >= 0; e = j.nodes[e].next) {
        const g4__jnode *v = &j.nodes[e];
        if (v->type != G4__JSTR) {
            g4__seterr(m->error, "%s: weight_map[\"%.200s\"] must be a file name", index_path, v->key);
            r = G4_ERR_SAFETENSORS;
            break;
        }
        if (!g4__safe_shard_name(v->str)) {
            g4__seterr(m->error, "%s: shard \"%.200s\" (for '%.200s') is not a plain file name in the model directory; refused",
                       index_path, v->str, v->key);
            r = G4_ERR_SAFETENSORS;
            break;
        }
        for (k = 0; k < n_names; k++)
            if (strcmp(names[k], v->str) == 0) break;
        if (k == n_names) names[n_names++] = v->str;
    }
    for (k = 0; r == G4_OK && k < n_names; k++) r = g4__add_file(m, dir, names[k]);
    if (r == G4_OK && n_names == 0) {
        g4__seterr(m->error, "%s: weight_map is empty", index_path);
        r = G4_ERR_SAFETENSORS;
    }
    if (r == G4_OK) { /* every tensor the index lists must be in its shard */
        qsort(m->tensors, (size_t)m->n_tensors, sizeof(g4__stinfo), g4__st_cmp_name);
        for (e = j.nodes[wm].child; e >= 0; e = j.nodes[e].next) {
            const g4__stinfo *st = g4__st_find(m, j.nodes[e].key);
            if (!st || strcmp(m->files[st->file].path + strlen(dir) + 1, j.nodes[e].str) != 0) {
                g4__seterr(m->error, "%s lists tensor '%.200s' in %s, but that shard does not have it", index_path,
                           j.nodes[e].key, j.nodes[e].str);
                r = G4_ERR_SAFETENSORS;
                break;
            }
        }
    }
    G4_FREE((void *)names);
done:
    g4__json_free(&j);
    G4_FREE(text);
    return r;
}

/* Looks up prefix+name; checks float dtype and the exact shape. dims: ndim
   values. A missing optional tensor leaves *t zeroed. */
static g4_result g4__bind(g4_model *m, g4_tensor *t, int required, const char *suffix, int layer, int ndim,
                          int64_t d0, int64_t d1, int64_t d2) {
    char name[256];
    const g4__stinfo *st;
    int64_t want[3];
    int k, ok;
    want[0] = d0; want[1] = d1; want[2] = d2;
    if (layer >= 0) {
        char tmp[200];
        snprintf(tmp, sizeof tmp, "layers.%d.%s", layer, suffix);
        snprintf(name, sizeof name, "%s%s", m->prefix, tmp);
    } else if (strcmp(suffix, "lm_head.weight") == 0) {
        snprintf(name, sizeof name, "lm_head.weight");
    } else {
        snprintf(name, sizeof name, "%s%s", m->prefix, suffix);
    }
    memset(t, 0, sizeof *t);
    st = g4__st_find(m, name);
    if (!st) {
        if (!required) return G4_OK;
        if (ndim == 1) g4__seterr(m->error, "checkpoint has no tensor '%s' (expected [%lld])", name, (long long)d0);
        else if (ndim == 2)
            g4__seterr(m->error, "checkpoint has no tensor '%s' (expected [%lld, %lld])", name, (long long)d0,
                       (long long)d1);
        else
            g4__seterr(m->error, "checkpoint has no tensor '%s' (expected [%lld, %lld, %lld])", name, (long long)d0,
                       (long long)d1, (long long)d2);
        return G4_ERR_WEIGHTS;
    }
    if (st->t.dtype != G4_F32 && st->t.dtype != G4_F16 && st->t.dtype != G4_BF16) {
        g4__seterr(m->error, "%s: tensor '%s' must be BF16, F16 or F32", m->files[st->file].path, name);
        return G4_ERR_WEIGHTS;
    }
    ok = st->t.ndim == ndim;
    for (k = 0; ok && k < ndim; k++) ok = st->t.shape[k] == want[k];
    if (!ok) {
        char got[128] = "", exp[96] = "";
        size_t gl = 0, el = 0;
        for (k = 0; k < st->t.ndim && gl < sizeof got - 24; k++)
            gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s%lld", k ? ", " : "", (long long)st->t.shape[k]);
        for (k = 0; k < ndim; k++)
            el += (size_t)snprintf(exp + el, sizeof exp - el, "%s%lld", k ? ", " : "", (long long)want[k]);
        g4__seterr(m->error, "%s: tensor '%s' has shape [%s], expected [%s]", m->files[st->file].path, name, got, exp);
        return G4_ERR_WEIGHTS;
    }
    *t = st->t;
    return G4_OK;
}

static g4_result g4__bind_weights(g4_model *m) {
    const g4_config *c = &m->config;
    const g4_plan *p = &m->plan;
    g4_weights *w = &m->w;
    int64_t H = c->hidden_size, V = c->vocab_size, NH = c->num_attention_heads, L = c->num_hidden_layers;
    int64_t P = c->hidden_size_per_layer_input;
    g4_result r;
    int i;
    /* which of the two naming schemes this checkpoint uses */
    if (g4__st_find(m, "model.language_model.embed_tokens.weight")) strcpy(m->prefix, "model.language_model.");
    else if (g4__st_find(m, "model.embed_tokens.weight")) strcpy(m->prefix, "model.");
    else {
        g4__seterr(m->error, "checkpoint has neither 'model.language_model.embed_tokens.weight' nor "
                   "'model.embed_tokens.weight'");
        return G4_ERR_WEIGHTS;
    }
#define G4__B(t, req, name, layer, nd, a, b, cc) \
    do { if ((r = g4__bind(m, t, req, name, layer, nd, a, b, cc)) != G4_OK) return r; } while (0)
    G4__B(&w->embed_tokens, 1, "embed_tokens.weight", -1, 2, V, H, 0);
    G4__B(&w->norm, 1, "norm.weight", -1, 1, H, 0, 0);
    if (c->tie_word_embeddings) w->lm_head = w->embed_tokens;
    else G4__B(&w->lm_head, 1, "lm_head.weight", -1, 2, V, H, 0);
    if (P) {
        G4__B(&w->embed_tokens_per_layer, 1, "embed_tokens_per_layer.weight", -1, 2, c->vocab_size_per_layer_input,
              L * P, 0);
        G4__B(&w->per_layer_model_projection, 1, "per_layer_model_projection.weight", -1, 2, L * P, H, 0);
        G4__B(&w->per_layer_projection_norm, 1, "per_layer_projection_norm.weight", -1, 1, P, 0, 0);
    }
    w->layers = (g4_layer_weights *)G4_MALLOC(sizeof(g4_layer_weights) * (size_t)L);
    if (!w->layers) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
    memset(w->layers, 0, sizeof(g4_layer_weights) * (size_t)L);
    for (i = 0; i < L; i++) {
        const g4_layer_plan *lp = &p->layer[i];
        g4_layer_weights *lw = &w->layers[i];
        int64_t D = lp->head_dim, KV = lp->kv_heads, I = lp->mlp_width;
        G4__B(&lw->input_layernorm, 1, "input_layernorm.weight", i, 1, H, 0, 0);
        G4__B(&lw->post_attention_layernorm, 1, "post_attention_layernorm.weight", i, 1, H, 0, 0);
        G4__B(&lw->pre_feedforward_layernorm, 1, "pre_feedforward_layernorm.weight", i, 1, H, 0, 0);
        G4__B(&lw->post_feedforward_layernorm, 1, "post_feedforward_layernorm.weight", i, 1, H, 0, 0);
        G4__B(&lw->layer_scalar, 1, "layer_scalar", i, 1, 1, 0, 0);
        G4__B(&lw->q_proj, 1, "self_attn.q_proj.weight", i, 2, NH * D, H, 0);
        G4__B(&lw->q_norm, 1, "self_attn.q_norm.weight", i, 1, D, 0, 0);
        G4__B(&lw->o_proj, 1, "self_attn.o_proj.weight", i, 2, H, NH * D, 0);
        if (lp->reads < 0) { /* readers' k/v/k_norm may be in the file (stale); never bound, never read */
            G4__B(&lw->k_proj, 1, "self_attn.k_proj.weight", i, 2, KV * D, H, 0);
            G4__B(&lw->k_norm, 1, "self_attn.k_norm.weight", i, 1, D, 0, 0);
            if (lp->has_v_proj) G4__B(&lw->v_proj, 1, "self_attn.v_proj.weight", i, 2, KV * D, H, 0);
        }
        G4__B(&lw->gate_proj, 1, "mlp.gate_proj.weight", i, 2, I, H, 0);
        G4__B(&lw->up_proj, 1, "mlp.up_proj.weight", i, 2, I, H, 0);
        G4__B(&lw->down_proj, 1, "mlp.down_proj.weight", i, 2, H, I, 0);
        if (P) {
            G4__B(&lw->per_layer_input_gate, 1, "per_layer_input_gate.weight", i, 2, P, H, 0);
            G4__B(&lw->per_layer_projection, 1, "per_layer_projection.weight", i, 2, H, P, 0);
            G4__B(&lw->post_per_layer_input_norm, 1, "post_per_layer_input_norm.weight", i, 1, H, 0, 0);
        }
        if (lp->moe) {
            int64_t E = c->num_experts, Ie = c->moe_intermediate_size;
            G4__B(&lw->router_proj, 1, "router.proj.weight", i, 2, E, H, 0);
            G4__B(&lw->router_scale, 1, "router.scale", i, 1, H, 0, 0);
            G4__B(&lw->router_per_expert_scale, 1, "router.per_expert_scale", i, 1, E, 0, 0);
            G4__B(&lw->experts_gate_up, 1, "experts.gate_up_proj", i, 3, E, 2 * Ie, H);
            G4__B(&lw->experts_down, 1, "experts.down_proj", i, 3, E, H, Ie);
            G4__B(&lw->pre_feedforward_layernorm_2, 1, "pre_feedforward_layernorm_2.weight", i, 1, H, 0, 0);
            G4__B(&lw->post_feedforward_layernorm_1, 1, "post_feedforward_layernorm_1.weight", i, 1, H, 0, 0);
            G4__B(&lw->post_feedforward_layernorm_2, 1, "post_feedforward_layernorm_2.weight", i, 1, H, 0, 0);
        }
    }
#undef G4__B
    return G4_OK;
}

G4__DEF void g4_model_free(g4_model *m) {
    int i;
    if (!m) return;
    for (i = 0; i < m->n_files; i++) g4__file_close(&m->files[i]);
    G4_FREE(m->files);
    G4_FREE(m->tensors);
    G4_FREE(m->w.layers);
    m->files = NULL;
    m->tensors = NULL;
    m->w.layers = NULL;
    m->n_files = m->n_tensors = 0;
}

G4__DEF g4_result g4_model_load(g4_model *m, const char *dir) {
    char *path;
    g4_result r;
    if (!m) return G4_ERR_INPUT;
    memset(m, 0, sizeof *m);
    if (!dir) { g4__seterr(m->error, "NULL model path"); return G4_ERR_INPUT; }
    if (!(path = g4__join(dir, "config.json"))) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
    r = g4_config_load(&m->config, path);
    G4_FREE(path);
    if (r != G4_OK) { memcpy(m->error, m->config.error, G4_ERROR_MAX); return r; }
    if ((r = g4_plan_build(&m->plan, &m->config)) != G4_OK) {
        snprintf(m->error, G4_ERROR_MAX, "%s/config.json: %.400s", dir, m->plan.error);
        return r;
    }
    if (!(path = g4__join(dir, "model.safetensors.index.json"))) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
    if (g4__exists(path)) r = g4__load_index(m, dir, path);
    else r = g4__add_file(m, dir, "model.safetensors");
    G4_FREE(path);
    if (r == G4_OK) r = g4__st_finish(m);
    if (r == G4_OK) r = g4__bind_weights(m);
    if (r != G4_OK) {
        char msg[G4_ERROR_MAX];
        memcpy(msg, m->error, G4_ERROR_MAX);
        g4_model_free(m);
        memcpy(m->error, msg, G4_ERROR_MAX);
    }
    return r;
}

/* -------------------------------------------------------------- session */

G4__DEF g4_session_config g4_session_config_init(void) {
    g4_session_config c;
    memset(&c, 0, sizeof c);
    c.max_chunk = 64;
    return c;
}

/* Carves every session buffer from `base` (or only counts when base is NULL);
   the same walk sizes and fills the arena, so the two cannot disagree. */
typedef struct {
    unsigned char *base;
    uint64_t off;
    int overflow;
} g4__carver;

static float *g4__take(g4__carver *cv, uint64_t count, size_t elem) {
    uint64_t bytes = count * elem, start = (cv->off + 63) & ~(uint64_t)63;
    if (count && bytes / count != elem) cv->overflow = 1;
    if (start + bytes < start || start + bytes > ((uint64_t)1 << 46)) cv->overflow = 1;
    cv->off = start + bytes;
    return cv->base && !cv->overflow ? (float *)(void *)(cv->base + start) : NULL;
}

static int g4__slot_capacity(const g4_model *m, int type, int max_context, int rows) {
    int64_t cap = (int64_t)m->config.sliding_window - 1 + rows;
    if (type == G4_FULL || cap > max_context) return max_context;
    return (int)cap;
}

static void g4__carve(g4_session *s, const g4_model *m, const g4_session_config *cfg, g4__carver *cv) {
    const g4_config *c = &m->config;
    const g4_plan *p = &m->plan;
    uint64_t rows = (uint64_t)cfg->max_chunk, H = (uint64_t)c->hidden_size, NH = (uint64_t)c->num_attention_heads;
    uint64_t dmax = 0, kvw = 0, imax = 0, P = (uint64_t)c->hidden_size_per_layer_input;
    int i, n_slots = p->n_slots, next;
    for (i = 0; i < p->n_layers; i++) {
        const g4_layer_plan *lp = &p->layer[i];
        if ((uint64_t)lp->head_dim > dmax) dmax = (uint64_t)lp->head_dim;
        if ((uint64_t)lp->kv_heads * (uint64_t)lp->head_dim > kvw) kvw = (uint64_t)lp->kv_heads * (uint64_t)lp->head_dim;
        if ((uint64_t)lp->mlp_width > imax) imax = (uint64_t)lp->mlp_width;
        if (cfg->reader_copies && lp->reads >= 0) n_slots++;
    }
    if (c->enable_moe_block && (uint64_t)c->moe_intermediate_size * 2 > imax) imax = (uint64_t)c->moe_intermediate_size * 2;
    s->n_slots = n_slots;
    s->slots = (g4_kv_slot *)(void *)g4__take(cv, (uint64_t)n_slots, sizeof(g4_kv_slot));
    s->layer_slot = (int *)(void *)g4__take(cv, (uint64_t)p->n_layers, sizeof(int));
    next = p->n_slots;
    for (i = 0; i < p->n_layers; i++) { /* K/V storage: owners only (and reader copies in debug mode) */
        const g4_layer_plan *lp = &p->layer[i];
        int own = lp->reads < 0 || cfg->reader_copies, slot = lp->reads < 0 ? lp->kv_slot : next;
        int cap = g4__slot_capacity(m, lp->type, cfg->max_context, cfg->max_chunk);
        float *k, *v;
        if (!own) { if (s->layer_slot) s->layer_slot[i] = lp->kv_slot; continue; }
        if (lp->reads >= 0) next++;
        k = g4__take(cv, (uint64_t)cap * (uint64_t)lp->kv_heads * (uint64_t)lp->head_dim, sizeof(float));
        v = g4__take(cv, (uint64_t)cap * (uint64_t)lp->kv_heads * (uint64_t)lp->head_dim, sizeof(float));
        if (s->slots) {
            g4_kv_slot *sl = &s->slots[slot];
            sl->writer = i;
            sl->type = lp->type;
            sl->kv_heads = lp->kv_heads;
            sl->head_dim = lp->head_dim;
            sl->capacity = cap;
            sl->n_pos = 0;
            sl->k = k;
            sl->v = v;
            s->layer_slot[i] = slot;
        }
    }
    s->x = g4__take(cv, rows * H, sizeof(float));
    s->xn = g4__take(cv, rows * H, sizeof(float));
    s->branch = g4__take(cv, rows * H, sizeof(float));
    s->branch2 = g4__take(cv, rows * H, sizeof(float));
    s->q = g4__take(cv, rows * NH * dmax, sizeof(float));
    s->att = g4__take(cv, rows * NH * dmax, sizeof(float));
    s->k_new = g4__take(cv, rows * kvw, sizeof(float));
    s->v_new = g4__take(cv, rows * kvw, sizeof(float));
    s->scores = g4__take(cv, (uint64_t)cfg->max_context, sizeof(float));
    s->gate = g4__take(cv, rows * imax, sizeof(float));
    s->up = g4__take(cv, rows * imax, sizeof(float));
    s->pli = g4__take(cv, rows * (uint64_t)c->num_hidden_layers * P, sizeof(float));
    s->ple = g4__take(cv, rows * P, sizeof(float));
    s->router = g4__take(cv, (uint64_t)c->num_experts, sizeof(float));
    s->moe_y = g4__take(cv, H, sizeof(float));
    s->inv_freq[G4_SLIDING] = g4__take(cv, dmax / 2, sizeof(float));
    s->inv_freq[G4_FULL] = g4__take(cv, dmax / 2, sizeof(float));
}

static g4_result g4__check_session_config(const g4_model *m, const g4_session_config *cfg, char *err) {
    if (!m || !cfg || !m->w.layers) { g4__seterr(err, "NULL or unloaded model / config"); return G4_ERR_INPUT; }
    if (cfg->max_context < 1) { g4__seterr(err, "session max_context must be >= 1 (got %d)", cfg->max_context); return G4_ERR_INPUT; }
    if (cfg->max_chunk < 0) { g4__seterr(err, "session max_chunk must be >= 0 (got %d)", cfg->max_chunk); return G4_ERR_INPUT; }
    return G4_OK;
}

static g4_session_config g4__session_defaults(const g4_session_config *cfg) {
    g4_session_config c = *cfg;
    if (c.max_chunk == 0) c.max_chunk = 64;
    if (c.max_chunk > c.max_context) c.max_chunk = c.max_context;
    return c;
}

G4__DEF g4_result g4_session_size(const g4_model *m, const g4_session_config *cfg, size_t *bytes) {
    g4_session tmp;
    g4_session_config c;
    g4__carver cv;
    g4_result r;
    char err[G4_ERROR_MAX];
    if (!bytes) return G4_ERR_INPUT;
    *bytes = 0;
    if ((r = g4__check_session_config(m, cfg, err)) != G4_OK) return r;
    c = g4__session_defaults(cfg);
    memset(&tmp, 0, sizeof tmp);
    memset(&cv, 0, sizeof cv);
    g4__carve(&tmp, m, &c, &cv);
    if (cv.overflow || cv.off + 64 > (uint64_t)(size_t)-1) return G4_ERR_ARENA;
    *bytes = (size_t)cv.off + 64; /* slack: the arena only needs 16-byte alignment */
    return G4_OK;
}

/* RoPE inverse frequencies, in float32 exactly as transformers computes them:
   default: 1/theta^(2j/D) for all D/2 pairs; proportional: the same with the
   full D as denominator for the first int(p*D/2) pairs, 0 for the rest. */
static void g4__rope_init(float *inv_freq, const g4_rope_config *rc, int D) {
    int j, half = D / 2, rot = rc->proportional ? (int)floor((double)rc->partial_rotary_factor * D / 2) : half;
    for (j = 0; j < half; j++) {
        float f = j < rot ? 1.0f / powf(rc->theta, (float)(2 * j) / (float)D) : 0.0f;
        inv_freq[j] = rc->proportional ? f / rc->factor : f;
    }
}

G4__DEF g4_result g4_session_init(g4_session *s, const g4_model *m, const g4_session_config *cfg, void *arena,
                                  size_t arena_bytes) {
    size_t need;
    g4__carver cv;
    g4_session_config c;
    g4_result r;
    int t, i;
    if (!s) return G4_ERR_INPUT;
    memset(s, 0, sizeof *s);
    if ((r = g4__check_session_config(m, cfg, s->error)) != G4_OK) return r;
    if ((r = g4_session_size(m, cfg, &need)) != G4_OK) {
        g4__seterr(s->error, "session for %d positions does not fit in memory", cfg->max_context);
        return r;
    }
    if (!arena) { g4__seterr(s->error, "NULL arena"); return G4_ERR_ARENA; }
    if ((uintptr_t)arena % 16) { g4__seterr(s->error, "arena %p is not 16-byte aligned", arena); return G4_ERR_ARENA; }
    if (arena_bytes < need) {
        g4__seterr(s->error, "arena of %lu bytes is too small: this session needs %lu (g4_session_size)",
                   (unsigned long)arena_bytes, (unsigned long)need);
        return G4_ERR_ARENA;
    }
    c = g4__session_defaults(cfg);
    memset(&cv, 0, sizeof cv);
    cv.base = (unsigned char *)arena + ((64 - (uintptr_t)arena % 64) % 64);
    s->model = m;
    s->cfg = c;
    g4__carve(s, m, &c, &cv);
    for (t = 0; t < 2; t++)
        for (i = 0; i < m->plan.n_layers; i++)
            if (m->plan.layer[i].type == t) { g4__rope_init(s->inv_freq[t], &m->config.rope[t], m->plan.layer[i].head_dim); break; }
    return G4_OK;
}

G4__DEF void g4_session_reset(g4_session *s) {
    int i;
    if (!s || !s->slots) return;
    s->pos = 0;
    for (i = 0; i < s->n_slots; i++) s->slots[i].n_pos = 0;
}

/* -------------------------------------------------------------- kernels */
/* The scalar reference kernels. Everything heavy goes through these few
   functions; faster versions go beside them and are tested against them. */

/* y[t][o] = sum_i x[t][i] * W[o][i] for t < n: x [n][in], W [out][in] as stored. */
static void g4__matmul(float *y, const float *x, const g4_tensor *w, int n) {
    int out = (int)w->shape[0], in = (int)w->shape[1], o, t, i;
    const unsigned char *base = (const unsigned char *)w->data;
    size_t esz = g4__dtype_size(w->dtype);
    for (o = 0; o < out; o++) {
        const unsigned char *row = base + (size_t)o * (size_t)in * esz;
        for (t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * (size_t)in;
            float acc = 0.0f;
            if (w->dtype == G4_BF16) {
                for (i = 0; i < in; i++) {
                    uint16_t h;
                    memcpy(&h, row + 2 * (size_t)i, 2);
                    acc += xt[i] * g4__bf16_to_f32(h);
                }
            } else if (w->dtype == G4_F16) {
                for (i = 0; i < in; i++) {
                    uint16_t h;
                    memcpy(&h, row + 2 * (size_t)i, 2);
                    acc += xt[i] * g4__f16_to_f32(h);
                }
            } else {
                for (i = 0; i < in; i++) {
                    float f;
                    memcpy(&f, row + 4 * (size_t)i, 4);
                    acc += xt[i] * f;
                }
            }
            y[(size_t)t * (size_t)out + (size_t)o] = acc;
        }
    }
}

/* Gemma4RMSNorm: y = x * (mean(x^2) + eps)^-0.5 * w, w used as stored (not 1+w);
   w == NULL is the weightless norm (v_norm, the router's norm). In place is fine. */
static void g4__rmsnorm(float *y, const float *x, const g4_tensor *w, int n, float eps) {
    double ss = 0.0;
    float inv;
    int i;
    for (i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    inv = 1.0f / sqrtf((float)(ss / n) + eps);
    for (i = 0; i < n; i++) y[i] = w ? (x[i] * inv) * g4__get(w, (size_t)i) : x[i] * inv;
}

/* gelu_pytorch_tanh */
static float g4__gelu(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* rotate_half RoPE on one head: element j pairs with j + D/2. Pairs whose
   inv_freq is 0 (proportional RoPE's unrotated part) come out unchanged. */
static void g4__rope(float *x, const float *inv_freq, int D, int pos) {
    int j, half = D / 2;
    for (j = 0; j < half; j++) {
        float a = (float)pos * inv_freq[j], c = cosf(a), s = sinf(a), x1 = x[j], x2 = x[j + half];
        x[j] = x1 * c - x2 * s;
        x[j + half] = x2 * c + x1 * s;
    }
}

static void g4__softmax(float *x, int n) {
    float mx = x[0], sum = 0.0f;
    int i;
    for (i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    for (i = 0; i < n; i++) { x[i] = expf(x[i] - mx); sum += x[i]; }
    for (i = 0; i < n; i++) x[i] /= sum;
}

/* One query head over keys [lo, hi] of a slot: scores = q.k (scale 1.0),
   softmax, out = sum p * v. Keys live in row pos % capacity. */
static void g4__attend(float *out, const float *q, const g4_kv_slot *sl, int kvh, int lo, int hi, float *scores) {
    int D = sl->head_dim, stride = sl->kv_heads * D, k, d;
    for (k = lo; k <= hi; k++) {
        const float *key = sl->k + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D;
        float acc = 0.0f;
        for (d = 0; d < D; d++) acc += q[d] * key[d];
        scores[k - lo] = acc;
    }
    g4__softmax(scores, hi - lo + 1);
    for (d = 0; d < D; d++) out[d] = 0.0f;
    for (k = lo; k <= hi; k++) {
        const float *val = sl->v + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D;
        float p = scores[k - lo];
        for (d = 0; d < D; d++) out[d] += p * val[d];
    }
}

/* --------------------------------------------------------- forward pass */

static void g4__tap(g4_session *s, const char *name, int layer, const float *data, int rows, int cols) {
    char buf[48];
    if (!s->cfg.tap) return;
    if (layer >= 0 && strcmp(name, "layers") == 0) { snprintf(buf, sizeof buf, "layers.%d", layer); name = buf; }
    s->cfg.tap(s->cfg.tap_user, name, layer, data, rows, cols, s->pos);
}

/* Gemma4TextAttention for layer l on n tokens at positions pos0..: reads
   s->xn, writes the o_proj output to s->branch. */
static g4_result g4__attention(g4_session *s, int l, int n) {
    const g4_model *m = s->model;
    const g4_layer_plan *lp = &m->plan.layer[l];
    const g4_layer_weights *lw = &m->w.layers[l];
    const float eps = m->config.rms_norm_eps;
    const float *inv_freq = s->inv_freq[lp->type];
    int NH = m->config.num_attention_heads, D = lp->head_dim, KVH = lp->kv_heads, group = NH / KVH;
    int pos0 = s->pos, t, h;
    g4_kv_slot *sl;

    /* queries: q_proj, q_norm per head, RoPE */
    g4__matmul(s->q, s->xn, &lw->q_proj, n);
    for (t = 0; t < n; t++)
        for (h = 0; h < NH; h++) {
            float *qh = s->q + ((size_t)t * NH + h) * D;
            g4__rmsnorm(qh, qh, &lw->q_norm, D, eps);
            g4__rope(qh, inv_freq, D, pos0 + t);
        }

    if (lp->reads < 0) {
        /* an owner: k_proj (and v_proj, or V = raw K with attention_k_eq_v),
           k_norm + RoPE on K, weightless v_norm on V, then append to its slot */
        sl = &s->slots[lp->kv_slot];
        if (sl->writer != l || sl->n_pos != pos0) {
            g4__seterr(s->error, "internal: layer %d's slot was written out of order", l);
            return G4_ERR_INPUT;
        }
        g4__matmul(s->k_new, s->xn, &lw->k_proj, n);
        if (lp->has_v_proj) g4__matmul(s->v_new, s->xn, &lw->v_proj, n);
        else memcpy(s->v_new, s->k_new, sizeof(float) * (size_t)n * KVH * D);
        for (t = 0; t < n; t++) {
            size_t row = (size_t)((pos0 + t) % sl->capacity) * (size_t)KVH * D;
            for (h = 0; h < KVH; h++) {
                float *kh = s->k_new + ((size_t)t * KVH + h) * D, *vh = s->v_new + ((size_t)t * KVH + h) * D;
                g4__rmsnorm(kh, kh, &lw->k_norm, D, eps);
                g4__rope(kh, inv_freq, D, pos0 + t);
                g4__rmsnorm(vh, vh, NULL, D, eps);
            }
            memcpy(sl->k + row, s->k_new + (size_t)t * KVH * D, sizeof(float) * (size_t)KVH * D);
            memcpy(sl->v + row, s->v_new + (size_t)t * KVH * D, sizeof(float) * (size_t)KVH * D);
        }
        sl->n_pos = pos0 + n;
    } else if (s->layer_slot[l] != lp->kv_slot) {
        /* debug mode (reader_copies): copy this step's rows of the owner's slot
           into the reader's private slot, then read from that */
        const g4_kv_slot *src = &s->slots[lp->kv_slot];
        g4_kv_slot *dst = &s->slots[s->layer_slot[l]];
        for (t = 0; t < n; t++) {
            size_t a = (size_t)((pos0 + t) % src->capacity) * (size_t)KVH * D;
            size_t b = (size_t)((pos0 + t) % dst->capacity) * (size_t)KVH * D;
            memcpy(dst->k + b, src->k + a, sizeof(float) * (size_t)KVH * D);
            memcpy(dst->v + b, src->v + a, sizeof(float) * (size_t)KVH * D);
        }
        dst->n_pos = pos0 + n;
    }

    /* write once, then read: the slot must hold exactly this step's positions */
    sl = &s->slots[s->layer_slot[l]];
    if (sl->n_pos != pos0 + n) {
        g4__seterr(s->error, "internal: layer %d reads slot %d before its writer (layer %d) appended this step", l,
                   s->layer_slot[l], sl->writer);
        return G4_ERR_INPUT;
    }
    for (t = 0; t < n; t++) {
        int p = pos0 + t, lo = 0;
        if (lp->type == G4_SLIDING && p - m->config.sliding_window + 1 > 0) lo = p - m->config.sliding_window + 1;
        for (h = 0; h < NH; h++)
            g4__attend(s->att + ((size_t)t * NH + h) * D, s->q + ((size_t)t * NH + h) * D, sl, h / group, lo, p,
                       s->scores);
    }
    g4__matmul(s->branch, s->att, &lw->o_proj, n);
    return G4_OK;
}

/* Gemma4TextMLP: down(gelu(gate(x)) * up(x)), s->xn -> s->branch */
static void g4__mlp(g4_session *s, int l, int n) {
    const g4_layer_weights *lw = &s->model->w.layers[l];
    size_t i, len = (size_t)n * (size_t)s->model->plan.layer[l].mlp_width;
    g4__matmul(s->gate, s->xn, &lw->gate_proj, n);
    g4__matmul(s->up, s->xn, &lw->up_proj, n);
    for (i = 0; i < len; i++) s->gate[i] = g4__gelu(s->gate[i]) * s->up[i];
    g4__matmul(s->branch, s->gate, &lw->down_proj, n);
}

/* Gemma4TextRouter + Gemma4TextExperts for one token. r: the residual after
   attention (not normed), out: [H]. */
static void g4__moe(g4_session *s, int l, const float *r, float *out) {
    const g4_model *m = s->model;
    const g4_layer_weights *lw = &m->w.layers[l];
    int H = m->config.hidden_size, E = m->config.num_experts, K = m->config.top_k_experts;
    int Ie = m->config.moe_intermediate_size, i, k, e;
    const float eps = m->config.rms_norm_eps, root = (float)(1.0 / sqrt((double)H));
    int top[256];
    float wsum = 0.0f, wk[256];
    float *u = s->moe_y;
    /* router: weightless norm, * scale * H^-0.5, proj, softmax over all experts */
    g4__rmsnorm(u, r, NULL, H, eps);
    for (i = 0; i < H; i++) u[i] = (u[i] * g4__get(&lw->router_scale, (size_t)i)) * root;
    g4__matmul(s->router, u, &lw->router_proj, 1);
    g4__softmax(s->router, E);
    /* top-k by probability (ties: lower expert id first), renormalise, per-expert scale */
    for (k = 0; k < K; k++) {
        int best = -1;
        for (e = 0; e < E; e++) {
            int taken = 0, j;
            for (j = 0; j < k; j++) taken |= top[j] == e;
            if (!taken && (best < 0 || s->router[e] > s->router[best])) best = e;
        }
        top[k] = best;
        wk[k] = s->router[best];
        wsum += wk[k];
    }
    for (k = 0; k < K; k++) wk[k] = (wk[k] / wsum) * g4__get(&lw->router_per_expert_scale, (size_t)top[k]);
    /* experts on pre_feedforward_layernorm_2(r), summed in ascending expert id as transformers does */
    g4__rmsnorm(s->xn, r, &lw->pre_feedforward_layernorm_2, H, eps);
    for (i = 0; i < H; i++) out[i] = 0.0f;
    for (e = 0; e < E; e++) {
        g4_tensor gu = lw->experts_gate_up, dn = lw->experts_down;
        for (k = 0; k < K && top[k] != e; k++) {}
        if (k == K) continue;
        gu.data = (const unsigned char *)gu.data + (size_t)e * 2 * Ie * H * g4__dtype_size(gu.dtype);
        gu.shape[0] = 2 * Ie; gu.shape[1] = H;
        dn.data = (const unsigned char *)dn.data + (size_t)e * H * Ie * g4__dtype_size(dn.dtype);
        dn.shape[0] = H; dn.shape[1] = Ie;
        g4__matmul(s->gate, s->xn, &gu, 1);              /* [gate | up] */
        for (i = 0; i < Ie; i++) s->up[i] = g4__gelu(s->gate[i]) * s->gate[Ie + i];
        g4__matmul(s->moe_y, s->up, &dn, 1);
        for (i = 0; i < H; i++) out[i] += s->moe_y[i] * wk[k];
    }
}

/* Gemma4TextDecoderLayer l on s->x (in place). */
static g4_result g4__layer(g4_session *s, int l, int n) {
    const g4_model *m = s->model;
    const g4_config *c = &m->config;
    const g4_layer_weights *lw = &m->w.layers[l];
    int H = c->hidden_size, P = c->hidden_size_per_layer_input, t;
    size_t i, nh = (size_t)n * H;
    const float eps = c->rms_norm_eps;
    g4_result r;

    /* 1. attention block: h = x + post_attention_layernorm(attn(input_layernorm(x))) */
    for (t = 0; t < n; t++) g4__rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, &lw->input_layernorm, H, eps);
    if ((r = g4__attention(s, l, n)) != G4_OK) return r;
    for (t = 0; t < n; t++) g4__rmsnorm(s->branch + (size_t)t * H, s->branch + (size_t)t * H, &lw->post_attention_layernorm, H, eps);
    for (i = 0; i < nh; i++) s->x[i] += s->branch[i];

    /* 2. feed-forward block on the residual r = x */
    for (t = 0; t < n; t++) g4__rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, &lw->pre_feedforward_layernorm, H, eps);
    g4__mlp(s, l, n);
    if (m->plan.layer[l].moe) { /* 3. m = post_ffw_norm_1(mlp) + post_ffw_norm_2(experts(r)) */
        for (t = 0; t < n; t++) {
            float *m1 = s->branch + (size_t)t * H, *m2 = s->branch2 + (size_t)t * H;
            g4__rmsnorm(m1, m1, &lw->post_feedforward_layernorm_1, H, eps);
            g4__moe(s, l, s->x + (size_t)t * H, m2);
            g4__rmsnorm(m2, m2, &lw->post_feedforward_layernorm_2, H, eps);
            for (i = 0; i < (size_t)H; i++) m1[i] += m2[i];
        }
    }
    /* 4. h = r + post_feedforward_layernorm(m) */
    for (t = 0; t < n; t++) g4__rmsnorm(s->branch + (size_t)t * H, s->branch + (size_t)t * H, &lw->post_feedforward_layernorm, H, eps);
    for (i = 0; i < nh; i++) s->x[i] += s->branch[i];

    /* 5. per-layer input: h += post_per_layer_input_norm(proj(gelu(gate(h)) * pli_l)) */
    if (P) {
        size_t LP = (size_t)c->num_hidden_layers * P;
        int j;
        g4__matmul(s->ple, s->x, &lw->per_layer_input_gate, n);
        for (t = 0; t < n; t++)
            for (j = 0; j < P; j++) {
                float *g = s->ple + (size_t)t * P + j;
                *g = g4__gelu(*g) * s->pli[(size_t)t * LP + (size_t)l * P + j];
            }
        g4__matmul(s->branch, s->ple, &lw->per_layer_projection, n);
        for (t = 0; t < n; t++) g4__rmsnorm(s->branch + (size_t)t * H, s->branch + (size_t)t * H, &lw->post_per_layer_input_norm, H, eps);
        for (i = 0; i < nh; i++) s->x[i] += s->branch[i];
    }

    /* 6. the whole residual stream is scaled by the learned layer_scalar */
    {
        float ls = g4__get(&lw->layer_scalar, 0);
        for (i = 0; i < nh; i++) s->x[i] *= ls;
    }
    g4__tap(s, "layers", l, s->x, n, H);
    return G4_OK;
}

/* Per-Layer Embeddings for n tokens: pli = (norm(x0 W^T * H^-0.5) + E_ple[id] * sqrt(P)) * 2^-0.5 */
static void g4__per_layer_inputs(g4_session *s, const int32_t *ids, int n) {
    const g4_model *m = s->model;
    const g4_config *c = &m->config;
    int P = c->hidden_size_per_layer_input, L = c->num_hidden_layers, t, l, j;
    size_t LP = (size_t)L * P;
    const float proj_scale = (float)(1.0 / sqrt((double)c->hidden_size)), tok_scale = (float)sqrt((double)P);
    const float combine = (float)(1.0 / sqrt(2.0));
    g4__matmul(s->pli, s->x, &m->w.per_layer_model_projection, n);
    for (t = 0; t < n; t++)
        for (l = 0; l < L; l++) {
            float *v = s->pli + (size_t)t * LP + (size_t)l * P;
            size_t tok = (size_t)ids[t] * LP + (size_t)l * P;
            for (j = 0; j < P; j++) v[j] *= proj_scale;
            g4__rmsnorm(v, v, &m->w.per_layer_projection_norm, P, c->rms_norm_eps);
            for (j = 0; j < P; j++)
                v[j] = (v[j] + g4__get(&m->w.embed_tokens_per_layer, tok + (size_t)j) * tok_scale) * combine;
        }
    g4__tap(s, "per_layer_inputs", -1, s->pli, n, (int)LP);
}

/* One step of n <= max_chunk tokens. Logits rows [first, n) go to out. */
static g4_result g4__step(g4_session *s, const int32_t *ids, int n, float *out, int first) {
    const g4_model *m = s->model;
    const g4_config *c = &m->config;
    int H = c->hidden_size, V = c->vocab_size, t, l, i;
    const float embed_scale = (float)sqrt((double)H); /* sqrt(H) in float32, as transformers in float32 */
    g4_result r;

    /* embedding: E[id] * sqrt(H) */
    for (t = 0; t < n; t++)
        for (i = 0; i < H; i++)
            s->x[(size_t)t * H + i] = g4__get(&m->w.embed_tokens, (size_t)ids[t] * H + (size_t)i) * embed_scale;
    g4__tap(s, "embed", -1, s->x, n, H);
    if (c->hidden_size_per_layer_input) g4__per_layer_inputs(s, ids, n);

    for (l = 0; l < c->num_hidden_layers; l++)
        if ((r = g4__layer(s, l, n)) != G4_OK) return r;

    /* final norm, tied head, soft-cap */
    for (t = 0; t < n; t++) g4__rmsnorm(s->xn + (size_t)t * H, s->x + (size_t)t * H, &m->w.norm, H, c->rms_norm_eps);
    g4__tap(s, "norm", -1, s->xn, n, H);
    if (out && first < n) {
        size_t k, cnt = (size_t)(n - first) * V;
        g4__matmul(out, s->xn + (size_t)first * H, &m->w.lm_head, n - first);
        if (c->final_logit_softcapping > 0.0f)
            for (k = 0; k < cnt; k++)
                out[k] = tanhf(out[k] / c->final_logit_softcapping) * c->final_logit_softcapping;
        g4__tap(s, "logits", -1, out, n - first, V);
    }
    s->pos += n;
    return G4_OK;
}

G4__DEF g4_result g4_forward(g4_session *s, const int32_t *ids, int n, float *logits, int mode) {
    const g4_config *c;
    int i, done;
    if (!s) return G4_ERR_INPUT;
    if (!s->model || !s->slots) { g4__seterr(s->error, "session is not initialised"); return G4_ERR_INPUT; }
    c = &s->model->config;
    if (!ids || n < 1) { g4__seterr(s->error, "no tokens (ids %s, n %d)", ids ? "set" : "NULL", n); return G4_ERR_INPUT; }
    if (mode != G4_LOGITS_NONE && mode != G4_LOGITS_LAST && mode != G4_LOGITS_ALL) {
        g4__seterr(s->error, "unknown logits mode %d", mode);
        return G4_ERR_INPUT;
    }
    if (mode != G4_LOGITS_NONE && !logits) { g4__seterr(s->error, "logits buffer is NULL"); return G4_ERR_INPUT; }
    if (n > s->cfg.max_context - s->pos) {
        g4__seterr(s->error, "%d tokens at position %d exceed the session's max_context of %d", n, s->pos,
                   s->cfg.max_context);
        return G4_ERR_INPUT;
    }
    for (i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= c->vocab_size) {
            g4__seterr(s->error, "token id %ld at index %d is outside the vocabulary [0, %d)", (long)ids[i], i,
                       c->vocab_size);
            return G4_ERR_INPUT;
        }
        if (c->hidden_size_per_layer_input && ids[i] >= c->vocab_size_per_layer_input) {
            g4__seterr(s->error, "token id %ld at index %d is outside the per-layer embedding table [0, %d)",
                       (long)ids[i], i, c->vocab_size_per_layer_input);
            return G4_ERR_INPUT;
        }
    }
    for (done = 0; done < n; done += s->cfg.max_chunk) {
        int cn = n - done < s->cfg.max_chunk ? n - done : s->cfg.max_chunk;
        float *out = NULL;
        int first = 0;
        g4_result r;
        if (mode == G4_LOGITS_ALL) out = logits + (size_t)done * c->vocab_size;
        else if (mode == G4_LOGITS_LAST && done + cn == n) { out = logits; first = cn - 1; }
        if ((r = g4__step(s, ids + done, cn, out, first)) != G4_OK) return r;
    }
    return G4_OK;
}

G4__DEF int32_t g4_argmax(const float *x, int n) {
    int i, best = 0;
    if (!x || n < 1) return -1;
    for (i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

#endif /* GEMMA4_IMPLEMENTATION_DONE */
#endif /* GEMMA4_IMPLEMENTATION */
