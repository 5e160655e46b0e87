/*
 * The C client of infeedd: a producer that streams batches to the daemon's ingest ROUTER and a
 * subscriber to its summaries, speaking the wire protocol of docs/protocol.md (version 1).
 *
 * Library: infeed-client (ifd::infeed-client), which needs libzmq and jansson but not the
 * runtime library. It reuses the error codes of infeed/error.h and the input spec and dtypes of
 * infeed/program.h and infeed/tensor.h.
 *
 * A producer is used by one thread at a time: every call runs on the caller's thread and owns
 * the one DEALER socket. Nothing runs in the background except libzmq's own I/O thread, which is
 * where zero-copy free callbacks are called from.
 *
 * Flow control: after WELCOME the producer may have `credit` batches in flight (sent, neither
 * acknowledged nor rejected). A send with no credit left waits for ACK, CREDIT or ERROR replies,
 * at most timeout_ms. Timeouts: a negative timeout_ms waits without a bound; 0 does not wait.
 *
 * Errors: every function returns IFD_OK or an error code and fills err (may be NULL) with a
 * sentence. An ERROR reply from the daemon is reported once, by the first call that sees it
 * (see ifd_producer_send): its code is the ERROR's code ("ESHAPE" -> IFD_ESHAPE) and err's
 * sentence is the daemon's message.
 */
#ifndef IFD_CLIENT_H
#define IFD_CLIENT_H

#include <infeed/error.h>
#include <infeed/program.h>
#include <infeed/tensor.h>
#include <infeed/wire_version.h> /* IFD_PROTOCOL_VERSION */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CURVE -------------------------------------------------------------------------------- */

/*
 * Keys for a daemon started with --curve-secret-key (docs/protocol.md, "Security"): the socket
 * becomes a CURVE client that knows the daemon's public key and has its own key pair, whose public
 * key the daemon lists (producers: --authorized-keys; subscribers: --authorized-keys or
 * --admin-keys). Keys are 40-character Z85 strings; key files are those of `infeedd keygen
 * PREFIX` (PREFIX.pub: a public key; PREFIX.key: a key pair, to be kept secret).
 *
 * Give exactly one of server_key and server_key_file, and exactly one of key_file and the pair
 * public_key + secret_key; leave every field NULL (or pass NULL options) for no CURVE. Anything
 * else is IFD_EINVAL naming the field; IFD_ENOTSUP when libzmq has no CURVE. The strings are
 * read during the create call only.
 *
 * A daemon that refuses the key sends nothing: hello then ends with IFD_ETIMEDOUT (after the
 * connect timeout, naming the refused key), and a subscriber receives nothing. A HELLO with a name
 * bound to another key is answered IFD_EPERM. The connect timeout's sentence says why as far as
 * the client can tell: the daemon refused this client's CURVE key; a client without keys failed
 * the handshake (the daemon may require CURVE); or nothing answered ("is infeedd running with
 * --listen ENDPOINT?", and for a client with keys "or does it refuse this client's key
 * (CURVE)?").
 */
typedef struct ifd_client_options {
    const char *server_key;      /* the daemon's public key, Z85 */
    const char *server_key_file; /* or the daemon's PREFIX.pub */
    const char *public_key;      /* this client's key pair, Z85 */
    const char *secret_key;
    const char *key_file; /* or this client's PREFIX.key */
    /* How long the first wait (ifd_producer_hello, ifd_subscriber_recv) waits for the daemon
     * to answer the connection at all, counted from the create call: 0 takes the default,
     * IFD_CONNECT_TIMEOUT_MS; a negative value waits without a bound. When nothing answers at
     * the endpoint (no daemon, another port, a refused CURVE key) that call returns
     * IFD_ETIMEDOUT with a sentence saying so, instead of waiting out its own timeout. A
     * producer connected to itself (TCP can give a client the port it connects to, on a port of
     * the ephemeral range where nothing listens) gets its own HELLO back: it reconnects, sends
     * HELLO again, and only a daemon's message ends this wait from then on. Create without
     * options: the default. */
    int connect_timeout_ms;
    /* Producers: the shared-memory transport (ifd_producer_set_shm); 0 is IFD_SHM_AUTO.
     * Subscribers ignore it. */
    int shm;
} ifd_client_options;

#define IFD_CONNECT_TIMEOUT_MS 10000

/* ---- producer ----------------------------------------------------------------------------- */

typedef struct ifd_producer ifd_producer;

/* The bytes of one tensor of a batch: rows x (per-row elements) x dtype size. */
typedef struct ifd_frame {
    const void *data;
    size_t size;
} ifd_frame;

/* Releases a buffer handed over by ifd_producer_send_zc. Called exactly once per frame, from an
 * arbitrary thread (a libzmq I/O thread, or the caller's thread): it must be thread-safe. Same
 * signature as libzmq's zmq_free_fn. */
typedef void (*ifd_free_fn)(void *data, void *hint);

/* Creates a producer whose DEALER socket connects to endpoint ("tcp://127.0.0.1:5555",
 * "ipc:///tmp/infeed.sock"). Connecting is asynchronous: nothing is sent before hello. name is
 * the producer's name for the daemon (at most 63 bytes; NULL lets the daemon make one up). */
int ifd_producer_create(ifd_producer **out, const char *endpoint, const char *name, ifd_error *err);
/* As ifd_producer_create, with CURVE keys (opts NULL: none). */
int ifd_producer_create_opts(ifd_producer **out, const char *endpoint, const char *name,
                             const ifd_client_options *opts, ifd_error *err);
/* Closes the socket without waiting for unsent messages (batches not yet acknowledged may be
 * lost: call ifd_producer_end first) and frees the producer. Every zero-copy buffer has been
 * released when it returns. NULL is a no-op. */
void ifd_producer_destroy(ifd_producer *p);

/* Predict mode: fn is called for each PREDICTION the daemon sends (one per batch, in the batch
 * order, before the ACK that covers the batch), from within whichever producer call receives it
 * (send, wait, end, bye): the batch's seq, its rows (padding removed) and its tensors (views with
 * `rows` rows, valid during the call only; docs/protocol.md lists them per program). NULL stops
 * the calls. ifd_producer_predictions counts the PREDICTIONs received. A PREDICTION whose
 * frames do not hold what its description says (byte counts, or a size that overflows) never
 * reaches fn: the next call returns IFD_EPROTO naming the tensor. */
typedef void (*ifd_prediction_fn)(void *arg, int64_t seq, int64_t rows, int ntensors,
                                  const char *const *names, const ifd_tensor *tensors);
void ifd_producer_on_prediction(ifd_producer *p, ifd_prediction_fn fn, void *arg);
int64_t ifd_producer_predictions(const ifd_producer *p);

/* per-core input mode: the replica (0 to replicas - 1) this producer's batches are for, sent in
 * every later HELLO; -1 (the default) sends no replica, as the other input modes (and a per-core
 * eval producer, whose batches join the one eval set) require. The daemon checks the value
 * (IFD_EINVAL from hello). IFD_EINVAL for a value below -1. */
int ifd_producer_set_replica(ifd_producer *p, int replica, ifd_error *err);
/* "train" (the default) or "eval", sent in every later HELLO: an eval producer sends the eval
 * set of evaluation during training (infeedd --eval-every N): its batches are kept in the
 * daemon's memory and acknowledged at once, never trained on, and its END completes the eval
 * set (docs/protocol.md, "Eval producers"). */
int ifd_producer_set_role(ifd_producer *p, const char *role, ifd_error *err);

/*
 * Shared memory (docs/protocol.md, "Shared memory"): a producer on the daemon's host can have the
 * daemon make a pool of memory both map; batches are then written there and only a 32-byte
 * BATCH_SHM descriptor crosses the socket. The mode is sent with every later HELLO:
 *
 * - IFD_SHM_AUTO (0, the default): ask when the endpoint is local (ipc://, or tcp:// to
 *   127.0.0.0/8, ::1 or localhost). When the daemon refuses (shm_refused), or its pool cannot be
 *   mapped (another user, another PID namespace, a wrong size, magic or token; hello then says
 *   HELLO again without shm, so that the daemon drops it), or the daemon does not know the shm
 *   key, the producer goes on with BATCH; ifd_producer_shm_refused says why.
 * - IFD_SHM_ON: ask whatever the endpoint; hello fails when no pool is mapped, with the daemon's
 *   shm_refused sentence (IFD_ENOTSUP) or the mapping's error. The daemon did welcome the
 *   producer: call hello again (e.g. after setting IFD_SHM_OFF) or destroy it.
 * - IFD_SHM_OFF: never ask.
 *
 * With a pool, ifd_producer_send copies the tensors into free slots of the pool (one memcpy per
 * tensor, no syscall for the bytes), send_zc does the same and releases the caller's buffers
 * before it returns, and ifd_producer_buffer hands out the slots themselves. A batch the pool
 * cannot hold as the daemon would take it (rows that are not k x batch_size in train and eval,
 * or above batch_size in predict; a frame whose size is not rows x the tensor's row bytes) goes
 * as BATCH, so the daemon's ERROR names what is wrong with it, as without a pool. A new HELLO and
 * destroy unmap the pool (pointers from ifd_producer_buffer are then invalid).
 */
enum { IFD_SHM_AUTO = 0, IFD_SHM_ON = 1, IFD_SHM_OFF = 2 };
/* The mode for later HELLOs (also ifd_client_options.shm). IFD_EINVAL for another value. */
int ifd_producer_set_shm(ifd_producer *p, int mode, ifd_error *err);
/* The transport the producer's batches take: "shm" while a pool is mapped, else the endpoint's
 * ("tcp", "ipc", ...). */
const char *ifd_producer_transport(const ifd_producer *p);
/* After a HELLO that asked for a pool and has none: why (the daemon's shm_refused, the mapping's
 * error, or the daemon not knowing the key); NULL otherwise. Valid until the next hello. */
const char *ifd_producer_shm_refused(const ifd_producer *p);

/* Sends HELLO with the schema (the tensors of every batch, in frame order) and first_seq (>= 0)
 * and waits for the answer. IFD_OK after WELCOME; the daemon's ERROR code and message after an
 * ERROR (a schema that does not match the program: IFD_ESHAPE or IFD_EDTYPE); IFD_ETIMEDOUT when
 * no answer came in timeout_ms. May be called again (after an ERROR); the last WELCOME counts
 * and resets the flow-control state. */
int ifd_producer_hello(ifd_producer *p, const ifd_input_spec *schema, int n, int64_t first_seq,
                       int timeout_ms, ifd_error *err);

/* The last WELCOME's fields (0 / NULL before one). */
int64_t ifd_producer_batch_size(const ifd_producer *p); /* rows every batch must have */
int64_t ifd_producer_credit(const ifd_producer *p);     /* the in-flight window granted */
int ifd_producer_replicas(const ifd_producer *p);
const char *ifd_producer_mode(const ifd_producer *p);    /* "train", ... */
const char *ifd_producer_welcome(const ifd_producer *p); /* the whole WELCOME JSON */

/* Sequence numbers: the first batch gets the WELCOME's next_seq, each later one the next. A
 * daemon that resumed from a checkpoint answers a name it knows with the seq after the last one
 * its checkpoint includes: right after ifd_producer_hello, ifd_producer_next_seq is where a
 * deterministic stream replays from (docs/checkpoint.md). The counters below are as of the
 * replies read so far: a call that waits (wait, end) reads the replies waiting before it does
 * anything else, and so does a send (send, buffer, commit) that lacks credit or last read them 1
 * ms ago or more (an ERROR or BYE the daemon sent shows on a send within about 1 ms of arriving,
 * not later); a send reads none after it has sent. */
int64_t ifd_producer_next_seq(const ifd_producer *p);  /* the seq the next send will use */
int64_t ifd_producer_acked_seq(const ifd_producer *p); /* highest ACKed seq; -1 when none */
int64_t ifd_producer_in_flight(const ifd_producer *p); /* sent, neither ACKed nor rejected */
int64_t ifd_producer_available(const ifd_producer *p); /* batches sendable now without waiting */
int64_t ifd_producer_sent(const ifd_producer *p);      /* batches sent since the WELCOME */
int64_t ifd_producer_acked(const ifd_producer *p);     /* batches ACKed since the WELCOME */
int64_t ifd_producer_rejected(const ifd_producer *p);  /* batches rejected by an ERROR */

/*
 * Sends one batch of `rows` rows: frames[i] is the i-th schema tensor. libzmq copies the bytes
 * before this returns. Waits at most timeout_ms for credit (IFD_ETIMEDOUT when none came).
 *
 * Train and eval: rows may be k x the WELCOME's batch_size, k up to its max_steps_per_message
 * (infeedd --max-steps-per-message): k steps in one message, costing k credits (a send waits
 * for k), taking the seqs next_seq .. next_seq + k - 1, acknowledged step by step; in_flight,
 * available, sent and acked count steps.
 *
 * IFD_OK means the batch was sent with seq ifd_producer_next_seq() had before the call. Any
 * other return means it was not sent: an ERROR reply to an earlier message received before this
 * batch could go (returned once, with the daemon's code and message: the caller may send again),
 * IFD_ECLOSED after BYE or END, IFD_EINVAL for bad arguments, IFD_ETIMEDOUT.
 */
int ifd_producer_send(ifd_producer *p, int64_t rows, const ifd_frame *frames, int n, int timeout_ms,
                      ifd_error *err);
/* As ifd_producer_send with the bytes of n tensor views, each of shape [rows, per-row...]
 * (rows is tensors[0]'s first dim; every tensor must have rank >= 1 and the same first dim). */
int ifd_producer_send_tensors(ifd_producer *p, const ifd_tensor *tensors, int n, int timeout_ms,
                              ifd_error *err);
/* Zero-copy: as ifd_producer_send, but libzmq sends the frames' bytes where they are (with a
 * shared-memory pool: copies them into it, and frees them before returning), and
 * free_fn(data, hint) is called exactly once for every frame when libzmq no longer needs it,
 * whatever this returns (on an error return it may already have been called). The caller must
 * not write to a buffer until then. free_fn NULL: the caller keeps ownership and must keep every
 * buffer unchanged until ifd_producer_destroy returns. */
int ifd_producer_send_zc(ifd_producer *p, int64_t rows, const ifd_frame *frames, int n,
                         ifd_free_fn free_fn, void *hint, int timeout_ms, ifd_error *err);

/*
 * Writing a batch in place. ifd_producer_buffer points data[i] (n: the schema's tensor count) at
 * room for `steps` x batch_size rows of tensor i, contiguous and row-major (train and eval: steps
 * up to WELCOME's max_steps_per_message; predict: 1); ifd_producer_commit(rows) then sends the
 * first `rows` of them (train and eval: a multiple of batch_size; predict: 1 to batch_size;
 * 0: nothing is sent and the room is given back) as ifd_producer_send would.
 *
 * With a pool the room is the pool's slots: buffer waits (at most timeout_ms) for the credit and
 * the free slots of `steps` steps and reserves them, and commit sends BATCH_SHM: no copy at all.
 * Without one it is memory of the producer's, which commit sends as BATCH (libzmq copies it), so
 * the same code runs on every transport. Until commit returns IFD_OK the buffer stays pending
 * (another buffer call is IFD_EINVAL; a refused commit may be retried); after it the room must
 * not be written until the next buffer call. One pending buffer at a time; send may be called
 * meanwhile.
 */
int ifd_producer_buffer(ifd_producer *p, int64_t steps, void **data, int n, int timeout_ms,
                        ifd_error *err);
int ifd_producer_commit(ifd_producer *p, int64_t rows, int timeout_ms, ifd_error *err);

/* Waits until every batch sent has been ACKed or rejected (IFD_OK), at most timeout_ms.
 * Returns an ERROR reply as it arrives (call again to go on waiting); IFD_ECLOSED when BYE came
 * first (the BYE is kept: ifd_producer_bye). */
int ifd_producer_wait(ifd_producer *p, int timeout_ms, ifd_error *err);

/* Sends END (the producer's stream ends: later sends return IFD_ECLOSED) and waits at most
 * timeout_ms until every batch is ACKed or rejected, or BYE arrives. IFD_OK then, unless the
 * BYE's status is not "ok" (IFD_ESTOPPED and its message). An ERROR reply pending before the
 * call is returned without sending END (call again); one arriving while waiting is returned at
 * once, END having been sent (call again to go on waiting). */
int ifd_producer_end(ifd_producer *p, int timeout_ms, ifd_error *err);

/* Waits at most timeout_ms for BYE (the daemon sends it to every producer when the run ends)
 * and points *json at its JSON text (owned by the producer, valid until destroy). IFD_OK, or
 * IFD_ETIMEDOUT. json may be NULL. */
int ifd_producer_bye(ifd_producer *p, int timeout_ms, const char **json, ifd_error *err);

/* ---- subscriber --------------------------------------------------------------------------- */

typedef struct ifd_subscriber ifd_subscriber;

/* A SUB socket connected to the daemon's PUB (--publish), subscribed to every summary. Like
 * any ZeroMQ subscriber it misses what is published before its connection is up. */
int ifd_subscriber_create(ifd_subscriber **out, const char *endpoint, ifd_error *err);
/* As ifd_subscriber_create, with CURVE keys (opts NULL: none). */
int ifd_subscriber_create_opts(ifd_subscriber **out, const char *endpoint,
                               const ifd_client_options *opts, ifd_error *err);
void ifd_subscriber_destroy(ifd_subscriber *s);
/* Receives one summary: *json is a NUL-terminated malloc'd copy the caller frees. IFD_OK, or
 * IFD_ETIMEDOUT when none came in timeout_ms. */
int ifd_subscriber_recv(ifd_subscriber *s, char **json, int timeout_ms, ifd_error *err);

#ifdef __cplusplus
}
#endif

#endif
