#define _POSIX_C_SOURCE 200809L
#include "bincache.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
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

#define BIN_MAGIC "tuner-native-clbin 2\n"

/* A folder of the cache that only this user can change: not a link, ours, writable by nobody else. */
static int private_dir(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022);
}

/* The cache folder (.../binaries/<device key>) and its parent (.../binaries) are both private. */
static int private_cache(const char *dir) {
    char parent[4096];
    const char *slash = strrchr(dir, '/');
    size_t n = slash ? (size_t)(slash - dir) : 0;
    if (!private_dir(dir)) return 0;
    if (!n || n >= sizeof parent) return 1;
    memcpy(parent, dir, n);
    parent[n] = 0;
    return private_dir(parent);
}

unsigned char *tnr_bincache_read(const char *dir, const char *path, const char *tag, size_t *len) {
    unsigned char *data = NULL, *payload;
    size_t n = 0, cap = 0, plen, mlen = strlen(BIN_MAGIC);
    char hex[65], want[65], got_tag[320];
    unsigned long long declared;
    const char *nl;
    struct stat st;
    int fd;
    if (!private_cache(dir)) return NULL; /* a folder someone else can write: its files prove nothing */
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) ||
        st.st_size <= 0 || (unsigned long long)st.st_size > ((unsigned long long)1 << 31))
        goto bad;
    cap = (size_t)st.st_size;
    data = malloc(cap);
    if (!data) goto bad;
    while (n < cap) {
        ssize_t r = read(fd, data + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) goto bad;
        n += (size_t)r;
    }
    if (n < mlen || memcmp(data, BIN_MAGIC, mlen) != 0) goto bad;
    nl = memchr(data + mlen, '\n', n - mlen);
    if (!nl || nl - (const char *)data > 512) goto bad;
    {
        char head[520];
        size_t hl = (size_t)(nl - (const char *)data) - mlen;
        memcpy(head, data + mlen, hl);
        head[hl] = 0;
        if (sscanf(head, "%llu %64s %319s", &declared, want, got_tag) != 3) goto bad;
    }
    if (strcmp(got_tag, tag) != 0) goto bad; /* another program's binary saved under this one's name */
    payload = (unsigned char *)nl + 1;
    plen = n - (size_t)(payload - data);
    if (declared != plen || plen == 0) goto bad;
    tnr_sha256_hex(payload, plen, hex);
    if (strcmp(hex, want) != 0) goto bad;
    close(fd);
    memmove(data, payload, plen);
    *len = plen;
    return data;
bad:
    close(fd);
    free(data);
    return NULL;
}

void tnr_bincache_write(const char *dir, const char *path, const char *tag, const unsigned char *bin, size_t len) {
    char tmp[4200], hex[65], head[512];
    size_t hl;
    int fd, ok;
    if (tnr_mkdirs(dir, 0700) != 0 || !private_cache(dir)) return; /* read-only, or not ours alone: no cache */
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    /* a new file of our own: a link or a file planted at this name is never followed or reused */
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return;
    tnr_sha256_hex(bin, len, hex);
    snprintf(head, sizeof head, "%s%zu %s %s\n", BIN_MAGIC, len, hex, tag);
    hl = strlen(head);
    ok = write(fd, head, hl) == (ssize_t)hl && write(fd, bin, len) == (ssize_t)len;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) unlink(tmp); /* atomic: readers see the old file or the new one */
}
