/* monadl._memory: a NumPy memory handler (NEP 49) that keeps a step's large blocks for the next step
(built with the compiled engine).

A training step makes the same large arrays every time (a language model's logits and their
gradient: tens of megabytes each). glibc hands a block of 32 MiB or more out as fresh pages mapped
from the system, however its thresholds are tuned (monadl/runtime/process.py raises them to that
maximum), and unmaps them when it is freed, so every step pays a page fault for each page of each
such array, and the system's zeroing of it (docs/benchmarks.md has the cost). This handler
keeps up to MAX_BLOCKS freed blocks of MIN_BYTES or more (MAX_BYTES together; a larger block freed
when they are full takes the place of smaller ones) and hands out the smallest that fits (at most
twice the size asked) for the next such array: a batch's arrays vary in size from step to step.
Sizes are rounded up to an eighth of their power of two. Everything else, and every block it does
not keep, goes to the handler that was in place (NumPy's own). An array made zeroed (calloc) from
a kept block is zeroed here.

NumPy's handlers are context-scoped: use(), called around the engine's runs, puts this one in place
for the calling thread's context and returns the handler it replaced, for the caller to put back. An
array remembers the handler that allocated it, which frees it. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <string.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#define MIN_BYTES ((size_t)32 << 20)
#define MAX_BLOCKS 8
#define MAX_BYTES ((size_t)256 << 20)
#define MAX_LENT 32

static PyDataMem_Handler *fallback; /* the handler in place when the module was loaded (NumPy's) */
static PyObject *fallback_capsule;   /* kept alive: arrays it allocated may outlive any use() */
static PyThread_type_lock lock;      /* the tables below, taken without the GIL (NumPy may free so) */
static void *kept[MAX_BLOCKS];       /* freed blocks kept, with their sizes */
static size_t kept_size[MAX_BLOCKS];
static size_t kept_bytes;
static void *lent[MAX_LENT];         /* kept blocks handed out again, with their real sizes (NumPy */
static size_t lent_size[MAX_LENT];   /* frees a block with the size it asked for, maybe less) */

/* The size class of a large block: n rounded up to a multiple of an eighth of its power of two. */
static size_t size_class(size_t n) {
    size_t p = 1;
    while (p <= n / 2)
        p <<= 1;
    size_t step = p / 8;
    return (n + step - 1) / step * step;
}

/* The smallest kept block of at least `size` bytes and at most twice that (its size in *real), or
   NULL. A block handed out is remembered with its real size, if there is room to. */
static void *take(size_t size, size_t *real) {
    void *block = NULL;
    int best = -1;
    PyThread_acquire_lock(lock, WAIT_LOCK);
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (kept[i] != NULL && kept_size[i] >= size && kept_size[i] / 2 <= size &&
            (best < 0 || kept_size[i] < kept_size[best]))
            best = i;
    for (int j = 0; best >= 0 && j < MAX_LENT; j++) {
        if (lent[j] == NULL) {
            block = lent[j] = kept[best];
            *real = lent_size[j] = kept_size[best];
            kept[best] = NULL;
            kept_bytes -= *real;
            break;
        }
    }
    PyThread_release_lock(lock);
    return block;
}

static void *cached_malloc(void *ctx, size_t size) {
    if (size < MIN_BYTES)
        return fallback->allocator.malloc(fallback->allocator.ctx, size);
    size_t c = size_class(size), real;
    void *block = take(c, &real);
    return block != NULL ? block : fallback->allocator.malloc(fallback->allocator.ctx, c);
}

static void *cached_calloc(void *ctx, size_t nelem, size_t elsize) {
    if (elsize != 0 && nelem > (size_t)-1 / elsize)
        return NULL;
    size_t size = nelem * elsize;
    if (size < MIN_BYTES)
        return fallback->allocator.calloc(fallback->allocator.ctx, nelem, elsize);
    size_t c = size_class(size), real;
    void *block = take(c, &real);
    if (block != NULL) {
        memset(block, 0, size);
        return block;
    }
    return fallback->allocator.calloc(fallback->allocator.ctx, c, 1);
}

/* The real size of a block freed with `size`: a lent block's, else its size class (the block was
   allocated that size). Called with the lock held. */
static size_t real_size(void *ptr, size_t size) {
    for (int j = 0; j < MAX_LENT; j++) {
        if (lent[j] == ptr) {
            lent[j] = NULL;
            return lent_size[j];
        }
    }
    return size_class(size);
}

static void *cached_realloc(void *ctx, void *ptr, size_t new_size) {
    /* Every block came from the fallback's malloc (a kept one too): its realloc takes any of them.
       A large block is made of its size class, as cached_malloc's: it may be kept when freed. */
    PyThread_acquire_lock(lock, WAIT_LOCK);
    for (int j = 0; j < MAX_LENT; j++)
        if (lent[j] == ptr)
            lent[j] = NULL; /* (no longer the block it was) */
    PyThread_release_lock(lock);
    size_t size = new_size < MIN_BYTES ? new_size : size_class(new_size);
    return fallback->allocator.realloc(fallback->allocator.ctx, ptr, size);
}

/* Keeps a freed block, making room by giving back smaller kept ones; false where it is not kept
   (too large, or smaller than all those kept). */
static int keep(void *ptr, size_t real) {
    void *evicted[MAX_BLOCKS];
    size_t evicted_size[MAX_BLOCKS];
    int n = 0, done = 0;
    PyThread_acquire_lock(lock, WAIT_LOCK);
    for (;;) {
        int free_slot = -1, smallest = -1;
        for (int i = 0; i < MAX_BLOCKS; i++) {
            if (kept[i] == NULL)
                free_slot = free_slot < 0 ? i : free_slot;
            else if (smallest < 0 || kept_size[i] < kept_size[smallest])
                smallest = i;
        }
        if (free_slot >= 0 && kept_bytes + real <= MAX_BYTES) {
            kept[free_slot] = ptr;
            kept_size[free_slot] = real;
            kept_bytes += real;
            done = 1;
            break;
        }
        if (real > MAX_BYTES || smallest < 0 || kept_size[smallest] >= real)
            break;
        evicted[n] = kept[smallest];
        evicted_size[n++] = kept_size[smallest];
        kept_bytes -= kept_size[smallest];
        kept[smallest] = NULL;
    }
    PyThread_release_lock(lock);
    for (int i = 0; i < n; i++)
        fallback->allocator.free(fallback->allocator.ctx, evicted[i], evicted_size[i]);
    return done;
}

static void cached_free(void *ctx, void *ptr, size_t size) {
    if (ptr != NULL && size >= MIN_BYTES) {
        PyThread_acquire_lock(lock, WAIT_LOCK);
        size_t real = real_size(ptr, size);
        PyThread_release_lock(lock);
        if (keep(ptr, real))
            return;
        size = real;
    }
    fallback->allocator.free(fallback->allocator.ctx, ptr, size);
}

static PyDataMem_Handler handler = {
    "monadl_large_blocks",
    1,
    {NULL, cached_malloc, cached_calloc, cached_realloc, cached_free},
};
static PyObject *handler_capsule;

static PyObject *use(PyObject *self, PyObject *unused) {
    /* Puts this handler in place for the calling context; returns the one it replaced. */
    return PyDataMem_SetHandler(handler_capsule);
}

static PyObject *restore(PyObject *self, PyObject *previous) {
    /* Puts ``previous`` (what use() returned) back in place. */
    PyObject *ours = PyDataMem_SetHandler(previous);
    if (ours == NULL)
        return NULL;
    Py_DECREF(ours);
    Py_RETURN_NONE;
}

static PyObject *release(PyObject *self, PyObject *unused) {
    /* Gives every kept block back (to the fallback handler); returns how many bytes they held. */
    void *blocks[MAX_BLOCKS];
    size_t sizes[MAX_BLOCKS];
    size_t released;
    PyThread_acquire_lock(lock, WAIT_LOCK);
    for (int i = 0; i < MAX_BLOCKS; i++) {
        blocks[i] = kept[i];
        sizes[i] = kept_size[i];
        kept[i] = NULL;
    }
    released = kept_bytes;
    kept_bytes = 0;
    PyThread_release_lock(lock);
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (blocks[i] != NULL)
            fallback->allocator.free(fallback->allocator.ctx, blocks[i], sizes[i]);
    return PyLong_FromSize_t(released);
}

static PyObject *kept_blocks(PyObject *self, PyObject *unused) {
    /* The sizes of the blocks kept now (for tests). */
    PyObject *sizes = PyList_New(0);
    if (sizes == NULL)
        return NULL;
    PyThread_acquire_lock(lock, WAIT_LOCK);
    size_t copy[MAX_BLOCKS];
    for (int i = 0; i < MAX_BLOCKS; i++)
        copy[i] = kept[i] != NULL ? kept_size[i] : 0;
    PyThread_release_lock(lock);
    for (int i = 0; i < MAX_BLOCKS; i++) {
        if (copy[i]) {
            PyObject *n = PyLong_FromSize_t(copy[i]);
            if (n == NULL || PyList_Append(sizes, n) < 0) {
                Py_XDECREF(n);
                Py_DECREF(sizes);
                return NULL;
            }
            Py_DECREF(n);
        }
    }
    return sizes;
}

static PyMethodDef methods[] = {
    {"use", use, METH_NOARGS, "Puts the large-block handler in place; returns the one it replaced."},
    {"restore", restore, METH_O, "Puts back the handler use() returned."},
    {"release", release, METH_NOARGS, "Frees the kept blocks; returns the bytes they held."},
    {"kept_blocks", kept_blocks, METH_NOARGS, "The sizes of the blocks kept now."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "monadl._memory", "Large blocks kept between a run's steps.", -1, methods,
};

PyMODINIT_FUNC PyInit__memory(void) {
    import_array();
    lock = PyThread_allocate_lock();
    if (lock == NULL)
        return PyErr_NoMemory();
    fallback_capsule = PyDataMem_GetHandler();
    if (fallback_capsule == NULL)
        return NULL;
    fallback = (PyDataMem_Handler *)PyCapsule_GetPointer(fallback_capsule, "mem_handler");
    if (fallback == NULL)
        return NULL;
    handler_capsule = PyCapsule_New(&handler, "mem_handler", NULL);
    if (handler_capsule == NULL)
        return NULL;
    return PyModule_Create(&module);
}
