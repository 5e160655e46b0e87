/*
 * A consumer of the installed infeed package (tests/package): the runtime library's program
 * registry and the client library's producer. Streams BATCHES random batches to a softmax daemon
 * and waits until every one is acknowledged.
 *
 *   consumer ENDPOINT NAME FEATURES CLASSES BATCHES SEED
 *
 * Prints "welcome batch_size=B credit=C" and then "acked N"; exit status 0 when all BATCHES
 * were acknowledged, 1 otherwise (the error on stderr), 2 for bad arguments.
 */
#include <infeed/client.h>
#include <infeed/program.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: consumer ENDPOINT NAME FEATURES CLASSES BATCHES SEED\n");
        return 2;
    }
    const char *endpoint = argv[1], *name = argv[2];
    int64_t features = atoll(argv[3]), classes = atoll(argv[4]), batches = atoll(argv[5]);
    uint64_t seed = strtoull(argv[6], NULL, 10);
    if (features < 1 || classes < 2 || batches < 1) {
        fprintf(stderr, "consumer: expected FEATURES >= 1, CLASSES >= 2, BATCHES >= 1\n");
        return 2;
    }
    /* The runtime library: the daemon's program is one of its built-ins. */
    if (ifd_program_find("softmax") == NULL) {
        fprintf(stderr, "consumer: libinfeed has no softmax program\n");
        return 1;
    }

    ifd_error err;
    ifd_producer *p = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    int status = 1;
    if (ifd_producer_create(&p, endpoint, name, &err))
        goto fail;
    ifd_input_spec schema[2] = {{"x", IFD_F32, 1, {features}}, {"y", IFD_I32, 0, {0}}};
    if (ifd_producer_hello(p, schema, 2, 0, 20000, &err))
        goto fail;
    int64_t rows = ifd_producer_batch_size(p);
    printf("welcome batch_size=%lld credit=%lld\n", (long long)rows,
           (long long)ifd_producer_credit(p));
    x = malloc((size_t)(rows * features) * sizeof *x);
    y = malloc((size_t)rows * sizeof *y);
    if (x == NULL || y == NULL) {
        fprintf(stderr, "consumer: out of memory\n");
        goto out;
    }
    for (int64_t b = 0; b < batches; b++) {
        for (int64_t i = 0; i < rows * features; i++)
            x[i] = (float)((double)(next_u64(&seed) >> 11) / 9007199254740992.0 - 0.5);
        for (int64_t r = 0; r < rows; r++)
            y[r] = (int32_t)(next_u64(&seed) % (uint64_t)classes);
        ifd_frame frames[2] = {{x, (size_t)(rows * features) * sizeof *x},
                               {y, (size_t)rows * sizeof *y}};
        if (ifd_producer_send(p, rows, frames, 2, 20000, &err))
            goto fail;
    }
    if (ifd_producer_wait(p, 20000, &err))
        goto fail;
    printf("acked %lld\n", (long long)ifd_producer_acked(p));
    status = ifd_producer_acked(p) == batches ? 0 : 1;
    goto out;
fail:
    fprintf(stderr, "consumer: %s\n", ifd_error_text(&err));
out:
    free(x);
    free(y);
    ifd_producer_destroy(p);
    return status;
}
