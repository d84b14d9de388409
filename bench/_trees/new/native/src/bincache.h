/* The program-binary cache shared by the native runtime (ART/binaries/) and the device agent (WORK/binaries/):
 * one file per program, "tuner-native-clbin 1\n<payload length> <sha256 of payload>\n<payload>", written
 * atomically (a temporary file renamed), read only when it checks out. The folder per device is
 * tnr_binary_cache_key: its name and a hash of platform, name and driver version, so a driver update misses. */
#ifndef TNR_BINCACHE_H
#define TNR_BINCACHE_H

#include <stddef.h>

#include "opencl.h"

/* The binary cache's folder name for a device: its name and a hash of platform, name and driver version. */
void tnr_binary_cache_key(const tcl_device *d, char *out, size_t len);
/* mkdir -p; 0 or -1 (errno set). */
int tnr_mkdirs(const char *path);
/* The payload of a cache file (malloc'd), or NULL when it is missing or does not check out. */
unsigned char *tnr_bincache_read(const char *path, size_t *len);
/* Writes a cache file at path (creating dir); silently nothing when it cannot (a read-only place). */
void tnr_bincache_write(const char *dir, const char *path, const unsigned char *bin, size_t len);

#endif
