/* .npy files (NumPy format 1.0-3.0) of float32 or float16, C order, read as float32; written as float32. */
#ifndef TNR_NPY_H
#define TNR_NPY_H

#include <stddef.h>
#include <stdint.h>

#define TNR_NPY_MAX_DIMS 8

typedef struct {
    int ndim;
    int64_t shape[TNR_NPY_MAX_DIMS];
    size_t count; /* product of shape */
    float *data;  /* malloc'd, count values */
} tnr_npy;

/* Returns TNR_OK or an error code with a message naming the file in err[TNR_ERRLEN]. */
int tnr_npy_read(const char *path, tnr_npy *out, char *err);
int tnr_npy_write(const char *path, const float *data, const int64_t *shape, int ndim, char *err);
void tnr_npy_free(tnr_npy *a);

#endif
