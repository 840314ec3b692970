/* x86_emu.h - the AVX-512F and AVX-512 BF16 intrinsics gemma4.h uses, as plain
   C on GCC/clang vector types, so that its AVX-512 kernels (the 16-lane tile,
   the packed GEMM, the avx512_bf16 dot-product kernel) compile and run their
   tests on a CPU without AVX-512 (tests/other_kernels.sh):
       cc -DG4_X86_EMU='"tests/x86_emu.h"' -Wno-psabi -O2 ... tests/test_gemma4.c
   (-Wno-psabi: GCC notes that 64-byte vectors passed by value without
   AVX-512 have another ABI, which matters only across objects built
   differently; everything here is static).
   gemma4.h includes this instead of <immintrin.h>. Build it for the baseline
   x86-64 ISA (no -mavx2): then only the AVX-512 kernels are chosen, and this
   file is the whole of their instruction set.

   What is modelled, from Intel's pseudo-code for each instruction: lane-wise
   float32 arithmetic rounded once per operation (fmadd one rounding, via
   fmaf); VDPBF16PS as exact bf16 products added to the accumulator odd pair
   first, then even, each sum rounded to nearest even, with denormal inputs
   read as zero and denormal sums flushed to zero (DAZ and FTZ, which the
   instruction applies whatever MXCSR says); VCVTNE2PS2BF16 as round to
   nearest even, denormals to zero, NaN quieted; _mm512_reduce_add_ps in GCC's
   order (the upper 256 bits onto the lower, then 128, then 64, then the last
   pair). A run here tests the kernels' logic (tiles, blocks, edges, tails,
   the bit rule between decode and prefill) against the scalar reference; it
   does not test a real CPU's instructions. The kernel report says
   "emulated". */
#ifndef G4_X86_EMU_H
#define G4_X86_EMU_H
#if defined(__AVX2__) || defined(__AVX512F__)
#error "x86_emu.h: build for the baseline ISA (no -mavx2, no -mavx512f): the emulation is the whole instruction set"
#endif
#include <math.h>
#include <stdint.h>
#include <string.h>

#define __AVX512F__ 1
#define __AVX512BF16__ 1
#define G4__SIMD_EMULATED 1

/* The intrinsics that take no pointer are this model's arithmetic on values,
   test machinery rather than code under test, so a sanitized build (make
   test's san_avx2: test_gemma4 under ASan + UBSan here) leaves them
   uninstrumented: its run took 48 s instead of 21 on the Zen 3. The loads and
   stores (and the kernels around them) stay instrumented, so a kernel that
   reads or writes past a buffer is still caught at the intrinsic. */
#define G4EMU_PURE __attribute__((no_sanitize("address", "undefined")))

typedef float __m512 __attribute__((vector_size(64), may_alias));
typedef long long __m512i __attribute__((vector_size(64), may_alias));
typedef short __m512bh __attribute__((vector_size(64), may_alias));
typedef long long __m256i __attribute__((vector_size(32), may_alias));
typedef unsigned short __mmask16;
#define _CMP_LT_OQ 0x11

typedef int32_t g4emu_i32x16 __attribute__((vector_size(64), may_alias));
typedef uint16_t g4emu_u16x32 __attribute__((vector_size(64), may_alias));
typedef uint16_t g4emu_u16x16 __attribute__((vector_size(32), may_alias));
typedef uint32_t g4emu_u32x16 __attribute__((vector_size(64), may_alias));

G4EMU_PURE static inline float g4emu_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
G4EMU_PURE static inline uint32_t g4emu_u32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* a denormal float32 to a zero of its sign (DAZ, FTZ) */
G4EMU_PURE static inline float g4emu_flush(float f) {
    return (g4emu_u32(f) & 0x7f800000u) == 0 ? g4emu_f32(g4emu_u32(f) & 0x80000000u) : f;
}

G4EMU_PURE static inline __m512 _mm512_setzero_ps(void) {
    __m512 z = {0};
    return z;
}
G4EMU_PURE static inline __m512 _mm512_set1_ps(float f) {
    __m512 v;
    int i;
    for (i = 0; i < 16; i++) v[i] = f;
    return v;
}
G4EMU_PURE static inline __m512i _mm512_set1_epi32(int a) {
    g4emu_i32x16 v;
    int i;
    for (i = 0; i < 16; i++) v[i] = a;
    return (__m512i)v;
}
static inline __m512 _mm512_loadu_ps(const void *p) {
    __m512 v;
    memcpy(&v, p, 64);
    return v;
}
static inline void _mm512_storeu_ps(void *p, __m512 v) { memcpy(p, &v, 64); }
/* masked: lanes whose bit of m is 0 are neither read (0 in the result) nor written */
static inline __m512 _mm512_maskz_loadu_ps(__mmask16 m, const void *p) {
    __m512 v = {0};
    int i;
    for (i = 0; i < 16; i++)
        if (m >> i & 1) memcpy((char *)&v + 4 * i, (const char *)p + 4 * i, 4);
    return v;
}
static inline void _mm512_mask_storeu_ps(void *p, __mmask16 m, __m512 v) {
    int i;
    for (i = 0; i < 16; i++)
        if (m >> i & 1) memcpy((char *)p + 4 * i, (const char *)&v + 4 * i, 4);
}
static inline __m512i _mm512_loadu_si512(const void *p) {
    __m512i v;
    memcpy(&v, p, 64);
    return v;
}
static inline void _mm512_storeu_si512(void *p, __m512i v) { memcpy(p, &v, 64); }
static inline __m256i _mm256_loadu_si256(const void *p) { /* void: no alignment assumed (clang takes it from the pointer type) */
    __m256i v;
    memcpy(&v, p, 32);
    return v;
}
G4EMU_PURE static inline __m512 _mm512_castsi512_ps(__m512i v) { return (__m512)v; }
G4EMU_PURE static inline __m512i _mm512_castps_si512(__m512 v) { return (__m512i)v; }

G4EMU_PURE static inline __m512 _mm512_add_ps(__m512 a, __m512 b) { return a + b; }
G4EMU_PURE static inline __m512 _mm512_sub_ps(__m512 a, __m512 b) { return a - b; }
G4EMU_PURE static inline __m512 _mm512_mul_ps(__m512 a, __m512 b) { return a * b; }
G4EMU_PURE static inline __m512 _mm512_div_ps(__m512 a, __m512 b) { return a / b; }
G4EMU_PURE static inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
    __m512 v;
    int i;
    for (i = 0; i < 16; i++) v[i] = fmaf(a[i], b[i], c[i]);
    return v;
}
/* MINPS: the second operand when either is NaN or both are zeros */
G4EMU_PURE static inline __m512 _mm512_min_ps(__m512 a, __m512 b) {
    __m512 v;
    int i;
    for (i = 0; i < 16; i++) v[i] = a[i] < b[i] ? a[i] : b[i];
    return v;
}
G4EMU_PURE static inline __m512 _mm512_abs_ps(__m512 a) {
    g4emu_u32x16 u = (g4emu_u32x16)a;
    int i;
    for (i = 0; i < 16; i++) u[i] &= 0x7fffffffu;
    return (__m512)u;
}
G4EMU_PURE static inline __mmask16 _mm512_cmp_ps_mask(__m512 a, __m512 b, int pred) {
    __mmask16 m = 0;
    int i;
    (void)pred; /* only _CMP_LT_OQ is used: ordered, quiet less-than */
    for (i = 0; i < 16; i++)
        if (a[i] < b[i]) m = (__mmask16)(m | 1u << i);
    return m;
}
G4EMU_PURE static inline __m512 _mm512_mask_blend_ps(__mmask16 m, __m512 a, __m512 b) {
    __m512 v;
    int i;
    for (i = 0; i < 16; i++) v[i] = m >> i & 1 ? b[i] : a[i];
    return v;
}
/* CVTPS2DQ under the default MXCSR: round to nearest even (out of range: 0x80000000) */
G4EMU_PURE static inline __m512i _mm512_cvtps_epi32(__m512 a) {
    g4emu_i32x16 v;
    int i;
    for (i = 0; i < 16; i++) v[i] = a[i] >= -2147483648.0f && a[i] < 2147483648.0f ? (int32_t)lrintf(a[i]) : INT32_MIN;
    return (__m512i)v;
}
G4EMU_PURE static inline __m512i _mm512_add_epi32(__m512i a, __m512i b) {
    g4emu_u32x16 x = (g4emu_u32x16)a, y = (g4emu_u32x16)b;
    return (__m512i)(x + y);
}
G4EMU_PURE static inline __m512i _mm512_slli_epi32(__m512i a, unsigned n) {
    g4emu_u32x16 x = (g4emu_u32x16)a;
    int i;
    for (i = 0; i < 16; i++) x[i] = n > 31 ? 0 : x[i] << n;
    return (__m512i)x;
}
G4EMU_PURE static inline __m512i _mm512_srli_epi32(__m512i a, unsigned n) {
    g4emu_u32x16 x = (g4emu_u32x16)a;
    int i;
    for (i = 0; i < 16; i++) x[i] = n > 31 ? 0 : x[i] >> n;
    return (__m512i)x;
}
G4EMU_PURE static inline __m512i _mm512_and_si512(__m512i a, __m512i b) { return a & b; }
G4EMU_PURE static inline __m512i _mm512_sub_epi32(__m512i a, __m512i b) {
    g4emu_u32x16 x = (g4emu_u32x16)a, y = (g4emu_u32x16)b;
    return (__m512i)(x - y);
}
/* VPSRAD: the sign bit shifted in */
G4EMU_PURE static inline __m512i _mm512_srai_epi32(__m512i a, unsigned n) {
    g4emu_i32x16 x = (g4emu_i32x16)a;
    int i;
    for (i = 0; i < 16; i++) x[i] = x[i] < 0 ? ~(~x[i] >> (n > 31 ? 31 : n)) : x[i] >> (n > 31 ? 31 : n);
    return (__m512i)x;
}
G4EMU_PURE static inline __m512 _mm512_cvtepi32_ps(__m512i a) {
    g4emu_i32x16 x = (g4emu_i32x16)a;
    __m512 v;
    int i;
    for (i = 0; i < 16; i++) v[i] = (float)x[i];
    return v;
}
G4EMU_PURE static inline __m512i _mm512_or_si512(__m512i a, __m512i b) { return a | b; }
G4EMU_PURE static inline __m512i _mm512_setzero_si512(void) { return (__m512i)_mm512_setzero_ps(); }
G4EMU_PURE static inline __m512i _mm512_cvtepu16_epi32(__m256i a) {
    g4emu_u16x16 h = (g4emu_u16x16)a;
    g4emu_u32x16 v;
    int i;
    for (i = 0; i < 16; i++) v[i] = h[i];
    return (__m512i)v;
}
/* VCVTPH2PS: exact (every half is a float) */
G4EMU_PURE static inline __m512 _mm512_cvtph_ps(__m256i a) {
    g4emu_u16x16 h = (g4emu_u16x16)a;
    __m512 v;
    int i;
    for (i = 0; i < 16; i++) {
        uint32_t s = (uint32_t)(h[i] >> 15) << 31, e = h[i] >> 10 & 31, f = h[i] & 1023;
        if (e == 31) v[i] = g4emu_f32(s | 0x7f800000u | f << 13);
        else if (e == 0) v[i] = g4emu_f32(s) + (s ? -1.0f : 1.0f) * ldexpf((float)f, -24);
        else v[i] = g4emu_f32(s | (e + 112) << 23 | f << 13);
    }
    return v;
}
/* GCC's _mm512_reduce_add_ps */
G4EMU_PURE static inline float _mm512_reduce_add_ps(__m512 a) {
    float t8[8], t4[4], t2[2];
    int i;
    for (i = 0; i < 8; i++) t8[i] = a[i + 8] + a[i];
    for (i = 0; i < 4; i++) t4[i] = t8[i + 4] + t8[i];
    t2[0] = t4[0] + t4[2];
    t2[1] = t4[1] + t4[3];
    return t2[0] + t2[1];
}

/* VSHUFF32X4: 128-bit blocks 0, 1 of the result from a, 2, 3 from b, each picked by two bits of imm */
G4EMU_PURE static inline __m512 _mm512_shuffle_f32x4(__m512 a, __m512 b, int imm) {
    __m512 v;
    int i, l;
    for (i = 0; i < 4; i++)
        for (l = 0; l < 4; l++) v[4 * i + l] = (i < 2 ? a : b)[4 * (imm >> 2 * i & 3) + l];
    return v;
}
/* VSHUFPS: in each 128-bit block, lanes 0, 1 from a and 2, 3 from b, each picked by two bits of imm */
G4EMU_PURE static inline __m512 _mm512_shuffle_ps(__m512 a, __m512 b, int imm) {
    __m512 v;
    int i, l;
    for (i = 0; i < 4; i++)
        for (l = 0; l < 4; l++) v[4 * i + l] = (l < 2 ? a : b)[4 * i + (imm >> 2 * l & 3)];
    return v;
}
/* VUNPCKLPS, VUNPCKHPS: in each 128-bit block, a and b's lanes 0, 1 (hi: 2, 3) interleaved */
G4EMU_PURE static inline __m512 _mm512_unpacklo_ps(__m512 a, __m512 b) {
    __m512 v;
    int i;
    for (i = 0; i < 4; i++) { v[4 * i] = a[4 * i]; v[4 * i + 1] = b[4 * i]; v[4 * i + 2] = a[4 * i + 1]; v[4 * i + 3] = b[4 * i + 1]; }
    return v;
}
G4EMU_PURE static inline __m512 _mm512_unpackhi_ps(__m512 a, __m512 b) {
    __m512 v;
    int i;
    for (i = 0; i < 4; i++) { v[4 * i] = a[4 * i + 2]; v[4 * i + 1] = b[4 * i + 2]; v[4 * i + 2] = a[4 * i + 3]; v[4 * i + 3] = b[4 * i + 3]; }
    return v;
}

/* VCVTNE2PS2BF16 (lanes 0-15 from b, 16-31 from a) */
G4EMU_PURE static inline uint16_t g4emu_to_bf16(float f) {
    uint32_t u = g4emu_u32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(u >> 16 | 0x40);
    if ((u & 0x7f800000u) == 0) return (uint16_t)(u >> 16 & 0x8000);
    return (uint16_t)((u + 0x7fffu + (u >> 16 & 1)) >> 16);
}
G4EMU_PURE static inline __m512bh _mm512_cvtne2ps_pbh(__m512 a, __m512 b) {
    g4emu_u16x32 v;
    int i;
    for (i = 0; i < 16; i++) {
        v[i] = g4emu_to_bf16(b[i]);
        v[i + 16] = g4emu_to_bf16(a[i]);
    }
    return (__m512bh)v;
}
/* VDPBF16PS */
G4EMU_PURE static inline __m512 _mm512_dpbf16_ps(__m512 src, __m512bh a, __m512bh b) {
    g4emu_u16x32 x = (g4emu_u16x32)a, y = (g4emu_u16x32)b;
    __m512 v;
    int i;
    for (i = 0; i < 16; i++) {
        float t = g4emu_flush(src[i]);
        t = g4emu_flush(t + g4emu_flush(g4emu_f32((uint32_t)x[2 * i + 1] << 16)) * g4emu_flush(g4emu_f32((uint32_t)y[2 * i + 1] << 16)));
        t = g4emu_flush(t + g4emu_flush(g4emu_f32((uint32_t)x[2 * i] << 16)) * g4emu_flush(g4emu_f32((uint32_t)y[2 * i] << 16)));
        v[i] = t;
    }
    return v;
}
#endif
