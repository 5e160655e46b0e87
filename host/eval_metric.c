/* The metrics of --keep-best and --early-stopping (host/eval_metric.h). */
#include "host/eval_metric.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int ifd_eval_metric_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(name[i] == '_' || (name[i] >= 'a' && name[i] <= 'z') ||
              (name[i] >= 'A' && name[i] <= 'Z') || (name[i] >= '0' && name[i] <= '9')))
            return 0;
    return 1;
}

int ifd_eval_metric_minimized(const char *name)
{
    size_t n = strlen(name);
    return strcmp(name, "loss") == 0 || (n > 5 && strcmp(name + n - 5, "_loss") == 0);
}

int ifd_eval_parse_early_stopping(const char *s, char *metric, size_t len, int64_t *patience)
{
    const char *colon = strrchr(s, ':');
    if (colon == NULL || (size_t)(colon - s) >= len || colon[1] == '\0')
        return -1;
    memcpy(metric, s, (size_t)(colon - s));
    metric[colon - s] = '\0';
    char *end;
    errno = 0;
    long long p = strtoll(colon + 1, &end, 10);
    if (*end != '\0' || errno || p < 1 || colon[1] == '+' || colon[1] == ' ' ||
        !ifd_eval_metric_valid(metric))
        return -1;
    *patience = p;
    return 0;
}
