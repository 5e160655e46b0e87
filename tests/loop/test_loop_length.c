/*
 * Loop lengths chosen for the user (ifd_config.loop_kind auto and seconds; loop/loop_tuner.h).
 *
 * The tuner is driven with a model machine of random step and boundary costs (no clock): auto's
 * boundary costs stay under 1 % of a loop unless the bound caps the loop, a loop stays within
 * the bound and, where the bound caps it, uses it (judged on the costs the tuner recorded), the
 * duration form lands within 10 % of its duration, a slow boundary (a checkpoint write) moves
 * nothing, slower steps shrink the loops at once, growth is bounded.
 *
 * Sessions with automatic lengths, on the real clock, assert only what must hold whatever the
 * lengths are: the loops tile the run and end exactly at the last step; checkpoints fall on
 * exact multiples; summaries come at the same steps and say the length of their loop; eval runs
 * one loop; predict predicts every row; the config's errors name the field.
 */
#include <infeed/checkpoint.h>
#include "loop/loop_tuner.h"
#include "tests/util/checkpoints.h"
#include "tests/util/files.h"
#include "tests/util/testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the tuner on a model machine --------------------------------------------------------- */

/* A machine whose loop of n steps takes n x s + c ns: each step off by up to noise (a fraction,
 * independently: the steady steps' sum by noise / sqrt(n - 1)), the boundary by up to cnoise;
 * the test's rng draws them. */
typedef struct machine {
    double s, c, noise, cnoise;
    ifd_rng *rng;
} machine;

static double jitter(machine *m, double by)
{
    return 1.0 + by * ((double)ifd_rng_below(m->rng, 2001) / 1000.0 - 1.0);
}

/* Runs a loop of the tuner's length on m (capped at cap when > 0); returns the length. */
static int64_t model_loop(ifd_loop_tuner *t, machine *m, int64_t cap)
{
    int64_t n = ifd_loop_tuner_next(t);
    ck_assert_int_ge(n, 1);
    if (cap > 0 && n > cap)
        n = cap;
    double first = m->s * jitter(m, m->noise);
    double steady =
        n > 1 ? (double)(n - 1) * m->s * jitter(m, m->noise / sqrt((double)(n - 1))) : 0.0;
    double cycle = first + steady + m->c * jitter(m, m->cnoise);
    ifd_loop_tuner_observe(t, n, (int64_t)(first + steady), (int64_t)first, (int64_t)cycle);
    return n;
}

/* Log-uniform in [lo, hi). */
static double log_uniform(ifd_rng *rng, double lo, double hi)
{
    double u = (double)ifd_rng_below(rng, 1u << 20) / (double)(1u << 20);
    return lo * pow(hi / lo, u);
}

/* Steps of 100 ns to 10 ms, boundaries of 1 us to 5 ms, 1 % noise on a step, 10 % on a
 * boundary. */
static machine random_machine(ifd_rng *rng)
{
    return (machine){log_uniform(rng, 100, 1e7), log_uniform(rng, 1e3, 5e6), 0.01, 0.1, rng};
}

START_TEST(auto_keeps_the_boundary_under_one_percent_within_the_bound)
{
    ifd_rng rng;
    seed_rng(&rng);
    machine m = random_machine(&rng);
    double max_secs = log_uniform(&rng, 0.01, 2.0);
    ifd_loop_tuner t;
    ifd_loop_tuner_init(&t, IFD_LOOP_AUTO, 0, max_secs);
    ck_assert_int_eq(ifd_loop_tuner_next(&t), 1); /* the first loop: one step */
    int64_t n = 0;
    for (int i = 0; i < 40; i++)
        n = model_loop(&t, &m, 0);
    double loop_ns = (double)n * m.s, cost = m.c / (loop_ns + m.c);
    double fits = ceil(99.0 * m.c / m.s); /* the least steps that make the boundary 1 % */
    /* the bound holds (a step longer than it: one step a loop) */
    RASSERT(loop_ns <= max_secs * 1e9 * 1.05 || n == 1,
            "step %.0f ns, boundary %.0f ns, bound %g s: %lld steps last %.3g s", m.s, m.c,
            max_secs, (long long)n, loop_ns * 1e-9);
    if (fits * m.s <= max_secs * 1e9 * 0.9) {
        RASSERT(cost <= 0.01,
                "step %.0f ns, boundary %.0f ns: %lld steps a loop, the boundary "
                "costs %.2f %%",
                m.s, m.c, (long long)n, 100 * cost);
        /* and no longer than needed, so that a stop comes sooner: at most twice the least under
         * 0.5 % of the boundary as measured (a sample is off by the noise of two steps) */
        double least = ceil(199.0 * (m.c * 1.1 + 2 * m.noise * m.s) / m.s);
        RASSERT((double)n <= 2 * least + 2,
                "step %.0f ns, boundary %.0f ns: %lld steps, the least "
                "under 0.5 %% (with the noise) is %.0f",
                m.s, m.c, (long long)n, least);
    } else {
        /* the bound is what limits the loop: it is used. Judged on the step and boundary the
         * tuner recorded (its estimates of the model's costs): the next loop fits the bound, and
         * one step more would not, unless fewer steps already bring the boundary under
         * IFD_TUNER_COST. */
        double s_est = ifd_loop_tuner_step_ns(&t), c_est = ifd_loop_tuner_boundary_ns(&t);
        double max_ns = max_secs * 1e9, eps = 1e-9;
        int64_t next = ifd_loop_tuner_next(&t);
        double next_ns = (double)next * s_est;
        RASSERT(next_ns <= max_ns * (1 + eps) || next == 1,
                "step %.0f ns (estimated %.0f), bound %g s: the next loop of %lld steps passes it",
                m.s, s_est, max_secs, (long long)next);
        RASSERT(next_ns + s_est > max_ns * (1 - eps) ||
                    c_est <= IFD_TUNER_COST * (next_ns + c_est) * (1 + eps),
                "step %.0f ns, boundary %.0f ns (estimated %.0f, %.0f), bound %g s: only %lld "
                "steps (%.3g s), and the boundary costs %.2f %% of them",
                m.s, m.c, s_est, c_est, max_secs, (long long)next, next_ns * 1e-9,
                100 * c_est / (next_ns + c_est));
    }
}
END_TEST

START_TEST(seconds_loops_last_about_the_duration)
{
    ifd_rng rng;
    seed_rng(&rng);
    machine m = random_machine(&rng);
    double secs = log_uniform(&rng, 0.001, 3.0);
    ifd_loop_tuner t;
    ifd_loop_tuner_init(&t, IFD_LOOP_SECONDS, secs, 0.5);
    int64_t n = 0;
    for (int i = 0; i < 40; i++)
        n = model_loop(&t, &m, 0);
    double loop_ns = (double)n * m.s, want = secs * 1e9;
    /* within 10 % (and the noise), or the nearest whole number of steps */
    RASSERT(fabs(loop_ns - want) <= 0.12 * want + 0.55 * m.s || (n == 1 && m.s > want),
            "step %.0f ns, duration %g s: %lld steps last %.4g s", m.s, secs, (long long)n,
            loop_ns * 1e-9);
}
END_TEST

/* Between two loops a checkpoint is written (a boundary a thousand times the usual): the next
 * lengths stay as they were; the estimates are medians. */
START_TEST(one_slow_boundary_moves_nothing)
{
    ifd_rng rng;
    seed_rng(&rng);
    machine m = {log_uniform(&rng, 1e3, 1e5), log_uniform(&rng, 1e4, 1e5), 0.0, 0.0, &rng};
    ifd_loop_tuner t;
    ifd_loop_tuner_init(&t, rand_between(&rng, 0, 1) ? IFD_LOOP_AUTO : IFD_LOOP_SECONDS,
                        log_uniform(&rng, 0.01, 0.1), 10.0);
    for (int i = 0; i < 30; i++)
        model_loop(&t, &m, 0);
    int64_t before = ifd_loop_tuner_next(&t);
    double c = m.c;
    m.c = 1000 * c;
    model_loop(&t, &m, 0);
    m.c = c;
    RASSERT(ifd_loop_tuner_next(&t) == before, "a slow boundary moved the length from %lld to %lld",
            (long long)before, (long long)ifd_loop_tuner_next(&t));
}
END_TEST

/* Steps become 20 times slower (a bigger model's turn, a loaded machine): within three loops
 * (a majority of the window) the loops are back within the bound. */
START_TEST(slower_steps_shrink_the_loops_at_once)
{
    ifd_rng rng;
    seed_rng(&rng);
    double max_secs = log_uniform(&rng, 0.05, 1.0);
    machine m = {log_uniform(&rng, 1e3, 1e5), 0, 0.01, 0.1, &rng};
    m.c = 0.9 * max_secs * 1e9 * m.s / (199 * m.s); /* auto wants loops near the bound */
    ifd_loop_tuner t;
    ifd_loop_tuner_init(&t, IFD_LOOP_AUTO, 0, max_secs);
    for (int i = 0; i < 30; i++)
        model_loop(&t, &m, 0);
    m.s *= 20;
    for (int i = 0; i < 3; i++)
        model_loop(&t, &m, 0);
    int64_t n = ifd_loop_tuner_next(&t);
    RASSERT((double)n * m.s <= max_secs * 1e9 * 1.05, "%lld steps of %.0f ns: %.3g s, bound %g s",
            (long long)n, m.s, (double)n * m.s * 1e-9, max_secs);
}
END_TEST

/* Lengths start at 1 and grow to at most IFD_TUNER_GROWTH times the longest loop so far,
 * even when the session capped a loop far below what the tuner asked. */
START_TEST(growth_is_bounded)
{
    ifd_rng rng;
    seed_rng(&rng);
    machine m = {log_uniform(&rng, 100, 1e3), log_uniform(&rng, 1e5, 1e6), 0.01, 0.1, &rng};
    ifd_loop_tuner t;
    ifd_loop_tuner_init(&t, rand_between(&rng, 0, 1) ? IFD_LOOP_AUTO : IFD_LOOP_SECONDS, 1.0, 1.0);
    int64_t most = 0;
    for (int i = 0; i < 12; i++) {
        int64_t want = ifd_loop_tuner_next(&t);
        if (i == 0)
            ck_assert_int_eq(want, 1);
        else
            RASSERT(want <= most * IFD_TUNER_GROWTH, "loop %d: %lld after a longest of %lld", i,
                    (long long)want, (long long)most);
        int64_t cap = rand_between(&rng, 0, 1) ? rand_between(&rng, 1, 50) : 0;
        int64_t n = model_loop(&t, &m, cap);
        most = n > most ? n : most;
    }
}
END_TEST

/* ---- sessions with automatic lengths -------------------------------------------------------- */

/* Automatic lengths: auto with a random bound, or a random duration of 1 to 20 ms. */
static void random_automatic(ifd_config *cfg, ifd_rng *rng)
{
    if (rand_between(rng, 0, 1)) {
        cfg->loop_kind = IFD_LOOP_AUTO;
        cfg->max_loop_seconds = (double)rand_between(rng, 1, 500) / 1000.0;
    } else {
        cfg->loop_kind = IFD_LOOP_SECONDS;
        cfg->loop_secs = (double)rand_between(rng, 1, 20) / 1000.0;
    }
    cfg->iterations_per_loop = rand_between(rng, -5, 0); /* unused: any value */
}

static void train_config(ifd_config *cfg, ifd_rng *rng)
{
    tu_config_train(cfg, "softmax", IFD_OPT_SGD, rand_between(rng, 1, 6), rand_between(rng, 2, 4),
                    rand_between(rng, 1, 4), 1, ifd_rng_next(rng));
    random_automatic(cfg, rng);
    cfg->summary_every = 0;
}

/* The loops tile [first, last): each starts where the one before ended, runs its length, ends
 * at or before last. */
static void assert_tiled(const tu_loops *l, int64_t first, int64_t last)
{
    int64_t at = first;
    for (int i = 0; i < l->n; i++) {
        RASSERT(l->start[i] == at && l->len[i] >= 1 && l->end[i] == at + l->len[i] &&
                    l->end[i] <= last,
                "loop %d: from %lld, %lld steps, to %lld (expected from %lld, to %lld at most)", i,
                (long long)l->start[i], (long long)l->len[i], (long long)l->end[i], (long long)at,
                (long long)last);
        at = l->end[i];
    }
    RASSERT(at == last, "the loops end at %lld, the run at %lld", (long long)at, (long long)last);
}

START_TEST(automatic_lengths_stop_at_the_last_step)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config cfg;
    train_config(&cfg, &rng);
    int64_t start = rand_between(&rng, 0, 1) ? 0 : rand_between(&rng, 1, 1000);
    int64_t steps = rand_between(&rng, 1, 3000);
    cfg.initial_global_step = start;
    cfg.steps = 0;
    if (rand_between(&rng, 0, 1))
        cfg.steps = steps;
    else
        cfg.last_step = start + steps;
    tu_batch **b = tu_batches_random(&cfg, steps, ifd_rng_next(&rng));
    tu_loops l;
    ifd_hook h = tu_loops_hook(&l);
    tu_result r;
    tu_run_hooks(&cfg, b, steps, &h, 1, &r);
    RASSERT(r.rc == IFD_OK && r.reason == IFD_END_LAST_STEP && r.global_step == start + steps,
            "%s: reason %d at %lld, expected the last step %lld", ifd_error_text(&r.err),
            (int)r.reason, (long long)r.global_step, (long long)(start + steps));
    assert_tiled(&l, start, start + steps);
    tu_result_free(&r);
    tu_batches_free(b, steps);
}
END_TEST

START_TEST(automatic_lengths_checkpoint_on_exact_multiples)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config cfg;
    train_config(&cfg, &rng);
    int64_t every = rand_between(&rng, 1, 60), steps = rand_between(&rng, 1, 800);
    cfg.steps = steps;
    tu_batch **b = tu_batches_random(&cfg, steps, ifd_rng_next(&rng));
    char *dir = tu_tmp_dir("ifd-loop-test");
    ifd_checkpoint_options o = {.dir = dir, .every = every, .keep = 100000};
    tu_loops l;
    ifd_hook hooks[2];
    ifd_error err;
    ck_assert_int_eq(ifd_hook_checkpoint(&hooks[0], &o, &err), IFD_OK);
    hooks[1] = tu_loops_hook(&l);
    tu_result r;
    tu_run_hooks(&cfg, b, steps, hooks, 2, &r);
    RASSERT(r.rc == IFD_OK && r.global_step == steps, "%s", ifd_error_text(&r.err));
    assert_tiled(&l, 0, steps);
    int64_t got[1000];
    int n = tu_ckpt_steps(dir, got, 1000), k = 0;
    for (int64_t m = every; m <= steps; m += every, k++)
        RASSERT(k < n && got[k] == m, "checkpoint %d: at step %lld, expected %lld (every %lld)", k,
                k < n ? (long long)got[k] : -1LL, (long long)m, (long long)every);
    if (steps % every) /* and the end's */
        RASSERT(k < n && got[k++] == steps, "no checkpoint at the end, step %lld",
                (long long)steps);
    RASSERT(n == k, "%d checkpoints, expected %d (every %lld, %lld steps)", n, k, (long long)every,
            (long long)steps);
    tu_rm_dir(dir);
    tu_result_free(&r);
    tu_batches_free(b, steps);
}
END_TEST

/* A summary's "iterations_per_loop" (-1 when it has none) and "global_step". */
static void summary_fields(const char *line, const char *event, int64_t *step, int64_t *ipl,
                           int *is_event)
{
    json_t *j = json_loads(line, 0, NULL);
    ck_assert_ptr_nonnull(j);
    *is_event = strcmp(json_string_value(json_object_get(j, "event")), event) == 0;
    *step = json_integer_value(json_object_get(j, "global_step"));
    json_t *v = json_object_get(j, "iterations_per_loop");
    *ipl = v ? json_integer_value(v) : -1;
    json_decref(j);
}

/* Summaries come every summary_every steps, as with fixed loops, and each says the length of the
 * loop its last step ran in. Fixed loops (half the runs) say iterations_per_loop, the last loop
 * possibly shorter. */
START_TEST(summaries_say_the_loop_length)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config cfg;
    train_config(&cfg, &rng);
    int fixed = rand_between(&rng, 0, 1);
    if (fixed) {
        cfg.loop_kind = IFD_LOOP_STEPS;
        cfg.iterations_per_loop = rand_between(&rng, 1, 40);
    }
    int64_t steps = rand_between(&rng, 1, 1500), every = rand_between(&rng, 1, 50);
    cfg.steps = steps;
    cfg.summary_every = every;
    tu_batch **b = tu_batches_random(&cfg, steps, ifd_rng_next(&rng));
    tu_loops l;
    ifd_hook h = tu_loops_hook(&l);
    tu_result r;
    tu_run_hooks(&cfg, b, steps, &h, 1, &r);
    RASSERT(r.rc == IFD_OK && r.global_step == steps, "%s", ifd_error_text(&r.err));
    assert_tiled(&l, 0, steps);
    int64_t want = every, last = 0;
    int loop = 0;
    for (size_t i = 0; i < r.nsummaries; i++) {
        int64_t step, ipl;
        int train;
        summary_fields(r.summaries[i], "train", &step, &ipl, &train);
        if (!train)
            continue;
        if (want > steps) /* the end's summary of the steps since the last one */
            want = steps;
        RASSERT(step == want, "a train summary at step %lld, expected %lld (every %lld)",
                (long long)step, (long long)want, (long long)every);
        while (loop < l.n && l.end[loop] < step)
            loop++;
        RASSERT(loop < l.n && ipl == l.len[loop],
                "the summary at step %lld says iterations_per_loop %lld; its loop ran %lld",
                (long long)step, (long long)ipl, loop < l.n ? (long long)l.len[loop] : -1LL);
        if (fixed)
            RASSERT(ipl == cfg.iterations_per_loop || l.end[loop] == steps,
                    "fixed loops of %lld: a summary says %lld", (long long)cfg.iterations_per_loop,
                    (long long)ipl);
        last = step;
        want += every;
    }
    RASSERT(last == steps, "the last train summary is at %lld, the run ended at %lld",
            (long long)last, (long long)steps);
    tu_result_free(&r);
    tu_batches_free(b, steps);
}
END_TEST

START_TEST(eval_runs_one_loop)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config cfg;
    train_config(&cfg, &rng);
    cfg.mode = IFD_MODE_EVAL;
    int64_t steps = rand_between(&rng, 1, 2000);
    cfg.steps = steps;
    tu_batch **b = tu_batches_random(&cfg, steps, ifd_rng_next(&rng));
    tu_loops l;
    ifd_hook h = tu_loops_hook(&l);
    tu_result r;
    tu_run_hooks(&cfg, b, steps, &h, 1, &r);
    RASSERT(r.rc == IFD_OK && r.reason == IFD_END_LAST_STEP, "%s", ifd_error_text(&r.err));
    RASSERT(l.n == 1 && l.len[0] == steps, "eval of %lld steps ran %d loops, the first of %lld",
            (long long)steps, l.n, (long long)l.len[0]);
    int found = 0;
    for (size_t i = 0; i < r.nsummaries; i++) {
        int64_t step, ipl;
        int eval;
        summary_fields(r.summaries[i], "eval", &step, &ipl, &eval);
        if (eval) {
            found++;
            RASSERT(ipl == steps, "the eval summary says iterations_per_loop %lld, expected %lld",
                    (long long)ipl, (long long)steps);
        }
    }
    ck_assert_int_eq(found, 1);
    tu_result_free(&r);
    tu_batches_free(b, steps);
}
END_TEST

typedef struct rows_count {
    int64_t rows, batches;
} rows_count;

static int count_rows(void *ctx, const ifd_batch *batch, const ifd_predictions *p, ifd_error *err)
{
    (void)batch, (void)err;
    rows_count *c = ctx;
    c->rows += p->rows;
    c->batches++;
    return IFD_OK;
}

START_TEST(predict_predicts_every_row)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config cfg;
    train_config(&cfg, &rng);
    cfg.mode = IFD_MODE_PREDICT;
    cfg.steps = 0;
    int64_t n = rand_between(&rng, 1, 1500);
    tu_batch **b = tu_batches_random(&cfg, n, ifd_rng_next(&rng));
    ifd_program p;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, cfg.program, &cfg.settings, &err), IFD_OK);
    for (int64_t i = 0; i < n; i++)
        tu_strip_labels(&p, b[i]);
    rows_count c = {0, 0};
    ifd_prediction_sink ps = {count_rows, &c};
    tu_result r;
    tu_run_predict(&cfg, b, n, &ps, &r);
    RASSERT(r.rc == IFD_OK && r.reason == IFD_END_INPUT_ENDED, "%s", ifd_error_text(&r.err));
    RASSERT(c.batches == n && c.rows == n * cfg.batch_size,
            "%lld batches of %lld rows: %lld "
            "predicted in %lld",
            (long long)n, (long long)cfg.batch_size, (long long)c.rows, (long long)c.batches);
    tu_result_free(&r);
    tu_batches_free(b, n);
    ifd_program_free(&p);
}
END_TEST

START_TEST(config_errors_name_the_field)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config cfg;
    train_config(&cfg, &rng);
    cfg.steps = 1;
    ifd_error err;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_OK); /* iterations_per_loop unused */
    ifd_config bad = cfg;
    bad.loop_kind = (ifd_loop_kind)rand_between(&rng, 3, 100);
    ck_assert_int_eq(ifd_config_validate(&bad, &err), IFD_EINVAL);
    RASSERT(strstr(err.msg, "loop_kind: expected") && strstr(err.msg, "IFD_LOOP_AUTO"), "%s",
            err.msg);
    const double secs[] = {0.0, -1.0, 86401.0, NAN};
    bad = cfg;
    bad.loop_kind = IFD_LOOP_SECONDS;
    bad.loop_secs = secs[rand_between(&rng, 0, 3)];
    ck_assert_int_eq(ifd_config_validate(&bad, &err), IFD_EINVAL);
    RASSERT(strncmp(err.msg, "loop_secs: expected seconds above 0, at most 86400, got ", 56) == 0,
            "%s", err.msg);
    bad = cfg;
    bad.loop_kind = IFD_LOOP_AUTO;
    bad.max_loop_seconds = secs[rand_between(&rng, 0, 3)];
    ck_assert_int_eq(ifd_config_validate(&bad, &err), IFD_EINVAL);
    RASSERT(strncmp(err.msg, "max_loop_seconds: expected seconds above 0, at most 86400, got ",
                    63) == 0,
            "%s", err.msg);
    bad = cfg;
    bad.loop_kind = IFD_LOOP_STEPS;
    bad.iterations_per_loop = rand_between(&rng, -10, 0);
    ck_assert_int_eq(ifd_config_validate(&bad, &err), IFD_EINVAL);
    RASSERT(strstr(err.msg, "iterations_per_loop: expected a positive integer"), "%s", err.msg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("loop_length");
    TCase *tuner = tcase_create("tuner");
    tcase_add_loop_test(tuner, auto_keeps_the_boundary_under_one_percent_within_the_bound, 0, 200);
    tcase_add_loop_test(tuner, seconds_loops_last_about_the_duration, 0, 200);
    tcase_add_loop_test(tuner, one_slow_boundary_moves_nothing, 0, 50);
    tcase_add_loop_test(tuner, slower_steps_shrink_the_loops_at_once, 0, 50);
    tcase_add_loop_test(tuner, growth_is_bounded, 0, 50);
    suite_add_tcase(s, tuner);
    TCase *run = tcase_create("sessions");
    tcase_add_loop_test(run, automatic_lengths_stop_at_the_last_step, 0, 12);
    tcase_add_loop_test(run, automatic_lengths_checkpoint_on_exact_multiples, 0, 10);
    tcase_add_loop_test(run, summaries_say_the_loop_length, 0, 12);
    tcase_add_loop_test(run, eval_runs_one_loop, 0, 6);
    tcase_add_loop_test(run, predict_predicts_every_row, 0, 6);
    tcase_add_loop_test(run, config_errors_name_the_field, 0, 8);
    suite_add_tcase(s, run);
    return tu_run_suite(s);
}
