#include "outfeed/hostcall.h"

#include "core/batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ifd_outfeed_concat(const ifd_outfeed_rec *recs, int replicas, float *buf,
                        ifd_tensor out[IFD_OUT_NTENSORS])
{
    int64_t dims[1] = {replicas};
    for (int t = 0; t < IFD_OUT_NTENSORS; t++)
        ifd_tensor_init(&out[t], IFD_F32, 1, dims, buf + (size_t)t * (size_t)replicas);
    for (int r = 0; r < replicas; r++) {
        buf[IFD_OUT_LOSS * replicas + r] = recs[r].out.loss;
        buf[IFD_OUT_CORRECT * replicas + r] = recs[r].out.correct;
        buf[IFD_OUT_COUNT * replicas + r] = recs[r].out.count;
    }
}

int ifd_metrics_host_call(ifd_metrics *m, const ifd_tensor t[IFD_OUT_NTENSORS], ifd_error *err)
{
    const float *loss = t[IFD_OUT_LOSS].data, *correct = t[IFD_OUT_CORRECT].data,
                *count = t[IFD_OUT_COUNT].data;
    int64_t n = t[IFD_OUT_LOSS].shape.dims[0];
    double step_loss = 0.0;
    for (int64_t r = 0; r < n; r++) {
        if (!isfinite(loss[r]))
            return ifd_error_set(err, IFD_ENUMERIC,
                                 "replica %lld's loss is %g: the model diverged or the input "
                                 "holds NaN or infinity",
                                 (long long)r, (double)loss[r]);
        step_loss += loss[r];
    }
    for (int64_t r = 0; r < n; r++) {
        m->correct += correct[r];
        m->count += count[r];
        m->loss_weighted += (double)loss[r] * (double)count[r];
    }
    m->loss_sum += step_loss;
    m->steps++;
    return IFD_OK;
}

int ifd_prediction_call_init(ifd_prediction_call *c, const ifd_program *p, int64_t max_rows)
{
    memset(c, 0, sizeof *c);
    c->program = p;
    c->max_rows = max_rows;
    c->values = malloc(sizeof(float) * (size_t)(max_rows * p->predict_cols + 1));
    c->classes = malloc(sizeof(int32_t) * (size_t)(max_rows + 1));
    if (c->values == NULL || c->classes == NULL) {
        ifd_prediction_call_fini(c);
        return IFD_ENOMEM;
    }
    return IFD_OK;
}

void ifd_prediction_call_fini(ifd_prediction_call *c)
{
    free(c->values);
    free(c->classes);
    c->values = NULL;
    c->classes = NULL;
}

/* recs[0..n) are one batch's shards: concatenate, cut the padding, hand to the sinks. */
static int deliver(ifd_prediction_call *c, const ifd_outfeed_rec *recs, int n, int64_t *examples,
                   ifd_error *err)
{
    const ifd_batch *b = recs[0].batch;
    int64_t cols = c->program->predict_cols;
    int64_t valid = (b->flags & IFD_BATCH_PADDED) ? b->valid_rows : b->rows, rows = 0;
    for (int i = 0; i < n && rows < valid; i++) {
        if (i > 0 && recs[i].row0 == recs[0].row0)
            break; /* broadcast: every replica had the same rows; replica 0's copy is used */
        if (recs[i].row0 != rows || rows + recs[i].rows > c->max_rows)
            return ifd_error_set(err, IFD_EINTERNAL,
                                 "predictions of batch %lld: a shard at row %lld, expected row "
                                 "%lld",
                                 (long long)b->seq, (long long)recs[i].row0, (long long)rows);
        int64_t take = recs[i].rows < valid - rows ? recs[i].rows : valid - rows;
        memcpy(c->values + rows * cols, recs[i].pred, sizeof(float) * (size_t)(take * cols));
        rows += take;
    }
    if (rows == 0)
        return IFD_OK; /* all padding */
    ifd_predictions p = {.rows = rows};
    int64_t dims[2] = {rows, cols};
    if (c->program->classifier) {
        for (int64_t r = 0; r < rows; r++) {
            const float *v = c->values + r * cols;
            int32_t arg = 0;
            for (int64_t j = 1; j < cols; j++)
                if (v[j] > v[arg])
                    arg = (int32_t)j;
            c->classes[r] = arg;
        }
        p.ntensors = 2;
        p.names[0] = "probabilities";
        p.names[1] = "classes";
        ifd_tensor_init(&p.tensors[0], IFD_F32, 2, dims, c->values);
        ifd_tensor_init(&p.tensors[1], IFD_I32, 1, dims, c->classes);
    } else {
        p.ntensors = 1;
        p.names[0] = "outputs";
        ifd_tensor_init(&p.tensors[0], IFD_F32, 2, dims, c->values);
    }
    for (int s = 0; s < c->nsinks; s++) {
        int rc = c->sinks[s].write(c->sinks[s].ctx, b, &p, err);
        if (rc)
            return rc;
    }
    *examples += rows;
    return IFD_OK;
}

int ifd_prediction_host_call(ifd_prediction_call *c, ifd_outfeed_rec *recs, int replicas,
                             int64_t *examples, ifd_error *err)
{
    int rc = IFD_OK;
    *examples = 0;
    for (int r = 0; r < replicas;) {
        int n = 1;
        while (r + n < replicas && recs[r + n].batch == recs[r].batch)
            n++;
        if (rc == IFD_OK && recs[r].batch)
            rc = deliver(c, &recs[r], n, examples, err);
        r += n;
    }
    for (int r = 0; r < replicas; r++) {
        if (recs[r].batch)
            ifd_batch_unref(recs[r].batch);
        recs[r].batch = NULL;
    }
    return rc;
}
