/*
 * Tests of infeedd's option table (host/config.c) and the passes it drives: every option's
 * range, type and emptiness checked with random values inside and outside, from a flag and from
 * the config file, each error naming the key as the user gave it (--flag or file_key), what was
 * expected and what arrived; the runtime's sentences and the rules between keys named the same
 * way; --help listing every option with its default.
 */
#include "host/config_agree.h"
#include "host/config_internal.h"
#include "tests/util/program_ref.h"
#include "tests/util/testutil.h"

#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The base every case adds to: a run that validates. */
static const char *const BASE[] = {"--features", "4", "--classes", "3", "--steps", "10"};
#define NBASE ((int)(sizeof BASE / sizeof BASE[0]))

static int read_text(void *arg, const char *path, char **text, ifd_error *err)
{
    (void)path;
    *text = strdup((const char *)arg);
    return *text ? IFD_OK : ifd_error_set(err, IFD_ENOMEM, "out of memory");
}

static int no_plugin(const char *path, ifd_error *err)
{
    return ifd_error_set(err, IFD_EINVAL, "program library '%s': not loaded by the test", path);
}

/* Parses BASE and args (a NULL-terminated list) into *c (to be freed); with json, a --config
 * file holding it comes first. */
static int parse_into(ifd_daemon_config *c, const char *json, const char *const *args,
                      ifd_error *err)
{
    char *argv[48] = {"infeedd"};
    int argc = 1;
    if (json) {
        argv[argc++] = "--config";
        argv[argc++] = "t.json";
    }
    for (int i = 0; i < NBASE && !json; i++)
        argv[argc++] = (char *)BASE[i];
    for (int i = 0; args && args[i]; i++)
        argv[argc++] = (char *)args[i];
    ifd_daemon_config_defaults(c);
    c->program_libs.load = no_plugin;
    c->host_call_libs.load = no_plugin;
    int exit_now;
    FILE *devnull = fopen("/dev/null", "w");
    ifd_error_clear(err);
    int rc = ifd_daemon_config_parse_with(c, argc, argv, devnull, &exit_now, read_text,
                                          (void *)json, err);
    fclose(devnull);
    return rc;
}

static int parse(const char *json, const char *const *args, ifd_error *err)
{
    ifd_daemon_config c;
    int rc = parse_into(&c, json, args, err);
    ifd_daemon_config_free(&c);
    return rc;
}

/* The file of BASE with "key": value (value is JSON text; it replaces BASE's value of key). */
static const char *file_with(char *buf, size_t len, const char *key, const char *value)
{
    const char *base[][2] = {{"features", "4"}, {"classes", "3"}, {"steps", "10"}};
    size_t at = (size_t)snprintf(buf, len, "{\"%s\": %s", key, value);
    for (int i = 0; i < 3; i++)
        if (strcmp(base[i][0], key) != 0)
            at += (size_t)snprintf(buf + at, len - at, ", \"%s\": %s", base[i][0], base[i][1]);
    snprintf(buf + at, len - at, "}");
    return buf;
}

static double uniform(ifd_rng *rng)
{
    return (double)(ifd_rng_next(rng) >> 11) / 9007199254740992.0;
}

/* A value of o's kind inside its range (in_range) or outside it, as text. NULL: there is none
 * outside on that side (keep_checkpoints has no integer above its maximum). */
static const char *range_value(const config_opt *o, ifd_rng *rng, int in_range, char *buf,
                               size_t len)
{
    int below = (int)rand_between(rng, 0, 1);
    if (o->kind == K_F64) {
        double v = in_range ? o->min + (o->max - o->min) * uniform(rng)
                   : below  ? o->min - 1e-3 - 100.0 * uniform(rng)
                            : o->max * (1.0 + uniform(rng)) + 1.0;
        if (in_range && (o->flags & OPT_OPEN_MIN) && v <= o->min)
            v = o->max;
        snprintf(buf, len, "%.17g", v);
        return buf;
    }
    double hi = o->kind == K_INT ? (double)INT32_MAX : 9.2e18;
    int64_t lo = (int64_t)o->min, top = (int64_t)(o->max < hi ? o->max : hi);
    int64_t v;
    if (in_range)
        v = rand_between(rng, lo, top);
    else if (below || o->max >= hi)
        v = lo - rand_between(rng, 1, 1000);
    else
        v = top + rand_between(rng, 1, 1000);
    snprintf(buf, len, "%" PRId64, v);
    return buf;
}

/* The sentence's "got" of the text value v for o. */
static void got_text(const config_opt *o, const char *v, char *buf, size_t len)
{
    if (o->kind == K_F64)
        snprintf(buf, len, "%g", strtod(v, NULL));
    else
        snprintf(buf, len, "%s", v);
}

START_TEST(option_ranges_in_and_out)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error err;
    int ranged = 0;
    for (int i = 0; i < config_nopts; i++) {
        const config_opt *o = &config_opts[i];
        if (!(o->flags & OPT_RANGE))
            continue;
        ranged++;
        char flag[64], value[64], got[64], want[256], json[256];
        config_flag_name(o, flag, sizeof flag);
        for (int round = 0; round < 20; round++) {
            const char *v = range_value(o, &rng, 1, value, sizeof value);
            const char *in[] = {flag, v, NULL};
            RASSERT(parse(NULL, in, &err) == IFD_OK, "%s %s is in range: %s", flag, v, err.msg);
            RASSERT(parse(file_with(json, sizeof json, o->key, v), NULL, &err) == IFD_OK,
                    "%s: %s is in range: %s", o->key, v, err.msg);
            v = range_value(o, &rng, 0, value, sizeof value);
            const char *out[] = {flag, v, NULL};
            got_text(o, v, got, sizeof got);
            RASSERT(parse(NULL, out, &err) == IFD_EINVAL, "%s %s is out of range", flag, v);
            snprintf(want, sizeof want, "%s: expected %s, got %s", flag, o->expect, got);
            RASSERT(strcmp(err.msg, want) == 0, "'%s', want '%s'", err.msg, want);
            RASSERT(strcmp(err.key, o->key) == 0, "the error's key %s, want %s", err.key, o->key);
            RASSERT(parse(file_with(json, sizeof json, o->key, v), NULL, &err) == IFD_EINVAL,
                    "%s: %s is out of range", o->key, v);
            snprintf(want, sizeof want, "%s: expected %s, got %s", o->key, o->expect, got);
            RASSERT(strcmp(err.msg, want) == 0, "'%s', want '%s'", err.msg, want);
        }
    }
    ck_assert_int_ge(ranged, 7);
}
END_TEST

/* A value no option of o's kind takes (NULL: K_STR takes any string). */
static const char *bad_text(const config_opt *o)
{
    switch (o->kind) {
    case K_INT:
    case K_I64:
        return "12abc";
    case K_U64:
        return "-1";
    case K_F32:
    case K_F64:
        return "fast";
    case K_ENUM:
        return "nosuch";
    case K_BOOL:
    case K_SWITCH:
        return "maybe";
    case K_LOOP:
        return "2x";
    case K_LIBS:
        return "";
    case K_CALLS:
        return "nope";
    case K_STR:
        break;
    }
    return NULL;
}

START_TEST(option_bad_values_name_the_key)
{
    ifd_error err;
    for (int i = 0; i < config_nopts; i++) {
        const config_opt *o = &config_opts[i];
        char flag[64], arg[96], want[160], json[256];
        config_flag_name(o, flag, sizeof flag);
        const char *bad = bad_text(o);
        if (bad) {
            snprintf(arg, sizeof arg, "%s=%s", flag, bad);
            const char *args[] = {arg, NULL};
            RASSERT(parse(NULL, args, &err) == IFD_EINVAL, "%s is refused", arg);
            snprintf(want, sizeof want, "flag %s: expected ", flag);
            RASSERT(strncmp(err.msg, want, strlen(want)) == 0, "%s: '%s'", arg, err.msg);
            snprintf(want, sizeof want, "got '%s'", bad);
            RASSERT(strstr(err.msg, want) || o->kind == K_U64, "%s: '%s'", arg, err.msg);
            if (o->kind == K_ENUM)
                RASSERT(strstr(err.msg, o->names->choices), "%s: '%s'", arg, err.msg);
        }
        /* a JSON object is no option's value but host_calls' and program_config's, which no
         * array is */
        int calls = o->kind == K_CALLS || (o->flags & OPT_OBJECT);
        RASSERT(parse(file_with(json, sizeof json, o->key, calls ? "[]" : "{}"), NULL, &err) ==
                    IFD_EINVAL,
                "%s: {} is refused", o->key);
        snprintf(want, sizeof want, "config file t.json: key '%s': expected ", o->key);
        RASSERT(strncmp(err.msg, want, strlen(want)) == 0 &&
                    strstr(err.msg, calls ? "got an array" : "got an object"),
                "%s: '%s'", o->key, err.msg);
    }
}
END_TEST

START_TEST(nonempty_options_refuse_the_empty_string)
{
    ifd_error err;
    int n = 0;
    for (int i = 0; i < config_nopts; i++) {
        const config_opt *o = &config_opts[i];
        if (!(o->flags & OPT_NONEMPTY))
            continue;
        n++;
        char flag[64], arg[96], want[160], json[256];
        config_flag_name(o, flag, sizeof flag);
        snprintf(arg, sizeof arg, "%s=", flag);
        const char *args[] = {arg, NULL};
        RASSERT(parse(NULL, args, &err) == IFD_EINVAL, "%s is refused", arg);
        snprintf(want, sizeof want, "%s: expected %s, got ''", flag, o->expect);
        RASSERT(strcmp(err.msg, want) == 0, "'%s', want '%s'", err.msg, want);
        RASSERT(parse(file_with(json, sizeof json, o->key, "\"\""), NULL, &err) == IFD_EINVAL,
                "%s: \"\" is refused", o->key);
        snprintf(want, sizeof want, "%s: expected %s, got ''", o->key, o->expect);
        RASSERT(strcmp(err.msg, want) == 0, "'%s', want '%s'", err.msg, want);
    }
    ck_assert_int_ge(n, 5);
}
END_TEST

/* The runtime's ranges (loop/run_config.c), reached through the daemon: its sentence names the flag
 * or the file's key, never the runtime's own name of a key. */
static const struct {
    const char *key, *runtime_name;
    int64_t lo, hi; /* the bad values are drawn from [lo, hi] */
    const char *expect;
} RUNTIME_CASES[] = {
    {"replicas", NULL, -50, 0, "1 to 1024"},
    {"replicas", NULL, 1025, 9999, "1 to 1024"},
    {"batch_size", NULL, -99, 0, "a positive integer"},
    {"infeed_depth", NULL, 65537, 1 << 20, "1 to 65536"},
    {"outfeed_depth", NULL, -9, 0, "1 to 65536"},
    {"learning_rate", NULL, -9, 0, "a positive number"},
    {"clip_norm", NULL, -9, -1, "0 (no clipping) or a positive norm"},
    {"warmup_steps", NULL, -99, -1, "0 or more"},
    {"decay_steps", NULL, -99, -1, "0 or more"},
    {"min_learning_rate", NULL, -9, -1, "0 or more"},
    {"summary_every", NULL, -99, -1, "0 or more"},
    {"initial_global_step", NULL, -99, -1, "0 or more"},
    {"max_skipped_steps", NULL, -99, -1, "0 (never end the run) or more"},
    {"watchdog", "watchdog_secs", 86401, 1 << 30, "seconds from 0 (off) to 86400"},
    {"initial_infeed_sleep", "initial_infeed_sleep_secs", -99, -1, "seconds from 0 to 86400"},
    {"max_loop_seconds", "max_loop_secs", -99, 0, "seconds above 0, at most 86400"},
    {"replica_threads", NULL, 1025, 1 << 20, "0 (auto) to 1024"},
    {"replica_threads", NULL, -99, -1, "0 (auto) to 1024"},
};

START_TEST(runtime_errors_name_the_key_given)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error err;
    for (size_t i = 0; i < sizeof RUNTIME_CASES / sizeof RUNTIME_CASES[0]; i++) {
        const config_opt *o = config_find_key(RUNTIME_CASES[i].key, strlen(RUNTIME_CASES[i].key));
        ck_assert_ptr_nonnull(o);
        char flag[64], value[32], want[160], json[256];
        config_flag_name(o, flag, sizeof flag);
        snprintf(value, sizeof value, "%" PRId64,
                 rand_between(&rng, RUNTIME_CASES[i].lo, RUNTIME_CASES[i].hi));
        const char *args[] = {flag, value, NULL};
        RASSERT(parse(NULL, args, &err) == IFD_EINVAL, "%s %s is refused", flag, value);
        char got[48];
        snprintf(got, sizeof got, "%g", strtod(value, NULL));
        snprintf(want, sizeof want, "%s: expected %s, got ", flag, RUNTIME_CASES[i].expect);
        RASSERT(strncmp(err.msg, want, strlen(want)) == 0 &&
                    (strstr(err.msg, value) || strstr(err.msg, got)),
                "'%s', want '%s%s'", err.msg, want, value);
        RASSERT(parse(file_with(json, sizeof json, o->key, value), NULL, &err) == IFD_EINVAL,
                "%s: %s is refused", o->key, value);
        snprintf(want, sizeof want, "%s: expected %s, got ", o->key, RUNTIME_CASES[i].expect);
        RASSERT(strncmp(err.msg, want, strlen(want)) == 0, "'%s', want '%s'", err.msg, want);
        if (RUNTIME_CASES[i].runtime_name)
            RASSERT(!strstr(err.msg, RUNTIME_CASES[i].runtime_name), "%s", err.msg);
    }
}
END_TEST

/* The rules between keys (config_validate.c), each naming every key it is about as given. */
static const struct {
    const char *args[8];
    const char *want_flags, *want_file;
} RULE_CASES[] = {
    {{"tensor_shm_bytes", "65535"},
     "--tensor-shm-bytes: expected 0 (no ring) or at least 65536 bytes, got 65535",
     "tensor_shm_bytes: expected 0 (no ring) or at least 65536 bytes, got 65535"},
    {{"credit", "4", "max_steps_per_message", "8"},
     "--credit: a message of --max-steps-per-message (8) steps costs that many credits",
     "credit: a message of max_steps_per_message (8) steps costs that many credits"},
    {{"max_abs_input", "2", "check_finite", "off"},
     "--max-abs-input: expected --check-finite on (the bound is part of that check), got "
     "--check-finite off",
     "max_abs_input: expected check_finite on (the bound is part of that check), got "
     "check_finite off"},
    {{"max_producers", "300", "max_connections", "299"},
     "--max-connections: expected 0 (auto) or --max-producers (300) to 65536, got 299",
     "max_connections: expected 0 (auto) or max_producers (300) to 65536, got 299"},
    {{"max_producers", "7", "expect_producers", "8"},
     "--expect-producers: expected 0 to --max-producers (7), got 8",
     "expect_producers: expected 0 to max_producers (7), got 8"},
    {{"resume", "on"},
     "--resume: expected --checkpoint-dir, the folder to resume from",
     "resume: expected checkpoint_dir, the folder to resume from"},
    {{"resume", "on", "checkpoint_dir", "d", "checkpoint", "f"},
     "--resume and --checkpoint: expected at most one (resume takes the latest checkpoint of "
     "--checkpoint-dir,",
     "resume and checkpoint: expected at most one (resume takes the latest checkpoint of "
     "checkpoint_dir,"},
    {{"predictions", "p.jsonl"},
     "--predictions: expected only in predict mode, got a path in "
     "train mode",
     "predictions: expected only in predict mode"},
    {{"input_mode", "per-host-v2", "replicas", "4", "credit", "3"},
     "--credit: per-host-v2 input takes 4 batches",
     "credit: per-host-v2 input takes 4 batches"},
    {{"steps", "5", "last_step", "9"},
     "--steps and --last-step: expected exactly one of them, "
     "got both",
     "steps and last_step: expected exactly one of them, got both"},
    {{"weight_decay", "0.01", "optimizer", "adam"},
     "--weight-decay: expected --optimizer adamw (the optimizer with decoupled weight decay), got "
     "--optimizer adam",
     "weight_decay: expected optimizer adamw (the optimizer with decoupled weight decay), got "
     "optimizer adam"},
    {{"admin_keys", "k.pub"},
     "--admin-keys: expected --curve-secret-key with it",
     "admin_keys: expected curve_secret_key with it"},
};

START_TEST(rules_name_every_key_as_given)
{
    ifd_error err;
    for (size_t i = 0; i < sizeof RULE_CASES / sizeof RULE_CASES[0]; i++) {
        char flags[8][96], file[512] = "{\"features\": 4, \"classes\": 3, \"steps\": 10";
        const char *args[9] = {NULL};
        int n = 0;
        for (; n < 8 && RULE_CASES[i].args[n]; n += 2) {
            const config_opt *o =
                config_find_key(RULE_CASES[i].args[n], strlen(RULE_CASES[i].args[n]));
            ck_assert_ptr_nonnull(o);
            const char *v = RULE_CASES[i].args[n + 1];
            char flag[64];
            config_flag_name(o, flag, sizeof flag);
            snprintf(flags[n / 2], sizeof flags[n / 2], "%s=%s", flag, v);
            args[n / 2] = flags[n / 2];
            size_t len = strlen(file);
            int quoted = o->kind == K_STR || o->kind == K_ENUM;
            int boolean = o->kind == K_BOOL || o->kind == K_SWITCH;
            snprintf(file + len, sizeof file - len, ", \"%s\": %s%s%s", o->key, quoted ? "\"" : "",
                     boolean ? (strcmp(v, "on") == 0 ? "true" : "false") : v, quoted ? "\"" : "");
        }
        strcat(file, "}");
        RASSERT(parse(NULL, args, &err) == IFD_EINVAL, "case %zu is refused", i);
        RASSERT(strstr(err.msg, RULE_CASES[i].want_flags) == err.msg, "'%s', want '%s'", err.msg,
                RULE_CASES[i].want_flags);
        /* "steps" is in BASE and the file: the last of a file's duplicates is refused */
        if (strcmp(RULE_CASES[i].args[0], "steps") == 0)
            continue;
        RASSERT(parse(file, NULL, &err) == IFD_EINVAL, "case %zu from %s is refused", i, file);
        RASSERT(strstr(err.msg, RULE_CASES[i].want_file) == err.msg, "'%s', want '%s'", err.msg,
                RULE_CASES[i].want_file);
        RASSERT(!strstr(err.msg, "--"), "a file's keys are named as keys: '%s'", err.msg);
    }
}
END_TEST

/* Backend settings reach the runtime's config (the device config carries them on), never the
 * environment; IFD_REPLICA_THREADS is read once, here, when neither the file nor a flag gives
 * replica_threads. */
START_TEST(backend_settings_fill_the_config)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_error err;
    ifd_daemon_config c;
    unsetenv("IFD_REPLICA_THREADS");
    RC_OK(parse_into(&c, NULL, NULL, &err), err);
    ck_assert_int_eq(c.run.replica_threads, 0);
    ck_assert_int_eq(c.run.cuda_graphs, 1);
    ifd_daemon_config_free(&c);
    int env = (int)rand_between(&rng, 1, 1024), flag = (int)rand_between(&rng, 0, 1024);
    char envs[16], flags[16], json[256];
    snprintf(envs, sizeof envs, "%d", env);
    snprintf(flags, sizeof flags, "%d", flag);
    setenv("IFD_REPLICA_THREADS", envs, 1);
    RC_OK(parse_into(&c, NULL, NULL, &err), err);
    ck_assert_int_eq(c.run.replica_threads, env);
    ifd_daemon_config_free(&c);
    const char *args[] = {"--replica-threads", flags, "--cuda-graphs", "off", NULL};
    RC_OK(parse_into(&c, NULL, args, &err), err);
    ck_assert_int_eq(c.run.replica_threads, flag);
    ck_assert_int_eq(c.run.cuda_graphs, 0);
    ifd_daemon_config_free(&c);
    RC_OK(parse_into(&c, file_with(json, sizeof json, "replica_threads", flags), NULL, &err), err);
    ck_assert_int_eq(c.run.replica_threads, flag);
    ifd_daemon_config_free(&c);
    setenv("IFD_REPLICA_THREADS", "many", 1);
    ck_assert_int_eq(parse(NULL, NULL, &err), IFD_EINVAL);
    ck_assert_str_eq(err.msg,
                     "environment variable IFD_REPLICA_THREADS: expected an integer, got 'many'");
    unsetenv("IFD_REPLICA_THREADS");
}
END_TEST

/* ifd_config's old field names (one release): the same storage as the new ones, so code that
 * sets them runs as before; a bad value is named by the one name. */
START_TEST(old_field_names_set_the_new_ones)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_config c;
    ifd_config_defaults(&c);
    int64_t steps = rand_between(&rng, 1, 1 << 30);
    double secs[3];
    for (int i = 0; i < 3; i++)
        secs[i] = 0.001 + 86399.0 * uniform(&rng);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    c.num_steps = steps;
    c.watchdog_secs = secs[0];
    c.initial_infeed_sleep_secs = secs[1];
    c.max_loop_secs = secs[2];
    ck_assert_int_eq(c.steps, steps);
    ck_assert(c.watchdog == secs[0] && c.initial_infeed_sleep == secs[1] &&
              c.max_loop_seconds == secs[2]);
    c.steps = steps + 1;
    ck_assert_int_eq(c.num_steps, steps + 1);
#pragma GCC diagnostic pop
    ifd_error err;
    RC_OK(ifd_config_validate(&c, &err), err);
    c.watchdog = -secs[0];
    ck_assert_int_eq(ifd_config_validate(&c, &err), IFD_EINVAL);
    RASSERT(strncmp(err.msg, "watchdog: ", 10) == 0 && strcmp(err.key, "watchdog") == 0, "%s",
            err.msg);
}
END_TEST

/* host_calls: the file's object (a spec or an array a tensor), --host-call NAME=SPEC[,SPEC...]
 * with a comma before "name=value" continuing a spec, and the flags replacing the file's. The
 * validation's own verdict (the reducers, outfeed/) is the daemon's e2e tests'. */
START_TEST(host_calls_file_and_flags)
{
    ifd_daemon_config c;
    ifd_error err;
    char json[256];
    const char *flags[] = {"--host-call", "confidence=histogram:bins=10,range=0:1,mean",
                           "--host-call=label=top_k:2,label=y,sum", NULL};
    int rc = parse_into(&c, NULL, flags, &err);
    ck_assert_msg(rc == IFD_OK || strcmp(err.key, "host_calls") == 0, "%s", err.msg);
    static const char *const want[][2] = {{"confidence", "histogram:bins=10,range=0:1"},
                                          {"confidence", "mean"},
                                          {"label", "top_k:2,label=y"},
                                          {"label", "sum"}};
    ck_assert_int_eq(c.run.nhost_calls, 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_str_eq(c.run.host_calls[i].tensor, want[i][0]);
        ck_assert_str_eq(c.run.host_calls[i].spec, want[i][1]);
    }
    ifd_daemon_config_free(&c);
    const char *file = file_with(json, sizeof json, "host_calls",
                                 "{\"loss\": \"mean\", \"confidence\": [\"min\", \"max\"]}");
    rc = parse_into(&c, file, NULL, &err);
    ck_assert_msg(rc == IFD_OK || strcmp(err.key, "host_calls") == 0, "%s", err.msg);
    ck_assert_int_eq(c.run.nhost_calls, 3);
    ck_assert_str_eq(c.run.host_calls[0].tensor, "loss");
    ck_assert_str_eq(c.run.host_calls[2].spec, "max");
    ifd_daemon_config_free(&c);
    const char *one[] = {"--host-call", "count=sum", NULL}; /* replaces the file's three */
    rc = parse_into(&c, file, one, &err);
    ck_assert_msg(rc == IFD_OK || strcmp(err.key, "host_calls") == 0, "%s", err.msg);
    ck_assert_int_eq(c.run.nhost_calls, 1);
    ck_assert_str_eq(c.run.host_calls[0].tensor, "count");
    ifd_daemon_config_free(&c);
    /* What cannot be a host call, named by the flag or the key. */
    const char *bad[][3] = {{"--host-call", "=mean", "flag --host-call: expected NAME=SPEC"},
                            {"--host-call", "x=",
                             "flag --host-call: expected a tensor name and "
                             "a host call spec, got '' for tensor 'x'"}};
    for (int i = 0; i < 2; i++) {
        const char *args[] = {bad[i][0], bad[i][1], NULL};
        ck_assert_int_eq(parse(NULL, args, &err), IFD_EINVAL);
        ck_assert_msg(strstr(err.msg, bad[i][2]), "%s", err.msg);
    }
    ck_assert_int_eq(parse(file_with(json, sizeof json, "host_calls", "{\"a\": [1]}"), NULL, &err),
                     IFD_EINVAL);
    ck_assert_msg(strstr(err.msg, "key 'host_calls': tensor 'a': element 0: expected a host call "
                                  "spec (a string), got"),
                  "%s", err.msg);
    /* The reducers' verdict comes back with the code its sentence carries (the fuzzer's
     * finding: IFD_EINVAL returned, IFD_EDTYPE in err), from a flag and from the file. */
    const char *top[] = {"--host-call", "class=top_k:2", NULL};
    const char *top_file = file_with(json, sizeof json, "host_calls", "{\"class\": \"top_k:2\"}");
    for (int i = 0; i < 2; i++) {
        rc = i ? parse(top_file, NULL, &err) : parse(NULL, top, &err);
        ck_assert_int_eq(rc, IFD_EDTYPE);
        ck_assert_int_eq(err.code, rc);
        ck_assert_msg(strstr(err.msg, "tensor 'class', 'top_k:2': expected float32 scores"), "%s",
                      err.msg);
    }
}
END_TEST

/* docs/config.md's infeedd table names every option of the table (test_cli.py checks the other
 * way: every key it documents is a flag of --help). */
START_TEST(config_md_lists_every_option)
{
    FILE *f = fopen(IFD_SOURCE_DIR "/docs/config.md", "r");
    ck_assert_ptr_nonnull(f);
    static char text[1 << 18];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *end = strstr(text, "## The runtime");
    ck_assert_ptr_nonnull(end);
    *end = '\0';
    for (int i = 0; i < config_nopts; i++) {
        char quoted[80];
        snprintf(quoted, sizeof quoted, "| `%s`", config_opts[i].key);
        const char *row = strstr(text, quoted);
        snprintf(quoted, sizeof quoted, ", `%s`", config_opts[i].key);
        const char *in_list = strstr(text, quoted);
        RASSERT(row || in_list, "docs/config.md has no row for %s", config_opts[i].key);
    }
}
END_TEST

START_TEST(help_lists_every_option_and_its_default)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    ifd_daemon_config_usage(f);
    fclose(f);
    for (int i = 0; i < config_nopts; i++) {
        char flag[64];
        config_flag_name(&config_opts[i], flag, sizeof flag);
        char line[80];
        snprintf(line, sizeof line, "\n  %s ", flag);
        const char *at = strstr(text, line);
        RASSERT(at != NULL, "--help lacks %s", flag);
        const char *eol = strchr(at + 1, '\n');
        const char *def = strstr(at, "(default: ");
        RASSERT(def && eol && def < eol, "--help gives %s no default", flag);
        const char *want = config_range(&config_opts[i]);
        char range[128];
        snprintf(range, sizeof range, " [%s] (default: ", want ? want : "");
        const char *r = strstr(at, range);
        RASSERT(!want || (r && r < eol), "--help gives %s no range", flag);
        RASSERT(want || !(config_opts[i].flags & OPT_RANGE), "%s has no range", flag);
    }
    RASSERT(strstr(text, "--steps N ") && strstr(text, "(default: unset)"), "%s", text);
    /* the runtime's ranges too */
    RASSERT(strstr(text, "[1 to 1024] (default: 1)") && strstr(text, "[0 (auto) to 1024]"), "%s",
            text);
    free(text);
}
END_TEST

/* "layered": reads program_config's layers (1..64), for program_config_flag_and_key. */
static int layered_setup(ifd_program *p, ifd_error *err)
{
    int64_t layers, d = 1;
    int rc = ifd_program_config_int(p, "layers", 2, 1, 64, &layers, err);
    return rc ? rc : ifd_program_add_param(p, "w", 1, &d);
}
static void layered_init(const ifd_program *p, float *params, uint64_t seed)
{
    (void)p, (void)seed;
    params[0] = 0.0f;
}
static const ifd_program_class layered = {.name = "layered",
                                          .setup = layered_setup,
                                          .init_params = layered_init,
                                          .workspace_floats = tu_program_rows_workspace,
                                          .train_step = tu_program_no_step};

/* program_config from the flag (its text as given) and the file (an object, kept as its
 * canonical text, or a string); the program's sentences name the flag or the key as given. */
START_TEST(program_config_flag_and_key)
{
    ck_assert_int_eq(ifd_program_register(&layered), IFD_OK);
    ifd_daemon_config c;
    ifd_error err;
    const char *flag_ok[] = {"--program", "layered", "--program-config", "{\"layers\": 7}", NULL};
    RASSERT(parse_into(&c, NULL, flag_ok, &err) == IFD_OK, "%s", err.msg);
    ck_assert_str_eq(c.run.settings.config, "{\"layers\": 7}");
    ifd_daemon_config_free(&c);
    const char *file_ok = "{\"program\": \"layered\", \"program_config\": {\"layers\": 9}, "
                          "\"features\": 4, \"classes\": 3, \"steps\": 10}";
    RASSERT(parse_into(&c, file_ok, NULL, &err) == IFD_OK, "%s", err.msg);
    ck_assert_str_eq(c.run.settings.config, "{\"layers\":9}");
    ifd_daemon_config_free(&c);
    const char *file_text = "{\"program\": \"layered\", \"program_config\": \"{}\", "
                            "\"features\": 4, \"classes\": 3, \"steps\": 10}";
    RASSERT(parse_into(&c, file_text, NULL, &err) == IFD_OK, "%s", err.msg);
    ck_assert_str_eq(c.run.settings.config, "{}");
    ifd_daemon_config_free(&c);
    /* refusals: the program's, naming the flag or the key; text that is no object; a number */
    const char *flag_bad[] = {"--program", "layered", "--program-config", "{\"layers\": 0}", NULL};
    ck_assert_int_eq(parse(NULL, flag_bad, &err), IFD_EINVAL);
    ck_assert_str_eq(err.msg, "program 'layered': --program-config setting 'layers': expected an "
                              "integer from 1 to 64, got 0");
    const char *file_bad = "{\"program\": \"softmax\", \"program_config\": {\"layers\": 2}, "
                           "\"features\": 4, \"classes\": 3, \"steps\": 10}";
    ck_assert_int_eq(parse(file_bad, NULL, &err), IFD_EINVAL);
    ck_assert_str_eq(err.msg, "program 'softmax': program_config setting 'layers': the program has "
                              "no such setting (it reads none)");
    const char *flag_list[] = {"--program-config", "[2]", NULL};
    ck_assert_int_eq(parse(NULL, flag_list, &err), IFD_EINVAL);
    RASSERT(strncmp(err.msg, "--program-config: expected a JSON object of the program's settings",
                    66) == 0,
            "%s", err.msg);
    const char *file_num = "{\"program_config\": 2, \"features\": 4, \"classes\": 3, "
                           "\"steps\": 10}";
    ck_assert_int_eq(parse(file_num, NULL, &err), IFD_EINVAL);
    RASSERT(strstr(err.msg, "key 'program_config': expected a JSON object (or its text), got "),
            "%s", err.msg);
}
END_TEST

/* Several hosts' shared settings (host/config_agree.c): two configs that differ in one shared
 * setting (a random value of its kind) differ in that setting's hash alone; program_config
 * compares as parsed; a float's last bit counts; endpoints and other per-host keys do not. */
static int shared_differences(const char *const *a, int64_t step_a, const char *const *b,
                              int64_t step_b, const char **first)
{
    ifd_config_shared_key ka[64], kb[64];
    ck_assert_int_le(ifd_config_nshared(), 64);
    ifd_daemon_config ca, cb;
    ifd_error err;
    RASSERT(parse_into(&ca, NULL, a, &err) == IFD_OK, "%s", err.msg);
    RASSERT(parse_into(&cb, NULL, b, &err) == IFD_OK, "%s", err.msg);
    int n = ifd_config_shared(&ca, step_a, ka);
    ck_assert_int_eq(ifd_config_shared(&cb, step_b, kb), n);
    ck_assert_int_eq(n, ifd_config_nshared());
    int differ = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(ka[i].key, kb[i].key);
        if (ka[i].hash != kb[i].hash && differ++ == 0)
            *first = ka[i].key;
    }
    ifd_daemon_config_free(&ca);
    ifd_daemon_config_free(&cb);
    return differ;
}

START_TEST(shared_settings_differ_only_where_values_do)
{
    ifd_rng rng;
    seed_rng(&rng);
    const char *first = NULL;
    char v1[32], v2[32];
    struct {
        const char *flag, *key;
        const char *a, *b;
    } cases[] = {
        {"--learning-rate", "learning_rate", v1, v2},
        {"--seed", "seed", v1, v2},
        {"--replicas", "replicas", "1", "2"},
        {"--optimizer", "optimizer", "sgd", "adam"},
        {"--summary-every", "summary_every", v1, v2},
        {"--host-call", "host_calls", "class=mean", "class=sum"},
        {"--iterations-per-loop", "iterations_per_loop", "auto", "100"},
    };
    for (int t = 0; t < 50; t++) {
        int c = (int)rand_between(&rng, 0, (int64_t)(sizeof cases / sizeof cases[0]) - 1);
        int64_t x = rand_between(&rng, 1, 1000), y = x + rand_between(&rng, 1, 1000);
        if (strcmp(cases[c].key, "learning_rate") == 0) { /* one float's next value */
            snprintf(v1, sizeof v1, "%.9g", (double)x / 1000.0);
            snprintf(v2, sizeof v2, "%.9g", (double)nextafterf((float)x / 1000.0f, 2.0f));
        } else {
            snprintf(v1, sizeof v1, "%" PRId64, x);
            snprintf(v2, sizeof v2, "%" PRId64, y);
        }
        const char *a[] = {cases[c].flag, cases[c].a, NULL},
                   *b[] = {cases[c].flag, cases[c].b, NULL};
        RASSERT(shared_differences(a, 0, b, 0, &first) == 1, "%s %s vs %s", cases[c].flag,
                cases[c].a, cases[c].b);
        ck_assert_str_eq(first, cases[c].key);
        RASSERT(shared_differences(a, 0, a, 0, &first) == 0, "%s", cases[c].flag);
    }
    /* the starting step (a checkpoint's) */
    int64_t step = rand_between(&rng, 0, 1 << 20);
    ck_assert_int_eq(shared_differences(NULL, step, NULL, step + 1, &first), 1);
    ck_assert_str_eq(first, "the starting global step");
    /* program_config as parsed: spacing and key order do not count, a value does */
    const char *p1[] = {"--program", "charlm", "--program-config",
                        "{\"layers\": 1, \"heads\": 2, \"width\": 4, \"block\": 3, \"vocab\": 9}",
                        NULL},
               *p2[] = {"--program", "charlm", "--program-config",
                        "{ \"vocab\":9,\n \"block\":3, \"width\":4,\"heads\":2,\"layers\":1 }",
                        NULL},
               *p3[] = {"--program", "charlm", "--program-config",
                        "{\"layers\": 1, \"heads\": 2, \"width\": 4, \"block\": 3, \"vocab\": 8}",
                        NULL};
    ck_assert_int_eq(shared_differences(p1, 0, p2, 0, &first), 0);
    ck_assert_int_eq(shared_differences(p1, 0, p3, 0, &first), 1);
    ck_assert_str_eq(first, "program_config");
    /* a host's own endpoints, files, limits and threads are its own */
    const char *
        own_a[] = {"--listen", "ipc:///tmp/a",      "--publish", "tcp://127.0.0.1:7001", "--credit",
                   "5",        "--replica-threads", "1",         "--watchdog",           "3",
                   NULL},
       *own_b[] = {"--listen", "ipc:///tmp/b",      "--publish", "tcp://127.0.0.1:7002", "--credit",
                   "9",        "--replica-threads", "2",         "--watchdog",           "0",
                   NULL};
    ck_assert_int_eq(shared_differences(own_a, 0, own_b, 0, &first), 0);
}
END_TEST

/* ifd_config_agree over a fake job of two hosts whose other host holds b's settings: the
 * sentence names every differing flag and this host's values, in the table's order. */
static int64_t other_host[128];
static int fake_allreduce(void *ctx, int channel, int64_t *vals, int n, ifd_hosts_op op,
                          ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err)
{
    (void)ctx, (void)stop, (void)stop_arg, (void)err;
    ck_assert_int_eq(channel, IFD_HOSTS_LOOP);
    ck_assert_int_eq(op, IFD_HOSTS_MIN);
    for (int i = 0; i < n; i++)
        vals[i] = vals[i] < other_host[i] ? vals[i] : other_host[i];
    return IFD_OK;
}

START_TEST(agree_names_the_settings_that_differ)
{
    const char *a[] = {"--seed", "7", "--learning-rate", "0.5", "--steps", "20", NULL},
               *b[] = {"--seed", "8", "--learning-rate", "0.5", "--steps", "30", NULL};
    ifd_daemon_config ca, cb;
    ifd_error err;
    ck_assert_int_eq(parse_into(&ca, NULL, a, &err), IFD_OK);
    ck_assert_int_eq(parse_into(&cb, NULL, b, &err), IFD_OK);
    ifd_config_shared_key kb[64];
    int n = ifd_config_shared(&cb, 0, kb);
    for (int i = 0; i < n; i++) {
        other_host[i] = kb[i].hash;
        other_host[n + i] = -kb[i].hash;
    }
    static const ifd_hosts_ops ops = {.allreduce_i64 = fake_allreduce};
    ifd_hosts h = {.ops = &ops, .rank = 1, .size = 2};
    ck_assert_int_eq(ifd_config_agree(&ca, 0, &h, &err), IFD_EINVAL);
    ck_assert_str_eq(err.msg, "the hosts differ in --steps, --seed: every host of a run must give "
                              "the same (docs/multihost.md); host 1 of 2 has --steps 20, --seed "
                              "7. No host starts");
    ck_assert_int_eq(ifd_config_agree(&cb, 0, &h, &err), IFD_OK);
    ifd_daemon_config_free(&ca);
    ifd_daemon_config_free(&cb);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tu_tcase(s, "table", 120);
    tcase_add_test(tc, option_ranges_in_and_out);
    tcase_add_test(tc, option_bad_values_name_the_key);
    tcase_add_test(tc, nonempty_options_refuse_the_empty_string);
    tcase_add_test(tc, runtime_errors_name_the_key_given);
    tcase_add_test(tc, rules_name_every_key_as_given);
    tcase_add_test(tc, backend_settings_fill_the_config);
    tcase_add_test(tc, old_field_names_set_the_new_ones);
    tcase_add_test(tc, config_md_lists_every_option);
    tcase_add_test(tc, host_calls_file_and_flags);
    tcase_add_test(tc, program_config_flag_and_key);
    tcase_add_test(tc, help_lists_every_option_and_its_default);
    tcase_add_test(tc, shared_settings_differ_only_where_values_do);
    tcase_add_test(tc, agree_names_the_settings_that_differ);
    return tu_run_suite(s);
}
