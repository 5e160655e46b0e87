/* A shared-memory pool as infeedd makes it, for the C client's shared-memory suites
 * (tests/client/test_client_shm_*.c): a memfd of the test process, named by /proc/PID/fd/N. */
#ifndef IFD_TEST_FAKE_POOL_H
#define IFD_TEST_FAKE_POOL_H

#include "clients/c/shm.h"
#include "core/rng.h"
#include "core/wire.h"

#include <stddef.h>
#include <stdint.h>

/* A pool (a memfd: magic, random token, one region per tensor), mapped. */
typedef struct fake_pool {
    int fd;
    unsigned char *base;
    size_t size;
    ifdp_shm_desc desc; /* what WELCOME says of it */
    char token_hex[2 * IFD_SHM_TOKEN_LEN + 1];
} fake_pool;

/* A pool of `slots` x (batch_size x row_bytes[i]) bytes for each of n tensors after the header,
 * each region at a multiple of 64, the magic and a random token first. */
void fake_pool_make(fake_pool *pf, ifd_rng *rng, int n, const size_t *row_bytes, int64_t batch_size,
                    int64_t slots);
void fake_pool_free(fake_pool *pf);

#endif
