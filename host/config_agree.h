/*
 * Several hosts: the settings every host of a run must share, and the check that they do
 * (docs/multihost.md, "What every host must share").
 */
#ifndef IFD_HOST_CONFIG_AGREE_H
#define IFD_HOST_CONFIG_AGREE_H

#include "host/config.h"

#include <infeed/hosts.h>

#define IFD_SHARED_VALUE_MAX 256

/* One shared setting: its key, its value as --help prints it (program_config as parsed, keys
 * sorted), and a hash of its exact value (a float's every bit). */
typedef struct ifd_config_shared_key {
    const char *key;
    char value[IFD_SHARED_VALUE_MAX];
    int64_t hash;
} ifd_config_shared_key;

/* The number of shared settings: the size of ifd_config_shared's out. */
int ifd_config_nshared(void);
/* c's shared settings into out (ifd_config_nshared() of them), start_step the global step the
 * run starts from (a checkpoint's, or initial_global_step); returns their number. */
int ifd_config_shared(const ifd_daemon_config *c, int64_t start_step, ifd_config_shared_key *out);
/* A collective of every host (the LOOP channel), before any socket opens: IFD_EINVAL naming
 * every shared setting whose value differs between the hosts, and this host's values of them,
 * on every host alike. */
int ifd_config_agree(const ifd_daemon_config *c, int64_t start_step, const ifd_hosts *h,
                     ifd_error *err);

#endif
