/* gemma4.h - the Gemma 4 text decoder in one C header, exactly as Hugging Face
   transformers defines it.                                   MIT-0, see LICENSE

   WHAT IT IS
     A reference implementation of Google's Gemma 4 language models (E2B, E4B,
     31B, 26B-A4B and anything else with a Gemma 4 config.json): config parsing,
     safetensors loading (single file or sharded, read in place), the text
     decoder forward pass on the CPU in float32, and the shared-KV table that
     Gemma 4's later layers read their keys and values from. It is meant to be
     read op by op next to transformers' modeling_gemma4.py.

   MAP
     Every section starts with a banner that ends in ">>name": search the file
     for ">>forward" to jump to the forward pass. In order:
       >>api             the declarations: result codes, config, plan, weights,
                         session (taps, threads, g4_forward), training, towers,
                         sampler, drafter, speculative decoding, CUDA twin
       >>implementation  everything below is compiled only with GEMMA4_IMPLEMENTATION
       >>utilities       errors, float16/bf16 conversion, tensor elements, files, UTF-8
       >>json            the JSON reader (config.json, the shard index, adapter_config.json;
                         tokenizer.json for gemma4_processing.h)
       >>config          config.json -> g4_config (Gemma4TextConfig)
       >>plan            which layers own K/V and which read whose (shared KV)
       >>safetensors     safetensors headers and the shard index
       >>loading         g4_model_load: tensors by transformers' names, shapes
       >>adapter         g4_model_load_adapter: a PEFT LoRA adapter bound to the
                         model's linears as peft binds them
       >>kernels         the scalar reference kernels: bf16 rounding, matmul, dot,
                         gelu; then the backend's entry points, declared
       >>ops             the Gemma ops: activation cast, RMSNorm, RoPE, softmax,
                         attention of one query head; the bf16 mode's torch
                         orders (softmax, top-k ties, attention, gelu's tail)
       >>session         the arena: K/V slots, the shared-KV table, scratch
       >>forward         the model: first its plumbing (taps, the threaded norm and
                         elementwise ops, the shared-KV table), then attention,
                         MLP, MoE, decoder layer, per-layer inputs, the step
       >>vision          multimodal: Gemma4Config's ids and vision_config, the
                         merge of soft tokens into the decoder (g4_forward_mm),
                         the vision tower (Gemma4VisionModel + embed_vision) and
                         a video's frames through it (g4_video_encode)
       >>backward        the training reference: loss, the backward of every op,
                         the shared-KV gradient slots, activation checkpointing
       >>drafter         a Gemma 4 drafter (gemma4_assistant) reading the target
                         session's table; >>speculative: exact speculative decoding
       >>audio           the E2B/E4B audio tower (Gemma4AudioModel) and embed_audio
                         (its feature extractor is in gemma4_processing.h)
       >>sampler         the sampler
       >>backend         after the model, reached through the declarations at the
                         end of >>kernels: SIMD twins (>>simd), the prefill GEMM
                         (>>gemm), the bf16 dot kernel (>>bf16dot), the thread
                         pool and threaded loops (>>threads): the scalar kernels
                         made fast. A first reading can skip it.
       >>regex           the adapter's regular expressions (peft's patterns), a
                         small Thompson NFA engine
       >>unified         the 12B unified model (gemma4_unified): its sub-configs, its
                         encoder-free image and audio embedders (its decoder is >>forward's;
                         its processor is gemma4_processing.h's >>unified_processing)
     The tokenizer, the chat layout and the chat templates live in
     gemma4_processing.h (its own MAP), as transformers keeps processing
     beside modeling.

   SHAPES
     Comments give shapes as [rows][cols] or [a, b]; a weight W is [out, in]
     as stored, and y = x W^T. The letters:
       H    hidden_size                  L    num_hidden_layers
       NH   num_attention_heads          V    vocab_size
       KVH  a layer's key/value heads    P    hidden_size_per_layer_input
       D    a layer's head_dim           E    num_experts
       I    a layer's dense MLP width    K    top_k_experts
            (intermediate_size, doubled  Ie   moe_intermediate_size
            by use_double_wide_mlp)      S    tokens of the current step (rows)
     "max" after a letter (Dmax, KVHmax, Imax) is its largest value over the
     layers; rows is max_chunk, the most tokens in one step.

   GOLDENS
     The tests compare against transformers 5.23.0 with torch 2.15.0 (float32
     CPU, eager attention and experts) on tiny random-weight Gemma 4 models;
     the repository's data/tiny/VERSIONS.txt records the full environment.
     The drafter goldens come from transformers 5.20.2 (5.23.0 cannot build an
     assistant model): data/tiny/DRAFTER_VERSIONS.txt.

   INTEGRATION
     In exactly one C or C++ file:
         #define GEMMA4_IMPLEMENTATION
         #include "gemma4.h"
     Everywhere else just #include "gemma4.h". Link with -lm -lpthread; build
     with -march=native (x86-64) for the SIMD kernels. Options, defined before
     the include:
         GEMMA4_STATIC      make every function static (private to one file)
         G4_NO_MMAP         read weight files with fread instead of mmap
         G4_NO_THREADS      no pthreads (g4_pool_create accepts only 1 thread)
         G4_NO_SIMD         only the scalar reference kernels
         G4_POOL_SPIN       polls a pool thread spins before it sleeps (50000)
         G4_PARALLEL_MIN    smallest job split across the pool, in elements (4096)
         G4_MALLOC/G4_FREE  the allocator of the load functions and g4_session_create
         G4_MAX_LAYERS      most decoder layers a config may have (256)
         G4_TESTING         the test suites' hooks (g4_train_config's
                            debug_drop_reader_kv_grads, gemma4_cuda.cu's g4__cuda_*_testing):
                            define it in every file that includes gemma4.h, or in none
         GEMMA4_CUDA        declare the CUDA twin (gemma4_cuda.cu)

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
         // (or g4_session_create(&s, &model, &sc): the arena allocated for
         //  you, freed by g4_session_destroy(&s))
         int32_t prompt[] = {2, 818, 1010};
         float *logits = malloc(sizeof(float) * model.config.vocab_size);
         g4_forward(&s, prompt, 3, logits, G4_LOGITS_LAST);  // prefill
         int32_t next = g4_argmax(logits, model.config.vocab_size);
         g4_forward(&s, &next, 1, logits, G4_LOGITS_LAST);   // decode one
         free(logits); free(arena); g4_model_free(&model);

   TEXT
     g4_sampler_* samples (greedy, temperature, top-k, top-p, min-p,
     repetition penalty, seeded); it allocates its scratch at init. Text in
     and out - the tokenizer (g4_tokenizer_load, g4_tokenize, g4_detokenize,
     g4_decode_next), the chat layout (g4_chat_encode) and the checkpoint's
     chat template (g4_template_*) - is gemma4_processing.h, included after
     this header:
         #define GEMMA4_IMPLEMENTATION
         #include "gemma4.h"
         #include "gemma4_processing.h"   (the implementation of both)

   MEMORY MODEL
     g4_model_load maps the safetensors files (nothing is converted or copied)
     and allocates a small tensor table. Everything a session needs - the K/V
     storage of the layers that own K/V, the shared-KV table and all scratch -
     lives in ONE caller-provided arena whose size g4_session_size reports
     (g4_session_create allocates it instead, for a caller that does not care
     where it lives; g4_session_destroy frees it). g4_forward never allocates.
     Layers that read another layer's K/V (Gemma 4's "KV-shared" layers) get
     no storage: they hold a slot index into the table.
     Print the plan (g4_plan_print) to see who owns and who reads what.

   THREAD SAFETY AND THREADS
     A loaded g4_model is read-only: any number of sessions, on any threads,
     may share it. A session must be used by one thread at a time. To run one
     forward on several cores, create a pool (g4_pool_create, yours to free)
     and set g4_session_config.pool; threads never change a result bit.

   NUMERICS
     Activations, K/V and accumulation are float32; weights are read as stored
     (BF16, F16 or F32). This matches transformers run in float32 on the same
     checkpoint (loaded with dtype=torch.float32), to about 1e-5 relative. In
     float32, transformers' embedding scale is sqrt(hidden_size) in float32; the
     bf16-rounded scale (39.25 for E2B) is what it uses when run in bf16.
     g4_session_config.bf16 = 1 rounds to bf16 wherever a bf16 transformers run
     does (eager attention and experts), reproducing it to the last bit on the
     test models. Prefill, chunked prefill and decode give identical bits.
     The mode computes torch's summation order (its AVX2 kernels') on every
     CPU - scalar, AVX2, AVX-512 with or without avx512_bf16, NEON - so the
     same bits everywhere; the towers have the same mode
     (g4_vision_session_config.bf16, g4_audio_run.bf16; docs/bf16.md).
     g4_session_config.bf16_fast = 1 trades that for speed where the build
     has avx512_bf16: VDPBF16PS in the matmuls and attention, its own order
     (tested within 3e-2 of max |value| of each tap of the faithful mode).

   TRAINING
     g4_train_size / g4_train_init / g4_loss_and_grad: transformers' loss
     (model(ids, labels=labels).loss) and its float32 gradient for every
     trained parameter, in one caller arena plus one gradient block; the
     shared-KV gradient flows from readers into their owner's slot, counted.
     recompute = 1 keeps only layer inputs (bit-identical gradients). See
     >>backward and docs/training.md.

   TAPS
     g4_session_config.tap, if set, sees every module output transformers has
     (embed_tokens, layers.<i>.self_attn.q, layers.<i>.mlp, ..., logits; see
     g4_tap_fn), for op-by-op comparison (build/gemma4 compare).

   IMAGES
     g4_vision_encode runs the vision tower on one image's patches (the image
     processor's pixel_values and image_position_ids) into soft tokens, in a
     caller arena (g4_vision_session_size / _init); g4_forward_mm runs the
     decoder on ids whose placeholder rows take those soft tokens, with the
     bidirectional image attention of use_bidirectional_attention "vision".
     Both match transformers' Gemma4ForConditionalGeneration in float32
     (tests/test_vision.c). gemma4_processing.h's g4_image_preprocess turns
     decoded pixels (RGB8 or RGBA8) into those patches exactly as
     Gemma4ImageProcessor does (its torchvision backend; and the 12B's
     Gemma4UnifiedImageProcessor's merged patches), g4_mm_expand expands the
     image and audio placeholders as Gemma4Processor and Gemma4UnifiedProcessor
     do. Decoding PNG/JPEG is the caller's. A video is frames: g4_video_encode
     runs each through the tower (get_video_features), their soft tokens fill
     the video_token_id rows, each frame its own bidirectional block;
     gemma4_processing.h's g4_video_sample_frames, g4_video_preprocess and
     g4_mm_expand_videos are Gemma4VideoProcessor and the processor's "mm:ss"
     frame stamps (docs/vision.md).

   LIMITS
     The text decoder, the vision tower (g4_vision_encode, >>vision), the
     E2B/E4B audio tower (g4_audio_encode, >>audio), their soft tokens merged
     into the decoder by g4_forward_mm (images, video frames, audio), and the
     12B unified model's decoder and encoder-free embedders (>>unified; not
     its video processor; threaded, with the bf16 mode). Batch size 1 per
     session.
     A LoRA adapter may target the towers' linears (g4_model_load_adapter).
     The towers have the bf16 mode (g4_vision_session_config.bf16,
     g4_audio_run.bf16); the CUDA twin does not cover them, and g4_forward_mm
     runs on the CPU.
     Drafters (gemma4_assistant) run on the CPU only.

   ERRORS
     Functions return a g4_result (G4_OK = 0, errors negative); the object that
     failed holds a message naming the file, tensor or field in its .error.
     Nothing in the library exits, prints (except g4_plan_print) or asserts on
     input.
*/
/* ======================================================================== */
/*                                API >>api                                 */
/* ======================================================================== */
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
#define G4_MAX_TOP_K 256 /* most experts a token may choose (top_k_experts) */
#define G4_MAX_EXPERTS 256 /* most experts a MoE layer may have (num_experts: the CPU's top-k works on the stack) */

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

/* ---------------------------------------------------------- audio config */
/* Gemma4AudioConfig: config.json's "audio_config" (E2B, E4B), the audio
   tower's shape (>>audio). present = 0 when the config has none. Absent
   fields take Gemma4AudioConfig's defaults; g4_config_parse refuses a field
   of the wrong type or out of range, naming it. */
typedef struct {
    int present;
    int hidden_size;                   /* Ha (1024); head_dim = Ha / NHa */
    int num_hidden_layers;             /* La (12) conformer layers */
    int num_attention_heads;           /* NHa (8) */
    int subsampling_conv_channels[2];  /* C0, C1 (128, 32); C0 is also the mel bins the tower takes (>>audio) */
    int conv_kernel_size;              /* K (5): the light conv's causal depthwise kernel */
    float residual_weight;             /* the half step of the FFNs (0.5) */
    int attention_chunk_size;          /* 12 */
    int attention_context_left;        /* 13: a frame sees itself and the context_left - 2 before it */
    int attention_context_right;       /* 0 */
    float attention_logit_cap;         /* 50 */
    float attention_invalid_logits_value; /* -1e9: a masked logit */
    int use_clipped_linears;           /* Gemma4ClippableLinear's bounds from the checkpoint */
    float rms_norm_eps;                /* the subsampling LayerNorms, the light conv's and embed_audio's norms */
    float gradient_clipping;           /* the clamps of the residual stream (1e10) */
    int output_proj_dims;              /* Pa (1536): output_proj's width, embed_audio's input */
} g4_audio_config;
/* Gemma4VisionConfig (the vision_config of a "gemma4" config.json). */
typedef struct {
    int present;                  /* 0: no vision tower (vision_config absent or null) */
    int hidden_size, intermediate_size, num_hidden_layers;        /* Hv, Iv, Lv */
    int num_attention_heads, num_key_value_heads, head_dim;       /* NHv, KVHv, Dv (Dv % 4 == 0) */
    int patch_size;               /* p: a patch is p x p x 3 pixel values */
    int pooling_kernel_size;      /* k: k x k patches pool into one soft token */
    int position_embedding_size;  /* rows of each axis of the position table */
    float rms_norm_eps;
    float rope_theta;             /* rope_parameters.rope_theta (axial 2-D RoPE) */
    int use_clipped_linears;      /* Gemma4ClippableLinear bounds are in the checkpoint */
    int standardize;              /* (x - std_bias) * std_scale after pooling */
} g4_vision_config;

/* use_bidirectional_attention */
enum { G4_BIDIR_NONE = 0, G4_BIDIR_VISION = 1, G4_BIDIR_ALL = 2 };
/* The 12B unified model's encoder-free embedders (gemma4_unified: vision_config
   and audio_config of Gemma4UnifiedConfig; >>unified). present 0: absent or null. */
typedef struct {
    int present;
    int patch_size, pooling_kernel_size; /* a merged patch is (patch_size * pooling_kernel_size)^2 * 3 raw values */
    int mm_embed_dim;                    /* D: the patch embedding's width */
    int mm_posemb_size;                  /* positions per axis of pos_embedding [mm_posemb_size][2][D] */
    int output_proj_dims;                /* the multimodal embedder's input width (must equal D) */
    float rms_norm_eps;                  /* the multimodal embedder's RMSNorm */
} g4_unified_vision_config;
typedef struct {
    int present;
    int audio_embed_dim;                 /* = audio_samples_per_token: raw samples per soft token */
    float rms_norm_eps;
} g4_unified_audio_config;

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
    int pad_token_id;                   /* the embeddings' padding_idx (its row gets no lookup gradient); -1: none */
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
    /* model_type "gemma4_assistant" (a drafter, Gemma4AssistantConfig): every
       layer reads the K/V of the target model it is attached to (>>drafter) */
    int assistant;
    int backbone_hidden_size;           /* the target's hidden size */
    int use_ordered_embeddings;         /* logits only for the top-k centroids' tokens */
    int num_centroids, centroid_intermediate_top_k;
    g4_audio_config audio;              /* audio_config (E2B/E4B; >>audio); audio.present 0 when absent */
    /* the multimodal wrapper (Gemma4Config, model_type "gemma4"): its token ids
       (-1 when absent: a text-only config) and towers (>>vision) */
    int image_token_id, video_token_id, audio_token_id; /* placeholder rows (the processor's runs) */
    int boi_token_id, eoi_token_id, boa_token_id, eoa_token_id; /* eoa: "eoa_token_index" */
    int bidirectional;                  /* text_config.use_bidirectional_attention (G4_BIDIR_*) */
    g4_vision_config vision;            /* vision_config (vision.present 0: none) */
    /* model_type "gemma4_unified" or "gemma4_unified_text" (the 12B, Gemma4UnifiedTextConfig): the
       same decoder layer with no per-layer embeddings and no MoE, and (wrapper) the embedders */
    int unified;
    g4_unified_vision_config unified_vision;
    g4_unified_audio_config unified_audio;
    char error[G4_ERROR_MAX];
} g4_config;

/* Parse a config.json text (multimodal "gemma4" wrapper or text-only
   "gemma4_text"; the 12B's "gemma4_unified" wrapper or "gemma4_unified_text";
   legacy global_head_dim keys or per_layer_config). `name` only labels error
   messages. */
G4_API g4_result g4_config_parse(g4_config *c, const char *json, size_t len, const char *name);
G4_API g4_result g4_config_load(g4_config *c, const char *path);

/* ------------------------------------------------------------------ plan */

/* What every layer does, computed once from the config. */
#define G4_READS_TARGET (-2) /* reads the K/V of the target's last owner layer of its type */
typedef struct {
    int type;        /* G4_SLIDING or G4_FULL */
    int head_dim;    /* D */
    int kv_heads;    /* KVH */
    int has_v_proj;  /* 0 on attention_k_eq_v full layers: V = v_norm(k_proj(x)) */
    int reads;       /* -1: owns its K/V; G4_READS_TARGET (a drafter's layer): the
                        target model's; else the owner layer whose K/V it reads */
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

/* G4_I16 is parsed (its size checked) but is never a weight: the gradient goldens store
   quantized gradients in it (tools/make_grad_goldens.py) */
typedef enum { G4_F32 = 0, G4_F16 = 1, G4_BF16 = 2, G4_I32 = 3, G4_I64 = 4, G4_I16 = 5, G4_DTYPE_OTHER = 6 } g4_dtype;

typedef struct g4_lora g4_lora;

typedef struct {
    const void *data;     /* in the mapped file; NULL if absent */
    g4_dtype dtype;
    int ndim;
    int64_t shape[8];
    const g4_lora *lora;  /* a weight a LoRA adapter changes: y = x W^T + scale B (A x); else NULL */
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

/* The 12B unified model's embedders (>>unified), model.embed_vision.* and
   model.embed_audio.*; Pd = 3*(patch_size*pooling_kernel_size)^2, D =
   mm_embed_dim, A = audio_embed_dim. Unset when the config has no such part. */
typedef struct {
    g4_tensor patch_ln1_weight, patch_ln1_bias;     /* [Pd]  nn.LayerNorm */
    g4_tensor patch_dense_weight, patch_dense_bias; /* [D, Pd], [D] */
    g4_tensor patch_ln2_weight, patch_ln2_bias;     /* [D]   nn.LayerNorm */
    g4_tensor pos_embedding;                        /* [mm_posemb_size, 2, D] */
    g4_tensor pos_norm_weight, pos_norm_bias;       /* [D]   nn.LayerNorm */
    g4_tensor vision_projection;                    /* multimodal_embedder.embedding_projection [H, D] */
    g4_tensor audio_projection;                     /* embed_audio.embedding_projection [H, A] */
} g4_unified_weights;

typedef struct {
    g4_tensor embed_tokens;               /* [V, H] */
    g4_tensor embed_tokens_per_layer;     /* [V_ple, L*P]  PLE */
    g4_tensor per_layer_model_projection; /* [L*P, H]      PLE */
    g4_tensor per_layer_projection_norm;  /* [P]           PLE */
    g4_tensor norm;                       /* [H] */
    g4_tensor lm_head;                    /* [V, H]; = embed_tokens when tied */
    g4_layer_weights *layers;             /* [L] */
    /* a drafter (gemma4_assistant) only; Hb = backbone_hidden_size, C = num_centroids */
    g4_tensor pre_projection;             /* [H, 2*Hb] */
    g4_tensor post_projection;            /* [Hb, H] */
    g4_tensor centroids;                  /* [C, H]  ordered embeddings */
    g4_tensor token_ordering;             /* [V] I64/I32, a permutation of the vocabulary */
    g4_unified_weights unified;           /* a gemma4_unified checkpoint's embedders */
} g4_weights;

/* The audio tower's weights (Gemma4AudioModel + embed_audio), bound by
   g4_model_load when the config has an audio_config; names are those under
   model.audio_tower. and model.embed_audio. W is [out, in]. */
typedef struct {                       /* Gemma4ClippableLinear */
    g4_tensor linear;                  /* [out, in], no bias */
    float input_min, input_max, output_min, output_max; /* use_clipped_linears: the checkpoint's
                                          buffers (absent: -inf/inf, as transformers initialises them);
                                          else -inf/inf */
} g4_clippable_linear;

typedef struct {                       /* Gemma4AudioFeedForward */
    g4_tensor pre_layer_norm, post_layer_norm;   /* [Ha] */
    g4_clippable_linear ffw_layer_1;   /* [4 Ha, Ha] */
    g4_clippable_linear ffw_layer_2;   /* [Ha, 4 Ha] */
} g4_audio_ffn;

typedef struct {                       /* Gemma4AudioLayer */
    g4_audio_ffn feed_forward1, feed_forward2;
    g4_tensor norm_pre_attn, norm_post_attn, norm_out;  /* [Ha] */
    /* self_attn (Gemma4AudioAttention) */
    g4_clippable_linear q_proj, k_proj, v_proj, post;   /* [Ha, Ha] */
    g4_tensor relative_k_proj;         /* [Ha, Ha] */
    g4_tensor per_dim_scale;           /* [head_dim] */
    /* lconv1d (Gemma4AudioLightConv1d) */
    g4_tensor lconv_pre_layer_norm, conv_norm;          /* [Ha] */
    g4_clippable_linear linear_start;  /* [2 Ha, Ha] */
    g4_tensor depthwise_conv1d;        /* [Ha, 1, K] */
    g4_clippable_linear linear_end;    /* [Ha, Ha] */
} g4_audio_layer_weights;

typedef struct {
    int loaded;                        /* every tensor below is bound */
    /* subsample_conv_projection */
    g4_tensor layer0_conv, layer0_norm;  /* [C0, 1, 3, 3], [C0] */
    g4_tensor layer1_conv, layer1_norm;  /* [C1, C0, 3, 3], [C1] */
    g4_tensor input_proj_linear;       /* [Ha, (C0/4) C1] */
    g4_audio_layer_weights *layers;    /* [La] */
    g4_tensor output_proj, output_proj_bias;  /* [Pa, Ha], [Pa] */
    g4_tensor embedding_projection;    /* embed_audio: [H, Pa] (H: the text model's hidden size) */
    char error[G4_ERROR_MAX];          /* why not loaded: no audio_config, or the tensor that is missing */
} g4_audio_weights;
/* The vision tower (Gemma4VisionModel + embed_vision), bound by g4_model_load
   when the config has a vision_config and the checkpoint its tensors. Its
   linears are Gemma4ClippableLinear (g4_clippable_linear above). */
typedef struct {
    g4_tensor input_layernorm, post_attention_layernorm;          /* [Hv] */
    g4_tensor pre_feedforward_layernorm, post_feedforward_layernorm; /* [Hv] */
    g4_clippable_linear q_proj;      /* [NHv*Dv, Hv] */
    g4_clippable_linear k_proj, v_proj; /* [KVHv*Dv, Hv] */
    g4_clippable_linear o_proj;      /* [Hv, NHv*Dv] */
    g4_tensor q_norm, k_norm;   /* [Dv] */
    g4_clippable_linear gate_proj, up_proj; /* [Iv, Hv] */
    g4_clippable_linear down_proj;   /* [Hv, Iv] */
} g4_vision_layer;

typedef struct {
    int loaded;                          /* 1: every tensor below is bound */
    g4_tensor input_proj;                /* [Hv, 3 p^2] patch_embedder.input_proj */
    g4_tensor position_embedding_table;  /* [2, position_embedding_size, Hv] */
    g4_vision_layer *layers;             /* [Lv] encoder.layers */
    g4_tensor std_bias, std_scale;       /* [Hv] standardize only */
    g4_tensor embedding_projection;      /* [H, Hv] embed_vision */
    char error[G4_ERROR_MAX];            /* why loaded is 0 */
} g4_vision_weights;

typedef struct g4__file g4__file;
typedef struct g4__stinfo g4__stinfo;

/* One module a LoRA adapter changes (see g4_model_load_adapter). */
struct g4_lora {
    int layer;               /* its decoder layer; -1: per_layer_model_projection or lm_head */
    char module[48];         /* "self_attn.q_proj", "mlp.down_proj", "router.proj", "lm_head", ... */
    char key[160];           /* peft's module key: "model.layers.3.self_attn.q_proj" */
    int r, in, out;          /* A [r, in], B [out, r] */
    float alpha, scale;      /* scale = alpha / r, or alpha / sqrt(r) with use_rslora */
    float *A, *B;            /* float32, owned by the model */
    float *Bt;               /* B transposed, [r, out] (the forward's kernel reads it) */
    const g4_tensor *base;   /* the weight it adds to */
};

typedef struct {
    g4_config config;
    g4_plan plan;
    g4_weights w;
    g4_audio_weights audio;  /* the audio tower, when the config has an audio_config (>>audio) */
    char prefix[32];         /* "model.language_model." or "model." */
    /* the LoRA adapter (g4_model_load_adapter), if any */
    g4_lora *lora; int n_lora;
    int lora_rmax;           /* the largest rank (sizes the sessions' adapter scratch) */
    int lora_ignored;        /* adapter tensors of a vision/audio tower this model has not loaded (not run) */
    g4_vision_weights vision; /* the vision tower, if the checkpoint has one (vision.loaded) */
    /* private */
    g4__file *files; int n_files;
    g4__stinfo *tensors; int n_tensors, tensors_cap;
    char error[G4_ERROR_MAX];
} g4_model;

/* PATH is a checkpoint directory (config.json + model.safetensors or
   model.safetensors.index.json + shards). Allocates; free with g4_model_free
   (which leaves m->error as it is: a failed load frees what it had). */
G4_API g4_result g4_model_load(g4_model *m, const char *path);
G4_API void g4_model_free(g4_model *m);
/* A tensor of the checkpoint by its full name (NULL if absent). */
G4_API const g4_tensor *g4_model_tensor(const g4_model *m, const char *name);

/* A PEFT LoRA adapter directory, as peft's save_pretrained writes it:
   adapter_config.json (peft_type LORA, r, lora_alpha, use_rslora,
   target_modules as a list or a regex, exclude_modules, layers_to_transform,
   layers_pattern, rank_pattern, alpha_pattern) and adapter_model.safetensors
   (base_model.model.<module>.lora_A.weight / .lora_B.weight). The modules are
   chosen as peft chooses them: every nn.Linear of the text model the config
   targets (a module this model lacks - v_proj on an attention_k_eq_v full
   layer, k_proj/v_proj of a KV-shared layer - is not there to target), and
   of the loaded towers: a Gemma4ClippableLinear through its inner nn.Linear
   ("...self_attn.q_proj.linear": peft cannot wrap the clippable module
   itself), the patch embedder's input_proj, the audio tower's
   relative_k_proj, input_proj_linear and output_proj, the embedders'
   embedding_projection; of a 12B unified model's encoder-free embedders
   (>>unified): embed_vision.patch_dense, embed_vision.multimodal_embedder.
   embedding_projection and embed_audio.embedding_projection; each must have
   its A [r, in] and B [out, r]; every tensor must belong to one (a tower the
   model has not loaded: counted in lora_ignored). Tower sessions
   (g4_vision_session_init, g4_audio_size) and the unified embedders' arena
   (g4_unified_size) size the adapter's scratch: load it before them too. Refused, naming
   the field: other peft types, DoRA, lora_bias, bias other than "none",
   fan_in_fan_out, modules_to_save, target_parameters, layer_replication,
   trainable tokens and the other variants. Allocates the adapter (float32)
   in the model: the base weights stay mapped and untouched, and every
   forward applies y = x W^T + scale B (A x) on the fly (no dropout). Load it
   before creating sessions; at most one adapter per model; freed by
   g4_model_free. The model stays read-only and shareable. */
G4_API g4_result g4_model_load_adapter(g4_model *m, const char *dir);

/* --------------------------------------------------------------- session */

/* Taps: an optional callback at every point where transformers has a module
   output, in forward order, with the rows of the current step (rows = tokens
   of the chunk, the first at position pos0; data is [rows][cols] float32,
   valid only during the call). Names are module paths under the text model
   (transformers: model.language_model.<name> or model.<name>):
     embed_tokens                        [S, H]   scaled embedding
     per_layer_inputs                    [S, L*P] project_per_layer_inputs() (PLE)
     layers.<i>.input_layernorm          [S, H]
     layers.<i>.self_attn.q              [S, NH*D] after q_norm and RoPE
     layers.<i>.self_attn.k / .v         [S, KVH*D] this step's K (k_norm, RoPE) and V
                                         (v_norm) as layer i attends over them: for a
                                         reader, its owner's rows
     layers.<i>.self_attn                [S, H]   o_proj output
     layers.<i>.post_attention_layernorm [S, H]
     layers.<i>.pre_feedforward_layernorm:input  [S, H]  the residual after attention
     layers.<i>.pre_feedforward_layernorm, layers.<i>.mlp  [S, H]
     layers.<i>.post_feedforward_layernorm_1, .pre_feedforward_layernorm_2,
       .experts, .post_feedforward_layernorm_2   [S, H]  MoE layers
     layers.<i>.post_feedforward_layernorm       [S, H]
     layers.<i>.per_layer_input_gate [S, P], .per_layer_projection [S, H],
       .post_per_layer_input_norm [S, H]         PLE layers
     layers.<i>                          [S, H]   the layer's output
     norm                                [S, H]   final norm
     logits                              [S', V]  after soft-capping (rows asked for)
   With no tap set nothing is formatted or copied. */
typedef void (*g4_tap_fn)(void *user, const char *name, int layer,
                          const float *data, int rows, int cols, int pos0);

/* Threads: a pool the caller creates, sizes and frees; a session uses it
   through g4_session_config.pool (NULL: run on the calling thread). Matmuls
   split by output rows, attention by token and the query heads sharing a KV
   head. One forward at a time per pool: give sessions that run concurrently
   their own pools. */
typedef struct g4_pool g4_pool;
G4_API g4_result g4_pool_create(g4_pool **pool, int n_threads); /* allocates; n_threads >= 1 */
G4_API void g4_pool_free(g4_pool *pool);
G4_API int g4_pool_threads(const g4_pool *pool);
G4_API const char *g4_simd_name(void); /* kernels compiled in: "avx512", "avx2", "neon" or "scalar" */
G4_API int g4_bf16_fast_available(void); /* 1: this build has the VDPBF16PS kernel (bf16_fast) */

typedef struct {
    int max_context;     /* most positions the session holds (required) */
    int max_chunk;       /* most tokens per internal step; 0 = 64 */
    int bf16;            /* numerics: 0 = float32 (default); 1 = round activations to
                            bfloat16 wherever transformers running in bf16 does */
    g4_pool *pool;       /* threads to use, or NULL; must outlive the session's use */
    g4_tap_fn tap; void *tap_user;
    int tap_projections; /* the tap also sees the raw outputs of q_proj, k_proj and v_proj (layers
                            that own their K/V), gate_proj, up_proj and per_layer_model_projection
                            (the training reference keeps them for the backward) */
    int lora_bf16;       /* with bf16 and a LoRA adapter: run the adapter as PEFT runs one cast to
                            bf16 itself (model.to(torch.bfloat16)): A and B rounded to bf16, A x,
                            B u and the scaling each rounded. 0 (default): PEFT's float32 adapter
                            (PeftModel.from_pretrained's autocast_adapter_dtype) */
    int bf16_fast;       /* with bf16: the bf16 weights' matmuls and the attention's two products
                            on VDPBF16PS where the build has avx512_bf16
                            (g4_bf16_fast_available; elsewhere ignored): faster, but
                            its own summation order, not torch's, so not bit-identical to
                            transformers (tested within 3e-2 of max |logit| of the faithful
                            mode). 0 (default): torch's order, the same bits on every CPU */
} g4_session_config;

/* One entry of the shared-KV table: the K/V a writer layer appended, in a
   ring of `capacity` rows (position p lives in row p % capacity). */
typedef struct {
    int writer;      /* layer that writes this slot */
    int type, kv_heads, head_dim;
    int capacity;    /* full: max_context; sliding: min(window-1+max_chunk, max_context) */
    int n_pos;       /* positions written: valid are [oldest, n_pos) */
    float *k, *v;    /* [capacity][kv_heads][head_dim] */
    int oldest;      /* the oldest position still held: max(0, n_pos - capacity), or
                        older rows kept when g4_session_rewind took n_pos back */
} g4_kv_slot;

typedef struct g4_session {
    const g4_model *model;
    g4_session_config cfg;
    int pos;                   /* positions consumed so far */
    int layer_pos;             /* the position of the first row the layers run now: pos, or past the rows
                                  the KV-reader layers drop (g4__step); 0 in the training backward's replay */
    int fwd_end, fwd_n;        /* the running g4_forward call: its end position and token count (bf16 mode) */
    int n_slots;
    g4_kv_slot *slots;         /* the shared-KV table */
    int *layer_slot;           /* [L] slot each layer attends over */
    /* scratch, all carved from the arena: rows = max_chunk */
    float *x, *xn, *branch, *branch2; /* [rows][H] */
    float *q, *att;            /* [rows][NH*Dmax] */
    float *k_new, *v_new;      /* [rows][KVHmax*Dmax] */
    float *scores;             /* [threads][att_heads][max_context] attention scores */
    int att_heads;             /* query heads one attention item takes together (at most 8) */
    float *gate, *up;          /* [rows][max(Imax, 2*Ie)] */
    float *per_layer_inputs;   /* [rows][L*P] Gemma4TextModel's per_layer_inputs */
    float *per_layer_gate;     /* [rows][P] act(per_layer_input_gate(h)) * per_layer_input */
    float *router_in;          /* [H] the router's input: norm(r) * scale * H^-0.5 (MoE) */
    float *router;             /* [E] router probabilities */
    float *moe_y;              /* [H] one expert's output */
    float *inv_freq[2];        /* [Dmax/2] per layer type */
    uint16_t *xbf;             /* [rows][widest matmul input] a matmul's input as bf16
                                  (builds with avx512_bf16 only; else empty) */
    float *lora_u;             /* [max(rows, 2)][lora_rmax] A x of an adapted matmul */
    int lora_rmax;             /* the model's lora_rmax when the session was made */
    float *pack;               /* [pack_parts][G4__PACK_THREAD] the GEMM's packed weights
                                  and partial sums, one buffer per thread */
    int pack_parts;
    int gemm_kc;               /* the float32 GEMM's kc (values of `in` per block), chosen by g4_session_init
                                  from the L2 size the CPU reports (g4__cache_sizes, g4__gemm_kc: >>gemm) */
    unsigned epoch;            /* counts g4_session_reset calls (a drafter checks it) */
    struct g4_train *train;    /* the training reference running this session: it takes the taps
                                  by id (g4__tap); NULL otherwise */
    int replay;                /* g4_train's recompute re-running a layer: an owner layer projects its
                                  K/V (for the taps) but does not write its slot again */
    /* a drafter session (g4_drafter_init) only: slots and layer_slot point at
       the TARGET session's table; nothing of the target's K/V is copied.
       A model session has drafter.target NULL. */
    struct {
        struct g4_session *target;
        unsigned target_epoch;     /* the target's epoch when this drafter was attached */
        float *din;                /* [2*Hb] concat(scaled target embedding, hidden) */
        float *centroid;           /* [C] centroid logits (ordered embeddings) */
        struct g4__vi *centroid_q; /* [C] torch.topk's scratch over them (g4__topk_torch_q) */
        int *top;                  /* [top_k] chosen centroids */
    } drafter;
    size_t arena_bytes;        /* the arena's size, as given to g4_session_init */
    void *own_arena;           /* g4_session_create's allocation; NULL: the caller's arena */
    /* the multimodal merge (g4_forward_mm; >>vision) */
    int32_t *mm_ids;           /* [rows] the step's ids with placeholders as pad_token_id */
    int *mm_hi;                /* [rows] the last position a sliding layer's query may see */
    int *mm_lo;                /* [rows] its block's first position (gemma4_unified's block mask, >>unified) */
    const float *mm_soft;      /* the running call's soft tokens, the next one to use */
    int mm_active;             /* a g4_forward_mm call is running */
    int mm_open;               /* the last row consumed was in a bidirectional block */
    char error[G4_ERROR_MAX];
} g4_session;

G4_API g4_session_config g4_session_config_init(void);
G4_API g4_result g4_session_size(const g4_model *m, const g4_session_config *cfg, size_t *bytes);
/* arena: at least g4_session_size bytes, 16-byte aligned. */
G4_API g4_result g4_session_init(g4_session *s, const g4_model *m, const g4_session_config *cfg,
                                 void *arena, size_t arena_bytes);
G4_API void g4_session_reset(g4_session *s); /* forget all positions */
/* Take the session back to `pos` positions (0 <= pos <= s->pos) without any
   recomputation: the K/V of positions >= pos are forgotten, full layers keep
   everything before pos, sliding rings keep their rows. Fails (naming the
   layer) if a sliding ring no longer holds the window that position pos needs;
   rewinding by at most max_chunk positions past the last forward call always
   works. Speculative decoding uses it to drop rejected draft tokens. */
G4_API g4_result g4_session_rewind(g4_session *s, int pos);
/* The same session with an arena of its own, for callers that do not care
   where the arena lives: g4_session_size, G4_MALLOC, g4_session_init in one
   call (G4_ERR_NOMEM when the allocation fails); g4_session_destroy frees it.
   g4_session_destroy on a g4_session_init session frees nothing. */
G4_API g4_result g4_session_create(g4_session *s, const g4_model *m, const g4_session_config *cfg);
G4_API void g4_session_destroy(g4_session *s);

enum { G4_LOGITS_NONE = 0, G4_LOGITS_LAST = 1, G4_LOGITS_ALL = 2 };
/* Run n tokens at positions s->pos .. s->pos+n-1 (prefill or decode: the same
   code). logits: NULL, or room for vocab (LAST) or n*vocab (ALL) floats. */
G4_API g4_result g4_forward(g4_session *s, const int32_t *ids, int n, float *logits, int logits_mode);
/* g4_forward that also writes the final norm's output (transformers'
   hidden_states[-1], what a drafter starts from) of the same rows as the
   logits: hidden is [H] (LAST) or [n][H] (ALL). */
G4_API g4_result g4_forward_hidden(g4_session *s, const int32_t *ids, int n, float *logits, int logits_mode,
                                   float *hidden);
G4_API int32_t g4_argmax(const float *x, int n);

/* ------------------------------------------------------------ multimodal */
/* mm_token_type_ids: what a row of a prompt is (the processor's types) */
enum { G4_MM_TEXT = 0, G4_MM_IMAGE = 1, G4_MM_VIDEO = 2, G4_MM_AUDIO = 3 };
/* The type of an id under the config's placeholder ids. */
G4_API int g4_mm_type(const g4_config *c, int32_t id);

/* g4_forward_hidden with Gemma4Model.forward's multimodal merge. soft: [n_soft][H]
   float32, the soft tokens as they leave embed_vision / embed_audio (padding
   stripped), in the order their placeholder rows (ids equal to image_token_id,
   video_token_id or audio_token_id) appear in ids; their count must be n_soft.
   Placeholder ids are embedded as pad_token_id, then their rows replaced by the
   soft tokens unscaled; per-layer inputs take the pad id's token part and the
   merged rows' projection. With use_bidirectional_attention "vision", a run of
   image (or video) rows is one block: on sliding layers its queries also see the
   later rows of their block (full layers stay causal). A block never straddles
   two internal steps (a chunk ends before it) nor two calls; one longer than
   max_chunk is an error. The taps add inputs_embeds [S, H] (the merged rows);
   embed_tokens shows the rows before the merge, as transformers' hook does. */
G4_API g4_result g4_forward_mm(g4_session *s, const int32_t *ids, int n, const float *soft, int n_soft,
                               float *logits, int logits_mode, float *hidden);

/* The vision tower: pixel patches -> soft tokens, as get_image_features runs it
   (Gemma4VisionModel, then embed_vision), for one image at a time. The caller
   owns the arena (g4_vision_session_size); nothing allocates in the forward. */
typedef struct {
    int max_patches;     /* most patches per image, padding included (required): the
                            processor's max_soft_tokens * k^2 */
    g4_pool *pool;       /* threads for the matmuls and the attention, or NULL (any pool: the same bits) */
    int bf16;            /* numerics: 0 = float32 (default); 1 = round to bfloat16 wherever transformers
                            running the tower in bf16 does, in torch's summation orders (docs/bf16.md) */
    g4_tap_fn tap; void *tap_user; /* module outputs: vision_tower.patch_embedder,
                            vision_tower.encoder.layers.<i>[.input_layernorm|.self_attn.q_proj|
                            .self_attn.k_proj|.self_attn.v_proj|.self_attn|.post_attention_layernorm|
                            .pre_feedforward_layernorm|.mlp.gate_proj|.mlp.up_proj|.mlp|
                            .post_feedforward_layernorm] [n, .], vision_tower (pooled, padding
                            stripped, standardized) [n_soft, Hv], embed_vision [n_soft, H] */
} g4_vision_session_config;

typedef struct {
    const g4_model *model;
    g4_vision_session_config cfg;
    float *x, *xn, *cin;       /* [max_patches][Hv], [..][Hv], [..][max(Hv, NHv*Dv, Iv, H, 3 p^2)] */
    float *q, *k, *v, *att;    /* [max_patches][NHv*Dv] (k, v: KVHv*Dv) */
    float *gate, *up;          /* [max_patches][Iv] */
    float *scores;             /* [max(threads, G4_VISION_QBLOCK)][max_patches]: per thread (the reference
                                  attention), or a block of queries' rows (the GEMM attention) */
    float *pooled;             /* [max_patches / k^2][Hv] */
    float *inv_freq;           /* [Dv/4] */
    int *kernel;               /* [max_patches] each patch's pooled row */
    g4_session mm;             /* private: the decoder's matmul on the pool */
    int lora_rmax;             /* the adapter rank its scratch holds (the model's when it was made) */
    char error[G4_ERROR_MAX];
} g4_vision_session;

G4_API g4_result g4_vision_session_size(const g4_model *m, const g4_vision_session_config *cfg, size_t *bytes);
G4_API g4_result g4_vision_session_init(g4_vision_session *vs, const g4_model *m, const g4_vision_session_config *cfg,
                                        void *arena, size_t arena_bytes);
/* One image: pixel_values [n_patches][3 p^2] (row, column, channel order, in
   [0, 1]), positions [n_patches][2] (x, y; (-1, -1) a padding patch), as the
   image processor gives them. n_patches must be a multiple of k^2. soft:
   [n_patches / k^2][H] room; *n_soft: the soft tokens written (pooled rows
   holding a real patch). */
G4_API g4_result g4_vision_encode(g4_vision_session *vs, const float *pixel_values, const int32_t *positions,
                                  int n_patches, float *soft, int *n_soft);
/* One video, as get_video_features runs it: each of n_frames frames
   (pixel_values_videos [n_frames][n_patches][3 p^2], video_position_ids
   [n_frames][n_patches][2], as gemma4_processing.h's g4_video_preprocess gives
   them) through g4_vision_encode in turn, their soft tokens back to back.
   soft: [n_frames * n_patches / k^2][H] room; *n_soft: the rows written. */
G4_API g4_result g4_video_encode(g4_vision_session *vs, const float *pixel_values, const int32_t *positions,
                                 int n_frames, int n_patches, float *soft, int *n_soft);


/* -------------------------------------------------------------- training */
/* The training reference: the loss transformers' model(input_ids,
   labels=labels).loss computes (mean next-token cross-entropy of the
   soft-capped logits, labels shifted inside, -100 ignored) and its gradient
   with respect to every parameter transformers trains, float32, in eval mode
   (no dropout). The forward is g4_forward itself (its taps store what the
   backward needs); the backward mirrors it op by op.
   Memory: g4_train_size reports one arena for the session, the saved
   activations, the shared-KV gradient slots (one per owner layer: readers add
   their dK/dV into it, the owner consumes it after all of them, counted) and
   scratch; the gradients go to one caller block of grad_floats floats, the
   tensors at the offsets g4_train.grads lists (named as in the checkpoint;
   the tied lm_head under embed_tokens). Nothing allocates in g4_loss_and_grad. */
typedef struct {
    int max_seq;         /* longest sequence (required) */
    int recompute;       /* 1: keep only each layer's input; recompute the layer's activations in the backward
                            (activation checkpointing; the gradients are bit-identical) */
    int bf16;            /* must be 0: the backward is float32 only */
    g4_pool *pool;       /* threads for the forward and backward, or NULL */
    g4_tap_fn tap; void *tap_user; /* optional: the forward's taps, passed on */
    g4_tap_fn grad_tap; void *grad_tap_user; /* optional: dL/d(output) at the forward's tap points, in
                                                backward order, under the same names (not self_attn.k/.v,
                                                logits) */
#ifdef G4_TESTING
    int debug_drop_reader_kv_grads; /* tests only (G4_TESTING): readers do not add their dK/dV to the owner's slot
                                       (what a rebuilt shared-KV dict does) */
#endif
} g4_train_config;

typedef struct {
    char name[128];      /* the checkpoint tensor's name */
    size_t offset;       /* in floats, from the start of the gradient block */
    size_t count;        /* elements */
    int ndim;
    int64_t shape[3];
    const g4_tensor *w;  /* the weight (in the model) */
} g4_grad_entry;

typedef struct g4_train {
    const g4_model *model;
    g4_train_config cfg;
    g4_session s;              /* the forward's session (max_context = max_chunk = max_seq) */
    int n_grads;
    g4_grad_entry *grads;      /* [n_grads], in the checkpoint walk's order */
    size_t grad_floats;        /* size of the caller's gradient block */
    size_t arena_bytes;        /* the training arena, as given to g4_train_init */
    size_t saved_bytes;        /* of the arena: activations kept for the backward */
    int n;                     /* tokens of the current call */
    int recomputing;           /* layer whose activations the taps refill (recompute mode), else -1 */
    float **act;               /* [L+1][G4__ACTS] saved activations (see the backward section) */
    float *per_layer_inputs;   /* [S][L*P] Gemma4TextModel's per_layer_inputs */
    float *pproj;              /* [S][L*P] per_layer_model_projection's raw output */
    float *xn_final;           /* [S][H] the final norm's output */
    float *dx, *dr, *dxn, *dbr, *tmp, *tmp2;   /* [S][H] backward scratch */
    float *dq, *att, *datt;                    /* [S][NH*Dmax] */
    float *dk, *dv;                            /* [S][KVHmax*Dmax] */
    float *dgate, *dup;                        /* [S][max(Imax, 2*Ie)] */
    float *dper_layer_inputs;                  /* [S][L*P] */
    float *per_layer_act, *per_layer_gate, *dper_layer_gate; /* [S][P]: act_fn(per_layer_input_gate(x)), that
                                                  * per_layer_input (the forward's per_layer_gate), its gradient */
    float *probs;                              /* [threads][2][max_seq] attention backward: p, dL/dp */
    float *astats;                             /* [S][NH][3] attention backward: softmax max, sum, sum(p dp) */
    float *rowinv;                             /* [S] an RMSNorm backward's rows' (mean(x^2) + eps)^-0.5 */
    double *row_loss;                          /* [max_seq] each row's cross-entropy */
    float *dyt, *xt;                           /* [max(S * widest projection, rows * V)], [S * widest projection]:
                                                  dY and X transposed (rows: the loss's, G4_TRAIN_ROWS) */
    float *logits;                             /* [min(max_seq, G4_TRAIN_ROWS)][V] */
    float *moe;                                /* MoE scratch: [4H + 2E + 6Ie] */
    float **slot_dk, **slot_dv;                /* [n_slots] -> [S][KVH*D] the owner slots' K/V gradients */
    int *pending;                              /* [n_slots] readers of the slot whose backward has not run */
    char error[G4_ERROR_MAX];
} g4_train;

G4_API g4_train_config g4_train_config_init(void);
/* The arena bytes and the gradient block's floats for cfg (max_seq tokens). */
G4_API g4_result g4_train_size(const g4_model *m, const g4_train_config *cfg, size_t *arena_bytes, size_t *grad_floats);
G4_API g4_result g4_train_init(g4_train *t, const g4_model *m, const g4_train_config *cfg, void *arena, size_t arena_bytes);
/* ids[n], labels[n] (NULL: the ids; -100: ignored; labels[0] is never used,
   as transformers shifts them) -> *loss and grads[grad_floats] (overwritten). */
G4_API g4_result g4_loss_and_grad(g4_train *t, const int32_t *ids, const int32_t *labels, int n, float *loss,
                                  float *grads);
/* The entry of a tensor by its checkpoint name, or NULL. */
G4_API const g4_grad_entry *g4_train_grad(const g4_train *t, const char *name);

/* ----------------------------------------------------------- audio tower */
/* The E2B/E4B audio tower (Gemma4AudioModel) and embed_audio: log-mel
   features in, the soft tokens that replace an audio placeholder run out
   (Gemma4Model.get_audio_features, padding stripped). One clip per call.
     features  [n_frames][C0] float32, as Gemma4AudioFeatureExtractor makes
               them (g4_audio_features; C0 = subsampling_conv_channels[0], 128)
     mask      [n_frames] 1 = a valid frame (input_features_mask): required;
               transformers silently skips the audio without one
     soft      room for g4_audio_tokens_max(n_frames) rows of the text
               model's hidden size H; *n_soft gets the rows written: the
               tower's frames whose mask is set, in order
   The arena (g4_audio_size bytes for up to max_frames frames, 16-byte
   aligned) holds every activation; nothing is allocated. The model is only
   read, so clips may be encoded on several threads, each with its own arena.
   run (may be NULL) has the taps and receives the error message; its taps
   are named by the transformers modules under model.: audio_tower.
   subsample_conv_projection.layer0 [T1, F1*C0] and .layer1 [T2, F2*C1]
   (channels last: [T][F][C]), audio_tower.subsample_conv_projection [T2, Ha],
   audio_tower.rel_pos_enc [P, Ha], audio_tower.layers.<i>.feed_forward1
   (.pre_layer_norm, .ffw_layer_1, .ffw_layer_2, .post_layer_norm),
   .norm_pre_attn, .self_attn (.q_proj, .k_proj, .v_proj, .relative_k_proj
   [P, Ha], .post), .norm_post_attn, .lconv1d (.pre_layer_norm,
   .linear_start, .depthwise_conv1d, .conv_norm, .linear_end),
   .feed_forward2 (...), .norm_out, audio_tower.layers.<i> [T2, Ha],
   audio_tower.output_proj [T2, Pa], embed_audio [T2, H] (before stripping);
   `layer` is the conformer layer or -1. */
typedef struct {
    g4_tap_fn tap; void *tap_user;     /* optional */
    g4_pool *pool;                     /* threads (NULL: one); the arena must be sized for them
                                          (g4_audio_size_pool), else the tower runs on one thread.
                                          Any pool gives the same bits. */
    int bf16;                          /* numerics: 0 = float32 (default); 1 = round to bfloat16 wherever
                                          transformers running the tower in bf16 does (docs/bf16.md) */
    char error[G4_ERROR_MAX];          /* set when g4_audio_encode fails */
} g4_audio_run;

/* The tower's frames for n_frames feature frames: two stride-2 convolutions,
   ceil(ceil(n / 2) / 2) (0 when n < 1). */
G4_API int g4_audio_tokens_max(int n_frames);
G4_API g4_result g4_audio_size(const g4_model *m, int max_frames, size_t *bytes); /* one thread */
G4_API g4_result g4_audio_size_pool(const g4_model *m, int max_frames, const g4_pool *pool, size_t *bytes);
G4_API g4_result g4_audio_encode(const g4_model *m, const float *features, const unsigned char *mask, int n_frames,
                                 void *arena, size_t arena_bytes, g4_audio_run *run, float *soft, int *n_soft);

/* --------------------------------------------------------------- sampler */
/* Explicit state, no globals. The order is transformers' generate: repetition
   penalty, then temperature, top-k, top-p, min-p, then a draw from the
   softmax. temperature 0 (or top_k 1) is greedy: the argmax after the
   penalty, lowest id on ties. The same seed and logits give the same tokens. */
typedef struct {
    float temperature;           /* 0: greedy; default 1 */
    int top_k;                   /* keep the k most likely (ties at the k-th kept); 0: off */
    float top_p;                 /* keep the smallest top set with mass >= p; 1: off */
    float min_p;                 /* drop tokens with p < min_p * p_max; 0: off */
    float repetition_penalty;    /* > 1 discourages tokens already seen (prompt included); 1: off */
    uint64_t seed;               /* the random stream */
} g4_sampler_config;

typedef struct {
    g4_sampler_config cfg;
    int vocab;                   /* logits per step */
    uint64_t rng;                /* xorshift64* state, from the seed */
    int32_t *idx;                /* [vocab] candidate ids (scratch) */
    float *prob;                 /* [vocab] candidate probabilities (scratch) */
    unsigned char *seen;         /* [vocab] 1: the id was passed to g4_sampler_accept */
    char error[G4_ERROR_MAX];
} g4_sampler;

G4_API g4_sampler_config g4_sampler_config_init(void);
/* Allocates 9 bytes per vocab entry; free with g4_sampler_free. */
G4_API g4_result g4_sampler_init(g4_sampler *s, const g4_sampler_config *cfg, int vocab);
G4_API void g4_sampler_free(g4_sampler *s);
/* Records an id for the repetition penalty (feed the prompt and every sampled id). */
G4_API void g4_sampler_accept(g4_sampler *s, int32_t id);
/* Forgets the seen ids and restarts the random stream from the seed. */
G4_API void g4_sampler_reset(g4_sampler *s);
/* Picks the next id from vocab logits (modified in place). Returns the id,
   or -1 on bad input (message in s->error). Does not call accept. */
G4_API int32_t g4_sampler_sample(g4_sampler *s, float *logits);

/* --------------------------------------------------------------- drafter */
/* A Gemma 4 drafter (model_type "gemma4_assistant", Gemma4AssistantForCausalLM):
   a small decoder whose layers all read the TARGET model's K/V (the last
   sliding and the last full owner layer of the target) and never write any.
   Its session is a g4_session attached to a target session: its layer_slot
   holds slot indices into the target's table, no K/V is copied, and every
   read checks that the target slot holds the positions the step needs.
   The target session must outlive the drafter session; after
   g4_session_reset on the target (or re-initialising it) the drafter must be
   re-initialised (a reset is detected and refused).
   A drafting step (transformers' SinglePositionMultiTokenCandidateGenerator):
     x = pre_projection(concat(target.embed_tokens(token) * sqrt(Hb), hidden))
     the decoder layers at position p = target->pos (the token's position; the
       query attends over the target's positions [0, p) in full layers and the
       last sliding_window + 1 of them in sliding layers)
     h = norm(x); logits = lm_head(h) (no soft-cap), or with ordered embeddings
       only the tokens of the top-k centroids (the rest min - 1);
     next_hidden = post_projection(h), the next step's hidden.
   The first hidden is the target's final-norm output at p - 1
   (g4_forward_hidden). */
G4_API g4_result g4_drafter_size(const g4_model *drafter, const g4_session *target, size_t *bytes);
/* Validates the drafter against the target (hidden sizes, vocab, head dims
   and KV heads per layer type; an error names both) and attaches it. */
G4_API g4_result g4_drafter_init(g4_session *d, const g4_model *drafter, g4_session *target, void *arena,
                                 size_t arena_bytes);
/* One drafting step. token: the last token (at position target->pos, not yet
   run by the target); hidden: [Hb]; logits: [V]; next_hidden: [Hb] (may be
   the same buffer as hidden). */
G4_API g4_result g4_draft_step(g4_session *d, int32_t token, const float *hidden, float *logits, float *next_hidden);

/* --------------------------------------------------- speculative decoding */
/* Exact speculative decoding: each round drafts k tokens, verifies them in
   one target forward of k + 1 tokens, accepts the longest prefix the target
   agrees with plus the target's own next token, and rewinds the target's K/V
   to the accepted length (g4_session_rewind). Greedy output is identical to
   plain greedy decoding for any drafter. With a sampler, the standard
   speculative-sampling rule (accept d with probability min(1, p(d)/q(d)),
   else sample from max(0, p - q) normalised) keeps the target's
   distribution. The target session needs max_chunk >= k + 2 (the drafter
   reads sliding_window + 1 positions after a rewind). */
typedef struct {
    g4_session *target, *drafter; /* drafter may be NULL when propose is set */
    int k;                        /* draft tokens per round */
    /* optional: replaces the drafted token i of a round (the drafter's choice
       in `drafted`, or -1 without a drafter); for tests and forced-acceptance
       benchmarks. pos: the position the token would take */
    int32_t (*propose)(void *user, int pos, int i, int32_t drafted);
    void *propose_user;
    int32_t last;                 /* the newest token: at target->pos, not yet run */
    long drafted, accepted, target_steps; /* counts */
    /* workspace, carved by g4_spec_init */
    float *logits;                /* [k+1][V] the target's verification logits */
    float *q;                     /* [k][V] the drafter's probabilities (sampling) */
    float *hidden;                /* [k+1][H] the target's final-norm rows */
    float *h;                     /* [H] the hidden the next round starts from */
    int32_t *ids;                 /* [k+1] */
    char error[G4_ERROR_MAX];
} g4_spec;

G4_API g4_result g4_spec_size(const g4_model *target, int k, size_t *bytes);
G4_API g4_result g4_spec_init(g4_spec *sp, g4_session *target, g4_session *drafter, int k, void *work, size_t bytes);
/* Runs the prompt on the (empty) target; *first: its greedy next token (or
   sampled, with a sampler), which is also the first token of the output. */
G4_API g4_result g4_spec_prefill(g4_spec *sp, const int32_t *prompt, int n, g4_sampler *sampler, int32_t *first);
/* One round: writes 1 to k + 1 new tokens to out, their count to *n_out.
   sampler NULL: greedy. */
G4_API g4_result g4_spec_round(g4_spec *sp, g4_sampler *sampler, int32_t *out, int *n_out);

/* --------------------------------------------------------------- unified */
/* The 12B unified model (gemma4_unified) has no vision or audio encoder: its
   embedders turn raw input straight into soft tokens of the text width H, as
   Gemma4UnifiedModel.get_image_features / get_audio_features do (>>unified).
   The soft tokens then replace the placeholder rows of the prompt.
     image: pixel_values [n][Pd], one merged patch of (ps*k)x(ps*k)x3 raw values
            per row as the image processor writes them; positions [n][2] its
            (x, y) in patches, (-1, -1) for padding; per axis a -1 adds no
            position term (as transformers' mask); rows with both -1 are
            padding, dropped from soft.
     audio: frames [n][A], A = audio_samples_per_token raw waveform samples
            each; valid [n] (NULL: all) 1 for a real frame, 0 for padding
            (input_features_mask), dropped from soft.
   soft gets the kept rows, [n_soft][H] (room for n rows), in order. The arena
   (caller-owned, 64-byte aligned) holds every intermediate: size it with
   g4_unified_size (g4_unified_size_pool for run->pool's threads) for the most
   rows one call takes. Nothing is allocated. The linears run on the decoder's
   packed GEMM with output rows split across run->pool, the norms by rows.
   Taps (run->tap, optional), every row including padding, layer -1, pos0 0:
     embed_vision.patch_ln1 [n, Pd], .patch_dense, .patch_ln2, .pos_norm [n, D]
       (pos_norm: after adding the position embedding),
       .multimodal_embedder.embedding_pre_projection_norm [n, D],
       .multimodal_embedder [n, H]
     embed_audio.embedding_pre_projection_norm [n, A], embed_audio [n, H]
   Errors (G4_ERR_INPUT, G4_ERR_ARENA) are explained in run->error. */
typedef struct {
    g4_tap_fn tap; void *tap_user;
    g4_pool *pool;     /* threads (NULL: one); the arena must be sized for them
                          (g4_unified_size_pool), else the embedder runs on one
                          thread. Any pool gives the same bits. */
    int bf16;          /* 1: the bf16-faithful mode, transformers' embedders run in
                          torch.bfloat16 (the input cast to bf16, every module's
                          output rounded to bf16 as torch's CPU kernels round it);
                          the soft tokens are bf16 values (>>unified) */
    char error[G4_ERROR_MAX];
} g4_unified_run;
G4_API g4_result g4_unified_size(const g4_model *m, int max_rows, size_t *bytes); /* one thread */
G4_API g4_result g4_unified_size_pool(const g4_model *m, int max_rows, const g4_pool *pool, size_t *bytes);
G4_API g4_result g4_unified_embed_image(const g4_model *m, const float *pixel_values, const int32_t *positions,
                                        int n, void *arena, size_t bytes, g4_unified_run *run, float *soft,
                                        int *n_soft);
G4_API g4_result g4_unified_embed_audio(const g4_model *m, const float *frames, const unsigned char *valid, int n,
                                        void *arena, size_t bytes, g4_unified_run *run, float *soft, int *n_soft);
/* Gemma4UnifiedAudioFeatureExtractor for one clip: pcm [n] (16 kHz float samples) cut
   into frames of A = audio_samples_per_token, the last zero-padded: *n_frames =
   ceil(n / A) rows of frames [max_frames][A], every one valid (the placeholder run's
   length). G4_ERR_INPUT (in run->error) when they would not fit max_frames. */
G4_API g4_result g4_unified_audio_frames(const g4_model *m, const float *pcm, size_t n, float *frames, int max_frames,
                                         g4_unified_run *run, int *n_frames);

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

/* The CUDA session's own options, beside the g4_session_config it shares
   with the CPU path. All zero (or a NULL pointer) is the default. */
typedef struct {
    int fast;                  /* 1: the fast mode (kernels near the hardware, bounded against the exact mode:
                                  docs/cuda.md); 0: the exact mode, the CPU's bits */
    int kv_splits;             /* the fast mode's decode step: KV splits per layer (flash-decoding), 1 .. 256;
                                  0 (default): about 2 blocks per multiprocessor of the device */
} g4_cuda_config;

typedef struct {
    const g4_cuda_model *model;
    g4_session_config cfg;
    g4_cuda_config cuda;       /* as given to g4_cuda_session_init */
    int matmul;                /* G4_CUDA_MATMUL_TILED (default) or G4_CUDA_MATMUL_PLAIN (the fast
                                  mode: no tensor cores) */
    int pos;                   /* positions consumed so far */
    int fwd_end, fwd_n;        /* the running g4_forward call: its end position and token count (bf16 mode) */
    int n_slots;
    g4_kv_slot *slots;         /* host arena: the table as the host tracks it (k, v: device) */
    int *layer_slot;           /* host arena: [L] slot each layer attends over */
    float *stage;              /* host arena: tap staging [rows][max(H, L*P)] */
    g4_kv_slot *d_slots;       /* device arena: the table the kernels read */
    int *d_status;             /* device arena: nonzero when a kernel found a table violation */
    float *d_probe;            /* device arena: [32] the IEEE probe's operands and results (session init) */
    int32_t *d_ids;            /* [rows] */
    float *d_x, *d_xn, *d_branch, *d_branch2; /* [rows][H] */
    float *d_q, *d_att;        /* [rows][NH*Dmax] */
    float *d_k_new, *d_v_new;  /* [rows][KVHmax*Dmax] */
    float *d_scores;           /* [rows*NH][max_context] */
    float *d_gate, *d_up;      /* [rows][Imax] */
    float *d_per_layer_inputs, *d_per_layer_gate; /* [rows][L*P], [rows][P] */
    float *d_router;           /* [rows][E] */
    int *d_top;                /* [rows][K] chosen experts, ascending id */
    float *d_topw;             /* [rows][K] their weights */
    float *d_moe_h, *d_moe_y;  /* [rows*K][2*Ie], [rows*K][H] */
    float *d_logits;           /* [rows][V] */
    void *d_topq;              /* [rows][E] the router's top-k scratch (g4__vi) */
    float *inv_freq[2];        /* host arena: [Dmax/2] per layer type */
    int rope_half;             /* Dmax/2 */
    float *rope, *d_rope;      /* host and device: [rows][2 types][cos, sin][Dmax/2], this step's RoPE
                                  cos/sin, made on the host (g4__rope_cos_sin, as the CPU) */
    float *d_inv_freq[2];      /* [Dmax/2] per layer type */
    /* the fast mode (cuda.fast; d_scores is then NULL) */
    int fast;                  /* 1: the fast kernels (cuda.fast at init) */
    int kv_bf16;               /* 1: the slots' k/v hold bf16 (fast mode with cfg.bf16 at init) */
    int sms;                   /* the device's multiprocessors (fast mode, read at init: the KV splits) */
    float *d_part;             /* split-K and flash-decoding partial sums */
    float *d_stats;            /* [rows][NH][2]: attention's softmax max and 1/sum (bf16 mode) */
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
/* cc: the CUDA options, or NULL for the defaults (the exact mode) */
G4_CUDA_API g4_result g4_cuda_session_size(const g4_cuda_model *cm, const g4_session_config *cfg,
                                           const g4_cuda_config *cc, size_t *device_bytes, size_t *host_bytes);
/* device_arena: cudaMalloc'd (or any device memory), >= device_bytes, 16-byte
   aligned; host_arena: >= host_bytes, 16-byte aligned. Both stay the caller's. */
G4_CUDA_API g4_result g4_cuda_session_init(g4_cuda_session *s, const g4_cuda_model *cm, const g4_session_config *cfg,
                                           const g4_cuda_config *cc, void *device_arena, size_t device_bytes,
                                           void *host_arena, size_t host_bytes);
G4_CUDA_API g4_result g4_cuda_session_reset(g4_cuda_session *s);
/* As g4_forward; ids and logits are host memory. */
G4_CUDA_API g4_result g4_cuda_forward(g4_cuda_session *s, const int32_t *ids, int n, float *logits, int logits_mode);
/* Copies the device's shared-KV table (n_slots entries) to out, for checks. */
G4_CUDA_API g4_result g4_cuda_session_table(g4_cuda_session *s, g4_kv_slot *out, int max);
#ifdef G4_TESTING
/* The test suites' hooks (G4_TESTING; gemma4_cuda.cu defines them only when
   it is built with G4_TESTING too): g4_cuda_session_size and _init with
   reader_copies, the debug layout that gives every reader layer its own K/V
   slot (g4i_reader_copies checks it equals the owners-only one). */
G4_CUDA_API g4_result g4__cuda_session_size_testing(const g4_cuda_model *cm, const g4_session_config *cfg,
                                                    const g4_cuda_config *cc, int reader_copies,
                                                    size_t *device_bytes, size_t *host_bytes);
G4_CUDA_API g4_result g4__cuda_session_init_testing(g4_cuda_session *s, const g4_cuda_model *cm,
                                                    const g4_session_config *cfg, const g4_cuda_config *cc,
                                                    int reader_copies, void *device_arena, size_t device_bytes,
                                                    void *host_arena, size_t host_bytes);
/* The fast mode's attention kernels alone on host arrays: one decode query
   of `group` heads (q [group][D]) over n_keys keys and values ([n_keys][D],
   float32), in `splits` KV splits, into out [group][D] (the long-context
   bound's test, against a float64 reference). */
G4_CUDA_API g4_result g4__cuda_fast_attention_testing(float *out, const float *q, const float *k, const float *v,
                                                      int n_keys, int group, int D, int splits, char *err);
#endif
#endif /* GEMMA4_CUDA */

#ifdef __cplusplus
}
#endif
#endif /* GEMMA4_H */

/* ======================================================================== */
/*                   IMPLEMENTATION >>implementation                        */
/* ======================================================================== */
#ifdef GEMMA4_IMPLEMENTATION
#ifndef GEMMA4_IMPLEMENTATION_DONE
#define GEMMA4_IMPLEMENTATION_DONE

/* The kernels reproduce torch's float32 orders and build exp/tanh from IEEE
   operations: value-changing optimisations would silently break them (and
   the NaN checks). FP contraction must be off as well (gcc's GNU modes and
   clang contract by default: the Makefile passes -ffp-contract=off, and the
   test suites check g4__fp_contract_probe). */
#if defined(__FAST_MATH__)
#error "gemma4.h: built with -ffast-math (or -Ofast); its exact arithmetic needs IEEE semantics: build without it"
#endif

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#if defined(G4_X86_EMU) && !defined(G4_NO_SIMD) /* tests only: the AVX-512 intrinsics in plain C (tests/x86_emu.h) */
#include G4_X86_EMU
#elif !defined(G4_NO_SIMD) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)))
#if defined(__cplusplus) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
/* g++ 12 at -O1 and above warns inside its own avx512fintrin.h (the
   self-initialised "__Y = __Y" of _mm512_undefined_*, GCC bug 105593, fixed in
   13); the warnings are located in the header, so silencing them around the
   include leaves this file's own diagnostics on. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#elif !defined(G4_NO_SIMD) && defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif
/* bf16_fast's dot-product kernel (VDPBF16PS), where the CPU has avx512_bf16 */
#if !defined(G4_NO_SIMD) && defined(__AVX512F__) && defined(__AVX512BF16__)
#define G4__BF16DOT 1
#else
#define G4__BF16DOT 0
#endif
#if !defined(G4_NO_THREADS) && (defined(__unix__) || defined(__APPLE__))
#define G4__THREADS 1
#include <pthread.h>
#include <unistd.h>
#else
#define G4__THREADS 0
#endif

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
#define G4__MAYBE_UNUSED __attribute__((unused))
#define G4__NOINLINE __attribute__((noinline))
#define G4__INLINE __attribute__((always_inline)) inline /* small kernels called from loops */
#else
#define G4__NOINLINE
#define G4__INLINE
#define G4__PRINTF(a, b)
#define G4__MAYBE_UNUSED
#endif

/* G4__HD marks the small pure helpers that gemma4_cuda.cu's kernels call as
   they are (the torch-order sums, top-k, the IEEE-built exp/tanh, bf16
   rounding), so the device runs the CPU's own code: __host__ __device__
   under nvcc, nothing elsewhere (the host emulator compiles the .cu as host
   C++). They use only IEEE operations, memcpy/memset and fmaf. */
#if defined(__CUDACC__)
#define G4__HD __host__ __device__
#else
#define G4__HD
#endif

/* ------------------------------------------------- utilities >>utilities */

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

G4__HD static float g4__bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

G4__HD static float g4__f16_to_f32(uint16_t h) {
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
    case G4_F16: case G4_BF16: case G4_I16: return 2;
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

/* Elements i .. i + 15 of a float tensor into out, as g4__get each, the dtype's
   branch out of the loop so that compilers vectorize it */
static void g4__get16(const g4_tensor *t, size_t i, float *out) {
    const unsigned char *p = (const unsigned char *)t->data;
    uint16_t h[16];
    int l;
    switch (t->dtype) {
    case G4_F32: memcpy(out, p + 4 * i, 16 * sizeof(float)); break;
    case G4_BF16: memcpy(h, p + 2 * i, sizeof h); for (l = 0; l < 16; l++) out[l] = g4__bf16_to_f32(h[l]); break;
    default: for (l = 0; l < 16; l++) out[l] = g4__get(t, i + (size_t)l);
    }
}

/* Element i of an integer tensor (I64 or I32) */
static int64_t g4__index_get(const g4_tensor *t, size_t i) {
    const unsigned char *p = (const unsigned char *)t->data;
    int64_t v;
    int32_t w;
    if (t->dtype == G4_I64) { memcpy(&v, p + 8 * i, 8); return v; }
    memcpy(&w, p + 4 * i, 4);
    return w;
}

static char *g4__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = (char *)G4_MALLOC(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Whole file into memory (for JSON files), NUL-terminated. */
static g4_result g4__read_file(const char *path, char **out, size_t *len, size_t max, char *err) {
    FILE *f;
    long n;
    char *buf;
    *out = NULL;
#if G4__MMAP
    { /* a directory, FIFO or device: refuse before opening (a FIFO would block) */
        struct stat st;
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
            g4__seterr(err, "%s: %s", path, S_ISDIR(st.st_mode) ? "is a directory, not a file" : "not a regular file");
            return G4_ERR_IO;
        }
    }
#endif
    f = fopen(path, "rb");
    if (!f) { g4__seterr(err, "%s: cannot open (%s)", path, strerror(errno)); return G4_ERR_IO; }
    if (getc(f) == EOF && ferror(f)) { /* fopen succeeds on a directory; reading it fails */
        fclose(f);
        g4__seterr(err, "%s: cannot read (is it a directory?)", path);
        return G4_ERR_IO;
    }
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

/* UTF-8 (used by >>json, which refuses invalid UTF-8, and by gemma4_processing.h's >>decoding). */

/* Length (1..4) of the UTF-8 character that s[0..n) (n >= 1) starts when the
   bytes there are one, or the start of one; 0 when no bytes after them could
   make a valid character (stray continuation, overlong form, surrogate, beyond
   U+10FFFF, a lead byte followed by a non-continuation). */
static size_t g4__utf8_lead(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t need, i;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) need = 3;
    else if (c >= 0xF0 && c <= 0xF4) need = 4;
    else return 0;
    for (i = 1; i < need && i < n; i++) if ((s[i] & 0xC0) != 0x80) return 0;
    if (n >= 2 && ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) ||
                   (c == 0xF4 && s[1] > 0x8F)))
        return 0;
    return need;
}

/* Length (1..4) of the valid UTF-8 character at s[0..n), 0 if none starts
   there (as g4__utf8_lead, or truncated). */
static size_t g4__utf8_char(const unsigned char *s, size_t n) {
    size_t need = g4__utf8_lead(s, n);
    return need <= n ? need : 0;
}

/* Offset of the first byte of s[0..n) that starts no valid UTF-8 character,
   n when all of it is UTF-8 (ASCII eight bytes at a time). */
static size_t g4__utf8_bad(const unsigned char *s, size_t n) {
    size_t i = 0, k;
    while (i < n) {
        uint64_t w;
        if (n - i >= 8 && (memcpy(&w, s + i, 8), !(w & 0x8080808080808080ull))) { i += 8; continue; }
        if (!(k = g4__utf8_char(s + i, n - i))) return i;
        i += k;
    }
    return n;
}

/* (unused when gemma4_processing.h is not included) */
G4__MAYBE_UNUSED static int g4__utf8_valid(const unsigned char *s, size_t n) { return g4__utf8_bad(s, n) == n; }

/* ----------------------------------------------------------- JSON >>json */
/* A small DOM parser (RFC 8259, strict: no NaN/Infinity, no comments, no
   trailing commas), depth-limited, with every string decoded once.

   Text encoding, as each file's own reader does it (tools/make_json_utf8_goldens.py
   runs them; data/json/utf8_goldens.jsonl holds what they did, test_bad_inputs.c
   replays it):
   - Every file must be valid UTF-8, strictly: a stray continuation byte, a
     truncated sequence, an overlong form (C0 AF, E0 80 AF), an encoded surrogate
     (ED A0 80), a code point past U+10FFFF or a byte F5..FF anywhere is an error
     naming the file and the byte offset. tokenizers (serde_json over a Rust
     String), safetensors (std::str::from_utf8 of the header) and transformers
     (open(encoding="utf-8"), then json.loads) all refuse such files. Outside
     strings, any byte above 0x7F is a syntax error anyway (a BOM included: all
     three refuse it).
   - \u escapes: a surrogate pair is one character. A lone surrogate
     (\ud800 not followed by a \udc00..\udfff escape, or \udc00 alone)
     differs by reader. serde_json refuses it ("lone leading surrogate in hex
     escape"): g4__json_parse, for tokenizer.json, safetensors headers and the
     messages JSON of g4_template_render (whose strings become text to
     tokenize, and a lone surrogate has no UTF-8 form). Python's json keeps it
     as a str code point: g4__json_parse_python, for config.json,
     tokenizer_config.json, model.safetensors.index.json and adapter_config.json,
     stores it as its 3-byte generalized UTF-8 form (ED A0 80 for \ud800, as
     Python's "surrogatepass") and flags the node (g4__jnode.lone), so such a
     string is never valid UTF-8 and never equals a name gemma4.h looks for.
     Where such a string would be used as text or a file or tensor name
     (chat_template, special tokens, weight_map) the caller refuses it, naming
     the field. So every string gemma4.h keeps from tokenizer.json is valid UTF-8. */

enum { G4__JNULL, G4__JFALSE, G4__JTRUE, G4__JNUM, G4__JSTR, G4__JARR, G4__JOBJ };
#define G4__JSON_MAX_DEPTH 64
#define G4__JSON_MAX_NODES (1 << 24) /* values per document: bounds the parser's memory to 1 GiB */

typedef struct {
    int type;
    int child, next, count;  /* first child, next sibling (-1 = none), #children */
    const char *key;         /* member name when the parent is an object */
    size_t keylen;           /* its length (tokenizer.json's may hold a NUL) */
    const char *str;         /* decoded string (NUL-terminated) */
    size_t len;
    double num;
    int is_int;              /* a JSON integer that fits in int64 */
    int64_t ival;
    int lone;                /* G4__JLONE_STR / G4__JLONE_KEY: str / key holds a lone
                                surrogate (g4__json_parse_python only), so is not UTF-8 */
} g4__jnode;

#define G4__JLONE_STR 1
#define G4__JLONE_KEY 2

typedef struct {
    g4__jnode *nodes;
    int n, cap, max_nodes;
    char *strbuf;
    size_t strpos;
    const char *src;
    size_t len, pos;
    const char *name;        /* file name, for messages */
    size_t base;             /* src's offset in that file, for messages */
    int python;              /* lone surrogate escapes accepted, as Python's json */
    char *err;
} g4__json;

static int g4__json_fail(g4__json *j, const char *what) {
    size_t i, line = 1, col = 1;
    for (i = 0; i < j->pos && i < j->len; i++) {
        if (j->src[i] == '\n') { line++; col = 1; } else col++;
    }
    g4__seterr(j->err, "%s: invalid JSON at line %lu, column %lu (byte offset %lu): %s", j->name, (unsigned long)line,
               (unsigned long)col, (unsigned long)(j->base + j->pos), what);
    return -1;
}

/* Fails at the byte at j->pos, which starts no valid UTF-8 character. */
static int g4__json_bad_utf8(g4__json *j) {
    const unsigned char *s = (const unsigned char *)j->src + j->pos;
    size_t n = j->len - j->pos;
    unsigned c = s[0], c1 = n > 1 ? s[1] : 0;
    char what[128];
    const char *kind;
    if (c >= 0x80 && c <= 0xBF) kind = "a continuation byte with no lead byte";
    else if (c == 0xC0 || c == 0xC1 || (c == 0xE0 && n > 1 && c1 < 0xA0 && c1 >= 0x80) ||
             (c == 0xF0 && n > 1 && c1 < 0x90 && c1 >= 0x80))
        kind = "an overlong encoding";
    else if (c == 0xED && n > 1 && c1 >= 0xA0 && c1 <= 0xBF) kind = "an encoded surrogate (U+D800..U+DFFF)";
    else if (c >= 0xF8) kind = "a byte that never occurs in UTF-8";
    else if (c >= 0xF5 || (c == 0xF4 && n > 1 && c1 >= 0x90 && c1 <= 0xBF)) kind = "a code point past U+10FFFF";
    else kind = "a truncated sequence";
    snprintf(what, sizeof what, "invalid UTF-8: %s (byte 0x%02X)", kind, c);
    return g4__json_fail(j, what);
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

/* Is the text at j->pos "\\u" and four hex digits of a trailing surrogate? */
static int g4__json_low_next(const g4__json *j) {
    unsigned v = 0;
    int i;
    if (j->len - j->pos < 6 || j->src[j->pos] != '\\' || j->src[j->pos + 1] != 'u') return 0;
    for (i = 2; i < 6; i++) {
        char ch = j->src[j->pos + (size_t)i];
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f') v |= (unsigned)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F') v |= (unsigned)(ch - 'A' + 10);
        else return 0;
    }
    return v >= 0xDC00 && v <= 0xDFFF;
}

/* The character the one-letter escape \c stands for when c is in `set` (JSON's
   "\"\\/bfnrt", Python's "\\'\"abfnrtv"; a quote, backslash or slash stands for
   itself), else -1. gemma4_processing.h's template lexer shares it. */
static int g4__escape_char(int c, const char *set) {
    static const char letter[] = "abfnrtv", control[] = "\a\b\f\n\r\t\v";
    const char *l;
    if (!c || !strchr(set, c)) return -1;
    l = strchr(letter, c);
    return l ? control[l - letter] : c;
}

/* Decodes the string at j->pos (just after the opening quote) into strbuf.
   *lone: set when it holds a lone surrogate (j->python only). */
static int g4__json_string(g4__json *j, const char **out, size_t *outlen, int *lone) {
    char *d = j->strbuf + j->strpos, *start = d;
    int e;
    *lone = 0;
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
        case 'u': {
            unsigned cp, lo;
            if (g4__json_hex4(j, &cp)) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF && g4__json_low_next(j)) { /* a pair: one character */
                j->pos += 2;
                if (g4__json_hex4(j, &lo)) return -1;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xD800 && cp <= 0xDFFF) { /* lone: kept by Python's json (as
                   surrogatepass bytes), refused by serde_json (see the top of >>json) */
                if (!j->python) {
                    j->pos -= 6;
                    return g4__json_fail(j, cp <= 0xDBFF ? "lone leading surrogate in \\u escape (no \\udc00..\\udfff after it)"
                                                         : "lone trailing surrogate in \\u escape");
                }
                *lone = 1;
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
        default:
            if ((e = g4__escape_char(ch, "\"\\/bfnrt")) < 0) return g4__json_fail(j, "unknown escape in string");
            *d++ = (char)e;
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
    if (ex == 0 || mant == 0) v = (double)mant; /* 0e400 is 0, not 0 * inf */
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
    if (j->n >= j->cap) { /* grow by doubling, up to one node per two input bytes */
        int cap = j->cap * 2 > j->max_nodes ? j->max_nodes : j->cap * 2;
        g4__jnode *nn;
        if (j->n >= cap) return g4__json_fail(j, "too many values");
        nn = (g4__jnode *)G4_MALLOC(sizeof(g4__jnode) * (size_t)cap);
        if (!nn) return g4__json_fail(j, "out of memory");
        memcpy(nn, j->nodes, sizeof(g4__jnode) * (size_t)j->n);
        G4_FREE(j->nodes);
        j->nodes = nn;
        j->cap = cap;
    }
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
        int child, klone = 0;
        g4__json_ws(j);
        if (is_obj) {
            if (j->pos >= j->len || j->src[j->pos] != '"') return g4__json_fail(j, "expected a member name");
            j->pos++;
            if (g4__json_string(j, &key, &klen, &klone)) return -1;
            g4__json_ws(j);
            if (j->pos >= j->len || j->src[j->pos] != ':') return g4__json_fail(j, "expected ':'");
            j->pos++;
        }
        child = g4__json_value(j, depth + 1);
        if (child < 0) return -1;
        j->nodes[child].key = key;
        j->nodes[child].keylen = key ? klen : 0;
        if (klone) j->nodes[child].lone |= G4__JLONE_KEY;
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
    case '"': {
        int lone;
        if ((nd = g4__json_new(j, G4__JSTR)) < 0) return -1;
        j->pos++;
        if (g4__json_string(j, &j->nodes[nd].str, &j->nodes[nd].len, &lone)) return -1;
        if (lone) j->nodes[nd].lone |= G4__JLONE_STR;
        return nd;
    }
    case 't': return g4__json_lit(j, "true", G4__JTRUE);
    case 'f': return g4__json_lit(j, "false", G4__JFALSE);
    case 'n': return g4__json_lit(j, "null", G4__JNULL);
    default:
        if (ch == '-' || (ch >= '0' && ch <= '9')) {
            if ((nd = g4__json_new(j, G4__JNUM)) < 0) return -1;
            if (g4__json_number(j, &j->nodes[nd])) return -1;
            return nd;
        }
        if ((unsigned char)ch >= 0x80) /* valid UTF-8 (g4__json_parse checked), but not JSON */
            return g4__json_fail(j, "a non-ASCII character outside a string (a byte order mark is not JSON either)");
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
/* Strings and member names may hold \u0000, as in Python's json: nodes keep
   their lengths, and names are compared with them (g4__jis, g4__jget), so
   "a\u0000b" never aliases "a".
   python: lone surrogate escapes are kept (Python's json) rather than refused
   (serde_json); base: src's offset in the file, for the byte offset in messages. */
static g4_result g4__json_parse_ex(g4__json *j, const char *src, size_t len, const char *name, char *err, int python,
                                   size_t base) {
    size_t i;
    memset(j, 0, sizeof *j);
    j->src = src;
    j->len = len;
    j->name = name;
    j->err = err;
    j->python = python;
    j->base = base;
    if (len > (size_t)1 << 30) { g4__seterr(err, "%s: JSON text larger than 1 GiB", name); return G4_ERR_JSON; }
    if ((i = g4__utf8_bad((const unsigned char *)src, len)) < len) { /* the whole text must be UTF-8 first, as every reference reads it */
        j->pos = i;
        g4__json_bad_utf8(j);
        return G4_ERR_JSON;
    }
    j->max_nodes = (int)(len / 2 + 2); /* every value takes at least one byte and a separator */
    if (j->max_nodes > G4__JSON_MAX_NODES) j->max_nodes = G4__JSON_MAX_NODES;
    j->cap = j->max_nodes < 1024 ? j->max_nodes : 1024;
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

/* A file read as tokenizers and safetensors read it (serde_json): lone surrogates are errors.
   (Only gemma4_processing.h calls it: unused without that header.) */
G4__MAYBE_UNUSED static g4_result g4__json_parse(g4__json *j, const char *src, size_t len, const char *name, char *err) {
    return g4__json_parse_ex(j, src, len, name, err, 0, 0);
}

/* A file transformers or peft reads with Python's json: lone surrogates are kept (flagged). */
static g4_result g4__json_parse_python(g4__json *j, const char *src, size_t len, const char *name, char *err) {
    return g4__json_parse_ex(j, src, len, name, err, 1, 0);
}

/* Is node n the string lit (with n's length: a NUL inside never matches)? */
static int g4__jis(const g4__jnode *n, const char *lit) {
    return n->type == G4__JSTR && n->len == strlen(lit) && memcmp(n->str, lit, n->len) == 0;
}

/* Is node n's member name exactly key? */
static int g4__jkey_is(const g4__jnode *n, const char *key) {
    return n->key && n->keylen == strlen(key) && memcmp(n->key, key, n->keylen) == 0;
}

/* Member `key` of object node `obj` (the last one if repeated, as Python's json), or -1. */
static int g4__jget(const g4__json *j, int obj, const char *key) {
    int c, found = -1;
    if (obj < 0 || j->nodes[obj].type != G4__JOBJ) return -1;
    for (c = j->nodes[obj].child; c >= 0; c = j->nodes[c].next)
        if (g4__jkey_is(&j->nodes[c], key)) found = c;
    return found;
}

static const char *g4__jtype_name(int t) {
    static const char *names[] = {"null", "false", "true", "a number", "a string", "an array", "an object"};
    return names[t];
}

/* ------------------------------------------------------- config >>config */

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
    if (nd->type == G4__JNUM && !nd->is_int && nd->num == floor(nd->num) && (nd->num < (double)lo || nd->num > (double)hi)) {
        g4__seterr(c->err, "%s: field '%s%s' is %g, outside [%lld, %lld]", c->name, c->scope, key, nd->num,
                   (long long)lo, (long long)hi);
        return G4_ERR_CONFIG;
    }
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
    if (!g4__jis(nd, ok1) && (!ok2 || !g4__jis(nd, ok2))) {
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
        if (g4__jis(&c->j->nodes[n], "default")) prop = 0;
        else if (g4__jis(&c->j->nodes[n], "proportional")) prop = 1;
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
        if (!*k || strlen(k) != c->j->nodes[e].keylen) goto badkey; /* empty, or a NUL inside */
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
            int is_hd = g4__jkey_is(v, "head_dim"), is_kv = g4__jkey_is(v, "num_key_value_heads");
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

/* Gemma4AssistantConfig's own fields, beside its text_config */
static g4_result g4__cfg_assistant(const g4__cfg *top, g4_config *cfg) {
    g4_result r;
    if ((r = g4__cfg_int(top, "backbone_hidden_size", &cfg->backbone_hidden_size, 1536, 0, 1, 1 << 20)) != G4_OK) return r;
    if ((r = g4__cfg_bool(top, "use_ordered_embeddings", &cfg->use_ordered_embeddings, 0)) != G4_OK) return r;
    if ((r = g4__cfg_int(top, "num_centroids", &cfg->num_centroids, 2048, 0, 1, 1 << 24)) != G4_OK) return r;
    return g4__cfg_int(top, "centroid_intermediate_top_k", &cfg->centroid_intermediate_top_k, 32, 0, 1, 1 << 24);
}

static g4_result g4__audio_config_parse(const g4__json *j, int root, const char *name, g4_audio_config *a, char *err); /* >>audio */
static g4_result g4__cfg_multimodal(const g4__cfg *text, g4_config *cfg); /* >>vision */
static g4_result g4__cfg_unified(const g4__cfg *top, g4_config *cfg); /* >>unified */
static g4_result g4__cfg_unified_all(const g4__cfg *text, g4_config *cfg);

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
    if (mt >= 0 && !g4__jis(&j->nodes[mt], "gemma4") && !g4__jis(&j->nodes[mt], "gemma4_text") &&
        !g4__jis(&j->nodes[mt], "gemma4_assistant") && !g4__jis(&j->nodes[mt], "gemma4_unified") &&
        !g4__jis(&j->nodes[mt], "gemma4_unified_text")) {
        g4__seterr(cfg->error, "%s: model_type \"%.64s\" is not a Gemma 4 text model (gemma4, gemma4_text, "
                   "gemma4_assistant, gemma4_unified, gemma4_unified_text)", name, j->nodes[mt].str);
        return G4_ERR_CONFIG;
    }
    cfg->assistant = mt >= 0 && g4__jis(&j->nodes[mt], "gemma4_assistant");
    cfg->unified = mt >= 0 && (g4__jis(&j->nodes[mt], "gemma4_unified") || g4__jis(&j->nodes[mt], "gemma4_unified_text"));
    n = g4__jget(j, root, "text_config");
    if (n >= 0 && j->nodes[n].type != G4__JNULL) {
        if (j->nodes[n].type != G4__JOBJ) {
            g4__seterr(cfg->error, "%s: field 'text_config' must be an object", name);
            return G4_ERR_CONFIG;
        }
        c.obj = n;
        c.scope = "text_config.";
    } else if (mt >= 0 && (g4__jis(&j->nodes[mt], "gemma4") || g4__jis(&j->nodes[mt], "gemma4_unified") ||
                           cfg->assistant)) {
        g4__seterr(cfg->error, "%s: model_type %s needs a 'text_config' object", name, j->nodes[mt].str);
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
    /* Gemma4UnifiedTextConfig's defaults differ from Gemma4TextConfig's (262144 and 1024 against 131072 and 512) */
    G4__TRY(g4__cfg_int(&c, "max_position_embeddings", &cfg->max_position_embeddings, cfg->unified ? 262144 : 131072,
                        0, 1, INT32_MAX));
    G4__TRY(g4__cfg_float(&c, "rms_norm_eps", &cfg->rms_norm_eps, 1e-6f, 0.0, 1.0));
    G4__TRY(g4__cfg_int(&c, "sliding_window", &cfg->sliding_window, cfg->unified ? 1024 : 512, 0, 1, INT32_MAX));
    G4__TRY(g4__cfg_float(&c, "final_logit_softcapping", &cfg->final_logit_softcapping, 0.0f, 1e-6, 1e30));
    G4__TRY(g4__cfg_bool(&c, "tie_word_embeddings", &cfg->tie_word_embeddings, 1));
    /* pad_token_id is nn.Embedding's padding_idx. transformers' default (absent) is 0; an explicit null
       is None, no padding row (-1 here); a negative id counts from the end as torch's does; torch
       refuses one outside [-vocab_size, vocab_size). */
    n = g4__jget(j, c.obj, "pad_token_id");
    if (n >= 0 && j->nodes[n].type == G4__JNULL) {
        cfg->pad_token_id = -1;
    } else {
        G4__TRY(g4__cfg_int(&c, "pad_token_id", &cfg->pad_token_id, 0, 0, -(int64_t)cfg->vocab_size,
                            cfg->vocab_size - 1));
        if (cfg->pad_token_id < 0) cfg->pad_token_id += cfg->vocab_size;
    }
    if (!cfg->unified) { /* Gemma4UnifiedTextConfig has no per-layer embeddings and no MoE: its keys are not read */
        G4__TRY(g4__cfg_int(&c, "vocab_size_per_layer_input", &cfg->vocab_size_per_layer_input, 262144, 0,
                            cfg->assistant ? 0 : 1, 1 << 24));
        G4__TRY(g4__cfg_int(&c, "hidden_size_per_layer_input", &cfg->hidden_size_per_layer_input, 256, 0, 0, 65536));
    }
    G4__TRY(g4__cfg_bool(&c, "attention_k_eq_v", &cfg->attention_k_eq_v, 0));
    G4__TRY(g4__cfg_int(&c, "num_kv_shared_layers", &cfg->num_kv_shared_layers, 0, 0, 0, G4_MAX_LAYERS));
    G4__TRY(g4__cfg_bool(&c, "use_double_wide_mlp", &cfg->use_double_wide_mlp, 0));
    if (!cfg->unified) {
        G4__TRY(g4__cfg_bool(&c, "enable_moe_block", &cfg->enable_moe_block, 0));
        G4__TRY(g4__cfg_int(&c, "num_experts", &cfg->num_experts, 0, 0, 1, 65536));
        G4__TRY(g4__cfg_int(&c, "top_k_experts", &cfg->top_k_experts, 0, 0, 1, 65536));
        G4__TRY(g4__cfg_int(&c, "moe_intermediate_size", &cfg->moe_intermediate_size, 0, 0, 1, 1 << 22));
    }
    G4__TRY(g4__cfg_int(&c, "global_head_dim", &global_head_dim, 512, 0, 2, 65536));
    G4__TRY(g4__cfg_int(&c, "num_global_key_value_heads", &global_kv, 0, 0, 1, 4096));
    G4__TRY(g4__cfg_expect_str(&c, "hidden_activation", "gelu_pytorch_tanh", NULL));
    G4__TRY(g4__cfg_expect_str(&c, "use_bidirectional_attention", "vision", cfg->unified ? "all" : NULL));
    if (cfg->unified) G4__TRY(g4__cfg_unified_all(&c, cfg));
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
        if (cfg->assistant) G4__TRY(g4__cfg_assistant(&top, cfg));
        if (cfg->unified) G4__TRY(g4__cfg_unified(&top, cfg));
    }
    G4__TRY(g4__cfg_multimodal(&c, cfg));
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
            if (g4__jis(v, "sliding_attention")) cfg->layer_types[i] = G4_SLIDING;
            else if (g4__jis(v, "full_attention")) cfg->layer_types[i] = G4_FULL;
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
    if (cfg->assistant) {
        if (cfg->num_kv_shared_layers == 0) cfg->num_kv_shared_layers = cfg->num_hidden_layers; /* __post_init__ */
        if (cfg->num_kv_shared_layers != cfg->num_hidden_layers || cfg->hidden_size_per_layer_input ||
            cfg->vocab_size_per_layer_input || cfg->enable_moe_block || cfg->use_double_wide_mlp) {
            g4__seterr(cfg->error, "%s: a gemma4_assistant needs every layer shared (num_kv_shared_layers %d of %d), "
                       "no per-layer embeddings (hidden_size_per_layer_input %d, vocab_size_per_layer_input %d), no MoE "
                       "(%d) and no double-wide MLP (%d)", name, cfg->num_kv_shared_layers, cfg->num_hidden_layers,
                       cfg->hidden_size_per_layer_input, cfg->vocab_size_per_layer_input, cfg->enable_moe_block,
                       cfg->use_double_wide_mlp);
            return G4_ERR_CONFIG;
        }
        if (cfg->use_ordered_embeddings &&
            (cfg->vocab_size % cfg->num_centroids || cfg->centroid_intermediate_top_k > cfg->num_centroids)) {
            g4__seterr(cfg->error, "%s: ordered embeddings need vocab_size (%d) divisible by num_centroids (%d) and "
                       "centroid_intermediate_top_k (%d) <= num_centroids", name, cfg->vocab_size, cfg->num_centroids,
                       cfg->centroid_intermediate_top_k);
            return G4_ERR_CONFIG;
        }
    } else if (cfg->num_kv_shared_layers >= cfg->num_hidden_layers) {
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
        if (cfg->top_k_experts > G4_MAX_TOP_K) { /* the forward pass keeps the chosen experts in arrays */
            g4__seterr(cfg->error, "%s: field '%stop_k_experts' is %d; gemma4.h supports at most %d", name, c.scope,
                       cfg->top_k_experts, G4_MAX_TOP_K);
            return G4_ERR_CONFIG;
        }
        if (cfg->num_experts > G4_MAX_EXPERTS) {
            g4__seterr(cfg->error, "%s: field '%snum_experts' is %d; gemma4.h supports at most %d", name, c.scope,
                       cfg->num_experts, G4_MAX_EXPERTS);
            return G4_ERR_CONFIG;
        }
    }
    /* a gemma4_unified audio_config is Gemma4UnifiedAudioConfig, read by g4__cfg_unified (>>unified) */
    return cfg->unified ? G4_OK : g4__audio_config_parse(j, root, name, &cfg->audio, cfg->error);
}

G4__DEF g4_result g4_config_parse(g4_config *cfg, const char *json, size_t len, const char *name) {
    g4__json j;
    g4_result r;
    if (!cfg) return G4_ERR_INPUT;
    memset(cfg, 0, sizeof *cfg);
    if (!name) name = "config.json";
    if (!json) { g4__seterr(cfg->error, "%s: NULL text", name); return G4_ERR_INPUT; }
    if ((r = g4__json_parse_python(&j, json, len, name, cfg->error)) != G4_OK) return r;
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

/* ----------------------------------------------------------- plan >>plan */
/* transformers' rule (Gemma4TextConfig.kv_sharing_modes): layers at or after
   first_shared = L - num_kv_shared_layers read the K/V of the LAST earlier
   layer of the same type. Every other layer owns a slot of the table. */

G4__DEF g4_result g4_plan_build(g4_plan *p, const g4_config *c) {
    int i, L;
    if (!p) return G4_ERR_INPUT;
    memset(p, 0, sizeof *p);
    if (!c) { g4__seterr(p->error, "NULL config"); return G4_ERR_INPUT; }
    L = c->num_hidden_layers;
    if (c->assistant && L >= 1 && L <= G4_MAX_LAYERS && c->num_kv_shared_layers == L) {
        /* a drafter: no slots of its own; every layer reads the target's K/V
           (resolved when a drafter session is attached to a target session) */
        p->n_layers = L;
        for (i = 0; i < L; i++) {
            g4_layer_plan *lp = &p->layer[i];
            lp->type = c->layer_types[i];
            lp->head_dim = c->layer_head_dim[i];
            lp->kv_heads = c->layer_kv_heads[i];
            lp->mlp_width = c->intermediate_size;
            lp->reads = G4_READS_TARGET;
            lp->kv_slot = -1;
        }
        return G4_OK;
    }
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
    if (!p || !c || !f) return;
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
        if (lp->reads == G4_READS_TARGET) fprintf(f, "reads target");
        else if (lp->reads < 0) fprintf(f, "owner");
        else fprintf(f, "reads %d", lp->reads);
        fprintf(f, " mlp %d\n", lp->mlp_width);
    }
}

/* --------------------------------------------- safetensors >>safetensors */
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
        int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO must not block: fstat refuses it below */
        if (fd < 0) { g4__seterr(err, "%s: cannot open (%s)", path, strerror(errno)); return G4_ERR_IO; }
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
    if (strcmp(s, "I16") == 0) return G4_I16;
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

/* The end of the data section the header describes: the largest well-formed
   data_offsets end (0 with none). The file must be exactly 8 + header + that
   long, as safetensors requires ("file not fully covered"): shorter is a
   truncated file, longer one with bytes no tensor owns. */
static uint64_t g4__st_data_end(const g4__json *j) {
    uint64_t end = 0;
    int e, off;
    for (e = j->nodes[0].child; e >= 0; e = j->nodes[e].next) {
        const g4__jnode *b, *en;
        if (j->nodes[e].type != G4__JOBJ || (off = g4__jget(j, e, "data_offsets")) < 0 ||
            j->nodes[off].type != G4__JARR || j->nodes[off].count != 2)
            continue;
        b = &j->nodes[j->nodes[off].child];
        en = &j->nodes[b->next];
        if (b->type == G4__JNUM && b->is_int && en->type == G4__JNUM && en->is_int && b->ival >= 0 && en->ival >= b->ival &&
            (uint64_t)en->ival > end)
            end = (uint64_t)en->ival;
    }
    return end;
}

static g4_result g4__st_size_error(const g4__file *f, uint64_t hlen, uint64_t data_end, char *err) {
    uint64_t want = 8 + hlen + data_end;
    g4__seterr(err, "%s: %s: the file has %llu bytes, its header describes %llu (8 + %llu of header + %llu of data)",
               f->path, want > (uint64_t)f->size ? "truncated" : "longer than its header describes",
               (unsigned long long)f->size, (unsigned long long)want, (unsigned long long)hlen,
               (unsigned long long)data_end);
    return G4_ERR_SAFETENSORS;
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
    if (hlen < 2) {
        g4__seterr(err, "%s: header length %llu is too short for a JSON object", f->path, (unsigned long long)hlen);
        return G4_ERR_SAFETENSORS;
    }
    if (hlen > f->size - 8 || hlen > G4__MAX_HEADER) {
        g4__seterr(err, "%s: header length %llu does not fit the file (%lu bytes)", f->path, (unsigned long long)hlen,
                   (unsigned long)f->size);
        return G4_ERR_SAFETENSORS;
    }
    if ((r = g4__json_parse_ex(j, (const char *)f->bytes + 8, (size_t)hlen, f->path, err, 0, 8)) != G4_OK)
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
        if (g4__jkey_is(&j->nodes[e], "__metadata__")) continue;
        if (strlen(name) != j->nodes[e].keylen) {
            g4__seterr(err, "%s: tensor name '%.200s\\u0000...' holds a NUL character", f->path, name);
            return G4_ERR_SAFETENSORS;
        }
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
        st->t.dtype = strlen(j->nodes[dt].str) == j->nodes[dt].len ? g4__dtype_from(j->nodes[dt].str) : G4_DTYPE_OTHER;
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
            if (b->type == G4__JNUM && b->is_int && en->type == G4__JNUM && en->is_int && b->ival >= 0 &&
                en->ival >= b->ival && (uint64_t)en->ival > data_size)
                return g4__st_size_error(f, hlen, g4__st_data_end(j), err);
            if (b->type != G4__JNUM || !b->is_int || en->type != G4__JNUM || !en->is_int || b->ival < 0 ||
                en->ival < b->ival) {
                g4__seterr(err, "%s: tensor '%.200s': data_offsets must satisfy 0 <= begin <= end <= %llu (data size)",
                           f->path, name, (unsigned long long)data_size);
                return G4_ERR_SAFETENSORS;
            }
            st->begin = (uint64_t)b->ival;
            st->end = (uint64_t)en->ival;
        }
        esz = g4__dtype_size(st->t.dtype);
        if (esz && numel > ((uint64_t)1 << 62) / esz) {
            g4__seterr(err, "%s: tensor '%.200s': element count times dtype size overflows", f->path, name);
            return G4_ERR_SAFETENSORS;
        }
        if (esz && st->end - st->begin != numel * esz) {
            g4__seterr(err, "%s: tensor '%.200s': %llu bytes of data, but its shape and dtype need %llu", f->path, name,
                       (unsigned long long)(st->end - st->begin), (unsigned long long)(numel * esz));
            return G4_ERR_SAFETENSORS;
        }
        st->t.data = data + st->begin;
        (*n)++;
    }
    if (g4__st_data_end(j) != data_size) return g4__st_size_error(f, hlen, g4__st_data_end(j), err);
    return G4_OK;
}

/* After all files are parsed: sort by name, reject duplicates and overlaps. */
static g4_result g4__st_finish(g4_model *m) {
    int i;
    g4__stinfo **byoff;
    const g4__stinfo *a;
    if (m->n_tensors > 1) qsort(m->tensors, (size_t)m->n_tensors, sizeof(g4__stinfo), g4__st_cmp_name);
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
    a = byoff[0];
    for (i = 1; i < m->n_tensors; i++) { /* a: the tensor reaching furthest so far in this file */
        const g4__stinfo *b = byoff[i];
        if (a->file != b->file || byoff[i - 1]->end > a->end) a = byoff[i - 1];
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

/* ----------------------------------------------- model loading >>loading */

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
#if G4__MMAP
    struct stat st; /* no fopen: opening a FIFO would block */
    return stat(path, &st) == 0;
#else
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
#endif
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

/* The index text (read from index_path) -> its shards' tensors. */
static g4_result g4__load_index_text(g4_model *m, const char *dir, const char *index_path, const char *text,
                                     size_t len) {
    g4__json j;
    g4_result r;
    int wm, e, k, n_names = 0;
    const char **names;
    r = g4__json_parse_python(&j, text, len, index_path, m->error);
    if (r != G4_OK) return r;
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
        if (strlen(v->key) != v->keylen || (v->type == G4__JSTR && strlen(v->str) != v->len)) {
            g4__seterr(m->error, "%s: weight_map[\"%.200s\"] holds a NUL character", index_path, v->key);
            r = G4_ERR_SAFETENSORS;
            break;
        }
        if (v->lone) { /* Python's json keeps it; no safetensors header can name such a tensor */
            g4__seterr(m->error, "%s: weight_map[\"%.200s\"] holds a lone surrogate (a \\ud800..\\udfff escape), "
                       "refused in tensor and shard names", index_path, v->key);
            r = G4_ERR_SAFETENSORS;
            break;
        }
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
    if (r == G4_OK) r = g4__st_finish(m); /* sorts by name; a tensor in two shards is an error */
    if (r == G4_OK) { /* every tensor the index lists must be in its shard */
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
    return r;
}

static g4_result g4__load_index(g4_model *m, const char *dir, const char *index_path) {
    char *text;
    size_t len;
    g4_result r;
    if ((r = g4__read_file(index_path, &text, &len, 256u << 20, m->error)) != G4_OK) return r;
    r = g4__load_index_text(m, dir, index_path, text, len);
    G4_FREE(text);
    return r;
}

/* Every tensor the text decoder reads, with its exact shape, in checkpoint
   order: fn(m, user, where it goes, full name, ndim, dims) once for each. The
   loader binds them (g4__bind); `gemma4 synth` writes random ones. Reader
   layers' k_proj/v_proj/k_norm are not listed: they may be in a file (stale),
   and are never bound and never read. */
typedef g4_result (*g4__weight_fn)(g4_model *m, void *user, g4_tensor *dst, const char *name, int ndim,
                                   const int64_t *dims);

static g4_result g4__walk_weights(g4_model *m, g4__weight_fn fn, void *user) {
    const g4_config *c = &m->config;
    const g4_plan *p = &m->plan;
    g4_weights *w = &m->w;
    int64_t H = c->hidden_size, V = c->vocab_size, NH = c->num_attention_heads, L = c->num_hidden_layers;
    int64_t P = c->hidden_size_per_layer_input;
    g4_result r;
    int i;
#define G4__W(t, layer, suffix, nd, a, b, cc)                                                        \
    do {                                                                                            \
        char name_[256];                                                                            \
        int64_t dims_[3];                                                                           \
        dims_[0] = a; dims_[1] = b; dims_[2] = cc;                                                  \
        if (layer >= 0) snprintf(name_, sizeof name_, "%slayers.%d.%s", m->prefix, layer, suffix);  \
        else snprintf(name_, sizeof name_, "%s%s", m->prefix, suffix);                              \
        if ((r = fn(m, user, t, name_, nd, dims_)) != G4_OK) return r;                              \
    } while (0)
    G4__W(&w->embed_tokens, -1, "embed_tokens.weight", 2, V, H, 0);
    if (P) {
        G4__W(&w->embed_tokens_per_layer, -1, "embed_tokens_per_layer.weight", 2, c->vocab_size_per_layer_input, L * P, 0);
        G4__W(&w->per_layer_model_projection, -1, "per_layer_model_projection.weight", 2, L * P, H, 0);
        G4__W(&w->per_layer_projection_norm, -1, "per_layer_projection_norm.weight", 1, P, 0, 0);
    }
    G4__W(&w->norm, -1, "norm.weight", 1, H, 0, 0);
    if (!c->tie_word_embeddings) {
        int64_t dims[3];
        dims[0] = V; dims[1] = H; dims[2] = 0;
        if ((r = fn(m, user, &w->lm_head, "lm_head.weight", 2, dims)) != G4_OK) return r;
    }
    if (!w->layers) {
        w->layers = (g4_layer_weights *)G4_MALLOC(sizeof(g4_layer_weights) * (size_t)L);
        if (!w->layers) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
        memset(w->layers, 0, sizeof(g4_layer_weights) * (size_t)L);
    }
    for (i = 0; i < L; i++) {
        const g4_layer_plan *lp = &p->layer[i];
        g4_layer_weights *lw = &w->layers[i];
        int64_t D = lp->head_dim, KV = lp->kv_heads, I = lp->mlp_width;
        G4__W(&lw->input_layernorm, i, "input_layernorm.weight", 1, H, 0, 0);
        G4__W(&lw->post_attention_layernorm, i, "post_attention_layernorm.weight", 1, H, 0, 0);
        G4__W(&lw->pre_feedforward_layernorm, i, "pre_feedforward_layernorm.weight", 1, H, 0, 0);
        G4__W(&lw->post_feedforward_layernorm, i, "post_feedforward_layernorm.weight", 1, H, 0, 0);
        G4__W(&lw->layer_scalar, i, "layer_scalar", 1, 1, 0, 0);
        G4__W(&lw->q_proj, i, "self_attn.q_proj.weight", 2, NH * D, H, 0);
        G4__W(&lw->q_norm, i, "self_attn.q_norm.weight", 1, D, 0, 0);
        G4__W(&lw->o_proj, i, "self_attn.o_proj.weight", 2, H, NH * D, 0);
        if (lp->reads == -1) {
            G4__W(&lw->k_proj, i, "self_attn.k_proj.weight", 2, KV * D, H, 0);
            G4__W(&lw->k_norm, i, "self_attn.k_norm.weight", 1, D, 0, 0);
            if (lp->has_v_proj) G4__W(&lw->v_proj, i, "self_attn.v_proj.weight", 2, KV * D, H, 0);
        }
        G4__W(&lw->gate_proj, i, "mlp.gate_proj.weight", 2, I, H, 0);
        G4__W(&lw->up_proj, i, "mlp.up_proj.weight", 2, I, H, 0);
        G4__W(&lw->down_proj, i, "mlp.down_proj.weight", 2, H, I, 0);
        if (P) {
            G4__W(&lw->per_layer_input_gate, i, "per_layer_input_gate.weight", 2, P, H, 0);
            G4__W(&lw->per_layer_projection, i, "per_layer_projection.weight", 2, H, P, 0);
            G4__W(&lw->post_per_layer_input_norm, i, "post_per_layer_input_norm.weight", 1, H, 0, 0);
        }
        if (lp->moe) {
            int64_t E = c->num_experts, Ie = c->moe_intermediate_size;
            G4__W(&lw->router_proj, i, "router.proj.weight", 2, E, H, 0);
            G4__W(&lw->router_scale, i, "router.scale", 1, H, 0, 0);
            G4__W(&lw->router_per_expert_scale, i, "router.per_expert_scale", 1, E, 0, 0);
            G4__W(&lw->experts_gate_up, i, "experts.gate_up_proj", 3, E, 2 * Ie, H);
            G4__W(&lw->experts_down, i, "experts.down_proj", 3, E, H, Ie);
            G4__W(&lw->pre_feedforward_layernorm_2, i, "pre_feedforward_layernorm_2.weight", 1, H, 0, 0);
            G4__W(&lw->post_feedforward_layernorm_1, i, "post_feedforward_layernorm_1.weight", 1, H, 0, 0);
            G4__W(&lw->post_feedforward_layernorm_2, i, "post_feedforward_layernorm_2.weight", 1, H, 0, 0);
        }
    }
    if (c->assistant) { /* Gemma4AssistantForCausalLM's own modules (not under the text model's prefix) */
        int64_t Hb = c->backbone_hidden_size, dims[3];
        dims[0] = H; dims[1] = 2 * Hb; dims[2] = 0;
        if ((r = fn(m, user, &w->pre_projection, "pre_projection.weight", 2, dims)) != G4_OK) return r;
        dims[0] = Hb; dims[1] = H;
        if ((r = fn(m, user, &w->post_projection, "post_projection.weight", 2, dims)) != G4_OK) return r;
        if (c->use_ordered_embeddings) {
            dims[0] = c->num_centroids; dims[1] = H;
            if ((r = fn(m, user, &w->centroids, "masked_embedding.centroids.weight", 2, dims)) != G4_OK) return r;
        }
    }
#undef G4__W
    return G4_OK;
}

/* masked_embedding.token_ordering (an integer buffer): [V], a permutation of
   [0, V) (every value is an index into the logits; checked once at load) */
static g4_result g4__bind_token_ordering(g4_model *m) {
    const g4__stinfo *st = g4__st_find(m, "masked_embedding.token_ordering");
    const int V = m->config.vocab_size;
    unsigned char *seen;
    int64_t i;
    if (!st) { g4__seterr(m->error, "checkpoint has no tensor 'masked_embedding.token_ordering' (expected [%d])", V); return G4_ERR_WEIGHTS; }
    if ((st->t.dtype != G4_I64 && st->t.dtype != G4_I32) || st->t.ndim != 1 || st->t.shape[0] != V) {
        g4__seterr(m->error, "%s: tensor 'masked_embedding.token_ordering' must be I64 or I32 of shape [%d]",
                   m->files[st->file].path, V);
        return G4_ERR_WEIGHTS;
    }
    if (!(seen = (unsigned char *)G4_MALLOC((size_t)V))) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
    memset(seen, 0, (size_t)V);
    for (i = 0; i < V; i++) {
        int64_t v = g4__index_get(&st->t, (size_t)i);
        if (v < 0 || v >= V || seen[v]) {
            g4__seterr(m->error, "%s: masked_embedding.token_ordering[%lld] = %lld: not a permutation of [0, %d)",
                       m->files[st->file].path, (long long)i, (long long)v, V);
            G4_FREE(seen);
            return G4_ERR_WEIGHTS;
        }
        seen[v] = 1;
    }
    G4_FREE(seen);
    m->w.token_ordering = st->t;
    return G4_OK;
}

/* The loader's visitor: the tensor must exist, be BF16/F16/F32 and have
   exactly the expected shape. */
static g4_result g4__bind(g4_model *m, void *user, g4_tensor *t, const char *name, int ndim, const int64_t *want) {
    const g4__stinfo *st = g4__st_find(m, name);
    int k, ok;
    char exp[96];
    size_t el = 0;
    (void)user;
    for (k = 0; k < ndim; k++) el += (size_t)snprintf(exp + el, sizeof exp - el, "%s%lld", k ? ", " : "", (long long)want[k]);
    memset(t, 0, sizeof *t);
    if (!st) {
        g4__seterr(m->error, "checkpoint has no tensor '%s' (expected [%s])", name, exp);
        return G4_ERR_WEIGHTS;
    }
    if (st->t.dtype != G4_F32 && st->t.dtype != G4_F16 && st->t.dtype != G4_BF16) {
        g4__seterr(m->error, "%s: tensor '%s' must be BF16, F16 or F32", m->files[st->file].path, name);
        return G4_ERR_WEIGHTS;
    }
    ok = st->t.ndim == ndim;
    for (k = 0; ok && k < ndim; k++) ok = st->t.shape[k] == want[k];
    if (!ok) {
        char got[128] = "";
        size_t gl = 0;
        for (k = 0; k < st->t.ndim && gl < sizeof got - 24; k++)
            gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s%lld", k ? ", " : "", (long long)st->t.shape[k]);
        g4__seterr(m->error, "%s: tensor '%s' has shape [%s], expected [%s]", m->files[st->file].path, name, got, exp);
        return G4_ERR_WEIGHTS;
    }
    *t = st->t;
    return G4_OK;
}

static g4_result g4__unified_bind(g4_model *m); /* >>unified */

static g4_result g4__bind_weights(g4_model *m) {
    g4_result r;
    /* which of the two naming schemes this checkpoint uses */
    if (g4__st_find(m, "model.language_model.embed_tokens.weight")) strcpy(m->prefix, "model.language_model.");
    else if (g4__st_find(m, "model.embed_tokens.weight")) strcpy(m->prefix, "model.");
    else {
        g4__seterr(m->error, "checkpoint has neither 'model.language_model.embed_tokens.weight' nor "
                   "'model.embed_tokens.weight'");
        return G4_ERR_WEIGHTS;
    }
    if ((r = g4__walk_weights(m, g4__bind, NULL)) != G4_OK) return r;
    if (m->config.tie_word_embeddings) m->w.lm_head = m->w.embed_tokens;
    if (m->config.unified && (r = g4__unified_bind(m)) != G4_OK) return r;
    if (m->config.assistant && m->config.use_ordered_embeddings) return g4__bind_token_ordering(m);
    return G4_OK;
}

G4__DEF void g4_model_free(g4_model *m) {
    int i;
    if (!m) return;
    for (i = 0; i < m->n_files; i++) g4__file_close(&m->files[i]);
    G4_FREE(m->files);
    G4_FREE(m->tensors);
    G4_FREE(m->w.layers);
    G4_FREE(m->audio.layers);
    m->audio.layers = NULL;
    m->audio.loaded = 0;
    G4_FREE(m->vision.layers);
    m->vision.layers = NULL;
    m->vision.loaded = 0;
    G4_FREE(m->lora); /* the adapter's table and its A/B, one block */
    m->files = NULL;
    m->tensors = NULL;
    m->w.layers = NULL;
    m->lora = NULL;
    m->n_files = m->n_tensors = m->n_lora = m->lora_rmax = m->lora_ignored = 0;
}

static g4_result g4__audio_bind(g4_model *m); /* >>audio */
static g4_result g4__bind_vision(g4_model *m); /* >>vision */

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
        g4__seterr(m->error, "%s/config.json: %.400s", dir, m->plan.error);
        return r;
    }
    if (!(path = g4__join(dir, "model.safetensors.index.json"))) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
    if (g4__exists(path)) r = g4__load_index(m, dir, path);
    else r = g4__add_file(m, dir, "model.safetensors");
    G4_FREE(path);
    if (r == G4_OK) r = g4__st_finish(m);
    if (r == G4_OK) r = g4__bind_weights(m);
    if (r == G4_OK) r = g4__audio_bind(m);
    if (r == G4_OK) r = g4__bind_vision(m); /* (absent: m->vision.loaded 0) */
    if (r != G4_OK) g4_model_free(m); /* (m->error stays) */
    return r;
}

/* ------------------------------------------------ LoRA adapters >>adapter */
/* g4_model_load_adapter: peft's adapter_config.json and
   adapter_model.safetensors, bound to the model's nn.Linear modules as peft
   binds them (peft 0.21: tuners_utils.py check_target_module_exists,
   lora/model.py _create_and_replace, utils/other.py get_pattern_key). The
   forward's part is g4__lora_u_part + g4__lora_add (>>threads; g4__lora_forward in >>kernels is their scalar reference), run by g4__matmul for a
   weight whose g4_tensor.lora is set; the backward's is g4__linear_backward.
   target_modules (as a string), exclude_modules (as a string),
   layers_pattern, rank_pattern and alpha_pattern are Python regular
   expressions: g4__re is a small engine for the syntax such patterns use
   (literals, . [] classes, \d \w \s, groups, |, * + ? {m,n}, ^ $), a
   Thompson NFA (no backtracking: linear time on any input). */

#define G4__RE_STATES 1024
enum { G4__RE_SET, G4__RE_SPLIT, G4__RE_JUMP, G4__RE_BOL, G4__RE_EOL, G4__RE_MATCH };
typedef struct { unsigned char type, set[32]; int out, out1; } g4__re_state;
typedef struct {
    g4__re_state st[G4__RE_STATES];
    int n, start;
    const char *p, *end;
    const char *bad;         /* why the pattern is refused; NULL: compiled */
    int l1[G4__RE_STATES], l2[G4__RE_STATES];
    unsigned char on[G4__RE_STATES];
} g4__re;
typedef struct { int start, holes; } g4__refrag; /* holes: unpatched outs, chained (state << 1 | which) */

/* the engine (>>regex, at the end of the file) */
static int g4__isdigit(int c);
static int g4__re_compile(g4__re *r, const char *pattern, size_t len);
static int g4__re_full(g4__re *r, const char *str, size_t len);

/* ---- adapter_config.json ---- */
typedef struct {
    g4__cfg c;               /* the JSON and the error helpers of >>config */
    const g4__json *j;
    int target, exclude, layers, lpattern, rpat, apat; /* nodes, -1: absent or null */
    int r, rslora;
    double alpha;
    g4__re *re;
} g4__acfg;

static int g4__anode(const g4__acfg *a, const char *key) {
    int n = g4__jget(a->j, 0, key);
    return n >= 0 && a->j->nodes[n].type != G4__JNULL ? n : -1;
}

/* field key must be absent, null, false, [] or {} (an option this reference does not implement) */
static g4_result g4__acfg_refuse(const g4__acfg *a, const char *key, const char *what) {
    int n = g4__anode(a, key);
    const g4__jnode *nd = n >= 0 ? &a->j->nodes[n] : NULL;
    if (!nd || nd->type == G4__JFALSE || ((nd->type == G4__JARR || nd->type == G4__JOBJ) && nd->count == 0)) return G4_OK;
    g4__seterr(a->c.err, "%s: field '%s' is set: %s is not supported", a->c.name, key, what);
    return G4_ERR_CONFIG;
}

/* a string, or a list of strings (list_ok) */
static g4_result g4__acfg_strs(const g4__acfg *a, const char *key, int n, int list_ok) {
    const g4__jnode *nd = &a->j->nodes[n];
    int e;
    if (nd->type == G4__JSTR && strlen(nd->str) == nd->len) return G4_OK;
    if (nd->type == G4__JARR && list_ok) {
        for (e = nd->child; e >= 0; e = a->j->nodes[e].next)
            if (a->j->nodes[e].type != G4__JSTR || strlen(a->j->nodes[e].str) != a->j->nodes[e].len) break;
        if (e < 0) return G4_OK;
    }
    g4__seterr(a->c.err, "%s: field '%s' must be a string%s (without NUL)", a->c.name, key,
               list_ok ? " or a list of strings" : "");
    return G4_ERR_CONFIG;
}

static g4_result g4__acfg_parse(g4__acfg *a) {
    static const char *const refused[][2] = {
        {"use_dora", "DoRA"}, {"lora_bias", "a LoRA bias"}, {"use_qalora", "QA-LoRA"},
        {"fan_in_fan_out", "fan_in_fan_out (Conv1D weights)"}, {"modules_to_save", "modules_to_save (full copies of modules)"},
        {"target_parameters", "LoRA on parameters (target_parameters)"}, {"layer_replication", "layer_replication"},
        {"trainable_token_indices", "trainable tokens"}, {"alora_invocation_tokens", "activated LoRA"},
        {"use_bdlora", "BD-LoRA"}, {"arrow_config", "Arrow routing"}, {"velora_config", "VeLoRA"},
        {"monteclora_config", "MonteCLoRA"}, {"kasa_config", "KaSA"}, {"megatron_config", "Megatron layers"}};
    const g4__json *j = a->j;
    g4_result r;
    int n, e, k;
    n = g4__anode(a, "peft_type");
    if (n < 0) { g4__seterr(a->c.err, "%s: no field 'peft_type' (a peft adapter config has \"LORA\")", a->c.name); return G4_ERR_CONFIG; }
    if (!g4__jis(&j->nodes[n], "LORA")) {
        g4__seterr(a->c.err, "%s: field 'peft_type' is %s%.40s%s: only \"LORA\" adapters are supported", a->c.name,
                   j->nodes[n].type == G4__JSTR ? "\"" : "", j->nodes[n].type == G4__JSTR ? j->nodes[n].str : g4__jtype_name(j->nodes[n].type),
                   j->nodes[n].type == G4__JSTR ? "\"" : "");
        return G4_ERR_CONFIG;
    }
    for (k = 0; k < (int)(sizeof refused / sizeof refused[0]); k++)
        if ((r = g4__acfg_refuse(a, refused[k][0], refused[k][1])) != G4_OK) return r;
    if ((n = g4__anode(a, "bias")) >= 0 && !g4__jis(&j->nodes[n], "none")) {
        g4__seterr(a->c.err, "%s: field 'bias' must be \"none\": LoRA biases are not supported", a->c.name);
        return G4_ERR_CONFIG;
    }
    if ((r = g4__cfg_int(&a->c, "r", &a->r, 0, 1, 1, 1 << 20)) != G4_OK) return r;
    if ((n = g4__anode(a, "lora_alpha")) < 0 || j->nodes[n].type != G4__JNUM) {
        g4__seterr(a->c.err, "%s: field 'lora_alpha' must be a number, got %s", a->c.name,
                   n < 0 ? "nothing" : g4__jtype_name(j->nodes[n].type));
        return G4_ERR_CONFIG;
    }
    a->alpha = j->nodes[n].num;
    if ((r = g4__cfg_bool(&a->c, "use_rslora", &a->rslora, 0)) != G4_OK) return r;
    if ((a->target = g4__anode(a, "target_modules")) < 0) {
        g4__seterr(a->c.err, "%s: field 'target_modules' is missing or null (peft saves the list it used)", a->c.name);
        return G4_ERR_CONFIG;
    }
    if ((r = g4__acfg_strs(a, "target_modules", a->target, 1)) != G4_OK) return r;
    if ((a->exclude = g4__anode(a, "exclude_modules")) >= 0 && (r = g4__acfg_strs(a, "exclude_modules", a->exclude, 1)) != G4_OK)
        return r;
    if ((a->lpattern = g4__anode(a, "layers_pattern")) >= 0 && (r = g4__acfg_strs(a, "layers_pattern", a->lpattern, 1)) != G4_OK)
        return r;
    if ((a->layers = g4__anode(a, "layers_to_transform")) >= 0) {
        const g4__jnode *nd = &j->nodes[a->layers];
        int ok = nd->type == G4__JNUM && nd->is_int;
        if (nd->type == G4__JARR) {
            for (ok = 1, e = nd->child; e >= 0; e = j->nodes[e].next) ok &= j->nodes[e].type == G4__JNUM && j->nodes[e].is_int;
        }
        if (!ok) {
            g4__seterr(a->c.err, "%s: field 'layers_to_transform' must be an integer or a list of integers", a->c.name);
            return G4_ERR_CONFIG;
        }
    }
    if (j->nodes[a->target].type == G4__JSTR && (a->layers >= 0 || a->lpattern >= 0)) {
        g4__seterr(a->c.err, "%s: field '%s' cannot be used when target_modules is a string (peft refuses it too)",
                   a->c.name, a->layers >= 0 ? "layers_to_transform" : "layers_pattern");
        return G4_ERR_CONFIG;
    }
    for (k = 0; k < 2; k++) {
        const char *key = k ? "alpha_pattern" : "rank_pattern";
        int p = g4__anode(a, key);
        if (k) a->apat = p; else a->rpat = p;
        if (p < 0) continue;
        if (j->nodes[p].type != G4__JOBJ) { g4__seterr(a->c.err, "%s: field '%s' must be an object", a->c.name, key); return G4_ERR_CONFIG; }
        for (e = j->nodes[p].child; e >= 0; e = j->nodes[e].next) {
            const g4__jnode *v = &j->nodes[e];
            if (strlen(v->key) != v->keylen || v->type != G4__JNUM || (!k && (!v->is_int || v->ival < 1 || v->ival > (1 << 20)))) {
                g4__seterr(a->c.err, "%s: %s[\"%.100s\"] must be %s", a->c.name, key, v->key,
                           k ? "a number" : "a positive integer rank");
                return G4_ERR_CONFIG;
            }
        }
    }
    return G4_OK;
}

/* pattern fullmatches str? -1 (error set) when the pattern is not supported */
static int g4__acfg_re(const g4__acfg *a, const char *field, const char *pattern, const char *str, size_t len) {
    if (g4__re_compile(a->re, pattern, strlen(pattern)) != 0) {
        g4__seterr(a->c.err, "%s: field '%s': the regular expression \"%.100s\" is not supported: %s", a->c.name, field,
                   pattern, a->re->bad);
        return -1;
    }
    return g4__re_full(a->re, str, len);
}

/* key is t, or ends in "." t (peft's list matching) */
static int g4__key_is(const char *key, const char *t) {
    size_t k = strlen(key), n = strlen(t);
    return (k == n && !memcmp(key, t, n)) || (k > n && key[k - n - 1] == '.' && !memcmp(key + k - n, t, n));
}

/* the layer index peft reads from key for layers_to_transform: 1 found (*idx), 0 none, -1 error */
static int g4__acfg_layer_index(const g4__acfg *a, const char *key, long *idx) {
    const g4__json *j = a->j;
    size_t len = strlen(key), p, q, d;
    int e, one = a->lpattern >= 0 && j->nodes[a->lpattern].type == G4__JSTR;
    if (a->lpattern < 0 || (one && !j->nodes[a->lpattern].len) || (!one && !j->nodes[a->lpattern].count)) {
        /* .*?\.[^.]*\.(\d+)\. : the first ".name.<digits>." */
        for (p = 0; p < len; p++) {
            if (key[p] != '.') continue;
            for (q = p + 1; q < len && key[q] != '.'; q++) {}
            for (d = q + 1; d < len && g4__isdigit(key[d]); d++) {}
            if (q < len && d > q + 1 && d < len && key[d] == '.' && d - q - 1 < 9) { *idx = strtol(key + q + 1, NULL, 10); return 1; }
        }
        return 0;
    }
    /* (?:^|.*?\.)<pattern>\.(\d+)\. for each pattern: the first start (0, then after each dot),
       then the first end of <pattern> followed by ".<digits>." */
    for (e = one ? a->lpattern : j->nodes[a->lpattern].child; e >= 0; e = one ? -1 : j->nodes[e].next)
        for (p = 0; p < len; p++) {
            if (p > 0 && key[p - 1] != '.') continue;
            for (q = p; q < len; q++) {
                int hit;
                if (key[q] != '.') continue;
                for (d = q + 1; d < len && g4__isdigit(key[d]); d++) {}
                if (d == q + 1 || d >= len || key[d] != '.' || d - q - 1 >= 9) continue;
                if ((hit = g4__acfg_re(a, "layers_pattern", j->nodes[e].str, key + p, q - p)) < 0) return -1;
                if (hit) { *idx = strtol(key + q + 1, NULL, 10); return 1; }
            }
        }
    return 0;
}

/* check_target_module_exists for one module key: 1 targeted, 0 not, -1 error */
static int g4__acfg_targets(const g4__acfg *a, const char *key, int is_lm_head) {
    const g4__json *j = a->j;
    const g4__jnode *t = &j->nodes[a->target];
    int e, hit = 0;
    if (a->exclude >= 0) {
        const g4__jnode *x = &j->nodes[a->exclude];
        if (x->type == G4__JSTR) {
            if ((hit = g4__acfg_re(a, "exclude_modules", x->str, key, strlen(key))) != 0) return hit < 0 ? -1 : 0;
        } else {
            for (e = x->child; e >= 0; e = j->nodes[e].next)
                if (g4__key_is(key, j->nodes[e].str)) return 0;
        }
    }
    if (t->type == G4__JSTR) {
        if (!strcmp(t->str, "all-linear")) return !is_lm_head; /* peft: every linear but the output layer */
        return g4__acfg_re(a, "target_modules", t->str, key, strlen(key));
    }
    for (e = t->child; e >= 0 && !hit; e = j->nodes[e].next) hit = g4__key_is(key, j->nodes[e].str);
    if (hit && a->layers >= 0) {
        const g4__jnode *L = &j->nodes[a->layers];
        long idx;
        int found = g4__acfg_layer_index(a, key, &idx);
        if (found < 0) return -1;
        if (!found) return 0;
        if (L->type == G4__JNUM) return L->ival == idx;
        if (L->count == 0) return 1; /* [] transforms every layer */
        for (hit = 0, e = L->child; e >= 0; e = j->nodes[e].next) hit |= j->nodes[e].ival == idx;
    }
    return hit;
}

/* rank_pattern / alpha_pattern: the first key k with re.match("(.*\.)?(k)$", key), else -1 */
static int g4__acfg_pattern(const g4__acfg *a, int obj, const char *field, const char *key, int *node) {
    const g4__json *j = a->j;
    int e;
    *node = -1;
    if (obj < 0) return 0;
    for (e = j->nodes[obj].child; e >= 0; e = j->nodes[e].next) {
        size_t kl = strlen(j->nodes[e].key);
        char *pat = (char *)G4_MALLOC(kl + 16);
        int hit;
        if (!pat) { g4__seterr(a->c.err, "out of memory"); return -1; }
        snprintf(pat, kl + 16, "(?:.*\\.)?(?:%s)", j->nodes[e].key);
        hit = g4__acfg_re(a, field, pat, key, strlen(key));
        G4_FREE(pat);
        if (hit < 0) return -1;
        if (hit) { *node = e; return 0; }
    }
    return 0;
}

/* ---- binding ---- */
typedef struct {
    int layer, on;           /* on: the adapter targets it */
    const char *module;
    g4_tensor *w;
    char tkey[112];          /* a tower's linear: its peft module key (else empty) */
    char tname[48];          /* and its short name (g4_lora.module): "vision_tower.3.self_attn.q_proj" */
} g4__linear;

/* room for g4__linears: the text model's, then the towers' (vision: 7 a layer + 2; audio: 11 a layer + 3),
   then the 12B's embedders' (3) */
static int g4__linears_cap(const g4_model *m) {
    return 10 * m->plan.n_layers + 2 + (m->vision.loaded ? 7 * m->config.vision.num_hidden_layers + 2 : 0) +
           (m->audio.loaded ? 11 * m->config.audio.num_hidden_layers + 3 : 0) + 3;
}

/* The towers' nn.Linear modules as peft keys them: a Gemma4ClippableLinear
   through its inner nn.Linear (peft wraps only that: "<module>.linear"), the
   plain ones by their own names; and the 12B unified model's embedders'
   (>>unified, g4__ulinear applies them). The short name (g4_lora.module): the
   tower, the layer (l >= 0), the module. */
static int g4__tower_linear(g4__linear *o, g4_tensor *w, const char *key, const char *tower, int l, const char *module) {
    o->layer = -1;
    o->on = 0;
    o->w = w;
    snprintf(o->tkey, sizeof o->tkey, "%s", key);
    if (l >= 0) snprintf(o->tname, sizeof o->tname, "%s.%d.%s", tower, l, module);
    else snprintf(o->tname, sizeof o->tname, "%s.%s", tower, module);
    o->module = o->tname;
    return 1;
}

static int g4__tower_linears(g4_model *m, g4__linear *out) {
    static const char *const vnames[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    static const char *const anames[11] = {"feed_forward1.ffw_layer_1", "feed_forward1.ffw_layer_2", "feed_forward2.ffw_layer_1",
                                           "feed_forward2.ffw_layer_2", "self_attn.q_proj", "self_attn.k_proj",
                                           "self_attn.v_proj", "self_attn.post", "lconv1d.linear_start", "lconv1d.linear_end",
                                           "self_attn.relative_k_proj"};
    char key[112];
    int n = 0, l, k;
    if (m->vision.loaded) {
        for (l = 0; l < m->config.vision.num_hidden_layers; l++) {
            g4_vision_layer *L = &m->vision.layers[l];
            g4_clippable_linear *c[7];
            c[0] = &L->q_proj; c[1] = &L->k_proj; c[2] = &L->v_proj; c[3] = &L->o_proj;
            c[4] = &L->gate_proj; c[5] = &L->up_proj; c[6] = &L->down_proj;
            for (k = 0; k < 7; k++) {
                snprintf(key, sizeof key, "model.vision_tower.encoder.layers.%d.%s.linear", l, vnames[k]);
                n += g4__tower_linear(&out[n], &c[k]->linear, key, "vision_tower", l, vnames[k]);
            }
        }
        n += g4__tower_linear(&out[n], &m->vision.input_proj, "model.vision_tower.patch_embedder.input_proj", "vision_tower", -1,
                              "patch_embedder.input_proj");
        n += g4__tower_linear(&out[n], &m->vision.embedding_projection, "model.embed_vision.embedding_projection", "embed_vision",
                              -1, "embedding_projection");
    }
    if (m->audio.loaded) {
        for (l = 0; l < m->config.audio.num_hidden_layers; l++) {
            g4_audio_layer_weights *lw = &m->audio.layers[l];
            g4_clippable_linear *c[10];
            c[0] = &lw->feed_forward1.ffw_layer_1; c[1] = &lw->feed_forward1.ffw_layer_2;
            c[2] = &lw->feed_forward2.ffw_layer_1; c[3] = &lw->feed_forward2.ffw_layer_2;
            c[4] = &lw->q_proj; c[5] = &lw->k_proj; c[6] = &lw->v_proj; c[7] = &lw->post;
            c[8] = &lw->linear_start; c[9] = &lw->linear_end;
            for (k = 0; k < 10; k++) {
                snprintf(key, sizeof key, "model.audio_tower.layers.%d.%s.linear", l, anames[k]);
                n += g4__tower_linear(&out[n], &c[k]->linear, key, "audio_tower", l, anames[k]);
            }
            snprintf(key, sizeof key, "model.audio_tower.layers.%d.%s", l, anames[10]);
            n += g4__tower_linear(&out[n], &lw->relative_k_proj, key, "audio_tower", l, anames[10]);
        }
        n += g4__tower_linear(&out[n], &m->audio.input_proj_linear, "model.audio_tower.subsample_conv_projection.input_proj_linear",
                              "audio_tower", -1, "input_proj_linear");
        n += g4__tower_linear(&out[n], &m->audio.output_proj, "model.audio_tower.output_proj", "audio_tower", -1, "output_proj");
        n += g4__tower_linear(&out[n], &m->audio.embedding_projection, "model.embed_audio.embedding_projection", "embed_audio",
                              -1, "embedding_projection");
    }
    /* the 12B's encoder-free embedders (>>unified), by their module names (the checkpoint stores the vision
       projection as embed_vision.embedding_projection; peft keys the module) */
    if (m->config.unified && m->config.unified_vision.present) {
        n += g4__tower_linear(&out[n], &m->w.unified.patch_dense_weight, "model.embed_vision.patch_dense", "embed_vision", -1,
                              "patch_dense");
        n += g4__tower_linear(&out[n], &m->w.unified.vision_projection, "model.embed_vision.multimodal_embedder.embedding_projection",
                              "embed_vision", -1, "embedding_projection"); /* (short name: the checkpoint's) */
    }
    if (m->config.unified && m->config.unified_audio.present)
        n += g4__tower_linear(&out[n], &m->w.unified.audio_projection, "model.embed_audio.embedding_projection", "embed_audio",
                              -1, "embedding_projection");
    return n;
}

/* Every nn.Linear of the text model, as peft sees them: [n] into out (room for 10 L + 2). */
static int g4__linears(g4_model *m, g4__linear *out) {
    static const char *const names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "router.proj",
                                        "per_layer_input_gate", "per_layer_projection"};
    int l, k, n = 0;
    for (l = 0; l < m->plan.n_layers; l++) {
        g4_layer_weights *lw = &m->w.layers[l];
        g4_tensor *w[10];
        w[0] = &lw->q_proj; w[1] = &lw->k_proj; w[2] = &lw->v_proj; w[3] = &lw->o_proj; w[4] = &lw->gate_proj;
        w[5] = &lw->up_proj; w[6] = &lw->down_proj; w[7] = &lw->router_proj; w[8] = &lw->per_layer_input_gate;
        w[9] = &lw->per_layer_projection;
        for (k = 0; k < 10; k++)
            if (w[k]->data) { out[n].layer = l; out[n].on = 0; out[n].module = names[k]; out[n].w = w[k]; out[n].tkey[0] = 0; n++; }
    }
    if (m->w.per_layer_model_projection.data) {
        out[n].layer = -1; out[n].on = 0; out[n].module = "per_layer_model_projection"; out[n].w = &m->w.per_layer_model_projection;
        out[n].tkey[0] = 0; n++;
    }
    out[n].layer = -1; out[n].on = 0; out[n].module = "lm_head"; out[n].w = &m->w.lm_head; out[n].tkey[0] = 0; n++;
    return n + g4__tower_linears(m, out + n); /* then the towers' */
}

static void g4__linear_key(const g4_model *m, const g4__linear *li, char *key, size_t cap) {
    if (li->tkey[0]) snprintf(key, cap, "%s", li->tkey);
    else if (li->layer >= 0) snprintf(key, cap, "%slayers.%d.%s", m->prefix, li->layer, li->module);
    else if (!strcmp(li->module, "lm_head")) snprintf(key, cap, "lm_head");
    else snprintf(key, cap, "%s%s", m->prefix, li->module);
}

static int g4__st_cmp_key(const void *k, const void *b) { return strcmp((const char *)k, ((const g4__stinfo *)b)->name); }

/* the adapter tensor `name` must exist, be BF16/F16/F32 and [rows, cols] */
static g4_result g4__lora_tensor(g4__stinfo *list, int n, unsigned char *used, const char *path, const char *name,
                                 int64_t rows, int64_t cols, const char *why, const g4__stinfo **out, char *err) {
    const g4__stinfo *st = (const g4__stinfo *)bsearch(name, list, (size_t)n, sizeof *list, g4__st_cmp_key);
    if (!st) {
        g4__seterr(err, "%s has no tensor '%s' (adapter_config.json targets the module; %s)", path, name, why);
        return G4_ERR_WEIGHTS;
    }
    if (st->t.dtype != G4_F32 && st->t.dtype != G4_F16 && st->t.dtype != G4_BF16) {
        g4__seterr(err, "%s: tensor '%s' must be BF16, F16 or F32", path, name);
        return G4_ERR_WEIGHTS;
    }
    if (st->t.ndim != 2 || st->t.shape[0] != rows || st->t.shape[1] != cols) {
        g4__seterr(err, "%s: tensor '%s' has shape [%lld%s%lld], expected [%lld, %lld] (%s)", path, name,
                   (long long)st->t.shape[0], st->t.ndim > 1 ? ", " : "", st->t.ndim > 1 ? (long long)st->t.shape[1] : 0LL,
                   (long long)rows, (long long)cols, why);
        return G4_ERR_WEIGHTS;
    }
    used[st - list] = 1;
    *out = st;
    return G4_OK;
}

/* Why an adapter tensor no module took is wrong (or ignorable): 1 ignore, else the error is set. */
static int g4__lora_stray(const g4_model *m, const g4__linear *lin, int n_lin, const char *path, const char *name, char *err) {
    static const char *const towers[] = {"vision_tower.", "audio_tower.", "embed_vision.", "embed_audio."};
    const char *pre = "base_model.model.", *mod;
    char key[256];
    size_t len = strlen(name), k;
    int i;
    if (strncmp(name, pre, strlen(pre)) != 0) {
        g4__seterr(err, "%s: tensor '%.200s' is not a peft LoRA tensor (names start with 'base_model.model.')", path, name);
        return 0;
    }
    mod = name + strlen(pre);
    for (k = 0; k < 4; k++) /* a tower this model has not loaded: ignored (counted in lora_ignored) */
        if (!strncmp(mod, "model.", 6) && !strncmp(mod + 6, towers[k], strlen(towers[k])) &&
            !(k % 2 ? m->audio.loaded : m->vision.loaded) &&
            !(k >= 2 && m->config.unified && (k % 2 ? m->config.unified_audio.present : m->config.unified_vision.present)))
            return 1;
    if (len > 14 && strstr(name, ".lora_embedding_")) {
        g4__seterr(err, "%s: tensor '%.200s': LoRA on an embedding is not supported", path, name);
        return 0;
    }
    if (!(len > 14 && (!strcmp(name + len - 14, ".lora_A.weight") || !strcmp(name + len - 14, ".lora_B.weight")))) {
        g4__seterr(err, "%s: tensor '%.200s' is neither a lora_A.weight nor a lora_B.weight (DoRA magnitudes, biases and "
                   "other variants are not supported)", path, name);
        return 0;
    }
    snprintf(key, sizeof key, "%.*s", (int)(len - 14 - strlen(pre)), mod);
    for (i = 0; i < n_lin; i++) {
        char k2[256];
        g4__linear_key(m, &lin[i], k2, sizeof k2);
        if (!strcmp(k2, key)) {
            g4__seterr(err, "%s: tensor '%.200s': adapter_config.json does not target module '%s'", path, name, key);
            return 0;
        }
    }
    for (k = 0; k < 4; k++)
        if (!strncmp(key, "model.", 6) && !strncmp(key + 6, towers[k], strlen(towers[k]))) {
            if (m->config.unified)
                g4__seterr(err, "%s: tensor '%.200s': the unified %s embedder has no nn.Linear module '%s' (its linears: "
                           "%s)", path, name, k % 2 ? "audio" : "vision", key,
                           k % 2 ? "model.embed_audio.embedding_projection"
                                 : "model.embed_vision.patch_dense, model.embed_vision.multimodal_embedder.embedding_projection");
            else
                g4__seterr(err, "%s: tensor '%.200s': the %s has no nn.Linear module '%s' (a clipped linear is adapted through "
                           "its inner '.linear')", path, name, k % 2 ? "audio tower" : "vision tower", key);
            return 0;
        }
    if (!strncmp(key, "model.", 6) && !strncmp(key, "model.language_model.", 21) != !strcmp(m->prefix, "model.language_model.")) {
        g4__seterr(err, "%s: tensor '%.200s' names module '%s', but this checkpoint's text model is '%s*' (an adapter of "
                   "the %s)", path, name, key, m->prefix,
                   !strncmp(key, "model.language_model.", 21) ? "multimodal wrapper" : "text-only model");
        return 0;
    }
    g4__seterr(err, "%s: tensor '%.200s': this model has no nn.Linear module '%s'", path, name, key);
    return 0;
}

G4__DEF g4_result g4_model_load_adapter(g4_model *m, const char *dir) {
    char *cpath = NULL, *spath = NULL, *text = NULL, key[256], an[300], bn[300];
    size_t len, floats = 0, bytes;
    g4__json j;
    g4__acfg a;
    g4__file f;
    g4__stinfo *list = NULL;
    int n = 0, cap = 0, n_lin = 0, n_lora = 0, i, k2, rmax = 0, ignored = 0;
    unsigned char *used = NULL;
    g4__linear *lin = NULL;
    g4_lora *lo = NULL;
    g4_result r;
    if (!m) return G4_ERR_INPUT;
    if (!m->w.layers) { g4__seterr(m->error, "load the model before its adapter"); return G4_ERR_INPUT; }
    if (!dir) { g4__seterr(m->error, "NULL adapter path"); return G4_ERR_INPUT; }
    if (m->lora) { g4__seterr(m->error, "the model already has an adapter (one per model)"); return G4_ERR_INPUT; }
    memset(&j, 0, sizeof j);
    memset(&f, 0, sizeof f);
    memset(&a, 0, sizeof a);
    cpath = g4__join(dir, "adapter_config.json");
    spath = g4__join(dir, "adapter_model.safetensors");
    a.re = (g4__re *)G4_MALLOC(sizeof(g4__re));
    lin = (g4__linear *)G4_MALLOC(sizeof(g4__linear) * (size_t)g4__linears_cap(m));
    if (!cpath || !spath || !a.re || !lin) { g4__seterr(m->error, "out of memory"); r = G4_ERR_NOMEM; goto done; }
    if ((r = g4__read_file(cpath, &text, &len, 16u << 20, m->error)) != G4_OK) goto done;
    if ((r = g4__json_parse_python(&j, text, len, cpath, m->error)) != G4_OK) goto done;
    if (j.nodes[0].type != G4__JOBJ) { g4__seterr(m->error, "%s: must be a JSON object", cpath); r = G4_ERR_CONFIG; goto done; }
    a.j = &j;
    a.c.j = &j; a.c.obj = 0; a.c.name = cpath; a.c.scope = ""; a.c.err = m->error;
    if ((r = g4__acfg_parse(&a)) != G4_OK) goto done;
    if ((r = g4__file_open(&f, spath, m->error)) != G4_OK) goto done;
    if ((r = g4__st_parse(&f, 0, &list, &n, &cap, m->error)) != G4_OK) goto done;
    if (n > 1) qsort(list, (size_t)n, sizeof *list, g4__st_cmp_name);
    for (i = 1; i < n; i++)
        if (!strcmp(list[i - 1].name, list[i].name)) {
            g4__seterr(m->error, "%s: tensor '%.200s' appears twice", spath, list[i].name);
            r = G4_ERR_SAFETENSORS;
            goto done;
        }
    used = (unsigned char *)G4_MALLOC((size_t)n + 1);
    if (!used) { g4__seterr(m->error, "out of memory"); r = G4_ERR_NOMEM; goto done; }
    memset(used, 0, (size_t)n + 1);
    n_lin = g4__linears(m, lin);
    /* pass 1: which modules, their ranks, and their tensors' shapes */
    for (i = 0; i < n_lin; i++) {
        const g4__stinfo *A, *B;
        int hit, rn, an_node, rank = a.r;
        char why[64];
        g4__linear_key(m, &lin[i], key, sizeof key);
        hit = g4__acfg_targets(&a, key, lin[i].layer < 0 && !strcmp(lin[i].module, "lm_head"));
        if (hit < 0) { r = G4_ERR_CONFIG; goto done; }
        if (!hit) continue;
        lin[i].on = 1;
        if (g4__acfg_pattern(&a, a.rpat, "rank_pattern", key, &rn) < 0 || g4__acfg_pattern(&a, a.apat, "alpha_pattern", key, &an_node) < 0) {
            r = G4_ERR_CONFIG;
            goto done;
        }
        if (rn >= 0) rank = (int)j.nodes[rn].ival;
        snprintf(why, sizeof why, "rank %d%s", rank, rn >= 0 ? " from rank_pattern" : "");
        snprintf(an, sizeof an, "base_model.model.%s.lora_A.weight", key);
        snprintf(bn, sizeof bn, "base_model.model.%s.lora_B.weight", key);
        if ((r = g4__lora_tensor(list, n, used, spath, an, rank, lin[i].w->shape[1], why, &A, m->error)) != G4_OK) goto done;
        if ((r = g4__lora_tensor(list, n, used, spath, bn, lin[i].w->shape[0], rank, why, &B, m->error)) != G4_OK) goto done;
        floats += (size_t)rank * (size_t)(2 * lin[i].w->shape[0] + lin[i].w->shape[1]); /* A, B and B^T */
        if (rank > rmax) rmax = rank;
        n_lora++;
    }
    for (i = 0; i < n; i++) {
        if (used[i]) continue;
        if (!g4__lora_stray(m, lin, n_lin, spath, list[i].name, m->error)) { r = G4_ERR_WEIGHTS; goto done; }
        ignored++;
    }
    if (!n_lora) {
        g4__seterr(m->error, "%s: the adapter changes no module of this model (its text decoder or towers)", dir);
        r = G4_ERR_CONFIG;
        goto done;
    }
    /* pass 2: one block, the table then A, B and B^T of each module in float32 */
    bytes = sizeof(g4_lora) * (size_t)n_lora;
    bytes = (bytes + 63) & ~(size_t)63;
    lo = (g4_lora *)G4_MALLOC(bytes + sizeof(float) * floats);
    if (!lo) { g4__seterr(m->error, "out of memory for an adapter of %lu floats", (unsigned long)floats); r = G4_ERR_NOMEM; goto done; }
    memset(lo, 0, bytes);
    {
        float *next = (float *)(void *)((unsigned char *)lo + bytes);
        int k = 0;
        for (i = 0; i < n_lin; i++) {
            g4_lora *e = &lo[k];
            const g4__stinfo *A, *B;
            int rn, an_node;
            size_t x, cA, cB;
            if (!lin[i].on) continue;
            g4__linear_key(m, &lin[i], key, sizeof key);
            (void)g4__acfg_pattern(&a, a.rpat, "rank_pattern", key, &rn);
            (void)g4__acfg_pattern(&a, a.apat, "alpha_pattern", key, &an_node);
            snprintf(an, sizeof an, "base_model.model.%s.lora_A.weight", key);
            snprintf(bn, sizeof bn, "base_model.model.%s.lora_B.weight", key);
            A = (const g4__stinfo *)bsearch(an, list, (size_t)n, sizeof *list, g4__st_cmp_key);
            B = (const g4__stinfo *)bsearch(bn, list, (size_t)n, sizeof *list, g4__st_cmp_key);
            e->layer = lin[i].layer;
            snprintf(e->module, sizeof e->module, "%s", lin[i].module);
            snprintf(e->key, sizeof e->key, "%.159s", key);
            e->r = (int)A->t.shape[0];
            e->in = (int)A->t.shape[1];
            e->out = (int)B->t.shape[0];
            e->alpha = (float)(an_node >= 0 ? j.nodes[an_node].num : a.alpha);
            /* peft: scaling = lora_alpha / r (Python floats), multiplied in float32 */
            e->scale = (float)((an_node >= 0 ? j.nodes[an_node].num : a.alpha) / (a.rslora ? sqrt((double)e->r) : (double)e->r));
            e->base = lin[i].w;
            cA = (size_t)e->r * (size_t)e->in;
            cB = (size_t)e->out * (size_t)e->r;
            e->A = next; next += cA;
            e->B = next; next += cB;
            e->Bt = next; next += cB;
            for (x = 0; x < cA; x++) e->A[x] = g4__get(&A->t, x);
            for (x = 0; x < cB; x++) e->B[x] = g4__get(&B->t, x);
            for (x = 0; x < cB; x++) e->Bt[(x % (size_t)e->r) * (size_t)e->out + x / (size_t)e->r] = e->B[x];
            k++;
        }
    }
    /* commit: the model's weights point at their adapters */
    for (i = 0, k2 = 0; i < n_lin; i++)
        if (lin[i].on) lin[i].w->lora = &lo[k2++];
    m->lora = lo;
    m->n_lora = n_lora;
    m->lora_rmax = rmax;
    m->lora_ignored = ignored;
    r = G4_OK;
done:
    if (f.path) g4__file_close(&f);
    g4__json_free(&j);
    G4_FREE(list);
    G4_FREE(used);
    G4_FREE(lin);
    G4_FREE(a.re);
    G4_FREE(text);
    G4_FREE(cpath);
    G4_FREE(spath);
    return r;
}

/* ---------------------------------------------- scalar kernels >>kernels */
/* The scalar reference kernels. Everything heavy goes through these few
   functions; faster versions go beside them and are tested against them. */

/* float32 -> bfloat16 -> float32, round to nearest even (NaN stays NaN) */
G4__HD static float g4__bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return f;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* g4__bf16_round on x[0, 16) without a branch, a loop compilers vectorize
   (the bf16 mode rounds every activation: 4% of a bf16_fast prefill) */
static G4__INLINE void g4__bf16_round16(float *x) {
    uint32_t u[16], r;
    int l;
    memcpy(u, x, sizeof u);
    for (l = 0; l < 16; l++) {
        r = (u[l] + 0x7fffu + ((u[l] >> 16) & 1u)) & 0xffff0000u;
        u[l] = (u[l] & 0x7fffffffu) > 0x7f800000u ? u[l] : r; /* NaN stays */
    }
    memcpy(x, u, sizeof u);
}

/* g4__bf16_round on x[i0, i1) (a range job: ctx is x) */
static void g4__bf16_round_range(void *ctx, size_t i0, size_t i1) {
    float *x = (float *)ctx;
    size_t i = i0;
    for (; i + 16 <= i1; i += 16) g4__bf16_round16(x + i);
    for (; i < i1; i++) x[i] = g4__bf16_round(x[i]);
}

/* Reference matmul on output rows [o0, o1): y[t][o] = sum_i x[t][i] * W[o][i]
   for t < n, x [n][in], W [out][in] as stored, summed left to right. */
G4__MAYBE_UNUSED static void g4__matmul_ref(float *y, const float *x, const g4_tensor *w, int n, int o0, int o1) {
    int out = (int)w->shape[0], in = (int)w->shape[1], o, t, i;
    const unsigned char *base = (const unsigned char *)w->data;
    size_t esz = g4__dtype_size(w->dtype);
    for (o = o0; o < o1; o++) {
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

/* The bf16-faithful mode's matmul (bf16 weights, bf16-valued x): every output
   summed in the order of torch's bf16 F.linear on a CPU where ATen runs its
   AVX2 kernels (cpublas' gemm_transa_ -> dot_with_fp32_arith, 8-lane float
   vectors), as the transformers-bf16 goldens were made:
     - 8 accumulators r of 8 lanes l take the inputs 64 j + 8 r + l;
     - then r += r + 4, r += r + 2, r += r + 1, and the 8 lanes of r = 0 are
       added as ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)) (g4__hsum8);
     - the inputs past the last multiple of 64, 16 at a time, go into one more
       8-lane accumulator (lane l: 16 j + l, then 16 j + 8 + l), whose lanes
       are added the same way and then added to the sum;
     - the last in % 16 inputs are added one by one.
   A product of two bf16 values is exact in float32, so FMA or multiply-then-
   add give the same bits. This order, emulated in Python, equals torch
   2.15's F.linear on 1.1M bf16 outputs (in 16 to 1536, 1 to 300 rows);
   tests/test_gemma4.c checks
   the AVX2 twin against this function. Under AVX-512 kernels torch sums in
   16 lanes instead: that order is not this one. */
G4__HD static float g4__hsum8(const float *v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

/* torch's order for one dot product (ATen's dot_with_fp32_arith, AVX2): 8
   accumulators of 8 lanes over 64-value blocks, their tree, then 16-value
   tails in 8 lanes, then the rest. b's values are float32 (G4__B_F32), bf16
   bits (G4__B_BF16) or float32 rounded to bf16 first (G4__B_ROUND_BF16); the
   three wrappers below pass a constant, so the switch folds away. */
enum { G4__B_F32, G4__B_BF16, G4__B_ROUND_BF16 };
G4__HD static float g4__b_at(const void *b, int kind, int i) {
    if (kind == G4__B_BF16) return g4__bf16_to_f32(((const uint16_t *)b)[i]);
    if (kind == G4__B_ROUND_BF16) return g4__bf16_round(((const float *)b)[i]);
    return ((const float *)b)[i];
}
/* The end of torch's dot product: its 8 accumulators of 8 lanes (acc[r][l]
   holds the products of k = 64 j + 8 r + l for k < n & ~63, added in order)
   added in its tree, then the tail: k < n & ~15 16 at a time into one 8-lane
   accumulator, the rest one by one. (The packed GEMM's tile in this order,
   g4__tile_torch, ends its sums here too.) */
G4__HD static float g4__dot_torch_end(float acc[8][8], const float *a, const void *b, int kind, int n) {
    float tail[8], sum;
    int la = n & ~63, lv = n & ~15, i, r, l;
    memset(tail, 0, sizeof tail);
    for (r = 0; r < 4; r++) for (l = 0; l < 8; l++) acc[r][l] += acc[r + 4][l];
    for (r = 0; r < 2; r++) for (l = 0; l < 8; l++) acc[r][l] += acc[r + 2][l];
    for (l = 0; l < 8; l++) acc[0][l] += acc[1][l];
    sum = g4__hsum8(acc[0]);
    for (i = la; i < lv; i += 16) {
        for (l = 0; l < 8; l++) tail[l] += a[i + l] * g4__b_at(b, kind, i + l);
        for (l = 0; l < 8; l++) tail[l] += a[i + 8 + l] * g4__b_at(b, kind, i + 8 + l);
    }
    sum += g4__hsum8(tail);
    for (i = lv; i < n; i++) sum += a[i] * g4__b_at(b, kind, i);
    return sum;
}

G4__HD static float g4__dot_torch_as(const float *a, const void *b, int kind, int n) {
    float acc[8][8];
    int la = n & ~63, i, r, l;
    memset(acc, 0, sizeof acc);
    for (i = 0; i < la; i += 64)
        for (r = 0; r < 8; r++)
            for (l = 0; l < 8; l++) acc[r][l] += a[i + 8 * r + l] * g4__b_at(b, kind, i + 8 * r + l);
    return g4__dot_torch_end(acc, a, b, kind, n);
}

/* one output: x [in] against a bf16 row [in], in that order */
G4__HD static float g4__dot_torch_bf16(const float *xt, const uint16_t *row, int in) {
    return g4__dot_torch_as(xt, row, G4__B_BF16, in);
}

G4__MAYBE_UNUSED static void g4__matmul_torch_ref(float *y, const float *x, const g4_tensor *w, int n, int o0, int o1) {
    int out = (int)w->shape[0], in = (int)w->shape[1], o, t;
    const uint16_t *base = (const uint16_t *)w->data;
    for (o = o0; o < o1; o++)
        for (t = 0; t < n; t++)
            y[(size_t)t * (size_t)out + (size_t)o] = g4__dot_torch_bf16(x + (size_t)t * (size_t)in, base + (size_t)o * (size_t)in, in);
}

G4__MAYBE_UNUSED static float g4__dot_ref(const float *a, const float *b, int n) {
    float acc = 0.0f;
    int i;
    for (i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* The adapter's backward (g4__lora_forward: y += s B u, u = A x), given dy:
   dx[t] += (s B^T dy[t]) A (dx may be NULL); with dA (x given): dB += s dy u^T
   and dA += (s B^T dy) x^T, dB at the next 16-float boundary after dA (the
   gradient block's layout). tmp: [2r] scratch. */
static void g4__lora_backward(float *dx, float *dA, const float *dy, const float *x, const g4_lora *lo, int n, float *tmp) {
    int t, j, o, i, r = lo->r;
    float *u = tmp, *du = tmp + r;
    float *dB = dA ? dA + (((size_t)r * (size_t)lo->in + 15) & ~(size_t)15) : NULL;
    for (t = 0; t < n; t++) {
        const float *dyt = dy + (size_t)t * (size_t)lo->out;
        for (j = 0; j < r; j++) du[j] = 0.0f;
        for (o = 0; o < lo->out; o++) /* du = s B^T dy */
            for (j = 0; j < r; j++) du[j] += lo->B[(size_t)o * r + j] * (dyt[o] * lo->scale);
        if (dx)
            for (j = 0; j < r; j++)
                for (i = 0; i < lo->in; i++) dx[(size_t)t * lo->in + i] += du[j] * lo->A[(size_t)j * lo->in + i];
        if (!dA || !x) continue;
        for (j = 0; j < r; j++) { /* u = A x */
            float acc = 0.0f;
            for (i = 0; i < lo->in; i++) acc += x[(size_t)t * lo->in + i] * lo->A[(size_t)j * lo->in + i];
            u[j] = acc;
        }
        for (o = 0; o < lo->out; o++)
            for (j = 0; j < r; j++) dB[(size_t)o * r + j] += (dyt[o] * lo->scale) * u[j];
        for (j = 0; j < r; j++)
            for (i = 0; i < lo->in; i++) dA[(size_t)j * lo->in + i] += du[j] * x[(size_t)t * lo->in + i];
    }
}

/* A LoRA adapter's part of a matmul (peft's lora.Linear.forward:
   result + lora_B(lora_A(x)) * scaling): after y = x W^T, y[t] += scale *
   B (A x[t]) for t < n; u: [n][r] scratch. In bf16 mode the base output is
   rounded first (the bf16 base layer's result), the adapter runs in float32
   (peft keeps bf16 adapters float32 and casts x up), and the caller's cast
   rounds the sum (result.to(bf16)). The scalar reference: the forward runs
   g4__lora_u_part and g4__lora_add (>>threads), tested against it. */
G4__MAYBE_UNUSED static void g4__lora_forward(float *y, const float *x, const g4_lora *lo, int n, float *u, int bf16) {
    int t, j, o, i;
    for (t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * (size_t)lo->in;
        float *ut = u + (size_t)t * (size_t)lo->r, *yt = y + (size_t)t * (size_t)lo->out;
        for (j = 0; j < lo->r; j++) { /* u = A x */
            const float *a = lo->A + (size_t)j * (size_t)lo->in;
            float acc = 0.0f;
            for (i = 0; i < lo->in; i++) acc += xt[i] * a[i];
            ut[j] = acc;
        }
        for (o = 0; o < lo->out; o++) { /* y += (B u) * scale */
            const float *b = lo->B + (size_t)o * (size_t)lo->r;
            float v = 0.0f;
            for (j = 0; j < lo->r; j++) v += b[j] * ut[j];
            if (bf16) yt[o] = g4__bf16_round(yt[o]);
            yt[o] += v * lo->scale;
        }
    }
}

/* gelu_pytorch_tanh, in transformers' (ATen's) operation order:
   (0.5 x) (1 + tanh(z)), z = k (x + 0.044715 ((x x) x)), k = sqrt(2/pi).
   tanh is computed on |z| as u = 1 - 2 / (exp(2|z|) + 1) and then 1 + tanh(z)
   is 1 + u or 1 - u, so it rounds near -1 as a float32 tanh does. exp is
   Cephes' expf with 2|z| clamped to 87 (u is 1 long before): n = round(2|z| /
   ln 2) by the 1.5 * 2^23 trick, r = 2|z| - n ln 2 in two FMAs, a degree-5
   polynomial in FMAs, times 2^n. This scalar function (which the CUDA
   kernels call too: G4__HD) and g4__gelu_v (SIMD) make exactly these IEEE
   operations, so they give the same bits. libm's tanhf cost 10% of a prefill; this is 96.6% bit-equal to
   torch's float32 gelu (libm tanhf: 96.8%), within 2.4e-7 of it (tested).
   Past |z| = 8.664339742 tanh is exactly 1, as in Sleef's tanhf, which ATen's
   vectorised gelu calls: 1 + tanh(z) is then 0 for z < 0, and in the bf16
   mode the result equals torch's bf16 gelu for every bf16 input (tested). */
#define G4__GELU_K 0.7978845608028654f
#define G4__TANH_ONE (2.0f * 8.664339742f) /* on a = |2z|: Sleef's tanhf is +-1 past |z| = 8.664339742 */
#define G4__EXP_MAGIC 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer */
#define G4__EXP_C 1.44269504088896341f, 0.693359375f, 2.12194440e-4f
#define G4__EXP_P 1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f
/* tanh(z), z = k (x + 0.044715 ((x x) x)): the tanh inside gelu(x), as
   g4__gelu_x computes it (the backward's g4__gelu_grad takes it from here, so
   it sees the forward's bits). clamp = 0: without the exact 1 past |z| =
   8.664339742, as ATen's scalar gelu (glibc's tanhf) rounds in bf16
   (g4__gelu_torch_n) */
G4__HD static float g4__gelu_tanh(float x, int clamp) {
    const float c[3] = {G4__EXP_C}, p[6] = {G4__EXP_P};
    float z = G4__GELU_K * (x + 0.044715f * (x * x * x)), a = fminf(fabsf(z + z), 87.0f), n, r, e, u;
    uint32_t bits;
    int j;
    n = fmaf(a, c[0], G4__EXP_MAGIC) - G4__EXP_MAGIC;
    r = fmaf(n, -c[1], a);
    r = fmaf(n, c[2], r);
    e = p[0];
    for (j = 1; j < 6; j++) e = fmaf(e, r, p[j]);
    e = fmaf(e, r * r, r) + 1.0f;
    bits = (uint32_t)((int)n + 127) << 23;
    memcpy(&u, &bits, 4);
    e = e * u;                     /* exp(2|z|) */
    u = 1.0f - 2.0f / (e + 1.0f); /* tanh(|z|) */
    if (clamp && G4__TANH_ONE - a < 0.0f) u = 1.0f;
    return z < 0.0f ? -u : u;
}

/* (0.5 x) (1 + tanh(z)): for z < 0, 1 + (-u) is 1 - u (IEEE a - b is a + (-b)) */
G4__HD static float g4__gelu_x(float x, int clamp) { return (0.5f * x) * (1.0f + g4__gelu_tanh(x, clamp)); }

G4__MAYBE_UNUSED static float g4__gelu(float x) { return g4__gelu_x(x, 1); }

/* exp and tanh for the float32 forward (the softmax of attention and of the
   router, the final soft-cap), built from IEEE double +, -, *, / alone, with
   no libm call, so the CPU and the CUDA kernels (G4__HD) give the same bits
   whatever the libm or the GPU (FP contraction off, as everywhere here).
   g4__expf(x): exp in double, then rounded once to float: x = k ln 2 + r,
   k = nearest(x / ln 2), r = (x - k ln2_hi) - k ln2_lo (ln2_hi has 21 bits,
   so k ln2_hi and the first subtraction are exact), exp(r) = 1 + expm1(r) by
   its Taylor polynomial to degree 16 (|r| <= 0.347: truncation 2^-70), times
   2^k. The double carries about 2^-52 relative error, so the float is the
   correctly rounded exp(x) except where exp(x) lies within about 2^-52 of a
   midpoint between two floats. g4__tanhf(x) = sign(x) e / (e + 2), e =
   expm1(2|x|) (the polynomial below |2x| = 0.5, exp - 1 above), 1 past
   |x| = 9.1 (where tanh rounds to 1). Measured over every float32 input by
   tools/check_exp_tanh.c, against a correctly rounded reference (long double
   expl/tanhl) and against glibc 2.36's expf/tanhf: see docs/cuda.md
   (exp and tanh, measured). */
/* a * b + c as this build compiles it: 0 for a = b = 1 + 2^-12, c = -(1 +
   2^-11) when the product is rounded first (contraction off), 2^-24 when the
   compiler fused it into an FMA. The tests and g4_cuda_session_init (on the
   device) check it. */
G4__HD G4__MAYBE_UNUSED static float g4__fp_contract_probe(float a, float b, float c) { return a * b + c; }

/* the float whose bits are u */
G4__HD static float g4__fbits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

G4__HD static double g4__expm1_small(double r) { /* |r| <= 0.5 */
    const double c[15] = {0.5, 0.16666666666666666, 0.041666666666666664, 0.008333333333333333,
                          0.001388888888888889, 0.0001984126984126984, 2.48015873015873e-05,
                          2.7557319223985893e-06, 2.755731922398589e-07, 2.505210838544172e-08,
                          2.08767569878681e-09, 1.6059043836821613e-10, 1.1470745597729725e-11,
                          7.647163731819816e-13, 4.779477332387385e-14}; /* 1/n!, n = 2 .. 16 */
    double q = c[14];
    int j;
    for (j = 13; j >= 0; j--) q = q * r + c[j];
    return r + (r * r) * q;
}

/* exp(x) for |x| <= 250 */
G4__HD static double g4__exp_d(double x) {
    const double shift = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer */
    double kd = (x * 1.4426950408889634 + shift) - shift, r, e;
    uint64_t bits = (uint64_t)((int64_t)kd + 1023) << 52;
    r = (x - kd * 0.6931471803691238) - kd * 1.9082149292705877e-10;
    memcpy(&e, &bits, 8); /* 2^k */
    return (1.0 + g4__expm1_small(r)) * e;
}

G4__HD static float g4__expf(float x) {
    if (x != x) return x;
    if (x >= 88.72283935546875f) return g4__fbits(0x7f800000u); /* exp(x) >= FLT_MAX + half an ulp */
    if (x < -104.0f) return 0.0f;                                /* below 2^-150 */
    return (float)g4__exp_d((double)x);
}

/* tanh(a) for 0 <= a <= 9.1 */
G4__HD static double g4__tanh_d(double a) {
    double e = a < 0.25 ? g4__expm1_small(a + a) : g4__exp_d(a + a) - 1.0;
    return e / (e + 2.0);
}

G4__HD static float g4__tanhf(float x) {
    double a = x < 0.0f ? -(double)x : (double)x, t;
    if (x != x || x == 0.0f) return x; /* NaN, and tanh(-0) = -0 */
    if (a > 9.1) return x < 0.0f ? -1.0f : 1.0f;
    t = g4__tanh_d(a);
    return (float)(x < 0.0f ? -t : t);
}

/* The backend's entry points: the kernels above made fast, defined after the
   model (>>backend) */
static float g4__dot(const float *a, const float *b, int n);
static void g4__axpy(float *y, float a, const float *x, int n);
static void g4__dot8(float *s, size_t ss, const float *q, const float *const *b, int n);
static void g4__wsum_ring(float *y, const float *p, const float *base, size_t stride, int cap, int k0, int m, int n, int add);
static void g4__gelu_n(float *y, const float *x, size_t n);
static void g4__parallel(g4_pool *p, void (*fn)(void *, int, int), void *ctx);
static void g4__parallel_range(const g4_session *s, size_t n, size_t cost, void (*fn)(void *, size_t, size_t),
                               void *ctx);
static void g4__matmul(const g4_session *s, float *y, const float *x, const g4_tensor *w, int n);
static void g4__matmul_cast(const g4_session *s, float *y, const float *x, const g4_tensor *w, int n, int cast);
static void g4__matmul_bias(const g4_session *s, float *y, const float *x, const g4_tensor *w, const g4_tensor *bias, int n);
static size_t g4__pack_thread_floats(void); /* G4__PACK_THREAD: one thread's GEMM packing buffer */
static void g4__cache_sizes(long *l1d, long *l2, long *l3); /* the caches the CPU reports (>>threads) */
static int g4__gemm_kc(long l2);                            /* the GEMM's kc for that L2 (>>gemm) */
static void g4__attend_blocked(float *out, const float *q, int G, const g4_kv_slot *sl, int kvh, int lo, int hi,
                               float *scores, int bf16); /* = g4__attend (>>ops), the same bits */
static void g4__matmul_rows(float *y, const float *x, const g4_tensor *w, int n, int o0, int o1, float *ws);
static float g4__dot_torch_v(const float *a, const float *b, int n); /* = g4__dot_torch (>>ops), the same bits */
/* C [n][N] += A [n][K] B threaded (g4__gemm_acc; >>backward) */
static void g4__bwd_mm(const g4_session *s, float *C, size_t ldc, const float *A, size_t lda, const unsigned char *B,
                       g4_dtype bdt, size_t ldb, int kmajor, int K, int n, int N);
static void g4__expf_n(float *y, const float *x, size_t n); /* y[i] = g4__expf(x[i]), the same bits */
static void g4__softmax_n(float *x, int n);                 /* = g4__softmax (>>ops), the same bits */
static double g4__ce_row(float *z, int V, int32_t y, float cap, float inv_n); /* = g4__ce_row_ref (>>backward), the same bits */

/* ------------------------------------------------------- model ops >>ops */
/* The Gemma ops the forward pass is made of, one module each: the cast to the
   activation dtype, Gemma4RMSNorm, RoPE (its inverse frequencies and the
   rotation), softmax, and eager attention for one query head. */

/* One value cast to the activation dtype: itself in float32 mode; in bf16
   mode rounded to bf16, as transformers running in bfloat16 rounds every
   tensor an op produces. The ops end with this cast on each module output
   they write (matmul, norm, the elementwise ops of the forward pass), so the
   model code never calls it. */
G4__HD static float g4__act(float f, int bf16) { return bf16 ? g4__bf16_round(f) : f; }

/* torch's float32 sum of squares of a contiguous row, in its order (ATen's
   cascade sum for an inner reduction, SumKernel.cpp, as built for AVX2): the
   row is read as 8-lane vectors, 4 side by side, so (k, l) is one of 32
   float32 accumulators and its m-th term is v[(4m + k) 8 + l], m < rows =
   n / 32. Each accumulator adds its terms in 4 levels of 2^p (p = max(4,
   ceil(log2 rows) / 4)): level 0 takes 2^p terms, then is added into level
   1, and so on up while the term count is a multiple of the level's size.
   G4__TSUM_VL / G4__TSUM_ILP name those widths; gemma4_cuda.cu's RMSNorm
   calls this function, one thread a lane. */
#define G4__TSUM_VL 8
#define G4__TSUM_ILP 4
/* The cascade's schedule, shared by the one-lane and the 32-lane sums: the
   level size's log2 p for rows terms, and after i terms (a multiple of 2^p)
   how many levels carry up (level j - 1 into j for j = 1 .. that). */
G4__HD static int g4__tsum_p(int rows) {
    int p = 4, c = 0;
    while ((1 << c) < rows) c++; /* ceil(log2 rows), and 1 for rows <= 2 as ATen's CeilLog2 */
    if (rows <= 2) c = 1;
    return c / 4 > p ? c / 4 : p;
}
G4__HD static int g4__tsum_carries(int i, int p) {
    int j;
    for (j = 1; j < 3; j++)
        if (i & (((1 << p) - 1) << (j * p))) break;
    return j;
}
G4__HD G4__MAYBE_UNUSED static float g4__tsum_lane(const float *v, int rows, int k, int l) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, t;
    int p = g4__tsum_p(rows), step = 1 << p, i = 0, j, up;
    while (i + step <= rows) {
        for (j = 0; j < step; j++, i++) {
            t = v[(size_t)(G4__TSUM_ILP * i + k) * G4__TSUM_VL + (size_t)l];
            acc[0] += t * t;
        }
        for (j = 1, up = g4__tsum_carries(i, p); j <= up; j++) {
            acc[j] += acc[j - 1];
            acc[j - 1] = 0.0f;
        }
    }
    for (; i < rows; i++) {
        t = v[(size_t)(G4__TSUM_ILP * i + k) * G4__TSUM_VL + (size_t)l];
        acc[0] += t * t;
    }
    return ((acc[0] + acc[1]) + acc[2]) + acc[3];
}

/* sum of x[i]^2 (each square rounded to float32) as torch sums it: a row
   shorter than one vector is summed as 1-lane vectors; otherwise the 32
   lane accumulators above, the vectors past the last group of 4 added into
   group 0, the 4 groups added lane-wise, then the scalar tail and the 8
   lanes in order. Tested against torch on many rows (tests/test_gemma4.c
   and the bf16 goldens). */
/* g4__sum_squares after its 32 lanes: part[k * 8 + l] holds lane (k, l)
   (not read when n < 8); the CUDA RMSNorm computes the lanes in parallel and
   finishes with this. */
G4__HD static float g4__sum_squares_finish(const float *part_in, const float *x, int n) {
    float part[G4__TSUM_ILP][G4__TSUM_VL], total = 0.0f, t;
    int vl = n < G4__TSUM_VL ? 1 : G4__TSUM_VL, nv = n / vl, rows = nv / G4__TSUM_ILP, k, l, i;
    if (vl == 1) { /* the same cascade on 1-lane vectors */
        float a[G4__TSUM_ILP] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (k = 0; k < G4__TSUM_ILP && k < n; k++) a[k] = rows ? x[k] * x[k] : 0.0f;
        for (i = rows * G4__TSUM_ILP; i < n; i++) a[0] += x[i] * x[i];
        return ((a[0] + a[1]) + a[2]) + a[3];
    }
    for (k = 0; k < G4__TSUM_ILP; k++)
        for (l = 0; l < G4__TSUM_VL; l++) part[k][l] = part_in[k * G4__TSUM_VL + l];
    for (i = rows * G4__TSUM_ILP; i < nv; i++)
        for (l = 0; l < G4__TSUM_VL; l++) {
            t = x[(size_t)i * G4__TSUM_VL + (size_t)l];
            part[0][l] += t * t;
        }
    for (k = 1; k < G4__TSUM_ILP; k++)
        for (l = 0; l < G4__TSUM_VL; l++) part[0][l] += part[k][l];
    for (i = nv * G4__TSUM_VL; i < n; i++) total += x[i] * x[i];
    for (l = 0; l < G4__TSUM_VL; l++) total += part[0][l];
    return total;
}

/* g4__tsum_lane for the 32 lanes at once: lane m = 8 k + l of part, whose
   terms are v[32 i + m], the same operations in the same order as each lane
   alone (the cascade's steps depend on rows only), in loops over the 32
   contiguous lanes that compilers vectorize (one lane at a time, strided,
   the RMSNorms took 2% of a bf16_fast prefill, Zen 4, 2026-11-27) */
#define G4__TSUM_LANES (G4__TSUM_ILP * G4__TSUM_VL)
static void g4__tsum_lanes(const float *v, int rows, float *part) {
    float acc[4][G4__TSUM_LANES], t[G4__TSUM_LANES];
    int p = g4__tsum_p(rows), step = 1 << p, i = 0, j, up, m;
    memset(acc, 0, sizeof acc);
    while (i + step <= rows) {
        for (j = 0; j < step; j++, i++) {
            memcpy(t, v + (size_t)i * G4__TSUM_LANES, sizeof t);
            for (m = 0; m < G4__TSUM_LANES; m++) acc[0][m] += t[m] * t[m];
        }
        for (j = 1, up = g4__tsum_carries(i, p); j <= up; j++)
            for (m = 0; m < G4__TSUM_LANES; m++) acc[j][m] += acc[j - 1][m], acc[j - 1][m] = 0.0f;
    }
    for (; i < rows; i++) {
        memcpy(t, v + (size_t)i * G4__TSUM_LANES, sizeof t);
        for (m = 0; m < G4__TSUM_LANES; m++) acc[0][m] += t[m] * t[m];
    }
    for (m = 0; m < G4__TSUM_LANES; m++) part[m] = ((acc[0][m] + acc[1][m]) + acc[2][m]) + acc[3][m];
}

static float g4__sum_squares(const float *x, int n) {
    float part[G4__TSUM_LANES];
    if (n < G4__TSUM_VL) return g4__sum_squares_finish(NULL, x, n);
    g4__tsum_lanes(x, n / G4__TSUM_LANES, part);
    return g4__sum_squares_finish(part, x, n);
}

/* gelu as ATen runs it on a bf16 tensor of `total` elements (a contiguous
   tensor, or one row of a strided one such as an expert's gate half): 32
   elements at a time through its vectorised code (Sleef's tanhf, exactly 1
   past |z| = 8.664339742: g4__gelu_n), the last total % 32 through its scalar
   code (glibc's tanhf, without that: g4__gelu_x(x, 0)). x[0 .. n) are the
   tensor's elements off .. off + n - 1; in place is fine. Equal to torch's
   bf16 gelu on every bf16 input, on either path (tested in Python). */
static void g4__gelu_torch_n(float *y, const float *x, size_t n, size_t off, size_t total) {
    size_t tail = total & ~(size_t)31, cut = tail > off ? (tail - off < n ? tail - off : n) : 0, i;
    for (i = cut; i < n; i++) y[i] = g4__gelu_x(x[i], 0); /* first: in place, g4__gelu_n overwrites x */
    g4__gelu_n(y, x, cut);
}

/* Gemma4RMSNorm: y = x * (mean(x^2) + eps)^-0.5 * w, w used as stored (not 1+w);
   w == NULL is the weightless norm (v_norm, the router's norm). In place is fine.
   Every step in float32 as transformers' _norm runs it (hidden_states.float()):
   the squares' sum in torch's order, / n, + eps, pow(-0.5) which ATen computes
   as 1 / sqrt, then x * that, then * w. */
static void g4__rmsnorm(float *y, const float *x, const g4_tensor *w, int n, float eps) {
    float inv = 1.0f / sqrtf(g4__sum_squares(x, n) / (float)n + eps), a[16], b[16];
    int i = 0, l;
    for (l = 0; l < 16; l++) b[l] = 1.0f; /* no weight: (x inv) 1 = x inv */
    for (; i + 16 <= n; i += 16) { /* 16 at a time through local arrays, loops compilers vectorize (y may be x) */
        memcpy(a, x + i, sizeof a);
        if (w) g4__get16(w, (size_t)i, b);
        for (l = 0; l < 16; l++) a[l] = (a[l] * inv) * b[l];
        memcpy(y + i, a, sizeof a);
    }
    for (; i < n; i++) y[i] = w ? (x[i] * inv) * g4__get(w, (size_t)i) : x[i] * inv;
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

/* rotate_half RoPE on one head: element j pairs with j + D/2. Pairs whose
   inv_freq is 0 (proportional RoPE's unrotated part) come out unchanged.
   bf16: cos/sin are cast to bf16, and each product and the sum are rounded,
   as transformers' `x * cos + rotate_half(x) * sin` does in bfloat16. */
static void g4__rope_cos_sin(float inv_freq, int pos, float *c, float *s) {
    float a = (float)pos * inv_freq;
    *c = cosf(a);
    *s = sinf(a);
}

/* pair j of one head, given cos and sin of its angle (the CUDA kernel calls
   this with the host's g4__rope_cos_sin values) */
G4__HD static void g4__rope_pair(float *x, int j, int half, float c, float s, int bf16) {
    float x1 = x[j], x2 = x[j + half];
    if (bf16) {
        c = g4__bf16_round(c);
        s = g4__bf16_round(s);
        x[j] = g4__bf16_round(g4__bf16_round(x1 * c) + g4__bf16_round(-x2 * s));
        x[j + half] = g4__bf16_round(g4__bf16_round(x2 * c) + g4__bf16_round(x1 * s));
    } else {
        x[j] = x1 * c - x2 * s;
        x[j + half] = x2 * c + x1 * s;
    }
}

/* RoPE on nh heads of one position, D values apart: g4__rope_pair on every
   pair, the position's cos and sin computed once for its heads, 16 pairs at a
   time in loops compilers vectorize (pair by pair, the bf16 mode's eight
   roundings per pair took 2.3% of a bf16_fast prefill, and cosf and sinf for
   each head about as much again); x1 c + (-x2 s) is x1 c - x2 s exactly, so
   both modes share the loops */
static void g4__rope(float *x, int nh, const float *inv_freq, int D, int pos, int bf16) {
    int j0, l, h, half = D / 2;
    for (j0 = 0; j0 < half; j0 += 16) {
        float c[16], s[16], t[4][16];
        int m = half - j0 < 16 ? half - j0 : 16;
        for (l = 0; l < m; l++) g4__rope_cos_sin(inv_freq[j0 + l], pos, &c[l], &s[l]);
        if (m < 16) { /* the last pairs of a head whose half is not a multiple of 16 */
            for (h = 0; h < nh; h++)
                for (l = 0; l < m; l++) g4__rope_pair(x + (size_t)h * (size_t)D, j0 + l, half, c[l], s[l], bf16);
            break;
        }
        if (bf16) g4__bf16_round16(c), g4__bf16_round16(s);
        for (h = 0; h < nh; h++) {
            float *x1 = x + (size_t)h * (size_t)D + j0, *x2 = x1 + half;
            for (l = 0; l < 16; l++) t[0][l] = x1[l] * c[l], t[1][l] = -x2[l] * s[l], t[2][l] = x2[l] * c[l], t[3][l] = x1[l] * s[l];
            if (bf16) g4__bf16_round16(t[0]), g4__bf16_round16(t[1]), g4__bf16_round16(t[2]), g4__bf16_round16(t[3]);
            for (l = 0; l < 16; l++) x1[l] = t[0][l] + t[1][l], x2[l] = t[2][l] + t[3][l];
            if (bf16) g4__bf16_round16(x1), g4__bf16_round16(x2);
        }
    }
}

/* softmax in float32: max, e = exp(x - max) (g4__expf), their sum in order,
   e / sum. The CUDA router calls it as it is; attention splits it over a
   block with the same operations. */
G4__HD static void g4__softmax(float *x, int n) {
    float mx = x[0], sum = 0.0f;
    int i;
    for (i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    for (i = 0; i < n; i++) { x[i] = g4__expf(x[i] - mx); sum += x[i]; }
    for (i = 0; i < n; i++) x[i] /= sum;
}

/* expf as torch's CPU softmax computes it: Vectorized<float>::exp, which is
   Sleef's expf_u10 (Sleef_expf8_u10 under AVX2). This mirrors Sleef's
   algorithm (xexpf in sleefsimdsp.c, Boost Software License 1.0), written
   from it: q = rint(d / ln 2), s = d - q ln 2 in two FMAs (ln 2 split in
   L2U + L2L), u = a degree-5 polynomial in FMAs, u = 1 + (s^2 u + s),
   times 2^q as two exact scalings (2^(q >> 1) 2^(q - (q >> 1))); 0 below
   -104, inf above 100. Tested bit-equal to Sleef_expf8_u10avx2 on 10M
   inputs in [-104, 100] (see docs/bf16.md). */
G4__HD static float g4__expf_sleef(float d) {
    float s, u;
    int q;
    if (d != d) return d;
    if (d < -104.0f) return 0.0f;
    if (d > 100.0f) return g4__fbits(0x7f800000u);
    q = (int)lrintf(d * 1.442695040888963407359924681001892137f);
    s = fmaf((float)q, -0.693145751953125f, d);
    s = fmaf((float)q, -1.428606765330187045e-06f, s);
    u = 0.000198527617612853646278381f;
    u = fmaf(u, s, 0.00139304355252534151077271f);
    u = fmaf(u, s, 0.00833336077630519866943359f);
    u = fmaf(u, s, 0.0416664853692054748535156f);
    u = fmaf(u, s, 0.166666671633720397949219f);
    u = fmaf(u, s, 0.5f);
    u = 1.0f + fmaf(s * s, u, s);
    u = u * g4__fbits((uint32_t)((q >> 1) + 127) << 23);
    return u * g4__fbits((uint32_t)((q - (q >> 1)) + 127) << 23);
}

/* torch's float32 softmax over the last dim on an AVX2 CPU (ATen's
   _vec_softmax_lastdim): max, e = exp(x - max) (g4__expf_sleef), the sum of e as
   vec::reduce_all adds it, then e * (1 / sum). x holds the row's entries
   k0 .. k0 + n - 1 of a row of `len` (the others are masked: their e is 0
   and they add nothing, but the position of an entry picks its lane): a row
   shorter than 8 is summed in order; otherwise entry k goes to lane k % 8,
   each lane summed in order, the lanes added as g4__hsum8
   (g4__softmax_torch_sum, which the CUDA kernels call too). */
G4__HD static float g4__softmax_torch_sum(const float *e, int n, int k0, int len) {
    float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, sum = 0.0f;
    int i;
    if (len < 8) {
        for (i = 0; i < n; i++) sum += e[i];
        return sum;
    }
    for (i = 0; i < n; i++) lanes[(k0 + i) % 8] += e[i];
    return g4__hsum8(lanes);
}

G4__HD static void g4__softmax_torch(float *x, int n, int k0, int len) {
    float mx = x[0], inv;
    int i;
    for (i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    for (i = 0; i < n; i++) x[i] = g4__expf_sleef(x[i] - mx);
    inv = 1.0f / g4__softmax_torch_sum(x, n, k0, len);
    for (i = 0; i < n; i++) x[i] *= inv;
}

/* torch.topk(p, K) on the CPU, for which K of E entries it picks when values
   tie (exact ties are common: router logits are bf16). ATen's topk_impl_loop
   (TopKImpl.h) fills (value, index) pairs in index order and runs, with the
   comparison a > b (NaN first), std::partial_sort to K when 64 K <= E, else
   std::nth_element at K - 1; torch is built against GCC's libstdc++, whose
   algorithms these mirror, written from their description: introselect
   (median of 3 moved to the front, unguarded partition, insertion sort below
   4 elements, heap select after 2 floor(log2 E) rounds) and heap select
   (make_heap on the first K, then every later entry that beats the root is
   swapped in and sifted down). The chosen set was checked equal to
   torch.topk's on 10k tie-heavy rows (E 2 to 1000, K 1 to 8); which of the
   tied values is picked is neither "lower index" nor "higher index" (a test
   shows a golden where the higher index wins). top[] gets the K indices in
   descending value, as torch returns them (ties among equal values in any
   order: their values are the same). g4__topk_torch_q takes E entries of
   scratch (the drafter's 2048 centroids: its session arena); g4__topk_torch
   keeps them on the stack, E <= G4_MAX_EXPERTS (the config check). */
typedef struct g4__vi { float v; int i; } g4__vi;

G4__HD static int g4__tk_gt(const g4__vi *a, const g4__vi *b) {
    return (a->v != a->v && b->v == b->v) || a->v > b->v;
}

G4__HD static void g4__tk_swap(g4__vi *a, g4__vi *b) {
    g4__vi t = *a;
    *a = *b;
    *b = t;
}

G4__HD static void g4__tk_adjust(g4__vi *q, int hole, int n, g4__vi v) {
    int top = hole, c = hole, parent;
    while (c < (n - 1) / 2) {
        c = 2 * (c + 1);
        if (g4__tk_gt(&q[c], &q[c - 1])) c--;
        q[hole] = q[c];
        hole = c;
    }
    if ((n & 1) == 0 && c == (n - 2) / 2) {
        c = 2 * (c + 1);
        q[hole] = q[c - 1];
        hole = c - 1;
    }
    parent = (hole - 1) / 2;
    while (hole > top && g4__tk_gt(&q[parent], &v)) {
        q[hole] = q[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    q[hole] = v;
}

G4__HD static void g4__tk_heap_select(g4__vi *q, int m, int n) {
    int parent, i;
    if (m >= 2)
        for (parent = (m - 2) / 2;; parent--) {
            g4__tk_adjust(q, parent, m, q[parent]);
            if (parent == 0) break;
        }
    for (i = m; i < n; i++)
        if (g4__tk_gt(&q[i], &q[0])) {
            g4__vi v = q[i];
            q[i] = q[0];
            g4__tk_adjust(q, 0, m, v);
        }
}

G4__HD static void g4__tk_nth(g4__vi *q, int nth, int n) {
    int f = 0, l = n, depth = 0, i;
    while ((2 << depth) <= n) depth++; /* floor(log2 n) */
    depth *= 2;
    while (l - f > 3) {
        int a = f + 1, b = f + (l - f) / 2, c = l - 1, lo = f + 1, hi = l;
        if (depth == 0) {
            g4__tk_heap_select(q + f, nth + 1 - f, l - f);
            g4__tk_swap(&q[f], &q[nth]);
            return;
        }
        depth--;
        if (g4__tk_gt(&q[a], &q[b])) {
            if (g4__tk_gt(&q[b], &q[c])) g4__tk_swap(&q[f], &q[b]);
            else if (g4__tk_gt(&q[a], &q[c])) g4__tk_swap(&q[f], &q[c]);
            else g4__tk_swap(&q[f], &q[a]);
        } else if (g4__tk_gt(&q[a], &q[c])) g4__tk_swap(&q[f], &q[a]);
        else if (g4__tk_gt(&q[b], &q[c])) g4__tk_swap(&q[f], &q[c]);
        else g4__tk_swap(&q[f], &q[b]);
        for (;;) { /* unguarded partition of [f + 1, l) around q[f] */
            while (g4__tk_gt(&q[lo], &q[f])) lo++;
            hi--;
            while (g4__tk_gt(&q[f], &q[hi])) hi--;
            if (!(lo < hi)) break;
            g4__tk_swap(&q[lo], &q[hi]);
            lo++;
        }
        if (lo <= nth) f = lo;
        else l = lo;
    }
    for (i = f + 1; i < l; i++) { /* insertion sort of [f, l) */
        g4__vi v = q[i];
        int j = i;
        if (g4__tk_gt(&v, &q[f])) {
            for (j = i; j > f; j--) q[j] = q[j - 1];
            q[f] = v;
        } else {
            while (g4__tk_gt(&v, &q[j - 1])) { q[j] = q[j - 1]; j--; }
            q[j] = v;
        }
    }
}

/* q: E entries of scratch (the CUDA router passes a slice of its arena) */
G4__HD static void g4__topk_torch_q(const float *p, int E, int K, int *top, g4__vi *q) {
    int i, j;
    for (i = 0; i < E; i++) { q[i].v = p[i]; q[i].i = i; }
    if (K * 64 <= E) g4__tk_heap_select(q, K, E);
    else g4__tk_nth(q, K - 1, E);
    for (i = 1; i < K; i++) /* descending value */
        for (j = i; j > 0 && g4__tk_gt(&q[j], &q[j - 1]); j--) g4__tk_swap(&q[j], &q[j - 1]);
    for (i = 0; i < K; i++) top[i] = q[i].i;
}

static void g4__topk_torch(const float *p, int E, int K, int *top) {
    g4__vi q[G4_MAX_EXPERTS];
    g4__topk_torch_q(p, E, K, top, q);
}

/* The heads one attention item takes together (g4__attend's G): the largest
   divisor of a KV head's query heads NH / KVH up to 8 */
static int g4__att_heads(int group) {
    int g = group < 8 ? group : 8;
    while (group % g) g--;
    return g;
}

/* A slot of n positions that no layer owns (keys k, values v: [n][kv_heads][head_dim]),
   for the attention checks: the tests' references and gemma4_cuda.cu's */
G4__MAYBE_UNUSED static g4_kv_slot g4__kv_slot_of(int kv_heads, int head_dim, int n, float *k, float *v) {
    g4_kv_slot sl;
    memset(&sl, 0, sizeof sl);
    sl.kv_heads = kv_heads; sl.head_dim = head_dim; sl.capacity = n; sl.n_pos = n; sl.k = k; sl.v = v;
    return sl;
}

/* VDPBF16PS on one lane (bf16_fast's p v): t + a1 b1, then + a0 b0, each
   sum rounded to float; the inputs and each sum read and written as zero
   where denormal (the instruction's DAZ and FTZ, whatever MXCSR says). a and
   b hold bf16 values, so each product is exact (it can only underflow). The
   same model as tests/x86_emu.h's, and tested against the real instruction
   on avx512_bf16 CPUs (test_wsum_bf16_vs_pairs, test_dot8x2_bf16_vs_pairs). */
static float g4__daz(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    memcpy(&x, &u, 4);
    return x;
}
static float g4__dpbf16_lane(float t, float a0, float b0, float a1, float b1) {
    t = g4__daz(g4__daz(t) + g4__daz(a1) * g4__daz(b1));
    return g4__daz(t + g4__daz(a0) * g4__daz(b0));
}

/* bf16_fast's scores q . k (g4__attend, bf16 = 1) where G4__QK_PAIRS(D):
   VDPBF16PS's sum over 32 values a step (lane i adds q[2i + 1] k[2i + 1],
   then q[2i] k[2i], as g4__dpbf16_lane), the 16 lanes added as
   _mm512_reduce_add_ps adds them (g4__vhsum's order: the upper 8 onto the
   lower, then 4, 2, 1). q and k hold bf16 values. Other head sizes keep
   g4__dot. (D <= 512: g4__dot8x2_bf16 converts 8 heads' q on its stack.) */
#define G4__QK_PAIRS(D) ((D) % 32 == 0 && (D) <= 512)
static float g4__dot_pairs(const float *q, const float *k, int D) {
    float l[16];
    int i, j;
    for (i = 0; i < 16; i++) l[i] = 0.0f;
    for (j = 0; j < D; j += 32)
        for (i = 0; i < 16; i++) l[i] = g4__dpbf16_lane(l[i], q[j + 2 * i], k[j + 2 * i], q[j + 2 * i + 1], k[j + 2 * i + 1]);
    for (i = 0; i < 8; i++) l[i] = l[i] + l[i + 8];
    for (i = 0; i < 4; i++) l[i] = l[i] + l[i + 4];
    l[0] = l[0] + l[2];
    l[1] = l[1] + l[3];
    return l[0] + l[1];
}

/* the blocked attention's runs of keys (g4__attend_blocked, g4__wsum_bf16):
   a run's value rows stay in cache across the heads */
#define G4__ATT_KEYS 64

/* bf16_fast's out = sum over k of p[k] v[k] (g4__attend, bf16 = 1): from
   zero, the keys in pairs from the first (k, k + 1), the last one alone
   (with 0 as its pair) when m is odd, each pair added as one VDPBF16PS adds
   it (g4__dpbf16_lane; g4__wsum_bf16 on the instruction). p and the values
   are bf16 values (the bf16 mode rounds them). v_j = base + ((k0 + j) % cap)
   * stride. */
static void g4__wsum_pairs(float *y, const float *p, const float *base, size_t stride, int cap, int k0, int m, int n) {
    int i, j;
    for (i = 0; i < n; i++) y[i] = 0.0f;
    for (j = 0; j < m; j += 2) {
        const float *v0 = base + (size_t)((k0 + j) % cap) * stride, *v1 = base + (size_t)((k0 + j + 1) % cap) * stride;
        for (i = 0; i < n; i++)
            y[i] = j + 1 < m ? g4__dpbf16_lane(y[i], p[j], v0[i], p[j + 1], v1[i]) : g4__dpbf16_lane(y[i], p[j], v0[i], 0.0f, 0.0f);
    }
}

/* G query heads of one KV head over keys [lo, hi] of a slot (rows pos %
   capacity), for each head h, its q at q + h D, its out at out + h D, its
   scores at scores + h (hi - lo + 1):
     scores[k] = q . key[k]              (scale 1.0: Gemma 4's q_norm and k_norm
                                          replace the 1/sqrt(D))
     p = softmax(scores)                 (float32)
     out = sum over k of p[k] value[k]   (from zero, key by key in order)
   This is the reference; the forward runs g4__attend_blocked (>>threads),
   which gives the same bits reading each key and value row once for the G
   heads (tested). The bf16 mode: g4__attend_torch (torch's orders); with
   bf16_fast this, bf16 = 1: scores, p and out each rounded to bf16 where
   transformers rounds them, the scores' sums as VDPBF16PS's
   (g4__dot_pairs; other head sizes in this order), p torch's
   float32 softmax (g4__softmax_torch, its lanes counted from lo), p v in
   pairs of keys as VDPBF16PS sums them (g4__wsum_pairs), not torch's order (so within
   the bf16_fast bound, not bit-identical; the same for any chunk, split or
   thread count, as in float32). */
G4__MAYBE_UNUSED static void g4__attend(float *out, const float *q, int G, const g4_kv_slot *sl, int kvh, int lo, int hi,
                                        float *scores, int bf16) {
    int D = sl->head_dim, stride = sl->kv_heads * D, L = hi - lo + 1, h, k;
    for (h = 0; h < G; h++) {
        const float *qh = q + (size_t)h * (size_t)D;
        float *p = scores + (size_t)h * (size_t)L, *oh = out + (size_t)h * (size_t)D;
        for (k = lo; k <= hi; k++) {
            const float *kr = sl->k + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D;
            p[k - lo] = bf16 && G4__QK_PAIRS(D) ? g4__dot_pairs(qh, kr, D) : g4__dot(qh, kr, D);
        }
        if (bf16) g4__bf16_round_range(p, 0, (size_t)L);
        if (bf16 && L > 0) g4__softmax_torch(p, L, 0, L); /* torch's float32 softmax (its lanes from lo) */
        else g4__softmax(p, L);
        if (bf16) g4__bf16_round_range(p, 0, (size_t)L);
        if (bf16) {
            g4__wsum_pairs(oh, p, sl->v + (size_t)kvh * (size_t)D, (size_t)stride, sl->capacity, lo, L, D);
            g4__bf16_round_range(oh, 0, (size_t)D);
            continue;
        }
        memset(oh, 0, sizeof(float) * (size_t)D);
        for (k = lo; k <= hi; k++)
            g4__axpy(oh, p[k - lo], sl->v + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D, D);
    }
}

/* g4__dot_torch with b's values rounded to bf16 first (a LoRA adapter cast to
   bf16: its float32 A and B as torch's .to(bfloat16) leaves them) */
G4__HD static float g4__dot_torch_rb(const float *a, const float *b, int n) {
    return g4__dot_torch_as(a, b, G4__B_ROUND_BF16, n);
}

/* torch's dot product of two float rows of bf16 values: g4__matmul_torch_ref's
   order (ATen's dot_with_fp32_arith, AVX2) */
G4__HD G4__MAYBE_UNUSED static float g4__dot_torch(const float *a, const float *b, int n) {
    return g4__dot_torch_as(a, b, G4__B_F32, n);
}

/* transformers' eager attention for one query head in bf16, in torch's
   order, as in one forward over `nq` queries whose key rows hold `len`
   positions (0 .. len - 1; keys outside [lo, hi] are masked):
     - scores = q.k as torch.matmul(q, k^T) in bf16: ATen's bmm runs its naive
       loop (the dot in order) when D nq len < 400, else cpublas' gemm_transa_
       (g4__dot_torch); each rounded to bf16;
     - p = torch's float32 softmax (g4__softmax_torch), rounded to bf16;
     - out = p @ v as cpublas' gemm_notrans_: per output 4 partial sums, key k
       into partial k % 4 for k < 4 floor(len / 4), the rest into partial 0,
       then ((0 + 1) + 2) + 3; rounded to bf16.
   Products of bf16 values are exact, so the order of the additions is all
   that matters. Measured equal to torch on 2.9M outputs (S 3 to 100, D 16
   to 256). */
static void g4__attend_torch(float *out, const float *q, const g4_kv_slot *sl, int kvh, int lo, int hi, float *scores,
                             int nq, int len) {
    int D = sl->head_dim, stride = sl->kv_heads * D, k, d, d0, naive = (int64_t)D * nq * len < 400, tail4 = len & ~3;
    for (k = lo; k <= hi; k++) {
        const float *key = sl->k + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D;
        scores[k - lo] = g4__bf16_round(naive ? g4__dot_ref(q, key, D) : g4__dot_torch_v(q, key, D));
    }
    g4__softmax_torch(scores, hi - lo + 1, lo, len);
    for (k = lo; k <= hi; k++) scores[k - lo] = g4__bf16_round(scores[k - lo]);
    for (d0 = 0; d0 < D; d0 += 64) { /* 64 outputs at a time, key by key (each partial's sums in the same order) */
        int w = D - d0 < 64 ? D - d0 : 64;
        float part[4][64];
        memset(part, 0, sizeof part);
        for (k = lo; k <= hi; k++) {
            const float *val = sl->v + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D + (size_t)d0;
            float *pk = part[k < tail4 ? k % 4 : 0], p = scores[k - lo];
            if (w == 64) /* (a constant count, which GCC -O2 vectorizes) */
                for (d = 0; d < 64; d++) pk[d] += p * val[d];
            else
                for (d = 0; d < w; d++) pk[d] += p * val[d];
        }
        for (d = 0; d < w; d++) out[d0 + d] = g4__bf16_round(((part[0][d] + part[1][d]) + part[2][d]) + part[3][d]);
    }
}

/* ----------------------------------------------------- session >>session */

G4__DEF g4_session_config g4_session_config_init(void) {
    g4_session_config c;
    memset(&c, 0, sizeof c);
    c.max_chunk = 64;
    return c;
}

/* Carves every session buffer from `base` (or only counts when base is NULL);
   the same walk sizes and fills the arena, so the two cannot disagree.
   G4_ASAN_ARENA (the Makefile's sanitizer builds define it, with
   -fsanitize=address): every buffer is followed by G4__REDZONE bytes that a
   carver with `poison` set (the CPU session's and the training arena's, in
   host memory) marks unaddressable, so a buffer sized too small for what is
   written into it is an ASan error instead of a silent write into the next
   buffer of the same allocation. The sizes count the red zones too. */
#ifdef G4_ASAN_ARENA
#include <sanitizer/asan_interface.h>
#define G4__REDZONE 64
#define G4__ASAN_POISON(p, n) __asan_poison_memory_region((p), (n))
#define G4__ASAN_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define G4__REDZONE 0
#define G4__ASAN_POISON(p, n) ((void)(p), (void)(n))
#define G4__ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif
typedef struct {
    unsigned char *base;
    uint64_t off;
    int overflow;
    int poison; /* G4_ASAN_ARENA: poison the red zones (host memory only) */
} g4__carver;

static float *g4__take(g4__carver *cv, uint64_t count, size_t elem) {
    uint64_t bytes = count * elem, start = (cv->off + 63) & ~(uint64_t)63;
    if (count && bytes / count != elem) cv->overflow = 1;
    if (start + bytes < start || start + bytes > ((uint64_t)1 << 46)) cv->overflow = 1;
    cv->off = start + bytes + G4__REDZONE;
    if (G4__REDZONE && cv->poison && cv->base && !cv->overflow) G4__ASAN_POISON(cv->base + start + bytes, G4__REDZONE);
    return cv->base && !cv->overflow ? (float *)(void *)(cv->base + start) : NULL;
}

static int g4__slot_capacity(const g4_model *m, int type, int max_context, int rows) {
    int64_t cap = (int64_t)m->config.sliding_window - 1 + rows;
    if (type == G4_FULL || cap > max_context) return max_context;
    return (int)cap;
}

/* The shared-KV table's storage (used by the CPU session and the CUDA twin):
   K/V rows for owner layers only (and, with reader_copies, the test suites'
   debug layout, a copy per reader layer too), each slot filled in, and every
   layer's slot. slots/layer_slot NULL: only count. */
/* elem: bytes per K/V element (4; the CUDA fast mode's bf16 cache: 2, the
   slot's k/v then point at bf16 rows) */
static void g4__carve_kv_elem(g4_kv_slot *slots, int *layer_slot, const g4_model *m, const g4_session_config *cfg,
                              int reader_copies, g4__carver *cv, size_t elem) {
    const g4_plan *p = &m->plan;
    int i, next = p->n_slots;
    for (i = 0; i < p->n_layers; i++) {
        const g4_layer_plan *lp = &p->layer[i];
        int own = lp->reads < 0 || reader_copies, slot = lp->reads < 0 ? lp->kv_slot : next;
        int cap = g4__slot_capacity(m, lp->type, cfg->max_context, cfg->max_chunk);
        uint64_t rows = (uint64_t)cap * (uint64_t)lp->kv_heads * (uint64_t)lp->head_dim;
        float *k, *v;
        if (!own) { if (layer_slot) layer_slot[i] = lp->kv_slot; continue; }
        if (lp->reads >= 0) next++;
        k = g4__take(cv, rows, elem);
        v = g4__take(cv, rows, elem);
        if (slots && layer_slot) {
            g4_kv_slot *sl = &slots[slot];
            sl->writer = i;
            sl->type = lp->type;
            sl->kv_heads = lp->kv_heads;
            sl->head_dim = lp->head_dim;
            sl->capacity = cap;
            sl->n_pos = 0;
            sl->oldest = 0;
            sl->k = k;
            sl->v = v;
            layer_slot[i] = slot;
        }
    }
}


/* The widest layer shapes, which size the scratch rows (shared with the CUDA
   twin's carver): Dmax, KVHmax*Dmax (one K/V row), Imax; and the slots: one
   per owner, plus one per reader with reader_copies. */
typedef struct {
    uint64_t dmax, kvw, imax;
    int n_slots;
} g4__widths;

static g4__widths g4__max_widths(const g4_plan *p, int reader_copies) {
    g4__widths w;
    int i;
    memset(&w, 0, sizeof w);
    w.n_slots = p->n_slots;
    for (i = 0; i < p->n_layers; i++) {
        const g4_layer_plan *lp = &p->layer[i];
        uint64_t kvw = (uint64_t)lp->kv_heads * (uint64_t)lp->head_dim;
        if ((uint64_t)lp->head_dim > w.dmax) w.dmax = (uint64_t)lp->head_dim;
        if (kvw > w.kvw) w.kvw = kvw;
        if ((uint64_t)lp->mlp_width > w.imax) w.imax = (uint64_t)lp->mlp_width;
        if (reader_copies && lp->reads >= 0) w.n_slots++;
    }
    return w;
}

static void g4__carve(g4_session *s, const g4_model *m, const g4_session_config *cfg, int reader_copies,
                      g4__carver *cv) {
    const g4_config *c = &m->config;
    const g4_plan *p = &m->plan;
    const g4__widths w = g4__max_widths(p, reader_copies);
    uint64_t rows = (uint64_t)cfg->max_chunk, H = (uint64_t)c->hidden_size, NH = (uint64_t)c->num_attention_heads;
    uint64_t dmax = w.dmax, kvw = w.kvw, imax = w.imax, P = (uint64_t)c->hidden_size_per_layer_input;
    int n_slots = w.n_slots, li;
    if (c->enable_moe_block && (uint64_t)c->moe_intermediate_size * 2 > imax) imax = (uint64_t)c->moe_intermediate_size * 2;
    if (c->assistant) { /* a drafter: no K/V of its own, the target's table (g4_drafter_init) */
        s->layer_slot = (int *)(void *)g4__take(cv, (uint64_t)p->n_layers, sizeof(int));
        s->drafter.din = g4__take(cv, 2 * (uint64_t)c->backbone_hidden_size, sizeof(float));
        s->drafter.centroid = g4__take(cv, (uint64_t)c->num_centroids, sizeof(float));
        s->drafter.top = (int *)(void *)g4__take(cv, (uint64_t)c->centroid_intermediate_top_k, sizeof(int));
        s->drafter.centroid_q = (g4__vi *)(void *)g4__take(cv, (uint64_t)c->num_centroids, sizeof(g4__vi));
    } else {
        s->n_slots = n_slots;
        s->slots = (g4_kv_slot *)(void *)g4__take(cv, (uint64_t)n_slots, sizeof(g4_kv_slot));
        s->layer_slot = (int *)(void *)g4__take(cv, (uint64_t)p->n_layers, sizeof(int));
        g4__carve_kv_elem(s->slots, s->layer_slot, m, cfg, reader_copies, cv, sizeof(float));
    }
    s->x = g4__take(cv, rows * H, sizeof(float));
    s->xn = g4__take(cv, rows * H, sizeof(float));
    s->branch = g4__take(cv, rows * H, sizeof(float));
    s->branch2 = g4__take(cv, rows * H, sizeof(float));
    s->q = g4__take(cv, rows * NH * dmax, sizeof(float));
    s->att = g4__take(cv, rows * NH * dmax, sizeof(float));
    s->k_new = g4__take(cv, rows * kvw, sizeof(float));
    s->v_new = g4__take(cv, rows * kvw, sizeof(float));
    for (li = 0, s->att_heads = 1; li < p->n_layers; li++) /* the most heads an attention item takes */
        if (p->layer[li].kv_heads > 0 && g4__att_heads(c->num_attention_heads / p->layer[li].kv_heads) > s->att_heads)
            s->att_heads = g4__att_heads(c->num_attention_heads / p->layer[li].kv_heads);
    s->scores = g4__take(cv, (uint64_t)g4_pool_threads(cfg->pool) * (uint64_t)s->att_heads * (uint64_t)cfg->max_context, sizeof(float));
    s->gate = g4__take(cv, rows * imax, sizeof(float));
    s->up = g4__take(cv, rows * imax, sizeof(float));
    s->per_layer_inputs = g4__take(cv, rows * (uint64_t)c->num_hidden_layers * P, sizeof(float));
    s->per_layer_gate = g4__take(cv, rows * P, sizeof(float));
    s->router_in = g4__take(cv, c->enable_moe_block ? H : 0, sizeof(float));
    s->router = g4__take(cv, (uint64_t)c->num_experts, sizeof(float));
    s->moe_y = g4__take(cv, H, sizeof(float));
    s->inv_freq[G4_SLIDING] = g4__take(cv, dmax / 2, sizeof(float));
    s->inv_freq[G4_FULL] = g4__take(cv, dmax / 2, sizeof(float));
    {
        uint64_t widest = H > NH * dmax ? H : NH * dmax;
        if (imax > widest) widest = imax;
        if (P > widest) widest = P;
        if (c->assistant && 2 * (uint64_t)c->backbone_hidden_size > widest) widest = 2 * (uint64_t)c->backbone_hidden_size;
        /* carved whatever cfg->bf16 says: a caller may switch s->cfg.bf16 after init */
        s->xbf = (uint16_t *)(void *)g4__take(cv, G4__BF16DOT ? rows * widest : 0, sizeof(uint16_t));
    }
    s->lora_u = g4__take(cv, (rows > 2 ? rows : 2) * (uint64_t)m->lora_rmax, sizeof(float)); /* (the backward: [2r]) */
    s->lora_rmax = m->lora_rmax;
    s->pack_parts = g4_pool_threads(cfg->pool);
    s->pack = g4__take(cv, (uint64_t)s->pack_parts * g4__pack_thread_floats(), sizeof(float));
    { /* the GEMM's kc for this CPU's L2 */
        long l1d, l2, l3;
        g4__cache_sizes(&l1d, &l2, &l3);
        s->gemm_kc = g4__gemm_kc(l2);
    }
    { /* g4_forward_mm's rows (a config with placeholder ids only) */
        uint64_t mm = c->image_token_id >= 0 || c->video_token_id >= 0 || c->audio_token_id >= 0 ? rows : 0;
        s->mm_ids = (int32_t *)(void *)g4__take(cv, mm, sizeof(int32_t));
        s->mm_hi = (int *)(void *)g4__take(cv, mm, sizeof(int));
        s->mm_lo = (int *)(void *)g4__take(cv, mm, sizeof(int));
        if (!mm) { s->mm_ids = NULL; s->mm_hi = NULL; s->mm_lo = NULL; }
    }
}

static g4_result g4__check_session_config(const g4_model *m, const g4_session_config *cfg, char *err) {
    if (!m || !cfg || !m->w.layers) { g4__seterr(err, "NULL or unloaded model / config"); return G4_ERR_INPUT; }
    if (cfg->max_context < 1) { g4__seterr(err, "session max_context must be >= 1 (got %d)", cfg->max_context); return G4_ERR_INPUT; }
    if (cfg->max_chunk < 0) { g4__seterr(err, "session max_chunk must be >= 0 (got %d)", cfg->max_chunk); return G4_ERR_INPUT; }
    if (cfg->lora_bf16 && (!cfg->bf16 || !m->lora)) {
        g4__seterr(err, "session lora_bf16 needs bf16 and a model with a LoRA adapter");
        return G4_ERR_INPUT;
    }
    return G4_OK;
}

static g4_session_config g4__session_defaults(const g4_session_config *cfg) {
    g4_session_config c = *cfg;
    if (c.max_chunk == 0) c.max_chunk = 64;
    if (c.max_chunk > c.max_context) c.max_chunk = c.max_context;
    return c;
}

/* g4_session_size, _init and _create; reader_copies (not in the public
   config: the test suites' debug layout, g4i_reader_copies) gives every
   reader layer its own K/V slot, into which it copies its owner's rows */
static g4_result g4__session_size(const g4_model *m, const g4_session_config *cfg, int reader_copies, size_t *bytes) {
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
    g4__carve(&tmp, m, &c, reader_copies, &cv);
    if (cv.overflow || cv.off + 64 > (uint64_t)(size_t)-1) return G4_ERR_ARENA;
    *bytes = (size_t)cv.off + 64; /* slack: the arena only needs 16-byte alignment */
    return G4_OK;
}

static g4_result g4__session_init(g4_session *s, const g4_model *m, const g4_session_config *cfg, int reader_copies,
                                  void *arena, size_t arena_bytes) {
    size_t need;
    g4__carver cv;
    g4_session_config c;
    g4_result r;
    int t, i;
    if (!s) return G4_ERR_INPUT;
    memset(s, 0, sizeof *s);
    if ((r = g4__check_session_config(m, cfg, s->error)) != G4_OK) return r;
    if ((r = g4__session_size(m, cfg, reader_copies, &need)) != G4_OK) {
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
    cv.poison = 1;
    G4__ASAN_UNPOISON(arena, arena_bytes); /* red zones of an earlier carve of this memory */
    s->model = m;
    s->cfg = c;
    s->arena_bytes = arena_bytes;
    g4__carve(s, m, &c, reader_copies, &cv);
    for (t = 0; t < 2; t++)
        for (i = 0; i < m->plan.n_layers; i++)
            if (m->plan.layer[i].type == t) { g4__rope_init(s->inv_freq[t], &m->config.rope[t], m->plan.layer[i].head_dim); break; }
    return G4_OK;
}

G4__DEF void g4_session_reset(g4_session *s) {
    int i;
    if (!s || !s->slots || s->drafter.target) return; /* a drafter's slots are the target's */
    s->pos = 0;
    for (i = 0; i < s->n_slots; i++) s->slots[i].n_pos = s->slots[i].oldest = 0;
    s->epoch++;
    s->mm_open = 0;
}

G4__DEF g4_result g4_session_rewind(g4_session *s, int pos) {
    int i;
    if (!s) return G4_ERR_INPUT;
    if (!s->model || !s->slots || s->drafter.target) { g4__seterr(s->error, "rewind: not an initialised model session"); return G4_ERR_INPUT; }
    if (pos < 0 || pos > s->pos) {
        g4__seterr(s->error, "rewind to position %d: the session holds positions [0, %d)", pos, s->pos);
        return G4_ERR_INPUT;
    }
    for (i = 0; i < s->n_slots; i++) { /* check every slot before changing any */
        const g4_kv_slot *sl = &s->slots[i];
        int need = sl->type == G4_SLIDING ? pos - s->model->config.sliding_window + 1 : 0;
        if (need < 0) need = 0;
        if (need < sl->oldest && pos > 0) {
            g4__seterr(s->error, "rewind to position %d: layer %d's sliding ring holds positions [%d, %d) but position %d "
                       "needs %d on; rewind by at most max_chunk (%d) positions past the last forward", pos, sl->writer,
                       sl->oldest, sl->n_pos, pos, need, s->cfg.max_chunk);
            return G4_ERR_INPUT;
        }
    }
    for (i = 0; i < s->n_slots; i++)
        if (s->slots[i].n_pos > pos) s->slots[i].n_pos = pos;
    s->mm_open = 0;
    s->pos = pos;
    return G4_OK;
}

static g4_result g4__session_create(g4_session *s, const g4_model *m, const g4_session_config *cfg, int reader_copies) {
    size_t bytes;
    void *raw;
    g4_result r;
    if (!s) return G4_ERR_INPUT;
    memset(s, 0, sizeof *s);
    if ((r = g4__check_session_config(m, cfg, s->error)) != G4_OK) return r;
    if ((r = g4__session_size(m, cfg, reader_copies, &bytes)) != G4_OK || bytes > (size_t)-1 - 16) {
        g4__seterr(s->error, "session for %d positions does not fit in memory", cfg->max_context);
        return r != G4_OK ? r : G4_ERR_ARENA;
    }
    if (!(raw = G4_MALLOC(bytes + 16))) { /* + 16: G4_MALLOC need not align to 16 */
        g4__seterr(s->error, "out of memory for a session arena of %lu bytes (%d positions)", (unsigned long)bytes,
                   cfg->max_context);
        return G4_ERR_NOMEM;
    }
    if ((r = g4__session_init(s, m, cfg, reader_copies, (unsigned char *)raw + (16 - (uintptr_t)raw % 16) % 16,
                              bytes)) != G4_OK) {
        G4_FREE(raw);
        return r;
    }
    s->own_arena = raw;
    return G4_OK;
}

G4__DEF g4_result g4_session_size(const g4_model *m, const g4_session_config *cfg, size_t *bytes) {
    return g4__session_size(m, cfg, 0, bytes);
}

G4__DEF g4_result g4_session_init(g4_session *s, const g4_model *m, const g4_session_config *cfg, void *arena,
                                  size_t arena_bytes) {
    return g4__session_init(s, m, cfg, 0, arena, arena_bytes);
}

G4__DEF g4_result g4_session_create(g4_session *s, const g4_model *m, const g4_session_config *cfg) {
    return g4__session_create(s, m, cfg, 0);
}

G4__DEF void g4_session_destroy(g4_session *s) {
    if (!s) return;
    G4_FREE(s->own_arena);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------ forward pass >>forward */
/* Read next to transformers' modeling_gemma4.py: Gemma4TextModel.forward,
   Gemma4TextDecoderLayer.forward, Gemma4TextAttention.forward, ... Every
   module output is a tap point (see g4_tap_fn), named by its module path.
   First the plumbing (taps, the session's threaded ops, the shared-KV table),
   then the modules, innermost first. */

/* The decoder's tap points by id, their names in one table (shared by the
   CUDA twin and the training reference, which keeps some of them for its
   backward by id: renaming a tap cannot drop one). A layer's tap is named
   "layers.<i>.<name>" ("layers.<i>" for G4__TAP_LAYER), a model tap (layer
   -1) "<name>". */
enum {
    /* a decoder layer's (g4__layer) */
    G4__TAP_LAYER, G4__TAP_INPUT_LAYERNORM, G4__TAP_Q, G4__TAP_K, G4__TAP_V, G4__TAP_ATTN,
    G4__TAP_POST_ATTENTION_LAYERNORM, G4__TAP_RESIDUAL, G4__TAP_PRE_FEEDFORWARD_LAYERNORM, G4__TAP_MLP,
    G4__TAP_POST_FEEDFORWARD_LAYERNORM_1, G4__TAP_PRE_FEEDFORWARD_LAYERNORM_2, G4__TAP_EXPERTS,
    G4__TAP_POST_FEEDFORWARD_LAYERNORM_2, G4__TAP_POST_FEEDFORWARD_LAYERNORM, G4__TAP_PER_LAYER_INPUT_GATE,
    G4__TAP_PER_LAYER_PROJECTION, G4__TAP_POST_PER_LAYER_INPUT_NORM,
    /* the raw projections (cfg.tap_projections) */
    G4__TAP_Q_PROJ, G4__TAP_K_PROJ, G4__TAP_V_PROJ, G4__TAP_GATE_PROJ, G4__TAP_UP_PROJ, G4__TAP_PER_LAYER_MODEL_PROJECTION,
    /* the model's (layer -1) */
    G4__TAP_EMBED_TOKENS, G4__TAP_PER_LAYER_INPUTS, G4__TAP_INPUTS_EMBEDS, G4__TAP_NORM, G4__TAP_LOGITS,
    G4__TAP_PRE_PROJECTION, /* a drafter's */
    G4__TAPS
};
static const char *const g4__tap_names[G4__TAPS] = {
    "", "input_layernorm", "self_attn.q", "self_attn.k", "self_attn.v", "self_attn",
    "post_attention_layernorm", "pre_feedforward_layernorm:input", "pre_feedforward_layernorm", "mlp",
    "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "experts",
    "post_feedforward_layernorm_2", "post_feedforward_layernorm", "per_layer_input_gate",
    "per_layer_projection", "post_per_layer_input_norm",
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj", "per_layer_model_projection",
    "embed_tokens", "per_layer_inputs", "inputs_embeds", "norm", "logits",
    "pre_projection"};
/* the table has a name for every id (a compile error otherwise) */
typedef char g4__tap_names_complete[sizeof g4__tap_names / sizeof g4__tap_names[0] == G4__TAPS ? 1 : -1];

/* Tap `id`'s name at `layer`: "layers.<layer>.<name>", "layers.<layer>"
   (G4__TAP_LAYER), or "<name>" when layer < 0 */
G4__MAYBE_UNUSED static const char *g4__tap_name(char *buf, size_t cap, int layer, int id) {
    if (layer < 0) return g4__tap_names[id];
    if (id == G4__TAP_LAYER) snprintf(buf, cap, "layers.%d", layer);
    else snprintf(buf, cap, "layers.%d.%s", layer, g4__tap_names[id]);
    return buf;
}

struct g4_train;
static void g4__train_tap(struct g4_train *t, int id, int layer, const float *data, int rows, int cols, int pos0);

/* Calls the tap, if any: the training reference's by id (s->train), else the
   caller's by name. Free when no tap is set. */
static void g4__tap(const g4_session *s, int layer, int id, const float *data, int rows, int cols) {
    char name[96];
    if (s->train) g4__train_tap(s->train, id, layer, data, rows, cols, s->layer_pos);
    else if (s->cfg.tap) s->cfg.tap(s->cfg.tap_user, g4__tap_name(name, sizeof name, layer, id), layer, data, rows, cols, s->layer_pos);
}

/* A projection's raw output, tapped only with cfg.tap_projections (the
   training reference keeps them for its backward) */
static void g4__tap_projection(const g4_session *s, int layer, int id, const float *data, int rows, int cols) {
    if (s->cfg.tap_projections) g4__tap(s, layer, id, data, rows, cols);
}

/* Gemma4RMSNorm on `rows` rows of `width` values, src -> dst (in place is
   fine), cast; then RoPE on each row when inv_freq is set (the rows are then
   heads, `heads` per token). The rows are split across threads. */
typedef struct {
    const g4_session *s; float *dst; const float *src; const g4_tensor *w; int width; const float *inv_freq; int heads;
} g4__norm_job;

static void g4__norm_range(void *ctx, size_t r0, size_t r1) {
    const g4__norm_job *j = (const g4__norm_job *)ctx;
    size_t r, e, q, W = (size_t)j->width, H = j->inv_freq ? (size_t)j->heads : 1; /* rows per position */
    for (r = r0; r < r1; r = e) { /* the rows of r's position in this range: the norm, then their RoPE */
        e = (r / H + 1) * H < r1 ? (r / H + 1) * H : r1;
        for (q = r; q < e; q++) {
            g4__rmsnorm(j->dst + q * W, j->src + q * W, j->w, j->width, j->s->model->config.rms_norm_eps);
            if (j->s->cfg.bf16) g4__bf16_round_range(j->dst + q * W, 0, W);
        }
        if (j->inv_freq) g4__rope(j->dst + r * W, (int)(e - r), j->inv_freq, j->width, j->s->layer_pos + (int)(r / H), j->s->cfg.bf16);
    }
}

static void g4__norm(const g4_session *s, float *dst, const float *src, const g4_tensor *w, int rows, int width,
                     const float *inv_freq, int heads) {
    g4__norm_job j;
    j.s = s; j.dst = dst; j.src = src; j.w = w; j.width = width; j.inv_freq = inv_freq; j.heads = heads;
    g4__parallel_range(s, (size_t)rows, (size_t)width, g4__norm_range, &j);
}

/* A norm module on n rows of the hidden states, then its tap */
static void g4__norm_rows(const g4_session *s, float *dst, const float *src, const g4_tensor *w, int n, int width,
                          int layer, int tap) {
    g4__norm(s, dst, src, w, n, width, NULL, 0);
    g4__tap(s, layer, tap, dst, n, width);
}

/* q_norm / k_norm, then apply_rotary_pos_emb, on every head of x [n][heads][D]
   in place; with norm and inv_freq NULL it is v_norm (weightless, no RoPE). */
static void g4__norm_rope(const g4_session *s, float *x, const g4_tensor *norm, const float *inv_freq, int n, int heads,
                          int D) {
    g4__norm(s, x, x, norm, n * heads, D, inv_freq, heads);
}

/* The elementwise ops of the forward pass, one line each, over [0, n) split
   across the session's threads. Each casts its output (g4__act), and every
   intermediate that transformers running in bfloat16 rounds. */
typedef enum { G4__ADD, G4__MUL, G4__GELU_MUL, G4__SOFTCAP } g4__ew_op;
typedef struct {
    const g4_session *s; g4__ew_op op; float *x; const float *y; const g4_tensor *w; float a; size_t off, total;
} g4__ew_job;

static void g4__ew_range(void *ctx, size_t i0, size_t i1) {
    const g4__ew_job *j = (const g4__ew_job *)ctx;
    float *x = j->x, a = j->a;
    const float *y = j->y;
    const int bf = j->s->cfg.bf16;
    size_t i, b, e;
    switch (j->op) {
    case G4__ADD: for (i = i0; i < i1; i++) x[i] += y[i]; break;
    case G4__MUL: /* x * w * a (w repeats over the rows of x), or x * a */
        if (j->w) for (i = i0; i < i1; i++) x[i] = g4__act(x[i] * g4__get(j->w, i % (size_t)j->w->shape[0]), bf) * a;
        else for (i = i0; i < i1; i++) x[i] *= a;
        break;
    case G4__SOFTCAP: for (i = i0; i < i1; i++) x[i] = g4__act(g4__tanhf(g4__act(x[i] / a, bf)), bf) * a; break;
    case G4__GELU_MUL: /* gelu(x) * y, in blocks that stay in L1 between the two loops */
        for (b = i0; b < i1; b = e) {
            e = i1 - b < 1024 ? i1 : b + 1024;
            if (bf) { /* x[i] is element off + i of [total]; the rounding apart, so the product loop vectorizes */
                g4__gelu_torch_n(x + b, x + b, e - b, j->off + b, j->total);
                g4__bf16_round_range(x, b, e);
            } else g4__gelu_n(x + b, x + b, e - b);
            for (i = b; i < e; i++) x[i] *= y[i];
        }
        break;
    }
    if (bf) g4__bf16_round_range(x, i0, i1);
}

static void g4__ew(const g4_session *s, g4__ew_op op, float *x, const float *y, const g4_tensor *w, float a, size_t n,
                  size_t off, size_t total) {
    g4__ew_job j;
    j.s = s; j.op = op; j.x = x; j.y = y; j.w = w; j.a = a; j.off = off; j.total = total;
    g4__parallel_range(s, n, 1, g4__ew_range, &j);
}
/* x += y (a residual add) */
static void g4__add(const g4_session *s, float *x, const float *y, size_t n) { g4__ew(s, G4__ADD, x, y, NULL, 0.0f, n, 0, 0); }
/* x = x * w * a, w a [width] weight repeated over the rows of x (NULL: x * a) */
static void g4__mul(const g4_session *s, float *x, const g4_tensor *w, float a, size_t n) {
    g4__ew(s, G4__MUL, x, NULL, w, a, n, 0, 0);
}
/* x = act_fn(x) * y, act_fn gelu_pytorch_tanh. x is elements [off, off + n) of
   the [total] tensor transformers applies act_fn to (bf16 mode: torch's gelu
   depends on the place of an element, see g4__gelu_torch_n). */
static void g4__gelu_mul(const g4_session *s, float *x, const float *y, size_t n, size_t off, size_t total) {
    g4__ew(s, G4__GELU_MUL, x, y, NULL, 0.0f, n, off, total);
}
/* the first row of this step in the running g4_forward call's [fwd_n] rows */
static size_t g4__call_row(const g4_session *s) { return (size_t)(s->layer_pos - s->fwd_end + s->fwd_n); }
/* x = tanh(x / cap) * cap (the final logit soft-cap) */
static void g4__softcap(const g4_session *s, float *x, float cap, size_t n) {
    g4__ew(s, G4__SOFTCAP, x, NULL, NULL, cap, n, 0, 0);
}

/* Gemma4TextScaledWordEmbedding for n ids: y[t] = E[ids[t]] * scale, cast;
   with add, y[t] += that (cast). */
static void g4__embed(const g4_session *s, float *y, const g4_tensor *E, const int32_t *ids, int n, float scale, int add) {
    size_t W = (size_t)E->shape[1], t, j;
    const int bf = s->cfg.bf16;
    for (t = 0; t < (size_t)n; t++)
        for (j = 0; j < W; j++) {
            float e = g4__act(g4__get(E, (size_t)ids[t] * W + j) * scale, bf), *yj = y + t * W + j;
            *yj = add ? g4__act(*yj + e, bf) : e;
        }
}

/* The shared-KV table (transformers' past_key_values + shared_kv_states).
   Rows pos0 .. pos0+n-1 of a slot's ring <-> flat rows k, v [n][KVH*D]:
   store (and the slot then holds up to pos0 + n) or load. */
static void g4__kv_rows(g4_kv_slot *sl, float *k, float *v, int pos0, int n, int store) {
    size_t w = (size_t)sl->kv_heads * (size_t)sl->head_dim, bytes = sizeof(float) * w;
    int t;
    for (t = 0; t < n; t++) {
        size_t row = (size_t)((pos0 + t) % sl->capacity) * w;
        if (store) { memcpy(sl->k + row, k + (size_t)t * w, bytes); memcpy(sl->v + row, v + (size_t)t * w, bytes); }
        else { memcpy(k + (size_t)t * w, sl->k + row, bytes); memcpy(v + (size_t)t * w, sl->v + row, bytes); }
    }
    if (store) {
        sl->n_pos = pos0 + n;
        if (sl->n_pos - sl->capacity > sl->oldest) sl->oldest = sl->n_pos - sl->capacity;
    }
}

/* An owner layer appends this step's K and V (s->k_new, s->v_new) to its slot:
   past_key_values.update, and shared_kv_states[layer_type] for its readers. */
static g4_result g4__kv_store(g4_session *s, int l, int n) {
    g4_kv_slot *sl = &s->slots[s->model->plan.layer[l].kv_slot];
    if (sl->writer != l || sl->n_pos != s->layer_pos) {
        g4__seterr(s->error, "internal: layer %d's slot was written out of order", l);
        return G4_ERR_INPUT;
    }
    g4__kv_rows(sl, s->k_new, s->v_new, s->layer_pos, n, 1);
    return G4_OK;
}

static g4_result g4__drafter_check_read(const g4_session *d, int l, const g4_kv_slot *sl); /* >>drafter */
static const int32_t *g4__mm_ids(g4_session *s, const int32_t *ids, int n); /* >>vision */
static void g4__mm_merge(g4_session *s, const int32_t *ids, int n);
static void g4__mm_range(const g4_session *s, int type, int t, int p, int *lo, int *hi);
static void g4__all_range(const g4_session *s, int window, int n, int p, int *lo, int *hi); /* >>unified */


/* *out: the slot layer l attends over (its own, or shared_kv_states[layer_type]
   for a reader), which must hold exactly this step's positions (write once,
   then read; a drafter's layer: the target's positions it needs). In the
   reader_copies debug layout (a slot of its own, g4__session_init) a reader
   first copies this step's rows of its owner's slot into it. */
static g4_result g4__kv_read(g4_session *s, int l, int n, g4_kv_slot **out) {
    const g4_layer_plan *lp = &s->model->plan.layer[l];
    g4_kv_slot *sl = *out = &s->slots[s->layer_slot[l]];
    if (lp->reads >= 0 && sl->writer == l) { /* a reader's own slot: the debug layout */
        g4__kv_rows(&s->slots[lp->kv_slot], s->k_new, s->v_new, s->layer_pos, n, 0);
        g4__kv_rows(sl, s->k_new, s->v_new, s->layer_pos, n, 1);
    }
    if (lp->reads == G4_READS_TARGET) return g4__drafter_check_read(s, l, sl);
    if (sl->n_pos != s->layer_pos + n) {
        g4__seterr(s->error, "internal: layer %d reads slot %d before its writer (layer %d) appended this step", l,
                   s->layer_slot[l], sl->writer);
        return G4_ERR_INPUT;
    }
    return G4_OK;
}

/* eager_attention_forward (scaling 1.0, causal, sliding window if any) over
   the step's (token, query head) pairs, s->q -> s->att; query head h reads KV
   head h / (NH / KVH). Split across threads in items of G heads of one token
   that share a KV head (g4__att_heads; 1 when there are fewer such items than
   threads, as in a decode step); part p uses its own G rows of scores and
   takes every n_parts-th item from p (a causal query's keys grow with its
   position: contiguous ranges gave the second of two parts 3x the first's
   work in a 512-token chunk). Any G and any split give the same bits.
   target: a drafter's layer, whose query at p reads the target's positions
   before p. */
typedef struct { const g4_session *s; const g4_kv_slot *sl; int n, NH, group, G, window, target; } g4__attn_job;

static void g4__attn_part(void *ctx, int part, int n_parts) {
    const g4__attn_job *j = (const g4__attn_job *)ctx;
    const g4_session *s = j->s;
    int D = j->sl->head_dim, G = j->G, items = j->n * (j->NH / G), i, g;
    int fast = G4__BF16DOT && s->cfg.bf16 && s->cfg.bf16_fast; /* bf16_fast: g4__attend's order with bf16 roundings */
    float *scores = s->scores + (size_t)part * (size_t)s->att_heads * (size_t)s->cfg.max_context;
    for (i = part; i < items; i += n_parts) {
        int t = i / (j->NH / G), h = i % (j->NH / G) * G, p = s->layer_pos + t, lo = 0, hi = p;
        size_t at = ((size_t)t * (size_t)j->NH + (size_t)h) * (size_t)D;
        if (j->target) { /* a drafter's query at p reads the target's positions before p */
            hi = p - 1;
            if (j->window && hi - j->window > 0) lo = hi - j->window;
        } else {
            if (j->window && p - j->window + 1 > 0) lo = p - j->window + 1;
            g4__mm_range(s, j->window ? G4_SLIDING : G4_FULL, t, p, &lo, &hi); /* an image block's rows */
            if (s->model->config.bidirectional == G4_BIDIR_ALL) g4__all_range(s, j->window, j->n, p, &lo, &hi);
        }
        if (s->cfg.bf16 && !fast)
            for (g = 0; g < G; g++)
                g4__attend_torch(s->att + at + (size_t)g * D, s->q + at + (size_t)g * D, j->sl, (h + g) / j->group, lo, hi, scores,
                                 s->fwd_n, s->fwd_end);
        else g4__attend_blocked(s->att + at, s->q + at, G, j->sl, h / j->group, lo, hi, scores, fast);
    }
}

static void g4__eager_attention(const g4_session *s, const g4_kv_slot *sl, int n, int NH, int KVH, int window,
                                int target) {
    g4__attn_job j;
    j.s = s; j.sl = sl; j.n = n; j.NH = NH; j.group = NH / KVH; j.window = window; j.target = target;
    j.G = g4__att_heads(j.group);
    if (j.G > s->att_heads || (int64_t)n * (NH / j.G) < g4_pool_threads(s->cfg.pool)) j.G = 1;
    g4__parallel(s->cfg.pool, g4__attn_part, &j);
}

/* Gemma4TextAttention for layer l on n tokens at positions s->layer_pos..: reads
   s->xn, writes the o_proj output to s->branch. */
static g4_result g4__attention(g4_session *s, int l, int n) {
    const g4_model *m = s->model;
    const g4_layer_plan *lp = &m->plan.layer[l];
    const g4_layer_weights *lw = &m->w.layers[l];
    const float *inv_freq = s->inv_freq[lp->type]; /* position_embeddings of the layer type */
    int NH = m->config.num_attention_heads, D = lp->head_dim, KVH = lp->kv_heads;
    g4_kv_slot *sl;
    g4_result r;

    /* query_states = apply_rotary_pos_emb(q_norm(q_proj(x))) */
    g4__matmul(s, s->q, s->xn, &lw->q_proj, n);
    g4__tap_projection(s, l, G4__TAP_Q_PROJ, s->q, n, NH * D);
    g4__norm_rope(s, s->q, &lw->q_norm, inv_freq, n, NH, D);
    g4__tap(s, l, G4__TAP_Q, s->q, n, NH * D);

    if (lp->reads == -1) { /* not is_kv_shared_layer: its own keys and values */
        g4__matmul(s, s->k_new, s->xn, &lw->k_proj, n);
        g4__tap_projection(s, l, G4__TAP_K_PROJ, s->k_new, n, KVH * D);
        if (lp->has_v_proj) {
            g4__matmul(s, s->v_new, s->xn, &lw->v_proj, n);
            g4__tap_projection(s, l, G4__TAP_V_PROJ, s->v_new, n, KVH * D);
        } else memcpy(s->v_new, s->k_new, sizeof(float) * (size_t)n * KVH * D); /* attention_k_eq_v: V = raw K */
        if (!s->replay) { /* (a training recompute: the slot holds them already) */
            g4__norm_rope(s, s->k_new, &lw->k_norm, inv_freq, n, KVH, D);
            g4__norm_rope(s, s->v_new, NULL, NULL, n, KVH, D); /* v_norm */
            if ((r = g4__kv_store(s, l, n)) != G4_OK) return r;
        }
    }
    if ((r = g4__kv_read(s, l, n, &sl)) != G4_OK) return r;
    if ((s->cfg.tap || s->train) && !s->drafter.target) { /* this step's K, V as this layer reads them (a drafter reads the target's) */
        g4__kv_rows(sl, s->k_new, s->v_new, s->layer_pos, n, 0);
        g4__tap(s, l, G4__TAP_K, s->k_new, n, KVH * D);
        g4__tap(s, l, G4__TAP_V, s->v_new, n, KVH * D);
    }

    g4__eager_attention(s, sl, n, NH, KVH, lp->type == G4_SLIDING ? m->config.sliding_window : 0,
                        lp->reads == G4_READS_TARGET);
    g4__matmul(s, s->branch, s->att, &lw->o_proj, n);
    g4__tap(s, l, G4__TAP_ATTN, s->branch, n, m->config.hidden_size);
    return G4_OK;
}

/* Gemma4TextMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)), s->xn -> s->branch */
static void g4__mlp(g4_session *s, int l, int n) {
    const g4_layer_weights *lw = &s->model->w.layers[l];
    size_t W = (size_t)s->model->plan.layer[l].mlp_width;
    g4__matmul(s, s->gate, s->xn, &lw->gate_proj, n);
    g4__tap_projection(s, l, G4__TAP_GATE_PROJ, s->gate, n, (int)W);
    g4__matmul(s, s->up, s->xn, &lw->up_proj, n);
    g4__tap_projection(s, l, G4__TAP_UP_PROJ, s->up, n, (int)W);
    g4__gelu_mul(s, s->gate, s->up, (size_t)n * W, g4__call_row(s) * W, (size_t)s->fwd_n * W);
    g4__matmul(s, s->branch, s->gate, &lw->down_proj, n);
    g4__tap(s, l, G4__TAP_MLP, s->branch, n, s->model->config.hidden_size);
}

/* The chosen experts in ascending id, the order transformers' experts loop adds them in */
static void g4__sort_by_expert(int *index, float *weight, int K) {
    int k, j;
    for (k = 1; k < K; k++) /* insertion sort */
        for (j = k; j > 0 && index[j - 1] > index[j]; j--) {
            int ti = index[j];
            float tw = weight[j];
            index[j] = index[j - 1]; weight[j] = weight[j - 1];
            index[j - 1] = ti; weight[j - 1] = tw;
        }
}

/* Expert e's [out, in] matrix of a stacked [E, out, in] experts tensor
   (Gemma4TextExperts' gate_up_proj[e], down_proj[e]) */
static g4_tensor g4__expert(const g4_tensor *w, int e) {
    g4_tensor t = *w;
    size_t per = (size_t)w->shape[1] * (size_t)w->shape[2] * g4__dtype_size(w->dtype);
    t.data = (const unsigned char *)w->data + (size_t)e * per;
    t.ndim = 2; t.shape[0] = w->shape[1]; t.shape[1] = w->shape[2]; t.shape[2] = 0;
    return t;
}

/* Gemma4TextRouter + Gemma4TextExperts for one token. r: the residual after
   attention (not normed), xn: pre_feedforward_layernorm_2(r), out: [H]. */
static void g4__moe(g4_session *s, int l, const float *r, const float *xn, float *out) {
    const g4_config *c = &s->model->config;
    const g4_layer_weights *lw = &s->model->w.layers[l];
    int H = c->hidden_size, Ie = c->moe_intermediate_size, K = c->top_k_experts, top_k_index[G4_MAX_TOP_K], k;
    float top_k_weights[G4_MAX_TOP_K], sum = 0.0f;

    /* router: norm (weightless), * scale * H^-0.5, proj, softmax in float32, torch.topk */
    g4__norm(s, s->router_in, r, NULL, 1, H, NULL, 0);
    g4__mul(s, s->router_in, &lw->router_scale, (float)(1.0 / sqrt((double)H)), (size_t)H);
    g4__matmul(s, s->router, s->router_in, &lw->router_proj, 1);
    if (s->cfg.bf16) g4__softmax_torch(s->router, c->num_experts, 0, c->num_experts);
    else g4__softmax(s->router, c->num_experts);
    g4__topk_torch(s->router, c->num_experts, K, top_k_index);
    for (k = 0; k < K; k++) sum += top_k_weights[k] = s->router[top_k_index[k]]; /* summed in topk's order */
    for (k = 0; k < K; k++) /* renormalised, times per_expert_scale */
        top_k_weights[k] = top_k_weights[k] / sum * g4__get(&lw->router_per_expert_scale, (size_t)top_k_index[k]);

    /* experts: out = sum of down_proj[e](act_fn(gate) * up) * weight, gate | up = gate_up_proj[e](xn) */
    g4__sort_by_expert(top_k_index, top_k_weights, K);
    memset(out, 0, sizeof(float) * (size_t)H);
    for (k = 0; k < K; k++) {
        const g4_tensor gate_up = g4__expert(&lw->experts_gate_up, top_k_index[k]);
        const g4_tensor down = g4__expert(&lw->experts_down, top_k_index[k]);
        g4__matmul(s, s->gate, xn, &gate_up, 1);
        g4__gelu_mul(s, s->gate, s->gate + Ie, (size_t)Ie, 0, (size_t)Ie); /* [gate | up] */
        g4__matmul(s, s->moe_y, s->gate, &down, 1);
        g4__mul(s, s->moe_y, NULL, top_k_weights[k], (size_t)H);
        g4__add(s, out, s->moe_y, (size_t)H); /* index_add_ */
    }
}

/* Gemma4TextDecoderLayer l on s->x (in place). */
static g4_result g4__layer(g4_session *s, int l, int n) {
    const g4_model *m = s->model;
    const g4_config *c = &m->config;
    const g4_layer_weights *lw = &m->w.layers[l];
    int H = c->hidden_size, P = c->hidden_size_per_layer_input, t;
    size_t nh = (size_t)n * H;
    g4_result r;

    /* 1. attention block: h = x + post_attention_layernorm(self_attn(input_layernorm(x))) */
    g4__norm_rows(s, s->xn, s->x, &lw->input_layernorm, n, H, l, G4__TAP_INPUT_LAYERNORM);
    if ((r = g4__attention(s, l, n)) != G4_OK) return r;
    g4__norm_rows(s, s->branch, s->branch, &lw->post_attention_layernorm, n, H, l, G4__TAP_POST_ATTENTION_LAYERNORM);
    g4__add(s, s->x, s->branch, nh);
    g4__tap(s, l, G4__TAP_RESIDUAL, s->x, n, H); /* the residual r */

    /* 2. feed-forward block on the residual r = x */
    g4__norm_rows(s, s->xn, s->x, &lw->pre_feedforward_layernorm, n, H, l, G4__TAP_PRE_FEEDFORWARD_LAYERNORM);
    g4__mlp(s, l, n);
    if (m->plan.layer[l].moe) { /* 3. m = post_feedforward_layernorm_1(mlp) + post_feedforward_layernorm_2(experts(r)) */
        g4__norm_rows(s, s->branch, s->branch, &lw->post_feedforward_layernorm_1, n, H, l, G4__TAP_POST_FEEDFORWARD_LAYERNORM_1);
        g4__norm_rows(s, s->xn, s->x, &lw->pre_feedforward_layernorm_2, n, H, l, G4__TAP_PRE_FEEDFORWARD_LAYERNORM_2);
        for (t = 0; t < n; t++) g4__moe(s, l, s->x + (size_t)t * H, s->xn + (size_t)t * H, s->branch2 + (size_t)t * H);
        g4__tap(s, l, G4__TAP_EXPERTS, s->branch2, n, H);
        g4__norm_rows(s, s->branch2, s->branch2, &lw->post_feedforward_layernorm_2, n, H, l, G4__TAP_POST_FEEDFORWARD_LAYERNORM_2);
        g4__add(s, s->branch, s->branch2, nh);
    }
    /* 4. h = r + post_feedforward_layernorm(m) */
    g4__norm_rows(s, s->branch, s->branch, &lw->post_feedforward_layernorm, n, H, l, G4__TAP_POST_FEEDFORWARD_LAYERNORM);
    g4__add(s, s->x, s->branch, nh);

    /* 5. per-layer input: h += post_per_layer_input_norm(per_layer_projection(act_fn(per_layer_input_gate(h))
          * per_layer_input)), per_layer_input being this layer's slice of per_layer_inputs */
    if (P) {
        size_t LP = (size_t)c->num_hidden_layers * P;
        g4__matmul(s, s->per_layer_gate, s->x, &lw->per_layer_input_gate, n);
        g4__tap(s, l, G4__TAP_PER_LAYER_INPUT_GATE, s->per_layer_gate, n, P);
        for (t = 0; t < n; t++)
            g4__gelu_mul(s, s->per_layer_gate + (size_t)t * P, s->per_layer_inputs + t * LP + (size_t)l * P, (size_t)P,
                         (g4__call_row(s) + (size_t)t) * P, (size_t)s->fwd_n * P);
        g4__matmul(s, s->branch, s->per_layer_gate, &lw->per_layer_projection, n);
        g4__tap(s, l, G4__TAP_PER_LAYER_PROJECTION, s->branch, n, H);
        g4__norm_rows(s, s->branch, s->branch, &lw->post_per_layer_input_norm, n, H, l, G4__TAP_POST_PER_LAYER_INPUT_NORM);
        g4__add(s, s->x, s->branch, nh);
    }

    /* 6. hidden_states *= layer_scalar */
    g4__mul(s, s->x, NULL, g4__get(&lw->layer_scalar, 0), nh);
    g4__tap(s, l, G4__TAP_LAYER, s->x, n, H);
    return G4_OK;
}

/* The embedding scale: sqrt(H) cast to the activation dtype, as transformers
   casts its embed_scale buffer (39.191837 in float32, 39.25 in bf16 for E2B).
   g4__scale_mode takes the mode as a flag (shared with the CUDA twin). */
static float g4__scale_mode(int bf16, int dim) {
    float f = (float)sqrt((double)dim);
    return bf16 ? g4__bf16_round(f) : f;
}
static float g4__scale(const g4_session *s, int dim) { return g4__scale_mode(s->cfg.bf16, dim); }

/* Per-Layer Embeddings for n tokens (Gemma4TextModel.get_per_layer_inputs +
   project_per_layer_inputs): per_layer_inputs = (per_layer_projection_norm(
   per_layer_model_projection(x) * H^-0.5) + embed_tokens_per_layer[id] * sqrt(P)) * 2^-0.5 */
static void g4__per_layer_inputs(g4_session *s, const int32_t *ids, int n) {
    const g4_model *m = s->model;
    const g4_config *c = &m->config;
    int P = c->hidden_size_per_layer_input, L = c->num_hidden_layers;
    size_t LP = (size_t)L * P;
    float *per_layer_inputs = s->per_layer_inputs;
    g4__matmul(s, per_layer_inputs, s->x, &m->w.per_layer_model_projection, n);
    g4__tap_projection(s, -1, G4__TAP_PER_LAYER_MODEL_PROJECTION, per_layer_inputs, n, (int)LP);
    g4__mul(s, per_layer_inputs, NULL, (float)(1.0 / sqrt((double)c->hidden_size)), (size_t)n * LP);
    g4__norm(s, per_layer_inputs, per_layer_inputs, &m->w.per_layer_projection_norm, n * L, P, NULL, 0);
    g4__embed(s, per_layer_inputs, &m->w.embed_tokens_per_layer, ids, n, g4__scale(s, P), 1); /* + get_per_layer_inputs */
    g4__mul(s, per_layer_inputs, NULL, (float)(1.0 / sqrt(2.0)), (size_t)n * LP);
    g4__tap(s, -1, G4__TAP_PER_LAYER_INPUTS, per_layer_inputs, n, (int)LP);
}

/* The first of the step's rows that the KV-reader layers (first_shared and
   after) must compute, as transformers' Gemma4TextModel slices them
   (_maybe_slice_kv_shared_inputs): those layers write no K/V, so a row whose
   logits nobody asked for (all but [first, n) with out; every row without)
   ends in them. Each kept row's arithmetic is unchanged (a row's sums never
   depend on the other rows), so its bits are too. 0 (every row) where
   something sees the other rows: taps, training, a multimodal step's image
   blocks, bidirectional attention, the reader_copies debug layout (a slot
   per reader too: more slots than the plan's owners). */
static int g4__reader_rows_from(const g4_session *s, int n, const float *out, int first) {
    const g4_config *c = &s->model->config;
    int fs = s->model->plan.first_shared;
    if (fs <= 0 || fs >= c->num_hidden_layers || s->cfg.tap || s->train || s->replay || s->mm_active ||
        c->bidirectional != G4_BIDIR_NONE || s->n_slots != s->model->plan.n_slots || s->drafter.target)
        return 0;
    return out ? first : n;
}

/* One step of n <= max_chunk tokens. Logits rows [first, n) go to out. */
static g4_result g4__step(g4_session *s, const int32_t *ids, int n, float *out, int first) {
    const g4_model *m = s->model;
    const g4_config *c = &m->config;
    int H = c->hidden_size, V = c->vocab_size, l, keep = g4__reader_rows_from(s, n, out, first), rows = n;
    g4_result r = G4_OK;

    const int32_t *tok = g4__mm_ids(s, ids, n); /* a multimodal step: placeholders as pad_token_id (>>vision) */
    s->layer_pos = s->pos;
    g4__embed(s, s->x, &m->w.embed_tokens, tok, n, g4__scale(s, H), 0); /* embed_tokens: E[id] * sqrt(H) */
    g4__tap(s, -1, G4__TAP_EMBED_TOKENS, s->x, n, H);
    g4__mm_merge(s, ids, n); /* the placeholder rows take the soft tokens */
    if (c->hidden_size_per_layer_input) g4__per_layer_inputs(s, tok, n);

    for (l = 0; l < c->num_hidden_layers && r == G4_OK; l++) {
        if (l == m->plan.first_shared && keep > 0) { /* the reader layers: rows [keep, n) only */
            size_t LP = (size_t)c->num_hidden_layers * (size_t)c->hidden_size_per_layer_input;
            if (keep == n) break; /* none: no logits, and no K/V to write */
            memmove(s->x, s->x + (size_t)keep * H, sizeof(float) * (size_t)(n - keep) * H);
            if (LP) memmove(s->per_layer_inputs, s->per_layer_inputs + keep * LP, sizeof(float) * (size_t)(n - keep) * LP);
            s->layer_pos = s->pos + keep; /* row t is now the step's row keep + t */
            rows = n - keep;
        }
        r = g4__layer(s, l, rows);
    }
    if (r != G4_OK) return r;

    /* final norm (rows [keep, n) of the step), tied lm_head, soft-cap */
    if (keep < n) g4__norm_rows(s, s->xn + (size_t)(n - rows) * H, s->x, &m->w.norm, rows, H, -1, G4__TAP_NORM);
    if (out && first < n) {
        g4__matmul(s, out, s->xn + (size_t)first * H, &m->w.lm_head, n - first);
        if (c->final_logit_softcapping > 0.0f) g4__softcap(s, out, c->final_logit_softcapping, (size_t)(n - first) * V);
        g4__tap(s, -1, G4__TAP_LOGITS, out, n - first, V);
    }
    s->pos += n;
    return G4_OK;
}

/* The checks every forward makes before touching the session (shared with the
   CUDA twin): ids, count, room in the context, logits mode and buffer. */
static g4_result g4__check_forward(const g4_config *c, int pos, int max_context, const int32_t *ids, int n,
                                   const float *logits, int mode, char *err) {
    int i;
    if (!ids || n < 1) { g4__seterr(err, "no tokens (ids %s, n %d)", ids ? "set" : "NULL", n); return G4_ERR_INPUT; }
    if (mode != G4_LOGITS_NONE && mode != G4_LOGITS_LAST && mode != G4_LOGITS_ALL) {
        g4__seterr(err, "unknown logits mode %d", mode);
        return G4_ERR_INPUT;
    }
    if (mode != G4_LOGITS_NONE && !logits) { g4__seterr(err, "logits buffer is NULL"); return G4_ERR_INPUT; }
    if (n > max_context - pos) {
        g4__seterr(err, "%d tokens at position %d exceed the session's max_context of %d", n, pos, max_context);
        return G4_ERR_INPUT;
    }
    for (i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= c->vocab_size) {
            g4__seterr(err, "token id %ld at index %d is outside the vocabulary [0, %d)", (long)ids[i], i, c->vocab_size);
            return G4_ERR_INPUT;
        }
        if (c->hidden_size_per_layer_input && ids[i] >= c->vocab_size_per_layer_input) {
            g4__seterr(err, "token id %ld at index %d is outside the per-layer embedding table [0, %d)", (long)ids[i], i,
                       c->vocab_size_per_layer_input);
            return G4_ERR_INPUT;
        }
    }
    return G4_OK;
}

/* The chunks of one forward call (shared with the CUDA twin):
       r = g4__chunks_begin(&ch, ...);            checks the call
       while (r == G4_OK && g4__chunks_next(&ch)) r = step(ch.ids, ch.n, ch.out, ch.first);
   A chunk is at most max_chunk tokens; it writes logits rows [first, n) to
   out (out NULL: none). c NULL: the session is not initialised. */
typedef struct {
    const int32_t *ids; /* the chunk: n tokens */
    int n, first;
    float *out;
    const int32_t *all; /* the call */
    float *logits;
    int done, total, max_chunk, mode, vocab;
} g4__chunks;

static g4_result g4__chunks_begin(g4__chunks *ch, const g4_config *c, int pos, const g4_session_config *cfg,
                                  const int32_t *ids, int n, float *logits, int mode, char *err) {
    memset(ch, 0, sizeof *ch);
    if (!c) { g4__seterr(err, "session is not initialised"); return G4_ERR_INPUT; }
    ch->all = ids;
    ch->logits = logits;
    ch->total = n;
    ch->max_chunk = cfg->max_chunk;
    ch->mode = mode;
    ch->vocab = c->vocab_size;
    return g4__check_forward(c, pos, cfg->max_context, ids, n, logits, mode, err);
}

static int g4__chunks_next(g4__chunks *ch) {
    ch->done += ch->n;
    if (ch->done >= ch->total) return 0;
    ch->n = ch->total - ch->done < ch->max_chunk ? ch->total - ch->done : ch->max_chunk;
    ch->ids = ch->all + ch->done;
    ch->out = NULL;
    ch->first = 0;
    if (ch->mode == G4_LOGITS_ALL) ch->out = ch->logits + (size_t)ch->done * ch->vocab;
    else if (ch->mode == G4_LOGITS_LAST && ch->done + ch->n == ch->total) { ch->out = ch->logits; ch->first = ch->n - 1; }
    return 1;
}

G4__DEF g4_result g4_forward_hidden(g4_session *s, const int32_t *ids, int n, float *logits, int mode, float *hidden) {
    g4__chunks ch;
    g4_result r;
    size_t H;
    if (!s) return G4_ERR_INPUT;
    if (s->model && s->slots && s->drafter.target) {
        g4__seterr(s->error, "a drafter session runs with g4_draft_step, not g4_forward");
        return G4_ERR_INPUT;
    }
    if (s->model && s->slots && s->lora_rmax != s->model->lora_rmax) {
        g4__seterr(s->error, "the model's LoRA adapter was loaded after this session was made: make the session again");
        return G4_ERR_INPUT;
    }
    r = g4__chunks_begin(&ch, s->model && s->slots ? &s->model->config : NULL, s->pos, &s->cfg, ids, n, logits, mode,
                         s->error);
    if (r == G4_OK && hidden && mode == G4_LOGITS_NONE) {
        g4__seterr(s->error, "hidden rows follow the logits rows: mode NONE has none");
        r = G4_ERR_INPUT;
    }
    if (r == G4_OK) {
        s->fwd_end = s->pos + n;
        s->fwd_n = n;
        s->mm_open = 0; /* (text rows: no image block runs on) */
    }
    H = r == G4_OK ? (size_t)s->model->config.hidden_size : 0;
    while (r == G4_OK && g4__chunks_next(&ch)) {
        r = g4__step(s, ch.ids, ch.n, ch.out, ch.first);
        if (r == G4_OK && hidden && ch.out) /* s->xn still holds the final norm's rows of this chunk */
            memcpy(hidden + (mode == G4_LOGITS_ALL ? (size_t)ch.done * H : 0), s->xn + (size_t)ch.first * H,
                   sizeof(float) * (size_t)(ch.n - ch.first) * H);
    }
    return r;
}

G4__DEF g4_result g4_forward(g4_session *s, const int32_t *ids, int n, float *logits, int mode) {
    return g4_forward_hidden(s, ids, n, logits, mode, NULL);
}

G4__DEF int32_t g4_argmax(const float *x, int n) {
    int i, best = 0;
    if (!x || n < 1) return -1;
    for (i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

/* -------------------------------------------------- multimodal >>vision */
/* Read next to modeling_gemma4.py: Gemma4VisionModel (patch embedder,
   encoder, pooler), Gemma4MultimodalEmbedder (embed_vision), and
   Gemma4Model.forward's merge of soft tokens into the decoder's rows. First
   the config (Gemma4Config's ids, Gemma4VisionConfig), then the binding of the
   tower's tensors, then the merge (g4_forward_mm), then the tower. */

/* Gemma4Config's token ids and vision_config; use_bidirectional_attention of
   the text config. `text` reads the text config object. */
static g4_result g4__cfg_vision(const g4__cfg *vc, g4_vision_config *v);

static g4_result g4__cfg_multimodal(const g4__cfg *text, g4_config *cfg) {
    static const char *keys[7] = {"image_token_id", "video_token_id", "audio_token_id", "boi_token_id",
                                  "eoi_token_id", "boa_token_id", "eoa_token_index"};
    static const int defs[7] = {258880, 258884, 258881, 255999, 258882, 256000, 258883}; /* Gemma4Config's */
    int *dst[7];
    g4__cfg top = *text;
    int n, i;
    g4_result r;
    dst[0] = &cfg->image_token_id; dst[1] = &cfg->video_token_id; dst[2] = &cfg->audio_token_id;
    dst[3] = &cfg->boi_token_id; dst[4] = &cfg->eoi_token_id; dst[5] = &cfg->boa_token_id; dst[6] = &cfg->eoa_token_id;
    n = g4__jget(text->j, text->obj, "use_bidirectional_attention");
    cfg->bidirectional = n >= 0 && text->j->nodes[n].type == G4__JSTR && g4__jis(&text->j->nodes[n], "vision")
                             ? G4_BIDIR_VISION : G4_BIDIR_NONE; /* (other values were refused before) */
    if (n >= 0 && text->j->nodes[n].type == G4__JSTR && g4__jis(&text->j->nodes[n], "all"))
        cfg->bidirectional = G4_BIDIR_ALL; /* gemma4_unified only (>>unified) */
    for (i = 0; i < 7; i++) *dst[i] = -1;
    memset(&cfg->vision, 0, sizeof cfg->vision);
    if (text->obj == 0 || cfg->assistant) return G4_OK; /* a text-only config: no wrapper */
    top.obj = 0;
    top.scope = "";
    for (i = 0; i < 7; i++) {
        n = g4__jget(top.j, 0, keys[i]);
        if (n >= 0 && top.j->nodes[n].type == G4__JNULL) continue; /* None: no such token */
        /* (an id outside the vocabulary is allowed, as transformers allows it: no row can hold it) */
        if ((r = g4__cfg_int(&top, keys[i], dst[i], defs[i], 0, 0, INT32_MAX)) != G4_OK) return r;
    }
    if (cfg->unified) return G4_OK; /* its vision_config is Gemma4UnifiedVisionConfig: g4__cfg_unified (>>unified) */
    n = g4__jget(top.j, 0, "vision_config");
    if (n < 0 || top.j->nodes[n].type == G4__JNULL) return G4_OK;
    if (top.j->nodes[n].type != G4__JOBJ) {
        g4__seterr(text->err, "%s: field 'vision_config' must be an object", text->name);
        return G4_ERR_CONFIG;
    }
    top.obj = n;
    top.scope = "vision_config.";
    return g4__cfg_vision(&top, &cfg->vision);
}

static g4_result g4__cfg_vision(const g4__cfg *c, g4_vision_config *v) {
    int n;
    g4_result r;
#define G4__TRY(x) do { if ((r = (x)) != G4_OK) return r; } while (0)
    v->present = 1;
    G4__TRY(g4__cfg_int(c, "hidden_size", &v->hidden_size, 768, 0, 1, 1 << 16));
    G4__TRY(g4__cfg_int(c, "intermediate_size", &v->intermediate_size, 3072, 0, 1, 1 << 20));
    G4__TRY(g4__cfg_int(c, "num_hidden_layers", &v->num_hidden_layers, 16, 0, 1, 1024));
    G4__TRY(g4__cfg_int(c, "num_attention_heads", &v->num_attention_heads, 12, 0, 1, 1024));
    G4__TRY(g4__cfg_int(c, "num_key_value_heads", &v->num_key_value_heads, 12, 0, 1, 1024));
    G4__TRY(g4__cfg_int(c, "head_dim", &v->head_dim, 64, 0, 4, 1 << 14));
    G4__TRY(g4__cfg_int(c, "patch_size", &v->patch_size, 16, 0, 1, 1024));
    G4__TRY(g4__cfg_int(c, "pooling_kernel_size", &v->pooling_kernel_size, 3, 0, 1, 64));
    G4__TRY(g4__cfg_int(c, "position_embedding_size", &v->position_embedding_size, 10240, 0, 1, 1 << 20));
    G4__TRY(g4__cfg_float(c, "rms_norm_eps", &v->rms_norm_eps, 1e-6f, 0.0, 1.0));
    G4__TRY(g4__cfg_bool(c, "use_clipped_linears", &v->use_clipped_linears, 0));
    G4__TRY(g4__cfg_bool(c, "standardize", &v->standardize, 0));
    G4__TRY(g4__cfg_expect_str(c, "hidden_activation", "gelu_pytorch_tanh", NULL));
    {
        int bias;
        G4__TRY(g4__cfg_bool(c, "attention_bias", &bias, 0));
        if (bias) {
            g4__seterr(c->err, "%s: field 'vision_config.attention_bias' is true; the Gemma 4 vision tower has no biases", c->name);
            return G4_ERR_CONFIG;
        }
    }
    /* rope_parameters: {"rope_type": "axial" or "default" (which loading turns into axial), "rope_theta"} */
    v->rope_theta = 100.0f;
    n = g4__jget(c->j, c->obj, "rope_parameters");
    if (n >= 0 && c->j->nodes[n].type != G4__JNULL) {
        g4__cfg rc = *c;
        if (c->j->nodes[n].type != G4__JOBJ) {
            g4__seterr(c->err, "%s: field 'vision_config.rope_parameters' must be an object", c->name);
            return G4_ERR_CONFIG;
        }
        rc.obj = n;
        rc.scope = "vision_config.rope_parameters.";
        n = g4__jget(c->j, rc.obj, "rope_type");
        if (n >= 0 && c->j->nodes[n].type == G4__JSTR && !g4__jis(&c->j->nodes[n], "axial") &&
            !g4__jis(&c->j->nodes[n], "default")) {
            g4__seterr(c->err, "%s: vision_config.rope_parameters.rope_type \"%.64s\" is not supported (axial; default "
                       "loads as axial)", c->name, c->j->nodes[n].str);
            return G4_ERR_CONFIG;
        }
        G4__TRY(g4__cfg_expect_str(&rc, "rope_type", "axial", "default"));
        G4__TRY(g4__cfg_float(&rc, "rope_theta", &v->rope_theta, 100.0f, 1e-3, 1e30));
    }
#undef G4__TRY
    if (v->head_dim % 4) { /* apply_multidimensional_rope: two axes, each rotating pairs */
        g4__seterr(c->err, "%s: vision_config.head_dim is %d; the 2-D RoPE needs a multiple of 4", c->name, v->head_dim);
        return G4_ERR_CONFIG;
    }
    if (v->num_attention_heads % v->num_key_value_heads) {
        g4__seterr(c->err, "%s: vision_config.num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                   c->name, v->num_attention_heads, v->num_key_value_heads);
        return G4_ERR_CONFIG;
    }
    if (v->pooling_kernel_size < 2) { /* transformers 5.23 keeps the padding rows and drops the real ones at k = 1 */
        g4__seterr(c->err, "%s: vision_config.pooling_kernel_size is %d; Gemma4VisionModel strips the wrong rows without "
                   "pooling (k = 1), so gemma4.h needs k >= 2", c->name, v->pooling_kernel_size);
        return G4_ERR_CONFIG;
    }
    if ((int64_t)v->num_attention_heads * v->head_dim > (1 << 20) || (int64_t)v->patch_size * v->patch_size * 3 > (1 << 20)) {
        g4__seterr(c->err, "%s: vision_config: num_attention_heads * head_dim or 3 * patch_size^2 is too large", c->name);
        return G4_ERR_CONFIG;
    }
    return G4_OK;
}

/* The tower's tensors (model.vision_tower.*, model.embed_vision.*): all or
   nothing. A checkpoint without them still loads (vision.loaded 0, the reason
   in vision.error); a tensor of the wrong shape or dtype is a load error. */
static g4_result g4__bind_clip(g4_model *m, g4__weight_fn fn, void *user, g4_clippable_linear *cl, const char *name,
                                int64_t out, int64_t in, int clipped) {
    char nm[256];
    int64_t dims[2];
    g4_tensor b;
    g4_result r;
    static const char *bounds[4] = {"input_min", "input_max", "output_min", "output_max"};
    float *dst[4];
    int i;
    dims[0] = out; dims[1] = in;
    snprintf(nm, sizeof nm, "%s.linear.weight", name);
    if ((r = fn(m, user, &cl->linear, nm, 2, dims)) != G4_OK) return r;
    dst[0] = &cl->input_min; dst[1] = &cl->input_max; dst[2] = &cl->output_min; dst[3] = &cl->output_max;
    for (i = 0; i < 4; i++) {
        *dst[i] = i % 2 ? INFINITY : -INFINITY;
        if (!clipped) continue;
        snprintf(nm, sizeof nm, "%s.%s", name, bounds[i]);
        if (!g4__st_find(m, nm)) continue; /* absent: infinite, as transformers initialises a missing buffer */
        if ((r = fn(m, user, &b, nm, 0, dims)) != G4_OK) return r;
        *dst[i] = g4__get(&b, 0);
        if (*dst[i] != *dst[i]) {
            g4__seterr(m->error, "tensor '%s' is NaN", nm);
            return G4_ERR_WEIGHTS;
        }
    }
    return G4_OK;
}

/* Every tensor of the tower, by name and shape, through fn: g4__bind when
   loading (g4__bind_vision), or a caller's (make bench's random tower). A
   clipped linear's bounds are looked up in the checkpoint only. */
static g4_result g4__vision_walk(g4_model *m, g4__weight_fn fn, void *user) {
    const g4_vision_config *v = &m->config.vision;
    g4_vision_weights *w = &m->vision;
    int64_t Hv = v->hidden_size, Dv = v->head_dim, I = v->intermediate_size, dims[3];
    int64_t NHD = (int64_t)v->num_attention_heads * Dv, KVD = (int64_t)v->num_key_value_heads * Dv;
    const char *pre = "model.vision_tower.";
    char nm[256], saved[G4_ERROR_MAX];
    int l, cl = v->use_clipped_linears;
    g4_result r = G4_OK;
    memcpy(saved, m->error, G4_ERROR_MAX);
    if (!(w->layers = (g4_vision_layer *)G4_MALLOC(sizeof(g4_vision_layer) * (size_t)v->num_hidden_layers))) {
        g4__seterr(m->error, "out of memory");
        return G4_ERR_NOMEM;
    }
    memset(w->layers, 0, sizeof(g4_vision_layer) * (size_t)v->num_hidden_layers);
#define G4__V(dst, suffix, nd, a, b, c)                                            \
    do {                                                                          \
        dims[0] = a; dims[1] = b; dims[2] = c;                                    \
        snprintf(nm, sizeof nm, "%s%s", pre, suffix);                             \
        if ((r = fn(m, user, dst, nm, nd, dims)) != G4_OK) goto fail;             \
    } while (0)
    G4__V(&w->input_proj, "patch_embedder.input_proj.weight", 2, Hv, 3 * (int64_t)v->patch_size * v->patch_size, 0);
    G4__V(&w->position_embedding_table, "patch_embedder.position_embedding_table", 3, 2, v->position_embedding_size, Hv);
    for (l = 0; l < v->num_hidden_layers; l++) {
        g4_vision_layer *L = &w->layers[l];
        char lp[160], sfx[224];
        snprintf(lp, sizeof lp, "encoder.layers.%d.", l);
#define G4__VLN(dst, what, n0) do { snprintf(sfx, sizeof sfx, "%s%s", lp, what); G4__V(dst, sfx, 1, n0, 0, 0); } while (0)
#define G4__VC(dst, what, o, i)                                                                         \
        do {                                                                                            \
            snprintf(nm, sizeof nm, "%s%s%s", pre, lp, what);                                           \
            if ((r = g4__bind_clip(m, fn, user, dst, nm, o, i, cl)) != G4_OK) goto fail;                \
        } while (0)
        G4__VLN(&L->input_layernorm, "input_layernorm.weight", Hv);
        G4__VC(&L->q_proj, "self_attn.q_proj", NHD, Hv);
        G4__VC(&L->k_proj, "self_attn.k_proj", KVD, Hv);
        G4__VC(&L->v_proj, "self_attn.v_proj", KVD, Hv);
        G4__VC(&L->o_proj, "self_attn.o_proj", Hv, NHD);
        G4__VLN(&L->q_norm, "self_attn.q_norm.weight", Dv);
        G4__VLN(&L->k_norm, "self_attn.k_norm.weight", Dv);
        G4__VLN(&L->post_attention_layernorm, "post_attention_layernorm.weight", Hv);
        G4__VLN(&L->pre_feedforward_layernorm, "pre_feedforward_layernorm.weight", Hv);
        G4__VC(&L->gate_proj, "mlp.gate_proj", I, Hv);
        G4__VC(&L->up_proj, "mlp.up_proj", I, Hv);
        G4__VC(&L->down_proj, "mlp.down_proj", Hv, I);
        G4__VLN(&L->post_feedforward_layernorm, "post_feedforward_layernorm.weight", Hv);
#undef G4__VLN
#undef G4__VC
    }
    if (v->standardize) {
        G4__V(&w->std_bias, "std_bias", 1, Hv, 0, 0);
        G4__V(&w->std_scale, "std_scale", 1, Hv, 0, 0);
    }
    pre = "model.";
    G4__V(&w->embedding_projection, "embed_vision.embedding_projection.weight", 2, m->config.hidden_size, Hv, 0);
#undef G4__V
    w->loaded = 1;
    memcpy(m->error, saved, G4_ERROR_MAX);
    return G4_OK;
fail:
    G4_FREE(w->layers);
    w->layers = NULL;
    memcpy(w->error, m->error, G4_ERROR_MAX);
    return r;
}

static g4_result g4__bind_vision(g4_model *m) {
    char nm[256];
    if (!m->config.vision.present) { g4__seterr(m->vision.error, "config.json has no vision_config"); return G4_OK; }
    snprintf(nm, sizeof nm, "model.vision_tower.patch_embedder.input_proj.weight");
    if (!g4__st_find(m, nm)) { g4__seterr(m->vision.error, "checkpoint has no vision tower (no tensor '%s')", nm); return G4_OK; }
    return g4__vision_walk(m, g4__bind, NULL);
}

/* ---- the merge into the decoder (Gemma4Model.forward) */

G4__DEF int g4_mm_type(const g4_config *c, int32_t id) {
    if (!c || id < 0) return G4_MM_TEXT;
    if (id == c->image_token_id) return G4_MM_IMAGE;
    if (id == c->video_token_id) return G4_MM_VIDEO;
    if (id == c->audio_token_id) return G4_MM_AUDIO;
    return G4_MM_TEXT;
}

/* get_block_sequence_ids_for_mask: image and video rows form blocks */
static int g4__mm_block(const g4_config *c, int32_t id) {
    int t = g4_mm_type(c, id);
    return c->bidirectional == G4_BIDIR_VISION && (t == G4_MM_IMAGE || t == G4_MM_VIDEO);
}

/* Before the step's embedding: s->mm_ids = ids with every placeholder as
   pad_token_id (llm_input_ids), and each row's attention bound s->mm_hi (its own
   position, or its block's last on sliding layers). Returns the ids to embed. */
static const int32_t *g4__mm_ids(g4_session *s, const int32_t *ids, int n) {
    const g4_config *c = &s->model->config;
    int t, e, b;
    if (!s->mm_active) return ids;
    for (t = 0; t < n; t++) s->mm_ids[t] = g4_mm_type(c, ids[t]) != G4_MM_TEXT ? c->pad_token_id : ids[t];
    for (t = 0; t < n; t = e) { /* blocks end inside the step (g4__mm_chunk) */
        e = t + 1;
        if (!g4__mm_block(c, ids[t])) { s->mm_lo[t] = s->mm_hi[t] = s->pos + t; continue; }
        while (e < n && g4__mm_block(c, ids[e])) e++;
        for (b = t; t < e; t++) {
            s->mm_lo[t] = s->pos + b;
            s->mm_hi[t] = s->pos + e - 1;
        }
    }
    return s->mm_ids;
}

/* inputs_embeds.masked_scatter(mask, soft): the placeholder rows of s->x take
   the next soft tokens, unscaled (cast to the activation dtype) */
static void g4__mm_merge(g4_session *s, const int32_t *ids, int n) {
    const g4_config *c = &s->model->config;
    size_t H = (size_t)c->hidden_size, j;
    int t;
    if (!s->mm_active) return;
    for (t = 0; t < n; t++) {
        if (g4_mm_type(c, ids[t]) == G4_MM_TEXT) continue;
        for (j = 0; j < H; j++) s->x[(size_t)t * H + j] = g4__act(s->mm_soft[j], s->cfg.bf16);
        s->mm_soft += H;
    }
    g4__tap(s, -1, G4__TAP_INPUTS_EMBEDS, s->x, n, (int)H);
}

/* The attention's keys [*lo, *hi] for query row t at position p of a layer of
   type `type` (in: the causal, windowed range). Gemma 4 (create_masks_for_vision_model):
   sliding layers only, AND(window, OR(causal, block)): hi reaches the block's
   last row. gemma4_unified (create_masks_for_generate with block_sequence_ids):
   every layer, OR(AND(causal, window), block): the whole block, even past the
   window (>>unified). */
static void g4__mm_range(const g4_session *s, int type, int t, int p, int *lo, int *hi) {
    if (!s->mm_active) return;
    if (s->model->config.unified) {
        if (s->mm_lo[t] < *lo) *lo = s->mm_lo[t];
        if (s->mm_hi[t] > *hi) *hi = s->mm_hi[t];
    } else if (type == G4_SLIDING && s->mm_hi[t] > p) {
        *hi = s->mm_hi[t];
    }
}

/* A chunk of n rows from ids[0..]: shortened so that no block straddles its
   end. 0: a block starting at ids[0] is longer than the chunk can be. */
static int g4__mm_chunk(const g4_config *c, const int32_t *ids, int n, int left) {
    int b;
    if (n >= left || !g4__mm_block(c, ids[n - 1]) || !g4__mm_block(c, ids[n])) return n;
    for (b = n - 1; b > 0 && g4__mm_block(c, ids[b - 1]); b--) {}
    return b;
}

G4__DEF g4_result g4_forward_mm(g4_session *s, const int32_t *ids, int n, const float *soft, int n_soft, float *logits,
                                int mode, float *hidden) {
    const g4_config *c;
    g4__chunks ch;
    int t, placeholders = 0;
    g4_result r;
    size_t H;
    if (!s) return G4_ERR_INPUT;
    if (!s->model || !s->slots || s->drafter.target) return g4_forward_hidden(s, ids, n, logits, mode, hidden); /* its errors */
    c = &s->model->config;
    if (!s->mm_ids) {
        g4__seterr(s->error, "the model's config has no multimodal token ids (a text-only config): use g4_forward");
        return G4_ERR_INPUT;
    }
    if (n_soft < 0 || (n_soft > 0 && !soft)) {
        g4__seterr(s->error, "soft tokens: %d rows at %s", n_soft, soft ? "a buffer" : "NULL");
        return G4_ERR_INPUT;
    }
    if ((r = g4__chunks_begin(&ch, c, s->pos, &s->cfg, ids, n, logits, mode, s->error)) != G4_OK) return r;
    if (hidden && mode == G4_LOGITS_NONE) {
        g4__seterr(s->error, "hidden rows follow the logits rows: mode NONE has none");
        return G4_ERR_INPUT;
    }
    for (t = 0; t < n; t++) placeholders += g4_mm_type(c, ids[t]) != G4_MM_TEXT;
    if (placeholders != n_soft) {
        g4__seterr(s->error, "the ids hold %d placeholder rows (image %d, video %d, audio %d ids) but %d soft tokens were given",
                   placeholders, c->image_token_id, c->video_token_id, c->audio_token_id, n_soft);
        return G4_ERR_INPUT;
    }
    if (s->mm_open && g4__mm_block(c, ids[0])) {
        g4__seterr(s->error, "this call starts inside the image block the previous call ended in: bidirectional attention "
                   "needs a whole image in one call");
        return G4_ERR_INPUT;
    }
    s->fwd_end = s->pos + n;
    s->fwd_n = n;
    s->mm_active = 1;
    s->mm_soft = soft;
    H = (size_t)c->hidden_size;
    while (r == G4_OK && g4__chunks_next(&ch)) {
        int m = g4__mm_chunk(c, ch.ids, ch.n, ch.total - ch.done);
        if (m == 0) {
            int e = 0;
            while (ch.done + e < n && g4__mm_block(c, ch.ids[e])) e++;
            g4__seterr(s->error, "an image block of %d rows at row %d is longer than max_chunk (%d): bidirectional attention "
                       "needs it in one step", e, ch.done, s->cfg.max_chunk);
            r = G4_ERR_INPUT;
            break;
        }
        if (m < ch.n) { /* end the chunk before the block; the next one starts there */
            ch.n = m;
            ch.first = 0;
            if (mode == G4_LOGITS_LAST) ch.out = NULL;
        }
        r = g4__step(s, ch.ids, ch.n, ch.out, ch.first);
        if (r == G4_OK && hidden && ch.out)
            memcpy(hidden + (mode == G4_LOGITS_ALL ? (size_t)ch.done * H : 0), s->xn + (size_t)ch.first * H,
                   sizeof(float) * (size_t)(ch.n - ch.first) * H);
        if (r == G4_OK) s->mm_open = g4__mm_block(c, ch.ids[ch.n - 1]);
    }
    s->mm_active = 0;
    s->mm_soft = NULL;
    return r;
}

/* ---- the tower (Gemma4VisionModel, embed_vision) */

#ifndef G4_VISION_QBLOCK
#define G4_VISION_QBLOCK 128 /* queries per block of the GEMM attention (g4__vattn_gemm) */
#endif

static void g4__vcarve(g4_vision_session *vs, const g4_model *m, const g4_vision_session_config *cfg, g4__carver *cv) {
    const g4_vision_config *v = &m->config.vision;
    uint64_t n = (uint64_t)cfg->max_patches, Hv = (uint64_t)v->hidden_size, I = (uint64_t)v->intermediate_size;
    uint64_t NHD = (uint64_t)v->num_attention_heads * (uint64_t)v->head_dim;
    uint64_t KVD = (uint64_t)v->num_key_value_heads * (uint64_t)v->head_dim, widest = Hv;
    int threads = g4_pool_threads(cfg->pool);
    if (NHD > widest) widest = NHD;
    if (I > widest) widest = I;
    if ((uint64_t)m->config.hidden_size > widest) widest = (uint64_t)m->config.hidden_size;
    if (3 * (uint64_t)v->patch_size * (uint64_t)v->patch_size > widest) widest = 3 * (uint64_t)v->patch_size * (uint64_t)v->patch_size;
    vs->x = g4__take(cv, n * Hv, sizeof(float));
    vs->xn = g4__take(cv, n * Hv, sizeof(float));
    vs->cin = g4__take(cv, n * widest, sizeof(float));
    vs->q = g4__take(cv, n * NHD, sizeof(float));
    vs->att = g4__take(cv, n * NHD, sizeof(float));
    vs->k = g4__take(cv, n * KVD, sizeof(float));
    vs->v = g4__take(cv, n * KVD, sizeof(float));
    vs->gate = g4__take(cv, n * I, sizeof(float));
    vs->up = g4__take(cv, n * I, sizeof(float));
    vs->scores = g4__take(cv, (uint64_t)(threads > G4_VISION_QBLOCK ? threads : G4_VISION_QBLOCK) * n, sizeof(float));
    vs->pooled = g4__take(cv, n * Hv, sizeof(float));
    vs->inv_freq = g4__take(cv, (uint64_t)v->head_dim / 4, sizeof(float));
    vs->kernel = (int *)(void *)g4__take(cv, n, sizeof(int));
    vs->mm.pack_parts = threads;
    vs->mm.pack = g4__take(cv, (uint64_t)threads * g4__pack_thread_floats(), sizeof(float));
    vs->mm.lora_u = g4__take(cv, n * (uint64_t)m->lora_rmax, sizeof(float)); /* a LoRA adapter's A x (>>adapter) */
    vs->lora_rmax = m->lora_rmax;
}

static g4_result g4__vcheck(const g4_model *m, const g4_vision_session_config *cfg, char *err) {
    const g4_vision_config *v;
    if (!m || !cfg) { g4__seterr(err, "NULL model or config"); return G4_ERR_INPUT; }
    v = &m->config.vision;
    if (!m->vision.loaded) { g4__seterr(err, "no vision tower: %s", m->vision.error); return G4_ERR_INPUT; }
    if (cfg->max_patches < 1 || cfg->max_patches > (1 << 20) || cfg->max_patches % (v->pooling_kernel_size * v->pooling_kernel_size)) {
        g4__seterr(err, "vision max_patches %d must be in [1, 2^20] and a multiple of pooling_kernel_size^2 (%d)",
                   cfg->max_patches, v->pooling_kernel_size * v->pooling_kernel_size);
        return G4_ERR_INPUT;
    }
    return G4_OK;
}

G4__DEF g4_result g4_vision_session_size(const g4_model *m, const g4_vision_session_config *cfg, size_t *bytes) {
    g4_vision_session tmp;
    g4__carver cv;
    g4_result r;
    if (!bytes) return G4_ERR_INPUT;
    *bytes = 0;
    if ((r = g4__vcheck(m, cfg, tmp.error)) != G4_OK) return r;
    memset(&tmp, 0, sizeof tmp);
    memset(&cv, 0, sizeof cv);
    g4__vcarve(&tmp, m, cfg, &cv);
    if (cv.overflow || cv.off + 64 > (uint64_t)(size_t)-1) return G4_ERR_ARENA;
    *bytes = (size_t)cv.off + 64;
    return G4_OK;
}

G4__DEF g4_result g4_vision_session_init(g4_vision_session *vs, const g4_model *m, const g4_vision_session_config *cfg,
                                         void *arena, size_t arena_bytes) {
    size_t need;
    g4__carver cv;
    g4_result r;
    const g4_vision_config *v;
    int j;
    if (!vs) return G4_ERR_INPUT;
    memset(vs, 0, sizeof *vs);
    if ((r = g4__vcheck(m, cfg, vs->error)) != G4_OK) return r;
    if ((r = g4_vision_session_size(m, cfg, &need)) != G4_OK) { g4__seterr(vs->error, "vision arena size overflows"); return r; }
    if (!arena || arena_bytes < need || ((uintptr_t)arena & 15)) {
        g4__seterr(vs->error, "vision arena: %zu bytes at %p, need %zu bytes, 16-byte aligned", arena_bytes, arena, need);
        return G4_ERR_ARENA;
    }
    memset(&cv, 0, sizeof cv);
    cv.base = (unsigned char *)(((uintptr_t)arena + 63) & ~(uintptr_t)63);
    cv.poison = 1;
    vs->model = m;
    vs->cfg = *cfg;
    g4__vcarve(vs, m, cfg, &cv);
    /* the decoder's matmul reads only these of its session */
    vs->mm.model = m;
    vs->mm.cfg = g4_session_config_init();
    vs->mm.cfg.pool = cfg->pool;
    vs->mm.cfg.bf16 = cfg->bf16; /* its matmul then sums in torch's bf16 order and rounds (>>kernels) */
    v = &m->config.vision;
    /* Gemma4VisionRotaryEmbedding.compute_axial_rope_parameters: 1 / theta^(2j / (Dv/2)) */
    for (j = 0; j < v->head_dim / 4; j++)
        vs->inv_freq[j] = 1.0f / powf(v->rope_theta, (float)(2 * j) / (float)(v->head_dim / 2));
    return G4_OK;
}

static void g4__vtap(const g4_vision_session *vs, int layer, const char *what, const float *data, int rows, int cols) {
    char name[128];
    if (!vs->cfg.tap) return;
    if (layer < 0) snprintf(name, sizeof name, "%s", what);
    else if (!*what) snprintf(name, sizeof name, "vision_tower.encoder.layers.%d", layer);
    else snprintf(name, sizeof name, "vision_tower.encoder.layers.%d.%s", layer, what);
    vs->cfg.tap(vs->cfg.tap_user, name, layer, data, rows, cols, 0);
}

/* bf16 mode: x[0, n) cast to bf16 (the dtype of every tensor a bf16 tower
   op writes); float32 mode: nothing */
static void g4__vcast(const g4_vision_session *vs, float *x, size_t n) {
    if (vs->cfg.bf16) g4__bf16_round_range(x, 0, n);
}

/* Gemma4ClippableLinear: clamp(linear(clamp(x, input_min, input_max)), output_min, output_max) */
static void g4__clip_linear(g4_vision_session *vs, float *y, const float *x, const g4_clippable_linear *cl, int n) {
    size_t in = (size_t)cl->linear.shape[1], out = (size_t)cl->linear.shape[0], i;
    const float *src = x;
    if (vs->model->config.vision.use_clipped_linears) {
        for (i = 0; i < (size_t)n * in; i++)
            vs->cin[i] = x[i] < cl->input_min ? cl->input_min : x[i] > cl->input_max ? cl->input_max : x[i];
        src = vs->cin;
    }
    g4__matmul(&vs->mm, y, src, &cl->linear, n);
    if (vs->model->config.vision.use_clipped_linears)
        for (i = 0; i < (size_t)n * out; i++)
            y[i] = y[i] < cl->output_min ? cl->output_min : y[i] > cl->output_max ? cl->output_max : y[i];
}

/* Gemma4RMSNorm over rows of `width` (w NULL: with_scale False), cast */
static void g4__vnorm(const g4_vision_session *vs, float *y, const float *x, const g4_tensor *w, int rows, int width) {
    int r;
    for (r = 0; r < rows; r++)
        g4__rmsnorm(y + (size_t)r * (size_t)width, x + (size_t)r * (size_t)width, w, width, vs->model->config.vision.rms_norm_eps);
    g4__vcast(vs, y, (size_t)rows * (size_t)width);
}

/* h = h + post_norm(out): a sublayer's output vs->xn through its post norm (tapped as
   `name`) added to the residual vs->x, cast */
static void g4__vresidual(const g4_vision_session *vs, int l, const g4_tensor *post_norm, const char *name, int n) {
    int Hv = vs->model->config.vision.hidden_size;
    size_t i, nh = (size_t)n * (size_t)Hv;
    g4__vnorm(vs, vs->xn, vs->xn, post_norm, n, Hv);
    g4__vtap(vs, l, name, vs->xn, n, Hv);
    for (i = 0; i < nh; i++) vs->x[i] += vs->xn[i];
    g4__vcast(vs, vs->x, nh);
}

/* apply_multidimensional_rope on one head x [Dv] at patch position (px, py):
   the first Dv/2 channels turn by px, the rest by py, each half as
   apply_rotary_pos_emb (rotate_half) with cos/sin of pos * inv_freq
   (bf16: cos, sin, each product and the sum rounded, g4__rope_pair) */
static void g4__vrope(float *x, const float *inv_freq, int D, int px, int py, int bf16) {
    int part, j, h = D / 4;
    for (part = 0; part < 2; part++) {
        float *xp = x + part * (D / 2);
        float pos = (float)(part ? py : px);
        for (j = 0; j < h; j++) {
            float f = pos * inv_freq[j];
            g4__rope_pair(xp, j, h, cosf(f), sinf(f), bf16);
        }
    }
}

/* Gemma4VisionAttention's eager attention (scaling 1.0): every query over the
   real patches' keys (padding keys masked); split across threads by query */
typedef struct { g4_vision_session *vs; const int32_t *pos; int n, real; } g4__vattn_job;

/* The bf16 mode's attention, eager_attention_forward in bfloat16 as torch
   runs it on the CPU, for queries [t0, t1) of one thread (any layout):
     scores = q . k over all n keys, summed as torch's bmm sums them (its naive
              loop in order when D n n < 400, else g4__dot_torch), cast; the
              padding keys get the mask's bf16 minimum, so exp gives 0 there
     p = torch's float32 softmax over the n entries (g4__softmax_torch: the
         lanes go by key position, the masked ones add 0), cast
     out = p @ v as cpublas' gemm_notrans_ (the naive loop: in order): 4
           partial sums by key position, then ((0 + 1) + 2) + 3, cast
   the orders of the decoder's g4__attend_torch, over keys any patch may mask. */
static void g4__vattn_torch(const g4__vattn_job *j, float *sc, int t0, int t1) {
    const g4_vision_config *v = &j->vs->model->config.vision;
    const g4_vision_session *vs = j->vs;
    int D = v->head_dim, NH = v->num_attention_heads, KVH = v->num_key_value_heads, n = j->n, t, h, k, d;
    int naive = (int64_t)D * n * n < 400, tail4 = naive ? 0 : n & ~3;
    for (t = t0; t < t1; t++)
        for (h = 0; h < NH; h++) {
            const float *q = vs->q + ((size_t)t * NH + h) * D;
            float *out = vs->att + ((size_t)t * NH + h) * D;
            int kvh = h / (NH / KVH);
            for (k = 0; k < n; k++) {
                const float *key = vs->k + ((size_t)k * KVH + kvh) * D;
                if (j->pos[2 * k] == -1 && j->pos[2 * k + 1] == -1) sc[k] = -INFINITY;
                else sc[k] = g4__bf16_round(naive ? g4__dot_ref(q, key, D) : g4__dot_torch(q, key, D));
            }
            g4__softmax_torch(sc, n, 0, n);
            for (k = 0; k < n; k++) sc[k] = g4__bf16_round(sc[k]);
            for (d = 0; d < D; d++) {
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (k = 0; k < n; k++) part[k < tail4 ? k % 4 : 0] += sc[k] * vs->v[((size_t)k * KVH + kvh) * D + d];
                out[d] = g4__bf16_round(((part[0] + part[1]) + part[2]) + part[3]);
            }
        }
}


static void g4__vattn_part(void *ctx, int part, int n_parts) {
    const g4__vattn_job *j = (const g4__vattn_job *)ctx;
    g4_vision_session *vs = j->vs;
    const g4_vision_config *v = &vs->model->config.vision;
    int D = v->head_dim, NH = v->num_attention_heads, KVH = v->num_key_value_heads, n = j->n, t, h, k, d;
    int t0 = (int)((int64_t)n * part / n_parts), t1 = (int)((int64_t)n * (part + 1) / n_parts);
    float *sc = vs->scores + (size_t)part * (size_t)vs->cfg.max_patches;
    if (vs->cfg.bf16 && j->real <= 0) { g4__vattn_torch(j, sc, t0, t1); return; }
    if (j->real > 0) { /* the real patches first, the padding after (as the processor lays them out): the
                          decoder's attention over keys [0, real) of a slot that is this layer's K/V; bf16:
                          its g4__attend_torch over n positions, g4__vattn_torch's orders vectorized (the
                          masked keys' exact zeros left out: the same bits, but for the sign of an output
                          that is exactly 0) */
        g4_kv_slot sl;
        memset(&sl, 0, sizeof sl);
        sl.kv_heads = KVH; sl.head_dim = D; sl.capacity = n; sl.n_pos = n; sl.k = vs->k; sl.v = vs->v;
        for (t = t0; t < t1; t++)
            for (h = 0; h < NH; h++) {
                float *out = vs->att + ((size_t)t * NH + h) * D;
                const float *q = vs->q + ((size_t)t * NH + h) * D;
                if (vs->cfg.bf16) g4__attend_torch(out, q, &sl, h / (NH / KVH), 0, j->real - 1, sc, n, n);
                else g4__attend_blocked(out, q, 1, &sl, h / (NH / KVH), 0, j->real - 1, sc, 0);
            }
        return;
    }
    for (t = t0; t < t1; t++) /* any other layout: every key, padding masked */
        for (h = 0; h < NH; h++) {
            const float *q = vs->q + ((size_t)t * NH + h) * D;
            float *out = vs->att + ((size_t)t * NH + h) * D, mx = -INFINITY, sum = 0.0f;
            int kvh = h / (NH / KVH);
            for (k = 0; k < n; k++) {
                const float *key = vs->k + ((size_t)k * KVH + kvh) * D;
                float acc;
                if (j->pos[2 * k] == -1 && j->pos[2 * k + 1] == -1) { sc[k] = -INFINITY; continue; }
                sc[k] = acc = g4__dot(q, key, D); /* (the decoder's SIMD dot) */
                if (acc > mx) mx = acc;
            }
            for (k = 0; k < n; k++) { sc[k] = sc[k] == -INFINITY ? 0.0f : expf(sc[k] - mx); sum += sc[k]; }
            for (d = 0; d < D; d++) out[d] = 0.0f;
            for (k = 0; k < n; k++) {
                const float *val = vs->v + ((size_t)k * KVH + kvh) * D;
                if (sc[k] == 0.0f) continue;
                g4__axpy(out, sc[k] / sum, val, D);
            }
        }
}

/* The attention the tower runs when the padding patches come last (as the
   processor lays them out): per head, blocks of G4_VISION_QBLOCK queries
   against the `real` keys on the decoder's packed GEMM (g4__bwd_mm, threaded
   over its columns):
     scores = Q K^T        each score summed as g4__dot sums it (VL lane FMA
                           chains, their horizontal sum, the tail): the same
                           bits as the reference's
     p = softmax(scores)   g4__softmax_n: g4__softmax's bits, its exps in SIMD
     out = p V             the GEMM's order: VL lane FMA chains over the keys,
                           not the reference's key-by-key sum from zero, so
                           out differs from g4__vattn_part's by float32
                           rounding (tests/test_vision.c bounds it: 2e-6 of
                           max |out| on the goldens and on random heads).
   g4__vattn_part stays the reference and runs any other layout. */
typedef struct { float *s; int real; } g4__vsm_job;
static void g4__vsoftmax_rows(void *ctx, size_t r0, size_t r1) {
    const g4__vsm_job *j = (const g4__vsm_job *)ctx;
    size_t r;
    for (r = r0; r < r1; r++) g4__softmax_n(j->s + r * (size_t)j->real, j->real);
}

static void g4__vattn_gemm(g4_vision_session *vs, int n, int real) {
    const g4_vision_config *v = &vs->model->config.vision;
    int D = v->head_dim, NH = v->num_attention_heads, KVH = v->num_key_value_heads, h, t0, t;
    size_t NHD = (size_t)NH * (size_t)D, KVD = (size_t)KVH * (size_t)D;
    g4__vsm_job sj;
    sj.s = vs->scores;
    sj.real = real;
    for (h = 0; h < NH; h++) {
        size_t kv = (size_t)(h / (NH / KVH)) * (size_t)D;
        for (t0 = 0; t0 < n; t0 += G4_VISION_QBLOCK) {
            int m = n - t0 < G4_VISION_QBLOCK ? n - t0 : G4_VISION_QBLOCK;
            float *out = vs->att + (size_t)t0 * NHD + (size_t)h * (size_t)D;
            memset(vs->scores, 0, sizeof(float) * (size_t)m * (size_t)real);
            g4__bwd_mm(&vs->mm, vs->scores, (size_t)real, vs->q + (size_t)t0 * NHD + (size_t)h * (size_t)D, NHD,
                       (const unsigned char *)(vs->k + kv), G4_F32, KVD, 0, D, m, real);
            g4__parallel_range(&vs->mm, (size_t)m, (size_t)real * 8, g4__vsoftmax_rows, &sj);
            for (t = 0; t < m; t++) memset(out + (size_t)t * NHD, 0, sizeof(float) * (size_t)D);
            g4__bwd_mm(&vs->mm, out, NHD, vs->scores, (size_t)real, (const unsigned char *)(vs->v + kv), G4_F32, KVD, 1, real, m, D);
        }
    }
}

/* Gemma4VisionEncoderLayer l on vs->x (n patches; frame `frame` of a batch of
   `frames` images, which only the bf16 mode's gelu sees) */
static void g4__vlayer(g4_vision_session *vs, int l, const int32_t *pos, int n, int frame, int frames) {
    const g4_vision_config *v = &vs->model->config.vision;
    const g4_vision_layer *L = &vs->model->vision.layers[l];
    int Hv = v->hidden_size, D = v->head_dim, NH = v->num_attention_heads, KVH = v->num_key_value_heads, I = v->intermediate_size;
    size_t i;
    int t, h, bf = vs->cfg.bf16;
    g4__vattn_job aj;

    /* 1. h = x + post_attention_layernorm(self_attn(input_layernorm(x))) */
    g4__vnorm(vs, vs->xn, vs->x, &L->input_layernorm, n, Hv);
    g4__vtap(vs, l, "input_layernorm", vs->xn, n, Hv);
    g4__clip_linear(vs, vs->q, vs->xn, &L->q_proj, n);
    g4__vtap(vs, l, "self_attn.q_proj", vs->q, n, NH * D);
    g4__clip_linear(vs, vs->k, vs->xn, &L->k_proj, n);
    g4__vtap(vs, l, "self_attn.k_proj", vs->k, n, KVH * D);
    g4__clip_linear(vs, vs->v, vs->xn, &L->v_proj, n);
    g4__vtap(vs, l, "self_attn.v_proj", vs->v, n, KVH * D);
    for (t = 0; t < n; t++) { /* q_norm, k_norm, RoPE by (x, y); v_norm (weightless) */
        for (h = 0; h < NH; h++) {
            float *q = vs->q + ((size_t)t * NH + h) * D;
            g4__rmsnorm(q, q, &L->q_norm, D, v->rms_norm_eps);
            g4__vcast(vs, q, (size_t)D);
            g4__vrope(q, vs->inv_freq, D, pos[2 * t], pos[2 * t + 1], bf);
        }
        for (h = 0; h < KVH; h++) {
            float *k = vs->k + ((size_t)t * KVH + h) * D, *vv = vs->v + ((size_t)t * KVH + h) * D;
            g4__rmsnorm(k, k, &L->k_norm, D, v->rms_norm_eps);
            g4__vcast(vs, k, (size_t)D);
            g4__vrope(k, vs->inv_freq, D, pos[2 * t], pos[2 * t + 1], bf);
            g4__rmsnorm(vv, vv, NULL, D, v->rms_norm_eps);
            g4__vcast(vs, vv, (size_t)D);
        }
    }
    aj.vs = vs; aj.pos = pos; aj.n = n;
    for (aj.real = 0; aj.real < n && !(pos[2 * aj.real] == -1 && pos[2 * aj.real + 1] == -1); aj.real++) {}
    for (t = aj.real; t < n; t++) /* real patches after padding: the general loop */
        if (!(pos[2 * t] == -1 && pos[2 * t + 1] == -1)) aj.real = 0;
    if (aj.real > 0 && !bf) g4__vattn_gemm(vs, n, aj.real);
    else g4__parallel(vs->cfg.pool, g4__vattn_part, &aj);
    g4__clip_linear(vs, vs->xn, vs->att, &L->o_proj, n);
    g4__vtap(vs, l, "self_attn", vs->xn, n, Hv);
    g4__vresidual(vs, l, &L->post_attention_layernorm, "post_attention_layernorm", n);

    /* 2. h = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))),
          mlp = down_proj(gelu_tanh(gate_proj(x)) * up_proj(x)) */
    g4__vnorm(vs, vs->xn, vs->x, &L->pre_feedforward_layernorm, n, Hv);
    g4__vtap(vs, l, "pre_feedforward_layernorm", vs->xn, n, Hv);
    g4__clip_linear(vs, vs->gate, vs->xn, &L->gate_proj, n);
    g4__vtap(vs, l, "mlp.gate_proj", vs->gate, n, I);
    g4__clip_linear(vs, vs->up, vs->xn, &L->up_proj, n);
    g4__vtap(vs, l, "mlp.up_proj", vs->up, n, I);
    if (bf) { /* torch's bf16 gelu: the place of an element in the batch's [frames][n][I] tensor picks its path */
        size_t nI = (size_t)n * (size_t)I;
        g4__gelu_torch_n(vs->gate, vs->gate, nI, (size_t)frame * nI, (size_t)frames * nI);
        g4__vcast(vs, vs->gate, nI);
    } else g4__gelu_n(vs->gate, vs->gate, (size_t)n * (size_t)I);
    for (i = 0; i < (size_t)n * (size_t)I; i++) vs->gate[i] *= vs->up[i];
    g4__vcast(vs, vs->gate, (size_t)n * (size_t)I);
    g4__clip_linear(vs, vs->xn, vs->gate, &L->down_proj, n);
    g4__vtap(vs, l, "mlp", vs->xn, n, Hv);
    g4__vresidual(vs, l, &L->post_feedforward_layernorm, "post_feedforward_layernorm", n);
    g4__vtap(vs, l, "", vs->x, n, Hv);
}

/* g4_vision_encode on frame `frame` of a batch of `frames` same-sized images
   (get_video_features' one tower call; an image alone is frame 0 of 1) */
static g4_result g4__vision_encode(g4_vision_session *vs, const float *pixel_values, const int32_t *positions, int n_patches,
                                   float *soft, int *n_soft, int frame, int frames) {
    const g4_model *m;
    const g4_vision_config *v;
    const g4_vision_weights *w;
    int n = n_patches, Hv, H, K, kk, length, t, j, l, max_x = 0, real = 0, out;
    size_t P, i;
    float inv_k2, root;
    if (!vs) return G4_ERR_INPUT;
    if (n_soft) *n_soft = 0;
    if (!vs->model) { g4__seterr(vs->error, "vision session is not initialised"); return G4_ERR_INPUT; }
    m = vs->model; v = &m->config.vision; w = &m->vision;
    if (m->lora_rmax > vs->lora_rmax) {
        g4__seterr(vs->error, "the model's LoRA adapter (rank %d) was loaded after this vision session was made: make it again",
                   m->lora_rmax);
        return G4_ERR_INPUT;
    }
    Hv = v->hidden_size; H = m->config.hidden_size; K = v->pooling_kernel_size; kk = K * K;
    P = (size_t)3 * (size_t)v->patch_size * (size_t)v->patch_size;
    if (!pixel_values || !positions || !soft || !n_soft) {
        g4__seterr(vs->error, "g4_vision_encode: NULL pixel_values, positions, soft or n_soft");
        return G4_ERR_INPUT;
    }
    if (n < 1 || n > vs->cfg.max_patches || n % kk) {
        g4__seterr(vs->error, "%d patches: need 1 .. max_patches (%d) and a multiple of pooling_kernel_size^2 (%d)", n,
                   vs->cfg.max_patches, kk);
        return G4_ERR_INPUT;
    }
    for (t = 0; t < n; t++) { /* (x, y) in the position table, or (-1, -1) for padding */
        int32_t px = positions[2 * t], py = positions[2 * t + 1];
        if (px == -1 && py == -1) continue;
        if (px < 0 || py < 0 || px >= v->position_embedding_size || py >= v->position_embedding_size) {
            g4__seterr(vs->error, "patch %d has position (%ld, %ld): outside [0, %d) (or (-1, -1) for padding)", t, (long)px,
                       (long)py, v->position_embedding_size);
            return G4_ERR_INPUT;
        }
        if (px > max_x) max_x = px;
        real++;
    }
    if (!real) { g4__seterr(vs->error, "every one of the %d patches is padding", n); return G4_ERR_INPUT; }
    for (i = 0; i < (size_t)n * P; i++)
        if (!(pixel_values[i] == pixel_values[i]) || pixel_values[i] > 1e30f || pixel_values[i] < -1e30f) {
            g4__seterr(vs->error, "pixel value %zu is not finite", i);
            return G4_ERR_INPUT;
        }

    /* Gemma4VisionPatchEmbedder: input_proj(2 (x - 0.5)) + table[0][px] + table[1][py] (0 for padding) */
    for (i = 0; i < (size_t)n * P; i++) vs->cin[i] = 2.0f * (pixel_values[i] - 0.5f);
    g4__vcast(vs, vs->cin, (size_t)n * P); /* (pixel_values.to(input_proj's dtype)) */
    g4__matmul(&vs->mm, vs->x, vs->cin, &w->input_proj, n);
    for (t = 0; t < n; t++) {
        int32_t px = positions[2 * t], py = positions[2 * t + 1];
        if (px == -1 && py == -1) continue;
        for (j = 0; j < Hv; j++) {
            float pe = g4__get(&w->position_embedding_table, (size_t)px * Hv + j) +
                       g4__get(&w->position_embedding_table, ((size_t)v->position_embedding_size + py) * Hv + j);
            vs->x[(size_t)t * Hv + j] += vs->cfg.bf16 ? g4__bf16_round(pe) : pe;
        }
    }
    g4__vcast(vs, vs->x, (size_t)n * (size_t)Hv);
    g4__vtap(vs, -1, "vision_tower.patch_embedder", vs->x, n, Hv);

    /* Gemma4VisionEncoder */
    for (l = 0; l < v->num_hidden_layers; l++) g4__vlayer(vs, l, positions, n, frame, frames);

    /* Gemma4VisionPooler: padding zeroed; the mean of each k x k block of
       positions (block bx + (max_x + 1) / k * by), in float32 (cast: bf16
       mode), * sqrt(Hv) in float32 */
    length = n / kk;
    inv_k2 = 1.0f / (float)kk;
    root = (float)sqrt((double)Hv);
    for (t = 0; t < n; t++) {
        int32_t px = positions[2 * t] < 0 ? 0 : positions[2 * t], py = positions[2 * t + 1] < 0 ? 0 : positions[2 * t + 1];
        int idx = px / K + (max_x + 1) / K * (py / K);
        if (idx >= length) {
            g4__seterr(vs->error, "patch %d at (%ld, %ld) pools into soft token %d of %d: the patches do not form the "
                       "processor's grid", t, (long)px, (long)py, idx, length);
            return G4_ERR_INPUT;
        }
        vs->kernel[t] = idx;
    }
    memset(vs->pooled, 0, sizeof(float) * (size_t)length * (size_t)Hv);
    for (t = 0; t < n; t++) {
        int pad = positions[2 * t] == -1 && positions[2 * t + 1] == -1;
        float *dst = vs->pooled + (size_t)vs->kernel[t] * Hv;
        for (j = 0; j < Hv; j++) dst[j] += (pad ? 0.0f : vs->x[(size_t)t * Hv + j]) * inv_k2;
    }
    g4__vcast(vs, vs->pooled, (size_t)length * (size_t)Hv); /* output.to(hidden_states.dtype) */
    /* strip the rows no patch pooled into (padding positions pool into row 0, which a real patch holds too) */
    for (j = 0; j < length; j++) vs->kernel[j] = 0;
    for (t = 0; t < n; t++) {
        int32_t px = positions[2 * t] < 0 ? 0 : positions[2 * t], py = positions[2 * t + 1] < 0 ? 0 : positions[2 * t + 1];
        vs->kernel[px / K + (max_x + 1) / K * (py / K)] = 1; /* (kernel[] now marks rows: indices were < length) */
    }
    for (j = 0, out = 0; j < length; j++) {
        float *src = vs->pooled + (size_t)j * Hv, *dst = vs->x + (size_t)out * Hv;
        int c;
        if (!vs->kernel[j]) continue;
        for (c = 0; c < Hv; c++) {
            float h = src[c] * root;
            if (v->standardize) h = (h - g4__get(&w->std_bias, (size_t)c)) * g4__get(&w->std_scale, (size_t)c);
            dst[c] = h;
        }
        out++;
    }
    g4__vcast(vs, vs->x, (size_t)out * (size_t)Hv); /* hidden_states.to(inputs_embeds.dtype) */
    g4__vtap(vs, -1, "vision_tower", vs->x, out, Hv);

    /* embed_vision: embedding_projection(RMSNorm without scale) */
    g4__vnorm(vs, vs->xn, vs->x, NULL, out, Hv);
    g4__matmul(&vs->mm, soft, vs->xn, &w->embedding_projection, out);
    g4__vtap(vs, -1, "embed_vision", soft, out, H);
    *n_soft = out;
    return G4_OK;
}

G4__DEF g4_result g4_vision_encode(g4_vision_session *vs, const float *pixel_values, const int32_t *positions,
                                   int n_patches, float *soft, int *n_soft) {
    return g4__vision_encode(vs, pixel_values, positions, n_patches, soft, n_soft, 0, 1);
}

/* get_video_features: the frames are images to the tower (Gemma4VisionModel
   on [frames, patches, .]), each pooled and stripped alone, concatenated */
G4__DEF g4_result g4_video_encode(g4_vision_session *vs, const float *pixel_values, const int32_t *positions,
                                  int n_frames, int n_patches, float *soft, int *n_soft) {
    size_t P, H;
    int f, got, total = 0;
    g4_result r;
    if (!vs) return G4_ERR_INPUT;
    if (n_soft) *n_soft = 0;
    if (!vs->model) { g4__seterr(vs->error, "vision session is not initialised"); return G4_ERR_INPUT; }
    if (!pixel_values || !positions || !soft || !n_soft) {
        g4__seterr(vs->error, "g4_video_encode: NULL pixel_values, positions, soft or n_soft");
        return G4_ERR_INPUT;
    }
    if (n_frames < 1) { g4__seterr(vs->error, "a video of %d frames: need at least one", n_frames); return G4_ERR_INPUT; }
    P = (size_t)3 * (size_t)vs->model->config.vision.patch_size * (size_t)vs->model->config.vision.patch_size;
    H = (size_t)vs->model->config.hidden_size;
    for (f = 0; f < n_frames; f++) {
        r = g4__vision_encode(vs, pixel_values + (size_t)f * (size_t)n_patches * P, positions + (size_t)f * (size_t)n_patches * 2,
                              n_patches, soft + (size_t)total * H, &got, f, n_frames);
        if (r != G4_OK) {
            char msg[G4_ERROR_MAX];
            memcpy(msg, vs->error, G4_ERROR_MAX);
            g4__seterr(vs->error, "video frame %d: %s", f, msg);
            return r;
        }
        total += got;
    }
    *n_soft = total;
    return G4_OK;
}

/* ----------------------------------------------- backward pass >>backward */
/* The training reference: g4_loss_and_grad = the forward (g4_forward itself,
   whose taps keep what the backward needs), the loss, then the backward of
   every op in reverse, read next to the forward above: each g4__X_backward
   takes dL/d(output of X) and gives dL/d(its input), adding the parameter
   gradients into the caller's block. float32 throughout. The shared KV:
   a reader layer's dK/dV go into its owner's slot gradient; the owner's
   backward, which runs after every reader (reverse layer order), checks that
   all of them did before it consumes the slot. */

/* logits rows computed at a time for the loss (the arena holds min(max_seq,
   G4_TRAIN_ROWS) x V): the lm_head's dW sums over them, and its product runs
   at 25 GFLOP per CPU-second at 64 rows, 45-55 at 256 (AVX2, E2B's shape) */
#ifndef G4_TRAIN_ROWS
#define G4_TRAIN_ROWS 256
#endif

/* RMSNorm (g4__rmsnorm): y = x * inv * w, inv = (mean(x^2) + eps)^-0.5.
   dx = inv * (w dy) - x * inv^3 * sum(w dy x) / n;  dw += dy * x * inv.
   dx may alias dy; w NULL: the weightless norm; dw NULL: no weight gradient. */
static void g4__rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const g4_tensor *w, int n,
                                 float eps) {
    double ss = 0.0, dot = 0.0;
    float inv, c;
    int i;
    for (i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    inv = 1.0f / sqrtf((float)(ss / n) + eps);
    for (i = 0; i < n; i++) {
        float g = w ? dy[i] * g4__get(w, (size_t)i) : dy[i];
        if (dw) dw[i] += dy[i] * (x[i] * inv);
        dot += (double)g * (double)x[i];
    }
    c = (float)(dot / n) * inv * inv * inv;
    for (i = 0; i < n; i++) {
        float g = w ? dy[i] * g4__get(w, (size_t)i) : dy[i];
        dx[i] = g * inv - x[i] * c;
    }
}

/* RoPE (g4__rope) is a rotation by +a per pair: its backward rotates by -a, in place. */
static void g4__rope_backward(float *dx, const float *inv_freq, int D, int pos) {
    int j, half = D / 2;
    for (j = 0; j < half; j++) {
        float c, s, g1 = dx[j], g2 = dx[j + half];
        g4__rope_cos_sin(inv_freq[j], pos, &c, &s); /* the forward's angle, cos and sin */
        dx[j] = g1 * c + g2 * s;
        dx[j + half] = g2 * c - g1 * s;
    }
}

/* softmax (g4__softmax), p its output: dx = p * (dp - sum(p dp)), in place on dp. */
static void g4__softmax_backward(float *dp, const float *p, int n) {
    double s = 0.0;
    int i;
    for (i = 0; i < n; i++) s += (double)p[i] * (double)dp[i];
    for (i = 0; i < n; i++) dp[i] = p[i] * (dp[i] - (float)s);
}

/* d gelu_pytorch_tanh(x) / dx, as torch's GeluBackward (approximate="tanh")
   writes it; tanh(inner) is the forward's own (g4__gelu_tanh, the clamped
   float32 gelu that g4__gelu_n computes), so the recompute has its bits */
static float g4__gelu_grad(float x) {
    const float kappa = 0.044715f;
    float x_sq = x * x, tanh_inner = g4__gelu_tanh(x, 1);
    float left = 0.5f * x, right = 1.0f + tanh_inner, left_derivative = 0.5f * right;
    float tanh_derivative = 1.0f - tanh_inner * tanh_inner;
    float inner_derivative = G4__GELU_K * (1.0f + 3.0f * kappa * x_sq);
    return left_derivative + left * tanh_derivative * inner_derivative;
}

/* y = x W^T (g4__matmul) backward: dX += dY W and dW += dY^T X, both the
   packed GEMM's accumulating product (g4__gemm_acc, >>gemm)
     C[t][c] += sum_k A[t][k] B(c, k),   B(c, k) = B[k][c] (k-major)
   with the threads splitting the columns c in blocks of G4__TR:
     dX += dY W:      C = dX [n][in],   A = dY  [n][out],  B = W [out][in]
     dW += dY^T X:    C = dW [out][in], A = dY^T [out][n], B = X [n][in]
   Every element is summed in the same order whatever the thread count. */

/* the scalar reference of g4__gemm_acc: each element summed over k in order */
G4__MAYBE_UNUSED static void g4__gemm_acc_ref(float *y, size_t ldy, const float *x, size_t ldx, const unsigned char *B,
                                              g4_dtype bdt, size_t ldb, int kmajor, int K, int n, int c0, int c1) {
    int t, c, k;
    for (t = 0; t < n; t++)
        for (c = c0; c < c1; c++) {
            float acc = 0.0f;
            for (k = 0; k < K; k++) {
                g4_tensor e;
                e.data = B;
                e.dtype = bdt;
                acc += x[(size_t)t * ldx + (size_t)k] * g4__get(&e, kmajor ? (size_t)k * ldb + (size_t)c : (size_t)c * ldb + (size_t)k);
            }
            y[(size_t)t * ldy + (size_t)c] += acc;
        }
}

/* C [n][N] += A [n][K] B threaded (>>threads): g4__gemm_acc, or this reference without the GEMM */
static void g4__bwd_mm(const g4_session *s, float *C, size_t ldc, const float *A, size_t lda, const unsigned char *B,
                       g4_dtype bdt, size_t ldb, int kmajor, int K, int n, int N);

/* dst [cols][rows] = src [rows][cols] transposed, in 32 x 32 tiles, on the
   session's threads (each part its own stripes of 32 columns: a copy, so the
   split changes nothing) */
typedef struct { float *dst; const float *src; int rows, cols; } g4__transpose_job;
static void g4__transpose_range(void *ctx, size_t i0, size_t i1) { /* columns [32 i0, 32 i1) */
    const g4__transpose_job *j = (const g4__transpose_job *)ctx;
    int rows = j->rows, cols = j->cols, c1 = 32 * (int)i1 < cols ? 32 * (int)i1 : cols, r0, c0, r, c;
    for (r0 = 0; r0 < rows; r0 += 32)
        for (c0 = 32 * (int)i0; c0 < c1; c0 += 32)
            for (c = c0; c < c0 + 32 && c < c1; c++)
                for (r = r0; r < r0 + 32 && r < rows; r++) j->dst[(size_t)c * rows + r] = j->src[(size_t)r * cols + c];
}
static void g4__transpose(const g4_session *s, float *dst, const float *src, int rows, int cols) {
    g4__transpose_job j;
    j.dst = dst; j.src = src; j.rows = rows; j.cols = cols;
    g4__parallel_range(s, (size_t)(cols + 31) / 32, 32 * (size_t)rows, g4__transpose_range, &j);
}

/* y = x W^T (g4__matmul; W [out, in] read as stored, x [n][in]): dx[t] += dy[t] W
   and dw[o] += sum_t dy[t][o] x[t] (either may be NULL), threaded. dyt, xt:
   room for n * out and n * in floats (dW's product reads dy and x transposed,
   both along t: measured 10-20% faster than packing x k-major). */
static void g4__matmul_bwd(const g4_session *s, float *dx, float *dw, const float *dy, const float *x, const g4_tensor *w,
                           int n, float *dyt, float *xt) {
    int out = (int)w->shape[0], in = (int)w->shape[1];
    if (dx) g4__bwd_mm(s, dx, (size_t)in, dy, (size_t)out, (const unsigned char *)w->data, w->dtype, (size_t)in, 1, out, n, in);
    if (w->lora) { g4__lora_backward(dx, dw, dy, x, w->lora, n, s->lora_u); return; } /* dw: its lora_A's gradient */
    if (!dw) return;
    g4__transpose(s, dyt, dy, n, out);
    g4__transpose(s, xt, x, n, in);
    g4__bwd_mm(s, dw, (size_t)in, dyt, (size_t)n, (const unsigned char *)(const void *)xt, G4_F32, (size_t)n, 0, n, out, in);
}

/* The scalar reference (the layer backward runs the two-pass twin below,
   tested equal to it bit for bit): g4__attend's backward for one query head
   q over keys [lo, hi] of a slot:
   dq = (the query's gradient), dk/dv rows += (laid out like the slot's k/v,
   row = position), given dout = dL/d(the head's output). p: [hi-lo+1] scratch. */
G4__MAYBE_UNUSED static void g4__attend_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                                 const g4_kv_slot *sl, int kvh, int lo, int hi, float *p) {
    int D = sl->head_dim, stride = sl->kv_heads * D, k, d;
    double sum = 0.0;
    for (k = lo; k <= hi; k++) /* the probabilities, as the forward computed them */
        p[k - lo] = g4__dot(q, sl->k + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D, D);
    g4__softmax(p, hi - lo + 1);
    for (k = lo; k <= hi; k++) {
        const float *val = sl->v + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D;
        sum += (double)p[k - lo] * (double)g4__dot(dout, val, D);
    }
    for (d = 0; d < D; d++) dq[d] = 0.0f;
    for (k = lo; k <= hi; k++) {
        size_t row = (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D;
        float pk = p[k - lo], ds = pk * (g4__dot(dout, sl->v + row, D) - (float)sum);
        g4__axpy(dq, ds, sl->k + row, D);
        g4__axpy(dk + row, ds, q, D);
        g4__axpy(dv + row, pk, dout, D);
    }
}

/* The same backward for all (token, head) pairs of a layer, on the pool, in
   two passes with the same bits as g4__attend_backward pair by pair:
   A (per query head, every n_parts-th pair to a part, as the forward's
     g4__attn_part, for balance): the probabilities again, the
     head's output from them (o_proj's input, summed as g4__attend sums it),
     dL/dp (kept, then used for dq), dq, and per pair the softmax's max and
     sum and sum(p dp) (stats, 3 floats);
   B (per key row and KV head, every n_parts-th to a part): dK and dV of that row,
     adding the pairs' contributions in the order the pair loop adds them. */
typedef struct {
    const g4_kv_slot *sl; const float *q, *dout; float *att, *dq, *dk, *dv, *stats, *scratch;
    int n, NH, group, window, scratch_len;
} g4__attn_bwd_job;

static void g4__attn_bwd_q(void *ctx, int part, int n_parts) {
    const g4__attn_bwd_job *j = (const g4__attn_bwd_job *)ctx;
    const g4_kv_slot *sl = j->sl;
    int D = sl->head_dim, stride = sl->kv_heads * D, total = j->n * j->NH, i, k;
    float *p = j->scratch + 2 * (size_t)part * (size_t)j->scratch_len, *dpv = p + j->scratch_len;
    for (i = part; i < total; i += n_parts) {
        int t = i / j->NH, h = i % j->NH, lo = j->window && t - j->window + 1 > 0 ? t - j->window + 1 : 0;
        const float *q = j->q + (size_t)i * D;
        float mx, sum = 0.0f, *att = j->att + (size_t)i * D;
        double sdp = 0.0;
        for (k = lo; k <= t; k++)
            p[k - lo] = g4__dot(q, sl->k + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)(h / j->group) * D, D);
        for (mx = p[0], k = 1; k <= t - lo; k++) if (p[k] > mx) mx = p[k];
        for (k = 0; k <= t - lo; k++) sum += g4__expf(p[k] - mx); /* g4__softmax's max and sum, for pass B */
        g4__softmax(p, t - lo + 1);
        memset(att, 0, sizeof(float) * (size_t)D); /* the head's output, as g4__attend sums it */
        for (k = lo; k <= t; k++) {
            const float *val = sl->v + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)(h / j->group) * D;
            g4__axpy(att, p[k - lo], val, D);
            dpv[k - lo] = g4__dot(j->dout + (size_t)i * D, val, D); /* dL/dp */
            sdp += (double)p[k - lo] * (double)dpv[k - lo];
        }
        j->stats[3 * (size_t)i] = mx; j->stats[3 * (size_t)i + 1] = sum; j->stats[3 * (size_t)i + 2] = (float)sdp;
        memset(j->dq + (size_t)i * D, 0, sizeof(float) * (size_t)D);
        for (k = lo; k <= t; k++) {
            size_t row = (size_t)(k % sl->capacity) * (size_t)stride + (size_t)(h / j->group) * D;
            float ds = p[k - lo] * (dpv[k - lo] - (float)sdp);
            g4__axpy(j->dq + (size_t)i * D, ds, sl->k + row, D);
        }
    }
}

static void g4__attn_bwd_kv(void *ctx, int part, int n_parts) {
    const g4__attn_bwd_job *j = (const g4__attn_bwd_job *)ctx;
    const g4_kv_slot *sl = j->sl;
    int D = sl->head_dim, KVH = sl->kv_heads, stride = KVH * D, total = j->n * KVH, i, t, h;
    for (i = part; i < total; i += n_parts) {
        int k = i / KVH, g = i % KVH, last = j->window && k + j->window - 1 < j->n - 1 ? k + j->window - 1 : j->n - 1;
        size_t row = (size_t)(k % sl->capacity) * (size_t)stride + (size_t)g * D;
        for (t = k; t <= last; t++)
            for (h = g * j->group; h < (g + 1) * j->group; h++) {
                size_t pi = (size_t)t * j->NH + (size_t)h;
                const float *q = j->q + pi * D, *dout = j->dout + pi * D, *st = j->stats + 3 * pi;
                float pk = g4__expf(g4__dot(q, sl->k + row, D) - st[0]) / st[1]; /* g4__softmax's p */
                float ds = pk * (g4__dot(dout, sl->v + row, D) - st[2]);
                g4__axpy(j->dk + row, ds, q, D);
                g4__axpy(j->dv + row, pk, dout, D);
            }
    }
}

/* ---- the saved activations: the forward's taps, kept per layer ---- */
enum {
    G4__A_OUT,  /* layers.<i>: the layer's output (the next layer's input) */
    G4__A_XN1,  /* input_layernorm */
    G4__A_Q,    /* self_attn.q: after q_norm and RoPE */
    G4__A_ATTN, /* self_attn: the o_proj output */
    G4__A_R,    /* pre_feedforward_layernorm:input: the residual after attention */
    G4__A_XN2,  /* pre_feedforward_layernorm */
    G4__A_MLP,  /* mlp */
    G4__A_PF1,  /* post_feedforward_layernorm_1 (MoE) */
    G4__A_XN3,  /* pre_feedforward_layernorm_2 (MoE) */
    G4__A_EXP,  /* experts (MoE) */
    G4__A_PF2,  /* post_feedforward_layernorm_2 (MoE) */
    G4__A_PFN,  /* post_feedforward_layernorm */
    G4__A_PG,   /* per_layer_input_gate (PLE) */
    G4__A_PP,   /* per_layer_projection (PLE) */
    G4__A_QP,   /* self_attn.q_proj: the raw projections, kept instead of computed again */
    G4__A_KP,   /* self_attn.k_proj (a layer that owns its K/V) */
    G4__A_VP,   /* self_attn.v_proj (an owner with v_proj) */
    G4__A_GATE, /* mlp.gate_proj */
    G4__A_UP,   /* mlp.up_proj */
    G4__ACTS
};
/* the tap each saved activation comes from */
static const int g4__act_tap[G4__ACTS] = {
    G4__TAP_LAYER, G4__TAP_INPUT_LAYERNORM, G4__TAP_Q, G4__TAP_ATTN, G4__TAP_RESIDUAL, G4__TAP_PRE_FEEDFORWARD_LAYERNORM,
    G4__TAP_MLP, G4__TAP_POST_FEEDFORWARD_LAYERNORM_1, G4__TAP_PRE_FEEDFORWARD_LAYERNORM_2, G4__TAP_EXPERTS,
    G4__TAP_POST_FEEDFORWARD_LAYERNORM_2, G4__TAP_POST_FEEDFORWARD_LAYERNORM, G4__TAP_PER_LAYER_INPUT_GATE,
    G4__TAP_PER_LAYER_PROJECTION, G4__TAP_Q_PROJ, G4__TAP_K_PROJ, G4__TAP_V_PROJ, G4__TAP_GATE_PROJ, G4__TAP_UP_PROJ};
/* every saved kind has its tap (a compile error otherwise) */
typedef char g4__act_tap_complete[sizeof g4__act_tap / sizeof g4__act_tap[0] == G4__ACTS ? 1 : -1];

/* the width of an activation of layer l (0: the layer does not have it) */
static int g4__act_width(const g4_model *m, int l, int kind) {
    const g4_config *c = &m->config;
    const g4_layer_plan *lp = &m->plan.layer[l];
    if (kind == G4__A_Q || kind == G4__A_QP) return c->num_attention_heads * lp->head_dim;
    if (kind == G4__A_KP) return lp->reads < 0 ? lp->kv_heads * lp->head_dim : 0;
    if (kind == G4__A_VP) return lp->reads < 0 && lp->has_v_proj ? lp->kv_heads * lp->head_dim : 0;
    if (kind == G4__A_GATE || kind == G4__A_UP) return lp->mlp_width;
    if (kind >= G4__A_PF1 && kind <= G4__A_PF2) return lp->moe ? c->hidden_size : 0;
    if (kind == G4__A_PG) return c->hidden_size_per_layer_input;
    if (kind == G4__A_PP) return c->hidden_size_per_layer_input ? c->hidden_size : 0;
    return c->hidden_size;
}

/* the saved activation `kind` of layer l; layer -1's G4__A_OUT is the scaled embedding */
static float *g4__saved(const g4_train *t, int l, int kind) { return t->act[(size_t)(l + 1) * G4__ACTS + (size_t)kind]; }

/* The session's taps (by id, s->train): keeps what the backward needs; passes
   the module outputs (not the raw projections, which only training asks for)
   to the caller's tap, by name */
static void g4__train_tap(g4_train *t, int id, int layer, const float *data, int rows, int cols, int pos0) {
    float *dst = NULL;
    int k, projection = id >= G4__TAP_Q_PROJ && id <= G4__TAP_PER_LAYER_MODEL_PROJECTION;
    if (layer < 0) {
        if (id == G4__TAP_EMBED_TOKENS) dst = g4__saved(t, -1, G4__A_OUT);
        else if (id == G4__TAP_PER_LAYER_INPUTS) dst = t->per_layer_inputs;
        else if (id == G4__TAP_PER_LAYER_MODEL_PROJECTION) dst = t->pproj;
        else if (id == G4__TAP_NORM) dst = t->xn_final;
    } else {
        for (k = 0; k < G4__ACTS; k++)
            if (g4__act_tap[k] == id) {
                if (k == G4__A_OUT || !t->cfg.recompute || t->recomputing == layer) dst = g4__saved(t, layer, k);
                break;
            }
    }
    if (t->cfg.tap && t->recomputing < 0 && !projection) {
        char name[96];
        t->cfg.tap(t->cfg.tap_user, g4__tap_name(name, sizeof name, layer, id), layer, data, rows, cols, pos0);
    }
    if (dst) memcpy(dst, data, sizeof(float) * (size_t)rows * (size_t)cols);
}

/* the backward's tap: dL/d(the output of the forward's tap id), under its name */
static void g4__gtap(const g4_train *t, int layer, int id, const float *data, int rows, int cols) {
    char name[96];
    if (!t->cfg.grad_tap) return;
    t->cfg.grad_tap(t->cfg.grad_tap_user, g4__tap_name(name, sizeof name, layer, id), layer, data, rows, cols, 0);
}

/* ---- the arena ---- */
typedef struct { g4_train *t; size_t n, floats; } g4__grad_walk;

static g4_result g4__grad_entry(g4_model *m, void *user, g4_tensor *w, const char *name, int ndim, const int64_t *want) {
    g4__grad_walk *gw = (g4__grad_walk *)user;
    size_t count = 1;
    int k, len = (int)strlen(name);
    (void)m;
    if (len >= 12 && !strcmp(name + len - 12, "layer_scalar")) return G4_OK; /* a buffer: no gradient */
    for (k = 0; k < ndim; k++) count *= (size_t)want[k];
    if (gw->t) {
        g4_grad_entry *e = &gw->t->grads[gw->n];
        snprintf(e->name, sizeof e->name, "%s", name);
        e->offset = gw->floats;
        e->count = count;
        e->ndim = ndim;
        for (k = 0; k < 3; k++) e->shape[k] = k < ndim ? want[k] : 0;
        e->w = w;
    }
    gw->n++;
    gw->floats += (count + 15) & ~(size_t)15; /* every tensor 64-byte aligned in the block */
    return G4_OK;
}

/* The gradient entries: the checkpoint walk (g4__walk_weights) without the
   buffers. The walk only reads a loaded model. */
static void g4__grad_walk_model(const g4_model *m, g4__grad_walk *gw) {
    int k;
    if (!m->lora) { (void)g4__walk_weights((g4_model *)(uintptr_t)m, g4__grad_entry, gw); return; }
    for (k = 0; k < m->n_lora; k++) { /* an adapter: its tensors only, lora_A then lora_B of each module */
        const g4_lora *lo = &m->lora[k];
        char name[256];
        int64_t a[3], b[3];
        a[0] = lo->r; a[1] = lo->in; a[2] = 0;
        b[0] = lo->out; b[1] = lo->r; b[2] = 0;
        snprintf(name, sizeof name, "base_model.model.%s.lora_A.weight", lo->key);
        (void)g4__grad_entry((g4_model *)(uintptr_t)m, gw, (g4_tensor *)(uintptr_t)lo->base, name, 2, a);
        snprintf(name, sizeof name, "base_model.model.%s.lora_B.weight", lo->key);
        (void)g4__grad_entry((g4_model *)(uintptr_t)m, gw, (g4_tensor *)(uintptr_t)lo->base, name, 2, b);
    }
}

static g4_session_config g4__train_session_config(const g4_train_config *cfg) {
    g4_session_config sc = g4_session_config_init();
    sc.max_context = cfg->max_seq;
    sc.max_chunk = cfg->max_seq; /* the whole sequence in one step: every tap sees all rows */
    sc.pool = cfg->pool;
    sc.tap_projections = 1;
    return sc;
}

static void g4__train_carve(g4_train *t, const g4_model *m, const g4_train_config *cfg, g4__carver *cv, size_t sess,
                            size_t *saved) {
    const g4_config *c = &m->config;
    const g4_plan *p = &m->plan;
    uint64_t S = (uint64_t)cfg->max_seq, H = (uint64_t)c->hidden_size, NH = (uint64_t)c->num_attention_heads;
    uint64_t P = (uint64_t)c->hidden_size_per_layer_input, LP = (uint64_t)c->num_hidden_layers * P;
    uint64_t dmax = 0, kvw = 0, imax = 0, E = (uint64_t)c->num_experts, Ie = (uint64_t)c->moe_intermediate_size;
    uint64_t shared[G4__ACTS];
    int L = p->n_layers, l, k;
    float **act;
    g4__grad_walk gw;
    (void)g4__take(cv, sess, 1); /* the session arena */
    memset(&gw, 0, sizeof gw);
    g4__grad_walk_model(m, &gw);
    if (t) { t->grads = (g4_grad_entry *)(void *)g4__take(cv, gw.n, sizeof(g4_grad_entry)); t->n_grads = (int)gw.n; }
    else (void)g4__take(cv, gw.n, sizeof(g4_grad_entry));
    for (l = 0; l < L; l++) {
        const g4_layer_plan *lp = &p->layer[l];
        if ((uint64_t)lp->head_dim > dmax) dmax = (uint64_t)lp->head_dim;
        if ((uint64_t)lp->kv_heads * (uint64_t)lp->head_dim > kvw) kvw = (uint64_t)lp->kv_heads * (uint64_t)lp->head_dim;
        if ((uint64_t)lp->mlp_width > imax) imax = (uint64_t)lp->mlp_width;
    }
    if (c->enable_moe_block && 2 * Ie > imax) imax = 2 * Ie;
    /* saved activations: every layer's output always; the rest per layer, or
       (recompute) one set that the backward refills layer by layer */
    act = (float **)(void *)g4__take(cv, (uint64_t)(L + 1) * G4__ACTS, sizeof(float *));
    *saved = 0;
    for (k = 0; k < G4__ACTS; k++) shared[k] = 0;
    for (l = -1; l < L; l++)
        for (k = 0; k < G4__ACTS; k++) {
            uint64_t w = l < 0 ? (k == G4__A_OUT ? H : 0) : (uint64_t)g4__act_width(m, l, k);
            float *ptr = NULL;
            if (!w) { if (act) act[(size_t)(l + 1) * G4__ACTS + (size_t)k] = NULL; continue; }
            if (k == G4__A_OUT || !cfg->recompute) { ptr = g4__take(cv, S * w, sizeof(float)); *saved += S * w * 4; }
            else if (w > shared[k]) shared[k] = w;
            if (act) act[(size_t)(l + 1) * G4__ACTS + (size_t)k] = ptr;
        }
    if (cfg->recompute)
        for (k = 0; k < G4__ACTS; k++) {
            float *ptr = shared[k] ? g4__take(cv, S * shared[k], sizeof(float)) : NULL;
            *saved += S * shared[k] * 4;
            if (act)
                for (l = 0; l < L; l++)
                    if (k != G4__A_OUT && g4__act_width(m, l, k)) act[(size_t)(l + 1) * G4__ACTS + (size_t)k] = ptr;
        }
    if (t) t->act = act;
#define G4__T(field, count) do { float *p_ = g4__take(cv, (count), sizeof(float)); if (t) t->field = p_; } while (0)
    G4__T(per_layer_inputs, S * LP);
    G4__T(pproj, S * LP);
    G4__T(xn_final, S * H);
    *saved += (2 * S * LP + S * H) * 4;
    G4__T(dx, S * H); G4__T(dr, S * H); G4__T(dxn, S * H); G4__T(dbr, S * H); G4__T(tmp, S * H); G4__T(tmp2, S * H);
    G4__T(dq, S * NH * dmax); G4__T(att, S * NH * dmax); G4__T(datt, S * NH * dmax);
    G4__T(dk, S * kvw); G4__T(dv, S * kvw);
    G4__T(dgate, S * imax); G4__T(dup, S * imax);
    G4__T(dper_layer_inputs, S * LP); G4__T(per_layer_act, S * P); G4__T(per_layer_gate, S * P);
    G4__T(dper_layer_gate, S * P);
    G4__T(probs, 2 * (uint64_t)g4_pool_threads(cfg->pool) * S);
    G4__T(astats, S * NH * 3);
    G4__T(rowinv, S);
    { float *p_ = g4__take(cv, S, sizeof(double)); if (t) t->row_loss = (double *)(void *)p_; }
    {
        uint64_t wide = H > NH * dmax ? H : NH * dmax, head = (S < G4_TRAIN_ROWS ? S : G4_TRAIN_ROWS) * (uint64_t)c->vocab_size;
        if (imax > wide) wide = imax;
        if (LP > wide) wide = LP;
        if (E > wide) wide = E;
        G4__T(dyt, S * wide > head ? S * wide : head);
        G4__T(xt, S * wide);
    }
    G4__T(logits, (S < G4_TRAIN_ROWS ? S : G4_TRAIN_ROWS) * (uint64_t)c->vocab_size);
    G4__T(moe, 4 * H + 2 * E + 6 * Ie); /* see g4__moe_backward */
#undef G4__T
    {
        float **dk = (float **)(void *)g4__take(cv, (uint64_t)p->n_slots, sizeof(float *));
        float **dv = (float **)(void *)g4__take(cv, (uint64_t)p->n_slots, sizeof(float *));
        int *pending = (int *)(void *)g4__take(cv, (uint64_t)p->n_slots, sizeof(int));
        int sl;
        for (sl = 0; sl < p->n_slots; sl++) {
            const g4_layer_plan *lp = &p->layer[p->slot_writer[sl]];
            uint64_t w = S * (uint64_t)lp->kv_heads * (uint64_t)lp->head_dim;
            float *a = g4__take(cv, w, sizeof(float)), *b = g4__take(cv, w, sizeof(float));
            if (dk && dv) { dk[sl] = a; dv[sl] = b; }
        }
        if (t) { t->slot_dk = dk; t->slot_dv = dv; t->pending = pending; }
    }
}

static g4_result g4__check_train_config(const g4_model *m, const g4_train_config *cfg, char *err) {
    if (!m || !cfg || !m->w.layers) { g4__seterr(err, "NULL or unloaded model / config"); return G4_ERR_INPUT; }
    if (cfg->bf16) { g4__seterr(err, "the backward is float32 only: train config bf16 must be 0"); return G4_ERR_INPUT; }
    if (cfg->max_seq < 2) { g4__seterr(err, "train max_seq must be >= 2 (got %d)", cfg->max_seq); return G4_ERR_INPUT; }
    if (m->config.bidirectional == G4_BIDIR_ALL) {
        g4__seterr(err, "use_bidirectional_attention \"all\": the backward's attention is causal only");
        return G4_ERR_INPUT;
    }
    return G4_OK;
}

G4__DEF g4_train_config g4_train_config_init(void) {
    g4_train_config c;
    memset(&c, 0, sizeof c);
    return c;
}

static g4_result g4__train_sizes(const g4_model *m, const g4_train_config *cfg, size_t *arena, size_t *floats,
                                 size_t *sess, size_t *saved, char *err) {
    g4_session_config sc;
    g4__carver cv;
    g4__grad_walk gw;
    g4_result r;
    if ((r = g4__check_train_config(m, cfg, err)) != G4_OK) return r;
    sc = g4__train_session_config(cfg);
    if ((r = g4_session_size(m, &sc, sess)) != G4_OK) {
        g4__seterr(err, "a training session of %d tokens does not fit in memory", cfg->max_seq);
        return r;
    }
    memset(&cv, 0, sizeof cv);
    g4__train_carve(NULL, m, cfg, &cv, *sess, saved);
    if (cv.overflow || cv.off + 64 > (uint64_t)(size_t)-1) {
        g4__seterr(err, "a training arena for %d tokens does not fit in memory", cfg->max_seq);
        return G4_ERR_ARENA;
    }
    *arena = (size_t)cv.off + 64;
    memset(&gw, 0, sizeof gw);
    g4__grad_walk_model(m, &gw);
    *floats = gw.floats;
    return G4_OK;
}

G4__DEF g4_result g4_train_size(const g4_model *m, const g4_train_config *cfg, size_t *arena_bytes, size_t *grad_floats) {
    size_t a, f, sess, saved;
    char err[G4_ERROR_MAX];
    g4_result r;
    if (!arena_bytes || !grad_floats) return G4_ERR_INPUT;
    *arena_bytes = *grad_floats = 0;
    if ((r = g4__train_sizes(m, cfg, &a, &f, &sess, &saved, err)) != G4_OK) return r;
    *arena_bytes = a;
    *grad_floats = f;
    return G4_OK;
}

G4__DEF g4_result g4_train_init(g4_train *t, const g4_model *m, const g4_train_config *cfg, void *arena,
                                size_t arena_bytes) {
    size_t need, floats, sess, saved;
    g4_session_config sc;
    g4__carver cv;
    g4__grad_walk gw;
    g4_result r;
    unsigned char *base;
    if (!t) return G4_ERR_INPUT;
    memset(t, 0, sizeof *t);
    if ((r = g4__train_sizes(m, cfg, &need, &floats, &sess, &saved, t->error)) != G4_OK) return r;
    if (!arena) { g4__seterr(t->error, "NULL training arena"); return G4_ERR_ARENA; }
    if ((uintptr_t)arena % 16) { g4__seterr(t->error, "training arena %p is not 16-byte aligned", arena); return G4_ERR_ARENA; }
    if (arena_bytes < need) {
        g4__seterr(t->error, "training arena of %lu bytes is too small: %d tokens need %lu (g4_train_size)",
                   (unsigned long)arena_bytes, cfg->max_seq, (unsigned long)need);
        return G4_ERR_ARENA;
    }
    base = (unsigned char *)arena + ((64 - (uintptr_t)arena % 64) % 64);
    memset(&cv, 0, sizeof cv);
    cv.base = base;
    cv.poison = 1;
    G4__ASAN_UNPOISON(arena, arena_bytes); /* red zones of an earlier carve of this memory */
    t->model = m;
    t->cfg = *cfg;
    g4__train_carve(t, m, cfg, &cv, sess, &saved);
    t->saved_bytes = saved;
    t->arena_bytes = arena_bytes;
    t->grad_floats = floats;
    t->recomputing = -1;
    memset(&gw, 0, sizeof gw);
    gw.t = t;
    g4__grad_walk_model(m, &gw);
    sc = g4__train_session_config(cfg);
    if ((r = g4_session_init(&t->s, m, &sc, base, sess)) != G4_OK) {
        g4__seterr(t->error, "training session: %s", t->s.error);
        return r;
    }
    t->s.train = t; /* its taps come to g4__train_tap */
    return G4_OK;
}

G4__DEF const g4_grad_entry *g4_train_grad(const g4_train *t, const char *name) {
    int i;
    if (!t || !name || !t->grads) return NULL;
    for (i = 0; i < t->n_grads; i++)
        if (!strcmp(t->grads[i].name, name)) return &t->grads[i];
    return NULL;
}

/* the gradient of weight w in the block G (the tied lm_head is the embedding) */
static float *g4__grad(const g4_train *t, float *G, const g4_tensor *w) {
    int i;
    if (t->model->lora && !w->lora) return NULL; /* with an adapter the base is frozen */
    /* (an adapted weight's entry is its lora_A: g4__matmul_bwd finds lora_B after it) */
    if (!w->lora && w == &t->model->w.lm_head && t->model->config.tie_word_embeddings) w = &t->model->w.embed_tokens;
    for (i = 0; i < t->n_grads; i++)
        if (t->grads[i].w == w) return G + t->grads[i].offset;
    return NULL; /* not reached: every weight the backward touches has an entry */
}

/* ---- the layer backward ---- */

/* n rows of `width`: g4__rmsnorm_backward row by row, on the pool with the
   same bits: first each row's inv (as g4__rmsnorm_backward computes it), then
   dw split by columns (each dw[i] still adds the rows in order), then dx split
   by rows (dx may alias dy: dw has read dy by then). */
typedef struct {
    float *dx, *dw, *inv; const float *dy, *x; const g4_tensor *w; int width; float eps; size_t n_rows;
} g4__norm_bwd_job;

static void g4__norm_bwd_inv(void *ctx, size_t r0, size_t r1) {
    const g4__norm_bwd_job *j = (const g4__norm_bwd_job *)ctx;
    size_t r;
    int i;
    for (r = r0; r < r1; r++) {
        const float *x = j->x + r * (size_t)j->width;
        double ss = 0.0;
        for (i = 0; i < j->width; i++) ss += (double)x[i] * (double)x[i];
        j->inv[r] = 1.0f / sqrtf((float)(ss / j->width) + j->eps);
    }
}

static void g4__norm_bwd_dw(void *ctx, size_t i0, size_t i1) {
    const g4__norm_bwd_job *j = (const g4__norm_bwd_job *)ctx;
    size_t i, r;
    for (r = 0; r < j->n_rows; r++) {
        const float *dy = j->dy + r * (size_t)j->width, *x = j->x + r * (size_t)j->width;
        for (i = i0; i < i1; i++) j->dw[i] += dy[i] * (x[i] * j->inv[r]);
    }
}

static void g4__norm_bwd_dx(void *ctx, size_t r0, size_t r1) {
    const g4__norm_bwd_job *j = (const g4__norm_bwd_job *)ctx;
    size_t r, o;
    for (r = r0; r < r1; r++) {
        o = r * (size_t)j->width;
        g4__rmsnorm_backward(j->dx + o, NULL, j->dy + o, j->x + o, j->w, j->width, j->eps);
    }
}

static void g4__norm_rows_backward(g4_train *t, float *dx, float *dw, const float *dy, const float *x, const g4_tensor *w,
                                   int n, int width, float eps) {
    g4__norm_bwd_job j;
    j.dx = dx; j.dw = dw; j.inv = t->rowinv; j.dy = dy; j.x = x; j.w = w; j.width = width; j.eps = eps; j.n_rows = (size_t)n;
    if (dw) {
        g4__parallel_range(&t->s, (size_t)n, (size_t)width, g4__norm_bwd_inv, &j);
        g4__parallel_range(&t->s, (size_t)width, (size_t)n, g4__norm_bwd_dw, &j);
    }
    g4__parallel_range(&t->s, (size_t)n, (size_t)width, g4__norm_bwd_dx, &j);
}

static void g4__add_into(float *x, const float *y, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) x[i] += y[i];
}

/* Gemma4TextRouter + Gemma4TextExperts backward for one token: dout = dL/d
   experts(xn3); r the residual, xn3 = pre_feedforward_layernorm_2(r).
   dxn3 (=), dr (+=). The top-k choice is not differentiated; the
   renormalised weights are. */
static void g4__moe_backward(g4_train *t, float *G, int l, const float *dout, const float *r, const float *xn3,
                             float *dxn3, float *dr) {
    const g4_model *m = t->model;
    const g4_layer_weights *lw = &m->w.layers[l];
    int H = m->config.hidden_size, E = m->config.num_experts, K = m->config.top_k_experts;
    int Ie = m->config.moe_intermediate_size, i, k, e;
    const float eps = m->config.rms_norm_eps, root = (float)(1.0 / sqrt((double)H));
    float *u1 = t->moe, *u3 = u1 + H, *du = u3 + H, *y = du + H, *probs = y + H, *dprobs = probs + E;
    float *gu = dprobs + E, *act = gu + 2 * Ie, *dgu = act + Ie, *gl = dgu + 2 * Ie;
    float *dscale = g4__grad(t, G, &lw->router_scale), *dpes = g4__grad(t, G, &lw->router_per_expert_scale);
    int top[G4_MAX_TOP_K];
    float q[G4_MAX_TOP_K], dq[G4_MAX_TOP_K], wsum = 0.0f;
    double dot = 0.0;
    /* the router, recomputed as g4__moe computes it */
    g4__rmsnorm(u1, r, NULL, H, eps);
    for (i = 0; i < H; i++) u3[i] = (u1[i] * g4__get(&lw->router_scale, (size_t)i)) * root;
    g4__matmul(&t->s, probs, u3, &lw->router_proj, 1);
    g4__softmax(probs, E);
    g4__topk_torch(probs, E, K, top); /* the forward's torch.topk, its order */
    for (k = 0; k < K; k++) wsum += probs[top[k]];
    for (i = 0; i < H; i++) dxn3[i] = 0.0f;
    for (k = 0; k < K; k++) {
        g4_tensor gup = g4__expert(&lw->experts_gate_up, top[k]), dn = g4__expert(&lw->experts_down, top[k]);
        float *dgup = g4__grad(t, G, &lw->experts_gate_up), *ddn = g4__grad(t, G, &lw->experts_down);
        float pes = g4__get(&lw->router_per_expert_scale, (size_t)top[k]), wk, dw = 0.0f;
        double acc = 0.0;
        q[k] = probs[top[k]] / wsum;
        wk = q[k] * pes;
        /* the expert, recomputed: gu = [gate | up], act = gelu(gate) * up, y = down(act) */
        g4__matmul(&t->s, gu, xn3, &gup, 1);
        g4__gelu_n(gl, gu, (size_t)Ie);
        for (i = 0; i < Ie; i++) act[i] = gl[i] * gu[Ie + i];
        g4__matmul(&t->s, y, act, &dn, 1);
        for (i = 0; i < H; i++) acc += (double)dout[i] * (double)y[i];
        dw = (float)acc;                                   /* dL/d w_k */
        for (i = 0; i < H; i++) du[i] = dout[i] * wk;     /* dL/dy */
        for (i = 0; i < Ie; i++) dgu[i] = 0.0f;
        if (ddn) ddn += (size_t)top[k] * H * Ie; /* (NULL: frozen, with an adapter) */
        if (dgup) dgup += (size_t)top[k] * 2 * Ie * H;
        g4__matmul_bwd(&t->s, dgu, ddn, du, act, &dn, 1, t->dyt, t->xt); /* dgu[0..Ie) = dL/d act */
        for (i = 0; i < Ie; i++) {
            float da = dgu[i];
            dgu[i] = da * gu[Ie + i] * g4__gelu_grad(gu[i]);
            dgu[Ie + i] = da * gl[i];
        }
        g4__matmul_bwd(&t->s, dxn3, dgup, dgu, xn3, &gup, 1, t->dyt, t->xt);
        if (dpes) dpes[top[k]] += dw * q[k];
        dq[k] = dw * pes;
    }
    /* q_k = p_k / sum_j p_j over the top k: dp_k = (dq_k - sum_j dq_j q_j) / sum */
    for (k = 0; k < K; k++) dot += (double)dq[k] * (double)q[k];
    for (e = 0; e < E; e++) dprobs[e] = 0.0f;
    for (k = 0; k < K; k++) dprobs[top[k]] = (dq[k] - (float)dot) / wsum;
    g4__softmax_backward(dprobs, probs, E);               /* dL/d router logits */
    for (i = 0; i < H; i++) du[i] = 0.0f;
    g4__matmul_bwd(&t->s, du, g4__grad(t, G, &lw->router_proj), dprobs, u3, &lw->router_proj, 1, t->dyt, t->xt);
    for (i = 0; i < H; i++) {
        float d2 = du[i] * root;                          /* dL/d (u1 * scale) */
        if (dscale) dscale[i] += d2 * u1[i];
        du[i] = d2 * g4__get(&lw->router_scale, (size_t)i);
    }
    g4__rmsnorm_backward(du, NULL, du, r, NULL, H, eps);
    g4__add_into(dr, du, (size_t)H);
}

/* Gemma4TextAttention backward: dout = dL/d(o_proj output); dxn = dL/d(its
   input) (=). A reader adds its dK/dV into its owner's slot gradient; an owner
   first checks every reader did, then takes K/V's gradient back through
   RoPE, k_norm, v_norm, k_proj and v_proj. */
static g4_result g4__attention_backward(g4_train *t, float *G, int l, int n, const float *dout, float *dxn) {
    const g4_model *m = t->model;
    const g4_layer_plan *lp = &m->plan.layer[l];
    const g4_layer_weights *lw = &m->w.layers[l];
    const float eps = m->config.rms_norm_eps, *inv_freq = t->s.inv_freq[lp->type];
    const float *xn = g4__saved(t, l, G4__A_XN1), *q = g4__saved(t, l, G4__A_Q), *qraw = g4__saved(t, l, G4__A_QP);
    int NH = m->config.num_attention_heads, D = lp->head_dim, KVH = lp->kv_heads, group = NH / KVH;
    int H = m->config.hidden_size, slot = lp->kv_slot, i, tk;
    int window = lp->type == G4_SLIDING ? m->config.sliding_window : 0;
    size_t qw = (size_t)NH * D, kvw = (size_t)KVH * D;
    const g4_kv_slot *sl = &t->s.slots[t->s.layer_slot[l]];
    float *dk = t->slot_dk[slot], *dv = t->slot_dv[slot];
    const float *kraw, *vraw;
    /* o_proj: dL/d(its input) now; its weight's gradient after pass A has
       recomputed the heads' outputs (its input) */
    memset(t->datt, 0, sizeof(float) * (size_t)n * qw);
    g4__matmul_bwd(&t->s, t->datt, NULL, dout, NULL, &lw->o_proj, n, t->dyt, t->xt);
    /* softmax(q k) v: dq, and dK/dV into the slot's gradient */
#ifdef G4_TESTING
    if (lp->reads >= 0 && t->cfg.debug_drop_reader_kv_grads) { /* the planted bug: a throwaway slot */
        dk = t->dk; dv = t->dv;
        memset(dk, 0, sizeof(float) * (size_t)n * kvw);
        memset(dv, 0, sizeof(float) * (size_t)n * kvw);
    }
#endif
    {
        g4__attn_bwd_job j;
        j.sl = sl; j.q = q; j.dout = t->datt; j.att = t->att; j.dq = t->dq; j.dk = dk; j.dv = dv; j.stats = t->astats;
        j.scratch = t->probs; j.scratch_len = t->cfg.max_seq; j.n = n; j.NH = NH; j.group = group; j.window = window;
        g4__parallel(t->cfg.pool, g4__attn_bwd_q, &j);
        g4__parallel(t->cfg.pool, g4__attn_bwd_kv, &j);
    }
    g4__matmul_bwd(&t->s, NULL, g4__grad(t, G, &lw->o_proj), dout, t->att, &lw->o_proj, n, t->dyt, t->xt);
    /* queries: q = RoPE(q_norm(q_proj(xn))) */
    g4__gtap(t, l, G4__TAP_Q, t->dq, n, (int)qw);
    for (i = 0; i < n * NH; i++) {
        float *g = t->dq + (size_t)i * D;
        g4__rope_backward(g, inv_freq, D, i / NH);
        g4__rmsnorm_backward(g, g4__grad(t, G, &lw->q_norm), g, qraw + (size_t)i * D, &lw->q_norm, D, eps);
    }
    memset(dxn, 0, sizeof(float) * (size_t)n * H);
    g4__matmul_bwd(&t->s, dxn, g4__grad(t, G, &lw->q_proj), t->dq, xn, &lw->q_proj, n, t->dyt, t->xt);
    if (lp->reads >= 0) { t->pending[slot]--; return G4_OK; }

    /* an owner: every reader of this slot must have added its part by now */
    if (t->pending[slot] != 0) {
        g4__seterr(t->error, "internal: layer %d consumes its K/V gradient before %d reader layer(s) added theirs", l,
                   t->pending[slot]);
        return G4_ERR_INPUT;
    }
    kraw = g4__saved(t, l, G4__A_KP);
    vraw = lp->has_v_proj ? g4__saved(t, l, G4__A_VP) : kraw; /* attention_k_eq_v: V was the raw K */
    for (tk = 0; tk < n; tk++)
        for (i = 0; i < KVH; i++) {
            size_t o = (size_t)tk * kvw + (size_t)i * D;
            g4__rope_backward(dk + o, inv_freq, D, tk);
            g4__rmsnorm_backward(dk + o, g4__grad(t, G, &lw->k_norm), dk + o, kraw + o, &lw->k_norm, D, eps);
            g4__rmsnorm_backward(dv + o, NULL, dv + o, vraw + o, NULL, D, eps);
        }
    if (lp->has_v_proj) g4__matmul_bwd(&t->s, dxn, g4__grad(t, G, &lw->v_proj), dv, xn, &lw->v_proj, n, t->dyt, t->xt);
    else g4__add_into(dk, dv, (size_t)n * kvw); /* V was the raw K */
    g4__matmul_bwd(&t->s, dxn, g4__grad(t, G, &lw->k_proj), dk, xn, &lw->k_proj, n, t->dyt, t->xt);
    return G4_OK;
}

/* Gemma4TextMLP's activation, elementwise on the pool: act = gelu(gate),
   dgate = act * up; then its backward, da = dgate in: dgate = da * up *
   gelu'(gate), act = da * act (dL/d up) */
typedef struct { const float *gate, *up; float *act, *dgate; } g4__mlp_job;

static void g4__mlp_act(void *ctx, size_t i0, size_t i1) {
    const g4__mlp_job *j = (const g4__mlp_job *)ctx;
    size_t i;
    g4__gelu_n(j->act + i0, j->gate + i0, i1 - i0);
    for (i = i0; i < i1; i++) j->dgate[i] = j->act[i] * j->up[i];
}

static void g4__mlp_act_backward(void *ctx, size_t i0, size_t i1) {
    const g4__mlp_job *j = (const g4__mlp_job *)ctx;
    size_t i;
    for (i = i0; i < i1; i++) {
        float da = j->dgate[i];
        j->dgate[i] = da * j->up[i] * g4__gelu_grad(j->gate[i]);
        j->act[i] = da * j->act[i];
    }
}

/* The steps of Gemma4TextDecoderLayer's backward, numbered as g4__layer's
   forward steps; g4__layer_backward runs them in reverse. Throughout, t->dx
   holds dL/d(the residual stream at that point) and t->dr the gradient of the
   residual r (the attention block's output) that the feed-forward steps add to. */

/* 6. h *= layer_scalar (a buffer: no gradient of its own) */
static void g4__layer_scalar_backward(g4_train *t, int l, int n) {
    const g4_layer_weights *lw = &t->model->w.layers[l];
    int H = t->model->config.hidden_size;
    size_t nh = (size_t)n * H, i;
    float ls = g4__get(&lw->layer_scalar, 0);
    g4__gtap(t, l, G4__TAP_LAYER, t->dx, n, H);
    for (i = 0; i < nh; i++) t->dx[i] *= ls;
}

/* 5. per-layer input: h = x5 + post_per_layer_input_norm(per_layer_projection(per_layer_gate)),
      per_layer_gate = act_fn(per_layer_input_gate(x5)) * per_layer_input */
static void g4__per_layer_input_backward(g4_train *t, float *G, int l, int n) {
    const g4_model *m = t->model;
    const g4_config *c = &m->config;
    const g4_layer_weights *lw = &m->w.layers[l];
    const float eps = c->rms_norm_eps, *r = g4__saved(t, l, G4__A_R);
    int H = c->hidden_size, P = c->hidden_size_per_layer_input, tk, j;
    size_t nh = (size_t)n * H, i, LP = (size_t)c->num_hidden_layers * P, np = (size_t)n * P;
    const float *pg = g4__saved(t, l, G4__A_PG); /* per_layer_input_gate's output */
    float *x5 = t->tmp;
    g4__gtap(t, l, G4__TAP_POST_PER_LAYER_INPUT_NORM, t->dx, n, H);
    for (i = 0; i < nh; i++) x5[i] = r[i] + g4__saved(t, l, G4__A_PFN)[i];
    g4__norm_rows_backward(t, t->dbr, g4__grad(t, G, &lw->post_per_layer_input_norm), t->dx,
                           g4__saved(t, l, G4__A_PP), &lw->post_per_layer_input_norm, n, H, eps);
    g4__gtap(t, l, G4__TAP_PER_LAYER_PROJECTION, t->dbr, n, H);
    g4__gelu_n(t->per_layer_act, pg, np);            /* act_fn(per_layer_input_gate(x5)) */
    for (tk = 0; tk < n; tk++)
        for (j = 0; j < P; j++)
            t->per_layer_gate[(size_t)tk * P + j] =
                t->per_layer_act[(size_t)tk * P + j] * t->per_layer_inputs[tk * LP + (size_t)l * P + j];
    memset(t->dper_layer_gate, 0, sizeof(float) * np);
    g4__matmul_bwd(&t->s, t->dper_layer_gate, g4__grad(t, G, &lw->per_layer_projection), t->dbr, t->per_layer_gate,
                   &lw->per_layer_projection, n, t->dyt, t->xt);
    for (tk = 0; tk < n; tk++) /* dper_layer_gate becomes dL/d(per_layer_input_gate's output), in place */
        for (j = 0; j < P; j++) {
            size_t o = (size_t)tk * P + j, ol = tk * LP + (size_t)l * P + j;
            float da = t->dper_layer_gate[o];
            t->dper_layer_inputs[ol] += da * t->per_layer_act[o];
            t->dper_layer_gate[o] = da * t->per_layer_inputs[ol] * g4__gelu_grad(pg[o]);
        }
    g4__gtap(t, l, G4__TAP_PER_LAYER_INPUT_GATE, t->dper_layer_gate, n, P);
    g4__matmul_bwd(&t->s, t->dx, g4__grad(t, G, &lw->per_layer_input_gate), t->dper_layer_gate, x5,
                   &lw->per_layer_input_gate, n, t->dyt, t->xt);
}

/* 4. h = r + post_feedforward_layernorm(m): dr = dh, and t->dbr = dL/dm */
static void g4__post_feedforward_backward(g4_train *t, float *G, int l, int n) {
    const g4_model *m = t->model;
    const g4_layer_weights *lw = &m->w.layers[l];
    int H = m->config.hidden_size;
    size_t nh = (size_t)n * H, i;
    const float *m_in = g4__saved(t, l, G4__A_MLP);
    g4__gtap(t, l, G4__TAP_POST_FEEDFORWARD_LAYERNORM, t->dx, n, H);
    memcpy(t->dr, t->dx, sizeof(float) * nh);
    if (m->plan.layer[l].moe) { /* m = post_feedforward_layernorm_1(mlp) + post_feedforward_layernorm_2(experts(r)) */
        for (i = 0; i < nh; i++) t->tmp[i] = g4__saved(t, l, G4__A_PF1)[i] + g4__saved(t, l, G4__A_PF2)[i];
        m_in = t->tmp;
    }
    g4__norm_rows_backward(t, t->dbr, g4__grad(t, G, &lw->post_feedforward_layernorm), t->dx, m_in,
                           &lw->post_feedforward_layernorm, n, H, m->config.rms_norm_eps);
}

/* 3. MoE layers: m = post_feedforward_layernorm_1(mlp) + post_feedforward_layernorm_2(experts(r)),
      experts(r) on pre_feedforward_layernorm_2(r): dr gains the experts' path, t->dbr becomes dL/d(mlp) */
static void g4__moe_block_backward(g4_train *t, float *G, int l, int n) {
    const g4_model *m = t->model;
    const g4_layer_weights *lw = &m->w.layers[l];
    const float eps = m->config.rms_norm_eps, *r = g4__saved(t, l, G4__A_R);
    int H = m->config.hidden_size, tk;
    size_t nh = (size_t)n * H;
    g4__norm_rows_backward(t, t->tmp2, g4__grad(t, G, &lw->post_feedforward_layernorm_2), t->dbr,
                           g4__saved(t, l, G4__A_EXP), &lw->post_feedforward_layernorm_2, n, H, eps);
    g4__gtap(t, l, G4__TAP_EXPERTS, t->tmp2, n, H);
    g4__norm_rows_backward(t, t->dbr, g4__grad(t, G, &lw->post_feedforward_layernorm_1), t->dbr,
                           g4__saved(t, l, G4__A_MLP), &lw->post_feedforward_layernorm_1, n, H, eps);
    for (tk = 0; tk < n; tk++) {
        size_t o = (size_t)tk * H;
        g4__moe_backward(t, G, l, t->tmp2 + o, r + o, g4__saved(t, l, G4__A_XN3) + o, t->dxn + o, t->dr + o);
    }
    g4__norm_rows_backward(t, t->tmp, g4__grad(t, G, &lw->pre_feedforward_layernorm_2), t->dxn, r,
                           &lw->pre_feedforward_layernorm_2, n, H, eps);
    g4__add_into(t->dr, t->tmp, nh);
}

/* 2. the feed-forward block on r: mlp = down(gelu(gate(xn2)) * up(xn2)), xn2 =
      pre_feedforward_layernorm(r), gate and up as the forward kept them; dr gains its path */
static void g4__mlp_block_backward(g4_train *t, float *G, int l, int n) {
    const g4_model *m = t->model;
    const g4_layer_weights *lw = &m->w.layers[l];
    const float *r = g4__saved(t, l, G4__A_R);
    const float *xn2 = g4__saved(t, l, G4__A_XN2), *gate = g4__saved(t, l, G4__A_GATE), *up = g4__saved(t, l, G4__A_UP);
    int H = m->config.hidden_size, I = m->plan.layer[l].mlp_width;
    size_t nh = (size_t)n * H, ni = (size_t)n * I;
    g4__mlp_job mj;
    g4__gtap(t, l, G4__TAP_MLP, t->dbr, n, H);
    mj.gate = gate; mj.up = up; mj.act = t->dup; mj.dgate = t->dgate;
    g4__parallel_range(&t->s, ni, 1, g4__mlp_act, &mj);  /* dup := gelu(gate), dgate := gelu(gate) * up */
    g4__matmul_bwd(&t->s, NULL, g4__grad(t, G, &lw->down_proj), t->dbr, t->dgate, &lw->down_proj, n, t->dyt, t->xt);
    memset(t->dgate, 0, sizeof(float) * ni);
    g4__matmul_bwd(&t->s, t->dgate, NULL, t->dbr, NULL, &lw->down_proj, n, t->dyt, t->xt);
    g4__parallel_range(&t->s, ni, 8, g4__mlp_act_backward, &mj); /* dgate, dup := dL/d gate, dL/d up */
    memset(t->dxn, 0, sizeof(float) * nh);
    g4__matmul_bwd(&t->s, t->dxn, g4__grad(t, G, &lw->gate_proj), t->dgate, xn2, &lw->gate_proj, n, t->dyt, t->xt);
    g4__matmul_bwd(&t->s, t->dxn, g4__grad(t, G, &lw->up_proj), t->dup, xn2, &lw->up_proj, n, t->dyt, t->xt);
    g4__gtap(t, l, G4__TAP_PRE_FEEDFORWARD_LAYERNORM, t->dxn, n, H);
    g4__norm_rows_backward(t, t->tmp, g4__grad(t, G, &lw->pre_feedforward_layernorm), t->dxn, r,
                           &lw->pre_feedforward_layernorm, n, H, m->config.rms_norm_eps);
    g4__add_into(t->dr, t->tmp, nh);
}

/* 1. the attention block: r = x + post_attention_layernorm(self_attn(input_layernorm(x))); t->dx becomes dL/dx */
static g4_result g4__attention_block_backward(g4_train *t, float *G, int l, int n) {
    const g4_model *m = t->model;
    const g4_layer_weights *lw = &m->w.layers[l];
    const float eps = m->config.rms_norm_eps;
    int H = m->config.hidden_size;
    size_t nh = (size_t)n * H;
    g4_result res;
    g4__gtap(t, l, G4__TAP_RESIDUAL, t->dr, n, H);
    g4__gtap(t, l, G4__TAP_POST_ATTENTION_LAYERNORM, t->dr, n, H);
    memcpy(t->dx, t->dr, sizeof(float) * nh);
    g4__norm_rows_backward(t, t->dbr, g4__grad(t, G, &lw->post_attention_layernorm), t->dr, g4__saved(t, l, G4__A_ATTN),
                           &lw->post_attention_layernorm, n, H, eps);
    g4__gtap(t, l, G4__TAP_ATTN, t->dbr, n, H);
    if ((res = g4__attention_backward(t, G, l, n, t->dbr, t->dxn)) != G4_OK) return res;
    g4__gtap(t, l, G4__TAP_INPUT_LAYERNORM, t->dxn, n, H);
    g4__norm_rows_backward(t, t->tmp, g4__grad(t, G, &lw->input_layernorm), t->dxn, g4__saved(t, l - 1, G4__A_OUT),
                           &lw->input_layernorm, n, H, eps);
    g4__add_into(t->dx, t->tmp, nh);
    return G4_OK;
}

/* Gemma4TextDecoderLayer backward: g4__layer's steps in reverse, one op
   backward a line (as llm.c's gpt2_backward). t->dx holds dL/d(layer output)
   and leaves holding dL/d(layer input). */
static g4_result g4__layer_backward(g4_train *t, float *G, int l, int n) {
    const g4_layer_plan *lp = &t->model->plan.layer[l];
    g4__layer_scalar_backward(t, l, n);                                          /* 6. h *= layer_scalar */
    if (t->model->config.hidden_size_per_layer_input) g4__per_layer_input_backward(t, G, l, n); /* 5. PLE */
    g4__post_feedforward_backward(t, G, l, n);                                   /* 4. h = r + norm(m) */
    if (lp->moe) g4__moe_block_backward(t, G, l, n);                             /* 3. m += experts(r) */
    g4__mlp_block_backward(t, G, l, n);                                          /* 2. mlp(norm(r)) */
    return g4__attention_block_backward(t, G, l, n);                             /* 1. r = x + attn */
}

/* Activation checkpointing: layer l's activations again, from its input
   alone, by running the forward's own layer (same code, same bits). The
   shared-KV slots hold every position already and are only read from the
   table: in replay an owner layer projects its K/V for the taps (its k_proj
   and v_proj outputs, which its backward needs) but does not write its slot
   again. */
static g4_result g4__train_recompute(g4_train *t, int l) {
    g4_session *s = &t->s;
    g4_result r;
    memcpy(s->x, g4__saved(t, l - 1, G4__A_OUT), sizeof(float) * (size_t)t->n * (size_t)t->model->config.hidden_size);
    s->layer_pos = 0;
    s->replay = 1;
    t->recomputing = l;
    r = g4__layer(s, l, t->n);
    t->recomputing = -1;
    s->replay = 0;
    if (r != G4_OK) g4__seterr(t->error, "recomputing layer %d: %s", l, s->error);
    return r;
}

/* Checks before anything runs: the tokens, and labels in range with at least one used */
static g4_result g4__check_train_input(g4_train *t, const int32_t *ids, const int32_t *labels, int n, int *used) {
    const g4_config *c = &t->model->config;
    int i;
    if (n > t->cfg.max_seq) {
        g4__seterr(t->error, "sequence of %d tokens exceeds the training arena's max_seq of %d", n, t->cfg.max_seq);
        return G4_ERR_INPUT;
    }
    if (g4__check_forward(c, 0, t->cfg.max_seq, ids, n, NULL, G4_LOGITS_NONE, t->error) != G4_OK) return G4_ERR_INPUT;
    *used = 0;
    for (i = 0; i < n; i++) {
        int32_t y = labels ? labels[i] : ids[i];
        if (y == -100) continue;
        if (y < 0 || y >= c->vocab_size) {
            g4__seterr(t->error, "label %ld at index %d is outside the vocabulary [0, %d) and not -100", (long)y, i,
                       c->vocab_size);
            return G4_ERR_INPUT;
        }
        if (i > 0) (*used)++;
    }
    if (!*used) {
        g4__seterr(t->error, "no label to learn from: labels[1..%d] are all -100 (labels[0] is never used)", n - 1);
        return G4_ERR_INPUT;
    }
    return G4_OK;
}

/* exp(x) for x <= 0 with the forward's double exp (g4__exp_d, no libm): below
   -250 it is under 1e-108, nothing to a sum >= 1 or to a float, so 0 */
static double g4__exp_nonpos(double x) { return x < -250.0 ? 0.0 : g4__exp_d(x); }

/* a row's logit from its z: z * cap where z is the soft-capped tanh(logit / cap), else z */
static float g4__ce_logit(float z, float cap) { return cap > 0.0f ? z * cap : z; }
/* dL/dz from g = dL/dlogit: back through logit = cap tanh, z that tanh (no cap: g) */
static float g4__ce_back(float g, float z, float cap) { return cap > 0.0f ? ((g * cap) * (1.0f - z * z)) / cap : g; }

/* One row of logits z [V] against label y: z becomes dL/dz (the raw logits'
   gradient, back through the soft-cap); returns -log softmax(cap(z))[y]. The
   soft-cap's tanh and the exps are the forward's (g4__tanhf, g4__exp_d); the
   log of the sum is libm's (the forward takes none). The reference:
   g4__ce_row (>>backend) runs its tanh and exps in SIMD, the same bits
   (tested). */
G4__MAYBE_UNUSED static double g4__ce_row_ref(float *z, int V, int32_t y, float cap, float inv_n) {
    double sum = 0.0, lse;
    float mx;
    int j;
    if (cap > 0.0f) /* z := tanh(z / cap) as g4__softcap computes it (g4__tanhf); the logit is z * cap */
        for (j = 0; j < V; j++) z[j] = g4__tanhf(z[j] / cap);
    mx = g4__ce_logit(z[0], cap);
    for (j = 1; j < V; j++) { float v = g4__ce_logit(z[j], cap); if (v > mx) mx = v; }
    for (j = 0; j < V; j++) sum += g4__exp_nonpos((double)(g4__ce_logit(z[j], cap) - mx));
    lse = (double)mx + log(sum);
    sum = lse - (double)g4__ce_logit(z[y], cap);
    for (j = 0; j < V; j++) { /* dL/dlogit = (softmax - onehot) / used, then back through the cap */
        float g = (float)g4__exp_nonpos((double)g4__ce_logit(z[j], cap) - lse) * inv_n - (j == y ? inv_n : 0.0f);
        z[j] = g4__ce_back(g, z[j], cap);
    }
    return sum;
}

/* the rows [r0, r1) of one chunk of logits, split across threads (rows are
   independent: the same bits whatever the split) */
typedef struct { g4_train *t; const int32_t *ids, *labels; int n, row0; float inv_n; } g4__ce_job;

static void g4__ce_rows(void *ctx, size_t r0, size_t r1) {
    const g4__ce_job *j = (const g4__ce_job *)ctx;
    const g4_config *c = &j->t->model->config;
    size_t r;
    for (r = r0; r < r1; r++) {
        int row = j->row0 + (int)r;
        int32_t y = row + 1 < j->n ? (j->labels ? j->labels[row + 1] : j->ids[row + 1]) : -100;
        float *z = j->t->logits + r * (size_t)c->vocab_size;
        if (y == -100) { memset(z, 0, sizeof(float) * (size_t)c->vocab_size); j->t->row_loss[row] = 0.0; continue; }
        j->t->row_loss[row] = g4__ce_row(z, c->vocab_size, y, c->final_logit_softcapping, j->inv_n);
    }
}

/* The loss and dL/d(final norm output) (into t->dxn), with the lm_head's
   gradient: logits G4_TRAIN_ROWS rows at a time, soft-capped, cross-entropy
   of row i against labels[i+1] (ForCausalLMLoss: shifted, -100 ignored,
   mean over the used labels, summed in row order). */
static double g4__loss_backward(g4_train *t, float *G, const int32_t *ids, const int32_t *labels, int n, int used) {
    const g4_model *m = t->model;
    int H = m->config.hidden_size, r0, r;
    float *dlm = g4__grad(t, G, &m->w.lm_head);
    double total = 0.0;
    g4__ce_job j;
    j.t = t; j.ids = ids; j.labels = labels; j.n = n; j.inv_n = 1.0f / (float)used;
    memset(t->dxn, 0, sizeof(float) * (size_t)n * H);
    for (r0 = 0; r0 < n; r0 += G4_TRAIN_ROWS) {
        int nr = n - r0 < G4_TRAIN_ROWS ? n - r0 : G4_TRAIN_ROWS;
        g4__matmul(&t->s, t->logits, t->xn_final + (size_t)r0 * H, &m->w.lm_head, nr);
        j.row0 = r0;
        g4__parallel_range(&t->s, (size_t)nr, (size_t)m->config.vocab_size, g4__ce_rows, &j);
        g4__matmul_bwd(&t->s, t->dxn + (size_t)r0 * H, dlm, t->logits, t->xn_final + (size_t)r0 * H, &m->w.lm_head, nr,
                       t->dyt, t->xt);
    }
    for (r = 0; r < n; r++) total += t->row_loss[r];
    return total / used;
}

/* Per-layer inputs' backward (g4__per_layer_inputs): dper_layer_inputs -> the PLE table,
   the projection and its norm, and dx (+=, the embedding's gradient) */
static void g4__per_layer_inputs_backward(g4_train *t, float *G, const int32_t *ids, int n) {
    const g4_model *m = t->model;
    const g4_config *c = &m->config;
    int P = c->hidden_size_per_layer_input, L = c->num_hidden_layers, tk, j;
    size_t LP = (size_t)L * P, i, nlp = (size_t)n * LP;
    const float proj_scale = (float)(1.0 / sqrt((double)c->hidden_size)), tok_scale = (float)sqrt((double)P);
    const float combine = (float)(1.0 / sqrt(2.0));
    const float *x0 = g4__saved(t, -1, G4__A_OUT);
    float *dtab = g4__grad(t, G, &m->w.embed_tokens_per_layer);
    float *dnorm = g4__grad(t, G, &m->w.per_layer_projection_norm);
    for (i = 0; i < nlp; i++) t->dper_layer_inputs[i] *= combine;
    for (tk = 0; tk < n && dtab; tk++)
        if (ids[tk] != c->pad_token_id)
            for (j = 0; j < (int)LP; j++)
                dtab[(size_t)ids[tk] * LP + (size_t)j] += t->dper_layer_inputs[(size_t)tk * LP + j] * tok_scale;
    /* the norm's input, x0 W^T * H^-0.5, from the projection's output as the
       forward kept it (scaled in place: its last use) */
    for (i = 0; i < nlp; i++) t->pproj[i] *= proj_scale;
    for (i = 0; i < (size_t)n * L; i++)
        g4__rmsnorm_backward(t->dper_layer_inputs + i * P, dnorm, t->dper_layer_inputs + i * P, t->pproj + i * P,
                             &m->w.per_layer_projection_norm, P,
                             c->rms_norm_eps);
    for (i = 0; i < nlp; i++) t->dper_layer_inputs[i] *= proj_scale;
    g4__matmul_bwd(&t->s, t->dx, g4__grad(t, G, &m->w.per_layer_model_projection), t->dper_layer_inputs, x0,
                   &m->w.per_layer_model_projection, n, t->dyt, t->xt);
}

G4__DEF g4_result g4_loss_and_grad(g4_train *t, const int32_t *ids, const int32_t *labels, int n, float *loss,
                                   float *G) {
    const g4_model *m;
    const g4_config *c;
    const g4_plan *p;
    int used, l, tk, H, i;
    g4_result r;
    double total;
    if (!t) return G4_ERR_INPUT;
    if (!t->model || !t->grads) { g4__seterr(t->error, "training state is not initialised"); return G4_ERR_INPUT; }
    if (!loss || !G) { g4__seterr(t->error, "NULL %s", loss ? "gradient block" : "loss"); return G4_ERR_INPUT; }
    m = t->model; c = &m->config; p = &m->plan; H = c->hidden_size;
    if ((r = g4__check_train_input(t, ids, labels, n, &used)) != G4_OK) return r;
    memset(G, 0, sizeof(float) * t->grad_floats);

    /* the forward: g4_forward, its taps filling the saved activations */
    t->n = n;
    t->recomputing = -1;
    t->s.train = t;
    g4_session_reset(&t->s);
    if ((r = g4_forward(&t->s, ids, n, NULL, G4_LOGITS_NONE)) != G4_OK) {
        g4__seterr(t->error, "forward: %s", t->s.error);
        return r;
    }

    /* the loss, then the final norm */
    total = g4__loss_backward(t, G, ids, labels, n, used);
    *loss = (float)total;
    g4__gtap(t, -1, G4__TAP_NORM, t->dxn, n, H);
    g4__norm_rows_backward(t, t->dx, g4__grad(t, G, &m->w.norm), t->dxn, g4__saved(t, c->num_hidden_layers - 1, G4__A_OUT),
                           &m->w.norm, n, H, c->rms_norm_eps);

    /* the layers in reverse; each owner slot's gradient starts at zero and
       waits for its readers */
    for (i = 0; i < p->n_slots; i++) {
        const g4_layer_plan *lp = &p->layer[p->slot_writer[i]];
        memset(t->slot_dk[i], 0, sizeof(float) * (size_t)n * lp->kv_heads * lp->head_dim);
        memset(t->slot_dv[i], 0, sizeof(float) * (size_t)n * lp->kv_heads * lp->head_dim);
        t->pending[i] = 0;
    }
    for (l = 0; l < p->n_layers; l++)
        if (p->layer[l].reads >= 0) t->pending[p->layer[l].kv_slot]++;
    if (c->hidden_size_per_layer_input)
        memset(t->dper_layer_inputs, 0, sizeof(float) * (size_t)n * c->num_hidden_layers * c->hidden_size_per_layer_input);
    for (l = p->n_layers - 1; l >= 0; l--) {
        if (t->cfg.recompute && (r = g4__train_recompute(t, l)) != G4_OK) return r;
        if ((r = g4__layer_backward(t, G, l, n)) != G4_OK) return r;
    }

    /* the embeddings: per-layer inputs, then E[id] * sqrt(H) (the pad row gets no lookup gradient) */
    if (c->hidden_size_per_layer_input) {
        g4__gtap(t, -1, G4__TAP_PER_LAYER_INPUTS, t->dper_layer_inputs, n, c->num_hidden_layers * c->hidden_size_per_layer_input);
        g4__per_layer_inputs_backward(t, G, ids, n);
    }
    g4__gtap(t, -1, G4__TAP_EMBED_TOKENS, t->dx, n, H);
    {
        float *dE = g4__grad(t, G, &m->w.embed_tokens), scale = (float)sqrt((double)H);
        for (tk = 0; tk < n && dE; tk++)
            if (ids[tk] != c->pad_token_id)
                for (i = 0; i < H; i++) dE[(size_t)ids[tk] * H + i] += t->dx[(size_t)tk * H + i] * scale;
    }
    return G4_OK;
}

/* ----------------------------------------------------- drafter >>drafter */
/* Gemma4AssistantForCausalLM (models/gemma4_assistant/modeling_gemma4_assistant.py)
   run by SinglePositionMultiTokenCandidateGenerator (generation/
   candidate_generator.py). Its decoder layers are Gemma 4 decoder layers
   (g4__layer); their attention reads a slot of the target's table. */

/* The target owner layer whose K/V a drafter layer of `type` reads: the last
   owner of that type (transformers' store_full_length_kv layers), -1: none */
static int g4__target_owner(const g4_plan *tp, int type) {
    int j;
    for (j = tp->n_layers - 1; j >= 0; j--)
        if (tp->layer[j].reads == -1 && tp->layer[j].type == type) return j;
    return -1;
}

static g4_result g4__drafter_check(const g4_model *dm, const g4_session *target, char *err) {
    const g4_config *dc, *tc;
    const g4_model *tm;
    int l;
    if (!dm || !target || !dm->w.layers) { g4__seterr(err, "NULL or unloaded drafter / target"); return G4_ERR_INPUT; }
    if (!target->model || !target->slots || target->drafter.target) { g4__seterr(err, "the target is not an initialised model session"); return G4_ERR_INPUT; }
    dc = &dm->config;
    tm = target->model;
    tc = &tm->config;
    if (!dc->assistant) { g4__seterr(err, "the drafter is not a gemma4_assistant model"); return G4_ERR_CONFIG; }
    if (dc->backbone_hidden_size != tc->hidden_size || dc->vocab_size != tc->vocab_size) {
        g4__seterr(err, "drafter backbone_hidden_size %d / vocab_size %d do not match the target's hidden_size %d / "
                   "vocab_size %d", dc->backbone_hidden_size, dc->vocab_size, tc->hidden_size, tc->vocab_size);
        return G4_ERR_CONFIG;
    }
    for (l = 0; l < dm->plan.n_layers; l++) {
        const g4_layer_plan *lp = &dm->plan.layer[l];
        int owner = g4__target_owner(&tm->plan, lp->type);
        if (owner < 0) {
            g4__seterr(err, "drafter layer %d is %s but the target has no %s layer that owns K/V", l,
                       g4__type_name(lp->type), g4__type_name(lp->type));
            return G4_ERR_CONFIG;
        }
        if (tm->plan.layer[owner].head_dim != lp->head_dim || tm->plan.layer[owner].kv_heads != lp->kv_heads) {
            g4__seterr(err, "drafter layer %d (%s: head_dim %d, kv_heads %d) cannot read target layer %d (head_dim %d, "
                       "kv_heads %d)", l, g4__type_name(lp->type), lp->head_dim, lp->kv_heads, owner,
                       tm->plan.layer[owner].head_dim, tm->plan.layer[owner].kv_heads);
            return G4_ERR_CONFIG;
        }
    }
    return G4_OK;
}

/* the drafter session's own configuration: one row, the target's context */
static g4_session_config g4__drafter_config(const g4_session *target) {
    g4_session_config c = target->cfg;
    c.max_chunk = 1;
    c.tap = NULL;
    c.tap_user = NULL;
    return c;
}

G4__DEF g4_result g4_drafter_size(const g4_model *drafter, const g4_session *target, size_t *bytes) {
    char err[G4_ERROR_MAX];
    g4_session_config c;
    g4_result r;
    if (!bytes) return G4_ERR_INPUT;
    *bytes = 0;
    if ((r = g4__drafter_check(drafter, target, err)) != G4_OK) return r;
    c = g4__drafter_config(target);
    return g4_session_size(drafter, &c, bytes);
}

G4__DEF g4_result g4_drafter_init(g4_session *d, const g4_model *drafter, g4_session *target, void *arena,
                                  size_t arena_bytes) {
    g4_session_config c;
    g4_result r;
    int l;
    if (!d) return G4_ERR_INPUT;
    memset(d, 0, sizeof *d);
    if ((r = g4__drafter_check(drafter, target, d->error)) != G4_OK) return r;
    c = g4__drafter_config(target);
    if ((r = g4_session_init(d, drafter, &c, arena, arena_bytes)) != G4_OK) return r;
    for (l = 0; l < drafter->plan.n_layers; l++)
        d->layer_slot[l] = target->model->plan.layer[g4__target_owner(&target->model->plan, drafter->plan.layer[l].type)].kv_slot;
    d->slots = target->slots;
    d->n_slots = target->n_slots;
    d->drafter.target = target;
    d->drafter.target_epoch = target->epoch;
    return G4_OK;
}

/* Before a drafter layer reads its target slot: the target is the one it was
   attached to, not reset since, and the slot holds exactly the positions the
   query at d->pos reads: [0, pos) full, the last sliding_window + 1 sliding. */
static g4_result g4__drafter_check_read(const g4_session *d, int l, const g4_kv_slot *sl) {
    const g4_layer_plan *lp = &d->model->plan.layer[l];
    int pos = d->pos, window = d->model->config.sliding_window;
    int lo = lp->type == G4_SLIDING && pos - 1 - window > 0 ? pos - 1 - window : 0;
    if (d->drafter.target->epoch != d->drafter.target_epoch) {
        g4__seterr((char *)d->error, "the target session was reset after this drafter was attached: re-run g4_drafter_init");
        return G4_ERR_INPUT;
    }
    if (sl->n_pos != pos || pos < 1 || lo < sl->oldest || sl->head_dim != lp->head_dim || sl->kv_heads != lp->kv_heads) {
        g4__seterr((char *)d->error, "drafter layer %d reads target layer %d's K/V for positions [%d, %d), but the slot "
                   "holds [%d, %d) (the target needs max_chunk >= draft tokens + 2)", l, sl->writer, lo, pos, sl->oldest,
                   sl->n_pos);
        return G4_ERR_INPUT;
    }
    return G4_OK;
}

/* Gemma4AssistantMaskedEmbedder: the centroid logits pick the top-k
   centroids (torch.topk, whose choice among tied logits g4__topk_torch_q
   follows; ties are common in the bf16 mode); the logits of their tokens
   (token_ordering viewed as [C][V/C]) are h . lm_head[token]; every other
   token gets min(those) - 1, the min of the logits as the matmul returns
   them (bf16-rounded in the bf16 mode). */
static void g4__masked_logits(g4_session *d, float *logits) {
    const g4_model *m = d->model;
    const g4_config *c = &m->config;
    const g4_tensor *lm = &m->w.lm_head;
    int C = c->num_centroids, K = c->centroid_intermediate_top_k, Vc = c->vocab_size / C, H = c->hidden_size;
    int k, i, j;
    float mn = HUGE_VALF, fill;
    g4__matmul(d, d->drafter.centroid, d->xn, &m->w.centroids, 1);
    g4__topk_torch_q(d->drafter.centroid, C, K, d->drafter.top, d->drafter.centroid_q);
    for (k = 0; k < K; k++)
        for (j = 0; j < Vc; j++) {
            int64_t tok = g4__index_get(&m->w.token_ordering, (size_t)d->drafter.top[k] * Vc + (size_t)j);
            g4_tensor row = *lm;
            row.data = (const unsigned char *)lm->data + (size_t)tok * (size_t)H * g4__dtype_size(lm->dtype);
            row.shape[0] = 1;
            /* selected_logits come out of the matmul in the compute dtype (bf16 in the bf16 mode) and
               their min is taken after that rounding */
            g4__matmul(d, &logits[tok], d->xn, &row, 1);
            if (logits[tok] < mn) mn = logits[tok];
        }
    /* selected_logits.min().item() - 1.0, a Python float that torch.full turns into the dtype (the
       rounding below; torch narrows double -> float -> bf16, as this does) */
    fill = (float)((double)mn - 1.0);
    for (i = 0; i < C; i++) {
        for (k = 0; k < K && d->drafter.top[k] != i; k++) {}
        if (k < K) continue;
        for (j = 0; j < Vc; j++) logits[g4__index_get(&m->w.token_ordering, (size_t)i * Vc + (size_t)j)] = fill;
    }
    if (d->cfg.bf16) g4__parallel_range(d, (size_t)c->vocab_size, 1, g4__bf16_round_range, logits);
}

G4__DEF g4_result g4_draft_step(g4_session *d, int32_t token, const float *hidden, float *logits, float *next_hidden) {
    const g4_model *m, *tm;
    const g4_config *c;
    int Hb, H, l;
    float scale;
    g4_result r;
    if (!d) return G4_ERR_INPUT;
    if (!d->drafter.target || !d->model) { g4__seterr(d->error, "not a drafter session (g4_drafter_init)"); return G4_ERR_INPUT; }
    m = d->model;
    tm = d->drafter.target->model;
    c = &m->config;
    Hb = c->backbone_hidden_size;
    H = c->hidden_size;
    if (!hidden || !logits || !next_hidden) { g4__seterr(d->error, "draft step: NULL hidden, logits or next_hidden"); return G4_ERR_INPUT; }
    if (token < 0 || token >= c->vocab_size) {
        g4__seterr(d->error, "draft step: token id %ld is outside the vocabulary [0, %d)", (long)token, c->vocab_size);
        return G4_ERR_INPUT;
    }
    d->pos = d->layer_pos = d->drafter.target->pos; /* the token's position: the target holds [0, pos) */
    d->fwd_n = 1;            /* the bf16 mode's orders: one token (checked against transformers in bf16: test_drafter) */
    d->fwd_end = d->pos + 1;
    /* inputs_embeds = concat(target.embed_tokens(token), hidden); pre_projection */
    scale = g4__scale(d->drafter.target, Hb);
    g4__embed(d, d->drafter.din, &tm->w.embed_tokens, &token, 1, scale, 0);
    memcpy(d->drafter.din + Hb, hidden, sizeof(float) * (size_t)Hb);
    g4__matmul(d, d->x, d->drafter.din, &m->w.pre_projection, 1);
    g4__tap(d, -1, G4__TAP_PRE_PROJECTION, d->x, 1, H);
    for (l = 0; l < c->num_hidden_layers; l++)
        if ((r = g4__layer(d, l, 1)) != G4_OK) return r;
    g4__norm_rows(d, d->xn, d->x, &m->w.norm, 1, H, -1, G4__TAP_NORM);
    /* last_hidden_state = post_projection(h); logits from h (no soft-cap) */
    g4__matmul(d, next_hidden, d->xn, &m->w.post_projection, 1);
    if (c->use_ordered_embeddings) g4__masked_logits(d, logits);
    else g4__matmul(d, logits, d->xn, &m->w.lm_head, 1);
    return G4_OK;
}

/* ----------------------------------- speculative decoding >>speculative */

G4__DEF g4_result g4_spec_size(const g4_model *target, int k, size_t *bytes) {
    uint64_t V, H, n;
    if (!bytes) return G4_ERR_INPUT;
    *bytes = 0;
    if (!target || k < 1 || k > 1024) return G4_ERR_INPUT;
    V = (uint64_t)target->config.vocab_size;
    H = (uint64_t)target->config.hidden_size;
    n = ((uint64_t)(k + 1) * V + (uint64_t)k * V + (uint64_t)(k + 2) * H + (uint64_t)(k + 1)) * 4 + 64;
    if (n > (uint64_t)(size_t)-1) return G4_ERR_ARENA;
    *bytes = (size_t)n;
    return G4_OK;
}

G4__DEF g4_result g4_spec_init(g4_spec *sp, g4_session *target, g4_session *drafter, int k, void *work, size_t bytes) {
    size_t need, V, H;
    float *f;
    if (!sp) return G4_ERR_INPUT;
    memset(sp, 0, sizeof *sp);
    if (!target || !target->model || !target->slots || target->drafter.target) { g4__seterr(sp->error, "speculative: the target is not an initialised model session"); return G4_ERR_INPUT; }
    if (drafter && drafter->drafter.target != target) { g4__seterr(sp->error, "speculative: the drafter is not attached to this target"); return G4_ERR_INPUT; }
    if (g4_spec_size(target->model, k, &need) != G4_OK) { g4__seterr(sp->error, "speculative: draft tokens %d must be in [1, 1024]", k); return G4_ERR_INPUT; }
    if (!work || bytes < need || (uintptr_t)work % 4) {
        g4__seterr(sp->error, "speculative: workspace of %lu bytes is too small or misaligned (g4_spec_size: %lu)",
                   (unsigned long)bytes, (unsigned long)need);
        return G4_ERR_ARENA;
    }
    if (target->cfg.max_chunk < k + 2) {
        g4__seterr(sp->error, "speculative: the target session's max_chunk (%d) must be >= draft tokens + 2 (%d)",
                   target->cfg.max_chunk, k + 2);
        return G4_ERR_INPUT;
    }
    V = (size_t)target->model->config.vocab_size;
    H = (size_t)target->model->config.hidden_size;
    sp->target = target;
    sp->drafter = drafter;
    sp->k = k;
    f = (float *)work;
    sp->logits = f; f += (size_t)(k + 1) * V;
    sp->q = f; f += (size_t)k * V;
    sp->hidden = f; f += (size_t)(k + 1) * H;
    sp->h = f; f += H;
    sp->ids = (int32_t *)(void *)f;
    sp->last = -1;
    return G4_OK;
}

G4__DEF g4_result g4_spec_prefill(g4_spec *sp, const int32_t *prompt, int n, g4_sampler *sampler, int32_t *first) {
    g4_result r;
    int V;
    if (!sp || !sp->target || !first) return G4_ERR_INPUT;
    V = sp->target->model->config.vocab_size;
    if ((r = g4_forward_hidden(sp->target, prompt, n, sp->logits, G4_LOGITS_LAST, sp->h)) != G4_OK) {
        memcpy(sp->error, sp->target->error, G4_ERROR_MAX);
        return r;
    }
    if (sampler) {
        int i;
        for (i = 0; i < n; i++) g4_sampler_accept(sampler, prompt[i]);
        *first = g4_sampler_sample(sampler, sp->logits);
        if (*first < 0) { memcpy(sp->error, sampler->error, G4_ERROR_MAX); return G4_ERR_INPUT; }
        g4_sampler_accept(sampler, *first);
    } else {
        *first = g4_argmax(sp->logits, V);
    }
    sp->last = *first;
    return G4_OK;
}

/* the sampler section's helpers (>>sampler) */
static int32_t g4__sampler_dist(g4_sampler *s, float *logits, float *probs);
static int32_t g4__draw(g4_sampler *s, const float *probs, double mass);
static double g4__rng_uniform(uint64_t *s);

/* The token the target picks from verification row `row`: the argmax, or the
   sampler's deterministic choice (temperature 0: argmax after the penalty). */
static int32_t g4__spec_pick(g4_spec *sp, g4_sampler *sampler, float *row) {
    return sampler ? g4_sampler_sample(sampler, row) : g4_argmax(row, sp->target->model->config.vocab_size);
}

G4__DEF g4_result g4_spec_round(g4_spec *sp, g4_sampler *sampler, int32_t *out, int *n_out) {
    g4_session *t;
    g4_result r;
    int V, H, k, i, a, p, sampling;
    unsigned char added[1024];
    if (!sp || !sp->target || !out || !n_out) return G4_ERR_INPUT;
    *n_out = 0;
    t = sp->target;
    if (sp->last < 0) { g4__seterr(sp->error, "speculative: g4_spec_prefill first"); return G4_ERR_INPUT; }
    if (!sp->drafter && !sp->propose) { g4__seterr(sp->error, "speculative: no drafter and no propose function"); return G4_ERR_INPUT; }
    V = t->model->config.vocab_size;
    H = t->model->config.hidden_size;
    if (sampler && sampler->vocab != V) { g4__seterr(sp->error, "speculative: the sampler's vocab %d is not the target's %d", sampler->vocab, V); return G4_ERR_INPUT; }
    sampling = sampler && sampler->cfg.temperature > 0.0f;
    p = t->pos;
    k = sp->k;
    if (k > t->cfg.max_context - p - 1) k = t->cfg.max_context - p - 1;
    if (k < 0) { g4__seterr(sp->error, "speculative: the target session is full (%d positions)", t->cfg.max_context); return G4_ERR_INPUT; }

    /* 1. draft k tokens from (last, h) at position p; q[i]: the distribution
       d_i was drawn from (sampling), with the drafts before it seen */
    sp->ids[0] = sp->last;
    if (k && sp->drafter) memcpy(sp->hidden, sp->h, sizeof(float) * (size_t)H); /* the drafter's running hidden */
    for (i = 0; i < k; i++) {
        float *q = sp->q + (size_t)i * V;
        int32_t d = -1;
        if (sp->drafter) {
            if ((r = g4_draft_step(sp->drafter, sp->ids[i], sp->hidden, q, sp->hidden)) != G4_OK) {
                memcpy(sp->error, sp->drafter->error, G4_ERROR_MAX);
                return r;
            }
            if (!sampling) d = g4__spec_pick(sp, sampler, q);
            else if ((d = g4__sampler_dist(sampler, q, q)) == -2) d = g4__draw(sampler, q, 1.0);
            if (d < 0) { memcpy(sp->error, sampler->error, G4_ERROR_MAX); return G4_ERR_INPUT; }
        }
        if (sp->propose) {
            d = sp->propose(sp->propose_user, p + 1 + i, i, d);
            if (sampling && d >= 0 && d < V) { memset(q, 0, sizeof(float) * (size_t)V); q[d] = 1.0f; } /* a deterministic drafter */
        }
        if (d < 0 || d >= V) { g4__seterr(sp->error, "speculative: drafted token %ld is outside [0, %d)", (long)d, V); return G4_ERR_INPUT; }
        sp->ids[i + 1] = d;
        added[i] = sampler && !sampler->seen[d]; /* the repetition penalty sees the drafts before the next */
        if (sampler) sampler->seen[d] = 1;
    }
    if (sampler) /* back to the accepted tokens only; re-added as they are accepted */
        for (i = k - 1; i >= 0; i--) if (added[i]) sampler->seen[sp->ids[i + 1]] = 0;

    /* 2. verify: one target forward over last + the drafts */
    if ((r = g4_forward_hidden(t, sp->ids, k + 1, sp->logits, G4_LOGITS_ALL, sp->hidden)) != G4_OK) {
        memcpy(sp->error, t->error, G4_ERROR_MAX);
        return r;
    }
    sp->target_steps++;
    sp->drafted += k;

    /* 3. accept drafts while the target agrees, then the target's own token */
    for (a = 0; a <= k; a++) {
        float *row = sp->logits + (size_t)a * V;
        int32_t pick;
        if (!sampling) {
            if ((pick = g4__spec_pick(sp, sampler, row)) < 0) { memcpy(sp->error, sampler->error, G4_ERROR_MAX); return G4_ERR_INPUT; }
            out[a] = pick;
            if (a == k || pick != sp->ids[a + 1]) break;
        } else {
            /* speculative sampling: accept d with probability min(1, p(d)/q(d)),
               else draw from max(0, p - q) normalised (p where that is empty) */
            const float *q = sp->q + (size_t)a * V;
            if ((pick = g4__sampler_dist(sampler, row, row)) != -2) { memcpy(sp->error, sampler->error, G4_ERROR_MAX); return G4_ERR_INPUT; }
            if (a == k) { out[a] = g4__draw(sampler, row, 1.0); break; }
            {
                int32_t d = sp->ids[a + 1];
                double u = g4__rng_uniform(&sampler->rng);
                if (q[d] > 0 && u < (double)row[d] / (double)q[d]) {
                    out[a] = d;
                } else {
                    double mass = 0;
                    int j;
                    for (j = 0; j < V; j++) { row[j] = row[j] > q[j] ? row[j] - q[j] : 0.0f; mass += row[j]; }
                    if (mass <= 0) { /* p <= q everywhere means p == q (rounding aside): keep d */
                        out[a] = d;
                    } else {
                        out[a] = g4__draw(sampler, row, mass); /* never d: p(d) < q(d) there */
                        break;
                    }
                }
            }
        }
        if (sampler) sampler->seen[out[a]] = 1;
    }
    if (sampler) sampler->seen[out[a]] = 1;
    sp->accepted += a;
    *n_out = a + 1;
    /* 4. rewind the target to the accepted positions: last and a drafts */
    if ((r = g4_session_rewind(t, p + a + 1)) != G4_OK) {
        memcpy(sp->error, t->error, G4_ERROR_MAX);
        return r;
    }
    memcpy(sp->h, sp->hidden + (size_t)a * H, sizeof(float) * (size_t)H);
    sp->last = out[a];
    return G4_OK;
}

/* --------------------------------------------------------- audio >>audio */
/* The E2B/E4B audio tower, read next to modeling_gemma4.py (transformers
   5.23.0): Gemma4AudioModel.forward, then Gemma4MultimodalEmbedder
   (embed_audio), then the padding rows dropped as Gemma4Model.forward drops
   them. In order:
     subsample_conv_projection  two 3x3 stride-2 Conv2d (padding 1, no bias),
                                each on its input with invalid time rows set
                                to 0, then LayerNorm over the channels (no
                                bias, eps rms_norm_eps) and ReLU; the mask
                                keeps every second row after each; then
                                input_proj_linear on the [F2][C1] rows
     rel_pos_enc                sin/cos of the distances P-1 .. 0 (P =
                                context_size / 2 + 1)
     layers.<i>                 feed_forward1 (a half step), chunked local
                                attention, lconv1d, feed_forward2, norm_out
     output_proj                linear with bias
     embed_audio                weightless RMSNorm (eps rms_norm_eps), linear
   The RMSNorms of the FFNs and norm_pre_attn / norm_post_attn / norm_out use
   Gemma4RMSNorm's default eps 1e-6, not the config's: transformers builds
   them without it. Every clamp of gradient_clipping and every clipped
   linear's bounds are applied where the source applies them.
   transformers sizes input_proj_linear as (C0 / 4) * C1, the width of C0
   mel bins after the two convolutions: the tower takes C0 (= 128) mel bins.
   Numerics: float32 activations, weights as stored; the reductions (matmul,
   convolution, LayerNorm) sum in their own order, so the soft tokens match
   transformers' float32 ones to about 1e-6 relative, not bit for bit.
   The matmuls use the decoder's (g4__matmul: the packed SIMD GEMM, or
   g4__matmul_ref, the scalar reference, in a G4_NO_SIMD build; both builds
   are tested against transformers), their rows split across the run's pool;
   the convolutions (by output time row) and the attention (by query) are
   plain loops split across it too, each row computed as on one thread, so
   any pool gives the same bits. exp and tanh are the decoder's (g4__expf,
   g4__tanhf), not libm's. */

/* audio_config -> g4_audio_config (called by g4__config_from_json) */
static g4_result g4__audio_config_parse(const g4__json *j, int root, const char *name, g4_audio_config *a, char *err) {
    g4__cfg c;
    g4_result r;
    int n = g4__jget(j, root, "audio_config"), k, ch;
    memset(a, 0, sizeof *a);
    if (n < 0 || j->nodes[n].type == G4__JNULL) return G4_OK;
    if (j->nodes[n].type != G4__JOBJ) {
        g4__seterr(err, "%s: field 'audio_config' must be an object, got %s", name, g4__jtype_name(j->nodes[n].type));
        return G4_ERR_CONFIG;
    }
    c.j = j;
    c.obj = n;
    c.name = name;
    c.scope = "audio_config.";
    c.err = err;
    a->present = 1;
#define G4__ATRY(x) do { if ((r = (x)) != G4_OK) return r; } while (0)
    G4__ATRY(g4__cfg_expect_str(&c, "model_type", "gemma4_audio", NULL));
    G4__ATRY(g4__cfg_expect_str(&c, "hidden_act", "silu", NULL));
    G4__ATRY(g4__cfg_int(&c, "hidden_size", &a->hidden_size, 1024, 0, 2, 1 << 16));
    G4__ATRY(g4__cfg_int(&c, "num_hidden_layers", &a->num_hidden_layers, 12, 0, 1, G4_MAX_LAYERS));
    G4__ATRY(g4__cfg_int(&c, "num_attention_heads", &a->num_attention_heads, 8, 0, 1, 4096));
    G4__ATRY(g4__cfg_int(&c, "conv_kernel_size", &a->conv_kernel_size, 5, 0, 1, 4096));
    G4__ATRY(g4__cfg_float(&c, "residual_weight", &a->residual_weight, 0.5f, -1e30, 1e30));
    G4__ATRY(g4__cfg_int(&c, "attention_chunk_size", &a->attention_chunk_size, 12, 0, 1, 4096));
    G4__ATRY(g4__cfg_int(&c, "attention_context_left", &a->attention_context_left, 13, 0, 1, 4096));
    G4__ATRY(g4__cfg_int(&c, "attention_context_right", &a->attention_context_right, 0, 0, 0, 4096));
    G4__ATRY(g4__cfg_float(&c, "attention_logit_cap", &a->attention_logit_cap, 50.0f, 1e-30, 1e30));
    G4__ATRY(g4__cfg_float(&c, "attention_invalid_logits_value", &a->attention_invalid_logits_value, -1e9f, -1e30, 1e30));
    G4__ATRY(g4__cfg_bool(&c, "use_clipped_linears", &a->use_clipped_linears, 1));
    G4__ATRY(g4__cfg_float(&c, "rms_norm_eps", &a->rms_norm_eps, 1e-6f, 0.0, 1.0));
    G4__ATRY(g4__cfg_float(&c, "gradient_clipping", &a->gradient_clipping, 1e10f, 1e-30, 1e300));
    G4__ATRY(g4__cfg_int(&c, "output_proj_dims", &a->output_proj_dims, 1536, 0, 1, 1 << 20));
#undef G4__ATRY
    a->subsampling_conv_channels[0] = 128;
    a->subsampling_conv_channels[1] = 32;
    if ((ch = g4__jget(j, n, "subsampling_conv_channels")) >= 0 && j->nodes[ch].type != G4__JNULL) {
        const g4__jnode *nd = &j->nodes[ch];
        if (nd->type != G4__JARR || nd->count != 2) {
            g4__seterr(err, "%s: field 'audio_config.subsampling_conv_channels' must be a list of 2 integers", name);
            return G4_ERR_CONFIG;
        }
        for (k = 0, ch = nd->child; ch >= 0; ch = j->nodes[ch].next, k++) {
            const g4__jnode *e = &j->nodes[ch];
            if (e->type != G4__JNUM || !e->is_int || e->ival < 1 || e->ival > 65536) {
                g4__seterr(err, "%s: field 'audio_config.subsampling_conv_channels[%d]' must be an integer in [1, 65536]",
                           name, k);
                return G4_ERR_CONFIG;
            }
            a->subsampling_conv_channels[k] = (int)e->ival;
        }
    }
    if (a->hidden_size % 2 || a->hidden_size % a->num_attention_heads) {
        g4__seterr(err, "%s: audio_config.hidden_size %d must be even and a multiple of num_attention_heads %d "
                   "(rel_pos_enc concatenates Ha/2 sines and Ha/2 cosines)", name, a->hidden_size, a->num_attention_heads);
        return G4_ERR_CONFIG;
    }
    if (a->subsampling_conv_channels[0] % 4) {
        g4__seterr(err, "%s: audio_config.subsampling_conv_channels[0] is %d; transformers sizes input_proj_linear as "
                   "(C0 / 4) * C1, which is the width of C0 mel bins after two stride-2 convolutions only for C0 a "
                   "multiple of 4", name, a->subsampling_conv_channels[0]);
        return G4_ERR_CONFIG;
    }
    return G4_OK;
}

/* The audio geometry every function below derives from the config. */
typedef struct {
    int T, T1, T2;         /* feature frames, after layer0, after layer1 (the tower's frames) */
    int F, F1, F2;         /* mel bins (C0), after layer0, after layer1 */
    int C0, C1, Ha, NH, D, K, Pa, Ht, La;
    int chunk, past, future, ctx, P, nb; /* chunk, context_left - 1, context_right, context_size, positions, blocks */
    int lora_rmax;         /* the model's LoRA adapter's largest rank (0: none) */
} g4__ageo;

static void g4__audio_geo(g4__ageo *g, const g4_model *m, int T) {
    const g4_audio_config *a = &m->config.audio;
    g->T = T;
    g->T1 = (T + 1) / 2;
    g->T2 = (g->T1 + 1) / 2;
    g->C0 = a->subsampling_conv_channels[0];
    g->C1 = a->subsampling_conv_channels[1];
    g->F = g->C0;
    g->F1 = (g->F + 1) / 2;
    g->F2 = (g->F1 + 1) / 2;
    g->Ha = a->hidden_size;
    g->NH = a->num_attention_heads;
    g->D = g->Ha / g->NH;
    g->K = a->conv_kernel_size;
    g->Pa = a->output_proj_dims;
    g->Ht = m->config.hidden_size;
    g->La = a->num_hidden_layers;
    g->chunk = a->attention_chunk_size;
    g->past = a->attention_context_left - 1;
    g->future = a->attention_context_right;
    g->ctx = g->chunk + g->past + g->future;
    g->P = g->ctx / 2 + 1;
    g->nb = (g->T2 + g->chunk - 1) / g->chunk;
    g->lora_rmax = m->lora_rmax;
}

/* Bind one tensor of the tower; failures go to m->audio.error. */
static int g4__audio_w(g4_model *m, g4__weight_fn fn, void *user, g4_tensor *t, const char *name, int ndim, int64_t a,
                       int64_t b, int64_t c, int64_t d) {
    int64_t dims[4];
    char save[G4_ERROR_MAX];
    g4_result r;
    dims[0] = a; dims[1] = b; dims[2] = c; dims[3] = d;
    memcpy(save, m->error, G4_ERROR_MAX);
    r = fn(m, user, t, name, ndim, dims);
    if (r != G4_OK) memcpy(m->audio.error, m->error, G4_ERROR_MAX);
    memcpy(m->error, save, G4_ERROR_MAX);
    return r == G4_OK;
}

/* A Gemma4ClippableLinear: the weight and, with use_clipped_linears, its four
   scalar buffers (absent ones stay infinite, as transformers initialises a
   missing buffer). */
static int g4__audio_cl(g4_model *m, g4__weight_fn fn, void *user, g4_clippable_linear *l, const char *mod, int64_t out,
                        int64_t in) {
    static const char *bn[4] = {"input_min", "input_max", "output_min", "output_max"};
    float *dst[4];
    char name[224];
    int k;
    l->input_min = l->output_min = -INFINITY;
    l->input_max = l->output_max = INFINITY;
    snprintf(name, sizeof name, "%s.linear.weight", mod);
    if (!g4__audio_w(m, fn, user, &l->linear, name, 2, out, in, 0, 0)) return 0;
    if (!m->config.audio.use_clipped_linears) return 1;
    dst[0] = &l->input_min; dst[1] = &l->input_max; dst[2] = &l->output_min; dst[3] = &l->output_max;
    for (k = 0; k < 4; k++) {
        g4_tensor t;
        snprintf(name, sizeof name, "%s.%s", mod, bn[k]);
        if (!g4__st_find(m, name)) continue;
        if (!g4__audio_w(m, fn, user, &t, name, 0, 0, 0, 0, 0)) return 0;
        *dst[k] = g4__get(&t, 0);
    }
    return 1;
}

/* g4_model_load's part: every tensor of the tower when the config has an
   audio_config. A missing or misshapen tensor leaves the model loaded for
   text, with m->audio.error naming it (g4_audio_encode refuses then). The
   tensors go through fn: g4__bind when loading, or a caller's (make bench's
   random tower). */
static g4_result g4__audio_walk(g4_model *m, g4__weight_fn fn, void *user) {
    const g4_audio_config *a = &m->config.audio;
    g4__ageo g;
    char p[160], q[96];
    int i, ok = 1;
    memset(&m->audio, 0, sizeof m->audio);
    if (!a->present) { g4__seterr(m->audio.error, "the config has no audio_config"); return G4_OK; }
    g4__audio_geo(&g, m, 1);
    m->audio.layers = (g4_audio_layer_weights *)G4_MALLOC(sizeof(g4_audio_layer_weights) * (size_t)g.La);
    if (!m->audio.layers) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
    memset(m->audio.layers, 0, sizeof(g4_audio_layer_weights) * (size_t)g.La);
#define G4__AW(t, nm, nd, a0, a1, a2, a3) (ok = ok && g4__audio_w(m, fn, user, t, nm, nd, a0, a1, a2, a3))
#define G4__AP(fmt, x) (snprintf(p, sizeof p, fmt, x), p)
    G4__AW(&m->audio.layer0_conv, "model.audio_tower.subsample_conv_projection.layer0.conv.weight", 4, g.C0, 1, 3, 3);
    G4__AW(&m->audio.layer0_norm, "model.audio_tower.subsample_conv_projection.layer0.norm.weight", 1, g.C0, 0, 0, 0);
    G4__AW(&m->audio.layer1_conv, "model.audio_tower.subsample_conv_projection.layer1.conv.weight", 4, g.C1, g.C0, 3, 3);
    G4__AW(&m->audio.layer1_norm, "model.audio_tower.subsample_conv_projection.layer1.norm.weight", 1, g.C1, 0, 0, 0);
    G4__AW(&m->audio.input_proj_linear, "model.audio_tower.subsample_conv_projection.input_proj_linear.weight", 2, g.Ha,
           (int64_t)(g.C0 / 4) * g.C1, 0, 0);
    for (i = 0; ok && i < g.La; i++) {
        g4_audio_layer_weights *lw = &m->audio.layers[i];
        int f;
        for (f = 0; f < 2; f++) {
            g4_audio_ffn *ff = f ? &lw->feed_forward2 : &lw->feed_forward1;
            snprintf(q, sizeof q, "model.audio_tower.layers.%d.feed_forward%d", i, f + 1);
            G4__AW(&ff->pre_layer_norm, G4__AP("%s.pre_layer_norm.weight", q), 1, g.Ha, 0, 0, 0);
            G4__AW(&ff->post_layer_norm, G4__AP("%s.post_layer_norm.weight", q), 1, g.Ha, 0, 0, 0);
            ok = ok && g4__audio_cl(m, fn, user, &ff->ffw_layer_1, G4__AP("%s.ffw_layer_1", q), 4 * (int64_t)g.Ha, g.Ha);
            ok = ok && g4__audio_cl(m, fn, user, &ff->ffw_layer_2, G4__AP("%s.ffw_layer_2", q), g.Ha, 4 * (int64_t)g.Ha);
        }
        snprintf(q, sizeof q, "model.audio_tower.layers.%d", i);
        G4__AW(&lw->norm_pre_attn, G4__AP("%s.norm_pre_attn.weight", q), 1, g.Ha, 0, 0, 0);
        G4__AW(&lw->norm_post_attn, G4__AP("%s.norm_post_attn.weight", q), 1, g.Ha, 0, 0, 0);
        G4__AW(&lw->norm_out, G4__AP("%s.norm_out.weight", q), 1, g.Ha, 0, 0, 0);
        snprintf(q, sizeof q, "model.audio_tower.layers.%d.self_attn", i);
        ok = ok && g4__audio_cl(m, fn, user, &lw->q_proj, G4__AP("%s.q_proj", q), g.Ha, g.Ha);
        ok = ok && g4__audio_cl(m, fn, user, &lw->k_proj, G4__AP("%s.k_proj", q), g.Ha, g.Ha);
        ok = ok && g4__audio_cl(m, fn, user, &lw->v_proj, G4__AP("%s.v_proj", q), g.Ha, g.Ha);
        ok = ok && g4__audio_cl(m, fn, user, &lw->post, G4__AP("%s.post", q), g.Ha, g.Ha);
        G4__AW(&lw->relative_k_proj, G4__AP("%s.relative_k_proj.weight", q), 2, g.Ha, g.Ha, 0, 0);
        G4__AW(&lw->per_dim_scale, G4__AP("%s.per_dim_scale", q), 1, g.D, 0, 0, 0);
        snprintf(q, sizeof q, "model.audio_tower.layers.%d.lconv1d", i);
        G4__AW(&lw->lconv_pre_layer_norm, G4__AP("%s.pre_layer_norm.weight", q), 1, g.Ha, 0, 0, 0);
        G4__AW(&lw->conv_norm, G4__AP("%s.conv_norm.weight", q), 1, g.Ha, 0, 0, 0);
        ok = ok && g4__audio_cl(m, fn, user, &lw->linear_start, G4__AP("%s.linear_start", q), 2 * (int64_t)g.Ha, g.Ha);
        G4__AW(&lw->depthwise_conv1d, G4__AP("%s.depthwise_conv1d.weight", q), 3, g.Ha, 1, g.K, 0);
        ok = ok && g4__audio_cl(m, fn, user, &lw->linear_end, G4__AP("%s.linear_end", q), g.Ha, g.Ha);
    }
    G4__AW(&m->audio.output_proj, "model.audio_tower.output_proj.weight", 2, g.Pa, g.Ha, 0, 0);
    G4__AW(&m->audio.output_proj_bias, "model.audio_tower.output_proj.bias", 1, g.Pa, 0, 0, 0);
    G4__AW(&m->audio.embedding_projection, "model.embed_audio.embedding_projection.weight", 2, g.Ht, g.Pa, 0, 0);
#undef G4__AW
#undef G4__AP
    m->audio.loaded = ok;
    return G4_OK;
}

static g4_result g4__audio_bind(g4_model *m) { return g4__audio_walk(m, g4__bind, NULL); }

G4__DEF int g4_audio_tokens_max(int n_frames) {
    return n_frames < 1 ? 0 : ((n_frames + 1) / 2 + 1) / 2;
}

/* The arena, in floats (each part rounded up to 16 bytes). */
typedef struct {
    float *a0;      /* [T1][F1][C0] layer0's output */
    float *a1;      /* [T2][F2][C1] layer1's output */
    unsigned char *m1, *m2; /* [T1], [T2] the masks after each convolution */
    float *x;       /* [T2][Ha] the residual stream */
    float *h, *r;   /* [T2][Ha] a branch, a saved residual */
    float *wide;    /* [T2][4 Ha] the FFN's inner rows, linear_start's output */
    float *cin;     /* [T2][4 Ha] a clipped linear's clamped input */
    float *q;       /* [nb * chunk][Ha] the blocked queries (rows past T2 stay 0) */
    float *k, *v;   /* [T2][Ha] */
    float *pe;      /* [P][Ha] rel_pos_enc */
    float *rk;      /* [P][Ha] relative_k_proj(pe) */
    float *logit;   /* [threads][ctx] one query head's logits, per thread */
    float *out;     /* [T2][max(Pa, H)] output_proj's rows, then embed_audio's */
    float *outn;    /* [T2][Pa] the embedder's norm */
    float *pd;      /* [D] softplus(per_dim_scale) of the layer */
    float *lora_u;  /* [max(T2, P)][lora_rmax] a LoRA adapter's A x (>>adapter) */
    float *pack;    /* [threads][g4__pack_thread_floats()] the GEMM's packed weights */
    int threads;    /* the threads the arena was carved for */
    int bf16;       /* the bf16 mode (g4_audio_run.bf16) */
    g4_session mm;  /* the decoder's matmul on the run's pool (only its matmul fields are set) */
} g4__aarena;

/* The arena's parts, carved as the session's (64-byte aligned, red zones
   under G4_ASAN_ARENA); base NULL only sizes it. */
static uint64_t g4__audio_carve(g4__aarena *A, const g4__ageo *g, int threads, unsigned char *base) {
    g4__carver cv;
    int wide_out = g->Pa > g->Ht ? g->Pa : g->Ht;
    cv.base = base;
    cv.off = 0;
    cv.overflow = 0;
    cv.poison = 1;
    A->a0 = g4__take(&cv, (uint64_t)g->T1 * g->F1 * g->C0, sizeof(float));
    A->a1 = g4__take(&cv, (uint64_t)g->T2 * g->F2 * g->C1, sizeof(float));
    A->m1 = (unsigned char *)g4__take(&cv, (uint64_t)g->T1, 1);
    A->m2 = (unsigned char *)g4__take(&cv, (uint64_t)g->T2, 1);
    A->x = g4__take(&cv, (uint64_t)g->T2 * g->Ha, sizeof(float));
    A->h = g4__take(&cv, (uint64_t)g->T2 * g->Ha, sizeof(float));
    A->r = g4__take(&cv, (uint64_t)g->T2 * g->Ha, sizeof(float));
    A->wide = g4__take(&cv, (uint64_t)g->T2 * 4 * g->Ha, sizeof(float));
    A->cin = g4__take(&cv, (uint64_t)g->T2 * 4 * g->Ha, sizeof(float));
    A->q = g4__take(&cv, (uint64_t)g->nb * g->chunk * g->Ha, sizeof(float));
    A->k = g4__take(&cv, (uint64_t)g->T2 * g->Ha, sizeof(float));
    A->v = g4__take(&cv, (uint64_t)g->T2 * g->Ha, sizeof(float));
    A->pe = g4__take(&cv, (uint64_t)g->P * g->Ha, sizeof(float));
    A->rk = g4__take(&cv, (uint64_t)g->P * g->Ha, sizeof(float));
    A->logit = g4__take(&cv, (uint64_t)threads * (uint64_t)g->ctx, sizeof(float));
    A->out = g4__take(&cv, (uint64_t)g->T2 * wide_out, sizeof(float));
    A->outn = g4__take(&cv, (uint64_t)g->T2 * g->Pa, sizeof(float));
    A->pd = g4__take(&cv, (uint64_t)g->D, sizeof(float));
    A->lora_u = g4__take(&cv, (uint64_t)(g->T2 > g->P ? g->T2 : g->P) * (uint64_t)g->lora_rmax, sizeof(float));
    A->pack = g4__take(&cv, (uint64_t)threads * (uint64_t)g4__pack_thread_floats(), sizeof(float));
    A->threads = threads;
    return cv.overflow ? UINT64_MAX : cv.off;
}

/* y = x W^T on n rows: the decoder's matmul (g4__matmul: the packed SIMD GEMM
   with its rows split across the run's pool, else g4__matmul_ref), as the
   vision tower runs its linears. */
static void g4__amm(float *y, const float *x, const g4_tensor *w, int n, g4__aarena *A) {
    g4__matmul(&A->mm, y, x, w, n);
}

G4__DEF g4_result g4_audio_size_pool(const g4_model *m, int max_frames, const g4_pool *pool, size_t *bytes) {
    g4__ageo g;
    g4__aarena A;
    uint64_t need;
    if (!m || !bytes || !m->config.audio.present || max_frames < 1 || max_frames > (1 << 22)) return G4_ERR_INPUT;
    g4__audio_geo(&g, m, max_frames);
    need = g4__audio_carve(&A, &g, g4_pool_threads(pool), NULL);
    if (need > (uint64_t)SIZE_MAX) return G4_ERR_INPUT;
    *bytes = (size_t)need;
    return G4_OK;
}

G4__DEF g4_result g4_audio_size(const g4_model *m, int max_frames, size_t *bytes) {
    return g4_audio_size_pool(m, max_frames, NULL, bytes);
}

/* ---- the tower's ops (scalar) ---- */

static void g4__atap(g4_audio_run *run, const char *name, int layer, const float *x, int rows, int cols) {
    char full[96];
    if (!run || !run->tap) return;
    if (layer >= 0) snprintf(full, sizeof full, "audio_tower.layers.%d.%s", layer, name);
    else snprintf(full, sizeof full, "%s", name);
    run->tap(run->tap_user, full, layer, x, rows, cols, 0);
}

static float g4__clampf(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

/* torch.clamp(x, -gc, gc) on n values, in place */
static void g4__aclamp(float *x, size_t n, float gc) {
    size_t i;
    for (i = 0; i < n; i++) x[i] = g4__clampf(x[i], -gc, gc);
}

/* Gemma4ClippableLinear on n rows: clamp the input to [input_min,
   input_max] (into cin), x W^T, clamp the output to [output_min, output_max]. */
static void g4__aclip_linear(float *y, const float *x, const g4_clippable_linear *l, int n, g4__aarena *A) {
    size_t i, in = (size_t)l->linear.shape[1], out = (size_t)l->linear.shape[0];
    for (i = 0; i < (size_t)n * in; i++) A->cin[i] = g4__clampf(x[i], l->input_min, l->input_max);
    g4__amm(y, A->cin, &l->linear, n, A);
    for (i = 0; i < (size_t)n * out; i++) y[i] = g4__clampf(y[i], l->output_min, l->output_max);
}

static void g4__armsnorm(float *y, const float *x, const g4_tensor *w, int n, int cols, float eps) {
    int t;
    for (t = 0; t < n; t++) g4__rmsnorm(y + (size_t)t * cols, x + (size_t)t * cols, w, cols, eps);
}
/* bf16 mode: x[0, n) cast to bf16; float32 mode: nothing */
static void g4__acast(const g4__aarena *A, float *x, size_t n) {
    if (A->bf16) g4__bf16_round_range(x, 0, n);
}

/* ... cast (bf16 mode: type_as the bf16 input) */
static void g4__armsnorm_c(const g4__aarena *A, float *y, const float *x, const g4_tensor *w, int n, int cols, float eps) {
    g4__armsnorm(y, x, w, n, cols, eps);
    g4__acast(A, y, (size_t)n * (size_t)cols);
}

static float g4__silu(float x) { return x / (1.0f + g4__expf(-x)); }

/* ---- the bf16 mode's ops, as torch runs them on bf16 tensors (docs/bf16.md) ---- */

static void g4__layernorm_bf16(float *y, const float *x, const g4_tensor *w, const g4_tensor *b, int n, float eps); /* >>unified */


/* exp(x) as an ATen elementwise kernel computes it for the element at `place`
   of a loop of `total`: the vectorised body (32 bf16 values a step, Sleef's
   expf_u10: g4__expf_sleef) or the scalar tail, the last total % 32 (libm's
   expf, glibc's on the goldens' machine) */
static float g4__aexp_at(float x, size_t place, size_t total) {
    return place < (total & ~(size_t)31) ? g4__expf_sleef(x) : expf(x);
}

/* torch.clamp(x, -gc, gc) on a bf16 tensor: ATen casts the bounds to bf16 */
static float g4__agc(const g4__aarena *A, float gc) { return A->bf16 ? g4__bf16_round(gc) : gc; }

/* Gemma4RMSNorm on bf16 rows stored transposed (row t's value c at x[c * n +
   t]: lconv1d's conv_norm on the depthwise convolution's output, a transposed
   view): mean(x^2) over the strided dim is ATen's outer reduction, each row's
   squares summed in order in its cascade of 4 levels of 2^max(4, ceil(log2
   cols) / 4) terms; then / cols, + eps, 1 / sqrt, x * that * w, cast. y is
   [n][cols] (in order). */
static void g4__armsnorm_outer(float *y, const float *xT, const g4_tensor *w, int n, int cols, float eps) {
    int t, c, p = 4, lg = 0, i, j;
    while ((1 << lg) < cols) lg++;
    if (lg / 4 > p) p = lg / 4;
    for (t = 0; t < n; t++) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, inv, v;
        int step = 1 << p;
        for (i = 0; i + step <= cols;) {
            for (j = 0; j < step; j++, i++) { v = xT[(size_t)i * n + t]; acc[0] += v * v; }
            for (j = 1; j < 4; j++) {
                acc[j] += acc[j - 1];
                acc[j - 1] = 0.0f;
                if (i & ((step - 1) << (j * p))) break;
            }
        }
        for (; i < cols; i++) { v = xT[(size_t)i * n + t]; acc[0] += v * v; }
        inv = 1.0f / sqrtf((((acc[0] + acc[1]) + acc[2]) + acc[3]) / (float)cols + eps);
        for (c = 0; c < cols; c++) y[(size_t)t * cols + c] = g4__bf16_round((xT[(size_t)c * n + t] * inv) * g4__get(w, (size_t)c));
    }
}


/* Gemma4AudioSubSampleConvProjectionLayer: y [To][Fo][Co] from x [Ti][Fi][Ci]
   (time rows whose mask is 0 read as zeros): Conv2d 3x3, stride 2, padding 1,
   no bias; LayerNorm over Co (no bias); ReLU. */
typedef struct {
    float *y; const float *x; const unsigned char *mask; int Ti, Fi, Ci; const g4_tensor *conv, *norm; int Co; float eps;
    int bf16;
} g4__asub_job;

/* output time rows [t0, t1) (a range job: rows are independent, so the
   split across threads changes no bit) */
/* the bf16 mode's rows: Conv2d in bf16 as ATen's slow path runs it (im2col,
   then gemm_notrans_: each output's Ci * 9 products, in (ci, dt, df) order,
   zeros of the padding and masked rows included, summed by g4__sum4), cast;
   nn.LayerNorm in bf16 (g4__layernorm_bf16, no bias); ReLU */
static void g4__asub_rows_bf16(const g4__asub_job *j, size_t t0, size_t t1) {
    int Ti = j->Ti, Fi = j->Fi, Ci = j->Ci, Co = j->Co, Fo = (Fi + 1) / 2, k4 = (Ci * 9) & ~3, t, f, c, ci, dt, df, l;
    for (t = (int)t0; t < (int)t1; t++)
        for (f = 0; f < Fo; f++) {
            float *yc = j->y + ((size_t)t * Fo + f) * Co;
            for (c = 0; c < Co; c++) {
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (ci = 0, l = 0; ci < Ci; ci++)
                    for (dt = 0; dt < 3; dt++)
                        for (df = 0; df < 3; df++, l++) {
                            int ti = 2 * t - 1 + dt, fi = 2 * f - 1 + df;
                            float xv = (ti < 0 || ti >= Ti || !j->mask[ti] || fi < 0 || fi >= Fi) ? 0.0f
                                       : g4__bf16_round(j->x[((size_t)ti * Fi + fi) * Ci + ci]); /* (.to(conv dtype)) */
                            part[l < k4 ? l % 4 : 0] += xv * g4__get(j->conv, (((size_t)c * Ci + ci) * 3 + dt) * 3 + df);
                        }
                yc[c] = g4__bf16_round(((part[0] + part[1]) + part[2]) + part[3]);
            }
            g4__layernorm_bf16(yc, yc, j->norm, NULL, Co, j->eps);
            for (c = 0; c < Co; c++) yc[c] = yc[c] > 0.0f ? yc[c] : 0.0f;
        }
}

static void g4__asub_rows(void *ctx, size_t t0, size_t t1) {
    const g4__asub_job *j = (const g4__asub_job *)ctx;
    if (j->bf16) { g4__asub_rows_bf16(j, t0, t1); return; }
    float *y = j->y;
    const float *x = j->x;
    const unsigned char *mask = j->mask;
    const g4_tensor *conv = j->conv, *norm = j->norm;
    int Ti = j->Ti, Fi = j->Fi, Ci = j->Ci, Co = j->Co, Fo = (Fi + 1) / 2, t, f, c, ci, dt, df;
    float eps = j->eps;
    for (t = (int)t0; t < (int)t1; t++)
        for (f = 0; f < Fo; f++) {
            float *yc = y + ((size_t)t * Fo + f) * Co;
            double mean = 0.0, var = 0.0;
            float mu, inv;
            for (c = 0; c < Co; c++) {
                float acc = 0.0f;
                for (ci = 0; ci < Ci; ci++)
                    for (dt = 0; dt < 3; dt++) {
                        int ti = 2 * t - 1 + dt;
                        if (ti < 0 || ti >= Ti || !mask[ti]) continue;
                        for (df = 0; df < 3; df++) {
                            int fi = 2 * f - 1 + df;
                            if (fi < 0 || fi >= Fi) continue;
                            acc += x[((size_t)ti * Fi + fi) * Ci + ci] *
                                   g4__get(conv, (((size_t)c * Ci + ci) * 3 + dt) * 3 + df);
                        }
                    }
                yc[c] = acc;
                mean += acc;
            }
            mean /= Co;
            for (c = 0; c < Co; c++) var += ((double)yc[c] - mean) * ((double)yc[c] - mean);
            var /= Co;
            mu = (float)mean;
            inv = (float)(1.0 / sqrt(var + (double)eps));
            for (c = 0; c < Co; c++) {
                float v = (yc[c] - mu) * inv * g4__get(norm, (size_t)c);
                yc[c] = v > 0.0f ? v : 0.0f;
            }
        }
}

static void g4__asub_layer(float *y, const float *x, const unsigned char *mask, int Ti, int Fi, int Ci,
                           const g4_tensor *conv, const g4_tensor *norm, int Co, float eps, const g4__aarena *A) {
    g4__asub_job j;
    j.y = y; j.x = x; j.mask = mask; j.Ti = Ti; j.Fi = Fi; j.Ci = Ci; j.conv = conv; j.norm = norm; j.Co = Co; j.eps = eps;
    j.bf16 = A->bf16;
    g4__parallel_range(&A->mm, (size_t)(Ti + 1) / 2, (size_t)((Fi + 1) / 2) * (size_t)Co * (size_t)Ci * 9, g4__asub_rows, &j);
}

/* Gemma4AudioFeedForward on x (in place): x + residual_weight *
   post_layer_norm(clamp(ffw_layer_2(silu(ffw_layer_1(pre_layer_norm(clamp(x))))))). */
static void g4__affn(const g4_audio_ffn *ff, float *x, int n, const g4__ageo *g, const g4_audio_config *a,
                     g4__aarena *A, g4_audio_run *run, int layer, const char *name) {
    size_t i, nh = (size_t)n * g->Ha;
    float gc = g4__agc(A, a->gradient_clipping);
    char tn[64];
    for (i = 0; i < nh; i++) A->h[i] = g4__clampf(x[i], -gc, gc);
    g4__armsnorm_c(A, A->h, A->h, &ff->pre_layer_norm, n, g->Ha, 1e-6f);
    snprintf(tn, sizeof tn, "%s.pre_layer_norm", name); g4__atap(run, tn, layer, A->h, n, g->Ha);
    g4__aclip_linear(A->wide, A->h, &ff->ffw_layer_1, n, A);
    snprintf(tn, sizeof tn, "%s.ffw_layer_1", name); g4__atap(run, tn, layer, A->wide, n, 4 * g->Ha);
    if (A->bf16) /* torch's bf16 silu: x / (1 + exp(-x)) in float, exp by the element's place, cast */
        for (i = 0; i < 4 * nh; i++) A->wide[i] = g4__bf16_round(A->wide[i] / (1.0f + g4__aexp_at(-A->wide[i], i, 4 * nh)));
    else for (i = 0; i < 4 * nh; i++) A->wide[i] = g4__silu(A->wide[i]);
    g4__aclip_linear(A->h, A->wide, &ff->ffw_layer_2, n, A);
    snprintf(tn, sizeof tn, "%s.ffw_layer_2", name); g4__atap(run, tn, layer, A->h, n, g->Ha);
    g4__aclamp(A->h, nh, gc);
    g4__armsnorm_c(A, A->h, A->h, &ff->post_layer_norm, n, g->Ha, 1e-6f);
    snprintf(tn, sizeof tn, "%s.post_layer_norm", name); g4__atap(run, tn, layer, A->h, n, g->Ha);
    if (A->bf16) /* hidden_states *= residual_weight (cast), then += residual (cast) */
        for (i = 0; i < nh; i++) x[i] = g4__bf16_round(g4__bf16_round(A->h[i] * a->residual_weight) + x[i]);
    else for (i = 0; i < nh; i++) x[i] = A->h[i] * a->residual_weight + x[i];
    g4__atap(run, name, layer, x, n, g->Ha);
}

/* Gemma4AudioAttention: h [T2][Ha] (norm_pre_attn's output) -> A->h, the post
   projection's output. Queries are cut into blocks of `chunk` rows; block b's
   keys and values are the ctx rows from b*chunk - past (zero outside
   [0, T2)). A logit is q.k plus the Transformer-XL term q'.rk[c], where
   _rel_shift picks row r and column c of the [chunk][P] products by the flat
   index i*ctx + j = r*(ctx+1) + c (0 when c >= P; r < i only at a distance
   past the window, so at a masked logit), then soft-capped;
   masked as transformers' 5-D mask: the key must be a valid frame in
   [0, T2) at a distance q - k in [0, past) or (-future, 0). */
typedef struct {
    const g4__ageo *g; const g4_audio_config *a; g4__aarena *A; const unsigned char *valid; float *att; int n;
} g4__aatt_job;

/* the queries of part `part` of n_parts (rows of the flat block order b * chunk + i),
   each head on its own: a part's rows are independent, so the split changes no bit */
static void g4__aatt_part(void *ctx, int part, int n_parts) {
    const g4__aatt_job *jb = (const g4__aatt_job *)ctx;
    const g4__ageo *g = jb->g;
    const g4_audio_config *a = jb->a;
    g4__aarena *A = jb->A;
    const int Ha = g->Ha, D = g->D, ctx_n = g->ctx, n = jb->n;
    const float cap = A->bf16 ? g4__bf16_round(a->attention_logit_cap) : a->attention_logit_cap; /* (a bf16 buffer) */
    float *logit = A->logit + (size_t)part * (size_t)ctx_n;
    int q0 = (int)((int64_t)n * part / n_parts), q1 = (int)((int64_t)n * (part + 1) / n_parts), qpos, hd, j, d;
    for (qpos = q0; qpos < q1; qpos++) {
        int b = qpos / g->chunk, i = qpos % g->chunk;
        for (hd = 0; hd < g->NH; hd++) {
            const float *qv = A->q + (size_t)qpos * Ha + (size_t)hd * D;
            float mx = -INFINITY, sum = 0.0f, *o = jb->att + (size_t)qpos * Ha + (size_t)hd * D;
            for (j = 0; j < ctx_n; j++) {
                int kpos = b * g->chunk + j - g->past, dist = qpos - kpos;
                int f = i * ctx_n + j, r = f / (ctx_n + 1), c = f % (ctx_n + 1);
                float ac = 0.0f, bd = 0.0f, lg;
                if (kpos >= 0 && kpos < n) {
                    const float *kv = A->k + (size_t)kpos * Ha + (size_t)hd * D;
                    for (d = 0; d < D; d++) ac += qv[d] * kv[d];
                }
                if (c < g->P) {
                    const float *qr = A->q + ((size_t)b * g->chunk + r) * Ha + (size_t)hd * D;
                    const float *rk = A->rk + (size_t)c * Ha + (size_t)hd * D;
                    for (d = 0; d < D; d++) bd += qr[d] * rk[d];
                }
                lg = g4__tanhf((ac + bd) / cap) * cap;
                if (!(kpos >= 0 && kpos < n && jb->valid[kpos] &&
                      ((dist >= 0 && dist < g->past) || (dist < 0 && -dist < g->future))))
                    lg = a->attention_invalid_logits_value;
                logit[j] = lg;
                if (lg > mx) mx = lg;
            }
            if (A->bf16) { /* torch's float32 softmax (Sleef exp, lanes by key, e * (1 / sum)) */
                g4__softmax_torch(logit, ctx_n, 0, ctx_n);
                sum = 1.0f;
            } else
                for (j = 0; j < ctx_n; j++) {
                    logit[j] = g4__expf(logit[j] - mx);
                    sum += logit[j];
                }
            for (d = 0; d < D; d++) o[d] = 0.0f;
            for (j = 0; j < ctx_n; j++) {
                int kpos = b * g->chunk + j - g->past;
                float p = A->bf16 ? logit[j] : logit[j] / sum;
                if (kpos < 0 || kpos >= n) continue; /* a zero value row */
                for (d = 0; d < D; d++) o[d] += p * A->v[(size_t)kpos * Ha + (size_t)hd * D + d];
            }
        }
    }
}

static void g4__aattention(const g4_audio_layer_weights *lw, const float *h, int n, const unsigned char *valid,
                           const g4__ageo *g, const g4_audio_config *a, g4__aarena *A, g4_audio_run *run, int layer) {
    const int Ha = g->Ha, D = g->D;
    const float q_scale = (float)(pow((double)D, -0.5) / log(2.0));
    const float k_scale = (float)(log(1.0 + exp(1.0)) / log(2.0));
    g4__aatt_job jb;
    int t, d, hd;
    g4__aclip_linear(A->q, h, &lw->q_proj, n, A);
    g4__atap(run, "self_attn.q_proj", layer, A->q, n, Ha);
    g4__aclip_linear(A->k, h, &lw->k_proj, n, A);
    g4__atap(run, "self_attn.k_proj", layer, A->k, n, Ha);
    g4__aclip_linear(A->v, h, &lw->v_proj, n, A);
    g4__atap(run, "self_attn.v_proj", layer, A->v, n, Ha);
    memset(A->q + (size_t)n * Ha, 0, sizeof(float) * (size_t)(g->nb * g->chunk - n) * Ha);
    for (d = 0; d < D; d++) { /* F.softplus(per_dim_scale), with its threshold 20 (bf16: cast) */
        float pds = g4__get(&lw->per_dim_scale, (size_t)d);
        A->pd[d] = pds > 20.0f ? pds : log1pf(expf(pds));
        if (A->bf16) A->pd[d] = g4__bf16_round(A->pd[d]);
    }
    for (t = 0; t < n; t++)
        for (hd = 0; hd < g->NH; hd++)
            for (d = 0; d < D; d++) {
                size_t o = (size_t)t * Ha + (size_t)hd * D + d;
                A->q[o] = A->q[o] * q_scale * A->pd[d];
                A->k[o] = A->k[o] * k_scale;
            }
    g4__amm(A->rk, A->pe, &lw->relative_k_proj, g->P, A);
    g4__atap(run, "self_attn.relative_k_proj", layer, A->rk, g->P, Ha);
    jb.g = g; jb.a = a; jb.A = A; jb.valid = valid; jb.att = A->wide; jb.n = n; /* att [T2][Ha]: before post */
    g4__parallel(A->mm.cfg.pool, g4__aatt_part, &jb);
    g4__acast(A, A->wide, (size_t)n * Ha); /* attn_output.to(hidden_states.dtype) */
    g4__aclip_linear(A->h, A->wide, &lw->post, n, A);
    g4__atap(run, "self_attn.post", layer, A->h, n, Ha);
    g4__atap(run, "self_attn", layer, A->h, n, Ha);
}

/* Gemma4AudioLightConv1d on x (in place): x + linear_end(silu(conv_norm(clamp(
   causal depthwise conv(glu(linear_start(pre_layer_norm(x)))))))). */
static void g4__alconv(const g4_audio_layer_weights *lw, float *x, int n, const g4__ageo *g, const g4_audio_config *a,
                       g4__aarena *A, g4_audio_run *run, int layer) {
    const int Ha = g->Ha, K = g->K;
    int t, c, k;
    size_t i, nh = (size_t)n * Ha;
    g4__armsnorm_c(A, A->h, x, &lw->lconv_pre_layer_norm, n, Ha, a->rms_norm_eps);
    g4__atap(run, "lconv1d.pre_layer_norm", layer, A->h, n, Ha);
    g4__aclip_linear(A->wide, A->h, &lw->linear_start, n, A);
    g4__atap(run, "lconv1d.linear_start", layer, A->wide, n, 2 * Ha);
    for (t = 0; t < n; t++) /* glu: first half * sigmoid(second half) (bf16: ATen's loop runs each row of Ha,
                               its exp by the place in the row; cast) */
        for (c = 0; c < Ha; c++) {
            float u = A->wide[(size_t)t * 2 * Ha + c], gt = A->wide[(size_t)t * 2 * Ha + Ha + c];
            if (A->bf16) A->r[(size_t)t * Ha + c] = g4__bf16_round(u * (1.0f / (1.0f + g4__aexp_at(-gt, (size_t)c, (size_t)Ha))));
            else A->r[(size_t)t * Ha + c] = u * (1.0f / (1.0f + g4__expf(-gt)));
        }
    for (t = 0; t < n; t++) /* left-padded by K - 1: output t reads inputs t - K + 1 .. t (bf16: the slow
                               path's gemm_notrans_ per channel: 4 partial sums over k, the padding's zeros
                               included, cast) */
        for (c = 0; c < Ha; c++) {
            float acc = 0.0f, part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (k = 0; k < K; k++) {
                int ti = t - (K - 1) + k;
                if (A->bf16) { part[k < (K & ~3) ? k % 4 : 0] += (ti < 0 ? 0.0f : A->r[(size_t)ti * Ha + c]) * g4__get(&lw->depthwise_conv1d, (size_t)c * K + k); continue; }
                if (ti < 0) continue;
                acc += g4__get(&lw->depthwise_conv1d, (size_t)c * K + k) * A->r[(size_t)ti * Ha + c];
            }
            A->h[(size_t)t * Ha + c] = A->bf16 ? g4__bf16_round(((part[0] + part[1]) + part[2]) + part[3]) : acc;
        }
    g4__atap(run, "lconv1d.depthwise_conv1d", layer, A->h, n, Ha);
    g4__aclamp(A->h, nh, g4__agc(A, a->gradient_clipping));
    if (A->bf16) { /* the clamp keeps the convolution's transposed layout: conv_norm reduces over a strided dim */
        for (t = 0; t < n; t++) for (c = 0; c < Ha; c++) A->r[(size_t)c * n + t] = A->h[(size_t)t * Ha + c];
        g4__armsnorm_outer(A->h, A->r, &lw->conv_norm, n, Ha, a->rms_norm_eps);
    } else g4__armsnorm(A->h, A->h, &lw->conv_norm, n, Ha, a->rms_norm_eps);
    g4__atap(run, "lconv1d.conv_norm", layer, A->h, n, Ha);
    if (A->bf16) /* silu over that layout: an element's place is c * n + t */
        for (t = 0; t < n; t++)
            for (c = 0; c < Ha; c++) {
                float v = A->h[(size_t)t * Ha + c];
                A->h[(size_t)t * Ha + c] = g4__bf16_round(v / (1.0f + g4__aexp_at(-v, (size_t)c * n + t, nh)));
            }
    else for (i = 0; i < nh; i++) A->h[i] = g4__silu(A->h[i]);
    g4__aclip_linear(A->r, A->h, &lw->linear_end, n, A);
    g4__atap(run, "lconv1d.linear_end", layer, A->r, n, Ha);
    for (i = 0; i < nh; i++) x[i] = A->r[i] + x[i];
    g4__acast(A, x, nh);
    g4__atap(run, "lconv1d", layer, x, n, Ha);
}

G4__DEF g4_result g4_audio_encode(const g4_model *m, const float *features, const unsigned char *mask, int n_frames,
                                  void *arena, size_t arena_bytes, g4_audio_run *run, float *soft, int *n_soft) {
    char dummy[G4_ERROR_MAX], *err = run ? run->error : dummy;
    const g4_audio_config *a;
    g4__ageo g;
    g4__aarena A;
    uint64_t need;
    size_t i;
    int t, f, l, n, k, threads;
    if (n_soft) *n_soft = 0;
    if (!m || !n_soft || !soft) { g4__seterr(err, "g4_audio_encode: NULL model, soft or n_soft"); return G4_ERR_INPUT; }
    a = &m->config.audio;
    if (!a->present || !m->audio.loaded) { g4__seterr(err, "no audio tower: %s", m->audio.error); return G4_ERR_INPUT; }
    if (!features) { g4__seterr(err, "g4_audio_encode: NULL features"); return G4_ERR_INPUT; }
    if (!mask) {
        g4__seterr(err, "g4_audio_encode: features without a mask (input_features_mask); transformers would skip "
                   "the audio silently");
        return G4_ERR_INPUT;
    }
    if (n_frames < 1 || n_frames > (1 << 22)) { g4__seterr(err, "g4_audio_encode: %d feature frames", n_frames); return G4_ERR_INPUT; }
    if (!arena || ((uintptr_t)arena & 15)) { g4__seterr(err, "g4_audio_encode: the arena must be 16-byte aligned"); return G4_ERR_ARENA; }
    g4__audio_geo(&g, m, n_frames);
    threads = run ? g4_pool_threads(run->pool) : 1;
    if (threads > 1 && g4__audio_carve(&A, &g, threads, NULL) > (uint64_t)arena_bytes) threads = 1; /* sized for one */
    if ((need = g4__audio_carve(&A, &g, threads, NULL)) > (uint64_t)arena_bytes) {
        g4__seterr(err, "g4_audio_encode: %d frames need an arena of %llu bytes, got %zu", n_frames,
                   (unsigned long long)need, arena_bytes);
        return G4_ERR_ARENA;
    }
    for (i = 0; i < (size_t)n_frames * g.F; i++)
        if (!isfinite(features[i])) {
            g4__seterr(err, "g4_audio_encode: feature [%zu][%zu] is not finite", i / (size_t)g.F, i % (size_t)g.F);
            return G4_ERR_INPUT;
        }
    G4__ASAN_UNPOISON(arena, arena_bytes); /* red zones of an earlier carve of this memory */
    g4__audio_carve(&A, &g, threads, (unsigned char *)arena);
    memset(&A.mm, 0, sizeof A.mm); /* the decoder's matmul reads only these of its session */
    A.mm.model = m;
    A.mm.cfg = g4_session_config_init();
    A.mm.cfg.pool = threads > 1 ? run->pool : NULL;
    A.mm.cfg.bf16 = A.bf16 = run && run->bf16; /* the linears in torch's bf16 order, cast */
    A.mm.pack = A.pack;
    A.mm.pack_parts = threads;
    A.mm.lora_u = A.lora_u;
    n = g.T2;

    /* subsample_conv_projection: the features are one channel ([T][F][1]) */
    g4__asub_layer(A.a0, features, mask, g.T, g.F, 1, &m->audio.layer0_conv, &m->audio.layer0_norm, g.C0, a->rms_norm_eps, &A);
    for (t = 0; t < g.T1; t++) A.m1[t] = mask[2 * t] != 0;
    g4__atap(run, "audio_tower.subsample_conv_projection.layer0", -1, A.a0, g.T1, g.F1 * g.C0);
    g4__asub_layer(A.a1, A.a0, A.m1, g.T1, g.F1, g.C0, &m->audio.layer1_conv, &m->audio.layer1_norm, g.C1, a->rms_norm_eps, &A);
    for (t = 0; t < g.T2; t++) A.m2[t] = A.m1[2 * t];
    g4__atap(run, "audio_tower.subsample_conv_projection.layer1", -1, A.a1, g.T2, g.F2 * g.C1);
    g4__amm(A.x, A.a1, &m->audio.input_proj_linear, n, &A);
    g4__atap(run, "audio_tower.subsample_conv_projection.input_proj_linear", -1, A.x, n, g.Ha);
    g4__atap(run, "audio_tower.subsample_conv_projection", -1, A.x, n, g.Ha);

    /* rel_pos_enc: row p is distance P-1-p: [sin(d * inv_timescales), cos(...)] */
    {
        int half = g.Ha / 2;
        double inc = log(10000.0) / (double)(half - 1 > 1 ? half - 1 : 1);
        for (k = 0; k < g.P; k++)
            for (f = 0; f < half; f++) {
                float inv, s;
                if (A.bf16) { /* from_pretrained(dtype=bf16) casts the float32 inv_timescales buffer to bf16 */
                    inv = g4__bf16_round(expf((float)f * (float)-inc));
                    s = g4__bf16_round((float)(g.ctx / 2 - k) * inv);
                } else {
                    inv = expf((float)f * (float)-inc);
                    s = (float)(g.ctx / 2 - k) * inv;
                }
                A.pe[(size_t)k * g.Ha + f] = sinf(s);
                A.pe[(size_t)k * g.Ha + half + f] = cosf(s);
            }
        g4__acast(&A, A.pe, (size_t)g.P * g.Ha);
        g4__atap(run, "audio_tower.rel_pos_enc", -1, A.pe, g.P, g.Ha);
    }

    for (l = 0; l < g.La; l++) {
        const g4_audio_layer_weights *lw = &m->audio.layers[l];
        size_t nh = (size_t)n * g.Ha;
        float gc = g4__agc(&A, a->gradient_clipping);
        g4__affn(&lw->feed_forward1, A.x, n, &g, a, &A, run, l, "feed_forward1");
        memcpy(A.r, A.x, sizeof(float) * nh); /* residual */
        for (i = 0; i < nh; i++) A.h[i] = g4__clampf(A.x[i], -gc, gc);
        g4__armsnorm_c(&A, A.h, A.h, &lw->norm_pre_attn, n, g.Ha, 1e-6f);
        g4__atap(run, "norm_pre_attn", l, A.h, n, g.Ha);
        memcpy(A.x, A.h, sizeof(float) * nh); /* the attention's input (A.h is its output) */
        g4__aattention(lw, A.x, n, A.m2, &g, a, &A, run, l);
        g4__aclamp(A.h, nh, gc);
        g4__armsnorm_c(&A, A.h, A.h, &lw->norm_post_attn, n, g.Ha, 1e-6f);
        g4__atap(run, "norm_post_attn", l, A.h, n, g.Ha);
        for (i = 0; i < nh; i++) A.x[i] = A.h[i] + A.r[i];
        g4__acast(&A, A.x, nh);
        g4__alconv(lw, A.x, n, &g, a, &A, run, l);
        g4__affn(&lw->feed_forward2, A.x, n, &g, a, &A, run, l, "feed_forward2");
        g4__aclamp(A.x, nh, gc);
        g4__armsnorm_c(&A, A.x, A.x, &lw->norm_out, n, g.Ha, 1e-6f);
        g4__atap(run, "norm_out", l, A.x, n, g.Ha);
        if (run && run->tap) {
            char nm[48];
            snprintf(nm, sizeof nm, "audio_tower.layers.%d", l);
            run->tap(run->tap_user, nm, l, A.x, n, g.Ha, 0);
        }
    }

    /* output_proj (with bias), then embed_audio: weightless RMSNorm, projection */
    g4__matmul_bias(&A.mm, A.out, A.x, &m->audio.output_proj, &m->audio.output_proj_bias, n); /* bf16: addmm, cast */
    g4__atap(run, "audio_tower.output_proj", -1, A.out, n, g.Pa);
    g4__armsnorm_c(&A, A.outn, A.out, NULL, n, g.Pa, a->rms_norm_eps);
    g4__amm(A.out, A.outn, &m->audio.embedding_projection, n, &A);
    g4__atap(run, "embed_audio", -1, A.out, n, g.Ht);
    for (t = 0, k = 0; t < n; t++) /* padding stripped: the rows whose mask survived both convolutions */
        if (A.m2[t]) memcpy(soft + (size_t)k++ * g.Ht, A.out + (size_t)t * g.Ht, sizeof(float) * (size_t)g.Ht);
    *n_soft = k;
    return G4_OK;
}

/* ----------------------------------------------------- sampler >>sampler */

G4__DEF g4_sampler_config g4_sampler_config_init(void) {
    g4_sampler_config c;
    memset(&c, 0, sizeof c);
    c.temperature = 1.0f;
    c.top_p = 1.0f;
    c.repetition_penalty = 1.0f;
    return c;
}

static uint64_t g4__splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A uniform double in [0, 1) from xorshift64*. */
static double g4__rng_uniform(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    *s = x;
    return (double)((x * 0x2545f4914f6cdd1dULL) >> 11) * (1.0 / 9007199254740992.0);
}

G4__DEF void g4_sampler_reset(g4_sampler *s) {
    if (!s || !s->seen) return;
    memset(s->seen, 0, (size_t)s->vocab);
    s->rng = g4__splitmix64(s->cfg.seed);
    if (!s->rng) s->rng = 0x9e3779b97f4a7c15ULL;
}

G4__DEF void g4_sampler_free(g4_sampler *s) {
    if (!s) return;
    G4_FREE(s->idx); G4_FREE(s->prob); G4_FREE(s->seen);
    s->idx = NULL; s->prob = NULL; s->seen = NULL;
}

G4__DEF g4_result g4_sampler_init(g4_sampler *s, const g4_sampler_config *cfg, int vocab) {
    g4_sampler_config c;
    if (!s) return G4_ERR_INPUT;
    memset(s, 0, sizeof *s);
    c = cfg ? *cfg : g4_sampler_config_init();
    if (vocab < 1) { g4__seterr(s->error, "sampler: vocab %d must be positive", vocab); return G4_ERR_INPUT; }
    if (!(c.temperature >= 0.0f) || c.top_k < 0 || !(c.top_p > 0.0f && c.top_p <= 1.0f) ||
        !(c.min_p >= 0.0f && c.min_p <= 1.0f) || !(c.repetition_penalty > 0.0f)) {
        g4__seterr(s->error, "sampler: out of range (temperature %g >= 0, top_k %d >= 0, top_p %g in (0,1], "
                   "min_p %g in [0,1], repetition_penalty %g > 0)", (double)c.temperature, c.top_k, (double)c.top_p,
                   (double)c.min_p, (double)c.repetition_penalty);
        return G4_ERR_INPUT;
    }
    s->cfg = c;
    s->vocab = vocab;
    s->idx = (int32_t *)G4_MALLOC(sizeof(int32_t) * (size_t)vocab);
    s->prob = (float *)G4_MALLOC(sizeof(float) * (size_t)vocab);
    s->seen = (unsigned char *)G4_MALLOC((size_t)vocab);
    if (!s->idx || !s->prob || !s->seen) {
        g4_sampler_free(s);
        g4__seterr(s->error, "sampler: out of memory for a vocab of %d", vocab);
        return G4_ERR_NOMEM;
    }
    g4_sampler_reset(s);
    return G4_OK;
}

G4__DEF void g4_sampler_accept(g4_sampler *s, int32_t id) {
    if (s && s->seen && id >= 0 && id < s->vocab) s->seen[id] = 1;
}

/* "a comes later than b" in the candidates' order: smaller logit, or larger id on ties */
static int g4__cand_later(const float *logits, int32_t a, int32_t b) {
    return logits[a] < logits[b] || (logits[a] == logits[b] && a > b);
}

/* the heap below root in idx[0..n), the latest candidate on top */
static void g4__cand_sift(int32_t *idx, const float *logits, size_t root, size_t n) {
    for (;;) {
        size_t c = 2 * root + 1;
        int32_t tmp;
        if (c >= n) break;
        if (c + 1 < n && g4__cand_later(logits, idx[c + 1], idx[c])) c++;
        if (!g4__cand_later(logits, idx[c], idx[root])) break;
        tmp = idx[root]; idx[root] = idx[c]; idx[c] = tmp;
        root = c;
    }
}

/* Candidates sorted by logit, descending; ids ascending on ties (heap sort: no recursion,
   no comparator context needed). */
static void g4__cand_sort(int32_t *idx, const float *logits, size_t n) {
    size_t start, end;
    for (start = n / 2; start-- > 0;) g4__cand_sift(idx, logits, start, n);
    for (end = n; end-- > 1;) {
        int32_t tmp = idx[0]; idx[0] = idx[end]; idx[end] = tmp;
        g4__cand_sift(idx, logits, 0, end);
    }
}

/* The k-th largest logit (k <= n), by a size-k min-heap in s->prob. */
static float g4__kth_largest(float *heap, const float *x, int n, int k) {
    int i, size = 0;
    for (i = 0; i < n; i++) {
        float v = x[i];
        int j;
        if (size < k) {
            j = size++;
            while (j > 0 && v < heap[(j - 1) / 2]) { heap[j] = heap[(j - 1) / 2]; j = (j - 1) / 2; }
            heap[j] = v;
        } else if (v > heap[0]) {
            j = 0;
            for (;;) {
                int c = 2 * j + 1;
                if (c >= k) break;
                if (c + 1 < k && heap[c + 1] < heap[c]) c++;
                if (heap[c] >= v) break;
                heap[j] = heap[c];
                j = c;
            }
            heap[j] = v;
        }
    }
    return heap[0];
}

/* The sampler's candidates for these logits (modified in place): s->idx[0..n)
   and their unnormalised probabilities s->prob[0..n), *sum their total.
   Returns -2 then; the greedy choice (temperature 0) or -1 (error) else. */
static int32_t g4__sampler_cands(g4_sampler *s, float *logits, size_t *n_out, double *sum_out) {
    const g4_sampler_config *c;
    int V, i;
    size_t n = 0, k;
    double sum, maxl;
    *n_out = 0;
    *sum_out = 0;
    if (!s || !s->seen || !logits) return -1;
    c = &s->cfg;
    V = s->vocab;
    for (i = 0; i < V; i++)
        if (logits[i] != logits[i]) { g4__seterr(s->error, "sampler: logit %d is NaN", i); return -1; }
    if (c->repetition_penalty != 1.0f) /* transformers: divide positive logits, multiply negative ones */
        for (i = 0; i < V; i++)
            if (s->seen[i]) logits[i] = logits[i] < 0 ? logits[i] * c->repetition_penalty : logits[i] / c->repetition_penalty;
    if (c->temperature <= 0.0f) return g4_argmax(logits, V);
    if (c->temperature != 1.0f)
        for (i = 0; i < V; i++) logits[i] /= c->temperature;
    if (c->top_k > 0 && c->top_k < V) { /* keep logits >= the k-th largest (ties kept) */
        float kth = g4__kth_largest(s->prob, logits, V, c->top_k);
        for (i = 0; i < V; i++) if (logits[i] >= kth) s->idx[n++] = i;
    } else {
        for (i = 0; i < V; i++) s->idx[n++] = i;
    }
    if (c->top_p < 1.0f) g4__cand_sort(s->idx, logits, n);
    maxl = -HUGE_VAL;
    for (k = 0; k < n; k++) if (logits[s->idx[k]] > maxl) maxl = logits[s->idx[k]];
    if (maxl == -HUGE_VAL) { g4__seterr(s->error, "sampler: every logit is -inf"); return -1; }
    for (sum = 0, k = 0; k < n; k++) sum += (s->prob[k] = (float)exp(logits[s->idx[k]] - maxl));
    if (c->top_p < 1.0f) { /* transformers: drop the ascending prefix whose mass is <= 1 - top_p */
        double cum = 0;
        size_t keep = n;
        for (k = n; k-- > 1;) {
            cum += s->prob[k] / sum;
            if (cum > 1.0 - c->top_p) break;
            keep = k;
        }
        n = keep;
    }
    if (c->min_p > 0.0f) { /* drop p < min_p * p_max; p/p_max = exp(l - l_max) */
        size_t m = 0;
        for (k = 0; k < n; k++)
            if (s->prob[k] >= c->min_p) { s->idx[m] = s->idx[k]; s->prob[m] = s->prob[k]; m++; }
        n = m;
    }
    for (sum = 0, k = 0; k < n; k++) sum += s->prob[k];
    *n_out = n;
    *sum_out = sum;
    return -2;
}

G4__DEF int32_t g4_sampler_sample(g4_sampler *s, float *logits) {
    size_t n, k;
    double sum, acc, u;
    int32_t r = g4__sampler_cands(s, logits, &n, &sum);
    if (r != -2) return r;
    u = g4__rng_uniform(&s->rng) * sum;
    for (acc = 0, k = 0; k + 1 < n; k++) {
        acc += s->prob[k];
        if (u < acc) break;
    }
    return s->idx[k];
}

/* The distribution g4_sampler_sample draws from, dense: probs[V] (may be the
   logits buffer itself). Returns -2, or the greedy id / -1 as the sampler. */
static int32_t g4__sampler_dist(g4_sampler *s, float *logits, float *probs) {
    size_t n, k;
    double sum;
    int32_t r = g4__sampler_cands(s, logits, &n, &sum);
    if (r != -2) return r;
    memset(probs, 0, sizeof(float) * (size_t)s->vocab);
    for (k = 0; k < n; k++) probs[s->idx[k]] = (float)(s->prob[k] / sum);
    return -2;
}

/* Draws an id from a dense distribution with the sampler's random stream
   (mass: its total, which need not be 1) */
static int32_t g4__draw(g4_sampler *s, const float *probs, double mass) {
    double u = g4__rng_uniform(&s->rng) * mass, acc = 0;
    int i, last = -1;
    for (i = 0; i < s->vocab; i++) {
        if (probs[i] <= 0) continue;
        last = i;
        acc += probs[i];
        if (u < acc) return i;
    }
    return last;
}

/* ============================================================= >>backend */
/* BACKEND: how the scalar kernels (>>kernels) run fast - the SIMD twins (>>simd),
   the packed prefill GEMM (>>gemm), the bf16 dot-product kernel (>>bf16dot),
   the thread pool and the threaded matmul and elementwise loops (>>threads).
   Each computes what its scalar kernel computes (tested against it; its own
   comment gives its summation order). The model above reaches it through the
   declarations at the end of >>kernels. A first reading can skip it. */

/* ----------------------------------------------------------- SIMD >>simd */
/* SIMD twins (x86-64 AVX-512F or AVX2+FMA, or AArch64 NEON, chosen at compile
   time; on x86-64 build with -march=native). Every output element is accumulated lane-wise along `in` in
   the same order whatever the tile it is computed in, then reduced by one fixed
   horizontal sum: a position gives the same bits in a 1-token decode step and
   in a prefill chunk. The order differs from the scalar reference (tested
   against it within rounding). */
#if !defined(G4_NO_SIMD) && defined(__AVX512F__)
#ifdef G4__SIMD_EMULATED
#define G4__SIMD_NAME "avx512-emulated"
#define G4__IN_REGISTER(v) ((void)0)
#else
#define G4__SIMD_NAME "avx512"
#define G4__IN_REGISTER(v) __asm__("" : "+v"(v))
#endif
#define G4__VL 16
#define G4__TR 4
#define G4__TT 6
typedef __m512 g4__vec;
#define g4__vzero() _mm512_setzero_ps()
#define g4__vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define g4__vhsum(v) _mm512_reduce_add_ps(v)
/* 16 horizontal sums at once, each in g4__vhsum's operations and order (GCC's
   _mm512_reduce_add_ps, which clang's matches: the upper 8 lanes onto the
   lower, then 4 onto 4, then lanes 2, 3 onto 0, 1, then 1 onto 0), so the
   same bits: lane 4k + j of the result is the sum of v[4j + k]. Each level
   adds two vectors' halves side by side (45 shuffles and adds for 16 sums,
   where 16 g4__vhsum take about 130): a 4 x 6 GEMM tile's 24 sums measured
   4-6% of its time at in = 1536 (Zen 4, 2026-11-26). */
#define G4__VHSUM16 1
#define G4__VH_Z(a, b) _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0xEE), _mm512_shuffle_f32x4(a, b, 0x44)) /* [a hi 8 + lo 8 | b's] */
#define G4__VH_W(a, b) _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0xDD), _mm512_shuffle_f32x4(a, b, 0x88)) /* blocks' hi 4 + lo 4 */
#define G4__VH_Q(a, b) _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b)) /* lanes 0 + 2, 1 + 3, interleaved */
/* (inline: out of line, its 16 arguments went through the stack: 2.4% of a prefill) */
static G4__INLINE g4__vec g4__vhsum16(g4__vec v0, g4__vec v1, g4__vec v2, g4__vec v3, g4__vec v4, g4__vec v5, g4__vec v6, g4__vec v7,
                           g4__vec v8, g4__vec v9, g4__vec v10, g4__vec v11, g4__vec v12, g4__vec v13, g4__vec v14, g4__vec v15) {
    g4__vec w0 = G4__VH_W(G4__VH_Z(v0, v1), G4__VH_Z(v2, v3)), w1 = G4__VH_W(G4__VH_Z(v4, v5), G4__VH_Z(v6, v7));
    g4__vec w2 = G4__VH_W(G4__VH_Z(v8, v9), G4__VH_Z(v10, v11)), w3 = G4__VH_W(G4__VH_Z(v12, v13), G4__VH_Z(v14, v15));
    g4__vec q0 = G4__VH_Q(w0, w1), q1 = G4__VH_Q(w2, w3);
    return _mm512_add_ps(_mm512_shuffle_ps(q0, q1, 0x44), _mm512_shuffle_ps(q0, q1, 0xEE)); /* lanes (0 + 2, 1 + 3) */
}
/* VL elements of a float row at k (all VL present) */
static g4__vec g4__vload_w(const unsigned char *row, g4_dtype dt, size_t k) {
    if (dt == G4_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * k))), 16));
    if (dt == G4_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * k)));
    return _mm512_loadu_ps(row + 4 * k);
}
#define g4__vload_x(p) _mm512_loadu_ps(p)
#define g4__vstore(p, v) _mm512_storeu_ps(p, v)
#define g4__vset1(f) _mm512_set1_ps(f)
#define g4__vadd(a, b) _mm512_add_ps(a, b)
#define g4__vsub(a, b) _mm512_sub_ps(a, b)
#define g4__vmul(a, b) _mm512_mul_ps(a, b)
#define g4__vdiv(a, b) _mm512_div_ps(a, b)
#define g4__vabsmin(v, hi) _mm512_min_ps(_mm512_abs_ps(v), _mm512_set1_ps(hi))
#define g4__vifneg(z, a, b) _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ), b, a)
/* 2^n for integral n in [-126, 127] */
#define g4__vpow2(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#elif !defined(G4_NO_SIMD) && defined(__AVX2__) && defined(__FMA__)
#define G4__SIMD_NAME "avx2"
#define G4__VL 8
#define G4__TR 3
#define G4__TT 4
#define G4__IN_REGISTER(v) __asm__("" : "+x"(v))
typedef __m256 g4__vec;
#define g4__vzero() _mm256_setzero_ps()
#define g4__vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
static float g4__vhsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static g4__vec g4__vload_w(const unsigned char *row, g4_dtype dt, size_t k) {
    if (dt == G4_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * k))), 16));
#ifdef __F16C__
    if (dt == G4_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * k)));
#else
    if (dt == G4_F16) {
        float tmp[8];
        int j;
        for (j = 0; j < 8; j++) { uint16_t h; memcpy(&h, row + 2 * (k + j), 2); tmp[j] = g4__f16_to_f32(h); }
        return _mm256_loadu_ps(tmp);
    }
#endif
    return _mm256_loadu_ps((const float *)(const void *)(row + 4 * k));
}
#define g4__vload_x(p) _mm256_loadu_ps(p)
#define g4__vstore(p, v) _mm256_storeu_ps(p, v)
#define g4__vset1(f) _mm256_set1_ps(f)
#define g4__vadd(a, b) _mm256_add_ps(a, b)
#define g4__vsub(a, b) _mm256_sub_ps(a, b)
#define g4__vmul(a, b) _mm256_mul_ps(a, b)
#define g4__vdiv(a, b) _mm256_div_ps(a, b)
#define g4__vabsmin(v, hi) _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), _mm256_set1_ps(hi))
#define g4__vifneg(z, a, b) _mm256_blendv_ps(b, a, _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ))
#define g4__vpow2(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#elif !defined(G4_NO_SIMD) && defined(__aarch64__) && defined(__ARM_NEON)
#define G4__SIMD_NAME "neon"
#define G4__VL 4
#define G4__TR 4
#define G4__TT 6
#define G4__IN_REGISTER(v) __asm__("" : "+w"(v))
typedef float32x4_t g4__vec;
#define g4__vzero() vdupq_n_f32(0.0f)
#define g4__vfma(a, b, c) vfmaq_f32(c, a, b)
#define g4__vhsum(v) vaddvq_f32(v)
static g4__vec g4__vload_w(const unsigned char *row, g4_dtype dt, size_t k) {
    uint16_t h[4];
    if (dt == G4_F32) return vld1q_f32((const float *)(const void *)(row + 4 * k));
    memcpy(h, row + 2 * k, 8);
    if (dt == G4_BF16) return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(h), 16));
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}
#define g4__vload_x(p) vld1q_f32(p)
#define g4__vstore(p, v) vst1q_f32(p, v)
#define g4__vset1(f) vdupq_n_f32(f)
#define g4__vadd(a, b) vaddq_f32(a, b)
#define g4__vsub(a, b) vsubq_f32(a, b)
#define g4__vmul(a, b) vmulq_f32(a, b)
#define g4__vdiv(a, b) vdivq_f32(a, b)
#define g4__vabsmin(v, hi) vminq_f32(vabsq_f32(v), vdupq_n_f32(hi))
#define g4__vifneg(z, a, b) vbslq_f32(vcltq_f32(z, vdupq_n_f32(0.0f)), a, b)
#define g4__vpow2(n) vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23))
#endif

#ifdef G4__SIMD_NAME
/* G4__IN_REGISTER(v): an empty asm that makes the compiler hold v in a vector
   register. Without it GCC folds the activation load into each of its G4__TR
   FMAs, and the tile becomes load-bound (measured: 47 -> 80 GFLOP/s on one
   Zen 4 core). G4__UNROLL: unroll the tile's fixed-count loops so the
   accumulators are registers, not an array in memory (G4__UNROLL16: loops of
   16, bf16_fast's transposes). */
#if !defined(__GNUC__)
#undef G4__IN_REGISTER
#define G4__IN_REGISTER(v) ((void)0)
#define G4__UNROLL
#define G4__UNROLL16
#elif defined(__clang__)
#define G4__UNROLL _Pragma("clang loop unroll(full)")
#define G4__UNROLL16 _Pragma("clang loop unroll(full)")
#else
#define G4__UNROLL _Pragma("GCC unroll 8")
#define G4__UNROLL16 _Pragma("GCC unroll 16")
#endif

/* The tail (in % VL elements) is added after the horizontal sum, left to right. */
static float g4__tail(float acc, const float *x, const unsigned char *row, g4_dtype dt, int k, int in) {
    for (; k < in; k++) {
        uint16_t h;
        float f;
        if (dt == G4_BF16) { memcpy(&h, row + 2 * (size_t)k, 2); f = g4__bf16_to_f32(h); }
        else if (dt == G4_F16) { memcpy(&h, row + 2 * (size_t)k, 2); f = g4__f16_to_f32(h); }
        else memcpy(&f, row + 4 * (size_t)k, 4);
        acc += x[k] * f;
    }
    return acc;
}

/* The decode kernel (one token). Each row is one dependency chain of in / VL
   FMAs, which alone would bound a core at about 27 GB/s, so rows o and
   o + half run side by side: two chains, and two sequential weight streams
   half the range apart (one stream per row, as adjacent rows interleaved
   measured 35% slower; the two halves measured +23% on one core and reach
   the measured read bandwidth on two). Each row's own sum is unchanged.
   On AVX2 each stream is also prefetched G4__DECODE_PF bytes ahead, once per
   64-byte line, non-temporal (G4__DECODE_PREFETCH): on the Zen 3 decode of
   the E2B-shaped checkpoint went from 15.5-18.5 to 17.5-21.1 GB/s on two
   threads and from 9.6-10.4 to 11.6-12.9 on one (in turns, 2026-11-27;
   512-2048 bytes ahead alike, 4096 less, locality 2 less). AVX-512 and
   NEON: not measured, so not prefetched. */
#if !defined(G4__DECODE_PF) && G4__VL == 8 && defined(__GNUC__) && !defined(G4__NO_PREFETCH)
#define G4__DECODE_PF 1024
#endif
#ifdef G4__DECODE_PF /* (x86 prefetches never fault: past a matrix's end they are only wasted) */
#define G4__DECODE_PREFETCH(p) __builtin_prefetch((const unsigned char *)(p) + G4__DECODE_PF, 0, 0)
#else
#define G4__DECODE_PREFETCH(p) ((void)0)
#endif
static void g4__rows1(float *y, const float *x, const unsigned char *w, g4_dtype dt, size_t esz, int in, int o0, int o1) {
    int o, k, kv = in - in % G4__VL, half = (o1 - o0) / 2, m0 = o0 + half;
    for (o = o0; o < m0; o++) {
        const unsigned char *row = w + (size_t)o * (size_t)in * esz, *row1 = w + (size_t)(o + half) * (size_t)in * esz;
        g4__vec acc = g4__vzero(), acc1 = acc, xv;
        for (k = 0; k < kv; k += G4__VL) {
            if ((size_t)k * esz % 64 == 0) G4__DECODE_PREFETCH(row + (size_t)k * esz), G4__DECODE_PREFETCH(row1 + (size_t)k * esz);
            xv = g4__vload_x(x + k);
            G4__IN_REGISTER(xv);
            acc = g4__vfma(g4__vload_w(row, dt, (size_t)k), xv, acc);
            acc1 = g4__vfma(g4__vload_w(row1, dt, (size_t)k), xv, acc1);
        }
        y[o] = g4__tail(g4__vhsum(acc), x, row, dt, kv, in);
        y[o + half] = g4__tail(g4__vhsum(acc1), x, row1, dt, kv, in);
    }
    for (o = m0 + half; o < o1; o++) { /* an odd row out */
        const unsigned char *row = w + (size_t)o * (size_t)in * esz;
        g4__vec acc = g4__vzero();
        for (k = 0; k < kv; k += G4__VL) acc = g4__vfma(g4__vload_w(row, dt, (size_t)k), g4__vload_x(x + k), acc);
        y[o] = g4__tail(g4__vhsum(acc), x, row, dt, kv, in);
    }
}

/* ------------------------------------------------------------ GEMM >>gemm */
/* The prefill GEMM (n >= 2 tokens), BLIS/GotoBLAS-style: y[t][o] = sum_k
   x[t][k] W[o][k] for the thread's output rows.
   - Blocks: the tokens in blocks of nc, the rows in blocks of mc, `in` in
     blocks of kc. Each (mc rows x kc) block of W is packed once into the
     thread's buffer as float32 panels of G4__TR rows, [kc/VL][G4__TR][VL]: one
     contiguous stream, converted from bf16/f16 once per token block instead of
     once per register tile. The G4__TT activation rows of a tile are read in
     place (they are contiguous along k) and stay in L1 across the block's
     panels.
   - The micro-kernel is the register tile: G4__TR x G4__TT accumulators (24 of
     AVX-512's or NEON's 32, 12 of AVX2's 16), each step G4__TR weight and
     G4__TT activation loads for G4__TR * G4__TT FMAs.
   - The same bits as decode: each output element keeps VL lane sums along k
     in order, k = lane, lane + VL, ... (g4__rows1's chains). Between kc blocks
     a tile's accumulators wait in the buffer's partial sums (mc x nc x VL
     floats, in the order the tiles run: token tile, then row tile, so
     consecutive tiles read consecutive sums; by row tile first they had lain
     24 KB apart on AVX2) and resume unchanged, so the blocking, the chunk
     size and the thread split change no bit. Then one g4__vhsum and
     g4__tail, as decode.
   - One loop nest (g4__gemm), two tiles: the float32 tile (g4__micro) and
     the bf16 mode's in torch's order (g4__tile_torch, the faithful one: AVX2
     and AVX-512). They differ in the k a tile's step takes (VL and 64
     values) and in the partial sums an output keeps between kc blocks (VL
     and 64 floats); the blocks, the packing by a block's first tiles, the
     prefetching, the edges and the stores are the nest's. bf16_fast's
     VDPBF16PS kernel (>>bf16dot, avx512_bf16) keeps one output per lane and
     has its own nest (g4__gemm_pairs).
   Rows or tokens past an edge (R < G4__TR: the last row repeated; T <
   G4__TT: the last token repeated) are computed and not stored. */
#define G4__HAVE_GEMM 1
typedef struct { int mc, kc, nc; } g4__blocking; /* multiples of G4__TR, G4__VL, G4__TT */
/* AVX-512: kc 2048 and 4 panels (16 rows): 95-101 GFLOP/s on one Zen 4 core
   against 81-91 with kc 512 and 8 panels (E2B's shapes, 64 and 512 tokens,
   bench/gemm.c, 2026-11-26, machine at load 9; kc 1024-3072 with 8-24 rows
   within a few % of it): a tile's 24 partial sums go through the buffer
   once per kc, and a 1536-wide matmul now has none. AVX2 and NEON keep 512
   (AVX2 measured no gain from 768-1536 on the Zen 3). */
#ifdef G4_GEMM_KC /* given at compile time: no choice at run time */
#define G4__GEMM_KC_FIXED 1
#else
#define G4_GEMM_KC (G4__VL == 16 ? 2048 : 512)
#endif
/* AVX-512's kc at run time (g4__gemm_kc): up to 4096, which the buffer is sized for */
#if G4__VL == 16 && !defined(G4__GEMM_KC_FIXED)
#define G4__GEMM_KC_MAX 4096
#else
#define G4__GEMM_KC_MAX ((G4_GEMM_KC / G4__VL) * G4__VL)
#endif
#ifndef G4__GEMM_MC /* AVX2: 32 panels (measured +5% over 8 on E2B's shapes; 2, 4, 16, 64 slower than 32) */
#define G4__GEMM_MC ((G4__VL == 8 ? 32 : G4__VL == 16 ? 4 : 8) * G4__TR)
#endif
/* AVX2: 256 tokens, so a 512-token chunk packs (and prefetches) each block of
   weights twice, not 8 times: its matmuls measured +4-10% over 64 tokens on
   the E2B-shaped checkpoint (128 and 512 in between); partial sums 768 KB per
   thread. AVX-512 and NEON: 66 (11 tiles), so that a 64-token chunk is one
   block (g4__gemm splits n into equal blocks of at most nc): with 60, the
   AVX-512 GEMM ran 2-4% slower at 64 tokens (Zen 4, 2026-11-26); 132 measured
   the same as 66 at 512 tokens; partial sums 264 KB per thread */
#ifndef G4__GEMM_NC
#define G4__GEMM_NC (((G4__VL == 8 ? 256 : 66) / G4__TT) * G4__TT)
#endif
/* floats of one thread's buffer: the packed W block, then the partial sums */
#define G4__PACK_FLOATS(mc, kc, nc) ((size_t)(mc) * (size_t)(kc) + (size_t)(mc) * (size_t)(nc) * G4__VL)
static const g4__blocking g4__gemm_blocks = {G4__GEMM_MC, (G4_GEMM_KC / G4__VL) * G4__VL, G4__GEMM_NC};
/* kc for an L2 of l2 bytes (0: not reported), chosen once per session
   (g4_session_init; g4__matmul_part runs it). AVX-512: the largest power of
   two, 512 to G4__GEMM_KC_MAX, whose packed block (mc x kc floats) takes at
   most an eighth of L2: 2048 on the Zen 4's 1 MB, where 2048 measured best
   (kc 1024-3072 within a few %: the figures above), 4096 on a 2 MB L2. AVX2
   and NEON, an L2 not reported, or G4_GEMM_KC given: the compiled kc (AVX2
   measured no gain from 768-1536 on the Zen 3's 512 KB). The blocking
   changes no bit (g4__gemm), so neither does this choice. */
static int g4__gemm_kc(long l2) {
#if G4__VL == 16 && !defined(G4__GEMM_KC_FIXED)
    int kc = 512;
    if (l2 <= 0) return g4__gemm_blocks.kc;
    while (2 * kc <= G4__GEMM_KC_MAX && (long)G4__GEMM_MC * 2 * kc * (long)sizeof(float) <= l2 / 8) kc *= 2;
    return kc;
#else
    (void)l2;
    return g4__gemm_blocks.kc;
#endif
}
/* The bf16-faithful mode's GEMM tile in torch's order (g4__tile_torch; the
   AVX2 and AVX-512 builds): torch's order (g4__matmul_torch_ref) keeps 64
   lane sums per output, so a tile's partial sums are 64 / VL vectors per
   output, and kc is a multiple of 64 (below) */
#if G4__VL == 8 || G4__VL == 16
#define G4__TORCH_GEMM 1
#define G4__TORCH_MC (4 * G4__TR)
#define G4__TORCH_KC 1024
#define G4__TORCH_NC (8 * G4__TT)
#define G4__TORCH_FLOATS ((size_t)G4__TORCH_MC * G4__TORCH_KC + (size_t)G4__TORCH_MC * G4__TORCH_NC * 64)
static const g4__blocking g4__torch_blocks = {G4__TORCH_MC, G4__TORCH_KC, G4__TORCH_NC};
#else
#define G4__TORCH_GEMM 0
#define G4__TORCH_FLOATS 0
#endif
#define G4__PACK_FLOAT_MODE G4__PACK_FLOATS(G4__GEMM_MC, G4__GEMM_KC_MAX, G4__GEMM_NC)
/* one thread's share of the session's packing buffers, in 64-byte lines */
/* bf16_fast's blocks (g4__gemm_pairs, on VDPBF16PS): bf16 panels (mc * kc
   / 2 floats), no partial sums (they wait in y). Packing transposes the
   weights (g4__pack_pairs: 64 shuffles a KB), so a block of tokens as large
   as a 512-token chunk packs each weight once: nc 128 measured 5-10% slower
   (the packing 18% of the GEMM). mc one tile of rows (48), kc 2048: its panel
   (192 KB) and the next block's prefetch stay in the Zen 4's 1 MB L2; 96 and
   192 rows, or nc 256, within the noise or slower (one thread's 512-token
   bf16_fast prefill of the E2B-shaped checkpoint: 3.55-3.63 CPU-s with 48
   and 512; 3.65 with nc 256; 2026-11-27, Zen 4). */
#if G4__BF16DOT
#ifndef G4__PR
#define G4__PR 3 /* the tile's registers of 16 rows */
#endif
#ifndef G4__PT
#define G4__PT 8 /* and its tokens: 24 sums, 3 loads of W and 8 broadcasts of x a step */
#endif
#ifndef G4__BF16DOT_MC
#define G4__BF16DOT_MC (16 * G4__PR)
#endif
#ifndef G4__BF16DOT_KC
#define G4__BF16DOT_KC 2048
#endif
#ifndef G4__BF16DOT_NC
#define G4__BF16DOT_NC 512
#endif
static const g4__blocking g4__bf16dot_blocks = {G4__BF16DOT_MC, G4__BF16DOT_KC, G4__BF16DOT_NC};
#define G4__BF16DOT_FLOATS ((size_t)G4__BF16DOT_MC * G4__BF16DOT_KC / 2)
#else
#define G4__BF16DOT_FLOATS 0
#endif
#define G4__PACK_MAX2(a, b) ((a) > (b) ? (a) : (b))
/* (and the backward's g4__gemm_acc_blocks: G4__ACC_MC rows of kc 512 and G4__ACC_NC tokens' floats) */
#define G4__ACC_FLOATS G4__PACK_FLOATS((G4__VL == 8 ? 32 : 8) * G4__TR, 512, (64 / G4__TT) * G4__TT)
#define G4__PACK_THREAD \
    ((G4__PACK_MAX2(G4__PACK_MAX2(G4__PACK_FLOAT_MODE, G4__TORCH_FLOATS), G4__PACK_MAX2(G4__BF16DOT_FLOATS, G4__ACC_FLOATS)) + 15) / 16 * 16)

/* Prefetching the next block of W (the rows and k range the next block packs)
   while the current one runs: a cursor over its lines, a few per register
   tile (the block's line count over its tile count), so that the next
   block's first tiles read their weights from cache instead of stalling on
   memory. Without it those packing tiles took about 3.7x a plain tile's time
   (1400 against 370 cycles, 6144 x 1536 at 64 tokens, AVX2 EPYC); with it
   about 1.6x. The prefetches sit in the caller's loop: an out-of-line
   function that only prefetched was taken by GCC for a const function, and
   its calls were deleted. Half of a tile's prefetches go before it and half
   after: all of them in one burst (23 lines per tile at 64 tokens, kc 2048)
   stalled on the prefetch instruction itself, about half of g4__gemm's own
   time; split, the GEMM measured 2-6% faster on one Zen 4 core (E2B's
   shapes, 64 and 512 tokens, float32 and VDPBF16PS tiles, 2026-11-26). */
#if defined(__GNUC__) && !defined(G4__NO_PREFETCH)
#ifndef G4__PREFETCH_LOCALITY
#define G4__PREFETCH_LOCALITY 2
#endif
#define G4__PREFETCH(p) __builtin_prefetch(p, 0, G4__PREFETCH_LOCALITY)
#else
#define G4__PREFETCH(p) ((void)(p))
#endif
typedef struct { const unsigned char *p; size_t rowb, c, per_row, left, per_tile; } g4__pf;
/* rows [o, o + mc) of W at k in [k0, k0 + kc), spread over `tiles` calls of g4__pf_step */
static void g4__pf_start(g4__pf *f, const unsigned char *w, size_t esz, int in, int o, int mc, int k0, int kc, size_t tiles) {
    f->rowb = (size_t)in * esz;
    f->p = w + (size_t)o * f->rowb + (size_t)k0 * esz;
    f->per_row = ((size_t)kc * esz + 63) / 64 + 1; /* (+1: the range need not start on a line) */
    if ((size_t)k0 * esz + 64 * (f->per_row - 1) >= f->rowb) f->per_row--;
    f->c = 0;
    f->left = (size_t)mc * f->per_row;
    f->per_tile = (f->left + 2 * tiles - 1) / (2 * tiles); /* half before a tile, half after it */
}
static void g4__pf_step(g4__pf *f) {
    size_t q;
    for (q = 0; q < f->per_tile && f->left; q++, f->left--) {
        G4__PREFETCH(f->p + 64 * f->c);
        if (++f->c == f->per_row) f->c = 0, f->p += f->rowb;
    }
}

/* A tile's `last`: 0, partial sums into part; G4__SUMS, whole sums into sum;
   G4__SUMS_BF16, those rounded to bf16 (the bf16 mode's cast, g4__gemm's
   `cast`; rounded in the tile, before they leave its registers). */
enum { G4__SUMS = 1, G4__SUMS_BF16 = 2 };

/* The end of a 4 x 6 tile (AVX-512: g4__micro_vs): sum[u][r] =
   g4__vhsum(acc[r][u]) 16 at once, the same bits. sum's flat element 4 u + r:
   the first 16, then the last 8 (the other 8 slots repeat them); lane 4k + j
   of g4__vhsum16 sums its argument 4j + k, so acc goes in row by row. A
   macro, so that acc stays in registers. */
#if defined(G4__VHSUM16) && G4__TR == 4 && G4__TT == 6
/* g4__bf16_round on 16 lanes in registers, for the sums of a tile whose
   `last` is G4__SUMS_BF16: + 0x7fff + the kept lowest bit, the low half
   cleared; NaN kept as it is (and inf, which the sum leaves unchanged). Done
   on sum in memory after the tile, the rounding read back 512-bit stores
   (Zen 4 forwards them slowly): 3% of a 512-token bf16_fast prefill. */
static G4__INLINE __m512 g4__vbf16_round(__m512 v) {
    __m512i u = _mm512_castps_si512(v), one = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), one), _mm512_set1_epi32(-65536));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(INFINITY), _CMP_LT_OQ), v, _mm512_castsi512_ps(r));
}
#define G4__TILE_HSUMS(acc, sum, bf16)                                                                                    \
    do {                                                                                                                  \
        float hs_[16];                                                                                                    \
        g4__vec s0_ = g4__vhsum16((acc)[0][0], (acc)[0][1], (acc)[0][2], (acc)[0][3], (acc)[1][0], (acc)[1][1],           \
                                  (acc)[1][2], (acc)[1][3], (acc)[2][0], (acc)[2][1], (acc)[2][2], (acc)[2][3],           \
                                  (acc)[3][0], (acc)[3][1], (acc)[3][2], (acc)[3][3]);                                    \
        g4__vec s1_ = g4__vhsum16((acc)[0][4], (acc)[0][5], (acc)[0][4], (acc)[0][5], (acc)[1][4], (acc)[1][5],           \
                                  (acc)[1][4], (acc)[1][5], (acc)[2][4], (acc)[2][5], (acc)[2][4], (acc)[2][5],           \
                                  (acc)[3][4], (acc)[3][5], (acc)[3][4], (acc)[3][5]);                                    \
        if (bf16) s0_ = g4__vbf16_round(s0_), s1_ = g4__vbf16_round(s1_);                                                \
        g4__vstore(&(sum)[0][0], s0_);                                                                                    \
        g4__vstore(hs_, s1_);                                                                                             \
        memcpy(&(sum)[0][0] + 16, hs_, 8 * sizeof(float));                                                               \
    } while (0)
#endif

/* One tile over `steps` vectors of k, vs elements apart (VL; 64 in torch's
   order): wp a packed panel, xt[u] the tile's activation rows at the first
   vector. Starts from zero (first) or from the partial sums in part; ends in
   part, or (last) as horizontal sums. With wrow (a block's first tile), the
   weights come from their rows at k0 and are packed into wp on the way: the
   conversion overlaps the FMAs instead of running as a pass of its own
   (measured 15-20% of the GEMM's time). Out of line, so that its loop has the
   registers to itself (inlined, GCC spilled the row pointers: 5-8% slower). */
static G4__NOINLINE void g4__micro_vs(float *wp, const unsigned char *const *wrow, g4_dtype dt, int k0, int vs, const float *const *xt,
                                      int steps, float *part, int first, int last, float sum[G4__TT][G4__TR]) {
    g4__vec acc[G4__TR][G4__TT], wv[G4__TR], xv;
    const float *xp[G4__TT];
    int r, u, s;
    G4__UNROLL for (u = 0; u < G4__TT; u++) xp[u] = xt[u];
    G4__UNROLL for (r = 0; r < G4__TR; r++)
        G4__UNROLL for (u = 0; u < G4__TT; u++) acc[r][u] = first ? g4__vzero() : g4__vload_x(part + (r * G4__TT + u) * G4__VL);
    if (wrow && dt == G4_BF16) { /* bf16 weights apart: the dtype's branch and the row pointers out of the loop
                                    (GCC tested dt and reloaded a row pointer every step) */
        const unsigned char *wr[G4__TR];
        size_t i = 0;
        G4__UNROLL for (r = 0; r < G4__TR; r++) wr[r] = wrow[r] + 2 * (size_t)k0;
        for (s = 0; s < steps; s++, wp += G4__TR * G4__VL, i += (size_t)vs) {
            G4__UNROLL for (r = 0; r < G4__TR; r++) {
                wv[r] = g4__vload_w(wr[r], G4_BF16, i);
                G4__IN_REGISTER(wv[r]);
                g4__vstore(wp + r * G4__VL, wv[r]);
            }
            G4__UNROLL for (u = 0; u < G4__TT; u++) {
                xv = g4__vload_x(xp[u] + i);
                G4__IN_REGISTER(xv);
                G4__UNROLL for (r = 0; r < G4__TR; r++) acc[r][u] = g4__vfma(wv[r], xv, acc[r][u]);
            }
        }
    } else if (wrow)
        for (s = 0; s < steps; s++, wp += G4__TR * G4__VL) {
            G4__UNROLL for (r = 0; r < G4__TR; r++) {
                wv[r] = g4__vload_w(wrow[r], dt, (size_t)k0 + (size_t)s * (size_t)vs);
                G4__IN_REGISTER(wv[r]);
                g4__vstore(wp + r * G4__VL, wv[r]);
            }
            G4__UNROLL for (u = 0; u < G4__TT; u++) {
                xv = g4__vload_x(xp[u] + (size_t)s * (size_t)vs);
                G4__IN_REGISTER(xv);
                G4__UNROLL for (r = 0; r < G4__TR; r++) acc[r][u] = g4__vfma(wv[r], xv, acc[r][u]);
            }
        }
    else
        for (s = 0; s < steps; s++, wp += G4__TR * G4__VL) {
            G4__UNROLL for (r = 0; r < G4__TR; r++) {
                wv[r] = g4__vload_x(wp + r * G4__VL);
                G4__IN_REGISTER(wv[r]); /* one load, not one per FMA */
            }
            G4__UNROLL for (u = 0; u < G4__TT; u++) {
                xv = g4__vload_x(xp[u] + (size_t)s * (size_t)vs);
                G4__IN_REGISTER(xv);
                G4__UNROLL for (r = 0; r < G4__TR; r++) acc[r][u] = g4__vfma(wv[r], xv, acc[r][u]);
            }
        }
    if (last) {
#ifdef G4__TILE_HSUMS
        G4__TILE_HSUMS(acc, sum, last == G4__SUMS_BF16);
#else
        G4__UNROLL for (r = 0; r < G4__TR; r++) /* constant indices only, so acc stays in registers */
            G4__UNROLL for (u = 0; u < G4__TT; u++) sum[u][r] = g4__vhsum(acc[r][u]);
        if (last == G4__SUMS_BF16) g4__bf16_round_range(&sum[0][0], 0, G4__TT * G4__TR);
#endif
    } else {
        G4__UNROLL for (r = 0; r < G4__TR; r++)
            G4__UNROLL for (u = 0; u < G4__TT; u++) g4__vstore(part + (r * G4__TT + u) * G4__VL, acc[r][u]);
    }
}

/* the tile over consecutive vectors of k (vs = VL) */
static void g4__micro(float *wp, const unsigned char *const *wrow, g4_dtype dt, int k0, const float *const *xt, int steps,
                      float *part, int first, int last, float sum[G4__TT][G4__TR]) {
    g4__micro_vs(wp, wrow, dt, k0, G4__VL, xt, steps, part, first, last, sum);
}

/* the tile g4__gemm runs */
typedef enum {
    G4__TILE_F32,    /* g4__micro: float32 FMAs in decode's order (g4__rows1) */
    G4__TILE_TORCH   /* g4__tile_torch: the bf16-faithful mode in torch's order (G4__TORCH_GEMM builds) */
} g4__tile_kind; /* (bf16_fast's VDPBF16PS kernel has its own nest, g4__gemm_pairs) */
#if G4__TORCH_GEMM /* defined with their kernels below */
static G4__NOINLINE void g4__tile_torch(float *wp, const unsigned char *const *wrow, int pack, int k0, int kc, int in,
                                        const float *const *xt, float *part, int first, int last, float sum[G4__TT][G4__TR]);
#endif

/* The token blocks of a GEMM's nest: n tokens in equal blocks of at most nc,
   rounded up to the tile's tokens (tile). A 64-token chunk with nc 60 had run
   a block of 60 and one of 4, which packed every block of weights twice and
   prefetched the next one in 8 tiles instead of 80. */
static int g4__token_block(int n, int nc, int tile) {
    int blocks = (n + nc - 1) / nc;
    return ((n + blocks - 1) / blocks + tile - 1) / tile * tile;
}

/* y[t * ldy + o] = sum_k x[t * ldx + k] W[o][k] for t < n, o in [o0, o1),
   with the tile of `kind` (W bf16 for the bf16 mode's); ws: mc * kc + mc *
   nc * (the tile's partial sums per output) floats of b:
   G4__PACK_FLOATS(b->mc, b->kc, b->nc) but for G4__TILE_TORCH's 64
   (G4__TORCH_FLOATS for g4__torch_blocks). b->kc a multiple of the
   tile's step. cast: each y rounded to bf16 as it is stored (the bf16 mode's
   cast of a matmul's output, g4__act; the same bits as a pass over y after
   it, without that pass: about 1% of a bf16_fast prefill): by the tile
   (G4__SUMS_BF16), or after the tail where there is one. */
static void g4__gemm(float *y, size_t ldy, const float *x, size_t ldx, const g4_tensor *w, int n, int o0, int o1,
                     float *ws, const g4__blocking *b, g4__tile_kind kind, int cast) {
    int step = kind == G4__TILE_TORCH ? 64 : G4__VL; /* k per step of the tile */
    size_t lanes = kind == G4__TILE_TORCH ? 64 : G4__VL; /* partial sums per output */
    int in = (int)w->shape[1], kv = in - in % step, t0, i0, k0, t, o, r, u, pi, pk, pmc, pkc, ncb = g4__token_block(n, b->nc, G4__TT);
    int tails = kv < in && kind != G4__TILE_TORCH; /* the nest adds the tail (in % step), but g4__tile_torch's sums have it */
    g4_dtype dt = w->dtype;
    size_t esz = g4__dtype_size(dt);
    const unsigned char *base = (const unsigned char *)w->data;
    float *part = ws + (size_t)b->mc * (size_t)b->kc, sum[G4__TT][G4__TR];
    const float *xt[G4__TT];
    const unsigned char *wrow[G4__TR];
    g4__pf pf;
    for (t0 = 0; t0 < n; t0 += ncb) {
        int nc = n - t0 < ncb ? n - t0 : ncb;
        for (i0 = o0; i0 < o1; i0 += b->mc) {
            int mc = o1 - i0 < b->mc ? o1 - i0 : b->mc;
            for (k0 = 0; k0 == 0 || k0 < kv; k0 += b->kc) {
                int kc = kv - k0 < b->kc ? kv - k0 : b->kc, first = k0 == 0, last = k0 + kc >= kv;
                int fin = !last ? 0 : cast && !tails ? G4__SUMS_BF16 : G4__SUMS; /* the tiles' `last` (with a tail, cast after it) */
                /* the next block: the next k range, else the next rows, else the first rows again */
                if (!last) pk = k0 + kc, pi = i0;
                else pk = 0, pi = i0 + mc < o1 ? i0 + mc : o0;
                pmc = o1 - pi < b->mc ? o1 - pi : b->mc;
                pkc = kv - pk < b->kc ? kv - pk : b->kc;
                g4__pf_start(&pf, base, esz, in, pi, pmc, pk, pkc, (size_t)((nc + G4__TT - 1) / G4__TT) * (size_t)((mc + G4__TR - 1) / G4__TR));
                for (t = t0; t < t0 + nc; t += G4__TT) {
                    int T = t0 + nc - t < G4__TT ? t0 + nc - t : G4__TT;
                    for (u = 0; u < G4__TT; u++) xt[u] = x + (size_t)(t + (u < T ? u : T - 1)) * ldx + k0;
                    for (o = i0; o < i0 + mc; o += G4__TR) {
                        int R = i0 + mc - o < G4__TR ? i0 + mc - o : G4__TR;
                        float *pt = part + ((size_t)((t - t0) / G4__TT) * (size_t)(b->mc / G4__TR) + (size_t)((o - i0) / G4__TR)) *
                                               (G4__TR * G4__TT * lanes);
                        size_t panel = (size_t)(o - i0) * (size_t)kc; /* the tile's panel in ws, in W's packed elements */
                        g4__pf_step(&pf);
                        for (r = 0; r < G4__TR; r++) wrow[r] = base + (size_t)(o + (r < R ? r : R - 1)) * (size_t)in * esz;
                        switch (kind) { /* a block's first tiles (t == t0) pack its weights on the way */
#if G4__TORCH_GEMM
                        case G4__TILE_TORCH: g4__tile_torch(ws + panel, wrow, t == t0, k0, kc, in, xt, pt, first, fin, sum); break;
#endif
                        default: g4__micro(ws + panel, t == t0 ? wrow : NULL, dt, k0, xt, kc / G4__VL, pt, first, fin, sum);
                        }
                        g4__pf_step(&pf); /* the tile's second half of the prefetches */
                        if (last)
                            for (u = 0; u < T; u++) { /* token u's G4__TR outputs are consecutive in y and in sum */
                                float *yu = y + (size_t)(t + u) * ldy + (size_t)o;
                                if (R == G4__TR && !tails) memcpy(yu, sum[u], sizeof sum[u]);
                                else
                                    for (r = 0; r < R; r++) {
                                        yu[r] = tails ? g4__tail(sum[u][r], xt[u] - k0, wrow[r], dt, kv, in) : sum[u][r];
                                        if (tails && cast) yu[r] = g4__bf16_round(yu[r]);
                                    }
                            }
                    }
                }
            }
        }
    }
}

/* The backward's products (>>backward): y[t * ldy + c] += sum_k x[t * ldx + k]
   B(c, k) for t < n, c in [c0, c1), k < K, where B(c, k) = B[c * ldb + k]
   (kmajor 0: rows along k, as a weight's) or B[k * ldb + c] (kmajor 1: the
   weight itself in dX = dY W, k running over its rows). The panels and the
   micro-kernel of g4__gemm, in another loop order: tokens in blocks of nc,
   then k in blocks of kc, then columns in blocks of mc, so that a block of
   a k-major B is read along its rows (one pass over kc rows per token block,
   not one per mc columns). Each k block's sums go into y (one g4__vhsum per
   element and block, VL lane sums along k within it; the tail k >= K - K % VL
   left to right after the last block): a fixed order per element, whatever
   the thread split. kmajor 1 packs a block by transposing VL x VL tiles.
   ws: b->mc * b->kc floats (no partial sums). */
static float g4__elem(const unsigned char *p, g4_dtype dt, size_t i) {
    uint16_t h;
    float f;
    if (dt == G4_BF16) { memcpy(&h, p + 2 * i, 2); return g4__bf16_to_f32(h); }
    if (dt == G4_F16) { memcpy(&h, p + 2 * i, 2); return g4__f16_to_f32(h); }
    memcpy(&f, p + 4 * i, 4);
    return f;
}

/* the panels of columns [i0, i0 + mc) (rounded up to G4__TR, zeros past c1)
   at k in [k0, k0 + kc) of a k-major B: panel p holds column i0 + p G4__TR + r,
   k at [(k - k0) / VL][r][(k - k0) % VL], as g4__micro reads it */
#if defined(__AVX2__) && G4__VL == 8
#define g4__load8_w g4__vload_w
#elif defined(__AVX2__) && G4__VL == 16
/* 8 elements of a row at k as float32 (g4__vload_w's conversions on 8 lanes) */
static __m256 g4__load8_w(const unsigned char *row, g4_dtype dt, size_t k) {
    if (dt == G4_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * k))), 16));
    if (dt == G4_F16) /* (AVX-512F's conversion: F16C need not be enabled) */
        return _mm512_castps512_ps256(_mm512_cvtph_ps(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * k)))));
    return _mm256_loadu_ps((const float *)(const void *)(row + 4 * k));
}
#endif
static void g4__pack_kmajor(float *wp, const unsigned char *B, g4_dtype dt, size_t esz, size_t ldb, int i0, int mc,
                            int c1, int k0, int kc) {
    int rows = (mc + G4__TR - 1) / G4__TR * G4__TR, k, c, j;
#define G4__PK(c_, k_) (wp + (size_t)((c_) / G4__TR) * G4__TR * (size_t)kc + (size_t)((k_) / G4__VL) * G4__TR * G4__VL + \
                        (size_t)((c_) % G4__TR) * G4__VL + (size_t)((k_) % G4__VL))
    for (k = 0; k < kc; k += G4__VL) {
        const unsigned char *row = B + (size_t)(k0 + k) * ldb * esz;
#if defined(__AVX2__) && (G4__VL == 8 || G4__VL == 16)
        int h;
        c = 0;
        for (; c + 8 <= mc && i0 + c + 8 <= c1; c += 8)
            for (h = 0; h < G4__VL; h += 8) { /* 8 k x 8 columns, transposed in registers (AVX-512: twice, k and k + 8) */
            __m256 r[8], u[8], v[8];
            G4__UNROLL for (j = 0; j < 8; j++) r[j] = g4__load8_w(row + (size_t)(h + j) * ldb * esz, dt, (size_t)(i0 + c));
            u[0] = _mm256_unpacklo_ps(r[0], r[1]); u[1] = _mm256_unpackhi_ps(r[0], r[1]);
            u[2] = _mm256_unpacklo_ps(r[2], r[3]); u[3] = _mm256_unpackhi_ps(r[2], r[3]);
            u[4] = _mm256_unpacklo_ps(r[4], r[5]); u[5] = _mm256_unpackhi_ps(r[4], r[5]);
            u[6] = _mm256_unpacklo_ps(r[6], r[7]); u[7] = _mm256_unpackhi_ps(r[6], r[7]);
            v[0] = _mm256_shuffle_ps(u[0], u[2], 0x44); v[1] = _mm256_shuffle_ps(u[0], u[2], 0xEE);
            v[2] = _mm256_shuffle_ps(u[1], u[3], 0x44); v[3] = _mm256_shuffle_ps(u[1], u[3], 0xEE);
            v[4] = _mm256_shuffle_ps(u[4], u[6], 0x44); v[5] = _mm256_shuffle_ps(u[4], u[6], 0xEE);
            v[6] = _mm256_shuffle_ps(u[5], u[7], 0x44); v[7] = _mm256_shuffle_ps(u[5], u[7], 0xEE);
            G4__UNROLL for (j = 0; j < 4; j++) {
                _mm256_storeu_ps(G4__PK(c + j, k + h), _mm256_permute2f128_ps(v[j], v[j + 4], 0x20));
                _mm256_storeu_ps(G4__PK(c + j + 4, k + h), _mm256_permute2f128_ps(v[j], v[j + 4], 0x31));
            }
        }
#else
        c = 0;
#endif
        for (; c < rows; c++) /* the other columns one at a time; zeros past the edge */
            for (j = 0; j < G4__VL; j++)
                *G4__PK(c, k + j) = i0 + c < c1 ? g4__elem(row + (size_t)j * ldb * esz, dt, (size_t)(i0 + c)) : 0.0f;
    }
#undef G4__PK
}

/* its blocks: twice the forward's columns and 64-token blocks (measured
   +10-20% on E2B's backward shapes, AVX2), kc so that the packed block fits
   in the buffer of 64-token blocks (the forward's until it took 256 tokens
   on AVX2; kc sets the backward's order of sums, so it stays: computed from
   the forward's blocking of that day, 8 or 32 panels and kc 512, whatever
   the forward's is now: 512 on AVX2, 736 on AVX-512). The token blocks
   change no bit (the buffer holds no partial sums): AVX-512 takes 504 tokens
   (84 tiles), so that a 256-token sequence packs each block of a k-major B
   once, not 3 times (blocks of 120, 120 and 16): dX = dY W measured 85-87
   GFLOP/s against 76-80 on one Zen 4 core, dW = dY^T X the same 71-73 (E2B's
   shapes and the 32768-row lm_head, 256 tokens, 2026-11-26, load 5-6);
   1008 measured the same as 504 */
#define G4__ACC_MC ((G4__VL == 8 ? 32 : 8) * G4__TR)
#define G4__ACC_NC ((64 / G4__TT) * G4__TT)
static const g4__blocking g4__gemm_acc_blocks = {
    2 * G4__ACC_MC,
    G4__PACK_FLOATS(G4__ACC_MC, (512 / G4__VL) * G4__VL, G4__ACC_NC) / (2 * G4__ACC_MC) / G4__VL * G4__VL,
    G4__VL == 16 ? (504 / G4__TT) * G4__TT : 2 * G4__ACC_NC};

/* AVX-512: a tile's sums into y four columns at a time. The tile leaves its
   accumulators in part ([G4__TR][G4__TT][VL]), and the four of a token
   (G4__TR = 4 columns, G4__TT * VL floats apart) are summed side by side in
   the pairs of _mm512_reduce_add_ps (GCC's, the one g4__vhsum is: lanes i
   and i + 8, then i and i + 4, then 0 and 2, 1 and 3, then the two), so
   every element gets the bits of g4__vhsum, and y takes one 4-float add
   instead of four scalar ones. The scalar path (g4__vhsum and += per
   element) measured 30% of g4__gemm_acc's own time and 10% of g4__micro's
   in the training bench (perf, Zen 4). With it, on one Zen 4 core (CPU
   time, E2B's shapes and the lm_head, 2026-11-26, load 4-6): dW = dY^T X
   56-57 GFLOP/s against 38.5 at 64 tokens, 90-94 against 79-80 at 512;
   `gemma4 bench --grad` (2 threads, 256 tokens) 70-71 GFLOP per CPU-second
   against 62-64, 60% of the FMA peak (116-117). */
#if G4__VL == 16 && defined(__AVX2__) && G4__TR == 4
#define G4__ACC_SUM4 1
static void g4__acc_sum4(float *y, const float *p) {
    __m512 v0 = _mm512_loadu_ps(p), v1 = _mm512_loadu_ps(p + G4__TT * 16), v2 = _mm512_loadu_ps(p + 2 * G4__TT * 16);
    __m512 v3 = _mm512_loadu_ps(p + 3 * G4__TT * 16), a01, a23, s, c;
    /* lanes i + 8 and i: [column 0's 8 sums | column 1's] and [2's | 3's] */
    a01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0xEE), _mm512_shuffle_f32x4(v0, v1, 0x44));
    a23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0xEE), _mm512_shuffle_f32x4(v2, v3, 0x44));
    /* lanes i + 4 and i: column r's 4 sums in 128-bit lane r */
    s = _mm512_add_ps(_mm512_shuffle_f32x4(a01, a23, 0xDD), _mm512_shuffle_f32x4(a01, a23, 0x88));
    c = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));           /* lanes 0 + 2 and 1 + 3 of each */
    c = _mm512_add_ps(c, _mm512_permute_ps(c, 0xB1));           /* then the two */
    c = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12), c);
    _mm_storeu_ps(y, _mm_add_ps(_mm_loadu_ps(y), _mm512_castps512_ps128(c)));
}
#else
#define G4__ACC_SUM4 0
#endif

static void g4__gemm_acc(float *y, size_t ldy, const float *x, size_t ldx, const unsigned char *B, g4_dtype bdt,
                         size_t ldb, int kmajor, int K, int n, int c0, int c1, float *ws, const g4__blocking *b) {
    int kv = K - K % G4__VL, t0, i0, k0, t, o, r, u, k, ncb = g4__token_block(n, b->nc, G4__TT);
    size_t esz = g4__dtype_size(bdt);
    float sum[G4__TT][G4__TR];
#if G4__ACC_SUM4
    float part[G4__TR * G4__TT * G4__VL]; /* a tile's accumulators */
#endif
    const float *xt[G4__TT];
    const unsigned char *wrow[G4__TR];
    for (t0 = 0; t0 < n; t0 += ncb) {
        int nc = n - t0 < ncb ? n - t0 : ncb;
        for (k0 = 0; k0 == 0 || k0 < kv; k0 += b->kc) {
            int kc = kv - k0 < b->kc ? kv - k0 : b->kc, last = k0 + kc >= kv;
            for (i0 = c0; i0 < c1; i0 += b->mc) {
                int mc = c1 - i0 < b->mc ? c1 - i0 : b->mc;
                if (kmajor) g4__pack_kmajor(ws, B, bdt, esz, ldb, i0, mc, c1, k0, kc);
                for (t = t0; t < t0 + nc; t += G4__TT) {
                    int T = t0 + nc - t < G4__TT ? t0 + nc - t : G4__TT;
                    for (u = 0; u < G4__TT; u++) xt[u] = x + (size_t)(t + (u < T ? u : T - 1)) * ldx + k0;
                    for (o = i0; o < i0 + mc; o += G4__TR) {
                        int R = i0 + mc - o < G4__TR ? i0 + mc - o : G4__TR;
                        for (r = 0; r < G4__TR; r++) wrow[r] = B + (size_t)(o + (r < R ? r : R - 1)) * ldb * esz;
#if G4__ACC_SUM4
                        g4__micro(ws + (size_t)(o - i0) * (size_t)kc, !kmajor && t == t0 ? wrow : NULL, bdt, k0, xt, kc / G4__VL,
                                  part, 1, 0, sum);
                        if (R == G4__TR && !(last && kv < K)) {
                            for (u = 0; u < T; u++) g4__acc_sum4(y + (size_t)(t + u) * ldy + (size_t)o, part + u * G4__VL);
                            continue;
                        }
                        for (r = 0; r < R; r++) /* the edges and the tail: the same sums one at a time */
                            for (u = 0; u < T; u++) sum[u][r] = g4__vhsum(g4__vload_x(part + (r * G4__TT + u) * G4__VL));
#else
                        g4__micro(ws + (size_t)(o - i0) * (size_t)kc, !kmajor && t == t0 ? wrow : NULL, bdt, k0, xt, kc / G4__VL,
                                  NULL, 1, 1, sum);
#endif
                        for (r = 0; r < R; r++)
                            for (u = 0; u < T; u++) {
                                const float *xr = x + (size_t)(t + u) * ldx;
                                float acc = sum[u][r];
                                for (k = kv; last && k < K; k++) /* the tail, as g4__tail */
                                    acc += xr[k] * (kmajor ? g4__elem(B + (size_t)k * ldb * esz, bdt, (size_t)(o + r))
                                                           : g4__elem(wrow[r], bdt, (size_t)k));
                                y[(size_t)(t + u) * ldy + (size_t)(o + r)] += acc;
                            }
                    }
                }
            }
        }
    }
}

/* The float32 matmul on rows [o0, o1): decode rows for one token, the GEMM
   for more; ws: one thread's G4__PACK_FLOATS buffer. */
static void g4__matmul_rows(float *y, const float *x, const g4_tensor *w, int n, int o0, int o1, float *ws) {
    if (n == 1) g4__rows1(y, x, (const unsigned char *)w->data, w->dtype, g4__dtype_size(w->dtype), (int)w->shape[1], o0, o1);
    else g4__gemm(y, (size_t)w->shape[0], x, (size_t)w->shape[1], w, n, o0, o1, ws, &g4__gemm_blocks, G4__TILE_F32, 0);
}

static float g4__dot(const float *a, const float *b, int n) {
    g4__vec acc = g4__vzero();
    int k, kv = n - n % G4__VL;
    float s;
    for (k = 0; k < kv; k += G4__VL) acc = g4__vfma(g4__vload_x(a + k), g4__vload_x(b + k), acc);
    s = g4__vhsum(acc);
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

/* g4__dot_torch (>>ops) on vectors: its 64 lane sums (acc[r][l] holds
   elements 64 i + 8 r + l) are 64 / VL vectors over consecutive elements,
   each a product then a sum as the scalar loop; then its own end (tree and
   tails), so the same bits (the bf16 mode's attention scores) */
static float g4__dot_torch_v(const float *a, const float *b, int n) {
    g4__vec acc[64 / G4__VL];
    float s[8][8];
    int la = n & ~63, i, j;
    G4__UNROLL for (j = 0; j < 64 / G4__VL; j++) acc[j] = g4__vzero();
    for (i = 0; i < la; i += 64)
        G4__UNROLL for (j = 0; j < 64 / G4__VL; j++)
            acc[j] = g4__vadd(acc[j], g4__vmul(g4__vload_x(a + i + j * G4__VL), g4__vload_x(b + i + j * G4__VL)));
    for (j = 0; j < 64 / G4__VL; j++) g4__vstore(&s[0][0] + j * G4__VL, acc[j]);
    return g4__dot_torch_end(s, a, b, G4__B_F32, n);
}

/* y[i] += a * x[i], a product then a sum per element as the scalar loop
   (attention's weighted sum of values) */
static void g4__axpy(float *y, float a, const float *x, int n) {
    int i, nv = n - n % G4__VL;
    g4__vec av = g4__vset1(a);
    for (i = 0; i < nv; i += G4__VL) g4__vstore(y + i, g4__vadd(g4__vload_x(y + i), g4__vmul(av, g4__vload_x(x + i))));
    for (; i < n; i++) y[i] += a * x[i];
}

/* Attention's two loops over keys, several rows at a time (g4__attend).
   s[j * ss] = g4__dot(q, b[j], n) for j < 8: the 8 sums side by side (8 FMA
   chains instead of one), each in g4__dot's operations and order, so the
   same bits (a product is the same either way round: one q against 8 keys,
   or one key against 8 heads' q). */
static void g4__dot8(float *s, size_t ss, const float *q, const float *const *b, int n) {
    g4__vec acc[8], qv;
    int j, k, kv = n - n % G4__VL;
    G4__UNROLL for (j = 0; j < 8; j++) acc[j] = g4__vzero();
    for (k = 0; k < kv; k += G4__VL) {
        qv = g4__vload_x(q + k);
        G4__IN_REGISTER(qv);
        G4__UNROLL for (j = 0; j < 8; j++) acc[j] = g4__vfma(qv, g4__vload_x(b[j] + k), acc[j]);
    }
    G4__UNROLL for (j = 0; j < 8; j++) {
        float t = g4__vhsum(acc[j]);
        for (k = kv; k < n; k++) t += q[k] * b[j][k];
        s[(size_t)j * ss] = t;
    }
}

#ifdef G4__VHSUM16
/* g4__dot8 for two keys at once (AVX-512): s[j * ss] = g4__dot(qa, b[j], n)
   and s[j * ss + 1] = g4__dot(qb, b[j], n), each in g4__dot8's operations
   and order, the 16 horizontal sums at once (g4__vhsum16): the same bits, with
   16 FMA chains and 10 loads per 16 FMAs instead of 9 per 8. */
static void g4__dot8x2(float *s, size_t ss, const float *qa, const float *qb, const float *const *b, int n) {
    g4__vec a[8], c[8], va, vb, x;
    float tmp[16];
    int j, k, kv = n - n % G4__VL;
    G4__UNROLL for (j = 0; j < 8; j++) a[j] = c[j] = g4__vzero();
    for (k = 0; k < kv; k += G4__VL) {
        va = g4__vload_x(qa + k);
        vb = g4__vload_x(qb + k);
        G4__IN_REGISTER(va);
        G4__IN_REGISTER(vb);
        G4__UNROLL for (j = 0; j < 8; j++) {
            x = g4__vload_x(b[j] + k);
            G4__IN_REGISTER(x);
            a[j] = g4__vfma(va, x, a[j]);
            c[j] = g4__vfma(vb, x, c[j]);
        }
    }
    /* tmp[2j] the sum of a[j], tmp[2j + 1] of c[j] (lane 4k + j of g4__vhsum16 sums its argument 4j + k) */
    g4__vstore(tmp, g4__vhsum16(a[0], a[2], a[4], a[6], c[0], c[2], c[4], c[6], a[1], a[3], a[5], a[7], c[1], c[3], c[5], c[7]));
    for (j = 0; j < 8; j++) {
        float ta = tmp[2 * j], tb = tmp[2 * j + 1];
        for (k = kv; k < n; k++) ta += qa[k] * b[j][k];
        for (k = kv; k < n; k++) tb += qb[k] * b[j][k];
        s[(size_t)j * ss] = ta;
        s[(size_t)j * ss + 1] = tb;
    }
}
#endif

/* y[i] = sum_j p[j] v_j[i] for j < m, i < n, v_j = base + ((k0 + j) % cap) *
   stride (a KV ring's rows): from y = 0 (add: from y as it is), g4__axpy's
   product then sum per element, j in order, so the bits of m g4__axpy calls
   (a sum split into runs of rows, each run added on, is the same sum). 8
   vectors of y stay in registers across the m rows (g4__axpy loads and
   stores y once per row). */
static void g4__wsum_ring(float *y, const float *p, const float *base, size_t stride, int cap, int k0, int m, int n, int add) {
    int i, j, u, nv = n - n % G4__VL, pos;
    const float *v;
    for (i = 0; i + 8 * G4__VL <= nv; i += 8 * G4__VL) {
        g4__vec acc[8];
        G4__UNROLL for (u = 0; u < 8; u++) acc[u] = add ? g4__vload_x(y + i + u * G4__VL) : g4__vzero();
        for (j = 0, pos = k0 % cap, v = base + (size_t)pos * stride + i; j < m; j++) {
            g4__vec pv = g4__vset1(p[j]);
            G4__IN_REGISTER(pv);
            G4__UNROLL for (u = 0; u < 8; u++) acc[u] = g4__vadd(acc[u], g4__vmul(pv, g4__vload_x(v + u * G4__VL)));
            if (++pos == cap) pos = 0, v = base + i;
            else v += stride;
        }
        G4__UNROLL for (u = 0; u < 8; u++) g4__vstore(y + i + u * G4__VL, acc[u]);
    }
    for (; i < nv; i += G4__VL) { /* the vectors left, one at a time */
        g4__vec acc = add ? g4__vload_x(y + i) : g4__vzero();
        for (j = 0, pos = k0 % cap, v = base + (size_t)pos * stride + i; j < m; j++) {
            acc = g4__vadd(acc, g4__vmul(g4__vset1(p[j]), g4__vload_x(v)));
            if (++pos == cap) pos = 0, v = base + i;
            else v += stride;
        }
        g4__vstore(y + i, acc);
    }
    for (; i < n; i++) { /* the elements left */
        if (!add) y[i] = 0.0f;
        for (j = 0, pos = k0 % cap, v = base + (size_t)pos * stride + i; j < m; j++) {
            y[i] += p[j] * *v;
            if (++pos == cap) pos = 0, v = base + i;
            else v += stride;
        }
    }
}

/* g4__gelu on VL lanes: the same operations, so the same bits */
static g4__vec g4__gelu_v(g4__vec x) {
    static const float c[3] = {G4__EXP_C}, p[6] = {G4__EXP_P};
    g4__vec z = g4__vmul(g4__vset1(G4__GELU_K), g4__vadd(x, g4__vmul(g4__vset1(0.044715f), g4__vmul(g4__vmul(x, x), x))));
    g4__vec a = g4__vabsmin(g4__vadd(z, z), 87.0f), one = g4__vset1(1.0f), n, r, e, u;
    int j;
    n = g4__vsub(g4__vfma(a, g4__vset1(c[0]), g4__vset1(G4__EXP_MAGIC)), g4__vset1(G4__EXP_MAGIC));
    r = g4__vfma(n, g4__vset1(-c[1]), a);
    r = g4__vfma(n, g4__vset1(c[2]), r);
    e = g4__vset1(p[0]);
    for (j = 1; j < 6; j++) e = g4__vfma(e, r, g4__vset1(p[j]));
    e = g4__vadd(g4__vfma(e, g4__vmul(r, r), r), one);
    e = g4__vmul(e, g4__vpow2(n));
    u = g4__vsub(one, g4__vdiv(g4__vset1(2.0f), g4__vadd(e, one)));
    u = g4__vifneg(g4__vsub(g4__vset1(G4__TANH_ONE), a), one, u);
    return g4__vmul(g4__vmul(g4__vset1(0.5f), x), g4__vifneg(z, g4__vsub(one, u), g4__vadd(one, u)));
}

/* y[i] = gelu(x[i]) for i < n (in place is fine); a short tail goes through a
   zero-padded vector, so every element takes the same path */
static void g4__gelu_n(float *y, const float *x, size_t n) {
    size_t i, nv = n - n % G4__VL;
    float tmp[G4__VL];
    for (i = 0; i < nv; i += G4__VL) g4__vstore(y + i, g4__gelu_v(g4__vload_x(x + i)));
    if (i < n) {
        memset(tmp, 0, sizeof tmp);
        memcpy(tmp, x + i, sizeof(float) * (n - i));
        g4__vstore(tmp, g4__gelu_v(g4__vload_x(tmp)));
        memcpy(y + i, tmp, sizeof(float) * (n - i));
    }
}

#if G4__BF16DOT
/* ---------------------------------------------------- bf16 dot >>bf16dot */
/* The bf16 mode's fast kernel, opt-in (g4_session_config.bf16_fast), on CPUs
   with avx512_bf16 (bf16 weights only); without bf16_fast the mode keeps
   torch's order (g4__matmul_torch, g4__tile_torch) on these CPUs too. There
   every matmul input has already been rounded to bf16, so it converts to bf16
   exactly, and VDPBF16PS multiplies bf16 pairs exactly and adds them in
   float32: a lane adds w[2i+1] x[2i+1], then w[2i] x[2i] (with denormals
   flushed, as the instruction does). Twice the FMA rate of the float32 tile
   and no weight conversion. The matmul's order is this kernel's own, one
   chain per output along its row (g4__gemm_pairs below); attention's kernels
   have theirs (g4__attend's models). A CPU with avx512_bf16 runs and tests it natively; elsewhere make
   test runs its tests on tests/x86_emu.h, a plain-C model of the intrinsics. */
/* 32 bf16 values at p[k] (weights as stored, or the converted input) */
static __m512bh g4__ldbf(const void *p, int k) {
    return (__m512bh)_mm512_loadu_si512((const void *)((const unsigned char *)p + 2 * (size_t)k));
}

/* bf16_fast's scores for 8 heads' q (qb: as bf16, D apart) against keys ka
   and kb (rows of bf16 values, converted here exactly): s[j ss] and s[j ss +
   1] = g4__dot_pairs(q_j, ka) and (q_j, kb), the 16 sums at once
   (g4__vhsum16, _mm512_reduce_add_ps's order); D % 32 == 0. */
static void g4__dot8x2_bf16(float *s, size_t ss, const float *ka, const float *kb, const uint16_t *qb, int D) {
    __m512 a[8], c[8];
    __m512bh xa, xb;
    float tmp[16];
    int j, k;
    G4__UNROLL for (j = 0; j < 8; j++) a[j] = c[j] = _mm512_setzero_ps();
    for (k = 0; k < D; k += 32) {
        xa = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(ka + k + 16), _mm512_loadu_ps(ka + k));
        xb = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(kb + k + 16), _mm512_loadu_ps(kb + k));
        G4__UNROLL for (j = 0; j < 8; j++) {
            __m512bh qv = g4__ldbf(qb + (size_t)j * (size_t)D, k);
            a[j] = _mm512_dpbf16_ps(a[j], qv, xa);
            c[j] = _mm512_dpbf16_ps(c[j], qv, xb);
        }
    }
    /* tmp[2j] the sum of a[j], tmp[2j + 1] of c[j] (lane 4k + j of g4__vhsum16 sums its argument 4j + k) */
    _mm512_storeu_ps(tmp, g4__vhsum16(a[0], a[2], a[4], a[6], c[0], c[2], c[4], c[6], a[1], a[3], a[5], a[7], c[1], c[3], c[5], c[7]));
    for (j = 0; j < 8; j++) s[(size_t)j * ss] = tmp[2 * j], s[(size_t)j * ss + 1] = tmp[2 * j + 1];
}

/* bf16_fast's softmax: g4__softmax_torch(x, n, 0, n) (torch's float32 CPU
   softmax: Sleef's expf, 8 lane sums), the same bits on 16 lanes. The max
   takes a lane-wise x > max from x[0], so NaN never wins, as in the scalar
   loop (the lanes can only disagree on which zero, +0 or -0, is the max, and
   x - (+0) and x - (-0) give the same exp). exp: g4__expf_sleef's operations
   lane by lane (lrintf: VCVTPS2DQ under the default rounding), a vector
   holding a value outside its range or NaN through g4__expf_sleef itself.
   Lane l of the sum takes x[16 m + l] then x[16 m + 8 + l]: the 8 lanes'
   order. */
static void g4__softmax_torch_v(float *x, int n) {
    const __m512 lg = _mm512_set1_ps(1.442695040888963407359924681001892137f), lo = _mm512_set1_ps(-104.0f), hi = _mm512_set1_ps(100.0f);
    __m512 mv, acc = _mm512_setzero_ps();
    float mx, lanes[16], inv;
    int i, l, nv = n - n % 16;
    if (n < 16) { g4__softmax_torch(x, n, 0, n); return; }
    mv = _mm512_set1_ps(x[0]);
    for (i = 0; i < nv; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        mv = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mv, v, _CMP_LT_OQ), mv, v);
    }
    _mm512_storeu_ps(lanes, mv);
    for (mx = lanes[0], l = 1; l < 16; l++) if (lanes[l] > mx) mx = lanes[l];
    for (i = nv; i < n; i++) if (x[i] > mx) mx = x[i];
    for (i = 0; i < nv; i += 16) {
        __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(mx)), s, u;
        __m512i q, q1;
        if ((_mm512_cmp_ps_mask(lo, d, _CMP_LT_OQ) & _mm512_cmp_ps_mask(d, hi, _CMP_LT_OQ)) != 0xffff) {
            for (l = 0; l < 16; l++) x[i + l] = g4__expf_sleef(x[i + l] - mx);
        } else {
            q = _mm512_cvtps_epi32(_mm512_mul_ps(d, lg));
            s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(-0.693145751953125f), d);
            s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(-1.428606765330187045e-06f), s);
            u = _mm512_set1_ps(0.000198527617612853646278381f);
            u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0.00139304355252534151077271f));
            u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0.00833336077630519866943359f));
            u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0.0416664853692054748535156f));
            u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0.166666671633720397949219f));
            u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0.5f));
            u = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_mul_ps(s, s), u, s));
            q1 = _mm512_srai_epi32(q, 1);
            u = _mm512_mul_ps(u, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(q1, _mm512_set1_epi32(127)), 23)));
            u = _mm512_mul_ps(u, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(q, q1), _mm512_set1_epi32(127)), 23)));
            _mm512_storeu_ps(x + i, u);
        }
        u = _mm512_loadu_ps(x + i);
        acc = _mm512_add_ps(acc, u);                                /* lanes 0-7: x[16 m + l] */
        acc = _mm512_add_ps(acc, _mm512_shuffle_f32x4(u, u, 0xEE)); /* then x[16 m + 8 + l] */
    }
    for (i = nv; i < n; i++) x[i] = g4__expf_sleef(x[i] - mx);
    _mm512_storeu_ps(lanes, acc);
    for (i = nv; i < n; i++) lanes[i % 8] += x[i];
    inv = 1.0f / g4__hsum8(lanes);
    for (i = 0; i < nv; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(inv)));
    for (i = nv; i < n; i++) x[i] *= inv;
}

/* bf16_fast's p v for G heads (g4__attend_blocked), g4__wsum_pairs's bits
   on VDPBF16PS, D % 16 == 0. Each head's p becomes pairs in place: word j / 2
   of its row holds p[j]'s bf16 bits low and p[j + 1]'s high (exact: p holds
   bf16 values). A pair of value rows makes one bf16 vector the same way, v[k]'s
   bits >> 16 | v[k + 1]'s (bf16 values too), built once for the G heads:
   lane i then adds p[k + 1] v[k + 1][i], then p[k] v[k][i], as
   g4__dpbf16_lane. Runs of G4__ATT_KEYS keys (even, so the pairs do not
   move) against 32 outputs and 8 heads at a time: 16 accumulators. Each
   head's sums are its own, so any G gives the same bits (decode runs G = 1). */
static void g4__wsum_bf16(float *out, float *p, int G, const float *vbase, size_t stride, int cap, int lo, int L, int D) {
    int h, h0, j, c, i, u, g;
    for (h = 0; h < G; h++) {
        float *ph = p + (size_t)h * (size_t)L;
        for (j = 0; j < L; j += 2) {
            uint32_t a, b = 0;
            memcpy(&a, ph + j, 4);
            if (j + 1 < L) memcpy(&b, ph + j + 1, 4);
            a = a >> 16 | (b & 0xffff0000u);
            memcpy(ph + j / 2, &a, 4);
        }
    }
    for (c = 0; c < L; c += G4__ATT_KEYS) {
        int m = L - c < G4__ATT_KEYS ? L - c : G4__ATT_KEYS;
        for (h0 = 0; h0 < G; h0 += 8)
            for (i = 0, g = G - h0 < 8 ? G - h0 : 8; i < D; i += 32) {
                int w = D - i < 32 ? 1 : 2; /* vectors of 16 outputs: 2, or 1 at a D % 32 == 16 end */
                __m512 acc[8][2];
                G4__UNROLL for (h = 0; h < 8; h++)
                    G4__UNROLL for (u = 0; u < 2; u++)
                        acc[h][u] = c > 0 && h < g && u < w ? _mm512_loadu_ps(out + (size_t)(h0 + h) * (size_t)D + i + 16 * u)
                                                            : _mm512_setzero_ps();
                for (j = 0; j < m; j += 2) {
                    const float *v0 = vbase + (size_t)((lo + c + j) % cap) * stride + i, *v1 = vbase + (size_t)((lo + c + j + 1) % cap) * stride + i;
                    __m512bh vv[2];
                    G4__UNROLL for (u = 0; u < 2; u++) {
                        __m512i lo16 = u < w ? _mm512_srli_epi32(_mm512_loadu_si512((const void *)(v0 + 16 * u)), 16) : _mm512_setzero_si512();
                        vv[u] = (__m512bh)(j + 1 < m && u < w ? _mm512_or_si512(lo16, _mm512_loadu_si512((const void *)(v1 + 16 * u))) : lo16);
                    }
                    G4__UNROLL for (h = 0; h < 8; h++) {
                        uint32_t pr;
                        __m512bh pv;
                        if (h >= g) break;
                        memcpy(&pr, p + (size_t)(h0 + h) * (size_t)L + (size_t)(c + j) / 2, 4);
                        pv = (__m512bh)_mm512_set1_epi32((int)pr);
                        acc[h][0] = _mm512_dpbf16_ps(acc[h][0], pv, vv[0]);
                        acc[h][1] = _mm512_dpbf16_ps(acc[h][1], pv, vv[1]);
                    }
                }
                G4__UNROLL for (h = 0; h < 8; h++)
                    G4__UNROLL for (u = 0; u < 2; u++)
                        if (h < g && u < w) _mm512_storeu_ps(out + (size_t)(h0 + h) * (size_t)D + i + 16 * u, acc[h][u]);
            }
    }
}

/* The input rows to bf16, once per matmul (exact:
   they are bf16 values already). */
static void g4__to_bf16(uint16_t *xb, const float *x, int n, int in) {
    int t, k, kv = in - in % 32;
    for (t = 0; t < n; t++) {
        for (k = 0; k < kv; k += 32) {
            const float *p = x + (size_t)t * (size_t)in + k;
            _mm512_storeu_si512((void *)(xb + (size_t)t * (size_t)in + k),
                                (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p)));
        }
        for (; k < in; k++) { /* the tail (x already holds bf16 values: its high halves) */
            uint32_t u;
            memcpy(&u, x + (size_t)t * (size_t)in + k, 4);
            xb[(size_t)t * (size_t)in + k] = (uint16_t)(u >> 16);
        }
    }
}

/* g4__to_bf16 on tokens [t0, t1) (a range job: g4__matmul_cast shares it
   across the session's threads) */
typedef struct { uint16_t *xb; const float *x; int in; } g4__to_bf16_job;
static void g4__to_bf16_range(void *ctx, size_t t0, size_t t1) {
    const g4__to_bf16_job *j = (const g4__to_bf16_job *)ctx;
    g4__to_bf16(j->xb + t0 * (size_t)j->in, j->x + t0 * (size_t)j->in, (int)(t1 - t0), j->in);
}

/* bf16_fast's matmul: one output per lane. y[o] for a token is one chain
   along W's row o in pairs of k: acc = 0, then for each pair p in order
   acc = acc + W[o][2p+1] x[2p+1] + W[o][2p] x[2p] as a lane of VDPBF16PS adds
   them (g4__dpbf16_lane), then the tail (in odd: the last k) as g4__tail adds
   it. Sixteen rows ride in a register's 16 lanes, so no output is summed
   across lanes (no horizontal sums), and the chain is the same whatever the
   blocking, the chunk or the thread split: decode transposes 16 rows' pairs
   as it reads them (g4__pairs16), prefill packs them so into panels
   (g4__pack_pairs) for its tile (g4__tile_pairs), which broadcasts each
   token's pair of x against G4__PR registers of rows. */

/* 16 x 16 dwords transposed in registers: lane j of r[i] -> lane i of r[j] */
static G4__INLINE void g4__transpose16(__m512 r[16]) {
    __m512 a[16], b[16];
    int i, j;
    G4__UNROLL for (i = 0; i < 8; i++) { /* rows 2i, 2i + 1 interleaved: each 128-bit block (r0 c, r1 c, r0 c+1, r1 c+1) */
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    G4__UNROLL for (i = 0; i < 4; i++) { /* b[4i + j]'s block q: column 4q + j of rows 4i .. 4i + 3 */
        b[4 * i] = _mm512_shuffle_ps(a[4 * i], a[4 * i + 2], 0x44);
        b[4 * i + 1] = _mm512_shuffle_ps(a[4 * i], a[4 * i + 2], 0xee);
        b[4 * i + 2] = _mm512_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0x44);
        b[4 * i + 3] = _mm512_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0xee);
    }
    G4__UNROLL for (j = 0; j < 4; j++) { /* column 4q + j: block q of b[j], b[4 + j], b[8 + j], b[12 + j] */
        __m512 c1 = _mm512_shuffle_f32x4(b[j], b[4 + j], 0x88), c2 = _mm512_shuffle_f32x4(b[j], b[4 + j], 0xdd);
        __m512 d1 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0x88), d2 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0xdd);
        r[j] = _mm512_shuffle_f32x4(c1, d1, 0x88);
        r[4 + j] = _mm512_shuffle_f32x4(c2, d2, 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(c1, d1, 0xdd);
        r[12 + j] = _mm512_shuffle_f32x4(c2, d2, 0xdd);
    }
}

/* t[p], lane i: the pair of bf16 values at k + 2p of row i (rows of rowb bytes
   from row0), for p < np <= 16; a row i >= rows reads row rows - 1 again (a
   lane the caller drops), and pairs past np are not read */
static G4__INLINE void g4__pairs16(__m512 t[16], const unsigned char *row0, size_t rowb, int rows, int k, int np) {
    __mmask16 m = (__mmask16)((1u << np) - 1u);
    int i;
    G4__UNROLL16 for (i = 0; i < 16; i++) t[i] = _mm512_maskz_loadu_ps(m, row0 + (size_t)(i < rows ? i : rows - 1) * rowb + 2 * (size_t)k);
    g4__transpose16(t);
}

/* x's pair of bf16 values at k, in every lane */
static G4__INLINE __m512bh g4__bcast_pair(const uint16_t *xb, int k) {
    int v;
    memcpy(&v, xb + k, 4);
    return (__m512bh)_mm512_set1_epi32(v);
}

/* decode: y[o] for o in [o0, o1), one token, 16 rows at a time. The next 16
   rows (one contiguous stretch of W) are prefetched as these run, 16 lines a
   step: the 16 rows read side by side are too many streams for the
   hardware's prefetcher (without it decode ran at a third of the bandwidth).
   Each register's chain waits on its last VDPBF16PS; two registers side by
   side measured slower (more streams), 2026-11-27. */
static void g4__rows_pairs(float *y, const float *x, const uint16_t *xb, const unsigned char *base, int in, int o0, int o1, int cast) {
    size_t rowb = (size_t)in * 2;
    int kv = in - in % 2, o, k, p, i;
    const unsigned char *pf = base + (size_t)o0 * rowb, *end = base + (size_t)o1 * rowb;
    for (o = o0; o < o1; o += 16) {
        int rows = o1 - o < 16 ? o1 - o : 16;
        const unsigned char *row0 = base + (size_t)o * rowb;
        __m512 acc = _mm512_setzero_ps(), t[16];
        float s[16];
        if (pf < row0 + 16 * rowb) pf = row0 + 16 * rowb;
        for (k = 0; k + 32 <= kv; k += 32) { /* (16 pairs, a constant count: t stays in registers) */
            for (i = 0; i < 16 && pf < end; i++, pf += 64) G4__PREFETCH(pf);
            g4__pairs16(t, row0, rowb, rows, k, 16);
            G4__UNROLL16 for (p = 0; p < 16; p++) acc = _mm512_dpbf16_ps(acc, (__m512bh)t[p], g4__bcast_pair(xb, k + 2 * p));
        }
        if (k < kv) { /* the last pairs, fewer than 16 */
            __m512 tl[16];
            g4__pairs16(tl, row0, rowb, rows, k, (kv - k) / 2);
            for (p = 0; p < (kv - k) / 2; p++) acc = _mm512_dpbf16_ps(acc, (__m512bh)tl[p], g4__bcast_pair(xb, k + 2 * p));
        }
        _mm512_storeu_ps(s, acc);
        for (i = 0; i < rows; i++) {
            y[o + i] = kv < in ? g4__tail(s[i], x, row0 + (size_t)i * rowb, G4_BF16, kv, in) : s[i];
            if (cast) y[o + i] = g4__bf16_round(y[o + i]);
        }
    }
}

/* rows [o, o + rows) of W at k in [k0, k0 + kc) (kc even) into panels of
   16 G4__PR rows: panel g holds rows o + 16 G4__PR g + 16 v + i at
   [g][(k - k0) / 2][v][i], a pair of bf16 values each (the tail of the last
   panel: its last row again) */
static void g4__pack_pairs(uint32_t *pan, const unsigned char *base, size_t rowb, int o, int rows, int k0, int kc) {
    int np = kc / 2, g, v, p, q;
    __m512 t[16], tl[16];
    for (g = 0; 16 * G4__PR * g < rows; g++)
        for (v = 0; v < G4__PR; v++) {
            int r0 = 16 * (G4__PR * g + v), n = rows - r0 < 16 ? rows - r0 : 16;
            uint32_t *dst = pan + ((size_t)(G4__PR * g) * (size_t)np + (size_t)v) * 16; /* pair p at + p G4__PR 16 */
            if (n <= 0) r0 = rows - 1, n = 1; /* a register past the rows: the last row again */
            for (p = 0; p + 16 <= np; p += 16) { /* (16 pairs, a constant count: t stays in registers, as g4__rows_pairs') */
                g4__pairs16(t, base + (size_t)(o + r0) * rowb, rowb, n, k0 + 2 * p, 16);
                G4__UNROLL16 for (q = 0; q < 16; q++) _mm512_storeu_ps((void *)(dst + (size_t)(p + q) * G4__PR * 16), t[q]);
            }
            if (p < np) { /* the last pairs, fewer than 16 */
                g4__pairs16(tl, base + (size_t)(o + r0) * rowb, rowb, n, k0 + 2 * p, np - p);
                for (q = 0; q < np - p; q++) _mm512_storeu_ps((void *)(dst + (size_t)(p + q) * G4__PR * 16), tl[q]);
            }
        }
}

/* The tile: G4__PT tokens (x as bf16 at xt[u], y's row at yt[u]) x G4__PR
   registers of 16 rows (a panel of g4__pack_pairs), `pairs` steps. first:
   the chains start at 0, else at y's partial sums; cast: each sum rounded to
   bf16 in its register before it is stored. m[v]: the lanes of register v
   that are rows (the rest neither loaded nor stored). */
static G4__NOINLINE void g4__tile_pairs(const uint32_t *wp, const uint16_t *const *xt, int pairs, float *const *yt,
                                        const __mmask16 *m, int first, int cast) {
    __m512 acc[G4__PR][G4__PT];
    __m512bh wv[G4__PR];
    const uint16_t *xp[G4__PT]; /* (a local copy: GCC reloaded each pointer from xt every step) */
    int v, u, s;
    G4__UNROLL for (u = 0; u < G4__PT; u++) xp[u] = xt[u];
    G4__UNROLL for (v = 0; v < G4__PR; v++)
        G4__UNROLL for (u = 0; u < G4__PT; u++) acc[v][u] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m[v], yt[u] + 16 * v);
    for (s = 0; s < pairs; s++, wp += 16 * G4__PR) {
        G4__UNROLL for (v = 0; v < G4__PR; v++) wv[v] = (__m512bh)_mm512_loadu_si512((const void *)(wp + 16 * v));
        G4__UNROLL for (u = 0; u < G4__PT; u++) {
            __m512bh xv = g4__bcast_pair(xp[u], 2 * s);
            G4__UNROLL for (v = 0; v < G4__PR; v++) acc[v][u] = _mm512_dpbf16_ps(acc[v][u], wv[v], xv);
        }
    }
    G4__UNROLL for (v = 0; v < G4__PR; v++)
        G4__UNROLL for (u = 0; u < G4__PT; u++) _mm512_mask_storeu_ps(yt[u] + 16 * v, m[v], cast ? g4__vbf16_round(acc[v][u]) : acc[v][u]);
}

/* y[t * ldy + o] for t < n, o in [o0, o1): tokens in blocks of up to b->nc,
   rows in blocks of b->mc (a multiple of 16 G4__PR), k in blocks of b->kc
   (even); each block of W packed once (g4__pack_pairs) into ws (b->mc * b->kc
   / 2 floats), the partial sums kept in y between blocks of k (exact: the
   chain goes on where it stopped). The next block is not prefetched, unlike
   g4__gemm's: here that measured 2% slower at 64 tokens and the same at 512
   (one thread, Zen 4, 2026-11-27), the packing pass reading a block's rows
   side by side anyway. */
static void g4__gemm_pairs(float *y, size_t ldy, const uint16_t *xb, const float *x, size_t ldx, const g4_tensor *w, int n,
                           int o0, int o1, float *ws, const g4__blocking *b, int cast) {
    int in = (int)w->shape[1], kv = in - in % 2, tails = kv < in, t0, i0, k0, t, o, u, v, ncb = g4__token_block(n, b->nc, G4__PT);
    size_t rowb = (size_t)in * 2;
    const unsigned char *base = (const unsigned char *)w->data;
    uint32_t *pan = (uint32_t *)(void *)ws;
    const uint16_t *xt[G4__PT];
    float *yt[G4__PT];
    __mmask16 m[G4__PR];
    for (t0 = 0; t0 < n; t0 += ncb) {
        int nc = n - t0 < ncb ? n - t0 : ncb;
        for (i0 = o0; i0 < o1; i0 += b->mc) {
            int mc = o1 - i0 < b->mc ? o1 - i0 : b->mc;
            for (k0 = 0; k0 == 0 || k0 < kv; k0 += b->kc) {
                int kc = kv - k0 < b->kc ? kv - k0 : b->kc, first = k0 == 0, last = k0 + kc >= kv;
                g4__pack_pairs(pan, base, rowb, i0, mc, k0, kc);
                for (t = t0; t < t0 + nc; t += G4__PT) {
                    int T = t0 + nc - t < G4__PT ? t0 + nc - t : G4__PT;
                    for (u = 0; u < G4__PT; u++) xt[u] = xb + (size_t)(t + (u < T ? u : T - 1)) * ldx + k0; /* (past T: token T - 1 again) */
                    for (o = i0; o < i0 + mc; o += 16 * G4__PR) {
                        for (v = 0; v < G4__PR; v++) {
                            int r = i0 + mc - o - 16 * v;
                            m[v] = (__mmask16)(r >= 16 ? 0xffffu : r > 0 ? (1u << r) - 1u : 0u);
                        }
                        for (u = 0; u < G4__PT; u++) yt[u] = y + (size_t)(t + (u < T ? u : T - 1)) * ldy + (size_t)o;
                        g4__tile_pairs(pan + (size_t)(o - i0) * (size_t)(kc / 2), xt, kc / 2, yt, m, first, last && cast && !tails);
                    }
                }
            }
        }
        for (t = t0; tails && t < t0 + nc; t++) /* in odd: the last k, after the chains */
            for (o = o0; o < o1; o++) {
                float *yo = y + (size_t)t * ldy + (size_t)o;
                *yo = g4__tail(*yo, x + (size_t)t * ldx, base + (size_t)o * rowb, G4_BF16, kv, in);
                if (cast) *yo = g4__bf16_round(*yo);
            }
    }
}

/* xb: x as bf16 (g4__to_bf16); ws: one thread's packing buffer
   (G4__BF16DOT_FLOATS); cast: each y rounded to bf16 (g4__gemm's) */
static void g4__matmul_bf16dot(float *y, const float *x, const uint16_t *xb, const g4_tensor *w, int n, int o0, int o1, float *ws,
                               int cast) {
    if (n == 1) g4__rows_pairs(y, x, xb, (const unsigned char *)w->data, (int)w->shape[1], o0, o1, cast);
    else g4__gemm_pairs(y, (size_t)w->shape[0], xb, x, (size_t)w->shape[1], w, n, o0, o1, ws, &g4__bf16dot_blocks, cast);
}
#endif
#else
#define G4__SIMD_NAME "scalar"
#define G4__TR 4 /* threads split rows in blocks of G4__TR */
#define G4__TT 1
#define G4__HAVE_GEMM 0
#define G4__TORCH_GEMM 0
#define G4__PACK_THREAD 0 /* no packing buffer */
static int g4__gemm_kc(long l2) { (void)l2; return 0; }
static void g4__matmul_rows(float *y, const float *x, const g4_tensor *w, int n, int o0, int o1, float *ws) {
    (void)ws;
    g4__matmul_ref(y, x, w, n, o0, o1);
}
static float g4__dot(const float *a, const float *b, int n) { return g4__dot_ref(a, b, n); }
static float g4__dot_torch_v(const float *a, const float *b, int n) { return g4__dot_torch(a, b, n); }
static void g4__gelu_n(float *y, const float *x, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) y[i] = g4__gelu(x[i]);
}
static void g4__axpy(float *y, float a, const float *x, int n) {
    int i;
    for (i = 0; i < n; i++) y[i] += a * x[i];
}
static void g4__dot8(float *s, size_t ss, const float *q, const float *const *b, int n) {
    int j;
    for (j = 0; j < 8; j++) s[(size_t)j * ss] = g4__dot(q, b[j], n);
}
static void g4__wsum_ring(float *y, const float *p, const float *base, size_t stride, int cap, int k0, int m, int n, int add) {
    int i, j;
    for (i = 0; i < n && !add; i++) y[i] = 0.0f;
    for (j = 0; j < m; j++) g4__axpy(y, p[j], base + (size_t)((k0 + j) % cap) * stride, n);
}
#endif

/* g4__matmul_torch_ref on 8-lane vectors (AVX2 and FMA, also under AVX-512):
   the same lanes and the same additions, so the same bits (tested). */
#if !defined(G4_NO_SIMD) && defined(__AVX2__) && defined(__FMA__)
#define G4__TORCH_MM 1
static __m256 g4__vbf16_8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)), 16));
}
static float g4__hsum8_v(__m256 v) {
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    return g4__hsum8(lanes);
}
/* The end of one output's sum: its 8 accumulators (lane sums over k < in &
   ~63) added in torch's tree, then the tail: k < in & ~15 16 at a time into
   one 8-lane accumulator, the rest one by one. */
static float g4__torch_finish(__m256 acc[8], const float *x, const uint16_t *row, int in) {
    int la = in & ~63, lv = in & ~15, i, r;
    __m256 tail = _mm256_setzero_ps();
    float sum;
    for (r = 0; r < 4; r++) acc[r] = _mm256_add_ps(acc[r], acc[r + 4]);
    for (r = 0; r < 2; r++) acc[r] = _mm256_add_ps(acc[r], acc[r + 2]);
    sum = g4__hsum8_v(_mm256_add_ps(acc[0], acc[1]));
    for (i = la; i < lv; i += 16) {
        tail = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), g4__vbf16_8(row + i), tail);
        tail = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), g4__vbf16_8(row + i + 8), tail);
    }
    sum += g4__hsum8_v(tail);
    for (i = lv; i < in; i++) sum += x[i] * g4__bf16_to_f32(row[i]);
    return sum;
}

/* A decode step (n 1) runs rows o and o + half side by side, as g4__rows1
   does: two weight streams, and 16 accumulators that the compiler partly
   keeps in memory (AVX2 has 16 registers), which costs nothing here, where
   the weights' bandwidth is the limit. With the prefetch (g4__rows1), the
   bf16-faithful decode of the E2B-shaped checkpoint on the Zen 3, in turns
   against one row at a time without it (2026-11-27): one thread 7.9-8.8 ->
   11.2-12.2 GB/s, two 13.0-13.7 -> 17.1-20.3, float32 decode's speed (the
   prefetch alone: two threads 12.4-14.3 -> 14.1-14.3). Each row's sums are
   unchanged (tested, from row 0 and 1, an odd row out). */
static void g4__matmul_torch(float *y, const float *x, const g4_tensor *w, int n, int o0, int o1) {
    int out = (int)w->shape[0], in = (int)w->shape[1], la = in & ~63, half = n == 1 ? (o1 - o0) / 2 : 0, o, t, i, r;
    const uint16_t *base = (const uint16_t *)w->data;
    for (o = o0; o < o0 + half; o++) {
        const uint16_t *row = base + (size_t)o * (size_t)in, *row1 = base + (size_t)(o + half) * (size_t)in;
        __m256 acc[8], acc1[8];
        for (r = 0; r < 8; r++) acc[r] = acc1[r] = _mm256_setzero_ps();
        for (i = 0; i < la; i += 64) {
            G4__DECODE_PREFETCH(row + i), G4__DECODE_PREFETCH(row + i + 32); /* (128 bytes a step) */
            G4__DECODE_PREFETCH(row1 + i), G4__DECODE_PREFETCH(row1 + i + 32);
            for (r = 0; r < 8; r++) {
                __m256 xv = _mm256_loadu_ps(x + i + 8 * r);
                acc[r] = _mm256_fmadd_ps(xv, g4__vbf16_8(row + i + 8 * r), acc[r]);
                acc1[r] = _mm256_fmadd_ps(xv, g4__vbf16_8(row1 + i + 8 * r), acc1[r]);
            }
        }
        y[o] = g4__torch_finish(acc, x, row, in);
        y[o + half] = g4__torch_finish(acc1, x, row1, in);
    }
    for (o = o0 + 2 * half; o < o1; o++) { /* prefill's rows (n > 1), or decode's odd row out */
        const uint16_t *row = base + (size_t)o * (size_t)in;
        for (t = 0; t < n; t++) {
            const float *xt = x + (size_t)t * (size_t)in;
            __m256 acc[8];
            for (r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
            for (i = 0; i < la; i += 64) {
                G4__DECODE_PREFETCH(row + i), G4__DECODE_PREFETCH(row + i + 32);
                for (r = 0; r < 8; r++)
                    acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xt + i + 8 * r), g4__vbf16_8(row + i + 8 * r), acc[r]);
            }
            y[(size_t)t * (size_t)out + (size_t)o] = g4__torch_finish(acc, xt, row, in);
        }
    }
}

#else
#define G4__TORCH_MM 0
#define g4__matmul_torch g4__matmul_torch_ref
#endif

#if G4__TORCH_GEMM
/* The bf16-faithful mode's tile of the prefill GEMM (g4__gemm's
   G4__TILE_TORCH): g4__matmul_torch_ref's bits on the packed blocks of
   >>gemm. Torch's 8 accumulators r of 8 lanes are 64 lane sums, lane 8 r + l
   over the inputs 64 j + 8 r + l in order; a vector of VL lanes carries
   VL / 8 of them side by side (the same sums, lane for lane). So the tile
   runs 64 / VL times, once per vector q of a 64-value step, over every 64th
   vector of k (vs 64), each from and into its own partial sums (part + q
   G4__TR G4__TT VL; the weights of pass q are packed as their own panel,
   with pack). After the block's last k each output's 64 lane sums go
   through g4__dot_torch_end: the tree, then the tail (so sum holds whole
   sums). The blocking changes no bit; decode keeps g4__matmul_torch. */
static G4__NOINLINE void g4__tile_torch(float *wp, const unsigned char *const *wrow, int pack, int k0, int kc, int in,
                                        const float *const *xt, float *part, int first, int last, float sum[G4__TT][G4__TR]) {
    const size_t pass = G4__TR * G4__TT * G4__VL; /* floats of one pass's partial sums */
    const float *xq[G4__TT];
    const unsigned char *wq[G4__TR];
    int r, u, q, l;
    for (q = 0; q < 64 / G4__VL; q++) {
        for (u = 0; u < G4__TT; u++) xq[u] = xt[u] + G4__VL * q;
        for (r = 0; r < G4__TR; r++) wq[r] = wrow[r] + 2 * G4__VL * q;
        g4__micro_vs(wp + (size_t)q * (size_t)(kc / 64) * G4__TR * G4__VL, pack ? wq : NULL, G4_BF16, k0, 64, xq, kc / 64,
                     part + (size_t)q * pass, first, 0, sum);
    }
    for (r = 0; r < G4__TR && last; r++)
        for (u = 0; u < G4__TT; u++) {
#if G4__TORCH_MM /* the same end on 8-lane vectors (g4__torch_finish): accumulator a is lanes 8 a .. 8 a + 7 */
            __m256 acc[8];
            for (q = 0; q < 8; q++)
                acc[q] = _mm256_loadu_ps(part + (size_t)(8 * q / G4__VL) * pass + (size_t)(r * G4__TT + u) * G4__VL + (size_t)(8 * q % G4__VL));
            sum[u][r] = g4__torch_finish(acc, xt[u] - k0, (const uint16_t *)(const void *)wrow[r], in);
            (void)l;
#else
            float acc[8][8];
            for (q = 0; q < 64 / G4__VL; q++)
                for (l = 0; l < G4__VL; l++)
                    acc[(q * G4__VL + l) / 8][(q * G4__VL + l) % 8] = part[(size_t)q * pass + (size_t)(r * G4__TT + u) * G4__VL + (size_t)l];
            sum[u][r] = g4__dot_torch_end(acc, xt[u] - k0, wrow[r], G4__B_BF16, in);
#endif
            if (last == G4__SUMS_BF16) sum[u][r] = g4__bf16_round(sum[u][r]);
        }
}
#endif

/* The float32 forward's exp on a row (g4__expf, >>kernels), SIMD: the same
   IEEE double operations (x in double, k = nearest(x / ln 2) by the 1.5 *
   2^52 trick, r in two steps, the degree-16 polynomial, times 2^k, one
   rounding to float), 8 (AVX-512F) or 4 (AVX2) values at a time, so the same
   bits as g4__expf (tested on every float in [-110, 95] at a stride, and its
   special cases: NaN, +-inf, the cut-offs). The emulated and other builds
   run g4__expf. In place is fine. */
#if !defined(G4_NO_SIMD) && !defined(G4__SIMD_EMULATED) && defined(__AVX512F__)
#define G4__EXPD_W 8
typedef __m512d g4__dvec;
#define g4__dset1(f) _mm512_set1_pd(f)
#define g4__dadd(a, b) _mm512_add_pd(a, b)
#define g4__dsub(a, b) _mm512_sub_pd(a, b)
#define g4__dmul(a, b) _mm512_mul_pd(a, b)
#define g4__dload(p) _mm512_cvtps_pd(_mm256_loadu_ps(p))
#define g4__dpow2(t, shift) /* 2^k from t = k + 1.5 * 2^52 */                                                   \
    _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(_mm512_sub_epi64(_mm512_castpd_si512(t), \
                        _mm512_castpd_si512(shift)), _mm512_set1_epi64(1023)), 52))
#define g4__dstore(p, v) _mm256_storeu_ps(p, _mm512_cvtpd_ps(v))
#define g4__ddiv(a, b) _mm512_div_pd(a, b)
#define g4__dloadd(p) _mm512_loadu_pd(p)
#define g4__dstored(p, v) _mm512_storeu_pd(p, v)
#elif !defined(G4_NO_SIMD) && !defined(G4__SIMD_EMULATED) && defined(__AVX2__)
#define G4__EXPD_W 4
typedef __m256d g4__dvec;
#define g4__dset1(f) _mm256_set1_pd(f)
#define g4__dadd(a, b) _mm256_add_pd(a, b)
#define g4__dsub(a, b) _mm256_sub_pd(a, b)
#define g4__dmul(a, b) _mm256_mul_pd(a, b)
#define g4__dload(p) _mm256_cvtps_pd(_mm_loadu_ps(p))
#define g4__dpow2(t, shift)                                                                                   \
    _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(_mm256_sub_epi64(_mm256_castpd_si256(t), \
                        _mm256_castpd_si256(shift)), _mm256_set1_epi64x(1023)), 52))
#define g4__dstore(p, v) _mm_storeu_ps(p, _mm256_cvtpd_ps(v))
#define g4__ddiv(a, b) _mm256_div_pd(a, b)
#define g4__dloadd(p) _mm256_loadu_pd(p)
#define g4__dstored(p, v) _mm256_storeu_pd(p, v)
#endif

#ifdef G4__EXPD_W
/* g4__expm1_small and g4__exp_d (|x| <= 250) lane by lane: the same operations */
static G4__INLINE g4__dvec g4__dexpm1_small(g4__dvec r) {
    static const double c[15] = {0.5, 0.16666666666666666, 0.041666666666666664, 0.008333333333333333,
                          0.001388888888888889, 0.0001984126984126984, 2.48015873015873e-05,
                          2.7557319223985893e-06, 2.755731922398589e-07, 2.505210838544172e-08,
                          2.08767569878681e-09, 1.6059043836821613e-10, 1.1470745597729725e-11,
                          7.647163731819816e-13, 4.779477332387385e-14}; /* g4__expm1_small's */
    g4__dvec q = g4__dset1(c[14]);
    int j;
    G4__UNROLL16 for (j = 13; j >= 0; j--) q = g4__dadd(g4__dmul(q, r), g4__dset1(c[j]));
    return g4__dadd(r, g4__dmul(g4__dmul(r, r), q));
}
static G4__INLINE g4__dvec g4__dexp(g4__dvec x) {
    const g4__dvec shift = g4__dset1(6755399441055744.0);
    g4__dvec t = g4__dadd(g4__dmul(x, g4__dset1(1.4426950408889634)), shift), kd = g4__dsub(t, shift);
    g4__dvec r = g4__dsub(g4__dsub(x, g4__dmul(kd, g4__dset1(0.6931471803691238))), g4__dmul(kd, g4__dset1(1.9082149292705877e-10)));
    return g4__dmul(g4__dadd(g4__dset1(1.0), g4__dexpm1_small(r)), g4__dpow2(t, shift));
}
#endif

static void g4__expf_n(float *y, const float *x, size_t n) {
    size_t i = 0;
#ifdef G4__EXPD_W
    for (; i + G4__EXPD_W <= n; i += G4__EXPD_W) {
        int ok = 1, l;
        for (l = 0; l < G4__EXPD_W; l++) /* the cut-offs and NaN: g4__expf's own branches */
            ok &= x[i + l] >= -104.0f && x[i + l] < 88.72283935546875f;
        if (!ok) {
            for (l = 0; l < G4__EXPD_W; l++) y[i + l] = g4__expf(x[i + l]);
            continue;
        }
        g4__dstore(y + i, g4__dexp(g4__dload(x + i)));
    }
#endif
    for (; i < n; i++) y[i] = g4__expf(x[i]);
}

#ifdef G4__EXPD_W
/* e[l] = g4__exp_nonpos(a[l]) for a group of g4__ce_row (two vectors): on
   g4__dexp where every lane is in its range, else the scalar function */
static G4__INLINE void g4__exp_nonpos_group(double *e, const double *a) {
    int ok = 1, l;
    for (l = 0; l < 2 * G4__EXPD_W; l++) ok &= a[l] >= -250.0; /* (false for NaN) */
    if (!ok) {
        for (l = 0; l < 2 * G4__EXPD_W; l++) e[l] = g4__exp_nonpos(a[l]);
        return;
    }
    g4__dstored(e, g4__dexp(g4__dloadd(a)));
    g4__dstored(e + G4__EXPD_W, g4__dexp(g4__dloadd(a + G4__EXPD_W)));
}
#endif

/* g4__ce_row_ref (>>backward), the loss's row, with its soft-cap tanh and its
   exps G4__EXPD_W lanes at a time in double (g4__dexp, g4__dexpm1_small: the
   same operations), the float operations around them one by one as there,
   and the sum in order: the same bits (tested). A group of lanes that needs
   a branch of g4__tanhf or g4__exp_nonpos other than the polynomials (0,
   |x| > 9.1, below -250, NaN) runs the scalar functions. The label's - 1 /
   used is put in after the row's pass. On the 4-layer, 32K-vocabulary
   E2B-shaped checkpoint the scalar row took 8% of a training step (one
   thread, Zen 3). */
static double g4__ce_row(float *z, int V, int32_t y, float cap, float inv_n) {
#ifdef G4__EXPD_W
    enum { W = G4__EXPD_W, G = 2 * W }; /* a group: two vectors, two polynomials' chains in flight */
    double a[G], e[G], e2[G], sum = 0.0, lse, loss;
    float f[G], mx, zy, v;
    int j, l, h;
    if (cap > 0.0f) { /* z := tanh(z / cap): e = expm1(2a) below a = |z / cap| = 0.25, exp(2a) - 1 above; e / (e + 2) */
        for (j = 0; j + G <= V; j += G) {
            int ok = 1, small[2] = {0, 0};
            for (l = 0; l < G; l++) {
                f[l] = z[j + l] / cap;
                a[l] = f[l] < 0.0f ? -(double)f[l] : (double)f[l];
                ok &= f[l] != 0.0f && a[l] <= 9.1; /* (false for NaN) */
                small[l / W] += a[l] < 0.25;
            }
            if (!ok) {
                for (l = 0; l < G; l++) z[j + l] = g4__tanhf(f[l]);
                continue;
            }
            for (h = 0; h < G; h += W) {
                g4__dvec a2 = g4__dadd(g4__dloadd(a + h), g4__dloadd(a + h)), ev;
                if (small[h / W] == W) ev = g4__dexpm1_small(a2);
                else if (small[h / W] == 0) ev = g4__dsub(g4__dexp(a2), g4__dset1(1.0));
                else { /* both branches, each lane its own */
                    g4__dstored(e + h, g4__dexpm1_small(a2));
                    g4__dstored(e2 + h, g4__dsub(g4__dexp(a2), g4__dset1(1.0)));
                    for (l = h; l < h + W; l++) e[l] = a[l] < 0.25 ? e[l] : e2[l];
                    ev = g4__dloadd(e + h);
                }
                g4__dstored(e + h, g4__ddiv(ev, g4__dadd(ev, g4__dset1(2.0))));
            }
            for (l = 0; l < G; l++) z[j + l] = (float)(f[l] < 0.0f ? -e[l] : e[l]);
        }
        for (; j < V; j++) z[j] = g4__tanhf(z[j] / cap);
    }
    mx = g4__ce_logit(z[0], cap);
    for (j = 1; j < V; j++) { v = g4__ce_logit(z[j], cap); if (v > mx) mx = v; }
    for (j = 0; j + G <= V; j += G) { /* sum of exp(logit - max), in order */
        for (l = 0; l < G; l++) a[l] = (double)(g4__ce_logit(z[j + l], cap) - mx);
        g4__exp_nonpos_group(e, a);
        for (l = 0; l < G; l++) sum += e[l];
    }
    for (; j < V; j++) sum += g4__exp_nonpos((double)(g4__ce_logit(z[j], cap) - mx));
    lse = (double)mx + log(sum);
    zy = z[y];
    loss = lse - (double)g4__ce_logit(zy, cap);
    for (j = 0; j + G <= V; j += G) { /* dL/dlogit = softmax / used, then back through the cap */
        for (l = 0; l < G; l++) a[l] = (double)g4__ce_logit(z[j + l], cap) - lse;
        g4__exp_nonpos_group(e, a);
        for (l = 0; l < G; l++) z[j + l] = g4__ce_back((float)e[l] * inv_n, z[j + l], cap);
    }
    for (; j < V; j++) z[j] = g4__ce_back((float)g4__exp_nonpos((double)g4__ce_logit(z[j], cap) - lse) * inv_n, z[j], cap);
    /* the label's, again with its - 1 / used */
    z[y] = g4__ce_back((float)g4__exp_nonpos((double)g4__ce_logit(zy, cap) - lse) * inv_n - inv_n, zy, cap);
    return loss;
#else
    return g4__ce_row_ref(z, V, y, cap, inv_n);
#endif
}

/* g4__softmax (>>ops) with its exps through g4__expf_n: max, x - max, exp,
   the sum in order, / sum; the same bits */
static void g4__softmax_n(float *x, int n) {
    float mx = x[0], sum = 0.0f;
    int i = 0;
    for (i = 1; i < n; i++) if (x[i] > mx) mx = x[i];
    i = 0;
#ifdef G4__VL /* (SIMD builds) x - max and / sum lane by lane: one IEEE operation per element either way */
    for (; i + G4__VL <= n; i += G4__VL) g4__vstore(x + i, g4__vsub(g4__vload_x(x + i), g4__vset1(mx)));
#endif
    for (; i < n; i++) x[i] = x[i] - mx;
    g4__expf_n(x, x, (size_t)n);
    for (i = 0; i < n; i++) sum += x[i];
    i = 0;
#ifdef G4__VL
    for (; i + G4__VL <= n; i += G4__VL) g4__vstore(x + i, g4__vdiv(g4__vload_x(x + i), g4__vset1(sum)));
#endif
    for (; i < n; i++) x[i] /= sum;
}

/* ----------------------------------------------------- threads >>threads */
/* A caller-owned pool: n-1 worker threads plus the calling thread. A job is
   fn(ctx, part, n_parts) run once for every part; the pool serves one job at
   a time (concurrent callers queue on run_mu). A decode step runs ~300 short
   jobs, and a condition-variable wake-up costs tens of microseconds on a VM,
   so both sides spin (G4_POOL_SPIN polls, about a millisecond) before they
   sleep on the condition variable. A pool with more threads than the machine
   has online CPUs does not spin: there, spinning threads would take the
   cores the working ones need (measured: decode 5.6x slower).
   Parts are claimed, not assigned: the caller and the workers take the next
   unclaimed part until none is left, so a worker the OS has not scheduled
   (another process on its core) costs nothing: the caller runs its part.
   With part i fixed to thread i, two-thread decode on a 2-core machine with
   one other busy process ran 4x slower than one thread. A part's work and its
   scratch depend on the part's number only, never on the thread that runs
   it, so the bits do not change. A claim is a compare-and-swap on one word
   holding the job's number and the next part, so a worker late for a job can
   never take a part of the next one with the old job's fn. */
#if G4__THREADS
#ifndef G4_POOL_SPIN
#define G4_POOL_SPIN 50000
#endif
#if defined(__GNUC__)
#define G4__ALOAD(p) __atomic_load_n(p, __ATOMIC_ACQUIRE)
#define G4__ASTORE(p, v) __atomic_store_n(p, v, __ATOMIC_RELEASE)
#define G4__AINC(p) __atomic_add_fetch(p, 1, __ATOMIC_ACQ_REL)
#define G4__ACAS(p, expect, v) __atomic_compare_exchange_n(p, expect, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)
#define G4__SPINS G4_POOL_SPIN
#else /* no atomics: no spinning, every access under the mutex */
#define G4__NO_ATOMICS 1
#define G4__ALOAD(p) (*(p))
#define G4__ASTORE(p, v) (*(p) = (v))
#define G4__AINC(p) (++*(p))
#define G4__SPINS 0
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define G4__PAUSE() __builtin_ia32_pause()
#elif defined(__GNUC__) && defined(__aarch64__)
#define G4__PAUSE() __asm__ __volatile__("yield")
#else
#define G4__PAUSE() ((void)0)
#endif
typedef void (*g4__job_fn)(void *ctx, int part, int n_parts);
struct g4_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu, run_mu;
    pthread_cond_t go, done;
    unsigned gen;        /* the job's number, bumped (release) once the job is published */
    uint64_t claim;      /* the job's number << 32 | the next unclaimed part */
    int finished;        /* parts of the current job done */
    int quit;
    int spin;            /* polls before sleeping: G4__SPINS, or 0 when oversubscribed */
    g4__job_fn fn;       /* written by the caller before it publishes the job, read atomically */
    void *ctx;
};

/* Takes and runs parts of job `job` until none is left; the thread that
   finishes the last part wakes the caller. */
static void g4__run_parts(g4_pool *p, unsigned job) {
#ifdef G4__NO_ATOMICS
    int part;
    (void)job;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        part = (int)(p->claim & 0xffffffffu);
        if ((unsigned)(p->claim >> 32) != job || part >= p->n) { pthread_mutex_unlock(&p->mu); return; }
        p->claim++;
        pthread_mutex_unlock(&p->mu);
        p->fn(p->ctx, part, p->n);
        pthread_mutex_lock(&p->mu);
        if (++p->finished == p->n) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
#else
    for (;;) {
        uint64_t c = G4__ALOAD(&p->claim);
        g4__job_fn fn;
        void *ctx;
        int part = (int)(c & 0xffffffffu);
        if ((unsigned)(c >> 32) != job || part >= p->n) return;
        fn = G4__ALOAD(&p->fn); /* this job's: the next is published only after every part is done */
        ctx = G4__ALOAD(&p->ctx);
        if (!G4__ACAS(&p->claim, &c, c + 1)) continue;
        fn(ctx, part, p->n);
        if (G4__AINC(&p->finished) == p->n) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
#endif
}

static void *g4__worker(void *arg) {
    g4_pool *p = (g4_pool *)arg;
    int spin;
    unsigned seen = 0;
    for (;;) {
        for (spin = 0; spin < p->spin && G4__ALOAD(&p->gen) == seen && !G4__ALOAD(&p->quit); spin++) G4__PAUSE();
        pthread_mutex_lock(&p->mu);
        while (G4__ALOAD(&p->gen) == seen && !G4__ALOAD(&p->quit)) pthread_cond_wait(&p->go, &p->mu);
        pthread_mutex_unlock(&p->mu);
        if (G4__ALOAD(&p->quit)) break;
        seen = G4__ALOAD(&p->gen);
        g4__run_parts(p, seen);
    }
    return NULL;
}

G4__DEF g4_result g4_pool_create(g4_pool **out, int n_threads) {
    g4_pool *p;
    int i;
    if (!out) return G4_ERR_INPUT;
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024) return G4_ERR_INPUT;
    p = (g4_pool *)G4_MALLOC(sizeof *p);
    if (!p) return G4_ERR_NOMEM;
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    p->spin = n_threads <= sysconf(_SC_NPROCESSORS_ONLN) ? G4__SPINS : 0;
    p->threads = (pthread_t *)G4_MALLOC(sizeof(pthread_t) * (size_t)n_threads);
    if (!p->threads) { G4_FREE(p); return G4_ERR_NOMEM; }
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (i = 1; i < n_threads; i++)
        if (pthread_create(&p->threads[i], NULL, g4__worker, p) != 0) {
            p->n = i; /* stop the ones started */
            g4_pool_free(p);
            return G4_ERR_NOMEM;
        }
    *out = p;
    return G4_OK;
}

G4__DEF void g4_pool_free(g4_pool *p) {
    int i;
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    G4__ASTORE(&p->quit, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    G4_FREE(p->threads);
    G4_FREE(p);
}

static void g4__parallel(g4_pool *p, g4__job_fn fn, void *ctx) {
    int spin;
    unsigned job;
    if (!p || p->n == 1) { fn(ctx, 0, 1); return; }
    pthread_mutex_lock(&p->run_mu);
    pthread_mutex_lock(&p->mu);
    job = p->gen + 1;
    G4__ASTORE(&p->fn, fn);
    G4__ASTORE(&p->ctx, ctx);
    G4__ASTORE(&p->finished, 0);
    G4__ASTORE(&p->claim, (uint64_t)job << 32);
    G4__ASTORE(&p->gen, job);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    g4__run_parts(p, job);
    for (spin = 0; spin < p->spin && G4__ALOAD(&p->finished) < p->n; spin++) G4__PAUSE();
    pthread_mutex_lock(&p->mu);
    while (G4__ALOAD(&p->finished) < p->n) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
}
#else
struct g4_pool { int n; };
G4__DEF g4_result g4_pool_create(g4_pool **out, int n_threads) {
    if (!out) return G4_ERR_INPUT;
    *out = NULL;
    if (n_threads != 1) return G4_ERR_INPUT; /* built without threads */
    *out = (g4_pool *)G4_MALLOC(sizeof(g4_pool));
    if (!*out) return G4_ERR_NOMEM;
    (*out)->n = 1;
    return G4_OK;
}
G4__DEF void g4_pool_free(g4_pool *p) { G4_FREE(p); }
static void g4__parallel(g4_pool *p, void (*fn)(void *, int, int), void *ctx) { (void)p; fn(ctx, 0, 1); }
#endif

G4__DEF int g4_pool_threads(const g4_pool *p) { return p ? p->n : 1; }
G4__DEF const char *g4_simd_name(void) { return G4__SIMD_NAME; }
G4__DEF int g4_bf16_fast_available(void) { return G4__BF16DOT; }

/* Work below G4_PARALLEL_MIN elements (8x that in multiply-adds for a
   matmul) runs on the calling thread alone; the tests set it to 1 so that
   every split is exercised on the tiny models. */
#ifndef G4_PARALLEL_MIN
#define G4_PARALLEL_MIN 4096
#endif

/* A LoRA adapter in the matmul (g4__lora_forward is the scalar reference):
   first u[t][j] = A_j . x[t] for every token and rank (g4__lora_u_part: the
   flattened (t, j) split across the threads, each one g4__dot, so any split
   and any chunking give the same bits), then each matmul part adds scale *
   B u[t] to its own output columns (g4__lora_add, on g4__axpy). */
typedef struct { float *u; const float *x; const g4_lora *lo; int n, bf16; } g4__lora_job;

G4__HD static float g4__dot_torch_rb(const float *a, const float *b, int n);

static void g4__lora_u_part(void *ctx, int part, int n_parts) {
    const g4__lora_job *j = (const g4__lora_job *)ctx;
    int64_t all = (int64_t)j->n * j->lo->r, e = all * part / n_parts, e1 = all * (part + 1) / n_parts;
    for (; e < e1; e++) {
        int t = (int)(e / j->lo->r), r = (int)(e % j->lo->r);
        const float *xt = j->x + (size_t)t * (size_t)j->lo->in, *a = j->lo->A + (size_t)r * (size_t)j->lo->in;
        /* bf16 (lora_bf16): lora_A is a bf16 nn.Linear: torch's bf16 order, the output rounded */
        j->u[e] = j->bf16 ? g4__bf16_round(g4__dot_torch_rb(xt, a, j->lo->in)) : g4__dot(xt, a, j->lo->in);
    }
}

/* the adapter cast to bf16 (lora_bf16), for o in [o0, o1): lora_B as a bf16
   nn.Linear (B rounded, torch's order, rounded), times scaling (a float32
   product, rounded), added to the bf16 base output (rounded by the caller) */
static void g4__lora_add_bf16(float *y, const float *u, const g4_lora *lo, int n, int o0, int o1) {
    int t, o;
    for (t = 0; t < n; t++)
        for (o = o0; o < o1; o++) {
            float *yo = y + (size_t)t * (size_t)lo->out + (size_t)o;
            float v = g4__bf16_round(g4__dot_torch_rb(u + (size_t)t * (size_t)lo->r, lo->B + (size_t)o * (size_t)lo->r, lo->r));
            *yo = g4__bf16_round(*yo) + g4__bf16_round(v * lo->scale);
        }
}

/* y[t][o] = (bf16 ? bf16(y) : y) + (sum_j B[o][j] u[t][j]) * scale for o in
   [o0, o1): the scalar reference's operations on each element (a product then
   a sum, j in order, no FMA), 64 columns at a time, one g4__axpy (the SIMD
   kernel of >>kernels) per rank from B^T: the same bits as g4__lora_forward's
   second half. */
static void g4__lora_add(float *y, const float *u, const g4_lora *lo, int n, int o0, int o1, int bf16) {
    float acc[64];
    int t, o, j, k, r = lo->r, out = lo->out;
    for (t = 0; t < n; t++) {
        const float *ut = u + (size_t)t * (size_t)r;
        float *yt = y + (size_t)t * (size_t)out;
        for (o = o0; o < o1; o += 64) {
            int w = o1 - o < 64 ? o1 - o : 64;
            for (k = 0; k < w; k++) acc[k] = 0.0f;
            for (j = 0; j < r; j++) g4__axpy(acc, ut[j], lo->Bt + (size_t)j * (size_t)out + (size_t)o, w);
            for (k = 0; k < w; k++) {
                float base = bf16 ? g4__bf16_round(yt[o + k]) : yt[o + k];
                yt[o + k] = base + acc[k] * lo->scale;
            }
        }
    }
}

/* The matmul the forward pass calls (nn.Linear): output rows split across the
   session's threads in blocks of G4__TR (the SIMD tile's rows; bf16_fast's
   kernel: 16, a register of rows), each part on
   the SIMD kernel with its own packing buffer, plus its columns of a LoRA
   adapter's B u (lu: A x, done first), then cast to the activation dtype
   (g4__act). */
typedef struct {
    float *y; const float *x; const uint16_t *xb; const g4_tensor *w; float *pack; const float *lu;
    int n, bf16dot, torch, bf16, bf16mode, lora_bf16, kc; /* kc: the session's gemm_kc (0: the compiled one) */
} g4__mm_job;

static void g4__matmul_part(void *ctx, int part, int n_parts) {
    g4__mm_job *j = (g4__mm_job *)ctx;
    int unit = j->bf16dot ? 16 : G4__TR; /* (bf16_fast: a register of rows) */
    int out = (int)j->w->shape[0], blocks = (out + unit - 1) / unit;
    int b0 = (int)((int64_t)blocks * part / n_parts), b1 = (int)((int64_t)blocks * (part + 1) / n_parts);
    int o0 = unit * b0, o1 = unit * b1 < out ? unit * b1 : out, t;
    int cast = j->bf16 && !j->w->lora; /* the cast in a kernel's stores (g4__gemm, the bf16dot rows), unless an adapter adds on first */
    int in_kernel = 0;                 /* 1: the kernel below took it */
    float *ws = j->pack + (size_t)part * G4__PACK_THREAD;
    if (o0 >= o1) return;
#if G4__BF16DOT
    if (j->bf16dot) g4__matmul_bf16dot(j->y, j->x, j->xb, j->w, j->n, o0, o1, ws, cast), in_kernel = 1;
    else
#endif
#if G4__TORCH_GEMM
    if (j->torch && j->n > 1)
        g4__gemm(j->y, (size_t)out, j->x, (size_t)j->w->shape[1], j->w, j->n, o0, o1, ws, &g4__torch_blocks, G4__TILE_TORCH, cast),
            in_kernel = 1;
    else
#endif
    if (j->torch) g4__matmul_torch(j->y, j->x, j->w, j->n, o0, o1);
    else
#if G4__HAVE_GEMM
    if (j->n > 1 && j->kc > 0) { /* the session's blocking */
        g4__blocking b = g4__gemm_blocks;
        b.kc = j->kc;
        g4__gemm(j->y, (size_t)out, j->x, (size_t)j->w->shape[1], j->w, j->n, o0, o1, ws, &b, G4__TILE_F32, cast);
        in_kernel = 1;
    } else
#endif
        g4__matmul_rows(j->y, j->x, j->w, j->n, o0, o1, ws);
    if (j->w->lora && j->lora_bf16) g4__lora_add_bf16(j->y, j->lu, j->w->lora, j->n, o0, o1);
    else if (j->w->lora) g4__lora_add(j->y, j->lu, j->w->lora, j->n, o0, o1, j->bf16mode);
    if (j->bf16 && !(cast && in_kernel))
        for (t = 0; t < j->n; t++) g4__bf16_round_range(j->y + (size_t)t * (size_t)out, (size_t)o0, (size_t)o1);
}

/* an adapter's u = A x (s->lora_u) on the session's threads (any split: the same bits) */
static void g4__lora_u(const g4_session *s, const float *x, const g4_tensor *w, int n, int bf16) {
    g4__lora_job lj;
    lj.u = s->lora_u; lj.x = x; lj.lo = w->lora; lj.n = n; lj.bf16 = bf16;
    if ((int64_t)w->lora->r * w->lora->in * n < 8 * (int64_t)G4_PARALLEL_MIN) g4__lora_u_part(&lj, 0, 1);
    else g4__parallel(s->cfg.pool, g4__lora_u_part, &lj);
}

/* cast 0: the raw float32 sums, not cast (the drafter's masked logits, g4__matmul_bias) */
static void g4__matmul_cast(const g4_session *s, float *y, const float *x, const g4_tensor *w, int n, int cast) {
    g4__mm_job j;
    j.y = y; j.x = x; j.w = w; j.n = n;
    j.xb = s->xbf;
    j.lu = s->lora_u;
    j.bf16mode = s->cfg.bf16;
    j.lora_bf16 = s->cfg.bf16 && s->cfg.lora_bf16;
    j.pack = s->pack;
    j.kc = s->gemm_kc;
    j.bf16dot = G4__BF16DOT && s->cfg.bf16 && s->cfg.bf16_fast && w->dtype == G4_BF16; /* opt-in only */
    j.torch = !j.bf16dot && s->cfg.bf16 && w->dtype == G4_BF16; /* torch's summation order */
    j.bf16 = s->cfg.bf16 && cast;
#if G4__BF16DOT
    if (j.bf16dot) {
        g4__to_bf16_job tj;
        tj.xb = s->xbf; tj.x = x; tj.in = (int)w->shape[1];
        g4__parallel_range(s, (size_t)n, (size_t)tj.in, g4__to_bf16_range, &tj);
    }
#endif
    if (w->lora) g4__lora_u(s, x, w, n, j.lora_bf16); /* the adapter's A x first (>>adapter) */
    /* too small to share, or a pool larger than the one the arena was carved for */
    if ((int64_t)w->shape[0] * w->shape[1] * n < 8 * (int64_t)G4_PARALLEL_MIN || g4_pool_threads(s->cfg.pool) > s->pack_parts)
        g4__matmul_part(&j, 0, 1);
    else g4__parallel(s->cfg.pool, g4__matmul_part, &j);
}

static void g4__matmul(const g4_session *s, float *y, const float *x, const g4_tensor *w, int n) {
    g4__matmul_cast(s, y, x, w, n, 1);
}

/* nn.Linear with a bias (the audio tower's output_proj; bias NULL: none, the
   12B's embedders): torch's addmm, y = x W^T + b (bf16 mode: rounded once,
   after the bias), then a LoRA adapter as peft adds it to the base layer's
   output (float32, the sum rounded in bf16 mode; the towers have no lora_bf16). */
static void g4__matmul_bias(const g4_session *s, float *y, const float *x, const g4_tensor *w, const g4_tensor *bias, int n) {
    g4_tensor base = *w;
    int t, o, out = (int)w->shape[0];
    base.lora = NULL;
    g4__matmul_cast(s, y, x, &base, n, 0);
    for (t = 0; bias && t < n; t++)
        for (o = 0; o < out; o++) y[(size_t)t * (size_t)out + (size_t)o] += g4__get(bias, (size_t)o);
    if (s->cfg.bf16) g4__bf16_round_range(y, 0, (size_t)n * (size_t)out);
    if (!w->lora) return;
    g4__lora_u(s, x, w, n, 0);
    g4__lora_add(y, s->lora_u, w->lora, n, 0, out, s->cfg.bf16);
    if (s->cfg.bf16) g4__bf16_round_range(y, 0, (size_t)n * (size_t)out);
}

/* An elementwise loop over [0, n) split across the session's threads:
   fn(ctx, i0, i1) on each part. Elementwise, so the split changes no bits. */
typedef struct { void (*fn)(void *ctx, size_t i0, size_t i1); void *ctx; size_t n; } g4__range_job;

static void g4__range_part(void *c, int part, int n_parts) {
    const g4__range_job *j = (const g4__range_job *)c;
    size_t i0 = j->n * (size_t)part / (size_t)n_parts, i1 = j->n * (size_t)(part + 1) / (size_t)n_parts;
    if (i0 < i1) j->fn(j->ctx, i0, i1);
}

/* cost: the work of one item, in elements. (Jobs do not nest: fn must not
   start another pool job.) */
static void g4__parallel_range(const g4_session *s, size_t n, size_t cost, void (*fn)(void *, size_t, size_t),
                               void *ctx) {
    g4__range_job j;
    j.fn = fn; j.ctx = ctx; j.n = n;
    if (n < 2 || n * cost < (size_t)G4_PARALLEL_MIN) fn(ctx, 0, n); /* too small to share */
    else g4__parallel(s->cfg.pool, g4__range_part, &j);
}

typedef struct {
    float *y; size_t ldy; const float *x; size_t ldx; const unsigned char *B; g4_dtype bdt; size_t ldb;
    int kmajor, K, n, N; float *pack;
} g4__bwd_mm_job;

static void g4__bwd_mm_part(void *ctx, int part, int n_parts) {
    const g4__bwd_mm_job *j = (const g4__bwd_mm_job *)ctx;
    int blocks = (j->N + G4__TR - 1) / G4__TR;
    int b0 = (int)((int64_t)blocks * part / n_parts), b1 = (int)((int64_t)blocks * (part + 1) / n_parts);
    int c0 = G4__TR * b0, c1 = G4__TR * b1 < j->N ? G4__TR * b1 : j->N;
    if (c0 >= c1) return;
#if G4__HAVE_GEMM
    g4__gemm_acc(j->y, j->ldy, j->x, j->ldx, j->B, j->bdt, j->ldb, j->kmajor, j->K, j->n, c0, c1,
                 j->pack + (size_t)part * G4__PACK_THREAD, &g4__gemm_acc_blocks);
#else
    g4__gemm_acc_ref(j->y, j->ldy, j->x, j->ldx, j->B, j->bdt, j->ldb, j->kmajor, j->K, j->n, c0, c1);
#endif
}

/* C [n][N] += A [n][K] B, B k-major ([K][N], ldb apart) or not ([N][K]), threaded */
static void g4__bwd_mm(const g4_session *s, float *C, size_t ldc, const float *A, size_t lda, const unsigned char *B,
                       g4_dtype bdt, size_t ldb, int kmajor, int K, int n, int N) {
    g4__bwd_mm_job j;
    j.y = C; j.ldy = ldc; j.x = A; j.ldx = lda; j.B = B; j.bdt = bdt; j.ldb = ldb;
    j.kmajor = kmajor; j.K = K; j.n = n; j.N = N; j.pack = s->pack;
    if ((int64_t)K * n * N < 8 * (int64_t)G4_PARALLEL_MIN || g4_pool_threads(s->cfg.pool) > s->pack_parts)
        g4__bwd_mm_part(&j, 0, 1);
    else g4__parallel(s->cfg.pool, g4__bwd_mm_part, &j);
}

static size_t g4__pack_thread_floats(void) { return G4__PACK_THREAD; }

/* The data caches the CPU reports, in bytes (0: not reported): on Linux
   sysfs (cpu0's caches by level, instruction caches skipped), elsewhere
   sysconf where the C library names them (glibc's _SC_LEVEL*_CACHE_SIZE),
   else none. */
static void g4__cache_sizes(long *l1d, long *l2, long *l3) {
    long *at[3];
    at[0] = l1d; at[1] = l2; at[2] = l3;
    *l1d = *l2 = *l3 = 0;
#if defined(__linux__)
    {
        char path[80], line[64];
        int i, lvl;
        for (i = 0; i < 10; i++) {
            FILE *f;
            long v;
            char *end;
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
            if (!(f = fopen(path, "r"))) break;
            lvl = fgets(line, sizeof line, f) ? atoi(line) : 0;
            fclose(f);
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
            if (!(f = fopen(path, "r"))) continue;
            if (!fgets(line, sizeof line, f)) line[0] = 0;
            fclose(f);
            if (lvl < 1 || lvl > 3 || strncmp(line, "Instruction", 11) == 0) continue;
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
            if (!(f = fopen(path, "r"))) continue;
            v = fgets(line, sizeof line, f) ? strtol(line, &end, 10) : 0;
            fclose(f);
            if (v <= 0) continue;
            if (*end == 'K') v *= 1024;
            else if (*end == 'M') v *= 1024 * 1024;
            *at[lvl - 1] = v;
        }
    }
#endif
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
    if (!*l1d) *l1d = sysconf(_SC_LEVEL1_DCACHE_SIZE) > 0 ? sysconf(_SC_LEVEL1_DCACHE_SIZE) : 0;
    if (!*l2) *l2 = sysconf(_SC_LEVEL2_CACHE_SIZE) > 0 ? sysconf(_SC_LEVEL2_CACHE_SIZE) : 0;
    if (!*l3) *l3 = sysconf(_SC_LEVEL3_CACHE_SIZE) > 0 ? sysconf(_SC_LEVEL3_CACHE_SIZE) : 0;
#endif
}

/* g4__attend (>>ops), blocked: G query heads of one KV head over keys [lo, hi]
   of a slot, for each: scores = q.k (scale 1.0), softmax in float32, out =
   sum p * v. Head h's q, out
   at q + h D, out + h D, its scores at scores + h (hi - lo + 1). Keys live in
   row pos % capacity. Each head's arithmetic is the same whatever G (the
   bits of one head alone); G > 1 reads each key and value row once for the
   G heads instead of once per head (G4__ATT_KEYS rows at a time, so they
   stay in cache across the heads). bf16: scores, p and out rounded to bf16
   as g4__attend's (bf16_fast); the bf16 mode without it: g4__attend_torch. */
static void g4__attend_blocked(float *out, const float *q, int G, const g4_kv_slot *sl, int kvh, int lo, int hi, float *scores,
                               int bf16) {
    int D = sl->head_dim, stride = sl->kv_heads * D, L = hi - lo + 1, k, j, h, h0 = 0, c;
    const float *rows[8], *vbase = sl->v + (size_t)kvh * (size_t)D;
#define G4__KROW(r) (sl->k + (size_t)((r) % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D)
    if (bf16 && G4__QK_PAIRS(D)) { /* bf16_fast: the scores as VDPBF16PS sums them (g4__dot_pairs) */
#if G4__BF16DOT
        uint16_t qb[8 * 512];
        float t[16];
        for (; h0 < G; h0 += 8) { /* 8 heads at a time (the last group padded with its last head) */
            int g = G - h0 < 8 ? G - h0 : 8;
            for (j = 0; j < 8; j++) g4__to_bf16(qb + (size_t)j * (size_t)D, q + (size_t)(h0 + (j < g ? j : g - 1)) * (size_t)D, 1, D);
            for (k = lo; k <= hi; k += 2) {
                g4__dot8x2_bf16(t, 2, G4__KROW(k), G4__KROW(k + 1 <= hi ? k + 1 : k), qb, D);
                for (j = 0; j < g; j++) {
                    scores[(size_t)(h0 + j) * (size_t)L + (size_t)(k - lo)] = t[2 * j];
                    if (k + 1 <= hi) scores[(size_t)(h0 + j) * (size_t)L + (size_t)(k + 1 - lo)] = t[2 * j + 1];
                }
            }
        }
#endif
        for (h = h0; h < G; h++)
            for (k = lo; k <= hi; k++) scores[(size_t)h * (size_t)L + (size_t)(k - lo)] = g4__dot_pairs(q + (size_t)h * (size_t)D, G4__KROW(k), D);
        h0 = G;
    }
    for (; h0 + 8 <= G; h0 += 8) { /* 8 heads against each key (g4__dot8) */
        for (j = 0; j < 8; j++) rows[j] = q + (size_t)(h0 + j) * (size_t)D;
        k = lo;
#ifdef G4__VHSUM16
        for (; k + 1 <= hi; k += 2) /* two keys at a time, the same bits */
            g4__dot8x2(scores + (size_t)h0 * (size_t)L + (size_t)(k - lo), (size_t)L,
                       sl->k + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D,
                       sl->k + (size_t)((k + 1) % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D, rows, D);
#endif
        for (; k <= hi; k++)
            g4__dot8(scores + (size_t)h0 * (size_t)L + (size_t)(k - lo), (size_t)L, sl->k + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D,
                     rows, D);
    }
    for (h = h0; h < G; h++) { /* the other heads: 8 keys at a time against one q (g4__dot8) */
        const float *qh = q + (size_t)h * (size_t)D;
        float *sh = scores + (size_t)h * (size_t)L;
        for (k = lo; k <= hi; k++) {
            rows[(k - lo) % 8] = sl->k + (size_t)(k % sl->capacity) * (size_t)stride + (size_t)kvh * (size_t)D;
            if ((k - lo) % 8 == 7) g4__dot8(sh + (k - 7 - lo), 1, qh, rows, D);
        }
        for (j = 0; j < L % 8; j++) sh[L - L % 8 + j] = g4__dot(qh, rows[j], D);
    }
    if (bf16) g4__bf16_round_range(scores, 0, (size_t)G * (size_t)L);
    for (h = 0; h < G && L > 0; h++)
        if (!bf16) g4__softmax_n(scores + (size_t)h * (size_t)L, L); /* g4__softmax's bits, its exps in SIMD */
#if G4__BF16DOT
        else g4__softmax_torch_v(scores + (size_t)h * (size_t)L, L); /* bf16_fast: torch's float32 softmax */
#else
        else g4__softmax_torch(scores + (size_t)h * (size_t)L, L, 0, L);
#endif
    if (bf16) g4__bf16_round_range(scores, 0, (size_t)G * (size_t)L);
    if (bf16) { /* bf16_fast: p v in pairs of keys (g4__wsum_pairs) */
#if G4__BF16DOT
        if (D % 16 == 0) g4__wsum_bf16(out, scores, G, vbase, (size_t)stride, sl->capacity, lo, L, D);
        else
#endif
            for (h = 0; h < G; h++)
                g4__wsum_pairs(out + (size_t)h * (size_t)D, scores + (size_t)h * (size_t)L, vbase, (size_t)stride, sl->capacity, lo, L, D);
    } else /* out = 0, then out += p[k] v[k], k in order (g4__wsum_ring: as g4__axpy per key), runs of keys across the heads */
    for (c = lo; c <= hi; c += G4__ATT_KEYS) {
        int m = hi - c + 1 < G4__ATT_KEYS ? hi - c + 1 : G4__ATT_KEYS;
        for (h = 0; h < G; h++)
            g4__wsum_ring(out + (size_t)h * (size_t)D, scores + (size_t)h * (size_t)L + (size_t)(c - lo), vbase, (size_t)stride, sl->capacity,
                          c, m, D, c > lo);
    }
    if (L <= 0)
        for (h = 0; h < G; h++) memset(out + (size_t)h * (size_t)D, 0, sizeof(float) * (size_t)D);
    if (bf16) g4__bf16_round_range(out, 0, (size_t)G * (size_t)D);
#undef G4__KROW
}

/* ======================================================== end of backend */

/* ------------------------------------------ adapter regex engine >>regex */
/* g4__re (its types in >>adapter): the Python regular expressions of peft's
   adapter_config.json as a Thompson NFA (no backtracking: linear time on any
   input). */

static g4__refrag g4__re_none(void) { g4__refrag f; f.start = f.holes = -1; return f; }

static int g4__re_new(g4__re *r, int type) {
    g4__re_state *s;
    if (r->n >= G4__RE_STATES) { if (!r->bad) r->bad = "it is too long"; return -1; }
    s = &r->st[r->n];
    memset(s, 0, sizeof *s);
    s->type = (unsigned char)type;
    s->out = s->out1 = -1;
    return r->n++;
}

static int *g4__re_field(g4__re *r, int h) { return (h & 1) ? &r->st[h >> 1].out1 : &r->st[h >> 1].out; }

static void g4__re_patch(g4__re *r, int holes, int to) {
    while (holes >= 0) {
        int *f = g4__re_field(r, holes);
        holes = *f;
        *f = to;
    }
}

static int g4__re_join(g4__re *r, int a, int b) {
    int h = a;
    if (a < 0) return b;
    while (*g4__re_field(r, h) >= 0) h = *g4__re_field(r, h);
    *g4__re_field(r, h) = b;
    return a;
}

static g4__refrag g4__re_one(g4__re *r, int type, const unsigned char *set) {
    g4__refrag f = g4__re_none();
    int s = g4__re_new(r, type);
    if (s < 0) return f;
    if (set) memcpy(r->st[s].set, set, 32);
    f.start = s;
    f.holes = s << 1;
    return f;
}

static g4__refrag g4__re_cat2(g4__re *r, g4__refrag a, g4__refrag b) {
    if (a.start < 0 || b.start < 0) return g4__re_none();
    g4__re_patch(r, a.holes, b.start);
    a.holes = b.holes;
    return a;
}

/* x*, x+ or x? */
static g4__refrag g4__re_quant(g4__re *r, g4__refrag x, int kind) {
    g4__refrag f = g4__re_none();
    int s;
    if (x.start < 0 || (s = g4__re_new(r, G4__RE_SPLIT)) < 0) return f;
    r->st[s].out = x.start;
    if (kind == '?') { f.start = s; f.holes = g4__re_join(r, x.holes, s << 1 | 1); }
    else { g4__re_patch(r, x.holes, s); f.start = kind == '*' ? s : x.start; f.holes = s << 1 | 1; }
    return f;
}

static int g4__isdigit(int c) { return c >= '0' && c <= '9'; }
static int g4__isalnum(int c) { return g4__isdigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static void g4__re_bit(unsigned char *set, int c) { set[c >> 3] = (unsigned char)(set[c >> 3] | (1u << (c & 7))); }

/* \d \w \s \D \W \S into set (ASCII, as the module names are); 0: not a class escape */
static int g4__re_class_escape(unsigned char *set, char c) {
    unsigned char t[32];
    int i, k = c | 0x20;
    memset(t, 0, sizeof t);
    if (k == 'd') for (i = '0'; i <= '9'; i++) g4__re_bit(t, i);
    else if (k == 'w') { for (i = 0; i < 128; i++) if (g4__isalnum(i) || i == '_') g4__re_bit(t, i); }
    else if (k == 's') { const char *w = " \t\n\r\f\v"; for (; *w; w++) g4__re_bit(t, *w); }
    else return 0;
    for (i = 0; i < 32; i++) set[i] = (unsigned char)(set[i] | (c >= 'a' ? t[i] : (unsigned char)~t[i]));
    return 1;
}

/* the character an escape \c stands for, or -1 when it is not a plain one */
static int g4__re_literal_escape(char c) {
    if (c == 'n') return '\n';
    if (c == 't') return '\t';
    if (c == 'r') return '\r';
    if (c == 'f') return '\f';
    if (c == 'v') return '\v';
    if (!g4__isalnum((unsigned char)c) && c) return (unsigned char)c;
    return -1;
}

static g4__refrag g4__re_alt(g4__re *r, int depth);

static g4__refrag g4__re_class(g4__re *r) {
    unsigned char set[32];
    int neg = 0, first = 1, i;
    memset(set, 0, sizeof set);
    if (r->p < r->end && *r->p == '^') { neg = 1; r->p++; }
    for (;;) {
        int lo, hi;
        if (r->p >= r->end) { r->bad = "a [ has no ]"; return g4__re_none(); }
        if (*r->p == ']' && !first) { r->p++; break; }
        first = 0;
        lo = (unsigned char)*r->p++;
        if (lo == '\\') {
            if (r->p >= r->end) { r->bad = "it ends in \\"; return g4__re_none(); }
            if (g4__re_class_escape(set, *r->p)) { r->p++; continue; }
            if ((lo = g4__re_literal_escape(*r->p)) < 0) { r->bad = "it has an unsupported escape in [...]"; return g4__re_none(); }
            r->p++;
        }
        hi = lo;
        if (r->end - r->p >= 2 && r->p[0] == '-' && r->p[1] != ']') {
            r->p++;
            hi = (unsigned char)*r->p++;
            if (hi == '\\') {
                if (r->p >= r->end || (hi = g4__re_literal_escape(*r->p)) < 0) { r->bad = "it has a bad range in [...]"; return g4__re_none(); }
                r->p++;
            }
            if (hi < lo) { r->bad = "it has a reversed range in [...]"; return g4__re_none(); }
        }
        for (i = lo; i <= hi; i++) g4__re_bit(set, i);
    }
    if (neg) for (i = 0; i < 32; i++) set[i] = (unsigned char)~set[i];
    return g4__re_one(r, G4__RE_SET, set);
}

static g4__refrag g4__re_atom(g4__re *r, int depth) {
    unsigned char set[32];
    g4__refrag f;
    int c, i;
    memset(set, 0, sizeof set);
    if (r->p >= r->end) { r->bad = "it ends early"; return g4__re_none(); }
    c = (unsigned char)*r->p++;
    switch (c) {
    case '(':
        if (r->p < r->end && *r->p == '?') {
            if (r->end - r->p >= 2 && r->p[1] == ':') r->p += 2;
            else if (r->end - r->p >= 3 && r->p[1] == 'P' && r->p[2] == '<') {
                r->p += 3;
                while (r->p < r->end && *r->p != '>') r->p++;
                if (r->p >= r->end) { r->bad = "a (?P<name> is not closed"; return g4__re_none(); }
                r->p++;
            } else { r->bad = "it uses (?...) other than (?:...) and (?P<name>...)"; return g4__re_none(); }
        }
        f = g4__re_alt(r, depth + 1);
        if (r->bad) return g4__re_none();
        if (r->p >= r->end || *r->p != ')') { r->bad = "a ( has no )"; return g4__re_none(); }
        r->p++;
        return f;
    case '[': return g4__re_class(r);
    case '.':
        for (i = 0; i < 256; i++) if (i != '\n') g4__re_bit(set, i);
        return g4__re_one(r, G4__RE_SET, set);
    case '^': return g4__re_one(r, G4__RE_BOL, NULL);
    case '$': return g4__re_one(r, G4__RE_EOL, NULL);
    case '*': case '+': case '?': r->bad = "it has nothing to repeat"; return g4__re_none();
    case '\\':
        if (r->p >= r->end) { r->bad = "it ends in \\"; return g4__re_none(); }
        c = (unsigned char)*r->p++;
        if (c == 'A') return g4__re_one(r, G4__RE_BOL, NULL);
        if (c == 'Z') return g4__re_one(r, G4__RE_EOL, NULL);
        if (g4__re_class_escape(set, (char)c)) return g4__re_one(r, G4__RE_SET, set);
        if ((c = g4__re_literal_escape((char)c)) < 0) { r->bad = "it has an unsupported escape (backreference, \\b, ...)"; return g4__re_none(); }
        break;
    default: break;
    }
    g4__re_bit(set, c);
    return g4__re_one(r, G4__RE_SET, set);
}

/* {m}, {m,}, {m,n}, {,n} at p: 1 and the bounds (max -1: none); 0 when it
   is no repeat (then '{' is a literal, as in Python); -1 (*bad set) when it
   is one this engine refuses: min over max (Python's error too) or a count
   over 1000 (Python repeats; here it would cost a state per copy) */
static int g4__re_braces(const char *p, const char *end, int *mn, int *mx, const char **after, const char **bad) {
    long a = 0, b = -1;
    int da = 0, db = 0;
    if (p >= end || *p != '{') return 0;
    for (p++; p < end && g4__isdigit(*p); p++, da++) if ((a = a * 10 + (*p - '0')) > 100000) a = 100000;
    if (p < end && *p == ',') {
        for (p++, b = 0; p < end && g4__isdigit(*p); p++, db++) if ((b = b * 10 + (*p - '0')) > 100000) b = 100000;
        if (!db) b = -1;
    } else {
        if (!da) return 0;
        b = a;
    }
    if (p >= end || *p != '}') return 0;
    if (b >= 0 && b < a) { *bad = "a {m,n} has m > n"; return -1; }
    if (a > 1000 || b > 1000) { *bad = "a {m,n} repeat count is over 1000"; return -1; }
    *mn = (int)a; *mx = (int)b; *after = p + 1;
    return 1;
}

static g4__refrag g4__re_rep(g4__re *r, int depth) {
    const char *a = r->p, *after;
    g4__refrag x = g4__re_atom(r, depth);
    int mn, mx, i, br;
    if (r->bad || r->p >= r->end) return x;
    if (*r->p == '*' || *r->p == '+' || *r->p == '?') {
        x = g4__re_quant(r, x, *r->p++);
    } else if ((br = g4__re_braces(r->p, r->end, &mn, &mx, &after, &r->bad)) != 0) {
        if (br < 0) return g4__re_none();
        g4__refrag f = g4__re_one(r, G4__RE_JUMP, NULL);
        for (i = 0; i < (mn > 0 ? mn : 0) + (mx < 0 ? 1 : mx - mn) && !r->bad; i++) {
            g4__refrag y = x;
            if (i > 0) { /* another copy of the atom: parse it again */
                r->p = a;
                y = g4__re_atom(r, depth);
            }
            if (i >= mn) y = g4__re_quant(r, y, mx < 0 ? '*' : '?');
            f = g4__re_cat2(r, f, y);
        }
        r->p = after;
        x = f;
    } else {
        return x;
    }
    if (r->p < r->end && *r->p == '?') r->p++; /* lazy: the same set of matches */
    if (r->p < r->end && (*r->p == '*' || *r->p == '+' || *r->p == '?' || *r->p == '{')) {
        const char *why = NULL;
        if (*r->p != '{' || g4__re_braces(r->p, r->end, &mn, &mx, &after, &why)) { r->bad = "it repeats a repeat"; return g4__re_none(); }
    }
    return x;
}

static g4__refrag g4__re_cat(g4__re *r, int depth) {
    g4__refrag f = g4__re_one(r, G4__RE_JUMP, NULL);
    while (!r->bad && r->p < r->end && *r->p != '|' && *r->p != ')') f = g4__re_cat2(r, f, g4__re_rep(r, depth));
    return f;
}

static g4__refrag g4__re_alt(g4__re *r, int depth) {
    g4__refrag f;
    if (depth > 32) { r->bad = "it nests groups too deeply"; return g4__re_none(); }
    f = g4__re_cat(r, depth);
    while (!r->bad && r->p < r->end && *r->p == '|') {
        g4__refrag g;
        int s;
        r->p++;
        g = g4__re_cat(r, depth);
        if (f.start < 0 || g.start < 0 || (s = g4__re_new(r, G4__RE_SPLIT)) < 0) return g4__re_none();
        r->st[s].out = f.start;
        r->st[s].out1 = g.start;
        f.start = s;
        f.holes = g4__re_join(r, f.holes, g.holes);
    }
    return f;
}

/* pattern[0, len) -> r; 0, or -1 with r->bad saying why */
static int g4__re_compile(g4__re *r, const char *pattern, size_t len) {
    g4__refrag f;
    int m;
    r->n = 0;
    r->bad = NULL;
    r->p = pattern;
    r->end = pattern + len;
    f = g4__re_alt(r, 0);
    if (!r->bad && r->p < r->end) r->bad = "a ) has no (";
    if (r->bad) return -1;
    if ((m = g4__re_new(r, G4__RE_MATCH)) < 0 || f.start < 0) { if (!r->bad) r->bad = "it is too long"; return -1; }
    g4__re_patch(r, f.holes, m);
    r->start = f.start;
    return 0;
}

static void g4__re_add(g4__re *r, int *list, int *n, int s, size_t pos, size_t len) {
    if (s < 0 || r->on[s]) return;
    r->on[s] = 1;
    switch (r->st[s].type) {
    case G4__RE_SPLIT: g4__re_add(r, list, n, r->st[s].out, pos, len); g4__re_add(r, list, n, r->st[s].out1, pos, len); return;
    case G4__RE_JUMP: g4__re_add(r, list, n, r->st[s].out, pos, len); return;
    case G4__RE_BOL: if (pos == 0) g4__re_add(r, list, n, r->st[s].out, pos, len); return;
    case G4__RE_EOL: if (pos == len) g4__re_add(r, list, n, r->st[s].out, pos, len); return;
    default: list[(*n)++] = s;
    }
}

/* Does the compiled pattern match all of str[0, len) (Python's re.fullmatch)? */
static int g4__re_full(g4__re *r, const char *str, size_t len) {
    int *cl = r->l1, *nl = r->l2, nc = 0, nn, i, *tmp;
    size_t pos;
    memset(r->on, 0, (size_t)r->n);
    g4__re_add(r, cl, &nc, r->start, 0, len);
    for (pos = 0; pos < len && nc; pos++) {
        unsigned char c = (unsigned char)str[pos];
        nn = 0;
        memset(r->on, 0, (size_t)r->n);
        for (i = 0; i < nc; i++) {
            const g4__re_state *s = &r->st[cl[i]];
            if (s->type == G4__RE_SET && (s->set[c >> 3] >> (c & 7) & 1)) g4__re_add(r, nl, &nn, s->out, pos + 1, len);
        }
        tmp = cl; cl = nl; nl = tmp; nc = nn;
    }
    if (pos < len) return 0;
    for (i = 0; i < nc; i++)
        if (r->st[cl[i]].type == G4__RE_MATCH) return 1;
    return 0;
}

/* ------------------------------------------------ the 12B unified >>unified */
/* gemma4_unified (transformers 5.23.0, models/gemma4_unified/modeling_gemma4_unified.py),
   the parts that are not Gemma 4's decoder:

   The text model. Gemma4UnifiedTextDecoderLayer.forward is, op for op and in
   the same order, Gemma4TextDecoderLayer.forward without the MoE branch and
   without the per-layer input (PLE) block:
       residual = x;  x = input_layernorm(x);  x = self_attn(x)
       x = post_attention_layernorm(x);  x = residual + x
       residual = x;  x = pre_feedforward_layernorm(x);  x = mlp(x)
       x = post_feedforward_layernorm(x);  x = residual + x
       x *= layer_scalar
   and Gemma4UnifiedTextAttention, Gemma4UnifiedTextMLP (double-wide on shared
   layers), the rotary embedding, the shared-KV table (kv_sharing_modes), the
   scaled embedding, the final norm, the tied lm_head and the soft-cap are
   Gemma 4's. So a unified checkpoint runs through >>forward's layer with
   hidden_size_per_layer_input and enable_moe_block both 0 (its config has
   neither key; >>config forces them off), with the same plan, table and
   arena: no second copy of the layer. What is the 12B's own is here: its
   config's sub-configs and the two embedders that replace the towers.

   Gemma4UnifiedVisionEmbedder.forward, per merged patch (one row):
       h = patch_ln1(pixels)          nn.LayerNorm(Pd), eps 1e-5 (its default)
       h = patch_dense(h)             Linear(Pd -> D) with bias
       h = patch_ln2(h)               nn.LayerNorm(D)
       h = h + (pos_embedding[x][0] * (x != -1) + pos_embedding[y][1] * (y != -1))
       h = pos_norm(h)                nn.LayerNorm(D)
       soft = multimodal_embedder(h): RMSNorm without weight (vision_config.rms_norm_eps),
                                      then embedding_projection, Linear(D -> H) no bias
   and get_image_features drops the rows whose positions are both -1.
   embed_audio is the same multimodal embedder on raw frames of A samples;
   get_audio_features' caller drops the frames input_features_mask marks. */

/* vision_config and audio_config of a gemma4_unified wrapper (absent or null: that part is off) */
static g4_result g4__cfg_unified(const g4__cfg *top, g4_config *cfg) {
    g4_unified_vision_config *v = &cfg->unified_vision;
    g4_unified_audio_config *a = &cfg->unified_audio;
    g4__cfg c = *top;
    g4_result r;
    int n = g4__jget(top->j, top->obj, "vision_config");
    if (n >= 0 && top->j->nodes[n].type != G4__JNULL) {
        int64_t ps;
        if (top->j->nodes[n].type != G4__JOBJ) {
            g4__seterr(top->err, "%s: field 'vision_config' must be an object", top->name);
            return G4_ERR_CONFIG;
        }
        c.obj = n;
        c.scope = "vision_config.";
        if ((r = g4__cfg_int(&c, "patch_size", &v->patch_size, 16, 0, 1, 4096)) != G4_OK) return r;
        if ((r = g4__cfg_int(&c, "pooling_kernel_size", &v->pooling_kernel_size, 3, 0, 1, 4096)) != G4_OK) return r;
        if ((r = g4__cfg_int(&c, "mm_embed_dim", &v->mm_embed_dim, 3840, 0, 1, 1 << 20)) != G4_OK) return r;
        if ((r = g4__cfg_int(&c, "mm_posemb_size", &v->mm_posemb_size, 1120, 0, 1, 1 << 20)) != G4_OK) return r;
        if ((r = g4__cfg_int(&c, "output_proj_dims", &v->output_proj_dims, 3840, 0, 1, 1 << 20)) != G4_OK) return r;
        if ((r = g4__cfg_float(&c, "rms_norm_eps", &v->rms_norm_eps, 1e-6f, 0.0, 1.0)) != G4_OK) return r;
        ps = (int64_t)v->patch_size * v->pooling_kernel_size;
        if (3 * ps * ps > (1 << 24)) {
            g4__seterr(top->err, "%s: vision_config: a merged patch of (patch_size %d x pooling_kernel_size %d)^2 x 3 "
                       "values is too large", top->name, v->patch_size, v->pooling_kernel_size);
            return G4_ERR_CONFIG;
        }
        if (v->output_proj_dims != v->mm_embed_dim) { /* embedding_projection reads the D-wide patch embedding */
            g4__seterr(top->err, "%s: vision_config.output_proj_dims (%d) must equal vision_config.mm_embed_dim (%d): "
                       "the multimodal embedder projects the patch embedding", top->name, v->output_proj_dims,
                       v->mm_embed_dim);
            return G4_ERR_CONFIG;
        }
        v->present = 1;
    }
    n = g4__jget(top->j, top->obj, "audio_config");
    if (n >= 0 && top->j->nodes[n].type != G4__JNULL) {
        if (top->j->nodes[n].type != G4__JOBJ) {
            g4__seterr(top->err, "%s: field 'audio_config' must be an object", top->name);
            return G4_ERR_CONFIG;
        }
        c.obj = n;
        c.scope = "audio_config.";
        if ((r = g4__cfg_int(&c, "audio_embed_dim", &a->audio_embed_dim, 640, 0, 1, 1 << 20)) != G4_OK) return r;
        if ((r = g4__cfg_float(&c, "rms_norm_eps", &a->rms_norm_eps, 1e-6f, 0.0, 1.0)) != G4_OK) return r;
        a->present = 1;
    }
    return G4_OK;
}

/* use_bidirectional_attention "all" (Gemma4UnifiedTextConfig.__post_init__): is_causal False, and the
   sliding window becomes sliding_window // 2 + 1 (config.json stores (W - 1) * 2, so it reloads to W) */
static g4_result g4__cfg_unified_all(const g4__cfg *text, g4_config *cfg) {
    int n = g4__jget(text->j, text->obj, "use_bidirectional_attention");
    if (n >= 0 && text->j->nodes[n].type == G4__JSTR && g4__jis(&text->j->nodes[n], "all"))
        cfg->sliding_window = cfg->sliding_window / 2 + 1;
    return G4_OK;
}

/* The keys of a query at position p, step rows [s->layer_pos, s->layer_pos + n), under "all"
   (create_bidirectional_mask / create_bidirectional_sliding_window_mask): full
   layers every position held, through the step's last row; sliding layers
   |q - kv| <= W, of which the positions before this step are only the last
   W - 1 (DynamicSlidingWindowLayer keeps sliding_window - 1). So a prompt in
   one step is transformers' full forward, and decoding one token at a time is
   generate()'s; a prompt split over steps sees what transformers' chunked
   prefill with a cache sees. */
static void g4__all_range(const g4_session *s, int window, int n, int p, int *lo, int *hi) {
    int last = s->layer_pos + n - 1;
    if (window) {
        *lo = p - window > s->layer_pos - (window - 1) ? p - window : s->layer_pos - (window - 1);
        if (*lo < 0) *lo = 0;
        *hi = p + window < last ? p + window : last;
    } else {
        *lo = 0;
        *hi = last;
    }
}

/* The embedders' tensors, each required with its exact shape when its config part is present.
   Checkpoints name them as save_pretrained writes them (transformers' conversion_mapping.py,
   "gemma4_unified": model.vision_embedder.patch_ln1.* and model.embed_vision.embedding_projection
   on disk for the modules embed_vision.patch_ln1 and embed_vision.multimodal_embedder.
   embedding_projection); from_pretrained takes the module names as well, and so does this. */
static g4_result g4__unified_bind(g4_model *m) {
    const g4_config *c = &m->config;
    g4_unified_weights *u = &m->w.unified;
    int64_t H = c->hidden_size, d[3];
    g4_result r;
#define G4__UB(t, disk, module, nd, a, b, cc)                                                                \
    do {                                                                                                    \
        d[0] = a; d[1] = b; d[2] = cc;                                                                      \
        if ((r = g4__bind(m, NULL, t, g4__st_find(m, "model." module) && !g4__st_find(m, "model." disk)     \
                                       ? "model." module : "model." disk, nd, d)) != G4_OK)                 \
            return r;                                                                                       \
    } while (0)
    if (c->unified_vision.present) {
        int64_t ps = (int64_t)c->unified_vision.patch_size * c->unified_vision.pooling_kernel_size, Pd = 3 * ps * ps;
        int64_t D = c->unified_vision.mm_embed_dim, NP = c->unified_vision.mm_posemb_size;
        G4__UB(&u->patch_ln1_weight, "vision_embedder.patch_ln1.weight", "embed_vision.patch_ln1.weight", 1, Pd, 0, 0);
        G4__UB(&u->patch_ln1_bias, "vision_embedder.patch_ln1.bias", "embed_vision.patch_ln1.bias", 1, Pd, 0, 0);
        G4__UB(&u->patch_dense_weight, "vision_embedder.patch_dense.weight", "embed_vision.patch_dense.weight", 2, D, Pd, 0);
        G4__UB(&u->patch_dense_bias, "vision_embedder.patch_dense.bias", "embed_vision.patch_dense.bias", 1, D, 0, 0);
        G4__UB(&u->patch_ln2_weight, "vision_embedder.patch_ln2.weight", "embed_vision.patch_ln2.weight", 1, D, 0, 0);
        G4__UB(&u->patch_ln2_bias, "vision_embedder.patch_ln2.bias", "embed_vision.patch_ln2.bias", 1, D, 0, 0);
        G4__UB(&u->pos_embedding, "vision_embedder.pos_embedding", "embed_vision.pos_embedding", 3, NP, 2, D);
        G4__UB(&u->pos_norm_weight, "vision_embedder.pos_norm.weight", "embed_vision.pos_norm.weight", 1, D, 0, 0);
        G4__UB(&u->pos_norm_bias, "vision_embedder.pos_norm.bias", "embed_vision.pos_norm.bias", 1, D, 0, 0);
        G4__UB(&u->vision_projection, "embed_vision.embedding_projection.weight",
               "embed_vision.multimodal_embedder.embedding_projection.weight", 2, H, D, 0);
    }
    if (c->unified_audio.present)
        G4__UB(&u->audio_projection, "embed_audio.embedding_projection.weight", "embed_audio.embedding_projection.weight",
               2, H, c->unified_audio.audio_embed_dim, 0);
#undef G4__UB
    return G4_OK;
}

/* The mean of x[0..n) and its biased variance *var, both summed in double (both LayerNorms below) */
static double g4__moments(const float *x, int n, double *var) {
    double mean = 0, v = 0;
    int i;
    for (i = 0; i < n; i++) mean += x[i];
    mean /= n;
    for (i = 0; i < n; i++) v += ((double)x[i] - mean) * ((double)x[i] - mean);
    *var = v / n;
    return mean;
}

/* nn.LayerNorm over one row of n (float32 in and out): (x - mean) / sqrt(var + eps) * w + b, var
   biased. The mean and variance are summed in double (torch sums in float32 in its own order;
   they agree within a few ulp, far inside the embedders' 1e-4). */
static void g4__layernorm(float *y, const float *x, const g4_tensor *w, const g4_tensor *b, int n, float eps) {
    double var, mean = g4__moments(x, n, &var);
    float m, rstd;
    int i;
    m = (float)mean;
    rstd = (float)(1.0 / sqrt(var + (double)eps));
    for (i = 0; i < n; i++) y[i] = (x[i] - m) * rstd * g4__get(w, (size_t)i) + g4__get(b, (size_t)i);
}

#define G4__LAYERNORM_EPS 1e-5f /* nn.LayerNorm's default eps: the embedder builds its LayerNorms without one */

/* The embedders' working state. They run on the decoder's backend as the towers
   do: each linear is g4__matmul (the packed SIMD GEMM, output rows split across
   the run's pool), each per-row norm a row loop split across the pool (rows are
   independent, so any split gives the same bits). scalar 1 is the oracle the
   tests compare with: g4__matmul_ref and the same row loops on one thread. */
typedef struct {
    float *a, *b, *c;  /* [rows][wa], [rows][wb], [rows][D] */
    g4_session mm;     /* the decoder's matmul on the run's pool (only its matmul fields are set) */
    int scalar, bf16;
} g4__uarena;

/* The arena's buffers for `rows` rows and `threads` packing buffers (base NULL:
   count only); returns the bytes needed. */
static uint64_t g4__unified_carve(const g4_model *m, int rows, int threads, void *base, g4__uarena *U) {
    const g4_config *cf = &m->config;
    g4__carver cv;
    int64_t Pd = 0, D = 0, A = cf->unified_audio.present ? cf->unified_audio.audio_embed_dim : 0, wa, wb;
    if (cf->unified_vision.present) {
        int64_t ps = (int64_t)cf->unified_vision.patch_size * cf->unified_vision.pooling_kernel_size;
        Pd = 3 * ps * ps;
        D = cf->unified_vision.mm_embed_dim;
    }
    wa = Pd > cf->hidden_size ? Pd : cf->hidden_size; /* patch_ln1 [Pd], multimodal_embedder [H] */
    if (A > wa) wa = A;
    wb = D > cf->hidden_size ? D : cf->hidden_size;    /* the D-wide steps; embed_audio [H] */
    if (A > wb) wb = A;                                /* embed_audio's input cast to bf16 (bf16 mode) */
    memset(&cv, 0, sizeof cv);
    cv.base = (unsigned char *)base;
    cv.poison = 1;
    U->a = g4__take(&cv, (uint64_t)rows * (uint64_t)wa, sizeof(float));
    U->b = g4__take(&cv, (uint64_t)rows * (uint64_t)wb, sizeof(float));
    U->c = g4__take(&cv, (uint64_t)rows * (uint64_t)(D > 0 ? D : 1), sizeof(float));
    U->mm.pack = g4__take(&cv, (uint64_t)threads * g4__pack_thread_floats() + 1, sizeof(float));
    U->mm.pack_parts = threads;
    U->mm.lora_u = NULL;
    if (m->lora_rmax > 0) /* a LoRA adapter's A x (>>adapter): an arena sized before the adapter is too small */
        U->mm.lora_u = g4__take(&cv, (uint64_t)rows * (uint64_t)m->lora_rmax, sizeof(float));
    return cv.overflow ? UINT64_MAX : cv.off;
}

G4__DEF g4_result g4_unified_size_pool(const g4_model *m, int max_rows, const g4_pool *pool, size_t *bytes) {
    g4__uarena U;
    uint64_t need;
    if (!m || !bytes || max_rows < 1 || !m->config.unified) return G4_ERR_INPUT;
    need = g4__unified_carve(m, max_rows, g4_pool_threads(pool), NULL, &U);
    if (need == UINT64_MAX || need > (uint64_t)SIZE_MAX) return G4_ERR_INPUT;
    *bytes = (size_t)need;
    return G4_OK;
}

G4__DEF g4_result g4_unified_size(const g4_model *m, int max_rows, size_t *bytes) {
    return g4_unified_size_pool(m, max_rows, NULL, bytes);
}

/* the checks both embedders share; carves the arena for the run's pool (one
   thread when the arena was sized for fewer) */
static g4_result g4__unified_begin(const g4_model *m, const void *in, int n, void *arena, size_t bytes,
                                   g4_unified_run *run, float *soft, int *n_soft, int vision, int scalar, g4__uarena *U) {
    const char *what = vision ? "image" : "audio";
    uint64_t need;
    int threads;
    if (!run) return G4_ERR_INPUT;
    run->error[0] = 0;
    if (!m || !in || !soft || !n_soft || !arena) {
        g4__seterr(run->error, "g4_unified_embed_%s: NULL model, input, soft, n_soft or arena", what);
        return G4_ERR_INPUT;
    }
    *n_soft = 0;
    if (!m->config.unified || !(vision ? m->config.unified_vision.present : m->config.unified_audio.present)) {
        g4__seterr(run->error, "g4_unified_embed_%s: the model is not a gemma4_unified checkpoint with a%s",
                   what, vision ? " vision_config" : "n audio_config");
        return G4_ERR_INPUT;
    }
    if (n < 1) {
        g4__seterr(run->error, "g4_unified_embed_%s: %d rows; at least 1", what, n);
        return G4_ERR_INPUT;
    }
    if (((uintptr_t)arena & 63) != 0) {
        g4__seterr(run->error, "g4_unified_embed_%s: the arena must be 64-byte aligned", what);
        return G4_ERR_ARENA;
    }
    threads = scalar ? 1 : g4_pool_threads(run->pool);
    if (threads > 1 && g4__unified_carve(m, n, threads, NULL, U) > (uint64_t)bytes) threads = 1; /* sized for one */
    need = g4__unified_carve(m, n, threads, NULL, U);
    if (need > (uint64_t)bytes) {
        g4__seterr(run->error, "g4_unified_embed_%s: %d rows need an arena of %llu bytes, got %llu (g4_unified_size)",
                   what, n, (unsigned long long)need, (unsigned long long)bytes);
        return G4_ERR_ARENA;
    }
    G4__ASAN_UNPOISON(arena, bytes);
    memset(&U->mm, 0, sizeof U->mm); /* the decoder's matmul reads only these of its session */
    U->mm.model = m;
    U->mm.cfg = g4_session_config_init();
    U->mm.cfg.pool = threads > 1 ? run->pool : NULL;
    U->mm.cfg.bf16 = U->bf16 = run->bf16 != 0;
    U->scalar = scalar;
    g4__unified_carve(m, n, threads, arena, U);
    return G4_OK;
}

static void g4__unified_tap(const g4_unified_run *run, const char *name, const float *x, int n, int cols) {
    if (run->tap) run->tap(run->tap_user, name, -1, x, n, cols, 0);
}

/* The per-row steps, split across the pool by rows (g4__parallel_range); the
   oracle runs them on one thread. */
typedef struct {
    float *y; const float *x; const g4_tensor *w, *b; int width; float eps;
    const int32_t *pos; const g4_tensor *pe; /* the position step */
    int bf16;
} g4__urow_job;

static void g4__urows(const g4__uarena *U, int n, void (*fn)(void *, size_t, size_t), g4__urow_job *j) {
    if (U->scalar) fn(j, 0, (size_t)n);
    else g4__parallel_range(&U->mm, (size_t)n, (size_t)j->width, fn, j);
}

/* nn.LayerNorm in bfloat16 on one row of bf16 values, as torch's CPU kernel
   (layer_norm_kernel_mixed_type) runs it: mean and variance in float, rstd =
   1 / sqrt(var + eps) and bias = -rstd * mean in float, then per element
   bf16((x * rstd + bias) * w + b), each a fused multiply-add as torch's compiled
   kernel does it. Not reproduced: torch sums the moments by a vectorized
   Welford cascade (moments_utils.h) whose float roundings this does not follow
   (it sums in double and rounds); the variance then differs by an ulp or two
   in some rows, which moves about 1 output in 10^4 (uniform rows) to 10^5
   (normal rows) by one bf16 ulp, up to 2 in 10^3 on rows whose mean is large
   against their spread (measured in Python on random rows of 24 to 6912
   values; none in the goldens, which match bit for bit). In place is fine. */
static void g4__layernorm_bf16(float *y, const float *x, const g4_tensor *w, const g4_tensor *b, int n, float eps) {
    double var, mean = g4__moments(x, n, &var);
    float rstd, bias;
    int i;
    rstd = 1.0f / sqrtf((float)var + eps);
    bias = -rstd * (float)mean;
    for (i = 0; i < n; i++)
        y[i] = g4__bf16_round(fmaf(fmaf(x[i], rstd, bias), g4__get(w, (size_t)i), b ? g4__get(b, (size_t)i) : 0.0f));
}

static void g4__ulayernorm_rows(void *ctx, size_t t0, size_t t1) {
    const g4__urow_job *j = (const g4__urow_job *)ctx;
    size_t t, W = (size_t)j->width;
    for (t = t0; t < t1; t++)
        if (j->bf16) g4__layernorm_bf16(j->y + t * W, j->x + t * W, j->w, j->b, j->width, j->eps);
        else g4__layernorm(j->y + t * W, j->x + t * W, j->w, j->b, j->width, j->eps);
}

/* Gemma4UnifiedRMSNorm without scale: in float32 (hidden_states.float()), then
   type_as the input: bf16 in the bf16 mode */
static void g4__urmsnorm_rows(void *ctx, size_t t0, size_t t1) {
    const g4__urow_job *j = (const g4__urow_job *)ctx;
    size_t t, W = (size_t)j->width;
    for (t = t0; t < t1; t++) {
        g4__rmsnorm(j->y + t * W, j->x + t * W, NULL, j->width, j->eps);
        if (j->bf16) g4__bf16_round_range(j->y + t * W, 0, W);
    }
}

/* the bf16 mode's input cast (pixel_values.to(bf16), inputs_embeds.to(bf16)) */
static void g4__ucast_rows(void *ctx, size_t t0, size_t t1) {
    const g4__urow_job *j = (const g4__urow_job *)ctx;
    size_t i, W = (size_t)j->width;
    for (i = t0 * W; i < t1 * W; i++) j->y[i] = g4__bf16_round(j->x[i]);
}

/* h + (pos_embedding[x][0] * (x != -1) + pos_embedding[y][1] * (y != -1)) in place
   (x on axis 0, y on axis 1; the two terms summed first, as
   (pos_embedding[clamped, axes] * valid).sum(-2) does) */
static void g4__upos_rows(void *ctx, size_t t0, size_t t1) {
    const g4__urow_job *j = (const g4__urow_job *)ctx;
    size_t t, i, D = (size_t)j->width;
    for (t = t0; t < t1; t++) {
        int x = j->pos[2 * t], y = j->pos[2 * t + 1];
        float *h = j->y + t * D;
        for (i = 0; i < D; i++) {
            float px = x >= 0 ? g4__get(j->pe, ((size_t)x * 2 + 0) * D + i) : 0.0f;
            float py = y >= 0 ? g4__get(j->pe, ((size_t)y * 2 + 1) * D + i) : 0.0f;
            h[i] = j->bf16 ? g4__bf16_round(h[i] + g4__bf16_round(px + py)) : h[i] + (px + py);
        }
    }
}

/* nn.Linear: y = x W^T (+ bias) on n rows. bf16 mode: the float sums in torch's
   order (g4__matmul_torch_ref, the decoder's bf16 matmul), plus the bias in
   float, then rounded to bf16 once, as torch's bf16 addmm does (rounding the
   product before adding the bias moved 102 of patch_dense's 384 outputs).
   A LoRA adapter on the module (w->lora, >>adapter) is peft's lora.Linear.forward:
   result = base_layer(x) (the bias included, bf16 in bf16 mode) + lora_B(lora_A(x))
   * scaling in float32 (peft keeps the adapter float32 on a bf16 model:
   autocast_adapter_dtype), then result.to(the base dtype). The SIMD path is the
   towers' g4__matmul_bias; the oracle g4__lora_forward. */
static void g4__ulinear(g4__uarena *U, float *y, const float *x, const g4_tensor *w, const g4_tensor *bias, int n) {
    int out = (int)w->shape[0], t, i;
    if (!U->scalar) { g4__matmul_bias(&U->mm, y, x, w, bias, n); return; }
    if (U->bf16 && w->dtype == G4_BF16) g4__matmul_torch_ref(y, x, w, n, 0, out);
    else g4__matmul_ref(y, x, w, n, 0, out);
    if (bias || U->bf16)
        for (t = 0; t < n; t++)
            for (i = 0; i < out; i++) {
                float *o = y + (size_t)t * out + i;
                if (bias) *o += g4__get(bias, (size_t)i);
                if (U->bf16) *o = g4__bf16_round(*o);
            }
    if (!w->lora) return;
    g4__lora_forward(y, x, w->lora, n, U->mm.lora_u, U->bf16);
    if (U->bf16) g4__bf16_round_range(y, 0, (size_t)n * (size_t)out);
}

/* Gemma4UnifiedMultimodalEmbedder: RMSNorm without weight, then embedding_projection (no bias) */
static void g4__unified_mm_embed(g4__uarena *U, const g4_unified_run *run, const char *norm_tap, const char *out_tap,
                                 float *normed, float *out, const float *x, const g4_tensor *proj, int n, int in,
                                 float eps) {
    g4__urow_job j;
    memset(&j, 0, sizeof j);
    j.y = normed; j.x = x; j.width = in; j.eps = eps; j.bf16 = U->bf16;
    g4__urows(U, n, g4__urmsnorm_rows, &j);
    g4__unified_tap(run, norm_tap, normed, n, in);
    g4__ulinear(U, out, normed, proj, NULL, n);
    g4__unified_tap(run, out_tap, out, n, (int)proj->shape[0]);
}

static g4_result g4__unified_image(const g4_model *m, const float *pixel_values, const int32_t *positions, int n,
                                   void *arena, size_t bytes, g4_unified_run *run, float *soft, int *n_soft,
                                   int scalar) {
    const g4_unified_vision_config *vc;
    const g4_unified_weights *u;
    g4__uarena U;
    g4__urow_job j;
    int t, k, Pd, D, H, NP;
    g4_result r = g4__unified_begin(m, pixel_values, n, arena, bytes, run, soft, n_soft, 1, scalar, &U);
    if (r != G4_OK) return r;
    vc = &m->config.unified_vision;
    u = &m->w.unified;
    Pd = 3 * vc->patch_size * vc->pooling_kernel_size * vc->patch_size * vc->pooling_kernel_size;
    D = vc->mm_embed_dim;
    H = m->config.hidden_size;
    NP = vc->mm_posemb_size;
    if (!positions) {
        g4__seterr(run->error, "g4_unified_embed_image: NULL positions");
        return G4_ERR_INPUT;
    }
    for (t = 0; t < n; t++)
        for (k = 0; k < 2; k++)
            if (positions[2 * t + k] < -1 || positions[2 * t + k] >= NP) {
                g4__seterr(run->error, "g4_unified_embed_image: patch %d has %c position %d; positions are -1 "
                           "(padding) or in [0, mm_posemb_size %d)", t, k ? 'y' : 'x', (int)positions[2 * t + k], NP);
                return G4_ERR_INPUT;
            }
    memset(&j, 0, sizeof j);
    j.eps = G4__LAYERNORM_EPS;
    j.bf16 = U.bf16;
    j.x = pixel_values; j.width = Pd;
    if (U.bf16) { /* pixel_values.to(the weights' dtype), then the norm in place */
        j.y = U.a;
        g4__urows(&U, n, g4__ucast_rows, &j);
        j.x = U.a;
    }
    /* Step 1: patch embedding, LN -> Dense -> LN */
    j.y = U.a; j.w = &u->patch_ln1_weight; j.b = &u->patch_ln1_bias;
    g4__urows(&U, n, g4__ulayernorm_rows, &j);
    g4__unified_tap(run, "embed_vision.patch_ln1", U.a, n, Pd);
    g4__ulinear(&U, U.b, U.a, &u->patch_dense_weight, &u->patch_dense_bias, n);
    g4__unified_tap(run, "embed_vision.patch_dense", U.b, n, D);
    j.y = U.c; j.x = U.b; j.w = &u->patch_ln2_weight; j.b = &u->patch_ln2_bias; j.width = D;
    g4__urows(&U, n, g4__ulayernorm_rows, &j);
    g4__unified_tap(run, "embed_vision.patch_ln2", U.c, n, D);
    /* Step 2: the factorized 2-D position embedding, then LN */
    j.y = U.c; j.pos = positions; j.pe = &u->pos_embedding;
    g4__urows(&U, n, g4__upos_rows, &j);
    j.y = U.b; j.x = U.c; j.w = &u->pos_norm_weight; j.b = &u->pos_norm_bias;
    g4__urows(&U, n, g4__ulayernorm_rows, &j);
    g4__unified_tap(run, "embed_vision.pos_norm", U.b, n, D);
    /* Step 3: the multimodal embedder, RMSNorm -> Linear */
    g4__unified_mm_embed(&U, run, "embed_vision.multimodal_embedder.embedding_pre_projection_norm",
                         "embed_vision.multimodal_embedder", U.c, U.a, U.b, &u->vision_projection, n, D, vc->rms_norm_eps);
    /* padding (both positions -1) is stripped before the merge */
    for (t = 0; t < n; t++)
        if (!(positions[2 * t] == -1 && positions[2 * t + 1] == -1))
            memcpy(soft + (size_t)(*n_soft)++ * H, U.a + (size_t)t * H, sizeof(float) * (size_t)H);
    G4__ASAN_UNPOISON(arena, bytes);
    return G4_OK;
}

G4__DEF g4_result g4_unified_embed_image(const g4_model *m, const float *pixel_values, const int32_t *positions,
                                         int n, void *arena, size_t bytes, g4_unified_run *run, float *soft,
                                         int *n_soft) {
    return g4__unified_image(m, pixel_values, positions, n, arena, bytes, run, soft, n_soft, 0);
}

/* _extract_waveform_features: np.pad to a multiple of A with zeros, reshape, float32 */
G4__DEF g4_result g4_unified_audio_frames(const g4_model *m, const float *pcm, size_t n, float *frames, int max_frames,
                                          g4_unified_run *run, int *n_frames) {
    size_t A, rows;
    if (!run) return G4_ERR_INPUT;
    run->error[0] = 0;
    if (!m || !frames || !n_frames || (!pcm && n)) {
        g4__seterr(run->error, "g4_unified_audio_frames: NULL model, pcm, frames or n_frames");
        return G4_ERR_INPUT;
    }
    *n_frames = 0;
    if (!m->config.unified || !m->config.unified_audio.present) {
        g4__seterr(run->error, "g4_unified_audio_frames: the model is not a gemma4_unified checkpoint with an audio_config");
        return G4_ERR_INPUT;
    }
    A = (size_t)m->config.unified_audio.audio_embed_dim;
    rows = (n + A - 1) / A;
    if (rows > (size_t)(max_frames > 0 ? max_frames : 0)) {
        g4__seterr(run->error, "g4_unified_audio_frames: %llu samples make %llu frames of %llu; room for %d",
                   (unsigned long long)n, (unsigned long long)rows, (unsigned long long)A, max_frames);
        return G4_ERR_INPUT;
    }
    if (n) memcpy(frames, pcm, sizeof(float) * n);
    memset(frames + n, 0, sizeof(float) * (rows * A - n));
    *n_frames = (int)rows;
    return G4_OK;
}

static g4_result g4__unified_audio(const g4_model *m, const float *frames, const unsigned char *valid, int n,
                                   void *arena, size_t bytes, g4_unified_run *run, float *soft, int *n_soft,
                                   int scalar) {
    g4__uarena U;
    g4__urow_job j;
    int t, A, H;
    g4_result r = g4__unified_begin(m, frames, n, arena, bytes, run, soft, n_soft, 0, scalar, &U);
    if (r != G4_OK) return r;
    A = m->config.unified_audio.audio_embed_dim;
    H = m->config.hidden_size;
    if (U.bf16) { /* inputs_embeds.to(the projection's dtype): the frames as bf16, in b until the norm has read them */
        memset(&j, 0, sizeof j);
        j.y = U.b; j.x = frames; j.width = A;
        g4__urows(&U, n, g4__ucast_rows, &j);
        frames = U.b;
    }
    g4__unified_mm_embed(&U, run, "embed_audio.embedding_pre_projection_norm", "embed_audio", U.a, U.b, frames,
                         &m->w.unified.audio_projection, n, A, m->config.unified_audio.rms_norm_eps);
    for (t = 0; t < n; t++)
        if (!valid || valid[t]) memcpy(soft + (size_t)(*n_soft)++ * H, U.b + (size_t)t * H, sizeof(float) * (size_t)H);
    G4__ASAN_UNPOISON(arena, bytes);
    return G4_OK;
}

G4__DEF g4_result g4_unified_embed_audio(const g4_model *m, const float *frames, const unsigned char *valid, int n,
                                         void *arena, size_t bytes, g4_unified_run *run, float *soft, int *n_soft) {
    return g4__unified_audio(m, frames, valid, n, arena, bytes, run, soft, n_soft, 0);
}

#endif /* GEMMA4_IMPLEMENTATION_DONE */
#endif /* GEMMA4_IMPLEMENTATION */
