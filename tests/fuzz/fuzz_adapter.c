/* libFuzzer harness: a PEFT adapter_config.json and the Python regular
   expressions in it (g4__re: target_modules, exclude_modules, layers_pattern,
   rank_pattern, alpha_pattern keys), on arbitrary bytes.

   Without a NUL byte the input is adapter_config.json: parsed (g4__json_parse_python,
   g4__acfg_parse) and, when accepted, bound as g4_model_load_adapter binds it
   to the module keys of a model (both checkpoint prefixes, three layers, the
   global projections, lm_head): targets, exclusions, layer indices, rank and
   alpha patterns. Property: no crash, no sanitizer report, no leak; every
   rejection is G4_ERR_JSON/G4_ERR_CONFIG/G4_ERR_NOMEM with a message naming the
   file; a regex error names its field; a rank from rank_pattern is in [1, 2^20].

   With a NUL byte the input is PATTERN NUL SUBJECT: compiled and matched
   (re.fullmatch), and the module keys too. Property: as above, a refusal says
   why, and the answer is 0 or 1 and the same twice. Where the pattern uses
   only characters on which Python's re and POSIX extended regular
   expressions agree (letters, digits, _ . | ( ) * + ? and no {, [, \, ^, $)
   and the subject has no newline, re.fullmatch is a language question: the
   answer must equal glibc's regexec of ^(PATTERN)$ (when regcomp takes it).

   Build: make fuzz (clang, -fsanitize=fuzzer). */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../../gemma4.h"

#include <regex.h>
#include <stdlib.h>
#include <string.h>

#define NAME "fuzz/adapter_config.json"

static g4__re g_re; /* 60 KB: static, not on the stack */

static const char *const g_modules[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",    "router.proj",
                                        "per_layer_input_gate", "per_layer_projection"};
static const char *const g_prefixes[] = {"model.", "model.language_model."};
static const int g_layers[] = {0, 7, 12};

/* the keys g4__linear_key makes, for layer index k of 3, module m of 10 (k = 3: the globals) */
static int key_of(char *key, size_t cap, int prefix, int k, int m) {
    if (k < 3) snprintf(key, cap, "%slayers.%d.%s", g_prefixes[prefix], g_layers[k], g_modules[m]);
    else if (m == 0) snprintf(key, cap, "%sper_layer_model_projection", g_prefixes[prefix]);
    else if (m == 1) snprintf(key, cap, "lm_head");
    else return 0;
    return 1;
}

static void check_err(const char *err, g4_result r) {
    if (r != G4_ERR_JSON && r != G4_ERR_CONFIG && r != G4_ERR_NOMEM) abort();
    if (!strstr(err, NAME)) abort();
}

static void fuzz_config(const char *text, size_t size) {
    g4__json j;
    g4__acfg a;
    char err[G4_ERROR_MAX], key[256];
    g4_result r;
    int p, k, m;
    err[0] = 0;
    if ((r = g4__json_parse_python(&j, text, size, NAME, err)) != G4_OK) { check_err(err, r); return; }
    memset(&a, 0, sizeof a);
    a.j = &j;
    a.c.j = &j; a.c.obj = 0; a.c.name = NAME; a.c.scope = ""; a.c.err = err;
    a.re = &g_re;
    if (j.nodes[0].type != G4__JOBJ) { g4__json_free(&j); return; } /* g4_model_load_adapter refuses it first */
    if ((r = g4__acfg_parse(&a)) != G4_OK) { check_err(err, r); g4__json_free(&j); return; }
    if (a.r < 1 || a.r > (1 << 20)) abort();
    for (p = 0; p < 2; p++)
        for (k = 0; k < 4; k++)
            for (m = 0; m < 10; m++) {
                int hit, rn = -1, an = -1;
                if (!key_of(key, sizeof key, p, k, m)) continue;
                hit = g4__acfg_targets(&a, key, k == 3 && m == 1);
                if (hit < 0) { /* a regex the engine refuses: the message names the file and the field */
                    check_err(err, G4_ERR_CONFIG);
                    if (!strstr(err, "field '")) abort();
                    g4__json_free(&j);
                    return;
                }
                if (hit != 0 && hit != 1) abort();
                if (!hit) continue;
                if (g4__acfg_pattern(&a, a.rpat, "rank_pattern", key, &rn) < 0 ||
                    g4__acfg_pattern(&a, a.apat, "alpha_pattern", key, &an) < 0) {
                    if (!strstr(err, NAME) || (!strstr(err, "rank_pattern") && !strstr(err, "alpha_pattern") && !strstr(err, "memory")))
                        abort();
                    g4__json_free(&j);
                    return;
                }
                if (rn >= 0 && (j.nodes[rn].type != G4__JNUM || j.nodes[rn].ival < 1 || j.nodes[rn].ival > (1 << 20))) abort();
                if (an >= 0 && j.nodes[an].type != G4__JNUM) abort();
            }
    g4__json_free(&j);
}

/* only characters on which Python's re and POSIX EREs agree */
static int posix_comparable(const char *p, size_t n, const char *s, size_t sn) {
    size_t i;
    int depth = 0;
    for (i = 0; i < n; i++) {
        char c = p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '|' || c == '(' || c == ')' || c == '*' || c == '+' || c == '?'))
            return 0;
        if (c == '(') depth++;
        if (c == ')' && --depth < 0) return 0;
        if (c == '(' && i + 1 < n && p[i + 1] == '?') return 0; /* (?:, (?P< : Python only */
        if (c == '?' && i > 0 && (p[i - 1] == '*' || p[i - 1] == '+' || p[i - 1] == '?')) return 0; /* lazy: ERE differs */
    }
    for (i = 0; i < sn; i++)
        if (s[i] == '\n' || s[i] == 0) return 0;
    return 1;
}

static void fuzz_regex(const char *pat, size_t pn, const char *subj, size_t sn) {
    char key[256];
    int got, again, p, k, m;
    if (g4__re_compile(&g_re, pat, pn) != 0) {
        if (!g_re.bad || !*g_re.bad) abort(); /* a refusal says why */
        return;
    }
    if (g_re.bad) abort();
    got = g4__re_full(&g_re, subj, sn);
    again = g4__re_full(&g_re, subj, sn);
    if ((got != 0 && got != 1) || got != again) abort();
    for (p = 0; p < 2; p++)
        for (k = 0; k < 4; k++)
            for (m = 0; m < 10; m++)
                if (key_of(key, sizeof key, p, k, m) && (unsigned)g4__re_full(&g_re, key, strlen(key)) > 1u) abort();
    if (pn < 200 && sn < 200 && posix_comparable(pat, pn, subj, sn)) {
        char ere[220], s[210];
        regex_t rx;
        snprintf(ere, sizeof ere, "^(%.*s)$", (int)pn, pat);
        memcpy(s, subj, sn);
        s[sn] = 0;
        if (regcomp(&rx, ere, REG_EXTENDED | REG_NOSUB) == 0) {
            int posix = regexec(&rx, s, 0, NULL, 0) == 0;
            regfree(&rx);
            if (posix != got) abort(); /* the same regular language, a different answer */
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = (char *)malloc(size ? size : 1); /* exact size: ASan sees any over-read */
    const char *nul;
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    nul = size ? (const char *)memchr(text, 0, size) : NULL;
    if (nul) fuzz_regex(text, (size_t)(nul - text), nul + 1, size - (size_t)(nul - text) - 1);
    else fuzz_config(text, size);
    free(text);
    return 0;
}
