/*
 * The ingest I/O thread's wait (zmq_wait.c): ZeroMQ sockets through their ZMQ_FD, beside plain
 * descriptors, in one poll(2). zmq_poll reads each socket's ZMQ_EVENTS before its poll and again
 * after it, and each of those reads polls the socket's mailbox once more: 5 to 7 poll calls a
 * pass of the I/O thread where this wait makes one (bench/README.md, "ZMQ_FD").
 *
 * A socket's ZMQ_FD is edge-triggered (zmq_getsockopt(3)): it becomes readable when the socket's
 * state may have changed, and any call on the socket (a send, a receive, a ZMQ_EVENTS read) may
 * take that edge while a message still waits; a receive that ends on EAGAIN leaves the socket
 * so that the next message makes a new edge. Hence the caller's rule: a socket the wait reports
 * ready is read until EAGAIN, and one used otherwise since its last EAGAIN (a send, a receive
 * that stopped before EAGAIN) is marked (ingest_wait_touch). The next wait reads a marked
 * socket's ZMQ_EVENTS before it blocks, and does not block when it has input; for the others
 * their ZMQ_FD is enough. Every socket starts marked.
 *
 * One thread, the sockets' owner.
 */
#ifndef IFD_HOST_INGEST_ZMQ_WAIT_H
#define IFD_HOST_INGEST_ZMQ_WAIT_H

#include <infeed/error.h>

#include <poll.h>

#define INGEST_WAIT_MAX 4

typedef struct ingest_wait {
    int n;
    struct pollfd fds[INGEST_WAIT_MAX];
    void *socks[INGEST_WAIT_MAX]; /* NULL: a plain descriptor */
    int marked[INGEST_WAIT_MAX];  /* read its ZMQ_EVENTS before blocking */
    int ready[INGEST_WAIT_MAX];   /* the last wait's result: input may wait */
} ingest_wait;

/* Adds a ZeroMQ socket (sock) or a plain descriptor (sock NULL, fd), polled for input; its index
 * in fds, socks and ready. IFD_EINVAL when full, IFD_EIO when ZMQ_FD cannot be read (what names
 * the socket in the sentence). */
int ingest_wait_add(ingest_wait *w, void *sock, int fd, const char *what, int *index,
                    ifd_error *err);
/* The caller used socket i since it last read it until EAGAIN (a send, a receive that stopped
 * short): the next wait reads its ZMQ_EVENTS before it blocks. */
void ingest_wait_touch(ingest_wait *w, int i);
/* Waits up to ms milliseconds (0: not at all, -1: without limit) for input on any item: how many
 * are ready (w->ready), 0 when none is, -1 when poll failed (errno, EINTR included). A socket whose
 * ZMQ_EVENTS cannot be read is reported ready, so that the caller's receive says why. */
int ingest_wait_poll(ingest_wait *w, int ms);

#endif
