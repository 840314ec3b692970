/* invariants.h - the tests every forward-pass backend must pass, written once.
   tests/test_gemma4.c runs them on gemma4.h's CPU forward (g4i_cpu below),
   tests/test_cuda.c on gemma4_cuda.cu's (on a GPU or in the emulator). A
   backend is a g4i_backend: its form of a loaded model, and open / forward /
   reset / close of a session on it.

   The shared-KV invariants (README, *The arena and the shared-KV table*), and
   where each is tested:
     1. The plan is data, computed once from the config: every layer's type,
        head dim, KV heads, and for a reader the owner it reads; a reader with
        no owner of its type is rejected, naming the layer.
                                               test_gemma4.c: plan, config tests
     2. One arena, the caller's: K/V storage for owner layers only.   g4i_table
     3. The table, not a pointer copy: one slot per owner, which layer writes
        it, where its K/V live, how many positions it holds; a reader holds a
        slot index.                                                    g4i_table
     4. One code path: chunked prefill and token-by-token decode give the bits
        of one prefill.                                   g4i_chunking, g4i_greedy
     5. Write once, then read: within a step an owner appends its rows before a
        reader runs, and every slot then holds exactly the positions consumed.
                                         g4i_table; test_cuda.c: the table checks
     6. Positions come from the step, not from a slot's counter: interleaved
        sessions on one model stay independent.                     g4i_sessions
     7. A sliding owner keeps window - 1 + chunk rows.                 g4i_table
     8. Reader K/V weights are optional and never read: NaN ones change no bit.
                                                             g4i_stale_reader_kv
     9. The plan can be printed.             test_gemma4.c: plan print format
   Besides: logits and layer outputs equal transformers' (g4i_golden), greedy
   decode equals generate (g4i_greedy), the debug table with a copy per reader
   equals the owners-only one (g4i_reader_copies), bad forward input is an
   error that changes nothing (g4i_forward_errors).

   Tolerances: against transformers, max |ours - ref| <= G4I_TOL * max |ref|
   per tensor (why 2e-5: tests/test_gemma4.c's top comment); between runs of
   one backend (chunking, decode, sessions, reader copies, stale weights):
   exact, since every kernel is row-wise and a position computes the same bits
   whatever the chunk. Include after gemma4.h, harness.h and fixtures.h. */
#ifndef G4_TEST_INVARIANTS_H
#define G4_TEST_INVARIANTS_H

#define G4I_TOL 2e-5

/* Sized runs (tests/test_cuda.c under compute-sanitizer: G4_CUDA_SUITE=sized):
   the models that take every kernel and shape (e2b_like: PLE, KV sharing,
   sliding and full layers; 26b_like: MoE; 31b_like: k_eq_v), fewer of the
   rest. 0: everything. */
H_UNUSED static int g4i_sized;

typedef struct {
    void *impl;               /* the backend's session and arenas */
    /* views into the session, set by open */
    g4_session_config *cfg;   /* taps and bf16 may be changed between calls */
    const int *pos;
    const char *error;
    g4_kv_slot *slots;        /* the host's table */
    int n_slots;
    int *layer_slot;
    size_t bytes;             /* its arena (on CUDA: the device arena) */
} g4i_session;

typedef struct {
    const char *name;   /* "cpu", "cuda", ... in messages */
    int variant;        /* the backend's own setting (CUDA: the matmul kind) */
    /* the backend's form of a loaded model (CPU: the model; CUDA: uploaded);
       NULL after printing why */
    void *(*model_open)(const g4_model *m);
    void (*model_close)(void *bm);
    /* a session on bm; 0 after printing why (close it all the same); variant:
       the backend's, or'ed with G4I_READER_COPIES for the debug layout */
    int (*open)(g4i_session *s, void *bm, const g4_session_config *cfg, int variant);
    g4_result (*forward)(g4i_session *s, const int32_t *ids, int n, float *logits, int mode);
    g4_result (*reset)(g4i_session *s);
    void (*close)(g4i_session *s);
    /* optional: copies the table the kernels read (CUDA: the device's) */
    g4_result (*read_table)(g4i_session *s, g4_kv_slot *out, int max);
} g4i_backend;

/* open's variant bit: the debug layout in which every reader layer gets its
   own K/V copy (reader_copies: not in the public config; the CPU's
   g4__session_create, CUDA's g4__cuda_session_init_testing) */
#define G4I_READER_COPIES 0x10000

/* ------------------------------------------------------------ the CPU */

H_UNUSED static void *g4i_cpu_model_open(const g4_model *m) { return (void *)(uintptr_t)m; }
H_UNUSED static void g4i_cpu_model_close(void *bm) { (void)bm; }

H_UNUSED static int g4i_cpu_open(g4i_session *s, void *bm, const g4_session_config *cfg, int variant) {
    g4_session *ss = (g4_session *)calloc(1, sizeof *ss);
    memset(s, 0, sizeof *s);
    if (!(s->impl = ss)) return 0;
    s->error = ss->error;
    if (g4__session_create(ss, (const g4_model *)bm, cfg, (variant & G4I_READER_COPIES) != 0) != G4_OK) {
        printf("  session: %s\n", ss->error);
        return 0;
    }
    s->cfg = &ss->cfg;
    s->pos = &ss->pos;
    s->slots = ss->slots;
    s->n_slots = ss->n_slots;
    s->layer_slot = ss->layer_slot;
    s->bytes = ss->arena_bytes;
    return 1;
}

H_UNUSED static g4_result g4i_cpu_forward(g4i_session *s, const int32_t *ids, int n, float *logits, int mode) {
    return g4_forward((g4_session *)s->impl, ids, n, logits, mode);
}

H_UNUSED static g4_result g4i_cpu_reset(g4i_session *s) {
    g4_session_reset((g4_session *)s->impl);
    return G4_OK;
}

H_UNUSED static void g4i_cpu_close(g4i_session *s) {
    g4_session_destroy((g4_session *)s->impl);
    free(s->impl);
    s->impl = NULL;
}

H_UNUSED static const g4i_backend g4i_cpu = {"cpu", 0, g4i_cpu_model_open, g4i_cpu_model_close, g4i_cpu_open,
                                             g4i_cpu_forward, g4i_cpu_reset, g4i_cpu_close, NULL};

/* --------------------------------------------------------------- runs */

/* A loaded model, the backend's form of it and one session. */
typedef struct {
    const g4i_backend *b;
    g4_model m;
    void *bm;
    g4i_session s;
} g4i_run;

/* 0 after printing why; g4i_close either way. */
H_UNUSED static int g4i_open(g4i_run *r, const g4i_backend *b, const char *dir, int max_context, int chunk,
                             int reader_copies) {
    g4_session_config sc = g4_session_config_init();
    memset(r, 0, sizeof *r);
    r->b = b;
    r->s.error = r->m.error; /* until a session opens: the load's message, so a failed open's r->s.error is a string */
    if (g4_model_load(&r->m, dir) != G4_OK) { printf("  load %s: %s\n", dir, r->m.error); return 0; }
    if (!(r->bm = b->model_open(&r->m))) return 0;
    sc.max_context = max_context;
    sc.max_chunk = chunk;
    return b->open(&r->s, r->bm, &sc, b->variant | (reader_copies ? G4I_READER_COPIES : 0));
}

H_UNUSED static void g4i_close(g4i_run *r) {
    if (r->s.impl) r->b->close(&r->s);
    if (r->bm) r->b->model_close(r->bm);
    g4_model_free(&r->m);
    memset(r, 0, sizeof *r);
}

/* All logits [n][V] of ids through a fresh session, `step` tokens per forward
   call (0: all at once); NULL after printing why. */
H_UNUSED static float *g4i_logits(const g4i_backend *b, const char *dir, const int32_t *ids, int n, int chunk, int step,
                                  int reader_copies) {
    g4i_run r;
    float *out = NULL;
    int done, k;
    if (g4i_open(&r, b, dir, n, chunk, reader_copies)) {
        out = (float *)malloc(sizeof(float) * (size_t)n * r.m.config.vocab_size);
        for (done = 0; out && done < n; done += k) {
            k = step ? (n - done < step ? n - done : step) : n;
            if (b->forward(&r.s, ids + done, k, out + (size_t)done * r.m.config.vocab_size, G4_LOGITS_ALL) != G4_OK) {
                printf("  %s forward: %s\n", b->name, r.s.error);
                free(out);
                out = NULL;
            }
        }
    }
    g4i_close(&r);
    return out;
}

/* The golden's input_ids (NULL, a failed check, and nothing to free when it
   has none); g4_model_free(&g->m) when done. */
H_UNUSED static const int32_t *g4i_input_ids(golden *g, const char *model, int *n) {
    const int32_t *ids;
    if (!golden_open(g, model)) { CHECK(0, "no golden for %s", model); return NULL; }
    if (!(ids = golden_ids(g, "input_ids", n))) {
        CHECK(0, "%s: golden lacks input_ids", model);
        g4_model_free(&g->m);
    }
    return ids;
}

/* The vocabulary and window of a model directory's config. */
H_UNUSED static g4_config g4i_config(const char *model) {
    g4_config c;
    if (g4_config_load(&c, path2(tiny(model), "config.json")) != G4_OK) printf("  %s\n", c.error);
    return c;
}

/* ------------------------------------------------------------- taps */

/* every tap of a run, in order (grown as needed) */
typedef struct {
    int n, cap;
    char (*name)[96];
    float **data;
    size_t *cnt;
} g4i_taps;

H_UNUSED static void g4i_record_tap(void *user, const char *name, int layer, const float *data, int rows, int cols,
                                    int pos0) {
    g4i_taps *r = (g4i_taps *)user;
    size_t cnt = (size_t)rows * cols;
    (void)layer;
    (void)pos0;
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->name = (char(*)[96])realloc(r->name, sizeof *r->name * (size_t)r->cap);
        r->data = (float **)realloc(r->data, sizeof *r->data * (size_t)r->cap);
        r->cnt = (size_t *)realloc(r->cnt, sizeof *r->cnt * (size_t)r->cap);
    }
    snprintf(r->name[r->n], sizeof r->name[0], "%s", name);
    r->data[r->n] = (float *)malloc(sizeof(float) * cnt);
    memcpy(r->data[r->n], data, sizeof(float) * cnt);
    r->cnt[r->n++] = cnt;
}

H_UNUSED static void g4i_taps_free(g4i_taps *r) {
    int i;
    for (i = 0; i < r->n; i++) free(r->data[i]);
    free(r->name);
    free(r->data);
    free(r->cnt);
    memset(r, 0, sizeof *r);
}

/* A tap callback comparing each tap with transformers' golden (the layer
   outputs, embed_tokens, per_layer_inputs, the final norm; G4I_TOL) and, when
   ref is set, with the same tap of a reference run (ref_tol). */
typedef struct {
    golden *g;            /* NULL: no transformers comparison */
    const g4i_taps *ref;  /* NULL: no reference run */
    double ref_tol;       /* each tap against the reference run's, relative to its max */
    int fails, seen, seen_ref, taps; /* seen_ref: taps the reference run also had */
    double worst, worst_ref;         /* relative */
} g4i_tap_check;

H_UNUSED static void g4i_compare_tap(void *user, const char *name, int layer, const float *data, int rows, int cols,
                                     int pos0) {
    g4i_tap_check *tc = (g4i_tap_check *)user;
    size_t cnt = (size_t)rows * cols, off = (size_t)pos0 * cols;
    char key[64];
    int64_t numel;
    const float *want;
    int i;
    (void)layer;
    tc->taps++;
    for (i = 0; tc->ref && i < tc->ref->n; i++)
        if (strcmp(tc->ref->name[i], name) == 0) {
            double d = tc->ref->cnt[i] == cnt ? max_diff(data, tc->ref->data[i], cnt) : INFINITY;
            double rel = d / max_abs(tc->ref->data[i], cnt);
            if (!(rel <= tc->ref_tol)) {
                printf("  %s: max diff %.3g (%.3g relative) from the reference run\n", name, d, rel);
                tc->fails++;
            }
            if (rel > tc->worst_ref) tc->worst_ref = rel;
            tc->seen_ref++;
            break;
        }
    if (!tc->g) return;
    if (strncmp(name, "layers.", 7) == 0 && !strchr(name + 7, '.')) snprintf(key, sizeof key, "layer.%s", name + 7);
    else if (strcmp(name, "embed_tokens") == 0) snprintf(key, sizeof key, "embed");
    else if (strcmp(name, "per_layer_inputs") == 0) snprintf(key, sizeof key, "%s", name);
    else if (strcmp(name, "norm") == 0) snprintf(key, sizeof key, "final_norm");
    else return;
    if (!(want = golden_f32(tc->g, key, &numel))) { printf("  golden has no '%s'\n", key); tc->fails++; return; }
    {
        double d = off + cnt <= (size_t)numel ? max_diff(data, want + off, cnt) : INFINITY;
        double rel = d / max_abs(want, (size_t)numel);
        if (!(rel <= G4I_TOL)) {
            printf("  %s: max diff %.3g (%.3g relative) from transformers\n", key, d, rel);
            tc->fails++;
        }
        if (rel > tc->worst) tc->worst = rel;
        tc->seen++;
    }
}

/* ------------------------------------------------------- the invariants */

/* The worst relative differences a suite reports at its end. */
typedef struct { double golden, ref, ref_taps; } g4i_worst; /* ref: logits; ref_taps: every tap */

/* Goldens, layer by layer: the logits and every layer output of `model`
   within G4I_TOL of transformers'. With ref (another backend, e.g. the CPU
   for CUDA): the logits within ref_tol of ref's run, every tap within
   ref_tap_tol (g4i_golden_tol; g4i_golden uses ref_tol for both), and the
   same set of taps. */
H_UNUSED static void g4i_golden_tol(const g4i_backend *b, const char *model, const g4i_backend *ref, double ref_tol,
                                    double ref_tap_tol, g4i_worst *worst) {
    golden g;
    g4i_run r;
    g4i_taps rec;
    g4i_tap_check tc;
    int n, V;
    int64_t numel = 0;
    const int32_t *ids;
    const float *want;
    float *out = NULL, *ref_out = NULL;
    memset(&r, 0, sizeof r);
    if (!(ids = g4i_input_ids(&g, model, &n))) return;
    want = golden_f32(&g, "logits", &numel);
    CHECK(want != NULL, "golden lacks logits");
    memset(&rec, 0, sizeof rec);
    memset(&tc, 0, sizeof tc);
    tc.g = &g;
    if (ref) { /* the reference run, every tap recorded */
        if (g4i_open(&r, ref, tiny(model), n, 0, 0)) {
            r.s.cfg->tap = g4i_record_tap;
            r.s.cfg->tap_user = &rec;
            ref_out = (float *)malloc(sizeof(float) * (size_t)n * r.m.config.vocab_size);
            CHECK(ref->forward(&r.s, ids, n, ref_out, G4_LOGITS_ALL) == G4_OK, "%s forward: %s", ref->name, r.s.error);
        }
        g4i_close(&r);
        CHECK(ref_out != NULL, "%s run", ref->name);
        tc.ref = &rec;
        tc.ref_tol = ref_tap_tol;
    }
    if (want && (!ref || ref_out) && g4i_open(&r, b, tiny(model), n, 0, 0)) {
        double d, scale;
        V = r.m.config.vocab_size;
        CHECK(numel == (int64_t)n * V, "golden logits shape");
        r.s.cfg->tap = g4i_compare_tap;
        r.s.cfg->tap_user = &tc;
        out = (float *)malloc(sizeof(float) * (size_t)n * V);
        CHECK(b->forward(&r.s, ids, n, out, G4_LOGITS_ALL) == G4_OK, "forward: %s", r.s.error);
        d = max_diff(out, want, (size_t)n * V);
        scale = max_abs(want, (size_t)n * V);
        printf("  %s %s: %d tokens, logits %.3g of max |logit| %.3g from transformers, worst layer %.3g", b->name, model,
               n, d / scale, scale, tc.worst);
        CHECK(d <= G4I_TOL * scale, "logits differ from transformers: %.3g > %.3g", d, G4I_TOL * scale);
        if (worst && d / scale > worst->golden) worst->golden = d / scale;
        if (worst && tc.worst > worst->golden) worst->golden = tc.worst;
        if (ref) {
            double dr = max_diff(out, ref_out, (size_t)n * V), sr = max_abs(ref_out, (size_t)n * V);
            printf("; from %s: logits %.3g, worst tap %.3g", ref->name, dr / sr, tc.worst_ref);
            CHECK(dr <= ref_tol * sr, "logits differ from %s's: %.3g > %.3g", ref->name, dr, ref_tol * sr);
            CHECK(tc.seen_ref == tc.taps && tc.taps == rec.n, "tap sets: %s %d, matched %d, %s %d", b->name, tc.taps,
                  tc.seen_ref, ref->name, rec.n);
            if (worst && dr / sr > worst->ref) worst->ref = dr / sr;
            if (worst && tc.worst_ref > worst->ref_taps) worst->ref_taps = tc.worst_ref;
        }
        printf("\n");
        CHECK(tc.fails == 0, "%d taps differ", tc.fails);
        CHECK(tc.seen >= r.m.config.num_hidden_layers + 2, "only %d taps compared with transformers", tc.seen);
    } else if (want && (!ref || ref_out)) {
        CHECK(0, "%s session", b->name);
    }
    g4i_close(&r);
    free(out);
    free(ref_out);
    g4i_taps_free(&rec);
    g4_model_free(&g.m);
}

H_UNUSED static void g4i_golden(const g4i_backend *b, const char *model, const g4i_backend *ref, double ref_tol,
                                g4i_worst *worst) {
    g4i_golden_tol(b, model, ref, ref_tol, ref_tol, worst);
}

/* Greedy decode, one token per forward call: the logits transformers'
   generate saw at each step (DynamicCache decode) and its tokens. */
H_UNUSED static void g4i_greedy(const g4i_backend *b, const char *model) {
    golden g;
    g4i_run r;
    int n, i, V, prompt = 6;
    int64_t numel;
    const int32_t *want;
    const float *step_ref;
    float *logits;
    memset(&r, 0, sizeof r);
    if (!golden_open(&g, model)) { CHECK(0, "no golden for %s", model); return; }
    want = golden_ids(&g, "greedy_ids", &n);
    CHECK(want && n > prompt, "golden lacks greedy_ids");
    if (!want || n <= prompt || !g4i_open(&r, b, tiny(model), n, 0, 0)) {
        CHECK(!want || n <= prompt, "%s session", b->name);
        g4i_close(&r);
        g4_model_free(&g.m);
        return;
    }
    V = r.m.config.vocab_size;
    logits = (float *)malloc(sizeof(float) * V);
    step_ref = golden_f32(&g, "greedy_logits", &numel);
    CHECK(step_ref && numel == (int64_t)(n - prompt) * V, "golden lacks greedy_logits");
    CHECK(b->forward(&r.s, want, prompt, logits, G4_LOGITS_LAST) == G4_OK, "prefill: %s", r.s.error);
    for (i = prompt; i < n; i++) {
        int32_t next = g4_argmax(logits, V);
        if (step_ref) {
            const float *ref = step_ref + (size_t)(i - prompt) * V;
            double d = max_diff(logits, ref, (size_t)V), sc = max_abs(ref, (size_t)V);
            CHECK(d <= G4I_TOL * sc, "%s step %d: decode logits differ by %.3g (%.3g relative)", model, i - prompt, d, d / sc);
        }
        CHECK(next == want[i], "%s token %d: got %d, transformers %d", model, i, (int)next, (int)want[i]);
        if (next != want[i]) break;
        if (i + 1 < n) CHECK(b->forward(&r.s, &next, 1, logits, G4_LOGITS_LAST) == G4_OK, "decode: %s", r.s.error);
    }
    free(logits);
    g4i_close(&r);
    g4_model_free(&g.m);
}

/* Invariant 4: chunked prefill and decode give one prefill's bits, for every
   (max_chunk, tokens per call): decode, chunks of 3, a chunk longer than the
   window, calls that split chunks. */
H_UNUSED static void g4i_chunking(const g4i_backend *b, const char *model) {
    static const int plans[][2] = {{1, 1}, {3, 0}, {3, 5}, {13, 0}, {64, 7}, {2, 2}};
    golden g;
    g4_config c = g4i_config(model);
    int n, k;
    const int32_t *ids;
    float *ref;
    if (!(ids = g4i_input_ids(&g, model, &n))) return;
    CHECK(n > c.sliding_window, "sequence (%d) must exceed the window (%d)", n, c.sliding_window);
    ref = g4i_logits(b, tiny(model), ids, n, 64, 0, 0);
    CHECK(ref != NULL, "one-shot run");
    for (k = 0; ref && k < (int)(sizeof plans / sizeof plans[0]); k++) {
        float *out = g4i_logits(b, tiny(model), ids, n, plans[k][0], plans[k][1], 0);
        double d = out ? max_diff(out, ref, (size_t)n * c.vocab_size) : INFINITY;
        CHECK(d == 0.0, "%s: max_chunk %d, %d per call: differs from one-shot prefill by %.3g", model, plans[k][0],
              plans[k][1], d);
        free(out);
    }
    free(ref);
    g4_model_free(&g.m);
}

/* The debug table with a K/V copy per reader gives the owners-only table's bits. */
H_UNUSED static void g4i_reader_copies(const g4i_backend *b) {
    golden g;
    int n;
    const int32_t *ids;
    float *own, *copies;
    if (!(ids = g4i_input_ids(&g, "e2b_like", &n))) return;
    own = g4i_logits(b, tiny("e2b_like"), ids, n, 5, 0, 0);
    copies = g4i_logits(b, tiny("e2b_like"), ids, n, 5, 0, 1);
    CHECK(own && copies && max_diff(own, copies, (size_t)n * 512) == 0.0, "owners-only table and per-reader copies differ");
    free(own);
    free(copies);
    g4_model_free(&g.m);
}

/* Invariants 2, 3, 5, 7 on e2b_like (4 readers; window 8, chunk 4): one slot
   per owner, readers share their owner's slot (with reader_copies, their own),
   capacities, more arena for copies; after each step every slot holds exactly
   the positions consumed (and the table the kernels read agrees); reset
   empties it. */
H_UNUSED static void g4i_table(const g4i_backend *b) {
    g4i_run c, d;
    g4_kv_slot kt[2 * G4_MAX_LAYERS];
    int32_t ids[7] = {2, 81, 101, 77, 5, 9, 300};
    float logits[512];
    int i, step, readers = 0;
    memset(&d, 0, sizeof d);
    if (!g4i_open(&c, b, tiny("e2b_like"), 32, 4, 0) || !g4i_open(&d, b, tiny("e2b_like"), 32, 4, 1)) {
        CHECK(0, "open");
        g4i_close(&c);
        g4i_close(&d);
        return;
    }
    CHECK(c.s.n_slots == c.m.plan.first_shared, "slots %d != owners %d", c.s.n_slots, c.m.plan.first_shared);
    for (i = 0; i < c.m.plan.n_layers; i++) {
        const g4_layer_plan *lp = &c.m.plan.layer[i];
        if (lp->reads >= 0) {
            readers++;
            CHECK(c.s.layer_slot[i] == c.s.layer_slot[lp->reads], "reader %d does not share slot of %d", i, lp->reads);
            CHECK(d.s.layer_slot[i] != d.s.layer_slot[lp->reads] && d.s.slots[d.s.layer_slot[i]].writer == i,
                  "reader_copies: reader %d must have its own slot", i);
        } else {
            CHECK(c.s.slots[c.s.layer_slot[i]].writer == i, "slot of owner %d has writer %d", i,
                  c.s.slots[c.s.layer_slot[i]].writer);
        }
    }
    CHECK(readers == 4, "e2b_like has 4 readers, plan says %d", readers);
    CHECK(d.s.n_slots == c.s.n_slots + readers, "debug copies: %d slots", d.s.n_slots);
    CHECK(d.s.bytes > c.s.bytes, "reader copies must need more arena (%lu vs %lu)", (unsigned long)d.s.bytes,
          (unsigned long)c.s.bytes);
    /* sliding slots hold window-1+chunk rows, full ones the whole context */
    CHECK(c.s.slots[0].capacity == 8 - 1 + 4, "sliding capacity %d", c.s.slots[0].capacity);
    CHECK(c.s.slots[4].capacity == 32, "full capacity %d", c.s.slots[4].capacity);
    for (step = 0; step < 3; step++) {
        int k = step == 0 ? 5 : 1, pos = *c.s.pos;
        CHECK(b->forward(&c.s, ids + (step ? 4 + step : 0), k, logits, G4_LOGITS_LAST) == G4_OK, "%s", c.s.error);
        CHECK(*c.s.pos == pos + k, "session at %d, want %d", *c.s.pos, pos + k);
        if (b->read_table) CHECK(b->read_table(&c.s, kt, 2 * G4_MAX_LAYERS) == G4_OK, "read table: %s", c.s.error);
        for (i = 0; i < c.s.n_slots; i++) {
            const g4_kv_slot *h = &c.s.slots[i], *v = b->read_table ? &kt[i] : h;
            if (b->read_table) /* (without one, as on the CPU, the kernels read the host's table: v is h) */
                CHECK(v->writer == h->writer && v->capacity == h->capacity && v->k == h->k && v->v == h->v &&
                          v->head_dim == h->head_dim && v->kv_heads == h->kv_heads,
                      "slot %d: the kernels' table differs from the host's", i);
            CHECK(v->n_pos == pos + k && h->n_pos == pos + k, "slot %d holds %d (kernels) / %d (host), want %d", i,
                  v->n_pos, h->n_pos, pos + k);
        }
    }
    CHECK(b->reset(&c.s) == G4_OK && *c.s.pos == 0 && c.s.slots[0].n_pos == 0, "reset must empty the table");
    if (b->read_table)
        CHECK(b->read_table(&c.s, kt, 2 * G4_MAX_LAYERS) == G4_OK && kt[0].n_pos == 0, "reset must empty the kernels' table");
    g4i_close(&c);
    g4i_close(&d);
}

/* Invariant 8: reader layers' K/V weights are optional and never read. The
   transformers-saved e2b_like has none; add NaN ones (readers 6..9: D 16
   sliding, 32 full, 1 KV head) and no output bit may change. */
H_UNUSED static void g4i_stale_reader_kv(const g4i_backend *b) {
    static const char *what[3] = {"k_proj.weight", "v_proj.weight", "k_norm.weight"};
    golden g;
    int n, i, w, k = 0;
    const int32_t *ids;
    float *clean, *stale, *nan_kv = (float *)malloc(sizeof(float) * 32 * 64);
    st_entry extra[12];
    char names[12][96], dir[512];
    snprintf(dir, sizeof dir, "%s/stale_kv", g_tmp);
    for (i = 0; i < 32 * 64; i++) nan_kv[i] = NAN;
    for (i = 6; i < 10; i++) {
        int D = i == 9 ? 32 : 16;
        for (w = 0; w < 3; w++, k++) {
            snprintf(names[k], sizeof names[k], "model.layers.%d.self_attn.%s", i, what[w]);
            extra[k].name = names[k];
            extra[k].dtype = "F32";
            extra[k].ndim = w == 2 ? 1 : 2;
            extra[k].shape[0] = D;
            extra[k].shape[1] = 64;
            extra[k].data = nan_kv;
            extra[k].bytes = sizeof(float) * (size_t)D * (w == 2 ? 1 : 64);
        }
    }
    CHECK(rewrite_checkpoint("e2b_like", dir, extra, k), "write %s", dir);
    if (!(ids = g4i_input_ids(&g, "e2b_like", &n))) { free(nan_kv); return; }
    clean = g4i_logits(b, tiny("e2b_like"), ids, n, 64, 0, 0);
    stale = g4i_logits(b, dir, ids, n, 64, 0, 0);
    CHECK(stale != NULL, "checkpoint with stale reader K/V must load and run");
    CHECK(clean && stale && max_diff(clean, stale, (size_t)n * 512) == 0.0, "NaN reader K/V weights changed the output");
    {
        g4_model m;
        if (g4_model_load(&m, dir) != G4_OK) CHECK(0, "load: %s", m.error);
        else {
            CHECK(g4_model_tensor(&m, "model.layers.6.self_attn.k_proj.weight") != NULL, "the stale tensor is in the file");
            CHECK(m.w.layers[6].k_proj.data == NULL && m.w.layers[9].v_proj.data == NULL, "reader K/V must not be bound");
        }
        g4_model_free(&m);
    }
    free(clean);
    free(stale);
    free(nan_kv);
    g4_model_free(&g.m);
}

/* Invariants 5 and 6: two sessions on one model, interleaved (a one token per
   call, b two), each gives one prefill's bits; a reset session reproduces its
   first run. */
H_UNUSED static void g4i_sessions(const g4i_backend *b) {
    golden g;
    g4i_run a;
    g4i_session s2;
    int n, i, even;
    const int32_t *ids;
    float *la, *lb, *ref;
    if (!(ids = g4i_input_ids(&g, "e2b_like", &n))) return;
    even = n - n % 2;
    ref = g4i_logits(b, tiny("e2b_like"), ids, n, 64, 0, 0);
    memset(&s2, 0, sizeof s2);
    if (!g4i_open(&a, b, tiny("e2b_like"), n, 4, 0) || !b->open(&s2, a.bm, a.s.cfg, b->variant)) {
        CHECK(0, "open");
    } else {
        la = (float *)malloc(sizeof(float) * (size_t)n * 512);
        lb = (float *)malloc(sizeof(float) * (size_t)n * 512);
        for (i = 0; i < n; i++) {
            CHECK(b->forward(&a.s, ids + i, 1, la + (size_t)i * 512, G4_LOGITS_ALL) == G4_OK, "a: %s", a.s.error);
            if (i % 2 == 1)
                CHECK(b->forward(&s2, ids + i - 1, 2, lb + (size_t)(i - 1) * 512, G4_LOGITS_ALL) == G4_OK, "b: %s", s2.error);
        }
        CHECK(ref && max_diff(la, ref, (size_t)n * 512) == 0.0, "session a drifted");
        CHECK(ref && max_diff(lb, ref, (size_t)even * 512) == 0.0, "session b drifted");
        CHECK(b->reset(&a.s) == G4_OK && *a.s.pos == 0, "reset");
        CHECK(b->forward(&a.s, ids, n, la, G4_LOGITS_ALL) == G4_OK && ref && max_diff(la, ref, (size_t)n * 512) == 0.0,
              "a reset session must reproduce the first run");
        free(la);
        free(lb);
    }
    if (s2.impl) b->close(&s2);
    g4i_close(&a);
    free(ref);
    g4_model_free(&g.m);
}

/* Bad forward input is G4_ERR_INPUT, naming what is wrong, and never moves
   the session: ids outside the vocabulary, no tokens, NULL ids or logits, an
   unknown mode, more tokens than the context holds. */
H_UNUSED static void g4i_forward_errors(const g4i_backend *b) {
    g4i_run r;
    int32_t ids[4] = {2, 3, 4, 5}, bad;
    float logits[8 * 512];
    if (!g4i_open(&r, b, tiny("e2b_like"), 4, 2, 0)) { CHECK(0, "open"); g4i_close(&r); return; }
    bad = 512;
    CHECK(b->forward(&r.s, &bad, 1, logits, G4_LOGITS_LAST) == G4_ERR_INPUT && strstr(r.s.error, "512"), "id >= vocab");
    bad = -1;
    CHECK(b->forward(&r.s, &bad, 1, logits, G4_LOGITS_LAST) == G4_ERR_INPUT, "negative id");
    CHECK(b->forward(&r.s, ids, 0, logits, G4_LOGITS_LAST) == G4_ERR_INPUT, "empty input");
    CHECK(b->forward(&r.s, NULL, 1, logits, G4_LOGITS_LAST) == G4_ERR_INPUT, "NULL ids");
    CHECK(b->forward(&r.s, ids, 1, NULL, G4_LOGITS_LAST) == G4_ERR_INPUT, "NULL logits");
    CHECK(b->forward(&r.s, ids, 1, logits, 7) == G4_ERR_INPUT, "bad mode");
    CHECK(*r.s.pos == 0, "errors must not advance the session");
    CHECK(b->forward(&r.s, ids, 3, logits, G4_LOGITS_LAST) == G4_OK, "3 of 4: %s", r.s.error);
    CHECK(b->forward(&r.s, ids, 2, logits, G4_LOGITS_LAST) == G4_ERR_INPUT && strstr(r.s.error, "max_context"),
          "over-long: %s", r.s.error);
    CHECK(b->forward(&r.s, ids, 1, NULL, G4_LOGITS_NONE) == G4_OK, "the 4th fits: %s", r.s.error);
    g4i_close(&r);
}

/* ------------------------------------------------------------ all of them */

/* begin(name) unless g_only excludes the test; 1 when it runs. */
H_UNUSED static int g4i_begin(const char *fmt, ...) {
    char name[sizeof g_cur];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (g_only && !strstr(name, g_only)) return 0;
    begin("%s", name);
    return 1;
}

/* Every invariant above on b, one harness test each, named after b. The
   goldens are also compared with ref's run (NULL: none) within ref_tol. */
H_UNUSED static void g4i_run_all(const g4i_backend *b, const g4i_backend *ref, double ref_tol, g4i_worst *worst) {
    static const char *goldens[][2] = {
        {"e2b_like", "PLE, KV sharing, double-wide MLP, bf16"},
        {"e4b_like", "multimodal wrapper prefix, 5:1, towers ignored"},
        {"31b_like", "attention_k_eq_v, sharded, bf16"},
        {"26b_like", "MoE, bf16"},
        {"plain", "default layer_types, f16"},
        {"legacy_keys", "hub-form keys, stale reader K/V, f32"},
        {"unified_like", "gemma4_unified 12B-style: k_eq_v, KV sharing, double-wide, bf16"},
    };
    static const char *chunked[][2] = {{"e2b_like", "e2b_like"}, {"26b_like", "MoE"}, {"31b_like", "k_eq_v"},
                                       {"unified_like", "gemma4_unified"}};
    int k;
    for (k = 0; k < 7; k++)
        if ((!g4i_sized || k == 0 || k == 2 || k == 3) &&
            g4i_begin("%s: golden %s (%s)", b->name, goldens[k][0], goldens[k][1])) {
            g4i_golden(b, goldens[k][0], ref, ref_tol, worst);
            end();
        }
    if (g4i_begin("%s: greedy decode: logits and tokens of transformers generate", b->name)) {
        for (k = 0; k < (g4i_sized ? 1 : 5); k++) g4i_greedy(b, goldens[k][0]);
        if (!g4i_sized) g4i_greedy(b, "unified_like");
        end();
    }
    for (k = 0; k < (g4i_sized ? 1 : 4); k++)
        if (g4i_begin("%s: chunked prefill and decode = one-shot (%s)", b->name, chunked[k][1])) {
            g4i_chunking(b, chunked[k][0]);
            end();
        }
    if (g4i_begin("%s: owners-only table = per-reader copies", b->name)) { g4i_reader_copies(b); end(); }
    if (g4i_begin("%s: table: owners only, readers share slots, positions per step", b->name)) { g4i_table(b); end(); }
    if (g4i_begin("%s: stale reader K/V weights (NaN) are never read", b->name)) { g4i_stale_reader_kv(b); end(); }
    if (g4i_begin("%s: sessions on one model are independent; reset", b->name)) { g4i_sessions(b); end(); }
    if (g4i_begin("%s: forward: bad input is an error", b->name)) { g4i_forward_errors(b); end(); }
}

#endif /* G4_TEST_INVARIANTS_H */
