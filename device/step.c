#include "device/step.h"

int ifd_optimizer_slots(ifd_optimizer_kind kind)
{
    switch (kind) {
    case IFD_OPT_MOMENTUM:
        return 1;
    case IFD_OPT_ADAM:
    case IFD_OPT_ADAMW:
        return 2;
    default:
        return 0;
    }
}

int64_t ifd_optimizer_nodecay_ranges(const ifd_param_spec *params, int nparams, int64_t *ranges)
{
    int64_t n = 0;
    for (int i = 0; i < nparams; i++) {
        const ifd_param_spec *ps = &params[i];
        if (!(ps->flags & IFD_PARAM_NO_DECAY) || ps->count <= 0)
            continue;
        /* insertion by offset: a program's parameters are few and mostly in order already */
        int64_t j = n;
        while (j > 0 && ranges[2 * (j - 1)] > ps->offset) {
            ranges[2 * j] = ranges[2 * (j - 1)];
            ranges[2 * j + 1] = ranges[2 * (j - 1) + 1];
            j--;
        }
        ranges[2 * j] = ps->offset;
        ranges[2 * j + 1] = ps->offset + ps->count;
        n++;
    }
    int64_t m = 0; /* merge ranges that touch */
    for (int64_t j = 0; j < n; j++) {
        if (m > 0 && ranges[2 * j] <= ranges[2 * m - 1]) {
            if (ranges[2 * j + 1] > ranges[2 * m - 1])
                ranges[2 * m - 1] = ranges[2 * j + 1];
            continue;
        }
        ranges[2 * m] = ranges[2 * j];
        ranges[2 * m + 1] = ranges[2 * j + 1];
        m++;
    }
    return m;
}

int ifd_step_inputs(const ifd_program *p, ifd_mode mode, int idx[IFD_MAX_INPUTS])
{
    int n = 0;
    for (int i = 0; i < p->ninputs; i++)
        if (mode != IFD_MODE_PREDICT || !(p->labels & (1u << i)))
            idx[n++] = i;
    return n;
}

/* A program's step returned rc: codes reserved for the runtime's own stop become IFD_EINTERNAL. */
static int program_rc(const ifd_program *p, int rc, ifd_error *err)
{
    if (ifd_error_is_secondary(rc) || rc == IFD_EEOF) {
        ifd_error_set(err, IFD_EINTERNAL,
                      "program '%s' returned %s from its step, a code reserved for the runtime",
                      p->cls->name, ifd_errname(rc));
        return IFD_EINTERNAL;
    }
    return rc;
}

int ifd_step_train(const ifd_program *p, const ifd_ops *ops, const ifd_step_ops *sops, void *sctx,
                   const ifd_replica_state *st, const ifd_optimizer *opt, float scale,
                   const ifd_tensor *inputs, int64_t rows, ifd_step_out *out, ifd_error *err)
{
    ifd_step_args a = {
        .inputs = inputs,
        .rows = rows,
        .params = st->params,
        .grads = st->grads,
        .workspace = st->workspace,
        .scale = scale,
        .out = out,
        .outfeeds = st->outfeeds,
    };
    int rc = program_rc(p, p->cls->train_step(p, ops, &a, err), err);
    if (rc)
        return rc;
    /* A step whose loss or gradients are not finite is skipped on every replica and host
     * (docs/design.md, "Non-finite steps"): the loss's verdict rides in the all-reduce. */
    sops->guard_loss(sctx, out, st->grads);
    rc = sops->allreduce_sum(sctx, st->grads, p->nparam_floats, err);
    if (rc)
        return rc;
    /* The runtime's outfeed tensors come with the check and the update: every mirror holds the
     * same sum, so the same norms. */
    sops->check_grads(sctx, st->grads, p->nparam_floats, out);
    sops->optimizer_apply(sctx, opt, st, p->nparam_floats, out);
    sops->finish_step(sctx, st->step, st->opt_step, out, rows);
    return IFD_OK;
}

int ifd_step_eval(const ifd_program *p, const ifd_ops *ops, const ifd_step_ops *sops, void *sctx,
                  const ifd_replica_state *st, const ifd_tensor *inputs, int64_t rows,
                  ifd_step_out *out, ifd_error *err)
{
    ifd_step_args a = {
        .inputs = inputs,
        .rows = rows,
        .params = st->params,
        .grads = NULL,
        .workspace = st->workspace,
        .scale = 1.0f,
        .out = out,
        .outfeeds = st->outfeeds,
    };
    int rc = program_rc(p, p->cls->train_step(p, ops, &a, err), err);
    if (rc)
        return rc;
    sops->finish_step(sctx, NULL, NULL, out, rows);
    return IFD_OK;
}

int ifd_step_predict(const ifd_program *p, const ifd_ops *ops, const ifd_step_ops *sops, void *sctx,
                     const ifd_replica_state *st, const ifd_tensor *inputs, int64_t rows,
                     float *pred, ifd_step_out *out, ifd_error *err)
{
    if (p->cls->predict_step == NULL)
        return ifd_error_set(err, IFD_ENOTSUP, "program '%s' has no predict step", p->cls->name);
    ifd_step_args a = {
        .inputs = inputs,
        .rows = rows,
        .params = st->params,
        .workspace = st->workspace,
        .scale = 1.0f,
        .out = out,
        .predictions = pred,
    };
    int rc = program_rc(p, p->cls->predict_step(p, ops, &a, err), err);
    if (rc)
        return rc;
    sops->finish_step(sctx, NULL, NULL, out, rows);
    return IFD_OK;
}
