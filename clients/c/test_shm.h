/* Shared by the files of test_shm (clients/c/test_shm.c, test_shm_send.c). */
#ifndef IFD_CLIENT_TEST_SHM_H
#define IFD_CLIENT_TEST_SHM_H

#include "clients/c/shm.h"
#include "core/rng.h"
#include "core/wire.h"

#include <check.h>
#include <stddef.h>

/* A pool as infeedd makes it (a memfd: magic, random token, one region per tensor), mapped. */
typedef struct pool_file {
    int fd;
    unsigned char *base;
    size_t size;
    ifdp_shm_desc desc; /* what WELCOME says of it */
    char token_hex[2 * IFD_SHM_TOKEN_LEN + 1];
} pool_file;

void pool_make(pool_file *pf, ifd_rng *rng, int n, const size_t *row_bytes, int64_t batch_size,
               int64_t slots);
void pool_free(pool_file *pf);

#define RC_OK(call, err)                                                                           \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        RASSERT(rc_ == IFD_OK, "%s returned %s: %s", #call, ifd_errname(rc_),                      \
                ifd_error_text(&(err)));                                                           \
    } while (0)

Suite *shm_send_suite(void);

#endif
