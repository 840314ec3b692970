/* harness.h - the test suites' small harness: CHECK, one named test at a
   time ("ok - name" / "not ok - name" / "skip - name"), and the closing line
   "N passed, M failed" (", K skipped" when some were). Include once, after
   gemma4.h, in each tests/test_*.c. */
#ifndef G4_TEST_HARNESS_H
#define G4_TEST_HARNESS_H

#include <stdarg.h>
#include <stdio.h>
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

#endif /* G4_TEST_HARNESS_H */
