/*
 * A host call plugin (include/infeed/host_call.h): "calibration", how confident a classifier is
 * when it is right and when it is wrong. It takes the outfeed tensors every built-in classifier
 * declares, class (int32 [rows], the argmax), confidence (float32 [rows], its probability) and
 * label (int32 [rows]), and reports over each summary's steps (the whole eval in eval mode):
 *
 *   {"right": rows predicted right, "wrong": rows predicted wrong,
 *    "confidence_right": mean confidence when right, "confidence_wrong": ... when wrong}
 *
 * (the means are null without rows). Build it with examples/host_call/CMakeLists.txt against an
 * installed infeed; run infeedd --host-call-lib calibration.so.
 */
#include <infeed/host_call.h>

#include <stdio.h>
#include <stdlib.h>

typedef struct calibration {
    int64_t right, wrong;
    double conf_right, conf_wrong;
} calibration;

static int cal_init(void **state, const ifd_host_call_info *info, ifd_error *err)
{
    (void)info;
    *state = calloc(1, sizeof(calibration));
    return *state ? IFD_OK : ifd_error_set(err, IFD_ENOMEM, "calibration: its state");
}

static int cal_step(void *state, int64_t global_step, const ifd_tensor *t, ifd_error *err)
{
    calibration *c = state;
    const int32_t *cls = t[0].data, *label = t[2].data;
    const float *conf = t[1].data;
    int64_t rows = t[0].shape.dims[0];
    if (t[0].dtype != IFD_I32 || t[1].dtype != IFD_F32 || t[2].dtype != IFD_I32 ||
        t[1].shape.dims[0] != rows || t[2].shape.dims[0] != rows)
        return ifd_error_set(err, IFD_EINVAL,
                             "calibration: step %lld: expected class int32 [rows], confidence "
                             "float32 [rows] and label int32 [rows]",
                             (long long)global_step);
    for (int64_t i = 0; i < rows; i++) {
        if (cls[i] == label[i]) {
            c->right++;
            c->conf_right += conf[i];
        } else {
            c->wrong++;
            c->conf_wrong += conf[i];
        }
    }
    return IFD_OK;
}

static void mean(char *buf, size_t len, double sum, int64_t n)
{
    if (n)
        snprintf(buf, len, "%.9g", sum / (double)n);
    else
        snprintf(buf, len, "null");
}

static int cal_summary(void *state, char *json, size_t len, ifd_error *err)
{
    calibration *c = state;
    char r[32], w[32];
    mean(r, sizeof r, c->conf_right, c->right);
    mean(w, sizeof w, c->conf_wrong, c->wrong);
    int n = snprintf(json, len,
                     "{\"right\": %lld, \"wrong\": %lld, \"confidence_right\": %s, "
                     "\"confidence_wrong\": %s}",
                     (long long)c->right, (long long)c->wrong, r, w);
    if (n < 0 || (size_t)n >= len)
        return ifd_error_set(err, IFD_ERANGE, "calibration: %zu bytes are too few", len);
    *c = (calibration){0};
    return IFD_OK;
}

static const ifd_host_call_class calibration_class = {
    .name = "calibration",
    .ntensors = 3,
    .tensors = {"class", "confidence", "label"},
    .init = cal_init,
    .step = cal_step,
    .summary = cal_summary,
    .destroy = free,
};

static int register_calls(ifd_host_call_registry *reg, ifd_error *err)
{
    return reg->add(reg, &calibration_class, err);
}

IFD_HOST_CALL_PLUGIN(register_calls)
