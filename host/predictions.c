#include "host/predictions.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ifd_predictions_file {
    FILE *f;
    char path[512];
};

int ifd_predictions_file_open(ifd_predictions_file **out, const char *path, ifd_error *err)
{
    *out = NULL;
    ifd_predictions_file *pf = calloc(1, sizeof *pf);
    if (pf == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "predictions: %s", path);
    snprintf(pf->path, sizeof pf->path, "%s", path);
    pf->f = fopen(path, "w");
    if (pf->f == NULL) {
        int e = errno;
        free(pf);
        return ifd_error_set(err, IFD_EIO, "predictions: cannot create '%s': %s", path,
                             strerror(e));
    }
    *out = pf;
    return IFD_OK;
}

/* Row r of tensor t as JSON: a number for a one-dimensional tensor, else an array. */
static json_t *row_json(const ifd_tensor *t, int64_t r)
{
    int64_t cols = 1;
    for (int d = 1; d < t->shape.rank; d++)
        cols *= t->shape.dims[d];
    json_t *a = t->shape.rank > 1 ? json_array() : NULL;
    for (int64_t j = 0; j < cols; j++) {
        json_t *v = t->dtype == IFD_F32 ? json_real((double)((const float *)t->data)[r * cols + j])
                                        : json_integer(((const int32_t *)t->data)[r * cols + j]);
        if (a == NULL)
            return v;
        json_array_append_new(a, v);
    }
    return a;
}

static int write_predictions(void *ctx, const ifd_batch *b, const ifd_predictions *p,
                             ifd_error *err)
{
    ifd_predictions_file *pf = ctx;
    for (int64_t r = 0; r < p->rows; r++) {
        json_t *j = json_object();
        json_object_set_new(j, "producer", json_string(b->producer ? b->producer : ""));
        json_object_set_new(j, "seq", json_integer(b->seq));
        json_object_set_new(j, "row", json_integer(r));
        for (int i = 0; i < p->ntensors; i++)
            json_object_set_new(j, p->names[i], row_json(&p->tensors[i], r));
        int rc = json_dumpf(j, pf->f, JSON_COMPACT);
        json_decref(j);
        if (rc || fputc('\n', pf->f) == EOF)
            return ifd_error_set(err, IFD_EIO, "predictions: writing '%s': %s", pf->path,
                                 strerror(errno));
    }
    if (fflush(pf->f))
        return ifd_error_set(err, IFD_EIO, "predictions: writing '%s': %s", pf->path,
                             strerror(errno));
    return IFD_OK;
}

ifd_prediction_sink ifd_predictions_file_sink(ifd_predictions_file *f)
{
    return (ifd_prediction_sink){.write = write_predictions, .ctx = f};
}

int ifd_predictions_file_close(ifd_predictions_file *pf, ifd_error *err)
{
    if (pf == NULL)
        return IFD_OK;
    int rc = fclose(pf->f) ? ifd_error_set(err, IFD_EIO, "predictions: closing '%s': %s", pf->path,
                                           strerror(errno))
                           : IFD_OK;
    free(pf);
    return rc;
}
