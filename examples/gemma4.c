/* gemma4 - the command-line face of gemma4.h.

   One command per row of the table `commands` at the end of this file (name,
   handler, arguments); `gemma4` alone prints them all from it, and a command
   given bad arguments prints its own row.

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
   stderr; it stops at <eos> or <turn|>. Defaults: temperature 1, top-k 64,
   top-p 0.95 (Gemma's generation_config), a time-based seed printed to stderr;
   --temp 0 is greedy. `chat` keeps one session, so each turn feeds only its
   own tokens. The tokenizer is DIR/tokenizer.json unless --tokenizer is given.
   Errors: one line on stderr, exit status 1. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, isatty, opendir */
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include "../gemma4_processing.h"
static int load_model(g4_model *m, const char *dir); /* (below: the model and --adapter) */
#include "bench.h"
#include "compare.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* "usage: gemma4 NAME ARGS" for one command, or for all (NULL); returns 1.
   The lines come from the table `commands` below. */
static int usage(const char *command);
static int parse_ids(const char *s, int32_t **out);

/* --adapter DIR (logits, greedy, generate, chat, compare, grad, info, bench): main()
   takes it out of argv; every command loads its model through load_model. */
static const char *adapter_dir;
static int adapter_bf16; /* --adapter-bf16: the adapter cast to bf16 too (g4_session_config.lora_bf16) */

/* g4_model_load, then the LoRA adapter if one was given; 0 or 1 (printed) */
static int load_model(g4_model *m, const char *dir) {
    if (g4_model_load(m, dir) != G4_OK) { fprintf(stderr, "gemma4: %s\n", m->error); return 1; }
    if (adapter_dir && g4_model_load_adapter(m, adapter_dir) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", m->error);
        g4_model_free(m);
        return 1;
    }
    return 0;
}
#include "train.h"
#include "image.h"

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

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* gemma4 info PATH: the plan of a model directory or config.json */
static int cmd_info(int argc, char **argv) {
    const char *path = argv[2];
    g4_config c;
    g4_plan p;
    g4_result r;
    char buf[4096];
    int train = 0;
    if (argc == 5 && strcmp(argv[3], "--train") == 0) {
        if ((train = g4b_int(argv[4])) < 2) { fprintf(stderr, "gemma4 info: --train needs a length >= 2\n"); return 1; }
    } else if (argc != 3) return usage(argv[1]);
    if (is_dir(path)) {
        snprintf(buf, sizeof buf, "%s/config.json", path);
        path = buf;
    }
    r = g4_config_load(&c, path);
    if (r != G4_OK) { fprintf(stderr, "gemma4: %s\n", c.error); return 1; }
    if (g4_plan_build(&p, &c) != G4_OK) { fprintf(stderr, "gemma4: %s: %s\n", path, p.error); return 1; }
    g4_plan_print(&p, &c, stdout);
    if (adapter_dir) { /* which modules of which layers the adapter changes */
        g4_model m;
        int k;
        if (!is_dir(argv[2])) { fprintf(stderr, "gemma4: info --adapter needs the model directory\n"); return 1; }
        if (load_model(&m, argv[2])) return 1;
        printf("adapter %s: %d modules, largest rank %d%s\n", adapter_dir, m.n_lora, m.lora_rmax,
               m.lora_ignored ? " (plus vision/audio tower tensors, not run)" : "");
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
        r = g4_template_load(&t, argv[2]);
        if (r == G4_OK) printf("chat template: %s\n", t.name);
        else if (r == G4_ERR_IO) printf("chat template: none; generate --chat and chat use the built-in Gemma 4 layout\n");
        else printf("chat template: unusable: %s\n", t.error);
        g4_template_free(&t);
    }
    return train ? g4t_print_sizes(&c, &p, train) : 0;
}

/* Loads DIR and opens a session for n tokens, in the bf16-faithful mode when
   bf16 (g4_session_destroy, then g4_model_free, when done). */
static int open_session(const char *dir, int n, int chunk, int bf16, g4_model *m, g4_session *s) {
    g4_session_config sc = g4_session_config_init();
    if (load_model(m, dir)) return 1;
    sc.max_context = n;
    sc.bf16 = bf16;
    sc.lora_bf16 = adapter_bf16;
    if (chunk > 0) sc.max_chunk = chunk;
    if (g4_session_create(s, m, &sc) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", s->error);
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

/* A drafter (gemma4_assistant) attached to a target session, with the
   speculative decoding workspace (drafter_free when done). */
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
    if (g4_model_load(&x->m, dir) != G4_OK) { fprintf(stderr, "gemma4: drafter: %s\n", x->m.error); return 1; }
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
    const char *dir = argv[2], *dump = argv[3];
    double tol = -1;
    int i, chunk = 0, bf16 = -1, first, rc = 1;
    g4cmp c;
    g4_model m;
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    float *logits = NULL;
    if (argc < 4) return usage(argv[1]);
    memset(&s, 0, sizeof s);
    for (i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--f32") == 0) bf16 = 0;
        else if (strcmp(argv[i], "--bf16") == 0) bf16 = 1;
        else if (strcmp(argv[i], "--tolerance") == 0 && i + 1 < argc) tol = g4b_num(argv[++i]);
        else if (strcmp(argv[i], "--chunk") == 0 && i + 1 < argc) chunk = g4b_int(argv[++i]);
        else return usage(argv[1]);
    }
    if (g4cmp_open(&c, dump) != G4_OK) { fprintf(stderr, "gemma4: %s\n", c.error); g4cmp_close(&c); return 1; }
    if (load_model(&m, dir)) { g4cmp_close(&c); return 1; }
    sc.bf16 = bf16 >= 0 ? bf16 : c.bf16;
    sc.lora_bf16 = adapter_bf16;
    if (tol != tol) { g4cmp_close(&c); g4_model_free(&m); return usage(argv[1]); }
    if (tol < 0) tol = sc.bf16 ? G4CMP_TOL_BF16 : G4CMP_TOL_F32;
    sc.max_context = c.n_ids;
    if (chunk > 0) sc.max_chunk = chunk;
    sc.tap = g4cmp_tap;
    sc.tap_user = &c;
    if (!(logits = (float *)malloc(sizeof(float) * (size_t)c.n_ids * m.config.vocab_size))) {
        fprintf(stderr, "gemma4: out of memory for %d positions\n", c.n_ids);
        goto done;
    }
    if (g4_session_create(&s, &m, &sc) != G4_OK || g4_forward(&s, c.ids, c.n_ids, logits, G4_LOGITS_ALL) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", s.error);
        goto done;
    }
    printf("gemma4.h (%s) vs %s (%s), %d tokens\n", sc.bf16 ? "bf16-faithful" : "float32", dump,
           c.bf16 ? "bfloat16" : "float32", c.n_ids);
    first = g4cmp_report(&c, tol, stdout);
    rc = first >= 0 ? 2 : 0;
    if (g4_model_tensor(&c.dump, "loss")) { /* a --grad dump: the loss and the gradients too */
        int g = sc.bf16 ? 1 : g4t_compare_grads(&m, dump, &c, tol);
        if (sc.bf16) fprintf(stderr, "gemma4: gradients are compared in float32 only\n");
        if (g > rc || g == 1) rc = g;
    }
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

/* gemma4 tokenize TOKENIZER_JSON_OR_MODEL_DIR [TEXT]: the ids of TEXT (or of all
   of stdin) on one line, as tokenizers' encode(TEXT).ids (post-processor applied). */
static int cmd_tokenize(int argc, char **argv) {
    g4_tokenizer t;
    char *text;
    size_t len = 0, n, i, cap;
    int32_t *ids;
    int rc = 1;
    if (argc > 4) return usage(argv[1]);
    if (g4_tokenizer_load(&t, argv[2]) != G4_OK) { fprintf(stderr, "gemma4: %s\n", t.error); return 1; }
    if (argc == 4) { len = strlen(argv[3]); text = (char *)malloc(len + 1); if (text) memcpy(text, argv[3], len + 1); }
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

/* Reads the weight files once, so the model's pages are in memory before the
   first step; on a terminal it shows how far it got. */
static void warm_weights(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    double total = 0, done = 0;
    int tty = isatty(2);
    static char buf[1 << 20];
    if (!d) return;
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

typedef struct {
    const char *tokenizer, *system, *prompt, *drafter;
    int chat, think, max_tokens, ctx, draft_tokens, bf16;
    g4_sampler_config sc;
    int seed_given;
} gen_opts;

/* The flags generate and chat share; returns 0, or 1 after printing usage. */
static int parse_gen_opts(int argc, char **argv, gen_opts *o, int is_chat) {
    int i;
    memset(o, 0, sizeof *o);
    o->sc = g4_sampler_config_init();
    o->sc.top_k = 64;      /* Gemma's generation_config defaults */
    o->sc.top_p = 0.95f;
    o->max_tokens = is_chat ? 1024 : 256;
    o->draft_tokens = 4;
    for (i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--chat") == 0) { o->chat = 1; continue; }
        if (strcmp(a, "--think") == 0) { o->think = 1; continue; }
        if (strcmp(a, "--bf16") == 0) { o->bf16 = 1; continue; }
        if (!v) return usage(argv[1]);
        i++;
        if (strcmp(a, "--prompt") == 0 && !is_chat) o->prompt = v;
        else if (strcmp(a, "--system") == 0) o->system = v;
        else if (strcmp(a, "--tokenizer") == 0) o->tokenizer = v;
        else if (strcmp(a, "--temp") == 0) o->sc.temperature = (float)g4b_num(v);
        else if (strcmp(a, "--top-k") == 0) o->sc.top_k = g4b_int(v);
        else if (strcmp(a, "--top-p") == 0) o->sc.top_p = (float)g4b_num(v);
        else if (strcmp(a, "--min-p") == 0) o->sc.min_p = (float)g4b_num(v);
        else if (strcmp(a, "--repeat-penalty") == 0) o->sc.repetition_penalty = (float)g4b_num(v);
        else if (strcmp(a, "--seed") == 0) { o->sc.seed = strtoull(v, NULL, 10); o->seed_given = 1; }
        else if (strcmp(a, "--max-tokens") == 0) o->max_tokens = g4b_int(v);
        else if (strcmp(a, "--ctx") == 0) o->ctx = g4b_int(v);
        else if (strcmp(a, "--drafter") == 0) o->drafter = v;
        else if (strcmp(a, "--draft-tokens") == 0) o->draft_tokens = g4b_int(v);
        else return usage(argv[1]);
    }
    if ((!is_chat && !o->prompt) || o->max_tokens < 0 || o->ctx < 0 || o->sc.top_k < 0 || o->draft_tokens < 1 ||
        o->sc.temperature != o->sc.temperature || o->sc.top_p != o->sc.top_p || o->sc.min_p != o->sc.min_p ||
        o->sc.repetition_penalty != o->sc.repetition_penalty)
        return usage(argv[1]); /* a value that is not a number */
    if (!o->seed_given) o->sc.seed = (uint64_t)time(NULL);
    return 0;
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

/* An error message on one line of stderr (a template's raise_exception text may hold newlines). */
static void print_error(const char *msg) {
    fputs("gemma4: ", stderr);
    for (; *msg; msg++) fputc(*msg == '\n' || *msg == '\r' ? ' ' : *msg, stderr);
    fputc('\n', stderr);
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

/* A growing text (the conversation as JSON); oom set when an allocation failed. */
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

/* {"messages": [system?, user 0, answer, user 1, ..., answer, user n-1]}; the answers, fed already, are
   G4_TEMPLATE_ANSWER (see g4_template_continue) */
static char *chat_json(const gen_opts *o, char **users, int n_users, size_t *len) {
    textbuf b;
    int i;
    memset(&b, 0, sizeof b);
    tb_str(&b, "{\"messages\": [");
    if (o->system) { tb_str(&b, "{\"role\": \"system\", \"content\": "); tb_json(&b, o->system); tb_str(&b, "}, "); }
    for (i = 0; i < n_users; i++) {
        if (i) { tb_str(&b, "{\"role\": \"assistant\", \"content\": "); tb_json(&b, G4_TEMPLATE_ANSWER); tb_str(&b, "}, "); }
        tb_str(&b, "{\"role\": \"user\", \"content\": ");
        tb_json(&b, users[i]);
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
static int32_t *template_prompt(const g4_template *tpl, const g4_tokenizer *t, const gen_opts *o, char **users,
                                int n_users, int first, size_t *n) {
    g4_template_options to = g4_template_options_init();
    size_t len;
    char *json = chat_json(o, users, n_users, &len), err[G4_ERROR_MAX];
    int32_t *ids = NULL, *tids = NULL;
    g4_result r;
    if (!json) return NULL;
    to.enable_thinking = o->think;
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
    if (g4_tokenizer_load(&g->t, o->tokenizer ? o->tokenizer : dir) != G4_OK) {
        fprintf(stderr, "gemma4: %s%s\n", g->t.error, o->tokenizer ? "" : " (give the tokenizer with --tokenizer PATH)");
        return 1;
    }
    g->loaded_t = 1;
    warm_weights(dir);
    if (load_model(&g->m, dir)) return 1;
    g->loaded_m = 1;
    sc.max_context = o->ctx ? o->ctx : max_context;
    sc.bf16 = o->bf16;
    sc.lora_bf16 = adapter_bf16;
    if (o->drafter && sc.max_chunk < o->draft_tokens + 2) sc.max_chunk = o->draft_tokens + 2;
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
    int start = g->s.pos, emitted = 0, stopped = 0, m = 0, j, k;
    memset(&ds, 0, sizeof ds);
    if (!out) { fprintf(stderr, "gemma4: out of memory\n"); return 1; }
    if (n + (size_t)sp->k + 2 > (size_t)(g->s.cfg.max_context - g->s.pos)) {
        fprintf(stderr, "gemma4: %lu prompt tokens and %d drafts do not fit the %d positions left of the context (--ctx)\n",
                (unsigned long)n, sp->k, g->s.cfg.max_context - g->s.pos);
        free(out);
        return 1;
    }
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
        if (g->s.pos + sp->k + 2 > g->s.cfg.max_context) { fprintf(stderr, "\ngemma4: context full (%d positions)\n", g->s.pos); break; }
        if (g4_spec_round(sp, &g->smp, out, &m) != G4_OK) { fprintf(stderr, "\ngemma4: %s\n", sp->error); g4_decode_free(&ds); free(out); return 1; }
    }
    /* what gen_run feeds: the prompt and every printed token but a last one cut by max_tokens */
    k = start + (int)n + emitted - (!stopped && emitted > 0 && emitted >= max_tokens ? 1 : 0);
    if (k < g->s.pos && g4_session_rewind(&g->s, k) != G4_OK) { fprintf(stderr, "\ngemma4: %s\n", g->s.error); g4_decode_free(&ds); free(out); return 1; }
    print_end(&ds);
    *t_decode += now_s() - t1;
    free(out);
    return 0;
}

/* Feeds the prompt ids, then samples and streams up to max_tokens tokens,
   stopping at <eos> or <turn|> (not fed, not printed). Adds to the counters. */
static int gen_run(gen_ctx *g, const int32_t *ids, size_t n, int max_tokens, int *n_new, double *t_prefill,
                   double *t_decode) {
    g4_decode_state ds;
    double t0 = now_s(), t1;
    int i;
    memset(&ds, 0, sizeof ds);
    if (g->has_drafter) return gen_run_spec(g, ids, n, max_tokens, n_new, t_prefill, t_decode);
    if (n > (size_t)(g->s.cfg.max_context - g->s.pos)) {
        fprintf(stderr, "gemma4: %lu prompt tokens do not fit the %d positions left of the context (--ctx)\n",
                (unsigned long)n, g->s.cfg.max_context - g->s.pos);
        return 1;
    }
    for (i = 0; i < (int)n; i++) g4_sampler_accept(&g->smp, ids[i]);
    if (g4_forward(&g->s, ids, (int)n, g->logits, G4_LOGITS_LAST) != G4_OK) { fprintf(stderr, "gemma4: %s\n", g->s.error); return 1; }
    t1 = now_s();
    *t_prefill += t1 - t0;
    for (i = 0; i < max_tokens; i++) {
        int32_t next = g4_sampler_sample(&g->smp, g->logits);
        if (next < 0) { fprintf(stderr, "\ngemma4: %s\n", g->smp.error); g4_decode_free(&ds); return 1; }
        if (g4_chat_is_stop(&g->t, next)) break;
        if (print_id(&g->t, &ds, next)) { g4_decode_free(&ds); return 1; }
        g4_sampler_accept(&g->smp, next);
        (*n_new)++;
        if (i + 1 == max_tokens) break;
        if (g->s.pos >= g->s.cfg.max_context) { fprintf(stderr, "\ngemma4: context full (%d positions)\n", g->s.pos); break; }
        if (g4_forward(&g->s, &next, 1, g->logits, G4_LOGITS_LAST) != G4_OK) { fprintf(stderr, "\ngemma4: %s\n", g->s.error); g4_decode_free(&ds); return 1; }
    }
    print_end(&ds);
    *t_decode += now_s() - t1;
    return 0;
}

static void print_stats(int n_prompt, int n_new, double t_prefill, double t_decode) {
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

/* gemma4 generate MODEL_DIR --prompt "..." [--chat] [--system S] [--think] [sampling] */
static int cmd_generate(int argc, char **argv) {
    gen_opts o;
    gen_ctx g;
    int32_t *ids;
    size_t n;
    int n_new = 0, rc = 1;
    double tp = 0, td = 0;
    g4_tokenizer probe;
    g4_template tpl;
    int has_tpl = 0;
    if (parse_gen_opts(argc, argv, &o, 0)) return 1;
    if (o.system && !o.chat) { fprintf(stderr, "gemma4: --system needs --chat\n"); return 1; }
    /* the tokenizer first, to size the context to prompt + max_tokens */
    if (g4_tokenizer_load(&probe, o.tokenizer ? o.tokenizer : argv[2]) != G4_OK) {
        fprintf(stderr, "gemma4: %s%s\n", probe.error, o.tokenizer ? "" : " (give the tokenizer with --tokenizer PATH)");
        return 1;
    }
    if (o.chat && (has_tpl = load_template(&tpl, argv[2], &o, &probe)) < 0) { g4_tokenizer_free(&probe); return 1; }
    if (has_tpl) {
        char *users[1];
        users[0] = (char *)(uintptr_t)o.prompt;
        ids = template_prompt(&tpl, &probe, &o, users, 1, 1, &n);
        g4_template_free(&tpl);
    } else ids = encode_prompt(&probe, &o, o.prompt, 0, &n);
    g4_tokenizer_free(&probe);
    if (!ids) return 1;
    if (!gen_open(&g, argv[2], &o, (int)n + o.max_tokens + 1 + (o.drafter ? o.draft_tokens + 2 : 0))) {
        if (!o.seed_given && o.sc.temperature > 0) fprintf(stderr, "seed %llu\n", (unsigned long long)o.sc.seed);
        if (!gen_run(&g, ids, n, o.max_tokens, &n_new, &tp, &td)) {
            printf("\n");
            print_stats((int)n, n_new, tp, td);
            if (g.has_drafter) print_spec_stats(&g.dr.sp);
            rc = 0;
        }
    }
    free(ids);
    gen_free(&g);
    return rc;
}

/* gemma4 chat MODEL_DIR: one session for the whole conversation; each turn
   feeds only its own tokens, the earlier turns stay in the KV. */
static int cmd_chat(int argc, char **argv) {
    gen_opts o;
    gen_ctx g;
    char *line = NULL, **users = NULL;
    size_t line_cap = 0;
    int turn = 0, rc = 1, k;
    if (parse_gen_opts(argc, argv, &o, 1)) return 1;
    o.chat = 1;
    if (gen_open(&g, argv[2], &o, o.ctx ? o.ctx : 4096)) { gen_free(&g); return 1; }
    if ((g.has_tpl = load_template(&g.tpl, argv[2], &o, &g.t)) < 0) { g.has_tpl = 0; gen_free(&g); return 1; }
    fprintf(stderr, "chat layout: %s\n", g.has_tpl ? g.tpl.name : "the built-in Gemma 4 layout (no chat template)");
    if (!o.seed_given && o.sc.temperature > 0) fprintf(stderr, "seed %llu\n", (unsigned long long)o.sc.seed);
    fprintf(stderr, "%d positions of context; /reset starts over, /quit or end of input leaves\n", g.s.cfg.max_context);
    for (;;) {
        int32_t *ids;
        size_t n, l;
        int n_new = 0;
        double tp = 0, td = 0;
        fprintf(stderr, "> ");
        if (getline(&line, &line_cap, stdin) < 0) { rc = 0; break; }
        l = strlen(line);
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r')) line[--l] = 0;
        if (!l) continue;
        if (strcmp(line, "/quit") == 0) { rc = 0; break; }
        if (strcmp(line, "/reset") == 0) {
            g4_session_reset(&g.s);
            g4_sampler_reset(&g.smp);
            if (g.has_drafter && drafter_reattach(&g.dr, &g.s)) break;
            if (g.has_tpl) for (k = 0; k < turn; k++) free(users[k]); /* users is kept only with a template */
            turn = 0;
            continue;
        }
        if (g.has_tpl) { /* the template's text for this turn: everything, or what follows the last answer */
            char **nu = (char **)realloc(users, sizeof(char *) * (size_t)(turn + 1));
            if (!nu || !(nu[turn] = (char *)malloc(l + 1))) { users = nu ? nu : users; fprintf(stderr, "gemma4: out of memory\n"); break; }
            users = nu;
            memcpy(users[turn], line, l + 1);
            ids = template_prompt(&g.tpl, &g.t, &o, users, turn + 1, turn == 0, &n);
        } else ids = encode_prompt(&g.t, &o, line, turn ? G4_CHAT_CONTINUE : G4_CHAT_BOS, &n);
        if (!ids) { if (g.has_tpl) free(users[turn]); break; }
        if (n + 1 + (g.has_drafter ? (size_t)o.draft_tokens + 2 : 0) > (size_t)(g.s.cfg.max_context - g.s.pos)) {
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
                ids = template_prompt(&g.tpl, &g.t, &o, users, 1, 1, &n);
            } else ids = encode_prompt(&g.t, &o, line, G4_CHAT_BOS, &n);
            if (!ids) { if (g.has_tpl) free(users[0]); break; }
        }
        if (gen_run(&g, ids, n, o.max_tokens, &n_new, &tp, &td)) { free(ids); break; }
        printf("\n");
        print_stats((int)n, n_new, tp, td);
        if (g.has_drafter) print_spec_stats(&g.dr.sp);
        free(ids);
        turn++;
    }
    if (g.has_tpl) for (k = 0; k < turn; k++) free(users[k]);
    free(users);
    free(line);
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
    const char *msgs = NULL;
    int ids_out = 0, i, rc = 1;
    g4_template t;
    g4_tokenizer tok;
    g4_template_options o = g4_template_options_init();
    char *json = NULL, *text = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n = 0;
    FILE *f;
    for (i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--messages") == 0 && i + 1 < argc) msgs = argv[++i];
        else if (strcmp(argv[i], "--think") == 0) o.enable_thinking = 1;
        else if (strcmp(argv[i], "--no-generation-prompt") == 0) o.add_generation_prompt = 0;
        else if (strcmp(argv[i], "--ids") == 0) ids_out = 1;
        else return usage(argv[1]);
    }
    if (!msgs) return usage(argv[1]);
    if (g4_tokenizer_load(&tok, argv[2]) != G4_OK) { print_error(tok.error); return 1; }
    if (g4_template_load(&t, argv[2]) != G4_OK) { print_error(t.error); g4_tokenizer_free(&tok); return 1; }
    g4_template_set_tokens(&t, &tok);
    if (!(f = fopen(msgs, "rb"))) fprintf(stderr, "gemma4: %s: cannot open\n", msgs);
    else {
        json = read_all(f, &len);
        fclose(f);
        if (!json) fprintf(stderr, "gemma4: %s: cannot read\n", msgs);
    }
    if (json && !ids_out) {
        if (g4_template_render(&t, json, len, &o, &text, &n, NULL) != G4_OK) print_error(t.error);
        else if (fwrite(text, 1, n, stdout) == n) rc = 0;
    } else if (json) {
        if (g4_template_encode(&t, &tok, json, len, &o, &ids, &n, NULL) != G4_OK) print_error(t.error);
        else {
            for (i = 0; i < (int)n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
            printf("\n");
            rc = 0;
        }
    }
    g4_template_free_output(text);
    g4_template_free_output(ids);
    free(json);
    g4_template_free(&t);
    g4_tokenizer_free(&tok);
    return rc;
}

/* --------------------------------------------------- logits and greedy */

/* The options logits and greedy share: --ids, --chunk, and --out / --new. */
typedef struct {
    int32_t *ids;
    int n, chunk, n_new, draft_tokens, steps, bf16;
    const char *out_path, *drafter;
} run_opts;

static int parse_run_opts(int argc, char **argv, run_opts *o) {
    const char *ids_arg = NULL;
    int i, logits = strcmp(argv[1], "logits") == 0, draft = strcmp(argv[1], "draft") == 0, greedy = !logits && !draft;
    memset(o, 0, sizeof *o);
    o->n_new = -1;
    o->steps = -1;
    o->draft_tokens = 4;
    for (i = 3; i < argc; i++) {
        if (!draft && strcmp(argv[i], "--bf16") == 0) { o->bf16 = 1; continue; }
        if (i + 1 >= argc) return usage(argv[1]);
        if (strcmp(argv[i], "--ids") == 0) ids_arg = argv[++i];
        else if (!draft && strcmp(argv[i], "--chunk") == 0) o->chunk = g4b_int(argv[++i]);
        else if (!greedy && strcmp(argv[i], "--out") == 0) o->out_path = argv[++i];
        else if (greedy && strcmp(argv[i], "--new") == 0) o->n_new = g4b_int(argv[++i]);
        else if (!logits && strcmp(argv[i], "--drafter") == 0) o->drafter = argv[++i];
        else if (greedy && strcmp(argv[i], "--draft-tokens") == 0) o->draft_tokens = g4b_int(argv[++i]);
        else if (draft && strcmp(argv[i], "--steps") == 0) o->steps = g4b_int(argv[++i]);
        else return usage(argv[1]);
    }
    if (!ids_arg || (!greedy && !o->out_path) || (greedy && o->n_new < 0) || o->chunk < 0 || o->draft_tokens < 1 ||
        (draft && (!o->drafter || o->steps < 1)))
        return usage(argv[1]);
    return (o->n = parse_ids(ids_arg, &o->ids)) < 0;
}

/* gemma4 logits DIR --ids ... --out FILE: all logits [n][V] to FILE, argmax of each */
static int cmd_logits(int argc, char **argv) {
    run_opts o;
    g4_model m;
    g4_session s;
    float *logits = NULL;
    FILE *f;
    int i, V, rc = 1;
    if (parse_run_opts(argc, argv, &o)) return 1;
    if (open_session(argv[2], o.n, o.chunk, o.bf16, &m, &s)) { free(o.ids); return 1; }
    V = m.config.vocab_size;
    logits = (float *)malloc(sizeof(float) * (size_t)o.n * (size_t)V);
    if (!logits) { fprintf(stderr, "gemma4: out of memory for %d x %d logits\n", o.n, V); goto done; }
    if (g4_forward(&s, o.ids, o.n, logits, G4_LOGITS_ALL) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
    if (!(f = fopen(o.out_path, "wb"))) { fprintf(stderr, "gemma4: cannot write %s\n", o.out_path); goto done; }
    if (fwrite(logits, sizeof(float), (size_t)o.n * V, f) != (size_t)o.n * V) {
        fclose(f);
        fprintf(stderr, "gemma4: short write to %s\n", o.out_path);
        goto done;
    }
    fclose(f);
    printf("argmax:");
    for (i = 0; i < o.n; i++) printf(" %d", (int)g4_argmax(logits + (size_t)i * V, V));
    printf("\nwrote %d x %d float32 logits to %s\n", o.n, V, o.out_path);
    rc = 0;
done:
    return close_session(&m, &s, o.ids, logits, rc);
}

/* greedy with --drafter: the same tokens from speculative rounds, then the
   drafted, accepted and target-step counts on stderr */
static int greedy_spec(const char *dir, run_opts *o) {
    g4_model m;
    g4_session s;
    drafter_ctx x;
    int32_t *out = NULL;
    int i, got = 0, mm, rc = 1, chunk = o->chunk ? o->chunk : 64;
    if (chunk < o->draft_tokens + 2) chunk = o->draft_tokens + 2;
    if (open_session(dir, o->n + o->n_new + o->draft_tokens + 2, chunk, o->bf16, &m, &s)) { free(o->ids); return 1; }
    if (drafter_open(&x, o->drafter, &s, o->draft_tokens)) goto done;
    if (!(out = (int32_t *)malloc(sizeof(int32_t) * (size_t)(o->n_new + o->draft_tokens + 2)))) goto done;
    for (i = 0; i < o->n; i++) printf("%d ", (int)o->ids[i]);
    if (o->n_new > 0) {
        if (g4_spec_prefill(&x.sp, o->ids, o->n, NULL, &out[0]) != G4_OK) { fprintf(stderr, "gemma4: %s\n", x.sp.error); goto done; }
        for (got = 1; got < o->n_new; got += mm)
            if (g4_spec_round(&x.sp, NULL, out + got, &mm) != G4_OK) { fprintf(stderr, "gemma4: %s\n", x.sp.error); goto done; }
    } else if (g4_forward(&s, o->ids, o->n, NULL, G4_LOGITS_NONE) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", s.error);
        goto done;
    }
    for (i = 0; i < o->n_new; i++) printf("%d%s", (int)out[i], i + 1 < o->n_new ? " " : "");
    printf("\n");
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
    FILE *f = NULL;
    int32_t tok;
    int i, V, rc = 1;
    if (parse_run_opts(argc, argv, &o)) return 1;
    if (open_session(argv[2], o.n + 1, 0, 0, &m, &s)) { free(o.ids); return 1; }
    memset(&x, 0, sizeof x);
    if (drafter_open(&x, o.drafter, &s, 0)) goto done;
    V = m.config.vocab_size;
    logits = (float *)malloc(sizeof(float) * (size_t)o.steps * (size_t)V);
    h = (float *)malloc(sizeof(float) * (size_t)m.config.hidden_size);
    if (!logits || !h) { fprintf(stderr, "gemma4: out of memory for %d x %d logits\n", o.steps, V); goto done; }
    if (g4_forward_hidden(&s, o.ids, o.n, logits, G4_LOGITS_LAST, h) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
    tok = g4_argmax(logits, V);
    printf("target: %d\ndrafted:", (int)tok);
    for (i = 0; i < o.steps; i++) {
        float *row = logits + (size_t)i * V;
        if (g4_draft_step(&x.d, tok, h, row, h) != G4_OK) { fprintf(stderr, "\ngemma4: %s\n", x.d.error); goto done; }
        tok = g4_argmax(row, V);
        printf(" %d", (int)tok);
    }
    if (!(f = fopen(o.out_path, "wb"))) { fprintf(stderr, "\ngemma4: cannot write %s\n", o.out_path); goto done; }
    if (fwrite(logits, sizeof(float), (size_t)o.steps * V, f) != (size_t)o.steps * V) { fprintf(stderr, "\ngemma4: short write to %s\n", o.out_path); goto done; }
    printf("\nwrote %d x %d float32 logits to %s\n", o.steps, V, o.out_path);
    rc = 0;
done:
    if (f) fclose(f);
    free(h);
    drafter_free(&x);
    return close_session(&m, &s, o.ids, logits, rc);
}

/* gemma4 greedy DIR --ids ... --new N: the ids, then N greedily chosen ones */
static int cmd_greedy(int argc, char **argv) {
    run_opts o;
    g4_model m;
    g4_session s;
    float *logits = NULL;
    int i, V, rc = 1;
    if (parse_run_opts(argc, argv, &o)) return 1;
    if (o.drafter) return greedy_spec(argv[2], &o);
    if (open_session(argv[2], o.n + o.n_new, o.chunk, o.bf16, &m, &s)) { free(o.ids); return 1; }
    V = m.config.vocab_size;
    if (!(logits = (float *)malloc(sizeof(float) * (size_t)V))) { fprintf(stderr, "gemma4: out of memory\n"); goto done; }
    if (g4_forward(&s, o.ids, o.n, logits, G4_LOGITS_LAST) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
    for (i = 0; i < o.n; i++) printf("%d ", (int)o.ids[i]);
    for (i = 0; i < o.n_new; i++) {
        int32_t next = g4_argmax(logits, V);
        printf("%d%s", (int)next, i + 1 < o.n_new ? " " : "");
        fflush(stdout);
        if (i + 1 < o.n_new && g4_forward(&s, &next, 1, logits, G4_LOGITS_LAST) != G4_OK) {
            fprintf(stderr, "\ngemma4: %s\n", s.error);
            goto done;
        }
    }
    printf("\n");
    rc = 0;
done:
    return close_session(&m, &s, o.ids, logits, rc);
}

/* ------------------------------------------------------------ commands */

/* Every command: its name, its handler (argv[1] is the name, argv[2] the
   first argument) and its arguments for the usage text ('\n' continues them
   on an indented line in the full listing; a command's own usage error joins
   them into one line, as every error is one line). A new command is one row
   here. */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *args;
} commands[] = {
    {"info", cmd_info, "PATH [--train N]"},
    {"logits", cmd_logits, "DIR --ids 2,818,1010 --out FILE [--chunk N] [--bf16]"},
    {"greedy", cmd_greedy, "DIR --ids 2,818 --new N [--chunk N] [--bf16] [--drafter DRAFTER_DIR [--draft-tokens K]]"},
    {"draft", cmd_draft, "TARGET_DIR --drafter DRAFTER_DIR --ids 2,818 --steps K --out FILE"},
    {"compare", cmd_compare, "DIR DUMP.safetensors [--tolerance T] [--f32|--bf16] [--chunk N]"},
    {"grad", g4t_cmd_grad, "DIR --ids 2,818,... [--labels L,...] [--recompute] [--threads N] --out FILE"},
    {"bench", g4t_cmd_bench, "DIR [--threads N] [--prompt N] [--gen N] [--bf16 | --grad [--recompute]] "
                             "[--drafter DRAFTER_DIR [--draft-tokens K]]"},
    {"synth", g4b_cmd_synth, "--config CONFIG.json --out DIR [--dtype bf16|f32] [--layers N] [--vocab N]"},
    {"tokenize", cmd_tokenize, "TOKENIZER_JSON_OR_MODEL_DIR [TEXT]"},
    {"template", cmd_template, "DIR --messages FILE.json [--think] [--no-generation-prompt] [--ids]"},
    {"generate", cmd_generate, "DIR --prompt \"...\" [--chat] [--system S] [--think] [--temp T] [--top-k K]\n"
                               "[--top-p P] [--min-p P] [--repeat-penalty R] [--seed S] [--max-tokens N] [--ctx N]\n"
                               "[--tokenizer PATH] [--bf16] [--drafter DRAFTER_DIR [--draft-tokens K]]"},
    {"chat", cmd_chat, "DIR [--system S] [--think] [--bf16] [sampling and --drafter flags as generate]"},
    {"image", g4img_cmd_image, "DIR IMAGE.png|jpg --out FILE [--processor DIR]"},
};
#define N_COMMANDS ((int)(sizeof commands / sizeof commands[0]))

static int usage(const char *command) {
    int k, first = 1;
    for (k = 0; k < N_COMMANDS; k++) {
        const char *a = commands[k].args;
        if (command && strcmp(command, commands[k].name) != 0) continue;
        fprintf(stderr, "%s gemma4 %s ", first ? "usage:" : "      ", commands[k].name);
        for (; *a; a++) {
            if (*a != '\n') fputc(*a, stderr);
            else if (command) fputc(' ', stderr); /* one line */
            else fprintf(stderr, "\n              ");
        }
        fputc('\n', stderr);
        first = 0;
    }
    if (!command) fprintf(stderr, "logits, greedy, generate, chat, compare, grad, info and bench take --adapter DIR: a PEFT LoRA adapter\n"
                          "(with --bf16, --adapter-bf16 runs it as PEFT runs an adapter cast to bf16 itself)\n");
    return first && command ? usage(NULL) : 1;
}

int main(int argc, char **argv) {
    int k;
    if (argc < 3) return usage(NULL);
    for (k = 3; k < argc; k++) /* --adapter DIR: taken out of argv for the commands that load a model */
        if (strcmp(argv[k], "--adapter") == 0) {
            static const char *const takes[] = {"logits", "greedy", "generate", "chat", "compare", "grad", "info", "bench"};
            int j, ok = 0;
            for (j = 0; j < 8; j++) ok |= strcmp(argv[1], takes[j]) == 0;
            if (!ok || k + 1 >= argc || adapter_dir) {
                fprintf(stderr, "gemma4: --adapter DIR is an option of logits, greedy, generate, chat, compare, grad, "
                        "info and bench, given once\n");
                return 1;
            }
            adapter_dir = argv[k + 1];
            for (j = k; j + 2 < argc; j++) argv[j] = argv[j + 2];
            argc -= 2;
            k--;
        } else if (strcmp(argv[k], "--adapter-bf16") == 0) { /* (checked by the session: needs --adapter and bf16) */
            int j;
            adapter_bf16 = 1;
            for (j = k; j + 1 < argc; j++) argv[j] = argv[j + 1];
            argc -= 1;
            k--;
        }
    for (k = 0; k < N_COMMANDS; k++)
        if (strcmp(argv[1], commands[k].name) == 0) return commands[k].run(argc, argv);
    return usage(NULL);
}
