/* npurun.backends.cpu._addr: the address of an array's first element, for the ctypes calls
 * of native.py; and bound calls, a kernel call whose arguments but its input and output are
 * fixed once (native.bound).
 *
 * Why a module of its own: numpy's `a.ctypes.data` (and `a.__array_interface__`) builds a
 * helper object on every access, ~1.2 us — more than the ctypes call it feeds (~0.9 us) and,
 * at 4-6 arrays a kernel, most of a small step's cost (a 19-step MLP spent 40 of its 110 us
 * there). Here it is the buffer protocol: ~0.1 us. Any object with a buffer works (a read-only
 * one too); None is NULL, as ctypes passes it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* *out = the address of o's first element (0 for None); -1 with the error set if o has no buffer. */
static int address(PyObject *o, void **out) {
    if (o == Py_None) { *out = NULL; return 0; }
    Py_buffer view;
    /* strides allowed: the caller decides whether the layout suits its kernel, as with
     * a.ctypes.data; no format string asked for (numpy would build one) */
    if (PyObject_GetBuffer(o, &view, PyBUF_STRIDED_RO) < 0)
        return -1;
    *out = view.buf;
    PyBuffer_Release(&view);
    return 0;
}

static PyObject *addr(PyObject *self, PyObject *o) {
    (void)self;
    void *a;
    if (address(o, &a) < 0)
        return NULL;
    return PyLong_FromVoidPtr(a);
}

/* Bound calls. A ctypes call converts each argument through its declared type: ~2.5 us for a
 * conv kernel's 22 arguments, more than a small depthwise conv's whole work. A bound call keeps
 * the converted arguments in a record (bytes) and calls the kernel through one prototype of
 * NI integer-class and NF float arguments. On the x86-64 System V ABI that reaches any kernel
 * of ours: integer-class arguments (pointers, int, long) take the general registers and then
 * the stack in their order, float ones the vector registers in theirs, each class on its own,
 * so the callee's ints and floats in any interleaving are these in order (an int read from a
 * 64-bit slot is its low half); unused ones are ignored (the caller pops the stack). Kernels
 * have at most 8 floats (none on the stack) and no doubles. Elsewhere the module has no bind
 * and native.bound keeps ctypes. */
#define NI 32
#define NF 8
typedef struct { void *fn; int xi, yi; long i[NI]; float f[NF]; } bound_t;

#if defined(__x86_64__) && !defined(_WIN32)
#define L4 long, long, long, long
typedef int (*proto_t)(L4, L4, L4, L4, L4, L4, L4, L4, float, float, float, float, float, float, float, float);

static PyObject *bind(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *fn, *ints, *floats;
    int xi, yi;
    if (!PyArg_ParseTuple(args, "OO!O!ii", &fn, &PyTuple_Type, &ints, &PyTuple_Type, &floats, &xi, &yi))
        return NULL;
    Py_ssize_t ni = PyTuple_GET_SIZE(ints), nf = PyTuple_GET_SIZE(floats);
    if (ni > NI || nf > NF || xi >= ni || yi >= ni) {
        PyErr_Format(PyExc_ValueError, "bind: %zd integer and %zd float arguments (at most %d and %d), "
                     "input at %d, output at %d", ni, nf, NI, NF, xi, yi);
        return NULL;
    }
    bound_t b = {0};
    b.fn = PyLong_AsVoidPtr(fn);
    b.xi = xi, b.yi = yi;
    for (Py_ssize_t k = 0; k < ni; k++)
        b.i[k] = PyLong_AsLong(PyTuple_GET_ITEM(ints, k));
    for (Py_ssize_t k = 0; k < nf; k++)
        b.f[k] = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(floats, k));
    if (PyErr_Occurred())
        return NULL;
    return PyBytes_FromStringAndSize((const char *)&b, sizeof b);
}

/* call(record, x, y) -> the kernel's return value: x's and y's addresses put in their slots;
 * the GIL let go during the call, as ctypes does. */
static PyObject *call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) != (Py_ssize_t)sizeof(bound_t)) {
        PyErr_SetString(PyExc_TypeError, "call(record, x, y): a record from bind()");
        return NULL;
    }
    bound_t b;
    memcpy(&b, PyBytes_AS_STRING(args[0]), sizeof b);
    void *x, *y;
    if ((b.xi >= 0 && address(args[1], &x) < 0) || (b.yi >= 0 && address(args[2], &y) < 0))
        return NULL;
    if (b.xi >= 0) b.i[b.xi] = (long)x;
    if (b.yi >= 0) b.i[b.yi] = (long)y;
    long *i = b.i;
    float *f = b.f;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ((proto_t)b.fn)(i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], i[8], i[9], i[10], i[11], i[12],
                         i[13], i[14], i[15], i[16], i[17], i[18], i[19], i[20], i[21], i[22], i[23], i[24],
                         i[25], i[26], i[27], i[28], i[29], i[30], i[31],
                         f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}
#endif

static PyMethodDef methods[] = {
    {"addr", addr, METH_O, "addr(array) -> int: the address of its first element (0 for None)."},
#if defined(__x86_64__) && !defined(_WIN32)
    {"bind", bind, METH_VARARGS, "bind(fn, ints, floats, x_at, y_at) -> record: a kernel call, its "
     "integer-class and float arguments in order, x and y to be put at ints[x_at], ints[y_at] (-1: none)."},
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL, "call(record, x, y) -> int: the bound call."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_addr", NULL, -1, methods};

PyMODINIT_FUNC PyInit__addr(void) { return PyModule_Create(&module); }
