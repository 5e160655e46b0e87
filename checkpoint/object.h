/*
 * The checkpoint module's object, its fields open to the files of checkpoint/ and to the
 * session, which fills a new one from the device and starts a run from one (loop/):
 *
 *   object.c   the object: create, free, accessors, producer tables; ifd_checkpoint_check
 *   format.c   a file: its format, the atomic write, the loader (checkpoint/format.h)
 *   folder.c   the folder: names by step, save and prune, the latest, load_latest
 *
 * The module uses core/ and device/ only; hooks/ (the checkpoint hook), loop/ and the daemon
 * use it through include/infeed/checkpoint.h and this header.
 */
#ifndef IFD_CHECKPOINT_OBJECT_H
#define IFD_CHECKPOINT_OBJECT_H

#include <infeed/checkpoint.h>

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
    ifd_program_settings settings; /* settings.config is program_config */
    char *program_config;          /* the program's settings' canonical text; NULL: none (owned) */
    int nparams;
    ifd_param_spec *params_spec; /* nparams of them (owned) */
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
/* The most parameters a checkpoint's header may list. */
#define IFD_CHECKPOINT_MAX_PARAMS (1 << 20)

/* Sets c's program settings to a copy of text (NULL or "{}": none); IFD_ENOMEM with err. */
int ifd_ckpt_set_program_config(ifd_checkpoint *c, const char *text, ifd_error *err);

/* Sets c's parameter list to a copy of n specs (IFD_ENOMEM with err filled). */
int ifd_ckpt_set_params(ifd_checkpoint *c, const ifd_param_spec *specs, int n, ifd_error *err);

ifd_checkpoint *ifd_ckpt_alloc(int64_t nparam_floats, int nslots, ifd_error *err);

#endif
