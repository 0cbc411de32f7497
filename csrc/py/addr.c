/* npurun.backends.cpu._addr: the address of an array's first element, for the ctypes calls
 * of native.py.
 *
 * Why a module of its own: numpy's `a.ctypes.data` (and `a.__array_interface__`) builds a
 * helper object on every access, ~1.2 us — more than the ctypes call it feeds (~0.9 us) and,
 * at 4-6 arrays a kernel, most of a small step's cost (a 19-step MLP spent 40 of its 110 us
 * there). Here it is the buffer protocol: ~0.1 us. Any object with a buffer works (a read-only
 * one too); None is NULL, as ctypes passes it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *addr(PyObject *self, PyObject *o) {
    (void)self;
    if (o == Py_None)
        return PyLong_FromLong(0);
    Py_buffer view;
    /* strides allowed: the caller decides whether the layout suits its kernel, as with
     * a.ctypes.data; no format string asked for (numpy would build one) */
    if (PyObject_GetBuffer(o, &view, PyBUF_STRIDED_RO) < 0)
        return NULL;
    PyObject *r = PyLong_FromVoidPtr(view.buf);
    PyBuffer_Release(&view);
    return r;
}

static PyMethodDef methods[] = {
    {"addr", addr, METH_O, "addr(array) -> int: the address of its first element (0 for None)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_addr", NULL, -1, methods};

PyMODINIT_FUNC PyInit__addr(void) { return PyModule_Create(&module); }
