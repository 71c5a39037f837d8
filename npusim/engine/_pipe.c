/* A pipe's walk through its instruction stream (npusim/engine/pipe.py holds the
   model and runs what this leaves to it).

   A Code is a compiled stream: per entry its kind and the fields the walk reads,
   loops holding the Code of their body. A Walker walks one pipe's Code for one core
   run: it does every entry that touches nothing but the pipe's own clock, its
   counters and its core's flags (fixed-cost instructions, flag sets, flag waits
   that find their set already there, loops) and returns the first entry it cannot
   do without simulated time (a GM copy, a wait that must block, a barrier, a
   cross-core flag) to pipe.py, which reads and writes the walker's clock and
   counters around it and calls run() again.

   Each operation is the one pipe.py did in Python, on the same operands, in the
   same order. The clock keeps Python's number types: it is an int until a float
   reaches it (int + int stays int, anything with a float is a float, ints far
   below 2^53 convert to doubles exactly, as Python converts them). The busy,
   wait and flop counters are Python floats, i.e. doubles. Bytes written into
   local buffers are whole numbers, summed per buffer as integers and added into
   the kernel's counters once, at the end (flush): a float sum of whole numbers
   below 2^53 is exact in any order, so the totals are the same. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* entry kinds, as pipe.code_of numbers them */
enum { K_FIXED = 0, K_RUN = 1, K_SET = 2, K_WAIT = 3, K_LOOP = 4, K_OTHER = 5 };

/* a number as Python holds it: an int (exact) or a float */
typedef struct {
    int is_float;
    int64_t i;
    double d;
} Num;

#define EXACT (9007199254740992LL) /* 2^53: ints up to this convert to doubles exactly */

static int num_from(PyObject *o, Num *out) {
    if (PyLong_CheckExact(o)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow || v > EXACT || v < -EXACT) {
            PyErr_SetString(PyExc_OverflowError, "pipe walk: a cycle count beyond 2^53");
            return -1;
        }
        if (v == -1 && PyErr_Occurred()) return -1;
        out->is_float = 0; out->i = v; out->d = 0.0;
        return 0;
    }
    if (PyFloat_Check(o)) {
        out->is_float = 1; out->i = 0; out->d = PyFloat_AS_DOUBLE(o);
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "pipe walk: expected an int or float cycle count, got %.100s",
                 Py_TYPE(o)->tp_name);
    return -1;
}

static PyObject *num_to(Num n) {
    return n.is_float ? PyFloat_FromDouble(n.d) : PyLong_FromLongLong(n.i);
}

static inline double num_double(Num n) {
    return n.is_float ? n.d : (double)n.i;
}

static int num_add(Num a, Num b, Num *out) {
    if (!a.is_float && !b.is_float) {
        int64_t s = a.i + b.i;
        if (s > EXACT || s < -EXACT) {
            PyErr_SetString(PyExc_OverflowError, "pipe walk: a cycle count beyond 2^53");
            return -1;
        }
        out->is_float = 0; out->i = s; out->d = 0.0;
        return 0;
    }
    out->is_float = 1; out->i = 0; out->d = num_double(a) + num_double(b);
    return 0;
}

/* a - b as Python computes it, as a double (what a float counter adds) */
static inline double num_sub_double(Num a, Num b) {
    if (!a.is_float && !b.is_float) return (double)(a.i - b.i);
    return num_double(a) - num_double(b);
}

static inline int num_gt(Num a, Num b) {
    if (!a.is_float && !b.is_float) return a.i > b.i;
    return num_double(a) > num_double(b);  /* exact: ints are within 2^53 */
}

/* ------------------------------------------------------------------ Code */

typedef struct Code Code;

typedef struct {
    int kind;
    PyObject *entry;   /* the stream entry (returned for K_OTHER and a blocking K_WAIT) */
    PyObject *name;    /* its name (instruction traces) */
    Num cost;          /* K_FIXED, K_RUN */
    double flops;      /* K_FIXED, K_RUN (an int converted as Python converts it for float + int) */
    Py_ssize_t n_local;
    Py_ssize_t *local_mem;   /* buffer index per local write */
    int64_t *local_bytes;
    Py_ssize_t n_parts;      /* K_RUN: its Fixed entries, for instruction traces */
    PyObject **part_name;
    Num *part_cost;
    PyObject *key;     /* K_SET, K_WAIT */
    PyObject *var;     /* K_LOOP */
    int64_t count;
    Code *body;
} Op;

struct Code {
    PyObject_HEAD
    Op *ops;
    Py_ssize_t n;
    Py_ssize_t n_mems;   /* local buffers the whole stream writes into (indices 0..n_mems) */
};

static PyTypeObject CodeType;

static void op_clear(Op *op) {
    Py_CLEAR(op->entry);
    Py_CLEAR(op->name);
    Py_CLEAR(op->key);
    Py_CLEAR(op->var);
    Py_CLEAR(op->body);
    for (Py_ssize_t i = 0; i < op->n_parts; i++) Py_CLEAR(op->part_name[i]);
    PyMem_Free(op->local_mem); op->local_mem = NULL;
    PyMem_Free(op->local_bytes); op->local_bytes = NULL;
    PyMem_Free(op->part_name); op->part_name = NULL;
    PyMem_Free(op->part_cost); op->part_cost = NULL;
    op->n_local = op->n_parts = 0;
}

static void code_dealloc(Code *c) {
    for (Py_ssize_t i = 0; i < c->n; i++) op_clear(&c->ops[i]);
    PyMem_Free(c->ops);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int bad_op(Py_ssize_t i, const char *what) {
    PyErr_Format(PyExc_ValueError, "pipe Code: op %zd: %s", i, what);
    return -1;
}

/* (mem index, bytes) pairs of a tuple into the op's local arrays */
static int take_local(Op *op, PyObject *pairs, Py_ssize_t n_mems, Py_ssize_t i) {
    if (!PyTuple_Check(pairs)) return bad_op(i, "local writes must be a tuple");
    Py_ssize_t n = PyTuple_GET_SIZE(pairs);
    op->local_mem = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    op->local_bytes = PyMem_Calloc((size_t)(n ? n : 1), sizeof(int64_t));
    if (!op->local_mem || !op->local_bytes) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t mem;
        long long nbytes;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(pairs, k), "nL", &mem, &nbytes)) return -1;
        if (mem < 0 || mem >= n_mems) return bad_op(i, "local buffer index out of range");
        op->local_mem[k] = mem;
        op->local_bytes[k] = nbytes;
    }
    op->n_local = n;
    return 0;
}

/* Code(ops, n_mems): ops a tuple of tuples, (kind, entry, name, ...) by kind:
   K_FIXED / K_RUN: cost, flops, ((mem index, bytes), ...), ((name, cost), ...) of its parts
   K_SET / K_WAIT:  key
   K_LOOP:          var, count, body Code
   K_OTHER:         nothing more */
static int code_init(Code *c, PyObject *args, PyObject *kwds) {
    PyObject *ops;
    Py_ssize_t n_mems;
    if (!PyArg_ParseTuple(args, "O!n", &PyTuple_Type, &ops, &n_mems)) return -1;
    if (c->ops) { PyErr_SetString(PyExc_TypeError, "pipe Code: already built"); return -1; }
    Py_ssize_t n = PyTuple_GET_SIZE(ops);
    c->ops = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Op));
    if (!c->ops) { PyErr_NoMemory(); return -1; }
    c->n = n;
    c->n_mems = n_mems;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(ops, i);
        Op *op = &c->ops[i];
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 3) return bad_op(i, "expected (kind, entry, name, ...)");
        int kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        if (kind == -1 && PyErr_Occurred()) return -1;
        op->kind = kind;
        op->entry = Py_NewRef(PyTuple_GET_ITEM(t, 1));
        op->name = Py_NewRef(PyTuple_GET_ITEM(t, 2));
        Py_ssize_t size = PyTuple_GET_SIZE(t);
        switch (kind) {
        case K_FIXED:
        case K_RUN: {
            if (size != 7) return bad_op(i, "a fixed-cost entry is (kind, entry, name, cost, flops, local, parts)");
            if (num_from(PyTuple_GET_ITEM(t, 3), &op->cost) < 0) return -1;
            op->flops = PyFloat_AsDouble(PyTuple_GET_ITEM(t, 4));
            if (op->flops == -1.0 && PyErr_Occurred()) return -1;
            if (take_local(op, PyTuple_GET_ITEM(t, 5), n_mems, i) < 0) return -1;
            PyObject *parts = PyTuple_GET_ITEM(t, 6);
            if (!PyTuple_Check(parts)) return bad_op(i, "parts must be a tuple");
            Py_ssize_t np_ = PyTuple_GET_SIZE(parts);
            op->part_name = PyMem_Calloc((size_t)(np_ ? np_ : 1), sizeof(PyObject *));
            op->part_cost = PyMem_Calloc((size_t)(np_ ? np_ : 1), sizeof(Num));
            if (!op->part_name || !op->part_cost) { PyErr_NoMemory(); return -1; }
            for (Py_ssize_t k = 0; k < np_; k++) {
                PyObject *part = PyTuple_GET_ITEM(parts, k);
                if (!PyTuple_Check(part) || PyTuple_GET_SIZE(part) != 2) return bad_op(i, "a part is (name, cost)");
                if (num_from(PyTuple_GET_ITEM(part, 1), &op->part_cost[k]) < 0) return -1;
                op->part_name[k] = Py_NewRef(PyTuple_GET_ITEM(part, 0));
                op->n_parts = k + 1;
            }
            break;
        }
        case K_SET:
        case K_WAIT:
            if (size != 4) return bad_op(i, "a flag entry is (kind, entry, name, key)");
            op->key = Py_NewRef(PyTuple_GET_ITEM(t, 3));
            break;
        case K_LOOP: {
            if (size != 6) return bad_op(i, "a loop is (kind, entry, name, var, count, body)");
            op->var = Py_NewRef(PyTuple_GET_ITEM(t, 3));
            op->count = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 4));
            if (op->count == -1 && PyErr_Occurred()) return -1;
            PyObject *body = PyTuple_GET_ITEM(t, 5);
            if (!PyObject_TypeCheck(body, &CodeType)) return bad_op(i, "a loop's body must be a Code");
            if (((Code *)body)->n_mems != n_mems) return bad_op(i, "a loop's body must number buffers alike");
            op->body = (Code *)Py_NewRef(body);
            break;
        }
        case K_OTHER:
            break;
        default:
            return bad_op(i, "unknown kind");
        }
    }
    return 0;
}

static PyTypeObject CodeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._pipe.Code",
    .tp_basicsize = sizeof(Code),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Code(ops, n_mems): a pipe's stream, compiled for Walker (see pipe.code_of)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)code_init,
    .tp_dealloc = (destructor)code_dealloc,
};

/* ------------------------------------------------------------------ Walker */

typedef struct {
    Code *code;
    Py_ssize_t pos;
    int64_t iter;   /* loop frames: the iteration running (the loop op is code's caller's) */
    Op *loop;       /* NULL for the stream itself */
} Frame;

typedef struct {
    PyObject_HEAD
    Code *root;
    Frame *stack;
    Py_ssize_t depth, cap;
    PyObject *vars, *flags, *waiters, *intervals, *names, *pipe_name, *kid;
    Num t, latency;
    double busy, waited, flops;
    int64_t *local;     /* bytes per buffer, not yet weighted */
    char *touched;      /* per buffer: written into at all (its counter exists) */
} Walker;

static PyObject *s_popleft, *s_append, *s_fire;

static void walker_clear_refs(Walker *w) {
    Py_CLEAR(w->root);
    Py_CLEAR(w->vars); Py_CLEAR(w->flags); Py_CLEAR(w->waiters); Py_CLEAR(w->intervals);
    Py_CLEAR(w->names); Py_CLEAR(w->pipe_name); Py_CLEAR(w->kid);
}

static void walker_dealloc(Walker *w) {
    walker_clear_refs(w);
    PyMem_Free(w->stack);
    PyMem_Free(w->local);
    PyMem_Free(w->touched);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* Walker(code, vars, flags, waiters, flag_latency, intervals or None, names, pipe_name, kernel id, t) */
static int walker_init(Walker *w, PyObject *args, PyObject *kwds) {
    PyObject *code, *vars, *flags, *waiters, *latency, *intervals, *names, *pipe_name, *kid, *t;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOO!OOO", &CodeType, &code, &PyDict_Type, &vars, &PyDict_Type, &flags,
                          &PyDict_Type, &waiters, &latency, &intervals, &PyTuple_Type, &names, &pipe_name, &kid,
                          &t))
        return -1;
    if (w->root) { PyErr_SetString(PyExc_TypeError, "pipe Walker: already built"); return -1; }
    if (num_from(latency, &w->latency) < 0 || num_from(t, &w->t) < 0) return -1;
    w->root = (Code *)Py_NewRef(code);
    w->vars = Py_NewRef(vars); w->flags = Py_NewRef(flags); w->waiters = Py_NewRef(waiters);
    w->intervals = intervals == Py_None ? NULL : Py_NewRef(intervals);
    if (w->intervals && !PyList_Check(w->intervals)) {
        PyErr_SetString(PyExc_TypeError, "pipe Walker: intervals must be a list or None");
        return -1;
    }
    w->names = Py_NewRef(names); w->pipe_name = Py_NewRef(pipe_name); w->kid = Py_NewRef(kid);
    w->cap = 8;
    w->stack = PyMem_Calloc((size_t)w->cap, sizeof(Frame));
    Py_ssize_t m = w->root->n_mems ? w->root->n_mems : 1;
    w->local = PyMem_Calloc((size_t)m, sizeof(int64_t));
    w->touched = PyMem_Calloc((size_t)m, 1);
    if (!w->stack || !w->local || !w->touched) { PyErr_NoMemory(); return -1; }
    w->stack[0].code = w->root;
    w->depth = 1;
    w->busy = w->waited = w->flops = 0.0;
    return 0;
}

/* intervals.append((core, pipe, name, start, end, kernel id)) for every core of the run */
static int trace(Walker *w, PyObject *name, Num start, Num end) {
    PyObject *a = num_to(start), *b = num_to(end);
    int bad = !a || !b;
    for (Py_ssize_t k = 0; !bad && k < PyTuple_GET_SIZE(w->names); k++) {
        PyObject *rec = PyTuple_Pack(6, PyTuple_GET_ITEM(w->names, k), w->pipe_name, name, a, b, w->kid);
        bad = !rec || PyList_Append(w->intervals, rec) < 0;
        Py_XDECREF(rec);
    }
    Py_XDECREF(a);
    Py_XDECREF(b);
    return bad ? -1 : 0;
}

/* a fixed-cost entry: t and busy advance by its cost, flops by its flops */
static int fixed(Walker *w, Op *op) {
    if (w->intervals) {
        if (op->kind == K_FIXED) {
            Num end;
            if (num_add(w->t, op->cost, &end) < 0 || trace(w, op->name, w->t, end) < 0) return -1;
        } else {
            Num at = w->t, end;
            for (Py_ssize_t k = 0; k < op->n_parts; k++) {
                if (num_add(at, op->part_cost[k], &end) < 0 || trace(w, op->part_name[k], at, end) < 0) return -1;
                at = end;
            }
        }
    }
    if (num_add(w->t, op->cost, &w->t) < 0) return -1;
    w->busy += num_double(op->cost);
    w->flops += op->flops;
    for (Py_ssize_t k = 0; k < op->n_local; k++) {
        w->local[op->local_mem[k]] += op->local_bytes[k];
        w->touched[op->local_mem[k]] = 1;
    }
    return 0;
}

/* a set of `key`: to the oldest pipe waiting for it, or queued, visible at t + latency */
static int set_flag(Walker *w, Op *op) {
    Num at;
    if (num_add(w->t, w->latency, &at) < 0) return -1;
    PyObject *visible = num_to(at);
    if (!visible) return -1;
    PyObject *waiting = PyDict_GetItemWithError(w->waiters, op->key);  /* waiters.get(key) */
    PyObject *res = NULL;
    if (!waiting && PyErr_Occurred()) goto done;
    if (waiting && PyObject_IsTrue(waiting) == 1) {
        PyObject *sig = PyObject_CallMethodNoArgs(waiting, s_popleft);
        if (!sig) goto done;
        res = PyObject_CallMethodOneArg(sig, s_fire, visible);
        Py_DECREF(sig);
    } else {
        PyObject *q = PyObject_GetItem(w->flags, op->key);  /* a defaultdict: made if missing */
        if (!q) goto done;
        res = PyObject_CallMethodOneArg(q, s_append, visible);
        Py_DECREF(q);
    }
done:
    Py_DECREF(visible);
    if (!res) return -1;
    Py_DECREF(res);
    return 0;
}

/* the pipe had to wait until `visible` for a flag */
static int arrive(Walker *w, PyObject *visible_obj, PyObject *name) {
    Num v;
    if (num_from(visible_obj, &v) < 0) return -1;
    if (num_gt(v, w->t)) {
        if (w->intervals && trace(w, name, w->t, v) < 0) return -1;
        w->waited += num_sub_double(v, w->t);
        w->t = v;
    }
    return 0;
}

static int set_var(Walker *w, PyObject *var, int64_t i) {
    PyObject *v = PyLong_FromLongLong(i);
    if (!v) return -1;
    int bad = PyDict_SetItem(w->vars, var, v);
    Py_DECREF(v);
    return bad;
}

/* run(): do entries until one that needs pipe.py; return it, or None at the stream's end */
static PyObject *walker_run(Walker *w, PyObject *unused) {
    if (!w->root) { PyErr_SetString(PyExc_TypeError, "pipe Walker: not built"); return NULL; }
    while (w->depth) {
        Frame *f = &w->stack[w->depth - 1];
        if (f->pos == f->code->n) {
            if (f->loop && f->iter + 1 < f->loop->count) {
                f->iter++;
                f->pos = 0;
                if (set_var(w, f->loop->var, f->iter) < 0) return NULL;
            } else {
                w->depth--;
            }
            continue;
        }
        Op *op = &f->code->ops[f->pos++];
        switch (op->kind) {
        case K_FIXED:
        case K_RUN:
            if (fixed(w, op) < 0) return NULL;
            break;
        case K_SET:
            if (set_flag(w, op) < 0) return NULL;
            break;
        case K_WAIT: {
            PyObject *q = PyObject_GetItem(w->flags, op->key);
            if (!q) return NULL;
            Py_ssize_t pending = PyObject_Length(q);
            if (pending <= 0) {  /* not set yet: pipe.py blocks on it, then calls arrive() */
                Py_DECREF(q);
                if (pending < 0) return NULL;
                return Py_NewRef(op->entry);
            }
            PyObject *visible = PyObject_CallMethodNoArgs(q, s_popleft);
            Py_DECREF(q);
            if (!visible) return NULL;
            int bad = arrive(w, visible, op->name);
            Py_DECREF(visible);
            if (bad < 0) return NULL;
            break;
        }
        case K_LOOP:
            if (op->count > 0) {
                if (set_var(w, op->var, 0) < 0) return NULL;
                if (w->depth == w->cap) {
                    Frame *grown = PyMem_Realloc(w->stack, (size_t)(2 * w->cap) * sizeof(Frame));
                    if (!grown) return PyErr_NoMemory();
                    w->stack = grown;
                    w->cap *= 2;
                }
                Frame *g = &w->stack[w->depth++];
                g->code = op->body; g->pos = 0; g->iter = 0; g->loop = op;
            }
            break;
        default:
            return Py_NewRef(op->entry);
        }
    }
    Py_RETURN_NONE;
}

static PyObject *walker_arrive(Walker *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "arrive(visible, name)"); return NULL; }
    if (arrive(w, args[0], args[1]) < 0) return NULL;
    Py_RETURN_NONE;
}

/* flush(local_bytes, weight): add the bytes written into each buffer (times the run's
   weight) into the kernel's counters; `mems` names the buffers by index */
static PyObject *walker_flush(Walker *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "flush(local_bytes, mems, weight)"); return NULL; }
    PyObject *counters = args[0], *mems = args[1];
    long long weight = PyLong_AsLongLong(args[2]);
    if (weight == -1 && PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(mems) || PyTuple_GET_SIZE(mems) != w->root->n_mems) {
        PyErr_SetString(PyExc_ValueError, "flush: mems must name every buffer of the Code");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < w->root->n_mems; k++) {
        if (!w->touched[k]) continue;
        PyObject *mem = PyTuple_GET_ITEM(mems, k);
        PyObject *cur = PyObject_GetItem(counters, mem);  /* a defaultdict(float) */
        if (!cur) return NULL;
        PyObject *add = PyLong_FromLongLong(w->local[k] * weight);
        PyObject *sum = add ? PyNumber_Add(cur, add) : NULL;
        Py_DECREF(cur);
        Py_XDECREF(add);
        if (!sum || PyObject_SetItem(counters, mem, sum) < 0) { Py_XDECREF(sum); return NULL; }
        Py_DECREF(sum);
        w->touched[k] = 0;
        w->local[k] = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *walker_get_t(Walker *w, void *closure) { return num_to(w->t); }

static int walker_set_t(Walker *w, PyObject *v, void *closure) {
    if (!v) { PyErr_SetString(PyExc_TypeError, "t cannot be deleted"); return -1; }
    return num_from(v, &w->t);
}

#define DOUBLE_FIELD(field)                                                              \
    static PyObject *walker_get_##field(Walker *w, void *closure) {                     \
        return PyFloat_FromDouble(w->field);                                             \
    }                                                                                    \
    static int walker_set_##field(Walker *w, PyObject *v, void *closure) {               \
        if (!v || !PyFloat_Check(v)) {                                                   \
            PyErr_SetString(PyExc_TypeError, #field " must be a float");                 \
            return -1;                                                                   \
        }                                                                                \
        w->field = PyFloat_AS_DOUBLE(v);                                                 \
        return 0;                                                                        \
    }

DOUBLE_FIELD(busy)
DOUBLE_FIELD(waited)
DOUBLE_FIELD(flops)

static PyMethodDef walker_methods[] = {
    {"run", (PyCFunction)walker_run, METH_NOARGS, "walk on; the entry pipe.py must do, or None at the end"},
    {"arrive", (PyCFunction)(void (*)(void))walker_arrive, METH_FASTCALL,
     "arrive(visible, name): a flag the pipe blocked on became visible at cycle `visible`"},
    {"flush", (PyCFunction)(void (*)(void))walker_flush, METH_FASTCALL,
     "flush(local_bytes, mems, weight): add the local buffer bytes into the kernel's counters"},
    {NULL},
};

static PyGetSetDef walker_getset[] = {
    {"t", (getter)walker_get_t, (setter)walker_set_t, "the pipe's clock (cycles)", NULL},
    {"busy", (getter)walker_get_busy, (setter)walker_set_busy, "cycles busy so far", NULL},
    {"waited", (getter)walker_get_waited, (setter)walker_set_waited, "cycles waited so far", NULL},
    {"flops", (getter)walker_get_flops, (setter)walker_set_flops, "flops so far", NULL},
    {NULL},
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._pipe.Walker",
    .tp_basicsize = sizeof(Walker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Walker(code, vars, flags, waiters, flag_latency, intervals, names, pipe_name, kernel_id, t)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)walker_init,
    .tp_dealloc = (destructor)walker_dealloc,
    .tp_methods = walker_methods,
    .tp_getset = walker_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pipe", "A pipe's walk through its stream, in C.", -1,
                                    NULL};

PyMODINIT_FUNC PyInit__pipe(void) {
    s_popleft = PyUnicode_InternFromString("popleft");
    s_append = PyUnicode_InternFromString("append");
    s_fire = PyUnicode_InternFromString("fire");
    if (!s_popleft || !s_append || !s_fire) return NULL;
    if (PyType_Ready(&CodeType) < 0 || PyType_Ready(&WalkerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&CodeType);
    Py_INCREF(&WalkerType);
    if (PyModule_AddObject(m, "Code", (PyObject *)&CodeType) < 0 ||
        PyModule_AddObject(m, "Walker", (PyObject *)&WalkerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
