/*
 * The settings every host of a run must share (docs/multihost.md, "What every host must share"),
 * each as a hash of its value's canonical text, and the check main runs before any socket
 * opens: one all-reduce over the hashes finds the keys whose values differ between hosts.
 */
#include "host/config_agree.h"
#include "host/config_internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The keys whose values decide the math or the collectives of a run: a host that differs in
 * one would compute other parameters, or wait in a collective the others never make. The
 * endpoints, files, limits and thread counts of a host are its own. */
static const char *const shared_keys[] = {"backend",
                                          "replicas",
                                          "program",
                                          "features",
                                          "classes",
                                          "hidden",
                                          "program_config",
                                          "mode",
                                          "input_mode",
                                          "batch_size",
                                          "iterations_per_loop",
                                          "max_loop_seconds",
                                          "steps",
                                          "last_step",
                                          "initial_global_step",
                                          "optimizer",
                                          "learning_rate",
                                          "momentum",
                                          "beta1",
                                          "beta2",
                                          "epsilon",
                                          "weight_decay",
                                          "clip_norm",
                                          "lr_schedule",
                                          "warmup_steps",
                                          "decay_steps",
                                          "min_learning_rate",
                                          "loss_reduction",
                                          "max_skipped_steps",
                                          "summary_every",
                                          "host_calls",
                                          "seed",
                                          "checkpoint_every",
                                          "eval_every",
                                          "keep_best",
                                          "early_stopping"};
enum { NSHARED = sizeof shared_keys / sizeof shared_keys[0] };

int ifd_config_nshared(void)
{
    return NSHARED + 1;
}

/* FNV-1a, 62 bits (so that its negation fits an int64_t: one MIN finds both ends) */
static int64_t hash_text(const char *s)
{
    uint64_t h = UINT64_C(14695981039346656037);
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * UINT64_C(1099511628211);
    return (int64_t)(h >> 2);
}

/* program_config as parsed: the same object in other spacing or key order is the same */
static void canonical_json(const char *text, char *buf, size_t len)
{
    json_t *v = text ? json_loads(text, 0, NULL) : NULL;
    char *s = v ? json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
    snprintf(buf, len, "%s", s ? s : text ? text : "none");
    free(s);
    json_decref(v);
}

static void host_calls_text(const ifd_config *r, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < r->nhost_calls && at + 1 < len; i++) {
        at += (size_t)snprintf(buf + at, len - at, "%s%s=%s", i ? " " : "", r->host_calls[i].tensor,
                               r->host_calls[i].spec);
        at = at < len ? at : len - 1;
    }
    if (r->nhost_calls == 0)
        snprintf(buf, len, "%s", "none");
}

int ifd_config_shared(const ifd_daemon_config *c, int64_t start_step, ifd_config_shared_key *out)
{
    char exact[IFD_SHARED_VALUE_MAX];
    int n = 0;
    for (int i = 0; i < NSHARED; i++) {
        const config_opt *o = config_find_key(shared_keys[i], strlen(shared_keys[i]));
        ifd_config_shared_key *k = &out[n++];
        k->key = shared_keys[i];
        const char *field = (const char *)c + o->off;
        if (strcmp(o->key, "program_config") == 0)
            canonical_json(*(const char *const *)field, k->value, sizeof k->value);
        else if (o->kind == K_CALLS)
            host_calls_text(&c->run, k->value, sizeof k->value);
        else
            config_format_value(o, c, k->value, sizeof k->value);
        /* the hash takes a float's every bit; the text, --help's rounding */
        if (o->kind == K_F32)
            snprintf(exact, sizeof exact, "%a", (double)*(const float *)field);
        else if (o->kind == K_F64)
            snprintf(exact, sizeof exact, "%a", *(const double *)field);
        else
            snprintf(exact, sizeof exact, "%s", k->value);
        k->hash = hash_text(exact);
    }
    /* the global step the run starts from: the checkpoint's when it resumes */
    out[n] = (ifd_config_shared_key){.key = "the starting global step"};
    snprintf(out[n].value, sizeof out[n].value, "%" PRId64, start_step);
    out[n].hash = hash_text(out[n].value);
    return ++n;
}

int ifd_config_agree(const ifd_daemon_config *c, int64_t start_step, const ifd_hosts *h,
                     ifd_error *err)
{
    ifd_config_shared_key keys[NSHARED + 1];
    int n = ifd_config_shared(c, start_step, keys);
    int64_t v[2 * (NSHARED + 1)];
    for (int i = 0; i < n; i++) {
        v[i] = keys[i].hash;
        v[n + i] = -keys[i].hash; /* MIN of the negation: the MAX */
    }
    int rc =
        h->ops->allreduce_i64(h->ctx, IFD_HOSTS_LOOP, v, 2 * n, IFD_HOSTS_MIN, NULL, NULL, err);
    if (rc)
        return rc;
    char names[1024] = "", mine[IFD_ERROR_MSG_MAX / 2] = "";
    size_t an = 0, am = 0;
    int differ = 0;
    for (int i = 0; i < n; i++) {
        if (v[i] == -v[n + i])
            continue;
        char flag[64];
        const config_opt *o = config_find_key(keys[i].key, strlen(keys[i].key));
        const char *name = o ? config_display(c, o, flag, sizeof flag) : keys[i].key;
        an += (size_t)snprintf(names + an, sizeof names - an, "%s%s", differ ? ", " : "", name);
        am += (size_t)snprintf(mine + am, sizeof mine - am, "%s%s %s", differ ? ", " : "", name,
                               keys[i].value);
        an = an < sizeof names ? an : sizeof names - 1;
        am = am < sizeof mine ? am : sizeof mine - 1;
        differ++;
    }
    if (!differ)
        return IFD_OK;
    return ifd_error_set(err, IFD_EINVAL,
                         "the hosts differ in %s: every host of a run must give the same "
                         "(docs/multihost.md); host %d of %d has %s. No host starts",
                         names, h->rank, h->size, mine);
}
