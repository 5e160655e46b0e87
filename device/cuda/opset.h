/*
 * The cuda backend's op set (include/infeed/program.h's ifd_ops) outside a session: one GPU's
 * compute stream, cuBLAS handle and op table, for tests and benchmarks that call the ops directly
 * on device memory they manage themselves (tests/gpu/test_cuda_nn_ops.c). No CUDA type appears
 * here, so a caller needs only the CUDA runtime for its own memory.
 */
#ifndef IFD_DEVICE_CUDA_OPSET_H
#define IFD_DEVICE_CUDA_OPSET_H

#include <infeed/program.h>

typedef struct ifd_cuda_opset ifd_cuda_opset;

/* Sets the calling thread's device to gpu and makes the set; IFD_ECUDA with CUDA's or cuBLAS's
 * sentence when it cannot (no GPU). */
int ifd_cuda_opset_open(int gpu, ifd_cuda_opset **out, ifd_error *err);
/* The op table (ctx set): ops enqueue on the set's stream, in call order. */
const ifd_ops *ifd_cuda_opset_ops(const ifd_cuda_opset *o);
/* Waits for every op enqueued so far. The first op that failed since the last sync (an op
 * returns nothing: a launch or cuBLAS error, a size over INT_MAX), else a CUDA error of the
 * wait, else IFD_OK; the ops run again after it. */
int ifd_cuda_opset_sync(ifd_cuda_opset *o, ifd_error *err);
/* Waits for the stream and frees the set; NULL does nothing. */
void ifd_cuda_opset_close(ifd_cuda_opset *o);

#endif
