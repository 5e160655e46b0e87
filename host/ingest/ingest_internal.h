/*
 * The ingest's parts, shared by the files of host/ingest/ that make it up:
 *
 *   protocol.c       the protocol's rules over byte spans, no socket (protocol.h)
 *   zmq_transport.c  ROUTER messages to the protocol, BATCH frames kept as tensors, parked HELLOs
 *   shm_transport.c  the shared-memory pools of local producers, BATCH_SHM slots as tensors
 *   hello.c          HELLO against the producer table, WELCOME
 *   batch_accept.c   a checked BATCH's steps made batches (either transport), ACKs, PREDICTIONs
 *   producers.c      the producer table and positions, liveness, END
 *   batch_fifo.c     the batch source the session reads (FIFOs under fifo.mu)
 *   replies.c        replies, and the outboxes that keep those carrying state until they are sent
 *   sockets.c        the sockets' options and endpoints
 *   zmq_wait.c       the I/O thread's wait on its sockets' ZMQ_FD (zmq_wait.h)
 *   io_loop.c        the I/O thread's loop, the end (BYE)
 *   lifecycle.c      create, start, finish, destroy, checkpoint positions
 *   control.c        the control socket (status, stop), rates, starvation warnings
 *
 * The PUB socket has its own thread (host/publisher.c), and the connection monitor too
 * (host/monitor.c). struct ifd_ingest is split by owner: each part says which thread owns it
 * and which lock guards what other threads touch; what it does not say is the I/O thread's.
 */
#ifndef IFD_HOST_INGEST_INTERNAL_H
#define IFD_HOST_INGEST_INTERNAL_H

#include "host/conns.h"
#include "host/endpoint.h"
#include "host/eval_set.h"
#include "host/ingest/ingest.h"
#include "host/ingest/protocol.h"
#include "host/ingest/zmq_wait.h"
#include "host/monitor.h"
#include "host/publisher.h"
#include "host/shm_file.h"

#include "core/keyfile.h"
#include "core/log.h"
#include "core/thread.h"
#include "core/wire.h"
#include "intake/inputs.h"

#include <jansson.h>
#include <stdint.h>

#define STOP_GRACE_NS 1000000000LL /* a stop waits this long for input before closing it */
#define RID_MAX 256
#define STARVE_WARN_NS 5000000000LL /* a starving infeed is logged after waiting this long */
/* A HELLO for a name whose old connection still answers waits this long for that connection to
 * be found closed (libzmq drops a closed connection's route a moment after the close) before
 * it is answered EBUSY; at most BUSY_HELLO_MAX wait at once (the others are answered now). */
#define BUSY_HELLO_NS 1000000000LL
#define BUSY_HELLO_MAX 8

typedef struct host_batch host_batch;
typedef struct outbox outbox; /* reply.c */

/* A producer's shared-memory pool (shm_transport.c): a host/shm_file.h file, mapped read-only here,
 * `slots` step batches of every tensor (tensor i's slot s at file.base + offsets[i] + s x
 * step_bytes[i]). busy[s] is the seq of the step in slot s while it is in flight, else -1 (written
 * by the I/O thread when a step is accepted, cleared by whichever thread releases it). */
typedef struct shm_pool {
    int refs;   /* atomic: its producer, and every message with steps in it */
    int *alive; /* atomic: its producer slot's count of pools alive, less one when it is freed */
    ifd_shm_file file; /* its fd -1 once the producer mapped it */
    int slots, ntensors;
    size_t offsets[IFD_MAX_INPUTS], step_bytes[IFD_MAX_INPUTS];
    int64_t *busy;
    uint8_t token[IFD_SHM_TOKEN_LEN];
    /* registered with the session's device (IFD_BATCH_PINNED batches), in g's list of those */
    ifd_ingest *g;
    ifd_session *session;
    struct shm_pool *next, *prev;
} shm_pool;

/* A producer's connection: its ROUTER routing id. */
typedef struct producer_rid {
    const uint8_t *rid;
    size_t len;
} producer_rid;

/* The connection of a producer that ended (END, or timed out) and whose slot went to another
 * producer: it may still wait for its BYE, which finish sends with the others. */
typedef struct ended_conn {
    struct ended_conn *next;
    uint8_t rid[RID_MAX];
    size_t rid_len;
    char name[IFD_PROTO_NAME_MAX + 1];
    int64_t acked_seq;
} ended_conn;

/* A parked HELLO (see BUSY_HELLO_NS): zmq_transport.c keeps its frame. */
typedef struct busy_hello busy_hello;

typedef struct producer {
    int used;
    char name[IFD_PROTO_NAME_MAX + 1];
    uint8_t rid[RID_MAX];
    size_t rid_len;
    int welcomed, ended;
    int replica;      /* per-core input: the replica its batches are for; -1 otherwise */
    int counted_end;  /* counted in ended_total (once per name) */
    int credit;       /* batches it may still send */
    int in_flight;    /* accepted, not acknowledged */
    int64_t last_seq; /* highest accepted */
    int64_t acked_seq;
    int64_t accepted, rejected;
    int pos;                 /* its entry in the position table */
    host_batch *head, *tail; /* accepted, in order, until acknowledged */
    producer_rid key;        /* its connection in the by_rid index (points at rid) */
    int64_t heard_ns;        /* its last message */
    int64_t probe_ns;        /* its last liveness probe (ingest_probe_alive) */
    int64_t probe_ivl_ns;    /* the least time from that probe to the next */
    int gone;                /* a send found its connection closed (EHOSTUNREACH) */
    int64_t gone_ns;         /* since when */
    int timed_out;           /* producer_timeout: counted as ended, its credit taken back */
    int fd;                  /* while bound: its connection's descriptor (-1: not known) */
    uint64_t conn_mark;      /* and its mark in the ingest's connections (host/conns.h) */
    shm_pool *pool;          /* its shared-memory pool (HELLO "shm"), else NULL */
    int pools;               /* atomic: its pools alive (pool, and old ones steps keep) */
    int eval;                /* HELLO "role": "eval": its batches go to the eval set */
    int eval_open;           /* joined the eval set and not yet ended there */
} producer;

/* A batch's PREDICTION (predict mode), made on the outfeed thread and sent by the I/O thread
 * just before the ACK that covers the batch. */
typedef struct prediction_msg {
    uint8_t hdr[IFD_PROTO_BATCH_HDR];
    char *json; /* the tensors' names, dtypes and per-row shapes */
    int ntensors;
    size_t len[IFD_MAX_PREDICTION_TENSORS];
    void *data[IFD_MAX_PREDICTION_TENSORS];
} prediction_msg;

/* A producer name's position: the highest seq handed to the infeed (so consumed by a completed
 * step once the loop that took it has ended), or the one a resumed checkpoint recorded; -1:
 * none. Kept for every name welcomed in this run or restored, never removed. */
typedef struct position {
    char name[IFD_PROTO_NAME_MAX + 1];
    int64_t seq;
    char key[IFD_KEY_Z85_LEN + 1]; /* CURVE: the key whose HELLO made it ("": none) */
} position;

/* A BATCH message's tensors, shared by the steps it carries (a message of k x batch rows is k
 * step batches, each a view of its rows): its transport makes it (zmq_frames: the received
 * frames; shm_frames: pool slots) and frees it (`free`) when the last step lets go. */
typedef struct host_frames host_frames;
struct host_frames {
    int refs;                        /* atomic: the step batches still holding the tensors (they let
                                        go on the I/O thread, when acknowledged, or at the end) */
    int unreleased;                  /* atomic: its steps the runtime has not released yet */
    char *data[IFD_MAX_INPUTS];      /* tensor i's first row: a frame, a copy or a pool slot */
    void *copies[IFD_MAX_INPUTS];    /* a frame libzmq left unaligned (or a pool's integer
                                        tensor), copied (ingest_copy_aligned) */
    size_t copy_len[IFD_MAX_INPUTS]; /* the bytes of each copy */
    int64_t *slot_busy;              /* BATCH_SHM: the pool's in-flight marks (cleared a step at a
                                        time by the release), else NULL */
    int pinned;                    /* its bytes are registered with the device (IFD_BATCH_PINNED) */
    void (*free)(host_frames *fr); /* the transport's: frees what it holds and fr */
};

struct host_batch {
    ifd_batch b;
    prediction_msg *pred; /* written before the release, read after it (done) */
    ifd_ingest *g;
    producer *p;
    int pos;         /* the producer's position entry */
    int done;        /* atomic: released by the runtime */
    host_frames *fr; /* its message's frames; NULL once let go (I/O thread: ingest_send_acks) */
    int slot;        /* BATCH_SHM: its slot in fr->pool, else -1 */
    char name[IFD_PROTO_NAME_MAX + 1];
    host_batch *pnext; /* the producer's list */
    host_batch *qnext; /* the source FIFO */
};

/* One FIFO of the batch source: the only one, or replica r's in per-core mode. */
typedef struct src_lane {
    host_batch *head, *tail;   /* under qmu */
    size_t len;                /* under qmu */
    host_batch *bhead, *btail; /* I/O thread: accepted during this receive burst */
} src_lane;

/* The sockets (the transport) and the I/O thread: created by ifd_ingest_create, used by the I/O
 * thread only (efd: any thread writes it to wake that thread). */
typedef struct ingest_sockets {
    void *zctx;
    void *router, *rep;
    ifd_publisher *pub; /* NULL when --publish is "" */
    /* the endpoints the router and rep are bound to ("": none; host/endpoint.h) */
    char bound_listen[IFD_ENDPOINT_MAX], bound_control[IFD_ENDPOINT_MAX];
    ifd_monitor *monitor;
    ifd_conns *conns, *ctl_conns; /* the ingest's and the control socket's connections */
    int msg_fd;                   /* the descriptor of the message handled (-1: not known) */
    int64_t hoarders_ns;          /* the last pass of ingest_close_hoarders */
    int efd;
    /* the I/O thread's wait on efd, the router and the rep (-1: none), their indexes in it */
    ingest_wait wait;
    int i_efd, i_router, i_rep;
    size_t max_frame;
    /* zmq_transport.c: freed BATCH frame holders kept for the next messages (I/O thread; at
     * most pr.credit of them) */
    void *frames_spare;
    int nframes_spare;
    ifd_thread thread;
    int started; /* main thread */
} ingest_sockets;

/* The batch source (batch_fifo.c): the I/O thread pushes, the infeed thread pops, under mu. One
 * FIFO, or one per replica in per-core mode (batches accepted during one receive burst are
 * pushed together, with one wake-up). The position table is updated as batches are popped, so
 * it shares the lock (and the checkpoint hook's thread reads it under it). */
typedef struct ingest_fifo {
    ifd_mutex mu;
    ifd_cond cv;
    int nlanes;
    src_lane *lanes;
    int closed, aborted;
    int src_waiting; /* atomic, written under mu: the infeed waits for a batch (src_pop) */
    position **pos;  /* the position table; entries never move */
    int npos, cap_pos;
    int max_pos;     /* names the table holds at most (4 x max_producers, at least 1024) */
    void *pos_index; /* tsearch tree of the entries by name */
} ingest_fifo;

/* The pools registered with the session's device (shm_transport.c): the I/O thread registers,
 * any thread unregisters one as it goes, under mu. */
typedef struct ingest_pools {
    ifd_mutex mu;
    shm_pool *pinned;
    int session_released; /* no more registrations */
} ingest_pools;

/* The end, asked by the main thread (ifd_ingest_finish) under mu; the I/O thread reads it. */
typedef struct ingest_end {
    ifd_mutex mu;
    int finishing;
    int fin_code;
    char fin_reason[32];
    char fin_message[512];
} ingest_end;

/* Tensor i's alignment copies freed and kept for the next ones (batch_accept.c, I/O thread): all
 * of `size` bytes, the size last copied for that tensor, linked through their first bytes. */
typedef struct copy_spares {
    void *head;
    int n;
    size_t size;
} copy_spares;

/* Counters and rates (I/O thread; control's status reads them there). */
typedef struct ingest_stats {
    int64_t accepted, rejected, copied_bytes;
    double steps_per_sec, examples_per_sec;
    int64_t first_step; /* the global step when the run started (status: last_step) */
    int64_t rate_t0, rate_step0;
    int64_t starve_warned_ns; /* the last starvation warning about the current wait */
} ingest_stats;

/* The replies waiting for their connections' queues (replies.c): a list, and a tree by routing
 * id (I/O thread). */
typedef struct ingest_outboxes {
    outbox *boxes;
    void *box_index;
    int nboxes;
} ingest_outboxes;

struct ifd_ingest {
    const ifd_daemon_config *cfg;
    int *signals; /* atomic */
    ifd_session *session;
    ingest_proto pr; /* written by ifd_ingest_create and _start, read-only after */
    ingest_sockets sock;
    ingest_fifo fifo;
    ingest_pools pools;
    ingest_end end;
    ingest_stats stats;
    ingest_outboxes out;
    int acks_pending; /* atomic: a release asked the I/O thread for ACKs */
    int64_t queued;   /* atomic: step batches pushed to the FIFO and not yet released */
    int64_t acks_due; /* atomic: steps released since the last ACK pass began */
    int io_waiting;   /* atomic: the I/O thread is about to poll, or polling (ingest_io_wait_ms) */
    /* acknowledged batches kept for the next ones (I/O thread; at most pr.credit of them): a
     * batch is allocated and freed on the I/O thread, not once a step (ingest_host_batch_take) */
    host_batch *spare;
    int nspare;
    ifd_batch whole; /* I/O thread: a message checked as one batch (ingest_batch_accept) */
    copy_spares copy_spare[IFD_MAX_INPUTS];

    /* The protocol's state: the producer table (I/O thread) */
    producer *producers;
    int64_t next_anon;
    int ever_welcomed;
    int ended_total; /* producers (names) that sent END at least once */
    /* for the watchdog's sentence (another thread): welcomed and not ended, and ended_total */
    int watch_connected, watch_ended; /* atomic */
    int input_closed;
    int handled_signals;
    int64_t stop_ns; /* when a stop was asked, 0: none */
    void *by_rid;    /* tsearch tree of the producers by connection */
    /* connections of producers that ended and whose slots went to others: their BYE is due */
    ended_conn *ended_conns;
    int nended_conns;
    /* log lines peers can cause, each rate-limited */
    ifd_log_limit lim_hello, lim_reject, lim_gone;
    int64_t liveness_ns; /* the last pass of ingest_check_liveness */
    busy_hello *busy;    /* BUSY_HELLO_MAX of them (zmq_transport.c), made at the first park */
    int nbusy;
    int64_t hello_since_ns; /* while a parked HELLO is handled again: since when it waits */
    ifd_eval_set *eval;     /* --eval-every: the eval producers' batches (else NULL) */
};

/* io_loop.c: while the heap is above its bound, the connections without a producer are closed
 * (they may hold frames of messages they never finish, which libzmq keeps without limit). */
void ingest_close_hoarders(ifd_ingest *g);
/* io_loop.c: the I/O thread (arg: the ingest). */
void *ingest_io_main(void *arg);

/* zmq_transport.c: a burst of at most RECV_BURST messages read and handled (zmq_transport.h
 * has the rest): 1 when it ended on EAGAIN (the ROUTER is read empty), 0 when cut short. */
int ingest_recv_burst(ifd_ingest *g);
/* zmq_transport.c: its spare frame holders freed (destroy, once no batch holds frames). */
void ingest_zmq_spares_free(ifd_ingest *g);
/* lifecycle.c: the program the schema comes from (ifd_ingest_start sets it; the fuzz harness
 * too). */
void ingest_attach_program(ifd_ingest *g, const ifd_program *program);
/* sockets.c: the ROUTER (its options, its connections, its endpoint) and the control REP, and
 * the I/O thread's wait on them and on efd (made before); the error names the option or
 * endpoint that failed. */
int ingest_sockets_open(ifd_ingest *g, ifd_error *err);

/* replies.c: replies. Those that carry state (ACK, CREDIT, WELCOME, BYE, PREDICTION, an ERROR
 * returning credit) are kept (keep = 1) until the connection's queue takes them; the others are
 * dropped when it is full. */
#define NO_SEQ INT64_MIN /* an ERROR about no batch: its seq is null */
void ingest_send_json(ifd_ingest *g, const producer_rid *to, int type, json_t *j, int keep);
/* Printable ASCII kept, every other byte written as \xHH, always terminated. */
void ingest_ascii_escape(const char *in, char *out, size_t len);
/* ERROR: code, seq (NO_SEQ: null), credit returned, and the sentence (kept when credit > 0). */
void ingest_send_error(ifd_ingest *g, const producer_rid *to, int code, int64_t seq, int credit,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* ACK (up to seq, n batches), CREDIT (n), PREDICTION (m is the reply's now): kept. */
void ingest_reply_ack(ifd_ingest *g, const producer_rid *to, int64_t seq, uint32_t n);
void ingest_reply_credit(ifd_ingest *g, const producer_rid *to, uint32_t n);
void ingest_reply_prediction(ifd_ingest *g, const producer_rid *to, prediction_msg *m);
/* A CREDIT of 0 (a liveness probe, never kept): 0 sent, EAGAIN its queue is full, another errno
 * when it was not sent (EHOSTUNREACH: the connection is gone, and marked so). */
int ingest_send_probe(ifd_ingest *g, const producer_rid *to);
/* The outboxes: sends what their queues take now (every pass of the I/O thread); how many
 * connections have replies waiting; whether `to` has; `to`'s dropped (its connection is gone);
 * all freed (destroy). */
void ingest_replies_flush(ifd_ingest *g);
int ingest_replies_waiting(const ifd_ingest *g);
int ingest_replies_held(ifd_ingest *g, const producer_rid *to);
void ingest_replies_drop(ifd_ingest *g, const producer_rid *to);
void ingest_replies_free(ifd_ingest *g);

/* producers.c */
producer_rid ingest_rid_of(const producer *p);
int ingest_rid_cmp(const void *a, const void *b); /* producer_rid, for tsearch */
producer *ingest_find_by_rid(ifd_ingest *g, const producer_rid *r);
producer *ingest_find_by_name(ifd_ingest *g, const char *name);
/* name's entry in the position table, made when missing (by key: a CURVE key, or NULL); -1
 * no memory, -2 the table is full. Whether name has one; how many names key holds (with a
 * position or a producer). */
int ingest_position_index(ifd_ingest *g, const char *name, const char *key, int64_t *seq);
int ingest_position_known(ifd_ingest *g, const char *name);
int ingest_key_names(ifd_ingest *g, const char *key);
producer *ingest_new_slot(ifd_ingest *g);
/* The slot's connection: forget it, bind it to r (IFD_ENOMEM when the index cannot grow), or
 * forget everything (its pool let go); probe_alive: whether its connection still exists. */
void ingest_slot_unbind(ifd_ingest *g, producer *p);
int ingest_slot_bind(ifd_ingest *g, producer *p, const producer_rid *r);
void ingest_slot_reset(ifd_ingest *g, producer *p);
int ingest_probe_alive(ifd_ingest *g, producer *p);

void ingest_handle_end(ifd_ingest *g, const producer_rid *from);
void ingest_count_producers(ifd_ingest *g);
void ingest_check_input_end(ifd_ingest *g);
void ingest_watchdog_context(void *arg, char *buf, size_t len);
/* A reply to `to` found its connection closed: its producer (if any) is marked gone, its
 * outbox dropped. */
void ingest_note_gone(ifd_ingest *g, const producer_rid *to);
/* finish: a BYE to every connection of a producer that ended and gave its slot away; freed. */
void ingest_bye_ended_conns(ifd_ingest *g, json_t *bye);
void ingest_ended_conns_free(ifd_ingest *g);
/* Once in a while: producers gone or silent with credit for producer_timeout are timed out. */
void ingest_check_liveness(ifd_ingest *g);
/* Frees the position table and the indexes (destroy). */
void ingest_producers_free(ifd_ingest *g);

/* hello.c: a HELLO from its transport: the JSON, the connection's CURVE key and address, and a
 * way to park it (handled again later: a busy name, no free slot; 1 if parked). */
typedef struct ingest_hello_msg {
    ingest_span json;
    const char *user_id;      /* CURVE: the connection's public key (NULL without CURVE) */
    const char *peer_address; /* the peer's address (NULL: unknown) */
    int (*park)(struct ingest_hello_msg *m);
} ingest_hello_msg;
void ingest_handle_hello(ifd_ingest *g, const producer_rid *from, ingest_hello_msg *m);
/* zmq_transport.c: parked HELLOs (ingest_drop_busy_hello(g, NULL) frees them all) */
/* Parked HELLOs whose time has come are handled again (welcomed, parked again, or EBUSY); a new
 * message from a parked connection drops its parked HELLO (drop_busy_hello), and destroy frees
 * them all (from = NULL). */
void ingest_retry_busy_hellos(ifd_ingest *g);
void ingest_drop_busy_hello(ifd_ingest *g, const producer_rid *from);

/* shm_transport.c: a pool for p (the WELCOME's "shm" object, or NULL with a sentence in why when
 * the daemon makes none: also when p's slot has SHM_POOLS_MAX pools alive, its old ones kept by
 * steps in flight); a pool is let go by its producer (drop) and by every message holding steps
 * in it (unref), and freed with the last. */
#define SHM_POOLS_MAX 2 /* a producer slot's pools alive at once (S in docs/protocol.md) */
shm_pool *ingest_shm_create(ifd_ingest *g, producer *p, const ingest_hello_msg *hello, char *why,
                            size_t wlen);
/* Whether a HELLO asking p's slot for a pool would be refused now for SHM_POOLS_MAX, its pool
 * dropped (p's old pools are still held by steps in flight): it waits for them. */
int ingest_shm_must_wait(ifd_ingest *g, const producer *p, const ingest_hello_msg *hello);
json_t *ingest_shm_json(const shm_pool *pool);
void ingest_shm_ref(shm_pool *pool);
void ingest_shm_unref(shm_pool *pool);
void ingest_shm_drop(ifd_ingest *g, producer *p);
/* The producer has mapped its pool (its first BATCH_SHM): the daemon's descriptor is closed. */
void ingest_shm_mapped(shm_pool *pool);
/* Every pool still registered with the session's device is unregistered (the session is about
 * to go); pools made after it are not registered. */
void ingest_shm_release_session(ifd_ingest *g);
/* BATCH_SHM: its header frame and the count of frames after it. */
void ingest_shm_handle_batch(ifd_ingest *g, const producer_rid *from, ingest_span hdr, int nframes);

/* batch_fifo.c */
/* I/O thread (or the end): fr's copies (back to g's spares) and fr. */
void ingest_host_frames_free(ifd_ingest *g, host_frames *fr);
void ingest_host_batch_free_frames(host_batch *hb);
void ingest_prediction_free(prediction_msg *m);
void ingest_host_batch_free(host_batch *hb);
/* I/O thread: a zeroed batch (a spare one, else allocated; NULL: out of memory); an acknowledged
 * one kept as a spare (or freed beyond pr.credit of them); the spares freed (destroy). */
host_batch *ingest_host_batch_take(ifd_ingest *g);
void ingest_host_batch_recycle(ifd_ingest *g, host_batch *hb);
void ingest_host_batch_spares_free(ifd_ingest *g);
void ingest_host_batch_release(ifd_batch *b, void *arg);
/* The ACK wake-up rule (ingest_host_batch_release): the I/O thread is asked for ACKs (and woken
 * if it waits) when a message's last step is released and the input waits on them: the FIFO and
 * the rings are empty (queued reaches 0), the infeed waits for a batch (src_waiting), or a
 * quarter of the credit (ingest_ack_wake_steps) was released since the last ACK pass. While
 * batches wait in the FIFO, the producers are ahead: their ACKs go out with the I/O thread's
 * next pass or in bursts, one wake-up for many messages instead of one for each. */
int64_t ingest_ack_wake_steps(const ifd_ingest *g);
/* I/O thread, around its poll: the timeout to poll with (0 when a release asked for ACKs while
 * the thread was busy: such a release wakes nobody), and the end of the wait. */
int ingest_io_wait_ms(ifd_ingest *g, int ms);
void ingest_io_awake(ifd_ingest *g);
void ingest_fifo_push(ifd_ingest *g, host_batch *hb);
void ingest_fifo_flush(ifd_ingest *g);
void ingest_close_input(ifd_ingest *g, const char *why);

/* batch_accept.c: a BATCH or BATCH_SHM, whatever transport brought it. begin: the producer's
 * checks (welcomed, open, credit), its k credits taken (NULL: answered). reject: an ERROR that
 * gives them back. sequence: duplicates answered (-1) or the steps taken before (*skip; 0).
 * accept: fr (made by the transport, take_rc its result) checked by the program and split into
 * its steps (first_slot: BATCH_SHM's first slot, else -1); fr is taken, whatever happens. */
producer *ingest_batch_begin(ifd_ingest *g, const producer_rid *from, const ifd_proto_batch *bh,
                             const char *what, int *k);
void ingest_batch_reject(ifd_ingest *g, producer *p, const producer_rid *from, int k, int code,
                         int64_t seq, const char *msg);
int ingest_batch_sequence(ifd_ingest *g, producer *p, const producer_rid *from,
                          const ifd_proto_batch *bh, int k, int *skip);
void ingest_batch_accept(ifd_ingest *g, producer *p, const producer_rid *from,
                         const ifd_proto_batch *bh, int k, int skip, host_frames *fr, int take_rc,
                         int first_slot);
/* I/O thread: a copy of tensor i's len bytes aligned for any dtype (a frame libzmq left
 * unaligned, a pool's integer tensor), counted in status's copied bytes; NULL when out of memory.
 * Freed with ingest_copy_free, which keeps it for the next copy of tensor i of the same size
 * instead of a malloc and a free a message (at 4 KiB about half the frames arrive unaligned). A
 * new size drops the spares of the old one, and a buffer is allocated only when no spare is left,
 * so the copies and their spares never hold more than the most copies in use at once (within the
 * memory bound's "each at most once copied"). _spares_free: the end. */
void *ingest_copy_aligned(ifd_ingest *g, int i, const void *src, size_t len);
void ingest_copy_free(ifd_ingest *g, int i, void *copy, size_t len);
void ingest_copy_spares_free(ifd_ingest *g);
void ingest_send_acks(ifd_ingest *g);

/* control.c */
void ingest_handle_control(ifd_ingest *g);
/* A control request's command: INGEST_CONTROL_STATUS or _STOP, or _BAD with why filled. */
enum { INGEST_CONTROL_BAD, INGEST_CONTROL_STATUS, INGEST_CONTROL_STOP };
int ingest_control_parse(const void *data, size_t len, char *why, size_t wlen);
void ingest_request_stop(ifd_ingest *g, const char *why);
void ingest_sample_rates(ifd_ingest *g);
void ingest_watch_infeed(ifd_ingest *g);

#endif
