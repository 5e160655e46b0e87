/*
 * ABI 4's parameters: any number of them (a list, not 8), ranks 1 to 4, initializers the
 * runtime applies (zeros, ones, normal with a std, Glorot) deterministic in (seed, parameter),
 * flags, the add-param helper's refusals, a program without init_params, and checkpoints that
 * write, read and check such parameters.
 */
#include "checkpoint/object.h"
#include "tests/util/checkpoints.h"
#include "tests/util/files.h"
#include "tests/util/program_ref.h"
#include "tests/util/testutil.h"

#include <infeed/checkpoint.h>
#include <infeed/program.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* "params4": settings.hidden parameters, settings.features picks their shapes and order (0:
 * declaration order i, else reversed), settings.classes the std of the normal ones (/ 100). Each
 * parameter i has rank 1 + i % 4, dims 1 + (i + d) % 5 (d its axis), the last axis 60 for every
 * eighth (so that some hold thousands of floats), initializer kinds in turn (zeros, ones, normal,
 * glorot) and the no-decay flag on odd i. No init_params: the runtime initialises all. */
static void spec_of(int64_t i, int *rank, int64_t dims[4], ifd_param_init *init, unsigned *flags,
                    float std)
{
    *rank = 1 + (int)(i % 4);
    for (int d = 0; d < *rank; d++)
        dims[d] = 1 + (i + d) % 5;
    if (i % 8 == 2)
        dims[*rank - 1] = 60 * 60;
    static const ifd_param_init_kind kinds[] = {IFD_INIT_ZEROS, IFD_INIT_ONES, IFD_INIT_NORMAL,
                                                IFD_INIT_GLOROT};
    init->kind = kinds[i % 4];
    init->std = std;
    *flags = i % 2 ? IFD_PARAM_NO_DECAY : 0;
}

static int params4_setup(ifd_program *p, ifd_error *err)
{
    int64_t n = p->settings.hidden;
    float std = (float)p->settings.classes / 100.0f;
    for (int64_t j = 0; j < n; j++) {
        int64_t i = p->settings.features ? n - 1 - j : j;
        int rank;
        int64_t dims[4];
        ifd_param_init init;
        unsigned flags;
        spec_of(i, &rank, dims, &init, &flags, std);
        char name[IFD_NAME_MAX];
        snprintf(name, sizeof name, "p%lld", (long long)i);
        if (ifd_program_add_param_with(p, name, rank, dims, init, flags))
            return ifd_error_set(err, IFD_EINVAL, "params4: parameter %lld", (long long)i);
    }
    return IFD_OK;
}

static const ifd_program_class params4 = {.name = "params4",
                                          .setup = params4_setup,
                                          .workspace_floats = tu_program_rows_workspace,
                                          .train_step = tu_program_no_step};

/* "noinit": one parameter without an initializer, and no init_params. */
static int noinit_setup(ifd_program *p, ifd_error *err)
{
    (void)err;
    int64_t d = 3;
    return ifd_program_add_param(p, "w", 1, &d);
}

static const ifd_program_class noinit = {.name = "noinit",
                                         .setup = noinit_setup,
                                         .workspace_floats = tu_program_rows_workspace,
                                         .train_step = tu_program_no_step};

static void register_once(void)
{
    if (ifd_program_find("params4") == NULL) {
        ck_assert_int_eq(ifd_program_register(&params4), IFD_OK);
        ck_assert_int_eq(ifd_program_register(&noinit), IFD_OK);
    }
}

static void make(ifd_program *p, int64_t n, int reversed, int64_t std100)
{
    ifd_program_settings s = {.features = reversed, .classes = std100, .hidden = n};
    ifd_error err;
    ifd_error_clear(&err);
    RASSERT(ifd_program_init(p, "params4", &s, &err) == IFD_OK, "%s", err.msg);
}

START_TEST(many_parameters_of_rank_up_to_4)
{
    register_once();
    ifd_rng rng;
    seed_rng(&rng);
    int64_t n = rand_between(&rng, 9, 60), std100 = rand_between(&rng, 1, 300);
    ifd_program p;
    make(&p, n, 0, std100);
    ck_assert_int_eq(p.nparams, n);
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const ifd_param_spec *ps = &p.params[i];
        int rank;
        int64_t dims[4], count = 1;
        ifd_param_init init;
        unsigned flags;
        spec_of(i, &rank, dims, &init, &flags, (float)std100 / 100.0f);
        char name[IFD_NAME_MAX];
        snprintf(name, sizeof name, "p%lld", (long long)i);
        ck_assert_str_eq(ps->name, name);
        ck_assert_ptr_eq(ifd_program_param(&p, name), ps);
        ck_assert_int_eq(ps->rank, rank);
        for (int d = 0; d < rank; d++) {
            ck_assert_int_eq(ps->dims[d], dims[d]);
            count *= dims[d];
        }
        ck_assert_int_eq(ps->count, count);
        ck_assert_int_eq(ps->offset, at);
        ck_assert_uint_eq(ps->flags, flags);
        ck_assert_int_eq(ps->init.kind, init.kind);
        at += count;
    }
    ck_assert_int_eq(p.nparam_floats, at);
    ifd_program_free(&p);
    ck_assert_ptr_null(p.params);
    ck_assert_int_eq(p.nparams, 0);
}
END_TEST

START_TEST(initializers_are_the_runtimes_and_deterministic_per_parameter)
{
    register_once();
    ifd_rng rng;
    seed_rng(&rng);
    int64_t n = rand_between(&rng, 12, 40), std100 = rand_between(&rng, 1, 300);
    double std = (double)std100 / 100.0;
    uint64_t seed = ifd_rng_next(&rng);
    ifd_program p, q;
    make(&p, n, 0, std100);
    make(&q, n, 1, std100); /* the same parameters, declared in the other order */
    float *a = malloc(sizeof(float) * (size_t)p.nparam_floats);
    float *b = malloc(sizeof(float) * (size_t)p.nparam_floats);
    float *c = malloc(sizeof(float) * (size_t)p.nparam_floats);
    ifd_program_init_params(&p, a, seed);
    ifd_program_init_params(&q, b, seed);
    ifd_program_init_params(&p, c, seed + 1);
    int normals_differ = 0;
    for (int i = 0; i < p.nparams; i++) {
        const ifd_param_spec *ps = &p.params[i];
        const ifd_param_spec *qs = ifd_program_param(&q, ps->name);
        const float *w = a + ps->offset;
        /* a function of (seed, parameter): the same values wherever the parameter sits */
        RASSERT(memcmp(w, b + qs->offset, sizeof(float) * (size_t)ps->count) == 0,
                "%s: other values when declared elsewhere", ps->name);
        double sum = 0, sq = 0;
        for (int64_t j = 0; j < ps->count; j++) {
            sum += w[j];
            sq += (double)w[j] * w[j];
        }
        switch (ps->init.kind) {
        case IFD_INIT_ZEROS:
        case IFD_INIT_ONES:
            for (int64_t j = 0; j < ps->count; j++)
                RASSERT(w[j] == (ps->init.kind == IFD_INIT_ONES ? 1.0f : 0.0f), "%s[%lld]: %g",
                        ps->name, (long long)j, (double)w[j]);
            break;
        case IFD_INIT_NORMAL:
            normals_differ |= memcmp(w, c + ps->offset, sizeof(float) * (size_t)ps->count) != 0;
            if (ps->count >= 1000) { /* the sample's moments, 6 standard errors */
                double m = sum / (double)ps->count, sd = sqrt(sq / (double)ps->count);
                double se = std / sqrt((double)ps->count);
                RASSERT(fabs(m) < 6 * se && fabs(sd - std) < 6 * se, "%s: mean %g, std %g of %g",
                        ps->name, m, sd, std);
            }
            break;
        case IFD_INIT_GLOROT: {
            int64_t rec = 1;
            for (int d = 0; d + 2 < ps->rank; d++)
                rec *= ps->dims[d];
            int64_t fin = ps->rank == 1 ? ps->dims[0] : rec * ps->dims[ps->rank - 2];
            int64_t fout = rec * ps->dims[ps->rank - 1];
            double lim = sqrt(6.0 / (double)(fin + fout));
            for (int64_t j = 0; j < ps->count; j++)
                RASSERT(fabs(w[j]) <= lim, "%s[%lld]: %g beyond %g", ps->name, (long long)j,
                        (double)w[j], lim);
            if (ps->count >= 1000) /* uniform: std lim / sqrt 3 */
                RASSERT(fabs(sqrt(sq / (double)ps->count) - lim / sqrt(3.0)) < 0.1 * lim,
                        "%s: std %g", ps->name, sqrt(sq / (double)ps->count));
            break;
        }
        default:
            ck_abort_msg("%s: kind %d", ps->name, ps->init.kind);
        }
    }
    ck_assert_msg(normals_differ, "another seed gave the same normal values");
    free(a), free(b), free(c);
    ifd_program_free(&p);
    ifd_program_free(&q);
}
END_TEST

static int add_rank(ifd_program *p, const char *name, int rank, int64_t dim, ifd_param_init init)
{
    int64_t dims[5] = {dim, dim, dim, dim, dim};
    return ifd_program_add_param_with(p, name, rank, dims, init, 0);
}

START_TEST(add_param_refuses_what_it_cannot_hold)
{
    register_once();
    ifd_program p;
    make(&p, 2, 0, 10);
    int64_t floats = p.nparam_floats;
    ifd_param_init zeros = {.kind = IFD_INIT_ZEROS}, bad_std = {.kind = IFD_INIT_NORMAL};
    ck_assert_int_eq(add_rank(&p, "r0", 0, 2, zeros), IFD_EINVAL);
    ck_assert_int_eq(add_rank(&p, "r5", 5, 2, zeros), IFD_EINVAL);
    ck_assert_int_eq(add_rank(&p, "d0", 2, 0, zeros), IFD_EINVAL);
    ck_assert_int_eq(add_rank(&p, "p0", 1, 2, zeros), IFD_EINVAL); /* p0 is taken */
    ck_assert_int_eq(add_rank(&p, "", 1, 2, zeros), IFD_EINVAL);
    ck_assert_int_eq(add_rank(&p, "a_name_of_thirty_two_characters_", 1, 2, zeros), IFD_EINVAL);
    ck_assert_int_eq(add_rank(&p, "s0", 1, 2, bad_std), IFD_EINVAL);
    bad_std.std = NAN;
    ck_assert_int_eq(add_rank(&p, "snan", 1, 2, bad_std), IFD_EINVAL);
    ifd_param_init kind = {.kind = (ifd_param_init_kind)99};
    ck_assert_int_eq(add_rank(&p, "k99", 1, 2, kind), IFD_EINVAL);
    ck_assert_int_eq(p.nparams, 2);
    ck_assert_int_eq(p.nparam_floats, floats);
    ck_assert_int_eq(add_rank(&p, "r4", 4, 3, zeros), IFD_OK);
    ck_assert_int_eq(p.nparam_floats, floats + 81);
    ifd_program_free(&p);
}
END_TEST

START_TEST(a_parameter_without_initializer_needs_init_params)
{
    register_once();
    ifd_program p;
    ifd_error err;
    ifd_error_clear(&err);
    ck_assert_int_eq(ifd_program_init(&p, "noinit", NULL, &err), IFD_EINVAL);
    ck_assert_str_eq(err.msg, "program 'noinit': parameter 'w' declares no initializer, and the "
                              "program has no init_params: expected one of the two");
    ck_assert_ptr_null(p.params); /* nothing held */
    ifd_program_free(&p);
}
END_TEST

START_TEST(checkpoints_hold_them)
{
    register_once();
    ifd_rng rng;
    seed_rng(&rng);
    char *dir = tu_tmp_dir("ifd-params4");
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.program = "params4";
    cfg.settings.hidden = rand_between(&rng, 9, 30);
    cfg.settings.classes = 10;
    ifd_program p;
    make(&p, cfg.settings.hidden, 0, 10);
    float *w = malloc(sizeof(float) * (size_t)p.nparam_floats);
    ifd_program_init_params(&p, w, ifd_rng_next(&rng));
    ifd_checkpoint *c = NULL, *back = NULL;
    ifd_error err;
    RASSERT(ifd_checkpoint_create(&c, &cfg, 7, 7, w, NULL, &err) == IFD_OK, "%s", err.msg);
    char path[512];
    RASSERT(ifd_checkpoint_save(c, dir, 3, path, sizeof path, &err) == IFD_OK, "%s", err.msg);
    RASSERT(ifd_checkpoint_load(path, &back, &err) == IFD_OK, "%s", err.msg);
    tu_ckpt_assert_same(c, back);
    RASSERT(ifd_checkpoint_check(back, &cfg, &err) == IFD_OK, "%s", err.msg);
    ck_assert_mem_eq(ifd_checkpoint_params(back), w, sizeof(float) * (size_t)p.nparam_floats);
    /* a parameter of rank 4 in another shape: refused, naming it and both shapes */
    ifd_param_spec *ps = &back->params_spec[3]; /* p3: rank 4, [4, 5, 1, 2] */
    ck_assert_int_eq(ps->rank, 4);
    int64_t keep = ps->dims[2];
    ps->dims[2] = 7;
    ck_assert_int_eq(ifd_checkpoint_check(back, &cfg, &err), IFD_EINVAL);
    ck_assert_str_eq(err.msg, "checkpoint: parameter 3: the checkpoint has 'p3' [4, 5, 7, 2], this "
                              "run 'p3' [4, 5, 1, 2]");
    ps->dims[2] = keep;
    cfg.settings.hidden += 1; /* one more */
    ck_assert_int_eq(ifd_checkpoint_check(back, &cfg, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "settings.hidden") != NULL, "%s", err.msg);
    ifd_checkpoint_free(c);
    ifd_checkpoint_free(back);
    free(w);
    ifd_program_free(&p);
    tu_rm_dir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("program_params");
    TCase *tc = tu_tcase(s, "params", 60);
    tcase_add_loop_test(tc, many_parameters_of_rank_up_to_4, 0, 5);
    tcase_add_loop_test(tc, initializers_are_the_runtimes_and_deterministic_per_parameter, 0, 5);
    tcase_add_test(tc, add_param_refuses_what_it_cannot_hold);
    tcase_add_test(tc, a_parameter_without_initializer_needs_init_params);
    tcase_add_loop_test(tc, checkpoints_hold_them, 0, 4);
    return tu_run_suite(s);
}
