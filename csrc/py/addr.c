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
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

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

/* Recording (native.recording, replay.py's capture): while `taken` is a list, every object
 * whose address addr() or call() takes is appended to it, so that a recorded call's arrays
 * outlive the run they were made in; while `calls` is a list, call() appends (record with the
 * addresses in place, thread id) after each bound call. */
static PyObject *taken = NULL, *calls = NULL;

static int keep(PyObject *o) {
    return (taken == NULL || o == Py_None) ? 0 : PyList_Append(taken, o);
}

static PyObject *addr(PyObject *self, PyObject *o) {
    (void)self;
    void *a;
    if (address(o, &a) < 0 || keep(o) < 0)
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
/* check: whether the kernel returns an int status (0: done) that replay() must look at */
typedef struct { void *fn; int xi, yi, check; long i[NI]; float f[NF]; } bound_t;

#if defined(__x86_64__) && !defined(_WIN32)
#define L4 long, long, long, long
typedef int (*proto_t)(L4, L4, L4, L4, L4, L4, L4, L4, float, float, float, float, float, float, float, float);

static int invoke(const bound_t *b) {
    const long *i = b->i;
    const float *f = b->f;
    return ((proto_t)b->fn)(i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], i[8], i[9], i[10], i[11], i[12],
                            i[13], i[14], i[15], i[16], i[17], i[18], i[19], i[20], i[21], i[22], i[23], i[24],
                            i[25], i[26], i[27], i[28], i[29], i[30], i[31],
                            f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]);
}

static PyObject *bind(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *fn, *ints, *floats;
    int xi, yi, check = 0;
    if (!PyArg_ParseTuple(args, "OO!O!ii|p", &fn, &PyTuple_Type, &ints, &PyTuple_Type, &floats, &xi, &yi, &check))
        return NULL;
    Py_ssize_t ni = PyTuple_GET_SIZE(ints), nf = PyTuple_GET_SIZE(floats);
    if (ni > NI || nf > NF || xi >= ni || yi >= ni) {
        PyErr_Format(PyExc_ValueError, "bind: %zd integer and %zd float arguments (at most %d and %d), "
                     "input at %d, output at %d", ni, nf, NI, NF, xi, yi);
        return NULL;
    }
    bound_t b = {0};
    b.fn = PyLong_AsVoidPtr(fn);
    b.xi = xi, b.yi = yi, b.check = check;
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
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = invoke(&b);
    Py_END_ALLOW_THREADS
    if (calls != NULL) {
        if ((b.xi >= 0 && keep(args[1]) < 0) || (b.yi >= 0 && keep(args[2]) < 0))
            return NULL;
        b.check = 1, b.xi = b.yi = -1;  /* bound kernels return a status */
        PyObject *r = Py_BuildValue("(y#k)", (const char *)&b, (Py_ssize_t)sizeof b, PyThread_get_thread_ident());
        if (r == NULL || PyList_Append(calls, r) < 0) {
            Py_XDECREF(r);
            return NULL;
        }
        Py_DECREF(r);
    }
    return PyLong_FromLong(rc);
}

/* replay(records, flush) -> (index, status): the bound calls of `records` (bytes, records end
 * to end, their addresses in place) one after another with the GIL let go once; stops at the
 * first that returns a nonzero status where it has one (index -1: all done). A recorded
 * program's run in one call (replay.py). With `flush`, subnormals are flushed to zero for the
 * length of the calls, as par.c's npr_fp_enter / npr_fp_leave do around a normal run (the
 * pool's workers copy the caller's MXCSR with each job): two ctypes calls fewer a run. */
static PyObject *replay(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    PyObject *blob = nargs == 2 ? args[0] : NULL;
    int flush = nargs == 2 ? PyObject_IsTrue(args[1]) : -1;
    if (blob == NULL || flush < 0 || !PyBytes_Check(blob) || PyBytes_GET_SIZE(blob) % (Py_ssize_t)sizeof(bound_t)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "replay(records, flush): bytes of whole records, a flag");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(blob) / (Py_ssize_t)sizeof(bound_t), k, bad = -1;
    const bound_t *rec = (const bound_t *)PyBytes_AS_STRING(blob);
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    unsigned old = _mm_getcsr();
    if (flush)
        _mm_setcsr(old | 0x8040u);  /* flush-to-zero (bit 15), denormals-are-zero (bit 6) */
    for (k = 0; k < n; k++) {
        bound_t b;
        memcpy(&b, rec + k, sizeof b);  /* (bytes' storage is not aligned for the struct's longs) */
        rc = invoke(&b);
        if (b.check && rc != 0) {
            bad = k;
            break;
        }
    }
    if (flush)  /* the caller's modes back; the exception flags the calls raised kept */
        _mm_setcsr((_mm_getcsr() & 0x3Fu) | (old & ~0x3Fu));
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(ni)", bad, bad < 0 ? 0 : rc);
}

/* record(taken, calls): start (lists) or stop (None, None) recording. */
static PyObject *record(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *t, *c;
    if (!PyArg_ParseTuple(args, "OO", &t, &c))
        return NULL;
    if ((t != Py_None && !PyList_Check(t)) || (c != Py_None && !PyList_Check(c))) {
        PyErr_SetString(PyExc_TypeError, "record(taken, calls): lists, or None to stop");
        return NULL;
    }
    Py_XDECREF(taken);
    Py_XDECREF(calls);
    taken = t == Py_None ? NULL : (Py_INCREF(t), t);
    calls = c == Py_None ? NULL : (Py_INCREF(c), c);
    Py_RETURN_NONE;
}
#endif

static PyMethodDef methods[] = {
    {"addr", addr, METH_O, "addr(array) -> int: the address of its first element (0 for None)."},
#if defined(__x86_64__) && !defined(_WIN32)
    {"bind", bind, METH_VARARGS, "bind(fn, ints, floats, x_at, y_at[, check]) -> record: a kernel call, its "
     "integer-class and float arguments in order, x and y to be put at ints[x_at], ints[y_at] (-1: none)."},
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL, "call(record, x, y) -> int: the bound call."},
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(records, flush) -> (index, status): bound calls end to end, in one go."},
    {"record", record, METH_VARARGS, "record(taken, calls): keep what addr()/call() see in lists; None, None stops."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_addr", NULL, -1, methods};

PyMODINIT_FUNC PyInit__addr(void) { return PyModule_Create(&module); }
