/*
 * infeedctl: a running infeedd's status, a graceful stop, and a live progress line.
 *
 *   infeedctl status [--json]   the control socket's {"cmd":"status"}, readable or as JSON
 *   infeedctl stop              {"cmd":"stop"}: the run ends at the end of the current loop
 *   infeedctl watch             the summaries of the PUB socket as one progress line, until the
 *                               end summary
 *
 * It speaks the daemon's control REP (docs/protocol.md, "Summaries and control") through a REQ
 * socket and subscribes to the PUB socket with the C client, CURVE included (--server-key,
 * --key-file: the files of `infeedd keygen`). Exit status: 0 done (watch: the run ended well),
 * 1 no daemon answered, the daemon refused the request or the run ended with an error, 2 a
 * usage error.
 */
#include "tools/infeedctl.h"
#include "clients/c/wire.h"
#include "core/keyfile.h"
#include "core/userdir.h"
#include "infeed/client.h"
#include "infeed/error.h"
#include "infeed/infeed.h" /* IFD_VERSION_STRING */

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define EXIT_USAGE 2

static void usage(FILE *out)
{
    char control[4200];
    ifd_default_control(control, sizeof control);
    fprintf(
        out,
        "Usage: infeedctl [options] status [--json]\n"
        "       infeedctl [options] stop\n"
        "       infeedctl [options] watch\n"
        "\n"
        "Talks to a running infeedd: its control socket (--control) for status and stop,\n"
        "its summaries (--publish) for watch.\n"
        "\n"
        "Commands:\n"
        "  status        the daemon's state: global step and last step, rates, the batch\n"
        "                queue, whether the infeed waits, producers and rings (--json: the\n"
        "                daemon's answer as it came, docs/protocol.md)\n"
        "  stop          asks for a graceful stop at the end of the current loop (as SIGTERM)\n"
        "  watch         a live progress line from the published summaries: step / last step,\n"
        "                examples/s, loss, accuracy, infeed wait, ETA; ends with the run's end\n"
        "                summary (exit 0 when the run ended well, 1 when with an error)\n"
        "\n"
        "Options:\n"
        "  --control ENDPOINT   the daemon's --control (default: the daemon's own default,\n"
        "                       %s: an ipc socket in a folder only this\n"
        "                       user may enter)\n"
        "  --publish ENDPOINT   the daemon's --publish, for watch (default: "
        "tcp://127.0.0.1:5556)\n"
        "  --server-key FILE    CURVE: the daemon's public key file (infeedd keygen's .pub)\n"
        "  --key-file FILE      CURVE: this client's key pair (infeedd keygen's .key), whose\n"
        "                       public key is in the daemon's --admin-keys (status, stop) or\n"
        "                       --admin-keys / --authorized-keys (watch)\n"
        "  --timeout SECONDS    how long to wait for the daemon to answer (default: 5)\n"
        "  --json               status: print the daemon's JSON answer\n"
        "  --help               this text\n"
        "  --version            the version\n"
        "\n"
        "Exit status: 0 done; 1 no daemon answered, it refused the request, or (watch) the\n"
        "run ended with an error; 2 a usage error.\n",
        control);
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "infeedctl: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (infeedctl --help lists the commands and options)\n");
    return EXIT_USAGE;
}

/* --help and --version print and exit (an error before them on the line ends first). */
static void info_flag(const char *a)
{
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
        usage(stdout);
        exit(0);
    }
    if (strcmp(a, "--version") == 0) {
        printf("infeedctl %s (protocol %d)\n", IFD_VERSION_STRING, IFD_PROTOCOL_VERSION);
        exit(0);
    }
}

/* The options that take a value: a string field, or --timeout (is_timeout). */
static const struct {
    const char *name;
    size_t off;
    int is_timeout;
} value_options[] = {
    {"--control", offsetof(ctl_options, control), 0},
    {"--publish", offsetof(ctl_options, publish), 0},
    {"--server-key", offsetof(ctl_options, server_key), 0},
    {"--key-file", offsetof(ctl_options, key_file), 0},
    {"--timeout", offsetof(ctl_options, timeout), 1},
};

static int set_timeout(ctl_options *o, const char *v)
{
    char *end;
    errno = 0;
    double t = strtod(v, &end);
    if (errno || *end != '\0' || !(t > 0 && t <= 86400)) {
        fprintf(stderr,
                "infeedctl: --timeout: expected seconds above 0 and at most 86400, got '%s'\n", v);
        return EXIT_USAGE;
    }
    o->timeout = t;
    return 0;
}

/* The option at argv[*i] and its value ("--name=VALUE", or the next argument). */
static int parse_option(int argc, char **argv, int *i, ctl_options *o)
{
    const char *a = argv[*i], *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    size_t n = sizeof value_options / sizeof value_options[0], k = 0;
    while (k < n &&
           !(strlen(value_options[k].name) == len && strncmp(a, value_options[k].name, len) == 0))
        k++;
    if (k == n)
        return usage_error("unknown option '%s'", a);
    const char *v = eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
    if (v == NULL || *v == '\0')
        return usage_error("%s: expected a value", value_options[k].name);
    if (value_options[k].is_timeout)
        return set_timeout(o, v);
    *(const char **)((char *)o + value_options[k].off) = v;
    return 0;
}

static int parse_command(const char *a, ctl_options *o)
{
    if (o->command)
        return usage_error("unexpected argument '%s' after the command", a);
    if (strcmp(a, "status") && strcmp(a, "stop") && strcmp(a, "watch"))
        return usage_error("unknown command '%s': expected status, stop or watch", a);
    o->command = a;
    return 0;
}

/* What the options say together. */
static int check_options(const ctl_options *o)
{
    if (o->command == NULL)
        return usage_error("%sexpected a command: status, stop or watch", "");
    if (o->json && strcmp(o->command, "status") != 0)
        return usage_error("--json: expected only with status, got it with %s", o->command);
    if ((o->server_key == NULL) != (o->key_file == NULL))
        return usage_error("%s: CURVE needs both the daemon's public key (--server-key) and "
                           "this client's key pair (--key-file)",
                           o->server_key ? "--server-key without --key-file"
                                         : "--key-file without --server-key");
    return 0;
}

static int parse_args(int argc, char **argv, ctl_options *o)
{
    for (int i = 1; i < argc; i++) {
        info_flag(argv[i]);
        int rc = strcmp(argv[i], "--json") == 0   ? (o->json = 1, 0)
                 : strncmp(argv[i], "--", 2) != 0 ? parse_command(argv[i], o)
                                                  : parse_option(argc, argv, &i, o);
        if (rc)
            return rc;
    }
    return check_options(o);
}

/* ---- the control socket ------------------------------------------------------------------- */

static int curve_setup(void *sock, const ctl_options *o, ifd_error *err)
{
    if (o->server_key == NULL)
        return IFD_OK;
    if (!zmq_has("curve"))
        return ifd_error_set(err, IFD_ENOTSUP,
                             "CURVE keys were given, but this libzmq has no CURVE");
    char server[IFD_KEY_Z85_LEN + 1], pub[IFD_KEY_Z85_LEN + 1], sec[IFD_KEY_Z85_LEN + 1];
    int rc = ifd_keyfile_load_public(o->server_key, "--server-key", server, err);
    if (rc == IFD_OK)
        rc = ifd_keyfile_load_pair(o->key_file, "--key-file", pub, sec, err);
    if (rc == IFD_OK && (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server, IFD_KEY_Z85_LEN) ||
                         zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, IFD_KEY_Z85_LEN) ||
                         zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, IFD_KEY_Z85_LEN)))
        rc = ifd_error_set(err, IFD_EIO, "CURVE options: %s", zmq_strerror(errno));
    memset(sec, 0, sizeof sec);
    return rc;
}

/* The client library's sentence for a connect timeout (clients/c/wire.c) in infeedctl's words:
 * its --timeout and its key flags rather than the C API's fields. */
static void reword(char *msg, size_t cap, const char *from, const char *to)
{
    char *at = strstr(msg, from);
    size_t n = strlen(from), m = strlen(to), tail;
    if (at == NULL || strlen(msg) - n + m >= cap)
        return;
    tail = strlen(at + n) + 1;
    memmove(at + m, at + n, tail);
    memcpy(at, to, m);
}

void reword_client(char *msg, size_t cap)
{
    reword(msg, cap, "(connect_timeout_ms)", "(--timeout)");
    reword(msg, cap, "set server_key_file and key_file", "pass --server-key and --key-file");
}

/* Sends one request and waits o->timeout for the JSON answer (*reply, the caller decrefs). The
 * sentence when none comes says whether a daemon answered the connection at all, refused this
 * client's CURVE key, or failed the handshake (one that requires CURVE, asked without
 * --server-key). */
int control_request(const ctl_options *o, const char *request, json_t **reply, ifd_error *err)
{
    *reply = NULL;
    void *ctx = zmq_ctx_new();
    if (ctx == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "zmq_ctx_new: %s", zmq_strerror(errno));
    void *req = zmq_socket(ctx, ZMQ_REQ);
    int rc = IFD_OK, zero = 0, timeout_ms = (int)(o->timeout * 1000 + 0.5);
    ifd_client_options co = {.server_key_file = o->server_key,
                             .key_file = o->key_file,
                             .connect_timeout_ms = timeout_ms};
    ifdw_watch w;
    memset(&w, 0, sizeof w);
    if (req == NULL) {
        rc = ifd_error_set(err, IFD_EIO, "zmq_socket: %s", zmq_strerror(errno));
        goto out_ctx;
    }
    zmq_setsockopt(req, ZMQ_LINGER, &zero, sizeof zero);
    if ((rc = curve_setup(req, o, err)) != IFD_OK ||
        (rc = ifdw_watch_start(&w, ctx, req, &co, "infeedctl", "--control", err)) != IFD_OK)
        goto out_sock;
    w.keys = "pass --server-key and --key-file";
    if (zmq_connect(req, o->control) != 0) {
        rc = ifd_error_set(err, IFD_EINVAL, "--control: cannot connect to '%s': %s", o->control,
                           zmq_strerror(errno));
        goto out_sock;
    }
    if (zmq_send(req, request, strlen(request), 0) < 0) {
        rc = ifd_error_set(err, IFD_EIO, "sending to %s: %s", o->control, zmq_strerror(errno));
        goto out_sock;
    }
    zmq_pollitem_t it = {req, 0, ZMQ_POLLIN, 0};
    int64_t deadline = ifdw_deadline(timeout_ms);
    int r = 0;
    for (;;) {
        long left = ifdw_left_ms(deadline), wait = ifdw_watch_poll(&w) || left < 50 ? left : 50;
        if (left == 0)
            break;
        r = zmq_poll(&it, 1, wait);
        if (r > 0 || (r < 0 && errno != EINTR))
            break;
    }
    if (r <= 0) {
        char why[400], secs[32];
        ifdw_seconds(timeout_ms, secs, sizeof secs);
        if (ifdw_watch_poll(&w)) /* connected (and admitted), but no answer */
            rc = ifd_error_set(err, IFD_ETIMEDOUT,
                               "the daemon at %s took the connection but did not answer within "
                               "%s (--timeout)",
                               o->control, secs);
        else {
            ifdw_watch_why(&w, o->control, why, sizeof why);
            rc = ifd_error_set(
                err, IFD_ETIMEDOUT, "no daemon answered at %s within %s%s%s", o->control, secs, why,
                w.refused == 1 ? " (is its public key in the daemon's --admin-keys?)" : "");
        }
        goto out_sock;
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, req, 0) < 0) {
        rc = ifd_error_set(err, IFD_EIO, "receiving from %s: %s", o->control, zmq_strerror(errno));
        zmq_msg_close(&m);
        goto out_sock;
    }
    json_error_t je;
    *reply = json_loadb(zmq_msg_data(&m), zmq_msg_size(&m), 0, &je);
    if (*reply == NULL || !json_is_object(*reply)) {
        rc = ifd_error_set(err, IFD_EPROTO, "%s answered something that is not a JSON object: %s",
                           o->control, *reply ? "another JSON value" : je.text);
        json_decref(*reply);
        *reply = NULL;
    }
    zmq_msg_close(&m);
out_sock:
    ifdw_watch_stop(&w);
    zmq_close(req);
out_ctx:
    zmq_ctx_term(ctx);
    return rc;
}

/* An answer {"ok": false, "error": ...} into err. */
static int check_ok(const ctl_options *o, json_t *reply, ifd_error *err)
{
    if (json_is_true(json_object_get(reply, "ok")))
        return IFD_OK;
    const char *why = json_string_value(json_object_get(reply, "error"));
    return ifd_error_set(err, IFD_EINVAL, "the daemon at %s refused the request: %s", o->control,
                         why ? why : "(no reason given)");
}

/* ---- status ------------------------------------------------------------------------------- */

const char *str_or(json_t *o, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : dflt;
}

double num_or(json_t *o, const char *key, double dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

static void print_status(const ctl_options *o, json_t *s)
{
    printf("infeedd at %s: %s, %s mode, program %s on %lld %s replica%s\n", o->control,
           str_or(s, "state", "?"), str_or(s, "mode", "?"), str_or(s, "program", "?"),
           (long long)num_or(s, "replicas", 0), str_or(s, "backend", "?"),
           num_or(s, "replicas", 0) == 1 ? "" : "s");
    json_t *last = json_object_get(s, "last_step");
    printf("  global step   %lld", (long long)num_or(s, "global_step", 0));
    if (json_is_integer(last))
        printf(" / %lld", (long long)json_integer_value(last));
    printf(" (loop %lld)\n", (long long)num_or(s, "loop", 0));
    json_t *blas = json_object_get(s, "blas");
    if (json_is_object(blas))
        printf("  BLAS          %s\n", str_or(blas, "text", "?"));
    printf("  rates         %.1f steps/s, %.0f examples/s\n", num_or(s, "steps_per_sec", 0),
           num_or(s, "examples_per_sec", 0));
    printf("  input         %s, batch queue %lld of %lld, %s\n", str_or(s, "input_mode", "?"),
           (long long)num_or(s, "batch_queue", 0), (long long)num_or(s, "batch_queue_limit", 0),
           json_is_true(json_object_get(s, "input_closed")) ? "input ended" : "input open");
    if (json_is_true(json_object_get(s, "infeed_waiting"))) {
        json_t *rep = json_object_get(s, "infeed_waiting_replica");
        printf("  infeed        waiting for input for %.1f s", num_or(s, "infeed_waiting_sec", 0));
        if (json_is_integer(rep))
            printf(" (replica %lld's batch)", (long long)json_integer_value(rep));
        printf("\n");
    } else {
        printf("  infeed        not waiting\n");
    }
    printf("  batches       %lld accepted, %lld rejected\n",
           (long long)num_or(s, "batches_accepted", 0),
           (long long)num_or(s, "batches_rejected", 0));
    json_t *ps = json_object_get(s, "producers");
    printf("  producers     %lld connected, %zu known\n",
           (long long)num_or(s, "producers_connected", 0), json_array_size(ps));
    size_t i;
    json_t *p;
    json_array_foreach(ps, i, p)
    {
        json_t *rep = json_object_get(p, "replica");
        printf("    %-20s %s credit %lld, in flight %lld, accepted %lld, rejected %lld, last seq "
               "%lld, acked %lld",
               str_or(p, "name", "?"), json_is_true(json_object_get(p, "ended")) ? "ended, " : "",
               (long long)num_or(p, "credit", 0), (long long)num_or(p, "in_flight", 0),
               (long long)num_or(p, "accepted", 0), (long long)num_or(p, "rejected", 0),
               (long long)num_or(p, "last_seq", -1), (long long)num_or(p, "acked_seq", -1));
        if (json_is_integer(rep))
            printf(", replica %lld", (long long)json_integer_value(rep));
        if (json_is_true(json_object_get(p, "shm")))
            printf(", shared memory");
        printf("\n");
    }
    json_t *rings = json_object_get(s, "rings"), *r;
    json_array_foreach(rings, i, r)
    {
        printf("  replica %-5lld infeed %lld/%lld, outfeed %lld/%lld\n",
               (long long)num_or(r, "replica", 0), (long long)num_or(r, "infeed", 0),
               (long long)num_or(r, "infeed_capacity", 0), (long long)num_or(r, "outfeed", 0),
               (long long)num_or(r, "outfeed_capacity", 0));
    }
}

static int cmd_status(const ctl_options *o)
{
    ifd_error err;
    ifd_error_clear(&err);
    json_t *reply;
    int rc = control_request(o, "{\"cmd\":\"status\"}", &reply, &err);
    if (rc == IFD_OK)
        rc = check_ok(o, reply, &err);
    if (rc) {
        fprintf(stderr, "infeedctl status: %s\n", err.msg);
        json_decref(reply);
        return 1;
    }
    if (o->json) {
        char *text = json_dumps(reply, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("%s\n", text ? text : "{}");
        free(text);
    } else {
        print_status(o, reply);
    }
    json_decref(reply);
    return 0;
}

static int cmd_stop(const ctl_options *o)
{
    ifd_error err;
    ifd_error_clear(&err);
    json_t *reply;
    int rc = control_request(o, "{\"cmd\":\"stop\"}", &reply, &err);
    if (rc == IFD_OK)
        rc = check_ok(o, reply, &err);
    json_decref(reply);
    if (rc) {
        fprintf(stderr, "infeedctl stop: %s\n", err.msg);
        return 1;
    }
    printf("infeedd at %s: stopping at the end of the current loop\n", o->control);
    return 0;
}

int main(int argc, char **argv)
{
    char control[4200];
    ifd_default_control(control, sizeof control); /* the daemon's default (core/userdir.h) */
    ctl_options o = {.control = control, .publish = "tcp://127.0.0.1:5556", .timeout = 5};
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    if (strcmp(o.command, "status") == 0)
        return cmd_status(&o);
    if (strcmp(o.command, "stop") == 0)
        return cmd_stop(&o);
    return cmd_watch(&o);
}
