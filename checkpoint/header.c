/* A checkpoint's JSON header (docs/checkpoint.md): made from the object for a write, and
 * parsed into one, every key checked, for a load. */
#include "checkpoint/format.h"
#include "device/step.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

json_t *ifd_ckpt_header_json(const ifd_checkpoint *c)
{
    json_t *params = json_array();
    for (int i = 0; i < c->nparams; i++) {
        const ifd_param_spec *ps = &c->params_spec[i];
        json_t *shape = json_array();
        for (int d = 0; d < ps->rank; d++)
            json_array_append_new(shape, json_integer(ps->dims[d]));
        json_array_append_new(params, json_pack("{s:s, s:o, s:I, s:I}", "name", ps->name, "shape",
                                                shape, "offset", (json_int_t)ps->offset, "count",
                                                (json_int_t)ps->count));
    }
    /* One host: "producers". Several: "hosts" and "host_producers", each host's in rank order,
     * with "producers" empty (docs/checkpoint.md). */
    json_t *by_host = c->nhosts > 1 ? json_array() : NULL;
    json_t *producers = NULL;
    for (int h = 0; h < c->nhosts; h++) {
        const ifd_ckpt_table *t = &c->tables[h];
        json_t *m = json_object();
        for (int i = 0; i < t->nproducers; i++)
            json_object_set_new(m, t->producers[i].name, json_integer(t->producers[i].seq));
        if (by_host)
            json_array_append_new(by_host, m);
        else
            producers = m;
    }
    if (by_host)
        producers = json_object();
    const ifd_optimizer *o = &c->optimizer;
    json_t *opt = json_pack(
        "{s:s, s:i, s:f, s:f, s:f, s:f, s:f}", "kind", ifd_optimizer_name(o->kind), "slots",
        c->nslots, "learning_rate", (double)o->learning_rate, "momentum", (double)o->momentum,
        "beta1", (double)o->beta1, "beta2", (double)o->beta2, "epsilon", (double)o->epsilon);
    if (opt) { /* the schedule, decay and clipping: absent from older checkpoints (read as off) */
        json_object_set_new(opt, "weight_decay", json_real((double)o->weight_decay));
        json_object_set_new(opt, "clip_norm", json_real((double)o->clip_norm));
        json_object_set_new(opt, "lr_schedule", json_string(ifd_lr_schedule_name(o->lr_schedule)));
        json_object_set_new(opt, "warmup_steps", json_integer(o->warmup_steps));
        json_object_set_new(opt, "decay_steps", json_integer(o->decay_steps));
        json_object_set_new(opt, "min_learning_rate", json_real((double)o->min_learning_rate));
    }
    json_t *settings =
        json_pack("{s:I, s:I, s:I}", "features", (json_int_t)c->settings.features, "classes",
                  (json_int_t)c->settings.classes, "hidden", (json_int_t)c->settings.hidden);
    if (settings && c->program_config) /* the program's own settings: an object, when given */
        json_object_set_new(settings, "program_config",
                            json_loads(c->program_config, JSON_DECODE_ANY, NULL));
    json_t *h = json_pack(
        "{s:s, s:s, s:o, s:o, s:I, s:o, s:I, s:I, s:o, s:f}", "format", "infeed-checkpoint",
        "program", c->program, "settings", settings, "params", params, "nparam_floats",
        (json_int_t)c->nparam_floats, "optimizer", opt, "global_step", (json_int_t)c->global_step,
        "opt_step", (json_int_t)c->opt_step, "producers", producers, "created", (double)time(NULL));
    if (h && by_host) {
        json_object_set_new(h, "hosts", json_integer(c->nhosts));
        json_object_set_new(h, "host_producers", by_host);
    } else {
        json_decref(by_host);
    }
    return h;
}

int ifd_ckpt_header_int(json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                        const char *path, ifd_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: '%s': expected an integer from %" PRId64
                             " to %" PRId64 ", got %s",
                             path, key, lo, hi,
                             v == NULL            ? "nothing"
                             : json_is_integer(v) ? "an integer out of range"
                                                  : "another type");
    *out = json_integer_value(v);
    return IFD_OK;
}

static int get_float(json_t *obj, const char *key, float *out, const char *path, ifd_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_number(v))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'optimizer.%s': expected a number", path,
                             key);
    *out = (float)json_number_value(v);
    return IFD_OK;
}

/* The keys a checkpoint written before them lacks: absent, the feature was off. */
static int get_float_opt(json_t *obj, const char *key, float *out, const char *path, ifd_error *err)
{
    *out = 0.0f;
    return json_object_get(obj, key) ? get_float(obj, key, out, path, err) : IFD_OK;
}

static int get_steps_opt(json_t *obj, const char *key, int64_t *out, const char *path,
                         ifd_error *err)
{
    json_t *v = json_object_get(obj, key);
    *out = v ? json_integer_value(v) : 0;
    if (v && (!json_is_integer(v) || *out < 0))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'optimizer.%s': expected an integer, 0 or "
                             "more",
                             path, key);
    return IFD_OK;
}

/* The parameter list: names, shapes, offsets and counts that tile nparam_floats. */
static int parse_params(ifd_checkpoint *c, json_t *params, const char *path, ifd_error *err)
{
    if (!json_is_array(params) || json_array_size(params) > IFD_CHECKPOINT_MAX_PARAMS)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'params': expected an array of at most %d "
                             "parameters",
                             path, IFD_CHECKPOINT_MAX_PARAMS);
    int64_t at = 0;
    ifd_param_spec *specs = calloc(json_array_size(params) + 1, sizeof *specs);
    if (specs == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "checkpoint '%s': header: 'params'", path);
    int rc = IFD_OK;
    free(c->params_spec);
    c->params_spec = specs;
    c->nparams = (int)json_array_size(params);
    for (int i = 0; i < c->nparams; i++) {
        json_t *e = json_array_get(params, (size_t)i);
        ifd_param_spec *ps = &c->params_spec[i];
        json_t *name = json_object_get(e, "name"), *shape = json_object_get(e, "shape");
        if (!json_is_string(name) || json_string_length(name) >= IFD_NAME_MAX ||
            !json_is_array(shape) || json_array_size(shape) > IFD_PARAM_MAX_RANK)
            return ifd_error_set(err, IFD_EPROTO,
                                 "checkpoint '%s': header: 'params[%d]': expected a name of at "
                                 "most %d bytes and a shape of rank 0 to %d",
                                 path, i, IFD_NAME_MAX - 1, IFD_PARAM_MAX_RANK);
        snprintf(ps->name, sizeof ps->name, "%s", json_string_value(name));
        ps->rank = (int)json_array_size(shape);
        /* A parameter has at most 2^40 floats (as nparam_floats), so count cannot overflow. */
        int64_t count = 1;
        for (int d = 0; d < ps->rank; d++) {
            json_t *dim = json_array_get(shape, (size_t)d);
            if (!json_is_integer(dim) || json_integer_value(dim) < 1)
                return ifd_error_set(err, IFD_EPROTO,
                                     "checkpoint '%s': header: 'params[%d].shape': expected "
                                     "positive integers",
                                     path, i);
            if (json_integer_value(dim) > ((int64_t)1 << 40) / count)
                return ifd_error_set(err, IFD_EPROTO,
                                     "checkpoint '%s': header: 'params[%d].shape': expected at "
                                     "most 2^40 floats in all, got dimension %d of %" PRId64
                                     " after %" PRId64 " floats",
                                     path, i, d, (int64_t)json_integer_value(dim), count);
            ps->dims[d] = json_integer_value(dim);
            count *= ps->dims[d];
        }
        rc = ifd_ckpt_header_int(e, "offset", at, at, &ps->offset, path, err);
        if (rc == IFD_OK)
            rc = ifd_ckpt_header_int(e, "count", count, count, &ps->count, path, err);
        if (rc)
            return ifd_error_prefix(err, "parameter '%s' (the parameters tile the vector in order)",
                                    ps->name);
        at += count;
    }
    if (at != c->nparam_floats)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'params' cover %" PRId64
                             " floats, 'nparam_floats' says %" PRId64,
                             path, at, c->nparam_floats);
    return IFD_OK;
}

/* A producer map (name: seq) into c's selected table; field names it in sentences. */
static int parse_producers(ifd_checkpoint *c, json_t *producers, const char *field,
                           const char *path, ifd_error *err)
{
    if (!json_is_object(producers))
        return ifd_error_set(err, IFD_EPROTO, "checkpoint '%s': header: '%s': expected an object",
                             path, field);
    const char *name;
    json_t *seq;
    json_object_foreach(producers, name, seq)
    {
        if (!json_is_integer(seq))
            return ifd_error_set(err, IFD_EPROTO,
                                 "checkpoint '%s': header: '%s.%s': expected an integer", path,
                                 field, name);
        ifd_error e;
        if (ifd_checkpoint_set_producer(c, name, json_integer_value(seq), &e))
            return ifd_error_set(err, e.code == IFD_ENOMEM ? e.code : IFD_EPROTO,
                                 "checkpoint '%s': header: %s: %s", path, field, e.msg);
    }
    return IFD_OK;
}

/* "program" and "settings". */
static int parse_program(ifd_checkpoint *c, json_t *h, const char *path, ifd_error *err)
{
    json_t *prog = json_object_get(h, "program");
    if (!json_is_string(prog) || json_string_length(prog) == 0 ||
        json_string_length(prog) >= sizeof c->program)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'program': expected a program name", path);
    snprintf(c->program, sizeof c->program, "%s", json_string_value(prog));
    json_t *s = json_object_get(h, "settings");
    int64_t big = (int64_t)1 << 40;
    int rc = ifd_ckpt_header_int(s, "features", 0, big, &c->settings.features, path, err);
    if (rc == IFD_OK)
        rc = ifd_ckpt_header_int(s, "classes", 0, big, &c->settings.classes, path, err);
    if (rc == IFD_OK)
        rc = ifd_ckpt_header_int(s, "hidden", 0, big, &c->settings.hidden, path, err);
    json_t *pc = json_object_get(s, "program_config");
    if (rc || pc == NULL) /* none: a checkpoint of a program without settings of its own */
        return rc;
    if (!json_is_object(pc))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'settings.program_config': expected an "
                             "object",
                             path);
    char *text = json_dumps(pc, JSON_COMPACT | JSON_SORT_KEYS);
    rc = text ? ifd_ckpt_set_program_config(c, text, err)
              : ifd_error_set(err, IFD_ENOMEM, "checkpoint '%s': header", path);
    free(text);
    return rc;
}

/* "optimizer": its kind, the slots that kind keeps, its hyperparameters. */
static int parse_optimizer(ifd_checkpoint *c, json_t *o, const char *path, ifd_error *err)
{
    json_t *kind = json_object_get(o, "kind");
    if (!json_is_string(kind) || ifd_optimizer_parse(json_string_value(kind), &c->optimizer.kind))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'optimizer.kind': expected sgd, momentum, "
                             "adam or adamw",
                             path);
    int want = ifd_optimizer_slots(c->optimizer.kind);
    json_t *slots = json_object_get(o, "slots");
    if (!json_is_integer(slots) || json_integer_value(slots) != want)
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'optimizer.slots': %s keeps %d slot "
                             "vectors, the header says %lld",
                             path, json_string_value(kind), want,
                             json_is_integer(slots) ? (long long)json_integer_value(slots) : -1LL);
    if (get_float(o, "learning_rate", &c->optimizer.learning_rate, path, err) ||
        get_float(o, "momentum", &c->optimizer.momentum, path, err) ||
        get_float(o, "beta1", &c->optimizer.beta1, path, err) ||
        get_float(o, "beta2", &c->optimizer.beta2, path, err) ||
        get_float(o, "epsilon", &c->optimizer.epsilon, path, err) ||
        get_float_opt(o, "weight_decay", &c->optimizer.weight_decay, path, err) ||
        get_float_opt(o, "clip_norm", &c->optimizer.clip_norm, path, err) ||
        get_float_opt(o, "min_learning_rate", &c->optimizer.min_learning_rate, path, err) ||
        get_steps_opt(o, "warmup_steps", &c->optimizer.warmup_steps, path, err) ||
        get_steps_opt(o, "decay_steps", &c->optimizer.decay_steps, path, err))
        return err ? err->code : IFD_EPROTO;
    json_t *sched = json_object_get(o, "lr_schedule");
    c->optimizer.lr_schedule = IFD_LR_CONSTANT;
    if (sched && (!json_is_string(sched) ||
                  ifd_lr_schedule_parse(json_string_value(sched), &c->optimizer.lr_schedule)))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'optimizer.lr_schedule': expected "
                             "constant, cosine or linear",
                             path);
    return IFD_OK;
}

/* "producers", or, written by several hosts, "hosts" and each host's table in
 * "host_producers". */
static int parse_positions(ifd_checkpoint *c, json_t *h, const char *path, ifd_error *err)
{
    json_t *producers = json_object_get(h, "producers");
    if (!json_is_object(producers))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'producers': expected an object", path);
    int64_t hosts = 1;
    int rc;
    if (json_object_get(h, "hosts") &&
        (rc = ifd_ckpt_header_int(h, "hosts", 1, IFD_CHECKPOINT_MAX_HOSTS, &hosts, path, err)) !=
            IFD_OK)
        return rc;
    if (hosts == 1)
        return parse_producers(c, producers, "producers", path, err);
    json_t *by_host = json_object_get(h, "host_producers");
    if (!json_is_array(by_host))
        return ifd_error_set(err, IFD_EPROTO,
                             "checkpoint '%s': header: 'host_producers': expected an array (one "
                             "object a host, 'hosts' is %lld), got none",
                             path, (long long)hosts);
    if (json_array_size(by_host) != (size_t)hosts)
        return ifd_error_set(
            err, IFD_EPROTO,
            "checkpoint '%s': header: 'host_producers': expected %lld objects (one "
            "a host, 'hosts'), got %zu",
            path, (long long)hosts, json_array_size(by_host));
    ifd_error e;
    if (ifd_checkpoint_set_hosts(c, (int)hosts, &e))
        return ifd_error_set(err, e.code, "checkpoint '%s': %s", path, e.msg);
    for (int i = 0; i < (int)hosts; i++) {
        char field[48];
        snprintf(field, sizeof field, "host_producers[%d]", i);
        c->host = i;
        if ((rc = parse_producers(c, json_array_get(by_host, (size_t)i), field, path, err)) !=
            IFD_OK)
            return rc;
    }
    c->host = 0;
    return IFD_OK;
}

int ifd_ckpt_header_parse(ifd_checkpoint *c, json_t *h, const char *path, ifd_error *err)
{
    int rc = parse_program(c, h, path, err);
    if (rc == IFD_OK)
        rc = parse_optimizer(c, json_object_get(h, "optimizer"), path, err);
    if (rc == IFD_OK)
        rc = ifd_ckpt_header_int(h, "global_step", 0, INT64_MAX, &c->global_step, path, err);
    if (rc == IFD_OK)
        rc = ifd_ckpt_header_int(h, "opt_step", 0, INT64_MAX, &c->opt_step, path, err);
    if (rc == IFD_OK)
        rc = parse_params(c, json_object_get(h, "params"), path, err);
    if (rc == IFD_OK)
        rc = parse_positions(c, h, path, err);
    return rc;
}
