#include "outfeed/reducer_set.h"

#include <stdio.h>
#include <string.h>

#include "outfeed/reducers.h"

/* The class count the classifier reducers take: the program's, for classifiers. */
static int64_t program_classes(const ifd_program *p)
{
    return p->classifier ? p->settings.classes : 0;
}

static int unknown_tensor(const ifd_outfeed_tensors *tens, const char *name, const char *what,
                          const char *spec, ifd_error *err)
{
    char names[512];
    return ifd_error_set_key(err, IFD_EINVAL, "host_calls",
                             "%s '%s' of host call '%s' is not an outfeed tensor of program '%s' "
                             "in this mode; its tensors are %s",
                             what, name, spec, tens->program->cls->name,
                             ifd_outfeed_tensors_names(tens, names, sizeof names));
}

int ifd_reducer_set_init(ifd_reducer_set *s, const ifd_outfeed_tensors *tens,
                         const ifd_host_call *calls, int n, ifd_error *err)
{
    memset(s, 0, sizeof *s);
    int rc = IFD_OK;
    for (int i = 0; i < n && i < IFD_MAX_HOST_CALLS; i++) {
        const ifd_host_call *c = &calls[i];
        int t = ifd_outfeed_tensors_find(tens, c->tensor);
        if (t < 0) {
            rc = unknown_tensor(tens, c->tensor, "tensor", c->spec, err);
            goto fail;
        }
        ifd_reducer *r;
        rc = ifd_reducer_create(&r, c->tensor, c->spec, program_classes(tens->program), err);
        if (rc)
            goto fail;
        for (int j = 0; j < s->n; j++) {
            if (s->tensor[j] == t && strcmp(ifd_reducer_key(s->r[j]), ifd_reducer_key(r)) == 0) {
                rc = ifd_error_set_key(err, IFD_EINVAL, "host_calls",
                                       "host calls '%s' and '%s' of tensor '%s' would both be "
                                       "its summary's '%s': expected one of them",
                                       ifd_reducer_spec(s->r[j]), c->spec, c->tensor,
                                       ifd_reducer_key(r));
                ifd_reducer_destroy(r);
                goto fail;
            }
        }
        s->r[s->n] = r;
        s->tensor[s->n] = t;
        s->label[s->n] = -1;
        s->n++;
        ifd_dtype dt, ldt = IFD_DTYPE_INVALID;
        ifd_shape row, lrow;
        memset(&lrow, 0, sizeof lrow);
        ifd_outfeed_tensors_row(tens, t, &dt, &row);
        const char *needs = ifd_reducer_needs(r);
        if (needs) {
            int l = ifd_outfeed_tensors_find(tens, needs);
            if (l < 0) {
                rc = unknown_tensor(tens, needs, "label tensor", c->spec, err);
                goto fail;
            }
            if (tens->per_row[l] != tens->per_row[t]) {
                rc = ifd_error_set_key(err, IFD_ESHAPE, "host_calls",
                                       "host call '%s' of tensor '%s': its label tensor '%s' "
                                       "has %s, the tensor %s",
                                       c->spec, c->tensor, needs,
                                       tens->per_row[l] ? "a value a row" : "a value a step",
                                       tens->per_row[t] ? "a value a row" : "a value a step");
                goto fail;
            }
            s->label[s->n - 1] = l;
            ifd_outfeed_tensors_row(tens, l, &ldt, &lrow);
        }
        rc = ifd_reducer_check(r, dt, &row, ldt, needs ? &lrow : NULL, err);
        if (rc)
            goto fail;
    }
    return IFD_OK;
fail:
    ifd_reducer_set_fini(s);
    return rc;
}

int ifd_reducer_set_add(ifd_reducer_set *s, const ifd_outfeed_tensors *tens, ifd_error *err)
{
    for (int i = 0; i < s->n; i++) {
        const ifd_tensor *label = s->label[i] >= 0 ? &tens->tensors[s->label[i]] : NULL;
        int rc = ifd_reducer_add(s->r[i], &tens->tensors[s->tensor[i]], label, err);
        if (rc) /* the reducer's sentence names the host call and its tensor */
            return rc;
    }
    return IFD_OK;
}

json_t *ifd_reducer_set_take(ifd_reducer_set *s)
{
    if (s->n == 0)
        return NULL;
    json_t *all = json_object();
    for (int i = 0; i < s->n; i++) {
        const char *name = ifd_reducer_tensor(s->r[i]);
        json_t *t = json_object_get(all, name);
        if (t == NULL) {
            t = json_object();
            json_object_set_new(all, name, t);
        }
        json_t *v = ifd_reducer_value(s->r[i]);
        json_object_set_new(t, ifd_reducer_key(s->r[i]), v ? v : json_null());
        ifd_reducer_reset(s->r[i]);
    }
    return all;
}

void ifd_reducer_set_fini(ifd_reducer_set *s)
{
    for (int i = 0; i < s->n; i++)
        ifd_reducer_destroy(s->r[i]);
    s->n = 0;
}
