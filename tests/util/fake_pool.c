#include "tests/util/fake_pool.h"

#include <check.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void fake_pool_make(fake_pool *pf, ifd_rng *rng, int n, const size_t *row_bytes, int64_t batch_size,
                    int64_t slots)
{
    memset(pf, 0, sizeof *pf);
    ifdp_shm_desc *d = &pf->desc;
    d->given = 1;
    d->n = n;
    d->slots = slots;
    uint64_t off = IFD_SHM_HEADER;
    for (int i = 0; i < n; i++) {
        d->offsets[i] = off;
        d->step_bytes[i] = (uint64_t)batch_size * row_bytes[i];
        off += d->step_bytes[i] * (uint64_t)slots;
        off = (off + IFD_SHM_ALIGN - 1) / IFD_SHM_ALIGN * IFD_SHM_ALIGN;
    }
    d->size = off;
    pf->size = (size_t)off;
    pf->fd = memfd_create("ifd-test-pool", MFD_CLOEXEC);
    ck_assert(pf->fd >= 0 && ftruncate(pf->fd, (off_t)off) == 0);
    pf->base = mmap(NULL, pf->size, PROT_READ | PROT_WRITE, MAP_SHARED, pf->fd, 0);
    ck_assert(pf->base != MAP_FAILED);
    memcpy(pf->base, IFD_SHM_MAGIC, IFD_SHM_MAGIC_LEN);
    for (int i = 0; i < IFD_SHM_TOKEN_LEN; i++) {
        d->token[i] = (unsigned char)ifd_rng_next(rng);
        snprintf(pf->token_hex + 2 * i, 3, "%02x", d->token[i]);
    }
    memcpy(pf->base + IFD_SHM_MAGIC_LEN, d->token, IFD_SHM_TOKEN_LEN);
    snprintf(d->path, sizeof d->path, "/proc/%d/fd/%d", (int)getpid(), pf->fd);
}

void fake_pool_free(fake_pool *pf)
{
    munmap(pf->base, pf->size);
    close(pf->fd);
}
