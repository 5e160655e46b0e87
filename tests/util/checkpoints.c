#include "tests/util/checkpoints.h"
#include "device/step.h"

#include "tests/util/testutil.h"

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tu_ckpt_steps(const char *dir, int64_t *steps, int max)
{
    int n = 0;
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long s;
        char tail[32];
        if (sscanf(e->d_name, "ckpt-%lld%31s", &s, tail) == 2 &&
            strcmp(tail, IFD_CHECKPOINT_SUFFIX) == 0) {
            ck_assert_int_lt(n, max);
            steps[n++] = s;
        }
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort */
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    return n;
}

void tu_ckpt_random_config(ifd_config *cfg, ifd_rng *rng)
{
    ifd_config_defaults(cfg);
    cfg->program = rand_between(rng, 0, 1) ? "softmax" : "linear";
    cfg->settings.features = rand_between(rng, 1, 40);
    cfg->settings.classes = rand_between(rng, 2, 12);
    cfg->optimizer.kind = (ifd_optimizer_kind)rand_between(rng, 0, 3);
    cfg->optimizer.learning_rate = (float)rand_between(rng, 1, 1000) / 1000.0f;
    /* the optimizer features, as a valid config has them */
    ifd_optimizer *o = &cfg->optimizer;
    o->weight_decay = (float)rand_between(rng, 0, 1000) / 7000.0f;
    o->clip_norm = rand_between(rng, 0, 1) ? 0.0f : (float)rand_between(rng, 1, 1000) / 300.0f;
    o->lr_schedule = (ifd_lr_schedule)rand_between(rng, 0, 2);
    o->warmup_steps = rand_between(rng, 0, 1) ? 0 : rand_between(rng, 1, INT64_C(1) << 40);
    if (o->lr_schedule != IFD_LR_CONSTANT) {
        o->decay_steps = o->warmup_steps + rand_between(rng, 1, INT64_C(1) << 40);
        o->min_learning_rate = o->learning_rate * (float)rand_between(rng, 0, 1000) / 1000.0f;
    }
    cfg->steps = 1;
}

static float rand_float(ifd_rng *rng)
{
    return (float)((double)ifd_rng_below(rng, 1u << 24) / (double)(1u << 23) - 1.0);
}

ifd_checkpoint *tu_ckpt_random(const ifd_config *cfg, ifd_rng *rng)
{
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, cfg->program, &cfg->settings, &err), IFD_OK);
    int64_t n = p.nparam_floats, ns = n * ifd_optimizer_slots(cfg->optimizer.kind);
    float *params = malloc(sizeof(float) * (size_t)n),
          *slots = malloc(sizeof(float) * (size_t)(ns + 1));
    for (int64_t i = 0; i < n; i++)
        params[i] = rand_float(rng);
    for (int64_t i = 0; i < ns; i++)
        slots[i] = rand_float(rng);
    ifd_checkpoint *c;
    int rc = ifd_checkpoint_create(&c, cfg, rand_between(rng, 0, INT64_C(1) << 40),
                                   rand_between(rng, 0, 1 << 30), params, slots, &err);
    ck_assert_msg(rc == IFD_OK, "%s", err.msg);
    /* a third of them of several hosts, each with its own producers */
    int hosts = rand_between(rng, 0, 2) == 0 ? (int)rand_between(rng, 2, 5) : 1;
    ck_assert_int_eq(ifd_checkpoint_set_hosts(c, hosts, &err), IFD_OK);
    for (int h = 0; h < hosts; h++) {
        ck_assert_int_eq(ifd_checkpoint_select_host(c, h, &err), IFD_OK);
        int np = (int)rand_between(rng, 0, 12);
        for (int i = 0; i < np; i++) {
            char name[IFD_CHECKPOINT_NAME_MAX + 1];
            int len = (int)rand_between(rng, 1, IFD_CHECKPOINT_NAME_MAX);
            for (int j = 0; j < len; j++)
                name[j] = (char)rand_between(rng, 'a', 'z');
            name[len] = '\0';
            ck_assert_int_eq(
                ifd_checkpoint_set_producer(c, name, rand_between(rng, 0, INT64_MAX), &err),
                IFD_OK);
        }
    }
    ck_assert_int_eq(ifd_checkpoint_select_host(c, hosts, &err), IFD_EINVAL);
    ck_assert_int_eq(ifd_checkpoint_select_host(c, 0, &err), IFD_OK);
    free(params);
    free(slots);
    ifd_program_free(&p);
    return c;
}

void tu_ckpt_assert_same(const ifd_checkpoint *a, const ifd_checkpoint *b)
{
    ck_assert_str_eq(ifd_checkpoint_program(a), ifd_checkpoint_program(b));
    ck_assert_int_eq(ifd_checkpoint_global_step(a), ifd_checkpoint_global_step(b));
    ck_assert_int_eq(ifd_checkpoint_opt_step(a), ifd_checkpoint_opt_step(b));
    ck_assert_mem_eq(ifd_checkpoint_settings(a), ifd_checkpoint_settings(b),
                     sizeof(ifd_program_settings));
    const ifd_optimizer *oa = ifd_checkpoint_optimizer(a), *ob = ifd_checkpoint_optimizer(b);
    ck_assert_int_eq(oa->kind, ob->kind);
    ck_assert_float_eq(oa->learning_rate, ob->learning_rate);
    ck_assert_float_eq(oa->weight_decay, ob->weight_decay);
    ck_assert_float_eq(oa->clip_norm, ob->clip_norm);
    ck_assert_int_eq(oa->lr_schedule, ob->lr_schedule);
    ck_assert_int_eq(oa->warmup_steps, ob->warmup_steps);
    ck_assert_int_eq(oa->decay_steps, ob->decay_steps);
    ck_assert_float_eq(oa->min_learning_rate, ob->min_learning_rate);
    int64_t n = ifd_checkpoint_nparam_floats(a);
    ck_assert_int_eq(n, ifd_checkpoint_nparam_floats(b));
    ck_assert_int_eq(ifd_checkpoint_slot_count(a), ifd_checkpoint_slot_count(b));
    ck_assert_mem_eq(ifd_checkpoint_params(a), ifd_checkpoint_params(b), sizeof(float) * (size_t)n);
    if (ifd_checkpoint_slot_count(a))
        ck_assert_mem_eq(ifd_checkpoint_slots(a), ifd_checkpoint_slots(b),
                         sizeof(float) * (size_t)n * (size_t)ifd_checkpoint_slot_count(a));
    /* every host's producers (the selection is put back to host 0) */
    ck_assert_int_eq(ifd_checkpoint_hosts(a), ifd_checkpoint_hosts(b));
    ifd_checkpoint *ma = (ifd_checkpoint *)a, *mb = (ifd_checkpoint *)b;
    ifd_error err;
    for (int h = ifd_checkpoint_hosts(a) - 1; h >= 0; h--) {
        ck_assert_int_eq(ifd_checkpoint_select_host(ma, h, &err), IFD_OK);
        ck_assert_int_eq(ifd_checkpoint_select_host(mb, h, &err), IFD_OK);
        ck_assert_int_eq(ifd_checkpoint_producer_count(a), ifd_checkpoint_producer_count(b));
        for (int i = 0; i < ifd_checkpoint_producer_count(a); i++) {
            ck_assert_str_eq(ifd_checkpoint_producer_name(a, i),
                             ifd_checkpoint_producer_name(b, i));
            ck_assert_int_eq(ifd_checkpoint_producer_seq(a, i), ifd_checkpoint_producer_seq(b, i));
        }
    }
}
