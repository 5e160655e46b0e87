/* Batch checks against the program and per-host sharding. */
#include "infeed/infeed_internal.h"
#include "tests/util/testutil.h"

#include <stdlib.h>
#include <string.h>

static void softmax(ifd_program *p, int64_t d, int64_t k)
{
    ifd_program_settings st = {.features = d, .classes = k};
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(p, "softmax", &st, &err), IFD_OK);
}

START_TEST(check_accepts_a_good_batch)
{
    ifd_program p;
    softmax(&p, 6, 3);
    ifd_rng rng;
    ifd_rng_seed(&rng, 1);
    tu_batch *tb = tu_batch_random(&p, 8, 0, &rng);
    ifd_error err;
    ck_assert_int_eq(ifd_infeed_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_OK);
    ck_assert_int_eq(ifd_infeed_check_batch(&p, &tb->b, 0, IFD_MODE_TRAIN, &err), IFD_OK);
    tu_batch_free(tb);
}
END_TEST

START_TEST(check_names_what_is_wrong)
{
    ifd_program p;
    softmax(&p, 6, 3);
    ifd_rng rng;
    ifd_rng_seed(&rng, 2);
    ifd_error err;
    tu_batch *tb = tu_batch_random(&p, 8, 0, &rng);

    ck_assert_int_eq(ifd_infeed_check_batch(&p, &tb->b, 16, IFD_MODE_TRAIN, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "8 rows") && strstr(err.msg, "16"), "%s", err.msg);

    tb->b.tensors[0].dtype = IFD_I32;
    ck_assert_int_eq(ifd_infeed_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_EDTYPE);
    ck_assert_msg(strstr(err.msg, "'x'") && strstr(err.msg, "int32") && strstr(err.msg, "float32"),
                  "%s", err.msg);
    tb->b.tensors[0].dtype = IFD_F32;

    tb->b.tensors[0].shape.dims[1] = 5;
    ck_assert_int_eq(ifd_infeed_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "'x'") && strstr(err.msg, "[8, 5]") && strstr(err.msg, "[8, 6]"),
                  "%s", err.msg);
    tb->b.tensors[0].shape.dims[1] = 6;

    tb->b.tensors[1].shape.dims[0] = 7;
    ck_assert_int_eq(ifd_infeed_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "'y'") && strstr(err.msg, "[7]"), "%s", err.msg);
    tb->b.tensors[1].shape.dims[0] = 8;

    tb->b.ntensors = 1;
    ck_assert_int_eq(ifd_infeed_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "1 tensors") && strstr(err.msg, "takes 2"), "%s", err.msg);
    tb->b.ntensors = 2;

    ((int32_t *)tb->data[1])[5] = -1;
    ck_assert_int_eq(ifd_infeed_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_ERANGE);
    ck_assert_msg(strstr(err.msg, "row 5") && strstr(err.msg, "label -1"), "%s", err.msg);
    tu_batch_free(tb);
}
END_TEST

START_TEST(per_host_shards_are_views)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, 100 + (uint64_t)_i);
    int replicas = 1 + (int)ifd_rng_below(&rng, 8);
    int64_t per = 1 + (int64_t)ifd_rng_below(&rng, 9);
    ifd_program p;
    softmax(&p, 1 + (int64_t)ifd_rng_below(&rng, 7), 2 + (int64_t)ifd_rng_below(&rng, 5));
    tu_batch *tb = tu_batch_random(&p, per * replicas, 0, &rng);
    ifd_shard shards[8];
    ifd_error err;
    ck_assert_int_eq(ifd_shard_batch(IFD_INPUT_PER_HOST, &tb->b, replicas, shards, &err), IFD_OK);
    int64_t next = 0;
    for (int r = 0; r < replicas; r++) {
        ck_assert_ptr_eq(shards[r].batch, &tb->b);
        ck_assert_int_eq(shards[r].row0, next);
        ck_assert_int_eq(shards[r].rows, per);
        next += per;
        for (int t = 0; t < p.ninputs; t++) {
            ifd_tensor v;
            ck_assert_int_eq(ifd_tensor_rows(&tb->b.tensors[t], shards[r].row0,
                                             shards[r].row0 + shards[r].rows, &v),
                             IFD_OK);
            /* No copy: the view points into the batch's own bytes. */
            ck_assert_ptr_eq(v.data, (char *)tb->data[t] +
                                         (size_t)shards[r].row0 * ifd_tensor_row_bytes(&v));
            ck_assert_int_eq(v.shape.dims[0], per);
        }
    }
    ck_assert_int_eq(next, tb->b.rows);
    tu_batch_free(tb);
}
END_TEST

START_TEST(per_host_rejects_uneven_batches)
{
    ifd_program p;
    softmax(&p, 2, 2);
    ifd_rng rng;
    ifd_rng_seed(&rng, 3);
    tu_batch *tb = tu_batch_random(&p, 10, 0, &rng);
    ifd_shard shards[4];
    ifd_error err;
    ck_assert_int_eq(ifd_shard_batch(IFD_INPUT_PER_HOST, &tb->b, 4, shards, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "10 rows") && strstr(err.msg, "4 replicas"), "%s", err.msg);
    ck_assert_int_eq(ifd_shard_batch(IFD_INPUT_BROADCAST, &tb->b, 2, shards, &err), IFD_ENOTSUP);
    ck_assert_ptr_nonnull(strstr(err.msg, "broadcast"));
    tu_batch_free(tb);
}
END_TEST

START_TEST(batch_queue_source)
{
    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create(&q, 2), IFD_OK);
    ifd_batch_source src = ifd_batch_queue_source(q);
    ifd_program p;
    softmax(&p, 2, 2);
    ifd_rng rng;
    ifd_rng_seed(&rng, 4);
    int released = 0;
    tu_batch *a = tu_batch_random(&p, 2, 0, &rng), *b = tu_batch_random(&p, 2, 1, &rng);
    a->released = b->released = &released;
    ck_assert_int_eq(ifd_batch_queue_push(q, &a->b), IFD_OK);
    ck_assert_int_eq(ifd_batch_queue_push(q, &b->b), IFD_OK);
    ck_assert_uint_eq(ifd_batch_queue_len(q), 2);
    ifd_batch *got;
    ifd_error err;
    ck_assert_int_eq(src.ops->next(src.ctx, &got, &err), IFD_OK);
    ck_assert_ptr_eq(got, &a->b);
    ifd_batch_queue_close(q);
    tu_batch *c = tu_batch_random(&p, 2, 2, &rng);
    ck_assert_int_eq(ifd_batch_queue_push(q, &c->b), IFD_ECLOSED);
    tu_batch_free(c);
    ck_assert_int_eq(src.ops->next(src.ctx, &got, &err), IFD_OK);
    ck_assert_ptr_eq(got, &b->b);
    ck_assert_int_eq(src.ops->next(src.ctx, &got, &err), IFD_EEOF);
    tu_batch_free(a);
    tu_batch_free(b);
    ifd_batch_queue_destroy(q);

    /* Destroying a queue releases the batches left inside; abort wakes a blocked next. */
    ck_assert_int_eq(ifd_batch_queue_create(&q, 2), IFD_OK);
    a = tu_batch_random(&p, 2, 0, &rng);
    a->released = &released;
    ifd_batch_queue_push(q, &a->b);
    ifd_batch_queue_destroy(q);
    ck_assert_int_eq(released, 1);
    ck_assert_int_eq(ifd_batch_queue_create(&q, 2), IFD_OK);
    src = ifd_batch_queue_source(q);
    src.ops->abort(src.ctx);
    ck_assert_int_eq(src.ops->next(src.ctx, &got, &err), IFD_ESTOPPED);
    ifd_batch_queue_destroy(q);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("infeed");
    TCase *tc = tcase_create("infeed");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, check_accepts_a_good_batch);
    tcase_add_test(tc, check_names_what_is_wrong);
    tcase_add_loop_test(tc, per_host_shards_are_views, 0, 20);
    tcase_add_test(tc, per_host_rejects_uneven_batches);
    tcase_add_test(tc, batch_queue_source);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
