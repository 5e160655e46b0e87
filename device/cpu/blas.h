/*
 * The BLAS the cpu backend multiplies with, and the kernel it runs (docs/design.md, "The BLAS
 * kernel").
 *
 * OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels when it loads, from the CPU's
 * family and model. A CPU newer than the library (or a cloud VM that masks its model) gets a
 * generic fallback: OpenBLAS 0.3.21 on an Emerald Rapids Xeon with AVX-512 runs its SSE3
 * "Prescott" kernels, 4 to 5 times slower than its SkylakeX ones, without a word. The first cpu
 * backend that opens in a process therefore checks the kernel against what the CPU can do
 * (its instruction set level, read with cpuid through the compiler's __builtin_cpu_supports,
 * which also checks that the OS saves the wide registers) and, when the kernel is below it,
 * switches OpenBLAS to the best kernel for the CPU before any product runs, through OpenBLAS's
 * own exported gotoblas_dynamic_quit / gotoblas_dynamic_init with OPENBLAS_CORETYPE set for the
 * call. The choice is process-wide (OpenBLAS has one kernel table), made once.
 *
 * Requests (ifd_config.blas_kernel, infeedd --blas-kernel):
 *   NULL or "auto"   correct a fallback; OPENBLAS_CORETYPE in the environment is obeyed instead
 *   "keep"           whatever OpenBLAS picked (or OPENBLAS_CORETYPE made it pick)
 *   a kernel name    that kernel (case-insensitive: SkylakeX, Haswell, Zen, Sandybridge, ...),
 *                    refused when the CPU lacks its instructions or the library does not have it
 */
#ifndef IFD_DEVICE_CPU_BLAS_H
#define IFD_DEVICE_CPU_BLAS_H

#include <infeed/error.h>

/* Instruction set levels that decide which kernels can run. */
typedef enum ifd_isa {
    IFD_ISA_UNKNOWN = 0,
    IFD_ISA_SSE = 1,    /* SSE2/SSE3/SSE4: Prescott, Core2, Nehalem, Atom, Barcelona, ... */
    IFD_ISA_AVX = 2,    /* Sandybridge, Bulldozer, Piledriver, Steamroller */
    IFD_ISA_AVX2 = 3,   /* AVX2 and FMA: Haswell, Zen, Excavator */
    IFD_ISA_AVX512 = 4, /* AVX-512 F, CD, BW, DQ and VL: SkylakeX, Cooperlake, SapphireRapids */
} ifd_isa;

typedef struct ifd_blas_info {
    char library[64]; /* "OpenBLAS 0.3.21 DYNAMIC_ARCH" (the first words of openblas_get_config) */
    char kernel[32];  /* the kernel in use */
    char picked[32];  /* the kernel the library picked by itself when it loaded */
    /* How the kernel was chosen: "detected" (the library's own choice, not a fallback),
     * "corrected" (a fallback replaced), "OPENBLAS_CORETYPE", "blas_kernel" (asked for by name),
     * "keep" (a fallback kept on request), or "fixed" (the library cannot switch: built for one
     * target, or not OpenBLAS). */
    const char *how;
    ifd_isa cpu_isa;    /* what the CPU (and OS) can run */
    ifd_isa kernel_isa; /* what the kernel in use needs; IFD_ISA_UNKNOWN for a name not known */
    int switchable;     /* the library can change kernels (OpenBLAS DYNAMIC_ARCH) */
} ifd_blas_info;

/* Makes the process's choice (see the top of this file) the first time it is called; later
 * calls with "auto", "keep", NULL or the kernel already in use return IFD_OK, and another name
 * is IFD_EINVAL (the kernel is process-wide and products may be running). Errors name the key
 * blas_kernel, what it allows and what it got. Thread-safe. */
int ifd_blas_select(const char *request, ifd_error *err);
/* Checks a request as ifd_blas_select would (the name, the CPU's level, a library that can
 * switch), without choosing anything: for config validation. */
int ifd_blas_check(const char *request, ifd_error *err);
/* The choice so far (the library's own before any ifd_blas_select). */
void ifd_blas_info_get(ifd_blas_info *out);
/* One readable line: "OpenBLAS 0.3.21, kernel SkylakeX (corrected: OpenBLAS picked Prescott, a
 * fallback below this CPU's AVX-512)". */
const char *ifd_blas_describe(const ifd_blas_info *info, char *buf, size_t len);

/* The level this CPU and OS can run. */
ifd_isa ifd_cpu_isa(void);
const char *ifd_isa_name(ifd_isa isa);
/* The level OpenBLAS kernel `name` needs (case-insensitive); IFD_ISA_UNKNOWN when not known. */
ifd_isa ifd_blas_kernel_isa(const char *name);
/* The kernel to run on a CPU of level `isa`: SkylakeX (its float32 products are Cooperlake's;
 * newer OpenBLAS runs Zen 4 on it too), Haswell (Zen on AMD), Sandybridge; NULL below AVX, where
 * no SSE kernel is a fallback for another. */
const char *ifd_blas_best_kernel(ifd_isa isa, int amd);
/* Whether `kernel` is a fallback on a CPU of level `cpu`: a known kernel below the CPU's level
 * (at AVX and above; no SSE kernel is a fallback for another). */
int ifd_blas_is_fallback(const char *kernel, ifd_isa cpu);

#endif
