/*
 * Internal helpers of the C client: the protocol's header layout (docs/protocol.md), little-endian
 * encoding, the monotonic clock for deadlines and libzmq error sentences.
 */
#ifndef IFD_CLIENT_WIRE_H
#define IFD_CLIENT_WIRE_H

#include "infeed/error.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define IFDW_MAGIC "IFDP"
#define IFDW_VERSION 1

enum {
    IFDW_HELLO = 1,
    IFDW_WELCOME = 2,
    IFDW_BATCH = 3,
    IFDW_CREDIT = 4,
    IFDW_ACK = 5,
    IFDW_END = 6,
    IFDW_ERROR = 7,
    IFDW_PREDICTION = 8,
    IFDW_BYE = 9,
};

/* Header sizes per type. */
#define IFDW_HDR_MIN 8
#define IFDW_HDR_BATCH 32
#define IFDW_HDR_CREDIT 16
#define IFDW_HDR_ACK 24

/* The largest HELLO JSON the daemon takes. */
#define IFDW_HELLO_JSON_MAX (64 * 1024)

static inline void ifdw_put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static inline void ifdw_put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void ifdw_put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint16_t ifdw_get16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t ifdw_get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline uint64_t ifdw_get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Writes the 8 common bytes: magic, version, type. */
static inline void ifdw_header(unsigned char *h, int type)
{
    memcpy(h, IFDW_MAGIC, 4);
    ifdw_put16(h + 4, IFDW_VERSION);
    ifdw_put16(h + 6, (uint16_t)type);
}

/* Monotonic nanoseconds. */
int64_t ifdw_now_ns(void);
/* A deadline timeout_ms from now; -1 (none) for a negative timeout. */
int64_t ifdw_deadline(int timeout_ms);
/* Milliseconds left to a deadline for zmq_poll: -1 for none, else >= 0 (rounded up). */
long ifdw_left_ms(int64_t deadline);

/* The error enum for a protocol code name ("ESHAPE"); -1 when it is none. */
int ifdw_code_parse(const char *name);
/* Sets err from errno after a failed libzmq call and returns the code (IFD_ENOMEM, IFD_ECLOSED
 * for a terminated context, IFD_EIO otherwise). */
int ifdw_zmq_error(ifd_error *err, const char *what);

#endif
