/* A minimal JNI binding of the native runtime (native/include/tuner_runtime.h) for an Android app: the Java
 * class com.example.tuner.TunedModel (docs/android-app.md) opens an artifact directory, runs it on float
 * arrays and closes it. Build it with the app's CMake next to the prebuilt libtuner_runtime.so
 * (`tuner native build --target android-arm64 --ndk DIR`). The tests compile and link it on the host against a
 * JDK's jni.h and the host's libtuner_runtime.so (tests/test_native_runtime.py::test_jni_example_builds). */
#include <jni.h>
#include <stdint.h>
#include <stdlib.h>

#include "tuner_runtime.h"

static void throw_error(JNIEnv *env, const char *msg) {
    jclass cls = (*env)->FindClass(env, "java/lang/IllegalStateException");
    if (cls) (*env)->ThrowNew(env, cls, msg);
}

/* long open(String artifactDir, String device): a handle, or throws with the runtime's message. */
JNIEXPORT jlong JNICALL Java_com_example_tuner_TunedModel_open(JNIEnv *env, jclass cls, jstring dir, jstring device) {
    const char *d = (*env)->GetStringUTFChars(env, dir, NULL);
    const char *dev = device ? (*env)->GetStringUTFChars(env, device, NULL) : NULL;
    tnr_runtime *rt = NULL;
    int rc = tnr_open(d, dev, &rt);
    (void)cls;
    (*env)->ReleaseStringUTFChars(env, dir, d);
    if (dev) (*env)->ReleaseStringUTFChars(env, device, dev);
    if (rc != TNR_OK) {
        throw_error(env, tnr_open_error());
        return 0;
    }
    return (jlong)(intptr_t)rt;
}

/* float[] run(long handle, float[] input, int outputSize): input 0 in, output 0 out (NCHW, float32). */
JNIEXPORT jfloatArray JNICALL Java_com_example_tuner_TunedModel_run(JNIEnv *env, jclass cls, jlong handle,
                                                                   jfloatArray input, jint output_size) {
    tnr_runtime *rt = (tnr_runtime *)(intptr_t)handle;
    jfloatArray out = NULL;
    jfloat *x, *y;
    int rc;
    (void)cls;
    if (!rt || output_size <= 0) {
        throw_error(env, "run: no model open, or a non-positive output size");
        return NULL;
    }
    x = (*env)->GetFloatArrayElements(env, input, NULL);
    rc = tnr_set_input(rt, 0, x, (size_t)(*env)->GetArrayLength(env, input));
    (*env)->ReleaseFloatArrayElements(env, input, x, JNI_ABORT); /* read only: nothing to copy back */
    if (rc == TNR_OK) rc = tnr_run(rt);
    if (rc == TNR_OK) {
        y = malloc((size_t)output_size * sizeof *y);
        rc = y ? tnr_get_output(rt, 0, y, (size_t)output_size) : TNR_E_NOMEM;
        if (rc == TNR_OK && (out = (*env)->NewFloatArray(env, output_size)) != NULL)
            (*env)->SetFloatArrayRegion(env, out, 0, output_size, y);
        free(y);
    }
    if (rc != TNR_OK) throw_error(env, rc == TNR_E_NOMEM ? "out of memory" : tnr_last_error(rt));
    return out;
}

JNIEXPORT void JNICALL Java_com_example_tuner_TunedModel_close(JNIEnv *env, jclass cls, jlong handle) {
    (void)env, (void)cls;
    tnr_close((tnr_runtime *)(intptr_t)handle);
}
