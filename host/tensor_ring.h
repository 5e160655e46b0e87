/*
 * The shared-memory ring of tensor messages for subscribers on the daemon's host
 * (docs/summaries.md, "Tensor messages in shared memory"). A subscriber that asks for
 * "tensor-shm:NAME" (IFD_PUB_TENSOR_SHM_PREFIX) gets, for each of NAME's messages, a notice on the
 * PUB socket (the topic and the JSON header, with "shm": where the data lies) instead of the data
 * frame: the daemon writes the data once into the ring, and every such subscriber reads it there,
 * with no copy through a socket.
 *
 * The ring is a memfd of the daemon's (as the producers' pools, host/ingest/shm_transport.c):
 * mode 0600, its pages reserved when it is made (fallocate: a ring the memory cannot hold is
 * refused now, never a SIGBUS later), sealed against resizing, and gone when the daemon exits
 * (a subscriber's mapping keeps its pages until unmapped). A subscriber opens it read-only
 * through /proc/<pid>/fd/<fd>, which only processes of the daemon's user can.
 *
 * Layout: IFD_TENSOR_RING_HEADER bytes of header (the magic "IFDRING1", a 16-byte random token
 * the notices name, the data bytes `cap` (u64, little-endian, at byte 24), and at byte 64 the u64
 * `written`), then cap bytes of data. A message's data lies at a position `seq` that only grows
 * (its bytes at IFD_TENSOR_RING_HEADER + seq % cap, never across the end: a message that would
 * cross it starts at the next multiple of cap). Before the writer writes a message it stores
 * `written` = the end of the message's positions, then writes the data: the bytes at seq are
 * intact while written <= seq + cap. A reader (seqlock style) checks that before it reads and
 * again after (ifd_tensor_ring_read): a message overwritten meanwhile is lost, counted, never
 * waited for. The writer never reads the ring nor waits for a reader.
 */
#ifndef IFD_HOST_TENSOR_RING_H
#define IFD_HOST_TENSOR_RING_H

#include <infeed/error.h>

#include <stddef.h>
#include <stdint.h>

#define IFD_TENSOR_RING_MAGIC "IFDRING1" /* 8 bytes, no NUL */
#define IFD_TENSOR_RING_TOKEN_LEN 16
#define IFD_TENSOR_RING_HEADER 4096
#define IFD_TENSOR_RING_WRITTEN 64 /* the offset of `written` */
#define IFD_TENSOR_RING_ALIGN 64   /* every message's data starts at a multiple of it */
/* The ring's data bytes by default (tensor_shm_bytes), and the least: a message larger than a
 * quarter of the ring goes as a data message instead (its readers would lose it too soon).
 * 4 MiB: bench_outfeed's out16+shm cost about 4 us a step less CPU (the outfeed thread and the
 * reader, cache and TLB misses, and making the ring) than with 16 MiB, 2 us less than 8 MiB.
 * The notices of a loop that writes more than a quarter of the ring go at once, not at the
 * loop's end (host/publisher.c), so a reader has about three quarters of a ring to catch up. */
#define IFD_TENSOR_RING_BYTES ((int64_t)4 << 20)
#define IFD_TENSOR_RING_MIN ((int64_t)64 << 10)

typedef struct ifd_tensor_ring ifd_tensor_ring;

/* A ring of at least cap data bytes (rounded up to the page size); the error's sentence says
 * why it cannot be made (memfd, the memory to reserve). */
int ifd_tensor_ring_create(ifd_tensor_ring **out, int64_t cap, ifd_error *err);
void ifd_tensor_ring_destroy(ifd_tensor_ring *r);
/* Where the next message's n bytes go: *seq is its position; the caller writes them there
 * before it publishes the notice. NULL when n is over a quarter of the ring. The bytes of the
 * messages the claim overwrites are lost to their readers from now on. */
char *ifd_tensor_ring_claim(ifd_tensor_ring *r, size_t n, uint64_t *seq);
/* The path a subscriber opens (/proc/<pid>/fd/<fd>), the file's bytes, its token in hex. */
const char *ifd_tensor_ring_path(const ifd_tensor_ring *r);
size_t ifd_tensor_ring_size(const ifd_tensor_ring *r);
const char *ifd_tensor_ring_token(const ifd_tensor_ring *r);
/* The largest message a claim takes. */
size_t ifd_tensor_ring_max_message(const ifd_tensor_ring *r);

/* ---- a subscriber's side (the bench and the tests; the Python client has its own) ---- */

typedef struct ifd_tensor_ring_reader {
    const unsigned char *base; /* NULL: not mapped */
    size_t size;
    uint64_t cap;
    char path[64];
    char token[2 * IFD_TENSOR_RING_TOKEN_LEN + 1];
} ifd_tensor_ring_reader;

/* Opens path read-only and maps it, after checking its size, magic and token (hex) against a
 * notice's; the error names what differs. */
int ifd_tensor_ring_open(ifd_tensor_ring_reader *rd, const char *path, size_t size,
                         const char *token, ifd_error *err);
void ifd_tensor_ring_close(ifd_tensor_ring_reader *rd);
/* The n bytes of the message at seq, in place (valid while ifd_tensor_ring_intact says so), or
 * NULL with IFD_EPROTO when no message of n bytes can be there (not written yet, or crossing the
 * ring's end). */
const void *ifd_tensor_ring_at(const ifd_tensor_ring_reader *rd, uint64_t seq, size_t n,
                               ifd_error *err);
/* Whether the message at seq was not overwritten yet: checked before reading it in place and
 * again after (what was read before a check that says 1 is the message's). */
int ifd_tensor_ring_intact(const ifd_tensor_ring_reader *rd, uint64_t seq);
/* Copies the message at seq (n bytes) into dst: IFD_OK, IFD_ERANGE when it was overwritten
 * before or while it was read (lost: dst holds nothing of use), IFD_EPROTO as _at. */
int ifd_tensor_ring_read(const ifd_tensor_ring_reader *rd, uint64_t seq, size_t n, void *dst,
                         ifd_error *err);

#endif
