#include "host/endpoint.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

int ifd_endpoint_prepare(const char *key, const char *endpoint, ifd_error *err)
{
    if (strncmp(endpoint, "ipc://", 6) != 0)
        return IFD_OK;
    const char *path = endpoint + 6;
    if (path[0] == '@' || strcmp(path, "*") == 0)
        return IFD_OK;
    char dir[IFD_ENDPOINT_MAX];
    const char *slash = strrchr(path, '/');
    if (slash == NULL || slash == path) /* relative to the working folder, or in / */
        return IFD_OK;
    size_t n = (size_t)(slash - path);
    if (n >= sizeof dir)
        return ifd_error_set(err, IFD_EINVAL, "%s: the folder of '%s' is longer than %zu bytes",
                             key, endpoint, sizeof dir - 1);
    memcpy(dir, path, n);
    dir[n] = '\0';
    /* mkdir -p, each missing folder 0700 (a folder another process made meanwhile is fine) */
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        struct stat st;
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return ifd_error_set(err, IFD_EIO, "%s: cannot create the folder '%s' of '%s': %s", key,
                                 dir, endpoint, strerror(errno));
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            return ifd_error_set(err, IFD_EIO, "%s: '%s' in '%s' is not a folder", key, dir,
                                 endpoint);
        *p = c;
        if (c == '\0')
            break;
    }
    return IFD_OK;
}

int ifd_endpoint_bind(void *sock, const char *key, const char *endpoint, char *bound, size_t len,
                      ifd_error *err)
{
    int rc = ifd_endpoint_prepare(key, endpoint, err);
    if (rc)
        return rc;
    if (zmq_bind(sock, endpoint) != 0)
        return ifd_error_set(err, IFD_EIO, "%s: cannot bind '%s': %s", key, endpoint,
                             zmq_strerror(zmq_errno()));
    size_t size = len;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, bound, &size) != 0 || size == 0)
        snprintf(bound, len, "%s", endpoint);
    return IFD_OK;
}
