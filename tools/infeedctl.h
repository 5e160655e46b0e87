/*
 * infeedctl's parts (tools/infeedctl.c: options, the control socket, status and stop;
 * tools/ctl_watch.c: watch). One thread; nothing here is a library.
 */
#ifndef IFD_TOOLS_INFEEDCTL_H
#define IFD_TOOLS_INFEEDCTL_H

#include "infeed/error.h"

#include <jansson.h>

typedef struct ctl_options {
    const char *control;
    const char *publish;
    const char *server_key; /* the daemon's PREFIX.pub */
    const char *key_file;   /* this client's PREFIX.key */
    double timeout;         /* seconds to wait for an answer */
    int json;
    const char *command;
} ctl_options;

/* One request on the control socket (CURVE when the options say so); *reply is the parsed answer.
 * IFD_OK, or an error whose sentence says why no answer came. */
int control_request(const ctl_options *o, const char *request, json_t **reply, ifd_error *err);
/* The C client's sentence in infeedctl's words (--timeout instead of the client's option). */
void reword_client(char *msg, size_t cap);
/* A member of a JSON object, or dflt when it is missing or of another type. */
const char *str_or(json_t *o, const char *key, const char *dflt);
double num_or(json_t *o, const char *key, double dflt);

/* infeedctl watch: exit status 0 when the run ended well. */
int cmd_watch(const ctl_options *o);

#endif
