/* The eval set of evaluation during training (host/eval_set.c): copies kept in arrival order and
 * replayed as a batch source, the --eval-memory bound and its sentence, and a wait that a
 * producer's END or a close wakes. */
#include "core/batch.h"
#include "core/thread.h"
#include "host/eval_set.h"
#include "tests/util/testutil.h"

#include <stdlib.h>
#include <string.h>

/* A random step batch: x float32 [rows, d], y int32 [rows]. */
typedef struct rbatch {
    int64_t rows, d;
    float *x;
    int32_t *y;
    ifd_tensor t[2];
} rbatch;

static void rbatch_make(rbatch *b, ifd_rng *rng, int64_t rows, int64_t d)
{
    b->rows = rows;
    b->d = d;
    b->x = malloc((size_t)(rows * d) * sizeof *b->x);
    b->y = malloc((size_t)rows * sizeof *b->y);
    for (int64_t i = 0; i < rows * d; i++)
        b->x[i] = (float)rand_between(rng, -1000, 1000) / 7.0f;
    for (int64_t i = 0; i < rows; i++)
        b->y[i] = (int32_t)rand_between(rng, 0, 9);
    int64_t dx[2] = {rows, d}, dy[1] = {rows};
    ck_assert_int_eq(ifd_tensor_init(&b->t[0], IFD_F32, 2, dx, b->x), IFD_OK);
    ck_assert_int_eq(ifd_tensor_init(&b->t[1], IFD_I32, 1, dy, b->y), IFD_OK);
}

static int64_t up64(int64_t n)
{
    return (n + 63) / 64 * 64;
}

/* What the bound charges it: each tensor rounded up to 64 bytes, and the bookkeeping. */
static int64_t rbatch_bytes(const rbatch *b)
{
    return up64(b->rows * b->d * 4) + up64(b->rows * 4) + IFD_EVAL_BATCH_OVERHEAD;
}

static void rbatch_free(rbatch *b)
{
    free(b->x);
    free(b->y);
}

/* The batches come back in arrival order, as copies (the originals may change after the add),
 * then IFD_EEOF; an abort makes next IFD_ESTOPPED. */
START_TEST(test_replay_in_arrival_order)
{
    ifd_rng rng;
    seed_rng(&rng);
    int n = (int)rand_between(&rng, 1, 12);
    int64_t d = rand_between(&rng, 1, 9);
    rbatch b[12];
    ifd_eval_set *e;
    ck_assert_int_eq(ifd_eval_set_create(&e, INT64_MAX), IFD_OK);
    ifd_error err;
    RC_OK(ifd_eval_set_join(e, "ev", &err), err);
    int64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        rbatch_make(&b[i], &rng, rand_between(&rng, 1, 17), d);
        RC_OK(ifd_eval_set_add(e, b[i].t, 2, b[i].rows, "ev", i, &err), err);
        bytes += rbatch_bytes(&b[i]);
    }
    ck_assert_int_eq(ifd_eval_set_bytes(e), bytes);
    ifd_eval_set_end(e);
    int64_t got = -1;
    RC_OK(ifd_eval_set_wait(e, 5, &got, &err), err);
    ck_assert_int_eq(got, n);
    /* the set holds copies: what the producer's buffers hold later does not matter */
    float *x0 = malloc((size_t)(b[0].rows * d) * sizeof *x0);
    memcpy(x0, b[0].x, (size_t)(b[0].rows * d) * sizeof *x0);
    b[0].x[0] += 1.0f;
    for (int round = 0; round < 2; round++) { /* every eval replays the whole set */
        ifd_eval_replay *r;
        RC_OK(ifd_eval_replay_create(&r, e, &err), err);
        ifd_batch_source src = ifd_eval_replay_source(r);
        for (int i = 0; i < n; i++) {
            ifd_batch *out;
            RC_OK(src.ops->next(src.ctx, &out, &err), err);
            ck_assert_int_eq(out->rows, b[i].rows);
            ck_assert_int_eq(out->ntensors, 2);
            const float *want = i == 0 ? x0 : b[i].x;
            RASSERT(memcmp(out->tensors[0].data, want, (size_t)(b[i].rows * d) * 4) == 0,
                    "batch %d: x differs", i);
            RASSERT(memcmp(out->tensors[1].data, b[i].y, (size_t)b[i].rows * 4) == 0,
                    "batch %d: y differs", i);
            ck_assert_int_eq(out->tensors[0].shape.dims[1], d);
            out->release(out, out->release_arg);
        }
        ifd_batch *out;
        ck_assert_int_eq(src.ops->try_next(src.ctx, &out, &err), IFD_EEOF);
        src.ops->abort(src.ctx);
        ck_assert_int_eq(src.ops->next(src.ctx, &out, &err), IFD_ESTOPPED);
        ifd_eval_replay_destroy(r);
    }
    free(x0);
    for (int i = 0; i < n; i++)
        rbatch_free(&b[i]);
    ifd_eval_set_destroy(e);
}
END_TEST

/* Several hosts: a replay padded to more batches than the set holds hands out the set's
 * batches, then padding batches of the rows asked for, shaped as the program's eval inputs, of
 * zeros, all padding (IFD_BATCH_PADDED, no valid row, checked), freed on their release (the
 * sanitizer builds check), then IFD_EEOF. An empty set pads from the first batch. */
START_TEST(test_replay_pads_to_the_agreed_batches)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_program_settings st = {.features = rand_between(&rng, 1, 9),
                               .classes = rand_between(&rng, 2, 6)};
    ifd_program p;
    ifd_error err;
    RC_OK(ifd_program_init(&p, "softmax", &st, &err), err);
    int n = (int)rand_between(&rng, 0, 5), pad = (int)rand_between(&rng, 1, 6);
    int64_t rows = rand_between(&rng, 1, 17);
    rbatch b[5];
    ifd_eval_set *e;
    ck_assert_int_eq(ifd_eval_set_create(&e, INT64_MAX), IFD_OK);
    RC_OK(ifd_eval_set_join(e, "ev", &err), err);
    for (int i = 0; i < n; i++) {
        rbatch_make(&b[i], &rng, rows, st.features);
        RC_OK(ifd_eval_set_add(e, b[i].t, 2, rows, "ev", i, &err), err);
    }
    ifd_eval_set_end(e);
    ifd_eval_replay *r;
    RC_OK(ifd_eval_replay_create(&r, e, &err), err);
    ifd_eval_replay_pad(r, &p, rows, n + pad);
    ifd_batch_source src = ifd_eval_replay_source(r);
    for (int i = 0; i < n + pad; i++) {
        ifd_batch *out;
        RC_OK(i % 2 ? src.ops->next(src.ctx, &out, &err) : src.ops->try_next(src.ctx, &out, &err),
              err);
        ck_assert_int_eq(out->rows, rows);
        ck_assert_int_eq(out->ntensors, 2);
        if (i < n) {
            ck_assert(!(out->flags & IFD_BATCH_PADDED));
            RASSERT(memcmp(out->tensors[0].data, b[i].x, (size_t)(rows * st.features) * 4) == 0,
                    "batch %d: x differs", i);
        } else {
            ck_assert_uint_eq(out->flags, IFD_BATCH_PADDED | IFD_BATCH_CHECKED);
            ck_assert_int_eq(out->valid_rows, 0);
            ck_assert_int_eq(out->tensors[0].dtype, IFD_F32);
            ck_assert_int_eq(out->tensors[0].shape.dims[0], rows);
            ck_assert_int_eq(out->tensors[0].shape.dims[1], st.features);
            ck_assert_int_eq(out->tensors[1].dtype, IFD_I32);
            const float *x = out->tensors[0].data;
            const int32_t *y = out->tensors[1].data;
            for (int64_t k = 0; k < rows * st.features; k++)
                RASSERT(x[k] == 0.0f, "padding %d: x[%lld] = %g", i, (long long)k, (double)x[k]);
            for (int64_t k = 0; k < rows; k++)
                RASSERT(y[k] == 0, "padding %d: y[%lld] = %d", i, (long long)k, y[k]);
        }
        ifd_batch_ref(out, 1); /* as the infeed does: the last unref releases it */
        ifd_batch_unref(out);
    }
    ifd_batch *out;
    ck_assert_int_eq(src.ops->next(src.ctx, &out, &err), IFD_EEOF);
    ifd_eval_replay_destroy(r);
    for (int i = 0; i < n; i++)
        rbatch_free(&b[i]);
    ifd_eval_set_destroy(e);
    ifd_program_free(&p);
}
END_TEST

/* A batch over the bound is refused with a sentence naming the flag, the bound, the bytes held
 * and the batch's size; the set is then refused for the rest of the run. */
START_TEST(test_bound_refuses_with_the_sentence)
{
    ifd_rng rng;
    seed_rng(&rng);
    int64_t d = rand_between(&rng, 1, 9), rows = rand_between(&rng, 1, 20);
    int fit = (int)rand_between(&rng, 0, 4);
    int64_t one = up64(rows * d * 4) + up64(rows * 4) + IFD_EVAL_BATCH_OVERHEAD;
    int64_t bound = fit * one + rand_between(&rng, 0, one - 1);
    if (bound == 0)
        bound = 1;
    ifd_eval_set *e;
    ck_assert_int_eq(ifd_eval_set_create(&e, bound), IFD_OK);
    ifd_error err;
    RC_OK(ifd_eval_set_join(e, "held-out", &err), err);
    rbatch b;
    rbatch_make(&b, &rng, rows, d);
    for (int i = 0; i < fit; i++)
        RC_OK(ifd_eval_set_add(e, b.t, 2, rows, "held-out", i, &err), err);
    ifd_error_clear(&err);
    ck_assert_int_eq(ifd_eval_set_add(e, b.t, 2, rows, "held-out", fit, &err), IFD_ERANGE);
    char want[256];
    snprintf(want, sizeof want,
             "the eval set does not fit in --eval-memory (%lld bytes): it holds %lld bytes in %d "
             "batches and this batch takes %lld bytes (its tensors, each rounded up to 64 bytes, "
             "and 2048 for its bookkeeping)",
             (long long)bound, (long long)(fit * one), fit, (long long)one);
    RASSERT(strstr(err.msg, want), "'%s' lacks '%s'", err.msg, want);
    ck_assert_int_eq(ifd_eval_set_bytes(e), fit * one);
    ifd_eval_set_state st;
    char why[IFD_ERROR_MSG_MAX];
    ifd_eval_set_get_state(e, &st, why, sizeof why);
    ck_assert_int_eq(st.batches, fit);
    ck_assert_int_eq(st.max_bytes, bound);
    ck_assert_int_eq(st.complete, 0);
    RASSERT(strstr(why, "--eval-memory"), "state's why: '%s'", why);
    ifd_eval_set_end(e);
    ifd_eval_set_get_state(e, &st, why, sizeof why);
    ck_assert_int_eq(st.ended, 1);
    ck_assert_int_eq(st.complete, 0); /* every producer ended, but a batch is missing */
    int64_t n = -1;
    ck_assert_int_eq(ifd_eval_set_wait(e, 3, &n, &err), IFD_ERANGE);
    snprintf(want, sizeof want, "batch %d from eval producer 'held-out' was refused", fit);
    RASSERT(strstr(err.msg, want) && strstr(err.msg, "--eval-memory"), "wait: '%s'", err.msg);
    rbatch_free(&b);
    ifd_eval_set_destroy(e);
}
END_TEST

typedef struct waiter {
    ifd_eval_set *e;
    int rc;
    int64_t n;
    ifd_error err;
    ifd_thread t;
} waiter;

static void *wait_main(void *arg)
{
    waiter *w = arg;
    w->rc = ifd_eval_set_wait(w->e, 1, &w->n, &w->err);
    return NULL;
}

/* A wait blocks until every eval producer joined has sent END: while one has not, the set is
 * not complete (a new producer may still join); the last END wakes the waiter with the count. */
START_TEST(test_wait_wakes_on_the_last_end)
{
    ifd_rng rng;
    seed_rng(&rng);
    int k = (int)rand_between(&rng, 1, 4);
    ifd_eval_set *e;
    ck_assert_int_eq(ifd_eval_set_create(&e, INT64_MAX), IFD_OK);
    waiter w = {.e = e, .rc = -1};
    ck_assert_int_eq(ifd_thread_start(&w.t, "ifd-waiter", wait_main, &w), IFD_OK);
    ifd_error err;
    rbatch b;
    rbatch_make(&b, &rng, rand_between(&rng, 1, 5), 3);
    int added = 0;
    for (int i = 0; i < k; i++) {
        char name[16];
        snprintf(name, sizeof name, "ev%d", i);
        RC_OK(ifd_eval_set_join(e, name, &err), err);
        int m = (int)rand_between(&rng, 0, 3);
        for (int j = 0; j < m; j++, added++)
            RC_OK(ifd_eval_set_add(e, b.t, 2, b.rows, name, j, &err), err);
    }
    for (int i = 0; i < k - 1; i++)
        ifd_eval_set_end(e);
    /* not complete yet: one more producer may join (and must end too) */
    RC_OK(ifd_eval_set_join(e, "late", &err), err);
    ifd_eval_set_end(e);
    ifd_eval_set_end(e);
    ifd_thread_join(&w.t);
    RC_OK(w.rc, w.err);
    ck_assert_int_eq(w.n, added);
    ifd_eval_set_state st;
    char why[IFD_ERROR_MSG_MAX];
    ifd_eval_set_get_state(e, &st, why, sizeof why);
    ck_assert_int_eq(st.complete, 1);
    ck_assert_int_eq(st.producers, k + 1);
    ck_assert_int_eq(st.ended, k + 1);
    ck_assert_int_eq(st.batches, added);
    ck_assert_str_eq(why, "");
    /* complete: the set is sent once */
    ck_assert_int_eq(ifd_eval_set_join(e, "again", &err), IFD_ECLOSED);
    RASSERT(strstr(err.msg, "the eval set is complete"), "%s", err.msg);
    rbatch_free(&b);
    ifd_eval_set_destroy(e);
}
END_TEST

/* An eval producer that leaves without END (timed out, its slot given away) makes the set
 * incomplete: a wait returns IFD_ERANGE naming it, also when the others ended. */
START_TEST(test_abandon_wakes_the_wait)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_eval_set *e;
    ck_assert_int_eq(ifd_eval_set_create(&e, INT64_MAX), IFD_OK);
    ifd_error err;
    int k = (int)rand_between(&rng, 1, 3);
    for (int i = 0; i < k; i++)
        RC_OK(ifd_eval_set_join(e, "ev", &err), err);
    waiter w = {.e = e, .rc = -1};
    ck_assert_int_eq(ifd_thread_start(&w.t, "ifd-waiter", wait_main, &w), IFD_OK);
    for (int i = 0; i < k - 1; i++)
        ifd_eval_set_end(e);
    ifd_eval_set_abandon(e, "slow-ev", "timed out (producer_timeout)");
    ifd_thread_join(&w.t);
    ck_assert_int_eq(w.rc, IFD_ERANGE);
    RASSERT(strstr(w.err.msg, "eval producer 'slow-ev' timed out (producer_timeout) before its "
                              "END: the eval set is incomplete"),
            "%s", w.err.msg);
    ifd_eval_set_destroy(e);
}
END_TEST

/* A stop closes the set: a wait (no producer yet, or one that has not ended) returns ECLOSED, and
 * no producer or batch is taken after it. */
START_TEST(test_close_wakes_the_wait)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_eval_set *e;
    ck_assert_int_eq(ifd_eval_set_create(&e, INT64_MAX), IFD_OK);
    ifd_error err;
    int joined = (int)rand_between(&rng, 0, 1);
    if (joined)
        RC_OK(ifd_eval_set_join(e, "ev", &err), err);
    waiter w = {.e = e, .rc = -1};
    ck_assert_int_eq(ifd_thread_start(&w.t, "ifd-waiter", wait_main, &w), IFD_OK);
    ifd_eval_set_close(e);
    ifd_thread_join(&w.t);
    ck_assert_int_eq(w.rc, IFD_ECLOSED);
    RASSERT(strstr(w.err.msg, "the eval set is not complete"), "%s", w.err.msg);
    ck_assert_int_eq(ifd_eval_set_join(e, "late", &err), IFD_ECLOSED);
    rbatch b;
    rbatch_make(&b, &rng, 2, 2);
    ck_assert_int_eq(ifd_eval_set_add(e, b.t, 2, 2, "ev", 0, &err), IFD_ECLOSED);
    rbatch_free(&b);
    ifd_eval_set_destroy(e);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("eval_set");
    TCase *tc = tu_tcase(s, "eval_set", 30);
    tcase_add_loop_test(tc, test_replay_in_arrival_order, 0, 10);
    tcase_add_loop_test(tc, test_replay_pads_to_the_agreed_batches, 0, 10);
    tcase_add_loop_test(tc, test_bound_refuses_with_the_sentence, 0, 10);
    tcase_add_loop_test(tc, test_wait_wakes_on_the_last_end, 0, 10);
    tcase_add_loop_test(tc, test_close_wakes_the_wait, 0, 10);
    tcase_add_loop_test(tc, test_abandon_wakes_the_wait, 0, 10);
    return tu_run_suite(s);
}
