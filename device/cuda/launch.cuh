// What the cuda backend's kernel files (kernels.cu, nn_kernels.cu) share: the block size, the
// grid of a grid-stride loop and the launchers' handling of a stale error.
#ifndef IFD_DEVICE_CUDA_LAUNCH_CUH
#define IFD_DEVICE_CUDA_LAUNCH_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#define IFD_CUDA_THREADS 256
#define IFD_CUDA_MAX_BLOCKS 4096

// Blocks for a grid-stride loop over n items (n > 0).
static inline unsigned int grid_for(int64_t n)
{
    int64_t b = (n + IFD_CUDA_THREADS - 1) / IFD_CUDA_THREADS;
    return (unsigned int)(b < IFD_CUDA_MAX_BLOCKS ? b : IFD_CUDA_MAX_BLOCKS);
}

// A launcher reports its launch's error with cudaGetLastError(), which returns the thread's last
// non-sticky error from any earlier runtime call too. Libraries called on this thread between two
// launches (NCCL's enqueue polls an internal event with cudaEventQuery in some releases and leaves
// cudaErrorNotReady behind) would then fail the next kernel for nothing: clear it first. A sticky
// error is not cleared by this and still fails the launch.
static inline void clear_stale_error(void)
{
    (void)cudaGetLastError();
}

#define GRID_STRIDE(i, n)                                                                          \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

#endif
