/*
 * bench_blas: single-thread (or --threads N) sgemm GFLOP/s on the products infeedd's jobs run, for
 * each OpenBLAS kernel this CPU can run (the linked OpenBLAS, switched as --blas-kernel would),
 * beside other BLAS libraries given with --lib, side by side in one run (bench/README.md).
 *
 *   bench_blas [--kernels auto,keep,Haswell,...] [--lib PATH[:PREFIX]]... [--reps N] [--json]
 *              [--shapes jobs|charlm|ref] [--xsmm] [--threads N]
 *
 * --shapes ref: the jobs' first product alone (the reference, 1024x784x128). --shapes
 * charlm: charlm32's products instead (a 4096-row shard: each dense layer's forward,
 * dx = dy W^T and dW = x^T dy; one head's attention blocks, strided in qkv as the op reads them).
 * --xsmm (a build with libxsmm): libxsmm's JIT kernels as a candidate, two ways: "tiled" cuts C
 * into 64 x 128 tiles and k into 256-long pieces, one kernel call a tile, nothing packed (a
 * transposed B, which libxsmm 1.17 cannot read, transposed first, in the time); "small" is the
 * op set's ifd_cpu_gemm_small, what the attention runs (one kernel a product where it fits one,
 * else OpenBLAS).
 *
 * Each kernel is measured in a child process of its own (the kernel is process-wide and chosen
 * once); each other library is dlopen'ed in a child with RTLD_DEEPBIND, so its symbols do not
 * mix with the linked OpenBLAS's; PREFIX is its symbol prefix (scipy-openblas32 names its
 * functions scipy_cblas_sgemm). The rounds alternate between the candidates and each cell is the
 * best of --reps rounds, so a noisy neighbour slows every candidate alike.
 *
 * --threads N: N threads in the child each run the same product at once on buffers of their own
 * (the library single-threaded in each, as the cpu backend runs it: one sgemm a thread), started
 * together and timed over the same window; a cell is the sum of their GFLOP/s, the rate N
 * threads get from the machine as it is loaded now (bench/peers.py measures it beside each charlm
 * run with the daemon's thread count).
 */
#include "core/thread.h"
#include "device/cpu/blas.h"
#include "device/ops_gemm_cpu.h"

#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

char *openblas_get_corename(void);

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);

/* A row-major product C = op(A) op(B), C m x n; lda, ldb, ldc 0: packed. */
typedef struct shape {
    const char *name;
    int ta, m, n, k, tb, lda, ldb, ldc;
} shape;

/* The products of bench/peers.py's jobs (row-major, as device/ops_gemm_cpu.c calls them), and the
 * issue's reference product. */
static const shape jobs_shapes[] = {
    {"ref 1024x784x128", 0, 1024, 128, 784, 0, 0, 0, 0},
    {"mlp32 fwd 32x784x128", 0, 32, 128, 784, 0, 0, 0, 0},
    {"mlp32 dW 784x32x128", 1, 784, 128, 32, 0, 0, 0, 0},
    {"mlp1024 dW 784x1024x128", 1, 784, 128, 1024, 0, 0, 0, 0},
    {"mlp 10x128 fwd b1024", 0, 1024, 10, 128, 0, 0, 0, 0},
};
/* charlm32's (width 128, vocabulary 256) on one replica's 4096 rows: forward x W (qkv, proj, fc,
 * out, head), dx = dy W^T, dW = x^T dy; the attention's blocks of one head at t = 128 (the
 * scores' last row block, from K as it lies in qkv, B^T, or from K^T copied out, as the op
 * takes it now; P V; the backward's dV = P^T dO), strided in qkv (ld 384). */
static const shape charlm_shapes[] = {
    {"fwd qkv 4096x384x128", 0, 4096, 384, 128, 0, 0, 0, 0},
    {"fwd proj 4096x128x128", 0, 4096, 128, 128, 0, 0, 0, 0},
    {"fwd fc 4096x512x128", 0, 4096, 512, 128, 0, 0, 0, 0},
    {"fwd out 4096x128x512", 0, 4096, 128, 512, 0, 0, 0, 0},
    {"fwd head 4096x256x128", 0, 4096, 256, 128, 0, 0, 0, 0},
    {"dx qkv 4096x128x384 (B^T)", 0, 4096, 128, 384, 1, 0, 0, 0},
    {"dx fc 4096x128x512 (B^T)", 0, 4096, 128, 512, 1, 0, 0, 0},
    {"dx out 4096x512x128 (B^T)", 0, 4096, 512, 128, 1, 0, 0, 0},
    {"dW qkv 128x384x4096 (A^T)", 1, 128, 384, 4096, 0, 0, 0, 0},
    {"dW out 512x128x4096 (A^T)", 1, 512, 128, 4096, 0, 0, 0, 0},
    {"att scores 32x128x32 (K, B^T)", 0, 32, 128, 32, 1, 384, 384, 128},
    {"att scores 32x128x32 (K^T)", 0, 32, 128, 32, 0, 384, 128, 128},
    {"att P V 32x32x128", 0, 32, 32, 128, 0, 128, 384, 128},
    {"att dV 32x32x128 (P^T)", 1, 32, 32, 128, 0, 128, 128, 384},
};
static const shape *shapes = jobs_shapes;
static size_t nshapes = sizeof jobs_shapes / sizeof jobs_shapes[0];
#define NSHAPES_MAX 16

#ifdef IFD_HAVE_LIBXSMM
#include <libxsmm.h>

/* The "tiled" candidate: C in tiles of 64 rows by 128 columns, k in 256-long pieces, a JIT
 * kernel a tile (column-major: C^T = op(B)^T op(A)^T), B transposed first when asked. */
static void xsmm_tiled(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                       int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    (void)order;
    (void)alpha; /* the shapes' alpha is 1, beta 0 */
    (void)beta;
    static _Thread_local float *bt;
    static _Thread_local size_t btn;
    if (tb == CblasTrans) {
        if (btn < (size_t)n * (size_t)k) {
            free(bt);
            btn = (size_t)n * (size_t)k;
            bt = malloc(btn * sizeof(float));
        }
        for (int j = 0; j < n; j++)
            for (int i = 0; i < k; i++)
                bt[(size_t)i * (size_t)n + (size_t)j] = b[(size_t)j * (size_t)ldb + (size_t)i];
        b = bt;
        ldb = n;
    }
    libxsmm_blasint xlda = ldb, xldb = lda, xldc = ldc;
    int flags = ta == CblasTrans ? LIBXSMM_GEMM_FLAG_TRANS_B : 0;
    float one = 1.0f, zero = 0.0f;
    for (int k0 = 0; k0 < k; k0 += 256) {
        int kl = k - k0 < 256 ? k - k0 : 256;
        for (int i0 = 0; i0 < m; i0 += 64) {
            int il = m - i0 < 64 ? m - i0 : 64;
            for (int j0 = 0; j0 < n; j0 += 128) {
                int jl = n - j0 < 128 ? n - j0 : 128;
                libxsmm_smmfunction f = libxsmm_smmdispatch(jl, il, kl, &xlda, &xldb, &xldc, &one,
                                                            k0 ? &one : &zero, &flags, NULL);
                f(b + (size_t)k0 * (size_t)ldb + (size_t)j0,
                  ta == CblasTrans ? a + (size_t)k0 * (size_t)lda + (size_t)i0
                                   : a + (size_t)i0 * (size_t)lda + (size_t)k0,
                  c + (size_t)i0 * (size_t)ldc + (size_t)j0);
            }
        }
    }
}
#endif

/* The "small" candidate: the op set's small products (libxsmm where the call fits a kernel). */
static void gemm_small(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                       int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    (void)order;
    ifd_cpu_gemm_small(ta == CblasTrans, tb == CblasTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                       ldc);
}

/* GFLOP/s of f on s over `seconds`, after one call; with a barrier, it waits there after that call,
 * so that every thread of a --threads cell times the same window. */
static double measure(sgemm_fn f, const shape *s, double seconds, pthread_barrier_t *start)
{
    int lda = s->lda  ? s->lda
              : s->ta ? s->m
                      : s->k,
        ldb = s->ldb  ? s->ldb
              : s->tb ? s->k
                      : s->n,
        ldc = s->ldc ? s->ldc : s->n;
    size_t asz = (size_t)(s->ta ? s->k : s->m) * (size_t)lda,
           bsz = (size_t)(s->tb ? s->n : s->k) * (size_t)ldb;
    float *a = malloc(sizeof(float) * asz), *b = malloc(sizeof(float) * bsz),
          *c = calloc((size_t)s->m * (size_t)ldc, sizeof(float));
    for (size_t i = 0; i < asz; i++)
        a[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < bsz; i++)
        b[i] = (float)((i * 5) % 11) * 0.01f;
    int ta = s->ta ? CblasTrans : CblasNoTrans, tb = s->tb ? CblasTrans : CblasNoTrans;
    f(CblasRowMajor, ta, tb, s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    if (start)
        pthread_barrier_wait(start);
    int64_t t0 = ifd_clock_ns(), calls = 0, t;
    do {
        for (int i = 0; i < 8; i++)
            f(CblasRowMajor, ta, tb, s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
        calls += 8;
        t = ifd_clock_ns();
    } while ((double)(t - t0) * 1e-9 < seconds);
    free(a);
    free(b);
    free(c);
    return 2.0 * s->m * s->n * (double)s->k * (double)calls / ((double)(t - t0) * 1e-9) * 1e-9;
}

typedef struct par_arg {
    sgemm_fn f;
    const shape *s;
    double seconds, gflops;
    pthread_barrier_t *start;
} par_arg;

static void *par_main(void *arg)
{
    par_arg *p = arg;
    p->gflops = measure(p->f, p->s, p->seconds, p->start);
    return NULL;
}

#define THREADS_MAX 1024

/* The summed GFLOP/s of `threads` threads running f on s at once (measure's alone for 1); -1 when
 * a thread does not start. */
static double measure_par(sgemm_fn f, const shape *s, double seconds, int threads)
{
    if (threads == 1)
        return measure(f, s, seconds, NULL);
    pthread_barrier_t start;
    static pthread_t tid[THREADS_MAX];
    static par_arg args[THREADS_MAX];
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    int started = 0;
    for (; started < threads; started++) {
        args[started] = (par_arg){.f = f, .s = s, .seconds = seconds, .start = &start};
        if (pthread_create(&tid[started], NULL, par_main, &args[started]))
            break;
    }
    if (started < threads) /* the barrier would never open: let the others go, and fail */
        _exit(1);
    double sum = 0.0;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        sum += args[i].gflops;
    }
    pthread_barrier_destroy(&start);
    return sum;
}

/* One candidate in a child: its name on the first line, then one GFLOP/s a shape. */
static void child(const char *kernel, const char *lib, int xsmm, int fd, double seconds,
                  int threads)
{
    sgemm_fn f = (sgemm_fn)cblas_sgemm;
    char label[160];
    if (xsmm) {
        ifd_error err;
        openblas_set_num_threads(1);
        if (ifd_blas_select("auto", &err)) { /* the fallbacks of "small" run as infeedd's */
            dprintf(fd, "%s\n", err.msg);
            _exit(1);
        }
#ifdef IFD_HAVE_LIBXSMM
        f = xsmm == 1 ? xsmm_tiled : gemm_small;
#else
        f = gemm_small;
#endif
        snprintf(label, sizeof label, "%s %s", ifd_cpu_gemm_small_library(),
                 xsmm == 1 ? "tiled 64x128x256, nothing packed" : "small (the attention's)");
    } else if (lib) {
        char path[512], sym[96];
        snprintf(path, sizeof path, "%s", lib);
        char *colon = strchr(path, ':');
        const char *prefix = "";
        if (colon) {
            *colon = '\0';
            prefix = colon + 1;
        }
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
        if (!h) {
            dprintf(fd, "%s: %s\n", path, dlerror());
            _exit(1);
        }
        snprintf(sym, sizeof sym, "%scblas_sgemm", prefix);
        f = (sgemm_fn)dlsym(h, sym);
        void (*threads)(int) = NULL;
        snprintf(sym, sizeof sym, "%sopenblas_set_num_threads", prefix);
        threads = (void (*)(int))dlsym(h, sym);
        if (!threads)
            threads = (void (*)(int))dlsym(h, "MKL_Set_Num_Threads");
        if (!threads)
            threads = (void (*)(int))dlsym(h, "bli_thread_set_num_threads");
        if (threads)
            threads(1);
        char *(*core)(void) = NULL;
        snprintf(sym, sizeof sym, "%sopenblas_get_corename", prefix);
        core = (char *(*)(void))dlsym(h, sym);
        char *(*config)(void) = NULL;
        snprintf(sym, sizeof sym, "%sopenblas_get_config", prefix);
        config = (char *(*)(void))dlsym(h, sym);
        if (!f) {
            dprintf(fd, "%s: no %scblas_sgemm\n", path, prefix);
            _exit(1);
        }
        const char *base = strrchr(path, '/');
        snprintf(label, sizeof label, "%.60s%s%.40s%s%.30s", base ? base + 1 : path,
                 config ? " (" : "", config ? config() : "", core ? ", kernel " : "",
                 core ? core() : "");
        if (config)
            strcat(label, ")");
    } else {
        ifd_error err;
        openblas_set_num_threads(1);
        if (ifd_blas_select(kernel, &err)) {
            dprintf(fd, "%s\n", err.msg);
            _exit(1);
        }
        ifd_blas_info in;
        ifd_blas_info_get(&in);
        snprintf(label, sizeof label, "%s kernel %s (--blas-kernel %s)", in.library, in.kernel,
                 kernel);
    }
    dprintf(fd, "%s\n", label);
    for (size_t i = 0; i < nshapes; i++)
        dprintf(fd, "%.3f\n", measure_par(f, &shapes[i], seconds, threads));
    _exit(0);
}

typedef struct cand {
    const char *kernel, *lib;
    int xsmm; /* 1: libxsmm tiled, 2: ifd_cpu_gemm_small */
    char label[200];
    double best[NSHAPES_MAX];
    int failed;
} cand;

static void run_round(cand *c, double seconds, int threads)
{
    int p[2];
    if (pipe(p))
        return;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        child(c->kernel, c->lib, c->xsmm, p[1], seconds, threads);
    }
    close(p[1]);
    FILE *in = fdopen(p[0], "r");
    char line[512];
    if (fgets(line, sizeof line, in)) {
        line[strcspn(line, "\n")] = '\0';
        snprintf(c->label, sizeof c->label, "%.199s", line);
    }
    for (size_t i = 0; i < nshapes; i++) {
        double v;
        if (fgets(line, sizeof line, in) && sscanf(line, "%lf", &v) == 1) {
            if (v > c->best[i])
                c->best[i] = v;
        } else {
            c->failed = 1;
        }
    }
    fclose(in);
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st))
        c->failed = 1;
}

int main(int argc, char **argv)
{
    cand cands[32];
    int n = 0, reps = 3, json = 0, xsmm = 0, threads = 1;
    double seconds = 0.25;
    const char *kernels = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernels") && i + 1 < argc)
            kernels = argv[++i];
        else if (!strcmp(argv[i], "--lib") && i + 1 < argc && n < 22)
            cands[n++] = (cand){.lib = argv[++i]};
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--xsmm"))
            xsmm = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
                 atoi(argv[i + 1]) <= THREADS_MAX)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "jobs") || !strcmp(argv[i + 1], "charlm") ||
                  !strcmp(argv[i + 1], "ref"))) {
            int charlm = !strcmp(argv[++i], "charlm");
            shapes = charlm ? charlm_shapes : jobs_shapes;
            nshapes = charlm                    ? sizeof charlm_shapes / sizeof charlm_shapes[0]
                      : !strcmp(argv[i], "ref") ? 1 /* the reference product alone */
                                                : sizeof jobs_shapes / sizeof jobs_shapes[0];
        } else {
            fprintf(stderr,
                    "usage: bench_blas [--kernels K1,K2,...] [--lib PATH[:PREFIX]]... [--reps N] "
                    "[--seconds S] [--json] [--shapes jobs|charlm|ref] [--xsmm] [--threads N (1 to "
                    "%d)]\n",
                    THREADS_MAX);
            return 2;
        }
    }
    /* The linked OpenBLAS: as it picks itself, as infeedd runs it, and every kernel of a level
     * from AVX up to this CPU's. */
    static char list[256];
    if (kernels == NULL) {
        ifd_isa cpu = ifd_cpu_isa();
        snprintf(list, sizeof list, "keep,auto%s%s%s", cpu >= IFD_ISA_AVX ? ",Sandybridge" : "",
                 cpu >= IFD_ISA_AVX2 ? ",Haswell,Zen" : "",
                 cpu >= IFD_ISA_AVX512 ? ",SkylakeX,Cooperlake" : "");
        kernels = list;
    }
    char *ks = strdup(kernels);
    int nlib = n;
    cand libs[24];
    memcpy(libs, cands, sizeof(cand) * (size_t)nlib);
    n = 0;
    for (char *save, *k = strtok_r(ks, ",", &save); k && n < 8; k = strtok_r(NULL, ",", &save))
        cands[n++] = (cand){.kernel = k};
    for (int i = 0; i < nlib; i++)
        cands[n++] = libs[i];
    if (xsmm) {
#ifdef IFD_HAVE_LIBXSMM
        cands[n++] = (cand){.xsmm = 1};
#endif
        cands[n++] = (cand){.xsmm = 2};
    }

    ifd_blas_info cpu;
    ifd_blas_info_get(&cpu);
    if (threads == 1)
        printf("bench_blas: one thread, the CPU runs %s; best of %d rounds of %.2f s a cell\n",
               ifd_isa_name(cpu.cpu_isa), reps, seconds);
    else
        printf("bench_blas: %d threads at once, one sgemm each, a cell their sum; the CPU runs %s; "
               "best of %d rounds of %.2f s a cell\n",
               threads, ifd_isa_name(cpu.cpu_isa), reps, seconds);
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < n; c++)
            run_round(&cands[c], seconds, threads);

    double top[NSHAPES_MAX] = {0};
    for (int c = 0; c < n; c++)
        for (size_t i = 0; i < nshapes; i++)
            if (!cands[c].failed && cands[c].best[i] > top[i])
                top[i] = cands[c].best[i];
    if (json) {
        printf("[");
        for (int c = 0; c < n; c++) {
            printf("%s{\"label\": \"%s\", \"failed\": %s", c ? ", " : "", cands[c].label,
                   cands[c].failed ? "true" : "false");
            for (size_t i = 0; i < nshapes; i++)
                printf(", \"%s\": %.2f", shapes[i].name, cands[c].best[i]);
            printf("}");
        }
        printf("]\n");
        return 0;
    }
    for (size_t i = 0; i < nshapes; i++) {
        printf("\n%s (GFLOP/s, and the ratio to the best)\n", shapes[i].name);
        for (int c = 0; c < n; c++) {
            if (cands[c].failed)
                printf("  %-72.72s  failed\n", cands[c].label);
            else
                printf("  %-72.72s %8.1f  %5.2f\n", cands[c].label, cands[c].best[i],
                       cands[c].best[i] / top[i]);
        }
    }
    free(ks);
    return 0;
}
