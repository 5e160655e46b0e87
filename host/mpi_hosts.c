#include "host/mpi_hosts.h"

#include "core/log.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

char *ifd_daemon_hosts_subst(const char *s, int rank)
{
    static const char key[] = "{rank}";
    if (s == NULL || strstr(s, key) == NULL)
        return NULL;
    char num[16];
    int nl = snprintf(num, sizeof num, "%d", rank);
    size_t count = 0;
    for (const char *p = s; (p = strstr(p, key)) != NULL; p += sizeof key - 1)
        count++;
    char *out = malloc(strlen(s) + count * (size_t)nl + 1);
    if (out == NULL)
        return NULL;
    char *o = out;
    for (const char *p = s;;) {
        const char *q = strstr(p, key);
        if (q == NULL) {
            strcpy(o, p);
            break;
        }
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, num, (size_t)nl);
        o += nl;
        p = q + sizeof key - 1;
    }
    return out;
}

#ifdef IFD_HAVE_MPI
#include <mpi.h>

#define STAGED_I64 16 /* values of an all-reduce staged per channel (callers pass 1 or 2) */

typedef struct mpi_hosts {
    MPI_Comm comm[IFD_HOSTS_NCHANNELS];
    /* allreduce_i64's values, staged per channel (each channel has one caller at a time): a
     * collective given up on (stop) may still complete after the call returned, and it then
     * writes here rather than into the caller's frame; and Open MPI reads and writes a
     * collective's buffer on whichever thread progresses it (any thread's MPI_Test), in ways
     * ThreadSanitizer cannot follow, so the copies in and out are the only accesses of ours it
     * can pair with them (tests/tsan.supp names mpi_allreduce_i64). */
    int64_t staged[IFD_HOSTS_NCHANNELS][STAGED_I64];
} mpi_hosts;

static int mpi_error(ifd_error *err, int code, const char *what, int channel)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", code);
    static const char *const names[IFD_HOSTS_NCHANNELS] = {"step", "loop",         "outfeed",
                                                           "stop", "eval outfeed", "eval stop"};
    return ifd_error_set(err, IFD_EIO, "%s on the %s channel: %s", what, names[channel], text);
}

/* Waits for req, polling stop: spins a while (hosts usually arrive together), then sleeps 50 us
 * between tests. The STOP channels' rounds are not latency-critical and often wait for a host
 * that is still in its pause between rounds: 1 ms between tests, from the first. */
static int wait_req(MPI_Request *req, int channel, ifd_hosts_stop_fn stop, void *stop_arg)
{
    int slow = channel == IFD_HOSTS_STOP || channel == IFD_HOSTS_EVAL_STOP;
    long spin = slow ? 0 : 2000;
    long pause_ns = slow ? 1000000 : 50000;
    for (long i = 0;; i++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return rc;
        if (done)
            return MPI_SUCCESS;
        if (stop && stop(stop_arg))
            return -1;
        if (i >= spin) {
            struct timespec ts = {0, pause_ns};
            nanosleep(&ts, NULL);
        }
    }
}

static int mpi_allgather(void *ctx, int channel, const void *send, void *recv, size_t bytes,
                         ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err)
{
    mpi_hosts *m = ctx;
    MPI_Request req;
    int rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                            m->comm[channel], &req);
    if (rc == MPI_SUCCESS)
        rc = wait_req(&req, channel, stop, stop_arg);
    if (rc == -1)
        return ifd_error_set(err, IFD_ESTOPPED, "stopped waiting for the other hosts");
    if (rc != MPI_SUCCESS)
        return mpi_error(err, rc, "all-gather", channel);
    return IFD_OK;
}

static int mpi_allreduce_i64(void *ctx, int channel, int64_t *vals, int n, ifd_hosts_op op,
                             ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err)
{
    mpi_hosts *m = ctx;
    MPI_Op mop = op == IFD_HOSTS_MIN ? MPI_MIN : op == IFD_HOSTS_MAX ? MPI_MAX : MPI_SUM;
    int64_t *buf = n <= STAGED_I64 ? m->staged[channel] : vals;
    if (buf != vals)
        memcpy(buf, vals, sizeof *vals * (size_t)n);
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_INT64_T, mop, m->comm[channel], &req);
    if (rc == MPI_SUCCESS)
        rc = wait_req(&req, channel, stop, stop_arg);
    if (rc == -1)
        return ifd_error_set(err, IFD_ESTOPPED, "stopped waiting for the other hosts");
    if (rc != MPI_SUCCESS)
        return mpi_error(err, rc, "all-reduce", channel);
    if (buf != vals)
        memcpy(vals, buf, sizeof *vals * (size_t)n);
    return IFD_OK;
}

static int mpi_broadcast(void *ctx, int channel, void *buf, size_t bytes, int root,
                         ifd_hosts_stop_fn stop, void *stop_arg, ifd_error *err)
{
    mpi_hosts *m = ctx;
    if (bytes > INT_MAX)
        return ifd_error_set(err, IFD_EINVAL, "broadcast: %zu bytes, MPI counts at most %d", bytes,
                             INT_MAX);
    MPI_Request req;
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, m->comm[channel], &req);
    if (rc == MPI_SUCCESS)
        rc = wait_req(&req, channel, stop, stop_arg);
    if (rc == -1)
        return ifd_error_set(err, IFD_ESTOPPED, "stopped waiting for the other hosts");
    if (rc != MPI_SUCCESS)
        return mpi_error(err, rc, "broadcast", channel);
    return IFD_OK;
}

static const ifd_hosts_ops mpi_ops = {
    .allgather = mpi_allgather,
    .allreduce_i64 = mpi_allreduce_i64,
    .broadcast = mpi_broadcast,
};

/* Whether an MPI launcher started this process (Open MPI, PMIx, PMI-1/2 as Slurm's srun sets). */
static int launched_by_mpi(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

static int mpi_started;

int ifd_daemon_hosts_init(ifd_hosts *out, int *argc, char ***argv, ifd_error *err)
{
    *out = (ifd_hosts){.rank = 0, .size = 1};
    if (!launched_by_mpi())
        return IFD_OK;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return ifd_error_set(err, IFD_EIO, "hosts: MPI_Init_thread failed");
    mpi_started = 1;
    if (provided < MPI_THREAD_MULTIPLE)
        return ifd_error_set(err, IFD_ENOTSUP,
                             "hosts: this MPI gives thread level %d; infeedd needs "
                             "MPI_THREAD_MULTIPLE (%d): its replica, outfeed and session threads "
                             "each make collectives",
                             provided, MPI_THREAD_MULTIPLE);
    MPI_Comm_rank(MPI_COMM_WORLD, &out->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &out->size);
    if (out->size == 1)
        return IFD_OK;
    mpi_hosts *m = calloc(1, sizeof *m);
    if (m == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "hosts");
    for (int c = 0; c < IFD_HOSTS_NCHANNELS; c++) {
        MPI_Comm_dup(MPI_COMM_WORLD, &m->comm[c]);
        MPI_Comm_set_errhandler(m->comm[c], MPI_ERRORS_RETURN);
    }
    out->ops = &mpi_ops;
    out->ctx = m;
    return IFD_OK;
}

void ifd_daemon_hosts_abort(const ifd_hosts *h, int code)
{
    if (mpi_started && h->size > 1)
        MPI_Abort(MPI_COMM_WORLD, code);
}

void ifd_daemon_hosts_fini(ifd_hosts *h)
{
    mpi_hosts *m = h->ctx;
    if (m) {
        for (int c = 0; c < IFD_HOSTS_NCHANNELS; c++)
            MPI_Comm_free(&m->comm[c]);
        free(m);
        h->ctx = NULL;
    }
    if (mpi_started) {
        MPI_Finalize();
        mpi_started = 0;
    }
}

#else /* no MPI: always one host */

int ifd_daemon_hosts_init(ifd_hosts *out, int *argc, char ***argv, ifd_error *err)
{
    (void)argc;
    (void)argv;
    *out = (ifd_hosts){.rank = 0, .size = 1};
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1)
            return ifd_error_set(err, IFD_ENOTSUP,
                                 "hosts: started as one of %s processes (%s), but this infeedd "
                                 "was built without MPI (rebuild with Open MPI's libopenmpi-dev "
                                 "installed) and cannot train with the others",
                                 v, vars[i]);
    }
    return IFD_OK;
}

void ifd_daemon_hosts_abort(const ifd_hosts *h, int code)
{
    (void)h;
    (void)code;
}

void ifd_daemon_hosts_fini(ifd_hosts *h)
{
    (void)h;
}

#endif
