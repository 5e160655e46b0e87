/*
 * bench_blas: single-thread sgemm GFLOP/s on the products infeedd's jobs run, for each OpenBLAS
 * kernel this CPU can run (the linked OpenBLAS, switched as --blas-kernel would), beside other
 * BLAS libraries given with --lib, side by side in one run (bench/README.md).
 *
 *   bench_blas [--kernels auto,keep,Haswell,...] [--lib PATH[:PREFIX]]... [--reps N] [--json]
 *
 * Each kernel is measured in a child process of its own (the kernel is process-wide and chosen
 * once); each other library is dlopen'ed in a child with RTLD_DEEPBIND, so its symbols do not
 * mix with the linked OpenBLAS's; PREFIX is its symbol prefix (scipy-openblas32 names its
 * functions scipy_cblas_sgemm). The rounds alternate between the candidates and each cell is the
 * best of --reps rounds, so a noisy neighbour slows every candidate alike.
 */
#include "core/thread.h"
#include "device/cpu/blas.h"

#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

char *openblas_get_corename(void);

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);

/* The products of bench/peers.py's jobs (row-major, as device/ops_gemm_cpu.c calls them), and the
 * issue's reference product. */
static const struct shape {
    const char *name;
    int ta, m, n, k;
} shapes[] = {
    {"ref 1024x784x128", 0, 1024, 128, 784},    {"mlp32 fwd 32x784x128", 0, 32, 128, 784},
    {"mlp32 dW 784x32x128", 1, 784, 128, 32},   {"mlp1024 dW 784x1024x128", 1, 784, 128, 1024},
    {"mlp 10x128 fwd b1024", 0, 1024, 10, 128},
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

static double measure(sgemm_fn f, const struct shape *s, double seconds)
{
    size_t asz = (size_t)s->m * (size_t)s->k, bsz = (size_t)s->k * (size_t)s->n;
    float *a = malloc(sizeof(float) * asz), *b = malloc(sizeof(float) * bsz),
          *c = calloc((size_t)s->m * (size_t)s->n, sizeof(float));
    for (size_t i = 0; i < asz; i++)
        a[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < bsz; i++)
        b[i] = (float)((i * 5) % 11) * 0.01f;
    int lda = s->ta ? s->m : s->k;
    f(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, CblasNoTrans, s->m, s->n, s->k, 1.0f, a,
      lda, b, s->n, 0.0f, c, s->n);
    int64_t t0 = ifd_clock_ns(), calls = 0, t;
    do {
        for (int i = 0; i < 8; i++)
            f(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, CblasNoTrans, s->m, s->n, s->k,
              1.0f, a, lda, b, s->n, 0.0f, c, s->n);
        calls += 8;
        t = ifd_clock_ns();
    } while ((double)(t - t0) * 1e-9 < seconds);
    free(a);
    free(b);
    free(c);
    return 2.0 * s->m * s->n * (double)s->k * (double)calls / ((double)(t - t0) * 1e-9) * 1e-9;
}

/* One candidate in a child: its name on the first line, then one GFLOP/s a shape. */
static void child(const char *kernel, const char *lib, int fd, double seconds)
{
    sgemm_fn f = (sgemm_fn)cblas_sgemm;
    char label[160];
    if (lib) {
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
    for (size_t i = 0; i < NSHAPES; i++)
        dprintf(fd, "%.3f\n", measure(f, &shapes[i], seconds));
    _exit(0);
}

typedef struct cand {
    const char *kernel, *lib;
    char label[200];
    double best[NSHAPES];
    int failed;
} cand;

static void run_round(cand *c, double seconds)
{
    int p[2];
    if (pipe(p))
        return;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        child(c->kernel, c->lib, p[1], seconds);
    }
    close(p[1]);
    FILE *in = fdopen(p[0], "r");
    char line[512];
    if (fgets(line, sizeof line, in)) {
        line[strcspn(line, "\n")] = '\0';
        snprintf(c->label, sizeof c->label, "%.199s", line);
    }
    for (size_t i = 0; i < NSHAPES; i++) {
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
    int n = 0, reps = 3, json = 0;
    double seconds = 0.25;
    const char *kernels = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernels") && i + 1 < argc)
            kernels = argv[++i];
        else if (!strcmp(argv[i], "--lib") && i + 1 < argc && n < 24)
            cands[n++] = (cand){.lib = argv[++i]};
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr,
                    "usage: bench_blas [--kernels K1,K2,...] [--lib PATH[:PREFIX]]... [--reps N] "
                    "[--seconds S] [--json]\n");
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

    ifd_blas_info cpu;
    ifd_blas_info_get(&cpu);
    printf("bench_blas: one thread, the CPU runs %s; best of %d rounds of %.2f s a cell\n",
           ifd_isa_name(cpu.cpu_isa), reps, seconds);
    for (int r = 0; r < reps; r++)
        for (int c = 0; c < n; c++)
            run_round(&cands[c], seconds);

    double top[NSHAPES] = {0};
    for (int c = 0; c < n; c++)
        for (size_t i = 0; i < NSHAPES; i++)
            if (!cands[c].failed && cands[c].best[i] > top[i])
                top[i] = cands[c].best[i];
    if (json) {
        printf("[");
        for (int c = 0; c < n; c++) {
            printf("%s{\"label\": \"%s\", \"failed\": %s", c ? ", " : "", cands[c].label,
                   cands[c].failed ? "true" : "false");
            for (size_t i = 0; i < NSHAPES; i++)
                printf(", \"%s\": %.2f", shapes[i].name, cands[c].best[i]);
            printf("}");
        }
        printf("]\n");
        return 0;
    }
    for (size_t i = 0; i < NSHAPES; i++) {
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
