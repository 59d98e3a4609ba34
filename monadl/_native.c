/* monadl._native: optimizer updates of NumPy weights (Adam's, SGD's) and the recurrent cells'
rules, in one pass (built with the compiled engine).

An optimizer's rule written with NumPy is a dozen passes over the weight, each a ufunc call: on a
small weight the calls cost more than the arithmetic, and on a large one (an embedding table) the
passes stream it through the cache a dozen times. A recurrent cell's vjps are a dozen ufunc calls on
the few rows of a step too. Here each rule is one loop over the elements doing the same IEEE
operations in the same order, in the arrays' own precision (float or double, each scalar rounded to
it first, as NumPy rounds a Python float against a float32 array), so the results equal the NumPy
rule's bit for bit. The build compiles this file without floating-point contraction (no fused
multiply-add: NumPy rounds every product) and without errno from sqrt (so the loops vectorize; the
results are the same). The optimizers' arrays come as buffers (NumPy's buffer protocol),
C-contiguous, the results' arrays made by the caller, and their loops run without the GIL. A cell's
rule is one call on a step's few rows (not worth releasing the GIL): it reads its arrays from
NumPy's array struct (its C API, NumPy a build requirement), makes its results' arrays and runs
NumPy's own exp and tanh loops, where a buffer, or NumPy's attributes and ufuncs called from Python,
cost more than the arithmetic; the optimizers ask here which arrays the kernels take (takes). For
the same reason the backward pass asks here whether a delta is an array of its own that it may add
into (writable_own), adds a call's delta into its row of a stacked delta (add_row) and a gathered
delta's rows back into their groups (add_rows_at), starts such a delta (minus_zeros_like), marks and
asks which rows got one (set_flag, any_set); the forward pass gathers a merged call's rows from a
few groups (put_rows, its index vectors made by index_array); a training step asks whether a
weight's new value is finite (finite) and makes it read-only (freeze), for every weight; recording
an op finds the frame of the user's code that made it (user_site), for every op; and a cross-entropy
of integer labels takes each row's log-probability of its label and the softmax's gradient in one
call (label_softmax), where its NumPy rule indexes the rows a dozen times.

monadl/dsl/learning/optimizers/native.py chooses when the optimizers' run and holds the rules they
equal; monadl/dsl/ops/recurrent.py the cells'; monadl/dsl/ops/classification.py the
cross-entropy's. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/ufuncobject.h>

/* The element loops are built three times where the toolchain can pick between builds when the
   module loads (GCC's target_clones, an ifunc: x86-64 Linux with glibc): for AVX-512 (16 floats a
   vector operation), for AVX2 (8) and for the baseline x86-64 (SSE2, 4), the one the CPU runs
   chosen once. All do the same IEEE operations in the same order on each element (no contraction:
   the build's -ffp-contract=off, so neither brings a fused multiply-add), so they give the same
   bits; elsewhere the loops are built once, for the baseline. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
#define WIDE __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define WIDE
#endif

/* Adam's rule (monadl.dsl.learning.optimizers.adam.adam_rule), one element:
       m' = b1 * m + (1 - b1) * g          v' = b2 * v + (1 - b2) * (g * g)
       new = data - rate * (m' / c1) / (sqrt(v' / c2) + eps)
   An element without a gradient (a sparse gradient's untouched row) adds +0.0 in place of the
   gradient's terms, as the NumPy rule adds a zero gradient's. */
#define ADAM_LOOP(T, SQRT)                                                                         \
    static WIDE void adam_##T(const T *restrict data, const T *restrict g, const T *restrict m,    \
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
#define MAX_BUFFERS 9
typedef struct {
    Py_buffer views[MAX_BUFFERS];
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

/* 1 where a float (a double) is not finite, an infinity or a NaN: its exponent all ones, its bits
   read as an integer of its width (memcpy: no aliasing of types) with no branch, so that a loop
   or-ing it over its elements, with no early exit, vectorizes (finite, and SGD's rule). */
static inline uint32_t not_finite_float(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (bits & 0x7f800000u) == 0x7f800000u;
}

static inline uint64_t not_finite_double(double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}

/* SGD's rule (monadl.dsl.learning.optimizers.sgd.SGD.update: data - rate * g), one element; out may
   be g itself (an update written into the step's own gradient), so neither g nor out is restrict.
   It says whether every element it writes is finite: a training step checks each new value, and
   the bits read as they are written save it a pass over the weight. */
#define SGD_RULE(T, U)                                                                             \
    static WIDE int sgd_##T(const T *restrict data, const T *g, T *out, Py_ssize_t n, T rate) {    \
        U bad = 0;                                                                                 \
        for (Py_ssize_t k = 0; k < n; k++) {                                                       \
            T v = data[k] - rate * g[k];                                                           \
            out[k] = v;                                                                            \
            bad |= not_finite_##T(v);                                                              \
        }                                                                                          \
        return bad == 0;                                                                           \
    }

SGD_RULE(float, uint32_t)
SGD_RULE(double, uint64_t)

PyDoc_STRVAR(sgd_doc,
    "sgd(data, g, out, rate)\n--\n\n"
    "SGD's rule data - rate * g into out (buffers of one size and float type; out may be g), rate\n"
    "rounded to the arrays' type first; returns whether every element written is finite.");

static PyObject *sgd(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[3];
    double rate;
    if (!PyArg_ParseTuple(args, "OOOd", &objs[0], &objs[1], &objs[2], &rate)) return NULL;
    static const char *labels[] = {"data", "g", "out"};
    Buffers b = {.held = 0};
    Py_buffer *view[3];
    for (int i = 0; i < 3; i++) {
        view[i] = take(&b, objs[i], i == 2, labels[i]);
        if (view[i] == NULL) goto fail;
    }
    char kind = float_kind(view[0]);
    for (int i = 0; i < 3; i++) {
        if (float_kind(view[i]) != kind || kind == 0) {
            PyErr_SetString(PyExc_TypeError, "monadl._native.sgd: expected float32 or float64 arrays of one dtype");
            goto fail;
        }
        if (view[i]->len != view[0]->len) {
            PyErr_SetString(PyExc_ValueError, "monadl._native.sgd: the arrays differ in size");
            goto fail;
        }
    }
    Py_ssize_t n = view[0]->len / view[0]->itemsize;
    int finite;
    Py_BEGIN_ALLOW_THREADS
    if (kind == 'f') {
        finite = sgd_float((const float *)view[0]->buf, (const float *)view[1]->buf, (float *)view[2]->buf, n,
                           (float)rate);
    } else {
        finite = sgd_double((const double *)view[0]->buf, (const double *)view[1]->buf, (double *)view[2]->buf, n,
                            rate);
    }
    Py_END_ALLOW_THREADS
    release(&b);
    return PyBool_FromLong(finite);
fail:
    release(&b);
    return NULL;
}

/* The arrays this module's loops read as they are: a NumPy array (not a subclass) of float32 or
   float64 in the machine's byte order, C-contiguous and aligned. Its type (NPY_FLOAT, NPY_DOUBLE), or
   0 for any other value. Read from NumPy's array struct: the engine asks on a step's few rows, where
   a buffer (or NumPy's attributes from Python) costs more than the arithmetic. */
static int plain_floats(PyObject *obj) {
    if (!PyArray_CheckExact(obj)) return 0;
    PyArrayObject *a = (PyArrayObject *)obj;
    int type = PyArray_TYPE(a);
    if ((type != NPY_FLOAT && type != NPY_DOUBLE) || !PyArray_ISNOTSWAPPED(a) ||
        !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a))
        return 0;
    return type;
}

/* Whether the kernels read these arrays as they are (monadl.dsl.fused.native_takes): plain float
   arrays (plain_floats), not 0-d, of one shape and one dtype. The cells' rules ask before every
   kernel. */
static int native_arrays(PyObject *const *arrays, Py_ssize_t n) {
    int type = n < 1 ? 0 : plain_floats(arrays[0]);
    if (!type) return 0;
    PyArrayObject *first = (PyArrayObject *)arrays[0];
    int nd = PyArray_NDIM(first);
    if (nd == 0) return 0;
    npy_intp *shape = PyArray_DIMS(first);
    for (Py_ssize_t k = 0; k < n; k++) {
        if (plain_floats(arrays[k]) != type) return 0;
        PyArrayObject *a = (PyArrayObject *)arrays[k];
        if (PyArray_NDIM(a) != nd || !PyArray_CompareLists(PyArray_DIMS(a), shape, nd)) return 0;
    }
    return 1;
}

PyDoc_STRVAR(takes_doc,
    "takes(*arrays)\n--\n\n"
    "Whether the kernels read arrays as they are: NumPy arrays (not 0-d) of one shape, one float32\n"
    "or float64 dtype in the machine's byte order, C-contiguous and aligned.");

static PyObject *takes(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    return PyBool_FromLong(native_arrays(args, nargs));
}

/* The recurrent cells' rules (monadl.dsl.ops.recurrent), one element, each product and sum rounded
   in the order NumPy's operators take them (left to right): a rule there is a dozen ufunc calls on
   the few rows of a step, here one call.

   A forward (cell_forward) writes the gates' negated pre-activations into one buffer t, takes
   NumPy's own exp of it in place and NumPy's own tanh of the operand that needs one into t's last
   block (the loops np.exp and np.tanh run, found in their ufuncs: numpy_loops), then finishes the
   sigmoids in place, t = 1 / (1 + t) (as monadl.dsl.ops.activations._sigmoid), and writes the
   result: the same operations as the NumPy rule, so the same bits. A gate's exp(-x) may overflow
   to infinity (its sigmoid 0, as the NumPy rule's under its errstate): the floating-point status
   is restored after NumPy's loops, so no flag of theirs reaches a later check. t is saved for the
   vjp. A joint vjp (cell_deltas) writes every operand's delta into an array of its own.

   The forward loops read p = (t, operands..., result); the vjps' p = (d, saved blocks...,
   operands..., deltas...), one delta per operand. */
#define CELL_LOOPS(T)                                                                              \
    static WIDE void negate_##T(T *restrict out, T *const *x, int count, Py_ssize_t n) {           \
        for (int j = 0; j < count; j++)                                                            \
            for (Py_ssize_t k = 0; k < n; k++) out[j * n + k] = -x[j][k];                          \
    }                                                                                              \
    static WIDE void sigmoids_##T(T *restrict t, Py_ssize_t n) {                                   \
        for (Py_ssize_t k = 0; k < n; k++) t[k] = (T)1.0 / ((T)1.0 + t[k]);                         \
    }                                                                                              \
    static WIDE void lstm_c_forward_##T(T *const *p, Py_ssize_t n) {                              \
        const T *restrict t = p[0], *restrict c = p[4];                                            \
        T *restrict out = p[5];                                                                    \
        for (Py_ssize_t k = 0; k < n; k++) out[k] = t[k] * t[2 * n + k] + t[n + k] * c[k];         \
    }                                                                                              \
    static WIDE void tree_lstm_c_forward_##T(T *const *p, Py_ssize_t n) {                         \
        const T *restrict t = p[0], *restrict cl = p[5], *restrict cr = p[6];                      \
        T *restrict out = p[7];                                                                    \
        for (Py_ssize_t k = 0; k < n; k++)                                                         \
            out[k] = t[k] * t[3 * n + k] + t[n + k] * cl[k] + t[2 * n + k] * cr[k];                \
    }                                                                                              \
    static WIDE void lstm_h_forward_##T(T *const *p, Py_ssize_t n) {                              \
        const T *restrict t = p[0];                                                                \
        T *restrict out = p[3];                                                                    \
        for (Py_ssize_t k = 0; k < n; k++) out[k] = t[k] * t[n + k];                               \
    }                                                                                              \
    static WIDE void gru_h_tanh_of_##T(T *const *p, Py_ssize_t n) { /* n_x + sigmoid(r) * n_h */  \
        T *restrict t = p[0];                                                                      \
        const T *restrict nx = p[3], *restrict nh = p[4];                                          \
        for (Py_ssize_t k = 0; k < n; k++) t[2 * n + k] = nx[k] + t[k] * nh[k];                    \
    }                                                                                              \
    static WIDE void gru_h_forward_##T(T *const *p, Py_ssize_t n) {                               \
        const T *restrict t = p[0], *restrict h = p[5];                                            \
        T *restrict out = p[6];                                                                    \
        for (Py_ssize_t k = 0; k < n; k++) out[k] = ((T)1.0 - t[n + k]) * t[2 * n + k] + t[n + k] * h[k]; \
    }                                                                                              \
    static WIDE void lstm_c_deltas_##T(T *const *p, Py_ssize_t n) {                               \
        const T *restrict d = p[0], *restrict si = p[1], *restrict sf = p[2], *restrict tu = p[3], \
                *restrict c = p[7];                                                                \
        T *restrict gi = p[8], *restrict gf = p[9], *restrict gu = p[10], *restrict gc = p[11];    \
        for (Py_ssize_t k = 0; k < n; k++) {                                                       \
            gi[k] = d[k] * tu[k] * si[k] * ((T)1.0 - si[k]);                                       \
            gf[k] = d[k] * c[k] * sf[k] * ((T)1.0 - sf[k]);                                        \
            gu[k] = d[k] * si[k] * ((T)1.0 - tu[k] * tu[k]);                                       \
            gc[k] = d[k] * sf[k];                                                                  \
        }                                                                                          \
    }                                                                                              \
    static WIDE void tree_lstm_c_deltas_##T(T *const *p, Py_ssize_t n) {                          \
        const T *restrict d = p[0], *restrict si = p[1], *restrict sl = p[2], *restrict sr = p[3], \
                *restrict tu = p[4], *restrict cl = p[9], *restrict cr = p[10];                    \
        T *restrict gi = p[11], *restrict gl = p[12], *restrict gr = p[13], *restrict gu = p[14],  \
                    *restrict gcl = p[15], *restrict gcr = p[16];                                  \
        for (Py_ssize_t k = 0; k < n; k++) {                                                       \
            gi[k] = d[k] * tu[k] * si[k] * ((T)1.0 - si[k]);                                       \
            gl[k] = d[k] * cl[k] * sl[k] * ((T)1.0 - sl[k]);                                       \
            gr[k] = d[k] * cr[k] * sr[k] * ((T)1.0 - sr[k]);                                       \
            gu[k] = d[k] * si[k] * ((T)1.0 - tu[k] * tu[k]);                                       \
            gcl[k] = d[k] * sl[k];                                                                 \
            gcr[k] = d[k] * sr[k];                                                                 \
        }                                                                                          \
    }                                                                                              \
    static WIDE void lstm_h_deltas_##T(T *const *p, Py_ssize_t n) {                               \
        const T *restrict d = p[0], *restrict so = p[1], *restrict tc = p[2];                      \
        T *restrict go = p[5], *restrict gc = p[6];                                                \
        for (Py_ssize_t k = 0; k < n; k++) {                                                       \
            go[k] = d[k] * tc[k] * so[k] * ((T)1.0 - so[k]);                                       \
            gc[k] = d[k] * so[k] * ((T)1.0 - tc[k] * tc[k]);                                       \
        }                                                                                          \
    }                                                                                              \
    static WIDE void gru_h_deltas_##T(T *const *p, Py_ssize_t n) {                                \
        const T *restrict d = p[0], *restrict sr = p[1], *restrict sz = p[2], *restrict nn = p[3], \
                *restrict nh = p[7], *restrict h = p[8];                                           \
        T *restrict gr = p[9], *restrict gz = p[10], *restrict gx = p[11], *restrict gnh = p[12],  \
                    *restrict gh = p[13];                                                          \
        for (Py_ssize_t k = 0; k < n; k++) {                                                       \
            T cand = d[k] * ((T)1.0 - sz[k]) * ((T)1.0 - nn[k] * nn[k]);                           \
            gr[k] = cand * nh[k] * sr[k] * ((T)1.0 - sr[k]);                                       \
            gz[k] = d[k] * (h[k] - nn[k]) * sz[k] * ((T)1.0 - sz[k]);                              \
            gx[k] = cand;                                                                          \
            gnh[k] = cand * sr[k];                                                                 \
            gh[k] = d[k] * sz[k];                                                                  \
        }                                                                                          \
    }

CELL_LOOPS(float)
CELL_LOOPS(double)

#define MAX_ARRAYS 18 /* a vjp's: tree_lstm_c's d, 4 saved, 6 operands, 6 deltas */

typedef void (*loop_float)(float *const *, Py_ssize_t);
typedef void (*loop_double)(double *const *, Py_ssize_t);

/* A cell: its operands, how many of the first are gates (a sigmoid each), whose tanh is saved after
   their sigmoids (the forward's t): an operand's, or (tanh_of -1) what its tanh_of loop writes into
   that block from the sigmoids (gru_h's candidate, tanh of a sum); the blocks its forward saves, and
   its loops. */
typedef struct {
    const char *name;
    int operands, gates, tanh_of, saves;
    loop_float forward_float, deltas_float, tanh_of_float;
    loop_double forward_double, deltas_double, tanh_of_double;
} Cell;

#define CELL(NAME, OPERANDS, GATES, TANH_OF, SAVES)                                                 \
    {#NAME, OPERANDS, GATES, TANH_OF, SAVES, NAME##_forward_float, NAME##_deltas_float, NULL,         \
     NAME##_forward_double, NAME##_deltas_double, NULL}

static const Cell CELL_TABLE[] = {
    CELL(lstm_c, 4, 2, 2, 3),
    CELL(tree_lstm_c, 6, 3, 3, 4),
    CELL(lstm_h, 2, 1, 1, 2),
    {"gru_h", 5, 2, -1, 3, gru_h_forward_float, gru_h_deltas_float, gru_h_tanh_of_float, gru_h_forward_double,
     gru_h_deltas_double, gru_h_tanh_of_double},
};

static const Cell *find_cell(PyObject *name, const char *caller) {
    if (PyUnicode_Check(name)) {
        for (size_t k = 0; k < sizeof(CELL_TABLE) / sizeof(CELL_TABLE[0]); k++)
            if (PyUnicode_CompareWithASCIIString(name, CELL_TABLE[k].name) == 0) return &CELL_TABLE[k];
    }
    PyErr_Format(PyExc_TypeError, "monadl._native.%s: no cell named %R", caller, name);
    return NULL;
}

/* NumPy's own inner loops of np.exp and np.tanh for float32 and float64 (index 0 and 1): the loop
   NumPy's type resolution picks, the first of the ufunc's loops whose types are all the float's.
   Taken when the module loads and checked there against the ufunc called from Python on probes of
   every range (numpy_loops_check); where a loop is not found or differs, numpy_loops is 0 and
   cell_forward declines (the caller runs the NumPy rule). */
typedef struct {
    PyUFuncGenericFunction loop;
    void *data;
} Loop;
static Loop exp_loops[2], tanh_loops[2];
static int numpy_loops;

static void run_loop(const Loop *f, char *in, char *out, Py_ssize_t n, Py_ssize_t itemsize) {
    char *args[2] = {in, out};
    npy_intp dims[1] = {n}, steps[2] = {itemsize, itemsize};
    f->loop(args, dims, steps, f->data);
}

static int find_loop(PyObject *ufunc, int type, Loop *found) {
    if (strcmp(Py_TYPE(ufunc)->tp_name, "numpy.ufunc") != 0) return 0;
    PyUFuncObject *u = (PyUFuncObject *)ufunc;
    int args = u->nin + u->nout;
    if (u->nin < 1 || u->nin > 2 || u->nout != 1 || u->functions == NULL || u->types == NULL) return 0;
    for (int k = 0; k < u->ntypes; k++) {
        int all = 1;
        for (int j = 0; j < args; j++) all = all && u->types[args * k + j] == type;
        if (all) {
            found->loop = u->functions[k];
            found->data = u->data == NULL ? NULL : u->data[k];
            return found->loop != NULL;
        }
    }
    return 0;
}

/* Whether the loop gives the ufunc's bits on a probe of type: 67 values (a vector's tail too) from
   lo to 80 (no overflow, so no warning from the ufunc) and signed zeros, tiny values, infinities
   and a NaN (with lo >= 0, no negative ones: a logarithm's probe warns of none). */
static int same_as_ufunc(PyObject *ufunc, const Loop *f, int type, double lo) {
    npy_intp n = 67;
    PyObject *probe = PyArray_EMPTY(1, &n, type, 0), *mine = PyArray_EMPTY(1, &n, type, 0);
    PyObject *theirs = NULL;
    int same = 0;
    if (probe == NULL || mine == NULL) goto done;
    for (npy_intp k = 0; k < n; k++) {
        double x = lo + (80.0 - lo) * (double)k / (double)(n - 1);
        if (k == 3) x = lo < 0.0 ? -0.0 : 0.0;
        if (k == 5) x = 1e-30;
        if (k == 7) x = INFINITY;
        if (k == 9) x = lo < 0.0 ? -INFINITY : 0.5;
        if (k == 11) x = NAN;
        if (type == NPY_FLOAT)
            ((float *)PyArray_DATA((PyArrayObject *)probe))[k] = (float)x;
        else
            ((double *)PyArray_DATA((PyArrayObject *)probe))[k] = x;
    }
    fexcept_t status;
    fegetexceptflag(&status, FE_ALL_EXCEPT);
    run_loop(f, PyArray_DATA((PyArrayObject *)probe), PyArray_DATA((PyArrayObject *)mine), n,
             PyArray_ITEMSIZE((PyArrayObject *)probe));
    fesetexceptflag(&status, FE_ALL_EXCEPT);
    theirs = PyObject_CallOneArg(ufunc, probe);
    if (theirs == NULL || !PyArray_CheckExact(theirs) || PyArray_TYPE((PyArrayObject *)theirs) != type ||
        PyArray_SIZE((PyArrayObject *)theirs) != n || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)theirs))
        goto done;
    same = memcmp(PyArray_DATA((PyArrayObject *)mine), PyArray_DATA((PyArrayObject *)theirs),
                  (size_t)PyArray_NBYTES((PyArrayObject *)mine)) == 0;
done:
    Py_XDECREF(probe);
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    return same;
}

/* NumPy's own loops of np.log1p and np.add (index 0 and 1: float32, float64), for label_softmax:
   found and checked when the module loads (numpy_loops_check), as the cells' exp and tanh; where
   one is not found or differs, label_loops is 0 and label_softmax declines. */
static Loop log1p_loops[2], add_loops[2];
static int label_loops;

/* The sum of a row of n elements as np.add.reduce sums each row of a C-contiguous matrix along
   its last axis: the add loop called as a reduction (its output also its first input, both of
   stride 0), from +0.0. */
static void row_sum(const Loop *add, char *row, char *sum, Py_ssize_t n, Py_ssize_t itemsize) {
    char *args[3] = {sum, row, sum};
    npy_intp dims[1] = {n}, steps[3] = {0, itemsize, 0};
    add->loop(args, dims, steps, add->data);
}

/* Whether row_sum gives np.add.reduce(probe, axis=1)'s bits on probes of type: rows of lengths
   from 1 to 300 (the short, the blocked and the split sums), of values of mixed magnitude. */
static int same_row_sums(PyObject *add, const Loop *f, int type) {
    static const npy_intp lengths[] = {1, 2, 5, 7, 8, 9, 15, 16, 17, 20, 33, 64, 100, 129, 300};
    int same = 1;
    for (size_t j = 0; same && j < sizeof(lengths) / sizeof(lengths[0]); j++) {
        npy_intp dims[2] = {3, lengths[j]}, rows = 3;
        PyObject *probe = PyArray_EMPTY(2, dims, type, 0), *mine = PyArray_ZEROS(1, &rows, type, 0);
        PyObject *theirs = NULL;
        same = 0;
        if (probe != NULL && mine != NULL) {
            Py_ssize_t size = PyArray_ITEMSIZE((PyArrayObject *)probe), n = dims[0] * dims[1];
            char *data = PyArray_DATA((PyArrayObject *)probe);
            for (Py_ssize_t k = 0; k < n; k++) {
                double x = sin(0.7 * (double)k + 0.3) * exp(3.0 * cos(1.3 * (double)k));
                if (type == NPY_FLOAT)
                    ((float *)data)[k] = (float)x;
                else
                    ((double *)data)[k] = x;
            }
            for (npy_intp r = 0; r < rows; r++)
                row_sum(f, data + r * dims[1] * size, (char *)PyArray_DATA((PyArrayObject *)mine) + r * size,
                        dims[1], size);
            theirs = PyObject_CallMethod(add, "reduce", "Oi", probe, 1);
            same = theirs != NULL && PyArray_CheckExact(theirs) && PyArray_TYPE((PyArrayObject *)theirs) == type &&
                   PyArray_SIZE((PyArrayObject *)theirs) == rows &&
                   PyArray_IS_C_CONTIGUOUS((PyArrayObject *)theirs) &&
                   memcmp(PyArray_DATA((PyArrayObject *)mine), PyArray_DATA((PyArrayObject *)theirs),
                          (size_t)(rows * size)) == 0;
        }
        Py_XDECREF(probe);
        Py_XDECREF(mine);
        Py_XDECREF(theirs);
    }
    return same;
}

/* Finds and checks NumPy's loops when the module loads: exp and tanh (numpy_loops: the cells'
   forwards), then log1p and add (label_loops: label_softmax, which takes exp too). */
static void numpy_loops_check(void) {
    static const int types[2] = {NPY_FLOAT, NPY_DOUBLE};
    PyObject *numpy = PyImport_ImportModule("numpy");
    PyObject *exp = numpy == NULL ? NULL : PyObject_GetAttrString(numpy, "exp");
    PyObject *tanh = numpy == NULL ? NULL : PyObject_GetAttrString(numpy, "tanh");
    PyObject *log1p = numpy == NULL ? NULL : PyObject_GetAttrString(numpy, "log1p");
    PyObject *add = numpy == NULL ? NULL : PyObject_GetAttrString(numpy, "add");
    int found = exp != NULL && tanh != NULL;
    for (int k = 0; found && k < 2; k++) {
        found = find_loop(exp, types[k], &exp_loops[k]) && find_loop(tanh, types[k], &tanh_loops[k]) &&
                same_as_ufunc(exp, &exp_loops[k], types[k], -80.0) &&
                same_as_ufunc(tanh, &tanh_loops[k], types[k], -80.0);
    }
    numpy_loops = found;
    found = found && log1p != NULL && add != NULL;
    for (int k = 0; found && k < 2; k++) {
        found = find_loop(log1p, types[k], &log1p_loops[k]) && find_loop(add, types[k], &add_loops[k]) &&
                same_as_ufunc(log1p, &log1p_loops[k], types[k], 0.0) &&
                same_row_sums(add, &add_loops[k], types[k]);
    }
    label_loops = found;
    PyErr_Clear(); /* (whatever went wrong, the NumPy rules run) */
    Py_XDECREF(exp);
    Py_XDECREF(tanh);
    Py_XDECREF(log1p);
    Py_XDECREF(add);
    Py_XDECREF(numpy);
}

/* The shape arrays[0..n) share where native_arrays(arrays, n): their type, else 0. */
static int common_type(PyObject *const *arrays, Py_ssize_t n) {
    return native_arrays(arrays, n) ? PyArray_TYPE((PyArrayObject *)arrays[0]) : 0;
}

/* The blocks of a forward's saved values into p: one array of `saves` blocks shaped as `like`
   (what cell_forward saves), or a tuple of `saves` arrays each shaped as it (the NumPy rule's);
   0 where they are neither, of type. */
static int saved_blocks(PyObject *saved, int saves, PyArrayObject *like, int type, char **p) {
    int nd = PyArray_NDIM(like);
    npy_intp *shape = PyArray_DIMS(like);
    Py_ssize_t bytes = PyArray_NBYTES(like);
    if (PyTuple_CheckExact(saved)) {
        if (PyTuple_GET_SIZE(saved) != saves) return 0;
        for (int j = 0; j < saves; j++) {
            PyObject *a = PyTuple_GET_ITEM(saved, j);
            if (plain_floats(a) != type || PyArray_NDIM((PyArrayObject *)a) != nd ||
                !PyArray_CompareLists(PyArray_DIMS((PyArrayObject *)a), shape, nd))
                return 0;
            p[j] = PyArray_DATA((PyArrayObject *)a);
        }
        return 1;
    }
    if (plain_floats(saved) != type) return 0;
    PyArrayObject *a = (PyArrayObject *)saved;
    if (PyArray_NDIM(a) != nd + 1 || PyArray_DIM(a, 0) != saves || !PyArray_CompareLists(PyArray_DIMS(a) + 1, shape, nd))
        return 0;
    for (int j = 0; j < saves; j++) p[j] = (char *)PyArray_DATA(a) + j * bytes;
    return 1;
}

PyDoc_STRVAR(cell_forward_doc,
    "cell_forward(name, *operands)\n--\n\n"
    "The forward of the cell name (lstm_c, tree_lstm_c, lstm_h, gru_h) as (result, t), t its sigmoids and\n"
    "tanh as blocks of one array (for cell_deltas); None unless takes(*operands) and NumPy's exp and\n"
    "tanh loops were found (numpy_loops).");

static PyObject *cell_forward(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    const Cell *cell = find_cell(nargs < 1 ? Py_None : args[0], "cell_forward");
    if (cell == NULL) return NULL;
    if (nargs - 1 != cell->operands) {
        return PyErr_Format(PyExc_TypeError, "monadl._native.cell_forward: %s takes %d operands, got %zd",
                            cell->name, cell->operands, nargs - 1);
    }
    PyObject *const *operands = args + 1;
    int type = numpy_loops ? common_type(operands, cell->operands) : 0;
    if (!type) Py_RETURN_NONE;
    PyArrayObject *first = (PyArrayObject *)operands[0];
    int nd = PyArray_NDIM(first), blocks = cell->gates + 1;
    if (nd >= NPY_MAXDIMS) Py_RETURN_NONE; /* (t has one dimension more) */
    npy_intp dims[NPY_MAXDIMS];
    dims[0] = blocks;
    for (int k = 0; k < nd; k++) dims[k + 1] = PyArray_DIM(first, k);
    PyObject *t = PyArray_EMPTY(nd + 1, dims, type, 0), *out = PyArray_EMPTY(nd, dims + 1, type, 0);
    if (t == NULL || out == NULL) {
        Py_XDECREF(t);
        Py_XDECREF(out);
        return NULL;
    }
    Py_ssize_t n = PyArray_SIZE(first), size = PyArray_ITEMSIZE(first);
    char *p[MAX_ARRAYS];
    p[0] = PyArray_DATA((PyArrayObject *)t);
    for (int j = 0; j < cell->operands; j++) p[j + 1] = PyArray_DATA((PyArrayObject *)operands[j]);
    p[cell->operands + 1] = PyArray_DATA((PyArrayObject *)out);
    int k = type == NPY_FLOAT ? 0 : 1;
    char *tanh_block = p[0] + cell->gates * n * size;
    fexcept_t status;
    fegetexceptflag(&status, FE_ALL_EXCEPT);
    if (k == 0)
        negate_float((float *)p[0], (float *const *)(p + 1), cell->gates, n);
    else
        negate_double((double *)p[0], (double *const *)(p + 1), cell->gates, n);
    run_loop(&exp_loops[k], p[0], p[0], cell->gates * n, size);
    if (k == 0)
        sigmoids_float((float *)p[0], cell->gates * n);
    else
        sigmoids_double((double *)p[0], cell->gates * n);
    if (cell->tanh_of >= 0) {
        run_loop(&tanh_loops[k], p[cell->tanh_of + 1], tanh_block, n, size);
    } else {
        if (k == 0)
            cell->tanh_of_float((float *const *)p, n);
        else
            cell->tanh_of_double((double *const *)p, n);
        run_loop(&tanh_loops[k], tanh_block, tanh_block, n, size);
    }
    fesetexceptflag(&status, FE_ALL_EXCEPT);
    if (k == 0)
        cell->forward_float((float *const *)p, n);
    else
        cell->forward_double((double *const *)p, n);
    PyObject *result = PyTuple_New(2);
    if (result == NULL) {
        Py_DECREF(t);
        Py_DECREF(out);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, out);
    PyTuple_SET_ITEM(result, 1, t);
    return result;
}

PyDoc_STRVAR(cell_deltas_doc,
    "cell_deltas(name, d, saved, *operands)\n--\n\n"
    "The joint vjp of the cell name (lstm_c, tree_lstm_c, lstm_h, gru_h): every operand's delta, each\n"
    "an array of its own; None unless takes(d, *operands) (d may be strided: it is copied) and saved\n"
    "is what cell_forward saved (or a tuple of such arrays, the NumPy rule's) of their type.");

static PyObject *cell_deltas(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    const Cell *cell = find_cell(nargs < 1 ? Py_None : args[0], "cell_deltas");
    if (cell == NULL) return NULL;
    if (nargs - 3 != cell->operands) {
        return PyErr_Format(PyExc_TypeError, "monadl._native.cell_deltas: %s takes d, saved and %d operands, got %zd arguments",
                            cell->name, cell->operands, nargs - 1);
    }
    PyObject *arrays[MAX_ARRAYS];
    /* A delta sliced from a joined one (concatenate's vjp of a cell's [x; h] on stacked rows) is a
       strided view: its C-ordered copy, the same values. */
    PyObject *copy = NULL, *given = args[1];
    if (PyArray_CheckExact(given) && !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)given)) {
        copy = PyArray_NewCopy((PyArrayObject *)given, NPY_CORDER);
        if (copy == NULL) return NULL;
    }
    arrays[0] = copy == NULL ? given : copy;
    for (int j = 0; j < cell->operands; j++) arrays[j + 1] = args[3 + j];
    int type = common_type(arrays, cell->operands + 1);
    PyArrayObject *d = (PyArrayObject *)arrays[0];
    char *p[MAX_ARRAYS];
    if (!type || !saved_blocks(args[2], cell->saves, d, type, p + 1)) {
        Py_XDECREF(copy);
        Py_RETURN_NONE;
    }
    p[0] = PyArray_DATA(d);
    int first_operand = 1 + cell->saves, first_delta = first_operand + cell->operands;
    for (int j = 0; j < cell->operands; j++) p[first_operand + j] = PyArray_DATA((PyArrayObject *)arrays[j + 1]);
    PyObject *result = PyTuple_New(cell->operands);
    for (int j = 0; result != NULL && j < cell->operands; j++) {
        PyObject *g = PyArray_EMPTY(PyArray_NDIM(d), PyArray_DIMS(d), type, 0);
        if (g == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(result, j, g);
        p[first_delta + j] = PyArray_DATA((PyArrayObject *)g);
    }
    if (result != NULL) {
        Py_ssize_t n = PyArray_SIZE(d);
        if (type == NPY_FLOAT)
            cell->deltas_float((float *const *)p, n);
        else
            cell->deltas_double((double *const *)p, n);
    }
    Py_XDECREF(copy);
    return result;
}

/* Whether n floats (or doubles) are all finite (not_finite_T or-ed over every element). */
#define FINITE_LOOP(T, U)                                                                          \
    static WIDE int finite_##T(const T *restrict a, Py_ssize_t n) {                                \
        U bad = 0;                                                                                 \
        for (Py_ssize_t i = 0; i < n; i++) bad |= not_finite_##T(a[i]);                            \
        return bad == 0;                                                                           \
    }
FINITE_LOOP(float, uint32_t)
FINITE_LOOP(double, uint64_t)

static int finite_of(int type, const void *data, Py_ssize_t n) {
    return type == NPY_FLOAT ? finite_float((const float *)data, n) : finite_double((const double *)data, n);
}

PyDoc_STRVAR(label_softmax_doc,
    "label_softmax(matrix, labels, batch)\n--\n\n"
    "Of logits matrix (rows by classes) and an integer label per row: each row's log-probability of\n"
    "its label, and the softmax less the one-hot over batch, as fresh arrays, bit for bit the NumPy\n"
    "rule of monadl.dsl.ops.classification._picked_labels. None unless matrix is a plain float\n"
    "array (takes) of two dimensions, none empty, labels a C-contiguous NumPy array (not a\n"
    "subclass) of integers in the machine's byte order, one per row and each in range, batch in\n"
    "1..2**24, and NumPy's exp, log1p and add loops were found (label_loops).");

/* The label of row i of a's integers, or -1 where it is negative or does not fit a Py_ssize_t. */
static Py_ssize_t label_at(const char *data, int size, int is_signed, Py_ssize_t i) {
    long long v;
    switch (size) {
    case 1: v = is_signed ? (long long)((const int8_t *)data)[i] : (long long)((const uint8_t *)data)[i]; break;
    case 2: v = is_signed ? (long long)((const int16_t *)data)[i] : (long long)((const uint16_t *)data)[i]; break;
    case 4: v = is_signed ? (long long)((const int32_t *)data)[i] : (long long)((const uint32_t *)data)[i]; break;
    default: {
        uint64_t u = ((const uint64_t *)data)[i];
        if (!is_signed && u > (uint64_t)PY_SSIZE_T_MAX) return -1;
        v = (long long)u;
    }
    }
    return v < 0 || v > PY_SSIZE_T_MAX ? -1 : (Py_ssize_t)v;
}

/* The NumPy rule's steps, row by row where it indexes rows (each row's maximum, first of equals or
   the first NaN, as np.argmax finds it; the label's entry picked): the shifted logits; their exp,
   the maximum's term (1) set to 0 for the sum of the others, s; log1p(s) taken from the label's
   entry; then the softmax, terms / (1 + s) with the maximum's term 1, the label's less 1, over
   batch. The same operations on each element as the rule's, in its order, with NumPy's own loops
   for exp, log1p and the row sums. */
#define LABEL_SOFTMAX(T)                                                                           \
    static void label_softmax_##T(const T *m, const Py_ssize_t *labels, Py_ssize_t *top, T *terms, \
                                  T *picked, T *s, T *log1p_s, Py_ssize_t rows, Py_ssize_t k,      \
                                  Py_ssize_t batch) {                                              \
        const int kind = sizeof(T) == sizeof(float) ? 0 : 1;                                       \
        for (Py_ssize_t i = 0; i < rows; i++) {                                                    \
            const T *x = m + i * k;                                                                \
            Py_ssize_t best = 0;                                                                   \
            T most = x[0];                                                                         \
            for (Py_ssize_t j = 1; j < k && !isnan(most); j++) {                                   \
                if (!(x[j] <= most)) { /* greater, or a NaN: the first NaN is np.argmax's */       \
                    most = x[j];                                                                   \
                    best = j;                                                                      \
                }                                                                                  \
            }                                                                                      \
            top[i] = best;                                                                         \
            T *t = terms + i * k;                                                                  \
            for (Py_ssize_t j = 0; j < k; j++) t[j] = x[j] - most;                                 \
            picked[i] = t[labels[i]];                                                              \
        }                                                                                          \
        run_loop(&exp_loops[kind], (char *)terms, (char *)terms, rows * k, sizeof(T));             \
        for (Py_ssize_t i = 0; i < rows; i++) {                                                    \
            terms[i * k + top[i]] = (T)0.0;                                                        \
            s[i] = (T)0.0;                                                                         \
            row_sum(&add_loops[kind], (char *)(terms + i * k), (char *)(s + i), k, sizeof(T));     \
        }                                                                                          \
        run_loop(&log1p_loops[kind], (char *)s, (char *)log1p_s, rows, sizeof(T));                 \
        const T over = (T)batch;                                                                   \
        for (Py_ssize_t i = 0; i < rows; i++) {                                                    \
            picked[i] = picked[i] - log1p_s[i];                                                    \
            T *t = terms + i * k;                                                                  \
            t[top[i]] = (T)1.0;                                                                    \
            const T total = s[i] + (T)1.0;                                                         \
            for (Py_ssize_t j = 0; j < k; j++) t[j] = t[j] / total;                                \
            t[labels[i]] = t[labels[i]] - (T)1.0;                                                  \
            if (batch != 1)                                                                        \
                for (Py_ssize_t j = 0; j < k; j++) t[j] = t[j] / over;                             \
        }                                                                                          \
    }

LABEL_SOFTMAX(float)
LABEL_SOFTMAX(double)

#define LABEL_SOFTMAX_ALONE 65536 /* elements from which the kernel releases the GIL */

static PyObject *label_softmax(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "monadl._native.label_softmax: expected matrix, labels and batch");
        return NULL;
    }
    Py_ssize_t batch = PyLong_AsSsize_t(args[2]);
    if (batch == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* (too large: the NumPy rule's) */
        Py_RETURN_NONE;
    }
    int type = label_loops ? plain_floats(args[0]) : 0;
    if (!type || batch < 1 || batch > (1 << 24) || !PyArray_CheckExact(args[1])) Py_RETURN_NONE;
    PyArrayObject *matrix = (PyArrayObject *)args[0], *given = (PyArrayObject *)args[1];
    if (PyArray_NDIM(matrix) != 2 || PyArray_NDIM(given) != 1) Py_RETURN_NONE;
    Py_ssize_t rows = PyArray_DIM(matrix, 0), k = PyArray_DIM(matrix, 1);
    int label_type = PyArray_TYPE(given), size = (int)PyArray_ITEMSIZE(given);
    if (rows < 1 || k < 1 || PyArray_DIM(given, 0) != rows || !PyTypeNum_ISINTEGER(label_type) ||
        !PyArray_ISNOTSWAPPED(given) || !PyArray_IS_C_CONTIGUOUS(given) || !PyArray_ISALIGNED(given) ||
        (size != 1 && size != 2 && size != 4 && size != 8))
        Py_RETURN_NONE;
    Py_ssize_t *index = PyMem_Malloc(2 * (size_t)rows * sizeof(Py_ssize_t));
    char *sums = PyMem_Malloc(2 * (size_t)rows * (size_t)PyArray_ITEMSIZE(matrix));
    PyObject *picked = PyArray_EMPTY(1, PyArray_DIMS(matrix), type, 0);
    PyObject *terms = PyArray_EMPTY(2, PyArray_DIMS(matrix), type, 0);
    PyObject *result = NULL;
    if (index == NULL || sums == NULL || picked == NULL || terms == NULL) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    const char *data = PyArray_DATA(given);
    int is_signed = PyTypeNum_ISSIGNED(label_type);
    for (Py_ssize_t i = 0; i < rows; i++) {
        index[i] = label_at(data, size, is_signed, i);
        if (index[i] < 0 || index[i] >= k) {  /* out of range: the NumPy rule's error */
            Py_CLEAR(picked);
            Py_CLEAR(terms);
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    }
    const void *m = PyArray_DATA(matrix);
    void *t = PyArray_DATA((PyArrayObject *)terms), *p = PyArray_DATA((PyArrayObject *)picked);
    fexcept_t status;
    fegetexceptflag(&status, FE_ALL_EXCEPT);
    PyThreadState *released = rows * k >= LABEL_SOFTMAX_ALONE ? PyEval_SaveThread() : NULL;
    if (type == NPY_FLOAT) {
        float *s = (float *)sums;
        label_softmax_float(m, index, index + rows, t, p, s, s + rows, rows, k, batch);
    } else {
        double *s = (double *)sums;
        label_softmax_double(m, index, index + rows, t, p, s, s + rows, rows, k, batch);
    }
    if (released != NULL) PyEval_RestoreThread(released);
    fesetexceptflag(&status, FE_ALL_EXCEPT);
    result = PyTuple_Pack(2, picked, terms);
done:
    Py_XDECREF(picked);
    Py_XDECREF(terms);
    PyMem_Free(index);
    PyMem_Free(sums);
    return result;
}

#define FINITE_ALONE 65536 /* elements from which the check releases the GIL */

PyDoc_STRVAR(finite_doc,
    "finite(a)\n--\n\n"
    "Whether every element of a is finite, where a is a NumPy array (not a subclass) of float32 or\n"
    "float64 in the machine's byte order, C-contiguous and aligned; None for any other value.");

static PyObject *finite_check(PyObject *Py_UNUSED(self), PyObject *a) {
    int type = plain_floats(a);
    if (!type) Py_RETURN_NONE;
    PyArrayObject *array = (PyArrayObject *)a;
    Py_ssize_t n = PyArray_SIZE(array);
    const void *data = PyArray_DATA(array);
    int ok;
    if (n < FINITE_ALONE) {
        ok = finite_of(type, data, n);
    } else {  /* a large array (an embedding table) is read without the GIL, as BLAS reads it */
        Py_BEGIN_ALLOW_THREADS
        ok = finite_of(type, data, n);
        Py_END_ALLOW_THREADS
    }
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(freeze_doc,
    "freeze(a)\n--\n\n"
    "Makes a NumPy array (or a subclass's) read-only, as a.flags.writeable = False; returns None.");

static PyObject *freeze(PyObject *Py_UNUSED(self), PyObject *a) {
    if (!PyArray_Check(a)) {
        PyErr_SetString(PyExc_TypeError, "monadl._native.freeze: expected a NumPy array");
        return NULL;
    }
    PyArray_CLEARFLAGS((PyArrayObject *)a, NPY_ARRAY_WRITEABLE);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(concat_doc,
    "concat(xs, axis)\n--\n\n"
    "The arrays xs (a tuple or list) joined along axis into a fresh C-contiguous array, as\n"
    "np.concatenate joins them: None unless they are NumPy arrays (not subclasses) of one number or\n"
    "bool dtype in the machine's byte order, C-contiguous, of one rank (1 or more) and one shape off\n"
    "axis, axis in range.");

/* np.concatenate's generic path (its checks, casts and iterator) costs ten times the copy of a
   recurrent cell's [x; h]; arrays of one dtype joined are each one block per index before the axis,
   copied as bytes. */
static PyObject *concat(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !(PyTuple_Check(args[0]) || PyList_Check(args[0])) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "monadl._native.concat: expected a tuple or list of arrays and an axis");
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(args[0]);
    PyObject **xs = PySequence_Fast_ITEMS(args[0]);
    long axis = PyLong_AsLong(args[1]);
    if (axis == -1 && PyErr_Occurred()) return NULL;
    if (count < 1 || !PyArray_CheckExact(xs[0])) Py_RETURN_NONE;
    PyArrayObject *first = (PyArrayObject *)xs[0];
    int type = PyArray_TYPE(first), nd = PyArray_NDIM(first);
    if (!(PyTypeNum_ISNUMBER(type) || PyTypeNum_ISBOOL(type)) || nd < 1 || axis < -nd || axis >= nd) Py_RETURN_NONE;
    if (axis < 0) axis += nd;
    npy_intp dims[NPY_MAXDIMS];
    for (int k = 0; k < nd; k++) dims[k] = PyArray_DIM(first, k);
    dims[axis] = 0;
    for (Py_ssize_t j = 0; j < count; j++) {
        if (!PyArray_CheckExact(xs[j])) Py_RETURN_NONE;
        PyArrayObject *a = (PyArrayObject *)xs[j];
        if (PyArray_TYPE(a) != type || PyArray_NDIM(a) != nd || !PyArray_ISNOTSWAPPED(a) || !PyArray_IS_C_CONTIGUOUS(a))
            Py_RETURN_NONE;
        for (int k = 0; k < nd; k++)
            if (k != axis && PyArray_DIM(a, k) != dims[k]) Py_RETURN_NONE;
        dims[axis] += PyArray_DIM(a, axis);
    }
    PyObject *out = PyArray_EMPTY(nd, dims, type, 0);
    if (out == NULL) return NULL;
    npy_intp outer = 1;
    for (int k = 0; k < axis; k++) outer *= dims[k];
    char *to = PyArray_DATA((PyArrayObject *)out);
    for (npy_intp o = 0; o < outer; o++) {
        for (Py_ssize_t j = 0; j < count; j++) {
            PyArrayObject *a = (PyArrayObject *)xs[j];
            size_t block = (size_t)(PyArray_NBYTES(a) / outer);
            memcpy(to, (const char *)PyArray_DATA(a) + o * block, block);
            to += block;
        }
    }
    return out;
}

PyDoc_STRVAR(add_row_doc,
    "add_row(held, row, g)\n--\n\n"
    "held[row] += g, where held is a writable C-contiguous NumPy array (not a subclass) of float32\n"
    "or float64 of two dimensions or more, row one of its rows and g a C-contiguous array of its\n"
    "dtype and of the row's shape, apart in memory: True once added. False (nothing done) for any\n"
    "other arguments: the caller adds them by NumPy then.");

/* The backward pass adds each call's delta into its row of a stacked delta (a body's gates, rows
   of a few elements): NumPy's view and in-place add cost far more than the additions there. The
   same IEEE additions, element by element, as NumPy's, and as wide (WIDE: rows of a level of trees
   are large). */
static WIDE void add_float(float *restrict o, const float *restrict x, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) o[k] += x[k];
}

static WIDE void add_double(double *restrict o, const double *restrict x, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) o[k] += x[k];
}

static PyObject *add_row(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "monadl._native.add_row: expected held, row and g");
        return NULL;
    }
    Py_ssize_t row = PyLong_AsSsize_t(args[1]);
    if (row == -1 && PyErr_Occurred()) return NULL;
    int type = plain_floats(args[0]);
    if (!type || plain_floats(args[2]) != type) Py_RETURN_FALSE;
    PyArrayObject *held = (PyArrayObject *)args[0], *g = (PyArrayObject *)args[2];
    int ndim = PyArray_NDIM(held);
    if (ndim < 2 || PyArray_NDIM(g) != ndim - 1 || !PyArray_ISWRITEABLE(held) || row < 0 ||
        row >= PyArray_DIM(held, 0))
        Py_RETURN_FALSE;
    for (int k = 1; k < ndim; k++)
        if (PyArray_DIM(g, k - 1) != PyArray_DIM(held, k)) Py_RETURN_FALSE;
    Py_ssize_t n = PyArray_SIZE(g), size = PyArray_ITEMSIZE(held);
    char *out = (char *)PyArray_DATA(held) + row * n * size;
    const char *in = (const char *)PyArray_DATA(g);
    if (n && in < out + n * size && out < in + n * size) Py_RETURN_FALSE; /* overlapping: NumPy's */
    if (type == NPY_FLOAT) {
        add_float((float *)out, (const float *)in, n);
    } else {
        add_double((double *)out, (const double *)in, n);
    }
    Py_RETURN_TRUE;
}

/* An index vector the row kernels read as it is: a NumPy array (not a subclass) of npy_intp, of
   one dimension, C-contiguous and aligned (as the engine makes its gathers' indices). */
static int index_vector(PyObject *obj) {
    if (!PyArray_CheckExact(obj)) return 0;
    PyArrayObject *a = (PyArrayObject *)obj;
    return PyArray_TYPE(a) == NPY_INTP && PyArray_NDIM(a) == 1 && PyArray_IS_C_CONTIGUOUS(a) &&
           PyArray_ISALIGNED(a) && PyArray_ISNOTSWAPPED(a);
}

/* The stride between b's rows (its first axis) where a is a plain float array (takes) of rank 1 or
   more and b a NumPy array (not a subclass) of a's type, rank and row shape whose every row is
   C-contiguous (b itself may be a slice of columns, or rows repeated by broadcasting: any stride
   that is not negative), in the machine's byte order and aligned; -1 otherwise. */
static Py_ssize_t row_stride(PyObject *a, PyObject *b) {
    int type = plain_floats(a);
    if (!type || !PyArray_CheckExact(b)) return -1;
    PyArrayObject *x = (PyArrayObject *)a, *y = (PyArrayObject *)b;
    int nd = PyArray_NDIM(x);
    if (nd < 1 || PyArray_NDIM(y) != nd || PyArray_TYPE(y) != type || !PyArray_ISNOTSWAPPED(y) ||
        !PyArray_ISALIGNED(y) || !PyArray_CompareLists(PyArray_DIMS(x) + 1, PyArray_DIMS(y) + 1, nd - 1))
        return -1;
    if (PyArray_SIZE(y) == 0) return 0; /* no element to read (NumPy gives such arrays strides of 0) */
    npy_intp *dims = PyArray_DIMS(y), *strides = PyArray_STRIDES(y), inner = PyArray_ITEMSIZE(y);
    for (int j = nd - 1; j >= 1; j--) {  /* a row's axes, C-ordered (an axis of one element: any) */
        if (dims[j] != 1 && strides[j] != inner) return -1;
        inner *= dims[j];
    }
    return strides[0] < 0 ? -1 : strides[0];
}

/* Whether the memory of b's rows (rows of row bytes, stride apart) and a's bytes overlap. */
static int overlapping(const char *a, Py_ssize_t a_bytes, const char *b, Py_ssize_t rows, Py_ssize_t stride,
                       Py_ssize_t row) {
    Py_ssize_t b_bytes = rows > 0 && row > 0 ? (rows - 1) * stride + row : 0;
    return a_bytes > 0 && b_bytes > 0 && b < a + a_bytes && a < b + b_bytes;
}

/* Whether every one of the n indices is a row of rows (0 <= i < rows). */
static int in_range(const npy_intp *indices, Py_ssize_t n, npy_intp rows) {
    for (Py_ssize_t k = 0; k < n; k++)
        if (indices[k] < 0 || indices[k] >= rows) return 0;
    return 1;
}

PyDoc_STRVAR(put_rows_doc,
    "put_rows(out, places, data, picks)\n--\n\n"
    "out[places] = data[picks], row by row (rows along the first axis), where out is a writable\n"
    "plain float array (takes) and data an array of its dtype, rank and row shape whose rows are\n"
    "each C-contiguous (a slice of columns too), apart in memory, and places and picks are index\n"
    "vectors (intp, C-contiguous) of one length, each index a row: True once copied. False\n"
    "(nothing done) for any other arguments: the caller gathers them by NumPy then.");

/* A merged call's inputs gathered from the rows of a few groups (a level of trees): NumPy's take
   and its fancy assignment copy each row twice, with a temporary between, and cost more than the
   copies there. */
static PyObject *put_rows(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "monadl._native.put_rows: expected out, places, data and picks");
        return NULL;
    }
    Py_ssize_t stride = row_stride(args[0], args[2]);
    if (stride < 0 || !index_vector(args[1]) || !index_vector(args[3])) Py_RETURN_FALSE;
    PyArrayObject *out = (PyArrayObject *)args[0], *data = (PyArrayObject *)args[2];
    PyArrayObject *places = (PyArrayObject *)args[1], *picks = (PyArrayObject *)args[3];
    Py_ssize_t n = PyArray_DIM(places, 0);
    const npy_intp *to = PyArray_DATA(places), *from = PyArray_DATA(picks);
    if (!PyArray_ISWRITEABLE(out) || PyArray_DIM(picks, 0) != n || !in_range(to, n, PyArray_DIM(out, 0)) ||
        !in_range(from, n, PyArray_DIM(data, 0)))
        Py_RETURN_FALSE;
    Py_ssize_t row = PyArray_DIM(out, 0) ? PyArray_NBYTES(out) / PyArray_DIM(out, 0) : 0;
    char *o = PyArray_DATA(out);
    const char *d = PyArray_DATA(data);
    if (overlapping(o, PyArray_NBYTES(out), d, PyArray_DIM(data, 0), stride, row))
        Py_RETURN_FALSE; /* NumPy's */
    for (Py_ssize_t k = 0; k < n; k++) memcpy(o + to[k] * row, d + from[k] * stride, (size_t)row);
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(add_rows_at_doc,
    "add_rows_at(held, picks, d, places)\n--\n\n"
    "held[picks] += d[places] (d's rows in order where places is None), where held is a writable\n"
    "plain float array (takes) and d an array of its dtype, rank and row shape whose rows are each\n"
    "C-contiguous (a slice of columns too), apart in memory, picks (and places) index vectors\n"
    "(intp, C-contiguous) of one length, each index a row, and the picks\n"
    "distinct (the caller's word: NumPy's in-place add at repeated picks adds once): True once\n"
    "added. False (nothing done) for any other arguments: the caller adds them by NumPy then.");

/* The backward pass adds a gathered delta's rows back into the groups they came from: NumPy's
   fancy in-place add takes the rows out, adds and puts them back, three passes. The same IEEE
   additions, row by row (add_float: as wide as the CPU). */
static PyObject *add_rows_at(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "monadl._native.add_rows_at: expected held, picks, d and places");
        return NULL;
    }
    int ordered = args[3] == Py_None;
    Py_ssize_t stride = row_stride(args[0], args[2]);
    if (stride < 0 || !index_vector(args[1]) || !(ordered || index_vector(args[3]))) Py_RETURN_FALSE;
    PyArrayObject *held = (PyArrayObject *)args[0], *d = (PyArrayObject *)args[2];
    PyArrayObject *picks = (PyArrayObject *)args[1];
    Py_ssize_t n = PyArray_DIM(picks, 0);
    const npy_intp *to = PyArray_DATA(picks);
    const npy_intp *from = ordered ? NULL : (const npy_intp *)PyArray_DATA((PyArrayObject *)args[3]);
    if (!PyArray_ISWRITEABLE(held) || (ordered ? PyArray_DIM(d, 0) != n : PyArray_DIM((PyArrayObject *)args[3], 0) != n) ||
        !in_range(to, n, PyArray_DIM(held, 0)) || (!ordered && !in_range(from, n, PyArray_DIM(d, 0))))
        Py_RETURN_FALSE;
    Py_ssize_t width = PyArray_DIM(held, 0) ? PyArray_SIZE(held) / PyArray_DIM(held, 0) : 0;
    Py_ssize_t size = PyArray_ITEMSIZE(held);
    char *h = PyArray_DATA(held);
    const char *g = PyArray_DATA(d);
    if (overlapping(h, PyArray_NBYTES(held), g, PyArray_DIM(d, 0), stride, width * size))
        Py_RETURN_FALSE; /* NumPy's */
    for (Py_ssize_t k = 0; k < n; k++) {
        char *o = h + to[k] * width * size;
        const char *x = g + (ordered ? k : from[k]) * stride;
        if (PyArray_TYPE(held) == NPY_FLOAT)
            add_float((float *)o, (const float *)x, width);
        else
            add_double((double *)o, (const double *)x, width);
    }
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(index_array_doc,
    "index_array(values)\n--\n\n"
    "A fresh intp vector of the Python ints of the list values (np.asarray(values, dtype=np.intp));\n"
    "None if one is not an int or does not fit.");

/* The engine's gathers make their index vectors from lists of rows it collects: NumPy's conversion
   of a list discovers its dtype and shape first and converts each element through generic calls. */
static PyObject *index_array(PyObject *Py_UNUSED(self), PyObject *values) {
    if (!PyList_CheckExact(values)) Py_RETURN_NONE;
    npy_intp n = PyList_GET_SIZE(values);
    PyObject *out = PyArray_EMPTY(1, &n, NPY_INTP, 0);
    if (out == NULL) return NULL;
    npy_intp *o = PyArray_DATA((PyArrayObject *)out);
    for (npy_intp k = 0; k < n; k++) {
        PyObject *v = PyList_GET_ITEM(values, k);
        if (!PyLong_CheckExact(v)) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        Py_ssize_t x = PyLong_AsSsize_t(v);
        if (x == -1 && PyErr_Occurred()) {
            PyErr_Clear(); /* (too large: NumPy's conversion says so) */
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        o[k] = (npy_intp)x;
    }
    return out;
}

PyDoc_STRVAR(add_to_rows_doc,
    "add_to_rows(a, v)\n--\n\n"
    "a += v in place, v added to each of a's rows (its last axis): a a writable C-contiguous NumPy\n"
    "array (not a subclass) of float32 or float64, of one dimension or more, v a C-contiguous vector\n"
    "of its dtype and of a row's length, apart in memory: True once added. False (nothing done) for\n"
    "any other arguments: the caller adds them by NumPy then.");

/* A dense layer adds its bias to the rows of its product (a recurrent cell's gates: a row or a few):
   NumPy's broadcast in-place add costs far more than the additions there. */
static PyObject *add_to_rows(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "monadl._native.add_to_rows: expected a and v");
        return NULL;
    }
    int type = plain_floats(args[0]);
    if (!type || plain_floats(args[1]) != type) Py_RETURN_FALSE;
    PyArrayObject *a = (PyArrayObject *)args[0], *v = (PyArrayObject *)args[1];
    int ndim = PyArray_NDIM(a);
    if (ndim < 1 || PyArray_NDIM(v) != 1 || !PyArray_ISWRITEABLE(a) || PyArray_DIM(v, 0) != PyArray_DIM(a, ndim - 1))
        Py_RETURN_FALSE;
    Py_ssize_t n = PyArray_DIM(v, 0), size = PyArray_ITEMSIZE(a), total = PyArray_SIZE(a);
    char *out = (char *)PyArray_DATA(a);
    const char *in = (const char *)PyArray_DATA(v);
    if (n && in < out + total * size && out < in + n * size) Py_RETURN_FALSE; /* overlapping: NumPy's */
    for (Py_ssize_t start = 0; n && start < total; start += n) {
        if (type == NPY_FLOAT) {
            add_float((float *)out + start, (const float *)in, n);
        } else {
            add_double((double *)out + start, (const double *)in, n);
        }
    }
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(minus_zeros_like_doc,
    "minus_zeros_like(a)\n--\n\n"
    "A fresh C-contiguous array of a's shape and dtype filled with -0.0, where a is a NumPy array\n"
    "(not a subclass) of float32 or float64 in the machine's byte order; None otherwise.");

/* The backward pass sums a stacked slot's rows' deltas into an array of -0.0 (the identity of
   addition), one a fan or a gather of a step's few rows: np.empty and fill cost two calls. */
static PyObject *minus_zeros_like(PyObject *Py_UNUSED(self), PyObject *a) {
    if (!PyArray_CheckExact(a)) Py_RETURN_NONE;
    PyArrayObject *like = (PyArrayObject *)a;
    int type = PyArray_TYPE(like);
    if ((type != NPY_FLOAT && type != NPY_DOUBLE) || !PyArray_ISNOTSWAPPED(like)) Py_RETURN_NONE;
    PyObject *out = PyArray_EMPTY(PyArray_NDIM(like), PyArray_DIMS(like), type, 0);
    if (out == NULL) return NULL;
    Py_ssize_t n = PyArray_SIZE((PyArrayObject *)out);
    if (type == NPY_FLOAT) {
        float *o = (float *)PyArray_DATA((PyArrayObject *)out);
        for (Py_ssize_t k = 0; k < n; k++) o[k] = -0.0f;
    } else {
        double *o = (double *)PyArray_DATA((PyArrayObject *)out);
        for (Py_ssize_t k = 0; k < n; k++) o[k] = -0.0;
    }
    return out;
}

PyDoc_STRVAR(set_flag_doc,
    "set_flag(mask, k)\n--\n\n"
    "mask[k] = True, where mask is a writable C-contiguous NumPy array (not a subclass) of booleans\n"
    "of one dimension and k an int in range: True once set. False (nothing done) otherwise.");

/* The backward pass marks each row of a stacked slot that gets a delta (a fan's gates, one by
   one): NumPy's item assignment costs a call through its indexing. */
static PyObject *set_flag(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "monadl._native.set_flag: expected mask and k");
        return NULL;
    }
    if (!PyArray_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) Py_RETURN_FALSE;
    PyArrayObject *mask = (PyArrayObject *)args[0];
    if (PyArray_TYPE(mask) != NPY_BOOL || PyArray_NDIM(mask) != 1 || !PyArray_ISWRITEABLE(mask) ||
        !PyArray_IS_C_CONTIGUOUS(mask))
        Py_RETURN_FALSE;
    Py_ssize_t k = PyLong_AsSsize_t(args[1]);
    if (k == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* (too large for an index: not in range) */
        Py_RETURN_FALSE;
    }
    if (k < 0 || k >= PyArray_DIM(mask, 0)) Py_RETURN_FALSE;
    ((npy_bool *)PyArray_DATA(mask))[k] = 1;
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(any_set_doc,
    "any_set(mask)\n--\n\n"
    "Whether an element of mask is True, where mask is a C-contiguous NumPy array (not a subclass) of\n"
    "booleans; None for any other value.");

static PyObject *any_set(PyObject *Py_UNUSED(self), PyObject *a) {
    if (!PyArray_CheckExact(a) || PyArray_TYPE((PyArrayObject *)a) != NPY_BOOL ||
        !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)a))
        Py_RETURN_NONE;
    const char *bytes = (const char *)PyArray_DATA((PyArrayObject *)a);
    Py_ssize_t n = PyArray_SIZE((PyArrayObject *)a);
    char found = 0; /* or-ed, no early exit: the loop vectorizes (a mask is a step's rows) */
    for (Py_ssize_t k = 0; k < n; k++) found |= bytes[k];
    return PyBool_FromLong(found != 0);
}

PyDoc_STRVAR(user_site_doc,
    "user_site(library, clients)\n--\n\n"
    "The code object and last instruction (as frame.f_lasti) of the innermost Python frame whose\n"
    "code's file name does not start with library, or starts with clients (a user's code);\n"
    "(None, 0) if no frame's does.");

/* The frames are read with CPython's frame API (no attribute looked up by name). Whether a code
   object is the library's is kept in a direct-mapped table by its address, each entry holding a
   reference to its code object (so that the address is not another's while the entry stands):
   most ops are recorded from a few functions, and a file name is compared only on a miss. */
#define KNOWN_SLOTS 1024 /* a power of two; objects are 16-byte aligned: an address's low bits are 0 */
static PyObject *known_code[KNOWN_SLOTS];
static char known_library[KNOWN_SLOTS];

static int is_library(PyCodeObject *code, PyObject *library, PyObject *clients) {
    size_t slot = ((uintptr_t)code >> 4) & (KNOWN_SLOTS - 1);
    if (known_code[slot] == (PyObject *)code) return known_library[slot];
    PyObject *name = code->co_filename;
    Py_ssize_t in_library = PyUnicode_Tailmatch(name, library, 0, PY_SSIZE_T_MAX, -1);
    Py_ssize_t client = in_library == 1 ? PyUnicode_Tailmatch(name, clients, 0, PY_SSIZE_T_MAX, -1) : 0;
    if (in_library < 0 || client < 0) return -1;
    char found = in_library == 1 && client == 0;
    Py_INCREF(code);
    Py_XSETREF(known_code[slot], (PyObject *)code);
    known_library[slot] = found;
    return found;
}

static PyObject *user_site(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "monadl._native.user_site: expected two strings");
        return NULL;
    }
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(frame);
    while (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        int library = is_library(code, args[0], args[1]);
        if (library < 0) {
            Py_DECREF(code);
            Py_DECREF(frame);
            return NULL;
        }
        if (!library) {
            int lasti = PyFrame_GetLasti(frame);
            Py_DECREF(frame);
            PyObject *at = PyLong_FromLong(lasti < 0 ? 0 : lasti);
            PyObject *found = at == NULL ? NULL : PyTuple_Pack(2, (PyObject *)code, at);
            Py_XDECREF(at);
            Py_DECREF(code);
            return found;
        }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(code);
        Py_DECREF(frame);
        frame = back;
    }
    PyObject *zero = PyLong_FromLong(0);
    PyObject *found = zero == NULL ? NULL : PyTuple_Pack(2, Py_None, zero);
    Py_XDECREF(zero);
    return found;
}

PyDoc_STRVAR(writable_own_doc,
    "writable_own(a)\n--\n\n"
    "Whether a is a NumPy array (not a subclass) that owns its memory (no base) and is writable.");

static PyObject *writable_own(PyObject *Py_UNUSED(self), PyObject *a) {
    return PyBool_FromLong(PyArray_CheckExact(a) && PyArray_BASE((PyArrayObject *)a) == NULL &&
                           PyArray_ISWRITEABLE((PyArrayObject *)a));
}

static PyMethodDef methods[] = {
    {"adam", (PyCFunction)(void (*)(void))adam, METH_VARARGS | METH_KEYWORDS, adam_doc},
    {"sgd", sgd, METH_VARARGS, sgd_doc},
    {"takes", (PyCFunction)(void (*)(void))takes, METH_FASTCALL, takes_doc},
    {"writable_own", writable_own, METH_O, writable_own_doc},
    {"user_site", (PyCFunction)(void (*)(void))user_site, METH_FASTCALL, user_site_doc},
    {"concat", (PyCFunction)(void (*)(void))concat, METH_FASTCALL, concat_doc},
    {"add_row", (PyCFunction)(void (*)(void))add_row, METH_FASTCALL, add_row_doc},
    {"add_to_rows", (PyCFunction)(void (*)(void))add_to_rows, METH_FASTCALL, add_to_rows_doc},
    {"put_rows", (PyCFunction)(void (*)(void))put_rows, METH_FASTCALL, put_rows_doc},
    {"add_rows_at", (PyCFunction)(void (*)(void))add_rows_at, METH_FASTCALL, add_rows_at_doc},
    {"index_array", index_array, METH_O, index_array_doc},
    {"any_set", any_set, METH_O, any_set_doc},
    {"minus_zeros_like", minus_zeros_like, METH_O, minus_zeros_like_doc},
    {"set_flag", (PyCFunction)(void (*)(void))set_flag, METH_FASTCALL, set_flag_doc},
    {"finite", finite_check, METH_O, finite_doc},
    {"freeze", freeze, METH_O, freeze_doc},
    {"cell_forward", (PyCFunction)(void (*)(void))cell_forward, METH_FASTCALL, cell_forward_doc},
    {"cell_deltas", (PyCFunction)(void (*)(void))cell_deltas, METH_FASTCALL, cell_deltas_doc},
    {"label_softmax", (PyCFunction)(void (*)(void))label_softmax, METH_FASTCALL, label_softmax_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "monadl._native",
    "Optimizer updates, recurrent cells' rules and a cross-entropy's softmax of labels in one pass, bit\n"
    "for bit the NumPy rules'.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    import_array();
    numpy_loops_check();
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "numpy_loops", numpy_loops) < 0 ||
                      PyModule_AddIntConstant(m, "label_loops", label_loops) < 0))
        Py_CLEAR(m);
    return m;
}
