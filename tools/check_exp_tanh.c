/* check_exp_tanh.c - g4__expf and g4__tanhf (gemma4.h) over every float32
   input, against the correctly rounded value and against the C library.

       cc -std=c99 -O2 -ffp-contract=off -o build/check_exp_tanh tools/check_exp_tanh.c -lm
       ./build/check_exp_tanh            (a few minutes)

   g4__ computes in double and rounds once to float, with an error far below
   2^-40 relative; so its float is the correctly rounded one unless the double
   lies within 2^-40 of a midpoint between two floats. Those inputs, and every
   input where the C library's float differs from g4__'s, are decided by long
   double expl/tanhl (x87, 64-bit significand; it misjudges a rounding only
   within about 2^-63 of a midpoint). Printed per function: the inputs, how
   many g4__ and the C library round incorrectly (and by how many ulps at
   most), and how many differ from each other. Not a test (it takes minutes);
   docs/cuda.md records its output; tests/test_cuda.c samples 2M inputs. */
#define _POSIX_C_SOURCE 200809L
#define GEMMA4_IMPLEMENTATION
#define GEMMA4_STATIC
#include "../gemma4.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static long ulps(float a, float b) {
    long ia = (long)(bits_of(a) & 0x7fffffffu), ib = (long)(bits_of(b) & 0x7fffffffu);
    if ((bits_of(a) ^ bits_of(b)) & 0x80000000u) return ia + ib;
    return ia > ib ? ia - ib : ib - ia;
}

/* the double g4__ rounds to float (NaN when it returns a constant) */
static double exp_double(float x) {
    if (x != x || x >= 88.72283935546875f || x < -104.0f) return NAN;
    return g4__exp_d((double)x);
}
static double tanh_double(float x) {
    double a = x < 0.0f ? -(double)x : (double)x;
    if (x != x || x == 0.0f || a > 9.1) return NAN;
    return x < 0.0f ? -g4__tanh_d(a) : g4__tanh_d(a);
}

/* y within 2^-40 of a midpoint between floats */
static int near_midpoint(double y) {
    float f = (float)y, g;
    double m;
    if (y != y || y == 0.0) return 0;
    g = nextafterf(f, (double)f < y ? INFINITY : -INFINITY);
    m = ((double)f + (double)g) / 2.0;
    return fabs(y - m) < ldexp(fabs(y), -40);
}

static void check(const char *name, float (*ours)(float), double (*ours_d)(float), float (*libc)(float),
                  long double (*ref)(long double)) {
    unsigned long n = 0, ours_bad = 0, libc_bad = 0, differ = 0, refs = 0;
    long ours_worst = 0, libc_worst = 0;
    uint32_t u = 0;
    do {
        float x, a, b, r;
        int need;
        memcpy(&x, &u, 4);
        u++;
        if (x != x) continue;
        n++;
        a = ours(x);
        b = libc(x);
        need = near_midpoint(ours_d(x)) || bits_of(a) != bits_of(b);
        if (!need) continue; /* both equal the correctly rounded value */
        refs++;
        r = (float)ref((long double)x);
        if (bits_of(a) != bits_of(r)) { ours_bad++; if (ulps(a, r) > ours_worst) ours_worst = ulps(a, r); }
        if (bits_of(b) != bits_of(r)) { libc_bad++; if (ulps(b, r) > libc_worst) libc_worst = ulps(b, r); }
        differ += bits_of(a) != bits_of(b);
    } while (u != 0);
    printf("%s: %lu non-NaN float32 inputs; misrounded: g4__ %lu (max %ld ulp), libc %lu (max %ld ulp); g4__ != libc on "
           "%lu (%lu decided by the long double reference)\n",
           name, n, ours_bad, ours_worst, libc_bad, libc_worst, differ, refs);
    fflush(stdout);
}

static float libc_expf(float x) { return expf(x); }
static float libc_tanhf(float x) { return tanhf(x); }
static float our_expf(float x) { return g4__expf(x); }
static float our_tanhf(float x) { return g4__tanhf(x); }

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "both";
    if (strcmp(which, "tanh") != 0) check("expf", our_expf, exp_double, libc_expf, expl);
    if (strcmp(which, "exp") != 0) check("tanhf", our_tanhf, tanh_double, libc_tanhf, tanhl);
    return 0;
}
