#define _POSIX_C_SOURCE 200809L
#include "bincache.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "sha256.h"

void tnr_binary_cache_key(const tcl_device *d, char *out, size_t len) {
    char buf[800], hex[65], name[49];
    size_t i, n = 0;
    tnr_sha256_hex(buf, tnr_join3(buf, sizeof buf, d->platform_name, d->name, d->driver_version), hex);
    for (i = 0; d->name[i] && n < sizeof name - 1; i++) {
        char ch = d->name[i];
        name[n++] = isalnum((unsigned char)ch) && (unsigned char)ch < 128 ? ch : '-';
    }
    name[n] = 0;
    snprintf(out, len, "%s-%.16s", n ? name : "device", hex);
}

#define BIN_MAGIC "tuner-native-clbin 1\n"

int tnr_mkdirs(const char *path) {
    char tmp[4096];
    size_t i, n = strlen(path);
    if (n >= sizeof tmp) return -1;
    memcpy(tmp, path, n + 1);
    for (i = 1; i <= n; i++)
        if (tmp[i] == '/' || tmp[i] == 0) {
            char c = tmp[i];
            tmp[i] = 0;
            if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return -1;
            tmp[i] = c;
        }
    return 0;
}

unsigned char *tnr_bincache_read(const char *path, size_t *len) {
    unsigned char *data = NULL, *payload;
    size_t n = 0, plen, mlen = strlen(BIN_MAGIC);
    char e[TNR_ERRLEN], hex[65], want[65];
    unsigned long long declared;
    const char *nl;
    if (tnr_read_file(path, (size_t)1 << 31, &data, &n, e) != TNR_OK) return NULL;
    if (n < mlen || memcmp(data, BIN_MAGIC, mlen) != 0) goto bad;
    nl = memchr(data + mlen, '\n', n - mlen);
    if (!nl || sscanf((const char *)data + mlen, "%llu %64s", &declared, want) != 2) goto bad;
    payload = (unsigned char *)nl + 1;
    plen = n - (size_t)(payload - data);
    if (declared != plen || plen == 0) goto bad;
    tnr_sha256_hex(payload, plen, hex);
    if (strcmp(hex, want) != 0) goto bad;
    memmove(data, payload, plen);
    *len = plen;
    return data;
bad:
    free(data);
    return NULL;
}

void tnr_bincache_write(const char *dir, const char *path, const unsigned char *bin, size_t len) {
    char tmp[4200], hex[65], head[128];
    FILE *f;
    int ok;
    if (tnr_mkdirs(dir) != 0) return; /* a read-only artifact: no cache */
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    f = fopen(tmp, "wb");
    if (!f) return;
    tnr_sha256_hex(bin, len, hex);
    snprintf(head, sizeof head, "%s%zu %s\n", BIN_MAGIC, len, hex);
    ok = fwrite(head, 1, strlen(head), f) == strlen(head) && fwrite(bin, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) unlink(tmp); /* atomic: readers see the old file or the new one */
}

