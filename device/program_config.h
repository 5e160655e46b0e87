/* The runtime's side of a program's JSON settings (device/program_config.c); the program's side,
 * the typed readers, is in include/infeed/program.h. */
#ifndef IFD_DEVICE_PROGRAM_CONFIG_H
#define IFD_DEVICE_PROGRAM_CONFIG_H

#include <infeed/program.h>

/* Parses text (NULL or "": no settings, {}) into p->config; IFD_EINVAL with a sentence keyed
 * program_config when it is not a JSON object. */
int ifd_program_config_parse(ifd_program *p, const char *text, ifd_error *err);
/* After setup: IFD_EINVAL naming the first key the setup did not read, and the keys it did. */
int ifd_program_config_unread(const ifd_program *p, ifd_error *err);
void ifd_program_config_free(ifd_program *p);

#endif
