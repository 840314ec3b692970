"""split.py HEADER OUT - a copy of gemma4.h with timers around its matmuls, for
bench/split.c (`sh bench/split.sh`): the forward's wall time in g4__matmul
(the GEMM with its thread fork and join) and each thread's time in its part.
Not a test; fails if the header no longer has the lines it patches."""
import sys

src = open(sys.argv[1]).read()


def sub(old, new):
    global src
    if src.count(old) != 1:
        sys.exit("split.py: gemma4.h changed: %r not found once" % old[:60])
    src = src.replace(old, new)


sub("/* ============================================================= >>backend */",
    """#include <time.h>
static double g4s_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec; }
static double g4s_tcpu(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec; }
double g4s_mm_wall, g4s_mm_flop, g4s_part_wall[64], g4s_part_cpu[64];
/* ============================================================= >>backend */""")
sub("""    if (o0 >= o1) return;
#if G4__BF16DOT""", """    double pw0 = g4s_now(), pc0 = g4s_tcpu();
    if (o0 >= o1) return;
#if G4__BF16DOT""")
sub("""        for (t = 0; t < j->n; t++) g4__bf16_round_range(j->y + (size_t)t * (size_t)out, (size_t)o0, (size_t)o1);
}""", """        for (t = 0; t < j->n; t++) g4__bf16_round_range(j->y + (size_t)t * (size_t)out, (size_t)o0, (size_t)o1);
    if (j->n > 1 && part < 64) { g4s_part_wall[part] += g4s_now() - pw0; g4s_part_cpu[part] += g4s_tcpu() - pc0; }
}""")
sub("""static void g4__matmul(const g4_session *s, float *y, const float *x, const g4_tensor *w, int n) {
    g4__matmul_cast(s, y, x, w, n, 1);""", """static void g4__matmul(const g4_session *s, float *y, const float *x, const g4_tensor *w, int n) {
    double t0 = g4s_now();
    g4__matmul_cast(s, y, x, w, n, 1);
    if (n > 1) { g4s_mm_wall += g4s_now() - t0; g4s_mm_flop += 2.0 * (double)w->shape[0] * (double)w->shape[1] * n; }""")
open(sys.argv[2], "w").write(src)
