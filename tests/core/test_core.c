/*
 * Tests of the core pieces under the runtime: error codes and error sentences, dtypes, shapes and
 * tensor row views, the error rendezvous, the thread wrappers and leveled logging.
 *
 * Sizes and orders are random. The seed comes from IFD_TEST_SEED when set, else from the clock,
 * and every failure message names it so that a failing run can be repeated.
 */
#include "tests/util/testutil.h"

#include "core/log.h"
#include "core/rendezvous.h"
#include "core/rng.h"
#include "core/thread.h"
#include "infeed/error.h"
#include "infeed/tensor.h"

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------------ */

/* The rendezvous logs every error it records; keep those lines out of the test output. */
static void quiet_stderr(void)
{
    int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0) {
        fflush(stderr);
        dup2(fd, 2);
        close(fd);
    }
}

/* Every code with its name and description, spelled out rather than taken from the map. */
static const struct {
    int code;
    const char *name;
    const char *text;
} k_codes[] = {
    {IFD_OK, "IFD_OK", "success"},
    {IFD_ENOMEM, "IFD_ENOMEM", "out of memory"},
    {IFD_EINVAL, "IFD_EINVAL", "invalid argument"},
    {IFD_ESHAPE, "IFD_ESHAPE", "shape mismatch"},
    {IFD_EDTYPE, "IFD_EDTYPE", "dtype mismatch"},
    {IFD_ERANGE, "IFD_ERANGE", "value out of range"},
    {IFD_EPROTO, "IFD_EPROTO", "protocol error"},
    {IFD_EIO, "IFD_EIO", "input/output error"},
    {IFD_ECLOSED, "IFD_ECLOSED", "closed"},
    {IFD_EEOF, "IFD_EEOF", "input ended"},
    {IFD_ETIMEDOUT, "IFD_ETIMEDOUT", "timed out"},
    {IFD_ESTOPPED, "IFD_ESTOPPED", "stopped"},
    {IFD_ECANCELED, "IFD_ECANCELED", "canceled"},
    {IFD_ENOTSUP, "IFD_ENOTSUP", "not supported"},
    {IFD_ENOTFOUND, "IFD_ENOTFOUND", "not found"},
    {IFD_ENUMERIC, "IFD_ENUMERIC", "numeric error"},
    {IFD_EBLAS, "IFD_EBLAS", "BLAS error"},
    {IFD_ECUDA, "IFD_ECUDA", "CUDA error"},
    {IFD_ENCCL, "IFD_ENCCL", "NCCL error"},
    {IFD_EPERM, "IFD_EPERM", "not permitted"},
    {IFD_EINTERNAL, "IFD_EINTERNAL", "internal error"},
    {IFD_EBUSY, "IFD_EBUSY", "in use"},
};
#define NCODES ((int)(sizeof k_codes / sizeof k_codes[0]))

/* ---- error -------------------------------------------------------------------------------- */

START_TEST(test_error_names)
{
    ck_assert_int_eq(IFD_OK, 0);
    ck_assert_int_eq(NCODES, IFD_ERRNO_MAX);
    for (int i = 0; i < NCODES; i++) {
        ck_assert_int_eq(k_codes[i].code, i);
        ck_assert_str_eq(ifd_errname(k_codes[i].code), k_codes[i].name);
        ck_assert_str_eq(ifd_strerror(k_codes[i].code), k_codes[i].text);
        for (int j = 0; j < i; j++) {
            ck_assert_str_ne(ifd_errname(k_codes[i].code), ifd_errname(k_codes[j].code));
            ck_assert_str_ne(ifd_strerror(k_codes[i].code), ifd_strerror(k_codes[j].code));
        }
    }
    int unknown[] = {-1, IFD_ERRNO_MAX, IFD_ERRNO_MAX + 1, 12345, -99999};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        ck_assert_ptr_nonnull(ifd_strerror(unknown[i]));
        ck_assert_str_eq(ifd_strerror(unknown[i]), "unknown error");
        ck_assert_str_eq(ifd_errname(unknown[i]), "IFD_EUNKNOWN");
    }
}
END_TEST

START_TEST(test_error_is_secondary)
{
    for (int i = 0; i < NCODES; i++) {
        int c = k_codes[i].code;
        int expect = c == IFD_ESTOPPED || c == IFD_ECANCELED || c == IFD_ECLOSED;
        ck_assert_msg(ifd_error_is_secondary(c) == expect, "is_secondary(%s) = %d", k_codes[i].name,
                      ifd_error_is_secondary(c));
    }
}
END_TEST

START_TEST(test_error_set_and_text)
{
    ifd_error e;
    memset(&e, 0x5A, sizeof e);
    ck_assert_int_eq(
        ifd_error_set(&e, IFD_ESHAPE, "input %d: expected [%d, %d], got [%d]", 2, 64, 10, 64),
        IFD_ESHAPE);
    ck_assert_int_eq(e.code, IFD_ESHAPE);
    ck_assert_str_eq(e.msg, "input 2: expected [64, 10], got [64]");
    ck_assert_str_eq(ifd_error_text(&e), "input 2: expected [64, 10], got [64]");

    /* NULL err: just the code back. */
    ck_assert_int_eq(ifd_error_set(NULL, IFD_EIO, "x %s", "y"), IFD_EIO);

    /* An empty sentence reads as the code's description. */
    ifd_error_set(&e, IFD_ETIMEDOUT, "%s", "");
    ck_assert_str_eq(ifd_error_text(&e), "timed out");

    /* clear */
    ifd_error_clear(&e);
    ck_assert_int_eq(e.code, IFD_OK);
    ck_assert_str_eq(ifd_error_text(&e), "success");
    ifd_error_clear(NULL);

    /* A sentence longer than the buffer is cut, still terminated. */
    char big[IFD_ERROR_MSG_MAX * 2];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ifd_error_set(&e, IFD_EINVAL, "%s", big);
    ck_assert_uint_eq(strlen(e.msg), IFD_ERROR_MSG_MAX - 1);
    ck_assert_int_eq(e.code, IFD_EINVAL);
}
END_TEST

START_TEST(test_error_prefix)
{
    ifd_error e;
    ifd_error_set(&e, IFD_EDTYPE, "got %s", "int64");
    ck_assert_int_eq(ifd_error_prefix(&e, "input %d", 3), IFD_EDTYPE);
    ck_assert_str_eq(ifd_error_text(&e), "input 3: got int64");
    ck_assert_int_eq(ifd_error_prefix(&e, "infeed"), IFD_EDTYPE);
    ck_assert_str_eq(ifd_error_text(&e), "infeed: input 3: got int64");
    ck_assert_int_eq(e.code, IFD_EDTYPE);

    /* With no sentence, the description is prefixed. */
    ifd_error_clear(&e);
    e.code = IFD_ESHAPE;
    ck_assert_int_eq(ifd_error_prefix(&e, "outfeed"), IFD_ESHAPE);
    ck_assert_str_eq(ifd_error_text(&e), "outfeed: shape mismatch");

    ck_assert_int_eq(ifd_error_prefix(NULL, "x"), IFD_OK);

    /* Prefixing a full sentence keeps the result terminated and within the buffer. */
    char big[IFD_ERROR_MSG_MAX];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ifd_error_set(&e, IFD_EIO, "%s", big);
    ifd_error_prefix(&e, "ctx");
    ck_assert_uint_eq(strlen(e.msg), IFD_ERROR_MSG_MAX - 1);
    ck_assert(strncmp(e.msg, "ctx: zzz", 8) == 0);
}
END_TEST

/* ---- tensor ------------------------------------------------------------------------------- */

START_TEST(test_dtype_names_sizes_parse)
{
    static const struct {
        ifd_dtype dt;
        const char *name;
        size_t size;
    } k[] = {{IFD_F32, "float32", 4},
             {IFD_I32, "int32", 4},
             {IFD_I64, "int64", 8},
             {IFD_U8, "uint8", 1}};
    ck_assert_int_eq((int)(sizeof k / sizeof k[0]), IFD_DTYPE_MAX - 1);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        ck_assert_str_eq(ifd_dtype_name(k[i].dt), k[i].name);
        ck_assert_uint_eq(ifd_dtype_size(k[i].dt), k[i].size);
        ifd_dtype out = IFD_DTYPE_INVALID;
        ck_assert_int_eq(ifd_dtype_parse(k[i].name, &out), IFD_OK);
        ck_assert_int_eq(out, k[i].dt);
    }
    ck_assert_str_eq(ifd_dtype_name(IFD_DTYPE_INVALID), "invalid");
    ck_assert_str_eq(ifd_dtype_name(IFD_DTYPE_MAX), "invalid");
    ck_assert_str_eq(ifd_dtype_name((ifd_dtype)77), "invalid");
    ck_assert_uint_eq(ifd_dtype_size(IFD_DTYPE_INVALID), 0);
    ck_assert_uint_eq(ifd_dtype_size(IFD_DTYPE_MAX), 0);

    const char *bad[] = {"",       "float64", "Float32", "float32 ",
                         " int32", "int",     "invalid", "uint8x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ifd_dtype out = IFD_I64;
        ck_assert_msg(ifd_dtype_parse(bad[i], &out) == IFD_EDTYPE, "parse('%s') accepted", bad[i]);
        ck_assert_int_eq(out, IFD_I64);
    }
}
END_TEST

START_TEST(test_tensor_init_and_shapes)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_tensor t;
    float x = 1.0f;
    /* A scalar. */
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_F32, 0, NULL, &x), IFD_OK);
    ck_assert_int_eq(t.shape.rank, 0);
    ck_assert_int_eq(ifd_tensor_numel(&t), 1);
    ck_assert_uint_eq(ifd_tensor_nbytes(&t), 4);
    ck_assert_ptr_eq(t.data, &x);

    int64_t dims[IFD_MAX_RANK + 1] = {2, 3, 4, 5, 6, 7, 8, 9, 10};
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_F32, -1, dims, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_F32, IFD_MAX_RANK + 1, dims, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_DTYPE_INVALID, 2, dims, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_DTYPE_MAX, 2, dims, NULL), IFD_EINVAL);
    int64_t neg[3] = {4, -1, 2};
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_I32, 3, neg, NULL), IFD_EINVAL);
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_I32, IFD_MAX_RANK, dims, NULL), IFD_OK);

    for (int round = 0; round < 200; round++) {
        int rank = (int)rand_between(&rng, 1, IFD_MAX_RANK);
        ifd_dtype dt = (ifd_dtype)rand_between(&rng, 1, IFD_DTYPE_MAX - 1);
        int64_t d[IFD_MAX_RANK];
        int64_t numel = 1, row = 1;
        for (int i = 0; i < rank; i++) {
            d[i] = rand_between(&rng, 0, 5);
            numel *= d[i];
            if (i > 0)
                row *= d[i];
        }
        RASSERT(ifd_tensor_init(&t, dt, rank, d, &x) == IFD_OK, "init rank %d", rank);
        RASSERT(t.dtype == dt && t.shape.rank == rank, "init fields");
        for (int i = 0; i < rank; i++)
            RASSERT(t.shape.dims[i] == d[i], "dim %d: %" PRId64 " != %" PRId64, i, t.shape.dims[i],
                    d[i]);
        RASSERT(ifd_tensor_numel(&t) == numel, "numel %" PRId64 ", expected %" PRId64,
                ifd_tensor_numel(&t), numel);
        RASSERT(ifd_shape_numel(&t.shape) == numel, "shape numel");
        RASSERT(ifd_shape_row_numel(&t.shape) == row, "row numel %" PRId64 ", expected %" PRId64,
                ifd_shape_row_numel(&t.shape), row);
        RASSERT(ifd_tensor_nbytes(&t) == (size_t)numel * ifd_dtype_size(dt), "nbytes %zu",
                ifd_tensor_nbytes(&t));
        RASSERT(ifd_tensor_row_bytes(&t) == (size_t)row * ifd_dtype_size(dt), "row bytes %zu",
                ifd_tensor_row_bytes(&t));

        /* shape_equal: equal to a copy, not to one with any dim or the rank changed. */
        ifd_shape s2 = t.shape;
        RASSERT(ifd_shape_equal(&t.shape, &s2), "shape not equal to its copy");
        int k = (int)rand_between(&rng, 0, rank - 1);
        s2.dims[k]++;
        RASSERT(!ifd_shape_equal(&t.shape, &s2), "shapes differing at dim %d compare equal", k);
        s2 = t.shape;
        s2.rank = rank - 1;
        RASSERT(!ifd_shape_equal(&t.shape, &s2), "shapes of rank %d and %d compare equal", rank,
                rank - 1);
    }
    /* Rank 1: one element per row. */
    int64_t one[1] = {7};
    ck_assert_int_eq(ifd_tensor_init(&t, IFD_I64, 1, one, NULL), IFD_OK);
    ck_assert_int_eq(ifd_shape_row_numel(&t.shape), 1);
    ck_assert_uint_eq(ifd_tensor_row_bytes(&t), 8);
}
END_TEST

START_TEST(test_shape_format)
{
    char buf[64];
    ifd_shape s = {.rank = 2, .dims = {64, 10}};
    ck_assert_str_eq(ifd_shape_format(&s, buf, sizeof buf), "[64, 10]");
    ck_assert_ptr_eq(ifd_shape_format(&s, buf, sizeof buf), buf);
    s = (ifd_shape){.rank = 1, .dims = {3}};
    ck_assert_str_eq(ifd_shape_format(&s, buf, sizeof buf), "[3]");
    s = (ifd_shape){.rank = 0};
    ck_assert_str_eq(ifd_shape_format(&s, buf, sizeof buf), "[]");
    s = (ifd_shape){.rank = 4, .dims = {1, 0, 123456789012, 2}};
    ck_assert_str_eq(ifd_shape_format(&s, buf, sizeof buf), "[1, 0, 123456789012, 2]");

    /* A short buffer gets a terminated prefix and nothing past its end. */
    s = (ifd_shape){.rank = 8, .dims = {1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000}};
    for (size_t len = 1; len < 48; len++) {
        char small[64];
        memset(small, '#', sizeof small);
        ifd_shape_format(&s, small, len);
        ck_assert_msg(memchr(small, '\0', len) != NULL, "len %zu: not terminated", len);
        for (size_t i = len; i < sizeof small; i++)
            ck_assert_msg(small[i] == '#', "len %zu: byte %zu written", len, i);
        ck_assert(
            strncmp(small, "[1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000]", strlen(small)) == 0);
    }
}
END_TEST

START_TEST(test_tensor_rows_share_bytes)
{
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 100; round++) {
        int rank = (int)rand_between(&rng, 1, 4);
        ifd_dtype dt = (ifd_dtype)rand_between(&rng, 1, IFD_DTYPE_MAX - 1);
        int64_t d[4];
        d[0] = rand_between(&rng, 0, 20);
        for (int i = 1; i < rank; i++)
            d[i] = rand_between(&rng, 1, 5);
        ifd_tensor t;
        size_t esz = ifd_dtype_size(dt);
        int64_t numel = 1;
        for (int i = 0; i < rank; i++)
            numel *= d[i];
        unsigned char *buf = malloc((size_t)(numel ? numel : 1) * esz);
        for (int64_t i = 0; i < numel * (int64_t)esz; i++)
            buf[i] = (unsigned char)(i * 31 + 7);
        ck_assert_int_eq(ifd_tensor_init(&t, dt, rank, d, buf), IFD_OK);
        size_t row_bytes = ifd_tensor_row_bytes(&t);

        int64_t b = rand_between(&rng, 0, d[0]);
        int64_t e = rand_between(&rng, b, d[0]);
        ifd_tensor v;
        memset(&v, 0, sizeof v);
        RASSERT(ifd_tensor_rows(&t, b, e, &v) == IFD_OK,
                "rows [%" PRId64 ", %" PRId64 ") of %" PRId64 " failed", b, e, d[0]);
        /* A view of the same bytes: the pointer is into t's data, nothing was copied. */
        RASSERT(v.data == buf + (size_t)b * row_bytes,
                "rows [%" PRId64 ", %" PRId64 "): data at offset %td, expected %zu", b, e,
                (unsigned char *)v.data - buf, (size_t)b * row_bytes);
        RASSERT(v.dtype == dt && v.shape.rank == rank && v.shape.dims[0] == e - b,
                "view dtype/rank/dims[0] wrong");
        for (int i = 1; i < rank; i++)
            RASSERT(v.shape.dims[i] == d[i], "view dim %d changed", i);
        RASSERT(ifd_tensor_nbytes(&v) == (size_t)(e - b) * row_bytes, "view nbytes %zu",
                ifd_tensor_nbytes(&v));
        /* t itself is untouched. */
        RASSERT(t.data == buf && t.shape.dims[0] == d[0], "source tensor modified");
        /* Writing through the view changes the source's bytes. */
        if (e > b) {
            size_t off = (size_t)b * row_bytes;
            unsigned char before = buf[off];
            ((unsigned char *)v.data)[0] = (unsigned char)(before ^ 0xFF);
            RASSERT(buf[off] == (unsigned char)(before ^ 0xFF),
                    "write through view not seen in the source");
            buf[off] = before;
        }
        /* A view of a view composes. */
        if (e > b) {
            int64_t b2 = rand_between(&rng, 0, e - b);
            int64_t e2 = rand_between(&rng, b2, e - b);
            ifd_tensor w;
            RASSERT(ifd_tensor_rows(&v, b2, e2, &w) == IFD_OK, "view of view");
            RASSERT(w.data == buf + (size_t)(b + b2) * row_bytes && w.shape.dims[0] == e2 - b2,
                    "view of view at the wrong rows");
        }

        /* Out of range. */
        int64_t bad[][2] = {{-1, d[0]}, {0, d[0] + 1},        {d[0], d[0] + 1}, {b + 1, b},
                            {-5, -1},   {d[0] + 1, d[0] + 2}, {0, INT64_MAX},   {INT64_MIN, 0}};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            ifd_tensor w;
            int rc = ifd_tensor_rows(&t, bad[i][0], bad[i][1], &w);
            RASSERT(rc == IFD_ERANGE,
                    "rows [%" PRId64 ", %" PRId64 ") of %" PRId64 " rows gave %s, not ERANGE",
                    bad[i][0], bad[i][1], d[0], ifd_errname(rc));
        }
        /* Edges are in range. */
        ifd_tensor w;
        ck_assert_int_eq(ifd_tensor_rows(&t, 0, d[0], &w), IFD_OK);
        ck_assert_ptr_eq(w.data, buf);
        ck_assert_int_eq(ifd_tensor_rows(&t, d[0], d[0], &w), IFD_OK);
        ck_assert_int_eq(w.shape.dims[0], 0);
        ck_assert_int_eq(ifd_tensor_rows(&t, 0, 0, &w), IFD_OK);
        free(buf);
    }
    /* A scalar has no rows. */
    ifd_tensor s, w;
    float x = 0;
    ck_assert_int_eq(ifd_tensor_init(&s, IFD_F32, 0, NULL, &x), IFD_OK);
    ck_assert_int_eq(ifd_tensor_rows(&s, 0, 0, &w), IFD_ERANGE);
    ck_assert_int_eq(ifd_tensor_rows(&s, 0, 1, &w), IFD_ERANGE);
}
END_TEST

/* ---- rendezvous --------------------------------------------------------------------------- */

typedef struct stop_counter {
    atomic_int calls;
    atomic_int order; /* the value of a shared sequence when this ran */
    atomic_int *seq;
    pthread_t thread; /* the thread it last ran on */
} stop_counter;

static void count_stop(void *arg)
{
    stop_counter *c = arg;
    atomic_fetch_add(&c->calls, 1);
    if (c->seq)
        atomic_store(&c->order, atomic_fetch_add(c->seq, 1));
    c->thread = pthread_self();
}

static void stop_counter_init(stop_counter *c, atomic_int *seq)
{
    memset(c, 0, sizeof *c);
    atomic_init(&c->calls, 0);
    atomic_init(&c->order, -1);
    c->seq = seq;
}

START_TEST(test_rendezvous_no_error)
{
    quiet_stderr();
    ifd_rendezvous *rv;
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    stop_counter c;
    stop_counter_init(&c, NULL);
    ck_assert_int_eq(ifd_rendezvous_on_stop(rv, count_stop, &c), IFD_OK);
    ifd_error out;
    ifd_error_set(&out, IFD_EIO, "junk");
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_OK);
    ck_assert_int_eq(out.code, IFD_OK);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, NULL), IFD_OK);
    ck_assert_int_eq(ifd_rendezvous_stopping(rv), 0);

    /* An IFD_OK "error" and a NULL one are ignored: nothing recorded, nothing stopped. */
    ifd_error ok = {.code = IFD_OK};
    ifd_rendezvous_record_error(rv, "infeed", &ok);
    ifd_rendezvous_record_error(rv, "infeed", NULL);
    ifd_rendezvous_record_done(rv, "infeed");
    ifd_rendezvous_record_done(rv, "outfeed");
    ck_assert_int_eq(ifd_rendezvous_stopping(rv), 0);
    ck_assert_int_eq(atomic_load(&c.calls), 0);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_OK);
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "infeed", &out), IFD_OK);
    ck_assert_int_eq(out.code, IFD_OK);
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "nobody", NULL), IFD_OK);
    ifd_rendezvous_destroy(rv);
    ifd_rendezvous_destroy(NULL);
}
END_TEST

START_TEST(test_rendezvous_cause_text)
{
    quiet_stderr();
    ifd_rendezvous *rv;
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    ck_assert_int_eq(
        ifd_rendezvous_error(rv, "replica 2", IFD_ENUMERIC, "loss is %s at step %d", "nan", 17),
        IFD_ENUMERIC);
    ifd_error out;
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_ENUMERIC);
    ck_assert_int_eq(out.code, IFD_ENUMERIC);
    ck_assert_str_eq(out.msg, "replica 2: loss is nan at step 17");
    ck_assert_str_eq(ifd_error_text(&out), "replica 2: loss is nan at step 17");
    /* The per-source error is the sentence itself, without the source. */
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "replica 2", &out), IFD_ENUMERIC);
    ck_assert_str_eq(out.msg, "loss is nan at step 17");
    ifd_rendezvous_destroy(rv);

    /* An error with no sentence is reported with its description. */
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    ifd_error e = {.code = IFD_EPROTO};
    ifd_rendezvous_record_error(rv, "outfeed", &e);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_EPROTO);
    ck_assert_str_eq(out.msg, "outfeed: protocol error");
    ifd_rendezvous_destroy(rv);

    /* A long sentence is cut but still starts with the source. */
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    char big[IFD_ERROR_MSG_MAX];
    memset(big, 'w', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ifd_rendezvous_error(rv, "hook stop_at_step", IFD_EINVAL, "%s", big);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_EINVAL);
    ck_assert(strncmp(out.msg, "hook stop_at_step: www", 22) == 0);
    ck_assert(strlen(out.msg) < sizeof out.msg);
    ifd_rendezvous_destroy(rv);
}
END_TEST

/* Random sequences of errors from random sources: the cause is the first real error in record
 * order; when only secondary errors came, the first of those. Each source keeps its own first
 * real error (a secondary one until a real one replaces it). */
START_TEST(test_rendezvous_first_real_error_wins)
{
    quiet_stderr();
    ifd_rng rng;
    seed_rng(&rng);
    static const int secondary[] = {IFD_ESTOPPED, IFD_ECANCELED, IFD_ECLOSED};
    static const int real[] = {IFD_EIO,    IFD_ESHAPE, IFD_ENUMERIC,
                               IFD_EPROTO, IFD_EINVAL, IFD_EINTERNAL};
    for (int round = 0; round < 200; round++) {
        ifd_rendezvous *rv;
        ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
        stop_counter c;
        stop_counter_init(&c, NULL);
        ck_assert_int_eq(ifd_rendezvous_on_stop(rv, count_stop, &c), IFD_OK);
        int nsources = (int)rand_between(&rng, 1, 6);
        int nrecords = (int)rand_between(&rng, 1, 12);
        /* Every third round: secondary errors first, then one real error last. */
        int forced_last_real = round % 3 == 0;
        int first_real = -1, first_any = -1;
        int src_of[12], code_of[12];
        struct {
            int code;
            int idx;
        } expect_src[6];
        for (int s = 0; s < 6; s++)
            expect_src[s].code = IFD_OK, expect_src[s].idx = -1;
        for (int i = 0; i < nrecords; i++) {
            int s = (int)ifd_rng_below(&rng, (uint64_t)nsources);
            int is_real;
            if (forced_last_real)
                is_real = i == nrecords - 1;
            else
                is_real = ifd_rng_below(&rng, 3) == 0;
            int code = is_real ? real[ifd_rng_below(&rng, 6)] : secondary[ifd_rng_below(&rng, 3)];
            src_of[i] = s;
            code_of[i] = code;
            char src[32];
            snprintf(src, sizeof src, "source %d", s);
            ifd_rendezvous_error(rv, src, code, "record %d", i);
            RASSERT(atomic_load(&c.calls) == 1,
                    "stop action ran %d times after the first record (it must run before "
                    "record_error returns)",
                    atomic_load(&c.calls));
            if (first_any < 0)
                first_any = i;
            if (is_real && first_real < 0)
                first_real = i;
            /* Per source: the first real error, else the first secondary one. */
            if (expect_src[s].idx < 0 || (ifd_error_is_secondary(expect_src[s].code) && is_real)) {
                expect_src[s].code = code;
                expect_src[s].idx = i;
            }
        }
        int want = first_real >= 0 ? first_real : first_any;
        ifd_error out;
        int rc = ifd_rendezvous_cause(rv, &out);
        char expect_msg[64];
        snprintf(expect_msg, sizeof expect_msg, "source %d: record %d", src_of[want], want);
        RASSERT(rc == code_of[want] && out.code == rc && strcmp(out.msg, expect_msg) == 0,
                "round %d (%d records, %d sources%s): cause %s '%s', expected %s '%s'", round,
                nrecords, nsources, forced_last_real ? ", real error last" : "", ifd_errname(rc),
                out.msg, ifd_errname(code_of[want]), expect_msg);
        for (int s = 0; s < nsources; s++) {
            char src[32], msg[32];
            snprintf(src, sizeof src, "source %d", s);
            rc = ifd_rendezvous_source_error(rv, src, &out);
            RASSERT(rc == expect_src[s].code, "round %d: %s has %s, expected %s", round, src,
                    ifd_errname(rc), ifd_errname(expect_src[s].code));
            if (expect_src[s].idx >= 0) {
                snprintf(msg, sizeof msg, "record %d", expect_src[s].idx);
                RASSERT(strcmp(out.msg, msg) == 0 && out.code == rc,
                        "round %d: %s kept '%s', expected '%s'", round, src, out.msg, msg);
            }
        }
        ck_assert_int_eq(ifd_rendezvous_stopping(rv), 1);
        ck_assert_int_eq(atomic_load(&c.calls), 1);
        ifd_rendezvous_destroy(rv);
    }
}
END_TEST

/* A source's later real error does not replace its first real one. */
START_TEST(test_rendezvous_source_keeps_first_real)
{
    quiet_stderr();
    ifd_rendezvous *rv;
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    ifd_rendezvous_error(rv, "infeed", IFD_ECLOSED, "closed");
    ifd_rendezvous_error(rv, "outfeed", IFD_ESTOPPED, "stopped");
    ifd_error out;
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_ECLOSED);
    ck_assert_str_eq(out.msg, "infeed: closed");
    ifd_rendezvous_error(rv, "outfeed", IFD_EIO, "sink failed");
    ifd_rendezvous_error(rv, "outfeed", IFD_EPROTO, "later");
    ifd_rendezvous_error(rv, "outfeed", IFD_ECANCELED, "even later");
    ifd_rendezvous_error(rv, "infeed", IFD_ESHAPE, "bad batch");
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &out), IFD_EIO);
    ck_assert_str_eq(out.msg, "outfeed: sink failed");
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "outfeed", &out), IFD_EIO);
    ck_assert_str_eq(out.msg, "sink failed");
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "infeed", &out), IFD_ESHAPE);
    ck_assert_str_eq(out.msg, "bad batch");
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "replica 0", &out), IFD_OK);
    ck_assert_int_eq(out.code, IFD_OK);
    ifd_rendezvous_destroy(rv);
}
END_TEST

START_TEST(test_rendezvous_actions_order_and_abort)
{
    quiet_stderr();
    ifd_rendezvous *rv;
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    atomic_int seq;
    atomic_init(&seq, 0);
    stop_counter c[IFD_RENDEZVOUS_MAX_ACTIONS];
    for (int i = 0; i < IFD_RENDEZVOUS_MAX_ACTIONS; i++) {
        stop_counter_init(&c[i], &seq);
        ck_assert_int_eq(ifd_rendezvous_on_stop(rv, count_stop, &c[i]), IFD_OK);
    }
    stop_counter extra;
    stop_counter_init(&extra, &seq);
    ck_assert_int_eq(ifd_rendezvous_on_stop(rv, count_stop, &extra), IFD_ENOMEM);

    /* An outside abort runs the actions, in registration order, without recording an error. */
    ifd_rendezvous_abort(rv);
    ck_assert_int_eq(ifd_rendezvous_stopping(rv), 1);
    for (int i = 0; i < IFD_RENDEZVOUS_MAX_ACTIONS; i++) {
        ck_assert_int_eq(atomic_load(&c[i].calls), 1);
        ck_assert_int_eq(atomic_load(&c[i].order), i);
        ck_assert(pthread_equal(c[i].thread, pthread_self()));
    }
    ck_assert_int_eq(atomic_load(&extra.calls), 0);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, NULL), IFD_OK);
    /* Later errors and aborts do not run them again, but are recorded. */
    ifd_rendezvous_abort(rv);
    ifd_rendezvous_error(rv, "infeed", IFD_EIO, "late");
    for (int i = 0; i < IFD_RENDEZVOUS_MAX_ACTIONS; i++)
        ck_assert_int_eq(atomic_load(&c[i].calls), 1);
    ck_assert_int_eq(ifd_rendezvous_cause(rv, NULL), IFD_EIO);
    ifd_rendezvous_destroy(rv);
}
END_TEST

/* Many threads record errors at once: the actions run exactly once, on one of them, and the cause
 * is a real error that was recorded. */
typedef struct rv_thread {
    pthread_t t;
    ifd_rendezvous *rv;
    atomic_int *go;
    int id;
    int nerrors;
    uint64_t seed;
} rv_thread;

static void *rv_thread_main(void *arg)
{
    rv_thread *r = arg;
    ifd_rng rng;
    ifd_rng_seed(&rng, r->seed);
    while (!atomic_load(r->go))
        sched_yield();
    char src[24];
    snprintf(src, sizeof src, "thread %d", r->id);
    for (int i = 0; i < r->nerrors; i++) {
        /* Odd threads only ever record secondary errors. */
        int code = (r->id % 2) ? IFD_ESTOPPED : (i % 2 ? IFD_ECANCELED : IFD_EIO);
        ifd_rendezvous_error(r->rv, src, code, "error %d", i);
        if (ifd_rng_below(&rng, 4) == 0)
            ifd_rendezvous_abort(r->rv);
        (void)ifd_rendezvous_stopping(r->rv);
    }
    return NULL;
}

START_TEST(test_rendezvous_concurrent_once)
{
    quiet_stderr();
    ifd_rng rng;
    seed_rng(&rng);
    for (int round = 0; round < 10; round++) {
        ifd_rendezvous *rv;
        ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
        int nact = (int)rand_between(&rng, 1, IFD_RENDEZVOUS_MAX_ACTIONS);
        stop_counter c[IFD_RENDEZVOUS_MAX_ACTIONS];
        atomic_int seq;
        atomic_init(&seq, 0);
        for (int i = 0; i < nact; i++) {
            stop_counter_init(&c[i], &seq);
            ck_assert_int_eq(ifd_rendezvous_on_stop(rv, count_stop, &c[i]), IFD_OK);
        }
        int n = (int)rand_between(&rng, 2, 16);
        atomic_int go;
        atomic_init(&go, 0);
        rv_thread th[16];
        for (int i = 0; i < n; i++) {
            th[i] = (rv_thread){.rv = rv, .go = &go, .id = i, .seed = ifd_rng_next(&rng)};
            th[i].nerrors = (int)rand_between(&rng, 1, 20);
            ck_assert_int_eq(pthread_create(&th[i].t, NULL, rv_thread_main, &th[i]), 0);
        }
        atomic_store(&go, 1);
        for (int i = 0; i < n; i++)
            pthread_join(th[i].t, NULL);
        for (int i = 0; i < nact; i++) {
            RASSERT(atomic_load(&c[i].calls) == 1,
                    "round %d, %d threads: stop action %d ran %d times", round, n, i,
                    atomic_load(&c[i].calls));
            RASSERT(atomic_load(&c[i].order) == i, "action %d ran %d-th", i,
                    atomic_load(&c[i].order));
        }
        ck_assert_int_eq(ifd_rendezvous_stopping(rv), 1);
        /* Thread 0 recorded IFD_EIO as its first error, so the cause is real. */
        ifd_error out;
        int rc = ifd_rendezvous_cause(rv, &out);
        RASSERT(rc == IFD_EIO, "round %d: cause %s '%s', expected a real error", round,
                ifd_errname(rc), out.msg);
        RASSERT(strncmp(out.msg, "thread ", 7) == 0 && strstr(out.msg, ": error 0") != NULL,
                "cause text '%s'", out.msg);
        int tid = atoi(out.msg + 7);
        RASSERT(tid % 2 == 0 && tid < n, "cause from thread %d, which only had secondary errors",
                tid);
        for (int i = 0; i < n; i++) {
            char src[24];
            snprintf(src, sizeof src, "thread %d", i);
            int want = (i % 2) ? IFD_ESTOPPED : IFD_EIO;
            rc = ifd_rendezvous_source_error(rv, src, &out);
            RASSERT(rc == want, "%s: kept %s, expected %s", src, ifd_errname(rc),
                    ifd_errname(want));
            RASSERT(strcmp(out.msg, "error 0") == 0, "%s kept '%s', expected 'error 0'", src,
                    out.msg);
        }
        ifd_rendezvous_destroy(rv);
    }
}
END_TEST

/* ---- thread ------------------------------------------------------------------------------- */

typedef struct name_ctx {
    atomic_int ready;
    atomic_int go;
    char name[32];
} name_ctx;

static void *name_main(void *arg)
{
    name_ctx *c = arg;
    /* Our own name, first thing; then stay alive until the starter has read it from outside. */
    pthread_getname_np(pthread_self(), c->name, sizeof c->name);
    atomic_store(&c->ready, 1);
    while (!atomic_load(&c->go))
        ifd_sleep_ns(MS / 10);
    return NULL;
}

START_TEST(test_thread_names)
{
    static const struct {
        const char *given, *kept;
    } k[] = {{"ifd-infeed", "ifd-infeed"},
             {"x", "x"},
             {"exactly-15-char", "exactly-15-char"},
             {"a-name-longer-than-fifteen", "a-name-longer-t"}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        name_ctx c;
        memset(&c, 0, sizeof c);
        atomic_init(&c.go, 0);
        atomic_init(&c.ready, 0);
        ifd_thread t;
        ck_assert_int_eq(ifd_thread_start(&t, k[i].given, name_main, &c), IFD_OK);
        ck_assert_int_eq(t.started, 1);
        while (!atomic_load(&c.ready))
            ifd_sleep_ns(MS / 10);
        char from_outside[32] = "";
        ck_assert_int_eq(pthread_getname_np(t.tid, from_outside, sizeof from_outside), 0);
        ck_assert_str_eq(from_outside, k[i].kept);
        atomic_store(&c.go, 1);
        ifd_thread_join(&t);
        ck_assert_str_eq(c.name, k[i].kept);
        ck_assert_int_eq(t.started, 0);
        ifd_thread_join(&t); /* joined twice: a no-op */
    }
    ifd_thread never;
    memset(&never, 0, sizeof never);
    ifd_thread_join(&never);
}
END_TEST

START_TEST(test_cond_wait_until_timeout)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_mutex m;
    ifd_cond c;
    ifd_mutex_init(&m);
    ifd_cond_init(&c);
    for (int i = 0; i < 4; i++) {
        int64_t wait = rand_between(&rng, 5, 60) * MS;
        ifd_mutex_lock(&m);
        int64_t t0 = ifd_clock_ns(), deadline = t0 + wait;
        int rc;
        do /* spurious wake-ups are allowed */
            rc = ifd_cond_wait_until(&c, &m, deadline);
        while (rc == 0 && ifd_clock_ns() < deadline);
        int64_t el = ifd_clock_ns() - t0;
        ifd_mutex_unlock(&m);
        RASSERT(rc == ETIMEDOUT, "wait_until returned %d, expected ETIMEDOUT", rc);
        RASSERT(el >= wait, "timed out after %" PRId64 " ns, deadline %" PRId64 " ns", el, wait);
        RASSERT(el < wait + 5000 * MS, "timed out after %" PRId64 " ns, deadline %" PRId64 " ns",
                el, wait);
    }
    /* A deadline in the past times out at once. */
    int64_t past[] = {0, ifd_clock_ns() - 1, ifd_clock_ns() - 1000 * MS};
    for (size_t i = 0; i < sizeof past / sizeof past[0]; i++) {
        ifd_mutex_lock(&m);
        int64_t t0 = ifd_clock_ns();
        int rc = ifd_cond_wait_until(&c, &m, past[i]);
        int64_t el = ifd_clock_ns() - t0;
        ifd_mutex_unlock(&m);
        ck_assert_int_eq(rc, ETIMEDOUT);
        ck_assert_msg(el < 1000 * MS, "a past deadline waited %" PRId64 " ns", el);
    }
    ifd_cond_fini(&c);
    ifd_mutex_fini(&m);
}
END_TEST

typedef struct wake_ctx {
    ifd_mutex m;
    ifd_cond c;
    int ready;
} wake_ctx;

static void *waker_main(void *arg)
{
    wake_ctx *w = arg;
    ifd_sleep_ns(30 * MS);
    ifd_mutex_lock(&w->m);
    w->ready = 1;
    ifd_cond_signal(&w->c);
    ifd_mutex_unlock(&w->m);
    return NULL;
}

START_TEST(test_cond_wait_until_woken)
{
    wake_ctx w;
    ifd_mutex_init(&w.m);
    ifd_cond_init(&w.c);
    w.ready = 0;
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, waker_main, &w), 0);
    int64_t t0 = ifd_clock_ns(), deadline = t0 + 20000 * MS;
    ifd_mutex_lock(&w.m);
    int rc = 0;
    while (!w.ready && rc == 0)
        rc = ifd_cond_wait_until(&w.c, &w.m, deadline);
    int ready = w.ready;
    ifd_mutex_unlock(&w.m);
    int64_t el = ifd_clock_ns() - t0;
    pthread_join(t, NULL);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(ready, 1);
    ck_assert_msg(el < 10000 * MS, "woken after %" PRId64 " ns", el);
    ifd_cond_fini(&w.c);
    ifd_mutex_fini(&w.m);
}
END_TEST

typedef struct count_ctx {
    ifd_mutex m;
    int64_t n;
    int iters;
} count_ctx;

static void *counter_main(void *arg)
{
    count_ctx *c = arg;
    for (int i = 0; i < c->iters; i++) {
        ifd_mutex_lock(&c->m);
        c->n++;
        ifd_mutex_unlock(&c->m);
    }
    return NULL;
}

START_TEST(test_mutex_and_clock)
{
    ifd_rng rng;
    seed_rng(&rng);
    count_ctx c = {.n = 0, .iters = (int)rand_between(&rng, 1000, 20000)};
    ifd_mutex_init(&c.m);
    int n = (int)rand_between(&rng, 2, 8);
    ifd_thread t[8];
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(ifd_thread_start(&t[i], "counter", counter_main, &c), IFD_OK);
    for (int i = 0; i < n; i++)
        ifd_thread_join(&t[i]);
    RASSERT(c.n == (int64_t)n * c.iters, "count %" PRId64 ", expected %" PRId64, c.n,
            (int64_t)n * c.iters);
    ifd_mutex_fini(&c.m);

    /* The clock is monotonic and sleep sleeps at least as asked. */
    int64_t prev = ifd_clock_ns();
    for (int i = 0; i < 1000; i++) {
        int64_t now = ifd_clock_ns();
        ck_assert_int_ge(now, prev);
        prev = now;
    }
    int64_t ns = rand_between(&rng, 1, 30) * MS;
    int64_t t0 = ifd_clock_ns();
    ifd_sleep_ns(ns);
    RASSERT(ifd_clock_ns() - t0 >= ns, "slept less than %" PRId64 " ns", ns);
}
END_TEST

static int flag_ready(void *arg)
{
    return atomic_load((atomic_int *)arg);
}

static void *raise_later(void *arg)
{
    ifd_sleep_ns(20 * MS);
    atomic_store((atomic_int *)arg, 1);
    return NULL;
}

/* ifd_spin_until: at once when ready, 0 after about the budget when never ready, and it sees a
 * flag raised by another thread while spinning. */
START_TEST(test_spin_until)
{
    ifd_rng rng;
    seed_rng(&rng);
    atomic_int flag;
    atomic_init(&flag, 1);
    ck_assert_int_eq(ifd_spin_until(flag_ready, &flag, 0), 1);
    ck_assert_int_eq(ifd_spin_until(flag_ready, &flag, 1000 * MS), 1);

    atomic_store(&flag, 0);
    int64_t budget = rand_between(&rng, 1, 20) * MS;
    int64_t t0 = ifd_clock_ns();
    int rc = ifd_spin_until(flag_ready, &flag, budget);
    int64_t el = ifd_clock_ns() - t0;
    ck_assert_int_eq(rc, 0);
    RASSERT(el >= budget, "gave up after %" PRId64 " ns, budget %" PRId64, el, budget);
    RASSERT(el < budget + 2000 * MS, "spun %" PRId64 " ns, budget %" PRId64, el, budget);

    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, raise_later, &flag), 0);
    rc = ifd_spin_until(flag_ready, &flag, 10000 * MS);
    pthread_join(t, NULL);
    ck_assert_int_eq(rc, 1);
}
END_TEST

/* ---- log ---------------------------------------------------------------------------------- */

START_TEST(test_log_levels)
{
    static const struct {
        const char *name;
        int level;
    } k[] = {{"error", IFD_LOG_ERROR},
             {"warn", IFD_LOG_WARN},
             {"info", IFD_LOG_INFO},
             {"debug", IFD_LOG_DEBUG}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        int out = -7;
        ck_assert_int_eq(ifd_log_level_parse(k[i].name, &out), IFD_OK);
        ck_assert_int_eq(out, k[i].level);
        ck_assert_str_eq(ifd_log_level_name(k[i].level), k[i].name);
    }
    const char *bad[] = {"", "ERROR", "warning", "trace", "debug ", "err"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int out = -7;
        ck_assert_msg(ifd_log_level_parse(bad[i], &out) == IFD_EINVAL, "parse('%s') accepted",
                      bad[i]);
        ck_assert_int_eq(out, -7);
    }
    ck_assert_str_eq(ifd_log_level_name(-1), "?");
    ck_assert_str_eq(ifd_log_level_name(4), "?");

    /* set/get, clamped to the known levels. */
    for (int l = IFD_LOG_ERROR; l <= IFD_LOG_DEBUG; l++) {
        ifd_log_set_level(l);
        ck_assert_int_eq(ifd_log_get_level(), l);
    }
    ifd_log_set_level(-5);
    ck_assert_int_eq(ifd_log_get_level(), IFD_LOG_ERROR);
    ifd_log_set_level(99);
    ck_assert_int_eq(ifd_log_get_level(), IFD_LOG_DEBUG);
}
END_TEST

static int g_calls;

static int bump(void)
{
    return ++g_calls;
}

static const char *bump_str(void)
{
    g_calls++;
    return "side effect";
}

/* Runs fn with stderr sent to a temporary file; returns what was written (malloc'd). */
static char *capture_stderr(void (*fn)(void))
{
    fflush(stderr);
    int saved = dup(2);
    ck_assert_int_ge(saved, 0);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    ck_assert_int_ge(dup2(fileno(tmp), 2), 0);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fseek(tmp, 0, SEEK_END);
    long n = ftell(tmp);
    ck_assert_int_ge(n, 0);
    rewind(tmp);
    char *buf = calloc((size_t)n + 1, 1);
    size_t got = fread(buf, 1, (size_t)n, tmp);
    buf[got] = '\0';
    fclose(tmp);
    return buf;
}

/* ---- journald: JOURNAL_STREAM names stderr --------------------------------------------------- */

static uint64_t g_journal_ino_offset; /* 0: JOURNAL_STREAM names stderr; else another inode */
static int g_journal_msg;             /* a random number in every line */

/* Sets JOURNAL_STREAM from the (redirected) stderr, then writes one line at each level. */
static void log_with_journal_stream(void)
{
    struct stat st;
    ck_assert_int_eq(fstat(2, &st), 0);
    char env[64];
    snprintf(env, sizeof env, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + g_journal_ino_offset);
    ck_assert_int_eq(setenv("JOURNAL_STREAM", env, 1), 0);
    ifd_log_set_level(IFD_LOG_DEBUG);
    IFD_LOG_ERROR("e %d", g_journal_msg);
    IFD_LOG_WARN("w %d", g_journal_msg);
    IFD_LOG_INFO("i %d", g_journal_msg);
    IFD_LOG_DEBUG("d %d", g_journal_msg);
}

START_TEST(test_log_journal_stream_matches)
{
    ifd_rng rng;
    seed_rng(&rng);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    struct stat st;
    ck_assert_int_eq(fstat(fileno(tmp), &st), 0);
    unsigned long long dev = (unsigned long long)st.st_dev, ino = (unsigned long long)st.st_ino;
    char good[64], other[64];
    snprintf(good, sizeof good, "%llu:%llu", dev, ino);
    ck_assert_int_eq(ifd_log_journal_stream_matches(good, fileno(tmp)), 1);
    for (int i = 0; i < 20; i++) {
        unsigned long long d = 1 + ifd_rng_below(&rng, 1000000);
        if (ifd_rng_below(&rng, 2))
            snprintf(other, sizeof other, "%llu:%llu", dev, ino + d);
        else
            snprintf(other, sizeof other, "%llu:%llu", dev + d, ino);
        RASSERT(ifd_log_journal_stream_matches(other, fileno(tmp)) == 0, "'%s' matched %s", other,
                good);
    }
    char bad[8][80];
    snprintf(bad[0], sizeof bad[0], "%llu:%llux", dev, ino);
    snprintf(bad[1], sizeof bad[1], " %llu:%llu", dev, ino);
    snprintf(bad[2], sizeof bad[2], "%llu:%llu:1", dev, ino);
    snprintf(bad[3], sizeof bad[3], "%llu", dev);
    snprintf(bad[4], sizeof bad[4], "%llu:", dev);
    snprintf(bad[5], sizeof bad[5], ":%llu", ino);
    snprintf(bad[6], sizeof bad[6], "%llu:-%llu", dev, ino);
    snprintf(bad[7], sizeof bad[7], "%llu;%llu", dev, ino);
    for (int i = 0; i < 8; i++)
        ck_assert_msg(ifd_log_journal_stream_matches(bad[i], fileno(tmp)) == 0, "'%s' matched",
                      bad[i]);
    ck_assert_int_eq(ifd_log_journal_stream_matches("", fileno(tmp)), 0);
    ck_assert_int_eq(ifd_log_journal_stream_matches(NULL, fileno(tmp)), 0);
    ck_assert_int_eq(ifd_log_journal_stream_matches(good, -1), 0);
    fclose(tmp);
}
END_TEST

/* JOURNAL_STREAM naming stderr: "<priority>infeed LEVEL [thread] message", no time. */
START_TEST(test_log_journal_priorities)
{
    ifd_rng rng;
    seed_rng(&rng);
    g_journal_msg = (int)ifd_rng_below(&rng, 1000000);
    g_journal_ino_offset = 0;
    char *out = capture_stderr(log_with_journal_stream);
    static const char *const pre[] = {"<3>infeed error [", "<4>infeed warn  [", "<6>infeed info  [",
                                      "<7>infeed debug ["};
    static const char tag[] = {'e', 'w', 'i', 'd'};
    char *line = out;
    for (int i = 0; i < 4; i++) {
        char *nl = strchr(line, '\n');
        RASSERT(nl != NULL, "line %d missing in '%s'", i, out);
        *nl = '\0';
        RASSERT(strncmp(line, pre[i], strlen(pre[i])) == 0, "line '%s' does not start '%s'", line,
                pre[i]);
        char end[32];
        snprintf(end, sizeof end, "] %c %d", tag[i], g_journal_msg);
        RASSERT(strlen(line) > strlen(end) && strcmp(line + strlen(line) - strlen(end), end) == 0,
                "line '%s' does not end '%s'", line, end);
        line = nl + 1;
    }
    RASSERT(*line == '\0', "more than 4 lines: '%s'", line);
    free(out);
}
END_TEST

/* JOURNAL_STREAM naming another file (inherited, stderr redirected): the usual lines, timed. */
START_TEST(test_log_journal_stream_elsewhere)
{
    ifd_rng rng;
    seed_rng(&rng);
    g_journal_msg = (int)ifd_rng_below(&rng, 1000000);
    g_journal_ino_offset = 1 + ifd_rng_below(&rng, 1000);
    char *out = capture_stderr(log_with_journal_stream);
    char *line = out;
    for (int i = 0; i < 4; i++) {
        char *nl = strchr(line, '\n');
        RASSERT(nl != NULL, "line %d missing in '%s'", i, out);
        *nl = '\0';
        int hh, mm, ss, ms, used = 0;
        RASSERT(sscanf(line, "%2d:%2d:%2d.%3d infeed %n", &hh, &mm, &ss, &ms, &used) == 4 &&
                    used == 20,
                "line '%s' does not start with the time and 'infeed'", line);
        line = nl + 1;
    }
    free(out);
}
END_TEST

static void log_disabled_lines(void)
{
    ifd_log_set_level(IFD_LOG_WARN);
    IFD_LOG_DEBUG("debug %d", bump());
    IFD_LOG_INFO("info %s %d", bump_str(), bump());
    IFD_LOG(IFD_LOG_DEBUG, "x %d", bump());
    ifd_log_set_level(IFD_LOG_ERROR);
    IFD_LOG_WARN("warn %d", bump());
}

static void log_enabled_lines(void)
{
    ifd_log_set_level(IFD_LOG_DEBUG);
    IFD_LOG_DEBUG("debug line %d", bump());
    IFD_LOG_ERROR("error line %s", bump_str());
}

START_TEST(test_log_disabled_not_evaluated)
{
    g_calls = 0;
    char *out = capture_stderr(log_disabled_lines);
    ck_assert_msg(g_calls == 0, "arguments of disabled log lines were evaluated %d times", g_calls);
    ck_assert_msg(out[0] == '\0', "disabled log lines wrote '%s'", out);
    free(out);

    /* Enabled lines do evaluate, format and write, with level and thread name. */
    g_calls = 0;
    pthread_setname_np(pthread_self(), "log-test");
    out = capture_stderr(log_enabled_lines);
    ck_assert_int_eq(g_calls, 2);
    ck_assert_msg(strstr(out, "debug line 1") != NULL, "output: '%s'", out);
    ck_assert_msg(strstr(out, "error line side effect") != NULL, "output: '%s'", out);
    ck_assert_msg(strstr(out, "debug") && strstr(out, "error") && strstr(out, "[log-test]"),
                  "output: '%s'", out);
    /* One line each. */
    int lines = 0;
    for (char *p = out; *p; p++)
        lines += *p == '\n';
    ck_assert_msg(lines == 2, "%d lines: '%s'", lines, out);
    free(out);
}
END_TEST

/* ---- main --------------------------------------------------------------------------------- */

static TCase *tcase(Suite *s, const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);
    return tc;
}

/* ---- regressions for defects found in review ---- */

START_TEST(test_cond_wait_until_past_deadlines)
{
    /* Any deadline in the past, negative included, times out at once instead of failing. */
    ifd_mutex m;
    ifd_cond c;
    ifd_mutex_init(&m);
    ifd_cond_init(&c);
    int64_t deadlines[] = {-1, -1000000000ll * 5 - 7, 0, ifd_clock_ns() - 1};
    ifd_mutex_lock(&m);
    for (size_t i = 0; i < sizeof deadlines / sizeof deadlines[0]; i++)
        ck_assert_int_eq(ifd_cond_wait_until(&c, &m, deadlines[i]), ETIMEDOUT);
    ifd_mutex_unlock(&m);
    ifd_cond_fini(&c);
    ifd_mutex_fini(&m);
}
END_TEST

static void *report_own_name(void *arg)
{
    /* The very first thing the thread does: its name must already be set. */
    pthread_getname_np(pthread_self(), arg, 16);
    return NULL;
}

START_TEST(test_thread_named_before_it_runs)
{
    for (int i = 0; i < 20; i++) {
        char seen[16] = "";
        char want[16];
        snprintf(want, sizeof want, "ifd-early%d", i);
        ifd_thread t;
        ck_assert_int_eq(ifd_thread_start(&t, want, report_own_name, seen), IFD_OK);
        ifd_thread_join(&t);
        ck_assert_str_eq(seen, want);
    }
}
END_TEST

START_TEST(test_rendezvous_many_sources)
{
    /* Far more sources than any fixed table: each keeps its own error under its own name. */
    ifd_rendezvous *rv;
    ck_assert_int_eq(ifd_rendezvous_create(&rv), IFD_OK);
    int n = 300;
    for (int i = 0; i < n; i++) {
        char src[32];
        snprintf(src, sizeof src, "replica %d", i);
        ifd_rendezvous_error(rv, src, i == n - 1 ? IFD_EIO : IFD_ESTOPPED, "from %d", i);
    }
    ifd_error e;
    ck_assert_int_eq(ifd_rendezvous_cause(rv, &e), IFD_EIO);
    ck_assert_str_eq(e.msg, "replica 299: from 299");
    ck_assert_int_eq(ifd_rendezvous_source_error(rv, "replica 150", &e), IFD_ESTOPPED);
    ck_assert_str_eq(e.msg, "from 150");
    ifd_rendezvous_destroy(rv);
}
END_TEST

static void log_long_line(void)
{
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ifd_log_set_level(IFD_LOG_ERROR);
    IFD_LOG_ERROR("%s", big);
    IFD_LOG_ERROR("after");
}

START_TEST(test_log_long_line_keeps_its_newline)
{
    char *out = capture_stderr(log_long_line);
    char *nl = strchr(out, '\n');
    ck_assert_ptr_nonnull(nl);
    ck_assert_msg(strstr(nl + 1, "after") != NULL && strchr(nl + 1, '\n') != NULL,
                  "the cut line ran into the next one: %.80s", nl);
    free(out);
}
END_TEST

/* Peer-chosen text cannot forge a log line: every byte outside printable ASCII, and the
 * backslash, is written as \xHH; the output is cut to fit and always terminated. */
START_TEST(test_log_escape)
{
    char out[64];
    ck_assert_str_eq(ifd_log_escape("loader-0", out, sizeof out), "loader-0");
    ck_assert_str_eq(ifd_log_escape("a\nINFO forged\\", out, sizeof out), "a\\x0aINFO forged\\x5c");
    ck_assert_str_eq(ifd_log_escape("\xc3\xa9", out, sizeof out), "\\xc3\\xa9");
    ifd_rng rng;
    ifd_rng_seed(&rng, 77);
    for (int trial = 0; trial < 200; trial++) {
        char in[100];
        int n = (int)rand_between(&rng, 0, 99);
        for (int i = 0; i < n; i++)
            in[i] = (char)rand_between(&rng, 1, 255);
        in[n] = '\0';
        size_t cap = (size_t)rand_between(&rng, 1, sizeof out);
        ifd_log_escape(in, out, cap);
        ck_assert_uint_lt(strlen(out), cap);
        for (const char *p = out; *p; p++)
            ck_assert_msg(*p >= 0x20 && *p < 0x7f, "byte 0x%02x in %s", (unsigned char)*p, out);
    }
}
END_TEST

/* A burst of lines is let through, the rest of the window held back and counted, and the count
 * is handed to the first line of the next window (synthetic times: no sleeping). */
START_TEST(test_log_limit)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, 78);
    for (int trial = 0; trial < 50; trial++) {
        int burst = (int)rand_between(&rng, 1, 5);
        int64_t interval = rand_between(&rng, 1000, 1000000000);
        ifd_log_limit l = IFD_LOG_LIMIT_INIT(burst, interval);
        long long sup;
        int64_t t0 = rand_between(&rng, 1, INT64_C(1) << 50), t = t0;
        int extra = (int)rand_between(&rng, 1, 20);
        for (int i = 0; i < burst; i++) {
            ck_assert_int_eq(ifd_log_limit_allow_at(&l, t, &sup), 1);
            ck_assert_int_eq(sup, 0);
            t += rand_between(&rng, 0, interval / (2 * burst + 2 * extra));
        }
        for (int i = 0; i < extra; i++) {
            ck_assert_int_eq(ifd_log_limit_allow_at(&l, t, &sup), 0);
            t += rand_between(&rng, 0, interval / (2 * burst + 2 * extra));
        }
        ck_assert_int_lt(t - t0, interval);
        t = t0 + interval + rand_between(&rng, 0, interval);
        ck_assert_int_eq(ifd_log_limit_allow_at(&l, t, &sup), 1);
        ck_assert_int_eq(sup, extra);
        ck_assert_int_eq(ifd_log_limit_allow_at(&l, t, &sup), burst > 1);
        ck_assert_int_eq(sup, 0);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("core");

    TCase *tc = tcase(s, "error");
    tcase_add_test(tc, test_error_names);
    tcase_add_test(tc, test_log_escape);
    tcase_add_test(tc, test_log_limit);
    tcase_add_test(tc, test_error_is_secondary);
    tcase_add_test(tc, test_error_set_and_text);
    tcase_add_test(tc, test_error_prefix);

    tc = tcase(s, "tensor");
    tcase_add_test(tc, test_dtype_names_sizes_parse);
    tcase_add_test(tc, test_tensor_init_and_shapes);
    tcase_add_test(tc, test_shape_format);
    tcase_add_test(tc, test_tensor_rows_share_bytes);

    tc = tcase(s, "rendezvous");
    tcase_add_test(tc, test_rendezvous_no_error);
    tcase_add_test(tc, test_rendezvous_cause_text);
    tcase_add_test(tc, test_rendezvous_first_real_error_wins);
    tcase_add_test(tc, test_rendezvous_source_keeps_first_real);
    tcase_add_test(tc, test_rendezvous_actions_order_and_abort);
    tcase_add_test(tc, test_rendezvous_concurrent_once);
    tcase_add_test(tc, test_rendezvous_many_sources);

    tc = tcase(s, "thread");
    tcase_add_test(tc, test_thread_names);
    tcase_add_test(tc, test_cond_wait_until_timeout);
    tcase_add_test(tc, test_cond_wait_until_woken);
    tcase_add_test(tc, test_mutex_and_clock);
    tcase_add_test(tc, test_spin_until);
    tcase_add_test(tc, test_cond_wait_until_past_deadlines);
    tcase_add_test(tc, test_thread_named_before_it_runs);

    tc = tcase(s, "log");
    tcase_add_test(tc, test_log_levels);
    tcase_add_test(tc, test_log_disabled_not_evaluated);
    tcase_add_test(tc, test_log_long_line_keeps_its_newline);
    tcase_add_test(tc, test_log_journal_stream_matches);
    tcase_add_test(tc, test_log_journal_priorities);
    tcase_add_test(tc, test_log_journal_stream_elsewhere);

    return tu_run_suite(s);
}
