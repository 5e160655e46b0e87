/*
 * infeedd's MPI collectives (host/mpi_hosts.c), run under mpirun by CTest (tests/CMakeLists.txt,
 * 3 ranks): the broadcast the cuda backend sends rank 0's ncclUniqueId with must give every rank
 * the root's bytes, whatever the size, root and channel. Random sizes (0 to 200,000 bytes, and
 * sizeof(ncclUniqueId) = 128), roots and channels from a seed that rank 0 draws (or
 * IFD_TEST_SEED) and prints; the ranks agree on it with the all-reduce. Exit 0 when every rank
 * got every byte (and no byte beyond), 1 otherwise, 77 outside a launcher.
 */
#include "core/log.h"
#include "host/mpi_hosts.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GUARD 16

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void fill(unsigned char *p, size_t n, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)next(&s);
}

int main(int argc, char **argv)
{
    ifd_hosts h;
    ifd_error err;
    ifd_error_clear(&err);
    if (ifd_daemon_hosts_init(&h, &argc, &argv, &err)) {
        fprintf(stderr, "test_hosts_mpi: %s\n", ifd_error_text(&err));
        return 1;
    }
    if (h.size < 2 || h.ops->broadcast == NULL) {
        fprintf(stderr, "test_hosts_mpi: expected to run under mpirun -np 2 or more (size %d)\n",
                h.size);
        ifd_daemon_hosts_fini(&h);
        return 77;
    }
    int64_t seed = 0;
    if (h.rank == 0) {
        const char *env = getenv("IFD_TEST_SEED");
        seed = env ? strtoll(env, NULL, 10) : (int64_t)time(NULL) ^ (int64_t)clock();
        if (seed <= 0)
            seed = 1;
        printf("test_hosts_mpi: seed %" PRId64 " (IFD_TEST_SEED=%" PRId64 " repeats it)\n", seed,
               seed);
        fflush(stdout);
    }
    int64_t failures = 0;
    int rc = h.ops->allreduce_i64(h.ctx, IFD_HOSTS_LOOP, &seed, 1, IFD_HOSTS_MAX, NULL, NULL, &err);
    uint64_t rng = (uint64_t)seed;
    for (int round = 0; rc == IFD_OK && round < 40; round++) {
        size_t bytes = round == 0   ? 128 /* sizeof(ncclUniqueId) */
                       : round == 1 ? 0
                                    : (size_t)(next(&rng) % 200001);
        int root = (int)(next(&rng) % (uint64_t)h.size);
        int channel = (int)(next(&rng) % IFD_HOSTS_NCHANNELS);
        uint64_t content = next(&rng);
        unsigned char *buf = malloc(bytes + 2 * GUARD), *want = malloc(bytes + 1);
        if (buf == NULL || want == NULL) {
            fprintf(stderr, "test_hosts_mpi: out of memory\n");
            return 1;
        }
        memset(buf, 0xA5, bytes + 2 * GUARD);
        fill(want, bytes, content);
        if (h.rank == root)
            memcpy(buf + GUARD, want, bytes);
        else
            fill(buf + GUARD, bytes, content ^ (uint64_t)(h.rank + 1)); /* other bytes */
        rc = h.ops->broadcast(h.ctx, channel, buf + GUARD, bytes, root, NULL, NULL, &err);
        int bad = rc == IFD_OK && memcmp(buf + GUARD, want, bytes) != 0;
        for (int g = 0; g < GUARD; g++)
            bad |= buf[g] != 0xA5 || buf[GUARD + bytes + (size_t)g] != 0xA5;
        if (bad) {
            fprintf(stderr,
                    "test_hosts_mpi: rank %d, round %d: %zu bytes from root %d on channel %d: "
                    "not the root's bytes\n",
                    h.rank, round, bytes, root, channel);
            failures++;
        }
        free(buf);
        free(want);
    }
    if (rc)
        fprintf(stderr, "test_hosts_mpi: rank %d: %s\n", h.rank, ifd_error_text(&err));
    else
        rc = h.ops->allreduce_i64(h.ctx, IFD_HOSTS_LOOP, &failures, 1, IFD_HOSTS_SUM, NULL, NULL,
                                  &err);
    if (h.rank == 0 && rc == IFD_OK)
        printf("test_hosts_mpi: %d ranks, 40 broadcasts: %" PRId64 " failures\n", h.size, failures);
    ifd_daemon_hosts_fini(&h);
    return rc || failures ? 1 : 0;
}
