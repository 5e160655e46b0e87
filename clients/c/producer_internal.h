/*
 * The producer's reply decoding without a socket, for tests and fuzz/fuzz_wire.c: a producer
 * that is never connected, fed the frames of a daemon reply as byte spans. The public producer
 * (include/infeed/client.h) receives each reply's frames and hands them to ifdp_on_reply.
 */
#ifndef IFD_CLIENT_PRODUCER_INTERNAL_H
#define IFD_CLIENT_PRODUCER_INTERNAL_H

#include <infeed/client.h>

/* A producer with no context and no socket (ifd_producer_destroy frees it); the checks of
 * ifd_producer_create on endpoint and name. Only the accessors and the functions below work on
 * it. */
int ifdp_alloc(ifd_producer **out, const char *endpoint, const char *name, ifd_error *err);

/* Decodes one reply of n >= 1 frames (frame 0 the header) and updates p: WELCOME, ACK, CREDIT,
 * ERROR, BYE, PREDICTION. A reply that cannot be decoded queues an IFD_EPROTO error; none
 * fails. */
void ifdp_on_reply(ifd_producer *p, const ifd_frame *frames, int n);

/* As ifd_producer_hello does while it waits (waiting 1) and after (0): WELCOME and the ERROR
 * without a seq answer the HELLO; ACK and CREDIT are ignored while waiting. */
void ifdp_expect_hello(ifd_producer *p, int waiting);
/* Since ifdp_expect_hello(p, 1): -1 when no answer came, IFD_OK after a WELCOME, or the
 * ERROR's code and sentence into err. */
int ifdp_hello_answer(const ifd_producer *p, ifd_error *err);

/* The oldest queued ERROR into err and its code, or IFD_OK when none is queued. */
int ifdp_pop_error(ifd_producer *p, ifd_error *err);

#endif
