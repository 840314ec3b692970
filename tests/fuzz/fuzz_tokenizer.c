/* libFuzzer harness: tokenizer.json (g4_tokenizer_parse) and, when it loads,
   everything that runs on it: g4_tokenize in its flag combinations,
   g4_detokenize, the streaming decode, g4_token_id, g4_chat_encode. The input
   is the tokenizer's JSON; if it holds two NUL bytes, what follows them is the
   text to encode instead of the fixed one below.
   Properties: no crash, no sanitizer report, no leak; a rejected file gives
   G4_ERR_JSON/G4_ERR_INPUT/G4_ERR_NOMEM with a message naming the file; a
   loaded one has only valid UTF-8 token strings, encodes to at most g4_tokenize_max ids, every id in
   [0, n_vocab); detokenize sizes its output as documented (a second call
   with the reported length succeeds); the stream's pieces are valid UTF-8
   and concatenate to detokenize's text (also for the text's bytes fed as
   byte tokens); an id outside the vocabulary is G4_ERR_INPUT. Build: make fuzz (clang, -fsanitize=fuzzer). */
#define GEMMA4_IMPLEMENTATION
#include "../../gemma4.h"
#include "../../gemma4_processing.h"

#include <stdlib.h>
#include <string.h>

static const char g_text[] = "Hello <|turn>user\n  world<turn|>\t\xF0\x9F\x98\x80 caf\xC3\xA9 \xFF\xC3 <bos><0x41>";

static void check_ids(const g4_tokenizer *t, const int32_t *ids, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab) abort();
}

/* ids -> text, once with a buffer too small and once with the reported size */
static void detok(const g4_tokenizer *t, const int32_t *ids, size_t n, int flags) {
    char small[8], *out;
    size_t len = 0, len2 = 0;
    g4_result r = g4_detokenize(t, ids, n, flags, small, sizeof small, &len);
    if (r == G4_ERR_NOMEM) return;
    if (r != G4_OK && r != G4_ERR_INPUT) abort();
    if (r == G4_OK) {
        if (strlen(small) != len) abort();
        return;
    }
    if (len < sizeof small - 1) abort(); /* G4_ERR_INPUT here means "does not fit": it reports the length needed */
    out = (char *)malloc(len + 1);
    if (!out) return;
    r = g4_detokenize(t, ids, n, flags, out, len + 1, &len2);
    if (r != G4_OK && r != G4_ERR_NOMEM) abort();
    if (r == G4_OK && (len2 != len || strlen(out) != len)) abort();
    free(out);
}

/* the streaming decode, id by id, then the flush: the pieces, each
   NUL-terminated at its length, concatenate to g4_detokenize's text */
static void stream(const g4_tokenizer *t, const int32_t *ids, size_t n, int flags) {
    int texts_valid = 1;
    int32_t id;
    g4_decode_state st;
    const char *piece;
    char *whole, *cat;
    size_t i, k, len = 0, wl = 0;
    g4_result r;
    if (g4_detokenize(t, ids, n, flags, NULL, 0, &wl) == G4_ERR_NOMEM) return;
    whole = (char *)malloc(wl + 1);
    cat = (char *)malloc(wl + 1);
    if (!whole || !cat || g4_detokenize(t, ids, n, flags, whole, wl + 1, &wl) != G4_OK) { free(whole); free(cat); return; }
    for (id = 0; id < t->n_vocab && texts_valid; id++)
        if (t->text_off[id] != G4__TOK_NONE)
            texts_valid = g4__utf8_valid((const unsigned char *)t->text + t->text_off[id], t->text_len[id]);
    memset(&st, 0, sizeof st);
    for (i = 0; i <= n; i++) {
        r = i < n ? g4_decode_next(t, &st, ids[i], flags, &piece, &k) : g4_decode_flush(&st, &piece, &k);
        if (r == G4_ERR_NOMEM) break;
        if (r != G4_OK || piece[k] != 0 || len + k > wl) abort();
        /* a piece is valid UTF-8 when the tokenizer's strings are (JSON strings are
           passed through as bytes, so a fuzzed file's may not be) */
        if (texts_valid && !g4__utf8_valid((const unsigned char *)piece, k)) abort();
        memcpy(cat + len, piece, k);
        len += k;
    }
    if (i > n && (len != wl || memcmp(cat, whole, wl) != 0)) abort();
    g4_decode_free(&st);
    free(whole);
    free(cat);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t jl = size, tl = sizeof g_text - 1, i, cap, n = 0;
    const char *text = g_text;
    char *src = (char *)malloc(size ? size : 1); /* exact size: ASan sees any over-read */
    int32_t *ids, bad[2];
    int flags;
    g4_tokenizer t;
    g4_result r;
    if (!src) return 0;
    if (size) memcpy(src, data, size);
    for (i = 0; i + 1 < size; i++)
        if (src[i] == 0 && src[i + 1] == 0) { jl = i; text = src + i + 2; tl = size - i - 2; break; }
    r = g4_tokenizer_parse(&t, src, jl, "fuzz.json");
    if (r != G4_OK) {
        if (r != G4_ERR_JSON && r != G4_ERR_INPUT && r != G4_ERR_NOMEM) abort();
        if (!strstr(t.error, "fuzz.json")) abort(); /* every message names its file */
        free(src);
        return 0;
    }
    for (i = 0; i < (size_t)t.n_vocab; i++) /* as tokenizers: a file that loads has only UTF-8 strings */
        if (!g4__utf8_valid((const unsigned char *)t.text + t.text_off[i], t.text_len[i])) abort();
    cap = g4_tokenize_max(&t, tl);
    ids = (int32_t *)malloc(sizeof(int32_t) * (cap + 1));
    for (flags = 0; ids && flags < 2; flags++) { /* with and without G4_ENCODE_ADD_SPECIAL */
        r = g4_tokenize(&t, text, tl, flags, ids, cap, &n);
        if (r == G4_OK) {
            if (n > cap) abort();
            check_ids(&t, ids, n);
            detok(&t, ids, n, 0);
            detok(&t, ids, n, G4_DECODE_SKIP_SPECIAL);
            stream(&t, ids, n, 0);
            stream(&t, ids, n, G4_DECODE_SKIP_SPECIAL);
        } else if (r != G4_ERR_NOMEM) abort(); /* g4_tokenize_max bounds every encoding */
        if (r == G4_OK && n > 0) { /* too small a buffer: an error with the count needed, nothing past cap */
            size_t need = 0;
            ids[n - 1] = -7;
            r = g4_tokenize(&t, text, tl, flags, ids, n - 1, &need);
            if (r != G4_ERR_INPUT && r != G4_ERR_NOMEM) abort();
            if (r == G4_ERR_INPUT && (need != n || ids[n - 1] != -7)) abort();
        }
    }
    /* the text's bytes as byte tokens (a byte without one: id 0 there), so the stream
       sees arbitrary runs, valid UTF-8 or not */
    free(ids);
    if (tl && t.n_vocab > 0 && (ids = (int32_t *)malloc(sizeof(int32_t) * tl)) != NULL) {
        for (i = 0; i < tl; i++) ids[i] = t.byte_id[(unsigned char)text[i]] >= 0 ? t.byte_id[(unsigned char)text[i]] : 0;
        stream(&t, ids, tl, 0);
        stream(&t, ids, tl, G4_DECODE_SKIP_SPECIAL);
        free(ids);
    }
    bad[0] = t.n_vocab; /* out of range: an error, never a read */
    bad[1] = -1;
    {
        char out[64];
        size_t len;
        if (g4_detokenize(&t, bad, 1, 0, out, sizeof out, &len) != G4_ERR_INPUT) abort();
        if (g4_detokenize(&t, bad + 1, 1, 0, out, sizeof out, &len) != G4_ERR_INPUT) abort();
    }
    (void)g4_token_id(&t, "<bos>");
    (void)g4_token_id(&t, text[0] ? "a" : "");
    if (t.turn_open >= 0 && t.turn_close >= 0) {
        g4_chat_message msgs[3] = {{"system", "be brief"}, {"user", "hi \xF0\x9F\x98\x80"}, {"assistant", "ok"}};
        int32_t cids[512];
        size_t cn = 0;
        r = g4_chat_encode(&t, msgs, 3, G4_CHAT_BOS | G4_CHAT_THINKING | G4_CHAT_OPEN_MODEL, cids, 512, &cn);
        if (r == G4_OK) check_ids(&t, cids, cn);
        else if (r != G4_ERR_INPUT && r != G4_ERR_NOMEM) abort();
    }
    g4_tokenizer_free(&t);
    free(src);
    return 0;
}
