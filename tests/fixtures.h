/* fixtures.h - what the test suites share: where the data is, the goldens
   (safetensors written by transformers, read with the library's own reader),
   float comparisons, and a small safetensors writer for test checkpoints.
   Include after gemma4.h (with GEMMA4_IMPLEMENTATION) and harness.h. */
#ifndef G4_TEST_FIXTURES_H
#define G4_TEST_FIXTURES_H

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------- helpers */

static const char *g_data = "data";
static char g_tmp[256];

/* "a/b" in one of 8 rotating buffers (so results can nest). */
H_UNUSED static const char *path2(const char *a, const char *b) {
    static char buf[8][512];
    static int k;
    size_t la = strlen(a), lb = strlen(b);
    k = (k + 1) % 8;
    if (la + lb + 2 > sizeof buf[k]) return "path-too-long";
    memcpy(buf[k], a, la);
    buf[k][la] = '/';
    memcpy(buf[k] + la + 1, b, lb + 1);
    return buf[k];
}

H_UNUSED static const char *tiny(const char *name) { return path2(g_data, path2("tiny", name)); }
H_UNUSED static const char *dumpfile(const char *name) { return path2(g_data, path2("dumps", name)); }

/* A golden file is a safetensors file: reuse the library's parser. */
typedef struct { g4_model m; int ok; } golden;

/* data/tiny/<model>/<file> */
H_UNUSED static int golden_open_file(golden *g, const char *model, const char *file) {
    memset(g, 0, sizeof *g);
    if (g4__add_file(&g->m, tiny(model), file) != G4_OK || g4__st_finish(&g->m) != G4_OK) {
        printf("  cannot read %s/%s: %s\n", tiny(model), file, g->m.error);
        g4_model_free(&g->m);
        return 0;
    }
    return g->ok = 1;
}

H_UNUSED static int golden_open(golden *g, const char *model) { return golden_open_file(g, model, "golden.safetensors"); }

H_UNUSED static const float *golden_f32(golden *g, const char *name, int64_t *numel) {
    const g4_tensor *t = g4_model_tensor(&g->m, name);
    int k;
    if (!t || t->dtype != G4_F32) return NULL;
    *numel = 1;
    for (k = 0; k < t->ndim; k++) *numel *= t->shape[k];
    return (const float *)t->data; /* safetensors data is 8-byte aligned in these files */
}

H_UNUSED static const int32_t *golden_ids(golden *g, const char *name, int *n) {
    const g4_tensor *t = g4_model_tensor(&g->m, name);
    *n = 0;
    if (!t || t->dtype != G4_I32 || t->ndim != 1) return NULL;
    *n = (int)t->shape[0];
    return (const int32_t *)t->data;
}

H_UNUSED static double max_abs(const float *a, size_t n) {
    double m = 0;
    size_t i;
    for (i = 0; i < n; i++) if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

H_UNUSED static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d) m = d != d ? INFINITY : d;
    }
    return m;
}

/* Minimal safetensors writer for building test checkpoints. */
typedef struct { const char *name; const char *dtype; int ndim; int64_t shape[4]; const void *data; size_t bytes; } st_entry;

H_UNUSED static int st_write(const char *path, const st_entry *e, int n, const char *extra_header) {
    FILE *f = fopen(path, "wb");
    char *hdr = (char *)malloc(1 << 20);
    size_t hl = 0, off = 0;
    uint64_t len;
    int i, k;
    unsigned char pad = ' ';
    if (!f || !hdr) { if (f) fclose(f); free(hdr); return 0; }
    hl += (size_t)sprintf(hdr + hl, "{");
    for (i = 0; i < n; i++) {
        hl += (size_t)sprintf(hdr + hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", e[i].name, e[i].dtype);
        for (k = 0; k < e[i].ndim; k++) hl += (size_t)sprintf(hdr + hl, "%s%lld", k ? "," : "", (long long)e[i].shape[k]);
        hl += (size_t)sprintf(hdr + hl, "],\"data_offsets\":[%lu,%lu]}", (unsigned long)off, (unsigned long)(off + e[i].bytes));
        off += e[i].bytes;
    }
    if (extra_header) hl += (size_t)sprintf(hdr + hl, "%s", extra_header);
    hl += (size_t)sprintf(hdr + hl, "}");
    while (hl % 8) hdr[hl++] = (char)pad;
    len = hl;
    for (k = 0; k < 8; k++) fputc((int)((len >> (8 * k)) & 0xff), f);
    fwrite(hdr, 1, hl, f);
    for (i = 0; i < n; i++) fwrite(e[i].data, 1, e[i].bytes, f);
    fclose(f);
    free(hdr);
    return 1;
}

H_UNUSED static const char *dtype_str(g4_dtype t) {
    return t == G4_BF16 ? "BF16" : t == G4_F16 ? "F16" : t == G4_F32 ? "F32" : t == G4_I32 ? "I32" : "I64";
}

H_UNUSED static void copy_file(const char *from, const char *to) {
    char *text;
    size_t len;
    char err[G4_ERROR_MAX];
    FILE *f;
    if (g4__read_file(from, &text, &len, 1 << 26, err) != G4_OK) return;
    f = fopen(to, "wb");
    if (f) { fwrite(text, 1, len, f); fclose(f); }
    free(text);
}

/* Writes dir/model.safetensors and config.json = those of tiny model `model`,
   each of `extra` in place of the tensor of its name, or after them. */
H_UNUSED static int rewrite_checkpoint(const char *model, const char *dir, const st_entry *extra, int n_extra) {
    g4_model m;
    st_entry *e;
    char *used = (char *)calloc((size_t)n_extra + 1, 1);
    int i, j, n = 0, ok;
    memset(&m, 0, sizeof m);
    if (g4__add_file(&m, tiny(model), "model.safetensors") != G4_OK) { free(used); g4_model_free(&m); return 0; }
    e = (st_entry *)malloc(sizeof(st_entry) * (size_t)(m.n_tensors + n_extra));
    for (i = 0; i < m.n_tensors; i++) {
        const g4__stinfo *st = &m.tensors[i];
        e[n].name = st->name;
        e[n].dtype = dtype_str(st->t.dtype);
        e[n].ndim = st->t.ndim;
        memcpy(e[n].shape, st->t.shape, sizeof e[n].shape);
        e[n].data = st->t.data;
        e[n].bytes = (size_t)(st->end - st->begin);
        for (j = 0; j < n_extra; j++)
            if (!used[j] && strcmp(extra[j].name, st->name) == 0) {
                e[n] = extra[j];
                used[j] = 1;
            }
        n++;
    }
    for (i = 0; i < n_extra; i++)
        if (!used[i]) e[n++] = extra[i];
    free(used);
    mkdir(dir, 0755);
    ok = st_write(path2(dir, "model.safetensors"), e, n, NULL);
    copy_file(path2(tiny(model), "config.json"), path2(dir, "config.json"));
    free(e);
    g4_model_free(&m);
    return ok;
}


/* One KV head's attention, the long-context checks' case: q [G][D], k and v [N][D] normal draws
   (Box-Muller from the xorshift *rng; q and k of standard deviation sigma, v of mean 1, so no
   cancellation hides the sums' rounding); ref [G][D] the float64 softmax(q k^T) v (p: N doubles of
   scratch, ref zeroed by the caller) and ex [G][D] gemma4.h's exact g4__attend over one slot
   (scores: G N floats). */
H_UNUSED static void attention_case(uint64_t *rng, int G, int N, int D, double sigma, float *q, float *k, float *v,
                                    double *p, double *ref, float *ex, float *scores) {
    g4_kv_slot sl;
    int i, h, j, d;
    for (i = 0; i < G * D + 2 * N * D; i++) {
        double u1, u2, z;
        *rng ^= *rng << 13; *rng ^= *rng >> 7; *rng ^= *rng << 17;
        u1 = ((*rng >> 11) + 0.5) / 9007199254740992.0;
        *rng ^= *rng << 13; *rng ^= *rng >> 7; *rng ^= *rng << 17;
        u2 = ((*rng >> 11) + 0.5) / 9007199254740992.0;
        z = sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
        if (i < G * D) q[i] = (float)(z * sigma);
        else if (i < G * D + N * D) k[i - G * D] = (float)(z * sigma);
        else v[i - G * D - N * D] = (float)(z + 1.0);
    }
    for (h = 0; h < G; h++) {
        double m = -INFINITY, sum = 0;
        for (j = 0; j < N; j++) {
            double sc = 0;
            for (d = 0; d < D; d++) sc += (double)q[h * D + d] * k[(size_t)j * D + d];
            p[j] = sc;
            if (sc > m) m = sc;
        }
        for (j = 0; j < N; j++) sum += (p[j] = exp(p[j] - m));
        for (j = 0; j < N; j++)
            for (d = 0; d < D; d++) ref[h * D + d] += p[j] / sum * v[(size_t)j * D + d];
    }
    sl = g4__kv_slot_of(1, D, N, k, v);
    g4__attend(ex, q, G, &sl, 0, 0, N - 1, scores, 0); /* the exact mode's bits */
}

#endif /* G4_TEST_FIXTURES_H */
