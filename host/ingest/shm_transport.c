/*
 * The shared-memory pools of producers on the daemon's host (docs/protocol.md, "Shared
 * memory"). A pool is a memfd whose pages are reserved when it is made (fallocate: a pool the
 * memory cannot hold is refused now, never a SIGBUS later) and sealed against resizing, so a peer
 * can neither cut the memory from under the daemon nor grow it; the daemon maps it read-only and
 * writes only its header (with pwrite, before mapping). The producer opens it through
 * /proc/<pid>/fd/<fd>, which only processes of the daemon's user can. It is not sealed against
 * hole punching: the seals that forbid that (F_SEAL_WRITE, F_SEAL_FUTURE_WRITE) forbid the
 * producer's writable mapping too; a punched page reads as zeros (docs/protocol.md).
 *
 * The transport: a BATCH_SHM names slots of its producer's pool, which become the step batches'
 * tensors (host_frames over the slots, holding a reference on the pool). I/O thread, except the
 * release (any thread: an atomic store and unref).
 */
/* memfd_create and F_ADD_SEALS need _GNU_SOURCE, which the build defines */
#include "host/ingest/ingest_internal.h"

#include "core/log.h"
#include "core/thread.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

/* Whether the HELLO came from this host: over ipc (or inproc: the fuzz harness), or over tcp
 * from a loopback address (libzmq's Peer-Address metadata). Other transports are not taken for
 * local. */
static int hello_is_local(ifd_ingest *g, const ingest_hello_msg *hello, char *why, size_t wlen)
{
    const char *ep = g->cfg->listen;
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0)
        return 1;
    if (strncmp(ep, "tcp://", 6) != 0) {
        snprintf(why, wlen, "the daemon listens on %s: shared memory needs ipc:// or tcp://", ep);
        return 0;
    }
    const char *addr = hello->peer_address;
    if (addr && (strncmp(addr, "127.", 4) == 0 || strcmp(addr, "::1") == 0 ||
                 strncmp(addr, "::ffff:127.", 11) == 0))
        return 1;
    snprintf(why, wlen,
             "the producer connects from %s, not a loopback address: shared memory is for "
             "producers on the daemon's host",
             addr ? addr : "an unknown address");
    return 0;
}

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* Registers the pool with the session's device, so that its batches go to the device without a
 * host copy (cuda); the cpu backend reads them in place anyway (IFD_ENOTSUP). */
static void pin(ifd_ingest *g, shm_pool *pool)
{
    if (g->session == NULL)
        return;
    ifd_mutex_lock(&g->pools.mu);
    ifd_error e;
    ifd_error_clear(&e);
    if (!g->pools.session_released) {
        int rc = ifd_session_register_host_memory(g->session, pool->file.base, pool->file.size, &e);
        if (rc == IFD_OK) {
            pool->g = g;
            pool->session = g->session;
            pool->next = g->pools.pinned;
            if (g->pools.pinned)
                g->pools.pinned->prev = pool;
            g->pools.pinned = pool;
        } else if (rc != IFD_ENOTSUP) {
            IFD_LOG_LIMITED(&g->lim_hello, IFD_LOG_WARN,
                            "a shared-memory pool of %zu bytes stays unregistered with the device "
                            "(its batches are staged, one host copy): %s",
                            pool->file.size, ifd_error_text(&e));
        }
    }
    ifd_mutex_unlock(&g->pools.mu);
}

/* Under pool_mu. */
static void unpin_locked(ifd_ingest *g, shm_pool *pool)
{
    ifd_session_unregister_host_memory(pool->session, pool->file.base);
    pool->session = NULL;
    if (pool->prev)
        pool->prev->next = pool->next;
    else
        g->pools.pinned = pool->next;
    if (pool->next)
        pool->next->prev = pool->prev;
    pool->next = pool->prev = NULL;
}

void ingest_shm_release_session(ifd_ingest *g)
{
    ifd_mutex_lock(&g->pools.mu);
    while (g->pools.pinned)
        unpin_locked(g, g->pools.pinned);
    g->pools.session_released = 1;
    ifd_mutex_unlock(&g->pools.mu);
}

shm_pool *ingest_shm_create(ifd_ingest *g, producer *p, const ingest_hello_msg *hello, char *why,
                            size_t wlen)
{
    if (!g->cfg->shm) {
        snprintf(why, wlen, "the daemon runs with --shm off");
        return NULL;
    }
    if (!hello_is_local(g, hello, why, wlen))
        return NULL;
    /* Old pools are kept by their steps in flight: a producer that says HELLO again and again
     * with a step in each would hold a pool a credit. */
    int alive = __atomic_load_n(&p->pools, __ATOMIC_ACQUIRE);
    if (alive >= SHM_POOLS_MAX) {
        snprintf(why, wlen,
                 "shared-memory pools of this producer: expected at most %d alive at once, got %d "
                 "(earlier pools whose steps, %d, are still in flight): a new one is made once "
                 "they are consumed",
                 SHM_POOLS_MAX, alive, p->in_flight);
        return NULL;
    }
    shm_pool *pool = calloc(1, sizeof *pool);
    if (pool == NULL) {
        snprintf(why, wlen, "out of memory");
        return NULL;
    }
    pool->file.fd = -1;
    pool->refs = 1;
    pool->alive = &p->pools;
    __atomic_add_fetch(pool->alive, 1, __ATOMIC_RELAXED);
    pool->slots = g->pr.credit + g->pr.max_steps - 1;
    pool->ntensors = g->pr.nin;
    size_t off = IFD_SHM_HEADER;
    for (int i = 0; i < g->pr.nin; i++) {
        const ifd_input_spec *in = g->pr.in[i];
        size_t row = ifd_dtype_size(in->dtype);
        for (int d = 0; d < in->rank; d++)
            row *= (size_t)in->dims[d];
        off = round_up(off, IFD_SHM_ALIGN);
        pool->offsets[i] = off;
        pool->step_bytes[i] = row * (size_t)g->pr.batch_rows;
        off += pool->step_bytes[i] * (size_t)pool->slots;
    }
    size_t size = round_up(off, (size_t)sysconf(_SC_PAGESIZE));
    pool->busy = malloc((size_t)pool->slots * sizeof *pool->busy);
    if (pool->busy == NULL) {
        snprintf(why, wlen, "out of memory");
        goto fail;
    }
    for (int s = 0; s < pool->slots; s++)
        pool->busy[s] = -1;
    uint8_t hdr[IFD_SHM_HEADER] = {0};
    if (getrandom(pool->token, sizeof pool->token, 0) != (ssize_t)sizeof pool->token) {
        snprintf(why, wlen, "getrandom: %s", strerror(errno));
        goto fail;
    }
    memcpy(hdr, IFD_SHM_MAGIC, IFD_SHM_MAGIC_LEN);
    memcpy(hdr + IFD_SHM_MAGIC_LEN, pool->token, IFD_SHM_TOKEN_LEN);
    char made[160];
    if (ifd_shm_file_make(&pool->file, "infeed-pool", size, hdr, sizeof hdr, PROT_READ, 0, made,
                          sizeof made) != IFD_OK) {
        snprintf(why, wlen, "%s (a pool of %d slots)", made, pool->slots);
        goto fail;
    }
    pin(g, pool);
    return pool;
fail:
    ingest_shm_unref(pool);
    return NULL;
}

int ingest_shm_must_wait(ifd_ingest *g, const producer *p, const ingest_hello_msg *hello)
{
    int alive = __atomic_load_n(&p->pools, __ATOMIC_ACQUIRE);
    if (p->pool && __atomic_load_n(&p->pool->refs, __ATOMIC_ACQUIRE) == 1)
        alive--; /* dropped by the HELLO, and freed: no step holds it */
    char why[IFD_ERROR_MSG_MAX];
    return alive >= SHM_POOLS_MAX && g->cfg->shm && hello_is_local(g, hello, why, sizeof why);
}

json_t *ingest_shm_json(const shm_pool *pool)
{
    char token[2 * IFD_SHM_TOKEN_LEN + 1];
    for (int i = 0; i < IFD_SHM_TOKEN_LEN; i++)
        snprintf(token + 2 * i, 3, "%02x", pool->token[i]);
    json_t *offsets = json_array(), *steps = json_array();
    for (int i = 0; i < pool->ntensors; i++) {
        json_array_append_new(offsets, json_integer((json_int_t)pool->offsets[i]));
        json_array_append_new(steps, json_integer((json_int_t)pool->step_bytes[i]));
    }
    return json_pack("{s:s, s:I, s:s, s:i, s:o, s:o}", "path", pool->file.path, "size",
                     (json_int_t)pool->file.size, "token", token, "slots", pool->slots, "offsets",
                     offsets, "step_bytes", steps);
}

void ingest_shm_ref(shm_pool *pool)
{
    __atomic_add_fetch(&pool->refs, 1, __ATOMIC_RELAXED);
}

void ingest_shm_mapped(shm_pool *pool)
{
    ifd_shm_file_close_fd(&pool->file);
}

/* Any thread: the last reference frees the pool. */
void ingest_shm_unref(shm_pool *pool)
{
    if (pool == NULL || __atomic_sub_fetch(&pool->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    if (pool->g) { /* registered once: unregistered before it is unmapped */
        ifd_mutex_lock(&pool->g->pools.mu);
        if (pool->session)
            unpin_locked(pool->g, pool);
        ifd_mutex_unlock(&pool->g->pools.mu);
    }
    ifd_shm_file_close(&pool->file);
    free(pool->busy);
    __atomic_sub_fetch(pool->alive, 1, __ATOMIC_RELEASE);
    free(pool);
}

void ingest_shm_drop(ifd_ingest *g, producer *p)
{
    (void)g;
    if (p->pool == NULL)
        return;
    ingest_shm_mapped(p->pool); /* nobody opens a dropped pool */
    ingest_shm_unref(p->pool);
    p->pool = NULL;
}

/* ---- BATCH_SHM ------------------------------------------------------------------------------ */

/* The slots a message's steps are in: a reference on the pool. */
typedef struct shm_frames {
    host_frames base;
    shm_pool *pool;
} shm_frames;

static void shm_frames_free(host_frames *fr)
{
    shm_frames *s = (shm_frames *)fr;
    ingest_shm_unref(s->pool);
    free(s);
}

/* The tensors are the pool's slots from `slot` on; float32 ones are read in place, the others
 * (labels, ids: values a program may index with) copied now, so that a producer writing the slot
 * later cannot change what was checked. */
static int take_slots(ifd_ingest *g, shm_frames *s, shm_pool *pool, uint32_t slot, int64_t rows)
{
    ingest_shm_ref(pool);
    s->pool = pool;
    s->base.slot_busy = pool->busy;
    s->base.pinned = pool->session != NULL;
    for (int i = 0; i < g->pr.nin; i++) {
        char *at = (char *)pool->file.base + pool->offsets[i] + (size_t)slot * pool->step_bytes[i];
        s->base.data[i] = at;
        if (g->pr.in[i]->dtype != IFD_F32) {
            s->base.copy_len[i] = ingest_tensor_bytes(&g->pr, i, rows);
            s->base.data[i] = s->base.copies[i] =
                ingest_copy_aligned(g, i, at, s->base.copy_len[i]);
            if (s->base.copies[i] == NULL)
                return IFD_ENOMEM;
        }
    }
    return IFD_OK;
}

/* BATCH_SHM's own checks: no frames, a pool (EPROTO); slots [slot, slot + k) in it, and those of
 * the steps taken (from skip on) free (EINVAL). The sentence, or NULL. */
static const char *check_frames(const producer *p, int nframes, char *msg, size_t len)
{
    if (nframes != 0) {
        snprintf(msg, len,
                 "BATCH_SHM: expected no frames after the header (the tensors are in "
                 "the shared-memory pool), got %d",
                 nframes);
        return msg;
    }
    if (p->pool == NULL) {
        snprintf(msg, len,
                 "BATCH_SHM: the producer has no shared-memory pool (a HELLO with "
                 "\"shm\": true gets one when the WELCOME's shm is not null)");
        return msg;
    }
    return NULL;
}

static const char *check_slots(const shm_pool *pool, uint32_t slot, int k, int skip, char *msg,
                               size_t len)
{
    if ((uint64_t)slot + (uint64_t)k > (uint64_t)pool->slots) {
        snprintf(msg, len,
                 "slot: a message of %d step%s from slot %" PRIu32 " needs slots up to %" PRIu64
                 ", the pool has %d (0 to %d)",
                 k, k == 1 ? "" : "s", slot, (uint64_t)slot + (uint64_t)k - 1, pool->slots,
                 pool->slots - 1);
        return msg;
    }
    for (int j = skip; j < k; j++) {
        int64_t in = __atomic_load_n(&pool->busy[slot + (uint32_t)j], __ATOMIC_ACQUIRE);
        if (in >= 0) {
            snprintf(msg, len,
                     "slot %" PRIu32 " holds step %" PRId64
                     ", which is in flight: a slot is written again once its step is "
                     "acknowledged",
                     slot + (uint32_t)j, in);
            return msg;
        }
    }
    return NULL;
}

void ingest_shm_handle_batch(ifd_ingest *g, const producer_rid *from, ingest_span hdr, int nframes)
{
    if (hdr.len < IFD_PROTO_BATCH_HDR) {
        ingest_send_error(g, from, IFD_EPROTO, NO_SEQ, 0,
                          "BATCH_SHM header: expected %d bytes (seq, rows, flags, slot), got %zu",
                          IFD_PROTO_BATCH_HDR, hdr.len);
        return;
    }
    ifd_proto_batch bh;
    ifd_proto_parse_batch(hdr.data, &bh);
    int k, skip;
    producer *p = ingest_batch_begin(g, from, &bh, "BATCH_SHM", &k);
    if (p == NULL)
        return;
    char msg[IFD_ERROR_MSG_MAX];
    if (p->pool)
        ingest_shm_mapped(p->pool); /* the producer has it: nobody else opens it */
    if (check_frames(p, nframes, msg, sizeof msg)) {
        ingest_batch_reject(g, p, from, k, IFD_EPROTO, bh.seq, msg);
        return;
    }
    int code = ingest_batch_check(&g->pr, &bh, k, NULL, 0, msg, sizeof msg);
    if (code) {
        ingest_batch_reject(g, p, from, k, code, bh.seq, msg);
        return;
    }
    if (ingest_batch_sequence(g, p, from, &bh, k, &skip))
        return;
    uint32_t slot = bh.ntensors; /* BATCH_SHM's ntensors is its first slot */
    if (check_slots(p->pool, slot, k, skip, msg, sizeof msg)) {
        ingest_batch_reject(g, p, from, k, IFD_EINVAL, bh.seq, msg);
        return;
    }
    shm_frames *s = calloc(1, sizeof *s);
    int rc = IFD_OK;
    if (s) {
        s->base.free = shm_frames_free;
        rc = take_slots(g, s, p->pool, slot, bh.rows);
    }
    ingest_batch_accept(g, p, from, &bh, k, skip, s ? &s->base : NULL, rc, (int)slot);
}
