/*
 * bench_gpu: what the cuda backend costs and delivers, on the GPUs this process sees.
 *
 *   1. host-to-device GB/s through the backend's infeed (one host copy into pinned staging, then
 *      an async copy) against a plain pinned cudaMemcpyAsync loop of the same shard size;
 *   2. steps/s of a small softmax step with CUDA Graphs off and on, and the fraction of each
 *      loop the GPU sat idle waiting for infeed (the summaries' infeed_wait_fraction);
 *   3. the NCCL all-reduce time of that step's gradient vector and of a 4 MiB one.
 *
 * Built only with the cuda backend; bench/gpu.sh builds and runs it. Exits 2 without a GPU.
 */
#include "core/thread.h"
#include <infeed/infeed.h>

#include <cuda_runtime_api.h>
#include <jansson.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NSLOTS 8

static void die(const char *what, const char *why)
{
    fprintf(stderr, "bench_gpu: %s: %s\n", what, why);
    exit(1);
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            die(#call, cudaGetErrorString(e_));                                                    \
    } while (0)

#define NK(call)                                                                                   \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            die(#call, ncclGetErrorString(r_));                                                    \
    } while (0)

/* A batch source that hands out the same bytes over and over from a ring of batch headers, so
 * the producer side costs nothing. */
typedef struct bench_src {
    ifd_batch b[NSLOTS];
    int busy[NSLOTS]; /* atomic */
    int ntensors;
    ifd_tensor t[IFD_MAX_INPUTS];
    int64_t rows, next, total;
    int stopped; /* atomic */
} bench_src;

static void src_release(ifd_batch *b, void *arg)
{
    bench_src *s = arg;
    __atomic_store_n(&s->busy[b - s->b], 0, __ATOMIC_RELEASE);
}

static int src_next(void *ctx, ifd_batch **out, ifd_error *err)
{
    (void)err;
    bench_src *s = ctx;
    if (s->next == s->total)
        return IFD_EEOF;
    int i = (int)(s->next % NSLOTS);
    while (__atomic_load_n(&s->busy[i], __ATOMIC_ACQUIRE)) {
        if (__atomic_load_n(&s->stopped, __ATOMIC_ACQUIRE))
            return IFD_ESTOPPED;
        ifd_sleep_ns(1000);
    }
    ifd_batch *b = &s->b[i];
    ifd_batch_init(b);
    b->seq = s->next++;
    b->rows = s->rows;
    b->ntensors = s->ntensors;
    memcpy(b->tensors, s->t, sizeof s->t);
    b->release = src_release;
    b->release_arg = s;
    s->busy[i] = 1;
    *out = b;
    return IFD_OK;
}

static void src_abort(void *ctx)
{
    bench_src *s = ctx;
    __atomic_store_n(&s->stopped, 1, __ATOMIC_RELEASE);
}

static const ifd_batch_source_ops src_ops = {.next = src_next, .abort = src_abort};

/* Data for program p with rows rows: floats in [-1, 1), labels 0. */
static void src_init(bench_src *s, const ifd_config *cfg, int64_t total)
{
    memset(s, 0, sizeof *s);
    ifd_program p;
    ifd_error err;
    if (ifd_program_init(&p, cfg->program, &cfg->settings, &err))
        die("program", err.msg);
    s->rows = cfg->batch_size;
    s->total = total;
    s->ntensors = p.ninputs;
    for (int i = 0; i < p.ninputs; i++) {
        const ifd_input_spec *in = &p.inputs[i];
        int64_t dims[IFD_MAX_RANK] = {s->rows};
        int64_t per = 1;
        for (int d = 0; d < in->rank; d++)
            per *= dims[d + 1] = in->dims[d];
        size_t n = (size_t)(s->rows * per);
        void *data = calloc(n ? n : 1, ifd_dtype_size(in->dtype));
        if (data == NULL)
            die("calloc", "out of memory");
        if (in->dtype == IFD_F32)
            for (size_t j = 0; j < n; j++)
                ((float *)data)[j] = (float)((j * 2654435761u) % 2000) / 1000.0f - 1.0f;
        ifd_tensor_init(&s->t[i], in->dtype, in->rank + 1, dims, data);
    }
    ifd_program_free(&p);
}

static void src_fini(bench_src *s)
{
    for (int i = 0; i < s->ntensors; i++)
        free(s->t[i].data);
}

typedef struct run_result {
    double secs;
    double infeed_wait_fraction;
} run_result;

/* One session over total batches; the last train summary's infeed_wait_fraction. */
static run_result run_session(const ifd_config *cfg, int64_t total)
{
    bench_src src;
    src_init(&src, cfg, total);
    ifd_sink *sink;
    ifd_session *s;
    ifd_error err;
    if (ifd_sink_memory_create(&sink))
        die("sink", "out of memory");
    if (ifd_session_create(&s, cfg, (ifd_batch_source){&src_ops, &src}, &err))
        die("session", err.msg);
    ifd_session_add_sink(s, sink);
    int64_t t0 = ifd_clock_ns();
    if (ifd_session_run(s, &err))
        die("run", err.msg);
    run_result r = {(double)(ifd_clock_ns() - t0) * 1e-9, 0.0};
    for (size_t i = 0; i < ifd_sink_memory_count(sink); i++) {
        char *line = ifd_sink_memory_get(sink, i);
        json_t *j = json_loads(line, 0, NULL);
        json_t *f = j ? json_object_get(j, "infeed_wait_fraction") : NULL;
        if (f)
            r.infeed_wait_fraction = json_number_value(f);
        json_decref(j);
        free(line);
    }
    ifd_session_destroy(s);
    ifd_sink_destroy(sink);
    src_fini(&src);
    return r;
}

static double plain_h2d_gbps(size_t bytes, int iters)
{
    void *h, *d;
    cudaStream_t st;
    cudaEvent_t a, b;
    CK(cudaSetDevice(0));
    CK(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
    CK(cudaMalloc(&d, bytes));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    memset(h, 1, bytes);
    for (int i = 0; i < 5; i++)
        CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st));
    CK(cudaEventRecord(a, st));
    for (int i = 0; i < iters; i++)
        CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(st);
    cudaFree(d);
    cudaFreeHost(h);
    return (double)bytes * iters / (ms * 1e-3) / 1e9;
}

/* Microseconds per in-place sum all-reduce of n floats over ngpu local GPUs. */
static double allreduce_us(int ngpu, size_t n, int iters)
{
    ncclComm_t comms[16];
    cudaStream_t st[16];
    float *buf[16];
    cudaEvent_t a, b;
    NK(ncclCommInitAll(comms, ngpu, NULL));
    for (int g = 0; g < ngpu; g++) {
        CK(cudaSetDevice(g));
        CK(cudaStreamCreateWithFlags(&st[g], cudaStreamNonBlocking));
        CK(cudaMalloc((void **)&buf[g], n * sizeof(float)));
        CK(cudaMemset(buf[g], 0, n * sizeof(float)));
    }
    CK(cudaSetDevice(0));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int it = -10; it < iters; it++) {
        if (it == 0)
            CK(cudaEventRecord(a, st[0]));
        NK(ncclGroupStart());
        for (int g = 0; g < ngpu; g++)
            NK(ncclAllReduce(buf[g], buf[g], n, ncclFloat, ncclSum, comms[g], st[g]));
        NK(ncclGroupEnd());
    }
    CK(cudaSetDevice(0));
    CK(cudaEventRecord(b, st[0]));
    for (int g = 0; g < ngpu; g++) {
        CK(cudaSetDevice(g));
        CK(cudaStreamSynchronize(st[g]));
    }
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    for (int g = 0; g < ngpu; g++) {
        ncclCommDestroy(comms[g]);
        cudaSetDevice(g);
        cudaFree(buf[g]);
        cudaStreamDestroy(st[g]);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms * 1e3 / iters;
}

int main(void)
{
    int ngpu = 0;
    cudaError_t e = cudaGetDeviceCount(&ngpu);
    if (e != cudaSuccess || ngpu == 0) {
        fprintf(stderr, "bench_gpu: no usable GPU: cudaGetDeviceCount: %s\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices visible");
        return 2;
    }
    if (ngpu > 16)
        ngpu = 16;
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("bench_gpu: %d GPU%s, GPU 0: %s\n\n", ngpu, ngpu == 1 ? "" : "s", prop.name);

    /* 1. Host-to-device through the backend vs plain pinned copies. linear with K = 1 moves
     * (D + 1) * 4 bytes a row; 256 rows a shard; one replica. */
    printf("%-12s %18s %18s %8s\n", "shard", "backend GB/s", "pinned memcpy GB/s", "ratio");
    static const size_t mib[] = {1, 4, 16, 64};
    for (size_t i = 0; i < sizeof mib / sizeof mib[0]; i++) {
        const int64_t rows = 256, steps = mib[i] <= 16 ? 256 : 64;
        int64_t d = (int64_t)(mib[i] << 20) / (rows * 4) - 1;
        size_t bytes = (size_t)(rows * (d + 1) * 4);
        ifd_config cfg;
        ifd_config_defaults(&cfg);
        cfg.backend = "cuda";
        cfg.program = "linear";
        cfg.settings.features = d;
        cfg.settings.classes = 1;
        cfg.replicas = 1;
        cfg.batch_size = rows;
        cfg.steps = steps;
        cfg.iterations_per_loop = steps;
        cfg.summary_every = 0;
        cfg.infeed_depth = 4;
        /* the same batch every step: least squares over D ~ 1000 features at the default
         * learning rate diverges within 20 steps, and a run of non-finite steps ends it
         * (max_skipped_steps); what is measured is the data path, not the fit */
        cfg.optimizer.learning_rate = 1e-6f;
        run_session(&cfg, 4); /* warm-up: open, first capture */
        run_result r = run_session(&cfg, steps);
        double backend = (double)bytes * (double)steps / r.secs / 1e9;
        double plain = plain_h2d_gbps(bytes, (int)steps);
        printf("%-9zu MiB %18.2f %18.2f %8.2f\n", mib[i], backend, plain, backend / plain);
    }

    /* 2. Steps per second, graphs off and on, every GPU a replica. */
    printf("\n%-10s %8s %12s %14s %22s\n", "graphs", "replicas", "steps/s", "us/step",
           "GPU idle for infeed");
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.backend = "cuda";
    cfg.program = "softmax";
    cfg.settings.features = 256;
    cfg.settings.classes = 16;
    cfg.replicas = ngpu;
    cfg.batch_size = 256 * ngpu;
    cfg.steps = 2000;
    cfg.iterations_per_loop = 100;
    cfg.summary_every = 0;
    for (int graphs = 0; graphs <= 1; graphs++) {
        cfg.cuda_graphs = graphs;
        run_result r = run_session(&cfg, cfg.steps);
        double sps = (double)cfg.steps / r.secs;
        printf("%-10s %8d %12.0f %14.1f %21.1f%%\n", graphs ? "on" : "off", ngpu, sps, 1e6 / sps,
               100.0 * r.infeed_wait_fraction);
    }

    /* 3. The all-reduce alone. */
    printf("\n");
    if (ngpu < 2) {
        printf("all-reduce: one GPU, no all-reduce in the step\n");
        return 0;
    }
    size_t nparam = (size_t)(cfg.settings.features * cfg.settings.classes + cfg.settings.classes);
    printf("all-reduce over %d GPUs: %zu floats (the step's gradients): %.1f us\n", ngpu, nparam,
           allreduce_us(ngpu, nparam, 500));
    printf("all-reduce over %d GPUs: %d floats (4 MiB): %.1f us\n", ngpu, 1 << 20,
           allreduce_us(ngpu, (size_t)1 << 20, 200));
    return 0;
}
