/* The bad-input catalogue: every malformed config.json, safetensors file,
   shard index, LoRA adapter, token list and API call we could think of, each a case that
   asserts the exact result code and that the message names the file, tensor
   or field. Unusual but valid inputs (extra tensors, metadata, unknown keys,
   long strings) must load. Every bad config and checkpoint is also given to
   the CLI, which must print exactly one line on stderr, exit 1, finish within
   10 seconds and (built with sanitizers) print no sanitizer report.

       build/test_bad_inputs [DATA_DIR [CLI]]     (defaults: data build/gemma4)

   Each case prints "ok - ..." or "not ok - ..."; the last line is
   "N passed, M failed". */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include "../gemma4_processing.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *g_data = "data", *g_cli = "build/gemma4";
static char g_tmp[256];

#include "harness.h"

/* "a/b" in one of 8 rotating buffers */
static const char *P(const char *a, const char *b) {
    static char buf[8][600];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", a, b);
    return buf[k];
}

static const char *tiny(const char *name) {
    static char buf[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/tiny/%s", g_data, name);
    return buf[k];
}

static int write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    if (len && fwrite(data, 1, len, f) != len) { fclose(f); return 0; }
    fclose(f);
    return 1;
}

static void copy_file(const char *from, const char *to) {
    char *text, err[G4_ERROR_MAX];
    size_t len;
    if (g4__read_file(from, &text, &len, (size_t)1 << 26, err) != G4_OK) { printf("  cannot copy %s\n", from); return; }
    write_file(to, text, len);
    free(text);
}

/* The result code and, when given, substrings of the message. */
static void expect(g4_result got, g4_result want, const char *msg, const char *n1, const char *n2) {
    CHECK(got == want, "result %d (%s), want %d (%s); message: %s", got, g4_result_str(got), want, g4_result_str(want),
          msg);
    if (n1) CHECK(strstr(msg, n1) != NULL, "message \"%s\" lacks \"%s\"", msg, n1);
    if (n2) CHECK(strstr(msg, n2) != NULL, "message \"%s\" lacks \"%s\"", msg, n2);
}

/* ------------------------------------------------ UTF-8 in JSON files */

/* data/json/utf8_goldens.jsonl (tools/make_json_utf8_goldens.py): which
   documents tokenizers (tokenizer.json), transformers (config.json) and
   safetensors (a header) accept, with raw UTF-8 valid or not, lone and paired
   surrogate escapes and \u0000 spliced into a string (or outside one).
   gemma4.h must accept exactly the same ones, except where it refuses on
   purpose (g_utf8_refused); a refusal is G4_ERR_JSON (G4_ERR_SAFETENSORS for a
   header) naming the file and the byte offset. Every tokenizer.json it accepts
   has only valid UTF-8 token strings. */

typedef struct { const char *tmpl, *label, *needle; } utf8_refusal;

static const utf8_refusal g_utf8_refused[] = {
    /* safetensors keeps the name; gemma4.h looks tensors up by C string, so "a\0b" would alias "a" */
    {"safetensors tensor name", "escape \\u0000", "holds a NUL character"},
};

static int hexval(int c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

/* hex -> bytes in out (cap bytes); the count, or -1 */
static long unhex(const char *h, size_t n, unsigned char *out, size_t cap) {
    size_t i;
    if (n % 2 || n / 2 > cap) return -1;
    for (i = 0; i < n / 2; i++) {
        int a = hexval(h[2 * i]), b = hexval(h[2 * i + 1]);
        if (a < 0 || b < 0) return -1;
        out[i] = (unsigned char)(a * 16 + b);
    }
    return (long)(n / 2);
}

/* Runs gemma4.h's reader for `file` on doc[0..len): G4_OK or the error, message in err. */
static g4_result utf8_read(const char *file, const unsigned char *doc, size_t len, char *err) {
    g4_result r;
    if (!strcmp(file, "tokenizer.json")) {
        static g4_tokenizer t;
        int32_t id;
        r = g4_tokenizer_parse(&t, (const char *)doc, len, "tokenizer.json");
        memcpy(err, t.error, G4_ERROR_MAX);
        if (r != G4_OK) return r;
        for (id = 0; id < t.n_vocab; id++) /* the streamed decoder's promise rests on this */
            CHECK(g4__utf8_valid((const unsigned char *)t.text + t.text_off[id], t.text_len[id]),
                  "token %ld's string is not valid UTF-8", (long)id);
        g4_tokenizer_free(&t);
        return r;
    }
    if (!strcmp(file, "config.json")) {
        static g4_config c;
        r = g4_config_parse(&c, (const char *)doc, len, "config.json");
        memcpy(err, c.error, G4_ERROR_MAX);
        return r;
    }
    { /* a safetensors file: 8-byte length, the header, one float32 */
        g4__file f;
        g4__stinfo *list = NULL;
        int n = 0, cap = 0, i;
        memset(&f, 0, sizeof f);
        f.size = 8 + len + 4;
        f.bytes = (unsigned char *)malloc(f.size);
        f.path = (char *)"model.safetensors";
        if (!f.bytes) { snprintf(err, G4_ERROR_MAX, "out of memory"); return G4_ERR_NOMEM; }
        for (i = 0; i < 8; i++) f.bytes[i] = (unsigned char)((uint64_t)len >> (8 * i));
        memcpy(f.bytes + 8, doc, len);
        memset(f.bytes + 8 + len, 0, 4);
        err[0] = 0;
        r = g4__st_parse(&f, 0, &list, &n, &cap, err);
        g4__json_free(&f.header);
        G4_FREE(list);
        free(f.bytes);
        return r;
    }
}

static void test_json_utf8_goldens(void) {
    char err[G4_ERROR_MAX], tname[64][64], tfile[64][32];
    unsigned char *tdoc[64], *doc = NULL;
    long tlen[64];
    int nt = 0, k, cur = -1, cases = 0, agree = 0, rl;
    h_jsonl f;
    g4__json j;
    begin("JSON UTF-8: data/json/utf8_goldens.jsonl");
    if (h_jsonl_open(&f, P(g_data, "json/utf8_goldens.jsonl"), err) != G4_OK) {
        CHECK(0, "%s", err);
        end();
        return;
    }
    end();
    while ((rl = h_jsonl_next(&f, &j, err)) != 0) {
        int tm, hx, lb, pl, ac;
        if (rl < 0) {
            begin("JSON UTF-8: goldens line");
            CHECK(0, "%s", err);
            end();
            break;
        }
        tm = g4__jget(&j, 0, "template");
        hx = g4__jget(&j, 0, "hex");
        if (hx >= 0 && nt < 64) { /* a template: "@@" marks where each payload goes */
            if (cur >= 0) { CHECK(agree == cases, "%d of %d cases agree", agree, cases); end(); }
            snprintf(tname[nt], sizeof tname[nt], "%s", j.nodes[tm].str);
            snprintf(tfile[nt], sizeof tfile[nt], "%s", j.nodes[g4__jget(&j, 0, "file")].str);
            tdoc[nt] = (unsigned char *)malloc(j.nodes[hx].len / 2 + 1);
            tlen[nt] = tdoc[nt] ? unhex(j.nodes[hx].str, j.nodes[hx].len, tdoc[nt], j.nodes[hx].len / 2) : -1;
            cur = nt++;
            cases = agree = 0;
            begin("JSON UTF-8: %s (%s's reader)", tname[cur], tfile[cur]);
            CHECK(tlen[cur] > 0, "bad template hex");
            g4__json_free(&j);
            continue;
        }
        lb = g4__jget(&j, 0, "label");
        pl = g4__jget(&j, 0, "payload");
        ac = g4__jget(&j, 0, "accepted");
        if (cur < 0 || tlen[cur] <= 0 || lb < 0 || pl < 0 || ac < 0 || !g4__jis(&j.nodes[tm], tname[cur])) {
            CHECK(0, "%s: malformed", f.name);
            g4__json_free(&j);
            continue;
        }
        {
            const unsigned char *at = NULL;
            unsigned char pay[64];
            long np = unhex(j.nodes[pl].str, j.nodes[pl].len, pay, sizeof pay);
            int want = j.nodes[ac].type == G4__JTRUE, got;
            const char *needle = NULL;
            size_t i, dl;
            g4_result r;
            for (i = 0; i + 1 < (size_t)tlen[cur]; i++)
                if (tdoc[cur][i] == '@' && tdoc[cur][i + 1] == '@') { at = tdoc[cur] + i; break; }
            CHECK(at && np >= 0, "%s: no @@ in the template, or bad payload hex", j.nodes[lb].str);
            if (!at || np < 0) { g4__json_free(&j); continue; }
            dl = (size_t)tlen[cur] - 2 + (size_t)np;
            free(doc);
            doc = (unsigned char *)malloc(dl);
            if (!doc) { CHECK(0, "out of memory"); g4__json_free(&j); continue; }
            memcpy(doc, tdoc[cur], (size_t)(at - tdoc[cur]));
            memcpy(doc + (at - tdoc[cur]), pay, (size_t)np);
            memcpy(doc + (at - tdoc[cur]) + np, at + 2, (size_t)tlen[cur] - (size_t)(at - tdoc[cur]) - 2);
            for (k = 0; k < (int)(sizeof g_utf8_refused / sizeof *g_utf8_refused); k++)
                if (!strcmp(g_utf8_refused[k].tmpl, tname[cur]) && g4__jis(&j.nodes[lb], g_utf8_refused[k].label))
                    needle = g_utf8_refused[k].needle;
            r = utf8_read(tfile[cur], doc, dl, err);
            got = r == G4_OK;
            cases++;
            if (needle) {
                CHECK(want && !got && strstr(err, needle), "%s: gemma4.h refuses on purpose (\"%s\"); got %d: %s",
                      j.nodes[lb].str, needle, r, err);
                agree += want && !got && strstr(err, needle);
            } else {
                g4_result want_err = strcmp(tfile[cur], "safetensors") ? G4_ERR_JSON : G4_ERR_SAFETENSORS;
                int ok = got == want &&
                         (got || (r == want_err && strstr(err, strcmp(tfile[cur], "safetensors") ? tfile[cur] : "model.safetensors") &&
                                  strstr(err, "byte offset")));
                CHECK(ok, "%s: the reference %s it, gemma4.h %s it (%d: %s)", j.nodes[lb].str, want ? "accepts" : "refuses",
                      got ? "accepts" : "refuses", r, got ? "" : err);
                agree += ok;
            }
        }
        g4__json_free(&j);
    }
    if (cur >= 0) { CHECK(agree == cases, "%d of %d cases agree", agree, cases); end(); }
    begin("JSON UTF-8: the goldens hold every file type");
    CHECK(nt >= 9, "%d templates", nt);
    end();
    for (k = 0; k < nt; k++) free(tdoc[k]);
    free(doc);
    h_jsonl_close(&f);
}

/* ------------------------------------------------------------------ CLI */

/* Runs the CLI with `args`; checks the exit status, and on failure that
   stderr is exactly one line, holds `needle` (if given) and no sanitizer
   report, all within 10 seconds. */
static void cli(const char *args, int want_status, const char *needle) {
    char err[4096];
    struct timespec t0, t1;
    double secs;
    int st, lines = 0;
    size_t n, i;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = run_cli(g_cli, args, NULL, 0, NULL, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    n = strlen(err);
    for (i = 0; i < n; i++) lines += err[i] == '\n';
    CHECK(st == want_status, "cli %s: status %d, want exit %d; stderr: %s", args, st, want_status, err);
    CHECK(secs < 10.0, "cli %s took %.1f s", args, secs);
    CHECK(!strstr(err, "Sanitizer") && !strstr(err, "runtime error"), "cli %s: sanitizer report: %s", args, err);
    if (want_status != 0) {
        CHECK(lines == 1 && n > 1 && err[n - 1] == '\n', "cli %s: stderr must be one line, got %d: %s", args, lines, err);
        if (needle) CHECK(strstr(err, needle) != NULL, "cli %s: stderr \"%s\" lacks \"%s\"", args, err, needle);
    }
}

/* ---------------------------------------------------------- config.json */

/* A valid two-layer config; later duplicate keys override (Python's json). */
#define B0 "\"vocab_size\":32,\"hidden_size\":8,\"intermediate_size\":16,\"num_attention_heads\":4,\"head_dim\":4,\"global_head_dim\":8"
#define B B0 ",\"num_key_value_heads\":2,\"num_hidden_layers\":2"
#define C(extra) "{" B "," extra "}"
#define ROPE_S "\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":10000.0}"

typedef struct { const char *label, *json; g4_result want; const char *needle; } config_case;

static const config_case g_config_cases[] = {
    /* not JSON, or not an object */
    {"empty text", "", G4_ERR_JSON, "unexpected end of input"},
    {"only whitespace", " \n\t ", G4_ERR_JSON, "unexpected end of input"},
    {"truncated inside a string", "{" B ",\"rope_parameters\":{\"slid", G4_ERR_JSON, "unterminated string"},
    {"truncated after a colon", "{\"vocab_size\":", G4_ERR_JSON, "unexpected end of input"},
    {"truncated before the closing brace", "{" B, G4_ERR_JSON, "expected ',' or '}'"},
    {"top level is an array", "[1,2]", G4_ERR_CONFIG, "top level must be a JSON object, got an array"},
    {"top level is a string", "\"gemma4\"", G4_ERR_CONFIG, "top level must be a JSON object, got a string"},
    {"top level is null", "null", G4_ERR_CONFIG, "top level must be a JSON object, got null"},
    {"NaN literal", C("\"rms_norm_eps\":NaN"), G4_ERR_JSON, "NaN"},
    {"Infinity literal", C("\"rms_norm_eps\":Infinity"), G4_ERR_JSON, "Infinity"},
    {"-Infinity literal", C("\"rms_norm_eps\":-Infinity"), G4_ERR_JSON, "bad number"},
    {"a comment", "{/* x */" B "}", G4_ERR_JSON, "expected a member name"},
    {"trailing comma", "{" B ",}", G4_ERR_JSON, "expected a member name"},
    {"unknown escape", C("\"x\":\"\\q\""), G4_ERR_JSON, "unknown escape"},
    {"control character in a string", C("\"x\":\"a\tb\""), G4_ERR_JSON, "control character"},
    {"invalid UTF-8 in a string", C("\"x\":\"a\xff\""), G4_ERR_JSON, "byte offset"},
    {"an encoded surrogate (ED A0 80)", C("\"x\":\"\xed\xa0\x80\""), G4_ERR_JSON, "encoded surrogate"},
    {"an overlong '/' (C0 AF)", C("\"x\":\"\xc0\xaf\""), G4_ERR_JSON, "overlong"},
    {"a UTF-8 byte order mark", "\xef\xbb\xbf{" B "}", G4_ERR_JSON, "byte order mark"},
    {"trailing garbage", "{" B "} {}", G4_ERR_JSON, "trailing characters"},
    {"number with a leading zero", C("\"sliding_window\":08"), G4_ERR_JSON, "leading zero"},
    /* missing or wrongly typed required fields */
    {"missing vocab_size", "{\"hidden_size\":8,\"intermediate_size\":16,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_hidden_layers\":2}",
     G4_ERR_CONFIG, "'vocab_size' is missing"},
    {"missing num_hidden_layers", "{" B0 ",\"num_key_value_heads\":2}", G4_ERR_CONFIG, "'num_hidden_layers' is missing"},
    {"missing num_key_value_heads", "{" B0 ",\"num_hidden_layers\":2}", G4_ERR_CONFIG, "'num_key_value_heads' is missing"},
    {"hidden_size null", C("\"hidden_size\":null"), G4_ERR_CONFIG, "'hidden_size' is missing"},
    {"hidden_size a string", C("\"hidden_size\":\"8\""), G4_ERR_CONFIG, "'hidden_size' must be an integer, got a string"},
    {"hidden_size true", C("\"hidden_size\":true"), G4_ERR_CONFIG, "'hidden_size' must be an integer, got true"},
    {"head_dim an array", C("\"head_dim\":[4]"), G4_ERR_CONFIG, "'head_dim' must be an integer, got an array"},
    {"intermediate_size a float", C("\"intermediate_size\":16.5"), G4_ERR_CONFIG,
     "'intermediate_size' must be an integer, got a fractional number"},
    {"num_attention_heads negative", C("\"num_attention_heads\":-4"), G4_ERR_CONFIG, "'num_attention_heads' is -4"},
    {"num_key_value_heads zero", C("\"num_key_value_heads\":0"), G4_ERR_CONFIG, "'num_key_value_heads' is 0"},
    {"vocab_size 1e30", C("\"vocab_size\":1e30"), G4_ERR_CONFIG, "'vocab_size' is 1e+30, outside"},
    {"vocab_size with 23 digits", C("\"vocab_size\":99999999999999999999999"), G4_ERR_CONFIG, "'vocab_size' is 1e+23, outside"},
    {"hidden_size 2^31", C("\"hidden_size\":2147483648"), G4_ERR_CONFIG, "'hidden_size' is 2147483648, outside"},
    {"num_hidden_layers 257", C("\"num_hidden_layers\":257"), G4_ERR_CONFIG, "'num_hidden_layers' is 257"},
    {"rms_norm_eps a string", C("\"rms_norm_eps\":\"1e-6\""), G4_ERR_CONFIG, "'rms_norm_eps' must be a number"},
    {"rms_norm_eps negative", C("\"rms_norm_eps\":-1"), G4_ERR_CONFIG, "'rms_norm_eps' is -1"},
    {"rms_norm_eps 1e999 (inf)", C("\"rms_norm_eps\":1e999"), G4_ERR_CONFIG, "'rms_norm_eps' is inf"},
    {"tie_word_embeddings a string", C("\"tie_word_embeddings\":\"yes\""), G4_ERR_CONFIG,
     "'tie_word_embeddings' must be true or false"},
    {"sliding_window zero", C("\"sliding_window\":0"), G4_ERR_CONFIG, "'sliding_window' is 0"},
    /* cross-field rules */
    {"heads not divisible by KV heads", C("\"num_key_value_heads\":3"), G4_ERR_CONFIG,
     "num_attention_heads (4) is not a multiple of its KV heads (3)"},
    {"odd head_dim", C("\"head_dim\":5"), G4_ERR_CONFIG, "layer 0 has odd head_dim 5"},
    {"odd global_head_dim", C("\"global_head_dim\":9"), G4_ERR_CONFIG, "layer 1 has odd head_dim 9"},
    {"odd per-layer head_dim", C("\"per_layer_config\":{\"0\":{\"head_dim\":7}}"), G4_ERR_CONFIG, "layer 0 has odd head_dim 7"},
    {"num_attention_heads * head_dim too large", C("\"num_attention_heads\":4096,\"head_dim\":2048"), G4_ERR_CONFIG,
     "num_attention_heads * head_dim is too large"},
    {"layer_types too short", C("\"layer_types\":[\"full_attention\"]"), G4_ERR_CONFIG,
     "'layer_types' must be an array of num_hidden_layers (2) strings"},
    {"layer_types too long", C("\"layer_types\":[\"full_attention\",\"full_attention\",\"full_attention\"]"), G4_ERR_CONFIG,
     "'layer_types' must be an array of num_hidden_layers (2)"},
    {"layer_types a string", C("\"layer_types\":\"full_attention\""), G4_ERR_CONFIG, "'layer_types' must be an array"},
    {"layer_types unknown type", C("\"layer_types\":[\"chunked_attention\",\"full_attention\"]"), G4_ERR_CONFIG,
     "layer_types[0] must be"},
    {"layer_types a number", C("\"layer_types\":[\"sliding_attention\",1]"), G4_ERR_CONFIG, "layer_types[1] must be"},
    {"num_kv_shared_layers negative", C("\"num_kv_shared_layers\":-1"), G4_ERR_CONFIG, "'num_kv_shared_layers' is -1"},
    {"num_kv_shared_layers = layers", C("\"num_kv_shared_layers\":2"), G4_ERR_CONFIG,
     "num_kv_shared_layers (2) must be below num_hidden_layers (2)"},
    {"num_kv_shared_layers > layers", C("\"num_kv_shared_layers\":3"), G4_ERR_CONFIG, "num_kv_shared_layers (3) must be below"},
    {"num_kv_shared_layers astronomically large", C("\"num_kv_shared_layers\":1e300"), G4_ERR_CONFIG,
     "'num_kv_shared_layers' is 1e+300"},
    {"reader layer with no owner of its type",
     C("\"num_hidden_layers\":3,\"num_kv_shared_layers\":1,\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"full_attention\"]"),
     G4_ERR_PLAN, "layer 2 (full_attention) reads shared K/V, but no layer before 2 is full_attention"},
    /* per_layer_config */
    {"per_layer_config an array", C("\"per_layer_config\":[]"), G4_ERR_CONFIG, "'per_layer_config' must be an object"},
    {"per_layer_config key not a number", C("\"per_layer_config\":{\"x\":{}}"), G4_ERR_CONFIG, "per_layer_config key \"x\""},
    {"per_layer_config key past the layers", C("\"per_layer_config\":{\"2\":{}}"), G4_ERR_CONFIG, "per_layer_config key \"2\""},
    {"per_layer_config key empty", C("\"per_layer_config\":{\"\":{}}"), G4_ERR_CONFIG, "per_layer_config key \"\""},
    {"per_layer_config key huge", C("\"per_layer_config\":{\"99999999999999999999\":{}}"), G4_ERR_CONFIG,
     "per_layer_config key \"99999999999999999999\""},
    {"per_layer_config entry not an object", C("\"per_layer_config\":{\"1\":8}"), G4_ERR_CONFIG,
     "'per_layer_config.1' must be an object"},
    {"per_layer_config unknown attribute", C("\"per_layer_config\":{\"1\":{\"intermediate_size\":8}}"), G4_ERR_CONFIG,
     "per_layer_config.1.intermediate_size"},
    {"per_layer_config head_dim zero", C("\"per_layer_config\":{\"1\":{\"head_dim\":0}}"), G4_ERR_CONFIG,
     "per_layer_config.1.head_dim must be an integer"},
    {"per_layer_config head_dim a string", C("\"per_layer_config\":{\"1\":{\"head_dim\":\"8\"}}"), G4_ERR_CONFIG,
     "per_layer_config.1.head_dim must be an integer"},
    {"per_layer_config KV heads not dividing", C("\"per_layer_config\":{\"1\":{\"num_key_value_heads\":3}}"), G4_ERR_CONFIG,
     "layer 1: num_attention_heads (4) is not a multiple of its KV heads (3)"},
    {"per_layer_config: one type, two head dims",
     C("\"layer_types\":[\"full_attention\",\"full_attention\"],\"per_layer_config\":{\"0\":{\"head_dim\":8},\"1\":{\"head_dim\":16}}"),
     G4_ERR_CONFIG, "layers 0 and 1 are both full_attention"},
    /* rope_parameters */
    {"rope_parameters an array", C("\"rope_parameters\":[]"), G4_ERR_CONFIG, "'rope_parameters' must be an object"},
    {"rope_parameters entry a string", C("\"rope_parameters\":{\"sliding_attention\":\"default\"}"), G4_ERR_CONFIG,
     "'rope_parameters.sliding_attention' must be an object"},
    {"rope_type missing", C("\"rope_parameters\":{\"sliding_attention\":{\"rope_theta\":1.0}}"), G4_ERR_CONFIG,
     "'rope_parameters.sliding_attention.rope_type' must be a string"},
    {"rope_type unknown", C("\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"yarn\",\"rope_theta\":1}}"), G4_ERR_CONFIG,
     "rope_type \"yarn\" in 'rope_parameters.sliding_attention'"},
    {"rope_theta missing", C("\"rope_parameters\":{" ROPE_S ",\"full_attention\":{\"rope_type\":\"default\"}}"), G4_ERR_CONFIG,
     "'rope_parameters.full_attention.rope_theta' is missing"},
    {"rope_theta a string", C("\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":\"1e4\"}}"),
     G4_ERR_CONFIG, "'rope_parameters.sliding_attention.rope_theta' must be a number"},
    {"rope_theta negative", C("\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\",\"rope_theta\":-1}}"),
     G4_ERR_CONFIG, "'rope_parameters.sliding_attention.rope_theta' is -1"},
    {"partial_rotary_factor 2", C("\"rope_parameters\":{" ROPE_S ",\"full_attention\":{\"rope_type\":\"proportional\",\"rope_theta\":1e6,\"partial_rotary_factor\":2}}"),
     G4_ERR_CONFIG, "'rope_parameters.full_attention.partial_rotary_factor' is 2"},
    {"rope factor 0", C("\"rope_parameters\":{" ROPE_S ",\"full_attention\":{\"rope_type\":\"proportional\",\"rope_theta\":1e6,\"factor\":0}}"),
     G4_ERR_CONFIG, "'rope_parameters.full_attention.factor' is 0"},
    {"rope_parameters without full_attention", C("\"rope_parameters\":{" ROPE_S "}"), G4_ERR_CONFIG,
     "'rope_parameters' has no \"full_attention\" entry"},
    /* model type and wrapper */
    {"model_type a number", C("\"model_type\":4"), G4_ERR_CONFIG, "'model_type' must be a string"},
    {"model_type llama", C("\"model_type\":\"llama\""), G4_ERR_CONFIG, "model_type \"llama\" is not a Gemma 4"},
    /* \u0000 inside a name or value: never its prefix (Python's json keeps it whole) */
    {"model_type gemma4_text\\u0000x", C("\"model_type\":\"gemma4_text\\u0000x\""), G4_ERR_CONFIG, "is not a Gemma 4"},
    {"layer_types entry with \\u0000", C("\"layer_types\":[\"full_attention\\u0000\",\"full_attention\"]"), G4_ERR_CONFIG,
     "layer_types[0] must be"},
    {"per_layer_config key 0\\u0000", C("\"per_layer_config\":{\"0\\u0000\":{}}"), G4_ERR_CONFIG, "per_layer_config key \"0\""},
    {"rope_type default\\u0000", C("\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\\u0000\",\"rope_theta\":1.0}}"),
     G4_ERR_CONFIG, "rope_type"},
    {"gemma4 without text_config", "{\"model_type\":\"gemma4\"}", G4_ERR_CONFIG, "needs a 'text_config' object"},
    {"text_config an array", "{\"model_type\":\"gemma4\",\"text_config\":[]}", G4_ERR_CONFIG, "'text_config' must be an object"},
    {"text_config missing a field", "{\"model_type\":\"gemma4\",\"text_config\":{" B0 ",\"num_hidden_layers\":2}}", G4_ERR_CONFIG,
     "'text_config.num_key_value_heads' is missing"},
    {"text_config field mistyped", "{\"model_type\":\"gemma4\",\"text_config\":{" B ",\"hidden_size\":-8}}", G4_ERR_CONFIG,
     "'text_config.hidden_size' is -8"},
    {"vision_config field mistyped", "{\"model_type\":\"gemma4\",\"vision_config\":{\"hidden_size\":\"x\"},\"text_config\":{" B "}}",
     G4_ERR_CONFIG, "field 'vision_config.hidden_size' must be an integer, got a string"},
    {"vision_config head_dim not a multiple of 4", "{\"model_type\":\"gemma4\",\"vision_config\":{\"head_dim\":6},\"text_config\":{" B "}}",
     G4_ERR_CONFIG, "vision_config.head_dim is 6; the 2-D RoPE needs a multiple of 4"},
    {"image_token_id mistyped", "{\"model_type\":\"gemma4\",\"image_token_id\":\"x\",\"text_config\":{" B "}}",
     G4_ERR_CONFIG, "field 'image_token_id' must be an integer"},
    {"wrapper tie_word_embeddings mistyped", "{\"model_type\":\"gemma4\",\"tie_word_embeddings\":1,\"text_config\":{" B "}}",
     G4_ERR_CONFIG, "'tie_word_embeddings' must be true or false"},
    /* features */
    {"MoE without experts", C("\"enable_moe_block\":true"), G4_ERR_CONFIG, "enable_moe_block needs num_experts"},
    {"MoE top_k above num_experts", C("\"enable_moe_block\":true,\"num_experts\":2,\"top_k_experts\":3,\"moe_intermediate_size\":4"),
     G4_ERR_CONFIG, "num_experts >= top_k_experts"},
    {"MoE top_k 300 (the forward pass holds 256)",
     C("\"enable_moe_block\":true,\"num_experts\":512,\"top_k_experts\":300,\"moe_intermediate_size\":4"), G4_ERR_CONFIG,
     "'top_k_experts' is 300"},
    {"attention_bias true", C("\"attention_bias\":true"), G4_ERR_CONFIG, "'attention_bias' is true"},
    {"hidden_activation silu", C("\"hidden_activation\":\"silu\""), G4_ERR_CONFIG, "'hidden_activation' is \"silu\""},
    {"hidden_activation a number", C("\"hidden_activation\":1"), G4_ERR_CONFIG, "'hidden_activation' must be a string"},
    {"use_bidirectional_attention all", C("\"use_bidirectional_attention\":\"all\""), G4_ERR_CONFIG,
     "'use_bidirectional_attention' is \"all\""},
};

/* Unusual but valid configs: must parse and plan. */
static const struct { const char *label, *json; } g_config_ok[] = {
    {"unknown keys and nested metadata", C("\"quantization_config\":{\"a\":[1,{\"b\":null}]},\"my_key\":true,\"auto_map\":{}")},
    {"null optional fields", C("\"num_experts\":null,\"top_k_experts\":null,\"moe_intermediate_size\":null,\"use_bidirectional_attention\":null")},
    {"unicode escapes and UTF-8 in unknown keys", C("\"na\\u00efve \\ud83d\\ude00\":\"caf\xc3\xa9\",\"\\u0000\":1")},
    /* Python's json keeps lone surrogates (transformers loads this); serde_json would refuse them */
    {"lone surrogates in an unknown key and value", C("\"x\\ud800\":\"\\udc00\\ud800\\u0041\"")},
    {"a number written 0e400 (zero)", C("\"rms_norm_eps\":0e400")},
    {"wrapper with vision and audio configs", "{\"model_type\":\"gemma4\",\"vision_config\":{\"hidden_size\":16,"
                                               "\"num_attention_heads\":2,\"num_key_value_heads\":2,\"head_dim\":8},"
                                               "\"audio_config\":null,\"text_config\":{" B "}}"},
    {"per_layer_config with zero-padded keys", C("\"per_layer_config\":{\"01\":{\"head_dim\":8,\"num_key_value_heads\":1}}")},
};

static void write_config_dir(const char *dir, const char *json, size_t len) {
    mkdir(dir, 0755);
    write_file(P(dir, "config.json"), json, len);
}

static void test_config_cases(void) {
    size_t k;
    char dir[400], args[600];
    snprintf(dir, sizeof dir, "%s/cfg", g_tmp);
    for (k = 0; k < sizeof g_config_cases / sizeof g_config_cases[0]; k++) {
        const config_case *cc = &g_config_cases[k];
        g4_config c;
        g4_result r;
        begin("config: %s", cc->label);
        r = g4_config_parse(&c, cc->json, strlen(cc->json), "t.json");
        if (cc->want == G4_ERR_PLAN) {
            g4_plan p;
            CHECK(r == G4_OK, "the config itself is valid: %s", c.error);
            expect(g4_plan_build(&p, &c), G4_ERR_PLAN, p.error, cc->needle, NULL);
        } else {
            expect(r, cc->want, c.error, cc->needle, "t.json");
        }
        /* the same file through the CLI: one line naming the file */
        write_config_dir(dir, cc->json, strlen(cc->json));
        snprintf(args, sizeof args, "info %s", dir);
        cli(args, 1, "config.json");
        end();
    }
    for (k = 0; k < sizeof g_config_ok / sizeof g_config_ok[0]; k++) {
        g4_config c;
        g4_plan p;
        begin("config (valid): %s", g_config_ok[k].label);
        CHECK(g4_config_parse(&c, g_config_ok[k].json, strlen(g_config_ok[k].json), "t.json") == G4_OK, "%s", c.error);
        CHECK(g4_plan_build(&p, &c) == G4_OK, "%s", p.error);
        if (strstr(g_config_ok[k].label, "0e400")) CHECK(c.rms_norm_eps == 0.0f, "0e400 must read as 0, got %g", c.rms_norm_eps);
        if (strstr(g_config_ok[k].label, "zero-padded")) CHECK(c.layer_head_dim[1] == 8 && c.layer_kv_heads[1] == 1, "01 is layer 1");
        write_config_dir(dir, g_config_ok[k].json, strlen(g_config_ok[k].json));
        snprintf(args, sizeof args, "info %s", dir);
        cli(args, 0, NULL);
        end();
    }
}

/* Configs that need more than a table row. */
static void test_config_special(void) {
    g4_config c;
    char *big, dir[400], args[600];
    size_t k, n;
    snprintf(dir, sizeof dir, "%s/cfg", g_tmp);

    begin("config: nesting 100 deep");
    big = (char *)malloc(1000);
    n = (size_t)sprintf(big, "{" B ",\"x\":");
    for (k = 0; k < 100; k++) big[n++] = '[';
    for (k = 0; k < 100; k++) big[n++] = ']';
    big[n++] = '}';
    expect(g4_config_parse(&c, big, n, "t.json"), G4_ERR_JSON, c.error, "nesting deeper than 64", "t.json");
    write_config_dir(dir, big, n);
    snprintf(args, sizeof args, "info %s", dir);
    cli(args, 1, "nesting");
    end();

    begin("config (valid): nesting 63 deep in an unknown key");
    n = (size_t)sprintf(big, "{" B ",\"x\":");
    for (k = 0; k < 63; k++) big[n++] = '[';
    for (k = 0; k < 63; k++) big[n++] = ']';
    big[n++] = '}';
    CHECK(g4_config_parse(&c, big, n, "t.json") == G4_OK, "%s", c.error);
    free(big);
    end();

    begin("config (valid): a 4 MiB string value and a 64 KiB key");
    big = (char *)malloc(5u << 20);
    n = (size_t)sprintf(big, "{" B ",\"note\":\"");
    for (k = 0; k < (4u << 20); k++) big[n++] = (char)('a' + k % 26);
    n += (size_t)sprintf(big + n, "\",\"");
    for (k = 0; k < (64u << 10); k++) big[n++] = 'k';
    n += (size_t)sprintf(big + n, "\":1}");
    CHECK(g4_config_parse(&c, big, n, "t.json") == G4_OK, "%s", c.error);
    end();

    begin("config: a 4 MiB model_type (message stays short)");
    n = (size_t)sprintf(big, "{" B ",\"model_type\":\"");
    for (k = 0; k < (4u << 20); k++) big[n++] = 'x';
    n += (size_t)sprintf(big + n, "\"}");
    expect(g4_config_parse(&c, big, n, "t.json"), G4_ERR_CONFIG, c.error, "model_type \"xxxx", "t.json");
    CHECK(strlen(c.error) < 200, "message of %lu bytes", (unsigned long)strlen(c.error));
    free(big);
    end();

    begin("config: NUL byte inside the text");
    {
        static const char t[] = "{\"vocab_size\":\0 3}";
        expect(g4_config_parse(&c, t, sizeof t - 1, "t.json"), G4_ERR_JSON, c.error, "unexpected character", "t.json");
        CHECK(strstr(c.error, "column 15") != NULL, "position: %s", c.error);
    }
    end();

    begin("config: duplicate keys, the last wins (as Python's json)");
    {
        const char *t = C("\"hidden_size\":16");
        CHECK(g4_config_parse(&c, t, strlen(t), "t.json") == G4_OK && c.hidden_size == 16, "hidden_size %d: %s",
              c.hidden_size, c.error);
    }
    end();

    begin("config file: empty");
    write_config_dir(dir, "", 0);
    expect(g4_config_load(&c, P(dir, "config.json")), G4_ERR_JSON, c.error, "config.json", "unexpected end");
    snprintf(args, sizeof args, "info %s", dir);
    cli(args, 1, "config.json");
    end();

    begin("config file: truncated copy of a real config");
    {
        char *text, err[G4_ERROR_MAX];
        size_t len;
        if (g4__read_file(P(tiny("e2b_like"), "config.json"), &text, &len, 1 << 20, err) == G4_OK) {
            write_config_dir(dir, text, len / 2);
            free(text);
        }
        expect(g4_config_load(&c, P(dir, "config.json")), G4_ERR_JSON, c.error, "config.json", "invalid JSON");
        cli(args, 1, "config.json");
    }
    end();

    begin("config file: config.json is a directory");
    remove(P(dir, "config.json"));
    mkdir(P(dir, "config.json"), 0755);
    expect(g4_config_load(&c, P(dir, "config.json")), G4_ERR_IO, c.error, "config.json", "directory");
    cli(args, 1, "directory");
    {
        g4_model m;
        expect(g4_model_load(&m, dir), G4_ERR_IO, m.error, "config.json", "directory");
    }
    rmdir(P(dir, "config.json"));
    end();

    begin("config file: config.json is a FIFO (refused, not waited on)");
    remove(P(dir, "config.json"));
    mkfifo(P(dir, "config.json"), 0644);
    expect(g4_config_load(&c, P(dir, "config.json")), G4_ERR_IO, c.error, "config.json", "not a regular file");
    cli(args, 1, "not a regular file");
    remove(P(dir, "config.json"));
    end();

    begin("config file: missing");
    expect(g4_config_load(&c, P(dir, "config.json")), G4_ERR_IO, c.error, "config.json", "cannot open");
    cli(args, 1, "config.json");
    snprintf(args, sizeof args, "info %s/nope.json", dir);
    cli(args, 1, "nope.json");
    end();
}

/* ---------------------------------------------------------- safetensors */

/* A safetensors file from raw parts: the 8-byte length (hlen as a uint64,
   or the header's length when hlen is -1), the header text, then `data` bytes. */
static void st_raw(const char *path, int64_t hlen, const char *header, size_t data) {
    size_t hl = strlen(header), i;
    uint64_t len = hlen == -1 ? (uint64_t)hl : (uint64_t)hlen;
    unsigned char *buf = (unsigned char *)calloc(8 + hl + data + 1, 1);
    for (i = 0; i < 8; i++) buf[i] = (unsigned char)(len >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (i = 0; i < data; i++) buf[8 + hl + i] = (unsigned char)(i * 13);
    write_file(path, buf, 8 + hl + data);
    free(buf);
}

/* The tensors of a tiny checkpoint, to be edited and written back. */
typedef struct { char name[160]; char dtype[16]; int ndim; int64_t shape[8]; const void *data; size_t bytes; } ent;
typedef struct { g4_model src; ent *e; int n; } ents;

static int ents_load_file(ents *s, const char *dir, const char *file) {
    int i;
    memset(s, 0, sizeof *s);
    if (g4__add_file(&s->src, dir, file) != G4_OK) { printf("  %s\n", s->src.error); g4_model_free(&s->src); return 0; }
    s->e = (ent *)calloc((size_t)s->src.n_tensors + 16, sizeof(ent));
    for (i = 0; i < s->src.n_tensors; i++) {
        const g4__stinfo *st = &s->src.tensors[i];
        ent *e = &s->e[s->n++];
        snprintf(e->name, sizeof e->name, "%s", st->name);
        snprintf(e->dtype, sizeof e->dtype, "%s", st->t.dtype == G4_BF16 ? "BF16" : st->t.dtype == G4_F16 ? "F16" : "F32");
        e->ndim = st->t.ndim;
        memcpy(e->shape, st->t.shape, sizeof e->shape);
        e->data = st->t.data;
        e->bytes = (size_t)(st->end - st->begin);
    }
    return 1;
}

static int ents_load(ents *s, const char *model) { return ents_load_file(s, tiny(model), "model.safetensors"); }

static void ents_free(ents *s) {
    free(s->e);
    g4_model_free(&s->src);
}

static ent *ents_find(ents *s, const char *name) {
    int i;
    for (i = 0; i < s->n; i++)
        if (strcmp(s->e[i].name, name) == 0) return &s->e[i];
    printf("  no tensor %s to edit\n", name);
    return &s->e[s->n]; /* a spare zeroed slot: the case then fails visibly */
}

static void ents_drop(ents *s, const char *name) {
    ent *e = ents_find(s, name);
    if (e < s->e + s->n) { *e = s->e[s->n - 1]; s->n--; }
}

static ent *ents_add(ents *s, const char *name, const char *dtype, int ndim, int64_t d0, int64_t d1, size_t bytes) {
    static const unsigned char zeros[4096];
    ent *e = &s->e[s->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->dtype, sizeof e->dtype, "%s", dtype);
    e->ndim = ndim;
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->data = zeros;
    e->bytes = bytes;
    return e;
}

static int ents_write(const ents *s, const char *path, const char *extra_header) {
    FILE *f = fopen(path, "wb");
    size_t cap = 1 << 20, hl = 0, off = 0;
    char *hdr = (char *)malloc(cap);
    int i, k;
    if (!f || !hdr) { if (f) fclose(f); free(hdr); return 0; }
    hl += (size_t)snprintf(hdr + hl, cap - hl, "{");
    for (i = 0; i < s->n; i++) {
        const ent *e = &s->e[i];
        hl += (size_t)snprintf(hdr + hl, cap - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", e->name, e->dtype);
        for (k = 0; k < e->ndim; k++) hl += (size_t)snprintf(hdr + hl, cap - hl, "%s%lld", k ? "," : "", (long long)e->shape[k]);
        hl += (size_t)snprintf(hdr + hl, cap - hl, "],\"data_offsets\":[%lu,%lu]}", (unsigned long)off,
                               (unsigned long)(off + e->bytes));
        off += e->bytes;
    }
    if (extra_header) hl += (size_t)snprintf(hdr + hl, cap - hl, "%s", extra_header);
    hl += (size_t)snprintf(hdr + hl, cap - hl, "}");
    while (hl % 8) hdr[hl++] = ' ';
    for (k = 0; k < 8; k++) fputc((int)(((uint64_t)hl >> (8 * k)) & 0xff), f);
    fwrite(hdr, 1, hl, f);
    for (i = 0; i < s->n; i++) fwrite(s->e[i].data, 1, s->e[i].bytes, f);
    fclose(f);
    free(hdr);
    return 1;
}

static char g_st_dir[400];

/* Loads g_st_dir (config.json of e2b_like + the model.safetensors just
   written) and checks the result; then the CLI on the same directory. */
static void st_expect(g4_result want, const char *n1, const char *n2) {
    g4_model m;
    char args[800];
    g4_result r = g4_model_load(&m, g_st_dir);
    expect(r, want, m.error, n1, n2);
    if (r != G4_OK) CHECK(m.files == NULL && m.tensors == NULL && m.w.layers == NULL, "a failed load must free everything");
    if (r == G4_OK) {
        g4_session_config sc = g4_session_config_init();
        size_t bytes;
        void *arena;
        g4_session s;
        float logits[512 * 3];
        int32_t ids[3] = {2, 81, 101};
        sc.max_context = 8;
        CHECK(g4_session_size(&m, &sc, &bytes) == G4_OK, "size");
        arena = malloc(bytes);
        CHECK(g4_session_init(&s, &m, &sc, arena, bytes) == G4_OK, "%s", s.error);
        CHECK(g4_forward(&s, ids, 3, logits, G4_LOGITS_ALL) == G4_OK, "%s", s.error);
        free(arena);
        g4_model_free(&m);
    }
    snprintf(args, sizeof args, "logits %s --ids 2,81,101 --out %s/cli_logits.bin", g_st_dir, g_tmp);
    cli(args, want == G4_OK ? 0 : 1, n1);
}

#define STP P(g_st_dir, "model.safetensors")
#define T1 "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}"

static void raw_case(const char *label, int64_t hlen, const char *header, size_t data, g4_result want, const char *n1,
                     const char *n2) {
    begin("safetensors: %s", label);
    st_raw(STP, hlen, header, data);
    st_expect(want, n1, n2);
    end();
}

static void test_safetensors_cases(void) {
    ents s;
    snprintf(g_st_dir, sizeof g_st_dir, "%s/st", g_tmp);
    mkdir(g_st_dir, 0755);
    copy_file(P(tiny("e2b_like"), "config.json"), P(g_st_dir, "config.json"));

    begin("safetensors: missing file");
    remove(STP);
    st_expect(G4_ERR_IO, "model.safetensors", "cannot open");
    end();
    begin("safetensors: the path is a directory");
    mkdir(STP, 0755);
    st_expect(G4_ERR_IO, "model.safetensors", "not a regular file");
    rmdir(STP);
    end();
    begin("safetensors: the path is a FIFO (refused, not waited on)");
    mkfifo(STP, 0644);
    st_expect(G4_ERR_IO, "model.safetensors", "not a regular file");
    remove(STP);
    end();
    begin("safetensors: empty file");
    write_file(STP, "", 0);
    st_expect(G4_ERR_SAFETENSORS, "model.safetensors", "8-byte header length");
    end();
    begin("safetensors: 3 bytes");
    write_file(STP, "abc", 3);
    st_expect(G4_ERR_SAFETENSORS, "model.safetensors", "3 bytes");
    end();
    raw_case("header length 0", 0, "", 0, G4_ERR_SAFETENSORS, "model.safetensors", "header length 0");
    raw_case("header length 1", 1, "{", 0, G4_ERR_SAFETENSORS, "model.safetensors", "header length 1");
    raw_case("header length 2^64-2", -2, "{}", 0, G4_ERR_SAFETENSORS, "model.safetensors", "header length 18446744073709551614");
    raw_case("header length one past the end", 3, "{}", 0, G4_ERR_SAFETENSORS, "model.safetensors",
             "header length 3 does not fit the file (10 bytes)");
    raw_case("header length 1 TiB", (int64_t)1 << 40, "{}", 64, G4_ERR_SAFETENSORS, "model.safetensors", "header length 1099511627776");
    raw_case("header not JSON", -1, "{abc}", 0, G4_ERR_SAFETENSORS, "model.safetensors", "invalid JSON");
    raw_case("header cut inside a string", 12, "{\"model.embed_tokens.weight\":{}}", 0, G4_ERR_SAFETENSORS,
             "model.safetensors", "unterminated string");
    raw_case("header is an array", -1, "[]", 0, G4_ERR_SAFETENSORS, "model.safetensors", "header must be a JSON object");
    raw_case("header is a number", -1, "12", 0, G4_ERR_SAFETENSORS, "model.safetensors", "header must be a JSON object");
    raw_case("header {} (no tensors)", -1, "{}", 0, G4_ERR_WEIGHTS, "embed_tokens", NULL);
    raw_case("header with only __metadata__", -1, "{\"__metadata__\":{\"format\":\"pt\"}}", 0, G4_ERR_WEIGHTS, "embed_tokens", NULL);
    raw_case("tensor entry not an object", -1, "{\"a\":1}", 0, G4_ERR_SAFETENSORS, "tensor 'a': entry must be an object", NULL);
    raw_case("missing dtype", -1, "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, G4_ERR_SAFETENSORS,
             "model.safetensors", "tensor 'a' has no dtype");
    raw_case("dtype a number", -1, "{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, G4_ERR_SAFETENSORS,
             "model.safetensors", "tensor 'a' has no dtype");
    raw_case("missing shape", -1, "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, G4_ERR_SAFETENSORS,
             "model.safetensors", "tensor 'a' needs a shape array");
    raw_case("shape a string", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", 8, G4_ERR_SAFETENSORS,
             "model.safetensors", "tensor 'a' needs a shape array");
    raw_case("shape with 9 dims", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
             G4_ERR_SAFETENSORS, "tensor 'a' needs a shape array of at most 8 dims", NULL);
    raw_case("negative dim", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-2],\"data_offsets\":[0,16]}}", 16, G4_ERR_SAFETENSORS,
             "model.safetensors", "tensor 'a': shape[1] is not an integer");
    raw_case("dim 2^41", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2199023255552],\"data_offsets\":[0,16]}}", 16,
             G4_ERR_SAFETENSORS, "tensor 'a': shape[0]", NULL);
    raw_case("fractional dim", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, G4_ERR_SAFETENSORS,
             "tensor 'a': shape[0]", NULL);
    raw_case("dim a string", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}", 16, G4_ERR_SAFETENSORS,
             "tensor 'a': shape[0]", NULL);
    raw_case("element count overflows", -1,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,0]}}", 0,
             G4_ERR_SAFETENSORS, "tensor 'a': element count overflows", NULL);
    raw_case("element count times dtype size overflows", -1,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,4194304],\"data_offsets\":[0,0]}}", 0,
             G4_ERR_SAFETENSORS, "tensor 'a': element count times dtype size overflows", NULL);
    raw_case("missing data_offsets", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, G4_ERR_SAFETENSORS,
             "tensor 'a' needs data_offsets", NULL);
    raw_case("data_offsets with 3 entries", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8,
             G4_ERR_SAFETENSORS, "tensor 'a' needs data_offsets", NULL);
    raw_case("data_offsets reversed", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
             G4_ERR_SAFETENSORS, "tensor 'a': data_offsets must satisfy", NULL);
    raw_case("data_offsets negative", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
             G4_ERR_SAFETENSORS, "tensor 'a': data_offsets must satisfy", NULL);
    raw_case("data_offsets past the end", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
             G4_ERR_SAFETENSORS, "truncated: the file has 71 bytes, its header describes 79", NULL);
    raw_case("data_offsets not integers", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]}}", 8,
             G4_ERR_SAFETENSORS, "tensor 'a': data_offsets must satisfy", NULL);
    raw_case("data_offsets disagree with shape x dtype", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,8]}}",
             16, G4_ERR_SAFETENSORS, "tensor 'a': 8 bytes of data, but its shape and dtype need 16", NULL);
    raw_case("overlapping tensors", -1,
             "{" T1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, G4_ERR_SAFETENSORS,
             "tensors 'a' and 'b' overlap", "model.safetensors");
    raw_case("overlap behind an empty tensor", -1,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},\"e\":{\"dtype\":\"F32\",\"shape\":[0],"
             "\"data_offsets\":[8,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
             32, G4_ERR_SAFETENSORS, "tensors 'a' and 'b' overlap", NULL);
    raw_case("one tensor inside another", -1,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],"
             "\"data_offsets\":[4,8]},\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[20,24]}}",
             32, G4_ERR_SAFETENSORS, "overlap", NULL);
    raw_case("a name twice in one header", -1, "{" T1 "," T1 "}", 16, G4_ERR_SAFETENSORS, "tensor 'a' appears twice", NULL);

    if (!ents_load(&s, "e2b_like")) { begin("safetensors: variants"); CHECK(0, "cannot read e2b_like"); end(); return; }
    begin("safetensors: missing required tensor");
    {
        ents v = s;
        v.e = (ent *)calloc((size_t)s.n + 16, sizeof(ent));
        memcpy(v.e, s.e, sizeof(ent) * (size_t)s.n);
        ents_drop(&v, "model.layers.3.mlp.down_proj.weight");
        ents_write(&v, STP, NULL);
        st_expect(G4_ERR_WEIGHTS, "checkpoint has no tensor 'model.layers.3.mlp.down_proj.weight' (expected [32, 48])", NULL);
        free(v.e);
    }
    end();
#define VARIANT(label, edit, want, n1, n2)                               \
    do {                                                                 \
        ents v = s;                                                      \
        begin("safetensors: %s", label);                                 \
        v.e = (ent *)calloc((size_t)s.n + 16, sizeof(ent));              \
        memcpy(v.e, s.e, sizeof(ent) * (size_t)s.n);                     \
        { edit; }                                                        \
        ents_write(&v, STP, NULL);                                       \
        st_expect(want, n1, n2);                                         \
        free(v.e);                                                       \
        end();                                                           \
    } while (0)
    VARIANT("right size, wrong shape (transposed)",
            { ent *e = ents_find(&v, "model.layers.0.mlp.gate_proj.weight"); e->shape[0] = 32; e->shape[1] = 48; },
            G4_ERR_WEIGHTS, "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [32, 48], expected [48, 32]",
            "model.safetensors");
    VARIANT("right size, wrong rank", { ent *e = ents_find(&v, "model.norm.weight"); e->ndim = 2; e->shape[1] = e->shape[0]; e->shape[0] = 1; },
            G4_ERR_WEIGHTS, "tensor 'model.norm.weight' has shape [1, 32], expected [32]", NULL);
    VARIANT("unknown dtype on a required tensor", { snprintf(ents_find(&v, "model.norm.weight")->dtype, 16, "F8_E4M3"); },
            G4_ERR_WEIGHTS, "tensor 'model.norm.weight' must be BF16, F16 or F32", "model.safetensors");
    VARIANT("dtype BF16\\u0000 (not BF16)", { snprintf(ents_find(&v, "model.norm.weight")->dtype, 16, "BF16\\u0000"); },
            G4_ERR_WEIGHTS, "tensor 'model.norm.weight' must be BF16, F16 or F32", NULL);
    VARIANT("tensor name with \\u0000", { snprintf(ents_find(&v, "model.norm.weight")->name, 160, "model.norm.weight\\u0000x"); },
            G4_ERR_SAFETENSORS, "tensor name 'model.norm.weight\\u0000...' holds a NUL character", "model.safetensors");
    VARIANT("integer dtype on a required tensor", { snprintf(ents_find(&v, "model.layers.0.layer_scalar")->dtype, 16, "I16"); },
            G4_ERR_WEIGHTS, "tensor 'model.layers.0.layer_scalar' must be BF16, F16 or F32", NULL);
    VARIANT("I32 of the right byte count on a required tensor",
            { ent *e = ents_find(&v, "model.norm.weight"); snprintf(e->dtype, 16, "I32"); e->shape[0] = 16; },
            G4_ERR_WEIGHTS, "tensor 'model.norm.weight' must be BF16, F16 or F32", NULL);
    VARIANT("dtype and size disagree (F32 label on BF16 bytes)", { snprintf(ents_find(&v, "model.norm.weight")->dtype, 16, "F32"); },
            G4_ERR_SAFETENSORS, "tensor 'model.norm.weight': 64 bytes of data, but its shape and dtype need 128", NULL);
    VARIANT("no embedding under either prefix", { snprintf(ents_find(&v, "model.embed_tokens.weight")->name, 160, "embed.weight"); },
            G4_ERR_WEIGHTS, "neither 'model.language_model.embed_tokens.weight' nor 'model.embed_tokens.weight'", NULL);
    VARIANT("tensor name duplicated by a \\u escape",
            { snprintf(ents_find(&v, "model.layers.9.layer_scalar")->name, 160, "model.norm.w\\u0065ight"); },
            G4_ERR_SAFETENSORS, "tensor 'model.norm.weight' appears twice", NULL);
    /* valid: extra tensors the text decoder does not use */
    VARIANT("(valid) vision and audio tower tensors",
            { ents_add(&v, "model.vision_tower.encoder.weight", "BF16", 2, 4, 4, 32);
              ents_add(&v, "model.audio_tower.conv.weight", "F32", 1, 3, 0, 12);
              ents_add(&v, "model.embed_vision.weight", "F16", 2, 2, 2, 8); },
            G4_OK, NULL, NULL);
    VARIANT("(valid) stale reader K/V tensors",
            { ents_add(&v, "model.layers.7.self_attn.k_proj.weight", "BF16", 2, 16, 32, 1024);
              ents_add(&v, "model.layers.7.self_attn.v_proj.weight", "BF16", 2, 16, 32, 1024);
              ents_add(&v, "model.layers.7.self_attn.k_norm.weight", "BF16", 1, 16, 0, 32); },
            G4_OK, NULL, NULL);
    VARIANT("(valid) unknown dtypes on unused tensors",
            { ents_add(&v, "model.vision_tower.scale", "F8_E4M3", 1, 5, 0, 5);
              ents_add(&v, "model.audio_tower.mask", "BOOL", 1, 3, 0, 3);
              ents_add(&v, "model.vision_tower.q", "U4", 1, 8, 0, 4); },
            G4_OK, NULL, NULL);
    VARIANT("(valid) a zero-size tensor", { ents_add(&v, "model.vision_tower.empty", "F32", 2, 0, 7, 0); }, G4_OK, NULL, NULL);
    begin("safetensors: (valid) __metadata__ with extra fields");
    ents_write(&s, STP, ",\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\\u00e9\",\"other\":[1,2]}");
    st_expect(G4_OK, NULL, NULL);
    end();
    begin("safetensors: truncated data (file cut by 100 bytes)");
    {
        char *text, err[G4_ERROR_MAX];
        size_t len;
        ents_write(&s, STP, NULL);
        if (g4__read_file(STP, &text, &len, (size_t)1 << 26, err) == G4_OK) {
            write_file(STP, text, len - 100);
            free(text);
        }
        st_expect(G4_ERR_SAFETENSORS, "model.safetensors: truncated: the file has ", ", its header describes ");
    }
    end();
    begin("safetensors: truncated inside the header");
    {
        char *text, err[G4_ERROR_MAX];
        size_t len;
        ents_write(&s, STP, NULL);
        if (g4__read_file(STP, &text, &len, (size_t)1 << 26, err) == G4_OK) {
            write_file(STP, text, 1000);
            free(text);
        }
        st_expect(G4_ERR_SAFETENSORS, "model.safetensors", "does not fit the file (1000 bytes)");
    }
    end();
    begin("safetensors: untied config without lm_head.weight");
    {
        char *text, err[G4_ERROR_MAX], *p, *out;
        size_t len;
        if (g4__read_file(P(tiny("e2b_like"), "config.json"), &text, &len, 1 << 20, err) == G4_OK) {
            out = (char *)malloc(len + 16);
            if ((p = strstr(text, "\"tie_word_embeddings\": true"))) {
                *p = 0;
                snprintf(out, len + 16, "%s\"tie_word_embeddings\": false%s", text, p + 27);
                write_file(P(g_st_dir, "config.json"), out, strlen(out));
            } else printf("  e2b_like config has no tie_word_embeddings: true\n");
            free(out);
            free(text);
        }
        ents_write(&s, STP, NULL);
        st_expect(G4_ERR_WEIGHTS, "checkpoint has no tensor 'lm_head.weight' (expected [512, 32])", NULL);
        copy_file(P(tiny("e2b_like"), "config.json"), P(g_st_dir, "config.json"));
    }
    end();
    ents_free(&s);
}

/* ---------------------------------------------------------- shard index */

static char g_ix_dir[400];

static void index_case(const char *label, const char *index_json, g4_result want, const char *n1, const char *n2) {
    g4_model m;
    char args[800];
    g4_result r;
    begin("index: %s", label);
    write_file(P(g_ix_dir, "model.safetensors.index.json"), index_json, strlen(index_json));
    r = g4_model_load(&m, g_ix_dir);
    expect(r, want, m.error, n1, n2);
    if (r != G4_OK) CHECK(m.files == NULL && m.tensors == NULL, "a failed load must free everything");
    else g4_model_free(&m);
    snprintf(args, sizeof args, "logits %s --ids 2,3 --out %s/cli_logits.bin", g_ix_dir, g_tmp);
    cli(args, want == G4_OK ? 0 : 1, n1);
    end();
}

#define SH1 "model-00001-of-00005.safetensors"

static void test_index_cases(void) {
    static const char *shards[] = {SH1, "model-00002-of-00005.safetensors", "model-00003-of-00005.safetensors",
                                   "model-00004-of-00005.safetensors", "model-00005-of-00005.safetensors"};
    char outside[400];
    int k;
    snprintf(g_ix_dir, sizeof g_ix_dir, "%s/ix/model", g_tmp);
    mkdir(P(g_tmp, "ix"), 0755);
    mkdir(g_ix_dir, 0755);
    copy_file(P(tiny("31b_like"), "config.json"), P(g_ix_dir, "config.json"));
    for (k = 0; k < 5; k++) copy_file(P(tiny("31b_like"), shards[k]), P(g_ix_dir, shards[k]));
    /* a valid shard just outside the model directory: an escaping index must not reach it */
    snprintf(outside, sizeof outside, "%s/ix/outside.safetensors", g_tmp);
    copy_file(P(tiny("31b_like"), SH1), outside);

    index_case("not JSON", "{\"weight_map\": {", G4_ERR_JSON, "model.safetensors.index.json", "invalid JSON");
    index_case("empty file", "", G4_ERR_JSON, "model.safetensors.index.json", "unexpected end");
    index_case("top level an array", "[\"" SH1 "\"]", G4_ERR_SAFETENSORS, "model.safetensors.index.json", "needs a \"weight_map\" object");
    index_case("no weight_map", "{\"metadata\":{}}", G4_ERR_SAFETENSORS, "model.safetensors.index.json", "weight_map");
    index_case("weight_map an array", "{\"weight_map\":[]}", G4_ERR_SAFETENSORS, "needs a \"weight_map\" object", NULL);
    index_case("weight_map empty", "{\"weight_map\":{}}", G4_ERR_SAFETENSORS, "model.safetensors.index.json", "weight_map is empty");
    index_case("a shard name that is a number", "{\"weight_map\":{\"model.norm.weight\":5}}", G4_ERR_SAFETENSORS,
               "weight_map[\"model.norm.weight\"] must be a file name", NULL);
    index_case("a shard name with \\u0000", "{\"weight_map\":{\"model.norm.weight\":\"" SH1 "\\u0000.x\"}}", G4_ERR_SAFETENSORS,
               "weight_map[\"model.norm.weight\"] holds a NUL character", NULL);
    index_case("a tensor name with \\u0000", "{\"weight_map\":{\"model.norm.weight\\u0000\":\"" SH1 "\"}}", G4_ERR_SAFETENSORS,
               "holds a NUL character", NULL);
    /* Python's json reads lone surrogates; no safetensors header can name such a tensor (serde_json refuses them) */
    index_case("a shard name with a lone surrogate", "{\"weight_map\":{\"model.norm.weight\":\"" SH1 "\\udc80\"}}",
               G4_ERR_SAFETENSORS, "weight_map[\"model.norm.weight\"] holds a lone surrogate", NULL);
    index_case("a tensor name with a lone surrogate", "{\"weight_map\":{\"model.norm.weight\\ud800\":\"" SH1 "\"}}",
               G4_ERR_SAFETENSORS, "model.safetensors.index.json", "holds a lone surrogate");
    index_case("invalid UTF-8 in a tensor name", "{\"weight_map\":{\"model.norm.weight\xff\":\"" SH1 "\"}}", G4_ERR_JSON,
               "model.safetensors.index.json", "invalid UTF-8: a byte that never occurs in UTF-8 (byte 0xFF)");
    index_case("a shard that does not exist", "{\"weight_map\":{\"model.norm.weight\":\"model-00009-of-00005.safetensors\"}}",
               G4_ERR_IO, "model-00009-of-00005.safetensors: cannot open", NULL);
    index_case("shard path ../", "{\"weight_map\":{\"model.norm.weight\":\"../outside.safetensors\"}}", G4_ERR_SAFETENSORS,
               "shard \"../outside.safetensors\" (for 'model.norm.weight') is not a plain file name", "refused");
    index_case("shard path absolute", "{\"weight_map\":{\"model.norm.weight\":\"/etc/passwd\"}}", G4_ERR_SAFETENSORS,
               "shard \"/etc/passwd\"", "refused");
    index_case("shard path in a subdirectory", "{\"weight_map\":{\"model.norm.weight\":\"sub/" SH1 "\"}}", G4_ERR_SAFETENSORS,
               "shard \"sub/" SH1 "\"", "refused");
    index_case("shard path ..", "{\"weight_map\":{\"model.norm.weight\":\"..\"}}", G4_ERR_SAFETENSORS, "shard \"..\"", "refused");
    index_case("shard path .", "{\"weight_map\":{\"model.norm.weight\":\".\"}}", G4_ERR_SAFETENSORS, "shard \".\"", "refused");
    index_case("shard path with a backslash", "{\"weight_map\":{\"model.norm.weight\":\"..\\\\outside.safetensors\"}}",
               G4_ERR_SAFETENSORS, "outside.safetensors", "refused");
    index_case("shard path with a drive letter", "{\"weight_map\":{\"model.norm.weight\":\"C:" SH1 "\"}}", G4_ERR_SAFETENSORS,
               "shard \"C:", "refused");
    index_case("shard path empty", "{\"weight_map\":{\"model.norm.weight\":\"\"}}", G4_ERR_SAFETENSORS, "shard \"\"", "refused");
    index_case("escaping shard after a good one",
               "{\"weight_map\":{\"model.embed_tokens.weight\":\"" SH1 "\",\"model.norm.weight\":\"../outside.safetensors\"}}",
               G4_ERR_SAFETENSORS, "../outside.safetensors", "refused");
    index_case("a tensor listed in the wrong shard", "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00002-of-00005.safetensors\"}}",
               G4_ERR_SAFETENSORS, "lists tensor 'model.embed_tokens.weight' in model-00002-of-00005.safetensors, but that shard does not have it",
               NULL);
    index_case("a tensor no shard has", "{\"weight_map\":{\"model.nope\":\"" SH1 "\"}}", G4_ERR_SAFETENSORS,
               "lists tensor 'model.nope'", NULL);
    copy_file(P(g_ix_dir, SH1), P(g_ix_dir, "copy.safetensors"));
    index_case("one tensor in two shards",
               "{\"weight_map\":{\"model.embed_tokens.weight\":\"" SH1 "\",\"x\":\"copy.safetensors\"}}", G4_ERR_SAFETENSORS,
               "appears twice", "copy.safetensors");
    mkdir(P(g_ix_dir, "dir.safetensors"), 0755);
    index_case("a shard that is a directory", "{\"weight_map\":{\"model.norm.weight\":\"dir.safetensors\"}}", G4_ERR_IO,
               "dir.safetensors: not a regular file", NULL);
    write_file(P(g_ix_dir, "bad.safetensors"), "\x02\0\0\0\0\0\0\0[]", 10);
    index_case("a shard with a bad header", "{\"weight_map\":{\"model.norm.weight\":\"bad.safetensors\"}}", G4_ERR_SAFETENSORS,
               "bad.safetensors: the header must be a JSON object", NULL);
    {
        /* the real index of 31b_like, with extra metadata and unknown keys: valid */
        char *text, err[G4_ERROR_MAX], *buf;
        size_t len;
        if (g4__read_file(P(tiny("31b_like"), "model.safetensors.index.json"), &text, &len, 1 << 22, err) == G4_OK) {
            buf = (char *)malloc(len + 100);
            snprintf(buf, len + 100, "{\"extra\":[1,{}],%s", text + 1);
            index_case("(valid) the real index with an unknown key", buf, G4_OK, NULL, NULL);
            free(buf);
            free(text);
        }
    }
    begin("index: the index is a directory");
    remove(P(g_ix_dir, "model.safetensors.index.json"));
    mkdir(P(g_ix_dir, "model.safetensors.index.json"), 0755);
    {
        g4_model m;
        char args[800];
        expect(g4_model_load(&m, g_ix_dir), G4_ERR_IO, m.error, "model.safetensors.index.json", "directory");
        snprintf(args, sizeof args, "logits %s --ids 2 --out %s/cli_logits.bin", g_ix_dir, g_tmp);
        cli(args, 1, "model.safetensors.index.json");
    }
    rmdir(P(g_ix_dir, "model.safetensors.index.json"));
    end();
    begin("index: the index is a FIFO (refused, not waited on)");
    mkfifo(P(g_ix_dir, "model.safetensors.index.json"), 0644);
    {
        g4_model m;
        char args[800];
        expect(g4_model_load(&m, g_ix_dir), G4_ERR_IO, m.error, "model.safetensors.index.json", "not a regular file");
        snprintf(args, sizeof args, "logits %s --ids 2 --out %s/cli_logits.bin", g_ix_dir, g_tmp);
        cli(args, 1, "not a regular file");
    }
    remove(P(g_ix_dir, "model.safetensors.index.json"));
    end();
}

/* ------------------------------------------------------------- runtime */

static g4_model g_m; /* e2b_like: vocab 512 */

static int open_session(g4_session *s, void **arena, int max_context, int chunk) {
    g4_session_config sc = g4_session_config_init();
    size_t bytes;
    sc.max_context = max_context;
    sc.max_chunk = chunk;
    if (g4_session_size(&g_m, &sc, &bytes) != G4_OK) return 0;
    *arena = malloc(bytes);
    return g4_session_init(s, &g_m, &sc, *arena, bytes) == G4_OK;
}

static void test_runtime_cases(void) {
    g4_session s;
    void *arena = NULL;
    static float logits[16 * 512];
    int32_t ids[8] = {2, 81, 101, 77, 5, 6, 7, 8}, bad[3] = {2, 3, 4};
    g4_session_config sc = g4_session_config_init();
    size_t bytes;

    begin("runtime: load the model");
    {
        int ok = g4_model_load(&g_m, tiny("e2b_like")) == G4_OK;
        CHECK(ok, "%s", g_m.error);
        ok = ok && open_session(&s, &arena, 6, 2);
        CHECK(ok, "session: %s", s.error);
        end();
        if (!ok) return;
    }

#define FWD(label, idp, n, out, mode, want, needle)                                          \
    do {                                                                                     \
        int pos = s.pos;                                                                     \
        begin("runtime: %s", label);                                                         \
        expect(g4_forward(&s, idp, n, out, mode), want, s.error, needle, NULL);              \
        if (want != G4_OK) CHECK(s.pos == pos, "an error must not advance the session");    \
        end();                                                                               \
    } while (0)
    bad[0] = -1;
    FWD("token id -1", bad, 1, logits, G4_LOGITS_LAST, G4_ERR_INPUT, "token id -1 at index 0 is outside the vocabulary [0, 512)");
    bad[0] = 512;
    FWD("token id = vocab", bad, 1, logits, G4_LOGITS_LAST, G4_ERR_INPUT, "token id 512 at index 0");
    bad[0] = INT32_MAX;
    FWD("token id INT32_MAX", bad, 1, logits, G4_LOGITS_LAST, G4_ERR_INPUT, "token id 2147483647");
    bad[0] = 2; bad[1] = 3; bad[2] = INT32_MIN;
    FWD("bad id after good ones (nothing runs)", bad, 3, logits, G4_LOGITS_LAST, G4_ERR_INPUT, "token id -2147483648 at index 2");
    FWD("NULL ids", NULL, 1, logits, G4_LOGITS_LAST, G4_ERR_INPUT, "no tokens (ids NULL");
    FWD("empty input", ids, 0, logits, G4_LOGITS_LAST, G4_ERR_INPUT, "no tokens (ids set, n 0)");
    FWD("negative count", ids, -5, logits, G4_LOGITS_LAST, G4_ERR_INPUT, "n -5");
    FWD("NULL logits with LAST", ids, 1, NULL, G4_LOGITS_LAST, G4_ERR_INPUT, "logits buffer is NULL");
    FWD("NULL logits with ALL", ids, 1, NULL, G4_LOGITS_ALL, G4_ERR_INPUT, "logits buffer is NULL");
    FWD("unknown logits mode", ids, 1, logits, 7, G4_ERR_INPUT, "unknown logits mode 7");
    FWD("sequence longer than the context", ids, 7, logits, G4_LOGITS_ALL, G4_ERR_INPUT,
        "7 tokens at position 0 exceed the session's max_context of 6");
    FWD("first 4 tokens fit", ids, 4, logits, G4_LOGITS_ALL, G4_OK, NULL);
    FWD("3 more do not", ids, 3, logits, G4_LOGITS_ALL, G4_ERR_INPUT, "3 tokens at position 4 exceed");
    FWD("2 more fill it", ids, 2, NULL, G4_LOGITS_NONE, G4_OK, NULL);
    FWD("then 1 more does not", ids, 1, logits, G4_LOGITS_LAST, G4_ERR_INPUT, "1 tokens at position 6 exceed");

    begin("runtime: after every error the session still computes the same logits");
    {
        g4_session t;
        void *arena2 = NULL;
        float a[512], b[512];
        g4_session_reset(&s);
        CHECK(s.pos == 0, "reset");
        CHECK(g4_forward(&s, ids, 5, a, G4_LOGITS_LAST) == G4_OK, "%s", s.error);
        CHECK(open_session(&t, &arena2, 6, 2) && g4_forward(&t, ids, 5, b, G4_LOGITS_LAST) == G4_OK, "fresh");
        CHECK(memcmp(a, b, sizeof a) == 0, "logits differ after errors");
        free(arena2);
    }
    end();

    begin("runtime: g4_forward(NULL)");
    CHECK(g4_forward(NULL, ids, 1, logits, G4_LOGITS_LAST) == G4_ERR_INPUT, "NULL session");
    end();
    begin("runtime: a zeroed (never initialised) session");
    {
        g4_session z;
        memset(&z, 0, sizeof z);
        expect(g4_forward(&z, ids, 1, logits, G4_LOGITS_LAST), G4_ERR_INPUT, z.error, "session is not initialised", NULL);
    }
    end();

    sc.max_context = 16;
    CHECK(g4_session_size(&g_m, &sc, &bytes) == G4_OK, "size");
    {
        unsigned char *big = (unsigned char *)malloc(bytes + 64);
        unsigned char *al = big + ((64 - (uintptr_t)big % 64) % 64);
        g4_session t;
        begin("arena: one byte too small");
        expect(g4_session_init(&t, &g_m, &sc, al, bytes - 1), G4_ERR_ARENA, t.error, "too small", "g4_session_size");
        end();
        begin("arena: zero bytes");
        expect(g4_session_init(&t, &g_m, &sc, al, 0), G4_ERR_ARENA, t.error, "arena of 0 bytes is too small", NULL);
        end();
        begin("arena: misaligned by 4");
        expect(g4_session_init(&t, &g_m, &sc, al + 4, bytes), G4_ERR_ARENA, t.error, "not 16-byte aligned", NULL);
        end();
        begin("arena: misaligned by 8");
        expect(g4_session_init(&t, &g_m, &sc, al + 8, bytes), G4_ERR_ARENA, t.error, "not 16-byte aligned", NULL);
        end();
        begin("arena: NULL");
        expect(g4_session_init(&t, &g_m, &sc, NULL, bytes), G4_ERR_ARENA, t.error, "NULL arena", NULL);
        end();
        begin("arena: a failed init leaves a session g4_forward refuses");
        g4_session_init(&t, &g_m, &sc, NULL, bytes);
        expect(g4_forward(&t, ids, 1, logits, G4_LOGITS_LAST), G4_ERR_INPUT, t.error, "not initialised", NULL);
        end();
        begin("arena: 16-byte aligned (not 64) and exactly the reported size");
        expect(g4_session_init(&t, &g_m, &sc, al + 16, bytes), G4_OK, t.error, NULL, NULL);
        CHECK(g4_forward(&t, ids, 8, logits, G4_LOGITS_ALL) == G4_OK, "%s", t.error);
        end();
        free(big);
    }
    begin("session config: max_context 0");
    sc.max_context = 0;
    CHECK(g4_session_size(&g_m, &sc, &bytes) == G4_ERR_INPUT, "size");
    expect(g4_session_init(&s, &g_m, &sc, arena, 1 << 20), G4_ERR_INPUT, s.error, "max_context must be >= 1 (got 0)", NULL);
    end();
    begin("session config: max_context negative");
    sc.max_context = -3;
    expect(g4_session_init(&s, &g_m, &sc, arena, 1 << 20), G4_ERR_INPUT, s.error, "max_context must be >= 1 (got -3)", NULL);
    end();
    begin("session config: max_chunk negative");
    sc.max_context = 4;
    sc.max_chunk = -1;
    expect(g4_session_init(&s, &g_m, &sc, arena, 1 << 20), G4_ERR_INPUT, s.error, "max_chunk must be >= 0 (got -1)", NULL);
    sc.max_chunk = 0;
    end();
    begin("session config: max_context INT32_MAX needs more than a small arena");
    sc.max_context = INT32_MAX;
    {
        g4_result r = g4_session_size(&g_m, &sc, &bytes);
        CHECK(r == G4_ERR_ARENA || (r == G4_OK && bytes > ((size_t)1 << 33)), "result %d, %lu bytes", r, (unsigned long)bytes);
        r = g4_session_init(&s, &g_m, &sc, arena, 1 << 20);
        CHECK(r == G4_ERR_ARENA, "result %d: %s", r, s.error);
        CHECK(strstr(s.error, "too small") || strstr(s.error, "does not fit"), "%s", s.error);
    }
    sc.max_context = 4;
    end();
    begin("NULL: g4_session_size arguments");
    CHECK(g4_session_size(&g_m, &sc, NULL) == G4_ERR_INPUT, "NULL bytes");
    CHECK(g4_session_size(NULL, &sc, &bytes) == G4_ERR_INPUT, "NULL model");
    CHECK(g4_session_size(&g_m, NULL, &bytes) == G4_ERR_INPUT, "NULL config");
    end();
    begin("NULL: g4_session_init arguments");
    CHECK(g4_session_init(NULL, &g_m, &sc, arena, 1 << 20) == G4_ERR_INPUT, "NULL session");
    expect(g4_session_init(&s, NULL, &sc, arena, 1 << 20), G4_ERR_INPUT, s.error, "NULL or unloaded model", NULL);
    expect(g4_session_init(&s, &g_m, NULL, arena, 1 << 20), G4_ERR_INPUT, s.error, "NULL or unloaded model / config", NULL);
    end();
    begin("g4_session_create: the errors of g4_session_init; destroy after any outcome");
    {
        g4_session c;
        CHECK(g4_session_create(NULL, &g_m, &sc) == G4_ERR_INPUT, "NULL session");
        expect(g4_session_create(&c, NULL, &sc), G4_ERR_INPUT, c.error, "NULL or unloaded model", NULL);
        g4_session_destroy(&c);
        expect(g4_session_create(&c, &g_m, NULL), G4_ERR_INPUT, c.error, "NULL or unloaded model / config", NULL);
        sc.max_context = 0;
        expect(g4_session_create(&c, &g_m, &sc), G4_ERR_INPUT, c.error, "max_context must be >= 1 (got 0)", NULL);
        g4_session_destroy(&c);
        sc.max_context = 4;
        expect(g4_session_create(&c, &g_m, &sc), G4_OK, c.error, NULL, NULL);
        CHECK(c.own_arena != NULL && c.arena_bytes > 0 && (uintptr_t)c.slots % 16 == 0, "an arena of its own");
        CHECK(g4_forward(&c, ids, 4, logits, G4_LOGITS_ALL) == G4_OK, "%s", c.error);
        g4_session_destroy(&c);
        expect(g4_forward(&c, ids, 1, logits, G4_LOGITS_LAST), G4_ERR_INPUT, c.error, "not initialised", NULL);
        g4_session_destroy(&c); /* twice is harmless */
        g4_session_destroy(NULL);
    }
    end();
    begin("NULL: an unloaded (zeroed) model");
    {
        static g4_model z;
        memset(&z, 0, sizeof z);
        expect(g4_session_init(&s, &z, &sc, arena, 1 << 20), G4_ERR_INPUT, s.error, "unloaded model", NULL);
    }
    end();
    begin("NULL: g4_model_load arguments");
    {
        static g4_model m;
        CHECK(g4_model_load(NULL, "x") == G4_ERR_INPUT, "NULL model");
        expect(g4_model_load(&m, NULL), G4_ERR_INPUT, m.error, "NULL model path", NULL);
        expect(g4_model_load(&m, P(g_tmp, "no-such-model")), G4_ERR_IO, m.error, "no-such-model/config.json: cannot open (No such file or directory)", NULL);
        g4_model_free(&m); /* freeing a failed load is harmless, twice too */
        g4_model_free(&m);
        g4_model_free(NULL);
    }
    end();
    begin("NULL: config and plan arguments");
    {
        g4_config c;
        g4_plan p;
        CHECK(g4_config_parse(NULL, "{}", 2, "x") == G4_ERR_INPUT, "NULL config");
        expect(g4_config_parse(&c, NULL, 5, "x.json"), G4_ERR_INPUT, c.error, "x.json: NULL text", NULL);
        expect(g4_config_parse(&c, "", 0, NULL), G4_ERR_JSON, c.error, "config.json", NULL);
        CHECK(g4_config_load(NULL, "x") == G4_ERR_INPUT, "NULL config");
        expect(g4_config_load(&c, NULL), G4_ERR_INPUT, c.error, "NULL path", NULL);
        CHECK(g4_plan_build(NULL, &c) == G4_ERR_INPUT, "NULL plan");
        expect(g4_plan_build(&p, NULL), G4_ERR_INPUT, p.error, "NULL config", NULL);
        g4_plan_print(NULL, &c, stdout);
        g4_plan_print(&p, NULL, stdout);
        g4_plan_print(&g_m.plan, &g_m.config, NULL);
    }
    end();
    begin("NULL: small functions");
    CHECK(g4_model_tensor(NULL, "x") == NULL && g4_model_tensor(&g_m, NULL) == NULL, "g4_model_tensor");
    CHECK(g4_model_tensor(&g_m, "model.nope") == NULL, "absent tensor");
    CHECK(g4_argmax(NULL, 5) == -1 && g4_argmax(logits, 0) == -1 && g4_argmax(logits, -1) == -1, "g4_argmax");
    g4_session_reset(NULL);
    CHECK(strcmp(g4_result_str((g4_result)-100), "unknown result") == 0, "g4_result_str");
    end();
    free(arena);
    g4_model_free(&g_m);
}

/* ------------------------------------------------------ LoRA adapters */
/* Variants of data/lora/plain_layers (peft's adapter on the `plain` model:
   q_proj, up_proj, down_proj of layers 0 and 2, r 4): each must fail with the
   result code and a message naming the field or tensor, leave the model as
   it was (no adapter), and make `logits --adapter` exit 1 with one line. */

#define AB "\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":4,\"target_modules\":[\"q_proj\",\"up_proj\",\"down_proj\"]," \
           "\"layers_to_transform\":[0,2],\"layers_pattern\":\"layers\",\"bias\":\"none\",\"use_dora\":false,\"modules_to_save\":null"
#define AC(extra) "{" AB "," extra "}"
#define AQ "base_model.model.model.layers.0.self_attn.q_proj"

static char g_ad_dir[400];
static g4_model g_plain;

static void adapter_expect(g4_result want, const char *n1, const char *n2) {
    char args[900];
    g4_result r = g4_model_load_adapter(&g_plain, g_ad_dir);
    expect(r, want, g_plain.error, n1, n2);
    if (r != G4_OK) {
        CHECK(!g_plain.lora && !g_plain.n_lora && !g_plain.w.layers[0].q_proj.lora, "a failed adapter must leave the model as it was");
    } else { /* (only the tower case loads) */
        CHECK(g_plain.n_lora == 6, "%d modules", g_plain.n_lora);
        g4_model_free(&g_plain);
        if (g4_model_load(&g_plain, tiny("plain")) != G4_OK) printf("  %s\n", g_plain.error);
    }
    snprintf(args, sizeof args, "logits %s --adapter %s --ids 2,81 --out %s/cli_logits.bin", tiny("plain"), g_ad_dir, g_tmp);
    cli(args, want == G4_OK ? 0 : 1, n1);
}

static void adapter_config_case(const char *label, const char *json, g4_result want, const char *n1, const char *n2) {
    begin("adapter: %s", label);
    write_file(P(g_ad_dir, "adapter_config.json"), json, strlen(json));
    adapter_expect(want, n1, n2);
    end();
}

static void test_adapter_cases(void) {
    static const struct { const char *label, *json; g4_result want; const char *n1, *n2; } cc[] = {
        {"config is not JSON", "{\"r\": 4,", G4_ERR_JSON, "adapter_config.json", "invalid JSON"},
        {"config is an array", "[1]", G4_ERR_CONFIG, "adapter_config.json", "object"},
        {"no peft_type", "{\"r\":4}", G4_ERR_CONFIG, "adapter_config.json", "peft_type"},
        {"peft_type IA3", AC("\"peft_type\":\"IA3\""), G4_ERR_CONFIG, "peft_type", "only \"LORA\""},
        {"peft_type a number", AC("\"peft_type\":3"), G4_ERR_CONFIG, "peft_type", "only \"LORA\""},
        {"r missing", "{\"peft_type\":\"LORA\",\"lora_alpha\":4,\"target_modules\":[\"q_proj\"]}", G4_ERR_CONFIG, "'r'", NULL},
        {"r a string", AC("\"r\":\"4\""), G4_ERR_CONFIG, "'r'", "integer"},
        {"r zero", AC("\"r\":0"), G4_ERR_CONFIG, "'r'", "outside"},
        {"lora_alpha a string", AC("\"lora_alpha\":\"4\""), G4_ERR_CONFIG, "lora_alpha", "number"},
        {"lora_alpha null", AC("\"lora_alpha\":null"), G4_ERR_CONFIG, "lora_alpha", NULL},
        {"use_rslora a string", AC("\"use_rslora\":\"yes\""), G4_ERR_CONFIG, "use_rslora", NULL},
        {"target_modules null", AC("\"target_modules\":null"), G4_ERR_CONFIG, "target_modules", "null"},
        {"target_modules a number", AC("\"target_modules\":5"), G4_ERR_CONFIG, "target_modules", "list of strings"},
        {"target_modules holds a number", AC("\"target_modules\":[\"q_proj\",1]"), G4_ERR_CONFIG, "target_modules", NULL},
        {"DoRA", AC("\"use_dora\":true"), G4_ERR_CONFIG, "use_dora", "DoRA is not supported"},
        {"lora_bias", AC("\"lora_bias\":true"), G4_ERR_CONFIG, "lora_bias", "not supported"},
        {"bias all", AC("\"bias\":\"all\""), G4_ERR_CONFIG, "'bias'", "none"},
        {"modules_to_save", AC("\"modules_to_save\":[\"lm_head\"]"), G4_ERR_CONFIG, "modules_to_save", "not supported"},
        {"fan_in_fan_out", AC("\"fan_in_fan_out\":true"), G4_ERR_CONFIG, "fan_in_fan_out", "not supported"},
        {"target_parameters", AC("\"target_parameters\":[\"experts.gate_up_proj\"]"), G4_ERR_CONFIG, "target_parameters", NULL},
        {"layer_replication", AC("\"layer_replication\":[[0,2]]"), G4_ERR_CONFIG, "layer_replication", NULL},
        {"trainable tokens", AC("\"trainable_token_indices\":[1,2]"), G4_ERR_CONFIG, "trainable_token_indices", NULL},
        {"layers_to_transform a string", AC("\"layers_to_transform\":\"0\""), G4_ERR_CONFIG, "layers_to_transform", NULL},
        {"layers_to_transform with a regex target", AC("\"target_modules\":\".*q_proj\""), G4_ERR_CONFIG,
         "layers_to_transform", "target_modules is a string"},
        {"an unsupported regex", AC("\"target_modules\":\"(?=q)q_proj\",\"layers_to_transform\":null,\"layers_pattern\":null"),
         G4_ERR_CONFIG, "target_modules", "not supported"},
        {"a malformed regex", AC("\"target_modules\":\"(q_proj\",\"layers_to_transform\":null,\"layers_pattern\":null"),
         G4_ERR_CONFIG, "target_modules", "has no )"},
        {"a malformed layers_pattern", AC("\"layers_pattern\":\"lay[ers\""), G4_ERR_CONFIG, "layers_pattern", "not supported"},
        {"rank_pattern rank 0", AC("\"rank_pattern\":{\"q_proj\":0}"), G4_ERR_CONFIG, "rank_pattern", "positive integer"},
        {"rank_pattern a list", AC("\"rank_pattern\":[1]"), G4_ERR_CONFIG, "rank_pattern", "object"},
        {"alpha_pattern a string", AC("\"alpha_pattern\":{\"q_proj\":\"x\"}"), G4_ERR_CONFIG, "alpha_pattern", "number"},
        {"a wrong rank (rank_pattern)", AC("\"rank_pattern\":{\"q_proj\":8}"), G4_ERR_WEIGHTS, AQ ".lora_A.weight",
         "expected [8, 48]"},
        {"a targeted module without tensors", AC("\"target_modules\":[\"q_proj\",\"up_proj\",\"down_proj\",\"o_proj\"]"),
         G4_ERR_WEIGHTS, "has no tensor 'base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight'", NULL},
        {"tensors of a module not targeted", AC("\"target_modules\":[\"q_proj\",\"up_proj\"]"), G4_ERR_WEIGHTS,
         "does not target module 'model.layers.0.mlp.down_proj'", NULL},
        {"layers_to_transform leaves tensors out", AC("\"layers_to_transform\":[0]"), G4_ERR_WEIGHTS,
         "does not target module 'model.layers.2", NULL},
    };
    ents s;
    size_t k;
    char cfg[1024];
    const char *why = NULL;
    snprintf(g_ad_dir, sizeof g_ad_dir, "%s/adapter", g_tmp);
    mkdir(g_ad_dir, 0755);
    if (g4_model_load(&g_plain, tiny("plain")) != G4_OK) why = g_plain.error;
    else if (!ents_load_file(&s, P(g_data, "lora/plain_layers"), "adapter_model.safetensors")) why = s.src.error;
    if (why) { /* (committed fixtures: a load error is a failure) */
        begin("adapter: the plain model and data/lora/plain_layers");
        CHECK(0, "%s", why);
        end();
        g4_model_free(&g_plain);
        return;
    }
    begin("adapter: missing directory");
    {
        g4_result r = g4_model_load_adapter(&g_plain, P(g_tmp, "no_adapter"));
        expect(r, G4_ERR_IO, g_plain.error, "no_adapter/adapter_config.json", "cannot open");
    }
    end();
    ents_write(&s, P(g_ad_dir, "adapter_model.safetensors"), NULL);
    for (k = 0; k < sizeof cc / sizeof cc[0]; k++) adapter_config_case(cc[k].label, cc[k].json, cc[k].want, cc[k].n1, cc[k].n2);
    snprintf(cfg, sizeof cfg, "%s", AC("\"use_rslora\":false"));
    write_file(P(g_ad_dir, "adapter_config.json"), cfg, strlen(cfg));
    begin("adapter: no adapter_model.safetensors");
    remove(P(g_ad_dir, "adapter_model.safetensors"));
    adapter_expect(G4_ERR_IO, "adapter_model.safetensors", "cannot open");
    end();
    begin("adapter: a truncated adapter_model.safetensors");
    write_file(P(g_ad_dir, "adapter_model.safetensors"), "\x10\0\0", 3);
    adapter_expect(G4_ERR_SAFETENSORS, "adapter_model.safetensors", "8-byte header");
    end();
    {
        static const struct { const char *label, *drop, *add, *dtype; int64_t d0, d1; g4_result want; const char *n1, *n2; } tc[] = {
            {"an A without its B", AQ ".lora_B.weight", NULL, NULL, 0, 0, G4_ERR_WEIGHTS, "has no tensor '" AQ ".lora_B.weight'", NULL},
            {"a B without its A", AQ ".lora_A.weight", NULL, NULL, 0, 0, G4_ERR_WEIGHTS, "has no tensor '" AQ ".lora_A.weight'", NULL},
            {"a wrong rank", AQ ".lora_A.weight", AQ ".lora_A.weight", "F32", 3, 48, G4_ERR_WEIGHTS, AQ ".lora_A.weight", "[3, 48], expected [4, 48]"},
            {"a 1-D A", AQ ".lora_A.weight", AQ ".lora_A.weight", "F32", 192, 0, G4_ERR_WEIGHTS, AQ ".lora_A.weight", "expected [4, 48]"},
            {"an I32 tensor", AQ ".lora_A.weight", AQ ".lora_A.weight", "I32", 4, 48, G4_ERR_WEIGHTS, AQ ".lora_A.weight", "BF16, F16 or F32"},
            {"a module the model lacks", NULL, "base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight", "F32", 4, 48,
             G4_ERR_WEIGHTS, "no nn.Linear module 'model.layers.9.self_attn.q_proj'", NULL},
            {"a k_proj the model lacks", NULL, "base_model.model.model.layers.0.self_attn.kk_proj.lora_B.weight", "F32", 4, 48,
             G4_ERR_WEIGHTS, "model.layers.0.self_attn.kk_proj", NULL},
            {"a DoRA magnitude", NULL, AQ ".lora_magnitude_vector", "F32", 48, 0, G4_ERR_WEIGHTS, "lora_magnitude_vector", "DoRA"},
            {"an embedding LoRA", NULL, "base_model.model.model.embed_tokens.lora_embedding_A", "F32", 4, 200, G4_ERR_WEIGHTS,
             "lora_embedding_A", "embedding is not supported"},
            {"a tensor outside base_model.model", NULL, "foo.lora_A.weight", "F32", 4, 48, G4_ERR_WEIGHTS, "'foo.lora_A.weight'",
             "not a peft LoRA tensor"},
            {"the wrapper's prefix on a text-only model", NULL,
             "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight", "F32", 4, 48, G4_ERR_WEIGHTS,
             "text model is 'model.*'", "multimodal wrapper"},
            {"a vision-tower tensor is ignored", NULL, "base_model.model.model.vision_tower.encoder.layers.0.q.lora_A.weight", "F32",
             4, 16, G4_OK, NULL, NULL},
        };
        for (k = 0; k < sizeof tc / sizeof tc[0]; k++) {
            ents t;
            begin("adapter: %s", tc[k].label);
            if (ents_load_file(&t, P(g_data, "lora/plain_layers"), "adapter_model.safetensors")) {
                if (tc[k].drop) ents_drop(&t, tc[k].drop);
                if (tc[k].add)
                    ents_add(&t, tc[k].add, tc[k].dtype, tc[k].d1 ? 2 : 1, tc[k].d0, tc[k].d1,
                             (size_t)(tc[k].d0 * (tc[k].d1 ? tc[k].d1 : 1) * 4));
                ents_write(&t, P(g_ad_dir, "adapter_model.safetensors"), NULL);
                adapter_expect(tc[k].want, tc[k].n1, tc[k].n2);
                ents_free(&t);
            }
            end();
        }
    }
    begin("adapter: matches no module");
    s.n = 0;
    ents_write(&s, P(g_ad_dir, "adapter_model.safetensors"), NULL);
    snprintf(cfg, sizeof cfg, "%s", AC("\"target_modules\":[\"zzz_proj\"]"));
    write_file(P(g_ad_dir, "adapter_config.json"), cfg, strlen(cfg));
    adapter_expect(G4_ERR_CONFIG, "changes no module", NULL);
    end();
    begin("cli: --adapter on a command without it, or given twice");
    cli("tokenize x --adapter y", 1, "gemma4 tokenize: unknown option --adapter");
    {
        char args[2000];
        snprintf(args, sizeof args, "logits %s --adapter %s --adapter %s --ids 2 --out %s/x.bin", tiny("plain"), g_ad_dir,
                 g_ad_dir, g_tmp);
        cli(args, 1, "--adapter given twice");
        snprintf(args, sizeof args, "logits %s --ids 2 --out %s/x.bin --adapter", tiny("plain"), g_tmp);
        cli(args, 1, "--adapter needs a value (DIR)");
    }
    end();
    ents_free(&s);
    g4_model_free(&g_plain);
}

/* ----------------------------------------------------------------- CLI */

static void test_cli_cases(void) {
    char args[800];
    const char *d = tiny("e2b_like");
    static const struct { const char *ids, *needle; } bad_ids[] = {
        {"1,x", "--ids"}, {"-1", "--ids"}, {"''", "--ids"}, {"1,,2", "--ids"}, {"1,", "--ids"},
        {"99999999999", "--ids"}, {"2.5", "--ids"}, {"0x10", "--ids"},
        {"512", "token id 512 at index 0 is outside the vocabulary"}, {"2,3,4096", "token id 4096 at index 2"},
    };
    size_t k;
    for (k = 0; k < sizeof bad_ids / sizeof bad_ids[0]; k++) {
        begin("cli: logits --ids %s", bad_ids[k].ids);
        snprintf(args, sizeof args, "logits %s --ids %s --out %s/cli_logits.bin", d, bad_ids[k].ids, g_tmp);
        cli(args, 1, bad_ids[k].needle);
        snprintf(args, sizeof args, "greedy %s --ids %s --new 2", d, bad_ids[k].ids);
        cli(args, 1, bad_ids[k].needle);
        end();
    }
    begin("cli: logits on a missing directory");
    snprintf(args, sizeof args, "logits %s/nope --ids 1 --out %s/cli_logits.bin", g_tmp, g_tmp);
    cli(args, 1, "nope/config.json: cannot open");
    end();
    begin("cli: logits to an unwritable path");
    snprintf(args, sizeof args, "logits %s --ids 1 --out %s/no/such/dir/x.bin", d, g_tmp);
    cli(args, 1, "cannot write");
    end();
    begin("cli: info on a missing path");
    snprintf(args, sizeof args, "info %s/nope.json", g_tmp);
    cli(args, 1, "nope.json: cannot open");
    end();
    {
        static const struct { const char *opts, *needle; } bad_bench[] = {
            {"--prompt 0", "--prompt 0: must be an integer >= 1"}, {"--threads x", "--threads x: must be an integer in [1, 4096]"},
            {"--gen", "--gen needs a value (N)"}, {"--gen -3", "--gen -3: must be an integer >= 1"},
            {"--bogus 1", "unknown option --bogus"}, {"--threads 0", "--threads 0: must be an integer in [1, 4096]"},
            {"--grad --gen 3", "--grad takes --threads, --prompt, --recompute and --adapter only"},
            {"--recompute", "--recompute needs --grad"}, {"--grad --prompt 1", "--prompt 1: must be an integer >= 2 with --grad"},
        };
        for (k = 0; k < sizeof bad_bench / sizeof bad_bench[0]; k++) {
            begin("cli: bench %s", bad_bench[k].opts);
            snprintf(args, sizeof args, "bench %s %s", d, bad_bench[k].opts);
            cli(args, 1, bad_bench[k].needle);
            end();
        }
    }
    begin("cli: bench and synth, bad paths and values");
    snprintf(args, sizeof args, "bench %s/nope --prompt 4 --gen 2", g_tmp);
    cli(args, 1, "nope/config.json: cannot open");
    snprintf(args, sizeof args, "synth --config %s/nope.json --out %s/synth", g_tmp, g_tmp);
    cli(args, 1, "nope.json");
    snprintf(args, sizeof args, "synth --config %s/config.json --out %s/synth --dtype f8", d, g_tmp);
    cli(args, 1, "--dtype f8: must be one of bf16 f32");
    snprintf(args, sizeof args, "synth --config %s/config.json --out %s/synth --layers 0", d, g_tmp);
    cli(args, 1, "--layers 0: must be an integer >= 1");
    snprintf(args, sizeof args, "synth --config %s/config.json --out %s/synth --vocab 1e3", d, g_tmp);
    cli(args, 1, "--vocab 1e3: must be an integer >= 1");
    snprintf(args, sizeof args, "synth --config %s/tiny/31b_drafter/config.json --out %s/synth --vocab 40", g_data, g_tmp);
    cli(args, 1, "does not load: ");
    end();
    begin("cli: synth a checkpoint, then bench it (float32 and bf16 mode)");
    snprintf(args, sizeof args, "synth --config %s/config.json --out %s/synth --dtype bf16 --force", d, g_tmp);
    cli(args, 0, NULL);
    snprintf(args, sizeof args, "bench %s/synth --threads 2 --prompt 5 --gen 2", g_tmp);
    cli(args, 0, NULL);
    snprintf(args, sizeof args, "bench %s/synth --threads 1 --prompt 3 --gen 1 --bf16", g_tmp);
    cli(args, 0, NULL);
    end();
    {
        /* synth --layers N, every N a config allows: the checkpoint loads, each layer has the head_dim and KV
           heads of its type in the original (one shape per type, as per_layer_config gives every full layer),
           the last layer is full (Gemma4TextConfig forces it), and more layers than the config has is refused. */
        static const char *const synth_cfgs[] = {"e2b_like", "e4b_like", "26b_like", "31b_drafter"};
        for (k = 0; k < sizeof synth_cfgs / sizeof synth_cfgs[0]; k++) {
            g4_config orig;
            char src[400]; /* not tiny()'s rotating buffers: d above holds one */
            int n, i, t, hd[2] = {0, 0}, kv[2] = {0, 0};
            snprintf(src, sizeof src, "%s/tiny/%s/config.json", g_data, synth_cfgs[k]);
            begin("cli: synth --layers 1..N of %s loads, one shape per layer type", synth_cfgs[k]);
            if (g4_config_load(&orig, src) != G4_OK) {
                CHECK(0, "%s", orig.error);
                end();
                continue;
            }
            for (i = orig.num_hidden_layers - 1; i >= 0; i--) {
                hd[orig.layer_types[i]] = orig.layer_head_dim[i];
                kv[orig.layer_types[i]] = orig.layer_kv_heads[i];
            }
            for (n = 1; n <= orig.num_hidden_layers; n++) {
                g4_model m;
                g4_result r;
                snprintf(args, sizeof args, "synth --config %s --out %s/synth_l --layers %d --vocab 64 --dtype f32 --force", src,
                         g_tmp, n);
                cli(args, 0, NULL);
                r = g4_model_load(&m, P(g_tmp, "synth_l"));
                CHECK(r == G4_OK, "--layers %d: %s", n, m.error);
                if (r != G4_OK) continue;
                CHECK(m.config.num_hidden_layers == n && m.config.layer_types[n - 1] == G4_FULL, "--layers %d: %d layers",
                      n, m.config.num_hidden_layers);
                for (i = 0; i < n; i++) {
                    t = m.config.layer_types[i];
                    CHECK(t == (i == n - 1 ? G4_FULL : orig.layer_types[i]), "--layers %d: layer %d's type", n, i);
                    CHECK(m.config.layer_head_dim[i] == hd[t] && m.config.layer_kv_heads[i] == kv[t],
                          "--layers %d: layer %d (%s) has head_dim %d, kv %d; the original's %s layers have %d, %d", n, i,
                          t == G4_FULL ? "full" : "sliding", m.config.layer_head_dim[i], m.config.layer_kv_heads[i],
                          t == G4_FULL ? "full" : "sliding", hd[t], kv[t]);
                }
                g4_model_free(&m);
            }
            snprintf(args, sizeof args, "synth --config %s --out %s/synth_l --layers %d", src, g_tmp,
                     orig.num_hidden_layers + 1);
            cli(args, 1, "more than the config's");
            end();
        }
    }
    begin("cli: valid runs exit 0");
    snprintf(args, sizeof args, "logits %s --ids 2,81 --out %s/cli_logits.bin", d, g_tmp);
    cli(args, 0, NULL);
    snprintf(args, sizeof args, "info %s", d);
    cli(args, 0, NULL);
    end();
}

int main(int argc, char **argv) {
    if (argc > 1) g_data = argv[1];
    if (argc > 2) g_cli = argv[2];
    if (!h_tmpdir(g_tmp, sizeof g_tmp, "bad")) return 1;
    if (access(g_cli, X_OK) != 0) printf("warning: %s is not built; every CLI check will fail\n", g_cli);

    test_config_cases();
    test_config_special();
    test_json_utf8_goldens();
    test_safetensors_cases();
    test_index_cases();
    test_runtime_cases();
    test_adapter_cases();
    test_cli_cases();

    remove_tree(g_tmp);
    return finish();
}
