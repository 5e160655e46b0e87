/*
 * libinfeed: log levels and the process's log settings (part of infeed/infeed.h, which includes
 * it).
 */
#ifndef IFD_LOGGING_H
#define IFD_LOGGING_H

#ifdef __cplusplus
extern "C" {
#endif

enum { IFD_LOG_ERROR = 0, IFD_LOG_WARN = 1, IFD_LOG_INFO = 2, IFD_LOG_DEBUG = 3 };
void ifd_log_set_level(int level);
int ifd_log_get_level(void);
/* "error", "warn", "info", "debug" */
int ifd_log_level_parse(const char *name, int *out);
const char *ifd_log_level_name(int level);
/* Several hosts: log lines read "infeed@RANK" instead of "infeed" (rank < 0: back to "infeed").
 * Before any thread logs. */
void ifd_log_set_host(int rank);

#ifdef __cplusplus
}
#endif

#endif
