/* What a kernel addresses, read from its OpenCL C source (docs/artifact.md, check 11): per buffer parameter
 * the element range its code reads and writes, per image the pixels it writes (or reads without a clamping
 * sampler), for one launch. Interval arithmetic over the C that tuner/codegen/opencl.py generates; the same
 * analysis as tuner/artifact/bounds.py, rule for rule (tests/test_hostile_round3.py compares the two). */
#ifndef TNR_BOUNDS_H
#define TNR_BOUNDS_H

#include <stddef.h>
#include <stdint.h>

typedef struct tnr_bsrc tnr_bsrc;

typedef struct {
    const char *name;
    int image;        /* image2d_t, else a buffer */
    int write;        /* buffer: not const; image: __write_only (or __read_write) */
    const char *type; /* buffer element type ("float", "half", ...); NULL for images */
    int elem_bytes;
} tnr_bparam;

typedef struct {
    int has_range; /* a buffer addressed: elements lo..hi */
    int64_t lo, hi;
    int has_pixels; /* an image written (or read unclamped): pixels x xlo..xhi, y ylo..yhi */
    int64_t xlo, xhi, ylo, yhi;
    /* an upper bound on the distinct elements (pixels of an image) the launch writes through the parameter: each
     * store, at most the work-items that can reach it times the runs of the loops around it times what it stores,
     * and at most the span it addresses; 0: none; -1: no bound (past TNR_BOUNDS_BIG) */
    int64_t writes;
} tnr_brange;

#define TNR_BOUNDS_BIG ((int64_t)1 << 61) /* the analysis's integers give up past this */

/* Parses text[len]. TNR_OK, or TNR_E_ARTIFACT with *line (0: none) and what[whatlen] saying what was met;
 * TNR_E_NOMEM. */
int tnr_bounds_parse(const char *text, size_t len, tnr_bsrc **out, int *line, char *what, size_t whatlen);
void tnr_bounds_free(tnr_bsrc *s);
/* The kernel `name` of a parsed source: its parameters and reqd_work_group_size (has_reqd 0: none). 0 when the
 * source defines no such kernel. */
int tnr_bounds_kernel(const tnr_bsrc *s, const char *name, int *nparams, const tnr_bparam **params, int *has_reqd,
                      int64_t reqd[3]);
/* Analyses kernel `name` for one launch (global[k] a multiple of local[k] >= 1): out[nparams]. TNR_OK, or
 * TNR_E_ARTIFACT with *line and what (the analysis cannot bound an access), or TNR_E_NOMEM. */
int tnr_bounds_analyse(tnr_bsrc *s, const char *name, const int64_t global[3], const int64_t local[3],
                       tnr_brange *out, int *line, char *what, size_t whatlen);

#endif
