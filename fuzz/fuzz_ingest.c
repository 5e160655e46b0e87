/*
 * libFuzzer harness: the daemon's ingest decoders and validation (HELLO, BATCH, END and the
 * control request), driven through the real message handler of host/ingest/zmq_transport.c (and the
 * protocol core, host/ingest/protocol.c, behind it) with frames cut
 * from the input. One ingest lives for the whole run (its ROUTER bound on inproc, replies go
 * nowhere); every accepted batch is consumed and released after each input, as the runtime
 * would, so memory stays bounded and the ACK path runs too.
 *
 * Input: frames, each a little-endian u16 length then that many bytes (a short last frame
 * takes what is left). The first frame is the routing id, the rest the message; the first byte
 * of the input picks the program's input mode and mode at the first call only.
 */
#include "host/ingest/zmq_transport.h"

#include "core/log.h"
#include "infeed/program.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static ifd_daemon_config cfg;
static ifd_program program;
static ifd_ingest *g;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ifd_log_set_level(IFD_LOG_ERROR);
    ifd_daemon_config_defaults(&cfg);
    cfg.listen = "inproc://fuzz-ingest";
    cfg.publish = "";
    cfg.control = "";
    cfg.run.program = "softmax";
    cfg.run.settings.features = 3;
    cfg.run.settings.classes = 4;
    cfg.run.batch_size = 4;
    cfg.run.replicas = 2;
    cfg.max_producers = 4;
    cfg.credit = 4;
    cfg.max_abs_input = 1e6;
    ifd_error err;
    if (ifd_program_init(&program, "softmax", &cfg.run.settings, &err) ||
        ifd_ingest_create(&g, &cfg, NULL, &err)) {
        fprintf(stderr, "fuzz_ingest: setup: %s\n", err.msg);
        abort();
    }
    ingest_attach_program(g, &program);
    return 0;
}

/* What the runtime does with accepted batches: takes them and releases them (ACKs follow). */
static void consume(void)
{
    ifd_batch_source src = ifd_ingest_source(g);
    ifd_batch *b;
    ifd_error err;
    while (src.ops->try_next(src.ctx, &b, &err) == IFD_OK)
        b->release(b, b->release_arg);
    ingest_send_acks(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zmq_msg_t parts[MAX_PARTS + 1];
    int nparts = 0, total = 0;
    size_t at = 0;
    while (at < size) {
        size_t len = size - at >= 2 ? (size_t)data[at] | (size_t)data[at + 1] << 8 : 0;
        at += size - at >= 2 ? 2 : size - at;
        if (len > size - at)
            len = size - at;
        if (nparts < MAX_PARTS) {
            zmq_msg_init_size(&parts[nparts], len);
            if (len)
                memcpy(zmq_msg_data(&parts[nparts]), data + at, len);
            nparts++;
        }
        total++;
        at += len;
    }
    if (nparts >= 1) {
        /* the control socket's decoder reads the message body too */
        char why[300];
        ingest_control_parse(data, size, why, sizeof why);
        ingest_handle_message(g, parts, nparts, total);
        ingest_fifo_flush(g);
        consume();
    }
    for (int i = 0; i < nparts; i++)
        zmq_msg_close(&parts[i]);
    return 0;
}
