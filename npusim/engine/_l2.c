/* The L2's line walk (npusim/engine/l2cache.py holds the model and its rules).

   One access touches a transfer's lines in pieces of `sets` lines. Per piece:
   every line is looked up against the state at the piece's start; a hit refreshes
   its line's last use (and makes it dirty if written) and reports the fill it is
   still waiting for; then, per set, the r-th miss takes the r-th least recently
   used way (the lowest way first among equals), and past `ways` misses only the
   last `ways` stay (the earlier ones are evicted by the later ones: written back
   if written). Line i of a piece is used at clock + 1 + i; the clock then moves
   on by the piece's length.

   The state lives in numpy arrays owned by the Python object (tag, last use,
   dirty, fill index per slot; slot = set * ways + way), so Python code and tests
   read it directly; the core keeps its own scratch space and the per-fill
   "arrived" flags. A slot's tag is its line divided by the number of sets (the set
   and the tag give the line back), and tags and fill indices are 32-bit: a set's
   ways then lie in one 64-byte host cache line, and the three arrays a line's
   lookup touches take a third less of the host's caches (-7% on a 4096-token
   prefill). Last uses are 32-bit too, counted from an epoch: only their order within
   a set matters (the LRU victim, the order of a piece's misses), so when the clock
   would pass what 32 bits hold, each set's values are replaced by their ranks (equal
   values, equal ranks) and the epoch moves up - every later choice is the same. A
   set's 16 last uses then lie in one host cache line too, and its least recently
   used way is found with AVX2 (-4% on a K3 decode step, whose streamed KV cache
   misses on most lines). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

/* the largest line or burst (l2.line_bytes, dma.burst_bytes; hw/config.py bounds them
   alike, as UNIT_BYTES_MAX): far above any chip's, and the burst rounding walks at most
   this many segments per transfer */
#define UNIT_MAX ((int64_t)1 << 20)

typedef struct {
    PyObject_HEAD
    Py_buffer bufs[4];          /* tags, last use, dirty, fill: the caller's arrays */
    int held;                   /* how many of bufs are held */
    int32_t *tags, *fill;       /* tag -1: an empty slot; fill index 0: none pending */
    int32_t *use;               /* last use - epoch (0: never used) */
    uint8_t *dirty;
    int64_t sets, ways, rotate, clock;
    int64_t line_end;           /* lines below it have a 32-bit tag */
    int64_t epoch, use_max;     /* a use is stored as clock - epoch, at most use_max */
    uint8_t *filled;            /* per fill index: has it arrived? (index 0: arrived) */
    Py_ssize_t filled_cap;
    int64_t in_flight;
    /* scratch, `sets` entries each (a piece is at most `sets` lines) */
    int64_t *miss_set, *miss_at, *pend, *start, *order, *sorted;
    int32_t *miss_tag;          /* a missed line's tag, found by set_in_run (no division to place it) */
    int64_t *count, *stamp, stamp_now;
    int64_t *lru;               /* `ways` entries */
    int64_t *hint;              /* per set: the way of its line last hit or placed */
} Core;

/* back to what Core.__new__ made: not initialised (tags NULL, no sets) */
static void core_release(Core *c) {
    for (int i = 0; i < c->held; i++) PyBuffer_Release(&c->bufs[i]);
    c->held = 0;
    c->tags = c->fill = c->use = NULL;
    c->dirty = NULL;
    c->sets = c->ways = 0;
    c->filled_cap = 0;
    PyMem_Free(c->filled); c->filled = NULL;
    PyMem_Free(c->miss_set); c->miss_set = NULL;
    PyMem_Free(c->miss_at); c->miss_at = NULL;
    PyMem_Free(c->miss_tag); c->miss_tag = NULL;
    PyMem_Free(c->pend); c->pend = NULL;
    PyMem_Free(c->start); c->start = NULL;
    PyMem_Free(c->order); c->order = NULL;
    PyMem_Free(c->sorted); c->sorted = NULL;
    PyMem_Free(c->count); c->count = NULL;
    PyMem_Free(c->stamp); c->stamp = NULL;
    PyMem_Free(c->lru); c->lru = NULL;
    PyMem_Free(c->hint); c->hint = NULL;
}

static void core_dealloc(Core *c) {
    core_release(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* the buffer's item format, without a native byte order mark ('<' on a little-endian host too) */
static const char *format_of(const Py_buffer *b) {
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || (*f == '<' && PY_LITTLE_ENDIAN) || (*f == '>' && PY_BIG_ENDIAN)) f++;
    return f;
}

/* one of the caller's arrays, held: n items, of 32-bit signed ints (itemsize 4) or bytes
   (itemsize 1), at an address aligned for them (the walk reads them as such) */
static int take(Core *c, PyObject *obj, Py_ssize_t itemsize, Py_ssize_t n, const char *what) {
    Py_buffer *b = &c->bufs[c->held];
    if (PyObject_GetBuffer(obj, b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    c->held++;
    const char *f = format_of(b);
    int typed = itemsize == 4 ? f[0] == 'i' && !f[1] : (f[0] == 'B' || f[0] == 'b' || f[0] == '?') && !f[1];
    if (b->itemsize != itemsize || b->len != n * itemsize || !typed) {
        PyErr_Format(PyExc_ValueError, "L2 core: %s must hold %zd %s (got format '%s', %zd bytes)", what, n,
                     itemsize == 4 ? "int32s" : "bytes", b->format ? b->format : "B", b->len);
        return -1;
    }
    if ((uintptr_t)b->buf % (uintptr_t)itemsize) {
        PyErr_Format(PyExc_ValueError, "L2 core: %s must be aligned to its %zd-byte items", what, itemsize);
        return -1;
    }
    return 0;
}

static int core_init(Core *c, PyObject *args, PyObject *kwds) {
    PyObject *tags, *use, *dirty, *fill;
    long long sets, ways, rotate, use_max = INT32_MAX;
    if (!PyArg_ParseTuple(args, "OOOOLLL|L", &tags, &use, &dirty, &fill, &sets, &ways, &rotate, &use_max)) return -1;
    core_release(c);
    if (sets < 1 || sets > INT32_MAX || ways < 1 || ways > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "L2 core: %lld sets of %lld ways, expected each 1 to 2^31 - 1", sets, ways);
        return -1;
    }
    Py_ssize_t n = (Py_ssize_t)(sets * ways);  /* below 2^62: each array's bytes fit */
    if (rotate < 0 || rotate > INT32_MAX) {  /* (line / sets) * rotate stays below 2^62 */
        PyErr_Format(PyExc_ValueError, "L2 core: rotate %lld, expected 0 to 2^31 - 1", rotate);
        return -1;
    }
    if (use_max < sets + ways || use_max > INT32_MAX) {  /* a piece's uses must fit after a re-ranking */
        PyErr_SetString(PyExc_ValueError, "L2 core: use_max must lie in [sets + ways, 2^31 - 1]");
        return -1;
    }
    if (take(c, tags, 4, n, "tags") || take(c, use, 4, n, "last_use") || take(c, dirty, 1, n, "dirty") ||
        take(c, fill, 4, n, "fill")) {
        core_release(c);
        return -1;
    }
    c->tags = c->bufs[0].buf; c->use = c->bufs[1].buf; c->dirty = c->bufs[2].buf; c->fill = c->bufs[3].buf;
    c->sets = sets; c->ways = ways; c->rotate = rotate; c->clock = 0; c->in_flight = 0; c->stamp_now = 0;
    c->line_end = sets <= INT32_MAX ? ((int64_t)INT32_MAX + 1) * sets : INT64_MAX;
    c->epoch = 0; c->use_max = use_max;
    c->filled_cap = 1024;
    c->filled = PyMem_Malloc(c->filled_cap);
    size_t s = (size_t)sets * sizeof(int64_t);
    c->miss_set = PyMem_Malloc(s); c->miss_at = PyMem_Malloc(s); c->pend = PyMem_Malloc(s);
    c->miss_tag = PyMem_Malloc((size_t)sets * sizeof(int32_t));
    c->start = PyMem_Malloc(s); c->order = PyMem_Malloc(s); c->sorted = PyMem_Malloc(s);
    c->count = PyMem_Malloc(s); c->stamp = PyMem_Calloc((size_t)sets, sizeof(int64_t));
    c->lru = PyMem_Malloc((size_t)ways * sizeof(int64_t));
    c->hint = PyMem_Calloc((size_t)sets, sizeof(int64_t));
    if (!c->filled || !c->miss_set || !c->miss_at || !c->miss_tag || !c->pend || !c->start || !c->order || !c->sorted || !c->count ||
        !c->stamp || !c->lru || !c->hint) {
        core_release(c);
        PyErr_NoMemory();
        return -1;
    }
    memset(c->filled, 1, (size_t)c->filled_cap);
    return 0;
}

/* a TypeError unless __init__ has given the core its arrays (Core.__new__ alone has none) */
static int core_not_initialised(const Core *c) {
    if (c->tags && c->filled) return 0;
    PyErr_SetString(PyExc_TypeError, "L2 core: not initialised (Core(tags, last_use, dirty, fill, sets, ways, rotate) "
                                     "first)");
    return 1;
}

static inline int64_t set_of(const Core *c, int64_t line) {
    return (line + (line / c->sets * c->rotate) % c->sets) % c->sets;
}

/* set_of for a run of lines: the block of `sets` consecutive line numbers a line is in
   (and that block's rotation) is kept from the previous line, so a transfer's lines,
   which come in runs, need no division each. *first is the block's first line and
   *tag the tag of its lines (the block's number). */
static inline int64_t set_in_run(const Core *c, int64_t line, int64_t *first, int64_t *shift, int32_t *tag) {
    int64_t r = line - *first;
    if (r < 0 || r >= c->sets) {
        int64_t q = line / c->sets;
        *first = q * c->sets;
        *shift = (q * c->rotate) % c->sets;
        *tag = (int32_t)q;
        r = line - *first;
    }
    r += *shift;
    return r >= c->sets ? r - c->sets : r;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
static int have_avx2;  /* set at import: the CPU has AVX2 */

/* the AVX2 paths take a row of `ways`: eight at a time, at most 64 (one bit each in a mask) */
static inline int avx2_row(int64_t ways) { return have_avx2 && ways <= 64 && !(ways & 7); }

/* the lowest way of `row` (ways <= 64, a multiple of 8) holding `tag`, -1 if none:
   eight ways per compare, the matches gathered into one mask (no branch per way).
   A prefill's L2 walk searches a set's ways for 46 of its 81 million lines. */
__attribute__((target("avx2"))) static int64_t find_way_avx2(const int32_t *row, int64_t ways, int32_t tag) {
    const __m256i key = _mm256_set1_epi32(tag);
    uint64_t match = 0;
    for (int64_t w = 0; w < ways; w += 8) {
        __m256i eq = _mm256_cmpeq_epi32(_mm256_loadu_si256((const __m256i *)(row + w)), key);
        match |= (uint64_t)_mm256_movemask_ps(_mm256_castsi256_ps(eq)) << w;
    }
    return match ? __builtin_ctzll(match) : -1;
}
#endif

/* the slot of the line with `tag` in `set`, -1 if it is not cached: every way
   compared, without a branch per way (where a line sits is data; mispredicted exits
   cost more than the compares); with AVX2 when the CPU has it and the ways allow */
static inline int64_t find_slot(const Core *c, int32_t tag, int64_t set) {
    const int64_t ways = c->ways;
    const int32_t *row = c->tags + set * ways;
    int64_t found = -1;
#ifdef HAVE_AVX2_PATH
    if (avx2_row(ways)) {
        found = find_way_avx2(row, ways, tag);
        return found < 0 ? -1 : set * ways + found;
    }
#endif
    for (int64_t w = ways - 1; w >= 0; w--) found = row[w] == tag ? w : found;
    return found < 0 ? -1 : set * ways + found;
}

#ifdef HAVE_AVX2_PATH
/* lru_way for ways a multiple of 8 up to 64: the least last use, eight ways per
   min, then the lowest way holding it (the same way the plain loop picks) */
__attribute__((target("avx2"))) static int64_t lru_way_avx2(const int32_t *row, int64_t ways) {
    __m256i m = _mm256_loadu_si256((const __m256i *)row);
    for (int64_t w = 8; w < ways; w += 8) m = _mm256_min_epi32(m, _mm256_loadu_si256((const __m256i *)(row + w)));
    __m128i h = _mm_min_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_min_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_min_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    return find_way_avx2(row, ways, _mm_cvtsi128_si32(h));  /* the least value is in the row */
}
#endif

/* the least recently used way of a set (the lowest among equals), without a branch
   per way (which way is oldest is data); with AVX2 when the CPU has it and the ways allow */
static inline int64_t lru_way(const int32_t *row_use, int64_t ways) {
#ifdef HAVE_AVX2_PATH
    if (avx2_row(ways)) return lru_way_avx2(row_use, ways);
#endif
    int64_t best = 0, oldest = row_use[0];
    for (int64_t w = 1; w < ways; w++) {
        int64_t u = row_use[w];
        int older = u < oldest;
        best = older ? w : best;
        oldest = older ? u : oldest;
    }
    return best;
}

/* a buffer of 8-byte signed integers (numpy int64: format "q" or "l" on LP64), aligned
   for them (the walk reads them as int64) */
static int is_int64(const Py_buffer *b) {
    const char *f = format_of(b);
    return b->itemsize == 8 && (f[0] == 'q' || f[0] == 'l') && f[1] == 0 && !((uintptr_t)b->buf % 8);
}

static int cmp_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Mark position `pos` of the access in the write-back mask (made on first use). */
static int mark_back(uint8_t **wb, PyObject **wb_obj, Py_ssize_t total, Py_ssize_t pos) {
    if (!*wb) {
        *wb_obj = PyByteArray_FromStringAndSize(NULL, total);
        if (!*wb_obj) return -1;
        *wb = (uint8_t *)PyByteArray_AS_STRING(*wb_obj);
        memset(*wb, 0, (size_t)total);
    }
    (*wb)[pos] = 1;
    return 0;
}

/* A missed line (its tag) takes `slot`; the line it evicts is written back if dirty (an
   empty slot never is): marked at position `pos` of the access. */
static inline int place(Core *c, int64_t slot, int32_t tag, int64_t use, int write, int64_t fill_id,
                        Py_ssize_t pos, uint8_t **wb, PyObject **wb_obj, Py_ssize_t total) {
    uint8_t back = c->dirty[slot];
    c->tags[slot] = tag;
    c->use[slot] = (int32_t)use;
    c->dirty[slot] = (uint8_t)write;
    c->fill[slot] = (int32_t)fill_id;
    return back ? mark_back(wb, wb_obj, total, pos) : 0;
}

/* c->lru[0..ways): the ways of a set in the order of their last uses in `row_use`,
   least recent first, the lowest way first among equals (an insertion sort: stable) */
static void order_ways(Core *c, const int32_t *row_use) {
    for (int64_t w = 0; w < c->ways; w++) {
        int64_t j = w;
        while (j > 0 && row_use[c->lru[j - 1]] > row_use[w]) { c->lru[j] = c->lru[j - 1]; j--; }
        c->lru[j] = w;
    }
}

#ifdef HAVE_AVX2_PATH
/* lru_ways for ways a multiple of 8 up to 64: the least recently used way, `need` times,
   each taken out of the running once chosen. A use u is compared as u ^ 2^31 unsigned
   (the same order as signed); a way taken out holds 2^32 - 1, which only a use of 2^31 - 1
   maps to as well: when the least value left is that one, the lowest way not yet taken
   holds it (every way not taken holds it then). */
__attribute__((target("avx2"))) static void lru_ways_avx2(const int32_t *row_use, int64_t ways, int64_t need,
                                                          int64_t *out) {
    uint32_t key[64];
    uint64_t taken = 0;
    const __m256i flip = _mm256_set1_epi32(INT32_MIN);
    for (int64_t w = 0; w < ways; w += 8)
        _mm256_storeu_si256((__m256i *)(key + w),
                            _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row_use + w)), flip));
    for (int64_t k = 0; k < need; k++) {
        __m256i m = _mm256_loadu_si256((const __m256i *)key);
        for (int64_t w = 8; w < ways; w += 8) m = _mm256_min_epu32(m, _mm256_loadu_si256((const __m256i *)(key + w)));
        __m128i h = _mm_min_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
        h = _mm_min_epu32(h, _mm_shuffle_epi32(h, 0x4E));
        h = _mm_min_epu32(h, _mm_shuffle_epi32(h, 0xB1));
        uint32_t least = (uint32_t)_mm_cvtsi128_si32(h);
        int64_t w = least == UINT32_MAX ? __builtin_ctzll(~taken) : find_way_avx2((const int32_t *)key, ways,
                                                                                   (int32_t)least);
        out[k] = w;
        key[w] = UINT32_MAX;
        taken |= (uint64_t)1 << w;
    }
}
#endif

/* c->lru[0..need): the `need` least recently used ways of a set, least recent first, the
   lowest way first among equals (order_ways' first `need`) */
static void lru_ways(Core *c, const int32_t *row_use, int64_t need) {
#ifdef HAVE_AVX2_PATH
    if (avx2_row(c->ways)) {
        lru_ways_avx2(row_use, c->ways, need, c->lru);
        return;
    }
#endif
    order_ways(c, row_use);
}

/* Every set's last uses replaced by their ranks within the set (equal values, equal
   ranks; the ways ordered by order_ways, as for a piece's misses), and the epoch
   moved so that the next use, `ways`, lies above every rank: each set's order - all
   that the walk compares - is what it was. */
static void rerank(Core *c) {
    const int64_t ways = c->ways;
    for (int64_t s = 0; s < c->sets; s++) {
        int32_t *row = c->use + s * ways;
        order_ways(c, row);
        int32_t rank = 0, prev = row[c->lru[0]];
        for (int64_t k = 0; k < ways; k++) {  /* row[w] is read before it is overwritten */
            int64_t w = c->lru[k];
            if (row[w] != prev) { rank++; prev = row[w]; }
            row[w] = rank;
        }
    }
    c->epoch = c->clock + 1 - ways;
}

/* One piece: lines[0..n) + shift_by at position `at` of the access. Returns hits, or -1 on error. */
static Py_ssize_t piece(Core *c, const int64_t *lines, int64_t shift_by, Py_ssize_t n, Py_ssize_t at, int write,
                        int64_t fill_id,
                        uint8_t **wb, PyObject **wb_obj, Py_ssize_t total, PyObject *waits, int64_t **missed,
                        Py_ssize_t *n_missed, int *any_miss) {
    Py_ssize_t misses = 0, pending = 0;
    if (c->clock + n - c->epoch > c->use_max) rerank(c);  /* the piece's last use would not fit */
    int64_t base = c->clock + 1 - c->epoch, first = -c->sets - 1, shift = 0;
    int32_t tag = 0;
    int64_t stamp = ++c->stamp_now;
    int distinct = 1;  /* every missed line in a set of its own (a contiguous run's are) */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t line;
        if (__builtin_add_overflow(lines[i], shift_by, &line)) {
            PyErr_Format(PyExc_ValueError, "L2 core: line number %lld + %lld is beyond 2^63", (long long)lines[i],
                         (long long)shift_by);
            return -1;
        }
        if (line < 0 || line >= c->line_end) {
            PyErr_Format(PyExc_ValueError, "L2 core: line number %lld is %s", (long long)line,
                         line < 0 ? "negative" : "past the last one a 32-bit tag can name");
            return -1;
        }
        int64_t s = set_in_run(c, line, &first, &shift, &tag);
        /* tried first: the way of the set's line last hit or placed (a tile read again
           finds its lines where it left them more often than not); a line is in at most
           one way, so the slot is the one a full search gives */
        int64_t slot = s * c->ways + c->hint[s];
        if (c->tags[slot] != tag) {
            slot = find_slot(c, tag, s);
            if (slot >= 0) c->hint[s] = slot - s * c->ways;
        }
        if (slot >= 0) {
            c->use[slot] = (int32_t)(base + i);
            if (write) c->dirty[slot] = 1;
            if (c->in_flight) {
                int32_t f = c->fill[slot];
                if ((uint32_t)f >= (uint64_t)c->filled_cap) {  /* the fill array is the caller's: checked */
                    PyErr_Format(PyExc_ValueError, "L2 core: slot %lld holds fill %d, one never issued",
                                 (long long)slot, (int)f);
                    return -1;
                }
                if (!c->filled[f]) c->pend[pending++] = f;
            }
        } else {
            if (c->stamp[s] == stamp) distinct = 0;
            c->stamp[s] = stamp;
            c->miss_set[misses] = s;
            c->miss_tag[misses] = tag;
            c->miss_at[misses++] = i;
        }
    }
    c->clock += n;
    if (pending) {  /* the fills hit lines still wait for, oldest first, each once per access */
        qsort(c->pend, (size_t)pending, sizeof(int64_t), cmp_int64);
        for (Py_ssize_t k = 0; k < pending; k++) {
            if (k && c->pend[k] == c->pend[k - 1]) continue;
            PyObject *id = PyLong_FromLongLong(c->pend[k]);
            if (!id) return -1;
            int has = PySequence_Contains(waits, id);
            if (has < 0 || (!has && PyList_Append(waits, id) < 0)) { Py_DECREF(id); return -1; }
            Py_DECREF(id);
        }
    }
    if (!misses) return n;
    *any_miss = 1;
    if (*missed) {
        for (Py_ssize_t k = 0; k < misses; k++) (*missed)[(*n_missed)++] = at + c->miss_at[k];
    }
    int64_t ways = c->ways;
    if (distinct) {  /* one miss per set: it takes the set's least recently used way (after this piece's hits) */
        for (Py_ssize_t k = 0; k < misses; k++) {
            int64_t s = c->miss_set[k], i = c->miss_at[k];
            int64_t best = lru_way(c->use + s * ways, ways);
            if (place(c, s * ways + best, c->miss_tag[k], base + i, write, fill_id, at + i, wb, wb_obj, total) < 0)
                return -1;
            c->hint[s] = best;
        }
        return n - misses;
    }
    /* group the misses by set, keeping their order within a set: order[g] is the g-th set
       met, start[g] where its misses begin in `sorted` (pend is free again: a cursor) */
    stamp = ++c->stamp_now;
    Py_ssize_t groups = 0;
    for (Py_ssize_t k = 0; k < misses; k++) {
        int64_t s = c->miss_set[k];
        if (c->stamp[s] != stamp) {
            c->stamp[s] = stamp;
            c->count[s] = 0;
            c->order[groups++] = s;
        }
        c->count[s]++;
    }
    int64_t next = 0;
    for (Py_ssize_t g = 0; g < groups; g++) {
        int64_t s = c->order[g];
        c->start[g] = c->pend[g] = next;
        next += c->count[s];
        c->count[s] = g;  /* from here on: the set's group */
    }
    int64_t *sorted = c->sorted;
    for (Py_ssize_t k = 0; k < misses; k++) sorted[c->pend[c->count[c->miss_set[k]]]++] = k;  /* the miss's index */
    for (Py_ssize_t g = 0; g < groups; g++) {
        int64_t s = c->order[g];
        int64_t lo = c->start[g], cnt = (g + 1 < groups ? c->start[g + 1] : misses) - lo;
        int32_t *row_use = c->use + s * ways;
        /* the set's min(cnt, ways) least recently used ways, in order (lowest way first
           among equals): one pass for a single miss, the usual case */
        int64_t need = cnt < ways ? cnt : ways;
        if (need == 1) {
            c->lru[0] = lru_way(row_use, ways);
        } else {
            lru_ways(c, row_use, need);
        }
        int64_t dropped = cnt > ways ? cnt - ways : 0;
        for (int64_t k = 0; k < cnt; k++) {
            int64_t miss = sorted[lo + k], i = c->miss_at[miss];
            if (k < dropped) {  /* evicted by a later miss of this piece */
                if (write && mark_back(wb, wb_obj, total, at + i) < 0) return -1;
            } else if (place(c, s * ways + c->lru[k - dropped], c->miss_tag[miss], base + i, write, fill_id, at + i,
                             wb, wb_obj, total) < 0) {
                return -1;
            } else {
                c->hint[s] = c->lru[k - dropped];
            }
        }
    }
    return n - misses;
}

/* Touch lines[0..n) + shift_by: the hits, the write-back mask (bytearray, or NULL if
   none), the fill ids to wait for (a list), the positions of the missed lines (bytearray
   of int64, if want_missed; else NULL) and whether any line missed. fill_id: the fill
   index the missed lines get (0: none), marked in flight if any line misses. */
static int access_lines(Core *c, const int64_t *lines, Py_ssize_t n, int64_t shift_by, int write, long long fill_id,
                        int want_missed, Py_ssize_t *hits_out, PyObject **wb_out, PyObject **waits_out,
                        PyObject **missed_out, int *any_miss_out) {
    Py_ssize_t hits = 0, n_missed = 0;
    uint8_t *wb = NULL;
    PyObject *wb_obj = NULL, *missed_obj = NULL, *waits = PyList_New(0);
    int64_t *missed = NULL;
    int any_miss = 0;
    if (!waits) goto fail;
    if (fill_id < 0 || fill_id > INT32_MAX) {  /* a slot keeps its fill index in 32 bits */
        PyErr_Format(PyExc_ValueError, "L2 core: fill index %lld is outside 0..2^31-1", fill_id);
        goto fail;
    }
    if (want_missed) {
        missed_obj = PyByteArray_FromStringAndSize(NULL, n * 8);
        if (!missed_obj) goto fail;
        missed = (int64_t *)PyByteArray_AS_STRING(missed_obj);
    }
    /* grown before the walk: a later piece may hit a line an earlier one placed with this
       fill id, and reads its flag - still 1 (arrived: an access never waits for its own fill) */
    if (fill_id >= c->filled_cap) {
        Py_ssize_t cap = c->filled_cap;
        while (cap <= fill_id) cap *= 2;  /* fill_id < 2^31: cap <= 2^32 */
        uint8_t *grown = PyMem_Realloc(c->filled, (size_t)cap);
        if (!grown) { PyErr_NoMemory(); goto fail; }
        memset(grown + c->filled_cap, 1, (size_t)(cap - c->filled_cap));
        c->filled = grown;
        c->filled_cap = cap;
    }
    for (Py_ssize_t lo = 0; lo < n; lo += c->sets) {
        Py_ssize_t m = n - lo < c->sets ? n - lo : c->sets;
        Py_ssize_t h = piece(c, lines + lo, shift_by, m, lo, write, fill_id, &wb, &wb_obj, n, waits, &missed,
                             &n_missed, &any_miss);
        if (h < 0) goto fail;
        hits += h;
    }
    if (any_miss && fill_id > 0 && c->filled[fill_id]) {  /* (a fill id given again while in flight counts once) */
        c->filled[fill_id] = 0;
        c->in_flight++;
    }
    if (missed_obj && PyByteArray_Resize(missed_obj, n_missed * 8) < 0) goto fail;
    *hits_out = hits;
    *wb_out = wb_obj;
    *waits_out = waits;
    *missed_out = missed_obj;
    *any_miss_out = any_miss;
    return 0;
fail:
    Py_XDECREF(waits); Py_XDECREF(wb_obj); Py_XDECREF(missed_obj);
    return -1;
}

/* access(lines, write, fill_id, want_missed, shift=0) -> (hits, write-back mask or None, fill
   ids to wait for, positions of the missed lines or None, any line missed). The lines are
   lines[i] + shift (a transfer's line pattern moved to its address). */
static PyObject *core_access(Core *c, PyObject *args) {
    PyObject *lines_obj;
    int write, want_missed;
    long long fill_id, shift_by = 0;
    if (!PyArg_ParseTuple(args, "OpLp|L", &lines_obj, &write, &fill_id, &want_missed, &shift_by)) return NULL;
    if (core_not_initialised(c)) return NULL;
    Py_buffer lb;
    if (PyObject_GetBuffer(lines_obj, &lb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (!is_int64(&lb)) {
        PyBuffer_Release(&lb);
        PyErr_SetString(PyExc_ValueError, "L2 core: lines must be an aligned, contiguous int64 array");
        return NULL;
    }
    Py_ssize_t hits;
    PyObject *wb, *waits, *missed;
    int any_miss;
    int bad = access_lines(c, lb.buf, lb.len / 8, shift_by, write, fill_id, want_missed, &hits, &wb, &waits, &missed,
                           &any_miss);
    PyBuffer_Release(&lb);
    if (bad) return NULL;
    return Py_BuildValue("nNNNO", hits, wb ? wb : Py_NewRef(Py_None), waits, missed ? missed : Py_NewRef(Py_None),
                         any_miss ? Py_True : Py_False);
}

/* find(lines) -> bytes of int64: the slot holding each line, -1 where it is not cached. */
static PyObject *core_find(Core *c, PyObject *arg) {
    if (core_not_initialised(c)) return NULL;
    Py_buffer lb;
    if (PyObject_GetBuffer(arg, &lb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (!is_int64(&lb)) {
        PyBuffer_Release(&lb);
        PyErr_SetString(PyExc_ValueError, "L2 core: lines must be an aligned, contiguous int64 array");
        return NULL;
    }
    Py_ssize_t n = lb.len / 8;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!out) { PyBuffer_Release(&lb); return NULL; }
    int64_t *slots = (int64_t *)PyBytes_AS_STRING(out);
    const int64_t *lines = lb.buf;
    for (Py_ssize_t i = 0; i < n; i++)
        slots[i] = lines[i] < 0 || lines[i] >= c->line_end ? -1
                   : find_slot(c, (int32_t)(lines[i] / c->sets), set_of(c, lines[i]));
    PyBuffer_Release(&lb);
    return out;
}

static PyObject *core_arrived(Core *c, PyObject *arg) {
    if (core_not_initialised(c)) return NULL;
    long long id = PyLong_AsLongLong(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    if (id <= 0 || id >= c->filled_cap || c->filled[id]) {
        PyErr_Format(PyExc_ValueError, "L2 core: fill %lld is not in flight", id);
        return NULL;
    }
    c->filled[id] = 1;
    c->in_flight--;
    Py_RETURN_NONE;
}

static PyObject *core_get_clock(Core *c, void *closure) { return PyLong_FromLongLong(c->clock); }
static PyObject *core_get_in_flight(Core *c, void *closure) { return PyLong_FromLongLong(c->in_flight); }

static PyMethodDef core_methods[] = {
    {"access", (PyCFunction)core_access, METH_VARARGS, "access(lines, write, fill_id, want_missed)"},
    {"find", (PyCFunction)core_find, METH_O, "find(lines) -> int64 bytes, -1 where not cached"},
    {"arrived", (PyCFunction)core_arrived, METH_O, "arrived(fill_id): its lines have arrived"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef core_getset[] = {
    {"clock", (getter)core_get_clock, NULL, "lines used so far", NULL},
    {"in_flight", (getter)core_get_in_flight, NULL, "fills not yet arrived", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._l2.Core",
    .tp_basicsize = sizeof(Core),
    .tp_dealloc = (destructor)core_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Core(tags, last_use, dirty, fill, sets, ways, rotate, use_max=2**31-1): the L2's line walk over those arrays",
    .tp_methods = core_methods,
    .tp_getset = core_getset,
    .tp_init = (initproc)core_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ transfers

   memory.MemorySystem's transfers (memory.py holds the rules): the burst rounding,
   the transfer's line pattern (computed once per shape by memory.py, kept in its
   dict), the L2 walk and, for a transfer that leaves nothing behind - a write that
   evicts nothing dirty, a read that hits throughout with no line still being
   filled - the start of its flow on the L2 link; every other transfer is finished
   by memory.py (MemorySystem._finish) from what the walk found. The stats are the
   Python numbers the Python made: the arithmetic on them is Python's. */

static inline int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* a modulo b > 0, as Python's % (never negative; no product that could overflow) */
static inline int64_t floor_mod(int64_t a, int64_t b) {
    int64_t r = a % b;
    return r < 0 ? r + b : r;
}

static int64_t gcd(int64_t a, int64_t b) {
    while (b) { int64_t t = a % b; a = b; b = t; }
    return a;
}

/* burst_cost: (bytes moved after rounding every segment out to bursts, misaligned
   segments), as memory.burst_cost states it, for a burst b of 1 to UNIT_MAX bytes.
   0, or -1 with an OverflowError where a count would leave int64 (Python's ints would
   not wrap: neither does this), or a ValueError for a negative size */
static int bursts(int64_t addr, int64_t nbytes, int64_t segments, int64_t stride, int64_t b, int64_t *moved,
                  int64_t *misaligned) {
    /* a segment of -1000 bytes was rounded to -960 moved (a segment's end before its start),
       and the counters took it; none (0 segments, or 0 bytes each) rounds as it always did */
    if (nbytes < 0 || segments < 0) {
        PyErr_Format(PyExc_ValueError, "burst_cost: %lld segments of %lld bytes, expected each >= 0",
                     (long long)segments, (long long)nbytes);
        return -1;
    }
    /* the rounding of a segment depends only on its start modulo the burst, and those
       residues repeat with period burst / gcd(stride, burst) */
    int64_t r = floor_mod(stride, b);
    int64_t period = b / gcd(r ? r : b, b);
    int64_t mv = 0, mis = 0;
    for (int64_t i = 0; i < period && i < segments; i++) {
        int64_t a, end, lo, hi, span, reps = (segments - 1 - i) / period + 1;  /* len(range(i, segments, period)) */
        if (__builtin_mul_overflow(i, stride, &a) || __builtin_add_overflow(addr, a, &a) ||
            __builtin_add_overflow(a, nbytes, &end) || __builtin_sub_overflow(a, floor_mod(a, b), &lo) ||
            __builtin_add_overflow(end, (b - floor_mod(end, b)) % b, &hi) || __builtin_sub_overflow(hi, lo, &span) ||
            __builtin_mul_overflow(span, reps, &span) || __builtin_add_overflow(mv, span, &mv)) {
            PyErr_Format(PyExc_OverflowError, "burst_cost: %lld segments of %lld bytes from %lld, stride %lld: an "
                         "address or the bytes moved beyond 2^63", (long long)segments, (long long)nbytes,
                         (long long)addr, (long long)stride);
            return -1;
        }
        if (floor_mod(a, b) || floor_mod(end, b)) mis += reps;  /* at most `segments` in all */
    }
    *moved = mv;
    *misaligned = mis;
    return 0;
}

/* a ValueError unless a line or burst is 1 to UNIT_MAX bytes */
static int bad_unit(const char *where, const char *what, long long v) {
    if (v >= 1 && v <= UNIT_MAX) return 0;
    PyErr_Format(PyExc_ValueError, "%s: a %s of %lld bytes, expected 1 to %lld", where, what, v, (long long)UNIT_MAX);
    return 1;
}

static PyObject *py_burst_cost(PyObject *module, PyObject *args) {
    long long addr, nbytes, segments, stride, b;
    if (!PyArg_ParseTuple(args, "LLLLL", &addr, &nbytes, &segments, &stride, &b)) return NULL;
    if (bad_unit("burst_cost", "burst", b)) return NULL;
    int64_t moved, misaligned;
    if (bursts(addr, nbytes, segments, stride, b, &moved, &misaligned) < 0) return NULL;
    return Py_BuildValue("LL", (long long)moved, (long long)misaligned);
}

/* What a transfer did (memory.py adds it into its kernel's counters) */
typedef struct {
    PyObject_HEAD
    PyObject *moved, *wasted, *misaligned, *hit_bytes, *miss_bytes, *hbm_read, *hbm_write, *uneven;
} Stats;

static PyTypeObject StatsType;

static void stats_dealloc(Stats *st) {
    Py_XDECREF(st->moved); Py_XDECREF(st->wasted); Py_XDECREF(st->misaligned); Py_XDECREF(st->hit_bytes);
    Py_XDECREF(st->miss_bytes); Py_XDECREF(st->hbm_read); Py_XDECREF(st->hbm_write); Py_XDECREF(st->uneven);
    Py_TYPE(st)->tp_free((PyObject *)st);
}

static Stats *stats_make(void) {
    Stats *st = PyObject_New(Stats, &StatsType);
    if (!st) return NULL;
    PyObject *zero = PyLong_FromLong(0);
    st->moved = zero; st->wasted = Py_XNewRef(zero); st->misaligned = Py_XNewRef(zero);
    st->hit_bytes = PyFloat_FromDouble(0.0); st->miss_bytes = Py_XNewRef(st->hit_bytes);
    st->hbm_read = Py_XNewRef(st->hit_bytes); st->hbm_write = Py_XNewRef(st->hit_bytes);
    st->uneven = Py_NewRef(Py_False);
    if (!zero || !st->hit_bytes) { Py_DECREF(st); return NULL; }
    return st;
}

static PyObject *stats_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "TransferStats() takes no arguments");
        return NULL;
    }
    return (PyObject *)stats_make();
}

static PyMemberDef stats_members[] = {
    {"moved", T_OBJECT, offsetof(Stats, moved), 0, "bytes moved, bursts rounded out (all members)"},
    {"wasted", T_OBJECT, offsetof(Stats, wasted), 0, "bytes of burst rounding beyond the data"},
    {"misaligned", T_OBJECT, offsetof(Stats, misaligned), 0, "segments with an unaligned start or end"},
    {"hit_bytes", T_OBJECT, offsetof(Stats, hit_bytes), 0, "moved bytes the L2 held"},
    {"miss_bytes", T_OBJECT, offsetof(Stats, miss_bytes), 0, "moved bytes it did not"},
    {"hbm_read", T_OBJECT, offsetof(Stats, hbm_read), 0, "bytes read from HBM (whole lines)"},
    {"hbm_write", T_OBJECT, offsetof(Stats, hbm_write), 0, "bytes written back to HBM"},
    {"uneven", T_OBJECT, offsetof(Stats, uneven), 0, "a group's members read different numbers of lines from HBM"},
    {NULL},
};

static PyTypeObject StatsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._l2.TransferStats",
    .tp_basicsize = sizeof(Stats),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What a transfer did; added into its kernel's counters by the caller",
    .tp_new = stats_new,
    .tp_dealloc = (destructor)stats_dealloc,
    .tp_members = stats_members,
};

typedef struct {
    PyObject_HEAD
    Core *core;
    int64_t line, burst;
    /* memory.py's pattern dict, its _lines_of, the L2 link's add, the L2's fills and _finish */
    PyObject *patterns, *lines_of, *l2_add, *fills, *finish;
    /* for the rest of a one-member transfer (finish_one): the environment, events.Signal,
       the HBM link's add, memory._nothing and math.inf */
    PyObject *env, *signal, *hbm_add, *nothing, *inf;
} Mover;

static PyObject *s_callbacks, *s_fire;

/* ------------------------------------------------------------------ completions

   What memory.py's _finish made as closures, for the rest of a one-member transfer
   done here (finish_one): Join(n, on_done) calls on_done() at its n-th call (the L2
   flow, the HBM flow, the fills waited for); Then(fill, join) fires the fill, then
   calls join (the HBM flow that brought the missed lines); Arrived(mover, fill_id) is
   l2cache.L2Cache._arrived for one fill (the fill's event no longer needed, its
   lines no longer in flight). */

typedef struct {
    PyObject_HEAD
    Py_ssize_t left;
    PyObject *a, *b;   /* Join: on_done; Then: the fill, the join; Arrived: the mover */
    int64_t fill_id;
} Completion;

static int completion_traverse(Completion *c, visitproc visit, void *arg) {
    Py_VISIT(c->a); Py_VISIT(c->b);
    return 0;
}

static int completion_clear(Completion *c) {
    Py_CLEAR(c->a); Py_CLEAR(c->b);
    return 0;
}

static void completion_dealloc(Completion *c) {
    PyObject_GC_UnTrack(c);
    completion_clear(c);
    PyObject_GC_Del(c);
}

static PyObject *join_call(Completion *c, PyObject *args, PyObject *kwds) {
    if (--c->left || !c->a) Py_RETURN_NONE;
    return PyObject_CallNoArgs(c->a);
}

static PyObject *then_call(Completion *c, PyObject *args, PyObject *kwds) {
    if (!c->a || !c->b) Py_RETURN_NONE;
    PyObject *r = PyObject_CallMethodNoArgs(c->a, s_fire);
    if (!r) return NULL;
    Py_DECREF(r);
    return PyObject_CallNoArgs(c->b);
}

static PyObject *arrived_call(Completion *c, PyObject *args, PyObject *kwds);

#define COMPLETION_TYPE(NAME, CALL, DOC)                                   \
    static PyTypeObject NAME = {                                          \
        PyVarObject_HEAD_INIT(NULL, 0)                                    \
        .tp_name = "npusim.engine._l2." #NAME,                            \
        .tp_basicsize = sizeof(Completion),                               \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,              \
        .tp_doc = DOC,                                                    \
        .tp_call = (ternaryfunc)CALL,                                     \
        .tp_traverse = (traverseproc)completion_traverse,                 \
        .tp_clear = (inquiry)completion_clear,                            \
        .tp_dealloc = (destructor)completion_dealloc,                     \
    };

COMPLETION_TYPE(JoinType, join_call, "calls on_done() at its n-th call")
COMPLETION_TYPE(ThenType, then_call, "fires a fill, then calls a join")
COMPLETION_TYPE(ArrivedType, arrived_call, "a fill has arrived (L2Cache._arrived)")

static PyObject *completion(PyTypeObject *type, Py_ssize_t left, PyObject *a, PyObject *b, int64_t fill_id) {
    Completion *c = PyObject_GC_New(Completion, type);
    if (!c) return NULL;
    c->left = left;
    c->a = Py_XNewRef(a);
    c->b = Py_XNewRef(b);
    c->fill_id = fill_id;
    PyObject_GC_Track(c);
    return (PyObject *)c;
}

/* the Mover holds bound methods of its MemorySystem, which holds it: a cycle the
   garbage collector must see */
static int mover_traverse(Mover *m, visitproc visit, void *arg) {
    Py_VISIT(m->core); Py_VISIT(m->patterns); Py_VISIT(m->lines_of); Py_VISIT(m->l2_add);
    Py_VISIT(m->fills); Py_VISIT(m->finish);
    Py_VISIT(m->env); Py_VISIT(m->signal); Py_VISIT(m->hbm_add); Py_VISIT(m->nothing); Py_VISIT(m->inf);
    return 0;
}

static int mover_clear(Mover *m) {
    Py_CLEAR(m->core); Py_CLEAR(m->patterns); Py_CLEAR(m->lines_of); Py_CLEAR(m->l2_add);
    Py_CLEAR(m->fills); Py_CLEAR(m->finish);
    Py_CLEAR(m->env); Py_CLEAR(m->signal); Py_CLEAR(m->hbm_add); Py_CLEAR(m->nothing); Py_CLEAR(m->inf);
    return 0;
}

static void mover_dealloc(Mover *m) {
    PyObject_GC_UnTrack(m);
    mover_clear(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

/* Mover(core, line, burst, patterns, lines_of, l2_add, fills, finish, env, signal, hbm_add, nothing) */
static int mover_init(Mover *m, PyObject *args, PyObject *kwds) {
    PyObject *core, *patterns, *lines_of, *l2_add, *fills, *finish, *env, *signal, *hbm_add, *nothing;
    long long line, burst;
    if (!PyArg_ParseTuple(args, "O!LLO!OOO!OOOOO", &CoreType, &core, &line, &burst, &PyDict_Type, &patterns,
                          &lines_of, &l2_add, &PyList_Type, &fills, &finish, &env, &signal, &hbm_add, &nothing))
        return -1;
    /* checked before any field changes: a mover refusing new arguments keeps its own */
    if (bad_unit("Mover", "line", line) || bad_unit("Mover", "burst", burst)) return -1;
    if (core_not_initialised((Core *)core)) return -1;
    PyObject *inf = PyFloat_FromDouble(Py_HUGE_VAL);
    if (!inf) return -1;
    Py_XSETREF(m->inf, inf);
    Py_XSETREF(m->env, Py_NewRef(env));
    Py_XSETREF(m->signal, Py_NewRef(signal));
    Py_XSETREF(m->hbm_add, Py_NewRef(hbm_add));
    Py_XSETREF(m->nothing, Py_NewRef(nothing));
    Py_XSETREF(m->core, (Core *)Py_NewRef(core));
    m->line = line; m->burst = burst;
    Py_XSETREF(m->patterns, Py_NewRef(patterns));
    Py_XSETREF(m->lines_of, Py_NewRef(lines_of));
    Py_XSETREF(m->l2_add, Py_NewRef(l2_add));
    Py_XSETREF(m->fills, Py_NewRef(fills));
    Py_XSETREF(m->finish, Py_NewRef(finish));
    return 0;
}

static int set_long(PyObject **field, int64_t v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x) return -1;
    Py_XSETREF(*field, x);
    return 0;
}

static PyObject *arrived_call(Completion *c, PyObject *args, PyObject *kwds) {
    Mover *m = (Mover *)c->a;
    if (!m || !m->core) Py_RETURN_NONE;
    if (PyList_SetItem(m->fills, c->fill_id, Py_NewRef(Py_None)) < 0) return NULL;  /* nobody needs the event */
    PyObject *id = PyLong_FromLongLong(c->fill_id);
    PyObject *r = id ? core_arrived(m->core, id) : NULL;
    Py_XDECREF(id);
    return r;
}

/* put `callback` on event `ev`'s callbacks (a Signal's list) */
static int add_callback(PyObject *ev, PyObject *callback) {
    PyObject *cbs = PyObject_GetAttr(ev, s_callbacks);
    int bad = !cbs || !PyList_Check(cbs) || PyList_Append(cbs, callback) < 0;
    if (bad && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a fill's event has no callbacks list");
    Py_XDECREF(cbs);
    return bad ? -1 : 0;
}

/* add(nbytes, cap, on_done, weight) on a link (its C Flows' start) */
static int link_add(PyObject *add, PyObject *nbytes, PyObject *cap, PyObject *on_done, PyObject *weight) {
    PyObject *call[4] = {nbytes, cap, on_done, weight};
    PyObject *r = PyObject_Vectorcall(add, call, 4, NULL);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* The rest of a one-member transfer, as memory.py's _finish does it for w = 1 (every
   step in its order): the fill event of a read that missed (l2cache's after_access),
   the write-back of the dirty lines it evicted, the L2 flow, and the HBM flow of the
   missed lines; on_done() once the flows and the fills it waits for have all ended. */
static PyObject *finish_one(Mover *m, Stats *st, PyObject *wb, PyObject *waits, int any_miss, int64_t moved,
                            PyObject *cap, PyObject *on_done, int write) {
    PyObject *fill = NULL, *join = NULL, *x = NULL, *one = PyLong_FromLong(1), *mv = PyLong_FromLongLong(moved);
    PyObject *res = NULL;
    if (!one || !mv) goto done;
    if (any_miss && !write) {
        Py_ssize_t fill_id = PyList_GET_SIZE(m->fills);
        fill = PyObject_CallOneArg(m->signal, m->env);
        if (!fill || PyList_Append(m->fills, fill) < 0) goto done;
        x = completion(&ArrivedType, 0, (PyObject *)m, NULL, fill_id);
        if (!x || add_callback(fill, x) < 0) goto done;
        Py_CLEAR(x);
    }
    if (wb) {  /* memory.py's _write_back for one member */
        Py_ssize_t n = PyByteArray_GET_SIZE(wb), lines_wb = 0;
        const char *mask = PyByteArray_AS_STRING(wb);
        for (Py_ssize_t i = 0; i < n; i++) lines_wb += mask[i] != 0;
        PyObject *nb = PyLong_FromLongLong((long long)lines_wb * m->line);  /* lines < 2^43 of at most 2^20 bytes */
        x = nb ? PyNumber_Add(st->hbm_write, nb) : NULL;
        if (!x || link_add(m->hbm_add, nb, m->inf, m->nothing, one) < 0) { Py_XDECREF(nb); goto done; }
        Py_DECREF(nb);
        Py_SETREF(st->hbm_write, x);
        x = NULL;
    }
    Py_ssize_t n_waits = PyList_GET_SIZE(waits);
    double hbm_read = PyFloat_AS_DOUBLE(st->hbm_read);
    if (!n_waits && !hbm_read) {  /* a write, or a read that hits throughout: the L2 flow is all */
        if (link_add(m->l2_add, mv, cap, on_done, one) < 0) goto done;
        res = Py_NewRef((PyObject *)st);
        goto done;
    }
    join = completion(&JoinType, 1 + n_waits + (hbm_read > 0), on_done, NULL, 0);
    if (!join) goto done;
    for (Py_ssize_t k = 0; k < n_waits; k++) {  /* lines another transfer is still bringing in */
        Py_ssize_t f = PyLong_AsSsize_t(PyList_GET_ITEM(waits, k));
        if (f == -1 && PyErr_Occurred()) goto done;
        PyObject *ev = PyList_GetItem(m->fills, f);
        if (!ev || add_callback(ev, join) < 0) goto done;
    }
    if (link_add(m->l2_add, mv, cap, join, one) < 0) goto done;
    if (hbm_read > 0) {  /* HBM -> L2 does not cross the core's port: uncapped */
        x = completion(&ThenType, 0, fill, join, 0);
        if (!x || link_add(m->hbm_add, st->hbm_read, m->inf, x, one) < 0) goto done;
    } else if (fill) {
        x = PyObject_CallMethodNoArgs(fill, s_fire);
        if (!x) goto done;
    }
    res = Py_NewRef((PyObject *)st);
done:
    Py_XDECREF(fill); Py_XDECREF(join); Py_XDECREF(x); Py_XDECREF(one); Py_XDECREF(mv);
    return res;
}

/* transfer(addrs, nbytes, segments, stride, write, cap, on_done) -> TransferStats */
static PyObject *mover_transfer(Mover *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "transfer(addrs, nbytes, segments, stride, write, cap, on_done)");
        return NULL;
    }
    PyObject *addrs = args[0], *cap = args[5], *on_done = args[6];
    if (!m->core) {
        PyErr_SetString(PyExc_TypeError, "Mover: not initialised (Mover(core, line, burst, ...) first)");
        return NULL;
    }
    if (core_not_initialised(m->core)) return NULL;  /* its Core re-initialised and failed since */
    if (!PyList_Check(addrs) || !PyList_GET_SIZE(addrs)) {
        PyErr_SetString(PyExc_TypeError, "transfer: addrs must be a non-empty list");
        return NULL;
    }
    Py_ssize_t w = PyList_GET_SIZE(addrs);
    long long a0 = PyLong_AsLongLong(PyList_GET_ITEM(addrs, 0));
    long long nbytes = PyLong_AsLongLong(args[1]), segments = PyLong_AsLongLong(args[2]);
    long long stride = PyLong_AsLongLong(args[3]);
    int write = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred() || write < 0) return NULL;
    /* a copy moves at least a byte (verify() refuses a Copy of none): one of no bytes
       touched no line, and its hit share was 0 / 0 */
    if (nbytes < 1 || segments < 1) {
        PyErr_Format(PyExc_ValueError, "transfer: %lld segments of %lld bytes, expected each >= 1", segments, nbytes);
        return NULL;
    }

    /* the line pattern: memory.py's, by shape and members' offsets */
    PyObject *key = PyTuple_New(w > 1 ? 4 + w : 4);
    if (!key) return NULL;
    int64_t first = floor_div(a0, m->line);
    PyObject *x = PyLong_FromLongLong(floor_mod(a0, m->line));
    if (!x) { Py_DECREF(key); return NULL; }
    PyTuple_SET_ITEM(key, 0, x);
    PyTuple_SET_ITEM(key, 1, Py_NewRef(args[1]));
    PyTuple_SET_ITEM(key, 2, Py_NewRef(args[2]));
    PyTuple_SET_ITEM(key, 3, Py_NewRef(args[3]));
    for (Py_ssize_t k = 0; w > 1 && k < w; k++) {
        /* an address that is not an int is converted by its __index__, which may change the list */
        if (PyList_GET_SIZE(addrs) != w) {
            Py_DECREF(key);
            PyErr_SetString(PyExc_RuntimeError, "transfer: addrs changed while they were read");
            return NULL;
        }
        long long a = PyLong_AsLongLong(PyList_GET_ITEM(addrs, k)), off;
        x = (a == -1 && PyErr_Occurred()) ? NULL
            : __builtin_sub_overflow(a, a0, &off) ? PyErr_Format(PyExc_OverflowError, "transfer: members %lld "
                                                                 "and %lld apart beyond 2^63", a, a0)
            : PyLong_FromLongLong(off);
        if (!x) { Py_DECREF(key); return NULL; }
        PyTuple_SET_ITEM(key, 4 + k, x);
    }
    PyObject *pattern = PyDict_GetItemWithError(m->patterns, key);
    Py_DECREF(key);
    if (pattern) {
        Py_INCREF(pattern);
    } else {
        if (PyErr_Occurred()) return NULL;
        pattern = PyObject_CallFunctionObjArgs(m->lines_of, addrs, args[1], args[2], args[3], NULL);
        if (!pattern) return NULL;
        if (core_not_initialised(m->core)) { Py_DECREF(pattern); return NULL; }  /* re-initialised by it, and failed */
    }
    if (!PyTuple_Check(pattern) || PyTuple_GET_SIZE(pattern) < 3) {
        Py_DECREF(pattern);
        PyErr_SetString(PyExc_TypeError, "transfer: a line pattern is (lines, member, shared, ...)");
        return NULL;
    }
    PyObject *member = PyTuple_GET_ITEM(pattern, 1);
    long long shared = PyLong_AsLongLong(PyTuple_GET_ITEM(pattern, 2));
    Py_buffer lb;
    if (PyErr_Occurred() || PyObject_GetBuffer(PyTuple_GET_ITEM(pattern, 0), &lb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        Py_DECREF(pattern);
        return NULL;
    }
    if (!is_int64(&lb) || shared < 0 || shared > ((int64_t)1 << 62)) {  /* hits, lines + shared fit */
        PyBuffer_Release(&lb);
        Py_DECREF(pattern);
        PyErr_SetString(PyExc_ValueError, "transfer: a line pattern is an aligned, contiguous int64 array and 0 to 2^62 lines "
                                          "shared");
        return NULL;
    }

    int64_t moved, misaligned, moved_w, misaligned_w, wasted_w;
    Stats *st = NULL;
    long long fill_id = write ? 0 : PyList_GET_SIZE(m->fills);
    Py_ssize_t hits, total = lb.len / 8;
    PyObject *wb = NULL, *waits = NULL, *missed = NULL, *res = NULL;
    int any_miss;
    if (bursts(a0, nbytes, segments, stride, m->burst, &moved, &misaligned) < 0) goto done;
    if (__builtin_mul_overflow(moved, (int64_t)w, &moved_w) || __builtin_mul_overflow(misaligned, (int64_t)w,
                                                                                      &misaligned_w) ||
        __builtin_mul_overflow(nbytes, segments, &wasted_w) || __builtin_sub_overflow(moved, wasted_w, &wasted_w) ||
        __builtin_mul_overflow(wasted_w, (int64_t)w, &wasted_w)) {
        PyErr_Format(PyExc_OverflowError, "transfer: %zd members of %lld segments of %lld bytes: bytes beyond 2^63", w,
                     segments, nbytes);
        goto done;
    }
    st = stats_make();
    if (!st || set_long(&st->moved, moved_w) || set_long(&st->misaligned, misaligned_w) ||
        set_long(&st->wasted, wasted_w) ||
        access_lines(m->core, lb.buf, total, first, write, fill_id, w > 1 && !write, &hits, &wb, &waits, &missed,
                     &any_miss) < 0)
        goto done;
    /* hit_bytes = moved * (hits + shared) / (lines + shared); miss_bytes = moved - hit_bytes */
    PyObject *num = PyLong_FromLongLong(hits + shared), *den = PyLong_FromLongLong(total + shared);
    PyObject *prod = num && den ? PyNumber_Multiply(st->moved, num) : NULL;
    PyObject *hit = prod ? PyNumber_TrueDivide(prod, den) : NULL;
    Py_XDECREF(num); Py_XDECREF(den); Py_XDECREF(prod);
    if (!hit) goto done;
    Py_XSETREF(st->hit_bytes, hit);
    PyObject *miss = PyNumber_Subtract(st->moved, st->hit_bytes);
    if (!miss) goto done;
    Py_XSETREF(st->miss_bytes, miss);
    /* a read miss fills whole lines (below 2^43 lines of at most UNIT_MAX bytes: no overflow) */
    double hbm_read = write ? 0.0 : (double)((total - hits) * m->line);
    PyObject *hr = PyFloat_FromDouble(hbm_read);
    if (!hr) goto done;
    Py_XSETREF(st->hbm_read, hr);
    if (!wb && !PyList_GET_SIZE(waits) && hbm_read == 0.0) {  /* the L2 flow is all */
        PyObject *mv = PyLong_FromLongLong(moved), *wo = PyLong_FromSsize_t(w);
        PyObject *r = mv && wo ? PyObject_CallFunctionObjArgs(m->l2_add, mv, cap, on_done, wo, NULL) : NULL;
        Py_XDECREF(mv); Py_XDECREF(wo);
        if (!r) goto done;
        Py_DECREF(r);
        res = Py_NewRef((PyObject *)st);
    } else if (w == 1) {
        res = finish_one(m, st, wb, waits, any_miss, moved, cap, on_done, write);
    } else {
        /* _finish(st, member, wb, waits, missed, any_miss, w, moved, cap, on_done, write) */
        PyObject *fin[11] = {(PyObject *)st, member, wb ? wb : Py_None, waits, missed ? missed : Py_None,
                             any_miss ? Py_True : Py_False, NULL, NULL, cap, on_done, write ? Py_True : Py_False};
        fin[6] = PyLong_FromSsize_t(w);
        fin[7] = PyLong_FromLongLong(moved);
        if (fin[6] && fin[7]) res = PyObject_Vectorcall(m->finish, fin, 11, NULL);
        Py_XDECREF(fin[6]); Py_XDECREF(fin[7]);
    }
done:
    PyBuffer_Release(&lb);
    Py_DECREF(pattern);
    Py_XDECREF(st); Py_XDECREF(wb); Py_XDECREF(waits); Py_XDECREF(missed);
    return res;
}

static PyMethodDef mover_methods[] = {
    {"transfer", (PyCFunction)(void (*)(void))mover_transfer, METH_FASTCALL,
     "transfer(addrs, nbytes, segments, stride, write, cap, on_done) -> TransferStats (see memory.py)"},
    {NULL},
};

static PyTypeObject MoverType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "npusim.engine._l2.Mover",
    .tp_basicsize = sizeof(Mover),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)mover_traverse,
    .tp_clear = (inquiry)mover_clear,
    .tp_doc = "Mover(core, line, burst, patterns, lines_of, l2_add, fills, finish, env, signal, hbm_add, nothing): "
              "memory.py's transfers",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)mover_init,
    .tp_dealloc = (destructor)mover_dealloc,
    .tp_methods = mover_methods,
};

static PyMethodDef module_methods[] = {
    {"burst_cost", py_burst_cost, METH_VARARGS,
     "burst_cost(addr, nbytes, segments, stride, burst) -> (bytes moved after rounding every segment out to "
     "bursts, misaligned segments)"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_l2", "The L2's line walk and transfers in C.", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__l2(void) {
#ifdef HAVE_AVX2_PATH
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
#endif
    if (PyType_Ready(&CoreType) < 0 || PyType_Ready(&StatsType) < 0 || PyType_Ready(&MoverType) < 0 ||
        PyType_Ready(&JoinType) < 0 || PyType_Ready(&ThenType) < 0 || PyType_Ready(&ArrivedType) < 0)
        return NULL;
    if (!(s_callbacks = PyUnicode_InternFromString("callbacks")) || !(s_fire = PyUnicode_InternFromString("fire")))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Core", (PyObject *)&CoreType) < 0 ||
        PyModule_AddObjectRef(m, "TransferStats", (PyObject *)&StatsType) < 0 ||
        PyModule_AddObjectRef(m, "Mover", (PyObject *)&MoverType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
