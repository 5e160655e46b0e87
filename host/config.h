/*
 * infeedd's configuration: the runtime's ifd_config plus the daemon's own keys (endpoints,
 * credit, logging). One table (host/config.c) drives the JSON file keys, the command-line flags,
 * --help and the defaults it prints, so they cannot drift apart:
 *
 *   defaults -> the JSON file (--config) -> flags -> one validation pass
 *
 * Every error names the key (or flag), what was expected and what was given.
 */
#ifndef IFD_HOST_CONFIG_H
#define IFD_HOST_CONFIG_H

#include <infeed/infeed.h>

#include <stdio.h>

#define IFD_DAEMON_MAX_PROGRAM_LIBS 8

/* The plugin libraries of one key (program_lib, host_call_lib): paths in order, whether the flags
 * gave them (the flags replace the file's list), and the loader (tests and fuzzers set their
 * own). */
typedef struct ifd_lib_list {
    const char *paths[IFD_DAEMON_MAX_PROGRAM_LIBS];
    int n;
    int from_flags;
    int (*load)(const char *path, ifd_error *err);
} ifd_lib_list;

typedef struct ifd_daemon_config {
    ifd_config run;
    const char *listen;        /* ingest ROUTER endpoint */
    const char *publish;       /* summaries PUB endpoint; "" disables it */
    int64_t tensor_rate;       /* bytes a second of tensor messages on it */
    int64_t tensor_shm_bytes;  /* the ring of tensor messages in shared memory (0: none) */
    const char *control;       /* control REP endpoint; "" disables it */
    const char *summaries;     /* JSON Lines path; NULL: none */
    const char *predictions;   /* predict mode: JSON Lines path; NULL: none */
    const char *ready_file;    /* the bound endpoints and the pid, once bound; NULL or "": none */
    int credit;                /* batches a producer may have in flight */
    int max_steps_per_message; /* train, eval: a BATCH may carry up to this many steps' rows */
    int max_producers;
    int max_connections;     /* per socket; 0: auto (ifd_daemon_max_connections) */
    int expect_producers;    /* > 0: the input ends once this many producers sent END */
    int check_finite;        /* reject batches whose float inputs hold NaN or inf */
    double max_abs_input;    /* > 0: also reject float inputs of larger magnitude */
    int shm;                 /* offer shared-memory pools to local producers that ask */
    double producer_timeout; /* seconds a vanished or silent producer keeps its slot; 0: ever */
    int log_level;
    const char *checkpoint_dir; /* NULL: no checkpoints (docs/checkpoint.md) */
    int64_t checkpoint_every;   /* steps; 0: only at the end */
    int keep_checkpoints;
    int resume;             /* start from the latest checkpoint in checkpoint_dir */
    int checkpoint_writer;  /* 1: this host writes checkpoint_dir (several hosts: rank 0 of a
                               folder without {rank}, every host of one with it) */
    const char *checkpoint; /* start from this checkpoint file */
    /* Evaluation during training (docs/design.md): every eval_every steps (0: off), at the first
     * loop end at or past each multiple (and at a last step off one), an eval of the current
     * parameters over the eval set
     * (eval producers' batches, at most eval_memory bytes); keep_best (a metric, NULL: off)
     * keeps the best eval's checkpoint in checkpoint_dir/best; early_stopping ("METRIC:PATIENCE",
     * NULL: off) ends the run after PATIENCE evals without improvement. */
    int64_t eval_every;
    int64_t eval_memory;
    const char *keep_best;
    const char *early_stopping;
    /* CURVE (host/security.h): the daemon's key pair file turns it on on all three sockets */
    const char *curve_secret_key;
    const char *authorized_keys;   /* producer public keys, each optionally bound to names */
    const char *admin_keys;        /* control (and subscriber) public keys */
    int insecure;                  /* without CURVE, bind non-loopback endpoints all the same */
    struct ifd_security *security; /* not a key: main's loaded keys (NULL: CURVE off) */
    /* Program and host call plugins (--program-lib, --host-call-lib, repeatable; the file's list
     * is a string or an array of them), loaded by the parser before the validation pass (load:
     * ifd_program_load_plugin and ifd_host_call_load_plugin by default; the fuzz harness puts in
     * one that touches no file). */
    ifd_lib_list program_libs;   /* program_lib */
    ifd_lib_list host_call_libs; /* host_call_lib */
    int host_calls_from_flags;   /* --host-call replaces the file's host_calls */
    char *strings[160];          /* owned copies of string values */
    /* the default control endpoint (core/userdir.h), which control points at unless set: its
     * folder must be this user's alone (ifd_endpoint_bind's private) */
    char default_control[4200];
    int nstrings;
    /* not keys: where each key's value came from (IFD_KEY_FROM_*, by the key's place in the
     * option table) and whether a --config file was read, so that errors name the flag the
     * user typed (--last-step) or the key of the file (last_step) */
    unsigned char key_source[96];
    int from_file;
} ifd_daemon_config;

enum { IFD_KEY_DEFAULT = 0, IFD_KEY_FROM_FILE = 1, IFD_KEY_FROM_FLAG = 2 };

void ifd_daemon_config_defaults(ifd_daemon_config *c);
void ifd_daemon_config_free(ifd_daemon_config *c);

/*
 * Parses argv into c (which holds the defaults): the file named by --config first, then every
 * flag in order, then the validation pass. Returns IFD_OK; or IFD_EINVAL with err filled for a
 * usage or config error (exit status 2); *exit_now is set to 1 after --help or --version (which
 * print to out and want exit status 0).
 */
int ifd_daemon_config_parse(ifd_daemon_config *c, int argc, char **argv, FILE *out, int *exit_now,
                            ifd_error *err);

/*
 * As ifd_daemon_config_parse, with the file --config names read by read: *text gets the file's
 * text (malloc'd, NUL-terminated; freed by the parser), or an error names the file. The daemon
 * reads the filesystem; fuzz/fuzz_config.c hands over its input instead.
 */
typedef int (*ifd_config_reader)(void *arg, const char *path, char **text, ifd_error *err);
int ifd_daemon_config_parse_with(ifd_daemon_config *c, int argc, char **argv, FILE *out,
                                 int *exit_now, ifd_config_reader read, void *arg, ifd_error *err);

/* Applies a JSON object of config keys (the file's format). source names it in errors. */
int ifd_daemon_config_apply_json(ifd_daemon_config *c, const char *text, const char *source,
                                 ifd_error *err);

/* The validation pass: the runtime's checks, the program's settings, the daemon's keys. The
 * sentence names each key as the user gave it: --flag-name when it came from a flag (or is unset
 * and no --config file was read), key_name when it came from the file. */
int ifd_daemon_config_validate(const ifd_daemon_config *c, ifd_error *err);

/* Names the key a config error's sentence is about (ifd_error's key, set where the sentence was
 * made) as the user gave it, as the validation pass does: for the daemon's own later config
 * errors (keys, checkpoints, hosts). A sentence about no key is left as it is. */
void ifd_daemon_config_name_keys(const ifd_daemon_config *c, ifd_error *err);

/* "the integer 5", "a string of 64 bytes", "an array", "nothing" (v NULL): what arrived, for
 * error sentences. */
struct json_t;
const char *ifd_json_describe(const struct json_t *v, char *buf, size_t len);

/* Whether a ZeroMQ endpoint stays on this machine: ipc:// and inproc://, and tcp:// to
 * 127.0.0.0/8, localhost or [::1]. Anything else (another address, a wildcard, an interface
 * name, another transport) is not. */
int ifd_endpoint_is_local(const char *endpoint);
/* The connections each socket accepts at once: max_connections, or when 0, twice
 * max_producers and at least 256. */
int ifd_daemon_max_connections(const ifd_daemon_config *c);

/* Writes --help. */
void ifd_daemon_config_usage(FILE *out);

#endif
