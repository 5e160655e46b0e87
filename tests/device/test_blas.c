/* The BLAS kernel (device/cpu/blas.c): which kernels are fallbacks on which CPU, the best one for
 * a CPU, and the process's choice: auto never leaves a fallback on a CPU with AVX2 or more, keep
 * leaves the library's pick, a name is obeyed or refused with a sentence, the choice is made
 * once, and products are right after a switch. Each test runs in its own process (Check's fork
 * mode), so each makes the process's first choice. */
#include "core/rng.h"
#include "device/cpu/blas.h"
#include "device/ops_gemm_cpu.h"
#include "tests/util/testutil.h"

#include <cblas.h>
#include <check.h>
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

char *openblas_get_corename(void);

START_TEST(test_kernel_levels)
{
    static const struct {
        const char *name;
        ifd_isa isa;
    } cases[] = {
        {"Prescott", IFD_ISA_SSE},     {"prescott", IFD_ISA_SSE},    {"Nehalem", IFD_ISA_SSE},
        {"Core2", IFD_ISA_SSE},        {"Barcelona", IFD_ISA_SSE},   {"Sandybridge", IFD_ISA_AVX},
        {"PILEDRIVER", IFD_ISA_AVX},   {"Haswell", IFD_ISA_AVX2},    {"zen", IFD_ISA_AVX2},
        {"Excavator", IFD_ISA_AVX2},   {"SkylakeX", IFD_ISA_AVX512}, {"cooperlake", IFD_ISA_AVX512},
        {"Bogus", IFD_ISA_UNKNOWN},    {"", IFD_ISA_UNKNOWN},        {"Skylake", IFD_ISA_UNKNOWN},
        {"Haswell ", IFD_ISA_UNKNOWN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(ifd_blas_kernel_isa(cases[i].name) == cases[i].isa, "%s: %d, expected %d",
                      cases[i].name, ifd_blas_kernel_isa(cases[i].name), cases[i].isa);
    ck_assert_int_eq(ifd_blas_kernel_isa(NULL), IFD_ISA_UNKNOWN);
}
END_TEST

START_TEST(test_fallback_rule)
{
    static const struct {
        const char *kernel;
        ifd_isa cpu;
        int fallback;
    } cases[] = {
        {"Prescott", IFD_ISA_AVX512, 1}, /* the case: 0.3.21 on an Emerald Rapids */
        {"Prescott", IFD_ISA_AVX2, 1},    {"Nehalem", IFD_ISA_AVX, 1},
        {"Haswell", IFD_ISA_AVX512, 1},   {"Sandybridge", IFD_ISA_AVX2, 1},
        {"SkylakeX", IFD_ISA_AVX512, 0},  {"Cooperlake", IFD_ISA_AVX512, 0},
        {"Haswell", IFD_ISA_AVX2, 0},     {"Zen", IFD_ISA_AVX2, 0},
        {"Sandybridge", IFD_ISA_AVX, 0},  {"Prescott", IFD_ISA_SSE, 0},
        {"Nehalem", IFD_ISA_SSE, 0},      {"Bogus", IFD_ISA_AVX512, 0},
        {"Prescott", IFD_ISA_UNKNOWN, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(ifd_blas_is_fallback(cases[i].kernel, cases[i].cpu) == cases[i].fallback,
                      "%s on %s: expected fallback %d", cases[i].kernel, ifd_isa_name(cases[i].cpu),
                      cases[i].fallback);
}
END_TEST

START_TEST(test_best_kernel)
{
    ck_assert_str_eq(ifd_blas_best_kernel(IFD_ISA_AVX512, 0), "SkylakeX");
    ck_assert_str_eq(ifd_blas_best_kernel(IFD_ISA_AVX512, 1), "SkylakeX");
    ck_assert_str_eq(ifd_blas_best_kernel(IFD_ISA_AVX2, 0), "Haswell");
    ck_assert_str_eq(ifd_blas_best_kernel(IFD_ISA_AVX2, 1), "Zen");
    ck_assert_str_eq(ifd_blas_best_kernel(IFD_ISA_AVX, 0), "Sandybridge");
    ck_assert_ptr_null(ifd_blas_best_kernel(IFD_ISA_SSE, 0));
    /* the best kernel for a level is never a fallback at that level */
    for (int isa = IFD_ISA_AVX; isa <= IFD_ISA_AVX512; isa++)
        for (int amd = 0; amd < 2; amd++)
            ck_assert(!ifd_blas_is_fallback(ifd_blas_best_kernel((ifd_isa)isa, amd), isa));
}
END_TEST

/* A random product through cblas_sgemm against a double-precision reference: the kernel the
 * process switched to computes what it should. */
static void check_products(ifd_rng *rng)
{
    openblas_set_num_threads(1); /* as the backend runs it: its threads are not built with TSan */
    for (int trial = 0; trial < 6; trial++) {
        int m = (int)rand_between(rng, 1, 70), n = (int)rand_between(rng, 1, 70),
            k = (int)rand_between(rng, 1, 300);
        float *a = malloc(sizeof(float) * (size_t)(m * k)),
              *b = malloc(sizeof(float) * (size_t)(k * n)),
              *c = malloc(sizeof(float) * (size_t)(m * n));
        for (int i = 0; i < m * k; i++)
            a[i] = (float)(ifd_rng_uniform(rng) * 2.0 - 1.0);
        for (int i = 0; i < k * n; i++)
            b[i] = (float)(ifd_rng_uniform(rng) * 2.0 - 1.0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c,
                    n);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double ref = 0;
                for (int l = 0; l < k; l++)
                    ref += (double)a[i * k + l] * (double)b[l * n + j];
                RASSERT(fabs(c[i * n + j] - ref) <= 1e-4 * (1 + fabs(ref)),
                        "%dx%dx%d [%d,%d]: %g, expected %g (kernel %s)", m, n, k, i, j,
                        (double)c[i * n + j], ref, openblas_get_corename());
            }
        free(a);
        free(b);
        free(c);
    }
}

START_TEST(test_auto_leaves_no_fallback)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error err;
    ifd_blas_info before, in;
    ifd_blas_info_get(&before);
    ck_assert_str_eq(before.kernel, openblas_get_corename());
    ck_assert_int_eq(ifd_blas_select(rand_between(&rng, 0, 1) ? "auto" : NULL, &err), IFD_OK);
    ifd_blas_info_get(&in);
    ck_assert_int_eq(in.cpu_isa, ifd_cpu_isa());
    ck_assert_str_eq(in.kernel, openblas_get_corename());
    ck_assert_str_eq(in.picked, before.kernel);
    if (in.switchable && getenv("OPENBLAS_CORETYPE") == NULL) {
        /* the test the issue asks for: a generic fallback on a CPU with AVX2 fails it */
        ck_assert_msg(!ifd_blas_is_fallback(in.kernel, in.cpu_isa),
                      "kernel %s is a fallback on this %s CPU", in.kernel,
                      ifd_isa_name(in.cpu_isa));
        if (in.cpu_isa >= IFD_ISA_AVX2)
            ck_assert_msg(ifd_blas_kernel_isa(in.kernel) >= IFD_ISA_AVX2,
                          "kernel %s (%s) on a CPU with %s", in.kernel,
                          ifd_isa_name(ifd_blas_kernel_isa(in.kernel)), ifd_isa_name(in.cpu_isa));
        ck_assert_str_eq(in.how,
                         ifd_blas_is_fallback(in.picked, in.cpu_isa) ? "corrected" : "detected");
    }
    char line[256], small[96];
    ck_assert_ptr_nonnull(strstr(ifd_blas_describe(&in, line, sizeof line), in.kernel));
    /* the line ends with the library of the attention's small products */
    snprintf(small, sizeof small, "; small products: %s", ifd_cpu_gemm_small_library());
    ck_assert_msg(strlen(line) > strlen(small) &&
                      strcmp(line + strlen(line) - strlen(small), small) == 0,
                  "'%s' does not end with '%s'", line, small);
    check_products(&rng);
    /* made once: auto and keep again change nothing */
    ck_assert_int_eq(ifd_blas_select("keep", &err), IFD_OK);
    ck_assert_int_eq(ifd_blas_select("AUTO", &err), IFD_OK);
    ck_assert_str_eq(openblas_get_corename(), in.kernel);
}
END_TEST

START_TEST(test_keep_leaves_the_pick)
{
    ifd_error err;
    char picked[32];
    snprintf(picked, sizeof picked, "%s", openblas_get_corename());
    ck_assert_int_eq(ifd_blas_select("keep", &err), IFD_OK);
    ifd_blas_info in;
    ifd_blas_info_get(&in);
    ck_assert_str_eq(in.kernel, picked);
    ck_assert_str_eq(openblas_get_corename(), picked);
    ck_assert_str_eq(in.how, ifd_blas_is_fallback(picked, in.cpu_isa)       ? "keep"
                             : in.switchable && getenv("OPENBLAS_CORETYPE") ? "OPENBLAS_CORETYPE"
                             : in.switchable                                ? "detected"
                                                                            : "fixed");
}
END_TEST

/* Kernels this CPU runs, AVX and above (the ones worth asking for). */
static int runnable(const char **out)
{
    static const char *all[] = {"Sandybridge", "Haswell", "Zen", "SkylakeX"};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (ifd_blas_kernel_isa(all[i]) <= ifd_cpu_isa())
            out[n++] = all[i];
    return n;
}

START_TEST(test_named_kernel_is_obeyed_once)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_blas_info in;
    ifd_blas_info_get(&in);
    const char *names[4];
    int n = runnable(names);
    if (!in.switchable || n < 2)
        return; /* nothing to switch between here (a CPU without AVX, a fixed library) */
    int pick = (int)rand_between(&rng, 0, n - 1);
    char want[32];
    snprintf(want, sizeof want, "%s", names[pick]);
    for (char *c = want; *c; c++) /* names are case-insensitive */
        if (rand_between(&rng, 0, 1))
            *c = (char)(isupper((unsigned char)*c) ? tolower((unsigned char)*c)
                                                   : toupper((unsigned char)*c));
    ifd_error err;
    RASSERT(ifd_blas_select(want, &err) == IFD_OK, "%s: %s", want, err.msg);
    ifd_blas_info_get(&in);
    RASSERT(strcasecmp(in.kernel, want) == 0 && strcasecmp(openblas_get_corename(), want) == 0,
            "asked %s, runs %s", want, openblas_get_corename());
    ck_assert_str_eq(in.how, "blas_kernel");
    check_products(&rng);
    /* another name later is refused: the kernel is process-wide */
    const char *other = names[(pick + 1 + (int)rand_between(&rng, 0, n - 2)) % n];
    ck_assert_int_eq(ifd_blas_select(other, &err), IFD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "blas_kernel"));
    ck_assert_ptr_nonnull(strstr(err.msg, "already runs"));
    ck_assert_ptr_nonnull(strstr(err.msg, other));
    ck_assert(strcasecmp(openblas_get_corename(), want) == 0);
    ck_assert_int_eq(ifd_blas_select(want, &err), IFD_OK);
    ck_assert_int_eq(ifd_blas_select("auto", &err), IFD_OK);
}
END_TEST

START_TEST(test_bad_requests_are_refused)
{
    ifd_error err;
    char picked[32];
    snprintf(picked, sizeof picked, "%s", openblas_get_corename());
    static const char *bad[] = {"Bogus", "Skylake", "haswell2", "auto ", "-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(ifd_blas_check(bad[i], &err), IFD_EINVAL);
        ck_assert_int_eq(ifd_blas_select(bad[i], &err), IFD_EINVAL);
        ck_assert_msg(strstr(err.msg, "blas_kernel: expected auto, keep or an OpenBLAS kernel"),
                      "%s", err.msg);
        ck_assert_ptr_nonnull(strstr(err.msg, bad[i]));
        ck_assert_ptr_nonnull(strstr(err.msg, "SkylakeX"));
    }
    ck_assert_str_eq(openblas_get_corename(), picked); /* nothing was chosen or switched */
    /* a kernel above the CPU's level */
    if (ifd_cpu_isa() < IFD_ISA_AVX512) {
        ck_assert_int_eq(ifd_blas_select("SkylakeX", &err), IFD_EINVAL);
        ck_assert_ptr_nonnull(strstr(err.msg, "needs AVX-512"));
    }
    /* the config validation says the same */
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    ck_assert_str_eq(cfg.blas_kernel, "auto");
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 4, 3, 8, 2, 1);
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_OK);
    cfg.blas_kernel = "Bogus";
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "blas_kernel: expected"), "%s", err.msg);
    cfg.backend = "cuda"; /* the cuda backend runs no BLAS of the cpu's */
    if (ifd_config_validate(&cfg, &err))
        ck_assert_msg(!strstr(err.msg, "blas_kernel"), "%s", err.msg);
}
END_TEST

/* A name the library does not have (OpenBLAS 0.3.21 has no SapphireRapids): refused, and the
 * kernel is put back, so a later auto still chooses. */
START_TEST(test_a_kernel_the_library_lacks)
{
    ifd_blas_info in;
    ifd_blas_info_get(&in);
    if (!in.switchable || in.cpu_isa < IFD_ISA_AVX512)
        return;
    ifd_error err;
    char picked[32];
    snprintf(picked, sizeof picked, "%s", openblas_get_corename());
    int rc = ifd_blas_select("SapphireRapids", &err);
    if (rc == IFD_OK) { /* a newer library has it */
        ck_assert_str_eq(openblas_get_corename(), "SapphireRapids");
        return;
    }
    ck_assert_int_eq(rc, IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "has no kernel 'SapphireRapids'"), "%s", err.msg);
    ck_assert_str_eq(openblas_get_corename(), picked);
    ck_assert_int_eq(ifd_blas_select("auto", &err), IFD_OK);
    ifd_blas_info_get(&in);
    if (getenv("OPENBLAS_CORETYPE") == NULL) /* auto obeys the variable when it is set */
        ck_assert(!ifd_blas_is_fallback(in.kernel, in.cpu_isa));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("blas");
    TCase *tc = tcase_create("blas");
    tcase_add_test(tc, test_kernel_levels);
    tcase_add_test(tc, test_fallback_rule);
    tcase_add_test(tc, test_best_kernel);
    tcase_add_loop_test(tc, test_auto_leaves_no_fallback, 0, 2);
    tcase_add_test(tc, test_keep_leaves_the_pick);
    tcase_add_loop_test(tc, test_named_kernel_is_obeyed_once, 0, 3);
    tcase_add_test(tc, test_bad_requests_are_refused);
    tcase_add_test(tc, test_a_kernel_the_library_lacks);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
