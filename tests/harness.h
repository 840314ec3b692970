/* harness.h - the test suites' small harness: CHECK, one named test at a
   time ("ok - name" / "not ok - name" / "skip - name"), and the closing line
   "N passed, M failed" (", K skipped" when some were), and a reader of
   JSON-lines goldens files. Include once, after gemma4.h (with its
   implementation), in each tests/test_*.c. */
#ifndef G4_TEST_HARNESS_H
#define G4_TEST_HARNESS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define H_UNUSED __attribute__((unused))
#else
#define H_UNUSED
#endif

static int g_pass, g_fail, g_skip, g_cur_failed, g_cur_skipped;
static char g_cur[300];      /* the test running now */
static const char *g_only;   /* run only tests whose name contains this (NULL: all) */

/* Records a failure of the current test, with file, line and a message. */
#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            printf("  FAIL %s:%d: %s: ", __FILE__, __LINE__, g_cur);             \
            printf(__VA_ARGS__);                                                 \
            printf("\n");                                                        \
            g_cur_failed = 1;                                                    \
        }                                                                        \
    } while (0)

/* begin ... end: one test whose name is formatted (for table-driven cases). */
H_UNUSED static void begin(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_cur, sizeof g_cur, fmt, ap);
    va_end(ap);
    g_cur_failed = g_cur_skipped = 0;
}

H_UNUSED static void end(void) {
    if (g_cur_failed) { g_fail++; printf("not ok - %s\n", g_cur); }
    else if (g_cur_skipped) { g_skip++; printf("skip - %s\n", g_cur); }
    else { g_pass++; printf("ok - %s\n", g_cur); }
    fflush(stdout);
}

/* The current test cannot run here (a missing fixture); it counts as skipped. */
H_UNUSED static void skip(const char *why) {
    printf("  skipped: %s\n", why);
    g_cur_skipped = 1;
}

/* A GPU suite where no CUDA device answers: a skip, or a failure with G4_CUDA_REQUIRED=1 (set by
   tests/cuda_device.sh and cuda_real.sh, on the machine that has one). Prints the closing line;
   returns the exit status. */
H_UNUSED static int h_no_gpu(void) {
    const char *req = getenv("G4_CUDA_REQUIRED");
    if (req && strcmp(req, "1") == 0) {
        printf("0 passed, 1 failed (G4_CUDA_REQUIRED=1: a GPU was required)\n");
        return 1;
    }
    printf("0 passed, 0 failed (skipped: no GPU)\n");
    return 0;
}

H_UNUSED static void run(const char *name, void (*fn)(void)) {
    if (g_only && !strstr(name, g_only)) return;
    begin("%s", name);
    fn();
    end();
}

/* Prints the closing line; the process's exit status. */
H_UNUSED static int finish(void) {
    if (g_skip) printf("%d passed, %d failed, %d skipped\n", g_pass, g_fail, g_skip);
    else printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

/* A JSON-lines file (a goldens file), read whole, one JSON value a line; empty
   lines are passed over (gemma4.h's file reader and JSON parser).
       h_jsonl f; g4__json j; int r;
       if (h_jsonl_open(&f, path, err) != G4_OK) ...;
       while ((r = h_jsonl_next(&f, &j, err)) > 0) { ...; g4__json_free(&j); }
       if (r < 0) ...;   (err says which line did not parse)
       h_jsonl_close(&f); */
typedef struct {
    char *text, path[512], name[600]; /* name: "path, line N", which the parsed line keeps */
    size_t len, pos;
    long line; /* the line last read, from 1 */
} h_jsonl;

H_UNUSED static g4_result h_jsonl_open(h_jsonl *f, const char *path, char *err) {
    snprintf(f->path, sizeof f->path, "%s", path);
    f->text = NULL;
    f->pos = 0;
    f->line = 0;
    return g4__read_file(path, &f->text, &f->len, (size_t)64 << 20, err);
}

/* The next non-empty line parsed into *j: 1 (the caller frees j), 0 at the end of the
   file, -1 when the line does not parse (the message in err names the file and line;
   the next call goes on with the line after it). */
H_UNUSED static int h_jsonl_next(h_jsonl *f, g4__json *j, char *err) {
    while (f->pos < f->len) {
        size_t start = f->pos, end = start;
        while (end < f->len && f->text[end] != '\n') end++;
        f->pos = end + 1;
        f->line++;
        if (end == start) continue;
        snprintf(f->name, sizeof f->name, "%s, line %ld", f->path, f->line);
        return g4__json_parse(j, f->text + start, end - start, f->name, err) == G4_OK ? 1 : -1;
    }
    return 0;
}

H_UNUSED static void h_jsonl_close(h_jsonl *f) {
    free(f->text);
    f->text = NULL;
}

#if defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200809L
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* A fresh directory /tmp/gemma4-<tag>-XXXXXX for a suite's files, its path in dir[0..cap); 0 (said on
   stdout) when it cannot be made. */
H_UNUSED static int h_tmpdir(char *dir, size_t cap, const char *tag) {
    if ((size_t)snprintf(dir, cap, "/tmp/gemma4-%s-XXXXXX", tag) < cap && mkdtemp(dir)) return 1;
    printf("cannot create a temporary directory\n");
    return 0;
}

/* A suite's command line: "-k NAME" runs only the tests whose names hold NAME (g_only), the other
   arguments fill *first then *second (NULL: not taken); then, with a tag, h_tmpdir(tmp, cap, tag). */
H_UNUSED static int h_args(int argc, char **argv, const char **first, const char **second, char *tmp, size_t cap,
                           const char *tag) {
    int i, n = 0;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-k") && i + 1 < argc) g_only = argv[++i];
        else if (n++ == 0 && first) *first = argv[i];
        else if (n == 2 && second) *second = argv[i];
    }
    return !tag || h_tmpdir(tmp, cap, tag);
}

/* Reads at most cap - 1 bytes of the file at fd into buf, NUL-terminated; the count read. */
H_UNUSED static size_t h_read_fd(int fd, char *buf, size_t cap) {
    size_t n = 0;
    ssize_t got;
    if (!buf || !cap) return 0;
    while (n + 1 < cap && (got = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)got;
    buf[n] = 0;
    return n;
}

/* Runs `cli args` through the shell (cli: the CLI binary, or "" when args is a whole command line, a pipe
   say; for "a && b" or "2>&1" the whole line's output is captured). Its stdout goes into out[0..out_cap)
   (NUL-terminated, cut at out_cap - 1 bytes; *out_len, if given, the count, which may include NULs), its
   stderr into err[0..err_cap); a NULL buffer discards that stream. Returns the exit status, -1 when the
   command did not exit normally or could not be run. (Only where POSIX 2008 is asked for.) */
H_UNUSED static int run_cli(const char *cli, const char *args, char *out, size_t out_cap, size_t *out_len, char *err,
                            size_t err_cap) {
    char op[] = "/tmp/g4-cli-out-XXXXXX", ep[] = "/tmp/g4-cli-err-XXXXXX", *cmd;
    int fo = mkstemp(op), fe = mkstemp(ep), st = -1;
    size_t n, len = strlen(cli) + strlen(args) + sizeof op + sizeof ep + 32;
    if (out && out_cap) out[0] = 0;
    if (err && err_cap) err[0] = 0;
    if (out_len) *out_len = 0;
    if (fo >= 0 && fe >= 0 && (cmd = (char *)malloc(len)) != NULL) {
        snprintf(cmd, len, "{ %s %s ; } > %s 2> %s", cli, args, op, ep);
        st = system(cmd);
        st = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        free(cmd);
        n = h_read_fd(fo, out, out_cap);
        if (out_len) *out_len = n;
        h_read_fd(fe, err, err_cap);
    }
    if (fo >= 0) { close(fo); unlink(op); }
    if (fe >= 0) { close(fe); unlink(ep); }
    return st;
}

/* rm -rf path (a suite's temporary directory), saying so when it cannot. */
H_UNUSED static void remove_tree(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) printf("  (could not remove %s)\n", path);
}

#ifdef H_CLI_OUTPUT
/* For the suites that drive the CLI (define H_CLI_OUTPUT first): the last run's stdout and stderr, and
   h_run: `prog args` (prog NULL: the line is a whole shell command, a pipe say) with printf-style args,
   its exit status; every run is checked to leave no sanitizer report (the _san builds). */
static char g_out[1 << 16], g_err[1 << 16];

H_UNUSED static int h_clean(int st, const char *what) {
    CHECK(!strstr(g_err, "Sanitizer") && !strstr(g_err, "runtime error"), "%s: sanitizer report: %s", what, g_err);
    return st;
}

static int h_run(const char *prog, const char *fmt, ...) G4__PRINTF(2, 3);
H_UNUSED static int h_run(const char *prog, const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    return h_clean(run_cli(prog ? prog : "", line, g_out, sizeof g_out, NULL, g_err, sizeof g_err), line);
}
#endif
#endif

#endif /* G4_TEST_HARNESS_H */
