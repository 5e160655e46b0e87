/*
 * reduce_cli: one built-in host call (outfeed/reducers.h) over a .npy file, for the tests that
 * compare the reducers with numpy (tests/e2e/test_reducers_numpy.py). Test-only, not installed.
 *
 *   reduce_cli [--classes K] [--steps N] SPEC VALUES.npy [LABELS.npy]
 *
 * VALUES.npy: float32 or int32, C order, rank >= 1 (axis 0: rows); LABELS.npy: int32 with as
 * many rows, for the host calls that take a label. The rows are added in N steps of consecutive
 * rows (default 1; the step sizes from a fixed sequence, some empty), after ifd_reducer_check on
 * the row shapes. Prints the value as one line of JSON (keys sorted, doubles to 17 digits); an
 * error's sentence on stderr and exit status 1; a usage error exits 2.
 */
#include "outfeed/reducers.h"
#include "tests/util/reducer_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct npy {
    ifd_tensor t;
    void *data;
} npy;

static int fail(const char *what, const char *path)
{
    fprintf(stderr, "reduce_cli: %s: %s\n", path, what);
    return -1;
}

/* The value of 'key': in a .npy header dict, after its colon. */
static const char *dict_value(const char *h, const char *key)
{
    const char *p = strstr(h, key);
    if (p == NULL)
        return NULL;
    p = strchr(p + strlen(key), ':');
    if (p == NULL)
        return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

static int npy_read(const char *path, npy *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return fail("cannot open", path);
    unsigned char pre[10];
    int rc = -1;
    char *h = NULL;
    if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        fail("not a .npy file", path);
        goto done;
    }
    size_t hlen;
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2)
            goto truncated;
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
    } else {
        unsigned char l[4];
        if (fread(l, 1, 4, f) != 4)
            goto truncated;
        hlen = (size_t)l[0] | (size_t)l[1] << 8 | (size_t)l[2] << 16 | (size_t)l[3] << 24;
    }
    h = calloc(hlen + 1, 1);
    if (h == NULL || fread(h, 1, hlen, f) != hlen)
        goto truncated;
    const char *descr = dict_value(h, "'descr'"), *fo = dict_value(h, "'fortran_order'"),
               *shape = dict_value(h, "'shape'");
    if (descr == NULL || fo == NULL || shape == NULL || *shape != '(') {
        fail("a header without descr, fortran_order or shape", path);
        goto done;
    }
    ifd_dtype dt;
    if (strncmp(descr, "'<f4'", 5) == 0)
        dt = IFD_F32;
    else if (strncmp(descr, "'<i4'", 5) == 0)
        dt = IFD_I32;
    else {
        fail("expected dtype '<f4' or '<i4'", path);
        goto done;
    }
    if (strncmp(fo, "False", 5) != 0) {
        fail("expected C order", path);
        goto done;
    }
    int64_t dims[IFD_MAX_RANK];
    int rank = 0;
    const char *p = shape + 1;
    while (*p != ')') {
        char *end;
        long long d = strtoll(p, &end, 10);
        if (end == p || rank == IFD_MAX_RANK) {
            fail("a shape that is not a tuple of at most 8 sizes", path);
            goto done;
        }
        dims[rank++] = d;
        p = end;
        while (*p == ',' || *p == ' ')
            p++;
    }
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= dims[i];
    out->data = malloc((size_t)n * 4 + 1);
    if (out->data == NULL || fread(out->data, 4, (size_t)n, f) != (size_t)n)
        goto truncated;
    ifd_tensor_init(&out->t, dt, rank, dims, out->data);
    rc = 0;
    goto done;
truncated:
    fail("truncated", path);
done:
    free(h);
    fclose(f);
    return rc;
}

static int usage(void)
{
    fprintf(stderr, "usage: reduce_cli [--classes K] [--steps N] SPEC VALUES.npy [LABELS.npy]\n");
    return 2;
}

int main(int argc, char **argv)
{
    long long classes = 0, steps = 1;
    int i = 1;
    for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (strcmp(argv[i], "--classes") == 0)
            classes = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--steps") == 0)
            steps = atoll(argv[i + 1]);
        else
            return usage();
    }
    if (argc - i < 2 || argc - i > 3 || steps < 1)
        return usage();
    const char *spec = argv[i], *values_path = argv[i + 1];
    const char *labels_path = argc - i == 3 ? argv[i + 2] : NULL;
    npy values, labels = {0};
    if (npy_read(values_path, &values) != 0 || (labels_path && npy_read(labels_path, &labels)))
        return 2;
    if (values.t.shape.rank < 1 || (labels_path && labels.t.shape.rank < 1))
        return usage();

    ifd_error err = {0};
    ifd_reducer *r = NULL;
    int rc = ifd_reducer_create(&r, "x", spec, classes, &err);
    ifd_shape row = tu_row_of(&values.t), lrow = labels_path ? tu_row_of(&labels.t) : row;
    if (rc == IFD_OK)
        rc = ifd_reducer_check(r, values.t.dtype, &row, labels.t.dtype, labels_path ? &lrow : NULL,
                               &err);
    /* steps chunks of consecutive rows: sizes 0, 1, 2, ... as the rows allow, the rest last */
    int64_t rows = values.t.shape.dims[0], at = 0;
    for (long long s = 0; rc == IFD_OK && s < steps; s++) {
        int64_t take = s == steps - 1 ? rows - at : (s % 4 == 1 ? 0 : (s * 7919) % (rows + 1));
        if (take > rows - at)
            take = rows - at;
        ifd_tensor part, lpart;
        ifd_tensor_rows(&values.t, at, at + take, &part);
        if (labels_path)
            ifd_tensor_rows(&labels.t, at, at + take, &lpart);
        rc = ifd_reducer_add(r, &part, labels_path ? &lpart : NULL, &err);
        at += take;
    }
    if (rc != IFD_OK) {
        fprintf(stderr, "%s\n", ifd_error_text(&err));
    } else {
        json_t *v = ifd_reducer_value(r);
        char *s = v ? json_dumps(v, JSON_SORT_KEYS | JSON_COMPACT | JSON_ENCODE_ANY |
                                        JSON_REAL_PRECISION(17))
                    : NULL;
        if (s == NULL) {
            fprintf(stderr, "reduce_cli: out of memory\n");
            rc = IFD_ENOMEM;
        } else {
            printf("%s\n", s);
        }
        free(s);
        json_decref(v);
    }
    ifd_reducer_destroy(r);
    free(values.data);
    free(labels.data);
    return rc == IFD_OK ? 0 : 1;
}
