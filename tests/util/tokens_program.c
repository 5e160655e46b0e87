#include "tests/util/tokens_program.h"

#include <stddef.h>

typedef struct tokens_shape {
    int64_t vocab, block;
} tokens_shape;

static tokens_shape shape_of(const ifd_program *p)
{
    tokens_shape s = {p->params[0].dims[0], p->inputs[0].dims[0]};
    return s;
}

static int tokens_setup(ifd_program *p, ifd_error *err)
{
    int64_t v, t;
    int rc = ifd_program_config_int(p, "vocab", 16, 2, 4096, &v, err);
    if (rc == IFD_OK)
        rc = ifd_program_config_int(p, "block", 8, 1, 512, &t, err);
    if (rc)
        return rc;
    int64_t e[2] = {v, 1};
    ifd_param_init normal = {.kind = IFD_INIT_NORMAL, .std = 0.5f};
    if (ifd_program_add_ids(p, "ids", 0, 1, &t, v) ||
        ifd_program_add_label(p, "y", IFD_F32, 1, &t) ||
        ifd_program_add_param_with(p, "E", 2, e, normal, IFD_PARAM_NO_DECAY))
        return ifd_error_set(err, IFD_EINTERNAL, "tokens: declarations");
    p->predict_cols = t;
    return IFD_OK;
}

static int64_t tokens_workspace(const ifd_program *p, int64_t rows)
{
    return 2 * rows * p->inputs[0].dims[0];
}

static int tokens_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                       ifd_error *err)
{
    (void)err;
    tokens_shape s = shape_of(p);
    int64_t n = a->rows * s.block;
    const int32_t *ids = a->inputs[0].data;
    float *pred = a->workspace, *dpred = pred + n;
    ops->embedding(ops->ctx, n, 1, ids, a->params, pred);
    ops->squared_error(ops->ctx, n, 1, pred, a->inputs[1].data, a->scale, dpred, a->out);
    if (a->grads) {
        ops->fill(ops->ctx, s.vocab, 0.0f, a->grads); /* embedding_grad adds to it */
        ops->embedding_grad(ops->ctx, n, 1, ids, dpred, a->grads);
    }
    return IFD_OK;
}

static int tokens_predict(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                          ifd_error *err)
{
    (void)err;
    ops->embedding(ops->ctx, a->rows * shape_of(p).block, 1, a->inputs[0].data, a->params,
                   a->predictions);
    return IFD_OK;
}

const ifd_program_class *tokens_program_class(void)
{
    static const ifd_program_class cls = {
        .name = "tokens",
        .description = "an embedding regression over int32 token ids [T] (tests)",
        .setup = tokens_setup,
        .workspace_floats = tokens_workspace,
        .train_step = tokens_step,
        .predict_step = tokens_predict,
    };
    return &cls;
}

#ifdef TOKENS_PLUGIN
static int tokens_plugin_init(ifd_program_registry *reg, ifd_error *err)
{
    return reg->add(reg, tokens_program_class(), err);
}

IFD_PROGRAM_PLUGIN(tokens_plugin_init)
#endif
