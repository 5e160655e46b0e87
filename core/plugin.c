#include "core/plugin.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int ifd_plugin_open(const ifd_plugin_kind *k, const char *path, void **handle, void **init,
                    ifd_error *err)
{
    *handle = *init = NULL;
    if (path == NULL || path[0] == '\0')
        return ifd_error_set(err, IFD_EINVAL, "%s: expected a file name, got ''", k->what);
    /* dlopen searches the library path for a name without '/': a user means the file here. */
    char local[4096];
    const char *open_path = path;
    if (strchr(path, '/') == NULL) {
        if ((size_t)snprintf(local, sizeof local, "./%s", path) >= sizeof local)
            return ifd_error_set(err, IFD_EINVAL, "%s '%.64s...': name too long", k->what, path);
        open_path = local;
    }
    dlerror();
    void *h = dlopen(open_path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *why = dlerror();
        return ifd_error_set(err, IFD_EINVAL, "%s '%s': cannot load it: %s", k->what, path,
                             why ? why : "dlopen failed");
    }
    const unsigned *abi = dlsym(h, k->abi_symbol);
    void *entry = dlsym(h, k->init_symbol);
    int rc = IFD_OK;
    if (abi == NULL || entry == NULL)
        rc = ifd_error_set(err, IFD_EINVAL,
                           "%s '%s': no entry point (symbol %s): expected a plugin that defines "
                           "it with %s (%s)",
                           k->what, path, abi == NULL ? k->abi_symbol : k->init_symbol, k->macro,
                           k->header);
    else if (*abi != k->abi_version)
        rc = ifd_error_set(err, IFD_EINVAL,
                           "%s '%s': built for %s version %u, expected version %u: rebuild it "
                           "against this infeed's headers",
                           k->what, path, k->abi_name, *abi, k->abi_version);
    if (rc != IFD_OK) {
        dlclose(h);
        return rc;
    }
    *handle = h;
    *init = entry;
    return IFD_OK;
}

static int run_outcome(const ifd_plugin_kind *k, const char *path, int rc, const ifd_error *perr,
                       const ifd_error *refused, int registered, ifd_error *err)
{
    if (refused && refused->code != IFD_OK)
        return ifd_error_set(err, IFD_EINVAL, "%s", refused->msg);
    if (rc != IFD_OK)
        return ifd_error_set(err, IFD_EINVAL, "%s '%s': its %s failed: %s", k->what, path,
                             k->init_symbol, perr->msg[0] ? perr->msg : ifd_strerror(rc));
    if (registered == 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "%s '%s': registers no %s: expected its %s to call reg->add at "
                             "least once",
                             k->what, path, k->registers, k->init_symbol);
    return IFD_OK;
}

int ifd_plugin_load(const ifd_plugin_kind *k, ifd_plugin_set *set, const char *path,
                    ifd_plugin_run_fn run, void *arg, int *fresh, ifd_error *err)
{
    *fresh = 0;
    void *h, *entry;
    int rc = ifd_plugin_open(k, path, &h, &entry, err);
    if (rc)
        return rc;
    for (int i = 0; i < set->n; i++) {
        if (set->handles[i] == h) {
            dlclose(h); /* the reference this call took */
            return IFD_OK;
        }
    }
    if (set->n == IFD_PLUGIN_SET_MAX) {
        rc = ifd_error_set(err, IFD_EINVAL, "%s '%s': at most %d libraries load", k->what, path,
                           IFD_PLUGIN_SET_MAX);
    } else {
        ifd_error perr;
        ifd_error_clear(&perr);
        const ifd_error *refused = NULL;
        int registered = 0;
        rc = run(entry, arg, &perr, &refused, &registered);
        rc = run_outcome(k, path, rc, &perr, refused, registered, err);
    }
    if (rc) {
        dlclose(h);
        return rc;
    }
    set->handles[set->n++] = h;
    *fresh = 1;
    return IFD_OK;
}
