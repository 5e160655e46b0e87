/*
 * bench_ingest: producer -> infeedd -> device loop throughput, beside raw libzmq DEALER -> ROUTER
 * throughput for the same batch sizes, measured in the same run.
 *
 * For each batch size (4 KiB, 64 KiB, 1 MiB, 8 MiB) and transport (tcp, ipc, shm, shm-copy):
 *
 *  raw     Two threads of this process, each with its own libzmq context (so each has its own
 *          I/O thread, as two processes would). The DEALER sends the same messages a producer
 *          sends (a 32-byte BATCH header frame and the payload frame, zero-copy) with the same
 *          window of `--credit` batches in flight; the ROUTER answers each batch with a 24-byte
 *          ACK as soon as it has received it. So raw is the protocol's message pattern with
 *          nothing behind the socket: an upper bound for the daemon.
 *  infeed  infeedd is started as a child process (free loopback ports, or ipc paths under /tmp)
 *          with the `read` program (x float32 [D], every float read by the step, loss 0),
 *          `--replicas 1 --iterations-per-loop 100 --credit C --summary-every 0`, batches of 64
 *          rows; the C client streams `--steps` batches with ifd_producer_send_zc. The run ends
 *          at its last step (BYE) and the daemon's exit status is checked.
 *  shm     The same daemon on loopback tcp, the producer with a shared-memory pool (IFD_SHM_ON;
 *          tcp and ipc run with IFD_SHM_OFF): ifd_producer_buffer + commit, BATCH_SHM
 *          descriptors only. The bench writes nothing into the slots (a producer would write its
 *          rows there instead of into its own buffer), as tcp and ipc send one prepared buffer
 *          zero-copy. shm-copy: ifd_producer_send_zc, which copies the payload into the pool
 *          (one memcpy a batch). Neither has a raw side (no libzmq bytes to compare with): its run
 *          length comes from the ipc raw rate.
 *
 * vs_tcp is each row's infeed rate over the tcp row's of the same size, in the same run. raw_us
 * and prod_us are the CPU time a timed batch (CLOCK_THREAD_CPUTIME_ID) of the thread that sends:
 * raw's DEALER loop and the C client's producer, from the median cells; libzmq's I/O threads
 * and the daemon are not counted (bench/ingest_cpu.py counts the daemon's).
 *
 * Both sides skip the first `warm` batches (the daemon's first device loop, connection set-up)
 * and time from the ACK of the last warm-up batch to the last ACK. Each cell runs about
 * --seconds (the infeed run's length is set from the raw rate; a cell that is much slower stops
 * at a deadline and reports the ACKs it got). Raw and infeed alternate --repeat times per cell
 * and the medians are compared, since the machines this runs on are shared and noisy.
 *
 *   bench_ingest [--infeedd PATH] [--seconds S] [--credit C] [--repeat R] [--raw-only]
 *       [--raw-rcvhwm N]
 */
#include "core/wire.h"
#include <infeed/client.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define ROWS 64
#define WARM 100
#define IPL 100

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The calling thread's CPU time, in seconds. */
static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static void die(const char *fmt, const char *a)
{
    fprintf(stderr, "bench_ingest: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n");
    exit(1);
}

/* Releases counted by both sides' zero-copy free callbacks. */
static atomic_long g_released;

static void count_release(void *data, void *hint)
{
    (void)data;
    (void)hint;
    atomic_fetch_add_explicit(&g_released, 1, memory_order_relaxed);
}

typedef struct result {
    double gbs;    /* 1e9 bytes per second */
    double bps;    /* batches per second */
    int64_t n;     /* batches timed */
    double cpu_us; /* the sending thread's CPU a timed batch: raw's DEALER loop, the producer */
    int ok;        /* measured */
    char note[200];
} result;

/* ---- raw libzmq ----------------------------------------------------------------------------- */

typedef struct raw_router {
    void *ctx, *sock;
    pthread_t thread;
} raw_router;

/* Receives [id][header][payload...] and answers [id][ACK]; an END header stops it. */
static void *raw_router_main(void *arg)
{
    raw_router *r = arg;
    for (;;) {
        zmq_msg_t id, hdr, part;
        zmq_msg_init(&id);
        zmq_msg_init(&hdr);
        if (zmq_msg_recv(&id, r->sock, 0) < 0 || zmq_msg_recv(&hdr, r->sock, 0) < 0)
            break;
        int more = zmq_msg_more(&hdr);
        while (more) {
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, r->sock, 0) < 0)
                break;
            more = zmq_msg_more(&part);
            zmq_msg_close(&part);
        }
        const unsigned char *h = zmq_msg_data(&hdr);
        int type = zmq_msg_size(&hdr) >= IFD_PROTO_HDR ? (int)ifd_get_u16(h + 6) : 0;
        if (type == IFD_MSG_BATCH) {
            uint8_t ack[IFD_PROTO_ACK_HDR];
            ifd_proto_ack(ack, (int64_t)ifd_get_u64(h + 8), 1);
            zmq_msg_send(&id, r->sock, ZMQ_SNDMORE);
            zmq_send(r->sock, ack, sizeof ack, 0);
        } else {
            zmq_msg_close(&id);
        }
        zmq_msg_close(&hdr);
        if (type == IFD_MSG_END)
            break;
    }
    return NULL;
}

/* --raw-rcvhwm: the raw ROUTER's ZMQ_RCVHWM (0: libzmq's default, 1000). infeedd's is
 * IFD_ROUTER_RCVHWM (32), and libzmq's reader tells the I/O thread it may write again every
 * (hwm + 1) / 2 messages read whether or not it waits: a command a 16 messages at 32. */
static int raw_rcvhwm;

static result raw_run(const char *transport, size_t size, int credit, double seconds,
                      const void *payload)
{
    result res = {0};
    raw_router r;
    char ep[256];
    r.ctx = zmq_ctx_new();
    r.sock = zmq_socket(r.ctx, ZMQ_ROUTER);
    int64_t maxmsg = (int64_t)size + 65536;
    zmq_setsockopt(r.sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (raw_rcvhwm > 0)
        zmq_setsockopt(r.sock, ZMQ_RCVHWM, &raw_rcvhwm, sizeof raw_rcvhwm);
    if (strcmp(transport, "tcp") == 0)
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:*");
    else
        snprintf(ep, sizeof ep, "ipc:///tmp/ifd-bench-raw-%d.sock", (int)getpid());
    if (zmq_bind(r.sock, ep) != 0)
        die("raw: cannot bind %s", ep);
    size_t len = sizeof ep;
    zmq_getsockopt(r.sock, ZMQ_LAST_ENDPOINT, ep, &len);
    pthread_create(&r.thread, NULL, raw_router_main, &r);

    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    zmq_connect(d, ep);
    int64_t sent = 0, acked = 0;
    double t_warm = 0, t_last = 0, t_stop = 0, c_warm = 0;
    for (;;) {
        int stopping = t_warm > 0 && now_s() >= t_stop;
        if (!stopping && sent - acked < credit) {
            uint8_t h[IFD_PROTO_BATCH_HDR] = {0};
            ifd_proto_header(h, IFD_MSG_BATCH);
            ifd_put_u64(h + 8, (uint64_t)sent);
            ifd_put_u64(h + 16, ROWS);
            ifd_put_u32(h + 28, 1);
            zmq_msg_t m;
            zmq_msg_init_data(&m, (void *)payload, size, count_release, NULL);
            zmq_send(d, h, sizeof h, ZMQ_SNDMORE);
            zmq_msg_send(&m, d, 0);
            sent++;
            continue;
        }
        if (stopping && acked == sent)
            break;
        unsigned char ack[64];
        if (zmq_recv(d, ack, sizeof ack, 0) < 0)
            die("raw: %s", zmq_strerror(errno));
        acked++;
        if (acked == WARM) {
            t_warm = now_s();
            t_stop = t_warm + seconds;
            c_warm = thread_cpu_s();
        }
        t_last = now_s();
    }
    double c_last = thread_cpu_s();
    uint8_t end[IFD_PROTO_HDR];
    ifd_proto_header(end, IFD_MSG_END);
    zmq_send(d, end, sizeof end, 0);
    pthread_join(r.thread, NULL);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(r.sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(d);
    zmq_ctx_term(ctx);
    zmq_close(r.sock);
    zmq_ctx_term(r.ctx);
    if (strcmp(transport, "ipc") == 0)
        unlink(ep + strlen("ipc://"));

    res.n = acked - WARM;
    double dt = t_last - t_warm;
    res.bps = (double)res.n / dt;
    res.cpu_us = 1e6 * (c_last - c_warm) / (double)res.n;
    res.gbs = res.bps * (double)size / 1e9;
    res.ok = 1;
    return res;
}

/* ---- infeedd ------------------------------------------------------------------------------- */

/* A loopback TCP port that is free now (the daemon binds it a moment later). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        die("cannot find a free port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

typedef struct daemon_proc {
    pid_t pid;
    char listen[128], publish[128], control[128];
    char log[128];
} daemon_proc;

static void daemon_endpoints(daemon_proc *dp, const char *transport, int cell)
{
    if (strcmp(transport, "ipc") != 0) { /* tcp, and shm's descriptors */
        snprintf(dp->listen, sizeof dp->listen, "tcp://127.0.0.1:%d", free_port());
        snprintf(dp->publish, sizeof dp->publish, "tcp://127.0.0.1:%d", free_port());
        snprintf(dp->control, sizeof dp->control, "tcp://127.0.0.1:%d", free_port());
    } else {
        int pid = (int)getpid();
        snprintf(dp->listen, sizeof dp->listen, "ipc:///tmp/ifd-bench-%d-%d-in.sock", pid, cell);
        snprintf(dp->publish, sizeof dp->publish, "ipc:///tmp/ifd-bench-%d-%d-pub.sock", pid, cell);
        snprintf(dp->control, sizeof dp->control, "ipc:///tmp/ifd-bench-%d-%d-ctl.sock", pid, cell);
    }
    snprintf(dp->log, sizeof dp->log, "/tmp/ifd-bench-%d-%d.log", (int)getpid(), cell);
}

static void daemon_start(daemon_proc *dp, const char *infeedd, size_t size, int credit,
                         int64_t steps)
{
    char features[32], batch[32], steps_s[32], credit_s[32], ipl[32];
    snprintf(features, sizeof features, "%zu", size / ROWS / sizeof(float));
    snprintf(batch, sizeof batch, "%d", ROWS);
    snprintf(steps_s, sizeof steps_s, "%lld", (long long)steps);
    snprintf(credit_s, sizeof credit_s, "%d", credit);
    snprintf(ipl, sizeof ipl, "%d", IPL);
    char *argv[] = {(char *)infeedd,
                    "--listen",
                    dp->listen,
                    "--publish",
                    dp->publish,
                    "--control",
                    dp->control,
                    "--program",
                    "read",
                    "--features",
                    features,
                    "--batch-size",
                    batch,
                    "--replicas",
                    "1",
                    "--iterations-per-loop",
                    ipl,
                    "--steps",
                    steps_s,
                    "--credit",
                    credit_s,
                    "--summary-every",
                    "0",
                    "--log-level",
                    "warn",
                    NULL};
    fflush(stdout);
    dp->pid = fork();
    if (dp->pid < 0)
        die("fork: %s", strerror(errno));
    if (dp->pid == 0) {
        int fd = open(dp->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(infeedd, argv);
        fprintf(stderr, "exec %s: %s\n", infeedd, strerror(errno));
        _exit(127);
    }
}

/* Waits up to timeout_s for the daemon to exit; kills it after that. Returns its exit status,
 * or -1 when it had to be killed. */
static int daemon_wait(daemon_proc *dp, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    int st = 0;
    for (;;) {
        pid_t r = waitpid(dp->pid, &st, WNOHANG);
        if (r == dp->pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (now_s() >= deadline)
            break;
        sleep_ms(5);
    }
    kill(dp->pid, SIGTERM);
    double hard = now_s() + 3;
    while (waitpid(dp->pid, &st, WNOHANG) != dp->pid) {
        if (now_s() >= hard) {
            kill(dp->pid, SIGKILL);
            waitpid(dp->pid, &st, 0);
            break;
        }
        sleep_ms(5);
    }
    return -1;
}

static void daemon_log_tail(const daemon_proc *dp)
{
    FILE *f = fopen(dp->log, "r");
    if (f == NULL)
        return;
    char buf[4096];
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    fseek(f, end > (long)sizeof buf - 1 ? end - (long)sizeof buf + 1 : 0, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    fprintf(stderr, "---- infeedd log (%s) ----\n%s\n----\n", dp->log, buf);
}

static void daemon_cleanup(const daemon_proc *dp, const char *transport)
{
    unlink(dp->log);
    if (strcmp(transport, "ipc") == 0) {
        unlink(dp->listen + strlen("ipc://"));
        unlink(dp->publish + strlen("ipc://"));
        unlink(dp->control + strlen("ipc://"));
    }
}

enum { SEND_ZC, SEND_SHM_IN_PLACE, SEND_SHM_COPY };

static int send_one(ifd_producer *p, int how, const void *payload, size_t size, ifd_error *err)
{
    if (how == SEND_SHM_IN_PLACE) {
        void *data;
        int rc = ifd_producer_buffer(p, 1, &data, 1, 1000, err);
        return rc ? rc : ifd_producer_commit(p, ROWS, 1000, err);
    }
    ifd_frame fr = {payload, size};
    return ifd_producer_send_zc(p, ROWS, &fr, 1, count_release, NULL, 1000, err);
}

static result infeed_run(const char *infeedd, const char *transport, int cell, size_t size,
                         int credit, double seconds, double raw_bps, const void *payload)
{
    int how = strcmp(transport, "shm") == 0        ? SEND_SHM_IN_PLACE
              : strcmp(transport, "shm-copy") == 0 ? SEND_SHM_COPY
                                                   : SEND_ZC;
    result res = {0};
    /* As many batches as raw would take `seconds` for, whole device loops, after the warm-up. */
    int64_t n = (int64_t)(raw_bps * seconds);
    if (n < 3 * IPL)
        n = 3 * IPL;
    if (n > 2000000)
        n = 2000000;
    int64_t steps = WARM + (n + IPL - 1) / IPL * IPL;
    double deadline_s = 5 * seconds + 10;

    daemon_proc dp;
    daemon_endpoints(&dp, transport, cell);
    daemon_start(&dp, infeedd, size, credit, steps);

    ifd_error err;
    ifd_producer *p = NULL;
    ifd_client_options opts = {.shm = how == SEND_ZC ? IFD_SHM_OFF : IFD_SHM_ON};
    int rc = ifd_producer_create_opts(&p, dp.listen, "bench", &opts, &err);
    ifd_input_spec schema = {"x", IFD_F32, 1, {(int64_t)(size / ROWS / sizeof(float))}};
    if (rc == IFD_OK)
        rc = ifd_producer_hello(p, &schema, 1, 0, 15000, &err);
    if (rc == IFD_OK && ifd_producer_batch_size(p) != ROWS)
        rc = ifd_error_set(&err, IFD_ESHAPE, "WELCOME batch_size %lld, expected %d",
                           (long long)ifd_producer_batch_size(p), ROWS);
    const char *want = how == SEND_ZC ? transport : "shm";
    if (rc == IFD_OK && strcmp(ifd_producer_transport(p), want) != 0)
        rc = ifd_error_set(&err, IFD_EPROTO, "transport %s, expected %s", ifd_producer_transport(p),
                           want);
    double t_warm = 0, t_last = 0, t_end = now_s() + deadline_s, c_warm = 0;
    int64_t acked_warm = -1;
    for (int64_t b = 0; rc == IFD_OK && b < steps; b++) {
        rc = send_one(p, how, payload, size, &err);
        if (rc == IFD_ETIMEDOUT && now_s() < t_end) {
            b--;
            rc = IFD_OK;
        }
        int64_t a = ifd_producer_acked(p);
        if (acked_warm < 0 && a >= WARM) {
            t_warm = now_s();
            c_warm = thread_cpu_s();
            acked_warm = a;
        }
    }
    /* The last ACKs. */
    while (rc == IFD_OK && ifd_producer_in_flight(p) > 0 && now_s() < t_end) {
        rc = ifd_producer_wait(p, 1, &err);
        if (rc == IFD_ETIMEDOUT)
            rc = IFD_OK;
        if (acked_warm < 0 && ifd_producer_acked(p) >= WARM) {
            t_warm = now_s();
            c_warm = thread_cpu_s();
            acked_warm = ifd_producer_acked(p);
        }
    }
    t_last = now_s();
    double c_last = thread_cpu_s();
    if (rc == IFD_ECLOSED && ifd_producer_in_flight(p) == 0)
        rc = IFD_OK; /* BYE came with the last ACK */
    int64_t acked = p ? ifd_producer_acked(p) : 0;
    const char *bye = NULL;
    ifd_error berr;
    if (p && rc == IFD_OK)
        ifd_producer_bye(p, 10000, &bye, &berr);
    int timed_out = rc == IFD_OK && acked < steps;
    int status = daemon_wait(&dp, rc == IFD_OK && !timed_out ? 15 : 0.5);

    if (acked_warm >= 0 && acked > acked_warm && t_last > t_warm) {
        res.n = acked - acked_warm;
        res.bps = (double)res.n / (t_last - t_warm);
        res.cpu_us = 1e6 * (c_last - c_warm) / (double)res.n;
        res.gbs = res.bps * (double)size / 1e9;
        res.ok = 1;
    }
    if (rc != IFD_OK)
        snprintf(res.note, sizeof res.note, "client: %s", ifd_error_text(&err));
    else if (timed_out)
        snprintf(res.note, sizeof res.note, "stopped at the %.0f s deadline: %lld of %lld acked",
                 deadline_s, (long long)acked, (long long)steps);
    else if (status != 0)
        snprintf(res.note, sizeof res.note, "infeedd exit status %d", status);
    else if (bye == NULL || strstr(bye, "\"ok\"") == NULL)
        snprintf(res.note, sizeof res.note, "BYE: %s", bye ? bye : "(none)");
    if (res.note[0]) {
        fprintf(stderr, "bench_ingest: %s %zu bytes: %s\n", transport, size, res.note);
        daemon_log_tail(&dp);
    }
    ifd_producer_destroy(p);
    daemon_cleanup(&dp, transport);
    return res;
}

#define MAX_REPEAT 15

/* raw_us: raw's sending thread's CPU a batch (when the row has a raw side). */
static void print_cpu(int have_raw, double us)
{
    if (have_raw)
        printf(" %7.2f", us);
    else
        printf(" %7s", "-");
}

/* The result with the median rate (the upper median for an even count). */
static result median(result *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1].bps > v[j].bps; j--) {
            result t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

/* ---- main ---------------------------------------------------------------------------------- */

static const char *size_name(size_t s, char *buf, size_t len)
{
    if (s >= (1u << 20))
        snprintf(buf, len, "%zu MiB", s >> 20);
    else
        snprintf(buf, len, "%zu KiB", s >> 10);
    return buf;
}

/* Whether NAME is one of the comma-separated LIST. */
static int listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    char def[4096];
    snprintf(def, sizeof def, "%s", argv[0]);
    char path[4200];
    snprintf(path, sizeof path, "%s/../host/infeedd", dirname(def));
    const char *infeedd = path;
    double seconds = 0.5;
    int credit = 0, raw_only = 0, repeat = 3; /* credit 0: infeedd's auto credit per size */
    size_t only = 0;
    const char *want_tr = "tcp,ipc,shm,shm-copy";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--raw-only") == 0)
            raw_only = 1;
        else if (i + 1 < argc && strcmp(argv[i], "--infeedd") == 0)
            infeedd = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--credit") == 0)
            credit = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--raw-rcvhwm") == 0)
            raw_rcvhwm = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--repeat") == 0)
            repeat = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--size") == 0)
            only = (size_t)atol(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--transports") == 0)
            want_tr = argv[++i];
        else {
            fprintf(stderr, "usage: bench_ingest [--infeedd PATH] [--seconds S (0.5)] "
                            "[--credit C (0: infeedd's auto credit for each size)] [--repeat R "
                            "(3)] [--size BYTES (one size only)] [--transports "
                            "tcp,ipc,shm,shm-copy] [--raw-only] [--raw-rcvhwm N]\n");
            return 2;
        }
    }
    if (seconds <= 0 || seconds > 60 || credit < 0 || repeat < 1 || repeat > MAX_REPEAT) {
        fprintf(stderr,
                "bench_ingest: expected 0 < --seconds <= 60, --credit >= 0 and 1 <= "
                "--repeat <= %d\n",
                MAX_REPEAT);
        return 2;
    }
    if (!raw_only && access(infeedd, X_OK) != 0) {
        fprintf(stderr, "bench_ingest: no infeedd at %s (--infeedd PATH); raw side only\n",
                infeedd);
        raw_only = 1;
    }
    signal(SIGPIPE, SIG_IGN);

    static const size_t sizes[] = {4u << 10, 64u << 10, 1u << 20, 8u << 20};
    static const char *const transports[] = {"tcp", "ipc", "shm", "shm-copy"};
    enum { NT = 4, NRAW = 2 }; /* the first NRAW have a raw side */
    void *payload = malloc(8u << 20);
    if (payload == NULL)
        die("%s", "out of memory");
    /* Floats, so the read program sees numbers. */
    for (size_t i = 0; i < (8u << 20) / sizeof(float); i++)
        ((float *)payload)[i] = (float)(i % 1000) * 0.001f;

    printf("batches of %d rows, credit %s, ~%.1f s per measurement, %d warm-up batches, median "
           "of %d%s\n",
           ROWS, credit ? "as given" : "auto (infeedd's default for the size)", seconds, WARM,
           repeat, raw_only ? " (raw only)" : "");
    printf("%-8s %-8s %6s %10s %14s %12s %16s %7s %7s %7s %7s\n", "size", "tr", "credit",
           "raw_GB/s", "raw_batches/s", "infeed_GB/s", "infeed_batches/s", "ratio", "vs_tcp",
           "raw_us", "prod_us");
    double ratio[4][NT] = {{0}}, rate[4][NT] = {{0}};
    int have[4][NT] = {{0}};
    int cell = 0;
    for (int s = 0; s < 4; s++) {
        double last_raw_bps = 0;
        for (int t = 0; t < NT; t++, cell++) {
            char sn[32];
            if (only && sizes[s] != only)
                continue;
            if (raw_only && t >= NRAW)
                continue;
            if (!listed(want_tr, transports[t]))
                continue;
            int cr = credit ? credit : ifd_proto_auto_credit(sizes[s]);
            /* raw and infeed alternate, repeat times; each side's median is reported. */
            result raws[MAX_REPEAT], infs[MAX_REPEAT];
            int ninf = 0;
            for (int r = 0; r < repeat; r++) {
                if (t < NRAW)
                    raws[r] = raw_run(transports[t], sizes[s], cr, seconds, payload);
                if (!raw_only) {
                    result x = infeed_run(infeedd, transports[t], cell, sizes[s], cr, seconds,
                                          t < NRAW ? raws[r].bps : last_raw_bps, payload);
                    if (x.ok)
                        infs[ninf++] = x;
                }
            }
            result raw = {0}, inf = {0};
            if (t < NRAW) {
                raw = median(raws, repeat);
                last_raw_bps = raw.bps;
            }
            if (ninf)
                inf = median(infs, ninf);
            printf("%-8s %-8s %6d", size_name(sizes[s], sn, sizeof sn), transports[t], cr);
            if (t < NRAW)
                printf(" %10.3f %14.0f", raw.gbs, raw.bps);
            else
                printf(" %10s %14s", "-", "-");
            if (inf.ok) {
                rate[s][t] = inf.bps;
                have[s][t] = 1;
                ratio[s][t] = t < NRAW ? inf.bps / raw.bps : 0;
                printf(" %12.3f %16.0f", inf.gbs, inf.bps);
                if (t < NRAW)
                    printf(" %7.2f", ratio[s][t]);
                else
                    printf(" %7s", "-");
                if (have[s][0])
                    printf(" %7.2f", inf.bps / rate[s][0]);
                else
                    printf(" %7s", "-");
                print_cpu(t < NRAW, raw.cpu_us);
                printf(" %7.2f%s\n", inf.cpu_us, inf.note[0] ? "  (see above)" : "");
            } else {
                printf(" %12s %16s %7s %7s", "-", "-", "-", "-");
                print_cpu(t < NRAW, raw.cpu_us);
                printf(" %7s\n", "-");
            }
            fflush(stdout);
        }
    }
    free(payload);
    if (raw_only)
        return 0;
    for (int t = 0; t < NRAW; t++) {
        const struct {
            int s;
            double want;
        } targets[] = {{2, 0.9}, {0, 0.8}};
        for (int k = 0; k < 2; k++) {
            int s = targets[k].s;
            char sn[32];
            int ok = have[s][t] && ratio[s][t] >= targets[k].want;
            if (have[s][t])
                printf("target: %s %s ratio %.2f >= %.1f: %s\n", size_name(sizes[s], sn, sizeof sn),
                       transports[t], ratio[s][t], targets[k].want, ok ? "met" : "NOT met");
            else
                printf("target: %s %s: not measured\n", size_name(sizes[s], sn, sizeof sn),
                       transports[t]);
        }
    }
    /* shm against tcp at 1 MiB: the point of the pool. */
    if (have[2][0] && have[2][2])
        printf("target: 1 MiB shm/tcp %.2f >= 3.0: %s (shm-copy/tcp %.2f)\n",
               rate[2][2] / rate[2][0], rate[2][2] / rate[2][0] >= 3.0 ? "met" : "NOT met",
               have[2][3] ? rate[2][3] / rate[2][0] : 0.0);
    else
        printf("target: 1 MiB shm/tcp: not measured\n");
    return 0;
}
