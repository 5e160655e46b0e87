/* Plugins the loader must refuse, one a build (tests/CMakeLists.txt compiles this file once per
 * BAD_* kind): no entry point, another ABI version (a future one, the old ABI 3), a built-in's
 * name, another plugin's name, a failing entry point, none registered, an incomplete class, a name
 * registered twice, a refusal the entry point ignores. */
#include <infeed/program.h>

#include <stddef.h>

static int setup(ifd_program *p, ifd_error *err)
{
    (void)p;
    (void)err;
    return IFD_OK;
}
static void init_params(const ifd_program *p, float *params, uint64_t seed)
{
    (void)p;
    (void)params;
    (void)seed;
}
static int64_t workspace(const ifd_program *p, int64_t rows)
{
    (void)p;
    return rows;
}
static int step(const ifd_program *p, const ifd_ops *ops, const ifd_step_args *a, ifd_error *err)
{
    (void)p;
    (void)ops;
    (void)a;
    (void)err;
    return IFD_OK;
}

#if defined(BAD_BUILTIN)
#define NAME "mlp"
#elif defined(BAD_IGNORE)
#define NAME "softmax"
#elif defined(BAD_PLUGIN)
#define NAME "mlp2"
#else
#define NAME "bad"
#endif

static const ifd_program_class cls = {
    .name = NAME,
    .setup = setup,
    .init_params = init_params,
    .workspace_floats = workspace,
    .train_step = step,
};
static const ifd_program_class incomplete = {.name = "incomplete", .setup = setup};

static int reg_init(ifd_program_registry *reg, ifd_error *err)
{
    (void)cls;
    (void)incomplete;
#if defined(BAD_FAIL)
    (void)reg;
    return ifd_error_set(err, IFD_ENOTSUP, "this plugin needs a GPU it did not find");
#elif defined(BAD_EMPTY)
    (void)reg;
    (void)err;
    return IFD_OK;
#elif defined(BAD_INCOMPLETE)
    return reg->add(reg, &incomplete, err);
#elif defined(BAD_IGNORE)
    /* A refused class, the error dropped, then a good one: the load still fails. */
    static const ifd_program_class good = {.name = "bad",
                                           .setup = setup,
                                           .init_params = init_params,
                                           .workspace_floats = workspace,
                                           .train_step = step};
    (void)reg->add(reg, &cls, NULL);
    (void)err;
    return reg->add(reg, &good, NULL);
#elif defined(BAD_TWICE)
    int rc = reg->add(reg, &cls, err);
    return rc ? rc : reg->add(reg, &cls, err);
#else
    return reg->add(reg, &cls, err);
#endif
}

#if defined(BAD_NOENTRY)
/* Exports something, but not the entry point. */
int not_an_entry_point(ifd_program_registry *reg, ifd_error *err);
int not_an_entry_point(ifd_program_registry *reg, ifd_error *err)
{
    return reg_init(reg, err);
}
#elif defined(BAD_ABI) || defined(BAD_ABI4)
/* What IFD_PROGRAM_PLUGIN writes, for a future ABI (99) or the one before gemm_bias's (4). */
#if defined(BAD_ABI4)
#define BAD_ABI_VERSION 4
#else
#define BAD_ABI_VERSION 99
#endif
__attribute__((visibility("default"))) const unsigned ifd_program_plugin_abi = BAD_ABI_VERSION;
__attribute__((visibility("default"))) int ifd_program_plugin_init(ifd_program_registry *reg,
                                                                   ifd_error *err);
int ifd_program_plugin_init(ifd_program_registry *reg, ifd_error *err)
{
    return reg_init(reg, err);
}
#else
IFD_PROGRAM_PLUGIN(reg_init)
#endif
