/*
 * The ring of tensor messages in shared memory (host/tensor_ring.h): messages of random sizes
 * read back equal while the writer has not gone a ring's length past them, lost (never read as
 * another message's bytes) once it has, wrapping at the end; a message overwritten while it is
 * read is detected; a writer in another process, never waiting, against a reader that checks
 * every message it keeps; the file is 0600 and refused when its size or token is not the
 * notice's.
 */
#include "host/tensor_ring.h"
#include "tests/util/testutil.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static ifd_tensor_ring *make(ifd_rng *rng, ifd_tensor_ring_reader *rd)
{
    ifd_tensor_ring *r;
    ifd_error err;
    int64_t cap = rand_between(rng, IFD_TENSOR_RING_MIN, 4 * IFD_TENSOR_RING_MIN);
    RC_OK(ifd_tensor_ring_create(&r, cap, &err), err);
    ck_assert_uint_ge(ifd_tensor_ring_size(r), (size_t)cap + IFD_TENSOR_RING_HEADER);
    RC_OK(ifd_tensor_ring_open(rd, ifd_tensor_ring_path(r), ifd_tensor_ring_size(r),
                               ifd_tensor_ring_token(r), &err),
          err);
    ck_assert_uint_eq(rd->cap, ifd_tensor_ring_size(r) - IFD_TENSOR_RING_HEADER);
    return r;
}

/* The bytes of message k (n of them): what it must read back as. */
static void fill(unsigned char *d, size_t n, uint64_t k)
{
    uint64_t x = k * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        d[i] = (unsigned char)x;
    }
    if (n >= sizeof k)
        memcpy(d, &k, sizeof k);
}

typedef struct sent {
    uint64_t seq;
    size_t n;
} sent;

/* Messages of random sizes (from empty to the largest a claim takes): each reads back equal
 * while the writer's positions have not gone a ring's length past its start, and reads as lost
 * once they have; none ever reads as other bytes; the positions wrap at the ring's end with
 * every message inside the ring. */
START_TEST(messages_of_random_sizes_read_back_until_overwritten)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_tensor_ring_reader rd;
    ifd_tensor_ring *r = make(&rng, &rd);
    size_t max = ifd_tensor_ring_max_message(r), cap = (size_t)rd.cap;
    ck_assert_uint_eq(max, cap / 4);
    ck_assert_ptr_null(ifd_tensor_ring_claim(r, max + 1, &(uint64_t){0}));
    int nmsg = (int)rand_between(&rng, 200, 600);
    sent *s = calloc((size_t)nmsg, sizeof *s);
    unsigned char *want = malloc(max), *got = malloc(max ? max : 1);
    int wrapped = 0;
    ifd_error err;
    for (int k = 0; k < nmsg; k++) {
        size_t n = (size_t)(rand_between(&rng, 0, 3) == 0 ? rand_between(&rng, 0, 64)
                                                          : rand_between(&rng, 0, (int64_t)max));
        uint64_t seq;
        char *at = ifd_tensor_ring_claim(r, n, &seq);
        ck_assert_ptr_nonnull(at);
        ck_assert_uint_eq(seq % IFD_TENSOR_RING_ALIGN, 0);
        ck_assert_uint_le(seq % cap + n, cap); /* never across the end */
        fill((unsigned char *)at, n, (uint64_t)k);
        if (k > 0) {
            ck_assert_uint_ge(seq, s[k - 1].seq + s[k - 1].n);
            wrapped += seq / cap != s[k - 1].seq / cap;
        }
        s[k] = (sent){.seq = seq, .n = n};
        for (int j = 0; j <= k; j++) {
            uint64_t after = seq + n - s[j].seq; /* from its start to the writer's end */
            int rc = ifd_tensor_ring_read(&rd, s[j].seq, s[j].n, got, &err);
            if (rc == IFD_OK) {
                fill(want, s[j].n, (uint64_t)j);
                RASSERT(memcmp(got, want, s[j].n) == 0,
                        "message %d (%zu bytes at %llu) read back as other bytes", j, s[j].n,
                        (unsigned long long)s[j].seq);
            } else {
                ck_assert_int_eq(rc, IFD_ERANGE);
            }
            if (after + IFD_TENSOR_RING_ALIGN <= cap)
                RASSERT(rc == IFD_OK, "message %d: lost %llu bytes behind the writer", j,
                        (unsigned long long)after);
            if (after > cap)
                RASSERT(rc == IFD_ERANGE, "message %d: read %llu bytes behind the writer", j,
                        (unsigned long long)after);
        }
    }
    RASSERT(wrapped >= 2, "%d messages wrapped the ring only %d times", nmsg, wrapped);
    free(s);
    free(want);
    free(got);
    ifd_tensor_ring_close(&rd);
    ifd_tensor_ring_destroy(r);
}
END_TEST

/* A message read in place and overwritten before the reader's second check is detected, as the
 * copy of ifd_tensor_ring_read is; a notice naming bytes the ring does not hold is refused. */
START_TEST(a_message_overwritten_while_read_is_detected)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_tensor_ring_reader rd;
    ifd_tensor_ring *r = make(&rng, &rd);
    size_t max = ifd_tensor_ring_max_message(r), n = (size_t)rand_between(&rng, 8, (int64_t)max);
    uint64_t seq, seq2;
    ifd_error err;
    fill((unsigned char *)ifd_tensor_ring_claim(r, n, &seq), n, 7);
    /* not written yet: past the writer's end */
    ck_assert_ptr_null(ifd_tensor_ring_at(&rd, seq + rd.cap, n, &err));
    ck_assert_int_eq(err.code, IFD_EPROTO);
    ck_assert_ptr_null(ifd_tensor_ring_at(&rd, seq, (size_t)rd.cap + 1, &err));
    const unsigned char *at = ifd_tensor_ring_at(&rd, seq, n, &err);
    ck_assert_ptr_nonnull(at);
    ck_assert(ifd_tensor_ring_intact(&rd, seq));
    uint64_t first;
    memcpy(&first, at, sizeof first);
    ck_assert_uint_eq(first, 7);
    /* the writer goes on until it has claimed the message's bytes again */
    int k = 8;
    do
        fill((unsigned char *)ifd_tensor_ring_claim(r, max, &seq2), max, (uint64_t)k++);
    while (seq2 + max <= seq + rd.cap);
    ck_assert(!ifd_tensor_ring_intact(&rd, seq));
    unsigned char *got = malloc(n);
    ck_assert_int_eq(ifd_tensor_ring_read(&rd, seq, n, got, &err), IFD_ERANGE);
    /* the newest message is intact */
    ck_assert_int_eq(ifd_tensor_ring_read(&rd, seq2, sizeof first, got, &err), IFD_OK);
    memcpy(&first, got, sizeof first);
    ck_assert_uint_eq(first, (uint64_t)(k - 1));
    free(got);
    ifd_tensor_ring_close(&rd);
    ifd_tensor_ring_destroy(r);
}
END_TEST

typedef struct notice {
    uint64_t seq, k;
    size_t n;
} notice;

/* A writer in another process (the daemon) writes messages as fast as it can and sends each
 * notice through a pipe, never waiting for the reader; the reader copies each message and
 * checks it: every message it keeps is the writer's whole message, the others are counted
 * lost, and the last (nothing written after it) is kept. */
START_TEST(a_reader_against_a_writer_in_another_process_keeps_only_whole_messages)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_tensor_ring_reader rd;
    ifd_tensor_ring *r = make(&rng, &rd);
    size_t max = ifd_tensor_ring_max_message(r);
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    int total = (int)rand_between(&rng, 2000, 6000);
    uint64_t wseed = ifd_rng_next(&rng);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        ifd_rng w;
        ifd_rng_seed(&w, wseed);
        for (int k = 0; k < total; k++) {
            notice nt = {.k = (uint64_t)k, .n = (size_t)rand_between(&w, 8, (int64_t)max)};
            fill((unsigned char *)ifd_tensor_ring_claim(r, nt.n, &nt.seq), nt.n, nt.k);
            if (write(fds[1], &nt, sizeof nt) != (ssize_t)sizeof nt)
                _exit(3);
        }
        _exit(0);
    }
    close(fds[1]);
    unsigned char *got = malloc(max), *want = malloc(max);
    int kept = 0, lost = 0, last_ok = 0;
    notice nt;
    ifd_error err;
    while (read(fds[0], &nt, sizeof nt) == (ssize_t)sizeof nt) {
        int rc = ifd_tensor_ring_read(&rd, nt.seq, nt.n, got, &err);
        last_ok = rc == IFD_OK;
        if (rc == IFD_OK) {
            fill(want, nt.n, nt.k);
            RASSERT(memcmp(got, want, nt.n) == 0, "message %llu kept with other bytes",
                    (unsigned long long)nt.k);
            kept++;
        } else {
            RASSERT(rc == IFD_ERANGE, "message %llu: %s", (unsigned long long)nt.k,
                    ifd_error_text(&err));
            lost++;
        }
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert_int_eq(kept + lost, total);
    ck_assert(last_ok);
    free(got);
    free(want);
    close(fds[0]);
    ifd_tensor_ring_close(&rd);
    ifd_tensor_ring_destroy(r);
}
END_TEST

/* The file is its user's only (0600), mapped read-only by a reader; a reader given another
 * size or token, or a path that is not there, is refused with a sentence naming it. */
START_TEST(the_ring_is_0600_and_refused_when_not_the_notices)
{
    ifd_rng rng;
    seed_rng(&rng);
    ifd_tensor_ring_reader rd, bad;
    ifd_tensor_ring *r = make(&rng, &rd);
    struct stat st;
    ck_assert_int_eq(stat(ifd_tensor_ring_path(r), &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    ifd_error err;
    char token[64];
    snprintf(token, sizeof token, "%s", ifd_tensor_ring_token(r));
    token[0] = token[0] == '0' ? '1' : '0';
    ck_assert_int_eq(
        ifd_tensor_ring_open(&bad, ifd_tensor_ring_path(r), ifd_tensor_ring_size(r), token, &err),
        IFD_EPROTO);
    ck_assert_ptr_nonnull(strstr(ifd_error_text(&err), "token"));
    ck_assert_ptr_null(bad.base);
    ck_assert_int_eq(ifd_tensor_ring_open(&bad, ifd_tensor_ring_path(r),
                                          ifd_tensor_ring_size(r) + 4096, ifd_tensor_ring_token(r),
                                          &err),
                     IFD_EPROTO);
    ck_assert_ptr_nonnull(strstr(ifd_error_text(&err), "size"));
    ck_assert_int_ne(ifd_tensor_ring_open(&bad, "/proc/self/fd/999999", ifd_tensor_ring_size(r),
                                          ifd_tensor_ring_token(r), &err),
                     IFD_OK);
    ck_assert_ptr_nonnull(strstr(ifd_error_text(&err), "cannot open"));
    ck_assert_int_eq(ifd_tensor_ring_create(&(ifd_tensor_ring *){NULL}, 1000, &err), IFD_EINVAL);
    ck_assert_ptr_nonnull(strstr(ifd_error_text(&err), "tensor_shm_bytes"));
    ifd_tensor_ring_close(&rd);
    ifd_tensor_ring_destroy(r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tensor_ring");
    TCase *tc = tu_tcase(s, "ring", 60);
    tcase_add_loop_test(tc, messages_of_random_sizes_read_back_until_overwritten, 0, 6);
    tcase_add_loop_test(tc, a_message_overwritten_while_read_is_detected, 0, 8);
    tcase_add_loop_test(tc, a_reader_against_a_writer_in_another_process_keeps_only_whole_messages,
                        0, 3);
    tcase_add_test(tc, the_ring_is_0600_and_refused_when_not_the_notices);
    return tu_run_suite(s);
}
