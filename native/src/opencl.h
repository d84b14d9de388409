/* The OpenCL layer shared by the native runtime and the device agent: the library loaded with dlopen into
 * a function table, the few types and constants needed declared here (no SDK headers), and helpers for
 * devices, contexts, programs, memory, kernels and events. Every helper returns 0 or a TNR_E_* code and
 * writes a message (naming the OpenCL call and error) into err[TNR_ERRLEN]. */
#ifndef TNR_OPENCL_H
#define TNR_OPENCL_H

#include <stddef.h>
#include <stdint.h>

/* ---- types (the OpenCL 1.2 ABI) ---- */
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_uint cl_bool;
typedef cl_ulong cl_bitfield;
typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_program *cl_program;
typedef struct _cl_kernel *cl_kernel;
typedef struct _cl_event *cl_event;
typedef cl_bitfield cl_device_type;
typedef cl_uint cl_platform_info;
typedef cl_uint cl_device_info;
typedef cl_bitfield cl_command_queue_properties;
typedef cl_bitfield cl_queue_properties;
typedef intptr_t cl_context_properties;
typedef cl_bitfield cl_mem_flags;
typedef cl_uint cl_mem_object_type;
typedef cl_uint cl_channel_order;
typedef cl_uint cl_channel_type;
typedef cl_uint cl_program_info;
typedef cl_uint cl_program_build_info;
typedef cl_uint cl_kernel_info;
typedef cl_uint cl_kernel_work_group_info;
typedef cl_uint cl_profiling_info;

typedef struct {
    cl_channel_order image_channel_order;
    cl_channel_type image_channel_data_type;
} cl_image_format;

typedef struct {
    cl_mem_object_type image_type;
    size_t image_width, image_height, image_depth, image_array_size, image_row_pitch, image_slice_pitch;
    cl_uint num_mip_levels, num_samples;
    cl_mem buffer;
} cl_image_desc;

/* ---- constants ---- */
#define CL_SUCCESS 0
#define CL_FALSE 0
#define CL_TRUE 1
#define CL_DEVICE_TYPE_DEFAULT (1u << 0)
#define CL_DEVICE_TYPE_CPU (1u << 1)
#define CL_DEVICE_TYPE_GPU (1u << 2)
#define CL_DEVICE_TYPE_ACCELERATOR (1u << 3)
#define CL_DEVICE_TYPE_CUSTOM (1u << 4)
#define CL_DEVICE_TYPE_ALL 0xFFFFFFFFu
#define CL_PLATFORM_VERSION 0x0901
#define CL_PLATFORM_NAME 0x0902
#define CL_PLATFORM_VENDOR 0x0903
#define CL_DEVICE_TYPE 0x1000
#define CL_DEVICE_MAX_COMPUTE_UNITS 0x1002
#define CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS 0x1003
#define CL_DEVICE_MAX_WORK_GROUP_SIZE 0x1004
#define CL_DEVICE_MAX_WORK_ITEM_SIZES 0x1005
#define CL_DEVICE_MAX_MEM_ALLOC_SIZE 0x1010
#define CL_DEVICE_IMAGE2D_MAX_WIDTH 0x1011
#define CL_DEVICE_IMAGE2D_MAX_HEIGHT 0x1012
#define CL_DEVICE_IMAGE_SUPPORT 0x1016
#define CL_DEVICE_GLOBAL_MEM_SIZE 0x101F
#define CL_DEVICE_LOCAL_MEM_SIZE 0x1023
#define CL_DEVICE_NAME 0x102B
#define CL_DEVICE_VENDOR 0x102C
#define CL_DRIVER_VERSION 0x102D
#define CL_DEVICE_VERSION 0x102F
#define CL_DEVICE_EXTENSIONS 0x1030
#define CL_DEVICE_PLATFORM 0x1031
#define CL_CONTEXT_PLATFORM 0x1084
#define CL_QUEUE_PROPERTIES 0x1093
#define CL_QUEUE_PROFILING_ENABLE (1u << 1)
#define CL_MEM_READ_WRITE (1u << 0)
#define CL_MEM_WRITE_ONLY (1u << 1)
#define CL_MEM_READ_ONLY (1u << 2)
#define CL_MEM_ALLOC_HOST_PTR (1u << 4)
#define CL_MEM_COPY_HOST_PTR (1u << 5)
#define CL_MAP_READ (1u << 0)
#define CL_MAP_WRITE (1u << 1)
#define CL_RGBA 0x10B5
#define CL_HALF_FLOAT 0x10DD
#define CL_FLOAT 0x10DE
#define CL_MEM_OBJECT_BUFFER 0x10F0
#define CL_MEM_OBJECT_IMAGE2D 0x10F1
#define CL_PROGRAM_NUM_DEVICES 0x1162
#define CL_PROGRAM_BINARY_SIZES 0x1165
#define CL_PROGRAM_BINARIES 0x1166
#define CL_PROGRAM_BUILD_STATUS 0x1181
#define CL_PROGRAM_BUILD_LOG 0x1183
#define CL_KERNEL_NUM_ARGS 0x1191
#define CL_KERNEL_WORK_GROUP_SIZE 0x11B0
#define CL_PROFILING_COMMAND_QUEUED 0x1280
#define CL_PROFILING_COMMAND_SUBMIT 0x1281
#define CL_PROFILING_COMMAND_START 0x1282
#define CL_PROFILING_COMMAND_END 0x1283

/* ---- the function table ---- */
typedef void (*tcl_notify_fn)(const char *, const void *, size_t, void *);
typedef void (*tcl_build_fn)(cl_program, void *);

typedef struct tcl_api {
    void *handle;
    char path[512]; /* the library that was loaded */
    cl_int (*GetPlatformIDs)(cl_uint, cl_platform_id *, cl_uint *);
    cl_int (*GetPlatformInfo)(cl_platform_id, cl_platform_info, size_t, void *, size_t *);
    cl_int (*GetDeviceIDs)(cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *);
    cl_int (*GetDeviceInfo)(cl_device_id, cl_device_info, size_t, void *, size_t *);
    cl_context (*CreateContext)(const cl_context_properties *, cl_uint, const cl_device_id *, tcl_notify_fn,
                                void *, cl_int *);
    cl_int (*ReleaseContext)(cl_context);
    cl_command_queue (*CreateCommandQueue)(cl_context, cl_device_id, cl_command_queue_properties, cl_int *);
    cl_command_queue (*CreateCommandQueueWithProperties)(cl_context, cl_device_id, const cl_queue_properties *,
                                                         cl_int *); /* optional (2.0) */
    cl_int (*ReleaseCommandQueue)(cl_command_queue);
    cl_int (*Flush)(cl_command_queue);
    cl_int (*Finish)(cl_command_queue);
    cl_mem (*CreateBuffer)(cl_context, cl_mem_flags, size_t, void *, cl_int *);
    cl_mem (*CreateImage)(cl_context, cl_mem_flags, const cl_image_format *, const cl_image_desc *, void *,
                          cl_int *); /* optional (1.2) */
    cl_mem (*CreateImage2D)(cl_context, cl_mem_flags, const cl_image_format *, size_t, size_t, size_t, void *,
                            cl_int *); /* optional (deprecated) */
    cl_int (*GetSupportedImageFormats)(cl_context, cl_mem_flags, cl_mem_object_type, cl_uint, cl_image_format *,
                                       cl_uint *);
    cl_int (*ReleaseMemObject)(cl_mem);
    cl_int (*EnqueueWriteBuffer)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint,
                                 const cl_event *, cl_event *);
    cl_int (*EnqueueReadBuffer)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint,
                                const cl_event *, cl_event *);
    cl_int (*EnqueueWriteImage)(cl_command_queue, cl_mem, cl_bool, const size_t *, const size_t *, size_t, size_t,
                                const void *, cl_uint, const cl_event *, cl_event *);
    cl_int (*EnqueueReadImage)(cl_command_queue, cl_mem, cl_bool, const size_t *, const size_t *, size_t, size_t,
                               void *, cl_uint, const cl_event *, cl_event *);
    cl_program (*CreateProgramWithSource)(cl_context, cl_uint, const char **, const size_t *, cl_int *);
    cl_program (*CreateProgramWithBinary)(cl_context, cl_uint, const cl_device_id *, const size_t *,
                                          const unsigned char **, cl_int *, cl_int *);
    cl_int (*BuildProgram)(cl_program, cl_uint, const cl_device_id *, const char *, tcl_build_fn, void *);
    cl_int (*GetProgramInfo)(cl_program, cl_program_info, size_t, void *, size_t *);
    cl_int (*GetProgramBuildInfo)(cl_program, cl_device_id, cl_program_build_info, size_t, void *, size_t *);
    cl_int (*ReleaseProgram)(cl_program);
    cl_kernel (*CreateKernel)(cl_program, const char *, cl_int *);
    cl_int (*SetKernelArg)(cl_kernel, cl_uint, size_t, const void *);
    cl_int (*GetKernelInfo)(cl_kernel, cl_kernel_info, size_t, void *, size_t *);
    cl_int (*GetKernelWorkGroupInfo)(cl_kernel, cl_device_id, cl_kernel_work_group_info, size_t, void *,
                                     size_t *);
    cl_int (*ReleaseKernel)(cl_kernel);
    cl_int (*EnqueueNDRangeKernel)(cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *,
                                   const size_t *, cl_uint, const cl_event *, cl_event *);
    cl_int (*WaitForEvents)(cl_uint, const cl_event *);
    cl_int (*GetEventProfilingInfo)(cl_event, cl_profiling_info, size_t, void *, size_t *);
    cl_int (*ReleaseEvent)(cl_event);
    void *(*EnqueueMapBuffer)(cl_command_queue, cl_mem, cl_bool, cl_bitfield, size_t, size_t, cl_uint,
                              const cl_event *, cl_event *, cl_int *); /* optional: pinned staging */
    cl_int (*EnqueueUnmapMemObject)(cl_command_queue, cl_mem, void *, cl_uint, const cl_event *, cl_event *);
} tcl_api;

/* The library search list, in order: $TUNER_OPENCL_LIB, libOpenCL.so.1, libOpenCL.so, then Android's vendor
 * paths. Loads the first that defines clGetPlatformIDs and every required entry point; else err lists every
 * path tried with dlopen's reason, then how to set TUNER_OPENCL_LIB (`tuner native env`). */
extern const char *const tcl_default_paths[];
int tcl_load(tcl_api *api, char *err);
void tcl_unload(tcl_api *api);
/* "CL_INVALID_VALUE" etc. */
const char *tcl_error_name(cl_int code);

/* ---- devices ---- */
typedef struct tcl_device {
    int index; /* position over all platforms, then devices (the order `tuner devices` lists) */
    cl_platform_id platform;
    cl_device_id id;
    char platform_name[256], name[256], driver_version[256], opencl_version[256], type[16];
    char fingerprint[128]; /* the Python side's DeviceInfo.fingerprint: <tag>-<type>-<sha1[:8]> */
    char platform_tag[64];
    int image_support, fp16;
    uint64_t image2d_max_width, image2d_max_height, max_work_group_size, max_work_item_sizes[3];
    uint64_t local_mem_bytes, global_mem_bytes, max_mem_alloc_bytes, compute_units;
    char extensions[8192]; /* CL_DEVICE_EXTENSIONS, stripped (cut at 8 KiB) */
} tcl_device;

/* Every device of every platform (a platform without devices is skipped). *out is malloc'd. */
int tcl_list_devices(const tcl_api *api, tcl_device **out, int *n, char *err);
int tcl_is_simulator(const tcl_device *d);
/* Whether RGBA / HALF_FLOAT image2d is supported for reading and for writing (the Python side's
 * DeviceInfo.half_images): 0 without image support; opens a context for the question. */
int tcl_half_images(const tcl_api *api, const tcl_device *d);
/* Case-insensitive substring match against platform, name, type, tag and fingerprint. */
int tcl_device_matches(const tcl_device *d, const char *text);

/* ---- context, queues ---- */
int tcl_context(const tcl_api *api, const tcl_device *d, cl_context *ctx, char *err);
int tcl_queue(const tcl_api *api, cl_context ctx, const tcl_device *d, int profiling, cl_command_queue *q,
              char *err);

/* ---- programs ---- */
/* Builds from source; on a build failure the message holds the build log (cut to fit). */
int tcl_build_source(const tcl_api *api, cl_context ctx, const tcl_device *d, const char *src, size_t len,
                     const char *options, cl_program *prog, char *err);
/* Builds from a binary; TNR_E_BUILD when the driver refuses it. */
int tcl_build_binary(const tcl_api *api, cl_context ctx, const tcl_device *d, const unsigned char *bin, size_t len,
                     const char *options, cl_program *prog, char *err);
/* The program's build log for d (cut to len - 1 bytes). */
void tcl_build_log(const tcl_api *api, cl_program prog, const tcl_device *d, char *out, size_t len);
/* The program's binary for its one device (*bin malloc'd; *len 0 when the driver gives none). */
int tcl_program_binary(const tcl_api *api, cl_program prog, unsigned char **bin, size_t *len, char *err);

/* ---- memory ---- */
int tcl_buffer(const tcl_api *api, cl_context ctx, size_t bytes, cl_mem *mem, char *err);
/* An RGBA image2d of w x h pixels, channel type CL_FLOAT (half = 0) or CL_HALF_FLOAT (half = 1). */
/* Host memory for staging copies that the driver moves at the bus's speed: a CL_MEM_ALLOC_HOST_PTR buffer (pinned
 * where the driver pins it), mapped once for reading and writing and kept mapped. *ptr is NULL (and TNR_OK is
 * returned) where the driver offers none; the caller then stages in ordinary memory. Free with tcl_pinned_free. */
int tcl_pinned(const tcl_api *api, cl_context ctx, cl_command_queue q, size_t bytes, cl_mem *mem, void **ptr);
void tcl_pinned_free(const tcl_api *api, cl_command_queue q, cl_mem mem, void *ptr);
int tcl_image(const tcl_api *api, cl_context ctx, size_t w, size_t h, int half, cl_mem *mem, char *err);
int tcl_write_buffer(const tcl_api *api, cl_command_queue q, cl_mem mem, int blocking, size_t offset, size_t bytes,
                     const void *src, char *err);
int tcl_read_buffer(const tcl_api *api, cl_command_queue q, cl_mem mem, int blocking, size_t offset, size_t bytes,
                    void *dst, char *err);
/* Rows of w RGBA pixels, packed (row pitch w * 4 * itemsize), top row first. */
int tcl_write_image(const tcl_api *api, cl_command_queue q, cl_mem mem, int blocking, size_t w, size_t h,
                    const void *src, char *err);
int tcl_read_image(const tcl_api *api, cl_command_queue q, cl_mem mem, int blocking, size_t w, size_t h, void *dst,
                   char *err);

/* ---- kernels and events ---- */
int tcl_kernel(const tcl_api *api, cl_program prog, const char *name, cl_kernel *k, char *err);
int tcl_kernel_num_args(const tcl_api *api, cl_kernel k, cl_uint *n, char *err);
int tcl_set_mem_arg(const tcl_api *api, cl_kernel k, cl_uint i, cl_mem mem, char *err);
/* ev: NULL for no event. */
int tcl_enqueue(const tcl_api *api, cl_command_queue q, cl_kernel k, const size_t global[3], const size_t local[3],
                cl_event *ev, char *err);
int tcl_finish(const tcl_api *api, cl_command_queue q, char *err);
/* Seconds between the event's START and END. */
int tcl_event_seconds(const tcl_api *api, cl_event ev, double *seconds, char *err);

#endif
