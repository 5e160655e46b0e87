/* The probe program of the outfeed tensor tests: softmax over D = 3 features that also outfeeds
 * its inputs, x3 (float32 [rows, 3]) and y1 (int32 [rows]), after softmax's class, confidence
 * and label. Registered in-process (probe_program_register) or loaded as a plugin
 * (tests/CMakeLists.txt builds tests/util/probe_program.c with PROBE_PLUGIN as ifd_probe.so). */
#ifndef IFD_TEST_PROBE_PROGRAM_H
#define IFD_TEST_PROBE_PROGRAM_H

#include <infeed/program.h>

enum { PROBE_X = 3, PROBE_Y = 4 }; /* outfeed indices, after softmax's class, confidence, label */

/* The class "probe" (softmax's functions around its own setup and step). */
const ifd_program_class *probe_program_class(void);
/* Registers it unless a program of its name is registered. */
void probe_program_register(void);

#endif
