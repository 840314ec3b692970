/* The drafter suite: Gemma 4 assistant models (gemma4_assistant) attached to
   a target session, g4_session_rewind and exact speculative decoding.

   Goldens: data/tiny/{e2b_drafter,e2b_drafter_plain,31b_drafter,e4b_drafter}, made by
   tools/make_drafter_goldens.py with transformers 5.20.2 (5.23.0 cannot build
   an assistant; see data/tiny/DRAFTER_VERSIONS.txt) on the targets e2b_like
   (PLE, KV sharing), 31b_like (attention_k_eq_v) and e4b_like (e4b_drafter:
   a 5-step chain, test_chained_golden).

   Tolerances:
     first-round drafter logits: max |ours - ref| <= 2e-5 * max |ref| for the
       round's first step (the forward's tolerance: float32 both sides,
       different summation order), 1e-4 for the later steps, which chain the
       drafter (each feeds the next its projected hidden state): transformers'
       own float32 rows are up to 6.5e-5 from the same round in float64
       (data/tiny/DRAFTER_VERSIONS.txt); ours measured 1.6e-6..8.3e-6 at step
       0 and up to 6.7e-5 later. The drafted tokens and the assisted output
       match token for token.
     the bf16-faithful mode's first-round drafter logits (data/tiny/e2b_drafter/golden_bf16.safetensors,
       transformers 5.20.2 in bfloat16): bit-identical, on every CPU (the mode keeps torch's order on
       avx512_bf16 CPUs too).
     speculative greedy = plain greedy: exact (the same forward computes the
       same bits whatever the chunk; rewinding recomputes nothing).
     rewind then recompute = the first computation: exact. */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "harness.h"
#include "fixtures.h"
#define G4CMP_TOL_ONLY
#include "../examples/compare.h"

#define TOL 2e-5
#define TOL_CHAINED 1e-4

static const char *DRAFTERS[][2] = {
    {"e2b_drafter", "e2b_like"}, {"e2b_drafter_plain", "e2b_like"}, {"31b_drafter", "31b_like"}};
static const char *TARGETS[] = {"e2b_like", "e4b_like", "31b_like", "26b_like", "plain", "legacy_keys"};

/* a target model + session, and optionally a drafter attached to it */
typedef struct {
    g4_model tm, dm;
    g4_session t, d;
    void *ta, *da;
    size_t dbytes;
    int has_d;
} pair;

/* bf16: the bf16-faithful mode (the drafter session takes it from the target's) */
static int pair_open_mode(pair *p, const char *target, const char *drafter, int max_context, int chunk, int bf16) {
    g4_session_config sc = g4_session_config_init();
    size_t bytes;
    memset(p, 0, sizeof *p);
    if (g4_model_load(&p->tm, tiny(target)) != G4_OK) { printf("  load %s: %s\n", target, p->tm.error); return 0; }
    sc.max_context = max_context;
    sc.max_chunk = chunk;
    sc.bf16 = bf16;
    if (g4_session_size(&p->tm, &sc, &bytes) != G4_OK || !(p->ta = malloc(bytes)) ||
        g4_session_init(&p->t, &p->tm, &sc, p->ta, bytes) != G4_OK) {
        printf("  session %s: %s\n", target, p->t.error);
        return 0;
    }
    if (!drafter) return 1;
    p->has_d = 1;
    if (g4_model_load(&p->dm, tiny(drafter)) != G4_OK) { printf("  load %s: %s\n", drafter, p->dm.error); return 0; }
    if (g4_drafter_size(&p->dm, &p->t, &bytes) != G4_OK || !(p->da = malloc(p->dbytes = bytes)) ||
        g4_drafter_init(&p->d, &p->dm, &p->t, p->da, bytes) != G4_OK) {
        printf("  drafter %s: %s\n", drafter, p->d.error);
        return 0;
    }
    return 1;
}

static int pair_open(pair *p, const char *target, const char *drafter, int max_context, int chunk) {
    return pair_open_mode(p, target, drafter, max_context, chunk, 0);
}

static void pair_free(pair *p) {
    free(p->ta);
    free(p->da);
    g4_model_free(&p->tm);
    if (p->has_d) g4_model_free(&p->dm);
}

static int g4_argmin(const float *x, int n) {
    int i, b = 0;
    for (i = 1; i < n; i++) if (x[i] < x[b]) b = i;
    return b;
}

/* plain greedy: n_new tokens after the prompt (a fresh session each time) */
static int32_t *plain_greedy(const char *target, const int32_t *prompt, int n, int n_new) {
    pair p;
    int32_t *out = (int32_t *)malloc(sizeof(int32_t) * (size_t)n_new);
    float *logits;
    int i;
    if (!pair_open(&p, target, NULL, n + n_new + 1, 0)) { pair_free(&p); free(out); return NULL; }
    logits = (float *)malloc(sizeof(float) * (size_t)p.tm.config.vocab_size);
    if (g4_forward(&p.t, prompt, n, logits, G4_LOGITS_LAST) != G4_OK) { free(out); out = NULL; }
    for (i = 0; out && i < n_new; i++) {
        out[i] = g4_argmax(logits, p.tm.config.vocab_size);
        if (i + 1 < n_new && g4_forward(&p.t, &out[i], 1, logits, G4_LOGITS_LAST) != G4_OK) { free(out); out = NULL; }
    }
    free(logits);
    pair_free(&p);
    return out;
}

/* ------------------------------------------------ the drafter's goldens */

/* The first drafting round against the golden: float32 (golden.safetensors) within TOL / TOL_CHAINED, or
   (bf16) the bf16-faithful mode against transformers 5.20.2 run in bfloat16 (golden_bf16.safetensors,
   target and drafter both bf16; the prompts are golden.safetensors', except "tie", whose prompt the bf16
   golden holds: at its step 1 two bf16 centroid logits tie at the top-k boundary and torch.topk keeps
   the higher index, so a lower-index top-k there masks another centroid's tokens). In bf16 the masked embedder's fill
   is min(bf16(selected logits)) - 1, then rounded to bf16, as transformers orders it; the short prompt's
   first step is one where taking the min before the rounding gives another fill (DRAFTER_VERSIONS.txt).
   bf16 bound: bit-identical, every logit a bf16 value (the target's bf16 mode is bit-identical too,
   test_gemma4). */
static void check_first_round(const char *drafter, const char *target, const char *tag, int bf16) {
    golden g, gb;
    const char *mode = bf16 ? "bf16" : "f32";
    pair p;
    char name[64];
    int n, K, V, i, j, nd;
    int64_t numel;
    const int32_t *prompt, *draft_ids;
    const float *ref;
    float *logits, *h;
    int32_t tok;
    if (!golden_open(&g, drafter)) { CHECK(0, "no golden for %s", drafter); return; }
    if (bf16 && !golden_open_file(&gb, drafter, "golden_bf16.safetensors")) { CHECK(0, "no bf16 golden"); g4_model_free(&g.m); return; }
    if (!bf16) gb = g;
    snprintf(name, sizeof name, "%s_prompt", tag);
    prompt = golden_ids(bf16 && !strcmp(tag, "tie") ? &gb : &g, name, &n);
    snprintf(name, sizeof name, "%s_draft_ids", tag);
    draft_ids = golden_ids(&gb, name, &K);
    snprintf(name, sizeof name, "%s_draft_logits", tag);
    ref = golden_f32(&gb, name, &numel);
    CHECK(prompt && draft_ids && ref, "%s: %s golden lacks %s tensors", drafter, mode, tag);
    if (!prompt || !draft_ids || !ref) goto done;
    if (!pair_open_mode(&p, target, drafter, 64, 8, bf16)) { /* (it said why) */
        CHECK(0, "%s: cannot open %s with the drafter (%s)", drafter, target, mode);
        pair_free(&p);
        goto done;
    }
    V = p.tm.config.vocab_size;
    CHECK(numel == (int64_t)K * V, "%s: draft logits shape", drafter);
    logits = (float *)malloc(sizeof(float) * (size_t)V);
    h = (float *)malloc(sizeof(float) * (size_t)p.tm.config.hidden_size);
    /* the target prefills the prompt; its greedy token and last hidden start the round */
    CHECK(g4_forward_hidden(&p.t, prompt, n, logits, G4_LOGITS_LAST, h) == G4_OK, "prefill: %s", p.t.error);
    tok = g4_argmax(logits, V);
    for (i = 0; i < K && numel == (int64_t)K * V; i++) {
        const float *r = ref + (size_t)i * V;
        double d, sc, tol = bf16 ? 0.0 : i ? TOL_CHAINED : TOL;
        CHECK(g4_draft_step(&p.d, tok, h, logits, h) == G4_OK, "draft step %d: %s", i, p.d.error);
        d = max_diff(logits, r, (size_t)V);
        sc = max_abs(r, (size_t)V);
        if (getenv("G4_VERBOSE")) printf("  %s %s %s step %d: %.3g relative\n", drafter, mode, tag, i, d / sc);
        CHECK(d <= tol * sc, "%s %s %s step %d: drafter logits differ by %.3g (%.3g relative); min %.9g, want %.9g",
              drafter, mode, tag, i, d, d / sc, (double)logits[g4_argmin(logits, V)], (double)r[g4_argmin(r, V)]);
        for (j = 0; j < V && bf16 && tol == 0.0; j++)
            if (logits[j] != g4__bf16_round(logits[j])) { CHECK(0, "%s %s step %d: logit %d is not bf16", drafter, tag, i, j); break; }
        tok = g4_argmax(logits, V);
        CHECK(tok == draft_ids[i], "%s %s %s step %d: drafted %d, transformers %d", drafter, mode, tag, i, (int)tok,
              (int)draft_ids[i]);
        tok = draft_ids[i];
    }
    nd = 0;
    for (i = 0; i < V; i++) nd += logits[i] == logits[g4_argmin(logits, V)]; /* with ordered embeddings most are the fill */
    if (p.dm.config.use_ordered_embeddings)
        CHECK(nd >= V - V / p.dm.config.num_centroids * p.dm.config.centroid_intermediate_top_k,
              "%s: %d of %d logits share the fill value", drafter, nd, V);
    free(logits);
    free(h);
    pair_free(&p);
done:
    g4_model_free(&g.m);
    if (bf16) g4_model_free(&gb.m);
}

static void test_first_round_goldens(void) {
    size_t i;
    for (i = 0; i < sizeof DRAFTERS / sizeof DRAFTERS[0]; i++) {
        check_first_round(DRAFTERS[i][0], DRAFTERS[i][1], "long", 0);
        check_first_round(DRAFTERS[i][0], DRAFTERS[i][1], "short", 0);
    }
}

/* The chained golden (data/tiny/e4b_drafter, tools/make_drafter_goldens.py make_chain): ordered
   embeddings, top-4 of 16 centroids, drafting 5 steps for the E4B-shaped e4b_like (PLE, KV sharing, two
   KV heads, bf16-stored) after a 12-token prompt. Each step feeds the next, so the target's float32
   rounding grows along the round as far as the drafter's weights amplify it; the golden's seed was taken
   only where that stays small (DRAFTER_VERSIONS.txt: float64 with the target's K/V and hidden state
   perturbed by 3e-6 moves no step by more than 3e-5), so TOL / TOL_CHAINED measure the implementation.
   float32: TOL at step 0, TOL_CHAINED after; bf16 (the same round in bfloat16): bit-identical. Then
   assisted greedy with 5 drafts = transformers' assisted output. */
static void check_assisted(const char *drafter, const char *target, const char *tag, int k);
static void test_chained_golden(void) {
    check_first_round("e4b_drafter", "e4b_like", "chain", 0);
    check_first_round("e4b_drafter", "e4b_like", "chain", 1);
    check_assisted("e4b_drafter", "e4b_like", "chain", 5);
}

static void test_first_round_bf16_golden(void) {
    check_first_round("e2b_drafter", "e2b_like", "long", 1);
    check_first_round("e2b_drafter", "e2b_like", "short", 1);
    check_first_round("e2b_drafter", "e2b_like", "tie", 1);
}

/* assisted greedy with the real drafter = transformers' assisted output = plain greedy */
static void check_assisted(const char *drafter, const char *target, const char *tag, int k) {
    golden g;
    pair p;
    g4_spec sp;
    char name[64];
    int n, total, got = 0, m, i;
    size_t bytes;
    void *work = NULL;
    const int32_t *prompt, *want;
    int32_t *out;
    if (!golden_open(&g, drafter)) { CHECK(0, "no golden"); return; }
    snprintf(name, sizeof name, "%s_prompt", tag);
    prompt = golden_ids(&g, name, &n);
    snprintf(name, sizeof name, "%s_assisted_ids", tag);
    want = golden_ids(&g, name, &total);
    memset(&p, 0, sizeof p); /* (pair_free below may run without pair_open) */
    if (!prompt || !want || !pair_open(&p, target, drafter, 64, k + 2)) {
        CHECK(0, "open");
        pair_free(&p);
        g4_model_free(&g.m);
        return;
    }
    out = (int32_t *)malloc(sizeof(int32_t) * (size_t)(total + k + 2));
    CHECK(g4_spec_size(&p.tm, k, &bytes) == G4_OK && (work = malloc(bytes)), "spec size");
    CHECK(g4_spec_init(&sp, &p.t, &p.d, k, work, bytes) == G4_OK, "spec init: %s", sp.error);
    CHECK(g4_spec_prefill(&sp, prompt, n, NULL, &out[0]) == G4_OK, "prefill: %s", sp.error);
    got = 1;
    while (n + got < total) {
        if (g4_spec_round(&sp, NULL, out + got, &m) != G4_OK) { CHECK(0, "round: %s", sp.error); break; }
        got += m;
    }
    for (i = 0; i < total - n && i < got; i++)
        if (out[i] != want[n + i]) { CHECK(0, "%s %s k %d: token %d is %d, transformers %d", drafter, tag, k, i, (int)out[i], (int)want[n + i]); break; }
    CHECK(sp.drafted == (long)sp.target_steps * k || n + got >= 64, "drafted %ld in %ld rounds", sp.drafted, sp.target_steps);
    free(out);
    free(work);
    pair_free(&p);
    g4_model_free(&g.m);
}

static void test_assisted_goldens(void) {
    size_t i;
    for (i = 0; i < sizeof DRAFTERS / sizeof DRAFTERS[0]; i++) {
        check_assisted(DRAFTERS[i][0], DRAFTERS[i][1], "long", 4);
        check_assisted(DRAFTERS[i][0], DRAFTERS[i][1], "short", 4);
        check_assisted(DRAFTERS[i][0], DRAFTERS[i][1], "long", 1);
        check_assisted(DRAFTERS[i][0], DRAFTERS[i][1], "short", 7);
    }
}

/* ------------------------------------------ forced drafts: every offset */

typedef struct { const int32_t *truth; int n_prompt, right, V; } oracle;

/* drafts the true greedy token for the first `right` drafts of a round, a
   wrong one after (right >= k: always right; 0: always wrong) */
static int32_t oracle_propose(void *user, int pos, int i, int32_t drafted) {
    const oracle *o = (const oracle *)user;
    int32_t t = o->truth[pos - o->n_prompt];
    (void)drafted;
    return i < o->right ? t : (t + 1) % o->V;
}

static void check_forced(const char *target, const char *drafter, int k, int right, int n_new) {
    pair p;
    g4_spec sp;
    oracle o;
    int32_t prompt[12], *truth, *out;
    int n = 12, got, m, i, V;
    size_t bytes;
    void *work = NULL;
    for (i = 0; i < n; i++) prompt[i] = (int32_t)(3 + (i * 37) % 500);
    truth = plain_greedy(target, prompt, n, n_new + k + 2);
    if (!truth) { CHECK(0, "%s: plain greedy failed", target); return; }
    if (!pair_open(&p, target, drafter, n + n_new + k + 4, k + 2)) { CHECK(0, "open %s", target); pair_free(&p); free(truth); return; }
    V = p.tm.config.vocab_size;
    o.truth = truth; o.n_prompt = n; o.right = right; o.V = V;
    out = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n_new + k + 2));
    CHECK(g4_spec_size(&p.tm, k, &bytes) == G4_OK && (work = malloc(bytes)), "spec size");
    CHECK(g4_spec_init(&sp, &p.t, drafter ? &p.d : NULL, k, work, bytes) == G4_OK, "init: %s", sp.error);
    sp.propose = oracle_propose;
    sp.propose_user = &o;
    CHECK(g4_spec_prefill(&sp, prompt, n, NULL, &out[0]) == G4_OK, "prefill: %s", sp.error);
    for (got = 1; got < n_new; got += m)
        if (g4_spec_round(&sp, NULL, out + got, &m) != G4_OK) { CHECK(0, "%s k %d right %d: %s", target, k, right, sp.error); break; }
    for (i = 0; i < n_new && i < got; i++)
        if (out[i] != truth[i]) { CHECK(0, "%s k %d right %d: token %d is %d, plain greedy %d", target, k, right, i, (int)out[i], (int)truth[i]); break; }
    /* every round accepts exactly min(right, k) drafts (the truth is the target's own greedy) */
    CHECK(sp.accepted == (long)sp.target_steps * (right < k ? right : k), "%s k %d right %d: accepted %ld in %ld rounds",
          target, k, right, sp.accepted, sp.target_steps);
    CHECK(p.t.pos == n + got - 1, "target holds %d positions, expected %d", p.t.pos, n + got - 1);
    free(out);
    free(work);
    free(truth);
    pair_free(&p);
}

static void test_forced_every_offset(void) {
    size_t t;
    int k, right;
    for (t = 0; t < sizeof TARGETS / sizeof TARGETS[0]; t++)
        for (k = 1; k <= 4; k++)
            for (right = 0; right <= k; right++) check_forced(TARGETS[t], NULL, k, right, 30);
    /* with a real drafter attached (its drafts replaced): its reads follow every rewind */
    for (right = 0; right <= 3; right++) check_forced("e2b_like", "e2b_drafter", 3, right, 30);
    check_forced("31b_like", "31b_drafter", 5, 2, 30);
}

/* ----------------------------------------------------------- rewind */

static void test_rewind_recompute_exact(void) {
    size_t t;
    for (t = 0; t < sizeof TARGETS / sizeof TARGETS[0]; t++) {
        pair p;
        int32_t ids[30];
        int i, V, back;
        float *a, *b;
        for (i = 0; i < 30; i++) ids[i] = (int32_t)(5 + (i * 53) % 500);
        if (!pair_open(&p, TARGETS[t], NULL, 32, 6)) { CHECK(0, "open"); pair_free(&p); continue; }
        V = p.tm.config.vocab_size;
        a = (float *)malloc(sizeof(float) * (size_t)V * 30);
        b = (float *)malloc(sizeof(float) * (size_t)V * 6);
        CHECK(g4_forward(&p.t, ids, 30, a, G4_LOGITS_ALL) == G4_OK, "forward");
        for (back = 1; back <= 6; back++) { /* 30 tokens in chunks of 6: the last call wrote 6 */
            CHECK(g4_session_rewind(&p.t, 30 - back) == G4_OK, "%s rewind %d: %s", TARGETS[t], back, p.t.error);
            CHECK(p.t.pos == 30 - back, "pos");
            CHECK(g4_forward(&p.t, ids + 30 - back, back, b, G4_LOGITS_ALL) == G4_OK, "recompute: %s", p.t.error);
            CHECK(memcmp(b, a + (size_t)(30 - back) * V, sizeof(float) * (size_t)back * V) == 0,
                  "%s: rewind %d then recompute differs", TARGETS[t], back);
        }
        /* a different continuation after a rewind = a fresh session fed the same tokens */
        CHECK(g4_session_rewind(&p.t, 27) == G4_OK, "rewind");
        {
            int32_t alt[3] = {7, 8, 9}, all[30];
            float *c = (float *)malloc(sizeof(float) * (size_t)V * 30);
            pair q;
            memcpy(all, ids, sizeof all);
            memcpy(all + 27, alt, sizeof alt);
            CHECK(g4_forward(&p.t, alt, 3, b, G4_LOGITS_ALL) == G4_OK, "alt");
            if (pair_open(&q, TARGETS[t], NULL, 32, 6)) {
                CHECK(g4_forward(&q.t, all, 30, c, G4_LOGITS_ALL) == G4_OK, "fresh");
                CHECK(memcmp(b, c + (size_t)27 * V, sizeof(float) * 3 * (size_t)V) == 0, "%s: rewound continuation differs from a fresh run", TARGETS[t]);
            }
            pair_free(&q);
            free(c);
        }
        /* too far back for a sliding ring: an error naming the layer, nothing changed */
        if (p.tm.config.sliding_window < 30) {
            int pos = p.t.pos;
            CHECK(g4_session_rewind(&p.t, 10) == G4_ERR_INPUT, "%s: rewinding past the sliding ring must fail", TARGETS[t]);
            CHECK(strstr(p.t.error, "sliding ring") != NULL, "message: %s", p.t.error);
            CHECK(p.t.pos == pos, "a failed rewind changes nothing");
        }
        CHECK(g4_session_rewind(&p.t, 31) == G4_ERR_INPUT && g4_session_rewind(&p.t, -1) == G4_ERR_INPUT, "range");
        CHECK(g4_session_rewind(&p.t, 0) == G4_OK && p.t.pos == 0, "rewind to 0 always works");
        free(a);
        free(b);
        pair_free(&p);
    }
}

/* ------------------------------------------------- checks and errors */

static void test_drafter_validation(void) {
    pair p;
    g4_model dm;
    size_t bytes;
    g4_session d;
    char buf[64];
    /* e2b_drafter (one KV head) on e4b_like (hidden 32 as well, two KV heads): names both */
    if (pair_open(&p, "e4b_like", NULL, 32, 8) && g4_model_load(&dm, tiny("e2b_drafter")) == G4_OK) {
        void *arena = malloc(1 << 20);
        CHECK(g4_drafter_size(&dm, &p.t, &bytes) == G4_ERR_CONFIG, "mismatch must fail");
        CHECK(g4_drafter_init(&d, &dm, &p.t, arena, 1 << 20) == G4_ERR_CONFIG, "mismatch must fail");
        CHECK(strstr(d.error, "drafter layer 0") && strstr(d.error, "target layer 6"), "message: %s", d.error);
        free(arena);
        g4_model_free(&dm);
    } else CHECK(0, "open");
    pair_free(&p);
    /* on plain (hidden 48): the backbone size */
    if (pair_open(&p, "plain", NULL, 32, 8) && g4_model_load(&dm, tiny("e2b_drafter")) == G4_OK) {
        CHECK(g4_drafter_size(&dm, &p.t, &bytes) == G4_ERR_CONFIG, "backbone mismatch must fail");
        g4_model_free(&dm);
    } else CHECK(0, "open");
    pair_free(&p);
    /* a drafter is not a token model; a target is not a drafter */
    if (pair_open(&p, "e2b_like", "e2b_drafter", 32, 8)) {
        int32_t id = 5;
        float *lg = (float *)malloc(sizeof(float) * 512), h[64];
        memset(h, 0, sizeof h);
        CHECK(g4_forward(&p.d, &id, 1, lg, G4_LOGITS_LAST) == G4_ERR_INPUT, "g4_forward on a drafter must fail");
        CHECK(g4_draft_step(&p.t, id, h, lg, h) == G4_ERR_INPUT, "g4_draft_step on a target must fail");
        CHECK(g4_session_rewind(&p.d, 0) == G4_ERR_INPUT, "rewind on a drafter must fail");
        /* nothing to read yet (target at position 0) */
        CHECK(g4_draft_step(&p.d, id, h, lg, h) == G4_ERR_INPUT, "a draft before the target ran must fail");
        /* reset detection */
        CHECK(g4_forward(&p.t, &id, 1, lg, G4_LOGITS_LAST) == G4_OK, "forward");
        CHECK(g4_draft_step(&p.d, id, h, lg, h) == G4_OK, "draft: %s", p.d.error);
        g4_session_reset(&p.t);
        CHECK(g4_forward(&p.t, &id, 1, lg, G4_LOGITS_LAST) == G4_OK, "forward");
        CHECK(g4_draft_step(&p.d, id, h, lg, h) == G4_ERR_INPUT, "a draft after the target's reset must fail");
        CHECK(strstr(p.d.error, "reset") != NULL, "message: %s", p.d.error);
        CHECK(g4_draft_step(&p.d, 512, h, lg, h) == G4_ERR_INPUT, "token out of range");
        free(lg);
    } else CHECK(0, "open");
    pair_free(&p);
    /* a target whose sliding ring is too short for the drafter's window + 1 reads */
    if (pair_open(&p, "e2b_like", "e2b_drafter", 32, 1)) {
        int32_t ids[12];
        float *lg = (float *)malloc(sizeof(float) * 512), h[64];
        int i;
        for (i = 0; i < 12; i++) ids[i] = 10 + i;
        memset(h, 0, sizeof h);
        CHECK(g4_forward(&p.t, ids, 12, lg, G4_LOGITS_LAST) == G4_OK, "forward");
        CHECK(g4_draft_step(&p.d, 3, h, lg, h) == G4_ERR_INPUT, "a read the ring cannot serve must fail");
        CHECK(strstr(p.d.error, "max_chunk") != NULL, "message: %s", p.d.error);
        free(lg);
    } else CHECK(0, "open");
    pair_free(&p);
    /* configs */
    {
        g4_config c;
        const char *bad = "{\"model_type\":\"gemma4_assistant\",\"backbone_hidden_size\":64,\"text_config\":{"
                          "\"vocab_size\":512,\"hidden_size\":32,\"intermediate_size\":48,\"num_hidden_layers\":2,"
                          "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"hidden_size_per_layer_input\":16}}";
        CHECK(g4_config_parse(&c, bad, strlen(bad), "a.json") == G4_ERR_CONFIG, "PLE assistant must fail");
        CHECK(strstr(c.error, "hidden_size_per_layer_input 16") != NULL, "message: %s", c.error);
        snprintf(buf, sizeof buf, "%s", "{\"model_type\":\"gemma4_assistant\"}");
        CHECK(g4_config_parse(&c, buf, strlen(buf), "a.json") == G4_ERR_CONFIG, "no text_config must fail");
        CHECK(g4_config_load(&c, path2(tiny("e2b_drafter"), "config.json")) == G4_OK, "%s", c.error);
        CHECK(c.assistant && c.backbone_hidden_size == 32 && c.use_ordered_embeddings && c.num_centroids == 16 &&
              c.centroid_intermediate_top_k == 4 && c.num_kv_shared_layers == 4, "assistant fields");
    }
}

static void test_spec_errors(void) {
    pair p;
    g4_spec sp;
    size_t bytes;
    void *work;
    int32_t out[8];
    int m;
    if (!pair_open(&p, "e2b_like", "e2b_drafter", 32, 4)) { CHECK(0, "open"); pair_free(&p); return; }
    CHECK(g4_spec_size(&p.tm, 4, &bytes) == G4_OK, "size");
    work = malloc(bytes);
    CHECK(g4_spec_init(&sp, &p.t, &p.d, 4, work, bytes) == G4_ERR_INPUT, "max_chunk 4 < k + 2 must fail");
    CHECK(strstr(sp.error, "max_chunk") != NULL, "message: %s", sp.error);
    CHECK(g4_spec_init(&sp, &p.t, &p.d, 2, work, 16) == G4_ERR_ARENA, "small workspace must fail");
    CHECK(g4_spec_init(&sp, &p.t, &p.d, 2, work, bytes) == G4_OK, "init: %s", sp.error);
    CHECK(g4_spec_round(&sp, NULL, out, &m) == G4_ERR_INPUT, "a round before the prefill must fail");
    CHECK(g4_spec_init(&sp, &p.d, NULL, 2, work, bytes) == G4_ERR_INPUT, "a drafter as the target must fail");
    free(work);
    pair_free(&p);
}

/* ------------------------------------------- speculative sampling */

/* proposes the target's most likely next token (a deterministic drafter whose
   drafts are often accepted, so both branches of the rule run) */
static int32_t propose_fixed(void *user, int pos, int i, int32_t drafted) {
    const int32_t *ids = (const int32_t *)user;
    (void)pos; (void)drafted;
    return ids[i];
}

/* Pearson's chi-square of N samples (frequencies emp) against the exact
   distribution, cells with expected count < 5 pooled; *df: degrees of freedom */
static double chi2(const float *emp, const float *exact, int V, int N, int *df) {
    double x = 0, po = 0, pe = 0;
    int y, cells = 0;
    for (y = 0; y < V; y++) {
        double e = (double)exact[y] * N, o = (double)emp[y] * N;
        if (e >= 5) { x += (o - e) * (o - e) / e; cells++; }
        else { po += o; pe += e; }
    }
    if (pe > 0) { x += (po - pe) * (po - pe) / (pe > 1 ? pe : 1); cells++; }
    *df = cells - 1;
    return x;
}

/* The exact distribution (temperature 1, top-k 8) of the next token after ids */
static void exact_dist(pair *q, g4_sampler *smp, const int32_t *ids, int n, float *dist) {
    g4_session_reset(&q->t);
    CHECK(g4_forward(&q->t, ids, n, dist, G4_LOGITS_LAST) == G4_OK, "forward");
    CHECK(g4__sampler_dist(smp, dist, dist) == -2, "dist");
}

static void check_spec_sampling(int use_drafter) {
#if defined(__SANITIZE_ADDRESS__)
    enum { N = 500, K = 3, TOPK = 8 }; /* the sanitizer build looks for memory errors, not statistics: fewer runs */
#else
    enum { N = 4000, K = 3, TOPK = 8 };
#endif
    pair p, q;
    g4_spec sp;
    g4_sampler smp;
    g4_sampler_config sc = g4_sampler_config_init();
    int32_t prompt[10], x1 = 77, seq[13], out[2 * (K + 1)], drafts[K];
    float *h0, *p1, *p2, *emp1, *emp2;
    size_t bytes;
    void *work = NULL;
    int i, n = 10, V, trial, y, accepted_any = 0, rejected_any = 0;
    double tv1 = 0, tv2 = 0, x2a, x2b;
    int dfa, dfb;
    for (i = 0; i < n; i++) prompt[i] = (int32_t)(11 + (i * 41) % 480);
    memset(&q, 0, sizeof q); /* (pair_free below may run without pair_open) */
    if (!pair_open(&p, "e2b_like", "e2b_drafter", 32, 24) || !pair_open(&q, "e2b_like", NULL, 32, 8)) {
        CHECK(0, "open"); pair_free(&p); pair_free(&q); return;
    }
    V = p.tm.config.vocab_size;
    sc.temperature = 1.0f; sc.top_k = TOPK; sc.top_p = 1.0f; sc.seed = 1234;
    CHECK(g4_sampler_init(&smp, &sc, V) == G4_OK, "sampler");
    h0 = (float *)malloc(sizeof(float) * (size_t)p.tm.config.hidden_size);
    p1 = (float *)calloc((size_t)V, sizeof(float));
    p2 = (float *)calloc((size_t)V, sizeof(float));
    emp1 = (float *)calloc((size_t)V, sizeof(float));
    emp2 = (float *)calloc((size_t)V, sizeof(float));
    /* exact: p1 = p(y1 | prompt, x1); p2 = sum_y1 p1(y1) p(y2 | prompt, x1, y1) */
    memcpy(seq, prompt, sizeof prompt);
    seq[n] = x1;
    exact_dist(&q, &smp, seq, n + 1, p1);
    {
        float *tmp = (float *)malloc(sizeof(float) * (size_t)V);
        for (y = 0; y < V; y++) {
            int j;
            if (p1[y] <= 0) continue;
            seq[n + 1] = y;
            exact_dist(&q, &smp, seq, n + 2, tmp);
            for (j = 0; j < V; j++) p2[j] += p1[y] * tmp[j];
        }
        free(tmp);
    }
    /* the drafter proposes (through propose) the exact argmax continuation */
    drafts[0] = g4_argmax(p1, V);
    seq[n + 1] = drafts[0];
    {
        float *tmp = (float *)malloc(sizeof(float) * (size_t)V);
        exact_dist(&q, &smp, seq, n + 2, tmp);
        drafts[1] = g4_argmax(tmp, V);
        drafts[2] = 5;
        free(tmp);
    }
    CHECK(g4_spec_size(&p.tm, K, &bytes) == G4_OK && (work = malloc(bytes)), "spec size");
    CHECK(g4_spec_init(&sp, &p.t, &p.d, K, work, bytes) == G4_OK, "init: %s", sp.error);
    if (!use_drafter) { sp.propose = propose_fixed; sp.propose_user = drafts; }
    CHECK(g4_forward_hidden(&p.t, prompt, n, sp.logits, G4_LOGITS_LAST, h0) == G4_OK, "prefill");
    for (trial = 0; trial < N; trial++) {
        int got = 0, m;
        /* the state after the prompt and x1: positions [0, n) run, x1 next (the
           target's rings, max_chunk 24, hold every position: rewinding is exact) */
        CHECK(g4_session_rewind(&p.t, n) == G4_OK, "rewind: %s", p.t.error);
        memcpy(sp.h, h0, sizeof(float) * (size_t)p.tm.config.hidden_size);
        sp.last = x1;
        memset(smp.seen, 0, (size_t)V);
        while (got < 2) {
            long acc = sp.accepted;
            if (g4_spec_round(&sp, &smp, out + got, &m) != G4_OK) { CHECK(0, "round: %s", sp.error); trial = N; break; }
            if (sp.accepted > acc) accepted_any = 1;
            if (m < K + 1) rejected_any = 1;
            got += m;
        }
        emp1[out[0]] += 1.0f / N;
        emp2[out[1]] += 1.0f / N;
    }
    for (y = 0; y < V; y++) { tv1 += 0.5 * fabs(emp1[y] - p1[y]); tv2 += 0.5 * fabs(emp2[y] - p2[y]); }
    x2a = chi2(emp1, p1, V, N, &dfa);
    x2b = chi2(emp2, p2, V, N, &dfb);
    if (getenv("G4_VERBOSE"))
        printf("  %s: first token chi2 %.1f (df %d), TV %.4f; second chi2 %.1f (df %d), TV %.4f\n",
               use_drafter ? "drafter" : "argmax drafts", x2a, dfa, tv1, x2b, dfb, tv2);
    CHECK(x2a < dfa + 4 * sqrt(2.0 * dfa) && x2b < dfb + 4 * sqrt(2.0 * dfb),
          "%s: the outputs are not the target's distribution: chi2 %.1f (df %d) first token, %.1f (df %d) second",
          use_drafter ? "drafter" : "argmax drafts", x2a, dfa, x2b, dfb);
    CHECK(accepted_any && rejected_any, "both branches of the acceptance rule ran (accepted %d rejected %d)", accepted_any, rejected_any);
    free(h0); free(p1); free(p2); free(emp1); free(emp2); free(work);
    g4_sampler_free(&smp);
    pair_free(&p);
    pair_free(&q);
}

static void test_spec_sampling_distribution(void) {
    check_spec_sampling(0);
    check_spec_sampling(1);
}

/* the e2b drafter's checkpoint with its token_ordering ([512]) replaced by data of dtype */
static int write_bad_ordering(const char *dir, const void *data, const char *dtype, size_t bytes) {
    st_entry e;
    memset(&e, 0, sizeof e);
    e.name = "masked_embedding.token_ordering"; e.dtype = dtype; e.ndim = 1; e.shape[0] = 512; e.data = data; e.bytes = bytes;
    return rewrite_checkpoint("e2b_drafter", dir, &e, 1);
}

static void test_bad_token_ordering(void) {
    int64_t ord[512];
    int32_t ord32[512];
    g4_model m;
    char dir[300]; /* a copy: path2's buffers rotate */
    int i;
    snprintf(dir, sizeof dir, "%s/bad_ordering", g_tmp);
    for (i = 0; i < 512; i++) { ord[i] = (i * 7) % 512; ord32[i] = (int32_t)ord[i]; }
    CHECK(write_bad_ordering(dir, ord32, "I32", sizeof ord32), "write");
    CHECK(g4_model_load(&m, dir) == G4_OK, "an I32 permutation loads: %s", m.error);
    if (m.w.layers) g4_model_free(&m);
    ord[5] = ord[4]; /* a repeated index: not a permutation */
    CHECK(write_bad_ordering(dir, ord, "I64", sizeof ord), "write");
    CHECK(g4_model_load(&m, dir) == G4_ERR_WEIGHTS && strstr(m.error, "token_ordering[5]") && strstr(m.error, "permutation"),
          "a repeated index must fail naming it: %s", m.error);
    ord[5] = 600; /* out of range */
    CHECK(write_bad_ordering(dir, ord, "I64", sizeof ord), "write");
    CHECK(g4_model_load(&m, dir) == G4_ERR_WEIGHTS && strstr(m.error, "= 600"), "out of range: %s", m.error);
    CHECK(write_bad_ordering(dir, ord, "F32", 512 * 4), "write");
    CHECK(g4_model_load(&m, dir) == G4_ERR_WEIGHTS && strstr(m.error, "I64 or I32"), "a float ordering: %s", m.error);
}

/* ------------------------------------------------------------- the CLI */

static const char *g_cli; /* build/gemma4 (or its sanitizer build); NULL: skip */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    char *b;
    long n;
    *len = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = (char *)malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) { b[n] = 0; *len = (size_t)n; }
    fclose(f);
    return b;
}

static void test_cli(void) {
    static char a[1 << 16], b[1 << 16], e[8192];
    char cmd[1024], ids[256];
    golden g;
    int n, K, i, k = 0;
    int64_t numel;
    const int32_t *prompt;
    const float *ref;
    size_t len;
    float *got;
    if (!g_cli) { skip("no CLI binary given (tests/test_drafter DATA build/gemma4)"); return; }
    /* draft: the first round's logits = transformers' */
    if (!golden_open(&g, "e2b_drafter")) { CHECK(0, "golden"); return; }
    prompt = golden_ids(&g, "long_prompt", &n);
    ref = golden_f32(&g, "long_draft_logits", &numel);
    golden_ids(&g, "long_draft_ids", &K);
    for (i = 0; prompt && i < n; i++) k += snprintf(ids + k, sizeof ids - (size_t)k, "%s%d", i ? "," : "", (int)prompt[i]);
    snprintf(cmd, sizeof cmd, "%s draft %s --drafter %s --ids %s --steps %d --out %s/d.bin", g_cli, tiny("e2b_like"),
             tiny("e2b_drafter"), ids, K, g_tmp);
    CHECK(run_cli("", cmd, a, sizeof a, NULL, NULL, 0) == 0, "%s", cmd);
    got = (float *)(void *)slurp(path2(g_tmp, "d.bin"), &len);
    CHECK(got && ref && len == sizeof(float) * (size_t)numel, "draft wrote %lu bytes", (unsigned long)len);
    for (i = 0; got && ref && len == sizeof(float) * (size_t)numel && i < K; i++) {
        const float *r = ref + (size_t)i * 512;
        double d = max_diff(got + (size_t)i * 512, r, 512), sc = max_abs(r, 512);
        CHECK(d <= (i ? TOL_CHAINED : TOL) * sc, "draft CLI step %d: %.3g relative", i, d / sc);
    }
    CHECK(strstr(a, "drafted:"), "draft printed '%s'", a);
    free(got);
    g4_model_free(&g.m);
    /* greedy with a drafter prints what greedy prints; the counts on stderr */
    snprintf(cmd, sizeof cmd, "%s greedy %s --ids 2,18,101,5,77,300,9,44,12,3 --new 25", g_cli, tiny("31b_like"));
    CHECK(run_cli("", cmd, a, sizeof a, NULL, NULL, 0) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s greedy %s --ids 2,18,101,5,77,300,9,44,12,3 --new 25 --drafter %s --draft-tokens 3",
             g_cli, tiny("31b_like"), tiny("31b_drafter"));
    CHECK(run_cli("", cmd, b, sizeof b, NULL, e, sizeof e) == 0, "%s", cmd);
    CHECK(strcmp(a, b) == 0, "greedy '%s' vs with a drafter '%s'", a, b);
    CHECK(strstr(e, "drafted ") && strstr(e, "accepted ") && strstr(e, "target steps "), "counts: '%s'", e);
    /* generate and chat, greedy (--temp 0): the same text with and without a drafter */
    snprintf(cmd, sizeof cmd, "%s generate %s --tokenizer %s/tokenizer --chat --prompt 'Tell me about the sea' --temp 0 "
             "--max-tokens 30", g_cli, tiny("e2b_like"), g_data);
    CHECK(run_cli("", cmd, a, sizeof a, NULL, NULL, 0) == 0, "%s", cmd);
    strncat(cmd, " --drafter ", sizeof cmd - strlen(cmd) - 1);
    strncat(cmd, tiny("e2b_drafter"), sizeof cmd - strlen(cmd) - 1);
    CHECK(run_cli("", cmd, b, sizeof b, NULL, e, sizeof e) == 0, "%s", cmd);
    CHECK(strlen(a) > 1 && strcmp(a, b) == 0, "generate '%s' vs with a drafter '%s'", a, b);
    CHECK(strstr(e, "drafted "), "generate counts: '%s'", e);
    snprintf(cmd, sizeof cmd, "printf 'Hello!\\nAnd again?\\n/reset\\nOnce more\\n' | %s chat %s --tokenizer %s/tokenizer "
             "--temp 0 --max-tokens 9", g_cli, tiny("e2b_like"), g_data);
    CHECK(run_cli("", cmd, a, sizeof a, NULL, NULL, 0) == 0, "%s", cmd);
    strncat(cmd, " --drafter ", sizeof cmd - strlen(cmd) - 1);
    strncat(cmd, tiny("e2b_drafter_plain"), sizeof cmd - strlen(cmd) - 1);
    strncat(cmd, " --draft-tokens 2", sizeof cmd - strlen(cmd) - 1);
    CHECK(run_cli("", cmd, b, sizeof b, NULL, e, sizeof e) == 0, "%s", cmd);
    CHECK(strlen(a) > 3 && strcmp(a, b) == 0, "chat '%s' vs with a drafter '%s'", a, b);
    /* errors: a usage line, a mismatched drafter named */
    snprintf(cmd, sizeof cmd, "%s draft %s --ids 2,3 --steps 2 --out %s/x.bin", g_cli, tiny("e2b_like"), g_tmp);
    CHECK(run_cli("", cmd, NULL, 0, NULL, e, sizeof e) == 1 && strstr(e, "usage:"), "draft without --drafter: '%s'", e);
    snprintf(cmd, sizeof cmd, "%s greedy %s --ids 2,3 --new 4 --drafter %s", g_cli, tiny("e4b_like"), tiny("e2b_drafter"));
    CHECK(run_cli("", cmd, NULL, 0, NULL, e, sizeof e) == 1 && strstr(e, "cannot read target layer"), "mismatch: '%s'", e);
    snprintf(cmd, sizeof cmd, "%s greedy %s --ids 2,3 --new 4 --drafter %s --draft-tokens 0", g_cli, tiny("e2b_like"),
             tiny("e2b_drafter"));
    CHECK(run_cli("", cmd, NULL, 0, NULL, e, sizeof e) == 1 && strstr(e, "--draft-tokens 0: must be an integer in [1, 1024]"),
          "--draft-tokens 0: '%s'", e);
}

int main(int argc, char **argv) {
    int rc;
    if (argc > 1) g_data = argv[1];
    if (argc > 2) g_cli = argv[2];
    if (!h_tmpdir(g_tmp, sizeof g_tmp, "drafter")) return 1;
    run("drafter: first-round logits and drafts = transformers 5.20.2", test_first_round_goldens);
    run("drafter: bf16 mode's first-round logits = transformers 5.20.2 in bf16", test_first_round_bf16_golden);
    run("drafter: a 5-step chained round for an E4B-shaped target (f32 and bf16) and its assisted output", test_chained_golden);
    run("drafter: assisted greedy = transformers' assisted output = greedy", test_assisted_goldens);
    run("speculative greedy = greedy, forced drafts right for 0..k at every target", test_forced_every_offset);
    run("rewind: recompute is bit-identical, sliding ring limit, range", test_rewind_recompute_exact);
    run("drafter: validation against the target, reads checked, reset detected", test_drafter_validation);
    run("speculative: setup errors", test_spec_errors);
    run("speculative sampling: the output distribution is the target's", test_spec_sampling_distribution);
    run("drafter checkpoint: token_ordering must be an integer permutation", test_bad_token_ordering);
    run("cli: draft, greedy/generate/chat --drafter", test_cli);
    remove_tree(g_tmp);
    rc = finish();
    return rc;
}
