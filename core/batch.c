#include "core/batch.h"

#include <string.h>

void ifd_batch_init(ifd_batch *b)
{
    memset(b, 0, sizeof *b);
}

void ifd_batch_ref(ifd_batch *b, int n)
{
    __atomic_add_fetch(&b->refs, n, __ATOMIC_RELAXED);
}

void ifd_batch_unref(ifd_batch *b)
{
    if (__atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0 && b->release)
        b->release(b, b->release_arg);
}
