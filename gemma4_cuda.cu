/* gemma4_cuda.cu - the CUDA twin of gemma4.h's forward pass.   MIT-0, see LICENSE

   gemma4.h's scalar C forward pass is the reference; this file mirrors it op
   by op (llm.c's style): one kernel per CPU operation, launched in the same
   order, reading the same plan and the same shared-KV table. Declarations live
   in gemma4.h behind GEMMA4_CUDA.

   BUILD
       nvcc -O2 -std=c++17 -fmad=false -arch=sm_90 -c gemma4_cuda.cu -o gemma4_cuda.o
       cc -DGEMMA4_CUDA -c app.c            (app.c defines GEMMA4_IMPLEMENTATION)
       nvcc app.o gemma4_cuda.o -o app      (or: c++ ... -lcudart)
   `make cuda` builds it for sm_80 and sm_90 (and compute_90 PTX for newer
   GPUs) with warnings as errors. Never with -use_fast_math: session init
   refuses a device build that fuses products, flushes denormals or divides
   or takes square roots inexactly (g4c_fp_probe). The same file also
   compiles as plain host C++ against tests/cuda_emu.h (a CUDA runtime
   emulator: every thread of a block is a fiber), which is how the tests run
   it on machines without a GPU: `make test-cuda-emu`.

   NUMERICS (the exact mode: the same bits as the CPU path)
     Every kernel sums in the CPU path's order (a matmul output, a dot product
     of attention, the softmax denominator and the MoE combination are each a
     sequential loop), and products are not contracted into FMAs (__fmul_rn,
     __fadd_rn here; the header's G4__HD helpers that the kernels call as they
     are - the torch-order sums, top-k, softmax, bf16 rounding, GELU, exp and
     tanh - are built with nvcc -fmad=false). No device libm function is
     called: exp (softmax, router) and tanh (soft-cap) are the header's
     g4__expf / g4__tanhf, built from IEEE double operations, which the CPU
     path calls too; RoPE's cos and sin are made on the host by the CPU's own
     g4__rope_cos_sin for each step's positions and uploaded; sqrtf and
     division are IEEE (correctly rounded) on the device. The RMSNorm sum of
     squares is torch's float32 order, as on the CPU (32 lanes, one thread
     each), and in the bf16 mode a bf16 weight's matmul sums in torch's bf16
     F.linear order (g4c_matmul_torch, as g4__matmul_torch_ref). The
     bf16-faithful mode (cfg.bf16) rounds where the CPU's g4__act does: a
     g4c_round launch after a plain op, and between the steps of a fused
     kernel (its `bf` argument).

   ERRORS
     Every runtime call and launch is checked. A step that fails keeps
     nothing: the session's position and the shared-KV table (host and
     device) are as before it, so it can be run again. Kernel faults are
     asynchronous: each step ends with a cudaDeviceSynchronize, so a fault is
     reported under the step (its positions) that caused it; a fault is also
     sticky - the CUDA context is then unusable and every later call fails -
     and the message says so.

   MEMORY
     g4_cuda_model_upload: one cudaMalloc holding every tensor the plan uses,
     as stored (BF16, F16 or F32). g4_cuda_session_init: nothing is allocated;
     the caller's device arena holds the K/V of owner layers, the shared-KV
     table (the kernels read K/V through it) and every scratch buffer; the
     caller's host arena holds the host's mirror of the table and the staging
     rows for taps. g4_cuda_forward allocates nothing.

   FAST MODE (g4_cuda_config.fast)
     Beside the exact mode, which stays the oracle: a warp-per-row bf16
     matrix-vector kernel with 16-byte loads and split-K, flash attention
     (flash-decoding splits for a decode step, a bf16 K/V cache in the bf16
     mode, no score buffer) and fused norms/RoPE/K-V append/GELU/soft-cap;
     bounded against the exact mode by the tests (see its section). The
     same plan, table, taps and arena rules.

   MAP (section markers)
     utilities, device, kernels      the exact mode's device code
     launchers, forward pass         the exact mode's host side
     fast mode, fast launchers       g4_cuda_config.fast (calls the exact kernels
                                     it does not replace)
     public                          g4_cuda_*: upload, sessions, forward
*/
/* gemma4.h's implementation as a private static copy (GEMMA4_STATIC): the
   kernels' host side reuses its arena carver, RoPE table and session checks,
   and nothing clashes with the program's own GEMMA4_IMPLEMENTATION. The
   g4_cuda_* functions stay extern (G4_CUDA_API). */
/* The exact mode needs IEEE arithmetic on the device: -use_fast_math flushes
   denormals, approximates division and sqrt and fuses products into FMAs.
   Build with -fmad=false and without -use_fast_math (as `make cuda` does).
   The host side's -ffast-math is refused by gemma4.h (__FAST_MATH__); nvcc
   13 defines no macro for -use_fast_math (older ones defined
   __USE_FAST_MATH__, refused here), so g4_cuda_session_init runs a probe
   kernel (g4c_fp_probe) and refuses a device build that contracts, flushes
   denormals or divides or takes square roots inexactly. */
#if defined(__USE_FAST_MATH__)
#error "gemma4_cuda.cu: built with -use_fast_math; the exact mode needs IEEE arithmetic: build without it (and with -fmad=false)"
#endif
#define GEMMA4_CUDA
#define GEMMA4_STATIC
#define G4_NO_MMAP
#define GEMMA4_IMPLEMENTATION
#include "gemma4.h"

#ifndef G4_CUDA_EMULATE
#include <cuda_runtime.h>
#define G4C_LAUNCH(kernel, grid, block, ...) kernel<<<(grid), (block)>>>(__VA_ARGS__)
#endif

/* Threads per block (a power of two: the reductions are trees) and the most
   blocks a launch uses; every kernel strides over its work, so any grid size
   computes the same result. The emulated build uses small values. */
#ifndef G4C_THREADS
#define G4C_THREADS 256
#endif
#ifndef G4C_MAX_BLOCKS
#define G4C_MAX_BLOCKS 65535
#endif
#ifndef G4C_TILE
#define G4C_TILE 16 /* tiled matmul: TILE x TILE threads, TILE x TILE outputs per block */
#endif

/* Products and sums exactly as the CPU path rounds them: no FMA contraction. */
#define G4C_MUL(a, b) __fmul_rn((a), (b))
#define G4C_ADD(a, b) __fadd_rn((a), (b))
#define G4C_SUB(a, b) __fsub_rn((a), (b))

/* ------------------------------------------------------------ utilities */

/* Every CUDA runtime call goes through this: on failure the object's .error
   names the call, the file and line, and the runtime's message. The error is
   also taken off the runtime's last-error slot, so that a later launch's
   check (cudaGetLastError) does not report it again as its own. */
#define G4C_CHECK(err, call)                                                                            \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess) {                                                                        \
            g4__seterr((err), "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));   \
            (void)cudaGetLastError();                                                                   \
            return G4_ERR_CUDA;                                                                         \
        }                                                                                               \
    } while (0)

/* A kernel launch, then the launch's own error (bad configuration, no device). */
#define G4C_RUN(err, kernel, grid, block, ...)                                                          \
    do {                                                                                                \
        cudaError_t e_;                                                                                 \
        G4C_LAUNCH(kernel, grid, block, __VA_ARGS__);                                                   \
        if ((e_ = cudaGetLastError()) != cudaSuccess) {                                                 \
            g4__seterr((err), "%s:%d: launch of %s failed: %s", __FILE__, __LINE__, #kernel,            \
                       cudaGetErrorString(e_));                                                         \
            return G4_ERR_CUDA;                                                                         \
        }                                                                                               \
    } while (0)

/* a slot now holds positions [oldest, n_pos): its ring keeps the last
   `capacity` (the CPU's rule; the CUDA path has no rewind, so oldest only
   follows n_pos) */
static void g4c__held(g4_kv_slot *sl, int n_pos) {
    sl->n_pos = n_pos;
    sl->oldest = n_pos > sl->capacity ? n_pos - sl->capacity : 0;
}

static unsigned g4c__grid(size_t work, unsigned per_block) {
    size_t b = (work + per_block - 1) / per_block;
    if (b < 1) b = 1;
    return b > G4C_MAX_BLOCKS ? (unsigned)G4C_MAX_BLOCKS : (unsigned)b;
}

/* every thread of the grid over [0, n) */
#define G4C_FOR(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)(n); \
                           i += (size_t)gridDim.x * blockDim.x)
/* every block over rows [0, n); all threads of a block take the same rows */
#define G4C_ROWS(r, n) for (int r = (int)blockIdx.x; r < (n); r += (int)gridDim.x)

/* ---------------------------------------------------------------- device */

/* Element i of a weight tensor as float32 (g4__get on the CPU). */
__device__ static float g4c__ld(const void *p, int dtype, size_t i) {
    if (dtype == G4_BF16) return g4__bf16_to_f32(((const uint16_t *)p)[i]);
    if (dtype == G4_F16) return g4__f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* g4__gelu_torch_n for element i of a tensor of `total` (bf16 mode): ATen's
   scalar tail (the last total % 32) has no exact tanh 1 */
__device__ static float g4c__gelu_t(float x, int bf, size_t i, size_t total) {
    return g4__gelu_x(x, !(bf && i >= (total & ~(size_t)31)));
}

/* ---------------------------------------------------------------- kernels */
/* One kernel per CPU operation, named after it. A kernel that fuses several
   CPU steps takes `bf` (the bf16-faithful mode) and rounds between them as
   the CPU's g4__act does; a plain op is followed by g4c_round instead. */

/* g4__act: x to bf16, in place */
__global__ void g4c_round(float *x, size_t n) {
    G4C_FOR(i, n) x[i] = g4__bf16_round(x[i]);
}

/* IEEE arithmetic on the device, checked at session init against the host
   (g4c__ieee_check): a * b + c not fused (g4__fp_contract_probe), a
   subnormal kept, division and sqrtf correctly rounded. */
#define G4C_PROBE_IN 12
#define G4C_PROBE_OUT 10
__global__ void g4c_fp_probe(float *out, const float *in) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    out[0] = g4__fp_contract_probe(in[0], in[0], in[1]);
    out[1] = in[2] * in[3];
    for (int i = 0; i < 4; i++) {
        out[2 + i] = in[4 + i] / in[8 + i];
        out[6 + i] = sqrtf(in[4 + i]);
    }
}

/* g4__step's embedding: x[t][i] = E[ids[t]][i] * scale */
__global__ void g4c_embed(float *x, const void *E, int dt, const int32_t *ids, int n, int H, float scale) {
    G4C_FOR(i, (size_t)n * H) x[i] = G4C_MUL(g4c__ld(E, dt, (size_t)ids[i / H] * H + i % H), scale);
}

/* g4__matmul: y[t][o] = sum_i x[t][i] * W[o][i], one thread per output, i in order */
__global__ void g4c_matmul(float *y, const float *x, const void *W, int dt, int n, int in, int out) {
    G4C_FOR(idx, (size_t)n * out) {
        size_t t = idx / out, o = idx % out;
        const float *xt = x + t * in;
        float acc = 0.0f;
        for (int i = 0; i < in; i++) acc = G4C_ADD(acc, G4C_MUL(xt[i], g4c__ld(W, dt, o * in + i)));
        y[idx] = acc;
    }
}

/* g4__matmul, tiled through shared memory: a TILE x TILE block computes TILE
   tokens x TILE outputs, staging TILE-wide slices of x and W. Each output
   still sums i in order, so it equals g4c_matmul bit for bit. */
__global__ void g4c_matmul_tiled(float *y, const float *x, const void *W, int dt, int n, int in, int out) {
    __shared__ float xs[G4C_TILE][G4C_TILE + 1], ws[G4C_TILE][G4C_TILE + 1];
    int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    int tiles_o = (out + G4C_TILE - 1) / G4C_TILE, tiles_t = (n + G4C_TILE - 1) / G4C_TILE;
    G4C_ROWS(tile, tiles_o * tiles_t) {
        int o0 = (tile % tiles_o) * G4C_TILE, t0 = (tile / tiles_o) * G4C_TILE;
        float acc = 0.0f;
        for (int k0 = 0; k0 < in; k0 += G4C_TILE) {
            int kmax = in - k0 < G4C_TILE ? in - k0 : G4C_TILE;
            xs[ty][tx] = t0 + ty < n && tx < kmax ? x[(size_t)(t0 + ty) * in + k0 + tx] : 0.0f;
            ws[ty][tx] = o0 + ty < out && tx < kmax ? g4c__ld(W, dt, (size_t)(o0 + ty) * in + k0 + tx) : 0.0f;
            __syncthreads();
            for (int k = 0; k < kmax; k++) acc = G4C_ADD(acc, G4C_MUL(xs[ty][k], ws[tx][k]));
            __syncthreads();
        }
        if (t0 + ty < n && o0 + tx < out) y[(size_t)(t0 + ty) * out + o0 + tx] = acc;
    }
}

/* g4__matmul_torch_ref (the bf16 mode, bf16 weights): one thread per output,
   summed in torch's bf16 F.linear order (the header's g4__dot_torch_bf16) */
__global__ void g4c_matmul_torch(float *y, const float *x, const uint16_t *W, int n, int in, int out) {
    G4C_FOR(idx, (size_t)n * out) y[idx] = g4__dot_torch_bf16(x + (idx / out) * in, W + (idx % out) * in, in);
}


/* g4__rmsnorm on `rows` rows of n: y = x * (mean(x^2) + eps)^-0.5 (* w when
   w != NULL). One block per row; its first 32 threads compute torch's 32
   lane sums of squares (g4__sum_squares), thread 0 finishes the sum. */
__global__ void g4c_rmsnorm(float *y, const float *x, const void *w, int dt, int rows, int n, float eps) {
    __shared__ float part[G4__TSUM_ILP * G4__TSUM_VL];
    __shared__ float inv_s;
    int tid = (int)threadIdx.x;
    G4C_ROWS(r, rows) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        if (n >= G4__TSUM_VL && tid < G4__TSUM_ILP * G4__TSUM_VL)
            part[tid] = g4__tsum_lane(xr, n / G4__TSUM_VL / G4__TSUM_ILP, tid / G4__TSUM_VL, tid % G4__TSUM_VL);
        __syncthreads();
        if (tid == 0) inv_s = __fdiv_rn(1.0f, sqrtf(G4C_ADD(__fdiv_rn(g4__sum_squares_finish(part, xr, n), (float)n), eps)));
        __syncthreads();
        float inv = inv_s;
        for (int i = tid; i < n; i += (int)blockDim.x)
            yr[i] = w ? G4C_MUL(G4C_MUL(xr[i], inv), g4c__ld(w, dt, (size_t)i)) : G4C_MUL(xr[i], inv);
        __syncthreads(); /* part and inv_s are read by all before the next row overwrites them */
    }
}

/* g4__rope on rows of `heads` heads of D: token t = row / heads takes its
   cos/sin from cs[t * stride + j] and sn[t * stride + j], which the host made
   with the CPU's own g4__rope_cos_sin (g4c__rope_tables); the rotation is the
   CPU's g4__rope_pair */
__global__ void g4c_rope(float *x, const float *cs, const float *sn, int stride, int rows, int heads, int D, int bf) {
    int half = D / 2;
    G4C_FOR(idx, (size_t)rows * half) {
        size_t r = idx / half, t = r / heads;
        int j = (int)(idx % half);
        g4__rope_pair(x + r * D, j, half, cs[t * stride + j], sn[t * stride + j], bf);
    }
}

/* g4__attention's append: the chunk's K/V rows into the owner's slot (row
   p % capacity), then the slot holds positions up to pos0 + n. */
__global__ void g4c_kv_append(g4_kv_slot *slots, int slot, const float *k, const float *v, int n, int pos0) {
    /* fields read one by one: block 0's thread 0 writes n_pos meanwhile */
    int cap = slots[slot].capacity;
    size_t W = (size_t)slots[slot].kv_heads * slots[slot].head_dim;
    float *sk = slots[slot].k, *sv = slots[slot].v;
    G4C_FOR(idx, (size_t)n * W) {
        size_t t = idx / W, row = (size_t)((pos0 + (int)t) % cap);
        sk[row * W + idx % W] = k[idx];
        sv[row * W + idx % W] = v[idx];
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) slots[slot].n_pos = pos0 + n;
}

/* reader_copies (the tests' debug layout, g4__cuda_session_init_testing):
   this step's rows of the owner's slot into the reader's private slot. */
__global__ void g4c_kv_copy(g4_kv_slot *slots, int src, int dst, int n, int pos0) {
    int ca = slots[src].capacity, cb = slots[dst].capacity;
    size_t W = (size_t)slots[src].kv_heads * slots[src].head_dim;
    const float *ak = slots[src].k, *av = slots[src].v;
    float *bk = slots[dst].k, *bv = slots[dst].v;
    G4C_FOR(idx, (size_t)n * W) {
        int p = pos0 + (int)(idx / W);
        size_t ra = (size_t)(p % ca) * W, rb = (size_t)(p % cb) * W;
        bk[rb + idx % W] = ak[ra + idx % W];
        bv[rb + idx % W] = av[ra + idx % W];
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) slots[dst].n_pos = pos0 + n;
}

/* g4__attend for every (token, head) of the chunk, reading K/V through the
   table. One block per (t, h): scores by key (each a dot product in d order),
   max as a tree, exp, the denominator summed in key order by thread 0 (the
   CPU's order), then out[d] = sum_k p_k v_k[d] in key order.
   Device-side table checks (status: 16 * (layer + 1) + code):
     1: the slot does not hold exactly this step's positions (write once, then read)
     2: the window's oldest key is no longer in the slot's ring */
/* those checks for a block reading keys [lo, n_pos) of slot sl: the code (0:
   fine), which thread 0 records in status */
__device__ static int g4c__slot_check(const g4_kv_slot *sl, int n_pos, int D, int KVH, int lo, int layer, int *status) {
    int code = sl->n_pos != n_pos || sl->head_dim != D || sl->kv_heads != KVH ? 1 : lo < sl->n_pos - sl->capacity ? 2 : 0;
    if (code && threadIdx.x == 0) *status = 16 * (layer + 1) + code;
    return code;
}

__global__ void g4c_attention(float *att, const float *q, const g4_kv_slot *slots, int slot, float *scores, int n,
                              int NH, int KVH, int D, int pos0, int window, int max_ctx, int layer, int *status, int bf,
                              int nq, int len) {
    __shared__ float red[G4C_THREADS];
    int tid = (int)threadIdx.x, group = NH / KVH;
    g4_kv_slot sl = slots[slot];
    size_t stride = (size_t)sl.kv_heads * sl.head_dim;
    G4C_ROWS(r, n * NH) {
        int t = r / NH, h = r % NH, p = pos0 + t, lo = window && p - window + 1 > 0 ? p - window + 1 : 0, cnt;
        const float *qh = q + (size_t)r * D;
        float *sc = scores + (size_t)r * max_ctx, mx;
        if (g4c__slot_check(&sl, pos0 + n, D, KVH, lo, layer, status)) continue;
        cnt = p - lo + 1;
        for (int k = tid; k < cnt; k += (int)blockDim.x) {
            const float *key = sl.k + (size_t)((lo + k) % sl.capacity) * stride + (size_t)(h / group) * D;
            float acc = 0.0f;
            if (bf && (long long)D * nq * len >= 400) acc = g4__dot_torch(qh, key, D); /* g4__attend_torch */
            else
                for (int d = 0; d < D; d++) acc = G4C_ADD(acc, G4C_MUL(qh[d], key[d]));
            sc[k] = g4__act(acc, bf);
        }
        __syncthreads();
        mx = sc[0];
        for (int k = tid; k < cnt; k += (int)blockDim.x) mx = sc[k] > mx ? sc[k] : mx;
        red[tid] = mx;
        __syncthreads();
        for (int s = (int)blockDim.x / 2; s > 0; s /= 2) {
            if (tid < s && red[tid + s] > red[tid]) red[tid] = red[tid + s];
            __syncthreads();
        }
        mx = red[0];
        for (int k = tid; k < cnt; k += (int)blockDim.x)
            sc[k] = bf ? g4__expf_sleef(G4C_SUB(sc[k], mx)) : g4__expf(G4C_SUB(sc[k], mx)); /* g4__softmax's */
        __syncthreads();
        if (tid == 0) {
            float sum = 0.0f;
            if (bf) sum = __fdiv_rn(1.0f, g4__softmax_torch_sum(sc, cnt, lo, len)); /* torch: times 1 / sum */
            else
                for (int k = 0; k < cnt; k++) sum = G4C_ADD(sum, sc[k]);
            red[0] = sum;
        }
        __syncthreads();
        for (int k = tid; k < cnt; k += (int)blockDim.x) sc[k] = bf ? G4C_MUL(sc[k], red[0]) : sc[k] / red[0];
        __syncthreads();
        for (int d = tid; d < D; d += (int)blockDim.x) {
            float acc = 0.0f, part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int k = 0; k < cnt; k++) {
                const float *val = sl.v + (size_t)((lo + k) % sl.capacity) * stride + (size_t)(h / group) * D;
                float pv = G4C_MUL(g4__act(sc[k], bf), val[d]);
                if (bf) { /* gemm_notrans_'s 4 partial sums by key position */
                    int j = lo + k < (len & ~3) ? (lo + k) % 4 : 0;
                    part[j] = G4C_ADD(part[j], pv);
                } else acc = G4C_ADD(acc, pv);
            }
            if (bf) acc = G4C_ADD(G4C_ADD(G4C_ADD(part[0], part[1]), part[2]), part[3]);
            att[(size_t)r * D + d] = g4__act(acc, bf);
        }
        __syncthreads(); /* red[0] and sc are reused by this block's next row */
    }
}

/* x += b (the residual adds) */
__global__ void g4c_add(float *x, const float *b, size_t n) {
    G4C_FOR(i, n) x[i] = G4C_ADD(x[i], b[i]);
}

/* x *= s */
__global__ void g4c_scale(float *x, size_t n, float s) {
    G4C_FOR(i, n) x[i] = G4C_MUL(x[i], s);
}

/* x *= the learned layer_scalar (a device tensor of one element) */
__global__ void g4c_layer_scalar(float *x, size_t n, const void *ls, int dt) {
    float s = g4c__ld(ls, dt, 0);
    G4C_FOR(i, n) x[i] = G4C_MUL(x[i], s);
}

/* g4__mlp: gate = gelu(gate) * up */
__global__ void g4c_gelu_mul(float *gate, const float *up, size_t n, int bf, size_t off, size_t total) {
    G4C_FOR(i, n) gate[i] = g4__act(G4C_MUL(g4__act(g4c__gelu_t(gate[i], bf, off + i, total), bf), up[i]), bf);
}

/* g4__per_layer_inputs, last stage: pli = (pli + E_ple[id][l*P + j] * tok_scale) * combine */
__global__ void g4c_ple_combine(float *pli, const void *E, int dt, const int32_t *ids, int n, int LP, float tok_scale,
                                float combine, int bf) {
    G4C_FOR(i, (size_t)n * LP) {
        float e = g4__act(G4C_MUL(g4c__ld(E, dt, (size_t)ids[i / LP] * LP + i % LP), tok_scale), bf);
        pli[i] = g4__act(G4C_MUL(g4__act(G4C_ADD(pli[i], e), bf), combine), bf);
    }
}

/* g4__layer step 5: ple[t][j] = gelu(ple[t][j]) * pli[t][l*P + j] */
__global__ void g4c_ple_gate(float *ple, const float *pli, int n, int P, int LP, int l, int bf, size_t off, size_t total) {
    G4C_FOR(i, (size_t)n * P)
        ple[i] = g4__act(G4C_MUL(g4__act(g4c__gelu_t(ple[i], bf, off + i, total), bf), pli[(i / P) * LP + (size_t)l * P + i % P]), bf);
}

/* g4__step's soft-cap: x = tanh(x / cap) * cap */
__global__ void g4c_softcap(float *x, size_t n, float cap, int bf) {
    G4C_FOR(i, n) x[i] = g4__act(G4C_MUL(g4__act(g4__tanhf(g4__act(__fdiv_rn(x[i], cap), bf)), bf), cap), bf);
}

/* g4__moe's router input: u = (u * router_scale[i]) * H^-0.5 */
__global__ void g4c_router_scale(float *u, const void *scale, int dt, int n, int H, float root, int bf) {
    G4C_FOR(i, (size_t)n * H) u[i] = g4__act(G4C_MUL(g4__act(G4C_MUL(u[i], g4c__ld(scale, dt, i % H)), bf), root), bf);
}

/* g4__moe's routing, one thread per token, the CPU's own functions: softmax
   over E (g4__softmax, or g4__softmax_torch in the bf16 mode), top-k by
   probability (g4__topk_torch_q, ties as torch.topk, its scratch in the
   arena: no per-thread stack array), renormalise, per-expert scale. The
   chosen experts are then stored in ascending id, the order in which the CPU
   (and transformers) sum them. */
__global__ void g4c_moe_route(float *router, int *top_out, float *w_out, g4__vi *topq, const void *pes, int dt, int n,
                              int E, int K, int bf) {
    G4C_FOR(t, (size_t)n) {
        float *pr = router + t * E, *wk = w_out + t * K, wsum = 0.0f;
        int *top = top_out + t * K;
        if (bf) g4__softmax_torch(pr, E, 0, E);
        else g4__softmax(pr, E);
        g4__topk_torch_q(pr, E, K, top, topq + t * E);
        for (int k = 0; k < K; k++) {
            wk[k] = pr[top[k]];
            wsum = G4C_ADD(wsum, wk[k]);
        }
        for (int k = 0; k < K; k++) wk[k] = G4C_MUL(__fdiv_rn(wk[k], wsum), g4c__ld(pes, dt, (size_t)top[k]));
        for (int k = 1; k < K; k++) /* insertion sort by expert id */
            for (int j = k; j > 0 && top[j - 1] > top[j]; j--) {
                int ti = top[j]; float tw = wk[j];
                top[j] = top[j - 1]; wk[j] = wk[j - 1];
                top[j - 1] = ti; wk[j - 1] = tw;
            }
    }
}

/* g4__moe's expert matmuls for every (token, choice) row r = t*K + k:
   y[r][o] = sum_i x[.][i] * W[top[r]][o][i], x's row being r (per_k) or t. */
__global__ void g4c_moe_matmul(float *y, const float *x, int x_stride, int x_per_k, const void *W, int dt,
                               const int *top, int rows, int K, int in, int out, int bf) {
    G4C_FOR(idx, (size_t)rows * out) {
        size_t r = idx / out, o = idx % out;
        const float *xr = x + (x_per_k ? r : r / K) * (size_t)x_stride;
        size_t base = ((size_t)top[r] * out + o) * in;
        float acc = 0.0f;
        if (bf && dt == G4_BF16) acc = g4__dot_torch_bf16(xr, (const uint16_t *)W + base, in); /* g4__matmul_torch */
        else
            for (int i = 0; i < in; i++) acc = G4C_ADD(acc, G4C_MUL(xr[i], g4c__ld(W, dt, base + i)));
        y[idx] = acc;
    }
}

/* g4__moe: h[r][i] = gelu(h[r][i]) * h[r][Ie + i] (gate | up), in place */
__global__ void g4c_moe_glu(float *h, int rows, int Ie, int bf) {
    G4C_FOR(idx, (size_t)rows * Ie) {
        float *hr = h + (idx / Ie) * 2 * (size_t)Ie;
        size_t i = idx % Ie;
        hr[i] = g4__act(G4C_MUL(g4__act(g4c__gelu_t(hr[i], bf, i, (size_t)Ie), bf), hr[Ie + i]), bf);
    }
}

/* g4__moe: out[t][i] = sum_k y[t*K + k][i] * w[t*K + k], k in ascending expert id */
__global__ void g4c_moe_combine(float *out, const float *y, const float *w, int n, int K, int H, int bf) {
    G4C_FOR(idx, (size_t)n * H) {
        size_t t = idx / H, i = idx % H;
        float acc = 0.0f;
        for (int k = 0; k < K; k++)
            acc = g4__act(G4C_ADD(acc, g4__act(G4C_MUL(y[(t * K + k) * H + i], w[t * K + k]), bf)), bf);
        out[idx] = acc;
    }
}

/* ------------------------------------------------------------- launchers */

/* the fast mode's launchers (its section, below the exact forward pass) and
   its linear layers' epilogues */
enum { G4F_PLAIN = 0, G4F_GELU_MUL = 1, G4F_SOFTCAP = 2 };
static g4_result g4f__linear(g4_cuda_session *s, float *y, const float *x, const g4_tensor *w, const g4_tensor *w2,
                             int n, int epi, float cap);
static g4_result g4f__rmsnorm(g4_cuda_session *s, float *y, const float *x, const g4_tensor *w, int rows, int n);
static g4_result g4f__layer(g4_cuda_session *s, int l, int n);

/* g4__act: in the bf16-faithful mode, round n values to bf16. Every matmul,
   norm and residual add is followed by it, as on the CPU. */
static g4_result g4c__act(g4_cuda_session *s, float *x, size_t n) {
    if (s->cfg.bf16) G4C_RUN(s->error, g4c_round, g4c__grid(n, G4C_THREADS), G4C_THREADS, x, n);
    return G4_OK;
}

static g4_result g4c__matmul(g4_cuda_session *s, float *y, const float *x, const g4_tensor *w, int n) {
    int out = (int)w->shape[0], in = (int)w->shape[1];
    if (s->fast) return g4f__linear(s, y, x, w, NULL, n, 0, 0.0f);
    if (s->cfg.bf16 && w->dtype == G4_BF16) { /* g4__matmul: torch's summation order */
        G4C_RUN(s->error, g4c_matmul_torch, g4c__grid((size_t)n * out, G4C_THREADS), G4C_THREADS, y, x,
                (const uint16_t *)w->data, n, in, out);
    } else if (s->matmul == G4_CUDA_MATMUL_PLAIN) {
        G4C_RUN(s->error, g4c_matmul, g4c__grid((size_t)n * out, G4C_THREADS), G4C_THREADS, y, x, w->data,
                (int)w->dtype, n, in, out);
    } else {
        size_t tiles = (size_t)((out + G4C_TILE - 1) / G4C_TILE) * (size_t)((n + G4C_TILE - 1) / G4C_TILE);
        G4C_RUN(s->error, g4c_matmul_tiled, g4c__grid(tiles, 1), dim3(G4C_TILE, G4C_TILE), y, x, w->data,
                (int)w->dtype, n, in, out);
    }
    return g4c__act(s, y, (size_t)n * out);
}

static g4_result g4c__rmsnorm(g4_cuda_session *s, float *y, const float *x, const g4_tensor *w, int rows, int n) {
    if (s->fast) return g4f__rmsnorm(s, y, x, w, rows, n);
    G4C_RUN(s->error, g4c_rmsnorm, g4c__grid((size_t)rows, 1), G4C_THREADS, y, x, w ? w->data : NULL,
            w ? (int)w->dtype : 0, rows, n, s->model->host->config.rms_norm_eps);
    return g4c__act(s, y, (size_t)rows * n);
}

static g4_result g4c__add(g4_cuda_session *s, float *x, const float *b, size_t n) {
    G4C_RUN(s->error, g4c_add, g4c__grid(n, G4C_THREADS), G4C_THREADS, x, b, n);
    return g4c__act(s, x, n);
}

#define G4C_TRY(call)                             \
    do {                                          \
        g4_result r_ = (call);                    \
        if (r_ != G4_OK) return r_;               \
    } while (0)

/* --------------------------------------------------------- forward pass */

/* The taps, in one place: device rows are staged to the host only when a
   callback is set; host rows (the logits) are passed as they are. */
static g4_result g4c__tap(g4_cuda_session *s, int id, int layer, const float *data, int on_device, int rows,
                          int cols) {
    char buf[96];
    if (!s->cfg.tap) return G4_OK;
    if (on_device) {
        G4C_CHECK(s->error, cudaMemcpy(s->stage, data, sizeof(float) * (size_t)rows * cols, cudaMemcpyDeviceToHost));
        data = s->stage;
    }
    s->cfg.tap(s->cfg.tap_user, g4__tap_name(buf, sizeof buf, layer, id), layer, data, rows, cols, s->pos);
    return G4_OK;
}

/* g4__norm_rows: RMSNorm of n rows of width H (cast), then its tap */
static g4_result g4c__norm_rows(g4_cuda_session *s, float *y, const float *x, const g4_tensor *w, int n, int H, int layer,
                                int tap) {
    G4C_TRY(g4c__rmsnorm(s, y, x, w, n, H));
    return g4c__tap(s, tap, layer, y, 1, n, H);
}

/* g4__attention: s->d_xn -> s->d_branch for layer l */
static g4_result g4c__attention(g4_cuda_session *s, int l, int n) {
    const g4_model *m = s->model->host;
    const g4_layer_plan *lp = &m->plan.layer[l];
    const g4_layer_weights *lw = &s->model->w.layers[l];
    const float *cs = s->d_rope + (size_t)lp->type * 2 * s->rope_half, *sn = cs + s->rope_half;
    int stride = 4 * s->rope_half;
    int NH = m->config.num_attention_heads, D = lp->head_dim, KVH = lp->kv_heads, pos0 = s->pos, slot, bf = s->cfg.bf16;
    g4_kv_slot *sl;

    /* queries: q_proj, q_norm per head, RoPE */
    G4C_TRY(g4c__matmul(s, s->d_q, s->d_xn, &lw->q_proj, n));
    G4C_TRY(g4c__rmsnorm(s, s->d_q, s->d_q, &lw->q_norm, n * NH, D));
    G4C_RUN(s->error, g4c_rope, g4c__grid((size_t)n * NH * (D / 2), G4C_THREADS), G4C_THREADS, s->d_q, cs, sn, stride,
            n * NH, NH, D, bf);
    G4C_TRY(g4c__tap(s, G4__TAP_Q, l, s->d_q, 1, n, NH * D));

    if (lp->reads < 0) {
        /* an owner: k_proj (v_proj, or V = raw K), k_norm + RoPE, v_norm, append */
        sl = &s->slots[lp->kv_slot];
        if (sl->writer != l || sl->n_pos != pos0) {
            g4__seterr(s->error, "internal: layer %d's slot was written out of order", l);
            return G4_ERR_INPUT;
        }
        G4C_TRY(g4c__matmul(s, s->d_k_new, s->d_xn, &lw->k_proj, n));
        if (lp->has_v_proj) G4C_TRY(g4c__matmul(s, s->d_v_new, s->d_xn, &lw->v_proj, n));
        else G4C_CHECK(s->error, cudaMemcpy(s->d_v_new, s->d_k_new, sizeof(float) * (size_t)n * KVH * D,
                                            cudaMemcpyDeviceToDevice));
        G4C_TRY(g4c__rmsnorm(s, s->d_k_new, s->d_k_new, &lw->k_norm, n * KVH, D));
        G4C_RUN(s->error, g4c_rope, g4c__grid((size_t)n * KVH * (D / 2), G4C_THREADS), G4C_THREADS, s->d_k_new,
                cs, sn, stride, n * KVH, KVH, D, bf);
        G4C_TRY(g4c__rmsnorm(s, s->d_v_new, s->d_v_new, NULL, n * KVH, D));
        G4C_RUN(s->error, g4c_kv_append, g4c__grid((size_t)n * KVH * D, G4C_THREADS), G4C_THREADS, s->d_slots,
                lp->kv_slot, s->d_k_new, s->d_v_new, n, pos0);
        g4c__held(sl, pos0 + n);
    } else if (s->layer_slot[l] != lp->kv_slot) {
        /* the tests' debug layout (reader_copies): this step's rows into the reader's own slot */
        G4C_RUN(s->error, g4c_kv_copy, g4c__grid((size_t)n * KVH * D, G4C_THREADS), G4C_THREADS, s->d_slots,
                lp->kv_slot, s->layer_slot[l], n, pos0);
        g4c__held(&s->slots[s->layer_slot[l]], pos0 + n);
    }

    /* write once, then read: checked here on the host's table and again by
       the kernel on the device's */
    slot = s->layer_slot[l];
    if (s->slots[slot].n_pos != pos0 + n) {
        g4__seterr(s->error, "internal: layer %d reads slot %d before its writer (layer %d) appended this step", l,
                   slot, s->slots[slot].writer);
        return G4_ERR_INPUT;
    }
    if (s->cfg.tap) { /* this step's K and V rows of the slot this layer attends over */
        const g4_kv_slot *sv = &s->slots[slot];
        size_t kvw = (size_t)KVH * D;
        int t, which;
        for (which = 0; which < 2; which++) {
            for (t = 0; t < n; t++)
                G4C_CHECK(s->error, cudaMemcpy(s->stage + (size_t)t * kvw,
                                               (which ? sv->v : sv->k) + (size_t)((pos0 + t) % sv->capacity) * kvw,
                                               sizeof(float) * kvw, cudaMemcpyDeviceToHost));
            G4C_TRY(g4c__tap(s, which ? G4__TAP_V : G4__TAP_K, l, s->stage, 0, n, (int)kvw));
        }
    }
    G4C_RUN(s->error, g4c_attention, g4c__grid((size_t)n * NH, 1), G4C_THREADS, s->d_att, s->d_q, s->d_slots, slot,
            s->d_scores, n, NH, KVH, D, pos0, lp->type == G4_SLIDING ? m->config.sliding_window : 0,
            s->cfg.max_context, l, s->d_status, bf, s->fwd_n, s->fwd_end);
    G4C_TRY(g4c__matmul(s, s->d_branch, s->d_att, &lw->o_proj, n));
    return g4c__tap(s, G4__TAP_ATTN, l, s->d_branch, 1, n, m->config.hidden_size);
}

/* g4__mlp: down(gelu(gate(x)) * up(x)), d_xn -> d_branch */
static g4_result g4c__mlp(g4_cuda_session *s, int l, int n) {
    const g4_layer_weights *lw = &s->model->w.layers[l];
    size_t len = (size_t)n * (size_t)s->model->host->plan.layer[l].mlp_width;
    G4C_TRY(g4c__matmul(s, s->d_gate, s->d_xn, &lw->gate_proj, n));
    G4C_TRY(g4c__matmul(s, s->d_up, s->d_xn, &lw->up_proj, n));
    size_t width = (size_t)s->model->host->plan.layer[l].mlp_width;
    G4C_RUN(s->error, g4c_gelu_mul, g4c__grid(len, G4C_THREADS), G4C_THREADS, s->d_gate, s->d_up, len, s->cfg.bf16,
            (size_t)(s->pos - s->fwd_end + s->fwd_n) * width, (size_t)s->fwd_n * width);
    G4C_TRY(g4c__matmul(s, s->d_branch, s->d_gate, &lw->down_proj, n));
    return g4c__tap(s, G4__TAP_MLP, l, s->d_branch, 1, n, s->model->host->config.hidden_size);
}

/* g4__moe for all n tokens: residual d_x -> d_branch2 */
static g4_result g4c__moe(g4_cuda_session *s, int l, int n) {
    const g4_config *c = &s->model->host->config;
    const g4_layer_weights *lw = &s->model->w.layers[l];
    int H = c->hidden_size, E = c->num_experts, K = c->top_k_experts, Ie = c->moe_intermediate_size;
    const float root = (float)(1.0 / sqrt((double)H));
    /* router: weightless norm, * scale * H^-0.5, proj, softmax, top-k */
    G4C_TRY(g4c__rmsnorm(s, s->d_branch2, s->d_x, NULL, n, H));
    G4C_RUN(s->error, g4c_router_scale, g4c__grid((size_t)n * H, G4C_THREADS), G4C_THREADS, s->d_branch2,
            lw->router_scale.data, (int)lw->router_scale.dtype, n, H, root, s->cfg.bf16);
    G4C_TRY(g4c__matmul(s, s->d_router, s->d_branch2, &lw->router_proj, n));
    G4C_RUN(s->error, g4c_moe_route, g4c__grid((size_t)n, G4C_THREADS), G4C_THREADS, s->d_router, s->d_top, s->d_topw,
            (g4__vi *)s->d_topq, lw->router_per_expert_scale.data, (int)lw->router_per_expert_scale.dtype, n, E, K, s->cfg.bf16);
    /* experts on pre_feedforward_layernorm_2(r) */
    G4C_TRY(g4c__norm_rows(s, s->d_xn, s->d_x, &lw->pre_feedforward_layernorm_2, n, H,
            l, G4__TAP_PRE_FEEDFORWARD_LAYERNORM_2));
    G4C_RUN(s->error, g4c_moe_matmul, g4c__grid((size_t)n * K * 2 * Ie, G4C_THREADS), G4C_THREADS, s->d_moe_h,
            s->d_xn, H, 0, lw->experts_gate_up.data, (int)lw->experts_gate_up.dtype, s->d_top, n * K, K, H, 2 * Ie, s->cfg.bf16);
    G4C_TRY(g4c__act(s, s->d_moe_h, (size_t)n * K * 2 * Ie));
    G4C_RUN(s->error, g4c_moe_glu, g4c__grid((size_t)n * K * Ie, G4C_THREADS), G4C_THREADS, s->d_moe_h, n * K, Ie,
            s->cfg.bf16);
    G4C_RUN(s->error, g4c_moe_matmul, g4c__grid((size_t)n * K * H, G4C_THREADS), G4C_THREADS, s->d_moe_y, s->d_moe_h,
            2 * Ie, 1, lw->experts_down.data, (int)lw->experts_down.dtype, s->d_top, n * K, K, Ie, H, s->cfg.bf16);
    G4C_TRY(g4c__act(s, s->d_moe_y, (size_t)n * K * H));
    G4C_RUN(s->error, g4c_moe_combine, g4c__grid((size_t)n * H, G4C_THREADS), G4C_THREADS, s->d_branch2, s->d_moe_y,
            s->d_topw, n, K, H, s->cfg.bf16);
    return g4c__tap(s, G4__TAP_EXPERTS, l, s->d_branch2, 1, n, H);
}

/* A layer's MoE block, g4__layer's step 3, in both modes (the fast mode's
   norms and router on its own kernels, through g4c__norm_rows and the
   launchers): the dense MLP's output (d_branch) through
   post_feedforward_layernorm_1, the experts' (into d_branch2) through
   post_feedforward_layernorm_2, then their sum in d_branch */
static g4_result g4c__moe_block(g4_cuda_session *s, int l, int n) {
    const g4_layer_weights *lw = &s->model->w.layers[l];
    int H = s->model->host->config.hidden_size;
    G4C_TRY(g4c__norm_rows(s, s->d_branch, s->d_branch, &lw->post_feedforward_layernorm_1, n, H, l, G4__TAP_POST_FEEDFORWARD_LAYERNORM_1));
    G4C_TRY(g4c__moe(s, l, n));
    G4C_TRY(g4c__norm_rows(s, s->d_branch2, s->d_branch2, &lw->post_feedforward_layernorm_2, n, H, l, G4__TAP_POST_FEEDFORWARD_LAYERNORM_2));
    return g4c__add(s, s->d_branch, s->d_branch2, (size_t)n * H);
}

/* g4__layer: Gemma4TextDecoderLayer l on d_x in place */
static g4_result g4c__layer(g4_cuda_session *s, int l, int n) {
    const g4_config *c = &s->model->host->config;
    const g4_layer_weights *lw = &s->model->w.layers[l];
    int H = c->hidden_size, P = c->hidden_size_per_layer_input;
    size_t nh = (size_t)n * H;

    /* 1. attention block */
    G4C_TRY(g4c__norm_rows(s, s->d_xn, s->d_x, &lw->input_layernorm, n, H, l, G4__TAP_INPUT_LAYERNORM));
    G4C_TRY(g4c__attention(s, l, n));
    G4C_TRY(g4c__norm_rows(s, s->d_branch, s->d_branch, &lw->post_attention_layernorm, n, H,
            l, G4__TAP_POST_ATTENTION_LAYERNORM));
    G4C_TRY(g4c__add(s, s->d_x, s->d_branch, nh));
    G4C_TRY(g4c__tap(s, G4__TAP_RESIDUAL, l, s->d_x, 1, n, H));

    /* 2. feed-forward block */
    G4C_TRY(g4c__norm_rows(s, s->d_xn, s->d_x, &lw->pre_feedforward_layernorm, n, H, l, G4__TAP_PRE_FEEDFORWARD_LAYERNORM));
    G4C_TRY(g4c__mlp(s, l, n));
    /* 3. MoE beside the dense MLP */
    if (s->model->host->plan.layer[l].moe) G4C_TRY(g4c__moe_block(s, l, n));
    /* 4. */
    G4C_TRY(g4c__norm_rows(s, s->d_branch, s->d_branch, &lw->post_feedforward_layernorm, n, H,
            l, G4__TAP_POST_FEEDFORWARD_LAYERNORM));
    G4C_TRY(g4c__add(s, s->d_x, s->d_branch, nh));

    /* 5. per-layer input */
    if (P) {
        int LP = c->num_hidden_layers * P;
        G4C_TRY(g4c__matmul(s, s->d_per_layer_gate, s->d_x, &lw->per_layer_input_gate, n));
        G4C_TRY(g4c__tap(s, G4__TAP_PER_LAYER_INPUT_GATE, l, s->d_per_layer_gate, 1, n, P));
        G4C_RUN(s->error, g4c_ple_gate, g4c__grid((size_t)n * P, G4C_THREADS), G4C_THREADS, s->d_per_layer_gate,
                s->d_per_layer_inputs, n, P, LP, l, s->cfg.bf16, (size_t)(s->pos - s->fwd_end + s->fwd_n) * P, (size_t)s->fwd_n * P);
        G4C_TRY(g4c__matmul(s, s->d_branch, s->d_per_layer_gate, &lw->per_layer_projection, n));
        G4C_TRY(g4c__tap(s, G4__TAP_PER_LAYER_PROJECTION, l, s->d_branch, 1, n, H));
        G4C_TRY(g4c__norm_rows(s, s->d_branch, s->d_branch, &lw->post_per_layer_input_norm, n, H,
                l, G4__TAP_POST_PER_LAYER_INPUT_NORM));
        G4C_TRY(g4c__add(s, s->d_x, s->d_branch, nh));
    }

    /* 6. layer_scalar */
    G4C_RUN(s->error, g4c_layer_scalar, g4c__grid(nh, G4C_THREADS), G4C_THREADS, s->d_x, nh, lw->layer_scalar.data,
            (int)lw->layer_scalar.dtype);
    G4C_TRY(g4c__act(s, s->d_x, nh));
    return g4c__tap(s, G4__TAP_LAYER, l, s->d_x, 1, n, H);
}

/* g4__per_layer_inputs */
static g4_result g4c__per_layer_inputs(g4_cuda_session *s, int n) {
    const g4_config *c = &s->model->host->config;
    const g4_weights *w = &s->model->w;
    int P = c->hidden_size_per_layer_input, L = c->num_hidden_layers, LP = L * P;
    const float proj_scale = (float)(1.0 / sqrt((double)c->hidden_size));
    const float tok_scale = g4__scale_mode(s->cfg.bf16, P);
    const float combine = (float)(1.0 / sqrt(2.0));
    G4C_TRY(g4c__matmul(s, s->d_per_layer_inputs, s->d_x, &w->per_layer_model_projection, n));
    G4C_RUN(s->error, g4c_scale, g4c__grid((size_t)n * LP, G4C_THREADS), G4C_THREADS, s->d_per_layer_inputs,
            (size_t)n * LP, proj_scale);
    G4C_TRY(g4c__act(s, s->d_per_layer_inputs, (size_t)n * LP));
    G4C_TRY(g4c__rmsnorm(s, s->d_per_layer_inputs, s->d_per_layer_inputs, &w->per_layer_projection_norm, n * L, P));
    G4C_RUN(s->error, g4c_ple_combine, g4c__grid((size_t)n * LP, G4C_THREADS), G4C_THREADS, s->d_per_layer_inputs,
            w->embed_tokens_per_layer.data, (int)w->embed_tokens_per_layer.dtype, s->d_ids, n, LP, tok_scale, combine,
            s->cfg.bf16);
    return g4c__tap(s, G4__TAP_PER_LAYER_INPUTS, -1, s->d_per_layer_inputs, 1, n, LP);
}

/* RoPE's cos and sin for this step's positions pos .. pos + n - 1, made on
   the host by the CPU's own g4__rope_cos_sin (so the device rotates by the
   very values the CPU does) and uploaded in one copy: s->rope[t][type][cos,
   sin][j]. Only the step's rows are made, so the table costs max_chunk rows,
   not max_context. */
static g4_result g4c__rope_tables(g4_cuda_session *s, int n) {
    const g4_plan *p = &s->model->host->plan;
    size_t h = (size_t)s->rope_half;
    for (int type = 0; type < 2; type++) {
        int half = 0;
        for (int i = 0; i < p->n_layers && !half; i++)
            if (p->layer[i].type == type) half = p->layer[i].head_dim / 2;
        for (int t = 0; t < n; t++) {
            float *cs = s->rope + ((size_t)t * 2 + (size_t)type) * 2 * h;
            for (int j = 0; j < half; j++) g4__rope_cos_sin(s->inv_freq[type][j], s->pos + t, &cs[j], &cs[h + (size_t)j]);
        }
    }
    G4C_CHECK(s->error, cudaMemcpy(s->d_rope, s->rope, sizeof(float) * (size_t)n * 4 * h, cudaMemcpyHostToDevice));
    return G4_OK;
}

/* g4__step: n <= max_chunk tokens; logits rows [first, n) go to host `out` */
static g4_result g4c__step_run(g4_cuda_session *s, const int32_t *ids, int n, float *out, int first) {
    const g4_config *c = &s->model->host->config;
    const g4_weights *w = &s->model->w;
    int H = c->hidden_size, V = c->vocab_size, l, status = 0;
    const float embed_scale = g4__scale_mode(s->cfg.bf16, H);

    G4C_CHECK(s->error, cudaMemcpy(s->d_ids, ids, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    G4C_TRY(g4c__rope_tables(s, n));
    G4C_RUN(s->error, g4c_embed, g4c__grid((size_t)n * H, G4C_THREADS), G4C_THREADS, s->d_x, w->embed_tokens.data,
            (int)w->embed_tokens.dtype, s->d_ids, n, H, embed_scale);
    G4C_TRY(g4c__act(s, s->d_x, (size_t)n * H));
    G4C_TRY(g4c__tap(s, G4__TAP_EMBED_TOKENS, -1, s->d_x, 1, n, H));
    if (c->hidden_size_per_layer_input) G4C_TRY(g4c__per_layer_inputs(s, n));

    for (l = 0; l < c->num_hidden_layers; l++) G4C_TRY(s->fast ? g4f__layer(s, l, n) : g4c__layer(s, l, n));

    G4C_TRY(g4c__norm_rows(s, s->d_xn, s->d_x, &w->norm, n, H, -1, G4__TAP_NORM));
    if (out && first < n) {
        size_t cnt = (size_t)(n - first) * V;
        if (s->fast) /* the soft-cap as the head's epilogue */
            G4C_TRY(g4f__linear(s, s->d_logits, s->d_xn + (size_t)first * H, &w->lm_head, NULL, n - first,
                                c->final_logit_softcapping > 0.0f ? G4F_SOFTCAP : G4F_PLAIN,
                                c->final_logit_softcapping));
        else G4C_TRY(g4c__matmul(s, s->d_logits, s->d_xn + (size_t)first * H, &w->lm_head, n - first));
        if (!s->fast && c->final_logit_softcapping > 0.0f)
            G4C_RUN(s->error, g4c_softcap, g4c__grid(cnt, G4C_THREADS), G4C_THREADS, s->d_logits, cnt,
                    c->final_logit_softcapping, s->cfg.bf16);
    }
    /* every kernel of the step has finished here: a fault of any of them
       (asynchronous, so no launch reported it) is reported now, under this
       step (or earlier in the step, by a tap's copy) */
    {
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            g4__seterr(s->error, "a kernel of this step failed: %s", cudaGetErrorString(e));
            (void)cudaGetLastError();
            return G4_ERR_CUDA;
        }
    }
    if (out && first < n) {
        G4C_CHECK(s->error, cudaMemcpy(out, s->d_logits, sizeof(float) * (size_t)(n - first) * V, cudaMemcpyDeviceToHost));
        G4C_TRY(g4c__tap(s, G4__TAP_LOGITS, -1, out, 0, n - first, V));
    }
    /* the device's own table checks (g4c_attention) */
    G4C_CHECK(s->error, cudaMemcpy(&status, s->d_status, sizeof status, cudaMemcpyDeviceToHost));
    if (status) {
        g4__seterr(s->error, "device table check: layer %d %s", status / 16 - 1,
                   status % 16 == 1 ? "read a slot that did not hold exactly this step's positions"
                                    : "needed a key its slot's ring no longer holds");
        return G4_ERR_INPUT;
    }
    s->pos += n;
    return G4_OK;
}

/* Upload the host's table to the device and clear the status word. */
static g4_result g4c__sync_table(g4_cuda_session *s) {
    G4C_CHECK(s->error, cudaMemcpy(s->d_slots, s->slots, sizeof(g4_kv_slot) * (size_t)s->n_slots, cudaMemcpyHostToDevice));
    G4C_CHECK(s->error, cudaMemset(s->d_status, 0, sizeof(int)));
    return G4_OK;
}

/* A kernel fault (an illegal address, a trap) is sticky: the CUDA context is
   then unusable and every later call in the process fails with it. */
static int g4c__sticky(cudaError_t e) {
    return e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorIllegalInstruction ||
           e == cudaErrorMisalignedAddress || e == cudaErrorInvalidPc || e == cudaErrorHardwareStackError ||
           e == cudaErrorAssert || e == cudaErrorInvalidAddressSpace;
}

/* One step, and on any error nothing of it is kept: the session's position
   and the table (host and device) are as before the step, so the step can
   be run again (the K/V rows it wrote are rewritten by the retry; a sliding
   ring only ever overwrites positions the window no longer needs). A CUDA
   error is reported under the step's positions; a sticky one says that the
   context is gone. */
static g4_result g4c__step(g4_cuda_session *s, const int32_t *ids, int n, float *out, int first) {
    int pos0 = s->pos;
    g4_result r = g4c__step_run(s, ids, n, out, first);
    if (r == G4_OK) return G4_OK;
    for (int i = 0; i < s->n_slots; i++) g4c__held(&s->slots[i], pos0); /* every slot held pos0 positions */
    s->pos = pos0;
    if (r == G4_ERR_CUDA) {
        char msg[G4_ERROR_MAX];
        cudaError_t e = cudaDeviceSynchronize();
        memcpy(msg, s->error, sizeof msg);
        msg[sizeof msg - 1] = 0;
        g4__seterr(s->error, "forward step at positions %d..%d: %s%s", pos0, pos0 + n - 1, msg,
                   g4c__sticky(e) ? "; the CUDA context is now unusable (a kernel fault is sticky: every later CUDA "
                                    "call in this process fails): free the session and model and end the process"
                                  : "");
        if (g4c__sticky(e)) return r;
    }
    { /* the device's table and status word as the host's */
        char keep[G4_ERROR_MAX];
        memcpy(keep, s->error, sizeof keep);
        (void)g4c__sync_table(s);
        memcpy(s->error, keep, sizeof keep);
    }
    return r;
}

/* ============================================================ fast mode */
/* g4_cuda_config.fast: kernels near the hardware, bounded against the exact mode
   above (which stays the oracle) instead of equal to it. The same plan, the
   same shared-KV table (readers read the owner's slots; the same device
   checks), the same taps by name, the same arena rules (g4_cuda_session_size
   reports it all up front, nothing is allocated in a forward).

   What differs from the exact mode:
   - Linear layers (g4f_matvec): one warp per output row (and K slice), each
     lane issuing G4F_UNROLL 16-byte weight loads before it uses any of them,
     the x rows read as float4, up to G4F_TOKENS tokens per pass sharing each
     weight load, the lanes' partial sums combined by a warp-shuffle
     butterfly. An output narrower than G4F_NARROW rows is split along K into
     slices of G4F_SPLIT_IN (split-K) in a decode-sized pass (at most
     G4F_TOKENS tokens): the slices' sums land in d_part and
     g4f_splitk_sum adds them in slice order, so the result does not depend
     on which block ran first. These are CUDA-core kernels: no tensor cores.
   - Attention (g4f_attention): flash attention with FlashAttention-2's
     tiling on CUDA cores. One block per (query tile, KV head, KV split)
     serves all the query heads of that KV head for the tile's tokens (a
     prefill tile: up to G4F_ROWS rows; a decode step: one token), so each
     key and value row is read once per tile; the keys go by in tiles of G4F_KEYS
     with an online softmax (running max, rescaled sum); each split writes
     (max, sum, unnormalised output) to d_part and g4f_attn_combine merges the
     splits in split order. No [chunk x heads x context] score buffer. A
     decode step (one token) splits its keys into about G4F_BLOCKS_PER_SM
     blocks per multiprocessor (flash-decoding, g4f__kv_splits: at least
     G4F_KV_SPLIT keys each, at most G4F_MAX_KV_SPLIT); a prefill chunk uses
     one split. Within a split each key tile is summed from zero and then
     added to the running sum (the rescale and the add in one FMA).
   - In the bf16 mode (cfg.bf16 at init) the K/V cache is bf16: the values
     are bf16 already there (k_norm, RoPE and v_norm round to it), so this
     loses nothing and halves the cache's traffic. In float32 it stays float32.
   - Fusions: every fast kernel rounds its own output in the bf16 mode (no
     separate g4c_round pass): norm + cast; q/k norm + RoPE in one kernel
     (g4f_norm_rope), which for K and V also appends the row to the owner's
     slot (the K/V append); gate and up in one matvec with the GELU product
     as its epilogue; the final soft-cap as the head's epilogue; the post-
     attention norm, the residual add and the pre-feed-forward norm in one
     kernel (g4f_norm_add_norm).
   - Not fast (they run the exact kernels): the embedding, the per-layer
     inputs' elementwise steps, the MoE router and experts, layer_scalar.

   Numerics: float32 sums in other orders than the exact mode (split and
   butterfly orders; the online softmax), the device's expf/tanhf/sinf/cosf.
   The tests bound the difference: fast float32 within 4e-5 x max|logit| of
   exact float32 on the goldens, fast bf16 within 3e-2 of the bf16-faithful
   mode with the same greedy tokens. A given shape always sums in the same
   order (the splits depend only on the shapes and positions), so a run
   repeats bit for bit; decode and chunked prefill agree within tolerance. */

#ifndef G4F_THREADS
#define G4F_THREADS G4C_THREADS /* a multiple of 32 */
#endif
#ifndef G4F_TOKENS
#define G4F_TOKENS 4 /* matvec: tokens sharing one pass over the weights */
#endif
#ifndef G4F_UNROLL
#define G4F_UNROLL 4 /* matvec: 16-byte weight loads in flight per lane */
#endif
#ifndef G4F_NARROW
#define G4F_NARROW 4096 /* matvec: outputs below this many rows are split along K */
#endif
#ifndef G4F_SPLIT_IN
#define G4F_SPLIT_IN 1024 /* split-K: inputs per slice */
#endif
#define G4F_MAX_SPLIT 8   /* split-K: most slices */
#ifndef G4F_KEYS
#define G4F_KEYS 32 /* attention: keys per tile */
#endif
#ifndef G4F_KV_SPLIT
#define G4F_KV_SPLIT 64 /* flash-decoding: fewest keys per split */
#endif
#define G4F_MAX_KV_SPLIT 256 /* flash-decoding: most splits */
#define G4F_BLOCKS_PER_SM 2 /* flash-decoding: blocks to aim for per multiprocessor */
#define G4F_GROUP 8    /* attention: most query heads per KV head */
#define G4F_QMAX 4096  /* attention: most group x head_dim */

/* keep small fixed-size loops in registers (nvcc); nothing for the emulator */
#ifdef __CUDACC__
#define G4F_UNROLL_LOOP _Pragma("unroll")
#else
#define G4F_UNROLL_LOOP
#endif

/* 8 weights at elements 8u .. 8u+7 of a row, as float32, from the raw 16 or
   32 bytes (one or two uint4 loads) */
__device__ static void g4f__unpack8(float *f, const uint4 *raw, int dt) {
    const unsigned w[8] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w, raw[1].x, raw[1].y, raw[1].z, raw[1].w};
    if (dt == G4_F32) {
        for (int e = 0; e < 8; e++) f[e] = __uint_as_float(w[e]);
    } else if (dt == G4_BF16) {
        for (int e = 0; e < 4; e++) {
            f[2 * e] = __uint_as_float(w[e] << 16);
            f[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
        }
    } else {
        for (int e = 0; e < 4; e++) {
            f[2 * e] = g4__f16_to_f32((uint16_t)(w[e] & 0xffffu));
            f[2 * e + 1] = g4__f16_to_f32((uint16_t)(w[e] >> 16));
        }
    }
}

/* the whole warp's sum of v, the same bits in every lane (a butterfly) */
__device__ static float g4f__warp_sum(float v) {
    for (int m = 16; m > 0; m /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

/* a linear layer's epilogue, in the bf16 mode rounding where the exact mode's
   separate passes do: a = W x (gate), b = W2 x (up) */
__device__ static float g4f__epilogue(float a, float b, int epi, float cap, int bf) {
    a = g4__act(a, bf);
    if (epi == G4F_GELU_MUL) return g4__act(__fmul_rn(g4__act(g4__gelu_x(a, 1), bf), g4__act(b, bf)), bf);
    if (epi == G4F_SOFTCAP) return g4__act(__fmul_rn(g4__act(tanhf(g4__act(a / cap, bf)), bf), cap), bf);
    return a;
}

/* y[t][o] = epilogue(sum_i x[t][i] W[o][i] (, sum_i x[t][i] W2[o][i])) for
   t < n <= G4F_TOKENS: one warp per (output row, K slice). vec: rows of in %
   8 == 0 elements on 16-byte boundaries (else one element per lane at a
   time). splits > 1: the slices' sums go to part[(slice * 2 + which) * n +
   t][o] and g4f_splitk_sum finishes. */
__global__ void g4f_matvec(float *y, float *part, const float *x, const void *W, const void *W2, int dt, int n, int in,
                           int out, int splits, int vec, int epi, float cap, int bf) {
    int lane = (int)threadIdx.x % 32, wpb = (int)blockDim.x / 32, nw = W2 ? 2 : 1;
    size_t esz = dt == G4_F32 ? 4 : 2, units = (size_t)in / 8, su = (units + (size_t)splits - 1) / (size_t)splits;
    size_t slice = (((size_t)in + (size_t)splits - 1) / (size_t)splits + 31) / 32 * 32;
    for (size_t w = blockIdx.x * (size_t)wpb + threadIdx.x / 32; w < (size_t)out * splits; w += (size_t)gridDim.x * wpb) {
        size_t o = w % (size_t)out, sp = w / (size_t)out;
        float acc[2][G4F_TOKENS];
        G4F_UNROLL_LOOP
        for (int k = 0; k < 2; k++)
            G4F_UNROLL_LOOP
            for (int t = 0; t < G4F_TOKENS; t++) acc[k][t] = 0.0f;
        G4F_UNROLL_LOOP
        for (int k = 0; k < 2; k++) {
            if (k >= nw) break;
            const unsigned char *row = (const unsigned char *)(k ? W2 : W) + o * (size_t)in * esz;
            if (vec) { /* units [u0, u1) of 8 elements; lane takes u0 + lane + 32 j */
                size_t u0 = sp * su, u1 = u0 + su < units ? u0 + su : units;
                for (size_t u = u0 + (size_t)lane; u < u1; u += 32 * G4F_UNROLL) {
                    uint4 raw[G4F_UNROLL][2];
                    G4F_UNROLL_LOOP
                    for (int j = 0; j < G4F_UNROLL; j++) { /* all the loads first: several in flight */
                        size_t uj = u + 32 * (size_t)j;
                        if (uj >= u1) break;
                        const uint4 *p = (const uint4 *)(const void *)(row + uj * 8 * esz);
                        raw[j][0] = p[0];
                        raw[j][1] = esz == 4 ? p[1] : make_uint4(0u, 0u, 0u, 0u);
                    }
                    G4F_UNROLL_LOOP
                    for (int j = 0; j < G4F_UNROLL; j++) {
                        size_t uj = u + 32 * (size_t)j;
                        float f[8];
                        if (uj >= u1) break;
                        g4f__unpack8(f, raw[j], dt);
                        G4F_UNROLL_LOOP
                        for (int t = 0; t < G4F_TOKENS; t++) {
                            if (t >= n) break;
                            const float4 *xp = (const float4 *)(const void *)(x + (size_t)t * in + uj * 8);
                            float4 a = xp[0], b = xp[1];
                            float s = acc[k][t];
                            s = __fmaf_rn(a.x, f[0], s);
                            s = __fmaf_rn(a.y, f[1], s);
                            s = __fmaf_rn(a.z, f[2], s);
                            s = __fmaf_rn(a.w, f[3], s);
                            s = __fmaf_rn(b.x, f[4], s);
                            s = __fmaf_rn(b.y, f[5], s);
                            s = __fmaf_rn(b.z, f[6], s);
                            s = __fmaf_rn(b.w, f[7], s);
                            acc[k][t] = s;
                        }
                    }
                }
            } else { /* elements [i0, i1), one per lane */
                size_t i0 = sp * slice, i1 = i0 + slice < (size_t)in ? i0 + slice : (size_t)in;
                for (size_t i = i0 + (size_t)lane; i < i1; i += 32) {
                    float wv = g4c__ld(row, dt, i);
                    G4F_UNROLL_LOOP
                    for (int t = 0; t < G4F_TOKENS; t++)
                        if (t < n) acc[k][t] = __fmaf_rn(x[(size_t)t * in + i], wv, acc[k][t]);
                }
            }
        }
        G4F_UNROLL_LOOP
        for (int k = 0; k < 2; k++) /* n and nw are the launch's: the shuffles stay converged */
            G4F_UNROLL_LOOP
            for (int t = 0; t < G4F_TOKENS; t++)
                if (k < nw && t < n) acc[k][t] = g4f__warp_sum(acc[k][t]);
        if (lane == 0)
            G4F_UNROLL_LOOP
            for (int t = 0; t < G4F_TOKENS; t++) {
                if (t >= n) break;
                if (splits == 1) y[(size_t)t * out + o] = g4f__epilogue(acc[0][t], acc[1][t], epi, cap, bf);
                else
                    for (int k = 0; k < nw; k++) part[((sp * 2 + (size_t)k) * n + (size_t)t) * out + o] = acc[k][t];
            }
    }
}

/* One warp's bf16 MMA, D = A B + C on a 16 x 8 x 16 tile (fragments as the
   PTX ISA lays them out: see g4f_gemm): a tensor-core instruction on sm_80+,
   the emulator's scalar model of it in emulation. */
__device__ static void g4f__mma_bf16(float *d, const unsigned *a, const unsigned *b, const float *c) {
#if defined(G4_CUDA_EMULATE)
    g4emu_mma_bf16_16816(d, a, b, c);
#elif defined(__CUDA_ARCH__)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%11,%12,%13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
#else
    (void)a; (void)b;
    d[0] = c[0]; d[1] = c[1]; d[2] = c[2]; d[3] = c[3];
#endif
}

/* bf16 bits of a float32 that is a bf16 value already (the bf16 mode's
   activations are): the upper half; otherwise rounded to nearest */
__device__ static unsigned g4f__bf16_bits(float f) { return __float_as_uint(g4__bf16_round(f)) >> 16; }

/* y[t][o] = epilogue(x[t] . W[o] (, x[t] . W2[o])) for a prefill chunk: a
   block of 4 warps takes G4F_GM tokens x G4F_GN outputs, staging 16-wide K
   slices of x and W in shared memory; warp w owns tokens 16w .. 16w + 15 and
   all G4F_GN / 8 column tiles. Lane (g = lane / 4, t = lane % 4) owns, per
   column tile j, outputs (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1): the
   mma.m16n8k16 fragment. mma (the bf16 mode with bf16 weights: x is bf16
   there, so the products are exact): each 16 x 8 x 16 step is one tensor-core
   MMA (bf16 in, float32 accumulate). Otherwise the same fragment is summed
   by the lane itself with float32 FMAs over the staged float32 tiles (CUDA
   cores), so float32 keeps float32 products. Each output sums its K in order,
   16 at a time. */
#define G4F_GM 64
#define G4F_GN 64
__global__ void g4f_gemm(float *y, const float *x, const void *W, const void *W2, int dt, int n, int in, int out,
                         int mma, int epi, float cap, int bf) {
    __shared__ float xs[G4F_GM][16 + 1], ws[2][G4F_GN][16 + 1];
    __shared__ unsigned xb[G4F_GM][8 + 4], wb[2][G4F_GN][8 + 4]; /* bf16 pairs; padded rows against bank conflicts */
    int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t4 = lane % 4, nw = W2 ? 2 : 1;
    int tiles_m = (n + G4F_GM - 1) / G4F_GM, tiles_n = (out + G4F_GN - 1) / G4F_GN;
    G4C_ROWS(tile, tiles_m * tiles_n) {
        int m0 = (tile / tiles_n) * G4F_GM, n0 = (tile % tiles_n) * G4F_GN;
        float acc[2][G4F_GN / 8][4];
        G4F_UNROLL_LOOP
        for (int k = 0; k < 2; k++)
            G4F_UNROLL_LOOP
            for (int j = 0; j < G4F_GN / 8; j++)
                G4F_UNROLL_LOOP
                for (int e = 0; e < 4; e++) acc[k][j][e] = 0.0f;
        for (int k0 = 0; k0 < in; k0 += 16) {
            /* stage x [G4F_GM][16] and W (W2) [G4F_GN][16], zeros past the edges */
            if (mma) { /* bf16 pairs, a register's worth per thread */
                for (int i = tid; i < G4F_GM * 8; i += (int)blockDim.x) {
                    int r = i / 8, k = 2 * (i % 8);
                    float v0 = m0 + r < n && k0 + k < in ? x[(size_t)(m0 + r) * in + k0 + k] : 0.0f;
                    float v1 = m0 + r < n && k0 + k + 1 < in ? x[(size_t)(m0 + r) * in + k0 + k + 1] : 0.0f;
                    xb[r][i % 8] = g4f__bf16_bits(v0) | g4f__bf16_bits(v1) << 16;
                }
                for (int i = tid; i < nw * G4F_GN * 8; i += (int)blockDim.x) {
                    int which = i / (G4F_GN * 8), r = i / 8 % G4F_GN, k = 2 * (i % 8);
                    const uint16_t *row = (const uint16_t *)(which ? W2 : W) + (size_t)(n0 + r) * in;
                    unsigned lo = n0 + r < out && k0 + k < in ? row[k0 + k] : 0u;
                    unsigned hi = n0 + r < out && k0 + k + 1 < in ? row[k0 + k + 1] : 0u;
                    wb[which][r][i % 8] = lo | hi << 16;
                }
            } else {
                for (int i = tid; i < G4F_GM * 16; i += (int)blockDim.x) {
                    int r = i / 16, k = i % 16;
                    xs[r][k] = m0 + r < n && k0 + k < in ? x[(size_t)(m0 + r) * in + k0 + k] : 0.0f;
                }
                for (int i = tid; i < nw * G4F_GN * 16; i += (int)blockDim.x) {
                    int which = i / (G4F_GN * 16), r = i / 16 % G4F_GN, k = i % 16;
                    ws[which][r][k] = n0 + r < out && k0 + k < in ? g4c__ld(which ? W2 : W, dt, (size_t)(n0 + r) * in + k0 + k)
                                                                  : 0.0f;
                }
            }
            __syncthreads();
            G4F_UNROLL_LOOP
            for (int k = 0; k < 2; k++) {
                if (k >= nw) continue;
                G4F_UNROLL_LOOP
                for (int j = 0; j < G4F_GN / 8; j++) {
                    int col = j * 8 + g, r0 = warp * 16 + g;
                    if (mma) {
                        unsigned a[4] = {xb[r0][t4], xb[r0 + 8][t4], xb[r0][t4 + 4], xb[r0 + 8][t4 + 4]};
                        unsigned b[2] = {wb[k][col][t4], wb[k][col][t4 + 4]};
                        g4f__mma_bf16(acc[k][j], a, b, acc[k][j]);
                    } else { /* the same fragment on CUDA cores: rows r0, r0 + 8, columns j*8 + 2t, + 1 */
                        G4F_UNROLL_LOOP
                        for (int e = 0; e < 4; e++) {
                            int r = warp * 16 + g + (e >= 2 ? 8 : 0), c = j * 8 + 2 * t4 + (e & 1);
                            float v = acc[k][j][e];
                            for (int kk = 0; kk < 16; kk++) v = __fmaf_rn(xs[r][kk], ws[k][c][kk], v);
                            acc[k][j][e] = v;
                        }
                    }
                }
            }
            __syncthreads();
        }
        G4F_UNROLL_LOOP
        for (int j = 0; j < G4F_GN / 8; j++)
            G4F_UNROLL_LOOP
            for (int e = 0; e < 4; e++) {
                int r = m0 + warp * 16 + g + (e >= 2 ? 8 : 0), c = n0 + j * 8 + 2 * t4 + (e & 1);
                if (r < n && c < out) y[(size_t)r * out + c] = g4f__epilogue(acc[0][j][e], acc[1][j][e], epi, cap, bf);
            }
    }
}

/* split-K's fixed-order finish: y = epilogue(sum over slices, in slice order) */
__global__ void g4f_splitk_sum(float *y, const float *part, int n, int out, int splits, int nw, int epi, float cap,
                               int bf) {
    G4C_FOR(idx, (size_t)n * out) {
        float a = 0.0f, b = 0.0f;
        for (int sp = 0; sp < splits; sp++) {
            a = __fadd_rn(a, part[(size_t)sp * 2 * n * out + idx]);
            if (nw > 1) b = __fadd_rn(b, part[((size_t)sp * 2 + 1) * n * out + idx]);
        }
        y[idx] = g4f__epilogue(a, b, epi, cap, bf);
    }
}

/* the block's sum of v (every thread gets it); red: blockDim / 32 floats */
__device__ static float g4f__block_sum(float v, float *red) {
    int warp = (int)threadIdx.x / 32, nwarp = (int)blockDim.x / 32;
    v = g4f__warp_sum(v);
    __syncthreads(); /* red is free: its last readers are past this */
    if (threadIdx.x % 32 == 0) red[warp] = v;
    __syncthreads();
    v = 0.0f;
    for (int k = 0; k < nwarp; k++) v = __fadd_rn(v, red[k]);
    return v;
}

/* 1 / sqrt(mean(x^2) + eps) of a row of n, a block per row */
__device__ static float g4f__inv_rms(const float *xr, int n, float eps, float *red) {
    float ss = 0.0f;
    for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) ss = __fmaf_rn(xr[i], xr[i], ss);
    ss = g4f__block_sum(ss, red);
    return 1.0f / sqrtf(__fadd_rn(ss / (float)n, eps));
}

/* RMSNorm of rows of n (w NULL: no weight), rounded in the bf16 mode */
__global__ void g4f_rmsnorm(float *y, const float *x, const void *w, int dt, int rows, int n, float eps, int bf) {
    __shared__ float red[G4F_THREADS / 32];
    G4C_ROWS(r, rows) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n, inv = g4f__inv_rms(xr, n, eps, red);
        for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) {
            float v = __fmul_rn(xr[i], inv);
            yr[i] = g4__act(w ? __fmul_rn(v, g4c__ld(w, dt, (size_t)i)) : v, bf);
        }
    }
}

/* b = norm(b) * w1; x += b; then (w2 != NULL) xn = norm(x) * w2: a
   post-norm, the residual add and the next pre-norm in one pass over the row.
   Each thread reads back only what it wrote itself. */
__global__ void g4f_norm_add_norm(float *x, float *b, float *xn, const void *w1, const void *w2, int dt1, int dt2,
                                  int rows, int n, float eps, int bf) {
    __shared__ float red[G4F_THREADS / 32];
    G4C_ROWS(r, rows) {
        float *xr = x + (size_t)r * n, *br = b + (size_t)r * n, inv = g4f__inv_rms(br, n, eps, red), ss = 0.0f;
        for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) {
            float v = g4__act(__fmul_rn(__fmul_rn(br[i], inv), g4c__ld(w1, dt1, (size_t)i)), bf);
            float s = g4__act(__fadd_rn(xr[i], v), bf);
            br[i] = v;
            xr[i] = s;
            ss = __fmaf_rn(s, s, ss);
        }
        if (!w2) continue; /* uniform over the block */
        ss = g4f__block_sum(ss, red);
        inv = 1.0f / sqrtf(__fadd_rn(ss / (float)n, eps));
        for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x)
            xn[(size_t)r * n + i] = g4__act(__fmul_rn(__fmul_rn(xr[i], inv), g4c__ld(w2, dt2, (size_t)i)), bf);
    }
}

/* An element of a K/V slot row (bf16 or float32) */
__device__ static float g4f__kv(const float *base, int kvbf, size_t i) {
    return kvbf ? __uint_as_float((unsigned)((const uint16_t *)(const void *)base)[i] << 16) : base[i];
}

/* reader_copies (the tests' debug layout): this step's rows of the owner's
   slot into the reader's own slot, elements of esz bytes */
__global__ void g4f_kv_copy(g4_kv_slot *slots, int src, int dst, int n, int pos0, int kvbf) {
    int ca = slots[src].capacity, cb = slots[dst].capacity;
    size_t W = (size_t)slots[src].kv_heads * slots[src].head_dim;
    const uint16_t *ak16 = (const uint16_t *)(const void *)slots[src].k, *av16 = (const uint16_t *)(const void *)slots[src].v;
    uint16_t *bk16 = (uint16_t *)(void *)slots[dst].k, *bv16 = (uint16_t *)(void *)slots[dst].v;
    const float *ak = slots[src].k, *av = slots[src].v;
    float *bk = slots[dst].k, *bv = slots[dst].v;
    G4C_FOR(idx, (size_t)n * W) {
        int p = pos0 + (int)(idx / W);
        size_t ra = (size_t)(p % ca) * W + idx % W, rb = (size_t)(p % cb) * W + idx % W;
        if (kvbf) {
            bk16[rb] = ak16[ra];
            bv16[rb] = av16[ra];
        } else {
            bk[rb] = ak[ra];
            bv[rb] = av[ra];
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) slots[dst].n_pos = pos0 + n;
}

/* Per head row of D (rows = tokens x heads): RMSNorm (w NULL: none), then
   RoPE (inv_freq NULL: none), each step rounded in the bf16 mode as the exact
   mode rounds it; one warp per row. slot >= 0: the row goes to that slot of
   the device table (the K/V append: token t at row (pos0 + t) % capacity,
   bf16 when kvbf, which then holds positions up to pos0 + tokens; `which`
   0 = k, 1 = v), else back to x. */
__global__ void g4f_norm_rope(float *x, const void *w, int dt, const float *inv_freq, int rows, int heads, int D,
                              int pos0, float eps, int bf, g4_kv_slot *slots, int slot, int which, int kvbf) {
    int lane = (int)threadIdx.x % 32, wpb = (int)blockDim.x / 32, half = D / 2;
    for (size_t r = blockIdx.x * (size_t)wpb + threadIdx.x / 32; r < (size_t)rows; r += (size_t)gridDim.x * wpb) {
        float *xr = x + r * (size_t)D, ss = 0.0f, inv;
        int t = (int)(r / (size_t)heads), h = (int)(r % (size_t)heads), pos = pos0 + t;
        float *dst = xr;
        if (slot >= 0) { /* fields one by one: block 0's thread 0 writes n_pos meanwhile */
            size_t row = (size_t)(pos % slots[slot].capacity) * (size_t)slots[slot].kv_heads * (size_t)D + (size_t)h * D;
            dst = which ? slots[slot].v : slots[slot].k;
            dst = kvbf ? (float *)(void *)((uint16_t *)(void *)dst + row) : dst + row;
        }
        for (int i = lane; i < D; i += 32) ss = __fmaf_rn(xr[i], xr[i], ss);
        ss = g4f__warp_sum(ss);
        inv = 1.0f / sqrtf(__fadd_rn(ss / (float)D, eps));
        for (int j = lane; j < half; j += 32) {
            float x1 = __fmul_rn(xr[j], inv), x2 = __fmul_rn(xr[j + half], inv), o1, o2;
            if (w) {
                x1 = __fmul_rn(x1, g4c__ld(w, dt, (size_t)j));
                x2 = __fmul_rn(x2, g4c__ld(w, dt, (size_t)(j + half)));
            }
            x1 = g4__act(x1, bf);
            x2 = g4__act(x2, bf);
            if (inv_freq) {
                float a = __fmul_rn((float)pos, inv_freq[j]), c = cosf(a), s = sinf(a);
                if (bf) {
                    c = g4__bf16_round(c);
                    s = g4__bf16_round(s);
                    o1 = g4__bf16_round(__fadd_rn(g4__bf16_round(__fmul_rn(x1, c)), g4__bf16_round(__fmul_rn(-x2, s))));
                    o2 = g4__bf16_round(__fadd_rn(g4__bf16_round(__fmul_rn(x2, c)), g4__bf16_round(__fmul_rn(x1, s))));
                } else {
                    o1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
                    o2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
                }
            } else {
                o1 = x1;
                o2 = x2;
            }
            if (slot >= 0 && kvbf) {
                uint16_t *d16 = (uint16_t *)(void *)dst;
                d16[j] = (uint16_t)(__float_as_uint(g4__bf16_round(o1)) >> 16);
                d16[j + half] = (uint16_t)(__float_as_uint(g4__bf16_round(o2)) >> 16);
            } else {
                dst[j] = o1;
                dst[j + half] = o2;
            }
        }
    }
    if (slot >= 0 && blockIdx.x == 0 && threadIdx.x == 0) slots[slot].n_pos = pos0 + rows / heads;
}

/* Flash attention over the table, FlashAttention-2's tiling on CUDA cores:
   block (query tile, KV head g, split sp) takes bq tokens of the chunk (a
   prefill tile; 1 for a decode step) with all the query heads of KV head g,
   R = bq * group rows, and the split's share of their keys, in tiles of
   G4F_KEYS. Each key row is read once for the whole tile: a warp per key,
   the lanes over d, the rows 8 at a time. Causality and the sliding window
   mask per row (a masked score is -inf). Then per row (thread rr):
     pass G4F_ONLINE: the online softmax, running max m and sum l, and
       acc[rr][d] = acc * exp(m_old - m) + sum_j p_j v_j[d]; writes (m, l,
       acc[D]) per (t, head, split) to part for g4f_attn_combine;
     pass G4F_STATS: only (m, l), to part, for g4f_attn_stats;
     pass G4F_FIXED (the bf16 mode's second pass): the final max M and 1/L
       of the row from stats, p_j = bf16(exp(s_j - M) * (1/L)) as the
       bf16-faithful mode rounds its probabilities, acc += p_j v_j; writes
       (M, 1, acc) for g4f_attn_combine.
   The bf16 mode runs STATS then FIXED (the keys are read twice), so its
   probabilities round where the exact mode's do; float32 runs ONLINE. The
   device's table checks as g4c_attention's (status). Tensor cores are not
   used here (a score is a float32 dot product of lanes). */
enum { G4F_ONLINE = 0, G4F_STATS = 1, G4F_FIXED = 2 };
#define G4F_ROWS 64 /* attention: most query rows (tokens x heads of a group) per block */
static_assert(G4F_ROWS <= G4F_THREADS, "a thread per attention row");

__global__ void g4f_attention(float *part, const float *stats, const float *q, const g4_kv_slot *slots, int slot, int n,
                              int NH, int KVH, int D, int pos0, int window, int splits, int bq, int layer, int *status,
                              int kvbf, int bf, int pass) {
    __shared__ float qs[G4F_QMAX], acc[G4F_QMAX], sc[G4F_ROWS][G4F_KEYS], ms[G4F_ROWS], ls[G4F_ROWS], al[G4F_ROWS];
    int tid = (int)threadIdx.x, lane = tid % 32, warp = tid / 32, nwarp = (int)blockDim.x / 32, group = NH / KVH;
    int tiles = (n + bq - 1) / bq;
    g4_kv_slot sl = slots[slot];
    size_t stride = (size_t)sl.kv_heads * sl.head_dim;
    G4C_ROWS(r, tiles * KVH * splits) {
        int t0 = r / (KVH * splits) * bq, g = r / splits % KVH, sp = r % splits;
        int nt = n - t0 < bq ? n - t0 : bq, R = nt * group, pf = pos0 + t0, pl = pf + nt - 1;
        int lo = window && pf - window + 1 > 0 ? pf - window + 1 : 0, cnt = pl - lo + 1, per = (cnt + splits - 1) / splits;
        int k0 = lo + sp * per, k1 = k0 + per < pl + 1 ? k0 + per : pl + 1;
        if (g4c__slot_check(&sl, pos0 + n, D, KVH, lo, layer, status)) continue;
        for (int i = tid; i < R * D; i += (int)blockDim.x) { /* rows in (token, head) order: contiguous in q */
            qs[i] = q[((size_t)t0 * NH + (size_t)g * group) * D + (size_t)(i / (group * D)) * NH * D + i % (group * D)];
            acc[i] = 0.0f;
        }
        if (tid < R) {
            const float *st = stats + ((size_t)(t0 + tid / group) * NH + (size_t)g * group + tid % group) * 2;
            ms[tid] = pass == G4F_FIXED ? st[0] : -INFINITY;
            ls[tid] = pass == G4F_FIXED ? st[1] : 0.0f; /* FIXED: 1/L */
            al[tid] = 1.0f;
        }
        __syncthreads();
        for (int kt = k0; kt < k1; kt += G4F_KEYS) {
            int nk = k1 - kt < G4F_KEYS ? k1 - kt : G4F_KEYS;
            for (int j = warp; j < nk; j += nwarp) { /* j is the warp's: the shuffles stay converged */
                const float *key = sl.k;
                size_t base = (size_t)((kt + j) % sl.capacity) * stride + (size_t)g * D;
                int kp = kt + j;
                for (int c0 = 0; c0 < R; c0 += G4F_GROUP) { /* 8 rows at a time; R is the block's */
                    float dot[G4F_GROUP];
                    G4F_UNROLL_LOOP
                    for (int h = 0; h < G4F_GROUP; h++) dot[h] = 0.0f;
                    for (int d0 = lane * 8; d0 < D; d0 += 256) { /* 8 elements: one 16-byte load (bf16) or two */
                        float kf[8];
                        if (kvbf) {
                            uint4 raw[2] = {*(const uint4 *)(const void *)((const uint16_t *)(const void *)key + base + d0),
                                            make_uint4(0u, 0u, 0u, 0u)};
                            g4f__unpack8(kf, raw, G4_BF16);
                        } else {
                            const float4 *kp4 = (const float4 *)(const void *)(key + base + d0);
                            float4 a = kp4[0], b = kp4[1];
                            kf[0] = a.x; kf[1] = a.y; kf[2] = a.z; kf[3] = a.w;
                            kf[4] = b.x; kf[5] = b.y; kf[6] = b.z; kf[7] = b.w;
                        }
                        G4F_UNROLL_LOOP
                        for (int h = 0; h < G4F_GROUP; h++)
                            if (c0 + h < R)
                                for (int e = 0; e < 8; e++) dot[h] = __fmaf_rn(qs[(c0 + h) * D + d0 + e], kf[e], dot[h]);
                    }
                    G4F_UNROLL_LOOP
                    for (int h = 0; h < G4F_GROUP; h++)
                        if (c0 + h < R) { /* R is the block's: the shuffles stay converged */
                            float v = g4f__warp_sum(dot[h]);
                            int p = pf + (c0 + h) / group, lo_r = window && p - window + 1 > 0 ? p - window + 1 : 0;
                            if (lane == 0) sc[c0 + h][j] = kp >= lo_r && kp <= p ? g4__act(v, bf) : -INFINITY;
                        }
                }
            }
            __syncthreads();
            if (tid < R && pass == G4F_FIXED) { /* the final probabilities, rounded as the exact mode's */
                for (int j = 0; j < nk; j++)
                    sc[tid][j] = sc[tid][j] == -INFINITY ? 0.0f
                                                         : g4__act(__fmul_rn(expf(__fsub_rn(sc[tid][j], ms[tid])), ls[tid]), bf);
            } else if (tid < R) { /* the online softmax of row tid over this tile */
                float m = ms[tid], mx = m, sum = 0.0f, a;
                for (int j = 0; j < nk; j++) mx = sc[tid][j] > mx ? sc[tid][j] : mx;
                for (int j = 0; j < nk; j++) {
                    float e = sc[tid][j] == -INFINITY ? 0.0f : expf(__fsub_rn(sc[tid][j], mx));
                    sc[tid][j] = e;
                    sum = __fadd_rn(sum, e);
                }
                a = m == -INFINITY ? 0.0f : expf(__fsub_rn(m, mx));
                ls[tid] = __fmaf_rn(ls[tid], a, sum);
                ms[tid] = mx;
                al[tid] = a;
            }
            __syncthreads();
            if (pass != G4F_STATS)
                for (int i = tid; i < R * D; i += (int)blockDim.x) {
                    /* the tile's sum first (from zero), then one rescale-and-add into the running acc: each
                       key's term is rounded against a sum of at most G4F_KEYS terms, not against the whole
                       split's (a split of N keys: rounding error ~ sqrt(G4F_KEYS) + sqrt(N / G4F_KEYS) ulps
                       instead of ~ sqrt(N); 4.2e-6 -> 7.6e-7 of max|out| at 16k keys in one split, see
                       docs/cuda.md) */
                    int rr = i / D, d = i % D;
                    float t = 0.0f;
                    for (int j = 0; j < nk; j++)
                        t = __fmaf_rn(sc[rr][j], g4f__kv(sl.v, kvbf, (size_t)((kt + j) % sl.capacity) * stride + (size_t)g * D + d), t);
                    acc[i] = __fmaf_rn(acc[i], al[rr], t);
                }
            __syncthreads();
        }
        for (int i = tid; i < R * D; i += (int)blockDim.x) {
            int rr = i / D, d = i % D;
            float *pr = part + (((size_t)(t0 + rr / group) * NH + (size_t)g * group + rr % group) * splits + sp) * (size_t)(D + 2);
            if (d == 0) {
                pr[0] = ms[rr];
                pr[1] = pass == G4F_FIXED ? 1.0f : ls[rr];
            }
            if (pass != G4F_STATS) pr[2 + d] = acc[i];
        }
        __syncthreads(); /* the shared tiles are the next row's */
    }
}

/* G4F_STATS' finish: per (t, head) row the max M over the splits and 1/L,
   L = sum_s l_s e^(m_s - M), splits in order */
__global__ void g4f_attn_stats(float *stats, const float *part, int rows, int D, int splits) {
    G4C_FOR(r, (size_t)rows) {
        const float *pr = part + r * (size_t)splits * (size_t)(D + 2);
        float M = -INFINITY, L = 0.0f;
        for (int s = 0; s < splits; s++)
            if (pr[(size_t)s * (D + 2) + 1] > 0.0f && pr[(size_t)s * (D + 2)] > M) M = pr[(size_t)s * (D + 2)];
        for (int s = 0; s < splits; s++) {
            const float *ps = pr + (size_t)s * (D + 2);
            if (ps[1] > 0.0f) L = __fmaf_rn(ps[1], expf(__fsub_rn(ps[0], M)), L);
        }
        stats[2 * r] = M;
        stats[2 * r + 1] = 1.0f / L;
    }
}

/* out[t][h][d] = sum_s acc_s[d] e^(m_s - M) / sum_s l_s e^(m_s - M), splits in
   order (an empty split has l = 0 and adds nothing). After G4F_FIXED every
   split has m = M and l = 1 and acc is normalised: out = sum_s acc_s[d]. */
__global__ void g4f_attn_combine(float *att, const float *part, int rows, int D, int splits, int bf, int fixed) {
    G4C_FOR(idx, (size_t)rows * D) {
        size_t r = idx / (size_t)D, d = idx % (size_t)D;
        const float *pr = part + r * (size_t)splits * (size_t)(D + 2);
        float M = -INFINITY, L = 0.0f, o = 0.0f;
        if (fixed) {
            for (int s = 0; s < splits; s++) o = __fadd_rn(o, pr[(size_t)s * (D + 2) + 2 + d]);
            att[idx] = g4__act(o, bf);
            continue;
        }
        for (int s = 0; s < splits; s++)
            if (pr[(size_t)s * (D + 2) + 1] > 0.0f && pr[(size_t)s * (D + 2)] > M) M = pr[(size_t)s * (D + 2)];
        for (int s = 0; s < splits; s++) {
            const float *ps = pr + (size_t)s * (D + 2);
            float e;
            if (!(ps[1] > 0.0f)) continue;
            e = expf(__fsub_rn(ps[0], M));
            L = __fmaf_rn(ps[1], e, L);
            o = __fmaf_rn(ps[2 + d], e, o);
        }
        att[idx] = g4__act(o / L, bf);
    }
}

/* ------------------------------------------------------ fast launchers */

/* split-K slices for an output of `out` rows summing `in` inputs, n tokens:
   only a decode-sized pass is split (a chunk has blocks enough) */
static int g4f__splits(int in, int out, int n) {
    int s = out < G4F_NARROW && n <= G4F_TOKENS ? (in + G4F_SPLIT_IN - 1) / G4F_SPLIT_IN : 1;
    return s < 1 ? 1 : s > G4F_MAX_SPLIT ? G4F_MAX_SPLIT : s;
}

/* y = epilogue(x W^T (, x W2^T)) for n rows: G4F_TOKENS rows per pass */
static g4_result g4f__linear(g4_cuda_session *s, float *y, const float *x, const g4_tensor *w, const g4_tensor *w2,
                             int n, int epi, float cap) {
    int out = (int)w->shape[0], in = (int)w->shape[1], splits = g4f__splits(in, out, n), nw = w2 ? 2 : 1;
    int vec = in % 8 == 0 && (uintptr_t)w->data % 16 == 0 && (!w2 || (uintptr_t)w2->data % 16 == 0) &&
              (uintptr_t)x % 16 == 0;
    if (w2 && (w2->dtype != w->dtype || w2->shape[0] != w->shape[0] || w2->shape[1] != w->shape[1])) {
        g4__seterr(s->error, "internal: fused gate/up need one shape and dtype");
        return G4_ERR_INPUT;
    }
    if (n > G4F_TOKENS) { /* a prefill chunk: the tiled GEMM, tensor cores in the bf16 mode (not with
                             G4_CUDA_MATMUL_PLAIN: CUDA cores only, the MMA path's check) */
        size_t tiles = (size_t)((n + G4F_GM - 1) / G4F_GM) * (size_t)((out + G4F_GN - 1) / G4F_GN);
        G4C_RUN(s->error, g4f_gemm, g4c__grid(tiles, 1), G4F_GM / 16 * 32, y, x, w->data, w2 ? w2->data : NULL,
                (int)w->dtype, n, in, out, s->cfg.bf16 && w->dtype == G4_BF16 && s->matmul != G4_CUDA_MATMUL_PLAIN, epi,
                cap, s->cfg.bf16);
        return G4_OK;
    }
    for (int t0 = 0; t0 < n; t0 += G4F_TOKENS) {
        int k = n - t0 < G4F_TOKENS ? n - t0 : G4F_TOKENS;
        float *yt = y + (size_t)t0 * out;
        const float *xt = x + (size_t)t0 * in;
        G4C_RUN(s->error, g4f_matvec, g4c__grid((size_t)out * splits, G4F_THREADS / 32), G4F_THREADS, yt, s->d_part, xt,
                w->data, w2 ? w2->data : NULL, (int)w->dtype, k, in, out, splits, vec, epi, cap, s->cfg.bf16);
        if (splits > 1)
            G4C_RUN(s->error, g4f_splitk_sum, g4c__grid((size_t)k * out, G4F_THREADS), G4F_THREADS, yt, s->d_part, k,
                    out, splits, nw, epi, cap, s->cfg.bf16);
    }
    return G4_OK;
}

static g4_result g4f__rmsnorm(g4_cuda_session *s, float *y, const float *x, const g4_tensor *w, int rows, int n) {
    G4C_RUN(s->error, g4f_rmsnorm, g4c__grid((size_t)rows, 1), G4F_THREADS, y, x, w ? w->data : NULL,
            w ? (int)w->dtype : 0, rows, n, s->model->host->config.rms_norm_eps, s->cfg.bf16);
    return G4_OK;
}

/* Flash-decoding: the KV splits of a decode step (n == 1) over `cnt` keys
   of a layer with KVH KV heads, sized to fill the card: about
   G4F_BLOCKS_PER_SM blocks per multiprocessor (s->sms, read at init)
   whatever KVH is, each split at least G4F_KV_SPLIT keys, at most
   G4F_MAX_KV_SPLIT splits (g4_cuda_config.kv_splits > 0 asks for that many
   instead). A chunk of several tokens has blocks enough: one split. The
   count depends only on the shapes and positions, and g4f_attn_combine adds
   the splits in split order, so a run repeats bit for bit. */
static int g4f__kv_splits(const g4_cuda_session *s, int n, int cnt, int KVH) {
    int want, most = (cnt + G4F_KV_SPLIT - 1) / G4F_KV_SPLIT;
    if (n != 1) return 1;
    want = s->cuda.kv_splits > 0 ? s->cuda.kv_splits : (G4F_BLOCKS_PER_SM * s->sms + KVH - 1) / KVH;
    if (s->cuda.kv_splits <= 0 && want > most) want = most;
    if (want > cnt) want = cnt;
    return want < 1 ? 1 : want > G4F_MAX_KV_SPLIT ? G4F_MAX_KV_SPLIT : want;
}

/* this step's K and V rows of the slot layer l attends over, as float32 (the
   "self_attn.k" / ".v" taps). A bf16 cache: the rows are copied into the
   upper half of the staging area and widened upwards in place (float i is
   written after bf16 i, ..., 2i - count + 1 <= i have been read). */
static g4_result g4f__tap_kv(g4_cuda_session *s, int l, int slot, int n, int pos0, int kvw) {
    const g4_kv_slot *sv = &s->slots[slot];
    size_t esz = s->kv_bf16 ? 2 : 4, count = (size_t)n * (size_t)kvw;
    for (int which = 0; which < 2; which++) {
        unsigned char *dst = (unsigned char *)s->stage + (s->kv_bf16 ? count * 2 : 0);
        for (int t = 0; t < n; t++)
            G4C_CHECK(s->error, cudaMemcpy(dst + (size_t)t * kvw * esz,
                                           (const unsigned char *)(which ? sv->v : sv->k) +
                                               (size_t)((pos0 + t) % sv->capacity) * kvw * esz,
                                           (size_t)kvw * esz, cudaMemcpyDeviceToHost));
        if (s->kv_bf16)
            for (size_t i = 0; i < count; i++) {
                uint16_t h;
                uint32_t u;
                memcpy(&h, dst + 2 * i, 2);
                u = (uint32_t)h << 16;
                memcpy((unsigned char *)s->stage + 4 * i, &u, 4);
            }
        G4C_TRY(g4c__tap(s, which ? G4__TAP_V : G4__TAP_K, l, s->stage, 0, n, kvw));
    }
    return G4_OK;
}

/* g4__attention in the fast mode: s->d_xn -> s->d_branch for layer l */
static g4_result g4f__attention(g4_cuda_session *s, int l, int n) {
    const g4_model *m = s->model->host;
    const g4_layer_plan *lp = &m->plan.layer[l];
    const g4_layer_weights *lw = &s->model->w.layers[l];
    const float *inv_freq = s->d_inv_freq[lp->type];
    const float eps = m->config.rms_norm_eps;
    int NH = m->config.num_attention_heads, D = lp->head_dim, KVH = lp->kv_heads, pos0 = s->pos, slot, bf = s->cfg.bf16;
    int window = lp->type == G4_SLIDING ? m->config.sliding_window : 0, last = pos0 + n - 1;
    int lo = window && last - window + 1 > 0 ? last - window + 1 : 0, splits = g4f__kv_splits(s, n, last - lo + 1, KVH);
    int group = NH / KVH, bq = G4F_ROWS / group, tiles;
    unsigned wgrid;
    if (bq > G4F_QMAX / (group * D)) bq = G4F_QMAX / (group * D); /* the tile's queries fit the block */
    if (bq > n) bq = n;
    if (bq < 1) bq = 1;
    tiles = (n + bq - 1) / bq;

    /* queries: q_proj, then q_norm and RoPE in one pass */
    G4C_TRY(g4f__linear(s, s->d_q, s->d_xn, &lw->q_proj, NULL, n, G4F_PLAIN, 0.0f));
    wgrid = g4c__grid((size_t)n * NH, G4F_THREADS / 32);
    G4C_RUN(s->error, g4f_norm_rope, wgrid, G4F_THREADS, s->d_q, lw->q_norm.data, (int)lw->q_norm.dtype, inv_freq,
            n * NH, NH, D, pos0, eps, bf, s->d_slots, -1, 0, 0);
    G4C_TRY(g4c__tap(s, G4__TAP_Q, l, s->d_q, 1, n, NH * D));

    if (lp->reads < 0) {
        /* an owner: k_proj (v_proj, or V = raw K); k_norm + RoPE and v_norm
           write straight into the slot */
        g4_kv_slot *sl = &s->slots[lp->kv_slot];
        if (sl->writer != l || sl->n_pos != pos0) {
            g4__seterr(s->error, "internal: layer %d's slot was written out of order", l);
            return G4_ERR_INPUT;
        }
        G4C_TRY(g4f__linear(s, s->d_k_new, s->d_xn, &lw->k_proj, NULL, n, G4F_PLAIN, 0.0f));
        if (lp->has_v_proj) G4C_TRY(g4f__linear(s, s->d_v_new, s->d_xn, &lw->v_proj, NULL, n, G4F_PLAIN, 0.0f));
        wgrid = g4c__grid((size_t)n * KVH, G4F_THREADS / 32);
        /* V first: without v_proj it is the raw K, which the K pass does not touch (it writes the slot) */
        G4C_RUN(s->error, g4f_norm_rope, wgrid, G4F_THREADS, lp->has_v_proj ? s->d_v_new : s->d_k_new, (const void *)NULL,
                0, (const float *)NULL, n * KVH, KVH, D, pos0, eps, bf, s->d_slots, lp->kv_slot, 1, s->kv_bf16);
        G4C_RUN(s->error, g4f_norm_rope, wgrid, G4F_THREADS, s->d_k_new, lw->k_norm.data, (int)lw->k_norm.dtype, inv_freq,
                n * KVH, KVH, D, pos0, eps, bf, s->d_slots, lp->kv_slot, 0, s->kv_bf16);
        g4c__held(sl, pos0 + n);
    } else if (s->layer_slot[l] != lp->kv_slot) {
        G4C_RUN(s->error, g4f_kv_copy, g4c__grid((size_t)n * KVH * D, G4F_THREADS), G4F_THREADS, s->d_slots,
                lp->kv_slot, s->layer_slot[l], n, pos0, s->kv_bf16);
        g4c__held(&s->slots[s->layer_slot[l]], pos0 + n);
    }

    slot = s->layer_slot[l];
    if (s->slots[slot].n_pos != pos0 + n) {
        g4__seterr(s->error, "internal: layer %d reads slot %d before its writer (layer %d) appended this step", l,
                   slot, s->slots[slot].writer);
        return G4_ERR_INPUT;
    }
    if (s->cfg.tap) G4C_TRY(g4f__tap_kv(s, l, slot, n, pos0, KVH * D));
    if (bf) { /* the probabilities rounded as the bf16-faithful mode's: the max and sum first */
        G4C_RUN(s->error, g4f_attention, g4c__grid((size_t)tiles * KVH * splits, 1), G4F_THREADS, s->d_part,
                (const float *)s->d_stats, s->d_q, s->d_slots, slot, n, NH, KVH, D, pos0, window, splits, bq, l,
                s->d_status, s->kv_bf16, bf, (int)G4F_STATS);
        G4C_RUN(s->error, g4f_attn_stats, g4c__grid((size_t)n * NH, G4F_THREADS), G4F_THREADS, s->d_stats, s->d_part,
                n * NH, D, splits);
    }
    G4C_RUN(s->error, g4f_attention, g4c__grid((size_t)tiles * KVH * splits, 1), G4F_THREADS, s->d_part,
            (const float *)s->d_stats, s->d_q, s->d_slots, slot, n, NH, KVH, D, pos0, window, splits, bq, l, s->d_status,
            s->kv_bf16, bf, bf ? (int)G4F_FIXED : (int)G4F_ONLINE);
    G4C_RUN(s->error, g4f_attn_combine, g4c__grid((size_t)n * NH * D, G4F_THREADS), G4F_THREADS, s->d_att, s->d_part,
            n * NH, D, splits, bf, bf);
    G4C_TRY(g4f__linear(s, s->d_branch, s->d_att, &lw->o_proj, NULL, n, G4F_PLAIN, 0.0f));
    return g4c__tap(s, G4__TAP_ATTN, l, s->d_branch, 1, n, m->config.hidden_size);
}


/* g4__layer in the fast mode: Gemma4TextDecoderLayer l on d_x in place, the
   exact mode's steps and taps with the fused kernels above */
static g4_result g4f__layer(g4_cuda_session *s, int l, int n) {
    const g4_config *c = &s->model->host->config;
    const g4_layer_weights *lw = &s->model->w.layers[l];
    int H = c->hidden_size, P = c->hidden_size_per_layer_input, bf = s->cfg.bf16;
    unsigned rows = g4c__grid((size_t)n, 1);
    size_t nh = (size_t)n * H;

    /* 1. attention block; its post-norm, the residual add and the MLP's pre-norm in one pass */
    G4C_TRY(g4c__norm_rows(s, s->d_xn, s->d_x, &lw->input_layernorm, n, H, l, G4__TAP_INPUT_LAYERNORM));
    G4C_TRY(g4f__attention(s, l, n));
    G4C_RUN(s->error, g4f_norm_add_norm, rows, G4F_THREADS, s->d_x, s->d_branch, s->d_xn,
            lw->post_attention_layernorm.data, lw->pre_feedforward_layernorm.data, (int)lw->post_attention_layernorm.dtype,
            (int)lw->pre_feedforward_layernorm.dtype, n, H, c->rms_norm_eps, bf);
    G4C_TRY(g4c__tap(s, G4__TAP_POST_ATTENTION_LAYERNORM, l, s->d_branch, 1, n, H));
    G4C_TRY(g4c__tap(s, G4__TAP_RESIDUAL, l, s->d_x, 1, n, H));
    G4C_TRY(g4c__tap(s, G4__TAP_PRE_FEEDFORWARD_LAYERNORM, l, s->d_xn, 1, n, H));

    /* 2. feed-forward block: gate and up in one pass with the GELU product, then down */
    G4C_TRY(g4f__linear(s, s->d_gate, s->d_xn, &lw->gate_proj, &lw->up_proj, n, G4F_GELU_MUL, 0.0f));
    G4C_TRY(g4f__linear(s, s->d_branch, s->d_gate, &lw->down_proj, NULL, n, G4F_PLAIN, 0.0f));
    G4C_TRY(g4c__tap(s, G4__TAP_MLP, l, s->d_branch, 1, n, H));
    /* 3. MoE beside the dense MLP (the exact kernels, fast norms and router) */
    if (s->model->host->plan.layer[l].moe) G4C_TRY(g4c__moe_block(s, l, n));
    /* 4. the post-norm and the residual add */
    G4C_RUN(s->error, g4f_norm_add_norm, rows, G4F_THREADS, s->d_x, s->d_branch, (float *)NULL,
            lw->post_feedforward_layernorm.data, (const void *)NULL, (int)lw->post_feedforward_layernorm.dtype, 0, n, H,
            c->rms_norm_eps, bf);
    G4C_TRY(g4c__tap(s, G4__TAP_POST_FEEDFORWARD_LAYERNORM, l, s->d_branch, 1, n, H));

    /* 5. per-layer input */
    if (P) {
        int LP = c->num_hidden_layers * P;
        G4C_TRY(g4f__linear(s, s->d_per_layer_gate, s->d_x, &lw->per_layer_input_gate, NULL, n, G4F_PLAIN, 0.0f));
        G4C_TRY(g4c__tap(s, G4__TAP_PER_LAYER_INPUT_GATE, l, s->d_per_layer_gate, 1, n, P));
        G4C_RUN(s->error, g4c_ple_gate, g4c__grid((size_t)n * P, G4C_THREADS), G4C_THREADS, s->d_per_layer_gate,
                s->d_per_layer_inputs, n, P, LP, l, bf, (size_t)0, (size_t)n * P);
        G4C_TRY(g4f__linear(s, s->d_branch, s->d_per_layer_gate, &lw->per_layer_projection, NULL, n, G4F_PLAIN, 0.0f));
        G4C_TRY(g4c__tap(s, G4__TAP_PER_LAYER_PROJECTION, l, s->d_branch, 1, n, H));
        G4C_RUN(s->error, g4f_norm_add_norm, rows, G4F_THREADS, s->d_x, s->d_branch, (float *)NULL,
                lw->post_per_layer_input_norm.data, (const void *)NULL, (int)lw->post_per_layer_input_norm.dtype, 0, n, H,
                c->rms_norm_eps, bf);
        G4C_TRY(g4c__tap(s, G4__TAP_POST_PER_LAYER_INPUT_NORM, l, s->d_branch, 1, n, H));
    }

    /* 6. layer_scalar */
    G4C_RUN(s->error, g4c_layer_scalar, g4c__grid(nh, G4C_THREADS), G4C_THREADS, s->d_x, nh, lw->layer_scalar.data,
            (int)lw->layer_scalar.dtype);
    G4C_TRY(g4c__act(s, s->d_x, nh));
    return g4c__tap(s, G4__TAP_LAYER, l, s->d_x, 1, n, H);
}

/* The fast mode's limits (attention: one block holds a KV head's query
   heads; 16-byte K rows), checked when a session is sized or made. */
static g4_result g4f__check(const g4_model *m, char *err) {
    int NH = m->config.num_attention_heads;
    for (int i = 0; i < m->plan.n_layers; i++) {
        const g4_layer_plan *lp = &m->plan.layer[i];
        int D = lp->head_dim, KVH = lp->kv_heads;
        if (KVH < 1 || NH % KVH || NH / KVH > G4F_GROUP || (NH / KVH) * D > G4F_QMAX || D % 8) {
            g4__seterr(err, "CUDA fast mode: layer %d (%d heads, %d KV heads, head_dim %d) is outside its attention "
                       "kernel (at most %d heads per KV head, heads per KV head x head_dim <= %d, head_dim a multiple "
                       "of 8); use the exact mode", i, NH, KVH, D, G4F_GROUP, G4F_QMAX);
            return G4_ERR_CONFIG;
        }
    }
    return G4_OK;
}

/* --------------------------------------------------------------- public */

extern "C" {

G4_CUDA_API g4_result g4_cuda_malloc(void **p, size_t bytes, char *err) {
    if (!p) return G4_ERR_INPUT;
    *p = NULL;
    G4C_CHECK(err, cudaMalloc(p, bytes));
    return G4_OK;
}

G4_CUDA_API void g4_cuda_free(void *p) { (void)cudaFree(p); }

G4_CUDA_API g4_result g4_cuda_device_check(char *desc, size_t desc_len, char *err) {
    int n = 0;
    cudaDeviceProp prop;
    G4C_CHECK(err, cudaGetDeviceCount(&n));
    if (n < 1) { g4__seterr(err, "no CUDA device"); return G4_ERR_CUDA; }
    G4C_CHECK(err, cudaGetDeviceProperties(&prop, 0));
    if (desc && desc_len) snprintf(desc, desc_len, "%s (sm_%d%d), %d device(s)", prop.name, prop.major, prop.minor, n);
    return G4_OK;
}

/* Every tensor of a g4_weights / g4_layer_weights, visited in a fixed order. */
#define G4C_GLOBAL_TENSORS 6
static g4_tensor *g4c__global_tensor(g4_weights *w, int i) {
    g4_tensor *t[G4C_GLOBAL_TENSORS] = {&w->embed_tokens, &w->embed_tokens_per_layer, &w->per_layer_model_projection,
                                        &w->per_layer_projection_norm, &w->norm, &w->lm_head};
    return t[i];
}
/* g4_layer_weights holds only g4_tensor fields: visit them as an array, so a
   field added later is uploaded without touching this file. */
static_assert(sizeof(g4_layer_weights) % sizeof(g4_tensor) == 0, "g4_layer_weights must hold only g4_tensor fields");
#define G4C_LAYER_TENSORS ((int)(sizeof(g4_layer_weights) / sizeof(g4_tensor)))

static size_t g4c__tensor_bytes(const g4_tensor *t) {
    size_t n = 1;
    for (int k = 0; k < t->ndim; k++) n *= (size_t)t->shape[k];
    return n * g4__dtype_size(t->dtype);
}

/* Walks every bound tensor: sizes the block (base NULL) or uploads into it. */
static g4_result g4c__upload_walk(g4_cuda_model *cm, const g4_model *m, unsigned char *base, size_t *total) {
    size_t off = 0;
    int L = m->config.num_hidden_layers;
    for (int l = -1; l < L; l++) {
        int cnt = l < 0 ? G4C_GLOBAL_TENSORS : G4C_LAYER_TENSORS;
        for (int i = 0; i < cnt; i++) {
            g4_tensor *src = l < 0 ? g4c__global_tensor((g4_weights *)&m->w, i) : (g4_tensor *)(void *)&m->w.layers[l] + i;
            g4_tensor *dst = l < 0 ? g4c__global_tensor(&cm->w, i) : (g4_tensor *)(void *)&cm->w.layers[l] + i;
            size_t bytes;
            if (!src->data) continue;
            if (l < 0 && i == 5 && src->data == m->w.embed_tokens.data) { /* tied head: the same device copy */
                if (base) dst->data = cm->w.embed_tokens.data;
                continue;
            }
            bytes = g4c__tensor_bytes(src);
            if (base) {
                G4C_CHECK(cm->error, cudaMemcpy(base + off, src->data, bytes, cudaMemcpyHostToDevice));
                dst->data = base + off;
            }
            off += (bytes + 255) & ~(size_t)255;
        }
    }
    *total = off;
    return G4_OK;
}

G4_CUDA_API void g4_cuda_model_free(g4_cuda_model *cm) {
    if (!cm) return;
    if (cm->d_weights) (void)cudaFree(cm->d_weights);
    free(cm->w.layers);
    cm->d_weights = NULL;
    cm->w.layers = NULL;
}

G4_CUDA_API g4_result g4_cuda_model_upload(g4_cuda_model *cm, const g4_model *m) {
    size_t total = 0;
    g4_result r;
    void *block = NULL;
    if (!cm) return G4_ERR_INPUT;
    memset(cm, 0, sizeof *cm);
    if (!m || !m->w.layers) { g4__seterr(cm->error, "NULL or unloaded model"); return G4_ERR_INPUT; }
    if (m->lora) { g4__seterr(cm->error, "the model has a LoRA adapter: adapters run on the CPU path only"); return G4_ERR_INPUT; }
    if (m->config.bidirectional == G4_BIDIR_ALL) {
        g4__seterr(cm->error, "use_bidirectional_attention \"all\": the CUDA attention is causal only (the CPU path has it)");
        return G4_ERR_CONFIG;
    }
    if (m->config.enable_moe_block && m->config.top_k_experts > G4_MAX_TOP_K) {
        g4__seterr(cm->error, "top_k_experts %d: the CUDA router handles at most %d", m->config.top_k_experts,
                   G4_MAX_TOP_K);
        return G4_ERR_CONFIG;
    }
    cm->host = m;
    cm->w = m->w;
    cm->w.layers = (g4_layer_weights *)malloc(sizeof(g4_layer_weights) * (size_t)m->config.num_hidden_layers);
    if (!cm->w.layers) { g4__seterr(cm->error, "out of memory for the layer table"); return G4_ERR_NOMEM; }
    memcpy(cm->w.layers, m->w.layers, sizeof(g4_layer_weights) * (size_t)m->config.num_hidden_layers);
    g4c__upload_walk(cm, m, NULL, &total);
    {
        cudaError_t e = cudaMalloc(&block, total);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            g4__seterr(cm->error, "cudaMalloc of %lu bytes for the weights failed: %s", (unsigned long)total,
                       cudaGetErrorString(e));
            g4_cuda_model_free(cm);
            return e == cudaErrorMemoryAllocation ? G4_ERR_NOMEM : G4_ERR_CUDA;
        }
    }
    cm->d_weights = block;
    cm->weight_bytes = total;
    if ((r = g4c__upload_walk(cm, m, (unsigned char *)block, &total)) != G4_OK) {
        char keep[G4_ERROR_MAX];
        memcpy(keep, cm->error, sizeof keep);
        g4_cuda_model_free(cm);
        memcpy(cm->error, keep, sizeof keep);
        return r;
    }
    return G4_OK;
}

/* g4c_fp_probe's results against the host's (this file's host side is built
   without fast math: gemma4.h refuses __FAST_MATH__) */
static g4_result g4c__ieee_check(g4_cuda_session *s) {
    const float in[G4C_PROBE_IN] = {1.000244140625f, -1.00048828125f, 1e-40f, 1.0f, 2.0f, 10.0f, 0.7f, 123.456f,
                                    3.0f, 7.0f, 0.3f, 9.87f};
    float got[G4C_PROBE_OUT], want[G4C_PROBE_OUT];
    const char *what = NULL;
    volatile float one = 1.0f; /* the host's operands at run time, as the device's */
    want[0] = 0.0f;
    want[1] = in[2] * one;
    for (int i = 0; i < 4; i++) {
        want[2 + i] = (in[4 + i] * one) / in[8 + i];
        want[6 + i] = sqrtf(in[4 + i] * one);
    }
    G4C_CHECK(s->error, cudaMemcpy(s->d_probe, in, sizeof in, cudaMemcpyHostToDevice));
    G4C_RUN(s->error, g4c_fp_probe, 1, 1, s->d_probe + G4C_PROBE_IN, s->d_probe);
    G4C_CHECK(s->error, cudaMemcpy(got, s->d_probe + G4C_PROBE_IN, sizeof got, cudaMemcpyDeviceToHost));
    if (memcmp(&got[0], &want[0], 4) != 0) what = "fuses products into FMAs (build with -fmad=false)";
    else if (memcmp(&got[1], &want[1], 4) != 0) what = "flushes denormals to zero (-ftz=true, -use_fast_math)";
    else if (memcmp(&got[2], &want[2], 16) != 0) what = "divides inexactly (-prec-div=false, -use_fast_math)";
    else if (memcmp(&got[6], &want[6], 16) != 0) what = "takes inexact square roots (-prec-sqrt=false, -use_fast_math)";
    if (what) {
        g4__seterr(s->error, "the device code %s: the exact mode needs IEEE arithmetic; build gemma4_cuda.cu as "
                   "make cuda does (nvcc -fmad=false, no -use_fast_math)", what);
        return G4_ERR_CUDA;
    }
    return G4_OK;
}

/* The CUDA options with NULL read as the defaults (all zero) */
static g4_cuda_config g4c__config(const g4_cuda_config *cc) {
    g4_cuda_config c;
    if (cc) return *cc;
    memset(&c, 0, sizeof c);
    return c;
}

/* The device arena and the host arena, carved by the same walk that sizes
   them (g4__carve's pattern, with the CPU's own carver). */
static void g4c__carve(g4_cuda_session *s, const g4_model *m, const g4_session_config *cfg, const g4_cuda_config *cc,
                       int reader_copies, g4__carver *dv, g4__carver *hv) {
    const g4_config *c = &m->config;
    const g4_plan *p = &m->plan;
    const g4__widths w = g4__max_widths(p, reader_copies);
    uint64_t rows = (uint64_t)cfg->max_chunk, H = (uint64_t)c->hidden_size, NH = (uint64_t)c->num_attention_heads;
    uint64_t dmax = w.dmax, kvw = w.kvw, imax = w.imax, P = (uint64_t)c->hidden_size_per_layer_input, L = (uint64_t)p->n_layers;
    uint64_t E = c->enable_moe_block ? (uint64_t)c->num_experts : 0, K = c->enable_moe_block ? (uint64_t)c->top_k_experts : 0;
    uint64_t Ie = c->enable_moe_block ? (uint64_t)c->moe_intermediate_size : 0, stage;
    int n_slots = w.n_slots;
    stage = rows * (H > L * P ? H : L * P);
    if (stage < rows * NH * dmax) stage = rows * NH * dmax; /* the q tap */
    if (stage < dmax) stage = dmax;
    s->n_slots = n_slots;
    /* host: the table as the host tracks it, the layer -> slot map, tap staging */
    s->slots = (g4_kv_slot *)(void *)g4__take(hv, (uint64_t)n_slots, sizeof(g4_kv_slot));
    s->layer_slot = (int *)(void *)g4__take(hv, L, sizeof(int));
    s->stage = g4__take(hv, stage, sizeof(float));
    /* device: the table, the status word, K/V for owners (and reader copies) */
    s->d_slots = (g4_kv_slot *)(void *)g4__take(dv, (uint64_t)n_slots, sizeof(g4_kv_slot));
    s->d_status = (int *)(void *)g4__take(dv, 1, sizeof(int));
    s->d_probe = g4__take(dv, 32, sizeof(float));
    /* device K/V, host-side table entries; the fast mode's bf16 cache in the bf16 mode */
    g4__carve_kv_elem(s->slots, s->layer_slot, m, cfg, reader_copies, dv, cc->fast && cfg->bf16 ? 2 : sizeof(float));
    s->d_ids = (int32_t *)(void *)g4__take(dv, rows, sizeof(int32_t));
    s->d_x = g4__take(dv, rows * H, sizeof(float));
    s->d_xn = g4__take(dv, rows * H, sizeof(float));
    s->d_branch = g4__take(dv, rows * H, sizeof(float));
    s->d_branch2 = g4__take(dv, rows * H, sizeof(float));
    s->d_q = g4__take(dv, rows * NH * dmax, sizeof(float));
    s->d_att = g4__take(dv, rows * NH * dmax, sizeof(float));
    s->d_k_new = g4__take(dv, rows * kvw, sizeof(float));
    s->d_v_new = g4__take(dv, rows * kvw, sizeof(float));
    if (!cc->fast) s->d_scores = g4__take(dv, rows * NH * (uint64_t)cfg->max_context, sizeof(float));
    s->d_gate = g4__take(dv, rows * imax, sizeof(float));
    if (!cc->fast) s->d_up = g4__take(dv, rows * imax, sizeof(float));
    s->d_per_layer_inputs = g4__take(dv, rows * L * P, sizeof(float));
    s->d_per_layer_gate = g4__take(dv, rows * P, sizeof(float));
    s->d_router = g4__take(dv, rows * E, sizeof(float));
    s->d_top = (int *)(void *)g4__take(dv, rows * K, sizeof(int));
    s->d_topw = g4__take(dv, rows * K, sizeof(float));
    s->d_moe_h = g4__take(dv, rows * K * 2 * Ie, sizeof(float));
    s->d_moe_y = g4__take(dv, rows * K * H, sizeof(float));
    s->d_logits = g4__take(dv, rows * (uint64_t)c->vocab_size, sizeof(float));
    s->d_topq = g4__take(dv, rows * E, sizeof(g4__vi));
    s->d_rope = g4__take(dv, rows * 4 * (dmax / 2), sizeof(float));
    s->rope = g4__take(hv, rows * 4 * (dmax / 2), sizeof(float));
    s->inv_freq[G4_SLIDING] = g4__take(hv, dmax / 2, sizeof(float));
    s->inv_freq[G4_FULL] = g4__take(hv, dmax / 2, sizeof(float));
    s->rope_half = (int)(dmax / 2);
    s->d_inv_freq[G4_SLIDING] = g4__take(dv, dmax / 2, sizeof(float));
    s->d_inv_freq[G4_FULL] = g4__take(dv, dmax / 2, sizeof(float));
    if (cc->fast) { /* split-K partials of the widest narrow output, flash-attention partials */
        uint64_t wide = H, attn, lin;
        uint64_t widths[6] = {(uint64_t)c->vocab_size, NH * dmax, kvw, imax, L * P, E};
        for (int i = 0; i < 6; i++) wide = widths[i] > wide ? widths[i] : wide;
        if (wide > G4F_NARROW) wide = G4F_NARROW;
        lin = (uint64_t)G4F_MAX_SPLIT * 2 * G4F_TOKENS * wide;
        attn = (rows > G4F_MAX_KV_SPLIT ? rows : G4F_MAX_KV_SPLIT) * NH * (dmax + 2);
        s->d_part = g4__take(dv, lin > attn ? lin : attn, sizeof(float));
        s->d_stats = g4__take(dv, rows * NH * 2, sizeof(float));
    }
}

/* g4_cuda_session_size and _init; reader_copies: the tests' debug layout
   (g4__cuda_session_*_testing), a K/V slot per reader layer too */
static g4_result g4c__session_size(const g4_cuda_model *cm, const g4_session_config *cfg, const g4_cuda_config *cc_in,
                                   int reader_copies, size_t *device_bytes, size_t *host_bytes) {
    g4_cuda_session tmp;
    g4_cuda_config cc;
    g4_session_config c;
    g4__carver dv, hv;
    g4_result r;
    char err[G4_ERROR_MAX];
    if (!device_bytes || !host_bytes) return G4_ERR_INPUT;
    *device_bytes = *host_bytes = 0;
    if (!cm || !cm->host || !cm->d_weights) return G4_ERR_INPUT;
    if ((r = g4__check_session_config(cm->host, cfg, err)) != G4_OK) return r;
    cc = g4c__config(cc_in);
    if (cc.fast && (r = g4f__check(cm->host, err)) != G4_OK) return r;
    if (cc.kv_splits < 0 || cc.kv_splits > G4F_MAX_KV_SPLIT) {
        g4__seterr(err, "g4_cuda_config.kv_splits %d is outside 0 .. %d", cc.kv_splits, G4F_MAX_KV_SPLIT);
        return G4_ERR_INPUT;
    }
    c = g4__session_defaults(cfg);
    memset(&tmp, 0, sizeof tmp);
    memset(&dv, 0, sizeof dv);
    memset(&hv, 0, sizeof hv);
    g4c__carve(&tmp, cm->host, &c, &cc, reader_copies, &dv, &hv);
    if (dv.overflow || hv.overflow || dv.off + 64 > (uint64_t)(size_t)-1) return G4_ERR_ARENA;
    *device_bytes = (size_t)dv.off + 64; /* slack: the arenas only need 16-byte alignment */
    *host_bytes = (size_t)hv.off + 64;
    return G4_OK;
}

static g4_result g4c__session_init(g4_cuda_session *s, const g4_cuda_model *cm, const g4_session_config *cfg,
                                   const g4_cuda_config *cc_in, int reader_copies, void *device_arena,
                                   size_t device_bytes, void *host_arena, size_t host_bytes) {
    size_t need_d, need_h;
    g4__carver dv, hv;
    g4_cuda_config cc;
    g4_session_config c;
    g4_result r;
    const g4_model *m;
    if (!s) return G4_ERR_INPUT;
    memset(s, 0, sizeof *s);
    if (!cm || !cm->host || !cm->d_weights) { g4__seterr(s->error, "model is not uploaded"); return G4_ERR_INPUT; }
    m = cm->host;
    if ((r = g4__check_session_config(m, cfg, s->error)) != G4_OK) return r;
    cc = g4c__config(cc_in);
    if (cc.fast && (r = g4f__check(m, s->error)) != G4_OK) return r;
    if (cc.kv_splits < 0 || cc.kv_splits > G4F_MAX_KV_SPLIT) {
        g4__seterr(s->error, "g4_cuda_config.kv_splits %d is outside 0 .. %d", cc.kv_splits, G4F_MAX_KV_SPLIT);
        return G4_ERR_INPUT;
    }
    if ((r = g4c__session_size(cm, cfg, &cc, reader_copies, &need_d, &need_h)) != G4_OK) {
        g4__seterr(s->error, "session for %d positions does not fit in memory", cfg->max_context);
        return r;
    }
    if (!device_arena || !host_arena) {
        g4__seterr(s->error, "NULL %s arena", device_arena ? "host" : "device");
        return G4_ERR_ARENA;
    }
    if ((uintptr_t)device_arena % 16 || (uintptr_t)host_arena % 16) {
        g4__seterr(s->error, "%s arena %p is not 16-byte aligned", (uintptr_t)device_arena % 16 ? "device" : "host",
                   (uintptr_t)device_arena % 16 ? device_arena : host_arena);
        return G4_ERR_ARENA;
    }
    if (device_bytes < need_d || host_bytes < need_h) {
        g4__seterr(s->error, "%s arena of %lu bytes is too small: this session needs %lu (g4_cuda_session_size)",
                   device_bytes < need_d ? "device" : "host",
                   (unsigned long)(device_bytes < need_d ? device_bytes : host_bytes),
                   (unsigned long)(device_bytes < need_d ? need_d : need_h));
        return G4_ERR_ARENA;
    }
    c = g4__session_defaults(cfg);
    memset(&dv, 0, sizeof dv);
    memset(&hv, 0, sizeof hv);
    dv.base = (unsigned char *)device_arena + ((64 - (uintptr_t)device_arena % 64) % 64);
    hv.base = (unsigned char *)host_arena + ((64 - (uintptr_t)host_arena % 64) % 64);
    s->model = cm;
    s->cfg = c;
    s->cuda = cc;
    s->matmul = G4_CUDA_MATMUL_TILED;
    s->fast = cc.fast != 0;
    s->sms = 1;
    if (s->fast) { /* flash-decoding sizes its splits by the card (g4f__kv_splits) */
        int dev = 0;
        G4C_CHECK(s->error, cudaGetDevice(&dev));
        G4C_CHECK(s->error, cudaDeviceGetAttribute(&s->sms, cudaDevAttrMultiProcessorCount, dev));
        if (s->sms < 1) s->sms = 1;
    }
    s->kv_bf16 = cc.fast && c.bf16;
    g4c__carve(s, m, &c, &cc, reader_copies, &dv, &hv);
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < m->plan.n_layers; i++)
            if (m->plan.layer[i].type == t) {
                int D = m->plan.layer[i].head_dim;
                g4__rope_init(s->inv_freq[t], &m->config.rope[t], D);
                if (s->fast) /* the fast mode's RoPE computes cos/sin on the device */
                    G4C_CHECK(s->error, cudaMemcpy(s->d_inv_freq[t], s->inv_freq[t], sizeof(float) * (size_t)(D / 2),
                                                   cudaMemcpyHostToDevice));
                break;
            }
    G4C_TRY(g4c__ieee_check(s));
    return g4c__sync_table(s);
}

G4_CUDA_API g4_result g4_cuda_session_size(const g4_cuda_model *cm, const g4_session_config *cfg,
                                           const g4_cuda_config *cc, size_t *device_bytes, size_t *host_bytes) {
    return g4c__session_size(cm, cfg, cc, 0, device_bytes, host_bytes);
}

G4_CUDA_API g4_result g4_cuda_session_init(g4_cuda_session *s, const g4_cuda_model *cm, const g4_session_config *cfg,
                                           const g4_cuda_config *cc, void *device_arena, size_t device_bytes,
                                           void *host_arena, size_t host_bytes) {
    return g4c__session_init(s, cm, cfg, cc, 0, device_arena, device_bytes, host_arena, host_bytes);
}

#ifdef G4_TESTING
G4_CUDA_API g4_result g4__cuda_session_size_testing(const g4_cuda_model *cm, const g4_session_config *cfg,
                                                    const g4_cuda_config *cc, int reader_copies,
                                                    size_t *device_bytes, size_t *host_bytes) {
    return g4c__session_size(cm, cfg, cc, reader_copies, device_bytes, host_bytes);
}

G4_CUDA_API g4_result g4__cuda_session_init_testing(g4_cuda_session *s, const g4_cuda_model *cm,
                                                    const g4_session_config *cfg, const g4_cuda_config *cc,
                                                    int reader_copies, void *device_arena, size_t device_bytes,
                                                    void *host_arena, size_t host_bytes) {
    return g4c__session_init(s, cm, cfg, cc, reader_copies, device_arena, device_bytes, host_arena, host_bytes);
}

G4_CUDA_API g4_result g4__cuda_fast_attention_testing(float *out, const float *q, const float *k, const float *v,
                                                      int n_keys, int group, int D, int splits, char *err) {
    size_t nq = (size_t)group * D, nkv = (size_t)n_keys * D, npart = nq + 2 * (size_t)group;
    float *dq = NULL, *dk = NULL, *dv = NULL, *dpart = NULL, *dstats = NULL, *datt = NULL;
    g4_kv_slot sl, *dsl = NULL;
    int *dstatus = NULL, status = 0;
    g4_result r = G4_ERR_CUDA;
    if (n_keys < 1 || group < 1 || group > G4F_GROUP || D % 8 || nq > G4F_QMAX || splits < 1) {
        g4__seterr(err, "fast attention (testing): unsupported shape");
        return G4_ERR_INPUT;
    }
    memset(&sl, 0, sizeof sl);
#define G4C_T(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
        g4__seterr(err, "%s: %s", #call, cudaGetErrorString(e_)); goto done; } } while (0)
    G4C_T(cudaMalloc((void **)&dq, sizeof(float) * nq));
    G4C_T(cudaMalloc((void **)&dk, sizeof(float) * nkv));
    G4C_T(cudaMalloc((void **)&dv, sizeof(float) * nkv));
    G4C_T(cudaMalloc((void **)&dpart, sizeof(float) * npart * (size_t)splits));
    G4C_T(cudaMalloc((void **)&dstats, sizeof(float) * 2 * (size_t)group));
    G4C_T(cudaMalloc((void **)&datt, sizeof(float) * nq));
    G4C_T(cudaMalloc((void **)&dsl, sizeof sl));
    G4C_T(cudaMalloc((void **)&dstatus, sizeof(int)));
    sl = g4__kv_slot_of(1, D, n_keys, dk, dv);
    sl.type = G4_FULL;
    G4C_T(cudaMemcpy(dq, q, sizeof(float) * nq, cudaMemcpyHostToDevice));
    G4C_T(cudaMemcpy(dk, k, sizeof(float) * nkv, cudaMemcpyHostToDevice));
    G4C_T(cudaMemcpy(dv, v, sizeof(float) * nkv, cudaMemcpyHostToDevice));
    G4C_T(cudaMemcpy(dsl, &sl, sizeof sl, cudaMemcpyHostToDevice));
    G4C_T(cudaMemcpy(dstatus, &status, sizeof status, cudaMemcpyHostToDevice));
    /* one decode query of `group` heads at position n_keys - 1 over every key */
    G4C_LAUNCH(g4f_attention, g4c__grid((size_t)splits, 1), G4F_THREADS, dpart, (const float *)dstats, dq,
               (const g4_kv_slot *)dsl, 0, 1, group, 1, D, n_keys - 1, 0, splits, 1, 0, dstatus, 0, 0, (int)G4F_ONLINE);
    G4C_T(cudaGetLastError());
    G4C_LAUNCH(g4f_attn_combine, g4c__grid(nq, G4F_THREADS), G4F_THREADS, datt, (const float *)dpart, group, D, splits,
               0, 0);
    G4C_T(cudaGetLastError());
    G4C_T(cudaMemcpy(out, datt, sizeof(float) * nq, cudaMemcpyDeviceToHost));
    G4C_T(cudaMemcpy(&status, dstatus, sizeof status, cudaMemcpyDeviceToHost));
    if (status) { g4__seterr(err, "fast attention (testing): the slot check failed (%d)", status); r = G4_ERR_INPUT; goto done; }
    r = G4_OK;
#undef G4C_T
done:
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dpart); cudaFree(dstats); cudaFree(datt); cudaFree(dsl);
    cudaFree(dstatus);
    return r;
}
#endif

G4_CUDA_API g4_result g4_cuda_session_reset(g4_cuda_session *s) {
    if (!s || !s->slots) return G4_ERR_INPUT;
    s->pos = 0;
    for (int i = 0; i < s->n_slots; i++) g4c__held(&s->slots[i], 0);
    return g4c__sync_table(s);
}

G4_CUDA_API g4_result g4_cuda_session_table(g4_cuda_session *s, g4_kv_slot *out, int max) {
    if (!s || !s->slots || !out || max < s->n_slots) return G4_ERR_INPUT;
    G4C_CHECK(s->error, cudaMemcpy(out, s->d_slots, sizeof(g4_kv_slot) * (size_t)s->n_slots, cudaMemcpyDeviceToHost));
    for (int i = 0; i < s->n_slots; i++) g4c__held(&out[i], out[i].n_pos); /* the kernels keep n_pos alone */
    return G4_OK;
}

G4_CUDA_API g4_result g4_cuda_forward(g4_cuda_session *s, const int32_t *ids, int n, float *logits, int mode) {
    g4__chunks ch;
    g4_result r;
    if (!s) return G4_ERR_INPUT;
    r = g4__chunks_begin(&ch, s->model && s->slots ? &s->model->host->config : NULL, s->pos, &s->cfg, ids, n, logits,
                         mode, s->error);
    if (r == G4_OK && s->matmul != G4_CUDA_MATMUL_TILED && s->matmul != G4_CUDA_MATMUL_PLAIN) {
        g4__seterr(s->error, "unknown matmul kind %d", s->matmul);
        r = G4_ERR_INPUT;
    }
    if (r == G4_OK) {
        s->fwd_end = s->pos + n;
        s->fwd_n = n;
    }
    while (r == G4_OK && g4__chunks_next(&ch)) r = g4c__step(s, ch.ids, ch.n, ch.out, ch.first);
    return r;
}

} /* extern "C" */
