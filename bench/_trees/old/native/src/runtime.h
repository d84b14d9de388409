/* The runtime behind include/tuner_runtime.h: an artifact (artifact.h) on one OpenCL device (opencl.h). */
#ifndef TNR_RUNTIME_INTERNAL_H
#define TNR_RUNTIME_INTERNAL_H

#include "../include/tuner_runtime.h"
#include "artifact.h"
#include "bincache.h"
#include "opencl.h"

/* The device `spec` selects (see tnr_open), for an artifact compiled for `a` (may be NULL). -1 and a message
 * when none. */
int tnr_choose_device(const tcl_device *devs, int n, const char *spec, const tnr_artifact *a, char *err);

#endif
