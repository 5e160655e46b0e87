/*
 * Writes the seed corpora of fuzz/corpus/ (fuzz/README.md): `fuzz_make_seeds DIR` fills
 * DIR/fuzz_config, DIR/fuzz_checkpoint and DIR/fuzz_wire, which must exist. The checkpoints are
 * written by the library itself (ifd_checkpoint_write); the wire scripts hold the replies a
 * daemon sends (docs/protocol.md) in fuzz_wire's script format; the config inputs are the config
 * files and flags of docs/config.md and tests/e2e/test_cli.py in fuzz_config's format.
 */
#include "core/wire.h"
#include <infeed/checkpoint.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dir;

static void write_seed(const char *harness, const char *name, const void *data, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", dir, harness, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* ---- fuzz_config: the JSON text, then NUL-separated arguments ---- */

static void config_seed(const char *name, const char *json, const char *const *args)
{
    char buf[2048];
    size_t len = strlen(json);
    memcpy(buf, json, len);
    for (int i = 0; args && args[i]; i++) {
        buf[len++] = '\0';
        memcpy(buf + len, args[i], strlen(args[i]));
        len += strlen(args[i]);
    }
    write_seed("fuzz_config", name, buf, len);
}

static void config_seeds(void)
{
    config_seed("file-only", "{\"iterations_per_loop\": 50, \"learning_rate\": 0.5}", NULL);
    config_seed("readme", "{}",
                (const char *const[]){"--replicas", "2", "--program", "softmax", "--features", "64",
                                      "--classes", "10", "--batch-size", "64",
                                      "--iterations-per-loop", "20", "--steps", "600",
                                      "--summaries", "run.jsonl", NULL});
    config_seed(
        "file-then-flags",
        "{\"replicas\": 2, \"program\": \"mlp\", \"features\": 8, \"hidden\": 16, "
        "\"classes\": 4, \"batch_size\": 10, \"steps\": 5, \"optimizer\": \"adam\", "
        "\"beta1\": 0.8, \"seed\": 7, \"cuda_graphs\": false, \"log_level\": \"debug\"}",
        (const char *const[]){"--config", "c.json", "--batch-size=12", "--resume=off", NULL});
    config_seed("checkpoints",
                "{\"program\": \"linear\", \"features\": 3, \"classes\": 1, \"last_step\": 100, "
                "\"checkpoint_dir\": \"ck\", \"checkpoint_every\": 10, \"keep_checkpoints\": 2, "
                "\"resume\": true, \"input_mode\": \"per-host-v2\", \"credit\": 4}",
                (const char *const[]){"--config=c.json", "--mode", "train", NULL});
    config_seed("predict",
                "{\"mode\": \"predict\", \"features\": 4, \"classes\": 3, \"predictions\": "
                "\"p.jsonl\", \"checkpoint\": \"ckpt-000000000010.ifdckpt\", \"publish\": \"\", "
                "\"control\": \"\", \"watchdog\": 2.5, \"initial_infeed_sleep\": 0.25}",
                (const char *const[]){"--config", "x", "--expect-producers", "2", "--max-producers",
                                      "3", "--loss-reduction", "sum", NULL});
    config_seed("loop-lengths", "{\"iterations_per_loop\": \"auto\", \"max_loop_seconds\": 0.25}",
                (const char *const[]){"--iterations-per-loop", "1.5s",
                                      "--iterations-per-loop=500ms", "--max-loop-seconds", "2",
                                      NULL});
    config_seed("optimizer-features",
                "{\"optimizer\": \"adamw\", \"weight_decay\": 0.01, \"clip_norm\": 1.0, "
                "\"lr_schedule\": \"cosine\", \"warmup_steps\": 10, \"decay_steps\": 100, "
                "\"min_learning_rate\": 0.001}",
                (const char *const[]){"--lr-schedule", "linear", "--decay-steps", "5", NULL});
    config_seed("bad-key", "{\"replicas\": 2, \"bogus_key\": 1}", NULL);
    config_seed("bad-type", "{\"replicas\": \"two\", \"momentum\": [1]}", NULL);
    config_seed("bad-json", "{\"replicas\": 2,\n  \"steps\": }\n", NULL);
    config_seed("help", "", (const char *const[]){"--help", NULL});
    config_seed("flags-errors", "[1, 2]",
                (const char *const[]){"--optimizer", "foo", "--seed", "-1", "--listen", NULL});
}

/* ---- fuzz_checkpoint: files written by the library, and their JSON headers ---- */

static void checkpoint_seed(const char *name, const char *program, ifd_program_settings s,
                            ifd_optimizer_kind kind, int nproducers)
{
    ifd_config cfg;
    ifd_config_defaults(&cfg);
    cfg.program = program;
    cfg.settings = s;
    cfg.optimizer.kind = kind;
    ifd_checkpoint *c;
    ifd_error err;
    if (ifd_checkpoint_create(&c, &cfg, 120, 119, NULL, NULL, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    for (int i = 0; i < nproducers; i++) {
        char pname[32];
        snprintf(pname, sizeof pname, "loader-%d", i);
        ifd_checkpoint_set_producer(c, pname, 1000 + 17 * i, &err);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/fuzz_checkpoint/%s", dir, name);
    if (ifd_checkpoint_write(c, path, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    ifd_checkpoint_free(c);
    /* Its header alone, for the harness's third way. */
    FILE *f = fopen(path, "rb");
    uint8_t pre[16];
    if (f == NULL || fread(pre, 1, 16, f) != 16)
        exit(1);
    uint32_t hlen = ifd_get_u32(pre + 12);
    char *h = malloc(hlen);
    if (h == NULL || fread(h, 1, hlen, f) != hlen)
        exit(1);
    fclose(f);
    char hname[256];
    snprintf(hname, sizeof hname, "%s.header.json", name);
    write_seed("fuzz_checkpoint", hname, h, hlen);
    free(h);
}

static void checkpoint_seeds(void)
{
    checkpoint_seed("softmax-adam.ifdckpt", "softmax",
                    (ifd_program_settings){.features = 4, .classes = 3}, IFD_OPT_ADAM, 2);
    checkpoint_seed("softmax-adamw.ifdckpt", "softmax",
                    (ifd_program_settings){.features = 3, .classes = 2}, IFD_OPT_ADAMW, 1);
    checkpoint_seed("linear-sgd.ifdckpt", "linear",
                    (ifd_program_settings){.features = 3, .classes = 1}, IFD_OPT_SGD, 0);
    checkpoint_seed("mlp-momentum.ifdckpt", "mlp",
                    (ifd_program_settings){.features = 2, .hidden = 3, .classes = 2},
                    IFD_OPT_MOMENTUM, 1);
}

/* ---- fuzz_wire: op bytes and length-prefixed frames ---- */

typedef struct script {
    uint8_t buf[4096];
    size_t len;
} script;

static void op(script *s, uint8_t v)
{
    s->buf[s->len++] = v;
}

/* A reply of n frames (n from 1 to 8). */
static void reply(script *s, int n, const void *const *frames, const size_t *sizes)
{
    op(s, (uint8_t)(2 + 4 * (n - 1)));
    for (int i = 0; i < n; i++) {
        ifd_put_u16(s->buf + s->len, (uint16_t)sizes[i]);
        memcpy(s->buf + s->len + 2, frames[i], sizes[i]);
        s->len += 2 + sizes[i];
    }
}

static void json_reply(script *s, int type, const char *json)
{
    uint8_t h[IFD_PROTO_HDR];
    ifd_proto_header(h, type);
    reply(s, 2, (const void *const[]){h, json}, (const size_t[]){sizeof h, strlen(json)});
}

static void welcome(script *s)
{
    op(s, 0); /* hello waits */
    json_reply(s, IFD_MSG_WELCOME,
               "{\"protocol\": 1, \"name\": \"loader-0\", \"credit\": 8, \"next_seq\": 0, "
               "\"mode\": \"train\", \"input_mode\": \"per-host\", \"batch_size\": 64, "
               "\"global_batch_size\": 64, \"replicas\": 2, \"replica\": null, \"program\": "
               "\"softmax\", \"settings\": {\"features\": 64, \"classes\": 10}, \"schema\": "
               "[{\"name\": \"x\", \"dtype\": \"float32\", \"shape\": [64]}, {\"name\": \"y\", "
               "\"dtype\": \"int32\", \"shape\": []}]}");
    op(s, 1); /* hello returned */
}

static void ack(script *s, int64_t seq, uint32_t n)
{
    uint8_t h[IFD_PROTO_ACK_HDR];
    size_t len = ifd_proto_ack(h, seq, n);
    reply(s, 1, (const void *const[]){h}, &len);
}

static void credit(script *s, uint32_t n)
{
    uint8_t h[IFD_PROTO_CREDIT_HDR];
    size_t len = ifd_proto_credit(h, n);
    reply(s, 1, (const void *const[]){h}, &len);
}

static void wire_seeds(void)
{
    script s = {0};
    welcome(&s);
    ack(&s, 3, 4);
    credit(&s, 2);
    json_reply(&s, IFD_MSG_BYE,
               "{\"status\": \"ok\", \"reason\": \"last_step\", \"global_step\": 600, "
               "\"acked_seq\": 611, \"message\": \"\"}");
    write_seed("fuzz_wire", "welcome-ack-credit-bye", s.buf, s.len);

    s.len = 0;
    welcome(&s);
    json_reply(&s, IFD_MSG_ERROR,
               "{\"code\": \"ESHAPE\", \"seq\": 17, \"credit\": 1, \"message\": \"batch 17 from "
               "producer 'loader-0': tensor 'x' is 16128 bytes, expected 16384 (64 rows of [64] "
               "float32)\"}");
    json_reply(&s, IFD_MSG_ERROR,
               "{\"code\": \"EPROTO\", \"seq\": null, \"credit\": 0, \"message\": \"header: magic: "
               "expected the bytes 'IFDP', got 00 00 00 00\"}");
    write_seed("fuzz_wire", "errors", s.buf, s.len);

    s.len = 0;
    op(&s, 0);
    json_reply(&s, IFD_MSG_ERROR,
               "{\"code\": \"EDTYPE\", \"seq\": null, \"credit\": 0, \"message\": \"schema: "
               "tensor 1 'y': expected dtype int32, got float32\"}");
    write_seed("fuzz_wire", "hello-refused", s.buf, s.len);

    /* predict mode: 2 rows of softmax probabilities [3] and classes */
    s.len = 0;
    welcome(&s);
    uint8_t h[IFD_PROTO_BATCH_HDR];
    ifd_proto_prediction(h, 5, 2, 2);
    const char *desc = "[{\"name\": \"probabilities\", \"dtype\": \"float32\", \"shape\": [3]}, "
                       "{\"name\": \"classes\", \"dtype\": \"int32\", \"shape\": []}]";
    float probs[6] = {0.25f, 0.25f, 0.5f, 0.7f, 0.2f, 0.1f};
    int32_t classes[2] = {2, 0};
    reply(&s, 4, (const void *const[]){h, desc, probs, classes},
          (const size_t[]){sizeof h, strlen(desc), sizeof probs, sizeof classes});
    ack(&s, 5, 1);
    write_seed("fuzz_wire", "prediction", s.buf, s.len);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr,
                "usage: %s DIR (with the folders fuzz_config, fuzz_checkpoint, "
                "fuzz_wire)\n",
                argv[0]);
        return 2;
    }
    dir = argv[1];
    config_seeds();
    checkpoint_seeds();
    wire_seeds();
    return 0;
}
