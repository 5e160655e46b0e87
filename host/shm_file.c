/* memfd_create and F_ADD_SEALS need _GNU_SOURCE, which the build defines */
#include "host/shm_file.h"

#include <infeed/error.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int ifd_shm_file_make(ifd_shm_file *f, const char *name, size_t size, const void *hdr, size_t hlen,
                      int prot, int mflags, char *why, size_t wlen)
{
    *f = (ifd_shm_file){.fd = -1, .size = size};
    int e, rc = IFD_EIO;
    f->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (f->fd < 0 || fchmod(f->fd, 0600) != 0 || ftruncate(f->fd, (off_t)size) != 0) {
        snprintf(why, wlen, "memfd of %zu bytes: %s", size, strerror(errno));
        goto fail;
    }
    if ((e = posix_fallocate(f->fd, 0, (off_t)size)) != 0) {
        rc = e == ENOSPC || e == ENOMEM ? IFD_ENOMEM : IFD_EIO;
        snprintf(why, wlen, "cannot reserve %zu bytes of shared memory: %s", size, strerror(e));
        goto fail;
    }
    if (fcntl(f->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        pwrite(f->fd, hdr, hlen, 0) != (ssize_t)hlen) {
        snprintf(why, wlen, "sealing it: %s", strerror(errno));
        goto fail;
    }
    f->base = mmap(NULL, size, prot, MAP_SHARED | mflags, f->fd, 0);
    if (f->base == MAP_FAILED) {
        f->base = NULL;
        rc = IFD_ENOMEM;
        snprintf(why, wlen, "mmap of %zu bytes: %s", size, strerror(errno));
        goto fail;
    }
    snprintf(f->path, sizeof f->path, "/proc/%ld/fd/%d", (long)getpid(), f->fd);
    return IFD_OK;
fail:
    ifd_shm_file_close(f);
    return rc;
}

void ifd_shm_file_close_fd(ifd_shm_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

void ifd_shm_file_close(ifd_shm_file *f)
{
    if (f->base)
        munmap(f->base, f->size);
    f->base = NULL;
    ifd_shm_file_close_fd(f);
}
