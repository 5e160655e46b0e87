#include "outfeed/plugin_calls.h"

#include <stdlib.h>
#include <string.h>

/* "a, b and c": the run's tensor names, for a sentence. */
static void tensor_list(const ifd_outfeed_tensors *c, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->ntensors && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s",
                               i == 0                 ? ""
                               : i == c->ntensors - 1 ? " and "
                                                      : ", ",
                               c->names[i]);
}

static int bind(ifd_plugin_call *call, const ifd_outfeed_tensors *c, ifd_error *err)
{
    for (int k = 0; k < call->cls->ntensors; k++) {
        call->idx[k] = ifd_outfeed_tensors_find(c, call->cls->tensors[k]);
        if (call->idx[k] < 0) {
            char have[512];
            tensor_list(c, have, sizeof have);
            return ifd_error_set(err, IFD_EINVAL,
                                 "host call '%s' takes tensor '%s', which program '%s' does not "
                                 "outfeed (it outfeeds %s)",
                                 call->cls->name, call->cls->tensors[k], c->program->cls->name,
                                 have);
        }
    }
    return IFD_OK;
}

int ifd_plugin_calls_init(ifd_plugin_calls *pc, const ifd_outfeed_tensors *c,
                          const ifd_host_call_info *info, ifd_error *err)
{
    memset(pc, 0, sizeof *pc);
    int n = ifd_host_call_count();
    if (n == 0)
        return IFD_OK;
    pc->text = malloc(IFD_PLUGIN_CALL_JSON_MAX);
    if (pc->text == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "host calls");
    for (int i = 0; i < n && i < IFD_PLUGIN_CALLS_MAX; i++) {
        ifd_plugin_call *call = &pc->calls[pc->n];
        call->cls = ifd_host_call_get(i);
        int rc = bind(call, c, err);
        if (rc == IFD_OK && call->cls->init && (rc = call->cls->init(&call->state, info, err)))
            ifd_error_prefix(err, "host call '%s': its init", call->cls->name);
        if (rc) {
            ifd_plugin_calls_fini(pc);
            return rc;
        }
        pc->n++;
    }
    return IFD_OK;
}

int ifd_plugin_calls_step(ifd_plugin_calls *pc, const ifd_outfeed_tensors *c, int64_t step,
                          ifd_error *err)
{
    for (int i = 0; i < pc->n; i++) {
        ifd_plugin_call *call = &pc->calls[i];
        ifd_tensor t[IFD_HOST_CALL_MAX_TENSORS];
        for (int k = 0; k < call->cls->ntensors; k++)
            t[k] = c->tensors[call->idx[k]];
        int rc = call->cls->step(call->state, step, t, err);
        if (rc)
            return ifd_error_prefix(err, "host call '%s'", call->cls->name);
    }
    return IFD_OK;
}

int ifd_plugin_calls_summary(ifd_plugin_calls *pc, json_t *host_calls, ifd_error *err)
{
    for (int i = 0; i < pc->n; i++) {
        ifd_plugin_call *call = &pc->calls[i];
        pc->text[0] = '\0';
        int rc = call->cls->summary(call->state, pc->text, IFD_PLUGIN_CALL_JSON_MAX, err);
        if (rc)
            return ifd_error_prefix(err, "host call '%s': its summary", call->cls->name);
        pc->text[IFD_PLUGIN_CALL_JSON_MAX - 1] = '\0';
        json_error_t je;
        json_t *v = json_loads(pc->text, JSON_REJECT_DUPLICATES, &je);
        if (v == NULL || !json_is_object(v)) {
            json_decref(v);
            return ifd_error_set(err, IFD_EINVAL,
                                 "host call '%s': its summary is not a JSON object (%s): "
                                 "'%.80s'",
                                 call->cls->name, v ? "another JSON value" : je.text, pc->text);
        }
        json_object_set_new(host_calls, call->cls->name, v);
    }
    return IFD_OK;
}

void ifd_plugin_calls_fini(ifd_plugin_calls *pc)
{
    for (int i = 0; i < pc->n; i++)
        if (pc->calls[i].cls->destroy)
            pc->calls[i].cls->destroy(pc->calls[i].state);
    free(pc->text);
    memset(pc, 0, sizeof *pc);
}
