#include "host/config_internal.h"
#include "host/tensor_ring.h"
#include "host/eval_metric.h"
#include "outfeed/outfeed_thread.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_BATCH_TENSOR_BYTES ((int64_t)1 << 40) /* one tensor frame of a full batch */

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

/* The name the user gave o; config_internal.h. */
const char *config_display(const ifd_daemon_config *c, const config_opt *o, char *buf, size_t len)
{
    int src = c->key_source[o - config_opts];
    if (src == IFD_KEY_FROM_FILE || (src == IFD_KEY_DEFAULT && c->from_file))
        snprintf(buf, len, "%s", o->key);
    else
        config_flag_name(o, buf, len);
    return buf;
}

/* fmt with every {key} replaced by the name the user gave that key. */
static void expand_names(const ifd_daemon_config *c, const char *fmt, char *out, size_t cap)
{
    size_t at = 0;
    while (*fmt && at + 1 < cap) {
        const char *close = *fmt == '{' ? strchr(fmt, '}') : NULL;
        const config_opt *o = close ? config_find_key(fmt + 1, (size_t)(close - fmt - 1)) : NULL;
        if (o == NULL) {
            out[at++] = *fmt++;
            continue;
        }
        char name[64];
        at += (size_t)snprintf(out + at, cap - at, "%s", config_display(c, o, name, sizeof name));
        at = at < cap ? at : cap - 1;
        fmt = close + 1;
    }
    out[at] = '\0';
}

int config_fail(const ifd_daemon_config *c, ifd_error *err, const char *key, const char *fmt, ...)
{
    char full[IFD_ERROR_MSG_MAX], expanded[IFD_ERROR_MSG_MAX];
    snprintf(full, sizeof full, "%s%s%s%s", key ? "{" : "", key ? key : "", key ? "}: " : "", fmt);
    expand_names(c, full, expanded, sizeof expanded);
    va_list ap;
    va_start(ap, fmt);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    char msg[IFD_ERROR_MSG_MAX];
    vsnprintf(msg, sizeof msg, expanded, ap);
#pragma GCC diagnostic pop
    va_end(ap);
    ifd_error_set(err, IFD_EINVAL, "%s", msg);
    if (key == NULL && fmt[0] == '{') /* "{steps} and {last_step}: ...": the first */
        key = fmt + 1;
    const config_opt *o = key ? config_find_key(key, strcspn(key, "}")) : NULL;
    char name[64];
    if (o)
        ifd_error_mark_key(err, o->key, 0, (int)strlen(config_display(c, o, name, sizeof name)));
    return IFD_EINVAL;
}

/* ---- what the table says of each key alone ------------------------------------------------ */

static int check_option(const ifd_daemon_config *c, const config_opt *o, ifd_error *err)
{
    const char *field = (const char *)c + o->off;
    if (o->flags & OPT_NONEMPTY) {
        const char *v = *(const char *const *)field;
        if ((v && v[0] == '\0') || (v == NULL && o->off == offsetof(ifd_daemon_config, listen)))
            return config_fail(c, err, o->key, "expected %s, got ''", o->expect);
        return IFD_OK;
    }
    if (!(o->flags & OPT_RANGE))
        return IFD_OK;
    double v = o->kind == K_INT   ? *(const int *)field
               : o->kind == K_I64 ? (double)*(const int64_t *)field
                                  : *(const double *)field;
    int low_ok = (o->flags & OPT_OPEN_MIN) ? v > o->min : v >= o->min;
    if (low_ok && v <= o->max)
        return IFD_OK;
    char got[48];
    if (o->kind == K_INT)
        snprintf(got, sizeof got, "%d", *(const int *)field);
    else if (o->kind == K_I64)
        snprintf(got, sizeof got, "%" PRId64, *(const int64_t *)field);
    else
        snprintf(got, sizeof got, "%g", v);
    return config_fail(c, err, o->key, "expected %s, got %s", o->expect, got);
}

/* ---- rules between keys, one a function --------------------------------------------------- */

/* iterations_per_loop: a count of steps, when it is one, is positive. */
static int check_loop(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->run.loop_kind != IFD_LOOP_STEPS || c->run.iterations_per_loop >= 1)
        return IFD_OK;
    return config_fail(c, err, "iterations_per_loop",
                       "expected a positive integer (steps), auto, or a duration such as 2s or "
                       "500ms, got %" PRId64,
                       c->run.iterations_per_loop);
}

/* The daemon's words for the runtime's steps rules: steps and last_step, exactly one (train). */
static int steps_bad(const ifd_config *r)
{
    return r->steps < 0 || r->last_step < 0 ||
           (r->mode == IFD_MODE_TRAIN && (r->steps > 0) == (r->last_step > 0));
}

static int check_steps(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->run.steps < 0)
        return config_fail(c, err, "steps", "expected a positive integer, got %lld",
                           (long long)c->run.steps);
    if (c->run.last_step < 0)
        return config_fail(c, err, "last_step", "expected a positive integer, got %lld",
                           (long long)c->run.last_step);
    if (steps_bad(&c->run))
        return config_fail(c, err, NULL,
                           "{steps} and {last_step}: expected exactly one of them, got %s",
                           c->run.steps > 0 ? "both" : "neither");
    return IFD_OK;
}

/* The runtime's pass, its sentences naming each key as the user gave it; the steps rules are
 * check_steps'. */
static int check_runtime(const ifd_daemon_config *c, ifd_error *err)
{
    ifd_config r = c->run;
    if (steps_bad(&r)) {
        r.steps = 1;
        r.last_step = 0;
    }
    if (ifd_config_validate(&r, err) == IFD_OK)
        return IFD_OK;
    ifd_daemon_config_name_keys(c, err);
    if (strcmp(err->key, "program") == 0 && c->program_libs.n == 0) {
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len,
                 " (a program of your own: load its plugin with --program-lib PATH.so)");
    }
    return IFD_EINVAL;
}

/* A program calls a setting of 0 "not set" (ifd_program_check_setting ends its sentence with
 * IFD_PROGRAM_NOT_SET); when the user gave that 0 (--hidden 0), the sentence says what arrived.
 * The one sentence the daemon rewrites: the program cannot know where its 0 came from. */
static void say_zero_given(const ifd_daemon_config *c, ifd_error *err)
{
    const config_opt *o = err->key[0] ? config_find_key(err->key, strlen(err->key)) : NULL;
    size_t len = strlen(err->msg), tail = strlen(IFD_PROGRAM_NOT_SET);
    if (o && c->key_source[o - config_opts] != IFD_KEY_DEFAULT && len >= tail &&
        strcmp(err->msg + len - tail, IFD_PROGRAM_NOT_SET) == 0)
        snprintf(err->msg + len - tail, sizeof err->msg - (len - tail), ", got 0");
}

/* The program's own settings, and a full batch's tensor frame of a size that the daemon's byte
 * counts (rows x row bytes, ZMQ_MAXMSGSIZE) and the replicas' buffers hold without overflow. */
static int check_program(const ifd_daemon_config *c, ifd_error *err)
{
    ifd_program p;
    if (ifd_program_init(&p, c->run.program, &c->run.settings, err)) {
        say_zero_given(c, err);
        ifd_daemon_config_name_keys(c, err);
        return IFD_EINVAL;
    }
    for (int i = 0; i < p.ninputs; i++) {
        int64_t row = (int64_t)ifd_dtype_size(p.inputs[i].dtype);
        for (int d = 0; d < p.inputs[i].rank; d++)
            row *= p.inputs[i].dims[d] > 0 ? p.inputs[i].dims[d] : 1;
        int64_t most = MAX_BATCH_TENSOR_BYTES / row;
        if (c->run.batch_size > most) {
            int rc =
                config_fail(c, err, "batch_size",
                            "expected at most %" PRId64 " rows (tensor '%s' has %" PRId64
                            " bytes a row, and a batch's tensor at most 2^40 bytes), got %" PRId64,
                            most, p.inputs[i].name, row, c->run.batch_size);
            ifd_program_free(&p);
            return rc;
        }
    }
    ifd_program_free(&p);
    return IFD_OK;
}

/* host_calls: tensors of the program in this mode, specs the reducers know, and each reducer
 * takes its tensor's dtype and shape (outfeed/: the sentence names the tensor and the program's
 * tensors). */
static int check_host_calls(const ifd_daemon_config *c, ifd_error *err)
{
    ifd_program p;
    if ((c->run.nhost_calls == 0 && c->host_call_libs.n == 0) ||
        ifd_program_init(&p, c->run.program, &c->run.settings, err) != IFD_OK)
        return IFD_OK; /* check_program's sentence */
    int rc =
        ifd_outfeed_host_calls_check(&p, c->run.mode, c->run.host_calls, c->run.nhost_calls, err);
    ifd_program_free(&p);
    if (rc == IFD_OK)
        return IFD_OK;
    ifd_daemon_config_name_keys(c, err);
    return rc;
}

static int check_credit(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->credit == 0)
        return IFD_OK;
    if (c->run.input_mode == IFD_INPUT_PER_HOST_V2 && c->credit < c->run.replicas)
        return config_fail(c, err, "credit",
                           "per-host-v2 input takes %d batches (one a replica) for every step, "
                           "and a producer streaming alone must be able to have them all in "
                           "flight; expected 0 (auto) or at least %d, got %d",
                           c->run.replicas, c->run.replicas, c->credit);
    if (c->credit < c->max_steps_per_message)
        return config_fail(c, err, "credit",
                           "a message of {max_steps_per_message} (%d) steps costs that many "
                           "credits; expected 0 (auto) or at least %d, got %d",
                           c->max_steps_per_message, c->max_steps_per_message, c->credit);
    return IFD_OK;
}

static int check_producers(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->max_connections != 0 &&
        (c->max_connections < c->max_producers || c->max_connections > 65536))
        return config_fail(c, err, "max_connections",
                           "expected 0 (auto) or {max_producers} (%d) to 65536, got %d",
                           c->max_producers, c->max_connections);
    if (c->expect_producers < 0 || c->expect_producers > c->max_producers)
        return config_fail(c, err, "expect_producers", "expected 0 to {max_producers} (%d), got %d",
                           c->max_producers, c->expect_producers);
    return IFD_OK;
}

static int check_input_bound(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->max_abs_input > 0 && !c->check_finite)
        return config_fail(c, err, "max_abs_input",
                           "expected {check_finite} on (the bound is part of that check), got "
                           "{check_finite} off");
    return IFD_OK;
}

static int check_tensor_shm(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->tensor_shm_bytes > 0 && c->tensor_shm_bytes < IFD_TENSOR_RING_MIN)
        return config_fail(c, err, "tensor_shm_bytes",
                           "expected 0 (no ring) or at least %lld bytes, got %lld",
                           (long long)IFD_TENSOR_RING_MIN, (long long)c->tensor_shm_bytes);
    return IFD_OK;
}

/* weight_decay given for an optimizer that has none would be ignored: said instead (Keras 3
 * decays with any optimizer; here only adamw does). */
static int check_weight_decay(const ifd_daemon_config *c, ifd_error *err)
{
    const config_opt *o = config_find_key("weight_decay", strlen("weight_decay"));
    if (o && c->key_source[o - config_opts] != IFD_KEY_DEFAULT &&
        c->run.optimizer.kind != IFD_OPT_ADAMW)
        return config_fail(c, err, "weight_decay",
                           "expected {optimizer} adamw (the optimizer with decoupled weight "
                           "decay), got {optimizer} %s",
                           ifd_optimizer_name(c->run.optimizer.kind));
    return IFD_OK;
}

static int check_predictions(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->predictions && c->run.mode != IFD_MODE_PREDICT)
        return config_fail(c, err, "predictions",
                           "expected only in predict mode, got a path in %s mode",
                           ifd_mode_name(c->run.mode));
    return IFD_OK;
}

static int check_start(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->resume && c->checkpoint_dir == NULL)
        return config_fail(c, err, "resume",
                           "expected {checkpoint_dir}, the folder to resume from, got none");
    if (c->resume && c->checkpoint)
        return config_fail(c, err, NULL,
                           "{resume} and {checkpoint}: expected at most one (resume takes the "
                           "latest checkpoint of {checkpoint_dir}, checkpoint the file it "
                           "names), got both");
    return IFD_OK;
}

static int check_security(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->curve_secret_key == NULL && (c->authorized_keys || c->admin_keys))
        return config_fail(c, err, c->authorized_keys ? "authorized_keys" : "admin_keys",
                           "expected {curve_secret_key} with it (the daemon's key pair; CURVE is "
                           "off without one), got none");
    if (c->curve_secret_key && c->authorized_keys == NULL)
        return config_fail(c, err, "authorized_keys",
                           "CURVE ({curve_secret_key}) needs the producers' public keys: expected "
                           "a file, got none");
    if (c->curve_secret_key || c->insecure)
        return IFD_OK;
    const char *eps[] = {c->listen, c->publish, c->control};
    const char *names[] = {"listen", "publish", "control"};
    for (int i = 0; i < 3; i++)
        if (eps[i] && eps[i][0] && !ifd_endpoint_is_local(eps[i]))
            return config_fail(c, err, names[i],
                               "'%s' is reachable from other machines and nothing on it is "
                               "authenticated or encrypted: expected a loopback, ipc:// or "
                               "inproc:// endpoint, or --curve-secret-key (with "
                               "--authorized-keys) to turn CURVE on, or --insecure to bind it "
                               "all the same",
                               eps[i]);
    return IFD_OK;
}

/* Evaluation during training: eval_every is train's (every input mode: per-core's eval session
 * runs per-host-v2, host/eval_hook.c); keep_best and early_stopping need it (keep_best a folder
 * too), each a metric name. */
static int check_eval(const ifd_daemon_config *c, ifd_error *err)
{
    if (c->eval_every > 0 && c->run.mode != IFD_MODE_TRAIN)
        return config_fail(c, err, "eval_every",
                           "evaluates during training: expected 0 in %s mode, got %" PRId64,
                           ifd_mode_name(c->run.mode), c->eval_every);
    if (c->keep_best && c->eval_every == 0)
        return config_fail(c, err, "keep_best",
                           "keeps the best eval's checkpoint: expected {eval_every} N with it, "
                           "got none");
    if (c->keep_best && c->checkpoint_dir == NULL)
        return config_fail(c, err, "keep_best",
                           "writes CHECKPOINT_DIR/best: expected {checkpoint_dir} with it, got "
                           "none");
    if (c->keep_best && !ifd_eval_metric_valid(c->keep_best))
        return config_fail(c, err, "keep_best",
                           "expected an eval summary key (letters, digits, '_') such as loss or "
                           "accuracy, got '%s'",
                           c->keep_best);
    if (c->early_stopping == NULL)
        return IFD_OK;
    if (c->eval_every == 0)
        return config_fail(c, err, "early_stopping",
                           "stops on evals: expected {eval_every} N with it, got none");
    char metric[64];
    int64_t patience;
    if (ifd_eval_parse_early_stopping(c->early_stopping, metric, sizeof metric, &patience))
        return config_fail(c, err, "early_stopping",
                           "expected METRIC:PATIENCE (an eval summary key and a count of evals "
                           ">= 1, such as loss:3), got '%s'",
                           c->early_stopping);
    return IFD_OK;
}

typedef int (*config_rule)(const ifd_daemon_config *c, ifd_error *err);

/* In this order: the loop and the steps, the runtime's pass, the program, then the daemon's
 * keys alone (the table) and the rules between them. */
static const config_rule rules_before[] = {check_loop, check_runtime, check_steps, check_program,
                                           check_host_calls};
static const config_rule rules_after[] = {check_credit,       check_producers,   check_input_bound,
                                          check_weight_decay, check_predictions, check_start,
                                          check_security,     check_eval,        check_tensor_shm};

/* The key a config error's sentence is about (the daemon and the runtime give a setting one
 * name), named as the user gave it. */
void ifd_daemon_config_name_keys(const ifd_daemon_config *c, ifd_error *err)
{
    const config_opt *o = err && err->key[0] ? config_find_key(err->key, strlen(err->key)) : NULL;
    if (o == NULL)
        return;
    char name[64];
    config_display(c, o, name, sizeof name);
    /* "setting 'hidden'" of a program's sentence stays in a file's words */
    if (err->key_len == (int)strlen(err->key) || name[0] == '-')
        ifd_error_name_key(err, name);
}

int ifd_daemon_config_validate(const ifd_daemon_config *c, ifd_error *err)
{
    ifd_error scratch;
    if (err == NULL)
        err = &scratch;
    /* each rule's own code, the one its sentence carries (a host call's dtype: IFD_EDTYPE) */
    int rc = IFD_OK;
    for (size_t i = 0; rc == IFD_OK && i < sizeof rules_before / sizeof rules_before[0]; i++)
        rc = rules_before[i](c, err);
    for (int i = 0; rc == IFD_OK && i < config_nopts; i++)
        rc = check_option(c, &config_opts[i], err);
    for (size_t i = 0; rc == IFD_OK && i < sizeof rules_after / sizeof rules_after[0]; i++)
        rc = rules_after[i](c, err);
    return rc;
}
