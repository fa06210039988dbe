/* The compiled insert of FrameStorage: one vector step (every env once, in env order, no episode end) in one call.
 *
 * Plain CPython C API and the buffer protocol, no numpy headers: the build needs setuptools and a C compiler only.
 * See docs/design/pixel-replay.md ("Compiled insert") for what is covered and why the call is atomic.
 *
 * A Plan holds the storage's arrays (pool, frame references, per-env state, pending frames, the other fields) as
 * buffers acquired once; Plan.step(...) checks a batch against them and either changes nothing and returns None
 * (the caller takes the Python path) or writes the whole step, sets the counters and clears the caller's
 * interrupt record, and returns the first slot written. Every check comes before the first write, and no Python
 * code runs inside the call, so a KeyboardInterrupt lands before the step or after all of it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAXDIM 16

typedef struct {
    PyObject_HEAD
    Py_buffer pool, obs_refs, next_refs, state, pending;
    int held; /* how many of the five buffers above are held (acquired in that order) */
    Py_ssize_t nfields, fields_held;
    PyObject *names; /* tuple of the other fields' names (str) */
    PyObject *batch_type, *array_type; /* TransitionBatch and numpy.ndarray: only exact instances are taken */
    int views;                         /* 1: numpy arrays are read through their object layout (see ArrayView) */
    PyObject *field_descr[64];         /* the stored fields' dtypes (borrowed: the held arrays keep them) */
    PyObject *pool_descr;
    Py_buffer *fields;
    Py_ssize_t row_bytes[64];
    Py_ssize_t env_k, terminated_k, truncated_k; /* indices of those fields in names */
    Py_ssize_t S, n, W, E, capacity, pool_size, frame_bytes, frame_ndim, itemsize;
    Py_ssize_t frame_shape[MAXDIM];
} Plan;

static PyObject *s_cursor, *s_size, *s_total_added, *s_frames_written, *s_retained, *s_seen_seq, *s_obs, *s_next_obs;
static PyObject *s_fields, *s_journal, *s_numbered, *s_upstream, *s_check, *s_slot_numbers, *s_env_id;

static void release_plan(Plan *p) {
    Py_buffer *own[5] = {&p->pool, &p->obs_refs, &p->next_refs, &p->state, &p->pending};
    for (int i = 0; i < p->held; i++) PyBuffer_Release(own[i]);
    p->held = 0;
    for (Py_ssize_t k = 0; k < p->fields_held; k++) PyBuffer_Release(&p->fields[k]);
    p->fields_held = 0;
    PyMem_Free(p->fields);
    p->fields = NULL;
    Py_CLEAR(p->names);
    Py_CLEAR(p->batch_type);
    Py_CLEAR(p->array_type);
    p->views = 0;
}

static void Plan_dealloc(Plan *p) {
    release_plan(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int is_int64(const Py_buffer *b) {
    return b->itemsize == 8 && b->format != NULL && (strcmp(b->format, "l") == 0 || strcmp(b->format, "q") == 0 ||
                                                     strcmp(b->format, "<l") == 0 || strcmp(b->format, "<q") == 0);
}

static int same_format(const Py_buffer *a, const Py_buffer *b) {
    return a->itemsize == b->itemsize && a->format != NULL && b->format != NULL && strcmp(a->format, b->format) == 0;
}

static int plan_error(const char *what) {
    PyErr_Format(PyExc_ValueError, "_frame_insert.Plan: %s", what);
    return -1;
}

/* The head of a numpy array object (numpy's PyArrayObject_fields, unchanged since numpy 1.7 and in 2.x, part of
 * its ABI). Exporting a buffer costs a fresh array ~0.25 us (numpy builds its buffer info); an add reads ten
 * arrays. So an exact ndarray whose dtype object is the stored array's is read through this head instead. The
 * layout is checked against the buffer protocol on the storage's own arrays when a Plan is built, and the Plan
 * falls back to buffer exports for good if it does not match. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} ArrayView;

#define VIEW_C_CONTIGUOUS 0x0001 /* NPY_ARRAY_C_CONTIGUOUS */

/* does the array head of `a` say what the buffer `b` exported from it says? */
static int view_matches(PyObject *a, const Py_buffer *b) {
    const ArrayView *v = (const ArrayView *)a;
    if (v->data != (char *)b->buf || v->nd != b->ndim || v->descr == NULL) return 0;
    for (int d = 0; d < b->ndim; d++)
        if (v->dimensions[d] != b->shape[d] || (b->strides != NULL && v->strides[d] != b->strides[d])) return 0;
    return 1;
}

/* Plan(pool, obs_refs, next_refs, state, pending, names, fields, batch_type, array_type) */
static int Plan_init(Plan *p, PyObject *args, PyObject *kwds) {
    PyObject *pool, *obs_refs, *next_refs, *state, *pending, *names, *fields, *batch_type, *array_type;
    if (kwds != NULL && PyDict_Size(kwds) > 0) return plan_error("takes positional arguments only");
    if (!PyArg_ParseTuple(args, "OOOOOO!O!O!O!", &pool, &obs_refs, &next_refs, &state, &pending, &PyTuple_Type,
                          &names, &PyTuple_Type, &fields, &PyType_Type, &batch_type, &PyType_Type, &array_type))
        return -1;
    release_plan(p);
    Py_INCREF(batch_type);
    p->batch_type = batch_type;
    Py_INCREF(array_type);
    p->array_type = array_type;
    PyObject *arrays[5] = {pool, obs_refs, next_refs, state, pending};
    Py_buffer *own[5] = {&p->pool, &p->obs_refs, &p->next_refs, &p->state, &p->pending};
    for (int i = 0; i < 5; i++) {
        if (PyObject_GetBuffer(arrays[i], own[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) return -1;
        p->held = i + 1;
    }
    if (p->pool.ndim < 1 || p->pool.ndim > MAXDIM) return plan_error("pool must be [pool_size, *frame]");
    p->pool_size = p->pool.shape[0];
    p->itemsize = p->pool.itemsize;
    p->frame_ndim = p->pool.ndim - 1;
    p->frame_bytes = p->itemsize;
    for (int d = 1; d < p->pool.ndim; d++) {
        p->frame_shape[d - 1] = p->pool.shape[d];
        p->frame_bytes *= p->pool.shape[d];
    }
    if (p->obs_refs.ndim != 2 || p->next_refs.ndim != 2 || !is_int64(&p->obs_refs) || !is_int64(&p->next_refs) ||
        p->obs_refs.shape[0] != p->next_refs.shape[0] || p->obs_refs.shape[1] != p->next_refs.shape[1])
        return plan_error("obs_refs and next_refs must be int64 [capacity, S]");
    p->capacity = p->obs_refs.shape[0];
    p->S = p->obs_refs.shape[1];
    if (p->state.ndim != 2 || !is_int64(&p->state) || p->state.shape[1] < 2 * p->S + 3)
        return plan_error("state must be int64 [E, 2S + 2 + n]");
    p->E = p->state.shape[0];
    p->W = p->state.shape[1];
    p->n = p->W - 2 * p->S - 2; /* (columns: last, final, trust, recent [n], head) */
    if (p->pending.ndim != p->pool.ndim + 2 || !same_format(&p->pending, &p->pool) || p->pending.shape[0] != p->E ||
        p->pending.shape[1] != p->n + 1 || p->pending.shape[2] != p->S)
        return plan_error("pending must be [E, n + 1, S, *frame] of the pool's dtype");
    for (int d = 1; d < p->pool.ndim; d++)
        if (p->pending.shape[d + 2] != p->pool.shape[d]) return plan_error("pending frames differ from the pool's");
    p->nfields = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(fields) != p->nfields || p->nfields > 64) return plan_error("names and fields differ");
    p->fields = PyMem_Calloc(p->nfields ? p->nfields : 1, sizeof(Py_buffer));
    if (p->fields == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    p->env_k = p->terminated_k = p->truncated_k = -1;
    for (Py_ssize_t k = 0; k < p->nfields; k++) {
        PyObject *name = PyTuple_GET_ITEM(names, k);
        if (!PyUnicode_Check(name)) return plan_error("field names must be str");
        Py_buffer *f = &p->fields[k];
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(fields, k), f, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) <
            0)
            return -1;
        p->fields_held = k + 1;
        if (f->ndim < 1 || f->shape[0] != p->capacity) return plan_error("every field must be [capacity, ...]");
        p->row_bytes[k] = f->len / p->capacity;
        if (PyUnicode_CompareWithASCIIString(name, "env_id") == 0) p->env_k = k;
        if (PyUnicode_CompareWithASCIIString(name, "terminated") == 0) p->terminated_k = k;
        if (PyUnicode_CompareWithASCIIString(name, "truncated") == 0) p->truncated_k = k;
    }
    if (p->env_k < 0 || p->terminated_k < 0 || p->truncated_k < 0)
        return plan_error("the fields must include env_id, terminated and truncated");
    if (!is_int64(&p->fields[p->env_k]) || p->fields[p->env_k].ndim != 1 || p->fields[p->terminated_k].itemsize != 1 ||
        p->fields[p->terminated_k].ndim != 1 || p->fields[p->truncated_k].itemsize != 1 ||
        p->fields[p->truncated_k].ndim != 1)
        return plan_error("env_id must be int64 [capacity], terminated and truncated bool [capacity]");
    /* batch arrays may be read through their array head if the storage's own arrays' heads agree with their
     * buffers (the layout check of ArrayView) */
    p->views = PyType_IsSubtype(Py_TYPE(pool), (PyTypeObject *)array_type) && view_matches(pool, &p->pool);
    for (Py_ssize_t k = 0; k < p->nfields && p->views; k++) {
        PyObject *a = PyTuple_GET_ITEM(fields, k);
        p->views = PyType_IsSubtype(Py_TYPE(a), (PyTypeObject *)array_type) && view_matches(a, &p->fields[k]);
    }
    if (p->views) {
        p->pool_descr = ((ArrayView *)pool)->descr;
        for (Py_ssize_t k = 0; k < p->nfields; k++) p->field_descr[k] = ((ArrayView *)PyTuple_GET_ITEM(fields, k))->descr;
    }
    Py_INCREF(names);
    p->names = names;
    return 0;
}

/* obs-shaped batch [count, S, *frame] of the pool's dtype whose frames are C-contiguous (any row/stack strides) */
static int obs_layout_ok(const Plan *p, const Py_buffer *b) {
    if (b->ndim != p->frame_ndim + 2 || b->shape[1] != p->S || !same_format(b, &p->pool) || b->strides == NULL)
        return 0;
    Py_ssize_t expect = p->itemsize;
    for (Py_ssize_t d = p->frame_ndim - 1; d >= 0; d--) {
        if (b->shape[d + 2] != p->frame_shape[d]) return 0;
        if (b->shape[d + 2] > 1 && b->strides[d + 2] != expect) return 0;
        expect *= b->shape[d + 2];
    }
    return 1;
}

static inline const char *frame_at(const Py_buffer *b, Py_ssize_t row, Py_ssize_t k) {
    return (const char *)b->buf + row * b->strides[0] + k * b->strides[1];
}

static inline Py_ssize_t pmod(int64_t a, Py_ssize_t m) { return (Py_ssize_t)(a % m); }

/* `a` as a buffer: through its array head when it is an exact ndarray of dtype `descr` (no export, *held = 0),
 * else exported with `flags` (*held = 1); format and itemsize then come from `like`. -1: not readable. */
static int get_array(const Plan *p, PyObject *a, PyObject *descr, const Py_buffer *like, int flags, int contiguous,
                     Py_buffer *out, int *held) {
    *held = 0;
    if (p->views && (PyObject *)Py_TYPE(a) == p->array_type && ((ArrayView *)a)->descr == descr) {
        const ArrayView *v = (const ArrayView *)a;
        if (contiguous && !(v->flags & VIEW_C_CONTIGUOUS)) return -1;
        out->buf = v->data;
        out->obj = NULL;
        out->ndim = v->nd;
        out->shape = v->dimensions;
        out->strides = v->strides;
        out->itemsize = like->itemsize;
        out->format = like->format;
        out->len = like->itemsize;
        for (int d = 0; d < v->nd; d++) out->len *= v->dimensions[d];
        out->readonly = 1;
        out->suboffsets = NULL;
        out->internal = NULL;
        return 0;
    }
    if (PyObject_GetBuffer(a, out, flags) < 0) {
        PyErr_Clear();
        return -1;
    }
    *held = 1;
    return 0;
}

/* the pool ring and its running frames_written */
typedef struct {
    char *pool;
    Py_ssize_t P, fbytes, S;
    int64_t fw;
} Pool;

/* FrameStorage._write_frames of one frame: its absolute position */
static inline int64_t put(Pool *pl, const char *src) {
    memcpy(pl->pool + pmod(pl->fw, pl->P) * pl->fbytes, src, pl->fbytes);
    return pl->fw++;
}

/* FrameStorage._insert_stacks: the stacks of src rows `rows` (R of them) against their env's previous stacks
 * prev[a] (S positions each); known[a] (NULL: none) marks trusted rows. Writes the references (refs, R x S) and
 * whether each row continued its previous stack (cont), writing frames in the order the Python path does. */
static void insert_stacks(Pool *pl, const Py_buffer *src, const Py_ssize_t *rows, Py_ssize_t R, int64_t *const *prev,
                          const char *known, int64_t *refs, char *cont) {
    const Py_ssize_t S = pl->S, fb = pl->fbytes;
    const int64_t floor = pl->fw + R * S - pl->P > 0 ? pl->fw + R * S - pl->P : 0; /* survive this insert */
    for (Py_ssize_t a = 0; a < R; a++) { /* every comparison before the first write, as there */
        int alive = 1;
        for (Py_ssize_t j = 0; j < S && alive; j++) alive = prev[a][j] >= floor;
        int c = alive;
        if (alive && !(known != NULL && known[a]))
            for (Py_ssize_t j = 0; j + 1 < S && c; j++)
                c = memcmp(pl->pool + pmod(prev[a][j + 1], pl->P) * fb, frame_at(src, rows[a], j), fb) == 0;
        cont[a] = (char)c;
    }
    for (Py_ssize_t a = 0; a < R; a++) {
        int64_t *out = refs + a * S;
        if (cont[a]) { /* one new frame */
            memcpy(out, prev[a] + 1, (S - 1) * sizeof(int64_t));
            out[S - 1] = put(pl, frame_at(src, rows[a], S - 1));
            continue;
        }
        /* each frame that differs from the next one in its stack; a repeated frame refers to the next written */
        for (Py_ssize_t j = 0; j < S; j++) {
            const char *frame = frame_at(src, rows[a], j);
            int written = j == S - 1 || memcmp(frame, frame_at(src, rows[a], j + 1), fb) != 0;
            out[j] = written ? put(pl, frame) : INT64_MAX;
        }
        for (Py_ssize_t j = S - 2; j >= 0; j--)
            if (out[j + 1] < out[j]) out[j] = out[j + 1];
    }
}

/* step(owner, record, storage, fields_storage, batch_fields, retained, seq, trusted,
 *      cursor, size, total_added, frames_written, slot_numbers)
 * -> the slots written (slot_numbers[cursor:cursor + B]; the first slot, an int, when the ring wraps),
 *    or None (not covered: nothing changed) */
static PyObject *Plan_step(Plan *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "step takes 13 arguments");
        return NULL;
    }
    if (p->held != 5) {
        PyErr_SetString(PyExc_RuntimeError, "_frame_insert.Plan is not initialised");
        return NULL;
    }
    PyObject *owner = args[0], *record = args[1], *storage = args[2], *fstore = args[3], *d = args[4];
    PyObject *retained = args[5], *seq = args[6];
    int trusted = PyObject_IsTrue(args[7]);
    long long cursor = PyLong_AsLongLong(args[8]), size = PyLong_AsLongLong(args[9]);
    long long total = PyLong_AsLongLong(args[10]), fw = PyLong_AsLongLong(args[11]);
    if (trusted < 0 || PyErr_Occurred()) return NULL;
    if (!PyDict_CheckExact(d) || PyDict_GET_SIZE(d) != p->nfields + 2) Py_RETURN_NONE;

    Py_buffer obs = {0}, nxt = {0};
    void *work = NULL;
    Py_buffer fb[64];
    int fheld[64];      /* 1: fb[k] was exported (to release), 0: read through the array head */
    Py_ssize_t got = 0; /* field buffers taken */
    int have_obs = 0, have_nxt = 0;
    PyObject *result = Py_None; /* fallback unless every check passes */
    PyObject *o = PyDict_GetItemWithError(d, s_obs), *no = PyDict_GetItemWithError(d, s_next_obs);
    if (o == NULL || no == NULL) goto fallback;
    if (get_array(p, o, p->pool_descr, &p->pool, PyBUF_RECORDS_RO, 0, &obs, &have_obs) < 0) goto fallback;
    if (get_array(p, no, p->pool_descr, &p->pool, PyBUF_RECORDS_RO, 0, &nxt, &have_nxt) < 0) goto fallback;
    if (!obs_layout_ok(p, &obs) || !obs_layout_ok(p, &nxt)) goto fallback;
    const Py_ssize_t count = obs.shape[0], S = p->S, W = p->W, n = p->n, cap = p->capacity, P = p->pool_size;
    if (count < 1 || count > cap || count > P || nxt.shape[0] != count) goto fallback;
    for (Py_ssize_t k = 0; k < p->nfields; k++) {
        PyObject *v = PyDict_GetItemWithError(d, PyTuple_GET_ITEM(p->names, k));
        if (v == NULL) goto fallback;
        if (get_array(p, v, p->field_descr[k], &p->fields[k], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, 1, &fb[k],
                      &fheld[k]) < 0)
            goto fallback;
        got = k + 1;
        const Py_buffer *f = &p->fields[k];
        if (fb[k].ndim != f->ndim || fb[k].shape[0] != count || !same_format(&fb[k], f)) goto fallback;
        for (int dim = 1; dim < f->ndim; dim++)
            if (fb[k].shape[dim] != f->shape[dim]) goto fallback;
    }
    /* rows of an env in time order, any interleaving; env ids inside the per-env state */
    const int64_t *env = (const int64_t *)fb[p->env_k].buf;
    const char *term = (const char *)fb[p->terminated_k].buf, *trunc = (const char *)fb[p->truncated_k].buf;
    if (count * S * 2 > P) goto fallback; /* (the Python path explains a pool too small for one batch) */
    /* scratch: rank, rows (twice: the finals' fresh rows follow a group), seen (per env), prev, refs, 3 flags */
    work = PyMem_Malloc((3 * count + p->E) * sizeof(Py_ssize_t) + count * sizeof(int64_t *) +
                        count * S * sizeof(int64_t) + 3 * count);
    if (work == NULL) goto fallback;
    Py_ssize_t *rank = (Py_ssize_t *)work, *rows = rank + count, *seen = rows + 2 * count;
    int64_t **prev = (int64_t **)(seen + p->E);
    int64_t *refs = (int64_t *)(prev + count);
    char *done = (char *)(refs + count * S), *cont = done + count, *known = cont + count;
    memset(seen, 0, p->E * sizeof(Py_ssize_t));
    Py_ssize_t groups = 1, ended = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (env[i] < 0 || env[i] >= p->E) goto fallback;
        rank[i] = seen[env[i]]++;
        if (rank[i] + 1 > groups) groups = rank[i] + 1;
        done[i] = term[i] || trunc[i];
        ended += done[i];
    }
    const int any_done = ended > 0;
    /* checked mode, an env twice: its second pending write overwrites a stack the add compared, which the Python
     * path backs up for a caller that rolls the add back (a SequenceReplayBuffer's redo) */
    if (!trusted && groups > 1) goto fallback;
    int64_t *state = (int64_t *)p->state.buf;
    int64_t *obs_refs = (int64_t *)p->obs_refs.buf, *next_refs = (int64_t *)p->next_refs.buf;
    char *pending = (char *)p->pending.buf;
    const Py_ssize_t fbytes = p->frame_bytes;
    const int64_t total2 = total + count;
    const int64_t wait_floor = total2 - cap > 0 ? total2 - cap : 0;
    if (!trusted) { /* checked: a resolved next_obs must be this obs, whole stack (FrameStorage._check_next_obs) */
        /* Checked before any write, for every group at once: at an env's k-th row of this batch its shift
         * registers hold, oldest first, the stored entries k.. and then what its rows k-n.. put there, so
         * the entry compared is the stored k-th (k < n) or the one from its row k - n of this batch. */
        Py_ssize_t *hist = PyMem_Malloc((p->E * n + 1) * sizeof(Py_ssize_t)); /* an env's last n rows */
        if (hist == NULL) goto fallback;
        memset(seen, 0, p->E * sizeof(Py_ssize_t));
        int bad = 0;
        for (Py_ssize_t i = 0; i < count && !bad; i++) {
            const Py_ssize_t e = env[i], k = seen[e]++;
            const Py_ssize_t back = k >= n ? hist[e * n + (k - n) % n] : -1; /* this env's row k - n */
            hist[e * n + k % n] = i;
            const int64_t *row = state + e * W;
            const int64_t gen = back < 0 ? row[2 * S + 1 + k] : (done[back] ? -1 : total + back);
            /* (the stored pending stack, when back < 0: the k-th oldest of the env's ring of n + 1, from its head) */
            const char *kept = pending + (e * (n + 1) + (row[2 * S + 1 + n] + k) % (n + 1)) * S * fbytes;
            for (Py_ssize_t j = 0; j < S && !bad && gen >= wait_floor; j++) {
                const char *want = back < 0 ? kept + j * fbytes : frame_at(&nxt, back, j);
                bad = memcmp(want, frame_at(&obs, i, j), fbytes) != 0;
            }
        }
        PyMem_Free(hist);
        if (bad) goto fallback; /* (the Python path refuses the batch, naming the env and the transition) */
    }
    /* the new counters and the slots, made before the first write so that nothing can fail after it */
    const long long end = cursor + count;
    PyObject *v_cursor = PyLong_FromLongLong(end % cap);
    PyObject *v_size = PyLong_FromLongLong(size + count < cap ? size + count : cap);
    PyObject *v_total = PyLong_FromLongLong(total2);
    PyObject *v_fw = NULL; /* made after the frames are written (their count depends on the data) */
    PyObject *v_start = NULL; /* the slots: a view of slot_numbers, or the first slot when the ring wraps */
    if (end <= cap) {
        PyObject *sl = PyLong_FromLongLong(end), *st = PyLong_FromLongLong(cursor);
        PyObject *range = (sl && st) ? PySlice_New(st, sl, NULL) : NULL;
        v_start = range ? PyObject_GetItem(args[12], range) : NULL;
        Py_XDECREF(sl), Py_XDECREF(st), Py_XDECREF(range);
    } else {
        v_start = PyLong_FromLongLong(cursor);
    }
    if (!v_cursor || !v_size || !v_total || !v_start) {
        Py_XDECREF(v_cursor), Py_XDECREF(v_size), Py_XDECREF(v_total), Py_XDECREF(v_start);
        result = NULL;
        goto done;
    }

    /* ---- writes, in the order of FrameStorage._add; nothing below can fail but an int allocation ---- */
    Pool pl = {(char *)p->pool.buf, P, fbytes, S, fw};
    for (Py_ssize_t i = 0; i < count; i++) next_refs[pmod(cursor + i, cap) * S] = -1;
    for (Py_ssize_t k = 0; k < p->nfields; k++) { /* ArrayStorage.add: one or two slice copies */
        const Py_ssize_t rb = p->row_bytes[k];
        const Py_ssize_t first = end <= cap ? count : cap - cursor;
        memcpy((char *)p->fields[k].buf + cursor * rb, fb[k].buf, first * rb);
        if (first < count) memcpy(p->fields[k].buf, (const char *)fb[k].buf + first * rb, (count - first) * rb);
    }
    for (Py_ssize_t g = 0; g < groups; g++) { /* _add_obs per group of rows in which each env occurs once */
        Py_ssize_t R = 0;
        for (Py_ssize_t i = 0; i < count; i++)
            if (rank[i] == g) rows[R++] = i;
        const int64_t floor1 = pl.fw + R - P > 0 ? pl.fw + R - P : 0;
        int all_trusted = trusted;
        for (Py_ssize_t a = 0; a < R && all_trusted; a++) {
            const int64_t *row = state + env[rows[a]] * W;
            if (row[2 * S] != 1) all_trusted = 0;
            for (Py_ssize_t j = 0; j < S && all_trusted; j++)
                if (row[j] < floor1) all_trusted = 0;
        }
        if (all_trusted) { /* the trusted step: the newest frame, the references shifted */
            for (Py_ssize_t a = 0; a < R; a++) {
                int64_t *row = state + env[rows[a]] * W;
                const int64_t pos = put(&pl, frame_at(&obs, rows[a], S - 1));
                memmove(row, row + 1, (S - 1) * sizeof(int64_t));
                row[S - 1] = pos;
                if (any_done) row[2 * S] = !done[rows[a]];
            }
        } else {
            for (Py_ssize_t a = 0; a < R; a++) {
                int64_t *row = state + env[rows[a]] * W;
                prev[a] = row;
                known[a] = trusted && row[2 * S] == 1;
            }
            insert_stacks(&pl, &obs, rows, R, prev, trusted ? known : NULL, refs, cont);
            for (Py_ssize_t a = 0; a < R; a++) {
                int64_t *row = state + env[rows[a]] * W;
                memcpy(row, refs + a * S, S * sizeof(int64_t));
                row[2 * S] = cont[a] && !done[rows[a]];
            }
        }
        for (Py_ssize_t a = 0; a < R; a++) {
            const Py_ssize_t i = rows[a];
            int64_t *row = state + env[i] * W;
            memcpy(obs_refs + pmod(cursor + i, cap) * S, row, S * sizeof(int64_t));
            int64_t *recent = row + 2 * S + 1;
            if (!trusted) { /* this row's next_obs into the free position of the env's ring, after its newest */
                int64_t *head = row + 2 * S + 1 + n;
                char *mine = pending + (env[i] * (n + 1) + (*head + n) % (n + 1)) * S * fbytes;
                for (Py_ssize_t j = 0; j < S; j++) memcpy(mine + j * fbytes, frame_at(&nxt, i, j), fbytes);
                *head = (*head + 1) % (n + 1);
            }
            if (recent[0] >= wait_floor) /* the transition n observations back gets this obs as next_obs */
                memcpy(next_refs + pmod(recent[0], cap) * S, row, S * sizeof(int64_t));
            memmove(recent, recent + 1, (n - 1) * sizeof(int64_t));
            recent[n - 1] = done[i] ? -1 : total + i; /* an ended transition waits for nothing */
        }
    }
    if (any_done) { /* _add_finals per group of ended rows in which each env occurs once */
        memset(seen, 0, p->E * sizeof(Py_ssize_t));
        Py_ssize_t fgroups = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            rank[i] = done[i] ? seen[env[i]]++ : -1;
            if (rank[i] + 1 > fgroups) fgroups = rank[i] + 1;
        }
        for (Py_ssize_t g = 0; g < fgroups; g++) {
            Py_ssize_t R = 0;
            for (Py_ssize_t i = 0; i < count; i++)
                if (rank[i] == g) rows[R++] = i;
            /* the env's cached final stack is this one (an episode's tails share it) if still pooled and equal */
            const int64_t floor_f = pl.fw + R * S - P > 0 ? pl.fw + R * S - P : 0;
            Py_ssize_t fresh_count = 0;
            for (Py_ssize_t a = 0; a < R; a++) {
                const int64_t *fin = state + env[rows[a]] * W + S;
                int same = 1;
                for (Py_ssize_t j = 0; j < S && same; j++) same = fin[j] >= floor_f;
                for (Py_ssize_t j = 0; j < S && same; j++)
                    same = memcmp(pl.pool + pmod(fin[j], P) * fbytes, frame_at(&nxt, rows[a], j), fbytes) == 0;
                cont[a] = (char)same; /* (here: reuse the cached final) */
                if (!same) {
                    rows[R + fresh_count] = rows[a]; /* (rows has room: R + fresh <= count) */
                    fresh_count++;
                }
            }
            Py_ssize_t *new_rows = rows + R;
            char *same_of = cont;
            /* the others: stacks inserted as for an observation (compared with the env's last stack) */
            char *cont_new = known;
            for (Py_ssize_t a = 0; a < fresh_count; a++) prev[a] = state + env[new_rows[a]] * W;
            if (fresh_count) insert_stacks(&pl, &nxt, new_rows, fresh_count, prev, NULL, refs, cont_new);
            Py_ssize_t f = 0;
            for (Py_ssize_t a = 0; a < R; a++) {
                const Py_ssize_t i = rows[a];
                int64_t *fin = state + env[i] * W + S;
                if (!same_of[a]) memcpy(fin, refs + (f++) * S, S * sizeof(int64_t));
                memcpy(next_refs + pmod(cursor + i, cap) * S, fin, S * sizeof(int64_t));
            }
        }
        /* an env whose last row in this batch ended its episode: its newest observation is the final one */
        for (Py_ssize_t i = 0; i < count; i++) seen[env[i]] = i; /* (later rows win) */
        for (Py_ssize_t i = 0; i < count; i++)
            if (done[i] && seen[env[i]] == i) memcpy(state + env[i] * W, state + env[i] * W + S, S * sizeof(int64_t));
    }
    v_fw = PyLong_FromLongLong(pl.fw);
    if (v_fw == NULL) { /* (out of memory after writing: counters unchanged, the caller's record redoes it) */
        Py_DECREF(v_cursor), Py_DECREF(v_size), Py_DECREF(v_total), Py_DECREF(v_start);
        result = NULL;
        goto done;
    }
    /* ---- the counters and the caller's record, last (plain instance attributes: no Python code runs) ---- */
    int bad = PyObject_SetAttr(fstore, s_cursor, v_cursor) < 0;
    bad |= PyObject_SetAttr(fstore, s_size, v_size) < 0;
    bad |= PyObject_SetAttr(fstore, s_total_added, v_total) < 0;
    bad |= PyObject_SetAttr(storage, s_frames_written, v_fw) < 0;
    bad |= PyObject_SetAttr(storage, s_retained, retained) < 0;
    if (seq != Py_None) bad |= PyObject_SetAttr(storage, s_seen_seq, seq) < 0;
    bad |= PyObject_SetAttr(owner, record, Py_None) < 0;
    Py_DECREF(v_cursor), Py_DECREF(v_size), Py_DECREF(v_total), Py_DECREF(v_fw);
    if (bad) {
        Py_DECREF(v_start);
        result = NULL;
    } else {
        result = v_start;
    }
    goto done;

fallback:
    if (PyErr_Occurred()) PyErr_Clear(); /* (a field that exports no buffer: the Python path explains) */
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(work);
    for (Py_ssize_t k = 0; k < got; k++)
        if (fheld[k]) PyBuffer_Release(&fb[k]);
    if (have_obs) PyBuffer_Release(&obs);
    if (have_nxt) PyBuffer_Release(&nxt);
    return result;
}

/* add(owner, record, storage, batch): Plan.step with what FrameStorage.try_atomic_add would pass, gathered here.
 * -> what step returns; None (not covered: nothing changed); NotImplemented when the batch's stream number was
 *    not noted at its pull and the storage has an upstream (the caller notes it, then calls again).
 * Only reads before step: attribute lookups of plain instance attributes, so no Python code runs before the
 * first write either (an upstream's stream_seq, which may be a property, is read by the caller). */
static PyObject *Plan_add(Plan *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "add takes 4 arguments");
        return NULL;
    }
    PyObject *owner = args[0], *record = args[1], *storage = args[2], *batch = args[3];
    if ((PyObject *)Py_TYPE(batch) != p->batch_type) Py_RETURN_NONE;
    PyObject *d = NULL, *journal = NULL, *numbered = NULL, *seen = NULL, *check = NULL, *fstore = NULL;
    PyObject *cursor = NULL, *size = NULL, *total = NULL, *fw = NULL, *slot_numbers = NULL, *old = NULL;
    PyObject *entry = NULL, *retained = NULL, *result = NULL;
    PyObject *seq = NULL; /* borrowed */
    if ((d = PyObject_GetAttr(batch, s_fields)) == NULL) goto done;
    if (!PyDict_CheckExact(d)) goto none;
    if ((journal = PyObject_GetAttr(storage, s_journal)) == NULL) goto done;
    if (journal != Py_None && owner != storage) goto none; /* a cut-short add of the storage's own comes first */
    if ((numbered = PyObject_GetAttr(storage, s_numbered)) == NULL) goto done;
    if (!PyTuple_CheckExact(numbered)) goto none;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(numbered); i++) {
        PyObject *pair = PyTuple_GET_ITEM(numbered, i);
        if (PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 && PyTuple_GET_ITEM(pair, 0) == batch)
            seq = PyTuple_GET_ITEM(pair, 1);
    }
    if (seq == NULL) {
        PyObject *upstream = PyObject_GetAttr(storage, s_upstream);
        if (upstream == NULL) goto done;
        int none = upstream == Py_None;
        Py_DECREF(upstream);
        if (!none) {
            result = Py_NotImplemented;
            Py_INCREF(result);
            goto done;
        }
        seq = Py_None; /* no upstream: not numbered */
    }
    if ((seen = PyObject_GetAttr(storage, s_seen_seq)) == NULL) goto done;
    if (seq != Py_None) { /* a cut in the stream (or the batch again): the Python path resolves what waits */
        if (!PyLong_CheckExact(seq) || !PyLong_CheckExact(seen)) goto none;
        long long a = PyLong_AsLongLong(seq), b = PyLong_AsLongLong(seen);
        if (PyErr_Occurred()) goto done;
        if (a != b + 1) goto none;
    }
    if ((check = PyObject_GetAttr(storage, s_check)) == NULL) goto done;
    int trusted;
    if (check == Py_None)
        trusted = seq != Py_None;
    else if (check == Py_True || check == Py_False)
        trusted = check == Py_False;
    else
        goto none;
    if ((fstore = PyObject_GetAttr(storage, s_fields)) == NULL) goto done;
    if ((cursor = PyObject_GetAttr(fstore, s_cursor)) == NULL || (size = PyObject_GetAttr(fstore, s_size)) == NULL ||
        (total = PyObject_GetAttr(fstore, s_total_added)) == NULL ||
        (slot_numbers = PyObject_GetAttr(fstore, s_slot_numbers)) == NULL ||
        (fw = PyObject_GetAttr(storage, s_frames_written)) == NULL)
        goto done;
    /* the newest batches' own next_obs, which a cut resolves waiting transitions from (FrameStorage._retained) */
    PyObject *env = PyDict_GetItemWithError(d, s_env_id), *nxt = PyDict_GetItemWithError(d, s_next_obs);
    if (env == NULL || nxt == NULL) goto check_error;
    if ((PyObject *)Py_TYPE(env) != p->array_type || (PyObject *)Py_TYPE(nxt) != p->array_type) goto none;
    if ((old = PyObject_GetAttr(storage, s_retained)) == NULL) goto done;
    if (!PyTuple_CheckExact(old)) goto none;
    if ((entry = PyTuple_Pack(3, total, env, nxt)) == NULL) goto done;
    Py_ssize_t have = PyTuple_GET_SIZE(old), keep = have < p->n - 1 ? have : p->n - 1;
    if ((retained = PyTuple_New(keep + 1)) == NULL) goto done;
    for (Py_ssize_t i = 0; i < keep; i++) {
        PyObject *item = PyTuple_GET_ITEM(old, have - keep + i);
        Py_INCREF(item);
        PyTuple_SET_ITEM(retained, i, item);
    }
    Py_INCREF(entry);
    PyTuple_SET_ITEM(retained, keep, entry);
    {
        PyObject *argv[13] = {owner,  record, storage, fstore, d,     retained,    seq,
                              trusted ? Py_True : Py_False, cursor, size, total, fw, slot_numbers};
        result = Plan_step(p, argv, 13);
    }
    goto done;
check_error:
    if (PyErr_Occurred()) goto done;
none:
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(d), Py_XDECREF(journal), Py_XDECREF(numbered), Py_XDECREF(seen), Py_XDECREF(check);
    Py_XDECREF(fstore), Py_XDECREF(cursor), Py_XDECREF(size), Py_XDECREF(total), Py_XDECREF(fw);
    Py_XDECREF(slot_numbers), Py_XDECREF(old), Py_XDECREF(entry), Py_XDECREF(retained);
    return result;
}

static PyMethodDef Plan_methods[] = {
    {"add", (PyCFunction)(void (*)(void))Plan_add, METH_FASTCALL,
     "add(owner, record, storage, batch) -> step(...) with the arguments FrameStorage.try_atomic_add would pass "
     "(None: not covered; NotImplemented: note the batch's stream number, then call again)"},
    {"step", (PyCFunction)(void (*)(void))Plan_step, METH_FASTCALL,
     "step(owner, record, storage, fields_storage, batch_fields, retained, seq, trusted, cursor, size, total_added, "
     "frames_written, slot_numbers) -> the slots written (the first slot, an int, when the ring wraps), or None "
     "when the batch is not covered (nothing changed)"},
    {NULL, NULL, 0, NULL},
};

static PyObject *Plan_get_views(Plan *p, void *closure) { return PyBool_FromLong(p->views); }

static PyGetSetDef Plan_getset[] = {
    {"views", (getter)Plan_get_views, NULL, "whether batch arrays are read through numpy's array head", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ptl_rl.buffers._frame_insert.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(pool, obs_refs, next_refs, state, pending, names, fields, batch_type, array_type): a "
              "FrameStorage's arrays, held as buffers, for its compiled insert",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
    .tp_getset = Plan_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_frame_insert",
    "The compiled insert of ptl_rl.buffers.FrameStorage (optional: the Python path is used without it).", -1, NULL,
};

PyMODINIT_FUNC PyInit__frame_insert(void) {
    if (PyType_Ready(&PlanType) < 0) return NULL;
    const char *names[] = {"cursor",    "size",     "total_added", "frames_written", "_retained",     "_seen_seq",
                           "obs",       "next_obs", "_fields",     "_journal",       "_numbered",     "_upstream",
                           "check",     "_slot_numbers", "env_id"};
    PyObject **slots[] = {&s_cursor,   &s_size,      &s_total_added, &s_frames_written, &s_retained,
                          &s_seen_seq, &s_obs,       &s_next_obs,    &s_fields,         &s_journal,
                          &s_numbered, &s_upstream,  &s_check,       &s_slot_numbers,   &s_env_id};
    for (int i = 0; i < 15; i++)
        if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
