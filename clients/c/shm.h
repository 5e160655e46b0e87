/*
 * The producer's shared-memory pool (docs/protocol.md, "Shared memory"): what WELCOME says about
 * it, mapping and checking it, and the slot allocator. Not installed; tests use it directly.
 */
#ifndef IFD_CLIENT_SHM_H
#define IFD_CLIENT_SHM_H

#include <infeed/error.h>
#include <infeed/program.h>

#include <stddef.h>
#include <stdint.h>

/*
 * The slots of a pool. A message of k steps takes k slots in a row, s to s + k - 1, and step j
 * of it is the stream's batch seq + j. A slot is free again once its step is acknowledged (ACK up
 * to its seq) or its message refused (ERROR with the message's seq). A duplicate's CREDIT names
 * no seq: its slots stay taken until the original's ACK, which covers the same seqs.
 *
 * find looks for k free slots in a row from where the last message ended, in ring order; where
 * fewer than k are left before the pool's end it goes on at slot 0. In order (ACKs only), the
 * slot it finds is exactly `next` (or 0): with slots = credit + max_steps - 1, credit for k steps
 * means k free slots there. After out-of-order frees (ERROR) it takes the first run it finds, so
 * a refused message's slots are used again rather than waited on.
 */
enum { IFDP_SLOT_FREE = 0, IFDP_SLOT_RESERVED = 1, IFDP_SLOT_IN_FLIGHT = 2 };

typedef struct ifdp_slots {
    int n;
    int next;       /* the slot after the last message's */
    uint8_t *state; /* IFDP_SLOT_* per slot */
    int64_t *step;  /* in flight: the seq of the step in the slot */
    int64_t *msg;   /* in flight: the seq of its message (its first step) */
} ifdp_slots;

int ifdp_slots_init(ifdp_slots *s, int n);
void ifdp_slots_fini(ifdp_slots *s);
/* The first slot of k free slots in a row, or -1 when there are none now (1 <= k). */
int ifdp_slots_find(const ifdp_slots *s, int k);
/* Slots first .. first + k - 1 (free) become reserved (buffer before commit). */
void ifdp_slots_reserve(ifdp_slots *s, int first, int k);
/* Slots first .. first + k - 1 (free or reserved) hold the k steps of message seq. */
void ifdp_slots_take(ifdp_slots *s, int first, int k, int64_t seq);
/* Reserved slots first .. first + k - 1 become free. */
void ifdp_slots_unreserve(ifdp_slots *s, int first, int k);
/* ACK up to seq: every step at or below it is consumed. */
void ifdp_slots_ack(ifdp_slots *s, int64_t seq);
/* ERROR with seq: message seq was refused. */
void ifdp_slots_reject(ifdp_slots *s, int64_t seq);
/* Slots not free (in flight or reserved). */
int ifdp_slots_busy(const ifdp_slots *s);

/* WELCOME's "shm" object, as it came (reply.c parses it; why says what was wrong with it). */
typedef struct ifdp_shm_desc {
    int given; /* WELCOME had an object */
    char path[256];
    uint64_t size;
    unsigned char token[16];
    int64_t slots;
    int n; /* entries of offsets and step_bytes */
    uint64_t offsets[IFD_MAX_INPUTS];
    uint64_t step_bytes[IFD_MAX_INPUTS];
    char why[256]; /* non-empty: the object is malformed */
} ifdp_shm_desc;

/* A mapped pool. */
typedef struct ifdp_pool {
    unsigned char *base; /* NULL: none */
    size_t size;
    int n;
    size_t offsets[IFD_MAX_INPUTS];
    size_t step_bytes[IFD_MAX_INPUTS];
    ifdp_slots slots;
} ifdp_pool;

/* Checks desc against the schema of the HELLO (n tensors of row_bytes each) and the WELCOME's
 * batch_size, opens desc->path, checks its size, maps it shared and checks its magic and token.
 * IFD_OK, or an error whose sentence names the field, what was expected and what was found;
 * pool is then left empty. */
int ifdp_pool_map(ifdp_pool *pool, const ifdp_shm_desc *desc, const size_t *row_bytes, int n,
                  int64_t batch_size, ifd_error *err);
/* Unmaps (a pool without base: nothing). */
void ifdp_pool_unmap(ifdp_pool *pool);
/* Where slot `slot` of tensor i starts. */
static inline unsigned char *ifdp_pool_slot(const ifdp_pool *pool, int i, int slot)
{
    return pool->base + pool->offsets[i] + (size_t)slot * pool->step_bytes[i];
}

#endif
