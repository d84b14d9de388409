/* The runtime behind include/tuner_runtime.h: an artifact (artifact.h) on one OpenCL device (opencl.h). */
#ifndef TNR_RUNTIME_INTERNAL_H
#define TNR_RUNTIME_INTERNAL_H

#include "../include/tuner_runtime.h"
#include "artifact.h"
#include "opencl.h"

/* The binary cache's folder name for a device: its name and a hash of platform, name and driver version. */
void tnr_binary_cache_key(const tcl_device *d, char *out, size_t len);
/* The device `spec` selects (see tnr_open), for an artifact compiled for `a` (may be NULL). -1 and a message
 * when none. */
int tnr_choose_device(const tcl_device *devs, int n, const char *spec, const tnr_artifact *a, char *err);

#endif
