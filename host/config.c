#include "host/config_internal.h"
#include "core/userdir.h"

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
static const char *reduction_name(int v)
{
    return ifd_loss_reduction_name((ifd_loss_reduction)v);
}

const config_opt config_opts[] = {
    {"listen", K_STR, OFF(listen), "ENDPOINT", "ingest ROUTER endpoint producers connect to", NULL,
     NULL},
    {"publish", K_STR, OFF(publish), "ENDPOINT", "summaries PUB endpoint (\"\" disables it)", NULL,
     NULL},
    {"control", K_STR, OFF(control), "ENDPOINT",
     "control REP endpoint: {\"cmd\":\"status\"} or {\"cmd\":\"stop\"} (\"\" disables it); "
     "the default is an ipc socket in a folder only this user may enter ($XDG_RUNTIME_DIR/infeed, "
     "else /tmp/infeed-UID), which infeedctl finds by itself",
     NULL, NULL},
    {"summaries", K_STR, OFF(summaries), "PATH",
     "also append every summary to this JSON Lines file", NULL, NULL},
    {"predictions", K_STR, OFF(predictions), "PATH",
     "predict mode: also write every prediction, a row a line, to this JSON Lines file", NULL,
     NULL},
    {"ready_file", K_STR, OFF(ready_file), "PATH",
     "once every socket is bound and served, write {\"listen\", \"publish\", \"control\", "
     "\"pid\"} to PATH (the endpoints bound, a port chosen for tcp://127.0.0.1:* resolved; "
     "written to a temporary file and renamed); removed when infeedd exits",
     NULL, NULL},
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
    {"iterations_per_loop", K_LOOP, OFF(run.iterations_per_loop), "N|auto|TIME",
     "steps per device loop without a host round trip; auto: the daemon measures the step and "
     "the loop boundary and picks loops whose boundary costs under 1% of their time, at most "
     "--max-loop-seconds long; a duration (2s, 1.5s, 500ms): loops of about that long",
     NULL, NULL},
    {"max_loop_seconds", K_F64, OFF(run.max_loop_secs), "SECONDS",
     "with --iterations-per-loop auto: the longest a loop may take, so that a stop, a "
     "checkpoint and a summary come within it",
     NULL, NULL},
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
    {"max_skipped_steps", K_I64, OFF(run.max_skipped_steps), "N",
     "train, eval: a step whose gradients or loss are not finite is skipped on every replica "
     "and host (no update) and counted; this many skipped in a row end the run (exit 1; 0: "
     "never)",
     NULL, NULL},
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
    {"replica_threads", K_INT, OFF(replica_threads), "N",
     "cpu backend: threads each replica's large products and its update run on, its own and "
     "N - 1 helpers (0: auto, the CPUs this process may use / replicas, 1 to 8; 1 when "
     "OPENBLAS_NUM_THREADS is set)",
     NULL, NULL},
    {"blas_kernel", K_STR, OFF(run.blas_kernel), "NAME",
     "cpu backend: the OpenBLAS kernel; auto replaces a generic fallback below what the CPU "
     "runs (as OpenBLAS 0.3.21 picks Prescott on CPUs newer than itself), keep leaves the "
     "library's pick, or a kernel name: SkylakeX, Haswell, Zen, Sandybridge, ... "
     "(OPENBLAS_CORETYPE, when set, is obeyed under auto)",
     NULL, NULL},
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
    char key[64];
    if (len >= sizeof key)
        return NULL;
    for (size_t i = 0; i < len; i++)
        key[i] = flag[i] == '-' ? '_' : flag[i];
    return config_find_key(key, len);
}

void config_flag_name(const config_opt *o, char *buf, size_t len)
{
    snprintf(buf, len, "--%s", o->key);
    for (char *p = buf + 2; *p; p++)
        if (*p == '_')
            *p = '-';
}

static void format_default(const config_opt *o, const ifd_daemon_config *d, char *buf, size_t len)
{
    const char *field = (const char *)d + o->off;
    switch (o->kind) {
    case K_LIBS:
        snprintf(buf, len, "none");
        return;
    case K_LOOP:
        if (d->run.loop_kind == IFD_LOOP_AUTO)
            snprintf(buf, len, "auto");
        else if (d->run.loop_kind == IFD_LOOP_SECONDS)
            snprintf(buf, len, "%gs", d->run.loop_secs);
        else
            snprintf(buf, len, "%" PRId64, d->run.iterations_per_loop);
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
    for (int i = 0; i < config_nopts; i++) {
        char flag[64], left[96], def[96];
        config_flag_name(&config_opts[i], flag, sizeof flag);
        snprintf(left, sizeof left, "%s%s%s", flag, config_opts[i].metavar[0] ? " " : "",
                 config_opts[i].metavar);
        format_default(&config_opts[i], &d, def, sizeof def);
        fprintf(out, "  %-38s %s (default: %s)\n", left, config_opts[i].help, def);
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
