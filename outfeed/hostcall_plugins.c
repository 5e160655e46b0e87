/*
 * Host call plugins (include/infeed/host_call.h): loading them and the registry of their
 * classes. The outfeed thread runs the registered classes (outfeed/hostcall.c).
 */
#include "core/plugin.h"
#include <infeed/host_call.h>

#include <string.h>

#define MAX_CLASSES 16

static const ifd_host_call_class *classes[MAX_CLASSES];
static int nclasses;
static ifd_plugin_set libs; /* the libraries loaded */

static const ifd_plugin_kind host_call_plugins = {
    .what = "host call library",
    .abi_symbol = IFD_HOST_CALL_PLUGIN_ABI_SYMBOL,
    .init_symbol = IFD_HOST_CALL_PLUGIN_INIT_SYMBOL,
    .macro = "IFD_HOST_CALL_PLUGIN",
    .header = "include/infeed/host_call.h",
    .abi_name = "host call ABI",
    .abi_version = IFD_HOST_CALL_ABI_VERSION,
    .registers = "host call",
};

/* What one plugin's entry point registers, kept apart until it returns: a failing plugin
 * registers nothing. */
typedef struct pending {
    const char *path;
    const ifd_host_call_class *cls[MAX_CLASSES];
    int n;
    ifd_error refused;
} pending;

static int taken(const pending *pd, const char *name)
{
    for (int i = 0; i < nclasses; i++)
        if (strcmp(classes[i]->name, name) == 0)
            return 1;
    for (int i = 0; i < pd->n; i++)
        if (strcmp(pd->cls[i]->name, name) == 0)
            return 1;
    return 0;
}

static int check_class(const pending *pd, const ifd_host_call_class *cls, ifd_error *err)
{
    if (cls == NULL || cls->name == NULL || cls->name[0] == '\0' || cls->step == NULL ||
        cls->summary == NULL)
        return ifd_error_set(err, IFD_EINVAL,
                             "host call library '%s': registers a host call class without all "
                             "of name, step and summary",
                             pd->path);
    if (cls->ntensors < 1 || cls->ntensors > IFD_HOST_CALL_MAX_TENSORS)
        return ifd_error_set(err, IFD_EINVAL,
                             "host call library '%s': host call '%s' takes %d tensors: expected "
                             "1 to %d",
                             pd->path, cls->name, cls->ntensors, IFD_HOST_CALL_MAX_TENSORS);
    for (int i = 0; i < cls->ntensors; i++)
        if (cls->tensors[i] == NULL || cls->tensors[i][0] == '\0')
            return ifd_error_set(err, IFD_EINVAL,
                                 "host call library '%s': host call '%s': tensor %d has no name",
                                 pd->path, cls->name, i);
    if (taken(pd, cls->name))
        return ifd_error_set(err, IFD_EINVAL,
                             "host call library '%s': registers host call '%s', a name taken "
                             "already: expected a new name",
                             pd->path, cls->name);
    if (nclasses + pd->n >= MAX_CLASSES)
        return ifd_error_set(err, IFD_EINVAL,
                             "host call library '%s': registers host call '%s', but at most %d "
                             "host calls fit",
                             pd->path, cls->name, MAX_CLASSES);
    return IFD_OK;
}

static int pending_add(ifd_host_call_registry *reg, const ifd_host_call_class *cls, ifd_error *err)
{
    pending *pd = reg->ctx;
    ifd_error e;
    ifd_error_clear(&e);
    int rc = check_class(pd, cls, &e);
    if (rc == IFD_OK)
        pd->cls[pd->n++] = cls;
    else if (pd->refused.code == IFD_OK)
        pd->refused = e;
    if (err && rc != IFD_OK)
        *err = e;
    return rc;
}

static int run_host_call_init(void *entry, void *arg, ifd_error *perr, const ifd_error **refused,
                              int *registered)
{
    pending *pd = arg;
    ifd_host_call_plugin_init_fn init;
    *(void **)&init = entry;
    ifd_host_call_registry reg = {
        .abi_version = IFD_HOST_CALL_ABI_VERSION, .ctx = pd, .add = pending_add};
    int rc = init(&reg, perr);
    *refused = &pd->refused;
    *registered = pd->n;
    return rc;
}

int ifd_host_call_load_plugin(const char *path, ifd_error *err)
{
    pending pd = {.path = path, .n = 0, .refused = {.code = IFD_OK}};
    int fresh;
    int rc = ifd_plugin_load(&host_call_plugins, &libs, path, run_host_call_init, &pd, &fresh, err);
    if (rc || !fresh)
        return rc;
    for (int i = 0; i < pd.n; i++)
        classes[nclasses++] = pd.cls[i];
    return IFD_OK;
}

int ifd_host_call_count(void)
{
    return nclasses;
}

const ifd_host_call_class *ifd_host_call_get(int i)
{
    return i >= 0 && i < nclasses ? classes[i] : NULL;
}
