/* The checkpoint object: creating it, its accessors and producer tables, and whether it fits a
 * run (ifd_checkpoint_check). The files are checkpoint/format.c, the folder
 * checkpoint/folder.c. */
#include "device/step.h"
#include "checkpoint/object.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the object ------------------------------------------------------------------------------ */

ifd_checkpoint *ifd_ckpt_alloc(int64_t nparam_floats, int nslots, ifd_error *err)
{
    ifd_checkpoint *c = calloc(1, sizeof *c);
    size_t floats = (size_t)nparam_floats * (size_t)(1 + nslots);
    if (c) {
        c->params = calloc(floats + 1, sizeof(float));
        c->tables = calloc(1, sizeof *c->tables);
        c->nhosts = 1;
    }
    if (c == NULL || c->params == NULL || c->tables == NULL) {
        if (c) {
            free(c->params);
            free(c->tables);
        }
        free(c);
        ifd_error_set(err, IFD_ENOMEM, "checkpoint: %lld parameter floats and %d slots",
                      (long long)nparam_floats, nslots);
        return NULL;
    }
    c->nparam_floats = nparam_floats;
    c->nslots = nslots;
    c->slots = c->params + nparam_floats;
    return c;
}

int ifd_ckpt_set_program_config(ifd_checkpoint *c, const char *text, ifd_error *err)
{
    char *copy = NULL;
    if (text && strcmp(text, "{}") != 0 && (copy = strdup(text)) == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "checkpoint: program_config");
    free(c->program_config);
    c->program_config = copy;
    c->settings.config = copy;
    return IFD_OK;
}

int ifd_ckpt_set_params(ifd_checkpoint *c, const ifd_param_spec *specs, int n, ifd_error *err)
{
    ifd_param_spec *copy = malloc(sizeof *copy * (size_t)(n > 0 ? n : 1));
    if (copy == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "checkpoint: %d parameters", n);
    if (n > 0)
        memcpy(copy, specs, sizeof *copy * (size_t)n);
    free(c->params_spec);
    c->params_spec = copy;
    c->nparams = n;
    return IFD_OK;
}

int ifd_checkpoint_create(ifd_checkpoint **out, const ifd_config *cfg, int64_t global_step,
                          int64_t opt_step, const float *params, const float *slots, ifd_error *err)
{
    *out = NULL;
    if (global_step < 0 || opt_step < 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "checkpoint: global_step and opt_step: expected >= 0, got %lld and "
                             "%lld",
                             (long long)global_step, (long long)opt_step);
    ifd_program p;
    int rc = ifd_program_init(&p, cfg->program, &cfg->settings, err);
    if (rc)
        return rc;
    int nslots = ifd_optimizer_slots(cfg->optimizer.kind);
    ifd_checkpoint *c = ifd_ckpt_alloc(p.nparam_floats, nslots, err);
    rc = c ? ifd_ckpt_set_params(c, p.params, p.nparams, err) : IFD_ENOMEM;
    if (rc == IFD_OK) {
        c->settings = cfg->settings;
        rc = ifd_ckpt_set_program_config(c, ifd_program_config_text(&p), err);
    }
    if (rc) {
        ifd_checkpoint_free(c);
        ifd_program_free(&p);
        return rc;
    }
    snprintf(c->program, sizeof c->program, "%s", p.cls->name);
    ifd_program_free(&p);
    c->optimizer = cfg->optimizer;
    c->global_step = global_step;
    c->opt_step = opt_step;
    if (params)
        memcpy(c->params, params, sizeof(float) * (size_t)c->nparam_floats);
    if (slots)
        memcpy(c->slots, slots, sizeof(float) * (size_t)(c->nparam_floats * nslots));
    *out = c;
    return IFD_OK;
}

void ifd_checkpoint_free(ifd_checkpoint *c)
{
    if (c == NULL)
        return;
    free(c->params);
    free(c->params_spec);
    free(c->program_config);
    for (int h = 0; h < c->nhosts; h++)
        free(c->tables[h].producers);
    free(c->tables);
    free(c);
}

int64_t ifd_checkpoint_global_step(const ifd_checkpoint *c)
{
    return c->global_step;
}

int64_t ifd_checkpoint_opt_step(const ifd_checkpoint *c)
{
    return c->opt_step;
}

const char *ifd_checkpoint_program(const ifd_checkpoint *c)
{
    return c->program;
}

const ifd_program_settings *ifd_checkpoint_settings(const ifd_checkpoint *c)
{
    return &c->settings;
}

const ifd_optimizer *ifd_checkpoint_optimizer(const ifd_checkpoint *c)
{
    return &c->optimizer;
}

int64_t ifd_checkpoint_nparam_floats(const ifd_checkpoint *c)
{
    return c->nparam_floats;
}

const float *ifd_checkpoint_params(const ifd_checkpoint *c)
{
    return c->params;
}

int ifd_checkpoint_slot_count(const ifd_checkpoint *c)
{
    return c->nslots;
}

const float *ifd_checkpoint_slots(const ifd_checkpoint *c)
{
    return c->slots;
}

int ifd_checkpoint_hosts(const ifd_checkpoint *c)
{
    return c->nhosts;
}

int ifd_checkpoint_set_hosts(ifd_checkpoint *c, int hosts, ifd_error *err)
{
    if (hosts < 1 || hosts > IFD_CHECKPOINT_MAX_HOSTS)
        return ifd_error_set(err, IFD_EINVAL, "checkpoint: hosts: expected 1 to %d, got %d",
                             IFD_CHECKPOINT_MAX_HOSTS, hosts);
    for (int h = hosts; h < c->nhosts; h++)
        free(c->tables[h].producers);
    ifd_ckpt_table *t = realloc(c->tables, (size_t)hosts * sizeof *t);
    if (t == NULL) {
        if (hosts < c->nhosts)
            c->nhosts = hosts; /* the tables beyond were freed; the block stays as it was */
        return ifd_error_set(err, IFD_ENOMEM, "checkpoint: %d hosts", hosts);
    }
    for (int h = c->nhosts; h < hosts; h++)
        t[h] = (ifd_ckpt_table){0};
    c->tables = t;
    c->nhosts = hosts;
    if (c->host >= hosts)
        c->host = 0;
    return IFD_OK;
}

int ifd_checkpoint_select_host(ifd_checkpoint *c, int host, ifd_error *err)
{
    if (host < 0 || host >= c->nhosts)
        return ifd_error_set(err, IFD_EINVAL,
                             "checkpoint: host: expected 0 to %d (the checkpoint holds %d hosts' "
                             "positions), got %d",
                             c->nhosts - 1, c->nhosts, host);
    c->host = host;
    return IFD_OK;
}

static const ifd_ckpt_table *table(const ifd_checkpoint *c)
{
    return &c->tables[c->host];
}

int ifd_checkpoint_producer_count(const ifd_checkpoint *c)
{
    return table(c)->nproducers;
}

const char *ifd_checkpoint_producer_name(const ifd_checkpoint *c, int i)
{
    const ifd_ckpt_table *t = table(c);
    return i >= 0 && i < t->nproducers ? t->producers[i].name : NULL;
}

int64_t ifd_checkpoint_producer_seq(const ifd_checkpoint *c, int i)
{
    const ifd_ckpt_table *t = table(c);
    return i >= 0 && i < t->nproducers ? t->producers[i].seq : -1;
}

/* The index of name, or where it would be inserted (as -1 - index). */
static int find_producer(const ifd_ckpt_table *t, const char *name)
{
    int lo = 0, hi = t->nproducers;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int cmp = strcmp(t->producers[mid].name, name);
        if (cmp == 0)
            return mid;
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1 - lo;
}

int ifd_checkpoint_find_producer(const ifd_checkpoint *c, const char *name, int64_t *seq)
{
    const ifd_ckpt_table *t = table(c);
    int i = find_producer(t, name);
    if (i < 0)
        return IFD_ENOTFOUND;
    *seq = t->producers[i].seq;
    return IFD_OK;
}

int ifd_checkpoint_set_producer(ifd_checkpoint *c, const char *name, int64_t seq, ifd_error *err)
{
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > IFD_CHECKPOINT_NAME_MAX)
        return ifd_error_set(err, IFD_EINVAL,
                             "checkpoint: producer name: expected 1 to %d bytes, got %zu",
                             IFD_CHECKPOINT_NAME_MAX, len);
    if (seq < 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "checkpoint: producer '%s': seq: expected >= 0, got %" PRId64, name,
                             seq);
    ifd_ckpt_table *t = &c->tables[c->host];
    int i = find_producer(t, name);
    if (i >= 0) {
        t->producers[i].seq = seq;
        return IFD_OK;
    }
    i = -1 - i;
    if (t->nproducers == t->cap) {
        int cap = t->cap ? 2 * t->cap : 8;
        ifd_ckpt_producer *p = realloc(t->producers, (size_t)cap * sizeof *p);
        if (p == NULL)
            return ifd_error_set(err, IFD_ENOMEM, "checkpoint: %d producers", cap);
        t->producers = p;
        t->cap = cap;
    }
    memmove(&t->producers[i + 1], &t->producers[i],
            (size_t)(t->nproducers - i) * sizeof *t->producers);
    memcpy(t->producers[i].name, name, len + 1);
    t->producers[i].seq = seq;
    t->nproducers++;
    return IFD_OK;
}
/* ---- fitting a run --------------------------------------------------------------------------- */

static const char *shape_text(const ifd_param_spec *p, char *buf, size_t len)
{
    size_t at = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < p->rank && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64, d ? ", " : "", p->dims[d]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
    return buf;
}

/* c was written with p's settings (program_config): another model would not fit it. */
static int check_program_config(const ifd_checkpoint *c, const ifd_program *p, ifd_error *err)
{
    const char *have = c->program_config ? c->program_config : "{}";
    const char *want = ifd_program_config_text(p);
    if (strcmp(have, want) == 0)
        return IFD_OK;
    return ifd_error_set(err, IFD_EINVAL,
                         "checkpoint: program_config: the checkpoint has %.200s, this run %.200s "
                         "(a resume takes the program settings it was written with)",
                         have, want);
}

/* c's parameters are p's: names, ranks and dimensions, in order. */
static int check_params(const ifd_checkpoint *c, const ifd_program *p, ifd_error *err)
{
    if (p->nparams != c->nparams || p->nparam_floats != c->nparam_floats)
        return ifd_error_set(err, IFD_EINVAL,
                             "checkpoint: parameters: the checkpoint has %d tensors of %" PRId64
                             " floats, this run's program %d of %" PRId64,
                             c->nparams, c->nparam_floats, p->nparams, p->nparam_floats);
    for (int i = 0; i < p->nparams; i++) {
        const ifd_param_spec *a = &c->params_spec[i], *b = &p->params[i];
        char sa[128], sb[128];
        if (strcmp(a->name, b->name) != 0 || a->rank != b->rank ||
            strcmp(shape_text(a, sa, sizeof sa), shape_text(b, sb, sizeof sb)) != 0)
            return ifd_error_set(err, IFD_EINVAL,
                                 "checkpoint: parameter %d: the checkpoint has '%s' %s, this run "
                                 "'%s' %s",
                                 i, a->name, sa, b->name, sb);
    }
    return IFD_OK;
}

/* Train mode: the learning-rate schedule is a function of the update count the checkpoint
 * carries, so a resumed run follows the same one (its rates may change, as learning_rate). */
static int check_schedule(const ifd_checkpoint *c, const ifd_config *cfg, ifd_error *err)
{
    const ifd_optimizer *a = &c->optimizer, *b = &cfg->optimizer;
    if (a->lr_schedule == b->lr_schedule && a->warmup_steps == b->warmup_steps &&
        (a->lr_schedule == IFD_LR_CONSTANT || a->decay_steps == b->decay_steps))
        return IFD_OK;
    return ifd_error_set(
        err, IFD_EINVAL,
        "checkpoint: optimizer: the checkpoint's learning-rate schedule is %s "
        "with warmup_steps %" PRId64 " and decay_steps %" PRId64 ", this run's %s with %" PRId64
        " and %" PRId64 " (a resumed run continues the schedule at update %" PRId64
        ": give it the same lr_schedule, warmup_steps and decay_steps)",
        ifd_lr_schedule_name(a->lr_schedule), a->warmup_steps, a->decay_steps,
        ifd_lr_schedule_name(b->lr_schedule), b->warmup_steps, b->decay_steps, c->opt_step);
}

int ifd_checkpoint_check(const ifd_checkpoint *c, const ifd_config *cfg, ifd_error *err)
{
    const char *prog = cfg->program ? cfg->program : "(none)";
    if (strcmp(c->program, prog) != 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "checkpoint: program: the checkpoint is of '%s', this run's is '%s'",
                             c->program, prog);
    static const char *const names[] = {"features", "classes", "hidden"};
    const int64_t have[] = {c->settings.features, c->settings.classes, c->settings.hidden};
    const int64_t want[] = {cfg->settings.features, cfg->settings.classes, cfg->settings.hidden};
    for (int i = 0; i < 3; i++)
        if ((have[i] > 0 ? have[i] : 0) != (want[i] > 0 ? want[i] : 0))
            return ifd_error_set(err, IFD_EINVAL,
                                 "checkpoint: settings.%s: the checkpoint has %" PRId64
                                 ", this run %" PRId64 " (0: unset)",
                                 names[i], have[i] > 0 ? have[i] : 0, want[i] > 0 ? want[i] : 0);
    ifd_program p;
    int rc = ifd_program_init(&p, prog, &cfg->settings, err);
    if (rc == IFD_OK)
        rc = check_program_config(c, &p, err);
    if (rc == IFD_OK)
        rc = check_params(c, &p, err);
    ifd_program_free(&p);
    if (rc)
        return rc;
    if (cfg->mode == IFD_MODE_TRAIN && cfg->optimizer.kind != c->optimizer.kind)
        return ifd_error_set(err, IFD_EINVAL,
                             "checkpoint: optimizer: the checkpoint's slots are %s's (%d), this "
                             "run uses %s (%d slots)",
                             ifd_optimizer_name(c->optimizer.kind), c->nslots,
                             ifd_optimizer_name(cfg->optimizer.kind),
                             ifd_optimizer_slots(cfg->optimizer.kind));
    if (cfg->mode == IFD_MODE_TRAIN)
        return check_schedule(c, cfg, err);
    return IFD_OK;
}
