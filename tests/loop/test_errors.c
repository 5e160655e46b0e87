/* The error rendezvous: an error injected in any thread (infeed, outfeed, a replica, a hook, the
 * batch source) ends the session with that error within 5 s, the end summary carries it, and no
 * thread is left behind. */
#include "core/thread.h"
#include "tests/util/testutil.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef enum { INJ_LABEL, INJ_SOURCE, INJ_SINK, INJ_REPLICA, INJ_HOOK, INJ_COUNT } injection;

/* ---- a program that fails on the n-th step call, whichever replica makes it ---- */

static int fault_countdown; /* atomic */

static int fault_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                      ifd_error *err)
{
    if (__atomic_sub_fetch(&fault_countdown, 1, __ATOMIC_ACQ_REL) == 0)
        return ifd_error_set(err, IFD_ENUMERIC, "injected replica fault");
    return tu_softmax_step(p, ops, a, err);
}

/* ---- a batch source that fails after n batches ---- */

typedef struct failing_source {
    ifd_batch_source inner;
    int left;
} failing_source;

static int fs_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    failing_source *fs = ctx;
    if (fs->left-- == 0)
        return ifd_error_set(err, IFD_EIO, "injected source failure");
    return fs->inner.ops->next(fs->inner.ctx, out, err);
}

static void fs_abort(void *ctx)
{
    failing_source *fs = ctx;
    fs->inner.ops->abort(fs->inner.ctx);
}

static const ifd_batch_source_ops fs_ops = {.next = fs_next, .abort = fs_abort};

/* ---- a sink that fails on the n-th write ---- */

typedef struct failing_sink {
    int left;
    ifd_sink *mem;
} failing_sink;

static int fk_write(void *ctx, const char *json, size_t len, ifd_error *err)
{
    failing_sink *fk = ctx;
    if (fk->left-- == 0)
        return ifd_error_set(err, IFD_EIO, "injected sink failure");
    return ifd_sink_write(fk->mem, json, len, err);
}

static const ifd_sink_ops fk_ops = {.write = fk_write};

/* ---- a hook that fails after n loops ---- */

static int fail_after_run(void *arg, ifd_run_context *ctx, ifd_error *err)
{
    int *left = arg;
    (void)ctx;
    if ((*left)-- == 0)
        return ifd_error_set(err, IFD_EINVAL, "injected hook failure");
    return IFD_OK;
}

START_TEST(injected_error_ends_the_run)
{
    injection inj = (injection)(_i % INJ_COUNT);
    ifd_rng rng;
    ifd_rng_seed(&rng, 300 + (uint64_t)_i);
    int baseline = tu_thread_count();

    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.program = inj == INJ_REPLICA ? "fault" : "softmax";
    cfg.settings.features = 1 + (int64_t)ifd_rng_below(&rng, 8);
    cfg.settings.classes = 2 + (int64_t)ifd_rng_below(&rng, 4);
    cfg.replicas = 1 + (int)ifd_rng_below(&rng, 4);
    cfg.batch_size = cfg.replicas * (1 + (int64_t)ifd_rng_below(&rng, 4));
    cfg.iterations_per_loop = 1 + (int64_t)ifd_rng_below(&rng, 5);
    cfg.steps = 1000000; /* only the error can end this run */
    cfg.summary_every = 1;
    int at = 2 + (int)ifd_rng_below(&rng, 6);

    ifd_program prog;
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&prog, "softmax", &cfg.settings, &err), IFD_OK);
    int nbatches = 40;
    tu_batch **bs = calloc((size_t)nbatches, sizeof *bs);
    for (int i = 0; i < nbatches; i++)
        bs[i] = tu_batch_random(&prog, cfg.batch_size, i, &rng);
    int64_t bad_row = (int64_t)ifd_rng_below(&rng, (uint64_t)cfg.batch_size);
    if (inj == INJ_LABEL)
        ((int32_t *)bs[at]->data[1])[bad_row] = (int32_t)cfg.settings.classes + 3;

    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create(&q, 2), IFD_OK);
    failing_source fs = {.inner = ifd_batch_queue_source(q), .left = at};
    ifd_batch_source src = ifd_batch_queue_source(q);
    if (inj == INJ_SOURCE)
        src = (ifd_batch_source){.ops = &fs_ops, .ctx = &fs};
    __atomic_store_n(&fault_countdown, at * cfg.replicas - 1, __ATOMIC_RELEASE);
    failing_sink fk = {.left = inj == INJ_SINK ? at : -1};
    ck_assert_int_eq(ifd_sink_memory_create(&fk.mem), IFD_OK);
    ifd_sink *sink, *log;
    ck_assert_int_eq(ifd_sink_create(&sink, &fk_ops, &fk), IFD_OK);
    ck_assert_int_eq(ifd_sink_memory_create(&log), IFD_OK);

    ifd_session *s;
    int rc = ifd_session_create(&s, &cfg, src, &err);
    ck_assert_msg(rc == IFD_OK, "%s", ifd_error_text(&err));
    ifd_session_add_sink(s, sink);
    ifd_session_add_sink(s, log);
    int hook_left = at;
    if (inj == INJ_HOOK) {
        ifd_hook h = {.name = "boom", .after_run = fail_after_run, .arg = &hook_left};
        ifd_session_add_hook(s, &h);
    }
    tu_producer *p = tu_producer_start(q, bs, nbatches, 1);

    int64_t t0 = ifd_clock_ns();
    rc = ifd_session_run(s, &err);
    double secs = (double)(ifd_clock_ns() - t0) * 1e-9;

    static const char *const expect_source[] = {"infeed: ", "infeed: ", "outfeed: ", "replica ",
                                                "hook boom: "};
    static const char *const expect_text[] = {"out of range", "injected source failure",
                                              "injected sink failure", "injected replica fault",
                                              "injected hook failure"};
    static const int expect_code[] = {IFD_ERANGE, IFD_EIO, IFD_EIO, IFD_ENUMERIC, IFD_EINVAL};
    ck_assert_msg(rc == expect_code[inj], "injection %d: rc %s: %s", inj, ifd_errname(rc),
                  ifd_error_text(&err));
    ck_assert_msg(strncmp(err.msg, expect_source[inj], strlen(expect_source[inj])) == 0,
                  "injection %d: cause '%s'", inj, err.msg);
    ck_assert_msg(strstr(err.msg, expect_text[inj]), "injection %d: cause '%s'", inj, err.msg);
    if (inj == INJ_LABEL) {
        char row[64];
        snprintf(row, sizeof row, "row %lld: label %d", (long long)bad_row,
                 (int)cfg.settings.classes + 3);
        ck_assert_msg(strstr(err.msg, row), "cause '%s' lacks '%s'", err.msg, row);
        snprintf(row, sizeof row, "batch %d from producer 'test'", at);
        ck_assert_msg(strstr(err.msg, row), "cause '%s' lacks '%s'", err.msg, row);
    }
    ck_assert_msg(secs < 5.0, "the run took %.2f s to stop", secs);
    ck_assert_int_eq(ifd_session_end_reason(s), IFD_END_ERROR);

    /* The end summary says error, with the cause. */
    size_t n = ifd_sink_memory_count(log);
    ck_assert_uint_gt(n, 0);
    char *last = ifd_sink_memory_get(log, n - 1);
    json_error_t je;
    json_t *end = json_loads(last, 0, &je);
    ck_assert_ptr_nonnull(end);
    ck_assert_str_eq(json_string_value(json_object_get(end, "event")), "end");
    ck_assert_str_eq(json_string_value(json_object_get(end, "status")), "error");
    ck_assert_str_eq(json_string_value(json_object_get(end, "error")), err.msg);
    json_decref(end);
    free(last);

    ifd_batch_queue_close(q);
    tu_producer_join(p);
    ifd_session_destroy(s);
    ifd_batch_queue_destroy(q);
    ifd_sink_destroy(sink);
    ifd_sink_destroy(fk.mem);
    ifd_sink_destroy(log);
    free(bs);
    ck_assert_int_eq(tu_thread_count_settle(baseline), baseline);
    ifd_program_free(&prog);
}
END_TEST

START_TEST(no_thread_left_after_a_good_run)
{
    int baseline = tu_thread_count();
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.settings.features = 3;
    cfg.settings.classes = 2;
    cfg.replicas = 3;
    cfg.batch_size = 6;
    cfg.steps = 5;
    ifd_program prog;
    ifd_error err;
    ifd_program_init(&prog, "softmax", &cfg.settings, &err);
    ifd_rng rng;
    ifd_rng_seed(&rng, 1);
    tu_batch *bs[5];
    for (int i = 0; i < 5; i++)
        bs[i] = tu_batch_random(&prog, 6, i, &rng);
    tu_result r;
    tu_run(&cfg, bs, 5, &r);
    ck_assert_int_eq(r.rc, IFD_OK);
    ck_assert_int_eq(r.released, 5);
    tu_result_free(&r);
    for (int i = 0; i < 5; i++)
        tu_batch_free(bs[i]);
    ck_assert_int_eq(tu_thread_count_settle(baseline), baseline);
    ifd_program_free(&prog);
}
END_TEST

int main(void)
{
    tu_register_softmax_like("fault", fault_step);
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("rendezvous");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, injected_error_ends_the_run, 0, 4 * INJ_COUNT);
    tcase_add_test(tc, no_thread_left_after_a_good_run);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
