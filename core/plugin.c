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
