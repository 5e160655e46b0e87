/* The cpu backend through the device vtable: back-pressure of the infeed ring, abort, the end of
 * the input mid-loop, outfeed records, and backend selection errors. */
#include "core/thread.h"
#include "device/device.h"
#include "tests/util/testutil.h"

#include <stdlib.h>
#include <string.h>

typedef struct fixture {
    ifd_program prog;
    ifd_device *dev;
    tu_batch *batches[64];
    int nbatches;
    int released;
} fixture;

static void fixture_open(fixture *f, int replicas, int depth, int64_t rows_per_replica)
{
    memset(f, 0, sizeof *f);
    ifd_program_settings st = {.features = 3, .classes = 2};
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&f->prog, "softmax", &st, &err), IFD_OK);
    ifd_device_config dc = {
        .replicas = replicas,
        .program = &f->prog,
        .max_shard_rows = rows_per_replica,
        .optimizer = {.kind = IFD_OPT_SGD, .learning_rate = 0.1f},
        .loss_scale = 1.0f / (float)replicas,
        .seed = 1,
        .infeed_depth = depth,
        .outfeed_depth = 64, /* the tests dequeue after the loop */
    };
    int rc = ifd_device_create(&f->dev, "cpu", &dc, &err);
    ck_assert_msg(rc == IFD_OK, "%s", ifd_error_text(&err));
    ifd_rng rng;
    ifd_rng_seed(&rng, 9);
    f->nbatches = 64;
    for (int i = 0; i < f->nbatches; i++) {
        f->batches[i] = tu_batch_random(&f->prog, rows_per_replica * replicas, i, &rng);
        f->batches[i]->released = &f->released;
        /* The test holds one reference so it can free the batches itself. */
        f->batches[i]->b.refs = 1;
        f->batches[i]->b.release = NULL;
    }
}

static void fixture_close(fixture *f)
{
    ifd_device_destroy(f->dev);
    ifd_program_free(&f->prog);
    for (int i = 0; i < f->nbatches; i++) {
        ck_assert_int_eq(f->batches[i]->b.refs, 1); /* every shard reference was dropped */
        tu_batch_free(f->batches[i]);
    }
}

static void push_batch(fixture *f, int i)
{
    int r = ifd_device_replicas(f->dev);
    ifd_batch *b = &f->batches[i]->b;
    for (int k = 0; k < r; k++) {
        ifd_shard sh = {.batch = b, .row0 = k * (b->rows / r), .rows = b->rows / r};
        ck_assert_int_eq(ifd_device_infeed_enqueue(f->dev, k, &sh), IFD_OK);
    }
}

typedef struct pusher {
    fixture *f;
    int n;
    int pushed; /* atomic */
    int last_rc;
} pusher;

static void *push_main(void *arg)
{
    pusher *p = arg;
    int r = ifd_device_replicas(p->f->dev);
    for (int i = 0; i < p->n; i++) {
        ifd_batch *b = &p->f->batches[i]->b;
        for (int k = 0; k < r; k++) {
            ifd_shard sh = {.batch = b, .row0 = k * (b->rows / r), .rows = b->rows / r};
            p->last_rc = ifd_device_infeed_enqueue(p->f->dev, k, &sh);
            if (p->last_rc)
                return NULL;
        }
        __atomic_add_fetch(&p->pushed, 1, __ATOMIC_RELEASE);
    }
    ifd_device_infeed_flush(p->f->dev);
    return NULL;
}

START_TEST(infeed_ring_applies_back_pressure)
{
    int depth = 1 + _i;
    fixture f;
    fixture_open(&f, 1 + _i % 3, depth, 2);
    pusher p = {.f = &f, .n = depth + 3};
    ifd_thread t;
    ifd_thread_start(&t, "pusher", push_main, &p);
    /* The ring holds depth shards per replica; the pusher then blocks on the next one. */
    for (int w = 0; w < 1000 && __atomic_load_n(&p.pushed, __ATOMIC_ACQUIRE) < depth; w++)
        ifd_sleep_ns(5 * 1000000);
    ifd_sleep_ns(50 * 1000000);
    ck_assert_int_eq(__atomic_load_n(&p.pushed, __ATOMIC_ACQUIRE), depth);
    /* Running steps drains the ring and unblocks it. */
    int64_t done;
    ifd_error err;
    ck_assert_int_eq(ifd_device_run_loop(f.dev, depth + 3, &done, &err), IFD_OK);
    ck_assert_int_eq(done, depth + 3);
    ifd_thread_join(&t);
    ck_assert_int_eq(p.pushed, depth + 3);
    ck_assert_int_eq(ifd_device_global_step(f.dev), depth + 3);
    /* Per-replica counters: every step counted, waits inside the loop time. */
    for (int r = 0; r < ifd_device_replicas(f.dev); r++) {
        ifd_device_stats st;
        ifd_device_stats_get(f.dev, r, &st);
        ck_assert_int_eq(st.steps, depth + 3);
        ck_assert_int_gt(st.loop_ns, 0);
        ck_assert_int_le(st.infeed_wait_ns + st.outfeed_wait_ns, st.loop_ns);
    }
    /* One outfeed record per replica per step, in step order. */
    for (int s = 1; s <= 4 && s <= depth + 3; s++) {
        for (int r = 0; r < ifd_device_replicas(f.dev); r++) {
            ifd_outfeed_rec rec;
            ck_assert_int_eq(ifd_device_outfeed_dequeue(f.dev, r, &rec), IFD_OK);
            ck_assert_int_eq(rec.step, s);
            ck_assert_float_eq(rec.out.count, 2.0f);
        }
    }
    fixture_close(&f);
}
END_TEST

START_TEST(abort_unblocks_everyone)
{
    fixture f;
    fixture_open(&f, 2, 1, 1);
    pusher p = {.f = &f, .n = 10};
    ifd_thread t;
    ifd_thread_start(&t, "pusher", push_main, &p);
    ifd_sleep_ns(50 * 1000000);
    ifd_device_abort(f.dev);
    ifd_thread_join(&t);
    ck_assert_int_eq(p.last_rc, IFD_ESTOPPED);
    int64_t done;
    ifd_error err;
    ck_assert_int_eq(ifd_device_run_loop(f.dev, 3, &done, &err), IFD_ESTOPPED);
    ifd_outfeed_rec rec;
    ck_assert_int_eq(ifd_device_outfeed_dequeue(f.dev, 0, &rec), IFD_ESTOPPED);
    fixture_close(&f);
}
END_TEST

START_TEST(input_end_mid_loop)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, 50 + (uint64_t)_i);
    int replicas = 1 + (int)ifd_rng_below(&rng, 4);
    fixture f;
    fixture_open(&f, replicas, 64, 1 + (int64_t)ifd_rng_below(&rng, 3));
    int have = (int)ifd_rng_below(&rng, 10);
    for (int i = 0; i < have; i++)
        push_batch(&f, i);
    ifd_device_infeed_end(f.dev);
    int64_t done;
    ifd_error err;
    ck_assert_int_eq(ifd_device_run_loop(f.dev, 10, &done, &err), IFD_EEOF);
    ck_assert_int_eq(done, have);
    ck_assert_int_eq(ifd_device_global_step(f.dev), have);
    for (int r = 0; r < replicas; r++) {
        ifd_outfeed_rec rec;
        for (int s = 0; s < have; s++)
            ck_assert_int_eq(ifd_device_outfeed_dequeue(f.dev, r, &rec), IFD_OK);
        ck_assert_int_eq(ifd_device_outfeed_dequeue(f.dev, r, &rec), IFD_EEOF);
    }
    fixture_close(&f);
}
END_TEST

START_TEST(unconsumed_shards_are_released_at_close)
{
    fixture f;
    fixture_open(&f, 3, 8, 1);
    for (int i = 0; i < 5; i++)
        push_batch(&f, i);
    ck_assert_int_eq(f.batches[0]->b.refs, 1 + 3);
    fixture_close(&f); /* asserts refs are back to 1 */
}
END_TEST

START_TEST(backend_selection)
{
    ifd_program prog;
    ifd_program_settings st = {.features = 2, .classes = 2};
    ifd_error err;
    ifd_program_init(&prog, "softmax", &st, &err);
    ifd_device_config dc = {.replicas = 1,
                            .program = &prog,
                            .max_shard_rows = 1,
                            .infeed_depth = 1,
                            .outfeed_depth = 1};
    ifd_device *dev;
    ck_assert_int_eq(ifd_device_create(&dev, "tpu", &dc, &err), IFD_EINVAL);
    ck_assert_ptr_null(dev);
    ck_assert_msg(strstr(err.msg, "'tpu'") && strstr(err.msg, "cpu"), "%s", err.msg);
    /* cuda: not built (ENOTSUP), built without a usable GPU (ECUDA), or opened. */
    int crc = ifd_device_create(&dev, "cuda", &dc, &err);
    ck_assert_msg(crc == IFD_ENOTSUP || crc == IFD_ECUDA || crc == IFD_OK, "cuda: %s", err.msg);
    if (crc == IFD_OK)
        ifd_device_destroy(dev);
    else
        ck_assert_ptr_nonnull(strstr(err.msg, "cuda"));
    ck_assert_int_eq(ifd_device_create(&dev, "cpu", &dc, &err), IFD_OK);
    float p[8];
    ck_assert_int_eq(ifd_device_read_params(dev, 1, p, &err), IFD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "got 1"));
    ifd_device_destroy(dev);
    ifd_program_free(&prog);
}
END_TEST

/* A program whose step fails with a chosen code on its first call, on one replica only. */
static int fail_code;
static int fail_calls; /* atomic */

static int failing_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                        ifd_error *err)
{
    if (__atomic_fetch_add(&fail_calls, 1, __ATOMIC_ACQ_REL) == 0)
        return ifd_error_set(err, fail_code, "injected");
    return tu_softmax_step(p, ops, a, err);
}

START_TEST(replica_error_stops_peers_without_a_listener)
{
    /* No on_error callback: the failing replica still breaks the all-reduce its peers wait in,
     * and a program returning a code reserved for the runtime gets IFD_EINTERNAL. */
    static const int codes[] = {IFD_ENUMERIC, IFD_ECANCELED, IFD_ESTOPPED, IFD_EEOF};
    fail_code = codes[_i % 4];
    __atomic_store_n(&fail_calls, 0, __ATOMIC_RELEASE);
    ifd_program prog;
    ifd_program_settings st = {.features = 3, .classes = 2};
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&prog, "failing", &st, &err), IFD_OK);
    int replicas = 2 + _i % 3;
    ifd_device_config dc = {
        .replicas = replicas,
        .program = &prog,
        .max_shard_rows = 1,
        .optimizer = {.kind = IFD_OPT_SGD, .learning_rate = 0.1f},
        .loss_scale = 1.0f,
        .infeed_depth = 4,
        .outfeed_depth = 4,
    };
    ifd_device *dev;
    ck_assert_int_eq(ifd_device_create(&dev, "cpu", &dc, &err), IFD_OK);
    ifd_rng rng;
    ifd_rng_seed(&rng, 3);
    tu_batch *tb = tu_batch_random(&prog, replicas, 0, &rng);
    tb->b.refs = 1;
    tb->b.release = NULL;
    for (int r = 0; r < replicas; r++) {
        ifd_shard sh = {.batch = &tb->b, .row0 = r, .rows = 1};
        ck_assert_int_eq(ifd_device_infeed_enqueue(dev, r, &sh), IFD_OK);
    }
    ifd_device_infeed_flush(dev);
    int64_t t0 = ifd_clock_ns(), done;
    int rc = ifd_device_run_loop(dev, 3, &done, &err);
    ck_assert_msg(ifd_clock_ns() - t0 < 5000000000ll, "run_loop took more than 5 s");
    int want = fail_code == IFD_ENUMERIC ? IFD_ENUMERIC : IFD_EINTERNAL;
    ck_assert_msg(rc == want, "code %s: run_loop gave %s: %s", ifd_errname(fail_code),
                  ifd_errname(rc), err.msg);
    if (want == IFD_EINTERNAL)
        ck_assert_msg(strstr(err.msg, "failing") && strstr(err.msg, ifd_errname(fail_code)), "%s",
                      err.msg);
    ifd_device_destroy(dev);
    ck_assert_int_eq(tb->b.refs, 1);
    tu_batch_free(tb);
    ifd_program_free(&prog);
}
END_TEST

int main(void)
{
    tu_register_softmax_like("failing", failing_step);
    Suite *s = suite_create("device");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, infeed_ring_applies_back_pressure, 0, 4);
    tcase_add_test(tc, abort_unblocks_everyone);
    tcase_add_loop_test(tc, input_end_mid_loop, 0, 8);
    tcase_add_test(tc, unconsumed_shards_are_released_at_close);
    tcase_add_test(tc, backend_selection);
    tcase_add_loop_test(tc, replica_error_stops_peers_without_a_listener, 0, 8);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
