/*
 * The producer's shared-memory transport (docs/protocol.md, "Shared memory"): asking for a pool
 * in HELLO, mapping it after WELCOME, BATCH_SHM instead of BATCH for batches it can hold, and
 * ifd_producer_buffer / ifd_producer_commit, which let the caller write a batch in place.
 */
#include <infeed/client.h>

#include "clients/c/producer_impl.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zmq.h>

/* ---- the mode and the pool ---------------------------------------------------------------- */

int ifd_producer_set_shm(ifd_producer *p, int mode, ifd_error *err)
{
    if (mode != IFD_SHM_AUTO && mode != IFD_SHM_ON && mode != IFD_SHM_OFF)
        return ifd_error_set(err, IFD_EINVAL,
                             "producer: shm: expected IFD_SHM_AUTO (0), IFD_SHM_ON (1) or "
                             "IFD_SHM_OFF (2), got %d",
                             mode);
    p->shm_mode = mode;
    return IFD_OK;
}

/* tcp://HOST:PORT with HOST loopback (127.0.0.0/8, ::1, localhost); libzmq's "tcp://SRC;DST"
 * names the destination after the ';'. */
static int tcp_loopback(const char *endpoint)
{
    const char *host = endpoint + strlen("tcp://");
    const char *semi = strchr(host, ';');
    if (semi)
        host = semi + 1;
    char buf[256];
    size_t len;
    if (host[0] == '[') {
        const char *close = strchr(host, ']');
        if (close == NULL)
            return 0;
        host++;
        len = (size_t)(close - host);
    } else {
        const char *colon = strrchr(host, ':');
        len = colon ? (size_t)(colon - host) : strlen(host);
    }
    if (len == 0 || len >= sizeof buf)
        return 0;
    memcpy(buf, host, len);
    buf[len] = '\0';
    if (strcasecmp(buf, "localhost") == 0)
        return 1;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, buf, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, buf, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return 0;
}

int ifdp_shm_wanted(const ifd_producer *p)
{
    if (p->shm_mode == IFD_SHM_ON)
        return 1;
    if (p->shm_mode == IFD_SHM_OFF)
        return 0;
    return strcmp(p->scheme, "ipc") == 0 ||
           (strcmp(p->scheme, "tcp") == 0 && tcp_loopback(p->endpoint));
}

void ifdp_shm_drop(ifd_producer *p)
{
    ifdp_pool_unmap(&p->pool);
    p->pending = 0;
}

int ifdp_shm_attach(ifd_producer *p, ifd_error *err)
{
    if (!p->shm_desc.given)
        return ifd_error_set(err, IFD_ENOTSUP, "the daemon gave no shared-memory pool: %s",
                             p->shm_refused_msg[0] ? p->shm_refused_msg
                                                   : "its WELCOME's shm is null and says no why");
    return ifdp_pool_map(&p->pool, &p->shm_desc, p->row_bytes, p->ntensors, p->batch_size, err);
}

const char *ifd_producer_transport(const ifd_producer *p)
{
    return p->pool.base ? "shm" : p->scheme;
}

const char *ifd_producer_shm_refused(const ifd_producer *p)
{
    return p->shm_why[0] ? p->shm_why : NULL;
}

/* ---- BATCH_SHM ---------------------------------------------------------------------------- */

/* The slots a message of `rows` rows takes, or 0 when the pool cannot hold it as the daemon would
 * take it (rows that are not k x batch_size in train and eval, or above batch_size in predict:
 * such a batch goes as BATCH, and the daemon's ERROR says what is wrong with it). */
static int slots_for(const ifd_producer *p, int64_t rows)
{
    int64_t bs = p->batch_size;
    if (bs <= 0 || rows <= 0)
        return 0;
    if (strcmp(p->mode, "predict") == 0)
        return rows <= bs ? 1 : 0;
    if (rows % bs != 0 || rows / bs > p->max_steps || rows / bs > p->pool.slots.n)
        return 0;
    return (int)(rows / bs);
}

/* Sends BATCH_SHM for the message of `rows` rows written at `slot` (slots already found free or
 * reserved, credit there). */
static int send_batch_shm(ifd_producer *p, int64_t rows, int slot, int k, int timeout_ms,
                          ifd_error *err)
{
    unsigned char h[IFD_PROTO_BATCH_HDR];
    ifd_proto_batch_shm(h, p->next_seq, rows, (uint32_t)slot);
    int rc = ifdp_send_header(p, h, 0, timeout_ms, err);
    if (rc)
        return rc;
    ifdp_slots_take(&p->pool.slots, slot, k, p->next_seq);
    return ifdp_after_send(p, rows, err);
}

int ifdp_shm_send(ifd_producer *p, int64_t rows, const ifd_frame *frames, int n, int timeout_ms,
                  int *rc, ifd_error *err)
{
    int k = p->pool.base && n == p->pool.n ? slots_for(p, rows) : 0;
    for (int i = 0; i < n && k; i++)
        if (frames[i].size != (size_t)rows * p->row_bytes[i])
            k = 0; /* the daemon's ESHAPE names the tensor and its sizes */
    if (k == 0)
        return 0;
    int slot = -1;
    if ((*rc = ifdp_wait_send(p, ifdp_batch_steps(p, rows), k, &slot, timeout_ms, err)))
        return 1;
    for (int i = 0; i < n; i++)
        if (frames[i].size)
            memcpy(ifdp_pool_slot(&p->pool, i, slot), frames[i].data, frames[i].size);
    *rc = send_batch_shm(p, rows, slot, k, timeout_ms, err);
    return 1;
}

/* ---- writing in place --------------------------------------------------------------------- */

int ifd_producer_buffer(ifd_producer *p, int64_t steps, void **data, int n, int timeout_ms,
                        ifd_error *err)
{
    if (!p->welcomed)
        return ifd_error_set(err, IFD_EINVAL, "buffer: no WELCOME yet: call ifd_producer_hello");
    if (data == NULL || n != p->ntensors)
        return ifd_error_set(err, IFD_EINVAL,
                             "buffer: expected room for %d tensor pointers (the schema's), got %d",
                             p->ntensors, data ? n : 0);
    if (p->pending)
        return ifd_error_set(err, IFD_EINVAL,
                             "buffer: the previous buffer is not committed yet (commit it, or "
                             "drop it with ifd_producer_commit(p, 0, ...))");
    int64_t most = strcmp(p->mode, "predict") == 0 ? 1 : p->max_steps > 1 ? p->max_steps : 1;
    if (steps < 1 || steps > most)
        return ifd_error_set(err, IFD_EINVAL,
                             "buffer: steps: expected 1 to %lld (WELCOME's "
                             "max_steps_per_message%s), got %lld",
                             (long long)most,
                             strcmp(p->mode, "predict") == 0 ? "; predict mode: 1" : "",
                             (long long)steps);
    int64_t rows = steps * p->batch_size;
    if (p->pool.base) {
        int slot = -1, rc;
        if ((rc = ifdp_wait_send(p, steps, (int)steps, &slot, timeout_ms, err)))
            return rc;
        ifdp_slots_reserve(&p->pool.slots, slot, (int)steps);
        for (int i = 0; i < n; i++)
            data[i] = ifdp_pool_slot(&p->pool, i, slot);
        p->pending_slot = slot;
    } else {
        for (int i = 0; i < n; i++) {
            size_t bytes = (size_t)rows * p->row_bytes[i];
            if (bytes > p->scratch_cap[i]) {
                void *b = realloc(p->scratch[i], bytes);
                if (b == NULL)
                    return ifd_error_set(err, IFD_ENOMEM,
                                         "buffer: out of memory for %zu bytes of tensor %d", bytes,
                                         i);
                p->scratch[i] = b;
                p->scratch_cap[i] = bytes;
            }
            data[i] = p->scratch[i];
        }
    }
    p->pending = 1;
    p->pending_steps = steps;
    return IFD_OK;
}

int ifd_producer_commit(ifd_producer *p, int64_t rows, int timeout_ms, ifd_error *err)
{
    if (!p->pending)
        return ifd_error_set(err, IFD_EINVAL,
                             "commit: no buffer to commit: call "
                             "ifd_producer_buffer first");
    int64_t bs = p->batch_size, cap = p->pending_steps * bs;
    int predict = strcmp(p->mode, "predict") == 0;
    int on_pool = p->pool.base != NULL;
    if (rows == 0) {
        if (on_pool)
            ifdp_slots_unreserve(&p->pool.slots, p->pending_slot, (int)p->pending_steps);
        p->pending = 0;
        return IFD_OK;
    }
    if (rows < 0 || rows > cap || (!predict && rows % bs != 0))
        return ifd_error_set(err, IFD_EINVAL,
                             "commit: rows: expected %s up to the buffer's %lld (0: drop it), "
                             "got %lld",
                             predict ? "1" : "a multiple of batch_size", (long long)cap,
                             (long long)rows);
    int rc;
    int64_t sent = p->sent;
    if (!on_pool) {
        ifd_frame frames[IFD_MAX_INPUTS];
        for (int i = 0; i < p->ntensors; i++)
            frames[i] = (ifd_frame){p->scratch[i], (size_t)rows * p->row_bytes[i]};
        rc = ifd_producer_send(p, rows, frames, p->ntensors, timeout_ms, err);
    } else {
        int k = predict ? 1 : (int)(rows / bs);
        /* Credit and slots were had by buffer; only ERRORs, BYE and END can stop it now. */
        if ((rc = ifdp_wait_send(p, ifdp_batch_steps(p, rows), 0, NULL, timeout_ms, err)))
            return rc;
        ifdp_slots_unreserve(&p->pool.slots, p->pending_slot + k, (int)p->pending_steps - k);
        rc = send_batch_shm(p, rows, p->pending_slot, k, timeout_ms, err);
        if (p->sent == sent) /* not sent: its slots reserved again, the buffer still pending */
            ifdp_slots_reserve(&p->pool.slots, p->pending_slot, (int)p->pending_steps);
    }
    if (p->sent != sent)
        p->pending = 0;
    return rc;
}
