/*
 * The ingest's parts, shared by the files of host/ that make it up (one I/O thread runs them all):
 *
 *   ingest.c     sockets, create/destroy, the I/O thread's loop, the end (BYE)
 *   reply.c      replies, and the outboxes that keep those carrying state until they are sent
 *   producers.c  the producer table and positions, liveness, END
 *   hello.c      HELLO (schema check, WELCOME) and the HELLOs parked for a busy name
 *   shm.c        the shared-memory pools of local producers (docs/protocol.md, "Shared memory")
 *   batch.c      BATCH and BATCH_SHM validation and acceptance, ACKs and PREDICTIONs
 *   source.c     the batch source the session reads (FIFOs under qmu)
 *   control.c    the control socket (status, stop), rates, starvation warnings
 *
 * The PUB socket has its own thread (host/publisher.c), and the connection monitor too
 * (host/monitor.c).
 *
 * Everything here runs on the I/O thread unless its comment says otherwise.
 */
#ifndef IFD_HOST_INGEST_INTERNAL_H
#define IFD_HOST_INGEST_INTERNAL_H

#include "host/conns.h"
#include "host/endpoint.h"
#include "host/ingest/ingest.h"
#include "host/monitor.h"
#include "host/publisher.h"

#include "core/keyfile.h"
#include "core/log.h"
#include "core/thread.h"
#include "core/wire.h"
#include "infeed/infeed_internal.h"

#include <stdint.h>
#include <zmq.h>
#include <jansson.h>

#define MAX_PARTS (IFD_MAX_INPUTS + 2) /* routing id, header, tensors */
#define RECV_BURST 256                 /* messages handled before polling the others again */
#define STOP_GRACE_NS 1000000000LL     /* a stop waits this long for input before closing it */
#define RID_MAX 256
#define STARVE_WARN_NS 5000000000LL /* a starving infeed is logged after waiting this long */
/* A HELLO for a name whose old connection still answers waits this long for that connection to
 * be found closed (libzmq drops a closed connection's route a moment after the close) before
 * it is answered EBUSY; at most BUSY_HELLO_MAX wait at once (the others are answered now). */
#define BUSY_HELLO_NS 1000000000LL
#define BUSY_HELLO_MAX 8

typedef struct host_batch host_batch;
typedef struct outbox outbox; /* reply.c */

/* A producer's shared-memory pool (shm.c): a sealed memfd, mapped read-only here, `slots` step
 * batches of every tensor (tensor i's slot s at base + offsets[i] + s x step_bytes[i]). busy[s]
 * is the seq of the step in slot s while it is in flight, else -1 (written by the I/O thread
 * when a step is accepted, cleared by whichever thread releases it). */
typedef struct shm_pool {
    int refs;   /* atomic: its producer, and every message with steps in it */
    int *alive; /* atomic: its producer slot's count of pools alive, less one when it is freed */
    int fd;     /* -1 once the producer mapped it */
    void *base;
    size_t size;
    int slots, ntensors;
    size_t offsets[IFD_MAX_INPUTS], step_bytes[IFD_MAX_INPUTS];
    int64_t *busy;
    uint8_t token[IFD_SHM_TOKEN_LEN];
    char path[64];
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

/* A parked HELLO (see BUSY_HELLO_NS): its connection, its JSON frame, since when it waits. */
typedef struct busy_hello {
    int used;
    uint8_t rid[RID_MAX];
    size_t rid_len;
    zmq_msg_t body;
    int64_t since_ns, next_ns;
} busy_hello;

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

/* A BATCH message's tensor frames, shared by the steps it carries (a message of k x batch
 * rows is k step batches, each a view of its rows): freed when the last of them lets go. */
typedef struct host_frames {
    int refs; /* atomic: the step batches still holding the frames */
    int nframes;
    zmq_msg_t frames[IFD_MAX_INPUTS];
    void *copies[IFD_MAX_INPUTS]; /* a frame libzmq left unaligned (or a pool's integer
                                     tensor), copied */
    char *data[IFD_MAX_INPUTS];   /* tensor i's first row: a frame, a copy or a pool slot */
    shm_pool *pool;               /* BATCH_SHM: the pool its steps are in (a reference) */
} host_frames;

struct host_batch {
    ifd_batch b;
    prediction_msg *pred; /* written before the release, read after it (done) */
    ifd_ingest *g;
    producer *p;
    int pos;         /* the producer's position entry */
    int done;        /* atomic: released by the runtime */
    host_frames *fr; /* its message's frames; NULL once let go */
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

struct ifd_ingest {
    const ifd_daemon_config *cfg;
    int *signals; /* atomic */
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
    ifd_session *session;
    const ifd_program *program;
    /* the program inputs a batch carries in this mode (predict: no labels), in frame order */
    int nin;
    const ifd_input_spec *in[IFD_MAX_INPUTS];
    ifd_thread thread;
    int started;
    size_t max_frame;
    int credit;         /* per producer: cfg->credit, or the auto credit for the batch size */
    int max_steps;      /* steps a BATCH may carry (max_steps_per_message; predict: 1) */
    int64_t batch_rows; /* rows every batch must have (ifd_input_batch_rows) */

    producer *producers;
    int64_t next_anon;
    int ever_welcomed;
    int ended_total; /* producers (names) that sent END at least once */
    /* for the watchdog's sentence (another thread): welcomed and not ended, and ended_total */
    int watch_connected, watch_ended; /* atomic */
    int input_closed;
    int handled_signals;
    int64_t stop_ns; /* when a stop was asked, 0: none */
    int64_t accepted, rejected, copied_bytes;
    double steps_per_sec, examples_per_sec;
    int64_t first_step; /* the global step when the run started (status: last_step) */
    int64_t rate_t0, rate_step0;

    int64_t starve_warned_ns; /* the last starvation warning about the current wait */

    /* the source FIFOs: one, or one per replica in per-core mode (batches accepted during one
     * receive burst are pushed together, with one wake-up) */
    ifd_mutex qmu;
    ifd_cond qcv;
    int nlanes;
    src_lane *lanes;
    int qclosed, qaborted;
    position **pos; /* the position table, also under qmu; entries never move */
    int npos, cap_pos;
    int max_pos;     /* names the table holds at most (4 x max_producers, at least 1024) */
    void *pos_index; /* tsearch tree of the entries by name, under qmu */
    void *by_rid;    /* tsearch tree of the producers by connection (I/O thread) */
    /* replies waiting for their connections' queues (reply.c): a list, and a tree by routing id */
    outbox *boxes;
    void *box_index;
    int nboxes;
    /* connections of producers that ended and whose slots went to others: their BYE is due */
    ended_conn *ended_conns;
    int nended_conns;
    /* log lines peers can cause, each rate-limited */
    ifd_log_limit lim_hello, lim_reject, lim_gone;
    int64_t liveness_ns; /* the last pass of ingest_check_liveness */
    busy_hello busy[BUSY_HELLO_MAX];
    int nbusy;
    int64_t hello_since_ns; /* while a parked HELLO is handled again: since when it waits */

    /* the pools registered with the session's device (any thread unregisters one as it goes) */
    ifd_mutex pool_mu;
    shm_pool *pinned;
    int session_released; /* under pool_mu: no more registrations */

    /* the end, from the main thread */
    ifd_mutex omu;
    int acks_pending; /* atomic */
    int finishing;    /* under omu */
    int fin_code;
    char fin_reason[32];
    char fin_message[512];
};

/* ingest.c: while the heap is above its bound, the connections without a producer are closed
 * (they may hold frames of messages they never finish, which libzmq keeps without limit). */
void ingest_close_hoarders(ifd_ingest *g);

/* ingest.c: the message handler (HELLO, BATCH, END; parts[0] is the routing id) and the
 * program the schema comes from (ifd_ingest_start sets it; the fuzz harness calls both). */
void ingest_handle_message(ifd_ingest *g, zmq_msg_t *parts, int nparts, int total);
void ingest_attach_program(ifd_ingest *g, const ifd_program *program);

/* reply.c: replies. Those that carry state (ACK, CREDIT, WELCOME, BYE, PREDICTION, an ERROR
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
const char *ingest_dims_format(int rank, const int64_t *dims, char *buf, size_t len);

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

/* hello.c */
void ingest_handle_hello(ifd_ingest *g, const producer_rid *from, const zmq_msg_t *body);
/* Parked HELLOs whose time has come are handled again (welcomed, parked again, or EBUSY); a new
 * message from a parked connection drops its parked HELLO (drop_busy_hello), and destroy frees
 * them all (from = NULL). */
void ingest_retry_busy_hellos(ifd_ingest *g);
void ingest_drop_busy_hello(ifd_ingest *g, const producer_rid *from);

/* shm.c: a pool for p (the WELCOME's "shm" object, or NULL with a sentence in why when the
 * daemon makes none: also when p's slot has SHM_POOLS_MAX pools alive, its old ones kept by
 * steps in flight); a pool is let go by its producer (drop) and by every message holding steps
 * in it (unref), and freed with the last. */
#define SHM_POOLS_MAX 2 /* a producer slot's pools alive at once (S in docs/protocol.md) */
shm_pool *ingest_shm_create(ifd_ingest *g, producer *p, const zmq_msg_t *hello, char *why,
                            size_t wlen);
/* Whether a HELLO asking p's slot for a pool would be refused now for SHM_POOLS_MAX, its pool
 * dropped (p's old pools are still held by steps in flight): it waits for them. */
int ingest_shm_must_wait(ifd_ingest *g, const producer *p, const zmq_msg_t *hello);
json_t *ingest_shm_json(const shm_pool *pool);
void ingest_shm_ref(shm_pool *pool);
void ingest_shm_unref(shm_pool *pool);
void ingest_shm_drop(ifd_ingest *g, producer *p);
/* The producer has mapped its pool (its first BATCH_SHM): the daemon's descriptor is closed. */
void ingest_shm_mapped(shm_pool *pool);
/* Every pool still registered with the session's device is unregistered (the session is about
 * to go); pools made after it are not registered. */
void ingest_shm_release_session(ifd_ingest *g);

/* source.c */
void ingest_host_frames_free(host_frames *fr);
int ingest_host_batch_free_frames(host_batch *hb);
void ingest_prediction_free(prediction_msg *m);
void ingest_host_batch_free(host_batch *hb);
void ingest_host_batch_release(ifd_batch *b, void *arg);
void ingest_src_push(ifd_ingest *g, host_batch *hb);
void ingest_src_flush(ifd_ingest *g);
void ingest_close_input(ifd_ingest *g, const char *why);

/* batch.c */
/* BATCH (shm 0) and BATCH_SHM (shm 1) */
void ingest_handle_batch(ifd_ingest *g, const producer_rid *from, zmq_msg_t *parts, int total,
                         int shm);
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
