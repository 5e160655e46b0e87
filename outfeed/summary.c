#include "outfeed/summary.h"

#include <stdlib.h>
#include <string.h>

int ifd_summary_writer_add(ifd_summary_writer *w, ifd_sink *sink)
{
    if (sink == NULL)
        return IFD_EINVAL;
    if (w->nsinks == IFD_MAX_SINKS)
        return IFD_ENOMEM;
    w->sinks[w->nsinks++] = sink;
    return IFD_OK;
}

int ifd_summary_emit(ifd_summary_writer *w, json_t *obj, ifd_error *err)
{
    if (obj == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "summary: cannot build the JSON object");
    if (w->hosts > 1)
        json_object_set_new(obj, "host", json_integer(w->host));
    /* 17 significant digits: every double reads back as the same double (a histogram's last
     * limit, DBL_MAX, with 15 would read back as infinity, which JSON parsers refuse) */
    char *line = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(obj);
    if (line == NULL)
        return ifd_error_set(err, IFD_ENOMEM, "summary: cannot serialise the JSON object");
    int rc = IFD_OK;
    size_t len = strlen(line);
    for (int i = 0; i < w->nsinks; i++) {
        ifd_error e;
        int r = ifd_sink_write(w->sinks[i], line, len, &e);
        if (r && rc == IFD_OK) {
            rc = r;
            if (err)
                *err = e;
        }
    }
    free(line);
    return rc;
}

int ifd_summary_flush(ifd_summary_writer *w, ifd_error *err)
{
    int rc = IFD_OK;
    for (int i = 0; i < w->nsinks; i++) {
        ifd_error e;
        int r = ifd_sink_flush(w->sinks[i], &e);
        if (r && rc == IFD_OK) {
            rc = r;
            if (err)
                *err = e;
        }
    }
    return rc;
}
