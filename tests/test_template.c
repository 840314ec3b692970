/* Chat templates: every golden in data/templates/goldens.jsonl,
   made by tools/make_template_goldens.py with transformers'
   apply_chat_template (jinja2 3.1.6) and the `tokenizers` library, rendered
   by gemma4.h's interpreter: the text byte for byte and the ids exactly;
   templates that raise in jinja2 raise here with jinja2's message; bad
   templates give an error naming the construct and the line. The CLI
   (`gemma4 template DIR --messages FILE`) prints the same text and ids for
   the released template in data/templates/e2b, and exits 1 with one line on
   stderr (and, built with sanitizers, no report) for every bad template.

       build/test_template [DATA_DIR [CLI]]      (defaults: data build/gemma4) */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"
#include "../gemma4_processing.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const char *g_data = "data", *g_cli = "build/gemma4";
static char g_tmp[256];
static g4_tokenizer g_tok;
static int g_have_tok;

/* "a/b" in one of 8 rotating buffers (a may be an earlier result) */
static const char *P(const char *a, const char *b) {
    static char buf[8][700];
    static int k;
    char tmp[700];
    size_t la = strlen(a), lb = strlen(b);
    if (la + lb + 2 > sizeof tmp) la = lb = 0; /* too long: "/" (and the test fails loudly) */
    memcpy(tmp, a, la);
    tmp[la] = '/';
    memcpy(tmp + la + 1, b, lb + 1);
    k = (k + 1) % 8;
    memcpy(buf[k], tmp, sizeof tmp);
    return buf[k];
}

static int write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    if (len && fwrite(data, 1, len, f) != len) { fclose(f); return 0; }
    return fclose(f) == 0;
}

/* The first difference of two texts, for a failure message. */
static void show_diff(const char *want, size_t wn, const char *got, size_t gn) {
    size_t i = 0, a;
    while (i < wn && i < gn && want[i] == got[i]) i++;
    a = i > 40 ? i - 40 : 0;
    printf("  first difference at byte %lu (want %lu bytes, got %lu)\n  want: ...%.*s\n  got:  ...%.*s\n",
           (unsigned long)i, (unsigned long)wn, (unsigned long)gn, (int)((wn - a) < 80 ? wn - a : 80), want + a,
           (int)((gn - a) < 80 ? gn - a : 80), got + a);
}

static int parse_file_template(g4_template *t, const char *file) {
    char *src, err[G4_ERROR_MAX];
    size_t len;
    g4_result r;
    if (g4__read_file(P(P(g_data, "templates"), file), &src, &len, (size_t)1 << 24, err) != G4_OK) {
        CHECK(0, "%s", err);
        return 0;
    }
    r = g4_template_parse(t, src, len, file);
    free(src);
    CHECK(r == G4_OK, "parse %s: %s", file, t->error);
    return r == G4_OK;
}

static void check_clean_stderr(const char *what, const char *err, int want_one_line) {
    size_t i, lines = 0, n = strlen(err);
    CHECK(!strstr(err, "Sanitizer") && !strstr(err, "runtime error"), "%s: sanitizer report: %s", what, err);
    for (i = 0; i < n; i++) lines += err[i] == '\n';
    if (want_one_line) CHECK(lines == 1 && err[n - 1] == '\n', "%s: stderr must be one line, got %lu: %s", what, (unsigned long)lines, err);
}

static char g_out[1 << 20], g_err[8192];

static void golden_case(const g4__json *j, int row, int *n_render, int *n_raise, int *n_bad, int *n_cli) {
    int nm = g4__jget(j, row, "name"), tf = g4__jget(j, row, "template"), cj = g4__jget(j, row, "chat_json");
    int th = g4__jget(j, row, "think"), gn = g4__jget(j, row, "gen"), tx = g4__jget(j, row, "text");
    int id = g4__jget(j, row, "ids"), er = g4__jget(j, row, "error"), bt = g4__jget(j, row, "bad_template");
    g4_template t;
    g4_template_options o = g4_template_options_init();
    char *text = NULL, err[G4_ERROR_MAX] = "";
    size_t tl = 0;
    g4_result r;
    begin("%s: %s", bt >= 0 ? "bad template" : j->nodes[tf].str, j->nodes[nm].str);
    if (bt >= 0) { /* a bad template: the parse or the render fails, naming the construct and the line */
        int needle = g4__jget(j, row, "needle"), line = g4__jget(j, row, "line");
        char want_line[32];
        o.max_steps = 100000; /* the step limit case: stops after this many iterations */
        r = g4_template_parse(&t, j->nodes[bt].str, j->nodes[bt].len, "bad.jinja");
        if (r == G4_OK) {
            r = g4_template_render(&t, j->nodes[cj].str, j->nodes[cj].len, &o, &text, &tl, err);
            g4_template_free(&t);
        } else memcpy(err, t.error, sizeof err);
        snprintf(want_line, sizeof want_line, "line %d:", (int)j->nodes[line].ival);
        CHECK(r == G4_ERR_INPUT, "result %d (%s), want G4_ERR_INPUT; jinja2 said: %s", r, g4_result_str(r), j->nodes[er].str);
        CHECK(strstr(err, j->nodes[needle].str) != NULL, "message \"%s\" lacks \"%s\"", err, j->nodes[needle].str);
        CHECK(strstr(err, want_line) != NULL, "message \"%s\" lacks \"%s\"", err, want_line);
        CHECK(strstr(err, "bad.jinja") != NULL, "message \"%s\" does not name the template", err);
        CHECK(text == NULL, "no text on failure");
        g4_template_free_output(text);
        (*n_bad)++;
        end();
        return;
    }
    if (!parse_file_template(&t, j->nodes[tf].str)) { end(); return; }
    g4_template_set_tokens(&t, &g_tok);
    o.enable_thinking = j->nodes[th].type == G4__JTRUE;
    o.add_generation_prompt = j->nodes[gn].type == G4__JTRUE;
    r = g4_template_render(&t, j->nodes[cj].str, j->nodes[cj].len, &o, &text, &tl, err);
    if (er >= 0) { /* jinja2 raised: so must we, with its message */
        CHECK(r == G4_ERR_INPUT, "result %d (%s), want G4_ERR_INPUT (jinja2 raised: %s)", r, g4_result_str(r), j->nodes[er].str);
        CHECK(strstr(err, j->nodes[er].str) != NULL, "message \"%s\" lacks jinja2's \"%s\"", err, j->nodes[er].str);
        (*n_raise)++;
    } else {
        const g4__jnode *want = &j->nodes[tx];
        CHECK(r == G4_OK, "render failed: %s", err);
        if (r == G4_OK) {
            int same = tl == want->len && memcmp(text, want->str, tl) == 0;
            CHECK(same, "text differs from transformers'");
            if (!same) show_diff(want->str, want->len, text, tl);
        }
        if (g_have_tok) {
            int32_t *ids = NULL;
            size_t n = 0, k = 0;
            int c, same;
            r = g4_template_encode(&t, &g_tok, j->nodes[cj].str, j->nodes[cj].len, &o, &ids, &n, err);
            CHECK(r == G4_OK, "encode failed: %s", err);
            same = r == G4_OK && n == (size_t)j->nodes[id].count;
            for (c = j->nodes[id].child; same && c >= 0; c = j->nodes[c].next, k++) same = ids[k] == j->nodes[c].ival;
            CHECK(same, "ids differ from transformers' (%lu ids, want %d)", (unsigned long)n, j->nodes[id].count);
            g4_template_free_output(ids);
        }
        (*n_render)++;
        /* the CLI on the model directory that holds this template */
        if (strcmp(j->nodes[tf].str, "e2b/chat_template.jinja") == 0) {
            char args[1200], flags[64], msgfile[700];
            size_t on;
            snprintf(msgfile, sizeof msgfile, "%s/messages.json", g_tmp);
            int st;
            write_file(msgfile, j->nodes[cj].str, j->nodes[cj].len);
            snprintf(flags, sizeof flags, "%s%s", o.enable_thinking ? " --think" : "", o.add_generation_prompt ? "" : " --no-generation-prompt");
            snprintf(args, sizeof args, "template %s --messages %s%s", P(g_data, "templates/e2b"), msgfile, flags);
            st = run_cli(g_cli, args, g_out, sizeof g_out, &on, g_err, sizeof g_err);
            CHECK(st == 0, "cli %s: exit %d: %s", args, st, g_err);
            check_clean_stderr(args, g_err, 0);
            CHECK(on == want->len && memcmp(g_out, want->str, on) == 0, "cli %s: stdout differs from transformers'", args);
            if (!(on == want->len && memcmp(g_out, want->str, on) == 0)) show_diff(want->str, want->len, g_out, on);
            snprintf(args, sizeof args, "template %s --messages %s%s --ids", P(g_data, "templates/e2b"), msgfile, flags);
            st = run_cli(g_cli, args, g_out, sizeof g_out, &on, g_err, sizeof g_err);
            CHECK(st == 0, "cli %s: exit %d: %s", args, st, g_err);
            {
                char line[65536];
                size_t ll = 0;
                int c;
                for (c = j->nodes[id].child; c >= 0 && ll + 16 < sizeof line; c = j->nodes[c].next)
                    ll += (size_t)snprintf(line + ll, sizeof line - ll, "%s%lld", ll ? " " : "", (long long)j->nodes[c].ival);
                line[ll++] = '\n';
                line[ll] = 0;
                CHECK(strcmp(g_out, line) == 0, "cli %s: ids line differs:\n  want %s  got  %s", args, line, g_out);
            }
            (*n_cli)++;
        }
    }
    g4_template_free_output(text);
    g4_template_free(&t);
    end();
}

static void test_goldens(void) {
    char err[G4_ERROR_MAX];
    h_jsonl f;
    g4__json j;
    int n_render = 0, n_raise = 0, n_bad = 0, n_cli = 0, r;
    if (h_jsonl_open(&f, P(g_data, "templates/goldens.jsonl"), err) != G4_OK) {
        begin("template goldens");
        CHECK(0, "%s", err); /* (a committed fixture: a read error is a failure) */
        end();
        return;
    }
    while ((r = h_jsonl_next(&f, &j, err)) != 0) {
        if (r < 0) { /* a line that does not parse fails on its own; the others still run */
            begin("goldens.jsonl line");
            CHECK(0, "%s", err);
            end();
            continue;
        }
        golden_case(&j, 0, &n_render, &n_raise, &n_bad, &n_cli);
        g4__json_free(&j);
    }
    h_jsonl_close(&f);
    begin("template goldens: counts");
    printf("  %d rendered (text and ids), %d raising as in jinja2, %d bad templates, %d through the CLI\n", n_render,
           n_raise, n_bad, n_cli);
    CHECK(n_render >= 40 && n_raise >= 2 && n_bad >= 20 && n_cli >= 40, "too few goldens: %d %d %d %d", n_render, n_raise, n_bad, n_cli);
    end();
}

/* Where a template comes from: chat_template.jinja, else tokenizer_config.json (string or named list). */
static void test_load(void) {
    char dir[700], cmd[800];
    g4_template t;
    g4_result r;
    char *out = NULL;
    size_t n;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    snprintf(dir, sizeof dir, "%s/model", g_tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    CHECK(system(cmd) == 0, "mkdir");
    r = g4_template_load(&t, dir);
    CHECK(r == G4_ERR_IO && strstr(t.error, "no chat template"), "empty dir: %d %s", r, t.error);
    {
        const char *cfg = "{\"bos_token\":{\"content\":\"<B>\"},\"eos_token\":\"<E>\",\"chat_template\":\"{{ bos_token }}[{{ messages[0].content }}]{{ eos_token }}\"}";
        write_file(P(dir, "tokenizer_config.json"), cfg, strlen(cfg));
    }
    r = g4_template_load(&t, dir);
    CHECK(r == G4_OK, "string chat_template: %s", t.error);
    if (r == G4_OK) {
        r = g4_template_render(&t, chat, strlen(chat), NULL, &out, &n, NULL);
        CHECK(r == G4_OK && strcmp(out, "<B>[x]<E>") == 0, "render: %s", r == G4_OK ? out : t.error);
        g4_template_free_output(out);
        g4_template_free(&t);
    }
    {
        const char *cfg = "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},{\"name\":\"default\",\"template\":\"D{{ add_generation_prompt }}\"}]}";
        write_file(P(dir, "tokenizer_config.json"), cfg, strlen(cfg));
        r = g4_template_load(&t, dir);
        CHECK(r == G4_OK, "list chat_template: %s", t.error);
        if (r == G4_OK) {
            r = g4_template_render(&t, chat, strlen(chat), NULL, &out, &n, NULL);
            CHECK(r == G4_OK && strcmp(out, "DTrue") == 0, "the default template: %s", r == G4_OK ? out : t.error);
            g4_template_free_output(out);
            g4_template_free(&t);
        }
        cfg = "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"}]}";
        write_file(P(dir, "tokenizer_config.json"), cfg, strlen(cfg));
        r = g4_template_load(&t, dir);
        CHECK(r == G4_ERR_CONFIG && strstr(t.error, "\"default\""), "list without default: %d %s", r, t.error);
        cfg = "{\"chat_template\": 7}";
        write_file(P(dir, "tokenizer_config.json"), cfg, strlen(cfg));
        r = g4_template_load(&t, dir);
        CHECK(r == G4_ERR_CONFIG && strstr(t.error, "not a string"), "number: %d %s", r, t.error);
        write_file(P(dir, "tokenizer_config.json"), "{", 1);
        r = g4_template_load(&t, dir);
        CHECK(r == G4_ERR_JSON && strstr(t.error, "tokenizer_config.json"), "bad json: %d %s", r, t.error);
        /* Python's json reads lone surrogates; transformers then refuses such a bos_token (UnicodeEncodeError)
           and renders such a template to a str that cannot be tokenized (TypeError): gemma4.h refuses both */
        cfg = "{\"chat_template\":\"x\\ud800\"}";
        write_file(P(dir, "tokenizer_config.json"), cfg, strlen(cfg));
        r = g4_template_load(&t, dir);
        CHECK(r == G4_ERR_CONFIG && strstr(t.error, "tokenizer_config.json: chat_template holds a lone surrogate"),
              "lone surrogate in the template: %d %s", r, t.error);
        cfg = "{\"bos_token\":{\"content\":\"<bos>\\udc00\"},\"chat_template\":\"x\"}";
        write_file(P(dir, "tokenizer_config.json"), cfg, strlen(cfg));
        r = g4_template_load(&t, dir);
        CHECK(r == G4_ERR_CONFIG && strstr(t.error, "tokenizer_config.json: bos_token holds a lone surrogate"),
              "lone surrogate in bos_token: %d %s", r, t.error);
        cfg = "{\"chat_template\":\"x\xed\xa0\x80\"}";
        write_file(P(dir, "tokenizer_config.json"), cfg, strlen(cfg));
        r = g4_template_load(&t, dir);
        CHECK(r == G4_ERR_JSON && strstr(t.error, "tokenizer_config.json") && strstr(t.error, "encoded surrogate") &&
              strstr(t.error, "byte offset 19"), "encoded surrogate: %d %s", r, t.error);
        cfg = "{\"chat_template\":\"x\",\"note\":\"\\ud800\"}";
        write_file(P(dir, "tokenizer_config.json"), cfg, strlen(cfg));
        r = g4_template_load(&t, dir);
        CHECK(r == G4_OK, "a lone surrogate in a field gemma4.h does not read loads, as in Python: %d %s", r, t.error);
        if (r == G4_OK) g4_template_free(&t);
    }
    /* transformers refuses a chat_template.jinja that is not UTF-8 (UnicodeDecodeError) */
    write_file(P(dir, "chat_template.jinja"), "a\xff{{ 1 }}", 10);
    r = g4_template_load(&t, dir);
    CHECK(r == G4_ERR_INPUT && strstr(t.error, "chat_template.jinja: line 1: invalid UTF-8 at byte offset 1 (byte 0xFF)"),
          "invalid UTF-8 in the template file: %d %s", r, t.error);
    if (r == G4_OK) g4_template_free(&t);
    /* chat_template.jinja wins over tokenizer_config.json */
    write_file(P(dir, "tokenizer_config.json"), "{\"chat_template\":\"config\"}", 26);
    write_file(P(dir, "chat_template.jinja"), "file\n", 5);
    r = g4_template_load(&t, dir);
    CHECK(r == G4_OK, "jinja file: %s", t.error);
    if (r == G4_OK) {
        r = g4_template_render(&t, chat, strlen(chat), NULL, &out, &n, NULL);
        CHECK(r == G4_OK && strcmp(out, "file") == 0, "chat_template.jinja (trailing newline dropped): %s", r == G4_OK ? out : t.error);
        CHECK(strstr(t.name, "chat_template.jinja") != NULL, "name %s", t.name);
        g4_template_free_output(out);
        g4_template_free(&t);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "rm");
}

/* Bad conversations and API misuse: clear errors, no crash. */
static void test_bad_messages(void) {
    g4_template t;
    char *out = NULL, err[G4_ERROR_MAX];
    size_t n;
    g4_result r;
    static const struct { const char *json; g4_result want; const char *needle; } cases[] = {
        {"", G4_ERR_JSON, "messages JSON"},
        {"{\"messages\": []}", G4_ERR_INPUT, "empty conversation"},
        {"[]", G4_ERR_INPUT, "empty conversation"},
        {"{\"tools\": []}", G4_ERR_JSON, "expected {\"messages\""},
        {"{\"messages\": {}}", G4_ERR_JSON, "expected {\"messages\""},
        {"{\"messages\": [1]}", G4_ERR_JSON, "messages[0] is int"},
        {"{\"messages\": [{\"role\": \"user\"}], \"tools\": 5}", G4_OK, NULL},
        /* the rendered text must be UTF-8 to tokenize: invalid bytes and lone surrogates are refused */
        {"[{\"role\": \"user\", \"content\": \"a\xc3\"}]", G4_ERR_JSON, "invalid UTF-8"},
        {"[{\"role\": \"user\", \"content\": \"a\\ud800\"}]", G4_ERR_JSON, "lone leading surrogate"},
        {"[{\"role\": \"user\", \"content\": \"\\ud83d\\ude00\"}]", G4_OK, NULL},
    };
    size_t k;
    begin("template: bad conversations");
    r = g4_template_parse(&t, "{{ messages | length }}", 23, "t");
    CHECK(r == G4_OK, "%s", t.error);
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        r = g4_template_render(&t, cases[k].json, strlen(cases[k].json), NULL, &out, &n, err);
        CHECK(r == cases[k].want, "%s: result %d, want %d: %s", cases[k].json, r, cases[k].want, err);
        if (cases[k].needle) CHECK(strstr(err, cases[k].needle) != NULL, "%s: message \"%s\" lacks \"%s\"", cases[k].json, err, cases[k].needle);
        g4_template_free_output(out);
        out = NULL;
    }
    r = g4_template_render(&t, NULL, 0, NULL, &out, &n, err);
    CHECK(r == G4_ERR_INPUT, "NULL json: %d", r);
    g4_template_free(&t);
    r = g4_template_render(&t, "[]", 2, NULL, &out, &n, err);
    CHECK(r == G4_ERR_INPUT && strstr(err, "not parsed"), "freed template: %d %s", r, err);
    r = g4_template_parse(&t, NULL, 0, "t");
    CHECK(r == G4_ERR_INPUT, "NULL source: %d", r);
    end();
}

/* The limits: output size, memory, steps, depth; each a clear error. */
static void test_limits(void) {
    static const struct { const char *src; const char *needle; } cases[] = {
        {"{% for i in range(1000) %}{{ 'x' * 1000 }}{% endfor %}", "max_output"},
        {"{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "max_output"},
        {"{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", "max_steps"},
        {"{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "max_depth"},
        {"{% set ns = namespace(l=[]) %}{% for i in range(3000) %}{% set ns.l = ns.l + [i] %}{% endfor %}", "max_memory"},
    };
    size_t k;
    begin("template: limits");
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        g4_template t;
        g4_template_options o = g4_template_options_init();
        char *out = NULL, err[G4_ERROR_MAX];
        size_t n;
        g4_result r;
        o.max_output = 100000;
        o.max_steps = 5000;
        o.max_depth = 20;
        o.max_memory = (size_t)4 << 20;
        r = g4_template_parse(&t, cases[k].src, strlen(cases[k].src), "limits.jinja");
        CHECK(r == G4_OK, "%s", t.error);
        const char *chat = "[{\"role\":\"user\",\"content\":\"x\"}]";
        r = g4_template_render(&t, chat, strlen(chat), &o, &out, &n, err);
        CHECK(r == G4_ERR_INPUT && strstr(err, cases[k].needle) && strstr(err, "limits.jinja: line 1"),
              "case %lu: result %d, message \"%s\" (want \"%s\")", (unsigned long)k, r, err, cases[k].needle);
        g4_template_free_output(out);
        g4_template_free(&t);
    }
    end();
}

/* A bad template through the CLI: exit 1, one line naming the construct. */
static void test_cli_bad(void) {
    static const struct { const char *src; const char *needle; } cases[] = {
        {"{% if messages %}never closed", "'if' block from line 1 is not closed"},
        {"{{ messages | nofilter }}", "unknown filter 'nofilter'"},
        {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "max_depth"},
        {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "max_steps"},
        {"{{ raise_exception('no\\nway') }}", "raise_exception: no way"},
    };
    const char *msg = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    char dir[700], msgfile[700], cmd[800], args[2000], *tok;
    size_t k, tl;
    snprintf(dir, sizeof dir, "%s/badmodel", g_tmp);
    snprintf(msgfile, sizeof msgfile, "%s/m.json", g_tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    begin("template: bad templates through the CLI");
    CHECK(system(cmd) == 0, "mkdir");
    if (g4__read_file(P(g_data, "tokenizer/tokenizer.json"), &tok, &tl, (size_t)1 << 26, g_err) == G4_OK) {
        write_file(P(dir, "tokenizer.json"), tok, tl);
        free(tok);
    }
    write_file(msgfile, msg, strlen(msg));
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int st;
        write_file(P(dir, "chat_template.jinja"), cases[k].src, strlen(cases[k].src));
        snprintf(args, sizeof args, "template %s --messages %s", dir, msgfile);
        st = run_cli(g_cli, args, g_out, sizeof g_out, NULL, g_err, sizeof g_err);
        CHECK(st == 1, "case %lu: exit %d, want 1: %s", (unsigned long)k, st, g_err);
        check_clean_stderr(cases[k].src, g_err, 1);
        CHECK(strstr(g_err, cases[k].needle) != NULL, "case %lu: stderr \"%s\" lacks \"%s\"", (unsigned long)k, g_err, cases[k].needle);
    }
    /* usage errors */
    snprintf(args, sizeof args, "template %s", dir);
    CHECK(run_cli(g_cli, args, g_out, sizeof g_out, NULL, g_err, sizeof g_err) == 1, "no --messages: exit 1");
    snprintf(args, sizeof args, "template %s --messages %s/none.json", dir, g_tmp);
    CHECK(run_cli(g_cli, args, g_out, sizeof g_out, NULL, g_err, sizeof g_err) == 1 && strstr(g_err, "none.json"), "missing file: %s", g_err);
    check_clean_stderr("missing file", g_err, 1);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "rm");
    end();
}


/* The number after "prompt " in the n-th stats line of text (0-based), or -1. */
static long prompt_count(const char *text, int nth) {
    const char *p = text;
    int k;
    for (k = 0; p && k <= nth; k++) {
        p = strstr(p, "prompt ");
        if (p && k < nth) p += 7;
    }
    return p ? strtol(p + 7, NULL, 10) : -1;
}

static size_t count_ids(const char *text) {
    int32_t ids[4096];
    size_t n = 0;
    if (g4_tokenize(&g_tok, text, strlen(text), 0, ids, 4096, &n) != G4_OK) return 0;
    return n;
}

/* generate --chat and chat render the checkpoint's template: the first prompt is
   apply_chat_template's, later turns feed only what the template writes after
   the model's answer; for an answer without thoughts that equals re-rendering. */
static void test_chat_integration(void) {
    char args[2000], json[1000];
    const char *model = P(g_data, "tiny/e2b_like");
    char dir[700];
    int st;
    g4_template t;
    g4_template_options o = g4_template_options_init();
    int32_t *full = NULL, *first = NULL;
    size_t nf = 0, n1 = 0, na, nd;
    const char *answer = "Fine, thanks.", *delta = "<turn|>\n<|turn>user\nAnd again?<turn|>\n<|turn>model\n";
    char modeldir[700];
    snprintf(modeldir, sizeof modeldir, "%s", model);
    snprintf(dir, sizeof dir, "%s", P(g_data, "templates/e2b"));
    if (!g_have_tok) { CHECK(0, "no tokenizer (its load failed: above)"); return; }
    /* generate --chat: the prompt is the template's (checked against transformers by the goldens above) */
    snprintf(args, sizeof args, "generate %s --tokenizer %s --chat --system 'Be careful.' --think --prompt 'Solve x+1=2' --temp 0 --max-tokens 3",
             modeldir, dir);
    st = run_cli(g_cli, args, g_out, sizeof g_out, NULL, g_err, sizeof g_err);
    CHECK(st == 0, "%s: exit %d: %s", args, st, g_err);
    check_clean_stderr(args, g_err, 0);
    {
        const char *cj = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be careful.\"},{\"role\":\"user\",\"content\":\"Solve x+1=2\"}]}";
        if (parse_file_template(&t, "e2b/chat_template.jinja")) {
            g4_template_set_tokens(&t, &g_tok);
            o.enable_thinking = 1;
            CHECK(g4_template_encode(&t, &g_tok, cj, strlen(cj), &o, &first, &n1, NULL) == G4_OK, "%s", t.error);
            CHECK(prompt_count(g_err, 0) == (long)n1, "generate --chat fed %ld prompt ids, the template gives %lu: %s",
                  prompt_count(g_err, 0), (unsigned long)n1, g_err);
            g4_template_free_output(first);
            first = NULL;
            g4_template_free(&t);
        }
    }
    /* chat: two turns */
    snprintf(args, sizeof args, "chat %s --tokenizer %s --temp 0 --max-tokens 5 < %s", modeldir, dir, P(g_tmp, "turns.txt"));
    write_file(P(g_tmp, "turns.txt"), "Hello!\nAnd again?\n", 18);
    st = run_cli(g_cli, args, g_out, sizeof g_out, NULL, g_err, sizeof g_err);
    CHECK(st == 0, "%s: exit %d: %s", args, st, g_err);
    check_clean_stderr(args, g_err, 0);
    CHECK(strstr(g_err, "chat layout: ") && strstr(g_err, "chat_template.jinja"), "chat names its template: %s", g_err);
    snprintf(json, sizeof json, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}");
    if (!parse_file_template(&t, "e2b/chat_template.jinja")) return;
    g4_template_set_tokens(&t, &g_tok);
    o = g4_template_options_init();
    CHECK(g4_template_encode(&t, &g_tok, json, strlen(json), &o, &first, &n1, NULL) == G4_OK, "%s", t.error);
    CHECK(prompt_count(g_err, 0) == (long)n1, "turn 1 fed %ld ids, want %lu: %s", prompt_count(g_err, 0), (unsigned long)n1, g_err);
    nd = count_ids(delta);
    CHECK(prompt_count(g_err, 1) == (long)nd, "turn 2 fed %ld ids, want the %lu of \"<turn|>\\n<|turn>user\\nAnd again?<turn|>\\n<|turn>model\\n\": %s",
          prompt_count(g_err, 1), (unsigned long)nd, g_err);
    /* turn 1 + a thought-free answer + turn 2 = the template on the whole conversation */
    snprintf(json, sizeof json, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"},{\"role\":\"assistant\",\"content\":\"%s\"},"
             "{\"role\":\"user\",\"content\":\"And again?\"}]}", answer);
    CHECK(g4_template_encode(&t, &g_tok, json, strlen(json), &o, &full, &nf, NULL) == G4_OK, "%s", t.error);
    na = count_ids(answer);
    CHECK(nf == n1 + na + nd, "re-rendered %lu ids, fed %lu + %lu + %lu", (unsigned long)nf, (unsigned long)n1,
          (unsigned long)na, (unsigned long)nd);
    if (nf == n1 + na + nd) {
        int32_t tail[4096];
        size_t k, m = 0;
        CHECK(memcmp(full, first, n1 * sizeof(int32_t)) == 0, "turn 1 is a prefix of the whole");
        g4_tokenize(&g_tok, answer, strlen(answer), 0, tail, 4096, &m);
        g4_tokenize(&g_tok, delta, strlen(delta), 0, tail + m, 4096 - m, &k);
        CHECK(memcmp(full + n1, tail, (na + nd) * sizeof(int32_t)) == 0, "answer + turn 2 are the rest of the whole");
    }
    g4_template_free_output(full);
    g4_template_free_output(first);
    g4_template_free(&t);
    /* info says which layout a model directory uses */
    snprintf(args, sizeof args, "info %s", modeldir);
    st = run_cli(g_cli, args, g_out, sizeof g_out, NULL, g_err, sizeof g_err);
    CHECK(st == 0 && strstr(g_out, "chat template: none; generate --chat and chat use the built-in Gemma 4 layout"),
          "info: %s", g_out);
}

/* g4_template_continue: what a chat loop that keeps the K/V feeds for a new user turn, the text after the
   last G4_TEMPLATE_ANSWER. On the e2b template it is the answer turn's closure, the new user turn and the
   generation prompt, the same ids as the tail of the whole conversation re-rendered with a real answer;
   without a marker in the rendered text it is an error naming the template. */
static void test_continue(void) {
    /* G4_TEMPLATE_ANSWER as a JSON string */
#define MARK "\"\\u001bg4-answer\\u001b\""
    const char *cj = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
                     "{\"role\":\"assistant\",\"content\":" MARK "},{\"role\":\"user\",\"content\":\"Hello!\"},"
                     "{\"role\":\"assistant\",\"content\":" MARK "},{\"role\":\"user\",\"content\":\"And again?\"}]}";
    const char *whole = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
                        "{\"role\":\"assistant\",\"content\":\"Yes.\"},{\"role\":\"user\",\"content\":\"Hello!\"},"
                        "{\"role\":\"assistant\",\"content\":\"Fine, thanks.\"},{\"role\":\"user\",\"content\":\"And again?\"}]}";
    const char *upto = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
                       "{\"role\":\"assistant\",\"content\":\"Yes.\"},{\"role\":\"user\",\"content\":\"Hello!\"}]}";
    const char *none = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    const char *delta = "<turn|>\n<|turn>user\nAnd again?<turn|>\n<|turn>model\n";
    g4_template t, plain;
    g4_template_options o = g4_template_options_init();
    int32_t *ids = NULL, *all = NULL, *head = NULL, want[256];
    size_t n = 0, na = 0, nh = 0, nw = 0, nans;
    char err[G4_ERROR_MAX];
    if (!g_have_tok) { CHECK(0, "no tokenizer (its load failed: above)"); return; }
    if (!parse_file_template(&t, "e2b/chat_template.jinja")) return;
    g4_template_set_tokens(&t, &g_tok);
    CHECK(g4_template_continue(&t, &g_tok, cj, strlen(cj), &o, &ids, &n, err) == G4_OK, "%s", err);
    CHECK(g4_tokenize(&g_tok, delta, strlen(delta), 0, want, 256, &nw) == G4_OK, "tokenize");
    CHECK(n == nw && ids && memcmp(ids, want, n * sizeof(int32_t)) == 0, "continue gave %lu ids, want the %lu of \"%s\"",
          (unsigned long)n, (unsigned long)nw, delta);
    /* = the whole conversation's tail after the rendered first turns and the real answer */
    nans = count_ids("Fine, thanks.");
    CHECK(g4_template_encode(&t, &g_tok, whole, strlen(whole), &o, &all, &na, err) == G4_OK, "%s", err);
    o.add_generation_prompt = 1;
    CHECK(g4_template_encode(&t, &g_tok, upto, strlen(upto), &o, &head, &nh, err) == G4_OK, "%s", err);
    CHECK(all && head && na == nh + nans + n && memcmp(all, head, nh * sizeof(int32_t)) == 0 &&
              memcmp(all + nh + nans, ids, n * sizeof(int32_t)) == 0,
          "the whole conversation (%lu ids) is not turns 1-2 (%lu) + the answer (%lu) + the continuation (%lu)",
          (unsigned long)na, (unsigned long)nh, (unsigned long)nans, (unsigned long)n);
    g4_template_free_output(ids);
    g4_template_free_output(all);
    g4_template_free_output(head);
    /* no marker: a conversation without answers, a template that does not write them */
    ids = NULL;
    CHECK(g4_template_continue(&t, &g_tok, none, strlen(none), &o, &ids, &n, err) == G4_ERR_INPUT &&
              strstr(err, "holds no model answer") && strstr(err, "chat_template.jinja") && !ids && n == 0,
          "no answer: %s", err);
    const char *roles = "{% for m in messages %}<{{ m.role }}>{% endfor %}";
    if (g4_template_parse(&plain, roles, strlen(roles), "roles.jinja") == G4_OK) {
        CHECK(g4_template_continue(&plain, &g_tok, cj, strlen(cj), &o, &ids, &n, err) == G4_ERR_INPUT &&
                  strstr(err, "roles.jinja: the rendered conversation holds no model answer"), "roles only: %s", err);
        g4_template_free(&plain);
    } else CHECK(0, "parse: %s", plain.error);
    CHECK(g4_template_continue(&t, NULL, cj, strlen(cj), &o, &ids, &n, err) == G4_ERR_INPUT && strstr(err, "NULL"),
          "NULL tokenizer: %s", err);
    g4_template_free(&t);
#undef MARK
}

int main(int argc, char **argv) {
    if (argc > 1) g_data = argv[1];
    if (argc > 2) g_cli = argv[2];
    snprintf(g_tmp, sizeof g_tmp, "/tmp/g4_template_test.%d", (int)getpid());
    {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", g_tmp);
        if (system(cmd) != 0) { printf("cannot create %s\n", g_tmp); return 1; }
    }
    g_have_tok = g4_tokenizer_load(&g_tok, P(g_data, "tokenizer/tokenizer.json")) == G4_OK;
    if (!g_have_tok) { /* a committed fixture: a load error is a failure (and the tests that need it fail too) */
        begin("template: the tokenizer (%s/tokenizer/tokenizer.json) loads", g_data);
        CHECK(0, "%s", g_tok.error);
        end();
    }
    test_goldens();
    run("template: where it comes from", test_load);
    test_bad_messages();
    test_limits();
    test_cli_bad();
    run("template: generate --chat, chat and info", test_chat_integration);
    run("template: g4_template_continue = the tail after the last answer; no answer is an error", test_continue);
    if (g_have_tok) g4_tokenizer_free(&g_tok);
    remove_tree(g_tmp);
    return finish();
}
