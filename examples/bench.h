/* bench.h - `gemma4 synth` (a random checkpoint of any real shape) and
   `gemma4 bench` (prefill and decode speed). Part of the CLI, not the library:
   include after gemma4.h with GEMMA4_IMPLEMENTATION. */
#ifndef G4_BENCH_H
#define G4_BENCH_H

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* The options of `bench` (parsed by g4t_cmd_bench in train.h, which runs --grad itself). */
typedef struct {
    int prompt, gen, bf16, draft_tokens;
    const char *drafter;
} g4b_opts;

static double g4b_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the process's CPU time, all threads: on a shared machine, time slices
   taken by other processes count in g4b_now() but not here */
static double g4b_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- synth */

typedef struct {
    FILE *f;
    g4_dtype dt;
    int pass;            /* 0: header entries, 1: data */
    uint64_t off;        /* data offset so far */
    size_t hlen, hcap;
    char *hdr;
    uint64_t rng;
    uint64_t written, total; /* pass 1: bytes written, of total (progress on a terminal) */
    int tty;
    char error[256];
} g4b_synth;

static void g4b_hdr(g4b_synth *y, const char *fmt, ...) G4__PRINTF(2, 3);
static void g4b_hdr(g4b_synth *y, const char *fmt, ...) {
    va_list ap;
    int n;
    if (y->hlen + 512 > y->hcap) {
        y->hcap = y->hcap * 2 + 4096;
        y->hdr = (char *)realloc(y->hdr, y->hcap);
    }
    va_start(ap, fmt);
    n = vsnprintf(y->hdr + y->hlen, y->hcap - y->hlen, fmt, ap);
    va_end(ap);
    y->hlen += (size_t)n;
}

static float g4b_rand(g4b_synth *y) { /* xorshift64*, uniform in [-1, 1) */
    y->rng ^= y->rng >> 12;
    y->rng ^= y->rng << 25;
    y->rng ^= y->rng >> 27;
    return (float)((y->rng * 2685821657736338717ull) >> 40) / 8388608.0f - 1.0f;
}

/* Visitor of g4__walk_weights: pass 0 lists the tensor in the header, pass 1
   writes random data. Norm weights and scalars near 1, matrices ~ 1/sqrt(in). */
static g4_result g4b_synth_tensor(g4_model *m, void *user, g4_tensor *dst, const char *name, int ndim,
                                  const int64_t *dims) {
    g4b_synth *y = (g4b_synth *)user;
    uint64_t numel = 1, i;
    size_t esz = g4__dtype_size(y->dt);
    int k, matrix = ndim >= 2;
    (void)m;
    (void)dst;
    for (k = 0; k < ndim; k++) numel *= (uint64_t)dims[k];
    if (y->pass == 0) {
        g4b_hdr(y, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", y->off ? "," : "", name, y->dt == G4_BF16 ? "BF16" : "F32");
        for (k = 0; k < ndim; k++) g4b_hdr(y, "%s%lld", k ? "," : "", (long long)dims[k]);
        g4b_hdr(y, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)y->off, (unsigned long long)(y->off + numel * esz));
        y->off += numel * esz;
        return G4_OK;
    }
    {
        float scale = matrix ? 1.0f / sqrtf((float)dims[ndim - 1]) : 0.1f, base = matrix ? 0.0f : 1.0f;
        unsigned char buf[1 << 16];
        size_t used = 0;
        for (i = 0; i < numel; i++) {
            float v = base + scale * g4b_rand(y);
            if (y->dt == G4_BF16) {
                uint32_t u;
                uint16_t h;
                memcpy(&u, &v, 4);
                h = (uint16_t)(u >> 16);
                memcpy(buf + used, &h, 2);
            } else {
                memcpy(buf + used, &v, 4);
            }
            used += esz;
            if (used + 4 > sizeof buf) {
                if (fwrite(buf, 1, used, y->f) != used) { snprintf(y->error, sizeof y->error, "%s", strerror(errno)); return G4_ERR_IO; }
                if (y->tty && (y->written / (64u << 20)) != ((y->written + used) / (64u << 20)))
                    fprintf(stderr, "\rsynth: %.2f / %.2f GB written (%.0f%%)", (double)(y->written + used) / 1e9,
                            (double)y->total / 1e9, 100.0 * (double)(y->written + used) / (double)y->total);
                y->written += used;
                used = 0;
            }
        }
        if (used && fwrite(buf, 1, used, y->f) != used) { snprintf(y->error, sizeof y->error, "%s", strerror(errno)); return G4_ERR_IO; }
        y->written += used;
    }
    return G4_OK;
}

/* a JSON float that Python reads back as a float (30 -> "30.0") */
static const char *g4b_f(char *buf, double v) {
    snprintf(buf, 32, "%.9g", v);
    if (!strpbrk(buf, ".en")) strcat(buf, ".0");
    return buf;
}

/* config.json in transformers' text-only form (gemma4_text + per_layer_config) */
static int g4b_write_config(const char *path, const g4_config *c) {
    FILE *f = fopen(path, "w");
    int i, first = 1;
    char b1[32], b2[32], b3[32];
    if (!f) return 0;
    if (c->assistant) /* Gemma4AssistantConfig: its own fields, the text model in text_config */
        fprintf(f, "{\n \"architectures\": [\"Gemma4AssistantForCausalLM\"],\n \"model_type\": \"gemma4_assistant\",\n"
                " \"backbone_hidden_size\": %d,\n \"use_ordered_embeddings\": %s,\n \"num_centroids\": %d,\n"
                " \"centroid_intermediate_top_k\": %d,\n \"tie_word_embeddings\": true,\n \"text_config\": {\n  \"model_type\": \"gemma4_text\",\n",
                c->backbone_hidden_size, c->use_ordered_embeddings ? "true" : "false", c->num_centroids,
                c->centroid_intermediate_top_k);
    else
        fprintf(f, "{\n  \"architectures\": [\"Gemma4ForCausalLM\"],\n  \"model_type\": \"gemma4_text\",\n");
    fprintf(f, "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n", c->vocab_size, c->hidden_size, c->intermediate_size);
    fprintf(f, "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n", c->num_hidden_layers,
            c->num_attention_heads, c->num_key_value_heads);
    fprintf(f, "  \"head_dim\": %d,\n  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %s,\n  \"sliding_window\": %d,\n",
            c->head_dim, c->max_position_embeddings, g4b_f(b1, c->rms_norm_eps), c->sliding_window);
    if (c->final_logit_softcapping > 0) fprintf(f, "  \"final_logit_softcapping\": %s,\n", g4b_f(b1, c->final_logit_softcapping));
    if (c->pad_token_id < 0) fprintf(f, "  \"pad_token_id\": null,\n");
    else fprintf(f, "  \"pad_token_id\": %d,\n", c->pad_token_id < c->vocab_size ? c->pad_token_id : 0);
    fprintf(f, "  \"tie_word_embeddings\": %s,\n  \"vocab_size_per_layer_input\": %d,\n  \"hidden_size_per_layer_input\": %d,\n",
            c->tie_word_embeddings ? "true" : "false", c->vocab_size_per_layer_input, c->hidden_size_per_layer_input);
    fprintf(f, "  \"attention_k_eq_v\": %s,\n  \"num_kv_shared_layers\": %d,\n  \"use_double_wide_mlp\": %s,\n",
            c->attention_k_eq_v ? "true" : "false", c->num_kv_shared_layers, c->use_double_wide_mlp ? "true" : "false");
    fprintf(f, "  \"enable_moe_block\": %s,\n", c->enable_moe_block ? "true" : "false");
    if (c->enable_moe_block)
        fprintf(f, "  \"num_experts\": %d,\n  \"top_k_experts\": %d,\n  \"moe_intermediate_size\": %d,\n", c->num_experts,
                c->top_k_experts, c->moe_intermediate_size);
    fprintf(f, "  \"rope_parameters\": {\n");
    for (i = 0; i < 2; i++) { /* the keys each rope_type reads (transformers warns about others); factor when not 1 */
        fprintf(f, "    \"%s\": {\"rope_type\": \"%s\", \"rope_theta\": %s", i ? "full_attention" : "sliding_attention",
                c->rope[i].proportional ? "proportional" : "default", g4b_f(b1, c->rope[i].theta));
        if (c->rope[i].proportional) fprintf(f, ", \"partial_rotary_factor\": %s", g4b_f(b2, c->rope[i].partial_rotary_factor));
        if (c->rope[i].proportional && c->rope[i].factor != 1.0f) fprintf(f, ", \"factor\": %s", g4b_f(b3, c->rope[i].factor));
        fprintf(f, "}%s\n", i ? "" : ",");
    }
    fprintf(f, "  },\n  \"layer_types\": [");
    for (i = 0; i < c->num_hidden_layers; i++)
        fprintf(f, "%s\"%s\"", i ? ", " : "", c->layer_types[i] == G4_FULL ? "full_attention" : "sliding_attention");
    fprintf(f, "],\n  \"per_layer_config\": {");
    for (i = 0; i < c->num_hidden_layers; i++) {
        if (c->layer_head_dim[i] == c->head_dim && c->layer_kv_heads[i] == c->num_key_value_heads) continue;
        fprintf(f, "%s\n    \"%d\": {\"head_dim\": %d, \"num_key_value_heads\": %d}", first ? "" : ",", i, c->layer_head_dim[i],
                c->layer_kv_heads[i]);
        first = 0;
    }
    fprintf(f, "\n  }\n}\n%s", c->assistant ? "}\n" : "");
    return fclose(f) == 0;
}

/* Keeps the first `layers` (<= num_hidden_layers) layers of c: their types with the last forced full (as
   Gemma4TextConfig forces it), every layer's head_dim and KV heads those of its type in the original
   (per_layer_config gives every full layer the same override), and about the same share of KV reader
   layers, fewer when a reader type would have no owner (transformers' kv_sharing_modes refuses that).
   The result passes the config's and the plan's checks whenever the original did. */
static void g4b_synth_layers(g4_config *c, int layers, g4_plan *scratch) {
    int L = c->num_hidden_layers, t, i, hd[2], kv[2];
    for (t = 0; t < 2; t++) { /* the original's per-type shape (the last layer is always full) */
        hd[t] = c->head_dim;
        kv[t] = c->num_key_value_heads;
        for (i = L - 1; i >= 0; i--)
            if (c->layer_types[i] == t) { hd[t] = c->layer_head_dim[i]; kv[t] = c->layer_kv_heads[i]; }
    }
    if (!c->assistant) c->num_kv_shared_layers = c->num_kv_shared_layers * layers / L;
    else c->num_kv_shared_layers = layers; /* a drafter shares every layer */
    c->num_hidden_layers = layers;
    c->layer_types[layers - 1] = G4_FULL;
    for (i = 0; i < layers; i++) {
        c->layer_head_dim[i] = hd[c->layer_types[i]];
        c->layer_kv_heads[i] = kv[c->layer_types[i]];
    }
    while (!c->assistant && c->num_kv_shared_layers > 0 && g4_plan_build(scratch, c) != G4_OK) c->num_kv_shared_layers--;
}

/* 1 when DIR exists and holds anything (names the first entry in *first) */
static int g4b_nonempty(const char *dir, char *first, size_t cap) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    if (!d) return 0;
    while (!found && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(first, cap, "%s", e->d_name);
            found = 1;
        }
    closedir(d);
    return found;
}

/* gemma4 synth --config CONFIG.json --out DIR [--dtype bf16|f32] [--layers N] [--vocab N] [--force] */
static int g4b_cmd_synth(int argc, char **argv) {
    const char *cfg_path = NULL, *out = NULL, *pos[1];
    int i, layers = 0, vocab = 0, dti = 0, dt, force = 0, np, rc; /* layers, vocab 0: keep the config's */
    g4_model m;
    g4b_synth y;
    char path[4096], first[256];
    struct stat st;
    g4_result r;
    g4a_opt opts[] = {
        G4A_SR("--config", &cfg_path, "CONFIG.json", "the config whose shape the checkpoint takes"),
        G4A_SR("--out", &out, "DIR", "the new model directory (config.json + model.safetensors); must be empty"),
        G4A_C("--dtype", &dti, "bf16|f32", "bf16|f32", "the weights' dtype (default bf16)"),
        G4A_I("--layers", &layers, "N", 1, INT_MAX, "keep the first N layers (the last one made full attention)"),
        G4A_I("--vocab", &vocab, "N", 1, INT_MAX, "a smaller vocabulary"),
        G4A_F("--force", &force, "write into a non-empty --out (a stale model.safetensors.index.json is removed)"),
    };
    g4a_cmd cmd = {"synth", "", 0, 0,
                   "Writes a random checkpoint of a config's shape (norm weights and scalars near 1, matrices ~\n"
                   "1/sqrt(in)), config.json in transformers' text-only form; on a terminal stderr shows progress.",
                   opts, G4A_N_OPTS(opts)};
    if ((rc = g4a_parse(&cmd, argc, argv, 2, pos, &np)) != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    dt = dti ? G4_F32 : G4_BF16;
    memset(&m, 0, sizeof m);
    if (g4_config_load(&m.config, cfg_path) != G4_OK) { print_error(m.config.error); return 1; }
    if (vocab > 0) {
        m.config.vocab_size = vocab;
        if (!m.config.assistant) m.config.vocab_size_per_layer_input = vocab;
    }
    if (layers > m.config.num_hidden_layers) {
        fprintf(stderr, "gemma4 synth: --layers %d is more than the config's %d layers\n", layers, m.config.num_hidden_layers);
        return 1;
    }
    if (layers > 0) g4b_synth_layers(&m.config, layers, &m.plan);
    if (g4_plan_build(&m.plan, &m.config) != G4_OK) { fprintf(stderr, "gemma4: %s\n", m.plan.error); return 1; }
    if (stat(out, &st) == 0 && !S_ISDIR(st.st_mode)) return g4a_fail(&cmd, "--out %s exists and is not a directory", out);
    if (g4b_nonempty(out, first, sizeof first)) {
        if (!force)
            return g4a_fail(&cmd, "--out %s is not empty (it holds %s); give --force to write into it", out, first);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
        if (remove(path) != 0 && errno != ENOENT) return g4a_fail(&cmd, "%s: cannot remove (%s)", path, strerror(errno));
    }
    strcpy(m.prefix, "model.");
    if (mkdir(out, 0755) != 0 && errno != EEXIST) { fprintf(stderr, "gemma4: %s: cannot create (%s)\n", out, strerror(errno)); return 1; }
    snprintf(path, sizeof path, "%s/config.json", out);
    if (!g4b_write_config(path, &m.config)) { fprintf(stderr, "gemma4: %s: cannot write (%s)\n", path, strerror(errno)); return 1; }
    /* the weights follow the config as it reads back, and one that does not (--vocab against the drafter's
       centroids, say) is an error here rather than a checkpoint that will not load */
    if (g4_config_load(&m.config, path) != G4_OK || g4_plan_build(&m.plan, &m.config) != G4_OK) {
        fprintf(stderr, "gemma4 synth: the config written to %s does not load: %s\n", path,
                m.config.error[0] ? m.config.error : m.plan.error);
        return 1;
    }
    memset(&y, 0, sizeof y);
    y.dt = (g4_dtype)dt;
    y.rng = 0x9E3779B97F4A7C15ull;
    g4b_hdr(&y, "{");
    if ((r = g4__walk_weights(&m, g4b_synth_tensor, &y)) != G4_OK) { fprintf(stderr, "gemma4: %s\n", m.error); return 1; }
    if (m.config.assistant && m.config.use_ordered_embeddings) { /* the identity permutation, I64 */
        g4b_hdr(&y, ",\"masked_embedding.token_ordering\":{\"dtype\":\"I64\",\"shape\":[%d],\"data_offsets\":[%llu,%llu]}",
                m.config.vocab_size, (unsigned long long)y.off, (unsigned long long)(y.off + 8ull * (uint64_t)m.config.vocab_size));
        y.off += 8ull * (uint64_t)m.config.vocab_size;
    }
    g4b_hdr(&y, "}");
    while (y.hlen % 8) g4b_hdr(&y, " ");
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (!(y.f = fopen(path, "wb"))) { fprintf(stderr, "gemma4: %s: cannot write (%s)\n", path, strerror(errno)); return 1; }
    {
        unsigned char len[8];
        uint64_t hl = y.hlen;
        for (i = 0; i < 8; i++) len[i] = (unsigned char)(hl >> (8 * i));
        fwrite(len, 1, 8, y.f);
        fwrite(y.hdr, 1, y.hlen, y.f);
    }
    y.pass = 1;
    y.total = y.off;
    y.tty = isatty(2);
    r = g4__walk_weights(&m, g4b_synth_tensor, &y);
    if (y.tty) fprintf(stderr, "\rsynth: %.2f / %.2f GB written (100%%)\n", (double)y.written / 1e9, (double)y.total / 1e9);
    if (r == G4_OK && m.config.assistant && m.config.use_ordered_embeddings)
        for (i = 0; i < m.config.vocab_size; i++) {
            int64_t v = i;
            if (fwrite(&v, 8, 1, y.f) != 1) r = G4_ERR_IO;
        }
    if (fclose(y.f) != 0 && r == G4_OK) { snprintf(y.error, sizeof y.error, "%s", strerror(errno)); r = G4_ERR_IO; }
    if (r != G4_OK) { fprintf(stderr, "gemma4: %s: cannot write (%s)\n", path, y.error[0] ? y.error : "write failed"); return 1; }
    printf("synth: %d layers, vocab %d, %.2f GB of %s weights in %s\n", m.config.num_hidden_layers, m.config.vocab_size,
           (double)y.off / 1e9, dt == G4_BF16 ? "bf16" : "f32", out);
    free(y.hdr);
    free(m.w.layers);
    return 0;
}

/* ---------------------------------------------------------------- bench */

#include "bench_bytes.h" /* g4b_bytes_per_token */

/* gemma4 bench DIR [--threads N] [--prompt N] [--gen N] [--bf16] */
static int drafter_reattach_for_bench(g4_session *d, const g4_model *dm, g4_session *s, void *arena) {
    size_t bytes;
    if (g4_drafter_size(dm, s, &bytes) != G4_OK || g4_drafter_init(d, dm, s, arena, bytes) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", d->error);
        return 1;
    }
    return 0;
}

/* forced acceptance: drafts the true greedy token for the first `right`
   drafts of every round and a wrong one after */
typedef struct { const int32_t *truth; int n_prompt, right, V; } g4b_oracle;
static int32_t g4b_propose(void *user, int pos, int i, int32_t drafted) {
    const g4b_oracle *o = (const g4b_oracle *)user;
    int32_t t = o->truth[pos - o->n_prompt];
    (void)drafted;
    return i < o->right ? t : (t + 1) % o->V;
}

/* bench --drafter: the verification chunk's cost against one decode step, a
   drafting step's, and tokens/s at forced acceptance 0, 50% and 100% (random
   weights make the real acceptance meaningless); dec: one decode step, s */
static int g4b_bench_drafter(g4_model *m, g4_session *s, const char *ddir, int k, const int32_t *ids, int prompt,
                             int gen, double dec) {
    g4_model dm;
    g4_session d;
    g4_spec sp;
    g4b_oracle o;
    void *darena = NULL, *work = NULL;
    float *logits = NULL, *h = NULL;
    int32_t *truth = NULL, *out = NULL;
    size_t bytes;
    int i, r, V = m->config.vocab_size, rc = 1, rate;
    double t0, best, verify, draft;
    if (g4_model_load(&dm, ddir) != G4_OK) { fprintf(stderr, "gemma4: drafter: %s\n", dm.error); return 1; }
    if (g4_drafter_size(&dm, s, &bytes) != G4_OK || !(darena = malloc(bytes)) || g4_drafter_init(&d, &dm, s, darena, bytes) != G4_OK ||
        g4_spec_size(m, k, &bytes) != G4_OK || !(work = malloc(bytes)) || g4_spec_init(&sp, s, &d, k, work, bytes) != G4_OK) {
        fprintf(stderr, "gemma4: drafter %s / --draft-tokens %d: cannot attach (%s%s)\n", ddir, k, d.error, sp.error);
        goto done;
    }
    logits = (float *)malloc(sizeof(float) * (size_t)V * (size_t)(k + 1));
    h = (float *)malloc(sizeof(float) * (size_t)m->config.hidden_size);
    truth = (int32_t *)malloc(sizeof(int32_t) * (size_t)(gen + k + 2));
    out = (int32_t *)malloc(sizeof(int32_t) * (size_t)(gen + k + 2));
    if (!logits || !h || !truth || !out) { fprintf(stderr, "gemma4: out of memory\n"); goto done; }
    /* the greedy continuation (untimed): the oracle's truth */
    g4_session_reset(s);
    if (g4_forward_hidden(s, ids, prompt, logits, G4_LOGITS_LAST, h) != G4_OK) goto fail;
    for (i = 0; i < gen + k + 1; i++) {
        truth[i] = g4_argmax(logits, V);
        if (g4_forward(s, &truth[i], 1, logits, G4_LOGITS_LAST) != G4_OK) goto fail;
    }
    /* a verification chunk of k + 1 tokens after the prompt, rewound each time; best of 3 */
    g4_session_reset(s);
    if (g4_forward_hidden(s, ids, prompt, logits, G4_LOGITS_LAST, h) != G4_OK) goto fail;
    for (r = 0, best = 1e30; r < 3; r++) {
        if (g4_session_rewind(s, prompt) != G4_OK) goto fail;
        t0 = g4b_now();
        if (g4_forward_hidden(s, truth, k + 1, logits, G4_LOGITS_ALL, NULL) != G4_OK) goto fail;
        t0 = g4b_now() - t0;
        if (t0 < best) best = t0;
    }
    verify = best;
    /* k drafting steps at position prompt; best of 3 */
    if (g4_session_rewind(s, prompt) != G4_OK || drafter_reattach_for_bench(&d, &dm, s, darena)) goto fail;
    for (r = 0, best = 1e30; r < 3; r++) {
        int32_t tok = truth[0];
        t0 = g4b_now();
        for (i = 0; i < k; i++) {
            if (g4_draft_step(&d, tok, h, logits, logits + V) != G4_OK) { fprintf(stderr, "gemma4: %s\n", d.error); goto done; }
            tok = g4_argmax(logits, V);
        }
        t0 = g4b_now() - t0;
        if (t0 < best) best = t0;
    }
    draft = best / k;
    printf("drafter: %s, %d layers, hidden %d; one drafting step %.2f ms = %.3f decode steps\n", ddir,
           dm.config.num_hidden_layers, dm.config.hidden_size, draft * 1e3, draft / dec);
    printf("verify: %d tokens (k %d + 1) in %.2f ms = %.2f decode steps (one decode step %.2f ms)\n", k + 1, k,
           verify * 1e3, verify / dec, dec * 1e3);
    printf("speculative (forced acceptance, %d tokens, best of 3):", gen);
    for (rate = 0; rate <= 2; rate++) { /* 0, 50%, 100% of the drafts accepted */
        o.truth = truth; o.n_prompt = prompt; o.right = rate * k / 2; o.V = V;
        sp.propose = g4b_propose;
        sp.propose_user = &o;
        for (r = 0, best = 1e30; r < 3; r++) {
            int got, mm;
            g4_session_reset(s);
            if (drafter_reattach_for_bench(&d, &dm, s, darena)) goto fail;
            if (g4_spec_prefill(&sp, ids, prompt, NULL, &out[0]) != G4_OK) { fprintf(stderr, "gemma4: %s\n", sp.error); goto done; }
            t0 = g4b_now();
            for (got = 1; got < gen; got += mm)
                if (g4_spec_round(&sp, NULL, out + got, &mm) != G4_OK) { fprintf(stderr, "gemma4: %s\n", sp.error); goto done; }
            t0 = g4b_now() - t0;
            if (t0 < best) best = t0;
            for (i = 0; i < gen; i++)
                if (out[i] != truth[i]) { fprintf(stderr, "gemma4: speculative output differs from greedy at %d\n", i); goto done; }
        }
        printf(" %d%%: %.2f tok/s (x%.2f)", 50 * rate, (gen - 1) / best, (gen - 1) / best * dec);
    }
    printf("\n");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "gemma4: %s\n", s->error);
done:
    free(logits); free(h); free(truth); free(out); free(work); free(darena);
    g4_model_free(&dm);
    return rc;
}

/* The GEMM's blocking (>>gemm: kc chosen by g4_session_init from the L2 size)
   and the cache sizes the library read (g4__cache_sizes: Linux sysfs, cpu0),
   printed beside the figures they explain */
static void g4b_print_blocking(const g4_session *s) {
    char sizes[160] = "";
    int used = 0;
    long l1d, l2, l3;
    g4__cache_sizes(&l1d, &l2, &l3);
    if (l1d) used += snprintf(sizes + used, sizeof sizes - (size_t)used, "L1d %ldK", l1d / 1024);
    if (l2) used += snprintf(sizes + used, sizeof sizes - (size_t)used, "%sL2 %ldK", used ? ", " : "", l2 / 1024);
    if (l3) used += snprintf(sizes + used, sizeof sizes - (size_t)used, "%sL3 %ldK", used ? ", " : "", l3 / 1024);
#if defined(G4__HAVE_GEMM) && G4__HAVE_GEMM
    printf("gemm: %s tile %d rows x %d tokens, blocks mc %d rows, kc %d (%s), nc %d tokens (a chunk in equal blocks of at most nc); "
           "per-thread buffer %.0f KB\n", g4_simd_name(), G4__TR, G4__TT, g4__gemm_blocks.mc, s->gemm_kc ? s->gemm_kc : g4__gemm_blocks.kc,
#ifdef G4__GEMM_KC_FIXED
           "G4_GEMM_KC",
#else
           G4__VL == 16 && l2 ? "from the L2 size" : "compiled",
#endif
           g4__gemm_blocks.nc, 4.0 * (double)G4__PACK_THREAD / 1024.0);
#if G4__BF16DOT
    if (s->cfg.bf16 && s->cfg.bf16_fast) /* the bf16 weights' matmuls run on this one */
        printf("gemm (bf16_fast): VDPBF16PS tile %d rows (one output a lane) x %d tokens, blocks mc %d rows, kc %d, nc %d tokens\n",
               16 * G4__PR, G4__PT, g4__bf16dot_blocks.mc, g4__bf16dot_blocks.kc, g4__bf16dot_blocks.nc);
#endif
#else
    (void)s;
    printf("gemm: none (%s kernels)\n", g4_simd_name());
#endif
    printf("caches (cpu0, as the library read them): %s\n", used ? sizes : "not reported");
}

/* the weights of the KV-reader layers (first_shared and after): a prefill with
   G4_LOGITS_LAST runs them on its last row only (g4__reader_rows_from);
   *bytes: their bytes */
static double g4b_reader_elems(const g4_model *m, double *bytes) {
    double e = 0, b = 0;
    int l, j, k, n = (int)(sizeof(g4_layer_weights) / sizeof(g4_tensor));
    for (l = m->plan.first_shared > 0 ? m->plan.first_shared : m->config.num_hidden_layers; l < m->config.num_hidden_layers; l++)
        for (j = 0; j < n; j++) {
            const g4_tensor *t = (const g4_tensor *)(const void *)&m->w.layers[l] + j;
            double cnt = 1;
            if (!t->data) continue;
            for (k = 0; k < t->ndim; k++) cnt *= (double)t->shape[k];
            if (m->config.enable_moe_block && (t == &m->w.layers[l].experts_gate_up || t == &m->w.layers[l].experts_down))
                cnt *= (double)m->config.top_k_experts / (double)m->config.num_experts;
            e += cnt;
            b += cnt * (double)g4__dtype_size(t->dtype);
        }
    *bytes = b;
    return e;
}

/* a prompt's attention FLOPs (q.k and p v: 2 each per query head, head_dim
   and query-key pair; causal, a sliding layer's window): *last those of the
   last row in the KV-reader layers, which run on it only; the rest returned */
static double g4b_attention_flops(const g4_model *m, int prompt, double *last) {
    int L = m->config.num_hidden_layers, first = m->plan.first_shared > 0 ? m->plan.first_shared : L, l, t;
    double rows = 0;
    *last = 0;
    for (l = 0; l < L; l++) {
        const g4_layer_plan *lp = &m->plan.layer[l];
        int window = lp->type == G4_SLIDING ? m->config.sliding_window : 0;
        double per_key = 4.0 * (double)m->config.num_attention_heads * (double)lp->head_dim;
        for (t = l < first ? 0 : prompt - 1; t < prompt; t++) {
            int keys = window && t + 1 > window ? window : t + 1;
            if (l < first) rows += per_key * keys;
            else *last += per_key * keys;
        }
    }
    return rows;
}

/* bench DIR (options in o; --threads and --adapter through the CLI's globals) */
static int g4b_bench(const char *dir, const g4b_opts *o) {
    int i, r, threads = n_threads, prompt = o->prompt, gen = o->gen, rc = 1;
    g4_model m;
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    g4_pool *pool = NULL;
    float *logits = NULL;
    int32_t *ids = NULL;
    double t0, t1, t2, c0, bpt, elems, head, head_bytes, rows_bytes, best, pre, dec, best_cpu, pre_cpu, dec_cpu, att, att_last, flops;
    struct rusage ru;
    const char *drafter = o->drafter;
    int draft_tokens = o->draft_tokens;
    sc.bf16 = o->bf16 || bf16_fast;
    sc.bf16_fast = bf16_fast; /* (--bf16-fast: examples/gemma4.c) */
    if (load_model(&m, dir)) return 1; /* (and --adapter's LoRA adapter) */
    memset(&s, 0, sizeof s);
    if (get_pool(&pool)) goto done;
    sc.max_context = prompt + gen + (drafter ? draft_tokens + 2 : 0);
    sc.max_chunk = drafter && prompt < draft_tokens + 2 ? draft_tokens + 2 : prompt;
    sc.pool = pool;
    if (!(logits = (float *)malloc(sizeof(float) * (size_t)m.config.vocab_size)) ||
        !(ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)prompt))) {
        fprintf(stderr, "gemma4: out of memory\n");
        goto done;
    }
    if (g4_session_create(&s, &m, &sc) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
    for (i = 0; i < prompt; i++) ids[i] = (int32_t)((i * 7919 + 13) % m.config.vocab_size);
    ids[0] = 2 % m.config.vocab_size;
    /* warm-up: fault the mapped weights in (a cold page cache would dominate), then start over */
    if (g4_forward(&s, ids, prompt < 4 ? prompt : 4, logits, G4_LOGITS_LAST) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
    /* prefill: best of 3 (the machines are shared); the last one stays for decode */
    for (i = 0, best = best_cpu = 1e30; i < 3; i++) {
        g4_session_reset(&s);
        t0 = g4b_now();
        c0 = g4b_cpu();
        if (g4_forward(&s, ids, prompt, logits, G4_LOGITS_LAST) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
        t1 = g4b_now();
        if (t1 - t0 < best) best = t1 - t0;
        if (g4b_cpu() - c0 < best_cpu) best_cpu = g4b_cpu() - c0;
    }
    pre = best;
    pre_cpu = best_cpu;
    /* decode: gen tokens after the prompt, best of 3 (the prompt re-run untimed) */
    for (r = 0, best = best_cpu = 1e30; r < 3; r++) {
        if (r > 0) {
            g4_session_reset(&s);
            if (g4_forward(&s, ids, prompt, logits, G4_LOGITS_LAST) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
        }
        t1 = g4b_now();
        c0 = g4b_cpu();
        for (i = 0; i < gen; i++) {
            int32_t next = g4_argmax(logits, m.config.vocab_size);
            if (g4_forward(&s, &next, 1, logits, G4_LOGITS_LAST) != G4_OK) { fprintf(stderr, "gemma4: %s\n", s.error); goto done; }
        }
        t2 = g4b_now();
        if (t2 - t1 < best) best = t2 - t1;
        if (g4b_cpu() - c0 < best_cpu) best_cpu = g4b_cpu() - c0;
    }
    dec = best;
    dec_cpu = best_cpu;
    bpt = g4b_bytes_per_token(&m, &elems);
    getrusage(RUSAGE_SELF, &ru);
    printf("model: %s, %d layers, %s kernels, %d threads%s\n", dir, m.config.num_hidden_layers, g4_simd_name(), threads,
           sc.bf16 ? ", bf16-faithful mode" : "");
    g4b_print_blocking(&s);
    /* prefill FLOPs: 2 per weight per token, except lm_head and the KV-reader
       layers, which only the last token runs (G4_LOGITS_LAST), and the
       attention's (g4b_attention_flops: on E2B's shape 0.4% of the matmuls'
       at 64 tokens, 3.3% at 512) */
    head = (double)m.w.lm_head.shape[0] * (double)m.w.lm_head.shape[1] + g4b_reader_elems(&m, &head_bytes);
    head_bytes += (double)m.w.lm_head.shape[0] * (double)m.w.lm_head.shape[1] * (double)g4__dtype_size(m.w.lm_head.dtype);
    att = g4b_attention_flops(&m, prompt, &att_last);
    flops = 2.0 * ((elems - head) * prompt + head) + att + att_last;
    printf("prefill: %.2f tok/s, %.1f GFLOP/s (%d tokens in %.2f s, best of 3)\n", prompt / pre, flops / pre / 1e9, prompt, pre);
    /* what bounds the prefill (bench/run.sh divides by the measured FMA peak and
       read bandwidth): the rows every token runs (their FLOPs; their weights read
       once, plus each token's embedding and PLE rows) and the last row's layers
       and lm_head, a matrix-vector product whose weights are read once */
    rows_bytes = (double)g4__dtype_size(m.w.embed_tokens.dtype) * (double)m.w.embed_tokens.shape[1]; /* a token's rows */
    if (m.w.embed_tokens_per_layer.data)
        rows_bytes += (double)g4__dtype_size(m.w.embed_tokens_per_layer.dtype) * (double)m.w.embed_tokens_per_layer.shape[1];
    rows_bytes = bpt - head_bytes + (double)(prompt - 1) * rows_bytes; /* (bpt holds one token's) */
    printf("prefill parts: every row %.0f FLOP on %.0f bytes of weights; the last row only %.0f bytes of weights (%.0f FLOP); "
           "attention %.0f FLOP of these\n", 2.0 * (elems - head) * prompt + att, rows_bytes, head_bytes, 2.0 * head + att_last,
           att + att_last);
    printf("decode: %.2f tok/s, %.2f GB/s (%.3f GB of weights per token, %d tokens in %.2f s, best of 3)\n", gen / dec,
           bpt * gen / dec / 1e9, bpt / 1e9, gen, dec);
    /* the same work per CPU-second of this process (all its threads, spinning
       included): what the kernels reach while they run, whatever else the
       machine runs meanwhile */
    printf("prefill per CPU-second: %.1f GFLOP (%.3f CPU-s, best of 3)\n", flops / pre_cpu / 1e9, pre_cpu);
    printf("decode per CPU-second: %.2f GB (%.2f CPU-s, best of 3)\n", bpt * gen / dec_cpu / 1e9, dec_cpu);
    printf("memory: peak RSS %.0f MB, arena %.1f MB\n", (double)ru.ru_maxrss / 1024.0, (double)s.arena_bytes / 1048576.0);
    if (drafter && g4b_bench_drafter(&m, &s, drafter, draft_tokens, ids, prompt, gen, dec / gen)) goto done;
    rc = 0;
done:
    free(ids);
    free(logits);
    g4_session_destroy(&s);
    g4_model_free(&m);
    return rc;
}

/* --------------------------------------------------------- bench-towers */
/* The towers' cost on random weights of a config's shapes, held in memory
   (no checkpoint written): each tensor the library's own walk names
   (g4__vision_walk, g4__audio_walk: the names and shapes g4_model_load
   binds) gets random bf16 values as synth makes them. A clipped linear's
   bounds stay infinite (its clamps still run). */
typedef struct { uint64_t rng; void **blocks; int n, cap; size_t bytes; } g4b_mem;

static g4_result g4b_mem_tensor(g4_model *m, void *user, g4_tensor *dst, const char *name, int ndim, const int64_t *dims) {
    g4b_mem *mm = (g4b_mem *)user;
    g4b_synth y;
    uint64_t numel = 1, i;
    uint16_t *data;
    int k, matrix = ndim >= 2;
    float scale, base;
    (void)name;
    for (k = 0; k < ndim; k++) numel *= (uint64_t)dims[k];
    if (mm->n == mm->cap) {
        void **nb = (void **)realloc(mm->blocks, sizeof(void *) * (size_t)(mm->cap ? 2 * mm->cap : 256));
        if (!nb) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
        mm->blocks = nb;
        mm->cap = mm->cap ? 2 * mm->cap : 256;
    }
    if (!(data = (uint16_t *)malloc(2 * (size_t)(numel ? numel : 1)))) { g4__seterr(m->error, "out of memory"); return G4_ERR_NOMEM; }
    mm->blocks[mm->n++] = data;
    mm->bytes += 2 * (size_t)numel;
    memset(&y, 0, sizeof y);
    y.rng = mm->rng;
    scale = matrix ? 1.0f / sqrtf((float)dims[ndim - 1]) : 0.1f;
    base = matrix ? 0.0f : 1.0f;
    for (i = 0; i < numel; i++) {
        float v = base + scale * g4b_rand(&y);
        uint32_t u;
        memcpy(&u, &v, 4);
        data[i] = (uint16_t)(u >> 16);
    }
    mm->rng = y.rng;
    memset(dst, 0, sizeof *dst);
    dst->data = data;
    dst->dtype = G4_BF16;
    dst->ndim = ndim;
    for (k = 0; k < ndim; k++) dst->shape[k] = dims[k];
    return G4_OK;
}

static void g4b_mem_free(g4b_mem *mm) {
    int i;
    for (i = 0; i < mm->n; i++) free(mm->blocks[i]);
    free(mm->blocks);
    memset(mm, 0, sizeof *mm);
}

/* one image of `patches` patches (a grid of w x h, multiples of the pooling
   kernel, padding after) through the vision tower (bf16: its bf16-faithful
   mode): ms, best of `reps` */
static int g4b_bench_vision(g4_model *m, g4_pool *pool, int patches, int reps, int bf16) {
    const g4_vision_config *v = &m->config.vision;
    int k = v->pooling_kernel_size, P = 3 * v->patch_size * v->patch_size, gw, gh, t, n_soft = 0, i, rc = 1;
    g4_vision_session_config vc;
    g4_vision_session vs;
    size_t bytes = 0;
    void *arena = NULL;
    float *pix = NULL, *soft = NULL;
    int32_t *pos = NULL;
    double best = 1e30, best_cpu = 1e30, t0, c0;
    g4b_synth y;
    /* the most square grid of k x k blocks holding `patches` (the processor's aspect-preserving size of a square image) */
    for (gw = (int)sqrt((double)(patches / (k * k))); gw > 1 && (patches / (k * k)) % gw; gw--) {}
    gh = patches / (k * k) / gw;
    gw *= k;
    gh *= k;
    memset(&vc, 0, sizeof vc);
    vc.max_patches = patches;
    vc.pool = pool;
    vc.bf16 = bf16;
    if (g4_vision_session_size(m, &vc, &bytes) != G4_OK || posix_memalign(&arena, 64, bytes) != 0 ||
        !(pix = (float *)malloc(sizeof(float) * (size_t)patches * (size_t)P)) ||
        !(pos = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)patches)) ||
        !(soft = (float *)malloc(sizeof(float) * (size_t)patches * (size_t)m->config.hidden_size))) {
        fprintf(stderr, "gemma4: out of memory for the vision tower's arena\n");
        goto done;
    }
    if (g4_vision_session_init(&vs, m, &vc, arena, bytes) != G4_OK) { fprintf(stderr, "gemma4: %s\n", vs.error); goto done; }
    memset(&y, 0, sizeof y);
    y.rng = 0x2545F4914F6CDD1Dull;
    for (i = 0; i < patches * P; i++) pix[i] = 0.5f + 0.5f * g4b_rand(&y);
    for (t = 0; t < patches; t++) {
        int real = t < gw * gh;
        pos[2 * t] = real ? t % gw : -1;
        pos[2 * t + 1] = real ? t / gw : -1;
    }
    for (i = 0; i < reps; i++) {
        t0 = g4b_now();
        c0 = g4b_cpu();
        if (g4_vision_encode(&vs, pix, pos, patches, soft, &n_soft) != G4_OK) { fprintf(stderr, "gemma4: %s\n", vs.error); goto done; }
        if (g4b_now() - t0 < best) best = g4b_now() - t0;
        if (g4b_cpu() - c0 < best_cpu) best_cpu = g4b_cpu() - c0;
    }
    printf("vision: %d layers, %d wide, %d heads of %d, MLP %d; %d patches (%d x %d) -> %d soft tokens: %.1f ms per image "
           "(%.1f CPU-ms; best of %d)\n", v->num_hidden_layers, v->hidden_size, v->num_attention_heads, v->head_dim,
           v->intermediate_size, patches, gw, gh, n_soft, 1e3 * best, 1e3 * best_cpu, reps);
    rc = 0;
done:
    free(arena); free(pix); free(pos); free(soft);
    return rc;
}

/* `seconds` of random log-mel features (100 frames a second, all valid) through the audio tower (bf16: its
   bf16-faithful mode) */
static int g4b_bench_audio(g4_model *m, g4_pool *pool, double seconds, int reps, int bf16) {
    const g4_audio_config *a = &m->config.audio;
    int nf = (int)(seconds * 100.0 + 0.5), F = a->subsampling_conv_channels[0], n_soft = 0, i, rc = 1;
    size_t bytes = 0;
    void *arena = NULL;
    float *feat = NULL, *soft = NULL;
    unsigned char *mask = NULL;
    double best = 1e30, best_cpu = 1e30, t0, c0;
    g4_audio_run run;
    g4b_synth y;
    if (nf < 1) nf = 1;
    if (g4_audio_size_pool(m, nf, pool, &bytes) != G4_OK || posix_memalign(&arena, 64, bytes) != 0 ||
        !(feat = (float *)malloc(sizeof(float) * (size_t)nf * (size_t)F)) || !(mask = (unsigned char *)malloc((size_t)nf)) ||
        !(soft = (float *)malloc(sizeof(float) * (size_t)g4_audio_tokens_max(nf) * (size_t)m->config.hidden_size))) {
        fprintf(stderr, "gemma4: out of memory for the audio tower's arena\n");
        goto done;
    }
    memset(&y, 0, sizeof y);
    y.rng = 0x2545F4914F6CDD1Dull;
    for (i = 0; i < nf * F; i++) feat[i] = 2.0f * g4b_rand(&y); /* log-mel values are of order 1 */
    memset(mask, 1, (size_t)nf);
    memset(&run, 0, sizeof run);
    run.pool = pool;
    run.bf16 = bf16;
    for (i = 0; i < reps; i++) {
        t0 = g4b_now();
        c0 = g4b_cpu();
        if (g4_audio_encode(m, feat, mask, nf, arena, bytes, &run, soft, &n_soft) != G4_OK) {
            fprintf(stderr, "gemma4: %s\n", run.error);
            goto done;
        }
        if (g4b_now() - t0 < best) best = g4b_now() - t0;
        if (g4b_cpu() - c0 < best_cpu) best_cpu = g4b_cpu() - c0;
    }
    printf("audio: %d layers, %d wide; %.1f s (%d frames -> %d soft tokens): %.1f ms per second of audio (%.1f CPU-ms; "
           "best of %d)\n", a->num_hidden_layers, a->hidden_size, (double)nf / 100.0, nf, n_soft, 1e3 * best * 100.0 / nf,
           1e3 * best_cpu * 100.0 / nf, reps);
    rc = 0;
done:
    free(arena); free(feat); free(mask); free(soft);
    return rc;
}

/* gemma4 bench-towers --config CONFIG.json [--threads N] [--patches N] [--seconds S] [--layers N] [--reps N] [--bf16] */
static int g4b_cmd_bench_towers(int argc, char **argv) {
    const char *cfg_path = NULL, *pos[1];
    int patches = 2520, layers = 0, reps = 1, bf16 = 0, np, rc;
    double seconds = 10.0;
    g4_model m;
    g4b_mem mem;
    g4_pool *pool = NULL;
    g4a_opt opts[] = {
        G4A_SR("--config", &cfg_path, "CONFIG.json", "a Gemma4Config (vision_config, audio_config) whose shapes the towers take"),
        OPT_THREADS,
        G4A_I("--patches", &patches, "N", 1, 1 << 20, "patches of the image, padding included (default 2520: 280 soft tokens)"),
        G4A_D("--seconds", &seconds, "S", 0.01, 30.0, 0, "seconds of audio (default 10)"),
        G4A_I("--layers", &layers, "N", 1, INT_MAX, "keep the first N layers of each tower"),
        G4A_I("--reps", &reps, "N", 1, 100, "runs of each, the best reported (default 1)"),
        G4A_F("--bf16", &bf16, "the towers in the bf16-faithful mode (as transformers in bfloat16)"),
    };
    g4a_cmd cmd = {"bench-towers", "", 0, 0,
                   "The vision and audio towers' speed on random bf16 weights of the config's shapes, held in\n"
                   "memory: ms per image and per second of audio (a benchmark, not a test).", opts, G4A_N_OPTS(opts)};
    if ((rc = g4a_parse(&cmd, argc, argv, 2, pos, &np)) != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    rc = 1;
    memset(&m, 0, sizeof m);
    memset(&mem, 0, sizeof mem);
    mem.rng = 0x9E3779B97F4A7C15ull;
    if (g4_config_load(&m.config, cfg_path) != G4_OK) { print_error(m.config.error); return 1; }
    if (get_pool(&pool)) return 1;
    if (layers > 0 && m.config.vision.present && layers < m.config.vision.num_hidden_layers) m.config.vision.num_hidden_layers = layers;
    if (layers > 0 && m.config.audio.present && layers < m.config.audio.num_hidden_layers) m.config.audio.num_hidden_layers = layers;
    printf("towers: %s, %s kernels, %d threads%s\n", cfg_path, g4_simd_name(), n_threads, bf16 ? ", bf16-faithful mode" : "");
    if (m.config.vision.present) {
        if (patches % (m.config.vision.pooling_kernel_size * m.config.vision.pooling_kernel_size))
            return g4a_fail(&cmd, "--patches %d: must be a multiple of pooling_kernel_size^2 (%d)", patches,
                            m.config.vision.pooling_kernel_size * m.config.vision.pooling_kernel_size);
        if (g4__vision_walk(&m, g4b_mem_tensor, &mem) != G4_OK || !m.vision.loaded) { fprintf(stderr, "gemma4: %s\n", m.error); goto done; }
        if (g4b_bench_vision(&m, pool, patches, reps, bf16)) goto done;
    } else printf("vision: the config has no vision_config\n");
    if (m.config.audio.present) {
        if (g4__audio_walk(&m, g4b_mem_tensor, &mem) != G4_OK || !m.audio.loaded) {
            fprintf(stderr, "gemma4: %s\n", m.audio.error);
            goto done;
        }
        if (g4b_bench_audio(&m, pool, seconds, reps, bf16)) goto done;
    } else printf("audio: the config has no audio_config\n");
    rc = 0;
done:
    free(m.vision.layers);
    free(m.audio.layers);
    g4b_mem_free(&mem);
    return rc;
}

#endif /* G4_BENCH_H */
