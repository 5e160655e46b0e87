/*
 * The tensor messages' buffer pool (host/tensor_pool.h): a buffer given back is the next one of
 * its size class, capacities are at most twice what was asked (or exactly it, for a size never
 * kept), what is kept stays under IFD_PUB_TENSOR_POOL_BYTES, and buffers may come back after the
 * owner destroyed the pool, from another thread (ASan: nothing leaks, nothing is used after it
 * is freed; TSan: the two threads).
 */
#include "core/thread.h"
#include "host/tensor_pool.h"
#include "tests/util/testutil.h"

#include <string.h>

/* A buffer of need bytes: capacity within [need, 2 need) unless never kept, and writable. */
static char *take(ifd_tensor_pool *pool, size_t need, size_t *cap)
{
    char *d = ifd_tensor_pool_get(pool, need, cap);
    ck_assert_ptr_nonnull(d);
    ck_assert_uint_ge(*cap, need);
    if (need > IFD_PUB_TENSOR_POOL_LARGEST)
        ck_assert_uint_eq(*cap, need);
    else
        RASSERT(*cap < 2 * need || *cap == 256, "%zu bytes asked for, %zu given", need, *cap);
    memset(d, 0x5a, need);
    return d;
}

/* Given back, a buffer is the next one taken of any size of its class, and only of its class;
 * the stats count it. */
START_TEST(a_buffer_given_back_is_taken_again_by_its_size_class)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_tensor_pool *pool = ifd_tensor_pool_create();
    ck_assert_ptr_nonnull(pool);
    size_t need = (size_t)rand_between(&rng, 257, IFD_PUB_TENSOR_POOL_LARGEST / 2), cap, cap2, cap3;
    char *a = take(pool, need, &cap);
    ifd_tensor_pool_put(a);
    ifd_tensor_pool_stats st;
    ifd_tensor_pool_get_stats(pool, &st);
    ck_assert_int_eq(st.kept, 1);
    ck_assert_uint_eq(st.kept_bytes, cap);
    ck_assert_int_eq(st.out, 0);
    /* another size of the same class: the same buffer */
    char *b = take(pool, cap / 2 + 1 + (size_t)rand_between(&rng, 0, (int64_t)cap / 2 - 1), &cap2);
    ck_assert_ptr_eq(b, a);
    ck_assert_uint_eq(cap2, cap);
    /* a size of the next class: a new one */
    char *c = take(pool, cap + 1, &cap3);
    ck_assert_ptr_ne(c, a);
    ck_assert_uint_eq(cap3, 2 * cap);
    ifd_tensor_pool_get_stats(pool, &st);
    ck_assert_int_eq(st.taken, 3);
    ck_assert_int_eq(st.reused, 1);
    ck_assert_int_eq(st.out, 2);
    ck_assert_int_eq(st.kept, 0);
    ifd_tensor_pool_put(b);
    ifd_tensor_pool_put(c);
    ifd_tensor_pool_put(NULL);
    ifd_tensor_pool_destroy(pool);
}
END_TEST

/* Whatever comes back, the pool keeps at most IFD_PUB_TENSOR_POOL_BYTES, and never a buffer
 * larger than IFD_PUB_TENSOR_POOL_LARGEST (a message of several steps at most). */
START_TEST(what_is_kept_stays_under_the_bound)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_tensor_pool *pool = ifd_tensor_pool_create();
    enum { N = 256 };
    char *d[N];
    size_t cap, total = 0;
    for (int i = 0; i < N; i++) {
        size_t need = (size_t)rand_between(&rng, 1, IFD_PUB_TENSOR_POOL_LARGEST);
        if (i % 32 == 0) /* some never kept */
            need = IFD_PUB_TENSOR_POOL_LARGEST + (size_t)rand_between(&rng, 1, 4096);
        d[i] = take(pool, need, &cap);
        total += cap;
    }
    ck_assert_uint_gt(total, IFD_PUB_TENSOR_POOL_BYTES); /* more than it may keep */
    for (int i = 0; i < N; i++)
        ifd_tensor_pool_put(d[i]);
    ifd_tensor_pool_stats st;
    ifd_tensor_pool_get_stats(pool, &st);
    RASSERT(st.kept_bytes <= IFD_PUB_TENSOR_POOL_BYTES && st.kept_bytes > 0,
            "%zu bytes kept in %lld buffers", st.kept_bytes, (long long)st.kept);
    ck_assert_int_lt(st.kept, N - N / 32 + 1);
    ck_assert_int_eq(st.out, 0);
    size_t big = IFD_PUB_TENSOR_POOL_LARGEST + 1;
    char *b = take(pool, big, &cap);
    ifd_tensor_pool_put(b);
    ifd_tensor_pool_stats st2;
    ifd_tensor_pool_get_stats(pool, &st2);
    ck_assert_int_eq(st2.kept, st.kept);
    ck_assert_int_eq(st2.reused, st.reused);
    ifd_tensor_pool_destroy(pool);
}
END_TEST

typedef struct giver {
    char **bufs;
    int n;
} giver;

static void *give_back(void *arg)
{
    giver *g = arg;
    for (int i = 0; i < g->n; i++)
        ifd_tensor_pool_free(g->bufs[i], NULL);
    return NULL;
}

/* Buffers still out when the owner destroys the pool come back later, from another thread, as
 * libzmq gives back what it still held after the publisher was destroyed: the last one frees
 * the pool. Meanwhile the owner takes and gives back more, as the outfeed thread does. */
START_TEST(buffers_out_when_the_pool_is_destroyed_come_back_later)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_tensor_pool *pool = ifd_tensor_pool_create();
    enum { N = 64 };
    char *out[N];
    size_t cap;
    int n = (int)rand_between(&rng, 1, N);
    for (int i = 0; i < n; i++)
        out[i] = take(pool, (size_t)rand_between(&rng, 1, 80 << 10), &cap);
    giver g = {.bufs = out, .n = n};
    ifd_thread t;
    ck_assert_int_eq(ifd_thread_start(&t, "test-give", give_back, &g), 0);
    for (int i = 0; i < 200; i++)
        ifd_tensor_pool_put(take(pool, (size_t)rand_between(&rng, 1, 80 << 10), &cap));
    char *last = take(pool, 100, &cap);
    ifd_tensor_pool_destroy(pool);
    ifd_thread_join(&t);
    ifd_tensor_pool_put(last); /* frees the pool */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tensor_pool");
    TCase *tc = tu_tcase(s, "pool", 30);
    tcase_add_loop_test(tc, a_buffer_given_back_is_taken_again_by_its_size_class, 0, 8);
    tcase_add_loop_test(tc, what_is_kept_stays_under_the_bound, 0, 4);
    tcase_add_loop_test(tc, buffers_out_when_the_pool_is_destroyed_come_back_later, 0, 8);
    return tu_run_suite(s);
}
