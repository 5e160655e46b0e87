/* A program's own settings (ABI 4): the JSON object of --program-config / program_config, parsed
 * once by ifd_program_init, read by the program's setup through the typed helpers of
 * include/infeed/program.h (so that the ABI does not expose Jansson), every key the setup did not
 * read refused after it. */
#include <infeed/program.h>

#include <inttypes.h>
#include <stdarg.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_KEY "program_config"

struct ifd_program_config {
    json_t *obj;  /* the object ({} when none was given) */
    json_t *read; /* the keys the setup read: an object of nulls */
    char *text;   /* obj's canonical text (compact, keys sorted) */
};

/* The sentence's start: "program 'NAME': program_config setting 'KEY': ", the words
 * "program_config" marked as the error's key (infeedd names them as the user gave them). */
static int fail(const ifd_program *p, const char *key, ifd_error *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(const ifd_program *p, const char *key, ifd_error *err, const char *fmt, ...)
{
    char tail[IFD_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    const char *name = p->cls ? p->cls->name : "?";
    int at = snprintf(NULL, 0, "program '%s': ", name);
    ifd_error_set(err, IFD_EINVAL, "program '%s': " CONFIG_KEY " setting '%s': %s", name, key,
                  tail);
    return ifd_error_mark_key(err, CONFIG_KEY, at, (int)strlen(CONFIG_KEY));
}

int ifd_program_config_parse(ifd_program *p, const char *text, ifd_error *err)
{
    struct ifd_program_config *c = calloc(1, sizeof *c);
    if (c == NULL)
        return ifd_error_set(err, IFD_ENOMEM, CONFIG_KEY);
    json_error_t jerr;
    c->obj = text && text[0] ? json_loads(text, JSON_REJECT_DUPLICATES, &jerr) : json_object();
    if (c->obj == NULL || !json_is_object(c->obj)) {
        char why[200];
        if (c->obj == NULL)
            snprintf(why, sizeof why, " (%s)", jerr.text);
        else
            snprintf(why, sizeof why, " (a JSON %s)",
                     json_is_array(c->obj)     ? "array"
                     : json_is_string(c->obj)  ? "string"
                     : json_is_number(c->obj)  ? "number"
                     : json_is_boolean(c->obj) ? "boolean"
                                               : "null");
        json_decref(c->obj);
        free(c);
        return ifd_error_set_key(err, IFD_EINVAL, CONFIG_KEY,
                                 "expected a JSON object of the program's settings, such as "
                                 "'{\"layers\": 2}', got '%.80s'%s",
                                 text, why);
    }
    c->read = json_object();
    c->text = json_dumps(c->obj, JSON_COMPACT | JSON_SORT_KEYS);
    if (c->read == NULL || c->text == NULL) {
        json_decref(c->obj);
        json_decref(c->read);
        free(c->text);
        free(c);
        return ifd_error_set(err, IFD_ENOMEM, CONFIG_KEY);
    }
    p->config = c;
    return IFD_OK;
}

int ifd_program_config_unread(const ifd_program *p, ifd_error *err)
{
    const struct ifd_program_config *c = p->config;
    if (c == NULL)
        return IFD_OK;
    const char *key;
    json_t *v;
    json_object_foreach(c->obj, key, v)
    {
        (void)v;
        if (json_object_get(c->read, key) != NULL)
            continue;
        char known[256] = "";
        size_t at = 0;
        const char *k;
        json_t *u;
        json_object_foreach(c->read, k, u)
        {
            (void)u;
            if (at < sizeof known)
                at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", at ? ", " : "", k);
        }
        return fail(p, key, err, "the program has no such setting (%s%s)",
                    known[0] ? "it reads " : "it reads none", known);
    }
    return IFD_OK;
}

void ifd_program_config_free(ifd_program *p)
{
    struct ifd_program_config *c = p->config;
    if (c == NULL)
        return;
    json_decref(c->obj);
    json_decref(c->read);
    free(c->text);
    free(c);
    p->config = NULL;
}

const char *ifd_program_config_text(const ifd_program *p)
{
    return p->config ? p->config->text : "{}";
}

/* The value of key (NULL: not given), the key marked as read. */
static json_t *take(ifd_program *p, const char *key)
{
    struct ifd_program_config *c = p->config;
    if (c == NULL)
        return NULL;
    json_object_set_new(c->read, key, json_null());
    return json_object_get(c->obj, key);
}

static const char *describe(const json_t *v, char *buf, size_t len)
{
    if (json_is_string(v))
        snprintf(buf, len, "a string (\"%.40s\")", json_string_value(v));
    else if (json_is_real(v))
        snprintf(buf, len, "%.17g", json_real_value(v));
    else if (json_is_integer(v))
        snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else
        snprintf(buf, len, "%s",
                 json_is_object(v)    ? "an object"
                 : json_is_array(v)   ? "an array"
                 : json_is_boolean(v) ? (json_is_true(v) ? "true" : "false")
                                      : "null");
    return buf;
}

int ifd_program_config_int(ifd_program *p, const char *key, int64_t def, int64_t min, int64_t max,
                           int64_t *out, ifd_error *err)
{
    json_t *v = take(p, key);
    if (v == NULL) {
        *out = def;
        return IFD_OK;
    }
    char got[96];
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        return fail(p, key, err, "expected an integer from %" PRId64 " to %" PRId64 ", got %s", min,
                    max, describe(v, got, sizeof got));
    *out = json_integer_value(v);
    return IFD_OK;
}

int ifd_program_config_float(ifd_program *p, const char *key, double def, double min, double max,
                             double *out, ifd_error *err)
{
    json_t *v = take(p, key);
    if (v == NULL) {
        *out = def;
        return IFD_OK;
    }
    char got[96];
    if (!json_is_number(v) || !(json_number_value(v) >= min && json_number_value(v) <= max))
        return fail(p, key, err, "expected a number from %g to %g, got %s", min, max,
                    describe(v, got, sizeof got));
    *out = json_number_value(v);
    return IFD_OK;
}

int ifd_program_config_bool(ifd_program *p, const char *key, int def, int *out, ifd_error *err)
{
    json_t *v = take(p, key);
    if (v == NULL) {
        *out = def;
        return IFD_OK;
    }
    char got[96];
    if (!json_is_boolean(v))
        return fail(p, key, err, "expected true or false, got %s", describe(v, got, sizeof got));
    *out = json_is_true(v);
    return IFD_OK;
}

int ifd_program_config_string(ifd_program *p, const char *key, const char *def, char *buf,
                              size_t len, ifd_error *err)
{
    json_t *v = take(p, key);
    char got[96];
    if (v != NULL && (!json_is_string(v) || json_string_length(v) >= len))
        return fail(p, key, err, "expected a string of at most %zu bytes, got %s",
                    len ? len - 1 : 0, describe(v, got, sizeof got));
    snprintf(buf, len, "%s", v ? json_string_value(v) : def);
    return IFD_OK;
}
