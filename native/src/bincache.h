/* The program-binary cache shared by the native runtime (ART/binaries/) and the device agent (WORK/binaries/):
 * one file per program, "tuner-native-clbin 2\n<payload length> <sha256 of payload> <tag>\n<payload>", where the
 * tag names the program (the device folder and the source's hash: a file copied under another program's name
 * is refused). Written atomically into a new file of our own (O_EXCL, O_NOFOLLOW, mode 0600: a planted link
 * is never followed), in folders made 0700; read only from folders and files that are ours and writable by
 * nobody else, and when the header checks out. The folder per device is tnr_binary_cache_key: its name and a hash
 * of platform, name and driver version, so a driver update misses. */
#ifndef TNR_BINCACHE_H
#define TNR_BINCACHE_H

#include <stddef.h>

#include "opencl.h"

/* The binary cache's folder name for a device: its name and a hash of platform, name and driver version. */
void tnr_binary_cache_key(const tcl_device *d, char *out, size_t len);
/* The payload of the cache file at path in dir (malloc'd), or NULL when it is missing, does not check out, is not
 * tagged tag, or lies where someone else can write. */
unsigned char *tnr_bincache_read(const char *dir, const char *path, const char *tag, size_t *len);
/* Writes a cache file at path tagged tag (creating dir); silently nothing when it cannot (a read-only place, a
 * folder not ours alone, a name taken). */
void tnr_bincache_write(const char *dir, const char *path, const char *tag, const unsigned char *bin, size_t len);

#endif
