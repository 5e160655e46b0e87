/*
 * The I/O thread's wait on its ZeroMQ sockets' ZMQ_FD (zmq_wait.h has the rules).
 */
#include "host/ingest/zmq_wait.h"

#include <errno.h>
#include <zmq.h>

int ingest_wait_add(ingest_wait *w, void *sock, int fd, const char *what, int *index,
                    ifd_error *err)
{
    if (w->n >= INGEST_WAIT_MAX)
        return ifd_error_set(err, IFD_EINVAL, "%s: the I/O thread waits on at most %d items", what,
                             INGEST_WAIT_MAX);
    if (sock) {
        size_t len = sizeof fd;
        if (zmq_getsockopt(sock, ZMQ_FD, &fd, &len) != 0)
            return ifd_error_set(err, IFD_EIO, "%s: zmq_getsockopt(ZMQ_FD): %s", what,
                                 zmq_strerror(zmq_errno()));
    }
    int i = w->n++;
    w->fds[i] = (struct pollfd){.fd = fd, .events = POLLIN};
    w->socks[i] = sock;
    w->marked[i] = sock != NULL;
    w->ready[i] = 0;
    *index = i;
    return IFD_OK;
}

void ingest_wait_touch(ingest_wait *w, int i)
{
    if (i >= 0 && i < w->n && w->socks[i])
        w->marked[i] = 1;
}

/* Whether a marked socket has input now (or its events cannot be read). */
static int has_input(void *sock)
{
    int events = 0;
    size_t len = sizeof events;
    return zmq_getsockopt(sock, ZMQ_EVENTS, &events, &len) != 0 || (events & ZMQ_POLLIN);
}

int ingest_wait_poll(ingest_wait *w, int ms)
{
    int nready = 0;
    for (int i = 0; i < w->n; i++) {
        w->ready[i] = 0;
        if (w->marked[i]) {
            w->marked[i] = 0;
            if (has_input(w->socks[i])) {
                w->ready[i] = 1;
                nready++;
            }
        }
    }
    int rc = poll(w->fds, (nfds_t)w->n, nready ? 0 : ms);
    if (rc < 0 && nready == 0)
        return -1;
    for (int i = 0; rc > 0 && i < w->n; i++) {
        if (!w->ready[i] && (w->fds[i].revents & (POLLIN | POLLERR | POLLHUP))) {
            w->ready[i] = 1;
            nready++;
        }
    }
    return nready;
}
