/* The run and input modes' names and the input modes' row arithmetic (infeed/modes.h): the
 * infeed, the outfeed, the device and the checkpoints need them, so they live in core/. */
#include <infeed/modes.h>
#include <infeed/error.h>

#include <string.h>

#define NAMES(type, fn_name, fn_parse, ...)                                                        \
    static const char *const fn_name##_table[] = {__VA_ARGS__};                                    \
    const char *fn_name(type v)                                                                    \
    {                                                                                              \
        if ((int)v < 0 || (size_t)v >= sizeof fn_name##_table / sizeof fn_name##_table[0])         \
            return "?";                                                                            \
        return fn_name##_table[v];                                                                 \
    }                                                                                              \
    int fn_parse(const char *s, type *out)                                                         \
    {                                                                                              \
        for (size_t i = 0; s && i < sizeof fn_name##_table / sizeof fn_name##_table[0]; i++) {     \
            if (strcmp(s, fn_name##_table[i]) == 0) {                                              \
                *out = (type)i;                                                                    \
                return IFD_OK;                                                                     \
            }                                                                                      \
        }                                                                                          \
        return IFD_EINVAL;                                                                         \
    }

NAMES(ifd_mode, ifd_mode_name, ifd_mode_parse, "train", "eval", "predict")
NAMES(ifd_input_mode, ifd_input_mode_name, ifd_input_mode_parse, "per-host", "per-host-v2",
      "per-core", "broadcast")
NAMES(ifd_loss_reduction, ifd_loss_reduction_name, ifd_loss_reduction_parse, "mean", "sum")
NAMES(ifd_optimizer_kind, ifd_optimizer_name, ifd_optimizer_parse, "sgd", "momentum", "adam",
      "adamw")
NAMES(ifd_lr_schedule, ifd_lr_schedule_name, ifd_lr_schedule_parse, "constant", "cosine", "linear")

int ifd_input_batches_per_step(ifd_input_mode mode, int replicas)
{
    switch (mode) {
    case IFD_INPUT_PER_HOST:
    case IFD_INPUT_BROADCAST:
        return 1;
    case IFD_INPUT_PER_HOST_V2:
    case IFD_INPUT_PER_CORE:
        return replicas;
    }
    return -1;
}

int64_t ifd_input_batch_rows(ifd_input_mode mode, int64_t batch_size, int replicas)
{
    if ((int)mode < IFD_INPUT_PER_HOST || mode > IFD_INPUT_BROADCAST || replicas < 1)
        return 0;
    return mode == IFD_INPUT_PER_HOST ? batch_size : batch_size / replicas;
}
