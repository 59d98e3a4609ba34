/* monadl._native: optimizer updates of NumPy weights in one pass (built with the compiled engine).

An optimizer's rule written with NumPy is a dozen passes over the weight, each a ufunc call: on a
small weight the calls cost more than the arithmetic, and on a large one (an embedding table) the
passes stream it through the cache a dozen times. Here each rule is one loop over the elements
doing the same IEEE operations in the same order, in the arrays' own precision (float or double,
each scalar rounded to it first, as NumPy rounds a Python float against a float32 array), so the
results equal the NumPy rule's bit for bit. The build compiles this file without floating-point
contraction (no fused multiply-add: NumPy rounds every product) and without errno from sqrt (so the
loops vectorize; the results are the same). The arrays come as buffers (NumPy's buffer protocol),
C-contiguous, the results' arrays made by the caller; the loops run without the GIL.

monadl/dsl/learning/optimizers/native.py chooses when these run and holds the rules they equal. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

/* Adam's rule (monadl.dsl.learning.optimizers.adam.adam_rule), one element:
       m' = b1 * m + (1 - b1) * g          v' = b2 * v + (1 - b2) * (g * g)
       new = data - rate * (m' / c1) / (sqrt(v' / c2) + eps)
   An element without a gradient (a sparse gradient's untouched row) adds +0.0 in place of the
   gradient's terms, as the NumPy rule adds a zero gradient's. */
#define ADAM_LOOP(T, SQRT)                                                                         \
    static void adam_##T(const T *restrict data, const T *restrict g, const T *restrict m,        \
                         const T *restrict v, T *restrict out, T *restrict m_out,                 \
                         T *restrict v_out, Py_ssize_t n, const double *s) {                       \
        const T b1 = (T)s[0], k1 = (T)s[1], b2 = (T)s[2], k2 = (T)s[3], c1 = (T)s[4],            \
                c2 = (T)s[5], rate = (T)s[6], eps = (T)s[7];                                       \
        for (Py_ssize_t i = 0; i < n; i++) {                                                       \
            T mi, vi;                                                                              \
            if (g) {                                                                               \
                T gi = g[i];                                                                       \
                T a = gi * k1;                                                                     \
                mi = m[i] * b1;                                                                    \
                mi = mi + a;                                                                       \
                T sq = gi * gi;                                                                    \
                sq = sq * k2;                                                                      \
                vi = v[i] * b2;                                                                    \
                vi = vi + sq;                                                                      \
            } else {                                                                               \
                mi = m[i] * b1;                                                                    \
                mi = mi + (T)0.0;                                                                  \
                vi = v[i] * b2;                                                                    \
                vi = vi + (T)0.0;                                                                  \
            }                                                                                      \
            T mh = mi / c1;                                                                        \
            T vh = vi / c2;                                                                        \
            vh = SQRT(vh);                                                                         \
            vh = vh + eps;                                                                         \
            mh = mh * rate;                                                                        \
            mh = mh / vh;                                                                          \
            out[i] = data[i] - mh;                                                                 \
            m_out[i] = mi;                                                                         \
            v_out[i] = vi;                                                                         \
        }                                                                                          \
    }

ADAM_LOOP(float, sqrtf)
ADAM_LOOP(double, sqrt)

/* Adam's rule on len elements from byte offset off of the data, moments and outputs (p: their
   buffers, as adam's arguments), g the gradient's elements for them or NULL (none). */
static void adam_span(char kind, char *const p[7], const char *g, Py_ssize_t off, Py_ssize_t len,
                      const double *s) {
    if (kind == 'f') {
        adam_float((const float *)(p[0] + off), (const float *)g, (const float *)(p[2] + off),
                   (const float *)(p[3] + off), (float *)(p[4] + off), (float *)(p[5] + off),
                   (float *)(p[6] + off), len, s);
    } else {
        adam_double((const double *)(p[0] + off), (const double *)g, (const double *)(p[2] + off),
                    (const double *)(p[3] + off), (double *)(p[4] + off), (double *)(p[5] + off),
                    (double *)(p[6] + off), len, s);
    }
}

/* The buffers of one call, released together. */
typedef struct {
    Py_buffer views[9];
    int held;
} Buffers;

static void release(Buffers *b) {
    for (int i = 0; i < b->held; i++) PyBuffer_Release(&b->views[i]);
    b->held = 0;
}

static Py_buffer *take(Buffers *b, PyObject *obj, int writable, const char *name) {
    Py_buffer *view = &b->views[b->held];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Format(PyExc_TypeError, "monadl._native: %s must be a C-contiguous%s array", name,
                     writable ? " writable" : "");
        return NULL;
    }
    b->held++;
    return view;
}

/* A buffer's one-letter type code in the machine's own byte order ('f', 'd', 'q', ...), else 0. */
static char type_code(const Py_buffer *view) {
    const char *f = view->format;
    if (f == NULL) return 0;
#if PY_LITTLE_ENDIAN
    if (f[0] == '=' || f[0] == '@' || f[0] == '<') f++;
#else
    if (f[0] == '=' || f[0] == '@' || f[0] == '>' || f[0] == '!') f++;
#endif
    return f[0] != '\0' && f[1] == '\0' ? f[0] : 0;
}

/* 'f' or 'd' (a float32 or float64 buffer in the machine's byte order), else 0. */
static char float_kind(const Py_buffer *view) {
    char code = type_code(view);
    if ((code == 'f' && view->itemsize == 4) || (code == 'd' && view->itemsize == 8)) return code;
    return 0;
}

PyDoc_STRVAR(adam_doc,
    "adam(data, g, m, v, out, m_out, v_out, scalars, rows=None, width=0)\n--\n\n"
    "Adam's rule into out, m_out and v_out (buffers of data's size and float type): scalars are\n"
    "(b1, 1 - b1, b2, 1 - b2, 1 - b1 ** t, 1 - b2 ** t, rate, epsilon). With rows (int64, sorted\n"
    "and distinct row indices of data seen as rows of width elements), g holds those rows only and\n"
    "every other row has no gradient.");

static PyObject *adam(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs) {
    static char *names[] = {"data", "g", "m", "v", "out", "m_out", "v_out", "scalars", "rows", "width", NULL};
    PyObject *objs[7], *scalars, *rows_obj = Py_None;
    Py_ssize_t width = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOO|On", names, &objs[0], &objs[1], &objs[2],
                                     &objs[3], &objs[4], &objs[5], &objs[6], &scalars, &rows_obj, &width)) {
        return NULL;
    }
    double s[8];
    PyObject *seq = PySequence_Fast(scalars, "monadl._native.adam: scalars must be a sequence");
    if (seq == NULL) return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != 8) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "monadl._native.adam: expected 8 scalars");
        return NULL;
    }
    for (int i = 0; i < 8; i++) {
        s[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (s[i] == -1.0 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);

    static const char *labels[] = {"data", "g", "m", "v", "out", "m_out", "v_out"};
    Buffers b = {.held = 0};
    Py_buffer *view[7];
    for (int i = 0; i < 7; i++) {
        view[i] = take(&b, objs[i], i >= 4, labels[i]);
        if (view[i] == NULL) goto fail;
    }
    char kind = float_kind(view[0]);
    Py_ssize_t bytes = view[0]->len;
    for (int i = 0; i < 7; i++) {
        if (float_kind(view[i]) != kind || kind == 0) {
            PyErr_SetString(PyExc_TypeError, "monadl._native.adam: expected float32 or float64 arrays of one dtype");
            goto fail;
        }
        if (i != 1 && view[i]->len != bytes) {
            PyErr_SetString(PyExc_ValueError, "monadl._native.adam: the arrays differ in size");
            goto fail;
        }
    }
    Py_ssize_t n = bytes / view[0]->itemsize;
    const int64_t *rows = NULL;
    Py_ssize_t k = 0;
    if (rows_obj == Py_None) {
        if (view[1]->len != bytes) {
            PyErr_SetString(PyExc_ValueError, "monadl._native.adam: the gradient differs in size");
            goto fail;
        }
    } else {
        Py_buffer *r = take(&b, rows_obj, 0, "rows");
        if (r == NULL) goto fail;
        char code = type_code(r);
        if (r->itemsize != 8 || (code != 'l' && code != 'q')) {
            PyErr_SetString(PyExc_TypeError, "monadl._native.adam: rows must be int64");
            goto fail;
        }
        rows = (const int64_t *)r->buf;
        k = r->len / 8;
        if (width <= 0 || n % width != 0 || view[1]->len != k * width * view[0]->itemsize) {
            PyErr_SetString(PyExc_ValueError, "monadl._native.adam: rows, width and g do not fit data");
            goto fail;
        }
        Py_ssize_t count = n / width;
        for (Py_ssize_t j = 0; j < k; j++) {
            if (rows[j] < 0 || rows[j] >= count || (j && rows[j] <= rows[j - 1])) {
                PyErr_SetString(PyExc_ValueError, "monadl._native.adam: rows must be sorted, distinct and in range");
                goto fail;
            }
        }
    }

    char *p[7];
    for (int i = 0; i < 7; i++) p[i] = (char *)view[i]->buf;
    Py_BEGIN_ALLOW_THREADS
    if (rows == NULL) {
        adam_span(kind, p, p[1], 0, n, s);
    } else {
        /* A run of rows without a gradient, or one row with its gradient's row, at a time. */
        Py_ssize_t size = view[0]->itemsize, start = 0, j = 0, count = n / width;
        while (start < count) {
            Py_ssize_t stop = j < k ? (Py_ssize_t)rows[j] : count;
            const char *g = NULL;
            if (stop == start) {
                g = p[1] + j * width * size;
                stop = start + 1;
                j++;
            }
            adam_span(kind, p, g, start * width * size, (stop - start) * width, s);
            start = stop;
        }
    }
    Py_END_ALLOW_THREADS
    release(&b);
    Py_RETURN_NONE;
fail:
    release(&b);
    return NULL;
}

static PyMethodDef methods[] = {
    {"adam", (PyCFunction)(void (*)(void))adam, METH_VARARGS | METH_KEYWORDS, adam_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "monadl._native",
    "Optimizer updates of NumPy weights in one pass, bit for bit the NumPy rules'.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
