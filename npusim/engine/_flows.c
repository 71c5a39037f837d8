/* The flow model's arithmetic (npusim/engine/flows.py holds the model and its rules).

   A link's flows are grouped in cap classes (flows with one cap get one rate); each
   class keeps a virtual clock (bytes one of its flows has received) and a heap of its
   flows by (finish clock, start order). On every start and end the link is shared out
   again by water-filling, smallest cap first, and the next completion is found.

   Every operation is done in the order, and with the operands, of the Python it
   replaced, in doubles: Python's floats are doubles, and the integers involved (bytes,
   cycles, caps) are far below 2^53, where int and double arithmetic agree. So the
   times and rates are the same to the last bit. The rounding of a completion to whole
   cycles is npusim.engine.cycles.whole_cycles, called for the rare case its fast test
   cannot decide. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

/* whole_cycles' fast test: a ceiling this far (1 - 1e-6) above x needs no rounding */
#define CLEAR (1e-6)
/* a flow counts as finished when what it still has to move would take less than this
   many cycles (flows.py: _DONE_SLACK_CYCLES) */
#define DONE_SLACK_CYCLES (1e-6)

typedef struct {
    double key;       /* the class clock at which the flow has moved all its bytes */
    int64_t seq;      /* start order: ties end in the order flows started */
    int64_t weight;   /* flows it stands for (a group's members) */
    PyObject *on_done;
} Flow;

typedef struct {
    double cap, rate, clock;
    int64_t count;    /* flows in the class, weighted */
    Flow *heap;
    Py_ssize_t n, size;
} CapClass;

typedef struct {
    PyObject_HEAD
    double capacity, t, timer_at;
    int64_t seq;
    CapClass *classes;    /* ascending cap */
    Py_ssize_t n_classes;
    PyObject *samples;    /* list of (cycle, bytes per cycle in use), or NULL */
    PyObject *whole;      /* npusim.engine.cycles.whole_cycles */
} Flows;

static int flow_before(const Flow *a, const Flow *b) {
    return a->key < b->key || (a->key == b->key && a->seq < b->seq);
}

static int heap_push(CapClass *c, Flow f) {
    if (c->n == c->size) {
        Py_ssize_t size = c->size ? 2 * c->size : 16;
        Flow *grown = PyMem_Realloc(c->heap, (size_t)size * sizeof(Flow));
        if (!grown) { PyErr_NoMemory(); return -1; }
        c->heap = grown;
        c->size = size;
    }
    Py_ssize_t i = c->n++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!flow_before(&f, &c->heap[parent])) break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = f;
    return 0;
}

static Flow heap_pop(CapClass *c) {
    Flow top = c->heap[0], last = c->heap[--c->n];
    Py_ssize_t i = 0, n = c->n;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && flow_before(&c->heap[child + 1], &c->heap[child])) child++;
        if (!flow_before(&c->heap[child], &last)) break;
        c->heap[i] = c->heap[child];
        i = child;
    }
    if (n) c->heap[i] = last;
    return top;
}

/* whole_cycles(x) as a double (-1 with an exception set on error) */
static double whole(Flows *f, double x) {
    double c = ceil(x);
    if (c == x || c - x < 1.0 - CLEAR) return c;
    PyObject *r = PyObject_CallFunction(f->whole, "d", x);
    if (!r) return -1;
    double v = PyFloat_AsDouble(r);
    Py_DECREF(r);
    return v;
}

static void advance(Flows *f, double now) {
    double dt = now - f->t;
    if (dt > 0)
        for (Py_ssize_t i = 0; i < f->n_classes; i++)
            if (f->classes[i].count) f->classes[i].clock += f->classes[i].rate * dt;
    f->t = now;
}

/* Share the link out again and find the next completion. Returns the cycle the timer
   must be set to as a new reference (a Python int), Py_None if it stays as it is, or
   NULL on error. */
static PyObject *reschedule(Flows *f, PyObject *now_obj, double now) {
    double remaining = f->capacity, used = 0.0, nxt = INFINITY;
    int64_t n = 0;
    for (Py_ssize_t i = 0; i < f->n_classes; i++) n += f->classes[i].count;
    for (Py_ssize_t i = 0; i < f->n_classes; i++) {
        CapClass *c = &f->classes[i];
        if (!c->count) continue;
        double fair = remaining / (double)n;
        double rate = c->rate = c->cap <= fair ? c->cap : fair;
        remaining -= rate * (double)c->count;
        used += rate * (double)c->count;
        n -= c->count;
        double dt = (c->heap[0].key - c->clock) / rate;
        if (dt < nxt) nxt = dt;
    }
    if (f->samples) {
        PyObject *sample = Py_BuildValue("(Od)", now_obj, used);
        if (!sample || PyList_Append(f->samples, sample) < 0) { Py_XDECREF(sample); return NULL; }
        Py_DECREF(sample);
    }
    if (nxt == INFINITY) {  /* no flow in flight (or none that could end) */
        f->timer_at = INFINITY;
        Py_RETURN_NONE;
    }
    double when = whole(f, now + (0.0 > nxt ? 0.0 : nxt));  /* Python's max(nxt, 0.0) */
    if (when < 0 && PyErr_Occurred()) return NULL;
    if (when == f->timer_at) Py_RETURN_NONE;
    f->timer_at = when;
    return PyLong_FromDouble(when);
}

static int flows_init(Flows *f, PyObject *args, PyObject *kwds) {
    PyObject *samples, *whole_fn;
    if (!PyArg_ParseTuple(args, "dOO", &f->capacity, &samples, &whole_fn)) return -1;
    f->t = 0.0;
    f->timer_at = INFINITY;
    f->seq = 0;
    Py_CLEAR(f->samples);
    Py_CLEAR(f->whole);
    f->samples = samples == Py_None ? NULL : Py_NewRef(samples);
    f->whole = Py_NewRef(whole_fn);
    return 0;
}

static void flows_dealloc(Flows *f) {
    for (Py_ssize_t i = 0; i < f->n_classes; i++) {
        for (Py_ssize_t k = 0; k < f->classes[i].n; k++) Py_DECREF(f->classes[i].heap[k].on_done);
        PyMem_Free(f->classes[i].heap);
    }
    PyMem_Free(f->classes);
    Py_XDECREF(f->samples);
    Py_XDECREF(f->whole);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* add(now, nbytes, cap, on_done, weight) -> the new timer cycle or None */
static PyObject *flows_add(Flows *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "Flows.add(now, nbytes, cap, on_done, weight)");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[0]), nbytes = PyFloat_AsDouble(args[1]), cap = PyFloat_AsDouble(args[2]);
    int64_t weight = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    advance(f, now);
    Py_ssize_t i = 0;
    while (i < f->n_classes && f->classes[i].cap != cap) i++;
    if (i == f->n_classes) {  /* a new class, kept in ascending cap order */
        CapClass *grown = PyMem_Realloc(f->classes, (size_t)(f->n_classes + 1) * sizeof(CapClass));
        if (!grown) return PyErr_NoMemory();
        f->classes = grown;
        i = 0;
        while (i < f->n_classes && f->classes[i].cap <= cap) i++;
        memmove(&f->classes[i + 1], &f->classes[i], (size_t)(f->n_classes - i) * sizeof(CapClass));
        f->n_classes++;
        f->classes[i] = (CapClass){.cap = cap, .rate = 0.0, .clock = 0.0, .count = 0, .heap = NULL, .n = 0, .size = 0};
    }
    CapClass *c = &f->classes[i];
    Flow flow = {.key = c->clock + nbytes, .seq = ++f->seq, .weight = weight, .on_done = Py_NewRef(args[3])};
    if (heap_push(c, flow) < 0) { Py_DECREF(flow.on_done); return NULL; }
    c->count += weight;
    return reschedule(f, args[0], now);
}

/* timer(now, when) -> None if a later reschedule superseded this timer, else
   (callbacks of the flows that ended, in order; the new timer cycle or None) */
static PyObject *flows_timer(Flows *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "Flows.timer(now, when)");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[0]), when = PyFloat_AsDouble(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (when != f->timer_at) Py_RETURN_NONE;
    f->timer_at = INFINITY;
    advance(f, now);
    PyObject *finished = PyList_New(0);
    if (!finished) return NULL;
    for (Py_ssize_t i = 0; i < f->n_classes; i++) {
        CapClass *c = &f->classes[i];
        double done_at = c->clock + c->rate * DONE_SLACK_CYCLES;
        while (c->n) {
            double key = c->heap[0].key;
            if (!(key <= done_at)) {  /* or it would end within this cycle, as reschedule rounds it */
                double end = whole(f, now + (key - c->clock) / c->rate);
                if (end < 0 && PyErr_Occurred()) { Py_DECREF(finished); return NULL; }
                if (!(end <= now)) break;
            }
            Flow flow = heap_pop(c);
            c->count -= flow.weight;
            int bad = PyList_Append(finished, flow.on_done);
            Py_DECREF(flow.on_done);
            if (bad < 0) { Py_DECREF(finished); return NULL; }
        }
        if (!c->count) c->clock = 0.0;  /* keep the clocks small; the class is empty */
    }
    PyObject *next = reschedule(f, args[0], now);
    if (!next) { Py_DECREF(finished); return NULL; }
    return Py_BuildValue("(NN)", finished, next);
}

static PyObject *flows_get_active(Flows *f, void *closure) {
    int64_t n = 0;
    for (Py_ssize_t i = 0; i < f->n_classes; i++) n += f->classes[i].count;
    return PyLong_FromLongLong(n);
}

static PyMethodDef flows_methods[] = {
    {"add", (PyCFunction)(void (*)(void))flows_add, METH_FASTCALL, "start a flow; the new timer cycle or None"},
    {"timer", (PyCFunction)(void (*)(void))flows_timer, METH_FASTCALL, "a timer fired: the ended flows' callbacks"},
    {NULL},
};

static PyGetSetDef flows_getset[] = {
    {"active", (getter)flows_get_active, NULL, "flows in flight, weighted", NULL},
    {NULL},
};

static PyTypeObject FlowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._flows.Flows",
    .tp_basicsize = sizeof(Flows),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Flows(capacity, samples list or None, whole_cycles): a link's flows",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)flows_init,
    .tp_dealloc = (destructor)flows_dealloc,
    .tp_methods = flows_methods,
    .tp_getset = flows_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_flows", "The flow model's arithmetic in C.", -1, NULL};

PyMODINIT_FUNC PyInit__flows(void) {
    if (PyType_Ready(&FlowsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&FlowsType);
    if (PyModule_AddObject(m, "Flows", (PyObject *)&FlowsType) < 0) {
        Py_DECREF(&FlowsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
