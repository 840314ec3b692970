/* Two sessions on one loaded model, run from two threads at once, give
   bit-identical logits to the same sessions run one at a time; and one golden
   check against transformers first. `make tsan` runs this under
   ThreadSanitizer, `make valgrind` under memcheck. Only this test links
   -pthread: the library itself has no thread dependency.

       build/test_threads [DATA_DIR]          last line: "N passed, M failed" */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *g_data = "data";

#include "harness.h"

static const char *tiny(const char *name, const char *file) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/tiny/%s%s%s", g_data, name, file ? "/" : "", file ? file : "");
    return buf[k];
}

/* ------------------------------------------------------------- golden */

/* input_ids and logits of a model's golden.safetensors (the library's own
   parser reads it; the model struct only holds the file). */
typedef struct { g4_model f; const int32_t *ids; int n; const float *logits; } golden;

static int golden_open(golden *g, const char *model) {
    const g4_tensor *t;
    memset(g, 0, sizeof *g);
    if (g4__add_file(&g->f, tiny(model, NULL), "golden.safetensors") != G4_OK || g4__st_finish(&g->f) != G4_OK) {
        printf("  golden %s: %s\n", model, g->f.error);
        return 0;
    }
    if (!(t = g4_model_tensor(&g->f, "input_ids")) || t->dtype != G4_I32 || t->ndim != 1) return 0;
    g->ids = (const int32_t *)t->data;
    g->n = (int)t->shape[0];
    if (!(t = g4_model_tensor(&g->f, "logits")) || t->dtype != G4_F32) return 0;
    g->logits = (const float *)t->data;
    return 1;
}

/* All logits [n][V] of ids through a fresh session (max_chunk `chunk`). */
static float *run_session(const g4_model *m, const int32_t *ids, int n, int chunk, char *err) {
    g4_session_config sc = g4_session_config_init();
    g4_session s;
    size_t bytes;
    void *arena;
    float *out;
    sc.max_context = n;
    sc.max_chunk = chunk;
    if (g4_session_size(m, &sc, &bytes) != G4_OK) { strcpy(err, "session size"); return NULL; }
    arena = malloc(bytes);
    out = (float *)malloc(sizeof(float) * (size_t)n * (size_t)m->config.vocab_size);
    if (!arena || !out || g4_session_init(&s, m, &sc, arena, bytes) != G4_OK ||
        g4_forward(&s, ids, n, out, G4_LOGITS_ALL) != G4_OK) {
        snprintf(err, G4_ERROR_MAX, "%s", s.error);
        free(arena);
        free(out);
        return NULL;
    }
    free(arena);
    return out;
}

static void test_golden_e2b_like(void) {
    golden g;
    g4_model m;
    char err[G4_ERROR_MAX] = "";
    float *out;
    size_t i, cnt;
    double d = 0, scale = 0;
    if (!golden_open(&g, "e2b_like")) { CHECK(0, "golden"); g4_model_free(&g.f); return; }
    if (g4_model_load(&m, tiny("e2b_like", NULL)) != G4_OK) { CHECK(0, "%s", m.error); g4_model_free(&g.f); return; }
    out = run_session(&m, g.ids, g.n, 0, err);
    CHECK(out != NULL, "%s", err);
    if (out) {
        cnt = (size_t)g.n * (size_t)m.config.vocab_size;
        for (i = 0; i < cnt; i++) {
            if (fabs(g.logits[i]) > scale) scale = fabs(g.logits[i]);
            if (!(fabs((double)out[i] - g.logits[i]) <= d)) d = fabs((double)out[i] - g.logits[i]);
        }
        printf("  e2b_like: %d tokens, max diff %.3g of max |logit| %.3g\n", g.n, d, scale);
        CHECK(d <= 2e-5 * scale, "logits differ from transformers by %.3g", d);
    }
    free(out);
    g4_model_free(&m);
    g4_model_free(&g.f);
}

/* ------------------------------------------------------------- threads */

typedef struct {
    const g4_model *m;
    const int32_t *ids;
    int n, chunk, rounds;
    const float *want;   /* the one-at-a-time logits */
    int mismatches;
    char err[G4_ERROR_MAX];
} job;

static void *worker(void *arg) {
    job *j = (job *)arg;
    int r;
    for (r = 0; r < j->rounds; r++) {
        float *out = run_session(j->m, j->ids, j->n, j->chunk, j->err);
        if (!out || memcmp(out, j->want, sizeof(float) * (size_t)j->n * (size_t)j->m->config.vocab_size) != 0)
            j->mismatches++;
        free(out);
    }
    return NULL;
}

static void check_two_threads(const char *model) {
    golden g;
    g4_model m;
    int32_t rev[64];
    float *ref_a, *ref_b;
    job a, b;
    pthread_t ta, tb;
    int k;
    char err[G4_ERROR_MAX] = "";
    if (!golden_open(&g, model)) { CHECK(0, "golden %s", model); g4_model_free(&g.f); return; }
    if (g4_model_load(&m, tiny(model, NULL)) != G4_OK) { CHECK(0, "%s", m.error); g4_model_free(&g.f); return; }
    if (g.n > 64) g.n = 64;
    for (k = 0; k < g.n; k++) rev[k] = g.ids[g.n - 1 - k]; /* a different sequence for the second session */
    /* one at a time */
    ref_a = run_session(&m, g.ids, g.n, 3, err);
    ref_b = run_session(&m, rev, g.n, 5, err);
    CHECK(ref_a && ref_b, "%s: %s", model, err);
    if (ref_a && ref_b) {
        memset(&a, 0, sizeof a);
        a.m = &m; a.ids = g.ids; a.n = g.n; a.chunk = 3; a.rounds = 3; a.want = ref_a;
        b = a;
        b.ids = rev; b.chunk = 5; b.want = ref_b;
        /* both at once, on the one model */
        CHECK(pthread_create(&ta, NULL, worker, &a) == 0 && pthread_create(&tb, NULL, worker, &b) == 0, "threads");
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        CHECK(a.mismatches == 0 && b.mismatches == 0, "%s: %d + %d of %d runs differ from one-at-a-time (%s%s)", model,
              a.mismatches, b.mismatches, a.rounds + b.rounds, a.err, b.err);
    }
    free(ref_a);
    free(ref_b);
    g4_model_free(&m);
    g4_model_free(&g.f);
}

static void test_threads_e2b_like(void) { check_two_threads("e2b_like"); }

/* ---------------------------------------------------------------- pool */
/* The pool's parts are claimed, not assigned (>>threads): every part of
   every job runs exactly once, with the job's own fn and ctx, whichever
   thread takes it. A slow part (part 0 sleeps on some jobs) lets the other
   threads take the rest, and a worker late for a job must not run a part
   of the next one: each job has its own ctx and counts, checked after it. */
#define POOL_PARTS 4
#define POOL_JOBS 20000
typedef struct { int job, ran[POOL_PARTS], wrong_n; } pool_job;
static void pool_fn(void *ctx, int part, int n_parts) {
    pool_job *j = (pool_job *)ctx;
    if (n_parts != POOL_PARTS || part < 0 || part >= POOL_PARTS) { __atomic_add_fetch(&j->wrong_n, 1, __ATOMIC_RELAXED); return; }
    if (part == 0 && j->job % 97 == 0) { struct timespec ts = {0, 2000000}; nanosleep(&ts, NULL); }
    __atomic_add_fetch(&j->ran[part], 1, __ATOMIC_RELAXED);
}
static void test_pool_claims(void) {
    g4_pool *pool = NULL;
    pool_job *jobs = (pool_job *)calloc(POOL_JOBS, sizeof *jobs);
    int k, p, bad = 0;
    CHECK(jobs && g4_pool_create(&pool, POOL_PARTS) == G4_OK, "pool of %d", POOL_PARTS);
    if (!jobs || !pool) { free(jobs); g4_pool_free(pool); return; }
    for (k = 0; k < POOL_JOBS; k++) {
        jobs[k].job = k;
        g4__parallel(pool, pool_fn, &jobs[k]);
        for (p = 0; p < POOL_PARTS; p++) bad += __atomic_load_n(&jobs[k].ran[p], __ATOMIC_RELAXED) != 1;
        bad += jobs[k].wrong_n != 0;
    }
    /* again after every job: a late worker writing into an old job shows here */
    for (k = 0; k < POOL_JOBS; k++)
        for (p = 0; p < POOL_PARTS; p++) bad += __atomic_load_n(&jobs[k].ran[p], __ATOMIC_RELAXED) != 1;
    CHECK(bad == 0, "%d parts ran other than exactly once (%d jobs of %d parts)", bad, POOL_JOBS, POOL_PARTS);
    g4_pool_free(pool);
    free(jobs);
}
static void test_threads_moe(void) { check_two_threads("26b_like"); }

int main(int argc, char **argv) {
    if (argc > 1) g_data = argv[1];
    run("golden e2b_like: one session matches transformers", test_golden_e2b_like);
    run("two threads, one model (e2b_like: PLE, KV sharing) = one at a time", test_threads_e2b_like);
    run("two threads, one model (26b_like: MoE) = one at a time", test_threads_moe);
    run("pool: every part of 20000 jobs runs once, whichever thread claims it", test_pool_claims);
    return finish();
}
