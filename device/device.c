#include "device/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ifd_device_backend *const backends[] = {
    &ifd_device_backend_cpu,
#ifdef IFD_HAVE_CUDA
    &ifd_device_backend_cuda,
#endif
};

#ifdef IFD_HAVE_CUDA
#define BACKEND_NAMES "cpu or cuda"
#else
#define BACKEND_NAMES "cpu"
#endif

#define NBACKENDS ((int)(sizeof backends / sizeof backends[0]))

int ifd_device_create(ifd_device **out, const char *backend, const ifd_device_config *cfg,
                      ifd_error *err)
{
    *out = NULL;
    const ifd_device_backend *be = NULL;
    for (int i = 0; i < NBACKENDS; i++)
        if (backend && strcmp(backends[i]->name, backend) == 0)
            be = backends[i];
    if (be == NULL) {
        if (backend && strcmp(backend, "cuda") == 0)
            return ifd_error_set(
                err, IFD_ENOTSUP,
                "backend: 'cuda' is not built into this libinfeed; available: cpu");
        return ifd_error_set(err, IFD_EINVAL, "backend: expected " BACKEND_NAMES ", got '%s'",
                             backend ? backend : "(none)");
    }
    ifd_device *dev = calloc(1, sizeof *dev + be->priv_size);
    if (dev == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "backend '%s'", be->name);
    dev->be = be;
    dev->cfg = *cfg;
    dev->priv = dev + 1;
    int rc = be->open(dev, err);
    if (rc) {
        free(dev);
        return rc;
    }
    *out = dev;
    return IFD_OK;
}

void ifd_device_destroy(ifd_device *dev)
{
    if (dev == NULL)
        return;
    dev->be->close(dev);
    free(dev);
}

void ifd_batch_tag_set(ifd_batch_tag *t, const ifd_batch *b)
{
    /* once a step: a bounded copy, not snprintf (whose formatting showed in a 4 KiB profile) */
    const char *name = b->producer ? b->producer : "";
    size_t n = strnlen(name, sizeof t->producer - 1);
    memcpy(t->producer, name, n);
    t->producer[n] = '\0';
    t->seq = b->seq;
    t->padding = (b->flags & IFD_BATCH_PADDED) && b->valid_rows == 0;
}
