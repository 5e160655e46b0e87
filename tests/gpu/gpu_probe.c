#include "tests/gpu/gpu_probe.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct probe_msg {
    int count;
    char why[256];
} probe_msg;

int gpu_probe(char *why, size_t len)
{
    probe_msg m;
    memset(&m, 0, sizeof m);
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, len, "pipe failed");
        return 0;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        snprintf(why, len, "fork failed");
        return 0;
    }
    if (pid == 0) {
        close(fds[0]);
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess)
            snprintf(m.why, sizeof m.why, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        else if (n == 0)
            snprintf(m.why, sizeof m.why, "cudaGetDeviceCount: 0 devices visible");
        m.count = e == cudaSuccess ? n : 0;
        ssize_t w = write(fds[1], &m, sizeof m);
        _exit(w == (ssize_t)sizeof m ? 0 : 1);
    }
    close(fds[1]);
    size_t got = 0;
    while (got < sizeof m) {
        ssize_t r = read(fds[0], (char *)&m + got, sizeof m - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got != sizeof m) {
        snprintf(why, len, "the probe process died (status %d)", status);
        return 0;
    }
    snprintf(why, len, "%s", m.why);
    return m.count;
}
