#include "host/endpoint.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

/* Whether a process listens on the unix socket at path (a file left by one that is gone
 * refuses the connection). */
static int socket_in_use(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path)
        return 0;
    strcpy(a.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int used = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return used;
}

/* The folder of a private endpoint: this user's, and no one else may enter it. */
static int check_private(const char *key, const char *dir, const char *endpoint, ifd_error *err)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return ifd_error_set(err, IFD_EIO, "%s: the folder '%s' of '%s': %s", key, dir, endpoint,
                             strerror(errno));
    if (st.st_uid != geteuid() || (st.st_mode & 077) != 0)
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: the folder '%s' of the default endpoint '%s' is owned by uid %lu "
                             "with mode %04o: expected a folder of this user (uid %lu) that no "
                             "one else may enter (mode 0700), so that only this user reaches the "
                             "socket; remove it, or pass --%s",
                             key, dir, endpoint, (unsigned long)st.st_uid,
                             (unsigned)(st.st_mode & 07777), (unsigned long)geteuid(), key);
    return IFD_OK;
}

int ifd_endpoint_prepare(const char *key, const char *endpoint, int private_dir, ifd_error *err)
{
    if (strncmp(endpoint, "ipc://", 6) != 0)
        return IFD_OK;
    const char *path = endpoint + 6;
    if (path[0] == '@' || strcmp(path, "*") == 0)
        return IFD_OK;
    if (socket_in_use(path)) /* libzmq would take the path over, silently */
        return ifd_error_set(err, IFD_EINVAL,
                             "%s: cannot bind '%s': another process serves that socket (an "
                             "infeedd already running?): stop it, or pick another path",
                             key, endpoint);
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
    return private_dir ? check_private(key, dir, endpoint, err) : IFD_OK;
}

int ifd_endpoint_bind(void *sock, const char *key, const char *endpoint, int private_dir,
                      char *bound, size_t len, ifd_error *err)
{
    int rc = ifd_endpoint_prepare(key, endpoint, private_dir, err);
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
