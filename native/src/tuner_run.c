/* tuner-run: run a compiled-model artifact with the native runtime.
 *
 *   tuner-run ARTIFACT [--device SPEC] [--input X.npy | --input NAME=X.npy ...]
 *             [--output Y.npy | --output NAME=Y.npy ...] [--outputs DIR] [--bench N] [--warmup W] [--profile]
 *   tuner-run --devices            list the OpenCL devices
 *   tuner-run --check ARTIFACT     make the artifact's checks only (no OpenCL)
 *
 * Errors: "error: <message>" on stderr, exit status 2. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../include/tuner_runtime.h"
#include "common.h"
#include "npy.h"

#define MAX_INPUTS 64
#define MAX_OUTPUTS 64

static void usage(FILE *f) {
    fprintf(f, "usage: tuner-run ARTIFACT [--device SPEC] [--input X.npy | --input NAME=X.npy ...]\n"
               "                 [--output Y.npy | --output NAME=Y.npy ...] [--outputs DIR]\n"
               "                 [--bench N] [--warmup W] [--profile] [--verify KEYFILE]\n"
               "       tuner-run --devices\n"
               "       tuner-run --check ARTIFACT\n"
               "\n"
               "  --device SPEC   index, or a substring of platform/name/type/fingerprint (default: $TUNER_DEVICE, else the\n"
               "                  device the artifact was compiled for, else the first GPU, PoCL, CPU)\n"
               "  --input         a .npy of float32/float16 per model input (default: a fixed pseudo-random input)\n"
               "  --output        write an output as a float32 .npy in the model's shape: Y.npy the first,\n"
               "                  NAME=Y.npy that one (repeat for several)\n"
               "  --outputs DIR   write every output as DIR/NAME.npy (characters other than A-Za-z0-9._- as _)\n"
               "  --bench N       timed whole runs (inputs written, kernels, outputs read; default 10): the median\n"
               "                  and the spread (IQR/median); above 10%% ($TUNER_SPREAD_WARN) a warning\n"
               "  --warmup W      untimed runs first (default 2)\n"
               "  --profile       per-node kernel times from OpenCL profiling events\n"
               "  --verify KEY    refuse the artifact unless it is signed with this key file (tuner compile --sign)\n");
}

/* s to f with every control character but newline and tab escaped (\x1b, and C1 as \x9b): an artifact's names
 * reach the terminal through error lines and --profile, and a name holding ESC [ 2 J must not clear the screen or
 * set its title. */
static void put_safe(FILE *f, const char *s) {
    const unsigned char *c = (const unsigned char *)s;
    for (; *c; c++) {
        if ((*c < 0x20 && *c != '\n' && *c != '\t') || *c == 0x7f) fprintf(f, "\\x%02x", *c);
        else if (*c == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f) fprintf(f, "\\x%02x", *++c);
        else fputc(*c, f);
    }
}

/* s with every control character escaped (as put_safe, newline and tab included), malloc'd; NULL: out of memory */
static char *escaped(const char *s) {
    const unsigned char *c = (const unsigned char *)s;
    char *out = malloc(strlen(s) * 4 + 1), *o = out;
    if (!out) return NULL;
    for (; *c; c++) {
        if (*c < 0x20 || *c == 0x7f) o += sprintf(o, "\\x%02x", *c);
        else if (*c == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f) o += sprintf(o, "\\x%02x", *++c);
        else *o++ = (char)*c;
    }
    *o = 0;
    return out;
}

static int fail(const char *fmt, const char *a, const char *b) {
    char msg[3 * TNR_ERRLEN + 8192];
    snprintf(msg, sizeof msg, fmt, a, b);
    fprintf(stderr, "error: ");
    put_safe(stderr, msg);
    fprintf(stderr, "\n");
    return 2;
}

static int parse_int(const char *s, int lo, int *out) {
    char *e;
    long v;
    if (!s || !*s) return 0;
    v = strtol(s, &e, 10);
    if (*e || v < lo || v > 1000000) return 0;
    *out = (int)v;
    return 1;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* --bench's spread, IQR/median, above which it warns that the timing is unreliable (the device busy, or its clock
 * ramping or throttling): tuner.timing.SPREAD_WARN, the same value; $TUNER_SPREAD_WARN (a fraction) overrides both. */
#define SPREAD_WARN 0.10

static double spread_warn(void) {
    const char *e = getenv("TUNER_SPREAD_WARN");
    char *end;
    double v = e && *e ? strtod(e, &end) : SPREAD_WARN;
    return e && *e && !*end && v >= 0 ? v : SPREAD_WARN;
}

/* The q quantile of sorted values, linearly interpolated (numpy's default, as tuner.timing.quantile). */
static double quantile(const double *v, int n, double q) {
    double pos = q * (n - 1);
    int lo = (int)pos, hi = lo + 1 < n ? lo + 1 : n - 1;
    return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

/* IQR/median of sorted times; 0 for fewer than two or a median of 0. */
static double spread(const double *v, int n) {
    double m = n > 1 ? quantile(v, n, 0.5) : 0;
    return m > 0 ? (quantile(v, n, 0.75) - quantile(v, n, 0.25)) / m : 0;
}

/* A fixed pseudo-random input in [-1, 1) (xorshift), so repeated runs compare. */
static void fill(float *x, size_t n, unsigned seed) {
    uint32_t s = 2463534242u ^ seed;
    size_t i;
    for (i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        x[i] = (float)((double)(s >> 8) / (double)(1u << 24) * 2.0 - 1.0);
    }
}

/* The file --outputs writes output `name` to, as tuner/cli/model.py's output_file_name names it: the name's first
 * 200 bytes, each byte other than A-Za-z0-9._- (or a leading '.') as '_', then ".npy". 0 when dir is too long. */
static int output_file(const char *dir, const char *name, char *out, size_t len) {
    size_t used = (size_t)snprintf(out, len, "%s/", dir), i;
    if (used + 200 + 5 >= len) return 0;
    for (i = 0; name[i] && i < 200; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                 (c == '.' && i > 0);
        out[used++] = ok ? c : '_';
    }
    if (!name[0]) out[used++] = '_';
    snprintf(out + used, len - used, ".npy");
    return 1;
}

/* The index of the input or output (name_of) that a NAME=PATH argument names, or -1 (no '=', or no such name). */
static int named(const tnr_runtime *rt, const char *arg, int count, const char *(*name_of)(const tnr_runtime *, int)) {
    const char *eq = strchr(arg, '=');
    int k;
    for (k = 0; eq && k < count; k++)
        if (strlen(name_of(rt, k)) == (size_t)(eq - arg) && !strncmp(name_of(rt, k), arg, (size_t)(eq - arg))) return k;
    return -1;
}

static void shape_text(const int64_t *d, int n, char *out, size_t len) {
    size_t used = 0;
    int i;
    used += (size_t)snprintf(out, len, "[");
    for (i = 0; i < n && used < len; i++) used += (size_t)snprintf(out + used, len - used, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (used < len) snprintf(out + used, len - used, "]");
}

static int run_main(int argc, char **argv) {
    const char *artifact = NULL, *device = NULL, *outputs_dir = NULL, *verify = NULL, *inputs[MAX_INPUTS],
               *outputs[MAX_OUTPUTS];
    int ninputs = 0, noutputs = 0, bench = 10, warmup = 2, profile = 0, i, rc, nin, nout;
    tnr_runtime *rt = NULL;
    double *times = NULL;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--devices")) {
            char list[8192], err[2048];
            if (tnr_list_devices(list, sizeof list, err, sizeof err) != TNR_OK) return fail("%s%s", err, "");
            fputs(list, stdout);
            return 0;
        } else if (!strcmp(a, "--check")) {
            char err[2048];
            if (!v) return fail("--check needs an artifact folder%s%s", "", "");
            if (tnr_check(v, err, sizeof err) != TNR_OK) return fail("%s%s", err, "");
            printf("%s: ok\n", v);
            return 0;
        } else if (!strcmp(a, "--device") || !strcmp(a, "--input") || !strcmp(a, "--output") || !strcmp(a, "--bench") ||
                   !strcmp(a, "--warmup") || !strcmp(a, "--verify") || !strcmp(a, "--outputs")) {
            if (!v) return fail("%s needs a value%s", a, "");
            i++;
            if (!strcmp(a, "--device")) device = v;
            else if (!strcmp(a, "--verify")) verify = v;
            else if (!strcmp(a, "--outputs")) outputs_dir = v;
            else if (!strcmp(a, "--output")) {
                if (noutputs == MAX_OUTPUTS) return fail("more than 64 --output%s%s", "", "");
                outputs[noutputs++] = v;
            }
            else if (!strcmp(a, "--input")) {
                if (ninputs == MAX_INPUTS) return fail("more than 64 --input%s%s", "", "");
                inputs[ninputs++] = v;
            } else if (!strcmp(a, "--bench") && !parse_int(v, 1, &bench))
                return fail("--bench %s: a positive integer expected%s", v, "");
            else if (!strcmp(a, "--warmup") && !parse_int(v, 0, &warmup))
                return fail("--warmup %s: a non-negative integer expected%s", v, "");
        } else if (!strcmp(a, "--profile")) {
            profile = 1;
        } else if (a[0] == '-' && a[1]) {
            usage(stderr);
            return fail("unknown option %s%s", a, "");
        } else if (!artifact) {
            artifact = a;
        } else {
            return fail("one artifact expected, got %s and %s", artifact, a);
        }
    }
    if (!artifact) {
        usage(stderr);
        return fail("no artifact given%s%s", "", "");
    }
    if (!device || !*device) device = getenv("TUNER_DEVICE");
    /* --verify: the signature checked on the manifest the artifact is read by, in the same reading */
    rc = verify ? tnr_open_verified(artifact, device, verify, &rt) : tnr_open(artifact, device, &rt);
    if (rc != TNR_OK) return fail("%s%s", tnr_open_error(), "");
    nin = tnr_num_inputs(rt);
    nout = tnr_num_outputs(rt);
    {
        int from_source = 0, from_binary = 0;
        tnr_build_stats(rt, &from_source, &from_binary);
        printf("loaded %s on %s (%s): %d programs from cached binaries, %d built from source; %d of %d inputs and "
               "outputs staged in pinned memory\n", artifact, tnr_device_name(rt), tnr_device_fingerprint(rt),
               from_binary, from_source, tnr_pinned_stages(rt), tnr_num_inputs(rt) + tnr_num_outputs(rt));
    }
    /* inputs */
    {
        const char *given[MAX_INPUTS] = {0};
        int k;
        if (nin > MAX_INPUTS) {
            tnr_close(rt);
            return fail("the model takes more than 64 inputs%s%s", "", "");
        }
        for (i = 0; i < ninputs; i++) {
            const char *eq = strchr(inputs[i], '=');
            int which = named(rt, inputs[i], nin, tnr_input_name);
            if (which >= 0) {
                given[which] = eq + 1;
            } else if (nin == 1 && ninputs == 1) {
                given[0] = inputs[i];
            } else {
                tnr_close(rt);
                return fail("--input %s does not say which input it is: give one --input NAME=X.npy per model input%s",
                            inputs[i], "");
            }
        }
        for (k = 0; k < nin; k++) {
            int64_t dims[TNR_MAX_DIMS];
            int nd = tnr_input_shape(rt, k, dims), d;
            size_t n = 1;
            for (d = 0; d < nd; d++) n *= (size_t)dims[d];
            if (given[k]) {
                tnr_npy x;
                char err[2048], want[256], got[256];
                int same;
                /* at most what an array of the input's shape holds, and its header: no larger file is read */
                if (tnr_npy_read(given[k], (size_t)tnr_mul_sat(n, 4) + ((size_t)1 << 20), &x, err) != TNR_OK) {
                    tnr_close(rt);
                    return fail("--input %s%s", err, "");
                }
                same = x.ndim == nd;
                for (d = 0; same && d < nd; d++) same = x.shape[d] == dims[d];
                if (!same) {
                    shape_text(dims, nd, want, sizeof want);
                    shape_text(x.shape, x.ndim, got, sizeof got);
                    snprintf(err, sizeof err, "--input %s has shape %s; input '%s' of the model is %s", given[k], got,
                             tnr_input_name(rt, k), want);
                    tnr_npy_free(&x);
                    tnr_close(rt);
                    return fail("%s%s", err, "");
                }
                rc = tnr_set_input(rt, k, x.data, x.count);
                tnr_npy_free(&x);
            } else {
                float *x = malloc(n * sizeof *x);
                if (!x) {
                    tnr_close(rt);
                    return fail("out of memory%s%s", "", "");
                }
                fill(x, n, (unsigned)k);
                rc = tnr_set_input(rt, k, x, n);
                free(x);
            }
            if (rc) {
                fail("%s%s", tnr_last_error(rt), "");
                tnr_close(rt);
                return 2;
            }
        }
    }
    if ((rc = tnr_run(rt)) != TNR_OK) goto runtime_error;
    if (noutputs || outputs_dir) {
        /* each output in the model's own shape: --output Y.npy (the first), --output NAME=Y.npy, --outputs DIR */
        static char paths[MAX_OUTPUTS][4096];
        const char *where[MAX_OUTPUTS] = {0};
        int k;
        if (nout > MAX_OUTPUTS) {
            tnr_close(rt);
            return fail("the model has more than 64 outputs%s%s", "", "");
        }
        for (i = 0; i < noutputs; i++) {
            const char *eq = strchr(outputs[i], '=');
            int which = named(rt, outputs[i], nout, tnr_output_name);
            if (which < 0 && !eq && noutputs == 1 && nout > 0) which = 0;
            if (which < 0) {
                char shown[600];
                tnr_printable(outputs[i], strlen(outputs[i]), 300, shown, sizeof shown);
                tnr_close(rt);
                return fail(eq ? "--output %s: the model has no output of that name (a path with '=' in it: give it as "
                                 "NAME=PATH)%s"
                               : "--output %s does not name an output of the model: with several --output give "
                                 "NAME=Y.npy for each (or --outputs DIR for all)%s", shown, "");
            }
            if (where[which]) {
                char shown[600]; /* formatted before the runtime (which owns the name) is closed */
                tnr_printable(tnr_output_name(rt, which), strlen(tnr_output_name(rt, which)), 300, shown, sizeof shown);
                tnr_close(rt);
                return fail("--output names output '%s' twice%s", shown, "");
            }
            where[which] = eq ? eq + 1 : outputs[i];
        }
        if (outputs_dir) {
            struct stat st;
            if (tnr_mkdirs(outputs_dir, 0777) != 0) {
                tnr_close(rt);
                return fail("--outputs %s: cannot create the folder (%s)", outputs_dir, strerror(errno));
            }
            /* the folder itself, never a symbolic link (another user's link would send every output elsewhere);
             * each file is then written relative to the folder opened with O_NOFOLLOW (npy.c) */
            if (lstat(outputs_dir, &st) == 0 && S_ISLNK(st.st_mode)) {
                char target[1024];
                ssize_t t = readlink(outputs_dir, target, sizeof target - 1);
                target[t > 0 ? t : 0] = 0;
                tnr_close(rt);
                return fail("--outputs %s is a symbolic link (to '%s'); give the folder itself", outputs_dir, target);
            }
            if (stat(outputs_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
                tnr_close(rt);
                return fail("--outputs %s is not a folder%s", outputs_dir, "");
            }
            for (k = 0; k < nout; k++)
                if (!where[k]) {
                    int j;
                    if (!output_file(outputs_dir, tnr_output_name(rt, k), paths[k], sizeof paths[k])) {
                        tnr_close(rt);
                        return fail("--outputs %s: the folder's path is too long%s", outputs_dir, "");
                    }
                    for (j = 0; j < nout; j++)
                        if (j != k && where[j] && !strcmp(where[j], paths[k])) {
                            tnr_close(rt);
                            return fail("--outputs: two outputs map to the file %s; save them one by one with --output "
                                        "NAME=Y.npy%s", paths[k], "");
                        }
                    where[k] = paths[k];
                }
        }
        for (k = 0; k < nout; k++) {
            int64_t dims[TNR_MAX_DIMS];
            int nd, d;
            size_t n = 1;
            float *y;
            char err[2048], shape[256];
            if (!where[k]) continue;
            nd = tnr_output_shape(rt, k, dims);
            for (d = 0; d < nd; d++) n *= (size_t)dims[d];
            y = malloc(n * sizeof *y);
            if (!y) {
                tnr_close(rt);
                return fail("out of memory%s%s", "", "");
            }
            if ((rc = tnr_get_output(rt, k, y, n)) != TNR_OK) {
                free(y);
                goto runtime_error;
            }
            if (tnr_npy_write(where[k], y, dims, nd, err) != TNR_OK) {
                free(y);
                tnr_close(rt);
                return fail("--output %s%s", err, "");
            }
            free(y);
            shape_text(dims, nd, shape, sizeof shape);
            if (nout > 1) {
                char shown[600];
                printf("wrote %s %s (output '%s', %d of %d)\n", where[k], shape,
                       tnr_printable(tnr_output_name(rt, k), strlen(tnr_output_name(rt, k)), 300, shown, sizeof shown),
                       k + 1, nout);
            } else {
                printf("wrote %s %s\n", where[k], shape);
            }
        }
    }
    times = malloc((size_t)bench * sizeof *times);
    if (!times) {
        tnr_close(rt);
        return fail("out of memory%s%s", "", "");
    }
    if ((rc = tnr_time(rt, warmup, bench, times)) != TNR_OK) goto runtime_error;
    {
        double lat = median(times, bench), sp = spread(times, bench), warn = spread_warn(); /* times now sorted */
        printf("%s: median latency %.3f ms over %d runs, spread %.1f%% (IQR/median)\n", tnr_device_name(rt), lat * 1e3,
               bench, sp * 100);
        fflush(stdout); /* the warning after the line it is about */
        if (sp > warn)
            fprintf(stderr, "warning: the %d runs vary by %.0f%% (IQR/median, above %.0f%%): the device is busy or its "
                            "clock is changing; stop other work on it (or wait for its clock to settle) and time again\n",
                    bench, sp * 100, warn * 100);
        if (profile) {
            int nn = tnr_num_nodes(rt), k, c;
            double *ns = calloc((size_t)nn + 1, sizeof *ns), total = 0;
            int w0 = 4, w1 = 2, w2 = 7, w3 = 8;
            /* every cell an artifact names, control characters escaped (put_safe) */
            char **cell = calloc((size_t)nn * 5 + 1, sizeof *cell);
            int ok = ns && cell;
            for (k = 0; ok && k < nn; k++) {
                const char *from[5] = {tnr_node_name(rt, k), tnr_node_op(rt, k), tnr_node_storage(rt, k),
                                       tnr_node_template(rt, k), tnr_node_config_source(rt, k)};
                for (c = 0; ok && c < 5; c++) ok = (cell[k * 5 + c] = escaped(from[c])) != NULL;
            }
            if (!ok) {
                for (k = 0; cell && k < nn * 5; k++) free(cell[k]);
                free(cell);
                free(ns);
                free(times);
                tnr_close(rt);
                return fail("out of memory%s%s", "", "");
            }
            if ((rc = tnr_profile(rt, bench, ns)) != TNR_OK) {
                for (k = 0; k < nn * 5; k++) free(cell[k]);
                free(cell);
                free(ns);
                goto runtime_error;
            }
            for (k = 0; k < nn; k++) {
                int l0 = (int)strlen(cell[k * 5]), l1 = (int)strlen(cell[k * 5 + 1]), l2 = (int)strlen(cell[k * 5 + 2]),
                    l3 = (int)strlen(cell[k * 5 + 3]);
                w0 = l0 > w0 ? l0 : w0, w1 = l1 > w1 ? l1 : w1, w2 = l2 > w2 ? l2 : w2, w3 = l3 > w3 ? l3 : w3;
            }
            /* config last: where the config came from, as the artifact records it ("transferred from <workload>") */
            printf("%-*s  %-*s  %-*s  %-*s  %9s  %9s  %s\n", w0, "node", w1, "op", w2, "storage", w3, "template", "ms",
                   "GFLOP/s", "config");
            for (k = 0; k < nn; k++) {
                char gf[32] = "-";
                double fl = tnr_node_flops(rt, k);
                const char *src = cell[k * 5 + 4]; /* "" for a glue kernel */
                if (fl > 0 && ns[k] > 0) snprintf(gf, sizeof gf, "%.3g", fl / ns[k] / 1e9);
                printf("%-*s  %-*s  %-*s  %-*s  %9.3f  %9s%s%s\n", w0, cell[k * 5], w1, cell[k * 5 + 1], w2,
                       cell[k * 5 + 2], w3, cell[k * 5 + 3], ns[k] * 1e3, gf, *src ? "  " : "", src);
                total += ns[k];
            }
            printf("kernels %.3f ms, end to end %.3f ms\n", total * 1e3, lat * 1e3);
            for (k = 0; k < nn * 5; k++) free(cell[k]);
            free(cell);
            free(ns);
        }
    }
    free(times);
    tnr_close(rt);
    return 0;
runtime_error:
    fail("%s%s", tnr_last_error(rt), "");
    free(times);
    tnr_close(rt);
    return 2;
}

int main(int argc, char **argv) { return run_main(argc, argv); }
