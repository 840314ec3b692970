/* Tests of the text side of gemma4.h: tokenizer.json, the Gemma 4 chat
   layout, the sampler, streaming decode and the generate/tokenize CLI.

   Goldens (tools/make_tokenizer_goldens.py, versions in data/tokenizer/VERSIONS.txt):
     data/tokenizer/tiny_goldens.jsonl    the Python `tokenizers` library on
                                          data/tokenizer/tokenizer.json (512 ids)
     data/tokenizer/gemma3_goldens.jsonl  the same strings on the full Gemma 3
                                          tokenizer, looked for in the ignored folder
                                          data/external/gemma3-tokenizer/ (see docs/text.md),
                                          else in ../shared/data/gemma3-tokenizer/ (CI's
                                          shared data beside the checkout); those tests
                                          skip, saying so, when both are absent)
     data/tokenizer/generate_golden.json  transformers' greedy generate() on
                                          data/tiny/e2b_like from chat-format prompts
   Run from the repository root (make test does). */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include "../gemma4_processing.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define TINY_TOK "data/tokenizer/tokenizer.json"
#define FULL_TOK "data/external/gemma3-tokenizer/tokenizer.json"
#define SHARED_TOK "../shared/data/gemma3-tokenizer/tokenizer.json"
static char g_tmp[256];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------- helpers */

/* The full Gemma 3 tokenizer: data/external/ (a developer's copy), else the
   shared data beside the checkout (CI); NULL, after saying so, when neither
   is there. */
static const char *full_tokenizer(void) {
    if (access(FULL_TOK, R_OK) == 0) return FULL_TOK;
    if (access(SHARED_TOK, R_OK) == 0) return SHARED_TOK;
    skip("neither " FULL_TOK " nor " SHARED_TOK " is there (docs/text.md says where to get it)");
    return NULL;
}

/* A JSON array of integers -> ids (malloc'd); returns the count or -1. */
static int json_ids(const g4__json *j, int arr, int32_t **out) {
    int c, n = 0;
    *out = NULL;
    if (arr < 0 || j->nodes[arr].type != G4__JARR) return -1;
    *out = (int32_t *)malloc(sizeof(int32_t) * (size_t)(j->nodes[arr].count + 1));
    for (c = j->nodes[arr].child; c >= 0; c = j->nodes[c].next) {
        if (j->nodes[c].type != G4__JNUM || !j->nodes[c].is_int) { free(*out); *out = NULL; return -1; }
        (*out)[n++] = (int32_t)j->nodes[c].ival;
    }
    return n;
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, sizeof(int32_t) * na) == 0);
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    size_t i;
    printf("    %s:", label);
    for (i = 0; i < n && i < 40; i++) printf(" %d", (int)ids[i]);
    printf("%s\n", n > 40 ? " ..." : "");
}

/* Encodes text; returns malloc'd ids and their count in *n (NULL on error). */
static int32_t *encode(const g4_tokenizer *t, const char *text, size_t len, int flags, size_t *n) {
    size_t cap = g4_tokenize_max(t, len);
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (cap + 1));
    if (g4_tokenize(t, text, len, flags, ids, cap, n) != G4_OK) { free(ids); return NULL; }
    return ids;
}

/* Decodes ids; returns malloc'd text (NULL on error). */
static char *decode(const g4_tokenizer *t, const int32_t *ids, size_t n, int flags, size_t *len) {
    char *out;
    if (g4_detokenize(t, ids, n, flags, NULL, 0, len) != G4_ERR_INPUT && n) return NULL;
    out = (char *)malloc(*len + 1);
    if (g4_detokenize(t, ids, n, flags, out, *len + 1, len) != G4_OK) { free(out); return NULL; }
    return out;
}

/* The streamed pieces of ids, concatenated (malloc'd; NULL on an error). */
static char *stream(const g4_tokenizer *t, const int32_t *ids, size_t n, int flags, size_t *len) {
    size_t cap = 64, i, k;
    char *out = (char *)malloc(cap);
    const char *piece;
    g4_decode_state st;
    g4_result r = G4_OK;
    memset(&st, 0, sizeof st);
    *len = 0;
    for (i = 0; i <= n && r == G4_OK; i++) {
        r = i < n ? g4_decode_next(t, &st, ids[i], flags, &piece, &k) : g4_decode_flush(&st, &piece, &k);
        if (r != G4_OK) break;
        if (*len + k + 1 > cap) {
            while (*len + k + 1 > cap) cap *= 2;
            out = (char *)realloc(out, cap);
        }
        memcpy(out + *len, piece, k);
        *len += k;
    }
    g4_decode_free(&st);
    if (r != G4_OK) { free(out); return NULL; }
    return out;
}

/* Checks every line of a goldens file against t; *n_text and *n_dec count the lines of each kind. */
static void check_goldens(const g4_tokenizer *t, const char *path, int *n_text, int *n_dec) {
    char err[G4_ERROR_MAX];
    h_jsonl f;
    g4__json j;
    int fails = 0, r;
    *n_text = *n_dec = 0;
    if (h_jsonl_open(&f, path, err) != G4_OK) { CHECK(0, "%s", err); return; }
    while ((r = h_jsonl_next(&f, &j, err)) > 0) {
        int text, dec;
        text = g4__jget(&j, 0, "text");
        dec = g4__jget(&j, 0, "decode_ids");
        if (dec >= 0) { /* decode of arbitrary ids */
            int32_t *ids;
            int n = json_ids(&j, dec, &ids);
            int skip_n = g4__jget(&j, 0, "text_skip");
            size_t l1 = 0, l2 = 0;
            char *d1 = decode(t, ids, (size_t)n, 0, &l1), *d2 = decode(t, ids, (size_t)n, G4_DECODE_SKIP_SPECIAL, &l2);
            int ok = d1 && d2 && l1 == j.nodes[text].len && memcmp(d1, j.nodes[text].str, l1) == 0 &&
                     l2 == j.nodes[skip_n].len && memcmp(d2, j.nodes[skip_n].str, l2) == 0;
            if (!ok && fails++ < 5) { CHECK(0, "decode differs from tokenizers'"); print_ids("ids", ids, (size_t)n); }
            (*n_dec)++;
            free(ids); free(d1); free(d2);
        } else { /* encode, encode with the post-processor, decode, stream */
            int32_t *want, *want_sp, *got, *got_sp;
            int nw = json_ids(&j, g4__jget(&j, 0, "ids"), &want), nws = json_ids(&j, g4__jget(&j, 0, "ids_special"), &want_sp);
            int decoded = g4__jget(&j, 0, "decoded");
            const char *s = j.nodes[text].str;
            size_t sl = j.nodes[text].len, n, nsp, dl = 0, stl = 0;
            char *d, *st;
            got = encode(t, s, sl, 0, &n);
            got_sp = encode(t, s, sl, G4_ENCODE_ADD_SPECIAL, &nsp);
            if (!got || !same_ids(got, n, want, (size_t)nw) || !got_sp || !same_ids(got_sp, nsp, want_sp, (size_t)nws)) {
                if (fails++ < 5) {
                    CHECK(0, "encode of \"%.60s\" (%lu bytes) differs from tokenizers'", s, (unsigned long)sl);
                    print_ids("want", want, (size_t)nw);
                    if (got) print_ids("got ", got, n);
                }
            }
            d = decode(t, want, (size_t)nw, 0, &dl);
            st = stream(t, want, (size_t)nw, 0, &stl);
            if (!d || dl != j.nodes[decoded].len || memcmp(d, j.nodes[decoded].str, dl) != 0)
                { if (fails++ < 5) CHECK(0, "decode of the ids of \"%.60s\" differs from tokenizers'", s); }
            else if (!st || stl != dl || memcmp(st, d, dl) != 0)
                { if (fails++ < 5) CHECK(0, "streamed decode of \"%.60s\" differs from the whole decode", s); }
            (*n_text)++;
            free(want); free(want_sp); free(got); free(got_sp); free(d); free(st);
        }
        g4__json_free(&j);
    }
    if (r < 0) CHECK(0, "%s", err);
    CHECK(fails == 0, "%d golden lines of %s differ", fails, path);
    h_jsonl_close(&f);
}

/* ----------------------------------------------------- tokenizer goldens */

static void test_tiny_goldens(void) {
    g4_tokenizer t;
    int nt, nd;
    if (g4_tokenizer_load(&t, TINY_TOK) != G4_OK) { CHECK(0, "%s", t.error); return; }
    CHECK(t.n_vocab == 512 && t.byte_fallback && t.n_norm == 1 && strcmp(t.split, " ") == 0 && t.n_prefix == 1,
          "tiny tokenizer: n_vocab %d byte_fallback %d", t.n_vocab, t.byte_fallback);
    check_goldens(&t, "data/tokenizer/tiny_goldens.jsonl", &nt, &nd);
    printf("  %d strings encoded and decoded, %d id sequences decoded\n", nt, nd);
    CHECK(nt >= 300 && nd >= 60, "the goldens file is short: %d strings, %d id sequences", nt, nd);
    g4_tokenizer_free(&t);
}

static void test_full_goldens(void) {
    const char *path;
    g4_tokenizer t;
    int nt, nd;
    double t0;
    if (!(path = full_tokenizer())) return;
    t0 = now_s();
    if (g4_tokenizer_load(&t, path) != G4_OK) { CHECK(0, "%s", t.error); return; }
    printf("  loaded %d ids, %d merges, %d added tokens in %.3f s\n", t.n_vocab, t.n_merges, t.n_added, now_s() - t0);
    CHECK(t.n_vocab == 262145 && t.n_merges == 514906 && t.n_added == 6415, "counts");
    check_goldens(&t, "data/tokenizer/gemma3_goldens.jsonl", &nt, &nd);
    printf("  %d strings encoded and decoded, %d id sequences decoded\n", nt, nd);
    CHECK(nt >= 300 && nd >= 60, "the goldens file is short: %d strings, %d id sequences", nt, nd);
    /* Gemma 3 names its turn tokens differently: no Gemma 4 chat */
    CHECK(t.turn_open < 0 && t.bos == 2 && t.eos == 1, "control ids: turn_open %d bos %d eos %d", t.turn_open, t.bos, t.eos);
    g4_tokenizer_free(&t);
}

/* The stream holds a run of byte tokens while it can still be valid UTF-8
   (tokenizers would turn all of it into U+FFFD at one bad byte), lets it out
   when a token ends it, and gives up on it (U+FFFD per byte, at once) when no
   byte to come could make it valid. */
static void test_stream_bytes(void) {
    g4_tokenizer t;
    g4_decode_state st;
    int32_t *ids, a_id;
    size_t n, k, len;
    const char *piece;
    char *whole;
    if (g4_tokenizer_load(&t, TINY_TOK) != G4_OK) { CHECK(0, "%s", t.error); return; }
    ids = encode(&t, "\xF0\x9F\x98\x80", 4, 0, &n); /* U+1F600, not in the tiny vocab */
    CHECK(ids && n == 4, "U+1F600 should be 4 byte tokens, got %lu", (unsigned long)n);
    memset(&st, 0, sizeof st);
    for (k = 0; ids && k < n; k++) {
        CHECK(t.byte_value[ids[k]] >= 0, "id %d is not a byte token", (int)ids[k]);
        CHECK(g4_decode_next(&t, &st, ids[k], 0, &piece, &len) == G4_OK && len == 0 && piece[0] == 0,
              "byte %lu of 4 emitted %lu bytes: the run is open", (unsigned long)k, (unsigned long)len);
    }
    CHECK(g4_decode_flush(&st, &piece, &len) == G4_OK && len == 4 && memcmp(piece, "\xF0\x9F\x98\x80", 5) == 0,
          "the emoji at the flush");
    CHECK(g4_decode_flush(&st, &piece, &len) == G4_OK && len == 0, "a second flush: nothing");
    free(ids);
    a_id = g4_token_id(&t, "a");
    CHECK(a_id >= 0, "'a' is in the vocab");
    {
        /* C3 A9 'a': held, then "é" + "a" at the token; C3 A9 80: lost at 80 (3 x U+FFFD), and
           the next byte of that run, even a valid one, is U+FFFD at once */
        int32_t seq[4];
        seq[0] = t.byte_id[0xC3]; seq[1] = t.byte_id[0xA9];
        CHECK(g4_decode_next(&t, &st, seq[0], 0, &piece, &len) == G4_OK && len == 0, "C3 waits");
        CHECK(g4_decode_next(&t, &st, seq[1], 0, &piece, &len) == G4_OK && len == 0, "C3 A9 is held");
        CHECK(g4_decode_next(&t, &st, a_id, 0, &piece, &len) == G4_OK && len == 3 && memcmp(piece, "\xC3\xA9" "a", 4) == 0,
              "the token lets out the run and itself");
        CHECK(g4_decode_next(&t, &st, seq[0], 0, &piece, &len) == G4_OK && len == 0, "C3 waits");
        CHECK(g4_decode_next(&t, &st, seq[1], 0, &piece, &len) == G4_OK && len == 0, "C3 A9 is held");
        CHECK(g4_decode_next(&t, &st, t.byte_id[0x80], 0, &piece, &len) == G4_OK && len == 9 &&
              memcmp(piece, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 9) == 0, "80 loses the run: 3 x U+FFFD");
        CHECK(g4_decode_next(&t, &st, t.byte_id[0x41], 0, &piece, &len) == G4_OK && len == 3 && memcmp(piece, "\xEF\xBF\xBD", 3) == 0,
              "then 'A' in the same run: U+FFFD");
        CHECK(g4_decode_next(&t, &st, t.bos, G4_DECODE_SKIP_SPECIAL, &piece, &len) == G4_OK && len == 0, "a skipped <bos> does not end the run");
        CHECK(g4_decode_next(&t, &st, t.byte_id[0x41], 0, &piece, &len) == G4_OK && len == 3, "so 'A' is U+FFFD again");
        CHECK(g4_decode_next(&t, &st, a_id, 0, &piece, &len) == G4_OK && len == 1 && piece[0] == 'a', "'a' ends it");
        CHECK(g4_decode_next(&t, &st, t.byte_id[0x41], 0, &piece, &len) == G4_OK && len == 0, "a new run: 'A' is held");
        CHECK(g4_decode_flush(&st, &piece, &len) == G4_OK && len == 1 && piece[0] == 'A', "and flushed");
    }
    {
        /* an invalid run, a token, then an unfinished character at the end */
        int32_t seq[4];
        size_t dl;
        seq[0] = t.byte_id[0xFF]; seq[1] = a_id; seq[2] = t.byte_id[0xE4]; seq[3] = t.byte_id[0xB8];
        CHECK(g4_decode_next(&t, &st, seq[0], 0, &piece, &len) == G4_OK && len == 3 && memcmp(piece, "\xEF\xBF\xBD", 3) == 0,
              "0xFF alone is U+FFFD at once");
        CHECK(g4_decode_next(&t, &st, seq[1], 0, &piece, &len) == G4_OK && len == 1 && piece[0] == 'a', "then 'a'");
        CHECK(g4_decode_next(&t, &st, seq[2], 0, &piece, &len) == G4_OK && len == 0, "E4 waits");
        CHECK(g4_decode_next(&t, &st, seq[3], 0, &piece, &len) == G4_OK && len == 0, "E4 B8 waits");
        CHECK(g4_decode_flush(&st, &piece, &len) == G4_OK && len == 6 && memcmp(piece, "\xEF\xBF\xBD\xEF\xBF\xBD", 6) == 0,
              "an unfinished character flushes as 2 x U+FFFD");
        whole = decode(&t, seq, 4, 0, &dl);
        CHECK(whole && dl == 10 && memcmp(whole, "\xEF\xBF\xBD" "a" "\xEF\xBF\xBD\xEF\xBF\xBD", 10) == 0, "whole decode agrees");
        free(whole);
    }
    CHECK(g4_decode_next(&t, &st, 512, 0, &piece, &len) == G4_ERR_INPUT && len == 0 && piece && !piece[0], "id out of range");
    CHECK(g4_decode_next(&t, &st, a_id, 0, NULL, &len) == G4_ERR_INPUT, "no piece pointer");
    st.n_run = st.run_cap + 1;
    CHECK(g4_decode_next(&t, &st, a_id, 0, &piece, &len) == G4_ERR_INPUT, "a state not from these functions");
    CHECK(g4_decode_flush(&st, &piece, &len) == G4_ERR_INPUT, "flush: a state not from these functions");
    st.n_run = 0;
    g4_decode_free(&st);
    CHECK(st.run == NULL && st.piece == NULL && st.run_cap == 0, "free zeroes the state");
    g4_tokenizer_free(&t);
}

static void test_sizes_and_errors(void) {
    g4_tokenizer t;
    int32_t ids[4], bad = -1;
    size_t n = 99, len = 99;
    char out[8];
    const char *text = "Hello world, hello world";
    if (g4_tokenizer_load(&t, TINY_TOK) != G4_OK) { CHECK(0, "%s", t.error); return; }
    CHECK(g4_tokenize(&t, text, strlen(text), 0, ids, 4, &n) == G4_ERR_INPUT && n > 4,
          "a short buffer: G4_ERR_INPUT and the count needed (%lu)", (unsigned long)n);
    CHECK(g4_tokenize(&t, text, strlen(text), 0, NULL, 0, &n) == G4_ERR_INPUT && n > 4, "size query with no buffer");
    CHECK(g4_tokenize(&t, "", 0, G4_ENCODE_ADD_SPECIAL, ids, 4, &n) == G4_OK && n == 1 && ids[0] == t.bos, "empty text: <bos>");
    CHECK(g4_detokenize(&t, &bad, 1, 0, out, sizeof out, &len) == G4_ERR_INPUT, "negative id");
    ids[0] = g4_token_id(&t, "<turn|>");
    CHECK(ids[0] >= 0 && g4_detokenize(&t, ids, 1, 0, out, 4, &len) == G4_ERR_INPUT && len == 7, "short output: length needed");
    CHECK(g4_detokenize(&t, ids, 1, G4_DECODE_SKIP_SPECIAL, out, sizeof out, &len) == G4_OK && len == 0, "special skipped");
    CHECK(g4_token_id(&t, "<0x41>") == t.byte_id[0x41] && g4_token_id(&t, "no such token") == -1, "g4_token_id");
    g4_tokenizer_free(&t);
    CHECK(g4_tokenizer_load(&t, "data/tokenizer/nonexistent.json") == G4_ERR_IO && strstr(t.error, "nonexistent.json"),
          "missing file: %s", t.error);
}

/* ------------------------------------------------ malformed tokenizer.json */

/* src with the first occurrence of a replaced by b (malloc'd; NULL if absent). */
static char *mutate(const char *src, const char *a, const char *b) {
    const char *p = strstr(src, a);
    size_t la = strlen(a), lb = strlen(b), ls = strlen(src);
    char *out;
    if (!p) return NULL;
    out = (char *)malloc(ls - la + lb + 1);
    memcpy(out, src, (size_t)(p - src));
    memcpy(out + (p - src), b, lb);
    memcpy(out + (p - src) + lb, p + la, ls - (size_t)(p - src) - la + 1);
    return out;
}

/* ------------------------------------------------ byte runs (UTF-8) */
/* data/tokenizer/utf8_goldens.jsonl: byte-token runs, valid UTF-8 or not, decoded
   by tokenizers (an invalid run is U+FFFD for EVERY byte of the run). Checked:
   g4_detokenize with and without G4_DECODE_SKIP_SPECIAL equals the golden; the
   stream's pieces concatenate to it, each piece is valid UTF-8, and after each
   id that ends a run (a token with a string, not a byte token, not skipped) the
   text so far equals g4_detokenize of the ids so far (nothing is held longer
   than an open run). */

/* Streams ids, checking each piece; returns the concatenation (malloc'd) or NULL. */
static char *stream_checked(const g4_tokenizer *t, const int32_t *ids, size_t n, int flags, size_t *len, const char *name) {
    size_t cap = 64, i, k;
    char *out = (char *)malloc(cap);
    const char *piece;
    g4_decode_state st;
    g4_result r;
    int bad = 0;
    memset(&st, 0, sizeof st);
    *len = 0;
    for (i = 0; i <= n && !bad; i++) {
        r = i < n ? g4_decode_next(t, &st, ids[i], flags, &piece, &k) : g4_decode_flush(&st, &piece, &k);
        if (r != G4_OK) { CHECK(0, "%s: stream error %d at id %lu", name, (int)r, (unsigned long)i); bad = 1; break; }
        if (piece[k] != 0) { CHECK(0, "%s: piece %lu is not NUL-terminated at its length %lu", name, (unsigned long)i, (unsigned long)k); bad = 1; }
        if (!g4__utf8_valid((const unsigned char *)piece, k)) { CHECK(0, "%s: piece %lu is not valid UTF-8", name, (unsigned long)i); bad = 1; }
        if (*len + k + 1 > cap) {
            while (*len + k + 1 > cap) cap *= 2;
            out = (char *)realloc(out, cap);
        }
        memcpy(out + *len, piece, k);
        *len += k;
        if (i < n && t->byte_value[ids[i]] < 0 && t->text_off[ids[i]] != G4__TOK_NONE &&
            !((flags & G4_DECODE_SKIP_SPECIAL) && (t->flags[ids[i]] & G4_TOKEN_SPECIAL))) {
            size_t dl;
            char *d = decode(t, ids, i + 1, flags, &dl);
            if (!d || dl != *len || memcmp(d, out, dl) != 0) {
                CHECK(0, "%s: after id %lu of %lu the stream has %lu bytes, the decode of the ids so far %lu", name,
                      (unsigned long)i + 1, (unsigned long)n, (unsigned long)*len, (unsigned long)dl);
                bad = 1;
            }
            free(d);
        }
    }
    g4_decode_free(&st);
    if (bad) { free(out); return NULL; }
    return out;
}

/* Checks the lines of utf8_goldens.jsonl for tokenizer `which`; returns the count. */
static int check_utf8_goldens(const g4_tokenizer *t, const char *which) {
    const char *path = "data/tokenizer/utf8_goldens.jsonl";
    char err[G4_ERROR_MAX];
    h_jsonl file;
    g4__json j;
    int count = 0, fails = 0, r = 0;
    if (h_jsonl_open(&file, path, err) != G4_OK) { CHECK(0, "%s", err); return 0; }
    while (fails < 5 && (r = h_jsonl_next(&file, &j, err)) > 0) {
        int32_t *ids;
        int n, f, tk, nm;
        tk = g4__jget(&j, 0, "tokenizer");
        nm = g4__jget(&j, 0, "name");
        if (tk < 0 || nm < 0) { CHECK(0, "%s: a line without \"tokenizer\" or \"name\"", path); g4__json_free(&j); break; }
        if (strcmp(j.nodes[tk].str, which) != 0) { g4__json_free(&j); continue; }
        n = json_ids(&j, g4__jget(&j, 0, "decode_ids"), &ids);
        for (f = 0; f < 2 && n >= 0; f++) {
            int want = g4__jget(&j, 0, f ? "text_skip" : "text");
            int flags = f ? G4_DECODE_SKIP_SPECIAL : 0;
            const char *name = j.nodes[nm].str;
            size_t dl = 0, sl = 0;
            char *d = decode(t, ids, (size_t)n, flags, &dl), *s = NULL;
            if (!d || want < 0 || dl != j.nodes[want].len || memcmp(d, j.nodes[want].str, dl) != 0) {
                CHECK(0, "%s \"%s\"%s: g4_detokenize differs from tokenizers' (%lu bytes, want %lu)", which, name,
                      f ? " (skip special)" : "", (unsigned long)dl, want < 0 ? 0ul : (unsigned long)j.nodes[want].len);
                print_ids("ids", ids, (size_t)n);
                fails++;
            } else if (!(s = stream_checked(t, ids, (size_t)n, flags, &sl, name)) || sl != dl || memcmp(s, d, dl) != 0) {
                CHECK(0, "%s \"%s\"%s: the streamed pieces differ from the whole decode", which, name, f ? " (skip special)" : "");
                print_ids("ids", ids, (size_t)n);
                fails++;
            }
            free(d); free(s);
        }
        if (n < 0) { CHECK(0, "%s: bad decode_ids", path); fails++; }
        free(ids);
        count++;
        g4__json_free(&j);
    }
    if (r < 0) CHECK(0, "%s", err);
    h_jsonl_close(&file);
    return count;
}

static void test_utf8_goldens(void) {
    g4_tokenizer t;
    char *src, *m, err[G4_ERROR_MAX];
    size_t len;
    int n;
    if (g4_tokenizer_load(&t, TINY_TOK) != G4_OK) { CHECK(0, "%s", t.error); return; }
    n = check_utf8_goldens(&t, "tiny");
    g4_tokenizer_free(&t);
    printf("  %d byte-run sequences on the tiny tokenizer\n", n);
    CHECK(n >= 60, "only %d tiny lines", n);
    /* tiny_mut: the tiny file with "<0x0E>" -> "<0x0e>", "<0x0F>" -> "<0x+F>"
       (UTF8_MUTATION in tools/make_tokenizer_goldens.py) */
    if (g4__read_file(TINY_TOK, &src, &len, (size_t)1 << 24, err) != G4_OK) { CHECK(0, "%s", err); return; }
    m = mutate(src, "\"<0x0E>\"", "\"<0x0e>\"");
    free(src);
    src = m ? mutate(m, "\"<0x0F>\"", "\"<0x+F>\"") : NULL;
    free(m);
    if (!src || g4_tokenizer_parse(&t, src, strlen(src), "tiny_mut") != G4_OK) { CHECK(0, "tiny_mut: %s", src ? t.error : "no <0x0E>/<0x0F>"); free(src); return; }
    free(src);
    n = check_utf8_goldens(&t, "tiny_mut");
    CHECK(n >= 3, "only %d tiny_mut lines", n);
    g4_tokenizer_free(&t);
}

static void test_utf8_goldens_full(void) {
    const char *path;
    g4_tokenizer t;
    int n;
    if (!(path = full_tokenizer())) return;
    if (g4_tokenizer_load(&t, path) != G4_OK) { CHECK(0, "%s", t.error); return; }
    n = check_utf8_goldens(&t, "gemma3");
    printf("  %d byte-run sequences on the Gemma 3 tokenizer\n", n);
    CHECK(n >= 60, "only %d gemma3 lines", n);
    g4_tokenizer_free(&t);
}

/* data/tokenizer/added_goldens.jsonl: small files whose added_tokens' ids and
   flags are not what tokenizers makes of them (file ids it ignores, a content
   twice, normalized special tokens, a vocabulary with a hole). Each id decoded
   alone and all together, with and without skip_special_tokens (which
   tokenizers decides by the string an id decodes from), and a few texts
   encoded, must match tokenizers; so must n_vocab (its largest id + 1). */
static void test_added_goldens(void) {
    const char *path = "data/tokenizer/added_goldens.jsonl";
    char err[G4_ERROR_MAX];
    h_jsonl f;
    g4__json j;
    int r, files = 0, checks = 0;
    static g4_tokenizer t;
    if (h_jsonl_open(&f, path, err) != G4_OK) { CHECK(0, "%s", err); return; }
    while ((r = h_jsonl_next(&f, &j, err)) > 0) {
        int js = g4__jget(&j, 0, "json"), nv = g4__jget(&j, 0, "n_vocab"), nm = g4__jget(&j, 0, "name"), e, fl;
        int parts[3] = {g4__jget(&j, 0, "decode"), g4__jget(&j, 0, "decode_all"), g4__jget(&j, 0, "encode")};
        const char *name = nm >= 0 ? j.nodes[nm].str : "?";
        if (js < 0 || nv < 0 || parts[0] < 0 || parts[1] < 0 || parts[2] < 0) { CHECK(0, "%s: a malformed line", f.name); g4__json_free(&j); break; }
        if (g4_tokenizer_parse(&t, j.nodes[js].str, j.nodes[js].len, name) != G4_OK) {
            CHECK(0, "%s: %s", name, t.error);
            g4__json_free(&j);
            continue;
        }
        files++;
        CHECK(t.n_vocab == j.nodes[nv].ival, "%s: n_vocab %d, tokenizers %ld", name, t.n_vocab, (long)j.nodes[nv].ival);
        for (e = j.nodes[parts[0]].child; e >= 0; e = j.nodes[e].next) { /* [id, text, text_skip], and decode_all */
            int32_t id = (int32_t)j.nodes[j.nodes[e].child].ival;
            int want[2];
            want[0] = j.nodes[j.nodes[e].child].next;
            want[1] = j.nodes[want[0]].next;
            for (fl = 0; fl < 2; fl++) {
                size_t dl = 0, sl = 0;
                int flags = fl ? G4_DECODE_SKIP_SPECIAL : 0;
                char *d = decode(&t, &id, 1, flags, &dl), *st = stream(&t, &id, 1, flags, &sl);
                CHECK(d && dl == j.nodes[want[fl]].len && memcmp(d, j.nodes[want[fl]].str, dl) == 0 && st && sl == dl &&
                          memcmp(st, d, dl) == 0,
                      "%s: id %ld%s decodes to \"%.*s\", tokenizers \"%s\"", name, (long)id, fl ? " (skip special)" : "",
                      d ? (int)dl : 0, d ? d : "", j.nodes[want[fl]].str);
                checks++;
                free(d); free(st);
            }
        }
        {
            int32_t *ids;
            int n = json_ids(&j, j.nodes[parts[1]].child, &ids), w = j.nodes[j.nodes[parts[1]].child].next;
            for (fl = 0; fl < 2 && n >= 0; fl++, w = j.nodes[w].next) {
                size_t dl = 0;
                char *d = decode(&t, ids, (size_t)n, fl ? G4_DECODE_SKIP_SPECIAL : 0, &dl);
                CHECK(d && dl == j.nodes[w].len && memcmp(d, j.nodes[w].str, dl) == 0, "%s: all ids%s decode to \"%.*s\", tokenizers \"%s\"",
                      name, fl ? " (skip special)" : "", d ? (int)dl : 0, d ? d : "", j.nodes[w].str);
                checks++;
                free(d);
            }
            free(ids);
        }
        for (e = j.nodes[parts[2]].child; e >= 0; e = j.nodes[e].next) { /* [text, ids] */
            int tx = j.nodes[e].child, nw;
            int32_t *want, *got;
            size_t n = 0;
            nw = json_ids(&j, j.nodes[tx].next, &want);
            got = encode(&t, j.nodes[tx].str, j.nodes[tx].len, 0, &n);
            CHECK(nw >= 0 && got && same_ids(got, n, want, (size_t)nw), "%s: \"%s\" encodes differently from tokenizers", name,
                  j.nodes[tx].str);
            if (nw >= 0 && got && !same_ids(got, n, want, (size_t)nw)) { print_ids("want", want, (size_t)nw); print_ids("got ", got, n); }
            checks++;
            free(want); free(got);
        }
        g4_tokenizer_free(&t);
        g4__json_free(&j);
    }
    if (r < 0) CHECK(0, "%s", err);
    h_jsonl_close(&f);
    printf("  %d files, %d decodes and encodes\n", files, checks);
    CHECK(files >= 14, "only %d files", files);
}

static void test_malformed(void) {
    static const struct { const char *from, *to, *msg; } cases[] = {
        {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model.type"},
        {"\"byte_fallback\": true", "\"byte_fallback\": 1", "model.byte_fallback"},
        {"\"dropout\": null", "\"dropout\": 0.1", "model.dropout"},
        {"\"unk_token\": \"<unk>\"", "\"unk_token\": \"<nope>\"", "model.unk_token"},
        {"\"<pad>\": 0", "\"<pad>\": -1", "model.vocab"},
        {"\"<pad>\": 0", "\"<pad>\": 1", "id 1 is given to two strings"},
        {"\"<pad>\": 0", "\"<pad>\": 99999999", "model.vocab"},
        {"\"merges\": [", "\"merges\": [[\"zz\", \"qq\"], ", "model.merges[0]"},
        {"\"merges\": [", "\"merges\": [[\"a\"], ", "model.merges[0]"},
        {"\"merges\": [", "\"merges\": 3, \"x\": [", "model.merges must be an array"},
        {"\"lstrip\": false", "\"lstrip\": true", "lstrip"},
        {"\"id\": 0,", "\"id\": \"0\",", "added_tokens[].id"},
        {"\"content\": \"<pad>\"", "\"content\": 5", "added_tokens[].content"},
        {"\"type\": \"Replace\"", "\"type\": \"NFKC\"", "normalizer type \"NFKC\""},
        {"\"behavior\": \"MergedWithPrevious\"", "\"behavior\": \"Isolated\"", "pre_tokenizer.behavior"},
        {"\"type\": \"Split\"", "\"type\": \"Metaspace\"", "pre_tokenizer type"},
        {"\"type\": \"ByteFallback\"", "\"type\": \"Strip\"", "decoder type \"Strip\""},
        {"\"type\": \"ByteFallback\"\n   },\n   {\n    \"type\": \"Fuse\"",
         "\"type\": \"Fuse\"\n   },\n   {\n    \"type\": \"ByteFallback\"", "a ByteFallback after Fuse"},
        {"\"type\": \"Fuse\"", "\"type\": \"ByteFallback\"", "a second ByteFallback"},
        {"\"type\": \"TemplateProcessing\"", "\"type\": \"BertProcessing\"", "post_processor type"},
        {"\"ids\": [", "\"ids\": [600, ", "post_processor id 600"},
        {"\"pattern\": {\n   \"String\": \" \"\n  }", "\"pattern\": {\"Regex\": \" \"}", "normalizer: only a Replace with a \"String\""},
    };
    char *src, err[G4_ERROR_MAX];
    size_t len, k;
    unsigned seed = 12345;
    int crashes_checked = 0, ok_after_flip = 0;
    g4_tokenizer t;
    if (g4__read_file(TINY_TOK, &src, &len, (size_t)1 << 24, err) != G4_OK) { CHECK(0, "%s", err); return; }
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *m = mutate(src, cases[k].from, cases[k].to);
        g4_result r;
        if (!m) { CHECK(0, "case %lu: '%s' not found in the tiny tokenizer.json", (unsigned long)k, cases[k].from); continue; }
        r = g4_tokenizer_parse(&t, m, strlen(m), "mut.json");
        CHECK(r != G4_OK && strstr(t.error, "mut.json") && strstr(t.error, cases[k].msg),
              "case %lu (%s): result %d, message \"%s\" should name \"%s\"", (unsigned long)k, cases[k].to, (int)r, t.error,
              cases[k].msg);
        if (r == G4_OK) g4_tokenizer_free(&t);
        free(m);
    }
    CHECK(g4_tokenizer_parse(&t, "[]", 2, "a.json") == G4_ERR_JSON && strstr(t.error, "top level"), "array: %s", t.error);
    CHECK(g4_tokenizer_parse(&t, "{}", 2, "a.json") == G4_ERR_JSON && strstr(t.error, "\"model\""), "no model: %s", t.error);
    /* every truncation is malformed JSON */
    for (k = 1; k < len; k += len / 150 + 1) {
        CHECK(g4_tokenizer_parse(&t, src, k, "trunc.json") == G4_ERR_JSON, "truncated at %lu bytes accepted", (unsigned long)k);
        crashes_checked++;
    }
    /* random byte flips: an error or a working tokenizer, never a crash (ASan/UBSan run this too) */
    for (k = 0; k < 200; k++) {
        char *m = (char *)malloc(len + 1);
        int f;
        memcpy(m, src, len + 1);
        for (f = 0; f < 3; f++) {
            seed = seed * 1103515245u + 12345u;
            m[(seed >> 8) % len] = (char)(seed >> 3);
        }
        if (g4_tokenizer_parse(&t, m, len, "flip.json") == G4_OK) {
            int32_t ids[256];
            size_t n;
            char out[2048];
            ok_after_flip++;
            g4_tokenize(&t, "Hello <|turn> world\n\t\xF0\x9F\x98\x80 \xFF", 26, G4_ENCODE_ADD_SPECIAL, ids, 256, &n);
            if (n <= 256) g4_detokenize(&t, ids, n, 0, out, sizeof out, &n);
            g4_tokenizer_free(&t);
        }
        crashes_checked++;
        free(m);
    }
    printf("  %d truncated or corrupted files parsed without a crash (%d flips still loaded and ran)\n", crashes_checked,
           ok_after_flip);
    free(src);
}

/* ------------------------------------------------------------------ chat */

typedef struct {
    g4__json j;
    char *text;
    int n;
} gen_golden;

static int gen_golden_open(gen_golden *g) {
    size_t len;
    char err[G4_ERROR_MAX];
    memset(g, 0, sizeof *g);
    if (g4__read_file("data/tokenizer/generate_golden.json", &g->text, &len, (size_t)1 << 24, err) != G4_OK ||
        g4__json_parse(&g->j, g->text, len, "generate_golden.json", err) != G4_OK) {
        CHECK(0, "%s", err);
        free(g->text);
        return 0;
    }
    g->n = g->j.nodes[0].count;
    return 1;
}

static int gen_case(gen_golden *g, int k) {
    int c = g->j.nodes[0].child;
    while (k-- > 0 && c >= 0) c = g->j.nodes[c].next;
    return c;
}

static const char *gstr(gen_golden *g, int c, const char *key) {
    int n = g4__jget(&g->j, c, key);
    return n >= 0 && g->j.nodes[n].type == G4__JSTR ? g->j.nodes[n].str : NULL;
}

static const char *gname(gen_golden *g, int c) {
    const char *s = gstr(g, c, "name");
    return s ? s : "?";
}

static void gen_golden_close(gen_golden *g) {
    g4__json_free(&g->j);
    free(g->text);
}

/* The prompt ids of golden case c, built with g4_chat_encode (chat) or <bos> + text. */
static int32_t *golden_prompt(const g4_tokenizer *t, gen_golden *g, int c, size_t *n) {
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * 4096);
    int chat = g4__jget(&g->j, c, "chat") >= 0 && g->j.nodes[g4__jget(&g->j, c, "chat")].type == G4__JTRUE;
    int think = g4__jget(&g->j, c, "thinking") >= 0 && g->j.nodes[g4__jget(&g->j, c, "thinking")].type == G4__JTRUE;
    if (chat) {
        g4_chat_message m[2];
        int nm = 0;
        if (gstr(g, c, "system")) { m[nm].role = "system"; m[nm].content = gstr(g, c, "system"); nm++; }
        m[nm].role = "user"; m[nm].content = gstr(g, c, "user"); nm++;
        if (g4_chat_encode(t, m, nm, G4_CHAT_BOS | G4_CHAT_OPEN_MODEL | (think ? G4_CHAT_THINKING : 0), ids, 4096, n) != G4_OK)
            { free(ids); return NULL; }
    } else {
        const char *p = gstr(g, c, "prompt");
        ids[0] = t->bos;
        if (g4_tokenize(t, p, strlen(p), 0, ids + 1, 4095, n) != G4_OK) { free(ids); return NULL; }
        (*n)++;
    }
    return ids;
}

static void test_chat_layout(void) {
    g4_tokenizer t;
    gen_golden g;
    int k;
    size_t n, n2;
    int32_t *got, *want;
    if (g4_tokenizer_load(&t, TINY_TOK) != G4_OK) { CHECK(0, "%s", t.error); return; }
    if (!gen_golden_open(&g)) { g4_tokenizer_free(&t); return; }
    CHECK(g.n == 3, "3 generate cases");
    for (k = 0; k < g.n; k++) {
        int c = gen_case(&g, k);
        int nw = json_ids(&g.j, g4__jget(&g.j, c, "prompt_ids"), &want);
        got = golden_prompt(&t, &g, c, &n);
        CHECK(got && same_ids(got, n, want, (size_t)nw), "case %s: prompt ids differ from the layout rendered in Python",
              gname(&g, c));
        if (got && !same_ids(got, n, want, (size_t)nw)) { print_ids("want", want, (size_t)nw); print_ids("got ", got, n); }
        free(got);
        free(want);
    }
    /* a later turn: close the model's turn, then the user's, then open the model's */
    {
        g4_chat_message m;
        const char *expect = "<turn|>\n<|turn>user\nAnd now?<turn|>\n<|turn>model\n";
        int32_t a[256], b[256];
        m.role = "user"; m.content = "And now?";
        CHECK(g4_chat_encode(&t, &m, 1, G4_CHAT_CONTINUE | G4_CHAT_OPEN_MODEL, a, 256, &n) == G4_OK, "continue");
        CHECK(g4_tokenize(&t, expect, strlen(expect), 0, b, 256, &n2) == G4_OK && same_ids(a, n, b, n2), "continue layout");
        CHECK(a[0] == t.turn_close && t.turn_close == g4_token_id(&t, "<turn|>") && t.turn_open == g4_token_id(&t, "<|turn>"),
              "ids from the file");
        m.role = "assistant";
        expect = "<bos><|turn>system\n<|think|><turn|>\n<|turn>model\nAnd now?<turn|>\n";
        CHECK(g4_chat_encode(&t, &m, 1, G4_CHAT_BOS | G4_CHAT_THINKING, a, 256, &n) == G4_OK, "assistant");
        CHECK(g4_tokenize(&t, expect, strlen(expect), 0, b, 256, &n2) == G4_OK && same_ids(a, n, b, n2),
              "thinking without a system prompt adds a system turn; assistant is written model");
        CHECK(g4_chat_is_stop(&t, t.eos) && g4_chat_is_stop(&t, t.turn_close) && !g4_chat_is_stop(&t, t.bos) &&
              !g4_chat_is_stop(&t, t.turn_open), "stop on <eos> and <turn|> only");
    }
    gen_golden_close(&g);
    g4_tokenizer_free(&t);
}

/* ---------------------------------------- greedy generation vs transformers */

static void test_generate_greedy(void) {
    g4_tokenizer t;
    g4_model m;
    gen_golden g;
    int k;
    if (g4_tokenizer_load(&t, TINY_TOK) != G4_OK) { CHECK(0, "%s", t.error); return; }
    if (g4_model_load(&m, "data/tiny/e2b_like") != G4_OK) { CHECK(0, "%s", m.error); g4_tokenizer_free(&t); return; }
    if (!gen_golden_open(&g)) { g4_model_free(&m); g4_tokenizer_free(&t); return; }
    for (k = 0; k < g.n; k++) {
        int c = gen_case(&g, k), i, n_new = 0, V = m.config.vocab_size;
        int32_t *want, *prompt, got[64];
        int nw = json_ids(&g.j, g4__jget(&g.j, c, "new_ids"), &want);
        size_t np, tl;
        g4_session_config sc = g4_session_config_init();
        g4_session s;
        g4_sampler smp;
        g4_sampler_config cfg = g4_sampler_config_init();
        size_t bytes;
        void *arena;
        float *logits = (float *)malloc(sizeof(float) * (size_t)V);
        char *text;
        const char *want_text = gstr(&g, c, "new_text");
        prompt = golden_prompt(&t, &g, c, &np);
        sc.max_context = (int)np + 64;
        sc.max_chunk = 16;
        g4_session_size(&m, &sc, &bytes);
        arena = malloc(bytes);
        cfg.temperature = 0; /* greedy */
        if (!prompt || g4_session_init(&s, &m, &sc, arena, bytes) != G4_OK || g4_sampler_init(&smp, &cfg, V) != G4_OK ||
            g4_forward(&s, prompt, (int)np, logits, G4_LOGITS_LAST) != G4_OK) {
            CHECK(0, "setup of case %d", k);
        } else {
            for (i = 0; i < 40; i++) { /* transformers ran max_new_tokens=40, stopping on <eos>/<turn|> */
                int32_t next = g4_sampler_sample(&smp, logits);
                got[n_new++] = next;
                if (g4_chat_is_stop(&t, next) || i == 39) break;
                if (g4_forward(&s, &next, 1, logits, G4_LOGITS_LAST) != G4_OK) { CHECK(0, "%s", s.error); break; }
            }
            CHECK(same_ids(got, (size_t)n_new, want, (size_t)nw), "case %s: greedy tokens differ from transformers generate",
                  gname(&g, c));
            if (!same_ids(got, (size_t)n_new, want, (size_t)nw)) { print_ids("want", want, (size_t)nw); print_ids("got ", got, (size_t)n_new); }
            text = decode(&t, got, (size_t)n_new, G4_DECODE_SKIP_SPECIAL, &tl);
            CHECK(text && want_text && tl == strlen(want_text) && memcmp(text, want_text, tl) == 0,
                  "case %s: decoded text differs from tokenizers'", gname(&g, c));
            free(text);
        }
        g4_sampler_free(&smp);
        free(arena); free(logits); free(prompt); free(want);
    }
    gen_golden_close(&g);
    g4_model_free(&m);
    g4_tokenizer_free(&t);
}

/* ------------------------------------------------------------------- CLI */

static void test_cli(void) {
    static char out[1 << 16], out2[1 << 16], err[8192];
    char cmd[2048];
    size_t len, len2, wl;
    gen_golden g;
    g4_tokenizer t;
    int32_t *want;
    char *want_text;
    int c, nw;
    if (access("build/gemma4", X_OK) != 0) { CHECK(0, "build/gemma4 is not built"); return; }
    /* tokenize: argument and stdin, a model dir or the file; ids of "Hello world" from tiny_goldens.jsonl */
    CHECK(run_cli("build/gemma4", "tokenize data/tokenizer 'Hello world'", out, sizeof out, NULL, NULL, 0) == 0, "tokenize");
    CHECK(strcmp(out, "2 487 332 332 335 402 424\n") == 0, "tokenize: '%s'", out);
    CHECK(run_cli("", "printf 'Hello world' | build/gemma4 tokenize " TINY_TOK, out, sizeof out, NULL, NULL, 0) == 0,
          "tokenize from stdin");
    CHECK(strcmp(out, "2 487 332 332 335 402 424\n") == 0, "tokenize from stdin: '%s'", out);
    CHECK(run_cli("build/gemma4", "tokenize data/nonexistent x", NULL, 0, NULL, NULL, 0) == 1, "missing tokenizer exits 1");
    /* generate: greedy chat case 0 streams transformers' tokens. The text expected is their streamed
       decode (g4_decode_next), which is tokenizers' decode (new_text) wherever the byte runs are
       valid UTF-8; in an invalid run the stream replaces only the bytes that cannot start or continue
       a character, where tokenizers replaces every byte of the run (gemma4.h's documented contract;
       the greedy test above checks g4_detokenize of the same tokens against new_text). */
    if (!gen_golden_open(&g)) return;
    c = gen_case(&g, 0);
    if (g4_tokenizer_load(&t, TINY_TOK) != G4_OK) { CHECK(0, "%s", t.error); gen_golden_close(&g); return; }
    nw = json_ids(&g.j, g4__jget(&g.j, c, "new_ids"), &want);
    want_text = stream(&t, want, (size_t)nw, G4_DECODE_SKIP_SPECIAL, &wl);
    if (nw > 0 && g4_chat_is_stop(&t, want[nw - 1])) nw--; /* the stop token is not counted as generated */
    g4_tokenizer_free(&t);
    free(want);
    if (!want_text) { CHECK(0, "stream of case 0"); gen_golden_close(&g); return; }
    snprintf(cmd, sizeof cmd,
             "generate data/tiny/e2b_like --tokenizer data/tokenizer --chat --system '%s' --think "
             "--prompt '%s' --temp 0 --max-tokens 40",
             gstr(&g, c, "system"), gstr(&g, c, "user"));
    CHECK(run_cli("build/gemma4", cmd, out, sizeof out, &len, err, sizeof err) == 0, "%s", cmd);
    CHECK(len == wl + 1 && memcmp(out, want_text, wl) == 0 && out[len - 1] == '\n', "generate printed '%s', want '%s'", out,
          want_text);
    free(want_text);
    snprintf(cmd, sizeof cmd, "prompt 51 tokens, generated %d tokens; prefill ", nw);
    CHECK(strstr(err, cmd) && strstr(err, "decode "), "generate stats: '%s', want '%s'", err, cmd);
    /* without a tokenizer in the model dir: a clear error */
    CHECK(run_cli("build/gemma4", "generate data/tiny/e2b_like --prompt hi", NULL, 0, NULL, err, sizeof err) == 1 &&
              strstr(err, "--tokenizer"), "no tokenizer: '%s'", err);
    /* sampling from the CLI: one seed, one output */
    snprintf(cmd, sizeof cmd, "generate data/tiny/e2b_like --tokenizer data/tokenizer --prompt 'The sea' --seed 7 --max-tokens 12");
    CHECK(run_cli("build/gemma4", cmd, out, sizeof out, &len, NULL, 0) == 0, "%s", cmd);
    CHECK(run_cli("build/gemma4", cmd, out2, sizeof out2, &len2, NULL, 0) == 0, "%s", cmd);
    CHECK(len == len2 && memcmp(out, out2, len) == 0 && len > 1, "same seed, same text");
    /* chat: two turns through stdin, one session */
    CHECK(run_cli("", "printf 'Hello!\\nAnd again?\\n' | build/gemma4 chat data/tiny/e2b_like --tokenizer data/tokenizer "
                      "--temp 0 --max-tokens 5", NULL, 0, NULL, err, sizeof err) == 0, "chat");
    CHECK(strstr(err, "generated 5 tokens") && strstr(strstr(err, "generated 5 tokens") + 1, "generated 5 tokens"),
          "two chat turns: '%s'", err);
    gen_golden_close(&g);
}

/* The chat loop keeps the KV: the second turn's logits equal a fresh run of the
   whole conversation. */
static void test_chat_keeps_kv(void) {
    g4_tokenizer t;
    g4_model m;
    g4_session_config sc = g4_session_config_init();
    g4_session s1, s2;
    size_t bytes, n1, n2, i;
    void *a1, *a2;
    int32_t t1[256], t2[256], all[512], reply[3];
    float *l1, *l2;
    g4_chat_message u1, u2;
    int V, k;
    double d = 0;
    if (g4_tokenizer_load(&t, TINY_TOK) != G4_OK) { CHECK(0, "%s", t.error); return; }
    if (g4_model_load(&m, "data/tiny/e2b_like") != G4_OK) { CHECK(0, "%s", m.error); g4_tokenizer_free(&t); return; }
    V = m.config.vocab_size;
    sc.max_context = 120;
    g4_session_size(&m, &sc, &bytes);
    a1 = malloc(bytes); a2 = malloc(bytes);
    l1 = (float *)malloc(sizeof(float) * (size_t)V); l2 = (float *)malloc(sizeof(float) * (size_t)V);
    g4_session_init(&s1, &m, &sc, a1, bytes);
    g4_session_init(&s2, &m, &sc, a2, bytes);
    u1.role = "user"; u1.content = "Hello there.";
    u2.role = "user"; u2.content = "Tell me more.";
    g4_chat_encode(&t, &u1, 1, G4_CHAT_BOS | G4_CHAT_OPEN_MODEL, t1, 256, &n1);
    g4_forward(&s1, t1, (int)n1, l1, G4_LOGITS_LAST);
    for (k = 0; k < 3; k++) { /* a short greedy reply */
        reply[k] = g4_argmax(l1, V);
        g4_forward(&s1, &reply[k], 1, l1, G4_LOGITS_LAST);
    }
    g4_chat_encode(&t, &u2, 1, G4_CHAT_CONTINUE | G4_CHAT_OPEN_MODEL, t2, 256, &n2);
    CHECK(g4_forward(&s1, t2, (int)n2, l1, G4_LOGITS_LAST) == G4_OK, "second turn");
    memcpy(all, t1, n1 * sizeof(int32_t));
    memcpy(all + n1, reply, sizeof reply);
    memcpy(all + n1 + 3, t2, n2 * sizeof(int32_t));
    CHECK(g4_forward(&s2, all, (int)(n1 + 3 + n2), l2, G4_LOGITS_LAST) == G4_OK, "whole conversation");
    for (i = 0; i < (size_t)V; i++) d = fabs((double)l1[i] - (double)l2[i]) > d ? fabs((double)l1[i] - (double)l2[i]) : d;
    CHECK(d == 0.0 && s1.pos == s2.pos, "kept KV vs recomputed history: max diff %g, pos %d vs %d", d, s1.pos, s2.pos);
    free(a1); free(a2); free(l1); free(l2);
    g4_model_free(&m);
    g4_tokenizer_free(&t);
}

/* --------------------------------------------------------------- sampler */

/* Counts of each of 4 ids over `draws` samples of logits. */
static void draw(g4_sampler *s, const float *logits, int draws, int counts[4]) {
    int i;
    float l[4];
    counts[0] = counts[1] = counts[2] = counts[3] = 0;
    for (i = 0; i < draws; i++) {
        int32_t id;
        memcpy(l, logits, sizeof l);
        id = g4_sampler_sample(s, l);
        if (id >= 0 && id < 4) counts[id]++;
    }
}

static void test_sampler(void) {
    /* probabilities 0.5, 0.3, 0.15, 0.05 in a shuffled order of ids: 2, 0, 3, 1 */
    float base[4];
    g4_sampler s;
    g4_sampler_config c = g4_sampler_config_init();
    int cnt[4], i;
    int32_t seq1[64], seq2[64];
    float l[4];
    base[2] = logf(0.5f); base[0] = logf(0.3f); base[3] = logf(0.15f); base[1] = logf(0.05f);

    c.temperature = 0;
    g4_sampler_init(&s, &c, 4);
    memcpy(l, base, sizeof l);
    CHECK(g4_sampler_sample(&s, l) == 2, "greedy = argmax");
    g4_sampler_free(&s);

    /* repetition penalty: positive logits divided, negative multiplied (transformers) */
    c.repetition_penalty = 2.0f;
    g4_sampler_init(&s, &c, 4);
    l[0] = 3.0f; l[1] = 2.0f; l[2] = -1.0f; l[3] = 1.0f;
    g4_sampler_accept(&s, 0);
    g4_sampler_accept(&s, 2);
    CHECK(g4_sampler_sample(&s, l) == 1 && l[0] == 1.5f && l[2] == -2.0f && l[1] == 2.0f, "penalty: %g %g %g", l[0], l[1], l[2]);
    g4_sampler_free(&s);

    /* the plain distribution, and with temperature 0.5 (p^2 renormalized) */
    c = g4_sampler_config_init();
    c.seed = 1;
    g4_sampler_init(&s, &c, 4);
    draw(&s, base, 20000, cnt);
    CHECK(fabs(cnt[2] / 20000.0 - 0.5) < 0.02 && fabs(cnt[0] / 20000.0 - 0.3) < 0.02 && fabs(cnt[3] / 20000.0 - 0.15) < 0.02 &&
              fabs(cnt[1] / 20000.0 - 0.05) < 0.01,
          "frequencies %d %d %d %d of 20000", cnt[2], cnt[0], cnt[3], cnt[1]);
    g4_sampler_free(&s);
    c.temperature = 0.5f;
    g4_sampler_init(&s, &c, 4);
    draw(&s, base, 20000, cnt);
    CHECK(fabs(cnt[2] / 20000.0 - 0.25 / 0.365) < 0.02 && fabs(cnt[0] / 20000.0 - 0.09 / 0.365) < 0.02,
          "temperature 0.5: %d %d %d %d", cnt[2], cnt[0], cnt[3], cnt[1]);
    g4_sampler_free(&s);

    /* top-k 2: only the two most likely */
    c = g4_sampler_config_init();
    c.top_k = 2;
    g4_sampler_init(&s, &c, 4);
    draw(&s, base, 3000, cnt);
    CHECK(cnt[3] == 0 && cnt[1] == 0 && cnt[2] > 1500 && cnt[0] > 800, "top-k 2: %d %d %d %d", cnt[2], cnt[0], cnt[3], cnt[1]);
    g4_sampler_free(&s);

    /* top-p, transformers' rule: ascending cumulative mass 0.05, 0.2, 0.5, 1; drop <= 1 - p */
    c = g4_sampler_config_init();
    c.top_p = 0.75f; /* drops 0.05 and 0.15 */
    g4_sampler_init(&s, &c, 4);
    draw(&s, base, 3000, cnt);
    CHECK(cnt[3] == 0 && cnt[1] == 0 && cnt[2] > 0 && cnt[0] > 0, "top-p 0.75: %d %d %d %d", cnt[2], cnt[0], cnt[3], cnt[1]);
    g4_sampler_free(&s);
    c.top_p = 0.85f; /* drops only 0.05 */
    g4_sampler_init(&s, &c, 4);
    draw(&s, base, 3000, cnt);
    CHECK(cnt[1] == 0 && cnt[3] > 0, "top-p 0.85: %d %d %d %d", cnt[2], cnt[0], cnt[3], cnt[1]);
    g4_sampler_free(&s);

    /* min-p 0.5: keep p >= 0.25 */
    c = g4_sampler_config_init();
    c.min_p = 0.5f;
    g4_sampler_init(&s, &c, 4);
    draw(&s, base, 3000, cnt);
    CHECK(cnt[3] == 0 && cnt[1] == 0 && cnt[2] > 0 && cnt[0] > 0, "min-p 0.5: %d %d %d %d", cnt[2], cnt[0], cnt[3], cnt[1]);
    g4_sampler_free(&s);

    /* the seed reproduces a run; reset restarts it; another seed differs */
    c = g4_sampler_config_init();
    c.seed = 42;
    g4_sampler_init(&s, &c, 4);
    for (i = 0; i < 64; i++) { memcpy(l, base, sizeof l); seq1[i] = g4_sampler_sample(&s, l); }
    g4_sampler_reset(&s);
    for (i = 0; i < 64; i++) { memcpy(l, base, sizeof l); seq2[i] = g4_sampler_sample(&s, l); }
    CHECK(memcmp(seq1, seq2, sizeof seq1) == 0, "reset replays the run");
    g4_sampler_free(&s);
    c.seed = 43;
    g4_sampler_init(&s, &c, 4);
    for (i = 0; i < 64; i++) { memcpy(l, base, sizeof l); seq2[i] = g4_sampler_sample(&s, l); }
    CHECK(memcmp(seq1, seq2, sizeof seq1) != 0, "another seed, another run");
    g4_sampler_free(&s);

    /* bad input */
    c = g4_sampler_config_init();
    c.top_p = 0;
    CHECK(g4_sampler_init(&s, &c, 4) == G4_ERR_INPUT && strstr(s.error, "top_p"), "top_p 0: %s", s.error);
    c = g4_sampler_config_init();
    g4_sampler_init(&s, &c, 4);
    l[0] = 0; l[1] = NAN; l[2] = 0; l[3] = 0;
    CHECK(g4_sampler_sample(&s, l) == -1 && strstr(s.error, "NaN"), "NaN logit: %s", s.error);
    g4_sampler_free(&s);
}

/* qsort's order for the reference: logit descending, id ascending on ties */
static const float *g_sort_logits;
static int by_logit_then_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float lx = g_sort_logits[x], ly = g_sort_logits[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return (x > y) - (x < y);
}

/* top-p's candidate sort (a heap sort) = qsort with the same order, on logits with many ties */
static void test_cand_sort(void) {
    enum { N = 1000 };
    static float logits[N];
    static int32_t got[N], want[N];
    uint32_t r = 12345;
    size_t n, i;
    for (n = 0; n <= N; n += (n < 20 ? 1 : 97)) {
        for (i = 0; i < n; i++) {
            r = r * 1664525u + 1013904223u;
            logits[i] = (float)((r >> 16) % 23) - 11.0f; /* 23 values: ties everywhere */
            got[i] = want[i] = (int32_t)(n - 1 - i);
        }
        g_sort_logits = logits;
        qsort(want, n, sizeof *want, by_logit_then_id);
        g4__cand_sort(got, logits, n);
        CHECK(n == 0 || memcmp(got, want, n * sizeof *got) == 0, "n %zu: the heap sort differs from qsort", n);
    }
}

int main(void) {
    if (!h_tmpdir(g_tmp, sizeof g_tmp, "tok")) return 1;

    run("tiny tokenizer: encode/decode = tokenizers goldens", test_tiny_goldens);
    run("full Gemma tokenizer: encode/decode = tokenizers goldens", test_full_goldens);
    run("streaming decode: characters split over byte tokens", test_stream_bytes);
    run("byte runs: decode and stream = tokenizers (tiny, tiny_mut)", test_utf8_goldens);
    run("byte runs: decode and stream = tokenizers (full Gemma tokenizer)", test_utf8_goldens_full);
    run("added tokens: ids and skip_special_tokens as tokenizers assigns them", test_added_goldens);
    run("tokenize/detokenize: buffer sizes and bad ids", test_sizes_and_errors);
    run("malformed tokenizer.json: errors name the field, never a crash", test_malformed);
    run("chat layout: Google's prompt-formatting guide, ids from the file", test_chat_layout);
    run("greedy generate from text = transformers generate (e2b_like)", test_generate_greedy);
    run("chat keeps the KV: second turn = whole history", test_chat_keeps_kv);
    run("sampler: greedy, penalty, temperature, top-k, top-p, min-p, seed", test_sampler);
    run("sampler: top-p's candidate sort = qsort (logit descending, id ascending), with ties", test_cand_sort);
    run("cli: tokenize, generate, chat", test_cli);

    remove_tree(g_tmp);
    return finish();
}
