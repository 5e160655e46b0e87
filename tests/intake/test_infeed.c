/* Batch checks against the program and per-host sharding. */
#include "core/batch.h"
#include "device/batch_check.h"
#include "intake/inputs.h"
#include "intake/shard.h"
#include "tests/util/testutil.h"

#include <float.h>
#include <math.h>
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
    ck_assert_int_eq(ifd_program_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_OK);
    ck_assert_int_eq(ifd_program_check_batch(&p, &tb->b, 0, IFD_MODE_TRAIN, &err), IFD_OK);
    tu_batch_free(tb);
    ifd_program_free(&p);
}
END_TEST

/* Predict's padding copies a partial batch into memory of its own: the copy is padded and is
 * no longer in the source's registered host memory (IFD_BATCH_PINNED, a shared-memory pool),
 * whatever other flags it keeps. */
START_TEST(padding_copies_and_drops_the_pinned_flag)
{
    ifd_program p;
    ifd_rng rng;
    seed_rng(&rng);
    int64_t f = rand_between(&rng, 1, 9), rows = rand_between(&rng, 1, 7);
    softmax(&p, f, 3);
    tu_batch *tb = tu_batch_random(&p, rows, 5, &rng);
    tb->b.ntensors = 1; /* predict mode reads x only */
    tb->b.flags = IFD_BATCH_PINNED;
    ifd_batch *padded;
    ifd_error err;
    int64_t full = rows + rand_between(&rng, 1, 5);
    ck_assert_int_eq(ifd_infeed_pad_batch(&p, IFD_MODE_PREDICT, &tb->b, full, &padded, &err),
                     IFD_OK);
    ck_assert_uint_eq(padded->flags, IFD_BATCH_PADDED);
    ck_assert_int_eq(padded->rows, full);
    ck_assert_int_eq(padded->valid_rows, rows);
    ck_assert_ptr_ne(padded->tensors[0].data, tb->b.tensors[0].data);
    ck_assert_int_eq(
        memcmp(padded->tensors[0].data, tb->b.tensors[0].data, (size_t)(rows * f) * sizeof(float)),
        0);
    ifd_batch_unref(padded); /* releases tb with it (tu_batch's release frees it) */
    ifd_program_free(&p);
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

    ck_assert_int_eq(ifd_program_check_batch(&p, &tb->b, 16, IFD_MODE_TRAIN, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "8 rows") && strstr(err.msg, "16"), "%s", err.msg);

    tb->b.tensors[0].dtype = IFD_I32;
    ck_assert_int_eq(ifd_program_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_EDTYPE);
    ck_assert_msg(strstr(err.msg, "'x'") && strstr(err.msg, "int32") && strstr(err.msg, "float32"),
                  "%s", err.msg);
    tb->b.tensors[0].dtype = IFD_F32;

    tb->b.tensors[0].shape.dims[1] = 5;
    ck_assert_int_eq(ifd_program_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "'x'") && strstr(err.msg, "[8, 5]") && strstr(err.msg, "[8, 6]"),
                  "%s", err.msg);
    tb->b.tensors[0].shape.dims[1] = 6;

    tb->b.tensors[1].shape.dims[0] = 7;
    ck_assert_int_eq(ifd_program_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "'y'") && strstr(err.msg, "[7]"), "%s", err.msg);
    tb->b.tensors[1].shape.dims[0] = 8;

    tb->b.ntensors = 1;
    ck_assert_int_eq(ifd_program_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "1 tensors") && strstr(err.msg, "takes 2"), "%s", err.msg);
    tb->b.ntensors = 2;

    ((int32_t *)tb->data[1])[5] = -1;
    ck_assert_int_eq(ifd_program_check_batch(&p, &tb->b, 8, IFD_MODE_TRAIN, &err), IFD_ERANGE);
    ck_assert_msg(strstr(err.msg, "row 5") && strstr(err.msg, "label -1"), "%s", err.msg);
    tu_batch_free(tb);
    ifd_program_free(&p);
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
    ifd_batch *b = &tb->b;
    ck_assert_int_eq(ifd_shard_step(IFD_INPUT_PER_HOST, &b, 1, replicas, shards, &err), IFD_OK);
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
    ifd_program_free(&p);
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
    ifd_batch *b = &tb->b;
    ck_assert_int_eq(ifd_shard_step(IFD_INPUT_PER_HOST, &b, 1, 4, shards, &err), IFD_ESHAPE);
    ck_assert_msg(strstr(err.msg, "10 rows") && strstr(err.msg, "4 replicas"), "%s", err.msg);
    /* A step of per-host-v2 takes one batch per replica. */
    ck_assert_int_eq(ifd_shard_step(IFD_INPUT_PER_HOST_V2, &b, 1, 2, shards, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "per-host-v2") && strstr(err.msg, "2 batches") &&
                      strstr(err.msg, "got 1"),
                  "%s", err.msg);
    tu_batch_free(tb);
    ifd_program_free(&p);
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
    ifd_program_free(&p);
}
END_TEST

START_TEST(rows_and_batches_per_mode)
{
    ck_assert_int_eq(ifd_input_batches_per_step(IFD_INPUT_PER_HOST, 3), 1);
    ck_assert_int_eq(ifd_input_batches_per_step(IFD_INPUT_PER_HOST_V2, 3), 3);
    ck_assert_int_eq(ifd_input_batches_per_step(IFD_INPUT_PER_CORE, 3), 3);
    ck_assert_int_eq(ifd_input_batches_per_step(IFD_INPUT_BROADCAST, 3), 1);
    ck_assert_int_eq(ifd_input_batch_rows(IFD_INPUT_PER_HOST, 12, 3), 12);
    ck_assert_int_eq(ifd_input_batch_rows(IFD_INPUT_PER_HOST_V2, 12, 3), 4);
    ck_assert_int_eq(ifd_input_batch_rows(IFD_INPUT_PER_CORE, 12, 3), 4);
    ck_assert_int_eq(ifd_input_batch_rows(IFD_INPUT_BROADCAST, 12, 3), 4);
    ck_assert_int_eq(ifd_input_batches_per_step((ifd_input_mode)9, 3), -1);
}
END_TEST

/* per-host-v2, per-core and broadcast: whole batches, no copy; v2 and per-core give batch r to
 * replica r, broadcast batch 0 to all. */
START_TEST(one_batch_a_replica_modes)
{
    static const ifd_input_mode modes[] = {IFD_INPUT_PER_HOST_V2, IFD_INPUT_PER_CORE,
                                           IFD_INPUT_BROADCAST};
    ifd_rng rng;
    seed_rng(&rng);
    ifd_input_mode mode = modes[_i % 3];
    int replicas = (int)rand_between(&rng, 1, 4);
    int64_t rows = rand_between(&rng, 1, 9);
    ifd_program p;
    softmax(&p, rand_between(&rng, 1, 7), rand_between(&rng, 2, 6));
    int n = ifd_input_batches_per_step(mode, replicas);
    tu_batch *tb[4];
    ifd_batch *bs[4];
    for (int i = 0; i < n; i++) {
        tb[i] = tu_batch_random(&p, rows, i, &rng);
        tb[i]->b.replica = i;
        bs[i] = &tb[i]->b;
    }
    ifd_shard shards[4];
    ifd_error err;
    ck_assert_int_eq(ifd_shard_step(mode, bs, n, replicas, shards, &err), IFD_OK);
    for (int r = 0; r < replicas; r++) {
        ifd_batch *want = mode == IFD_INPUT_BROADCAST ? bs[0] : bs[r];
        RASSERT(shards[r].batch == want && shards[r].row0 == 0 && shards[r].rows == rows,
                "%s R=%d: replica %d got batch %lld rows [%lld, +%lld)", ifd_input_mode_name(mode),
                replicas, r, (long long)shards[r].batch->seq, (long long)shards[r].row0,
                (long long)shards[r].rows);
    }
    for (int i = 0; i < n; i++)
        tu_batch_free(tb[i]);
    ifd_program_free(&p);
}
END_TEST

START_TEST(per_core_and_stop_rules)
{
    ifd_program p;
    softmax(&p, 3, 2);
    ifd_rng rng;
    ifd_rng_seed(&rng, 8);
    tu_batch *tb[3];
    ifd_batch *bs[3];
    for (int i = 0; i < 3; i++) {
        tb[i] = tu_batch_random(&p, 2, 10 + i, &rng);
        tb[i]->b.replica = i;
        bs[i] = &tb[i]->b;
    }
    ifd_shard shards[3];
    ifd_error err;
    /* per-core: a batch in replica 1's slot that says replica 2 */
    tb[1]->b.replica = 2;
    ck_assert_int_eq(ifd_shard_step(IFD_INPUT_PER_CORE, bs, 3, 3, shards, &err), IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "batch 11") && strstr(err.msg, "replica 1") &&
                      strstr(err.msg, "replica 2"),
                  "%s", err.msg);
    tb[1]->b.replica = 1;
    /* replica 0's stopping signal goes to every replica; another replica's is dropped */
    tb[2]->b.flags = IFD_BATCH_STOP;
    ck_assert_int_eq(ifd_shard_step(IFD_INPUT_PER_HOST_V2, bs, 3, 3, shards, &err), IFD_OK);
    ck_assert_ptr_eq(shards[2].batch, bs[2]);
    ck_assert_uint_eq(tb[2]->b.flags & IFD_BATCH_STOP, 0);
    tb[0]->b.flags = IFD_BATCH_STOP;
    ck_assert_int_eq(ifd_shard_step(IFD_INPUT_PER_HOST_V2, bs, 3, 3, shards, &err), IFD_OK);
    for (int r = 0; r < 3; r++)
        ck_assert_ptr_eq(shards[r].batch, bs[0]);
    for (int i = 0; i < 3; i++)
        tu_batch_free(tb[i]);
    ifd_program_free(&p);
}
END_TEST

/* A per-replica queue: pushes go to b->replica's FIFO, a full FIFO does not block another's,
 * next_for takes one replica's batches in order, the shared next refuses. */
START_TEST(per_replica_queue)
{
    ifd_rng rng;
    seed_rng(&rng);
    int replicas = (int)rand_between(&rng, 2, 4);
    ifd_batch_queue *q;
    ck_assert_int_eq(ifd_batch_queue_create_per_replica(&q, 2, replicas), IFD_OK);
    ifd_batch_source src = ifd_batch_queue_source(q);
    ifd_program p;
    softmax(&p, 2, 2);
    int released = 0;
    tu_batch *tb[4][2];
    for (int r = 0; r < replicas; r++) {
        for (int k = 0; k < 2; k++) {
            tb[r][k] = tu_batch_random(&p, 1, 10 * r + k, &rng);
            tb[r][k]->b.replica = r;
            tb[r][k]->released = &released;
        }
    }
    /* fill the last replica's FIFO first: the others still take pushes at once */
    for (int r = replicas - 1; r >= 0; r--)
        for (int k = 0; k < 2; k++)
            ck_assert_int_eq(ifd_batch_queue_push(q, &tb[r][k]->b), IFD_OK);
    ck_assert_uint_eq(ifd_batch_queue_len(q), (size_t)(2 * replicas));
    ck_assert_uint_eq(ifd_batch_queue_len_for(q, 1), 2);
    tu_batch *stray = tu_batch_random(&p, 1, 99, &rng);
    stray->b.replica = replicas;
    ck_assert_int_eq(ifd_batch_queue_push(q, &stray->b), IFD_EINVAL);
    tu_batch_free(stray);
    ifd_batch *got;
    ifd_error err;
    ck_assert_int_eq(src.ops->next(src.ctx, &got, &err), IFD_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "next_for"));
    ck_assert_int_eq(src.ops->next_for(src.ctx, replicas, &got, &err), IFD_EINVAL);
    char want[64];
    snprintf(want, sizeof want, "replica %d: expected 0 to %d", replicas, replicas - 1);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    int r = (int)rand_between(&rng, 0, replicas - 1);
    ck_assert_int_eq(src.ops->next_for(src.ctx, r, &got, &err), IFD_OK);
    ck_assert_ptr_eq(got, &tb[r][0]->b);
    ck_assert_int_eq(src.ops->try_next_for(src.ctx, r, &got, &err), IFD_OK);
    ck_assert_ptr_eq(got, &tb[r][1]->b);
    ck_assert_int_eq(src.ops->try_next_for(src.ctx, r, &got, &err), IFD_ETIMEDOUT);
    ifd_batch_queue_close(q);
    ck_assert_int_eq(src.ops->next_for(src.ctx, r, &got, &err), IFD_EEOF);
    int other = (r + 1) % replicas;
    ck_assert_int_eq(src.ops->next_for(src.ctx, other, &got, &err), IFD_OK);
    ck_assert_ptr_eq(got, &tb[other][0]->b);
    tu_batch_free(tb[r][0]);
    tu_batch_free(tb[r][1]);
    tu_batch_free(tb[other][0]);
    /* destroy releases what is left */
    ifd_batch_queue_destroy(q);
    ck_assert_int_eq(released, 2 * replicas - 3);
    ifd_program_free(&p);
}
END_TEST

/* Non-finite and (with a bound) too large float inputs are found wherever they are, the first
 * one is named (tensor, row, element, value), and labels (int32) are not read. Random shapes,
 * rows and positions; the mlp program for an input with several elements a row. */
START_TEST(check_values_finds_the_first_bad_float)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, 900 + (uint64_t)_i);
    ifd_program p;
    ifd_program_settings st = {.features = rand_between(&rng, 1, 700),
                               .classes = rand_between(&rng, 2, 9)};
    ifd_error err;
    ck_assert_int_eq(ifd_program_init(&p, "softmax", &st, &err), IFD_OK);
    int64_t rows = rand_between(&rng, 1, 40), d = st.features;
    tu_batch *tb = tu_batch_random(&p, rows, 0, &rng);
    float *x = tb->data[0];
    ck_assert_int_eq(ifd_infeed_check_values(&p, &tb->b, IFD_MODE_TRAIN, 0, &err), IFD_OK);
    ck_assert_int_eq(ifd_infeed_check_values(&p, &tb->b, IFD_MODE_TRAIN, 1.0, &err), IFD_OK);
    const float bad[] = {NAN, INFINITY, -INFINITY};
    const char *names[] = {"NaN", "inf", "-inf"};
    int kind = (int)rand_between(&rng, 0, 2);
    int64_t at = rand_between(&rng, 0, rows * d - 1);
    int64_t later = rand_between(&rng, at, rows * d - 1);
    x[later] = NAN; /* a later bad value is not the one named */
    x[at] = bad[kind];
    ck_assert_int_eq(ifd_infeed_check_values(&p, &tb->b, IFD_MODE_TRAIN, 0, &err), IFD_ERANGE);
    char want[128];
    snprintf(want, sizeof want, "tensor 'x' row %lld element %lld: expected a finite value, got %s",
             (long long)(at / d), (long long)(at % d), names[kind]);
    ck_assert_msg(strstr(err.msg, want), "%s; wanted %s", err.msg, want);
    x[at] = 0.5f;
    x[later] = 0.5f;
    /* a magnitude bound: values inside pass, one outside is named with its value */
    x[at] = -3e38f;
    ck_assert_int_eq(ifd_infeed_check_values(&p, &tb->b, IFD_MODE_TRAIN, 0, &err), IFD_OK);
    ck_assert_int_eq(ifd_infeed_check_values(&p, &tb->b, IFD_MODE_TRAIN, 1e6, &err), IFD_ERANGE);
    snprintf(want, sizeof want, "row %lld element %lld", (long long)(at / d), (long long)(at % d));
    ck_assert_msg(strstr(err.msg, want) && strstr(err.msg, "-3e+38") && strstr(err.msg, "1e+06"),
                  "%s", err.msg);
    x[at] = 1e6f; /* at the bound: accepted */
    ck_assert_int_eq(ifd_infeed_check_values(&p, &tb->b, IFD_MODE_TRAIN, 1e6, &err), IFD_OK);
    x[at] = -1e6f;
    ck_assert_int_eq(ifd_infeed_check_values(&p, &tb->b, IFD_MODE_TRAIN, 1e6, &err), IFD_OK);
    /* one step beyond it (either sign) is named, wherever it is: first, last, a block or the tail
     */
    const int64_t where[] = {0, rows * d - 1, at};
    for (int w = 0; w < 3; w++) {
        x[at] = 0.5f;
        x[where[w]] = nextafterf(w == 1 ? -1e6f : 1e6f, w == 1 ? -INFINITY : INFINITY);
        ck_assert_int_eq(ifd_infeed_check_values(&p, &tb->b, IFD_MODE_TRAIN, 1e6, &err),
                         IFD_ERANGE);
        snprintf(want, sizeof want, "row %lld element %lld:", (long long)(where[w] / d),
                 (long long)(where[w] % d));
        ck_assert_msg(strstr(err.msg, want), "%s; wanted %s", err.msg, want);
        x[where[w]] = 0.5f;
    }
    /* -0, subnormals and FLT_MAX are finite */
    x[rand_between(&rng, 0, rows * d - 1)] = -0.0f;
    x[rand_between(&rng, 0, rows * d - 1)] = -1e-42f;
    x[rand_between(&rng, 0, rows * d - 1)] = FLT_MIN / 4;
    x[rand_between(&rng, 0, rows * d - 1)] = -FLT_MAX;
    ck_assert_int_eq(ifd_infeed_check_values(&p, &tb->b, IFD_MODE_TRAIN, 0, &err), IFD_OK);
    /* labels are int32: any bit pattern passes this check */
    int32_t *y = tb->data[1];
    y[rand_between(&rng, 0, rows - 1)] = 0x7fc00000;
    ck_assert_int_eq(ifd_infeed_check_values(&p, &tb->b, IFD_MODE_TRAIN, 0, &err), IFD_OK);
    tu_batch_free(tb);
    ifd_program_free(&p);
    ifd_program_free(&p);
}
END_TEST

/* A batch is checked once: the infeed checks what an in-process source hands it, and not again
 * what the source checked itself (IFD_BATCH_CHECKED: infeedd's ingest). A softmax whose own
 * check counts its calls runs a random mix of both. */
static int checks;
static int counting_check(const ifd_program *p, const ifd_tensor *in, int64_t rows, ifd_error *err)
{
    __atomic_add_fetch(&checks, 1, __ATOMIC_RELAXED);
    return ifd_program_find("softmax")->check_batch(p, in, rows, err);
}

START_TEST(a_batch_the_source_checked_is_not_checked_again)
{
    if (ifd_program_find("counting-softmax") == NULL) {
        ifd_program_class *cls = malloc(sizeof *cls); /* lives as long as the registry */
        *cls = *ifd_program_find("softmax");
        cls->name = "counting-softmax";
        cls->check_batch = counting_check;
        ck_assert_int_eq(ifd_program_register(cls), IFD_OK);
    }
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config cfg;
    int64_t d = rand_between(&rng, 1, 9), k = rand_between(&rng, 2, 6);
    int64_t rows = rand_between(&rng, 1, 8), n = rand_between(&rng, 1, 30);
    tu_config_train(&cfg, "counting-softmax", IFD_OPT_SGD, d, k, rows, rand_between(&rng, 1, 4),
                    g_seed);
    cfg.steps = n;
    ifd_program p;
    ifd_error err;
    RC_OK(ifd_program_init(&p, "counting-softmax", &cfg.settings, &err), err);
    tu_batch **bs = calloc((size_t)n, sizeof *bs);
    int unchecked = 0;
    for (int64_t i = 0; i < n; i++) {
        bs[i] = tu_batch_random(&p, rows, i, &rng);
        if (rand_between(&rng, 0, 1))
            bs[i]->b.flags |= IFD_BATCH_CHECKED;
        else
            unchecked++;
    }
    checks = 0;
    tu_result res;
    tu_run(&cfg, bs, n, &res);
    RASSERT(res.rc == IFD_OK, "run: %s", ifd_error_text(&res.err));
    RASSERT(res.global_step == n, "ran %lld of %lld steps", (long long)res.global_step,
            (long long)n);
    RASSERT(__atomic_load_n(&checks, __ATOMIC_RELAXED) == unchecked,
            "%d checks for %d unchecked batches of %lld", checks, unchecked, (long long)n);
    tu_result_free(&res);
    tu_batches_free(bs, n);
    ifd_program_free(&p);
    ifd_program_free(&p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("infeed");
    TCase *tc = tcase_create("infeed");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, check_accepts_a_good_batch);
    tcase_add_test(tc, check_names_what_is_wrong);
    tcase_add_test(tc, padding_copies_and_drops_the_pinned_flag);
    tcase_add_loop_test(tc, per_host_shards_are_views, 0, 20);
    tcase_add_test(tc, per_host_rejects_uneven_batches);
    tcase_add_test(tc, batch_queue_source);
    tcase_add_test(tc, rows_and_batches_per_mode);
    tcase_add_loop_test(tc, one_batch_a_replica_modes, 0, 30);
    tcase_add_test(tc, per_core_and_stop_rules);
    tcase_add_loop_test(tc, per_replica_queue, 0, 5);
    tcase_add_loop_test(tc, check_values_finds_the_first_bad_float, 0, 40);
    tcase_add_loop_test(tc, a_batch_the_source_checked_is_not_checked_again, 0, 10);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
