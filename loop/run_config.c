#include <infeed/infeed.h>
#include <infeed/hosts.h>

#include "device/cpu/blas.h"
#include "loop/config_ranges.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
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
    cfg->max_loop_seconds = 0.5;
    cfg->steps = 0;
    cfg->last_step = 0;
    cfg->initial_global_step = 0;
    cfg->optimizer = (ifd_optimizer){
        .kind = IFD_OPT_SGD,
        .learning_rate = 0.1f,
        .momentum = 0.9f,
        .beta1 = 0.9f,
        .beta2 = 0.999f,
        .epsilon = 1e-8f,
        .weight_decay = 0.004f, /* Keras's AdamW */
        .lr_schedule = IFD_LR_CONSTANT,
    };
    cfg->loss_reduction = IFD_REDUCE_MEAN;
    cfg->summary_every = 100;
    cfg->seed = 1;
    cfg->infeed_depth = 16;
    cfg->outfeed_depth = 64;
    cfg->cuda_graphs = 1;
}

const char *ifd_end_reason_name(ifd_end_reason r)
{
    static const char *const names[] = {"none",    "last_step", "input_ended",
                                        "stopped", "error",     "early_stopping"};
    if ((int)r < 0 || (size_t)r >= sizeof names / sizeof names[0])
        return "?";
    return names[r];
}

#define MAX_REPLICAS 1024
#define MAX_DEPTH 65536
#define MAX_SECS 86400.0 /* a day: longer waits are a mistake, not a setting */

/* The numeric keys' ranges: one row a key, checked in this order by ifd_config_validate. A value
 * outside [min, max] (min or max itself excluded when open) is an IFD_EINVAL whose sentence is
 * "key: expected <expect>, got <value>". */
typedef enum { RANGE_INT, RANGE_I64, RANGE_F32, RANGE_F64 } range_type;
enum { OPEN_MIN = 1, OPEN_MAX = 2 };
typedef struct config_range {
    const char *key;
    range_type type;
    size_t off;
    double min, max;
    int open;
    const char *expect;
    int (*applies)(const ifd_config *cfg); /* NULL: always */
} config_range;

static int loop_steps(const ifd_config *c)
{
    return c->loop_kind == IFD_LOOP_STEPS;
}
static int loop_seconds(const ifd_config *c)
{
    return c->loop_kind == IFD_LOOP_SECONDS;
}
static int uses_momentum(const ifd_config *c)
{
    return c->optimizer.kind == IFD_OPT_MOMENTUM;
}
static int uses_adam(const ifd_config *c)
{
    return c->optimizer.kind == IFD_OPT_ADAM || c->optimizer.kind == IFD_OPT_ADAMW;
}
static int uses_adamw(const ifd_config *c)
{
    return c->optimizer.kind == IFD_OPT_ADAMW;
}

#define CFG(field) offsetof(ifd_config, field)
#define I64_MAX 9.2e18
static const config_range config_ranges[] = {
    {"max_skipped_steps", RANGE_I64, CFG(max_skipped_steps), 0, I64_MAX, 0,
     "0 (never end the run) or more", NULL},
    {"replicas", RANGE_INT, CFG(replicas), 1, MAX_REPLICAS, 0, "1 to 1024", NULL},
    {"batch_size", RANGE_I64, CFG(batch_size), 1, I64_MAX, 0, "a positive integer", NULL},
    {"iterations_per_loop", RANGE_I64, CFG(iterations_per_loop), 1, I64_MAX, 0,
     "a positive integer", loop_steps},
    {"loop_secs", RANGE_F64, CFG(loop_secs), 0, MAX_SECS, OPEN_MIN,
     "seconds above 0, at most 86400", loop_seconds},
    {"max_loop_seconds", RANGE_F64, CFG(max_loop_seconds), 0, MAX_SECS, OPEN_MIN,
     "seconds above 0, at most 86400", NULL},
    {"steps", RANGE_I64, CFG(steps), 0, I64_MAX, 0, "a positive integer (0: unset)", NULL},
    {"last_step", RANGE_I64, CFG(last_step), 0, I64_MAX, 0, "a positive integer (0: unset)", NULL},
    {"initial_global_step", RANGE_I64, CFG(initial_global_step), 0, I64_MAX, 0, "0 or more", NULL},
    {"learning_rate", RANGE_F32, CFG(optimizer.learning_rate), 0, FLT_MAX, OPEN_MIN,
     "a positive number", NULL},
    {"momentum", RANGE_F32, CFG(optimizer.momentum), 0, 1, OPEN_MAX, "0 <= momentum < 1",
     uses_momentum},
    {"beta1", RANGE_F32, CFG(optimizer.beta1), 0, 1, OPEN_MAX, "0 <= beta1 < 1", uses_adam},
    {"beta2", RANGE_F32, CFG(optimizer.beta2), 0, 1, OPEN_MAX, "0 <= beta2 < 1", uses_adam},
    {"epsilon", RANGE_F32, CFG(optimizer.epsilon), 0, FLT_MAX, OPEN_MIN, "a positive number",
     uses_adam},
    {"weight_decay", RANGE_F32, CFG(optimizer.weight_decay), 0, FLT_MAX, 0, "0 or more",
     uses_adamw},
    {"clip_norm", RANGE_F32, CFG(optimizer.clip_norm), 0, FLT_MAX, 0,
     "0 (no clipping) or a positive norm", NULL},
    {"warmup_steps", RANGE_I64, CFG(optimizer.warmup_steps), 0, I64_MAX, 0, "0 or more", NULL},
    {"decay_steps", RANGE_I64, CFG(optimizer.decay_steps), 0, I64_MAX, 0, "0 or more", NULL},
    {"min_learning_rate", RANGE_F32, CFG(optimizer.min_learning_rate), 0, FLT_MAX, 0, "0 or more",
     NULL},
    {"summary_every", RANGE_I64, CFG(summary_every), 0, I64_MAX, 0, "0 or more", NULL},
    {"infeed_depth", RANGE_INT, CFG(infeed_depth), 1, MAX_DEPTH, 0, "1 to 65536", NULL},
    {"outfeed_depth", RANGE_INT, CFG(outfeed_depth), 1, MAX_DEPTH, 0, "1 to 65536", NULL},
    {"initial_infeed_sleep", RANGE_F64, CFG(initial_infeed_sleep), 0, MAX_SECS, 0,
     "seconds from 0 to 86400", NULL},
    {"watchdog", RANGE_F64, CFG(watchdog), 0, MAX_SECS, 0, "seconds from 0 (off) to 86400", NULL},
    {"replica_threads", RANGE_INT, CFG(replica_threads), 0, 1024, 0, "0 (auto) to 1024", NULL},
    {"cuda_graphs", RANGE_INT, CFG(cuda_graphs), 0, 1, 0, "0 (off) or 1 (on)", NULL},
};

const char *ifd_config_range_text(const char *key)
{
    for (size_t i = 0; key && i < sizeof config_ranges / sizeof config_ranges[0]; i++)
        if (strcmp(config_ranges[i].key, key) == 0)
            return config_ranges[i].expect;
    return NULL;
}

static int check_range(const ifd_config *cfg, const config_range *r, ifd_error *err)
{
    if (r->applies && !r->applies(cfg))
        return IFD_OK;
    const char *field = (const char *)cfg + r->off;
    double v;
    char got[48];
    switch (r->type) {
    case RANGE_INT:
        v = *(const int *)field;
        snprintf(got, sizeof got, "%d", *(const int *)field);
        break;
    case RANGE_I64:
        v = (double)*(const int64_t *)field;
        snprintf(got, sizeof got, "%lld", (long long)*(const int64_t *)field);
        break;
    case RANGE_F32:
        v = *(const float *)field;
        snprintf(got, sizeof got, "%g", v);
        break;
    default:
        v = *(const double *)field;
        snprintf(got, sizeof got, "%g", v);
        break;
    }
    int low_ok = (r->open & OPEN_MIN) ? v > r->min : v >= r->min;
    int high_ok = (r->open & OPEN_MAX) ? v < r->max : v <= r->max;
    if (low_ok && high_ok)
        return IFD_OK;
    return ifd_error_set_key(err, IFD_EINVAL, r->key, "expected %s, got %s", r->expect, got);
}

/* The keys with names: the backend, the program and the enums. */
static int check_names(const ifd_config *cfg, ifd_error *err)
{
    if (cfg->backend == NULL || (strcmp(cfg->backend, "cpu") && strcmp(cfg->backend, "cuda")))
        return ifd_error_set_key(err, IFD_EINVAL, "backend", "expected cpu or cuda, got '%s'",
                                 cfg->backend ? cfg->backend : "(none)");
    if (strcmp(cfg->backend, "cpu") == 0 && ifd_blas_check(cfg->blas_kernel, err))
        return IFD_EINVAL;
    if (cfg->program == NULL || ifd_program_find(cfg->program) == NULL) {
        char names[256];
        return ifd_error_set_key(err, IFD_EINVAL, "program", "expected one of %s, got '%s'",
                                 ifd_program_names(names, sizeof names),
                                 cfg->program ? cfg->program : "(none)");
    }
    if ((int)cfg->mode < IFD_MODE_TRAIN || cfg->mode > IFD_MODE_PREDICT)
        return ifd_error_set_key(err, IFD_EINVAL, "mode", "expected train, eval or predict, got %d",
                                 (int)cfg->mode);
    if ((int)cfg->input_mode < IFD_INPUT_PER_HOST || cfg->input_mode > IFD_INPUT_BROADCAST)
        return ifd_error_set_key(err, IFD_EINVAL, "input_mode",
                                 "expected per-host, per-host-v2, per-core or broadcast, got %d",
                                 (int)cfg->input_mode);
    if ((int)cfg->loop_kind < IFD_LOOP_STEPS || cfg->loop_kind > IFD_LOOP_SECONDS)
        return ifd_error_set_key(
            err, IFD_EINVAL, "loop_kind",
            "expected IFD_LOOP_STEPS, IFD_LOOP_AUTO or IFD_LOOP_SECONDS, got %d",
            (int)cfg->loop_kind);
    if ((int)cfg->optimizer.kind < IFD_OPT_SGD || cfg->optimizer.kind > IFD_OPT_ADAMW)
        return ifd_error_set_key(err, IFD_EINVAL, "optimizer",
                                 "expected sgd, momentum, adam or adamw, got %d",
                                 (int)cfg->optimizer.kind);
    if ((int)cfg->optimizer.lr_schedule < IFD_LR_CONSTANT ||
        cfg->optimizer.lr_schedule > IFD_LR_LINEAR)
        return ifd_error_set_key(err, IFD_EINVAL, "lr_schedule",
                                 "expected constant, cosine or linear, got %d",
                                 (int)cfg->optimizer.lr_schedule);
    if ((int)cfg->loss_reduction < IFD_REDUCE_MEAN || cfg->loss_reduction > IFD_REDUCE_SUM)
        return ifd_error_set_key(err, IFD_EINVAL, "loss_reduction", "expected mean or sum, got %d",
                                 (int)cfg->loss_reduction);
    return IFD_OK;
}

/* Each replica's step takes batch_size / replicas rows. */
static int check_batch_split(const ifd_config *cfg, ifd_error *err)
{
    if (cfg->batch_size % cfg->replicas == 0)
        return IFD_OK;
    return ifd_error_set_key(err, IFD_EINVAL, "batch_size",
                             "%lld is not divisible by replicas %d (each replica's step takes an "
                             "equal share of its rows)",
                             (long long)cfg->batch_size, cfg->replicas);
}

/* Eval runs steps steps; train stops after steps or at last_step, exactly one of them. */
static int check_steps(const ifd_config *cfg, ifd_error *err)
{
    if (cfg->mode == IFD_MODE_EVAL && cfg->steps < 1)
        return ifd_error_set_key(err, IFD_EINVAL, "steps",
                                 "eval runs steps steps in one loop; expected a positive "
                                 "integer, got %lld",
                                 (long long)cfg->steps);
    if (cfg->mode == IFD_MODE_TRAIN && (cfg->steps > 0) == (cfg->last_step > 0)) {
        ifd_error_set(err, IFD_EINVAL,
                      "steps and last_step: exactly one must be a positive integer, got "
                      "steps=%lld and last_step=%lld",
                      (long long)cfg->steps, (long long)cfg->last_step);
        return ifd_error_mark_key(err, "steps", 0, 5);
    }
    return IFD_OK;
}

/* The schedule's keys together: a decay runs from warmup_steps to decay_steps, down to
 * min_learning_rate; a constant rate has neither. */
static int check_schedule(const ifd_config *cfg, ifd_error *err)
{
    const ifd_optimizer *o = &cfg->optimizer;
    const char *name = ifd_lr_schedule_name(o->lr_schedule);
    if (o->lr_schedule == IFD_LR_CONSTANT) {
        if (o->decay_steps != 0)
            return ifd_error_set_key(err, IFD_EINVAL, "decay_steps",
                                     "expected 0 (unset) with lr_schedule constant, which does "
                                     "not decay (cosine or linear do), got %lld",
                                     (long long)o->decay_steps);
        if (o->min_learning_rate != 0.0f)
            return ifd_error_set_key(err, IFD_EINVAL, "min_learning_rate",
                                     "expected 0 (unset) with lr_schedule constant, which does "
                                     "not decay (cosine or linear do), got %g",
                                     (double)o->min_learning_rate);
        return IFD_OK;
    }
    if (o->decay_steps <= o->warmup_steps)
        return ifd_error_set_key(err, IFD_EINVAL, "decay_steps",
                                 "expected more than warmup_steps (%lld) with lr_schedule %s "
                                 "(the decay ends at update decay_steps, warmup included), "
                                 "got %lld",
                                 (long long)o->warmup_steps, name, (long long)o->decay_steps);
    if (o->min_learning_rate > o->learning_rate)
        return ifd_error_set_key(err, IFD_EINVAL, "min_learning_rate",
                                 "expected at most learning_rate (%g), the rate lr_schedule %s "
                                 "decays from, got %g",
                                 (double)o->learning_rate, name, (double)o->min_learning_rate);
    return IFD_OK;
}

/* Several hosts: a rank in [0, size) and the collectives the run needs. */
static int check_hosts(const ifd_config *cfg, ifd_error *err)
{
    const ifd_hosts *h = cfg->hosts;
    if (h && (h->size < 1 || h->rank < 0 || h->rank >= h->size ||
              (h->size > 1 &&
               (h->ops == NULL || h->ops->allgather == NULL || h->ops->allreduce_i64 == NULL))))
        return ifd_error_set(err, IFD_EINVAL,
                             "hosts: expected a rank in [0, size), size >= 1 and both collectives, "
                             "got rank %d of %d",
                             h->rank, h->size);
    if (ifd_hosts_many(h) && strcmp(cfg->backend, "cuda") == 0 && h->ops->broadcast == NULL)
        return ifd_error_set(err, IFD_EINVAL,
                             "hosts: the cuda backend on %d hosts needs the broadcast collective "
                             "(rank 0's ncclUniqueId), and these hosts have none",
                             h->size);
    return IFD_OK;
}

int ifd_config_validate(const ifd_config *cfg, ifd_error *err)
{
    int rc = check_names(cfg, err);
    for (size_t i = 0; rc == IFD_OK && i < sizeof config_ranges / sizeof config_ranges[0]; i++)
        rc = check_range(cfg, &config_ranges[i], err);
    if (rc == IFD_OK)
        rc = check_batch_split(cfg, err);
    if (rc == IFD_OK)
        rc = check_steps(cfg, err);
    if (rc == IFD_OK)
        rc = check_schedule(cfg, err);
    if (rc == IFD_OK)
        rc = check_hosts(cfg, err);
    return rc;
}
