/* compare.h - gemma4.h's activations against a dump, tap by tap.

   The dump is a safetensors file with `input_ids` (I32 [S]) and one [S, cols]
   tensor per tap name (see g4_tap_fn in gemma4.h), float32 or bfloat16, as
   written by tools/hf_dump.py from transformers, or by any other runtime.
   Used by `build/gemma4 compare` and by the tests. Include after gemma4.h with
   GEMMA4_IMPLEMENTATION (it reads the dump with the library's own reader).

       g4cmp c;
       g4cmp_open(&c, "dump.safetensors");       // ids in c.ids, c.n_ids
       session config: tap = g4cmp_tap, tap_user = &c, bf16 = c.bf16
       g4_forward(&s, c.ids, c.n_ids, logits, G4_LOGITS_ALL);
       first_bad = g4cmp_report(&c, tolerance, stdout);
       g4cmp_close(&c);

   Error of a tap: max |ours - ref| over its rows, and that divided by
   max |ref| over the whole reference tensor ("rel"); a tap is over tolerance
   when rel > tolerance. */
#ifndef G4_COMPARE_TOL
#define G4_COMPARE_TOL
/* Default tolerances (relative to the largest reference value of each tap):
   float32 reference vs float32 gemma4.h: summation order only; the tiny goldens
   stay below 1.1e-5 and a 35-layer model accumulates more, so 1e-4. A bf16
   reference vs the bf16-faithful mode: on the tiny models the logits agree
   exactly or to 2.8e-3, but one bf16 ulp is 2^-8 = 3.9e-3 relative and a
   single flipped rounding propagates through a deep model, so 3e-2. A real
   bug shows as 1e-1 or more (a wrong KV owner: 1.2). */
#define G4CMP_TOL_F32 1e-4
#define G4CMP_TOL_BF16 3e-2
#endif /* G4_COMPARE_TOL */

/* G4CMP_TOL_ONLY: the tolerances alone (a test that bounds its own comparisons by them) */
#if !defined(G4_COMPARE_H) && !defined(G4CMP_TOL_ONLY)
#define G4_COMPARE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char name[96];
    int cols, rows;     /* rows compared so far */
    int present;        /* 0: the dump has no such tensor; -1: its shape differs */
    double max_abs, ref_max;
} g4cmp_row;

typedef struct {
    g4_model dump;      /* the dump file, through the library's safetensors reader */
    const int32_t *ids;
    int n_ids;
    int bf16;           /* the dump's logits are bfloat16 */
    g4cmp_row *rows;
    int n_rows, cap;
    char error[G4_ERROR_MAX];
} g4cmp;

static g4_result g4cmp_open(g4cmp *c, const char *path) {
    const g4_tensor *ids, *lg;
    const char *slash = strrchr(path, '/');
    char dir[1024];
    g4_result r;
    memset(c, 0, sizeof *c);
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else snprintf(dir, sizeof dir, ".");
    if ((r = g4__add_file(&c->dump, dir, slash ? slash + 1 : path)) != G4_OK || (r = g4__st_finish(&c->dump)) != G4_OK) {
        snprintf(c->error, sizeof c->error, "%s", c->dump.error);
        return r;
    }
    ids = g4_model_tensor(&c->dump, "input_ids");
    if (!ids || ids->dtype != G4_I32 || ids->ndim != 1 || ids->shape[0] < 1 || ((uintptr_t)ids->data & 3)) {
        snprintf(c->error, sizeof c->error, "%s: needs an aligned I32 tensor 'input_ids' [S]", path);
        return G4_ERR_INPUT;
    }
    c->ids = (const int32_t *)ids->data;
    c->n_ids = (int)ids->shape[0];
    lg = g4_model_tensor(&c->dump, "logits");
    c->bf16 = lg && lg->dtype == G4_BF16;
    return G4_OK;
}

static void g4cmp_close(g4cmp *c) {
    g4_model_free(&c->dump);
    free(c->rows);
    c->rows = NULL;
}

static g4cmp_row *g4cmp_row_for(g4cmp *c, const char *name) {
    int i;
    for (i = 0; i < c->n_rows; i++)
        if (strcmp(c->rows[i].name, name) == 0) return &c->rows[i];
    if (c->n_rows == c->cap) {
        int cap = c->cap ? 2 * c->cap : 256;
        g4cmp_row *nr = (g4cmp_row *)realloc(c->rows, sizeof(g4cmp_row) * (size_t)cap);
        if (!nr) return NULL;
        c->rows = nr;
        c->cap = cap;
    }
    memset(&c->rows[c->n_rows], 0, sizeof(g4cmp_row));
    snprintf(c->rows[c->n_rows].name, sizeof c->rows[c->n_rows].name, "%s", name);
    return &c->rows[c->n_rows++];
}

/* The g4_tap_fn: compares this step's rows [pos0, pos0+rows) with the dump. */
static void g4cmp_tap(void *user, const char *name, int layer, const float *data, int rows, int cols, int pos0) {
    g4cmp *c = (g4cmp *)user;
    g4cmp_row *row = g4cmp_row_for(c, name);
    const g4_tensor *ref = g4_model_tensor(&c->dump, name);
    size_t i, n, off;
    (void)layer;
    if (!row) return;
    row->cols = cols;
    row->rows += rows;
    if (!ref) { row->present = 0; return; }
    if (ref->ndim != 2 || ref->shape[1] != cols || ref->shape[0] < pos0 + rows ||
        (ref->dtype != G4_F32 && ref->dtype != G4_BF16 && ref->dtype != G4_F16)) {
        row->present = -1;
        return;
    }
    row->present = 1;
    if (row->ref_max == 0.0)
        for (i = 0, n = (size_t)ref->shape[0] * (size_t)cols; i < n; i++) {
            double v = fabs((double)g4__get(ref, i));
            if (v > row->ref_max) row->ref_max = v;
        }
    for (i = 0, off = (size_t)pos0 * (size_t)cols, n = (size_t)rows * (size_t)cols; i < n; i++) {
        double d = fabs((double)data[i] - (double)g4__get(ref, off + i));
        if (!(d <= row->max_abs)) row->max_abs = d; /* NaN sticks */
    }
}

static double g4cmp_rel(const g4cmp_row *r) { return r->ref_max > 0 ? r->max_abs / r->ref_max : r->max_abs; }

/* Prints one row per tap in forward order; returns the index of the first tap
   over tolerance (or with a missing/mismatched reference counted as a pass
   only when absent), or -1 when every compared tap is within tolerance. */
static int g4cmp_report(const g4cmp *c, double tol, FILE *f) {
    int i, first = -1, over = 0, compared = 0;
    fprintf(f, "%-48s %-12s %12s %12s\n", "tap", "shape", "max abs", "max rel");
    for (i = 0; i < c->n_rows; i++) {
        const g4cmp_row *r = &c->rows[i];
        char shape[32];
        snprintf(shape, sizeof shape, "%dx%d", r->rows, r->cols);
        if (r->present == 0) { fprintf(f, "%-48s %-12s %12s %12s  (not in dump)\n", r->name, shape, "-", "-"); continue; }
        if (r->present < 0) {
            fprintf(f, "%-48s %-12s %12s %12s  shape differs in dump%s\n", r->name, shape, "-", "-", first < 0 ? "  <== first" : "");
            if (first < 0) first = i;
            over++;
            continue;
        }
        compared++;
        {
            double rel = g4cmp_rel(r);
            int bad = !(rel <= tol);
            fprintf(f, "%-48s %-12s %12.3g %12.3g%s\n", r->name, shape, r->max_abs, rel,
                    bad ? (first < 0 ? "  <== first over tolerance" : "  over") : "");
            if (bad && first < 0) first = i;
            over += bad;
        }
    }
    fprintf(f, "%d taps compared, %d over tolerance %g%s%s\n", compared, over, tol, first >= 0 ? "; first: " : "",
            first >= 0 ? c->rows[first].name : "");
    return first;
}

#endif /* G4_COMPARE_H, !G4CMP_TOL_ONLY */
