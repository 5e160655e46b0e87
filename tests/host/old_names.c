/* ifd_config's old field names, kept for one release: this file must compile, and the compiler
 * must warn at each use with a sentence that names the new field (tests/host/old_names.cmake). */
#include "infeed/infeed.h"

int64_t old_names(void);

int64_t old_names(void)
{
    ifd_config c;
    ifd_config_defaults(&c);
    c.num_steps = 5;
    c.watchdog_secs = 2.0;
    c.initial_infeed_sleep_secs = 1.0;
    c.max_loop_secs = 0.25;
    return c.steps;
}
