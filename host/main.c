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
#include "host/conns.h"
#include "host/hosts.h"
#include "host/ingest/ingest.h"
#include "host/predictions.h"
#include "host/security.h"
#include "infeed/checkpoint.h"

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
        snprintf(loops, sizeof loops, "one loop of %lld steps", (long long)c->run.num_steps);
    else if (c->run.loop_kind == IFD_LOOP_AUTO)
        snprintf(loops, sizeof loops,
                 "loop lengths chosen as it runs (boundaries under 1%%, loops of at most %g s)",
                 c->run.max_loop_secs);
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

/* --resume or --checkpoint (eval and predict: or the latest in --checkpoint-dir): the
 * checkpoint to start from, checked against the config. --checkpoint names one file, which must
 * load; from a folder, the newest that loads is taken, damaged newer ones skipped with a warning
 * (and, when training, set aside as <name>.damaged: the run's own checkpoints replace them). */
static int load_start(const ifd_daemon_config *c, ifd_checkpoint **out, ifd_error *err)
{
    char path[4096 + 64];
    int rc;
    if (c->checkpoint) {
        snprintf(path, sizeof path, "%s", c->checkpoint);
        rc = ifd_checkpoint_load(path, out, err);
    } else {
        /* only the host that writes the folder sets damaged files aside */
        rc = ifd_checkpoint_load_latest(c->checkpoint_dir,
                                        c->run.mode == IFD_MODE_TRAIN && c->checkpoint_writer, out,
                                        path, sizeof path, err);
        if (rc)
            return ifd_error_prefix(err, "%s", c->resume ? "--resume" : "checkpoint_dir");
    }
    if (rc == IFD_OK && (rc = ifd_checkpoint_check(*out, &c->run, err)) != IFD_OK)
        ifd_error_prefix(err, "%s", path);
    /* Training resumes each host's producers from its own table: the same hosts only. */
    int hosts = c->run.hosts ? c->run.hosts->size : 1;
    if (rc == IFD_OK && c->run.mode == IFD_MODE_TRAIN && ifd_checkpoint_hosts(*out) != hosts)
        rc = ifd_error_set(err, IFD_EINVAL,
                           "%s: checkpoint '%s' holds the producer positions of %d host%s, this "
                           "run has %d: resume it on %d host%s",
                           c->checkpoint ? "--checkpoint" : "--resume", path,
                           ifd_checkpoint_hosts(*out), ifd_checkpoint_hosts(*out) == 1 ? "" : "s",
                           hosts, ifd_checkpoint_hosts(*out),
                           ifd_checkpoint_hosts(*out) == 1 ? "" : "s");
    if (rc == IFD_OK && c->run.mode == IFD_MODE_TRAIN && hosts > 1)
        rc = ifd_checkpoint_select_host(*out, c->run.hosts->rank, err);
    if (rc && *out) {
        ifd_checkpoint_free(*out);
        *out = NULL;
    }
    return rc;
}

/* A train run writes into checkpoint_dir only when nothing there is ahead of where it starts:
 * checkpoints of another timeline beside its own would be pruned for them, or taken by a later
 * --resume. */
static int check_dir(const ifd_daemon_config *c, const ifd_checkpoint *start, ifd_error *err)
{
    int64_t latest, from = start ? ifd_checkpoint_global_step(start) : c->run.initial_global_step;
    int rc = ifd_checkpoint_latest_step(c->checkpoint_dir, &latest, err);
    if (rc == IFD_ENOTFOUND)
        return IFD_OK;
    if (rc)
        return rc;
    if (latest > from)
        return ifd_error_set(err, IFD_EINVAL,
                             "checkpoint_dir: '%s' holds a checkpoint at global step %lld, ahead "
                             "of this run's start at %lld: pass --resume to continue from it, or "
                             "use another folder",
                             c->checkpoint_dir, (long long)latest, (long long)from);
    return IFD_OK;
}

/* Several hosts: "{rank}" in the endpoints and paths becomes this host's rank; the global batch
 * becomes this host's share; outputs named without "{rank}" are rank 0's alone (summaries, the
 * PUB socket, checkpoints). An error is a config error. */
static int apply_hosts(ifd_daemon_config *c, ifd_hosts *h, ifd_error *err)
{
    const char **fields[] = {&c->listen,      &c->publish,        &c->control,    &c->summaries,
                             &c->predictions, &c->checkpoint_dir, &c->checkpoint, &c->ready_file};
    int had_rank[sizeof fields / sizeof fields[0]];
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char *v = ifd_daemon_hosts_subst(*fields[i], h->rank);
        had_rank[i] = v != NULL;
        if (v == NULL)
            continue;
        if (c->nstrings == (int)(sizeof c->strings / sizeof c->strings[0])) {
            free(v);
            return ifd_error_set(err, IFD_ENOMEM, "too many string settings");
        }
        c->strings[c->nstrings++] = v;
        *fields[i] = v;
    }
    if (h->size == 1)
        return IFD_OK;
    if (c->control == c->default_control) { /* one a host, as hosts may share a machine */
        size_t n = strlen(c->default_control);
        snprintf(c->default_control + n, sizeof c->default_control - n, "-%d", h->rank);
    }
    int64_t b = c->run.batch_size, per = (int64_t)h->size * c->run.replicas;
    if (b % per != 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "batch_size: %lld is not divisible by %d hosts x %d replicas (the "
                             "global batch is split over every host's replicas)",
                             (long long)b, h->size, c->run.replicas);
    c->run.batch_size = b / h->size;
    c->run.hosts = h;
    if (h->rank != 0) {
        if (!had_rank[1])
            c->publish = "";
        if (!had_rank[3])
            c->summaries = NULL;
        if (!had_rank[7])
            c->ready_file = NULL;
    }
    /* A shared folder is rank 0's to write; every host gathers its positions into it. */
    if (h->rank != 0 && !had_rank[5])
        c->checkpoint_writer = 0;
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

static int run(int argc, char **argv, ifd_hosts *hosts)
{
    ifd_daemon_config cfg;
    ifd_daemon_config_defaults(&cfg);
    ifd_error err;
    ifd_error_clear(&err);
    int exit_now = 0;
    if (ifd_daemon_config_parse(&cfg, argc, argv, stdout, &exit_now, &err) ||
        (!exit_now && apply_hosts(&cfg, hosts, &err))) {
        ifd_daemon_config_name_keys(&cfg, &err);
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&err));
        ifd_daemon_config_free(&cfg);
        return 2;
    }
    if (exit_now) {
        ifd_daemon_config_free(&cfg);
        return 0;
    }
    ifd_log_set_level(cfg.log_level);
    if (hosts->size > 1)
        IFD_LOG_INFO("host %d of %d: batch size %lld of the global %lld", hosts->rank, hosts->size,
                     (long long)cfg.run.batch_size, (long long)cfg.run.batch_size * hosts->size);
    /* CURVE keys: a file that cannot be read or parsed is a config error, like a bad flag. */
    ifd_security *sec = NULL;
    if (ifd_security_create(&sec, &cfg, &err)) {
        ifd_daemon_config_name_keys(&cfg, &err);
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&err));
        ifd_daemon_config_free(&cfg);
        return 2;
    }
    cfg.security = sec;
    if (sec)
        IFD_LOG_INFO("CURVE on every socket: server key %s, %d producer key%s, %d admin key%s",
                     ifd_security_public_key(sec), ifd_security_authorized_count(sec),
                     ifd_security_authorized_count(sec) == 1 ? "" : "s",
                     ifd_security_admin_count(sec), ifd_security_admin_count(sec) == 1 ? "" : "s");
    else if (cfg.insecure)
        IFD_LOG_WARN("--insecure: no socket is authenticated or encrypted");
    /* Received frames are allocated by libzmq's I/O thread and freed by a replica when its step
     * is done. With glibc's defaults a frame of 128 KiB or more is a fresh mmap, page-faulted in
     * as libzmq writes it and unmapped again on free: at 1 MiB batches over tcp that cost a third
     * of the ingest rate. Keep them on the heap, where freed frames are reused (memory stays
     * bounded by the credit). Freed heap beyond 64 MiB at the top is given back at once, and the
     * connection monitor gives back free heap elsewhere with malloc_trim (host/monitor.c), so
     * that what a flood made libzmq buffer does not stay with the process. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    fit_descriptors(&cfg);
    if (strcmp(cfg.run.backend, "cuda") == 0)
        setenv("IFD_CUDA_GRAPHS", cfg.cuda_graphs ? "1" : "0", 1);
    if (cfg.replica_threads > 0) { /* read by the cpu backend (ifd_cpu_replica_threads) */
        char n[16];
        snprintf(n, sizeof n, "%d", cfg.replica_threads);
        setenv("IFD_REPLICA_THREADS", n, 1);
    }
    /* A checkpoint that cannot start this run is a config error, like a bad flag. */
    ifd_checkpoint *ck = NULL;
    int train = cfg.run.mode == IFD_MODE_TRAIN;
    if (cfg.run.mode == IFD_MODE_EVAL && !cfg.checkpoint && !cfg.checkpoint_dir) {
        fprintf(stderr, "infeedd: checkpoint: eval mode evaluates a checkpoint: expected "
                        "--checkpoint PATH or --checkpoint-dir DIR (its latest), got neither\n");
        ifd_security_destroy(sec);
        ifd_daemon_config_free(&cfg);
        return 2;
    }
    if ((cfg.resume || cfg.checkpoint || (!train && cfg.checkpoint_dir)) &&
        load_start(&cfg, &ck, &err)) {
        ifd_daemon_config_name_keys(&cfg, &err);
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&err));
        ifd_security_destroy(sec);
        ifd_daemon_config_free(&cfg);
        return 2;
    }
    cfg.run.restore = ck;
    if (cfg.checkpoint_dir && train && check_dir(&cfg, ck, &err)) {
        ifd_daemon_config_name_keys(&cfg, &err);
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&err));
        ifd_checkpoint_free(ck);
        ifd_security_destroy(sec);
        ifd_daemon_config_free(&cfg);
        return 2;
    }
    int bad = hosts->size > 1 ? hosts_setup_failed(hosts, 0) : -1;
    if (bad >= 0) {
        fprintf(stderr,
                "infeedd: host %d of %d cannot start the run (a config error: see its "
                "message); host %d stops too\n",
                bad, hosts->size, hosts->rank);
        ifd_checkpoint_free(ck);
        ifd_security_destroy(sec);
        ifd_daemon_config_free(&cfg);
        return 2;
    }
    if (ck)
        IFD_LOG_INFO("starting from a checkpoint at global step %lld (%d producers)",
                     (long long)ifd_checkpoint_global_step(ck), ifd_checkpoint_producer_count(ck));
    if (cfg.run.mode == IFD_MODE_PREDICT && ck == NULL)
        IFD_LOG_WARN("predict mode without --checkpoint or --checkpoint-dir: the parameters are "
                     "the seed's initial ones");

    int status = 1;
    ifd_ingest *g = NULL;
    ifd_session *s = NULL;
    ifd_sink *jsonl = NULL;
    ifd_predictions_file *pfile = NULL;
    int ready = cfg.ready_file && cfg.ready_file[0], ready_written = 0;
    if (ready)
        unlink(cfg.ready_file); /* a stale one would name another run's endpoints */
    install_signals();
    int rc = ifd_ingest_create(&g, &cfg, &signals_seen, &err);
    if (rc)
        goto out;
    __atomic_store_n(&signal_target, g, __ATOMIC_RELEASE);
    /* Producer positions are a training stream's: eval and predict take the parameters only. */
    if (ck && train && (rc = ifd_ingest_restore(g, ck, &err)) != IFD_OK)
        goto out;
    rc = ifd_session_create(&s, &cfg.run, ifd_ingest_source(g), &err);
    ifd_checkpoint_free(ck); /* the session copied what it needs */
    ck = NULL;
    cfg.run.restore = NULL;
    if (rc)
        goto out;
    if (cfg.checkpoint_dir && train) {
        ifd_checkpoint_options co = {.dir = cfg.checkpoint_dir,
                                     .every = cfg.checkpoint_every,
                                     .keep = cfg.keep_checkpoints,
                                     .positions = ifd_ingest_positions,
                                     .positions_arg = g,
                                     .hosts = cfg.run.hosts,
                                     .write = cfg.checkpoint_writer};
        ifd_hook h;
        rc = ifd_hook_checkpoint(&h, &co, &err);
        if (rc == IFD_OK && (rc = ifd_session_add_hook(s, &h)) != IFD_OK) {
            h.destroy(h.arg);
            ifd_error_set(&err, rc, "checkpoint hook");
        }
        if (rc)
            goto out;
    }
    if (cfg.summaries) {
        rc = ifd_sink_jsonl_create(&jsonl, cfg.summaries, &err);
        if (rc)
            goto out;
        ifd_session_add_sink(s, jsonl);
    }
    if (ifd_ingest_pub_sink(g))
        ifd_session_add_sink(s, ifd_ingest_pub_sink(g));
    if (cfg.run.mode == IFD_MODE_PREDICT) {
        ifd_prediction_sink ps = ifd_ingest_prediction_sink(g);
        ifd_session_add_prediction_sink(s, &ps);
        if (cfg.predictions) {
            rc = ifd_predictions_file_open(&pfile, cfg.predictions, &err);
            if (rc)
                goto out;
            ps = ifd_predictions_file_sink(pfile);
            ifd_session_add_prediction_sink(s, &ps);
        }
    }
    rc = ifd_ingest_start(g, s, &err);
    if (rc)
        goto out;
    json_t *endpoints = ifd_ingest_endpoints_json(g);
    describe(&cfg, ifd_session_program(s), endpoints);
    if (ready && (rc = write_ready_file(cfg.ready_file, endpoints, &err)) == IFD_OK)
        ready_written = 1;
    json_decref(endpoints);
    if (rc)
        goto out;
    IFD_LOG_INFO("waiting for producers");

    ifd_error run_err;
    ifd_error_clear(&run_err);
    int code = ifd_session_run(s, &run_err);
    ifd_end_reason reason = ifd_session_end_reason(s);
    ifd_ingest_finish(g, code, ifd_end_reason_name(reason), code ? ifd_error_text(&run_err) : "");
    if (code) {
        fprintf(stderr, "infeedd: the run ended with an error: %s\n", ifd_error_text(&run_err));
        status = 1;
    } else {
        status = 0;
    }
    rc = IFD_OK;
out:
    if (rc)
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&err));
    ifd_checkpoint_free(ck);
    ifd_ingest_release_session(g); /* before the session goes (an error after ingest_start) */
    ifd_session_destroy(s);
    /* Only this thread is left (libzmq's threads block signals): block them here too, so no
     * handler can still be using the ingest's eventfd when it is closed. */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    __atomic_store_n(&signal_target, NULL, __ATOMIC_RELEASE);
    ifd_ingest_destroy(g);
    if (ready_written)
        unlink(cfg.ready_file);
    ifd_security_destroy(sec);
    ifd_sink_destroy(jsonl);
    if (ifd_predictions_file_close(pfile, &err)) {
        fprintf(stderr, "infeedd: %s\n", ifd_error_text(&err));
        status = 1;
    }
    ifd_daemon_config_free(&cfg);
    return status;
}
