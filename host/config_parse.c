#include "host/config_internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int parse_i64(const char *s, int64_t *out)
{
    if (s == NULL || *s == '\0')
        return IFD_EINVAL;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end != '\0')
        return IFD_EINVAL;
    *out = v;
    return IFD_OK;
}

#define MAX_LOOP_SECS 86400.0

/* iterations_per_loop: a count of steps (checked by the validation pass), auto, or a duration:
 * a decimal number followed by s or ms. */
static int set_loop(ifd_config *r, const char *val, const char *where, ifd_error *err)
{
    int64_t steps;
    if (parse_i64(val, &steps) == IFD_OK) {
        r->loop_kind = IFD_LOOP_STEPS;
        r->iterations_per_loop = steps;
        return IFD_OK;
    }
    if (strcmp(val, "auto") == 0) {
        r->loop_kind = IFD_LOOP_AUTO;
        return IFD_OK;
    }
    size_t len = strlen(val), unit = 0;
    double scale = 0.0;
    if (len > 2 && strcmp(val + len - 2, "ms") == 0) {
        unit = 2;
        scale = 1e-3;
    } else if (len > 1 && val[len - 1] == 's') {
        unit = 1;
        scale = 1.0;
    }
    char num[64];
    if (unit && len - unit < sizeof num &&
        ((val[0] >= '0' && val[0] <= '9') || (val[0] == '.' && val[1] >= '0' && val[1] <= '9'))) {
        memcpy(num, val, len - unit);
        num[len - unit] = '\0';
        char *end;
        errno = 0;
        double secs = strtod(num, &end) * scale;
        if (errno == 0 && *end == '\0' && isfinite(secs)) {
            if (!(secs > 0.0))
                return ifd_error_set(err, IFD_EINVAL,
                                     "%s: expected a positive integer (steps), auto, or a duration "
                                     "above 0 such as 2s or 500ms, got '%s'",
                                     where, val);
            if (secs > MAX_LOOP_SECS)
                return ifd_error_set(err, IFD_EINVAL,
                                     "%s: expected a duration of at most %g s, got '%s'", where,
                                     MAX_LOOP_SECS, val);
            r->loop_kind = IFD_LOOP_SECONDS;
            r->loop_secs = secs;
            return IFD_OK;
        }
    }
    return ifd_error_set(err, IFD_EINVAL,
                         "%s: expected a positive integer (steps), auto, or a duration such as 2s, "
                         "1.5s or 500ms, got '%s'",
                         where, val);
}

static int keep_string(ifd_daemon_config *c, const char *val, const char **out, const char *where,
                       ifd_error *err)
{
    if (c->nstrings == (int)(sizeof c->strings / sizeof c->strings[0]))
        return ifd_error_set(err, IFD_EINVAL, "%s: too many string values", where);
    char *copy = strdup(val);
    if (copy == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "%s", where);
    c->strings[c->nstrings++] = copy;
    *out = copy;
    return IFD_OK;
}

int config_add_lib(ifd_daemon_config *c, const config_opt *o, const char *val, const char *where,
                   ifd_error *err)
{
    ifd_lib_list *l = (ifd_lib_list *)((char *)c + o->off);
    if (val[0] == '\0')
        return ifd_error_set(err, IFD_EINVAL, "%s: expected a file name, got ''", where);
    if (l->n == IFD_DAEMON_MAX_PROGRAM_LIBS)
        return ifd_error_set(err, IFD_EINVAL, "%s: expected at most %d %s libraries", where,
                             IFD_DAEMON_MAX_PROGRAM_LIBS,
                             strcmp(o->key, "program_lib") == 0 ? "program" : "host call");
    return keep_string(c, val, &l->paths[l->n++], where, err);
}

/* One host call of tensor over spec (the two copied). */
int config_add_call(ifd_daemon_config *c, const char *tensor, size_t tlen, const char *spec,
                    size_t slen, const char *where, ifd_error *err)
{
    if (tlen == 0 || slen == 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: expected a tensor name and a host call spec, got '%.*s' for "
                             "tensor '%.*s'",
                             where, (int)slen, spec, (int)tlen, tensor);
    if (c->run.nhost_calls == IFD_MAX_HOST_CALLS)
        return ifd_error_set(err, IFD_EINVAL, "%s: expected at most %d host calls", where,
                             IFD_MAX_HOST_CALLS);
    char t[128], s[256];
    snprintf(t, sizeof t, "%.*s", (int)tlen, tensor);
    snprintf(s, sizeof s, "%.*s", (int)slen, spec);
    ifd_host_call *hc = &c->run.host_calls[c->run.nhost_calls];
    int rc = keep_string(c, t, &hc->tensor, where, err);
    if (rc == IFD_OK)
        rc = keep_string(c, s, &hc->spec, where, err);
    if (rc == IFD_OK)
        c->run.nhost_calls++;
    return rc;
}

/* Whether piece (up to a ',') is a parameter of the spec before it ("range=0:1", "label=y":
 * a '=' before any ':'), not a spec of its own (a spec's name has no '='). */
static int is_parameter(const char *piece, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (piece[i] == ':')
            return 0;
        if (piece[i] == '=')
            return 1;
    }
    return 0;
}

/* --host-call NAME=SPEC[,SPEC...]: specs apart at the commas that do not start a parameter, so
 * that "histogram:bins=10,range=0:1,mean" is two specs. */
static int add_calls_flag(ifd_daemon_config *c, const char *val, const char *where, ifd_error *err)
{
    if (strcmp(val, "none") == 0)
        return IFD_OK; /* no host call, not even the default ones */
    const char *eq = strchr(val, '=');
    if (eq == NULL || eq == val)
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: expected NAME=SPEC[,SPEC...] (a tensor and its host calls, "
                             "for example confidence=mean,histogram), got '%s'",
                             where, val);
    const char *spec = eq + 1, *p = spec;
    while (1) {
        const char *comma = strchr(p, ',');
        const char *next = comma ? comma + 1 : NULL;
        if (next && is_parameter(next, strcspn(next, ","))) {
            p = next; /* the spec goes on */
            continue;
        }
        size_t slen = comma ? (size_t)(comma - spec) : strlen(spec);
        int rc = config_add_call(c, val, (size_t)(eq - val), spec, slen, where, err);
        if (rc || next == NULL)
            return rc;
        spec = p = next;
    }
}

static int set_integer(const config_opt *o, char *field, const char *val, const char *where,
                       ifd_error *err)
{
    int64_t i64;
    if (o->kind == K_U64) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(val, &end, 10);
        if (*val == '\0' || strchr(val, '-') || errno || *end != '\0')
            return ifd_error_set(err, IFD_EINVAL,
                                 "%s: expected an integer from 0 to 2^64-1, got '%s'", where, val);
        *(uint64_t *)field = v;
        return IFD_OK;
    }
    if (parse_i64(val, &i64) || (o->kind == K_INT && (i64 < INT32_MIN || i64 > INT32_MAX)))
        return ifd_error_set(err, IFD_EINVAL, "%s: expected an integer, got '%s'", where, val);
    if (o->kind == K_INT)
        *(int *)field = (int)i64;
    else
        *(int64_t *)field = i64;
    return IFD_OK;
}

static int set_number(const config_opt *o, char *field, const char *val, const char *where,
                      ifd_error *err)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (*val == '\0' || errno || *end != '\0' || !isfinite(v))
        return ifd_error_set(err, IFD_EINVAL, "%s: expected a number, got '%s'", where, val);
    if (o->kind == K_F32)
        *(float *)field = (float)v;
    else
        *(double *)field = v;
    return IFD_OK;
}

static int set_bool(char *field, const char *val, const char *where, ifd_error *err)
{
    if (strcmp(val, "on") == 0 || strcmp(val, "true") == 0 || strcmp(val, "1") == 0)
        *(int *)field = 1;
    else if (strcmp(val, "off") == 0 || strcmp(val, "false") == 0 || strcmp(val, "0") == 0)
        *(int *)field = 0;
    else
        return ifd_error_set(err, IFD_EINVAL, "%s: expected on or off, got '%s'", where, val);
    return IFD_OK;
}

/* Sets o from its text form. where: "flag --x" or "config file f: key 'x'". */
int config_set_value(ifd_daemon_config *c, const config_opt *o, const char *val, const char *where,
                     ifd_error *err)
{
    char *field = (char *)c + o->off;
    switch (o->kind) {
    case K_LIBS:
        return config_add_lib(c, o, val, where, err);
    case K_CALLS:
        return add_calls_flag(c, val, where, err);
    case K_STR:
        return keep_string(c, val, (const char **)field, where, err);
    case K_LOOP:
        return set_loop(&c->run, val, where, err);
    case K_INT:
    case K_I64:
    case K_U64:
        return set_integer(o, field, val, where, err);
    case K_F32:
    case K_F64:
        return set_number(o, field, val, where, err);
    case K_ENUM:
        if (o->names->parse(val, (int *)field))
            return ifd_error_set(err, IFD_EINVAL, "%s: expected %s, got '%s'", where,
                                 o->names->choices, val);
        return IFD_OK;
    case K_BOOL:
    case K_SWITCH:
        return set_bool(field, val, where, err);
    }
    return ifd_error_set(err, IFD_EINTERNAL, "%s: unknown kind", where);
}

/* The default reader of --config: the file's bytes, at most 16 MiB. */
static int read_file(void *arg, const char *path, char **out, ifd_error *err)
{
    (void)arg;
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return ifd_error_set(err, IFD_EINVAL, "--config: cannot open '%s': %s", path,
                             strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = IFD_OK;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            if (cap > (1u << 24)) {
                rc = ifd_error_set(err, IFD_EINVAL, "--config: '%s' is larger than 16 MiB", path);
                goto out;
            }
            char *t = realloc(text, cap);
            if (t == NULL) {
                rc = ifd_error_set(err, IFD_ENOMEM, "--config: '%s'", path);
                goto out;
            }
            text = t;
        }
        size_t n = fread(text + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        rc = ifd_error_set(err, IFD_EINVAL, "--config: cannot read '%s'", path);
        goto out;
    }
    text[len] = '\0';
    *out = text;
    text = NULL;
out:
    free(text);
    fclose(f);
    return rc;
}

static int load_file(ifd_daemon_config *c, const char *path, ifd_config_reader read, void *arg,
                     ifd_error *err)
{
    char *text = NULL;
    int rc = read(arg, path, &text, err);
    if (rc)
        return rc;
    char source[300];
    snprintf(source, sizeof source, "config file %s", path);
    c->from_file = 1;
    rc = ifd_daemon_config_apply_json(c, text, source, err);
    free(text);
    return rc;
}

/* Splits "--key=value"; *val is NULL without '=' (the caller takes the next argument when the
 * flag wants a value). */
static int flag_at(char **argv, int i, const char **name, size_t *name_len, const char **val,
                   ifd_error *err)
{
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
        return ifd_error_set(err, IFD_EINVAL,
                             "unexpected argument '%s': infeedd takes only flags (see --help)", a);
    *name = a + 2;
    const char *eq = strchr(*name, '=');
    *name_len = eq ? (size_t)(eq - *name) : strlen(*name);
    *val = eq ? eq + 1 : NULL;
    return IFD_OK;
}

int ifd_daemon_config_parse(ifd_daemon_config *c, int argc, char **argv, FILE *out, int *exit_now,
                            ifd_error *err)
{
    return ifd_daemon_config_parse_with(c, argc, argv, out, exit_now, read_file, NULL, err);
}

/* --help, --version: they print and end the parse wherever they stand. */
static int info_flag(int argc, char **argv, FILE *out)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            ifd_daemon_config_usage(out);
            return 1;
        }
        if (strcmp(argv[i], "--version") == 0) {
            fprintf(out, "infeedd %s (protocol 1)\n", IFD_VERSION_STRING);
            return 1;
        }
    }
    return 0;
}

/* IFD_REPLICA_THREADS (bench/README.md's runs use it): the count of replica_threads when neither
 * the file nor a flag gives one. The one variable infeedd reads for a setting; the backends read
 * none. */
static int apply_environment(ifd_daemon_config *c, ifd_error *err)
{
    const char *v = getenv("IFD_REPLICA_THREADS");
    const config_opt *o = config_find_key("replica_threads", 15);
    if (v == NULL || *v == '\0' || c->key_source[o - config_opts] != IFD_KEY_DEFAULT)
        return IFD_OK;
    return config_set_value(c, o, v, "environment variable IFD_REPLICA_THREADS", err);
}

/* The file first, wherever --config stands. */
static int load_files(ifd_daemon_config *c, int argc, char **argv, ifd_config_reader read,
                      void *arg, ifd_error *err)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") != 0 && strncmp(argv[i], "--config=", 9) != 0)
            continue;
        const char *path = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[++i] : NULL);
        if (path == NULL || *path == '\0')
            return ifd_error_set(err, IFD_EINVAL, "flag --config: expected a file name");
        int rc = load_file(c, path, read, arg, err);
        if (rc)
            return rc;
    }
    return IFD_OK;
}

/* The flag at argv[*i] (and its value, the next argument unless it has "=VALUE"). */
static int apply_flag(ifd_daemon_config *c, int argc, char **argv, int *i, ifd_error *err)
{
    const char *name = NULL, *val = NULL;
    size_t len = 0;
    int rc = flag_at(argv, *i, &name, &len, &val, err);
    if (rc)
        return rc;
    if (len == 6 && strncmp(name, "config", 6) == 0) {
        *i += val == NULL; /* its value was read first */
        return IFD_OK;
    }
    const config_opt *o = config_find_flag(name, len);
    if (o == NULL)
        return ifd_error_set(err, IFD_EINVAL, "unknown flag '--%.*s' (infeedd --help lists them)",
                             (int)len, name);
    if (val == NULL && o->kind == K_SWITCH)
        val = "on";
    else if (val == NULL && *i + 1 < argc)
        val = argv[++*i];
    char where[80];
    config_flag_name(o, where + 5, sizeof where - 5);
    memcpy(where, "flag ", 5);
    if (val == NULL)
        return ifd_error_set(err, IFD_EINVAL, "%s: expected a value (%s)", where, o->metavar);
    ifd_lib_list *libs = (ifd_lib_list *)((char *)c + o->off);
    if (o->kind == K_LIBS && !libs->from_flags) {
        libs->n = 0; /* the flags replace the file's list */
        libs->from_flags = 1;
    }
    if (o->kind == K_CALLS && !c->host_calls_from_flags) {
        c->run.nhost_calls = 0; /* likewise */
        c->host_calls_from_flags = 1;
    }
    rc = config_set_value(c, o, val, where, err);
    if (rc == IFD_OK)
        c->key_source[o - config_opts] = IFD_KEY_FROM_FLAG;
    return rc;
}

/* The plugins before the validation pass, which looks up the program by name. */
static int load_libs(const ifd_lib_list *l, const char *key, const char *flag, ifd_error *err)
{
    for (int i = 0; i < l->n && l->load; i++) {
        int rc = l->load(l->paths[i], err);
        if (rc)
            return ifd_error_prefix(err, "%s", l->from_flags ? flag : key);
    }
    return IFD_OK;
}

static int load_plugins(ifd_daemon_config *c, ifd_error *err)
{
    int rc = load_libs(&c->program_libs, "program_lib", "flag --program-lib", err);
    return rc ? rc : load_libs(&c->host_call_libs, "host_call_lib", "flag --host-call-lib", err);
}

/* Without host_calls (neither the file nor a flag), a classifier's train and eval runs report
 * per-class accuracy and a histogram of the confidence (docs/config.md, "Host calls"). */
static int default_host_calls(ifd_daemon_config *c, ifd_error *err)
{
    const config_opt *o = config_find_key("host_calls", strlen("host_calls"));
    ifd_program p;
    ifd_error perr;
    if (c->key_source[o - config_opts] != IFD_KEY_DEFAULT || c->run.mode == IFD_MODE_PREDICT ||
        c->run.program == NULL ||
        ifd_program_init(&p, c->run.program, &c->run.settings, &perr) != IFD_OK)
        return IFD_OK; /* set, or the validation pass's sentence */
    if (!p.classifier) {
        ifd_program_free(&p);
        return IFD_OK;
    }
    int has_class = 0, has_conf = 0;
    for (int i = 0; i < p.noutfeeds; i++) {
        has_class |= strcmp(p.outfeeds[i].name, "class") == 0;
        has_conf |= strcmp(p.outfeeds[i].name, "confidence") == 0;
    }
    ifd_program_free(&p);
    int rc = IFD_OK;
    if (has_class)
        rc = config_add_call(c, "class", 5, "class_accuracy", 14, "host_calls (default)", err);
    if (rc == IFD_OK && has_conf)
        rc = config_add_call(c, "confidence", 10, "histogram", 9, "host_calls (default)", err);
    return rc;
}

int ifd_daemon_config_parse_with(ifd_daemon_config *c, int argc, char **argv, FILE *out,
                                 int *exit_now, ifd_config_reader read, void *arg, ifd_error *err)
{
    *exit_now = info_flag(argc, argv, out);
    if (*exit_now)
        return IFD_OK;
    int rc = load_files(c, argc, argv, read, arg, err);
    for (int i = 1; rc == IFD_OK && i < argc; i++)
        rc = apply_flag(c, argc, argv, &i, err);
    if (rc == IFD_OK)
        rc = apply_environment(c, err);
    if (rc == IFD_OK)
        rc = load_plugins(c, err);
    if (rc == IFD_OK)
        rc = default_host_calls(c, err);
    return rc ? rc : ifd_daemon_config_validate(c, err);
}
