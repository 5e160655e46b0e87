/*
 * A fake infeedd for the C client's suites (tests/client/): a ROUTER socket in a thread of the
 * test that plays a scripted part of the daemon and checks every byte the client sends against
 * docs/protocol.md. Its headers are written byte by byte here, not with the implementation's
 * encoders, so that the client is checked against the document. Also batches whose bytes can be
 * checked (fake_fill_pattern, fake_check_batch).
 */
#ifndef IFD_TEST_FAKE_DAEMON_H
#define IFD_TEST_FAKE_DAEMON_H

#include <infeed/client.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FAKE_MAX_FRAMES 12

/* One message from the producer, routing id stripped. */
typedef struct fmsg {
    int n;
    size_t size[FAKE_MAX_FRAMES];
    unsigned char *data[FAKE_MAX_FRAMES];
} fmsg;

typedef struct fake fake;
typedef void (*fake_script)(fake *f);

struct fake {
    void *ctx;
    void *router;
    char endpoint[128];
    pthread_t thread;
    fake_script script;
    void *arg; /* the script's */
    unsigned char id[256];
    size_t id_len;
    char fail[1024]; /* the first failed check, written by the fake's thread */
};

/* Binds the ROUTER on a free loopback port (f->endpoint) and runs script(f) in a thread. */
void fake_start(fake *f, fake_script script, void *arg);
/* Joins the script, closes the socket, and fails the test with the script's first failed
 * check. */
void fake_join(fake *f);

/* Receives one message within timeout_ms. 1 when one came, 0 when none did. */
int fake_recv(fake *f, fmsg *m, int timeout_ms);
void fmsg_free(fmsg *m);
/* The type in the common 8 bytes of a message's header, or -1 when they are not a header. */
int hdr_type(const fmsg *m);

/* Replies to the last producer heard: a header of type with nfields bytes of fields after its 8
 * common bytes, and a JSON frame when json is not NULL. */
void fake_send(fake *f, int type, const unsigned char *fields, size_t nfields, const char *json);
void fake_welcome(fake *f, int64_t credit, int64_t next_seq, int64_t batch_size, int replicas);
/* An ACK of n steps up to seq. */
void fake_ack_n(fake *f, int64_t seq, uint32_t n);
/* An ACK of the one step seq. */
void fake_ack(fake *f, int64_t seq);
void fake_credit(fake *f, uint32_t credit);
/* An ERROR; seq < 0 writes a null seq. */
void fake_error(fake *f, const char *code, int64_t seq, int credit, const char *msg);
void fake_bye(fake *f, const char *status, const char *reason, int64_t acked_seq);
/* After a failed check: tells the client at once (an ERROR EINTERNAL carrying the failure, then
 * a BYE), so that its pending call fails with the reason instead of timing out. */
void fake_abort(fake *f);

/* Fails the script (first failure wins), tells the client and returns from the script. */
#define FCHECK(f, cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if ((f)->fail[0] == '\0') {                                                            \
                int off_ =                                                                         \
                    snprintf((f)->fail, sizeof(f)->fail, "fake daemon, line %d: ", __LINE__);      \
                snprintf((f)->fail + off_, sizeof(f)->fail - (size_t)off_, __VA_ARGS__);           \
            }                                                                                      \
            fake_abort(f);                                                                         \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* Receives HELLO (checking its header) and answers WELCOME. */
#define FAKE_HELLO_WELCOME(f, credit, next_seq, batch_size)                                        \
    do {                                                                                           \
        fmsg m_;                                                                                   \
        FCHECK(f, fake_recv(f, &m_, 10000), "no HELLO");                                           \
        int t_ = hdr_type(&m_);                                                                    \
        size_t s0_ = m_.size[0];                                                                   \
        int n_ = m_.n;                                                                             \
        fmsg_free(&m_);                                                                            \
        FCHECK(f, t_ == 1 && s0_ == 8 && n_ == 2,                                                  \
               "expected HELLO, got type %d (%zu bytes, %d "                                       \
               "frames)",                                                                          \
               t_, s0_, n_);                                                                       \
        fake_welcome(f, credit, next_seq, batch_size, 1);                                          \
    } while (0)

/* Little-endian fields of `bytes` bytes. */
void fake_put_le(unsigned char *p, uint64_t v, int bytes);
uint64_t fake_get_le(const unsigned char *p, int bytes);

/* The byte at offset j of tensor i of batch seq. */
unsigned char fake_pattern(int64_t seq, int i, size_t j);
void fake_fill_pattern(unsigned char *buf, size_t n, int64_t seq, int i);
/* Checks a BATCH message's header and frames against rows and the pattern of batch seq. Returns
 * NULL or a description of the first difference (static storage). */
const char *fake_check_batch(const fmsg *m, int64_t seq, int64_t rows, int n, const size_t *sizes);

/* A schema of one tensor of 4 bytes a row. */
extern const ifd_input_spec FAKE_ONE_U8[1];

#endif
