/* cuda_emu.h - just enough of CUDA to run gemma4_cuda.cu on the host, so the
   CUDA path's own kernels can be tested on machines without a GPU.

   Force-included when gemma4_cuda.cu is compiled as host C++:
       g++ -std=c++17 -DG4_CUDA_EMULATE -include tests/cuda_emu.h -x c++ -c gemma4_cuda.cu

   What it provides, and how:
   - Kernels are plain functions (__global__, __device__ vanish). A launch,
     G4C_LAUNCH(kernel, grid, block, args...), runs the grid's blocks one
     after another, starting at a varying block and stepping through them
     in a scrambled order. Inside a block every thread is a FIBER (ucontext) with its
     own stack; the scheduler runs each fiber (in a shuffled order each
     round, so a missing barrier shows up as a wrong result) until it finishes or reaches
     __syncthreads(), which swaps back (x86-64: a register-saving switch in
     a few instructions; elsewhere, or with -DG4EMU_UCONTEXT, ucontext). A barrier is released when every
     thread of the block waits at it; a thread that exits while others wait
     is a barrier divergence (a hang or UB on a GPU): the emulator aborts.
   - blockIdx, threadIdx, blockDim, gridDim are globals the scheduler sets
     before resuming each fiber (only one runs at a time).
   - __shared__ is `static`: blocks run one at a time, so one copy per
     kernel is exactly per-block shared memory.
   - Device memory is host memory from an allocation registry, so
     cudaMemcpy checks each side is (or is not) device memory for its kind,
     and cudaFree refuses pointers it did not hand out.
   - __fmul_rn/__fadd_rn/__fsub_rn/__fdiv_rn/__fmaf_rn are the host's float ops (the build
     uses no FMA contraction, -ffp-contract=off); the exact mode calls no libm
     function but sqrtf (exp and tanh are gemma4.h's own, RoPE's cos/sin
     come from the host), correctly rounded on the host as on a GPU.
   - Launch checks as on a GPU: 1..1024 threads per block, nonempty grid.
   - Test hooks (extern "C"): g4emu_on_call(fail) asks fail() at every
     runtime call and launch from now, and the call fails where it returns
     nonzero (every checked call's error path can be driven; NULL: none);
     g4emu_launches(name) counts launches of a kernel; g4emu_fault_in(name, n)
     makes the n-th launch of that kernel from now fault as a GPU kernel that
     reads an illegal address does: the launch itself succeeds (faults are
     asynchronous), the kernel and every later one do not run, the next
     synchronising call (cudaMemcpy, cudaMemset, cudaDeviceSynchronize)
     returns cudaErrorIllegalAddress, and from then on every call does
     (sticky: the context is unusable) until g4emu_reset_device();
     g4emu_ftz(1) runs kernels with the x86 FTZ/DAZ bits set, as a build with
     -ftz=true (-use_fast_math) flushes denormals; g4emu_mmas() counts the
     warp MMAs; g4emu_set_sms(n) sets the multiprocessor count the device
     reports (cudaDeviceGetAttribute; 2 until set), which sizes the fast
     mode's flash-decoding splits.
   - Warp primitives (the fast mode's reductions): __shfl_xor_sync,
     __shfl_down_sync, __shfl_sync on 32-bit values and __syncwarp, full mask
     only. A warp is 32 consecutive threads of the block (fewer in a block of
     under 32). Each is a warp barrier: the lane stores its value, yields, and
     is resumed only once every lane of its warp has reached a warp barrier;
     a lane that exits or waits at __syncthreads meanwhile is a divergence:
     the emulator aborts, naming the kernel.
   - The bf16 tensor-core MMA the fast mode's GEMM issues (mma.sync
     m16n8k16, inline PTX on a GPU) as g4emu_mma_bf16_16816: a warp barrier,
     then a scalar product from the lanes' fragments laid out as the PTX ISA
     says.
   - uint4 / float4 (16-byte vector loads) as plain structs. */
#ifndef G4_CUDA_EMU_H
#define G4_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <ucontext.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define __global__
#define __device__
#define __host__
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
static dim3 blockIdx, threadIdx, blockDim, gridDim;

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorIllegalAddress = 700,
    cudaErrorAssert = 710,
    cudaErrorHardwareStackError = 714,
    cudaErrorIllegalInstruction = 715,
    cudaErrorMisalignedAddress = 716,
    cudaErrorInvalidAddressSpace = 717,
    cudaErrorInvalidPc = 718,
    cudaErrorLaunchFailure = 719,
    cudaErrorUnknown = 999
} cudaError_t;

typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3
} cudaMemcpyKind;

struct cudaDeviceProp {
    char name[256];
    int major, minor;
};

struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };

static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    uint4 v = {x, y, z, w};
    return v;
}

static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---------------------------------------------------------------- errors */

static cudaError_t g4emu_last = cudaSuccess;
static int (*g4emu_fail_hook)(void); /* g4emu_on_call */
static const char *g4emu_fault_kernel; /* g4emu_fault_in: the kernel whose launch faults */
static long g4emu_fault_count;
static bool g4emu_fault_pending;       /* a kernel faulted; not yet seen by a synchronising call */
static cudaError_t g4emu_sticky = cudaSuccess;

/* Injected failures: from now on every call asks fail(), and fails where it says so. */
extern "C" void g4emu_on_call(int (*fail)(void)) { g4emu_fail_hook = fail; }

/* An injected kernel fault: the n-th launch of `kernel` from now. */
extern "C" void g4emu_fault_in(const char *kernel, long n) {
    g4emu_fault_kernel = kernel;
    g4emu_fault_count = n;
}

/* Kernels with denormals flushed (the x86 FTZ and DAZ bits), or not. */
static int g4emu_ftz_on;
extern "C" void g4emu_ftz(int on) { g4emu_ftz_on = on; }

/* What ending the process (or cudaDeviceReset) does for a sticky fault. */
extern "C" void g4emu_reset_device(void) {
    g4emu_fault_kernel = NULL;
    g4emu_fault_pending = false;
    g4emu_sticky = cudaSuccess;
    g4emu_last = cudaSuccess;
}

static bool g4emu_injected(void) { return g4emu_fail_hook && g4emu_fail_hook() != 0; }

/* A synchronising call: a pending fault becomes the context's sticky error. */
static cudaError_t g4emu_sync_fault(void) {
    if (g4emu_fault_pending) {
        g4emu_fault_pending = false;
        g4emu_sticky = cudaErrorIllegalAddress;
    }
    return g4emu_sticky;
}

static cudaError_t g4emu_ret(cudaError_t e) {
    if (e != cudaSuccess) g4emu_last = e;
    return e;
}

static inline const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (emulated)";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer (emulated)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (emulated)";
    default: return "injected failure (emulated)";
    }
}

static inline cudaError_t cudaGetLastError(void) {
    cudaError_t e = g4emu_last;
    if (g4emu_sticky != cudaSuccess) return g4emu_sticky; /* not cleared */
    g4emu_last = cudaSuccess;
    return e;
}

static inline cudaError_t cudaGetDeviceCount(int *n) {
    if (g4emu_injected()) return g4emu_ret(cudaErrorUnknown);
    *n = 1;
    return cudaSuccess;
}

static int g4emu_sms = 2; /* multiprocessors the emulated device reports */
extern "C" void g4emu_set_sms(int n) { g4emu_sms = n; }

enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };

static inline cudaError_t cudaGetDevice(int *dev) {
    if (g4emu_injected()) return g4emu_ret(cudaErrorUnknown);
    *dev = 0;
    return cudaSuccess;
}

static inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int dev) {
    if (g4emu_injected() || dev != 0 || attr != cudaDevAttrMultiProcessorCount) return g4emu_ret(cudaErrorInvalidValue);
    *v = g4emu_sms;
    return cudaSuccess;
}

static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (g4emu_injected() || dev != 0) return g4emu_ret(cudaErrorInvalidValue);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host emulation (tests/cuda_emu.h)");
    p->major = 0;
    return cudaSuccess;
}

/* --------------------------------------------------------- device memory */

#define G4EMU_MAX_ALLOCS 4096
static struct { unsigned char *p; size_t n; } g4emu_allocs[G4EMU_MAX_ALLOCS];
static int g4emu_nallocs; /* entries in use are below this */

/* Is [p, p+n) inside one device allocation? */
static bool g4emu_is_device(const void *p, size_t n) {
    const unsigned char *c = (const unsigned char *)p;
    for (int i = 0; i < g4emu_nallocs; i++)
        if (g4emu_allocs[i].p && c >= g4emu_allocs[i].p && c + n <= g4emu_allocs[i].p + g4emu_allocs[i].n) return true;
    return false;
}

static inline cudaError_t cudaMalloc(void **p, size_t n) {
    if (g4emu_sticky != cudaSuccess) return g4emu_sticky;
    if (g4emu_injected()) return g4emu_ret(cudaErrorMemoryAllocation);
    for (int i = 0; i < G4EMU_MAX_ALLOCS; i++)
        if (!g4emu_allocs[i].p) {
            void *q = NULL;
            if (posix_memalign(&q, 256, n ? n : 1) != 0) return g4emu_ret(cudaErrorMemoryAllocation);
            g4emu_allocs[i].p = (unsigned char *)q;
            g4emu_allocs[i].n = n;
            if (i >= g4emu_nallocs) g4emu_nallocs = i + 1;
            *p = q;
            return cudaSuccess;
        }
    return g4emu_ret(cudaErrorMemoryAllocation);
}
template <class T> static inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }

static inline cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    for (int i = 0; i < g4emu_nallocs; i++)
        if (g4emu_allocs[i].p == p) {
            free(p);
            g4emu_allocs[i].p = NULL;
            return cudaSuccess;
        }
    return g4emu_ret(cudaErrorInvalidDevicePointer);
}

static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    bool dd = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyHostToDevice;
    bool sd = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDeviceToHost;
    if (g4emu_sync_fault() != cudaSuccess) return g4emu_sticky;
    if (g4emu_injected()) return g4emu_ret(cudaErrorUnknown);
    if (n == 0) return cudaSuccess;
    if (g4emu_is_device(dst, n) != dd || g4emu_is_device(src, n) != sd) {
        fprintf(stderr, "cuda_emu: cudaMemcpy kind %d with dst %s device memory and src %s device memory\n", (int)kind,
                g4emu_is_device(dst, n) ? "in" : "not in", g4emu_is_device(src, n) ? "in" : "not in");
        return g4emu_ret(cudaErrorInvalidValue);
    }
    memmove(dst, src, n);
    return cudaSuccess;
}

static inline cudaError_t cudaMemset(void *p, int v, size_t n) {
    if (g4emu_sync_fault() != cudaSuccess) return g4emu_sticky;
    if (g4emu_injected()) return g4emu_ret(cudaErrorUnknown);
    if (!g4emu_is_device(p, n)) return g4emu_ret(cudaErrorInvalidValue);
    memset(p, v, n);
    return cudaSuccess;
}

static inline cudaError_t cudaDeviceSynchronize(void) {
    if (g4emu_sync_fault() != cudaSuccess) return g4emu_sticky;
    if (g4emu_injected()) return g4emu_ret(cudaErrorUnknown);
    return cudaSuccess;
}

/* ---------------------------------------------------------------- fibers */
/* A fiber switch saves the callee-saved registers on the current stack and
   moves to another (the floating-point control state is shared: nothing in
   the kernels changes it). On x86-64 this is a few instructions (no system call);
   elsewhere, or with G4EMU_UCONTEXT, glibc's swapcontext (which also saves
   the signal mask with a system call per switch: correct, but far slower). */

#define G4EMU_STACK (256 * 1024)

/* The scheduler below is the test's machinery, not code under test: in the
   sanitized build (make test's cuda_emu_san) it runs uninstrumented, which
   took that suite from 169 to 119 s on the Zen 3; the kernels, and the
   runtime calls above, stay instrumented. */
#if defined(__GNUC__) || defined(__clang__)
#define G4EMU_NOSAN __attribute__((no_sanitize("address", "undefined")))
#else
#define G4EMU_NOSAN
#endif
#define G4EMU_MAX_THREADS 1024

enum { G4EMU_RUNNING, G4EMU_BARRIER, G4EMU_WARP, G4EMU_DONE };

static void (*g4emu_body)(void *);
static void *g4emu_arg;
static const char *g4emu_kernel;
static int g4emu_cur;
static void g4emu_fiber_main(void);

#if defined(__x86_64__) && !defined(G4EMU_UCONTEXT)
/* void g4emu_switch(void **save_sp, void *load_sp) */
extern "C" void g4emu_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".globl g4emu_switch\n"
        ".type g4emu_switch,@function\n"
        "g4emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size g4emu_switch, .-g4emu_switch\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");

static struct {
    void *sp;
    char *stack;
    int state;
} g4emu_fiber[G4EMU_MAX_THREADS];
static void *g4emu_sched_sp;

/* A fresh stack whose first switch "returns" into g4emu_fiber_main. */
static void g4emu_fiber_init(int i) {
    uintptr_t top = ((uintptr_t)(g4emu_fiber[i].stack + G4EMU_STACK)) & ~(uintptr_t)15;
    uint64_t *a = (uint64_t *)(top - 16); /* return address slot: 16-aligned, as after a call */
    a[0] = (uint64_t)(uintptr_t)&g4emu_fiber_main;
    a[1] = 0;
    for (int k = 1; k <= 6; k++) a[-k] = 0; /* rbp rbx r12 r13 r14 r15 */
    g4emu_fiber[i].sp = &a[-6];
}
G4EMU_NOSAN static void g4emu_to_fiber(int i) { g4emu_switch(&g4emu_sched_sp, g4emu_fiber[i].sp); }
G4EMU_NOSAN static void g4emu_to_sched(void) { g4emu_switch(&g4emu_fiber[g4emu_cur].sp, g4emu_sched_sp); }
#else
static struct {
    ucontext_t ctx;
    char *stack;
    int state;
    int ready;
} g4emu_fiber[G4EMU_MAX_THREADS];
static ucontext_t g4emu_sched;

static void g4emu_fiber_init(int i) {
    if (!g4emu_fiber[i].ready) { getcontext(&g4emu_fiber[i].ctx); g4emu_fiber[i].ready = 1; }
    g4emu_fiber[i].ctx.uc_stack.ss_sp = g4emu_fiber[i].stack;
    g4emu_fiber[i].ctx.uc_stack.ss_size = G4EMU_STACK;
    g4emu_fiber[i].ctx.uc_link = NULL;
    makecontext(&g4emu_fiber[i].ctx, g4emu_fiber_main, 0);
}
G4EMU_NOSAN static void g4emu_to_fiber(int i) { swapcontext(&g4emu_sched, &g4emu_fiber[i].ctx); }
G4EMU_NOSAN static void g4emu_to_sched(void) { swapcontext(&g4emu_fiber[g4emu_cur].ctx, &g4emu_sched); }
#endif

/* A thread's whole life: the kernel, then back to the scheduler for good. */
static void g4emu_fiber_main(void) {
    g4emu_body(g4emu_arg);
    g4emu_fiber[g4emu_cur].state = G4EMU_DONE;
    g4emu_to_sched();
    abort(); /* a finished fiber is never resumed */
}

static inline void __syncthreads(void) {
    g4emu_fiber[g4emu_cur].state = G4EMU_BARRIER;
    g4emu_to_sched();
}

/* Warp barriers: each lane's value of its n-th shuffle in slot n % 2 (a lane
   can be at most one shuffle ahead of the slowest lane of its warp). */
static unsigned g4emu_lane_val[2][G4EMU_MAX_THREADS];
static unsigned g4emu_lane_n[G4EMU_MAX_THREADS];
static int g4emu_nthreads;

G4EMU_NOSAN static unsigned g4emu_warp_exchange(unsigned mask, unsigned v, int src_lane) {
    int me = g4emu_cur, base = me & ~31, slot = (int)(g4emu_lane_n[me]++ & 1u);
    if (mask != 0xffffffffu) {
        fprintf(stderr, "cuda_emu: %s: warp primitive with a partial mask %#x (not emulated)\n", g4emu_kernel, mask);
        abort();
    }
    g4emu_lane_val[slot][me] = v;
    g4emu_fiber[me].state = G4EMU_WARP;
    g4emu_to_sched();
    if (src_lane < 0 || base + src_lane >= g4emu_nthreads) return v; /* outside the warp: its own value */
    return g4emu_lane_val[slot][base + src_lane];
}

static inline int g4emu_lane(void) { return g4emu_cur & 31; }

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for one warp, each
   lane passing its fragments as the PTX ISA lays them out (groupID g = lane
   / 4, t = lane % 4; a pair of bf16 in a register, the lower index in the low
   half): a[0] A[g][2t..], a[1] A[g+8][2t..], a[2] A[g][2t+8..], a[3]
   A[g+8][2t+8..]; b[0] B[2t..][g], b[1] B[2t+8..][g]; c and d [0] (g, 2t),
   [1] (g, 2t+1), [2] (g+8, 2t), [3] (g+8, 2t+1). A warp barrier, then each
   lane sums its outputs in k order with fmaf (a tensor core's internal
   order is its own: the tests bound the difference, never assume bits). */
static unsigned g4emu_mma_a[2][G4EMU_MAX_THREADS][4], g4emu_mma_b[2][G4EMU_MAX_THREADS][2];

static inline float g4emu_bf16_half(unsigned reg, int k) {
    unsigned h = k & 1 ? reg >> 16 : reg & 0xffffu;
    float f;
    h <<= 16;
    memcpy(&f, &h, 4);
    return f;
}

static long g4emu_mma_n;
extern "C" long g4emu_mmas(void) { return g4emu_mma_n; } /* warp MMAs issued so far */

static void g4emu_mma_bf16_16816(float *d, const unsigned *a, const unsigned *b, const float *c) {
    int me = g4emu_cur, base = me & ~31, slot = (int)(g4emu_lane_n[me] & 1u), l = me & 31, g = l / 4, t = l % 4;
    if (g4emu_nthreads < base + 32) {
        fprintf(stderr, "cuda_emu: %s: mma needs a whole warp of 32 threads\n", g4emu_kernel);
        abort();
    }
    if (l == 0) g4emu_mma_n++;
    memcpy(g4emu_mma_a[slot][me], a, sizeof g4emu_mma_a[0][0]);
    memcpy(g4emu_mma_b[slot][me], b, sizeof g4emu_mma_b[0][0]);
    (void)g4emu_warp_exchange(0xffffffffu, 0, -1); /* every lane's fragments are in */
    for (int o = 0; o < 4; o++) {
        int row = g + (o >= 2 ? 8 : 0), col = 2 * t + (o & 1);
        float acc = c[o];
        for (int k = 0; k < 16; k++) {
            int la = base + (row % 8) * 4 + (k % 8) / 2, lb = base + col * 4 + (k % 8) / 2;
            float av = g4emu_bf16_half(g4emu_mma_a[slot][la][(row >= 8) + 2 * (k >= 8)], k);
            float bv = g4emu_bf16_half(g4emu_mma_b[slot][lb][k >= 8], k);
            acc = fmaf(av, bv, acc);
        }
        d[o] = acc;
    }
}

template <class T> static inline T g4emu_shfl(unsigned mask, T v, int src) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    unsigned u, r;
    T out;
    memcpy(&u, &v, 4);
    r = g4emu_warp_exchange(mask, u, src);
    memcpy(&out, &r, 4);
    return out;
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    int l = g4emu_lane(), src = (l & ~(width - 1)) | ((l ^ lane_mask) & (width - 1));
    return g4emu_shfl(mask, v, src);
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    int l = g4emu_lane(), src = l + (int)delta;
    if ((src & ~(width - 1)) != (l & ~(width - 1))) src = l; /* past the segment: unchanged */
    return g4emu_shfl(mask, v, src);
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    int l = g4emu_lane();
    return g4emu_shfl(mask, v, (l & ~(width - 1)) + (src_lane & (width - 1)));
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)g4emu_warp_exchange(mask, 0, -1); }

G4EMU_NOSAN static void g4emu_set_thread(int i) {
    g4emu_cur = i;
    if (blockDim.y == 1 && blockDim.z == 1) { /* no divisions on the common path */
        threadIdx.x = (unsigned)i;
        threadIdx.y = threadIdx.z = 0;
        return;
    }
    threadIdx.x = (unsigned)i % blockDim.x;
    threadIdx.y = (unsigned)i / blockDim.x % blockDim.y;
    threadIdx.z = (unsigned)i / (blockDim.x * blockDim.y);
}

/* The order in which a round resumes the threads: a fresh permutation each
   time (a fixed-seed generator, so runs repeat), so that a read that lacks
   the __syncthreads before it sees stale data in some round instead of
   always running after the write, as it would in thread order. */
static int g4emu_order[G4EMU_MAX_THREADS];
static uint32_t g4emu_seed = 0x9e3779b9u;

G4EMU_NOSAN static void g4emu_shuffle(int n) {
    for (int i = 0; i < n; i++) g4emu_order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j, t;
        g4emu_seed = g4emu_seed * 1664525u + 1013904223u;
        j = (int)((g4emu_seed >> 8) % (uint32_t)(i + 1));
        t = g4emu_order[i];
        g4emu_order[i] = g4emu_order[j];
        g4emu_order[j] = t;
    }
}

/* One block: all its threads as fibers, released barrier by barrier. Each
   round resumes every thread that may go on: a fresh one, one at
   __syncthreads once all of the block waits there, one at a warp barrier once
   all of its warp does. */
G4EMU_NOSAN static void g4emu_run_block(int nthreads) {
    int alive = nthreads;
    static char warp_ready[G4EMU_MAX_THREADS / 32];
    g4emu_nthreads = nthreads;
    for (int i = 0; i < nthreads; i++) {
        if (!g4emu_fiber[i].stack) {
            g4emu_fiber[i].stack = (char *)malloc(G4EMU_STACK);
            if (!g4emu_fiber[i].stack) { fprintf(stderr, "cuda_emu: out of memory for fiber stacks\n"); abort(); }
        }
        g4emu_fiber_init(i);
        g4emu_fiber[i].state = G4EMU_RUNNING;
        g4emu_lane_n[i] = 0;
    }
    while (alive > 0) {
        int waiting = 0, done = 0, at_warp = 0, ran = 0, block_ready, split_warp = 0;
        for (int i = 0; i < nthreads; i++) {
            waiting += g4emu_fiber[i].state == G4EMU_BARRIER;
            done += g4emu_fiber[i].state == G4EMU_DONE;
            at_warp += g4emu_fiber[i].state == G4EMU_WARP;
        }
        block_ready = waiting == nthreads - done;
        for (int w = 0; w * 32 < nthreads; w++) {
            int lanes_at = 0, lanes_done = 0, lanes = 0;
            for (int i = w * 32; i < nthreads && i < w * 32 + 32; i++, lanes++) {
                lanes_at += g4emu_fiber[i].state == G4EMU_WARP;
                lanes_done += g4emu_fiber[i].state == G4EMU_DONE;
            }
            warp_ready[w] = lanes_at == lanes;
            if (lanes_at && lanes_done) split_warp = 1; /* a lane exited while its warp waits for it */
        }
        if ((waiting && done) || split_warp) {
            fprintf(stderr, "cuda_emu: barrier divergence in %s block (%u,%u): %d threads exited, %d wait at "
                    "__syncthreads, %d at a warp barrier\n", g4emu_kernel, blockIdx.x, blockIdx.y, done, waiting, at_warp);
            abort();
        }
        g4emu_shuffle(nthreads);
        for (int j = 0; j < nthreads; j++) {
            int i = g4emu_order[j], st = g4emu_fiber[i].state;
            if (st == G4EMU_DONE || (st == G4EMU_BARRIER && !block_ready) || (st == G4EMU_WARP && !warp_ready[i / 32]))
                continue;
            g4emu_set_thread(i);
            g4emu_fiber[i].state = G4EMU_RUNNING;
            g4emu_to_fiber(i);
            ran++;
        }
        /* then each warp through its run of warp barriers (the shuffles of a
           reduction) at once, its lanes in a fresh order each time, until it
           reaches __syncthreads or its end */
        for (int w = 0; w * 32 < nthreads; w++) {
            int lo = w * 32, cnt = nthreads - lo < 32 ? nthreads - lo : 32;
            for (;;) {
                int all = 1;
                for (int i = lo; i < lo + cnt; i++) all &= g4emu_fiber[i].state == G4EMU_WARP;
                if (!all) break;
                g4emu_shuffle(cnt);
                for (int j = 0; j < cnt; j++) {
                    int i = lo + g4emu_order[j];
                    g4emu_set_thread(i);
                    g4emu_fiber[i].state = G4EMU_RUNNING;
                    g4emu_to_fiber(i);
                    ran++;
                }
            }
        }
        if (!ran) {
            fprintf(stderr, "cuda_emu: deadlock in %s block (%u,%u): %d threads wait at __syncthreads, %d at a warp "
                    "barrier (a warp split between the two)\n", g4emu_kernel, blockIdx.x, blockIdx.y, waiting, at_warp);
            abort();
        }
        done = 0;
        for (int i = 0; i < nthreads; i++) done += g4emu_fiber[i].state == G4EMU_DONE;
        alive = nthreads - done;
    }
}

/* launch counts by kernel name */
#define G4EMU_MAX_KERNELS 128
static struct { const char *name; long n; } g4emu_count[G4EMU_MAX_KERNELS];

extern "C" long g4emu_launches(const char *name) {
    for (int i = 0; i < G4EMU_MAX_KERNELS && g4emu_count[i].name; i++)
        if (strcmp(g4emu_count[i].name, name) == 0) return g4emu_count[i].n;
    return 0;
}

/* A step coprime with n, so first + b * step (mod n) visits every block once. */
static unsigned long g4emu_stride(unsigned long n) {
    unsigned long a = n, b = 7;
    while (b) { unsigned long t = a % b; a = b; b = t; }
    return a == 1 ? 7 : 1;
}

template <class F> static void g4emu_trampoline(void *f) { (*(F *)f)(); }

template <class F> static void g4emu_launch(const char *name, dim3 grid, dim3 block, F f) {
    unsigned long nthreads = (unsigned long)block.x * block.y * block.z;
    int i;
    if (g4emu_injected() || nthreads < 1 || nthreads > G4EMU_MAX_THREADS || !grid.x || !grid.y || !grid.z) {
        g4emu_ret(nthreads < 1 || nthreads > G4EMU_MAX_THREADS || !grid.x ? cudaErrorInvalidConfiguration
                                                                          : cudaErrorUnknown);
        return;
    }
    if (g4emu_sticky != cudaSuccess) { g4emu_last = g4emu_sticky; return; }
    for (i = 0; i < G4EMU_MAX_KERNELS - 1 && g4emu_count[i].name && strcmp(g4emu_count[i].name, name) != 0; i++) {}
    g4emu_count[i].name = name;
    g4emu_count[i].n++;
    if (g4emu_fault_kernel && strcmp(g4emu_fault_kernel, name) == 0 && --g4emu_fault_count == 0) {
        g4emu_fault_kernel = NULL;
        g4emu_fault_pending = true; /* reported by the next synchronising call */
    }
    if (g4emu_fault_pending) return; /* a faulted context runs nothing more */
    g4emu_kernel = name;
    g4emu_body = g4emu_trampoline<F>;
    g4emu_arg = &f;
    gridDim = grid;
    blockDim = block;
    /* blocks one at a time, in a shuffled order (a GPU promises none) */
    unsigned long nblocks = (unsigned long)grid.x * grid.y * grid.z, first = 0;
    if (nblocks > 1) { g4emu_seed = g4emu_seed * 1664525u + 1013904223u; first = (g4emu_seed >> 8) % nblocks; }
#if defined(__x86_64__) || defined(__i386__)
    unsigned csr = _mm_getcsr();
    if (g4emu_ftz_on) _mm_setcsr(csr | 0x8040u); /* FTZ | DAZ */
#endif
    for (unsigned long b = 0; b < nblocks; b++) {
        unsigned long lin = (first + b * g4emu_stride(nblocks)) % nblocks;
        blockIdx = dim3((unsigned)(lin % grid.x), (unsigned)(lin / grid.x % grid.y), (unsigned)(lin / ((unsigned long)grid.x * grid.y)));
        g4emu_run_block((int)nthreads);
    }
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(csr);
#endif
    g4emu_arg = NULL; /* the closure lives only for this launch */
}

#define G4C_LAUNCH(kernel, grid, block, ...) \
    g4emu_launch(#kernel, dim3(grid), dim3(block), [&]() { kernel(__VA_ARGS__); })

#endif /* G4_CUDA_EMU_H */
