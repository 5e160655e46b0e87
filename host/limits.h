/*
 * The daemon's bounds on what peers can make it hold, and the memory formula of
 * docs/protocol.md ("Memory and connection bounds") that they add up to. Keep the two in step.
 */
#ifndef IFD_HOST_LIMITS_H
#define IFD_HOST_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#define IFD_HANDSHAKE_IVL_MS 5000         /* a connection must finish the ZMTP handshake */
#define IFD_HELLO_MAX ((size_t)64 << 10)  /* the largest HELLO JSON frame */
#define IFD_ROUTER_RCVHWM 32              /* complete messages queued per producer connection */
#define IFD_CONTROL_MAXMSGSIZE (16 << 10) /* a control request's frame */
#define IFD_CONTROL_HWM 4                 /* requests (replies) queued per control connection */
#define IFD_PUB_MAXMSGSIZE 1024 /* a subscription, and CURVE's handshake (INITIATE: ~300 bytes) */
#define IFD_PUB_RCVHWM 4        /* subscriptions queued per subscriber */
#define IFD_PUB_SUBS_MAX 8      /* subscriptions a subscriber may hold (a reader needs one) */
#define IFD_PUB_RCVBUF 4096     /* a subscriber's kernel receive buffer (SO_RCVBUF; doubled) */
/* What a subscriber's subscriptions can cost before it is closed, and while libzmq still reads
 * what it had sent: IFD_PUB_SUBS_MAX, the queue, and the kernel's and libzmq's buffers (2 x
 * IFD_PUB_RCVBUF and an 8 KiB read) of 1 KiB subscriptions, each costing libzmq's trie up to
 * IFD_SUB_COST (measured: 24 KiB for a subscription of 1000 distinct bytes). */
#define IFD_PUB_SUBS_HELD (IFD_PUB_SUBS_MAX + IFD_PUB_RCVHWM + (2 * IFD_PUB_RCVBUF + 8192) / 1024)
#define IFD_SUB_COST ((size_t)24 << 10)
#define IFD_PUB_SNDHWM 256  /* summaries queued per subscriber */
#define IFD_OUTBOX_MAX 4096 /* summaries waiting for the publisher thread */
/* Tensor messages (docs/summaries.md, "Tensor messages"): a subscription to "tensor:NAME" asks
 * for NAME; at most IFD_PUB_TENSORS_MAX names at once (more are not published), each shorter
 * than IFD_PUB_TOPIC_MAX; the bytes of tensor messages waiting for the publisher thread, and the
 * default byte rate (--tensor-rate). */
#define IFD_PUB_TENSOR_PREFIX "tensor:"
/* the same, its data in shared memory (host/tensor_ring.h) */
#define IFD_PUB_TENSOR_SHM_PREFIX "tensor-shm:"
#define IFD_PUB_TENSORS_MAX 64
#define IFD_PUB_TOPIC_MAX 64
#define IFD_PUB_TENSOR_OUTBOX_BYTES (16u << 20)
#define IFD_PUB_TENSOR_RATE (64LL << 20)
/* A tensor message gathers consecutive steps of one tensor until a device loop ends, a summary
 * goes out, or it would pass IFD_PUB_TENSOR_MESSAGE_BYTES of data or IFD_PUB_TENSOR_STEPS_MAX
 * steps (a single step larger than that is a message of its own). */
#define IFD_PUB_TENSOR_MESSAGE_BYTES ((size_t)64 << 10)
#define IFD_PUB_TENSOR_STEPS_MAX 256
#define IFD_SUMMARY_MAX ((size_t)4 << 10)  /* the largest summary, assumed */
#define IFD_CONN_COST ((size_t)96 << 10)   /* libzmq's own cost of a connection, measured */
#define IFD_BASE_MEMORY ((size_t)64 << 20) /* code, threads, libzmq, a small model */
#define IFD_NAMES_PER_CONN 8 /* producer names new in the run that one connection may start */

/* The ingest ROUTER's ZMQ_MAXMSGSIZE: the largest frame a valid message has (a full batch's
 * largest tensor, or a HELLO). */
size_t ifd_router_max_frame(size_t largest_tensor_bytes);
/* Its send HWM: the replies queued for one producer (an ACK and a PREDICTION a batch, ERRORs). */
int ifd_router_sndhwm(int credit);
/* The replies a connection's outbox holds at most once its queue is full (host/ingest/replies.c):
 * twice the queue (a producer within its credit never comes near). */
int ifd_outbox_max(int credit);

typedef struct ifd_memory_terms {
    int max_producers, credit;
    size_t batch_bytes;                             /* all tensor frames of a batch */
    size_t max_frame;                               /* ifd_router_max_frame */
    int tensors;                                    /* tensor frames of a batch */
    int conns_ingest, conns_publish, conns_control; /* connections at once, each socket */
} ifd_memory_terms;

/* The heap the daemon may hold (docs/protocol.md): peers whose messages have at most
 * tensors + 2 frames and are completed. */
size_t ifd_memory_bound(const ifd_memory_terms *t);

/* The shared memory (memfd pools, not heap) producers can make the daemon hold with --shm on:
 * max_producers pools in use and as many old ones whose steps are still in flight, each
 * (credit + max_steps - 1) step batches and the alignment of its regions. */
size_t ifd_shm_bound(const ifd_memory_terms *t, int max_steps);

#endif
