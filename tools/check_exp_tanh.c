/* check_exp_tanh.c - g4__expf and g4__tanhf (gemma4.h) over every float32
   input, against a correctly rounded reference and against the C library.

       cc -std=c99 -O2 -ffp-contract=off -o build/check_exp_tanh tools/check_exp_tanh.c -lm
       ./build/check_exp_tanh            (about a minute a function)

   The reference is long double expl/tanhl (x87, 64-bit significand) rounded
   to float: it decides the float rounding except where the exact value lies
   within about 2^-63 of a midpoint. For each function it prints how many
   finite inputs g4__ and the C library round differently from it and from
   each other, and the largest difference in ulps. Not a test (it takes
   minutes); the README records its output. */
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

/* ulps between two floats of the same sign (or both zero) */
static long ulps(float a, float b) {
    long ia = (long)(bits_of(a) & 0x7fffffffu), ib = (long)(bits_of(b) & 0x7fffffffu);
    if ((bits_of(a) ^ bits_of(b)) & 0x80000000u) return ia + ib;
    return ia > ib ? ia - ib : ib - ia;
}

static void check(const char *name, float (*ours)(float), float (*libc)(float), long double (*ref)(long double),
                  float lo, float hi) {
    unsigned long n = 0, ours_bad = 0, libc_bad = 0, differ = 0;
    long ours_worst = 0, libc_worst = 0;
    uint32_t u = 0;
    float first_bad = 0.0f;
    do {
        float x, r, a, b;
        memcpy(&x, &u, 4);
        u++;
        if (x != x || x < lo || x > hi) continue;
        n++;
        r = (float)ref((long double)x);
        a = ours(x);
        b = libc(x);
        if (bits_of(a) != bits_of(r)) {
            if (!ours_bad) first_bad = x;
            ours_bad++;
            if (ulps(a, r) > ours_worst) ours_worst = ulps(a, r);
        }
        if (bits_of(b) != bits_of(r)) {
            libc_bad++;
            if (ulps(b, r) > libc_worst) libc_worst = ulps(b, r);
        }
        differ += bits_of(a) != bits_of(b);
    } while (u != 0);
    printf("%s over [%g, %g]: %lu inputs; g4__ misrounded %lu (max %ld ulp%s%.9g), libc misrounded %lu (max %ld ulp); "
           "g4__ != libc on %lu\n",
           name, (double)lo, (double)hi, n, ours_bad, ours_worst, ours_bad ? ", first at x = " : "",
           ours_bad ? (double)first_bad : 0.0, libc_bad, libc_worst, differ);
}

static float libc_expf(float x) { return expf(x); }
static float libc_tanhf(float x) { return tanhf(x); }
static float our_expf(float x) { return g4__expf(x); }
static float our_tanhf(float x) { return g4__tanhf(x); }

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "both";
    if (strcmp(which, "tanh") != 0) check("expf", our_expf, libc_expf, expl, -INFINITY, INFINITY);
    if (strcmp(which, "exp") != 0) check("tanhf", our_tanhf, libc_tanhf, tanhl, -INFINITY, INFINITY);
    return 0;
}
