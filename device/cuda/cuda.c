/*
 * The cuda backend (cuda_backend.h lists its files): errors, the event wait that abort interrupts,
 * and open and close.
 */
#include "core/batch.h"
#include "core/log.h"
#include "core/thread.h"
#include "device/cuda/cuda_backend.h"
#include <infeed/hosts.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ----------------------------------------------------------------------------- */

/* "cudaMalloc(&p, n)" -> "cudaMalloc" */
static void call_name(const char *expr, char *out, size_t len)
{
    size_t n = strcspn(expr, "(");
    if (n >= len)
        n = len - 1;
    memcpy(out, expr, n);
    out[n] = '\0';
}

static int lib_error(ifd_error *err, int code, int gpu, const char *expr, const char *text)
{
    char name[64];
    call_name(expr, name, sizeof name);
    if (gpu < 0)
        return ifd_error_set(err, code, "cuda backend: %s: %s", name, text);
    return ifd_error_set(err, code, "cuda backend: GPU %d: %s: %s", gpu, name, text);
}

int ifd_cuda_error(ifd_error *err, int gpu, const char *expr, const char *text)
{
    return lib_error(err, IFD_ECUDA, gpu, expr, text);
}

int ifd_nccl_error(ifd_error *err, int gpu, const char *expr, const char *text)
{
    return lib_error(err, IFD_ENCCL, gpu, expr, text);
}

/*
 * Waits for ev on the host by polling (a short spin, then sleeps growing to 100 us), so that
 * abort interrupts it: a blocking cudaEventSynchronize could not be, and a step whose all-reduce
 * waits for a peer that will never come never finishes. After an abort it keeps polling for
 * grace_ns before it gives up with IFD_ESTOPPED. rep may be NULL; when given, a wait for a step
 * beyond the one at which some replica's input ended fails at once instead of hanging.
 */
int ifd_cu_wait_event(cu_dev *cd, cu_replica *rep, cudaEvent_t ev, int64_t grace_ns, ifd_error *err)
{
    int64_t sleep_ns = 1000, give_up = 0;
    int gpu = rep ? rep->gpu : -1;
    for (int i = 0;; i++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return IFD_OK;
        (void)cudaGetLastError(); /* cudaErrorNotReady must not linger as the last error */
        if (e != cudaErrorNotReady)
            return ifd_cuda_error(err, gpu, "cudaEventQuery", cudaGetErrorString(e));
        if (is_aborted(cd)) {
            int64_t now = ifd_clock_ns();
            if (give_up == 0)
                give_up = now + grace_ns;
            if (now >= give_up)
                return ifd_error_set(err, IFD_ESTOPPED, "device aborted");
        }
        if (rep && rep->step > __atomic_load_n(&cd->eof_step, __ATOMIC_ACQUIRE))
            return ifd_error_set(err, IFD_EINTERNAL,
                                 "cuda backend: replica %d enqueued step %lld but a peer's input "
                                 "ended at step %lld; its all-reduce can never finish (shards "
                                 "must come to every replica alike)",
                                 rep->base.index, (long long)rep->step,
                                 (long long)__atomic_load_n(&cd->eof_step, __ATOMIC_ACQUIRE));
        if (i < 64) {
            ifd_cpu_relax();
            continue;
        }
        ifd_sleep_ns(sleep_ns);
        if (sleep_ns < 100000)
            sleep_ns *= 2;
    }
}

/* ---- open and close ---------------------------------------------------------------------------
 */

/*
 * One communicator per local GPU, created from one ncclUniqueId with ncclCommInitRank inside a
 * group (one thread initialises every local rank). Several hosts: one communicator over every
 * GPU of every host (nranks = hosts x replicas), the id rank 0's (hosts_nccl_id), this host's
 * first rank its first global replica.
 */
static int nccl_open(cu_dev *cd, const ncclUniqueId *id, int nranks, int first_rank, ifd_error *err)
{
    int rc = IFD_OK, r = 0;
    NCCL_TRY_GOTO(-1, ncclGroupStart(), rc, err, out);
    for (r = 0; r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, err, end_group);
        NCCL_TRY_GOTO(rep->gpu, ncclCommInitRank(&rep->comm, nranks, *id, first_rank + r), rc, err,
                      end_group);
    }
end_group:;
    ncclResult_t g = ncclGroupEnd();
    if (rc == IFD_OK && g != ncclSuccess)
        rc = ifd_nccl_error(err, -1, "ncclGroupEnd", ncclGetErrorString(g));
    if (rc)
        goto out;
    /* One all-reduce of the gradient vector now: NCCL connects its peers at a communicator's
     * first collective, a host-side handshake that must not happen inside a step or a capture. */
    NCCL_TRY_GOTO(-1, ncclGroupStart(), rc, err, out);
    for (r = 0; r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        ncclResult_t a =
            ncclAllReduce(rep->st.grads, rep->st.grads, (size_t)cd->dev->cfg.program->nparam_floats,
                          ncclFloat, ncclSum, rep->comm, rep->cs);
        if (a != ncclSuccess && rc == IFD_OK)
            rc = ifd_nccl_error(err, rep->gpu, "ncclAllReduce", ncclGetErrorString(a));
    }
    g = ncclGroupEnd();
    if (rc == IFD_OK && g != ncclSuccess)
        rc = ifd_nccl_error(err, -1, "ncclGroupEnd", ncclGetErrorString(g));
    for (r = 0; rc == IFD_OK && r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, err, out);
        CUDA_TRY_GOTO(rep->gpu, cudaStreamSynchronize(rep->cs), rc, err, out);
    }
out:
    return rc;
}

/* Several hosts: every host has as many GPUs in the job (the ranks and the batch split assume
 * it), and gets rank 0's ncclUniqueId, over the LOOP channel (ifd_cu_open runs on the session's
 * thread before any loop). */
static int hosts_nccl_id(cu_dev *cd, const ifd_hosts *h, ncclUniqueId *id, ifd_error *err)
{
    int64_t lo = cd->replicas, hi = cd->replicas;
    int rc = h->ops->allreduce_i64(h->ctx, IFD_HOSTS_LOOP, &lo, 1, IFD_HOSTS_MIN, NULL, NULL, err);
    if (rc == IFD_OK)
        rc = h->ops->allreduce_i64(h->ctx, IFD_HOSTS_LOOP, &hi, 1, IFD_HOSTS_MAX, NULL, NULL, err);
    if (rc)
        return rc;
    if (lo != hi)
        return ifd_error_set(err, IFD_EINVAL,
                             "cuda backend: replicas: host %d has %d GPUs in the job, other hosts "
                             "from %lld to %lld; every host needs the same --replicas (one NCCL "
                             "rank a GPU, the global batch split evenly)",
                             h->rank, cd->replicas, (long long)lo, (long long)hi);
    memset(id, 0, sizeof *id);
    if (h->rank == 0) {
        ncclResult_t g = ncclGetUniqueId(id);
        if (g != ncclSuccess)
            rc = ifd_nccl_error(err, -1, "ncclGetUniqueId", ncclGetErrorString(g));
    }
    /* A failed ncclGetUniqueId on rank 0 still sends (zeros), so that no host waits here; rank
     * 0 then fails, and its abort ends the job. */
    ifd_error berr;
    ifd_error_clear(&berr);
    int brc = h->ops->broadcast(h->ctx, IFD_HOSTS_LOOP, id, sizeof *id, 0, NULL, NULL, &berr);
    if (rc == IFD_OK && brc) {
        *err = berr;
        rc = brc;
    }
    return rc;
}

/*
 * Communicators go first. After an abort a step may be stuck in an all-reduce that waits for a
 * peer that never launched its own, which no stream synchronisation would outlive:
 * ncclCommAbort stops such kernels. A clean close finalizes every local rank in one group (the
 * collective flush) and then destroys them locally.
 */
static void nccl_close(cu_dev *cd, int abort_comms)
{
    int have = 0;
    for (int r = 0; r < cd->replicas; r++)
        have |= cd->reps[r].comm != NULL;
    if (!have)
        return;
    if (abort_comms) {
        for (int r = 0; r < cd->replicas; r++) {
            if (cd->reps[r].comm) {
                cudaSetDevice(cd->reps[r].gpu);
                ncclCommAbort(cd->reps[r].comm);
                cd->reps[r].comm = NULL;
            }
        }
        return;
    }
    ncclGroupStart();
    for (int r = 0; r < cd->replicas; r++) {
        if (cd->reps[r].comm) {
            cudaSetDevice(cd->reps[r].gpu);
            ncclCommFinalize(cd->reps[r].comm);
        }
    }
    ncclGroupEnd();
    for (int r = 0; r < cd->replicas; r++) {
        if (cd->reps[r].comm) {
            ncclCommDestroy(cd->reps[r].comm);
            cd->reps[r].comm = NULL;
        }
    }
}

void ifd_cu_close(ifd_device *dev)
{
    cu_dev *cd = dev->priv;
    if (cd->reps == NULL)
        return;
    ifd_replicas_stop(&cd->set);
    /* Graphs that captured an all-reduce hold their communicator: they go before it. A graph
     * still running is freed when it completes. */
    for (int r = 0; r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        for (int i = 0; rep->in && i < rep->nin; i++) {
            for (int k = 0; k < 2; k++) {
                if (rep->in[i].graph[k]) {
                    cudaSetDevice(rep->gpu);
                    cudaGraphExecDestroy(rep->in[i].graph[k]);
                    rep->in[i].graph[k] = NULL;
                }
            }
        }
    }
    nccl_close(cd, is_aborted(cd));
    if (cd->use_flags) {
        ifd_cpu_allreduce_fini(&cd->flags);
        cd->use_flags = 0;
    }
    for (int r = 0; r < cd->replicas; r++)
        ifd_cu_replica_free(&cd->reps[r]);
    ifd_replicas_fini(&cd->set);
    free(cd->reps);
    cd->reps = NULL;
}

/* The GPUs visible here, checked against the replicas asked for (one replica a GPU). */
static int count_gpus(const ifd_device_config *cfg, int *visible, ifd_error *err)
{
    cudaError_t e = cudaGetDeviceCount(visible);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ifd_error_set(err, IFD_ECUDA, "cuda backend: no usable GPU: cudaGetDeviceCount: %s",
                             cudaGetErrorString(e));
    }
    if (*visible == 0)
        return ifd_error_set(err, IFD_ECUDA,
                             "cuda backend: no usable GPU: cudaGetDeviceCount: 0 devices visible");
    if (cfg->replicas < 1 || cfg->replicas > *visible) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        return ifd_error_set(err, IFD_EINVAL,
                             "cuda backend: replicas: %d requested, but %d GPU%s visible "
                             "(CUDA_VISIBLE_DEVICES=%s); one replica runs per GPU",
                             cfg->replicas, *visible, *visible == 1 ? " is" : "s are",
                             cvd ? cvd : "(unset)");
    }
    return IFD_OK;
}

/* Sizes of a replica's slots and the step ops, from the config (no CUDA call). */
static void plan_device(cu_dev *cd, const ifd_device_config *cfg)
{
    size_t offs[IFD_MAX_INPUTS];
    int idx[IFD_MAX_INPUTS], nin;
    cd->in_bytes = ifd_cu_shard_layout(cfg, cfg->max_shard_rows, offs, idx, &nin);
    cd->pred_floats =
        cfg->mode == IFD_MODE_PREDICT ? cfg->max_shard_rows * cfg->program->predict_cols : 0;
    if (cd->in_bytes == 0)
        cd->in_bytes = CU_ALIGN;
    cd->graph_rows = cfg->max_shard_rows % cfg->replicas == 0 ? cfg->max_shard_rows / cfg->replicas
                                                              : -1; /* the per-host shard */
    cd->sops.allreduce_sum = ifd_cu_allreduce_sum;
    cd->sops.guard_loss = ifd_cu_guard_loss;
    cd->sops.check_grads = ifd_cu_check_grads;
    cd->sops.optimizer_apply = ifd_cu_optimizer_apply;
    cd->sops.finish_step = ifd_cu_finish_step;
    cd->out_bytes =
        cfg->mode == IFD_MODE_PREDICT
            ? 0
            : ifd_program_outfeed_layout(cfg->program, cfg->max_shard_rows, cd->out_offs);
}

/* Several hosts: the hosts' step flags (train and eval; predict runs per host), and for
 * training one NCCL communicator over every GPU of every host; one host with several GPUs: a
 * communicator over its own. */
static int open_collectives(cu_dev *cd, const ifd_device_config *cfg, ifd_error *err)
{
    int rc = IFD_OK;
    const ifd_hosts *hosts = ifd_hosts_many(cfg->hosts) ? cfg->hosts : NULL;
    if (hosts && cfg->mode != IFD_MODE_PREDICT) {
        if (ifd_cpu_allreduce_init(&cd->flags, cd->replicas, 0) != IFD_OK)
            return ifd_error_set(err, IFD_ENOMEM, "cuda backend: the hosts' step flags");
        cd->use_flags = 1;
        if (ifd_cpu_allreduce_set_hosts(&cd->flags, hosts) != IFD_OK)
            return ifd_error_set(err, IFD_ENOMEM, "cuda backend: the hosts' step flags");
    }
    ncclUniqueId id;
    if (hosts && cfg->mode == IFD_MODE_TRAIN) {
        rc = hosts_nccl_id(cd, hosts, &id, err);
        if (rc == IFD_OK)
            rc = nccl_open(cd, &id, hosts->size * cd->replicas, hosts->rank * cd->replicas, err);
    } else if (cd->replicas > 1) {
        NCCL_TRY_GOTO(-1, ncclGetUniqueId(&id), rc, err, out);
        rc = nccl_open(cd, &id, cd->replicas, 0, err);
    }
out:
    return rc;
}

/* Every replica's stream idle (what open queued has run), then its thread started. */
static int start_replicas(cu_dev *cd, ifd_error *err)
{
    int rc = IFD_OK;
    for (int r = 0; r < cd->replicas; r++) {
        cu_replica *rep = &cd->reps[r];
        CUDA_TRY_GOTO(rep->gpu, cudaSetDevice(rep->gpu), rc, err, out);
        CUDA_TRY_GOTO(rep->gpu, cudaStreamSynchronize(rep->cs), rc, err, out);
    }
    for (int r = 0; r < cd->replicas; r++) {
        char tname[32];
        snprintf(tname, sizeof tname, "ifd-gpu%d", r);
        if (ifd_replicas_start(&cd->set, r, tname))
            return ifd_error_set(err, IFD_ENOMEM, "cuda backend: cannot start replica thread %d",
                                 r);
    }
out:
    return rc;
}

int ifd_cu_open(ifd_device *dev, ifd_error *err)
{
    cu_dev *cd = dev->priv;
    const ifd_device_config *cfg = &dev->cfg;
    const ifd_program *p = cfg->program;
    cd->dev = dev;
    cd->replicas = cfg->replicas;
    cd->eof_step = INT64_MAX;
    cd->graphs = cfg->cuda_graphs != 0;
    int visible = 0, rc = count_gpus(cfg, &visible, err);
    if (rc)
        return rc;
    plan_device(cd, cfg);

    float *init = malloc(sizeof(float) * (size_t)(p->nparam_floats + 1));
    cd->reps = calloc((size_t)cd->replicas, sizeof *cd->reps);
    if (init == NULL || cd->reps == NULL) {
        free(init);
        free(cd->reps);
        cd->reps = NULL;
        return ifd_error_set(err, IFD_ENOMEM, "cuda backend: %d replicas", cd->replicas);
    }
    ifd_replicas_init(&cd->set, dev, cd->reps, sizeof *cd->reps, &ifd_cu_replica_ops, 0);
    const float *start = ifd_replica_initial_params(cfg, init);
    for (int r = 0; r < cd->replicas && rc == IFD_OK; r++)
        rc = ifd_cu_replica_open(cd, &cd->reps[r], r, start, err);
    if (rc == IFD_OK)
        rc = open_collectives(cd, cfg, err);
    if (rc == IFD_OK)
        rc = start_replicas(cd, err);
    free(init);
    if (rc) {
        /* Nothing ran yet, but an init that failed half-way leaves communicators best aborted. */
        ifd_replicas_abort(&cd->set);
        ifd_cu_close(dev);
        return rc;
    }
    IFD_LOG_INFO("cuda backend: %d replicas on %d visible GPUs, %lld parameters, graphs %s",
                 cd->replicas, visible, (long long)p->nparam_floats, cd->graphs ? "on" : "off");
    return IFD_OK;
}
