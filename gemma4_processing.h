/* gemma4_processing.h - Gemma 4's processing beside gemma4.h's model: the
   tokenizer, the chat layout, the chat-template interpreter, the image
   processor and the audio feature extractor, exactly as Hugging Face
   tokenizers and transformers define them.                   MIT-0, see LICENSE

   WHAT IT IS
     The processing half of gemma4.h, as transformers keeps
     processing_gemma4.py and the tokenizer beside modeling_gemma4.py:
     g4_tokenizer_load reads the checkpoint's tokenizer.json (BPE with byte
     fallback, added tokens; encode/decode as the Python `tokenizers` library),
     g4_decode_next streams text, g4_template_* render the checkpoint's own
     chat template (a Jinja subset interpreter, exactly as transformers'
     apply_chat_template), g4_chat_encode writes the built-in Gemma 4 chat
     layout (for checkpoints without a template), g4_image_preprocess turns
     decoded pixels into the vision tower's patches as Gemma4ImageProcessor
     does and g4_mm_expand_images expands the image placeholders as
     Gemma4Processor does (g4_mm_expand: images and audio clips together, as
     Gemma4Processor and the 12B's Gemma4UnifiedProcessor do; the 12B's merged
     patches and raw audio frames: >>unified_processing), g4_video_preprocess does Gemma4VideoProcessor's
     frames and g4_mm_expand_videos the video placeholders with the frames'
     "mm:ss" stamps, g4_audio_features makes Gemma4AudioFeatureExtractor's
     log-mel features from 16 kHz PCM and g4_wav_parse reads a WAV file. The
     model never calls any of it; the sampler and speculative decoding stay in
     gemma4.h.

   MAP
     Every section starts with a banner that ends in ">>name". In order:
       >>api             the declarations: tokenizer, chat, template, image processor,
                         video processor, audio features, the 12B's processor
       >>implementation  compiled only with GEMMA4_IMPLEMENTATION
       >>tokenizer       tokenizer.json; >>encoding, >>decoding
       >>chat            the Gemma 4 chat layout (the fallback without a template)
       >>template        chat templates: a Jinja subset interpreter (lexer, parser,
                         Python values, renderer) behind g4_template_*
       >>image_processing Gemma4ImageProcessor (torchvision backend), bit for bit:
                         processor_config.json, target size, resize, patches (and
                         Gemma4UnifiedImageProcessor's merged ones); the processors'
                         placeholder expansion (g4_mm_expand_images, g4_mm_expand)
       >>video_processing Gemma4VideoProcessor, bit for bit: the video_processor
                         settings, sample_frames, each frame as an image with the
                         fused rescale/normalize; the processor's video expansion
                         in text (the frames' mm:ss stamps, g4_mm_expand_videos)
       >>audio_features  Gemma4AudioFeatureExtractor's settings from processor_config.json
                         (g4_audio_fe_load), its log-mel features (g4_audio_features)
                         and the WAV reader (g4_wav_parse)
       >>unified_processing the 12B's Gemma4UnifiedProcessor: its audio frames' settings
                         (g4_unified_fe), the framing (g4_unified_fe_frames), token
                         counts; images and placeholders are
                         >>image_processing's (kind G4_IMAGE_UNIFIED, g4_mm_expand)

   INTEGRATION
     Include gemma4.h first (this header refuses to compile without it); one
     GEMMA4_IMPLEMENTATION builds both, in exactly one C or C++ file:
         #define GEMMA4_IMPLEMENTATION
         #include "gemma4.h"
         #include "gemma4_processing.h"
     Everywhere else include the two without the define. gemma4.h's options
     (GEMMA4_STATIC, G4_MALLOC/G4_FREE, ...) cover this header too; its
     implementation uses gemma4.h's private helpers (errors, files, UTF-8, the
     JSON reader).

   MEMORY AND THREADS
     These allocate at init (the tokenizer's tables, a template's syntax tree);
     g4_tokenize allocates scratch per call, a g4_decode_state grows its
     buffers as byte runs need (g4_decode_free), rendering a template
     allocates from a private arena bounded by its options. A loaded tokenizer
     and a parsed template are read-only and may be shared by threads (see
     g4_template_render for its error buffer).

   GOLDENS
     The tests compare against tokenizers and transformers (apply_chat_template
     with jinja2): data/tokenizer/ and data/templates/ record their versions.

   ERRORS
     As gemma4.h: g4_result codes, and a message naming the file, field or
     template line in the failing object's .error.
*/
/* ======================================================================== */
/*                                API >>api                                 */
/* ======================================================================== */
#ifndef GEMMA4_H
#error "gemma4_processing.h: include gemma4.h first (it declares the types and options this header uses)"
#endif
#ifndef GEMMA4_PROCESSING_H
#define GEMMA4_PROCESSING_H

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- tokenizer */
/* Hugging Face tokenizer.json, the format Gemma checkpoints ship: a BPE model
   with byte fallback, a Replace normalizer (" " -> U+2581), a Split
   pre-tokenizer, a Replace + ByteFallback + Fuse decoder, a TemplateProcessing
   post-processor and added tokens matched literally in the input (leftmost,
   then longest), as the Python `tokenizers` library does. Other component
   types are rejected at load with a message naming the field.
   g4_tokenizer_load allocates (free with g4_tokenizer_free); afterwards the
   tokenizer is read-only and may be shared by threads. Encoding allocates
   temporary memory proportional to the text and frees it before returning. */

/* g4_tokenizer.flags bits. ADDED: the id is an added token's (the id tokenizers
   gives it, which need not be the file's "id"). SPECIAL: skip_special_tokens
   drops the id: tokenizers decides that by the string the id decodes from,
   dropped when it is the content of an added token marked "special" (for
   Gemma's files: exactly the special added tokens). */
enum { G4_TOKEN_ADDED = 1, G4_TOKEN_SPECIAL = 2 };
enum { G4_ENCODE_ADD_SPECIAL = 1 };   /* apply the post-processor template (e.g. <bos> first) */
enum { G4_DECODE_SKIP_SPECIAL = 1 };  /* leave out the ids flagged G4_TOKEN_SPECIAL (skip_special_tokens) */
#define G4_TOKENIZER_MAX_STEPS 8      /* most Replace steps in the normalizer or decoder */
#define G4_TOKENIZER_MAX_TEMPLATE 8   /* most ids the post-processor adds before or after */

/* A Replace step: every occurrence of `from` becomes `to` (both NUL-terminated). */
typedef struct { char from[32], to[32]; } g4_replace;

typedef struct {
    int n_vocab;                 /* ids are [0, n_vocab): the BPE vocab and the added tokens */
    int n_merges;                /* BPE merges; rank = index in the file's list */
    int n_added;                 /* ids that are an added token's */
    unsigned char *flags;        /* [n_vocab] G4_TOKEN_ADDED | G4_TOKEN_SPECIAL */
    int16_t *byte_value;         /* [n_vocab] the byte of a "<0xXX>" token when the decoder has ByteFallback, else -1 */
    uint32_t *text_off, *text_len; /* [n_vocab] the decoder's text for each id, in `text` (Replace steps applied) */
    char *text;                  /* every id's decoded text, back to back */
    /* the BPE model */
    uint32_t *vocab_off, *vocab_len; /* [n_vocab] the id's string in `vocab_str`; len UINT32_MAX: not in the BPE vocab */
    char *vocab_str;             /* BPE vocab strings, back to back */
    uint32_t *vocab_hash;        /* open addressing, 4 words a slot: string hash, id (UINT32_MAX: empty), offset, length */
    uint32_t vocab_mask;         /* slots - 1 (a power of two) */
    uint32_t *merge_slots;       /* open addressing, 4 words a slot: left id, right id
                                    (UINT32_MAX: empty), the merge's rank, the id of left+right */
    uint32_t merge_mask;         /* slots - 1 */
    int32_t byte_id[256];        /* id of "<0xXX>" in the BPE vocab, or -1 */
    int32_t unk_id;              /* unk_token's id, or -1 */
    int byte_fallback, fuse_unk, ignore_merges; /* the BPE model's switches */
    /* added tokens: a byte trie per matching mode; node 0 matches the raw
       input ("normalized": false), node 1 the normalized text ("normalized": true) */
    int32_t *trie_child, *trie_next, *trie_id; /* first child, next sibling, token id at this node (-1 none) */
    unsigned char *trie_byte;    /* the byte leading into the node */
    int n_trie;                  /* nodes in use */
    /* the pipeline */
    g4_replace norm[G4_TOKENIZER_MAX_STEPS]; int n_norm;   /* normalizer Replace steps, in order */
    char split[32];              /* pre-tokenizer Split pattern (MergedWithPrevious); "" none */
    g4_replace dec[G4_TOKENIZER_MAX_STEPS]; int n_dec;     /* decoder Replace steps, in order */
    int32_t prefix[G4_TOKENIZER_MAX_TEMPLATE]; int n_prefix; /* post-processor ids before the text */
    int32_t suffix[G4_TOKENIZER_MAX_TEMPLATE]; int n_suffix; /* post-processor ids after the text */
    /* Gemma 4 control tokens, found by content (-1 when the file has none) */
    int32_t bos, eos, pad;       /* "<bos>", "<eos>", "<pad>" */
    int32_t turn_open, turn_close, think; /* "<|turn>", "<turn|>", "<|think|>" */
    char error[G4_ERROR_MAX];
} g4_tokenizer;

/* PATH: a tokenizer.json, or a directory holding one. */
G4_API g4_result g4_tokenizer_load(g4_tokenizer *t, const char *path);
/* The text of a tokenizer.json; `name` only labels error messages. */
G4_API g4_result g4_tokenizer_parse(g4_tokenizer *t, const char *json, size_t len, const char *name);
G4_API void g4_tokenizer_free(g4_tokenizer *t); /* (t->error stays as it is) */
/* The id of a token by its exact string (added tokens first, then the BPE vocab), or -1. */
G4_API int32_t g4_token_id(const g4_tokenizer *t, const char *s);
/* Most ids g4_tokenize can produce for `len` bytes of text. */
G4_API size_t g4_tokenize_max(const g4_tokenizer *t, size_t len);
/* text[0..len) (UTF-8; an invalid byte counts as one character, which byte
   fallback encodes) -> ids. *n_ids: the count. If it exceeds cap, nothing
   more is written and the result is G4_ERR_INPUT with *n_ids the count needed.
   G4_ERR_NOMEM if scratch memory cannot be had. t is not modified. */
G4_API g4_result g4_tokenize(const g4_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids,
                             size_t cap, size_t *n_ids);
/* ids -> text, exactly as tokenizers' decode. Its ByteFallback decoder reads
   each run of consecutive byte tokens ("<0xXX>") as one byte string, ending at
   the next token that is not one or at the end: a run that is valid UTF-8 is
   its text, an invalid one (a stray, overlong, surrogate or truncated
   sequence, or a byte above F4, anywhere in it) is one U+FFFD for EVERY byte
   of the run, its valid characters included. Ids without a string, and with
   G4_DECODE_SKIP_SPECIAL the special tokens, are dropped first, so they do not
   end a run. Writes at most cap bytes including a NUL; *len: the text's
   length. If it does not fit, G4_ERR_INPUT with *len the length needed.
   G4_ERR_INPUT also for an id outside [0, n_vocab). */
G4_API g4_result g4_detokenize(const g4_tokenizer *t, const int32_t *ids, size_t n, int flags, char *out,
                               size_t cap, size_t *len);

/* Streaming decode: the text of ids as they arrive. The pieces concatenate to
   exactly g4_detokenize's text of all the ids, and each piece is valid UTF-8
   (every token string is: g4_tokenizer_parse refuses a tokenizer.json that is
   not valid UTF-8 or holds a lone surrogate escape, as tokenizers does).
   Since one bad byte late in a run turns the whole run into U+FFFD, a run is
   held back while it can still be valid UTF-8 (all its bytes, whole characters
   included) and comes out when it ends: at the next id that is not a byte token
   (and not dropped: see g4_detokenize) or at g4_decode_flush. As soon as the
   open run cannot be valid any more (its bytes so far are no prefix of valid
   UTF-8), its bytes come out as U+FFFD, one each, and so does every further
   byte of that run as it arrives. So text is late only while a valid run is
   open; everything g4_tokenize produces is valid. Start from a zeroed state
   (memset or = {0}); it grows its buffers (G4_MALLOC) as runs need, keeps
   them across g4_decode_flush, and frees them in g4_decode_free. */
typedef struct {
    char *run;                   /* the bytes of the open run, held back */
    size_t n_run, run_cap;
    size_t run_whole;            /* run[0..run_whole) is whole characters */
    int run_bad;                 /* the open run cannot be valid: its bytes went out as U+FFFD */
    char *piece;                 /* the last piece, NUL-terminated */
    size_t piece_cap;
} g4_decode_state;
/* One more id: *piece points at its text (NUL-terminated, *len bytes, often
   0), valid until the next call on st. G4_ERR_INPUT for an id outside
   [0, n_vocab) or a state not from these functions, G4_ERR_NOMEM if a buffer
   cannot grow (the state is then unchanged). */
G4_API g4_result g4_decode_next(const g4_tokenizer *t, g4_decode_state *st, int32_t id, int flags,
                                const char **piece, size_t *len);
/* At the end: the open run (its bytes if valid, else U+FFFD per byte). The
   state is then ready for a new stream. */
G4_API g4_result g4_decode_flush(g4_decode_state *st, const char **piece, size_t *len);
/* Frees the state's buffers and zeroes it. */
G4_API void g4_decode_free(g4_decode_state *st);

/* ------------------------------------------------------------------ chat */
/* The built-in Gemma 4 chat layout, for checkpoints without a chat template
   (with one, render it with g4_template_*), as Google's Gemma 4 prompt-formatting
   guide shows it (ai.google.dev/gemma/docs/core/prompt-formatting-gemma4):
     <bos><|turn>system\n[<|think|>]{system}<turn|>\n<|turn>user\n{msg}<turn|>\n<|turn>model\n
   The text is rendered, then tokenized: the control tokens' ids come from the
   tokenizer file. Role "assistant" is written "model". */
typedef struct {
    const char *role;            /* "system", "user", "model" (or "assistant") */
    const char *content;         /* UTF-8, NUL-terminated */
} g4_chat_message;

enum {
    G4_CHAT_BOS = 1,             /* start with <bos> (the start of a conversation) */
    G4_CHAT_THINKING = 2,        /* <|think|> opens the system turn (one is added if none is given) */
    G4_CHAT_OPEN_MODEL = 4,      /* end with "<|turn>model\n": the model answers next */
    G4_CHAT_CONTINUE = 8         /* first close the model's turn: "<turn|>\n" (a generation loop
                                    samples <turn|> as its stop token but does not feed it) */
};
/* Result and sizes as g4_tokenize. G4_ERR_INPUT also when the tokenizer has
   no <|turn>/<turn|> tokens (t->turn_open < 0: not a Gemma 4 tokenizer). */
G4_API g4_result g4_chat_encode(const g4_tokenizer *t, const g4_chat_message *msgs, int n_msgs, int flags,
                                int32_t *ids, size_t cap, size_t *n_ids);
/* 1 if generation stops at this id: <eos> or <turn|>. */
G4_API int g4_chat_is_stop(const g4_tokenizer *t, int32_t id);

/* -------------------------------------------------------------- template */
/* The checkpoint's own chat template, rendered as transformers'
   apply_chat_template renders it: a Jinja subset interpreter with jinja2's
   settings in transformers (trim_blocks, lstrip_blocks, the loopcontrols
   extension, a tojson that keeps non-ASCII, raise_exception, strftime_now,
   namespace) and Python's value semantics (str(), repr(), float formatting,
   ==, sorting). What it supports is listed in docs/templates.md.
   A template that uses anything else, or fails at render time, is an error
   whose message names the construct and the template line; nothing crashes.
   Parsing allocates the syntax tree (freed by g4_template_free); rendering
   allocates from a private arena bounded by the options' limits and frees it
   before returning. No globals: a parsed template may be rendered by several
   threads at once if each passes its own error buffer (err may be NULL: then
   t->error is written, and the template is not shared); strftime_now reads
   the clock with localtime(), which is not thread-safe. */
typedef struct {
    void *impl;                  /* the parsed template (private) */
    char name[256];              /* where it came from, for messages */
    /* special-token strings passed as bos_token, eos_token, pad_token and
       unk_token (transformers passes tokenizer.special_tokens_map); "" = not
       passed (undefined in the template) */
    char bos_token[128], eos_token[128], pad_token[128], unk_token[128];
    char error[G4_ERROR_MAX];
} g4_template;

typedef struct {
    int add_generation_prompt;   /* passed as add_generation_prompt (default 1) */
    int enable_thinking;         /* passed as enable_thinking: 0 false (default), 1 true, -1 not passed */
    size_t max_output;           /* bytes of rendered text, and of any one captured block (16 MiB) */
    size_t max_memory;           /* bytes the renderer may allocate in all (256 MiB) */
    long max_steps;              /* loop iterations plus macro calls (1000000) */
    int max_depth;               /* macro calls in progress at once (64) */
} g4_template_options;

G4_API g4_template_options g4_template_options_init(void);
/* Parses template text (UTF-8; "\r\n" and "\r" read as "\n", one trailing
   newline dropped, as jinja2). `name` labels messages. G4_ERR_INPUT with the
   line and construct in t->error on a syntax error or an unsupported tag, and
   with the byte offset on text that is not valid UTF-8 (transformers refuses a
   chat_template.jinja that is not: UnicodeDecodeError). */
G4_API g4_result g4_template_parse(g4_template *t, const char *src, size_t len, const char *name);
/* DIR/chat_template.jinja, else DIR/tokenizer_config.json's "chat_template"
   (a string, or a list of {"name", "template"}: the one named "default").
   bos/eos/pad/unk token strings are read from tokenizer_config.json when it
   has them. G4_ERR_IO with "no chat template" in t->error when DIR has none. */
G4_API g4_result g4_template_load(g4_template *t, const char *dir);
/* Fills the special-token strings not set yet from a tokenizer: the text of
   its <bos>, <eos>, <pad> and <unk> tokens (those it has). */
G4_API void g4_template_set_tokens(g4_template *t, const g4_tokenizer *tok);
G4_API void g4_template_free(g4_template *t);
/* Renders a conversation. chat_json: {"messages": [...], "tools": [...]}
   ("tools" optional; every other member is passed as a template variable, as
   apply_chat_template's **kwargs), or a bare [...] of messages. As
   transformers does: message members whose value is null are dropped, a
   message's reasoning ("reasoning_content", "thinking" or "reasoning") is
   passed under both "thinking" and "reasoning_content", an empty conversation
   is an error, `documents` is none, `tools` none when absent. *text: the
   rendered text, NUL-terminated, allocated with G4_MALLOC; free it with
   g4_template_free_output. err: G4_ERROR_MAX bytes, or NULL for t->error.
   G4_ERR_JSON for bad chat_json, G4_ERR_INPUT for a render error (including
   raise_exception and the limits), G4_ERR_NOMEM. */
G4_API g4_result g4_template_render(const g4_template *t, const char *chat_json, size_t len,
                                    const g4_template_options *o, char **text, size_t *text_len, char *err);
/* Renders, then tokenizes as apply_chat_template(..., tokenize=True): the
   text is encoded without the post-processor (no second <bos>). *ids:
   allocated with G4_MALLOC, free with g4_template_free_output. */
G4_API g4_result g4_template_encode(const g4_template *t, const g4_tokenizer *tok, const char *chat_json,
                                    size_t len, const g4_template_options *o, int32_t **ids, size_t *n_ids,
                                    char *err);
/* A chat loop that keeps the K/V feeds, for each new user turn, only what the
   template writes after the model's last answer (the answer's tokens are fed
   already): the closure of that turn, the new user turn, the generation
   prompt. In chat_json, an assistant message whose content is
   G4_TEMPLATE_ANSWER stands for such an answer; this renders the conversation
   and encodes the text after the last marker as g4_template_encode does (no
   <bos>). G4_ERR_INPUT, naming the template, when the rendered text holds no
   marker (the template does not write the model's answers, or chat_json has
   none). *ids: allocated with G4_MALLOC, free with g4_template_free_output. */
#define G4_TEMPLATE_ANSWER "\x1bg4-answer\x1b"
G4_API g4_result g4_template_continue(const g4_template *t, const g4_tokenizer *tok, const char *chat_json,
                                      size_t len, const g4_template_options *o, int32_t **ids, size_t *n_ids,
                                      char *err);
G4_API void g4_template_free_output(void *p);

/* ------------------------------------------------------- image processor */
/* Gemma4ImageProcessor (transformers' torchvision backend, its default), bit
   for bit: RGBA composited onto white as PIL's alpha_composite does it, the
   aspect-preserving target size, torch's uint8 antialiased bicubic resize
   (the integer kernel torchvision uses for uint8 images on the CPU), rescale
   (k * float32(rescale_factor)), patchify, positions, padding. The settings
   come from processor_config.json ("image_processor") or
   preprocessor_config.json; absent ones take Gemma4ImageProcessor's defaults.
   The 12B's Gemma4UnifiedImageProcessor is the same resize, rescale and
   patchify with patches of patch_size * pooling_kernel_size pixels and no
   pooling (its patches_merge gathers each k x k group of p x p patches into
   the (k p) x (k p) x 3 block of the image, in (row, column, channel) order,
   row-major over the merged grid), so it is this processor with kind
   G4_IMAGE_UNIFIED, patch_size k p and pooling_kernel_size 1. */
enum {
    G4_IMAGE_ANY = 0,      /* the file names no image processor type (or there is no file) */
    G4_IMAGE_GEMMA4 = 1,   /* image_processor_type Gemma4ImageProcessor (or its Pil twin) */
    G4_IMAGE_UNIFIED = 2   /* Gemma4UnifiedImageProcessor (processor_class Gemma4UnifiedProcessor) */
};
typedef struct {
    int patch_size;              /* 16 (unified: the file's patch_size x pooling_kernel_size, 48) */
    int max_soft_tokens;         /* 280: one of 70, 140, 280, 560, 1120 */
    int pooling_kernel_size;     /* 3 (unified: 1) */
    int do_resize, do_rescale, do_convert_rgb; /* true, true, true */
    float rescale_factor;        /* 1/255 */
    int image_seq_length;        /* the processor's (280); informational */
    int kind;                    /* G4_IMAGE_* */
    char error[G4_ERROR_MAX];
} g4_image_config;

G4_API g4_image_config g4_image_config_init(void);  /* Gemma4ImageProcessor's defaults */
/* processor_config.json or preprocessor_config.json text; `name` labels messages.
   Refused, naming the field: do_normalize true, a resample other than 3
   (bicubic), max_soft_tokens outside the five, sizes out of range, an
   image_processor_type other than Gemma4ImageProcessor(Pil) and
   Gemma4UnifiedImageProcessor. */
G4_API g4_result g4_image_config_parse(g4_image_config *ic, const char *json, size_t len, const char *name);
/* PATH: a file, or a directory holding processor_config.json (else
   preprocessor_config.json; with neither, the defaults). */
G4_API g4_result g4_image_config_load(g4_image_config *ic, const char *path);
/* G4_ERR_CONFIG when the processor contradicts the model's vision_config
   (patch_size, pooling_kernel_size), or is the other model family's (a 12B's
   Gemma4UnifiedImageProcessor for a Gemma 4 tower, or the reverse). For a
   gemma4_unified model, settings of kind G4_IMAGE_ANY (no type named, no file)
   become G4_IMAGE_UNIFIED ones. (An image whose grid is wider than the
   position table is refused by g4_vision_encode / g4_unified_embed_image,
   where transformers fails.) */
G4_API g4_result g4_image_config_check(g4_image_config *ic, const g4_config *c);
/* get_aspect_ratio_preserving_size: the size an image of height x width becomes. */
G4_API g4_result g4_image_target_size(g4_image_config *ic, int height, int width, int *target_height, int *target_width);
/* Scratch bytes g4_image_preprocess needs for such an image (0 on bad sizes). */
G4_API size_t g4_image_scratch_size(const g4_image_config *ic, int height, int width);
/* One image: pixels [height][width][channels] (3: RGB, 4: RGBA; 8 bits) ->
   pixel_values [max_patches][3 p^2] and positions [max_patches][2] (x, y; -1
   padding), max_patches = max_soft_tokens * k^2; *n_soft: its soft tokens
   (the placeholder run's length). Dimensions up to 32768 a side and 2^28
   pixels; scratch at least g4_image_scratch_size bytes, 8-byte aligned. */
G4_API g4_result g4_image_preprocess(g4_image_config *ic, const uint8_t *pixels, int height, int width, int channels,
                                     void *scratch, size_t scratch_bytes, float *pixel_values, int32_t *positions,
                                     int *n_soft);
/* Gemma4Processor's expansion: every image_token_id in ids becomes boi_token_id,
   n_soft[k] x image_token_id, eoi_token_id (k counts the images). *n_out: the
   ids written; G4_ERR_INPUT (message in err) when the count of images differs
   from n_images or cap is too small (*n_out: the length needed). */
G4_API g4_result g4_mm_expand_images(const g4_config *c, const int32_t *ids, int n, const int *n_soft, int n_images,
                                     int32_t *out, size_t cap, size_t *n_out, char *err);
/* The expansion of Gemma4Processor and Gemma4UnifiedProcessor alike
   (ProcessorMixin.get_text_with_replacements with their replace_image_token
   and replace_audio_token), on ids: every image_token_id becomes boi_token_id,
   n_image[i] x image_token_id, eoi_token_id, every audio_token_id becomes
   boa_token_id, n_audio[a] x audio_token_id, eoa_token_id, images and clips
   each taken in order as the ids hold them (interleaved as the text has
   them). Equal to expanding the text and then tokenizing it, because the
   placeholders are special tokens matched before any text. video_token_id is
   copied as it is (its expansion needs the frames' timestamps). The ids of a
   run come from the config (image_token_id, ..., eoa_token_id: the model's
   rows). *n_out: the ids written, or with out NULL or cap too small the
   length needed (then G4_ERR_INPUT). G4_ERR_INPUT, message in err (NULL: none),
   when the placeholders of a kind differ in number from its counts, a count
   is negative, or the config lacks a needed id. */
G4_API g4_result g4_mm_expand(const g4_config *c, const int32_t *ids, int n, const int *n_image, int n_images,
                              const int *n_audio, int n_audios, int32_t *out, size_t cap, size_t *n_out, char *err);

/* ------------------------------------------------------- video processor */
/* Gemma4VideoProcessor (transformers' torchvision backend) bit for bit, and
   Gemma4Processor's video expansion. The processor keeps some frames of a
   video (sample_frames), then treats each kept frame as Gemma4ImageProcessor
   treats an image (target size, uint8 bicubic resize, patchify, positions,
   padding) except for the rescale: with do_normalize (Gemma 4's setting, mean
   0 and std 1) transformers fuses it into the normalisation, (float32(v) -
   mean/rescale_factor) / (std/rescale_factor), so a pixel is float32(v) / 255
   where an image's is v * float32(1/255) (the last bit differs for 126 of
   the 256 values). Frames are RGB8, all of one size (transformers cannot tell
   the channel axis of an RGBA array; gemma4.h refuses them). The settings come
   from processor_config.json ("video_processor"); absent ones take
   Gemma4VideoProcessor's defaults. The 12B's Gemma4UnifiedVideoProcessor is
   the same with Gemma4UnifiedImageProcessor's merged patches (kind
   G4_IMAGE_UNIFIED: patch_size k p, pooling_kernel_size 1), as for images. */
#define G4_VIDEO_MAX_FRAMES 4096  /* most frames a video may keep */
typedef struct {
    int patch_size;              /* 16 */
    int max_soft_tokens;         /* 70 (per frame): one of 70, 140, 280, 560, 1120 */
    int pooling_kernel_size;     /* 3 */
    int do_resize, do_rescale, do_normalize, do_convert_rgb; /* all true */
    double rescale_factor;       /* 1/255 (a double, as Python's 1.0 / rescale_factor needs it) */
    float image_mean[3], image_std[3]; /* 0, 1 */
    int do_sample_frames;        /* true: keep the frames g4_video_sample_frames picks */
    int num_frames;              /* 32: frames to keep; 0 (None): by fps instead */
    double fps;                  /* 0 (None): frames per second to keep when num_frames is 0 */
    int kind;                    /* G4_IMAGE_*: video_processor_type Gemma4VideoProcessor or Gemma4UnifiedVideoProcessor */
    char error[G4_ERROR_MAX];
} g4_video_config;

G4_API g4_video_config g4_video_config_init(void);  /* Gemma4VideoProcessor's defaults */
/* processor_config.json's "video_processor" object (or a video processor's own
   file); `name` labels messages. Refused, naming the field: a resample other
   than 3, max_soft_tokens outside the five, a zero std, sizes out of range. */
G4_API g4_result g4_video_config_parse(g4_video_config *vc, const char *json, size_t len, const char *name);
/* PATH: a file, or a directory holding processor_config.json (else
   video_preprocessor_config.json; with neither, the defaults). */
G4_API g4_result g4_video_config_load(g4_video_config *vc, const char *path);
/* G4_ERR_CONFIG when the processor contradicts the model's vision_config, or
   is the other family's (as g4_image_config_check; for a gemma4_unified model
   settings of kind G4_IMAGE_ANY become the 12B's merged patches). */
G4_API g4_result g4_video_config_check(g4_video_config *vc, const g4_config *c);
/* sample_frames (default_sample_indices_fn): which of total_frames frames (a
   video of video_fps frames per second, 0 when unknown) the processor keeps:
   num_frames evenly spaced, else fps per second, else all; every frame when
   do_sample_frames is false. indices: room for cap; *n: the count. Errors as
   transformers': num_frames and fps both set, more frames asked than the video
   has, fps without video_fps; and more than G4_VIDEO_MAX_FRAMES or cap. */
G4_API g4_result g4_video_sample_frames(g4_video_config *vc, int total_frames, double video_fps, int *indices, int cap,
                                        int *n);
/* Scratch bytes g4_video_preprocess needs for frames of height x width (0 on bad sizes). */
G4_API size_t g4_video_scratch_size(const g4_video_config *vc, int height, int width);
/* The kept frames: frames [n_frames][height][width][channels] (channels 3) ->
   pixel_values [n_frames][max_patches][3 p^2], positions [n_frames][max_patches][2]
   (pixel_values_videos and video_position_ids), max_patches = max_soft_tokens * k^2;
   *n_soft: each frame's soft tokens (a frame's placeholder run). Sizes as
   g4_image_preprocess; n_frames 1 .. G4_VIDEO_MAX_FRAMES. */
G4_API g4_result g4_video_preprocess(g4_video_config *vc, const uint8_t *frames, int n_frames, int height, int width,
                                     int channels, void *scratch, size_t scratch_bytes, float *pixel_values,
                                     int32_t *positions, int *n_soft);
/* One video for the expansion: n_frames frames of n_soft soft tokens each,
   taken at frame_indices (NULL: 0, 1, ...) of a video of fps frames per second
   (0: unknown, and transformers then assumes 24). */
typedef struct { int n_frames, n_soft; const int *frame_indices; double fps; } g4_video_item;
/* Gemma4Processor's text expansion (replace_video_token): every occurrence of
   the video token's text (video_token_id's, "<|video|>") in text becomes, for
   the next video, each frame's "mm:ss <|image>" + n_soft x "<|video|>" +
   "<image|>" joined by spaces (mm:ss = the frame's time, frame_index / fps;
   the boi and eoi texts are boi_token_id's and eoi_token_id's), before
   tokenizing, as transformers does (a stamp's text merges with the text before
   it, so ids cannot be expanded afterwards). out: NUL-terminated, room for cap
   bytes; *n_out: its length (the length needed when cap is too small).
   G4_ERR_INPUT (message in err) when the count of videos differs. */
G4_API g4_result g4_mm_expand_videos(const g4_tokenizer *tok, const g4_config *c, const char *text, size_t len,
                                     const g4_video_item *videos, int n_videos, char *out, size_t cap, size_t *n_out,
                                     char *err);

/* ---------------------------------------------------- audio features */
/* Gemma4AudioFeatureExtractor (the E2B/E4B processor's): mono float PCM at
   sampling_rate -> log-mel features and the valid-frame mask. With the
   defaults: the clip is padded with zeros to a multiple of 128 samples, 160
   zeros are put before it (semicausal), and 320-sample frames every 160
   samples get a periodic Hann window, a 512-point FFT, the magnitude, 128 HTK
   mel filters (0-8000 Hz, built in float64) and log(mel + 1e-3); a frame
   whose window reaches past the clip's real samples is invalid and set to 0.
   Refused (G4_ERR_INPUT, message in err): a rate other than sampling_rate (as
   transformers refuses it), more than 480000 samples (30 s; transformers
   truncates silently: pass the first 480000 to get its result), fewer than
   one frame's worth (129 samples), non-finite samples.
   g4_audio_fe_init (the defaults) and g4_audio_fe_load / _parse (the
   checkpoint's settings) allocate the window and the filters
   (g4_audio_fe_free); g4_audio_features allocates nothing. */
typedef struct {
    int sampling_rate, feature_size;   /* 16000, 128 */
    int frame_length, hop_length, fft_length; /* 320, 160, 512: from frame_length_ms, hop_length_ms, fft_overdrive */
    int max_length, pad_to_multiple_of;  /* 480000 samples, 128 (__call__'s defaults, not settings) */
    double min_frequency, max_frequency, mel_floor; /* 0, 8000, 1e-3 */
    double input_scale_factor;         /* 1: the waveform times it, in float32 */
    int audio_seq_length;              /* 750: Gemma4Processor's cap on a clip's placeholders */
    float *window;                     /* [frame_length] periodic Hann, float32 as numpy casts it */
    double *mel_filters;               /* [fft_length/2 + 1][feature_size] */
    double *twiddle;                   /* [fft_length] cos, sin of 2 pi k / fft_length */
    char error[G4_ERROR_MAX];
} g4_audio_fe;

G4_API g4_result g4_audio_fe_init(g4_audio_fe *fe);
/* The settings of processor_config.json's "feature_extractor" (or a flat
   preprocessor_config.json) and its audio_seq_length, as
   Gemma4AudioFeatureExtractor.from_dict reads them: sampling_rate,
   feature_size, frame_length_ms, hop_length_ms (frame_length = round(sr * ms /
   1000), half to even), fft_overdrive (the FFT twice the next power of two),
   min_frequency, max_frequency, mel_floor, input_scale_factor; absent or
   null: the class's defaults. Refused, naming the field: a wrong type or a
   value out of range; a stored frame_length, hop_length or fft_length unlike
   the one transformers computes from the ms settings (it ignores the stored
   one); a feature_extractor_type other than Gemma4AudioFeatureExtractor;
   what gemma4.h does not implement: dither > 0 (numpy's random noise),
   preemphasis > 0, per_bin_mean / per_bin_stddev not null, padding_side
   "left", return_attention_mask false. padding_value only pads samples in
   frames the mask drops, so it changes nothing. fe must hold no tables (a
   fresh struct, or after g4_audio_fe_free); on an error it holds none. */
G4_API g4_result g4_audio_fe_parse(g4_audio_fe *fe, const char *json, size_t len, const char *name);
/* PATH: a .json file, or a directory holding processor_config.json (else
   preprocessor_config.json; with neither, the defaults). */
G4_API g4_result g4_audio_fe_load(g4_audio_fe *fe, const char *path);
/* G4_ERR_CONFIG (message in fe->error) when the model has no audio tower, is
   a gemma4_unified one (its extractor is g4_unified_fe), or its tower takes
   other than feature_size mel bins (audio_config.subsampling_conv_channels[0]). */
G4_API g4_result g4_audio_fe_check(g4_audio_fe *fe, const g4_config *c);
G4_API void g4_audio_fe_free(g4_audio_fe *fe);
/* The feature frames n_samples give (0 if none), and the scratch floats g4_audio_features needs. */
G4_API int g4_audio_fe_frames(const g4_audio_fe *fe, int n_samples);
G4_API size_t g4_audio_fe_scratch(const g4_audio_fe *fe);
/* pcm[n_samples] at sample_rate -> features [n_frames][feature_size], mask [n_frames];
   scratch: g4_audio_fe_scratch floats. */
G4_API g4_result g4_audio_features(g4_audio_fe *fe, const float *pcm, int n_samples, int sample_rate,
                                   float *features, unsigned char *mask, int *n_frames, float *scratch);

/* A WAV file's bytes -> float PCM: RIFF/WAVE, format 1 (PCM, 16-bit) or 3
   (IEEE float, 32-bit), or WAVE_FORMAT_EXTENSIBLE of those; one channel.
   PCM16 sample k becomes k / 32768 (as soundfile reads it). *pcm points into
   out (n floats, allocated by the caller: g4_wav_parse with out NULL reports
   *n and *rate first). Anything else is G4_ERR_INPUT with a message naming
   the field. The rate is returned, not checked: g4_audio_features checks it. */
G4_API g4_result g4_wav_parse(const unsigned char *data, size_t len, float *out, size_t cap, size_t *n, int *rate,
                              char *err);

/* ------------------------------------------------- the 12B's processor */
/* Gemma4UnifiedProcessor (processing_gemma4_unified.py), the pieces that are
   not Gemma 4's: images are g4_image_preprocess with a G4_IMAGE_UNIFIED
   g4_image_config (above; its soft tokens are the merged patches, n_soft),
   the placeholders g4_mm_expand; audio is Gemma4UnifiedAudioFeatureExtractor:
   raw 16 kHz samples cut into frames of audio_samples_per_token, the last
   zero-padded, every frame one soft token (no mel features, no encoder; the
   frames themselves: g4_unified_audio_frames in gemma4.h). Its settings come
   from processor_config.json's "feature_extractor" (or a flat
   preprocessor_config.json); absent ones take the class's defaults. */
typedef struct {
    int audio_samples_per_token; /* 640: samples per frame, per soft token */
    int sampling_rate;           /* 16000 */
    char error[G4_ERROR_MAX];
} g4_unified_fe;

G4_API g4_unified_fe g4_unified_fe_init(void);    /* the class's defaults */
/* Refused, naming the field: a feature_extractor_type other than
   Gemma4UnifiedAudioFeatureExtractor (a Gemma 4 log-mel extractor is not the
   12B's), sizes out of range, feature_size differing from
   audio_samples_per_token (the frames are feature_size wide). */
G4_API g4_result g4_unified_fe_parse(g4_unified_fe *fe, const char *json, size_t len, const char *name);
/* PATH: a file, or a directory holding processor_config.json (else
   preprocessor_config.json; with neither, the defaults). */
G4_API g4_result g4_unified_fe_load(g4_unified_fe *fe, const char *path);
/* G4_ERR_CONFIG when audio_samples_per_token differs from the model's
   audio_config.audio_embed_dim (the embedder's input width), or the model is
   not a gemma4_unified one with an audio_config. */
G4_API g4_result g4_unified_fe_check(g4_unified_fe *fe, const g4_config *c);
/* A clip's soft tokens: ceil(n_samples / audio_samples_per_token)
   (_compute_audio_num_tokens; the run's length). -1 on a bad fe. */
G4_API long long g4_unified_audio_tokens(const g4_unified_fe *fe, size_t n_samples);
/* _extract_waveform_features for one clip: pcm [n] (samples at
   sampling_rate) cut into frames [*n_frames][audio_samples_per_token], the
   last zero-padded, every one valid (input_features_mask all true). G4_ERR_INPUT
   (message in fe->error) when they would not fit max_frames. (gemma4.h's
   g4_unified_audio_frames does the same with a model's audio_embed_dim.) */
G4_API g4_result g4_unified_fe_frames(g4_unified_fe *fe, const float *pcm, size_t n, float *frames, int max_frames,
                                      int *n_frames);

#ifdef __cplusplus
}
#endif
#endif /* GEMMA4_PROCESSING_H */

/* ======================================================================== */
/*                   IMPLEMENTATION >>implementation                        */
/* ======================================================================== */
#ifdef GEMMA4_IMPLEMENTATION
#ifndef GEMMA4_IMPLEMENTATION_DONE
#error "gemma4_processing.h: GEMMA4_IMPLEMENTATION needs gemma4.h's implementation first: include gemma4.h before this header"
#endif
#ifndef GEMMA4_PROCESSING_IMPLEMENTATION_DONE
#define GEMMA4_PROCESSING_IMPLEMENTATION_DONE

#include <time.h>

/* ------------------------------------------------- tokenizer >>tokenizer */
/* tokenizer.json -> g4_tokenizer. Every array index read from the file is
   range-checked; unknown component types are errors naming the field. */

#define G4__TOK_NONE 0xFFFFFFFFu
#define G4__TOK_MAX_IDS (1 << 24)     /* ids a file may use: 16M (Gemma: 262,145) */
#define G4__TOK_MAX_FILE ((size_t)1 << 30)

static uint32_t g4__hash_bytes(const char *s, size_t n) { /* FNV-1a */
    uint32_t h = 2166136261u;
    size_t i;
    for (i = 0; i < n; i++) { h ^= (unsigned char)s[i]; h *= 16777619u; }
    return h;
}

static uint32_t g4__hash_u64(uint64_t x) { /* murmur3 finalizer */
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

static uint32_t g4__pow2_at_least(size_t n) {
    uint32_t s = 16;
    while (s < n && s < 0x80000000u) s <<= 1;
    return s;
}

/* Bytes a Replace sequence can turn n bytes into, at most. */
static size_t g4__replace_bound(const g4_replace *steps, int n_steps, size_t n) {
    int k;
    for (k = 0; k < n_steps; k++) {
        size_t fl = strlen(steps[k].from), tl = strlen(steps[k].to);
        if (tl > fl) n += (n / fl) * (tl - fl);
    }
    return n;
}

/* Applies the steps in order (non-overlapping, left to right, as str.replace).
   a and b: scratch of g4__replace_bound bytes each; returns the result (a or b, or in). */
static const char *g4__replace_all(const g4_replace *steps, int n_steps, const char *in, size_t n, char *a, char *b,
                                   size_t *out_len) {
    const char *src = in;
    int k;
    for (k = 0; k < n_steps; k++) {
        const char *from = steps[k].from, *to = steps[k].to;
        size_t fl = strlen(from), tl = strlen(to), i = 0, o = 0;
        char *dst = (k & 1) ? b : a;
        while (i < n) {
            if (i + fl <= n && src[i] == from[0] && memcmp(src + i, from, fl) == 0) {
                memcpy(dst + o, to, tl);
                o += tl;
                i += fl;
            } else {
                dst[o++] = src[i++];
            }
        }
        src = dst;
        n = o;
    }
    *out_len = n;
    return src;
}

static int32_t g4__vocab_find(const g4_tokenizer *t, const char *s, size_t n) {
    uint32_t hash = g4__hash_bytes(s, n), h = hash & t->vocab_mask;
    for (;;) { /* the slot holds all a probe needs: one cache line, then the string */
        const uint32_t *slot = t->vocab_hash + 4 * (size_t)h;
        if (slot[1] == G4__TOK_NONE) return -1;
        if (slot[0] == hash && slot[3] == n && memcmp(t->vocab_str + slot[2], s, n) == 0) return (int32_t)slot[1];
        h = (h + 1) & t->vocab_mask;
    }
}

/* The merge of (a, b): its rank, and the merged id in *id; -1 if none. */
static int32_t g4__merge_find(const g4_tokenizer *t, int32_t a, int32_t b, int32_t *id) {
    uint32_t h = g4__hash_u64((uint64_t)(uint32_t)a << 32 | (uint32_t)b) & t->merge_mask;
    for (;;) {
        const uint32_t *slot = t->merge_slots + 4 * (size_t)h;
        if (slot[0] == (uint32_t)a && slot[1] == (uint32_t)b) { *id = (int32_t)slot[3]; return (int32_t)slot[2]; }
        if (slot[1] == G4__TOK_NONE) return -1;
        h = (h + 1) & t->merge_mask;
    }
}

static int32_t g4__trie_step(const g4_tokenizer *t, int32_t node, unsigned char byte) {
    int32_t c;
    for (c = t->trie_child[node]; c >= 0; c = t->trie_next[c])
        if (t->trie_byte[c] == byte) return c;
    return -1;
}

/* The longest added token of trie `root` that starts at s[0..n): its id and
   *len, or -1. */
static int32_t g4__trie_match(const g4_tokenizer *t, int32_t root, const char *s, size_t n, size_t *len) {
    int32_t node = root, best = -1;
    size_t i;
    for (i = 0; i < n; i++) {
        if ((node = g4__trie_step(t, node, (unsigned char)s[i])) < 0) break;
        if (t->trie_id[node] >= 0) { best = t->trie_id[node]; *len = i + 1; }
    }
    return best;
}

static void g4__trie_insert(g4_tokenizer *t, int32_t root, const char *s, size_t n, int32_t id) {
    int32_t node = root;
    size_t i;
    for (i = 0; i < n; i++) {
        int32_t next = g4__trie_step(t, node, (unsigned char)s[i]);
        if (next < 0) { /* capacity was sized to the total content length */
            next = t->n_trie++;
            t->trie_byte[next] = (unsigned char)s[i];
            t->trie_id[next] = -1;
            t->trie_child[next] = -1;
            t->trie_next[next] = t->trie_child[node];
            t->trie_child[node] = next;
        }
        node = next;
    }
    t->trie_id[node] = id; /* a repeated content: the later entry wins */
}

G4__DEF void g4_tokenizer_free(g4_tokenizer *t) {
    if (!t) return;
    G4_FREE(t->flags); G4_FREE(t->byte_value); G4_FREE(t->text_off); G4_FREE(t->text_len); G4_FREE(t->text);
    G4_FREE(t->vocab_off); G4_FREE(t->vocab_len); G4_FREE(t->vocab_str); G4_FREE(t->vocab_hash);
    G4_FREE(t->merge_slots);
    G4_FREE(t->trie_child); G4_FREE(t->trie_next); G4_FREE(t->trie_id); G4_FREE(t->trie_byte);
    t->flags = NULL; t->byte_value = NULL; t->text_off = t->text_len = NULL; t->text = NULL;
    t->vocab_off = t->vocab_len = NULL; t->vocab_str = NULL; t->vocab_hash = NULL;
    t->merge_slots = NULL;
    t->trie_child = t->trie_next = t->trie_id = NULL; t->trie_byte = NULL;
    t->n_vocab = t->n_merges = t->n_added = t->n_trie = 0;
}

/* Parsing context: the DOM, the file name for messages, the tokenizer, and
   what g4__tokp_added works out for g4__tokp_decoded (freed by the parser). */
typedef struct {
    const g4__json *j;
    const char *name;
    g4_tokenizer *t;
    int32_t vocab_ids;       /* model.vocab's largest id + 1 */
    int32_t vocab_count;     /* model.vocab's entries (tokenizers' get_vocab_size) */
    const char **dstr;       /* [n_vocab] an added token's string for decoding, NULL for the rest */
    size_t *dlen;
    char *nbuf;              /* the normalized contents dstr points into */
    int32_t *set_node;       /* content set: open addressing, the node of a content (-1: empty), */
    int32_t *set_id;         /* the id tokenizers gives that content, */
    unsigned char *set_special; /* and whether a token with that content was marked special */
    uint32_t set_mask;
} g4__tokp;

static g4_result g4__tokp_fail(g4__tokp *p, const char *fmt, ...) G4__PRINTF(2, 3);
static g4_result g4__tokp_fail(g4__tokp *p, const char *fmt, ...) {
    char msg[G4_ERROR_MAX - 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g4__seterr(p->t->error, "%s: %s", p->name, msg);
    return G4_ERR_JSON;
}

/* Node `n` as a string (NULL and an error if it is not one). */
static const char *g4__tokp_str(g4__tokp *p, int n, const char *what, g4_result *r) {
    if (n < 0 || p->j->nodes[n].type != G4__JSTR) {
        *r = g4__tokp_fail(p, "%s must be a string, not %s", what, n < 0 ? "missing" : g4__jtype_name(p->j->nodes[n].type));
        return NULL;
    }
    return p->j->nodes[n].str;
}

/* An optional boolean member; absent or null gives def. */
static g4_result g4__tokp_bool(g4__tokp *p, int obj, const char *key, const char *scope, int def, int *out) {
    int n = g4__jget(p->j, obj, key);
    *out = def;
    if (n < 0 || p->j->nodes[n].type == G4__JNULL) return G4_OK;
    if (p->j->nodes[n].type != G4__JTRUE && p->j->nodes[n].type != G4__JFALSE)
        return g4__tokp_fail(p, "%s.%s must be true or false", scope, key);
    *out = p->j->nodes[n].type == G4__JTRUE;
    return G4_OK;
}

/* An id: a JSON integer in [0, G4__TOK_MAX_IDS). */
static g4_result g4__tokp_id(g4__tokp *p, int n, const char *what, int32_t *out) {
    const g4__jnode *nd = n >= 0 ? &p->j->nodes[n] : NULL;
    if (!nd || nd->type != G4__JNUM || !nd->is_int || nd->ival < 0 || nd->ival >= G4__TOK_MAX_IDS)
        return g4__tokp_fail(p, "%s must be an integer id in [0, %d)", what, G4__TOK_MAX_IDS);
    *out = (int32_t)nd->ival;
    return G4_OK;
}

/* A Replace step {"type": "Replace", "pattern": {"String": s}, "content": c}. */
static g4_result g4__tokp_replace(g4__tokp *p, int n, const char *where, g4_replace *out) {
    int pat = g4__jget(p->j, n, "pattern"), str = g4__jget(p->j, pat, "String");
    int content = g4__jget(p->j, n, "content");
    g4_result r = G4_OK;
    const char *from, *to;
    if (str < 0) return g4__tokp_fail(p, "%s: only a Replace with a \"String\" pattern is supported", where);
    if (!(from = g4__tokp_str(p, str, "Replace pattern", &r)) || !(to = g4__tokp_str(p, content, "Replace content", &r)))
        return r;
    if (!from[0] || p->j->nodes[str].len >= sizeof out->from || p->j->nodes[content].len >= sizeof out->to ||
        strlen(from) != p->j->nodes[str].len || strlen(to) != p->j->nodes[content].len)
        return g4__tokp_fail(p, "%s: Replace pattern and content must be 1 to 31 bytes without NUL", where);
    memcpy(out->from, from, strlen(from) + 1);
    memcpy(out->to, to, strlen(to) + 1);
    return G4_OK;
}

static const char *g4__tokp_type(g4__tokp *p, int n) {
    int ty = g4__jget(p->j, n, "type");
    /* a type name holding a NUL is no known type (not its prefix) */
    return ty >= 0 && p->j->nodes[ty].type == G4__JSTR && strlen(p->j->nodes[ty].str) == p->j->nodes[ty].len
               ? p->j->nodes[ty].str : "";
}

/* A normalizer's or decoder's steps (`what`): a Sequence's list `what`s, else n
   itself, into items[max]; a message past max says "too_many". */
static g4_result g4__tokp_steps(g4__tokp *p, int n, const char *what, const char *too_many, int *items, int max,
                                int *n_items) {
    *n_items = 0;
    if (strcmp(g4__tokp_type(p, n), "Sequence") == 0) {
        int list = g4__jget(p->j, n, what[0] == 'n' ? "normalizers" : "decoders"), c;
        if (list < 0 || p->j->nodes[list].type != G4__JARR) return g4__tokp_fail(p, "%s.%ss must be an array", what, what);
        for (c = p->j->nodes[list].child; c >= 0; c = p->j->nodes[c].next) {
            if (*n_items == max) return g4__tokp_fail(p, too_many, G4_TOKENIZER_MAX_STEPS);
            items[(*n_items)++] = c;
        }
    } else {
        items[(*n_items)++] = n;
    }
    return G4_OK;
}

static g4_result g4__tokp_normalizer(g4__tokp *p, int n) {
    int items[G4_TOKENIZER_MAX_STEPS], n_items, c;
    const char *ty;
    g4_result r;
    if (n < 0 || p->j->nodes[n].type == G4__JNULL) return G4_OK;
    if ((r = g4__tokp_steps(p, n, "normalizer", "normalizer: more than %d steps", items, G4_TOKENIZER_MAX_STEPS,
                            &n_items)) != G4_OK)
        return r;
    for (c = 0; c < n_items; c++) {
        ty = g4__tokp_type(p, items[c]);
        if (strcmp(ty, "Replace") != 0)
            return g4__tokp_fail(p, "normalizer type \"%s\" is not supported (Replace or a Sequence of Replace)", ty);
        if ((r = g4__tokp_replace(p, items[c], "normalizer", &p->t->norm[p->t->n_norm])) != G4_OK) return r;
        p->t->n_norm++;
    }
    return G4_OK;
}

static g4_result g4__tokp_pretok(g4__tokp *p, int n) {
    int pat, str, beh, inv;
    const char *ty;
    g4_result r = G4_OK;
    if (n < 0 || p->j->nodes[n].type == G4__JNULL) return G4_OK;
    ty = g4__tokp_type(p, n);
    if (strcmp(ty, "Split") != 0)
        return g4__tokp_fail(p, "pre_tokenizer type \"%s\" is not supported (Split)", ty);
    pat = g4__jget(p->j, n, "pattern");
    str = g4__jget(p->j, pat, "String");
    beh = g4__jget(p->j, n, "behavior");
    if (str < 0) return g4__tokp_fail(p, "pre_tokenizer: only a Split with a \"String\" pattern is supported");
    if (!g4__tokp_str(p, str, "pre_tokenizer.pattern.String", &r) || !g4__tokp_str(p, beh, "pre_tokenizer.behavior", &r)) return r;
    if (strcmp(p->j->nodes[beh].str, "MergedWithPrevious") != 0)
        return g4__tokp_fail(p, "pre_tokenizer.behavior \"%s\" is not supported (MergedWithPrevious)", p->j->nodes[beh].str);
    if ((r = g4__tokp_bool(p, n, "invert", "pre_tokenizer", 0, &inv)) != G4_OK) return r;
    if (inv) return g4__tokp_fail(p, "pre_tokenizer.invert true is not supported");
    if (!p->j->nodes[str].len || p->j->nodes[str].len >= sizeof p->t->split || strlen(p->j->nodes[str].str) != p->j->nodes[str].len)
        return g4__tokp_fail(p, "pre_tokenizer.pattern.String must be 1 to 31 bytes without NUL");
    memcpy(p->t->split, p->j->nodes[str].str, p->j->nodes[str].len + 1);
    return G4_OK;
}

static g4_result g4__tokp_decoder(g4__tokp *p, int n, int *byte_fallback) {
    int items[G4_TOKENIZER_MAX_STEPS + 4], n_items, c;
    const char *ty;
    g4_result r;
    *byte_fallback = 0;
    if (n < 0 || p->j->nodes[n].type == G4__JNULL) return G4_OK;
    if ((r = g4__tokp_steps(p, n, "decoder", "decoder: too many steps", items, G4_TOKENIZER_MAX_STEPS + 4, &n_items)) !=
        G4_OK)
        return r;
    for (c = 0; c < n_items; c++) {
        ty = g4__tokp_type(p, items[c]);
        /* Fuse joins the pieces into one: a later step would see that one piece */
        if (c > 0 && strcmp(g4__tokp_type(p, items[c - 1]), "Fuse") == 0 && strcmp(ty, "Fuse") != 0)
            return g4__tokp_fail(p, "decoder: a %s after Fuse is not supported", ty);
        if (strcmp(ty, "Replace") == 0) {
            if (*byte_fallback) return g4__tokp_fail(p, "decoder: a Replace after ByteFallback is not supported");
            if (p->t->n_dec == G4_TOKENIZER_MAX_STEPS) return g4__tokp_fail(p, "decoder: more than %d Replace steps", G4_TOKENIZER_MAX_STEPS);
            if ((r = g4__tokp_replace(p, items[c], "decoder", &p->t->dec[p->t->n_dec])) != G4_OK) return r;
            p->t->n_dec++;
        } else if (strcmp(ty, "ByteFallback") == 0) {
            if (*byte_fallback) return g4__tokp_fail(p, "decoder: a second ByteFallback is not supported");
            *byte_fallback = 1;
        } else if (strcmp(ty, "Fuse") != 0) { /* Fuse: the pieces are concatenated anyway */
            return g4__tokp_fail(p, "decoder type \"%s\" is not supported (Replace, ByteFallback, Fuse)", ty);
        }
    }
    return G4_OK;
}

/* TemplateProcessing: the ids of "single" before and after the sequence. */
static g4_result g4__tokp_post(g4__tokp *p, int n) {
    int single, specials, c, seen_seq = 0;
    g4_tokenizer *t = p->t;
    if (n < 0 || p->j->nodes[n].type == G4__JNULL) return G4_OK;
    if (strcmp(g4__tokp_type(p, n), "TemplateProcessing") != 0)
        return g4__tokp_fail(p, "post_processor type \"%s\" is not supported (TemplateProcessing)", g4__tokp_type(p, n));
    single = g4__jget(p->j, n, "single");
    specials = g4__jget(p->j, n, "special_tokens");
    if (single < 0 || p->j->nodes[single].type != G4__JARR) return g4__tokp_fail(p, "post_processor.single must be an array");
    for (c = p->j->nodes[single].child; c >= 0; c = p->j->nodes[c].next) {
        int sp = g4__jget(p->j, c, "SpecialToken"), entry, ids, e;
        const char *name;
        g4_result r = G4_OK;
        if (g4__jget(p->j, c, "Sequence") >= 0) {
            if (seen_seq) return g4__tokp_fail(p, "post_processor.single names the sequence twice");
            seen_seq = 1;
            continue;
        }
        if (!(name = g4__tokp_str(p, g4__jget(p->j, sp, "id"), "post_processor.single[].SpecialToken.id", &r))) return r;
        entry = g4__jget(p->j, specials, name);
        ids = g4__jget(p->j, entry, "ids");
        if (ids < 0 || p->j->nodes[ids].type != G4__JARR)
            return g4__tokp_fail(p, "post_processor.special_tokens has no ids for \"%s\"", name);
        for (e = p->j->nodes[ids].child; e >= 0; e = p->j->nodes[e].next) {
            int32_t id;
            int32_t *dst = seen_seq ? t->suffix : t->prefix;
            int *cnt = seen_seq ? &t->n_suffix : &t->n_prefix;
            if ((r = g4__tokp_id(p, e, "post_processor.special_tokens[].ids[]", &id)) != G4_OK) return r;
            if (*cnt == G4_TOKENIZER_MAX_TEMPLATE) return g4__tokp_fail(p, "post_processor adds more than %d ids", G4_TOKENIZER_MAX_TEMPLATE);
            dst[(*cnt)++] = id;
        }
    }
    if (!seen_seq) return g4__tokp_fail(p, "post_processor.single has no Sequence");
    return G4_OK;
}

static g4_result g4__tok_nomem(g4__tokp *p) {
    g4__seterr(p->t->error, "%s: out of memory loading the tokenizer", p->name);
    return G4_ERR_NOMEM;
}

/* model.vocab -> per-id strings and the string -> id hash. */
static g4_result g4__tokp_vocab(g4__tokp *p, int vocab, int added) {
    const g4__json *j = p->j;
    g4_tokenizer *t = p->t;
    int c, count = j->nodes[vocab].count;
    int32_t max_id = -1;
    size_t bytes = 0, pos = 0, i;
    g4_result r;
    for (c = j->nodes[vocab].child; c >= 0; c = j->nodes[c].next) {
        int32_t id;
        if ((r = g4__tokp_id(p, c, "model.vocab value", &id)) != G4_OK) return r;
        if (id > max_id) max_id = id;
        bytes += j->nodes[c].keylen;
    }
    p->vocab_ids = max_id + 1;
    p->vocab_count = count;
    /* room for every added token past the vocab (g4__tokp_added gives the ids; n_vocab shrinks to fit) */
    t->n_vocab = max_id + 1 > count + j->nodes[added].count ? max_id + 1 : count + j->nodes[added].count;
    if (t->n_vocab == 0) return g4__tokp_fail(p, "model.vocab is empty");
    if (t->n_vocab > G4__TOK_MAX_IDS) return g4__tokp_fail(p, "more than %d ids", G4__TOK_MAX_IDS);
    t->flags = (unsigned char *)G4_MALLOC((size_t)t->n_vocab);
    t->byte_value = (int16_t *)G4_MALLOC(sizeof(int16_t) * (size_t)t->n_vocab);
    t->text_off = (uint32_t *)G4_MALLOC(sizeof(uint32_t) * (size_t)t->n_vocab);
    t->text_len = (uint32_t *)G4_MALLOC(sizeof(uint32_t) * (size_t)t->n_vocab);
    t->vocab_off = (uint32_t *)G4_MALLOC(sizeof(uint32_t) * (size_t)t->n_vocab);
    t->vocab_len = (uint32_t *)G4_MALLOC(sizeof(uint32_t) * (size_t)t->n_vocab);
    t->vocab_str = (char *)G4_MALLOC(bytes + 1);
    t->vocab_mask = g4__pow2_at_least((size_t)count * 2) - 1; /* load <= 1/2 */
    t->vocab_hash = (uint32_t *)G4_MALLOC(4 * sizeof(uint32_t) * ((size_t)t->vocab_mask + 1));
    if (!t->flags || !t->byte_value || !t->text_off || !t->text_len || !t->vocab_off || !t->vocab_len ||
        !t->vocab_str || !t->vocab_hash)
        return g4__tok_nomem(p);
    memset(t->flags, 0, (size_t)t->n_vocab);
    for (i = 0; i < (size_t)t->n_vocab; i++) { t->vocab_len[i] = G4__TOK_NONE; t->vocab_off[i] = 0; }
    memset(t->vocab_hash, 0xff, 4 * sizeof(uint32_t) * ((size_t)t->vocab_mask + 1));
    for (c = j->nodes[vocab].child; c >= 0; c = j->nodes[c].next) {
        const char *key = j->nodes[c].key;
        size_t kl = j->nodes[c].keylen;
        int32_t id = (int32_t)j->nodes[c].ival;
        uint32_t h, hash;
        if (t->vocab_len[id] != G4__TOK_NONE)
            return g4__tokp_fail(p, "model.vocab: id %ld is given to two strings", (long)id);
        if (g4__vocab_find(t, key, kl) >= 0) return g4__tokp_fail(p, "model.vocab: \"%s\" appears twice", key);
        memcpy(t->vocab_str + pos, key, kl);
        t->vocab_off[id] = (uint32_t)pos;
        t->vocab_len[id] = (uint32_t)kl;
        pos += kl;
        hash = g4__hash_bytes(key, kl);
        h = hash & t->vocab_mask;
        while (t->vocab_hash[4 * (size_t)h + 1] != G4__TOK_NONE) h = (h + 1) & t->vocab_mask;
        t->vocab_hash[4 * (size_t)h] = hash;
        t->vocab_hash[4 * (size_t)h + 1] = (uint32_t)id;
        t->vocab_hash[4 * (size_t)h + 2] = (uint32_t)pos - (uint32_t)kl;
        t->vocab_hash[4 * (size_t)h + 3] = (uint32_t)kl;
    }
    return G4_OK;
}

/* model.merges (["a", "b"] pairs, or legacy "a b" strings) -> ranked pair table. */
static g4_result g4__tokp_merges(g4__tokp *p, int merges) {
    const g4__json *j = p->j;
    g4_tokenizer *t = p->t;
    int c, rank = 0;
    size_t cap = 256;
    char *buf;
    if (merges < 0) { t->merge_mask = 15; }
    else if (j->nodes[merges].type != G4__JARR) return g4__tokp_fail(p, "model.merges must be an array");
    else t->merge_mask = g4__pow2_at_least((size_t)j->nodes[merges].count * 2) - 1;
    t->merge_slots = (uint32_t *)G4_MALLOC(4 * sizeof(uint32_t) * ((size_t)t->merge_mask + 1));
    buf = (char *)G4_MALLOC(cap);
    if (!t->merge_slots || !buf) { G4_FREE(buf); return g4__tok_nomem(p); }
    memset(t->merge_slots, 0xff, 4 * sizeof(uint32_t) * ((size_t)t->merge_mask + 1));
    for (c = merges < 0 ? -1 : j->nodes[merges].child; c >= 0; c = j->nodes[c].next, rank++) {
        const g4__jnode *nd = &j->nodes[c];
        const char *a, *b;
        size_t la, lb;
        int32_t ia, ib, im;
        uint64_t key;
        uint32_t h;
        uint32_t *slot;
        if (nd->type == G4__JARR && nd->count == 2 && j->nodes[nd->child].type == G4__JSTR &&
            j->nodes[j->nodes[nd->child].next].type == G4__JSTR) {
            a = j->nodes[nd->child].str; la = j->nodes[nd->child].len;
            b = j->nodes[j->nodes[nd->child].next].str; lb = j->nodes[j->nodes[nd->child].next].len;
        } else if (nd->type == G4__JSTR && (b = strchr(nd->str, ' ')) != NULL && !strchr(b + 1, ' ')) {
            a = nd->str; la = (size_t)(b - nd->str);
            b++; lb = nd->len - la - 1;
        } else {
            G4_FREE(buf);
            return g4__tokp_fail(p, "model.merges[%d] must be a pair of strings", rank);
        }
        if (la + lb > cap) {
            char *nb = (char *)G4_MALLOC(la + lb);
            if (!nb) { G4_FREE(buf); return g4__tok_nomem(p); }
            G4_FREE(buf);
            buf = nb;
            cap = la + lb;
        }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        ia = g4__vocab_find(t, a, la);
        ib = g4__vocab_find(t, b, lb);
        im = g4__vocab_find(t, buf, la + lb);
        if (ia < 0 || ib < 0 || im < 0) {
            G4_FREE(buf);
            return g4__tokp_fail(p, "model.merges[%d]: \"%.*s\" is not in model.vocab", rank,
                                 ia < 0 ? (int)la : ib < 0 ? (int)lb : (int)(la + lb) > 200 ? 200 : (int)(la + lb),
                                 ia < 0 ? a : ib < 0 ? b : "(the merged string)");
        }
        key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        h = g4__hash_u64(key) & t->merge_mask;
        for (;;) {
            slot = t->merge_slots + 4 * (size_t)h;
            if (slot[1] == G4__TOK_NONE || (slot[0] == (uint32_t)ia && slot[1] == (uint32_t)ib)) break;
            h = (h + 1) & t->merge_mask;
        }
        slot[0] = (uint32_t)ia; /* a repeated pair: the later rank wins, as in tokenizers' map */
        slot[1] = (uint32_t)ib;
        slot[2] = (uint32_t)rank;
        slot[3] = (uint32_t)im;
    }
    t->n_merges = rank;
    G4_FREE(buf);
    return G4_OK;
}

/* The content set's slot for s[0..n): where it is, or the empty slot it would take. */
static uint32_t g4__tokp_set_slot(const g4__tokp *p, const char *s, size_t n) {
    uint32_t h = g4__hash_bytes(s, n) & p->set_mask;
    for (;;) {
        int32_t c = p->set_node[h];
        const g4__jnode *cn;
        if (c < 0) return h;
        cn = &p->j->nodes[g4__jget(p->j, c, "content")];
        if (cn->len == n && memcmp(cn->str, s, n) == 0) return h;
        h = (h + 1) & p->set_mask;
    }
}

/* added_tokens -> ids, flags and the two tries, as tokenizers' AddedVocabulary
   (added_vocabulary.rs, add_tokens) builds them when it loads the file. The
   file's "id" is NOT the id: tokenizers only warns when they differ. In file
   order, each token with a non-empty content gets the id its content already
   has (an earlier added token's, else model.vocab's), else the next new id,
   counting from the number of model.vocab entries; an id's token is the last
   one given it. A normalized token is matched (trie 1) and decoded in its
   normalized form. Whether skip_special_tokens drops an id is decided by the
   string it decodes from: dropped when that string is the content of a token
   marked special (is_special_token), which g4__tokp_decoded turns into
   G4_TOKEN_SPECIAL per id. For a file whose ids agree with tokenizers' (every
   Gemma file) this is the file's ids and "special" flags, except that a
   special token that is normalized and changed by the normalizer is not
   dropped: its string for decoding is the normalized one, which is no
   special content. data/tokenizer/added_goldens.jsonl holds such files. */
static g4_result g4__tokp_added(g4__tokp *p, int added) {
    const g4__json *j = p->j;
    g4_tokenizer *t = p->t;
    size_t total = 0, npos = 0, nbytes = 0;
    int c, k = 0;
    int32_t *owner, next_id = p->vocab_count, n_ids = p->vocab_ids, id;
    g4_result r = G4_OK;
    char *a = NULL, *b = NULL;
    for (c = j->nodes[added].child; c >= 0; c = j->nodes[c].next, k++) {
        int cn = g4__jget(j, c, "content"), special, normalized, lstrip, rstrip, single_word;
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%d]", k);
        if (j->nodes[c].type != G4__JOBJ) return g4__tokp_fail(p, "%s must be an object", where);
        if ((r = g4__tokp_id(p, g4__jget(j, c, "id"), "added_tokens[].id", &id)) != G4_OK) return r;
        if (!g4__tokp_str(p, cn, "added_tokens[].content", &r)) return r;
        if ((r = g4__tokp_bool(p, c, "special", where, 0, &special)) != G4_OK ||
            (r = g4__tokp_bool(p, c, "normalized", where, !special, &normalized)) != G4_OK ||
            (r = g4__tokp_bool(p, c, "lstrip", where, 0, &lstrip)) != G4_OK ||
            (r = g4__tokp_bool(p, c, "rstrip", where, 0, &rstrip)) != G4_OK ||
            (r = g4__tokp_bool(p, c, "single_word", where, 0, &single_word)) != G4_OK)
            return r;
        if (lstrip || rstrip || single_word)
            return g4__tokp_fail(p, "%s (\"%s\"): lstrip, rstrip and single_word are not supported", where,
                                 j->nodes[cn].str);
        total += normalized ? g4__replace_bound(t->norm, t->n_norm, j->nodes[cn].len) : j->nodes[cn].len;
        if (normalized && g4__replace_bound(t->norm, t->n_norm, j->nodes[cn].len) > nbytes)
            nbytes = g4__replace_bound(t->norm, t->n_norm, j->nodes[cn].len);
    }
    t->trie_child = (int32_t *)G4_MALLOC(sizeof(int32_t) * (total + 2));
    t->trie_next = (int32_t *)G4_MALLOC(sizeof(int32_t) * (total + 2));
    t->trie_id = (int32_t *)G4_MALLOC(sizeof(int32_t) * (total + 2));
    t->trie_byte = (unsigned char *)G4_MALLOC(total + 2);
    p->set_mask = g4__pow2_at_least((size_t)j->nodes[added].count * 2) - 1;
    p->set_node = (int32_t *)G4_MALLOC(sizeof(int32_t) * ((size_t)p->set_mask + 1));
    p->set_id = (int32_t *)G4_MALLOC(sizeof(int32_t) * ((size_t)p->set_mask + 1));
    p->set_special = (unsigned char *)G4_MALLOC((size_t)p->set_mask + 1);
    p->dstr = (const char **)G4_MALLOC(sizeof(char *) * (size_t)t->n_vocab);
    p->dlen = (size_t *)G4_MALLOC(sizeof(size_t) * (size_t)t->n_vocab);
    p->nbuf = (char *)G4_MALLOC(total + 1);
    owner = (int32_t *)G4_MALLOC(sizeof(int32_t) * (size_t)t->n_vocab);
    a = (char *)G4_MALLOC(nbytes + 1);
    b = (char *)G4_MALLOC(nbytes + 1);
    if (!t->trie_child || !t->trie_next || !t->trie_id || !t->trie_byte || !p->set_node || !p->set_id || !p->set_special || !p->dstr ||
        !p->dlen || !p->nbuf || !owner || !a || !b) {
        G4_FREE(owner); G4_FREE(a); G4_FREE(b);
        return g4__tok_nomem(p);
    }
    memset(p->set_node, 0xff, sizeof(int32_t) * ((size_t)p->set_mask + 1));
    memset(p->set_special, 0, (size_t)p->set_mask + 1);
    for (id = 0; id < t->n_vocab; id++) { owner[id] = -1; p->dstr[id] = NULL; p->dlen[id] = 0; }
    t->n_trie = 2;
    t->trie_child[0] = t->trie_child[1] = t->trie_next[0] = t->trie_next[1] = t->trie_id[0] = t->trie_id[1] = -1;
    t->trie_byte[0] = t->trie_byte[1] = 0;
    for (c = j->nodes[added].child; c >= 0; c = j->nodes[c].next) { /* ids, as add_tokens gives them */
        const g4__jnode *cn = &j->nodes[g4__jget(j, c, "content")];
        uint32_t h;
        int special;
        if (!cn->len) continue; /* tokenizers ignores an empty content */
        h = g4__tokp_set_slot(p, cn->str, cn->len);
        if (p->set_node[h] < 0) {
            id = g4__vocab_find(t, cn->str, cn->len);
            p->set_node[h] = c;
            p->set_id[h] = id >= 0 ? id : next_id++;
        }
        id = p->set_id[h];
        g4__tokp_bool(p, c, "special", "", 0, &special); /* checked above */
        if (special) p->set_special[h] = 1;
        owner[id] = c; /* the last token given an id is its token */
        if (id + 1 > n_ids) n_ids = id + 1;
    }
    t->n_vocab = n_ids;
    for (id = 0; id < t->n_vocab; id++) { /* each id's token: its flag, its trie entry, its string for decoding */
        const g4__jnode *cn;
        const char *str;
        size_t len;
        int normalized, special;
        if ((c = owner[id]) < 0) continue;
        cn = &j->nodes[g4__jget(j, c, "content")];
        g4__tokp_bool(p, c, "special", "", 0, &special);
        g4__tokp_bool(p, c, "normalized", "", !special, &normalized);
        str = cn->str;
        len = cn->len;
        if (normalized) { /* tokenizers' normalized_cache */
            str = g4__replace_all(t->norm, t->n_norm, cn->str, cn->len, a, b, &len);
            memcpy(p->nbuf + npos, str, len);
            str = p->nbuf + npos;
            npos += len;
        }
        t->flags[id] |= G4_TOKEN_ADDED;
        g4__trie_insert(t, normalized ? 1 : 0, str, len, id);
        p->dstr[id] = str;
        p->dlen[id] = len;
        t->n_added++;
    }
    G4_FREE(owner);
    G4_FREE(a);
    G4_FREE(b);
    return G4_OK;
}

static int g4__hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* The byte a token string stands for in the ByteFallback decoder, or -1:
   "<0x" + HH + ">" (6 bytes) where HH is what Rust's u8::from_str_radix(HH, 16)
   accepts, two hex digits of either case or '+' and one ("<0x+F>" is 0x0F). */
static int g4__byte_token(const char *s, size_t len) {
    int hi, lo;
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || (lo = g4__hexval(s[4])) < 0) return -1;
    if (s[3] == '+') return lo;
    return (hi = g4__hexval(s[3])) < 0 ? -1 : hi * 16 + lo;
}

/* Every id's decoded text (Replace steps applied) and byte value. */
static g4_result g4__tokp_decoded(g4__tokp *p, int byte_fallback) {
    g4_tokenizer *t = p->t;
    size_t total = 0, pos = 0, maxlen = 0, len = 0, n;
    int32_t id;
    char *a, *b;
    const char **strs = (const char **)G4_MALLOC(sizeof(char *) * (size_t)t->n_vocab);
    size_t *lens = (size_t *)G4_MALLOC(sizeof(size_t) * (size_t)t->n_vocab);
    if (!strs || !lens) { G4_FREE((void *)strs); G4_FREE(lens); return g4__tok_nomem(p); }
    for (id = 0; id < t->n_vocab; id++) { /* the string each id decodes from: its added token's, else the vocab's */
        uint32_t h;
        strs[id] = p->dstr[id];
        lens[id] = p->dlen[id];
        if (!strs[id] && t->vocab_len[id] != G4__TOK_NONE) {
            strs[id] = t->vocab_str + t->vocab_off[id];
            lens[id] = t->vocab_len[id];
        }
        if (!strs[id]) continue;
        h = g4__tokp_set_slot(p, strs[id], lens[id]); /* skip_special_tokens: by that string */
        if (p->set_node[h] >= 0 && p->set_special[h]) t->flags[id] |= G4_TOKEN_SPECIAL;
    }
    for (id = 0; id < t->n_vocab; id++) {
        if (!strs[id]) continue;
        n = g4__replace_bound(t->dec, t->n_dec, lens[id]);
        total += n;
        if (n > maxlen) maxlen = n;
    }
    t->text = (char *)G4_MALLOC(total + 1);
    a = (char *)G4_MALLOC(maxlen + 1);
    b = (char *)G4_MALLOC(maxlen + 1);
    if (!t->text || !a || !b) { G4_FREE(a); G4_FREE(b); G4_FREE((void *)strs); G4_FREE(lens); return g4__tok_nomem(p); }
    for (id = 0; id < t->n_vocab; id++) {
        const char *s;
        t->byte_value[id] = -1;
        t->text_off[id] = (uint32_t)pos;
        t->text_len[id] = 0;
        if (!strs[id]) { t->text_off[id] = G4__TOK_NONE; continue; } /* no string: decode skips it */
        s = g4__replace_all(t->dec, t->n_dec, strs[id], lens[id], a, b, &len);
        if (byte_fallback) t->byte_value[id] = (int16_t)g4__byte_token(s, len);
        memcpy(t->text + pos, s, len);
        t->text_len[id] = (uint32_t)len;
        pos += len;
    }
    G4_FREE(a); G4_FREE(b); G4_FREE((void *)strs); G4_FREE(lens);
    return G4_OK;
}

static g4_result g4__tokp_model(g4__tokp *p, int model) {
    const g4__json *j = p->j;
    g4_tokenizer *t = p->t;
    int n;
    g4_result r = G4_OK;
    const char *ty = g4__tokp_type(p, model);
    if (ty[0] && strcmp(ty, "BPE") != 0) return g4__tokp_fail(p, "model.type \"%s\" is not supported (BPE)", ty);
    if ((r = g4__tokp_bool(p, model, "byte_fallback", "model", 0, &t->byte_fallback)) != G4_OK ||
        (r = g4__tokp_bool(p, model, "fuse_unk", "model", 0, &t->fuse_unk)) != G4_OK ||
        (r = g4__tokp_bool(p, model, "ignore_merges", "model", 0, &t->ignore_merges)) != G4_OK)
        return r;
    n = g4__jget(j, model, "dropout");
    if (n >= 0 && j->nodes[n].type != G4__JNULL && !(j->nodes[n].type == G4__JNUM && j->nodes[n].num == 0.0))
        return g4__tokp_fail(p, "model.dropout must be null: BPE dropout is not supported");
    if (((n = g4__jget(j, model, "continuing_subword_prefix")) >= 0 && j->nodes[n].type != G4__JNULL &&
         !(j->nodes[n].type == G4__JSTR && j->nodes[n].len == 0)) ||
        ((n = g4__jget(j, model, "end_of_word_suffix")) >= 0 && j->nodes[n].type != G4__JNULL &&
         !(j->nodes[n].type == G4__JSTR && j->nodes[n].len == 0)))
        return g4__tokp_fail(p, "model.continuing_subword_prefix and end_of_word_suffix are not supported");
    t->unk_id = -1;
    n = g4__jget(j, model, "unk_token");
    if (n >= 0 && j->nodes[n].type != G4__JNULL) {
        const char *unk = g4__tokp_str(p, n, "model.unk_token", &r);
        if (!unk) return r;
        if ((t->unk_id = g4__vocab_find(t, unk, j->nodes[n].len)) < 0)
            return g4__tokp_fail(p, "model.unk_token \"%s\" is not in model.vocab", unk);
    }
    for (n = 0; n < 256; n++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", n);
        t->byte_id[n] = g4__vocab_find(t, name, 6);
    }
    return G4_OK;
}

G4__DEF int32_t g4_token_id(const g4_tokenizer *t, const char *s) {
    size_t n, len = 0;
    int32_t id;
    if (!t || !s || !t->vocab_hash) return -1;
    n = strlen(s);
    if (n && (id = g4__trie_match(t, 0, s, n, &len)) >= 0 && len == n) return id;
    if (n && (id = g4__trie_match(t, 1, s, n, &len)) >= 0 && len == n) return id;
    return g4__vocab_find(t, s, n);
}

G4__DEF g4_result g4_tokenizer_parse(g4_tokenizer *t, const char *json, size_t len, const char *name) {
    g4__json j;
    g4__tokp p;
    g4_result r;
    int root, model, vocab, added, byte_fallback_dec = 0;
    if (!t) return G4_ERR_INPUT;
    memset(t, 0, sizeof *t);
    t->bos = t->eos = t->pad = t->turn_open = t->turn_close = t->think = t->unk_id = -1;
    if (!json || !name) { g4__seterr(t->error, "g4_tokenizer_parse: NULL argument"); return G4_ERR_INPUT; }
    if ((r = g4__json_parse(&j, json, len, name, t->error)) != G4_OK) return r;
    memset(&p, 0, sizeof p);
    p.j = &j; p.name = name; p.t = t;
    root = 0;
    model = g4__jget(&j, root, "model");
    vocab = g4__jget(&j, model, "vocab");
    added = g4__jget(&j, root, "added_tokens");
    if (j.nodes[root].type != G4__JOBJ) r = g4__tokp_fail(&p, "the top level must be an object");
    else if (model < 0 || j.nodes[model].type != G4__JOBJ) r = g4__tokp_fail(&p, "\"model\" must be an object");
    else if (vocab < 0 || j.nodes[vocab].type != G4__JOBJ) r = g4__tokp_fail(&p, "model.vocab must be an object");
    else if (added >= 0 && j.nodes[added].type != G4__JARR) r = g4__tokp_fail(&p, "added_tokens must be an array");
    if (r == G4_OK && added < 0) { /* no added tokens: an empty array node stands in */
        added = g4__json_new(&j, G4__JARR);
        if (added < 0) r = g4__tok_nomem(&p);
    }
    if (r == G4_OK) r = g4__tokp_vocab(&p, vocab, added);
    if (r == G4_OK) r = g4__tokp_merges(&p, g4__jget(&j, model, "merges"));
    if (r == G4_OK) r = g4__tokp_model(&p, model);
    if (r == G4_OK) r = g4__tokp_normalizer(&p, g4__jget(&j, root, "normalizer")); /* before: normalized added tokens */
    if (r == G4_OK) r = g4__tokp_added(&p, added);
    if (r == G4_OK) r = g4__tokp_pretok(&p, g4__jget(&j, root, "pre_tokenizer"));
    if (r == G4_OK) r = g4__tokp_decoder(&p, g4__jget(&j, root, "decoder"), &byte_fallback_dec);
    if (r == G4_OK) r = g4__tokp_post(&p, g4__jget(&j, root, "post_processor"));
    if (r == G4_OK) r = g4__tokp_decoded(&p, byte_fallback_dec);
    if (r == G4_OK) {
        int k;
        for (k = 0; k < t->n_prefix; k++) if (t->prefix[k] >= t->n_vocab) r = g4__tokp_fail(&p, "post_processor id %ld is not in the vocabulary", (long)t->prefix[k]);
        for (k = 0; k < t->n_suffix; k++) if (t->suffix[k] >= t->n_vocab) r = g4__tokp_fail(&p, "post_processor id %ld is not in the vocabulary", (long)t->suffix[k]);
    }
    G4_FREE((void *)p.dstr); G4_FREE(p.dlen); G4_FREE(p.nbuf);
    G4_FREE(p.set_node); G4_FREE(p.set_id); G4_FREE(p.set_special);
    g4__json_free(&j);
    if (r != G4_OK) {
        g4_tokenizer_free(t); /* (t->error stays) */
        return r;
    }
    t->bos = g4_token_id(t, "<bos>");
    t->eos = g4_token_id(t, "<eos>");
    t->pad = g4_token_id(t, "<pad>");
    t->turn_open = g4_token_id(t, "<|turn>");
    t->turn_close = g4_token_id(t, "<turn|>");
    t->think = g4_token_id(t, "<|think|>");
    return G4_OK;
}

G4__DEF g4_result g4_tokenizer_load(g4_tokenizer *t, const char *path) {
    char *text = NULL, *joined = NULL;
    size_t len;
    g4_result r;
    if (!t) return G4_ERR_INPUT;
    memset(t, 0, sizeof *t);
    if (!path) { g4__seterr(t->error, "g4_tokenizer_load: NULL path"); return G4_ERR_INPUT; }
    if (!(joined = g4__join(path, "tokenizer.json"))) { g4__seterr(t->error, "out of memory"); return G4_ERR_NOMEM; }
    if (g4__exists(joined)) path = joined; /* PATH is a directory holding tokenizer.json */
    if ((r = g4__read_file(path, &text, &len, G4__TOK_MAX_FILE, t->error)) == G4_OK) {
        r = g4_tokenizer_parse(t, text, len, path);
        G4_FREE(text);
    }
    G4_FREE(joined);
    return r;
}

/* --------------------------------------------------- encoding >>encoding */

typedef struct { int32_t id, prev, next; uint32_t len; } g4__sym;     /* a BPE symbol (len 0: merged away) */
typedef struct { int32_t rank, pos, id; } g4__merge;                  /* a candidate merge at symbol pos */

/* Encoding state: output, and scratch grown as needed (freed at the end). */
typedef struct {
    const g4_tokenizer *t;
    int32_t *ids; size_t cap, n;   /* the caller's buffer; n counts every id, written or not */
    g4__sym *sym; size_t sym_cap;
    g4__merge *heap; size_t heap_cap, heap_n;
    int nomem;
} g4__enc;

static void g4__emit(g4__enc *e, int32_t id) {
    if (e->n < e->cap) e->ids[e->n] = id;
    e->n++;
}

static int g4__grow(void **p, size_t *cap, size_t need, size_t elem) {
    void *np;
    size_t nc = *cap ? *cap : 64;
    if (need <= *cap) return 1;
    while (nc < need) nc *= 2;
    if (!(np = G4_MALLOC(nc * elem))) return 0;
    G4_FREE(*p);
    *p = np;
    *cap = nc;
    return 1;
}

static int g4__merge_less(const g4__merge *a, const g4__merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void g4__heap_push(g4__enc *e, int32_t rank, int32_t pos, int32_t id) {
    size_t i = e->heap_n++;
    g4__merge m;
    m.rank = rank; m.pos = pos; m.id = id;
    while (i > 0 && g4__merge_less(&m, &e->heap[(i - 1) / 2])) { e->heap[i] = e->heap[(i - 1) / 2]; i = (i - 1) / 2; }
    e->heap[i] = m;
}

static g4__merge g4__heap_pop(g4__enc *e) {
    g4__merge top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && g4__merge_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!g4__merge_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

static void g4__push_pair(g4__enc *e, int32_t pos) {
    int32_t id, rank = g4__merge_find(e->t, e->sym[pos].id, e->sym[e->sym[pos].next].id, &id);
    if (rank >= 0) g4__heap_push(e, rank, pos, id);
}

static void g4__add_sym(g4__enc *e, size_t *n, int32_t id, uint32_t len) {
    e->sym[*n].id = id;
    e->sym[*n].len = len;
    e->sym[*n].prev = (int32_t)*n - 1;
    e->sym[*n].next = (int32_t)*n + 1;
    (*n)++;
}

/* One pre-tokenized word -> ids: characters (or their bytes, or <unk>), then
   the lowest-ranked merge first, leftmost on ties (tokenizers' word.rs). */
static void g4__bpe(g4__enc *e, const char *s, size_t len) {
    const g4_tokenizer *t = e->t;
    size_t i = 0, n = 0, k, unk_len = 0;
    int32_t id;
    if (!len) return;
    if (t->ignore_merges && (id = g4__vocab_find(t, s, len)) >= 0) { g4__emit(e, id); return; }
    if (!g4__grow((void **)&e->sym, &e->sym_cap, len, sizeof(g4__sym)) ||
        !g4__grow((void **)&e->heap, &e->heap_cap, 3 * len, sizeof(g4__merge))) {
        e->nomem = 1;
        return;
    }
    while (i < len) {
        size_t cl = g4__utf8_char((const unsigned char *)s + i, len - i);
        int all_bytes = t->byte_fallback;
        if (!cl) cl = 1; /* an invalid byte is a character of its own */
        if ((id = g4__vocab_find(t, s + i, cl)) >= 0) {
            if (unk_len) { g4__add_sym(e, &n, t->unk_id, (uint32_t)unk_len); unk_len = 0; }
            g4__add_sym(e, &n, id, (uint32_t)cl);
        } else {
            for (k = 0; k < cl && all_bytes; k++) all_bytes = t->byte_id[(unsigned char)s[i + k]] >= 0;
            if (all_bytes) {
                for (k = 0; k < cl; k++) g4__add_sym(e, &n, t->byte_id[(unsigned char)s[i + k]], 1);
            } else if (t->unk_id >= 0) {
                if (unk_len && !t->fuse_unk) { g4__add_sym(e, &n, t->unk_id, (uint32_t)unk_len); unk_len = 0; }
                unk_len += cl;
            } /* no unk token: the character is dropped, as tokenizers does */
        }
        i += cl;
    }
    if (unk_len) g4__add_sym(e, &n, t->unk_id, (uint32_t)unk_len);
    if (!n) return;
    e->sym[n - 1].next = -1;
    e->heap_n = 0;
    for (k = 0; k + 1 < n; k++) g4__push_pair(e, (int32_t)k);
    while (e->heap_n) {
        g4__merge top = g4__heap_pop(e);
        g4__sym *left = &e->sym[top.pos], *right;
        int32_t merged;
        if (left->len == 0 || left->next < 0) continue;
        right = &e->sym[left->next];
        if (g4__merge_find(t, left->id, right->id, &merged) < 0 || merged != top.id) continue; /* stale */
        left->id = top.id;
        left->len += right->len;
        right->len = 0;
        left->next = right->next;
        if (left->next >= 0) e->sym[left->next].prev = top.pos;
        if (left->prev >= 0) g4__push_pair(e, left->prev);
        if (left->next >= 0) g4__push_pair(e, top.pos);
    }
    for (k = 0; k < n; k = (size_t)e->sym[k].next) {
        g4__emit(e, e->sym[k].id);
        if (e->sym[k].next < 0) break;
    }
}

/* The pre-tokenizer: Split(pattern, MergedWithPrevious) - every piece ends
   just after an occurrence of the pattern. */
static void g4__pretokenize(g4__enc *e, const char *s, size_t n) {
    const char *pat = e->t->split;
    size_t pl = strlen(pat), start = 0, i = 0;
    if (!pl) { g4__bpe(e, s, n); return; }
    while (i < n) {
        if (i + pl <= n && memcmp(s + i, pat, pl) == 0) {
            i += pl;
            g4__bpe(e, s + start, i - start);
            start = i;
        } else {
            i++;
        }
    }
    g4__bpe(e, s + start, n - start);
}

/* Splits s on the added tokens of trie `root` (leftmost, then longest match):
   the tokens are emitted, the text between goes to `rest`. */
static void g4__split_added(g4__enc *e, int32_t root, const char *s, size_t n,
                            void (*rest)(g4__enc *, const char *, size_t)) {
    const g4_tokenizer *t = e->t;
    size_t i = 0, start = 0, ml = 0;
    if (t->trie_child[root] < 0) { rest(e, s, n); return; }
    while (i < n) {
        int32_t id = g4__trie_match(t, root, s + i, n - i, &ml);
        if (id < 0) { i++; continue; }
        if (i > start) rest(e, s + start, i - start);
        g4__emit(e, id);
        i += ml;
        start = i;
    }
    if (n > start) rest(e, s + start, n - start);
}

static void g4__after_norm(g4__enc *e, const char *s, size_t n) { g4__split_added(e, 1, s, n, g4__pretokenize); }

/* A stretch of input between raw added tokens: normalize, then the rest. */
static void g4__normalize_segment(g4__enc *e, const char *s, size_t n) {
    const g4_tokenizer *t = e->t;
    size_t bound = g4__replace_bound(t->norm, t->n_norm, n), out_len;
    char *a, *b;
    const char *norm;
    if (!t->n_norm) { g4__after_norm(e, s, n); return; }
    a = (char *)G4_MALLOC(bound + 1);
    b = (char *)G4_MALLOC(bound + 1);
    if (!a || !b) { G4_FREE(a); G4_FREE(b); e->nomem = 1; return; }
    norm = g4__replace_all(t->norm, t->n_norm, s, n, a, b, &out_len);
    g4__after_norm(e, norm, out_len);
    G4_FREE(a);
    G4_FREE(b);
}

G4__DEF size_t g4_tokenize_max(const g4_tokenizer *t, size_t len) {
    if (!t) return 0;
    /* each normalized byte gives at most one id (a byte token) */
    return g4__replace_bound(t->norm, t->n_norm, len) + (size_t)t->n_prefix + (size_t)t->n_suffix;
}

G4__DEF g4_result g4_tokenize(const g4_tokenizer *t, const char *text, size_t len, int flags, int32_t *ids,
                              size_t cap, size_t *n_ids) {
    g4__enc e;
    int k;
    if (n_ids) *n_ids = 0;
    if (!t || !t->trie_child || (!text && len) || (!ids && cap) || !n_ids) return G4_ERR_INPUT;
    memset(&e, 0, sizeof e);
    e.t = t;
    e.ids = ids;
    e.cap = cap;
    if (flags & G4_ENCODE_ADD_SPECIAL) for (k = 0; k < t->n_prefix; k++) g4__emit(&e, t->prefix[k]);
    g4__split_added(&e, 0, text, len, g4__normalize_segment);
    if (flags & G4_ENCODE_ADD_SPECIAL) for (k = 0; k < t->n_suffix; k++) g4__emit(&e, t->suffix[k]);
    G4_FREE(e.sym);
    G4_FREE(e.heap);
    *n_ids = e.n;
    if (e.nomem) return G4_ERR_NOMEM;
    return e.n > cap ? G4_ERR_INPUT : G4_OK;
}

/* --------------------------------------------------- decoding >>decoding */

static const char g4__fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* Makes room for n bytes in a growing buffer (*buf: G4_MALLOC'd or NULL, *cap bytes, the
   first `have` in use), doubling from 64; G4_ERR_NOMEM leaves it as it was. */
static g4_result g4__reserve(char **buf, size_t *cap, size_t have, size_t n) {
    size_t nc = *cap ? *cap : 64;
    char *nb;
    if (n <= *cap) return G4_OK;
    while (nc < n) {
        if (nc > (size_t)-1 / 2) return G4_ERR_NOMEM;
        nc *= 2;
    }
    if (!(nb = (char *)G4_MALLOC(nc))) return G4_ERR_NOMEM;
    if (have) memcpy(nb, *buf, have);
    G4_FREE(*buf);
    *buf = nb;
    *cap = nc;
    return G4_OK;
}

/* Appends to out[0..cap) at *pos, counting what does not fit. */
static void g4__put(char *out, size_t cap, size_t *pos, const char *s, size_t n) {
    if (*pos < cap) memcpy(out + *pos, s, *pos + n <= cap ? n : cap - *pos);
    *pos += n;
}

/* A finished run of byte tokens: as text if valid UTF-8, else U+FFFD per byte. */
static void g4__flush_run(char *out, size_t cap, size_t *pos, const unsigned char *run, size_t n) {
    size_t k;
    if (g4__utf8_valid(run, n)) g4__put(out, cap, pos, (const char *)run, n);
    else for (k = 0; k < n; k++) g4__put(out, cap, pos, g4__fffd, 3);
}

G4__DEF g4_result g4_detokenize(const g4_tokenizer *t, const int32_t *ids, size_t n, int flags, char *out,
                                size_t cap, size_t *len) {
    size_t i, pos = 0, run_n = 0, run_cap = 0;
    char *run = NULL; /* the bytes of the open run */
    if (len) *len = 0;
    if (!t || !t->text || (!ids && n) || (!out && cap) || !len) return G4_ERR_INPUT;
    for (i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab) return G4_ERR_INPUT;
    for (i = 0; i <= n; i++) {
        int32_t id = i < n ? ids[i] : -1;
        if (i < n) {
            if (t->text_off[id] == G4__TOK_NONE) continue; /* no string: skipped */
            if ((flags & G4_DECODE_SKIP_SPECIAL) && (t->flags[id] & G4_TOKEN_SPECIAL)) continue;
            if (t->byte_value[id] >= 0) {
                if (g4__reserve(&run, &run_cap, run_n, run_n + 1) != G4_OK) { G4_FREE(run); return G4_ERR_NOMEM; }
                run[run_n++] = (char)t->byte_value[id];
                continue;
            }
        }
        if (run_n) { g4__flush_run(out, cap, &pos, (const unsigned char *)run, run_n); run_n = 0; }
        if (i < n) g4__put(out, cap, &pos, t->text + t->text_off[id], t->text_len[id]);
    }
    G4_FREE(run);
    *len = pos;
    if (pos + 1 > cap) return G4_ERR_INPUT;
    out[pos] = 0;
    return G4_OK;
}

static int g4__ds_ok(const g4_decode_state *st) {
    return st && st->n_run <= st->run_cap && st->run_whole <= st->n_run && (!st->run_bad || !st->n_run) &&
           (st->run || !st->run_cap) && (st->piece || !st->piece_cap) && st->n_run < (size_t)-1 / 8;
}

/* Ends the open run into the piece at *pos: its bytes when they are whole
   characters, else U+FFFD per byte (a bad run's bytes went out already). The
   piece has room (3 * n_run bytes). */
static void g4__ds_close_run(g4_decode_state *st, size_t *pos) {
    size_t k;
    if (st->run_whole == st->n_run) {
        if (st->n_run) memcpy(st->piece + *pos, st->run, st->n_run);
        *pos += st->n_run;
    } else {
        for (k = 0; k < st->n_run; k++, *pos += 3) memcpy(st->piece + *pos, g4__fffd, 3);
    }
    st->n_run = st->run_whole = 0;
    st->run_bad = 0;
}

G4__DEF g4_result g4_decode_next(const g4_tokenizer *t, g4_decode_state *st, int32_t id, int flags,
                                 const char **piece, size_t *len) {
    size_t pos = 0, need;
    if (piece) *piece = "";
    if (len) *len = 0;
    if (!t || !t->text || !g4__ds_ok(st) || !piece || !len || id < 0 || id >= t->n_vocab) return G4_ERR_INPUT;
    if (t->text_off[id] == G4__TOK_NONE || ((flags & G4_DECODE_SKIP_SPECIAL) && (t->flags[id] & G4_TOKEN_SPECIAL)))
        return G4_OK; /* dropped: the run goes on */
    if (t->byte_value[id] >= 0) {
        if (st->run_bad) { /* the run is lost already: one more U+FFFD */
            if (g4__reserve(&st->piece, &st->piece_cap, 0, 4) != G4_OK) return G4_ERR_NOMEM;
            memcpy(st->piece, g4__fffd, 3);
            pos = 3;
        } else {
            if (g4__reserve(&st->run, &st->run_cap, st->n_run, st->n_run + 1) != G4_OK ||
                g4__reserve(&st->piece, &st->piece_cap, 0, 3 * (st->n_run + 1) + 1) != G4_OK)
                return G4_ERR_NOMEM;
            st->run[st->n_run++] = (char)t->byte_value[id];
            need = g4__utf8_lead((const unsigned char *)st->run + st->run_whole, st->n_run - st->run_whole);
            if (!need) { /* no byte to come can make the run valid: all of it is U+FFFD */
                st->run_whole = 0;
                g4__ds_close_run(st, &pos);
                st->run_bad = 1;
            } else if (st->run_whole + need == st->n_run) {
                st->run_whole = st->n_run; /* one more whole character, still held */
            }
        }
    } else {
        if (g4__reserve(&st->piece, &st->piece_cap, 0, 3 * st->n_run + t->text_len[id] + 1) != G4_OK)
            return G4_ERR_NOMEM;
        g4__ds_close_run(st, &pos);
        memcpy(st->piece + pos, t->text + t->text_off[id], t->text_len[id]);
        pos += t->text_len[id];
    }
    if (!pos) return G4_OK;
    st->piece[pos] = 0;
    *piece = st->piece;
    *len = pos;
    return G4_OK;
}

G4__DEF g4_result g4_decode_flush(g4_decode_state *st, const char **piece, size_t *len) {
    size_t pos = 0;
    if (piece) *piece = "";
    if (len) *len = 0;
    if (!g4__ds_ok(st) || !piece || !len) return G4_ERR_INPUT;
    if (!st->n_run) { st->run_bad = 0; return G4_OK; }
    if (g4__reserve(&st->piece, &st->piece_cap, 0, 3 * st->n_run + 1) != G4_OK) return G4_ERR_NOMEM;
    g4__ds_close_run(st, &pos);
    st->piece[pos] = 0;
    *piece = st->piece;
    *len = pos;
    return G4_OK;
}

G4__DEF void g4_decode_free(g4_decode_state *st) {
    if (!st) return;
    G4_FREE(st->run);
    G4_FREE(st->piece);
    memset(st, 0, sizeof *st);
}

/* ----------------------------------------------------------- chat >>chat */

/* Appends s (or a token's string) to a growing buffer; 0 when out of memory. */
static int g4__sbuf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (g4__reserve(buf, cap, *len, *len + n + 1) != G4_OK) return 0;
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 1;
}

static int g4__sbuf_tok(char **buf, size_t *len, size_t *cap, const g4_tokenizer *t, int32_t id) {
    return g4__sbuf_add(buf, len, cap, t->text + t->text_off[id], t->text_len[id]);
}

G4__DEF g4_result g4_chat_encode(const g4_tokenizer *t, const g4_chat_message *msgs, int n_msgs, int flags,
                                 int32_t *ids, size_t cap, size_t *n_ids) {
    char *buf = NULL;
    size_t len = 0, bcap = 0;
    int i, ok = 1, think = (flags & G4_CHAT_THINKING) != 0;
    g4_result r;
    if (n_ids) *n_ids = 0;
    if (!t || !t->text || !n_ids || n_msgs < 0 || (n_msgs && !msgs) || t->turn_open < 0 || t->turn_close < 0 ||
        ((flags & G4_CHAT_BOS) && t->bos < 0) || (think && t->think < 0))
        return G4_ERR_INPUT;
    for (i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content) return G4_ERR_INPUT;
    if (flags & G4_CHAT_CONTINUE)
        ok = g4__sbuf_tok(&buf, &len, &bcap, t, t->turn_close) && g4__sbuf_add(&buf, &len, &bcap, "\n", 1);
    if (flags & G4_CHAT_BOS) ok = ok && g4__sbuf_tok(&buf, &len, &bcap, t, t->bos);
    if (think && (n_msgs == 0 || strcmp(msgs[0].role, "system") != 0)) { /* a system turn just for the switch */
        ok = ok && g4__sbuf_tok(&buf, &len, &bcap, t, t->turn_open) && g4__sbuf_add(&buf, &len, &bcap, "system\n", 7) &&
             g4__sbuf_tok(&buf, &len, &bcap, t, t->think) && g4__sbuf_tok(&buf, &len, &bcap, t, t->turn_close) &&
             g4__sbuf_add(&buf, &len, &bcap, "\n", 1);
    }
    for (i = 0; i < n_msgs && ok; i++) {
        const char *role = strcmp(msgs[i].role, "assistant") == 0 ? "model" : msgs[i].role;
        ok = g4__sbuf_tok(&buf, &len, &bcap, t, t->turn_open) && g4__sbuf_add(&buf, &len, &bcap, role, strlen(role)) &&
             g4__sbuf_add(&buf, &len, &bcap, "\n", 1);
        if (ok && i == 0 && think && strcmp(role, "system") == 0) ok = g4__sbuf_tok(&buf, &len, &bcap, t, t->think);
        ok = ok && g4__sbuf_add(&buf, &len, &bcap, msgs[i].content, strlen(msgs[i].content)) &&
             g4__sbuf_tok(&buf, &len, &bcap, t, t->turn_close) && g4__sbuf_add(&buf, &len, &bcap, "\n", 1);
    }
    if (flags & G4_CHAT_OPEN_MODEL)
        ok = ok && g4__sbuf_tok(&buf, &len, &bcap, t, t->turn_open) && g4__sbuf_add(&buf, &len, &bcap, "model\n", 6);
    if (!ok) { G4_FREE(buf); return G4_ERR_NOMEM; }
    r = g4_tokenize(t, buf ? buf : "", len, 0, ids, cap, n_ids);
    G4_FREE(buf);
    return r;
}

G4__DEF int g4_chat_is_stop(const g4_tokenizer *t, int32_t id) {
    return t && id >= 0 && (id == t->eos || id == t->turn_close);
}

/* ------------------------------------------------- template >>template */
/* The Jinja subset interpreter behind g4_template_*, in four parts: the
   lexer (jinja2's lexer rules with trim_blocks and lstrip_blocks), the parser
   (jinja2's grammar, to a tree of g4__jtn), the values (Python's semantics
   for None, bool, int, float, str, list, tuple and dict) and the renderer (a
   tree walk). Everything lives in arenas: the parser's with the template,
   the renderer's for one render. Strings are UTF-8 bytes; where Python
   counts characters (length, indexing, slicing) the code points are
   counted. Limits: upper/lower/title/capitalize change ASCII letters only;
   integers are int64 (overflow is an error, not a Python bigint). */

#define G4__JT_MAX_NEST 128       /* nested expressions or blocks in the parser */

typedef struct g4__jtblk { struct g4__jtblk *next; size_t used, cap; } g4__jtblk;
typedef struct { g4__jtblk *head; size_t total, limit; } g4__jtarena;
#define G4__JTBLK_HDR ((sizeof(g4__jtblk) + 15) & ~(size_t)15)

static void *g4__jt_alloc(g4__jtarena *a, size_t n) {
    g4__jtblk *b = a->head;
    void *p;
    if (n > a->limit) return NULL;
    n = n ? (n + 15) & ~(size_t)15 : 16;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (a->total + cap + G4__JTBLK_HDR > a->limit) return NULL;
        b = (g4__jtblk *)G4_MALLOC(G4__JTBLK_HDR + cap);
        if (!b) return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
        a->total += cap + G4__JTBLK_HDR;
    }
    p = (char *)b + G4__JTBLK_HDR + b->used;
    b->used += n;
    return p;
}

static void g4__jt_arena_free(g4__jtarena *a) {
    while (a->head) {
        g4__jtblk *n = a->head->next;
        G4_FREE(a->head);
        a->head = n;
    }
    a->total = 0;
}

/* Python's str.isspace() for the character at s (bytes of it, 0 if not space). */
static size_t g4__jt_space(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) return 0;
    if (u[0] == ' ' || (u[0] >= 9 && u[0] <= 13) || (u[0] >= 0x1c && u[0] <= 0x1f)) return 1;
    if (n >= 2 && u[0] == 0xC2 && (u[1] == 0x85 || u[1] == 0xA0)) return 2;
    if (n >= 3 && u[0] == 0xE1 && u[1] == 0x9A && u[2] == 0x80) return 3;
    if (n >= 3 && u[0] == 0xE2 && u[1] == 0x80 && ((u[2] >= 0x80 && u[2] <= 0x8A) || u[2] == 0xA8 || u[2] == 0xA9 || u[2] == 0xAF))
        return 3;
    if (n >= 3 && u[0] == 0xE2 && u[1] == 0x81 && u[2] == 0x9F) return 3;
    if (n >= 3 && u[0] == 0xE3 && u[1] == 0x80 && u[2] == 0x80) return 3;
    return 0;
}

/* Bytes of a space character ending at s[end) (0 if none). */
static size_t g4__jt_space_back(const char *s, size_t end) {
    size_t k;
    for (k = 1; k <= 3 && k <= end; k++)
        if (g4__jt_space(s + end - k, k) == k) return k;
    return 0;
}

/* ---- lexer */

enum { G4__JK_DATA, G4__JK_VBEGIN, G4__JK_VEND, G4__JK_BBEGIN, G4__JK_BEND, G4__JK_NAME, G4__JK_STR, G4__JK_INT,
       G4__JK_FLOAT, G4__JK_OP, G4__JK_EOF };

typedef struct {
    int type, line;
    const char *s;               /* text (decoded for strings), operator or name */
    size_t n;
    int64_t i;
    double f;
} g4__jttok;

typedef struct {
    g4__jtarena *a;
    const char *src, *name;
    size_t len;
    g4__jttok *tok;
    size_t n, cap;
    size_t lpos;                 /* line bookkeeping: line number at byte lpos */
    int line;
    char *err;
} g4__jtlex;

static int g4__jt_line_at(g4__jtlex *L, size_t pos) {
    for (; L->lpos < pos && L->lpos < L->len; L->lpos++)
        if (L->src[L->lpos] == '\n') L->line++;
    return L->line;
}

static int g4__jt_lexfail(g4__jtlex *L, size_t pos, const char *what) {
    g4__seterr(L->err, "%s: line %d: %s", L->name, g4__jt_line_at(L, pos), what);
    return -1;
}

static g4__jttok *g4__jt_emit(g4__jtlex *L, int type, size_t pos, const char *s, size_t n) {
    g4__jttok *t;
    if (L->n == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        g4__jttok *nt = (g4__jttok *)g4__jt_alloc(L->a, nc * sizeof *nt);
        if (!nt) { g4__jt_lexfail(L, pos, "out of memory"); return NULL; }
        if (L->n) memcpy(nt, L->tok, L->n * sizeof *nt);
        L->tok = nt;
        L->cap = nc;
    }
    t = &L->tok[L->n++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = g4__jt_line_at(L, pos);
    t->s = s;
    t->n = n;
    return t;
}

static size_t g4__jt_utf8_put(char *d, unsigned cp) {
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) { d[0] = (char)(0xC0 | (cp >> 6)); d[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12)); d[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18)); d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int g4__jt_hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal s[0..n) (quotes excluded), unescaped as jinja2 does
   (Python's "unicode-escape"): \\ \' \" \a \b \f \n \r \t \v \ooo \xhh \uXXXX
   \UXXXXXXXX, backslash-newline dropped, any other escape kept as written. */
static int g4__jt_unescape(g4__jtlex *L, size_t pos, const char *s, size_t n, g4__jttok *t) {
    char *d = (char *)g4__jt_alloc(L->a, n + 1), *o = d;
    size_t i = 0;
    int e;
    if (!d) return g4__jt_lexfail(L, pos, "out of memory");
    while (i < n) {
        char c = s[i];
        if (c != '\\' || i + 1 >= n) { *o++ = c; i++; continue; }
        c = s[i + 1];
        i += 2;
        switch (c) {
        case '\n': break;
        case 'x': case 'u': case 'U': {
            int want = c == 'x' ? 2 : c == 'u' ? 4 : 8, k;
            unsigned cp = 0;
            for (k = 0; k < want; k++) {
                int h = i + (size_t)k < n ? g4__jt_hexval(s[i + (size_t)k]) : -1;
                if (h < 0) return g4__jt_lexfail(L, pos, "truncated \\x, \\u or \\U escape in a string literal");
                cp = cp * 16 + (unsigned)h;
            }
            i += (size_t)want;
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return g4__jt_lexfail(L, pos, "escape in a string literal is not a Unicode scalar value");
            o += g4__jt_utf8_put(o, cp);
            break;
        }
        default:
            if ((e = g4__escape_char(c, "\\'\"abfnrtv")) >= 0) {
                *o++ = (char)e;
            } else if (c >= '0' && c <= '7') {
                unsigned cp = (unsigned)(c - '0');
                int k;
                for (k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++) cp = cp * 8 + (unsigned)(s[i++] - '0');
                o += g4__jt_utf8_put(o, cp);
            } else {
                *o++ = '\\';
                *o++ = c;
            }
        }
    }
    *o = 0;
    t->s = d;
    t->n = (size_t)(o - d);
    return 0;
}

static int g4__jt_isdigit(char c) { return c >= '0' && c <= '9'; }
static int g4__jt_isalpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

/* A number at s[p..): jinja2's integer (with _ separators, 0b/0o/0x) or float. */
static int g4__jt_lexnum(g4__jtlex *L, size_t *pp, int after_dot) {
    const char *s = L->src;
    size_t p = *pp, n = L->len, q = p, k;
    int is_float = 0;
    char buf[96];
    size_t bl = 0;
    g4__jttok *t;
    if (s[p] == '0' && p + 2 < n && (s[p + 1] == 'x' || s[p + 1] == 'X' || s[p + 1] == 'o' || s[p + 1] == 'O' ||
                                     s[p + 1] == 'b' || s[p + 1] == 'B')) {
        int base = (s[p + 1] | 32) == 'x' ? 16 : (s[p + 1] | 32) == 'o' ? 8 : 2, dg = 0;
        uint64_t v = 0;
        q = p + 2;
        for (; q < n; q++) {
            int h = s[q] == '_' ? -2 : g4__jt_hexval(s[q]);
            if (h == -2) continue;
            if (h < 0 || h >= base) break;
            if (v > (UINT64_MAX >> 4)) return g4__jt_lexfail(L, p, "integer literal too large");
            v = v * (uint64_t)base + (uint64_t)h;
            dg++;
        }
        if (!dg || v > (uint64_t)INT64_MAX) return g4__jt_lexfail(L, p, "bad integer literal");
        if (!(t = g4__jt_emit(L, G4__JK_INT, p, s + p, q - p))) return -1;
        t->i = (int64_t)v;
        *pp = q;
        return 0;
    }
    while (q < n && (g4__jt_isdigit(s[q]) || (s[q] == '_' && q + 1 < n && g4__jt_isdigit(s[q + 1])))) q++;
    if (!after_dot && q + 1 < n && s[q] == '.' && g4__jt_isdigit(s[q + 1])) {
        is_float = 1;
        q++;
        while (q < n && (g4__jt_isdigit(s[q]) || (s[q] == '_' && q + 1 < n && g4__jt_isdigit(s[q + 1])))) q++;
    }
    if (!after_dot && q < n && (s[q] == 'e' || s[q] == 'E')) {
        size_t e = q + 1;
        if (e < n && (s[e] == '+' || s[e] == '-')) e++;
        if (e < n && g4__jt_isdigit(s[e])) {
            is_float = 1;
            q = e;
            while (q < n && (g4__jt_isdigit(s[q]) || (s[q] == '_' && q + 1 < n && g4__jt_isdigit(s[q + 1])))) q++;
        }
    }
    for (k = p; k < q && bl + 1 < sizeof buf; k++)
        if (s[k] != '_') buf[bl++] = s[k];
    if (q - p >= sizeof buf - 1) return g4__jt_lexfail(L, p, "number literal too long");
    buf[bl] = 0;
    if (!(t = g4__jt_emit(L, is_float ? G4__JK_FLOAT : G4__JK_INT, p, s + p, q - p))) return -1;
    if (is_float) {
        g4__json j;
        g4__jnode nd;
        char jerr[G4_ERROR_MAX];
        memset(&j, 0, sizeof j);
        j.src = buf;
        j.len = bl;
        j.name = "literal";
        j.err = jerr;
        if (g4__json_number(&j, &nd) != 0) return g4__jt_lexfail(L, p, "bad float literal");
        t->f = nd.num;
    } else {
        uint64_t v = 0;
        for (k = 0; k < bl; k++) {
            if (v > (uint64_t)INT64_MAX / 10) return g4__jt_lexfail(L, p, "integer literal too large");
            v = v * 10 + (uint64_t)(buf[k] - '0');
        }
        if (v > (uint64_t)INT64_MAX) return g4__jt_lexfail(L, p, "integer literal too large");
        t->i = (int64_t)v;
    }
    *pp = q;
    return 0;
}

/* The tokens inside {{ }} or {% %} from s[*pp); stops after the end marker. */
static int g4__jt_lextag(g4__jtlex *L, size_t *pp, int block, int *line_starting) {
    static const char *const ops2[] = {"**", "//", "==", "!=", ">=", "<="};
    const char *s = L->src;
    size_t p = *pp, n = L->len;
    char stack[G4__JT_MAX_NEST];
    int depth = 0;
    for (;;) {
        size_t k;
        if (p >= n) return g4__jt_lexfail(L, p, block ? "unexpected end of template: '{%' not closed by '%}'"
                                                      : "unexpected end of template: '{{' not closed by '}}'");
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            size_t e = 0;
            int strip = 0, keep = 0;
            if (s[p] == '-' && p + 2 < n + 0 && memcmp(s + p + 1, end, 2) == 0) { e = p + 3; strip = 1; }
            else if (block && s[p] == '+' && p + 2 < n + 0 && memcmp(s + p + 1, end, 2) == 0) { e = p + 3; keep = 1; }
            else if (p + 1 < n && memcmp(s + p, end, 2) == 0) e = p + 2;
            if (e) {
                if (!g4__jt_emit(L, block ? G4__JK_BEND : G4__JK_VEND, p, s + p, e - p)) return -1;
                if (strip) { size_t w; while ((w = g4__jt_space(s + e, n - e)) != 0) e += w; }
                else if (block && !keep && e < n && s[e] == '\n') e++; /* trim_blocks */
                *line_starting = s[e - 1] == '\n';
                *pp = e;
                return 0;
            }
        }
        if ((k = g4__jt_space(s + p, n - p)) != 0) { p += k; continue; }
        if (g4__jt_isdigit(s[p])) {
            if (g4__jt_lexnum(L, &p, p > 0 && s[p - 1] == '.')) return -1;
            continue;
        }
        if (g4__jt_isalpha(s[p])) {
            size_t q = p;
            while (q < n && (g4__jt_isalpha(s[q]) || g4__jt_isdigit(s[q]))) q++;
            if (!g4__jt_emit(L, G4__JK_NAME, p, s + p, q - p)) return -1;
            p = q;
            continue;
        }
        if (s[p] == '\'' || s[p] == '"') {
            char qc = s[p];
            size_t q = p + 1;
            g4__jttok *t;
            while (q < n && s[q] != qc) q += s[q] == '\\' ? 2 : 1;
            if (q >= n) return g4__jt_lexfail(L, p, "unterminated string literal");
            if (!(t = g4__jt_emit(L, G4__JK_STR, p, NULL, 0))) return -1;
            if (g4__jt_unescape(L, p, s + p + 1, q - p - 1, t)) return -1;
            p = q + 1;
            continue;
        }
        for (k = 0; k < sizeof ops2 / sizeof ops2[0]; k++)
            if (p + 1 < n && s[p] == ops2[k][0] && s[p + 1] == ops2[k][1]) break;
        if (k < sizeof ops2 / sizeof ops2[0]) {
            if (!g4__jt_emit(L, G4__JK_OP, p, s + p, 2)) return -1;
            p += 2;
            continue;
        }
        if (strchr("+-/*%~[](){}<>=.:|,;", s[p]) && s[p]) {
            char c = s[p];
            if (c == '(' || c == '[' || c == '{') {
                if (depth >= G4__JT_MAX_NEST) return g4__jt_lexfail(L, p, "brackets nested deeper than 128");
                stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
            } else if (c == ')' || c == ']' || c == '}') {
                char msg[64];
                if (depth == 0) {
                    snprintf(msg, sizeof msg, "unexpected '%c'", c);
                    return g4__jt_lexfail(L, p, msg);
                }
                if (stack[--depth] != c) {
                    snprintf(msg, sizeof msg, "unexpected '%c', expected '%c'", c, stack[depth]);
                    return g4__jt_lexfail(L, p, msg);
                }
            }
            if (!g4__jt_emit(L, G4__JK_OP, p, s + p, 1)) return -1;
            p++;
            continue;
        }
        return g4__jt_lexfail(L, p, "unexpected character inside a tag");
    }
}

/* The whole template into tokens, whitespace control applied (jinja2's lexer:
   '-' strips all space before/after a tag, '+' keeps it, trim_blocks drops the
   newline after a block or comment tag, lstrip_blocks the spaces and tabs
   before one at the start of a line). */
static int g4__jt_lex(g4__jtlex *L) {
    const char *s = L->src;
    size_t n = L->len, pos = 0;
    int line_starting = 1;
    L->lpos = 0;
    L->line = 1;
    while (pos < n) {
        size_t p, q, text_end;
        int kind, sign = 0, is_raw = 0;
        for (p = pos; p + 1 < n; p++)
            if (s[p] == '{' && (s[p + 1] == '{' || s[p + 1] == '%' || s[p + 1] == '#')) break;
        if (p + 1 >= n) {
            if (!g4__jt_emit(L, G4__JK_DATA, pos, s + pos, n - pos)) return -1;
            break;
        }
        kind = s[p + 1];
        q = p + 2;
        if (q < n && (s[q] == '-' || s[q] == '+')) sign = s[q++];
        if (kind == '%') { /* {% raw %} */
            size_t r = q, w;
            while ((w = g4__jt_space(s + r, n - r)) != 0) r += w;
            if (n - r >= 3 && memcmp(s + r, "raw", 3) == 0) {
                r += 3;
                while ((w = g4__jt_space(s + r, n - r)) != 0) r += w;
                if (n - r >= 3 && memcmp(s + r, "-%}", 3) == 0) {
                    r += 3;
                    while ((w = g4__jt_space(s + r, n - r)) != 0) r += w;
                    is_raw = 1;
                } else if (n - r >= 2 && memcmp(s + r, "%}", 2) == 0) {
                    r += 2;
                    is_raw = 1;
                }
                if (is_raw) q = r;
            }
        }
        text_end = p;
        if (sign == '-') {
            size_t w;
            while (text_end > pos && (w = g4__jt_space_back(s, text_end)) != 0 && text_end - w >= pos) text_end -= w;
        } else if (sign != '+' && kind != '{') {
            size_t lp = p, k;
            int found = 0, all_ws = 1;
            while (lp > pos && s[lp - 1] != '\n') lp--;
            found = lp > pos; /* a newline in the text */
            for (k = lp; k < p;) {
                size_t w = g4__jt_space(s + k, p - k);
                if (!w) { all_ws = 0; break; }
                k += w;
            }
            if ((found || line_starting) && lp < p && all_ws) text_end = lp;
        }
        if (text_end > pos && !g4__jt_emit(L, G4__JK_DATA, pos, s + pos, text_end - pos)) return -1;
        if (is_raw) { /* everything up to {% endraw %} is text */
            size_t r = q, body_end = 0, after = 0;
            int esign = 0;
            for (; r + 1 < n; r++) {
                size_t t = r + 2, w;
                int sg = 0;
                if (s[r] != '{' || s[r + 1] != '%') continue;
                if (t < n && (s[t] == '-' || s[t] == '+')) sg = s[t++];
                while ((w = g4__jt_space(s + t, n - t)) != 0) t += w;
                if (n - t < 6 || memcmp(s + t, "endraw", 6) != 0) continue;
                t += 6;
                while ((w = g4__jt_space(s + t, n - t)) != 0) t += w;
                if (n - t >= 3 && s[t] == '+' && memcmp(s + t + 1, "%}", 2) == 0) after = t + 3;
                else if (n - t >= 3 && s[t] == '-' && memcmp(s + t + 1, "%}", 2) == 0) {
                    after = t + 3;
                    while ((w = g4__jt_space(s + after, n - after)) != 0) after += w;
                } else if (n - t >= 2 && memcmp(s + t, "%}", 2) == 0) {
                    after = t + 2;
                    if (after < n && s[after] == '\n') after++;
                } else continue;
                body_end = r;
                esign = sg;
                break;
            }
            if (!after) return g4__jt_lexfail(L, p, "missing end of raw directive ({% endraw %})");
            {
                size_t te = body_end;
                if (esign == '-') {
                    size_t w;
                    while (te > q && (w = g4__jt_space_back(s, te)) != 0 && te - w >= q) te -= w;
                } else if (esign != '+') {
                    size_t lp = body_end, k;
                    int all_ws = 1;
                    while (lp > q && s[lp - 1] != '\n') lp--;
                    for (k = lp; k < body_end;) {
                        size_t w = g4__jt_space(s + k, body_end - k);
                        if (!w) { all_ws = 0; break; }
                        k += w;
                    }
                    if (lp > q && lp < body_end && all_ws) te = lp;
                }
                if (te > q && !g4__jt_emit(L, G4__JK_DATA, q, s + q, te - q)) return -1;
            }
            line_starting = s[after - 1] == '\n';
            pos = after;
            continue;
        }
        if (kind == '#') {
            size_t j = q, e;
            int sg = 0;
            while (j + 1 < n && !(s[j] == '#' && s[j + 1] == '}')) j++;
            if (j + 1 >= n) return g4__jt_lexfail(L, p, "missing end of comment tag ('#}')");
            if (j > q && (s[j - 1] == '-' || s[j - 1] == '+')) sg = s[j - 1];
            e = j + 2;
            if (sg == '-') { size_t w; while ((w = g4__jt_space(s + e, n - e)) != 0) e += w; }
            else if (sg != '+' && e < n && s[e] == '\n') e++;
            line_starting = s[e - 1] == '\n';
            pos = e;
            continue;
        }
        if (!g4__jt_emit(L, kind == '%' ? G4__JK_BBEGIN : G4__JK_VBEGIN, p, s + p, q - p)) return -1;
        pos = q;
        if (g4__jt_lextag(L, &pos, kind == '%', &line_starting)) return -1;
    }
    return g4__jt_emit(L, G4__JK_EOF, n, s + n, 0) ? 0 : -1;
}

/* ---- parser: jinja2's grammar (parser.py), the same precedence and forms */

enum {
    G4__JN_NONE, G4__JN_TRUE, G4__JN_FALSE, G4__JN_INT, G4__JN_FLOAT, G4__JN_STR, G4__JN_NAME, G4__JN_LIST,
    G4__JN_TUPLE, G4__JN_DICT, G4__JN_PAIR, G4__JN_ATTR, G4__JN_ITEM, G4__JN_SLICE, G4__JN_CALL, G4__JN_KWARG,
    G4__JN_FILTER, G4__JN_TEST, G4__JN_BIN, G4__JN_NEG, G4__JN_POS, G4__JN_NOT, G4__JN_AND, G4__JN_OR, G4__JN_CMP,
    G4__JN_CMPOP, G4__JN_COND,
    G4__JS_TEXT, G4__JS_OUT, G4__JS_IF, G4__JS_FOR, G4__JS_SET, G4__JS_SETBLOCK, G4__JS_MACRO, G4__JS_BREAK,
    G4__JS_CONTINUE, G4__JS_FILTER, G4__JS_WITH, G4__JS_GEN
};

typedef struct g4__jtn {
    int k, line, op, flag;
    struct g4__jtn *a, *b, *c, *d, *e, *next;
    const char *s;
    size_t n;
    int64_t i;
    double f;
} g4__jtn;

typedef struct {
    g4__jtarena a;
    g4__jtn *body;
} g4__jtmpl;

typedef struct {
    g4__jtarena *a;
    g4__jttok *t;
    size_t i;
    int nest, loops;
    const char *name;
    char *err;
} g4__jtp;

static int g4__jt_pfail(g4__jtp *P, const char *fmt, ...) G4__PRINTF(2, 3);
static int g4__jt_pfail(g4__jtp *P, const char *fmt, ...) {
    char msg[G4_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g4__seterr(P->err, "%s: line %d: %s", P->name, P->t[P->i].line, msg);
    return -1;
}

static g4__jttok *g4__jt_cur(g4__jtp *P) { return &P->t[P->i]; }
static g4__jttok *g4__jt_peek(g4__jtp *P) { return P->t[P->i].type == G4__JK_EOF ? &P->t[P->i] : &P->t[P->i + 1]; }
static void g4__jt_adv(g4__jtp *P) { if (P->t[P->i].type != G4__JK_EOF) P->i++; }

static int g4__jt_tokis(const g4__jttok *t, int type, const char *s) {
    return t->type == type && (!s || (t->n == strlen(s) && memcmp(t->s, s, t->n) == 0));
}
static int g4__jt_isop(g4__jtp *P, const char *op) { return g4__jt_tokis(g4__jt_cur(P), G4__JK_OP, op); }
static int g4__jt_isname(g4__jtp *P, const char *nm) { return g4__jt_tokis(g4__jt_cur(P), G4__JK_NAME, nm); }

/* What the current token is, for messages. */
static const char *g4__jt_desc(g4__jtp *P, char *buf, size_t cap) {
    const g4__jttok *t = g4__jt_cur(P);
    switch (t->type) {
    case G4__JK_EOF: return "end of template";
    case G4__JK_DATA: return "template text";
    case G4__JK_VEND: return "end of print statement ('}}')";
    case G4__JK_BEND: return "end of statement block ('%}')";
    case G4__JK_VBEGIN: return "'{{'";
    case G4__JK_BBEGIN: return "'{%'";
    case G4__JK_STR: return "a string";
    case G4__JK_INT: case G4__JK_FLOAT: return "a number";
    default: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    }
}

static int g4__jt_expect_op(g4__jtp *P, const char *op) {
    char b[64];
    if (g4__jt_isop(P, op)) { g4__jt_adv(P); return 0; }
    return g4__jt_pfail(P, "expected '%s', got %s", op, g4__jt_desc(P, b, sizeof b));
}

static int g4__jt_expect_end(g4__jtp *P, int type) {
    char b[64];
    if (g4__jt_cur(P)->type == type) { g4__jt_adv(P); return 0; }
    return g4__jt_pfail(P, "expected %s, got %s", type == G4__JK_BEND ? "end of statement block ('%}')"
                                                                      : "end of print statement ('}}')",
                        g4__jt_desc(P, b, sizeof b));
}

static g4__jtn *g4__jt_node(g4__jtp *P, int k) {
    g4__jtn *n = (g4__jtn *)g4__jt_alloc(P->a, sizeof *n);
    if (!n) { g4__jt_pfail(P, "out of memory parsing the template"); return NULL; }
    memset(n, 0, sizeof *n);
    n->k = k;
    n->line = g4__jt_cur(P)->line;
    return n;
}

static g4__jtn *g4__jt_expr(g4__jtp *P);
static g4__jtn *g4__jt_or(g4__jtp *P);
static g4__jtn *g4__jt_unary(g4__jtp *P, int with_filter);
static g4__jtn *g4__jt_primary(g4__jtp *P);
static g4__jtn *g4__jt_postfix(g4__jtp *P, g4__jtn *node);
static g4__jtn *g4__jt_filter_expr(g4__jtp *P, g4__jtn *node);

/* (a, b=c, ...) after the '('; fills node->b (positional) and node->c (keywords). */
static int g4__jt_callargs(g4__jtp *P, g4__jtn *node) {
    g4__jtn **pos = &node->b, **kw = &node->c;
    char b[64];
    if (g4__jt_expect_op(P, "(")) return -1;
    while (!g4__jt_isop(P, ")")) {
        if (node->b || node->c) { if (g4__jt_expect_op(P, ",")) return -1; }
        if (g4__jt_isop(P, ")")) break; /* trailing comma */
        if (g4__jt_isop(P, "*") || g4__jt_isop(P, "**"))
            return g4__jt_pfail(P, "unsupported: *args and **kwargs in a call");
        if (g4__jt_cur(P)->type == G4__JK_NAME && g4__jt_tokis(g4__jt_peek(P), G4__JK_OP, "=")) {
            g4__jtn *k = g4__jt_node(P, G4__JN_KWARG);
            if (!k) return -1;
            k->s = g4__jt_cur(P)->s;
            k->n = g4__jt_cur(P)->n;
            g4__jt_adv(P);
            g4__jt_adv(P);
            if (!(k->a = g4__jt_expr(P))) return -1;
            *kw = k;
            kw = &k->next;
        } else {
            g4__jtn *v;
            if (node->c) return g4__jt_pfail(P, "a positional argument follows keyword arguments");
            if (!(v = g4__jt_expr(P))) return -1;
            *pos = v;
            pos = &v->next;
        }
        if (g4__jt_cur(P)->type == G4__JK_EOF) return g4__jt_pfail(P, "unexpected %s in a call", g4__jt_desc(P, b, sizeof b));
    }
    g4__jt_adv(P);
    return 0;
}

/* name(.name)* of a filter or test */
static int g4__jt_dotted(g4__jtp *P, g4__jtn *node, const char *what) {
    char b[64];
    const char *start;
    if (g4__jt_cur(P)->type != G4__JK_NAME) return g4__jt_pfail(P, "expected a %s name, got %s", what, g4__jt_desc(P, b, sizeof b));
    start = g4__jt_cur(P)->s;
    node->s = start;
    node->n = g4__jt_cur(P)->n;
    g4__jt_adv(P);
    while (g4__jt_isop(P, ".") && g4__jt_peek(P)->type == G4__JK_NAME) {
        g4__jt_adv(P);
        node->n = (size_t)(g4__jt_cur(P)->s + g4__jt_cur(P)->n - start);
        g4__jt_adv(P);
    }
    return 0;
}

static g4__jtn *g4__jt_filter(g4__jtp *P, g4__jtn *operand) {
    g4__jtn *f = g4__jt_node(P, G4__JN_FILTER);
    if (!f) return NULL;
    f->a = operand;
    if (g4__jt_dotted(P, f, "filter")) return NULL;
    if (g4__jt_isop(P, "(") && g4__jt_callargs(P, f)) return NULL;
    return f;
}

/* node(args) after the '(' is seen; NULL on an error */
static g4__jtn *g4__jt_call_node(g4__jtp *P, g4__jtn *node) {
    g4__jtn *c = g4__jt_node(P, G4__JN_CALL);
    if (!c) return NULL;
    c->a = node;
    return g4__jt_callargs(P, c) ? NULL : c;
}

static g4__jtn *g4__jt_filter_expr(g4__jtp *P, g4__jtn *node) {
    while (node) {
        if (g4__jt_isop(P, "|")) {
            g4__jt_adv(P);
            node = g4__jt_filter(P, node);
        } else if (g4__jt_isname(P, "is")) {
            g4__jtn *t = g4__jt_node(P, G4__JN_TEST);
            g4__jttok *c;
            if (!t) return NULL;
            g4__jt_adv(P);
            if (g4__jt_isname(P, "not")) { t->flag = 1; g4__jt_adv(P); }
            t->a = node;
            if (g4__jt_dotted(P, t, "test")) return NULL;
            c = g4__jt_cur(P);
            if (g4__jt_isop(P, "(")) {
                if (g4__jt_callargs(P, t)) return NULL;
            } else if ((c->type == G4__JK_NAME || c->type == G4__JK_STR || c->type == G4__JK_INT ||
                        c->type == G4__JK_FLOAT || g4__jt_isop(P, "[") || g4__jt_isop(P, "{")) &&
                       !g4__jt_isname(P, "else") && !g4__jt_isname(P, "or") && !g4__jt_isname(P, "and")) {
                g4__jtn *arg = g4__jt_primary(P);
                if (!arg || !(arg = g4__jt_postfix(P, arg))) return NULL;
                t->b = arg;
            }
            node = t;
        } else if (g4__jt_isop(P, "(")) {
            node = g4__jt_call_node(P, node);
        } else break;
    }
    return node;
}

/* [start:stop:step] or [index] after the '[' */
static g4__jtn *g4__jt_subscript(g4__jtp *P) {
    g4__jtn *s, *start = NULL;
    if (!g4__jt_isop(P, ":")) {
        if (!(start = g4__jt_expr(P))) return NULL;
        if (!g4__jt_isop(P, ":")) return start;
    }
    if (!(s = g4__jt_node(P, G4__JN_SLICE))) return NULL;
    s->a = start;
    g4__jt_adv(P); /* : */
    if (!g4__jt_isop(P, "]") && !g4__jt_isop(P, ":") && !(s->b = g4__jt_expr(P))) return NULL;
    if (g4__jt_isop(P, ":")) {
        g4__jt_adv(P);
        if (!g4__jt_isop(P, "]") && !(s->c = g4__jt_expr(P))) return NULL;
    }
    return s;
}

static g4__jtn *g4__jt_postfix(g4__jtp *P, g4__jtn *node) {
    char b[64];
    while (node) {
        if (g4__jt_isop(P, ".")) {
            g4__jtn *at;
            g4__jt_adv(P);
            if (g4__jt_cur(P)->type == G4__JK_NAME) {
                if (!(at = g4__jt_node(P, G4__JN_ATTR))) return NULL;
                at->s = g4__jt_cur(P)->s;
                at->n = g4__jt_cur(P)->n;
            } else if (g4__jt_cur(P)->type == G4__JK_INT) {
                g4__jtn *ix;
                if (!(at = g4__jt_node(P, G4__JN_ITEM)) || !(ix = g4__jt_node(P, G4__JN_INT))) return NULL;
                ix->i = g4__jt_cur(P)->i;
                at->b = ix;
            } else {
                g4__jt_pfail(P, "expected a name after '.', got %s", g4__jt_desc(P, b, sizeof b));
                return NULL;
            }
            at->a = node;
            g4__jt_adv(P);
            node = at;
        } else if (g4__jt_isop(P, "[")) {
            g4__jtn *it = g4__jt_node(P, G4__JN_ITEM);
            if (!it) return NULL;
            g4__jt_adv(P);
            it->a = node;
            if (!(it->b = g4__jt_subscript(P))) return NULL;
            if (g4__jt_isop(P, ",")) { g4__jt_pfail(P, "unsupported: a tuple as a subscript"); return NULL; }
            if (g4__jt_expect_op(P, "]")) return NULL;
            node = it;
        } else if (g4__jt_isop(P, "(")) {
            node = g4__jt_call_node(P, node);
        } else break;
    }
    return node;
}

/* A comma-separated list up to `close`, into node->a. Dicts take key: value pairs. */
static int g4__jt_items(g4__jtp *P, g4__jtn *node, const char *close, int dict) {
    g4__jtn **tail = &node->a;
    while (!g4__jt_isop(P, close)) {
        g4__jtn *v;
        if (node->a && g4__jt_expect_op(P, ",")) return -1;
        if (g4__jt_isop(P, close)) break;
        if (!(v = g4__jt_expr(P))) return -1;
        if (dict) {
            g4__jtn *pr = g4__jt_node(P, G4__JN_PAIR);
            if (!pr || g4__jt_expect_op(P, ":")) return -1;
            pr->a = v;
            if (!(pr->b = g4__jt_expr(P))) return -1;
            v = pr;
        }
        *tail = v;
        tail = &v->next;
    }
    g4__jt_adv(P);
    return 0;
}

static g4__jtn *g4__jt_primary(g4__jtp *P) {
    g4__jttok *t = g4__jt_cur(P);
    g4__jtn *n;
    char b[64];
    if (t->type == G4__JK_NAME) {
        static const char *const lit[] = {"true", "True", "false", "False", "none", "None"};
        static const int kinds[] = {G4__JN_TRUE, G4__JN_TRUE, G4__JN_FALSE, G4__JN_FALSE, G4__JN_NONE, G4__JN_NONE};
        size_t k;
        for (k = 0; k < 6; k++)
            if (g4__jt_tokis(t, G4__JK_NAME, lit[k])) break;
        if (!(n = g4__jt_node(P, k < 6 ? kinds[k] : G4__JN_NAME))) return NULL;
        n->s = t->s;
        n->n = t->n;
        g4__jt_adv(P);
        return n;
    }
    if (t->type == G4__JK_STR) { /* adjacent literals concatenate */
        size_t total = 0, j = P->i;
        char *d;
        if (!(n = g4__jt_node(P, G4__JN_STR))) return NULL;
        while (P->t[j].type == G4__JK_STR) total += P->t[j++].n;
        if (!(d = (char *)g4__jt_alloc(P->a, total + 1))) { g4__jt_pfail(P, "out of memory"); return NULL; }
        n->s = d;
        n->n = total;
        while (g4__jt_cur(P)->type == G4__JK_STR) {
            memcpy(d, g4__jt_cur(P)->s, g4__jt_cur(P)->n);
            d += g4__jt_cur(P)->n;
            g4__jt_adv(P);
        }
        *d = 0;
        return n;
    }
    if (t->type == G4__JK_INT || t->type == G4__JK_FLOAT) {
        if (!(n = g4__jt_node(P, t->type == G4__JK_INT ? G4__JN_INT : G4__JN_FLOAT))) return NULL;
        n->i = t->i;
        n->f = t->f;
        g4__jt_adv(P);
        return n;
    }
    if (g4__jt_isop(P, "(")) {
        g4__jtn *first, *tup;
        g4__jt_adv(P);
        if (g4__jt_isop(P, ")")) { g4__jt_adv(P); return g4__jt_node(P, G4__JN_TUPLE); }
        if (!(first = g4__jt_expr(P))) return NULL;
        if (g4__jt_isop(P, ")")) { g4__jt_adv(P); return first; }
        if (!(tup = g4__jt_node(P, G4__JN_TUPLE))) return NULL;
        tup->a = first;
        if (!g4__jt_isop(P, ",")) { g4__jt_pfail(P, "expected ',' or ')', got %s", g4__jt_desc(P, b, sizeof b)); return NULL; }
        g4__jt_adv(P);
        {
            g4__jtn **tail = &first->next;
            while (!g4__jt_isop(P, ")")) {
                g4__jtn *v;
                if (!(v = g4__jt_expr(P))) return NULL;
                *tail = v;
                tail = &v->next;
                if (!g4__jt_isop(P, ",")) break;
                g4__jt_adv(P);
            }
        }
        if (g4__jt_expect_op(P, ")")) return NULL;
        return tup;
    }
    if (g4__jt_isop(P, "[") || g4__jt_isop(P, "{")) {
        int dict = g4__jt_isop(P, "{");
        if (!(n = g4__jt_node(P, dict ? G4__JN_DICT : G4__JN_LIST))) return NULL;
        g4__jt_adv(P);
        if (g4__jt_items(P, n, dict ? "}" : "]", dict)) return NULL;
        return n;
    }
    g4__jt_pfail(P, "unexpected %s in an expression", g4__jt_desc(P, b, sizeof b));
    return NULL;
}

static g4__jtn *g4__jt_unary(g4__jtp *P, int with_filter) {
    g4__jtn *node;
    if (++P->nest > G4__JT_MAX_NEST) { g4__jt_pfail(P, "expression nested deeper than %d", G4__JT_MAX_NEST); return NULL; }
    if (g4__jt_isop(P, "-") || g4__jt_isop(P, "+")) {
        if (!(node = g4__jt_node(P, g4__jt_isop(P, "-") ? G4__JN_NEG : G4__JN_POS))) return NULL;
        g4__jt_adv(P);
        if (!(node->a = g4__jt_unary(P, 0))) return NULL;
    } else if (!(node = g4__jt_primary(P))) return NULL;
    node = g4__jt_postfix(P, node);
    if (node && with_filter) node = g4__jt_filter_expr(P, node);
    P->nest--;
    return node;
}

static g4__jtn *g4__jt_binop(g4__jtp *P, g4__jtn *l, int op, g4__jtn *(*next)(g4__jtp *)) {
    g4__jtn *b = g4__jt_node(P, G4__JN_BIN);
    if (!b) return NULL;
    g4__jt_adv(P);
    b->op = op;
    b->a = l;
    if (!(b->b = next(P))) return NULL;
    return b;
}

static g4__jtn *g4__jt_pow(g4__jtp *P) {
    g4__jtn *l = g4__jt_unary(P, 1);
    while (l && g4__jt_isop(P, "**")) {
        g4__jtn *b = g4__jt_node(P, G4__JN_BIN);
        if (!b) return NULL;
        g4__jt_adv(P);
        b->op = 'p';
        b->a = l;
        if (!(b->b = g4__jt_unary(P, 1))) return NULL;
        l = b;
    }
    return l;
}

/* One level of left-associative binary operators over the level `next`:
   the operator ops[k] makes the node op codes[k] */
static g4__jtn *g4__jt_binops(g4__jtp *P, g4__jtn *(*next)(g4__jtp *), const char *const *ops, const char *codes) {
    g4__jtn *l = next(P);
    size_t k;
    while (l) {
        for (k = 0; ops[k] && !g4__jt_isop(P, ops[k]); k++) {}
        if (!ops[k]) return l;
        l = g4__jt_binop(P, l, codes[k], next);
    }
    return NULL;
}

static g4__jtn *g4__jt_math2(g4__jtp *P) {
    static const char *const ops[] = {"*", "/", "//", "%", NULL};
    return g4__jt_binops(P, g4__jt_pow, ops, "*/f%");
}

static g4__jtn *g4__jt_concat(g4__jtp *P) {
    static const char *const ops[] = {"~", NULL};
    return g4__jt_binops(P, g4__jt_math2, ops, "~");
}

static g4__jtn *g4__jt_math1(g4__jtp *P) {
    static const char *const ops[] = {"+", "-", NULL};
    return g4__jt_binops(P, g4__jt_concat, ops, "+-");
}

static g4__jtn *g4__jt_compare(g4__jtp *P) {
    static const char *const ops[] = {"==", "!=", "<", ">", "<=", ">="};
    static const int codes[] = {'e', 'n', '<', '>', 'l', 'g'};
    g4__jtn *l = g4__jt_math1(P), *cmp = NULL, **tail = NULL;
    while (l) {
        int op = 0;
        size_t k;
        g4__jtn *o;
        for (k = 0; k < 6; k++)
            if (g4__jt_isop(P, ops[k])) { op = codes[k]; g4__jt_adv(P); break; }
        if (!op && g4__jt_isname(P, "in")) { op = 'i'; g4__jt_adv(P); }
        if (!op && g4__jt_isname(P, "not") && g4__jt_tokis(g4__jt_peek(P), G4__JK_NAME, "in")) {
            op = 'I';
            g4__jt_adv(P);
            g4__jt_adv(P);
        }
        if (!op) break;
        if (!cmp) {
            if (!(cmp = g4__jt_node(P, G4__JN_CMP))) return NULL;
            cmp->a = l;
            tail = &cmp->b;
        }
        if (!(o = g4__jt_node(P, G4__JN_CMPOP))) return NULL;
        o->op = op;
        if (!(o->a = g4__jt_math1(P))) return NULL;
        *tail = o;
        tail = &o->next;
    }
    return cmp ? cmp : l;
}

static g4__jtn *g4__jt_not(g4__jtp *P) {
    if (g4__jt_isname(P, "not")) {
        g4__jtn *n = g4__jt_node(P, G4__JN_NOT);
        if (!n) return NULL;
        if (++P->nest > G4__JT_MAX_NEST) { g4__jt_pfail(P, "expression nested deeper than %d", G4__JT_MAX_NEST); return NULL; }
        g4__jt_adv(P);
        if (!(n->a = g4__jt_not(P))) return NULL;
        P->nest--;
        return n;
    }
    return g4__jt_compare(P);
}

/* a WORD b WORD c, left-nested (jinja2's parse_and and parse_or) */
static g4__jtn *g4__jt_chain(g4__jtp *P, g4__jtn *(*operand)(g4__jtp *), const char *word, int kind) {
    g4__jtn *l = operand(P);
    while (l && g4__jt_isname(P, word)) {
        g4__jtn *b = g4__jt_node(P, kind);
        if (!b) return NULL;
        g4__jt_adv(P);
        b->a = l;
        if (!(b->b = operand(P))) return NULL;
        l = b;
    }
    return l;
}

static g4__jtn *g4__jt_and(g4__jtp *P) { return g4__jt_chain(P, g4__jt_not, "and", G4__JN_AND); }
static g4__jtn *g4__jt_or(g4__jtp *P) { return g4__jt_chain(P, g4__jt_and, "or", G4__JN_OR); }

/* jinja2's parse_condexpr: a if b [else c], right-nested. */
static g4__jtn *g4__jt_expr(g4__jtp *P) {
    g4__jtn *l;
    if (++P->nest > G4__JT_MAX_NEST) { g4__jt_pfail(P, "expression nested deeper than %d", G4__JT_MAX_NEST); return NULL; }
    l = g4__jt_or(P);
    while (l && g4__jt_isname(P, "if")) {
        g4__jtn *c = g4__jt_node(P, G4__JN_COND);
        if (!c) return NULL;
        g4__jt_adv(P);
        c->b = l;
        if (!(c->a = g4__jt_or(P))) return NULL;
        if (g4__jt_isname(P, "else")) {
            g4__jt_adv(P);
            if (!(c->c = g4__jt_expr(P))) return NULL;
        }
        l = c;
    }
    P->nest--;
    return l;
}

/* An expression or a bare tuple "a, b" (print statements, set values, for iterables). */
static g4__jtn *g4__jt_tuple(g4__jtp *P, int condexpr) {
    g4__jtn *first = condexpr ? g4__jt_expr(P) : g4__jt_or(P), *tup, **tail;
    if (!first || !g4__jt_isop(P, ",")) return first;
    if (!(tup = g4__jt_node(P, G4__JN_TUPLE))) return NULL;
    tup->a = first;
    tail = &first->next;
    while (g4__jt_isop(P, ",")) {
        g4__jtn *v;
        g4__jt_adv(P);
        if (g4__jt_cur(P)->type == G4__JK_VEND || g4__jt_cur(P)->type == G4__JK_BEND || g4__jt_isname(P, "if")) break;
        if (!(v = condexpr ? g4__jt_expr(P) : g4__jt_or(P))) return NULL;
        *tail = v;
        tail = &v->next;
    }
    return tup;
}

/* An assignment target: name, (a, b) / a, b, or (with_ns) name.attr. */
static g4__jtn *g4__jt_target(g4__jtp *P, int with_ns) {
    char b[64];
    g4__jtn *first = NULL, **tail = &first, *tup;
    int paren = 0, count = 0;
    if (g4__jt_isop(P, "(")) { paren = 1; g4__jt_adv(P); }
    for (;;) {
        g4__jtn *nm;
        if (g4__jt_cur(P)->type != G4__JK_NAME) {
            g4__jt_pfail(P, "expected a name to assign to, got %s", g4__jt_desc(P, b, sizeof b));
            return NULL;
        }
        if (!(nm = g4__jt_node(P, G4__JN_NAME))) return NULL;
        nm->s = g4__jt_cur(P)->s;
        nm->n = g4__jt_cur(P)->n;
        g4__jt_adv(P);
        if (with_ns && !paren && count == 0 && g4__jt_isop(P, ".")) {
            g4__jtn *at = g4__jt_node(P, G4__JN_ATTR);
            if (!at) return NULL;
            g4__jt_adv(P);
            if (g4__jt_cur(P)->type != G4__JK_NAME) {
                g4__jt_pfail(P, "expected an attribute name, got %s", g4__jt_desc(P, b, sizeof b));
                return NULL;
            }
            at->a = nm;
            at->s = g4__jt_cur(P)->s;
            at->n = g4__jt_cur(P)->n;
            g4__jt_adv(P);
            return at;
        }
        *tail = nm;
        tail = &nm->next;
        count++;
        if (!g4__jt_isop(P, ",")) break;
        g4__jt_adv(P);
    }
    if (paren && g4__jt_expect_op(P, ")")) return NULL;
    if (count == 1 && !paren) return first;
    if (!(tup = g4__jt_node(P, G4__JN_TUPLE))) return NULL;
    tup->a = first;
    return tup;
}

static g4__jtn *g4__jt_stmt(g4__jtp *P, int *is_end, const char *const *ends);

/* Statements up to one of `ends` (NULL-terminated; NULL: to the end of the
   template) into *out; the end tag's name is left current (after its '{%'). */
static int g4__jt_body(g4__jtp *P, const char *const *ends, const char *block, int block_line, g4__jtn **out) {
    g4__jtn **tail = out;
    *out = NULL;
    for (;;) {
        g4__jtn *s;
        int is_end = 0;
        if (g4__jt_cur(P)->type == G4__JK_EOF) {
            if (!ends) return 0;
            return g4__jt_pfail(P, "unexpected end of template: the '%s' block from line %d is not closed (expected '%s')",
                                block, block_line, ends[0]);
        }
        s = g4__jt_stmt(P, &is_end, ends);
        if (is_end) return 0;
        if (!s) return -1;
        *tail = s;
        tail = &s->next;
    }
}

static int g4__jt_endtag(g4__jtp *P, const char *name) {
    char b[64];
    if (!g4__jt_isname(P, name)) return g4__jt_pfail(P, "expected '%s', got %s", name, g4__jt_desc(P, b, sizeof b));
    g4__jt_adv(P);
    return g4__jt_expect_end(P, G4__JK_BEND);
}

static g4__jtn *g4__jt_if(g4__jtp *P, int line) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    g4__jtn *n = g4__jt_node(P, G4__JS_IF);
    if (!n) return NULL;
    n->line = line;
    if (!(n->a = g4__jt_tuple(P, 1)) || g4__jt_expect_end(P, G4__JK_BEND)) return NULL;
    if (g4__jt_body(P, ends, "if", line, &n->b)) return NULL;
    if (g4__jt_isname(P, "elif")) {
        int l2 = g4__jt_cur(P)->line;
        g4__jt_adv(P);
        if (!(n->c = g4__jt_if(P, l2))) return NULL;
        return n; /* the nested if consumed endif */
    }
    if (g4__jt_isname(P, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        g4__jt_adv(P);
        if (g4__jt_expect_end(P, G4__JK_BEND) || g4__jt_body(P, ends2, "if", line, &n->c)) return NULL;
    }
    return g4__jt_endtag(P, "endif") ? NULL : n;
}

static g4__jtn *g4__jt_for(g4__jtp *P, int line) {
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const ends2[] = {"endfor", NULL};
    g4__jtn *n = g4__jt_node(P, G4__JS_FOR);
    char b[64];
    if (!n) return NULL;
    n->line = line;
    if (!(n->a = g4__jt_target(P, 0))) return NULL;
    if (!g4__jt_isname(P, "in")) { g4__jt_pfail(P, "expected 'in', got %s", g4__jt_desc(P, b, sizeof b)); return NULL; }
    g4__jt_adv(P);
    if (!(n->b = g4__jt_tuple(P, 0))) return NULL;
    if (g4__jt_isname(P, "if")) {
        g4__jt_adv(P);
        if (!(n->e = g4__jt_expr(P))) return NULL;
    }
    if (g4__jt_isname(P, "recursive")) { g4__jt_pfail(P, "unsupported: recursive for loops"); return NULL; }
    if (g4__jt_expect_end(P, G4__JK_BEND)) return NULL;
    P->loops++;
    if (g4__jt_body(P, ends, "for", line, &n->c)) return NULL;
    P->loops--;
    if (g4__jt_isname(P, "else")) { /* break/continue here belong to an outer loop */
        g4__jt_adv(P);
        if (g4__jt_expect_end(P, G4__JK_BEND) || g4__jt_body(P, ends2, "for", line, &n->d)) return NULL;
    }
    return g4__jt_endtag(P, "endfor") ? NULL : n;
}

static g4__jtn *g4__jt_set(g4__jtp *P, int line) {
    static const char *const ends[] = {"endset", NULL};
    g4__jtn *n = g4__jt_node(P, G4__JS_SET), *target;
    if (!n || !(target = g4__jt_target(P, 1))) return NULL;
    n->line = line;
    n->a = target;
    if (g4__jt_isop(P, "=")) {
        g4__jt_adv(P);
        if (!(n->b = g4__jt_tuple(P, 1)) || g4__jt_expect_end(P, G4__JK_BEND)) return NULL;
        return n;
    }
    n->k = G4__JS_SETBLOCK; /* {% set x | filter %}...{% endset %} */
    {
        g4__jtn **tail = &n->c;
        while (g4__jt_isop(P, "|")) {
            g4__jtn *f;
            g4__jt_adv(P);
            if (!(f = g4__jt_filter(P, NULL))) return NULL;
            *tail = f;
            tail = &f->next;
        }
    }
    if (g4__jt_expect_end(P, G4__JK_BEND) || g4__jt_body(P, ends, "set", line, &n->b)) return NULL;
    return g4__jt_endtag(P, "endset") ? NULL : n;
}

static g4__jtn *g4__jt_macro(g4__jtp *P, int line) {
    static const char *const ends[] = {"endmacro", NULL};
    g4__jtn *n = g4__jt_node(P, G4__JS_MACRO), **tail;
    char b[64];
    int saved;
    if (!n) return NULL;
    n->line = line;
    if (g4__jt_cur(P)->type != G4__JK_NAME) { g4__jt_pfail(P, "expected a macro name, got %s", g4__jt_desc(P, b, sizeof b)); return NULL; }
    n->s = g4__jt_cur(P)->s;
    n->n = g4__jt_cur(P)->n;
    g4__jt_adv(P);
    if (g4__jt_expect_op(P, "(")) return NULL;
    tail = &n->a;
    while (!g4__jt_isop(P, ")")) {
        g4__jtn *p;
        if (n->a && g4__jt_expect_op(P, ",")) return NULL;
        if (g4__jt_isop(P, ")")) break;
        if (g4__jt_cur(P)->type != G4__JK_NAME) { g4__jt_pfail(P, "expected a parameter name, got %s", g4__jt_desc(P, b, sizeof b)); return NULL; }
        if (!(p = g4__jt_node(P, G4__JN_NAME))) return NULL;
        p->s = g4__jt_cur(P)->s;
        p->n = g4__jt_cur(P)->n;
        g4__jt_adv(P);
        if (g4__jt_isop(P, "=")) {
            g4__jt_adv(P);
            if (!(p->a = g4__jt_expr(P))) return NULL;
        }
        *tail = p;
        tail = &p->next;
    }
    g4__jt_adv(P);
    if (g4__jt_expect_end(P, G4__JK_BEND)) return NULL;
    saved = P->loops;
    P->loops = 0;
    if (g4__jt_body(P, ends, "macro", line, &n->b)) return NULL;
    P->loops = saved;
    return g4__jt_endtag(P, "endmacro") ? NULL : n;
}

/* One statement: text, {{ expr }} or a {% tag %}. *is_end: the tag is one of `ends`. */
static g4__jtn *g4__jt_stmt(g4__jtp *P, int *is_end, const char *const *ends) {
    g4__jttok *t = g4__jt_cur(P);
    g4__jtn *n;
    char b[64];
    int line = t->line;
    if (t->type == G4__JK_DATA) {
        if (!(n = g4__jt_node(P, G4__JS_TEXT))) return NULL;
        n->s = t->s;
        n->n = t->n;
        g4__jt_adv(P);
        return n;
    }
    if (t->type == G4__JK_VBEGIN) {
        g4__jt_adv(P);
        if (!(n = g4__jt_node(P, G4__JS_OUT)) || !(n->a = g4__jt_tuple(P, 1)) || g4__jt_expect_end(P, G4__JK_VEND))
            return NULL;
        return n;
    }
    if (t->type != G4__JK_BBEGIN) { g4__jt_pfail(P, "unexpected %s", g4__jt_desc(P, b, sizeof b)); return NULL; }
    g4__jt_adv(P);
    t = g4__jt_cur(P);
    if (t->type != G4__JK_NAME) { g4__jt_pfail(P, "expected a tag name after '{%%', got %s", g4__jt_desc(P, b, sizeof b)); return NULL; }
    if (ends) {
        size_t k;
        for (k = 0; ends[k]; k++)
            if (g4__jt_isname(P, ends[k])) { *is_end = 1; return NULL; }
    }
    if (++P->nest > G4__JT_MAX_NEST) { g4__jt_pfail(P, "blocks nested deeper than %d", G4__JT_MAX_NEST); return NULL; }
    g4__jt_adv(P);
    if (g4__jt_tokis(t, G4__JK_NAME, "if")) n = g4__jt_if(P, line);
    else if (g4__jt_tokis(t, G4__JK_NAME, "for")) n = g4__jt_for(P, line);
    else if (g4__jt_tokis(t, G4__JK_NAME, "set")) n = g4__jt_set(P, line);
    else if (g4__jt_tokis(t, G4__JK_NAME, "macro")) n = g4__jt_macro(P, line);
    else if (g4__jt_tokis(t, G4__JK_NAME, "break") || g4__jt_tokis(t, G4__JK_NAME, "continue")) {
        int brk = g4__jt_tokis(t, G4__JK_NAME, "break");
        if (!P->loops) { g4__jt_pfail(P, "'%s' outside a for loop", brk ? "break" : "continue"); return NULL; }
        n = g4__jt_node(P, brk ? G4__JS_BREAK : G4__JS_CONTINUE);
        if (n && g4__jt_expect_end(P, G4__JK_BEND)) return NULL;
    } else if (g4__jt_tokis(t, G4__JK_NAME, "filter")) {
        static const char *const ends2[] = {"endfilter", NULL};
        g4__jtn **tail;
        if (!(n = g4__jt_node(P, G4__JS_FILTER))) return NULL;
        tail = &n->a;
        for (;;) {
            g4__jtn *f = g4__jt_filter(P, NULL);
            if (!f) return NULL;
            *tail = f;
            tail = &f->next;
            if (!g4__jt_isop(P, "|")) break;
            g4__jt_adv(P);
        }
        if (g4__jt_expect_end(P, G4__JK_BEND) || g4__jt_body(P, ends2, "filter", line, &n->b) ||
            g4__jt_endtag(P, "endfilter"))
            return NULL;
    } else if (g4__jt_tokis(t, G4__JK_NAME, "with")) {
        static const char *const ends2[] = {"endwith", NULL};
        g4__jtn **tail;
        if (!(n = g4__jt_node(P, G4__JS_WITH))) return NULL;
        tail = &n->a;
        while (g4__jt_cur(P)->type != G4__JK_BEND) {
            g4__jtn *s = g4__jt_node(P, G4__JS_SET);
            if (!s) return NULL;
            if (n->a && g4__jt_expect_op(P, ",")) return NULL;
            if (!(s->a = g4__jt_target(P, 0)) || g4__jt_expect_op(P, "=") || !(s->b = g4__jt_expr(P))) return NULL;
            *tail = s;
            tail = &s->next;
        }
        if (g4__jt_expect_end(P, G4__JK_BEND) || g4__jt_body(P, ends2, "with", line, &n->b) ||
            g4__jt_endtag(P, "endwith"))
            return NULL;
    } else if (g4__jt_tokis(t, G4__JK_NAME, "generation")) { /* transformers' AssistantTracker: renders its body */
        static const char *const ends2[] = {"endgeneration", NULL};
        if (!(n = g4__jt_node(P, G4__JS_GEN))) return NULL;
        if (g4__jt_expect_end(P, G4__JK_BEND) || g4__jt_body(P, ends2, "generation", line, &n->b) ||
            g4__jt_endtag(P, "endgeneration"))
            return NULL;
    } else {
        static const char *const unsup[] = {"call", "include", "import", "from", "extends", "block", "do",
                                            "autoescape", "trans", "pluralize", "debug", NULL};
        size_t k;
        P->i--; /* point the message at the tag name */
        for (k = 0; unsup[k]; k++)
            if (g4__jt_tokis(t, G4__JK_NAME, unsup[k])) break;
        if (unsup[k]) g4__jt_pfail(P, "unsupported tag '%s'", unsup[k]);
        else g4__jt_pfail(P, "unknown tag '%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s);
        return NULL;
    }
    P->nest--;
    return n;
}

/* ---- values: Python's None, bool, int, float, str, list, tuple, dict, plus
   jinja2's Undefined, namespace, macros, loop and bound methods */

enum { G4__JV_UNDEF, G4__JV_NONE, G4__JV_BOOL, G4__JV_INT, G4__JV_FLOAT, G4__JV_STR, G4__JV_LIST, G4__JV_DICT,
       G4__JV_NS, G4__JV_MACRO, G4__JV_FUNC, G4__JV_LOOP, G4__JV_METHOD };

typedef struct g4__jtv {
    int t, tuple;                /* tuple: a list written (a, b) */
    int64_t i;                   /* bool, int; a builtin function's id */
    double f;
    const char *s;               /* str (NUL-terminated); Undefined: why; method: its name */
    size_t n;
    void *p, *q;                 /* list/dict/ns: g4__jtcoll; macro: node, q its scope; loop; method: receiver */
} g4__jtv;

typedef struct { size_t n, cap; g4__jtv *k, *v; } g4__jtcoll; /* list: v; dict and namespace: k and v */

typedef struct g4__jtscope {
    struct g4__jtscope *parent;
    size_t n, cap;
    const char **nm;
    size_t *nl;
    g4__jtv *v;
} g4__jtscope;

typedef struct {
    g4__jtcoll *items;
    size_t i;
    const g4__jtn *node;
} g4__jtloop;

typedef struct {
    g4__jtarena a;
    const char *name;
    char *err;
    int failed;
    g4__jtscope *top;
    char *out;                   /* the current output (a macro or a set block captures its own) */
    size_t out_n, out_cap, max_output;
    long steps, max_steps;
    int depth, max_depth;
} g4__jtr;

enum { G4__JF_RANGE = 1, G4__JF_NAMESPACE, G4__JF_DICT, G4__JF_RAISE, G4__JF_STRFTIME, G4__JF_UNSUPPORTED };

static int g4__jt_fail(g4__jtr *R, int line, const char *fmt, ...) G4__PRINTF(3, 4);
static int g4__jt_fail(g4__jtr *R, int line, const char *fmt, ...) {
    char msg[G4_ERROR_MAX];
    va_list ap;
    if (R->failed) return -1;
    R->failed = 1;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g4__seterr(R->err, "%s: line %d: %s", R->name, line, msg);
    return -1;
}

static void *g4__jt_ralloc(g4__jtr *R, int line, size_t n) {
    void *p = g4__jt_alloc(&R->a, n);
    if (!p) g4__jt_fail(R, line, "out of memory: the render needs more than max_memory (%lu bytes)", (unsigned long)R->a.limit);
    return p;
}

static g4__jtv g4__jt_v(int t) {
    g4__jtv v;
    memset(&v, 0, sizeof v);
    v.t = t;
    return v;
}
static g4__jtv g4__jt_vbool(int b) { g4__jtv v = g4__jt_v(G4__JV_BOOL); v.i = b != 0; return v; }
static g4__jtv g4__jt_vint(int64_t i) { g4__jtv v = g4__jt_v(G4__JV_INT); v.i = i; return v; }
static g4__jtv g4__jt_vfloat(double f) { g4__jtv v = g4__jt_v(G4__JV_FLOAT); v.f = f; return v; }
static g4__jtv g4__jt_vstr(const char *s, size_t n) { g4__jtv v = g4__jt_v(G4__JV_STR); v.s = s; v.n = n; return v; }
static g4__jtv g4__jt_vundef(const char *why) { g4__jtv v = g4__jt_v(G4__JV_UNDEF); v.s = why; return v; }

/* A fresh string value of n bytes (uninitialized) in the render arena. */
static char *g4__jt_newstr(g4__jtr *R, int line, size_t n, g4__jtv *out) {
    char *d = (char *)g4__jt_ralloc(R, line, n + 1);
    if (!d) return NULL;
    d[n] = 0;
    *out = g4__jt_vstr(d, n);
    return d;
}

static g4__jtcoll *g4__jt_newcoll(g4__jtr *R, int line, size_t cap, int keys) {
    g4__jtcoll *c = (g4__jtcoll *)g4__jt_ralloc(R, line, sizeof *c);
    if (!c) return NULL;
    c->n = 0;
    c->cap = cap ? cap : 1;
    c->v = (g4__jtv *)g4__jt_ralloc(R, line, c->cap * sizeof(g4__jtv));
    c->k = keys ? (g4__jtv *)g4__jt_ralloc(R, line, c->cap * sizeof(g4__jtv)) : NULL;
    if (!c->v || (keys && !c->k)) return NULL;
    return c;
}

static g4__jtv g4__jt_vlist(g4__jtcoll *c, int tuple) { g4__jtv v = g4__jt_v(G4__JV_LIST); v.p = c; v.tuple = tuple; return v; }
static g4__jtv g4__jt_vdict(g4__jtcoll *c) { g4__jtv v = g4__jt_v(G4__JV_DICT); v.p = c; return v; }

static int g4__jt_push(g4__jtr *R, int line, g4__jtcoll *c, const g4__jtv *k, const g4__jtv *v) {
    if (c->n == c->cap) {
        size_t nc = c->cap * 2;
        g4__jtv *nv = (g4__jtv *)g4__jt_ralloc(R, line, nc * sizeof *nv), *nk = NULL;
        if (!nv) return -1;
        memcpy(nv, c->v, c->n * sizeof *nv);
        if (c->k) {
            if (!(nk = (g4__jtv *)g4__jt_ralloc(R, line, nc * sizeof *nk))) return -1;
            memcpy(nk, c->k, c->n * sizeof *nk);
            c->k = nk;
        }
        c->v = nv;
        c->cap = nc;
    }
    if (c->k) c->k[c->n] = *k;
    c->v[c->n++] = *v;
    return 0;
}

static const char *g4__jt_typename(const g4__jtv *v) {
    switch (v->t) {
    case G4__JV_UNDEF: return "Undefined";
    case G4__JV_NONE: return "NoneType";
    case G4__JV_BOOL: return "bool";
    case G4__JV_INT: return "int";
    case G4__JV_FLOAT: return "float";
    case G4__JV_STR: return "str";
    case G4__JV_LIST: return v->tuple ? "tuple" : "list";
    case G4__JV_DICT: return "dict";
    case G4__JV_NS: return "Namespace";
    case G4__JV_MACRO: return "Macro";
    case G4__JV_LOOP: return "LoopContext";
    default: return "builtin_function_or_method";
    }
}

static int g4__jt_truthy(const g4__jtv *v) {
    switch (v->t) {
    case G4__JV_UNDEF: case G4__JV_NONE: return 0;
    case G4__JV_BOOL: case G4__JV_INT: return v->i != 0;
    case G4__JV_FLOAT: return v->f != 0.0;
    case G4__JV_STR: return v->n != 0;
    case G4__JV_LIST: case G4__JV_DICT: return ((const g4__jtcoll *)v->p)->n != 0;
    default: return 1;
    }
}

static int g4__jt_isnum(const g4__jtv *v) { return v->t == G4__JV_BOOL || v->t == G4__JV_INT || v->t == G4__JV_FLOAT; }
static double g4__jt_num(const g4__jtv *v) { return v->t == G4__JV_FLOAT ? v->f : (double)v->i; }
static int g4__jt_streq(const g4__jtv *v, const char *s) {
    return v->t == G4__JV_STR && v->n == strlen(s) && memcmp(v->s, s, v->n) == 0;
}

/* Code points in s[0..n) (a stray byte counts as one). */
static size_t g4__jt_cplen(const char *s, size_t n) {
    size_t i, c = 0;
    for (i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}
/* Byte length of the character starting at s[0]. */
static size_t g4__jt_cpbytes(const char *s, size_t n) {
    size_t k = 1;
    while (k < n && ((unsigned char)s[k] & 0xC0) == 0x80) k++;
    return k;
}

/* Python's repr(float) (and str(float)): the shortest digits that read back
   to the same double; positional for exponents in [-4, 16), else d.ddde+XX. */
static void g4__jt_fmt_float(double x, char *buf, size_t cap) {
    char tmp[40], dig[24];
    int prec, nd = 0, e = 0, k, neg;
    const char *p;
    if (x != x) { snprintf(buf, cap, "nan"); return; }
    if (x == HUGE_VAL || x == -HUGE_VAL) { snprintf(buf, cap, x < 0 ? "-inf" : "inf"); return; }
    neg = x < 0 || (x == 0 && 1.0 / x < 0);
    if (x == 0) { snprintf(buf, cap, neg ? "-0.0" : "0.0"); return; }
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    for (p = tmp; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') dig[nd++] = *p;
    if (*p == 'e') e = atoi(p + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    dig[nd] = 0;
    k = 0;
    if (neg) buf[k++] = '-';
    if (e >= -4 && e < 16) {
        int i;
        if (e < 0) {
            buf[k++] = '0';
            buf[k++] = '.';
            for (i = 0; i < -e - 1; i++) buf[k++] = '0';
            for (i = 0; i < nd; i++) buf[k++] = dig[i];
        } else {
            for (i = 0; i <= e; i++) buf[k++] = i < nd ? dig[i] : '0';
            buf[k++] = '.';
            if (nd > e + 1) for (i = e + 1; i < nd; i++) buf[k++] = dig[i];
            else buf[k++] = '0';
        }
        buf[k] = 0;
    } else {
        int i;
        buf[k++] = dig[0];
        if (nd > 1) {
            buf[k++] = '.';
            for (i = 1; i < nd; i++) buf[k++] = dig[i];
        }
        snprintf(buf + k, cap - (size_t)k, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

/* ---- a growing string in the render arena */
typedef struct { g4__jtr *R; int line; char *p; size_t n, cap; } g4__jtsb;

static int g4__jt_sb_add(g4__jtsb *b, const char *s, size_t n) {
    if (b->R->failed) return -1;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *np;
        if (b->n + n > b->R->max_output)
            return g4__jt_fail(b->R, b->line, "output longer than max_output (%lu bytes)", (unsigned long)b->R->max_output);
        if (!(np = (char *)g4__jt_ralloc(b->R, b->line, nc))) return -1;
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
static int g4__jt_sb_str(g4__jtsb *b, const char *s) { return g4__jt_sb_add(b, s, strlen(s)); }
static g4__jtv g4__jt_sb_val(g4__jtsb *b) { return b->p ? g4__jt_vstr(b->p, b->n) : g4__jt_vstr("", 0); }

static unsigned g4__jt_cp_at(const char *s, size_t n, size_t *len);

/* Python's repr(str): single quotes unless the text has ' and no ". */
static int g4__jt_repr_str(g4__jtsb *b, const char *s, size_t n) {
    char q = (memchr(s, '\'', n) && !memchr(s, '"', n)) ? '"' : '\'';
    size_t i = 0;
    char esc[16];
    if (g4__jt_sb_add(b, &q, 1)) return -1;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = g4__jt_cpbytes(s + i, n - i);
        const char *e = NULL;
        if (c == '\\') e = "\\\\";
        else if (c == (unsigned char)q) e = q == '\'' ? "\\'" : "\\\"";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (c < 0x20 || c == 0x7f) { snprintf(esc, sizeof esc, "\\x%02x", c); e = esc; }
        else if (k == 2 && c == 0xC2 && ((unsigned char)s[i + 1] <= 0xA0 || (unsigned char)s[i + 1] == 0xAD)) {
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned char)s[i + 1]); /* C1 controls, NBSP, soft hyphen */
            e = esc;
        } else if (k >= 3) { /* what Python's repr escapes: spaces, format characters, private use */
            size_t kk;
            unsigned cp = g4__jt_cp_at(s + i, n - i, &kk);
            int hide = g4__jt_space(s + i, k) == k || (cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD ||
                       cp == 0x70F || cp == 0x180E || (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x202A && cp <= 0x202E) ||
                       (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) || cp == 0xFEFF ||
                       (cp >= 0xFFF9 && cp <= 0xFFFB) || cp == 0xFFFE || cp == 0xFFFF || (cp >= 0xE000 && cp <= 0xF8FF) ||
                       (cp >= 0xE0000 && cp <= 0xE007F) || (cp >= 0xF0000 && cp <= 0x10FFFF);
            if (hide && !(cp & 0x80000000u)) {
                snprintf(esc, sizeof esc, cp > 0xFFFF ? "\\U%08x" : "\\u%04x", cp);
                e = esc;
            }
        }
        if (e ? g4__jt_sb_str(b, e) : g4__jt_sb_add(b, s + i, k)) return -1;
        i += k;
    }
    return g4__jt_sb_add(b, &q, 1);
}

static int g4__jt_write(g4__jtsb *b, const g4__jtv *v, int repr, int depth);

static int g4__jt_write_coll(g4__jtsb *b, const g4__jtv *v, int depth) {
    const g4__jtcoll *c = (const g4__jtcoll *)v->p;
    size_t i;
    int dict = v->t != G4__JV_LIST;
    if (depth > 64) return g4__jt_fail(b->R, b->line, "value nested too deeply to print");
    if (g4__jt_sb_str(b, dict ? "{" : v->tuple ? "(" : "[")) return -1;
    for (i = 0; i < c->n; i++) {
        if (i && g4__jt_sb_str(b, ", ")) return -1;
        if (dict && (g4__jt_write(b, &c->k[i], 1, depth + 1) || g4__jt_sb_str(b, ": "))) return -1;
        if (g4__jt_write(b, &c->v[i], 1, depth + 1)) return -1;
    }
    if (v->tuple && c->n == 1 && g4__jt_sb_str(b, ",")) return -1;
    return g4__jt_sb_str(b, dict ? "}" : v->tuple ? ")" : "]");
}

/* str(v), or repr(v) for the items of a list or dict. */
static int g4__jt_write(g4__jtsb *b, const g4__jtv *v, int repr, int depth) {
    char num[40];
    switch (v->t) {
    case G4__JV_UNDEF: return 0;
    case G4__JV_NONE: return g4__jt_sb_str(b, "None");
    case G4__JV_BOOL: return g4__jt_sb_str(b, v->i ? "True" : "False");
    case G4__JV_INT: snprintf(num, sizeof num, "%lld", (long long)v->i); return g4__jt_sb_str(b, num);
    case G4__JV_FLOAT: g4__jt_fmt_float(v->f, num, sizeof num); return g4__jt_sb_str(b, num);
    case G4__JV_STR: return repr ? g4__jt_repr_str(b, v->s, v->n) : g4__jt_sb_add(b, v->s, v->n);
    case G4__JV_LIST: case G4__JV_DICT: return g4__jt_write_coll(b, v, depth);
    case G4__JV_NS: {
        g4__jtv d = *v;
        d.t = G4__JV_DICT;
        return g4__jt_sb_str(b, "<Namespace ") || g4__jt_write_coll(b, &d, depth) || g4__jt_sb_str(b, ">");
    }
    case G4__JV_MACRO: {
        const g4__jtn *m = (const g4__jtn *)v->p;
        return g4__jt_sb_str(b, "<Macro '") || g4__jt_sb_add(b, m->s, m->n) || g4__jt_sb_str(b, "'>");
    }
    case G4__JV_LOOP: return g4__jt_sb_str(b, "<LoopContext>");
    default: return g4__jt_sb_str(b, "<built-in function>");
    }
}

/* Python's str(v) as a string value (strings themselves are not copied). */
static int g4__jt_tostr(g4__jtr *R, int line, const g4__jtv *v, g4__jtv *out) {
    g4__jtsb b;
    if (v->t == G4__JV_STR) { *out = *v; return 0; }
    memset(&b, 0, sizeof b);
    b.R = R;
    b.line = line;
    if (g4__jt_write(&b, v, 0, 0)) return -1;
    *out = g4__jt_sb_val(&b);
    return 0;
}

/* Python ==. */
static int g4__jt_eq(const g4__jtv *a, const g4__jtv *b) {
    if (g4__jt_isnum(a) && g4__jt_isnum(b)) {
        if (a->t != G4__JV_FLOAT && b->t != G4__JV_FLOAT) return a->i == b->i;
        return g4__jt_num(a) == g4__jt_num(b);
    }
    if (a->t != b->t) return 0;
    switch (a->t) {
    case G4__JV_UNDEF: case G4__JV_NONE: return 1;
    case G4__JV_STR: return a->n == b->n && memcmp(a->s, b->s, a->n) == 0;
    case G4__JV_LIST: {
        const g4__jtcoll *x = (const g4__jtcoll *)a->p, *y = (const g4__jtcoll *)b->p;
        size_t i;
        if (a->tuple != b->tuple || x->n != y->n) return 0;
        for (i = 0; i < x->n; i++)
            if (!g4__jt_eq(&x->v[i], &y->v[i])) return 0;
        return 1;
    }
    case G4__JV_DICT: {
        const g4__jtcoll *x = (const g4__jtcoll *)a->p, *y = (const g4__jtcoll *)b->p;
        size_t i, j;
        if (x->n != y->n) return 0;
        for (i = 0; i < x->n; i++) {
            for (j = 0; j < y->n; j++)
                if (g4__jt_eq(&x->k[i], &y->k[j])) break;
            if (j == y->n || !g4__jt_eq(&x->v[i], &y->v[j])) return 0;
        }
        return 1;
    }
    default: return a->p == b->p && a->i == b->i;
    }
}

/* Python's ordering: *res < 0, 0, > 0; an error for types that do not order. */
static int g4__jt_cmp(g4__jtr *R, int line, const g4__jtv *a, const g4__jtv *b, const char *op, int *res) {
    if (g4__jt_isnum(a) && g4__jt_isnum(b)) {
        if (a->t != G4__JV_FLOAT && b->t != G4__JV_FLOAT) *res = a->i < b->i ? -1 : a->i > b->i;
        else {
            double x = g4__jt_num(a), y = g4__jt_num(b);
            *res = x < y ? -1 : x > y ? 1 : (x == y ? 0 : 2); /* 2: unordered (nan): every op false */
        }
        return 0;
    }
    if (a->t == G4__JV_STR && b->t == G4__JV_STR) {
        size_t m = a->n < b->n ? a->n : b->n;
        int c = memcmp(a->s, b->s, m);
        *res = c ? (c < 0 ? -1 : 1) : (a->n < b->n ? -1 : a->n > b->n);
        return 0;
    }
    if (a->t == G4__JV_LIST && b->t == G4__JV_LIST && a->tuple == b->tuple) {
        const g4__jtcoll *x = (const g4__jtcoll *)a->p, *y = (const g4__jtcoll *)b->p;
        size_t i;
        for (i = 0; i < x->n && i < y->n; i++) {
            if (g4__jt_eq(&x->v[i], &y->v[i])) continue;
            return g4__jt_cmp(R, line, &x->v[i], &y->v[i], op, res);
        }
        *res = x->n < y->n ? -1 : x->n > y->n;
        return 0;
    }
    if (a->t == G4__JV_UNDEF || b->t == G4__JV_UNDEF)
        return g4__jt_fail(R, line, "%s", a->t == G4__JV_UNDEF ? a->s : b->s);
    return g4__jt_fail(R, line, "'%s' not supported between instances of '%s' and '%s'", op, g4__jt_typename(a),
                       g4__jt_typename(b));
}

/* The items of an iterable, as Python's list(v): str -> characters, dict -> keys. */
static int g4__jt_tolist(g4__jtr *R, int line, const g4__jtv *v, g4__jtcoll **out) {
    g4__jtcoll *c;
    if (v->t == G4__JV_LIST) { *out = (g4__jtcoll *)v->p; return 0; }
    if (v->t == G4__JV_UNDEF) return (*out = g4__jt_newcoll(R, line, 1, 0)) ? 0 : -1;
    if (v->t == G4__JV_DICT || v->t == G4__JV_NS) {
        const g4__jtcoll *d = (const g4__jtcoll *)v->p;
        size_t i;
        if (!(c = g4__jt_newcoll(R, line, d->n, 0))) return -1;
        for (i = 0; i < d->n; i++) c->v[i] = d->k[i];
        c->n = d->n;
        *out = c;
        return 0;
    }
    if (v->t == G4__JV_STR) {
        size_t i = 0;
        if (!(c = g4__jt_newcoll(R, line, v->n, 0))) return -1;
        while (i < v->n) {
            size_t k = g4__jt_cpbytes(v->s + i, v->n - i);
            c->v[c->n++] = g4__jt_vstr(v->s + i, k);
            i += k;
        }
        *out = c;
        return 0;
    }
    return g4__jt_fail(R, line, "'%s' object is not iterable", g4__jt_typename(v));
}

static int g4__jt_len(g4__jtr *R, int line, const g4__jtv *v, int64_t *n) {
    switch (v->t) {
    case G4__JV_UNDEF: *n = 0; return 0;
    case G4__JV_STR: *n = (int64_t)g4__jt_cplen(v->s, v->n); return 0;
    case G4__JV_LIST: case G4__JV_DICT: case G4__JV_NS: *n = (int64_t)((const g4__jtcoll *)v->p)->n; return 0;
    default: return g4__jt_fail(R, line, "object of type '%s' has no len()", g4__jt_typename(v));
    }
}

/* Dict member by key (the last of equal keys cannot occur: dicts are built unique). */
static const g4__jtv *g4__jt_dget(const g4__jtcoll *d, const g4__jtv *key) {
    size_t i;
    for (i = 0; i < d->n; i++)
        if (g4__jt_eq(&d->k[i], key)) return &d->v[i];
    return NULL;
}

static int g4__jt_dset(g4__jtr *R, int line, g4__jtcoll *d, const g4__jtv *key, const g4__jtv *val) {
    size_t i;
    for (i = 0; i < d->n; i++)
        if (g4__jt_eq(&d->k[i], key)) { d->v[i] = *val; return 0; }
    return g4__jt_push(R, line, d, key, val);
}

/* ---- scopes */

static g4__jtscope *g4__jt_newscope(g4__jtr *R, int line, g4__jtscope *parent) {
    g4__jtscope *s = (g4__jtscope *)g4__jt_ralloc(R, line, sizeof *s);
    if (s) memset(s, 0, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

static int g4__jt_assign(g4__jtr *R, int line, g4__jtscope *s, const char *nm, size_t nl, const g4__jtv *v) {
    size_t i;
    for (i = 0; i < s->n; i++)
        if (s->nl[i] == nl && memcmp(s->nm[i], nm, nl) == 0) { s->v[i] = *v; return 0; }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        const char **nnm = (const char **)g4__jt_ralloc(R, line, nc * sizeof *nnm);
        size_t *nnl = (size_t *)g4__jt_ralloc(R, line, nc * sizeof *nnl);
        g4__jtv *nv = (g4__jtv *)g4__jt_ralloc(R, line, nc * sizeof *nv);
        if (!nnm || !nnl || !nv) return -1;
        if (s->n) {
            memcpy((void *)nnm, (const void *)s->nm, s->n * sizeof *nnm);
            memcpy(nnl, s->nl, s->n * sizeof *nnl);
            memcpy(nv, s->v, s->n * sizeof *nv);
        }
        s->nm = nnm;
        s->nl = nnl;
        s->v = nv;
        s->cap = nc;
    }
    s->nm[s->n] = nm;
    s->nl[s->n] = nl;
    s->v[s->n++] = *v;
    return 0;
}

static const g4__jtv *g4__jt_lookup(const g4__jtscope *s, const char *nm, size_t nl) {
    for (; s; s = s->parent) {
        size_t i;
        for (i = 0; i < s->n; i++)
            if (s->nl[i] == nl && memcmp(s->nm[i], nm, nl) == 0) return &s->v[i];
    }
    return NULL;
}

/* An Undefined that remembers why ("'x' is undefined", "'dict object' has no attribute 'y'"). */
static int g4__jt_undef_fmt(g4__jtr *R, int line, g4__jtv *out, const char *fmt, ...) G4__PRINTF(4, 5);
static int g4__jt_undef_fmt(g4__jtr *R, int line, g4__jtv *out, const char *fmt, ...) {
    char msg[256];
    char *d;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!(d = (char *)g4__jt_ralloc(R, line, strlen(msg) + 1))) return -1;
    memcpy(d, msg, strlen(msg) + 1);
    *out = g4__jt_vundef(d);
    return 0;
}

/* ---- evaluation */

#define G4__JT_MAXARGS 8
typedef struct {
    int n, nk;
    unsigned used;               /* keyword arguments read (bit i) */
    g4__jtv v[G4__JT_MAXARGS];
    const char *kn[G4__JT_MAXARGS];
    size_t kl[G4__JT_MAXARGS];
    g4__jtv kv[G4__JT_MAXARGS];
} g4__jtargs;

static int g4__jt_eval(g4__jtr *R, const g4__jtn *n, g4__jtscope *sc, g4__jtv *out);
static int g4__jt_exec(g4__jtr *R, const g4__jtn *n, g4__jtscope *sc);

static int g4__jt_evalargs(g4__jtr *R, const g4__jtn *pos, const g4__jtn *kw, g4__jtscope *sc, g4__jtargs *A, int line) {
    A->n = A->nk = 0;
    A->used = 0;
    for (; pos; pos = pos->next) {
        if (A->n == G4__JT_MAXARGS) return g4__jt_fail(R, line, "more than %d arguments in a call", G4__JT_MAXARGS);
        if (g4__jt_eval(R, pos, sc, &A->v[A->n++])) return -1;
    }
    for (; kw; kw = kw->next) {
        if (A->nk == G4__JT_MAXARGS) return g4__jt_fail(R, line, "more than %d keyword arguments in a call", G4__JT_MAXARGS);
        A->kn[A->nk] = kw->s;
        A->kl[A->nk] = kw->n;
        if (g4__jt_eval(R, kw->a, sc, &A->kv[A->nk++])) return -1;
    }
    return 0;
}

/* Argument `pos` (positional) or `name` (keyword), NULL if not given. */
static const g4__jtv *g4__jt_arg(g4__jtargs *A, int pos, const char *name) {
    int i;
    if (pos >= 0 && pos < A->n) return &A->v[pos];
    for (i = 0; name && i < A->nk; i++)
        if (A->kl[i] == strlen(name) && memcmp(A->kn[i], name, A->kl[i]) == 0) { A->used |= 1u << i; return &A->kv[i]; }
    return NULL;
}

/* After reading the arguments: any positional beyond maxpos or keyword not read is an error. */
static int g4__jt_argcheck(g4__jtr *R, int line, g4__jtargs *A, int maxpos, const char *kind, const char *name, size_t nl) {
    int i;
    if (A->n > maxpos)
        return g4__jt_fail(R, line, "%s '%.*s' takes at most %d positional argument(s), %d given", kind, (int)nl, name,
                           maxpos, A->n);
    for (i = 0; i < A->nk; i++)
        if (!(A->used & (1u << i)))
            return g4__jt_fail(R, line, "%s '%.*s' got an unexpected keyword argument '%.*s'", kind, (int)nl, name,
                               (int)A->kl[i], A->kn[i]);
    return 0;
}

static int g4__jt_need_str(g4__jtr *R, int line, const g4__jtv *v, const char *what) {
    if (v->t == G4__JV_STR) return 0;
    return g4__jt_fail(R, line, "%s must be a string, not '%s'", what, g4__jt_typename(v));
}

static int g4__jt_need_int(g4__jtr *R, int line, const g4__jtv *v, const char *what) {
    if (v->t == G4__JV_INT || v->t == G4__JV_BOOL) return 0;
    return g4__jt_fail(R, line, "%s must be an integer, not '%s'", what, g4__jt_typename(v));
}

static int g4__jt_undef_err(g4__jtr *R, int line, const g4__jtv *v) { return g4__jt_fail(R, line, "%s", v->s); }

static const char *g4__jt_objrepr(const g4__jtv *v) {
    switch (v->t) {
    case G4__JV_NONE: return "None";
    case G4__JV_DICT: return "dict object";
    case G4__JV_LIST: return v->tuple ? "tuple object" : "list object";
    case G4__JV_STR: return "str object";
    case G4__JV_INT: return "int object";
    case G4__JV_FLOAT: return "float object";
    case G4__JV_BOOL: return "bool object";
    case G4__JV_NS: return "jinja2.utils.Namespace object";
    default: return "object";
    }
}

static int g4__jt_namein(const char *nm, size_t nl, const char *const *list) {
    size_t k;
    for (k = 0; list[k]; k++)
        if (strlen(list[k]) == nl && memcmp(list[k], nm, nl) == 0) return 1;
    return 0;
}

static const char *const g4__jt_str_methods[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format", "format_map",
    "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric",
    "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans", "partition",
    "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split",
    "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill", NULL};
static const char *const g4__jt_dict_methods[] = {"clear", "copy", "fromkeys", "get", "items", "keys", "pop",
                                                  "popitem", "setdefault", "update", "values", NULL};
static const char *const g4__jt_list_methods[] = {"append", "clear", "copy", "count", "extend", "index", "insert",
                                                  "pop", "remove", "reverse", "sort", NULL};

static int g4__jt_method(g4__jtr *R, int line, const g4__jtv *recv, const char *nm, size_t nl, g4__jtv *out) {
    g4__jtv *r = (g4__jtv *)g4__jt_ralloc(R, line, sizeof *r);
    if (!r) return -1;
    *r = *recv;
    *out = g4__jt_v(G4__JV_METHOD);
    out->p = r;
    out->s = nm;
    out->n = nl;
    return 0;
}

/* obj.name, as jinja2's sandboxed getattr: an attribute (a method) first, then obj['name']. */
static int g4__jt_getattr(g4__jtr *R, int line, const g4__jtv *obj, const char *nm, size_t nl, g4__jtv *out) {
    if (obj->t == G4__JV_UNDEF) return g4__jt_undef_err(R, line, obj);
    if (obj->t == G4__JV_DICT || obj->t == G4__JV_NS) {
        const g4__jtcoll *d = (const g4__jtcoll *)obj->p;
        size_t i;
        if (obj->t == G4__JV_DICT && g4__jt_namein(nm, nl, g4__jt_dict_methods)) return g4__jt_method(R, line, obj, nm, nl, out);
        for (i = 0; i < d->n; i++)
            if (d->k[i].t == G4__JV_STR && d->k[i].n == nl && memcmp(d->k[i].s, nm, nl) == 0) { *out = d->v[i]; return 0; }
    } else if (obj->t == G4__JV_STR && g4__jt_namein(nm, nl, g4__jt_str_methods)) {
        return g4__jt_method(R, line, obj, nm, nl, out);
    } else if (obj->t == G4__JV_LIST && g4__jt_namein(nm, nl, g4__jt_list_methods)) {
        return g4__jt_method(R, line, obj, nm, nl, out);
    } else if (obj->t == G4__JV_LOOP) {
        const g4__jtloop *L = (const g4__jtloop *)obj->p;
        int64_t i = (int64_t)L->i, n = (int64_t)L->items->n;
        static const char *const names[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                                            "depth", "depth0", "previtem", "nextitem", "cycle", NULL};
        int k;
        for (k = 0; names[k]; k++)
            if (strlen(names[k]) == nl && memcmp(names[k], nm, nl) == 0) break;
        switch (k) {
        case 0: *out = g4__jt_vint(i + 1); return 0;
        case 1: *out = g4__jt_vint(i); return 0;
        case 2: *out = g4__jt_vint(n - i); return 0;
        case 3: *out = g4__jt_vint(n - i - 1); return 0;
        case 4: *out = g4__jt_vbool(i == 0); return 0;
        case 5: *out = g4__jt_vbool(i == n - 1); return 0;
        case 6: *out = g4__jt_vint(n); return 0;
        case 7: *out = g4__jt_vint(1); return 0;
        case 8: *out = g4__jt_vint(0); return 0;
        case 9: *out = i > 0 ? L->items->v[i - 1] : g4__jt_vundef("there is no previous item"); return 0;
        case 10: *out = i + 1 < n ? L->items->v[i + 1] : g4__jt_vundef("there is no next item"); return 0;
        case 11: return g4__jt_method(R, line, obj, nm, nl, out);
        default: break;
        }
    }
    return g4__jt_undef_fmt(R, line, out, "'%s' has no attribute '%.*s'", g4__jt_objrepr(obj), (int)(nl > 100 ? 100 : nl), nm);
}

/* Python slice indices for a sequence of length n (slice.indices). */
static int g4__jt_slice_idx(g4__jtr *R, int line, const g4__jtv *a, const g4__jtv *b, const g4__jtv *c, int64_t n,
                            int64_t *start, int64_t *stop, int64_t *step) {
    int64_t st = 1;
    if (c && c->t != G4__JV_NONE) {
        if (g4__jt_need_int(R, line, c, "a slice step")) return -1;
        if ((st = c->i) == 0) return g4__jt_fail(R, line, "slice step cannot be zero");
    }
    *step = st;
    if (!a || a->t == G4__JV_NONE) *start = st < 0 ? n - 1 : 0;
    else {
        if (g4__jt_need_int(R, line, a, "a slice index")) return -1;
        *start = a->i < 0 ? a->i + n : a->i;
        if (*start < 0) *start = st < 0 ? -1 : 0;
        if (*start >= n) *start = st < 0 ? n - 1 : n;
    }
    if (!b || b->t == G4__JV_NONE) *stop = st < 0 ? -1 : n;
    else {
        if (g4__jt_need_int(R, line, b, "a slice index")) return -1;
        *stop = b->i < 0 ? b->i + n : b->i;
        if (*stop < 0) *stop = st < 0 ? -1 : 0;
        if (*stop >= n) *stop = st < 0 ? n - 1 : n;
    }
    return 0;
}

static int g4__jt_slice(g4__jtr *R, int line, const g4__jtv *obj, const g4__jtv *a, const g4__jtv *b, const g4__jtv *c,
                        g4__jtv *out) {
    int64_t start = 0, stop = 0, step = 1, i;
    g4__jtcoll *src, *dst;
    if (obj->t == G4__JV_UNDEF) return g4__jt_undef_err(R, line, obj);
    if (obj->t != G4__JV_LIST && obj->t != G4__JV_STR)
        return g4__jt_fail(R, line, "'%s' object is not subscriptable with a slice", g4__jt_typename(obj));
    if (g4__jt_tolist(R, line, obj, &src)) return -1;
    if (g4__jt_slice_idx(R, line, a, b, c, (int64_t)src->n, &start, &stop, &step)) return -1;
    if (!(dst = g4__jt_newcoll(R, line, src->n, 0))) return -1;
    for (i = start; step > 0 ? i < stop : i > stop; i += step) dst->v[dst->n++] = src->v[i];
    if (obj->t == G4__JV_STR) {
        size_t total = 0, k;
        char *d;
        for (k = 0; k < dst->n; k++) total += dst->v[k].n;
        if (!(d = g4__jt_newstr(R, line, total, out))) return -1;
        for (k = 0; k < dst->n; k++) { memcpy(d, dst->v[k].s, dst->v[k].n); d += dst->v[k].n; }
        return 0;
    }
    *out = g4__jt_vlist(dst, obj->tuple);
    return 0;
}

/* obj[key], as jinja2's getitem: the item first, then an attribute named key. */
static int g4__jt_getitem(g4__jtr *R, int line, const g4__jtv *obj, const g4__jtv *key, g4__jtv *out) {
    if (obj->t == G4__JV_UNDEF) return g4__jt_undef_err(R, line, obj);
    if (obj->t == G4__JV_DICT) {
        const g4__jtv *v = g4__jt_dget((const g4__jtcoll *)obj->p, key);
        if (v) { *out = *v; return 0; }
    } else if ((obj->t == G4__JV_LIST || obj->t == G4__JV_STR) && (key->t == G4__JV_INT || key->t == G4__JV_BOOL)) {
        g4__jtcoll *items;
        int64_t i = key->i, n;
        if (g4__jt_tolist(R, line, obj, &items)) return -1;
        n = (int64_t)items->n;
        if (i < 0) i += n;
        if (i >= 0 && i < n) { *out = items->v[i]; return 0; }
    }
    if (key->t == G4__JV_STR) return g4__jt_getattr(R, line, obj, key->s, key->n, out);
    {
        g4__jtv ks;
        if (g4__jt_tostr(R, line, key, &ks)) return -1;
        return g4__jt_undef_fmt(R, line, out, "'%s' has no element %.100s", g4__jt_objrepr(obj), ks.s);
    }
}

/* Python's `a in b`. */
static int g4__jt_contains(g4__jtr *R, int line, const g4__jtv *a, const g4__jtv *b, int *res) {
    *res = 0;
    if (b->t == G4__JV_UNDEF) return 0;
    if (b->t == G4__JV_STR) {
        size_t i;
        if (a->t != G4__JV_STR)
            return g4__jt_fail(R, line, "'in <string>' requires string as left operand, not %s", g4__jt_typename(a));
        if (a->n == 0) { *res = 1; return 0; }
        for (i = 0; i + a->n <= b->n; i++)
            if (memcmp(b->s + i, a->s, a->n) == 0) { *res = 1; return 0; }
        return 0;
    }
    if (b->t == G4__JV_LIST) {
        const g4__jtcoll *c = (const g4__jtcoll *)b->p;
        size_t i;
        for (i = 0; i < c->n; i++)
            if (g4__jt_eq(a, &c->v[i])) { *res = 1; return 0; }
        return 0;
    }
    if (b->t == G4__JV_DICT) { *res = g4__jt_dget((const g4__jtcoll *)b->p, a) != NULL; return 0; }
    return g4__jt_fail(R, line, "argument of type '%s' is not iterable", g4__jt_typename(b));
}

static int g4__jt_ovf(g4__jtr *R, int line) { return g4__jt_fail(R, line, "integer overflow (integers are 64-bit here)"); }

static int64_t g4__jt_floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static int g4__jt_binop_eval(g4__jtr *R, int line, int op, const g4__jtv *a, const g4__jtv *b, g4__jtv *out) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    const char *opname = op == '+' ? names[0] : op == '-' ? names[1] : op == '*' ? names[2] : op == '/' ? names[3]
                       : op == 'f' ? names[4] : op == '%' ? names[5] : names[6];
    if (op == '~') {
        g4__jtv x, y;
        char *d;
        if (g4__jt_tostr(R, line, a, &x) || g4__jt_tostr(R, line, b, &y)) return -1;
        if (x.n + y.n > R->max_output) return g4__jt_fail(R, line, "string longer than max_output");
        if (!(d = g4__jt_newstr(R, line, x.n + y.n, out))) return -1;
        memcpy(d, x.s, x.n);
        memcpy(d + x.n, y.s, y.n);
        return 0;
    }
    if (a->t == G4__JV_UNDEF) return g4__jt_undef_err(R, line, a);
    if (b->t == G4__JV_UNDEF) return g4__jt_undef_err(R, line, b);
    if (g4__jt_isnum(a) && g4__jt_isnum(b)) {
        int ints = a->t != G4__JV_FLOAT && b->t != G4__JV_FLOAT;
        int64_t x = a->i, y = b->i;
        double fx = g4__jt_num(a), fy = g4__jt_num(b);
        switch (op) {
        case '+':
            if (!ints) { *out = g4__jt_vfloat(fx + fy); return 0; }
            if ((y > 0 && x > INT64_MAX - y) || (y < 0 && x < INT64_MIN - y)) return g4__jt_ovf(R, line);
            *out = g4__jt_vint(x + y);
            return 0;
        case '-':
            if (!ints) { *out = g4__jt_vfloat(fx - fy); return 0; }
            if ((y < 0 && x > INT64_MAX + y) || (y > 0 && x < INT64_MIN + y)) return g4__jt_ovf(R, line);
            *out = g4__jt_vint(x - y);
            return 0;
        case '*':
            if (!ints) { *out = g4__jt_vfloat(fx * fy); return 0; }
            if (x != 0 && y != 0) {
                int64_t ax = x < 0 ? -x : x, ay = y < 0 ? -y : y;
                if (x == INT64_MIN || y == INT64_MIN || ax > INT64_MAX / ay) return g4__jt_ovf(R, line);
            }
            *out = g4__jt_vint(x * y);
            return 0;
        case '/':
            if (fy == 0) return g4__jt_fail(R, line, "division by zero");
            *out = g4__jt_vfloat(fx / fy);
            return 0;
        case 'f': case '%':
            if (ints) {
                if (y == 0) return g4__jt_fail(R, line, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) return g4__jt_ovf(R, line);
                *out = g4__jt_vint(op == 'f' ? g4__jt_floordiv(x, y) : x - g4__jt_floordiv(x, y) * y);
                return 0;
            }
            if (fy == 0) return g4__jt_fail(R, line, "float division by zero");
            { /* CPython's float_divmod */
                double m = fmod(fx, fy), d = (fx - m) / fy, fd;
                if (m != 0) {
                    if ((fy < 0) != (m < 0)) { m += fy; d -= 1.0; }
                } else m = fy < 0 ? -0.0 : 0.0;
                if (d != 0) {
                    fd = floor(d);
                    if (d - fd > 0.5) fd += 1.0;
                } else fd = (fx / fy) < 0 ? -0.0 : 0.0;
                *out = g4__jt_vfloat(op == '%' ? m : fd);
            }
            return 0;
        default: /* ** */
            if (ints && y >= 0) {
                int64_t r = 1, base = x, e = y;
                while (e > 0) {
                    if (e & 1) {
                        g4__jtv t1 = g4__jt_vint(r), t2 = g4__jt_vint(base), t3;
                        if (g4__jt_binop_eval(R, line, '*', &t1, &t2, &t3)) return -1;
                        r = t3.i;
                    }
                    e >>= 1;
                    if (e) {
                        g4__jtv t1 = g4__jt_vint(base), t3;
                        if (g4__jt_binop_eval(R, line, '*', &t1, &t1, &t3)) return -1;
                        base = t3.i;
                    }
                }
                *out = g4__jt_vint(r);
                return 0;
            }
            if (fx == 0 && fy < 0) return g4__jt_fail(R, line, "0.0 cannot be raised to a negative power");
            *out = g4__jt_vfloat(pow(fx, fy));
            return 0;
        }
    }
    if (op == '+' && a->t == G4__JV_STR && b->t == G4__JV_STR) {
        char *d;
        if (a->n + b->n > R->max_output) return g4__jt_fail(R, line, "string longer than max_output");
        if (!(d = g4__jt_newstr(R, line, a->n + b->n, out))) return -1;
        memcpy(d, a->s, a->n);
        memcpy(d + a->n, b->s, b->n);
        return 0;
    }
    if (op == '+' && a->t == G4__JV_LIST && b->t == G4__JV_LIST && a->tuple == b->tuple) {
        const g4__jtcoll *x = (const g4__jtcoll *)a->p, *y = (const g4__jtcoll *)b->p;
        g4__jtcoll *c = g4__jt_newcoll(R, line, x->n + y->n, 0);
        if (!c) return -1;
        memcpy(c->v, x->v, x->n * sizeof *c->v);
        memcpy(c->v + x->n, y->v, y->n * sizeof *c->v);
        c->n = x->n + y->n;
        *out = g4__jt_vlist(c, a->tuple);
        return 0;
    }
    if (op == '*' && ((a->t == G4__JV_STR || a->t == G4__JV_LIST) && (b->t == G4__JV_INT || b->t == G4__JV_BOOL))) {
        int64_t times = b->i < 0 ? 0 : b->i, k;
        size_t unit = a->t == G4__JV_STR ? a->n : ((const g4__jtcoll *)a->p)->n;
        if (unit && (uint64_t)times > R->max_output / unit) return g4__jt_fail(R, line, "repetition longer than max_output");
        if (a->t == G4__JV_STR) {
            char *d;
            if (!(d = g4__jt_newstr(R, line, unit * (size_t)times, out))) return -1;
            for (k = 0; k < times; k++) memcpy(d + (size_t)k * unit, a->s, unit);
        } else {
            g4__jtcoll *c = g4__jt_newcoll(R, line, unit * (size_t)times, 0);
            if (!c) return -1;
            for (k = 0; k < times; k++) memcpy(c->v + (size_t)k * unit, ((const g4__jtcoll *)a->p)->v, unit * sizeof *c->v);
            c->n = unit * (size_t)times;
            *out = g4__jt_vlist(c, a->tuple);
        }
        return 0;
    }
    if (op == '*' && (b->t == G4__JV_STR || b->t == G4__JV_LIST) && (a->t == G4__JV_INT || a->t == G4__JV_BOOL))
        return g4__jt_binop_eval(R, line, op, b, a, out);
    if (op == '%' && a->t == G4__JV_STR) return g4__jt_fail(R, line, "unsupported: printf-style '%%' string formatting");
    return g4__jt_fail(R, line, "unsupported operand type(s) for %s: '%s' and '%s'", opname, g4__jt_typename(a),
                       g4__jt_typename(b));
}

/* ---- string helpers (Python str methods) */

/* Python's one-to-one case mappings for ASCII, Latin-1, Latin Extended-A,
   Greek and Cyrillic (what str.upper()/lower() do there, except the few
   characters whose mapping is more than one character: ß, İ, final sigma). */
static unsigned g4__jt_cp_case(unsigned c, int up) {
    if (c < 0x80) return up ? (c >= 'a' && c <= 'z' ? c - 32 : c) : (c >= 'A' && c <= 'Z' ? c + 32 : c);
    if (c >= 0x100 && c <= 0x17F) {
        int even_upper = (c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177);
        int odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
        if (up && c == 0x131) return 'I';
        if (up && c == 0x17F) return 'S';
        if (!up && c == 0x178) return 0xFF;
        if (even_upper) return up ? ((c & 1) ? c - 1 : c) : ((c & 1) ? c : c + 1);
        if (odd_upper) return up ? ((c & 1) ? c : c - 1) : ((c & 1) ? c + 1 : c);
        return c;
    }
    if (up) {
        if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 0x20;
        if (c == 0xFF) return 0x178;
        if (c == 0xB5) return 0x39C;
        if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3CB)) return c - 0x20;
        if (c == 0x3C2) return 0x3A3;
        if (c == 0x3AC) return 0x386;
        if (c >= 0x3AD && c <= 0x3AF) return c - 0x25;
        if (c == 0x3CC) return 0x38C;
        if (c == 0x3CD || c == 0x3CE) return c - 0x3F;
        if (c >= 0x430 && c <= 0x44F) return c - 0x20;
        if (c >= 0x450 && c <= 0x45F) return c - 0x50;
        return c;
    }
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
    if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3AB)) return c + 0x20;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 0x25;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 0x3F;
    if (c >= 0x410 && c <= 0x42F) return c + 0x20;
    if (c >= 0x400 && c <= 0x40F) return c + 0x50;
    return c;
}
static int g4__jt_cp_isupper(unsigned c) { return g4__jt_cp_case(c, 0) != c || c == 0x130; }
static int g4__jt_cp_islower(unsigned c) { return g4__jt_cp_case(c, 1) != c || c == 0xDF || c == 0x138 || c == 0x149; }

/* The code point at s[0..n) and its byte length (a stray byte: itself, 1). */
static unsigned g4__jt_cp_at(const char *s, size_t n, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = g4__jt_cpbytes(s, n);
    *len = k;
    if (u[0] < 0x80) { *len = 1; return u[0]; }
    if (k == 2 && (u[0] & 0xE0) == 0xC0) return ((u[0] & 0x1Fu) << 6) | (u[1] & 0x3Fu);
    if (k == 3 && (u[0] & 0xF0) == 0xE0) return ((u[0] & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6) | (u[2] & 0x3Fu);
    if (k == 4 && (u[0] & 0xF8) == 0xF0) return ((u[0] & 0x07u) << 18) | ((u[1] & 0x3Fu) << 12) | ((u[2] & 0x3Fu) << 6) | (u[3] & 0x3Fu);
    *len = 1;
    return 0x80000000u | u[0]; /* not decodable: copied as is */
}

/* mode 'u' upper, 'l' lower, 'c' capitalize, 't' str.title(), 'T' jinja2's title filter, 's' swapcase */
static int g4__jt_case(g4__jtr *R, int line, const g4__jtv *s, int mode, g4__jtv *out) {
    char *d = g4__jt_newstr(R, line, s->n, out), *o = d;
    size_t i = 0;
    int prev_cased = 0, word_start = 1, first = 1;
    if (!d) return -1;
    while (i < s->n) {
        size_t k;
        unsigned c = g4__jt_cp_at(s->s + i, s->n - i, &k), m = c;
        if (!(c & 0x80000000u)) {
            int cased = g4__jt_cp_isupper(c) || g4__jt_cp_islower(c);
            switch (mode) {
            case 'u': m = g4__jt_cp_case(c, 1); break;
            case 'l': m = g4__jt_cp_case(c, 0); break;
            case 'c': m = g4__jt_cp_case(c, first); break;
            case 's': m = g4__jt_cp_case(c, g4__jt_cp_islower(c)); break;
            case 't': m = g4__jt_cp_case(c, !prev_cased); prev_cased = cased; break;
            default: /* 'T': a word begins after - ( { [ < or whitespace */
                m = g4__jt_cp_case(c, word_start);
                word_start = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || g4__jt_space(s->s + i, k) == k;
            }
        } else if (mode == 't') prev_cased = 0;
        else if (mode == 'T') word_start = 0;
        first = 0;
        /* every mapping here keeps the UTF-8 length */
        if (c & 0x80000000u) *o++ = s->s[i];
        else o += g4__jt_utf8_put(o, m);
        i += k;
    }
    *o = 0;
    out->n = (size_t)(o - d);
    return 0;
}

/* Python's str.islower() (upper = 0) / str.isupper(): a cased character, none of the other case. */
static int g4__jt_iscase(const g4__jtv *s, int upper) {
    size_t i = 0;
    int cased = 0;
    while (i < s->n) {
        size_t k;
        unsigned c = g4__jt_cp_at(s->s + i, s->n - i, &k);
        if (!(c & 0x80000000u)) {
            if (upper ? g4__jt_cp_islower(c) : g4__jt_cp_isupper(c)) return 0;
            cased |= upper ? g4__jt_cp_isupper(c) : g4__jt_cp_islower(c);
        }
        i += k;
    }
    return cased;
}

/* Is the character at s[0..k) one of chars (code points)? chars NULL: whitespace. */
static int g4__jt_inset(const char *s, size_t k, const g4__jtv *chars) {
    size_t i = 0;
    if (!chars) return g4__jt_space(s, k) == k;
    while (i < chars->n) {
        size_t m = g4__jt_cpbytes(chars->s + i, chars->n - i);
        if (m == k && memcmp(chars->s + i, s, k) == 0) return 1;
        i += m;
    }
    return 0;
}

/* str.strip / lstrip / rstrip (which: 3, 1, 2); chars NULL strips whitespace. */
static g4__jtv g4__jt_strip(const g4__jtv *s, const g4__jtv *chars, int which) {
    size_t a = 0, b = s->n;
    if (which & 1)
        while (a < b) {
            size_t k = g4__jt_cpbytes(s->s + a, b - a);
            if (!g4__jt_inset(s->s + a, k, chars)) break;
            a += k;
        }
    if (which & 2)
        while (b > a) {
            size_t k = 1;
            while (k < b - a && ((unsigned char)s->s[b - k] & 0xC0) == 0x80) k++;
            if (!g4__jt_inset(s->s + b - k, k, chars)) break;
            b -= k;
        }
    return g4__jt_vstr(s->s + a, b - a);
}

static int g4__jt_listpush(g4__jtr *R, int line, g4__jtcoll *c, const g4__jtv *v) { return g4__jt_push(R, line, c, NULL, v); }

/* str.split / rsplit (sep NULL: runs of whitespace) */
static int g4__jt_split(g4__jtr *R, int line, const g4__jtv *s, const g4__jtv *sep, int64_t maxsplit, int right, g4__jtv *out) {
    g4__jtcoll *c = g4__jt_newcoll(R, line, 8, 0);
    g4__jtv piece;
    if (!c) return -1;
    if (sep && sep->n == 0) return g4__jt_fail(R, line, "split: empty separator");
    if (!right) {
        size_t i = 0;
        if (!sep) {
            for (;;) {
                size_t st, k;
                while (i < s->n && (k = g4__jt_space(s->s + i, s->n - i)) != 0) i += k;
                if (i >= s->n) break;
                if (maxsplit >= 0 && (int64_t)c->n >= maxsplit) {
                    g4__jtv rest = g4__jt_vstr(s->s + i, s->n - i);
                    rest = g4__jt_strip(&rest, NULL, 2);
                    if (g4__jt_listpush(R, line, c, &rest)) return -1;
                    break;
                }
                st = i;
                while (i < s->n && !g4__jt_space(s->s + i, s->n - i)) i++;
                piece = g4__jt_vstr(s->s + st, i - st);
                if (g4__jt_listpush(R, line, c, &piece)) return -1;
            }
        } else {
            size_t st = 0;
            while (i + sep->n <= s->n) {
                if ((maxsplit < 0 || (int64_t)c->n < maxsplit) && memcmp(s->s + i, sep->s, sep->n) == 0) {
                    piece = g4__jt_vstr(s->s + st, i - st);
                    if (g4__jt_listpush(R, line, c, &piece)) return -1;
                    i += sep->n;
                    st = i;
                } else i++;
            }
            piece = g4__jt_vstr(s->s + st, s->n - st);
            if (g4__jt_listpush(R, line, c, &piece)) return -1;
        }
    } else { /* rsplit: collect from the right, then reverse */
        size_t i = s->n, k, a, b;
        if (!sep) {
            for (;;) {
                size_t en;
                while (i > 0 && (k = g4__jt_space_back(s->s, i)) != 0) i -= k;
                if (i == 0) break;
                if (maxsplit >= 0 && (int64_t)c->n >= maxsplit) {
                    g4__jtv rest = g4__jt_vstr(s->s, i);
                    rest = g4__jt_strip(&rest, NULL, 1);
                    if (g4__jt_listpush(R, line, c, &rest)) return -1;
                    break;
                }
                en = i;
                while (i > 0 && !g4__jt_space_back(s->s, i)) i--;
                piece = g4__jt_vstr(s->s + i, en - i);
                if (g4__jt_listpush(R, line, c, &piece)) return -1;
            }
        } else {
            size_t en = s->n;
            while (i >= sep->n) {
                if ((maxsplit < 0 || (int64_t)c->n < maxsplit) && memcmp(s->s + i - sep->n, sep->s, sep->n) == 0) {
                    piece = g4__jt_vstr(s->s + i, en - i);
                    if (g4__jt_listpush(R, line, c, &piece)) return -1;
                    i -= sep->n;
                    en = i;
                } else i--;
            }
            piece = g4__jt_vstr(s->s, en);
            if (g4__jt_listpush(R, line, c, &piece)) return -1;
        }
        for (a = 0, b = c->n; a + 1 < b; a++, b--) {
            g4__jtv t = c->v[a];
            c->v[a] = c->v[b - 1];
            c->v[b - 1] = t;
        }
    }
    *out = g4__jt_vlist(c, 0);
    return 0;
}

/* str.replace(old, new, count) */
static int g4__jt_replace(g4__jtr *R, int line, const g4__jtv *s, const g4__jtv *old, const g4__jtv *nw, int64_t count, g4__jtv *out) {
    g4__jtsb b;
    size_t i = 0;
    int64_t done = 0;
    memset(&b, 0, sizeof b);
    b.R = R;
    b.line = line;
    if (old->n == 0) { /* inserts new before every character and at the end */
        while (i <= s->n) {
            size_t k = i < s->n ? g4__jt_cpbytes(s->s + i, s->n - i) : 1;
            if ((count < 0 || done < count)) { if (g4__jt_sb_add(&b, nw->s, nw->n)) return -1; done++; }
            if (i < s->n && g4__jt_sb_add(&b, s->s + i, k)) return -1;
            i += k;
        }
    } else {
        while (i < s->n) {
            if ((count < 0 || done < count) && i + old->n <= s->n && memcmp(s->s + i, old->s, old->n) == 0) {
                if (g4__jt_sb_add(&b, nw->s, nw->n)) return -1;
                i += old->n;
                done++;
            } else {
                if (g4__jt_sb_add(&b, s->s + i, 1)) return -1;
                i++;
            }
        }
    }
    *out = g4__jt_sb_val(&b);
    return 0;
}

static int64_t g4__jt_find(const g4__jtv *s, const g4__jtv *sub, int rev) {
    size_t i;
    if (sub->n > s->n) return -1;
    if (!rev) {
        for (i = 0; i + sub->n <= s->n; i++)
            if (memcmp(s->s + i, sub->s, sub->n) == 0) return (int64_t)g4__jt_cplen(s->s, i);
    } else {
        for (i = s->n - sub->n + 1; i-- > 0;)
            if (memcmp(s->s + i, sub->s, sub->n) == 0) return (int64_t)g4__jt_cplen(s->s, i);
    }
    return -1;
}

/* startswith / endswith with a string or a tuple of strings */
static int g4__jt_affix(g4__jtr *R, int line, const g4__jtv *s, const g4__jtv *x, int end, int *res) {
    *res = 0;
    if (x->t == G4__JV_LIST) {
        const g4__jtcoll *c = (const g4__jtcoll *)x->p;
        size_t i;
        for (i = 0; i < c->n && !*res; i++)
            if (g4__jt_affix(R, line, s, &c->v[i], end, res)) return -1;
        return 0;
    }
    if (g4__jt_need_str(R, line, x, end ? "endswith's argument" : "startswith's argument")) return -1;
    *res = x->n <= s->n && memcmp(end ? s->s + s->n - x->n : s->s, x->s, x->n) == 0;
    return 0;
}

/* str.splitlines() (line boundaries as Python's) */
static int g4__jt_splitlines(g4__jtr *R, int line, const g4__jtv *s, g4__jtv *out) {
    g4__jtcoll *c = g4__jt_newcoll(R, line, 8, 0);
    size_t i = 0, st = 0;
    if (!c) return -1;
    while (i < s->n) {
        const unsigned char *u = (const unsigned char *)s->s + i;
        size_t br = 0, skip = 0;
        if (*u == '\n' || *u == '\v' || *u == '\f' || (*u >= 0x1c && *u <= 0x1e)) br = skip = 1;
        else if (*u == '\r') { br = 1; skip = (i + 1 < s->n && u[1] == '\n') ? 2 : 1; }
        else if (i + 1 < s->n && u[0] == 0xC2 && u[1] == 0x85) br = skip = 2;
        else if (i + 2 < s->n && u[0] == 0xE2 && u[1] == 0x80 && (u[2] == 0xA8 || u[2] == 0xA9)) br = skip = 3;
        if (br) {
            g4__jtv piece = g4__jt_vstr(s->s + st, i - st);
            if (g4__jt_listpush(R, line, c, &piece)) return -1;
            i += skip;
            st = i;
        } else i++;
    }
    if (st < s->n) {
        g4__jtv piece = g4__jt_vstr(s->s + st, s->n - st);
        if (g4__jt_listpush(R, line, c, &piece)) return -1;
    }
    *out = g4__jt_vlist(c, 0);
    return 0;
}

static int g4__jt_join(g4__jtr *R, int line, const g4__jtcoll *items, const g4__jtv *sep, g4__jtv *out) {
    g4__jtsb b;
    size_t i;
    memset(&b, 0, sizeof b);
    b.R = R;
    b.line = line;
    for (i = 0; i < items->n; i++) {
        g4__jtv s;
        if (i && sep && g4__jt_sb_add(&b, sep->s, sep->n)) return -1;
        if (g4__jt_tostr(R, line, &items->v[i], &s) || g4__jt_sb_add(&b, s.s, s.n)) return -1;
    }
    *out = g4__jt_sb_val(&b);
    return 0;
}

/* A method call on a str, dict, list or loop. */
static int g4__jt_callmethod(g4__jtr *R, int line, const g4__jtv *m, g4__jtargs *A, g4__jtv *out) {
    const g4__jtv *self = (const g4__jtv *)m->p, *x, *y;
    const char *nm = m->s;
    size_t nl = m->n;
#define G4__JT_IS(lit) (nl == sizeof(lit) - 1 && memcmp(nm, lit, nl) == 0)
    if (self->t == G4__JV_STR) {
        if (G4__JT_IS("split") || G4__JT_IS("rsplit")) {
            int64_t mx = -1;
            x = g4__jt_arg(A, 0, "sep");
            y = g4__jt_arg(A, 1, "maxsplit");
            if (x && x->t == G4__JV_NONE) x = NULL;
            if (x && g4__jt_need_str(R, line, x, "split's separator")) return -1;
            if (y) { if (g4__jt_need_int(R, line, y, "maxsplit")) return -1; mx = y->i; }
            if (g4__jt_argcheck(R, line, A, 2, "method", nm, nl)) return -1;
            return g4__jt_split(R, line, self, x, mx, nm[0] == 'r', out);
        }
        if (G4__JT_IS("strip") || G4__JT_IS("lstrip") || G4__JT_IS("rstrip")) {
            x = g4__jt_arg(A, 0, "chars");
            if (x && x->t == G4__JV_NONE) x = NULL;
            if (x && g4__jt_need_str(R, line, x, "strip's argument")) return -1;
            if (g4__jt_argcheck(R, line, A, 1, "method", nm, nl)) return -1;
            *out = g4__jt_strip(self, x, nm[0] == 'l' ? 1 : nm[0] == 'r' ? 2 : 3);
            return 0;
        }
        if (G4__JT_IS("startswith") || G4__JT_IS("endswith")) {
            int r;
            if (!(x = g4__jt_arg(A, 0, NULL)) || g4__jt_argcheck(R, line, A, 1, "method", nm, nl))
                return g4__jt_fail(R, line, "%.*s takes one argument", (int)nl, nm);
            if (g4__jt_affix(R, line, self, x, nm[0] == 'e', &r)) return -1;
            *out = g4__jt_vbool(r);
            return 0;
        }
        if (G4__JT_IS("upper") || G4__JT_IS("lower") || G4__JT_IS("capitalize") || G4__JT_IS("title") || G4__JT_IS("swapcase")) {
            if (g4__jt_argcheck(R, line, A, 0, "method", nm, nl)) return -1;
            return g4__jt_case(R, line, self, nm[0] == 'u' ? 'u' : nm[0] == 'l' ? 'l' : nm[0] == 'c' ? 'c' : nm[0] == 't' ? 't' : 's', out);
        }
        if (G4__JT_IS("replace")) {
            int64_t cnt = -1;
            x = g4__jt_arg(A, 0, "old");
            y = g4__jt_arg(A, 1, "new");
            if (!x || !y || g4__jt_need_str(R, line, x, "replace's arguments") || g4__jt_need_str(R, line, y, "replace's arguments"))
                return g4__jt_fail(R, line, "replace takes two strings");
            if (A->n > 2) { if (g4__jt_need_int(R, line, &A->v[2], "replace's count")) return -1; cnt = A->v[2].i; }
            if (g4__jt_argcheck(R, line, A, 3, "method", nm, nl)) return -1;
            return g4__jt_replace(R, line, self, x, y, cnt, out);
        }
        if (G4__JT_IS("find") || G4__JT_IS("rfind") || G4__JT_IS("index") || G4__JT_IS("rindex") || G4__JT_IS("count")) {
            if (!(x = g4__jt_arg(A, 0, NULL)) || g4__jt_need_str(R, line, x, "the argument") ||
                g4__jt_argcheck(R, line, A, 1, "method", nm, nl))
                return g4__jt_fail(R, line, "%.*s takes one string", (int)nl, nm);
            if (G4__JT_IS("count")) {
                int64_t c = 0;
                size_t i = 0;
                if (x->n == 0) c = (int64_t)g4__jt_cplen(self->s, self->n) + 1;
                else
                    while (i + x->n <= self->n) {
                        if (memcmp(self->s + i, x->s, x->n) == 0) { c++; i += x->n; } else i++;
                    }
                *out = g4__jt_vint(c);
                return 0;
            }
            *out = g4__jt_vint(g4__jt_find(self, x, nm[0] == 'r'));
            if (out->i < 0 && (G4__JT_IS("index") || G4__JT_IS("rindex"))) return g4__jt_fail(R, line, "substring not found");
            return 0;
        }
        if (G4__JT_IS("join")) {
            g4__jtcoll *items;
            if (!(x = g4__jt_arg(A, 0, NULL)) || g4__jt_argcheck(R, line, A, 1, "method", nm, nl)) return g4__jt_fail(R, line, "join takes one argument");
            if (g4__jt_tolist(R, line, x, &items)) return -1;
            {
                size_t i;
                for (i = 0; i < items->n; i++)
                    if (items->v[i].t != G4__JV_STR)
                        return g4__jt_fail(R, line, "sequence item %lu: expected str instance, %s found", (unsigned long)i,
                                           g4__jt_typename(&items->v[i]));
            }
            return g4__jt_join(R, line, items, self, out);
        }
        if (G4__JT_IS("splitlines")) {
            if (g4__jt_argcheck(R, line, A, 0, "method", nm, nl)) return -1;
            return g4__jt_splitlines(R, line, self, out);
        }
        if (G4__JT_IS("removeprefix") || G4__JT_IS("removesuffix")) {
            int r;
            if (!(x = g4__jt_arg(A, 0, NULL)) || g4__jt_argcheck(R, line, A, 1, "method", nm, nl)) return g4__jt_fail(R, line, "%.*s takes one argument", (int)nl, nm);
            if (g4__jt_affix(R, line, self, x, nm[6] == 's', &r)) return -1;
            *out = !r ? *self : nm[6] == 's' ? g4__jt_vstr(self->s, self->n - x->n) : g4__jt_vstr(self->s + x->n, self->n - x->n);
            return 0;
        }
        if (G4__JT_IS("islower") || G4__JT_IS("isupper")) {
            if (g4__jt_argcheck(R, line, A, 0, "method", nm, nl)) return -1;
            *out = g4__jt_vbool(g4__jt_iscase(self, nm[2] == 'u'));
            return 0;
        }
        if (G4__JT_IS("isdigit") || G4__JT_IS("isalpha") || G4__JT_IS("isalnum") || G4__JT_IS("isspace")) {
            size_t i;
            int r = self->n > 0;
            if (g4__jt_argcheck(R, line, A, 0, "method", nm, nl)) return -1;
            for (i = 0; i < self->n && r; i++) {
                char c = self->s[i];
                int dg = c >= '0' && c <= '9', al = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
                if (G4__JT_IS("isspace")) {
                    size_t k = g4__jt_space(self->s + i, self->n - i);
                    r = k != 0;
                    if (k) i += k - 1;
                    continue;
                }
                if ((unsigned char)c >= 0x80) return g4__jt_fail(R, line, "unsupported: %.*s on non-ASCII text", (int)nl, nm);
                r = G4__JT_IS("isdigit") ? dg : G4__JT_IS("isalpha") ? al : al || dg;
            }
            *out = g4__jt_vbool(r);
            return 0;
        }
    } else if (self->t == G4__JV_DICT) {
        const g4__jtcoll *d = (const g4__jtcoll *)self->p;
        if (G4__JT_IS("get")) {
            const g4__jtv *v;
            if (!(x = g4__jt_arg(A, 0, NULL))) return g4__jt_fail(R, line, "get expected at least 1 argument, got 0");
            y = g4__jt_arg(A, 1, NULL);
            if (g4__jt_argcheck(R, line, A, 2, "method", nm, nl)) return -1;
            v = g4__jt_dget(d, x);
            *out = v ? *v : y ? *y : g4__jt_v(G4__JV_NONE);
            return 0;
        }
        if (G4__JT_IS("items") || G4__JT_IS("keys") || G4__JT_IS("values")) {
            g4__jtcoll *c = g4__jt_newcoll(R, line, d->n, 0);
            size_t i;
            if (!c || g4__jt_argcheck(R, line, A, 0, "method", nm, nl)) return -1;
            for (i = 0; i < d->n; i++) {
                if (nm[0] == 'k') c->v[i] = d->k[i];
                else if (nm[0] == 'v') c->v[i] = d->v[i];
                else {
                    g4__jtcoll *pr = g4__jt_newcoll(R, line, 2, 0);
                    if (!pr) return -1;
                    pr->v[0] = d->k[i];
                    pr->v[1] = d->v[i];
                    pr->n = 2;
                    c->v[i] = g4__jt_vlist(pr, 1);
                }
            }
            c->n = d->n;
            *out = g4__jt_vlist(c, 0);
            return 0;
        }
    } else if (self->t == G4__JV_LIST) {
        const g4__jtcoll *c = (const g4__jtcoll *)self->p;
        if (G4__JT_IS("index") || G4__JT_IS("count")) {
            size_t i;
            int64_t cnt = 0;
            if (!(x = g4__jt_arg(A, 0, NULL)) || g4__jt_argcheck(R, line, A, 1, "method", nm, nl)) return g4__jt_fail(R, line, "%.*s takes one argument", (int)nl, nm);
            for (i = 0; i < c->n; i++)
                if (g4__jt_eq(&c->v[i], x)) {
                    if (nm[0] == 'i') { *out = g4__jt_vint((int64_t)i); return 0; }
                    cnt++;
                }
            if (nm[0] == 'i') return g4__jt_fail(R, line, "list.index(x): x not in list");
            *out = g4__jt_vint(cnt);
            return 0;
        }
        if (!G4__JT_IS("copy"))
            return g4__jt_fail(R, line, "access to attribute '%.*s' of 'list' object is unsafe (lists are immutable in templates)", (int)nl, nm);
    } else if (self->t == G4__JV_LOOP && G4__JT_IS("cycle")) {
        const g4__jtloop *L = (const g4__jtloop *)self->p;
        if (A->n == 0) return g4__jt_fail(R, line, "no items for cycling given");
        *out = A->v[L->i % (size_t)A->n];
        return 0;
    }
#undef G4__JT_IS
    return g4__jt_fail(R, line, "unsupported method '%.*s' of '%s'", (int)nl, nm, g4__jt_typename(self));
}

/* ---- tojson: Python's json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */

typedef struct {
    const char *indent;          /* NULL: no newlines */
    size_t indent_n;
    const char *item_sep, *key_sep;
    size_t item_n, key_n;
    int ascii, sort_keys;
} g4__jtjson;

static int g4__jt_json_str(g4__jtsb *b, const char *s, size_t n, int ascii) {
    size_t i = 0;
    char esc[16];
    if (g4__jt_sb_add(b, "\"", 1)) return -1;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        size_t k = 1;
        if (c == '"') e = "\\\"";
        else if (c == '\\') e = "\\\\";
        else if (c == '\n') e = "\\n";
        else if (c == '\r') e = "\\r";
        else if (c == '\t') e = "\\t";
        else if (c == '\b') e = "\\b";
        else if (c == '\f') e = "\\f";
        else if (c < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", c); e = esc; }
        else if (c >= 0x80) {
            k = g4__jt_cpbytes(s + i, n - i);
            if (ascii) {
                unsigned cp = 0;
                if (k == 2) cp = ((c & 0x1Fu) << 6) | ((unsigned char)s[i + 1] & 0x3Fu);
                else if (k == 3) cp = ((c & 0x0Fu) << 12) | (((unsigned char)s[i + 1] & 0x3Fu) << 6) | ((unsigned char)s[i + 2] & 0x3Fu);
                else if (k == 4) cp = ((c & 0x07u) << 18) | (((unsigned char)s[i + 1] & 0x3Fu) << 12) |
                                      (((unsigned char)s[i + 2] & 0x3Fu) << 6) | ((unsigned char)s[i + 3] & 0x3Fu);
                else cp = 0xFFFD;
                if (cp >= 0x10000) snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
                else snprintf(esc, sizeof esc, "\\u%04x", cp);
                e = esc;
            }
        }
        if (e ? g4__jt_sb_str(b, e) : g4__jt_sb_add(b, s + i, k)) return -1;
        i += k;
    }
    return g4__jt_sb_add(b, "\"", 1);
}

static int g4__jt_json_nl(g4__jtsb *b, const g4__jtjson *o, int level) {
    int i;
    if (!o->indent) return 0;
    if (g4__jt_sb_add(b, "\n", 1)) return -1;
    for (i = 0; i < level; i++)
        if (g4__jt_sb_add(b, o->indent, o->indent_n)) return -1;
    return 0;
}

static int g4__jt_sortpairs(g4__jtr *R, int line, g4__jtv *keys, g4__jtv *vals, size_t n, int (*less)(g4__jtr *, int, const g4__jtv *, const g4__jtv *, int *), int reverse);

static int g4__jt_less_plain(g4__jtr *R, int line, const g4__jtv *a, const g4__jtv *b, int *res) {
    int c;
    if (g4__jt_cmp(R, line, a, b, "<", &c)) return -1;
    *res = c == -1;
    return 0;
}

static int g4__jt_json(g4__jtsb *b, const g4__jtv *v, const g4__jtjson *o, int level) {
    char num[40];
    g4__jtr *R = b->R;
    if (level > 64) return g4__jt_fail(R, b->line, "tojson: value nested too deeply");
    switch (v->t) {
    case G4__JV_NONE: return g4__jt_sb_str(b, "null");
    case G4__JV_BOOL: return g4__jt_sb_str(b, v->i ? "true" : "false");
    case G4__JV_INT: snprintf(num, sizeof num, "%lld", (long long)v->i); return g4__jt_sb_str(b, num);
    case G4__JV_FLOAT:
        if (v->f != v->f) return g4__jt_sb_str(b, "NaN");
        if (v->f == HUGE_VAL) return g4__jt_sb_str(b, "Infinity");
        if (v->f == -HUGE_VAL) return g4__jt_sb_str(b, "-Infinity");
        g4__jt_fmt_float(v->f, num, sizeof num);
        return g4__jt_sb_str(b, num);
    case G4__JV_STR: return g4__jt_json_str(b, v->s, v->n, o->ascii);
    case G4__JV_LIST: case G4__JV_DICT: {
        const g4__jtcoll *c = (const g4__jtcoll *)v->p;
        int dict = v->t == G4__JV_DICT;
        size_t i;
        g4__jtv *keys = c->k, *vals = c->v;
        if (c->n == 0) return g4__jt_sb_str(b, dict ? "{}" : "[]");
        if (dict && o->sort_keys) {
            keys = (g4__jtv *)g4__jt_ralloc(R, b->line, c->n * sizeof *keys);
            vals = (g4__jtv *)g4__jt_ralloc(R, b->line, c->n * sizeof *vals);
            if (!keys || !vals) return -1;
            memcpy(keys, c->k, c->n * sizeof *keys);
            memcpy(vals, c->v, c->n * sizeof *vals);
            if (g4__jt_sortpairs(R, b->line, keys, vals, c->n, g4__jt_less_plain, 0)) return -1;
        }
        if (g4__jt_sb_str(b, dict ? "{" : "[") || g4__jt_json_nl(b, o, level + 1)) return -1;
        for (i = 0; i < c->n; i++) {
            if (i && (g4__jt_sb_add(b, o->item_sep, o->item_n) || g4__jt_json_nl(b, o, level + 1))) return -1;
            if (dict) {
                const g4__jtv *k = &keys[i];
                if (k->t == G4__JV_STR) { if (g4__jt_json_str(b, k->s, k->n, o->ascii)) return -1; }
                else if (k->t == G4__JV_NONE || k->t == G4__JV_BOOL || k->t == G4__JV_INT || k->t == G4__JV_FLOAT) {
                    if (g4__jt_sb_str(b, "\"") || g4__jt_json(b, k, o, level + 1) || g4__jt_sb_str(b, "\"")) return -1;
                } else return g4__jt_fail(R, b->line, "tojson: keys must be str, int, float, bool or None, not %s", g4__jt_typename(k));
                if (g4__jt_sb_add(b, o->key_sep, o->key_n)) return -1;
            }
            if (g4__jt_json(b, &vals[i], o, level + 1)) return -1;
        }
        return g4__jt_json_nl(b, o, level) || g4__jt_sb_str(b, dict ? "}" : "]");
    }
    default:
        return g4__jt_fail(R, b->line, "tojson: Object of type %s is not JSON serializable", g4__jt_typename(v));
    }
}

/* ---- sorting: a stable merge sort of (key, value) pairs; `less` may fail */

static int g4__jt_sortpairs(g4__jtr *R, int line, g4__jtv *keys, g4__jtv *vals, size_t n,
                            int (*less)(g4__jtr *, int, const g4__jtv *, const g4__jtv *, int *), int reverse) {
    g4__jtv *tk, *tv;
    size_t width, i;
    if (n < 2) return 0;
    tk = (g4__jtv *)g4__jt_ralloc(R, line, n * sizeof *tk);
    tv = (g4__jtv *)g4__jt_ralloc(R, line, n * sizeof *tv);
    if (!tk || !tv) return -1;
    for (width = 1; width < n; width *= 2) {
        for (i = 0; i < n; i += 2 * width) {
            size_t lo = i, mid = i + width < n ? i + width : n, hi = i + 2 * width < n ? i + 2 * width : n;
            size_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) {
                int take_b;
                /* stable: take from the right only when strictly before (reverse: strictly after) */
                if (reverse ? less(R, line, &keys[a], &keys[b], &take_b) : less(R, line, &keys[b], &keys[a], &take_b)) return -1;
                if (take_b) { tk[k] = keys[b]; tv[k++] = vals[b++]; }
                else { tk[k] = keys[a]; tv[k++] = vals[a++]; }
            }
            while (a < mid) { tk[k] = keys[a]; tv[k++] = vals[a++]; }
            while (b < hi) { tk[k] = keys[b]; tv[k++] = vals[b++]; }
        }
        memcpy(keys, tk, n * sizeof *keys);
        memcpy(vals, tv, n * sizeof *vals);
    }
    return 0;
}

/* jinja2's sort key: strings lowercased unless case_sensitive. */
static int g4__jt_sortkey(g4__jtr *R, int line, const g4__jtv *v, int case_sensitive, g4__jtv *out) {
    if (v->t == G4__JV_STR && !case_sensitive) return g4__jt_case(R, line, v, 'l', out);
    *out = *v;
    return 0;
}

/* ---- tests (jinja2's tests.py) */

static int g4__jt_test(g4__jtr *R, int line, const char *nm, size_t nl, const g4__jtv *v, g4__jtargs *A, int *res) {
    const g4__jtv *x = g4__jt_arg(A, 0, NULL);
    int c;
#define G4__JT_IS(lit) (nl == sizeof(lit) - 1 && memcmp(nm, lit, nl) == 0)
    if (G4__JT_IS("defined")) *res = v->t != G4__JV_UNDEF;
    else if (G4__JT_IS("undefined")) *res = v->t == G4__JV_UNDEF;
    else if (G4__JT_IS("none")) *res = v->t == G4__JV_NONE;
    else if (G4__JT_IS("boolean")) *res = v->t == G4__JV_BOOL;
    else if (G4__JT_IS("true")) *res = v->t == G4__JV_BOOL && v->i;
    else if (G4__JT_IS("false")) *res = v->t == G4__JV_BOOL && !v->i;
    else if (G4__JT_IS("integer")) *res = v->t == G4__JV_INT;
    else if (G4__JT_IS("float")) *res = v->t == G4__JV_FLOAT;
    else if (G4__JT_IS("number")) *res = g4__jt_isnum(v);
    else if (G4__JT_IS("string")) *res = v->t == G4__JV_STR;
    else if (G4__JT_IS("mapping")) *res = v->t == G4__JV_DICT;
    else if (G4__JT_IS("sequence")) *res = v->t == G4__JV_STR || v->t == G4__JV_LIST || v->t == G4__JV_DICT;
    else if (G4__JT_IS("iterable")) *res = v->t == G4__JV_STR || v->t == G4__JV_LIST || v->t == G4__JV_DICT || v->t == G4__JV_UNDEF;
    else if (G4__JT_IS("callable")) *res = v->t == G4__JV_MACRO || v->t == G4__JV_FUNC || v->t == G4__JV_METHOD;
    else if (G4__JT_IS("lower") || G4__JT_IS("upper")) {
        g4__jtv s;
        if (g4__jt_tostr(R, line, v, &s)) return -1;
        *res = g4__jt_iscase(&s, nm[0] == 'u');
    } else if (G4__JT_IS("odd") || G4__JT_IS("even") || G4__JT_IS("divisibleby")) {
        int64_t d = 2;
        if (g4__jt_need_int(R, line, v, "the tested value")) return -1;
        if (G4__JT_IS("divisibleby")) {
            if (!x || g4__jt_need_int(R, line, x, "divisibleby's argument")) return -1;
            if ((d = x->i) == 0) return g4__jt_fail(R, line, "integer division or modulo by zero");
        }
        *res = (d == -1 ? 0 : v->i % d) == 0;
        if (G4__JT_IS("odd")) *res = !*res;
    } else if (G4__JT_IS("eq") || G4__JT_IS("equalto") || G4__JT_IS("==") || G4__JT_IS("sameas")) {
        if (!x) return g4__jt_fail(R, line, "test '%.*s' needs an argument", (int)nl, nm);
        *res = G4__JT_IS("sameas") ? (v->t == x->t && (v->t == G4__JV_NONE || v->t == G4__JV_BOOL ? v->i == x->i : g4__jt_eq(v, x) && v->p == x->p && v->s == x->s))
                                   : g4__jt_eq(v, x);
    } else if (G4__JT_IS("ne") || G4__JT_IS("!=")) {
        if (!x) return g4__jt_fail(R, line, "test '%.*s' needs an argument", (int)nl, nm);
        *res = !g4__jt_eq(v, x);
    } else if (G4__JT_IS("lt") || G4__JT_IS("le") || G4__JT_IS("gt") || G4__JT_IS("ge") || G4__JT_IS("lessthan") ||
               G4__JT_IS("greaterthan") || G4__JT_IS("<") || G4__JT_IS("<=") || G4__JT_IS(">") || G4__JT_IS(">=")) {
        int lt = nm[0] == 'l' || nm[0] == '<', eq = (nl == 2 && (nm[1] == 'e' || nm[1] == '=')) ;
        if (!x) return g4__jt_fail(R, line, "test '%.*s' needs an argument", (int)nl, nm);
        if (g4__jt_cmp(R, line, v, x, lt ? "<" : ">", &c)) return -1;
        *res = c == 2 ? 0 : lt ? (eq ? c <= 0 : c < 0) : (eq ? c >= 0 : c > 0);
    } else if (G4__JT_IS("in")) {
        if (!x) return g4__jt_fail(R, line, "test 'in' needs an argument");
        if (g4__jt_contains(R, line, v, x, res)) return -1;
    } else if (G4__JT_IS("escaped")) *res = 0;
    else return g4__jt_fail(R, line, "unknown test '%.*s'", (int)nl, nm);
#undef G4__JT_IS
    return 0;
}

/* ---- builtins: range, namespace, dict, raise_exception, strftime_now */

static int g4__jt_builtin(const char *nm, size_t nl) {
    static const char *const names[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", "cycler",
                                        "joiner", "lipsum", NULL};
    int k;
    for (k = 0; names[k]; k++)
        if (strlen(names[k]) == nl && memcmp(names[k], nm, nl) == 0) return k < 5 ? k + 1 : G4__JF_UNSUPPORTED;
    return 0;
}

static int g4__jt_callbuiltin(g4__jtr *R, int line, const g4__jtv *f, g4__jtargs *A, g4__jtv *out) {
    int i;
    switch ((int)f->i) {
    case G4__JF_RANGE: {
        int64_t start = 0, stop, step = 1, k, n;
        g4__jtcoll *c;
        if (A->n < 1 || A->n > 3 || A->nk) return g4__jt_fail(R, line, "range expects 1 to 3 integer arguments");
        for (i = 0; i < A->n; i++)
            if (g4__jt_need_int(R, line, &A->v[i], "a range argument")) return -1;
        if (A->n == 1) stop = A->v[0].i;
        else { start = A->v[0].i; stop = A->v[1].i; if (A->n == 3) step = A->v[2].i; }
        if (step == 0) return g4__jt_fail(R, line, "range() arg 3 must not be zero");
        n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0) : (start > stop ? (start - stop - step - 1) / -step : 0);
        if (n > 100000) return g4__jt_fail(R, line, "range too big: the sandbox blocks ranges larger than MAX_RANGE (100000)");
        if (!(c = g4__jt_newcoll(R, line, (size_t)n, 0))) return -1;
        for (k = 0; k < n; k++) c->v[k] = g4__jt_vint(start + k * step);
        c->n = (size_t)n;
        *out = g4__jt_vlist(c, 0);
        return 0;
    }
    case G4__JF_NAMESPACE: case G4__JF_DICT: {
        g4__jtcoll *c = g4__jt_newcoll(R, line, 8, 1);
        if (!c) return -1;
        if (A->n > 1) return g4__jt_fail(R, line, "%s expected at most 1 positional argument", f->i == G4__JF_DICT ? "dict" : "namespace");
        if (A->n == 1) {
            const g4__jtcoll *d;
            size_t j;
            if (A->v[0].t != G4__JV_DICT) return g4__jt_fail(R, line, "unsupported: %s() from a '%s'", f->i == G4__JF_DICT ? "dict" : "namespace", g4__jt_typename(&A->v[0]));
            d = (const g4__jtcoll *)A->v[0].p;
            for (j = 0; j < d->n; j++)
                if (g4__jt_dset(R, line, c, &d->k[j], &d->v[j])) return -1;
        }
        for (i = 0; i < A->nk; i++) {
            g4__jtv k = g4__jt_vstr(A->kn[i], A->kl[i]);
            if (f->i == G4__JF_NAMESPACE && A->kl[i] && A->kn[i][0] == '_')
                return g4__jt_fail(R, line, "chat templates cannot store underscore-prefixed attributes on a namespace");
            if (g4__jt_dset(R, line, c, &k, &A->kv[i])) return -1;
        }
        *out = f->i == G4__JF_DICT ? g4__jt_vdict(c) : g4__jt_v(G4__JV_NS);
        out->p = c;
        return 0;
    }
    case G4__JF_RAISE: {
        g4__jtv s = g4__jt_vstr("", 0);
        if (A->n >= 1 && g4__jt_tostr(R, line, &A->v[0], &s)) return -1;
        return g4__jt_fail(R, line, "raise_exception: %.*s", (int)(s.n > 400 ? 400 : s.n), s.s);
    }
    case G4__JF_STRFTIME: {
        char buf[256];
        time_t now = time(NULL);
        struct tm *tm = localtime(&now);
        size_t len;
        char *d;
        if (A->n != 1 || g4__jt_need_str(R, line, &A->v[0], "strftime_now's format")) return -1;
        len = tm ? strftime(buf, sizeof buf, A->v[0].s, tm) : 0;
        if (!(d = g4__jt_newstr(R, line, len, out))) return -1;
        memcpy(d, buf, len);
        return 0;
    }
    default: return g4__jt_fail(R, line, "unsupported function '%s'", f->s ? f->s : "?");
    }
}

/* ---- filters (jinja2's filters.py, with transformers' tojson) */

static int g4__jt_filter_apply(g4__jtr *R, int line, const char *nm, size_t nl, const g4__jtv *v, g4__jtargs *A, g4__jtv *out);

/* item.a.b (jinja2's attribute= arguments: dotted, integer parts index). */
static int g4__jt_attrpath(g4__jtr *R, int line, const g4__jtv *v, const g4__jtv *path, g4__jtv *out) {
    size_t i = 0;
    g4__jtv cur = *v;
    if (path->t == G4__JV_INT) return g4__jt_getitem(R, line, v, path, out);
    if (g4__jt_need_str(R, line, path, "attribute")) return -1;
    while (i <= path->n) {
        size_t j = i, k;
        int digits = 1;
        g4__jtv key, next;
        while (j < path->n && path->s[j] != '.') j++;
        for (k = i; k < j; k++) digits &= g4__jt_isdigit(path->s[k]);
        if (digits && j > i) {
            int64_t x = 0;
            for (k = i; k < j && x < INT64_MAX / 10 - 10; k++) x = x * 10 + (path->s[k] - '0');
            key = g4__jt_vint(x);
        } else key = g4__jt_vstr(path->s + i, j - i);
        if (g4__jt_getitem(R, line, &cur, &key, &next)) return -1;
        cur = next;
        i = j + 1;
    }
    *out = cur;
    return 0;
}

static int g4__jt_less_ci(g4__jtr *R, int line, const g4__jtv *a, const g4__jtv *b, int *res) {
    return g4__jt_less_plain(R, line, a, b, res);
}

/* sorted copy of items by key (attribute path or the item), jinja2's sort/dictsort/min/max */
static int g4__jt_sorted(g4__jtr *R, int line, const g4__jtcoll *items, const g4__jtv *attr, int case_sensitive, int reverse,
                         int by_value_of_pair, g4__jtcoll **out) {
    g4__jtcoll *c = g4__jt_newcoll(R, line, items->n, 0);
    g4__jtv *keys = (g4__jtv *)g4__jt_ralloc(R, line, (items->n ? items->n : 1) * sizeof *keys);
    size_t i;
    if (!c || !keys) return -1;
    for (i = 0; i < items->n; i++) {
        g4__jtv k = items->v[i];
        if (by_value_of_pair >= 0) k = ((const g4__jtcoll *)items->v[i].p)->v[by_value_of_pair];
        else if (attr && g4__jt_attrpath(R, line, &items->v[i], attr, &k)) return -1;
        if (g4__jt_sortkey(R, line, &k, case_sensitive, &keys[i])) return -1;
        c->v[i] = items->v[i];
    }
    c->n = items->n;
    if (g4__jt_sortpairs(R, line, keys, c->v, c->n, g4__jt_less_ci, reverse)) return -1;
    *out = c;
    return 0;
}

static int g4__jt_boolarg(const g4__jtv *v) { return v && g4__jt_truthy(v); }

static int g4__jt_filter_apply(g4__jtr *R, int line, const char *nm, size_t nl, const g4__jtv *v, g4__jtargs *A, g4__jtv *out) {
    const g4__jtv *x, *y, *z;
    g4__jtcoll *items, *c;
    g4__jtv s;
    size_t i;
#define G4__JT_IS(lit) (nl == sizeof(lit) - 1 && memcmp(nm, lit, nl) == 0)
#define G4__JT_CHECK(maxpos) do { if (g4__jt_argcheck(R, line, A, maxpos, "filter", nm, nl)) return -1; } while (0)
    if (G4__JT_IS("safe")) { G4__JT_CHECK(0); *out = *v; return 0; }
    if (G4__JT_IS("default") || G4__JT_IS("d")) {
        x = g4__jt_arg(A, 0, "default_value");
        y = g4__jt_arg(A, 1, "boolean");
        G4__JT_CHECK(2);
        if (v->t == G4__JV_UNDEF || (g4__jt_boolarg(y) && !g4__jt_truthy(v))) *out = x ? *x : g4__jt_vstr("", 0);
        else *out = *v;
        return 0;
    }
    if (G4__JT_IS("length") || G4__JT_IS("count")) {
        int64_t n = 0;
        G4__JT_CHECK(0);
        if (g4__jt_len(R, line, v, &n)) return -1;
        *out = g4__jt_vint(n);
        return 0;
    }
    if (G4__JT_IS("string")) { G4__JT_CHECK(0); return g4__jt_tostr(R, line, v, out); }
    if (G4__JT_IS("upper") || G4__JT_IS("lower") || G4__JT_IS("capitalize") || G4__JT_IS("title")) {
        G4__JT_CHECK(0);
        if (g4__jt_tostr(R, line, v, &s)) return -1;
        return g4__jt_case(R, line, &s, nm[0] == 'u' ? 'u' : nm[0] == 'l' ? 'l' : nm[0] == 'c' ? 'c' : 'T', out);
    }
    if (G4__JT_IS("trim")) {
        x = g4__jt_arg(A, 0, "chars");
        G4__JT_CHECK(1);
        if (x && x->t == G4__JV_NONE) x = NULL;
        if (x && g4__jt_need_str(R, line, x, "trim's chars")) return -1;
        if (g4__jt_tostr(R, line, v, &s)) return -1;
        *out = g4__jt_strip(&s, x, 3);
        return 0;
    }
    if (G4__JT_IS("replace")) {
        int64_t cnt = -1;
        g4__jtv o, n2;
        x = g4__jt_arg(A, 0, "old");
        y = g4__jt_arg(A, 1, "new");
        z = g4__jt_arg(A, 2, "count");
        G4__JT_CHECK(3);
        if (!x || !y) return g4__jt_fail(R, line, "filter 'replace' needs old and new");
        if (z && z->t != G4__JV_NONE) { if (g4__jt_need_int(R, line, z, "replace's count")) return -1; cnt = z->i; }
        if (g4__jt_tostr(R, line, v, &s) || g4__jt_tostr(R, line, x, &o) || g4__jt_tostr(R, line, y, &n2)) return -1;
        return g4__jt_replace(R, line, &s, &o, &n2, cnt, out);
    }
    if (G4__JT_IS("escape") || G4__JT_IS("e")) {
        g4__jtsb b;
        G4__JT_CHECK(0);
        memset(&b, 0, sizeof b);
        b.R = R;
        b.line = line;
        if (g4__jt_tostr(R, line, v, &s)) return -1;
        for (i = 0; i < s.n; i++) {
            const char *e = s.s[i] == '&' ? "&amp;" : s.s[i] == '<' ? "&lt;" : s.s[i] == '>' ? "&gt;" : s.s[i] == '"' ? "&#34;" : s.s[i] == '\'' ? "&#39;" : NULL;
            if (e ? g4__jt_sb_str(&b, e) : g4__jt_sb_add(&b, s.s + i, 1)) return -1;
        }
        *out = g4__jt_sb_val(&b);
        return 0;
    }
    if (G4__JT_IS("tojson")) {
        g4__jtjson o;
        g4__jtsb b;
        char ind[64];
        memset(&o, 0, sizeof o);
        memset(&b, 0, sizeof b);
        b.R = R;
        b.line = line;
        x = g4__jt_arg(A, -1, "ensure_ascii");
        y = g4__jt_arg(A, 0, "indent");
        z = g4__jt_arg(A, -1, "separators");
        o.ascii = g4__jt_boolarg(x);
        o.sort_keys = g4__jt_boolarg(g4__jt_arg(A, -1, "sort_keys"));
        G4__JT_CHECK(1);
        o.item_sep = ", ";
        o.key_sep = ": ";
        if (y && y->t != G4__JV_NONE) {
            if (y->t == G4__JV_STR) { o.indent = y->s; o.indent_n = y->n; }
            else {
                int64_t w;
                if (g4__jt_need_int(R, line, y, "tojson's indent")) return -1;
                w = y->i < 0 ? 0 : y->i > 32 ? 32 : y->i;
                memset(ind, ' ', (size_t)w);
                o.indent = ind;
                o.indent_n = (size_t)w;
            }
            o.item_sep = ",";
        }
        if (z && z->t != G4__JV_NONE) {
            const g4__jtcoll *sp = z->t == G4__JV_LIST ? (const g4__jtcoll *)z->p : NULL;
            if (!sp || sp->n != 2 || sp->v[0].t != G4__JV_STR || sp->v[1].t != G4__JV_STR)
                return g4__jt_fail(R, line, "tojson's separators must be two strings");
            o.item_sep = sp->v[0].s;
            o.key_sep = sp->v[1].s;
        }
        o.item_n = strlen(o.item_sep);
        o.key_n = strlen(o.key_sep);
        if (z && z->t == G4__JV_LIST) { o.item_n = ((const g4__jtcoll *)z->p)->v[0].n; o.key_n = ((const g4__jtcoll *)z->p)->v[1].n; }
        if (g4__jt_json(&b, v, &o, 0)) return -1;
        *out = g4__jt_sb_val(&b);
        return 0;
    }
    if (G4__JT_IS("first") || G4__JT_IS("last")) {
        G4__JT_CHECK(0);
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        if (items->n == 0) return g4__jt_undef_fmt(R, line, out, "No %.*s item, sequence was empty.", (int)nl, nm);
        *out = items->v[nm[0] == 'f' ? 0 : items->n - 1];
        return 0;
    }
    if (G4__JT_IS("list")) {
        G4__JT_CHECK(0);
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        if (!(c = g4__jt_newcoll(R, line, items->n, 0))) return -1;
        memcpy(c->v, items->v, items->n * sizeof *c->v);
        c->n = items->n;
        *out = g4__jt_vlist(c, 0);
        return 0;
    }
    if (G4__JT_IS("reverse")) {
        G4__JT_CHECK(0);
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        if (!(c = g4__jt_newcoll(R, line, items->n, 0))) return -1;
        for (i = 0; i < items->n; i++) c->v[i] = items->v[items->n - 1 - i];
        c->n = items->n;
        if (v->t == G4__JV_STR) return g4__jt_join(R, line, c, NULL, out);
        *out = g4__jt_vlist(c, 0);
        return 0;
    }
    if (G4__JT_IS("items")) {
        G4__JT_CHECK(0);
        if (v->t == G4__JV_UNDEF) { if (!(c = g4__jt_newcoll(R, line, 1, 0))) return -1; *out = g4__jt_vlist(c, 0); return 0; }
        if (v->t != G4__JV_DICT) return g4__jt_fail(R, line, "filter 'items' can only be used on mappings, not '%s'", g4__jt_typename(v));
        {
            g4__jtargs none;
            g4__jtv m;
            memset(&none, 0, sizeof none);
            if (g4__jt_method(R, line, v, "items", 5, &m)) return -1;
            return g4__jt_callmethod(R, line, &m, &none, out);
        }
    }
    if (G4__JT_IS("dictsort")) {
        int by_value;
        g4__jtv pairs;
        g4__jtargs none;
        x = g4__jt_arg(A, 0, "case_sensitive");
        y = g4__jt_arg(A, 1, "by");
        z = g4__jt_arg(A, 2, "reverse");
        G4__JT_CHECK(3);
        if (v->t == G4__JV_UNDEF) return g4__jt_undef_err(R, line, v);
        if (v->t != G4__JV_DICT) return g4__jt_fail(R, line, "filter 'dictsort' needs a mapping, not '%s'", g4__jt_typename(v));
        by_value = y && g4__jt_streq(y, "value");
        if (y && !by_value && !g4__jt_streq(y, "key")) return g4__jt_fail(R, line, "You can only sort by either \"key\" or \"value\"");
        memset(&none, 0, sizeof none);
        {
            g4__jtv m;
            if (g4__jt_method(R, line, v, "items", 5, &m) || g4__jt_callmethod(R, line, &m, &none, &pairs)) return -1;
        }
        if (g4__jt_sorted(R, line, (const g4__jtcoll *)pairs.p, NULL, g4__jt_boolarg(x), g4__jt_boolarg(z), by_value, &c)) return -1;
        *out = g4__jt_vlist(c, 0);
        return 0;
    }
    if (G4__JT_IS("sort")) {
        x = g4__jt_arg(A, 0, "reverse");
        y = g4__jt_arg(A, 1, "case_sensitive");
        z = g4__jt_arg(A, 2, "attribute");
        G4__JT_CHECK(3);
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        if (g4__jt_sorted(R, line, items, z && z->t != G4__JV_NONE ? z : NULL, g4__jt_boolarg(y), g4__jt_boolarg(x), -1, &c)) return -1;
        *out = g4__jt_vlist(c, 0);
        return 0;
    }
    if (G4__JT_IS("min") || G4__JT_IS("max")) {
        x = g4__jt_arg(A, 0, "case_sensitive");
        y = g4__jt_arg(A, 1, "attribute");
        G4__JT_CHECK(2);
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        if (items->n == 0) return g4__jt_undef_fmt(R, line, out, "No aggregated item, sequence was empty.");
        if (g4__jt_sorted(R, line, items, y && y->t != G4__JV_NONE ? y : NULL, g4__jt_boolarg(x), 0, -1, &c)) return -1;
        /* min: the first of the smallest; max: the first of the largest (Python's max keeps the first) */
        if (nm[1] == 'i') *out = c->v[0];
        else {
            g4__jtcoll *rc;
            if (g4__jt_sorted(R, line, items, y && y->t != G4__JV_NONE ? y : NULL, g4__jt_boolarg(x), 1, -1, &rc)) return -1;
            *out = rc->v[0];
        }
        return 0;
    }
    if (G4__JT_IS("unique")) {
        x = g4__jt_arg(A, 0, "case_sensitive");
        y = g4__jt_arg(A, 1, "attribute");
        G4__JT_CHECK(2);
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        {
            g4__jtcoll *seen = g4__jt_newcoll(R, line, items->n, 0);
            if (!(c = g4__jt_newcoll(R, line, items->n, 0)) || !seen) return -1;
            for (i = 0; i < items->n; i++) {
                g4__jtv k = items->v[i], kk;
                size_t j;
                if (y && y->t != G4__JV_NONE && g4__jt_attrpath(R, line, &items->v[i], y, &k)) return -1;
                if (g4__jt_sortkey(R, line, &k, g4__jt_boolarg(x), &kk)) return -1;
                for (j = 0; j < seen->n; j++)
                    if (g4__jt_eq(&seen->v[j], &kk)) break;
                if (j < seen->n) continue;
                seen->v[seen->n++] = kk;
                c->v[c->n++] = items->v[i];
            }
        }
        *out = g4__jt_vlist(c, 0);
        return 0;
    }
    if (G4__JT_IS("join")) {
        g4__jtv sep = g4__jt_vstr("", 0);
        x = g4__jt_arg(A, 0, "d");
        y = g4__jt_arg(A, 1, "attribute");
        G4__JT_CHECK(2);
        if (x && g4__jt_tostr(R, line, x, &sep)) return -1;
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        if (y && y->t != G4__JV_NONE) {
            if (!(c = g4__jt_newcoll(R, line, items->n, 0))) return -1;
            for (i = 0; i < items->n; i++)
                if (g4__jt_attrpath(R, line, &items->v[i], y, &c->v[i])) return -1;
            c->n = items->n;
            items = c;
        }
        return g4__jt_join(R, line, items, &sep, out);
    }
    if (G4__JT_IS("map")) {
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        if (!(c = g4__jt_newcoll(R, line, items->n, 0))) return -1;
        x = g4__jt_arg(A, -1, "attribute");
        if (x) {
            y = g4__jt_arg(A, -1, "default");
            G4__JT_CHECK(0);
            for (i = 0; i < items->n; i++) {
                if (g4__jt_attrpath(R, line, &items->v[i], x, &c->v[i])) return -1;
                if (y && c->v[i].t == G4__JV_UNDEF) c->v[i] = *y;
            }
        } else {
            g4__jtargs sub;
            if (A->n < 1 || A->v[0].t != G4__JV_STR) return g4__jt_fail(R, line, "map needs a filter name or attribute=");
            for (i = 0; i < items->n; i++) {
                sub = *A;
                sub.n = A->n - 1;
                memmove(sub.v, A->v + 1, (size_t)sub.n * sizeof *sub.v);
                sub.used = 0;
                if (g4__jt_filter_apply(R, line, A->v[0].s, A->v[0].n, &items->v[i], &sub, &c->v[i])) return -1;
            }
        }
        c->n = items->n;
        *out = g4__jt_vlist(c, 0);
        return 0;
    }
    if (G4__JT_IS("select") || G4__JT_IS("reject") || G4__JT_IS("selectattr") || G4__JT_IS("rejectattr")) {
        int attr = nl > 6, keep_true = nm[0] == 's', first_test = attr ? 1 : 0;
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        if (!(c = g4__jt_newcoll(R, line, items->n, 0))) return -1;
        if (attr && (A->n < 1)) return g4__jt_fail(R, line, "%.*s needs an attribute", (int)nl, nm);
        if (A->nk) return g4__jt_fail(R, line, "%.*s takes no keyword arguments", (int)nl, nm);
        for (i = 0; i < items->n; i++) {
            g4__jtv it = items->v[i];
            int r;
            if (attr && g4__jt_attrpath(R, line, &items->v[i], &A->v[0], &it)) return -1;
            if (A->n > first_test) {
                g4__jtargs sub;
                if (A->v[first_test].t != G4__JV_STR) return g4__jt_fail(R, line, "%.*s: the test name must be a string", (int)nl, nm);
                memset(&sub, 0, sizeof sub);
                sub.n = A->n - first_test - 1;
                memcpy(sub.v, A->v + first_test + 1, (size_t)sub.n * sizeof *sub.v);
                if (g4__jt_test(R, line, A->v[first_test].s, A->v[first_test].n, &it, &sub, &r)) return -1;
            } else r = g4__jt_truthy(&it);
            if (r == keep_true) c->v[c->n++] = items->v[i];
        }
        *out = g4__jt_vlist(c, 0);
        return 0;
    }
    if (G4__JT_IS("sum")) {
        g4__jtv acc;
        x = g4__jt_arg(A, 0, "attribute");
        y = g4__jt_arg(A, 1, "start");
        G4__JT_CHECK(2);
        acc = y ? *y : g4__jt_vint(0);
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        for (i = 0; i < items->n; i++) {
            g4__jtv it = items->v[i];
            if (x && x->t != G4__JV_NONE && g4__jt_attrpath(R, line, &items->v[i], x, &it)) return -1;
            if (g4__jt_binop_eval(R, line, '+', &acc, &it, &acc)) return -1;
        }
        *out = acc;
        return 0;
    }
    if (G4__JT_IS("abs")) {
        G4__JT_CHECK(0);
        if (v->t == G4__JV_FLOAT) *out = g4__jt_vfloat(fabs(v->f));
        else if (v->t == G4__JV_INT || v->t == G4__JV_BOOL) {
            if (v->i == INT64_MIN) return g4__jt_ovf(R, line);
            *out = g4__jt_vint(v->i < 0 ? -v->i : v->i);
        } else return g4__jt_fail(R, line, "bad operand type for abs(): '%s'", g4__jt_typename(v));
        return 0;
    }
    if (G4__JT_IS("int") || G4__JT_IS("float")) {
        x = g4__jt_arg(A, 0, "default");
        G4__JT_CHECK(nm[0] == 'i' ? 2 : 1);
        if (nm[0] == 'i' && A->n > 1 && !(A->v[1].t == G4__JV_INT && A->v[1].i == 10))
            return g4__jt_fail(R, line, "unsupported: int filter with a base other than 10");
        if (v->t == G4__JV_INT || v->t == G4__JV_BOOL) { *out = nm[0] == 'i' ? g4__jt_vint(v->i) : g4__jt_vfloat((double)v->i); return 0; }
        if (v->t == G4__JV_FLOAT) {
            if (nm[0] == 'f') { *out = *v; return 0; }
            if (v->f != v->f || v->f >= 9.2e18 || v->f <= -9.2e18) return g4__jt_ovf(R, line);
            *out = g4__jt_vint((int64_t)v->f);
            return 0;
        }
        if (v->t == G4__JV_STR) {
            g4__jtv t = g4__jt_strip(v, NULL, 3);
            char buf[64];
            g4__json j;
            g4__jnode nd;
            char jerr[G4_ERROR_MAX];
            size_t k, bl = 0;
            for (k = 0; k < t.n && bl + 1 < sizeof buf; k++)
                if (t.s[k] != '_') buf[bl++] = t.s[k];
            buf[bl] = 0;
            memset(&j, 0, sizeof j);
            j.src = buf[0] == '+' ? buf + 1 : buf;
            j.len = strlen(j.src);
            j.name = "int";
            j.err = jerr;
            if (t.n < sizeof buf && j.len && g4__json_number(&j, &nd) == 0 && j.pos == j.len) {
                if (nm[0] == 'f') { *out = g4__jt_vfloat(nd.num); return 0; }
                if (nd.is_int) { *out = g4__jt_vint(nd.ival); return 0; }
                /* jinja2's int filter: int(s) fails, then int(float(s)) */
                if (nd.num == nd.num && nd.num < 9.2e18 && nd.num > -9.2e18) { *out = g4__jt_vint((int64_t)nd.num); return 0; }
            }
        }
        *out = x ? *x : nm[0] == 'i' ? g4__jt_vint(0) : g4__jt_vfloat(0.0);
        return 0;
    }
    if (G4__JT_IS("round")) {
        int64_t prec = 0;
        char buf[400];
        double r;
        x = g4__jt_arg(A, 0, "precision");
        y = g4__jt_arg(A, 1, "method");
        G4__JT_CHECK(2);
        if (x) { if (g4__jt_need_int(R, line, x, "round's precision")) return -1; prec = x->i; }
        if (!g4__jt_isnum(v)) return g4__jt_fail(R, line, "filter 'round' needs a number, not '%s'", g4__jt_typename(v));
        if (y && !g4__jt_streq(y, "common")) {
            double p = pow(10.0, (double)prec), f = g4__jt_num(v) * p;
            if (g4__jt_streq(y, "floor")) r = floor(f) / p;
            else if (g4__jt_streq(y, "ceil")) r = ceil(f) / p;
            else return g4__jt_fail(R, line, "method must be common, ceil or floor");
        } else { /* Python's round(x, n): the correctly rounded decimal, ties to even */
            if (prec < 0 || prec > 300) return g4__jt_fail(R, line, "unsupported: round precision %lld", (long long)prec);
            snprintf(buf, sizeof buf, "%.*f", (int)prec, g4__jt_num(v));
            r = strtod(buf, NULL);
        }
        *out = g4__jt_vfloat(r);
        return 0;
    }
    if (G4__JT_IS("indent")) {
        g4__jtsb b;
        g4__jtv ind = g4__jt_vstr("    ", 4), lines;
        const g4__jtcoll *ls;
        int first, blank;
        char spaces[64];
        x = g4__jt_arg(A, 0, "width");
        first = g4__jt_boolarg(g4__jt_arg(A, 1, "first"));
        blank = g4__jt_boolarg(g4__jt_arg(A, 2, "blank"));
        G4__JT_CHECK(3);
        if (x && x->t == G4__JV_STR) ind = *x;
        else if (x) {
            int64_t w;
            if (g4__jt_need_int(R, line, x, "indent's width")) return -1;
            w = x->i < 0 ? 0 : x->i > 63 ? 63 : x->i;
            memset(spaces, ' ', (size_t)w);
            ind = g4__jt_vstr(spaces, (size_t)w);
        }
        memset(&b, 0, sizeof b);
        b.R = R;
        b.line = line;
        if (g4__jt_tostr(R, line, v, &s)) return -1;
        {
            g4__jtv s2;
            char *d = g4__jt_newstr(R, line, s.n + 1, &s2);
            if (!d) return -1;
            memcpy(d, s.s, s.n);
            d[s.n] = '\n';
            if (g4__jt_splitlines(R, line, &s2, &lines)) return -1;
        }
        ls = (const g4__jtcoll *)lines.p;
        if (first && g4__jt_sb_add(&b, ind.s, ind.n)) return -1;
        for (i = 0; i < ls->n; i++) {
            if (i && g4__jt_sb_add(&b, "\n", 1)) return -1;
            if (i && (blank || ls->v[i].n) && g4__jt_sb_add(&b, ind.s, ind.n)) return -1;
            if (g4__jt_sb_add(&b, ls->v[i].s, ls->v[i].n)) return -1;
        }
        *out = g4__jt_sb_val(&b);
        return 0;
    }
    if (G4__JT_IS("wordcount")) {
        g4__jtv parts;
        G4__JT_CHECK(0);
        if (g4__jt_tostr(R, line, v, &s) || g4__jt_split(R, line, &s, NULL, -1, 0, &parts)) return -1;
        *out = g4__jt_vint((int64_t)((const g4__jtcoll *)parts.p)->n);
        return 0;
    }
    if (G4__JT_IS("attr")) {
        if (!(x = g4__jt_arg(A, 0, "name")) || g4__jt_need_str(R, line, x, "attr's name")) return -1;
        G4__JT_CHECK(1);
        return g4__jt_getattr(R, line, v, x->s, x->n, out);
    }
#undef G4__JT_CHECK
#undef G4__JT_IS
    return g4__jt_fail(R, line, "unknown filter '%.*s'", (int)(nl > 60 ? 60 : nl), nm);
}

/* ---- calls */

static int g4__jt_capture_begin(g4__jtr *R, char **so, size_t *sn, size_t *sc) {
    *so = R->out;
    *sn = R->out_n;
    *sc = R->out_cap;
    R->out = NULL;
    R->out_n = R->out_cap = 0;
    return 0;
}

static g4__jtv g4__jt_capture_end(g4__jtr *R, char *so, size_t sn, size_t sc) {
    g4__jtv v = R->out ? g4__jt_vstr(R->out, R->out_n) : g4__jt_vstr("", 0);
    R->out = so;
    R->out_n = sn;
    R->out_cap = sc;
    return v;
}

static int g4__jt_step(g4__jtr *R, int line, const char *what) {
    if (++R->steps > R->max_steps)
        return g4__jt_fail(R, line, "%s: more than max_steps (%ld) loop iterations and macro calls", what, R->max_steps);
    return 0;
}

static int g4__jt_callmacro(g4__jtr *R, int line, const g4__jtv *m, g4__jtargs *A, g4__jtv *out) {
    const g4__jtn *mac = (const g4__jtn *)m->p, *p;
    g4__jtscope *sc = g4__jt_newscope(R, line, (g4__jtscope *)m->q);
    int np = 0, i, rc;
    char *so;
    size_t sn, scap;
    if (!sc) return -1;
    for (p = mac->a; p; p = p->next) np++;
    if (A->n > np) return g4__jt_fail(R, line, "macro '%.*s' takes not more than %d argument(s)", (int)mac->n, mac->s, np);
    for (i = 0; i < A->nk; i++) {
        for (p = mac->a; p; p = p->next)
            if (p->n == A->kl[i] && memcmp(p->s, A->kn[i], p->n) == 0) break;
        if (!p) return g4__jt_fail(R, line, "macro '%.*s' takes no keyword argument '%.*s'", (int)mac->n, mac->s, (int)A->kl[i], A->kn[i]);
    }
    for (p = mac->a, i = 0; p; p = p->next, i++) {
        g4__jtv v;
        const g4__jtv *given = NULL;
        int k;
        if (i < A->n) given = &A->v[i];
        for (k = 0; k < A->nk; k++)
            if (p->n == A->kl[k] && memcmp(p->s, A->kn[k], p->n) == 0) {
                if (given) return g4__jt_fail(R, line, "macro '%.*s' got multiple values for argument '%.*s'", (int)mac->n, mac->s, (int)p->n, p->s);
                given = &A->kv[k];
            }
        if (given) v = *given;
        else if (p->a) { if (g4__jt_eval(R, p->a, sc, &v)) return -1; }
        else if (g4__jt_undef_fmt(R, line, &v, "parameter '%.*s' was not provided", (int)p->n, p->s)) return -1;
        if (g4__jt_assign(R, line, sc, p->s, p->n, &v)) return -1;
    }
    if (g4__jt_step(R, line, "macro call")) return -1;
    if (++R->depth > R->max_depth)
        return g4__jt_fail(R, line, "macro calls nested deeper than max_depth (%d) in '%.*s'", R->max_depth, (int)mac->n, mac->s);
    g4__jt_capture_begin(R, &so, &sn, &scap);
    rc = g4__jt_exec(R, mac->b, sc);
    *out = g4__jt_capture_end(R, so, sn, scap);
    R->depth--;
    return rc < 0 ? -1 : 0;
}

static int g4__jt_call(g4__jtr *R, int line, const g4__jtv *f, g4__jtargs *A, g4__jtv *out) {
    switch (f->t) {
    case G4__JV_MACRO: return g4__jt_callmacro(R, line, f, A, out);
    case G4__JV_FUNC: return g4__jt_callbuiltin(R, line, f, A, out);
    case G4__JV_METHOD: return g4__jt_callmethod(R, line, f, A, out);
    case G4__JV_UNDEF: return g4__jt_undef_err(R, line, f);
    default: return g4__jt_fail(R, line, "'%s' object is not callable", g4__jt_typename(f));
    }
}

/* ---- expressions */

static int g4__jt_eval(g4__jtr *R, const g4__jtn *n, g4__jtscope *sc, g4__jtv *out) {
    g4__jtv a, b;
    g4__jtargs A;
    int line = n->line;
    if (R->failed) return -1;
    switch (n->k) {
    case G4__JN_NONE: *out = g4__jt_v(G4__JV_NONE); return 0;
    case G4__JN_TRUE: *out = g4__jt_vbool(1); return 0;
    case G4__JN_FALSE: *out = g4__jt_vbool(0); return 0;
    case G4__JN_INT: *out = g4__jt_vint(n->i); return 0;
    case G4__JN_FLOAT: *out = g4__jt_vfloat(n->f); return 0;
    case G4__JN_STR: *out = g4__jt_vstr(n->s, n->n); return 0;
    case G4__JN_NAME: {
        const g4__jtv *v = g4__jt_lookup(sc, n->s, n->n);
        int f;
        if (v) { *out = *v; return 0; }
        if ((f = g4__jt_builtin(n->s, n->n)) != 0) {
            *out = g4__jt_v(G4__JV_FUNC);
            out->i = f;
            out->s = n->s;
            return 0;
        }
        return g4__jt_undef_fmt(R, line, out, "'%.*s' is undefined", (int)(n->n > 100 ? 100 : n->n), n->s);
    }
    case G4__JN_LIST: case G4__JN_TUPLE: {
        const g4__jtn *e;
        size_t cnt = 0;
        g4__jtcoll *c;
        for (e = n->a; e; e = e->next) cnt++;
        if (!(c = g4__jt_newcoll(R, line, cnt, 0))) return -1;
        for (e = n->a; e; e = e->next)
            if (g4__jt_eval(R, e, sc, &c->v[c->n++])) return -1;
        *out = g4__jt_vlist(c, n->k == G4__JN_TUPLE);
        return 0;
    }
    case G4__JN_DICT: {
        const g4__jtn *e;
        g4__jtcoll *c = g4__jt_newcoll(R, line, 4, 1);
        if (!c) return -1;
        for (e = n->a; e; e = e->next) {
            if (g4__jt_eval(R, e->a, sc, &a) || g4__jt_eval(R, e->b, sc, &b)) return -1;
            if (a.t == G4__JV_LIST || a.t == G4__JV_DICT || a.t == G4__JV_NS)
                return g4__jt_fail(R, line, "unhashable type: '%s'", g4__jt_typename(&a));
            if (g4__jt_dset(R, line, c, &a, &b)) return -1;
        }
        *out = g4__jt_vdict(c);
        return 0;
    }
    case G4__JN_ATTR:
        if (g4__jt_eval(R, n->a, sc, &a)) return -1;
        return g4__jt_getattr(R, line, &a, n->s, n->n, out);
    case G4__JN_ITEM:
        if (g4__jt_eval(R, n->a, sc, &a)) return -1;
        if (n->b->k == G4__JN_SLICE) {
            g4__jtv s[3];
            const g4__jtn *parts[3];
            int k;
            parts[0] = n->b->a;
            parts[1] = n->b->b;
            parts[2] = n->b->c;
            for (k = 0; k < 3; k++) {
                s[k] = g4__jt_v(G4__JV_NONE);
                if (parts[k] && g4__jt_eval(R, parts[k], sc, &s[k])) return -1;
            }
            return g4__jt_slice(R, line, &a, &s[0], &s[1], &s[2], out);
        }
        if (g4__jt_eval(R, n->b, sc, &b)) return -1;
        return g4__jt_getitem(R, line, &a, &b, out);
    case G4__JN_CALL:
        if (g4__jt_eval(R, n->a, sc, &a)) return -1;
        if (a.t == G4__JV_UNDEF) return g4__jt_undef_err(R, line, &a);
        if (g4__jt_evalargs(R, n->b, n->c, sc, &A, line)) return -1;
        return g4__jt_call(R, line, &a, &A, out);
    case G4__JN_FILTER:
        if (g4__jt_eval(R, n->a, sc, &a) || g4__jt_evalargs(R, n->b, n->c, sc, &A, line)) return -1;
        return g4__jt_filter_apply(R, line, n->s, n->n, &a, &A, out);
    case G4__JN_TEST: {
        int r;
        if (g4__jt_eval(R, n->a, sc, &a) || g4__jt_evalargs(R, n->b, n->c, sc, &A, line)) return -1;
        if (g4__jt_test(R, line, n->s, n->n, &a, &A, &r)) return -1;
        *out = g4__jt_vbool(n->flag ? !r : r);
        return 0;
    }
    case G4__JN_BIN:
        if (g4__jt_eval(R, n->a, sc, &a) || g4__jt_eval(R, n->b, sc, &b)) return -1;
        return g4__jt_binop_eval(R, line, n->op, &a, &b, out);
    case G4__JN_NEG: case G4__JN_POS:
        if (g4__jt_eval(R, n->a, sc, &a)) return -1;
        if (a.t == G4__JV_UNDEF) return g4__jt_undef_err(R, line, &a);
        if (!g4__jt_isnum(&a)) return g4__jt_fail(R, line, "bad operand type for unary %c: '%s'", n->k == G4__JN_NEG ? '-' : '+', g4__jt_typename(&a));
        if (n->k == G4__JN_POS) *out = a.t == G4__JV_BOOL ? g4__jt_vint(a.i) : a;
        else if (a.t == G4__JV_FLOAT) *out = g4__jt_vfloat(-a.f);
        else if (a.i == INT64_MIN) return g4__jt_ovf(R, line);
        else *out = g4__jt_vint(-a.i);
        return 0;
    case G4__JN_NOT:
        if (g4__jt_eval(R, n->a, sc, &a)) return -1;
        *out = g4__jt_vbool(!g4__jt_truthy(&a));
        return 0;
    case G4__JN_AND: case G4__JN_OR:
        if (g4__jt_eval(R, n->a, sc, &a)) return -1;
        if (g4__jt_truthy(&a) == (n->k == G4__JN_OR)) { *out = a; return 0; }
        return g4__jt_eval(R, n->b, sc, out);
    case G4__JN_CMP: {
        const g4__jtn *o;
        if (g4__jt_eval(R, n->a, sc, &a)) return -1;
        for (o = n->b; o; o = o->next) {
            int r, c;
            if (g4__jt_eval(R, o->a, sc, &b)) return -1;
            switch (o->op) {
            case 'e': r = g4__jt_eq(&a, &b); break;
            case 'n': r = !g4__jt_eq(&a, &b); break;
            case 'i': case 'I':
                if (g4__jt_contains(R, line, &a, &b, &r)) return -1;
                if (o->op == 'I') r = !r;
                break;
            default: {
                const char *opn = o->op == '<' ? "<" : o->op == '>' ? ">" : o->op == 'l' ? "<=" : ">=";
                if (g4__jt_cmp(R, line, &a, &b, opn, &c)) return -1;
                r = c == 2 ? 0 : o->op == '<' ? c < 0 : o->op == '>' ? c > 0 : o->op == 'l' ? c <= 0 : c >= 0;
            }
            }
            if (!r) { *out = g4__jt_vbool(0); return 0; }
            a = b;
        }
        *out = g4__jt_vbool(1);
        return 0;
    }
    case G4__JN_COND:
        if (g4__jt_eval(R, n->a, sc, &a)) return -1;
        if (g4__jt_truthy(&a)) return g4__jt_eval(R, n->b, sc, out);
        if (n->c) return g4__jt_eval(R, n->c, sc, out);
        *out = g4__jt_vundef("the inline if-expression evaluated to false and no else section was defined");
        return 0;
    default: return g4__jt_fail(R, line, "internal: not an expression");
    }
}

/* ---- statements */

static int g4__jt_put(g4__jtr *R, int line, const char *s, size_t n) {
    g4__jtsb b;
    b.R = R;
    b.line = line;
    b.p = R->out;
    b.n = R->out_n;
    b.cap = R->out_cap;
    if (g4__jt_sb_add(&b, s, n)) return -1;
    R->out = b.p;
    R->out_n = b.n;
    R->out_cap = b.cap;
    return 0;
}

/* Binds a value to an assignment target (name, ns.attr or a tuple of names). */
static int g4__jt_bind(g4__jtr *R, int line, const g4__jtn *t, const g4__jtv *v, g4__jtscope *sc) {
    if (t->k == G4__JN_NAME) return g4__jt_assign(R, line, sc, t->s, t->n, v);
    if (t->k == G4__JN_ATTR) {
        const g4__jtv *ns = g4__jt_lookup(sc, t->a->s, t->a->n);
        g4__jtv key = g4__jt_vstr(t->s, t->n);
        if (!ns || ns->t != G4__JV_NS) return g4__jt_fail(R, line, "cannot assign attribute on non-namespace object");
        if (t->n && t->s[0] == '_') return g4__jt_fail(R, line, "chat templates cannot store underscore-prefixed attributes on a namespace");
        return g4__jt_dset(R, line, (g4__jtcoll *)ns->p, &key, v);
    }
    {
        const g4__jtn *e;
        g4__jtcoll *items;
        size_t want = 0, i = 0;
        for (e = t->a; e; e = e->next) want++;
        if (g4__jt_tolist(R, line, v, &items)) return -1;
        if (items->n != want)
            return g4__jt_fail(R, line, items->n > want ? "too many values to unpack (expected %lu)" : "not enough values to unpack (expected %lu)", (unsigned long)want);
        for (e = t->a; e; e = e->next, i++)
            if (g4__jt_assign(R, line, sc, e->s, e->n, &items->v[i])) return -1;
        return 0;
    }
}

static int g4__jt_filters(g4__jtr *R, const g4__jtn *f, g4__jtscope *sc, g4__jtv *v) {
    for (; f; f = f->next) {
        g4__jtargs A;
        if (g4__jt_evalargs(R, f->b, f->c, sc, &A, f->line) || g4__jt_filter_apply(R, f->line, f->s, f->n, v, &A, v)) return -1;
    }
    return 0;
}

static int g4__jt_runfor(g4__jtr *R, const g4__jtn *n, g4__jtscope *sc) {
    g4__jtv it, lv;
    g4__jtcoll *items;
    g4__jtloop *L;
    g4__jtscope *is = NULL;
    size_t i;
    if (g4__jt_eval(R, n->b, sc, &it)) return -1;
    if (g4__jt_tolist(R, n->line, &it, &items)) return -1;
    if (n->e) { /* {% for x in xs if cond %}: filtered first (loop.length counts what is kept) */
        g4__jtcoll *kept = g4__jt_newcoll(R, n->line, items->n, 0);
        if (!kept) return -1;
        g4__jtscope *fs = g4__jt_newscope(R, n->line, sc);
        if (!fs) return -1;
        for (i = 0; i < items->n; i++) {
            g4__jtv c;
            fs->n = 0;
            if (g4__jt_step(R, n->line, "for loop") || g4__jt_bind(R, n->line, n->a, &items->v[i], fs) ||
                g4__jt_eval(R, n->e, fs, &c))
                return -1;
            if (g4__jt_truthy(&c)) kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    if (!(L = (g4__jtloop *)g4__jt_ralloc(R, n->line, sizeof *L))) return -1;
    L->items = items;
    L->node = n;
    lv = g4__jt_v(G4__JV_LOOP);
    lv.p = L;
    /* one scope for the loop body, emptied at each iteration: what the body
       sets is fresh every time and gone after the loop, as in jinja2 */
    if (items->n && !(is = g4__jt_newscope(R, n->line, sc))) return -1;
    for (i = 0; i < items->n; i++) {
        int rc;
        L->i = i;
        is->n = 0;
        if (g4__jt_step(R, n->line, "for loop") || g4__jt_bind(R, n->line, n->a, &items->v[i], is) ||
            g4__jt_assign(R, n->line, is, "loop", 4, &lv))
            return -1;
        rc = g4__jt_exec(R, n->c, is);
        if (rc < 0) return -1;
        if (rc == 1) break;
    }
    if (items->n == 0 && n->d) {
        g4__jtscope *es = g4__jt_newscope(R, n->line, sc);
        if (!es) return -1;
        return g4__jt_exec(R, n->d, es);
    }
    return 0;
}

/* Runs a statement list; 0, -1 (error), 1 (break) or 2 (continue). */
static int g4__jt_exec(g4__jtr *R, const g4__jtn *n, g4__jtscope *sc) {
    for (; n; n = n->next) {
        g4__jtv v;
        int rc = 0;
        char *so;
        size_t sn, scap;
        if (R->failed) return -1;
        switch (n->k) {
        case G4__JS_TEXT: rc = g4__jt_put(R, n->line, n->s, n->n); break;
        case G4__JS_OUT:
            if (g4__jt_eval(R, n->a, sc, &v) || g4__jt_tostr(R, n->line, &v, &v)) return -1;
            rc = g4__jt_put(R, n->line, v.s, v.n);
            break;
        case G4__JS_IF:
            if (g4__jt_eval(R, n->a, sc, &v)) return -1;
            rc = g4__jt_exec(R, g4__jt_truthy(&v) ? n->b : n->c, sc);
            break;
        case G4__JS_FOR: rc = g4__jt_runfor(R, n, sc); break;
        case G4__JS_SET:
            if (g4__jt_eval(R, n->b, sc, &v)) return -1;
            rc = g4__jt_bind(R, n->line, n->a, &v, sc);
            break;
        case G4__JS_SETBLOCK:
            g4__jt_capture_begin(R, &so, &sn, &scap);
            rc = g4__jt_exec(R, n->b, sc);
            v = g4__jt_capture_end(R, so, sn, scap);
            if (rc < 0 || g4__jt_filters(R, n->c, sc, &v)) return -1;
            rc = g4__jt_bind(R, n->line, n->a, &v, sc);
            break;
        case G4__JS_MACRO:
            v = g4__jt_v(G4__JV_MACRO);
            v.p = (void *)n;
            v.q = sc;
            rc = g4__jt_assign(R, n->line, sc, n->s, n->n, &v);
            break;
        case G4__JS_BREAK: return 1;
        case G4__JS_CONTINUE: return 2;
        case G4__JS_FILTER:
            g4__jt_capture_begin(R, &so, &sn, &scap);
            rc = g4__jt_exec(R, n->b, sc);
            v = g4__jt_capture_end(R, so, sn, scap);
            if (rc < 0 || g4__jt_filters(R, n->a, sc, &v) || g4__jt_tostr(R, n->line, &v, &v)) return -1;
            rc = g4__jt_put(R, n->line, v.s, v.n);
            break;
        case G4__JS_WITH: case G4__JS_GEN: {
            g4__jtscope *ws = g4__jt_newscope(R, n->line, sc);
            const g4__jtn *s;
            if (!ws) return -1;
            for (s = n->k == G4__JS_WITH ? n->a : NULL; s; s = s->next)
                if (g4__jt_eval(R, s->b, sc, &v) || g4__jt_bind(R, s->line, s->a, &v, ws)) return -1;
            rc = g4__jt_exec(R, n->b, ws);
            break;
        }
        default: return g4__jt_fail(R, n->line, "internal: not a statement");
        }
        if (rc) return rc;
    }
    return 0;
}

/* ---- the API */

#define G4__JT_MAX_SOURCE ((size_t)16 << 20) /* template text */

static int g4__jt_fromjson(g4__jtr *R, const g4__json *j, int nd, g4__jtv *out) {
    const g4__jnode *n = &j->nodes[nd];
    switch (n->type) {
    case G4__JNULL: *out = g4__jt_v(G4__JV_NONE); return 0;
    case G4__JTRUE: *out = g4__jt_vbool(1); return 0;
    case G4__JFALSE: *out = g4__jt_vbool(0); return 0;
    case G4__JNUM: *out = n->is_int ? g4__jt_vint(n->ival) : g4__jt_vfloat(n->num); return 0;
    case G4__JSTR: *out = g4__jt_vstr(n->str, n->len); return 0;
    default: {
        int obj = n->type == G4__JOBJ, c;
        g4__jtcoll *col = g4__jt_newcoll(R, 0, (size_t)n->count, obj);
        if (!col) return -1;
        for (c = n->child; c >= 0; c = j->nodes[c].next) {
            g4__jtv v;
            if (g4__jt_fromjson(R, j, c, &v)) return -1;
            if (obj) {
                g4__jtv k = g4__jt_vstr(j->nodes[c].key, j->nodes[c].keylen);
                if (g4__jt_dset(R, 0, col, &k, &v)) return -1; /* a repeated name: the last wins, as Python's json */
            } else if (g4__jt_listpush(R, 0, col, &v)) return -1;
        }
        *out = obj ? g4__jt_vdict(col) : g4__jt_vlist(col, 0);
        return 0;
    }
    }
}

/* A message as apply_chat_template passes it: null members dropped, the
   reasoning under "thinking" (first) and "reasoning_content" (last). */
static int g4__jt_message(g4__jtr *R, const g4__jtv *m, g4__jtv *out) {
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    const g4__jtcoll *src = (const g4__jtcoll *)m->p;
    g4__jtcoll *d = g4__jt_newcoll(R, 0, src->n + 2, 1), *res;
    const g4__jtv *reasoning = NULL;
    size_t i;
    int f;
    if (!d) return -1;
    for (i = 0; i < src->n; i++)
        if (src->v[i].t != G4__JV_NONE && g4__jt_push(R, 0, d, &src->k[i], &src->v[i])) return -1;
    for (f = 0; f < 3 && !reasoning; f++) {
        g4__jtv k = g4__jt_vstr(fields[f], strlen(fields[f]));
        reasoning = g4__jt_dget(d, &k);
    }
    if (!reasoning) { *out = g4__jt_vdict(d); return 0; }
    if (!(res = g4__jt_newcoll(R, 0, d->n + 2, 1))) return -1;
    {
        g4__jtv kt = g4__jt_vstr("thinking", 8), kr = g4__jt_vstr("reasoning_content", 17), r = *reasoning;
        if (g4__jt_push(R, 0, res, &kt, &r)) return -1;
        for (i = 0; i < d->n; i++)
            if (g4__jt_dset(R, 0, res, &d->k[i], &d->v[i])) return -1;
        if (g4__jt_dset(R, 0, res, &kr, &r)) return -1;
    }
    *out = g4__jt_vdict(res);
    return 0;
}

G4__DEF g4_template_options g4_template_options_init(void) {
    g4_template_options o;
    memset(&o, 0, sizeof o);
    o.add_generation_prompt = 1;
    o.enable_thinking = 0;
    o.max_output = (size_t)16 << 20;
    o.max_memory = (size_t)256 << 20;
    o.max_steps = 1000000;
    o.max_depth = 64;
    return o;
}

G4__DEF void g4_template_free(g4_template *t) {
    g4__jtmpl *m;
    if (!t) return;
    m = (g4__jtmpl *)t->impl;
    if (m) {
        g4__jt_arena_free(&m->a);
        G4_FREE(m);
    }
    t->impl = NULL;
}

G4__DEF g4_result g4_template_parse(g4_template *t, const char *src, size_t len, const char *name) {
    g4__jtmpl *m;
    g4__jtlex L;
    g4__jtp P;
    char *norm;
    size_t i, k = 0;
    if (!t) return G4_ERR_INPUT;
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name ? name : "template");
    if (!src) { g4__seterr(t->error, "%s: no template text", t->name); return G4_ERR_INPUT; }
    if (len > G4__JT_MAX_SOURCE) { g4__seterr(t->error, "%s: template larger than 16 MiB", t->name); return G4_ERR_INPUT; }
    if ((i = g4__utf8_bad((const unsigned char *)src, len)) < len) { /* transformers reads chat_template.jinja with open(encoding="utf-8") */
        size_t j, line = 1;
        for (j = 0; j < i; j++) line += src[j] == '\n' || (src[j] == '\r' && (j + 1 == i || src[j + 1] != '\n'));
        g4__seterr(t->error, "%s: line %lu: invalid UTF-8 at byte offset %lu (byte 0x%02X)", t->name, (unsigned long)line,
                   (unsigned long)i, (unsigned)(unsigned char)src[i]);
        return G4_ERR_INPUT;
    }
    if (!(m = (g4__jtmpl *)G4_MALLOC(sizeof *m))) { g4__seterr(t->error, "%s: out of memory", t->name); return G4_ERR_NOMEM; }
    memset(m, 0, sizeof *m);
    m->a.limit = (size_t)64 * len + ((size_t)1 << 20); /* tokens and nodes: a few per source byte */
    t->impl = m;
    if (!(norm = (char *)g4__jt_alloc(&m->a, len + 1))) {
        g4_template_free(t);
        g4__seterr(t->error, "%s: out of memory", t->name);
        return G4_ERR_NOMEM;
    }
    for (i = 0; i < len; i++) { /* jinja2: newlines normalized, one trailing newline dropped */
        if (src[i] == '\r') { norm[k++] = '\n'; if (i + 1 < len && src[i + 1] == '\n') i++; }
        else norm[k++] = src[i];
    }
    if (k && norm[k - 1] == '\n') k--;
    norm[k] = 0;
    memset(&L, 0, sizeof L);
    L.a = &m->a;
    L.src = norm;
    L.len = k;
    L.name = t->name;
    L.err = t->error;
    memset(&P, 0, sizeof P);
    P.a = &m->a;
    P.name = t->name;
    P.err = t->error;
    if (g4__jt_lex(&L) == 0) {
        P.t = L.tok;
        if (g4__jt_body(&P, NULL, NULL, 0, &m->body) == 0) return G4_OK;
    }
    if (!t->error[0]) g4__seterr(t->error, "%s: cannot parse the template", t->name);
    {
        char keep[G4_ERROR_MAX];
        memcpy(keep, t->error, sizeof keep);
        g4_template_free(t);
        memcpy(t->error, keep, sizeof keep);
    }
    return strstr(t->error, "out of memory") ? G4_ERR_NOMEM : G4_ERR_INPUT;
}

/* A special token from tokenizer_config.json: a string or {"content": ...}.
   Nonzero (and an error in err) when it holds a lone surrogate: Python's json
   reads it, but as text it has no UTF-8 form (tokenizers cannot take it). */
static int g4__jt_cfgtoken(const g4__json *j, const char *key, char *dst, size_t cap, const char *file, char *err) {
    int n = g4__jget(j, 0, key);
    if (n >= 0 && j->nodes[n].type == G4__JOBJ) n = g4__jget(j, n, "content");
    if (n >= 0 && j->nodes[n].type == G4__JSTR && (j->nodes[n].lone & G4__JLONE_STR)) {
        g4__seterr(err, "%s: %s holds a lone surrogate (a \\ud800..\\udfff escape), which is not text", file, key);
        return -1;
    }
    if (n >= 0 && j->nodes[n].type == G4__JSTR && j->nodes[n].len < cap && !memchr(j->nodes[n].str, 0, j->nodes[n].len))
        memcpy(dst, j->nodes[n].str, j->nodes[n].len + 1);
    return 0;
}

G4__DEF g4_result g4_template_load(g4_template *t, const char *dir) {
    char path[4096], cfgname[4096];
    char *text = NULL, *cfg = NULL;
    size_t tlen = 0, clen = 0;
    char tok[4][128];
    g4_result r;
    g4__json j;
    int have_json = 0;
    if (!t) return G4_ERR_INPUT;
    memset(t, 0, sizeof *t);
    memset(tok, 0, sizeof tok);
    if (!dir) { g4__seterr(t->error, "no model directory"); return G4_ERR_INPUT; }
    snprintf(cfgname, sizeof cfgname, "%s/tokenizer_config.json", dir);
    if (g4__read_file(cfgname, &cfg, &clen, (size_t)256 << 20, t->error) == G4_OK) {
        if ((r = g4__json_parse_python(&j, cfg, clen, cfgname, t->error)) != G4_OK) { G4_FREE(cfg); return r; }
        have_json = 1;
        if (g4__jt_cfgtoken(&j, "bos_token", tok[0], 128, cfgname, t->error) ||
            g4__jt_cfgtoken(&j, "eos_token", tok[1], 128, cfgname, t->error) ||
            g4__jt_cfgtoken(&j, "pad_token", tok[2], 128, cfgname, t->error) ||
            g4__jt_cfgtoken(&j, "unk_token", tok[3], 128, cfgname, t->error)) {
            g4__json_free(&j);
            G4_FREE(cfg);
            return G4_ERR_CONFIG;
        }
    }
    t->error[0] = 0;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (g4__read_file(path, &text, &tlen, G4__JT_MAX_SOURCE, t->error) == G4_OK) {
        r = g4_template_parse(t, text, tlen, path);
        G4_FREE(text);
    } else if (have_json && g4__jget(&j, 0, "chat_template") >= 0) {
        int n = g4__jget(&j, 0, "chat_template");
        char name[4200];
        snprintf(name, sizeof name, "%s chat_template", cfgname);
        if (j.nodes[n].type == G4__JARR) { /* [{"name": ..., "template": ...}]: the "default" one */
            int c, found = -1;
            for (c = j.nodes[n].child; c >= 0; c = j.nodes[c].next) {
                int nm = g4__jget(&j, c, "name");
                if (nm >= 0 && g4__jis(&j.nodes[nm], "default")) found = g4__jget(&j, c, "template");
            }
            n = found;
            if (n < 0) {
                g4__seterr(t->error, "%s: chat_template is a list with no template named \"default\"", cfgname);
                g4__json_free(&j);
                G4_FREE(cfg);
                return G4_ERR_CONFIG;
            }
        }
        if (j.nodes[n].type != G4__JSTR) {
            g4__seterr(t->error, "%s: chat_template is %s, not a string", cfgname, g4__jtype_name(j.nodes[n].type));
            r = G4_ERR_CONFIG;
        } else if (j.nodes[n].lone & G4__JLONE_STR) { /* Python's json keeps it; it is no UTF-8 text */
            g4__seterr(t->error, "%s: chat_template holds a lone surrogate (a \\ud800..\\udfff escape), which is not text",
                       cfgname);
            r = G4_ERR_CONFIG;
        } else r = g4_template_parse(t, j.nodes[n].str, j.nodes[n].len, name);
    } else {
        g4__seterr(t->error, "%s: no chat template (no chat_template.jinja, and no chat_template in tokenizer_config.json)", dir);
        r = G4_ERR_IO;
    }
    if (have_json) g4__json_free(&j);
    G4_FREE(cfg);
    if (r == G4_OK) {
        memcpy(t->bos_token, tok[0], 128);
        memcpy(t->eos_token, tok[1], 128);
        memcpy(t->pad_token, tok[2], 128);
        memcpy(t->unk_token, tok[3], 128);
    }
    return r;
}

G4__DEF void g4_template_set_tokens(g4_template *t, const g4_tokenizer *tok) {
    char *dst[4];
    int32_t ids[4];
    int k;
    if (!t || !tok || !tok->text) return;
    dst[0] = t->bos_token; ids[0] = tok->bos;
    dst[1] = t->eos_token; ids[1] = tok->eos;
    dst[2] = t->pad_token; ids[2] = tok->pad;
    dst[3] = t->unk_token; ids[3] = tok->unk_id;
    for (k = 0; k < 4; k++) {
        int32_t id = ids[k];
        if (dst[k][0] || id < 0 || id >= tok->n_vocab || tok->text_len[id] == 0 || tok->text_len[id] >= 128) continue;
        memcpy(dst[k], tok->text + tok->text_off[id], tok->text_len[id]);
        dst[k][tok->text_len[id]] = 0;
    }
}

G4__DEF void g4_template_free_output(void *p) { G4_FREE(p); }

G4__DEF g4_result g4_template_render(const g4_template *t, const char *chat_json, size_t len,
                                     const g4_template_options *o, char **text, size_t *text_len, char *err) {
    g4_template_options def = g4_template_options_init();
    const g4__jtmpl *m;
    g4__jtr R;
    g4__json j;
    g4__jtv root, v;
    g4_result r;
    int msgs = -1, c;
    const char *tokname[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    const char *tokval[4];
    if (!err) err = t ? ((g4_template *)(uintptr_t)t)->error : NULL;
    if (text) *text = NULL;
    if (text_len) *text_len = 0;
    if (!t || !err || !text || !chat_json) { if (err) g4__seterr(err, "g4_template_render: NULL argument"); return G4_ERR_INPUT; }
    if (!(m = (const g4__jtmpl *)t->impl)) { g4__seterr(err, "%s: template not parsed", t->name); return G4_ERR_INPUT; }
    if (!o) o = &def;
    err[0] = 0;
    if ((r = g4__json_parse(&j, chat_json, len, "messages JSON", err)) != G4_OK) return r;
    if (j.nodes[0].type == G4__JARR) msgs = 0;
    else if (j.nodes[0].type == G4__JOBJ) {
        msgs = g4__jget(&j, 0, "messages");
    }
    if (msgs < 0 || j.nodes[msgs].type != G4__JARR) {
        g4__seterr(err, "messages JSON: expected {\"messages\": [...], \"tools\": [...]} or a list of messages");
        g4__json_free(&j);
        return G4_ERR_JSON;
    }
    if (j.nodes[msgs].count == 0) {
        g4__seterr(err, "messages JSON: cannot apply a chat template to an empty conversation");
        g4__json_free(&j);
        return G4_ERR_INPUT;
    }
    memset(&R, 0, sizeof R);
    R.a.limit = o->max_memory ? o->max_memory : def.max_memory;
    R.name = t->name;
    R.err = err;
    R.max_output = o->max_output ? o->max_output : def.max_output;
    R.max_steps = o->max_steps > 0 ? o->max_steps : def.max_steps;
    R.max_depth = o->max_depth > 0 ? o->max_depth : def.max_depth;
    tokval[0] = t->bos_token;
    tokval[1] = t->eos_token;
    tokval[2] = t->pad_token;
    tokval[3] = t->unk_token;
    if (!(R.top = g4__jt_newscope(&R, 0, NULL)) || g4__jt_fromjson(&R, &j, 0, &root)) goto fail;
    { /* messages */
        const g4__jtv *mv = &root;
        g4__jtv key = g4__jt_vstr("messages", 8), list;
        const g4__jtcoll *src;
        g4__jtcoll *dst;
        size_t i;
        if (root.t == G4__JV_DICT) mv = g4__jt_dget((const g4__jtcoll *)root.p, &key);
        src = (const g4__jtcoll *)mv->p;
        if (!(dst = g4__jt_newcoll(&R, 0, src->n, 0))) goto fail;
        for (i = 0; i < src->n; i++) {
            if (src->v[i].t != G4__JV_DICT) {
                g4__seterr(err, "messages JSON: messages[%lu] is %s, not an object", (unsigned long)i, g4__jt_typename(&src->v[i]));
                r = G4_ERR_JSON;
                goto out;
            }
            if (g4__jt_message(&R, &src->v[i], &dst->v[dst->n++])) goto fail;
        }
        list = g4__jt_vlist(dst, 0);
        if (g4__jt_assign(&R, 0, R.top, "messages", 8, &list)) goto fail;
    }
    v = g4__jt_v(G4__JV_NONE);
    if (g4__jt_assign(&R, 0, R.top, "tools", 5, &v) || g4__jt_assign(&R, 0, R.top, "documents", 9, &v)) goto fail;
    v = g4__jt_vbool(o->add_generation_prompt);
    if (g4__jt_assign(&R, 0, R.top, "add_generation_prompt", 21, &v)) goto fail;
    for (c = 0; c < 4; c++) {
        v = g4__jt_vstr(tokval[c], strlen(tokval[c]));
        if (tokval[c][0] && g4__jt_assign(&R, 0, R.top, tokname[c], strlen(tokname[c]), &v)) goto fail;
    }
    if (o->enable_thinking >= 0) {
        v = g4__jt_vbool(o->enable_thinking);
        if (g4__jt_assign(&R, 0, R.top, "enable_thinking", 15, &v)) goto fail;
    }
    if (root.t == G4__JV_DICT) { /* tools, and every other member as a variable */
        const g4__jtcoll *d = (const g4__jtcoll *)root.p;
        size_t i;
        for (i = 0; i < d->n; i++) {
            if (g4__jt_streq(&d->k[i], "messages")) continue;
            if (g4__jt_assign(&R, 0, R.top, d->k[i].s, d->k[i].n, &d->v[i])) goto fail;
        }
    }
    if (g4__jt_exec(&R, m->body, R.top) < 0) goto fail;
    if (!(*text = (char *)G4_MALLOC(R.out_n + 1))) { g4__seterr(err, "%s: out of memory", t->name); r = G4_ERR_NOMEM; goto out; }
    if (R.out_n) memcpy(*text, R.out, R.out_n);
    (*text)[R.out_n] = 0;
    if (text_len) *text_len = R.out_n;
    r = G4_OK;
    goto out;
fail:
    r = strstr(err, "out of memory") && !strstr(err, "max_memory") ? G4_ERR_NOMEM : G4_ERR_INPUT;
    if (!err[0]) g4__seterr(err, "%s: render failed", t->name);
out:
    g4__jt_arena_free(&R.a);
    g4__json_free(&j);
    return r;
}

/* text[0..tl) encoded as apply_chat_template(..., tokenize=True) does: without the post-processor (no
   second <bos>). *ids: G4_MALLOC'd. */
static g4_result g4__template_tokenize(const g4_template *t, const g4_tokenizer *tok, const char *text, size_t tl,
                                       int32_t **ids, size_t *n_ids, char *err) {
    size_t cap = g4_tokenize_max(tok, tl);
    g4_result r;
    if (!(*ids = (int32_t *)G4_MALLOC((cap ? cap : 1) * sizeof(int32_t)))) {
        g4__seterr(err, "%s: out of memory", t->name);
        return G4_ERR_NOMEM;
    }
    r = g4_tokenize(tok, text, tl, 0, *ids, cap, n_ids); /* add_special_tokens=False: no second <bos> */
    if (r != G4_OK) {
        G4_FREE(*ids);
        *ids = NULL;
        *n_ids = 0;
        g4__seterr(err, "%s: tokenizing the rendered text failed (%s)", t->name, g4_result_str(r));
    }
    return r;
}

/* encode (cont 0) or continue (cont 1) */
static g4_result g4__template_encode(const g4_template *t, const g4_tokenizer *tok, const char *chat_json, size_t len,
                                     const g4_template_options *o, int32_t **ids, size_t *n_ids, char *err, int cont,
                                     const char *fn) {
    char *text = NULL;
    const char *from, *p;
    size_t tl = 0, mark = strlen(G4_TEMPLATE_ANSWER);
    g4_result r;
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (!err && t) err = ((g4_template *)(uintptr_t)t)->error;
    if (!tok || !ids || !n_ids) { if (err) g4__seterr(err, "%s: NULL argument", fn); return G4_ERR_INPUT; }
    if ((r = g4_template_render(t, chat_json, len, o, &text, &tl, err)) != G4_OK) return r;
    from = text;
    if (cont) { /* after the last marker (the rendered text may hold NULs: search it all) */
        from = NULL;
        for (p = text; (size_t)(p - text) + mark <= tl; p++)
            if (memcmp(p, G4_TEMPLATE_ANSWER, mark) == 0) from = p + mark;
        if (!from) {
            G4_FREE(text);
            g4__seterr(err, "%s: the rendered conversation holds no model answer (G4_TEMPLATE_ANSWER): the template does "
                       "not write the model's answers, or the conversation has none; it cannot be continued", t->name);
            return G4_ERR_INPUT;
        }
    }
    r = g4__template_tokenize(t, tok, from, tl - (size_t)(from - text), ids, n_ids, err);
    G4_FREE(text);
    return r;
}

G4__DEF g4_result g4_template_encode(const g4_template *t, const g4_tokenizer *tok, const char *chat_json,
                                     size_t len, const g4_template_options *o, int32_t **ids, size_t *n_ids,
                                     char *err) {
    return g4__template_encode(t, tok, chat_json, len, o, ids, n_ids, err, 0, "g4_template_encode");
}

G4__DEF g4_result g4_template_continue(const g4_template *t, const g4_tokenizer *tok, const char *chat_json,
                                       size_t len, const g4_template_options *o, int32_t **ids, size_t *n_ids,
                                       char *err) {
    return g4__template_encode(t, tok, chat_json, len, o, ids, n_ids, err, 1, "g4_template_continue");
}

/* ------------------------------------------ image processor >>image_processing */
/* Gemma4ImageProcessor (image_processing_gemma4.py) with transformers'
   torchvision backend: convert_to_rgb (PIL's alpha_composite onto white),
   aspect_ratio_preserving_resize (torchvision's resize of a uint8 image:
   ATen's antialiased bicubic uint8 kernel, integer arithmetic), rescale,
   convert_image_to_patches, the position grid, pad_along_first_dim. The PIL
   backend (Gemma4ImageProcessorPil) resamples with 22-bit weights where ATen
   uses 16-bit ones: 0.04-0.67% of resized values differ by 1/255 (docs/vision.md). */

/* The processor's kind: image_processor_type in the image processor's object
   (or a flat file), else a top-level processor_class of Gemma4UnifiedProcessor. */
static int g4__jstr_prefix(const g4__jnode *n, const char *lit) {
    size_t k = strlen(lit);
    return n->type == G4__JSTR && n->len >= k && memcmp(n->str, lit, k) == 0;
}

/* A processor config's opening: the JSON text (Python's json: NaN, Infinity), a
   top-level object and, in a processor_config.json, the processor's own object
   `key` (then c->obj and c->scope point there). j is freed on an error. */
static g4_result g4__proc_json_open(g4__json *j, g4__cfg *c, const char *json, size_t len, const char *name,
                                    const char *key, const char *scope, char *error) {
    g4_result r = G4_OK;
    int n;
    if (!json) { g4__seterr(error, "%s: NULL text", name); return G4_ERR_INPUT; }
    if ((r = g4__json_parse_python(j, json, len, name, error)) != G4_OK) return r;
    c->j = j; c->obj = 0; c->name = name; c->scope = ""; c->err = error;
    if (j->nodes[0].type != G4__JOBJ) {
        g4__seterr(error, "%s: the top level must be a JSON object", name);
        r = G4_ERR_CONFIG;
    } else if ((n = g4__jget(j, 0, key)) >= 0 && j->nodes[n].type != G4__JNULL) {
        if (j->nodes[n].type != G4__JOBJ) {
            g4__seterr(error, "%s: field '%s' must be an object", name, key);
            r = G4_ERR_CONFIG;
        } else {
            c->obj = n;
            c->scope = scope;
        }
    }
    if (r != G4_OK) g4__json_free(j);
    return r;
}

/* transformers' _SUPPORTED_SOFT_TOKENS */
static g4_result g4__soft_tokens_check(int n, const g4__cfg *c, const char *cls, char *error) {
    if (n == 70 || n == 140 || n == 280 || n == 560 || n == 1120) return G4_OK;
    g4__seterr(error, "%s: field '%smax_soft_tokens' is %d; %s accepts 70, 140, 280, 560 or 1120", c->name, c->scope, n, cls);
    return G4_ERR_CONFIG;
}

static g4_result g4__img_kind(const g4__cfg *c, const g4__json *j, g4_image_config *ic) {
    int n = g4__jget(j, c->obj, "image_processor_type"), pc = g4__jget(j, 0, "processor_class");
    if (n >= 0 && j->nodes[n].type != G4__JNULL) {
        const g4__jnode *t = &j->nodes[n];
        if (t->type != G4__JSTR) {
            g4__seterr(ic->error, "%s: field '%simage_processor_type' must be a string", c->name, c->scope);
            return G4_ERR_CONFIG;
        }
        if (g4__jis(t, "Gemma4UnifiedImageProcessor") || g4__jis(t, "Gemma4UnifiedImageProcessorPil")) ic->kind = G4_IMAGE_UNIFIED;
        else if (g4__jis(t, "Gemma4ImageProcessor") || g4__jis(t, "Gemma4ImageProcessorPil")) ic->kind = G4_IMAGE_GEMMA4;
        else {
            g4__seterr(ic->error, "%s: field '%simage_processor_type' is \"%.64s\"; gemma4.h knows Gemma4ImageProcessor and "
                       "Gemma4UnifiedImageProcessor", c->name, c->scope, t->str);
            return G4_ERR_CONFIG;
        }
    } else if (pc >= 0 && g4__jstr_prefix(&j->nodes[pc], "Gemma4UnifiedProcessor")) {
        ic->kind = G4_IMAGE_UNIFIED;
    }
    return G4_OK;
}

/* The patch settings Gemma4ImageProcessor and Gemma4VideoProcessor share, by
   reference, so one function serves both; kind names them in messages ("Image",
   "Video": the classes Gemma4<kind>Processor and Gemma4Unified<kind>Processor). */
typedef struct {
    int *patch_size, *max_soft_tokens, *pooling_kernel_size, *do_resize, *do_rescale, *kind;
    char *error;
    const char *what;
} g4__patches;

static g4__patches g4__image_patches(g4_image_config *ic) {
    g4__patches g = {&ic->patch_size, &ic->max_soft_tokens, &ic->pooling_kernel_size, &ic->do_resize, &ic->do_rescale,
                     &ic->kind, ic->error, "Image"};
    return g;
}

static g4__patches g4__video_patches(g4_video_config *vc) {
    g4__patches g = {&vc->patch_size, &vc->max_soft_tokens, &vc->pooling_kernel_size, &vc->do_resize, &vc->do_rescale,
                     &vc->kind, vc->error, "Video"};
    return g;
}

/* Their defaults: the two classes differ only in max_soft_tokens */
static void g4__patches_init(const g4__patches *g, int max_soft_tokens) {
    *g->patch_size = 16;
    *g->max_soft_tokens = max_soft_tokens;
    *g->pooling_kernel_size = 3;
    *g->do_resize = *g->do_rescale = 1;
}

/* The fields both processors read first, in their order (absent: the defaults stay) */
static g4_result g4__patches_fields(const g4__patches *g, const g4__cfg *c) {
    g4_result r;
    if ((r = g4__cfg_int(c, "patch_size", g->patch_size, *g->patch_size, 0, 1, 1024)) != G4_OK ||
        (r = g4__cfg_int(c, "max_soft_tokens", g->max_soft_tokens, *g->max_soft_tokens, 0, 1, 1120)) != G4_OK ||
        (r = g4__cfg_int(c, "pooling_kernel_size", g->pooling_kernel_size, *g->pooling_kernel_size, 0, 1, 64)) != G4_OK ||
        (r = g4__cfg_bool(c, "do_resize", g->do_resize, *g->do_resize)) != G4_OK)
        return r;
    return g4__cfg_bool(c, "do_rescale", g->do_rescale, *g->do_rescale);
}

G4__DEF g4_image_config g4_image_config_init(void) {
    g4_image_config ic;
    g4__patches g = g4__image_patches(&ic);
    memset(&ic, 0, sizeof ic);
    g4__patches_init(&g, 280);
    ic.do_convert_rgb = 1;
    ic.rescale_factor = (float)(1.0 / 255.0);
    ic.image_seq_length = 280;
    return ic;
}

/* Gemma4Unified<kind>Processor as Gemma4<kind>Processor's steps: patches of k p
   pixels, no pooling (the same target size: side k p, budget max_soft (k p)^2) */
static g4_result g4__patches_unify(const g4__patches *g, const char *name) {
    int64_t ps = (int64_t)*g->patch_size * *g->pooling_kernel_size;
    if (ps > 1024) {
        g4__seterr(g->error, "%s: a merged patch of patch_size %d x pooling_kernel_size %d pixels is more than 1024 a side",
                   name ? name : (g->what[0] == 'I' ? "image processor" : "video processor"), *g->patch_size,
                   *g->pooling_kernel_size);
        return G4_ERR_CONFIG;
    }
    *g->patch_size = (int)ps;
    *g->pooling_kernel_size = 1;
    *g->kind = G4_IMAGE_UNIFIED;
    return G4_OK;
}

/* g4_image_config_check and g4_video_config_check: the processor against the model's vision_config */
static g4_result g4__patches_check(const g4__patches *g, const g4_config *c) {
    const char *w = g->what[0] == 'I' ? "image" : "video";
    if (c && c->unified) { /* the 12B: Gemma4Unified<kind>Processor's merged patches */
        const g4_unified_vision_config *u = &c->unified_vision;
        g4_result r;
        if (!u->present) { g4__seterr(g->error, "the gemma4_unified model has no vision_config"); return G4_ERR_CONFIG; }
        if (*g->kind == G4_IMAGE_GEMMA4) {
            g4__seterr(g->error, "the %s processor is a Gemma4%sProcessor, but the model is a gemma4_unified one "
                       "(its processor is Gemma4Unified%sProcessor: merged patches, no tower)", w, g->what, g->what);
            return G4_ERR_CONFIG;
        }
        if (*g->kind == G4_IMAGE_ANY && (r = g4__patches_unify(g, NULL)) != G4_OK) return r;
        if ((int64_t)*g->patch_size != (int64_t)u->patch_size * u->pooling_kernel_size || *g->pooling_kernel_size != 1) {
            g4__seterr(g->error, "the %s processor's merged patches of %d pixels contradict the model's vision_config "
                       "(patch_size %d x pooling_kernel_size %d)", w, *g->patch_size, u->patch_size, u->pooling_kernel_size);
            return G4_ERR_CONFIG;
        }
        return G4_OK;
    }
    if (*g->kind == G4_IMAGE_UNIFIED) {
        g4__seterr(g->error, "the %s processor is the 12B's Gemma4Unified%sProcessor, but the model is not a "
                   "gemma4_unified one", w, g->what);
        return G4_ERR_CONFIG;
    }
    if (!c || !c->vision.present) { g4__seterr(g->error, "the model has no vision_config"); return G4_ERR_CONFIG; }
    if (*g->patch_size != c->vision.patch_size || *g->pooling_kernel_size != c->vision.pooling_kernel_size) {
        g4__seterr(g->error, "the %s processor's patch_size %d and pooling_kernel_size %d contradict the model's "
                   "vision_config (%d, %d)", w, *g->patch_size, *g->pooling_kernel_size, c->vision.patch_size,
                   c->vision.pooling_kernel_size);
        return G4_ERR_CONFIG;
    }
    return G4_OK;
}



/* Gemma4ImageProcessor's fields (g4__proc_parse opened c on its object) */
static g4_result g4__image_config_fields(g4_image_config *ic, const g4__cfg *c) {
    g4__cfg top = *c;
    g4_result r;
    int resample, norm;
    g4__patches g = g4__image_patches(ic);
#define G4__TRY(x) do { if ((r = (x)) != G4_OK) return r; } while (0)
    top.obj = 0;
    top.scope = "";
    G4__TRY(g4__cfg_int(&top, "image_seq_length", &ic->image_seq_length, 280, 0, 1, 1 << 20));
    G4__TRY(g4__img_kind(c, c->j, ic));
    G4__TRY(g4__patches_fields(&g, c));
    G4__TRY(g4__cfg_bool(c, "do_convert_rgb", &ic->do_convert_rgb, 1));
    G4__TRY(g4__cfg_bool(c, "do_normalize", &norm, 0));
    G4__TRY(g4__cfg_float(c, "rescale_factor", &ic->rescale_factor, (float)(1.0 / 255.0), 1e-30, 1e30));
    G4__TRY(g4__cfg_int(c, "resample", &resample, 3, 0, 0, 5));
#undef G4__TRY
    r = g4__soft_tokens_check(ic->max_soft_tokens, c, "Gemma4ImageProcessor", ic->error);
    if (r != G4_OK) { /* its message is set */
    } else if (norm) {
        g4__seterr(ic->error, "%s: field '%sdo_normalize' is true; Gemma 4 images are not normalised (gemma4.h supports "
                   "only false)", c->name, c->scope);
        r = G4_ERR_CONFIG;
    } else if (resample != 3) {
        g4__seterr(ic->error, "%s: field '%sresample' is %d; gemma4.h supports only 3 (bicubic)", c->name, c->scope, resample);
        r = G4_ERR_CONFIG;
    } else if (ic->kind == G4_IMAGE_UNIFIED) {
        r = g4__patches_unify(&g, c->name);
    }
    return r;
}

/* The processor configs g4_*_parse and g4_*_load read, each into its struct */
typedef enum { G4__PROC_IMAGE, G4__PROC_VIDEO, G4__PROC_UNIFIED_FE, G4__PROC_AUDIO_FE } g4__proc_kind;
static g4_result g4__video_config_fields(g4_video_config *vc, const g4__cfg *c);
static g4_result g4__unified_fe_fields(g4_unified_fe *fe, const g4__cfg *c);
static g4_result g4__audio_fe_fields(g4_audio_fe *fe, const g4__cfg *c);
static void g4__audio_fe_defaults(g4_audio_fe *fe);

/* cfg set to its kind's defaults (its _init); its error buffer */
static char *g4__proc_reset(g4__proc_kind k, void *cfg) {
    g4_image_config *ic = (g4_image_config *)cfg;
    g4_video_config *vc = (g4_video_config *)cfg;
    g4_unified_fe *fe = (g4_unified_fe *)cfg;
    g4_audio_fe *afe = (g4_audio_fe *)cfg;
    /* (not `return (*ic = ...).error`: an assignment is no lvalue, so that would be a dead temporary's buffer) */
    if (k == G4__PROC_IMAGE) { *ic = g4_image_config_init(); return ic->error; }
    if (k == G4__PROC_VIDEO) { *vc = g4_video_config_init(); return vc->error; }
    if (k == G4__PROC_AUDIO_FE) { g4__audio_fe_defaults(afe); return afe->error; }
    *fe = g4_unified_fe_init();
    return fe->error;
}

/* g4_*_parse: the defaults, then the fields of the JSON text `json` (in a
   processor_config.json, of the processor's own object) */
static g4_result g4__proc_parse(g4__proc_kind k, void *cfg, const char *json, size_t len, const char *name) {
    static const char *const key[] = {"image_processor", "video_processor", "feature_extractor", "feature_extractor"};
    static const char *const scope[] = {"image_processor.", "video_processor.", "feature_extractor.", "feature_extractor."};
    g4__json j;
    g4__cfg c;
    g4_result r;
    char *error;
    if (!cfg) return G4_ERR_INPUT;
    error = g4__proc_reset(k, cfg);
    if (!name) name = "processor_config.json";
    if ((r = g4__proc_json_open(&j, &c, json, len, name, key[k], scope[k], error)) != G4_OK) return r;
    if (k == G4__PROC_IMAGE) r = g4__image_config_fields((g4_image_config *)cfg, &c);
    else if (k == G4__PROC_VIDEO) r = g4__video_config_fields((g4_video_config *)cfg, &c);
    else if (k == G4__PROC_AUDIO_FE) r = g4__audio_fe_fields((g4_audio_fe *)cfg, &c);
    else r = g4__unified_fe_fields((g4_unified_fe *)cfg, &c);
    g4__json_free(&j);
    return r;
}

/* g4_*_load: the defaults, then PATH a .json file, or a directory holding
   processor_config.json, else the kind's own file (video_preprocessor_config.json
   or preprocessor_config.json; neither: G4_OK with nothing parsed, the defaults stay). */
static g4_result g4__proc_config_load(g4__proc_kind k, void *cfg, const char *path) {
    const char *fallback = k == G4__PROC_VIDEO ? "video_preprocessor_config.json" : "preprocessor_config.json";
    char *text = NULL, *p = NULL, *error;
    size_t len;
    g4_result r;
    if (!cfg) return G4_ERR_INPUT;
    error = g4__proc_reset(k, cfg);
    if (!path) { g4__seterr(error, "NULL path"); return G4_ERR_INPUT; }
    if (strlen(path) > 5 && strcmp(path + strlen(path) - 5, ".json") == 0) {
        if ((r = g4__read_file(path, &text, &len, 16u << 20, error)) != G4_OK) return r;
        r = g4__proc_parse(k, cfg, text, len, path);
        G4_FREE(text);
        return r;
    }
    if (!(p = g4__join(path, "processor_config.json"))) { g4__seterr(error, "out of memory"); return G4_ERR_NOMEM; }
    if (!g4__exists(p)) {
        G4_FREE(p);
        if (!(p = g4__join(path, fallback))) { g4__seterr(error, "out of memory"); return G4_ERR_NOMEM; }
        if (!g4__exists(p)) { G4_FREE(p); return G4_OK; } /* neither: the defaults */
    }
    r = g4__read_file(p, &text, &len, 16u << 20, error);
    if (r == G4_OK) r = g4__proc_parse(k, cfg, text, len, p);
    G4_FREE(text);
    G4_FREE(p);
    return r;
}

G4__DEF g4_result g4_image_config_parse(g4_image_config *ic, const char *json, size_t len, const char *name) {
    return g4__proc_parse(G4__PROC_IMAGE, ic, json, len, name);
}
G4__DEF g4_result g4_image_config_load(g4_image_config *ic, const char *path) {
    return g4__proc_config_load(G4__PROC_IMAGE, ic, path);
}
G4__DEF g4_result g4_video_config_parse(g4_video_config *vc, const char *json, size_t len, const char *name) {
    return g4__proc_parse(G4__PROC_VIDEO, vc, json, len, name);
}
G4__DEF g4_result g4_video_config_load(g4_video_config *vc, const char *path) {
    return g4__proc_config_load(G4__PROC_VIDEO, vc, path);
}
G4__DEF g4_result g4_unified_fe_parse(g4_unified_fe *fe, const char *json, size_t len, const char *name) {
    return g4__proc_parse(G4__PROC_UNIFIED_FE, fe, json, len, name);
}
G4__DEF g4_result g4_unified_fe_load(g4_unified_fe *fe, const char *path) {
    return g4__proc_config_load(G4__PROC_UNIFIED_FE, fe, path);
}

G4__DEF g4_result g4_image_config_check(g4_image_config *ic, const g4_config *c) {
    g4__patches g;
    if (!ic) return G4_ERR_INPUT;
    g = g4__image_patches(ic);
    return g4__patches_check(&g, c);
}

#define G4__IMG_MAX_SIDE 32768
#define G4__IMG_MAX_PIXELS ((int64_t)1 << 28)

static g4_result g4__img_check(g4_image_config *ic, int h, int w) {
    if (h < 1 || w < 1 || h > G4__IMG_MAX_SIDE || w > G4__IMG_MAX_SIDE || (int64_t)h * w > G4__IMG_MAX_PIXELS) {
        g4__seterr(ic->error, "image of %d x %d pixels: each side must be 1 .. %d and the area at most 2^28", w, h,
                   G4__IMG_MAX_SIDE);
        return G4_ERR_INPUT;
    }
    if (ic->patch_size < 1 || ic->pooling_kernel_size < 1 || ic->max_soft_tokens < 1 || ic->patch_size > 1024 ||
        ic->pooling_kernel_size > 64 || ic->max_soft_tokens > 1120) {
        g4__seterr(ic->error, "image processor settings out of range (patch_size %d, pooling_kernel_size %d, max_soft_tokens %d)",
                   ic->patch_size, ic->pooling_kernel_size, ic->max_soft_tokens);
        return G4_ERR_CONFIG;
    }
    return G4_OK;
}

G4__DEF g4_result g4_image_target_size(g4_image_config *ic, int height, int width, int *th, int *tw) {
    int64_t max_patches, side, tph, tpw, max_side;
    double factor, target_px;
    g4_result r;
    if (!ic || !th || !tw) return G4_ERR_INPUT;
    if ((r = g4__img_check(ic, height, width)) != G4_OK) return r;
    max_patches = (int64_t)ic->max_soft_tokens * ic->pooling_kernel_size * ic->pooling_kernel_size;
    side = (int64_t)ic->pooling_kernel_size * ic->patch_size;
    if (!ic->do_resize) {
        if (height % side || width % side || (int64_t)(height / ic->patch_size) * (width / ic->patch_size) > max_patches) {
            /* (transformers would go on, and its soft tokens would not match the placeholders) */
            g4__seterr(ic->error, "do_resize is false, and an image of %d x %d is not whole %lld-pixel pooling blocks "
                       "within max_soft_tokens", width, height, (long long)side);
            return G4_ERR_INPUT;
        }
        *th = height; *tw = width;
        return G4_OK;
    }
    /* get_aspect_ratio_preserving_size, in Python's doubles */
    target_px = (double)max_patches * (double)ic->patch_size * (double)ic->patch_size;
    factor = sqrt(target_px / ((double)height * (double)width));
    tph = (int64_t)floor(factor * height / (double)side) * side;
    tpw = (int64_t)floor(factor * width / (double)side) * side;
    if (tph == 0 && tpw == 0) {
        g4__seterr(ic->error, "an image of %d x %d resizes to 0 x 0 (sides must be multiples of %lld)", width, height,
                   (long long)side);
        return G4_ERR_INPUT;
    }
    max_side = max_patches / ((int64_t)ic->pooling_kernel_size * ic->pooling_kernel_size) * side;
    if (tph == 0) {
        tph = side;
        tpw = (int64_t)floor((double)width / (double)height) * side;
        if (tpw > max_side) tpw = max_side;
    } else if (tpw == 0) {
        tpw = side;
        tph = (int64_t)floor((double)height / (double)width) * side;
        if (tph > max_side) tph = max_side;
    }
    if ((double)tph * (double)tpw > target_px) {
        g4__seterr(ic->error, "resizing %d x %d to %lld x %lld exceeds %lld patches", width, height, (long long)tpw,
                   (long long)tph, (long long)max_patches);
        return G4_ERR_INPUT;
    }
    *th = (int)tph; *tw = (int)tpw;
    return G4_OK;
}

/* ATen's antialiased bicubic weights for one axis (in -> out), as its uint8
   kernel makes them: per output the first input (bounds[2o]) and count
   (bounds[2o+1]); doubles normalised to sum 1, then int16 at the largest
   precision < 22 bits that keeps the largest weight below 2^15 (*prec). */
static double g4__bicubic_aa(double x) { /* a = -0.5, as PIL */
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

static int g4__img_ksize(int in, int out) {
    double scale = (double)in / out, support = scale >= 1.0 ? 2.0 * scale : 2.0;
    return (int)ceil(support) * 2 + 1;
}

static void g4__img_weights(int in, int out, int ksize, int32_t *bounds, double *wd, int16_t *wi, int *prec) {
    double scale = (double)in / out, support = scale >= 1.0 ? 2.0 * scale : 2.0, invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    double wmax = 0.0;
    int o, j, p;
    for (o = 0; o < out; o++) {
        double center = scale * (o + 0.5), total = 0.0, *w = wd + (size_t)o * ksize;
        int64_t xmin = (int64_t)(center - support + 0.5), xmax = (int64_t)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in) xmax = in;
        bounds[2 * o] = (int32_t)xmin;
        bounds[2 * o + 1] = (int32_t)(xmax - xmin);
        for (j = 0; j < ksize; j++) w[j] = 0.0;
        for (j = 0; j < xmax - xmin; j++) total += w[j] = g4__bicubic_aa((j + xmin - center + 0.5) * invscale);
        if (total != 0.0)
            for (j = 0; j < xmax - xmin; j++) { w[j] /= total; if (w[j] > wmax) wmax = w[j]; }
    }
    for (p = 0; p < 22; p++)
        if ((int)(0.5 + wmax * (double)(1 << (p + 1))) >= (1 << 15)) break;
    for (j = 0; j < out * ksize; j++) {
        double v = wd[j] * (double)(1 << p);
        wi[j] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    *prec = p;
}

/* One pass along an axis of [rows][in][3] (stride_in between neighbours of the
   axis, step between rows) into [rows][out][3] */
static void g4__img_pass(const uint8_t *src, uint8_t *dst, int rows, int in, int out, int along_rows, int other,
                         const int32_t *bounds, const int16_t *wi, int ksize, int prec) {
    int r, o, j, ch;
    for (r = 0; r < rows; r++)
        for (o = 0; o < out; o++)
            for (ch = 0; ch < 3; ch++) {
                int32_t acc = (int32_t)1 << (prec - 1);
                const int16_t *w = wi + (size_t)o * ksize;
                for (j = 0; j < bounds[2 * o + 1]; j++) {
                    size_t at = along_rows ? ((size_t)(bounds[2 * o] + j) * other + r) * 3 : ((size_t)r * in + bounds[2 * o] + j) * 3;
                    acc += (int32_t)src[at + ch] * w[j];
                }
                acc >>= prec;
                dst[(along_rows ? ((size_t)o * other + r) : ((size_t)r * out + o)) * 3 + ch] =
                    (uint8_t)(acc < 0 ? 0 : acc > 255 ? 255 : acc);
            }
    (void)in;
}

/* the scratch layout: rgb [h][w][3], horizontal [h][tw][3], resized [th][tw][3], weights */
typedef struct { size_t rgb, hpass, out, bounds, wd, wi, total; } g4__img_layout;

static int g4__img_layout_of(g4_image_config *ic, int h, int w, g4__img_layout *L, int *th, int *tw) {
    int kh, kw, kmax, omax;
    if (g4_image_target_size(ic, h, w, th, tw) != G4_OK) return 0;
    kh = g4__img_ksize(h, *th); kw = g4__img_ksize(w, *tw);
    kmax = kh > kw ? kh : kw;
    omax = *th > *tw ? *th : *tw;
    L->rgb = 0;
    L->hpass = L->rgb + (((size_t)h * w * 3 + 7) & ~(size_t)7);
    L->out = L->hpass + (((size_t)h * *tw * 3 + 7) & ~(size_t)7);
    L->bounds = L->out + (((size_t)*th * *tw * 3 + 7) & ~(size_t)7);
    L->wd = L->bounds + (((size_t)omax * 2 * sizeof(int32_t) + 7) & ~(size_t)7);
    L->wi = L->wd + (size_t)omax * kmax * sizeof(double);
    L->total = L->wi + (((size_t)omax * kmax * sizeof(int16_t) + 7) & ~(size_t)7);
    return 1;
}

G4__DEF size_t g4_image_scratch_size(const g4_image_config *ic, int height, int width) {
    g4_image_config tmp;
    g4__img_layout L;
    int th, tw;
    if (!ic) return 0;
    tmp = *ic;
    return g4__img_layout_of(&tmp, height, width, &L, &th, &tw) ? L.total : 0;
}

/* g4_image_preprocess's and g4_video_preprocess's pointers: none NULL; no soft tokens until done */
static g4_result g4__preprocess_outputs(char *error, const char *what, const uint8_t *in, const float *pixel_values,
                                        const int32_t *positions, int *n_soft) {
    if (n_soft) *n_soft = 0;
    if (in && pixel_values && positions && n_soft) return G4_OK;
    g4__seterr(error, "%s, pixel_values, positions or n_soft", what);
    return G4_ERR_INPUT;
}

G4__DEF g4_result g4_image_preprocess(g4_image_config *ic, const uint8_t *pixels, int height, int width, int channels,
                                      void *scratch, size_t scratch_bytes, float *pixel_values, int32_t *positions,
                                      int *n_soft) {
    g4__img_layout L;
    unsigned char *base = (unsigned char *)scratch;
    uint8_t *rgb, *img;
    int th, tw, p, k, ph, pw, max_patches, n, y, x, dy, dx, ch, prec;
    size_t i, P;
    g4_result r;
    if (!ic) return G4_ERR_INPUT;
    r = g4__preprocess_outputs(ic->error, "g4_image_preprocess: NULL pixels", pixels, pixel_values, positions, n_soft);
    if (r != G4_OK) return r;
    if (channels != 3 && channels != 4) {
        g4__seterr(ic->error, "an image of %d channels: gemma4.h takes RGB (3) or RGBA (4)", channels);
        return G4_ERR_INPUT;
    }
    if ((r = g4__img_check(ic, height, width)) != G4_OK) return r;
    if (!g4__img_layout_of(ic, height, width, &L, &th, &tw)) return G4_ERR_INPUT;
    if (!scratch || scratch_bytes < L.total || ((uintptr_t)scratch & 7)) {
        g4__seterr(ic->error, "image scratch: %zu bytes at %p, need %zu, 8-byte aligned", scratch_bytes, scratch, L.total);
        return G4_ERR_ARENA;
    }
    p = ic->patch_size; k = ic->pooling_kernel_size;
    max_patches = ic->max_soft_tokens * k * k;
    P = (size_t)3 * p * p;

    /* convert_to_rgb: RGBA onto white, as PIL.Image.alpha_composite (7-bit coefficients) */
    rgb = base + L.rgb;
    for (i = 0; i < (size_t)height * width; i++) {
        if (channels == 3) { memcpy(rgb + 3 * i, pixels + 3 * i, 3); continue; }
        for (ch = 0; ch < 3; ch++) {
            uint32_t sa = pixels[4 * i + 3], tmp = pixels[4 * i + ch] * (sa * 128) + 255u * ((255 - sa) * 128) + (0x80u << 7);
            rgb[3 * i + ch] = (uint8_t)(((((tmp >> 8) + tmp) >> 8)) >> 7);
        }
    }
    if (channels == 4 && !ic->do_convert_rgb) {
        g4__seterr(ic->error, "do_convert_rgb is false: an RGBA image would keep 4 channels, which the tower cannot take");
        return G4_ERR_INPUT;
    }

    /* aspect_ratio_preserving_resize: width first, then height, each only if it changes */
    img = rgb;
    if (tw != width) {
        int32_t *bounds = (int32_t *)(void *)(base + L.bounds);
        int ks = g4__img_ksize(width, tw);
        g4__img_weights(width, tw, ks, bounds, (double *)(void *)(base + L.wd), (int16_t *)(void *)(base + L.wi), &prec);
        g4__img_pass(img, base + L.hpass, height, width, tw, 0, 0, bounds, (int16_t *)(void *)(base + L.wi), ks, prec);
        img = base + L.hpass;
    }
    if (th != height) {
        int32_t *bounds = (int32_t *)(void *)(base + L.bounds);
        int ks = g4__img_ksize(height, th);
        g4__img_weights(height, th, ks, bounds, (double *)(void *)(base + L.wd), (int16_t *)(void *)(base + L.wi), &prec);
        g4__img_pass(img, base + L.out, tw, height, th, 1, tw, bounds, (int16_t *)(void *)(base + L.wi), ks, prec);
        img = base + L.out;
    }

    /* rescale, convert_image_to_patches ([ph][pw][dy][dx][c]), positions (x, y), padding */
    ph = th / p; pw = tw / p; n = ph * pw;
    for (y = 0; y < ph; y++)
        for (x = 0; x < pw; x++) {
            float *row = pixel_values + (size_t)(y * pw + x) * P;
            for (dy = 0; dy < p; dy++)
                for (dx = 0; dx < p; dx++)
                    for (ch = 0; ch < 3; ch++) {
                        uint8_t v = img[((size_t)(y * p + dy) * tw + (x * p + dx)) * 3 + ch];
                        row[((size_t)dy * p + dx) * 3 + ch] = ic->do_rescale ? (float)v * ic->rescale_factor : (float)v;
                    }
            positions[2 * (y * pw + x)] = x;
            positions[2 * (y * pw + x) + 1] = y;
        }
    memset(pixel_values + (size_t)n * P, 0, sizeof(float) * (size_t)(max_patches - n) * P);
    for (i = (size_t)n; i < (size_t)max_patches; i++) positions[2 * i] = positions[2 * i + 1] = -1;
    *n_soft = n / (k * k);
    return G4_OK;
}

G4__DEF g4_result g4_mm_expand_images(const g4_config *c, const int32_t *ids, int n, const int *n_soft, int n_images,
                                      int32_t *out, size_t cap, size_t *n_out, char *err) {
    size_t need = 0;
    int t, img = 0, j;
    if (n_out) *n_out = 0;
    if (!c || !ids || n < 0 || !n_out || (n_images > 0 && !n_soft)) { if (err) g4__seterr(err, "NULL argument"); return G4_ERR_INPUT; }
    if (c->image_token_id < 0 || c->boi_token_id < 0 || c->eoi_token_id < 0) {
        if (err) g4__seterr(err, "the config has no image_token_id, boi_token_id or eoi_token_id");
        return G4_ERR_INPUT;
    }
    for (t = 0; t < n; t++) {
        if (ids[t] != c->image_token_id) { need++; continue; }
        if (img >= n_images || n_soft[img] < 1) break;
        need += 2 + (size_t)n_soft[img++];
    }
    if (t < n || img != n_images) {
        if (err) g4__seterr(err, "the ids hold %s%d image placeholders, but %d images were given%s", t < n ? "more than " : "",
                           t < n ? img : img, n_images, t < n && img < n_images ? " (an image of no soft tokens)" : "");
        return G4_ERR_INPUT;
    }
    *n_out = need;
    if (need > cap || !out) { if (err) g4__seterr(err, "%zu ids do not fit in %zu", need, cap); return G4_ERR_INPUT; }
    for (t = 0, img = 0, need = 0; t < n; t++) {
        if (ids[t] != c->image_token_id) { out[need++] = ids[t]; continue; }
        out[need++] = c->boi_token_id;
        for (j = 0; j < n_soft[img]; j++) out[need++] = c->image_token_id;
        out[need++] = c->eoi_token_id;
        img++;
    }
    return G4_OK;
}

/* the run that replaces one placeholder: open, n x the placeholder, close */
static size_t g4__mm_run(int32_t *out, size_t at, int32_t open, int32_t tok, int n, int32_t close) {
    int j;
    out[at++] = open;
    for (j = 0; j < n; j++) out[at++] = tok;
    out[at++] = close;
    return at;
}

G4__DEF g4_result g4_mm_expand(const g4_config *c, const int32_t *ids, int n, const int *n_image, int n_images,
                              const int *n_audio, int n_audios, int32_t *out, size_t cap, size_t *n_out, char *err) {
    size_t need = 0;
    int t, img = 0, aud = 0, seen_img = 0, seen_aud = 0;
    if (n_out) *n_out = 0;
    if (!c || (!ids && n > 0) || n < 0 || !n_out || n_images < 0 || n_audios < 0 || (n_images > 0 && !n_image) ||
        (n_audios > 0 && !n_audio)) {
        if (err) g4__seterr(err, "g4_mm_expand: NULL or negative argument");
        return G4_ERR_INPUT;
    }
    for (t = 0; t < n; t++) {
        seen_img += c->image_token_id >= 0 && ids[t] == c->image_token_id;
        seen_aud += c->audio_token_id >= 0 && ids[t] == c->audio_token_id;
    }
    if (seen_img != n_images || seen_aud != n_audios) { /* validate_inputs' counts, per modality */
        if (err) {
            if (seen_img != n_images)
                g4__seterr(err, "the ids hold %d image placeholders (id %d), but %d images were given", seen_img,
                           (int)c->image_token_id, n_images);
            else
                g4__seterr(err, "the ids hold %d audio placeholders (id %d), but %d clips were given", seen_aud,
                           (int)c->audio_token_id, n_audios);
        }
        return G4_ERR_INPUT;
    }
    if ((n_images && (c->boi_token_id < 0 || c->eoi_token_id < 0)) || (n_audios && (c->boa_token_id < 0 || c->eoa_token_id < 0))) {
        if (err) g4__seterr(err, "the config has no %s", n_images && (c->boi_token_id < 0 || c->eoi_token_id < 0) ?
                            "boi_token_id or eoi_token_id" : "boa_token_id or eoa_token_index");
        return G4_ERR_INPUT;
    }
    for (t = 0; t < n_images; t++)
        if (n_image[t] < 0) { if (err) g4__seterr(err, "image %d: %d soft tokens", t, n_image[t]); return G4_ERR_INPUT; }
    for (t = 0; t < n_audios; t++)
        if (n_audio[t] < 0) { if (err) g4__seterr(err, "clip %d: %d soft tokens", t, n_audio[t]); return G4_ERR_INPUT; }
    for (t = 0; t < n; t++) {
        if (n_images && ids[t] == c->image_token_id) need += 2 + (size_t)n_image[img++];
        else if (n_audios && ids[t] == c->audio_token_id) need += 2 + (size_t)n_audio[aud++];
        else need++;
    }
    *n_out = need;
    if (!out || need > cap) { if (err) g4__seterr(err, "%zu ids do not fit in %zu", need, out ? cap : 0); return G4_ERR_INPUT; }
    for (t = 0, img = aud = 0, need = 0; t < n; t++) {
        if (n_images && ids[t] == c->image_token_id)
            need = g4__mm_run(out, need, c->boi_token_id, c->image_token_id, n_image[img++], c->eoi_token_id);
        else if (n_audios && ids[t] == c->audio_token_id)
            need = g4__mm_run(out, need, c->boa_token_id, c->audio_token_id, n_audio[aud++], c->eoa_token_id);
        else
            out[need++] = ids[t];
    }
    return G4_OK;
}


/* ------------------------------------------ video processor >>video_processing */
/* Gemma4VideoProcessor (video_processing_gemma4.py) with transformers'
   torchvision backend: sample_frames (default_sample_indices_fn), then per
   kept frame aspect_ratio_preserving_resize, rescale_and_normalize (fused),
   convert_video_to_patches, the position grid, pad_to_max_patches; each frame
   alone through g4_image_preprocess (torchvision resizes the frames of a
   [T, 3, H, W] uint8 tensor one by one with the same kernel). Then
   Gemma4Processor.replace_video_token: the frames' "mm:ss" stamps. */

G4__DEF g4_video_config g4_video_config_init(void) {
    g4_video_config vc;
    g4__patches g = g4__video_patches(&vc);
    memset(&vc, 0, sizeof vc);
    g4__patches_init(&g, 70);
    vc.do_normalize = vc.do_convert_rgb = vc.do_sample_frames = 1;
    vc.rescale_factor = 1.0 / 255.0;
    vc.image_std[0] = vc.image_std[1] = vc.image_std[2] = 1.0f;
    vc.num_frames = 32;
    return vc;
}

/* A number field as a double: absent or null gives def (*was_null set when null). */
static g4_result g4__vcfg_num(const g4__cfg *c, const char *key, double *out, double def, double lo, double hi,
                              int *was_null) {
    int n = g4__jget(c->j, c->obj, key);
    const g4__jnode *nd;
    if (was_null) *was_null = n >= 0 && c->j->nodes[n].type == G4__JNULL;
    if (n < 0 || c->j->nodes[n].type == G4__JNULL) { *out = def; return G4_OK; }
    nd = &c->j->nodes[n];
    if (nd->type != G4__JNUM) {
        g4__seterr(c->err, "%s: field '%s%s' must be a number, got %s", c->name, c->scope, key, g4__jtype_name(nd->type));
        return G4_ERR_CONFIG;
    }
    if (!(nd->num >= lo && nd->num <= hi)) {
        g4__seterr(c->err, "%s: field '%s%s' is %g, outside [%g, %g]", c->name, c->scope, key, nd->num, lo, hi);
        return G4_ERR_CONFIG;
    }
    *out = nd->num;
    return G4_OK;
}

/* image_mean / image_std: a number (every channel) or a list of 3 */
static g4_result g4__vcfg_triple(const g4__cfg *c, const char *key, float out[3]) {
    int n = g4__jget(c->j, c->obj, key), k, ch;
    char what[64];
    g4_result r;
    if (n < 0 || c->j->nodes[n].type == G4__JNULL) return G4_OK;
    if (c->j->nodes[n].type == G4__JNUM) {
        if ((r = g4__cfg_num_node(c, n, key, &out[0], -1e30, 1e30)) != G4_OK) return r;
        out[1] = out[2] = out[0];
        return G4_OK;
    }
    if (c->j->nodes[n].type != G4__JARR || c->j->nodes[n].count != 3) {
        g4__seterr(c->err, "%s: field '%s%s' must be a number or a list of 3 numbers", c->name, c->scope, key);
        return G4_ERR_CONFIG;
    }
    for (k = 0, ch = c->j->nodes[n].child; k < 3; k++, ch = c->j->nodes[ch].next) {
        snprintf(what, sizeof what, "%s[%d]", key, k);
        if ((r = g4__cfg_num_node(c, ch, what, &out[k], -1e30, 1e30)) != G4_OK) return r;
    }
    return G4_OK;
}

/* The video processor's kind (video_processor_type, else a Gemma4UnifiedProcessor
   processor_class), and the 12B's as merged patches: as >>image_processing's. */
static g4_result g4__video_kind(const g4__cfg *c, const g4__json *j, g4_video_config *vc) {
    int n = g4__jget(j, c->obj, "video_processor_type"), pc = g4__jget(j, 0, "processor_class");
    if (n >= 0 && j->nodes[n].type != G4__JNULL) {
        const g4__jnode *t = &j->nodes[n];
        if (t->type == G4__JSTR && g4__jis(t, "Gemma4UnifiedVideoProcessor")) vc->kind = G4_IMAGE_UNIFIED;
        else if (t->type == G4__JSTR && g4__jis(t, "Gemma4VideoProcessor")) vc->kind = G4_IMAGE_GEMMA4;
        else {
            g4__seterr(vc->error, "%s: field '%svideo_processor_type' is %s%.64s%s; gemma4.h knows Gemma4VideoProcessor and "
                       "Gemma4UnifiedVideoProcessor", c->name, c->scope, t->type == G4__JSTR ? "\"" : "",
                       t->type == G4__JSTR ? t->str : "not a string", t->type == G4__JSTR ? "\"" : "");
            return G4_ERR_CONFIG;
        }
    } else if (pc >= 0 && g4__jstr_prefix(&j->nodes[pc], "Gemma4UnifiedProcessor")) {
        vc->kind = G4_IMAGE_UNIFIED;
    }
    return G4_OK;
}


/* Gemma4VideoProcessor's fields (g4__proc_parse opened c on its object) */
static g4_result g4__video_config_fields(g4_video_config *vc, const g4__cfg *c) {
    g4__patches g = g4__video_patches(vc);
    g4_result r;
    int resample, nf_null = 0, k;
    double nf;
#define G4__TRY(x) do { if ((r = (x)) != G4_OK) return r; } while (0)
    G4__TRY(g4__video_kind(c, c->j, vc));
    G4__TRY(g4__patches_fields(&g, c));
    G4__TRY(g4__cfg_bool(c, "do_normalize", &vc->do_normalize, 1));
    G4__TRY(g4__cfg_bool(c, "do_convert_rgb", &vc->do_convert_rgb, 1));
    G4__TRY(g4__cfg_bool(c, "do_sample_frames", &vc->do_sample_frames, 1));
    G4__TRY(g4__vcfg_num(c, "rescale_factor", &vc->rescale_factor, 1.0 / 255.0, 1e-30, 1e30, NULL));
    G4__TRY(g4__vcfg_triple(c, "image_mean", vc->image_mean));
    G4__TRY(g4__vcfg_triple(c, "image_std", vc->image_std));
    G4__TRY(g4__vcfg_num(c, "num_frames", &nf, 32, 1, G4_VIDEO_MAX_FRAMES, &nf_null));
    G4__TRY(g4__vcfg_num(c, "fps", &vc->fps, 0, 1e-9, 1e9, NULL));
    G4__TRY(g4__cfg_int(c, "resample", &resample, 3, 0, 0, 5));
#undef G4__TRY
    if (nf != floor(nf)) {
        g4__seterr(vc->error, "%s: field '%snum_frames' must be an integer, got %g", c->name, c->scope, nf);
        return G4_ERR_CONFIG;
    }
    vc->num_frames = nf_null ? 0 : (int)nf; /* null: None, frames by fps (or all) */
    r = g4__soft_tokens_check(vc->max_soft_tokens, c, "Gemma4VideoProcessor", vc->error);
    if (r != G4_OK) { /* its message is set */
    } else if (resample != 3) {
        g4__seterr(vc->error, "%s: field '%sresample' is %d; gemma4.h supports only 3 (bicubic)", c->name, c->scope, resample);
        r = G4_ERR_CONFIG;
    }
    for (k = 0; k < 3 && r == G4_OK; k++)
        if (vc->do_normalize && vc->image_std[k] == 0.0f) {
            g4__seterr(vc->error, "%s: field '%simage_std' has a zero: the normalisation would divide by it", c->name,
                       c->scope);
            r = G4_ERR_CONFIG;
        }
    if (r == G4_OK && vc->kind == G4_IMAGE_UNIFIED) r = g4__patches_unify(&g, c->name);
    return r;
}

G4__DEF g4_result g4_video_config_check(g4_video_config *vc, const g4_config *c) {
    g4__patches g;
    g4_result r;
    if (!vc) return G4_ERR_INPUT;
    g = g4__video_patches(vc);
    if ((r = g4__patches_check(&g, c)) != G4_OK) return r;
    if (c->video_token_id < 0) { g4__seterr(vc->error, "the model's config has no video_token_id"); return G4_ERR_CONFIG; }
    return G4_OK;
}

G4__DEF g4_result g4_video_sample_frames(g4_video_config *vc, int total, double video_fps, int *indices, int cap, int *n) {
    int64_t num, i;
    if (!vc) return G4_ERR_INPUT;
    if (n) *n = 0;
    if (!indices || !n || cap < 0) { g4__seterr(vc->error, "g4_video_sample_frames: NULL indices or n"); return G4_ERR_INPUT; }
    if (total < 1 || !(video_fps >= 0 && video_fps <= 1e9)) {
        g4__seterr(vc->error, "a video of %d frames at %g fps: need at least one frame and a finite rate (0: unknown)", total,
                   video_fps);
        return G4_ERR_INPUT;
    }
    if (!vc->do_sample_frames) {
        num = total;
    } else if (vc->num_frames > 0 && vc->fps > 0) {
        g4__seterr(vc->error, "num_frames (%d) and fps (%g) are both set: sample_frames takes one of them", vc->num_frames, vc->fps);
        return G4_ERR_INPUT;
    } else if (vc->num_frames > 0) {
        num = vc->num_frames;
    } else if (vc->fps > 0) {
        double d;
        if (video_fps <= 0) {
            g4__seterr(vc->error, "sampling %g frames per second needs the video's own rate (unknown here)", vc->fps);
            return G4_ERR_INPUT;
        }
        d = (double)total / video_fps * vc->fps; /* max(1, int(total_num_frames / video_fps * fps)) */
        num = d >= 1.0 ? (d < 1e15 ? (int64_t)d : (int64_t)1e15) : 1;
    } else {
        num = total;
    }
    if (num > total) {
        g4__seterr(vc->error, "sampling %lld frames from a video of %d", (long long)num, total);
        return G4_ERR_INPUT;
    }
    if (num > G4_VIDEO_MAX_FRAMES || num > cap) {
        g4__seterr(vc->error, "%lld frames to keep: more than %s (%d)", (long long)num,
                   num > G4_VIDEO_MAX_FRAMES ? "G4_VIDEO_MAX_FRAMES" : "cap", num > G4_VIDEO_MAX_FRAMES ? G4_VIDEO_MAX_FRAMES : cap);
        return G4_ERR_INPUT;
    }
    for (i = 0; i < num; i++) indices[i] = (int)(i * total / num); /* np.arange(num) * total // num */
    *n = (int)num;
    return G4_OK;
}

/* The image settings one frame is processed with: no rescale when normalising
   (that is fused into the normalisation, g4__video_norm) */
static g4_image_config g4__video_frame_config(const g4_video_config *vc) {
    g4_image_config ic = g4_image_config_init();
    ic.kind = vc->kind == G4_IMAGE_UNIFIED ? G4_IMAGE_UNIFIED : G4_IMAGE_GEMMA4; /* the 12B's: merged already */
    ic.patch_size = vc->patch_size;
    ic.max_soft_tokens = vc->max_soft_tokens;
    ic.pooling_kernel_size = vc->pooling_kernel_size;
    ic.do_resize = vc->do_resize;
    ic.do_convert_rgb = vc->do_convert_rgb;
    ic.do_rescale = vc->do_rescale && !vc->do_normalize;
    ic.rescale_factor = (float)vc->rescale_factor; /* image * scale: the scale as float32 */
    return ic;
}

G4__DEF size_t g4_video_scratch_size(const g4_video_config *vc, int height, int width) {
    g4_image_config ic;
    if (!vc) return 0;
    ic = g4__video_frame_config(vc);
    return g4_image_scratch_size(&ic, height, width);
}

G4__DEF g4_result g4_video_preprocess(g4_video_config *vc, const uint8_t *frames, int n_frames, int height, int width,
                                      int channels, void *scratch, size_t scratch_bytes, float *pixel_values,
                                      int32_t *positions, int *n_soft) {
    g4_image_config ic;
    float mean[3], std[3];
    size_t P, frame_px, f_pv, i;
    int f, ns = 0, max_patches, ch;
    g4_result r;
    if (!vc) return G4_ERR_INPUT;
    r = g4__preprocess_outputs(vc->error, "g4_video_preprocess: NULL frames", frames, pixel_values, positions, n_soft);
    if (r != G4_OK) return r;
    if (n_frames < 1 || n_frames > G4_VIDEO_MAX_FRAMES) {
        g4__seterr(vc->error, "a video of %d frames: need 1 .. %d", n_frames, G4_VIDEO_MAX_FRAMES);
        return G4_ERR_INPUT;
    }
    if (channels != 3) {
        g4__seterr(vc->error, "video frames of %d channels: gemma4.h takes RGB (3), as transformers' video processor does",
                   channels);
        return G4_ERR_INPUT;
    }
    if (!(vc->rescale_factor > 0 && vc->rescale_factor < 1e30)) {
        g4__seterr(vc->error, "video rescale_factor %g out of range", vc->rescale_factor);
        return G4_ERR_CONFIG;
    }
    ic = g4__video_frame_config(vc);
    /* _fuse_mean_std_and_rescale_factor: tensor(mean) * (1.0 / rescale_factor), the scalar as float32 */
    for (ch = 0; ch < 3; ch++) {
        float s = vc->do_rescale ? (float)(1.0 / vc->rescale_factor) : 1.0f;
        mean[ch] = vc->do_rescale ? vc->image_mean[ch] * s : vc->image_mean[ch];
        std[ch] = vc->do_rescale ? vc->image_std[ch] * s : vc->image_std[ch];
        if (vc->do_normalize && std[ch] == 0.0f) {
            g4__seterr(vc->error, "video image_std[%d] is zero", ch);
            return G4_ERR_CONFIG;
        }
    }
    max_patches = vc->max_soft_tokens * vc->pooling_kernel_size * vc->pooling_kernel_size;
    P = (size_t)3 * vc->patch_size * vc->patch_size;
    frame_px = (size_t)height * (size_t)width * 3; /* (checked by g4_image_preprocess before use) */
    for (f = 0; f < n_frames; f++) {
        float *pv = pixel_values + (size_t)f * max_patches * P;
        int got;
        if ((r = g4_image_preprocess(&ic, frames + (size_t)f * frame_px, height, width, 3, scratch, scratch_bytes, pv,
                                     positions + (size_t)f * max_patches * 2, &got)) != G4_OK) {
            memcpy(vc->error, ic.error, G4_ERROR_MAX);
            return r;
        }
        ns = got;
        /* normalize: (x - mean) / std in float32 on the real patches (the padding comes after: zeros) */
        f_pv = (size_t)got * vc->pooling_kernel_size * vc->pooling_kernel_size * P;
        if (vc->do_normalize)
            for (i = 0; i < f_pv; i++) pv[i] = (pv[i] - mean[i % 3]) / std[i % 3];
    }
    *n_soft = ns;
    return G4_OK;
}

/* Python's float // and % (float_floor_div, float_mod) for x >= 0, y > 0 */
static double g4__py_floordiv(double x, double y) {
    double mod = fmod(x, y), div = (x - mod) / y, fl;
    if (div == 0.0) return 0.0;
    fl = floor(div);
    if (div - fl > 0.5) fl += 1.0;
    return fl;
}

/* The text of an added token by its id, checked to map back to the id */
static int g4__token_text(const g4_tokenizer *tok, int32_t id, const char **s, size_t *len) {
    char buf[256];
    if (id < 0 || id >= tok->n_vocab || tok->text_len[id] == 0 || tok->text_len[id] >= sizeof buf) return 0;
    *s = tok->text + tok->text_off[id];
    *len = tok->text_len[id];
    memcpy(buf, *s, *len);
    buf[*len] = 0;
    return g4_token_id(tok, buf) == id;
}

G4__DEF g4_result g4_mm_expand_videos(const g4_tokenizer *tok, const g4_config *c, const char *text, size_t len,
                                      const g4_video_item *videos, int n_videos, char *out, size_t cap, size_t *n_out,
                                      char *err) {
    const char *vt, *boi, *eoi;
    size_t lvt, lboi, leoi, need = 0, pos;
    int pass, v, found, f, k;
    if (n_out) *n_out = 0;
    if (!tok || !c || !text || !n_out || n_videos < 0 || (n_videos > 0 && !videos)) {
        if (err) g4__seterr(err, "NULL argument");
        return G4_ERR_INPUT;
    }
    if (!g4__token_text(tok, c->video_token_id, &vt, &lvt) || !g4__token_text(tok, c->boi_token_id, &boi, &lboi) ||
        !g4__token_text(tok, c->eoi_token_id, &eoi, &leoi)) {
        if (err) g4__seterr(err, "the tokenizer has no token for the config's video_token_id %ld, boi_token_id %ld or "
                            "eoi_token_id %ld", (long)c->video_token_id, (long)c->boi_token_id, (long)c->eoi_token_id);
        return G4_ERR_INPUT;
    }
    for (v = 0; v < n_videos; v++) {
        const g4_video_item *it = &videos[v];
        if (it->n_frames < 1 || it->n_frames > G4_VIDEO_MAX_FRAMES || it->n_soft < 1 || it->n_soft > (1 << 20) ||
            !(it->fps >= 0 && it->fps <= 1e9)) {
            if (err) g4__seterr(err, "video %d: %d frames of %d soft tokens at %g fps (need 1 .. %d frames, 1 .. 2^20 soft "
                                "tokens, a finite rate; 0: unknown)", v, it->n_frames, it->n_soft, it->fps, G4_VIDEO_MAX_FRAMES);
            return G4_ERR_INPUT;
        }
        for (f = 0; it->frame_indices && f < it->n_frames; f++)
            if (it->frame_indices[f] < 0) {
                if (err) g4__seterr(err, "video %d: frame index %d is negative", v, it->frame_indices[f]);
                return G4_ERR_INPUT;
            }
    }
    /* pass 0 counts, pass 1 writes; the video token's occurrences left to right (re.finditer) */
    for (pass = 0; pass < 2; pass++) {
        need = 0;
        v = 0;
        for (pos = 0; pos < len;) {
            found = pos + lvt <= len && memcmp(text + pos, vt, lvt) == 0;
            if (!found) {
                if (pass) out[need] = text[pos];
                need++;
                pos++;
                continue;
            }
            pos += lvt;
            if (v >= n_videos) { v++; continue; }
            for (f = 0; f < videos[v].n_frames; f++) {
                /* replace_video_token: f"{int(s // 60):02d}:{int(s % 60):02d}" with s = index / fps (24 when unknown) */
                double fps = videos[v].fps > 0 ? videos[v].fps : 24.0;
                double s = (double)(videos[v].frame_indices ? videos[v].frame_indices[f] : f) / fps, mins, secs;
                char stamp[64];
                int ls;
                mins = g4__py_floordiv(s, 60.0);
                secs = fmod(s, 60.0);
                if (!(mins < 1e15)) {
                    if (err) g4__seterr(err, "video %d frame %d: a time of %g s is too large to stamp", v, f, s);
                    return G4_ERR_INPUT;
                }
                ls = snprintf(stamp, sizeof stamp, "%s%02lld:%02d ", f ? " " : "", (long long)mins, (int)secs);
                if (pass) memcpy(out + need, stamp, (size_t)ls);
                need += (size_t)ls;
                if (pass) memcpy(out + need, boi, lboi);
                need += lboi;
                for (k = 0; k < videos[v].n_soft; k++) {
                    if (pass) memcpy(out + need, vt, lvt);
                    need += lvt;
                }
                if (pass) memcpy(out + need, eoi, leoi);
                need += leoi;
            }
            v++;
        }
        if (pass == 0) {
            if (v != n_videos) {
                if (err) g4__seterr(err, "the text holds %d video placeholders, but %d videos were given", v, n_videos);
                return G4_ERR_INPUT;
            }
            *n_out = need;
            if (!out || need + 1 > cap) {
                if (err) g4__seterr(err, "%zu bytes of text do not fit in %zu", need + 1, cap);
                return G4_ERR_INPUT;
            }
        }
    }
    out[need] = 0;
    return G4_OK;
}

/* ---------------------------------------- audio features >>audio_features */
/* Gemma4AudioFeatureExtractor (feature_extraction_gemma4.py) with its
   defaults or a checkpoint's settings, and a WAV reader. Bits: numpy computes the FFT in complex64 and
   everything after it in float64; here the FFT is float64, its magnitude is
   rounded to float32 where numpy's is float32, and the rest is float64 as in
   numpy. So the features differ from transformers' by numpy's own float32 FFT
   rounding: a few 1e-7 on log values of order 1-10 (tests/test_audio.c
   states the bound it checks). The window (np.hanning), the mel filters
   (audio_utils.mel_filter_bank, htk, norm None) and the frame mask are
   computed with the same formulas in the same precision. */

#define G4__PI 3.14159265358979323846

G4__DEF void g4_audio_fe_free(g4_audio_fe *fe) {
    if (!fe) return;
    G4_FREE(fe->window);
    G4_FREE(fe->mel_filters);
    G4_FREE(fe->twiddle);
    fe->window = NULL;
    fe->mel_filters = NULL;
    fe->twiddle = NULL;
}

/* Gemma4AudioFeatureExtractor's defaults, no tables */
static void g4__audio_fe_defaults(g4_audio_fe *fe) {
    memset(fe, 0, sizeof *fe);
    fe->sampling_rate = 16000;
    fe->feature_size = 128;
    fe->frame_length = 320;  /* int(round(16000 * 20 / 1000)) */
    fe->hop_length = 160;    /* int(round(16000 * 10 / 1000)) */
    fe->fft_length = 512;    /* 2 ** ceil(log2(320)) */
    fe->max_length = 480000;
    fe->pad_to_multiple_of = 128;
    fe->min_frequency = 0.0;
    fe->max_frequency = 8000.0;
    fe->mel_floor = 1e-3;
    fe->input_scale_factor = 1.0;
    fe->audio_seq_length = 750;
}

static g4_result g4__audio_fe_tables(g4_audio_fe *fe);

G4__DEF g4_result g4_audio_fe_init(g4_audio_fe *fe) {
    if (!fe) return G4_ERR_INPUT;
    g4__audio_fe_defaults(fe);
    return g4__audio_fe_tables(fe);
}

G4__DEF g4_result g4_audio_fe_parse(g4_audio_fe *fe, const char *json, size_t len, const char *name) {
    g4_result r = g4__proc_parse(G4__PROC_AUDIO_FE, fe, json, len, name);
    return r == G4_OK ? g4__audio_fe_tables(fe) : r;
}

G4__DEF g4_result g4_audio_fe_load(g4_audio_fe *fe, const char *path) {
    g4_result r = g4__proc_config_load(G4__PROC_AUDIO_FE, fe, path);
    return r == G4_OK ? g4__audio_fe_tables(fe) : r;
}

G4__DEF g4_result g4_audio_fe_check(g4_audio_fe *fe, const g4_config *c) {
    if (!fe) return G4_ERR_INPUT;
    if (!c || c->unified) {
        g4__seterr(fe->error, "the model is %s: its feature extractor is Gemma4UnifiedAudioFeatureExtractor "
                   "(g4_unified_fe_load)", c ? "a gemma4_unified one" : "NULL");
        return G4_ERR_CONFIG;
    }
    if (!c->audio.present) { g4__seterr(fe->error, "the model has no audio_config"); return G4_ERR_CONFIG; }
    if (fe->feature_size != c->audio.subsampling_conv_channels[0]) {
        g4__seterr(fe->error, "the feature extractor's feature_size %d contradicts the model's audio tower, which takes "
                   "%d mel bins (audio_config.subsampling_conv_channels[0])", fe->feature_size,
                   c->audio.subsampling_conv_channels[0]);
        return G4_ERR_CONFIG;
    }
    return G4_OK;
}

/* A number field as a double: absent or null gives def; else in [lo, hi] (g4__vcfg_num's rule) */
static g4_result g4__cfg_double(const g4__cfg *c, const char *key, double *out, double def, double lo, double hi) {
    return g4__vcfg_num(c, key, out, def, lo, hi, NULL);
}

/* a stored sample count (save_pretrained writes frame_length, hop_length, fft_length) must be what
   transformers computes from the ms settings: it recomputes them and ignores the stored ones */
static g4_result g4__audio_fe_stored(const g4__cfg *c, const char *key, int want, const char *from) {
    int got;
    g4_result r = g4__cfg_int(c, key, &got, want, 0, 0, INT32_MAX);
    if (r != G4_OK) return r;
    if (got != want) {
        g4__seterr(c->err, "%s: field '%s%s' is %d, but %s gives %d (transformers computes it from those and ignores "
                   "the stored value)", c->name, c->scope, key, got, from, want);
        return G4_ERR_CONFIG;
    }
    return G4_OK;
}

/* Gemma4AudioFeatureExtractor.__init__'s arguments (g4__proc_parse opened c on its object), and the
   processor's audio_seq_length and audio_ms_per_token at the top level */
static g4_result g4__audio_fe_fields(g4_audio_fe *fe, const g4__cfg *c) {
    const g4__json *j = c->j;
    g4__cfg top = *c;
    g4_result r;
    double frame_ms, hop_ms, v, frame, hop;
    int n, flag, fft;
    char from[160];
    static const char *const refused[] = {"per_bin_mean", "per_bin_stddev"};
#define G4__TRY(x) do { if ((r = (x)) != G4_OK) return r; } while (0)
    top.obj = 0;
    top.scope = "";
    G4__TRY(g4__cfg_int(&top, "audio_seq_length", &fe->audio_seq_length, 750, 0, 1, 1 << 20));
    G4__TRY(g4__cfg_int(&top, "audio_ms_per_token", &flag, 40, 0, 1, 1 << 20)); /* documentation only in transformers */
    n = g4__jget(j, c->obj, "feature_extractor_type");
    if (n >= 0 && j->nodes[n].type != G4__JNULL && !g4__jis(&j->nodes[n], "Gemma4AudioFeatureExtractor")) {
        g4__seterr(fe->error, "%s: field '%sfeature_extractor_type' is %s%.64s%s; Gemma 4's is Gemma4AudioFeatureExtractor%s",
                   c->name, c->scope, j->nodes[n].type == G4__JSTR ? "\"" : "",
                   j->nodes[n].type == G4__JSTR ? j->nodes[n].str : "not a string", j->nodes[n].type == G4__JSTR ? "\"" : "",
                   g4__jis(&j->nodes[n], "Gemma4UnifiedAudioFeatureExtractor") ? " (this one is the 12B's: g4_unified_fe_load)" : "");
        return G4_ERR_CONFIG;
    }
    G4__TRY(g4__cfg_int(c, "sampling_rate", &fe->sampling_rate, 16000, 0, 1, 1 << 24));
    G4__TRY(g4__cfg_int(c, "feature_size", &fe->feature_size, 128, 0, 1, 4096));
    G4__TRY(g4__cfg_double(c, "frame_length_ms", &frame_ms, 20.0, 0.0, 1e9));
    G4__TRY(g4__cfg_double(c, "hop_length_ms", &hop_ms, 10.0, 0.0, 1e9));
    G4__TRY(g4__cfg_bool(c, "fft_overdrive", &flag, 0));
    /* int(round(sampling_rate * ms / 1000.0)): Python rounds half to even, as rint does by default */
    frame = rint((double)fe->sampling_rate * frame_ms / 1000.0);
    hop = rint((double)fe->sampling_rate * hop_ms / 1000.0);
    if (!(frame >= 2 && frame <= 65536)) {
        g4__seterr(fe->error, "%s: field '%sframe_length_ms' is %g: %g samples per frame at %d Hz; gemma4.h takes 2 to "
                   "65536", c->name, c->scope, frame_ms, frame, fe->sampling_rate);
        return G4_ERR_CONFIG;
    }
    if (!(hop >= 1 && hop <= 65536)) {
        g4__seterr(fe->error, "%s: field '%shop_length_ms' is %g: a hop of %g samples at %d Hz; gemma4.h takes 1 to "
                   "65536", c->name, c->scope, hop_ms, hop, fe->sampling_rate);
        return G4_ERR_CONFIG;
    }
    fe->frame_length = (int)frame;
    fe->hop_length = (int)hop;
    for (fft = 1; fft < fe->frame_length; fft *= 2) {} /* 2 ** ceil(log2(frame_length)) */
    fe->fft_length = flag ? 2 * fft : fft;
    if ((int64_t)(fe->fft_length / 2 + 1) * fe->feature_size > (1 << 22)) {
        g4__seterr(fe->error, "%s: field '%sfeature_size' is %d with an FFT of %d: %lld mel filter weights; gemma4.h takes "
                   "at most 2^22", c->name, c->scope, fe->feature_size, fe->fft_length,
                   (long long)(fe->fft_length / 2 + 1) * fe->feature_size);
        return G4_ERR_CONFIG;
    }
    snprintf(from, sizeof from, "frame_length_ms %g at sampling_rate %d", frame_ms, fe->sampling_rate);
    G4__TRY(g4__audio_fe_stored(c, "frame_length", fe->frame_length, from));
    snprintf(from, sizeof from, "hop_length_ms %g at sampling_rate %d", hop_ms, fe->sampling_rate);
    G4__TRY(g4__audio_fe_stored(c, "hop_length", fe->hop_length, from));
    snprintf(from, sizeof from, "a frame_length of %d with fft_overdrive %s", fe->frame_length, flag ? "true" : "false");
    G4__TRY(g4__audio_fe_stored(c, "fft_length", fe->fft_length, from));
    G4__TRY(g4__cfg_double(c, "min_frequency", &fe->min_frequency, 0.0, 0.0, 1e9));
    G4__TRY(g4__cfg_double(c, "max_frequency", &fe->max_frequency, 8000.0, 0.0, 1e9));
    if (!(fe->max_frequency > fe->min_frequency)) {
        g4__seterr(fe->error, "%s: field '%smax_frequency' is %g, not above min_frequency %g", c->name, c->scope,
                   fe->max_frequency, fe->min_frequency);
        return G4_ERR_CONFIG;
    }
    G4__TRY(g4__cfg_double(c, "mel_floor", &fe->mel_floor, 1e-3, 0.0, 1e30));
    G4__TRY(g4__cfg_double(c, "input_scale_factor", &fe->input_scale_factor, 1.0, -1e30, 1e30));
    G4__TRY(g4__cfg_double(c, "padding_value", &v, 0.0, -1e30, 1e30));
    G4__TRY(g4__cfg_bool(c, "preemphasis_htk_flavor", &flag, 1));
    G4__TRY(g4__cfg_double(c, "dither", &v, 0.0, -1e30, 1e30));
    if (v > 0.0) {
        g4__seterr(fe->error, "%s: field '%sdither' is %g; gemma4.h supports only 0 (transformers adds numpy's random "
                   "noise, which cannot be reproduced)", c->name, c->scope, v);
        return G4_ERR_CONFIG;
    }
    G4__TRY(g4__cfg_double(c, "preemphasis", &v, 0.0, -1e30, 1e30));
    if (v > 0.0) {
        g4__seterr(fe->error, "%s: field '%spreemphasis' is %g; gemma4.h supports only 0", c->name, c->scope, v);
        return G4_ERR_CONFIG;
    }
    for (n = 0; n < 2; n++) {
        int k = g4__jget(j, c->obj, refused[n]);
        if (k >= 0 && j->nodes[k].type != G4__JNULL) {
            g4__seterr(fe->error, "%s: field '%s%s' is set; gemma4.h supports only null", c->name, c->scope, refused[n]);
            return G4_ERR_CONFIG;
        }
    }
    G4__TRY(g4__cfg_expect_str(c, "padding_side", "right", NULL));
    G4__TRY(g4__cfg_bool(c, "return_attention_mask", &flag, 1));
#undef G4__TRY
    if (!flag) {
        g4__seterr(fe->error, "%s: field '%sreturn_attention_mask' is false; the audio tower needs input_features_mask "
                   "(without it transformers skips the audio)", c->name, c->scope);
        return G4_ERR_CONFIG;
    }
    return G4_OK;
}

/* the window, the mel filters and the FFT's twiddles for fe's settings */
static g4_result g4__audio_fe_tables(g4_audio_fe *fe) {
    int k, m, nb, nm, M;
    double mel_min, mel_max, step, *ff, *fft;
    nb = fe->fft_length / 2 + 1;
    nm = fe->feature_size;
    fe->window = (float *)G4_MALLOC(sizeof(float) * (size_t)fe->frame_length);
    fe->mel_filters = (double *)G4_MALLOC(sizeof(double) * (size_t)nb * (size_t)nm);
    fe->twiddle = (double *)G4_MALLOC(sizeof(double) * (size_t)fe->fft_length);
    ff = (double *)G4_MALLOC(sizeof(double) * (size_t)(nm + 2) + sizeof(double) * (size_t)nb);
    if (!fe->window || !fe->mel_filters || !fe->twiddle || !ff) {
        G4_FREE(ff);
        g4_audio_fe_free(fe);
        g4__seterr(fe->error, "out of memory");
        return G4_ERR_NOMEM;
    }
    fft = ff + nm + 2;
    /* window_function(320): np.hanning(321)[:-1] as float32: 0.5 + 0.5 cos(pi n / (M - 1)), n = 1-M, 3-M, ... */
    M = fe->frame_length + 1;
    for (k = 0; k < fe->frame_length; k++) {
        double n = (double)(1 - M + 2 * k);
        fe->window[k] = (float)(0.5 + 0.5 * cos(G4__PI * n / (double)(M - 1)));
    }
    /* mel_filter_bank: centres np.linspace(mel(fmin), mel(fmax), nm + 2) back in Hz, bins np.linspace(0, sr // 2, nb) */
    mel_min = 2595.0 * log10(1.0 + fe->min_frequency / 700.0);
    mel_max = 2595.0 * log10(1.0 + fe->max_frequency / 700.0);
    step = (mel_max - mel_min) / (double)(nm + 1);
    for (m = 0; m < nm + 2; m++) {
        double mel = m == nm + 1 ? mel_max : (double)m * step + mel_min;
        ff[m] = 700.0 * (pow(10.0, mel / 2595.0) - 1.0);
    }
    step = (double)(fe->sampling_rate / 2) / (double)(nb - 1);
    for (k = 0; k < nb; k++) fft[k] = k == nb - 1 ? (double)(fe->sampling_rate / 2) : (double)k * step;
    for (k = 0; k < nb; k++)
        for (m = 0; m < nm; m++) {
            double down = -(ff[m] - fft[k]) / (ff[m + 1] - ff[m]);
            double up = (ff[m + 2] - fft[k]) / (ff[m + 2] - ff[m + 1]);
            double v = down < up ? down : up;
            fe->mel_filters[(size_t)k * nm + m] = v > 0.0 ? v : 0.0;
        }
    for (k = 0; k < fe->fft_length / 2; k++) {
        fe->twiddle[2 * k] = cos(2.0 * G4__PI * k / fe->fft_length);
        fe->twiddle[2 * k + 1] = -sin(2.0 * G4__PI * k / fe->fft_length);
    }
    G4_FREE(ff);
    return G4_OK;
}

G4__DEF int g4_audio_fe_frames(const g4_audio_fe *fe, int n_samples) {
    long long padded, span;
    if (!fe || n_samples < 1) return 0;
    padded = ((long long)n_samples + fe->pad_to_multiple_of - 1) / fe->pad_to_multiple_of * fe->pad_to_multiple_of;
    span = padded + fe->frame_length / 2 - (fe->frame_length + 1); /* after the semicausal padding */
    return span < 0 ? 0 : (int)(span / fe->hop_length + 1);
}

G4__DEF size_t g4_audio_fe_scratch(const g4_audio_fe *fe) {
    return fe ? (size_t)fe->fft_length * 4 + 16 : 0; /* re, im (doubles) */
}

/* In-place radix-2 FFT of re/im (n a power of two), forward (e^-i). */
static void g4__fft(double *re, double *im, int n, const double *tw) {
    int i, j, len, k;
    for (i = 1, j = 0; i < n; i++) { /* bit reversal */
        int bit = n >> 1;
        for (; j & bit; bit >>= 1) j ^= bit;
        j ^= bit;
        if (i < j) {
            double t = re[i]; re[i] = re[j]; re[j] = t;
            t = im[i]; im[i] = im[j]; im[j] = t;
        }
    }
    for (len = 2; len <= n; len <<= 1) {
        int stride = n / len;
        for (i = 0; i < n; i += len)
            for (k = 0; k < len / 2; k++) {
                double wr = tw[2 * (k * stride)], wi = tw[2 * (k * stride) + 1];
                double *ar = re + i + k, *ai = im + i + k, *br = re + i + k + len / 2, *bi = im + i + k + len / 2;
                double xr = *br * wr - *bi * wi, xi = *br * wi + *bi * wr;
                *br = *ar - xr; *bi = *ai - xi;
                *ar += xr; *ai += xi;
            }
    }
}

G4__DEF g4_result g4_audio_features(g4_audio_fe *fe, const float *pcm, int n_samples, int sample_rate,
                                    float *features, unsigned char *mask, int *n_frames, float *scratch) {
    int nf, i, s, k, m, nb, nm, N, pad_left;
    double *re, *im;
    if (n_frames) *n_frames = 0;
    if (!fe || !fe->window) return G4_ERR_INPUT;
    if (!pcm || !features || !mask || !n_frames || !scratch) { g4__seterr(fe->error, "g4_audio_features: NULL argument"); return G4_ERR_INPUT; }
    if (sample_rate != fe->sampling_rate) {
        g4__seterr(fe->error, "audio at %d Hz: the feature extractor takes %d Hz only (resample it first)", sample_rate,
                   fe->sampling_rate);
        return G4_ERR_INPUT;
    }
    if (n_samples > fe->max_length) {
        g4__seterr(fe->error, "audio of %d samples (%.2f s) is past the %d-sample (%.0f s) limit; transformers would "
                   "cut it there silently", n_samples, n_samples / (double)sample_rate, fe->max_length,
                   fe->max_length / (double)sample_rate);
        return G4_ERR_INPUT;
    }
    nf = g4_audio_fe_frames(fe, n_samples);
    if (nf < 1) {
        g4__seterr(fe->error, "audio of %d samples gives no feature frame", n_samples);
        return G4_ERR_INPUT;
    }
    for (s = 0; s < n_samples; s++)
        if (!isfinite(pcm[s])) { g4__seterr(fe->error, "audio sample %d is not finite", s); return G4_ERR_INPUT; }
    nb = fe->fft_length / 2 + 1;
    nm = fe->feature_size;
    N = fe->fft_length;
    pad_left = fe->frame_length / 2;
    re = (double *)(void *)(((uintptr_t)scratch + 15) & ~(uintptr_t)15);
    im = re + N;
    for (i = 0; i < nf; i++) {
        float *out = features + (size_t)i * nm;
        mask[i] = (long long)i * fe->hop_length + fe->frame_length - pad_left < n_samples;
        for (s = 0; s < N; s++) {
            long long j = (long long)i * fe->hop_length + s - pad_left; /* the sample under window slot s */
            float x = s < fe->frame_length && j >= 0 && j < n_samples ? pcm[j] : 0.0f;
            if (fe->input_scale_factor != 1.0) x *= (float)fe->input_scale_factor; /* float32 waveform * a Python float */
            re[s] = s < fe->frame_length ? (double)(x * fe->window[s]) : 0.0;
            im[s] = 0.0;
        }
        g4__fft(re, im, N, fe->twiddle);
        for (k = 0; k < nb; k++) re[k] = (double)(float)sqrt(re[k] * re[k] + im[k] * im[k]); /* numpy's |complex64| */
        for (m = 0; m < nm; m++) {
            double mel = 0.0;
            for (k = 0; k < nb; k++) mel += re[k] * fe->mel_filters[(size_t)k * nm + m];
            out[m] = mask[i] ? (float)log(mel + fe->mel_floor) : 0.0f;
            if (!isfinite(out[m])) { /* numpy's float32 magnitude overflows the same way (inf, or inf * 0 = nan) */
                g4__seterr(fe->error, "audio frame %d: the log-mel feature %d is not finite (samples far outside "
                           "[-1, 1] overflow the float32 spectrum)", i, m);
                return G4_ERR_INPUT;
            }
        }
    }
    *n_frames = nf;
    return G4_OK;
}

static uint32_t g4__le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static unsigned g4__le16(const unsigned char *p) { return (unsigned)p[0] | (unsigned)p[1] << 8; }

G4__DEF g4_result g4_wav_parse(const unsigned char *d, size_t len, float *out, size_t cap, size_t *n, int *rate,
                               char *err) {
    size_t off = 12, i, count;
    const unsigned char *fmt = NULL, *data = NULL;
    size_t fmt_len = 0, data_len = 0;
    unsigned format, channels, bits, align;
    char dummy[G4_ERROR_MAX];
    if (!err) err = dummy;
    if (n) *n = 0;
    if (rate) *rate = 0;
    if (!d || !n || !rate) { g4__seterr(err, "WAV: NULL argument"); return G4_ERR_INPUT; }
    if (len < 12 || memcmp(d, "RIFF", 4) != 0 || memcmp(d + 8, "WAVE", 4) != 0) {
        g4__seterr(err, "WAV: not a RIFF/WAVE file");
        return G4_ERR_INPUT;
    }
    while (off + 8 <= len) {
        uint32_t sz = g4__le32(d + off + 4);
        const unsigned char *body = d + off + 8;
        size_t avail = len - off - 8;
        if (memcmp(d + off, "fmt ", 4) == 0) {
            if (sz > avail) { g4__seterr(err, "WAV: the fmt chunk (%lu bytes) runs past the end of the file", (unsigned long)sz); return G4_ERR_INPUT; }
            fmt = body;
            fmt_len = sz;
        } else if (memcmp(d + off, "data", 4) == 0) {
            if (sz > avail) {
                g4__seterr(err, "WAV: the data chunk claims %lu bytes but the file has %zu after its header (truncated?)",
                           (unsigned long)sz, avail);
                return G4_ERR_INPUT;
            }
            data = body;
            data_len = sz;
            break;
        }
        if (sz > avail) break;
        off += 8 + (size_t)sz + (sz & 1);
    }
    if (!fmt) { g4__seterr(err, "WAV: no fmt chunk before the data"); return G4_ERR_INPUT; }
    if (fmt_len < 16) { g4__seterr(err, "WAV: the fmt chunk has %zu bytes, fewer than 16", fmt_len); return G4_ERR_INPUT; }
    if (!data) { g4__seterr(err, "WAV: no data chunk"); return G4_ERR_INPUT; }
    format = g4__le16(fmt);
    channels = g4__le16(fmt + 2);
    bits = g4__le16(fmt + 14);
    align = g4__le16(fmt + 12);
    if (format == 0xFFFEu) { /* WAVE_FORMAT_EXTENSIBLE: the sub-format GUID starts with the format code */
        if (fmt_len < 40) { g4__seterr(err, "WAV: an extensible fmt chunk has %zu bytes, fewer than 40", fmt_len); return G4_ERR_INPUT; }
        format = g4__le16(fmt + 24);
    }
    if (channels != 1) { g4__seterr(err, "WAV: %u channels; only mono is taken (mix it down first)", channels); return G4_ERR_INPUT; }
    if (!((format == 1 && bits == 16) || (format == 3 && bits == 32))) {
        g4__seterr(err, "WAV: format %u with %u bits a sample; only PCM 16-bit (format 1) and float 32-bit (format 3) "
                   "are taken", format, bits);
        return G4_ERR_INPUT;
    }
    if (align != bits / 8) { g4__seterr(err, "WAV: block align %u, expected %u for one %u-bit channel", align, bits / 8, bits); return G4_ERR_INPUT; }
    if (data_len % align) { g4__seterr(err, "WAV: the data chunk (%zu bytes) is not a whole number of %u-byte samples", data_len, align); return G4_ERR_INPUT; }
    if (g4__le32(fmt + 4) > 0x7fffffffu) { g4__seterr(err, "WAV: sample rate %lu", (unsigned long)g4__le32(fmt + 4)); return G4_ERR_INPUT; }
    count = data_len / align;
    *rate = (int)g4__le32(fmt + 4);
    *n = count;
    if (!out) return G4_OK;
    if (count > cap) { g4__seterr(err, "WAV: %zu samples do not fit in %zu", count, cap); return G4_ERR_INPUT; }
    for (i = 0; i < count; i++) {
        if (format == 1) {
            int v = (int)g4__le16(data + 2 * i);
            if (v >= 32768) v -= 65536;
            out[i] = (float)v / 32768.0f;
        } else {
            uint32_t u = g4__le32(data + 4 * i);
            float f;
            memcpy(&f, &u, 4);
            out[i] = f;
        }
    }
    return G4_OK;
}

/* ----------------------------------------------- the 12B's processor >>unified_processing */
/* Gemma4UnifiedProcessor (transformers 5.23.0, models/gemma4_unified/
   processing_gemma4_unified.py) is Gemma4Processor with other sub-processors:
     image: Gemma4UnifiedImageProcessor = >>image_processing with kind
            G4_IMAGE_UNIFIED (patches of k p pixels, no pooling); the run is
            boi, num_soft_tokens_per_image x image, eoi (no other text);
     audio: Gemma4UnifiedAudioFeatureExtractor: the waveform zero-padded to a
            multiple of audio_samples_per_token and cut into frames, all
            valid (g4_unified_audio_frames, gemma4.h); the run is boa,
            input_features_mask.sum() = ceil(n / A) x audio, eoa;
   both through g4_mm_expand. Video (timestamps, frames) is not here. */

G4__DEF g4_unified_fe g4_unified_fe_init(void) {
    g4_unified_fe fe;
    memset(&fe, 0, sizeof fe);
    fe.audio_samples_per_token = 640;
    fe.sampling_rate = 16000;
    return fe;
}

/* Gemma4UnifiedAudioFeatureExtractor's fields (g4__proc_parse opened c on its object) */
static g4_result g4__unified_fe_fields(g4_unified_fe *fe, const g4__cfg *c) {
    const g4__json *j = c->j;
    g4_result r;
    int n = g4__jget(j, c->obj, "feature_extractor_type"), feature_size;
    if (n >= 0 && j->nodes[n].type != G4__JNULL && !g4__jis(&j->nodes[n], "Gemma4UnifiedAudioFeatureExtractor")) {
        g4__seterr(fe->error, "%s: field '%sfeature_extractor_type' is %s%.64s%s; the 12B's is Gemma4UnifiedAudioFeatureExtractor",
                   c->name, c->scope, j->nodes[n].type == G4__JSTR ? "\"" : "", j->nodes[n].type == G4__JSTR ? j->nodes[n].str :
                   "not a string", j->nodes[n].type == G4__JSTR ? "\"" : "");
        return G4_ERR_CONFIG;
    }
    if ((r = g4__cfg_int(c, "audio_samples_per_token", &fe->audio_samples_per_token, 640, 0, 1, 1 << 20)) != G4_OK ||
        (r = g4__cfg_int(c, "feature_size", &feature_size, fe->audio_samples_per_token, 0, 1, 1 << 20)) != G4_OK ||
        (r = g4__cfg_int(c, "sampling_rate", &fe->sampling_rate, 16000, 0, 1, 1 << 24)) != G4_OK)
        return r;
    if (feature_size != fe->audio_samples_per_token) {
        g4__seterr(fe->error, "%s: field '%sfeature_size' is %d but '%saudio_samples_per_token' %d: the frames are "
                   "audio_samples_per_token samples wide", c->name, c->scope, feature_size, c->scope, fe->audio_samples_per_token);
        return G4_ERR_CONFIG;
    }
    return G4_OK;
}

G4__DEF g4_result g4_unified_fe_check(g4_unified_fe *fe, const g4_config *c) {
    if (!fe) return G4_ERR_INPUT;
    if (!c || !c->unified || !c->unified_audio.present) {
        g4__seterr(fe->error, "the model is not a gemma4_unified one with an audio_config");
        return G4_ERR_CONFIG;
    }
    if (fe->audio_samples_per_token != c->unified_audio.audio_embed_dim) {
        g4__seterr(fe->error, "the feature extractor's audio_samples_per_token %d contradicts the model's "
                   "audio_config.audio_embed_dim %d", fe->audio_samples_per_token, c->unified_audio.audio_embed_dim);
        return G4_ERR_CONFIG;
    }
    return G4_OK;
}

G4__DEF g4_result g4_unified_fe_frames(g4_unified_fe *fe, const float *pcm, size_t n, float *frames, int max_frames,
                                      int *n_frames) {
    long long rows;
    size_t A;
    if (!fe) return G4_ERR_INPUT;
    if (!frames || !n_frames || (!pcm && n)) { g4__seterr(fe->error, "g4_unified_fe_frames: NULL pcm, frames or n_frames"); return G4_ERR_INPUT; }
    *n_frames = 0;
    if ((rows = g4_unified_audio_tokens(fe, n)) < 0) { g4__seterr(fe->error, "g4_unified_fe_frames: audio_samples_per_token < 1"); return G4_ERR_INPUT; }
    if (rows > (long long)(max_frames > 0 ? max_frames : 0)) {
        g4__seterr(fe->error, "%llu samples make %lld frames of %d; room for %d", (unsigned long long)n, rows,
                   fe->audio_samples_per_token, max_frames);
        return G4_ERR_INPUT;
    }
    A = (size_t)fe->audio_samples_per_token;
    if (n) memcpy(frames, pcm, sizeof(float) * n);
    memset(frames + n, 0, sizeof(float) * ((size_t)rows * A - n)); /* np.pad with zeros */
    *n_frames = (int)rows;
    return G4_OK;
}

G4__DEF long long g4_unified_audio_tokens(const g4_unified_fe *fe, size_t n_samples) {
    if (!fe || fe->audio_samples_per_token < 1) return -1;
    return (long long)(n_samples / (size_t)fe->audio_samples_per_token + (n_samples % (size_t)fe->audio_samples_per_token != 0));
}

#endif /* GEMMA4_PROCESSING_IMPLEMENTATION_DONE */
#endif /* GEMMA4_IMPLEMENTATION */
