/* The checkpoint hook and resuming from a checkpoint: when the hook writes and what it keeps, a
 * resumed run that ends with the bits of an uninterrupted one, a session refusing a checkpoint
 * that does not fit, and the checkpoints written (or not) when the input ends, a step is dropped
 * or the run fails. */
#include "tests/util/testutil.h"

#include <infeed/checkpoint.h>
#include "checkpoint/object.h" /* tests set a checkpoint's step in place */
#include "tests/util/checkpoints.h"
#include "tests/util/files.h"
#include "tests/util/numbers.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct positions {
    int calls;
} positions;

static int add_positions(void *arg, ifd_checkpoint *c, ifd_error *err)
{
    positions *p = arg;
    p->calls++;
    return ifd_checkpoint_set_producer(c, "loader-0", 100 + ifd_checkpoint_global_step(c), err);
}

/* Checkpoints at the first loop end at or past each multiple of every, and at the end; keep
 * the newest keep. */
START_TEST(hook_schedule)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int iter = 0; iter < 4; iter++) {
        int64_t ipl = rand_between(&rng, 1, 7), every = rand_between(&rng, 0, 12),
                steps = rand_between(&rng, 1, 40);
        int keep = (int)rand_between(&rng, 1, 4);
        ifd_config cfg;
        tu_config_train(&cfg, "softmax", IFD_OPT_MOMENTUM, 3, 2, 4, ipl, 7);
        cfg.steps = steps;
        tu_batch **bs = tu_batches_random(&cfg, steps, 11);
        char *dir = tu_tmp_dir("ifd-ckpt-test");
        positions pos = {0};
        ifd_checkpoint_options o = {.dir = dir,
                                    .every = every,
                                    .keep = keep,
                                    .positions = add_positions,
                                    .positions_arg = &pos};
        ifd_hook h;
        ifd_error err;
        ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
        tu_result res;
        tu_run_hooks(&cfg, bs, steps, &h, 1, &res);
        RASSERT(res.rc == IFD_OK && res.global_step == steps, "run: %s", res.err.msg);
        /* what the schedule says */
        int64_t want[64];
        int nwant = 0;
        for (int64_t gs = 0, prev = 0; gs < steps; prev = gs) {
            gs = gs + ipl < steps ? gs + ipl : steps;
            if (every > 0 && gs / every > prev / every)
                want[nwant++] = gs;
        }
        if (nwant == 0 || want[nwant - 1] != steps)
            want[nwant++] = steps;
        RASSERT(pos.calls == nwant, "ipl %lld every %lld steps %lld: %d checkpoints, expected %d",
                (long long)ipl, (long long)every, (long long)steps, pos.calls, nwant);
        int64_t got[64];
        int ngot = tu_ckpt_steps(dir, got, 64);
        int nkept = nwant < keep ? nwant : keep;
        RASSERT(ngot == nkept, "kept %d, expected %d", ngot, nkept);
        for (int i = 0; i < ngot; i++)
            RASSERT(got[i] == want[nwant - nkept + i], "kept step %lld, expected %lld",
                    (long long)got[i], (long long)want[nwant - nkept + i]);
        /* the last one is the run's end state */
        char path[512];
        ck_assert_int_eq(ifd_checkpoint_latest(dir, path, sizeof path, &err), IFD_OK);
        ifd_checkpoint *c;
        ck_assert_int_eq(ifd_checkpoint_load(path, &c, &err), IFD_OK);
        ck_assert_int_eq(ifd_checkpoint_global_step(c), steps);
        ck_assert_int_eq(ifd_checkpoint_opt_step(c), steps);
        ck_assert_mem_eq(ifd_checkpoint_params(c), res.params, sizeof(float) * (size_t)res.nparams);
        int64_t seq;
        ck_assert_int_eq(ifd_checkpoint_find_producer(c, "loader-0", &seq), IFD_OK);
        ck_assert_int_eq(seq, 100 + steps);
        ifd_checkpoint_free(c);
        tu_result_free(&res);
        tu_batches_free(bs, steps);
        tu_rm_dir(dir);
    }
}
END_TEST

/* Interrupted at a checkpoint and resumed from it, a run ends with the same bits as one that
 * was not: the parameters, the optimizer slots and its update count, the global step. AdamW
 * runs with clipping, a cosine schedule that warms up and decays across the cut, and a bias
 * left out of decay. */
START_TEST(resume_equals_uninterrupted)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_optimizer_kind kind = (ifd_optimizer_kind)_i;
    int replicas = (int)rand_between(&rng, 1, 3);
    int64_t total = rand_between(&rng, 6, 30), cut = rand_between(&rng, 1, total - 1);
    ifd_config cfg;
    const char *prog = rand_between(&rng, 0, 1) ? "softmax" : "linear";
    tu_config_train(&cfg, kind == IFD_OPT_ADAMW ? "softmax-nodecay" : prog, kind,
                    rand_between(&rng, 1, 6), rand_between(&rng, 2, 5), 2 * replicas * 3,
                    rand_between(&rng, 1, 5), 3);
    if (kind == IFD_OPT_ADAMW) {
        ifd_optimizer *o = &cfg.optimizer;
        o->learning_rate = 0.05f;
        o->weight_decay = (float)tu_urand(&rng, 0.01, 0.3);
        o->clip_norm = (float)tu_urand(&rng, 0.05, 1.0);
        o->lr_schedule = IFD_LR_COSINE;
        o->warmup_steps = rand_between(&rng, 0, cut);
        o->decay_steps = rand_between(&rng, o->warmup_steps + 1, total + 5);
        o->min_learning_rate = o->learning_rate * (float)tu_urand(&rng, 0.0, 0.5);
    }
    cfg.replicas = replicas;
    cfg.steps = 0;
    cfg.last_step = total;
    tu_batch **bs = tu_batches_random(&cfg, total, 5);
    tu_result full;
    tu_run(&cfg, bs, total, &full);
    RASSERT(full.rc == IFD_OK && full.global_step == total, "%s", full.err.msg);

    /* the first part ends at cut with a checkpoint */
    char *dir = tu_tmp_dir("ifd-ckpt-test");
    ifd_checkpoint_options o = {.dir = dir, .every = 0, .keep = 1};
    ifd_hook h;
    ifd_error err;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    ifd_config first = cfg;
    first.last_step = cut;
    tu_result a;
    tu_run_hooks(&first, bs, cut, &h, 1, &a);
    RASSERT(a.rc == IFD_OK && a.global_step == cut, "%s", a.err.msg);
    char path[512];
    ck_assert_int_eq(ifd_checkpoint_latest(dir, path, sizeof path, &err), IFD_OK);
    ifd_checkpoint *c;
    ck_assert_int_eq(ifd_checkpoint_load(path, &c, &err), IFD_OK);
    ck_assert_int_eq(ifd_checkpoint_global_step(c), cut);

    /* the rest from the checkpoint, with steps counting from it */
    ifd_config second = cfg;
    second.last_step = 0;
    second.steps = total - cut;
    second.restore = c;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    tu_result b;
    tu_run_hooks(&second, bs + cut, total - cut, &h, 1, &b);
    RASSERT(b.rc == IFD_OK && b.global_step == total, "%s", b.err.msg);
    RASSERT(memcmp(b.params, full.params, sizeof(float) * (size_t)full.nparams) == 0,
            "%s, %d replicas, cut at %lld of %lld: resumed params differ (max rel diff %g)",
            ifd_optimizer_name(kind), replicas, (long long)cut, (long long)total,
            tu_max_rel_diff(b.params, full.params, full.nparams, 1e-6));
    ck_assert(b.mirrors_identical);
    /* the final checkpoint has the slots an uninterrupted run would have: compare to a run
     * that checkpoints at its end */
    ifd_checkpoint *end, *ref;
    ck_assert_int_eq(ifd_checkpoint_latest(dir, path, sizeof path, &err), IFD_OK);
    ck_assert_int_eq(ifd_checkpoint_load(path, &end, &err), IFD_OK);
    ck_assert_int_eq(ifd_checkpoint_global_step(end), total);
    ck_assert_int_eq(ifd_checkpoint_opt_step(end), total);
    char *dir2 = tu_tmp_dir("ifd-ckpt-test");
    o.dir = dir2;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    tu_result again;
    tu_run_hooks(&cfg, bs, total, &h, 1, &again);
    ck_assert_int_eq(ifd_checkpoint_latest(dir2, path, sizeof path, &err), IFD_OK);
    ck_assert_int_eq(ifd_checkpoint_load(path, &ref, &err), IFD_OK);
    tu_ckpt_assert_same(end, ref);
    /* the end summary counts the steps of this run */
    json_t *last = json_loads(b.summaries[b.nsummaries - 1], 0, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(last, "event")), "end");
    ck_assert_int_eq(json_integer_value(json_object_get(last, "global_step")), total);
    ck_assert_int_eq(json_integer_value(json_object_get(last, "steps")), total - cut);
    json_decref(last);
    ifd_checkpoint_free(c);
    ifd_checkpoint_free(end);
    ifd_checkpoint_free(ref);
    tu_result_free(&full);
    tu_result_free(&a);
    tu_result_free(&b);
    tu_result_free(&again);
    tu_batches_free(bs, total);
    tu_rm_dir(dir);
    tu_rm_dir(dir2);
}
END_TEST

/* A session refuses a checkpoint that does not fit, before it opens anything. */
START_TEST(session_refuses_a_misfit)
{
    ifd_config cfg;
    tu_config_train(&cfg, "softmax", IFD_OPT_SGD, 4, 3, 4, 2, 1);
    ifd_checkpoint *c;
    ifd_error err;
    ck_assert_int_eq(ifd_checkpoint_create(&c, &cfg, 10, 10, NULL, NULL, &err), IFD_OK);
    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create(&q, 1), IFD_OK);
    ifd_session *s = NULL;
    ifd_config other = cfg;
    other.settings.features = 5;
    other.restore = c;
    ck_assert_int_eq(ifd_session_create(&s, &other, ifd_batch_queue_source(q), &err), IFD_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(err.msg, "settings.features"), "%s", err.msg);
    other = cfg;
    other.restore = c;
    other.initial_global_step = 3;
    ck_assert_int_eq(ifd_session_create(&s, &other, ifd_batch_queue_source(q), &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "initial_global_step"), "%s", err.msg);
    other.initial_global_step = 10;
    ck_assert_int_eq(ifd_session_create(&s, &other, ifd_batch_queue_source(q), &err), IFD_OK);
    ck_assert_int_eq(ifd_session_global_step(s), 10);
    ifd_session_destroy(s);
    ifd_batch_queue_destroy(q);
    ifd_checkpoint_free(c);
}
END_TEST

/* A run whose input ends early (or that is stopped) writes its state at the end all the same,
 * unless it ran no step. */
START_TEST(end_checkpoint_when_the_input_ends)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t have = rand_between(&rng, 0, 12);
    ifd_config cfg;
    tu_config_train(&cfg, "linear", IFD_OPT_ADAM, 3, 2, 4, 5, 1);
    cfg.steps = 100;
    tu_batch **bs = tu_batches_random(&cfg, have, 1);
    char *dir = tu_tmp_dir("ifd-ckpt-test");
    ifd_checkpoint_options o = {.dir = dir, .every = 0, .keep = 5};
    ifd_hook h;
    ifd_error err;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    tu_result res;
    tu_run_hooks(&cfg, bs, have, &h, 1, &res);
    ck_assert_int_eq(res.rc, IFD_OK);
    ck_assert_int_eq(res.reason, IFD_END_INPUT_ENDED);
    int64_t got[8];
    int n = tu_ckpt_steps(dir, got, 8);
    RASSERT(n == (have > 0), "%lld batches: %d checkpoints", (long long)have, n);
    if (n)
        ck_assert_int_eq(got[0], have);
    tu_result_free(&res);
    tu_batches_free(bs, have);
    tu_rm_dir(dir);
}
END_TEST

/* per-host-v2: input that ends inside a step (its batches released untrained, but counted as
 * handed out by the source) writes no end checkpoint; input that ends between steps does. */
START_TEST(no_end_checkpoint_after_a_dropped_step)
{
    ifd_rng rng;
    seed_rng(&rng);
    int R = (int)rand_between(&rng, 2, 4);
    int64_t have = rand_between(&rng, 1, 12), per = rand_between(&rng, 1, 4);
    ifd_config cfg;
    tu_config_train(&cfg, "linear", IFD_OPT_SGD, 3, 2, per * R, rand_between(&rng, 1, 5), 1);
    cfg.replicas = R;
    cfg.input_mode = IFD_INPUT_PER_HOST_V2;
    cfg.steps = 100;
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, cfg.program, &cfg.settings, &err), IFD_OK);
    tu_batch **bs = calloc((size_t)have, sizeof *bs);
    for (int64_t i = 0; i < have; i++)
        bs[i] = tu_batch_random(&p, per, i, &rng);
    char *dir = tu_tmp_dir("ifd-ckpt-test");
    ifd_checkpoint_options o = {.dir = dir, .every = 0, .keep = 5};
    ifd_hook h;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    tu_result res;
    tu_run_hooks(&cfg, bs, have, &h, 1, &res);
    ck_assert_int_eq(res.rc, IFD_OK);
    int64_t got[8], steps = have / R;
    int n = tu_ckpt_steps(dir, got, 8);
    int want = steps > 0 && have % R == 0;
    RASSERT(n == want, "R=%d, %lld batches: %d end checkpoints, expected %d", R, (long long)have, n,
            want);
    if (n)
        ck_assert_int_eq(got[0], steps);
    RASSERT(res.global_step == steps, "global step %lld, expected %lld", (long long)res.global_step,
            (long long)steps);
    tu_result_free(&res);
    tu_batches_free(bs, have);
    tu_rm_dir(dir);
    ifd_program_free(&p);
}
END_TEST

/* A run that fails writes no checkpoint at its end (its state may be half a step). */
static int fail_at;
static int64_t calls; /* atomic */
static int failing_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                        ifd_error *err)
{
    if (__atomic_add_fetch(&calls, 1, __ATOMIC_ACQ_REL) == fail_at)
        return ifd_error_set(err, IFD_ENUMERIC, "injected");
    return tu_softmax_step(p, ops, a, err);
}

START_TEST(no_checkpoint_after_an_error)
{
    fail_at = 8;
    ifd_config cfg;
    tu_config_train(&cfg, "ckpt-fault", IFD_OPT_SGD, 3, 2, 4, 5, 1);
    cfg.steps = 20;
    tu_batch **bs = tu_batches_random(&cfg, 20, 1);
    char *dir = tu_tmp_dir("ifd-ckpt-test");
    ifd_checkpoint_options o = {.dir = dir, .every = 5, .keep = 5};
    ifd_hook h;
    ifd_error err;
    ck_assert_int_eq(ifd_hook_checkpoint(&h, &o, &err), IFD_OK);
    tu_result res;
    tu_run_hooks(&cfg, bs, 20, &h, 1, &res);
    ck_assert_int_eq(res.rc, IFD_ENUMERIC);
    int64_t got[8];
    ck_assert_int_eq(tu_ckpt_steps(dir, got, 8), 1);
    ck_assert_int_eq(got[0], 5);
    tu_result_free(&res);
    tu_batches_free(bs, 20);
    tu_rm_dir(dir);
}
END_TEST

int main(void)
{
    tu_register_softmax_like("ckpt-fault", failing_step);
    tu_register_softmax_nodecay("softmax-nodecay");
    Suite *s = suite_create("checkpoint_resume");
    TCase *tc = tu_tcase(s, "hook", 60);
    tcase_add_test(tc, hook_schedule);
    tcase_add_loop_test(tc, resume_equals_uninterrupted, IFD_OPT_SGD, IFD_OPT_ADAMW + 1);
    tcase_add_test(tc, session_refuses_a_misfit);
    tcase_add_test(tc, end_checkpoint_when_the_input_ends);
    tcase_add_loop_test(tc, no_end_checkpoint_after_a_dropped_step, 0, 8);
    tcase_add_test(tc, no_checkpoint_after_an_error);
    return tu_run_suite(s);
}
