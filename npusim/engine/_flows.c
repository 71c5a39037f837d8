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
    PyObject *env;        /* the link's environment (an events.Environment) */
    PyObject *at_delay;   /* npusim.engine.events.at_delay: a callback `delay` from now */
    int in_whole;         /* whole_cycles is being called: the classes must stay as they are */
} Flows;

static PyTypeObject FlowsType, TimerType;
static PyObject *s_now;

/* A link's timer: set for cycle `when`, called with the Signal when it fires */
typedef struct {
    PyObject_HEAD
    Flows *flows;
    PyObject *when;
} Timer;

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
    f->in_whole = 1;  /* a start from inside it would move the classes the caller walks */
    PyObject *r = PyObject_CallFunction(f->whole, "d", x);
    f->in_whole = 0;
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
    PyObject *samples, *whole_fn, *env, *at_delay;
    double capacity;
    if (!PyArg_ParseTuple(args, "dOOOO", &capacity, &samples, &whole_fn, &env, &at_delay)) return -1;
    if (f->env) {  /* its flows' clocks and its timer are the link's as it was */
        PyErr_SetString(PyExc_TypeError, "Flows: already initialised");
        return -1;
    }
    if (!(capacity >= 0.0)) {  /* NaN too */
        PyErr_Format(PyExc_ValueError, "Flows: capacity %R bytes per cycle, expected a number >= 0",
                     PyTuple_GET_ITEM(args, 0));
        return -1;
    }
    if (samples != Py_None && !PyList_Check(samples)) {
        PyErr_Format(PyExc_TypeError, "Flows: samples must be a list or None, got %.100s", Py_TYPE(samples)->tp_name);
        return -1;
    }
    f->capacity = capacity;
    f->t = 0.0;
    f->timer_at = INFINITY;
    f->seq = 0;
    f->samples = samples == Py_None ? NULL : Py_NewRef(samples);
    f->whole = Py_NewRef(whole_fn);
    f->env = Py_NewRef(env);
    f->at_delay = Py_NewRef(at_delay);
    return 0;
}

/* the flows' callbacks hold what holds the link (its memory system, ...), and the
   environment's queue holds the link's timers: cycles the garbage collector must see */
static int flows_traverse(Flows *f, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < f->n_classes; i++)
        for (Py_ssize_t k = 0; k < f->classes[i].n; k++) Py_VISIT(f->classes[i].heap[k].on_done);
    Py_VISIT(f->samples); Py_VISIT(f->whole); Py_VISIT(f->env); Py_VISIT(f->at_delay);
    return 0;
}

static int flows_clear(Flows *f) {
    for (Py_ssize_t i = 0; i < f->n_classes; i++) {
        CapClass *c = &f->classes[i];
        Py_ssize_t n = c->n;
        c->n = 0;
        c->count = 0;
        for (Py_ssize_t k = 0; k < n; k++) Py_DECREF(c->heap[k].on_done);
    }
    Py_CLEAR(f->samples); Py_CLEAR(f->whole); Py_CLEAR(f->env); Py_CLEAR(f->at_delay);
    return 0;
}

static void flows_dealloc(Flows *f) {
    PyObject_GC_UnTrack(f);
    flows_clear(f);
    for (Py_ssize_t i = 0; i < f->n_classes; i++) PyMem_Free(f->classes[i].heap);
    PyMem_Free(f->classes);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* Start a flow at `now_obj`: the new timer cycle (a new reference), Py_None, or NULL */
static PyObject *add_flow(Flows *f, PyObject *now_obj, PyObject *nbytes_obj, PyObject *cap_obj, PyObject *on_done,
                          PyObject *weight_obj) {
    double now = PyFloat_AsDouble(now_obj), nbytes = PyFloat_AsDouble(nbytes_obj), cap = PyFloat_AsDouble(cap_obj);
    int64_t weight = PyLong_AsLongLong(weight_obj);
    if (PyErr_Occurred()) return NULL;
    /* a flow that could never end (or would end before it starts) is refused: its rest
       over its rate is when it ends */
    if (!(f->capacity > 0.0)) {
        PyErr_SetString(PyExc_ValueError, "Flows.start: the link moves 0 bytes per cycle: no flow on it would end");
        return NULL;
    }
    if (!(nbytes >= 0.0 && nbytes < INFINITY)) {
        PyErr_Format(PyExc_ValueError, "Flows.start: nbytes %R, expected a finite number >= 0", nbytes_obj);
        return NULL;
    }
    if (!(cap > 0.0)) {
        PyErr_Format(PyExc_ValueError, "Flows.start: cap %R bytes per cycle, expected a number > 0 (or inf)", cap_obj);
        return NULL;
    }
    /* nor one that alone on the link would take longer than a double holds (1e10 bytes at
       5e-324 bytes per cycle): its end is never found, as at a rate of 0 */
    if (!(nbytes / (cap < f->capacity ? cap : f->capacity) < INFINITY)) {
        PyObject *capacity = PyFloat_FromDouble(f->capacity);
        if (capacity)
            PyErr_Format(PyExc_ValueError, "Flows.start: nbytes %R at cap %R on a link of %R bytes per cycle: more "
                         "cycles than a double holds (it would never end)", nbytes_obj, cap_obj, capacity);
        Py_XDECREF(capacity);
        return NULL;
    }
    int64_t total = 0;
    for (Py_ssize_t k = 0; k < f->n_classes; k++) total += f->classes[k].count;
    if (weight < 1 || __builtin_add_overflow(total, weight, &total)) {
        PyErr_Format(PyExc_ValueError, "Flows.start: weight %R, expected 1 or more flows (and with those in flight "
                     "at most 2^63 - 1)", weight_obj);
        return NULL;
    }
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
    Flow flow = {.key = c->clock + nbytes, .seq = ++f->seq, .weight = weight, .on_done = Py_NewRef(on_done)};
    if (heap_push(c, flow) < 0) { Py_DECREF(flow.on_done); return NULL; }
    c->count += weight;
    return reschedule(f, now_obj, now);
}

/* Set the link's timer for cycle `when`: a Timer called `when - env.now` from now (an
   earlier timer still set finds itself superseded when it fires) */
static int set_timer(Flows *f, PyObject *when) {
    PyObject *now = PyObject_GetAttr(f->env, s_now);
    PyObject *delay = now ? PyNumber_Subtract(when, now) : NULL;
    Py_XDECREF(now);
    Timer *t = delay ? PyObject_GC_New(Timer, &TimerType) : NULL;
    if (!t) { Py_XDECREF(delay); return -1; }
    t->flows = (Flows *)Py_NewRef(f);
    t->when = Py_NewRef(when);
    PyObject_GC_Track(t);
    PyObject *call[3] = {f->env, delay, (PyObject *)t};
    PyObject *r = PyObject_Vectorcall(f->at_delay, call, 3, NULL);
    Py_DECREF(delay);
    Py_DECREF(t);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* a TypeError unless __init__ has given the link its environment (Flows.__new__ alone has none) */
static int not_initialised(Flows *f) {
    if (f && f->env) return 0;
    PyErr_SetString(PyExc_TypeError, "Flows: not initialised (Flows(capacity, samples, whole_cycles, env, at_delay) "
                                     "first)");
    return 1;
}

/* a RuntimeError if whole_cycles, called by the link, calls into it (`what`): the
   classes it walks would move under it */
static int reentered(Flows *f, const char *what) {
    if (!f->in_whole) return 0;
    PyErr_Format(PyExc_RuntimeError, "Flows: %s called from inside its whole_cycles", what);
    return 1;
}

/* start(nbytes, cap, on_done, weight=1): a flow of `nbytes` capped at `cap` bytes/cycle
   from now; on_done() when it ends */
static PyObject *flows_start(Flows *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "add(nbytes, cap, on_done, weight=1)");
        return NULL;
    }
    if (not_initialised(f) || reentered(f, "start")) return NULL;
    PyObject *now = PyObject_GetAttr(f->env, s_now);
    if (!now) return NULL;
    PyObject *one = NULL;
    if (nargs == 3 && !(one = PyLong_FromLong(1))) { Py_DECREF(now); return NULL; }
    PyObject *when = add_flow(f, now, args[0], args[1], args[2], nargs == 4 ? args[3] : one);
    Py_DECREF(now);
    Py_XDECREF(one);
    if (!when) return NULL;
    int bad = when != Py_None && set_timer(f, when) < 0;
    Py_DECREF(when);
    if (bad) {  /* no timer is set for it: the next start or timer sets one */
        f->timer_at = INFINITY;
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The timer set for `when_obj` fired at `now_obj`: None if a later reschedule superseded
   it, else the callbacks of the flows that ended, in order, with the new timer cycle or
   None in *next (new references) */
static PyObject *ended(Flows *f, PyObject *now_obj, PyObject *when_obj, PyObject **next) {
    double now = PyFloat_AsDouble(now_obj), when = PyFloat_AsDouble(when_obj);
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
    *next = reschedule(f, now_obj, now);
    if (!*next) { Py_DECREF(finished); return NULL; }
    return finished;
}

/* The timer fired: end the flows that have moved all their bytes, set the next timer,
   then call the ended flows' on_done() in the order they ended */
static PyObject *timer_call(Timer *t, PyObject *args, PyObject *kwds) {
    Flows *f = t->flows;
    if (not_initialised(f) || reentered(f, "a timer")) return NULL;
    PyObject *now = PyObject_GetAttr(f->env, s_now);
    if (!now) return NULL;
    PyObject *next = NULL, *finished = ended(f, now, t->when, &next);
    Py_DECREF(now);
    if (!finished || finished == Py_None) return finished;
    int bad = next != Py_None && set_timer(f, next) < 0;
    Py_DECREF(next);
    if (bad) f->timer_at = INFINITY;  /* none is set: the next start sets one */
    for (Py_ssize_t i = 0; !bad && i < PyList_GET_SIZE(finished); i++) {
        PyObject *r = PyObject_CallNoArgs(PyList_GET_ITEM(finished, i));
        bad = !r;
        Py_XDECREF(r);
    }
    Py_DECREF(finished);
    if (bad) return NULL;
    Py_RETURN_NONE;
}

static int timer_traverse(Timer *t, visitproc visit, void *arg) {
    Py_VISIT(t->flows); Py_VISIT(t->when);
    return 0;
}

static int timer_clear(Timer *t) {
    Py_CLEAR(t->flows); Py_CLEAR(t->when);
    return 0;
}

static void timer_dealloc(Timer *t) {
    PyObject_GC_UnTrack(t);
    timer_clear(t);
    PyObject_GC_Del(t);
}

static PyTypeObject TimerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._flows.Timer",
    .tp_basicsize = sizeof(Timer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "a link's timer, called with its Signal when it fires",
    .tp_call = (ternaryfunc)timer_call,
    .tp_traverse = (traverseproc)timer_traverse,
    .tp_clear = (inquiry)timer_clear,
    .tp_dealloc = (destructor)timer_dealloc,
};

static PyObject *flows_get_active(Flows *f, void *closure) {
    int64_t n = 0;
    for (Py_ssize_t i = 0; i < f->n_classes; i++) n += f->classes[i].count;
    return PyLong_FromLongLong(n);
}

static PyMethodDef flows_methods[] = {
    {"start", (PyCFunction)(void (*)(void))flows_start, METH_FASTCALL,
     "start(nbytes, cap, on_done, weight=1): a flow from now; on_done() when it ends"},
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
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)flows_traverse,
    .tp_clear = (inquiry)flows_clear,
    .tp_doc = "Flows(capacity, samples list or None, whole_cycles, env, at_delay): a link's flows and its timers",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)flows_init,
    .tp_dealloc = (destructor)flows_dealloc,
    .tp_methods = flows_methods,
    .tp_getset = flows_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_flows", "The flow model's arithmetic in C.", -1, NULL};

PyMODINIT_FUNC PyInit__flows(void) {
    if (PyType_Ready(&FlowsType) < 0 || PyType_Ready(&TimerType) < 0) return NULL;
    if (!(s_now = PyUnicode_InternFromString("_now"))) return NULL;
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
