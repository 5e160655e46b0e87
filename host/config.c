#include "host/config_internal.h"
#include "core/userdir.h"
#include "host/limits.h"
#include "host/tensor_ring.h"
#include "loop/config_ranges.h"
#include <infeed/host_call.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define OFF(field) offsetof(ifd_daemon_config, field)

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
static int parse_schedule(const char *s, int *out)
{
    ifd_lr_schedule v;
    int rc = ifd_lr_schedule_parse(s, &v);
    *out = (int)v;
    return rc;
}
static const char *schedule_name(int v)
{
    return ifd_lr_schedule_name((ifd_lr_schedule)v);
}
static const char *reduction_name(int v)
{
    return ifd_loss_reduction_name((ifd_loss_reduction)v);
}

static const config_names modes = {parse_mode, mode_name, "train, eval or predict"};
static const config_names input_modes = {parse_input_mode, input_mode_name,
                                         "per-host, per-host-v2, per-core or broadcast"};
static const config_names optimizers = {parse_optimizer, optimizer_name,
                                        "sgd, momentum, adam or adamw"};
static const config_names schedules = {parse_schedule, schedule_name, "constant, cosine or linear"};
static const config_names reductions = {parse_reduction, reduction_name, "mean or sum"};
static const config_names log_levels = {ifd_log_level_parse, ifd_log_level_name,
                                        "error, warn, info or debug"};

#define I64_MAX 9.2e18
#define SECS 86400.0 /* a day: longer waits are a mistake, not a setting */

/* Every option: its key (and so its flag), its type and field, --help's metavar and text; then
 * what the validation pass checks of it alone. Rules between keys are config_validate.c's. */
#define OPT(k_, kind_, field_, meta_, help_, ...)                                                  \
    {                                                                                              \
        .key = k_, .kind = kind_, .off = OFF(field_), .metavar = meta_, .help = help_, __VA_ARGS__ \
    }
#define RANGE(lo, hi, text) .flags = OPT_RANGE, .min = lo, .max = hi, .expect = text
#define NONEMPTY(text) .flags = OPT_NONEMPTY, .expect = text

const config_opt config_opts[] = {
    OPT("listen", K_STR, listen, "ENDPOINT", "ingest ROUTER endpoint producers connect to",
        NONEMPTY("a ZeroMQ endpoint")),
    OPT("publish", K_STR, publish, "ENDPOINT", "summaries PUB endpoint (\"\" disables it)"),
    OPT("tensor_rate", K_I64, tensor_rate, "BYTES",
        "the most bytes a second of outfeed tensors published to subscribers that ask for them "
        "(a subscription to \"tensor:NAME\"); messages beyond it are dropped, never waited for",
        RANGE(1, I64_MAX, "1 or more bytes a second")),
    OPT("tensor_shm_bytes", K_I64, tensor_shm_bytes, "BYTES",
        "the ring in shared memory (made when first asked for) whose data subscribers on this "
        "host read in place of data messages (a subscription to \"tensor-shm:NAME\"); a slow "
        "reader loses what the daemon writes over, never slows it; 0: no ring, such "
        "subscribers get data messages",
        RANGE(0, 1099511627776.0, "0 (no ring) or 65536 to 2^40 bytes")),
    OPT("control", K_STR, control, "ENDPOINT",
        "control REP endpoint: {\"cmd\":\"status\"} or {\"cmd\":\"stop\"} (\"\" disables it); "
        "the default is an ipc socket in a folder only this user may enter ($XDG_RUNTIME_DIR/"
        "infeed, else /tmp/infeed-UID), which infeedctl finds by itself"),
    OPT("summaries", K_STR, summaries, "PATH", "also append every summary to this JSON Lines file"),
    OPT("predictions", K_STR, predictions, "PATH",
        "predict mode: also write every prediction, a row a line, to this JSON Lines file"),
    OPT("ready_file", K_STR, ready_file, "PATH",
        "once every socket is bound and served, write {\"listen\", \"publish\", \"control\", "
        "\"pid\"} to PATH (the endpoints bound, a port chosen for tcp://127.0.0.1:* resolved; "
        "written to a temporary file and renamed); removed when infeedd exits"),
    OPT("backend", K_STR, run.backend, "NAME", "device backend: cpu or cuda"),
    OPT("replicas", K_INT, run.replicas, "N", "replicas (cpu: threads; cuda: GPUs)"),
    OPT("program", K_STR, run.program, "NAME",
        "the model: linear, softmax, mlp, read (benchmark), charlm (a transformer LM: "
        "--program-config) or one a --program-lib registers"),
    OPT("program_lib", K_LIBS, program_libs, "PATH.so",
        "load a program plugin (a shared library built against include/infeed/program.h: "
        "examples/custom_program); repeat the flag for several"),
    OPT("host_call_lib", K_LIBS, host_call_libs, "PATH.so",
        "load a host call plugin (a shared library built against include/infeed/host_call.h: "
        "examples/host_call): each of its host calls runs over every train and eval step's "
        "outfeed tensors and writes its values into the summaries' host_calls; repeat the flag "
        "for several"),
    OPT("features", K_I64, run.settings.features, "D", "program setting: columns of x",
        .flags = OPT_UNSET),
    OPT("classes", K_I64, run.settings.classes, "K",
        "program setting: classes (softmax, mlp) or outputs (linear)", .flags = OPT_UNSET),
    OPT("hidden", K_I64, run.settings.hidden, "H",
        "program setting: hidden width (mlp; plugins may read it too)", .flags = OPT_UNSET),
    OPT("program_config", K_STR, run.settings.config, "JSON",
        "the program's own settings, a JSON object (in the file an object or its text), which the "
        "program checks: e.g. '{\"layers\": 2, \"heads\": 4}'; recorded in checkpoints, and a "
        "resume with other settings is refused",
        .flags = OPT_OBJECT),
    OPT("mode", K_ENUM, run.mode, "MODE",
        "train; eval (--steps steps in one loop, one summary); predict (until every producer "
        "ended, predictions back to each producer)",
        .names = &modes),
    OPT("input_mode", K_ENUM, run.input_mode, "MODE",
        "how batches become replica shards: per-host (split), per-host-v2 (one a replica), "
        "per-core (HELLO names the replica) or broadcast (every replica the same)",
        .names = &input_modes),
    OPT("batch_size", K_I64, run.batch_size, "ROWS",
        "global batch size: rows in every batch, divisible by replicas"),
    OPT("iterations_per_loop", K_LOOP, run.iterations_per_loop, "N|auto|TIME",
        "steps per device loop without a host round trip; auto: the daemon measures the step and "
        "the loop boundary and picks loops whose boundary costs under 1% of their time, at most "
        "--max-loop-seconds long; a duration (2s, 1.5s, 500ms): loops of about that long"),
    OPT("max_loop_seconds", K_F64, run.max_loop_seconds, "SECONDS",
        "with --iterations-per-loop auto: the longest a loop may take, so that a stop, a "
        "checkpoint and a summary come within it"),
    OPT("steps", K_I64, run.steps, "N",
        "steps to run (train: exactly one of steps and last_step; eval: required)",
        .flags = OPT_UNSET),
    OPT("last_step", K_I64, run.last_step, "N", "the global step to stop at", .flags = OPT_UNSET),
    OPT("initial_global_step", K_I64, run.initial_global_step, "N",
        "the global step the run starts from"),
    OPT("optimizer", K_ENUM, run.optimizer.kind, "NAME",
        "sgd, momentum, adam or adamw (adam with decoupled weight decay)", .names = &optimizers),
    OPT("learning_rate", K_F32, run.optimizer.learning_rate, "LR",
        "learning rate (with --lr-schedule: the rate after the warmup, where a decay starts)"),
    OPT("momentum", K_F32, run.optimizer.momentum, "M", "momentum optimizer: momentum"),
    OPT("beta1", K_F32, run.optimizer.beta1, "B1", "adam, adamw: beta1"),
    OPT("beta2", K_F32, run.optimizer.beta2, "B2", "adam, adamw: beta2"),
    OPT("epsilon", K_F32, run.optimizer.epsilon, "EPS", "adam, adamw: epsilon"),
    OPT("weight_decay", K_F32, run.optimizer.weight_decay, "WD",
        "adamw: each update first takes p * WD * (the update's learning rate) from every "
        "parameter but those the program leaves out (biases, norms)"),
    OPT("clip_norm", K_F32, run.optimizer.clip_norm, "C",
        "scale the all-reduced gradients by C / their global L2 norm when that is above C (the "
        "summaries' grad_norm is the norm before; 0: no clipping)"),
    OPT("lr_schedule", K_ENUM, run.optimizer.lr_schedule, "NAME",
        "constant, cosine or linear: the learning rate rises linearly from 0 over "
        "--warmup-steps updates, then stays (constant) or falls to --min-learning-rate at "
        "update --decay-steps (cosine, linear) and stays there",
        .names = &schedules),
    OPT("warmup_steps", K_I64, run.optimizer.warmup_steps, "N",
        "updates of linear warmup from 0 to --learning-rate (0: none)"),
    OPT("decay_steps", K_I64, run.optimizer.decay_steps, "N",
        "cosine, linear: the update at which the decay reaches --min-learning-rate, warmup "
        "included (more than --warmup-steps)",
        .flags = OPT_UNSET),
    OPT("min_learning_rate", K_F32, run.optimizer.min_learning_rate, "LR",
        "cosine, linear: the rate the decay ends at, at most --learning-rate"),
    OPT("loss_reduction", K_ENUM, run.loss_reduction, "R",
        "mean (loss scaled by 1/replicas) or sum", .names = &reductions),
    OPT("max_skipped_steps", K_I64, run.max_skipped_steps, "N",
        "train, eval: a step whose gradients or loss are not finite is skipped on every replica "
        "and host (no update) and counted; this many skipped in a row end the run (exit 1; 0: "
        "never)"),
    OPT("summary_every", K_I64, run.summary_every, "N",
        "steps between train summaries (0: only at the end)"),
    OPT("host_calls", K_CALLS, run.host_calls, "NAME=SPEC[,SPEC...]",
        "train, eval: reduce outfeed tensor NAME with built-in host calls (mean, sum, min, max, "
        "last, histogram, quantiles, confusion, class_accuracy, precision_recall, top_k:K, auc; "
        "docs/config.md) into the summary's host_calls; repeat the flag for several tensors. "
        "Not given, a classifier reports class=class_accuracy and confidence=histogram; none: "
        "no host call",
        .flag = "host-call"),
    OPT("seed", K_U64, run.seed, "S", "seed of the parameter initialisation"),
    OPT("infeed_depth", K_INT, run.infeed_depth, "N", "shards buffered per replica"),
    OPT("outfeed_depth", K_INT, run.outfeed_depth, "N", "step records buffered per replica"),
    OPT("initial_infeed_sleep", K_F64, run.initial_infeed_sleep, "SECONDS",
        "the infeed waits this long before it takes the first batch"),
    OPT("watchdog", K_F64, run.watchdog, "SECONDS",
        "end the run (exit 1) when no step completes for this long; 0: off"),
    OPT("credit", K_INT, credit, "N",
        "batches a producer may have in flight; 0: auto, 16 MiB of batches, 8 to 256",
        RANGE(0, 65536, "0 (auto) to 65536")),
    OPT("max_steps_per_message", K_INT, max_steps_per_message, "K",
        "train, eval: a BATCH may carry k x batch_size rows, k <= K: k steps in one message, "
        "each costing a credit (raises an auto credit to K)",
        RANGE(1, 65536, "1 to 65536")),
    OPT("max_producers", K_INT, max_producers, "N", "producers connected at once",
        RANGE(1, 4096, "1 to 4096")),
    OPT("max_connections", K_INT, max_connections, "N",
        "connections each socket accepts at once, more are closed; 0: auto, 2 x max_producers, "
        "at least 256"),
    OPT("expect_producers", K_INT, expect_producers, "N",
        "the input ends once N producers sent END (0: once every producer welcomed so far did)"),
    OPT("producer_timeout", K_F64, producer_timeout, "SECONDS",
        "a producer whose connection is gone, or that holds credit and sends nothing, for this "
        "long loses its slot and counts as ended (0: never)",
        RANGE(0, SECS, "0 (never) to 86400 seconds")),
    OPT("check_finite", K_BOOL, check_finite, "on|off",
        "reject a batch whose float inputs hold NaN or infinity (ERANGE naming tensor, row, "
        "value)"),
    OPT("shm", K_BOOL, shm, "on|off",
        "offer a shared-memory pool to producers on this host that ask for one (HELLO \"shm\"): "
        "batches are written in place and only descriptors cross the socket"),
    OPT("max_abs_input", K_F64, max_abs_input, "X",
        "reject a batch with a float input of magnitude above X (0: no bound; needs "
        "check_finite)",
        RANGE(0, 3.4e38, "0 (no bound) or a positive float32 magnitude")),
    OPT("log_level", K_ENUM, log_level, "LEVEL", "error, warn, info or debug",
        .names = &log_levels),
    OPT("replica_threads", K_INT, run.replica_threads, "N",
        "cpu backend: threads each replica's large products and its update run on, its own and "
        "N - 1 helpers (0: auto, the CPUs this process may use / replicas, 1 to 8; 1 when "
        "OPENBLAS_NUM_THREADS is set; unset, IFD_REPLICA_THREADS in the environment gives it)"),
    OPT("blas_kernel", K_STR, run.blas_kernel, "NAME",
        "cpu backend: the OpenBLAS kernel; auto replaces a generic fallback below what the CPU "
        "runs (as OpenBLAS 0.3.21 picks Prescott on CPUs newer than itself), keep leaves the "
        "library's pick, or a kernel name: SkylakeX, Haswell, Zen, Sandybridge, ... "
        "(OPENBLAS_CORETYPE, when set, is obeyed under auto)"),
    OPT("cuda_graphs", K_BOOL, run.cuda_graphs, "on|off",
        "cuda backend: capture each step in a CUDA Graph"),
    OPT("checkpoint_dir", K_STR, checkpoint_dir, "DIR",
        "train: write checkpoints into this folder (docs/checkpoint.md); eval, predict: start "
        "from its latest",
        NONEMPTY("a folder")),
    OPT("checkpoint_every", K_I64, checkpoint_every, "N",
        "steps between checkpoints, at loop ends (0: only at the end of the run)",
        RANGE(0, I64_MAX, "0 (only at the end) or more steps")),
    OPT("keep_checkpoints", K_INT, keep_checkpoints, "N", "checkpoints kept in checkpoint_dir",
        RANGE(1, INT32_MAX, "1 or more")),
    OPT("resume", K_SWITCH, resume, "",
        "continue from the latest checkpoint in checkpoint_dir (an error when there is none)"),
    OPT("checkpoint", K_STR, checkpoint, "PATH",
        "start from this checkpoint file (train: as --resume does; eval, predict: its "
        "parameters)",
        NONEMPTY("a file")),
    OPT("eval_every", K_I64, eval_every, "N",
        "train: evaluate the current parameters on the eval set (the batches of producers whose "
        "HELLO says \"role\": \"eval\") at the first loop end at or past every multiple of N "
        "steps and at a last step off a multiple, and publish an eval summary (0: never; several "
        "hosts: each evaluates its own eval producers' share, the summary is the union's)",
        RANGE(0, I64_MAX, "0 (never) or more steps")),
    OPT("eval_memory", K_I64, eval_memory, "BYTES",
        "with --eval-every: the most bytes the eval set may hold in daemon memory (a batch counts "
        "its tensors, each rounded up to 64 bytes, and 2048 bytes of bookkeeping)",
        RANGE(1, I64_MAX, "1 or more bytes")),
    OPT("keep_best", K_STR, keep_best, "METRIC",
        "with --eval-every and --checkpoint-dir: after each eval that improved METRIC (an eval "
        "summary key: loss and keys ending in _loss are minimized, others such as accuracy "
        "maximized), write its checkpoint to CHECKPOINT_DIR/best and best.json beside it",
        NONEMPTY("an eval summary key such as loss or accuracy")),
    OPT("early_stopping", K_STR, early_stopping, "METRIC:PATIENCE",
        "with --eval-every: end the run (reason early_stopping) after PATIENCE evals in a row "
        "without an improvement of METRIC (as --keep-best compares)",
        NONEMPTY("METRIC:PATIENCE, such as loss:3")),
    OPT("curve_secret_key", K_STR, curve_secret_key, "FILE",
        "turns CURVE on for all three sockets: the daemon's key pair (infeedd keygen PREFIX "
        "writes PREFIX.key); needs authorized_keys",
        NONEMPTY("a file")),
    OPT("authorized_keys", K_STR, authorized_keys, "FILE",
        "CURVE: producer public keys allowed on the ingest socket and to subscribe, a key a line, "
        "each optionally followed by the names it may use (KEY name1,name2)",
        NONEMPTY("a file")),
    OPT("admin_keys", K_STR, admin_keys, "FILE",
        "CURVE: public keys allowed on the control socket (status, stop) and to subscribe",
        NONEMPTY("a file")),
    OPT("insecure", K_SWITCH, insecure, "",
        "without CURVE, bind endpoints other than loopback, ipc and inproc all the same"),
};

const int config_nopts = (int)(sizeof config_opts / sizeof config_opts[0]);
_Static_assert(sizeof config_opts / sizeof config_opts[0] <=
                   sizeof((ifd_daemon_config *)0)->key_source,
               "key_source has a byte per option");

void ifd_daemon_config_defaults(ifd_daemon_config *c)
{
    memset(c, 0, sizeof *c);
    ifd_config_defaults(&c->run);
    c->listen = "tcp://127.0.0.1:5555";
    c->publish = "tcp://127.0.0.1:5556";
    c->tensor_rate = IFD_PUB_TENSOR_RATE;
    c->tensor_shm_bytes = IFD_TENSOR_RING_BYTES;
    ifd_default_control(c->default_control, sizeof c->default_control);
    c->control = c->default_control;
    c->summaries = NULL;
    c->credit = 0; /* auto: ifd_proto_auto_credit */
    c->max_producers = 64;
    c->max_steps_per_message = 1;
    c->check_finite = 1;
    c->shm = 1;
    c->producer_timeout = 60;
    c->log_level = IFD_LOG_INFO;
    c->checkpoint_every = 1000;
    c->keep_checkpoints = 5;
    c->program_libs.load = ifd_program_load_plugin;
    c->host_call_libs.load = ifd_host_call_load_plugin;
    c->checkpoint_writer = 1;
    c->eval_memory = (int64_t)1 << 30;
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

const config_opt *config_find_key(const char *key, size_t len)
{
    for (int i = 0; i < config_nopts; i++)
        if (strlen(config_opts[i].key) == len && strncmp(config_opts[i].key, key, len) == 0)
            return &config_opts[i];
    return NULL;
}

/* --iterations-per-loop -> iterations_per_loop */
const config_opt *config_find_flag(const char *flag, size_t len)
{
    for (int i = 0; i < config_nopts; i++)
        if (config_opts[i].flag && strlen(config_opts[i].flag) == len &&
            strncmp(config_opts[i].flag, flag, len) == 0)
            return &config_opts[i];
    char key[64];
    if (len >= sizeof key)
        return NULL;
    for (size_t i = 0; i < len; i++)
        key[i] = flag[i] == '-' ? '_' : flag[i];
    return config_find_key(key, len);
}

void config_flag_name(const config_opt *o, char *buf, size_t len)
{
    snprintf(buf, len, "--%s", o->flag ? o->flag : o->key);
    for (char *p = buf + 2; *p; p++)
        if (*p == '_')
            *p = '-';
}

static void format_loop(const ifd_daemon_config *d, char *buf, size_t len)
{
    if (d->run.loop_kind == IFD_LOOP_AUTO)
        snprintf(buf, len, "auto");
    else if (d->run.loop_kind == IFD_LOOP_SECONDS)
        snprintf(buf, len, "%gs", d->run.loop_secs);
    else
        snprintf(buf, len, "%" PRId64, d->run.iterations_per_loop);
}

void config_format_value(const config_opt *o, const ifd_daemon_config *d, char *buf, size_t len)
{
    const char *field = (const char *)d + o->off;
    const char *s = NULL;
    switch (o->kind) {
    case K_LIBS:
    case K_CALLS:
        s = "none";
        break;
    case K_LOOP:
        format_loop(d, buf, len);
        return;
    case K_STR:
        s = *(const char *const *)field;
        s = s == NULL ? "none" : s[0] ? s : "\"\"";
        break;
    case K_INT:
        snprintf(buf, len, "%d", *(const int *)field);
        return;
    case K_I64:
        if (*(const int64_t *)field == 0 && (o->flags & OPT_UNSET))
            s = "unset";
        else
            snprintf(buf, len, "%" PRId64, *(const int64_t *)field);
        break;
    case K_U64:
        snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field);
        return;
    case K_F32:
        snprintf(buf, len, "%g", (double)*(const float *)field);
        return;
    case K_F64:
        snprintf(buf, len, "%g", *(const double *)field);
        return;
    case K_ENUM:
        s = o->names->name(*(const int *)field);
        break;
    case K_BOOL:
    case K_SWITCH:
        s = *(const int *)field ? "on" : "off";
        break;
    }
    if (s)
        snprintf(buf, len, "%s", s);
}

const char *config_range(const config_opt *o)
{
    if (o->flags & OPT_RANGE)
        return o->expect;
    _Static_assert(offsetof(ifd_daemon_config, run) == 0, "run comes first");
    int number = o->kind == K_INT || o->kind == K_I64 || o->kind == K_F32 || o->kind == K_F64;
    return number && o->off < sizeof(ifd_config) ? ifd_config_range_text(o->key) : NULL;
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
    for (int i = 0; i < config_nopts; i++) {
        char flag[64], left[96], def[96];
        config_flag_name(&config_opts[i], flag, sizeof flag);
        snprintf(left, sizeof left, "%s%s%s", flag, config_opts[i].metavar[0] ? " " : "",
                 config_opts[i].metavar);
        config_format_value(&config_opts[i], &d, def, sizeof def);
        const char *range = config_range(&config_opts[i]);
        fprintf(out, "  %-38s %s%s%s%s (default: %s)\n", left, config_opts[i].help,
                range ? " [" : "", range ? range : "", range ? "]" : "", def);
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
            "Endpoints: the port * (tcp://127.0.0.1:*) binds a port the system chooses; the log,\n"
            "status and --ready-file say which. The missing folders of an ipc:// endpoint are\n"
            "created (mode 0700).\n"
            "\n"
            "Several hosts (docs/multihost.md): started by an MPI launcher (mpirun -np H\n"
            "infeedd ..., or srun), H daemons train one model; --batch-size is the global batch,\n"
            "each host takes batch_size / H rows a step from its own producers. {rank} in\n"
            "--listen, --publish, --control, --summaries, --predictions, --ready-file,\n"
            "--checkpoint-dir and --checkpoint is replaced by the host's rank\n"
            "(ipc:///run/infeed/in-{rank}); without it, summaries, PUB, the ready file and\n"
            "checkpoints are rank 0's only. A checkpoint holds every\n"
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
