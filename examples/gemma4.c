/* gemma4 - the command-line face of gemma4.h.

   One command per row of the table `commands` at the end of this file (name,
   handler, one line of summary); `gemma4 help` lists them, and
   `gemma4 help COMMAND` (or `gemma4 COMMAND --help`) prints the command's
   options, each with its rule and default, from the option table the command
   parses with (examples/args.h): that output is the flag reference.

   `logits` runs the ids as one sequence and writes float32 little-endian
   logits for every position, [n_ids][vocab], to FILE, and prints the argmax
   of each position. `greedy` appends N greedily chosen tokens and prints all
   ids. `compare` runs the ids stored in a dump (tools/hf_dump.py) and prints,
   tap by tap in forward order, how far gemma4.h is from the dump; exit status
   0 when every tap is within tolerance, 2 when one is not.
   `grad` writes the loss and every trained tensor's gradient (examples/train.h).
   `tokenize` prints the ids of TEXT (or of all of stdin) as tokenizers'
   encode(TEXT).ids does (the post-processor's <bos> included). `generate`
   streams the answer to stdout, then prints token counts and speeds to
   stderr on a line of their own; it stops at <eos> or <turn|>. Defaults:
   temperature 1, top-k 64, top-p 0.95 (Gemma's generation_config), a seed
   from the OS (/dev/urandom) printed to stderr; --temp 0 is greedy. `chat`
   keeps one session, so each turn feeds only its own tokens. The tokenizer is
   DIR/tokenizer.json unless --tokenizer is given.

   Every command that runs the model takes --threads N (default: the
   machine's cores); the results are the same bits for any N. On a terminal,
   stderr shows progress for loading, synth, grad and prefills longer than
   one chunk.

   Exit status: 0 when the command did what was asked; 1 on an error (one
   line on stderr naming the file, flag or value); compare: 2 when a tap is
   over tolerance. A context that fills before generate has written
   --max-tokens tokens is an error; chat starts over instead, saying so. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, isatty, opendir */
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include "../gemma4_processing.h"
#include "args.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* What every command that loads a model shares (main() resets them). The
   CLI is a program: these are its globals, not the library's. */
static const char *adapter_dir; /* --adapter DIR: a PEFT LoRA adapter */
static int adapter_bf16;        /* --adapter-bf16: the adapter cast to bf16 too (g4_session_config.lora_bf16) */
static int n_threads;           /* --threads N (default: the machine's cores) */
static g4_pool *threads_pool;   /* made on first use for n_threads > 1; freed by main() */
static int bf16_fast;           /* --bf16-fast: --bf16 with g4_session_config.bf16_fast */

/* The options of the commands that load a model: --adapter, --adapter-bf16, --threads. */
#define OPT_ADAPTER                                                                                            \
    G4A_S("--adapter", &adapter_dir, "DIR", "a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors)"), \
    G4A_F("--adapter-bf16", &adapter_bf16, "with --bf16 and --adapter: the adapter cast to bf16 too, as PEFT runs it")
/* --image FILE, --audio FILE (repeatable, one list in command-line order; mm.h) and --processor DIR */
#define OPT_MEDIA(o)                                                                                           \
    G4A_L("--image", &(o)->media, G4MM_IMAGE, "FILE", "a PNG or JPEG: the k-th fills the prompt's k-th image placeholder (<|image|>)"), \
    G4A_L("--audio", &(o)->media, G4MM_AUDIO, "FILE", "a WAV (16 kHz mono): the k-th fills the k-th audio placeholder (<|audio|>)"), \
    G4A_L("--video", &(o)->media, G4MM_VIDEO, "DIR|F1,F2,...", "a video's frames (PNG/JPEG of one size, in order; a directory: " \
          "its image files by name): the k-th fills the k-th <|video|> with its frames' mm:ss stamps"), \
    G4A_S("--processor", &(o)->processor, "DIR", "with --image, --video or --audio: the directory of processor_config.json (default DIR)")
/* beside every --bf16: the bf16 mode on VDPBF16PS (implies --bf16) */
#define OPT_BF16_FAST                                                                                          \
    G4A_F("--bf16-fast", &bf16_fast, "--bf16 on VDPBF16PS where the CPU has avx512_bf16: faster, its own summation " \
          "order, not transformers' bits (within 3e-2 of --bf16; elsewhere --bf16)")
#define OPT_THREADS G4A_I("--threads", &n_threads, "N", 1, 4096, "threads (default: the machine's cores); any N gives the same bits")

static int cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 4096 ? 4096 : (int)n;
}

/* the pool for --threads (NULL for one thread); 1 after a message when it cannot start */
static int get_pool(g4_pool **pool) {
    *pool = NULL;
    if (n_threads <= 1) return 0;
    if (!threads_pool && g4_pool_create(&threads_pool, n_threads) != G4_OK) {
        fprintf(stderr, "gemma4: cannot start %d threads (--threads)\n", n_threads);
        return 1;
    }
    *pool = threads_pool;
    return 0;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* An error message on one line of stderr (a template's raise_exception text
   may hold newlines). */
static void print_error(const char *msg) {
    fputs("gemma4: ", stderr);
    for (const char *p = msg; *p; p++) fputc(*p == '\n' || *p == '\r' ? ' ' : *p, stderr);
    fputc('\n', stderr);
}

/* fopen for the CLI's own files; NULL after "gemma4: PATH: cannot open for
   reading|writing (reason)" */
static FILE *open_file(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (!f) fprintf(stderr, "gemma4: %s: cannot open for %s (%s)\n", path, mode[0] == 'r' ? "reading" : "writing",
                    strerror(errno));
    return f;
}

/* Reads the weight files of DIR once, so the model's pages are in memory
   before the first step; on a terminal (stderr) it shows how far it got. */
static void warm_weights(const char *dir, int always) {
    DIR *d;
    struct dirent *e;
    double total = 0, done = 0;
    int tty = isatty(2);
    static char buf[1 << 20];
    if ((!tty && !always) || !(d = opendir(dir))) return;
    for (int pass = 0; pass < 2; pass++) {
        rewinddir(d);
        while ((e = readdir(d)) != NULL) {
            size_t l = strlen(e->d_name);
            char path[4096];
            struct stat st;
            FILE *f;
            if (l < 12 || strcmp(e->d_name + l - 12, ".safetensors") != 0 || strcmp(e->d_name, "golden.safetensors") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (stat(path, &st) != 0) continue;
            if (pass == 0) { total += (double)st.st_size; continue; }
            if (!(f = fopen(path, "rb"))) continue;
            for (size_t got; (got = fread(buf, 1, sizeof buf, f)) > 0;) {
                done += (double)got;
                if (tty && ((long)(done / sizeof buf) % 64 == 0 || done >= total))
                    fprintf(stderr, "\rloading %s: %.2f / %.2f GB (%.0f%%)", dir, done / 1e9, total / 1e9,
                            total > 0 ? 100.0 * done / total : 100.0);
            }
            fclose(f);
        }
    }
    if (tty && total > 0) fprintf(stderr, "\n");
    closedir(d);
}

/* g4_model_load (with progress on a terminal), then the LoRA adapter if one
   was given; 0 or 1 (printed) */
static int load_model(g4_model *m, const char *dir) {
    if (is_dir(dir)) warm_weights(dir, 0);
    if (g4_model_load(m, dir) != G4_OK) { print_error(m->error); return 1; }
    if (adapter_dir && g4_model_load_adapter(m, adapter_dir) != G4_OK) {
        print_error(m->error);
        g4_model_free(m);
        return 1;
    }
    return 0;
}

/* "2,818,1010" -> ids; returns the count, or -1 with a message. */
static int parse_ids(const char *s, int32_t **out) {
    int n = 1, k = 0;
    const char *p;
    int32_t *ids;
    for (p = s; *p; p++) n += *p == ',';
    ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    if (!ids) return -1;
    for (p = s; k < n; k++) {
        long v = 0;
        const char *start = p;
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p - '0');
            if (v > 0x7fffffffL) break;
            p++;
        }
        if (p == start || (*p && *p != ',') || v > 0x7fffffffL) {
            fprintf(stderr, "gemma4: --ids: '%s' is not a comma-separated list of token ids\n", s);
            free(ids);
            return -1;
        }
        ids[k] = (int32_t)v;
        if (*p == ',') p++;
    }
    *out = ids;
    return n;
}

/* gemma4 image and gemma4 audio's line: DIR FILE --out FILE [--processor DIR] [--bf16] [--adapter DIR] [--threads N],
   the positional arguments into pos[2]; g4a_parse's result */
static int parse_soft_cmd(int argc, char **argv, const char *name, const char *file, const char *help,
                          const char *out_help, const char *pdir_help, const char **pos, const char **out, const char **pdir,
                          int *bf16) {
    int np;
    g4a_opt opts[] = {
        G4A_SR("--out", out, "FILE", out_help),
        G4A_S("--processor", pdir, "DIR", pdir_help),
        G4A_F("--bf16", bf16, "the tower in the bf16-faithful mode (as transformers in bfloat16)"),
        G4A_S("--adapter", &adapter_dir, "DIR", "a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors): "
              "its tower or embedder linears change the soft tokens"),
        OPT_THREADS,
    };
    g4a_cmd cmd = {name, file, 2, 2, help, opts, G4A_N_OPTS(opts)};
    return g4a_parse(&cmd, argc, argv, 2, pos, &np);
}

#include "bench.h"
#include "compare.h"
#include "train.h"
#include "image.h"
#include "mm.h"

/* info's lines on the towers beside the vision tower's (config only, no
   weights): none and why, the image processor's settings (dir: a model
   directory, whose processor_config.json or preprocessor_config.json give
   them), the audio tower and the feature extractor (the 12B: nothing more). */
static void print_towers(const g4_config *c, const char *dir) {
    if (c->unified) return; /* its encoder-free embedders: the lines above */
    if (!c->vision.present) printf("vision tower: none (config.json has no vision_config)\n");
    else if (dir) {
        g4_image_config ic;
        char p1[4096], p2[4096];
        snprintf(p1, sizeof p1, "%s/processor_config.json", dir);
        snprintf(p2, sizeof p2, "%s/preprocessor_config.json", dir);
        const char *from = is_file(p1) ? "processor_config.json" : is_file(p2) ? "preprocessor_config.json"
                                                                             : "no processor_config.json: the defaults";
        if (g4_image_config_load(&ic, dir) != G4_OK || g4_image_config_check(&ic, c) != G4_OK)
            printf("image processor (%s): unusable: %s\n", from, ic.error);
        else
            printf("image processor (%s): max_soft_tokens %d (at most %d patches of %d x %d pixels), pooling %d, resize %s, "
                   "rescale %s%g, convert_rgb %s\n", from, ic.max_soft_tokens,
                   ic.max_soft_tokens * ic.pooling_kernel_size * ic.pooling_kernel_size, ic.patch_size, ic.patch_size,
                   ic.pooling_kernel_size, ic.do_resize ? "bicubic, aspect kept" : "off", ic.do_rescale ? "" : "off, ",
                   ic.do_rescale ? (double)ic.rescale_factor : 0.0, ic.do_convert_rgb ? "on" : "off");
    }
    if (!c->audio.present) printf("audio tower: none (config.json has no audio_config)\n");
    else {
        const g4_audio_config *a = &c->audio;
        g4_audio_fe fe;
        printf("audio tower: %d conformer layers, hidden %d, %d heads of %d, subsampling channels %d, %d, light conv kernel %d, "
               "attention chunk %d, context left %d right %d, logit cap %g, gradient_clipping %g, output_proj %d%s; ids: audio %d, "
               "boa %d, eoa %d\n", a->num_hidden_layers, a->hidden_size, a->num_attention_heads,
               a->num_attention_heads > 0 ? a->hidden_size / a->num_attention_heads : 0, a->subsampling_conv_channels[0],
               a->subsampling_conv_channels[1], a->conv_kernel_size, a->attention_chunk_size, a->attention_context_left,
               a->attention_context_right, (double)a->attention_logit_cap, (double)a->gradient_clipping, a->output_proj_dims,
               a->use_clipped_linears ? ", clipped linears" : "", c->audio_token_id, c->boa_token_id, c->eoa_token_id);
        /* the directory's feature extractor settings (processor_config.json; none: the defaults) */
        if ((dir ? g4_audio_fe_load(&fe, dir) : g4_audio_fe_init(&fe)) != G4_OK)
            printf("audio features: unusable: %s\n", fe.error);
        else {
            int nf = g4_audio_fe_frames(&fe, fe.max_length);
            if (g4_audio_fe_check(&fe, c) != G4_OK) printf("audio features: unusable: %s\n", fe.error);
            else
                printf("audio features: %d Hz mono, %d mel bins (%g-%g Hz), %d-sample frames every %d, FFT %d, at most %d "
                       "samples (%d frames, %d soft tokens; placeholders capped at %d)\n", fe.sampling_rate, fe.feature_size,
                       fe.min_frequency, fe.max_frequency, fe.frame_length, fe.hop_length, fe.fft_length, fe.max_length, nf,
                       g4_audio_tokens_max(nf), fe.audio_seq_length);
            g4_audio_fe_free(&fe);
        }
    }
}

/* gemma4 info PATH: the plan of a model directory or config.json */
static int cmd_info(int argc, char **argv) {
    const char *pos[1], *path;
    g4_config c;
    g4_plan p;
    g4_result r;
    char buf[4096];
    int train = 0, np, rc;
    g4a_opt opts[] = {
        G4A_I("--train", &train, "N", 2, INT_MAX, "also the training arena's size for N tokens, with and without recompute"),
        OPT_ADAPTER,
    };
    g4a_cmd cmd = {"info", "PATH", 1, 1,
                   "The KV-sharing plan of a model directory or a config.json (no weights needed), the vision and audio\n"
                   "towers (or none, and why), a directory's image processor settings, the feature extractor, the chat\n"
                   "template a directory has, and with --adapter the modules a LoRA adapter changes.", opts, G4A_N_OPTS(opts)};
    if ((rc = g4a_parse(&cmd, argc, argv, 2, pos, &np)) != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    path = pos[0];
    if (is_dir(path)) {
        snprintf(buf, sizeof buf, "%s/config.json", path);
        path = buf;
    } else { /* a file: a weights file is not a config */
        size_t l = strlen(path);
        if (l >= 12 && strcmp(path + l - 12, ".safetensors") == 0 && is_file(path)) {
            fprintf(stderr, "gemma4 info: %s is a weights file (safetensors); give its model directory or its config.json\n",
                    path);
            return 1;
        }
    }
    r = g4_config_load(&c, path);
    if (r != G4_OK) { print_error(c.error); return 1; }
    if (g4_plan_build(&p, &c) != G4_OK) { fprintf(stderr, "gemma4: %s: %s\n", path, p.error); return 1; }
    g4_plan_print(&p, &c, stdout);
    if (c.vision.present) /* the vision tower (>>vision) and the merge's ids */
        printf("vision tower: %d layers, hidden %d, %d heads of %d (%d KV), mlp %d, patch %d, pooling %d, position table %d, "
               "rope_theta %g%s%s; ids: image %d, boi %d, eoi %d; bidirectional image attention %s\n",
               c.vision.num_hidden_layers, c.vision.hidden_size, c.vision.num_attention_heads, c.vision.head_dim,
               c.vision.num_key_value_heads, c.vision.intermediate_size, c.vision.patch_size, c.vision.pooling_kernel_size,
               c.vision.position_embedding_size, (double)c.vision.rope_theta, c.vision.use_clipped_linears ? ", clipped linears" : "",
               c.vision.standardize ? ", standardize" : "", c.image_token_id, c.boi_token_id, c.eoi_token_id,
               c.bidirectional == G4_BIDIR_VISION ? "on sliding layers" : c.bidirectional == G4_BIDIR_ALL ? "everywhere" : "no");
    if (c.unified && c.unified_vision.present) /* the 12B's encoder-free embedders (>>unified) */
        printf("unified vision embedder (no encoder): merged patches of %d x %d pixels (patch %d x pooling %d), width %d, "
               "position table %d; ids: image %d, boi %d, eoi %d; bidirectional image attention %s\n",
               c.unified_vision.patch_size * c.unified_vision.pooling_kernel_size,
               c.unified_vision.patch_size * c.unified_vision.pooling_kernel_size, c.unified_vision.patch_size,
               c.unified_vision.pooling_kernel_size, c.unified_vision.mm_embed_dim, c.unified_vision.mm_posemb_size,
               c.image_token_id, c.boi_token_id, c.eoi_token_id,
               c.bidirectional == G4_BIDIR_VISION ? "on every layer" : c.bidirectional == G4_BIDIR_ALL ? "everywhere" : "no");
    if (c.unified && c.unified_audio.present)
        printf("unified audio embedder (no encoder): frames of %d raw samples; ids: audio %d, boa %d, eoa %d\n",
               c.unified_audio.audio_embed_dim, c.audio_token_id, c.boa_token_id, c.eoa_token_id);
    if (!c.assistant) print_towers(&c, path == buf ? pos[0] : NULL);
    if (adapter_dir) { /* which modules of which layers the adapter changes */
        g4_model m;
        int k;
        if (path != buf) { fprintf(stderr, "gemma4 info: --adapter needs the model directory, not %s\n", pos[0]); return 1; }
        if (load_model(&m, pos[0])) return 1;
        printf("adapter %s: %d modules, largest rank %d%s\n", adapter_dir, m.n_lora, m.lora_rmax,
               m.lora_ignored ? " (plus tensors of a tower this checkpoint lacks, not run)" : "");
        for (k = 0; k < m.n_lora; k++) {
            const g4_lora *lo = &m.lora[k];
            if (lo->layer >= 0) printf("  layer %-3d %-24s", lo->layer, lo->module);
            else printf("  model     %-24s", lo->module);
            printf(" r %-3d alpha %-8g scale %-10g [%d -> %d]\n", lo->r, (double)lo->alpha, (double)lo->scale, lo->in, lo->out);
        }
        g4_model_free(&m);
    }
    if (path == buf) { /* a model directory: which chat layout generate --chat and chat use */
        g4_template t;
        r = g4_template_load(&t, pos[0]);
        if (r == G4_OK) printf("chat template: %s\n", t.name);
        else if (r == G4_ERR_IO) printf("chat template: none; generate --chat and chat use the built-in Gemma 4 layout\n");
        else printf("chat template: unusable: %s\n", t.error);
        g4_template_free(&t);
    }
    return train ? g4t_print_sizes(&c, &p, train) : 0;
}

/* Loads DIR and opens a session for n tokens on the --threads pool, in the
   bf16-faithful mode when bf16 (g4_session_destroy, then g4_model_free, when done). */
static int open_session(const char *dir, int n, int chunk, int bf16, g4_model *m, g4_session *s) {
    g4_session_config sc = g4_session_config_init();
    memset(s, 0, sizeof *s);
    if (load_model(m, dir)) return 1;
    sc.max_context = n;
    sc.bf16 = bf16 || bf16_fast;
    sc.bf16_fast = bf16_fast;
    sc.lora_bf16 = adapter_bf16;
    if (chunk > 0) sc.max_chunk = chunk;
    if (get_pool(&sc.pool) || g4_session_create(s, m, &sc) != G4_OK) {
        if (s->error[0]) fprintf(stderr, "gemma4: %s\n", s->error);
        g4_model_free(m);
        return 1;
    }
    return 0;
}

/* The end of a command that opened a session: frees buf (the logits, say),
   the ids, the session and the model; returns rc. */
static int close_session(g4_model *m, g4_session *s, int32_t *ids, void *buf, int rc) {
    free(buf);
    free(ids);
    g4_session_destroy(s);
    g4_model_free(m);
    return rc;
}

/* g4_forward of n ids in pieces of the session's chunk (what g4_forward does
   inside, so the same bits), showing on a terminal how far a prefill longer
   than one chunk got. */
static g4_result forward_progress(g4_session *s, const int32_t *ids, int n, float *logits, int which) {
    int chunk = s->cfg.max_chunk > 0 ? s->cfg.max_chunk : 64, off, tty = isatty(2);
    g4_result r = G4_OK;
    if (n <= chunk || which == G4_LOGITS_ALL) return g4_forward(s, ids, n, logits, which);
    for (off = 0; off < n && r == G4_OK; off += chunk) {
        int len = n - off < chunk ? n - off : chunk, last = off + len == n;
        if (tty) fprintf(stderr, "\rprefill: %d / %d tokens", off, n);
        r = g4_forward(s, ids + off, len, last ? logits : NULL, last ? which : G4_LOGITS_NONE);
    }
    if (tty) fprintf(stderr, "\rprefill: %d / %d tokens\n", n, n);
    return r;
}

typedef struct {
    g4_model m;
    g4_session d;
    g4_spec sp;
    void *arena, *work;
    size_t arena_bytes;
    int loaded;
} drafter_ctx;

static void drafter_free(drafter_ctx *x) {
    free(x->arena);
    free(x->work);
    if (x->loaded) g4_model_free(&x->m);
    memset(x, 0, sizeof *x);
}

/* k: draft tokens per round (0: only attach, no speculative workspace) */
static int drafter_open(drafter_ctx *x, const char *dir, g4_session *target, int k) {
    size_t bytes;
    memset(x, 0, sizeof *x);
    if (g4_model_load(&x->m, dir) != G4_OK) {
        fputs("gemma4: drafter: ", stderr);
        print_error(x->m.error);
        return 1;
    }
    x->loaded = 1;
    if (!x->m.config.assistant) { fprintf(stderr, "gemma4: %s is not a gemma4_assistant drafter\n", dir); return 1; }
    if (g4_drafter_size(&x->m, target, &x->arena_bytes) != G4_OK || !(x->arena = malloc(x->arena_bytes)) ||
        g4_drafter_init(&x->d, &x->m, target, x->arena, x->arena_bytes) != G4_OK) {
        g4_drafter_init(&x->d, &x->m, target, x->arena, x->arena_bytes); /* for its message */
        fprintf(stderr, "gemma4: drafter %s: %s\n", dir, x->d.error);
        return 1;
    }
    if (!k) return 0;
    if (g4_spec_size(target->model, k, &bytes) != G4_OK || !(x->work = malloc(bytes)) ||
        g4_spec_init(&x->sp, target, &x->d, k, x->work, bytes) != G4_OK) {
        fprintf(stderr, "gemma4: --draft-tokens %d: %s\n", k, x->work ? x->sp.error : "must be in [1, 1024]");
        return 1;
    }
    return 0;
}

/* after g4_session_reset on the target: attach the drafter again */
static int drafter_reattach(drafter_ctx *x, g4_session *target) {
    if (g4_drafter_init(&x->d, &x->m, target, x->arena, x->arena_bytes) != G4_OK) {
        fprintf(stderr, "gemma4: drafter: %s\n", x->d.error);
        return 1;
    }
    x->sp.last = -1;
    return 0;
}

static void print_spec_stats(const g4_spec *sp) {
    fprintf(stderr, "drafted %ld, accepted %ld (%.0f%%), target steps %ld\n", sp->drafted, sp->accepted,
            sp->drafted ? 100.0 * (double)sp->accepted / (double)sp->drafted : 0.0, sp->target_steps);
}


/* compare DIR DUMP: gemma4.h against a tap dump; exit 0 within tolerance, 2 not */
static int cmd_compare(int argc, char **argv) {
    const char *pos[2], *dir, *dump;
    double tol = -1;
    int i, chunk = 0, f32 = 0, bf16 = 0, first, rc = 1, np;
    g4cmp c;
    g4_model m;
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    float *logits = NULL;
    g4a_opt opts[] = {
        G4A_D("--tolerance", &tol, "T", 0, INFINITY, 0,
              "the largest relative error of a tap that passes (default 1e-4 float32, 3e-2 bf16-faithful)"),
        G4A_F("--f32", &f32, "run float32 (default: the dump's logits dtype decides)"),
        G4A_F("--bf16", &bf16, "run the bf16-faithful mode"),
        OPT_BF16_FAST,
        G4A_I("--chunk", &chunk, "N", 1, INT_MAX, "most tokens per step (default 64)"),
        OPT_THREADS,
        OPT_ADAPTER,
    };
    g4a_cmd cmd = {"compare", "DIR DUMP.safetensors", 2, 2,
                   "Runs the ids of a tap dump (tools/hf_dump.py) and prints, tap by tap in forward order, how far\n"
                   "gemma4.h is from it; exit 0 when every tap is within tolerance, 2 when one is not.", opts,
                   G4A_N_OPTS(opts)};
    if ((rc = g4a_parse(&cmd, argc, argv, 2, pos, &np)) != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    rc = 1;
    dir = pos[0];
    dump = pos[1];
    if (f32 && bf16) return g4a_fail(&cmd, "--f32 and --bf16 exclude each other");
    memset(&s, 0, sizeof s);
    if (g4cmp_open(&c, dump) != G4_OK) { print_error(c.error); g4cmp_close(&c); return 1; }
    if (load_model(&m, dir)) { g4cmp_close(&c); return 1; }
    sc.bf16 = f32 ? 0 : bf16 || bf16_fast ? 1 : c.bf16;
    sc.bf16_fast = bf16_fast;
    sc.lora_bf16 = adapter_bf16;
    if (tol < 0) tol = sc.bf16 ? G4CMP_TOL_BF16 : G4CMP_TOL_F32;
    sc.max_context = c.n_ids;
    if (chunk > 0) sc.max_chunk = chunk;
    sc.tap = g4cmp_tap;
    sc.tap_user = &c;
    if (get_pool(&sc.pool)) goto done;
    if (!(logits = (float *)malloc(sizeof(float) * (size_t)c.n_ids * m.config.vocab_size))) {
        fprintf(stderr, "gemma4: out of memory for %d positions\n", c.n_ids);
        goto done;
    }
    if (g4_session_create(&s, &m, &sc) != G4_OK || g4_forward(&s, c.ids, c.n_ids, logits, G4_LOGITS_ALL) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", s.error);
        goto done;
    }
    printf("gemma4.h (%s) vs %s (%s), %d tokens\n", sc.bf16_fast ? "bf16 with bf16_fast" : sc.bf16 ? "bf16-faithful" : "float32", dump,
           c.bf16 ? "bfloat16" : "float32", c.n_ids);
    first = g4cmp_report(&c, tol, stdout);
    rc = first >= 0 ? 2 : 0;
    if (g4_model_tensor(&c.dump, "loss")) { /* a --grad dump: the loss and the gradients too */
        int g = sc.bf16 ? 1 : g4t_compare_grads(&m, dump, &c, tol);
        if (sc.bf16) fprintf(stderr, "gemma4: gradients are compared in float32 only\n");
        if (g > rc || g == 1) rc = g;
    }
    (void)i;
done:
    free(logits);
    g4_session_destroy(&s);
    g4_model_free(&m);
    g4cmp_close(&c);
    return rc;
}

/* ------------------------------------------------------ text in, text out */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* All of a stream, NUL-terminated (NULL when out of memory). */
static char *read_all(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0, got;
    char *buf = (char *)malloc(cap), *nb;
    if (!buf) return NULL;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            if (!(nb = (char *)realloc(buf, cap * 2))) { free(buf); return NULL; }
            buf = nb;
            cap *= 2;
        }
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* g4_tokenizer_load of PATH (a tokenizer.json, or a directory holding one);
   flag: the option that gave PATH (NULL: the model directory). A directory
   without tokenizer.json is named with what to pass. 0 or 1 (printed). */
static int load_tokenizer(g4_tokenizer *t, const char *path, const char *flag) {
    char joined[4096];
    snprintf(joined, sizeof joined, "%s/tokenizer.json", path);
    if (is_dir(path) && !is_file(joined)) {
        fprintf(stderr, "gemma4: no tokenizer.json in %s (looked for %s); %s\n", path, joined,
                flag ? "give --tokenizer a tokenizer.json or the directory that holds it"
                     : "give the tokenizer with --tokenizer PATH (a tokenizer.json or its directory)");
        memset(t, 0, sizeof *t);
        return 1;
    }
    if (g4_tokenizer_load(t, path) != G4_OK) { print_error(t->error); return 1; }
    return 0;
}

/* gemma4 tokenize TOKENIZER_JSON_OR_MODEL_DIR [TEXT]: the ids of TEXT (or of all
   of stdin) on one line, as tokenizers' encode(TEXT).ids (post-processor applied). */
static int cmd_tokenize(int argc, char **argv) {
    g4_tokenizer t;
    char *text;
    const char *pos[2];
    size_t len = 0, n, i, cap;
    int32_t *ids;
    int rc = 1, np;
    g4a_cmd cmd = {"tokenize", "TOKENIZER_JSON_OR_MODEL_DIR [TEXT]", 1, 2,
                   "Prints the ids of TEXT (or of all of stdin) on one line, as tokenizers' encode(TEXT).ids\n"
                   "(the post-processor's <bos> included). A TEXT that starts with '-' follows \"--\".", NULL, 0};
    if ((rc = g4a_parse(&cmd, argc, argv, 2, pos, &np)) != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    rc = 1;
    if (load_tokenizer(&t, pos[0], "")) return 1;
    if (np == 2) { len = strlen(pos[1]); text = (char *)malloc(len + 1); if (text) memcpy(text, pos[1], len + 1); }
    else text = read_all(stdin, &len);
    cap = g4_tokenize_max(&t, text ? len : 0);
    ids = (int32_t *)malloc(sizeof(int32_t) * (cap ? cap : 1));
    if (!text || !ids) fprintf(stderr, "gemma4: out of memory\n");
    else if (g4_tokenize(&t, text, len, G4_ENCODE_ADD_SPECIAL, ids, cap, &n) != G4_OK) fprintf(stderr, "gemma4: tokenize failed\n");
    else {
        for (i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
        printf("\n");
        rc = 0;
    }
    free(text);
    free(ids);
    g4_tokenizer_free(&t);
    return rc;
}

typedef struct {
    const char *tokenizer, *system, *prompt, *drafter;
    int chat, think, max_tokens, ctx, draft_tokens, bf16;
    double temp, top_p, min_p, repeat_penalty;
    g4_sampler_config sc;
    int seed_given;
    const char *processor;   /* --processor DIR (with --image) */
    g4a_list media;          /* --image FILE, --audio FILE (generate: the prompt's; chat: the first turn's) */
    int chunk;               /* a step that holds the longest image run (0: the default) */
    double video_fps;        /* --video-fps: the frames' rate for their stamps (0: unknown, 24) */
} gen_opts;

/* A seed from the OS (/dev/urandom); 1 after a message when it cannot be read. */
static int os_seed(uint64_t *seed) {
    FILE *f = fopen("/dev/urandom", "rb");
    int ok = f && fread(seed, sizeof *seed, 1, f) == 1;
    if (!ok) fprintf(stderr, "gemma4: /dev/urandom: cannot read a random seed (%s); give --seed S\n", strerror(errno));
    if (f) fclose(f);
    return !ok;
}

/* The flags generate and chat share; G4A_RESULT_OK, _ERR (printed) or _HELP. */
static int parse_gen_opts(int argc, char **argv, gen_opts *o, int is_chat, const char **dir) {
    int rc, np;
    g4a_opt opts[] = {
        G4A_SR("--prompt", &o->prompt, "TEXT", "the prompt"),
        G4A_F("--chat", &o->chat, "wrap the prompt in the chat layout (the checkpoint's chat template, else Gemma 4's)"),
        G4A_S("--system", &o->system, "TEXT", "a system turn (with --chat)"),
        G4A_F("--think", &o->think, "thinking mode (enable_thinking)"),
        G4A_D("--temp", &o->temp, "T", 0, INFINITY, 0, "temperature; 0 is greedy (default 1)"),
        G4A_I("--top-k", &o->sc.top_k, "K", 0, INT_MAX, "keep the K most likely tokens; 0 keeps all (default 64)"),
        G4A_D("--top-p", &o->top_p, "P", 0, 1, G4A_LO_OPEN, "keep the most likely tokens up to mass P (default 0.95)"),
        G4A_D("--min-p", &o->min_p, "P", 0, 1, 0, "drop tokens below P times the top one's probability (default 0)"),
        G4A_D("--repeat-penalty", &o->repeat_penalty, "R", 0, INFINITY, G4A_LO_OPEN,
              "divide the logits of seen tokens by R, as transformers' repetition_penalty (default 1)"),
        G4A_U("--seed", &o->sc.seed, "S", "the sampler's seed (default: one from the OS, printed)"),
        G4A_I("--max-tokens", &o->max_tokens, "N", 0, INT_MAX,
              is_chat ? "most tokens per answer (default 1024)" : "most tokens to generate (default 256)"),
        G4A_I("--ctx", &o->ctx, "N", 1, INT_MAX,
              is_chat ? "positions of context; a full one starts the chat over (default 4096)"
                      : "positions of context (default: the prompt + --max-tokens + 1)"),
        G4A_S("--tokenizer", &o->tokenizer, "PATH", "a tokenizer.json or its directory (default DIR/tokenizer.json)"),
        G4A_F("--bf16", &o->bf16, "the bf16-faithful mode (as transformers in bfloat16)"),
        OPT_BF16_FAST,
        G4A_S("--drafter", &o->drafter, "DIR", "speculative decoding with a gemma4_assistant drafter"),
        G4A_I("--draft-tokens", &o->draft_tokens, "K", 1, 1024, "draft tokens per round (default 4)"),
        OPT_MEDIA(o),
        G4A_D("--video-fps", &o->video_fps, "R", 0, 1e9, G4A_LO_OPEN,
              "with --video: the frames' rate, for their mm:ss stamps (default unknown: 24, as transformers)"),
        OPT_THREADS,
        OPT_ADAPTER,
    };
    g4a_cmd cmd = {is_chat ? "chat" : "generate", "DIR", 1, 1,
                   is_chat ? "A conversation on stdin, one line a turn, in one session (each turn feeds only its own\n"
                             "tokens); /reset starts over, /quit or the end of input leaves. Answers on stdout, token\n"
                             "counts and speeds on stderr. --image/--video/--audio files go with the first turn; a line\n"
                             "'/image FILE', '/video DIR|F1,F2,...' or '/audio FILE' attaches one to the next turn. A turn\n"
                             "without placeholders gets one per file before its text (as content items where the\n"
                             "checkpoint has a template)."
                           : "Streams a sampled answer to --prompt to stdout, then token counts and speeds to stderr on a\n"
                             "line of their own; stops at <eos> or <turn|>. --image/--audio files fill the prompt's\n"
                             "placeholders; a prompt without any gets one per file before its text (with --chat and a\n"
                             "template: content items).",
                   is_chat ? opts + 2 : opts, G4A_N_OPTS(opts) - (is_chat ? 2 : 0)};
    memset(o, 0, sizeof *o);
    o->sc = g4_sampler_config_init();
    o->sc.top_k = 64; /* Gemma's generation_config defaults */
    o->temp = o->sc.temperature;
    o->top_p = 0.95;
    o->min_p = o->sc.min_p;
    o->repeat_penalty = o->sc.repetition_penalty;
    o->max_tokens = is_chat ? 1024 : 256;
    o->draft_tokens = 4;
    if ((rc = g4a_parse(&cmd, argc, argv, 2, dir, &np)) != G4A_RESULT_OK) return rc;
    o->chat |= is_chat;
    o->sc.temperature = (float)o->temp;
    o->sc.top_p = (float)o->top_p;
    o->sc.min_p = (float)o->min_p;
    o->sc.repetition_penalty = (float)o->repeat_penalty;
    o->seed_given = g4a_opt_of(&cmd, "--seed")->given;
    if (o->system && !o->chat) { g4a_fail(&cmd, "--system needs --chat"); return G4A_RESULT_ERR; }
    if (o->media.n && o->drafter) {
        g4a_fail(&cmd, "--image and --audio do not go with --drafter (a drafter takes no images or audio)");
        return G4A_RESULT_ERR;
    }
    if (o->processor && !g4a_opt_of(&cmd, "--image")->given && !g4a_opt_of(&cmd, "--video")->given &&
        !g4a_opt_of(&cmd, "--audio")->given) {
        g4a_fail(&cmd, "--processor needs --image, --video or --audio");
        return G4A_RESULT_ERR;
    }
    if (o->video_fps > 0 && !g4a_opt_of(&cmd, "--video")->given) { g4a_fail(&cmd, "--video-fps needs --video"); return G4A_RESULT_ERR; }
    if (!o->seed_given && os_seed(&o->sc.seed)) return G4A_RESULT_ERR;
    return G4A_RESULT_OK;
}

/* A loaded model + tokenizer + session + sampler. */
typedef struct {
    g4_model m;
    g4_tokenizer t;
    g4_session s;
    g4_sampler smp;
    float *logits;
    int loaded_m, loaded_t;
    drafter_ctx dr;            /* --drafter */
    int has_drafter;
    g4_template tpl;           /* the checkpoint's chat template, when has_tpl */
    int has_tpl;
    const float *soft;         /* the next gen_run's prompt: its soft tokens (g4_forward_mm), or NULL */
    int n_soft;
} gen_ctx;

static void gen_free(gen_ctx *g) {
    if (g->has_drafter) drafter_free(&g->dr);
    g4_session_destroy(&g->s);
    free(g->logits);
    g4_sampler_free(&g->smp);
    if (g->loaded_t) g4_tokenizer_free(&g->t);
    if (g->loaded_m) g4_model_free(&g->m);
    if (g->has_tpl) g4_template_free(&g->tpl);
}

/* The chat template of DIR (or of the --tokenizer directory): 1 found, 0 none
   (the built-in layout is used), -1 unusable (message printed). */
static int load_template(g4_template *t, const char *dir, const gen_opts *o, const g4_tokenizer *tok) {
    g4_result r = g4_template_load(t, dir);
    if (r == G4_ERR_IO && o->tokenizer && is_dir(o->tokenizer)) r = g4_template_load(t, o->tokenizer);
    if (r == G4_ERR_IO) return 0;
    if (r != G4_OK) { print_error(t->error); return -1; }
    g4_template_set_tokens(t, tok);
    return 1;
}

typedef struct { char *p; size_t n, cap; int oom; } textbuf;

static void tb_add(textbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *np = (char *)realloc(b->p, nc);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void tb_str(textbuf *b, const char *s) { tb_add(b, s, strlen(s)); }
static void tb_json(textbuf *b, const char *s) { /* s as a JSON string literal */
    tb_str(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; tb_add(b, esc, 2); }
        else if (c < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", c); tb_str(b, esc); }
        else tb_add(b, s, 1);
    }
    tb_str(b, "\"");
}

/* A user turn's content as JSON (malloc'd): the text as a string, or with
   media (command-line order) content items as transformers' chat format has
   them, [{"type": "image"}, {"type": "audio"}, ..., {"type": "text", "text": TEXT}],
   which the template renders as its placeholders. NULL after a message. */
static char *user_content(const char *text, const g4a_list *media) {
    textbuf b;
    int k;
    memset(&b, 0, sizeof b);
    if (media && media->n) {
        tb_str(&b, "[");
        for (k = 0; k < media->n; k++)
            tb_str(&b, G4MM_KIND(media->tag[k]) == G4MM_IMAGE   ? "{\"type\": \"image\"}, "
                       : G4MM_KIND(media->tag[k]) == G4MM_VIDEO ? "{\"type\": \"video\"}, "
                                                                : "{\"type\": \"audio\"}, ");
        tb_str(&b, "{\"type\": \"text\", \"text\": ");
        tb_json(&b, text);
        tb_str(&b, "}]");
    } else tb_json(&b, text);
    if (b.oom) { free(b.p); fprintf(stderr, "gemma4: out of memory\n"); return NULL; }
    return b.p;
}

/* {"messages": [system?, user 0, answer, user 1, ..., answer, user n-1]} (users: JSON values, user_content);
   the answers, fed already, are G4_TEMPLATE_ANSWER (see g4_template_continue) */
static char *chat_json(const gen_opts *o, char **users, int n_users, size_t *len) {
    textbuf b;
    int i;
    memset(&b, 0, sizeof b);
    tb_str(&b, "{\"messages\": [");
    if (o->system) { tb_str(&b, "{\"role\": \"system\", \"content\": "); tb_json(&b, o->system); tb_str(&b, "}, "); }
    for (i = 0; i < n_users; i++) {
        if (i) { tb_str(&b, "{\"role\": \"assistant\", \"content\": "); tb_json(&b, G4_TEMPLATE_ANSWER); tb_str(&b, "}, "); }
        tb_str(&b, "{\"role\": \"user\", \"content\": ");
        tb_str(&b, users[i]); /* a JSON value already (user_content) */
        tb_str(&b, i + 1 < n_users ? "}, " : "}");
    }
    tb_str(&b, "]}");
    if (b.oom) { free(b.p); fprintf(stderr, "gemma4: out of memory\n"); return NULL; }
    *len = b.n;
    return b.p;
}

/* The prompt through the checkpoint's template: the whole conversation of
   users[0..n_users) (first = 1, with <bos>), or only what the template writes
   after the model's last answer (its turn closure, the new user turn, the
   generation prompt). Caller frees (free). NULL after a message. */
/* The rendered text's ids with the videos of mm (prepared; NULL or none: no
   video) expanded in the text before tokenizing, as Gemma4Processor does (the
   first stamp joins the text before <|video|>); from the last answer's marker
   on unless first (g4_template_continue's part). NULL after a message. */
static int32_t *template_video_ids(const g4_template *tpl, const g4_tokenizer *t, const g4_template_options *to,
                                   const char *json, size_t len, int first, const g4mm *mm, const g4_config *c,
                                   double fps, size_t *n) {
    char *text = NULL, *x = NULL, err[G4_ERROR_MAX];
    const char *from, *p;
    size_t tl = 0, mark = strlen(G4_TEMPLATE_ANSWER), cap;
    int32_t *ids = NULL;
    if (g4_template_render(tpl, json, len, to, &text, &tl, err) != G4_OK) { print_error(err); return NULL; }
    from = first ? text : NULL;
    for (p = text; !first && (size_t)(p - text) + mark <= tl; p++)
        if (memcmp(p, G4_TEMPLATE_ANSWER, mark) == 0) from = p + mark;
    if (!from) fprintf(stderr, "gemma4: %s: the rendered conversation holds no model answer to continue after\n", tpl->name);
    else if ((x = g4mm_expand_text(mm, t, c, from, fps)) != NULL) {
        cap = g4_tokenize_max(t, strlen(x));
        if (!(ids = (int32_t *)malloc(sizeof(int32_t) * (cap ? cap : 1)))) fprintf(stderr, "gemma4: out of memory\n");
        else if (g4_tokenize(t, x, strlen(x), 0, ids, cap, n) != G4_OK) { /* add_special_tokens=False, as g4_template_encode */
            fprintf(stderr, "gemma4: tokenizing the rendered text failed\n");
            free(ids);
            ids = NULL;
        }
    }
    free(x);
    g4_template_free_output(text);
    return ids;
}

static int32_t *template_prompt(const g4_template *tpl, const g4_tokenizer *t, const gen_opts *o, char **users,
                                int n_users, int first, size_t *n, const g4mm *mm, const g4_config *c) {
    g4_template_options to = g4_template_options_init();
    size_t len;
    char *json = chat_json(o, users, n_users, &len), err[G4_ERROR_MAX];
    int32_t *ids = NULL, *tids = NULL;
    g4_result r;
    if (!json) return NULL;
    to.enable_thinking = o->think;
    if (mm && mm->n_video) {
        ids = template_video_ids(tpl, t, &to, json, len, first, mm, c, o->video_fps, n);
        free(json);
        return ids;
    }
    r = first ? g4_template_encode(tpl, t, json, len, &to, &tids, n, err)
              : g4_template_continue(tpl, t, json, len, &to, &tids, n, err);
    if (r != G4_OK) print_error(err);
    else if ((ids = (int32_t *)malloc(sizeof(int32_t) * (*n ? *n : 1)))) memcpy(ids, tids, sizeof(int32_t) * *n);
    else fprintf(stderr, "gemma4: out of memory\n");
    g4_template_free_output(tids);
    free(json);
    return ids;
}


static int gen_open(gen_ctx *g, const char *dir, const gen_opts *o, int max_context) {
    g4_session_config sc = g4_session_config_init();
    memset(g, 0, sizeof *g);
    if (load_tokenizer(&g->t, o->tokenizer ? o->tokenizer : dir, o->tokenizer ? "--tokenizer" : NULL)) return 1;
    g->loaded_t = 1;
    warm_weights(dir, 1);
    if (g4_model_load(&g->m, dir) != G4_OK) { print_error(g->m.error); return 1; }
    g->loaded_m = 1;
    if (adapter_dir && g4_model_load_adapter(&g->m, adapter_dir) != G4_OK) { print_error(g->m.error); return 1; }
    /* Past max_position_embeddings: a warning, not a refusal. RoPE has no
       table to run off, so positions past it compute what transformers
       computes for them; the model was only not trained that far. */
    if (o->ctx > g->m.config.max_position_embeddings)
        fprintf(stderr, "gemma4: warning: --ctx %d is past the model's max_position_embeddings %d (config.json): positions "
                "past it run as transformers runs them, but the model was not trained on them\n", o->ctx,
                g->m.config.max_position_embeddings);
    sc.max_context = o->ctx ? o->ctx : max_context;
    sc.bf16 = o->bf16 || bf16_fast;
    sc.bf16_fast = bf16_fast;
    sc.lora_bf16 = adapter_bf16;
    if (o->drafter && sc.max_chunk < o->draft_tokens + 2) sc.max_chunk = o->draft_tokens + 2;
    if (o->chunk > sc.max_chunk) sc.max_chunk = o->chunk; /* an image run in one step */
    if (get_pool(&sc.pool)) return 1;
    if (g4_session_create(&g->s, &g->m, &sc) != G4_OK) { fprintf(stderr, "gemma4: %s\n", g->s.error); return 1; }
    if (o->drafter) {
        g->has_drafter = 1;
        if (drafter_open(&g->dr, o->drafter, &g->s, o->draft_tokens)) return 1;
    }
    if (g4_sampler_init(&g->smp, &o->sc, g->m.config.vocab_size) != G4_OK) { fprintf(stderr, "gemma4: %s\n", g->smp.error); return 1; }
    g->logits = (float *)malloc(sizeof(float) * (size_t)g->m.config.vocab_size);
    if (!g->logits) { fprintf(stderr, "gemma4: out of memory\n"); return 1; }
    return 0;
}

/* The answer's line on stdout: open from the first token until
   end_text_line, which ends it with '\n' and flushes, so that whatever
   stderr says next starts on a line of its own (also in one redirected log). */
static int text_open;

static void end_text_line(void) {
    if (text_open) fputc('\n', stdout);
    fflush(stdout);
    text_open = 0;
}

#define GEN_FULL 2 /* gen_run: the context filled before the answer ended */

/* Prints the text a generated id adds (g4_decode_next: byte runs wait until
   they end). Ids past the tokenizer's vocabulary print nothing. 1 on an error. */
static int print_id(const g4_tokenizer *t, g4_decode_state *ds, int32_t id) {
    const char *piece;
    size_t k;
    if (id >= t->n_vocab) return 0;
    if (g4_decode_next(t, ds, id, G4_DECODE_SKIP_SPECIAL, &piece, &k) != G4_OK) {
        fprintf(stderr, "\ngemma4: out of memory while decoding\n");
        return 1;
    }
    if (k) { fwrite(piece, 1, k, stdout); fflush(stdout); }
    return 0;
}

/* Prints what the stream still holds and frees it. */
static void print_end(g4_decode_state *ds) {
    const char *piece;
    size_t k;
    if (g4_decode_flush(ds, &piece, &k) == G4_OK && k) fwrite(piece, 1, k, stdout);
    g4_decode_free(ds);
}

/* gen_run with a drafter: the same stream from speculative rounds (the
   sampler's distribution is kept exactly; see g4_spec_round). Afterwards the
   target holds what gen_run would have fed: the prompt and the printed
   tokens, less the last one when max_tokens ended the turn. */
static int gen_run_spec(gen_ctx *g, const int32_t *ids, size_t n, int max_tokens, int *n_new, double *t_prefill,
                        double *t_decode) {
    g4_decode_state ds;
    g4_spec *sp = &g->dr.sp;
    double t0 = now_s(), t1;
    int32_t *out = (int32_t *)malloc(sizeof(int32_t) * (size_t)(sp->k + 1));
    int start = g->s.pos, emitted = 0, stopped = 0, full = 0, m = 0, j, k;
    memset(&ds, 0, sizeof ds);
    if (!out) { fprintf(stderr, "gemma4: out of memory\n"); return 1; }
    if (n + (size_t)sp->k + 2 > (size_t)(g->s.cfg.max_context - g->s.pos)) {
        fprintf(stderr, "gemma4: %lu prompt tokens and %d drafts do not fit the %d positions left of the context (--ctx)\n",
                (unsigned long)n, sp->k, g->s.cfg.max_context - g->s.pos);
        free(out);
        return 1;
    }
    if (n > (size_t)64 && isatty(2)) fprintf(stderr, "prefill: %lu tokens\n", (unsigned long)n);
    if (g4_spec_prefill(sp, ids, (int)n, &g->smp, &out[0]) != G4_OK) { fprintf(stderr, "gemma4: %s\n", sp->error); free(out); return 1; }
    m = 1;
    t1 = now_s();
    *t_prefill += t1 - t0;
    while (emitted < max_tokens && !stopped) {
        for (j = 0; j < m && emitted < max_tokens; j++) {
            if (g4_chat_is_stop(&g->t, out[j])) { stopped = 1; break; }
            if (print_id(&g->t, &ds, out[j])) { g4_decode_free(&ds); free(out); return 1; }
            emitted++;
            (*n_new)++;
        }
        if (stopped || emitted >= max_tokens) break;
        if (g->s.pos + sp->k + 2 > g->s.cfg.max_context) { full = 1; break; }
        if (g4_spec_round(sp, &g->smp, out, &m) != G4_OK) { end_text_line(); fprintf(stderr, "gemma4: %s\n", sp->error); g4_decode_free(&ds); free(out); return 1; }
    }
    /* what gen_run feeds: the prompt and every printed token but a last one cut by max_tokens */
    k = start + (int)n + emitted - (!stopped && emitted > 0 && emitted >= max_tokens ? 1 : 0);
    if (k < g->s.pos && g4_session_rewind(&g->s, k) != G4_OK) { end_text_line(); fprintf(stderr, "gemma4: %s\n", g->s.error); g4_decode_free(&ds); free(out); return 1; }
    print_end(&ds);
    *t_decode += now_s() - t1;
    free(out);
    return full ? GEN_FULL : 0;
}

/* Feeds the prompt ids, then samples and streams up to max_tokens tokens,
   stopping at <eos> or <turn|> (not fed, not printed). Adds to the counters. */

/* Feeds the prompt ids, then samples and streams up to max_tokens tokens,
   stopping at <eos> or <turn|> (not fed, not printed). Adds to the counters.
   0, 1 on an error (printed), or GEN_FULL when the context filled first. */
static int gen_run(gen_ctx *g, const int32_t *ids, size_t n, int max_tokens, int *n_new, double *t_prefill,
                   double *t_decode) {
    g4_decode_state ds;
    double t0 = now_s(), t1;
    int i, full = 0;
    memset(&ds, 0, sizeof ds);
    if (n > (size_t)(g->s.cfg.max_context - g->s.pos)) {
        fprintf(stderr, "gemma4: %lu prompt tokens do not fit the %d positions left of the context (--ctx)\n",
                (unsigned long)n, g->s.cfg.max_context - g->s.pos);
        return 1;
    }
    text_open = 1;
    if (g->has_drafter) return gen_run_spec(g, ids, n, max_tokens, n_new, t_prefill, t_decode);
    for (i = 0; i < (int)n; i++) g4_sampler_accept(&g->smp, ids[i]);
    if ((g->soft ? g4_forward_mm(&g->s, ids, (int)n, g->soft, g->n_soft, g->logits, G4_LOGITS_LAST, NULL)
                 : forward_progress(&g->s, ids, (int)n, g->logits, G4_LOGITS_LAST)) != G4_OK) {
        end_text_line();
        fprintf(stderr, "gemma4: %s\n", g->s.error);
        return 1;
    }
    t1 = now_s();
    *t_prefill += t1 - t0;
    for (i = 0; i < max_tokens; i++) {
        int32_t next = g4_sampler_sample(&g->smp, g->logits);
        if (next < 0) { end_text_line(); fprintf(stderr, "gemma4: %s\n", g->smp.error); g4_decode_free(&ds); return 1; }
        if (g4_chat_is_stop(&g->t, next)) break;
        if (print_id(&g->t, &ds, next)) { g4_decode_free(&ds); return 1; }
        g4_sampler_accept(&g->smp, next);
        (*n_new)++;
        if (i + 1 == max_tokens) break;
        if (g->s.pos >= g->s.cfg.max_context) { full = 1; break; }
        if (g4_forward(&g->s, &next, 1, g->logits, G4_LOGITS_LAST) != G4_OK) {
            end_text_line();
            fprintf(stderr, "gemma4: %s\n", g->s.error);
            g4_decode_free(&ds);
            return 1;
        }
    }
    print_end(&ds);
    *t_decode += now_s() - t1;
    return full ? GEN_FULL : 0;
}

/* On a line of its own: the answer's line is ended first. */
static void print_stats(int n_prompt, int n_new, double t_prefill, double t_decode) {
    end_text_line();
    fprintf(stderr, "prompt %d tokens, generated %d tokens; prefill %.1f tok/s, decode %.1f tok/s\n", n_prompt, n_new,
            t_prefill > 0 ? n_prompt / t_prefill : 0.0, t_decode > 0 && n_new > 0 ? n_new / t_decode : 0.0);
}

/* The prompt's ids: the chat layout, or <bos> + the text. Caller frees. */
static int32_t *encode_prompt(const g4_tokenizer *t, const gen_opts *o, const char *user, int flags, size_t *n) {
    size_t cap = g4_tokenize_max(t, strlen(user) + (o->system ? strlen(o->system) : 0)) + 64;
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * cap);
    g4_result r;
    if (!ids) return NULL;
    if (o->chat || flags) {
        g4_chat_message msgs[2];
        int nm = 0;
        if (!flags) flags = G4_CHAT_BOS;
        if (o->system && (flags & G4_CHAT_BOS)) { msgs[nm].role = "system"; msgs[nm].content = o->system; nm++; }
        msgs[nm].role = "user"; msgs[nm].content = user; nm++;
        flags |= G4_CHAT_OPEN_MODEL | ((o->think && (flags & G4_CHAT_BOS)) ? G4_CHAT_THINKING : 0);
        r = g4_chat_encode(t, msgs, nm, flags, ids, cap, n);
        if (r != G4_OK && t->turn_open < 0) fprintf(stderr, "gemma4: the tokenizer has no <|turn> token: not a Gemma 4 chat tokenizer\n");
    } else {
        size_t k = 0;
        if (t->bos >= 0) ids[k++] = t->bos;
        r = g4_tokenize(t, user, strlen(user), 0, ids + k, cap - k, n);
        *n += k;
    }
    if (r != G4_OK) { if (r != G4_ERR_INPUT || t->turn_open >= 0) fprintf(stderr, "gemma4: cannot encode the prompt (%s)\n", g4_result_str(r)); free(ids); return NULL; }
    return ids;
}


/* --image / --audio on generate and chat. A text that holds no image or audio
   placeholder gets one per file before it, in command-line order (with a chat
   template as content items, which it renders as its placeholders); a text
   that holds some fills them as logits does. */

/* 1: the files get placeholders of their own (the text has none); 0: the text's
   placeholders take them (or no files); -1 after a message. */
static int media_items(const g4_tokenizer *t, const g4_config *c, const char *text, const g4a_list *media) {
    size_t cap = g4_tokenize_max(t, strlen(text)), n = 0, k;
    int32_t *ids;
    int found = 0;
    if (!media->n) return 0;
    if (!(ids = (int32_t *)malloc(sizeof(int32_t) * (cap ? cap : 1)))) { fprintf(stderr, "gemma4: out of memory\n"); return -1; }
    if (g4_tokenize(t, text, strlen(text), 0, ids, cap, &n) != G4_OK) { fprintf(stderr, "gemma4: cannot tokenize the prompt\n"); free(ids); return -1; }
    for (k = 0; k < n; k++) found += g4_mm_type(c, ids[k]) != G4_MM_TEXT;
    free(ids);
    return !found;
}

/* text with one placeholder per file before it (the tokens' strings, as the
   template writes them), malloc'd; NULL after a message. */
static char *media_text(const g4_tokenizer *t, const g4_config *c, const char *text, const g4a_list *media) {
    textbuf b;
    int k;
    memset(&b, 0, sizeof b);
    for (k = 0; k < media->n; k++) {
        int tag = G4MM_KIND(media->tag[k]);
        int32_t id = tag == G4MM_IMAGE ? c->image_token_id : tag == G4MM_VIDEO ? c->video_token_id : c->audio_token_id;
        char piece[256];
        size_t len = 0;
        if (g4_detokenize(t, &id, 1, 0, piece, sizeof piece, &len) != G4_OK || len == 0) {
            fprintf(stderr, "gemma4: the tokenizer has no string for the %s placeholder id %d\n",
                    tag == G4MM_IMAGE ? "image" : tag == G4MM_VIDEO ? "video" : "audio", (int)id);
            free(b.p);
            return NULL;
        }
        tb_add(&b, piece, len);
    }
    tb_str(&b, text);
    if (b.oom) { free(b.p); fprintf(stderr, "gemma4: out of memory\n"); return NULL; }
    return b.p;
}

/* The prompt's ids expanded with mm's files (g4mm_expand): *ids replaced. 1 after a message. */
static int media_expand(g4mm *mm, const g4_tokenizer *t, const g4_config *c, double fps, int32_t **ids, size_t *n) {
    int32_t *x = NULL;
    int nx = 0;
    if (!mm->n) return 0;
    if (g4mm_expand_video_ids(mm, t, c, fps, ids, n) || g4mm_expand(mm, c, *ids, (int)*n, &x, &nx)) return 1;
    free(*ids);
    *ids = x;
    *n = (size_t)nx;
    return 0;
}

/* The config of a model directory; 1 after a message. */
static int load_config_of(const char *dir, g4_config *c) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (g4_config_load(c, path) != G4_OK) { print_error(c->error); return 1; }
    return 0;
}

/* gemma4 generate MODEL_DIR --prompt "..." [--chat] [--system S] [--think] [--image F] [--audio F] [sampling] */
static int cmd_generate(int argc, char **argv) {
    gen_opts o;
    gen_ctx g;
    int32_t *ids = NULL;
    const char *dir[1];
    size_t n = 0;
    int n_new = 0, rc, r, items = 0;
    double tp = 0, td = 0;
    g4_tokenizer probe;
    g4_template tpl;
    g4_config c;
    g4mm mm;
    float *soft = NULL;
    char *text = NULL, *users[1];
    g4_pool *pool;
    int has_tpl = 0;
    if ((rc = parse_gen_opts(argc, argv, &o, 0, dir)) != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    rc = 1;
    memset(&mm, 0, sizeof mm);
    memset(&g, 0, sizeof g);
    users[0] = NULL;
    /* the tokenizer first, to size the context to prompt + max_tokens */
    if (load_tokenizer(&probe, o.tokenizer ? o.tokenizer : dir[0], o.tokenizer ? "--tokenizer" : NULL)) return 1;
    if (o.media.n && (load_config_of(dir[0], &c) || (items = media_items(&probe, &c, o.prompt, &o.media)) < 0)) goto fail;
    if (o.chat && (has_tpl = load_template(&tpl, dir[0], &o, &probe)) < 0) goto fail;
    if (has_tpl) {
        users[0] = user_content(o.prompt, items ? &o.media : NULL);
        /* videos: the files through their processors first, expanded in the rendered text */
        if (g4mm_has(&o.media, G4MM_VIDEO) && g4mm_prepare(&mm, &c, dir[0], o.processor, &o.media)) goto fail;
        ids = users[0] ? template_prompt(&tpl, &probe, &o, users, 1, 1, &n, &mm, &c) : NULL;
        g4_template_free(&tpl);
    } else if (!items || (text = media_text(&probe, &c, o.prompt, &o.media)) != NULL) {
        const char *prompt = text ? text : o.prompt;
        char *xtext = NULL;
        /* videos: the files through their processors first, the text's <|video|> expanded with the frames' stamps */
        if (g4mm_has(&o.media, G4MM_VIDEO) && (g4mm_prepare(&mm, &c, dir[0], o.processor, &o.media) ||
                                                     !(xtext = g4mm_expand_text(&mm, &probe, &c, prompt, o.video_fps))))
            goto fail;
        ids = encode_prompt(&probe, &o, xtext ? xtext : prompt, 0, &n);
        free(xtext);
    }
    if (!ids) goto fail;
    /* the files through their processors, the ids expanded: the context's size is known */
    if (o.media.n && ((!mm.n && g4mm_prepare(&mm, &c, dir[0], o.processor, &o.media)) || media_expand(&mm, &probe, &c, o.video_fps, &ids, &n))) goto fail;
    if (mm.max_run > 64) o.chunk = mm.max_run;
    g4_tokenizer_free(&probe);
    if (!gen_open(&g, dir[0], &o, (int)n + o.max_tokens + 1 + (o.drafter ? o.draft_tokens + 2 : 0)) &&
        (!mm.n || (mm.bf16 = g.s.cfg.bf16, !get_pool(&pool) && !g4mm_encode(&mm, &g.m, dir[0], pool, &soft)))) {
        g.soft = soft;
        g.n_soft = mm.total_soft;
        if (!o.seed_given && o.sc.temperature > 0) fprintf(stderr, "seed %llu\n", (unsigned long long)o.sc.seed);
        r = gen_run(&g, ids, n, o.max_tokens, &n_new, &tp, &td);
        if (r != 1) {
            print_stats((int)n, n_new, tp, td);
            if (g.has_drafter) print_spec_stats(&g.dr.sp);
        }
        if (r == GEN_FULL)
            fprintf(stderr, "gemma4: context full after %d generated tokens (--ctx %d positions, the prompt %d), short of "
                    "--max-tokens %d\n", n_new, g.s.cfg.max_context, (int)n, o.max_tokens);
        rc = r != 0;
    }
    free(ids);
    free(soft);
    free(text);
    free(users[0]);
    g4mm_free(&mm);
    gen_free(&g);
    return rc;
fail:
    g4_tokenizer_free(&probe);
    free(ids);
    free(text);
    free(users[0]);
    g4mm_free(&mm);
    return 1;
}

/* chat's pending files (the next turn's): owned copies of the paths */
static void media_clear(g4a_list *l) {
    int k;
    for (k = 0; k < l->n; k++) free((char *)(uintptr_t)l->value[k]);
    l->n = 0;
}

static int media_add(g4a_list *l, const char *path, int tag) {
    size_t len = strlen(path);
    char *p;
    if (l->n >= G4A_LIST_MAX) { fprintf(stderr, "gemma4: at most %d files in one turn\n", G4A_LIST_MAX); return 1; }
    if (!(p = (char *)malloc(len + 1))) { fprintf(stderr, "gemma4: out of memory\n"); return 1; }
    memcpy(p, path, len + 1);
    l->value[l->n] = p;
    l->tag[l->n++] = tag;
    return 0;
}

/* A chat turn whose files (attached by /image, /audio) failed: its message is
   printed; the turn is not fed, its files are detached, the chat goes on. */
static void drop_turn(g4mm *mm, g4a_list *pend) {
    fprintf(stderr, "gemma4: the turn was not sent and its files are detached (attach them again, or send it without)\n");
    g4mm_free(mm);
    media_clear(pend);
}

/* gemma4 chat MODEL_DIR: one session for the whole conversation; each turn
   feeds only its own tokens, the earlier turns stay in the KV. A turn that
   does not fit what is left of the context, or an answer the context cut,
   starts the conversation over (said once); a turn that does not fit an
   empty context is an error. --image / --video / --audio files go with the first
   turn (one that cannot be used ends the chat, exit 1); a line "/image FILE",
   "/video DIR|F1,F2,..." (a video's frames, as --video) or "/audio FILE"
   attaches a file to the next turn (one that cannot be used, or
   a placeholder count that does not match, drops that turn: the chat goes on). */
static int cmd_chat(int argc, char **argv) {
    gen_opts o;
    gen_ctx g;
    char *line = NULL, **users = NULL, *text = NULL;
    const char *dir[1];
    size_t line_cap = 0;
    int turn = 0, rc, k, cut = 0;
    g4a_list pend;
    g4mm mm;
    float *soft = NULL;
    int cli_files; /* the pending files are the command line's (an error in them ends the chat, exit 1) */
    if ((rc = parse_gen_opts(argc, argv, &o, 1, dir)) != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    cli_files = o.media.n > 0;
    rc = 1;
    memset(&pend, 0, sizeof pend);
    memset(&mm, 0, sizeof mm);
    {   /* a step that holds an image run whole: the processor's largest */
        g4_config c;
        g4_image_config ic;
        if (load_config_of(dir[0], &c)) return 1;
        if (c.vision.present && g4_image_config_load(&ic, o.processor ? o.processor : dir[0]) == G4_OK &&
            ic.max_soft_tokens + 2 > 64)
            o.chunk = ic.max_soft_tokens + 2;
    }
    if (gen_open(&g, dir[0], &o, o.ctx ? o.ctx : 4096)) { gen_free(&g); return 1; }
    if ((g.has_tpl = load_template(&g.tpl, dir[0], &o, &g.t)) < 0) { g.has_tpl = 0; gen_free(&g); return 1; }
    for (k = 0; k < o.media.n; k++)
        if (media_add(&pend, o.media.value[k], o.media.tag[k])) { media_clear(&pend); gen_free(&g); return 1; }
    if (g.has_tpl) fprintf(stderr, "chat layout: %s\n", g.tpl.name);
    else fprintf(stderr, "chat layout: the built-in Gemma 4 layout (no chat_template.jinja or tokenizer_config.json "
                 "chat_template in %s%s%s)\n", dir[0], o.tokenizer ? " or " : "", o.tokenizer ? o.tokenizer : "");
    if (!o.seed_given && o.sc.temperature > 0) fprintf(stderr, "seed %llu\n", (unsigned long long)o.sc.seed);
    fprintf(stderr, "%d positions of context; /reset starts over, /quit or end of input leaves; /image FILE, /video DIR|F1,F2,... and "
            "/audio FILE attach a file to the next turn\n", g.s.cfg.max_context);
    for (;;) {
        int32_t *ids;
        size_t n, l, extra = 1 + (g.has_drafter ? (size_t)o.draft_tokens + 2 : 0);
        int n_new = 0, r, fresh = g.s.pos == 0, items = 0, bad_media = 0;
        double tp = 0, td = 0;
        g4_pool *pool;
        fprintf(stderr, "> ");
        if (getline(&line, &line_cap, stdin) < 0) { rc = 0; break; }
        l = strlen(line);
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r')) line[--l] = 0;
        if (!l) continue;
        if (strcmp(line, "/quit") == 0) { rc = 0; break; }
        if (strncmp(line, "/image ", 7) == 0 || strncmp(line, "/video ", 7) == 0 || strncmp(line, "/audio ", 7) == 0) {
            int tag = line[1] == 'i' ? G4MM_IMAGE : line[1] == 'v' ? G4MM_VIDEO : G4MM_AUDIO;
            if (g.has_drafter) { fprintf(stderr, "gemma4: %.6s does not go with --drafter (a drafter takes no images, video or audio)\n", line); break; }
            if (media_add(&pend, line + 7, tag | G4MM_TYPED)) break;
            fprintf(stderr, "attached %s to the next turn\n", line + 7);
            continue;
        }
        if (strcmp(line, "/reset") == 0 || cut) { /* (after a cut answer: a new conversation) */
            int is_reset = strcmp(line, "/reset") == 0;
            g4_session_reset(&g.s);
            g4_sampler_reset(&g.smp);
            if (g.has_drafter && drafter_reattach(&g.dr, &g.s)) break;
            if (g.has_tpl) for (k = 0; k < turn; k++) free(users[k]); /* users is kept only with a template */
            turn = 0;
            fresh = 1;
            cut = 0;
            if (is_reset) continue;
        }
        /* this turn's files through their processors; with none of their placeholders in the line, one each before it */
        if (pend.n && ((items = media_items(&g.t, &g.m.config, line, &pend)) < 0 ||
                       g4mm_prepare(&mm, &g.m.config, dir[0], o.processor, &pend))) {
            if (cli_files) break; /* the command line's: an error (exit 1) */
            drop_turn(&mm, &pend);
            continue;
        }
        free(text);
        text = NULL;
        if (!g.has_tpl && items && !(text = media_text(&g.t, &g.m.config, line, &pend))) break;
        if (g.has_tpl) { /* the template's text for this turn: everything, or what follows the last answer */
            char **nu = (char **)realloc(users, sizeof(char *) * (size_t)(turn + 1));
            if (!nu || !(nu[turn] = user_content(line, items ? &pend : NULL))) { users = nu ? nu : users; fprintf(stderr, "gemma4: out of memory\n"); break; }
            users = nu;
            ids = template_prompt(&g.tpl, &g.t, &o, users, turn + 1, turn == 0, &n, pend.n ? &mm : NULL, &g.m.config);
        } else ids = encode_prompt(&g.t, &o, text ? text : line, turn ? G4_CHAT_CONTINUE : G4_CHAT_BOS, &n);
        if (ids && media_expand(&mm, &g.t, &g.m.config, o.video_fps, &ids, &n)) { free(ids); ids = NULL; bad_media = 1; }
        if (!ids) {
            if (g.has_tpl) free(users[turn]);
            if (!bad_media || cli_files) break;
            drop_turn(&mm, &pend);
            continue;
        }
        if (n + extra > (size_t)(g.s.cfg.max_context - g.s.pos) && !fresh) { /* start over with this turn */
            fprintf(stderr, "context full: %d of %d positions used; starting over (--ctx sets the size)\n", g.s.pos,
                    g.s.cfg.max_context);
            free(ids);
            g4_session_reset(&g.s);
            g4_sampler_reset(&g.smp);
            if (g.has_drafter && drafter_reattach(&g.dr, &g.s)) { if (g.has_tpl) turn++; break; }
            if (g.has_tpl) {
                for (k = 0; k < turn; k++) free(users[k]);
                users[0] = users[turn];
                turn = 0;
                ids = template_prompt(&g.tpl, &g.t, &o, users, 1, 1, &n, pend.n ? &mm : NULL, &g.m.config);
            } else ids = encode_prompt(&g.t, &o, text ? text : line, G4_CHAT_BOS, &n);
            if (ids && media_expand(&mm, &g.t, &g.m.config, o.video_fps, &ids, &n)) { free(ids); ids = NULL; }
            if (!ids) { if (g.has_tpl) free(users[0]); break; }
        }
        if (n + extra > (size_t)(g.s.cfg.max_context - g.s.pos)) {
            fprintf(stderr, "gemma4: this turn's %lu tokens and its answer do not fit the context of %d positions (--ctx)\n",
                    (unsigned long)n, g.s.cfg.max_context);
            free(ids);
            if (g.has_tpl) turn++;
            break;
        }
        mm.bf16 = g.s.cfg.bf16;
        if (mm.n && (get_pool(&pool) || g4mm_encode(&mm, &g.m, dir[0], pool, &soft))) {
            free(ids);
            if (g.has_tpl) turn++;
            break;
        }
        g.soft = soft;
        g.n_soft = mm.total_soft;
        r = gen_run(&g, ids, n, o.max_tokens, &n_new, &tp, &td);
        g.soft = NULL;
        free(soft);
        soft = NULL;
        g4mm_free(&mm);
        media_clear(&pend);
        cli_files = 0;
        free(ids);
        turn++;
        if (r == 1) break;
        print_stats((int)n, n_new, tp, td);
        if (g.has_drafter) print_spec_stats(&g.dr.sp);
        if (r == GEN_FULL) {
            fprintf(stderr, "context full: the answer was cut at %d positions; the next turn starts over (--ctx sets the "
                    "size)\n", g.s.pos);
            cut = 1;
        }
    }
    if (g.has_tpl) for (k = 0; k < turn; k++) free(users[k]);
    free(users);
    free(line);
    free(text);
    g4mm_free(&mm);
    media_clear(&pend);
    gen_free(&g);
    return rc;
}

/* gemma4 template DIR --messages FILE.json [--think] [--no-generation-prompt] [--ids]:
   DIR's chat template rendered as transformers' apply_chat_template(messages,
   tools=tools, tokenize=False, add_generation_prompt=..., enable_thinking=...)
   byte for byte, or with --ids its token ids (tokenize=True) on one line.
   FILE.json: {"messages": [...], "tools": [...]}; other members are passed as
   template variables. */
static int cmd_template(int argc, char **argv) {
    const char *msgs = NULL, *pos[1];
    int ids_out = 0, i, rc = 1, np, no_gen = 0, think = 0;
    g4_template t;
    g4_tokenizer tok;
    g4_template_options o = g4_template_options_init();
    char *json = NULL, *text = NULL, cfgname[4096], jinja[4096];
    int32_t *ids = NULL;
    size_t len = 0, n = 0;
    g4_result r;
    FILE *f;
    struct { g4a_list media; const char *processor; } mo;
    g4mm mm;
    g4a_opt opts[] = {
        G4A_SR("--messages", &msgs, "FILE.json", "{\"messages\": [...], \"tools\": [...]}; other members are template variables"),
        G4A_F("--think", &think, "enable_thinking=True"),
        G4A_F("--no-generation-prompt", &no_gen, "add_generation_prompt=False"),
        G4A_F("--ids", &ids_out, "print the token ids (tokenize=True) instead of the text"),
        OPT_MEDIA(&mo),
    };
    g4a_cmd cmd = {"template", "DIR", 1, 1,
                   "DIR's chat template (chat_template.jinja, or tokenizer_config.json's chat_template) rendered as\n"
                   "transformers' apply_chat_template byte for byte, or its token ids. Image and audio content items\n"
                   "({\"type\": \"image\"}, {\"type\": \"audio\"}) render as the template writes them; with --ids, --image and\n"
                   "--audio files expand their placeholders as Gemma4Processor does (its ids for those files).",
                   opts, G4A_N_OPTS(opts)};
    memset(&mo, 0, sizeof mo);
    memset(&mm, 0, sizeof mm);
    if ((rc = g4a_parse(&cmd, argc, argv, 2, pos, &np)) != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    rc = 1;
    if (mo.media.n && !ids_out) { g4a_fail(&cmd, "--image and --audio expand the ids: they need --ids"); return 1; }
    if (mo.processor && !g4a_opt_of(&cmd, "--image")->given && !g4a_opt_of(&cmd, "--video")->given &&
        !g4a_opt_of(&cmd, "--audio")->given) {
        g4a_fail(&cmd, "--processor needs --image, --video or --audio");
        return 1;
    }
    o.enable_thinking = think;
    if (no_gen) o.add_generation_prompt = 0;
    if (load_tokenizer(&tok, pos[0], NULL)) return 1;
    if ((r = g4_template_load(&t, pos[0])) != G4_OK) {
        snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", pos[0]);
        snprintf(cfgname, sizeof cfgname, "%s/tokenizer_config.json", pos[0]);
        if (r == G4_ERR_IO && !is_file(jinja))
            fprintf(stderr, "gemma4 template: no chat template in %s (looked for %s and a chat_template in %s); give the "
                    "directory of a checkpoint that has one\n", pos[0], jinja, cfgname);
        else print_error(t.error);
        g4_tokenizer_free(&tok);
        return 1;
    }
    g4_template_set_tokens(&t, &tok);
    if ((f = open_file(msgs, "rb")) != NULL) {
        json = read_all(f, &len);
        if (!json) fprintf(stderr, "gemma4: %s: out of memory\n", msgs);
        else if (ferror(f)) { fprintf(stderr, "gemma4: %s: cannot read (%s)\n", msgs, strerror(errno)); free(json); json = NULL; }
        fclose(f);
    }
    if (json && !ids_out) {
        if (g4_template_render(&t, json, len, &o, &text, &n, NULL) != G4_OK) print_error(t.error);
        else if (fwrite(text, 1, n, stdout) == n) rc = 0;
    } else if (json) {
        int32_t *x = NULL, *ids2 = NULL;
        int nx = 0;
        g4_config c;
        if (g4mm_has(&mo.media, G4MM_VIDEO)) { /* videos: expanded in the rendered text, then tokenized (mm's own ids) */
            if (!load_config_of(pos[0], &c) && !g4mm_prepare(&mm, &c, pos[0], mo.processor, &mo.media) &&
                (x = template_video_ids(&t, &tok, &o, json, len, 1, &mm, &c, 0.0, &n)) != NULL &&
                !g4mm_expand(&mm, &c, x, (int)n, &ids2, &nx)) {
                for (i = 0; i < nx; i++) printf(i ? " %d" : "%d", (int)ids2[i]);
                printf("\n");
                rc = 0;
            }
            free(ids2);
        } else if (g4_template_encode(&t, &tok, json, len, &o, &ids, &n, NULL) != G4_OK) print_error(t.error);
        else if ((nx = (int)n, !mo.media.n) || (!load_config_of(pos[0], &c) && !g4mm_prepare(&mm, &c, pos[0], mo.processor, &mo.media) &&
                                 !g4mm_expand(&mm, &c, ids, (int)n, &x, &nx))) {
            for (i = 0; i < nx; i++) printf(i ? " %d" : "%d", (int)(x ? x : ids)[i]);
            printf("\n");
            rc = 0;
        }
        free(x);
        g4mm_free(&mm);
    }
    g4_template_free_output(text);
    g4_template_free_output(ids);
    free(json);
    g4_template_free(&t);
    g4_tokenizer_free(&tok);
    return rc;
}

/* --------------------------------------------------- logits and greedy */

/* What logits, greedy and draft take: --ids, --chunk, --out / --new / --steps. */
typedef struct {
    int32_t *ids;
    int n, chunk, n_new, draft_tokens, steps, bf16;
    const char *dir, *ids_arg, *out_path, *drafter;
    const char *processor;         /* --processor DIR (with --image) */
    g4a_list media;                /* --image FILE, --audio FILE (repeatable; mm.h) */
} run_opts;

/* Parses a logits / greedy / draft command line into o (ids parsed);
   G4A_RESULT_OK, _ERR (printed) or _HELP. */
static int parse_run_opts(int argc, char **argv, run_opts *o) {
    int np, rc, logits = strcmp(argv[1], "logits") == 0, draft = strcmp(argv[1], "draft") == 0;
    const char *pos[1];
    g4a_opt lo[] = {
        G4A_SR("--ids", &o->ids_arg, "2,818,1010", "the token ids, run as one sequence"),
        G4A_SR("--out", &o->out_path, "FILE", "where the float32 logits [n_ids][vocab] go"),
        G4A_I("--chunk", &o->chunk, "N", 1, INT_MAX, "most tokens per step (default 64)"),
        G4A_F("--bf16", &o->bf16, "the bf16-faithful mode (as transformers in bfloat16)"),
        OPT_MEDIA(o),
        OPT_BF16_FAST,
        OPT_THREADS,
        OPT_ADAPTER,
    };
    g4a_opt gr[] = {
        G4A_SR("--ids", &o->ids_arg, "2,818", "the prompt's token ids"),
        G4A_IR("--new", &o->n_new, "N", 0, INT_MAX, "how many tokens to choose greedily"),
        G4A_I("--chunk", &o->chunk, "N", 1, INT_MAX, "most tokens per step (default 64)"),
        G4A_F("--bf16", &o->bf16, "the bf16-faithful mode (as transformers in bfloat16)"),
        OPT_BF16_FAST,
        G4A_S("--drafter", &o->drafter, "DIR", "speculative decoding with a gemma4_assistant drafter (the same tokens)"),
        G4A_I("--draft-tokens", &o->draft_tokens, "K", 1, 1024, "draft tokens per round (default 4)"),
        OPT_MEDIA(o),
        OPT_THREADS,
        OPT_ADAPTER,
    };
    g4a_opt dr[] = {
        G4A_SR("--drafter", &o->drafter, "DIR", "the gemma4_assistant drafter"),
        G4A_SR("--ids", &o->ids_arg, "2,818", "the prompt's token ids, which the target prefills"),
        G4A_IR("--steps", &o->steps, "K", 1, 1024, "drafting steps"),
        G4A_SR("--out", &o->out_path, "FILE", "where the drafter's float32 logits [K][vocab] go"),
        OPT_THREADS,
    };
    g4a_cmd cmd = {"logits", "DIR", 1, 1,
                   "Runs the ids as one sequence, writes every position's float32 little-endian logits [n_ids][vocab]\n"
                   "to FILE and prints each position's argmax.", lo, G4A_N_OPTS(lo)};
    if (draft) {
        cmd.name = "draft";
        cmd.pos = "TARGET_DIR";
        cmd.summary = "The drafter's float32 logits [K][vocab] of the first drafting round after the target prefilled\n"
                      "the ids (its greedy token starts the round), as transformers' assisted generation computes them,\n"
                      "and the drafted ids.";
        cmd.opts = dr;
        cmd.n_opts = G4A_N_OPTS(dr);
    } else if (!logits) {
        cmd.name = "greedy";
        cmd.summary = "Prints the ids, then N greedily chosen ones (with --drafter: the same, from speculative rounds,\n"
                      "and the drafted, accepted and target-step counts on stderr).";
        cmd.opts = gr;
        cmd.n_opts = G4A_N_OPTS(gr);
    }
    memset(o, 0, sizeof *o);
    o->draft_tokens = 4;
    if ((rc = g4a_parse(&cmd, argc, argv, 2, pos, &np)) != G4A_RESULT_OK) return rc;
    o->dir = pos[0];
    if (!draft && !logits && g4a_opt_of(&cmd, "--draft-tokens")->given && !o->drafter) {
        g4a_fail(&cmd, "--draft-tokens needs --drafter");
        return G4A_RESULT_ERR;
    }
    if (!draft && !logits && o->media.n && o->drafter) {
        g4a_fail(&cmd, "--image and --audio do not go with --drafter (a drafter takes no images or audio)");
        return G4A_RESULT_ERR;
    }
    if (!draft && o->processor && !g4a_opt_of(&cmd, "--image")->given && !g4a_opt_of(&cmd, "--video")->given &&
        !g4a_opt_of(&cmd, "--audio")->given) {
        g4a_fail(&cmd, "--processor needs --image, --video or --audio");
        return G4A_RESULT_ERR;
    }
    return (o->n = parse_ids(o->ids_arg, &o->ids)) < 0 ? G4A_RESULT_ERR : G4A_RESULT_OK;
}

#define PARSE_RUN_OPTS(o)                                                                  \
    do {                                                                                   \
        int r_ = parse_run_opts(argc, argv, &o);                                           \
        if (r_ != G4A_RESULT_OK) return r_ == G4A_RESULT_HELP ? 0 : 1;                     \
    } while (0)

/* fwrite of n floats to path; 0, or 1 after a message naming path and the reason */
static int write_floats(const char *path, const float *x, size_t n) {
    FILE *f = fopen(path, "wb");
    int ok;
    if (!f) { fprintf(stderr, "gemma4: %s: cannot write (%s)\n", path, strerror(errno)); return 1; }
    ok = fwrite(x, sizeof(float), n, f) == n;
    if (!ok) fprintf(stderr, "gemma4: %s: short write (%s)\n", path, strerror(errno));
    if (fclose(f) != 0 && ok) { fprintf(stderr, "gemma4: %s: cannot write (%s)\n", path, strerror(errno)); ok = 0; }
    return !ok;
}

/* --image / --audio, before the session: the config's placeholder ids, every
   file through its processor, o->ids expanded (mm.h), and a step that holds the
   longest image run whole (*chunk, unless --chunk was given). 0, or 1 after a message. */
static int media_pre(run_opts *o, g4mm *mm, int *chunk) {
    g4_config c;
    char path[4096];
    int32_t *ids = NULL;
    int n = 0;
    memset(mm, 0, sizeof *mm);
    *chunk = o->chunk;
    if (!o->media.n) return 0;
    snprintf(path, sizeof path, "%s/config.json", o->dir);
    if (g4_config_load(&c, path) != G4_OK) { print_error(c.error); return 1; }
    if (g4mm_prepare(mm, &c, o->dir, o->processor, &o->media)) return 1;
    if (mm->n_video) { /* the ids' lone <|video|> become their frames' runs with the stamps' ids (the model's tokenizer) */
        g4_tokenizer tok;
        size_t nv;
        int32_t *vids = o->ids;
        char tj[4096];
        snprintf(tj, sizeof tj, "%s/tokenizer.json", o->processor ? o->processor : "");
        /* the stamps' ids: the tokenizer of --processor DIR if it has one (a processor's directory), else the model's */
        if (load_tokenizer(&tok, o->processor && is_file(tj) ? o->processor : o->dir, NULL)) return 1;
        nv = (size_t)o->n;
        if (g4mm_expand_video_ids(mm, &tok, &c, 0.0, &vids, &nv)) { g4_tokenizer_free(&tok); return 1; }
        g4_tokenizer_free(&tok);
        o->ids = vids;
        o->n = (int)nv;
    }
    if (g4mm_expand(mm, &c, o->ids, o->n, &ids, &n)) return 1;
    free(o->ids);
    o->ids = ids;
    o->n = n;
    if (!*chunk && mm->max_run > 64) *chunk = mm->max_run;
    return 0;
}

/* gemma4 logits DIR --ids ... --out FILE: all logits [n][V] to FILE, argmax of each */
static int cmd_logits(int argc, char **argv) {
    run_opts o;
    g4_model m;
    g4_session s;
    float *logits = NULL, *soft = NULL;
    int i, V, rc = 1, chunk;
    g4mm mm;
    g4_pool *pool;
    PARSE_RUN_OPTS(o);
    if (media_pre(&o, &mm, &chunk)) { g4mm_free(&mm); free(o.ids); return 1; }
    if (open_session(o.dir, o.n, chunk, o.bf16, &m, &s)) { g4mm_free(&mm); free(o.ids); return 1; }
    mm.bf16 = s.cfg.bf16;
    if (mm.n && (get_pool(&pool) || g4mm_encode(&mm, &m, o.dir, pool, &soft))) goto done;
    V = m.config.vocab_size;
    logits = (float *)malloc(sizeof(float) * (size_t)o.n * (size_t)V);
    if (!logits) { fprintf(stderr, "gemma4: out of memory for %d x %d logits\n", o.n, V); goto done; }
    if ((mm.n ? g4_forward_mm(&s, o.ids, o.n, soft, mm.total_soft, logits, G4_LOGITS_ALL, NULL)
              : g4_forward(&s, o.ids, o.n, logits, G4_LOGITS_ALL)) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", s.error);
        goto done;
    }
    if (write_floats(o.out_path, logits, (size_t)o.n * V)) goto done;
    printf("argmax:");
    for (i = 0; i < o.n; i++) printf(" %d", (int)g4_argmax(logits + (size_t)i * V, V));
    printf("\nwrote %d x %d float32 logits to %s\n", o.n, V, o.out_path);
    rc = 0;
done:
    g4mm_free(&mm);
    free(soft);
    return close_session(&m, &s, o.ids, logits, rc);
}

/* gemma4 audio DIR CLIP.wav --out FILE: the clip's soft tokens as they enter
   the decoder (Gemma4AudioFeatureExtractor, the audio tower, embed_audio,
   padding stripped), float32 little-endian [n][hidden] */
static int cmd_audio(int argc, char **argv) {
    const char *pos[2], *out_path = NULL;
    g4_model m;
    g4mm mm;
    g4a_list one;
    float *soft = NULL;
    int rc, ret = 1, bf16 = 0;
    const char *pdir = NULL;
    g4_pool *pool;
    rc = parse_soft_cmd(argc, argv, "audio", "DIR CLIP.wav",
                        "One clip's soft tokens as they enter the decoder: the WAV (PCM16 or float32, mono, 16 kHz, at most\n"
                        "30 s) through Gemma4AudioFeatureExtractor, the audio tower and embed_audio, padding stripped; float32\n"
                        "[n][hidden] to FILE. On a 12B (gemma4_unified): frames of audio_samples_per_token raw samples through\n"
                        "its encoder-free embedder, one soft token each.",
                        "where the float32 [n][hidden] soft tokens go",
                        "the directory of processor_config.json (default: the model's)", pos, &out_path, &pdir, &bf16);
    if (rc != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    memset(&one, 0, sizeof one);
    one.value[0] = pos[1];
    one.tag[0] = G4MM_AUDIO;
    one.n = 1;
    if (load_model(&m, pos[0])) return 1;
    if (g4mm_prepare(&mm, &m.config, pos[0], pdir, &one) == 0 && get_pool(&pool) == 0 &&
        (mm.bf16 = bf16, g4mm_encode(&mm, &m, pos[0], pool, &soft) == 0) &&
        write_floats(out_path, soft, (size_t)mm.total_soft * (size_t)m.config.hidden_size) == 0) {
        printf("%s: %d feature frames, %d soft tokens\nwrote %d x %d float32 soft tokens to %s\n", pos[1], mm.f[0].nf,
               mm.total_soft, mm.total_soft, m.config.hidden_size, out_path);
        ret = 0;
    }
    g4mm_free(&mm);
    free(soft);
    g4_model_free(&m);
    return ret;
}

/* greedy with --drafter: the same tokens from speculative rounds, then the
   drafted, accepted and target-step counts on stderr */
static int greedy_spec(run_opts *o) {
    g4_model m;
    g4_session s;
    drafter_ctx x;
    int32_t *out = NULL;
    int i, got = 0, mm, rc = 1, chunk = o->chunk ? o->chunk : 64;
    if (chunk < o->draft_tokens + 2) chunk = o->draft_tokens + 2;
    memset(&x, 0, sizeof x);
    if (open_session(o->dir, o->n + o->n_new + o->draft_tokens + 2, chunk, o->bf16, &m, &s)) { free(o->ids); return 1; }
    if (drafter_open(&x, o->drafter, &s, o->draft_tokens)) goto done;
    if (!(out = (int32_t *)malloc(sizeof(int32_t) * (size_t)(o->n_new + o->draft_tokens + 2)))) goto done;
    if (o->n_new > 0) {
        if (g4_spec_prefill(&x.sp, o->ids, o->n, NULL, &out[0]) != G4_OK) { fprintf(stderr, "gemma4: %s\n", x.sp.error); goto done; }
        for (got = 1; got < o->n_new; got += mm)
            if (g4_spec_round(&x.sp, NULL, out + got, &mm) != G4_OK) { fprintf(stderr, "gemma4: %s\n", x.sp.error); goto done; }
    } else if (g4_forward(&s, o->ids, o->n, NULL, G4_LOGITS_NONE) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", s.error);
        goto done;
    }
    for (i = 0; i < o->n; i++) printf("%d ", (int)o->ids[i]);
    for (i = 0; i < o->n_new; i++) printf("%d%s", (int)out[i], i + 1 < o->n_new ? " " : "");
    printf("\n");
    fflush(stdout);
    print_spec_stats(&x.sp);
    rc = 0;
done:
    drafter_free(&x);
    return close_session(&m, &s, o->ids, out, rc);
}

/* gemma4 draft TARGET --drafter DRAFTER --ids ... --steps K --out FILE: the
   drafter's [K][V] float32 logits of the first drafting round after the
   target prefilled the ids (its greedy token starts the round), as
   transformers' assisted generation computes them; the drafted ids */
static int cmd_draft(int argc, char **argv) {
    run_opts o;
    g4_model m;
    g4_session s;
    drafter_ctx x;
    float *logits = NULL, *h = NULL;
    int32_t tok, *drafted = NULL;
    int i, V, rc = 1;
    PARSE_RUN_OPTS(o);
    memset(&x, 0, sizeof x);
    if (open_session(o.dir, o.n + 1, 0, 0, &m, &s)) { free(o.ids); return 1; }
    if (drafter_open(&x, o.drafter, &s, 0)) goto done;
    V = m.config.vocab_size;
    logits = (float *)malloc(sizeof(float) * (size_t)o.steps * (size_t)V);
    h = (float *)malloc(sizeof(float) * (size_t)m.config.hidden_size);
    drafted = (int32_t *)malloc(sizeof(int32_t) * (size_t)o.steps);
    if (!logits || !h || !drafted) { fprintf(stderr, "gemma4: out of memory for %d x %d logits\n", o.steps, V); goto done; }
    if (g4_forward_hidden(&s, o.ids, o.n, logits, G4_LOGITS_LAST, h) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
    tok = g4_argmax(logits, V);
    printf("target: %d\n", (int)tok);
    for (i = 0; i < o.steps; i++) {
        float *row = logits + (size_t)i * V;
        if (g4_draft_step(&x.d, tok, h, row, h) != G4_OK) { fprintf(stderr, "gemma4: %s\n", x.d.error); goto done; }
        drafted[i] = tok = g4_argmax(row, V);
    }
    if (write_floats(o.out_path, logits, (size_t)o.steps * V)) goto done;
    printf("drafted:");
    for (i = 0; i < o.steps; i++) printf(" %d", (int)drafted[i]);
    printf("\nwrote %d x %d float32 logits to %s\n", o.steps, V, o.out_path);
    rc = 0;
done:
    free(h);
    free(drafted);
    drafter_free(&x);
    return close_session(&m, &s, o.ids, logits, rc);
}

/* gemma4 greedy DIR --ids ... --new N: the ids, then N greedily chosen ones */
static int cmd_greedy(int argc, char **argv) {
    run_opts o;
    g4_model m;
    g4_session s;
    float *logits = NULL, *soft = NULL;
    int i, V, rc = 1, chunk;
    g4mm mm;
    g4_pool *pool;
    PARSE_RUN_OPTS(o);
    if (o.drafter) return greedy_spec(&o);
    if (media_pre(&o, &mm, &chunk)) { g4mm_free(&mm); free(o.ids); return 1; }
    if (open_session(o.dir, o.n + o.n_new, chunk, o.bf16, &m, &s)) { g4mm_free(&mm); free(o.ids); return 1; }
    mm.bf16 = s.cfg.bf16;
    if (mm.n && (get_pool(&pool) || g4mm_encode(&mm, &m, o.dir, pool, &soft))) goto done;
    V = m.config.vocab_size;
    if (!(logits = (float *)malloc(sizeof(float) * (size_t)V))) { fprintf(stderr, "gemma4: out of memory\n"); goto done; }
    if ((mm.n ? g4_forward_mm(&s, o.ids, o.n, soft, mm.total_soft, logits, G4_LOGITS_LAST, NULL)
              : forward_progress(&s, o.ids, o.n, logits, G4_LOGITS_LAST)) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", s.error);
        goto done;
    }
    for (i = 0; i < o.n; i++) printf("%d ", (int)o.ids[i]);
    for (i = 0; i < o.n_new; i++) {
        int32_t next = g4_argmax(logits, V);
        printf("%d%s", (int)next, i + 1 < o.n_new ? " " : "");
        fflush(stdout);
        if (i + 1 < o.n_new && g4_forward(&s, &next, 1, logits, G4_LOGITS_LAST) != G4_OK) {
            printf("\n");
            fflush(stdout);
            fprintf(stderr, "gemma4: %s\n", s.error);
            goto done;
        }
    }
    printf("\n");
    rc = 0;
done:
    g4mm_free(&mm);
    free(soft);
    return close_session(&m, &s, o.ids, logits, rc);
}

/* ------------------------------------------------------------ commands */

/* Every command: its name, its handler (argv[1] is the name; each parses
   its own arguments with args.h, and prints its help for --help) and one
   line for `gemma4 help`. A new command is one row here. */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"info", cmd_info, "PATH: the KV-sharing plan of a model directory or config.json"},
    {"logits", cmd_logits, "DIR --ids ... --out FILE: every position's logits, and their argmax"},
    {"greedy", cmd_greedy, "DIR --ids ... --new N: N greedily chosen tokens"},
    {"draft", cmd_draft, "TARGET_DIR --drafter DIR --ids ... --steps K --out FILE: a drafter's logits"},
    {"compare", cmd_compare, "DIR DUMP.safetensors: gemma4.h against a tap dump, tap by tap"},
    {"grad", g4t_cmd_grad, "DIR --ids ... --out FILE: the loss and every gradient"},
    {"bench", g4t_cmd_bench, "DIR: prefill and decode speed (--grad: training speed)"},
    {"synth", g4b_cmd_synth, "--config CONFIG.json --out DIR: a random checkpoint of a config's shape"},
    {"bench-towers", g4b_cmd_bench_towers, "--config CONFIG.json: the vision and audio towers' speed"},
    {"tokenize", cmd_tokenize, "TOKENIZER_JSON_OR_MODEL_DIR [TEXT]: token ids"},
    {"template", cmd_template, "DIR --messages FILE.json: a chat template rendered as transformers renders it"},
    {"generate", cmd_generate, "DIR --prompt TEXT: a sampled answer, streamed"},
    {"chat", cmd_chat, "DIR: a conversation on stdin, one session"},
    {"image", g4img_cmd_image, "DIR IMAGE.png|jpg --out FILE: one image's soft tokens as they enter the decoder"},
    {"audio", cmd_audio, "DIR CLIP.wav --out FILE: one clip's soft tokens as they enter the decoder"},
};
#define N_COMMANDS ((int)(sizeof commands / sizeof commands[0]))

/* Every command with its summary on f. */
static void list_commands(FILE *f) {
    int k;
    fprintf(f, "usage: gemma4 COMMAND ARGS...   (gemma4 help COMMAND: its options)\n");
    for (k = 0; k < N_COMMANDS; k++) fprintf(f, "  %-9s %s\n", commands[k].name, commands[k].summary);
}

int main(int argc, char **argv) {
    int k, rc;
    char help_flag[] = "--help";
    n_threads = cpu_count();
    bf16_fast = 0;
    if (argc < 2) { list_commands(stderr); return 1; }
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        if (argc == 2) { list_commands(stdout); return 0; }
        for (k = 0; k < N_COMMANDS; k++)
            if (strcmp(argv[2], commands[k].name) == 0) {
                char *hargv[4];
                hargv[0] = argv[0];
                hargv[1] = argv[2];
                hargv[2] = help_flag;
                hargv[3] = NULL;
                return commands[k].run(3, hargv);
            }
        fprintf(stderr, "gemma4: unknown command '%s' (gemma4 help lists the commands)\n", argv[2]);
        return 1;
    }
    for (k = 0; k < N_COMMANDS; k++)
        if (strcmp(argv[1], commands[k].name) == 0) {
            rc = commands[k].run(argc, argv);
            fflush(stdout);
            g4_pool_free(threads_pool);
            return rc;
        }
    fprintf(stderr, "gemma4: unknown command '%s' (gemma4 help lists the commands)\n", argv[1]);
    return 1;
}
