#include "host/config_internal.h"

#include <inttypes.h>
#include <string.h>

#define MAX_BATCH_TENSOR_BYTES ((int64_t)1 << 40) /* one tensor frame of a full batch */

/* Runtime keys whose daemon key is shorter: the runtime's sentence names the daemon's. */
static const char *const renamed_keys[][2] = {
    {"initial_infeed_sleep_secs", "initial_infeed_sleep"},
    {"watchdog_secs", "watchdog"},
};

static void rename_key(ifd_error *err)
{
    for (size_t i = 0; i < sizeof renamed_keys / sizeof renamed_keys[0]; i++) {
        size_t n = strlen(renamed_keys[i][0]);
        size_t m = strlen(renamed_keys[i][1]); /* <= n */
        if (strncmp(err->msg, renamed_keys[i][0], n) == 0 && err->msg[n] == ':') {
            memmove(err->msg + m, err->msg + n, strlen(err->msg + n) + 1);
            memcpy(err->msg, renamed_keys[i][1], m);
            return;
        }
    }
}

int ifd_endpoint_is_local(const char *e)
{
    if (e == NULL)
        return 0;
    if (strncmp(e, "ipc://", 6) == 0 || strncmp(e, "inproc://", 9) == 0)
        return 1;
    if (strncmp(e, "tcp://", 6) != 0)
        return 0;
    const char *host = e + 6, *colon = strrchr(host, ':');
    if (colon == NULL)
        return 0;
    size_t n = (size_t)(colon - host);
    if ((n == 9 && strncmp(host, "localhost", 9) == 0) ||
        (n == 5 && strncmp(host, "[::1]", 5) == 0))
        return 1;
    /* 127.a.b.c, each part a decimal number below 256 */
    if (n < 9 || n > 15 || strncmp(host, "127.", 4) != 0)
        return 0;
    int parts = 2, digits = 0, value = 0; /* "127." and the one being read */
    for (size_t i = 4; i < n; i++) {
        if (host[i] == '.') {
            if (digits == 0)
                return 0;
            parts++;
            digits = value = 0;
        } else if (host[i] >= '0' && host[i] <= '9' && digits < 3) {
            value = value * 10 + (host[i] - '0');
            digits++;
            if (value > 255)
                return 0;
        } else {
            return 0;
        }
    }
    return parts == 4 && digits > 0;
}

static int validate_security(const ifd_daemon_config *c, ifd_error *err)
{
    const char *files[] = {c->curve_secret_key, c->authorized_keys, c->admin_keys};
    const char *keys[] = {"curve_secret_key", "authorized_keys", "admin_keys"};
    for (int i = 0; i < 3; i++)
        if (files[i] && files[i][0] == '\0')
            return ifd_error_set(err, IFD_EINVAL, "%s: expected a file, got ''", keys[i]);
    if (c->curve_secret_key == NULL && (c->authorized_keys || c->admin_keys))
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: expected curve_secret_key with it (the daemon's key pair; "
                             "CURVE is off without one), got none",
                             c->authorized_keys ? "authorized_keys" : "admin_keys");
    if (c->curve_secret_key && c->authorized_keys == NULL)
        return ifd_error_set(err, IFD_EINVAL,
                             "authorized_keys: CURVE (curve_secret_key) needs the producers' "
                             "public keys: expected a file, got none");
    if (c->curve_secret_key || c->insecure)
        return IFD_OK;
    const char *eps[] = {c->listen, c->publish, c->control};
    const char *names[] = {"listen", "publish", "control"};
    for (int i = 0; i < 3; i++)
        if (eps[i] && eps[i][0] && !ifd_endpoint_is_local(eps[i]))
            return ifd_error_set(err, IFD_EINVAL,
                                 "%s: '%s' is reachable from other machines and nothing on it is "
                                 "authenticated or encrypted: expected a loopback, ipc:// or "
                                 "inproc:// endpoint, or --curve-secret-key (with "
                                 "--authorized-keys) to turn CURVE on, or --insecure to bind it "
                                 "all the same",
                                 names[i], eps[i]);
    return IFD_OK;
}

/* A program calls a setting of 0 "not set" (include/infeed/program.h); when the user gave that
 * 0 (--hidden 0), the sentence says what arrived instead. */
#define NOT_SET ", and it is not set"
static void given_zero(const ifd_daemon_config *c, ifd_error *err)
{
    size_t len = strlen(err->msg), tail = strlen(NOT_SET);
    const char *at = strstr(err->msg, "setting '");
    if (at == NULL || len < tail || strcmp(err->msg + len - tail, NOT_SET) != 0)
        return;
    at += 9;
    const char *end = strchr(at, '\'');
    const config_opt *o = end ? config_find_key(at, (size_t)(end - at)) : NULL;
    if (o && c->key_source[o - config_opts] != IFD_KEY_DEFAULT)
        snprintf(err->msg + len - tail, sizeof err->msg - (len - tail), ", got 0");
}

/* An unknown program when no plugin is loaded: say how a program of one's own is loaded. */
static void hint_program_lib(const ifd_daemon_config *c, ifd_error *err)
{
    if (err == NULL || c->run.program == NULL || c->nprogram_libs > 0 ||
        ifd_program_find(c->run.program) != NULL || strncmp(err->msg, "program: ", 9) != 0)
        return;
    size_t len = strlen(err->msg);
    snprintf(err->msg + len, sizeof err->msg - len,
             " (a program of your own: load its plugin with --program-lib PATH.so)");
}

static int validate_keys(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->run.loop_kind == IFD_LOOP_STEPS && c->run.iterations_per_loop < 1)
        return ifd_error_set(err, IFD_EINVAL,
                             "iterations_per_loop: expected a positive integer (steps), auto, or a "
                             "duration such as 2s or 500ms, got %" PRId64,
                             c->run.iterations_per_loop);
    if (!(c->run.max_loop_secs > 0.0 && c->run.max_loop_secs <= 86400.0))
        return ifd_error_set(err, IFD_EINVAL,
                             "max_loop_seconds: expected seconds above 0, at most 86400, got %g",
                             c->run.max_loop_secs);
    /* The runtime names the key num_steps, the daemon steps: check that pair here, and the rest
     * with the runtime's pass in the order it uses. */
    ifd_config r = c->run;
    int steps_bad = r.num_steps < 0 || r.last_step < 0 ||
                    (r.mode == IFD_MODE_TRAIN && (r.num_steps > 0) == (r.last_step > 0));
    if (steps_bad) {
        r.num_steps = 1;
        r.last_step = 0;
    }
    if (ifd_config_validate(&r, err)) {
        rename_key(err);
        hint_program_lib(c, err);
        return IFD_EINVAL;
    }
    if (c->run.num_steps < 0)
        return ifd_error_set(err, IFD_EINVAL, "steps: expected a positive integer, got %lld",
                             (long long)c->run.num_steps);
    if (c->run.last_step < 0)
        return ifd_error_set(err, IFD_EINVAL, "last_step: expected a positive integer, got %lld",
                             (long long)c->run.last_step);
    if (steps_bad)
        return ifd_error_set(err, IFD_EINVAL,
                             "steps and last_step: expected exactly one of them, got %s",
                             c->run.num_steps > 0 ? "both" : "neither");
    ifd_program p;
    if (ifd_program_init(&p, r.program, &r.settings, err)) {
        hint_program_lib(c, err);
        given_zero(c, err);
        return IFD_EINVAL;
    }
    /* A full batch's tensor frame must have a size that the daemon's byte counts (rows x row
     * bytes, ZMQ_MAXMSGSIZE) and the replicas' buffers can hold without overflowing. */
    for (int i = 0; i < p.ninputs; i++) {
        int64_t row = (int64_t)ifd_dtype_size(p.inputs[i].dtype);
        for (int d = 0; d < p.inputs[i].rank; d++)
            row *= p.inputs[i].dims[d] > 0 ? p.inputs[i].dims[d] : 1;
        int64_t most = MAX_BATCH_TENSOR_BYTES / row;
        if (c->run.batch_size > most)
            return ifd_error_set(
                err, IFD_EINVAL,
                "batch_size: expected at most %" PRId64 " rows (tensor '%s' has %" PRId64
                " bytes a row, and a batch's tensor at most 2^40 bytes), got %" PRId64,
                most, p.inputs[i].name, row, c->run.batch_size);
    }
    if (c->listen == NULL || c->listen[0] == '\0')
        return ifd_error_set(err, IFD_EINVAL, "listen: expected a ZeroMQ endpoint, got ''");
    if (c->credit < 0 || c->credit > 65536)
        return ifd_error_set(err, IFD_EINVAL, "credit: expected 0 (auto) to 65536, got %d",
                             c->credit);
    if (c->run.input_mode == IFD_INPUT_PER_HOST_V2 && c->credit > 0 && c->credit < c->run.replicas)
        return ifd_error_set(err, IFD_EINVAL,
                             "credit: per-host-v2 input takes %d batches (one a replica) for every "
                             "step, and a producer streaming alone must be able to have them all "
                             "in flight; expected 0 (auto) or at least %d, got %d",
                             c->run.replicas, c->run.replicas, c->credit);
    if (c->replica_threads < 0 || c->replica_threads > 1024)
        return ifd_error_set(err, IFD_EINVAL, "replica_threads: expected 0 (auto) to 1024, got %d",
                             c->replica_threads);
    if (c->max_steps_per_message < 1 || c->max_steps_per_message > 65536)
        return ifd_error_set(err, IFD_EINVAL, "max_steps_per_message: expected 1 to 65536, got %d",
                             c->max_steps_per_message);
    if (c->credit > 0 && c->credit < c->max_steps_per_message)
        return ifd_error_set(
            err, IFD_EINVAL,
            "credit: a message of max_steps_per_message (%d) steps costs that many "
            "credits; expected 0 (auto) or at least %d, got %d",
            c->max_steps_per_message, c->max_steps_per_message, c->credit);
    if (c->max_producers < 1 || c->max_producers > 4096)
        return ifd_error_set(err, IFD_EINVAL, "max_producers: expected 1 to 4096, got %d",
                             c->max_producers);
    if (!(c->max_abs_input >= 0 && c->max_abs_input <= 3.4e38))
        return ifd_error_set(err, IFD_EINVAL,
                             "max_abs_input: expected 0 (no bound) or a positive float32 "
                             "magnitude, got %g",
                             c->max_abs_input);
    if (c->max_abs_input > 0 && !c->check_finite)
        return ifd_error_set(err, IFD_EINVAL,
                             "max_abs_input: expected check_finite on (the bound is part of that "
                             "check), got check_finite off");
    if (!(c->producer_timeout >= 0 && c->producer_timeout <= 86400))
        return ifd_error_set(err, IFD_EINVAL,
                             "producer_timeout: expected 0 (never) to 86400 seconds, got %g",
                             c->producer_timeout);
    if (c->max_connections != 0 &&
        (c->max_connections < c->max_producers || c->max_connections > 65536))
        return ifd_error_set(err, IFD_EINVAL,
                             "max_connections: expected 0 (auto) or max_producers (%d) to 65536, "
                             "got %d",
                             c->max_producers, c->max_connections);
    if (c->predictions && c->run.mode != IFD_MODE_PREDICT)
        return ifd_error_set(err, IFD_EINVAL,
                             "predictions: expected only in predict mode, got a path in %s mode",
                             ifd_mode_name(c->run.mode));
    if (c->expect_producers < 0 || c->expect_producers > c->max_producers)
        return ifd_error_set(err, IFD_EINVAL,
                             "expect_producers: expected 0 to max_producers (%d), got %d",
                             c->max_producers, c->expect_producers);
    if (c->checkpoint_dir && c->checkpoint_dir[0] == '\0')
        return ifd_error_set(err, IFD_EINVAL, "checkpoint_dir: expected a folder, got ''");
    if (c->checkpoint_every < 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "checkpoint_every: expected 0 (only at the end) or more steps, got "
                             "%" PRId64,
                             c->checkpoint_every);
    if (c->keep_checkpoints < 1)
        return ifd_error_set(err, IFD_EINVAL, "keep_checkpoints: expected 1 or more, got %d",
                             c->keep_checkpoints);
    if (c->resume && c->checkpoint_dir == NULL)
        return ifd_error_set(
            err, IFD_EINVAL,
            "resume: expected checkpoint_dir, the folder to resume from, got none");
    if (c->resume && c->checkpoint)
        return ifd_error_set(err, IFD_EINVAL,
                             "resume and checkpoint: expected at most one (resume takes the latest "
                             "checkpoint of checkpoint_dir, checkpoint the file it names), got "
                             "both");
    if (c->checkpoint && c->checkpoint[0] == '\0')
        return ifd_error_set(err, IFD_EINVAL, "checkpoint: expected a file, got ''");
    return validate_security(c, err);
}

/* How the user gave key o: "--last-step" (a flag, or unset without a config file) or
 * "last_step" (the config file). */
static void display_name(const ifd_daemon_config *c, const config_opt *o, char *buf, size_t len)
{
    int src = c->key_source[o - config_opts];
    if (src == IFD_KEY_FROM_FILE || (src == IFD_KEY_DEFAULT && c->from_file))
        snprintf(buf, len, "%s", o->key);
    else
        config_flag_name(o, buf, len);
}

static int is_word_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
}

/* Appends s[0, n) to buf at *at, truncating. */
static void put(char *buf, size_t cap, size_t *at, const char *s, size_t n)
{
    if (*at + 1 >= cap)
        return;
    if (n > cap - 1 - *at)
        n = cap - 1 - *at;
    memcpy(buf + *at, s, n);
    *at += n;
    buf[*at] = '\0';
}

/* Rewrites the keys a validation sentence names into the names the user gave: every key in the
 * part before the first ": " ("steps and last_step: ..."), "setting 'hidden'" of a program's
 * settings, and anywhere else the keys with an '_' (plain words such as "steps" or "replicas"
 * in a sentence's body stay as they are). */
void ifd_daemon_config_name_keys(const ifd_daemon_config *c, ifd_error *err)
{
    char out[sizeof err->msg];
    size_t at = 0;
    out[0] = '\0';
    const char *m = err->msg, *colon = strstr(m, ": ");
    size_t head = colon ? (size_t)(colon - m) : 0;
    for (size_t i = 0; m[i];) {
        /* A quoted value ('/data/checkpoint_dir') stays as it is; an apostrophe inside a word
         * (replica's) opens nothing. */
        if (m[i] == '\'' && (i == 0 || !is_word_char(m[i - 1])) &&
            !(i >= 8 && strncmp(m + i - 8, "setting ", 8) == 0)) {
            size_t j = i + 1;
            while (m[j] && !(m[j] == '\'' && !is_word_char(m[j + 1])))
                j++;
            size_t n = m[j] ? j + 1 - i : j - i;
            put(out, sizeof out, &at, m + i, n);
            i += n;
            continue;
        }
        if (!is_word_char(m[i]) || (i > 0 && is_word_char(m[i - 1]))) {
            put(out, sizeof out, &at, m + i, 1);
            i++;
            continue;
        }
        size_t n = 0;
        while (is_word_char(m[i + n]))
            n++;
        const config_opt *o = config_find_key(m + i, n);
        /* "program 'mlp': ..." names the program, not the key */
        int in_head = i + n <= head && strncmp(m + i + n, " '", 2) != 0;
        int setting = i >= 9 && strncmp(m + i - 9, "setting '", 9) == 0 && m[i + n] == '\'';
        if (o && (in_head || setting || memchr(m + i, '_', n))) {
            char name[64];
            display_name(c, o, name, sizeof name);
            if (setting && name[0] == '-') { /* "setting 'hidden'" -> "--hidden" */
                at -= at >= 9 ? 9 : at;
                out[at] = '\0';
                put(out, sizeof out, &at, name, strlen(name));
                i += n + 1;
                continue;
            }
            put(out, sizeof out, &at, name, strlen(name));
        } else {
            put(out, sizeof out, &at, m + i, n);
        }
        i += n;
    }
    memcpy(err->msg, out, at + 1);
}

int ifd_daemon_config_validate(const ifd_daemon_config *c, ifd_error *err)
{
    int rc = validate_keys(c, err);
    if (rc && err)
        ifd_daemon_config_name_keys(c, err);
    return rc;
}
