/*
 * The checkpoint object, shared by the files of loop/ that make up checkpoints and by the
 * session, which fills a new one from the device (loop/session.c):
 *
 *   checkpoint.c       the object: create, free, accessors, producer tables; ifd_checkpoint_check
 *   checkpoint_file.c  a file: its format, the atomic write, the loader
 *   checkpoint_dir.c   the folder: names by step, save and prune, the latest, load_latest
 */
#ifndef IFD_LOOP_CHECKPOINT_INTERNAL_H
#define IFD_LOOP_CHECKPOINT_INTERNAL_H

#include "infeed/checkpoint.h"

typedef struct ifd_ckpt_producer {
    char name[IFD_CHECKPOINT_NAME_MAX + 1];
    int64_t seq;
} ifd_ckpt_producer;

/* One host's producer positions, sorted by name. */
typedef struct ifd_ckpt_table {
    ifd_ckpt_producer *producers;
    int nproducers, cap;
} ifd_ckpt_table;

struct ifd_checkpoint {
    char program[64];
    ifd_program_settings settings;
    int nparams;
    ifd_param_spec params_spec[IFD_MAX_PARAMS];
    int64_t nparam_floats;
    ifd_optimizer optimizer;
    int nslots;
    int64_t global_step;
    int64_t opt_step;
    float *params; /* nparam_floats, then nslots x nparam_floats (slots) in one block */
    float *slots;
    ifd_ckpt_table *tables; /* nhosts of them, host 0's first */
    int nhosts;             /* 1 unless a run over several hosts wrote it */
    int host;               /* the table the producer functions read and write */
};

/* A zeroed checkpoint with room for the floats (one host's empty table), or NULL with err
 * filled (IFD_ENOMEM). */
ifd_checkpoint *ifd_ckpt_alloc(int64_t nparam_floats, int nslots, ifd_error *err);

/* A write to DIR/NAME goes through DIR/.NAME<CKPT_TMP_MARK><pid>, renamed over NAME at the end;
 * the folder code removes those that a killed writer left. */
#define CKPT_TMP_MARK ".tmp-"

/* ifd_checkpoint_load's parser and checks, on a file's bytes in memory (len of them); path only
 * names the file in error sentences. The file loader reads the file and calls this (so does
 * fuzz/fuzz_checkpoint.c). */
int ifd_checkpoint_load_buffer(const void *data, size_t len, const char *path, ifd_checkpoint **out,
                               ifd_error *err);

#endif
