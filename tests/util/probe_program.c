#include "tests/util/probe_program.h"

static int probe_setup(ifd_program *p, ifd_error *err)
{
    int rc = ifd_program_find("softmax")->setup(p, err);
    if (rc)
        return rc;
    if (p->settings.features != 3)
        return ifd_program_check_setting("probe", "features", p->settings.features, 3, 3, err);
    int64_t three = 3;
    if (ifd_program_add_outfeed(p, "x3", IFD_F32, 1, 1, &three) ||
        ifd_program_add_outfeed(p, "y1", IFD_I32, 1, 0, NULL))
        return ifd_error_set(err, IFD_EINTERNAL, "probe: outfeeds");
    return IFD_OK;
}

static int probe_step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a,
                      ifd_error *err)
{
    int rc = ifd_program_find("softmax")->train_step(p, ops, a, err);
    if (rc || a->outfeeds == NULL)
        return rc;
    ops->copy(ops->ctx, a->outfeeds[PROBE_X], a->inputs[0].data, a->rows * 3 * 4);
    ops->copy(ops->ctx, a->outfeeds[PROBE_Y], a->inputs[1].data, a->rows * 4);
    return IFD_OK;
}

const ifd_program_class *probe_program_class(void)
{
    static ifd_program_class cls;
    if (cls.name == NULL) {
        cls = *ifd_program_find("softmax");
        cls.name = "probe";
        cls.description = "softmax over 3 features, outfeeding x3 and y1 (tests)";
        cls.setup = probe_setup;
        cls.train_step = probe_step;
    }
    return &cls;
}

void probe_program_register(void)
{
    if (ifd_program_find("probe") == NULL)
        ifd_program_register(probe_program_class());
}

#ifdef PROBE_PLUGIN
static int probe_plugin_init(ifd_program_registry *reg, ifd_error *err)
{
    return reg->add(reg, probe_program_class(), err);
}

IFD_PROGRAM_PLUGIN(probe_plugin_init)
#endif
