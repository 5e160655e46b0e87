/*
 * fuzz_checkpoint: the checkpoint loader (checkpoint/format.c and header.c, docs/checkpoint.md),
 * from memory (ifd_checkpoint_load_buffer, which ifd_checkpoint_load runs on a file's bytes).
 *
 * A CRC-32 over the whole file stops almost every mutation at the checksum, and a size implied by
 * the header stops the rest, so each input is loaded three ways:
 *   1. as the file, unchanged (magic, version, sizes, checksum);
 *   2. as the file with its last 4 bytes set to the right CRC (the header and the sizes);
 *   3. as the JSON header alone: the harness wraps it in a preamble, the float block the header
 *      asks for (nparam_floats and the optimizer's slots, up to 2^16 floats) and the CRC, so
 *      every mutation of the header reaches the header's parser.
 * A loaded checkpoint is then checked against the run config it describes and a softmax one
 * (ifd_checkpoint_check), and its accessors are read. Beyond the sanitizers, it aborts when a
 * failure has no sentence, when a loaded checkpoint breaks the format's invariants (parameters
 * that tile the vector, sorted unique producers, slots that fit the optimizer), or when a
 * checkpoint passes the check against the config of its own program with other shapes.
 */
#include "core/log.h"
#include "core/wire.h"
#include "device/step.h"
#include "checkpoint/format.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define PREAMBLE 16
#define MAX_FLOATS (1 << 16)

static void check_failure(int rc, const ifd_error *err)
{
    if (err->code != rc || err->msg[0] == '\0' || memchr(err->msg, '\0', sizeof err->msg) == NULL)
        abort();
}

static void check_producers(const ifd_checkpoint *c)
{
    int n = ifd_checkpoint_producer_count(c);
    for (int i = 0; i < n; i++) {
        const char *name = ifd_checkpoint_producer_name(c, i);
        int64_t seq;
        size_t len = strlen(name);
        if (len == 0 || len > IFD_CHECKPOINT_NAME_MAX || ifd_checkpoint_producer_seq(c, i) < 0)
            abort();
        if (i > 0 && strcmp(ifd_checkpoint_producer_name(c, i - 1), name) >= 0)
            abort();
        if (ifd_checkpoint_find_producer(c, name, &seq) != IFD_OK ||
            seq != ifd_checkpoint_producer_seq(c, i))
            abort();
    }
}

/* The counts, the parameter list tiling the vector, every float readable. */
static void check_floats(const ifd_checkpoint *c)
{
    if (c->nparams < 0 || c->nparams > IFD_CHECKPOINT_MAX_PARAMS || c->nparam_floats < 0 ||
        c->global_step < 0 || c->opt_step < 0)
        abort();
    if (c->nslots != ifd_optimizer_slots(c->optimizer.kind) ||
        ifd_checkpoint_slot_count(c) != c->nslots)
        abort();
    int64_t at = 0;
    for (int i = 0; i < c->nparams; i++) {
        if (c->params_spec[i].offset != at)
            abort();
        at += c->params_spec[i].count;
    }
    if (at != c->nparam_floats)
        abort();
    /* Every float is readable (ASan checks the block's size). */
    volatile float sink = 0;
    const float *p = ifd_checkpoint_params(c);
    for (int64_t i = 0; i < c->nparam_floats * (1 + c->nslots); i++)
        sink += p[i] * 0.0f;
    (void)sink;
}

/* Every host's table (the harness owns c: selecting a table changes nothing else). */
static void check_tables(const ifd_checkpoint *c)
{
    int hosts = ifd_checkpoint_hosts(c);
    if (hosts < 1 || hosts > IFD_CHECKPOINT_MAX_HOSTS)
        abort();
    for (int h = 0; h < hosts; h++) {
        ifd_error e;
        if (ifd_checkpoint_select_host((ifd_checkpoint *)c, h, &e) != IFD_OK)
            abort();
        check_producers(c);
    }
    ifd_error e;
    if (ifd_checkpoint_select_host((ifd_checkpoint *)c, hosts, &e) != IFD_EINVAL ||
        ifd_checkpoint_select_host((ifd_checkpoint *)c, 0, &e) != IFD_OK)
        abort();
}

/* Whether prog declares the parameters c holds (names, ranks, dimensions). */
static int same_params(const ifd_program *prog, const ifd_checkpoint *c)
{
    int same = prog->nparams == c->nparams && prog->nparam_floats == c->nparam_floats;
    for (int i = 0; same && i < prog->nparams; i++) {
        const ifd_param_spec *a = &prog->params[i], *b = &c->params_spec[i];
        same = strcmp(a->name, b->name) == 0 && a->rank == b->rank;
        for (int d = 0; same && d < a->rank; d++)
            same = a->dims[d] == b->dims[d];
    }
    return same;
}

/* ifd_checkpoint_check against the config of the checkpoint's own program (it passes exactly
 * when the program gives the same parameters) and against another program's. */
static void check_against_programs(const ifd_checkpoint *c)
{
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.program = ifd_checkpoint_program(c);
    cfg.settings = *ifd_checkpoint_settings(c);
    cfg.optimizer = *ifd_checkpoint_optimizer(c);
    ifd_error err;
    ifd_error_clear(&err);
    int rc = ifd_checkpoint_check(c, &cfg, &err);
    if (rc)
        check_failure(rc, &err);
    ifd_program prog;
    ifd_error perr;
    if (ifd_program_init(&prog, cfg.program, &cfg.settings, &perr) == IFD_OK &&
        (rc == IFD_OK) != same_params(&prog, c))
        abort();
    ifd_program_free(&prog);
    cfg.program = "softmax";
    cfg.settings = (ifd_program_settings){.features = 4, .classes = 3};
    ifd_error_clear(&err);
    rc = ifd_checkpoint_check(c, &cfg, &err);
    if (rc)
        check_failure(rc, &err);
}

static void check_loaded(const ifd_checkpoint *c)
{
    check_floats(c);
    check_tables(c);
    check_against_programs(c);
}

static void load(const uint8_t *data, size_t size)
{
    ifd_checkpoint *c = NULL;
    ifd_error err;
    ifd_error_clear(&err);
    int rc = ifd_checkpoint_load_buffer(data, size, "fuzz.ifdckpt", &c, &err);
    if (rc) {
        check_failure(rc, &err);
        if (c != NULL)
            abort();
        return;
    }
    check_loaded(c);
    ifd_checkpoint_free(c);
}

static void set_crc(uint8_t *buf, size_t len)
{
    ifd_put_u32(buf + len - 4, (uint32_t)crc32(0, buf, (uInt)(len - 4)));
}

/* 3.: data is the JSON header. */
static void load_header(const uint8_t *data, size_t size)
{
    int64_t floats = 0;
    json_t *h = json_loadb((const char *)data, size, 0, NULL);
    json_t *np = json_object_get(h, "nparam_floats");
    if (json_is_integer(np) && json_integer_value(np) > 0) {
        int slots = 0;
        ifd_optimizer_kind k;
        json_t *kind = json_object_get(json_object_get(h, "optimizer"), "kind");
        if (json_is_string(kind) && ifd_optimizer_parse(json_string_value(kind), &k) == IFD_OK)
            slots = ifd_optimizer_slots(k);
        floats = json_integer_value(np) * (1 + slots);
        if (json_integer_value(np) > MAX_FLOATS)
            floats = MAX_FLOATS; /* the loader says "truncated" */
    }
    json_decref(h);
    size_t len = PREAMBLE + size + 4 * (size_t)floats + 4;
    uint8_t *buf = calloc(1, len);
    if (buf == NULL)
        return;
    memcpy(buf, "IFDCKPT\0", 8);
    ifd_put_u32(buf + 8, IFD_CHECKPOINT_VERSION);
    ifd_put_u32(buf + 12, (uint32_t)size);
    memcpy(buf + PREAMBLE, data, size);
    for (int64_t i = 0; i < floats; i++) {
        float f = (float)i * 0.5f;
        memcpy(buf + PREAMBLE + size + 4 * i, &f, 4);
    }
    set_crc(buf, len);
    load(buf, len);
    free(buf);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ifd_log_set_level(IFD_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy of exactly size bytes, so ASan sees a read past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    if (buf == NULL)
        return 0;
    memcpy(buf, data, size);
    load(buf, size);
    if (size >= PREAMBLE + 4) {
        set_crc(buf, size);
        load(buf, size);
    }
    free(buf);
    if (size < (16u << 20))
        load_header(data, size);
    return 0;
}
