/* tuner-agent: the device side of docs/agent-protocol.md.
 *
 *   tuner-agent --stdio [--work-dir DIR]                     frames on stdin/stdout, the log on stderr
 *   tuner-agent --listen HOST:PORT (--token-file PATH | --token-fd N | $TUNER_AGENT_TOKEN) [--once]
 *               [--work-dir DIR]         TCP, one session at a time (--once: exit when the first connection that
 *                                        proved the token ends)
 *               [--handshake-timeout S]  with a token: a connection proves it within S seconds (5), in frames
 *                                        of at most 64 KiB, or is closed
 *   The token never stands on a command line (issue 54): a file only its owner can read, an inherited descriptor
 *   (read to its first newline), or $TUNER_AGENT_TOKEN, which is read, wiped and removed. --token T is refused.
 *   Connections that have not proved the token share HANDSHAKE_SLOTS slots; when they are full the oldest
 *   stranger is dropped (OpenSSH's MaxStartups), so strangers cannot keep the owner out, and the session that
 *   proved the token is never dropped for a stranger.
 *   A non-loopback peer that sent 5 wrong tokens waits (1 s, doubling to 5 min) before its connections are read.
 *   CHALLENGE (the supervisor's): the host's nonce in, the agent's nonce and its HMAC proof out; HELLO then
 *   carries the host's HMAC over both nonces, never the token, and a captured HELLO fails on another connection.
 *   tuner-agent --version
 *   [--sysfs-root DIR]   where SENSORS reads the GPU clock and the thermal zones (/; $TUNER_SYSFS_ROOT)
 *
 * This file is the supervisor: it never loads OpenCL. It reads each frame, checks its header, answers PING, BYE
 * and SENSORS (the GPU clock and the temperature, from sysfs) and checks HELLO's token itself, and forwards everything else to the executor child (executor.c) over a
 * socketpair, waiting at most the frame's deadline for the reply. A child that does not answer in time is
 * killed (TIMEOUT); one that dies is reported with its signal (CRASHED). The next request forks a new child,
 * which first re-opens the device the host had opened. */
#define _GNU_SOURCE
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <ctype.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "common.h"
#include "proto.h"
#include "sha256.h"

static char work_dir[4096];
static const char *token; /* NULL: none required; else token_buf */
#define TOKEN_MIN 16
#define TOKEN_MAX 1024
static char token_buf[TOKEN_MAX + 2];
/* Connections that have not proved the token yet (--listen): at most this many at once, the oldest dropped first. */
#define HANDSHAKE_SLOTS 64
#define ACCEPTS_PER_ROUND 8 /* a burst of strangers cannot push out, in one round, a connection just accepted */
/* A connection keeps its slot this long whatever comes after it: time for its HELLO to arrive and be read. With
 * every slot that young, the listener is not polled and newcomers wait in the kernel's accept queue, in order:
 * strangers that reconnect the moment they are dropped cannot push the owner out before its HELLO is read. */
#define SLOT_GRACE_MS 250
/* Before HELLO has proved the token: each frame at most this many bytes of body, and HELLO within
 * handshake_ms of the connection (an idle or slow client is dropped, and the next connection served). */
#define PREAUTH_MAX_BODY 65536u
static long long handshake_ms = 5000;
static char sysfs_root[4096] = "/"; /* --sysfs-root, else $TUNER_SYSFS_ROOT, else / */

static void tnr_agent_log(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Overwrites n bytes in a way the compiler keeps (a secret is gone from this process's memory). */
static void wipe(void *p, size_t n) {
    volatile unsigned char *v = (volatile unsigned char *)p;
    while (n--) *v++ = 0;
}

/* Zeroes the stack below the caller: what deeper calls left there (SHA-256's message schedule and HMAC's key
 * blocks while the token was checked) is not inherited by the executor. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static void scrub_stack(void) {
    volatile unsigned char pad[64 * 1024];
    size_t i;
    for (i = 0; i < sizeof pad; i++) pad[i] = 0;
}

static void tnr_agent_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tnr_log_line("tuner-agent", fmt, ap);
    va_end(ap);
}

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static const char *signal_name(int sig) {
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGPIPE: return "SIGPIPE";
    case SIGTRAP: return "SIGTRAP";
    case SIGSYS: return "SIGSYS";
    default: return "a signal";
    }
}

/* ---- SENSORS: the GPU clock and the temperature from sysfs (tuner/measure/sensors.py reads the same nodes, in the
 * same order, on the host) ---- */

#define SENSOR_READ 256      /* bytes read from one node: a number and a newline */
#define SENSOR_ENTRIES 256   /* entries of a folder looked at (thermal zones, devfreq devices) */
#define SENSOR_CLOCK_MAX 100000000000LL /* 100 GHz: above it a node holds garbage */
#define SENSOR_TEMP_MIN (-60.0)
#define SENSOR_TEMP_MAX 200.0

/* At most SENSOR_READ bytes of the regular file path into buf (SENSOR_READ + 2 bytes), NUL-terminated; the length,
 * or -1 when it is absent, not a regular file (a FIFO is never waited on: opened O_NONBLOCK, checked on the
 * descriptor), unreadable, longer, or holding a NUL byte. */
static int sensor_node(const char *path, char *buf) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    size_t got = 0;
    if (fd < 0) return -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -1;
    }
    while (got <= SENSOR_READ) {
        ssize_t r = read(fd, buf + got, SENSOR_READ + 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { /* EAGAIN, EIO, EINVAL: a zone that is off, a driver that refuses */
            close(fd);
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got > SENSOR_READ || memchr(buf, 0, got)) return -1; /* too long for a number, or not text */
    buf[got] = 0;
    return (int)got;
}

/* A decimal integer (optional sign, 1 to 18 digits, whitespace around), as sensors._integer reads it. */
static int sensor_integer(const char *s, long long *out) {
    const char *p = s;
    int neg = 0, digits = 0;
    long long v = 0;
    while (*p && isspace((unsigned char)*p)) p++;
    if (*p == '-' || *p == '+') neg = *p++ == '-';
    while (*p >= '0' && *p <= '9') {
        if (++digits > 18) return 0;
        v = v * 10 + (*p++ - '0');
    }
    while (*p && isspace((unsigned char)*p)) p++;
    if (!digits || *p) return 0;
    *out = neg ? -v : v;
    return 1;
}

static int sensor_path(char *out, size_t n, const char *rel) {
    int k = snprintf(out, n, "%s/%s", sysfs_root, rel);
    return k > 0 && (size_t)k < n;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int contains_gpu(const char *s) {
    size_t i;
    for (i = 0; s[i]; i++)
        if (tolower((unsigned char)s[i]) == 'g' && tolower((unsigned char)s[i + 1]) == 'p' &&
            tolower((unsigned char)s[i + 2]) == 'u')
            return 1;
    return 0;
}

static int is_zone(const char *s) {
    const char *p = s + 12;
    if (strncmp(s, "thermal_zone", 12) != 0 || !*p) return 0;
    for (; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

enum { MATCH_ANY, MATCH_GPU, MATCH_ZONE };

/* The names of folder rel (under the root) that match, sorted, at most SENSOR_ENTRIES (malloc'd; *n of them). */
static char **sensor_entries(const char *rel, int match, size_t *n) {
    char path[4096 + 256];
    char **names = NULL;
    DIR *d;
    struct dirent *e;
    size_t seen = 0;
    *n = 0;
    if (!sensor_path(path, sizeof path, rel) || !(d = opendir(path))) return NULL;
    names = calloc(SENSOR_ENTRIES * 4, sizeof *names);
    if (!names) {
        closedir(d);
        return NULL;
    }
    while (seen < SENSOR_ENTRIES * 4 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        seen++;
        if ((match == MATCH_GPU && !contains_gpu(e->d_name)) || (match == MATCH_ZONE && !is_zone(e->d_name))) continue;
        if (!(names[*n] = strdup(e->d_name))) continue;
        (*n)++;
    }
    closedir(d);
    qsort(names, *n, sizeof *names, by_name);
    while (*n > SENSOR_ENTRIES) free(names[--*n]);
    return names;
}

static void free_entries(char **names, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* The clock of the node rel (Hz), or 0. */
static long long clock_at(const char *rel) {
    char path[4096 + 512], buf[SENSOR_READ + 2];
    long long v;
    if (!sensor_path(path, sizeof path, rel) || sensor_node(path, buf) < 0 || !sensor_integer(buf, &v)) return 0;
    return v > 0 && v <= SENSOR_CLOCK_MAX ? v : 0;
}

/* The GPU clock in Hz (0: none), and which node gave it into where (n bytes). */
static long long read_clock(char *where, size_t n) {
    static const char *fixed[] = {"sys/class/kgsl/kgsl-3d0/gpuclk", "sys/class/kgsl/kgsl-3d0/devfreq/cur_freq"};
    static const struct { const char *folder; int match; } globs[] = {
        {"sys/class/misc/mali0/device/devfreq", MATCH_ANY}, {"sys/class/devfreq", MATCH_GPU}};
    char rel[512];
    size_t i, j, k;
    long long v;
    for (i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if ((v = clock_at(fixed[i])) > 0) {
            snprintf(where, n, "%s", fixed[i]);
            return v;
        }
    for (i = 0; i < sizeof globs / sizeof globs[0]; i++) {
        char **names = sensor_entries(globs[i].folder, globs[i].match, &k);
        for (j = 0, v = 0; j < k && v <= 0; j++) {
            snprintf(rel, sizeof rel, "%s/%s/cur_freq", globs[i].folder, names[j]);
            if ((v = clock_at(rel)) > 0) snprintf(where, n, "%s", rel);
        }
        free_entries(names, k);
        if (v > 0) return v;
    }
    return 0;
}

/* The temperature in degrees C into *out (1), or 0 when no zone reads: the hottest zone whose type names a GPU,
 * else the hottest zone. */
static int read_temp(double *out, char *where, size_t n) {
    char rel[512], path[4096 + 512], buf[SENSOR_READ + 2];
    size_t i, k;
    char **names = sensor_entries("sys/class/thermal", MATCH_ZONE, &k);
    double best[2] = {0, 0};
    size_t at[2] = {0, 0};
    int have[2] = {0, 0};
    for (i = 0; i < k; i++) {
        long long v;
        double c;
        int gpu;
        snprintf(rel, sizeof rel, "sys/class/thermal/%s/temp", names[i]);
        if (!sensor_path(path, sizeof path, rel) || sensor_node(path, buf) < 0 || !sensor_integer(buf, &v)) continue;
        c = (double)v / 1000.0;
        if (!(c >= SENSOR_TEMP_MIN && c <= SENSOR_TEMP_MAX)) continue;
        snprintf(rel, sizeof rel, "sys/class/thermal/%s/type", names[i]);
        gpu = sensor_path(path, sizeof path, rel) && sensor_node(path, buf) >= 0 && contains_gpu(buf);
        if (!have[gpu] || c >= best[gpu]) { /* ties: the later name, as Python's max over (temp, name) */
            best[gpu] = c;
            at[gpu] = i;
            have[gpu] = 1;
        }
    }
    i = have[1] ? 1 : 0;
    if (have[i]) {
        *out = best[i];
        snprintf(where, n, "sys/class/thermal/%s/temp%s", names[at[i]], i ? " (gpu)" : "");
    }
    free_entries(names, k);
    return have[i];
}

/* SENSORS' reply: u32 flags (1 clock, 2 temperature), u64 clock Hz (0 without), f64 degrees C (0 without), str the
 * nodes read. */
static int send_sensors(int out, uint32_t rid) {
    char clock_at_[600] = "", temp_at[600] = "", source[1300];
    double temp = 0;
    long long hz = read_clock(clock_at_, sizeof clock_at_);
    int has_temp = read_temp(&temp, temp_at, sizeof temp_at), rc;
    tpr_buf b = {0};
    snprintf(source, sizeof source, "%s%s%s", clock_at_, *clock_at_ && *temp_at ? "; " : "", temp_at);
    tpr_put_u32(&b, (hz > 0 ? TPR_SENSOR_CLOCK : 0) | (has_temp ? TPR_SENSOR_TEMP : 0));
    tpr_put_u64(&b, hz > 0 ? (uint64_t)hz : 0);
    tpr_put_f64(&b, has_temp ? temp : 0.0);
    tpr_put_cstr(&b, source);
    rc = b.oom ? tpr_send_error(out, TPR_SENSORS, rid, TPR_RUNTIME, "out of memory for the SENSORS reply")
               : tpr_send(out, TPR_SENSORS, rid, TPR_OK, b.p, b.n);
    tpr_buf_free(&b);
    return rc;
}

/* ---- the executor child ---- */

static struct {
    pid_t pid;
    int fd;
} child = {-1, -1};

/* The body of the last OPEN that succeeded on this connection: a new child replays it. */
static unsigned char open_body[4];
static int opened;

/* Executors killed but not yet reaped (one stuck in the driver may take a while to go): reaped later. */
static pid_t unreaped[64];

static void reap_later(pid_t pid) {
    size_t i;
    for (i = 0; i < sizeof unreaped / sizeof unreaped[0]; i++)
        if (unreaped[i] <= 0) {
            unreaped[i] = pid;
            return;
        }
    tnr_agent_log("executor %ld could not be reaped", (long)pid);
}

static void reap_pending(void) {
    size_t i;
    int st;
    for (i = 0; i < sizeof unreaped / sizeof unreaped[0]; i++)
        if (unreaped[i] > 0 && waitpid(unreaped[i], &st, WNOHANG) != 0) unreaped[i] = 0;
}

/* Waits up to ms for pid; 1 with *st when it was reaped, 0 when it still runs. Never blocks longer. */
static int wait_for(pid_t pid, int *st, long long ms) {
    long long until = now_ms() + ms;
    pid_t w;
    while ((w = waitpid(pid, st, WNOHANG)) == 0 && now_ms() < until) usleep(2000);
    return w != 0;
}

static void reap(int force) {
    int st;
    if (child.fd >= 0) close(child.fd); /* the executor sees the end of its stream and exits */
    child.fd = -1;
    if (child.pid <= 0) return;
    if (force) kill(child.pid, SIGKILL);
    if (!wait_for(child.pid, &st, 2000)) {
        kill(child.pid, SIGKILL);
        if (!wait_for(child.pid, &st, 1000)) reap_later(child.pid); /* stuck in the kernel: the supervisor goes on */
    }
    child.pid = -1;
}

static void close_slots_in_child(void);


/* The request body the supervisor holds while it forks an executor: the child drops its copy. */
static unsigned char *held_body;

static int spawn(int host_in, int host_out, int listen_fd, char *msg) {
    int sv[2];
    pid_t parent = getpid(), pid;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return snprintf(msg, TNR_ERRLEN, "socketpair: %s", strerror(errno)), -1;
    pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return snprintf(msg, TNR_ERRLEN, "fork: %s", strerror(errno)), -1;
    }
    if (pid == 0) {
        int nul;
        close(sv[0]);
#if defined(__linux__)
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a supervisor killed with -9 takes its executor along */
#endif
        if (getppid() != parent) _exit(0);
        /* the host's link is the supervisor's alone; a driver that prints goes to the log, not into frames */
        nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) {
            dup2(nul, 0);
            if (nul > 2) close(nul);
        }
        dup2(2, 1);
        if (host_in > 2) close(host_in);
        if (host_out > 2 && host_out != host_in) close(host_out);
        if (listen_fd > 2) close(listen_fd);
        close_slots_in_child(); /* strangers' connections are the supervisor's */
        free(held_body);         /* the supervisor's buffer: the executor gets the request over the socketpair */
        held_body = NULL;
        wipe(token_buf, sizeof token_buf); /* the executor holds no secret (issue 54) */
        scrub_stack();
        token = NULL;
        signal(SIGPIPE, SIG_IGN);
        tnr_agent_executor(sv[1], work_dir);
        close(sv[1]);
        exit(0);
    }
    close(sv[1]);
    child.pid = pid;
    child.fd = sv[0];
    return 0;
}

/* Reads n bytes from fd before deadline (ms since the monotonic epoch; 0 none), watching host for its end.
 * 0 done, 1 the stream ended, 2 the deadline passed, 3 the host's link ended, -1 error. */
static int read_until(int fd, void *buf, size_t n, long long deadline, int host) {
    size_t got = 0;
    while (got < n) {
        struct pollfd p[2];
        int np = 1, timeout = -1, rc;
        ssize_t r;
        p[0].fd = fd;
        p[0].events = POLLIN;
        p[0].revents = 0;
        if (host >= 0) {
            p[1].fd = host;
            p[1].events = POLLRDHUP;
            p[1].revents = 0;
            np = 2;
        }
        if (deadline) {
            long long left = deadline - now_ms();
            if (left <= 0) return 2;
            timeout = left > 1000000000LL ? 1000000000 : (int)left;
        }
        rc = poll(p, (nfds_t)np, timeout);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return -1;
        if (rc == 0) return 2;
        if (np == 2 && (p[1].revents & (POLLHUP | POLLERR | POLLRDHUP)) && !(p[0].revents & POLLIN)) return 3;
        if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r < 0) return -1;
        if (r == 0) return 1;
        got += (size_t)r;
    }
    return 0;
}

/* Why the child is gone, after its stream ended: "signal 11 (SIGSEGV)" or "exit status 3". */
static void death(char *out, size_t len) {
    int st = 0;
    pid_t pid = child.pid;
    if (!wait_for(pid, &st, 2000)) {
        kill(pid, SIGKILL);
        if (!wait_for(pid, &st, 1000)) reap_later(pid);
        snprintf(out, len, "it closed its stream and was killed");
    } else if (WIFSIGNALED(st)) {
        snprintf(out, len, "signal %d (%s)", WTERMSIG(st), signal_name(WTERMSIG(st)));
    } else {
        snprintf(out, len, "exit status %d", WEXITSTATUS(st));
    }
    if (child.fd >= 0) close(child.fd);
    child.fd = -1;
    child.pid = -1;
}

/* Forwards one frame to the child and reads its reply. 0 with *rh and *rbody (malloc'd); else a status
 * (TIMEOUT, CRASHED, RUNTIME) with msg; -3 when the host's link ended meanwhile. */
static int relay(unsigned type, uint32_t rid, uint32_t deadline_ms, const unsigned char *body, size_t len,
                 int host, tpr_header *rh, unsigned char **rbody, char *msg) {
    unsigned char head[TPR_HEADER];
    long long deadline = deadline_ms ? now_ms() + deadline_ms : 0;
    char why[128];
    pid_t pid = child.pid;
    int rc;
    *rbody = NULL;
    if (tpr_send(child.fd, type, rid, deadline_ms, body, len) != 0) {
        death(why, sizeof why);
        snprintf(msg, TNR_ERRLEN, "the executor (pid %ld) died before %s: %s; every handle is gone", (long)pid,
                 tpr_type_name(type), why);
        return TPR_CRASHED;
    }
    rc = read_until(child.fd, head, TPR_HEADER, deadline, host);
    if (rc == 0) {
        const char *bad;
        tpr_unpack_header(head, rh);
        bad = tpr_header_problem(rh);
        if (bad || rh->rid != rid || rh->type != type) {
            reap(1);
            snprintf(msg, TNR_ERRLEN, "the executor replied with a broken frame (%s); it was killed, every handle is gone",
                     bad ? bad : "another request's id or type");
            return TPR_CRASHED;
        }
        *rbody = malloc(rh->len ? (size_t)rh->len : 1);
        if (!*rbody) {
            reap(1);
            snprintf(msg, TNR_ERRLEN, "out of memory for a reply of %llu bytes; the executor was killed",
                     (unsigned long long)rh->len);
            return TPR_RUNTIME;
        }
        rc = read_until(child.fd, *rbody, (size_t)rh->len, deadline, host);
        if (rc == 0) return 0;
        free(*rbody);
        *rbody = NULL;
    }
    if (rc == 2) {
        reap(1);
        snprintf(msg, TNR_ERRLEN, "%s did not finish within %u ms: the executor (pid %ld) was killed; every handle is gone",
                 tpr_type_name(type), deadline_ms, (long)pid);
        tnr_agent_log("%s", msg);
        return TPR_TIMEOUT;
    }
    if (rc == 3) {
        reap(1);
        return -3;
    }
    death(why, sizeof why);
    snprintf(msg, TNR_ERRLEN, "the executor (pid %ld) died during %s: %s; every handle is gone", (long)pid,
             tpr_type_name(type), why);
    tnr_agent_log("%s", msg);
    return TPR_CRASHED;
}

/* A running child that has the device open, or a status and msg. */
static int ensure_child(unsigned type, int host_in, int host_out, int listen_fd, int host, char *msg) {
    tpr_header rh;
    unsigned char *rbody = NULL;
    int rc;
    if (child.pid > 0) return TPR_OK;
    if (spawn(host_in, host_out, listen_fd, msg) != 0) return TPR_RUNTIME;
    if (!opened || type == TPR_OPEN || type == TPR_HELLO) return TPR_OK;
    rc = relay(TPR_OPEN, 0, 120000, open_body, sizeof open_body, host, &rh, &rbody, msg);
    if (rc == 0 && rh.word != TPR_OK) {
        tpr_reader r;
        char *m;
        tpr_reader_init(&r, rbody, (size_t)rh.len);
        m = tpr_str(&r, NULL);
        snprintf(msg, TNR_ERRLEN, "the restarted executor cannot open the device again: %s", m ? m : "");
        free(m);
        rc = (int)rh.word;
    } else if (rc > 0) {
        char tmp[TNR_ERRLEN];
        snprintf(tmp, sizeof tmp, "%s", msg);
        snprintf(msg, TNR_ERRLEN, "re-opening the device in a new executor: %s", tmp);
    }
    free(rbody);
    return rc;
}

/* A connection's challenge (CHALLENGE): the host's nonce and the agent's, one HELLO's worth. */
typedef struct {
    int issued;
    unsigned char host[TPR_NONCE], agent[TPR_NONCE];
} challenge;

static int equal_ct(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b), i;
    unsigned diff = n != m;
    for (i = 0; i < n && i < m; i++) diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

/* HMAC-SHA256(token, label || host nonce || agent nonce). */
static void proof(const char *label, const challenge *c, unsigned char out[32]) {
    unsigned char msg[64 + 2 * TPR_NONCE];
    size_t n = strlen(label);
    memcpy(msg, label, n);
    memcpy(msg + n, c->host, TPR_NONCE);
    memcpy(msg + n + TPR_NONCE, c->agent, TPR_NONCE);
    tnr_hmac_sha256(token, strlen(token), msg, n + 2 * TPR_NONCE, out);
}

/* Whether HELLO's string proves the token: "hmac-sha256:" and the host's proof over this connection's challenge
 * (which it uses up: a captured HELLO proves nothing on another connection), or the token itself (older tuners). */
static int token_ok(const char *got, challenge *c) {
    static const char hex[] = "0123456789abcdef";
    size_t pl = strlen(TPR_HMAC_PREFIX), i;
    if (!strncmp(got, TPR_HMAC_PREFIX, pl)) {
        unsigned char mac[32];
        char want[65];
        int ok;
        if (!c || !c->issued) return 0;
        proof(TPR_HOST_LABEL, c, mac);
        scrub_stack(); /* SHA-256's schedule and HMAC's key blocks, below this frame */
        for (i = 0; i < 32; i++) {
            want[2 * i] = hex[mac[i] >> 4];
            want[2 * i + 1] = hex[mac[i] & 15];
        }
        want[64] = 0;
        ok = equal_ct(got + pl, want);
        wipe(mac, sizeof mac);
        wipe(want, sizeof want);
        wipe(c, sizeof *c);
        return ok;
    }
    return equal_ct(got, token);
}

/* Answers CHALLENGE (body: bytes, the host's nonce): the agent's nonce and its proof that it holds the token, so
 * the host never sends the token to a process that merely took the port. 0 handled (the link stays), -1 the
 * reply could not be sent. */
static int answer_challenge(int out, const tpr_header *h, const unsigned char *body, challenge *c) {
    tpr_reader r;
    uint64_t n = 0;
    const unsigned char *nonce;
    unsigned char mac[32];
    tpr_buf b = {0};
    int fd, rc;
    size_t got = 0;
    tpr_reader_init(&r, body, (size_t)h->len);
    nonce = tpr_bytes(&r, &n);
    if (!tpr_end(&r) || n != TPR_NONCE) {
        char msg[256];
        snprintf(msg, sizeof msg, "CHALLENGE body: %s", r.bad ? r.why : "the host's nonce must be 32 bytes");
        return tpr_send_error(out, h->type, h->rid, TPR_BAD_REQUEST, msg) ? -1 : 0;
    }
    if (!token)
        return tpr_send_error(out, h->type, h->rid, TPR_AUTH, "this agent was started without a token: start it with "
                              "--token-file PATH (or $TUNER_AGENT_TOKEN)") ? -1 : 0;
    memcpy(c->host, nonce, TPR_NONCE);
    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && got < TPR_NONCE) {
        ssize_t k = read(fd, c->agent + got, TPR_NONCE - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    if (fd >= 0) close(fd);
    if (got < TPR_NONCE) {
        c->issued = 0;
        return tpr_send_error(out, h->type, h->rid, TPR_RUNTIME, "cannot read /dev/urandom for a nonce") ? -1 : 0;
    }
    c->issued = 1;
    proof(TPR_AGENT_LABEL, c, mac);
    scrub_stack();
    tpr_put_bytes(&b, c->agent, TPR_NONCE);
    tpr_put_bytes(&b, mac, sizeof mac);
    rc = b.oom ? tpr_send_error(out, h->type, h->rid, TPR_RUNTIME, "out of memory for the CHALLENGE reply")
               : tpr_send(out, h->type, h->rid, TPR_OK, b.p, b.n);
    wipe(mac, sizeof mac);
    tpr_buf_free(&b);
    return rc ? -1 : 0;
}

/* Reads n bytes of a frame: before authentication by hello_by (read_until's codes), after it as it comes
 * (tpr_read_full's: 0, 1 the stream ended at the start, -1). */
static int read_frame_part(int in, void *buf, size_t n, int authed, long long hello_by) {
    int rc;
    if (authed) return tpr_read_full(in, buf, n);
    rc = read_until(in, buf, n, hello_by, -1);
    return rc == 0 ? 0 : rc == 1 ? 1 : rc == 2 ? 2 : -1;
}

/* Serves one connection until BYE or its end; whether it was authenticated (always, without a token). first_h and
 * first_body (malloc'd, taken over): a HELLO that already proved the token (--listen's handshake slots). */
static int serve(int in, int out, int listen_fd, const tpr_header *first_h, unsigned char *first_body) {
    int authed = token == NULL || first_h != NULL;
    long long hello_by = authed ? 0 : now_ms() + handshake_ms;
    challenge ch;
    memset(&ch, 0, sizeof ch);
    opened = 0;
    for (;;) {
        unsigned char head[TPR_HEADER], *body = NULL, *rbody = NULL;
        tpr_header h, rh;
        const char *bad;
        char msg[TNR_ERRLEN];
        int rc, proved = 0; /* proved: a HELLO the handshake slot already checked */
        reap_pending();
        if (first_h) {
            proved = 1;
            h = *first_h;
            body = first_body;
            first_h = NULL;
            first_body = NULL;
            goto have_frame;
        }
        rc = read_frame_part(in, head, TPR_HEADER, authed, hello_by);
        if (rc == 2) {
            tnr_agent_log("no HELLO with the token within %lld ms of the connection: closing the link", handshake_ms);
            break;
        }
        if (rc == 1) break;
        if (rc != 0) {
            tnr_agent_log("the link ended inside a frame header");
            break;
        }
        tpr_unpack_header(head, &h);
        if ((bad = tpr_header_problem(&h)) != NULL) {
            tnr_agent_log("refused a frame: %s; closing the link", bad);
            tpr_send_error(out, h.type, h.rid, TPR_BAD_REQUEST, bad);
            break;
        }
        if (!authed && h.len > PREAUTH_MAX_BODY) { /* never allocated: the token is not proved yet */
            snprintf(msg, sizeof msg, "a frame before HELLO proved the token carries at most %u bytes, not %llu; "
                     "closing the link", PREAUTH_MAX_BODY, (unsigned long long)h.len);
            tnr_agent_log("%s", msg);
            tpr_send_error(out, h.type, h.rid, TPR_AUTH, msg);
            break;
        }
        body = malloc(h.len ? (size_t)h.len : 1);
        if (!body) {
            snprintf(msg, sizeof msg, "out of memory for a body of %llu bytes; closing the link", (unsigned long long)h.len);
            tnr_agent_log("%s", msg);
            tpr_send_error(out, h.type, h.rid, TPR_RUNTIME, msg);
            break;
        }
        if ((rc = read_frame_part(in, body, (size_t)h.len, authed, hello_by)) != 0) {
            if (rc == 2)
                tnr_agent_log("no HELLO with the token within %lld ms of the connection: closing the link",
                              handshake_ms);
            else
                tnr_agent_log("the link ended inside the body of %s (%llu bytes announced)", tpr_type_name(h.type),
                              (unsigned long long)h.len);
            free(body);
            break;
        }
    have_frame:
        if (h.type < 1 || h.type > TPR_LAST) {
            snprintf(msg, sizeof msg, "unknown message type %u", h.type);
            rc = tpr_send_error(out, h.type, h.rid, TPR_BAD_REQUEST, msg);
            free(body);
            if (rc) break;
            continue;
        }
        if (h.type == TPR_CHALLENGE) { /* answered here: it involves the token, which the executor never holds */
            rc = answer_challenge(out, &h, body, &ch);
            free(body);
            if (rc) break;
            continue;
        }
        if (!authed && h.type != TPR_HELLO) {
            tpr_send_error(out, h.type, h.rid, TPR_AUTH, "this agent requires a token: send HELLO with it first");
            free(body);
            break;
        }
        if (h.type == TPR_SENSORS) { /* answered here: no device, no executor */
            tpr_reader r;
            int fine;
            tpr_reader_init(&r, body, (size_t)h.len);
            fine = tpr_end(&r);
            free(body);
            if (!fine) {
                snprintf(msg, sizeof msg, "SENSORS body: %s", r.why);
                if (tpr_send_error(out, h.type, h.rid, TPR_BAD_REQUEST, msg)) break;
                continue;
            }
            if (send_sensors(out, h.rid)) break;
            continue;
        }
        if (h.type == TPR_HELLO || h.type == TPR_PING || h.type == TPR_BYE || h.type == TPR_OPEN) {
            tpr_reader r;
            char *tok = NULL;
            tpr_reader_init(&r, body, (size_t)h.len);
            if (h.type == TPR_HELLO) tok = tpr_str(&r, NULL);
            if (h.type == TPR_OPEN) tpr_u32(&r);
            if (!tpr_end(&r)) {
                snprintf(msg, sizeof msg, "%s body: %s", tpr_type_name(h.type), r.why);
                free(tok);
                free(body);
                if (tpr_send_error(out, h.type, h.rid, TPR_BAD_REQUEST, msg)) break;
                continue;
            }
            if (h.type == TPR_HELLO) {
                int ok = !token || proved || token_ok(tok, &ch);
                tpr_buf empty = {0};
                if (tok) wipe(tok, strlen(tok));
                free(tok);
                wipe(body, (size_t)h.len);
                if (!ok) {
                    tnr_agent_log("HELLO with a wrong token: closing the link");
                    tpr_send_error(out, h.type, h.rid, TPR_AUTH, "wrong token: the agent closes the link");
                    free(body);
                    break;
                }
                authed = 1;
                /* the executor gets HELLO with an empty token: it never holds the secret (issue 54) */
                tpr_put_cstr(&empty, "");
                if (empty.oom) {
                    free(body);
                    if (tpr_send_error(out, h.type, h.rid, TPR_RUNTIME, "out of memory for HELLO")) break;
                    continue;
                }
                free(body);
                body = empty.p;
                h.len = empty.n;
            } else {
                free(tok);
            }
            if (h.type == TPR_PING || h.type == TPR_BYE) {
                free(body);
                if (tpr_send(out, h.type, h.rid, TPR_OK, NULL, 0) || h.type == TPR_BYE) break;
                continue;
            }
        }
        held_body = body;
        rc = ensure_child(h.type, in, out, listen_fd, in, msg);
        held_body = NULL;
        if (rc == TPR_OK) rc = relay(h.type, h.rid, h.word, body, (size_t)h.len, in, &rh, &rbody, msg);
        if (rc == -3) {
            tnr_agent_log("the link ended while the executor worked on %s", tpr_type_name(h.type));
            free(body);
            break;
        }
        if (rc == 0) {
            if (h.type == TPR_OPEN && rh.word == TPR_OK) {
                memcpy(open_body, body, sizeof open_body);
                opened = 1;
            }
            rc = tpr_send(out, h.type, h.rid, rh.word, rbody, (size_t)rh.len);
            if (rh.word == TPR_CRASHED) reap(0); /* the executor's device faulted: it exits; the next request starts another */
        } else {
            rc = tpr_send_error(out, h.type, h.rid, (unsigned)rc, msg);
        }
        free(rbody);
        free(body);
        if (rc) break;
    }
    reap(0);
    return authed;
}


/* ---- --listen: handshake slots (issue 54: the owner always gets in) ----
 * Every accepted connection takes a slot until its first frame is a HELLO that proves the token; then it is
 * served (one session at a time, never dropped for a stranger). A slot is freed when its handshake deadline
 * passes, its client misbehaves, or, with every slot taken, a newer connection needs it: the oldest goes first.
 * The listening socket and the slots are non-blocking: no stranger stalls the supervisor. */

typedef struct {
    int fd;                /* -1: free */
    long long since, by;   /* accepted at; must prove the token by (ms, monotonic) */
    unsigned char head[TPR_HEADER];
    size_t got;            /* bytes of the header, then of the body, read so far */
    int have_head;
    tpr_header h;
    unsigned char *body;
    challenge ch;
} hs_slot;

static hs_slot slots[HANDSHAKE_SLOTS];
static int slots_live; /* set by listen_loop, which marks every slot free (fd -1) first */

static void slot_free(hs_slot *s);

static void close_slots_in_child(void) {
    size_t i;
    for (i = 0; slots_live && i < HANDSHAKE_SLOTS; i++)
        if (slots[i].fd >= 0) slot_free(&slots[i]);
}

static void slot_free(hs_slot *s) {
    if (s->fd >= 0) close(s->fd);
    if (s->body) {
        wipe(s->body, (size_t)s->h.len);
        free(s->body);
    }
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

/* ---- failed attempts, per peer: a remote address that sent PEER_FAILS wrong tokens waits before its next
 * connection is looked at (1 s, doubling to 5 min; forgotten after 10 min without a failure). Loopback peers are
 * exempt: every local process (on a phone, every app, and the owner) shares 127.0.0.1, and the slots bound them. */
#define PEERS 256
static int is_loopback_addr(const struct sockaddr *sa);
#define PEER_FAILS 5
#define PEER_MAX_WAIT_MS 300000LL
#define PEER_FORGET_MS 600000LL

static struct {
    int family; /* 0: free */
    unsigned char addr[16];
    int fails;
    long long last, until;
} peers[PEERS];

/* The peer's address of fd into addr (4 or 16 bytes) and its family; 0 for a loopback or unknown peer. */
static int peer_of(int fd, unsigned char addr[16]) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0 || is_loopback_addr((struct sockaddr *)&ss)) return 0;
    memset(addr, 0, 16);
    if (ss.ss_family == AF_INET) {
        memcpy(addr, &((struct sockaddr_in *)&ss)->sin_addr, 4);
        return AF_INET;
    }
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a6 = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            memcpy(addr, a6->s6_addr + 12, 4);
            return AF_INET;
        }
        memcpy(addr, a6->s6_addr, 16);
        return AF_INET6;
    }
    return 0;
}

static int peer_find(int family, const unsigned char addr[16], int insert, long long now) {
    int i, oldest = 0;
    for (i = 0; i < PEERS; i++)
        if (peers[i].family == family && !memcmp(peers[i].addr, addr, 16)) return i;
    if (!insert) return -1;
    for (i = 0; i < PEERS; i++) {
        if (!peers[i].family) break;
        if (peers[i].last < peers[oldest].last) oldest = i;
    }
    if (i == PEERS) i = oldest; /* the table is full: the peer heard from longest ago goes */
    memset(&peers[i], 0, sizeof peers[i]);
    peers[i].family = family;
    memcpy(peers[i].addr, addr, 16);
    peers[i].last = now;
    return i;
}

static void peer_name(int family, const unsigned char addr[16], char *out, size_t n) {
    if (!inet_ntop(family, addr, out, (socklen_t)n)) snprintf(out, n, "?");
}

/* A wrong token from fd's peer. */
static void peer_failed(int fd) {
    unsigned char addr[16];
    int family = peer_of(fd, addr), i;
    long long now = now_ms();
    if (!family) return;
    i = peer_find(family, addr, 1, now);
    if (now - peers[i].last > PEER_FORGET_MS) peers[i].fails = 0;
    peers[i].fails++;
    peers[i].last = now;
    if (peers[i].fails >= PEER_FAILS) {
        int shift = peers[i].fails - PEER_FAILS;
        long long wait = shift >= 9 ? PEER_MAX_WAIT_MS : 1000LL << shift;
        char name[64];
        if (wait > PEER_MAX_WAIT_MS) wait = PEER_MAX_WAIT_MS;
        peers[i].until = now + wait;
        peer_name(family, addr, name, sizeof name);
        tnr_agent_log("%d wrong tokens from %s: its connections are closed unread for %lld ms", peers[i].fails,
                      name, wait);
    }
}

/* Whether fd's peer must wait (its connection is closed unread). */
static int peer_waits(int fd) {
    unsigned char addr[16];
    int family = peer_of(fd, addr), i;
    if (!family || (i = peer_find(family, addr, 0, 0)) < 0) return 0;
    return now_ms() < peers[i].until;
}

/* The token proved from fd's peer: its failures are forgotten. */
static void peer_proved(int fd) {
    unsigned char addr[16];
    int family = peer_of(fd, addr), i;
    if (family && (i = peer_find(family, addr, 0, 0)) >= 0) memset(&peers[i], 0, sizeof peers[i]);
}

/* A reply to a stranger: best effort, never blocking (a client that does not read loses its slot). */
static int slot_error(hs_slot *s, unsigned status, const char *msg) {
    return tpr_send_error(s->fd, s->h.type, s->h.rid, status, msg);
}

/* Reads what a slot's client sent. 0: keep waiting; 1: the slot was closed; 2: a HELLO with the right token is in
 * s->h and s->body (to be served). */
static int slot_read(hs_slot *s) {
    for (;;) {
        size_t want = s->have_head ? (size_t)s->h.len : TPR_HEADER;
        ssize_t r = 0;
        if (s->got < want) {
            r = read(s->fd, s->have_head ? s->body + s->got : s->head + s->got, want - s->got);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
            if (r <= 0) {
                if (s->got || s->have_head) tnr_agent_log("the link ended inside a frame before HELLO");
                slot_free(s);
                return 1;
            }
            s->got += (size_t)r;
            if (s->got < want) continue;
        }
        if (!s->have_head) {
            const char *bad;
            tpr_unpack_header(s->head, &s->h);
            if ((bad = tpr_header_problem(&s->h)) != NULL) {
                tnr_agent_log("refused a frame: %s; closing the link", bad);
                slot_error(s, TPR_BAD_REQUEST, bad);
                slot_free(s);
                return 1;
            }
            if (s->h.len > PREAUTH_MAX_BODY) { /* never allocated: the token is not proved yet */
                char msg[TNR_ERRLEN];
                snprintf(msg, sizeof msg, "a frame before HELLO proved the token carries at most %u bytes, not %llu; "
                         "closing the link", PREAUTH_MAX_BODY, (unsigned long long)s->h.len);
                tnr_agent_log("%s", msg);
                slot_error(s, TPR_AUTH, msg);
                slot_free(s);
                return 1;
            }
            if (!(s->body = malloc(s->h.len ? (size_t)s->h.len : 1))) {
                slot_error(s, TPR_RUNTIME, "out of memory for a frame before HELLO; closing the link");
                slot_free(s);
                return 1;
            }
            s->have_head = 1;
            s->got = 0;
            continue;
        }
        /* a whole frame */
        if (s->h.type < 1 || s->h.type > TPR_LAST) {
            char msg[64];
            snprintf(msg, sizeof msg, "unknown message type %u", s->h.type);
            if (slot_error(s, TPR_BAD_REQUEST, msg)) {
                slot_free(s);
                return 1;
            }
        } else if (s->h.type == TPR_CHALLENGE) {
            if (answer_challenge(s->fd, &s->h, s->body, &s->ch)) {
                slot_free(s);
                return 1;
            }
        } else if (s->h.type != TPR_HELLO) {
            slot_error(s, TPR_AUTH, "this agent requires a token: send HELLO with it first");
            slot_free(s);
            return 1;
        } else {
            tpr_reader r;
            char *tok;
            int ok;
            tpr_reader_init(&r, s->body, (size_t)s->h.len);
            tok = tpr_str(&r, NULL);
            if (!tpr_end(&r)) {
                char msg[TNR_ERRLEN];
                snprintf(msg, sizeof msg, "HELLO body: %s", r.why);
                if (tok) wipe(tok, strlen(tok));
                free(tok);
                if (slot_error(s, TPR_BAD_REQUEST, msg)) {
                    slot_free(s);
                    return 1;
                }
            } else {
                ok = token_ok(tok, &s->ch);
                wipe(tok, strlen(tok));
                free(tok);
                if (ok) {
                    peer_proved(s->fd);
                    return 2;
                }
                peer_failed(s->fd);
                tnr_agent_log("HELLO with a wrong token: closing the link");
                slot_error(s, TPR_AUTH, "wrong token: the agent closes the link");
                slot_free(s);
                return 1;
            }
        }
        /* an answered frame that does not end the handshake: the next one, under the same deadline */
        wipe(s->body, (size_t)s->h.len);
        free(s->body);
        s->body = NULL;
        s->have_head = 0;
        s->got = 0;
    }
}

/* How far a slot's handshake went: 0 nothing received, 1 inside a frame, 2 a challenge answered. */
static int slot_progress(const hs_slot *s) {
    return s->ch.issued ? 2 : s->got || s->have_head ? 1 : 0;
}

/* The earliest accept time among the slots (every slot is taken when this is asked). */
static long long oldest_since(void) {
    long long t = slots[0].since;
    size_t i;
    for (i = 1; i < HANDSHAKE_SLOTS; i++)
        if (slots[i].since < t) t = slots[i].since;
    return t;
}

/* 1: every slot is taken by a connection still inside its SLOT_GRACE_MS, so no newcomer can have one. */
static int slots_full_and_young(long long now) {
    size_t i;
    for (i = 0; i < HANDSHAKE_SLOTS; i++)
        if (slots[i].fd < 0 || now - slots[i].since >= SLOT_GRACE_MS) return 0;
    return 1;
}

/* Serves --listen until --once's session ends (0) or accept fails (1). */
static int listen_loop(int lfd, int once) {
    struct pollfd p[HANDSHAKE_SLOTS + 1];
    size_t i;
    long long dropped = 0;
    for (i = 0; i < HANDSHAKE_SLOTS; i++) slots[i].fd = -1;
    slots_live = 1;
    for (;;) {
        long long now = now_ms(), next = -1;
        int timeout, rc, accepted = 0;
        reap_pending();
        p[0].fd = lfd;
        p[0].events = POLLIN;
        p[0].revents = 0;
        for (i = 0; i < HANDSHAKE_SLOTS; i++) {
            p[i + 1].fd = slots[i].fd; /* -1: ignored by poll */
            p[i + 1].events = POLLIN;
            p[i + 1].revents = 0;
            if (slots[i].fd >= 0 && (next < 0 || slots[i].by < next)) next = slots[i].by;
        }
        if (slots_full_and_young(now)) { /* no slot to give: leave newcomers queued until the oldest may go */
            long long free_at = oldest_since() + SLOT_GRACE_MS;
            p[0].fd = -1;
            if (next < 0 || free_at < next) next = free_at;
        }
        timeout = next < 0 ? 1000 : next <= now ? 0 : next - now > 1000 ? 1000 : (int)(next - now);
        rc = poll(p, HANDSHAKE_SLOTS + 1, timeout);
        if (rc < 0 && errno != EINTR) {
            tnr_agent_log("poll: %s", strerror(errno));
            return 1;
        }
        now = now_ms();
        /* first what the connections in the slots sent: a HELLO that arrived is served before anyone is dropped */
        for (i = 0; rc > 0 && i < HANDSHAKE_SLOTS; i++) {
            hs_slot *s = &slots[i];
            if (s->fd < 0 || !(p[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (slot_read(s) == 2) {
                int fd = s->fd, one = 1, flags = fcntl(fd, F_GETFL), authed;
                size_t j;
                tpr_header h = s->h;
                unsigned char *body = s->body;
                s->fd = -1;
                s->body = NULL;
                slot_free(s);
                if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                tnr_agent_log("a connection proved the token");
                authed = serve(fd, fd, lfd, &h, body);
                close(fd);
                tnr_agent_log("the connection ended");
                if (once && authed) return 0; /* --once: the owner's connection, not a stranger's that came first */
                /* whoever waited in a slot through the session gets a fresh deadline, as if accepted now */
                now = now_ms();
                for (j = 0; j < HANDSHAKE_SLOTS; j++)
                    if (slots[j].fd >= 0) slots[j].by = now + handshake_ms;
                rc = 0; /* the poll results are stale */
                break;
            }
        }
        for (i = 0; i < HANDSHAKE_SLOTS; i++)
            if (slots[i].fd >= 0 && slots[i].by <= now) {
                tnr_agent_log("no HELLO with the token within %lld ms of the connection: closing the link",
                              handshake_ms);
                slot_free(&slots[i]);
            }
        while (rc > 0 && (p[0].revents & POLLIN) && accepted < ACCEPTS_PER_ROUND && !slots_full_and_young(now)) {
            int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            hs_slot *s = NULL;
            if (c < 0) {
                if (errno == EINTR || errno == ECONNABORTED) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                    tnr_agent_log("accept: %s", strerror(errno));
                    break;
                }
                tnr_agent_log("accept: %s", strerror(errno));
                return 1;
            }
            accepted++;
            if (peer_waits(c)) { /* too many wrong tokens from there: closed unread, no slot taken */
                close(c);
                continue;
            }
            for (i = 0; i < HANDSHAKE_SLOTS && !s; i++)
                if (slots[i].fd < 0) s = &slots[i];
            if (!s) { /* every slot taken: the oldest stranger goes (MaxStartups), the least advanced first: one that
                       * sent nothing before one inside a frame, before one that holds a challenge (the owner
                       * between its CHALLENGE and its HELLO) */
                for (i = 0; i < HANDSHAKE_SLOTS; i++)
                    if (now - slots[i].since >= SLOT_GRACE_MS &&
                        (!s || slot_progress(&slots[i]) < slot_progress(s) ||
                         (slot_progress(&slots[i]) == slot_progress(s) && slots[i].since < s->since)))
                        s = &slots[i];
                if (dropped++ % 1000 == 0)
                    tnr_agent_log("all %d handshake slots are taken: dropped the oldest connection that had not "
                                  "proved the token (%lld so far)", HANDSHAKE_SLOTS, dropped);
                slot_free(s);
            }
            s->fd = c;
            s->since = now;
            s->by = now + handshake_ms;
        }
    }
}

/* ---- the token: never from a command line (issue 54) ---- */

/* Checks the token text in token_buf (n bytes, one trailing newline dropped); 0, or -1 after an error line. */
static int token_take(size_t n, const char *from) {
    size_t i;
    if (n && token_buf[n - 1] == '\n') n--;
    if (n && token_buf[n - 1] == '\r') n--;
    token_buf[n] = 0;
    for (i = 0; i < n; i++)
        if ((unsigned char)token_buf[i] <= 0x20 || (unsigned char)token_buf[i] >= 0x7f) {
            wipe(token_buf, sizeof token_buf);
            fprintf(stderr, "error: %s: the token must be one line of printable ASCII without spaces\n", from);
            return -1;
        }
    if (n > TOKEN_MAX) {
        wipe(token_buf, sizeof token_buf);
        fprintf(stderr, "error: %s: the token is longer than %d bytes\n", from, TOKEN_MAX);
        return -1;
    }
    if (n < TOKEN_MIN) {
        wipe(token_buf, sizeof token_buf);
        fprintf(stderr, "error: %s: the token has %zu bytes; it needs at least %d (make one with `python3 -c "
                        "\"import secrets; print(secrets.token_urlsafe(24))\"`)\n", from, n, TOKEN_MIN);
        return -1;
    }
    token = token_buf;
    return 0;
}

/* --token-file PATH: a regular file owned by this user that no one else can read (0600 or 0400). */
static int token_from_file(const char *path) {
    char from[300];
    struct stat st;
    size_t got = 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    snprintf(from, sizeof from, "--token-file %.200s", path);
    if (fd < 0) {
        fprintf(stderr, "error: %s: %s (give a file that holds the token, made with `umask 077`)\n", from,
                errno == ELOOP ? "a symbolic link is not read" : strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "error: %s: not a regular file\n", from);
        close(fd);
        return -1;
    }
    if (st.st_uid != geteuid()) {
        fprintf(stderr, "error: %s: the file belongs to another user (uid %ld): the token file must be this user's "
                        "own\n", from, (long)st.st_uid);
        close(fd);
        return -1;
    }
    if (st.st_mode & 077) {
        fprintf(stderr, "error: %s: the file is readable or writable by group or others (mode %04o); run "
                        "`chmod 600 %.200s`\n", from, (unsigned)(st.st_mode & 07777), path);
        close(fd);
        return -1;
    }
    if (st.st_size > TOKEN_MAX + 1) {
        fprintf(stderr, "error: %s: %lld bytes; a token file holds one line of at most %d bytes\n", from,
                (long long)st.st_size, TOKEN_MAX);
        close(fd);
        return -1;
    }
    while (got < TOKEN_MAX + 1) {
        ssize_t r = read(fd, token_buf + got, TOKEN_MAX + 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            fprintf(stderr, "error: %s: %s\n", from, strerror(errno));
            close(fd);
            wipe(token_buf, sizeof token_buf);
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    return token_take(got, from);
}

/* --token-fd N: one line read from an inherited descriptor (a pipe: adb:// writes the token to the agent's stdin),
 * within 30 s; the descriptor is then closed (0, 1 and 2 are pointed at /dev/null instead). */
static int token_from_fd(const char *spec) {
    char from[64], *end = NULL;
    long fd = strtol(spec, &end, 10);
    size_t got = 0;
    long long until = now_ms() + 30000;
    snprintf(from, sizeof from, "--token-fd %.20s", spec);
    if (!end || *end || end == spec || fd < 0 || fd > 1000000 || fcntl((int)fd, F_GETFD) < 0) {
        fprintf(stderr, "error: %s: give an open file descriptor number (e.g. 0, the standard input)\n", from);
        return -1;
    }
    while (got < TOKEN_MAX + 1) {
        struct pollfd pf = {(int)fd, POLLIN, 0};
        long long left = until - now_ms();
        ssize_t r;
        if (left <= 0 || poll(&pf, 1, (int)left) == 0) {
            fprintf(stderr, "error: %s: no token line within 30 s\n", from);
            wipe(token_buf, sizeof token_buf);
            return -1;
        }
        r = read((int)fd, token_buf + got, 1); /* one byte at a time: nothing after the line is taken */
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r < 0) {
            fprintf(stderr, "error: %s: %s\n", from, strerror(errno));
            wipe(token_buf, sizeof token_buf);
            return -1;
        }
        if (r == 0) break;
        if (token_buf[got++] == '\n') break;
    }
    if (got > TOKEN_MAX) {
        fprintf(stderr, "error: %s: the token line is longer than %d bytes\n", from, TOKEN_MAX);
        wipe(token_buf, sizeof token_buf);
        return -1;
    }
    if (fd <= 2) {
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0 && nul != fd) {
            dup2(nul, (int)fd);
            close(nul);
        }
    } else {
        close((int)fd);
    }
    return token_take(got, from);
}

/* $TUNER_AGENT_TOKEN: copied, then wiped where it stood (so /proc/PID/environ no longer shows it) and removed. */
static int token_from_env(void) {
    char *v = getenv("TUNER_AGENT_TOKEN");
    size_t n;
    if (!v) return 0;
    n = strlen(v);
    if (!n) {
        unsetenv("TUNER_AGENT_TOKEN");
        return 0;
    }
    if (n > TOKEN_MAX) {
        wipe(v, n);
        unsetenv("TUNER_AGENT_TOKEN");
        fprintf(stderr, "error: $TUNER_AGENT_TOKEN: longer than %d bytes\n", TOKEN_MAX);
        return -1;
    }
    memcpy(token_buf, v, n);
    wipe(v, n);
    unsetenv("TUNER_AGENT_TOKEN");
    return token_take(n, "$TUNER_AGENT_TOKEN");
}

/* ---- main ---- */

static int usage(const char *why) {
    if (why) fprintf(stderr, "error: %s\n", why);
    fprintf(stderr,
            "usage: tuner-agent --stdio [--work-dir DIR]\n"
            "       tuner-agent --listen HOST:PORT (--token-file PATH | --token-fd N | $TUNER_AGENT_TOKEN) [--once]\n"
            "                   [--work-dir DIR] [--handshake-timeout S]\n"
            "       the token: at least 16 bytes; a file only you can read (chmod 600), a descriptor to read one line\n"
            "       from, or $TUNER_AGENT_TOKEN (read and removed); never on the command line\n"
            "       tuner-agent --version\n"
            "       [--sysfs-root DIR]: where SENSORS reads the GPU clock and the thermal zones (default /, or\n"
            "       $TUNER_SYSFS_ROOT)\n"
            "The device agent of the tuner (docs/agent-protocol.md). OpenCL: $TUNER_OPENCL_LIB, else the system's.\n");
    return 2;
}

/* Whether the resolved address is a loopback one (127.0.0.0/8, ::1, or ::ffff:127.x.y.z): decided on the socket
 * address getaddrinfo gives, never on the host's spelling ("127.attacker.example" or a "localhost" that
 * /etc/hosts maps elsewhere is not loopback). */
static int is_loopback_addr(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
    }
    return 0;
}

static int listen_on(const char *spec) {
    char host[256];
    const char *colon = strrchr(spec, ':'), *port;
    struct addrinfo hints, *ai = NULL, *a;
    int fd = -1, one = 1, rc;
    if (!colon || colon == spec || !colon[1] || (size_t)(colon - spec) >= sizeof host) {
        fprintf(stderr, "error: --listen %s: write HOST:PORT, e.g. 127.0.0.1:7390\n", spec);
        return -1;
    }
    memcpy(host, spec, (size_t)(colon - spec));
    host[colon - spec] = 0;
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = 0;
    }
    port = colon + 1;
    {   /* decimal digits only, 0 (any free port) to 65535: "99999" would wrap to another port */
        const char *c;
        long v = 0;
        for (c = port; *c; c++) {
            if (*c < '0' || *c > '9' || (v = v * 10 + (*c - '0')) > 65535) {
                fprintf(stderr, "error: --listen %s: the port must be a number from 1 to 65535 (0: any free port)\n",
                        spec);
                return -1;
            }
        }
    }
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    if ((rc = getaddrinfo(host, port, &hints, &ai)) != 0) {
        fprintf(stderr, "error: --listen %s: %s\n", spec, gai_strerror(rc));
        return -1;
    }
    if (!token) {  /* every listening agent requires a token: say who could reach this one without it */
        for (a = ai; a; a = a->ai_next) {
            if (!is_loopback_addr(a->ai_addr)) {
                fprintf(stderr, "error: --listen %s is reachable from other machines (%s resolves to a "
                                "non-loopback address): pass --token-file PATH (a file only you can read) or set "
                                "TUNER_AGENT_TOKEN, and give the tuner the same token\n", spec, host);
                freeaddrinfo(ai);
                return -1;
            }
        }
        fprintf(stderr, "error: --listen %s needs a token: every local process (on a phone, every app) reaches a "
                        "loopback port; pass --token-file PATH (a file only you can read) or set TUNER_AGENT_TOKEN, and "
                        "give the tuner the same token (tcp://HOST:PORT?token_file=PATH); adb:// makes one by itself\n", spec);
        freeaddrinfo(ai);
        return -1;
    }
    for (a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        fprintf(stderr, "error: --listen %s: cannot listen there (%s)\n", spec, strerror(errno));
        return -1;
    }
    {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        char h[256] = "?", p[32] = "?";
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
            getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV);
        tnr_agent_log("listening on %s:%s%s", h, p, token ? " (a token is required)" : "");
    }
    return fd;
}

static void default_work_dir(void) {
#if defined(__ANDROID__)
    snprintf(work_dir, sizeof work_dir, "/data/local/tmp/tuner");
#else
    const char *tmp = getenv("TMPDIR");
    snprintf(work_dir, sizeof work_dir, "%s/tuner-agent", tmp && *tmp ? tmp : "/tmp");
#endif
}

int main(int argc, char **argv) {
    const char *listen_spec = NULL, *token_file = NULL, *token_fd = NULL;
    int stdio = 0, once = 0, i;
    default_work_dir();
    {
        const char *env_root = getenv("TUNER_SYSFS_ROOT");
        if (env_root && *env_root && strlen(env_root) < sizeof sysfs_root - 512)
            snprintf(sysfs_root, sizeof sysfs_root, "%s", env_root);
    }
    if (token_from_env() != 0) return 2;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--version")) {
            printf("tuner-agent %s (protocol %d)\n", TNR_AGENT_VERSION, TPR_VERSION);
            return 0;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(NULL);
            return 0;
        } else if (!strcmp(a, "--stdio")) {
            stdio = 1;
        } else if (!strcmp(a, "--once")) {
            once = 1;
        } else if (!strcmp(a, "--listen") && i + 1 < argc) {
            listen_spec = argv[++i];
        } else if (!strcmp(a, "--handshake-timeout") && i + 1 < argc) {
            char *end = NULL;
            double sec = strtod(argv[++i], &end);
            if (!end || *end || end == argv[i] || !(sec >= 0.1 && sec <= 3600))
                return usage("--handshake-timeout takes seconds, from 0.1 to 3600");
            handshake_ms = (long long)(sec * 1000);
        } else if (!strcmp(a, "--token") || !strncmp(a, "--token=", 8)) {
            /* refused (issue 54): every local user reads a command line in /proc/PID/cmdline */
            if (i + 1 < argc && a[7] != '=') wipe(argv[i + 1], strlen(argv[i + 1]));
            fprintf(stderr, "error: --token puts the token on the command line, where every local user can read it "
                            "(/proc/PID/cmdline); write it to a file only you can read (umask 077; echo TOKEN > FILE) "
                            "and pass --token-file FILE, or pass --token-fd N, or set TUNER_AGENT_TOKEN\n");
            return 2;
        } else if (!strcmp(a, "--token-file") && i + 1 < argc) {
            token_file = argv[++i];
        } else if (!strcmp(a, "--token-fd") && i + 1 < argc) {
            token_fd = argv[++i];
        } else if (!strcmp(a, "--sysfs-root") && i + 1 < argc) {
            struct stat st;
            if (!argv[i + 1][0] || strlen(argv[i + 1]) >= sizeof sysfs_root - 512)
                return usage("--sysfs-root: give a folder (a path shorter than 3,500 bytes)");
            if (stat(argv[i + 1], &st) != 0 || !S_ISDIR(st.st_mode)) {
                char why[300];
                snprintf(why, sizeof why, "--sysfs-root %.200s: not a folder (give the folder that holds sys/class)",
                         argv[i + 1]);
                return usage(why);
            }
            snprintf(sysfs_root, sizeof sysfs_root, "%s", argv[++i]);
        } else if (!strcmp(a, "--work-dir") && i + 1 < argc) {
            if (strlen(argv[i + 1]) >= sizeof work_dir - 64) return usage("--work-dir: the path is too long");
            snprintf(work_dir, sizeof work_dir, "%s", argv[++i]);
        } else {
            char why[300];
            snprintf(why, sizeof why, "unknown or incomplete argument '%.200s'", a);
            return usage(why);
        }
    }
    if (stdio == !!listen_spec) return usage("give one of --stdio and --listen HOST:PORT");
    if (token_file && token_fd) return usage("give one of --token-file and --token-fd");
    if (token_file || token_fd) {
        wipe(token_buf, sizeof token_buf); /* a file or a descriptor overrides $TUNER_AGENT_TOKEN */
        token = NULL;
        if ((token_file ? token_from_file(token_file) : token_from_fd(token_fd)) != 0) return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (stdio) {
        serve(0, 1, -1, NULL, NULL);
        return 0;
    }
    {
        int lfd = listen_on(listen_spec), flags;
        if (lfd < 0) return 2;
        if ((flags = fcntl(lfd, F_GETFL)) >= 0) fcntl(lfd, F_SETFL, flags | O_NONBLOCK);
        return listen_loop(lfd, once);
    }
}
