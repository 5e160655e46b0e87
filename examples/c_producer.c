/*
 * infeed-producer-example: streams synthetic classification data to a running infeedd with the
 * C client (include/infeed/client.h), for the softmax program: x float32 [D], y int32 [].
 *
 * x is uniform in [-1, 1); y is the argmax of a fixed random linear map of x (the same map for
 * every seed, so several producers feed one learnable task). Batches have the WELCOME's
 * batch_size rows. After --batches batches it sends END and waits for the ACKs and the BYE.
 *
 *   infeedd --program softmax --features 16 --classes 4 --batch-size 64 --steps 100 &
 *   infeed-producer-example --features 16 --classes 4 --batches 100
 *
 * Against a daemon with CURVE (--curve-secret-key): --server-key-file names the daemon's .pub and
 * --key-file this producer's .key (both written by infeedd keygen).
 *
 * --connect-timeout MS (10000) bounds the wait for a WELCOME: when no daemon answers at the
 * endpoint it ends with the client's sentence ("no daemon answered at ... within 10 s
 * (connect_timeout_ms); is infeedd running with --listen ...?").
 *
 * The build puts it at build/clients/c/infeed-producer-example.
 *
 * On the daemon's host the batches go through a shared-memory pool (--shm auto, the default, for
 * an ipc:// or loopback tcp:// endpoint; on: required; off: never; it prints the transport).
 * --steps-per-message K sends K steps a message (infeedd --max-steps-per-message K); --in-place on
 * writes each message straight into the pool's slots (ifd_producer_buffer / commit). The stream
 * of rows is the same whatever these say.
 *
 * Exit status: 0 when the daemon acknowledged every batch or ended the run normally (BYE status
 * ok, e.g. at its last step), 1 on an error (its sentence on stderr), 2 for bad flags.
 */
#include <infeed/client.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct options {
    const char *endpoint;
    const char *name;
    int64_t features;
    int64_t classes;
    int64_t batches;
    uint64_t seed;
    int64_t steps_per_message;
    int in_place;
    ifd_client_options curve; /* CURVE key files and the shm mode */
} options;

/* splitmix64: a small seedable generator, the same on every machine. */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float uniform_pm1(uint64_t *s)
{
    return (float)((double)(next_u64(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static int usage(const char *why)
{
    fprintf(stderr,
            "infeed-producer-example: %s\n"
            "usage: infeed-producer-example [--endpoint tcp://127.0.0.1:5555] [--name NAME]\n"
            "       [--features D (16)] [--classes K (4)] [--batches N (100)] [--seed S (1)]\n"
            "       [--server-key-file DAEMON.pub --key-file PRODUCER.key]\n"
            "       [--shm auto|on|off] [--steps-per-message K (1)] [--in-place on|off]\n"
            "       [--connect-timeout MS (10000)]\n",
            why);
    return 2;
}

static int parse(int argc, char **argv, options *o)
{
    *o = (options){"tcp://127.0.0.1:5555", "c-producer", 16, 4, 100, 1, 1, 0, {0}};
    o->curve.connect_timeout_ms = IFD_CONNECT_TIMEOUT_MS;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--help") == 0 || strcmp(f, "-h") == 0)
            return usage("streams synthetic classification batches to infeedd");
        if (i + 1 >= argc)
            return usage("a flag without its value");
        const char *v = argv[++i];
        char *end = NULL;
        if (strcmp(f, "--endpoint") == 0)
            o->endpoint = v;
        else if (strcmp(f, "--name") == 0)
            o->name = v;
        else if (strcmp(f, "--features") == 0)
            o->features = strtoll(v, &end, 10);
        else if (strcmp(f, "--classes") == 0)
            o->classes = strtoll(v, &end, 10);
        else if (strcmp(f, "--batches") == 0)
            o->batches = strtoll(v, &end, 10);
        else if (strcmp(f, "--seed") == 0)
            o->seed = strtoull(v, &end, 10);
        else if (strcmp(f, "--server-key-file") == 0)
            o->curve.server_key_file = v;
        else if (strcmp(f, "--key-file") == 0)
            o->curve.key_file = v;
        else if (strcmp(f, "--shm") == 0) {
            o->curve.shm = strcmp(v, "on") == 0    ? IFD_SHM_ON
                           : strcmp(v, "off") == 0 ? IFD_SHM_OFF
                                                   : IFD_SHM_AUTO;
            if (strcmp(v, "auto") && strcmp(v, "on") && strcmp(v, "off"))
                return usage("--shm: expected auto, on or off");
        } else if (strcmp(f, "--steps-per-message") == 0)
            o->steps_per_message = strtoll(v, &end, 10);
        else if (strcmp(f, "--connect-timeout") == 0)
            o->curve.connect_timeout_ms = (int)strtol(v, &end, 10);
        else if (strcmp(f, "--in-place") == 0) {
            o->in_place = strcmp(v, "on") == 0;
            if (strcmp(v, "on") && strcmp(v, "off"))
                return usage("--in-place: expected on or off");
        } else
            return usage("unknown flag");
        if (end && (*end != '\0' || end == v))
            return usage("a numeric flag with a value that is not a number");
    }
    if (o->features < 1 || o->classes < 2 || o->batches < 0 || o->steps_per_message < 1 ||
        o->curve.connect_timeout_ms < 1)
        return usage("expected --features >= 1, --classes >= 2, --batches >= 0, "
                     "--steps-per-message >= 1, --connect-timeout >= 1");
    return 0;
}

/* Fills rows of x uniform in [-1, 1) and y = argmax(W x). */
static void make_batch(const options *o, const float *w, int64_t rows, uint64_t *rng, float *x,
                       int32_t *y)
{
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * o->features;
        for (int64_t d = 0; d < o->features; d++)
            xr[d] = uniform_pm1(rng);
        int32_t best = 0;
        float best_v = 0;
        for (int64_t k = 0; k < o->classes; k++) {
            float v = 0;
            for (int64_t d = 0; d < o->features; d++)
                v += w[k * o->features + d] * xr[d];
            if (k == 0 || v > best_v) {
                best_v = v;
                best = (int32_t)k;
            }
        }
        y[r] = best;
    }
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc;

    ifd_error err;
    ifd_producer *p = NULL;
    float *w = NULL, *x = NULL;
    int32_t *y = NULL;
    int status = 1;
    if (ifd_producer_create_opts(&p, o.endpoint, o.name, &o.curve, &err))
        goto fail;
    ifd_input_spec schema[2] = {{"x", IFD_F32, 1, {o.features}}, {"y", IFD_I32, 0, {0}}};
    if (ifd_producer_hello(p, schema, 2, 0, o.curve.connect_timeout_ms, &err))
        goto fail;
    int64_t rows = ifd_producer_batch_size(p);
    printf("welcomed by %s: batch_size %lld, credit %lld, next_seq %lld, replicas %d, mode %s\n",
           o.endpoint, (long long)rows, (long long)ifd_producer_credit(p),
           (long long)ifd_producer_next_seq(p), ifd_producer_replicas(p), ifd_producer_mode(p));
    const char *why = ifd_producer_shm_refused(p);
    printf("transport: %s%s%s%s\n", ifd_producer_transport(p), why ? " (no shared memory: " : "",
           why ? why : "", why ? ")" : "");
    int64_t per = o.steps_per_message;

    /* The labelling map: a fixed seed, whatever --seed says. */
    uint64_t wseed = 0x1FEEDull;
    w = malloc((size_t)(o.classes * o.features) * sizeof *w);
    x = malloc((size_t)(per * rows * o.features) * sizeof *x);
    y = malloc((size_t)(per * rows) * sizeof *y);
    if (w == NULL || x == NULL || y == NULL) {
        ifd_error_set(&err, IFD_ENOMEM, "out of memory for a batch of %lld rows", (long long)rows);
        goto fail;
    }
    for (int64_t i = 0; i < o.classes * o.features; i++)
        w[i] = uniform_pm1(&wseed);

    uint64_t rng = o.seed;
    int64_t b = 0;
    for (; b < o.batches; b += per) {
        if (per > o.batches - b)
            per = o.batches - b;
        int64_t n = per * rows; /* rows of this message: `per` steps */
        if (o.in_place) {
            void *data[2];
            rc = ifd_producer_buffer(p, per, data, 2, 60000, &err);
            if (rc == IFD_OK) {
                make_batch(&o, w, n, &rng, data[0], data[1]);
                rc = ifd_producer_commit(p, n, 60000, &err);
            }
        } else {
            make_batch(&o, w, n, &rng, x, y);
            ifd_frame frames[2] = {{x, (size_t)(n * o.features) * sizeof *x},
                                   {y, (size_t)n * sizeof *y}};
            rc = ifd_producer_send(p, n, frames, 2, 60000, &err);
        }
        if (rc == IFD_ECLOSED)
            break; /* the run ended: END below reports how */
        if (rc)
            goto fail;
    }
    rc = ifd_producer_end(p, 120000, &err);
    const char *bye = NULL;
    ifd_error berr;
    ifd_producer_bye(p, rc == IFD_OK ? 2000 : 0, &bye, &berr);
    printf("sent %lld of %lld batches, %lld acknowledged (acked_seq %lld), %lld rejected\n",
           (long long)ifd_producer_sent(p), (long long)o.batches, (long long)ifd_producer_acked(p),
           (long long)ifd_producer_acked_seq(p), (long long)ifd_producer_rejected(p));
    printf("BYE: %s\n", bye ? bye : "(none yet: other producers may still be streaming)");
    if (rc)
        goto fail;
    status = 0;
    goto out;
fail:
    fprintf(stderr, "infeed-producer-example: %s: %s\n", ifd_errname(err.code),
            ifd_error_text(&err));
out:
    free(w);
    free(x);
    free(y);
    ifd_producer_destroy(p);
    return status;
}
