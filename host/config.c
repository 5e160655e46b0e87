#include "host/config.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* K_SWITCH: a K_BOOL whose flag takes no value (--resume; --resume=off); K_LIBS: program_lib,
 * a repeatable flag and a string or an array of strings in the file */
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
    K_LIBS
} opt_kind;

typedef struct opt {
    const char *key; /* the JSON key; the flag is --key with '_' as '-' */
    opt_kind kind;
    size_t off;
    const char *metavar;
    const char *help;
    const char *choices; /* K_ENUM, K_LOG: "a, b or c" */
    int (*parse_enum)(const char *s, int *out);
} opt;

#define OFF(field) offsetof(ifd_daemon_config, field)
#define MAX_BATCH_TENSOR_BYTES ((int64_t)1 << 40) /* one tensor frame of a full batch */

static int parse_mode(const char *s, int *out)
{
    ifd_mode v;
    int rc = ifd_mode_parse(s, &v);
    *out = (int)v;
    return rc;
}
static int parse_input_mode(const char *s, int *out)
{
    ifd_input_mode v;
    int rc = ifd_input_mode_parse(s, &v);
    *out = (int)v;
    return rc;
}
static int parse_optimizer(const char *s, int *out)
{
    ifd_optimizer_kind v;
    int rc = ifd_optimizer_parse(s, &v);
    *out = (int)v;
    return rc;
}
static int parse_reduction(const char *s, int *out)
{
    ifd_loss_reduction v;
    int rc = ifd_loss_reduction_parse(s, &v);
    *out = (int)v;
    return rc;
}

static const char *mode_name(int v)
{
    return ifd_mode_name((ifd_mode)v);
}
static const char *input_mode_name(int v)
{
    return ifd_input_mode_name((ifd_input_mode)v);
}
static const char *optimizer_name(int v)
{
    return ifd_optimizer_name((ifd_optimizer_kind)v);
}
static const char *reduction_name(int v)
{
    return ifd_loss_reduction_name((ifd_loss_reduction)v);
}

static const opt opts[] = {
    {"listen", K_STR, OFF(listen), "ENDPOINT", "ingest ROUTER endpoint producers connect to", NULL,
     NULL},
    {"publish", K_STR, OFF(publish), "ENDPOINT", "summaries PUB endpoint (\"\" disables it)", NULL,
     NULL},
    {"control", K_STR, OFF(control), "ENDPOINT",
     "control REP endpoint: {\"cmd\":\"status\"} or {\"cmd\":\"stop\"} (\"\" disables it)", NULL,
     NULL},
    {"summaries", K_STR, OFF(summaries), "PATH",
     "also append every summary to this JSON Lines file", NULL, NULL},
    {"predictions", K_STR, OFF(predictions), "PATH",
     "predict mode: also write every prediction, a row a line, to this JSON Lines file", NULL,
     NULL},
    {"backend", K_STR, OFF(run.backend), "NAME", "device backend: cpu or cuda", NULL, NULL},
    {"replicas", K_INT, OFF(run.replicas), "N", "replicas (cpu: threads; cuda: GPUs)", NULL, NULL},
    {"program", K_STR, OFF(run.program), "NAME",
     "the model: linear, softmax, mlp, read (benchmark) or one a --program-lib registers", NULL,
     NULL},
    {"program_lib", K_LIBS, OFF(program_libs), "PATH.so",
     "load a program plugin (a shared library built against include/infeed/program.h: "
     "examples/custom_program); repeat the flag for several",
     NULL, NULL},
    {"features", K_I64, OFF(run.settings.features), "D", "program setting: columns of x", NULL,
     NULL},
    {"classes", K_I64, OFF(run.settings.classes), "K",
     "program setting: classes (softmax, mlp) or outputs (linear)", NULL, NULL},
    {"hidden", K_I64, OFF(run.settings.hidden), "H",
     "program setting: hidden width (mlp; plugins may read it too)", NULL, NULL},
    {"mode", K_ENUM, OFF(run.mode), "MODE",
     "train; eval (--steps steps in one loop, one summary); predict (until every producer "
     "ended, predictions back to each producer)",
     "train, eval or predict", parse_mode},
    {"input_mode", K_ENUM, OFF(run.input_mode), "MODE",
     "how batches become replica shards: per-host (split), per-host-v2 (one a replica), per-core "
     "(HELLO names the replica) or broadcast (every replica the same)",
     "per-host, per-host-v2, per-core or broadcast", parse_input_mode},
    {"batch_size", K_I64, OFF(run.batch_size), "ROWS",
     "global batch size: rows in every batch, divisible by replicas", NULL, NULL},
    {"iterations_per_loop", K_I64, OFF(run.iterations_per_loop), "N",
     "steps per device loop without a host round trip", NULL, NULL},
    {"steps", K_I64, OFF(run.num_steps), "N",
     "steps to run (train: exactly one of steps and last_step; eval: required)", NULL, NULL},
    {"last_step", K_I64, OFF(run.last_step), "N", "the global step to stop at", NULL, NULL},
    {"initial_global_step", K_I64, OFF(run.initial_global_step), "N",
     "the global step the run starts from", NULL, NULL},
    {"optimizer", K_ENUM, OFF(run.optimizer.kind), "NAME", "sgd, momentum or adam",
     "sgd, momentum or adam", parse_optimizer},
    {"learning_rate", K_F32, OFF(run.optimizer.learning_rate), "LR", "learning rate", NULL, NULL},
    {"momentum", K_F32, OFF(run.optimizer.momentum), "M", "momentum optimizer: momentum", NULL,
     NULL},
    {"beta1", K_F32, OFF(run.optimizer.beta1), "B1", "adam: beta1", NULL, NULL},
    {"beta2", K_F32, OFF(run.optimizer.beta2), "B2", "adam: beta2", NULL, NULL},
    {"epsilon", K_F32, OFF(run.optimizer.epsilon), "EPS", "adam: epsilon", NULL, NULL},
    {"loss_reduction", K_ENUM, OFF(run.loss_reduction), "R",
     "mean (loss scaled by 1/replicas) or sum", "mean or sum", parse_reduction},
    {"summary_every", K_I64, OFF(run.summary_every), "N",
     "steps between train summaries (0: only at the end)", NULL, NULL},
    {"seed", K_U64, OFF(run.seed), "S", "seed of the parameter initialisation", NULL, NULL},
    {"infeed_depth", K_INT, OFF(run.infeed_depth), "N", "shards buffered per replica", NULL, NULL},
    {"outfeed_depth", K_INT, OFF(run.outfeed_depth), "N", "step records buffered per replica", NULL,
     NULL},
    {"initial_infeed_sleep", K_F64, OFF(run.initial_infeed_sleep_secs), "SECONDS",
     "the infeed waits this long before it takes the first batch", NULL, NULL},
    {"watchdog", K_F64, OFF(run.watchdog_secs), "SECONDS",
     "end the run (exit 1) when no step completes for this long; 0: off", NULL, NULL},
    {"credit", K_INT, OFF(credit), "N",
     "batches a producer may have in flight; 0: auto, 16 MiB of batches, 8 to 256", NULL, NULL},
    {"max_steps_per_message", K_INT, OFF(max_steps_per_message), "K",
     "train, eval: a BATCH may carry k x batch_size rows, k <= K: k steps in one message, each "
     "costing a credit (raises an auto credit to K)",
     NULL, NULL},
    {"max_producers", K_INT, OFF(max_producers), "N", "producers connected at once", NULL, NULL},
    {"max_connections", K_INT, OFF(max_connections), "N",
     "connections each socket accepts at once, more are closed; 0: auto, 2 x max_producers, at "
     "least 256",
     NULL, NULL},
    {"expect_producers", K_INT, OFF(expect_producers), "N",
     "the input ends once N producers sent END (0: once every producer welcomed so far did)", NULL,
     NULL},
    {"producer_timeout", K_F64, OFF(producer_timeout), "SECONDS",
     "a producer whose connection is gone, or that holds credit and sends nothing, for this long "
     "loses its slot and counts as ended (0: never)",
     NULL, NULL},
    {"check_finite", K_BOOL, OFF(check_finite), "on|off",
     "reject a batch whose float inputs hold NaN or infinity (ERANGE naming tensor, row, value)",
     NULL, NULL},
    {"shm", K_BOOL, OFF(shm), "on|off",
     "offer a shared-memory pool to producers on this host that ask for one (HELLO \"shm\"): "
     "batches are written in place and only descriptors cross the socket",
     NULL, NULL},
    {"max_abs_input", K_F64, OFF(max_abs_input), "X",
     "reject a batch with a float input of magnitude above X (0: no bound; needs check_finite)",
     NULL, NULL},
    {"log_level", K_LOG, OFF(log_level), "LEVEL", "error, warn, info or debug",
     "error, warn, info or debug", NULL},
    {"cuda_graphs", K_BOOL, OFF(cuda_graphs), "on|off",
     "cuda backend: capture each step in a CUDA Graph", NULL, NULL},
    {"checkpoint_dir", K_STR, OFF(checkpoint_dir), "DIR",
     "train: write checkpoints into this folder (docs/checkpoint.md); eval, predict: start from "
     "its latest",
     NULL, NULL},
    {"checkpoint_every", K_I64, OFF(checkpoint_every), "N",
     "steps between checkpoints, at loop ends (0: only at the end of the run)", NULL, NULL},
    {"keep_checkpoints", K_INT, OFF(keep_checkpoints), "N", "checkpoints kept in checkpoint_dir",
     NULL, NULL},
    {"resume", K_SWITCH, OFF(resume), "",
     "continue from the latest checkpoint in checkpoint_dir (an error when there is none)", NULL,
     NULL},
    {"checkpoint", K_STR, OFF(checkpoint), "PATH",
     "start from this checkpoint file (train: as --resume does; eval, predict: its parameters)",
     NULL, NULL},
    {"curve_secret_key", K_STR, OFF(curve_secret_key), "FILE",
     "turns CURVE on for all three sockets: the daemon's key pair (infeedd keygen PREFIX writes "
     "PREFIX.key); needs authorized_keys",
     NULL, NULL},
    {"authorized_keys", K_STR, OFF(authorized_keys), "FILE",
     "CURVE: producer public keys allowed on the ingest socket and to subscribe, a key a line, "
     "each optionally followed by the names it may use (KEY name1,name2)",
     NULL, NULL},
    {"admin_keys", K_STR, OFF(admin_keys), "FILE",
     "CURVE: public keys allowed on the control socket (status, stop) and to subscribe", NULL,
     NULL},
    {"insecure", K_SWITCH, OFF(insecure), "",
     "without CURVE, bind endpoints other than loopback, ipc and inproc all the same", NULL, NULL},
};

#define NOPTS ((int)(sizeof opts / sizeof opts[0]))
_Static_assert(sizeof opts / sizeof opts[0] <= sizeof((ifd_daemon_config *)0)->key_source,
               "key_source has a byte per option");

void ifd_daemon_config_defaults(ifd_daemon_config *c)
{
    memset(c, 0, sizeof *c);
    ifd_config_defaults(&c->run);
    c->listen = "tcp://127.0.0.1:5555";
    c->publish = "tcp://127.0.0.1:5556";
    c->control = "tcp://127.0.0.1:5557";
    c->summaries = NULL;
    c->credit = 0; /* auto: ifd_proto_auto_credit */
    c->max_producers = 64;
    c->max_steps_per_message = 1;
    c->check_finite = 1;
    c->shm = 1;
    c->producer_timeout = 60;
    c->log_level = IFD_LOG_INFO;
    c->cuda_graphs = 1;
    c->checkpoint_every = 1000;
    c->keep_checkpoints = 5;
    c->load_program_lib = ifd_program_load_plugin;
    c->checkpoint_writer = 1;
}

int ifd_daemon_max_connections(const ifd_daemon_config *c)
{
    if (c->max_connections > 0)
        return c->max_connections;
    return c->max_producers * 2 > 256 ? c->max_producers * 2 : 256;
}

void ifd_daemon_config_free(ifd_daemon_config *c)
{
    for (int i = 0; i < c->nstrings; i++)
        free(c->strings[i]);
    c->nstrings = 0;
}

static const opt *find_key(const char *key, size_t len)
{
    for (int i = 0; i < NOPTS; i++)
        if (strlen(opts[i].key) == len && strncmp(opts[i].key, key, len) == 0)
            return &opts[i];
    return NULL;
}

/* --iterations-per-loop -> iterations_per_loop */
static const opt *find_flag(const char *flag, size_t len)
{
    char key[64];
    if (len >= sizeof key)
        return NULL;
    for (size_t i = 0; i < len; i++)
        key[i] = flag[i] == '-' ? '_' : flag[i];
    return find_key(key, len);
}

static void flag_name(const opt *o, char *buf, size_t len)
{
    snprintf(buf, len, "--%s", o->key);
    for (char *p = buf + 2; *p; p++)
        if (*p == '_')
            *p = '-';
}

static int parse_i64(const char *s, int64_t *out)
{
    if (s == NULL || *s == '\0')
        return IFD_EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end != '\0')
        return IFD_EINVAL;
    *out = v;
    return IFD_OK;
}

/* Sets o from its text form. where: "flag --x" or "config file f: key 'x'". */
static int set_value(ifd_daemon_config *c, const opt *o, const char *val, const char *where,
                     ifd_error *err)
{
    char *field = (char *)c + o->off;
    int64_t i64;
    switch (o->kind) {
    case K_LIBS:
        if (val[0] == '\0')
            return ifd_error_set(err, IFD_EINVAL, "%s: expected a file name, got ''", where);
        if (c->nprogram_libs == IFD_DAEMON_MAX_PROGRAM_LIBS)
            return ifd_error_set(err, IFD_EINVAL, "%s: expected at most %d program libraries",
                                 where, IFD_DAEMON_MAX_PROGRAM_LIBS);
        if (c->nstrings == (int)(sizeof c->strings / sizeof c->strings[0]))
            return ifd_error_set(err, IFD_EINVAL, "%s: too many string values", where);
        c->strings[c->nstrings] = strdup(val);
        if (c->strings[c->nstrings] == NULL)
            return ifd_error_set(err, IFD_ENOMEM, "%s", where);
        c->program_libs[c->nprogram_libs++] = c->strings[c->nstrings++];
        return IFD_OK;
    case K_STR: {
        if (c->nstrings == (int)(sizeof c->strings / sizeof c->strings[0]))
            return ifd_error_set(err, IFD_EINVAL, "%s: too many string values", where);
        char *copy = strdup(val);
        if (copy == NULL)
            return ifd_error_set(err, IFD_ENOMEM, "%s", where);
        c->strings[c->nstrings++] = copy;
        *(const char **)field = copy;
        return IFD_OK;
    }
    case K_INT:
        if (parse_i64(val, &i64) || i64 < INT32_MIN || i64 > INT32_MAX)
            return ifd_error_set(err, IFD_EINVAL, "%s: expected an integer, got '%s'", where, val);
        *(int *)field = (int)i64;
        return IFD_OK;
    case K_I64:
        if (parse_i64(val, &i64))
            return ifd_error_set(err, IFD_EINVAL, "%s: expected an integer, got '%s'", where, val);
        *(int64_t *)field = i64;
        return IFD_OK;
    case K_U64: {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(val, &end, 10);
        if (*val == '\0' || strchr(val, '-') || errno || *end != '\0')
            return ifd_error_set(err, IFD_EINVAL,
                                 "%s: expected an integer from 0 to 2^64-1, got '%s'", where, val);
        *(uint64_t *)field = v;
        return IFD_OK;
    }
    case K_F32:
    case K_F64: {
        char *end;
        errno = 0;
        double v = strtod(val, &end);
        if (*val == '\0' || errno || *end != '\0' || !isfinite(v))
            return ifd_error_set(err, IFD_EINVAL, "%s: expected a number, got '%s'", where, val);
        if (o->kind == K_F32)
            *(float *)field = (float)v;
        else
            *(double *)field = v;
        return IFD_OK;
    }
    case K_ENUM: {
        int v;
        if (o->parse_enum(val, &v))
            return ifd_error_set(err, IFD_EINVAL, "%s: expected %s, got '%s'", where, o->choices,
                                 val);
        *(int *)field = v;
        return IFD_OK;
    }
    case K_LOG: {
        int v;
        if (ifd_log_level_parse(val, &v))
            return ifd_error_set(err, IFD_EINVAL, "%s: expected %s, got '%s'", where, o->choices,
                                 val);
        *(int *)field = v;
        return IFD_OK;
    }
    case K_BOOL:
    case K_SWITCH:
        if (strcmp(val, "on") == 0 || strcmp(val, "true") == 0 || strcmp(val, "1") == 0)
            *(int *)field = 1;
        else if (strcmp(val, "off") == 0 || strcmp(val, "false") == 0 || strcmp(val, "0") == 0)
            *(int *)field = 0;
        else
            return ifd_error_set(err, IFD_EINVAL, "%s: expected on or off, got '%s'", where, val);
        return IFD_OK;
    }
    return ifd_error_set(err, IFD_EINTERNAL, "%s: unknown kind", where);
}

const char *ifd_json_describe(const json_t *v, char *buf, size_t len)
{
    if (v == NULL) {
        snprintf(buf, len, "nothing");
        return buf;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        snprintf(buf, len, "an object");
        break;
    case JSON_ARRAY:
        snprintf(buf, len, "an array");
        break;
    case JSON_STRING:
        snprintf(buf, len, "a string of %zu bytes", json_string_length(v));
        break;
    case JSON_INTEGER:
        snprintf(buf, len, "the integer %" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        snprintf(buf, len, "the number %g", json_real_value(v));
        break;
    case JSON_TRUE:
    case JSON_FALSE:
        snprintf(buf, len, "%s", json_is_true(v) ? "true" : "false");
        break;
    case JSON_NULL:
        snprintf(buf, len, "null");
        break;
    }
    return buf;
}

/* program_lib in the file: a path or an array of them, which replaces the list so far. */
static int apply_json_libs(ifd_daemon_config *c, const opt *o, const json_t *v, const char *where,
                           ifd_error *err)
{
    c->nprogram_libs = 0;
    if (json_is_string(v))
        return set_value(c, o, json_string_value(v), where, err);
    if (json_is_array(v)) {
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e)
        {
            if (!json_is_string(e)) {
                char got[96];
                return ifd_error_set(err, IFD_EINVAL,
                                     "%s: element %zu: expected a file name (a string), got %s",
                                     where, i, ifd_json_describe(e, got, sizeof got));
            }
            int rc = set_value(c, o, json_string_value(e), where, err);
            if (rc)
                return rc;
        }
        return IFD_OK;
    }
    char got[96];
    return ifd_error_set(err, IFD_EINVAL, "%s: expected a file name or an array of them, got %s",
                         where, ifd_json_describe(v, got, sizeof got));
}

int ifd_daemon_config_apply_json(ifd_daemon_config *c, const char *text, const char *source,
                                 ifd_error *err)
{
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return ifd_error_set(err, IFD_EINVAL, "%s: line %d, column %d: %s", source, je.line,
                             je.column, je.text);
    int rc = IFD_OK;
    if (!json_is_object(root)) {
        char got[96];
        rc = ifd_error_set(err, IFD_EINVAL, "%s: expected a JSON object of config keys, got %s",
                           source, ifd_json_describe(root, got, sizeof got));
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        const opt *o = find_key(key, strlen(key));
        char where[160];
        snprintf(where, sizeof where, "%s: key '%s'", source, key);
        if (o == NULL) {
            rc = ifd_error_set(err, IFD_EINVAL,
                               "%s: unknown key '%s' (the keys are the flags of infeedd --help "
                               "with '_' for '-')",
                               source, key);
            goto done;
        }
        char buf[64];
        const char *val = NULL, *want = NULL;
        if (o->kind == K_LIBS) {
            rc = apply_json_libs(c, o, v, where, err);
            if (rc)
                goto done;
            continue;
        }
        switch (o->kind) {
        case K_LIBS:
        case K_STR:
        case K_ENUM:
        case K_LOG:
            if (json_is_string(v))
                val = json_string_value(v);
            else
                want = "a string";
            break;
        case K_INT:
        case K_I64:
        case K_U64:
            if (json_is_integer(v)) {
                snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
                val = buf;
            } else {
                want = "an integer";
            }
            break;
        case K_F32:
        case K_F64:
            if (json_is_number(v)) {
                snprintf(buf, sizeof buf, "%.17g", json_number_value(v));
                val = buf;
            } else {
                want = "a number";
            }
            break;
        case K_BOOL:
        case K_SWITCH:
            if (json_is_boolean(v))
                val = json_is_true(v) ? "on" : "off";
            else if (json_is_string(v))
                val = json_string_value(v);
            else
                want = "true or false";
            break;
        }
        if (want) {
            char got[96];
            rc = ifd_error_set(err, IFD_EINVAL, "%s: expected %s, got %s", where, want,
                               ifd_json_describe(v, got, sizeof got));
            goto done;
        }
        rc = set_value(c, o, val, where, err);
        if (rc)
            goto done;
        c->key_source[o - opts] = IFD_KEY_FROM_FILE;
    }
done:
    json_decref(root);
    return rc;
}

/* The default reader of --config: the file's bytes, at most 16 MiB. */
static int read_file(void *arg, const char *path, char **out, ifd_error *err)
{
    (void)arg;
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return ifd_error_set(err, IFD_EINVAL, "--config: cannot open '%s': %s", path,
                             strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = IFD_OK;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            if (cap > (1u << 24)) {
                rc = ifd_error_set(err, IFD_EINVAL, "--config: '%s' is larger than 16 MiB", path);
                goto out;
            }
            char *t = realloc(text, cap);
            if (t == NULL) {
                rc = ifd_error_set(err, IFD_ENOMEM, "--config: '%s'", path);
                goto out;
            }
            text = t;
        }
        size_t n = fread(text + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        rc = ifd_error_set(err, IFD_EINVAL, "--config: cannot read '%s'", path);
        goto out;
    }
    text[len] = '\0';
    *out = text;
    text = NULL;
out:
    free(text);
    fclose(f);
    return rc;
}

static int load_file(ifd_daemon_config *c, const char *path, ifd_config_reader read, void *arg,
                     ifd_error *err)
{
    char *text = NULL;
    int rc = read(arg, path, &text, err);
    if (rc)
        return rc;
    char source[300];
    snprintf(source, sizeof source, "config file %s", path);
    c->from_file = 1;
    rc = ifd_daemon_config_apply_json(c, text, source, err);
    free(text);
    return rc;
}

/* Splits "--key=value"; *val is NULL without '=' (the caller takes the next argument when the
 * flag wants a value). */
static int flag_at(char **argv, int i, const char **name, size_t *name_len, const char **val,
                   ifd_error *err)
{
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
        return ifd_error_set(err, IFD_EINVAL,
                             "unexpected argument '%s': infeedd takes only flags (see --help)", a);
    *name = a + 2;
    const char *eq = strchr(*name, '=');
    *name_len = eq ? (size_t)(eq - *name) : strlen(*name);
    *val = eq ? eq + 1 : NULL;
    return IFD_OK;
}

int ifd_daemon_config_parse(ifd_daemon_config *c, int argc, char **argv, FILE *out, int *exit_now,
                            ifd_error *err)
{
    return ifd_daemon_config_parse_with(c, argc, argv, out, exit_now, read_file, NULL, err);
}

int ifd_daemon_config_parse_with(ifd_daemon_config *c, int argc, char **argv, FILE *out,
                                 int *exit_now, ifd_config_reader read, void *arg, ifd_error *err)
{
    *exit_now = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            ifd_daemon_config_usage(out);
            *exit_now = 1;
            return IFD_OK;
        }
        if (strcmp(argv[i], "--version") == 0) {
            fprintf(out, "infeedd %s (protocol 1)\n", IFD_VERSION_STRING);
            *exit_now = 1;
            return IFD_OK;
        }
    }
    /* The file first, wherever --config stands. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0) {
            const char *path = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (path == NULL || *path == '\0')
                return ifd_error_set(err, IFD_EINVAL, "flag --config: expected a file name");
            int rc = load_file(c, path, read, arg, err);
            if (rc)
                return rc;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *name = NULL, *val = NULL;
        size_t len = 0;
        int rc = flag_at(argv, i, &name, &len, &val, err);
        if (rc)
            return rc;
        if (len == 6 && strncmp(name, "config", 6) == 0) {
            i += val == NULL; /* its value was read first */
            continue;
        }
        const opt *o = find_flag(name, len);
        if (o == NULL)
            return ifd_error_set(err, IFD_EINVAL,
                                 "unknown flag '--%.*s' (infeedd --help lists them)", (int)len,
                                 name);
        if (val == NULL && o->kind == K_SWITCH)
            val = "on";
        else if (val == NULL && i + 1 < argc)
            val = argv[++i];
        char where[80];
        flag_name(o, where + 5, sizeof where - 5);
        memcpy(where, "flag ", 5);
        if (val == NULL)
            return ifd_error_set(err, IFD_EINVAL, "%s: expected a value (%s)", where, o->metavar);
        if (o->kind == K_LIBS && !c->program_libs_from_flags) {
            c->nprogram_libs = 0; /* the flags replace the file's list */
            c->program_libs_from_flags = 1;
        }
        rc = set_value(c, o, val, where, err);
        if (rc)
            return rc;
        c->key_source[o - opts] = IFD_KEY_FROM_FLAG;
    }
    /* The plugins first: the validation pass looks up the program by name. */
    for (int i = 0; i < c->nprogram_libs && c->load_program_lib; i++) {
        int rc = c->load_program_lib(c->program_libs[i], err);
        if (rc)
            return ifd_error_prefix(
                err, "%s", c->program_libs_from_flags ? "flag --program-lib" : "program_lib");
    }
    return ifd_daemon_config_validate(c, err);
}

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
static void display_name(const ifd_daemon_config *c, const opt *o, char *buf, size_t len)
{
    int src = c->key_source[o - opts];
    if (src == IFD_KEY_FROM_FILE || (src == IFD_KEY_DEFAULT && c->from_file))
        snprintf(buf, len, "%s", o->key);
    else
        flag_name(o, buf, len);
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
        const opt *o = find_key(m + i, n);
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

static void format_default(const opt *o, const ifd_daemon_config *d, char *buf, size_t len)
{
    const char *field = (const char *)d + o->off;
    switch (o->kind) {
    case K_LIBS:
        snprintf(buf, len, "none");
        return;
    case K_STR: {
        const char *s = *(const char *const *)field;
        snprintf(buf, len, "%s", s == NULL ? "none" : s[0] ? s : "\"\"");
        return;
    }
    case K_INT:
        snprintf(buf, len, "%d", *(const int *)field);
        return;
    case K_I64: {
        int64_t v = *(const int64_t *)field;
        if (v == 0 && (strcmp(o->key, "steps") == 0 || strcmp(o->key, "last_step") == 0 ||
                       strcmp(o->key, "features") == 0 || strcmp(o->key, "classes") == 0 ||
                       strcmp(o->key, "hidden") == 0))
            snprintf(buf, len, "unset");
        else
            snprintf(buf, len, "%" PRId64, v);
        return;
    }
    case K_U64:
        snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field);
        return;
    case K_F32:
        snprintf(buf, len, "%g", (double)*(const float *)field);
        return;
    case K_F64:
        snprintf(buf, len, "%g", *(const double *)field);
        return;
    case K_ENUM: {
        int v = *(const int *)field;
        const char *name = o->parse_enum == parse_mode         ? mode_name(v)
                           : o->parse_enum == parse_input_mode ? input_mode_name(v)
                           : o->parse_enum == parse_optimizer  ? optimizer_name(v)
                                                               : reduction_name(v);
        snprintf(buf, len, "%s", name);
        return;
    }
    case K_LOG:
        snprintf(buf, len, "%s", ifd_log_level_name(*(const int *)field));
        return;
    case K_BOOL:
    case K_SWITCH:
        snprintf(buf, len, "%s", *(const int *)field ? "on" : "off");
        return;
    }
}

void ifd_daemon_config_usage(FILE *out)
{
    ifd_daemon_config d;
    ifd_daemon_config_defaults(&d);
    fprintf(out,
            "Usage: infeedd [--config FILE.json] [flags]\n"
            "       infeedd keygen PREFIX\n"
            "\n"
            "The infeed host daemon: producers stream batches to --listen (docs/protocol.md); the\n"
            "daemon shards them over the replicas, runs device loops of --iterations-per-loop\n"
            "steps and publishes JSON summaries on --publish and to --summaries.\n"
            "\n"
            "Settings apply in this order: defaults, the --config file (a JSON object whose keys\n"
            "are the flag names with '_' for '-'), then the flags. Flags take '--flag VALUE' or\n"
            "'--flag=VALUE'.\n"
            "\n"
            "  --config FILE.json                     config file (applied before the flags)\n");
    for (int i = 0; i < NOPTS; i++) {
        char flag[64], left[96], def[96];
        flag_name(&opts[i], flag, sizeof flag);
        snprintf(left, sizeof left, "%s%s%s", flag, opts[i].metavar[0] ? " " : "", opts[i].metavar);
        format_default(&opts[i], &d, def, sizeof def);
        fprintf(out, "  %-38s %s (default: %s)\n", left, opts[i].help, def);
    }
    fprintf(out,
            "  --help                                 this text\n"
            "  --version                              the version and the protocol version\n"
            "\n"
            "infeedd keygen PREFIX writes a new CURVE key pair: PREFIX.key (the secret key, mode\n"
            "0600: give it to --curve-secret-key or to a client) and PREFIX.pub (the public key:\n"
            "a line for --authorized-keys or --admin-keys, or the server key of the clients); it\n"
            "never overwrites a file. Without --curve-secret-key only loopback, ipc:// and\n"
            "inproc:// endpoints are bound unless --insecure is given.\n"
            "\n"
            "Several hosts (docs/multihost.md): started by an MPI launcher (mpirun -np H\n"
            "infeedd ..., or srun), H daemons train one model; --batch-size is the global batch,\n"
            "each host takes batch_size / H rows a step from its own producers. {rank} in\n"
            "--listen, --publish, --control, --summaries, --predictions, --checkpoint-dir and\n"
            "--checkpoint is replaced by the host's rank (ipc:///run/infeed/in-{rank}); without\n"
            "it, summaries, PUB and checkpoints are rank 0's only. A checkpoint holds every\n"
            "host's producer positions; --resume needs as many hosts as wrote it.\n"
            "\n"
            "Signals: SIGINT or SIGTERM stops at the end of the current loop, flushes the\n"
            "summaries, writes the end event and exits 0; a second signal aborts at once.\n"
            "Exit status: 0 the run ended well; 1 a runtime error (the end summary carries it);\n"
            "2 a usage or config error, or a checkpoint that cannot start the run (missing,\n"
            "corrupt, of another program, settings or optimizer, or of another number of\n"
            "hosts).\n");
    ifd_daemon_config_free(&d);
}
