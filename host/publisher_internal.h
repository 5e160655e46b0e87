/* The publisher's parts, shared by host/publisher.c (its thread, the summaries, the
 * subscriptions) and host/publisher_tensors.c (tensor messages: gathering a tensor's steps,
 * the byte rate, the shared-memory ring). Not an interface: only these two include it. */
#ifndef IFD_HOST_PUBLISHER_INTERNAL_H
#define IFD_HOST_PUBLISHER_INTERNAL_H

#include "host/publisher.h"
#include "host/conns.h"
#include "host/endpoint.h"
#include "host/tensor_pool.h"
#include "host/tensor_ring.h"

#include "core/thread.h"
#include "host/limits.h"

#include <stddef.h>
#include <stdint.h>

/* A message waiting for the publisher thread: a summary (one frame, JSON, in buf) or a tensor
 * message (three frames: the topic and the JSON header in buf, the data in its own buffer, from
 * the publisher's pool, which libzmq takes without a copy and gives back). */
typedef struct outmsg {
    struct outmsg *next;
    int nframes;
    size_t len[3];
    size_t bytes;  /* of the frames together */
    int64_t steps; /* a tensor message: the steps it holds */
    char *data;    /* a tensor message: its data frame (len[2] bytes; the pool's, or NULL) */
    char buf[];
} outmsg;

/* A tensor some subscriber asked for, with its subscriptions counted: for data messages
 * ("tensor:NAME") and for notices of data in the ring ("tensor-shm:NAME"). */
typedef struct wanted_tensor {
    char name[IFD_PUB_TOPIC_MAX];
    int subs, shm_subs;
} wanted_tensor;

/* One outfeed tensor's steps gathered into its next message (the outfeed thread's, under
 * acc_mu): their global steps and rows, and their data one after another. */
typedef struct tensor_acc {
    char name[IFD_PUB_TOPIC_MAX]; /* "" for a name too long to be asked for */
    int want;                     /* some subscriber asks for it (as of acc_gen) */
    ifd_dtype dtype;
    int rank;
    int64_t dims[IFD_MAX_RANK]; /* dims[1..rank): a row's shape */
    int nsteps;
    int64_t steps[IFD_PUB_TENSOR_STEPS_MAX], rows[IFD_PUB_TENSOR_STEPS_MAX];
    char *data;            /* from the publisher's pool */
    size_t len, cap, hint; /* hint: the last message's bytes, the next buffer's size */
} tensor_acc;

struct ifd_publisher {
    void *pub;
    ifd_conns *conns; /* its connections and their subscriptions (this thread's) */
    int efd;
    ifd_sink *sink;
    ifd_thread thread;
    int started;
    ifd_mutex mu;
    outmsg *head, *tail; /* under mu */
    size_t len;          /* under mu */
    int64_t dropped;     /* under mu */
    int stopping;        /* under mu */
    /* Tensor messages (under mu): the tensors asked for, the bytes waiting in the outbox, the
     * token bucket of the byte rate, and the messages (and the steps they held) published and
     * not. */
    wanted_tensor wanted[IFD_PUB_TENSORS_MAX];
    int nwanted;       /* written under mu, atomically; read without it by the outfeed thread */
    unsigned want_gen; /* written under mu, atomically: changes with the names asked for */
    size_t tensor_bytes;
    double rate, tokens; /* bytes a second; bytes it may send now */
    int64_t refill_ns;
    int64_t tensor_sent, tensor_dropped, tensor_limited;
    int64_t steps_sent, steps_dropped, steps_limited;
    size_t largest; /* the largest tensor message so far */
    /* The steps being gathered (under acc_mu; lock order acc_mu, then mu): one accumulator a
     * tensor of the steps' layout (acc_names, naccs: the names array the steps came with, only
     * compared; each accumulator keeps a copy of its name), checked against the names asked for
     * at acc_gen. pending_bytes, pending_steps: their data and steps (atomic). */
    ifd_mutex acc_mu;
    tensor_acc *accs;
    int naccs;
    const char *const *acc_names;
    unsigned acc_gen;
    size_t pending_bytes, pending_steps;
    int unwoken;           /* atomic: tensor messages were queued without waking the thread */
    int64_t wakes;         /* atomic: the thread woken for what was queued */
    ifd_tensor_pool *pool; /* the data frames' buffers */
    /* The ring of the shared-memory subscribers' data (the outfeed thread's, under acc_mu), made
     * when first asked for; ring_bytes: its size (0: off), ring_failed: it could not be made.
     * Under mu: the notices sent, and the messages that went as data on a "tensor-shm:" topic
     * (no ring, or larger than it takes). */
    ifd_tensor_ring *ring;
    int64_t ring_bytes;
    int ring_failed;
    size_t ring_size;    /* under mu: the ring's file, once made */
    size_t ring_unwoken; /* under acc_mu: bytes written into it since the thread was woken */
    int64_t shm_notices, shm_data;
    ifd_tensor_sink tsink;
    char mode[16]; /* the run's, in the tensor messages' headers */
    char bound[IFD_ENDPOINT_MAX];
};

static inline int ifd_pub_is_tensor(const outmsg *m)
{
    return m->nframes > 1;
}

/* Wakes the publisher thread. */
void ifd_pub_wake(ifd_publisher *p);
void ifd_pub_outmsg_free(outmsg *m);
/* Queues m (under mu); when the outbox is full the oldest message is not published. */
void ifd_pub_outbox_push(ifd_publisher *p, outmsg *m);

/* host/publisher_tensors.c */
/* Queues every tensor message being gathered (under acc_mu). */
int ifd_pub_flush_all(ifd_publisher *p, ifd_error *err);
/* A subscription (on = 1) or its end (0) to topic, counted when it asks for a tensor. */
void ifd_pub_count_subscription(ifd_publisher *p, const uint8_t *topic, size_t n, int on);
/* The tensor sink that gathers a step's tensors into messages. */
ifd_tensor_sink ifd_pub_tensor_sink(ifd_publisher *p);

#endif
