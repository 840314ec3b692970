/* train.h - the training commands of build/gemma4 (included by gemma4.c,
   after compare.h and bench.h).

   `grad DIR --ids 2,818,... [--labels ...] [--recompute] [--threads N] --out FILE`
   runs g4_loss_and_grad on one sequence and writes a safetensors file with
   `loss` (F32 [1]) and one F32 gradient per trained tensor, named and shaped as
   in the checkpoint (the tied lm_head's part is in embed_tokens). Without
   --labels the labels are the ids; -100 ignores a position.

   g4t_compare_grads is the gradient half of `compare`: for a dump written by
   tools/hf_dump.py --grad it runs the same loss and backward and prints the
   loss, then dL/d(tap output) tap by tap in backward order, then every
   parameter gradient in backward order (last layer first), each with the
   first one over tolerance. */
#ifndef G4_TRAIN_CLI_H
#define G4_TRAIN_CLI_H

/* "-100,818,5" -> labels (a '-' allowed); returns the count, or -1 with a message */
static int g4t_labels(const char *s, int32_t **out) {
    int n = 1, k = 0;
    const char *p;
    int32_t *v;
    for (p = s; *p; p++) n += *p == ',';
    if (!(v = (int32_t *)malloc(sizeof(int32_t) * (size_t)n))) return -1;
    for (p = s; k < n; k++) {
        long x = 0;
        int neg = *p == '-';
        const char *start;
        if (neg) p++;
        start = p;
        while (*p >= '0' && *p <= '9' && x <= 0x7fffffffL) x = x * 10 + (*p++ - '0');
        if (p == start || (*p && *p != ',') || x > 0x7fffffffL) {
            fprintf(stderr, "gemma4: --labels: '%s' is not a comma-separated list of integers\n", s);
            free(v);
            return -1;
        }
        v[k] = (int32_t)(neg ? -x : x);
        if (*p == ',') p++;
    }
    *out = v;
    return n;
}

/* loss + every gradient entry as a safetensors file; 0 on success */
static int g4t_write(const char *path, const g4_train *t, const float *G, float loss) {
    size_t cap = 256 + (size_t)t->n_grads * 256, len = 0, off = 4, pad;
    char *hdr = (char *)malloc(cap);
    FILE *f;
    uint64_t hl;
    int i, k, ok;
    if (!hdr) { fprintf(stderr, "gemma4: out of memory\n"); return 1; }
    len += (size_t)snprintf(hdr + len, cap - len, "{\"loss\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}");
    for (i = 0; i < t->n_grads; i++) {
        const g4_grad_entry *e = &t->grads[i];
        len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", e->name);
        for (k = 0; k < e->ndim; k++) len += (size_t)snprintf(hdr + len, cap - len, "%s%lld", k ? "," : "", (long long)e->shape[k]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%lu,%lu]}", (unsigned long)off,
                                (unsigned long)(off + 4 * e->count));
        off += 4 * e->count;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    for (pad = (8 - len % 8) % 8; pad; pad--) hdr[len++] = ' ';
    if (!(f = fopen(path, "wb"))) { fprintf(stderr, "gemma4: %s: cannot write (%s)\n", path, strerror(errno)); free(hdr); return 1; }
    hl = (uint64_t)len;
    ok = fwrite(&hl, 8, 1, f) == 1 && fwrite(hdr, 1, len, f) == len && fwrite(&loss, 4, 1, f) == 1;
    for (i = 0; ok && i < t->n_grads; i++) ok = fwrite(G + t->grads[i].offset, 4, t->grads[i].count, f) == t->grads[i].count;
    ok = fclose(f) == 0 && ok;
    free(hdr);
    if (!ok) { fprintf(stderr, "gemma4: %s: cannot write (%s)\n", path, strerror(errno)); return 1; }
    return 0;
}

/* A training state for `n` tokens (g4_train_size + one arena + the gradient block). */
typedef struct { g4_train t; void *arena; float *G; g4_pool *pool; } g4t_state;

/* On a terminal: which layer the forward and the backward of grad are at
   (the taps "layers.<i>", each layer's output and its gradient). */
typedef struct { int n_layers, backward; } g4t_progress;

static void g4t_progress_tap(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    const g4t_progress *p = (const g4t_progress *)user;
    char want[32];
    (void)data; (void)rows; (void)cols; (void)pos0;
    snprintf(want, sizeof want, "layers.%d", layer);
    if (layer >= 0 && strcmp(name, want) == 0)
        fprintf(stderr, "\rgrad: %s layer %d / %d   ", p->backward ? "backward" : "forward", p->backward ? p->n_layers - layer : layer + 1,
                p->n_layers);
}

/* the same tap in the backward (its names: dL/d(the tap)) */
static void g4t_progress_gtap(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    g4t_progress p = *(const g4t_progress *)user;
    p.backward = 1;
    g4t_progress_tap(&p, name, layer, data, rows, cols, pos0);
}

/* progress: NULL, or the forward and backward taps' user (a terminal's progress). */
static int g4t_open(g4t_state *st, const g4_model *m, int n, int recompute, g4t_progress *progress, g4_tap_fn gtap,
                    void *gtap_user) {
    g4_train_config cfg = g4_train_config_init();
    size_t bytes, floats;
    memset(st, 0, sizeof *st);
    if (get_pool(&st->pool)) return 1;
    cfg.max_seq = n;
    cfg.recompute = recompute;
    cfg.pool = st->pool;
    cfg.grad_tap = gtap;
    cfg.grad_tap_user = gtap_user;
    if (progress) {
        cfg.tap = g4t_progress_tap;
        cfg.tap_user = progress;
        cfg.grad_tap = g4t_progress_gtap;
        cfg.grad_tap_user = progress;
    }
    if (g4_train_size(m, &cfg, &bytes, &floats) != G4_OK) {
        fprintf(stderr, "gemma4: a training arena for %d tokens does not fit in memory\n", n);
        return 1;
    }
    st->arena = malloc(bytes);
    st->G = (float *)malloc(sizeof(float) * floats);
    if (!st->arena || !st->G) { fprintf(stderr, "gemma4: out of memory for a %lu-byte training arena\n", (unsigned long)bytes); return 1; }
    if (g4_train_init(&st->t, m, &cfg, st->arena, bytes) != G4_OK) { fprintf(stderr, "gemma4: %s\n", st->t.error); return 1; }
    return 0;
}

static void g4t_close(g4t_state *st) { /* (the pool is the CLI's) */
    free(st->arena);
    free(st->G);
}

/* gemma4 grad DIR --ids ... [--labels ...] [--recompute] [--threads N] --out FILE */
static int g4t_cmd_grad(int argc, char **argv) {
    const char *out = NULL, *ids_arg = NULL, *labels_arg = NULL, *pos[1];
    int32_t *ids = NULL, *labels = NULL;
    int n = 0, nl, recompute = 0, rc = 1, np;
    float loss;
    g4_model m;
    g4t_state st;
    g4t_progress progress;
    double t0;
    g4a_opt opts[] = {
        G4A_SR("--ids", &ids_arg, "2,818,...", "the token ids, one sequence (at least 2)"),
        G4A_S("--labels", &labels_arg, "L,...", "one label per id, -100 ignores a position (default: the ids)"),
        G4A_F("--recompute", &recompute, "keep only each layer's input; the gradients are the same bits"),
        G4A_SR("--out", &out, "FILE", "where the loss and the gradients go (safetensors, F32)"),
        OPT_THREADS,
        OPT_ADAPTER,
    };
    g4a_cmd cmd = {"grad", "DIR", 1, 1,
                   "The loss transformers' model(input_ids, labels=labels).loss computes and its gradient with\n"
                   "respect to every trained tensor (with --adapter: the adapter's), written to a safetensors file.",
                   opts, G4A_N_OPTS(opts)};
    if ((rc = g4a_parse(&cmd, argc, argv, 2, pos, &np)) != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    rc = 1;
    if ((n = parse_ids(ids_arg, &ids)) < 0) return 1;
    if (labels_arg) {
        if ((nl = g4t_labels(labels_arg, &labels)) < 0) { free(ids); return 1; }
        if (nl != n) {
            fprintf(stderr, "gemma4 grad: %d labels for %d ids\n", nl, n);
            free(ids); free(labels);
            return 1;
        }
    }
    if (n < 2) { fprintf(stderr, "gemma4 grad: needs at least 2 ids (the first label is never used)\n"); free(ids); free(labels); return 1; }
    if (load_model(&m, pos[0])) { free(ids); free(labels); return 1; } /* with --adapter: its gradients only */
    progress.n_layers = m.config.num_hidden_layers;
    progress.backward = 0;
    if (g4t_open(&st, &m, n, recompute, isatty(2) ? &progress : NULL, NULL, NULL)) goto done;
    t0 = g4b_now();
    if (g4_loss_and_grad(&st.t, ids, labels, n, &loss, st.G) != G4_OK) { fprintf(stderr, "gemma4: %s\n", st.t.error); goto done; }
    if (isatty(2)) fprintf(stderr, "\n");
    printf("loss %.7f over %d tokens; %d gradients (%lu floats) in %.3f s; saved activations %lu bytes%s\n", loss, n,
           st.t.n_grads, (unsigned long)st.t.grad_floats, g4b_now() - t0, (unsigned long)st.t.saved_bytes,
           recompute ? " (recompute)" : "");
    if (g4t_write(out, &st.t, st.G, loss)) goto done;
    printf("wrote loss and %d gradients to %s\n", st.t.n_grads, out);
    rc = 0;
done:
    g4t_close(&st);
    g4_model_free(&m);
    free(ids);
    free(labels);
    return rc;
}

/* the backward's tap, compared against "grad.<name>" in the dump */
static void g4t_grad_tap(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    char g[128];
    snprintf(g, sizeof g, "grad.%s", name);
    g4cmp_tap(user, g, layer, data, rows, cols, pos0);
}

/* The gradient half of `compare` (dumps with a `loss`): returns 0 when all is
   within tolerance, 2 when not, 1 on an error. */
static int g4t_compare_grads(const g4_model *m, const char *dump, const g4cmp *fwd, double tol) {
    g4cmp c;
    g4t_state st;
    const g4_tensor *lt, *lab;
    const int32_t *labels = NULL;
    float loss, ref_loss;
    int i, first, over = 0, rc = 1;
    const char *first_param = NULL;
    if (g4cmp_open(&c, dump) != G4_OK) { fprintf(stderr, "gemma4: %s\n", c.error); return 1; }
    lt = g4_model_tensor(&fwd->dump, "loss");
    lab = g4_model_tensor(&fwd->dump, "labels");
    if (!lt || lt->dtype != G4_F32 || lt->ndim != 1 || lt->shape[0] != 1) { fprintf(stderr, "gemma4: the dump's loss is not F32 [1]\n"); goto done; }
    ref_loss = g4__get(lt, 0);
    if (lab) {
        if (lab->dtype != G4_I32 || lab->ndim != 1 || lab->shape[0] != fwd->n_ids || ((uintptr_t)lab->data & 3)) {
            fprintf(stderr, "gemma4: the dump's labels are not I32 [%d]\n", fwd->n_ids);
            goto done;
        }
        labels = (const int32_t *)lab->data;
    }
    if (g4t_open(&st, m, fwd->n_ids, 0, NULL, g4t_grad_tap, &c)) { g4t_close(&st); goto done; }
    if (g4_loss_and_grad(&st.t, fwd->ids, labels, fwd->n_ids, &loss, st.G) != G4_OK) {
        fprintf(stderr, "gemma4: %s\n", st.t.error);
        g4t_close(&st);
        goto done;
    }
    printf("\nloss: gemma4.h %.7f, dump %.7f (rel %.3g)\n", loss, ref_loss, fabs(loss - ref_loss) / fmax(fabs(ref_loss), 1e-30));
    printf("activation gradients dL/d(tap), in backward order:\n");
    first = g4cmp_report(&c, tol, stdout);
    printf("parameter gradients, in backward order:\n%-56s %12s %12s\n", "tensor", "max abs", "max rel");
    for (i = st.t.n_grads - 1; i >= 0; i--) {
        const g4_grad_entry *e = &st.t.grads[i];
        char key[160];
        const g4_tensor *ref, *rows, *gs;
        double mx = 0, ra = 0, rel;
        size_t j;
        snprintf(key, sizeof key, "grad.%s", e->name);
        ref = g4_model_tensor(&fwd->dump, key);
        if (!ref) { /* the golden's int16 form (tools/make_grad_goldens.py): q * max|g| / 32767 */
            snprintf(key, sizeof key, "gradq.%s", e->name);
            ref = g4_model_tensor(&fwd->dump, key);
            snprintf(key, sizeof key, "gstat.%s", e->name);
            gs = g4_model_tensor(&fwd->dump, key);
            if (ref) {
                size_t count = 1;
                int k;
                double m;
                for (k = 0; k < ref->ndim; k++) count *= (size_t)ref->shape[k];
                if (ref->dtype != G4_I16 || count != e->count || !gs || gs->dtype != G4_F32 || gs->ndim != 1 ||
                    gs->shape[0] < 2 || !((m = g4__get(gs, 1)) > 0)) {
                    printf("%-56s %12s %12s  gradq differs in dump%s\n", e->name, "-", "-", first_param ? "" : "  <== first");
                    if (!first_param) first_param = e->name;
                    over++;
                    continue;
                }
                for (j = 0; j < e->count; j++) {
                    int16_t v;
                    double d;
                    memcpy(&v, (const unsigned char *)ref->data + 2 * j, 2);
                    d = fabs((double)st.G[e->offset + j] - v * (m / 32767.0));
                    if (!(d <= mx)) mx = d != d ? INFINITY : d; /* a NaN stays over */
                }
                rel = mx / m + 0.5 / 32767.0; /* the int16 rounding added: a bound on the float32 error */
                printf("%-56s %12.3g %12.3g%s\n", e->name, mx, rel,
                       !(rel <= tol) ? (first_param ? "  over" : "  <== first over tolerance") : "");
                if (!(rel <= tol)) { if (!first_param) first_param = e->name; over++; }
                continue;
            }
        }
        if (!ref) { printf("%-56s %12s %12s  (not in dump)\n", e->name, "-", "-"); continue; }
        snprintf(key, sizeof key, "grad_rows.%s", e->name);
        rows = g4_model_tensor(&fwd->dump, key); /* the golden's mostly-zero matrices: the nonzero rows only */
        if (ref->dtype != G4_F32 ||
            (rows ? rows->dtype != G4_I32 || rows->ndim != 1 || ((uintptr_t)rows->data & 3) || e->ndim != 2 ||
                        ref->ndim != 2 || ref->shape[0] != rows->shape[0] || ref->shape[1] != e->shape[1]
                  : (size_t)(ref->ndim == 1 ? ref->shape[0] : ref->ndim == 2 ? ref->shape[0] * ref->shape[1]
                                             : ref->shape[0] * ref->shape[1] * ref->shape[2]) != e->count)) {
            printf("%-56s %12s %12s  shape differs in dump%s\n", e->name, "-", "-", first_param ? "" : "  <== first");
            if (!first_param) first_param = e->name;
            over++;
            continue;
        }
        if (rows) { /* row r is stored at `at` when idx[at] == r, else it is exactly 0 */
            const int32_t *idx = (const int32_t *)rows->data;
            int64_t r, c, cols = e->shape[1], at = 0;
            for (r = 0; r < e->shape[0]; r++) {
                int have = at < rows->shape[0] && idx[at] == r;
                for (c = 0; c < cols; c++) {
                    double v = have ? g4__get(ref, (size_t)(at * cols + c)) : 0.0;
                    double d = fabs((double)st.G[e->offset + (size_t)(r * cols + c)] - v);
                    if (!(d <= mx)) mx = d != d ? INFINITY : d; /* a NaN stays over */
                    if (fabs(v) > ra) ra = fabs(v);
                }
                at += have;
            }
            if (at != rows->shape[0]) mx = INFINITY; /* indices not ascending, or out of range */
        } else
            for (j = 0; j < e->count; j++) {
                double r = g4__get(ref, j), d = fabs((double)st.G[e->offset + j] - r);
                if (!(d <= mx)) mx = d != d ? INFINITY : d; /* a NaN stays over */
                if (fabs(r) > ra) ra = fabs(r);
            }
        rel = ra > 0 ? mx / ra : mx;
        printf("%-56s %12.3g %12.3g%s\n", e->name, mx, rel,
               !(rel <= tol) ? (first_param ? "  over" : "  <== first over tolerance") : "");
        if (!(rel <= tol)) { if (!first_param) first_param = e->name; over++; }
    }
    printf("%d parameter gradients compared, %d over tolerance %g%s%s\n", st.t.n_grads, over, tol,
           first_param ? "; first: " : "", first_param ? first_param : "");
    rc = first >= 0 || over || !(fabs(loss - ref_loss) <= tol * fmax(fabs(ref_loss), 1.0)) ? 2 : 0;
    g4t_close(&st);
done:
    g4cmp_close(&c);
    return rc;
}

/* `info PATH --train N`: the training arena for N tokens, with and without
   recompute, from the config alone (no weights needed: the sizes depend on
   the shapes only). 0 on success. */
static int g4t_print_sizes(const g4_config *c, const g4_plan *p, int n) {
    g4_model *m = (g4_model *)calloc(1, sizeof(g4_model));
    size_t bytes[2], floats = 0, sess, saved[2];
    char err[G4_ERROR_MAX];
    int r, rc = 1;
    if (!m || !(m->w.layers = (g4_layer_weights *)calloc((size_t)c->num_hidden_layers, sizeof(g4_layer_weights)))) {
        fprintf(stderr, "gemma4: out of memory\n");
        free(m);
        return 1;
    }
    m->config = *c;
    m->plan = *p;
    snprintf(m->prefix, sizeof m->prefix, "model.");
    for (r = 0; r < 2; r++) {
        g4_train_config cfg = g4_train_config_init();
        cfg.max_seq = n;
        cfg.recompute = r;
        if (g4__train_sizes(m, &cfg, &bytes[r], &floats, &sess, &saved[r], err) != G4_OK) {
            fprintf(stderr, "gemma4: %s\n", err);
            goto done;
        }
    }
    printf("training, %d tokens: arena %.1f MB (saved activations %.1f MB); with recompute %.1f MB (saved %.1f MB, "
           "%.1f MB less); gradients %.1f MB (%lu floats)\n",
           n, bytes[0] / 1048576.0, saved[0] / 1048576.0, bytes[1] / 1048576.0, saved[1] / 1048576.0,
           (saved[0] - saved[1]) / 1048576.0, floats * 4.0 / 1048576.0, (unsigned long)floats);
    rc = 0;
done:
    free(m->w.layers);
    free(m);
    return rc;
}

/* gemma4 bench DIR --grad [--threads N] [--prompt N]: forward + backward of
   one N-token sequence (default 256), best of 3 after a warm-up; FLOPs counted
   as 6 per weight per token (2 forward, 4 backward; the backward's recomputed
   projections and attention's own FLOPs are not counted). Without --grad:
   g4b_bench (bench.h). */
static int g4t_cmd_bench(int argc, char **argv) {
    int i, grad = 0, seq, recompute = 0, rc = 1, np;
    int32_t *ids = NULL;
    double best = 1e30, best_cpu = 1e30, elems, t0, c0;
    float loss = 0;
    const char *pos[1];
    g4_model m;
    g4t_state st;
    g4b_opts o;
    g4a_opt opts[] = {
        OPT_THREADS,
        G4A_I("--prompt", &o.prompt, "N", 1, INT_MAX, "prompt tokens (default 64; with --grad the sequence, default 256)"),
        G4A_I("--gen", &o.gen, "N", 1, INT_MAX, "decoded tokens (default 16)"),
        G4A_F("--bf16", &o.bf16, "the bf16-faithful mode"),
        OPT_BF16_FAST,
        G4A_S("--drafter", &o.drafter, "DIR", "also a drafter's costs and speculative speed at forced acceptance"),
        G4A_I("--draft-tokens", &o.draft_tokens, "K", 1, 1024, "draft tokens per round (default 4)"),
        G4A_F("--grad", &grad, "training speed: forward + backward of one sequence"),
        G4A_F("--recompute", &recompute, "with --grad: activation checkpointing"),
        OPT_ADAPTER,
    };
    g4a_cmd cmd = {"bench", "DIR", 1, 1,
                   "Prefill and decode speed, best of 3 after a warm-up, per wall second and per CPU-second (a\n"
                   "benchmark, not a test); --grad: forward + backward speed.", opts, G4A_N_OPTS(opts)};
    memset(&o, 0, sizeof o);
    o.prompt = 64;
    o.gen = 16;
    o.draft_tokens = 4;
    if ((rc = g4a_parse(&cmd, argc, argv, 2, pos, &np)) != G4A_RESULT_OK) return rc == G4A_RESULT_HELP ? 0 : 1;
    rc = 1;
    if (!grad) {
        if (recompute) return g4a_fail(&cmd, "--recompute needs --grad");
        if (g4a_opt_of(&cmd, "--draft-tokens")->given && !o.drafter) return g4a_fail(&cmd, "--draft-tokens needs --drafter");
        return g4b_bench(pos[0], &o);
    }
    if (o.bf16 || o.drafter || g4a_opt_of(&cmd, "--gen")->given || g4a_opt_of(&cmd, "--draft-tokens")->given)
        return g4a_fail(&cmd, "--grad takes --threads, --prompt, --recompute and --adapter only");
    seq = g4a_opt_of(&cmd, "--prompt")->given ? o.prompt : 256;
    if (seq < 2) return g4a_fail(&cmd, "--prompt %d: must be an integer >= 2 with --grad", seq);
    if (load_model(&m, pos[0])) return 1;
    if (!(ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)seq))) { fprintf(stderr, "gemma4: out of memory\n"); goto done; }
    for (i = 0; i < seq; i++) ids[i] = (int32_t)((i * 7919 + 13) % m.config.vocab_size); /* as bench_torch_grad.py */
    ids[0] = 2 % m.config.vocab_size;
    if (g4t_open(&st, &m, seq, recompute, NULL, NULL, NULL)) goto done_st;
    for (i = 0; i < 4; i++) { /* a warm-up (page cache), then best of 3 */
        t0 = g4b_now();
        c0 = g4b_cpu();
        if (g4_loss_and_grad(&st.t, ids, NULL, seq, &loss, st.G) != G4_OK) { fprintf(stderr, "gemma4: %s\n", st.t.error); goto done_st; }
        if (i && g4b_now() - t0 < best) best = g4b_now() - t0;
        if (i && g4b_cpu() - c0 < best_cpu) best_cpu = g4b_cpu() - c0;
    }
    (void)g4b_bytes_per_token(&m, &elems);
    printf("model: %s, %d layers, %s kernels, %d threads%s\n", pos[0], m.config.num_hidden_layers, g4_simd_name(),
           n_threads, recompute ? ", recompute" : "");
    printf("grad: %.2f tok/s, %.1f GFLOP/s (forward + backward of %d tokens in %.2f s, best of 3; loss %.4f)\n",
           seq / best, 6.0 * elems * seq / best / 1e9, seq, best, loss);
    /* the same work per CPU-second of this process (all its threads, the
       pool's spinning included), as bench's prefill line: on a shared machine
       wall-clock time counts other processes' time slices too */
    printf("grad per CPU-second: %.1f GFLOP, %.2f tok (%.2f CPU-s, best of 3)\n", 6.0 * elems * seq / best_cpu / 1e9,
           seq / best_cpu, best_cpu);
    printf("memory: training arena %.1f MB (saved activations %.1f MB), gradients %.1f MB\n",
           (double)st.t.arena_bytes / 1048576.0, (double)st.t.saved_bytes / 1048576.0,
           (double)st.t.grad_floats * 4.0 / 1048576.0);
    rc = 0;
done_st:
    g4t_close(&st);
done:
    free(ids);
    g4_model_free(&m);
    return rc;
}

#endif /* G4_TRAIN_CLI_H */
