/*
 * What a run of infeedd starts from, decided before any socket opens; every error here is a
 * config error (exit status 2), its sentence carrying the key it is about (ifd_error's key).
 */
#ifndef IFD_HOST_START_H
#define IFD_HOST_START_H

#include "host/config.h"
#include "infeed/hosts.h"

/* --resume or --checkpoint (eval and predict: or the latest in --checkpoint-dir): the checkpoint
 * to start from, checked against the config, into *out (NULL on an error). */
int ifd_daemon_load_start(const ifd_daemon_config *c, ifd_checkpoint **out, ifd_error *err);

/* A train run writes into checkpoint_dir only when nothing there is ahead of start (or of
 * initial_global_step without one). */
int ifd_daemon_check_dir(const ifd_daemon_config *c, const ifd_checkpoint *start, ifd_error *err);

/* Several hosts: "{rank}" in the endpoints and paths becomes h's rank, the global batch this
 * host's share, and outputs named without "{rank}" rank 0's alone. */
int ifd_daemon_apply_hosts(ifd_daemon_config *c, ifd_hosts *h, ifd_error *err);

#endif
