#include "device/cpu/blas.h"

#include "device/ops_gemm_cpu.h"

#include "core/log.h"
#include "core/thread.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Always in OpenBLAS; the kernel switch (gotoblas_dynamic_*) only in DYNAMIC_ARCH builds, so it
 * is looked up at run time. */
char *openblas_get_corename(void);
char *openblas_get_config(void);

/* OpenBLAS's x86-64 kernel names (driver/others/dynamic.c) and the level each needs. */
static const struct {
    const char *name;
    ifd_isa isa;
} kernels[] = {
    {"Katmai", IFD_ISA_SSE},        {"Coppermine", IFD_ISA_SSE},
    {"Northwood", IFD_ISA_SSE},     {"Prescott", IFD_ISA_SSE},
    {"Banias", IFD_ISA_SSE},        {"Atom", IFD_ISA_SSE},
    {"Core2", IFD_ISA_SSE},         {"Penryn", IFD_ISA_SSE},
    {"Dunnington", IFD_ISA_SSE},    {"Nehalem", IFD_ISA_SSE},
    {"Athlon", IFD_ISA_SSE},        {"Opteron", IFD_ISA_SSE},
    {"Opteron_SSE3", IFD_ISA_SSE},  {"Barcelona", IFD_ISA_SSE},
    {"Nano", IFD_ISA_SSE},          {"Bobcat", IFD_ISA_SSE},
    {"Sandybridge", IFD_ISA_AVX},   {"Bulldozer", IFD_ISA_AVX},
    {"Piledriver", IFD_ISA_AVX},    {"Steamroller", IFD_ISA_AVX},
    {"Haswell", IFD_ISA_AVX2},      {"Excavator", IFD_ISA_AVX2},
    {"Zen", IFD_ISA_AVX2},          {"SkylakeX", IFD_ISA_AVX512},
    {"Cooperlake", IFD_ISA_AVX512}, {"SapphireRapids", IFD_ISA_AVX512},
};

ifd_isa ifd_blas_kernel_isa(const char *name)
{
    for (size_t i = 0; name && i < sizeof kernels / sizeof kernels[0]; i++)
        if (strcasecmp(name, kernels[i].name) == 0)
            return kernels[i].isa;
    return IFD_ISA_UNKNOWN;
}

const char *ifd_isa_name(ifd_isa isa)
{
    switch (isa) {
    case IFD_ISA_SSE:
        return "SSE";
    case IFD_ISA_AVX:
        return "AVX";
    case IFD_ISA_AVX2:
        return "AVX2";
    case IFD_ISA_AVX512:
        return "AVX-512";
    default:
        return "unknown";
    }
}

ifd_isa ifd_cpu_isa(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        return IFD_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return IFD_ISA_AVX2;
    if (__builtin_cpu_supports("avx"))
        return IFD_ISA_AVX;
    return IFD_ISA_SSE;
#else
    return IFD_ISA_UNKNOWN;
#endif
}

static int cpu_is_amd(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
#else
    return 0;
#endif
}

const char *ifd_blas_best_kernel(ifd_isa isa, int amd)
{
    switch (isa) {
    case IFD_ISA_AVX512:
        return "SkylakeX";
    case IFD_ISA_AVX2:
        return amd ? "Zen" : "Haswell";
    case IFD_ISA_AVX:
        return "Sandybridge";
    default:
        return NULL;
    }
}

int ifd_blas_is_fallback(const char *kernel, ifd_isa cpu)
{
    ifd_isa k = ifd_blas_kernel_isa(kernel);
    return k != IFD_ISA_UNKNOWN && cpu >= IFD_ISA_AVX && k < cpu;
}

/* ---- the process's choice ---------------------------------------------------------------- */

static ifd_mutex blas_mu = IFD_MUTEX_INITIALIZER;
static int chosen;        /* ifd_blas_select decided (under blas_mu) */
static ifd_blas_info now; /* valid once `chosen` (or filled by info_get before) */
static int have_now;

static void copy_name(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "unknown");
}

/* The library's name: the first words of openblas_get_config, "OpenBLAS 0.3.21". */
static void read_library(ifd_blas_info *in)
{
    const char *cfg = openblas_get_config();
    const char *p = cfg ? cfg : "OpenBLAS";
    int words = 0;
    size_t n = 0;
    while (p[n] && n + 1 < sizeof in->library) {
        if (p[n] == ' ' && ++words == 2)
            break;
        n++;
    }
    snprintf(in->library, sizeof in->library, "%.*s", (int)n, p);
}

static void fill_initial(ifd_blas_info *in)
{
    memset(in, 0, sizeof *in);
    read_library(in);
    copy_name(in->kernel, sizeof in->kernel, openblas_get_corename());
    copy_name(in->picked, sizeof in->picked, in->kernel);
    in->cpu_isa = ifd_cpu_isa();
    in->kernel_isa = ifd_blas_kernel_isa(in->kernel);
    in->switchable = dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init") != NULL &&
                     dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit") != NULL;
    if (!in->switchable)
        in->how = "fixed";
    else if (getenv("OPENBLAS_CORETYPE"))
        in->how = "OPENBLAS_CORETYPE";
    else
        in->how = "detected";
}

/* Reloads OpenBLAS's kernel table as OPENBLAS_CORETYPE=name would have at load. Before any
 * product runs (the caller's contract); the variable is put back as it was. */
static void switch_kernel(const char *name)
{
    void (*quit)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit");
    void (*init)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init");
    const char *old = getenv("OPENBLAS_CORETYPE");
    char *saved = old ? strdup(old) : NULL;
    setenv("OPENBLAS_CORETYPE", name, 1);
    quit();
    init();
    if (saved)
        setenv("OPENBLAS_CORETYPE", saved, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
    free(saved);
}

static void kernel_names(char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0] && off < len; i++)
        if (kernels[i].isa >= IFD_ISA_AVX)
            off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? ", " : "", kernels[i].name);
}

/* What can be checked of a request without switching: the words, the name, the CPU's level and
 * whether the library can switch at all. */
static int check_request(const ifd_blas_info *in, const char *request, ifd_error *err)
{
    char names[400];
    if (request == NULL || strcasecmp(request, "auto") == 0 || strcasecmp(request, "keep") == 0)
        return IFD_OK;
    ifd_isa need = ifd_blas_kernel_isa(request);
    if (need == IFD_ISA_UNKNOWN) {
        kernel_names(names, sizeof names);
        return ifd_error_set_key(err, IFD_EINVAL, "blas_kernel",
                                 "expected auto, keep or an OpenBLAS kernel name (%s, or an SSE "
                                 "one such as Prescott), got '%.64s'",
                                 names, request);
    }
    if (need > in->cpu_isa)
        return ifd_error_set_key(err, IFD_EINVAL, "blas_kernel",
                                 "'%.64s' needs %s, and this CPU runs %s at most; expected auto, "
                                 "keep or a kernel within %s",
                                 request, ifd_isa_name(need), ifd_isa_name(in->cpu_isa),
                                 ifd_isa_name(in->cpu_isa));
    if (!in->switchable)
        return ifd_error_set_key(err, IFD_EINVAL, "blas_kernel",
                                 "'%.64s' asked for, but %s cannot switch kernels (it is not an "
                                 "OpenBLAS built with DYNAMIC_ARCH); expected auto or keep",
                                 request, in->library);
    return IFD_OK;
}

int ifd_blas_check(const char *request, ifd_error *err)
{
    ifd_blas_info in;
    ifd_blas_info_get(&in);
    return check_request(&in, request, err);
}

/* A kernel asked for by name, checked; the library falls back to another for a name it lacks,
 * which the check after the switch catches. */
static int select_named(ifd_blas_info *in, const char *request, ifd_error *err)
{
    int rc = check_request(in, request, err);
    if (rc)
        return rc;
    if (strcasecmp(in->kernel, request) != 0)
        switch_kernel(request);
    const char *got = openblas_get_corename();
    if (got == NULL || strcasecmp(got, request) != 0) {
        char was[32];
        copy_name(was, sizeof was, in->kernel);
        switch_kernel(was);
        return ifd_error_set_key(err, IFD_EINVAL, "blas_kernel",
                                 "%s has no kernel '%.64s' (it gave %s instead); expected auto, "
                                 "keep or a kernel it has",
                                 in->library, request, got ? got : "none");
    }
    copy_name(in->kernel, sizeof in->kernel, got);
    in->how = "blas_kernel";
    return IFD_OK;
}

static void select_auto(ifd_blas_info *in)
{
    if (!in->switchable || getenv("OPENBLAS_CORETYPE") ||
        !ifd_blas_is_fallback(in->kernel, in->cpu_isa))
        return;
    const char *best = ifd_blas_best_kernel(in->cpu_isa, cpu_is_amd());
    switch_kernel(best);
    const char *got = openblas_get_corename();
    if (got && strcasecmp(got, best) == 0) {
        copy_name(in->kernel, sizeof in->kernel, got);
        in->how = "corrected";
        return;
    }
    /* An older OpenBLAS without that kernel: try the AVX2 one before giving up. */
    const char *next = ifd_blas_best_kernel(IFD_ISA_AVX2, cpu_is_amd());
    if (in->cpu_isa > IFD_ISA_AVX2 && strcasecmp(best, next) != 0) {
        switch_kernel(next);
        got = openblas_get_corename();
        if (got && strcasecmp(got, next) == 0) {
            copy_name(in->kernel, sizeof in->kernel, got);
            in->how = "corrected";
            return;
        }
    }
    switch_kernel(in->picked);
    IFD_LOG_WARN("BLAS: %s runs its %s kernel, below this CPU's %s, and has no better one; "
                 "products run slower than the machine can",
                 in->library, in->picked, ifd_isa_name(in->cpu_isa));
}

int ifd_blas_select(const char *request, ifd_error *err)
{
    int auto_ = request == NULL || strcasecmp(request, "auto") == 0;
    int keep = request && strcasecmp(request, "keep") == 0;
    int rc = IFD_OK;
    ifd_mutex_lock(&blas_mu);
    if (chosen) {
        if (!auto_ && !keep && strcasecmp(request, now.kernel) != 0)
            rc = ifd_error_set_key(err, IFD_EINVAL, "blas_kernel",
                                   "'%.64s' asked for, but this process already runs %s's %s "
                                   "kernel (chosen when its first cpu backend opened; the kernel "
                                   "is process-wide); expected auto, keep or %s",
                                   request, now.library, now.kernel, now.kernel);
        ifd_mutex_unlock(&blas_mu);
        return rc;
    }
    ifd_blas_info in;
    fill_initial(&in);
    if (keep) {
        if (ifd_blas_is_fallback(in.kernel, in.cpu_isa))
            in.how = "keep";
    } else if (auto_) {
        select_auto(&in);
    } else {
        rc = select_named(&in, request, err);
    }
    if (rc == IFD_OK) {
        in.kernel_isa = ifd_blas_kernel_isa(in.kernel);
        now = in;
        have_now = 1;
        chosen = 1;
    }
    ifd_mutex_unlock(&blas_mu);
    return rc;
}

void ifd_blas_info_get(ifd_blas_info *out)
{
    ifd_mutex_lock(&blas_mu);
    if (!have_now) {
        fill_initial(&now);
        have_now = 1;
    }
    *out = now;
    ifd_mutex_unlock(&blas_mu);
}

const char *ifd_blas_describe(const ifd_blas_info *in, char *buf, size_t len)
{
    const char *how = in->how ? in->how : "detected";
    if (strcmp(how, "corrected") == 0)
        snprintf(buf, len,
                 "%s, kernel %s (corrected: the library picked %s, a fallback below this CPU's "
                 "%s; --blas-kernel keep leaves it)",
                 in->library, in->kernel, in->picked, ifd_isa_name(in->cpu_isa));
    else if (strcmp(how, "keep") == 0)
        snprintf(buf, len,
                 "%s, kernel %s (kept as asked: a fallback below this CPU's %s; --blas-kernel auto "
                 "corrects it)",
                 in->library, in->kernel, ifd_isa_name(in->cpu_isa));
    else if (strcmp(how, "blas_kernel") == 0 || strcmp(how, "OPENBLAS_CORETYPE") == 0)
        snprintf(buf, len, "%s, kernel %s (from %s; the library picked %s; the CPU runs %s)",
                 in->library, in->kernel,
                 strcmp(how, "blas_kernel") == 0 ? "--blas-kernel" : "OPENBLAS_CORETYPE",
                 in->picked, ifd_isa_name(in->cpu_isa));
    else
        snprintf(buf, len, "%s, kernel %s (%s; the CPU runs %s)", in->library, in->kernel,
                 strcmp(how, "fixed") == 0 ? "the library's only one" : "the library's own pick",
                 ifd_isa_name(in->cpu_isa));
    size_t used = strlen(buf);
    if (used + 1 < len)
        snprintf(buf + used, len - used, "; small products: %s", ifd_cpu_gemm_small_library());
    return buf;
}
