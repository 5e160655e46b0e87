/*
 * The ingest protocol's binary headers (docs/protocol.md): frame 0 of every message. All
 * integers little-endian; these helpers pack and parse them byte by byte, so the layout does not
 * depend on the host's endianness or struct padding. Header-only and libc-only: the daemon
 * (host/ingest/) and the C client (clients/c) both use this one definition of the wire format.
 */
#ifndef IFD_CORE_WIRE_H
#define IFD_CORE_WIRE_H

#include "infeed/wire_version.h" /* IFD_PROTOCOL_VERSION */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define IFD_PROTO_MAGIC "IFDP"
#define IFD_PROTO_HDR 8
#define IFD_PROTO_BATCH_HDR 32
#define IFD_PROTO_CREDIT_HDR 16
#define IFD_PROTO_ACK_HDR 24
#define IFD_PROTO_NAME_MAX 63                /* bytes of a producer name */
#define IFD_PROTO_HELLO_JSON_MAX (64 * 1024) /* bytes of a HELLO's JSON frame */

/* The credit infeedd grants when --credit is 0 (auto): enough batches in flight to cover
 * IFD_PROTO_AUTO_CREDIT_BYTES, at least 8 and at most 256 (bandwidth times round trip: small
 * batches need many in flight, large ones few). */
#define IFD_PROTO_AUTO_CREDIT_BYTES (16u << 20)
static inline int ifd_proto_auto_credit(size_t batch_bytes)
{
    size_t n = batch_bytes ? IFD_PROTO_AUTO_CREDIT_BYTES / batch_bytes : 256;
    return n < 8 ? 8 : n > 256 ? 256 : (int)n;
}

enum {
    IFD_MSG_HELLO = 1,
    IFD_MSG_WELCOME = 2,
    IFD_MSG_BATCH = 3,
    IFD_MSG_CREDIT = 4,
    IFD_MSG_ACK = 5,
    IFD_MSG_END = 6,
    IFD_MSG_ERROR = 7,
    IFD_MSG_PREDICTION = 8,
    IFD_MSG_BYE = 9,
    IFD_MSG_BATCH_SHM = 10,
};

/* The shared-memory pool's first bytes (docs/protocol.md, "Shared memory"): the magic, then the
 * 16-byte token WELCOME names (hex), then zeros up to IFD_SHM_HEADER. */
#define IFD_SHM_MAGIC "IFDSHM1"
#define IFD_SHM_MAGIC_LEN 8 /* with its NUL */
#define IFD_SHM_TOKEN_LEN 16
#define IFD_SHM_HEADER 64
#define IFD_SHM_ALIGN 64 /* every tensor region starts at a multiple of it */

static inline void ifd_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void ifd_put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void ifd_put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t ifd_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t ifd_get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t ifd_get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* The 8 common bytes: "IFDP", version, type. */
static inline void ifd_proto_header(uint8_t *p, int type)
{
    memcpy(p, IFD_PROTO_MAGIC, 4);
    ifd_put_u16(p + 4, IFD_PROTOCOL_VERSION);
    ifd_put_u16(p + 6, (uint16_t)type);
}

static inline size_t ifd_proto_ack(uint8_t *p, int64_t seq, uint32_t credit)
{
    ifd_proto_header(p, IFD_MSG_ACK);
    ifd_put_u64(p + 8, (uint64_t)seq);
    ifd_put_u32(p + 16, credit);
    ifd_put_u32(p + 20, 0);
    return IFD_PROTO_ACK_HDR;
}

static inline size_t ifd_proto_credit(uint8_t *p, uint32_t credit)
{
    ifd_proto_header(p, IFD_MSG_CREDIT);
    ifd_put_u32(p + 8, credit);
    ifd_put_u32(p + 12, 0);
    return IFD_PROTO_CREDIT_HDR;
}

typedef struct ifd_proto_header_info {
    uint16_t version;
    uint16_t type;
} ifd_proto_header_info;

/* 0, or -1 with a sentence in why. */
static inline int ifd_proto_parse_header(const void *data, size_t len, ifd_proto_header_info *h,
                                         char *why, size_t why_len)
{
    const uint8_t *p = data;
    if (len < IFD_PROTO_HDR) {
        snprintf(why, why_len, "header: expected at least %d bytes starting with 'IFDP', got %zu",
                 IFD_PROTO_HDR, len);
        return -1;
    }
    if (memcmp(p, "IFDP", 4) != 0) {
        snprintf(why, why_len, "header: magic: expected the bytes 'IFDP', got %02x %02x %02x %02x",
                 p[0], p[1], p[2], p[3]);
        return -1;
    }
    h->version = ifd_get_u16(p + 4);
    h->type = ifd_get_u16(p + 6);
    if (h->version != IFD_PROTOCOL_VERSION) {
        snprintf(why, why_len, "header: protocol version: expected %d, got %u",
                 IFD_PROTOCOL_VERSION, (unsigned)h->version);
        return -1;
    }
    return 0;
}

/* PREDICTION's frame 0: BATCH's layout (seq, rows, flags 0, ntensors) with type 8. */
static inline size_t ifd_proto_prediction(uint8_t *p, int64_t seq, int64_t rows, uint32_t ntensors)
{
    ifd_proto_header(p, IFD_MSG_PREDICTION);
    ifd_put_u64(p + 8, (uint64_t)seq);
    ifd_put_u64(p + 16, (uint64_t)rows);
    ifd_put_u32(p + 24, 0);
    ifd_put_u32(p + 28, ntensors);
    return IFD_PROTO_BATCH_HDR;
}

/* BATCH_SHM's frame 0: BATCH's layout with type 10 and the first slot where BATCH has
 * ntensors (no frames follow). */
static inline size_t ifd_proto_batch_shm(uint8_t *p, int64_t seq, int64_t rows, uint32_t slot)
{
    ifd_proto_header(p, IFD_MSG_BATCH_SHM);
    ifd_put_u64(p + 8, (uint64_t)seq);
    ifd_put_u64(p + 16, (uint64_t)rows);
    ifd_put_u32(p + 24, 0);
    ifd_put_u32(p + 28, slot);
    return IFD_PROTO_BATCH_HDR;
}

/* BATCH and BATCH_SHM (whose ntensors is the first slot). */
typedef struct ifd_proto_batch {
    int64_t seq;
    int64_t rows;
    uint32_t flags;
    uint32_t ntensors;
} ifd_proto_batch;

/* p holds at least IFD_PROTO_BATCH_HDR bytes. */
static inline void ifd_proto_parse_batch(const void *data, ifd_proto_batch *b)
{
    const uint8_t *p = data;
    b->seq = (int64_t)ifd_get_u64(p + 8);
    b->rows = (int64_t)ifd_get_u64(p + 16);
    b->flags = ifd_get_u32(p + 24);
    b->ntensors = ifd_get_u32(p + 28);
}

#endif
