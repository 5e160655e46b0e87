#include "device/step.h"

int ifd_optimizer_slots(ifd_optimizer_kind kind)
{
    switch (kind) {
    case IFD_OPT_MOMENTUM:
        return 1;
    case IFD_OPT_ADAM:
        return 2;
    default:
        return 0;
    }
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
    };
    int rc = p->cls->train_step(p, ops, &a, err);
    if (ifd_error_is_secondary(rc) || rc == IFD_EEOF) {
        ifd_error_set(err, IFD_EINTERNAL,
                      "program '%s' returned %s from its step, a code reserved for the runtime",
                      p->cls->name, ifd_errname(rc));
        return IFD_EINTERNAL;
    }
    if (rc)
        return rc;
    rc = sops->allreduce_sum(sctx, st->grads, p->nparam_floats, err);
    if (rc)
        return rc;
    sops->optimizer_apply(sctx, opt, st->opt_step, p->nparam_floats, st->params, st->grads,
                          st->slot0, st->slot1);
    sops->finish_step(sctx, st->step, st->opt_step, out, rows);
    return IFD_OK;
}
