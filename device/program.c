#include "core/plugin.h"
#include "core/rng.h"
#include "device/program_config.h"
#include <infeed/program.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROGRAMS 32

extern const ifd_program_class ifd_program_linear;
extern const ifd_program_class ifd_program_softmax;
extern const ifd_program_class ifd_program_read;
extern const ifd_program_class ifd_program_mlp;
extern const ifd_program_class ifd_program_charlm;

static const ifd_program_class *registry[MAX_PROGRAMS] = {&ifd_program_linear, &ifd_program_softmax,
                                                          &ifd_program_mlp, &ifd_program_read,
                                                          &ifd_program_charlm};
#define NBUILTIN 5
static int nregistered = NBUILTIN;
/* Where each registered class came from: NULL for the built-ins and ifd_program_register, the
 * plugin's path otherwise (owned). */
static char *origin[MAX_PROGRAMS];

static int class_complete(const ifd_program_class *cls)
{
    return cls != NULL && cls->name != NULL && cls->setup != NULL && cls->train_step != NULL &&
           cls->workspace_floats != NULL;
}

int ifd_program_register(const ifd_program_class *cls)
{
    if (!class_complete(cls))
        return IFD_EINVAL;
    if (ifd_program_find(cls->name) != NULL || nregistered == MAX_PROGRAMS)
        return IFD_EINVAL;
    registry[nregistered++] = cls;
    return IFD_OK;
}

const ifd_program_class *ifd_program_find(const char *name)
{
    for (int i = 0; i < nregistered; i++)
        if (strcmp(registry[i]->name, name) == 0)
            return registry[i];
    return NULL;
}

const char *ifd_program_names(char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < nregistered && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", registry[i]->name);
    return buf;
}

int ifd_program_check_setting(const char *program, const char *key, int64_t v, int64_t min,
                              int64_t max, ifd_error *err)
{
    if (v != 0 && v >= min && v <= max)
        return IFD_OK;
    if (v == 0 && min <= 0)
        return IFD_OK;
    char got[48];
    if (v == 0)
        snprintf(got, sizeof got, IFD_PROGRAM_NOT_SET);
    else
        snprintf(got, sizeof got, ", got %" PRId64, v);
    int at = snprintf(NULL, 0, "program '%s': ", program);
    ifd_error_set(err, IFD_EINVAL,
                  "program '%s': setting '%s' must be between %" PRId64 " and %" PRId64 "%s",
                  program, key, min, max, got);
    return ifd_error_mark_key(err, key, at, (int)strlen(key) + 10);
}

int ifd_program_init(ifd_program *p, const char *name, const ifd_program_settings *s,
                     ifd_error *err)
{
    memset(p, 0, sizeof *p);
    const ifd_program_class *cls = name ? ifd_program_find(name) : NULL;
    if (cls == NULL) {
        char names[256];
        return ifd_error_set_key(err, IFD_EINVAL, "program", "expected one of %s, got '%s'",
                                 ifd_program_names(names, sizeof names), name ? name : "(none)");
    }
    p->cls = cls;
    if (s)
        p->settings = *s;
    int rc = ifd_program_config_parse(p, s ? s->config : NULL, err);
    if (rc == IFD_OK)
        rc = cls->setup(p, err);
    if (rc == IFD_OK)
        rc = ifd_program_config_unread(p, err);
    if (rc) {
        ifd_program_free(p); /* nothing for the caller to free */
        return rc;
    }
    if (cls->init_params == NULL)
        for (int i = 0; i < p->nparams; i++)
            if (p->params[i].init.kind == IFD_INIT_PROGRAM) {
                ifd_error_set(err, IFD_EINVAL,
                              "program '%s': parameter '%s' declares no initializer, and "
                              "the program has no init_params: expected one of the two",
                              cls->name, p->params[i].name);
                ifd_program_free(p);
                return IFD_EINVAL;
            }
    return IFD_OK;
}

void ifd_program_free(ifd_program *p)
{
    if (p == NULL)
        return;
    if (p->state && p->cls && p->cls->free_state)
        p->cls->free_state(p);
    free(p->params);
    ifd_program_config_free(p);
    memset(p, 0, sizeof *p);
}

int ifd_program_add_input(ifd_program *p, const char *name, ifd_dtype dt, int rank,
                          const int64_t *dims)
{
    if (p->ninputs == IFD_MAX_INPUTS || rank < 0 || rank >= IFD_MAX_RANK)
        return IFD_EINVAL;
    ifd_input_spec *in = &p->inputs[p->ninputs++];
    snprintf(in->name, sizeof in->name, "%s", name);
    in->dtype = dt;
    in->rank = rank;
    for (int i = 0; i < rank; i++)
        in->dims[i] = dims[i];
    return IFD_OK;
}

int ifd_program_add_ids(ifd_program *p, const char *name, int label, int rank, const int64_t *dims,
                        int64_t limit)
{
    if (limit < 1 || limit > (int64_t)INT32_MAX + 1 || rank < 0 || rank >= IFD_MAX_RANK ||
        (rank > 0 && dims == NULL))
        return IFD_EINVAL;
    for (int i = 0; i < rank; i++)
        if (dims[i] < 1)
            return IFD_EINVAL;
    int rc = label ? ifd_program_add_label(p, name, IFD_I32, rank, dims)
                   : ifd_program_add_input(p, name, IFD_I32, rank, dims);
    if (rc == IFD_OK)
        p->input_limit[p->ninputs - 1] = limit;
    return rc;
}

int ifd_program_add_label(ifd_program *p, const char *name, ifd_dtype dt, int rank,
                          const int64_t *dims)
{
    int rc = ifd_program_add_input(p, name, dt, rank, dims);
    if (rc == IFD_OK)
        p->labels |= 1u << (p->ninputs - 1);
    return rc;
}

int ifd_program_add_param_with(ifd_program *p, const char *name, int rank, const int64_t *dims,
                               ifd_param_init init, unsigned flags)
{
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len >= IFD_NAME_MAX || rank < 1 || rank > IFD_PARAM_MAX_RANK || dims == NULL ||
        init.kind < IFD_INIT_PROGRAM || init.kind > IFD_INIT_GLOROT ||
        (init.kind == IFD_INIT_NORMAL && !(isfinite(init.std) && init.std > 0.0f)) ||
        ifd_program_param(p, name) != NULL)
        return IFD_EINVAL;
    int64_t count = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 1 || dims[i] > ((int64_t)1 << 40) / count)
            return IFD_EINVAL;
        count *= dims[i];
    }
    if (p->nparams == p->params_cap) {
        int cap = p->params_cap ? 2 * p->params_cap : 8;
        ifd_param_spec *more = realloc(p->params, sizeof *more * (size_t)cap);
        if (more == NULL)
            return IFD_ENOMEM;
        p->params = more;
        p->params_cap = cap;
    }
    ifd_param_spec *ps = &p->params[p->nparams++];
    memset(ps, 0, sizeof *ps);
    memcpy(ps->name, name, len + 1);
    ps->rank = rank;
    ps->flags = flags;
    ps->init = init;
    ps->count = count;
    for (int i = 0; i < rank; i++)
        ps->dims[i] = dims[i];
    ps->offset = p->nparam_floats;
    p->nparam_floats += ps->count;
    return IFD_OK;
}

int ifd_program_add_param(ifd_program *p, const char *name, int rank, const int64_t *dims)
{
    ifd_param_init init = {.kind = IFD_INIT_PROGRAM};
    return ifd_program_add_param_with(p, name, rank, dims, init, 0);
}

/* The runtime's own tensors, which a program's may not shadow (outfeed/outfeed_tensors.c). */
static const char *const runtime_outfeeds[] = {"loss",      "correct",    "count",
                                               "grad_norm", "param_norm", "learning_rate"};

int ifd_program_add_outfeed(ifd_program *p, const char *name, ifd_dtype dtype, int per_row,
                            int rank, const int64_t *dims)
{
    size_t len = name ? strlen(name) : 0;
    if (p->noutfeeds == IFD_MAX_OUTFEEDS || len == 0 || len >= IFD_NAME_MAX ||
        (dtype != IFD_F32 && dtype != IFD_I32) || (per_row != 0 && per_row != 1) || rank < 0 ||
        rank >= IFD_MAX_RANK || (rank > 0 && dims == NULL) ||
        strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != len)
        return IFD_EINVAL;
    for (int i = 0; i < rank; i++)
        if (dims[i] < 1)
            return IFD_EINVAL;
    for (int i = 0; i < p->noutfeeds; i++)
        if (strcmp(p->outfeeds[i].name, name) == 0)
            return IFD_EINVAL;
    for (size_t i = 0; i < sizeof runtime_outfeeds / sizeof runtime_outfeeds[0]; i++)
        if (strcmp(runtime_outfeeds[i], name) == 0)
            return IFD_EINVAL;
    ifd_outfeed_spec *o = &p->outfeeds[p->noutfeeds++];
    memset(o, 0, sizeof *o);
    memcpy(o->name, name, len + 1);
    o->dtype = dtype;
    o->per_row = per_row;
    o->rank = rank;
    for (int i = 0; i < rank; i++)
        o->dims[i] = dims[i];
    return IFD_OK;
}

int64_t ifd_program_outfeed_value_bytes(const ifd_program *p, int i)
{
    const ifd_outfeed_spec *o = &p->outfeeds[i];
    int64_t n = (int64_t)ifd_dtype_size(o->dtype);
    for (int d = 0; d < o->rank; d++)
        n *= o->dims[d];
    return n;
}

#define OUTFEED_ALIGN 256

int64_t ifd_program_outfeed_layout(const ifd_program *p, int64_t max_rows,
                                   int64_t offs[IFD_MAX_OUTFEEDS])
{
    int64_t off = 0;
    for (int i = 0; i < p->noutfeeds; i++) {
        offs[i] = off;
        off += ifd_program_outfeed_value_bytes(p, i) * (p->outfeeds[i].per_row ? max_rows : 1);
        off = (off + OUTFEED_ALIGN - 1) / OUTFEED_ALIGN * OUTFEED_ALIGN;
    }
    return off;
}

const ifd_param_spec *ifd_program_param(const ifd_program *p, const char *name)
{
    for (int i = 0; i < p->nparams; i++)
        if (strcmp(p->params[i].name, name) == 0)
            return &p->params[i];
    return NULL;
}

void ifd_program_init_glorot(float *w, int64_t fan_in, int64_t fan_out, uint64_t seed)
{
    ifd_rng rng;
    ifd_rng_seed(&rng, seed);
    double a = sqrt(6.0 / (double)(fan_in + fan_out));
    for (int64_t i = 0; i < fan_in * fan_out; i++)
        w[i] = (float)((2.0 * ifd_rng_uniform(&rng) - 1.0) * a);
}

/* A parameter's own stream: the seed and its name's FNV-1a hash, mixed. */
static uint64_t param_seed(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++)
        h = (h ^ (uint8_t)*c) * 1099511628211ull;
    return seed ^ (h * 0x9e3779b97f4a7c15ull);
}

static void init_one(const ifd_param_spec *ps, float *w, uint64_t seed)
{
    switch (ps->init.kind) {
    case IFD_INIT_PROGRAM:
        return;
    case IFD_INIT_ZEROS:
    case IFD_INIT_ONES:
        for (int64_t i = 0; i < ps->count; i++)
            w[i] = ps->init.kind == IFD_INIT_ONES ? 1.0f : 0.0f;
        return;
    case IFD_INIT_NORMAL: { /* Box-Muller, both values of a pair used */
        ifd_rng rng;
        ifd_rng_seed(&rng, param_seed(seed, ps->name));
        for (int64_t i = 0; i < ps->count; i += 2) {
            double u1 = 1.0 - ifd_rng_uniform(&rng), u2 = ifd_rng_uniform(&rng);
            double r = sqrt(-2.0 * log(u1)) * (double)ps->init.std, a = 2.0 * M_PI * u2;
            w[i] = (float)(r * cos(a));
            if (i + 1 < ps->count)
                w[i + 1] = (float)(r * sin(a));
        }
        return;
    }
    case IFD_INIT_GLOROT: {
        int64_t receptive = 1;
        for (int d = 0; d + 2 < ps->rank; d++)
            receptive *= ps->dims[d];
        int64_t fan_in = ps->rank == 1 ? ps->dims[0] : receptive * ps->dims[ps->rank - 2];
        int64_t fan_out = receptive * ps->dims[ps->rank - 1];
        ifd_rng rng;
        ifd_rng_seed(&rng, param_seed(seed, ps->name));
        double a = sqrt(6.0 / (double)(fan_in + fan_out));
        for (int64_t i = 0; i < ps->count; i++)
            w[i] = (float)((2.0 * ifd_rng_uniform(&rng) - 1.0) * a);
        return;
    }
    }
}

void ifd_program_init_params(const ifd_program *p, float *params, uint64_t seed)
{
    if (p->cls->init_params)
        p->cls->init_params(p, params, seed);
    for (int i = 0; i < p->nparams; i++)
        init_one(&p->params[i], params + p->params[i].offset, seed);
}

/* ---- plugins ------------------------------------------------------------------------------- */

/* The handles of the plugins loaded so far (never closed: their classes stay registered). */
static ifd_plugin_set plugins; /* the libraries loaded */

/* The classes one plugin's entry point registers, committed to the registry only when it
 * succeeds. */
typedef struct pending {
    const char *path;
    const ifd_program_class *cls[MAX_PROGRAMS];
    int n;
    ifd_error refused; /* the first class refused: the load fails even if the plugin goes on */
} pending;

static int check_class(pending *pd, const ifd_program_class *cls, ifd_error *err);

static int pending_add(ifd_program_registry *reg, const ifd_program_class *cls, ifd_error *err)
{
    pending *pd = reg->ctx;
    ifd_error e;
    ifd_error_clear(&e);
    int rc = check_class(pd, cls, &e);
    if (rc == IFD_OK) {
        pd->cls[pd->n++] = cls;
        return IFD_OK;
    }
    if (pd->refused.code == IFD_OK)
        pd->refused = e;
    if (err)
        *err = e;
    return rc;
}

static int check_class(pending *pd, const ifd_program_class *cls, ifd_error *err)
{
    if (!class_complete(cls))
        return ifd_error_set(
            err, IFD_EINVAL, "program library '%s': registers a program class%s%s%s without %s",
            pd->path, cls && cls->name ? " '" : "", cls && cls->name ? cls->name : "",
            cls && cls->name ? "'" : "",
            cls == NULL ? "a class (NULL)" : "all of name, setup, workspace_floats and train_step");
    const ifd_program_class *had = ifd_program_find(cls->name);
    if (had != NULL) {
        const char *from = NULL;
        int builtin = 0;
        for (int i = 0; i < nregistered; i++) {
            if (registry[i] == had) {
                from = origin[i];
                builtin = i < NBUILTIN;
            }
        }
        if (!builtin && from == NULL)
            return ifd_error_set(err, IFD_EINVAL,
                                 "program library '%s': registers program '%s', a name the "
                                 "application registered already: expected a new name",
                                 pd->path, cls->name);
        if (from)
            return ifd_error_set(err, IFD_EINVAL,
                                 "program library '%s': registers program '%s', a name program "
                                 "library '%s' registered already: expected a new name",
                                 pd->path, cls->name, from);
        return ifd_error_set(err, IFD_EINVAL,
                             "program library '%s': registers program '%s', the name of a "
                             "built-in program: expected a new name",
                             pd->path, cls->name);
    }
    for (int i = 0; i < pd->n; i++)
        if (strcmp(pd->cls[i]->name, cls->name) == 0)
            return ifd_error_set(err, IFD_EINVAL,
                                 "program library '%s': registers program '%s' twice", pd->path,
                                 cls->name);
    if (nregistered + pd->n >= MAX_PROGRAMS)
        return ifd_error_set(err, IFD_EINVAL,
                             "program library '%s': registers program '%s', but at most %d "
                             "programs fit",
                             pd->path, cls->name, MAX_PROGRAMS);
    return IFD_OK;
}

static const ifd_plugin_kind program_plugins = {
    .what = "program library",
    .abi_symbol = IFD_PROGRAM_PLUGIN_ABI_SYMBOL,
    .init_symbol = IFD_PROGRAM_PLUGIN_INIT_SYMBOL,
    .macro = "IFD_PROGRAM_PLUGIN",
    .header = "include/infeed/program.h",
    .abi_name = "program ABI",
    .abi_version = IFD_PROGRAM_ABI_VERSION,
    .registers = "program",
};

static int run_program_init(void *entry, void *arg, ifd_error *perr, const ifd_error **refused,
                            int *registered)
{
    pending *pd = arg;
    ifd_program_plugin_init_fn init;
    *(void **)&init = entry;
    ifd_program_registry reg = {
        .abi_version = IFD_PROGRAM_ABI_VERSION, .ctx = pd, .add = pending_add};
    int rc = init(&reg, perr);
    *refused = &pd->refused;
    *registered = pd->n;
    return rc;
}

int ifd_program_load_plugin(const char *path, ifd_error *err)
{
    pending pd = {.path = path, .n = 0, .refused = {.code = IFD_OK}};
    int fresh;
    int rc = ifd_plugin_load(&program_plugins, &plugins, path, run_program_init, &pd, &fresh, err);
    if (rc || !fresh)
        return rc;
    char *own = strdup(path);
    if (own == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "program library '%s'", path);
    for (int i = 0; i < pd.n; i++) {
        origin[nregistered] = own;
        registry[nregistered++] = pd.cls[i];
    }
    return IFD_OK;
}
