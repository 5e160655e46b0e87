/* infeedd's JSON config (config_internal.h lists the config's files): a config file's or
 * --config-json's object applied key by key, with sentences that name the key, what it expects
 * and what arrived (ifd_json_describe). */
#include "host/config_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

const char *ifd_json_describe(const json_t *v, char *buf, size_t len)
{
    if (v == NULL) {
        snprintf(buf, len, "nothing");
        return buf;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        snprintf(buf, len, "an object");
        break;
    case JSON_ARRAY:
        snprintf(buf, len, "an array");
        break;
    case JSON_STRING:
        snprintf(buf, len, "a string of %zu bytes", json_string_length(v));
        break;
    case JSON_INTEGER:
        snprintf(buf, len, "the integer %" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        snprintf(buf, len, "the number %g", json_real_value(v));
        break;
    case JSON_TRUE:
    case JSON_FALSE:
        snprintf(buf, len, "%s", json_is_true(v) ? "true" : "false");
        break;
    case JSON_NULL:
        snprintf(buf, len, "null");
        break;
    }
    return buf;
}

/* host_calls in the file: {"tensor": "spec" or ["spec", ...], ...}, which replaces the list so
 * far. */
static int apply_json_calls(ifd_daemon_config *c, const json_t *v, const char *where,
                            ifd_error *err)
{
    char got[96];
    c->run.nhost_calls = 0;
    if (!json_is_object(v))
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: expected an object of tensor names to host calls (for example "
                             "{\"confidence\": [\"mean\", \"histogram\"]}), got %s",
                             where, ifd_json_describe(v, got, sizeof got));
    const char *name;
    const json_t *specs;
    json_object_foreach((json_t *)v, name, specs)
    {
        if (json_is_string(specs)) {
            const char *s = json_string_value(specs);
            int rc = config_add_call(c, name, strlen(name), s, strlen(s), where, err);
            if (rc)
                return rc;
            continue;
        }
        if (!json_is_array(specs))
            return ifd_error_set(err, IFD_EINVAL,
                                 "%s: tensor '%s': expected a host call spec or an array of "
                                 "them, got %s",
                                 where, name, ifd_json_describe(specs, got, sizeof got));
        size_t i;
        const json_t *e;
        json_array_foreach(specs, i, e)
        {
            if (!json_is_string(e))
                return ifd_error_set(err, IFD_EINVAL,
                                     "%s: tensor '%s': element %zu: expected a host call spec "
                                     "(a string), got %s",
                                     where, name, i, ifd_json_describe(e, got, sizeof got));
            const char *s = json_string_value(e);
            int rc = config_add_call(c, name, strlen(name), s, strlen(s), where, err);
            if (rc)
                return rc;
        }
    }
    return IFD_OK;
}

/* program_lib in the file: a path or an array of them, which replaces the list so far. */
static int apply_json_libs(ifd_daemon_config *c, const config_opt *o, const json_t *v,
                           const char *where, ifd_error *err)
{
    ((ifd_lib_list *)((char *)c + o->off))->n = 0;
    if (json_is_string(v))
        return config_set_value(c, o, json_string_value(v), where, err);
    if (json_is_array(v)) {
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e)
        {
            if (!json_is_string(e)) {
                char got[96];
                return ifd_error_set(err, IFD_EINVAL,
                                     "%s: element %zu: expected a file name (a string), got %s",
                                     where, i, ifd_json_describe(e, got, sizeof got));
            }
            int rc = config_set_value(c, o, json_string_value(e), where, err);
            if (rc)
                return rc;
        }
        return IFD_OK;
    }
    char got[96];
    return ifd_error_set(err, IFD_EINVAL, "%s: expected a file name or an array of them, got %s",
                         where, ifd_json_describe(v, got, sizeof got));
}

/* The text form of a file's value for o (into buf when it is a number), or NULL with *want
 * saying what the key takes. */
static const char *json_text(const config_opt *o, const json_t *v, char *buf, size_t len,
                             const char **want)
{
    switch (o->kind) {
    case K_INT:
    case K_I64:
    case K_U64:
    case K_LOOP:
        if (json_is_integer(v)) {
            snprintf(buf, len, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
            return buf;
        }
        if (o->kind == K_LOOP && json_is_string(v))
            return json_string_value(v);
        *want = o->kind == K_LOOP
                    ? "an integer or a string (auto, or a duration such as 2s or 500ms)"
                    : "an integer";
        return NULL;
    case K_F32:
    case K_F64:
        if (json_is_number(v)) {
            snprintf(buf, len, "%.17g", json_number_value(v));
            return buf;
        }
        *want = "a number";
        return NULL;
    case K_BOOL:
    case K_SWITCH:
        if (json_is_boolean(v))
            return json_is_true(v) ? "on" : "off";
        *want = json_is_string(v) ? NULL : "true or false";
        return json_is_string(v) ? json_string_value(v) : NULL;
    default: /* K_STR, K_ENUM (K_LIBS: apply_json_libs) */
        *want = json_is_string(v) ? NULL : "a string";
        return json_is_string(v) ? json_string_value(v) : NULL;
    }
}

/* One key of the file. */
static int apply_json_key(ifd_daemon_config *c, const char *key, const json_t *v,
                          const char *source, ifd_error *err)
{
    const config_opt *o = config_find_key(key, strlen(key));
    if (o == NULL)
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: unknown key '%s' (the keys are the flags of infeedd --help with "
                             "'_' for '-')",
                             source, key);
    char where[160];
    snprintf(where, sizeof where, "%s: key '%s'", source, key);
    int rc;
    if (o->kind == K_LIBS) {
        rc = apply_json_libs(c, o, v, where, err);
    } else if (o->kind == K_CALLS) {
        rc = apply_json_calls(c, v, where, err);
    } else if ((o->flags & OPT_OBJECT) && !json_is_string(v)) {
        char got[96];
        if (!json_is_object(v))
            return ifd_error_set(err, IFD_EINVAL,
                                 "%s: expected a JSON object (or its text), got %s", where,
                                 ifd_json_describe(v, got, sizeof got));
        char *text = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
        rc = text ? config_set_value(c, o, text, where, err)
                  : ifd_error_set(err, IFD_ENOMEM, "%s", where);
        free(text);
    } else {
        char buf[64], got[96];
        const char *want = NULL, *val = json_text(o, v, buf, sizeof buf, &want);
        if (val == NULL)
            return ifd_error_set(err, IFD_EINVAL, "%s: expected %s, got %s", where, want,
                                 ifd_json_describe(v, got, sizeof got));
        rc = config_set_value(c, o, val, where, err);
    }
    if (rc == IFD_OK)
        c->key_source[o - config_opts] = IFD_KEY_FROM_FILE;
    return rc;
}

int ifd_daemon_config_apply_json(ifd_daemon_config *c, const char *text, const char *source,
                                 ifd_error *err)
{
    json_error_t je;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return ifd_error_set(err, IFD_EINVAL, "%s: line %d, column %d: %s", source, je.line,
                             je.column, je.text);
    int rc = IFD_OK;
    if (!json_is_object(root)) {
        char got[96];
        rc = ifd_error_set(err, IFD_EINVAL, "%s: expected a JSON object of config keys, got %s",
                           source, ifd_json_describe(root, got, sizeof got));
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (rc == IFD_OK)
            rc = apply_json_key(c, key, v, source, err);
    }
    json_decref(root);
    return rc;
}
