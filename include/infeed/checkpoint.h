/*
 * Checkpoints: a training run's state in one file (the format is docs/checkpoint.md): the
 * program, its settings and parameter shapes, the optimizer and its slots, the global step and
 * the optimizer's update count, and for every producer the highest sequence number a completed
 * step consumed.
 *
 * Files are written atomically (a temporary file in the same folder, fsync, rename, fsync of the
 * folder), named so that they sort by global step (ckpt-000000001200.ifdckpt), and a folder
 * keeps the last few. A checkpoint starts a session through ifd_config.restore.
 *
 * An ifd_checkpoint is an immutable value once loaded; the functions that change one (the
 * producer map) are for whoever builds it. Not thread-safe; distinct objects are independent.
 */
#ifndef IFD_CHECKPOINT_H
#define IFD_CHECKPOINT_H

#include <infeed/infeed.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IFD_CHECKPOINT_VERSION 1
#define IFD_CHECKPOINT_SUFFIX ".ifdckpt"
/* Bytes of a producer name, as the protocol allows (docs/protocol.md). */
#define IFD_CHECKPOINT_NAME_MAX 63
/* Hosts a checkpoint can hold positions for. */
#define IFD_CHECKPOINT_MAX_HOSTS 65536

/* ---- files ---------------------------------------------------------------------------------- */

/* Reads and validates path: the magic, the version, the size the header implies, the CRC, every
 * header key. Each error names the file and the field, what was expected and what was found
 * (IFD_ENOTFOUND: no such file; IFD_EIO: unreadable; IFD_EPROTO: not a valid checkpoint). */
int ifd_checkpoint_load(const char *path, ifd_checkpoint **out, ifd_error *err);
void ifd_checkpoint_free(ifd_checkpoint *c);

/* The path of the checkpoint with the highest global step in dir (files named
 * ckpt-<step>.ifdckpt), into path. IFD_ENOTFOUND with a sentence when dir holds none or does
 * not exist; IFD_ERANGE when len is too small. */
int ifd_checkpoint_latest(const char *dir, char *path, size_t len, ifd_error *err);
/* As ifd_checkpoint_latest, the step of that checkpoint (from its name). */
int ifd_checkpoint_latest_step(const char *dir, int64_t *step, ifd_error *err);

/* What ifd_checkpoint_load_latest appends to the name of a damaged checkpoint it sets aside. */
#define IFD_CHECKPOINT_DAMAGED ".damaged"

/* Loads the checkpoint with the highest step in dir that loads (ifd_checkpoint_load) into *out,
 * and its path into path. A newer one that does not (IFD_EPROTO or IFD_EIO: truncated, corrupt,
 * unreadable) is skipped with a WARN log line naming the file and its problem; with set_aside,
 * once an older one loaded, each skipped one is renamed to <name>.damaged (IFD_CHECKPOINT_DAMAGED)
 * so that no later listing, pruning or resume counts it (nothing is renamed when none loads).
 * Temporary files (a killed writer's) are never candidates. IFD_ENOTFOUND with a sentence when
 * dir holds no checkpoint or does not exist; IFD_EPROTO when none of its checkpoints loads (the
 * sentence names the newest and its problem); IFD_ERANGE when len is too small. */
int ifd_checkpoint_load_latest(const char *dir, int set_aside, ifd_checkpoint **out, char *path,
                               size_t len, ifd_error *err);

/* Writes c atomically as dir/ckpt-<global step>.ifdckpt (the full path into path when not NULL),
 * then removes the checkpoints of dir beyond the keep (>= 1) of the highest steps, never the one
 * it just wrote. A reader never sees a partial file under a checkpoint name: the bytes go to a
 * hidden temporary file first. */
int ifd_checkpoint_save(const ifd_checkpoint *c, const char *dir, int keep, char *path, size_t len,
                        ifd_error *err);
/* Writes c atomically to exactly path (its folder must exist). */
int ifd_checkpoint_write(const ifd_checkpoint *c, const char *path, ifd_error *err);
/* Removes the checkpoints of dir beyond the newest keep, and temporary files a killed writer
 * left behind. */
int ifd_checkpoint_prune(const char *dir, int keep, ifd_error *err);

/* ---- contents ------------------------------------------------------------------------------- */

/* A checkpoint of the program cfg names (its settings and parameter shapes) and cfg's optimizer,
 * at global_step with opt_step optimizer updates; params (nparam_floats) and slots
 * (ifd_checkpoint_slot_count x nparam_floats) are copied, NULL gives zeros; no producers. */
int ifd_checkpoint_create(ifd_checkpoint **out, const ifd_config *cfg, int64_t global_step,
                          int64_t opt_step, const float *params, const float *slots,
                          ifd_error *err);

int64_t ifd_checkpoint_global_step(const ifd_checkpoint *c);
/* Optimizer updates the slots have seen (Adam's t - 1). */
int64_t ifd_checkpoint_opt_step(const ifd_checkpoint *c);
const char *ifd_checkpoint_program(const ifd_checkpoint *c);
const ifd_program_settings *ifd_checkpoint_settings(const ifd_checkpoint *c);
/* The optimizer the run used (kind and hyperparameters). */
const ifd_optimizer *ifd_checkpoint_optimizer(const ifd_checkpoint *c);
int64_t ifd_checkpoint_nparam_floats(const ifd_checkpoint *c);
const float *ifd_checkpoint_params(const ifd_checkpoint *c);
/* Slot vectors (0, 1 or 2, by optimizer kind), each nparam_floats, slot0 first. */
int ifd_checkpoint_slot_count(const ifd_checkpoint *c);
const float *ifd_checkpoint_slots(const ifd_checkpoint *c);

/* Several hosts (docs/multihost.md): a checkpoint holds one producer table per host of the run
 * that wrote it (each host's producers are its own), 1 unless a run over several hosts wrote it.
 * The producer functions below read and write the selected table, host 0's until
 * ifd_checkpoint_select_host. */
int ifd_checkpoint_hosts(const ifd_checkpoint *c);
/* Makes c hold hosts (1 to IFD_CHECKPOINT_MAX_HOSTS) tables: new ones are empty, those beyond
 * are dropped (the selection falls back to host 0 when its table goes). */
int ifd_checkpoint_set_hosts(ifd_checkpoint *c, int hosts, ifd_error *err);
/* Selects host's table (0 to hosts - 1) for the producer functions; IFD_EINVAL otherwise. */
int ifd_checkpoint_select_host(ifd_checkpoint *c, int host, ifd_error *err);

/* Producers of the selected host, sorted by name. seq is the highest sequence number consumed from
 * the producer by a step the checkpoint includes: its stream resumes at seq + 1. */
int ifd_checkpoint_producer_count(const ifd_checkpoint *c);
const char *ifd_checkpoint_producer_name(const ifd_checkpoint *c, int i);
int64_t ifd_checkpoint_producer_seq(const ifd_checkpoint *c, int i);
/* IFD_ENOTFOUND when the checkpoint has no producer of that name. */
int ifd_checkpoint_find_producer(const ifd_checkpoint *c, const char *name, int64_t *seq);
/* Adds or replaces a producer (name of 1 to IFD_CHECKPOINT_NAME_MAX bytes, seq >= 0). */
int ifd_checkpoint_set_producer(ifd_checkpoint *c, const char *name, int64_t seq, ifd_error *err);

/* Whether a session of cfg can start from c: the same program, settings and parameter shapes,
 * and in train mode the same optimizer kind (so the same slots); the sentence names the first
 * difference ("checkpoint: program: the checkpoint is of 'softmax', this run's is 'linear'").
 * Hyperparameters (learning rate, ...), replicas, batch size and the seed may differ. */
int ifd_checkpoint_check(const ifd_checkpoint *c, const ifd_config *cfg, ifd_error *err);

/* ---- the checkpoint hook -------------------------------------------------------------------- */

/* The state of the session a hook runs in, replica 0's, as a new checkpoint (no producers).
 * Between loops only: in begin, after_create_session, after_run or end. */
int ifd_run_context_checkpoint(ifd_run_context *ctx, ifd_checkpoint **out, ifd_error *err);
/* In end: whether the run is ending with an error (its state may then be half a step). */
int ifd_run_context_failed(const ifd_run_context *ctx);
/* In end: batches the infeed took from the source and released without a step (the input ended
 * inside a step that takes several: per-host-v2, per-core). The source counts them as handed out,
 * so positions read now would skip them. */
int64_t ifd_run_context_dropped(const ifd_run_context *ctx);

typedef struct ifd_checkpoint_options {
    const char *dir; /* created when missing (its parent must exist) */
    int64_t every;   /* steps: a checkpoint at the first loop end at or past each multiple
                        (loops the session sizes itself, loop_kind auto or seconds, end at each
                        multiple: ifd_run_context_end_next_loop_by); 0: only at the end */
    int keep;        /* checkpoints kept in dir, >= 1 */
    /* Optional: adds each producer's highest consumed seq to c (ifd_checkpoint_set_producer).
     * Called on the session's thread between loops, where every batch the batch source handed
     * out was consumed by a completed step. */
    int (*positions)(void *arg, ifd_checkpoint *c, ifd_error *err);
    void *positions_arg;
    /* Several hosts (NULL or size 1: one), borrowed: every host runs the hook, each writes its
     * own positions into its table, and the hosts all-gather them on the LOOP channel, so each
     * checkpoint holds every host's table; only the hosts with write set write files (the
     * others gather, create no folder and prune nothing). The hook must then be on every host,
     * with the same every, and the hosts' runs must end at the same step, as a run over hosts
     * does. */
    const struct ifd_hosts *hosts;
    int write; /* with hosts: whether this host writes into dir */
} ifd_checkpoint_options;

/* c's producer positions as the checkpoint hook writes them: positions(arg, c) (optional) adds
 * this host's; with several hosts (hosts spans more than one) c is first made a checkpoint of
 * hosts->size tables with this host's selected, and afterwards holds every host's, all-gathered
 * on the LOOP channel (every host calls it at the same loop boundary, from the session's
 * thread). infeedd's --keep-best writes its best checkpoint with it. */
int ifd_checkpoint_add_positions(ifd_checkpoint *c, const struct ifd_hosts *hosts,
                                 int (*positions)(void *arg, ifd_checkpoint *c, ifd_error *err),
                                 void *positions_arg, ifd_error *err);

/* The seed's CheckpointSaverHook at loop granularity: after a loop that reached or crossed a
 * multiple of every, and at the end of a run that ended without an error and ran a step since
 * the last checkpoint, writes replica 0's state with ifd_checkpoint_save. o is copied (dir too). */
int ifd_hook_checkpoint(ifd_hook *out, const ifd_checkpoint_options *o, ifd_error *err);

#ifdef __cplusplus
}
#endif

#endif
