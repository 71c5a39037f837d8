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
   order is the same as SimPy's.

   Signal is the engine's cheap event (events.py says what it is for): the fields the
   loop and SimPy's Process read of an event (env, callbacks, _ok, _value) and
   fire(); the loop reads a Signal's fields directly. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <structmember.h>

#define EXACT (9007199254740992.0) /* 2^53: ints up to this convert to doubles exactly */

typedef struct {
    double key;
    int inexact;      /* an int of 2^53 or more: its key may be rounded */
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

/* x < y for times (exact ints, floats): by int's and float's own comparisons, which are
   exact and run no Python - a float subclass's __lt__ or __gt__ would, in the middle of a
   sift, and could push onto this queue there */
static int time_lt(PyObject *x, PyObject *y) {
    PyObject *r = PyLong_CheckExact(x) && PyLong_CheckExact(y) ? PyLong_Type.tp_richcompare(x, y, Py_LT)
                  : PyLong_CheckExact(x) ? PyFloat_Type.tp_richcompare(y, x, Py_GT)
                  : PyFloat_Type.tp_richcompare(x, y, Py_LT);
    if (!r) { PyErr_Clear(); return 0; }  /* (they cannot fail) */
    int lt = r == Py_True;
    Py_DECREF(r);
    return lt;
}

static inline int before(const Entry *a, const Entry *b) {
    if (a->key != b->key) return a->key < b->key;  /* rounding keeps order: no tie broken wrongly */
    if (a->inexact | b->inexact) {  /* ints and floats compare exactly (and cannot fail) */
        if (time_lt(a->time, b->time)) return 1;
        if (time_lt(b->time, a->time)) return 0;
    }
    if (a->priority != b->priority) return a->priority < b->priority;
    return a->id < b->id;
}

/* The queue's events hold the environment that holds the queue (a Signal's env, a
   process's generator): a cycle the garbage collector must see, or a run abandoned with
   events left (engine.run's attempt after a divergence) is never freed. */
static int queue_traverse(Queue *q, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < q->n; i++) {
        Py_VISIT(q->heap[i].time);
        Py_VISIT(q->heap[i].event);
    }
    return 0;
}

/* every entry dropped; the heap is detached first, so an event's finaliser that
   schedules on this queue finds it empty, not half cleared */
static int queue_clear(Queue *q) {
    Entry *heap = q->heap;
    Py_ssize_t n = q->n;
    q->heap = NULL;
    q->n = q->size = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(heap[i].time);
        Py_DECREF(heap[i].event);
    }
    PyMem_Free(heap);
    return 0;
}

static void queue_dealloc(Queue *q) {
    PyObject_GC_UnTrack(q);
    queue_clear(q);
    Py_TYPE(q)->tp_free((PyObject *)q);
}

static int key_of(PyObject *time, double *key, int *inexact) {
    if (PyLong_CheckExact(time) || PyFloat_Check(time)) {
        *key = PyFloat_AsDouble(time);
        if (*key == -1.0 && PyErr_Occurred()) return -1;
        /* an int whose double is 2^53 or more may have been rounded (2^53 + 1 is) */
        *inexact = PyLong_CheckExact(time) && (*key >= EXACT || *key <= -EXACT);
        if (*key != *key) {
            PyErr_SetString(PyExc_ValueError, "event queue: a time that is not a number");
            return -1;
        }
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "event queue: a time must be an int or a float, got %.100s", Py_TYPE(time)->tp_name);
    return -1;
}

/* schedule `event` at `time` with `priority` (the next id breaks ties) */
static int push(Queue *q, PyObject *time, int64_t priority, PyObject *event) {
    Entry e;
    if (key_of(time, &e.key, &e.inexact) < 0) return -1;
    e.priority = priority;
    if (q->n == q->size) {
        Py_ssize_t size = q->size ? 2 * q->size : 256;
        Entry *grown = PyMem_Realloc(q->heap, (size_t)size * sizeof(Entry));
        if (!grown) { PyErr_NoMemory(); return -1; }
        q->heap = grown;
        q->size = size;
    }
    e.id = q->next_id++;
    e.time = Py_NewRef(time);
    e.event = Py_NewRef(event);
    Py_ssize_t i = q->n++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!before(&e, &q->heap[parent])) break;
        q->heap[i] = q->heap[parent];
        i = parent;
    }
    q->heap[i] = e;
    return 0;
}

/* push(time, priority, event) */
static PyObject *queue_push(Queue *q, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "push(time, priority, event)"); return NULL; }
    long long priority = PyLong_AsLongLong(args[1]);
    if (priority == -1 && PyErr_Occurred()) return NULL;
    if (push(q, args[0], priority, args[2]) < 0) return NULL;
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

/* ------------------------------------------------------------------ Signal */

/* SimPy's priorities (simpy.core): URGENT 0, NORMAL 1 */
#define NORMAL 1

static PyTypeObject QueueType;

typedef struct {
    PyObject_HEAD
    PyObject *env;
    PyObject *callbacks;   /* a list until the loop processes it, then None */
    PyObject *ok;          /* always True: a Signal never fails */
    PyObject *value;
} Signal;

static PyTypeObject SignalType;
static PyObject *s_queue;

static int signal_traverse(Signal *g, visitproc visit, void *arg) {
    Py_VISIT(g->env);
    Py_VISIT(g->callbacks);
    Py_VISIT(g->value);
    return 0;
}

static int signal_clear(Signal *g) {
    Py_CLEAR(g->env);
    Py_CLEAR(g->callbacks);
    Py_CLEAR(g->value);
    return 0;
}

static void signal_dealloc(Signal *g) {
    PyObject_GC_UnTrack(g);
    signal_clear(g);
    Py_CLEAR(g->ok);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

static Signal *signal_make(PyObject *env) {
    Signal *g = PyObject_GC_New(Signal, &SignalType);
    if (!g) return NULL;
    g->env = Py_NewRef(env);
    g->callbacks = PyList_New(0);
    g->ok = Py_NewRef(Py_True);
    g->value = Py_NewRef(Py_None);
    if (!g->callbacks) { Py_DECREF(g); return NULL; }
    PyObject_GC_Track(g);
    return g;
}

static PyObject *signal_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *env;
    if (kwds && PyDict_GET_SIZE(kwds)) { PyErr_SetString(PyExc_TypeError, "Signal(env)"); return NULL; }
    if (!PyArg_ParseTuple(args, "O:Signal", &env)) return NULL;
    return (PyObject *)signal_make(env);
}

/* the environment's queue (an events.Environment's) */
static Queue *queue_of(PyObject *env) {
    PyObject *q = PyObject_GetAttr(env, s_queue);
    if (!q) return NULL;
    if (!PyObject_TypeCheck(q, &QueueType)) {
        Py_DECREF(q);
        PyErr_SetString(PyExc_TypeError, "Signal: its environment must be an npusim.engine.events.Environment");
        return NULL;
    }
    return (Queue *)q;
}

/* schedule `g` at env._now + delay (delay NULL: now); a negative or NaN delay is a
   ValueError, as SimPy's Timeout makes it (the clock never runs back) */
static int schedule(Signal *g, PyObject *delay) {
    if (delay) {
        double d = PyFloat_AsDouble(delay);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        if (!(d >= 0.0)) {
            PyErr_Format(PyExc_ValueError, "after/at_delay: delay %R is %s (an event is never scheduled before now)",
                         delay, d != d ? "NaN" : "negative");
            return -1;
        }
    }
    Queue *q = queue_of(g->env);
    if (!q) return -1;
    PyObject *now = PyObject_GetAttr(g->env, s_now);
    PyObject *at = !now ? NULL : delay ? PyNumber_Add(now, delay) : Py_NewRef(now);
    Py_XDECREF(now);
    int bad = !at || push(q, at, NORMAL, (PyObject *)g) < 0;
    Py_XDECREF(at);
    Py_DECREF(q);
    return bad ? -1 : 0;
}

/* fire(value=None): schedule it now with `value`, as Event.succeed(value) would */
static PyObject *signal_fire(Signal *g, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 1) { PyErr_SetString(PyExc_TypeError, "fire(value=None)"); return NULL; }
    Py_XSETREF(g->value, Py_NewRef(nargs ? args[0] : Py_None));
    if (schedule(g, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

/* after(env, delay): a Signal that fires `delay` from now, where a Timeout made now would */
static PyObject *after(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "after(env, delay)"); return NULL; }
    Signal *g = signal_make(args[0]);
    if (!g) return NULL;
    if (schedule(g, args[1]) < 0) { Py_DECREF(g); return NULL; }
    return (PyObject *)g;
}

/* at_delay(env, delay, callback): callback(signal) `delay` from now, where a Timeout
   made now would fire (after(env, delay) with the callback on it) */
static PyObject *at_delay(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "at_delay(env, delay, callback)"); return NULL; }
    Signal *g = signal_make(args[0]);
    if (!g) return NULL;
    int bad = PyList_Append(g->callbacks, args[2]) < 0 || schedule(g, args[1]) < 0;
    Py_DECREF(g);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

static PyMemberDef signal_members[] = {
    {"env", T_OBJECT, offsetof(Signal, env), READONLY, "its environment"},
    {"callbacks", T_OBJECT, offsetof(Signal, callbacks), 0, "called with it when processed; None after"},
    {"_ok", T_OBJECT, offsetof(Signal, ok), READONLY, "True: a Signal never fails"},
    {"_value", T_OBJECT, offsetof(Signal, value), 0, "the value it fired with"},
    {NULL},
};

static PyMethodDef signal_methods[] = {
    {"fire", (PyCFunction)(void (*)(void))signal_fire, METH_FASTCALL,
     "fire(value=None): schedule it now with value, as Event.succeed(value) would"},
    {NULL},
};

static PyTypeObject SignalType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._queue.Signal",
    .tp_basicsize = sizeof(Signal),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Signal(env): an event a process may yield or callbacks hang on; fire() schedules it",
    .tp_new = signal_new,
    .tp_dealloc = (destructor)signal_dealloc,
    .tp_traverse = (traverseproc)signal_traverse,
    .tp_clear = (inquiry)signal_clear,
    .tp_members = signal_members,
    .tp_methods = signal_methods,
};

/* run(env): process the events in order until none is left, as SimPy's Environment.step
   does one at a time: env._now becomes the event's time, its callbacks are called with
   it. Returns None, or the first processed event that failed and was not defused (the
   caller raises its error). */
static PyObject *queue_run(Queue *q, PyObject *env) {
    while (q->n) {
        Entry e = take(q);
        PyObject *callbacks = NULL, *ok = NULL;
        if (PyObject_SetAttr(env, s_now, e.time) < 0) goto fail;
        int is_signal = Py_IS_TYPE(e.event, &SignalType);
        if (is_signal) {  /* its fields, directly */
            Signal *g = (Signal *)e.event;
            callbacks = g->callbacks;
            g->callbacks = Py_NewRef(Py_None);
        } else {
            callbacks = PyObject_GetAttr(e.event, s_callbacks);
            if (!callbacks || PyObject_SetAttr(e.event, s_callbacks, Py_None) < 0) goto fail;
        }
        if (!callbacks) {
            PyErr_SetString(PyExc_RuntimeError, "event queue: an event without callbacks");
            goto fail;
        }
        if (callbacks == Py_None) {
            PyErr_SetString(PyExc_RuntimeError, "event queue: an event was processed twice");
            goto fail;
        }
        if (!PyList_Check(callbacks)) {
            PyErr_Format(PyExc_TypeError, "event queue: an event's callbacks must be a list, got %.100s",
                         Py_TYPE(callbacks)->tp_name);
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
        if (is_signal) {  /* never fails */
            Py_DECREF(callbacks);
            Py_DECREF(e.time);
            Py_DECREF(e.event);
            continue;
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
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Queue(): events by (time, priority, order scheduled), as SimPy orders them",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)queue_dealloc,
    .tp_traverse = (traverseproc)queue_traverse,
    .tp_clear = (inquiry)queue_clear,
    .tp_methods = queue_methods,
    .tp_as_sequence = &queue_as_sequence,
};

static PyMethodDef module_methods[] = {
    {"after", (PyCFunction)(void (*)(void))after, METH_FASTCALL,
     "after(env, delay): a Signal that fires delay from now, where a Timeout made now would"},
    {"at_delay", (PyCFunction)(void (*)(void))at_delay, METH_FASTCALL,
     "at_delay(env, delay, callback): callback(signal) delay from now, where a Timeout made now would fire"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_queue", "The event queue, its loop and Signal, in C.",
                                    -1, module_methods};

PyMODINIT_FUNC PyInit__queue(void) {
    s_now = PyUnicode_InternFromString("_now");
    s_callbacks = PyUnicode_InternFromString("callbacks");
    s_ok = PyUnicode_InternFromString("_ok");
    s_queue = PyUnicode_InternFromString("_queue");
    if (!s_now || !s_callbacks || !s_ok || !s_queue) return NULL;
    if (PyType_Ready(&QueueType) < 0 || PyType_Ready(&SignalType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Queue", (PyObject *)&QueueType) < 0 ||
        PyModule_AddObjectRef(m, "Signal", (PyObject *)&SignalType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
