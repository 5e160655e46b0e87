/*
 * The eval set of evaluation during training (--eval-every, docs/design.md "Evaluation during
 * training"): the batches eval producers (HELLO "role": "eval") send, copied into daemon memory
 * once, in their arrival order, at most --eval-memory bytes (bookkeeping counted), and replayed as
 * the batch source of every eval session.
 *
 * Threads: the ingest's I/O thread adds batches and counts eval producers; the session's thread
 * waits for the set and replays it; close is any thread's. One mutex guards it all.
 */
#ifndef IFD_HOST_EVAL_SET_H
#define IFD_HOST_EVAL_SET_H

#include <infeed/infeed.h>

#include <stdint.h>

typedef struct ifd_eval_set ifd_eval_set;

/* What --eval-memory charges a batch besides its tensors (each rounded up to 64 bytes): its
 * entry in the set and its batch in a replay. */
#define IFD_EVAL_BATCH_OVERHEAD 2048

/* max_bytes > 0: the bytes it holds at most (each batch's tensors, each rounded up to 64 bytes,
 * and IFD_EVAL_BATCH_OVERHEAD). */
int ifd_eval_set_create(ifd_eval_set **out, int64_t max_bytes);
void ifd_eval_set_destroy(ifd_eval_set *e);

/* I/O thread: an eval producer was welcomed (IFD_ECLOSED with a sentence once the set is
 * complete: it is sent once a run), and an eval producer sent END. */
int ifd_eval_set_join(ifd_eval_set *e, const char *producer, ifd_error *err);
void ifd_eval_set_end(ifd_eval_set *e);

/* I/O thread: an eval producer that joined leaves without END (timed out, its slot given away):
 * the set is incomplete for the rest of the run (evals are skipped, the reason names producer
 * and why). */
void ifd_eval_set_abandon(ifd_eval_set *e, const char *producer, const char *why);

/* I/O thread: a copy of one step batch's tensors (each `rows` rows) joins the set. IFD_ERANGE
 * when it does not fit under the bound (the sentence names --eval-memory, the bytes stored and
 * the batch's size; the set is then marked refused: evals are skipped), IFD_ENOMEM. */
int ifd_eval_set_add(ifd_eval_set *e, const ifd_tensor *tensors, int ntensors, int64_t rows,
                     const char *producer, int64_t seq, ifd_error *err);

/* Any thread: the set will not be completed (the run is stopping: a stop request, an abort, the
 * end): a wait
 * returns. */
void ifd_eval_set_close(ifd_eval_set *e);

/* Session thread: waits until the set is complete (at least one eval producer was welcomed and
 * every one welcomed sent END) or closed. IFD_OK with *batches when complete; IFD_ECLOSED, or
 * IFD_ERANGE after a refused batch or an abandoned set, with the reason in err. Logs a WARN line
 * the first time it has to wait (naming global_step, what it waits for). */
int ifd_eval_set_wait(ifd_eval_set *e, int64_t global_step, int64_t *batches, ifd_error *err);

/* The bytes held, as the bound counts them. */
int64_t ifd_eval_set_bytes(ifd_eval_set *e);

/* Any thread: the set as it is now (control's status). why (len bytes): why it is incomplete for
 * the run (a refused batch, a producer that left), "" when it is not. */
typedef struct ifd_eval_set_state {
    int64_t batches, bytes, max_bytes;
    int producers, ended; /* eval producers welcomed, and of those, ended */
    int complete;
} ifd_eval_set_state;
void ifd_eval_set_get_state(ifd_eval_set *e, ifd_eval_set_state *st, char *why, size_t len);

/* A replay of a complete set: a batch source handing out its batches in arrival order (then
 * padding: ifd_eval_replay_pad), then IFD_EEOF. The set must outlive it and stay complete. */
typedef struct ifd_eval_replay ifd_eval_replay;
int ifd_eval_replay_create(ifd_eval_replay **out, ifd_eval_set *e, ifd_error *err);
ifd_batch_source ifd_eval_replay_source(ifd_eval_replay *r);
/* Several hosts: after the set's batches, padding batches (`rows` rows of zeros that count
 * nowhere: intake/shard.h, ifd_infeed_padding_batch, shaped for p's eval inputs) until `total`
 * batches were handed out, so that a host whose set is shorter runs the eval's agreed steps.
 * Before the replay is read. */
void ifd_eval_replay_pad(ifd_eval_replay *r, const ifd_program *p, int64_t rows, int64_t total);
void ifd_eval_replay_destroy(ifd_eval_replay *r);

#endif
