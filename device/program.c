#include "core/rng.h"
#include "infeed/program.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_PROGRAMS 32

extern const ifd_program_class ifd_program_linear;
extern const ifd_program_class ifd_program_softmax;
extern const ifd_program_class ifd_program_read;
extern const ifd_program_class ifd_program_mlp;

static const ifd_program_class *registry[MAX_PROGRAMS] = {&ifd_program_linear, &ifd_program_softmax,
                                                          &ifd_program_mlp, &ifd_program_read};
static int nregistered = 4;

int ifd_program_register(const ifd_program_class *cls)
{
    if (cls == NULL || cls->name == NULL || cls->setup == NULL || cls->train_step == NULL ||
        cls->init_params == NULL || cls->workspace_floats == NULL)
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

int ifd_program_init(ifd_program *p, const char *name, const ifd_program_settings *s,
                     ifd_error *err)
{
    memset(p, 0, sizeof *p);
    const ifd_program_class *cls = name ? ifd_program_find(name) : NULL;
    if (cls == NULL) {
        char names[256];
        return ifd_error_set(err, IFD_EINVAL, "program: expected one of %s, got '%s'",
                             ifd_program_names(names, sizeof names), name ? name : "(none)");
    }
    p->cls = cls;
    if (s)
        p->settings = *s;
    return cls->setup(p, err);
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

int ifd_program_add_label(ifd_program *p, const char *name, ifd_dtype dt, int rank,
                          const int64_t *dims)
{
    int rc = ifd_program_add_input(p, name, dt, rank, dims);
    if (rc == IFD_OK)
        p->labels |= 1u << (p->ninputs - 1);
    return rc;
}

int ifd_program_add_param(ifd_program *p, const char *name, int rank, const int64_t *dims)
{
    if (p->nparams == IFD_MAX_PARAMS || rank < 1 || rank > 2)
        return IFD_EINVAL;
    ifd_param_spec *ps = &p->params[p->nparams++];
    snprintf(ps->name, sizeof ps->name, "%s", name);
    ps->rank = rank;
    ps->count = 1;
    for (int i = 0; i < rank; i++) {
        ps->dims[i] = dims[i];
        ps->count *= dims[i];
    }
    ps->offset = p->nparam_floats;
    p->nparam_floats += ps->count;
    return IFD_OK;
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
