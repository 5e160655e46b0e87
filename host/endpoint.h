/*
 * Binding the daemon's ZeroMQ endpoints, and what they were bound to.
 *
 * ipc:// endpoints: the folder of the socket file is created when it does not exist (each
 * missing folder with mode 0700: only this user may reach the socket through it), so that
 * `--listen ipc:///tmp/infeed/in-{rank}` works on a fresh machine.
 *
 * The bound endpoint is libzmq's ZMQ_LAST_ENDPOINT: the port the system chose for
 * `tcp://127.0.0.1:*`, the path it chose for an ipc endpoint whose path is `*`. It is what the
 * log line, status and the
 * ready file (--ready-file) report, so that a script can bind to `*` and then read which port it
 * got, instead of picking a free port first and racing another program for it.
 */
#ifndef IFD_HOST_ENDPOINT_H
#define IFD_HOST_ENDPOINT_H

#include <infeed/error.h>

#include <stddef.h>

#define IFD_ENDPOINT_MAX 1024

/* ipc://PATH: creates PATH's missing folders (mode 0700), and refuses a PATH that another
 * process serves (libzmq would unlink its socket and bind over it, silently); with private_dir,
 * PATH's folder must be this user's with no access for anyone else. Nothing for other
 * transports, for the path `*` (libzmq picks one) and for abstract sockets (ipc://@name). key
 * names the endpoint in the sentence ("listen: cannot create the folder '/run/x' of
 * 'ipc:///run/x/in': ..."). */
int ifd_endpoint_prepare(const char *key, const char *endpoint, int private_dir, ifd_error *err);

/* ifd_endpoint_prepare, zmq_bind, then the bound endpoint into bound[len]. The error names key,
 * the endpoint and libzmq's reason. */
int ifd_endpoint_bind(void *sock, const char *key, const char *endpoint, int private_dir,
                      char *bound, size_t len, ifd_error *err);

#endif
