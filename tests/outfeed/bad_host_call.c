/* Host call plugins the loader must refuse, one a build (tests/CMakeLists.txt compiles this file
 * once per BAD_* kind): no entry point, another ABI version, none registered, an incomplete
 * class, a name registered twice, too many tensors. */
#include <infeed/host_call.h>

static int step(void *state, int64_t global_step, const ifd_tensor *t, ifd_error *err)
{
    (void)state;
    (void)global_step;
    (void)t;
    (void)err;
    return IFD_OK;
}

static int summary(void *state, char *json, size_t len, ifd_error *err)
{
    (void)state;
    (void)len;
    (void)err;
    json[0] = '\0';
    return IFD_OK;
}

static const ifd_host_call_class cls = {
    .name = "bad", .ntensors = 1, .tensors = {"loss"}, .step = step, .summary = summary};
static const ifd_host_call_class incomplete = {
    .name = "incomplete", .ntensors = 1, .tensors = {"loss"}};
static const ifd_host_call_class no_tensors = {
    .name = "none", .ntensors = 0, .step = step, .summary = summary};

static int reg_init(ifd_host_call_registry *reg, ifd_error *err)
{
    (void)cls;
    (void)incomplete;
    (void)no_tensors;
#if defined(BAD_EMPTY)
    (void)reg;
    (void)err;
    return IFD_OK;
#elif defined(BAD_INCOMPLETE)
    return reg->add(reg, &incomplete, err);
#elif defined(BAD_NOTENSORS)
    return reg->add(reg, &no_tensors, err);
#elif defined(BAD_TWICE)
    int rc = reg->add(reg, &cls, err);
    return rc ? rc : reg->add(reg, &cls, err);
#else
    return reg->add(reg, &cls, err);
#endif
}

#if defined(BAD_NOENTRY)
int not_an_entry_point(ifd_host_call_registry *reg, ifd_error *err);
int not_an_entry_point(ifd_host_call_registry *reg, ifd_error *err)
{
    return reg_init(reg, err);
}
#elif defined(BAD_ABI)
__attribute__((visibility("default"))) const unsigned ifd_host_call_plugin_abi = 99;
__attribute__((visibility("default"))) int ifd_host_call_plugin_init(ifd_host_call_registry *reg,
                                                                     ifd_error *err);
int ifd_host_call_plugin_init(ifd_host_call_registry *reg, ifd_error *err)
{
    return reg_init(reg, err);
}
#else
IFD_HOST_CALL_PLUGIN(reg_init)
#endif
