#include "outfeed/outfeed_internal.h"

#include <math.h>

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
    }
    m->loss_sum += step_loss;
    m->steps++;
    return IFD_OK;
}
