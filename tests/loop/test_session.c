/* The session: loop schedule (stop at step), hook order, summaries, the end of the input, stop
 * requests. */
#include "core/thread.h"
#include "tests/util/live_session.h"
#include "tests/util/testutil.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LOOPS 64

typedef struct recorder {
    int64_t lengths[MAX_LOOPS];
    int64_t steps_after[MAX_LOOPS];
    int nloops;
    char trace[512];
    ifd_session *stop_session;
    int stop_after_loop;
} recorder;

static void trace(recorder *r, const char *what)
{
    size_t len = strlen(r->trace);
    snprintf(r->trace + len, sizeof r->trace - len, "%s%s", len ? "," : "", what);
}

static int rec_begin(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)ctx;
    (void)err;
    trace(arg, "begin");
    return IFD_OK;
}

static int rec_after_create(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)ctx;
    (void)err;
    trace(arg, "create");
    return IFD_OK;
}

static int rec_before(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)err;
    char buf[32];
    snprintf(buf, sizeof buf, "before%lld", (long long)ifd_run_context_loop_length(ctx));
    trace(arg, buf);
    return IFD_OK;
}

static int rec_after(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)err;
    recorder *r = arg;
    ck_assert_int_lt(r->nloops, MAX_LOOPS);
    ck_assert_int_eq(ifd_run_context_loop_index(ctx), r->nloops);
    r->lengths[r->nloops] = ifd_run_context_loop_length(ctx);
    r->steps_after[r->nloops] = ifd_run_context_global_step(ctx);
    r->nloops++;
    trace(r, "after");
    if (r->stop_session && r->nloops == r->stop_after_loop)
        ifd_session_request_stop(r->stop_session);
    return IFD_OK;
}

static int rec_end(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)ctx;
    (void)err;
    trace(arg, "end");
    return IFD_OK;
}

static ifd_hook recorder_hook(recorder *r)
{
    ifd_hook h = {
        .name = "recorder",
        .begin = rec_begin,
        .after_create_session = rec_after_create,
        .before_run = rec_before,
        .after_run = rec_after,
        .end = rec_end,
        .arg = r,
    };
    return h;
}

static void base_config(ifd_config *cfg, int replicas, int64_t rows_per_replica)
{
    ifd_config_defaults(cfg);
    cfg->program = "softmax";
    cfg->settings.features = 5;
    cfg->settings.classes = 3;
    cfg->replicas = replicas;
    cfg->batch_size = rows_per_replica * replicas;
    cfg->summary_every = 0;
}

/* Runs a session with a recorder hook over n random batches. */
typedef struct run_out {
    int rc;
    ifd_error err;
    int64_t global_step;
    ifd_end_reason reason;
    int released;
    int64_t pushed;
    json_t **sums;
    size_t nsums;
} run_out;

static void run_with(const ifd_config *cfg, int64_t nbatches, recorder *rec, int stop_after,
                     run_out *out)
{
    memset(out, 0, sizeof *out);
    ifd_rng rng;
    ifd_rng_seed(&rng, 42);
    ifd_program prog;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&prog, cfg->program, &cfg->settings, &err), IFD_OK);
    tu_batch **batches = calloc((size_t)nbatches + 1, sizeof *batches);
    for (int64_t i = 0; i < nbatches; i++) {
        batches[i] = tu_batch_random(&prog, cfg->batch_size, i, &rng);
        batches[i]->released = &out->released;
    }
    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create(&q, 3), IFD_OK);
    ifd_sink *sink;
    ck_assert_int_eq(ifd_sink_memory_create(&sink), IFD_OK);
    ifd_session *s;
    int rc = ifd_session_create(&s, cfg, ifd_batch_queue_source(q), &err);
    ck_assert_msg(rc == IFD_OK, "create: %s", ifd_error_text(&err));
    if (stop_after) {
        rec->stop_session = s;
        rec->stop_after_loop = stop_after;
    }
    ifd_hook h = recorder_hook(rec);
    ck_assert_int_eq(ifd_session_add_hook(s, &h), IFD_OK);
    ck_assert_int_eq(ifd_session_add_sink(s, sink), IFD_OK);
    tu_producer *p = tu_producer_start(q, batches, nbatches, 0);
    out->rc = ifd_session_run(s, &out->err);
    ifd_batch_queue_close(q);
    out->pushed = tu_producer_join(p);
    out->global_step = ifd_session_global_step(s);
    out->reason = ifd_session_end_reason(s);
    ifd_session_destroy(s);
    ifd_batch_queue_destroy(q);
    out->nsums = ifd_sink_memory_count(sink);
    out->sums = calloc(out->nsums + 1, sizeof *out->sums);
    for (size_t i = 0; i < out->nsums; i++) {
        char *line = ifd_sink_memory_get(sink, i);
        json_error_t je;
        out->sums[i] = json_loads(line, 0, &je);
        ck_assert_msg(out->sums[i] != NULL, "summary %zu is not JSON: %s", i, line);
        ck_assert_msg(strchr(line, '\n') == NULL, "summary %zu spans lines", i);
        free(line);
    }
    ifd_sink_destroy(sink);
    free(batches);
    ifd_program_free(&prog);
}

static void run_out_free(run_out *o)
{
    for (size_t i = 0; i < o->nsums; i++)
        json_decref(o->sums[i]);
    free(o->sums);
}

static const char *jstr(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_string(v), "summary key '%s' is not a string", key);
    return json_string_value(v);
}

static json_int_t jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_integer(v), "summary key '%s' is not an integer", key);
    return json_integer_value(v);
}

static double jnum(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_number(v), "summary key '%s' is not a number", key);
    return json_number_value(v);
}

START_TEST(schedule_num_steps)
{
    /* The seed's example: iterations_per_loop 4, steps 10 -> loops of 4, 4, 2. */
    ifd_config cfg;
    base_config(&cfg, 1 + _i % 3, 2);
    cfg.iterations_per_loop = 4;
    cfg.steps = 10;
    recorder rec = {0};
    run_out o;
    run_with(&cfg, 30, &rec, 0, &o);
    ck_assert_msg(o.rc == IFD_OK, "%s", ifd_error_text(&o.err));
    ck_assert_int_eq(rec.nloops, 3);
    ck_assert_int_eq(rec.lengths[0], 4);
    ck_assert_int_eq(rec.lengths[1], 4);
    ck_assert_int_eq(rec.lengths[2], 2);
    ck_assert_int_eq(rec.steps_after[0], 4);
    ck_assert_int_eq(rec.steps_after[1], 8);
    ck_assert_int_eq(rec.steps_after[2], 10);
    ck_assert_int_eq(o.global_step, 10);
    ck_assert_int_eq(o.reason, IFD_END_LAST_STEP);
    /* Batches the run did not take are released too, by the queue that held them. */
    ck_assert_int_eq(o.released, o.pushed);
    ck_assert_int_ge(o.pushed, 10);
    run_out_free(&o);
}
END_TEST

START_TEST(schedule_last_step)
{
    /* iterations_per_loop 5, last_step 23, from global step 7 -> 5, 5, 5, 1. */
    ifd_config cfg;
    base_config(&cfg, 1 + _i % 4, 1 + _i);
    cfg.iterations_per_loop = 5;
    cfg.last_step = 23;
    cfg.initial_global_step = 7;
    recorder rec = {0};
    run_out o;
    run_with(&cfg, 16, &rec, 0, &o);
    ck_assert_msg(o.rc == IFD_OK, "%s", ifd_error_text(&o.err));
    ck_assert_int_eq(rec.nloops, 4);
    int64_t want[4] = {5, 5, 5, 1};
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(rec.lengths[i], want[i]);
    ck_assert_int_eq(rec.steps_after[3], 23);
    ck_assert_int_eq(o.global_step, 23);
    json_t *end = o.sums[o.nsums - 1];
    ck_assert_str_eq(jstr(end, "event"), "end");
    ck_assert_int_eq(jint(end, "global_step"), 23);
    ck_assert_int_eq(jint(end, "steps"), 16);
    run_out_free(&o);
}
END_TEST

START_TEST(schedule_already_done)
{
    /* last_step at or below the starting step: no loop runs at all. */
    ifd_config cfg;
    base_config(&cfg, 2, 2);
    cfg.last_step = 5;
    cfg.initial_global_step = 5;
    recorder rec = {0};
    run_out o;
    run_with(&cfg, 3, &rec, 0, &o);
    ck_assert_int_eq(o.rc, IFD_OK);
    ck_assert_int_eq(rec.nloops, 0);
    ck_assert_int_eq(o.global_step, 5);
    ck_assert_int_eq(o.released, o.pushed);
    run_out_free(&o);
}
END_TEST

START_TEST(stop_at_step_arguments)
{
    ifd_hook h;
    ifd_error err;
    ck_assert_int_eq(ifd_hook_stop_at_step(&h, 4, 10, 20, &err), IFD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "both"));
    ck_assert_ptr_nonnull(strstr(err.msg, "steps=10, last_step=20"));
    ck_assert_int_eq(ifd_hook_stop_at_step(&h, 4, 0, 0, &err), IFD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "neither"));
    ck_assert_int_eq(ifd_hook_stop_at_step(&h, 0, 10, 0, &err), IFD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "iterations_per_loop"));
    ck_assert_int_eq(ifd_hook_stop_at_step(&h, 4, 10, 0, &err), IFD_OK);
    h.destroy(h.arg);

    ifd_config cfg;
    base_config(&cfg, 1, 4);
    cfg.steps = 3;
    cfg.last_step = 9;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "got steps=3"));
    ck_assert_ptr_nonnull(strstr(err.msg, "last_step=9"));
}
END_TEST

START_TEST(hook_order)
{
    ifd_config cfg;
    base_config(&cfg, 2, 3);
    cfg.iterations_per_loop = 3;
    cfg.steps = 5;
    recorder rec = {0};
    run_out o;
    run_with(&cfg, 5, &rec, 0, &o);
    ck_assert_int_eq(o.rc, IFD_OK);
    ck_assert_str_eq(rec.trace, "begin,create,before3,after,before2,after,end");
    run_out_free(&o);
}
END_TEST

START_TEST(summaries)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, 1000 + (uint64_t)_i);
    ifd_config cfg;
    base_config(&cfg, 1 + (int)ifd_rng_below(&rng, 4), 1 + (int64_t)ifd_rng_below(&rng, 5));
    cfg.iterations_per_loop = 1 + (int64_t)ifd_rng_below(&rng, 6);
    cfg.steps = 5 + (int64_t)ifd_rng_below(&rng, 20);
    cfg.summary_every = 1 + (int64_t)ifd_rng_below(&rng, 6);
    recorder rec = {0};
    run_out o;
    run_with(&cfg, cfg.steps, &rec, 0, &o);
    ck_assert_msg(o.rc == IFD_OK, "%s", ifd_error_text(&o.err));
    /* One train summary per summary_every steps, one more for the remainder, then the end. */
    int64_t full = cfg.steps / cfg.summary_every;
    int64_t expect = full + (cfg.steps % cfg.summary_every ? 1 : 0) + 1;
    ck_assert_msg((int64_t)o.nsums == expect,
                  "%zu summaries, expected %lld (steps %lld every %lld)", o.nsums,
                  (long long)expect, (long long)cfg.steps, (long long)cfg.summary_every);
    int64_t steps_seen = 0;
    for (size_t i = 0; i + 1 < o.nsums; i++) {
        json_t *j = o.sums[i];
        ck_assert_str_eq(jstr(j, "event"), "train");
        ck_assert_str_eq(jstr(j, "mode"), "train");
        int64_t gs = jint(j, "global_step");
        int64_t steps = jint(j, "steps");
        steps_seen += steps;
        ck_assert_int_eq(gs, steps_seen);
        if (i + 2 < o.nsums)
            ck_assert_int_eq(gs % cfg.summary_every, 0);
        ck_assert_int_eq(jint(j, "examples"), steps * cfg.batch_size);
        double loss = jnum(j, "loss"), acc = jnum(j, "accuracy");
        ck_assert(loss > 0.0 && loss < 50.0);
        ck_assert(acc >= 0.0 && acc <= 1.0);
        ck_assert(jnum(j, "examples_per_sec") > 0.0);
        ck_assert(jnum(j, "steps_per_sec") > 0.0);
        double in = jnum(j, "infeed_wait_fraction"), out = jnum(j, "outfeed_wait_fraction");
        ck_assert(in >= 0.0 && in <= 1.0);
        ck_assert(out >= 0.0 && out <= 1.0);
    }
    ck_assert_int_eq(steps_seen, cfg.steps);
    json_t *end = o.sums[o.nsums - 1];
    ck_assert_str_eq(jstr(end, "event"), "end");
    ck_assert_str_eq(jstr(end, "status"), "ok");
    ck_assert_str_eq(jstr(end, "reason"), "last_step");
    ck_assert_int_eq(jint(end, "global_step"), cfg.steps);
    run_out_free(&o);
}
END_TEST

START_TEST(summaries_linear_has_no_accuracy)
{
    ifd_config cfg;
    base_config(&cfg, 2, 2);
    cfg.program = "linear";
    cfg.steps = 4;
    cfg.summary_every = 2;
    recorder rec = {0};
    run_out o;
    run_with(&cfg, 4, &rec, 0, &o);
    ck_assert_int_eq(o.rc, IFD_OK);
    ck_assert_int_eq(o.nsums, 3);
    ck_assert_ptr_null(json_object_get(o.sums[0], "accuracy"));
    ck_assert_ptr_nonnull(json_object_get(o.sums[0], "loss"));
    run_out_free(&o);
}
END_TEST

START_TEST(input_ends_early)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, 77 + (uint64_t)_i);
    ifd_config cfg;
    base_config(&cfg, 1 + (int)ifd_rng_below(&rng, 4), 2);
    cfg.iterations_per_loop = 1 + (int64_t)ifd_rng_below(&rng, 5);
    cfg.steps = 20;
    cfg.summary_every = 3;
    int64_t nbatches = (int64_t)ifd_rng_below(&rng, 20); /* 0..19 < 20 steps */
    recorder rec = {0};
    run_out o;
    run_with(&cfg, nbatches, &rec, 0, &o);
    ck_assert_msg(o.rc == IFD_OK, "%s", ifd_error_text(&o.err));
    ck_assert_int_eq(o.reason, IFD_END_INPUT_ENDED);
    ck_assert_int_eq(o.global_step, nbatches);
    ck_assert_int_eq(o.released, nbatches);
    json_t *end = o.sums[o.nsums - 1];
    ck_assert_str_eq(jstr(end, "event"), "end");
    ck_assert_str_eq(jstr(end, "status"), "ok");
    ck_assert_str_eq(jstr(end, "reason"), "input_ended");
    ck_assert_int_eq(jint(end, "global_step"), nbatches);
    char want[64];
    snprintf(want, sizeof want, "after global step %lld", (long long)nbatches);
    ck_assert_msg(strstr(jstr(end, "message"), want), "message: %s", jstr(end, "message"));
    /* Every completed step was summarised. */
    int64_t steps = 0;
    for (size_t i = 0; i + 1 < o.nsums; i++)
        steps += jint(o.sums[i], "steps");
    ck_assert_int_eq(steps, nbatches);
    run_out_free(&o);
}
END_TEST

START_TEST(request_stop_ends_at_loop_boundary)
{
    ifd_config cfg;
    base_config(&cfg, 2, 2);
    cfg.iterations_per_loop = 3;
    cfg.steps = 30;
    recorder rec = {0};
    run_out o;
    run_with(&cfg, 30, &rec, 2, &o);
    ck_assert_int_eq(o.rc, IFD_OK);
    ck_assert_int_eq(rec.nloops, 2);
    ck_assert_int_eq(o.global_step, 6);
    ck_assert_int_eq(o.reason, IFD_END_STOPPED);
    ck_assert_str_eq(jstr(o.sums[o.nsums - 1], "reason"), "stopped");
    ck_assert_int_eq(o.released, o.pushed);
    ck_assert_int_ge(o.pushed, 6);
    run_out_free(&o);
}
END_TEST

/* Host memory registration (shared-memory pools) goes to the backend; the cpu backend reads
 * batches where they are and has no use for it: IFD_ENOTSUP naming it, and nothing to undo. */
START_TEST(host_memory_registration_on_cpu)
{
    ifd_config cfg;
    base_config(&cfg, 1, 2);
    cfg.steps = 1;
    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create(&q, 1), IFD_OK);
    ifd_session *s;
    ifd_error err;
    ck_assert_int_eq(ifd_session_create(&s, &cfg, ifd_batch_queue_source(q), &err), IFD_OK);
    static char page[4096] __attribute__((aligned(4096)));
    ck_assert_int_eq(ifd_session_register_host_memory(s, page, sizeof page, &err), IFD_ENOTSUP);
    ck_assert_msg(strstr(err.msg, "cpu") != NULL, "%s", err.msg);
    ifd_session_unregister_host_memory(s, page);
    ifd_session_destroy(s);
    ifd_batch_queue_destroy(q);
}
END_TEST

START_TEST(config_errors_name_the_field)
{
    ifd_config cfg;
    ifd_error err;
    base_config(&cfg, 3, 2);
    cfg.steps = 1;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_OK);
    cfg.batch_size = 10;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "batch_size") && strstr(err.msg, "10") && strstr(err.msg, "3"),
                  "%s", err.msg);
    base_config(&cfg, 0, 2);
    cfg.steps = 1;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "replicas"));
    base_config(&cfg, 1, 2);
    cfg.steps = 1;
    cfg.program = "resnet";
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "resnet") && strstr(err.msg, "softmax"), "%s", err.msg);
    base_config(&cfg, 1, 2);
    cfg.steps = 1;
    cfg.mode = (ifd_mode)7;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "mode") && strstr(err.msg, "7"), "%s", err.msg);
    base_config(&cfg, 1, 2);
    cfg.mode = IFD_MODE_EVAL;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    ck_assert_msg(strncmp(err.msg, "steps: ", 7) == 0 && strstr(err.msg, "eval"), "%s", err.msg);
    base_config(&cfg, 1, 2);
    cfg.steps = 1;
    cfg.optimizer.learning_rate = -1.0f;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "learning_rate"));
    base_config(&cfg, 1, 2);
    cfg.steps = 1;
    cfg.steps = -5;
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    ck_assert_msg(strncmp(err.msg, "steps: ", 7) == 0 && strstr(err.msg, "-5"), "%s", err.msg);
    cfg.steps = 1;
    cfg.backend = "tpu";
    ck_assert_int_eq(ifd_config_validate(&cfg, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "backend") && strstr(err.msg, "tpu"), "%s", err.msg);
    /* A program setting error comes from session creation. */
    base_config(&cfg, 1, 2);
    cfg.steps = 1;
    cfg.settings.features = 0;
    ifd_batch_queue *q;
    ifd_batch_queue_create(&q, 1);
    ifd_session *s;
    ck_assert_int_eq(ifd_session_create(&s, &cfg, ifd_batch_queue_source(q), &err), IFD_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(err.msg, "features"));
    ifd_batch_queue_destroy(q);
}
END_TEST

/* ---- a session driven by hand: batches pushed one by one from the test (tu_live) ---- */

START_TEST(summaries_do_not_wait_for_more_input)
{
    /* A step's summary is written while the run waits for its next batch: the finished steps
     * are handed to the outfeed thread before a replica blocks on an empty ring. */
    tu_live l = {0};
    base_config(&l.cfg, 1 + _i, 2);
    l.cfg.steps = 100;
    l.cfg.iterations_per_loop = 100;
    l.cfg.summary_every = 1;
    l.cfg.outfeed_depth = 8;
    l.cfg.infeed_depth = 8;
    tu_live_start(&l, NULL);
    for (size_t k = 1; k <= 3; k++) {
        tu_live_push(&l);
        ck_assert_uint_eq(tu_live_wait_summaries(&l, k), k);
    }
    tu_live_finish(&l);
    ck_assert_int_eq(l.rc, IFD_OK);
}
END_TEST

#define PACED_STEPS 6

START_TEST(rates_come_from_when_steps_ran)
{
    /* A window's rate comes from when its steps ran, and the replicas report their wait for
     * input. The test pushes batch k at rel[k], 10 ms (its pace) after it saw step k - 1's
     * summary at sum[k - 1]. Window k (one step) runs from the end of step k - 1 to the end of
     * step k, so it lasts between rel[k] - sum[k - 1] (step k needs batch k; step k - 1 had
     * ended on every replica when its summary came) and sum[k] - rel[k - 1]: bounds from the
     * order of events, which no load reverses. */
    ifd_rng rng;
    seed_rng(&rng);
    tu_live l = {0};
    base_config(&l.cfg, (int)rand_between(&rng, 1, 3), 2);
    l.cfg.steps = PACED_STEPS;
    l.cfg.iterations_per_loop = PACED_STEPS;
    l.cfg.summary_every = 1;
    l.cfg.outfeed_depth = PACED_STEPS;
    int64_t rel[PACED_STEPS + 1], sum[PACED_STEPS + 1];
    tu_live_start(&l, NULL);
    for (size_t k = 1; k <= PACED_STEPS; k++) {
        if (k > 1) {
            ck_assert_uint_ge(tu_live_wait_summaries(&l, k - 1), k - 1);
            sum[k - 1] = ifd_clock_ns();
            ifd_sleep_ns(10 * MS); /* the producer's pace */
        }
        rel[k] = ifd_clock_ns();
        tu_live_push(&l);
    }
    ck_assert_uint_ge(tu_live_wait_summaries(&l, PACED_STEPS), PACED_STEPS);
    sum[PACED_STEPS] = ifd_clock_ns();
    double held = 0.0, waited = 0.0;
    for (size_t k = 2; k <= PACED_STEPS; k++) {
        json_t *j = tu_summary_at(l.sink, k - 1);
        ck_assert_str_eq(jstr(j, "event"), "train");
        ck_assert_int_eq(jint(j, "global_step"), (int64_t)k);
        double sps = jnum(j, "steps_per_sec"), eps = jnum(j, "examples_per_sec");
        double secs = 1.0 / sps, lo = (double)(rel[k] - sum[k - 1]) * 1e-9,
               hi = (double)(sum[k] - rel[k - 1]) * 1e-9;
        RASSERT(secs >= lo * (1 - 1e-9) && secs <= hi * (1 + 1e-9),
                "R=%d step %zu: %g steps/s, a window of %.6f s; its step ran within [%.6f, %.6f] s",
                l.cfg.replicas, k, sps, secs, lo, hi);
        RASSERT(fabs(eps - sps * (double)l.cfg.batch_size) <= 1e-6 * eps,
                "examples/s %g vs steps/s %g", eps, sps);
        held += lo;
        waited += jnum(j, "infeed_wait_fraction") * secs;
        json_decref(j);
    }
    /* They waited most of the time the input was held back (a replica may block on its ring a
     * little after its step's summary came). */
    RASSERT(waited >= 0.5 * held, "R=%d: the replicas report %.4f s waiting of the %.4f s held",
            l.cfg.replicas, waited, held);
    tu_live_finish(&l);
    ck_assert_int_eq(l.rc, IFD_OK);
}
END_TEST

static int stop_with_reason(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)arg;
    (void)err;
    if (ifd_run_context_loop_index(ctx) == 1)
        ifd_run_context_request_stop(ctx, "early stopping: the loss plateaued");
    return IFD_OK;
}

START_TEST(hook_stop_reason_reaches_the_end_summary)
{
    ifd_config cfg;
    base_config(&cfg, 2, 2);
    cfg.iterations_per_loop = 2;
    cfg.steps = 20;
    tu_live l = {.cfg = cfg};
    ifd_hook h = {.name = "early", .after_run = stop_with_reason};
    tu_live_start(&l, &h);
    for (int k = 0; k < 4; k++)
        tu_live_push(&l);
    pthread_join(l.runner, NULL);
    ck_assert_int_eq(l.rc, IFD_OK);
    size_t n = ifd_sink_memory_count(l.sink);
    json_t *end = tu_summary_at(l.sink, n - 1);
    ck_assert_str_eq(jstr(end, "reason"), "stopped");
    ck_assert_str_eq(jstr(end, "message"), "early stopping: the loss plateaued");
    ck_assert_int_eq(jint(end, "global_step"), 4);
    json_decref(end);
    l.joined = 1;
    tu_live_finish(&l);
}
END_TEST

static int no_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    (void)ctx;
    (void)out;
    return ifd_error_set(err, IFD_EIO, "unused");
}

START_TEST(source_without_abort_is_rejected)
{
    static const ifd_batch_source_ops ops = {.next = no_next};
    ifd_config cfg;
    base_config(&cfg, 1, 1);
    cfg.steps = 1;
    ifd_session *s;
    ifd_error err;
    ck_assert_int_eq(ifd_session_create(&s, &cfg, (ifd_batch_source){&ops, NULL}, &err),
                     IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "abort"), "%s", err.msg);
}
END_TEST

START_TEST(enum_names_round_trip)
{
    for (int v = 0; v < 3; v++) {
        ifd_mode m;
        ck_assert_int_eq(ifd_mode_parse(ifd_mode_name((ifd_mode)v), &m), IFD_OK);
        ck_assert_int_eq(m, v);
        ifd_optimizer_kind k;
        ck_assert_int_eq(ifd_optimizer_parse(ifd_optimizer_name((ifd_optimizer_kind)v), &k),
                         IFD_OK);
        ck_assert_int_eq(k, v);
    }
    for (int v = 0; v < 4; v++) {
        ifd_input_mode im;
        ck_assert_int_eq(ifd_input_mode_parse(ifd_input_mode_name((ifd_input_mode)v), &im), IFD_OK);
        ck_assert_int_eq(im, v);
    }
    for (int v = 0; v < 2; v++) {
        ifd_loss_reduction r;
        ck_assert_int_eq(
            ifd_loss_reduction_parse(ifd_loss_reduction_name((ifd_loss_reduction)v), &r), IFD_OK);
        ck_assert_int_eq(r, v);
    }
    ck_assert_str_eq(ifd_input_mode_name(IFD_INPUT_PER_HOST_V2), "per-host-v2");
    ck_assert_str_eq(ifd_end_reason_name(IFD_END_INPUT_ENDED), "input_ended");
    ck_assert_str_eq(ifd_mode_name((ifd_mode)7), "?");
    ifd_mode m = IFD_MODE_TRAIN;
    ck_assert_int_eq(ifd_mode_parse("Train", &m), IFD_EINVAL);
    ck_assert_int_eq(ifd_mode_parse(NULL, &m), IFD_EINVAL);
    ifd_optimizer_kind k;
    ck_assert_int_eq(ifd_optimizer_parse("rmsprop", &k), IFD_EINVAL);
}
END_TEST

/* A hook that takes 20 ms after every loop and records when it ran. */
typedef struct sleepy {
    int n;
    int64_t begin[8], end[8];
} sleepy;

static int sleep_after_run(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    (void)ctx;
    (void)err;
    sleepy *h = arg;
    int64_t begin = ifd_clock_ns();
    ifd_sleep_ns(20 * MS);
    if (h->n < 8) {
        h->begin[h->n] = begin;
        h->end[h->n++] = ifd_clock_ns();
    }
    return IFD_OK;
}

START_TEST(windows_tile_the_run)
{
    /* Windows are back to back: their seconds (steps / steps_per_sec) add up to at most the
     * run's wall time, host time between loops included: the hook after loop i ran after every
     * replica's last step of it and before any step of loop i + 1, so within window i + 1. */
    ifd_config cfg;
    base_config(&cfg, 2, 2);
    cfg.iterations_per_loop = 5;
    cfg.steps = 20;
    cfg.summary_every = 5;
    tu_live l = {.cfg = cfg};
    sleepy sl = {0};
    ifd_hook h = {.name = "sleepy", .after_run = sleep_after_run, .arg = &sl};
    int64_t t0 = ifd_clock_ns();
    tu_live_start(&l, &h);
    for (int k = 0; k < 20; k++)
        tu_live_push(&l);
    pthread_join(l.runner, NULL);
    double wall = (double)(ifd_clock_ns() - t0) * 1e-9;
    ck_assert_int_eq(l.rc, IFD_OK);
    ck_assert_uint_eq(ifd_sink_memory_count(l.sink), 5);
    ck_assert_int_eq(sl.n, 4); /* after every loop */
    double secs = 0.0, hooks = 0.0;
    for (size_t i = 0; i < 4; i++) {
        json_t *j = tu_summary_at(l.sink, i);
        double sps = jnum(j, "steps_per_sec");
        ck_assert_msg(sps > 0.0, "window %zu: %g steps/s", i, sps);
        double w = (double)jint(j, "steps") / sps;
        if (i > 0) {
            double hook = (double)(sl.end[i - 1] - sl.begin[i - 1]) * 1e-9;
            ck_assert_msg(w >= hook * (1 - 1e-9), "window %zu: %.4f s, the hook before it %.4f s",
                          i, w, hook);
            hooks += hook;
        }
        secs += w;
        json_decref(j);
    }
    ck_assert_msg(secs >= hooks && secs <= wall * (1 + 1e-9),
                  "windows add up to %.4f s; hooks between loops %.4f s; run %.4f s", secs, hooks,
                  wall);
    l.joined = 1;
    tu_live_finish(&l);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("session");
    TCase *tc = tcase_create("schedule");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, schedule_num_steps, 0, 3);
    tcase_add_loop_test(tc, schedule_last_step, 0, 4);
    tcase_add_test(tc, schedule_already_done);
    tcase_add_test(tc, stop_at_step_arguments);
    tcase_add_test(tc, hook_order);
    tcase_add_test(tc, request_stop_ends_at_loop_boundary);
    suite_add_tcase(s, tc);
    tc = tcase_create("summaries");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, summaries, 0, 8);
    tcase_add_test(tc, summaries_linear_has_no_accuracy);
    suite_add_tcase(s, tc);
    tc = tcase_create("input");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, input_ends_early, 0, 8);
    tcase_add_test(tc, config_errors_name_the_field);
    tcase_add_test(tc, source_without_abort_is_rejected);
    tcase_add_test(tc, enum_names_round_trip);
    tcase_add_loop_test(tc, summaries_do_not_wait_for_more_input, 0, 3);
    tcase_add_test(tc, rates_come_from_when_steps_ran);
    tcase_add_test(tc, windows_tile_the_run);
    tcase_add_test(tc, hook_stop_reason_reaches_the_end_summary);
    tcase_add_test(tc, host_memory_registration_on_cpu);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
