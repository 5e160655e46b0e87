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

int main(void)
{
    Suite *s = suite_create("error_codes");
    TCase *tc = tu_tcase(s, "error", 30);
    tcase_add_test(tc, test_error_names);
    tcase_add_test(tc, test_error_is_secondary);
    tcase_add_test(tc, test_error_set_and_text);
    tcase_add_test(tc, test_error_prefix);
    return tu_run_suite(s);
}
