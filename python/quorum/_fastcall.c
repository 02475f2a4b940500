/*
 * _fastcall.c - the path of every dense push and pull from Python, in C.
 *
 * The Python layer is ctypes over libquorum (_native.py says why). Per
 * push+pull, ctypes and the Python around it cost 13 to 20 us on the
 * 2-core VM (bench/python/bench_torch.py), several times what the same
 * code takes in a loop: a call's Python runs in caches that the kernel
 * and the ps have just used. This module does the work of the common call
 * in C: a dict from variable names or ids to float32 arrays (NumPy arrays
 * or CPU torch tensors), the names made ids, the checks of _arrays.py,
 * and the library call with the GIL released.
 *
 * Anything else (an unknown name, an embedding table, another dtype, a
 * non-contiguous array, None where an array is needed) it leaves to the
 * Python layer by returning NotImplemented, so that every check's message
 * is written in one place (_arrays.py, worker.py) and both paths refuse
 * the same things.
 *
 * It reaches libquorum through the addresses ctypes found (bind), so it
 * does not link to it, and the package works without it: when Python's
 * headers are missing at build time, worker.py takes the ctypes path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "quorum.h"

typedef int (*pull_fn)(qr_worker *w, int n, const int *ids, float **dst);
typedef int (*push_fn)(qr_worker *w, int n, const int *ids, const float *const *grads,
                       unsigned flags, int64_t *global_step);
typedef int (*push_pull_fn)(qr_worker *w, int n, const int *ids, const float *const *grads,
                            float *const *values, unsigned flags, int64_t *global_step);

/* What bind() was given: the library's entry points, and the types an
 * array may have. */
static struct {
    pull_fn pull, pull_averages;
    push_fn push;
    push_pull_fn push_pull;
    PyTypeObject *ndarray;
    PyObject *torch_types; /* a tuple of exact types, or NULL before torch is seen */
    PyObject *torch_float32;
} lib;

/* The variables and arrays of one call, and the references that keep the
 * arrays alive while the GIL is released (another thread may drop them
 * from the caller's dict meanwhile). */
typedef struct call {
    Py_ssize_t n;
    int *ids;
    void **grads;  /* or NULL */
    void **values; /* or NULL */
    PyObject **held;
    Py_ssize_t nheld;
} call;

static int call_init(call *c, Py_ssize_t n, int with_grads, int with_values) {
    *c = (call){.n = n};
    Py_ssize_t k = n ? n : 1;
    c->ids = PyMem_Malloc((size_t)k * sizeof *c->ids);
    c->grads = with_grads ? PyMem_Calloc((size_t)k, sizeof *c->grads) : NULL;
    c->values = with_values ? PyMem_Calloc((size_t)k, sizeof *c->values) : NULL;
    c->held = PyMem_Malloc((size_t)(2 * k) * sizeof *c->held);
    if (!c->ids || !c->held || (with_grads && !c->grads) || (with_values && !c->values)) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void call_free(call *c) {
    for (Py_ssize_t i = 0; i < c->nheld; i++) Py_DECREF(c->held[i]);
    PyMem_Free(c->ids);
    PyMem_Free(c->grads);
    PyMem_Free(c->values);
    PyMem_Free(c->held);
}

/* The id of a dict key (a declared name, or an id), or -1 if it is
 * anything else or names an embedding table. */
static int var_id(PyObject *key, PyObject *names, Py_ssize_t nvars, PyObject *tables) {
    long id;
    if (PyUnicode_CheckExact(key)) {
        PyObject *v = PyDict_GetItemWithError(names, key);
        if (!v) {
            PyErr_Clear();
            return -1;
        }
        id = PyLong_AsLong(v);
    } else if (PyLong_CheckExact(key)) {
        id = PyLong_AsLong(key);
    } else {
        return -1;
    }
    if (id < 0 || id >= nvars) {
        PyErr_Clear();
        return -1;
    }
    if (PyDict_GET_SIZE(tables)) {
        PyObject *k = PyLong_FromLong(id);
        int is_table = k ? PyDict_Contains(tables, k) : -1;
        Py_XDECREF(k);
        if (is_table) {
            PyErr_Clear();
            return -1;
        }
    }
    return (int)id;
}

/* True if calling x's method `name` gives `want` (compared by identity). */
static int method_is(PyObject *x, const char *name, PyObject *want) {
    PyObject *r = PyObject_CallMethod(x, name, NULL);
    int same = r == want;
    Py_XDECREF(r);
    return same;
}

static int attr_is(PyObject *x, const char *name, PyObject *want) {
    PyObject *r = PyObject_GetAttrString(x, name);
    int same = r == want;
    Py_XDECREF(r);
    return same;
}

/* The data address of x if it is a C-contiguous float32 ndarray (writable
 * if the library writes into it) or a contiguous float32 CPU tensor, of
 * exactly count elements; NULL otherwise, with no exception set. */
static void *array_address(PyObject *x, long long count, int writable) {
    if (count <= 0) return NULL;
    if (Py_TYPE(x) == lib.ndarray) {
        Py_buffer view;
        int need = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(x, &view, need)) {
            PyErr_Clear();
            return NULL;
        }
        /* "f": native-order float32; "<f" or ">f" would be a byte order
         * spelled out, which the Python layer refuses as another dtype. */
        int ok = view.itemsize == 4 && view.format && view.format[0] == 'f' &&
                 view.format[1] == 0 && view.len == count * 4;
        void *address = view.buf;
        /* The reference the call holds keeps the array, and so its memory. */
        PyBuffer_Release(&view);
        return ok ? address : NULL;
    }
    if (!lib.torch_types) return NULL;
    int is_tensor = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lib.torch_types); i++)
        is_tensor |= (PyObject *)Py_TYPE(x) == PyTuple_GET_ITEM(lib.torch_types, i);
    if (!is_tensor || !attr_is(x, "dtype", lib.torch_float32) || !attr_is(x, "is_cpu", Py_True) ||
        !method_is(x, "is_contiguous", Py_True)) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *numel = PyObject_CallMethod(x, "numel", NULL);
    long long elements = numel ? PyLong_AsLongLong(numel) : -1;
    Py_XDECREF(numel);
    PyObject *ptr = elements == count ? PyObject_CallMethod(x, "data_ptr", NULL) : NULL;
    void *address = ptr ? PyLong_AsVoidPtr(ptr) : NULL;
    Py_XDECREF(ptr);
    PyErr_Clear();
    return address;
}

/* Fills c from a dict of variable -> array (values: arrays may be None,
 * the worker's copy). 1 if every entry is the common case, 0 if not (the
 * Python layer takes the call), -1 with an exception on memory. */
static int take_arrays(call *c, PyObject *dict, PyObject *names, PyObject *sizes,
                       PyObject *tables, int writable, void **out, int none_allowed) {
    Py_ssize_t pos = 0, i = 0, nvars = PyList_GET_SIZE(sizes);
    PyObject *key, *array;
    while (PyDict_Next(dict, &pos, &key, &array)) {
        /* A tensor's checks run Python, during which another thread may
         * change the dict: then the Python layer takes the call. */
        if (i >= c->n) return 0;
        int id = var_id(key, names, nvars, tables);
        if (id < 0) return 0;
        c->ids[i] = id;
        if (array == Py_None) {
            if (!none_allowed) return 0;
            out[i++] = NULL;
            continue;
        }
        long long count = PyLong_AsLongLong(PyList_GET_ITEM(sizes, id));
        Py_INCREF(array); /* held before its checks run any Python */
        c->held[c->nheld++] = array;
        out[i] = array_address(array, count, writable);
        if (!out[i++]) return 0;
    }
    return 1;
}

/* The worker of a handle (an int), or NULL for the Python layer to name
 * the problem (a closed worker, say). */
static qr_worker *worker_of(PyObject *handle) {
    qr_worker *w = PyLong_AsVoidPtr(handle);
    if (!w) PyErr_Clear();
    return w;
}

enum { PULL, PUSH, PUSH_PULL };

/* Starts a call of the given kind on dict's arrays (a pull's destinations,
 * a push's gradients): 1 to go on; 0 when the Python layer is to take the
 * call, or -1 with an exception, c freed in both cases. */
static int call_take(call *c, int kind, PyObject *dict, PyObject *names, PyObject *sizes,
                     PyObject *tables) {
    if (call_init(c, PyDict_GET_SIZE(dict), kind != PULL, kind != PUSH)) {
        call_free(c);
        return -1;
    }
    int taken = kind == PULL ? take_arrays(c, dict, names, sizes, tables, 1, c->values, 1)
                             : take_arrays(c, dict, names, sizes, tables, 0, c->grads, 0);
    if (taken <= 0) call_free(c);
    return taken;
}

/* What a call not taken returns: NotImplemented (no exception left from
 * the checks: the Python path makes them again and raises its own), or
 * NULL for an exception (out of memory). */
static PyObject *not_taken(int taken) {
    if (taken < 0) return NULL;
    PyErr_Clear();
    Py_RETURN_NOTIMPLEMENTED;
}

/* bind(pull, pull_averages, push, push_pull, ndarray): the library's entry
 * points (addresses from ctypes) and NumPy's array type. */
static PyObject *fast_bind(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *pull, *pull_averages, *push, *push_pull, *ndarray;
    if (!PyArg_ParseTuple(args, "OOOOO!", &pull, &pull_averages, &push, &push_pull,
                          &PyType_Type, &ndarray))
        return NULL;
    lib.pull = (pull_fn)PyLong_AsVoidPtr(pull);
    lib.pull_averages = (pull_fn)PyLong_AsVoidPtr(pull_averages);
    lib.push = (push_fn)PyLong_AsVoidPtr(push);
    lib.push_pull = (push_pull_fn)PyLong_AsVoidPtr(push_pull);
    if (PyErr_Occurred()) return NULL;
    Py_INCREF(ndarray);
    Py_XSETREF(lib.ndarray, (PyTypeObject *)ndarray);
    Py_RETURN_NONE;
}

/* bind_torch(types, float32): the exact tensor types taken (torch.Tensor,
 * torch.nn.Parameter) and torch.float32, once torch is imported. */
static PyObject *fast_bind_torch(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *types, *float32;
    if (!PyArg_ParseTuple(args, "O!O", &PyTuple_Type, &types, &float32)) return NULL;
    Py_INCREF(types);
    Py_INCREF(float32);
    Py_XSETREF(lib.torch_types, types);
    Py_XSETREF(lib.torch_float32, float32);
    Py_RETURN_NONE;
}

/* pull(handle, into, names, sizes, tables, averages) -> status, or
 * NotImplemented. */
static PyObject *fast_pull(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *handle, *into, *names, *sizes, *tables;
    int averages;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!p", &handle, &PyDict_Type, &into, &PyDict_Type,
                          &names, &PyList_Type, &sizes, &PyDict_Type, &tables, &averages))
        return NULL;
    qr_worker *w = worker_of(handle);
    if (!w || !lib.pull) Py_RETURN_NOTIMPLEMENTED;
    call c;
    int taken = call_take(&c, PULL, into, names, sizes, tables);
    if (taken <= 0) return not_taken(taken);
    pull_fn fn = averages ? lib.pull_averages : lib.pull;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = fn(w, (int)c.n, c.ids, (float **)c.values);
    Py_END_ALLOW_THREADS
    call_free(&c);
    return PyLong_FromLong(status);
}

/* push(handle, grads, names, sizes, tables, flags) -> (status, global
 * step), or NotImplemented. */
static PyObject *fast_push(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *handle, *grads, *names, *sizes, *tables;
    unsigned flags;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!I", &handle, &PyDict_Type, &grads, &PyDict_Type,
                          &names, &PyList_Type, &sizes, &PyDict_Type, &tables, &flags))
        return NULL;
    qr_worker *w = worker_of(handle);
    if (!w || !lib.push) Py_RETURN_NOTIMPLEMENTED;
    call c;
    int taken = call_take(&c, PUSH, grads, names, sizes, tables);
    if (taken <= 0) return not_taken(taken);
    int64_t step = -1;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = lib.push(w, (int)c.n, c.ids, (const float *const *)c.grads, flags, &step);
    Py_END_ALLOW_THREADS
    call_free(&c);
    return Py_BuildValue("iL", status, (long long)step);
}

/* push_pull(handle, grads, into, names, sizes, tables, flags) -> (status,
 * global step), or NotImplemented. into maps the same keys as grads to
 * destinations (None: the worker's copy), or is None: every value into
 * the worker's copy. */
static PyObject *fast_push_pull(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *handle, *grads, *into, *names, *sizes, *tables;
    unsigned flags;
    if (!PyArg_ParseTuple(args, "OO!OO!O!O!I", &handle, &PyDict_Type, &grads, &into,
                          &PyDict_Type, &names, &PyList_Type, &sizes, &PyDict_Type, &tables,
                          &flags))
        return NULL;
    qr_worker *w = worker_of(handle);
    if (!w || !lib.push_pull) Py_RETURN_NOTIMPLEMENTED;
    if (into != Py_None && !PyDict_CheckExact(into)) Py_RETURN_NOTIMPLEMENTED;
    call c;
    int taken = call_take(&c, PUSH_PULL, grads, names, sizes, tables);
    if (taken <= 0) return not_taken(taken);
    /* The destinations, in the gradients' order, found by the same keys. */
    if (into != Py_None) {
        if (PyDict_GET_SIZE(into) != c.n) taken = 0;
        Py_ssize_t pos = 0, i = 0;
        PyObject *key, *grad;
        while (taken > 0 && PyDict_Next(grads, &pos, &key, &grad)) {
            PyObject *dst = i < c.n ? PyDict_GetItemWithError(into, key) : NULL;
            if (!dst) {
                PyErr_Clear();
                taken = 0;
            } else if (dst != Py_None) {
                long long count = PyLong_AsLongLong(PyList_GET_ITEM(sizes, c.ids[i]));
                Py_INCREF(dst);
                c.held[c.nheld++] = dst;
                c.values[i] = array_address(dst, count, 1);
                if (!c.values[i]) taken = 0;
            }
            i++;
        }
    }
    if (!taken) {
        call_free(&c);
        return not_taken(0);
    }
    int64_t step = -1;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = lib.push_pull(w, (int)c.n, c.ids, (const float *const *)c.grads,
                           (float *const *)c.values, flags, &step);
    Py_END_ALLOW_THREADS
    call_free(&c);
    return Py_BuildValue("iL", status, (long long)step);
}

static PyMethodDef methods[] = {
    {"bind", fast_bind, METH_VARARGS, "bind(pull, pull_averages, push, push_pull, ndarray)"},
    {"bind_torch", fast_bind_torch, METH_VARARGS, "bind_torch(tensor_types, float32)"},
    {"pull", fast_pull, METH_VARARGS,
     "pull(handle, into, names, sizes, tables, averages) -> status or NotImplemented"},
    {"push", fast_push, METH_VARARGS,
     "push(handle, grads, names, sizes, tables, flags) -> (status, step) or NotImplemented"},
    {"push_pull", fast_push_pull, METH_VARARGS,
     "push_pull(handle, grads, into, names, sizes, tables, flags) -> (status, step) or "
     "NotImplemented"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastcall",
    "The common dense push and pull, in C (see _fastcall.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcall(void) { return PyModule_Create(&module); }
