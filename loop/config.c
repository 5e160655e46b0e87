#include "infeed/infeed.h"
#include "infeed/hosts.h"

#include "device/cpu/blas.h"

#include <math.h>
#include <string.h>

void ifd_config_defaults(ifd_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = "cpu";
    cfg->blas_kernel = "auto";
    cfg->max_skipped_steps = 100;
    cfg->replicas = 1;
    cfg->program = "softmax";
    cfg->mode = IFD_MODE_TRAIN;
    cfg->input_mode = IFD_INPUT_PER_HOST;
    cfg->batch_size = 32;
    cfg->iterations_per_loop = 100;
    cfg->loop_kind = IFD_LOOP_STEPS;
    cfg->max_loop_secs = 0.5;
    cfg->num_steps = 0;
    cfg->last_step = 0;
    cfg->initial_global_step = 0;
    cfg->optimizer = (ifd_optimizer){
        .kind = IFD_OPT_SGD,
        .learning_rate = 0.1f,
        .momentum = 0.9f,
        .beta1 = 0.9f,
        .beta2 = 0.999f,
        .epsilon = 1e-8f,
    };
    cfg->loss_reduction = IFD_REDUCE_MEAN;
    cfg->summary_every = 100;
    cfg->seed = 1;
    cfg->infeed_depth = 16;
    cfg->outfeed_depth = 64;
}

const char *ifd_end_reason_name(ifd_end_reason r)
{
    static const char *const names[] = {"none", "last_step", "input_ended", "stopped", "error"};
    if ((int)r < 0 || (size_t)r >= sizeof names / sizeof names[0])
        return "?";
    return names[r];
}

#define MAX_REPLICAS 1024
#define MAX_DEPTH 65536
#define MAX_SECS 86400.0 /* a day: longer waits are a mistake, not a setting */

static int in_unit(float v)
{
    return isfinite(v) && v >= 0.0f && v < 1.0f;
}

int ifd_config_validate(const ifd_config *cfg, ifd_error *err)
{
    if (cfg->backend == NULL || (strcmp(cfg->backend, "cpu") && strcmp(cfg->backend, "cuda")))
        return ifd_error_set(err, IFD_EINVAL, "backend: expected cpu or cuda, got '%s'",
                             cfg->backend ? cfg->backend : "(none)");
    if (strcmp(cfg->backend, "cpu") == 0 && ifd_blas_check(cfg->blas_kernel, err))
        return IFD_EINVAL;
    if (cfg->max_skipped_steps < 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "max_skipped_steps: expected 0 (never end the run) or more, got %lld",
                             (long long)cfg->max_skipped_steps);
    if (cfg->replicas < 1 || cfg->replicas > MAX_REPLICAS)
        return ifd_error_set(err, IFD_EINVAL, "replicas: expected 1 to %d, got %d", MAX_REPLICAS,
                             cfg->replicas);
    if (cfg->program == NULL || ifd_program_find(cfg->program) == NULL) {
        char names[256];
        return ifd_error_set(err, IFD_EINVAL, "program: expected one of %s, got '%s'",
                             ifd_program_names(names, sizeof names),
                             cfg->program ? cfg->program : "(none)");
    }
    if ((int)cfg->mode < IFD_MODE_TRAIN || cfg->mode > IFD_MODE_PREDICT)
        return ifd_error_set(err, IFD_EINVAL, "mode: expected train, eval or predict, got %d",
                             (int)cfg->mode);
    if ((int)cfg->input_mode < IFD_INPUT_PER_HOST || cfg->input_mode > IFD_INPUT_BROADCAST)
        return ifd_error_set(err, IFD_EINVAL,
                             "input_mode: expected per-host, per-host-v2, per-core or broadcast, "
                             "got %d",
                             (int)cfg->input_mode);
    if (cfg->batch_size < 1)
        return ifd_error_set(err, IFD_EINVAL, "batch_size: expected a positive integer, got %lld",
                             (long long)cfg->batch_size);
    if (cfg->batch_size % cfg->replicas != 0)
        return ifd_error_set(
            err, IFD_EINVAL,
            "batch_size: %lld is not divisible by replicas %d (each replica's step "
            "takes batch_size / replicas rows)",
            (long long)cfg->batch_size, cfg->replicas);
    if ((int)cfg->loop_kind < IFD_LOOP_STEPS || cfg->loop_kind > IFD_LOOP_SECONDS)
        return ifd_error_set(err, IFD_EINVAL,
                             "loop_kind: expected IFD_LOOP_STEPS, IFD_LOOP_AUTO or "
                             "IFD_LOOP_SECONDS, got %d",
                             (int)cfg->loop_kind);
    if (cfg->loop_kind == IFD_LOOP_STEPS && cfg->iterations_per_loop < 1)
        return ifd_error_set(err, IFD_EINVAL,
                             "iterations_per_loop: expected a positive integer, got %lld",
                             (long long)cfg->iterations_per_loop);
    if (cfg->loop_kind == IFD_LOOP_SECONDS && !(cfg->loop_secs > 0.0 && cfg->loop_secs <= MAX_SECS))
        return ifd_error_set(err, IFD_EINVAL,
                             "loop_secs: expected seconds above 0, at most %g, got %g", MAX_SECS,
                             cfg->loop_secs);
    if (cfg->loop_kind == IFD_LOOP_AUTO &&
        !(cfg->max_loop_secs > 0.0 && cfg->max_loop_secs <= MAX_SECS))
        return ifd_error_set(err, IFD_EINVAL,
                             "max_loop_secs: expected seconds above 0, at most %g, got %g",
                             MAX_SECS, cfg->max_loop_secs);
    if (cfg->num_steps < 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "num_steps: expected a positive integer (0: unset), got %lld",
                             (long long)cfg->num_steps);
    if (cfg->last_step < 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "last_step: expected a positive integer (0: unset), got %lld",
                             (long long)cfg->last_step);
    if (cfg->mode == IFD_MODE_EVAL && cfg->num_steps < 1)
        return ifd_error_set(
            err, IFD_EINVAL,
            "num_steps: eval runs num_steps steps in one loop; expected a positive "
            "integer, got %lld",
            (long long)cfg->num_steps);
    if (cfg->mode == IFD_MODE_TRAIN && (cfg->num_steps > 0) == (cfg->last_step > 0))
        return ifd_error_set(err, IFD_EINVAL,
                             "num_steps and last_step: exactly one must be a positive integer, got "
                             "num_steps=%lld and last_step=%lld",
                             (long long)cfg->num_steps, (long long)cfg->last_step);
    if (cfg->initial_global_step < 0)
        return ifd_error_set(err, IFD_EINVAL, "initial_global_step: expected 0 or more, got %lld",
                             (long long)cfg->initial_global_step);
    const ifd_optimizer *o = &cfg->optimizer;
    if ((int)o->kind < IFD_OPT_SGD || o->kind > IFD_OPT_ADAM)
        return ifd_error_set(err, IFD_EINVAL, "optimizer: expected sgd, momentum or adam, got %d",
                             (int)o->kind);
    if (!(isfinite(o->learning_rate) && o->learning_rate > 0.0f))
        return ifd_error_set(err, IFD_EINVAL, "learning_rate: expected a positive number, got %g",
                             (double)o->learning_rate);
    if (o->kind == IFD_OPT_MOMENTUM && !in_unit(o->momentum))
        return ifd_error_set(err, IFD_EINVAL, "momentum: expected 0 <= momentum < 1, got %g",
                             (double)o->momentum);
    if (o->kind == IFD_OPT_ADAM) {
        if (!in_unit(o->beta1))
            return ifd_error_set(err, IFD_EINVAL, "beta1: expected 0 <= beta1 < 1, got %g",
                                 (double)o->beta1);
        if (!in_unit(o->beta2))
            return ifd_error_set(err, IFD_EINVAL, "beta2: expected 0 <= beta2 < 1, got %g",
                                 (double)o->beta2);
        if (!(isfinite(o->epsilon) && o->epsilon > 0.0f))
            return ifd_error_set(err, IFD_EINVAL, "epsilon: expected a positive number, got %g",
                                 (double)o->epsilon);
    }
    if ((int)cfg->loss_reduction < IFD_REDUCE_MEAN || cfg->loss_reduction > IFD_REDUCE_SUM)
        return ifd_error_set(err, IFD_EINVAL, "loss_reduction: expected mean or sum, got %d",
                             (int)cfg->loss_reduction);
    if (cfg->summary_every < 0)
        return ifd_error_set(err, IFD_EINVAL, "summary_every: expected 0 or more, got %lld",
                             (long long)cfg->summary_every);
    if (cfg->infeed_depth < 1 || cfg->infeed_depth > MAX_DEPTH)
        return ifd_error_set(err, IFD_EINVAL, "infeed_depth: expected 1 to %d, got %d", MAX_DEPTH,
                             cfg->infeed_depth);
    if (cfg->outfeed_depth < 1 || cfg->outfeed_depth > MAX_DEPTH)
        return ifd_error_set(err, IFD_EINVAL, "outfeed_depth: expected 1 to %d, got %d", MAX_DEPTH,
                             cfg->outfeed_depth);
    if (!(cfg->initial_infeed_sleep_secs >= 0.0 && cfg->initial_infeed_sleep_secs <= MAX_SECS))
        return ifd_error_set(err, IFD_EINVAL,
                             "initial_infeed_sleep_secs: expected seconds from 0 to %g, got %g",
                             MAX_SECS, cfg->initial_infeed_sleep_secs);
    if (cfg->hosts &&
        (cfg->hosts->size < 1 || cfg->hosts->rank < 0 || cfg->hosts->rank >= cfg->hosts->size ||
         (cfg->hosts->size > 1 && (cfg->hosts->ops == NULL || cfg->hosts->ops->allgather == NULL ||
                                   cfg->hosts->ops->allreduce_i64 == NULL))))
        return ifd_error_set(err, IFD_EINVAL,
                             "hosts: expected a rank in [0, size), size >= 1 and both collectives, "
                             "got rank %d of %d",
                             cfg->hosts->rank, cfg->hosts->size);
    if (ifd_hosts_many(cfg->hosts) && strcmp(cfg->backend, "cuda") == 0 &&
        cfg->hosts->ops->broadcast == NULL)
        return ifd_error_set(err, IFD_EINVAL,
                             "hosts: the cuda backend on %d hosts needs the broadcast collective "
                             "(rank 0's ncclUniqueId), and these hosts have none",
                             cfg->hosts->size);
    if (!(cfg->watchdog_secs >= 0.0 && cfg->watchdog_secs <= MAX_SECS))
        return ifd_error_set(err, IFD_EINVAL,
                             "watchdog_secs: expected seconds from 0 (off) to %g, got %g", MAX_SECS,
                             cfg->watchdog_secs);
    return IFD_OK;
}
