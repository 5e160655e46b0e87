/*
 * Batch references. A batch is shared by the replicas that read its shards; the last unref
 * calls its release, from whichever thread that is.
 */
#ifndef IFD_CORE_BATCH_H
#define IFD_CORE_BATCH_H

#include <infeed/batches.h>

/* Adds n references. */
void ifd_batch_ref(ifd_batch *b, int n);
/* Drops one; the last calls b->release. */
void ifd_batch_unref(ifd_batch *b);

#endif
