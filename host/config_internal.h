/*
 * infeedd's config (host/config.h), in three files around one option table:
 *
 *   config.c           the option table, the defaults, --help (the defaults it prints)
 *   config_parse.c     the JSON config file and the command-line flags
 *   config_validate.c  the validation pass, and the rewriting of the keys an error's sentence
 *                      names into the flags or file keys the user gave
 */
#ifndef IFD_HOST_CONFIG_INTERNAL_H
#define IFD_HOST_CONFIG_INTERNAL_H

#include "host/config.h"

#include <stddef.h>

/* K_SWITCH: a K_BOOL whose flag takes no value (--resume; --resume=off); K_LIBS: program_lib,
 * a repeatable flag and a string or an array of strings in the file; K_LOOP:
 * iterations_per_loop, a count of steps, auto or a duration (run.loop_kind, loop_secs) */
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
    K_LOG,
    K_LIBS,
    K_LOOP
} opt_kind;

typedef struct config_opt {
    const char *key; /* the JSON key; the flag is --key with '_' as '-' */
    opt_kind kind;
    size_t off;
    const char *metavar;
    const char *help;
    const char *choices; /* K_ENUM, K_LOG: "a, b or c" */
    int (*parse_enum)(const char *s, int *out);
} config_opt;

/* The options, in --help's order; an option's place in it indexes key_source. */
extern const config_opt config_opts[];
extern const int config_nopts;

/* The option of a JSON key, or of a flag's name without its "--" (iterations-per-loop);
 * NULL when there is none. */
const config_opt *config_find_key(const char *key, size_t len);
const config_opt *config_find_flag(const char *flag, size_t len);
/* "--iterations-per-loop" */
void config_flag_name(const config_opt *o, char *buf, size_t len);

#endif
