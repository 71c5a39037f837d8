/* A pipe's walk through its instruction stream (npusim/engine/pipe.py holds the
   model and runs what this leaves to it).

   A Code is a compiled stream: per entry its kind and the fields the walk reads,
   loops holding the Code of their body. A Walker walks one pipe's Code for one core
   run: fixed-cost instructions, flag sets, flag waits and loops, and GM copies; and
   it is the pipe's process (start, resume: see walker_resume). A copy, or a wait
   whose flag is not set yet, is an event the process waits for. Barriers, SyncAll
   and cross-core flags are pipe.py's meet(walk, entry), a generator the process
   runs, which reads and writes the walker's clock and counters.

   A pipe's DMA engine holds up to `queue` copies (dma.outstanding): a copy the walk
   meets right as the copy before it ended (nothing between took time: a chain) was
   requested while that one's data moved - when the copy `queue - 1` before it began
   moving data, not before the one before it was requested, nor before a flag a wait
   since then saw set - so its start-up ran then, and its data moves at the later of
   that request + start-up and now. With queue 1, or outside a chain, a copy starts
   its start-up when the walk meets it.

   A copy starts once its start-up has passed: if that is later than now, a timeout
   (events.after) calls the walker, which starts it then - at the very point of the
   event order where the pipe would have resumed to start it, without resuming the
   pipe. Its end is a Signal the transfer fires (memory.MemorySystem.transfer).

   Each operation is the one pipe.py did in Python, on the same operands, in the
   same order. The clock keeps Python's number types: it is an int until a float
   reaches it (int + int stays int, anything with a float is a float, ints far
   below 2^53 convert to doubles exactly, as Python converts them). The busy,
   wait, data-wait and flop counters are Python floats, i.e. doubles. Bytes written into
   local buffers are whole numbers, summed per buffer as integers and added into
   the kernel's counters once, at the end (flush): a float sum of whole numbers
   below 2^53 is exact in any order, so the totals are the same. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* entry kinds, as compile.code_of numbers them */
enum { K_FIXED = 0, K_RUN = 1, K_SET = 2, K_WAIT = 3, K_LOOP = 4, K_OTHER = 5, K_COPY = 6, K_CROSS_SET = 7,
       K_CROSS_WAIT = 8 };

/* a number as Python holds it: an int (exact) or a float */
typedef struct {
    int is_float;
    int64_t i;
    double d;
} Num;

#define EXACT (9007199254740992LL) /* 2^53: ints up to this convert to doubles exactly */
/* cycles.whole_cycles' fast test: a ceiling this far (1 - 1e-6) above x needs no rounding */
#define CLEAR (1e-6)
/* SimPy's priority of a process's initialisation (simpy.core.URGENT) */
#define URGENT 0
/* the most copies a pipe's DMA engine may hold (dma.outstanding, checked in hw/config.py) */
#define QUEUE_MAX 16
/* the most flag ids (sync.flag_ids, bounded in hw/config.py as FLAG_IDS_MAX): a
   cross-core flag's id is below it */
#define FLAG_ID_MAX 65536
/* the most flags one Flags keeps: a core's SetFlag/WaitFlag keys (at most 42 pipe
   pairs x FLAG_ID_MAX ids), or its cross-core flags (id x AIVs per AIC + source).
   Far above any program's; 64 bytes each, so a table stays below 256 MiB. */
#define FLAGS_MAX ((Py_ssize_t)1 << 22)
/* the most local buffers a Code numbers (compile.MEMS has 7) */
#define MEMS_MAX 64

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

static int num_sub(Num a, Num b, Num *out) {
    Num neg = b;
    neg.i = -b.i;
    neg.d = -b.d;
    return num_add(a, neg, out);  /* exact negation: a - b is a + (-b) in ints and in doubles */
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

/* *out = a + b * c, or an OverflowError naming `what` if it leaves int64 */
static int mul_add(int64_t a, int64_t b, int64_t c, int64_t *out, const char *what) {
    int64_t p;
    if (__builtin_mul_overflow(b, c, &p) || __builtin_add_overflow(a, p, out)) {
        PyErr_Format(PyExc_OverflowError, "pipe walk: %s beyond 2^63", what);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ Code */

typedef struct Code Code;

typedef struct {
    int kind;
    PyObject *entry;   /* the stream entry (returned to pipe.py for K_OTHER) */
    PyObject *name;    /* its name (instruction traces) */
    Num cost;          /* K_FIXED, K_RUN */
    double flops;      /* K_FIXED, K_RUN (an int converted as Python converts it for float + int) */
    Py_ssize_t n_local;
    Py_ssize_t *local_mem;   /* buffer index per local write */
    int64_t *local_bytes;
    Py_ssize_t n_parts;      /* K_RUN: its Fixed entries, for instruction traces */
    PyObject **part_name;
    Num *part_cost;
    Py_ssize_t flag;   /* K_SET, K_WAIT: the flag's number in its core's Flags; K_CROSS_*: its id */
    PyObject *var;     /* K_LOOP */
    int64_t count;
    Code *body;
    /* K_COPY: start-up cycles, cap (bytes/cycle, as given and as a double), a write?, the
       GM address base + sum(step * var), its bytes, segments, stride, how far it moves
       per block of a group, and the local buffer it reads into (index) */
    Num startup;
    PyObject *cap;
    double cap_d;
    int write;
    int64_t base;
    Py_ssize_t n_terms;
    PyObject **term_var;
    int64_t *term_step;
    PyObject *nbytes, *segments, *stride;
    int64_t segments_i, nbytes_i;
    int64_t block_step;
    Py_ssize_t local;
} Op;

struct Code {
    PyObject_HEAD
    Op *ops;
    Py_ssize_t n;
    Py_ssize_t n_mems;   /* local buffers the whole stream writes into (indices 0..n_mems) */
    int building;        /* __init__ is under way: not a loop's body yet (it could become its own), nor a
                            Walker's (its ops past the one being built are zeros: no name, no entry) */
};

static PyTypeObject CodeType;

static void op_clear(Op *op) {
    Py_CLEAR(op->entry);
    Py_CLEAR(op->name);
    Py_CLEAR(op->var);
    Py_CLEAR(op->body);
    Py_CLEAR(op->cap);
    Py_CLEAR(op->nbytes);
    Py_CLEAR(op->segments);
    Py_CLEAR(op->stride);
    for (Py_ssize_t i = 0; i < op->n_terms; i++) Py_CLEAR(op->term_var[i]);
    PyMem_Free(op->term_var); op->term_var = NULL;
    PyMem_Free(op->term_step); op->term_step = NULL;
    op->n_terms = 0;
    for (Py_ssize_t i = 0; i < op->n_parts; i++) Py_CLEAR(op->part_name[i]);
    PyMem_Free(op->local_mem); op->local_mem = NULL;
    PyMem_Free(op->local_bytes); op->local_bytes = NULL;
    PyMem_Free(op->part_name); op->part_name = NULL;
    PyMem_Free(op->part_cost); op->part_cost = NULL;
    op->n_local = op->n_parts = 0;
}

/* back to what Code.__new__ made: not initialised (ops NULL) */
static void code_reset(Code *c) {
    for (Py_ssize_t i = 0; c->ops && i < c->n; i++) op_clear(&c->ops[i]);
    PyMem_Free(c->ops);
    c->ops = NULL;
    c->n = c->n_mems = 0;
}

static void code_dealloc(Code *c) {
    code_reset(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int bad_op(Py_ssize_t i, const char *what) {
    PyErr_Format(PyExc_ValueError, "pipe Code: op %zd: %s", i, what);
    return -1;
}

/* a cycle count of op `i` (`what`: its cost, a part's, its start-up), or of a Walker's (i < 0:
   a flag latency): an int or float, finite and not negative (a clock never moves back, and a
   NaN would reach the event queue) */
static int cycles_of(PyObject *o, Num *out, Py_ssize_t i, const char *what) {
    if (num_from(o, out) < 0) return -1;
    if (out->is_float ? out->d >= 0.0 && out->d < INFINITY : out->i >= 0) return 0;
    if (i < 0) PyErr_Format(PyExc_ValueError, "pipe Walker: %s of %R cycles, expected a finite number >= 0", what, o);
    else PyErr_Format(PyExc_ValueError, "pipe Code: op %zd: %s of %R cycles, expected a finite number >= 0", i, what,
                      o);
    return -1;
}

/* a flag entry's number: a SetFlag/WaitFlag's in its core's Flags (below FLAGS_MAX), a
   cross-core flag's id (below FLAG_ID_MAX); a ValueError naming it otherwise */
static int flag_number(PyObject *o, int cross, Py_ssize_t i, Py_ssize_t *out) {
    Py_ssize_t most = cross ? FLAG_ID_MAX : FLAGS_MAX;
    const char *what = cross ? "cross-core flag id" : "flag number";
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "pipe Code: op %zd: a %s must be an int, got %.100s", i, what,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < 0 || v >= most) {
        PyErr_Format(PyExc_ValueError, "pipe Code: op %zd: %s %R outside [0, %zd)%s", i, what, o, most,
                     cross ? " (sync.flag_ids is at most that)" : "");
        return -1;
    }
    *out = (Py_ssize_t)v;
    return 0;
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
        if (nbytes < 0) {  /* the kernel's bytes written into the buffer: taken off them */
            PyErr_Format(PyExc_ValueError, "pipe Code: op %zd: a local write of %lld bytes, expected >= 0", i, nbytes);
            return -1;
        }
        op->local_mem[k] = mem;
        op->local_bytes[k] = nbytes;
    }
    op->n_local = n;
    return 0;
}

/* Code(ops, n_mems): ops a tuple of tuples, (kind, entry, name, ...) by kind:
   K_FIXED / K_RUN: cost, flops, ((mem index, bytes), ...), ((name, cost), ...) of its parts
   K_SET / K_WAIT:  flag number (see Flags)
   K_CROSS_SET / K_CROSS_WAIT: the cross-core flag's id
   K_LOOP:          var, count, body Code
   K_COPY:          startup, cap, write, base, ((var, step), ...), nbytes, segments, stride,
                    block step, local buffer index
   K_OTHER:         nothing more */
static int code_build(Code *c, PyObject *ops, Py_ssize_t n_mems) {
    Py_ssize_t n = PyTuple_GET_SIZE(ops);
    c->ops = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Op));
    if (!c->ops) { PyErr_NoMemory(); return -1; }
    c->n = n;
    c->n_mems = n_mems;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(ops, i);
        Op *op = &c->ops[i];
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 3) return bad_op(i, "expected (kind, entry, name, ...)");
        /* read whole: a kind past an int (2^32 + 2) was cut to one of the kinds (2: a SetFlag) */
        long long kind = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
        if (kind == -1 && PyErr_Occurred()) return -1;
        if (kind < K_FIXED || kind > K_CROSS_WAIT) {
            PyErr_Format(PyExc_ValueError, "pipe Code: op %zd: unknown kind %lld", i, kind);
            return -1;
        }
        op->kind = (int)kind;
        op->entry = Py_NewRef(PyTuple_GET_ITEM(t, 1));
        op->name = Py_NewRef(PyTuple_GET_ITEM(t, 2));
        Py_ssize_t size = PyTuple_GET_SIZE(t);
        switch (kind) {
        case K_FIXED:
        case K_RUN: {
            if (size != 7) return bad_op(i, "a fixed-cost entry is (kind, entry, name, cost, flops, local, parts)");
            if (cycles_of(PyTuple_GET_ITEM(t, 3), &op->cost, i, "a cost") < 0) return -1;
            op->flops = PyFloat_AsDouble(PyTuple_GET_ITEM(t, 4));
            if (op->flops == -1.0 && PyErr_Occurred()) return -1;
            if (!(op->flops >= 0.0 && op->flops < INFINITY)) {  /* the kernel's flops: a NaN or -1 would reach them */
                PyErr_Format(PyExc_ValueError, "pipe Code: op %zd: flops of %R, expected a finite number >= 0", i,
                             PyTuple_GET_ITEM(t, 4));
                return -1;
            }
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
                if (cycles_of(PyTuple_GET_ITEM(part, 1), &op->part_cost[k], i, "a part's cost") < 0) return -1;
                op->part_name[k] = Py_NewRef(PyTuple_GET_ITEM(part, 0));
                op->n_parts = k + 1;
            }
            break;
        }
        case K_SET:
        case K_WAIT:
        case K_CROSS_SET:
        case K_CROSS_WAIT:
            if (size != 4) return bad_op(i, "a flag entry is (kind, entry, name, flag)");
            if (flag_number(PyTuple_GET_ITEM(t, 3), kind >= K_CROSS_SET, i, &op->flag) < 0) return -1;
            break;
        case K_LOOP: {
            if (size != 6) return bad_op(i, "a loop is (kind, entry, name, var, count, body)");
            op->var = Py_NewRef(PyTuple_GET_ITEM(t, 3));
            op->count = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 4));
            if (op->count == -1 && PyErr_Occurred()) return -1;
            if (op->count < 0) {  /* a count of trips (0: the body never runs) */
                PyErr_Format(PyExc_ValueError, "pipe Code: op %zd: a loop count of %lld, expected >= 0", i,
                             (long long)op->count);
                return -1;
            }
            PyObject *body = PyTuple_GET_ITEM(t, 5);
            if (!PyObject_TypeCheck(body, &CodeType)) return bad_op(i, "a loop's body must be a Code");
            if (body == (PyObject *)c) return bad_op(i, "a loop's body must not be its own Code");
            if (!((Code *)body)->ops || ((Code *)body)->building) {
                PyErr_Format(PyExc_TypeError, "pipe Code: op %zd: a loop's body is not initialised (Code(ops, n_mems))",
                             i);
                return -1;
            }
            if (((Code *)body)->n_mems != n_mems) return bad_op(i, "a loop's body must number buffers alike");
            op->body = (Code *)Py_NewRef(body);
            break;
        }
        case K_COPY: {
            if (size != 13) return bad_op(i, "a copy is (kind, entry, name, startup, cap, write, base, terms, "
                                             "nbytes, segments, stride, block step, local)");
            if (cycles_of(PyTuple_GET_ITEM(t, 3), &op->startup, i, "a start-up") < 0) return -1;
            op->cap = Py_NewRef(PyTuple_GET_ITEM(t, 4));
            op->cap_d = PyFloat_AsDouble(op->cap);
            if (op->cap_d == -1.0 && PyErr_Occurred()) return -1;
            if (!(op->cap_d > 0.0 && op->cap_d <= 1e300))  /* moved / cap is the copy's cycles at the port */
                return bad_op(i, "a copy's cap must be a positive finite number of bytes per cycle");
            op->write = PyObject_IsTrue(PyTuple_GET_ITEM(t, 5));
            if (op->write < 0) return -1;
            op->base = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 6));
            if (op->base == -1 && PyErr_Occurred()) return -1;
            PyObject *terms = PyTuple_GET_ITEM(t, 7);
            if (!PyTuple_Check(terms)) return bad_op(i, "terms must be a tuple");
            Py_ssize_t nt = PyTuple_GET_SIZE(terms);
            op->term_var = PyMem_Calloc((size_t)(nt ? nt : 1), sizeof(PyObject *));
            op->term_step = PyMem_Calloc((size_t)(nt ? nt : 1), sizeof(int64_t));
            if (!op->term_var || !op->term_step) { PyErr_NoMemory(); return -1; }
            for (Py_ssize_t k = 0; k < nt; k++) {
                PyObject *var;
                long long step;
                if (!PyArg_ParseTuple(PyTuple_GET_ITEM(terms, k), "OL", &var, &step)) return -1;
                op->term_var[k] = Py_NewRef(var);
                op->term_step[k] = step;
                op->n_terms = k + 1;
            }
            op->nbytes = Py_NewRef(PyTuple_GET_ITEM(t, 8));
            op->segments = Py_NewRef(PyTuple_GET_ITEM(t, 9));
            op->stride = Py_NewRef(PyTuple_GET_ITEM(t, 10));
            op->nbytes_i = PyLong_AsLongLong(op->nbytes);
            op->segments_i = PyLong_AsLongLong(op->segments);
            op->block_step = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 11));
            op->local = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 12));
            if (PyErr_Occurred()) return -1;
            if (op->local < 0 || op->local >= n_mems) return bad_op(i, "local buffer index out of range");
            /* as verify's: a copy of no bytes or fewer moved its negative into the counters (bytes
               written, segments) and the transfer */
            if (op->nbytes_i < 1 || op->segments_i < 1) {
                PyErr_Format(PyExc_ValueError, "pipe Code: op %zd: a copy of %lld segments of %lld bytes, expected "
                             "each >= 1", i, (long long)op->segments_i, (long long)op->nbytes_i);
                return -1;
            }
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

static int code_init(Code *c, PyObject *args, PyObject *kwds) {
    PyObject *ops;
    Py_ssize_t n_mems;
    if (!PyArg_ParseTuple(args, "O!n", &PyTuple_Type, &ops, &n_mems)) return -1;
    if (c->ops) { PyErr_SetString(PyExc_TypeError, "pipe Code: already initialised"); return -1; }
    if (n_mems < 0 || n_mems > MEMS_MAX) {
        PyErr_Format(PyExc_ValueError, "pipe Code: %zd local buffers, expected 0 to %d", n_mems, MEMS_MAX);
        return -1;
    }
    /* the build converts numbers by their __index__ or __float__, Python code that could
       make another Code whose loop body is this one, half built: a loop that holds itself */
    c->building = 1;
    int bad = code_build(c, ops, n_mems);
    c->building = 0;
    if (bad < 0) {  /* a Code half built is not one: not initialised again */
        code_reset(c);
        return -1;
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

/* ------------------------------------------------------------------ Flags */

/* A core's SetFlag/WaitFlag flags, by number (compile.code_of numbers a program's
   (src pipe, dst pipe, id) keys): per flag the sets not yet taken (the cycle each is
   visible at, oldest first) and the Signals of pipes waiting for one (oldest first).
   A set goes to the oldest waiter if there is one: flags are FIFO with a single
   setting pipe, so the k-th wait takes the k-th set. */

typedef struct {
    PyObject **item;
    Py_ssize_t head, n, cap;
} Fifo;

typedef struct {
    Fifo sets, waiters;
} Flag;

typedef struct {
    PyObject_HEAD
    Flag *flag;
    Py_ssize_t n;
} Flags;

static PyTypeObject FlagsType;

static int fifo_push(Fifo *f, PyObject *x) {
    if (f->n == f->cap) {
        Py_ssize_t cap = f->cap ? 2 * f->cap : 4;
        PyObject **grown = PyMem_Malloc((size_t)cap * sizeof(PyObject *));
        if (!grown) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t k = 0; k < f->n; k++) grown[k] = f->item[(f->head + k) % f->cap];
        PyMem_Free(f->item);
        f->item = grown;
        f->head = 0;
        f->cap = cap;
    }
    f->item[(f->head + f->n++) % f->cap] = Py_NewRef(x);
    return 0;
}

/* the oldest item (a reference handed to the caller); n > 0 */
static PyObject *fifo_pop(Fifo *f) {
    PyObject *x = f->item[f->head];
    f->head = (f->head + 1) % f->cap;
    f->n--;
    return x;
}

static int fifo_traverse(Fifo *f, visitproc visit, void *arg) {
    for (Py_ssize_t k = 0; k < f->n; k++) Py_VISIT(f->item[(f->head + k) % f->cap]);
    return 0;
}

static void fifo_clear(Fifo *f) {
    while (f->n) Py_DECREF(fifo_pop(f));
    PyMem_Free(f->item);
    f->item = NULL;
    f->cap = f->head = 0;
}

static int flags_traverse(Flags *g, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < g->n; i++) {
        int r = fifo_traverse(&g->flag[i].sets, visit, arg);
        if (r) return r;
        r = fifo_traverse(&g->flag[i].waiters, visit, arg);
        if (r) return r;
    }
    return 0;
}

static int flags_clear(Flags *g) {
    for (Py_ssize_t i = 0; i < g->n; i++) {
        fifo_clear(&g->flag[i].sets);
        fifo_clear(&g->flag[i].waiters);
    }
    return 0;
}

static void flags_dealloc(Flags *g) {
    PyObject_GC_UnTrack(g);
    flags_clear(g);
    PyMem_Free(g->flag);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

/* flag `i`, made (with every flag below it) on first use; at most FLAGS_MAX of them */
static Flag *flag_at(Flags *g, Py_ssize_t i) {
    if (i < 0 || i >= FLAGS_MAX) {
        PyErr_Format(PyExc_ValueError, "pipe walk: flag %zd of a core outside [0, %zd)", i, FLAGS_MAX);
        return NULL;
    }
    if (i >= g->n) {
        Py_ssize_t n = i + 1 > 2 * g->n ? i + 1 : 2 * g->n;
        if (n > FLAGS_MAX) n = FLAGS_MAX;  /* n * sizeof(Flag) is then at most 256 MiB */
        Flag *grown = PyMem_Realloc(g->flag, (size_t)n * sizeof(Flag));
        if (!grown) { PyErr_NoMemory(); return NULL; }
        memset(grown + g->n, 0, (size_t)(n - g->n) * sizeof(Flag));
        g->flag = grown;
        g->n = n;
    }
    return &g->flag[i];
}

static PyTypeObject FlagsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._pipe.Flags",
    .tp_basicsize = sizeof(Flags),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Flags(): a core's SetFlag/WaitFlag flags by number, for its pipes' walks",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)flags_dealloc,
    .tp_traverse = (traverseproc)flags_traverse,
    .tp_clear = (inquiry)flags_clear,
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
    /* the pipe: its loop variables, its core's flags, the flag latency */
    PyObject *vars;
    Flags *flags;
    Num latency;
    /* the instruction trace (NULL: none), the names of the run's cores, the pipe's name,
       the kernel's id */
    PyObject *intervals, *names, *pipe_name, *kid;
    /* the device: environment, memory.transfer, events.Signal and events.after,
       cycles.whole_cycles, the blocked-pipes map and this pipe's key in it */
    PyObject *env, *transfer, *signal, *after, *whole, *blocked, *blocked_key;
    /* the run: its members' block offsets and weight, the kernel's counters, and what
       makes the Diverged error of the run's group */
    PyObject *offsets, *acc, *diverged;
    int64_t weight;
    Num t;
    double busy, waited, flops, data_wait;
    int64_t *local;     /* bytes per buffer, not yet weighted */
    char *touched;      /* per buffer: written into at all (its counter exists) */
    /* what the pipe waits for: the event handed to pipe.py, the entry (a copy or a
       wait), and for a copy its issue cycle, its addresses and its transfer stats
       (NULL until it has started) */
    PyObject *pending;
    Op *pending_op;
    Num issue;
    PyObject *addrs, *st;
    /* the process: its resume (a bound method, added to what it waits for), pipe.py's
       meet(walk, entry) and the generator it returned while one is running, end(walk),
       and the Signal that fires with the clock when the pipe ends */
    PyObject *resume_cb, *meet, *gen, *end, *done;
    /* marks (engine.fastforward): at the end of every iteration of a loop whose variable
       is mark_var, on_mark(walk) is called (both NULL: no marks) */
    PyObject *mark_var, *on_mark;
    /* cross-core flags (CrossSetFlag/CrossWaitFlag between a block's AIC and AIVs): this
       core's (flag id * per + source), the cores a set goes to and the source it sets
       as, how many sources a wait waits for (the AIC: every AIV; an AIV: the AIC), the
       AIVs per AIC, the latency; and a wait under way: the source it waits for, the
       clock before it and the latest set so far */
    Flags *cross;
    PyObject *cross_targets;
    Py_ssize_t cross_from, cross_sources, cross_per;
    Num cross_latency;
    Py_ssize_t cross_k;
    Num cross_t0, cross_visible;
    /* the DMA queue (see the top): copies it holds, copies in the chain so far and the
       data starts of the last QUEUE_MAX, when the chain's first copy was met, when the
       last was requested and ended, the latest visible flag a wait met since (if
       q_gated), and the pending copy's start-up as it ran (its data start - issue) */
    Py_ssize_t queue;
    int64_t q_n;
    Num q_start[QUEUE_MAX], q_first, q_req, q_end, q_gate, startup;
    int q_gated;
    /* resume is running (a callback it calls must not resume or call the walker: the
       frame it walks would move under it), and the pipe has ended */
    int walking, ended;
} Walker;

static PyObject *s_queue, *s_fire, *s_now, *s_value, *s_callbacks, *s_uneven, *s_moved;
static PyObject *s_gm_read, *s_gm_write, *s_hbm_read, *s_hbm_write, *s_l2_hit, *s_l2_miss, *s_wasted,
    *s_misaligned, *s_dma_segments, *s_st_hbm_read, *s_st_hbm_write, *s_st_hit, *s_st_miss, *s_st_wasted,
    *s_st_misaligned;

static int walker_traverse(Walker *w, visitproc visit, void *arg) {
    Py_VISIT(w->root);
    Py_VISIT(w->vars); Py_VISIT(w->flags);
    Py_VISIT(w->intervals); Py_VISIT(w->names); Py_VISIT(w->pipe_name); Py_VISIT(w->kid);
    Py_VISIT(w->env); Py_VISIT(w->transfer); Py_VISIT(w->signal); Py_VISIT(w->after); Py_VISIT(w->whole);
    Py_VISIT(w->blocked); Py_VISIT(w->blocked_key);
    Py_VISIT(w->offsets); Py_VISIT(w->acc); Py_VISIT(w->diverged);
    Py_VISIT(w->pending); Py_VISIT(w->addrs); Py_VISIT(w->st);
    Py_VISIT(w->resume_cb); Py_VISIT(w->meet); Py_VISIT(w->gen); Py_VISIT(w->end); Py_VISIT(w->done);
    Py_VISIT(w->cross); Py_VISIT(w->cross_targets);
    Py_VISIT(w->mark_var); Py_VISIT(w->on_mark);
    return 0;
}

static int walker_clear(Walker *w) {
    Py_CLEAR(w->root);
    Py_CLEAR(w->vars); Py_CLEAR(w->flags);
    Py_CLEAR(w->intervals); Py_CLEAR(w->names); Py_CLEAR(w->pipe_name); Py_CLEAR(w->kid);
    Py_CLEAR(w->env); Py_CLEAR(w->transfer); Py_CLEAR(w->signal); Py_CLEAR(w->after); Py_CLEAR(w->whole);
    Py_CLEAR(w->blocked); Py_CLEAR(w->blocked_key);
    Py_CLEAR(w->offsets); Py_CLEAR(w->acc); Py_CLEAR(w->diverged);
    Py_CLEAR(w->pending); Py_CLEAR(w->addrs); Py_CLEAR(w->st);
    Py_CLEAR(w->resume_cb); Py_CLEAR(w->meet); Py_CLEAR(w->gen); Py_CLEAR(w->end); Py_CLEAR(w->done);
    Py_CLEAR(w->cross); Py_CLEAR(w->cross_targets);
    Py_CLEAR(w->mark_var); Py_CLEAR(w->on_mark);
    return 0;
}

static void walker_dealloc(Walker *w) {
    PyObject_GC_UnTrack(w);
    walker_clear(w);
    PyMem_Free(w->stack);
    PyMem_Free(w->local);
    PyMem_Free(w->touched);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* Walker(code, vars, flags, flag_latency, t,
          intervals or None, names, pipe_name, kernel id,
          env, transfer, Signal, after, whole_cycles, blocked, blocked_key,
          offsets, weight, acc, diverged, meet, end,
          (cross Flags, target Flags, source index, sources, AIVs per AIC, cross latency), queue): see the struct */
static int walker_init(Walker *w, PyObject *args, PyObject *kwds) {
    PyObject *code, *vars, *flags, *latency, *t, *intervals, *names, *pipe_name, *kid;
    PyObject *env, *transfer, *signal, *after, *whole, *blocked, *blocked_key, *offsets, *acc, *diverged, *meet, *end;
    PyObject *cross, *cross_targets, *cross_latency;
    Py_ssize_t cross_from, cross_sources, cross_per, queue;
    long long weight;
    if (!PyArg_ParseTuple(args, "O!O!O!OOOO!OOOOOOOO!OO!LOOOO(O!O!nnnO)n", &CodeType, &code, &PyDict_Type, &vars,
                          &FlagsType, &flags, &latency, &t, &intervals, &PyTuple_Type,
                          &names, &pipe_name, &kid, &env, &transfer, &signal, &after, &whole, &PyDict_Type,
                          &blocked, &blocked_key, &PyList_Type, &offsets, &weight, &acc, &diverged, &meet, &end,
                          &FlagsType, &cross, &PyTuple_Type, &cross_targets, &cross_from, &cross_sources, &cross_per,
                          &cross_latency, &queue))
        return -1;
    if (w->root) { PyErr_SetString(PyExc_TypeError, "pipe Walker: already initialised"); return -1; }
    if (queue < 1 || queue > QUEUE_MAX) {
        PyErr_Format(PyExc_ValueError, "pipe Walker: a DMA queue of %zd copies (1 to %d)", queue, QUEUE_MAX);
        return -1;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(cross_targets); k++)
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(cross_targets, k), &FlagsType)) {
            PyErr_SetString(PyExc_TypeError, "pipe Walker: cross-core targets must be Flags");
            return -1;
        }
    if (cross_per < 1 || cross_from < 0 || cross_from >= cross_per || cross_sources < 0 || cross_sources > cross_per) {
        PyErr_SetString(PyExc_ValueError, "pipe Walker: cross-core sources out of range");
        return -1;
    }
    if (cycles_of(cross_latency, &w->cross_latency, -1, "a cross-core flag latency") < 0) return -1;
    if (!PyType_Check(signal)) { PyErr_SetString(PyExc_TypeError, "pipe Walker: Signal must be a type"); return -1; }
    if (!((Code *)code)->ops || ((Code *)code)->building) {
        PyErr_SetString(PyExc_TypeError, "pipe Walker: its Code is not initialised (Code(ops, n_mems))");
        return -1;
    }
    if (weight < 1) {  /* a run stands for `weight` identical blocks: at least its own */
        PyErr_Format(PyExc_ValueError, "pipe Walker: a run's weight of %lld blocks, expected at least 1", weight);
        return -1;
    }
    if (cycles_of(latency, &w->latency, -1, "a flag latency") < 0 || cycles_of(t, &w->t, -1, "a clock") < 0) return -1;
    if (intervals != Py_None && !PyList_Check(intervals)) {
        PyErr_SetString(PyExc_TypeError, "pipe Walker: intervals must be a list or None");
        return -1;
    }
    w->root = (Code *)Py_NewRef(code);
    w->vars = Py_NewRef(vars); w->flags = (Flags *)Py_NewRef(flags);
    w->intervals = intervals == Py_None ? NULL : Py_NewRef(intervals);
    w->names = Py_NewRef(names); w->pipe_name = Py_NewRef(pipe_name); w->kid = Py_NewRef(kid);
    w->env = Py_NewRef(env); w->transfer = Py_NewRef(transfer); w->signal = Py_NewRef(signal);
    w->after = Py_NewRef(after); w->whole = Py_NewRef(whole);
    w->blocked = Py_NewRef(blocked); w->blocked_key = Py_NewRef(blocked_key);
    w->offsets = Py_NewRef(offsets); w->acc = Py_NewRef(acc); w->diverged = Py_NewRef(diverged);
    w->meet = Py_NewRef(meet); w->end = Py_NewRef(end);
    w->cross = (Flags *)Py_NewRef(cross); w->cross_targets = Py_NewRef(cross_targets);
    w->cross_from = cross_from; w->cross_sources = cross_sources; w->cross_per = cross_per;
    w->weight = weight;
    w->queue = queue;
    w->q_n = 0;
    w->q_gated = 0;
    w->cap = 8;
    w->stack = PyMem_Calloc((size_t)w->cap, sizeof(Frame));
    Py_ssize_t m = w->root->n_mems ? w->root->n_mems : 1;
    w->local = PyMem_Calloc((size_t)m, sizeof(int64_t));
    w->touched = PyMem_Calloc((size_t)m, 1);
    if (!w->stack || !w->local || !w->touched) {  /* not initialised after all */
        walker_clear(w);
        PyMem_Free(w->stack); PyMem_Free(w->local); PyMem_Free(w->touched);
        w->stack = NULL; w->local = NULL; w->touched = NULL;
        PyErr_NoMemory();
        return -1;
    }
    w->stack[0].code = w->root;
    w->depth = 1;
    w->busy = w->waited = w->flops = w->data_wait = 0.0;
    return 0;
}

/* a TypeError unless __init__ has built the walker (Walker.__new__ alone leaves it empty) */
static int not_initialised(Walker *w) {
    if (w->root && w->stack) return 0;
    PyErr_SetString(PyExc_TypeError, "pipe Walker: not initialised (Walker(code, ...) first)");
    return 1;
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
        int64_t *into = &w->local[op->local_mem[k]];
        if (mul_add(*into, op->local_bytes[k], 1, into, "a buffer's bytes written") < 0) return -1;
        w->touched[op->local_mem[k]] = 1;
    }
    return 0;
}

/* a set of flag `f`, visible at `visible`: to its oldest waiting pipe, or kept */
static int hand_over(Flag *f, PyObject *visible) {
    if (!f->waiters.n) return fifo_push(&f->sets, visible);
    PyObject *sig = fifo_pop(&f->waiters);
    PyObject *res = PyObject_CallMethodOneArg(sig, s_fire, visible);
    Py_DECREF(sig);
    if (!res) return -1;
    Py_DECREF(res);
    return 0;
}

/* a SetFlag: visible at t + latency */
static int set_flag(Walker *w, Op *op) {
    Flag *f = flag_at(w->flags, op->flag);
    Num at;
    if (!f || num_add(w->t, w->latency, &at) < 0) return -1;
    PyObject *visible = num_to(at);
    if (!visible) return -1;
    int bad = hand_over(f, visible);
    Py_DECREF(visible);
    return bad;
}

/* the pipe had to wait until `visible` for a flag */
static int arrive(Walker *w, PyObject *visible_obj, PyObject *name) {
    Num v;
    if (num_from(visible_obj, &v) < 0) return -1;
    if (!w->q_gated || num_gt(v, w->q_gate)) {  /* the next copy is not requested before it */
        w->q_gate = v;
        w->q_gated = 1;
    }
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


static int now(Walker *w, Num *out) {
    PyObject *t = PyObject_GetAttr(w->env, s_now);
    if (!t) return -1;
    int bad = num_from(t, out);
    Py_DECREF(t);
    return bad;
}

/* 0 if an event's `callbacks` is a list (what it calls when processed), else a TypeError */
static int callback_list(PyObject *callbacks) {
    if (PyList_Check(callbacks)) return 0;
    PyErr_Format(PyExc_TypeError, "pipe walk: an event's callbacks must be a list, got %.100s",
                 Py_TYPE(callbacks)->tp_name);
    return -1;
}

/* start the pending copy now: memory.transfer(addrs, nbytes, segments, stride, write,
   cap, the end Signal's fire) */
static int start_copy(Walker *w) {
    Op *op = w->pending_op;
    PyObject *fire = PyObject_GetAttr(w->pending, s_fire);
    if (!fire) return -1;
    PyObject *args[7] = {w->addrs, op->nbytes, op->segments, op->stride, op->write ? Py_True : Py_False, op->cap,
                         fire};
    PyObject *st = PyObject_Vectorcall(w->transfer, args, 7, NULL);
    Py_DECREF(fire);
    if (!st) return -1;
    Py_XSETREF(w->st, st);
    return 0;
}

/* a RuntimeError if the walker is walking (`what` is called from a callback it called) or
   has ended */
static int not_now(Walker *w, const char *what) {
    if (!w->walking && !w->ended) return 0;
    PyErr_Format(PyExc_RuntimeError, "pipe Walker: %s %s", what,
                 w->walking ? "from inside its own walk (a callback it called)" : "after the pipe has ended");
    return 1;
}

/* the walker called by the timeout of a copy's start-up: the copy starts */
static PyObject *walker_call(Walker *w, PyObject *args, PyObject *kwds) {
    if (not_initialised(w) || not_now(w, "called")) return NULL;
    if (!w->pending || !w->pending_op || w->pending_op->kind != K_COPY || w->st) {
        PyErr_SetString(PyExc_RuntimeError, "pipe Walker: called with no copy to start");
        return NULL;
    }
    if (start_copy(w) < 0) return NULL;
    Py_RETURN_NONE;
}

/* when the data of copy `op`, met now, starts moving (see the DMA queue at the top) */
static int queue_start(Walker *w, Op *op, Num *start) {
    int chained = w->queue > 1 && w->q_n > 0 && !num_gt(w->t, w->q_end) && !num_gt(w->q_end, w->t);
    Num req = w->t;
    if (chained) {
        Num since = w->q_n >= w->queue - 1 ? w->q_start[(w->q_n - (w->queue - 1)) % QUEUE_MAX] : w->q_first;
        req = num_gt(since, w->q_req) ? since : w->q_req;
        if (w->q_gated && num_gt(w->q_gate, req)) req = w->q_gate;
    } else {
        w->q_n = 0;
        w->q_first = w->t;
    }
    if (num_add(req, op->startup, start) < 0) return -1;
    if (!chained) w->startup = op->startup;
    else if (num_gt(w->t, *start)) {
        *start = w->t;
        w->startup = (Num){0, 0, 0.0};
    } else if (num_sub(*start, w->t, &w->startup) < 0) return -1;
    w->q_start[w->q_n % QUEUE_MAX] = *start;
    w->q_n++;
    w->q_req = req;
    w->q_gated = 0;
    return 0;
}

/* a GM copy: its end Signal, handed to pipe.py (the copy starts now, or when its
   start-up has passed) */
static PyObject *begin_copy(Walker *w, Op *op) {
    int64_t a = op->base;
    for (Py_ssize_t k = 0; k < op->n_terms; k++) {
        PyObject *v = PyDict_GetItemWithError(w->vars, op->term_var[k]);
        if (!v) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "pipe walk: no loop variable %R", op->term_var[k]);
            return NULL;
        }
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) return NULL;
        if (mul_add(a, op->term_step[k], x, &a, "a copy's GM address") < 0) return NULL;
    }
    Num start, at;
    if (queue_start(w, op, &start) < 0 || now(w, &at) < 0) return NULL;
    PyObject *done = PyObject_CallOneArg(w->signal, w->env);
    if (!done) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(w->offsets);
    PyObject *addrs = PyList_New(n);
    if (!addrs) { Py_DECREF(done); return NULL; }
    for (Py_ssize_t k = 0; k < n; k++) {
        /* an offset that is not an int is converted by its __index__, which may change the list */
        if (PyList_GET_SIZE(w->offsets) != n) {
            PyErr_SetString(PyExc_RuntimeError, "pipe walk: the run's block offsets changed while a copy read them");
            Py_DECREF(addrs); Py_DECREF(done);
            return NULL;
        }
        long long o = PyLong_AsLongLong(PyList_GET_ITEM(w->offsets, k));
        int64_t at;
        PyObject *x = (o == -1 && PyErr_Occurred()) || mul_add(a, o, op->block_step, &at, "a copy's GM address") < 0
                          ? NULL : PyLong_FromLongLong(at);
        if (!x) { Py_DECREF(addrs); Py_DECREF(done); return NULL; }
        PyList_SET_ITEM(addrs, k, x);
    }
    Py_XSETREF(w->pending, Py_NewRef(done));
    Py_XSETREF(w->addrs, addrs);
    Py_CLEAR(w->st);
    w->pending_op = op;
    w->issue = w->t;
    if (num_gt(start, at)) {
        Num delay;
        PyObject *delay_obj = num_sub(start, at, &delay) < 0 ? NULL : num_to(delay);
        PyObject *timeout = delay_obj ? PyObject_CallFunctionObjArgs(w->after, w->env, delay_obj, NULL) : NULL;
        Py_XDECREF(delay_obj);
        PyObject *callbacks = timeout ? PyObject_GetAttr(timeout, s_callbacks) : NULL;
        Py_XDECREF(timeout);
        int bad = !callbacks || callback_list(callbacks) < 0 || PyList_Append(callbacks, (PyObject *)w) < 0;
        Py_XDECREF(callbacks);
        if (bad) { Py_DECREF(done); return NULL; }
    } else if (start_copy(w) < 0) {
        Py_DECREF(done);
        return NULL;
    }
    return done;
}

/* counter += value on the kernel's counters (Python numbers, added as Python adds them) */
static int acc_add(Walker *w, PyObject *counter, PyObject *value) {
    PyObject *cur = PyObject_GetAttr(w->acc, counter);
    if (!cur) return -1;
    PyObject *sum = PyNumber_Add(cur, value);
    Py_DECREF(cur);
    if (!sum) return -1;
    int bad = PyObject_SetAttr(w->acc, counter, sum);
    Py_DECREF(sum);
    return bad;
}

static int acc_add_stat(Walker *w, PyObject *counter, PyObject *stat) {
    PyObject *v = PyObject_GetAttr(w->st, stat);
    if (!v) return -1;
    int bad = acc_add(w, counter, v);
    Py_DECREF(v);
    return bad;
}

/* whole_cycles(x) (cycles.py) as an int: its fast test here, the rest there */
static int whole_of(Walker *w, double x, int64_t *out) {
    double c = ceil(x);
    if (!(c >= -(double)EXACT && c <= (double)EXACT)) {  /* also NaN: no int64 holds it */
        char *text = PyOS_double_to_string(x, 'g', 6, 0, NULL);  /* PyErr_Format has no float format */
        if (!text) return -1;
        PyErr_Format(PyExc_OverflowError, "pipe walk: a copy of %s cycles at its port, beyond 2^53", text);
        PyMem_Free(text);
        return -1;
    }
    if (c == x || c - x < 1.0 - CLEAR) {
        *out = (int64_t)c;
        return 0;
    }
    PyObject *r = PyObject_CallFunction(w->whole, "d", x);
    if (!r) return -1;
    *out = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* the pending copy has ended: the pipe's clock is now, its counters and the kernel's
   take what it did */
static int end_copy(Walker *w) {
    Op *op = w->pending_op;
    if (!w->st) {
        PyErr_SetString(PyExc_RuntimeError, "pipe walk: a copy ended before it started");
        return -1;
    }
    PyObject *uneven = PyObject_GetAttr(w->st, s_uneven);
    if (!uneven) return -1;
    int diverged = PyObject_IsTrue(uneven);
    Py_DECREF(uneven);
    if (diverged < 0) return -1;
    if (diverged) {  /* this run of the program is void: engine.run simulates it again */
        PyObject *exc = PyObject_CallNoArgs(w->diverged);
        if (!exc) return -1;
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
        return -1;
    }
    Num t, x, wc;
    if (now(w, &t) < 0) return -1;
    w->busy += num_sub_double(t, w->issue);
    PyObject *moved = PyObject_GetAttr(w->st, s_moved);
    if (!moved) return -1;
    long long moved_i = PyLong_AsLongLong(moved);
    if (moved_i == -1 && PyErr_Occurred()) { Py_DECREF(moved); return -1; }
    /* beyond start-up (as it ran) + bytes at the port rate: waiting for shared bandwidth
       / HBM (max(0, t - issue - startup - whole_cycles(moved / weight / cap)), as Python) */
    wc.is_float = 0; wc.d = 0.0;
    if (whole_of(w, (double)moved_i / (double)w->weight / op->cap_d, &wc.i) < 0 ||
        num_sub(t, w->issue, &x) < 0 || num_sub(x, w->startup, &x) < 0 || num_sub(x, wc, &x) < 0) {
        Py_DECREF(moved);
        return -1;
    }
    Num zero = {0, 0, 0.0};
    if (num_gt(x, zero)) w->data_wait += num_double(x);
    if (w->intervals && trace(w, op->name, w->issue, t) < 0) { Py_DECREF(moved); return -1; }
    int bad = acc_add(w, op->write ? s_gm_write : s_gm_read, moved);
    Py_DECREF(moved);
    if (bad) return -1;
    if (!op->write) {
        if (mul_add(w->local[op->local], op->nbytes_i, op->segments_i, &w->local[op->local],
                    "a buffer's bytes written") < 0)
            return -1;
        w->touched[op->local] = 1;
    }
    int64_t segs_i;
    if (mul_add(0, op->segments_i, w->weight, &segs_i, "a copy's segments") < 0) return -1;
    PyObject *segs = PyLong_FromLongLong(segs_i);
    if (!segs) return -1;
    bad = acc_add_stat(w, s_hbm_read, s_st_hbm_read) || acc_add_stat(w, s_hbm_write, s_st_hbm_write) ||
          acc_add_stat(w, s_l2_hit, s_st_hit) || acc_add_stat(w, s_l2_miss, s_st_miss) ||
          acc_add_stat(w, s_wasted, s_st_wasted) || acc_add_stat(w, s_misaligned, s_st_misaligned) ||
          acc_add(w, s_dma_segments, segs);
    Py_DECREF(segs);
    if (bad) return -1;
    w->t = w->q_end = t;
    return 0;
}

/* a wait whose flag (number `at` of core flags `g`) is not set yet: a Signal queued behind
   the flag's earlier waiters, which its setter fires with the cycle the set is visible at;
   the pipe is blocked on `op` (for the deadlock message) until it fires. The flag is found
   again once the Signal is made: making it may run Python (a Signal type of Python's) that
   walks another pipe of the core, whose sets may grow the flags (moving them) or set this one */
static PyObject *begin_wait(Walker *w, Op *op, Flags *g, Py_ssize_t at) {
    PyObject *sig = PyObject_CallOneArg(w->signal, w->env);
    if (!sig) return NULL;
    Flag *f = flag_at(g, at);
    if (f && f->sets.n) {  /* its waiter would wait behind a set no one takes */
        PyErr_Format(PyExc_RuntimeError, "pipe walk: flag %zd was set while its wait's Signal was made (a callback "
                     "it called)", at);
        f = NULL;
    }
    if (!f || fifo_push(&f->waiters, sig) < 0 || PyDict_SetItem(w->blocked, w->blocked_key, op->name) < 0) {
        Py_DECREF(sig);
        return NULL;
    }
    Py_XSETREF(w->pending, Py_NewRef(sig));
    w->pending_op = op;
    return sig;
}

static int end_wait(Walker *w) {
    if (PyDict_DelItem(w->blocked, w->blocked_key) < 0) return -1;
    PyObject *visible = PyObject_GetAttr(w->pending, s_value);
    if (!visible) return -1;
    int bad = arrive(w, visible, w->pending_op->name);
    Py_DECREF(visible);
    return bad;
}

/* the number of the cross-core flag `id` from `source` in a core's flags: flag id * AIVs
   per AIC + source (-1 with a ValueError past what a core keeps) */
static Py_ssize_t cross_number(Walker *w, Py_ssize_t id, Py_ssize_t source) {
    Py_ssize_t at;
    if (id < 0 || id >= FLAG_ID_MAX || __builtin_mul_overflow(id, w->cross_per, &at) ||
        __builtin_add_overflow(at, source, &at) || at >= FLAGS_MAX) {
        PyErr_Format(PyExc_ValueError, "pipe walk: cross-core flag id %zd from source %zd with %zd AIVs per AIC: "
                     "expected an id below %d and id x AIVs per AIC below %zd", id, source, w->cross_per,
                     FLAG_ID_MAX, FLAGS_MAX);
        return -1;
    }
    return at;
}

/* the cross-core flag `id` from `source` on core flags `g` */
static Flag *cross_flag(Walker *w, Flags *g, Py_ssize_t id, Py_ssize_t source) {
    Py_ssize_t at = cross_number(w, id, source);
    return at < 0 ? NULL : flag_at(g, at);
}

/* a CrossSetFlag posted now (its clock has been reached) to each target core, visible
   at t + the cross-core latency */
static int post_cross(Walker *w, Op *op) {
    Num at;
    if (num_add(w->t, w->cross_latency, &at) < 0) return -1;
    PyObject *visible = num_to(at);
    if (!visible) return -1;
    int bad = 0;
    for (Py_ssize_t k = 0; !bad && k < PyTuple_GET_SIZE(w->cross_targets); k++) {
        Flag *f = cross_flag(w, (Flags *)PyTuple_GET_ITEM(w->cross_targets, k), op->flag, w->cross_from);
        bad = !f || hand_over(f, visible) < 0;
    }
    Py_DECREF(visible);
    return bad ? -1 : 0;
}

/* CrossSetFlag: several pipes may set one cross flag, so it is posted in simulated-time
   order: once the clock has been reached (a timeout to it, if it is ahead of now) */
static PyObject *begin_cross_set(Walker *w, Op *op) {
    Num at;
    if (now(w, &at) < 0) return NULL;
    if (!num_gt(w->t, at)) return post_cross(w, op) < 0 ? NULL : Py_NewRef(Py_None);
    Num delay;
    PyObject *delay_obj = num_sub(w->t, at, &delay) < 0 ? NULL : num_to(delay);
    PyObject *timeout = delay_obj ? PyObject_CallFunctionObjArgs(w->after, w->env, delay_obj, NULL) : NULL;
    Py_XDECREF(delay_obj);
    if (!timeout) return NULL;
    Py_XSETREF(w->pending, Py_NewRef(timeout));
    w->pending_op = op;
    return timeout;
}

/* CrossWaitFlag: the latest of a set from each source, taken in source order; returns
   the Signal to wait for if one is not set yet, None when all are taken (the clock
   then moves to the latest), NULL on error */
static PyObject *cross_wait(Walker *w, Op *op) {
    for (; w->cross_k < w->cross_sources; w->cross_k++) {
        Py_ssize_t at = cross_number(w, op->flag, w->cross_k);
        Flag *f = at < 0 ? NULL : flag_at(w->cross, at);
        if (!f) return NULL;
        if (!f->sets.n) return begin_wait(w, op, w->cross, at);  /* not set yet: wait for it */
        PyObject *v_obj = fifo_pop(&f->sets);
        Num v;
        int bad = num_from(v_obj, &v);
        Py_DECREF(v_obj);
        if (bad < 0) return NULL;
        if (num_gt(v, w->cross_visible)) w->cross_visible = v;  /* max(visible, v) */
    }
    w->waited += num_sub_double(w->cross_visible, w->cross_t0);
    w->t = w->cross_visible;
    Py_RETURN_NONE;
}

/* a cross wait's signal has come: the set it brings, then the next source */
static int end_cross_wait(Walker *w) {
    if (PyDict_DelItem(w->blocked, w->blocked_key) < 0) return -1;
    PyObject *v_obj = PyObject_GetAttr(w->pending, s_value);
    if (!v_obj) return -1;
    Num v;
    int bad = num_from(v_obj, &v);
    Py_DECREF(v_obj);
    if (bad < 0) return -1;
    if (num_gt(v, w->cross_visible)) w->cross_visible = v;
    w->cross_k++;
    return 0;
}

/* Walk on until the pipe must wait (returns the event), meets an entry pipe.py does
   (returns it) or ends (None). */
/* an iteration of a loop over `var` has ended: on_mark(walk) if var is mark_var; -1 on error */
static int mark_here(Walker *w, PyObject *var) {
    int same = var == w->mark_var ? 1 : PyObject_RichCompareBool(var, w->mark_var, Py_EQ);
    if (same <= 0) return same;
    PyObject *call = Py_NewRef(w->on_mark);  /* held: the call may set on_mark anew */
    PyObject *r = PyObject_CallOneArg(call, (PyObject *)w);
    Py_DECREF(call);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *walk_on(Walker *w) {
    if (w->pending) {  /* the event the pipe waited for has come */
        Op *op = w->pending_op;
        int bad = op->kind == K_COPY ? end_copy(w)
                  : op->kind == K_WAIT ? end_wait(w)
                  : op->kind == K_CROSS_SET ? post_cross(w, op)
                  : end_cross_wait(w);
        Py_CLEAR(w->pending);
        Py_CLEAR(w->addrs);
        Py_CLEAR(w->st);
        w->pending_op = NULL;
        if (bad) return NULL;
        if (op->kind == K_CROSS_WAIT) {  /* the next source, if any */
            PyObject *r = cross_wait(w, op);
            if (r != Py_None) return r;
            Py_DECREF(r);
        }
    }
    while (w->depth) {
        Frame *f = &w->stack[w->depth - 1];
        if (f->pos == f->code->n) {
            if (f->loop && w->on_mark && w->mark_var && mark_here(w, f->loop->var) < 0) return NULL;
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
            Flag *g = flag_at(w->flags, op->flag);
            if (!g) return NULL;
            if (!g->sets.n) return begin_wait(w, op, w->flags, op->flag);  /* not set yet: the pipe waits for it */
            PyObject *visible = fifo_pop(&g->sets);
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
        case K_COPY:
            return begin_copy(w, op);
        case K_CROSS_SET: {
            PyObject *r = begin_cross_set(w, op);
            if (r != Py_None) return r;
            Py_DECREF(r);
            break;
        }
        case K_CROSS_WAIT: {
            w->q_n = 0;  /* no copy is requested across it */
            w->cross_k = 0;
            w->cross_t0 = w->cross_visible = w->t;
            PyObject *r = cross_wait(w, op);
            if (r != Py_None) return r;
            Py_DECREF(r);
            break;
        }
        default:  /* a barrier or SyncAll: no copy is requested across it */
            w->q_n = 0;
            return Py_NewRef(op->entry);
        }
    }
    Py_RETURN_NONE;
}

/* wait for `ev`: the pipe's resume goes onto its callbacks. 1 if it has been
   processed already (nothing to wait for: its value is to be used now), else 0. */
static int wait_for(Walker *w, PyObject *ev) {
    PyObject *callbacks = PyObject_GetAttr(ev, s_callbacks);
    if (!callbacks) return -1;
    int r = callbacks == Py_None ? 1 : callback_list(callbacks) < 0 ? -1 : PyList_Append(callbacks, w->resume_cb);
    Py_DECREF(callbacks);
    return r;
}

/* resume(event): the pipe's process goes on from `event` (what it waited for, or its
   start) until it must wait again or ends, as SimPy's Process._resume runs a process's
   generator: what it waits for gets this resume as a callback, and at its end its
   Signal is scheduled with its clock as a finished Process is. A barrier, SyncAll or
   cross-core flag is pipe.py's meet(walk, entry), a generator driven the same way. */
static PyObject *resume(Walker *w, PyObject *event);

static PyObject *walker_resume(Walker *w, PyObject *event) {
    if (not_initialised(w)) return NULL;
    if (!w->resume_cb) { PyErr_SetString(PyExc_TypeError, "pipe Walker: resumed before start()"); return NULL; }
    if (not_now(w, "resumed")) return NULL;
    w->walking = 1;
    PyObject *r = resume(w, event);
    w->walking = 0;
    return r;
}

static PyObject *resume(Walker *w, PyObject *event) {
    PyObject *value = NULL;  /* to send into the meet generator */
    if (w->gen) {
        value = PyObject_GetAttr(event, s_value);
        if (!value) return NULL;
    }
    for (;;) {
        if (w->gen) {
            PyObject *ev;
            PySendResult r = PyIter_Send(w->gen, value, &ev);
            Py_CLEAR(value);
            if (r == PYGEN_ERROR) return NULL;
            if (r == PYGEN_RETURN) {  /* the meeting is over: walk on */
                Py_DECREF(ev);
                Py_CLEAR(w->gen);
                continue;
            }
            int done = wait_for(w, ev);
            if (done == 1) value = PyObject_GetAttr(ev, s_value);
            Py_DECREF(ev);
            if (done < 0 || (done == 1 && !value)) return NULL;
            if (done == 1) continue;
            Py_RETURN_NONE;
        }
        PyObject *x = walk_on(w);
        if (!x) return NULL;
        if (x == Py_None) {  /* the end: the counters, then the end Signal with the clock */
            Py_DECREF(x);
            w->ended = 1;
            PyObject *r = PyObject_CallOneArg(w->end, (PyObject *)w);
            if (!r) return NULL;
            Py_DECREF(r);
            PyObject *t = num_to(w->t);
            r = t ? PyObject_CallMethodOneArg(w->done, s_fire, t) : NULL;
            Py_XDECREF(t);
            if (!r) return NULL;
            Py_DECREF(r);
            Py_RETURN_NONE;
        }
        if (PyObject_TypeCheck(x, (PyTypeObject *)w->signal)) {  /* a copy's end or a flag's set */
            int done = wait_for(w, x);
            Py_DECREF(x);
            if (done != 0) {
                if (done == 1) PyErr_SetString(PyExc_RuntimeError, "pipe walk: waits for an event already processed");
                return NULL;
            }
            Py_RETURN_NONE;
        }
        w->gen = PyObject_CallFunctionObjArgs(w->meet, (PyObject *)w, x, NULL);  /* a barrier, SyncAll, cross flag */
        Py_DECREF(x);
        if (!w->gen) return NULL;
        value = Py_NewRef(Py_None);
    }
}

/* start(): the pipe's process starts where a SimPy process made now would (its
   initialisation is scheduled now, before anything of normal priority); returns the
   Signal that fires with the pipe's clock when it ends */
static PyObject *walker_start(Walker *w, PyObject *unused) {
    if (not_initialised(w)) return NULL;
    if (w->resume_cb) { PyErr_SetString(PyExc_TypeError, "pipe Walker: started twice"); return NULL; }
    w->resume_cb = PyObject_GetAttrString((PyObject *)w, "resume");
    w->done = w->resume_cb ? PyObject_CallOneArg(w->signal, w->env) : NULL;
    PyObject *init = w->done ? PyObject_CallOneArg(w->signal, w->env) : NULL;
    if (!init) return NULL;
    PyObject *queue = NULL, *now = NULL, *res = NULL;
    if (wait_for(w, init) != 0) goto done;
    queue = PyObject_GetAttr(w->env, s_queue);
    now = queue ? PyObject_GetAttr(w->env, s_now) : NULL;
    if (now) res = PyObject_CallMethod(queue, "push", "OiO", now, URGENT, init);
done:
    Py_DECREF(init);
    Py_XDECREF(queue);
    Py_XDECREF(now);
    if (!res) return NULL;
    Py_DECREF(res);
    return Py_NewRef(w->done);
}

/* flush(local_bytes, weight): add the bytes written into each buffer (times the run's
   weight) into the kernel's counters; `mems` names the buffers by index */
static PyObject *walker_flush(Walker *w, PyObject *const *args, Py_ssize_t nargs) {
    if (not_initialised(w)) return NULL;
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "flush(local_bytes, mems, weight)"); return NULL; }
    PyObject *counters = args[0], *mems = args[1];
    long long weight = PyLong_AsLongLong(args[2]);
    if (weight == -1 && PyErr_Occurred()) return NULL;
    if (weight < 1) {  /* as the Walker's: the blocks the run stands for, at least its own */
        PyErr_Format(PyExc_ValueError, "flush: a weight of %lld blocks, expected at least 1", weight);
        return NULL;
    }
    if (!PyTuple_Check(mems) || PyTuple_GET_SIZE(mems) != w->root->n_mems) {
        PyErr_SetString(PyExc_ValueError, "flush: mems must name every buffer of the Code");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < w->root->n_mems; k++) {
        if (!w->touched[k]) continue;
        PyObject *mem = PyTuple_GET_ITEM(mems, k);
        PyObject *cur = PyObject_GetItem(counters, mem);  /* a defaultdict(float) */
        if (!cur) return NULL;
        int64_t bytes;
        if (mul_add(0, w->local[k], weight, &bytes, "a buffer's bytes written") < 0) { Py_DECREF(cur); return NULL; }
        PyObject *add = PyLong_FromLongLong(bytes);
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

static PyObject *walker_get_local(Walker *w, void *closure) {
    if (not_initialised(w)) return NULL;
    PyObject *out = PyTuple_New(w->root->n_mems);
    for (Py_ssize_t k = 0; out && k < w->root->n_mems; k++) {
        PyObject *n = PyLong_FromLongLong(w->local[k]);
        if (!n) { Py_CLEAR(out); break; }
        PyTuple_SET_ITEM(out, k, n);
    }
    return out;
}

/* the clock, as __init__ takes it: a NaN would reach the event queue far from here, and
   its comparisons (a flag's visible cycle, a copy's start) would all be false */
static int walker_set_t(Walker *w, PyObject *v, void *closure) {
    if (!v) { PyErr_SetString(PyExc_TypeError, "t cannot be deleted"); return -1; }
    Num t;
    if (cycles_of(v, &t, -1, "a clock") < 0) return -1;
    w->t = t;
    return 0;
}

/* busy, waited, flops, data_wait: floats (meet adds its waits into them); the kernel's
   counters take them at the end, so a NaN, inf or negative one is refused */
#define DOUBLE_FIELD(field)                                                              \
    static PyObject *walker_get_##field(Walker *w, void *closure) {                     \
        return PyFloat_FromDouble(w->field);                                             \
    }                                                                                    \
    static int walker_set_##field(Walker *w, PyObject *v, void *closure) {               \
        if (!v || !PyFloat_Check(v)) {                                                   \
            PyErr_SetString(PyExc_TypeError, #field " must be a float");                 \
            return -1;                                                                   \
        }                                                                                \
        double d = PyFloat_AS_DOUBLE(v);                                                 \
        if (!(d >= 0.0 && d < INFINITY)) {                                               \
            PyErr_Format(PyExc_ValueError, "pipe Walker: " #field " of %R, expected a "  \
                         "finite number >= 0", v);                                      \
            return -1;                                                                   \
        }                                                                                \
        w->field = d;                                                                    \
        return 0;                                                                        \
    }

/* mark_var and on_mark: None or an object (see the struct); set both or neither */
#define OBJECT_FIELD(field)                                                              \
    static PyObject *walker_get_##field(Walker *w, void *closure) {                     \
        return Py_NewRef(w->field ? w->field : Py_None);                                 \
    }                                                                                    \
    static int walker_set_##field(Walker *w, PyObject *v, void *closure) {               \
        if (!v) { PyErr_SetString(PyExc_TypeError, #field " cannot be deleted"); return -1; } \
        Py_XSETREF(w->field, v == Py_None ? NULL : Py_NewRef(v));                         \
        return 0;                                                                        \
    }

OBJECT_FIELD(mark_var)
OBJECT_FIELD(on_mark)

DOUBLE_FIELD(busy)
DOUBLE_FIELD(waited)
DOUBLE_FIELD(flops)
DOUBLE_FIELD(data_wait)

static PyMethodDef walker_methods[] = {
    {"start", (PyCFunction)walker_start, METH_NOARGS, "start the pipe's process; the Signal of its end"},
    {"resume", (PyCFunction)walker_resume, METH_O, "resume(event): the process goes on (a callback)"},
    {"flush", (PyCFunction)(void (*)(void))walker_flush, METH_FASTCALL,
     "flush(local_bytes, mems, weight): add the local buffer bytes into the kernel's counters"},
    {NULL},
};

static PyGetSetDef walker_getset[] = {
    {"t", (getter)walker_get_t, (setter)walker_set_t, "the pipe's clock (cycles)", NULL},
    {"busy", (getter)walker_get_busy, (setter)walker_set_busy, "cycles busy so far", NULL},
    {"waited", (getter)walker_get_waited, (setter)walker_set_waited, "cycles waited so far", NULL},
    {"flops", (getter)walker_get_flops, (setter)walker_set_flops, "flops so far", NULL},
    {"data_wait", (getter)walker_get_data_wait, (setter)walker_set_data_wait,
     "cycles its copies waited for shared bandwidth or HBM so far", NULL},
    {"mark_var", (getter)walker_get_mark_var, (setter)walker_set_mark_var,
     "the loop variable whose iterations are marked (None: none)", NULL},
    {"on_mark", (getter)walker_get_on_mark, (setter)walker_set_on_mark,
     "on_mark(walk), called as each iteration of a loop over mark_var ends (None: never)", NULL},
    {"local", (getter)walker_get_local, NULL, "bytes written into each local buffer since the last flush", NULL},
    {NULL},
};

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._pipe.Walker",
    .tp_basicsize = sizeof(Walker),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Walker(code, vars, flags, waiters, flag_latency, t, intervals, names, pipe_name, kernel_id, env, "
               "transfer, Signal, after, whole_cycles, blocked, blocked_key, offsets, weight, acc, diverged)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)walker_init,
    .tp_dealloc = (destructor)walker_dealloc,
    .tp_traverse = (traverseproc)walker_traverse,
    .tp_clear = (inquiry)walker_clear,
    .tp_call = (ternaryfunc)walker_call,
    .tp_methods = walker_methods,
    .tp_getset = walker_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pipe", "A pipe's walk through its stream, in C.", -1,
                                    NULL};

PyMODINIT_FUNC PyInit__pipe(void) {
    s_fire = PyUnicode_InternFromString("fire");
    s_queue = PyUnicode_InternFromString("_queue");
    s_now = PyUnicode_InternFromString("_now");
    s_value = PyUnicode_InternFromString("_value");
    s_callbacks = PyUnicode_InternFromString("callbacks");
    s_uneven = PyUnicode_InternFromString("uneven");
    s_moved = PyUnicode_InternFromString("moved");
    /* the kernel's counters (stats.StatsAccumulator) and the transfer's (memory.TransferStats) */
    s_gm_read = PyUnicode_InternFromString("gm_read_bytes");
    s_gm_write = PyUnicode_InternFromString("gm_write_bytes");
    s_hbm_read = PyUnicode_InternFromString("hbm_read_bytes");
    s_hbm_write = PyUnicode_InternFromString("hbm_write_bytes");
    s_l2_hit = PyUnicode_InternFromString("l2_hit_bytes");
    s_l2_miss = PyUnicode_InternFromString("l2_miss_bytes");
    s_wasted = PyUnicode_InternFromString("wasted_burst_bytes");
    s_misaligned = PyUnicode_InternFromString("misaligned_segments");
    s_dma_segments = PyUnicode_InternFromString("dma_segments");
    s_st_hbm_read = PyUnicode_InternFromString("hbm_read");
    s_st_hbm_write = PyUnicode_InternFromString("hbm_write");
    s_st_hit = PyUnicode_InternFromString("hit_bytes");
    s_st_miss = PyUnicode_InternFromString("miss_bytes");
    s_st_wasted = PyUnicode_InternFromString("wasted");
    s_st_misaligned = PyUnicode_InternFromString("misaligned");
    if (!s_fire || !s_queue || !s_now || !s_value || !s_callbacks || !s_uneven || !s_moved ||
        !s_gm_read || !s_gm_write || !s_hbm_read || !s_hbm_write || !s_l2_hit || !s_l2_miss || !s_wasted ||
        !s_misaligned || !s_dma_segments || !s_st_hbm_read || !s_st_hbm_write || !s_st_hit || !s_st_miss ||
        !s_st_wasted || !s_st_misaligned)
        return NULL;
    if (PyType_Ready(&CodeType) < 0 || PyType_Ready(&FlagsType) < 0 || PyType_Ready(&WalkerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&CodeType);
    Py_INCREF(&WalkerType);
    if (PyModule_AddObject(m, "Code", (PyObject *)&CodeType) < 0 ||
        PyModule_AddObject(m, "Walker", (PyObject *)&WalkerType) < 0 ||
        PyModule_AddObjectRef(m, "Flags", (PyObject *)&FlagsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
