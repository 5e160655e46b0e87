/*
 * infeedd's config (host/config.h), in four files around one option table:
 *
 *   config.c           the option table, the defaults, --help (the defaults it prints)
 *   config_parse.c     the command-line flags, the config file's reading, a value's text form
 *   config_json.c      the JSON config's keys applied (a file's or --config-json's object)
 *   config_validate.c  the validation pass, and the rewriting of the keys an error's sentence
 *                      names into the flags or file keys the user gave
 */
#ifndef IFD_HOST_CONFIG_INTERNAL_H
#define IFD_HOST_CONFIG_INTERNAL_H

#include "host/config.h"

#include <stddef.h>

/* K_SWITCH: a K_BOOL whose flag takes no value (--resume; --resume=off); K_LIBS: program_lib,
 * host_call_lib (an ifd_lib_list), a repeatable flag and a string or an array of strings in the
 * file; K_LOOP:
 * iterations_per_loop, a count of steps, auto or a duration (run.loop_kind, loop_secs); K_ENUM:
 * an int whose names are the option's names (mode, optimizer, log_level, ...); K_CALLS:
 * host_calls, an object of tensor names to a spec or an array of specs in the file, and a
 * repeatable flag NAME=SPEC[,SPEC...] (run.host_calls) */
typedef enum {
    K_STR,
    K_INT,
    K_I64,
    K_U64,
    K_F32,
    K_F64,
    K_ENUM,
    K_BOOL,
    K_SWITCH,
    K_LIBS,
    K_LOOP,
    K_CALLS
} opt_kind;

/* An enum's names: parse a name, name a value, and the sentence's list ("a, b or c"). */
typedef struct config_names {
    int (*parse)(const char *s, int *out);
    const char *(*name)(int v);
    const char *choices;
} config_names;

enum {
    OPT_RANGE = 1,    /* K_INT, K_I64, K_F64: the validation pass checks [min, max] */
    OPT_OPEN_MIN = 2, /* with OPT_RANGE: min itself is refused */
    OPT_NONEMPTY = 4, /* K_STR: "" is refused (NULL, unset, is not) */
    OPT_UNSET = 8,    /* K_I64: 0 is "unset" (--help says so) */
    OPT_OBJECT = 16   /* K_STR: the file may give a JSON object, kept as its text */
};

typedef struct config_opt {
    const char *key; /* the JSON key; the flag is --key with '_' as '-' */
    opt_kind kind;
    size_t off;
    const char *metavar;
    const char *help;
    const config_names *names; /* K_ENUM */
    unsigned flags;            /* OPT_* */
    double min, max;           /* OPT_RANGE */
    /* OPT_RANGE, OPT_NONEMPTY: what the sentence says was expected ("1 to 4096") */
    const char *expect;
    /* The flag's name without "--" when it is not the key's (host_calls: --host-call, one a
     * flag); NULL: the key with '_' as '-'. */
    const char *flag;
} config_opt;

/* The options, in --help's order; an option's place in it indexes key_source. */
extern const config_opt config_opts[];
extern const int config_nopts;

/* The option of a JSON key, or of a flag's name without its "--" (iterations-per-loop);
 * NULL when there is none. */
const config_opt *config_find_key(const char *key, size_t len);
const config_opt *config_find_flag(const char *flag, size_t len);
/* What the validation pass expects of o's number ("1 to 4096": the daemon's table, or the
 * runtime's for a key of ifd_config), or NULL: --help prints it. */
const char *config_range(const config_opt *o);
/* o's value in d, as --help prints the default ("unset", "none", "auto", "0.1", "sgd", ...) */
void config_format_value(const config_opt *o, const ifd_daemon_config *d, char *buf, size_t len);
/* "--iterations-per-loop" */
void config_flag_name(const config_opt *o, char *buf, size_t len);
/* The name the user gave o: "--last-step" (a flag, or unset without a config file) or
 * "last_step" (the config file). */
const char *config_display(const ifd_daemon_config *c, const config_opt *o, char *buf, size_t len);
/* A config error (IFD_EINVAL) about key (an option's key; NULL: the sentence names its keys
 * itself): "NAME: " and fmt's sentence, in which every {key} (an option's key in braces) is
 * the name the user gave that key. */
int config_fail(const ifd_daemon_config *c, ifd_error *err, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* config_parse.c, for config_json.c. where names the source in sentences ("flag --x" or
 * "config file f: key 'x'"). Sets o from its text form: */
int config_set_value(ifd_daemon_config *c, const config_opt *o, const char *val, const char *where,
                     ifd_error *err);
/* Adds a library path to o's list (program_lib, host_call_lib): */
int config_add_lib(ifd_daemon_config *c, const config_opt *o, const char *val, const char *where,
                   ifd_error *err);
/* Adds one host call of tensor (tlen bytes) over spec (slen bytes), both copied: */
int config_add_call(ifd_daemon_config *c, const char *tensor, size_t tlen, const char *spec,
                    size_t slen, const char *where, ifd_error *err);

#endif
