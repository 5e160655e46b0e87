/*
 * A shared-memory file of the daemon's for processes of its user on its host: the producers'
 * input pools (host/ingest/shm_transport.c) and the ring of tensor messages (host/tensor_ring.c).
 * It is a memfd, mode 0600, whose pages are reserved when it is made (fallocate: memory that
 * cannot be had is refused now, never a SIGBUS later), sealed against resizing (a peer can neither
 * cut the memory from under the daemon nor grow it), with its header written before it is mapped.
 * A peer opens it through /proc/<pid>/fd/<fd> (path), which only processes of the daemon's user
 * can.
 */
#ifndef IFD_HOST_SHM_FILE_H
#define IFD_HOST_SHM_FILE_H

#include <stddef.h>

typedef struct ifd_shm_file {
    int fd;     /* -1 once closed */
    void *base; /* the daemon's mapping; NULL when none */
    size_t size;
    char path[64];
} ifd_shm_file;

/* Makes f: a memfd named name of size bytes (a multiple of the page size) starting with the hlen
 * bytes of hdr, mapped with prot (PROT_READ, or with PROT_WRITE) and mmap's extra flags (0 or
 * MAP_POPULATE). Returns 0, or IFD_ENOMEM (the memory cannot be reserved or mapped) or IFD_EIO,
 * with what failed in why (for example "cannot reserve 4198400 bytes of shared memory: No space
 * left on device"); f is then closed. */
int ifd_shm_file_make(ifd_shm_file *f, const char *name, size_t size, const void *hdr, size_t hlen,
                      int prot, int mflags, char *why, size_t wlen);
/* Closes the descriptor (peers that opened the path keep their mapping; new ones cannot open it).
 */
void ifd_shm_file_close_fd(ifd_shm_file *f);
/* Unmaps and closes f (each at most once). */
void ifd_shm_file_close(ifd_shm_file *f);

#endif
