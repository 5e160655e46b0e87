/*
 * Error codes (include/infeed/error.h): every code's name and description, which codes are
 * secondary (a consequence of another failure), and the sentence an error carries: set, cut to
 * the buffer, prefixed with its context.
 */
#include "tests/util/testutil.h"

#include "infeed/error.h"

#include <string.h>

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

/* A sentence about a setting carries its key and where it names it; ifd_error_name_key renames
 * those words only, wherever they stand, however often the key's text appears elsewhere. */
START_TEST(test_error_key)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error err;
    ifd_error_clear(&err);
    ck_assert_str_eq(err.key, "");
    int v = (int)rand_between(&rng, -1000, 0);
    ifd_error_set_key(&err, IFD_EINVAL, "batch_size", "expected batch_size above 0, got %d", v);
    char want[160];
    snprintf(want, sizeof want, "batch_size: expected batch_size above 0, got %d", v);
    ck_assert_str_eq(err.msg, want);
    ck_assert_str_eq(err.key, "batch_size");
    ck_assert_int_eq(err.key_at, 0);
    ck_assert_int_eq(err.key_len, 10);
    /* a prefix moves the words with it */
    int depth = (int)rand_between(&rng, 1, 9);
    for (int i = 0; i < depth; i++)
        ifd_error_prefix(&err, "ctx%d", i);
    ifd_error_name_key(&err, "--batch-size");
    char head[160] = "";
    for (int i = depth - 1; i >= 0; i--) {
        size_t n = strlen(head);
        snprintf(head + n, sizeof head - n, "ctx%d: ", i);
    }
    snprintf(want, sizeof want, "%s--batch-size: expected batch_size above 0, got %d", head, v);
    ck_assert_str_eq(err.msg, want);
    /* words in the middle of a sentence */
    ifd_error_set(&err, IFD_EINVAL, "program 'p': setting 'hidden' must be between 1 and 9");
    ck_assert_str_eq(err.key, "");
    ifd_error_name_key(&err, "--hidden"); /* no key: nothing changes */
    ck_assert_str_eq(err.msg, "program 'p': setting 'hidden' must be between 1 and 9");
    ck_assert_int_eq(ifd_error_mark_key(&err, "hidden", 13, 16), IFD_EINVAL);
    ifd_error_name_key(&err, "--hidden");
    ck_assert_str_eq(err.msg, "program 'p': --hidden must be between 1 and 9");
    /* words beyond the sentence are refused: no key */
    ifd_error_mark_key(&err, "hidden", (int)strlen(err.msg), 1);
    ck_assert_str_eq(err.key, "");
    /* a plain set forgets the key */
    ifd_error_set_key(&err, IFD_EINVAL, "replicas", "expected 1 to 1024, got 0");
    ifd_error_set(&err, IFD_EIO, "another");
    ck_assert_str_eq(err.key, "");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("error_codes");
    TCase *tc = tu_tcase(s, "error", 30);
    tcase_add_test(tc, test_error_names);
    tcase_add_test(tc, test_error_is_secondary);
    tcase_add_test(tc, test_error_set_and_text);
    tcase_add_test(tc, test_error_prefix);
    tcase_add_test(tc, test_error_key);
    return tu_run_suite(s);
}
