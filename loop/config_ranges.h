/*
 * The runtime's range table (loop/config.c), for the daemon's --help: what ifd_config_validate
 * expects of a numeric key, in its sentence's words ("1 to 1024"), or NULL for a key without a
 * range (or with a rule the table cannot say).
 */
#ifndef IFD_LOOP_CONFIG_RANGES_H
#define IFD_LOOP_CONFIG_RANGES_H

const char *ifd_config_range_text(const char *key);

#endif
