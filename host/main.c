/*
 * infeedd: the host daemon. Parses the config (host/config.h), binds the ZeroMQ endpoints
 * (host/ingest/), creates a session over the ingest's batch source and runs it on this thread.
 *
 * Exit status: 0 the run ended well; 1 a runtime error (the end summary carries it); 2 a usage
 * or config error, including a checkpoint (--resume, --checkpoint) that cannot start the run and
 * a CURVE key file that cannot be read or parsed.
 *
 * `infeedd keygen PREFIX` writes a CURVE key pair (core/keyfile.h) and exits.
 */
#include "core/log.h"
#include "host/config.h"
#include "host/config_agree.h"
#include "host/conns.h"
#include "host/eval_hook.h"
#include "host/mpi_hosts.h"
#include "host/ingest/ingest.h"
#include "host/predictions.h"
#include "host/security.h"
#include "host/start.h"
#include <infeed/checkpoint.h>

#include <errno.h>
#include <jansson.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Received frames are allocated by libzmq's I/O thread and freed by a replica when its step is
 * done. With glibc's defaults a frame of 128 KiB or more is a fresh mmap, page-faulted in as
 * libzmq writes it and unmapped again on free: at 1 MiB batches over tcp that cost a third of
 * the ingest rate. Keep them on the heap, where freed frames are reused (memory stays bounded by
 * the credit). Freed heap beyond 64 MiB at the top is given back at once, and the connection
 * monitor gives back free heap elsewhere with malloc_trim (host/monitor.c), so that what a flood
 * made libzmq buffer does not stay with the process. */
static void tune_memory(void)
{
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

/* Read by the I/O thread, so a lock-free atomic rather than a volatile sig_atomic_t (which is
 * only safe between a handler and the thread it interrupts). */
static int signals_seen;
static ifd_ingest *signal_target;

/* Only counts and wakes the I/O thread (lock-free atomics and an eventfd write are
 * async-signal-safe). */
static void on_signal(int signo)
{
    (void)signo;
    __atomic_fetch_add(&signals_seen, 1, __ATOMIC_RELAXED);
    ifd_ingest *g = __atomic_load_n(&signal_target, __ATOMIC_ACQUIRE);
    if (g)
        ifd_ingest_wake(g);
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* Each connection costs a descriptor: take every one the hard limit allows (as Redis does), and
 * lower the connection limit to what the descriptors left cover (three sockets, the refused
 * ingest connections held for their answer, with --shm on a pool's memfd a producer until it
 * maps it, and DESC_RESERVE for everything else), so that a flood meets the limit, which closes
 * connections at once, and not EMFILE, which makes libzmq retry its accept in a loop; and so
 * that control, which makes room for a new connection by closing its oldest, always answers. */
#define DESC_RESERVE (64 + IFD_CONNS_HELD)
static void fit_descriptors(ifd_daemon_config *c)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
            IFD_LOG_DEBUG("descriptor limit raised from %llu to %llu", (unsigned long long)was,
                          (unsigned long long)rl.rlim_cur);
        else
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    long long want = ifd_daemon_max_connections(c), pools = c->shm ? c->max_producers : 0;
    if (rl.rlim_cur == RLIM_INFINITY || (long long)rl.rlim_cur >= 3 * want + pools + DESC_RESERVE)
        return;
    long long fit = ((long long)rl.rlim_cur - DESC_RESERVE - pools) / 3;
    c->max_connections = fit < 1 ? 1 : (int)fit;
    IFD_LOG_WARN("the descriptor limit (%llu, ulimit -n) covers %d connections on each of the "
                 "three sockets, not %lld: the limit is lowered to %d%s",
                 (unsigned long long)rl.rlim_cur, c->max_connections, want, c->max_connections,
                 c->max_connections < c->max_producers ? ", below --max-producers" : "");
}

/* The bound endpoint of key in the ingest's endpoints (NULL: the socket is off). */
static const char *bound_endpoint(json_t *endpoints, const char *key)
{
    return json_string_value(json_object_get(endpoints, key));
}

static void describe(const ifd_daemon_config *c, const ifd_program *p, json_t *endpoints)
{
    char inputs[256] = "";
    for (int i = 0; i < p->ninputs; i++) {
        char shape[96];
        ifd_shape s = {.rank = p->inputs[i].rank};
        memcpy(s.dims, p->inputs[i].dims, sizeof p->inputs[i].dims);
        size_t n = strlen(inputs);
        snprintf(inputs + n, sizeof inputs - n, "%s%s %s %s", i ? ", " : "", p->inputs[i].name,
                 ifd_dtype_name(p->inputs[i].dtype), ifd_shape_format(&s, shape, sizeof shape));
    }
    char loops[96];
    if (c->run.mode == IFD_MODE_EVAL)
        snprintf(loops, sizeof loops, "one loop of %lld steps", (long long)c->run.steps);
    else if (c->run.loop_kind == IFD_LOOP_AUTO)
        snprintf(loops, sizeof loops,
                 "loop lengths chosen as it runs (boundaries under 1%%, loops of at most %g s)",
                 c->run.max_loop_seconds);
    else if (c->run.loop_kind == IFD_LOOP_SECONDS)
        snprintf(loops, sizeof loops, "loops of about %g s", c->run.loop_secs);
    else
        snprintf(loops, sizeof loops, "%lld steps per loop", (long long)c->run.iterations_per_loop);
    IFD_LOG_INFO("program %s (%s) on %d %s replica%s, batch size %lld, %s", p->cls->name, inputs,
                 c->run.replicas, c->run.backend, c->run.replicas == 1 ? "" : "s",
                 (long long)c->run.batch_size, loops);
    const char *pub = bound_endpoint(endpoints, "publish"),
               *ctl = bound_endpoint(endpoints, "control");
    IFD_LOG_INFO("ingest on %s, summaries on %s%s%s, control on %s",
                 bound_endpoint(endpoints, "listen"), pub ? pub : "(none)",
                 c->summaries ? " and " : "", c->summaries ? c->summaries : "",
                 ctl ? ctl : "(none)");
}

/* --ready-file: the bound endpoints and the pid, written to PATH.tmp.PID and renamed, so that
 * whoever waits for PATH reads it whole. */
static int write_ready_file(const char *path, json_t *endpoints, ifd_error *err)
{
    char tmp[4096 + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    json_t *j = json_deep_copy(endpoints);
    json_object_set_new(j, "pid", json_integer(getpid()));
    FILE *f = fopen(tmp, "w");
    int ok = f && json_dumpf(j, f, JSON_COMPACT | JSON_SORT_KEYS) == 0 && fputc('\n', f) != EOF;
    int e = errno;
    if (f && fclose(f) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    json_decref(j);
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        e = errno;
    }
    if (!ok) {
        unlink(tmp);
        return ifd_error_set(err, IFD_EIO, "ready_file: cannot write '%s': %s", path, strerror(e));
    }
    return IFD_OK;
}

/* infeedd keygen PREFIX */
static int keygen(int argc, char **argv)
{
    if (argc != 3 || argv[2][0] == '\0' || argv[2][0] == '-') {
        fprintf(stderr, "infeedd: keygen: expected one argument, the file name prefix (infeedd "
                        "keygen PREFIX writes PREFIX.key and PREFIX.pub)\n");
        return 2;
    }
    ifd_error err;
    ifd_error_clear(&err);
    char pub[IFD_KEY_Z85_LEN + 1];
    int rc = ifd_keyfile_generate(argv[2], pub, &err);
    if (rc) {
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&err));
        return rc == IFD_EIO ? 1 : 2;
    }
    printf("wrote %s.key (the key pair: keep it secret) and %s.pub (the public key: %s)\n", argv[2],
           argv[2], pub);
    return 0;
}

static int run(int argc, char **argv, ifd_hosts *hosts);

/* Several hosts, before any socket opens (the first collective on the LOOP channel): whether
 * every host's configuration can start the run. A host that cannot (exit status 2) has said why
 * and joins with failed set; the others learn it here and end with status 2 too, so that none
 * waits in a collective for a host that is gone and no abort is needed. The lowest rank that
 * failed, or -1. */
static int hosts_setup_agreed;
static int hosts_setup_failed(const ifd_hosts *h, int failed)
{
    hosts_setup_agreed = 1;
    int64_t v = failed ? h->rank : h->size;
    ifd_error e;
    ifd_error_clear(&e);
    if (h->ops->allreduce_i64(h->ctx, IFD_HOSTS_LOOP, &v, 1, IFD_HOSTS_MIN, NULL, NULL, &e)) {
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&e));
        return h->rank;
    }
    return v < h->size ? (int)v : -1;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "keygen") == 0)
        return keygen(argc, argv);
    ifd_hosts hosts;
    ifd_error err;
    ifd_error_clear(&err);
    if (ifd_daemon_hosts_init(&hosts, &argc, &argv, &err)) {
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&err));
        ifd_daemon_hosts_fini(&hosts);
        return 2;
    }
    if (hosts.size > 1)
        ifd_log_set_host(hosts.rank);
    int status = run(argc, argv, &hosts);
    if (status == 2 && hosts.size > 1) {
        if (!hosts_setup_agreed)
            hosts_setup_failed(&hosts, 1); /* a config error: every host ends with status 2 */
    } else if (status != 0 && hosts.size > 1) {
        /* The other hosts may be waiting for this one in a collective: end the job (MPI's
         * abort is the last resort; see docs/multihost.md). */
        fprintf(stderr, "infeedd: host %d of %d ended with status %d: aborting the other hosts\n",
                hosts.rank, hosts.size, status);
        ifd_daemon_hosts_abort(&hosts, status);
    }
    ifd_daemon_hosts_fini(&hosts);
    return status;
}

/* One run of the daemon: what each phase made, undone in reverse by daemon_close. */
typedef struct daemon_run {
    ifd_daemon_config cfg;
    ifd_hosts *hosts;
    ifd_security *sec;
    ifd_checkpoint *ck; /* the checkpoint to start from, until the session took it */
    ifd_ingest *g;
    ifd_session *s;
    ifd_sink *jsonl;
    ifd_sink *shared[2]; /* --eval-every: the sinks, each shared with the eval hook */
    ifd_predictions_file *pfile;
    int ready_written;
    ifd_error err;
} daemon_run;

/* The config: the flags and the file, the hosts' share, the log level. Sets *exit_now after
 * --help or --version. */
static int configure(daemon_run *d, int argc, char **argv, int *exit_now)
{
    int rc = ifd_daemon_config_parse(&d->cfg, argc, argv, stdout, exit_now, &d->err);
    if (rc || *exit_now)
        return rc;
    if ((rc = ifd_daemon_apply_hosts(&d->cfg, d->hosts, &d->err)) != IFD_OK)
        return rc;
    ifd_log_set_level(d->cfg.log_level);
    if (d->hosts->size > 1)
        IFD_LOG_INFO("host %d of %d: batch size %lld of the global %lld", d->hosts->rank,
                     d->hosts->size, (long long)d->cfg.run.batch_size,
                     (long long)d->cfg.run.batch_size * d->hosts->size);
    return IFD_OK;
}

/* CURVE keys: a file that cannot be read or parsed is a config error, like a bad flag. */
static int load_security(daemon_run *d)
{
    int rc = ifd_security_create(&d->sec, &d->cfg, &d->err);
    if (rc)
        return rc;
    d->cfg.security = d->sec;
    ifd_security *sec = d->sec;
    if (sec)
        IFD_LOG_INFO("CURVE on every socket: server key %s, %d producer key%s, %d admin key%s",
                     ifd_security_public_key(sec), ifd_security_authorized_count(sec),
                     ifd_security_authorized_count(sec) == 1 ? "" : "s",
                     ifd_security_admin_count(sec), ifd_security_admin_count(sec) == 1 ? "" : "s");
    else if (d->cfg.insecure)
        IFD_LOG_WARN("--insecure: no socket is authenticated or encrypted");
    return IFD_OK;
}

/* The checkpoint to start from, and the folder to write into: one that cannot start this run is
 * a config error, like a bad flag. */
static int load_checkpoint(daemon_run *d)
{
    const ifd_daemon_config *c = &d->cfg;
    int train = c->run.mode == IFD_MODE_TRAIN;
    if (c->run.mode == IFD_MODE_EVAL && !c->checkpoint && !c->checkpoint_dir)
        return ifd_error_set(&d->err, IFD_EINVAL,
                             "checkpoint: eval mode evaluates a checkpoint: expected --checkpoint "
                             "PATH or --checkpoint-dir DIR (its latest), got neither");
    int rc;
    if ((c->resume || c->checkpoint || (!train && c->checkpoint_dir)) &&
        (rc = ifd_daemon_load_start(c, &d->ck, &d->err)) != IFD_OK)
        return rc;
    d->cfg.run.restore = d->ck;
    if (c->checkpoint_dir && train)
        return ifd_daemon_check_dir(c, d->ck, &d->err);
    return IFD_OK;
}

/* Several hosts: every host's config can start the run, or none starts. */
static int agree_hosts(daemon_run *d)
{
    if (d->hosts->size <= 1)
        return IFD_OK;
    int bad = hosts_setup_failed(d->hosts, 0);
    if (bad < 0) /* every host can start: they must start the same run */
        return ifd_config_agree(
            &d->cfg, d->ck ? ifd_checkpoint_global_step(d->ck) : d->cfg.run.initial_global_step,
            d->hosts, &d->err);
    return ifd_error_set(&d->err, IFD_EINVAL,
                         "host %d of %d cannot start the run (a config error: see its message); "
                         "host %d stops too",
                         bad, d->hosts->size, d->hosts->rank);
}

/* Every step before a socket opens; an error is a config error (exit status 2). */
static int prepare(daemon_run *d, int argc, char **argv, int *exit_now)
{
    int rc = configure(d, argc, argv, exit_now);
    if (rc == IFD_OK && !*exit_now) {
        rc = load_security(d);
        if (rc == IFD_OK) {
            tune_memory();
            fit_descriptors(&d->cfg);
            rc = load_checkpoint(d);
        }
        if (rc == IFD_OK)
            rc = agree_hosts(d);
    }
    if (rc)
        ifd_daemon_config_name_keys(&d->cfg, &d->err);
    return rc;
}

/* The ingest and the session over its batch source, the session started from the checkpoint. */
static int open_session(daemon_run *d)
{
    int rc = ifd_ingest_create(&d->g, &d->cfg, &signals_seen, &d->err);
    if (rc)
        return rc;
    __atomic_store_n(&signal_target, d->g, __ATOMIC_RELEASE);
    /* Producer positions are a training stream's: eval and predict take the parameters only. */
    if (d->ck && d->cfg.run.mode == IFD_MODE_TRAIN &&
        (rc = ifd_ingest_restore(d->g, d->ck, &d->err)) != IFD_OK)
        return rc;
    rc = ifd_session_create(&d->s, &d->cfg.run, ifd_ingest_source(d->g), &d->err);
    ifd_checkpoint_free(d->ck); /* the session copied what it needs */
    d->ck = NULL;
    d->cfg.run.restore = NULL;
    return rc;
}

static int add_checkpoint_hook(daemon_run *d)
{
    const ifd_daemon_config *c = &d->cfg;
    if (!c->checkpoint_dir || c->run.mode != IFD_MODE_TRAIN)
        return IFD_OK;
    ifd_checkpoint_options co = {.dir = c->checkpoint_dir,
                                 .every = c->checkpoint_every,
                                 .keep = c->keep_checkpoints,
                                 .positions = ifd_ingest_positions,
                                 .positions_arg = d->g,
                                 .hosts = c->run.hosts,
                                 .write = c->checkpoint_writer};
    ifd_hook h;
    int rc = ifd_hook_checkpoint(&h, &co, &d->err);
    if (rc == IFD_OK && (rc = ifd_session_add_hook(d->s, &h)) != IFD_OK) {
        h.destroy(h.arg);
        ifd_error_set(&d->err, rc, "checkpoint hook");
    }
    return rc;
}

static int add_sink(daemon_run *d, ifd_sink *sink, const char *what)
{
    int rc = IFD_OK;
    if (d->cfg.eval_every > 0) { /* the eval hook writes to it too, from another thread */
        int i = d->shared[0] ? 1 : 0;
        if ((rc = ifd_sink_shared_create(&d->shared[i], sink)) != IFD_OK)
            return ifd_error_set(&d->err, rc, "%s: cannot share its summary sink", what);
        sink = d->shared[i];
    }
    rc = ifd_session_add_sink(d->s, sink);
    return rc ? ifd_error_set(&d->err, rc, "%s: cannot add its summary sink", what) : IFD_OK;
}

/* --eval-every: the hook that evaluates during training, its summaries to the shared sinks. */
static int add_eval_hook(daemon_run *d)
{
    const ifd_daemon_config *c = &d->cfg;
    if (c->eval_every <= 0)
        return IFD_OK;
    ifd_eval_hook_options o = {.run = c->run,
                               .set = ifd_ingest_eval_set(d->g),
                               .every = c->eval_every,
                               .checkpoint_dir = c->checkpoint_dir,
                               .keep_best = c->keep_best,
                               .early_stopping = c->early_stopping,
                               .positions = ifd_ingest_positions,
                               .positions_arg = d->g,
                               .write = c->checkpoint_writer};
    for (int i = 0; i < 2; i++)
        if (d->shared[i])
            o.sinks[o.nsinks++] = d->shared[i];
    ifd_hook h;
    int rc = ifd_hook_eval_every(&h, &o, &d->err);
    if (rc == IFD_OK && (rc = ifd_session_add_hook(d->s, &h)) != IFD_OK) {
        h.destroy(h.arg);
        ifd_error_set(&d->err, rc, "eval hook");
    }
    return rc;
}

static int add_prediction_sink(daemon_run *d, const ifd_prediction_sink *ps, const char *what)
{
    int rc = ifd_session_add_prediction_sink(d->s, ps);
    return rc ? ifd_error_set(&d->err, rc, "%s: cannot add its prediction sink", what) : IFD_OK;
}

/* Where summaries and predictions go: the JSON Lines files, the PUB socket, the producers. */
static int add_outputs(daemon_run *d)
{
    const ifd_daemon_config *c = &d->cfg;
    int rc = add_checkpoint_hook(d);
    if (rc == IFD_OK && c->summaries &&
        (rc = ifd_sink_jsonl_create(&d->jsonl, c->summaries, &d->err)) == IFD_OK)
        rc = add_sink(d, d->jsonl, "summaries");
    if (rc == IFD_OK && ifd_ingest_pub_sink(d->g))
        rc = add_sink(d, ifd_ingest_pub_sink(d->g), "publish");
    if (rc == IFD_OK && ifd_ingest_tensor_sink(d->g) && c->run.mode != IFD_MODE_PREDICT &&
        (rc = ifd_session_add_tensor_sink(d->s, ifd_ingest_tensor_sink(d->g))) != IFD_OK)
        ifd_error_set(&d->err, rc, "publish: cannot add its tensor sink");
    if (rc == IFD_OK)
        rc = add_eval_hook(d);
    if (rc || c->run.mode != IFD_MODE_PREDICT)
        return rc;
    ifd_prediction_sink ps = ifd_ingest_prediction_sink(d->g);
    rc = add_prediction_sink(d, &ps, "listen");
    if (rc == IFD_OK && c->predictions &&
        (rc = ifd_predictions_file_open(&d->pfile, c->predictions, &d->err)) == IFD_OK) {
        ps = ifd_predictions_file_sink(d->pfile);
        rc = add_prediction_sink(d, &ps, "predictions");
    }
    return rc;
}

/* Serves the sockets, says where, runs the session to its end and tells the producers. The
 * run's own error is said here; IFD_OK with *status the exit status, or an error before the
 * run. */
static int serve(daemon_run *d, int *status)
{
    int rc = ifd_ingest_start(d->g, d->s, &d->err);
    if (rc)
        return rc;
    json_t *endpoints = ifd_ingest_endpoints_json(d->g);
    describe(&d->cfg, ifd_session_program(d->s), endpoints);
    if (d->cfg.ready_file && d->cfg.ready_file[0] &&
        (rc = write_ready_file(d->cfg.ready_file, endpoints, &d->err)) == IFD_OK)
        d->ready_written = 1;
    json_decref(endpoints);
    if (rc)
        return rc;
    IFD_LOG_INFO("waiting for producers");
    ifd_error run_err;
    ifd_error_clear(&run_err);
    int code = ifd_session_run(d->s, &run_err);
    ifd_end_reason reason = ifd_session_end_reason(d->s);
    ifd_ingest_finish(d->g, code, ifd_end_reason_name(reason),
                      code ? ifd_error_text(&run_err) : "");
    if (code)
        fprintf(stderr, "infeedd: the run ended with an error: %s\n", ifd_error_text(&run_err));
    *status = code ? 1 : 0;
    return IFD_OK;
}

/* Undoes every phase, in reverse; a failure to close the predictions file makes *status 1. */
static void daemon_close(daemon_run *d, int *status)
{
    ifd_checkpoint_free(d->ck);
    ifd_ingest_release_session(d->g); /* before the session goes (an error after ingest_start) */
    ifd_session_destroy(d->s);
    /* Only this thread is left (libzmq's threads block signals): block them here too, so no
     * handler can still be using the ingest's eventfd when it is closed. */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    __atomic_store_n(&signal_target, NULL, __ATOMIC_RELEASE);
    ifd_ingest_destroy(d->g);
    if (d->ready_written)
        unlink(d->cfg.ready_file);
    ifd_security_destroy(d->sec);
    ifd_sink_destroy(d->shared[0]);
    ifd_sink_destroy(d->shared[1]);
    ifd_sink_destroy(d->jsonl);
    if (ifd_predictions_file_close(d->pfile, &d->err)) {
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&d->err));
        *status = 1;
    }
    ifd_daemon_config_free(&d->cfg);
}

/* Exit status: 0 the run ended well, 1 a runtime error, 2 a usage or config error. */
static int run(int argc, char **argv, ifd_hosts *hosts)
{
    daemon_run d = {.hosts = hosts};
    ifd_daemon_config_defaults(&d.cfg);
    ifd_error_clear(&d.err);
    int exit_now = 0, status = 2;
    int rc = prepare(&d, argc, argv, &exit_now);
    if (rc || exit_now) {
        status = rc ? 2 : 0;
        goto out;
    }
    if (d.ck)
        IFD_LOG_INFO("starting from a checkpoint at global step %lld (%d producers)",
                     (long long)ifd_checkpoint_global_step(d.ck),
                     ifd_checkpoint_producer_count(d.ck));
    if (d.cfg.run.mode == IFD_MODE_PREDICT && d.ck == NULL)
        IFD_LOG_WARN("predict mode without --checkpoint or --checkpoint-dir: the parameters are "
                     "the seed's initial ones");
    status = 1;
    if (d.cfg.ready_file && d.cfg.ready_file[0])
        unlink(d.cfg.ready_file); /* a stale one would name another run's endpoints */
    install_signals();
    rc = open_session(&d);
    if (rc == IFD_OK)
        rc = add_outputs(&d);
    if (rc == IFD_OK)
        rc = serve(&d, &status);
out:
    if (rc)
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&d.err));
    daemon_close(&d, &status);
    return status;
}
