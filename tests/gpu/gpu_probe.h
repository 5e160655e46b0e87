/* How many GPUs a test may use, decided at run time. */
#ifndef IFD_TESTS_GPU_PROBE_H
#define IFD_TESTS_GPU_PROBE_H

#include <stddef.h>

/* The number of visible CUDA devices; 0 with the reason in why ("cudaGetDeviceCount: ...").
 * It asks from a forked child, so that this process never initialises CUDA itself: Check forks
 * every test, and CUDA does not survive a fork once initialised. */
int gpu_probe(char *why, size_t len);

#endif
