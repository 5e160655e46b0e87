// The transformer's kernels (issue 22): the cuda backend's versions of device/nn_cpu.c's loops
// (fill, residual add, embedding and its gradient, layer norm, GELU, the attention's causal softmax
// and its gradient); the attention's matrix products are cuBLAS calls in ops.c. The semantics
// and argument order are nn_cpu.h's. Every sum runs in an order fixed by the shapes alone (never by
// thread timing: no float atomics), so a run repeats bit for bit on the same GPU:
//
//   embedding_grad  the row that first holds an id owns that vocabulary row of dtable: its block
//                   adds the rows with that id into it in row order, nn_cpu.c's order, so the
//                   result is also the cpu backend's bits (no sort, no scratch, no vocabulary
//                   size needed; see embedding_grad_kernel)
//   layer norm      one warp a row: lane partial sums in double, then a butterfly of shuffles;
//                   dgamma and dbeta per column, rows split over 128 lanes of a block and the
//                   lanes' partials added in a fixed tree
//   softmax         one warp a row, as layer norm
//
// This file is compiled with -fmad=false (device/cuda/CMakeLists.txt): the cpu backend's x86-64
// code has no fused multiply-add, so the elementwise formulas round as nn_cpu.c's do; erff and
// expf may still differ from glibc's in the last place.
#include "device/cuda/cuda_internal.h"
#include "device/cuda/launch.cuh"

#include <math.h>

#define WARP 32
#define FULL_MASK 0xffffffffu

// Blocks for one warp a row over rows rows (rows > 0), at most IFD_CUDA_MAX_BLOCKS (the warps
// stride).
static unsigned int warp_blocks_for(int64_t rows)
{
    int64_t b = (rows + IFD_CUDA_THREADS / WARP - 1) / (IFD_CUDA_THREADS / WARP);
    return (unsigned int)(b < IFD_CUDA_MAX_BLOCKS ? b : IFD_CUDA_MAX_BLOCKS);
}

// One warp a row: r runs over rows, the same value in every lane of the warp (so shuffles with
// the full mask are safe inside the loop).
#define WARP_ROWS(r, rows)                                                                         \
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / WARP; r < (rows);          \
         r += (int64_t)gridDim.x * blockDim.x / WARP)

// The sum of the warp's values, in every lane. A butterfly: at each level lanes i and i ^ o add
// the same two values (in either order, the same float), so every lane ends with the same bits,
// and the order depends on nothing but the lane numbers.
__device__ static double warp_sum(double v)
{
    for (int o = WARP / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ static float warp_max(float v)
{
    for (int o = WARP / 2; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

__global__ void fill_kernel(int64_t n, float value, float *x)
{
    GRID_STRIDE(i, n)
    {
        x[i] = value;
    }
}

__global__ void add_kernel(int64_t n, float alpha, const float *x, float *y)
{
    GRID_STRIDE(i, n)
    {
        y[i] += alpha * x[i];
    }
}

__global__ void embedding_kernel(int64_t rows, int64_t dim, const int32_t *ids, const float *table,
                                 float *out)
{
    GRID_STRIDE(i, rows * dim)
    {
        int64_t r = i / dim, c = i - r * dim;
        out[i] = table[(int64_t)ids[r] * dim + c];
    }
}

// dtable[ids[r], :] += dout[r, :] in row order, without atomics. Block b takes rows b, b + grid,
// ...; for row r it first asks whether an earlier row holds the same id v (a block-wide scan of
// ids[0..r), stopping at the first chunk with one: for a frequent id that is the first chunk). If
// none does, r is v's first row and the block owns dtable's row v: it walks ids[r..rows) in
// chunks of IFD_CUDA_THREADS, gathers the matching rows of each chunk in order into shared memory
// (a ballot and prefix count per warp), and each thread adds them, in that order, into its columns
// of row v. No other block writes row v, and each element's additions are nn_cpu.c's, in its
// order: the same bits as the cpu backend, every run. Cost: the owners' scans are at most
// (distinct ids) x rows id comparisons, the others' usually one chunk; the additions read dout
// once.
__global__ void embedding_grad_kernel(int64_t rows, int64_t dim, const int32_t *ids,
                                      const float *dout, float *dtable)
{
    __shared__ int64_t match[IFD_CUDA_THREADS];
    __shared__ int warp_hits[IFD_CUDA_THREADS / WARP];
    int lane = (int)(threadIdx.x % WARP), warp = (int)(threadIdx.x / WARP);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int32_t v = ids[r];
        int earlier = 0;
        for (int64_t r0 = 0; r0 < r && !earlier; r0 += blockDim.x) {
            int64_t j = r0 + threadIdx.x;
            earlier = __syncthreads_or(j < r && ids[j] == v);
        }
        if (earlier)
            continue; /* the same in every thread of the block */
        float *drow = dtable + (int64_t)v * dim;
        for (int64_t r0 = r; r0 < rows; r0 += blockDim.x) {
            int64_t j = r0 + threadIdx.x;
            int hit = j < rows && ids[j] == v;
            unsigned mask = __ballot_sync(FULL_MASK, hit);
            if (lane == 0)
                warp_hits[warp] = __popc(mask);
            __syncthreads();
            int off = 0, n = 0;
            for (int w = 0; w < (int)(blockDim.x / WARP); w++) {
                off += w < warp ? warp_hits[w] : 0;
                n += warp_hits[w];
            }
            if (hit)
                match[off + __popc(mask & ((1u << lane) - 1u))] = j;
            __syncthreads();
            for (int64_t c = threadIdx.x; n > 0 && c < dim; c += blockDim.x) {
                float a = drow[c];
                for (int k = 0; k < n; k++)
                    a += dout[match[k] * dim + c];
                drow[c] = a;
            }
            __syncthreads(); /* match and warp_hits are reused */
        }
    }
}

// One warp a row, as nn_cpu.c: the mean, then the biased variance about it, both summed in
// double; y may be x (each lane reads its elements before it writes them).
__global__ void layernorm_kernel(int64_t rows, int64_t dim, const float *x, const float *gamma,
                                 const float *beta, float eps, float *y, float *mean, float *rstd)
{
    int lane = (int)(threadIdx.x % WARP);
    WARP_ROWS(r, rows)
    {
        const float *xr = x + r * dim;
        double s = 0.0;
        for (int64_t c = lane; c < dim; c += WARP)
            s += xr[c];
        float m = (float)(warp_sum(s) / (double)dim);
        double v = 0.0;
        for (int64_t c = lane; c < dim; c += WARP) {
            double d = (double)(xr[c] - m);
            v += d * d;
        }
        float rs = (float)(1.0 / sqrt(warp_sum(v) / (double)dim + (double)eps));
        float *yr = y + r * dim;
        for (int64_t c = lane; c < dim; c += WARP)
            yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
        if (lane == 0) {
            mean[r] = m;
            rstd[r] = rs;
        }
    }
}

// dx of one row a warp (dx may be dy: each lane reads its elements of dy before it writes them).
__global__ void layernorm_dx_kernel(int64_t rows, int64_t dim, const float *x, const float *gamma,
                                    const float *mean, const float *rstd, const float *dy,
                                    float *dx)
{
    int lane = (int)(threadIdx.x % WARP);
    WARP_ROWS(r, rows)
    {
        const float *xr = x + r * dim, *dyr = dy + r * dim;
        float m = mean[r], rs = rstd[r];
        double sum_g = 0.0, sum_gx = 0.0; /* of dxhat and of dxhat * xhat over the row */
        for (int64_t c = lane; c < dim; c += WARP) {
            float xhat = (xr[c] - m) * rs, g = dyr[c] * gamma[c];
            sum_g += g;
            sum_gx += (double)g * xhat;
        }
        float mg = (float)(warp_sum(sum_g) / (double)dim);
        float mgx = (float)(warp_sum(sum_gx) / (double)dim);
        float *dxr = dx + r * dim;
        for (int64_t c = lane; c < dim; c += WARP) {
            float xhat = (xr[c] - m) * rs;
            dxr[c] = rs * (dyr[c] * gamma[c] - mg - xhat * mgx);
        }
    }
}

// dgamma[c] += sum over rows of dy * xhat, dbeta[c] += sum of dy. A block takes LN_COLS columns
// and splits the rows over LN_LANES lanes (lane l: rows l, l + LN_LANES, ..., summed in double);
// the lanes' partials are then added in a fixed tree in shared memory.
#define LN_COLS 8
#define LN_LANES (1024 / LN_COLS)

__global__ void layernorm_params_kernel(int64_t rows, int64_t dim, const float *x,
                                        const float *mean, const float *rstd, const float *dy,
                                        float *dgamma, float *dbeta)
{
    __shared__ double sg[LN_LANES][LN_COLS];
    __shared__ double sb[LN_LANES][LN_COLS];
    int cx = (int)(threadIdx.x % LN_COLS), ly = (int)(threadIdx.x / LN_COLS);
    for (int64_t c0 = blockIdx.x * (int64_t)LN_COLS; c0 < dim; c0 += (int64_t)gridDim.x * LN_COLS) {
        int64_t c = c0 + cx;
        double g = 0.0, b = 0.0;
        if (c < dim)
            for (int64_t r = ly; r < rows; r += LN_LANES) {
                float xhat = (x[r * dim + c] - mean[r]) * rstd[r], d = dy[r * dim + c];
                g += d * xhat;
                b += d;
            }
        sg[ly][cx] = g;
        sb[ly][cx] = b;
        __syncthreads();
        for (int s = LN_LANES / 2; s > 0; s >>= 1) {
            if (ly < s) {
                sg[ly][cx] += sg[ly + s][cx];
                sb[ly][cx] += sb[ly + s][cx];
            }
            __syncthreads();
        }
        if (ly == 0 && c < dim) {
            dgamma[c] = (float)((double)dgamma[c] + sg[0][cx]);
            dbeta[c] = (float)((double)dbeta[c] + sb[0][cx]);
        }
        __syncthreads(); /* sg and sb are reused */
    }
}

#define SQRT1_2 0.70710678118654752440f
#define INV_SQRT2PI 0.39894228040143267794f

__global__ void gelu_kernel(int64_t n, const float *x, float *y)
{
    GRID_STRIDE(i, n)
    {
        y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * SQRT1_2));
    }
}

__global__ void gelu_grad_kernel(int64_t n, const float *x, const float *dy, float *dx)
{
    GRID_STRIDE(i, n)
    {
        float cdf = 0.5f * (1.0f + erff(x[i] * SQRT1_2));
        float pdf = INV_SQRT2PI * expf(-0.5f * x[i] * x[i]);
        dx[i] = dy[i] * (cdf + x[i] * pdf);
    }
}

// p holds nseq [t, t] score matrices; row i of each becomes the softmax of its entries 0..i (the
// max subtracted, the sum in double), zero after: the causal mask. One warp a row.
__global__ void causal_softmax_kernel(int64_t nseq, int64_t t, float *p)
{
    int lane = (int)(threadIdx.x % WARP);
    WARP_ROWS(gr, nseq * t)
    {
        int64_t i = gr % t;
        float *s = p + gr * t;
        float mx = -INFINITY;
        for (int64_t j = lane; j <= i; j += WARP)
            mx = fmaxf(mx, s[j]);
        mx = warp_max(mx);
        double sum = 0.0;
        for (int64_t j = lane; j <= i; j += WARP) {
            float e = expf(s[j] - mx);
            s[j] = e;
            sum += e;
        }
        float inv = (float)(1.0 / warp_sum(sum));
        for (int64_t j = lane; j < t; j += WARP)
            s[j] = j <= i ? s[j] * inv : 0.0f;
    }
}

// The softmax's backward in place: dp (the gradient of the probabilities p) becomes the gradient
// of the scores, p (dp - sum over the row of p dp), zero above the diagonal. One warp a row.
__global__ void causal_softmax_grad_kernel(int64_t nseq, int64_t t, const float *p, float *dp)
{
    int lane = (int)(threadIdx.x % WARP);
    WARP_ROWS(gr, nseq * t)
    {
        int64_t i = gr % t;
        const float *pr = p + gr * t;
        float *dr = dp + gr * t;
        double dot = 0.0;
        for (int64_t j = lane; j <= i; j += WARP)
            dot += (double)pr[j] * dr[j];
        float d = (float)warp_sum(dot);
        for (int64_t j = lane; j < t; j += WARP)
            dr[j] = j <= i ? pr[j] * (dr[j] - d) : 0.0f;
    }
}

extern "C" cudaError_t ifd_cuda_fill(cudaStream_t s, int64_t n, float value, float *x)
{
    clear_stale_error();
    if (n > 0)
        fill_kernel<<<grid_for(n), IFD_CUDA_THREADS, 0, s>>>(n, value, x);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_add(cudaStream_t s, int64_t n, float alpha, const float *x,
                                    float *y)
{
    clear_stale_error();
    if (n > 0)
        add_kernel<<<grid_for(n), IFD_CUDA_THREADS, 0, s>>>(n, alpha, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_embedding(cudaStream_t s, int64_t rows, int64_t dim,
                                          const int32_t *ids, const float *table, float *out)
{
    clear_stale_error();
    if (rows > 0 && dim > 0)
        embedding_kernel<<<grid_for(rows * dim), IFD_CUDA_THREADS, 0, s>>>(rows, dim, ids, table,
                                                                           out);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_embedding_grad(cudaStream_t s, int64_t rows, int64_t dim,
                                               const int32_t *ids, const float *dout, float *dtable)
{
    clear_stale_error();
    if (rows > 0 && dim > 0) {
        unsigned int grid = (unsigned int)(rows < IFD_CUDA_MAX_BLOCKS ? rows : IFD_CUDA_MAX_BLOCKS);
        embedding_grad_kernel<<<grid, IFD_CUDA_THREADS, 0, s>>>(rows, dim, ids, dout, dtable);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_layernorm(cudaStream_t s, int64_t rows, int64_t dim, const float *x,
                                          const float *gamma, const float *beta, float eps,
                                          float *y, float *mean, float *rstd)
{
    clear_stale_error();
    if (rows > 0 && dim > 0)
        layernorm_kernel<<<warp_blocks_for(rows), IFD_CUDA_THREADS, 0, s>>>(
            rows, dim, x, gamma, beta, eps, y, mean, rstd);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_layernorm_grad(cudaStream_t s, int64_t rows, int64_t dim,
                                               const float *x, const float *gamma,
                                               const float *mean, const float *rstd,
                                               const float *dy, float *dx, float *dgamma,
                                               float *dbeta)
{
    clear_stale_error();
    if (rows > 0 && dim > 0) {
        /* dgamma and dbeta first: dx may be dy */
        int64_t b = (dim + LN_COLS - 1) / LN_COLS;
        unsigned int grid = (unsigned int)(b < IFD_CUDA_MAX_BLOCKS ? b : IFD_CUDA_MAX_BLOCKS);
        layernorm_params_kernel<<<grid, LN_COLS * LN_LANES, 0, s>>>(rows, dim, x, mean, rstd, dy,
                                                                    dgamma, dbeta);
        layernorm_dx_kernel<<<warp_blocks_for(rows), IFD_CUDA_THREADS, 0, s>>>(rows, dim, x, gamma,
                                                                               mean, rstd, dy, dx);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_gelu(cudaStream_t s, int64_t n, const float *x, float *y)
{
    clear_stale_error();
    if (n > 0)
        gelu_kernel<<<grid_for(n), IFD_CUDA_THREADS, 0, s>>>(n, x, y);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_gelu_grad(cudaStream_t s, int64_t n, const float *x,
                                          const float *dy, float *dx)
{
    clear_stale_error();
    if (n > 0)
        gelu_grad_kernel<<<grid_for(n), IFD_CUDA_THREADS, 0, s>>>(n, x, dy, dx);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_causal_softmax(cudaStream_t s, int64_t nseq, int64_t t, float *p)
{
    clear_stale_error();
    if (nseq > 0 && t > 0)
        causal_softmax_kernel<<<warp_blocks_for(nseq * t), IFD_CUDA_THREADS, 0, s>>>(nseq, t, p);
    return cudaGetLastError();
}

extern "C" cudaError_t ifd_cuda_causal_softmax_grad(cudaStream_t s, int64_t nseq, int64_t t,
                                                    const float *p, float *dp)
{
    clear_stale_error();
    if (nseq > 0 && t > 0)
        causal_softmax_grad_kernel<<<warp_blocks_for(nseq * t), IFD_CUDA_THREADS, 0, s>>>(nseq, t,
                                                                                          p, dp);
    return cudaGetLastError();
}
