/* The gemma4.h test suite: tiny Gemma 4 models built and run by transformers
   (data/tiny/, see tools/make_goldens.py), the released configs (data/configs/),
   and the shared-KV invariants (tests/invariants.h, shared with the CUDA suite).

   Tolerances (float32 gemma4.h vs float32 transformers on the same weights):
     logits:        max |ours - ref| <= 2e-5 * max |ref|   (largest logit)
     layer outputs: max |ours - ref| <= 2e-5 * max |ref layer| per layer
   Both sides compute in float32 but sum in different orders (torch's blocked
   GEMM vs our row loop): a few ulp per op, which these random models amplify
   layer by layer (e2b_like's 12-token dump: 8.3e-7 after layer 0, 2.6e-6 after
   layer 9). Measured 1.5e-6 to 1.72e-5; transformers' own eager and sdpa paths differ by
   up to 7e-6. A real bug (wrong owner, window, RoPE, scale) shows as 1e-2 or more.
   Chunking and decode equivalence, stale-weight and reader-copy tests are
   exact: every kernel is row-wise, so the same position computes the same
   bits whatever the chunk. */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#define G4_PARALLEL_MIN 1 /* split every job, however small, when a pool is set */
#include "../gemma4.h"
#include "../examples/compare.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#include "fixtures.h"
#include "invariants.h"

#define TOL G4I_TOL

/* ------------------------------------------------------- released configs */

static int load_plan(const char *file, g4_config *c, g4_plan *p) {
    if (g4_config_load(c, file) != G4_OK) { printf("  %s\n", c->error); return 0; }
    if (g4_plan_build(p, c) != G4_OK) { printf("  %s\n", p->error); return 0; }
    return 1;
}

static const char *cfgfile(const char *dir, const char *name) {
    static char buf[2][512];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/configs/%s%s.json", g_data, dir, name);
    return buf[k];
}

/* The plan every released model must have: layer types, head dims, KV heads,
   owners and readers (the tail rule), MLP widths, RoPE. */
static void check_released(const char *name, int L, int H, int sliding_kv, int full_kv, int k_eq_v, int first_shared,
                           int src_sliding, int src_full, int I, int I_shared, int P, int window) {
    const char *forms[2] = {"", "hub/"};
    int f, i;
    for (f = 0; f < 2; f++) {
        g4_config c;
        g4_plan p;
        if (!load_plan(cfgfile(forms[f], name), &c, &p)) { CHECK(0, "%s%s does not load", forms[f], name); continue; }
        CHECK(c.num_hidden_layers == L && c.hidden_size == H, "%s: L %d H %d", name, c.num_hidden_layers, c.hidden_size);
        CHECK(p.first_shared == first_shared, "%s: first shared %d", name, p.first_shared);
        CHECK(c.hidden_size_per_layer_input == P && c.sliding_window == window, "%s: P/window", name);
        CHECK(c.vocab_size == 262144 && c.final_logit_softcapping == 30.0f, "%s: vocab/softcap", name);
        for (i = 0; i < L; i++) {
            const g4_layer_plan *lp = &p.layer[i];
            int full = lp->type == G4_FULL;
            CHECK(lp->head_dim == (full ? 512 : 256), "%s layer %d head_dim %d", name, i, lp->head_dim);
            CHECK(lp->kv_heads == (full ? full_kv : sliding_kv), "%s layer %d kv %d", name, i, lp->kv_heads);
            CHECK(lp->has_v_proj == !(k_eq_v && full), "%s layer %d v_proj", name, i);
            CHECK(lp->mlp_width == (i >= first_shared ? I_shared : I), "%s layer %d mlp %d", name, i, lp->mlp_width);
            if (i < first_shared) CHECK(lp->reads == -1, "%s layer %d should own", name, i);
            else CHECK(lp->reads == (full ? src_full : src_sliding), "%s layer %d reads %d", name, i, lp->reads);
        }
        CHECK(p.layer[L - 1].type == G4_FULL, "%s: last layer full", name);
        /* the tail rule: full readers read the last owner, sliding the one before */
        if (first_shared < L) CHECK(src_full == first_shared - 1 && src_sliding == first_shared - 2, "%s tail rule", name);
        CHECK(c.rope[G4_FULL].proportional && c.rope[G4_FULL].partial_rotary_factor == 0.25f &&
                  c.rope[G4_FULL].theta == 1e6f && !c.rope[G4_SLIDING].proportional && c.rope[G4_SLIDING].theta == 1e4f,
              "%s rope", name);
    }
}

static void test_plan_e2b(void) {
    g4_config c;
    g4_plan p;
    check_released("gemma-4-E2B", 35, 1536, 1, 1, 0, 15, 13, 14, 6144, 12288, 256, 512);
    if (load_plan(cfgfile("", "gemma-4-E2B"), &c, &p)) {
        int i;
        for (i = 0; i < 35; i++) CHECK(p.layer[i].type == ((i + 1) % 5 == 0 ? G4_FULL : G4_SLIDING), "4:1 at %d", i);
    }
}
static void test_plan_e4b(void) { check_released("gemma-4-E4B", 42, 2560, 2, 2, 0, 24, 22, 23, 10240, 10240, 256, 512); }
static void test_plan_31b(void) { check_released("gemma-4-31B", 60, 5376, 16, 4, 1, 60, -1, -1, 21504, 21504, 0, 1024); }
static void test_plan_26b(void) {
    g4_config c;
    g4_plan p;
    check_released("gemma-4-26B-A4B", 30, 2816, 8, 2, 1, 30, -1, -1, 2112, 2112, 0, 1024);
    if (load_plan(cfgfile("", "gemma-4-26B-A4B"), &c, &p))
        CHECK(c.enable_moe_block && c.num_experts == 128 && c.top_k_experts == 8 && c.moe_intermediate_size == 704 &&
                  p.layer[0].moe,
              "26B MoE fields");
}

/* `info` output: the exact line format scripts rely on */
static void test_plan_print_format(void) {
    g4_config c;
    g4_plan p;
    FILE *f = tmpfile();
    char line[256];
    int found15 = 0, found19 = 0, found14 = 0, lines = 0;
    if (!f || !load_plan(cfgfile("", "gemma-4-E2B"), &c, &p)) { CHECK(0, "setup"); return; }
    g4_plan_print(&p, &c, f);
    rewind(f);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "layer ", 6) == 0) lines++;
        found15 |= strcmp(line, "layer 15 sliding head_dim 256 kv_heads 1 reads 13 mlp 12288\n") == 0;
        found19 |= strcmp(line, "layer 19 full head_dim 512 kv_heads 1 reads 14 mlp 12288\n") == 0;
        found14 |= strcmp(line, "layer 14 full head_dim 512 kv_heads 1 owner mlp 6144\n") == 0;
    }
    fclose(f);
    CHECK(lines == 35, "%d layer lines", lines);
    CHECK(found15 && found19 && found14, "layer lines not in the documented form");
}

/* ------------------------------------------------------------ config forms */

static g4_result parse(g4_config *c, const char *json) { return g4_config_parse(c, json, strlen(json), "t.json"); }

#define BASE "\"vocab_size\":32,\"hidden_size\":8,\"intermediate_size\":16,\"num_attention_heads\":4,\"head_dim\":4,"

static void test_config_default_layer_types(void) {
    g4_config c;
    int i;
    CHECK(parse(&c, "{" BASE "\"num_hidden_layers\":13,\"num_key_value_heads\":2}") == G4_OK, "%s", c.error);
    for (i = 0; i < 13; i++)
        CHECK(c.layer_types[i] == ((i + 1) % 6 == 0 || i == 12 ? G4_FULL : G4_SLIDING), "layer %d", i);
    CHECK(c.layer_head_dim[5] == 512 && c.layer_head_dim[0] == 4, "legacy default global_head_dim is 512");
    /* a last sliding layer is forced to full */
    CHECK(parse(&c, "{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"global_head_dim\":8,"
                    "\"layer_types\":[\"sliding_attention\",\"sliding_attention\"]}") == G4_OK, "%s", c.error);
    CHECK(c.layer_types[1] == G4_FULL && c.layer_head_dim[1] == 8, "last layer forced full");
}

static void test_config_per_layer_and_legacy(void) {
    g4_config a, b;
    int i;
    /* the same model in both forms */
    CHECK(parse(&a, "{\"model_type\":\"gemma4\",\"text_config\":{" BASE "\"num_hidden_layers\":6,\"num_key_value_heads\":2,"
                    "\"attention_k_eq_v\":true,\"global_head_dim\":8,\"num_global_key_value_heads\":1}}") == G4_OK,
          "%s", a.error);
    CHECK(parse(&b, "{\"model_type\":\"gemma4_text\"," BASE "\"num_hidden_layers\":6,\"num_key_value_heads\":2,"
                    "\"attention_k_eq_v\":true,\"per_layer_config\":{\"05\":{\"head_dim\":8,\"num_key_value_heads\":1}}}") == G4_OK,
          "%s", b.error);
    for (i = 0; i < 6; i++)
        CHECK(a.layer_head_dim[i] == b.layer_head_dim[i] && a.layer_kv_heads[i] == b.layer_kv_heads[i], "layer %d", i);
    CHECK(a.layer_kv_heads[5] == 1 && a.layer_head_dim[5] == 8, "full layer overrides");
    /* num_global_key_value_heads applies only with attention_k_eq_v */
    CHECK(parse(&a, "{" BASE "\"num_hidden_layers\":6,\"num_key_value_heads\":2,\"num_global_key_value_heads\":1}") == G4_OK, "x");
    CHECK(a.layer_kv_heads[5] == 2, "global KV heads without k_eq_v must be ignored");
}

/* pad_token_id as transformers reads it (Gemma4TextConfig's default 0; nn.Embedding(padding_idx=...)):
   absent is 0, an explicit null is None (no padding row, -1 here), a negative id counts from the end,
   and one outside [-vocab_size, vocab_size) is refused as torch refuses it. */
static void test_config_pad_token_id(void) {
    g4_config c;
    CHECK(parse(&c, "{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2}") == G4_OK, "%s", c.error);
    CHECK(c.pad_token_id == 0, "absent: %d, want 0", c.pad_token_id);
    CHECK(parse(&c, "{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"pad_token_id\":null}") == G4_OK,
          "%s", c.error);
    CHECK(c.pad_token_id == -1, "null: %d, want -1 (none)", c.pad_token_id);
    CHECK(parse(&c, "{\"model_type\":\"gemma4\",\"text_config\":{" BASE "\"num_hidden_layers\":2,"
                    "\"num_key_value_heads\":2,\"pad_token_id\":null}}") == G4_OK, "%s", c.error);
    CHECK(c.pad_token_id == -1, "text_config null: %d, want -1 (none)", c.pad_token_id);
    CHECK(parse(&c, "{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"pad_token_id\":7}") == G4_OK,
          "%s", c.error);
    CHECK(c.pad_token_id == 7, "7: %d", c.pad_token_id);
    CHECK(parse(&c, "{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"pad_token_id\":-1}") == G4_OK,
          "%s", c.error);
    CHECK(c.pad_token_id == 31, "-1 is torch's last row (31): %d", c.pad_token_id);
    CHECK(parse(&c, "{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"pad_token_id\":-32}") == G4_OK,
          "%s", c.error);
    CHECK(c.pad_token_id == 0, "-32 is row 0: %d", c.pad_token_id);
    CHECK(parse(&c, "{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"pad_token_id\":32}") == G4_ERR_CONFIG &&
              strstr(c.error, "'pad_token_id' is 32, outside [-32, 31]"), "32: %s", c.error);
    CHECK(parse(&c, "{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"pad_token_id\":-33}") == G4_ERR_CONFIG &&
              strstr(c.error, "'pad_token_id' is -33"), "-33: %s", c.error);
}

/* Each bad config: its result code and a message naming the field or layer. */
static void test_config_errors(void) {
    static const struct { const char *json; g4_result r; const char *needle; } cases[] = {
        {"", G4_ERR_JSON, "unexpected end"},
        {"[1,2]", G4_ERR_CONFIG, "top level"},
        {"{\"hidden_size\": NaN}", G4_ERR_JSON, "NaN"},
        {"{" BASE "\"num_hidden_layers\":2}", G4_ERR_CONFIG, "num_key_value_heads"},
        {"{" BASE "\"num_hidden_layers\":\"2\",\"num_key_value_heads\":2}", G4_ERR_CONFIG, "num_hidden_layers"},
        {"{" BASE "\"num_hidden_layers\":2.5,\"num_key_value_heads\":2}", G4_ERR_CONFIG, "num_hidden_layers"},
        {"{" BASE "\"num_hidden_layers\":-1,\"num_key_value_heads\":2}", G4_ERR_CONFIG, "num_hidden_layers"},
        {"{" BASE "\"num_hidden_layers\":99999999999,\"num_key_value_heads\":2}", G4_ERR_CONFIG, "num_hidden_layers"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":3}", G4_ERR_CONFIG, "KV heads"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"num_kv_shared_layers\":2}", G4_ERR_CONFIG, "num_kv_shared_layers"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"layer_types\":[\"full_attention\"]}", G4_ERR_CONFIG, "layer_types"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"layer_types\":[\"x\",\"full_attention\"]}", G4_ERR_CONFIG, "layer_types[0]"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"head_dim\":5}", G4_ERR_CONFIG, "odd head_dim"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"model_type\":\"llama\"}", G4_ERR_CONFIG, "llama"},
        {"{\"model_type\":\"gemma4\"}", G4_ERR_CONFIG, "text_config"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"yarn\",\"rope_theta\":1}}}", G4_ERR_CONFIG, "yarn"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"per_layer_config\":{\"7\":{\"head_dim\":8}}}", G4_ERR_CONFIG, "per_layer_config"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"hidden_activation\":\"silu\"}", G4_ERR_CONFIG, "hidden_activation"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"enable_moe_block\":true}", G4_ERR_CONFIG, "num_experts"},
        {"{" BASE "\"num_hidden_layers\":2,\"num_key_value_heads\":2,\"sliding_window\":0}", G4_ERR_CONFIG, "sliding_window"},
    };
    size_t k;
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        g4_config c;
        g4_result r = parse(&c, cases[k].json);
        CHECK(r == cases[k].r, "case %lu: result %d, want %d (%s)", (unsigned long)k, r, cases[k].r, c.error);
        CHECK(strstr(c.error, cases[k].needle) != NULL && strstr(c.error, "t.json") != NULL,
              "case %lu: message \"%s\" lacks \"%s\"", (unsigned long)k, c.error, cases[k].needle);
    }
}

/* A reader with no owner of its type: rejected, naming the layer. */
static void test_plan_reader_without_owner(void) {
    g4_config c;
    g4_plan p;
    CHECK(parse(&c, "{" BASE "\"num_hidden_layers\":3,\"num_key_value_heads\":2,\"num_kv_shared_layers\":1,"
                    "\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"full_attention\"]}") == G4_OK, "%s", c.error);
    CHECK(g4_plan_build(&p, &c) == G4_ERR_PLAN, "must fail");
    CHECK(strstr(p.error, "layer 2") && strstr(p.error, "full_attention"), "message: %s", p.error);
}

static void test_json_parser(void) {
    g4__json j;
    char err[G4_ERROR_MAX];
    const char *ok = "{\"a\\u00e9\\ud83d\\ude00\\n\":[1,-2.5e-1,1e-6,0.25,true,null,\"x\"]}";
    char deep[400];
    int i, arr;
    CHECK(g4__json_parse(&j, ok, strlen(ok), "j", err) == G4_OK, "%s", err);
    arr = j.nodes[0].child;
    CHECK(strcmp(j.nodes[arr].key, "a\xc3\xa9\xf0\x9f\x98\x80\n") == 0, "escapes decoded");
    CHECK(j.nodes[arr].count == 7, "count");
    CHECK(j.nodes[j.nodes[arr].child].ival == 1, "int");
    CHECK(j.nodes[j.nodes[j.nodes[arr].child].next].num == -0.25, "-2.5e-1");
    CHECK((float)j.nodes[j.nodes[j.nodes[j.nodes[arr].child].next].next].num == 1e-6f, "1e-6");
    g4__json_free(&j);
    for (i = 0; i < 200; i++) deep[i] = '[';
    for (i = 0; i < 200; i++) deep[200 + i] = ']';
    CHECK(g4__json_parse(&j, deep, 400, "j", err) == G4_ERR_JSON && strstr(err, "nesting"), "deep nesting: %s", err);
    CHECK(g4__json_parse(&j, "{\"a\":1,}", 8, "j", err) == G4_ERR_JSON, "trailing comma");
    CHECK(g4__json_parse(&j, "{\"a\":01}", 8, "j", err) == G4_ERR_JSON, "leading zero");
    CHECK(g4__json_parse(&j, "\"\\ud800\"", 8, "j", err) == G4_ERR_JSON, "lone surrogate");
    { /* serde_json's rule (tokenizer.json, safetensors) vs Python's json (config.json and the others) */
        const char *lone = "[\"\\ud800\",\"\\ud800\\ud83d\\ude00\",\"\\udc00\\ud800\\u0041\",\"\\uD83D\\uDE00\"]";
        static const char *want[4] = {"\xed\xa0\x80", "\xed\xa0\x80\xf0\x9f\x98\x80", "\xed\xb0\x80\xed\xa0\x80" "A",
                                      "\xf0\x9f\x98\x80"};
        int e, k;
        CHECK(g4__json_parse(&j, lone, strlen(lone), "j", err) == G4_ERR_JSON && strstr(err, "lone leading surrogate") &&
              strstr(err, "byte offset 2"), "serde_json refuses a lone surrogate: %s", err);
        CHECK(g4__json_parse(&j, "\"\\ude00\"", 8, "j", err) == G4_ERR_JSON && strstr(err, "lone trailing surrogate"),
              "serde_json refuses a lone trailing surrogate: %s", err);
        CHECK(g4__json_parse_python(&j, lone, strlen(lone), "j", err) == G4_OK, "Python's json keeps them: %s", err);
        for (k = 0, e = j.nodes[0].child; e >= 0 && k < 4; e = j.nodes[e].next, k++)
            CHECK(j.nodes[e].len == strlen(want[k]) && memcmp(j.nodes[e].str, want[k], j.nodes[e].len) == 0 &&
                      j.nodes[e].lone == (k < 3 ? G4__JLONE_STR : 0),
                  "string %d: as surrogatepass bytes, flagged", k);
        CHECK(k == 4, "4 strings");
        g4__json_free(&j);
        CHECK(g4__json_parse_python(&j, "{\"\\udfff\":1}", 12, "j", err) == G4_OK && j.nodes[1].lone == G4__JLONE_KEY,
              "a member name with a lone surrogate is flagged: %s", err);
        g4__json_free(&j);
        CHECK(g4__json_parse_python(&j, "\"\\ud800\\q\"", 10, "j", err) == G4_ERR_JSON && strstr(err, "unknown escape"),
              "a bad escape after a lone surrogate: %s", err);
        /* invalid UTF-8 anywhere is refused, by both */
        CHECK(g4__json_parse_python(&j, "[\"ab\xe2\x82\"]", 7, "j", err) == G4_ERR_JSON &&
                  strstr(err, "byte offset 4") && strstr(err, "truncated"), "truncated: %s", err);
        CHECK(g4__json_parse(&j, "[1, \xff]", 5, "j", err) == G4_ERR_JSON && strstr(err, "byte offset 4"), "outside a string: %s", err);
        CHECK(g4__json_parse(&j, "[1, \xc2\xa0]", 6, "j", err) == G4_ERR_JSON && strstr(err, "non-ASCII character outside"),
              "valid but not JSON: %s", err);
    }
    CHECK(g4__json_parse(&j, "{} x", 4, "j", err) == G4_ERR_JSON && strstr(err, "column 4"), "trailing: %s", err);
    { /* \u0000 is kept, with the name's length: "ab\u0000c" is not "ab" */
        const char *nul = "{\"ab\\u0000c\":1,\"ab\":2,\"s\":\"x\\u0000\"}";
        CHECK(g4__json_parse(&j, nul, strlen(nul), "j", err) == G4_OK, "NUL: %s", err);
        arr = j.nodes[0].child;
        CHECK(j.nodes[arr].keylen == 4 && memcmp(j.nodes[arr].key, "ab\0c", 4) == 0, "a NUL key keeps its length");
        arr = g4__jget(&j, 0, "ab");
        CHECK(arr >= 0 && j.nodes[arr].ival == 2, "\"ab\\u0000c\" is not \"ab\"");
        arr = g4__jget(&j, 0, "s");
        CHECK(arr >= 0 && j.nodes[arr].len == 2 && g4__jis(&j.nodes[arr], "x\0") == 0 && !g4__jis(&j.nodes[arr], "x"),
              "a string with a NUL is not its prefix");
        g4__json_free(&j);
    }
}

/* ------------------------------------------------------------ RoPE tables */

static void test_rope_proportional(void) {
    g4_rope_config rc = {1, 1e6f, 0.25f, 1.0f};
    float inv[256], x[512], y[512];
    int j;
    g4__rope_init(inv, &rc, 512);
    for (j = 0; j < 256; j++) {
        if (j < 64) CHECK(inv[j] == 1.0f / powf(1e6f, (float)(2 * j) / 512.0f), "pair %d: denominator is the full 512", j);
        else CHECK(inv[j] == 0.0f, "pair %d must not rotate", j);
    }
    CHECK(fabs(inv[63] - 0.0334) < 1e-3, "lowest rotated frequency %g", inv[63]);
    for (j = 0; j < 512; j++) x[j] = y[j] = (float)j * 0.01f - 1.0f;
    g4__rope(y, 1, inv, 512, 77, 0);
    for (j = 0; j < 512; j++)
        if ((j % 256) >= 64) CHECK(y[j] == x[j], "dim %d changed", j);
    CHECK(y[0] != x[0] && y[256] != x[256], "rotated pair (0, 256) must change");
}

/* --------------------------------------------------- runtime input errors */

static void test_arena_errors(void) {
    g4_model m;
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    size_t bytes;
    void *arena;
    if (g4_model_load(&m, tiny("e2b_like")) != G4_OK) { CHECK(0, "%s", m.error); return; }
    sc.max_context = 100;
    CHECK(g4_session_size(&m, &sc, &bytes) == G4_OK && bytes > 0, "size");
    arena = malloc(bytes + 16);
    CHECK(g4_session_init(&s, &m, &sc, arena, bytes - 1) == G4_ERR_ARENA && strstr(s.error, "too small"), "undersized");
    CHECK(g4_session_init(&s, &m, &sc, (char *)arena + 4, bytes) == G4_ERR_ARENA && strstr(s.error, "aligned"),
          "misaligned");
    CHECK(g4_session_init(&s, &m, &sc, NULL, bytes) == G4_ERR_ARENA, "NULL arena");
    sc.max_context = 0;
    CHECK(g4_session_size(&m, &sc, &bytes) == G4_ERR_INPUT, "max_context 0");
    sc.max_context = 2000000000;
    CHECK(g4_session_size(&m, &sc, &bytes) != G4_OK || bytes > (size_t)1 << 33, "a huge context is huge or refused");
    sc.max_context = 100;
    CHECK(g4_session_size(&m, &sc, &bytes) == G4_OK && g4_session_init(&s, &m, &sc, arena, bytes) == G4_OK,
          "exactly g4_session_size bytes must do: %s", s.error);
    free(arena);
    g4_model_free(&m);
}

/* ------------------------------------------------------- checkpoint errors */

static void test_checkpoint_errors(void) {
    char dir[512];
    g4_model m;
    FILE *f;
    snprintf(dir, sizeof dir, "%s/bad_ckpt", g_tmp);
    mkdir(dir, 0755);
    copy_file(path2(tiny("e2b_like"), "config.json"), path2(dir, "config.json")); /* H 32, V 512 */
    /* missing weights file */
    CHECK(g4_model_load(&m, dir) == G4_ERR_IO && strstr(m.error, "model.safetensors"), "missing: %s", m.error);
    /* too short */
    f = fopen(path2(dir, "model.safetensors"), "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    CHECK(g4_model_load(&m, dir) == G4_ERR_SAFETENSORS && strstr(m.error, "8-byte"), "short: %s", m.error);
    /* header length past the end */
    f = fopen(path2(dir, "model.safetensors"), "wb");
    fwrite("\xff\xff\xff\xff\x00\x00\x00\x00{}", 1, 10, f);
    fclose(f);
    CHECK(g4_model_load(&m, dir) == G4_ERR_SAFETENSORS && strstr(m.error, "header length"), "huge header: %s", m.error);
    /* a tensor with the right size but the wrong shape */
    {
        float data[32 * 32];
        st_entry e = {"model.embed_tokens.weight", "F32", 2, {32, 512, 0, 0}, NULL, sizeof(float) * 32 * 512};
        float *big = (float *)calloc(32 * 512, sizeof(float));
        e.data = big;
        (void)data;
        st_write(path2(dir, "model.safetensors"), &e, 1, NULL);
        CHECK(g4_model_load(&m, dir) == G4_ERR_WEIGHTS && strstr(m.error, "embed_tokens") && strstr(m.error, "[512, 32]"),
              "wrong shape: %s", m.error);
        /* the right shape, but nothing else */
        e.shape[0] = 512;
        e.shape[1] = 32;
        st_write(path2(dir, "model.safetensors"), &e, 1, NULL);
        CHECK(g4_model_load(&m, dir) == G4_ERR_WEIGHTS && strstr(m.error, "no tensor"), "missing tensor: %s", m.error);
        /* offsets disagreeing with shape x dtype */
        e.bytes -= 4;
        st_write(path2(dir, "model.safetensors"), &e, 1, NULL);
        CHECK(g4_model_load(&m, dir) == G4_ERR_SAFETENSORS && strstr(m.error, "need"), "size mismatch: %s", m.error);
        free(big);
    }
    /* a shard index pointing outside the model directory is refused */
    remove(path2(dir, "model.safetensors"));
    f = fopen(path2(dir, "model.safetensors.index.json"), "wb");
    fputs("{\"weight_map\":{\"model.embed_tokens.weight\":\"../../etc/passwd\"}}", f);
    fclose(f);
    CHECK(g4_model_load(&m, dir) == G4_ERR_SAFETENSORS && strstr(m.error, "refused"), "escape: %s", m.error);
    f = fopen(path2(dir, "model.safetensors.index.json"), "wb");
    fputs("{\"weight_map\":{\"model.embed_tokens.weight\":\"/etc/passwd\"}}", f);
    fclose(f);
    CHECK(g4_model_load(&m, dir) == G4_ERR_SAFETENSORS && strstr(m.error, "refused"), "absolute: %s", m.error);
    remove(path2(dir, "model.safetensors.index.json"));
}

/* The vision/audio tensors of the wrapper checkpoint are there and ignored. */
static void test_wrapper_ignores_towers(void) {
    g4_model m;
    int i, towers = 0;
    if (g4_model_load(&m, tiny("e4b_like")) != G4_OK) { CHECK(0, "%s", m.error); return; }
    CHECK(strcmp(m.prefix, "model.language_model.") == 0, "prefix %s", m.prefix);
    for (i = 0; i < m.n_tensors; i++) towers += strstr(m.tensors[i].name, "vision") || strstr(m.tensors[i].name, "audio");
    CHECK(towers > 0, "the wrapper checkpoint should carry tower tensors");
    g4_model_free(&m);
}

/* The CLI: logits file equals the library's logits; errors exit 1. */
static void test_cli(void) {
    char cmd[2048], out[300];
    golden g;
    int n, k, V = 512;
    const int32_t *ids;
    char list[512] = "";
    size_t len = 0;
    float *file, *ref;
    FILE *f;
    if (access("build/gemma4", X_OK) != 0) { CHECK(0, "build/gemma4 is not built"); return; }
    if (!golden_open(&g, "e2b_like")) { CHECK(0, "golden"); return; }
    ids = golden_ids(&g, "input_ids", &n);
    if (!ids) { CHECK(0, "golden lacks input_ids"); g4_model_free(&g.m); return; }
    for (k = 0; k < n; k++) len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", k ? "," : "", (int)ids[k]);
    snprintf(out, sizeof out, "%s/cli_logits.bin", g_tmp);
    snprintf(cmd, sizeof cmd, "logits %s --ids %s --out %s", tiny("e2b_like"), list, out);
    CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 0, "%s", cmd);
    file = (float *)malloc(sizeof(float) * (size_t)n * V);
    f = fopen(out, "rb");
    CHECK(f && fread(file, sizeof(float), (size_t)n * V, f) == (size_t)n * V, "read %s", out);
    if (f) fclose(f);
    ref = g4i_logits(&g4i_cpu, tiny("e2b_like"), ids, n, 64, 0, 0);
    /* build/gemma4 may use other kernels than this test binary (the sanitizer
       build is scalar), so the same tolerance as against transformers */
    CHECK(ref && max_diff(file, ref, (size_t)n * V) <= TOL * max_abs(ref, (size_t)n * V), "CLI logits differ from the library's");
    snprintf(cmd, sizeof cmd, "logits %s/nonexistent --ids 1 --out %s", g_tmp, out);
    CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 1, "missing model must exit 1");
    snprintf(cmd, sizeof cmd, "logits %s --ids 1,x --out %s", tiny("e2b_like"), out);
    CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 1, "bad ids must exit 1");
    snprintf(cmd, sizeof cmd, "logits %s --ids 1 --chunk x --out %s", tiny("e2b_like"), out);
    CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 1, "a non-number option must exit 1, not become 0");
    snprintf(cmd, sizeof cmd, "compare %s %s", tiny("e2b_like"), dumpfile("e2b_like_f32.safetensors"));
    CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 0, "compare within tolerance must exit 0");
    snprintf(cmd, sizeof cmd, "compare %s %s --f32", tiny("e2b_like"), dumpfile("e2b_like_bf16.safetensors"));
    CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 2, "float32 vs a bf16 dump at the f32 tolerance must exit 2");
    /* --bf16 is torch's order (to the bit, whatever kernels build/gemma4 has); --bf16-fast within 3e-2 (the
       VDPBF16PS kernel where the CLI has avx512_bf16, else --bf16), and only beside --bf16 */
    snprintf(cmd, sizeof cmd, "compare %s %s --bf16 --tolerance 0", tiny("e4b_like"), dumpfile("e4b_like_bf16.safetensors"));
    CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 0, "compare --bf16 at tolerance 0 must exit 0: %s", cmd);
    snprintf(cmd, sizeof cmd, "compare %s %s --bf16-fast", tiny("e4b_like"), dumpfile("e4b_like_bf16.safetensors"));
    CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 0, "compare --bf16-fast within 3e-2 must exit 0: %s", cmd);
    snprintf(cmd, sizeof cmd, "info %s --bf16-fast", tiny("e4b_like"));
    CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 1, "--bf16-fast where --bf16 is not an option must exit 1");
    snprintf(cmd, sizeof cmd, "info %s", cfgfile("", "gemma-4-E4B"));
    CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 0, "info on a config.json");
    { /* --bf16: logits equal transformers-bf16's to the bit (a dump with an exact router tie); greedy's
         first new token is the argmax (first maximum, as torch.argmax) of their last row */
        g4cmp c;
        if (g4cmp_open(&c, dumpfile("26b_like_bf16_tie.safetensors")) != G4_OK) {
            CHECK(0, "%s", c.error);
        } else {
            const g4_tensor *ref_lg = g4_model_tensor(&c.dump, "logits");
            int same = 1, best = 0, got = -1;
            size_t cnt = (size_t)c.n_ids * V, i;
            float *bf = (float *)malloc(sizeof(float) * cnt);
            char printed[4096];
            len = 0;
            for (k = 0; k < c.n_ids; k++) len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", k ? "," : "", (int)c.ids[k]);
            snprintf(cmd, sizeof cmd, "logits %s --ids %s --out %s --bf16", tiny("26b_like"), list, out);
            CHECK(run_cli("build/gemma4", cmd, NULL, 0, NULL, NULL, 0) == 0, "%s", cmd);
            f = fopen(out, "rb");
            CHECK(f && ref_lg && fread(bf, sizeof(float), cnt, f) == cnt, "read %s", out);
            if (f) fclose(f);
            for (i = 0; ref_lg && i < cnt; i++) same &= bf[i] == g4__get(ref_lg, i);
            CHECK(ref_lg && same, "logits --bf16 differ from transformers-bf16's");
            for (k = 1; ref_lg && k < V; k++)
                if (g4__get(ref_lg, cnt - V + (size_t)k) > g4__get(ref_lg, cnt - V + (size_t)best)) best = k;
            snprintf(cmd, sizeof cmd, "greedy %s --ids %s --new 1 --bf16", tiny("26b_like"), list);
            if (run_cli("build/gemma4", cmd, printed, sizeof printed, NULL, NULL, 0) == 0) {
                int v, used;
                const char *q = printed;
                while (sscanf(q, "%d%n", &v, &used) == 1) { got = v; q += used; }
            }
            CHECK(got == best, "greedy --bf16 picked %d, transformers-bf16's argmax is %d", got, best);
            free(bf);
            g4cmp_close(&c);
        }
    }
    free(file);
    free(ref);
    g4_model_free(&g.m);
}

/* ------------------------------------- compare against transformers dumps */
/* data/dumps/ holds tap dumps written by tools/hf_dump.py (transformers
   5.23.0) for 12 tokens: e2b_like in float32 and bfloat16, 26b_like in bf16. */


/* Runs `model` against `dump` with every tap compared; returns the index of
   the first tap over `tol` (-1: none), the compare state in *c (caller closes).
   wrong_owner >= 0 plants a bug: reader layer `reader` attends over that
   owner's slot instead of its own owner's. */
static int run_compare(g4cmp *c, const char *model, const char *dump, int bf16, int chunk, double tol, int reader,
                       int wrong_owner, FILE *report) {
    g4i_run x;
    float *logits;
    int first = -2;
    if (g4cmp_open(c, dump) != G4_OK) { printf("  %s\n", c->error); return -2; }
    if (!g4i_open(&x, &g4i_cpu, tiny(model), c->n_ids, chunk, 0)) { g4i_close(&x); return -2; }
    x.s.cfg->tap = g4cmp_tap;
    x.s.cfg->tap_user = c;
    x.s.cfg->bf16 = bf16 != 0;
    x.s.cfg->bf16_fast = bf16 == 2; /* 2: bf16 with bf16_fast (the VDPBF16PS kernel where built) */
    if (wrong_owner >= 0) x.s.layer_slot[reader] = x.s.layer_slot[wrong_owner];
    logits = (float *)malloc(sizeof(float) * (size_t)c->n_ids * x.m.config.vocab_size);
    if (g4i_cpu.forward(&x.s, c->ids, c->n_ids, logits, G4_LOGITS_ALL) == G4_OK) first = g4cmp_report(c, tol, report);
    else printf("  forward: %s\n", x.s.error);
    free(logits);
    g4i_close(&x);
    return first;
}

static const g4cmp_row *cmp_row(const g4cmp *c, const char *name) {
    int i;
    for (i = 0; i < c->n_rows; i++)
        if (strcmp(c->rows[i].name, name) == 0) return &c->rows[i];
    return NULL;
}

/* Every tap gemma4.h emits is in transformers' dump, and all agree. */
static void test_compare_all_taps_f32(void) {
    g4cmp c;
    int i, chunk;
    for (chunk = 0; chunk <= 5; chunk += 5) { /* one step, and steps of 5 tokens */
        FILE *f = tmpfile();
        int first = run_compare(&c, "e2b_like", dumpfile("e2b_like_f32.safetensors"), 0, chunk, TOL, -1, -1, f);
        CHECK(first == -1, "chunk %d: tap %s over tolerance", chunk, first >= 0 ? c.rows[first].name : "(error)");
        CHECK(c.n_rows == 144, "e2b_like emits %d taps, want 144 (10 layers x 14 + 4)", c.n_rows);
        for (i = 0; i < c.n_rows; i++) {
            CHECK(c.rows[i].present == 1, "tap %s is not in transformers' dump", c.rows[i].name);
            CHECK(c.rows[i].rows == c.n_ids, "tap %s saw %d rows", c.rows[i].name, c.rows[i].rows);
        }
        g4cmp_close(&c);
        fclose(f);
    }
}

/* A planted bug: reader layer 6 attends over sliding owner 3 instead of 5.
   compare must put the first divergence exactly at layer 6's K. */
static void test_compare_finds_planted_wrong_owner(void) {
    g4cmp c;
    FILE *f = tmpfile();
    int first = run_compare(&c, "e2b_like", dumpfile("e2b_like_f32.safetensors"), 0, 0, G4CMP_TOL_F32, 6, 3, f);
    CHECK(first >= 0 && strcmp(c.rows[first].name, "layers.6.self_attn.k") == 0, "first divergence reported at %s",
          first >= 0 ? c.rows[first].name : "(none)");
    if (first >= 0) CHECK(g4cmp_rel(&c.rows[first]) > 0.1, "the wrong K is far off: %g", g4cmp_rel(&c.rows[first]));
    {
        const g4cmp_row *q = cmp_row(&c, "layers.6.self_attn.q");
        char line[256];
        CHECK(q && g4cmp_rel(q) < TOL, "layer 6's queries are still right");
        rewind(f); /* show the report around the divergence */
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "tap ", 4) == 0 || strncmp(line, "layers.5 ", 9) == 0 || strncmp(line, "layers.6.input", 14) == 0 ||
                strncmp(line, "layers.6.self_attn", 18) == 0 || strstr(line, "taps compared"))
                printf("  | %s", line);
    }
    g4cmp_close(&c);
    fclose(f);
}

/* bf16-faithful mode vs transformers run in bf16: much closer than float32. */
static void test_bf16_faithful_mode(void) {
    static const char *models[2][2] = {{"e2b_like", "e2b_like_bf16.safetensors"}, {"26b_like", "26b_like_bf16.safetensors"}};
    int k;
    for (k = 0; k < 2; k++) {
        g4cmp a, b;
        FILE *f = tmpfile();
        int fa = run_compare(&a, models[k][0], dumpfile(models[k][1]), 1, 0, G4CMP_TOL_BF16, -1, -1, f);
        int fb = run_compare(&b, models[k][0], dumpfile(models[k][1]), 0, 0, G4CMP_TOL_BF16, -1, -1, f);
        const g4cmp_row *la = cmp_row(&a, "logits"), *lb = cmp_row(&b, "logits");
        CHECK(a.bf16 && la && lb, "bf16 dump with logits");
        if (la && lb) {
            double ea = g4cmp_rel(la), eb = g4cmp_rel(lb);
            printf("  %s vs transformers-bf16 logits: bf16-faithful %.3g, float32 %.3g (relative to max |logit|)\n",
                   models[k][0], ea, eb);
            CHECK(ea <= 1e-2, "faithful mode is %.3g from transformers-bf16", ea);
            CHECK(eb >= 10 * ea && eb > 1e-2, "faithful mode (%.3g) must beat float32 (%.3g) by 10x", ea, eb);
        }
        CHECK(fa == -1, "faithful: tap %s over %g", fa >= 0 ? a.rows[fa].name : "(error)", G4CMP_TOL_BF16);
        (void)fb;
        g4cmp_close(&a);
        g4cmp_close(&b);
        fclose(f);
    }
}

/* compare passes on every golden model at the stated default tolerances:
   float32 dumps at G4CMP_TOL_F32, bf16 dumps (bf16-faithful mode) at G4CMP_TOL_BF16. */
static void test_compare_every_model(void) {
    static const char *runs[][2] = {{"e2b_like", "e2b_like_f32"}, {"e2b_like", "e2b_like_bf16"},
                                    {"e4b_like", "e4b_like_bf16"}, {"31b_like", "31b_like_bf16"},
                                    {"26b_like", "26b_like_bf16"}, {"plain", "plain_f32"},
                                    {"legacy_keys", "legacy_keys_f32"}, {"unified_like", "unified_like_f32"},
                                    {"unified_like", "unified_like_bf16"}};
    int k, i;
    for (k = 0; k < (int)(sizeof runs / sizeof runs[0]); k++) {
        g4cmp c;
        char file[64];
        FILE *f = tmpfile();
        int bf16 = strstr(runs[k][1], "bf16") != NULL, first, absent = 0;
        double worst = 0;
        snprintf(file, sizeof file, "%s.safetensors", runs[k][1]);
        first = run_compare(&c, runs[k][0], dumpfile(file), bf16, 0, bf16 ? G4CMP_TOL_BF16 : G4CMP_TOL_F32, -1, -1, f);
        for (i = 0; i < c.n_rows; i++) {
            absent += c.rows[i].present != 1;
            if (g4cmp_rel(&c.rows[i]) > worst) worst = g4cmp_rel(&c.rows[i]);
        }
        printf("  %-12s vs %-16s %3d taps, worst %.3g\n", runs[k][0], runs[k][1], c.n_rows, worst);
        CHECK(first == -1, "%s: tap %s over tolerance", runs[k][1], first >= 0 ? c.rows[first].name : "(error)");
        CHECK(absent == 0 && c.n_rows > 50, "%s: %d of %d taps missing from the dump", runs[k][1], absent, c.n_rows);
        g4cmp_close(&c);
        fclose(f);
    }
}

/* ------------------------------------------------- SIMD kernels and threads */

/* Every SIMD matmul tile shape and dtype against the scalar reference. */
static void test_simd_matmul_vs_scalar(void) {
    static const int ins[] = {1, 7, 16, 33, 64, 100, 257};
    static const int outs[] = {1, 3, 4, 5, 9, 17};
    static const int ns[] = {1, 2, 5, 6, 7, 13}; /* tokens: below, at and past the tile's 4 or 6 */
    static const g4_dtype dts[] = {G4_F32, G4_F16, G4_BF16};
    unsigned seed = 12345;
    int a, b, d, c;
    float *ws = (float *)malloc(sizeof(float) * (G4__PACK_THREAD + 1));
    printf("  kernels: %s, decode rows and prefill %s %d rows x %d tokens\n", g4_simd_name(),
           G4__HAVE_GEMM ? "GEMM, micro-kernel" : "reference loop,", G4__TR, G4__TT);
    printf("  bf16 mode: torch's order, %s (decode %s)\n",
           G4__TORCH_GEMM ? "the packed GEMM's torch tile" : "the scalar reference loop", G4__TORCH_MM ? "8-lane AVX2 rows" : "the scalar reference");
#if G4__BF16DOT && defined(G4__SIMD_EMULATED)
    printf("  bf16_fast: avx512_bf16-emulated dot-product kernel (tested below, on tests/x86_emu.h)\n");
#elif G4__BF16DOT
    printf("  bf16_fast: avx512_bf16 dot-product kernel (tested below)\n");
#else
    printf("  bf16_fast: not built (no avx512_bf16): the bf16 mode's kernels\n");
#endif
    for (d = 0; d < 3; d++)
        for (a = 0; a < 7; a++)
            for (b = 0; b < 6; b++)
                for (c = 0; c < 6; c++) {
                    int in = ins[a], out = outs[b], n = ns[c], i, t;
                    size_t esz = g4__dtype_size(dts[d]);
                    unsigned char *wd = (unsigned char *)malloc(esz * (size_t)in * out);
                    float *x = (float *)malloc(sizeof(float) * (size_t)in * n);
                    float *y1 = (float *)malloc(sizeof(float) * (size_t)out * n), *y2 = (float *)malloc(sizeof(float) * (size_t)out * n);
                    g4_tensor w;
                    double err = 0, mag = 0;
                    for (i = 0; i < in * out; i++) {
                        float v;
                        uint16_t h;
                        seed = seed * 1103515245u + 12345u;
                        v = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
                        if (dts[d] == G4_F32) memcpy(wd + 4 * (size_t)i, &v, 4);
                        else {
                            uint32_t u;
                            memcpy(&u, &v, 4);
                            h = dts[d] == G4_BF16 ? (uint16_t)(u >> 16) : (uint16_t)(0x3c00 | (seed & 0x3ff)); /* f16 in [1,2) */
                            memcpy(wd + 2 * (size_t)i, &h, 2);
                        }
                    }
                    for (i = 0; i < in * n; i++) { seed = seed * 1103515245u + 12345u; x[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f; }
                    memset(&w, 0, sizeof w);
                    w.data = wd; w.dtype = dts[d]; w.ndim = 2; w.shape[0] = out; w.shape[1] = in;
                    g4__matmul_ref(y1, x, &w, n, 0, out);
                    g4__matmul_rows(y2, x, &w, n, 0, out, ws);
                    for (i = 0; i < out * n; i++) {
                        if (fabs(y1[i] - y2[i]) > err) err = fabs(y1[i] - y2[i]);
                        mag += fabs(y1[i]);
                    }
#ifdef G4__VL /* (the scalar build's g4__matmul_rows is g4__matmul_ref: nothing to compare) */
                    /* different summation order only: a few ulp of the sum of |terms| (<= in) */
                    CHECK(err <= 1e-6 * in * 4, "dtype %d in %d out %d n %d: max diff %g", d, in, out, n, err);
#endif
#if G4__BF16DOT
                    /* the avx512_bf16 kernel of the bf16 mode, on bf16 inputs (as that mode's are) */
                    if (dts[d] == G4_BF16) {
                        float *xb = (float *)malloc(sizeof(float) * (size_t)in * n);
                        uint16_t *xh = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)in * n);
                        double e2 = 0;
                        for (i = 0; i < in * n; i++) xb[i] = g4__bf16_round(x[i]);
                        g4__to_bf16(xh, xb, n, in);
                        g4__matmul_ref(y1, xb, &w, n, 0, out);
                        g4__matmul_bf16dot(y2, xb, xh, &w, n, 0, out, ws, 0);
                        for (i = 0; i < out * n; i++)
                            if (fabs(y1[i] - y2[i]) > e2) e2 = fabs(y1[i] - y2[i]);
                        CHECK(e2 <= 1e-6 * in * 4, "bf16 dot: in %d out %d n %d: max diff %g", in, out, n, e2);
                        for (t = 0; t < n && n > 1; t++) {
                            g4__matmul_bf16dot(y1, xb + (size_t)in * t, xh + (size_t)in * t, &w, 1, 0, out, ws, 0);
                            CHECK(memcmp(y1, y2 + (size_t)out * t, sizeof(float) * out) == 0,
                                  "bf16 dot: in %d out %d n %d: token %d's decode row differs from the prefill tile", in, out, n, t);
                        }
                        free(xb);
                        free(xh);
                        g4__matmul_rows(y2, x, &w, n, 0, out, ws); /* back to the float32 kernel's result */
                    }
#endif
                    /* and every token's decode row equals its row computed inside a prefill tile */
                    for (t = 0; t < n && n > 1; t++) {
                        g4__matmul_rows(y1, x + (size_t)in * t, &w, 1, 0, out, ws);
                        CHECK(memcmp(y1, y2 + (size_t)out * t, sizeof(float) * out) == 0,
                              "dtype %d in %d out %d n %d: token %d's decode row differs from the prefill tile", d, in, out, n, t);
                    }
                    free(wd); free(x); free(y1); free(y2);
                    (void)mag;
                }
#ifdef G4__VL /* (the scalar build's g4__dot is g4__dot_ref) */
    {
        float p[37], q[37];
        int i;
        for (i = 0; i < 37; i++) { p[i] = (float)i * 0.1f - 1.5f; q[i] = 1.0f / (float)(i + 1); }
        CHECK(fabs(g4__dot(p, q, 37) - g4__dot_ref(p, q, 37)) < 1e-5, "dot");
    }
#endif
    free(ws);
}

#if G4__HAVE_GEMM
/* The packed GEMM (g4__gemm) with one of its tiles at every blocking edge:
   with tiny blocks (2 panels, 2 vectors of k (the float32 tile) or one step
   (the bf16 mode's), 2 tiles of tokens) every edge is crossed on small sizes
   - rows, k and tokens past a block, a tile and a step - and the result must
   be, bit for bit, the default blocking's, each token's decode row in that
   mode, and the rows split into two threads' parts (one in tiny blocks, one
   in the default); the reference within rounding (torch's order: its
   reference, bit for bit). Strided x and y (ldx > in, ldy > out) keep their
   gaps; neither workspace is overrun. The bf16 mode's cast (each output
   rounded to bf16 as it is stored) = rounding after, bit for bit. The bf16
   mode's tiles run on bf16 weights and inputs, as that mode's are. */
static void gemm_blocking(g4__tile_kind kind) {
    /* in: below, at and past a step (VL; 32: one VDPBF16PS; torch's 64 and 16-wide tail) and a tiny block */
    static const int ins_f32[] = {1, 7, G4__VL, 3 * G4__VL + 5, 100, 600}, ins_torch[] = {1, 8, 40, 64, 100, 136, 200, 1536, 2100};
    static const int outs[] = {1, G4__TR + 1, 2 * G4__TR + 1, 4 * G4__TR + 2, 29};
    static const int ns[] = {2, G4__TT + 1, 2 * G4__TT + 1, 4 * G4__TT + 3, 70};
    static const g4_dtype dts[] = {G4_BF16, G4_F16, G4_F32};
    const int *ins = kind == G4__TILE_TORCH ? ins_torch : ins_f32;
    int n_ins = kind == G4__TILE_TORCH ? 9 : 6, n_dts = kind == G4__TILE_F32 ? 3 : 1;
    size_t lanes = kind == G4__TILE_TORCH ? 64 : G4__VL; /* partial sums per output */
    const g4__blocking *dflt = &g4__gemm_blocks;
    g4__blocking tiny;
    unsigned seed = 777;
    int a, b, c, d, bad_ref = 0, bad_bits = 0, bad_decode = 0, bad_split = 0, bad_gap = 0, bad_ws = 0, bad_cast = 0, cases = 0;
    size_t tiny_ws, dflt_ws;
    float *ws, *ws2;
#if G4__TORCH_GEMM
    if (kind == G4__TILE_TORCH) dflt = &g4__torch_blocks;
#endif
    tiny.mc = 2 * G4__TR; tiny.kc = kind == G4__TILE_TORCH ? 64 : 2 * G4__VL; tiny.nc = 2 * G4__TT;
    tiny_ws = (size_t)tiny.mc * tiny.kc + (size_t)tiny.mc * tiny.nc * lanes;
    dflt_ws = (size_t)dflt->mc * dflt->kc + (size_t)dflt->mc * dflt->nc * lanes;
    ws = (float *)malloc(sizeof(float) * (dflt_ws + 1));
    ws2 = (float *)malloc(sizeof(float) * (tiny_ws + 1));
    for (d = 0; d < n_dts; d++)
        for (a = 0; a < n_ins; a++)
            for (b = 0; b < 5; b++)
                for (c = 0; c < 5; c++) {
                    int in = ins[a], out = outs[b], n = ns[c], ldx = in + 3, ldy = out + 2, i, t, half;
                    size_t esz = g4__dtype_size(dts[d]), ny = (size_t)ldy * n;
                    unsigned char *wd = (unsigned char *)malloc(esz * (size_t)in * out);
                    float *x = (float *)malloc(sizeof(float) * (size_t)ldx * n), *ref = (float *)malloc(sizeof(float) * (size_t)out * n);
                    float *y1 = (float *)malloc(sizeof(float) * ny), *y2 = (float *)malloc(sizeof(float) * ny);
                    float *x1 = (float *)malloc(sizeof(float) * (size_t)in * n);
                    g4_tensor w;
                    double err = 0;
                    for (i = 0; i < in * out; i++) {
                        float v;
                        uint16_t h;
                        uint32_t u;
                        seed = seed * 1103515245u + 12345u;
                        v = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
                        memcpy(&u, &v, 4);
                        h = dts[d] == G4_BF16 ? (uint16_t)(u >> 16) : (uint16_t)(0x3800 | (seed & 0x83ff)); /* f16 +-[0.5,1) */
                        if (dts[d] == G4_F32) memcpy(wd + 4 * (size_t)i, &v, 4);
                        else memcpy(wd + 2 * (size_t)i, &h, 2);
                    }
                    for (i = 0; i < ldx * n; i++) {
                        seed = seed * 1103515245u + 12345u;
                        x[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
                        if (kind != G4__TILE_F32) x[i] = g4__bf16_round(x[i]);
                    }
                    for (t = 0; t < n; t++) memcpy(x1 + (size_t)t * in, x + (size_t)t * ldx, sizeof(float) * in);
                    memset(&w, 0, sizeof w);
                    w.data = wd; w.dtype = dts[d]; w.ndim = 2; w.shape[0] = out; w.shape[1] = in;
                    if (kind == G4__TILE_TORCH) g4__matmul_torch_ref(ref, x1, &w, n, 0, out);
                    else g4__matmul_ref(ref, x1, &w, n, 0, out);
                    for (i = 0; i < (int)ny; i++) y1[i] = y2[i] = -7.0f; /* the gaps must keep this */
                    ws[dflt_ws] = ws2[tiny_ws] = 1234.5f;
                    g4__gemm(y1, (size_t)ldy, x, (size_t)ldx, &w, n, 0, out, ws2, &tiny, kind, 0);
                    g4__gemm(y2, (size_t)ldy, x, (size_t)ldx, &w, n, 0, out, ws, dflt, kind, 0);
                    bad_ws += ws[dflt_ws] != 1234.5f || ws2[tiny_ws] != 1234.5f;
                    bad_bits += memcmp(y1, y2, sizeof(float) * ny) != 0;
                    for (t = 0; t < n; t++) {
                        for (i = out; i < ldy; i++) bad_gap += y1[(size_t)t * ldy + i] != -7.0f || y2[(size_t)t * ldy + i] != -7.0f;
                        for (i = 0; i < out; i++) {
                            double e = fabs(y1[(size_t)t * ldy + i] - ref[(size_t)t * out + i]);
                            if (e > err) err = e;
                        }
                    }
                    /* torch's order: its reference's bits; else the summation order differs from the
                       reference's only (products of bf16 values are exact): a few ulp of the sum of |terms| (<= in) */
                    if (err > (kind == G4__TILE_TORCH ? 0.0 : 1e-6 * in * 4)) {
                        bad_ref++;
                        printf("  dtype %d in %d out %d n %d: max diff %g from the reference\n", d, in, out, n, err);
                    }
                    for (t = 0; t < n; t++) { /* decode, one token at a time, into ref */
                        const float *xt = x + (size_t)t * ldx;
                        if (kind == G4__TILE_TORCH) g4__matmul_torch(ref, xt, &w, 1, 0, out);
                        else g4__rows1(ref, xt, (const unsigned char *)w.data, w.dtype, esz, in, 0, out);
                        bad_decode += memcmp(ref, y1 + (size_t)t * ldy, sizeof(float) * out) != 0;
                    }
                    /* cast: each output rounded to bf16 as it is stored = y1 rounded after it, bit for bit
                       (the tails' path, in % step != 0, and the tiles' own), the gaps kept */
                    g4__gemm(y2, (size_t)ldy, x, (size_t)ldx, &w, n, 0, out, ws2, &tiny, kind, 1);
                    for (t = 0; t < n; t++) {
                        for (i = out; i < ldy; i++) bad_gap += y2[(size_t)t * ldy + i] != -7.0f;
                        for (i = 0; i < out; i++) {
                            float r = g4__bf16_round(y1[(size_t)t * ldy + i]);
                            bad_cast += memcmp(&r, y2 + (size_t)t * ldy + i, sizeof r) != 0;
                        }
                    }
                    /* two threads' parts: rows split at a multiple of the tile's rows */
                    half = (out / 2) / G4__TR * G4__TR;
                    g4__gemm(y2, (size_t)ldy, x, (size_t)ldx, &w, n, 0, half, ws2, &tiny, kind, 0);
                    g4__gemm(y2, (size_t)ldy, x, (size_t)ldx, &w, n, half, out, ws, dflt, kind, 0);
                    bad_split += memcmp(y1, y2, sizeof(float) * ny) != 0;
                    cases++;
                    free(wd); free(x); free(x1); free(ref); free(y1); free(y2);
                }
    printf("  %d cases (%d dtype%s; in up to %d, out up to %d, up to %d tokens), tiny blocks mc %d kc %d nc %d and the default mc %d kc %d nc %d\n",
           cases, n_dts, n_dts > 1 ? "s" : "", ins[n_ins - 1], outs[4], ns[4], tiny.mc, tiny.kc, tiny.nc, dflt->mc, dflt->kc, dflt->nc);
    CHECK(bad_ref == 0, "%d cases differ from the reference", bad_ref);
    CHECK(bad_bits == 0, "%d cases: tiny blocks and the default blocking differ in bits", bad_bits);
    CHECK(bad_decode == 0, "%d token rows differ from decode", bad_decode);
    CHECK(bad_split == 0, "%d cases: rows split in two parts differ", bad_split);
    CHECK(bad_cast == 0, "%d outputs: the cast in the stores differs from rounding after", bad_cast);
    CHECK(bad_gap == 0, "%d values between y's rows overwritten", bad_gap);
    CHECK(bad_ws == 0, "%d cases wrote past the workspace", bad_ws);
    free(ws);
    free(ws2);
}

static void test_gemm_blocking(void) { gemm_blocking(G4__TILE_F32); }

/* The kc g4_session_init chooses from the L2 size (g4__gemm_kc): a multiple
   of the vector, within G4__GEMM_KC_MAX and the per-thread buffer
   (g4_session_size's G4__PACK_THREAD), never smaller for a larger L2, the
   compiled kc for an L2 not reported; on AVX-512 (kc not fixed at compile
   time) the sizes the rule gives (2048 for 1 MB). A matmul at the largest kc
   (two k blocks and a tail) gives the default blocking's bits and decode's,
   and stays inside the buffer. */
static void test_gemm_kc_choice(void) {
    static const long l2s[] = {0, 64L << 10, 256L << 10, 512L << 10, 1L << 20, 2L << 20, 64L << 20};
    int a, kc, prev = 0, bad = 0, i, t, in = G4__GEMM_KC_MAX + 37, out = 9, n = 13;
    g4__blocking big = g4__gemm_blocks;
    uint16_t *wd = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)in * out);
    float *x = (float *)malloc(sizeof(float) * (size_t)in * n), *y1 = (float *)malloc(sizeof(float) * (size_t)out * n);
    float *y2 = (float *)malloc(sizeof(float) * (size_t)out * n), *yd = (float *)malloc(sizeof(float) * out);
    float *ws = (float *)malloc(sizeof(float) * (G4__PACK_THREAD + 1));
    unsigned seed = 31;
    g4_tensor w;
    for (a = 0; a < 7; a++) {
        kc = g4__gemm_kc(l2s[a]);
        if (kc <= 0 || kc % G4__VL || kc > G4__GEMM_KC_MAX || G4__PACK_FLOATS(g4__gemm_blocks.mc, kc, g4__gemm_blocks.nc) > G4__PACK_THREAD ||
            (a > 1 && kc < prev)) {
            printf("  L2 %ld bytes: kc %d\n", l2s[a], kc);
            bad++;
        }
        if (a > 0) prev = kc;
    }
    CHECK(bad == 0, "%d L2 sizes give a kc outside the rule's bounds", bad);
    CHECK(g4__gemm_kc(0) == g4__gemm_blocks.kc, "an L2 not reported: kc %d, not the compiled %d", g4__gemm_kc(0), g4__gemm_blocks.kc);
#if G4__VL == 16 && !defined(G4__GEMM_KC_FIXED)
    CHECK(g4__gemm_kc(1L << 20) == 2048 && g4__gemm_kc(2L << 20) == 4096 && g4__gemm_kc(256L << 10) == 512 && g4__gemm_kc(64L << 20) == 4096,
          "AVX-512: kc %d %d %d %d for L2 1 MB, 2 MB, 256 KB, 64 MB (want 2048 4096 512 4096)", g4__gemm_kc(1L << 20), g4__gemm_kc(2L << 20),
          g4__gemm_kc(256L << 10), g4__gemm_kc(64L << 20));
#endif
    for (i = 0; i < in * out; i++) {
        seed = seed * 1103515245u + 12345u;
        wd[i] = (uint16_t)(0x3c00 + (seed >> 16) % 0x700 + ((seed >> 8) & 1 ? 0x8000 : 0));
    }
    for (i = 0; i < in * n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    memset(&w, 0, sizeof w);
    w.data = wd; w.dtype = G4_BF16; w.ndim = 2; w.shape[0] = out; w.shape[1] = in;
    big.kc = G4__GEMM_KC_MAX;
    ws[G4__PACK_THREAD] = 1234.5f;
    g4__gemm(y1, (size_t)out, x, (size_t)in, &w, n, 0, out, ws, &big, G4__TILE_F32, 0);
    CHECK(ws[G4__PACK_THREAD] == 1234.5f, "kc %d wrote past the per-thread buffer", big.kc);
    g4__gemm(y2, (size_t)out, x, (size_t)in, &w, n, 0, out, ws, &g4__gemm_blocks, G4__TILE_F32, 0);
    CHECK(memcmp(y1, y2, sizeof(float) * (size_t)out * n) == 0, "kc %d and the default kc %d differ in bits", big.kc, g4__gemm_blocks.kc);
    for (t = 0, bad = 0; t < n; t++) {
        g4__rows1(yd, x + (size_t)t * in, (const unsigned char *)w.data, G4_BF16, 2, in, 0, out);
        bad += memcmp(yd, y1 + (size_t)t * out, sizeof(float) * out) != 0;
    }
    CHECK(bad == 0, "%d of %d token rows at kc %d differ from decode", bad, n, big.kc);
    printf("  kc for L2 0, 64K, 256K, 512K, 1M, 2M, 64M: %d %d %d %d %d %d %d (max %d; in %d at kc max = default = decode)\n", g4__gemm_kc(0),
           g4__gemm_kc(l2s[1]), g4__gemm_kc(l2s[2]), g4__gemm_kc(l2s[3]), g4__gemm_kc(l2s[4]), g4__gemm_kc(l2s[5]), g4__gemm_kc(l2s[6]),
           G4__GEMM_KC_MAX, in);
    free(wd); free(x); free(y1); free(y2); free(yd); free(ws);
}
#endif

/* torch's sum of squares for the 32 lanes at once (g4__tsum_lanes, which
   the RMSNorms run) = each lane alone (g4__tsum_lane, the CUDA RMSNorm's),
   bit for bit: rows of 0 to 1100 vectors of 32 (the cascade's levels of 16
   and 32 terms, the break and the tail), values with exponents spread. */
static void test_tsum_lanes(void) {
    static float v[1100 * 32];
    float part[32];
    unsigned seed = 17;
    int r, i, m, bad = 0, cases = 0;
    for (i = 0; i < 1100 * 32; i++) {
        seed = seed * 1103515245u + 12345u;
        v[i] = ldexpf((float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f, (int)(seed >> 28) - 8);
    }
    for (r = 0; r <= 1100; r = r < 70 ? r + 1 : r * 2 < 1100 ? r * 2 : r == 1100 ? 1101 : 1100) {
        g4__tsum_lanes(v, r, part);
        for (m = 0; m < 32; m++) {
            float one = g4__tsum_lane(v, r, m / 8, m % 8);
            bad += memcmp(&one, &part[m], 4) != 0;
        }
        cases++;
    }
    CHECK(bad == 0, "%d lanes of %d rows: g4__tsum_lanes differs from g4__tsum_lane", bad, cases);
}

/* torch's float32 sum of squares on long rows (data/sum_squares, made by
   tools/make_sum_squares_goldens.py: x.pow(2).sum(-1) on torch's AVX2
   kernels), bit for bit: g4__sum_squares (the RMSNorms') and its lanes one
   at a time (g4__tsum_lane, the CUDA RMSNorm's), rows of 1 to 600000 values,
   the cascade's three levels, the vector tail and rows shorter than a
   vector. The tiny models' goldens only reach rows of their hidden sizes. */
static void test_sum_squares_torch(void) {
    FILE *f = fopen("data/sum_squares/goldens.txt", "r");
    char line[128];
    int cases = 0, bad = 0, bad_lane = 0, biggest = 0;
    CHECK(f != NULL, "data/sum_squares/goldens.txt: %s", strerror(errno));
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        int n, i, m;
        unsigned bits, seed;
        float *x, got, lanes, part[32];
        uint32_t u, ul;
        if (line[0] == '#' || sscanf(line, "%d %x", &n, &bits) != 2 || n <= 0) continue;
        x = (float *)malloc(sizeof(float) * (size_t)n);
        for (i = 0, seed = 1000u + (unsigned)n; i < n; i++) { /* the script's values() */
            seed = seed * 1103515245u + 12345u;
            x[i] = ldexpf((float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f, (int)(seed >> 28) - 8);
        }
        got = g4__sum_squares(x, n);
        for (m = 0; m < 32; m++) part[m] = g4__tsum_lane(x, n / 32, m / 8, m % 8);
        lanes = g4__sum_squares_finish(part, x, n);
        memcpy(&u, &got, 4);
        memcpy(&ul, &lanes, 4);
        if (u != bits) {
            bad++;
            printf("  n %d: %08x, torch %08x\n", n, (unsigned)u, bits);
        }
        bad_lane += ul != bits;
        if (n > biggest) biggest = n;
        cases++;
        free(x);
    }
    fclose(f);
    printf("  %d rows of up to %d values\n", cases, biggest);
    CHECK(cases >= 20, "only %d rows in data/sum_squares/goldens.txt", cases);
    CHECK(bad == 0, "%d rows: g4__sum_squares differs from torch's bits", bad);
    CHECK(bad_lane == 0, "%d rows: the lanes one at a time (g4__tsum_lane) differ from torch's bits", bad_lane);
}

/* The bf16 rounding of a range (16 at a time, branchless) gives g4__bf16_round's
   bits element by element: ties to even both ways, NaNs of several payloads
   (signalling included) left as they are, infinities, denormals, values that
   round up to infinity, on a length that leaves a tail. So does the AVX-512
   tile's rounding in registers, g4__vbf16_round (native or emulated). */
static void test_bf16_round_range(void) {
    static const uint32_t special[] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu, 0x7f800000u, 0xff800000u,
                                       0x7f7fffffu, 0x7f7f8000u, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x00008000u,
                                       0x00018000u, 0x80000000u, 0x00000001u, 0xbf80c000u};
    float x[53], y[53];
    unsigned seed = 5;
    int i, bad = 0;
    for (i = 0; i < 53; i++) {
        uint32_t u;
        seed = seed * 1103515245u + 12345u;
        u = i < 16 ? special[i] : i < 32 ? special[i - 16] ^ 0x80000000u : seed ^ (seed << 13);
        memcpy(&x[i], &u, 4);
    }
    memcpy(y, x, sizeof x);
    g4__bf16_round_range(y, 0, 53);
    for (i = 0; i < 53; i++) {
        float r = g4__bf16_round(x[i]);
        bad += memcmp(&r, &y[i], 4) != 0;
    }
    CHECK(bad == 0, "%d of 53 values differ from g4__bf16_round", bad);
#ifdef G4__TILE_HSUMS /* the AVX-512 tile's rounding in registers (G4__SUMS_BF16), 16 at a time */
    for (i = 0, bad = 0; i + 16 <= 53; i += 16) {
        float v[16];
        int l;
        _mm512_storeu_ps(v, g4__vbf16_round(_mm512_loadu_ps(x + i)));
        for (l = 0; l < 16; l++) {
            float r = g4__bf16_round(x[i + l]);
            bad += memcmp(&r, &v[l], 4) != 0;
        }
    }
    CHECK(bad == 0, "%d of 48 values: g4__vbf16_round differs from g4__bf16_round", bad);
#endif
}

/* RoPE on a position's heads (g4__rope: cos and sin once for the heads, 16
   pairs at a time) = g4__rope_pair pair by pair on each head (the reference
   the CUDA kernels call), bit for bit, in float32 and bf16: head dims with
   halves below, at and past 16 and with a tail (the tiny models' 16 and 32
   take only the first two), 1 to 3 heads, positions up to 131071 (large
   angles), inverse frequencies as Gemma's with a zeroed partial-rotary part. */
static void test_rope_blocks(void) {
    static const int dims[] = {2, 16, 30, 32, 34, 48, 64, 256, 512};
    static const int positions[] = {0, 1, 7, 1000, 131071};
    float inv[256], x[3 * 512], y[3 * 512];
    unsigned seed = 17;
    int d, p, b, nh, i, h, bad = 0, cases = 0;
    for (d = 0; d < 9; d++)
        for (p = 0; p < 5; p++)
            for (b = 0; b < 2; b++)
                for (nh = 1; nh <= 3; nh++) {
                    int D = dims[d], half = D / 2;
                    for (i = 0; i < half; i++) inv[i] = i >= 3 * half / 4 ? 0.0f : (float)pow(10000.0, -2.0 * i / D);
                    for (i = 0; i < nh * D; i++) {
                        seed = seed * 1103515245u + 12345u;
                        x[i] = (float)((seed >> 8) % 20001) / 1000.0f - 10.0f;
                        if (b) x[i] = g4__bf16_round(x[i]);
                    }
                    memcpy(y, x, sizeof(float) * (size_t)(nh * D));
                    g4__rope(x, nh, inv, D, positions[p], b);
                    for (h = 0; h < nh; h++)
                        for (i = 0; i < half; i++) {
                            float c, s;
                            g4__rope_cos_sin(inv[i], positions[p], &c, &s);
                            g4__rope_pair(y + h * D, i, half, c, s, b);
                        }
                    bad += memcmp(x, y, sizeof(float) * (size_t)(nh * D)) != 0;
                    cases++;
                }
    CHECK(bad == 0, "%d of %d cases differ from g4__rope_pair's bits", bad, cases);
}

/* The bf16 mode's attention scores on vectors (g4__dot_torch_v) give
   g4__dot_torch's bits: lengths below, at and past its 64-element blocks and
   16-element tails, bf16 values (as the mode's q and k) and plain floats. */
static void test_dot_torch_v(void) {
#ifdef G4__VL
    static const int ns[] = {1, 7, 15, 16, 17, 63, 64, 65, 100, 128, 129, 200, 256, 257, 512};
    unsigned seed = 99;
    int a, i, r, bad = 0, cases = 0;
    for (r = 0; r < 2; r++)
        for (a = 0; a < 15; a++) {
            int n = ns[a];
            float *x = (float *)malloc(sizeof(float) * n), *y = (float *)malloc(sizeof(float) * n), d1, d2;
            for (i = 0; i < n; i++) {
                seed = seed * 1103515245u + 12345u;
                x[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
                seed = seed * 1103515245u + 12345u;
                y[i] = (float)((seed >> 8) & 0xffff) / 4096.0f - 8.0f;
                if (r == 0) { x[i] = g4__bf16_round(x[i]); y[i] = g4__bf16_round(y[i]); }
            }
            d1 = g4__dot_torch(x, y, n);
            d2 = g4__dot_torch_v(x, y, n);
            if (memcmp(&d1, &d2, 4) != 0) {
                printf("  n %d (%s): %.9g against %.9g\n", n, r ? "floats" : "bf16 values", d2, d1);
                bad++;
            }
            cases++;
            free(x); free(y);
        }
    printf("  %d cases (n 1 to 512, bf16 values and floats)\n", cases);
    CHECK(bad == 0, "%d of %d dot products differ from g4__dot_torch", bad, cases);
#else
    skip("this build has no SIMD kernels (G4__VL): g4__dot_torch_v is g4__dot_torch itself");
#endif
}

/* Attention's kernels (g4__attend): q.k for 8 keys side by side (g4__dot8,
   outputs adjacent or strided as for 8 heads) gives each key's g4__dot bits,
   and the weighted sum of values over a KV ring (g4__wsum_ring) gives the
   bits of g4__axpy key by key from zero, of the scalar loop (a product then
   a sum per element) and of itself in two runs of rows, on sizes that are
   not multiples of the vector or of the 8-vector block, rows that wrap
   around the ring, and one row. */
#ifdef G4__VL
#define G4__VL_T G4__VL
#else
#define G4__VL_T 8 /* the scalar build: sizes as AVX2's */
#endif
static void test_attention_kernels(void) {
    static const int ns[] = {1, 7, G4__VL_T, 3 * G4__VL_T + 5, 8 * G4__VL_T, 8 * G4__VL_T + 3, 17 * G4__VL_T + 1, 256};
    static const int ms[] = {1, 2, 7, 8, 9, 17, 40};
    unsigned seed = 4242;
    int a, b, i, j, bad_dot = 0, bad_ref = 0, bad_axpy = 0, bad_scalar = 0, bad_runs = 0, cases = 0;
    for (a = 0; a < 8; a++)
        for (b = 0; b < 7; b++) {
            int n = ns[a], m = ms[b], cap = m + 3, stride = n + 2, k0 = 2 * cap - 2; /* rows k0 % cap .. wrap */
            float *base = (float *)malloc(sizeof(float) * (size_t)cap * stride), *q = (float *)malloc(sizeof(float) * n);
            float *p = (float *)malloc(sizeof(float) * m), *y1 = (float *)malloc(sizeof(float) * n), *y2 = (float *)malloc(sizeof(float) * n);
            float *y3 = (float *)malloc(sizeof(float) * n), *y4 = (float *)malloc(sizeof(float) * n), s8[8], s24[24];
            const float *rows[8];
            for (i = 0; i < cap * stride; i++) { seed = seed * 1103515245u + 12345u; base[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f; }
            for (i = 0; i < n; i++) { seed = seed * 1103515245u + 12345u; q[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f; }
            for (j = 0; j < m; j++) { seed = seed * 1103515245u + 12345u; p[j] = (float)((seed >> 8) & 0xffff) / 65536.0f; }
            for (j = 0; j < 8; j++) rows[j] = base + (size_t)((k0 + j) % cap) * stride;
            g4__dot8(s8, 1, q, rows, n);
            g4__dot8(s24, 3, q, rows, n); /* every third float */
            for (j = 0; j < 8; j++) {
                float d = g4__dot(q, rows[j], n);
                bad_dot += memcmp(&d, &s8[j], sizeof d) != 0 || memcmp(&d, &s24[3 * j], sizeof d) != 0;
                bad_ref += fabs(s8[j] - g4__dot_ref(q, rows[j], n)) > 1e-6 * n * 4;
            }
            g4__wsum_ring(y1, p, base, (size_t)stride, cap, k0, m, n, 0);
            /* the same sum in two runs of rows, the second added on */
            g4__wsum_ring(y4, p, base, (size_t)stride, cap, k0, m / 2, n, 0);
            g4__wsum_ring(y4, p + m / 2, base, (size_t)stride, cap, k0 + m / 2, m - m / 2, n, 1);
            bad_runs += memcmp(y1, y4, sizeof(float) * n) != 0;
            for (i = 0; i < n; i++) y2[i] = y3[i] = 0.0f;
            for (j = 0; j < m; j++) {
                const float *v = base + (size_t)((k0 + j) % cap) * stride;
                g4__axpy(y2, p[j], v, n);
                for (i = 0; i < n; i++) y3[i] += p[j] * v[i];
            }
            bad_axpy += memcmp(y1, y2, sizeof(float) * n) != 0;
            bad_scalar += memcmp(y1, y3, sizeof(float) * n) != 0;
            cases++;
            free(base); free(q); free(p); free(y1); free(y2); free(y3); free(y4);
        }
    printf("  %d cases (head sizes 1 to 256, 1 to 40 keys, rows wrapping the ring)\n", cases);
    CHECK(bad_dot == 0, "%d of 8-key dots differ from g4__dot's bits", bad_dot);
#ifdef G4__VL /* (the scalar build's g4__dot is g4__dot_ref: bad_dot's check, to the bit) */
    CHECK(bad_ref == 0, "%d of 8-key dots are not within rounding of the scalar dot", bad_ref);
#endif
    CHECK(bad_axpy == 0, "%d cases: the weighted sum differs from g4__axpy key by key", bad_axpy);
    CHECK(bad_scalar == 0, "%d cases: the weighted sum differs from the scalar loop", bad_scalar);
    CHECK(bad_runs == 0, "%d cases: the weighted sum in two runs of rows differs from one run", bad_runs);
}

/* The blocked attention kernel the forward runs (g4__attend_blocked: 8 heads
   or 8 keys per g4__dot8, values in runs of G4__ATT_KEYS keys) gives, bit for
   bit, the reference loop of >>ops (g4__attend: per head, q.k key by key,
   softmax, p v summed from zero key by key), on head sizes that are not
   multiples of the vector, 1 to 12 heads, windows that wrap the ring and cross
   the runs of keys, and an empty window (out all zeros). Both in float32 and
   with bf16 = 1 (bf16_fast's attention: q, keys and values of bf16 values as
   the bf16 mode stores them; scores, p and out rounded to bf16, p v in pairs
   of keys: on avx512_bf16, native or emulated, VDPBF16PS against the scalar
   model g4__dpbf16_lane, odd key counts and D % 32 == 16 included), where out
   must hold bf16 values and differ from the float32 run's in at least 90%
   of the cases with 2 keys or more and 16 outputs or more. */
static void test_attend_blocked_vs_reference(void) {
    static const int Ds[] = {1, 7, 16, 3 * G4__VL_T + 5, 256};
    static const int Gs[] = {1, 2, 3, 5, 8, 12};
    static const int Ls[] = {0, 1, 7, 8, 9, 64, 65, 150};
    unsigned seed = 777;
    int a, b, c, i, bf16, bad = 0, cases = 0, not_bf16 = 0, moved = 0, movable = 0;
    for (bf16 = 0; bf16 <= 1; bf16++)
        for (a = 0; a < 5; a++)
            for (b = 0; b < 6; b++)
                for (c = 0; c < 8; c++) {
                    int D = Ds[a], G = Gs[b], L = Ls[c], KVH = 2, kvh = 1, cap = L + 5, lo = 3 * cap - 2, hi = lo + L - 1;
                    size_t kv = (size_t)cap * KVH * D;
                    g4_kv_slot sl;
                    float *k = (float *)malloc(sizeof(float) * kv), *v = (float *)malloc(sizeof(float) * kv);
                    float *q = (float *)malloc(sizeof(float) * (size_t)G * D);
                    float *o1 = (float *)malloc(sizeof(float) * (size_t)G * D), *o2 = (float *)malloc(sizeof(float) * (size_t)G * D);
                    float *o3 = (float *)malloc(sizeof(float) * (size_t)G * D);
                    float *s1 = (float *)malloc(sizeof(float) * (size_t)G * (L + 1)), *s2 = (float *)malloc(sizeof(float) * (size_t)G * (L + 1));
                    for (i = 0; i < (int)kv; i++) {
                        seed = seed * 1103515245u + 12345u; k[i] = (float)((seed >> 8) & 0xffff) / 16384.0f - 2.0f;
                        seed = seed * 1103515245u + 12345u; v[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
                        v[i] = ldexpf(v[i], (int)(seed >> 28) - 8); /* exponents spread: sums that round, so the order shows */
                    }
                    for (i = 0; i < G * D; i++) { seed = seed * 1103515245u + 12345u; q[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f; }
                    if (bf16) {
                        g4__bf16_round_range(k, 0, kv); g4__bf16_round_range(v, 0, kv);
                        g4__bf16_round_range(q, 0, (size_t)G * D);
                    }
                    for (i = 0; i < G * D; i++) o1[i] = o2[i] = 99.0f; /* must be overwritten */
                    memset(&sl, 0, sizeof sl);
                    sl.kv_heads = KVH; sl.head_dim = D; sl.capacity = cap; sl.k = k; sl.v = v;
                    sl.n_pos = hi + 1; sl.oldest = lo;
                    g4__attend(o1, q, G, &sl, kvh, lo, hi, s1, bf16);
                    g4__attend_blocked(o2, q, G, &sl, kvh, lo, hi, s2, bf16);
                    bad += memcmp(o1, o2, sizeof(float) * (size_t)G * D) != 0;
                    if (L == 0) for (i = 0; i < G * D; i++) bad += o1[i] != 0.0f;
                    if (bf16) {
                        g4__attend_blocked(o3, q, G, &sl, kvh, lo, hi, s2, 0);
                        /* (one key: out = v; nor need every other case move: with D 256 the scores spread
                           by tens, a softmax whose top p is 1.0 in float32 gives out = v in both modes, as
                           1 of 108 cases did on NEON, whose head sizes draw other random values) */
                        movable += L >= 2 && G * D >= 16;
                        moved += L >= 2 && G * D >= 16 && memcmp(o2, o3, sizeof(float) * (size_t)G * D) != 0;
                        for (i = 0; i < G * D; i++) not_bf16 += g4__bf16_round(o2[i]) != o2[i];
                    }
                    cases++;
                    free(k); free(v); free(q); free(o1); free(o2); free(o3); free(s1); free(s2);
                }
    printf("  %d cases (float32 and bf16, head sizes 1 to 256, 1 to 12 heads, 0 to 150 keys wrapping the ring), "
           "%d of the %d bf16 ones over 2 keys or more with 16 outputs or more differ from float32\n", cases, moved, movable);
    CHECK(bad == 0, "%d cases: g4__attend_blocked differs from the reference g4__attend", bad);
    CHECK(not_bf16 == 0, "%d outputs of the bf16 attention are not bf16 values", not_bf16);
    CHECK(movable > 50 && 10 * moved >= 9 * movable, "only %d of the %d bf16 cases over 2 keys or more (16 outputs or more) "
          "differ from float32 (90%% must: the flag must act)", moved, movable);
}

/* GELU: the SIMD path (g4__gelu_n, tails through a padded vector) gives the
   scalar twin's bits, and both are as close to the exact formula as the
   float32 formula with libm's tanhf (4.3e-7 near tanh = -1, where 1 + tanh
   cancels; transformers' float32 gelu has the same error). */
static void test_gelu_vs_scalar(void) {
    static const size_t lens[] = {1, 5, 16, 17, 100, 4097};
    float x[4097], y[4097];
    double worst = 0, worst_libm = 0;
    size_t k, i;
    int same = 1;
    for (k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        size_t n = lens[k];
        for (i = 0; i < n; i++) x[i] = n == 1 ? 0.5f : -20.0f + 40.0f * (float)i / (float)(n - 1);
        g4__gelu_n(y, x, n);
        for (i = 0; i < n; i++) {
            float s = g4__gelu(x[i]), lm = 0.5f * x[i] * (1.0f + tanhf(0.7978845608028654f * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
            double xd = x[i], ex = 0.5 * xd * (1.0 + tanh(0.7978845608028654 * (xd + 0.044715 * xd * xd * xd)));
            same &= memcmp(&s, &y[i], sizeof s) == 0;
            if (fabs(y[i] - ex) > worst) worst = fabs(y[i] - ex);
            if (fabs(lm - ex) > worst_libm) worst_libm = fabs(lm - ex);
        }
    }
    printf("  gelu on [-20, 20]: max error %.3g (libm tanhf formula: %.3g)\n", worst, worst_libm);
#ifdef G4__VL /* (the scalar build's g4__gelu_n is g4__gelu's own loop) */
    CHECK(same, "SIMD gelu differs from the scalar twin");
#endif
    CHECK(worst <= 5e-7, "gelu max error %g", worst);
    CHECK(g4__gelu(0.0f) == 0.0f && g4__gelu(30.0f) == 30.0f && g4__gelu(-30.0f) == 0.0f, "gelu at 0 and +-30");
    CHECK(g4__gelu(INFINITY) == INFINITY && isnan(g4__gelu(NAN)), "gelu at inf and NaN");
}

/* ------------------------------------------- bf16: transformers to the bit */

/* Every bf16 dump in data/dumps/ (tools/hf_dump.py --dtype bfloat16, torch
   2.15 with its AVX2 kernels), old and new, equals the bf16-faithful mode
   bit for bit: every tap in the dump and the logits, tolerance 0, in one
   step and in chunks of 5. The three newer dumps failed before torch's orders
   were reproduced: 31b_like_bf16_long (32 tokens, 4x the window: the RMSNorm
   sum and the matmul order, first at layers.5.self_attn.k), 26b_like_bf16_ulp
   (an RMSNorm ulp at layers.3.input_layernorm, then an exact
   router tie), 26b_like_bf16_tie (a tie torch.topk breaks to the higher id).
   The mode computes torch's order on every CPU (AVX-512 and avx512_bf16
   included: the VDPBF16PS kernel runs only with bf16_fast, test_bf16_fast),
   so this holds on every kernel set make test builds; the line "bf16
   goldens: ..." names the one that ran. */
static const char *const bf16_runs[][2] = {{"e2b_like", "e2b_like_bf16"}, {"e4b_like", "e4b_like_bf16"},
                                           {"31b_like", "31b_like_bf16"}, {"26b_like", "26b_like_bf16"},
                                           {"31b_like", "31b_like_bf16_long"}, {"26b_like", "26b_like_bf16_ulp"},
                                           {"26b_like", "26b_like_bf16_tie"}, {"unified_like", "unified_like_bf16"}};
#define N_BF16_RUNS ((int)(sizeof bf16_runs / sizeof bf16_runs[0]))
static void test_bf16_bit_identical(void) {
    const double tol = 0.0;
    int k, chunk, i, bad = 0;
    for (k = 0; k < N_BF16_RUNS; k++)
        for (chunk = 0; chunk <= 5; chunk += 5) {
            g4cmp c;
            char file[64];
            FILE *f = tmpfile();
            int first, present = 0;
            const g4cmp_row *lg;
            snprintf(file, sizeof file, "%s.safetensors", bf16_runs[k][1]);
            first = run_compare(&c, bf16_runs[k][0], dumpfile(file), 1, chunk, tol, -1, -1, f);
            for (i = 0; i < c.n_rows; i++) present += c.rows[i].present == 1;
            lg = cmp_row(&c, "logits");
            if (chunk == 0)
                printf("  %-12s vs %-20s %2d tokens, %3d taps in the dump: %s\n", bf16_runs[k][0], bf16_runs[k][1], c.n_ids,
                       present, first == -1 ? "every one bit-identical" : "DIFFERENT");
            CHECK(first == -1, "%s (chunk %d): tap %s differs (%.3g relative)", bf16_runs[k][1], chunk,
                  first >= 0 ? c.rows[first].name : "(error)", first >= 0 ? g4cmp_rel(&c.rows[first]) : 0.0);
            CHECK(lg && lg->present == 1 && present >= 7, "%s: logits and taps in the dump (%d)", bf16_runs[k][1], present);
            bad += first != -1;
            g4cmp_close(&c);
            fclose(f);
        }
    printf("  bf16 goldens: %d of %d runs (%d dumps, whole and by 5) %s with the faithful kernels on %s (%s, decode %s)\n",
           2 * N_BF16_RUNS - bad, 2 * N_BF16_RUNS, N_BF16_RUNS, bad ? "NOT all bit-identical" : "bit-identical", g4_simd_name(),
           G4__TORCH_GEMM ? "packed torch-order GEMM" : "scalar torch-order loop", G4__TORCH_MM ? "AVX2 rows" : "scalar rows");
}

#if G4__BF16DOT
/* bf16_fast: the VDPBF16PS kernel (avx512_bf16, or its model in
   tests/x86_emu.h), opt-in. Its sums are its own (pairs of products, 16
   lanes), not torch's, so a bf16 rounding can flip and propagate: stated
   bound G4CMP_TOL_BF16 (3e-2 of each tap's max |value|) against the same
   bf16 dumps, which the faithful mode equals to the bit (above), so this is
   its distance from the faithful mode. And it must really run: some tap of
   some dump differs from the faithful bits (a switch that did nothing would
   pass the bound). */
static void test_bf16_fast(void) {
    int k, i, differ = 0;
    double worst = 0;
    for (k = 0; k < N_BF16_RUNS; k++) {
        g4cmp c;
        char file[64];
        FILE *f = tmpfile();
        int first, same;
        double w = 0;
        snprintf(file, sizeof file, "%s.safetensors", bf16_runs[k][1]);
        first = run_compare(&c, bf16_runs[k][0], dumpfile(file), 2, 0, G4CMP_TOL_BF16, -1, -1, f);
        for (same = 1, i = 0; i < c.n_rows; i++) {
            if (c.rows[i].present != 1) continue;
            if (g4cmp_rel(&c.rows[i]) > w) w = g4cmp_rel(&c.rows[i]);
            same &= c.rows[i].max_abs == 0.0;
        }
        differ += !same;
        if (w > worst) worst = w;
        CHECK(first == -1, "bf16_fast %s: tap %s over %g (%.3g)", bf16_runs[k][1], first >= 0 ? c.rows[first].name : "(error)",
              G4CMP_TOL_BF16, first >= 0 ? g4cmp_rel(&c.rows[first]) : 0.0);
        g4cmp_close(&c);
        fclose(f);
    }
    printf("  bf16_fast (%s): worst tap %.3g of its max |value| over %d bf16 dumps (bound %g), %d differ from the faithful bits\n",
           g4_simd_name(), worst, N_BF16_RUNS, G4CMP_TOL_BF16, differ);
    CHECK(differ > 0, "bf16_fast gave the faithful bits on every dump: the VDPBF16PS kernel did not run");
}

/* every logit of ids through a bf16_fast session of model, `step` tokens per
   forward call (0: all at once), on pool (NULL: none); NULL after a CHECK */
static float *bf16_fast_logits(const char *model, const int32_t *ids, int n, int step, g4_pool *pool) {
    g4_model m;
    g4_session s;
    g4_session_config sc = g4_session_config_init();
    float *out = NULL;
    int done, k;
    if (g4_model_load(&m, tiny(model)) != G4_OK) { CHECK(0, "load %s: %s", model, m.error); return NULL; }
    sc.max_context = n;
    sc.max_chunk = step ? step : n;
    sc.bf16 = sc.bf16_fast = 1;
    sc.pool = pool;
    if (g4_session_create(&s, &m, &sc) != G4_OK) { CHECK(0, "session: %s", s.error); g4_model_free(&m); return NULL; }
    out = (float *)malloc(sizeof(float) * (size_t)n * (size_t)m.config.vocab_size);
    for (done = 0; out && done < n; done += k) {
        k = step ? (n - done < step ? n - done : step) : n;
        if (g4_forward(&s, ids + done, k, out + (size_t)done * m.config.vocab_size, G4_LOGITS_ALL) != G4_OK) {
            CHECK(0, "%s forward: %s", model, s.error);
            free(out);
            out = NULL;
        }
    }
    g4_session_destroy(&s);
    g4_model_free(&m);
    return out;
}

/* bf16_fast keeps the float32 path's promise: a prompt at once, in steps of 5,
   one token at a time (decode) and on 3 threads give the same logits, bit for
   bit (its VDPBF16PS tile sums each output in one order whatever the blocking,
   and its attention is the blocked kernel's, row by row), on every bf16 dump's
   ids and model */
static void test_bf16_fast_invariant(void) {
    g4_pool *pool = NULL;
    int k, runs = 0;
    CHECK(g4_pool_create(&pool, 3) == G4_OK, "pool");
    for (k = 0; k < N_BF16_RUNS; k++) {
        g4cmp c;
        char file[64];
        float *ref, *other;
        int v, bad = 0;
        size_t n;
        snprintf(file, sizeof file, "%s.safetensors", bf16_runs[k][1]);
        if (g4cmp_open(&c, dumpfile(file)) != G4_OK) { CHECK(0, "%s", c.error); continue; }
        ref = bf16_fast_logits(bf16_runs[k][0], c.ids, c.n_ids, 0, NULL);
        for (v = 0; ref && v < 3; v++) {
            g4_model m;
            other = bf16_fast_logits(bf16_runs[k][0], c.ids, c.n_ids, v == 0 ? 5 : v == 1 ? 1 : 0, v == 2 ? pool : NULL);
            if (!other || g4_model_load(&m, tiny(bf16_runs[k][0])) != G4_OK) { free(other); bad++; continue; }
            n = (size_t)c.n_ids * (size_t)m.config.vocab_size;
            g4_model_free(&m);
            if (memcmp(ref, other, sizeof(float) * n) != 0) {
                bad++;
                CHECK(0, "bf16_fast %s: %s differs from the whole prompt in one step", bf16_runs[k][1],
                      v == 0 ? "steps of 5" : v == 1 ? "one token a step" : "3 threads");
            }
            free(other);
        }
        runs += ref && !bad;
        free(ref);
        g4cmp_close(&c);
    }
    printf("  bf16_fast: %d of %d dumps' ids give the same logits at once, by 5, by 1 and on 3 threads\n", runs, N_BF16_RUNS);
    g4_pool_free(pool);
}
#endif

/* torch.topk's choice among tied values, against cases recorded from torch
   2.15 on the CPU (tools: torch.topk on these float32 rows). None of them is
   the lower-index rule, so this fails under it (and under higher-index). */
static void test_topk_tie_rule(void) {
    static const struct { int E, K; const char *v; int want[8]; } cases[] = {
        {33, 2, "011000100001000011001000100001111", {17, 24}},
        {33, 4, "100200212112112002101011020221121", {8, 11, 17, 27}},
        {33, 4, "001122002212221121210110201001020", {9, 11, 12, 13}},
        {8, 3, "01110011", {1, 6, 7}},
        {16, 4, "0121000010012000", {1, 2, 11, 12}},
        {33, 2, "100010111100111110001110001001011", {15, 20}},
        {6, 3, "100010", {0, 3, 4}},
        {16, 3, "0111011110000101", {6, 7, 13}},
        /* 26b_like_bf16_tie, layer 1, token 9: experts 2 and 4 tie at p = 0.13008298 */
        {8, 3, "", {0, 1, 4}},
    };
    static const float tie9[8] = {0.4648013412952423f, 0.18201881647109985f, 0.13008297979831696f, 0.05214926600456238f,
                                  0.13008297979831696f, 0.031630128622055054f, 0.008956605568528175f, 0.0002779636415652931f};
    int c, i, j;
    for (c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        float p[64];
        int top[8], lower[8], E = cases[c].E, K = cases[c].K, same = 1, same_lower = 1;
        for (i = 0; i < E; i++) p[i] = cases[c].v[0] ? (float)(cases[c].v[i] - '0') : tie9[i];
        g4__topk_torch(p, E, K, top);
        for (i = 1; i < K; i++) /* values descending, as torch returns them */
            CHECK(p[top[i - 1]] >= p[top[i]], "case %d: topk not in descending value", c);
        for (i = 1; i < K; i++) /* the set, in index order */
            for (j = i; j > 0 && top[j - 1] > top[j]; j--) { int t = top[j]; top[j] = top[j - 1]; top[j - 1] = t; }
        for (i = 0; i < K; i++) { /* the lower-index rule, for contrast */
            int best = -1, e;
            for (e = 0; e < E; e++) {
                int taken = 0, q;
                for (q = 0; q < i; q++) taken |= lower[q] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            lower[i] = best;
        }
        for (i = 1; i < K; i++)
            for (j = i; j > 0 && lower[j - 1] > lower[j]; j--) { int t = lower[j]; lower[j] = lower[j - 1]; lower[j - 1] = t; }
        for (i = 0; i < K; i++) {
            same &= top[i] == cases[c].want[i];
            same_lower &= lower[i] == cases[c].want[i];
        }
        CHECK(same, "case %d (E %d, K %d): torch.topk's set differs", c, E, K);
        CHECK(!same_lower, "case %d: the lower-index rule would pass it too (the case does not discriminate)", c);
    }
    { /* a drafter's centroid top-k at the released size (2048 centroids, top 32: partial_sort, since
         64 K <= E), on the scratch g4__masked_logits passes: values ((i * 2654435761) mod 2^32 >> 16)
         mod 200, ten of them tied at the top value 199; torch.topk's set (float32 and bf16 rows agree),
         which the lower-index rule misses */
        static const int want[32] = {17,   108,  199,  235,  343,  400,  417,  491,  508,  565,  582,
                                     656,  673,  874,  965,  1039, 1056, 1130, 1147, 1221, 1312, 1439,
                                     1456, 1513, 1530, 1604, 1621, 1678, 1695, 1769, 1786, 1987};
        static float p[2048];
        static g4__vi q[2048];
        int top[32], same = 1;
        for (i = 0; i < 2048; i++) p[i] = (float)(((uint32_t)i * 2654435761u >> 16) % 200);
        g4__topk_torch_q(p, 2048, 32, top, q);
        for (i = 1; i < 32; i++)
            for (j = i; j > 0 && top[j - 1] > top[j]; j--) { int t = top[j]; top[j] = top[j - 1]; top[j - 1] = t; }
        for (i = 0; i < 32; i++) same &= top[i] == want[i];
        CHECK(same, "2048 centroids, top 32: torch.topk's set differs");
        { /* the lower-index rule, for contrast: the first of the largest left, 32 times */
            static char taken[2048];
            int same_lower = 1, k;
            for (k = 0; k < 32; k++) {
                int best = -1;
                for (i = 0; i < 2048; i++)
                    if (!taken[i] && (best < 0 || p[i] > p[best])) best = i;
                taken[best] = 1;
            }
            for (k = 0; k < 32; k++) same_lower &= taken[want[k]];
            CHECK(!same_lower, "2048 centroids: the lower-index rule would pass it too");
        }
    }
}

/* gelu on a bf16 tensor as ATen runs it: its last total % 32 elements take
   the scalar path (glibc tanhf), whose bf16 result differs from the vector
   path's (Sleef tanhf, exactly 1 past |z| 8.664) at four bf16 inputs; the
   expected bits are torch 2.15's (a contiguous 36-element tensor: 0..31
   vector, 32..35 scalar). Also: the SIMD torch-order matmul equals its
   scalar reference on every tail shape. */
static void test_bf16_gelu_tail_and_torch_matmul(void) {
    static const float xs[4] = {-5.0625f, -5.09375f, -5.125f, -5.15625f};
    static const uint16_t vec[4] = {0x8000, 0x8000, 0x8000, 0x8000}, sca[4] = {0xb422, 0xb423, 0xb424, 0xb425};
    static const int ins[] = {8, 16, 24, 40, 64, 72, 100, 136, 200, 1536};
    float x[36], y[36];
    int i, k, t;
    memset(x, 0, sizeof x);
    for (i = 0; i < 4; i++) x[i] = x[32 + i] = xs[i];
    g4__gelu_torch_n(y, x, 36, 0, 36);
    for (i = 0; i < 4; i++) {
        float a = g4__bf16_round(y[i]), b = g4__bf16_round(y[32 + i]);
        uint32_t ua, ub;
        memcpy(&ua, &a, 4);
        memcpy(&ub, &b, 4);
        CHECK((ua >> 16) == vec[i] && (ub >> 16) == sca[i], "gelu(%g): vector path %04x want %04x, scalar %04x want %04x",
              (double)xs[i], (unsigned)(ua >> 16), vec[i], (unsigned)(ub >> 16), sca[i]);
    }
    for (k = 0; k < (int)(sizeof ins / sizeof ins[0]); k++) {
        int in = ins[k], out = 5, n = 3, same;
        uint16_t *wb = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)in * out);
        float *xv = (float *)malloc(sizeof(float) * (size_t)in * n), y1[15], y2[15];
        g4_tensor w;
        uint32_t st = 12345u + (uint32_t)in;
        for (i = 0; i < in * out; i++) { st = st * 1664525u + 1013904223u; wb[i] = (uint16_t)(0x3c00 + (st >> 24) - 128 + ((st >> 8) & 0x8000)); }
        for (i = 0; i < in * n; i++) { st = st * 1664525u + 1013904223u; xv[i] = g4__bf16_round((float)((int)(st >> 9) - (1 << 22)) / (float)(1 << 20)); }
        memset(&w, 0, sizeof w);
        w.dtype = G4_BF16; w.data = wb; w.ndim = 2; w.shape[0] = out; w.shape[1] = in;
        g4__matmul_torch_ref(y2, xv, &w, n, 0, out);
#if G4__TORCH_MM /* (without it g4__matmul_torch is g4__matmul_torch_ref) */
        g4__matmul_torch(y1, xv, &w, n, 0, out);
        same = memcmp(y1, y2, sizeof(float) * (size_t)out * n) == 0;
        CHECK(same, "torch-order matmul (AVX2) differs from its reference at in %d", in);
#endif
        for (t = 0; t < n; t++) { /* decode steps (n 1: rows side by side): rows [0, 5) (one odd row out) and [1, 5) */
            g4__matmul_torch(y1, xv + (size_t)t * in, &w, 1, 0, out);
            g4__matmul_torch(y1 + out, xv + (size_t)t * in, &w, 1, 1, out);
            same = memcmp(y1, y2 + (size_t)t * out, sizeof(float) * out) == 0 &&
                   memcmp(y1 + out + 1, y2 + (size_t)t * out + 1, sizeof(float) * (out - 1)) == 0;
            CHECK(same, "torch-order matmul (%s), one token, differs from its reference at in %d, token %d",
                  G4__TORCH_MM ? "AVX2" : "scalar", in, t);
        }
        free(wb);
        free(xv);
    }
}

#if G4__BF16DOT
/* bf16_fast's matmul on VDPBF16PS (g4__rows_pairs for decode,
   g4__gemm_pairs for prefill) = its scalar model, bit for bit: each output
   one chain of g4__dpbf16_lane over its row's pairs of k, from 0, then the
   tail (in odd) as g4__tail adds it. At every edge: in below, at and past a
   transposed block (16 pairs) and a tiny block of k, odd and even; rows past
   a register (16), a tile (16 G4__PR) and a block; tokens past a tile
   (G4__PT) and a block; tiny blocks (one tile of rows, 17 pairs, one tile of
   tokens) and the default; rows split into two threads' parts at a multiple
   of 16 and not; decode, one token at a time. The cast in the stores =
   rounding after; strided x and y keep their gaps; no workspace is overrun.
   W and x are bf16 with signed zeros and denormals among them (the
   instruction flushes those: g4__dpbf16_lane's model must too). */
static uint16_t pairs_bf16(unsigned *seed) {
    unsigned r;
    *seed = *seed * 1103515245u + 12345u;
    r = *seed >> 8;
    if ((r & 31) == 0) return (uint16_t)((r >> 5) & 0x807f); /* a denormal or a signed zero */
    return (uint16_t)(0x3c00 + ((r >> 5) & 0x3ff) - 0x200 + ((r >> 15) & 0x8000)); /* +-[2^-8, 2^8) */
}
static float pairs_model(const uint16_t *w, const float *x, int in) {
    float acc = 0.0f;
    int k;
    for (k = 0; k + 1 < in; k += 2) acc = g4__dpbf16_lane(acc, x[k], g4__bf16_to_f32(w[k]), x[k + 1], g4__bf16_to_f32(w[k + 1]));
    return in % 2 ? g4__tail(acc, x, (const unsigned char *)w, G4_BF16, in - 1, in) : acc;
}
static void test_gemm_pairs(void) {
    static const int ins[] = {1, 2, 3, 31, 32, 34, 35, 70, 2101};
    static const int outs[] = {1, 17, 16 * G4__PR + 1, 29, 4 * 16 * G4__PR + 5};
    static const int ns[] = {2, G4__PT + 1, 2 * G4__PT + 1, 70, G4__BF16DOT_NC + 3};
    g4__blocking tiny;
    const g4__blocking *dflt = &g4__bf16dot_blocks;
    unsigned seed = 4242;
    int a, b, c, cases = 0, bad_model = 0, bad_bits = 0, bad_decode = 0, bad_split = 0, bad_cast = 0, bad_gap = 0, bad_ws = 0;
    size_t tiny_ws, dflt_ws = G4__BF16DOT_FLOATS;
    float *ws, *ws2;
    tiny.mc = 16 * G4__PR; tiny.kc = 34; tiny.nc = G4__PT;
    tiny_ws = (size_t)tiny.mc * tiny.kc / 2;
    ws = (float *)malloc(sizeof(float) * (dflt_ws + 1));
    ws2 = (float *)malloc(sizeof(float) * (tiny_ws + 1));
    for (a = 0; a < (int)(sizeof ins / sizeof ins[0]); a++)
        for (b = 0; b < 5; b++)
            for (c = 0; c < 5; c++) {
                int in = ins[a], out = outs[b], n = ns[c], ldx = in + 3, ldy = out + 2, i, t, half;
                size_t ny = (size_t)ldy * n;
                uint16_t *wb, *xh;
                float *x, *y1, *y2, *row;
                g4_tensor w;
                if ((double)in * out * n > 6e6) continue; /* (the model is scalar; 2101 runs with fewer rows and tokens) */
                wb = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)in * out);
                xh = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)ldx * n);
                x = (float *)malloc(sizeof(float) * (size_t)ldx * n);
                y1 = (float *)malloc(sizeof(float) * ny);
                y2 = (float *)malloc(sizeof(float) * ny);
                row = (float *)malloc(sizeof(float) * (size_t)out);
                for (i = 0; i < in * out; i++) wb[i] = pairs_bf16(&seed);
                for (i = 0; i < ldx * n; i++) x[i] = g4__bf16_to_f32(pairs_bf16(&seed));
                for (t = 0; t < n; t++) g4__to_bf16(xh + (size_t)t * ldx, x + (size_t)t * ldx, 1, in);
                memset(&w, 0, sizeof w);
                w.data = wb; w.dtype = G4_BF16; w.ndim = 2; w.shape[0] = out; w.shape[1] = in;
                for (i = 0; i < (int)ny; i++) y1[i] = y2[i] = -7.0f; /* the gaps must keep this */
                ws[dflt_ws] = ws2[tiny_ws] = 1234.5f;
                g4__gemm_pairs(y1, (size_t)ldy, xh, x, (size_t)ldx, &w, n, 0, out, ws2, &tiny, 0);
                g4__gemm_pairs(y2, (size_t)ldy, xh, x, (size_t)ldx, &w, n, 0, out, ws, dflt, 0);
                bad_ws += ws[dflt_ws] != 1234.5f || ws2[tiny_ws] != 1234.5f;
                bad_bits += memcmp(y1, y2, sizeof(float) * ny) != 0;
                for (t = 0; t < n; t++) {
                    for (i = out; i < ldy; i++) bad_gap += y1[(size_t)t * ldy + i] != -7.0f || y2[(size_t)t * ldy + i] != -7.0f;
                    for (i = 0; i < out; i++) {
                        float m = pairs_model(wb + (size_t)i * in, x + (size_t)t * ldx, in);
                        bad_model += memcmp(&m, y1 + (size_t)t * ldy + i, sizeof m) != 0;
                    }
                    g4__rows_pairs(row, x + (size_t)t * ldx, xh + (size_t)t * ldx, (const unsigned char *)wb, in, 0, out, 0);
                    bad_decode += memcmp(row, y1 + (size_t)t * ldy, sizeof(float) * out) != 0;
                    g4__rows_pairs(row, x + (size_t)t * ldx, xh + (size_t)t * ldx, (const unsigned char *)wb, in, 0, out, 1);
                    for (i = 0; i < out; i++) {
                        float r = g4__bf16_round(y1[(size_t)t * ldy + i]);
                        bad_cast += memcmp(&r, &row[i], sizeof r) != 0;
                    }
                }
                g4__gemm_pairs(y2, (size_t)ldy, xh, x, (size_t)ldx, &w, n, 0, out, ws2, &tiny, 1);
                for (t = 0; t < n; t++) {
                    for (i = out; i < ldy; i++) bad_gap += y2[(size_t)t * ldy + i] != -7.0f;
                    for (i = 0; i < out; i++) {
                        float r = g4__bf16_round(y1[(size_t)t * ldy + i]);
                        bad_cast += memcmp(&r, y2 + (size_t)t * ldy + i, sizeof r) != 0;
                    }
                }
                half = out / 2 / 16 * 16; /* two threads' parts: at a multiple of 16 (as g4__matmul_part splits), then not */
                g4__gemm_pairs(y2, (size_t)ldy, xh, x, (size_t)ldx, &w, n, 0, half, ws2, &tiny, 0);
                g4__gemm_pairs(y2, (size_t)ldy, xh, x, (size_t)ldx, &w, n, half, out, ws, dflt, 0);
                bad_split += memcmp(y1, y2, sizeof(float) * ny) != 0;
                g4__gemm_pairs(y2, (size_t)ldy, xh, x, (size_t)ldx, &w, n, 0, out / 2, ws, dflt, 0);
                g4__gemm_pairs(y2, (size_t)ldy, xh, x, (size_t)ldx, &w, n, out / 2, out, ws2, &tiny, 0);
                bad_split += memcmp(y1, y2, sizeof(float) * ny) != 0;
                cases++;
                free(wb); free(xh); free(x); free(y1); free(y2); free(row);
            }
    printf("  %d cases (in up to %d, out up to %d, up to %d tokens), tiny blocks mc %d kc %d nc %d and the default mc %d kc %d nc %d\n",
           cases, ins[8], outs[4], ns[4], tiny.mc, tiny.kc, tiny.nc, dflt->mc, dflt->kc, dflt->nc);
    CHECK(cases >= 200, "only %d cases ran", cases);
    CHECK(bad_model == 0, "%d outputs differ from the scalar model's chain", bad_model);
    CHECK(bad_bits == 0, "%d cases: tiny blocks and the default blocking differ in bits", bad_bits);
    CHECK(bad_decode == 0, "%d token rows: decode differs from the prefill GEMM", bad_decode);
    CHECK(bad_split == 0, "%d splits of the rows differ", bad_split);
    CHECK(bad_cast == 0, "%d outputs: the cast in the stores differs from rounding after", bad_cast);
    CHECK(bad_gap == 0, "%d values between y's rows overwritten", bad_gap);
    CHECK(bad_ws == 0, "%d cases wrote past the workspace", bad_ws);
    free(ws);
    free(ws2);
}

/* bf16_fast's p v on VDPBF16PS (g4__wsum_bf16) = its scalar model
   (g4__wsum_pairs, lane by lane g4__dpbf16_lane), bit for bit before the
   final rounding (which would hide an order's last bits): head sizes of one
   and of several 32-output blocks and a 16-output end, 1 to 11 heads (two
   groups of 8), odd and even key counts within a run and across runs of
   G4__ATT_KEYS, windows that wrap the ring; values and p of bf16 values with
   exponents spread over 2^-8 .. 2^7 (sums that round, so the order shows),
   denormals and a NaN-free spread of signs. */
static void test_wsum_bf16_vs_pairs(void) {
    static const int Ds[] = {16, 48, 256};
    static const int Gs[] = {1, 3, 8, 11};
    static const int Ls[] = {1, 2, 7, 64, 65, 130};
    unsigned seed = 99;
    int a, b, c, i, h, bad = 0, cases = 0;
    for (a = 0; a < 3; a++)
        for (b = 0; b < 4; b++)
            for (c = 0; c < 6; c++) {
                int D = Ds[a], G = Gs[b], L = Ls[c], KVH = 2, cap = L + 3, lo = 2 * cap - 1;
                size_t nv = (size_t)cap * KVH * D, stride = (size_t)KVH * D;
                float *v = (float *)malloc(sizeof(float) * nv), *p = (float *)malloc(sizeof(float) * (size_t)G * L);
                float *pw = (float *)malloc(sizeof(float) * (size_t)G * L), *y1 = (float *)malloc(sizeof(float) * (size_t)G * D);
                float *y2 = (float *)malloc(sizeof(float) * (size_t)G * D);
                for (i = 0; i < (int)nv; i++) {
                    seed = seed * 1103515245u + 12345u;
                    v[i] = ldexpf((float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f, (int)(seed >> 28) - 8);
                    if (i % 97 == 5) v[i] = 1e-39f; /* a denormal: read as zero by the instruction */
                }
                for (i = 0; i < G * L; i++) {
                    seed = seed * 1103515245u + 12345u;
                    p[i] = ldexpf((float)((seed >> 8) & 0xffff) / 65536.0f, -(int)(seed >> 28));
                }
                g4__bf16_round_range(v, 0, nv);
                g4__bf16_round_range(p, 0, (size_t)G * L);
                memcpy(pw, p, sizeof(float) * (size_t)G * L); /* (g4__wsum_bf16 packs p into pairs in place) */
                for (h = 0; h < G; h++) g4__wsum_pairs(y1 + (size_t)h * D, p + (size_t)h * L, v + D, stride, cap, lo, L, D);
                g4__wsum_bf16(y2, pw, G, v + D, stride, cap, lo, L, D);
                bad += memcmp(y1, y2, sizeof(float) * (size_t)G * D) != 0;
                cases++;
                free(v); free(p); free(pw); free(y1); free(y2);
            }
    printf("  %d cases (head sizes 16, 48, 256; 1 to 11 heads; 1 to 130 keys)\n", cases);
    CHECK(bad == 0, "%d of %d cases: g4__wsum_bf16 differs from g4__wsum_pairs", bad, cases);
}

/* bf16_fast's scores on VDPBF16PS (g4__dot8x2_bf16: 8 heads' q against two
   keys) = their scalar model (g4__dot_pairs), bit for bit before the bf16
   rounding: head sizes 32 to 512, q and keys of bf16 values with exponents
   spread over 2^-8 .. 2^7 (sums that round) and a denormal now and then. */
static void test_dot8x2_bf16_vs_pairs(void) {
    static const int Ds[] = {32, 64, 96, 256, 512};
    float q[8 * 512], ka[512], kb[512], s[16];
    uint16_t qb[8 * 512];
    unsigned seed = 4242;
    int a, r, i, j, bad = 0, cases = 0;
    for (a = 0; a < 5; a++)
        for (r = 0; r < 6; r++) {
            int D = Ds[a];
            float *all[3];
            int n[3];
            all[0] = q, all[1] = ka, all[2] = kb, n[0] = 8 * D, n[1] = n[2] = D;
            for (j = 0; j < 3; j++)
                for (i = 0; i < n[j]; i++) {
                    seed = seed * 1103515245u + 12345u;
                    all[j][i] = ldexpf((float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f, (int)(seed >> 28) - 8);
                    if (i % 101 == 7) all[j][i] = -3e-39f;
                }
            g4__bf16_round_range(q, 0, (size_t)(8 * D));
            g4__bf16_round_range(ka, 0, (size_t)D);
            g4__bf16_round_range(kb, 0, (size_t)D);
            g4__to_bf16(qb, q, 8, D);
            g4__dot8x2_bf16(s, 2, ka, kb, qb, D);
            for (j = 0; j < 8; j++) {
                float ra = g4__dot_pairs(q + (size_t)j * D, ka, D), rb = g4__dot_pairs(q + (size_t)j * D, kb, D);
                bad += memcmp(&ra, &s[2 * j], 4) != 0;
                bad += memcmp(&rb, &s[2 * j + 1], 4) != 0;
            }
            cases++;
        }
    CHECK(bad == 0, "%d of %d scores: g4__dot8x2_bf16 differs from g4__dot_pairs", bad, 16 * cases);
}

/* bf16_fast's softmax on 16 lanes (g4__softmax_torch_v) = torch's float32
   softmax (g4__softmax_torch(x, n, 0, n)), bit for bit: rows of 1 to 80 and
   of 150 and 512 entries (tails of every length; below 8 and 16 the scalar
   paths), scores within +-2 (many terms of one size: the sums' order shows)
   and spread over +-40, rows with entries more than 104 below
   the max (exp 0: the scalar fallback for their vector), a row with its max
   at the end, a row with a NaN, and the max's first-found rule for +-0 ties. */
static void test_softmax_torch_v(void) {
    float x[512], y[512];
    unsigned seed = 31;
    int n, i, kind, bad = 0, cases = 0;
    for (kind = 0; kind < 4; kind++)
        for (n = 1; n <= 512; n = n < 80 ? n + 1 : n == 80 ? 150 : 512 + (n == 512)) {
            for (i = 0; i < n; i++) {
                seed = seed * 1103515245u + 12345u;
                x[i] = ((float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f) * (kind == 0 ? 4.0f : 80.0f);
                if (kind == 1 && i % 5 == 2) x[i] -= 300.0f;
                if (kind == 2) x[i] = i == n - 1 ? 0.0f : i % 2 ? -0.0f : -1.0f - (float)i;
            }
            if (kind == 3) x[n / 2] = NAN;
            memcpy(y, x, sizeof(float) * (size_t)n);
            g4__softmax_torch(x, n, 0, n);
            g4__softmax_torch_v(y, n);
            bad += memcmp(x, y, sizeof(float) * (size_t)n) != 0;
            cases++;
        }
    CHECK(cases == 4 * 82 && bad == 0, "%d of %d rows: g4__softmax_torch_v differs from g4__softmax_torch", bad, cases);
}
#endif
#if G4__TORCH_GEMM
static void test_gemm_torch(void) { gemm_blocking(G4__TILE_TORCH); }
#endif

/* Threads split work, never change a sum: every golden model gives the same
   bits with a 3-thread pool (so the goldens pass with threads on too). */
static void test_threads_bit_identical(void) {
    static const char *models[] = {"e2b_like", "e4b_like", "31b_like", "26b_like", "plain", "legacy_keys"};
    g4_pool *pool;
    int k;
    {
        g4_pool *bad;
        CHECK(g4_pool_create(&bad, 0) == G4_ERR_INPUT && bad == NULL, "0 threads is an error");
    }
    /* 2 threads spin-wait on a 2-core machine; 3 are more than its cores, so
       they do not. float32 with 2, the bf16-faithful mode with 3. */
    for (k = 0; k < 12; k++) {
        int nt = k < 6 ? 2 : 3;
        golden g;
        g4i_run a;
        g4_session b;
        void *b_arena;
        int n, V;
        const int32_t *ids;
        float *la, *lb;
        if (k % 6 == 0) CHECK(g4_pool_create(&pool, nt) == G4_OK && g4_pool_threads(pool) == nt, "pool");
        memset(&a, 0, sizeof a); /* (g4i_close below may run without g4i_open) */
        if (!golden_open(&g, models[k % 6])) { CHECK(0, "golden"); goto next; }
        ids = golden_ids(&g, "input_ids", &n);
        if (!ids || !g4i_open(&a, &g4i_cpu, tiny(models[k % 6]), n, 7, 0)) {
            CHECK(0, "open");
            g4i_close(&a);
            g4_model_free(&g.m);
            goto next;
        }
        V = a.m.config.vocab_size;
        { /* b: the same session config with the pool, in an arena of the test's own */
            g4_session_config sc = *a.s.cfg;
            size_t bytes;
            sc.pool = pool;
            CHECK(g4_session_size(&a.m, &sc, &bytes) == G4_OK && bytes > a.s.bytes, "threads need more scores rows");
            b_arena = malloc(bytes);
            CHECK(g4_session_init(&b, &a.m, &sc, b_arena, bytes) == G4_OK, "init");
        }
        a.s.cfg->bf16 = b.cfg.bf16 = k >= 6; /* the second round in the bf16-faithful mode */
        la = (float *)malloc(sizeof(float) * (size_t)n * V);
        lb = (float *)malloc(sizeof(float) * (size_t)n * V);
        CHECK(g4i_cpu.forward(&a.s, ids, n, la, G4_LOGITS_ALL) == G4_OK && g4_forward(&b, ids, n, lb, G4_LOGITS_ALL) == G4_OK,
              "fwd");
        CHECK(memcmp(la, lb, sizeof(float) * (size_t)n * V) == 0, "%s: %d threads differ from 1", models[k % 6], nt);
        free(la); free(lb); free(b_arena);
        g4i_close(&a);
        g4_model_free(&g.m);
    next: /* (a failed open too: the round's pool is freed) */
        if (k % 6 == 5) g4_pool_free(pool);
    }
}

/* The KV-reader layers run only the rows whose logits are asked for
   (g4__reader_rows_from, as transformers slices them): G4_LOGITS_LAST's
   logits and hidden row, in one step and in chunks of 3, must be the last
   row of G4_LOGITS_ALL's, bit for bit, in float32 and the bf16-faithful
   mode; a G4_LOGITS_NONE prefill (the readers skipped) then one decoded
   token must give that row too (decode = prefill bits). On every golden
   model with KV-reader layers, and with a 2-thread pool. */
static void test_reader_rows_sliced(void) {
    static const char *models[] = {"e2b_like", "e4b_like", "legacy_keys"};
    g4_pool *pool = NULL;
    int k, c;
    CHECK(g4_pool_create(&pool, 2) == G4_OK, "pool");
    for (k = 0; k < 6; k++) {
        golden g;
        g4_model m;
        int n, V, H, bad = 0;
        const int32_t *ids;
        float *all = NULL, *last = NULL, *hall = NULL, *hlast = NULL;
        if (!golden_open(&g, models[k % 3])) { CHECK(0, "golden"); continue; }
        ids = golden_ids(&g, "input_ids", &n);
        if (!ids || g4_model_load(&m, tiny(models[k % 3])) != G4_OK) { CHECK(0, "load %s", models[k % 3]); g4_model_free(&g.m); continue; }
        CHECK(m.plan.first_shared > 0 && m.plan.first_shared < m.config.num_hidden_layers && n > 3, "%s has reader layers",
              models[k % 3]);
        V = m.config.vocab_size;
        H = m.config.hidden_size;
        all = (float *)malloc(sizeof(float) * (size_t)n * V);
        hall = (float *)malloc(sizeof(float) * (size_t)n * H);
        last = (float *)malloc(sizeof(float) * (size_t)V);
        hlast = (float *)malloc(sizeof(float) * (size_t)H);
        for (c = 0; c < 4; c++) { /* c 0: every row, one step (the reference); 1: LAST, one step; 2: LAST, chunks of 3; 3: NONE + decode */
            g4_session s;
            g4_session_config sc = g4_session_config_init();
            g4_result r;
            sc.max_context = n;
            sc.max_chunk = c == 2 ? 3 : n;
            sc.bf16 = k >= 3;
            sc.pool = c == 2 ? pool : NULL;
            if (g4_session_create(&s, &m, &sc) != G4_OK) { CHECK(0, "session: %s", s.error); continue; }
            if (c == 0) r = g4_forward_hidden(&s, ids, n, all, G4_LOGITS_ALL, hall);
            else if (c < 3) r = g4_forward_hidden(&s, ids, n, last, G4_LOGITS_LAST, hlast);
            else {
                r = g4_forward(&s, ids, n - 1, NULL, G4_LOGITS_NONE);
                if (r == G4_OK) r = g4_forward_hidden(&s, ids + n - 1, 1, last, G4_LOGITS_LAST, hlast);
            }
            CHECK(r == G4_OK, "%s forward: %s", models[k % 3], s.error);
            if (c > 0 && r == G4_OK) {
                int lb = memcmp(last, all + (size_t)(n - 1) * V, sizeof(float) * (size_t)V) != 0;
                int hb = memcmp(hlast, hall + (size_t)(n - 1) * H, sizeof(float) * (size_t)H) != 0;
                CHECK(!lb && !hb, "%s%s, case %d: the last row's %s differ from LOGITS_ALL's", models[k % 3], sc.bf16 ? " (bf16)" : "", c,
                      lb ? "logits" : "hidden states");
                bad += lb || hb;
            }
            g4_session_destroy(&s);
        }
        printf("  %s%s: %d tokens, readers from layer %d of %d: LAST (one step, chunks of 3) and NONE + decode = ALL's last row%s\n",
               models[k % 3], k >= 3 ? " (bf16)" : "", n, m.plan.first_shared, m.config.num_hidden_layers, bad ? ": NO" : "");
        free(all); free(last); free(hall); free(hlast);
        g4_model_free(&m);
        g4_model_free(&g.m);
    }
    g4_pool_free(pool);
}

/* hidden_size_per_layer_input (24) wider than hidden_size (16), as the config
   allows: the PLE rows must be sized by P, not H (ASan in the _san build); the
   logits, every tap of the golden, then transformers' greedy decode */
static void test_ple_wider_than_hidden(void) {
    g4i_golden(&g4i_cpu, "ple_wide", NULL, 0, NULL);
    g4i_greedy(&g4i_cpu, "ple_wide");
}

/* gemma4_unified with use_bidirectional_attention "all" (data/tiny/unified_all,
   tools/make_unified_goldens.py): the prompt in one step is transformers' full
   forward (every row sees every row on full layers, |q - kv| <= 5 on sliding
   ones: the config's 8 // 2 + 1), every tap of the golden; then generate()'s
   decode with its cache (a sliding layer keeps 4 positions before the step). */
static void test_unified_all(void) {
    g4_config c = g4i_config("unified_all");
    CHECK(c.unified && c.bidirectional == G4_BIDIR_ALL && c.sliding_window == 5, "config: bidirectional %d window %d",
          c.bidirectional, c.sliding_window);
    g4i_golden(&g4i_cpu, "unified_all", NULL, 0, NULL);
    g4i_greedy(&g4i_cpu, "unified_all");
}

int main(int argc, char **argv) {
    if (!h_args(argc, argv, &g_data, NULL, g_tmp, sizeof g_tmp, "test")) return 1; /* [DATA_DIR] [-k NAME] */

    g4i_run_all(&g4i_cpu, NULL, 0, NULL); /* tests/invariants.h */
    run("golden ple_wide: per-layer inputs wider than the hidden size (P 24 > H 16)", test_ple_wider_than_hidden);
    run("golden unified_all: use_bidirectional_attention \"all\", one-step prefill and generate()'s decode", test_unified_all);
    run("plan: gemma-4-E2B", test_plan_e2b);
    run("plan: gemma-4-E4B", test_plan_e4b);
    run("plan: gemma-4-31B", test_plan_31b);
    run("plan: gemma-4-26B-A4B", test_plan_26b);
    run("plan print format", test_plan_print_format);
    run("plan: reader without owner is rejected", test_plan_reader_without_owner);
    run("config: default and forced layer_types", test_config_default_layer_types);
    run("config: per_layer_config = legacy keys", test_config_per_layer_and_legacy);
    run("config: pad_token_id absent, null, negative, out of range", test_config_pad_token_id);
    run("config: errors name the field", test_config_errors);
    run("json parser", test_json_parser);
    run("rope: proportional pairs and denominator", test_rope_proportional);
    run("arena: undersized, misaligned, NULL", test_arena_errors);
    run("checkpoint: malformed files are errors", test_checkpoint_errors);
    run("wrapper checkpoint: tower tensors ignored", test_wrapper_ignores_towers);
    run("cli: logits file, compare and exit codes", test_cli);
    run("compare: every tap matches a transformers dump", test_compare_all_taps_f32);
    run("simd matmul tiles vs the scalar reference", test_simd_matmul_vs_scalar);
#if G4__HAVE_GEMM
    run("packed GEMM: every blocking edge, = reference, = decode bits", test_gemm_blocking);
    run("packed GEMM: kc from the L2 size, within the buffer; the largest kc = default = decode bits", test_gemm_kc_choice);
#endif
    run("attention: 8 keys at a time = g4__dot and g4__axpy key by key, bit for bit", test_attention_kernels);
    run("attention: the blocked kernel = the reference loop (g4__attend), bit for bit", test_attend_blocked_vs_reference);
    run("bf16 attention scores: the SIMD torch-order dot = g4__dot_torch, bit for bit", test_dot_torch_v);
    run("RMSNorm: torch's sum of squares, 32 lanes at once = lane by lane, bit for bit", test_tsum_lanes);
    run("RMSNorm: torch's sum of squares on rows of up to 600000 values = torch's bits (data/sum_squares)", test_sum_squares_torch);
    run("bf16 rounding of a range = g4__bf16_round per element (NaN, inf, ties, tail)", test_bf16_round_range);
    run("RoPE on a position's heads, 16 pairs at a time = g4__rope_pair pair by pair (float32, bf16, tails)", test_rope_blocks);
    run("gelu: SIMD = scalar twin, close to the exact formula", test_gelu_vs_scalar);
    run("threads: same bits as one thread, every golden model", test_threads_bit_identical);
    run("KV-reader layers on the asked rows only: LAST, chunks, NONE + decode = ALL's last row", test_reader_rows_sliced);
    run("compare: every golden model, every tap, f32 and bf16", test_compare_every_model);
    run("compare: a planted wrong owner is caught at its tap", test_compare_finds_planted_wrong_owner);
    run("bf16-faithful mode beats float32 vs transformers-bf16", test_bf16_faithful_mode);
    run("bf16-faithful mode: every bf16 dump bit-identical to transformers-bf16", test_bf16_bit_identical);
#if G4__BF16DOT
    run("bf16_fast: the VDPBF16PS kernel within G4CMP_TOL_BF16 of the faithful bits", test_bf16_fast);
    run("bf16_fast: the same logits at once, in steps, one token at a time and on 3 threads", test_bf16_fast_invariant);
#endif
    run("bf16: torch.topk's tie rule (not lower index)", test_topk_tie_rule);
    run("bf16: gelu's scalar tail; torch-order matmul SIMD = reference", test_bf16_gelu_tail_and_torch_matmul);
#if G4__BF16DOT
    run("bf16_fast: the VDPBF16PS matmul = its scalar chain, bit for bit: every blocking edge, decode, splits", test_gemm_pairs);
    run("bf16_fast: attention's p v on VDPBF16PS = its scalar model (g4__wsum_pairs), bit for bit", test_wsum_bf16_vs_pairs);
    run("bf16_fast: attention's scores on VDPBF16PS = their scalar model (g4__dot_pairs), bit for bit", test_dot8x2_bf16_vs_pairs);
    run("bf16_fast: attention's softmax on 16 lanes = torch's float32 softmax (g4__softmax_torch), bit for bit", test_softmax_torch_v);
#endif
#if G4__TORCH_GEMM
    run("bf16: the packed torch-order GEMM = torch-order reference, bit for bit", test_gemm_torch);
#endif

    remove_tree(g_tmp);
    return finish();
}
