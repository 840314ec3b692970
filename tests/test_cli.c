/* The command line as a daily tool (examples/gemma4.c): help and errors that
   name the flag, the value and the rule; --threads on every command that runs
   the model, with the same bits for any N; paths named with the reason; exit
   statuses; synth's --out; the seed from the OS; progress on a terminal; the
   stats line on its own line; weights files of the wrong size; make bench's
   smoke form and bench/peers_check.py's bar. The tiny models (data/tiny)
   and data/tokenizer are the inputs; nothing here is a timing.

       build/test_cli [DATA_DIR [CLI]]     (defaults: data build/gemma4)

   Each case prints "ok - ..." or "not ok - ..."; the last line is
   "N passed, M failed" (", K skipped" when `script` or python3 is missing). */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#include "../gemma4.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *g_data = "data", *g_cli = "build/gemma4";
static char g_tmp[256];

#define H_CLI_OUTPUT /* g_out, g_err, h_run */
#include "harness.h"


/* `CLI args`, or a whole shell line (pipes, redirections): the status; stdout in g_out, stderr in g_err */
#define cli(...) h_run(g_cli, __VA_ARGS__)
#define sh(...) h_run(NULL, __VA_ARGS__)

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (; (s = strstr(s, needle)) != NULL; s += strlen(needle)) n++;
    return n;
}

static const char *tiny(const char *name) { /* (16 rotating buffers: copy one to keep it) */
    static char buf[16][400];
    static int k;
    k = (k + 1) % 16;
    snprintf(buf[k], sizeof buf[k], "%s/tiny/%s", g_data, name);
    return buf[k];
}

/* the whole file, or NULL (free) */
static char *slurp(const char *path, size_t *len) {
    char *text, err[G4_ERROR_MAX];
    if (g4__read_file(path, &text, len, (size_t)1 << 28, err) != G4_OK) return NULL;
    return text;
}

static int same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = slurp(a, &la), *y = slurp(b, &lb);
    int same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

/* Exit 1 and one line on stderr holding `needle`, nothing on stdout. */
static void bad(const char *needle, const char *fmt, ...) G4__PRINTF(2, 3);
static void bad(const char *needle, const char *fmt, ...) {
    char args[4096];
    int st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    st = h_clean(run_cli(g_cli, args, g_out, sizeof g_out, NULL, g_err, sizeof g_err), args);
    CHECK(st == 1, "%s: exit %d, want 1; stderr: %s", args, st, g_err);
    CHECK(count_lines(g_err) == 1 && strstr(g_err, needle), "%s: stderr \"%s\" is not one line holding \"%s\"", args, g_err,
          needle);
}

/* ------------------------------------------------------------- help */

static void test_help(void) {
    int st;
    st = cli("help");
    CHECK(st == 0 && strstr(g_out, "generate") && strstr(g_out, "synth") && !g_err[0], "help: exit %d, stdout %.200s", st,
          g_out);
    st = cli("--help");
    CHECK(st == 0 && strstr(g_out, "generate") && !g_err[0], "--help: exit %d, stderr %s", st, g_err);
    st = cli("help generate");
    CHECK(st == 0 && strstr(g_out, "usage: gemma4 generate") && strstr(g_out, "--top-p P") &&
              strstr(g_out, "must be in (0, 1]") && strstr(g_out, "--threads N") && !g_err[0],
          "help generate: exit %d, stdout %.300s", st, g_out);
    st = cli("generate --help");
    CHECK(st == 0 && strstr(g_out, "usage: gemma4 generate") && !g_err[0], "generate --help: exit %d, %s", st, g_err);
    st = cli("logits %s -h", tiny("e2b_like"));
    CHECK(st == 0 && strstr(g_out, "--ids") && !g_err[0], "logits -h: exit %d, %s", st, g_err);
    st = run_cli(g_cli, "", g_out, sizeof g_out, NULL, g_err, sizeof g_err);
    CHECK(st == 1 && strstr(g_err, "usage: gemma4 COMMAND") && !g_out[0], "no command: exit %d", st);
}

static void test_unknown(void) {
    bad("unknown command 'frob'", "frob %s", tiny("e2b_like"));
    bad("unknown command 'frob'", "help frob");
    bad("unknown option --bogus", "logits %s --ids 2 --out %s/x.bin --bogus", tiny("e2b_like"), g_tmp);
    bad("unknown option --new", "generate %s --prompt x --new 5", tiny("e2b_like"));
    bad("unexpected argument 'extra'", "info %s extra", tiny("e2b_like"));
}

/* Every flag's bad value is named with the value and the rule. */
static void test_bad_values(void) {
    static const struct { const char *args, *needle; } cases[] = {
        {"greedy D --ids 2 --new -5", "--new -5: must be an integer >= 0"},
        {"greedy D --ids 2 --new abc", "--new abc: must be an integer >= 0"},
        {"greedy D --ids 2 --new 99999999999", "--new 99999999999: must be an integer >= 0"},
        {"greedy D --ids 2 --new ''", "--new '': must be an integer >= 0"},
        {"greedy D --ids 2 --new 1 --draft-tokens 0 --drafter D", "--draft-tokens 0: must be an integer in [1, 1024]"},
        {"greedy D --ids 2 --new 1 --draft-tokens 3", "--draft-tokens needs --drafter"},
        {"generate D --prompt x --top-k -3", "--top-k -3: must be an integer >= 0"},
        {"generate D --prompt x --temp nan", "--temp nan: must be a number >= 0"},
        {"generate D --prompt x --temp inf", "--temp inf: must be a number >= 0"},
        {"generate D --prompt x --temp -1", "--temp -1: must be a number >= 0"},
        {"generate D --prompt x --top-p 1.5", "--top-p 1.5: must be in (0, 1]"},
        {"generate D --prompt x --top-p 0", "--top-p 0: must be in (0, 1]"},
        {"generate D --prompt x --min-p 2", "--min-p 2: must be in [0, 1]"},
        {"generate D --prompt x --repeat-penalty 0", "--repeat-penalty 0: must be a number > 0"},
        {"generate D --prompt x --max-tokens -1", "--max-tokens -1: must be an integer >= 0"},
        {"generate D --prompt x --ctx 100000000000", "--ctx 100000000000: must be an integer >= 1"},
        {"generate D --prompt x --seed -1", "--seed -1: must be an integer in [0, 18446744073709551615]"},
        {"generate D --prompt x --seed 18446744073709551616", "--seed 18446744073709551616: must be an integer"},
        {"generate D --prompt x --temp 1x", "--temp 1x: must be a number >= 0"},
        {"generate D --prompt x --system s", "--system needs --chat"},
        {"generate D --prompt x --temp", "--temp needs a value (T)"},
        {"generate D", "--prompt TEXT is required"},
        {"chat D --prompt x", "unknown option --prompt"},
        {"chat D --top-p 1.01", "gemma4 chat: --top-p 1.01: must be in (0, 1]"},
        {"logits D --ids 2 --out X --chunk 0", "--chunk 0: must be an integer >= 1"},
        {"logits D --ids 2 --out X --threads 0", "--threads 0: must be an integer in [1, 4096]"},
        {"logits D --ids 2 --out X --threads -2", "--threads -2: must be an integer in [1, 4096]"},
        {"logits D --ids 2 --out X --bf16 --bf16", "--bf16 given twice"},
        {"logits D --ids 2", "--out FILE is required"},
        {"logits --ids 2 --out X", "missing DIR"},
        {"compare D X --tolerance -1", "--tolerance -1: must be a number >= 0"},
        {"compare D X --tolerance nan", "--tolerance nan: must be a number >= 0"},
        {"compare D X --f32 --bf16", "--f32 and --bf16 exclude each other"},
        {"draft D --drafter D --ids 2 --steps 0 --out X", "--steps 0: must be an integer in [1, 1024]"},
        {"grad D --ids 2,3 --out X --threads x", "--threads x: must be an integer in [1, 4096]"},
        {"bench D --gen 0", "--gen 0: must be an integer >= 1"},
        {"synth --config C --out X --dtype f8", "--dtype f8: must be one of bf16 f32"},
        {"synth --config C --out X --layers -1", "--layers -1: must be an integer >= 1"},
        {"info D --train 1", "--train 1: must be an integer >= 2"},
        {"template D --messages", "--messages needs a value (FILE.json)"},
    };
    size_t k;
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char args[1024], *p = args;
        const char *a;
        for (a = cases[k].args; *a && p < args + sizeof args - 300; a++) { /* D: the tiny model, X: a file, C: a config */
            if (*a == 'D' && (a[1] == ' ' || !a[1]) && a[-1] == ' ') p += sprintf(p, "%s", tiny("e2b_like"));
            else if (*a == 'X' && (a[1] == ' ' || !a[1]) && a[-1] == ' ') p += sprintf(p, "%s/x.bin", g_tmp);
            else if (*a == 'C' && (a[1] == ' ' || !a[1]) && a[-1] == ' ') p += sprintf(p, "%s/config.json", tiny("e2b_like"));
            else *p++ = *a;
        }
        *p = 0;
        bad(cases[k].needle, "%s", args);
    }
}

/* ---------------------------------------------------------- threads */

/* Every command that runs the model takes --threads, and 1, 2 and 3 threads
   write the same bytes. */
static void test_threads(void) {
    char d[400];
    char a[3][600], b[600];
    int t, st;
    snprintf(d, sizeof d, "%s", tiny("e2b_like"));
    static char outs[3][sizeof g_out];
    for (t = 1; t <= 3; t++) { /* logits: the float32 file byte for byte */
        snprintf(a[t - 1], sizeof a[t - 1], "%s/logits%d.bin", g_tmp, t);
        st = cli("logits %s --ids 2,81,101,77,5,9,300,12 --out %s --threads %d", d, a[t - 1], t);
        CHECK(st == 0, "logits --threads %d: exit %d: %s", t, st, g_err);
    }
    CHECK(same_file(a[0], a[1]) && same_file(a[0], a[2]), "logits at 1, 2, 3 threads differ");
    for (t = 1; t <= 3; t++) { /* grad: the loss and every gradient, byte for byte */
        snprintf(a[t - 1], sizeof a[t - 1], "%s/grad%d.st", g_tmp, t);
        st = cli("grad %s --ids 2,81,101,77,5,9 --out %s --threads %d", d, a[t - 1], t);
        CHECK(st == 0, "grad --threads %d: exit %d: %s", t, st, g_err);
    }
    CHECK(same_file(a[0], a[1]) && same_file(a[0], a[2]), "grad at 1, 2, 3 threads differ");
    for (t = 1; t <= 3; t++) { /* draft: the drafter's logits */
        snprintf(a[t - 1], sizeof a[t - 1], "%s/draft%d.bin", g_tmp, t);
        st = cli("draft %s --drafter %s --ids 2,18,101,5 --steps 3 --out %s --threads %d", d, tiny("e2b_drafter"), a[t - 1], t);
        CHECK(st == 0, "draft --threads %d: exit %d: %s", t, st, g_err);
    }
    CHECK(same_file(a[0], a[1]) && same_file(a[0], a[2]), "draft at 1, 2, 3 threads differ");
    for (t = 1; t <= 3; t++) { /* image: the soft tokens of the vision tower */
        snprintf(a[t - 1], sizeof a[t - 1], "%s/soft%d.bin", g_tmp, t);
        st = cli("image %s/vision/e2b_mm %s/vision/images/a.png --processor %s/vision/processor --out %s --threads %d", g_data,
                 g_data, g_data, a[t - 1], t);
        CHECK(st == 0, "image --threads %d: exit %d: %s", t, st, g_err);
    }
    CHECK(same_file(a[0], a[1]) && same_file(a[0], a[2]), "image at 1, 2, 3 threads differ");
    /* stdout of greedy (with and without a drafter), generate, chat and compare */
    {
        char cmds[4][900];
        int c;
        snprintf(cmds[0], sizeof cmds[0], "greedy %s --ids 2,81,101,77,5 --new 12", d);
        snprintf(cmds[1], sizeof cmds[1], "greedy %s --ids 2,81,101,77,5 --new 12 --drafter %s --draft-tokens 3", d, tiny("e2b_drafter"));
        snprintf(cmds[2], sizeof cmds[2], "generate %s --tokenizer %s/tokenizer --prompt 'The sea' --seed 7 --max-tokens 12", d, g_data);
        snprintf(cmds[3], sizeof cmds[3], "compare %s %s/dumps/e2b_like_f32.safetensors", d, g_data);
        for (c = 0; c < 4; c++) {
            for (t = 1; t <= 3; t++) {
                st = cli("%s --threads %d", cmds[c], t);
                CHECK(st == 0, "%s --threads %d: exit %d: %s", cmds[c], t, st, g_err);
                snprintf(outs[t - 1], sizeof outs[t - 1], "%s", g_out);
            }
            CHECK(strlen(outs[0]) > 2 && strcmp(outs[0], outs[1]) == 0 && strcmp(outs[0], outs[2]) == 0,
                  "%s: stdout at 1, 2, 3 threads: '%s', '%s', '%s'", cmds[c], outs[0], outs[1], outs[2]);
        }
        for (t = 1; t <= 3; t++) {
            st = sh("printf 'Hello!\\nAnd again?\\n' | %s chat %s --tokenizer %s/tokenizer --seed 5 --max-tokens 6 --threads %d",
                    g_cli, d, g_data, t);
            CHECK(st == 0, "chat --threads %d: exit %d: %s", t, st, g_err);
            snprintf(outs[t - 1], sizeof outs[t - 1], "%s", g_out);
        }
        CHECK(strlen(outs[0]) > 2 && strcmp(outs[0], outs[1]) == 0 && strcmp(outs[0], outs[2]) == 0,
              "chat at 1, 2, 3 threads: '%s', '%s', '%s'", outs[0], outs[1], outs[2]);
    }
    st = cli("bench %s --prompt 3 --gen 1 --threads 2", d); /* (bench's own speed lines differ run to run) */
    CHECK(st == 0 && strstr(g_out, "2 threads"), "bench --threads 2: exit %d: %s", st, g_err);
    st = cli("bench %s --grad --prompt 4 --threads 3", d);
    CHECK(st == 0 && strstr(g_out, "3 threads"), "bench --grad --threads 3: exit %d: %s", st, g_err);
    /* a prefill longer than one chunk goes in chunks (to show progress): the same token as logits' argmax */
    snprintf(b, sizeof b, "%s/long.bin", g_tmp);
    {
        char ids[1200];
        int i, n = 0;
        for (i = 0; i < 100; i++) n += snprintf(ids + n, sizeof ids - (size_t)n, "%s%d", i ? "," : "", (i * 37 + 2) % 500);
        st = cli("logits %s --ids %s --out %s", d, ids, b);
        CHECK(st == 0, "logits of 100 ids: %s", g_err);
        {
            const char *last = strrchr(g_out, '\n'), *p;
            char want[32] = "";
            /* argmax: ... K\nwrote ...: the last argmax is the word before "\nwrote" */
            p = strstr(g_out, "\nwrote");
            if (p) {
                const char *q = p;
                while (q > g_out && q[-1] != ' ') q--;
                snprintf(want, sizeof want, "%.*s", (int)(p - q), q);
            }
            (void)last;
            st = cli("greedy %s --ids %s --new 1 --chunk 16", d, ids);
            p = g_out + strlen(g_out);
            while (p > g_out && (p[-1] == '\n')) p--;
            {
                const char *q = p;
                while (q > g_out && q[-1] != ' ') q--;
                CHECK(st == 0 && want[0] && (size_t)(p - q) == strlen(want) && strncmp(q, want, strlen(want)) == 0,
                      "greedy after a chunked prefill chose '%.*s', logits' argmax '%s'", (int)(p - q), q, want);
            }
        }
    }
}

/* ------------------------------------------------------------ paths */

static void test_paths(void) {
    char dir[400], path[600];
    bad("nope/config.json: cannot open (No such file or directory)", "logits %s/nope --ids 1 --out %s/x.bin", g_tmp, g_tmp);
    bad("nope.json: cannot open (No such file or directory)", "info %s/nope.json", g_tmp);
    bad("cannot write (No such file or directory)", "logits %s --ids 1 --out %s/no/such/dir/x.bin", tiny("e2b_like"), g_tmp);
    bad("cannot write (No such file or directory)", "grad %s --ids 2,3 --out %s/no/such/dir/x", tiny("e2b_like"), g_tmp);
    bad("none.json: cannot open for reading (No such file or directory)", "template %s/templates/e2b --messages %s/none.json",
        g_data, g_tmp);
    /* a model directory without tokenizer.json: which file, where, and what to pass */
    bad("no tokenizer.json in", "generate %s --prompt hi", tiny("e2b_like"));
    CHECK(strstr(g_err, "e2b_like/tokenizer.json") && strstr(g_err, "--tokenizer"), "generate: %s", g_err);
    bad("no tokenizer.json in", "tokenize %s hi", tiny("e2b_like"));
    bad("no tokenizer.json in", "template %s --messages %s/templates/example.json", tiny("e2b_like"), g_data);
    bad("give --tokenizer a tokenizer.json", "generate %s --prompt hi --tokenizer %s", tiny("e2b_like"), tiny("plain"));
    CHECK(sh("echo hi | %s chat %s", g_cli, tiny("e2b_like")) == 1 && strstr(g_err, "no tokenizer.json in") &&
              strstr(g_err, "--tokenizer"), "chat: %s", g_err);
    /* a directory with a tokenizer but no chat template: both places named */
    snprintf(dir, sizeof dir, "%s/tok_only", g_tmp);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "cp %s/tokenizer/tokenizer.json %s/", g_data, dir);
    CHECK(system(path) == 0, "%s", path);
    bad("no chat template in", "template %s --messages %s/templates/example.json", dir, g_data);
    CHECK(strstr(g_err, "tok_only/chat_template.jinja") && strstr(g_err, "tok_only/tokenizer_config.json"), "%s", g_err);
}

/* ---------------------------------------------------------- statuses */

static void test_status(void) {
    char d[400];
    int st;
    snprintf(d, sizeof d, "%s", tiny("e2b_like"));
    /* generate: a context that fills before --max-tokens is an error */
    st = cli("generate %s --tokenizer %s/tokenizer --prompt 'The sea' --seed 7 --max-tokens 12 --ctx 10", d, g_data);
    CHECK(st == 1 && strstr(g_err, "context full after 6 generated tokens"), "generate --ctx 10: exit %d: %s", st, g_err);
    st = cli("generate %s --tokenizer %s/tokenizer --prompt 'The sea' --seed 7 --max-tokens 5 --ctx 10", d, g_data);
    CHECK(st == 0 && !strstr(g_err, "context full"), "generate --max-tokens 5 --ctx 10: exit %d: %s", st, g_err);
    /* chat: a turn that does not fit an empty context is an error, said as such */
    st = sh("printf 'Hello there\\nAnd again?\\n' | %s chat %s --tokenizer %s/tokenizer --ctx 5 --seed 3", g_cli, d, g_data);
    CHECK(st == 1 && strstr(g_err, "do not fit the context of 5 positions") && !strstr(g_err, "0 of 5 positions used"),
          "chat --ctx 5: exit %d: %s", st, g_err);
    /* chat: each answer cut by a full context starts over, said once */
    st = sh("printf 'Hi\\nAnd again?\\nmore\\n' | %s chat %s --tokenizer %s/tokenizer --ctx 24 --seed 7", g_cli, d, g_data);
    CHECK(st == 0 && count_of(g_err, "context full") == 3 && count_of(g_err, "the next turn starts over") == 3,
          "chat --ctx 24, three cut answers: exit %d: %s", st, g_err);
    /* a turn that does not fit what is left starts over once */
    st = sh("printf 'Hi\\nAnd again and again and again?\\n' | %s chat %s --tokenizer %s/tokenizer --ctx 40 --seed 7 "
            "--max-tokens 3", g_cli, d, g_data);
    CHECK(st == 0 && count_of(g_err, "context full") == 1 && count_of(g_err, "starting over") == 1, "chat --ctx 40: exit %d: %s",
          st, g_err);
    /* --ctx past max_position_embeddings (128 here): a warning that says why, and the run goes on */
    st = cli("generate %s --tokenizer %s/tokenizer --prompt 'The sea' --seed 7 --max-tokens 3 --ctx 200", d, g_data);
    CHECK(st == 0 && strstr(g_err, "warning: --ctx 200 is past the model's max_position_embeddings 128"), "--ctx 200: exit %d: %s",
          st, g_err);
    /* compare's tolerance: refused below 0 on a dump that passes at the default, taken when 0 (exit 2) */
    bad("--tolerance -1: must be a number >= 0", "compare %s %s/dumps/e2b_like_f32.safetensors --tolerance -1", d, g_data);
    st = cli("compare %s %s/dumps/e2b_like_f32.safetensors", d, g_data);
    CHECK(st == 0, "compare at the default tolerance: exit %d", st);
    st = cli("compare %s %s/dumps/e2b_like_f32.safetensors --tolerance 0", d, g_data);
    CHECK(st == 2, "compare --tolerance 0: exit %d", st);
}

/* ------------------------------------------------------------- synth */

static void test_synth(void) {
    char out[400], path[600];
    int st;
    snprintf(out, sizeof out, "%s/synth", g_tmp);
    st = cli("synth --config %s/config.json --out %s --dtype f32", tiny("e2b_like"), out);
    CHECK(st == 0, "synth into a new directory: exit %d: %s", st, g_err);
    /* a stale shard index in --out: refused without --force, removed with it (the model then loads) */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    {
        FILE *f = fopen(path, "w");
        if (f) { fputs("{\"weight_map\": {}}", f); fclose(f); }
    }
    bad("is not empty", "synth --config %s/config.json --out %s", tiny("e2b_like"), out);
    CHECK(strstr(g_err, "--force"), "says what to pass: %s", g_err);
    CHECK(access(path, F_OK) == 0, "the refused synth removed %s", path);
    st = cli("synth --config %s/config.json --out %s --force", tiny("e2b_like"), out);
    CHECK(st == 0 && access(path, F_OK) != 0, "synth --force: exit %d, index left: %d", st, access(path, F_OK) == 0);
    st = cli("logits %s --ids 2,3 --out %s/x.bin", out, g_tmp);
    CHECK(st == 0, "the forced checkpoint loads: %s", g_err);
    snprintf(path, sizeof path, "%s/x.bin", g_tmp);
    bad("exists and is not a directory", "synth --config %s/config.json --out %s", tiny("e2b_like"), path);
}

/* ------------------------------------------------------------- seeds */

static void test_seed(void) {
    unsigned long long s[3] = {0, 0, 0};
    int k, st;
    for (k = 0; k < 3; k++) {
        const char *p;
        st = cli("generate %s --tokenizer %s/tokenizer --prompt 'The sea' --max-tokens 1", tiny("e2b_like"), g_data);
        p = strstr(g_err, "seed ");
        CHECK(st == 0 && p, "generate without --seed prints no seed: exit %d: %s", st, g_err);
        if (p) s[k] = strtoull(p + 5, NULL, 10);
    }
    CHECK(s[0] != s[1] && s[1] != s[2] && s[0] != s[2], "three runs, seeds %llu %llu %llu: not from the OS", s[0], s[1], s[2]);
}

/* ------------------------------------------------- terminal and logs */

static void test_tty(void) {
    char d[400];
    int st;
    char ids[1200];
    int i, n = 0;
    snprintf(d, sizeof d, "%s", tiny("e2b_like"));
    /* the stats line on a line of its own in one redirected log (stdout and stderr together) */
    st = sh("%s generate %s --tokenizer %s/tokenizer --prompt 'The sea' --seed 7 --max-tokens 12 > %s/log 2>&1; cat %s/log",
            g_cli, d, g_data, g_tmp, g_tmp);
    {
        const char *p = strstr(g_out, "prompt 5 tokens");
        CHECK(st == 0 && p && (p == g_out || p[-1] == '\n'), "the stats line does not start a line: '%s'", g_out);
    }
    if (system("command -v script > /dev/null 2>&1") != 0) { skip("no `script` (util-linux) to give the CLI a terminal"); return; }
    /* on a terminal: progress for loading, synth, grad and a long prefill */
    st = sh("script -qec '%s logits %s --ids 2,3 --out %s/x.bin' /dev/null < /dev/null", g_cli, d, g_tmp);
    CHECK(st == 0 && strstr(g_out, "loading ") && strstr(g_out, "(100%)"), "logits on a terminal: exit %d: %s", st, g_out);
    st = sh("script -qec '%s synth --config %s/config.json --out %s/synth_tty' /dev/null < /dev/null", g_cli, d, g_tmp);
    CHECK(st == 0 && strstr(g_out, "synth: ") && strstr(g_out, "GB written (100%)"), "synth on a terminal: exit %d: %s", st, g_out);
    st = sh("script -qec '%s grad %s --ids 2,3,4 --out %s/g.st' /dev/null < /dev/null", g_cli, d, g_tmp);
    CHECK(st == 0 && strstr(g_out, "grad: forward layer 10 / 10") && strstr(g_out, "grad: backward layer 10 / 10"),
          "grad on a terminal: exit %d: %s", st, g_out);
    for (i = 0; i < 100; i++) n += snprintf(ids + n, sizeof ids - (size_t)n, "%s%d", i ? "," : "", (i * 37 + 2) % 500);
    st = sh("script -qec '%s greedy %s --ids %s --new 1' /dev/null < /dev/null", g_cli, d, ids);
    CHECK(st == 0 && strstr(g_out, "prefill: 64 / 100 tokens") && strstr(g_out, "prefill: 100 / 100 tokens"),
          "a 100-token prefill on a terminal: exit %d: %.300s", st, g_out);
    /* and none of it in a log */
    st = cli("greedy %s --ids %s --new 1", d, ids);
    CHECK(st == 0 && !g_err[0], "greedy in a log wrote to stderr: %s", g_err);
    st = cli("grad %s --ids 2,3,4 --out %s/g.st", d, g_tmp);
    CHECK(st == 0 && !g_err[0], "grad in a log wrote to stderr: %s", g_err);
}

/* ------------------------------------------------------ weights files */

static void test_weights_size(void) {
    char dir[400], cmd[1200];
    size_t len;
    char *w;
    int st;
    snprintf(dir, sizeof dir, "%s/cut", g_tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/", dir, tiny("plain"), dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    snprintf(cmd, sizeof cmd, "%s/model.safetensors", tiny("plain"));
    if (!(w = slurp(cmd, &len))) { CHECK(0, "cannot read %s", cmd); return; }
    snprintf(cmd, sizeof cmd, "%s/model.safetensors", dir);
    { /* half the file: truncated, with both sizes */
        FILE *f = fopen(cmd, "wb");
        char want[200];
        if (f) { fwrite(w, 1, len / 2, f); fclose(f); }
        snprintf(want, sizeof want, "model.safetensors: truncated: the file has %lu bytes, its header describes %lu",
                 (unsigned long)(len / 2), (unsigned long)len);
        bad(want, "logits %s --ids 2 --out %s/x.bin", dir, g_tmp);
    }
    { /* 16 bytes more */
        FILE *f = fopen(cmd, "wb");
        char want[200];
        if (f) { fwrite(w, 1, len, f); fwrite(w, 1, 16, f); fclose(f); }
        snprintf(want, sizeof want, "model.safetensors: longer than its header describes: the file has %lu bytes, its header "
                 "describes %lu", (unsigned long)(len + 16), (unsigned long)len);
        bad(want, "logits %s --ids 2 --out %s/x.bin", dir, g_tmp);
    }
    free(w);
    /* info on a weights file says what it is */
    bad("is a weights file (safetensors); give its model directory or its config.json", "info %s/model.safetensors",
        tiny("plain"));
    st = cli("info %s", tiny("plain"));
    CHECK(st == 0, "info on the directory: %s", g_err);
}

/* ----------------------------------------------------------- bench */

/* make bench's script on a tiny model (what `make bench-smoke` runs): it must exit 0 and print its table. */
static void test_bench_smoke(void) {
    int st;
    if (access("bench/run.sh", R_OK) != 0 || access("build/membw", X_OK) != 0 || access("build/fmapeak", X_OK) != 0) {
        skip("run from the repository root after make build/membw build/fmapeak (make bench-smoke does)");
        return;
    }
    st = sh("BENCH_CONFIG=%s/config.json BENCH_DIR=%s/bench-model THREADS=2 PROMPT=4 PROMPT2=8 GEN=2 MEMBW_MIB=16 "
            "TOWER_CONFIGS='%s/vision/e2b_mm/config.json %s/tiny/e2b_audio/config.json' TOWER_ARGS='--patches 64 --seconds 1' "
            "sh bench/run.sh", tiny("e2b_like"), g_tmp, g_data, g_data);
    CHECK(st == 0 && strstr(g_out, "cpu: ") && strstr(g_out, "machine: read bandwidth") && strstr(g_out, "prefill, 8 tokens") &&
              strstr(g_out, "prefill, 8 tokens: roofline ") && strstr(g_out, "prefill, 4 tokens: roofline ") &&
              strstr(g_out, "e2b_mm vision tower: ") && strstr(g_out, "ms per image of 16 soft tokens") &&
              strstr(g_out, "e2b_audio audio tower: ") && strstr(g_out, "ms per second of audio ("),
          "bench/run.sh: exit %d; stdout %.3000s; stderr %.500s", st, g_out, g_err);
}

/* gemma4 bench's count of the prompt's attention FLOPs ("attention N FLOP of
   these") against a closed form from the model's plan: per layer 4 H D times
   the query-key pairs, which for a prompt of n with a window w are n (n +
   1) / 2 (full), w (w + 1) / 2 + (n - w) w (sliding, n > w), and min(n, w)
   for a KV reader, whose only row is the last. e2b_like (10 layers, 4 of them
   readers, sliding window 8) at 3, 8 and 20 tokens: windows not reached,
   reached exactly and passed. */
static void test_bench_attention_flops(void) {
    static const int ns[] = {3, 8, 20};
    g4_config c;
    g4_plan p;
    char path[512];
    int k, l, st;
    snprintf(path, sizeof path, "%s/config.json", tiny("e2b_like"));
    if (g4_config_load(&c, path) != G4_OK) {
        CHECK(0, "e2b_like's config: %s", c.error);
        return;
    }
    if (g4_plan_build(&p, &c) != G4_OK) {
        CHECK(0, "e2b_like's plan: %s", p.error);
        return;
    }
    CHECK(c.sliding_window == 8 && p.first_shared > 0 && p.first_shared < c.num_hidden_layers,
          "e2b_like: window %d, readers from layer %d of %d (the test wants a window of 8 and readers)", c.sliding_window,
          p.first_shared, c.num_hidden_layers);
    for (k = 0; k < 3; k++) {
        double want = 0, got = -1, n = ns[k];
        const char *at;
        for (l = 0; l < c.num_hidden_layers; l++) {
            double w = p.layer[l].type == G4_SLIDING ? c.sliding_window : n, pairs;
            if (l >= p.first_shared) pairs = n < w ? n : w;
            else pairs = n <= w ? n * (n + 1) / 2 : w * (w + 1) / 2 + (n - w) * w;
            want += 4.0 * c.num_attention_heads * p.layer[l].head_dim * pairs;
        }
        st = cli("bench %s --prompt %d --gen 1 --threads 1", tiny("e2b_like"), ns[k]);
        at = strstr(g_out, "attention ");
        while (at && sscanf(at, "attention %lf FLOP of these", &got) != 1) at = strstr(at + 1, "attention ");
        CHECK(st == 0 && got == want, "bench --prompt %d: attention %.0f FLOP, the closed form %.0f (exit %d: %s)", ns[k], got, want,
              st, g_err);
    }
}

/* bench/peers_check.py: llama.cpp is judged against the model's own float32-to-bf16 gap */
static void write_rows(const char *path, int rows, int vocab, double noise, unsigned seed) {
    FILE *f = fopen(path, "wb");
    int r, v;
    uint64_t x = 0x9E3779B97F4A7C15ull ^ seed;
    if (!f) return;
    for (r = 0; r < rows; r++)
        for (v = 0; v < vocab; v++) {
            float base = (float)((r * 131 + v * 71) % 97) / 10.0f - 4.85f, e;
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            e = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * 2.0f * (float)noise;
            base += e;
            fwrite(&base, 4, 1, f);
        }
    fclose(f);
}

static void test_peers_check(void) {
    char cfg[400], g4[400], bf[400], ll[400], far[400];
    FILE *f;
    int st;
    if (system("python3 -c 'import sys' > /dev/null 2>&1") != 0 || access("bench/peers_check.py", R_OK) != 0) {
        skip("no python3, or not run from the repository root");
        return;
    }
    snprintf(cfg, sizeof cfg, "%s/peers_config.json", g_tmp);
    if ((f = fopen(cfg, "w")) != NULL) { fputs("{\"vocab_size\": 64}", f); fclose(f); }
    snprintf(g4, sizeof g4, "%s/p_g4.f32", g_tmp);
    snprintf(bf, sizeof bf, "%s/p_bf16.f32", g_tmp);
    snprintf(ll, sizeof ll, "%s/p_llama.f32", g_tmp);
    snprintf(far, sizeof far, "%s/p_far.f32", g_tmp);
    /* the 35-layer E2B case: the bf16 run 0.37 of the spread from float32, llama.cpp 0.32: the same model */
    write_rows(g4, 6, 64, 0.0, 1);
    write_rows(bf, 6, 64, 0.37 * 2.4 * 2, 2);   /* uniform noise in [-a, a]: mean |e| = a/2; spread of base ~2.4 */
    write_rows(ll, 6, 64, 0.32 * 2.4 * 2, 3);
    st = sh("python3 bench/peers_check.py %s %s %s %s", cfg, g4, ll, bf);
    CHECK(st == 0 && strstr(g_out, "float32-to-bf16 gap"), "llama.cpp inside the bf16 gap: exit %d: %s %s", st, g_out, g_err);
    /* another model: far past twice the gap */
    write_rows(far, 6, 64, 2.5 * 2.4 * 2, 4);
    st = sh("python3 bench/peers_check.py %s %s %s %s", cfg, g4, far, bf);
    CHECK(st != 0 && strstr(g_err, "not the same model"), "llama.cpp far outside the gap: exit %d: %s %s", st, g_out, g_err);
}

int main(int argc, char **argv) {
    if (argc > 1) g_data = argv[1];
    if (argc > 2) g_cli = argv[2];
    if (!h_tmpdir(g_tmp, sizeof g_tmp, "cli")) return 1;
    if (access(g_cli, X_OK) != 0) printf("warning: %s is not built; every check will fail\n", g_cli);
    if (argc > 3) g_only = argv[3];
    run("cli: help and --help on stdout, exit 0", test_help);
    run("cli: an unknown command, option or argument is named", test_unknown);
    run("cli: a bad value names the flag, the value and the rule", test_bad_values);
    run("cli: --threads on every command that runs the model; 1, 2, 3 threads the same bits", test_threads);
    run("cli: paths named with the reason; a missing tokenizer.json or chat template named", test_paths);
    run("cli: exit statuses; context full; --ctx past max_position_embeddings", test_status);
    run("cli: synth refuses a non-empty --out unless --force", test_synth);
    run("cli: a seed from the OS, printed", test_seed);
    run("cli: the stats line on its own line; progress on a terminal only", test_tty);
    run("cli: a truncated or oversized weights file; info on a weights file", test_weights_size);
    run("cli: bench's attention FLOPs = the closed form (windows, KV readers)", test_bench_attention_flops);
    run("cli: make bench's script exits 0 on a tiny model", test_bench_smoke);
    run("cli: bench/peers_check.py judges against the float32-to-bf16 gap", test_peers_check);
    remove_tree(g_tmp);
    return finish();
}
