/* gemma4_cuda.cu - the CUDA twin of gemma4.h's forward pass.   MIT-0, see LICENSE

   gemma4.h's scalar C forward pass is the reference; this file mirrors it op
   by op (llm.c's style): one kernel per CPU operation, launched in the same
   order, reading the same plan and the same shared-KV table. Declarations live
   in gemma4.h behind GEMMA4_CUDA.

   BUILD
       nvcc -O2 -std=c++17 -arch=sm_90 -c gemma4_cuda.cu -o gemma4_cuda.o
       cc -DGEMMA4_CUDA -c app.c            (app.c defines GEMMA4_IMPLEMENTATION)
       nvcc app.o gemma4_cuda.o -o app      (or: c++ ... -lcudart)
   `make cuda` builds it for sm_80 and sm_90 with warnings as errors. The same
   file also compiles as plain host C++ against tests/cuda_emu.h (a CUDA
   runtime emulator: every thread of a block is a fiber), which is how the
   tests run it on machines without a GPU: `make test-cuda-emu`.

   NUMERICS
     Every kernel sums in the CPU path's order (a matmul output, a dot product
     of attention, the softmax denominator and the MoE combination are each a
     sequential loop), and products are not contracted into FMAs (__fmul_rn,
     __fadd_rn here; the header's G4__HD helpers that the kernels call as they
     are - the torch-order sums, top-k, bf16 rounding, GELU - are built with
     nvcc -fmad=false), so the only differences from the CPU path are the device's
     expf/sinf/cosf (a few ulp from glibc's; GELU makes its own exp and tanh
     from IEEE operations, as the CPU does). The RMSNorm sum of squares is
     torch's float32 order, as on the CPU (32 lanes, one thread each), and in
     the bf16 mode a bf16 weight's matmul sums in torch's bf16 F.linear order
     (g4c_matmul_torch, as g4__matmul_torch_ref). The
     bf16-faithful mode (cfg.bf16) rounds where the CPU's g4__act does: a
     g4c_round launch after a plain op, and between the steps of a fused
     kernel (its `bf` argument).

   MEMORY
     g4_cuda_model_upload: one cudaMalloc holding every tensor the plan uses,
     as stored (BF16, F16 or F32). g4_cuda_session_init: nothing is allocated;
     the caller's device arena holds the K/V of owner layers, the shared-KV
     table (the kernels read K/V through it) and every scratch buffer; the
     caller's host arena holds the host's mirror of the table and the staging
     rows for taps. g4_cuda_forward allocates nothing.
*/
/* gemma4.h's implementation as a private static copy (GEMMA4_STATIC): the
   kernels' host side reuses its arena carver, RoPE table and session checks,
   and nothing clashes with the program's own GEMMA4_IMPLEMENTATION. The
   g4_cuda_* functions stay extern (G4_CUDA_API). */
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
   names the call, the file and line, and the runtime's message. */
#define G4C_CHECK(err, call)                                                                            \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess) {                                                                        \
            g4__seterr((err), "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));   \
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

/* g4__rope on rows of `heads` heads of D: token t = row / heads is at pos0 + t */
__global__ void g4c_rope(float *x, const float *inv_freq, int rows, int heads, int D, int pos0, int bf) {
    int half = D / 2;
    G4C_FOR(idx, (size_t)rows * half) {
        size_t r = idx / half;
        int j = (int)(idx % half), pos = pos0 + (int)(r / heads);
        float *xr = x + r * D;
        float a = G4C_MUL((float)pos, inv_freq[j]), c = cosf(a), s = sinf(a), x1 = xr[j], x2 = xr[j + half];
        if (bf) { /* as g4__rope: cos/sin, each product and the sum rounded */
            c = g4__bf16_round(c);
            s = g4__bf16_round(s);
            xr[j] = g4__bf16_round(G4C_ADD(g4__bf16_round(G4C_MUL(x1, c)), g4__bf16_round(G4C_MUL(-x2, s))));
            xr[j + half] = g4__bf16_round(G4C_ADD(g4__bf16_round(G4C_MUL(x2, c)), g4__bf16_round(G4C_MUL(x1, s))));
        } else {
            xr[j] = G4C_SUB(G4C_MUL(x1, c), G4C_MUL(x2, s));
            xr[j + half] = G4C_ADD(G4C_MUL(x2, c), G4C_MUL(x1, s));
        }
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

/* reader_copies (debug): this step's rows of the owner's slot into the
   reader's private slot. */
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
        if (sl.n_pos != pos0 + n || sl.head_dim != D || sl.kv_heads != KVH) {
            if (tid == 0) *status = 16 * (layer + 1) + 1;
            continue;
        }
        if (lo < sl.n_pos - sl.capacity) {
            if (tid == 0) *status = 16 * (layer + 1) + 2;
            continue;
        }
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
            sc[k] = bf ? g4__expf_sleef(G4C_SUB(sc[k], mx)) : expf(sc[k] - mx);
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
    G4C_FOR(i, n) x[i] = g4__act(G4C_MUL(g4__act(tanhf(g4__act(x[i] / cap, bf)), bf), cap), bf);
}

/* g4__moe's router input: u = (u * router_scale[i]) * H^-0.5 */
__global__ void g4c_router_scale(float *u, const void *scale, int dt, int n, int H, float root, int bf) {
    G4C_FOR(i, (size_t)n * H) u[i] = g4__act(G4C_MUL(g4__act(G4C_MUL(u[i], g4c__ld(scale, dt, i % H)), bf), root), bf);
}

/* g4__moe's routing, one thread per token, exactly the CPU's loop: softmax
   over E, top-k by probability (ties as torch.topk: g4__topk_torch), renormalise, per-expert
   scale. The chosen experts are then stored in ascending id, the order in
   which the CPU (and transformers) sum them. */
__global__ void g4c_moe_route(float *router, int *top_out, float *w_out, const void *pes, int dt, int n, int E, int K,
                              int bf) {
    G4C_FOR(t, (size_t)n) {
        float *pr = router + t * E, mx = pr[0], sum = 0.0f, wsum = 0.0f, wk[G4_MAX_TOP_K];
        int top[G4_MAX_TOP_K];
        for (int e = 1; e < E; e++) mx = pr[e] > mx ? pr[e] : mx;
        if (bf) { /* g4__softmax_torch */
            for (int e = 0; e < E; e++) pr[e] = g4__expf_sleef(G4C_SUB(pr[e], mx));
            sum = __fdiv_rn(1.0f, g4__softmax_torch_sum(pr, E, 0, E));
            for (int e = 0; e < E; e++) pr[e] = G4C_MUL(pr[e], sum);
        } else {
            for (int e = 0; e < E; e++) { pr[e] = expf(pr[e] - mx); sum = G4C_ADD(sum, pr[e]); }
            for (int e = 0; e < E; e++) pr[e] = pr[e] / sum;
        }
        g4__topk_torch(pr, E, K, top);
        for (int k = 0; k < K; k++) {
            wk[k] = pr[top[k]];
            wsum = G4C_ADD(wsum, wk[k]);
        }
        for (int k = 0; k < K; k++) wk[k] = G4C_MUL(wk[k] / wsum, g4c__ld(pes, dt, (size_t)top[k]));
        for (int k = 1; k < K; k++) /* insertion sort by expert id */
            for (int j = k; j > 0 && top[j - 1] > top[j]; j--) {
                int ti = top[j]; float tw = wk[j];
                top[j] = top[j - 1]; wk[j] = wk[j - 1];
                top[j - 1] = ti; wk[j - 1] = tw;
            }
        for (int k = 0; k < K; k++) { top_out[t * K + k] = top[k]; w_out[t * K + k] = wk[k]; }
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

/* g4__act: in the bf16-faithful mode, round n values to bf16. Every matmul,
   norm and residual add is followed by it, as on the CPU. */
static g4_result g4c__act(g4_cuda_session *s, float *x, size_t n) {
    if (s->cfg.bf16) G4C_RUN(s->error, g4c_round, g4c__grid(n, G4C_THREADS), G4C_THREADS, x, n);
    return G4_OK;
}

static g4_result g4c__matmul(g4_cuda_session *s, float *y, const float *x, const g4_tensor *w, int n) {
    int out = (int)w->shape[0], in = (int)w->shape[1];
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
static g4_result g4c__tap(g4_cuda_session *s, const char *name, int layer, const float *data, int on_device, int rows,
                          int cols) {
    char buf[96];
    if (!s->cfg.tap) return G4_OK;
    if (on_device) {
        G4C_CHECK(s->error, cudaMemcpy(s->stage, data, sizeof(float) * (size_t)rows * cols, cudaMemcpyDeviceToHost));
        data = s->stage;
    }
    s->cfg.tap(s->cfg.tap_user, g4__tap_name(buf, sizeof buf, layer, name), layer, data, rows, cols, s->pos);
    return G4_OK;
}

/* g4__norm_rows: RMSNorm of n rows of width H (cast), then its tap */
static g4_result g4c__norm_rows(g4_cuda_session *s, float *y, const float *x, const g4_tensor *w, int n, int H, int layer,
                                const char *tap) {
    G4C_TRY(g4c__rmsnorm(s, y, x, w, n, H));
    return g4c__tap(s, tap, layer, y, 1, n, H);
}

/* g4__attention: s->d_xn -> s->d_branch for layer l */
static g4_result g4c__attention(g4_cuda_session *s, int l, int n) {
    const g4_model *m = s->model->host;
    const g4_layer_plan *lp = &m->plan.layer[l];
    const g4_layer_weights *lw = &s->model->w.layers[l];
    const float *inv_freq = s->d_inv_freq[lp->type];
    int NH = m->config.num_attention_heads, D = lp->head_dim, KVH = lp->kv_heads, pos0 = s->pos, slot, bf = s->cfg.bf16;
    g4_kv_slot *sl;

    /* queries: q_proj, q_norm per head, RoPE */
    G4C_TRY(g4c__matmul(s, s->d_q, s->d_xn, &lw->q_proj, n));
    G4C_TRY(g4c__rmsnorm(s, s->d_q, s->d_q, &lw->q_norm, n * NH, D));
    G4C_RUN(s->error, g4c_rope, g4c__grid((size_t)n * NH * (D / 2), G4C_THREADS), G4C_THREADS, s->d_q, inv_freq,
            n * NH, NH, D, pos0, bf);
    G4C_TRY(g4c__tap(s, "self_attn.q", l, s->d_q, 1, n, NH * D));

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
                inv_freq, n * KVH, KVH, D, pos0, bf);
        G4C_TRY(g4c__rmsnorm(s, s->d_v_new, s->d_v_new, NULL, n * KVH, D));
        G4C_RUN(s->error, g4c_kv_append, g4c__grid((size_t)n * KVH * D, G4C_THREADS), G4C_THREADS, s->d_slots,
                lp->kv_slot, s->d_k_new, s->d_v_new, n, pos0);
        sl->n_pos = pos0 + n;
    } else if (s->layer_slot[l] != lp->kv_slot) {
        /* debug mode (reader_copies): this step's rows into the reader's own slot */
        G4C_RUN(s->error, g4c_kv_copy, g4c__grid((size_t)n * KVH * D, G4C_THREADS), G4C_THREADS, s->d_slots,
                lp->kv_slot, s->layer_slot[l], n, pos0);
        s->slots[s->layer_slot[l]].n_pos = pos0 + n;
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
            G4C_TRY(g4c__tap(s, which ? "self_attn.v" : "self_attn.k", l, s->stage, 0, n, (int)kvw));
        }
    }
    G4C_RUN(s->error, g4c_attention, g4c__grid((size_t)n * NH, 1), G4C_THREADS, s->d_att, s->d_q, s->d_slots, slot,
            s->d_scores, n, NH, KVH, D, pos0, lp->type == G4_SLIDING ? m->config.sliding_window : 0,
            s->cfg.max_context, l, s->d_status, bf, s->fwd_n, s->fwd_end);
    G4C_TRY(g4c__matmul(s, s->d_branch, s->d_att, &lw->o_proj, n));
    return g4c__tap(s, "self_attn", l, s->d_branch, 1, n, m->config.hidden_size);
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
    return g4c__tap(s, "mlp", l, s->d_branch, 1, n, s->model->host->config.hidden_size);
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
            lw->router_per_expert_scale.data, (int)lw->router_per_expert_scale.dtype, n, E, K, s->cfg.bf16);
    /* experts on pre_feedforward_layernorm_2(r) */
    G4C_TRY(g4c__norm_rows(s, s->d_xn, s->d_x, &lw->pre_feedforward_layernorm_2, n, H,
            l, "pre_feedforward_layernorm_2"));
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
    return g4c__tap(s, "experts", l, s->d_branch2, 1, n, H);
}

/* g4__layer: Gemma4TextDecoderLayer l on d_x in place */
static g4_result g4c__layer(g4_cuda_session *s, int l, int n) {
    const g4_config *c = &s->model->host->config;
    const g4_layer_weights *lw = &s->model->w.layers[l];
    int H = c->hidden_size, P = c->hidden_size_per_layer_input;
    size_t nh = (size_t)n * H;

    /* 1. attention block */
    G4C_TRY(g4c__norm_rows(s, s->d_xn, s->d_x, &lw->input_layernorm, n, H, l, "input_layernorm"));
    G4C_TRY(g4c__attention(s, l, n));
    G4C_TRY(g4c__norm_rows(s, s->d_branch, s->d_branch, &lw->post_attention_layernorm, n, H,
            l, "post_attention_layernorm"));
    G4C_TRY(g4c__add(s, s->d_x, s->d_branch, nh));
    G4C_TRY(g4c__tap(s, "pre_feedforward_layernorm:input", l, s->d_x, 1, n, H));

    /* 2. feed-forward block */
    G4C_TRY(g4c__norm_rows(s, s->d_xn, s->d_x, &lw->pre_feedforward_layernorm, n, H, l, "pre_feedforward_layernorm"));
    G4C_TRY(g4c__mlp(s, l, n));
    if (s->model->host->plan.layer[l].moe) { /* 3. MoE beside the dense MLP */
        G4C_TRY(g4c__norm_rows(s, s->d_branch, s->d_branch, &lw->post_feedforward_layernorm_1, n, H,
                l, "post_feedforward_layernorm_1"));
        G4C_TRY(g4c__moe(s, l, n));
        G4C_TRY(g4c__norm_rows(s, s->d_branch2, s->d_branch2, &lw->post_feedforward_layernorm_2, n, H,
                l, "post_feedforward_layernorm_2"));
        G4C_TRY(g4c__add(s, s->d_branch, s->d_branch2, nh));
    }
    /* 4. */
    G4C_TRY(g4c__norm_rows(s, s->d_branch, s->d_branch, &lw->post_feedforward_layernorm, n, H,
            l, "post_feedforward_layernorm"));
    G4C_TRY(g4c__add(s, s->d_x, s->d_branch, nh));

    /* 5. per-layer input */
    if (P) {
        int LP = c->num_hidden_layers * P;
        G4C_TRY(g4c__matmul(s, s->d_per_layer_gate, s->d_x, &lw->per_layer_input_gate, n));
        G4C_TRY(g4c__tap(s, "per_layer_input_gate", l, s->d_per_layer_gate, 1, n, P));
        G4C_RUN(s->error, g4c_ple_gate, g4c__grid((size_t)n * P, G4C_THREADS), G4C_THREADS, s->d_per_layer_gate,
                s->d_per_layer_inputs, n, P, LP, l, s->cfg.bf16, (size_t)(s->pos - s->fwd_end + s->fwd_n) * P, (size_t)s->fwd_n * P);
        G4C_TRY(g4c__matmul(s, s->d_branch, s->d_per_layer_gate, &lw->per_layer_projection, n));
        G4C_TRY(g4c__tap(s, "per_layer_projection", l, s->d_branch, 1, n, H));
        G4C_TRY(g4c__norm_rows(s, s->d_branch, s->d_branch, &lw->post_per_layer_input_norm, n, H,
                l, "post_per_layer_input_norm"));
        G4C_TRY(g4c__add(s, s->d_x, s->d_branch, nh));
    }

    /* 6. layer_scalar */
    G4C_RUN(s->error, g4c_layer_scalar, g4c__grid(nh, G4C_THREADS), G4C_THREADS, s->d_x, nh, lw->layer_scalar.data,
            (int)lw->layer_scalar.dtype);
    G4C_TRY(g4c__act(s, s->d_x, nh));
    return g4c__tap(s, "", l, s->d_x, 1, n, H);
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
    return g4c__tap(s, "per_layer_inputs", -1, s->d_per_layer_inputs, 1, n, LP);
}

/* g4__step: n <= max_chunk tokens; logits rows [first, n) go to host `out` */
static g4_result g4c__step(g4_cuda_session *s, const int32_t *ids, int n, float *out, int first) {
    const g4_config *c = &s->model->host->config;
    const g4_weights *w = &s->model->w;
    int H = c->hidden_size, V = c->vocab_size, l, status = 0;
    const float embed_scale = g4__scale_mode(s->cfg.bf16, H);

    G4C_CHECK(s->error, cudaMemcpy(s->d_ids, ids, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    G4C_RUN(s->error, g4c_embed, g4c__grid((size_t)n * H, G4C_THREADS), G4C_THREADS, s->d_x, w->embed_tokens.data,
            (int)w->embed_tokens.dtype, s->d_ids, n, H, embed_scale);
    G4C_TRY(g4c__act(s, s->d_x, (size_t)n * H));
    G4C_TRY(g4c__tap(s, "embed_tokens", -1, s->d_x, 1, n, H));
    if (c->hidden_size_per_layer_input) G4C_TRY(g4c__per_layer_inputs(s, n));

    for (l = 0; l < c->num_hidden_layers; l++) G4C_TRY(g4c__layer(s, l, n));

    G4C_TRY(g4c__norm_rows(s, s->d_xn, s->d_x, &w->norm, n, H, -1, "norm"));
    if (out && first < n) {
        size_t cnt = (size_t)(n - first) * V;
        G4C_TRY(g4c__matmul(s, s->d_logits, s->d_xn + (size_t)first * H, &w->lm_head, n - first));
        if (c->final_logit_softcapping > 0.0f)
            G4C_RUN(s->error, g4c_softcap, g4c__grid(cnt, G4C_THREADS), G4C_THREADS, s->d_logits, cnt,
                    c->final_logit_softcapping, s->cfg.bf16);
        G4C_CHECK(s->error, cudaMemcpy(out, s->d_logits, sizeof(float) * cnt, cudaMemcpyDeviceToHost));
        G4C_TRY(g4c__tap(s, "logits", -1, out, 0, n - first, V));
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

/* The device arena and the host arena, carved by the same walk that sizes
   them (g4__carve's pattern, with the CPU's own carver). */
static void g4c__carve(g4_cuda_session *s, const g4_model *m, const g4_session_config *cfg, g4__carver *dv,
                       g4__carver *hv) {
    const g4_config *c = &m->config;
    const g4_plan *p = &m->plan;
    const g4__widths w = g4__max_widths(p, cfg);
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
    g4__carve_kv(s->slots, s->layer_slot, m, cfg, dv); /* device K/V, host-side table entries */
    s->d_ids = (int32_t *)(void *)g4__take(dv, rows, sizeof(int32_t));
    s->d_x = g4__take(dv, rows * H, sizeof(float));
    s->d_xn = g4__take(dv, rows * H, sizeof(float));
    s->d_branch = g4__take(dv, rows * H, sizeof(float));
    s->d_branch2 = g4__take(dv, rows * H, sizeof(float));
    s->d_q = g4__take(dv, rows * NH * dmax, sizeof(float));
    s->d_att = g4__take(dv, rows * NH * dmax, sizeof(float));
    s->d_k_new = g4__take(dv, rows * kvw, sizeof(float));
    s->d_v_new = g4__take(dv, rows * kvw, sizeof(float));
    s->d_scores = g4__take(dv, rows * NH * (uint64_t)cfg->max_context, sizeof(float));
    s->d_gate = g4__take(dv, rows * imax, sizeof(float));
    s->d_up = g4__take(dv, rows * imax, sizeof(float));
    s->d_per_layer_inputs = g4__take(dv, rows * L * P, sizeof(float));
    s->d_per_layer_gate = g4__take(dv, rows * P, sizeof(float));
    s->d_router = g4__take(dv, rows * E, sizeof(float));
    s->d_top = (int *)(void *)g4__take(dv, rows * K, sizeof(int));
    s->d_topw = g4__take(dv, rows * K, sizeof(float));
    s->d_moe_h = g4__take(dv, rows * K * 2 * Ie, sizeof(float));
    s->d_moe_y = g4__take(dv, rows * K * H, sizeof(float));
    s->d_logits = g4__take(dv, rows * (uint64_t)c->vocab_size, sizeof(float));
    s->d_inv_freq[G4_SLIDING] = g4__take(dv, dmax / 2, sizeof(float));
    s->d_inv_freq[G4_FULL] = g4__take(dv, dmax / 2, sizeof(float));
}

G4_CUDA_API g4_result g4_cuda_session_size(const g4_cuda_model *cm, const g4_session_config *cfg, size_t *device_bytes,
                                      size_t *host_bytes) {
    g4_cuda_session tmp;
    g4_session_config c;
    g4__carver dv, hv;
    g4_result r;
    char err[G4_ERROR_MAX];
    if (!device_bytes || !host_bytes) return G4_ERR_INPUT;
    *device_bytes = *host_bytes = 0;
    if (!cm || !cm->host || !cm->d_weights) return G4_ERR_INPUT;
    if ((r = g4__check_session_config(cm->host, cfg, err)) != G4_OK) return r;
    c = g4__session_defaults(cfg);
    memset(&tmp, 0, sizeof tmp);
    memset(&dv, 0, sizeof dv);
    memset(&hv, 0, sizeof hv);
    g4c__carve(&tmp, cm->host, &c, &dv, &hv);
    if (dv.overflow || hv.overflow || dv.off + 64 > (uint64_t)(size_t)-1) return G4_ERR_ARENA;
    *device_bytes = (size_t)dv.off + 64; /* slack: the arenas only need 16-byte alignment */
    *host_bytes = (size_t)hv.off + 64;
    return G4_OK;
}

/* Upload the host's table to the device and clear the status word. */
static g4_result g4c__sync_table(g4_cuda_session *s) {
    G4C_CHECK(s->error, cudaMemcpy(s->d_slots, s->slots, sizeof(g4_kv_slot) * (size_t)s->n_slots, cudaMemcpyHostToDevice));
    G4C_CHECK(s->error, cudaMemset(s->d_status, 0, sizeof(int)));
    return G4_OK;
}

G4_CUDA_API g4_result g4_cuda_session_init(g4_cuda_session *s, const g4_cuda_model *cm, const g4_session_config *cfg,
                                      void *device_arena, size_t device_bytes, void *host_arena, size_t host_bytes) {
    size_t need_d, need_h;
    g4__carver dv, hv;
    g4_session_config c;
    g4_result r;
    const g4_model *m;
    if (!s) return G4_ERR_INPUT;
    memset(s, 0, sizeof *s);
    if (!cm || !cm->host || !cm->d_weights) { g4__seterr(s->error, "model is not uploaded"); return G4_ERR_INPUT; }
    m = cm->host;
    if ((r = g4__check_session_config(m, cfg, s->error)) != G4_OK) return r;
    if ((r = g4_cuda_session_size(cm, cfg, &need_d, &need_h)) != G4_OK) {
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
    s->matmul = G4_CUDA_MATMUL_TILED;
    g4c__carve(s, m, &c, &dv, &hv);
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < m->plan.n_layers; i++)
            if (m->plan.layer[i].type == t) {
                int D = m->plan.layer[i].head_dim;
                g4__rope_init(s->stage, &m->config.rope[t], D);
                G4C_CHECK(s->error, cudaMemcpy(s->d_inv_freq[t], s->stage, sizeof(float) * (size_t)(D / 2),
                                               cudaMemcpyHostToDevice));
                break;
            }
    return g4c__sync_table(s);
}

G4_CUDA_API g4_result g4_cuda_session_reset(g4_cuda_session *s) {
    if (!s || !s->slots) return G4_ERR_INPUT;
    s->pos = 0;
    for (int i = 0; i < s->n_slots; i++) s->slots[i].n_pos = 0;
    return g4c__sync_table(s);
}

G4_CUDA_API g4_result g4_cuda_session_table(g4_cuda_session *s, g4_kv_slot *out, int max) {
    if (!s || !s->slots || !out || max < s->n_slots) return G4_ERR_INPUT;
    G4C_CHECK(s->error, cudaMemcpy(out, s->d_slots, sizeof(g4_kv_slot) * (size_t)s->n_slots, cudaMemcpyDeviceToHost));
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
