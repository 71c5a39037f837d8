/* The event queue of npusim's SimPy environment (npusim/engine/events.py holds its
   rules), and the loop that runs it.

   SimPy keeps its queue as a heap of (time, priority, id, event) tuples in a list:
   an event's place is fixed by its time, then its priority, then the order it was
   scheduled in (the id, from one counter). This heap orders entries by the same
   three keys, compared in C: the times are ints or floats, and an int below 2^53
   converts to a double exactly, so comparing doubles orders them as Python
   compares the numbers (a larger int - a flow at a vanishing rate ends that late -
   is compared as Python compares it where its double ties). Each entry keeps the time object itself, so env.now takes
   the very value (and type) that was scheduled. The ids are unique, so every pop
   order is the same as SimPy's. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define EXACT (9007199254740992.0) /* 2^53: ints up to this convert to doubles exactly */

typedef struct {
    double key;
    int inexact;      /* an int beyond 2^53: its key is rounded */
    int64_t priority;
    int64_t id;
    PyObject *time;
    PyObject *event;
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *heap;
    Py_ssize_t n, size;
    int64_t next_id;
} Queue;

static PyObject *s_now, *s_callbacks, *s_ok;

static inline int before(const Entry *a, const Entry *b) {
    if (a->key != b->key) return a->key < b->key;  /* rounding keeps order: no tie broken wrongly */
    if (a->inexact | b->inexact) {  /* ints and floats compare exactly (and cannot fail) */
        if (PyObject_RichCompareBool(a->time, b->time, Py_LT) == 1) return 1;
        if (PyObject_RichCompareBool(b->time, a->time, Py_LT) == 1) return 0;
    }
    if (a->priority != b->priority) return a->priority < b->priority;
    return a->id < b->id;
}

static void queue_dealloc(Queue *q) {
    for (Py_ssize_t i = 0; i < q->n; i++) {
        Py_DECREF(q->heap[i].time);
        Py_DECREF(q->heap[i].event);
    }
    PyMem_Free(q->heap);
    Py_TYPE(q)->tp_free((PyObject *)q);
}

static int key_of(PyObject *time, double *key, int *inexact) {
    if (PyLong_CheckExact(time) || PyFloat_Check(time)) {
        *key = PyFloat_AsDouble(time);
        if (*key == -1.0 && PyErr_Occurred()) return -1;
        *inexact = PyLong_CheckExact(time) && (*key > EXACT || *key < -EXACT);
        if (*key != *key) {
            PyErr_SetString(PyExc_ValueError, "event queue: a time that is not a number");
            return -1;
        }
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "event queue: a time must be an int or a float, got %.100s", Py_TYPE(time)->tp_name);
    return -1;
}

/* push(time, priority, event): schedule `event` at `time` (the next id breaks ties) */
static PyObject *queue_push(Queue *q, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "push(time, priority, event)"); return NULL; }
    Entry e;
    if (key_of(args[0], &e.key, &e.inexact) < 0) return NULL;
    e.priority = PyLong_AsLongLong(args[1]);
    if (e.priority == -1 && PyErr_Occurred()) return NULL;
    if (q->n == q->size) {
        Py_ssize_t size = q->size ? 2 * q->size : 256;
        Entry *grown = PyMem_Realloc(q->heap, (size_t)size * sizeof(Entry));
        if (!grown) return PyErr_NoMemory();
        q->heap = grown;
        q->size = size;
    }
    e.id = q->next_id++;
    e.time = Py_NewRef(args[0]);
    e.event = Py_NewRef(args[2]);
    Py_ssize_t i = q->n++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!before(&e, &q->heap[parent])) break;
        q->heap[i] = q->heap[parent];
        i = parent;
    }
    q->heap[i] = e;
    Py_RETURN_NONE;
}

/* the first entry, taken off the heap (references handed to the caller); n > 0 */
static Entry take(Queue *q) {
    Entry top = q->heap[0];
    Entry last = q->heap[--q->n];
    Py_ssize_t i = 0, n = q->n;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && before(&q->heap[c + 1], &q->heap[c])) c++;
        if (!before(&q->heap[c], &last)) break;
        q->heap[i] = q->heap[c];
        i = c;
    }
    if (n) q->heap[i] = last;
    return top;
}

/* pop() -> (time, event) of the first entry; IndexError if there is none */
static PyObject *queue_pop(Queue *q, PyObject *unused) {
    if (!q->n) { PyErr_SetString(PyExc_IndexError, "pop from an empty event queue"); return NULL; }
    Entry e = take(q);
    PyObject *out = PyTuple_Pack(2, e.time, e.event);
    Py_DECREF(e.time);
    Py_DECREF(e.event);
    return out;
}

/* run(env): process the events in order until none is left, as SimPy's Environment.step
   does one at a time: env._now becomes the event's time, its callbacks are called with
   it. Returns None, or the first processed event that failed and was not defused (the
   caller raises its error). */
static PyObject *queue_run(Queue *q, PyObject *env) {
    while (q->n) {
        Entry e = take(q);
        PyObject *callbacks = NULL, *ok = NULL;
        if (PyObject_SetAttr(env, s_now, e.time) < 0) goto fail;
        callbacks = PyObject_GetAttr(e.event, s_callbacks);
        if (!callbacks || PyObject_SetAttr(e.event, s_callbacks, Py_None) < 0) goto fail;
        if (!PyList_Check(callbacks)) {
            PyErr_SetString(PyExc_RuntimeError, "event queue: an event was processed twice");
            goto fail;
        }
        /* callbacks may be added while it runs (an event handed to a process that is
           already processed is not): walk the list as it is */
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(callbacks); k++) {
            PyObject *callback = Py_NewRef(PyList_GET_ITEM(callbacks, k));
            PyObject *res = PyObject_CallOneArg(callback, e.event);
            Py_DECREF(callback);
            if (!res) goto fail;
            Py_DECREF(res);
        }
        ok = PyObject_GetAttr(e.event, s_ok);
        if (!ok) goto fail;
        if (ok != Py_True) {
            int truth = PyObject_IsTrue(ok);
            if (truth < 0) goto fail;
            if (!truth) {
                Py_DECREF(callbacks);
                Py_DECREF(ok);
                Py_DECREF(e.time);
                return e.event;  /* the caller checks _defused and raises */
            }
        }
        Py_DECREF(ok);
        Py_DECREF(callbacks);
        Py_DECREF(e.time);
        Py_DECREF(e.event);
        continue;
    fail:
        Py_XDECREF(callbacks);
        Py_XDECREF(ok);
        Py_DECREF(e.time);
        Py_DECREF(e.event);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *queue_peek(Queue *q, PyObject *unused) {
    if (!q->n) { PyErr_SetString(PyExc_IndexError, "peek into an empty event queue"); return NULL; }
    return Py_NewRef(q->heap[0].time);
}

static Py_ssize_t queue_len(Queue *q) { return q->n; }

static PyMethodDef queue_methods[] = {
    {"push", (PyCFunction)(void (*)(void))queue_push, METH_FASTCALL, "push(time, priority, event)"},
    {"pop", (PyCFunction)queue_pop, METH_NOARGS, "pop() -> (time, event) of the first entry"},
    {"peek", (PyCFunction)queue_peek, METH_NOARGS, "the first entry's time"},
    {"run", (PyCFunction)queue_run, METH_O,
     "run(env): process every event in order; None, or the first failed event not defused"},
    {NULL},
};

static PySequenceMethods queue_as_sequence = {
    .sq_length = (lenfunc)queue_len,
};

static PyTypeObject QueueType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._queue.Queue",
    .tp_basicsize = sizeof(Queue),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Queue(): events by (time, priority, order scheduled), as SimPy orders them",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)queue_dealloc,
    .tp_methods = queue_methods,
    .tp_as_sequence = &queue_as_sequence,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_queue", "The event queue and its loop, in C.", -1,
                                    NULL};

PyMODINIT_FUNC PyInit__queue(void) {
    s_now = PyUnicode_InternFromString("_now");
    s_callbacks = PyUnicode_InternFromString("callbacks");
    s_ok = PyUnicode_InternFromString("_ok");
    if (!s_now || !s_callbacks || !s_ok) return NULL;
    if (PyType_Ready(&QueueType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&QueueType);
    if (PyModule_AddObject(m, "Queue", (PyObject *)&QueueType) < 0) {
        Py_DECREF(&QueueType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
