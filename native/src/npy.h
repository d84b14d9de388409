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

/* Returns TNR_OK or an error code with a message naming the file in err[TNR_ERRLEN]. The file is read once: a
 * regular file (non-blocking, checked on its descriptor) of at most max_bytes (0: 16 GiB), its header a dictionary
 * of 'descr', 'fortran_order' and 'shape', each once (a key given twice is refused: numpy reads the last). */
int tnr_npy_read(const char *path, size_t max_bytes, tnr_npy *out, char *err);
/* Writes as tuner run writes (tuner/files.py write_file), relative to path's folder opened with O_NOFOLLOW (a folder
 * that is a symbolic link is refused): a symbolic link is refused; a device or FIFO of this user or root is written
 * through (opened non-blocking: a FIFO no process reads is refused, never waited on); else a new file beside path
 * (O_EXCL, O_NOFOLLOW) is written, fsynced and renamed over it, so a failure or a full disk leaves the old file as it
 * was. */
int tnr_npy_write(const char *path, const float *data, const int64_t *shape, int ndim, char *err);
void tnr_npy_free(tnr_npy *a);

#endif
